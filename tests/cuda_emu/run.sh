#!/bin/sh
# run.sh [BUILD_DIR] - the CUDA kernels of engine/backend/cuda (k_attn.cu,
# k_elem.cu, k_matmul.cu) run on the host, without a GPU, against the CPU
# reference.
#
# launch.py turns each kernel file into host C++ (launches become
# emu_launch calls); inc/ stands in for the CUDA headers and for the two
# cuBLAS calls of k_matmul.cu (a plain host GEMM); emu.cpp runs a launch
# with one OS thread per CUDA thread (barriers and warp shuffles through
# pthread barriers). It checks the kernels' logic (indexing, reductions,
# masking, the three attention modes, the merge, the statistics' order,
# the matrix-vector kernels of every weight format, the fp16 tiles of the
# GEMM path and their cuBLAS arguments, get_rows), not the device's
# arithmetic (nvcc's fused multiply-adds, CUDA's libm, cuBLAS's own
# summation) nor its speed: that needs a GPU.
# Needs g++, python3 and a C compiler; takes about a minute on two cores
# (thousands of threads meet at barriers): the compilations run side by
# side, and so do the attention program, the longest, and the other two
# (its output is printed after theirs).
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
HERE=$ROOT/tests/cuda_emu
B=${1:-${TMPDIR:-/tmp}/qi_cuda_emu}
mkdir -p "$B"
CC=${CC:-cc}
CXX=${CXX:-g++}
INC="-I$ROOT/engine/include -I$ROOT/engine"
# waitall PID...: wait for each; fails if any failed
waitall() { rc=0; for p in "$@"; do wait "$p" || rc=1; done; return $rc; }
pids=
for f in kernels/kernels_ref kernels/kernels_packed kernels/quant kernels/quant_legacy kernels/quant_k types; do
  $CC -std=c11 -O2 -ffp-contract=off -fno-fast-math $INC -c "$ROOT/engine/$f.c" -o "$B/$(basename $f).o" &
  pids="$pids $!"
done
XF="-std=c++17 -O1 -g -ffp-contract=off -fno-fast-math -Wall -Wno-unknown-pragmas -I$HERE/inc $INC -I$ROOT/engine/backend/cuda"
for k in k_matmul k_attn k_elem; do
  python3 "$HERE/launch.py" "$ROOT/engine/backend/cuda/$k.cu" > "$B/${k}_emu.cpp"
  $CXX $XF -c "$B/${k}_emu.cpp" -o "$B/${k}_emu.o" &
  pids="$pids $!"
done
$CXX $XF -c "$HERE/emu.cpp" -o "$B/emu.o" &
# shellcheck disable=SC2086 # a list of process ids
waitall $pids $!
LIBS="$B/emu.o $B/kernels_ref.o $B/kernels_packed.o $B/quant.o $B/quant_legacy.o $B/quant_k.o $B/types.o -lpthread -lm"
pids=
for k in attn matmul elem; do
  $CXX $XF "$HERE/test_${k}_emu.cpp" "$B/k_${k}_emu.o" $LIBS -o "$B/test_${k}_emu" &
  pids="$pids $!"
done
# shellcheck disable=SC2086
waitall $pids
"$B/test_attn_emu" >"$B/attn.out" 2>&1 &
attn=$!
rc=0
"$B/test_elem_emu" || rc=1
"$B/test_matmul_emu" || rc=1
wait $attn || rc=1
cat "$B/attn.out"
exit $rc

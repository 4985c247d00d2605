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
# Needs g++, python3 and a C compiler; takes a few minutes (thousands of
# threads meet at barriers).
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
HERE=$ROOT/tests/cuda_emu
B=${1:-${TMPDIR:-/tmp}/qi_cuda_emu}
mkdir -p "$B"
CC=${CC:-cc}
CXX=${CXX:-g++}
INC="-I$ROOT/engine/include -I$ROOT/engine"
for f in kernels/kernels_ref kernels/kernels_packed kernels/quant types; do
  $CC -std=c11 -O2 -ffp-contract=off -fno-fast-math $INC -c "$ROOT/engine/$f.c" -o "$B/$(basename $f).o"
done
XF="-std=c++17 -O1 -g -ffp-contract=off -fno-fast-math -Wall -Wno-unknown-pragmas -I$HERE/inc $INC -I$ROOT/engine/backend/cuda"
for k in k_attn k_elem k_matmul; do
  python3 "$HERE/launch.py" "$ROOT/engine/backend/cuda/$k.cu" > "$B/${k}_emu.cpp"
  $CXX $XF -c "$B/${k}_emu.cpp" -o "$B/${k}_emu.o"
done
$CXX $XF -c "$HERE/emu.cpp" -o "$B/emu.o"
LIBS="$B/emu.o $B/kernels_ref.o $B/kernels_packed.o $B/quant.o $B/types.o -lpthread -lm"
for k in elem attn matmul; do
  $CXX $XF "$HERE/test_${k}_emu.cpp" "$B/k_${k}_emu.o" $LIBS -o "$B/test_${k}_emu"
done
"$B/test_elem_emu"
"$B/test_attn_emu"
"$B/test_matmul_emu"

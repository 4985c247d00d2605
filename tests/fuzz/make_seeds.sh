#!/usr/bin/env bash
# The fuzz targets' binary seeds, written at build time rather than kept in
# the repository (tests/fuzz/README.md).
#
#   tests/fuzz/make_seeds.sh QINFER FZ_MERGE DIR
#
# DIR/gguf/{llama,gemma3,opt,falcon}.gguf: the smallest model of each
# architecture that `QINFER synth` writes (one layer, 32 wide, random
# weights of synth's fixed default seed, so the same bytes each time; opt
# and falcon shapes only): the gguf target's seeds, and (llama) the model
# the lua target loads. DIR/merge/*.db: results databases of several shapes
# from the harness's own writer (FZ_MERGE run with QI_FZ_WRITE_SEEDS): the
# merge target's seeds; FZ_MERGE "-" (no SQLite) leaves them out. DIR is
# replaced whole, so a reader never sees half of it. CTest's fixture
# fuzz_seeds runs it before the replays; campaign.sh and burst.sh before a
# run.
set -euo pipefail
[[ $# -eq 3 ]] || { echo "usage: make_seeds.sh QINFER FZ_MERGE DIR" >&2; exit 2; }
qinfer=$1 fz_merge=$2 dir=$3
tmp=$(mktemp -d "$dir.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/gguf"
shape=(--n-embd 32 --n-ff 32 --n-layer 1 --n-head 1 --n-head-kv 1 --n-ctx 64)
synth() {
  local name=$1
  shift
  "$qinfer" synth -o "$tmp/gguf/$name.gguf" "${shape[@]}" "$@" >"$tmp/log" 2>&1 ||
    { cat "$tmp/log" >&2; echo "make_seeds.sh: qinfer synth ($name) failed" >&2; exit 1; }
}
synth llama --preset smollm2-135m --type q4_0 --n-vocab 258
synth gemma3 --preset gemma3-270m --type q8_0 --n-vocab 300 --head-dim 32 --sliding-window 16
synth opt --preset opt-30b --shapes-only --n-vocab 258
synth falcon --preset falcon-40b --shapes-only --n-vocab 258
if [[ $fz_merge != - ]]; then
  mkdir -p "$tmp/merge"
  QI_FZ_WRITE_SEEDS="$tmp/merge" "$fz_merge" >"$tmp/log" 2>&1 ||
    { cat "$tmp/log" >&2; echo "make_seeds.sh: $fz_merge (QI_FZ_WRITE_SEEDS) failed" >&2; exit 1; }
fi
rm -f "$tmp/log"
rm -rf "$dir"
mv "$tmp" "$dir"
trap - EXIT
echo "make_seeds.sh: $(find "$dir" -type f | wc -l) seeds in $dir"

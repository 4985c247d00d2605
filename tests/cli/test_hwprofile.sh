#!/usr/bin/env bash
# End-to-end checks of the hardware profile flags of `qinfer sysinfo`:
# --help names them; every shipped profile passes --show-profile with its
# figures and sources printed; a bad profile, a missing file and bad flags
# are each one line on stderr with a non-zero exit; --profile-out writes a
# profile that reads back; plain `sysinfo` prints the memory available and
# the last-level cache where the kernel lists them (the figures bench sizes
# its probe and checks its KV cache by). Needs no model.
# Usage: test_hwprofile.sh PATH/TO/qinfer
set -uo pipefail
Q=${1:?usage: test_hwprofile.sh PATH/TO/qinfer}
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
profiles="$(dirname "${BASH_SOURCE[0]}")/../../engine/backend/sim/profiles"

if expect_ok "$Q" sysinfo --help; then
  grep -q -- "--show-profile FILE" "$tmp/out" || bad "sysinfo --help does not name --show-profile"
  grep -q -- "--profile-out FILE" "$tmp/out" || bad "sysinfo --help does not name --profile-out"
fi
# The host's figures, each against its own source.
if expect_ok "$Q" sysinfo; then
  if grep -q "^MemAvailable:" /proc/meminfo 2>/dev/null; then
    grep -q "^memory:  [0-9.]* GiB, [0-9.]* GiB available$" "$tmp/out" ||
      bad "sysinfo: no memory available: $(grep '^memory:' "$tmp/out")"
  fi
  if [[ -r /sys/devices/system/cpu/cpu0/cache/index0/size ]]; then
    grep -q "^cache:   last-level [0-9][0-9]* MiB$" "$tmp/out" ||
      bad "sysinfo: no last-level cache line: $(cat "$tmp/out")"
  fi
fi
n=0
for f in "$profiles"/*.profile; do
  n=$((n + 1))
  expect_ok "$Q" sysinfo --show-profile "$f" || continue
  grep -q "^profile: $(basename "$f" .profile) " "$tmp/out" || bad "$f: no profile line: $(head -1 "$tmp/out")"
  grep -q "^cpu.mem_bw .* GB/s  (" "$tmp/out" || bad "$f: cpu.mem_bw not printed with its source"
done
[[ $n -ge 6 ]] || bad "only $n shipped profiles"
expect_ok "$Q" sysinfo --show-profile "$profiles/a100-pcie-2xeon.profile" &&
  { grep -q "^gpu.mem_bw *1935 GB/s  (NVIDIA A100 datasheet" "$tmp/out" ||
    bad "a100: gpu.mem_bw not 1935 GB/s: $(grep gpu.mem_bw "$tmp/out")"; }

sed 's/^gpu.mem_bw = 1935 GB\/s .*/gpu.mem_bw = 1935 GB\/s/' "$profiles/a100-pcie-2xeon.profile" >"$tmp/nosrc.profile"
expect_fail 2 "nosrc.profile:13: gpu.mem_bw: a number without a '# source: ...' comment" \
  "$Q" sysinfo --show-profile "$tmp/nosrc.profile"
printf 'name = x\nkind = cpu-only\ncpu.mem = 3 GiBs  # source: x\n' >"$tmp/unit.profile"
expect_fail 2 "unit.profile:3: cpu.mem: unknown unit" "$Q" sysinfo --show-profile "$tmp/unit.profile"
expect_fail 1 "$tmp/none.profile: cannot open" "$Q" sysinfo --show-profile "$tmp/none.profile"
expect_fail 2 "option --show-profile needs a value" "$Q" sysinfo --show-profile
expect_fail 2 "do not go together" "$Q" sysinfo --show-profile "$tmp/x" --profile-out "$tmp/y"
expect_fail 2 "unknown option '--bogus'" "$Q" sysinfo --bogus

if expect_ok "$Q" sysinfo --profile-out "$tmp/here.profile"; then
  grep -q "^profile: here (cpu-only)" "$tmp/out" || bad "--profile-out: not read back: $(cat "$tmp/out")"
  grep -q "^cpu.fp32 .*# source: measured: qinfer sysinfo --profile-out, " "$tmp/here.profile" ||
    bad "--profile-out: cpu.fp32 not sourced as measured: $(cat "$tmp/here.profile")"
fi
expect_fail 1 "cannot write $tmp/no/dir/x.profile" "$Q" sysinfo --profile-out "$tmp/no/dir/x.profile"

echo "test_hwprofile.sh: $passes passed, $fails failed"
[[ $fails -eq 0 ]]

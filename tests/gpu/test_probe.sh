#!/usr/bin/env bash
# GPU check of `qinfer sysinfo --probe`: it succeeds, prints every bandwidth
# as a positive number, and the numbers are in a sane order (pinned host
# memory at least 1 GB/s over the link; HBM device-to-device faster than any
# host link). Skips (77) without a CUDA build or a device.
# Usage: test_probe.sh PATH/TO/qinfer
set -uo pipefail
Q=${1:?usage: test_probe.sh PATH/TO/qinfer}
# shellcheck source-path=SCRIPTDIR source=../cli/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../cli/lib.sh"

expect_ok "$Q" sysinfo || { echo "$passes passed, $fails failed"; exit 1; }
if grep -q "^gpu:     none" "$tmp/out"; then
  echo "skipped: no GPU ($(grep '^gpu:' "$tmp/out"))"
  exit 77
fi

if expect_ok "$Q" sysinfo --probe; then
  cat "$tmp/out"
  # field VALUE: the number after "WORD " on the line starting with KEY
  num() { sed -n "s/^$1: .*$2 \([0-9.]*\) GB\/s.*/\1/p" "$tmp/out"; }
  h2d_pin=$(num h2d pinned) h2d_pag=$(num h2d pageable)
  d2h_pin=$(num d2h pinned) d2h_pag=$(num d2h pageable)
  d2d=$(sed -n 's/^d2d: *\([0-9.]*\) GB\/s.*/\1/p' "$tmp/out")
  for v in h2d_pin h2d_pag d2h_pin d2h_pag d2d; do
    if [[ -z ${!v} ]] || ! awk -v x="${!v}" 'BEGIN { exit !(x > 0) }'; then
      bad "$v is not a positive number: '${!v}'"
    else
      ok
    fi
  done
  if [[ $fails -eq 0 ]]; then
    if awk -v x="$h2d_pin" -v y="$d2h_pin" 'BEGIN { exit !(x >= 1 && y >= 1) }'; then
      ok
    else
      bad "pinned host<->device below 1 GB/s: h2d $h2d_pin, d2h $d2h_pin"
    fi
    if awk -v d="$d2d" -v a="$h2d_pin" -v b="$d2h_pin" -v c="$h2d_pag" -v e="$d2h_pag" \
         'BEGIN { exit !(d > a && d > b && d > c && d > e) }'; then
      ok
    else
      bad "device-to-device ($d2d GB/s) is not faster than every host link figure"
    fi
  fi
fi
expect_fail 2 "unknown option" "$Q" sysinfo --probe --bogus

echo "$passes passed, $fails failed"
[[ $fails -eq 0 ]]

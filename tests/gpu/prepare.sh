#!/usr/bin/env bash
# Fetch, on a machine with Debian 12 package access, the packages the GPU
# check needs to build qinfer where they are not installed: PCRE2's headers,
# library and its sibling runtimes (libpcre2-dev and what it depends on).
# The .debs land in .gpu-deps/ at the repository root (git-ignored), with
# their SHA-256 sums; tests/gpu/check.sh unpacks them into its build folder,
# never into /. No pkg-config is fetched: without one, CMake finds PCRE2
# directly (see CMakeLists.txt).
#
#   tests/gpu/prepare.sh        fetch (again) into .gpu-deps/
set -euo pipefail
cd "$(dirname "$0")/../.."
[[ ${1:-} == -h || ${1:-} == --help ]] && { sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0; }

pkgs=(libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 libpcre2-posix3)
dest=.gpu-deps
command -v apt-get >/dev/null || { echo "prepare.sh: apt-get not found (a Debian 12 machine is needed)" >&2; exit 1; }
git check-ignore -q "$dest/x.deb" || { echo "prepare.sh: $dest/ is not git-ignored" >&2; exit 1; }

rm -rf "$dest"
mkdir -p "$dest"
cd "$dest"
if ! apt-get download "${pkgs[@]}"; then
  echo "prepare.sh: download failed; refreshing the package lists and retrying" >&2
  apt-get update
  apt-get download "${pkgs[@]}"
fi
for p in "${pkgs[@]}"; do
  compgen -G "${p}_*.deb" >/dev/null || { echo "prepare.sh: $p was not downloaded" >&2; exit 1; }
done
sha256sum ./*.deb >SHA256SUMS
ls -l ./*.deb
echo "prepare.sh: $(du -sh . | cut -f1) in $dest/; carry it with the tree and run tests/gpu/check.sh"

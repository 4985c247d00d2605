#!/usr/bin/env bash
# Set up qinfer on a fresh Debian 12 machine: install the Debian packages it
# needs, build it, and fetch the default model and the evaluation corpus into
# the cache ($QINFER_CACHE, default ~/.cache/qinfer).
#
#   scripts/setup.sh                 everything
#   scripts/setup.sh --with NAME     also fetch NAME of models/manifest.tsv
#                                    (e.g. qwen2.5-coder-1.5b, 1.1 GB)
#   scripts/setup.sh --no-fetch      install and build only
#   scripts/setup.sh --help
set -euo pipefail
cd "$(dirname "$0")/.."

fetch=1
extra=()
while (($#)); do
  case "$1" in
    --no-fetch) fetch=0 ;;
    --with)
      [[ -n ${2:-} ]] || { echo "setup.sh: --with needs a name of models/manifest.tsv" >&2; exit 2; }
      extra+=("$2"); shift ;;
    -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "setup.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done

# libopenblas0 is what --attn-blas loads at run time (the build never links
# it); libopenblas-dev also builds bench/attn_blas.c. slurm-wlm and munge are
# for the tests of qinfer submit, which start a private one-machine Slurm
# cluster (tests/slurm/testbed.sh); the services the packages install are
# not configured or used. libmicrohttpd-dev and libcjson-dev build qinfer
# serve (the HTTP API); its tests put the openai client from PyPI in a venv
# of their own in the model cache. libcurl4-openssl-dev builds qinfer load
# (the load test of qinfer serve, an HTTP client). libglpk-dev solves the
# flexgen placement policy's linear program. clang and libclang-rt-14-dev
# (libFuzzer and the sanitizers' runtimes for clang) build the fuzz targets
# of tests/fuzz/ for libFuzzer (tests/fuzz/burst.sh, tests/fuzz/campaign.sh).
pkgs=(build-essential cmake pkg-config libopenblas0 libopenblas-dev libsqlite3-dev liblua5.4-dev lua5.4
      check libpcre2-dev gnuplot-nox sqlite3 python3-pip python3-venv unzip ca-certificates
      slurm-wlm munge libmicrohttpd-dev libcjson-dev libcurl4-openssl-dev libglpk-dev clang libclang-rt-14-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup.sh: installing ${missing[*]}"
  SUDO=""
  [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
cmake --build build -j"$(nproc)"

if ((fetch)); then
  models/fetch.sh smollm2-135m devil ${extra[@]+"${extra[@]}"}
fi
echo "setup.sh: done; the program is build/qinfer"

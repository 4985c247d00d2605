#!/usr/bin/env bash
# Build the reference llama.cpp that the goldens in tests/golden/ come from.
#
# llama.cpp is taken from the PyPI source distribution of llama-cpp-python
# (which vendors llama.cpp at a fixed commit), built as shared libraries plus
# a few tools, and paired with a venv holding the Python bindings' runtime
# dependencies. Nothing is pip-installed from the sdist itself: the bindings
# are used from the extracted tree via PYTHONPATH, and find the freshly built
# libllama through LLAMA_CPP_LIB_PATH.
#
# Every step is skipped when its result is already there, so the script can be
# rerun at will. Everything lands under $QINFER_CACHE/llama.cpp (default
# ~/.cache/qinfer/llama.cpp) and ~/.cache/qinfer/llama-venv.
#
#   tests/golden/build_llama.sh                 # download, extract, build, venv
#   tests/golden/build_llama.sh --sources-only  # download and extract only: llama.cpp's
#                                               # vocabulary test suite (models/ggml-vocab-*)
#                                               # for test_tokenizer_vocab, no build
#   JOBS=4 tests/golden/build_llama.sh          # parallel build jobs (default: nproc)
set -euo pipefail

sources_only=0
case "${1:-}" in
    "") ;;
    --sources-only) sources_only=1 ;;
    *) echo "build_llama: unknown option '$1' (--sources-only, or nothing)" >&2; exit 2 ;;
esac

version="0.3.36"
cache="${QINFER_CACHE:-$HOME/.cache/qinfer}"
root="$cache/llama.cpp"
sdist="$root/llama_cpp_python-$version.tar.gz"
src="$root/llama_cpp_python-$version"
vendor="$src/vendor/llama.cpp"
build="$root/build"
venv="$cache/llama-venv"
jobs="${JOBS:-$(nproc)}"
targets=(llama llama-tokenize llama-perplexity llama-bench llama-batched-bench llama-simple)
cmake_flags=(
    -DCMAKE_BUILD_TYPE=Release
    -DBUILD_SHARED_LIBS=ON
    -DGGML_NATIVE=ON
    -DLLAMA_CURL=OFF
    -DLLAMA_OPENSSL=OFF
    -DLLAMA_BUILD_TESTS=OFF
    -DLLAMA_BUILD_SERVER=OFF
)
py_deps=(numpy typing_extensions diskcache jinja2 pyyaml)

say() { echo "build_llama: $*"; }
die() {
    echo "build_llama: error: $*" >&2
    exit 1
}

tools=(python3 tar)
((sources_only)) || tools+=(cmake make c++ cc)
for tool in "${tools[@]}"; do
    command -v "$tool" >/dev/null || die "'$tool' not found (apt-get install build-essential cmake python3 python3-venv)"
done
mkdir -p "$root"

# 1. The sdist.
if [[ -f "$sdist" ]]; then
    say "sdist present: $sdist"
else
    say "downloading llama-cpp-python==$version (source distribution)"
    python3 -m pip download --no-deps --no-binary :all: "llama-cpp-python==$version" -d "$root"
    [[ -f "$sdist" ]] || die "pip download did not produce $sdist"
fi

# 2. Extract (atomically: into a temp dir, then rename).
if [[ -f "$vendor/CMakeLists.txt" ]]; then
    say "sources present: $src"
else
    say "extracting $sdist"
    tmp=$(mktemp -d "$root/extract.XXXXXX")
    tar -xzf "$sdist" -C "$tmp"
    [[ -f "$tmp/llama_cpp_python-$version/vendor/llama.cpp/CMakeLists.txt" ]] ||
        die "sdist lacks vendor/llama.cpp"
    rm -rf "$src"
    mv "$tmp/llama_cpp_python-$version" "$src"
    rmdir "$tmp"
fi

if ((sources_only)); then
    say "sources only: $vendor (vocabulary suite in $vendor/models)"
    exit 0
fi

# 3. Configure (once; a cache pointing at another source tree is redone).
if [[ -f "$build/CMakeCache.txt" ]] &&
    grep -qx "CMAKE_HOME_DIRECTORY:INTERNAL=$vendor" "$build/CMakeCache.txt"; then
    say "already configured: $build"
else
    say "configuring $build"
    rm -rf "$build"
    cmake -S "$vendor" -B "$build" "${cmake_flags[@]}" 2>&1 | tee "$root/cfg.log"
fi

# 4. Build (make is incremental: a no-op when everything is up to date).
say "building ${targets[*]} with $jobs jobs (log: $root/build.log)"
if ! cmake --build "$build" -j"$jobs" --target "${targets[@]}" >"$root/build.log" 2>&1; then
    tail -n 30 "$root/build.log" >&2
    die "build failed; see $root/build.log"
fi
echo "done rc=0" >>"$root/build.log"

# 5. The venv for the bindings.
if [[ -x "$venv/bin/python" ]] &&
    "$venv/bin/python" -c 'import numpy, typing_extensions, diskcache, jinja2, yaml' 2>/dev/null; then
    say "venv present: $venv"
else
    say "creating venv $venv"
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet "${py_deps[@]}"
fi

# 6. Check the bindings load the built library.
export PYTHONPATH="$src${PYTHONPATH:+:$PYTHONPATH}"
export LLAMA_CPP_LIB_PATH="$build/bin"
"$venv/bin/python" -c 'import llama_cpp; print("build_llama: bindings ok, llama_cpp", llama_cpp.__version__)'

commit=$(git -C "$vendor" rev-parse HEAD 2>/dev/null || echo unknown)
cat <<EOF

llama.cpp (llama-cpp-python $version, vendored llama.cpp commit $commit):
  sources       $vendor
  build         $build
  binaries      $build/bin/{llama-perplexity,llama-tokenize,llama-bench,llama-batched-bench,llama-simple}
  libraries     $build/bin/libllama.so, libggml*.so
  venv          $venv
To use the Python bindings:
  PYTHONPATH=$src LLAMA_CPP_LIB_PATH=$build/bin $venv/bin/python
To record goldens:
  $venv/bin/python tests/golden/record.py [MODEL]
Note: where the CPU advertises AMX-INT8 but the OS does not enable it, the
default (AMX) weight path dies with SIGILL; run the tools with --no-repack
(API: llama_model_params.use_extra_bufts = false), as record.py does.
EOF

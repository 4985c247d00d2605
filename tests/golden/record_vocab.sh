#!/usr/bin/env bash
# Record tests/golden/vocab/NAME.tsv: llama.cpp's ids for every line of
# tests/golden/strings.tsv with the vocabulary-only file
# models/ggml-vocab-NAME.gguf of the reference sdist, for the vocabularies
# named (default: every one qinfer tokenizes). Needs the llama.cpp that
# tests/golden/build_llama.sh builds (its libllama); compiles
# record_vocab.c against it into a temporary folder.
#
#   tests/golden/record_vocab.sh [NAME...]
set -euo pipefail
cd "$(dirname "$0")/../.."
cache="${QINFER_CACHE:-$HOME/.cache/qinfer}"
root="$cache/llama.cpp"
vendor="$root/llama_cpp_python-0.3.36/vendor/llama.cpp"
lib="$root/build/bin"
[[ -f "$lib/libllama.so" ]] || { echo "record_vocab: $lib/libllama.so missing; run tests/golden/build_llama.sh" >&2; exit 1; }
names=("$@")
((${#names[@]})) || names=(bert-bge command-r deepseek-coder deepseek-llm falcon gemma-4 gpt-2 llama-bpe
    llama-spm mpt phi-3 qwen2 qwen35 refact starcoder aquila baichuan gpt-neox)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cc -O1 -o "$tmp/record_vocab" tests/golden/record_vocab.c -I"$vendor/include" -I"$vendor/ggml/include" \
    -L"$lib" -lllama -Wl,-rpath,"$lib"
commit=$(grep -o 'LLAMA_COMMIT = "[^"]*"' "$root/build/common/build-info.cpp" 2>/dev/null | cut -d'"' -f2 || true)
mkdir -p tests/golden/vocab
for name in "${names[@]}"; do
    gguf="$vendor/models/ggml-vocab-$name.gguf"
    out="tests/golden/vocab/$name.tsv"
    {
        echo "# llama.cpp (llama-cpp-python 0.3.36, commit ${commit:-unknown}): llama_tokenize with models/ggml-vocab-$name.gguf (vocab_only)"
        echo "# vocabulary sha256 $(sha256sum "$gguf" | cut -d' ' -f1); strings.tsv sha256 $(sha256sum tests/golden/strings.tsv | cut -d' ' -f1)"
        echo "# one line per data line of tests/golden/strings.tsv, with its add_special and parse_special: the ids, space-separated"
        "$tmp/record_vocab" "$gguf" tests/golden/strings.tsv 2>/dev/null
    } >"$out.tmp"
    mv "$out.tmp" "$out"
    echo "record_vocab: $out ($(grep -vc '^#' "$out") lines)"
done

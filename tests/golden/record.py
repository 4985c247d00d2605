#!/usr/bin/env python3
"""Record llama.cpp reference outputs ("goldens") for one model.

    record.py [MODEL] [--out DIR] [--only PART,...] [--greedy all|small] [--n-gen N] [--info]

MODEL is a short name from models/manifest.tsv (default: smollm2-135m); the
model and the eval corpus must already be in the cache (models/fetch.sh).
The reference is llama.cpp as vendored by llama-cpp-python 0.3.36, built by
tests/golden/build_llama.sh; this script drives its C API through the
package's ctypes bindings (used from the extracted source tree, not
pip-installed) and runs its llama-perplexity binary. Nothing here computes a
model output itself: every number written comes from llama.cpp.

Files written to tests/golden/<MODEL>/ (PART names for --only in brackets):
  tokenize.tsv [tokenize]  token ids for every string of strings.tsv
  greedy.tsv   [greedy]    64 (--n-gen) greedy tokens + top-2 logits per step, per prompt
  logits.tsv   [greedy]    top-10 logits of the first generated position
  ppl.tsv      [ppl]       llama-perplexity figures on the corpus
and tests/golden/strings.tsv, the model-independent list of test strings.
--info prints the model's tokenizer metadata and tensor types, then exits.

Run it with the venv python made by build_llama.sh (it re-executes itself
under that python when started with another one).
"""

import argparse
import ctypes
import hashlib
import os
import random
import re
import subprocess
import sys
import time
import unicodedata

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
CACHE = os.environ.get("QINFER_CACHE", os.path.expanduser("~/.cache/qinfer"))
LLAMA_PY_VERSION = "0.3.36"
LLAMA_ROOT = os.path.join(CACHE, "llama.cpp")
LLAMA_SRC = os.path.join(LLAMA_ROOT, "llama_cpp_python-" + LLAMA_PY_VERSION)
LLAMA_VENDOR = os.path.join(LLAMA_SRC, "vendor", "llama.cpp")
LLAMA_BIN = os.path.join(LLAMA_ROOT, "build", "bin")
VENV_PY = os.path.join(CACHE, "llama-venv", "bin", "python")

N_THREADS = 2
N_CTX = 2048
N_GEN = 64  # --n-gen
# --greedy small: the indices into greedy_prompts' list of the few prompts a
# model too slow for the whole set is held to (plain text, code, a list of
# digits, CJK, emoji, a ChatML conversation in the model's own template),
# plus the corpus passage cut to SMALL_PASSAGE tokens.
SMALL_PROMPTS = (0, 3, 13, 11, 21, 23)
SMALL_PASSAGE = 160
GREEDY_SET = "all"
# (label, ctx, chunks or None for the whole corpus); --ppl-runs overrides,
# e.g. "512:4,2048:2" for the quick runs a test can afford.
PPL_RUNS = [("full", 512, None), ("2", 512, 2), ("4", 512, 4)]
STRINGS_SEED = 20240611
# llama.cpp's "extra buffer types" (AMX tiles, repacked weight layouts) are
# turned off, in the API (use_extra_bufts=false) and in llama-perplexity
# (--no-repack): the -march=native build compiles the AMX kernels on a CPU
# that advertises AMX-INT8, yet executing them raises SIGILL on this machine.
# The generic ggml-cpu kernels run everywhere and give the same figures.
EXTRA_BUFTS = "use_extra_bufts=false (llama-perplexity --no-repack)"
# Flash attention is turned off (API flash_attn_type=disabled, llama-perplexity
# -fa off). Its CPU kernels accumulate V in fp16 and pick one of three
# arithmetic paths by batch and cache length, so llama.cpp's own logits move
# by ~0.1 between flash attention on and off on this model (whose massive
# activations make 8-bit activation quantisation sensitive to the last bit).
# The non-flash path is plain op semantics (f16 K/V, f16 softmax weights) that
# an engine can reproduce exactly.
FLASH_ATTN = "flash_attn=disabled (llama-perplexity -fa off)"
# --reuse-logs: take a ppl run's figures from its full log in
# $QINFER_CACHE/golden-logs/MODEL/ppl-CTX-LABEL.log when one exists (a
# whole-corpus run takes an hour on two cores) instead of running it again.
REUSE_LOGS = False


# --------------------------------------------------------------------------
# Environment

def reexec_under_venv():
    """Re-run this script with the venv python when numpy is missing here."""
    try:
        import numpy  # noqa: F401
        return
    except ImportError:
        pass
    if os.path.exists(VENV_PY) and os.path.realpath(sys.executable) != os.path.realpath(VENV_PY):
        os.execv(VENV_PY, [VENV_PY] + sys.argv)
    sys.exit("record.py: numpy not found; run tests/golden/build_llama.sh, then use " + VENV_PY)


def load_bindings():
    if not os.path.isdir(os.path.join(LLAMA_SRC, "llama_cpp")):
        sys.exit("record.py: %s missing; run tests/golden/build_llama.sh" % LLAMA_SRC)
    sys.path.insert(0, LLAMA_SRC)
    os.environ.setdefault("LLAMA_CPP_LIB_PATH", LLAMA_BIN)
    import llama_cpp  # noqa: E402
    return llama_cpp


def read_manifest():
    rows = {}
    with open(os.path.join(REPO, "models", "manifest.tsv"), encoding="utf-8") as f:
        for line in f:
            line = line.rstrip("\n")
            if not line.strip() or line.startswith("#"):
                continue
            name, kind, source, member, fname, sha = line.split("\t")
            sub = "models" if kind == "model" else "corpora"
            rows[name] = dict(name=name, kind=kind, source=source, member=member,
                              file=fname, sha256=sha, path=os.path.join(CACHE, sub, fname))
    return rows


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def checked(entry):
    if not os.path.exists(entry["path"]):
        sys.exit("record.py: %s not cached; run models/fetch.sh %s" % (entry["path"], entry["name"]))
    got = sha256_file(entry["path"])
    if got != entry["sha256"]:
        sys.exit("record.py: %s has sha256 %s, manifest says %s" % (entry["path"], got, entry["sha256"]))
    return entry["path"]


def llama_commit():
    try:
        return subprocess.check_output(["git", "-C", LLAMA_VENDOR, "rev-parse", "HEAD"],
                                       stderr=subprocess.DEVNULL, text=True).strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    try:
        with open(os.path.join(LLAMA_ROOT, "build", "common", "build-info.cpp")) as f:
            m = re.search(r'LLAMA_COMMIT = "([^"]+)"', f.read())
            if m:
                return m.group(1)
    except OSError:
        pass
    return "unknown"


# --------------------------------------------------------------------------
# Test strings (model independent; written to strings.tsv)

def lcpp_codepoints(b):
    """llama.cpp's lenient UTF-8 decoder (src/unicode.cpp), for filtering.

    A lead byte only needs the right number of 10xxxxxx bytes after it;
    anything else becomes U+FFFD and consumes one byte.
    """
    out, i, n = [], 0, len(b)
    while i < n:
        c = b[i]
        if c < 0x80:
            out.append(c)
            i += 1
            continue
        need = 1 if c & 0xE0 == 0xC0 else 2 if c & 0xF0 == 0xE0 else 3 if c & 0xF8 == 0xF0 else -1
        if c & 0xC0 == 0x80:
            need = -1
        if need < 0 or i + need >= n:
            out.append(0xFFFD)
            i += 1
            continue
        if any(b[i + k] & 0xC0 != 0x80 for k in range(1, need + 1)):
            out.append(0xFFFD)
            i += 1
            continue
        cp = c & (0x1F, 0x0F, 0x07)[need - 1]
        for k in range(1, need + 1):
            cp = (cp << 6) | (b[i + k] & 0x3F)
        out.append(cp)
        i += need + 1
    return out


def aborts_llama_cpp(b):
    # A 4-byte form above U+10FFFF (F4 90.., F5..F7 leads) decodes to a code
    # point that llama.cpp later fails to re-encode: the uncaught exception
    # aborts the process. Such inputs cannot have a golden.
    return any(cp > 0x10FFFF for cp in lcpp_codepoints(b))


def u(s):
    return s.encode("utf-8")


def test_strings():
    """Return [(bytes, category, add_special, parse_special)], deterministic."""
    S = []

    def add(cat, items, add_special=1, parse_special=0):
        for it in items:
            b = it if isinstance(it, bytes) else u(it)
            S.append((b, cat, add_special, parse_special))

    add("empty", [""])
    add("whitespace", [
        " ", "  ", "   ", "    ", "     ", "      ", "       ", "        ", " " * 16, " " * 33,
        "\t", "\t\t", "\t\t\t", "\n", "\n\n", "\n\n\n", "\n" * 8, "\r", "\r\n", "\r\n\r\n",
        "\r\r\n", " \n", "\n ", " \t\n", "\t \n \r\n", "\n\t\t", " \t \t ", "\v\f", "\f",
        "   \n\n   ", "hello ", " hello", "  hello  world  ", "hello world\n", "\nhello",
        "a\n\nb", "a \n b", "a  b", "a   b", "a\tb", "a\t\tb", "line1\r\nline2\r\n",
        "trailing spaces   ", "   leading spaces", "x\u00a0y", "\u00a0", "\u3000",
        "a\u2003b", "\u2009thin", "  \n  \n  ", "\t\n\t\n", "word \t \n word",
    ])
    add("prose", [
        "Hello", "Hello world", "Hello, world!", "hello world", "HELLO WORLD",
        "The quick brown fox jumps over the lazy dog.",
        "A journey of a thousand miles begins with a single step.",
        "It was the best of times, it was the worst of times.",
        "She sells sea shells by the sea shore.",
        "In 1492, Columbus sailed the ocean blue.",
        "Tokenizers split text into pieces called tokens.",
        "The committee's recommendation, which nobody had read, was adopted unanimously.",
        "Mr. Smith went to Washington D.C. on Jan. 3rd.",
        "Supercalifragilisticexpialidocious",
        "antidisestablishmentarianism",
        "pneumonoultramicroscopicsilicovolcanoconiosis",
        "I", "a", "A", "the", "The", " the", " The", "THE",
        "Once upon a time there lived a king who had three daughters. The youngest was the "
        "most beautiful, and she loved to play by the well in the forest.",
        "What is the meaning of life, the universe, and everything?",
        "camelCaseWordsAndPascalCase", "snake_case_words_here", "kebab-case-words-here",
        "ALLCAPSWORD", "MiXeD CaSe TeXt", "e-mail re-enter co-operate",
        "Dr. Jekyll and Mr. Hyde", "Ph.D. M.Sc. B.A.", "rock'n'roll",
    ])
    contr = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d"]
    add("contraction", [
        "it's", "don't", "they're", "we've", "I'm", "you'll", "she'd",
        "IT'S", "DON'T", "THEY'RE", "WE'VE", "I'M", "YOU'LL", "SHE'D",
        "It'S", "Don'T", "They'Re",
        "it\u2019s", "don\u2019t", "they\u2019re", "I\u2019m", "we\u2018ve",
        "ain't", "y'all'd've", "'tis", "rock 'n' roll", "o'clock", "'quoted'",
        "can''t", "dogs' bones", "James's book", "the '90s", "I'd've", "won't've",
    ] + contr + [c.upper() for c in contr] + ["x" + c for c in contr] + [" " + c for c in contr])
    add("digits", [("1234567890" * 4)[:n] for n in range(1, 41)])
    rng_d = random.Random(STRINGS_SEED + 1)
    add("digits", ["".join(rng_d.choice("0123456789") for _ in range(n)) for n in (5, 7, 11, 13, 17, 23, 29, 37)])
    add("number", [
        "0", "00", "007", "1,234", "1,234,567", "12,345,678.90", "3.14159", "3.14159265358979323846",
        "1 000 000", "1_000_000", "1'000'000", "-42", "+7", "-0.5", "1e10", "6.022e23", "1E-9",
        "0x1F", "0xDEADBEEF", "0b1011", "0o755", "2024-06-01", "12:30:45", "$1,234.56", "\u20ac99,99",
        "99%", "1.2.3.4", "v0.3.36", "192.168.0.1", "+1 (555) 123-4567", "1/2", "3/4 cup",
        "in 2023 and 2024", "page 12 of 345", "year 1999", "x2 y10 z100", "1st 2nd 3rd 4th",
        "\u0661\u0662\u0663", "\u096a\u096b", "\uff11\uff12\uff13",
    ])
    add("punct", [
        ".", ",", "!", "?", "...", "?!?!", "!!!", "???", "---", "\u2014", "\u2013", "\u2026",
        "\u00abquotes\u00bb", "\u201csmart quotes\u201d", "((nested))", "[[a]]", "{{x}}", "<<<>>>",
        "@#$%^&*", "a.b.c", "e.g.,", "i.e.", "U.S.A.", ":-)", ";-P", "***bold***", "__init__",
        "~/.bashrc", "C:\\Windows\\System32", "http://example.com/path?q=1&r=2#frag",
        "user@example.com", "#hashtag @mention", "=====", "-----BEGIN-----", "/* */", "//", "#!",
        "&&||", "!=", "==", "===", "<=>", "->", "=>", "::", "\"\"", "''", "``", "```", "''''",
        "(\u256f\u00b0\u25a1\u00b0)\u256f\ufe35 \u253b\u2501\u253b", "\u00bf\u00a1Hola!?",
    ])
    add("code-c", [
        "#include <stdio.h>\n\nint main(void) {\n    printf(\"Hello, world!\\n\");\n    return 0;\n}\n",
        "for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }",
        "static inline uint32_t rotl(uint32_t x, int k) { return (x << k) | (x >> (32 - k)); }",
        "struct node { struct node *next; void *data; };",
        "if (p == NULL) {\n\treturn -1;\n}\n",
        "#define MAX(a, b) ((a) > (b) ? (a) : (b))",
    ])
    add("code-py", [
        "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
        "import numpy as np\nx = np.zeros((3, 4), dtype=np.float32)\n",
        "class Foo(object):\n    def __init__(self):\n        self.x = 1\n",
        "print(f\"{name!r}: {value:>10.3f}\")",
        "lambda x: x ** 2 if x else None",
        "    # indented comment\n        deeper = True\n",
        "with open('data.txt', 'rb') as fh:\n\tdata = fh.read()\n",
    ])
    add("json", [
        "{\"name\": \"Alice\", \"age\": 30, \"tags\": [\"a\", \"b\"], \"ok\": true, \"x\": null}",
        "[1, 2, 3, 4.5, -6e7]",
        "{\n  \"nested\": {\n    \"key\": \"value\"\n  }\n}",
        "{\"unicode\": \"\\u00e9\\u4e2d\", \"esc\": \"a\\\"b\\\\c\\n\"}",
        "{}", "[]", "{\"\":\"\"}",
    ])
    add("html", [
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head><meta charset=\"utf-8\"><title>Test</title></head>\n"
        "<body><p class=\"x\">Hello &amp; welcome</p></body>\n</html>\n",
        "<div id=\"main\"><a href=\"https://example.com\">link</a></div>",
        "<br/><hr /><img src=\"a.png\" alt=\"\">",
        "&lt;script&gt;alert(1)&lt;/script&gt;",
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?><root><item n=\"1\"/></root>",
    ])
    add("code-misc", [
        "SELECT id, name FROM users WHERE age > 21 ORDER BY name;",
        "#!/bin/sh\nset -eu\nfor f in *.txt; do echo \"$f\"; done\n",
        "fn main() { println!(\"{}\", 1 + 2); }",
        "x := []int{1, 2, 3}",
        "\\begin{equation} E = mc^2 \\end{equation}",
        "a = b + c * (d - e) / f % g;",
    ])
    add("emoji", [
        "\U0001F600", "\U0001F44D\U0001F3FD", "\U0001F468\u200d\U0001F469\u200d\U0001F467\u200d\U0001F466",
        "\U0001F3F3\ufe0f\u200d\U0001F308", "\U0001F1EF\U0001F1F5", "\U0001F1FA\U0001F1F8\U0001F1EC\U0001F1E7",
        "\u2764\ufe0f", "\u2728 sparkle", "I \u2764 NY", "\U0001F469\U0001F3FE\u200d\U0001F4BB",
        "\U0001F9D1\u200d\U0001F680", "\U0001F600\U0001F603\U0001F604\U0001F601", "#\ufe0f\u20e3",
        "\U0001FAE0", "Hello \U0001F30D!", "\U0001F44B\U0001F3FB\U0001F44B\U0001F3FF",
    ])
    add("cjk", [
        "\u4f60\u597d\uff0c\u4e16\u754c\uff01", "\u4e2d\u6587\u5206\u8bcd\u6d4b\u8bd5",
        "\u6211\u7231\u5317\u4eac\u5929\u5b89\u95e8", "\u6f22\u5b57", "\u9f8d",
        "\u6771\u4eac\u306f\u65e5\u672c\u306e\u9996\u90fd\u3067\u3059\u3002",
    ])
    add("kana", [
        "\u3072\u3089\u304c\u306a", "\u30ab\u30bf\u30ab\u30ca", "\u3053\u3093\u306b\u3061\u306f\u4e16\u754c",
        "\uff76\uff80\uff76\uff85", "\u30fc\u30fb\u3001\u3002", "\u304c\u304e\u3050\u3052\u3054",
    ])
    add("korean", ["\uc548\ub155\ud558\uc138\uc694", "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8",
                   "\u1100\u1161\u11a8"])
    add("arabic", ["\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645",
                   "\u0627\u0644\u0633\u0644\u0627\u0645 \u0639\u0644\u064a\u0643\u0645",
                   "\u0643\u062a\u0627\u0628 123 book"])
    add("hebrew", ["\u05e9\u05dc\u05d5\u05dd \u05e2\u05d5\u05dc\u05dd", "\u05e2\u05b4\u05d1\u05b0\u05e8\u05b4\u05d9\u05ea"])
    add("devanagari", ["\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e",
                       "\u0939\u093f\u0928\u094d\u0926\u0940", "\u0915\u094d\u0937\u0924\u094d\u0930"])
    add("thai", ["\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35\u0e0a\u0e32\u0e27\u0e42\u0e25\u0e01",
                 "\u0e20\u0e32\u0e29\u0e32\u0e44\u0e17\u0e22"])
    latin = ["caf\u00e9", "na\u00efve", "Z\u00fcrich", "S\u00e3o Paulo", "\u00c5ngstr\u00f6m",
             "cr\u00e8me br\u00fbl\u00e9e", "\u0141\u00f3d\u017a", "\u00e9l\u00e8ve", "Stra\u00dfe",
             "pi\u00f1ata", "\u00c9COLE", "\u0130stanbul", "\u00f8re \u00e6ble"]
    add("latin-nfc", [unicodedata.normalize("NFC", s) for s in latin])
    add("latin-nfd", [unicodedata.normalize("NFD", s) for s in latin])
    add("cyrillic", ["\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440!",
                     "\u0421\u044a\u0435\u0448\u044c \u0436\u0435 \u0435\u0449\u0451 \u044d\u0442\u0438\u0445 "
                     "\u043c\u044f\u0433\u043a\u0438\u0445 \u0444\u0440\u0430\u043d\u0446\u0443\u0437\u0441\u043a\u0438\u0445 "
                     "\u0431\u0443\u043b\u043e\u043a",
                     "\u0423\u041a\u0420\u0410\u0407\u041d\u0410 \u0457\u0436\u0430\u043a", "\u0416"])
    add("greek", ["\u0393\u03b5\u03b9\u03ac \u03c3\u03bf\u03c5 \u039a\u03cc\u03c3\u03bc\u03b5",
                  "\u03b1\u03b2\u03b3\u03b4\u03b5 \u0391\u0392\u0393\u0394\u0395", "\u1f00\u03bd\u03ae\u03c1"])
    add("math", [
        "\u2211_{i=1}^{n} i\u00b2 = n(n+1)/2", "\u2200x\u2208\u211d: x\u00b2\u22650", "\u221a2 \u2248 1.41421",
        "\u221e \u2260 \u2205", "\U0001D538\U0001D539\u2102 \U0001D49C\u212c\U0001D49E", "\u00bd \u00bc \u00be",
        "\u03b1\u2192\u03b2 \u21d2 \u03b3", "\u222b\u2080\u00b9 f(x) dx", "a\u2264b\u2265c\u00b1d\u00d7e\u00f7f",
        "x\u2081 + x\u2082 = x\u2099",
    ])
    add("combining", [
        "e\u0301", "a\u0308\u0304", "Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f\u0334\u0319\u0324\u031e\u0349\u035a",
        "\u0301", "\u0301\u0301\u0301", "n\u0303 vs \u00f1", "q\u0323\u0307", "\u0915\u093c",
    ])
    add("zero-width", [
        "a\u200bb", "\u200d", "\ufeffBOM at start", "a\u200cb", "word\u2060joiner", "soft\u00adhyphen",
        "\u200e\u200f", "\ufeff",
    ])
    add("control", [
        "\x00", "a\x00b", "\x00\x00\x00", "\x01\x02\x03", "\x1b[31mred\x1b[0m", "\x7f", "\x08\x08",
        "\u0085", "line\u2028sep", "para\u2029sep", "\x1f\x1e", "bell\x07",
    ])
    add("invalid-utf8", [
        b"\x80", b"\xbf", b"\x80\x80\x80", b"a\x80b", b"\xc3", b"\xc3 ", b"\xe2\x82", b"\xf0\x9f\x98",
        b"\xf0\x9f\x98 x", b"\xc0\x80", b"\xc1\xbf", b"\xe0\x80\xaf", b"\xf0\x80\x80\xaf", b"\xff",
        b"\xfe", b"\xfe\xff", b"\xff\xfe", b"\xff\xff\xff\xff", b"\xed\xa0\x80", b"\xed\xbf\xbf",
        b"\xed\xa0\xbd\xed\xb8\x80", b"\xf8\x88\x80\x80\x80", b"\xfc\x84\x80\x80\x80\x80",
        b"hello \xff world", b"caf\xe9", b"\xe9t\xe9", b"\xc3\xa9\x80\xc3\xa9", b"\xe2\x82\xac\xe2\x82",
        b"\xc3\x28", b"\xa0\xa1", b"\xe2\x28\xa1", b"\xe2\x82\x28", b"\xf0\x28\x8c\xbc",
        b"\xf0\x90\x28\xbc", b"\xf0\x28\x8c\x28", b"\xf5", b"\xf5\x80", b"\xf8",
        b"ok \xf0\x9f\x98\x80 \xf0\x9f\x98 bad",
        b"\xef\xbf\xbd", b"\xef\xbf\xbe", b"\xc2\x80\xc2\x9f",
    ])
    # Seeded mixtures: two to five fragments of the sets above, glued together,
    # and short runs of random bytes.
    rng = random.Random(STRINGS_SEED)
    pool = [b for b, _, _, _ in S if b]
    mixed = []
    while len(mixed) < 50:
        k = rng.randint(2, 5)
        mixed.append(b"".join(rng.choice(pool) for _ in range(k)))
    add("mixed", mixed)
    rand = []
    while len(rand) < 24:
        n = rng.randint(1, 16)
        b = bytes(rng.randrange(256) for _ in range(n))
        if not aborts_llama_cpp(b):
            rand.append(b)
    add("random-bytes", rand)
    ascii_rand = []
    alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,;:'\"!?-_()\n\t"
    while len(ascii_rand) < 16:
        n = rng.randint(1, 40)
        ascii_rand.append("".join(rng.choice(alphabet) for _ in range(n)))
    add("random-ascii", ascii_rand)

    special = [
        "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|im_start|>user\nHi<|im_end|>\n",
        "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
        "<|im_start|>assistant\n",
        "<|endoftext|><|endoftext|>", "text<|endoftext|>more text", " <|im_start|> ",
        "<|im_start|", "<|im_start|>>", "<|IM_START|>", "<|im_start|><|im_end|>",
        "<repo_name>qinfer<file_sep>main.c", "<filename>a.py\n<gh_stars>10",
        "<jupyter_start><jupyter_code>print(1)<jupyter_output>1<empty_output>",
        "<issue_start>bug<issue_comment>fixed<issue_closed>", "<reponame>x",
        "\n<|im_end|>\n", "<|im_end|>\n<|im_start|>assistant\n", "a<|im_start|>b<|im_end|>c",
        "<jupyter_text>notes<jupyter_script>", "<<|im_start|>>",
    ]
    add("special", special, 1, 1)
    add("special-unparsed", special, 1, 0)
    add("no-special", ["Hello world", "", "<|im_start|>user"], 0, 0)
    add("no-special", ["<|im_start|>user"], 0, 1)

    for b, cat, _, _ in S:
        assert not aborts_llama_cpp(b), (cat, b)
    return S


# --------------------------------------------------------------------------
# llama.cpp access

class Llama:
    def __init__(self, L, model_path, n_ctx):
        import numpy as np
        self.L, self.np = L, np
        self.log = []

        @L.llama_log_callback
        def _log(level, text, user_data):
            self.log.append(text.decode("utf-8", "replace") if text else "")
        self._log_cb = _log  # keep a reference alive
        L.llama_log_set(_log, None)
        L.llama_backend_init()
        mp = L.llama_model_default_params()
        # No extra CPU buffer types (AMX / repacked weights): see EXTRA_BUFTS.
        mp.use_extra_bufts = False
        self.model = L.llama_model_load_from_file(model_path.encode(), mp)
        if not self.model:
            sys.exit("record.py: llama.cpp could not load " + model_path)
        self.vocab = L.llama_model_get_vocab(self.model)
        self.n_vocab = L.llama_vocab_n_tokens(self.vocab)
        cp = L.llama_context_default_params()  # llama.cpp's defaults, except:
        cp.n_ctx = n_ctx
        cp.n_threads = N_THREADS
        cp.n_threads_batch = N_THREADS
        cp.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_DISABLED  # see FLASH_ATTN
        self.cparams = cp
        self.ctx = L.llama_init_from_model(self.model, cp)
        if not self.ctx:
            sys.exit("record.py: llama.cpp could not create a context")

    def meta(self, key):
        buf = ctypes.create_string_buffer(1 << 16)
        n = self.L.llama_model_meta_val_str(self.model, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", "replace") if n >= 0 else None

    def chat_template(self):
        t = self.L.llama_model_chat_template(self.model, None)
        return t.decode("utf-8") if t else None

    def tokenize(self, b, add_special, parse_special):
        n_max = len(b) + 16
        buf = (self.L.llama_token * n_max)()
        n = self.L.llama_tokenize(self.vocab, b, len(b), buf, n_max, bool(add_special), bool(parse_special))
        if n < 0:
            raise RuntimeError("llama_tokenize needs %d slots" % -n)
        return list(buf[:n])

    def decode_last_logits(self, ids):
        """Decode ids as one batch; return the logits of its last position."""
        arr = (self.L.llama_token * len(ids))(*ids)
        batch = self.L.llama_batch_get_one(arr, len(ids))
        rc = self.L.llama_decode(self.ctx, batch)
        if rc != 0:
            raise RuntimeError("llama_decode returned %d" % rc)
        p = self.L.llama_get_logits_ith(self.ctx, -1)
        return self.np.ctypeslib.as_array(p, shape=(self.n_vocab,)).copy()

    def clear(self):
        self.L.llama_memory_clear(self.L.llama_get_memory(self.ctx), True)


def top_k(np, logits, k):
    idx = np.argpartition(-logits, k)[:k + 8]
    order = sorted(idx.tolist(), key=lambda i: (-float(logits[i]), i))
    return order[:k]


def fmt_logit(x):
    return "%.9g" % float(x)  # float32 round-trips exactly


# --------------------------------------------------------------------------
# Prompts for greedy decoding

def greedy_prompts(llm, corpus_text):
    import jinja2
    tmpl = llm.chat_template()
    env = jinja2.Environment(loader=jinja2.BaseLoader(), trim_blocks=True, lstrip_blocks=True)

    def chat(messages):
        if tmpl is None:
            # No template in the file (gemma3-270m): the conversation as
            # plain "Role: text" lines, ending with the assistant's turn.
            return "".join("%s: %s\n" % (m["role"].capitalize(), m["content"]) for m in messages) + "Assistant:"
        return env.from_string(tmpl).render(messages=messages, add_generation_prompt=True)

    P = [
        "The capital of France is",
        "Once upon a time, in a small village by the sea,",
        "The quick brown fox jumps over the lazy dog.",
        "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
        "#include <stdio.h>\n\nint main(void) {\n",
        "Here is a list of fruits:\n1. Apple\n2. Banana\n3.",
        "Q: What is the boiling point of water at sea level?\nA:",
        "Why is the sky blue?",
        "Translate to French: Good morning, how are you?",
        "La vie est belle, et le soleil brille sur",
        "Der schnelle braune Fuchs springt \u00fcber den faulen Hund, und dann",
        "\u6771\u4eac\u306f\u65e5\u672c\u306e\u9996\u90fd\u3067\u3001",
        "\u041f\u0440\u0438\u0432\u0435\u0442! \u041a\u0430\u043a \u0434\u0435\u043b\u0430? \u0421\u0435\u0433\u043e\u0434\u043d\u044f",
        "1, 2, 3, 4, 5, 6,",
        "{\"name\": \"Alice\", \"age\": 30, \"city\":",
        "<html>\n<head><title>My page</title></head>\n<body>\n",
        "SELECT name, email FROM users WHERE",
        "In mathematics, a prime number is",
        "To be, or not to be, that is the question:",
        "  leading spaces and\ttabs\n\nand blank lines\n",
        "The year 2024 had 366 days because",
        "Emoji test: \U0001F600\U0001F389\U0001F44D means",
        "A",
        chat([{"role": "user", "content": "What is the capital of France?"}]),
        chat([{"role": "user", "content": "Write a haiku about autumn."}]),
        chat([{"role": "system", "content": "You are a terse assistant."},
              {"role": "user", "content": "Explain recursion in one sentence."}]),
        chat([{"role": "user", "content": "Hi!"},
              {"role": "assistant", "content": "Hello! How can I help you today?"},
              {"role": "user", "content": "Tell me a fun fact about octopuses."}]),
    ]
    # One long prompt (~400 tokens): whole lines of the corpus, from a fixed entry.
    start = corpus_text.find("\nABSURDITY")
    start = start + 1 if start >= 0 else 0
    lines = corpus_text[start:].split("\n")
    long_text = ""
    for line in lines:
        cand = long_text + line + "\n"
        if len(llm.tokenize(u(cand), 1, 1)) > 400:
            break
        long_text = cand
    P.append(long_text)
    if GREEDY_SET == "small":
        P = [P[i] for i in SMALL_PROMPTS] + [corpus_passage(llm, corpus_text, "\nABSURDITY", SMALL_PASSAGE)]
    # Sliding-window models (gemma3: local layers see the last n_swa positions)
    # get three more passages, each longer than the window itself, so that the
    # local layers actually slide during the prompt (the longest also spans two
    # 512-token ubatches). The totals stay under 2 * n_swa, where llama.cpp's
    # SWA cache cells are still in position order.
    n_swa = llm.meta("%s.attention.sliding_window" % llm.meta("general.architecture"))
    if n_swa and int(n_swa) > 0:
        w = int(n_swa)
        for marker, n_max in (("\nBACKBITE", w + 48), ("\nCABBAGE", w + 96), ("\nDAWN", w + 288)):
            P.append(corpus_passage(llm, corpus_text, marker, n_max))
    return [u(p) for p in P]


def corpus_passage(llm, corpus_text, marker, n_max):
    """Whole lines of the corpus from the entry at marker, at most n_max tokens."""
    start = corpus_text.find(marker)
    if start < 0:
        sys.exit("record.py: corpus has no entry %r" % marker.strip())
    text = ""
    for line in corpus_text[start + 1:].split("\n"):
        cand = text + line + "\n"
        if len(llm.tokenize(u(cand), 1, 1)) > n_max:
            break
        text = cand
    return text


# --------------------------------------------------------------------------
# Writers

def write_lines(path, header, rows):
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="ascii", newline="\n") as f:
        for h in header:
            f.write("# " + h + "\n")
        for r in rows:
            f.write("\t".join(r) + "\n")
    os.replace(tmp, path)
    print("wrote %s (%d rows, %d bytes)" % (os.path.relpath(path, REPO), len(rows), os.path.getsize(path)))


def record_strings(strings):
    rows = [(b.hex(), cat, str(a), str(p)) for b, cat, a, p in strings]
    write_lines(os.path.join(HERE, "strings.tsv"), [
        "qinfer tokenizer test strings (model independent), generated by tests/golden/record.py (seed %d)" % STRINGS_SEED,
        "columns: hex(input bytes)  category  add_special(0/1)  parse_special(0/1); empty hex = empty string",
    ], rows)


def record_tokenize(llm, strings, out, base_header):
    rows = []
    for b, cat, a, p in strings:
        ids = llm.tokenize(b, a, p)
        rows.append((b.hex(), str(a), str(p), " ".join(map(str, ids))))
    # The vocabulary settings that decide what add_special does and whether a
    # space is put in front of the text (SentencePiece vocabularies).
    L = llm.L
    vocab = "vocabulary: tokenizer.ggml.model=%s pre=%s add_space_prefix=%s; llama.cpp: bos=%d eos=%d add_bos=%s add_eos=%s" % (
        llm.meta("tokenizer.ggml.model"), llm.meta("tokenizer.ggml.pre"), llm.meta("tokenizer.ggml.add_space_prefix"),
        L.llama_vocab_bos(llm.vocab), L.llama_vocab_eos(llm.vocab),
        L.llama_vocab_get_add_bos(llm.vocab), L.llama_vocab_get_add_eos(llm.vocab))
    write_lines(os.path.join(out, "tokenize.tsv"), base_header + [
        vocab,
        "llama_tokenize(vocab, text, len, ..., add_special, parse_special) for each line of tests/golden/strings.tsv",
        "columns: hex(input bytes)  add_special  parse_special  token ids (space separated; empty = no tokens)",
    ], rows)


def record_greedy(llm, prompts, out, base_header):
    np = llm.np
    g_rows, l_rows = [], []
    for pb in prompts:
        ids = llm.tokenize(pb, 1, 1)
        if not ids:
            continue
        llm.clear()
        logits = llm.decode_last_logits(ids)
        gen, steps = [], []
        first_top10 = top_k(np, logits, 10)
        l_rows.append((pb.hex(), " ".join("%d:%s" % (i, fmt_logit(logits[i])) for i in first_top10)))
        for step in range(N_GEN):
            t1, t2 = top_k(np, logits, 2)
            gen.append(t1)
            steps.append("%d:%s,%d:%s" % (t1, fmt_logit(logits[t1]), t2, fmt_logit(logits[t2])))
            if step + 1 < N_GEN:
                logits = llm.decode_last_logits([t1])
        g_rows.append((pb.hex(), " ".join(map(str, ids)), " ".join(map(str, gen)), " ".join(steps)))
    settings = ("n_ctx=%d, n_batch=%d, n_ubatch=%d, n_threads=%d, %s, llama.cpp default context otherwise "
                "(flash_attn=%s, KV cache K/V type f16/f16)" % (
                    N_CTX, llm.cparams.n_batch, llm.cparams.n_ubatch, N_THREADS, EXTRA_BUFTS, llm.fa_state))
    common = [
        "prompt tokenized with add_special=1 parse_special=1; prompt decoded as one batch (logits of its last "
        "position only), then one token per llama_decode call; " + settings,
        "greedy: next token = argmax of the raw logits (ties: lowest id), no sampler, no penalties; "
        "EOS/EOG does NOT stop generation: all %d tokens are generated" % N_GEN,
    ]
    if GREEDY_SET == "small":
        common.append("prompt set 'small' (record.py --greedy small --n-gen %d): prompts %s of the full set, then "
                      "the corpus passage from ABSURDITY cut to at most %d tokens" % (
                          N_GEN, ",".join(map(str, SMALL_PROMPTS)), SMALL_PASSAGE))
    write_lines(os.path.join(out, "greedy.tsv"), base_header + common + [
        "columns: hex(prompt)  prompt ids  %d generated ids  per step 'top1:logit1,top2:logit2' "
        "(space separated; step i's logits are those that chose generated token i)" % N_GEN,
    ], g_rows)
    write_lines(os.path.join(out, "logits.tsv"), base_header + common + [
        "columns: hex(prompt)  top-10 'id:logit' (space separated, best first) at the first generated position",
    ], l_rows)


PPL_LINE = re.compile(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)")
CHUNKS_LINE = re.compile(r"calculating perplexity over (\d+) chunks, n_ctx=(\d+), batch_size=(\d+), n_seq=(\d+)")
RUNNING = re.compile(r"\[(\d+)\]([0-9.]+|nan|inf),")


def record_ppl(llm, model_path, corpus_path, corpus_text, out, base_header):
    exe = os.path.join(LLAMA_BIN, "llama-perplexity")
    if not os.path.exists(exe):
        sys.exit("record.py: %s missing; run tests/golden/build_llama.sh" % exe)
    # llama-perplexity reads the file, drops one trailing '\n', tokenizes with
    # add_special=true, parse_special=false.
    text = corpus_text[:-1] if corpus_text.endswith("\n") else corpus_text
    n_tokens = len(llm.tokenize(u(text), 1, 0))
    rows, cmds, facts, batching = [], [], set(), []
    # Full logs stay out of the repository.
    log_dir = os.path.join(CACHE, "golden-logs", os.path.basename(out))
    os.makedirs(log_dir, exist_ok=True)
    for label, ctx, chunks in PPL_RUNS:
        cmd = [exe, "-m", model_path, "-f", corpus_path, "-c", str(ctx), "-t", str(N_THREADS), "--no-repack", "-fa", "off"]
        if chunks is not None:
            cmd += ["--chunks", str(chunks)]
        shown = " ".join(cmd).replace(os.path.dirname(model_path), "$QINFER_CACHE/models")
        shown = shown.replace(os.path.dirname(corpus_path), "$QINFER_CACHE/corpora")
        shown = shown.replace(exe, "$QINFER_CACHE/llama.cpp/build/bin/llama-perplexity")
        t0 = time.time()
        log_path = os.path.join(log_dir, "ppl-%d-%s.log" % (ctx, label))
        if REUSE_LOGS and os.path.exists(log_path):
            # a finished run's full log, kept from an earlier recording
            print("reusing:", log_path, "for", shown, flush=True)
            with open(log_path, errors="replace") as f:
                log = f.read()
        else:
            print("running:", shown, flush=True)
            res = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                 errors="replace")
            log = res.stdout
            with open(log_path, "w") as f:
                f.write(log)
            if res.returncode != 0:
                sys.exit("record.py: llama-perplexity failed (rc %d); log in %s" % (res.returncode, log_path))
        m, c = PPL_LINE.search(log), CHUNKS_LINE.search(log)
        if not m or not c:
            sys.exit("record.py: could not parse llama-perplexity output; log in %s" % log_path)
        n_chunk, n_ctx, n_batch, n_seq = (int(x) for x in c.groups())
        fact = "ctx %d: batch_size=%d n_seq=%d" % (n_ctx, n_batch, n_seq)
        if fact not in batching:
            batching.append(fact)
        running = " ".join("%s:%s" % g for g in RUNNING.findall(log))
        n_scored = n_chunk * (n_ctx - 1 - n_ctx // 2)
        rows.append((label, str(n_ctx), str(n_chunk), str(n_tokens), str(n_scored), m.group(1), m.group(2), running))
        cmds.append(shown)
        for line in log.splitlines():
            for key in ("flash_attn", "Flash Attention", "type_k", "K (f16)", "K (", "AMX", "REPACK",
                        "n_batch", "n_ubatch", "system_info", "CPU : "):
                if key in line:
                    facts.add(line.strip())
        print("  %s chunks: PPL %s +/- %s (%.0f s)" % (n_chunk, m.group(1), m.group(2), time.time() - t0), flush=True)
    write_lines(os.path.join(out, "ppl.tsv"), base_header + ["command: " + c for c in cmds] + [
        "; ".join(batching) + " as reported by llama-perplexity (default -b 2048, -ub 512)",
        "n_tokens: tokens of the corpus (one trailing newline dropped; add_special=1, parse_special=0), "
        "counted with llama_tokenize; n_scored = chunks * (ctx/2 - 1)",
        "columns: run  ctx  chunks  n_tokens  n_scored  ppl  plus_minus  running ppl after each chunk 'k:ppl'",
    ], rows)
    return sorted(facts)


# --------------------------------------------------------------------------

def print_info(model_path, llm):
    sys.path.insert(0, os.path.join(LLAMA_VENDOR, "gguf-py"))
    try:
        import gguf
    except ImportError as e:
        print("(gguf-py unavailable: %s)" % e)
        gguf = None
    for key in ("tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.add_bos_token",
                "tokenizer.ggml.add_eos_token", "tokenizer.ggml.add_space_prefix",
                "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.padding_token_id"):
        print("%-34s %s" % (key, llm.meta(key)))
    L = llm.L
    print("%-34s bos=%d eos=%d eot=%d pad=%d add_bos=%s add_eos=%s" % (
        "llama.cpp vocab", L.llama_vocab_bos(llm.vocab), L.llama_vocab_eos(llm.vocab),
        L.llama_vocab_eot(llm.vocab), L.llama_vocab_pad(llm.vocab),
        L.llama_vocab_get_add_bos(llm.vocab), L.llama_vocab_get_add_eos(llm.vocab)))
    print("n_vocab %d" % llm.n_vocab)
    print("chat template:", repr(llm.chat_template()))
    if gguf:
        r = gguf.GGUFReader(model_path)
        kinds = {}
        for t in r.tensors:
            parts = t.name.split(".")
            kind = ".".join(parts[2:]) if parts[0] == "blk" else t.name
            kinds.setdefault((kind, t.tensor_type.name, tuple(int(x) for x in t.shape)), 0)
            kinds[(kind, t.tensor_type.name, tuple(int(x) for x in t.shape))] += 1
        for (kind, ty, shape), n in sorted(kinds.items()):
            print("tensor %-20s %-5s ne=%-14s x%d" % (kind, ty, shape, n))


def main():
    global REUSE_LOGS, GREEDY_SET, N_GEN
    reexec_under_venv()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?", default="smollm2-135m")
    ap.add_argument("--corpus", default="devil", help="manifest name of the perplexity corpus")
    ap.add_argument("--out", help="output directory (default tests/golden/MODEL)")
    ap.add_argument("--only", default="tokenize,greedy,ppl", help="comma list of tokenize,greedy,ppl")
    ap.add_argument("--info", action="store_true", help="print tokenizer metadata and tensor types")
    ap.add_argument("--ppl-runs", help="comma list of CTX:CHUNKS (CHUNKS 'all' = whole corpus) for the ppl part; "
                    "default 512:all,512:2,512:4")
    ap.add_argument("--greedy", default="all", choices=("all", "small"),
                    help="greedy prompt set: all (28+) or small (7, for a model too slow for the whole set)")
    ap.add_argument("--n-gen", type=int, default=N_GEN, help="greedy tokens generated per prompt (default 64)")
    ap.add_argument("--reuse-logs", action="store_true",
                    help="take ppl figures from the full logs of earlier runs where they exist")
    args = ap.parse_args()
    parts = set(args.only.split(","))
    REUSE_LOGS = args.reuse_logs
    GREEDY_SET = args.greedy
    if not 1 <= args.n_gen <= 64:
        ap.error("--n-gen takes 1..64")
    N_GEN = args.n_gen
    if args.ppl_runs:
        PPL_RUNS[:] = []
        for item in args.ppl_runs.split(","):
            try:
                c, k = item.split(":")
                PPL_RUNS.append(("full" if k == "all" else k, int(c), None if k == "all" else int(k)))
            except ValueError:
                ap.error("--ppl-runs takes CTX:CHUNKS items, e.g. 512:4,2048:2")
    if parts - {"tokenize", "greedy", "ppl"}:
        ap.error("--only takes tokenize, greedy, ppl")

    manifest = read_manifest()
    if args.model not in manifest or manifest[args.model]["kind"] != "model":
        sys.exit("record.py: unknown model '%s'; models: %s" % (
            args.model, ", ".join(n for n, e in manifest.items() if e["kind"] == "model")))
    model_path = checked(manifest[args.model])
    corpus_path = checked(manifest[args.corpus])
    with open(corpus_path, "rb") as f:
        corpus_text = f.read().decode("utf-8")

    L = load_bindings()
    llm = Llama(L, model_path, N_CTX)
    log = "".join(llm.log)
    llm.fa_state = "disabled"
    if re.search(r"Flash Attention (was )?enabled|flash_attn\s*=\s*enabled", log):
        sys.exit("record.py: llama.cpp enabled flash attention although it was disabled")

    if args.info:
        print_info(model_path, llm)
        for line in log.splitlines():
            if any(k in line for k in ("Flash Attention", "flash_attn", "AMX", "REPACK", "buffer size", "llama_kv_cache")):
                print("log:", line)
        return

    out = args.out or os.path.join(HERE, args.model)
    os.makedirs(out, exist_ok=True)
    base_header = ["llama.cpp via llama-cpp-python %s (vendored llama.cpp commit %s), model %s sha256 %s" % (
        LLAMA_PY_VERSION, llama_commit(), os.path.basename(model_path), manifest[args.model]["sha256"])]

    strings = test_strings()
    if "tokenize" in parts:
        record_strings(strings)
        record_tokenize(llm, strings, out, base_header)
    if "greedy" in parts:
        record_greedy(llm, greedy_prompts(llm, corpus_text), out, base_header)
    if "ppl" in parts:
        for line in record_ppl(llm, model_path, corpus_path, corpus_text, out, base_header):
            print("llama-perplexity:", line)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""gen_quant_golden.py - golden data for tests/unit/test_quant.c.

Records what llama.cpp's ggml does with a few rows per block format, so the
C test can check qinfer's reference kernels against it byte for byte:

  * quantize cases: input floats, the bytes ggml's quantize_row_<type>_ref
    writes, and ggml's dequantisation of those bytes;
  * dequantize-only cases: random but valid block bytes and ggml's floats
    (reaches scale/bit patterns the quantizers rarely produce);
  * dot cases: a weight row, an activation row quantised to the paired type,
    ggml's CPU-backend vec_dot result (SIMD, so compared with a tolerance)
    and, for the quantised types, the result of ggml's generic (scalar)
    vec_dot, compiled here from llama.cpp's ggml-cpu/quants.c with the system
    C compiler (compared bit for bit; left out if the compile fails);
  * stress checksums: per type, STRESS_ROWS rows from a small PRNG that the
    C test reproduces exactly (StressRng / stress_row), covering scales from
    2^-12 to 2^12, grids full of ties, sparse rows, offsets and constant
    sub-blocks; the file keeps only checksums of ggml's bytes, dequantised
    floats and generic dot results, so coverage is wide and the file small;
  * checksums of ggml's fp16/bf16 conversions over large input sweeps.

Two sources of truth, chosen with --source:

  ggml   (default when found) the real C code: libggml-base.so / libggml-cpu.so
         from a llama.cpp build (--ggml-lib-dir), called through ctypes. Covers
         every type. gguf-py, if importable, is used as a cross-check and any
         disagreement is reported (and recorded in the file header).
  gguf   llama.cpp's numpy port in gguf-py (--gguf-py, put on sys.path). It
         quantizes only F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0; Q4_K, Q5_K
         and Q6_K get dequantize-only cases; Q8_1, Q8_K, dot cases, stress
         rows and checksums are left out, and test_quant reports those
         sections missing - the committed file is made with --source ggml.

Output is plain text, one item per line ('#' lines are comments):

  quant <type> <n> <label>     followed by  x <n floats>, q <hex>, y <n floats>
  dequant <type> <n> <label>   followed by  q <hex>, y <n floats>
  dot <type> <n>               followed by  w <hex>, a <hex>, s <float>[, g <float>]
  stress <type> <rows> <bytes sum> <floats sum> <dots sum or ->
  checksum <name> <count> <sum>

x inputs are printed as the shortest decimal that reads back as the same
float32; ggml's outputs (y, s, g) with %.9g. Both round-trip exactly through
strtof. Sums are hex; see Checksum.

usage: gen_quant_golden.py [--source ggml|gguf] [--ggml-lib-dir DIR]
                           [--llama-src DIR] [--gguf-py DIR] [--out PATH] [--seed N]
"""
import argparse
import ctypes
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
LLAMA = os.path.expanduser(
    "~/.cache/qinfer/llama.cpp/llama_cpp_python-0.3.36/vendor/llama.cpp")
DEFAULT_LIB_DIR = os.path.expanduser("~/.cache/qinfer/llama.cpp/build/bin")

# name: (ggml/GGUF type id, elements per block, bytes per block)
TYPES = {
    "f32": (0, 1, 4), "f16": (1, 1, 2), "bf16": (30, 1, 2),
    "q4_0": (2, 32, 18), "q4_1": (3, 32, 20), "q5_0": (6, 32, 22),
    "q5_1": (7, 32, 24), "q8_0": (8, 32, 34), "q8_1": (9, 32, 36),
    "q4_K": (12, 256, 144), "q5_K": (13, 256, 176), "q6_K": (14, 256, 210),
    "q8_K": (15, 256, 292),
}
WEIGHT_TYPES = ["f32", "f16", "bf16", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0",
                "q4_K", "q5_K", "q6_K"]
VEC_DOT_TYPE = {"f32": "f32", "f16": "f16", "bf16": "bf16", "q4_0": "q8_0",
                "q5_0": "q8_0", "q8_0": "q8_0", "q4_1": "q8_1", "q5_1": "q8_1",
                "q4_K": "q8_K", "q5_K": "q8_K", "q6_K": "q8_K"}
GGUF_QUANTIZES = {"f16", "bf16", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0"}
GGUF_DEQUANTIZES = GGUF_QUANTIZES | {"q4_K", "q5_K", "q6_K"}

F32P = ctypes.POINTER(ctypes.c_float)


def row_bytes(t, n):
    _, blck, size = TYPES[t]
    assert n % blck == 0
    return n // blck * size


# ---- ggml through ctypes ------------------------------------------------------

class Ggml:
    def __init__(self, lib_dir):
        self.base = ctypes.CDLL(os.path.join(lib_dir, "libggml-base.so"))
        self.cpu = None
        try:
            self.cpu = ctypes.CDLL(os.path.join(lib_dir, "libggml-cpu.so"))
            self.cpu.ggml_cpu_init()
            self.cpu.ggml_get_type_traits_cpu.restype = ctypes.c_void_p
            self.cpu.ggml_get_type_traits_cpu.argtypes = [ctypes.c_int]
        except OSError:
            self.cpu = None
        self.desc = os.path.realpath(os.path.join(lib_dir, "libggml-base.so"))

    def _fn(self, name):
        f = getattr(self.base, name)
        f.restype = None
        f.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
        return f

    def quantize(self, t, x):
        x = np.ascontiguousarray(x, dtype=np.float32)
        n = x.size
        # zeroed, so bytes ggml leaves unwritten (Q8_K bsums of a zero block)
        # read as zero, which is what qinfer writes
        out = ctypes.create_string_buffer(row_bytes(t, n))
        if t == "f32":
            return x.tobytes()
        name = {"f16": "ggml_fp32_to_fp16_row", "bf16": "ggml_fp32_to_bf16_row_ref"}.get(
            t, "quantize_row_%s_ref" % t)
        self._fn(name)(x.ctypes.data, out, n)
        return out.raw

    def dequantize(self, t, q, n):
        y = np.zeros(n, dtype=np.float32)
        if t == "f32":
            return np.frombuffer(q, dtype=np.float32).copy()
        if t == "q8_1":  # ggml has no Q8_1 dequantizer: q * d, float32
            return dequant_q8_1(q, n)
        name = {"f16": "ggml_fp16_to_fp32_row", "bf16": "ggml_bf16_to_fp32_row"}.get(
            t, "dequantize_row_%s" % t)
        buf = ctypes.create_string_buffer(q, len(q))
        self._fn(name)(buf, y.ctypes.data, n)
        return y

    def vec_dot(self, t, n, w, a):
        """ggml's CPU backend vec_dot (whatever SIMD the library was built
        with); None when libggml-cpu is not available."""
        if self.cpu is None:
            return None
        tid = TYPES[t][0]
        traits = self.cpu.ggml_get_type_traits_cpu(tid)
        # struct ggml_type_traits_cpu { from_float; vec_dot; vec_dot_type; nrows; }
        fn_ptr = ctypes.c_void_p.from_address(traits + ctypes.sizeof(ctypes.c_void_p)).value
        vdt = ctypes.c_int.from_address(traits + 2 * ctypes.sizeof(ctypes.c_void_p)).value
        assert vdt == TYPES[VEC_DOT_TYPE[t]][0], (t, vdt)
        proto = ctypes.CFUNCTYPE(None, ctypes.c_int, F32P, ctypes.c_size_t, ctypes.c_void_p,
                                 ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
        s = ctypes.c_float(0)
        wb = ctypes.create_string_buffer(w, len(w))
        ab = ctypes.create_string_buffer(a, len(a))
        proto(fn_ptr)(n, ctypes.byref(s), 0, wb, 0, ab, 0, 1)
        return s.value

    def conv_u16(self, name, x):
        """Run a float -> 16-bit row conversion over a float32 array."""
        x = np.ascontiguousarray(x, dtype=np.float32)
        out = np.zeros(x.size, dtype=np.uint16)
        self._fn(name)(x.ctypes.data, out.ctypes.data, x.size)
        return out

    def conv_f32(self, name, h):
        h = np.ascontiguousarray(h, dtype=np.uint16)
        out = np.zeros(h.size, dtype=np.float32)
        self._fn(name)(h.ctypes.data, out.ctypes.data, h.size)
        return out


GENERIC_DOT = {"q4_0": "q4_0_q8_0", "q4_1": "q4_1_q8_1", "q5_0": "q5_0_q8_0",
               "q5_1": "q5_1_q8_1", "q8_0": "q8_0_q8_0", "q4_K": "q4_K_q8_K",
               "q5_K": "q5_K_q8_K", "q6_K": "q6_K_q8_K"}


class GgmlGeneric:
    """ggml's portable vec_dot_*_generic functions. libggml-cpu does not
    export them, so quants.c is compiled into a scratch shared library
    (no -march flags: no FMA contraction, as a generic build)."""

    def __init__(self, lib_dir, src_root):
        cc = shutil.which(os.environ.get("CC", "cc"))
        if not cc:
            raise OSError("no C compiler")
        ggml = os.path.join(src_root, "ggml")
        self.tmp = tempfile.mkdtemp(prefix="qi_ggml_generic_")
        so = os.path.join(self.tmp, "libggml_generic.so")
        cmd = [cc, "-std=gnu11", "-O2", "-fPIC", "-shared", "-ffp-contract=off",
               "-I" + os.path.join(ggml, "src"), "-I" + os.path.join(ggml, "include"),
               "-I" + os.path.join(ggml, "src", "ggml-cpu"),
               os.path.join(ggml, "src", "ggml-cpu", "quants.c"), "-L" + lib_dir,
               "-lggml-base", "-lggml-cpu", "-Wl,-rpath," + lib_dir, "-o", so]
        subprocess.run(cmd, check=True, capture_output=True)
        self.lib = ctypes.CDLL(so)
        self.desc = os.path.join(ggml, "src", "ggml-cpu", "quants.c")

    def vec_dot(self, t, n, w, a):
        if t not in GENERIC_DOT:
            return None
        f = getattr(self.lib, "ggml_vec_dot_%s_generic" % GENERIC_DOT[t])
        f.restype = None
        f.argtypes = [ctypes.c_int, F32P, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t,
                      ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        s = ctypes.c_float(0)
        f(n, ctypes.byref(s), 0, ctypes.create_string_buffer(w, len(w)), 0,
          ctypes.create_string_buffer(a, len(a)), 0, 1)
        return s.value

    def close(self):
        shutil.rmtree(self.tmp, ignore_errors=True)


def dequant_q8_1(q, n):
    blocks = np.frombuffer(q, dtype=np.uint8).reshape(-1, 36)
    d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)
    qs = blocks[:, 4:].copy().view(np.int8).astype(np.float32)
    return (qs * d).reshape(n).astype(np.float32)


def dequant_q8_K(q, n):
    blocks = np.frombuffer(q, dtype=np.uint8).reshape(-1, 292)
    d = blocks[:, 0:4].copy().view(np.float32)
    qs = blocks[:, 4:260].copy().view(np.int8).astype(np.float32)
    return (d * qs).reshape(n).astype(np.float32)


# ---- gguf-py ----------------------------------------------------------------

class GgufPy:
    def __init__(self, path):
        sys.path.insert(0, path)
        import gguf  # noqa: E402
        from gguf import quants  # noqa: E402
        self.gguf, self.quants = gguf, quants
        self.desc = os.path.realpath(path)

    def _qt(self, t):
        return self.gguf.GGMLQuantizationType(TYPES[t][0])

    def quantize(self, t, x):
        x = np.ascontiguousarray(x, dtype=np.float32).reshape(1, -1)
        if t == "f32":
            return x.tobytes()
        if t == "f16":
            with np.errstate(over="ignore"):  # overflow to inf is the point
                return x.astype(np.float16).tobytes()
        return self.quants.quantize(x, self._qt(t)).tobytes()

    def dequantize(self, t, q, n):
        if t == "f32":
            return np.frombuffer(q, dtype=np.float32).copy()
        if t == "f16":
            return np.frombuffer(q, dtype=np.float16).astype(np.float32)
        if t == "q8_1":
            return dequant_q8_1(q, n)
        if t == "q8_K":
            return dequant_q8_K(q, n)
        arr = np.frombuffer(q, dtype=np.uint8).reshape(1, -1)
        return self.quants.dequantize(arr, self._qt(t)).reshape(n).astype(np.float32)


# ---- test inputs --------------------------------------------------------------

def tie_block(blck):
    """Values that land exactly on .5 after scaling: amax 127 gives Q8_0 a
    scale of exactly 1, so the roundf-vs-round-even choice shows."""
    v = np.zeros(blck, dtype=np.float32)
    v[0] = 127.0
    halves = np.array([0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 3.5, -3.5, 100.5, -100.5], np.float32)
    v[1:1 + len(halves)] = halves
    v[1 + len(halves):] = np.arange(blck - 1 - len(halves), dtype=np.float32) - 10.5
    return v


def short(v):
    """Round inputs to 4 significant digits so they print short (the file
    stays small); they are still arbitrary float32 values to the kernels."""
    v = np.asarray(v, dtype=np.float32)
    return np.array([float("%.4g" % f) for f in v], dtype=np.float32)


def quant_rows(t, rng):
    """(label, floats) rows for a quantize case of type t."""
    _, blck, _ = TYPES[t]
    if blck == 1:
        blck = 32
    g = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    u = lambda lo, hi, k: rng.uniform(lo, hi, k).astype(np.float32)  # noqa: E731
    r = g(2 * blck) * np.float32(3.7)
    r[5] *= 20
    rows = [("uniform", u(-1, 1, blck)), ("gauss_outlier", r)]
    if blck == 32:
        rows.append(("pos_neg", np.concatenate([u(0.5, 2.5, blck), u(-3, -1, blck)])))
        rows.append(("zero_ties", np.concatenate([np.zeros(blck, np.float32), tie_block(blck)])))
        rows.append(("tiny", g(blck) * np.float32(3e-4)))
    else:
        # one super-block whose 32-element sub-blocks differ in kind ...
        parts = [np.zeros(32, np.float32), np.full(32, -0.75, np.float32),
                 np.full(32, 0.625, np.float32), u(1, 2, 32), g(32) * np.float32(1e-3),
                 g(32) * np.float32(50), g(32) * np.float32(3e-5), u(-1, 0, 32)]
        rows.append(("mixed_subblocks", np.concatenate(parts)))
        # ... and one of positive, negative, zero and tie-heavy quarters
        rows.append(("pos_neg_zero_ties", np.concatenate(
            [u(0.5, 2.5, 64), u(-3, -1, 64), np.zeros(64, np.float32), tie_block(64)])))
    if t in ("f32", "f16", "bf16"):
        rows.append(("specials", special_floats()))
    return [(label, short(x) if label != "specials" else x) for label, x in rows]


def special_floats():
    """fp16/bf16 edge values: rounding boundaries, subnormals, overflow."""
    vals = [0.0, -0.0, 1.0, -1.0, 65504.0, 65519.99, 65520.0, 70000.0, -1e10,
            6.1035156e-05, 6.0975552e-05, 5.9604645e-08, 2.9802322e-08,
            2.9802326e-08, 8.940697e-08, 1.0009766, 1.00048828125, 1.00146484375,
            1e-40, -1e-45, 3.4028235e38, 1.00390625, 1.01171875, 1.0 / 3.0,
            float("inf"), float("-inf"), 2049.0, 2051.0, -4097.0, 0.1]
    v = np.array(vals, dtype=np.float32)
    pad = (-len(v)) % 32
    return np.concatenate([v, np.linspace(-2, 2, pad, dtype=np.float32)])


def random_blocks(t, nblocks, rng):
    """Random block bytes whose scale fields are finite, moderate values."""
    _, _, size = TYPES[t]
    raw = bytearray(rng.integers(0, 256, nblocks * size, dtype=np.uint8).tobytes())

    def put_f16(off, lo=-12, hi=2):
        v = np.float16(rng.uniform(0.5, 1.0) * 2.0 ** rng.integers(lo, hi))
        raw[off:off + 2] = v.tobytes()

    for b in range(nblocks):
        o = b * size
        if t in ("q4_0", "q5_0", "q8_0"):
            put_f16(o)
        elif t in ("q4_1", "q5_1", "q8_1", "q4_K", "q5_K"):
            put_f16(o)
            put_f16(o + 2)
        elif t == "q6_K":
            put_f16(o + 208)
        elif t == "q8_K":
            raw[o:o + 4] = np.float32(rng.uniform(1e-3, 1e-1)).tobytes()
    return bytes(raw)


# ---- stress rows (mirrored exactly in test_quant.c) ------------------------------

M64 = (1 << 64) - 1
STRESS_ROWS = 2000


class StressRng:
    """xorshift64* - the same generator as stress_rand() in test_quant.c."""

    def __init__(self, seed):
        self.s = seed & M64 or 0x9E3779B97F4A7C15

    def next(self):
        x = self.s
        x ^= x >> 12
        x ^= (x << 25) & M64
        x ^= x >> 27
        self.s = x
        return (x * 0x2545F4914F6CDD1D) & M64

    def unit(self):
        """uniform float32 in [-1, 1): 24 random bits, every step exact"""
        return np.float32((self.next() >> 40) / float(1 << 24)) * np.float32(2) - np.float32(1)

    def units(self, n):
        return np.array([self.unit() for _ in range(n)], dtype=np.float32)


def stress_seed(t):
    return (0x5157 ^ (TYPES[t][0] * 0x9E3779B97F4A7C15)) & M64


def stress_row(rng, r, blck):
    """Row r of a type's stress stream; kind r % 8 picks the shape. Only
    exactly-rounded float32 operations, in the C test's order."""
    nblocks = 1 + r % (2 if blck == 256 else 3)
    n = nblocks * blck
    kind = r % 8
    f = np.float32
    if kind == 0:
        return rng.units(n)
    if kind == 1:
        k = int(rng.next() % 25) - 12
        return rng.units(n) * f(2.0 ** k)
    if kind == 2:
        v = rng.units(n)
        return v * v * v * f(8)
    if kind == 3:
        return np.floor(rng.units(n) * f(16)) * f(0.25)
    if kind == 4:
        return rng.units(n) + f(3)
    if kind == 5:
        out = np.zeros(n, np.float32)
        for i in range(n):
            keep = (rng.next() & 3) == 0
            v = rng.unit()
            out[i] = v if keep else f(0)
        return out
    if kind == 6:
        x = rng.units(n) * f(0.01)
        x[5::37] *= f(100)
        return x
    out = np.zeros(n, np.float32)
    for g in range(n // 32):
        c = rng.unit()
        if g % 2 == 0:
            out[32 * g:32 * g + 32] = c
        else:
            out[32 * g:32 * g + 32] = c + rng.units(32) * f(0.001)
    return out


def stress_case(gg, generic, t):
    _, blck, _ = TYPES[t]
    blck = max(blck, 32)
    rng = StressRng(stress_seed(t))
    cq, cy, cd = Checksum(), Checksum(), Checksum()
    has_dot = generic is not None and t in GENERIC_DOT
    for r in range(STRESS_ROWS):
        x = stress_row(rng, r, blck)
        q = gg.quantize(t, x)
        cq.add(np.frombuffer(q, dtype=np.uint8))
        cy.add(gg.dequantize(t, q, x.size).view(np.uint32))
        if has_dot:
            a = gg.quantize(VEC_DOT_TYPE[t], rng.units(x.size) * np.float32(2))
            cd.add(np.array([np.float32(generic.vec_dot(t, x.size, q, a))]).view(np.uint32))
    return "stress %s %d %016x %016x %s" % (t, STRESS_ROWS, cq.total, cy.total,
                                            "%016x" % cd.total if has_dot else "-")


# ---- output -----------------------------------------------------------------

def fmt_floats(v):
    return " ".join("%.9g" % float(f) for f in np.asarray(v, dtype=np.float32))


def write_case(out, kind, t, n, label, x, q, y):
    """A quant case (x given) or a dequant case (x None)."""
    out.append("%s %s %d %s" % (kind, t, n, label))
    if x is not None:
        # shortest digits that round-trip as float32 (strtof reads them back)
        out.append("x " + " ".join(str(np.float32(f)) for f in x))
    out.append("q " + q.hex())
    out.append("y " + fmt_floats(y))


def mix64(z):
    """splitmix64's finaliser, vectorised over uint64 (wraps mod 2^64)."""
    z = z ^ (z >> np.uint64(30))
    z = z * np.uint64(0xbf58476d1ce4e5b9)
    z = z ^ (z >> np.uint64(27))
    z = z * np.uint64(0x94d049bb133111eb)
    return z ^ (z >> np.uint64(31))


class Checksum:
    """sum over i of mix64((i << 32) | v[i]) mod 2^64, i counting every value
    added so far: order-sensitive, and errors do not cancel by accident."""

    def __init__(self):
        self.total, self.count = 0, 0

    def add(self, values):
        v = np.asarray(values).astype(np.uint64)
        i = np.arange(v.size, dtype=np.uint64) + np.uint64(self.count)
        with np.errstate(over="ignore"):
            h = mix64((i << np.uint64(32)) | v)
        self.total = (self.total + int(np.sum(h, dtype=np.uint64))) & M64
        self.count += v.size


def checksum(values):
    c = Checksum()
    c.add(values)
    return c.total


def sweep_f32(count):
    """float32 inputs for the conversion checksums: every bit pattern with a
    stride coprime to 2^32, plus every pattern near the fp16 thresholds."""
    i = np.arange(count, dtype=np.uint64)
    bits = ((i * np.uint64(2654435761)) & np.uint64(0xffffffff)).astype(np.uint32)
    near = []
    for base in (0x477ff000, 0x38800000, 0x33000000, 0x387fe000, 0x7f800000, 0x3f801000):
        near.append(np.arange(base - 4096, base + 4096, dtype=np.int64))
    near = np.concatenate(near).astype(np.uint32)
    allb = np.concatenate([bits, near, near | np.uint32(0x80000000)])
    return allb.view(np.float32)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--source", choices=["ggml", "gguf"], default=None)
    ap.add_argument("--ggml-lib-dir", default=DEFAULT_LIB_DIR)
    ap.add_argument("--gguf-py", default=os.path.join(LLAMA, "gguf-py"))
    ap.add_argument("--llama-src", default=LLAMA, help="llama.cpp source tree (for quants.c)")
    ap.add_argument("--out", default=os.path.join(HERE, "quant_golden.txt"))
    ap.add_argument("--seed", type=int, default=20240601)
    args = ap.parse_args()

    source = args.source
    if source is None:
        source = "ggml" if os.path.exists(os.path.join(args.ggml_lib_dir, "libggml-base.so")) else "gguf"
    gg = Ggml(args.ggml_lib_dir) if source == "ggml" else None
    py = None
    try:
        py = GgufPy(args.gguf_py)
    except Exception as e:  # gguf-py optional when ggml is the source
        if source == "gguf":
            raise
        print("gguf-py unavailable for the cross-check: %s" % e, file=sys.stderr)
    truth = gg if gg else py

    rng = np.random.default_rng(args.seed)
    body, mismatches = [], []

    def cross_check(kind, t, n, label, x, q, y, qx=None):
        if py is None or gg is None:
            return
        if qx is not None and t in GGUF_QUANTIZES and py.quantize(t, x) != q:
            mismatches.append("quantize %s %s" % (t, label))
        if t in GGUF_DEQUANTIZES:
            yp = py.dequantize(t, q, n)
            if not np.array_equal(yp.view(np.uint32), y.view(np.uint32)):
                mismatches.append("dequantize %s %s" % (t, label))

    for t in TYPES:
        can_quant = gg is not None or t in GGUF_QUANTIZES or t == "f32"
        if can_quant:
            for label, x in quant_rows(t, rng):
                n = x.size
                q = truth.quantize(t, x)
                y = truth.dequantize(t, q, n)
                write_case(body, "quant", t, n, label, x, q, y)
                cross_check("quant", t, n, label, x, q, y, qx=True)
        if t in ("f32", "f16", "bf16"):
            continue
        if gg is None and t not in GGUF_DEQUANTIZES and t not in ("q8_1", "q8_K"):
            continue
        _, blck, _ = TYPES[t]
        nblocks = 2 if blck == 32 else 1
        q = random_blocks(t, nblocks, rng)
        n = nblocks * blck
        y = truth.dequantize(t, q, n)
        if not np.all(np.isfinite(y)):
            raise SystemExit("random %s block decoded to non-finite values" % t)
        write_case(body, "dequant", t, n, "random_bytes", None, q, y)
        cross_check("dequant", t, n, "random_bytes", None, q, y)

    generic = None
    if gg is not None:
        try:
            generic = GgmlGeneric(args.ggml_lib_dir, args.llama_src)
        except (OSError, subprocess.CalledProcessError) as e:
            print("generic vec_dot unavailable, dot cases get no g lines: %s" % e, file=sys.stderr)

    if gg is not None and gg.cpu is not None:
        for t in WEIGHT_TYPES:
            _, blck, _ = TYPES[t]
            for nblocks in (1, 3):
                n = nblocks * max(blck, 32)
                w = gg.quantize(t, rng.standard_normal(n).astype(np.float32))
                a = gg.quantize(VEC_DOT_TYPE[t], rng.standard_normal(n).astype(np.float32) * 2)
                body.append("dot %s %d" % (t, n))
                body.append("w " + w.hex())
                body.append("a " + a.hex())
                body.append("s %.9g" % gg.vec_dot(t, n, w, a))
                g = generic.vec_dot(t, n, w, a) if generic else None
                if g is not None:
                    body.append("g %.9g" % g)
    if gg is not None:
        for t in TYPES:
            body.append(stress_case(gg, generic, t))
    if generic:
        generic.close()

    if gg is not None:
        all_h = np.arange(65536, dtype=np.uint16)
        f = gg.conv_f32("ggml_fp16_to_fp32_row", all_h)
        body.append("checksum fp16_to_f32 %d %016x" % (65536, checksum(f.view(np.uint32))))
        xs = sweep_f32(1 << 20)
        h = gg.conv_u16("ggml_fp32_to_fp16_row", xs)
        body.append("checksum f32_to_fp16 %d %016x" % (xs.size, checksum(h)))
        b = gg.conv_u16("ggml_fp32_to_bf16_row_ref", xs)
        body.append("checksum f32_to_bf16 %d %016x" % (xs.size, checksum(b)))

    head = ["# qinfer quant goldens v1 - generated by tests/golden/quant/gen_quant_golden.py",
            "# source %s: %s" % (source, truth.desc),
            "# seed %d" % args.seed]
    if py is not None and gg is not None:
        head.append("# gguf-py cross-check (%s): %s" % (
            py.desc, "agrees on every case" if not mismatches else
            "DISAGREES on " + ", ".join(mismatches)))
    with open(args.out, "w") as fh:
        fh.write("\n".join(head + body) + "\n")
    print("wrote %s (%d bytes)%s" % (args.out, os.path.getsize(args.out),
          "" if not mismatches else "; gguf-py mismatches: " + ", ".join(mismatches)))


if __name__ == "__main__":
    main()

/* test_matmul_emu.cpp - k_matmul.cu's kernels run on the host emulation
 * (run.sh), cuBLAS replaced by inc/cublas_v2.h's host GEMM, for every
 * weight format the CUDA device takes:
 * - the matrix-vector kernels (T = 1..8: the 1, 2, 4 and 8-token
 *   instances, with T below the instance's count) against a
 *   double-precision product of the dequantised weights and x, within
 *   1e-5 of the largest |result| (ref_mm: or of a typical one); 1 row,
 *   rows not a multiple of the warps per block, one block per row, many,
 *   padded row strides;
 * - the GEMM path (T > 8, or x not 16-byte aligned): fp16 tiles from
 *   scratch sizes giving one tile, several, one row each, and too small
 *   for any (the matrix-vector kernels in chunks of 8 tokens instead),
 *   or no scratch, against the same product of fp16-rounded weights and
 *   x; the tiling must not change a bit; F32 weights through SGEMM with
 *   their row stride; float widths not a multiple of 8;
 * - get_rows bit for bit against qi_dequantize_row_ref, with and without
 *   16-byte aligned output, and the refusals (misaligned quantised rows,
 *   no scratch for a path that needs it).
 * Every call's output is surrounded by guard values it must not touch.
 * Exit 0 when every check passes. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>
#include "cuda_runtime.h"
#include "backend/cuda/k_internal.h"
extern "C" {
#include "qinfer/quant.h"
#include "qinfer/types.h"
}
float emu_h2f(uint16_t h) { return qi_fp16_to_f32(h); }
uint16_t emu_f2h(float f) { return qi_f32_to_fp16(f); }
extern long emu_gemm_calls;
static long nfail, nchk;
#define CHK(c, ...) do { nchk++; if (!(c)) { if (nfail++ < 30) { printf("FAIL %d: ", __LINE__); printf(__VA_ARGS__); printf("\n"); } } } while (0)
static uint64_t rs = 88172645463325252ull;
static double rnd() { rs ^= rs << 13; rs ^= rs >> 7; rs ^= rs << 17; return (double)(rs >> 11) * 0x1p-53; }
static float rf(float a, float b) { return (float)(a + (b - a) * rnd()); }
static float h16(float f) { return qi_fp16_to_f32(qi_f32_to_fp16(f)); }
static const float GUARD = 12345.678f;

struct Fmt { uint32_t type; const char *name; int qk; };
static const Fmt FMTS[] = {
    {QI_TYPE_F32, "f32", 8},     {QI_TYPE_F16, "f16", 8},     {QI_TYPE_BF16, "bf16", 8},
    {QI_TYPE_Q8_0, "q8_0", 32},  {QI_TYPE_Q4_0, "q4_0", 32},  {QI_TYPE_Q4_1, "q4_1", 32},
    {QI_TYPE_Q5_0, "q5_0", 32},  {QI_TYPE_Q5_1, "q5_1", 32},  {QI_TYPE_Q4_K, "q4_k", 256},
    {QI_TYPE_Q5_K, "q5_k", 256}, {QI_TYPE_Q6_K, "q6_k", 256},
};

/* 256-byte aligned host memory standing in for cudaMalloc's */
struct Buf {
    void *p = nullptr;
    explicit Buf(size_t n) { p = aligned_alloc(256, (n + 255) / 256 * 256 + 256); memset(p, 0, (n + 255) / 256 * 256 + 256); }
    ~Buf() { free(p); }
    Buf(const Buf &) = delete;
    Buf &operator=(const Buf &) = delete;
    uint8_t *b() const { return (uint8_t *)p; }
};

/* n_rows rows of n_cols random values quantised to `type`, each row at
 * stride row_bytes (>= the format's bytes: the rest is padding), and the
 * same rows dequantised by the reference */
struct W {
    uint32_t type; int64_t rows, cols; uint64_t rb;
    Buf buf; std::vector<float> deq;
    W(uint32_t t, int64_t r, int64_t c, uint64_t pad) : type(t), rows(r), cols(c), rb(qi_row_bytes(t, c) + pad),
        buf(rb * r), deq(r * c) {
        std::vector<float> v(c);
        for (int64_t i = 0; i < r; i++) {
            const float s = rf(0.2f, 3.0f), o = rf(-0.5f, 0.5f); /* rows of different scales and offsets */
            for (auto &e : v) e = o + s * rf(-1, 1);
            qi_quantize_row_ref(t, v.data(), buf.b() + i * rb, c);
            memset(buf.b() + i * rb + qi_row_bytes(t, c), 0xa5, pad); /* padding the kernels must skip */
            qi_dequantize_row_ref(t, buf.b() + i * rb, deq.data() + i * c, c);
        }
    }
};

/* x[T][cols] in [-1, 1) at `off` floats past a 256-byte boundary */
struct X {
    Buf buf; float *x;
    X(int T, int64_t cols, int off) : buf(4 * ((size_t)T * cols + off)), x((float *)buf.b() + off) {
        for (int64_t i = 0; i < T * cols; i++) x[i] = rf(-1, 1);
    }
};

/* y = x . W^T in double; fp16: weights and x rounded to fp16 first. The
 * scale errors are measured against: the largest |y|, or if larger the
 * size of a dot product of these rows and x without cancellation,
 * sum |w x| / sqrt(cols) (a call with one output may cancel to near 0). */
struct Ref { std::vector<double> y; double scale; };
static Ref ref_mm(const W &w, const float *x, int T, bool fp16) {
    Ref r{std::vector<double>((size_t)T * w.rows), 0};
    for (int t = 0; t < T; t++)
        for (int64_t i = 0; i < w.rows; i++) {
            double s = 0, m = 0;
            for (int64_t j = 0; j < w.cols; j++) {
                const float a = w.deq[i * w.cols + j], b = x[t * w.cols + j];
                const double p = fp16 ? (double)h16(a) * h16(b) : (double)a * b;
                s += p, m += fabs(p);
            }
            r.y[t * w.rows + i] = s;
            r.scale = fmax(r.scale, fmax(fabs(s), m / sqrt((double)w.cols)));
        }
    return r;
}

/* One qi_cuk_matmul call into a guarded y; returns its rc, the output in
 * *out, and how many GEMM calls it made in *gemms */
static int run_mm(const W &w, const float *x, int T, void *scratch, size_t scratch_bytes, std::vector<float> *out,
                  long *gemms, const char **what) {
    const int64_t n = (int64_t)T * w.rows, G = 8;
    Buf yb(4 * (n + 2 * G));
    float *y = (float *)yb.b() + G; /* 32 bytes in: 16-byte aligned */
    for (int64_t i = 0; i < n + 2 * G; i++) ((float *)yb.b())[i] = i >= G && i < n + G ? NAN : GUARD;
    qi_cuk_ctx c = {NULL, (void *)&c, scratch, scratch_bytes};
    const long g0 = emu_gemm_calls;
    *what = NULL;
    const int rc = qi_cuk_matmul(&c, w.type, w.buf.p, w.rows, w.cols, w.rb, x, T, y, what);
    *gemms = emu_gemm_calls - g0;
    bool guards = true;
    for (int64_t i = 0; i < G; i++) guards = guards && ((float *)yb.b())[i] == GUARD && y[n + i] == GUARD;
    CHK(guards, "matmul type %u T=%d: wrote outside y", w.type, T);
    out->assign(y, y + n);
    return rc;
}

/* max |y - ref| / ref's scale (NaN: infinite) */
static double rel_err(const std::vector<float> &y, const Ref &r) {
    double e = 0;
    for (size_t i = 0; i < r.y.size(); i++) {
        const double d = fabs((double)y[i] - r.y[i]);
        e = isnan(d) ? INFINITY : fmax(e, d);
    }
    return e / (r.scale > 0 ? r.scale : 1);
}

static size_t x16b(int T, int64_t cols) { return ((size_t)T * cols * 2 + 255) / 256 * 256; }

int main() {
    const char *what;
    std::vector<float> y;
    long gemms;
    for (const Fmt &f : FMTS) {
        const bool is_f32 = f.type == QI_TYPE_F32, is_float = f.qk == 8;
        /* one block a row; many (lanes with one and two groups); padded rows */
        const int64_t wide = f.qk == 8 ? 8 * 45 : f.qk == 32 ? 32 * 13 : 256 * 3;
        const uint64_t pad = f.type == QI_TYPE_Q4_K || f.type == QI_TYPE_Q5_K ? 8 : is_float ? 16 : 2;
        double w_mv = 0, w_g = 0;
        /* ---- the matrix-vector kernels */
        struct { int64_t rows, cols; uint64_t pad; std::vector<int> Ts; } mv[] = {
            {1, f.qk, 0, {1, 2, 3, 4, 5, 8}}, {6, wide, 0, {1, 2, 4, 7}}, {9, f.qk, pad, {1, 3, 8}}};
        for (auto &s : mv) {
            W w(f.type, s.rows, s.cols, s.pad);
            for (int T : s.Ts) {
                X x(T, s.cols, 0);
                const int rc = run_mm(w, x.x, T, NULL, 0, &y, &gemms, &what);
                const double e = rel_err(y, ref_mm(w, x.x, T, false));
                w_mv = fmax(w_mv, e);
                CHK(rc == 0 && gemms == 0 && e < 1e-5, "%s matvec rows=%ld cols=%ld T=%d: rc %d (%s), %ld gemms, err %.3g",
                    f.name, (long)s.rows, (long)s.cols, T, rc, what ? what : "", gemms, e);
            }
        }
        /* ---- T > 8 */
        {
            const int T = 11;
            const int64_t rows = 7, cols = wide;
            W w(f.type, rows, cols, pad);
            X x(T, cols, 0);
            const Ref r16 = ref_mm(w, x.x, T, true), r32 = ref_mm(w, x.x, T, false);
            const size_t xb = x16b(T, cols), row16 = 2 * cols;
            Buf scr(xb + 64 * row16);
            if (is_f32) { /* SGEMM from W, whatever the scratch */
                for (int k = 0; k < 2; k++) {
                    const int rc = run_mm(w, x.x, T, k ? scr.p : NULL, k ? xb + 64 * row16 : 0, &y, &gemms, &what);
                    const double e = rel_err(y, r32);
                    w_g = fmax(w_g, e);
                    CHK(rc == 0 && gemms == 1 && e < 1e-5, "f32 sgemm (scratch %d): rc %d, %ld gemms, err %.3g", k, rc, gemms, e);
                }
            } else {
                std::vector<float> y1;
                /* scratch for all rows, 3 rows a tile, 1 row a tile */
                struct { size_t bytes; long tiles; } tl[] = {{xb + 64 * row16, 1}, {xb + 3 * row16 + row16 / 2, 3}, {xb + row16, 7}};
                for (auto &s : tl) {
                    const int rc = run_mm(w, x.x, T, scr.p, s.bytes, &y, &gemms, &what);
                    const double e = rel_err(y, r16);
                    w_g = fmax(w_g, e);
                    CHK(rc == 0 && gemms == s.tiles && e < 1e-5, "%s gemm (%ld tiles): rc %d (%s), %ld gemms, err %.3g",
                        f.name, s.tiles, rc, what ? what : "", gemms, e);
                    if (s.tiles == 1) y1 = y;
                    else CHK(memcmp(y.data(), y1.data(), 4 * y.size()) == 0, "%s: %ld tiles changed the result", f.name, s.tiles);
                }
                /* too little scratch for x and a row, and none: matvec in chunks of 8 tokens */
                for (size_t bytes : {xb + row16 - 1, (size_t)0}) {
                    const int rc = run_mm(w, x.x, T, bytes ? scr.p : NULL, bytes, &y, &gemms, &what);
                    const double e = rel_err(y, r32);
                    w_mv = fmax(w_mv, e);
                    CHK(rc == 0 && gemms == 0 && e < 1e-5, "%s matvec fallback (scratch %zu): rc %d, %ld gemms, err %.3g",
                        f.name, bytes, rc, gemms, e);
                }
                /* x not 16-byte aligned: the GEMM path even for T <= 8 */
                X xo(3, cols, 1);
                const int rc = run_mm(w, xo.x, 3, scr.p, xb + 64 * row16, &y, &gemms, &what);
                const double e = rel_err(y, ref_mm(w, xo.x, 3, true));
                w_g = fmax(w_g, e);
                CHK(rc == 0 && gemms == 1 && e < 1e-5, "%s misaligned x: rc %d, %ld gemms, err %.3g", f.name, rc, gemms, e);
            }
        }
        /* ---- float widths not a multiple of 8 (per-element kernels, or SGEMM) */
        if (is_float) {
            for (int64_t cols : {5, 21}) {
                const int T = 2;
                const int64_t rows = 5;
                W w(f.type, rows, cols, 4 * (cols & 1) + 16); /* an odd width's row stride stays 4-byte aligned */
                X x(T, cols, 0);
                const size_t xb = x16b(T, cols), row16 = 2 * cols;
                Buf scr(xb + 64 * row16);
                const int rc = run_mm(w, x.x, T, scr.p, xb + 2 * row16, &y, &gemms, &what);
                const double e = rel_err(y, ref_mm(w, x.x, T, !is_f32));
                w_g = fmax(w_g, e);
                const long tiles = is_f32 ? 1 : 3;
                CHK(rc == 0 && gemms == tiles && e < 1e-5, "%s cols=%ld: rc %d (%s), %ld gemms, err %.3g", f.name,
                    (long)cols, rc, what ? what : "", gemms, e);
                if (!is_f32) { /* no group kernel to fall back on */
                    const int rc2 = run_mm(w, x.x, T, NULL, 0, &y, &gemms, &what);
                    CHK(rc2 != 0 && what && gemms == 0, "%s cols=%ld without scratch: rc %d", f.name, (long)cols, rc2);
                }
            }
        } else { /* quantised rows not aligned for the format's loads: refused */
            W w(f.type, 3, f.qk, 1);
            X x(9, f.qk, 0);
            const size_t xb = x16b(9, f.qk);
            Buf scr(xb + 64 * 2 * f.qk);
            const int rc = run_mm(w, x.x, 9, scr.p, xb + 64 * 2 * f.qk, &y, &gemms, &what);
            CHK(rc != 0 && what && gemms == 0, "%s misaligned rows: rc %d, %ld gemms", f.name, rc, gemms);
        }
        /* ---- get_rows */
        long gr_bits = 0, gr_n = 0;
        for (int64_t cols : {(int64_t)f.qk, wide, (int64_t)(is_float ? 21 : 0)}) {
            if (!cols) continue;
            const int64_t rows = 5;
            W w(f.type, rows, cols, cols % 8 ? 4 : pad);
            const std::vector<int32_t> ids = {2, 0, 4, 2};
            const int T = (int)ids.size();
            Buf idb(4 * T);
            memcpy(idb.p, ids.data(), 4 * T);
            for (int off : {0, 1}) { /* 16-byte aligned output, and not */
                const int64_t n = T * cols, G = 4;
                Buf ob(4 * (n + 2 * G + off));
                float *o = (float *)ob.b() + G + off, *o0 = (float *)ob.b();
                for (int64_t i = 0; i < n + 2 * G + off; i++) o0[i] = GUARD;
                qi_cuk_ctx c = {NULL, NULL, NULL, 0};
                what = NULL;
                const int rc = qi_cuk_get_rows(&c, f.type, w.buf.p, cols, w.rb, (const int32_t *)idb.p, T, o, &what);
                std::vector<float> r(cols);
                long bad = 0;
                for (int t = 0; t < T; t++) {
                    qi_dequantize_row_ref(f.type, w.buf.b() + ids[t] * w.rb, r.data(), cols);
                    bad += memcmp(o + t * cols, r.data(), 4 * cols) != 0;
                }
                bool guards = true;
                for (int64_t i = 0; i < G + off; i++) guards = guards && o0[i] == GUARD;
                for (int64_t i = 0; i < G; i++) guards = guards && o[n + i] == GUARD;
                gr_bits += bad, gr_n += T;
                CHK(rc == 0 && bad == 0 && guards, "%s get_rows cols=%ld off=%d: rc %d (%s), %ld rows differ, guards %d",
                    f.name, (long)cols, off, rc, what ? what : "", bad, guards);
            }
        }
        if (!is_float) {
            Buf wb(qi_row_bytes(f.type, f.qk) * 3 + 8), ob(4 * f.qk);
            const int32_t id = 0;
            qi_cuk_ctx c = {NULL, NULL, NULL, 0};
            what = NULL;
            const int rc = qi_cuk_get_rows(&c, f.type, wb.b() + 1, f.qk, qi_row_bytes(f.type, f.qk), &id, 1, (float *)ob.p, &what);
            CHK(rc != 0 && what, "%s get_rows misaligned rows: rc %d", f.name, rc);
        }
        printf("%-5s matvec worst %.2g, gemm worst %.2g (fp16 reference), get_rows %ld of %ld rows differ\n", f.name,
               w_mv, w_g, gr_bits, gr_n);
    }
    CHK(qi_cuk_type_ok(QI_TYPE_Q8_K) == 0 && qi_cuk_type_ok(QI_TYPE_Q6_K) == 1, "type_ok");
    printf("emulated matmul: %ld checks, %ld failed\n", nchk, nfail);
    return nfail != 0;
}

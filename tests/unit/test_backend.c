/* test_backend.c - Check suite for the CPU backend (engine/backend/cpu/backend_cpu.c)
 * across thread counts.
 *
 * test_kernels.c holds every SIMD kernel to its scalar reference on one
 * thread; this suite holds the backend's ops, which split that work over a
 * thread pool, to the same references. For n_threads = 1, 2, 3 and 4 every
 * op of the interface runs on seeded random data and is compared bit for
 * bit (memcmp of each float, so -0 against +0 and NaN payloads count) with
 * a result computed here, single-threaded, straight from the references:
 *   - matmul: activations quantised per row with the x86 run-time quantiser
 *     (qi_k_quantize_q8_ref) or the format's reference, then one reference
 *     dot per (token, row) - qi_k_dot_<type>_ref for the types with an
 *     x86-order kernel (the tiled order for q4_K/q6_K from QI_K_WIDE_MIN
 *     tokens), quant.c's generic qi_vec_dot_ref for the rest (q5_K, F32,
 *     F16, BF16) - over 1, odd and thread-indivisible row counts, 1..64
 *     tokens (across the 8-token order switch and the backend's 32-token
 *     blocks), one block to 2048 columns;
 *   - rmsnorm (also in place), rope (NORMAL and NEOX, partial and full
 *     rotation, pair counts that leave an unfused remainder), swiglu and
 *     geglu (row lengths 1, 15, 16, 17, 1000; fewer rows than threads, where
 *     one row is split in 16-element units);
 *   - paged attention, one token and a batch (the two F16 orders), grouped
 *     and plain heads, head dims on and off the 16-lane grid, sliding
 *     window, over block tables with slots out of position order (as a
 *     wrapped ring or an evicting policy leaves them),
 *     each call alone and several at once (attention_paged_n: decode rows,
 *     prompt chunks and an empty call together, with statistics on every,
 *     no or some calls), outputs and the added statistics;
 *   - get_rows for every weight type.
 * The expected side never goes through the backend, so a result that depends
 * on how work is split fails against it; each thread count is also compared
 * with one thread's result, which tells a split-dependent error from a
 * specification error. Outputs carry guard floats on both sides that must
 * survive. Planted faults show the comparison can fail: a flipped last bit,
 * -0 against +0, and the dot orders the backend must not use (ggml's generic
 * order for q4_0, the non-tiled q4_K order at 8 tokens) all mismatch.
 * The kernel table is whatever QI_KERNELS / QI_FORCE_REF select, so running
 * the suite under each setting covers every variant; QI_TEST_QUICK=1 (the
 * sanitizer build) drops the 2048-column and 64-token matmuls.
 */
#include <check.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "kernels.h"
#include "qinfer/quant.h"
#include "testutil.h"

#define MAX_THREADS 4

/* ---- comparison and buffers --------------------------------------------------- */

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* First index whose bits differ, or -1. */
static long first_mismatch(const float *want, const float *got, long n) {
    for (long i = 0; i < n; i++)
        if (memcmp(&want[i], &got[i], sizeof(float))) return i;
    return -1;
}

/* Fails the test at the first differing float, as [row][col] of rows of
 * row_len, with both values and their bits. */
static void expect_same(const float *want, const float *got, long n, long row_len, const char *fmt, ...) {
    const long d = first_mismatch(want, got, n);
    if (d < 0) return;
    char what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    ck_abort_msg("%s: first mismatch at [%ld][%ld]: want %.9g (%08x), got %.9g (%08x)", what, d / row_len,
                 d % row_len, want[d], f32_bits(want[d]), got[d], f32_bits(got[d]));
}

/* A float buffer with GUARD floats of a NaN pattern no op writes on both
 * sides. */
#define GUARD 8
#define GUARD_BITS 0x7fa5a5a5u

typedef struct {
    float *mem;
    float *p; /* [n] */
    long n;
} gbuf;

static float *gbuf_init(gbuf *g, long n) {
    g->mem = malloc(sizeof(float) * (size_t)(n + 2 * GUARD));
    ck_assert_ptr_nonnull(g->mem);
    const uint32_t bits = GUARD_BITS;
    for (long i = 0; i < n + 2 * GUARD; i++) memcpy(&g->mem[i], &bits, 4);
    g->p = g->mem + GUARD;
    g->n = n;
    return g->p;
}

static void gbuf_check(const gbuf *g, const char *what, int n_threads) {
    for (long i = 0; i < GUARD; i++) {
        ck_assert_msg(f32_bits(g->mem[i]) == GUARD_BITS, "%s, %d threads: guard before [0] overwritten", what,
                      n_threads);
        ck_assert_msg(f32_bits(g->p[g->n + i]) == GUARD_BITS, "%s, %d threads: guard after [%ld] overwritten",
                      what, n_threads, g->n - 1);
    }
}

static void gbuf_fini(gbuf *g) { free(g->mem); }

/* ---- data ----------------------------------------------------------------------- */

static float randn(uint64_t *s) {
    float u1 = (qi_test_randf(s) + 1.0f) * 0.5f, u2 = qi_test_randf(s);
    if (u1 < 1e-7f) u1 = 1e-7f;
    return sqrtf(-2.0f * logf(u1)) * cosf(3.14159265f * u2);
}

/* Gaussian; kind 1 adds a few huge outliers (real activations reach 2e4),
 * kind 2 is wide, kind 3 zeroes elements 32..63 (an all-zero block). */
static void fill_row(uint64_t *s, float *x, long n, int kind) {
    for (long i = 0; i < n; i++) x[i] = randn(s) * (kind == 2 ? 30.0f : 1.0f);
    if (kind == 1)
        for (int k = 0; k < 3; k++) x[qi_test_rand(s) % (uint64_t)n] = 2.2e4f * qi_test_randf(s);
    if (kind == 3)
        for (long i = 32; i < 64 && i < n; i++) x[i] = 0.0f;
}

/* ---- backends ------------------------------------------------------------------- */

static void backends_create(qi_backend *b[MAX_THREADS]) {
    for (int n = 1; n <= MAX_THREADS; n++) {
        qi_err err = {0};
        ck_assert_msg(qi_backend_cpu_create(n, 0, &b[n - 1], &err) == QI_OK, "%s", err.msg);
        ck_assert_int_eq(b[n - 1]->iface->version, QI_BACKEND_VERSION);
    }
}

/* max_rows and D size the RoPE angle tables (0: none kept). */
static void backends_reserve_rows(qi_backend *b[MAX_THREADS], size_t scratch_bytes, int max_rows, int max_pos, int D) {
    for (int n = 1; n <= MAX_THREADS; n++) {
        qi_err err = {0};
        /* no KV heads: these backends run the exact attention only */
        ck_assert_msg(b[n - 1]->iface->reserve(b[n - 1], scratch_bytes, max_rows, max_pos, 0, D, &err) == QI_OK,
                      "%s", err.msg);
    }
}

static void backends_reserve(qi_backend *b[MAX_THREADS], size_t scratch_bytes, int max_pos) {
    backends_reserve_rows(b, scratch_bytes, 0, max_pos, 0);
}

static void backends_free(qi_backend *b[MAX_THREADS]) {
    for (int n = 1; n <= MAX_THREADS; n++) qi_backend_free(b[n - 1]);
}

/* ---- matmul --------------------------------------------------------------------- */

/* Every weight type qi_weight can hold: the seven with an x86-order kernel,
 * then those the backend computes in ggml's generic order. */
static const uint32_t k_mm_types[] = {QI_TYPE_Q4_0, QI_TYPE_Q4_1, QI_TYPE_Q5_0, QI_TYPE_Q5_1,
                                      QI_TYPE_Q8_0, QI_TYPE_Q4_K, QI_TYPE_Q6_K, QI_TYPE_Q5_K,
                                      QI_TYPE_F32,  QI_TYPE_F16,  QI_TYPE_BF16};
#define N_MM_TYPES (int)(sizeof k_mm_types / sizeof k_mm_types[0])

/* Activation row as llama.cpp's x86 CPU backend quantises it at run time:
 * the 127/amax, ties-to-even quantiser for Q8_0/Q8_1, the format's reference
 * for the others (Q8_K, or a plain conversion to the float types). */
static void ref_quantize_act(uint32_t type, const float *x, void *dst, int64_t n) {
    if (type == QI_TYPE_Q8_0 || type == QI_TYPE_Q8_1) qi_k_quantize_q8_ref(x, dst, n, type == QI_TYPE_Q8_1);
    else qi_quantize_row_ref(type, x, dst, n);
}

/* One weight row . one activation row in the order llama.cpp's x86 build
 * uses for a matmul of `wide` (>= QI_K_WIDE_MIN) tokens or fewer. */
static float ref_dot(uint32_t type, int wide, int64_t n, const void *w, const void *a) {
    switch (type) {
    case QI_TYPE_Q4_0: return qi_k_dot_q4_0_ref(n, w, a);
    case QI_TYPE_Q4_1: return qi_k_dot_q4_1_ref(n, w, a);
    case QI_TYPE_Q5_0: return qi_k_dot_q5_0_ref(n, w, a);
    case QI_TYPE_Q5_1: return qi_k_dot_q5_1_ref(n, w, a);
    case QI_TYPE_Q8_0: return qi_k_dot_q8_0_ref(n, w, a);
    case QI_TYPE_Q4_K: return wide ? qi_k_dot_q4_K_tiled_ref(n, w, a) : qi_k_dot_q4_K_ref(n, w, a);
    case QI_TYPE_Q6_K: return wide ? qi_k_dot_q6_K_tiled_ref(n, w, a) : qi_k_dot_q6_K_ref(n, w, a);
    default: return qi_vec_dot_ref(type, n, w, a);
    }
}

typedef float (*dot_fn)(uint32_t type, int wide, int64_t n, const void *w, const void *a);

/* y[T][n_rows] by `dot`, one (token, row) pair at a time. */
static void ref_matmul(dot_fn dot, const qi_weight *w, const float *x, int T, float *y) {
    const uint32_t at = qi_vec_dot_type(w->type);
    const size_t ab = qi_row_bytes(at, w->n_cols);
    char *a = malloc(ab * (size_t)T);
    for (int t = 0; t < T; t++) ref_quantize_act(at, x + (long)t * w->n_cols, a + (size_t)t * ab, w->n_cols);
    for (int t = 0; t < T; t++)
        for (int64_t r = 0; r < w->n_rows; r++)
            y[(long)t * w->n_rows + r] = dot(w->type, T >= QI_K_WIDE_MIN, w->n_cols,
                                             (const char *)w->data + r * w->row_bytes, a + (size_t)t * ab);
    free(a);
}

/* n_rows rows of n_cols random weights quantised to `type` (caller frees
 * data). */
static qi_weight make_weight(uint64_t *s, uint32_t type, int64_t n_cols, int64_t n_rows) {
    qi_weight w = {.type = type, .n_cols = n_cols, .n_rows = n_rows, .row_bytes = qi_row_bytes(type, n_cols)};
    ck_assert_uint_gt(w.row_bytes, 0);
    char *data = malloc(w.row_bytes * (size_t)n_rows);
    float *x = malloc(sizeof(float) * (size_t)n_cols);
    for (int64_t r = 0; r < n_rows; r++) {
        fill_row(s, x, n_cols, (int)(r % 3));
        qi_quantize_row_ref(type, x, data + r * w.row_bytes, n_cols);
    }
    free(x);
    w.data = data;
    return w;
}

/* Runs the matmul on every backend against `want`, and against one
 * thread's output. */
static void check_matmul(qi_backend *b[MAX_THREADS], const qi_weight *w, const float *x, int T,
                         const float *want) {
    const long n = (long)T * w->n_rows;
    float *one = malloc(sizeof(float) * (size_t)n);
    char what[128];
    snprintf(what, sizeof what, "matmul %s %lld cols x %lld rows, T=%d", qi_type_get(w->type)->name,
             (long long)w->n_cols, (long long)w->n_rows, T);
    for (int nt = 1; nt <= MAX_THREADS; nt++) {
        gbuf g;
        float *y = gbuf_init(&g, n);
        b[nt - 1]->iface->matmul(b[nt - 1], w, x, T, y);
        gbuf_check(&g, what, nt);
        if (nt == 1) memcpy(one, y, sizeof(float) * (size_t)n);
        else expect_same(one, y, n, w->n_rows, "%s: %d threads against 1", what, nt);
        expect_same(want, y, n, w->n_rows, "%s, %d threads", what, nt);
        gbuf_fini(&g);
    }
    free(one);
}

START_TEST(test_matmul) {
    const uint32_t type = k_mm_types[_i];
    const int blck = (int)qi_type_get(type)->blck;
    const int quick = qi_test_quick();
    /* one block, several, many (with 13 and 50 rows, a few token counts) */
    int64_t cols[3];
    if (blck == 1) {
        cols[0] = 17;
        cols[1] = 160;
    } else {
        cols[0] = blck;
        cols[1] = blck * (blck == 32 ? 5 : 3);
    }
    cols[2] = 2048;
    static const int64_t rows[] = {1, 5, 13, 50};
    static const int tokens[] = {1, 2, 7, 8, 33, 64};
    const int n_tokens = quick ? 5 : 6;
    uint64_t rng = 0x5eed0000u + type;
    qi_backend *b[MAX_THREADS];
    backends_create(b);
    const size_t max_ab = qi_row_bytes(qi_vec_dot_type(type), 2048);
    backends_reserve(b, max_ab * 64, 1);
    float *x = malloc(sizeof(float) * 2048 * 64), *want = malloc(sizeof(float) * 64 * 50);
    for (int ci = 0; ci < (quick ? 2 : 3); ci++)
        for (size_t ri = 0; ri < sizeof rows / sizeof rows[0]; ri++) {
            const int64_t nc = cols[ci], nr = rows[ri];
            if (ci == 2 && nr < 13) continue;
            qi_weight w = make_weight(&rng, type, nc, nr);
            for (int ti = 0; ti < n_tokens; ti++) {
                const int T = tokens[ti];
                if (ci == 2 && T != 1 && T != 7 && T != 8 && T != 33) continue;
                for (int t = 0; t < T; t++) fill_row(&rng, x + (long)t * nc, nc, (t + (int)ri) % 4);
                ref_matmul(ref_dot, &w, x, T, want);
                check_matmul(b, &w, x, T, want);
            }
            free((void *)w.data);
        }
    free(x);
    free(want);
    backends_free(b);
}
END_TEST

/* ---- element-wise ops ----------------------------------------------------------- */

static const int k_row_lens[] = {1, 15, 16, 17, 1000};
#define N_ROW_LENS (int)(sizeof k_row_lens / sizeof k_row_lens[0])

START_TEST(test_rmsnorm) {
    uint64_t rng = 101;
    qi_backend *b[MAX_THREADS];
    backends_create(b);
    /* one row; fewer than the 8 rows summed side by side; 8; 8 and a rest */
    static const int Ts[] = {1, 3, 8, 19};
    for (int li = 0; li < N_ROW_LENS; li++)
        for (int ti = 0; ti < 4; ti++) {
            const int n = k_row_lens[li], T = Ts[ti];
            const long len = (long)T * n;
            float *x = malloc(sizeof(float) * (size_t)len), *w = malloc(sizeof(float) * (size_t)n);
            float *want = malloc(sizeof(float) * (size_t)len);
            for (int t = 0; t < T; t++) fill_row(&rng, x + (long)t * n, n, t % 3);
            fill_row(&rng, w, n, 0);
            const float eps = 1e-6f;
            /* the mean square in double, one float scale, two float products */
            for (int t = 0; t < T; t++) {
                const float *xr = x + (long)t * n;
                double sum = 0.0;
                for (int i = 0; i < n; i++) sum += (double)(xr[i] * xr[i]);
                const float scale = 1.0f / sqrtf((float)(sum / n) + eps);
                for (int i = 0; i < n; i++) want[(long)t * n + i] = (xr[i] * scale) * w[i];
            }
            char what[64];
            snprintf(what, sizeof what, "rmsnorm n=%d T=%d", n, T);
            for (int nt = 1; nt <= MAX_THREADS; nt++)
                for (int in_place = 0; in_place < 2; in_place++) {
                    gbuf gy;
                    float *y = gbuf_init(&gy, len);
                    if (in_place) {
                        memcpy(y, x, sizeof(float) * (size_t)len);
                        b[nt - 1]->iface->rmsnorm(b[nt - 1], y, w, T, n, eps, y);
                    } else {
                        b[nt - 1]->iface->rmsnorm(b[nt - 1], x, w, T, n, eps, y);
                    }
                    gbuf_check(&gy, what, nt);
                    expect_same(want, y, len, n, "%s%s, %d threads", what, in_place ? " in place" : "", nt);
                    gbuf_fini(&gy);
                }
            free(x);
            free(w);
            free(want);
        }
    backends_free(b);
}
END_TEST

/* ggml's rotation as GCC compiled it: angles advance by repeated float
 * multiplication from the row's position; each pair is rotated with fused
 * multiply-adds, except the last n_pairs % 4 pairs of NORMAL mode (outside
 * its vector loop). */
static void ref_rope(float *x, int T, int n_heads, int D, int n_rot, const int32_t *pos, float base,
                     float freq_scale, int mode) {
    const float theta_scale = powf(base, -2.0f / (float)n_rot);
    const int n_pairs = n_rot / 2;
    for (int t = 0; t < T; t++)
        for (int h = 0; h < n_heads; h++) {
            float *v = x + ((long)t * n_heads + h) * D;
            float theta = (float)pos[t];
            for (int i = 0; i < n_pairs; i++, theta *= theta_scale) {
                const float c = cosf(theta * freq_scale), s = sinf(theta * freq_scale);
                float *x0 = mode == QI_ROPE_NEOX ? &v[i] : &v[2 * i];
                float *x1 = mode == QI_ROPE_NEOX ? &v[i + n_pairs] : &v[2 * i + 1];
                const float a = *x0, bb = *x1;
                if (mode == QI_ROPE_NEOX || i < n_pairs / 4 * 4) {
                    *x0 = fmaf(a, c, -(bb * s));
                    *x1 = fmaf(a, s, bb * c);
                } else {
                    *x0 = a * c - bb * s;
                    *x1 = a * s + bb * c;
                }
            }
        }
}

typedef struct {
    int D, n_rot, T, Hq, Hk, mode; /* Hk = 0: no k */
    const int32_t *pos;
    float base, freq_scale;
} rope_case;

static void check_rope(qi_backend *b[MAX_THREADS], uint64_t *rng, const rope_case *c) {
    const long lq = (long)c->T * c->Hq * c->D, lk = (long)c->T * c->Hk * c->D;
    float *x = malloc(sizeof(float) * (size_t)(lq + lk)), *want = malloc(sizeof(float) * (size_t)(lq + lk));
    fill_row(rng, x, lq + lk, 0);
    memcpy(want, x, sizeof(float) * (size_t)(lq + lk));
    ref_rope(want, c->T, c->Hq, c->D, c->n_rot, c->pos, c->base, c->freq_scale, c->mode);
    ref_rope(want + lq, c->T, c->Hk, c->D, c->n_rot, c->pos, c->base, c->freq_scale, c->mode);
    char what[160];
    snprintf(what, sizeof what, "rope %s D=%d n_rot=%d T=%d Hq=%d Hk=%d pos[0]=%d base=%g freq_scale=%g",
             c->mode == QI_ROPE_NEOX ? "NEOX" : "NORMAL", c->D, c->n_rot, c->T, c->Hq, c->Hk, c->pos[0], c->base,
             c->freq_scale);
    for (int nt = 1; nt <= MAX_THREADS; nt++) {
        gbuf gq, gk;
        float *yq = gbuf_init(&gq, lq), *yk = gbuf_init(&gk, lk > 0 ? lk : 1);
        memcpy(yq, x, sizeof(float) * (size_t)lq);
        memcpy(yk, x + lq, sizeof(float) * (size_t)lk);
        b[nt - 1]->iface->rope(b[nt - 1], yq, c->Hq, c->Hk ? yk : NULL, c->Hk, c->T, c->D, c->n_rot, c->pos,
                               c->base, c->freq_scale, c->mode);
        gbuf_check(&gq, what, nt);
        gbuf_check(&gk, what, nt);
        expect_same(want, yq, lq, c->D, "%s (q), %d threads", what, nt);
        if (lk > 0) expect_same(want + lq, yk, lk, c->D, "%s (k), %d threads", what, nt);
        gbuf_fini(&gq);
        gbuf_fini(&gk);
    }
    free(x);
    free(want);
}

/* Rows go up to 64; the angle tables are reserved for 32 rows of 64 pairs,
 * so calls of 40 or 64 rows, or of 128-value heads, take the per-call path,
 * and those of 1 or 3 rows are cached: the calls alternate bases,
 * positions and scales so that a table kept under the wrong key would show. */
START_TEST(test_rope) {
    uint64_t rng = 202;
    qi_backend *b[MAX_THREADS];
    backends_create(b);
    backends_reserve_rows(b, 0, 32, 1, 128);
    /* (D, n_rot): one pair; full rotation; half; 10 pairs (an unfused
     * remainder of 2 in NORMAL mode) at a head dim off the 16-lane grid */
    static const int shapes[][2] = {{2, 2}, {16, 16}, {64, 64}, {64, 32}, {80, 20}, {128, 128}, {256, 256}};
    static const float bases[][2] = {{10000.0f, 1.0f}, {1e6f, 0.25f}};
    static const int Ts[] = {1, 3, 40, 64};
    int32_t from0[64], from4097[64], scattered[64];
    for (int t = 0; t < 64; t++) {
        from0[t] = t;
        from4097[t] = 4097 + t;
        scattered[t] = (t * 7919) % 5000 + (t & 1 ? 100000 : 0); /* out of order, some far */
    }
    const int32_t *const pos_sets[] = {from0, from4097, scattered};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (int i = 0; i < 96; i++) {
            const int big = i & 8; /* q and k with several heads, else q alone */
            const rope_case c = {.D = shapes[si][0], .n_rot = shapes[si][1], .mode = i & 1, .T = Ts[(i >> 1) & 3],
                                 .Hq = big ? 4 : 1, .Hk = big ? 2 : 0, .pos = pos_sets[(i >> 4) % 3],
                                 .base = bases[(i >> 4) / 3][0], .freq_scale = bases[(i >> 4) / 3][1]};
            check_rope(b, &rng, &c);
            /* the same call again (a table hit), then with the other base */
            check_rope(b, &rng, &c);
            rope_case o = c;
            o.base = c.base == bases[0][0] ? bases[1][0] : bases[0][0];
            check_rope(b, &rng, &o);
            o.freq_scale = c.freq_scale;
            check_rope(b, &rng, &o);
        }
    backends_free(b);
}
END_TEST

typedef void (*glu_ref_fn)(int64_t n, float *g, const float *u);

/* swiglu (_i = 0) or geglu (_i = 1): each row through the reference on one
 * thread, against the backend's row or 16-element split. */
START_TEST(test_glu) {
    const int geglu = _i;
    const glu_ref_fn ref = geglu ? qi_k_geglu_ref : qi_k_swiglu_ref;
    uint64_t rng = 303 + (uint64_t)_i;
    qi_backend *b[MAX_THREADS];
    backends_create(b);
    static const int Ts[] = {1, 2, 3};
    for (int li = 0; li < N_ROW_LENS; li++)
        for (int ti = 0; ti < 3; ti++) {
            const int n = k_row_lens[li], T = Ts[ti];
            const long len = (long)T * n;
            float *g = malloc(sizeof(float) * (size_t)len), *u = malloc(sizeof(float) * (size_t)len);
            float *want = malloc(sizeof(float) * (size_t)len);
            for (long i = 0; i < len; i++) {
                /* ordinary values, exp(-x) overflowing, and underflowing */
                const int kind = (int)(i % 4);
                g[i] = kind == 0 ? randn(&rng) * 4.0f : kind == 1 ? qi_test_randf(&rng) * 250.0f : randn(&rng) * 30.0f;
                u[i] = randn(&rng);
            }
            memcpy(want, g, sizeof(float) * (size_t)len);
            for (int t = 0; t < T; t++) ref(n, want + (long)t * n, u + (long)t * n);
            char what[64];
            snprintf(what, sizeof what, "%s n=%d T=%d", geglu ? "geglu" : "swiglu", n, T);
            float *one = malloc(sizeof(float) * (size_t)len);
            for (int nt = 1; nt <= MAX_THREADS; nt++) {
                gbuf gg;
                float *y = gbuf_init(&gg, len);
                memcpy(y, g, sizeof(float) * (size_t)len);
                if (geglu) b[nt - 1]->iface->geglu(b[nt - 1], y, u, T, n);
                else b[nt - 1]->iface->swiglu(b[nt - 1], y, u, T, n);
                gbuf_check(&gg, what, nt);
                if (nt == 1) memcpy(one, y, sizeof(float) * (size_t)len);
                else expect_same(one, y, len, n, "%s: %d threads against 1", what, nt);
                expect_same(want, y, len, n, "%s, %d threads", what, nt);
                gbuf_fini(&gg);
            }
            free(one);
            free(g);
            free(u);
            free(want);
        }
    backends_free(b);
}
END_TEST

/* ---- attention ------------------------------------------------------------------ */

/* ---- paged attention, one call and several at once ------------------------------- */

/* 4-row blocks, so short rows cross many block boundaries */
#define PG_SHIFT 2
#define PG_CALLS 6
#define PG_MAX_HKV 4

/* One call of qi_attn_paged_args over its own paged cache: KV head hk holds
 * n_slots[hk] of the positions 0..q_pos[T-1] (every query position, some
 * of the older ones left out as a policy would), shuffled, so slot order is
 * not position order. */
typedef struct {
    qi_attn_paged_args a;
    int n_slots[PG_MAX_HKV];
    int32_t *q_pos, *pos[PG_MAX_HKV];
    const int32_t *cpos[PG_MAX_HKV];
    uint16_t **kb[PG_MAX_HKV], **vb[PG_MAX_HKV];
    const uint16_t *const *ckb[PG_MAX_HKV], *const *cvb[PG_MAX_HKV];
    float *q;
    float *stats0; /* [H][stride] the statistics before the call (not zero: they are added to) */
    float *mix, *vm; /* with the mean-value term: [T][H] shares, [Hkv][D] means */
    const float *vmp[PG_MAX_HKV];
    /* with extra rows (fetched tokens): per KV head their count, positions
     * and rows, each row its own allocation */
    int x_n[PG_MAX_HKV];
    int32_t *x_pos[PG_MAX_HKV];
    const int32_t *cx_pos[PG_MAX_HKV];
    uint16_t **xk[PG_MAX_HKV], **xv[PG_MAX_HKV];
    const uint16_t *const *cxk[PG_MAX_HKV], *const *cxv[PG_MAX_HKV];
} pg_call;

/* Extra rows on call c: 0..39 a KV head, scattered in memory, at
 * positions before the first query (some inside a window's reach, some
 * not) or, for a prompt's later queries, after it. */
static void pg_call_extra(pg_call *c, uint64_t *rng) {
    const qi_attn_paged_args *a = &c->a;
    for (int hk = 0; hk < a->Hkv; hk++) {
        const int nx = (int)(qi_test_rand(rng) % 40); /* past 16: whole gathered runs */
        c->x_n[hk] = nx;
        c->x_pos[hk] = malloc(sizeof(int32_t) * (size_t)(nx + 1));
        c->xk[hk] = malloc(sizeof(uint16_t *) * (size_t)(nx + 1));
        c->xv[hk] = malloc(sizeof(uint16_t *) * (size_t)(nx + 1));
        for (int j = 0; j < nx; j++) {
            c->x_pos[hk][j] = a->T > 0 ? a->q_pos[0] - 1 - (int32_t)(qi_test_rand(rng) % 30) +
                                             (int32_t)(qi_test_rand(rng) % 4 == 0 ? a->T + 1 : 0)
                                       : 0;
            c->xk[hk][j] = malloc(sizeof(uint16_t) * (size_t)a->D);
            c->xv[hk][j] = malloc(sizeof(uint16_t) * (size_t)a->D);
            for (int d = 0; d < a->D; d++) {
                c->xk[hk][j][d] = qi_f32_to_fp16(randn(rng) * 2.0f);
                c->xv[hk][j][d] = qi_f32_to_fp16(randn(rng));
            }
        }
        c->cx_pos[hk] = c->x_pos[hk];
        c->cxk[hk] = (const uint16_t *const *)c->xk[hk];
        c->cxv[hk] = (const uint16_t *const *)c->xv[hk];
    }
    c->a.x_n = c->x_n;
    c->a.x_pos = c->cx_pos;
    c->a.x_k = c->cxk;
    c->a.x_v = c->cxv;
}

/* The mean-value term on call c: shares in [0, 1.25) (1 and more: none),
 * random means. */
static void pg_call_mix(pg_call *c, uint64_t *rng) {
    const qi_attn_paged_args *a = &c->a;
    c->mix = malloc(sizeof(float) * (size_t)(a->T * a->H + 1));
    c->vm = malloc(sizeof(float) * (size_t)(a->Hkv * a->D));
    for (int i = 0; i < a->T * a->H; i++) c->mix[i] = (float)(qi_test_rand(rng) % 10) / 8.0f;
    for (int i = 0; i < a->Hkv * a->D; i++) c->vm[i] = randn(rng);
    for (int hk = 0; hk < a->Hkv; hk++) c->vmp[hk] = c->vm + (size_t)hk * a->D;
    c->a.mix = c->mix;
    c->a.vmean = c->vmp;
}

static void pg_call_init(pg_call *c, uint64_t *rng, int T, int H, int Hkv, int D, int n_swa, bool stats) {
    memset(c, 0, sizeof *c);
    const int pos0 = 3 + (int)(qi_test_rand(rng) % 20), P = pos0 + T; /* positions 0..P-1 */
    c->q_pos = malloc(sizeof(int32_t) * (size_t)(T + 1));
    for (int t = 0; t < T; t++) c->q_pos[t] = pos0 + t;
    c->q = malloc(sizeof(float) * (size_t)(T * H * D + 1));
    for (long i = 0; i < (long)T * H * D; i++) c->q[i] = randn(rng) * 2.0f;
    int stride = 1;
    for (int hk = 0; hk < Hkv; hk++) {
        int32_t *pos = malloc(sizeof(int32_t) * (size_t)P);
        int n = 0;
        for (int p = 0; p < P; p++)
            if (p >= pos0 || qi_test_rand(rng) % 4 != 0) pos[n++] = p;
        for (int i = n - 1; i > 0; i--) {
            const int j = (int)(qi_test_rand(rng) % (uint64_t)(i + 1));
            const int32_t tmp = pos[i];
            pos[i] = pos[j];
            pos[j] = tmp;
        }
        const int n_blk = (n >> PG_SHIFT) + 1;
        c->kb[hk] = malloc(sizeof(uint16_t *) * (size_t)n_blk);
        c->vb[hk] = malloc(sizeof(uint16_t *) * (size_t)n_blk);
        for (int b = 0; b < n_blk; b++) {
            c->kb[hk][b] = malloc(sizeof(uint16_t) * ((size_t)D << PG_SHIFT));
            c->vb[hk][b] = malloc(sizeof(uint16_t) * ((size_t)D << PG_SHIFT));
            for (long i = 0; i < (long)D << PG_SHIFT; i++) {
                c->kb[hk][b][i] = qi_f32_to_fp16(randn(rng) * 2.0f);
                c->vb[hk][b][i] = qi_f32_to_fp16(randn(rng));
            }
        }
        c->n_slots[hk] = n;
        c->pos[hk] = pos;
        c->cpos[hk] = pos;
        c->ckb[hk] = (const uint16_t *const *)c->kb[hk];
        c->cvb[hk] = (const uint16_t *const *)c->vb[hk];
        stride = n + 3 + 40 > stride ? n + 3 + 40 : stride; /* past the slots and extra rows: the tail stays as it was */
    }
    c->a = (qi_attn_paged_args){.T = T, .H = H, .Hkv = Hkv, .D = D, .q_pos = c->q_pos, .n_swa = n_swa,
                                .scale = 1.0f / sqrtf((float)D), .q = c->q, .n_slots = c->n_slots, .pos = c->cpos,
                                .k_blk = c->ckb, .v_blk = c->cvb, .shift = PG_SHIFT,
                                .stats_stride = stats ? stride : 0};
    if (stats) {
        c->stats0 = malloc(sizeof(float) * (size_t)H * stride);
        for (long i = 0; i < (long)H * stride; i++) c->stats0[i] = (float)(qi_test_rand(rng) % 8) / 64.0f;
    }
}

static void pg_call_fini(pg_call *c) {
    for (int hk = 0; hk < c->a.Hkv; hk++) {
        for (int b = 0; b <= c->n_slots[hk] >> PG_SHIFT; b++) {
            free(c->kb[hk][b]);
            free(c->vb[hk][b]);
        }
        free(c->kb[hk]);
        free(c->vb[hk]);
        free(c->pos[hk]);
    }
    for (int hk = 0; c->a.x_n && hk < c->a.Hkv; hk++) {
        for (int j = 0; j < c->x_n[hk]; j++) {
            free(c->xk[hk][j]);
            free(c->xv[hk][j]);
        }
        free(c->xk[hk]);
        free(c->xv[hk]);
        free(c->x_pos[hk]);
    }
    free(c->q_pos);
    free(c->q);
    free(c->stats0);
    free(c->mix);
    free(c->vm);
}

static long pg_out_len(const qi_attn_paged_args *a) { return (long)a->T * a->H * a->D; }
static long pg_stats_len(const qi_attn_paged_args *a) { return (long)a->H * a->stats_stride; }

/* The contract of qi_attn_paged_args from the references, one (token,
 * head) at a time: scores block by block with the F16 order of the call's
 * T, scaled, keys after the query or outside the window masked, fp16
 * softmax weights, their sum of V rows; stats[h][i] += weight i, queries in
 * order. */
static void ref_attention_paged(const qi_attn_paged_args *a, float *out, float *stats) {
    const int D = a->D, group = a->H / a->Hkv, B = 1 << a->shift;
    const qi_k_order ord = a->T >= 2 ? QI_K_ORD_GEMM : QI_K_ORD_VEC;
    uint16_t q16[128];
    for (int t = 0; t < a->T; t++)
        for (int h = 0; h < a->H; h++) {
            const int hk = h / group, n = a->n_slots[hk], nx = a->x_n ? a->x_n[hk] : 0;
            const int32_t qpos = a->q_pos[t], *pos = a->pos[hk];
            float *s = malloc(sizeof(float) * (size_t)(n + nx + 1));
            uint16_t *w16 = malloc(sizeof(uint16_t) * (size_t)(n + nx + 1));
            const float *q = a->q + ((long)t * a->H + h) * D;
            for (int d = 0; d < D; d++) q16[d] = qi_f32_to_fp16(q[d]);
            for (int i0 = 0; i0 < n; i0 += B)
                qi_k_attn_scores_ref(ord, D, q16, a->k_blk[hk][i0 >> a->shift], (size_t)D, n - i0 < B ? n - i0 : B,
                                     s + i0);
            for (int j = 0; j < nx; j++) /* extra rows: slots n.., one row at a time */
                qi_k_attn_scores_ref(ord, D, q16, a->x_k[hk][j], (size_t)D, 1, s + n + j);
            for (int i = 0; i < n + nx; i++) {
                const int32_t p = i < n ? pos[i] : a->x_pos[hk][i - n];
                s[i] *= a->scale;
                if (p > qpos || (a->n_swa > 0 && qpos - p >= a->n_swa)) s[i] = -INFINITY;
            }
            qi_k_softmax_f16_ref(n + nx, s, w16);
            float *o = out + ((long)t * a->H + h) * D;
            qi_k_attn_values_blk_ref(ord, D, w16, a->v_blk[hk], a->shift, (size_t)D, n, o);
            if (nx) { /* plus the extra rows' weighted values, in 16 lanes */
                float xo[128];
                qi_k_attn_values_blk_ref(QI_K_ORD_GEMM, D, w16 + n, a->x_v[hk], 0, (size_t)D, nx, xo);
                for (int d = 0; d < D; d++) o[d] += xo[d];
            }
            const float w = a->mix ? a->mix[t * a->H + h] : 1.0f;
            if (w < 1.0f) /* the mean-value term */
                for (int d = 0; d < D; d++) o[d] = w * o[d] + (1.0f - w) * a->vmean[hk][d];
            if (stats)
                for (int i = 0; i < n + nx; i++) stats[(long)h * a->stats_stride + i] += qi_fp16_to_f32(w16[i]);
            free(s);
            free(w16);
        }
}

/* PG_CALLS calls of one shape, T and statistics varying by call (decode
 * rows, prompt chunks, an empty call), every third shape with the
 * mean-value term (shares below 1 blend the means in, 1 and more leave the
 * output), half the shapes with extra rows (a fetching policy's: 0 to 39 a
 * KV head, each row on its own), on 1..4 threads: attention_paged_n,
 * and each call through attention_paged, against the reference, outputs
 * and statistics bit for bit, guard floats around each intact. */
START_TEST(test_attention_paged) {
    uint64_t rng = 606;
    qi_backend *b[MAX_THREADS];
    backends_create(b);
    backends_reserve(b, 0, 64);
    static const int Ts[PG_CALLS] = {1, 5, 1, 0, 3, 1};
    for (int i = 0; i < 24; i++) {
        const int H = i & 1 ? 4 : 6, Hkv = i & 1 ? 4 : 2, D = i & 2 ? 80 : 64, n_swa = i & 4 ? 6 : 0, mode = i >> 3;
        pg_call c[PG_CALLS];
        qi_attn_paged_args a[PG_CALLS];
        float *want_out[PG_CALLS], *want_stats[PG_CALLS];
        for (int k = 0; k < PG_CALLS; k++) {
            /* statistics on every call, on none, or on every other call */
            const bool stats = mode == 0 || (mode == 2 && k % 2 == 0);
            pg_call_init(&c[k], &rng, Ts[k], H, Hkv, D, n_swa, stats);
            if (i % 3 == 0) pg_call_mix(&c[k], &rng); /* SparQ's mean-value term on every third shape */
            if (i % 4 == 1 || i % 4 == 2) pg_call_extra(&c[k], &rng); /* fetched rows on half the shapes */
            a[k] = c[k].a;
            want_out[k] = malloc(sizeof(float) * (size_t)(pg_out_len(&a[k]) + 1));
            want_stats[k] = NULL;
            if (stats) {
                want_stats[k] = malloc(sizeof(float) * (size_t)pg_stats_len(&a[k]));
                memcpy(want_stats[k], c[k].stats0, sizeof(float) * (size_t)pg_stats_len(&a[k]));
            }
            ref_attention_paged(&a[k], want_out[k], want_stats[k]);
        }
        char what[160];
        snprintf(what, sizeof what, "paged attention H=%d Hkv=%d D=%d n_swa=%d, stats %s%s%s", H, Hkv, D, n_swa,
                 mode == 0 ? "on all" : mode == 1 ? "on none" : "on calls 0, 2, 4", i % 3 == 0 ? ", mean values" : "",
                 i % 4 == 1 || i % 4 == 2 ? ", extra rows" : "");
        for (int nt = 1; nt <= MAX_THREADS; nt++)
            for (int together = 0; together < 2; together++) {
                gbuf go[PG_CALLS], gs[PG_CALLS];
                for (int k = 0; k < PG_CALLS; k++) {
                    a[k].out = gbuf_init(&go[k], pg_out_len(&a[k]));
                    a[k].stats = NULL;
                    if (c[k].stats0) {
                        a[k].stats = gbuf_init(&gs[k], pg_stats_len(&a[k]));
                        memcpy(a[k].stats, c[k].stats0, sizeof(float) * (size_t)pg_stats_len(&a[k]));
                    }
                }
                if (together) b[nt - 1]->iface->attention_paged_n(b[nt - 1], a, PG_CALLS);
                else
                    for (int k = 0; k < PG_CALLS; k++) b[nt - 1]->iface->attention_paged(b[nt - 1], &a[k]);
                for (int k = 0; k < PG_CALLS; k++) {
                    const char *how = together ? "attention_paged_n" : "attention_paged";
                    gbuf_check(&go[k], what, nt);
                    expect_same(want_out[k], a[k].out, pg_out_len(&a[k]), D, "%s, %s call %d (T=%d), %d threads",
                                what, how, k, a[k].T, nt);
                    gbuf_fini(&go[k]);
                    if (!a[k].stats) continue;
                    gbuf_check(&gs[k], what, nt);
                    expect_same(want_stats[k], a[k].stats, pg_stats_len(&a[k]), a[k].stats_stride,
                                "%s, %s call %d (T=%d) stats [head][slot], %d threads", what, how, k, a[k].T, nt);
                    gbuf_fini(&gs[k]);
                }
            }
        for (int k = 0; k < PG_CALLS; k++) {
            free(want_out[k]);
            free(want_stats[k]);
            pg_call_fini(&c[k]);
        }
    }
    backends_free(b);
}
END_TEST

/* ---- get_rows ------------------------------------------------------------------- */

START_TEST(test_get_rows) {
    uint64_t rng = 505;
    qi_backend *b[MAX_THREADS];
    backends_create(b);
    static const int32_t ids[] = {0, 8, 3, 3, 5};
    for (int i = 0; i < N_MM_TYPES; i++) {
        const uint32_t type = k_mm_types[i];
        const int blck = (int)qi_type_get(type)->blck;
        const int64_t cols[2] = {blck == 1 ? 17 : blck, blck == 1 ? 160 : blck * 3};
        for (int ci = 0; ci < 2; ci++)
            for (int T = 1; T <= 5; T += 4) {
                const int64_t nc = cols[ci];
                qi_weight w = make_weight(&rng, type, nc, 9);
                const long len = (long)T * nc;
                float *want = malloc(sizeof(float) * (size_t)len);
                for (int t = 0; t < T; t++)
                    qi_dequantize_row_ref(type, (const char *)w.data + ids[t] * w.row_bytes, want + (long)t * nc, nc);
                for (int nt = 1; nt <= MAX_THREADS; nt++) {
                    gbuf g;
                    float *y = gbuf_init(&g, len);
                    b[nt - 1]->iface->get_rows(b[nt - 1], &w, ids, T, y);
                    gbuf_check(&g, "get_rows", nt);
                    expect_same(want, y, len, nc, "get_rows %s %lld cols T=%d, %d threads", qi_type_get(type)->name,
                                (long long)nc, T, nt);
                    gbuf_fini(&g);
                }
                free(want);
                free((void *)w.data);
            }
    }
    backends_free(b);
}
END_TEST

/* ---- planted faults -------------------------------------------------------------- */

/* The comparison sees one flipped bit and a sign of zero. */
START_TEST(test_planted_bit_flip) {
    uint64_t rng = 606;
    qi_backend *b[MAX_THREADS];
    backends_create(b);
    qi_weight w = make_weight(&rng, QI_TYPE_Q4_0, 64, 5);
    backends_reserve(b, qi_row_bytes(QI_TYPE_Q8_0, 64) * 3, 1);
    float x[3 * 64], want[15], got[15];
    for (int t = 0; t < 3; t++) fill_row(&rng, x + t * 64, 64, t);
    ref_matmul(ref_dot, &w, x, 3, want);
    b[1]->iface->matmul(b[1], &w, x, 3, got);
    ck_assert_int_eq(first_mismatch(want, got, 15), -1);
    uint32_t u = f32_bits(want[7]) ^ 1u;
    memcpy(&want[7], &u, 4);
    ck_assert_int_eq(first_mismatch(want, got, 15), 7);
    const float pz = 0.0f, nz = -0.0f;
    ck_assert(pz == nz);
    ck_assert_int_eq(first_mismatch(&pz, &nz, 1), 0);
    free((void *)w.data);
    backends_free(b);
}
END_TEST

/* The expected side's orders are observable: the backend's results differ
 * somewhere from ggml's generic q4_0 order and, at 8 tokens, from the
 * non-tiled q4_K order, so computing the reference in the wrong order (or
 * the backend switching order at the wrong token count) would be caught. */
static float generic_dot(uint32_t type, int wide, int64_t n, const void *w, const void *a) {
    (void)wide;
    return qi_vec_dot_ref(type, n, w, a);
}

static float narrow_dot(uint32_t type, int wide, int64_t n, const void *w, const void *a) {
    (void)wide;
    return ref_dot(type, 0, n, w, a);
}

START_TEST(test_planted_wrong_order) {
    uint64_t rng = 707;
    qi_backend *b[MAX_THREADS];
    backends_create(b);
    static const struct {
        uint32_t type;
        dot_fn wrong;
        const char *name;
    } cases[] = {{QI_TYPE_Q4_0, generic_dot, "generic q4_0"}, {QI_TYPE_Q4_K, narrow_dot, "non-tiled q4_K"},
                 {QI_TYPE_Q6_K, narrow_dot, "non-tiled q6_K"}};
    enum { T = QI_K_WIDE_MIN, nc = 768, nr = 13 };
    backends_reserve(b, qi_row_bytes(QI_TYPE_Q8_K, nc) * T, 1);
    float *x = malloc(sizeof(float) * nc * T), want[T * nr], wrong[T * nr], got[T * nr];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        qi_weight w = make_weight(&rng, cases[i].type, nc, nr);
        for (int t = 0; t < T; t++) fill_row(&rng, x + (long)t * nc, nc, 2);
        ref_matmul(ref_dot, &w, x, T, want);
        ref_matmul(cases[i].wrong, &w, x, T, wrong);
        for (int nt = 1; nt <= MAX_THREADS; nt++) {
            b[nt - 1]->iface->matmul(b[nt - 1], &w, x, T, got);
            ck_assert_int_eq(first_mismatch(want, got, T * nr), -1);
            ck_assert_msg(first_mismatch(wrong, got, T * nr) >= 0, "%s order agrees with the backend everywhere",
                          cases[i].name);
        }
        free((void *)w.data);
    }
    free(x);
    backends_free(b);
}
END_TEST

static Suite *backend_suite(void) {
    Suite *s = suite_create("backend");
    TCase *tc = tcase_create("matmul");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, test_matmul, 0, N_MM_TYPES);
    suite_add_tcase(s, tc);

    tc = tcase_create("elementwise");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_rmsnorm);
    tcase_add_test(tc, test_rope);
    tcase_add_loop_test(tc, test_glu, 0, 2);
    tcase_add_test(tc, test_get_rows);
    suite_add_tcase(s, tc);

    tc = tcase_create("attention");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_attention_paged);
    suite_add_tcase(s, tc);

    tc = tcase_create("planted");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_planted_bit_flip);
    tcase_add_test(tc, test_planted_wrong_order);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    printf("test_backend: kernels %s, threads 1..%d\n", qi_kernels_get()->name, MAX_THREADS);
    return qi_test_run_suite(backend_suite());
}

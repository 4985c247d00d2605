/* test_kernels.c - Check suite for the CPU kernels (engine/kernels*.c).
 *
 * Evidence, strongest first:
 *   - the references against llama.cpp itself: the "dot" cases of
 *     tests/golden/quant/quant_golden.txt carry ggml's SIMD vec_dot result
 *     from the x86 build the engine is matched to (line "s"); the x86-order
 *     references must reproduce it bit for bit (q4_0, q4_1, q5_0, q5_1,
 *     q8_0, q4_K, q6_K, and f16 in the VEC order); and embedded outputs of
 *     ggml_mul_mat on q4_K/q6_K weights pin both K-quant orders (vec_dot
 *     below 8 tokens, the tiled kernel from 8);
 *   - every SIMD variant against the reference: bit-identical (tolerance 0,
 *     the design), over random data of every size class (one block, odd
 *     block counts, rows of thousands and past the batched paths' limit,
 *     1..11 weight rows x 1..20 tokens, head dims that the fast paths do
 *     and do not cover, positions around 16 and 64, softmax and exp inputs
 *     that underflow and overflow (exp_sum's also with -inf, masked, inputs),
 *     quantiser rows with exact ties), with guard values between strided
 *     outputs that must stay untouched;
 *   - the exp approximation against libm within 3 ulp (the worst seen is
 *     2.14), plus its special values;
 *   - planted faults: ggml's generic order (quant.c) and a non-fused block
 *     accumulation both disagree with the references on these inputs, so
 *     the bit-identity checks are able to fail;
 *   - dispatch: the chosen table is sane, and QI_FORCE_REF=1 yields the
 *     reference.
 * Each test reports the first mismatching index.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "kernels.h"
#include "qinfer/quant.h"
#include "quant_act.h"
#include "testutil.h"

#ifndef QI_SOURCE_DIR
#error "QI_SOURCE_DIR must name the source root"
#endif
#define GOLDEN_PATH QI_SOURCE_DIR "/tests/golden/quant/quant_golden.txt"

static const uint32_t k_dot_types[] = {QI_TYPE_Q4_0, QI_TYPE_Q4_1, QI_TYPE_Q5_0, QI_TYPE_Q5_1,
                                       QI_TYPE_Q8_0, QI_TYPE_Q4_K, QI_TYPE_Q6_K};
#define N_DOT_TYPES (int)(sizeof k_dot_types / sizeof k_dot_types[0])

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* Same value, or both NaN. */
static int same_float(float a, float b) { return f32_bits(a) == f32_bits(b) || (isnan(a) && isnan(b)); }

static long first_diff(const float *a, const float *b, long n) {
    for (long i = 0; i < n; i++)
        if (!same_float(a[i], b[i])) return i;
    return -1;
}

/* The SIMD tables this CPU offers (possibly none). */
static int simd_tables(const qi_kernels *out[2]) {
    int n = 0;
    if (qi_kernels_avx2()) out[n++] = qi_kernels_avx2();
    if (qi_kernels_avx512()) out[n++] = qi_kernels_avx512();
    return n;
}

static float randn(uint64_t *s) {
    float u1 = (qi_test_randf(s) + 1.0f) * 0.5f, u2 = qi_test_randf(s);
    if (u1 < 1e-7f) u1 = 1e-7f;
    return sqrtf(-2.0f * logf(u1)) * cosf(3.14159265f * u2);
}

/* A float row with the features of real activations: Gaussian, some rows
 * with a few huge outliers (SmolLM2 has ~2e4), some all-zero blocks. */
static void fill_row(uint64_t *s, float *x, int64_t n, int kind) {
    for (int64_t i = 0; i < n; i++) x[i] = randn(s) * (kind == 2 ? 30.0f : 1.0f);
    if (kind == 1)
        for (int k = 0; k < 3; k++) x[qi_test_rand(s) % (uint64_t)n] = 2.2e4f * qi_test_randf(s);
    if (kind == 3 && n >= 64)
        for (int i = 32; i < 64; i++) x[i] = 0.0f;
}

/* ---- goldens from llama.cpp ------------------------------------------------------ */

typedef struct {
    uint32_t type;
    int64_t n;
    unsigned char *w, *a;
    size_t w_len, a_len;
    float s; /* ggml's SIMD vec_dot */
    int has_s;
} golden_dot;

static golden_dot g_dots[64];
static int g_n_dots;
static char g_load_err[256];

static uint32_t type_by_name(const char *name) {
    for (uint32_t t = 0; t < QI_TYPE_COUNT; t++) {
        const qi_type_info *ti = qi_type_get(t);
        if (ti && ti->name && !strcasecmp(ti->name, name)) return t;
    }
    return QI_TYPE_COUNT;
}

static int load_golden_dots(void) {
    size_t len;
    char *text = qi_test_read_file(GOLDEN_PATH, &len);
    if (!text) {
        snprintf(g_load_err, sizeof g_load_err, "cannot read %s", GOLDEN_PATH);
        return 0;
    }
    golden_dot *cur = NULL;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        char tname[16];
        long long n;
        if (!strncmp(line, "dot ", 4)) {
            if (g_n_dots == 64 || sscanf(line + 4, "%15s %lld", tname, &n) != 2) goto bad;
            cur = &g_dots[g_n_dots++];
            memset(cur, 0, sizeof *cur);
            cur->type = type_by_name(tname);
            cur->n = n;
            if (cur->type == QI_TYPE_COUNT) goto bad;
        } else if (!strncmp(line, "quant ", 6) || !strncmp(line, "dequant ", 8) ||
                   !strncmp(line, "stress ", 7) || !strncmp(line, "checksum ", 9)) {
            cur = NULL;
        } else if (cur && !strncmp(line, "w ", 2)) {
            if (!(cur->w = qi_test_unhex(line + 2, &cur->w_len))) goto bad;
        } else if (cur && !strncmp(line, "a ", 2)) {
            if (!(cur->a = qi_test_unhex(line + 2, &cur->a_len))) goto bad;
        } else if (cur && !strncmp(line, "s ", 2)) {
            char *end;
            cur->s = strtof(line + 2, &end); /* %.9g: round-trips a float */
            if (end == line + 2) goto bad;
            cur->has_s = 1;
        }
    }
    free(text);
    return 1;
bad:
    snprintf(g_load_err, sizeof g_load_err, "malformed dot case in %s", GOLDEN_PATH);
    free(text);
    return 0;
}

static const golden_dot *find_dot(uint32_t type, int which) {
    for (int i = 0; i < g_n_dots; i++)
        if (g_dots[i].type == type && g_dots[i].has_s && g_dots[i].w && g_dots[i].a && which-- == 0)
            return &g_dots[i];
    return NULL;
}

static void require_goldens(void) {
    ck_assert_msg(g_n_dots > 0, "goldens not loaded: %s", g_load_err);
}

START_TEST(test_golden_block_dots) {
    require_goldens();
    const uint32_t t = k_dot_types[_i];
    const qi_kernels *tabs[3] = {qi_kernels_ref()};
    const int n_tabs = 1 + simd_tables(tabs + 1);
    int seen = 0;
    for (int which = 0;; which++) {
        const golden_dot *g = find_dot(t, which);
        if (!g) break;
        seen++;
        ck_assert_uint_eq(g->w_len, qi_row_bytes(t, g->n));
        ck_assert_uint_eq(g->a_len, qi_row_bytes(qi_vec_dot_type(t), g->n));
        for (int k = 0; k < n_tabs; k++) {
            float got = NAN;
            tabs[k]->gemm[t](g->n, g->w, 0, 1, g->a, 0, 1, &got, 1);
            qi_check_msg(same_float(got, g->s), "%s %s n=%lld: %.9g, llama.cpp %.9g",
                          tabs[k]->name, qi_type_get(t)->name, (long long)g->n, got, g->s);
        }
    }
    ck_assert_msg(seen >= 2, "expected two golden dot cases for %s", qi_type_get(t)->name);
}
END_TEST

START_TEST(test_golden_f16_dot) {
    require_goldens();
    int seen = 0;
    for (int which = 0;; which++) {
        const golden_dot *g = find_dot(QI_TYPE_F16, which);
        if (!g) break;
        seen++;
        const float got = qi_k_dot_f16_ref(QI_K_ORD_VEC, g->n, (const uint16_t *)g->w,
                                           (const uint16_t *)g->a);
        ck_assert_msg(same_float(got, g->s), "f16 n=%lld: %.9g, llama.cpp %.9g", (long long)g->n, got, g->s);
    }
    ck_assert_int_ge(seen, 2);
}
END_TEST

/* llama.cpp's matmul of q4_K/q6_K weights, as ggml_mul_mat computed it in
 * the vendored build (a harness linked against its libggml-cpu): 2 weight
 * rows of 768, against 9 tokens (its tiled kernel) and 3 tokens (vec_dot),
 * on the inputs golden_k_inputs() makes. Output [token][row], float bits. */
static const uint32_t k_golden_q4_K_9[18] = {
    0xc03a69b3, 0x420b04dd, 0x41458362, 0x4286dd8a, 0x408b31e7, 0xc0bfbb4e,
    0x407e3610, 0x40d7d616, 0x3ff9ecac, 0xc19ed0e4, 0xc149f995, 0x4057707a,
    0xc1099339, 0xc2053ddb, 0xc215cfca, 0xc279dfe5, 0x400a563a, 0x413b39d5};
static const uint32_t k_golden_q4_K_3[6] = {0xc03a69bc, 0x420b04dc, 0x4145836c,
                                            0x4286dd8a, 0x408b31f0, 0xc0bfbb53};
static const uint32_t k_golden_q6_K_9[18] = {
    0x42e01722, 0xc2b3b835, 0xc235fc5a, 0x4265d0b1, 0x42556282, 0x42058086,
    0xc106f1ca, 0x42325861, 0xc10af201, 0x41a2f9b7, 0xc18bd57f, 0x41891499,
    0x41bfcb98, 0xc1c6d05f, 0xc109b7ed, 0x42299607, 0x41950391, 0xc187885b};
static const uint32_t k_golden_q6_K_3[6] = {0x42e01720, 0xc2b3b835, 0xc235fc5c,
                                            0x4265d0b0, 0x42556282, 0x42058086};

/* 2 rows of 768 weights of `type` and n_tok activation rows in Q8_K, from
 * the uniform generator only (no libm), so the bytes are the harness's. */
static void golden_k_inputs(uint32_t type, int n_tok, void *w, void *a) {
    uint64_t s = 4242 + type;
    float x[768];
    for (int m = 0; m < 2; m++) {
        for (int k = 0; k < 768; k++) x[k] = qi_test_randf(&s) * (k % 97 == 0 ? 5.0f : 1.0f);
        qi_quantize_row_ref(type, x, (char *)w + (size_t)m * qi_row_bytes(type, 768), 768);
    }
    for (int t = 0; t < n_tok; t++) {
        for (int k = 0; k < 768; k++) x[k] = qi_test_randf(&s) * ((t * 768 + k) % 331 == 0 ? 50.0f : 1.0f);
        qi_quantize_act_row(QI_TYPE_Q8_K, x, (char *)a + (size_t)t * qi_row_bytes(QI_TYPE_Q8_K, 768), 768);
    }
}

START_TEST(test_golden_k_matmul) {
    const qi_kernels *tabs[4] = {qi_kernels_ref()};
    int n_tabs = 1 + simd_tables(tabs + 1);
    if (qi_kernels_amx()) tabs[n_tabs++] = qi_kernels_amx(); /* its own suite: test_kernels_amx */
    static const uint32_t types[2] = {QI_TYPE_Q4_K, QI_TYPE_Q6_K};
    const uint32_t *gold[2][2] = {{k_golden_q4_K_3, k_golden_q4_K_9}, {k_golden_q6_K_3, k_golden_q6_K_9}};
    for (int ti = 0; ti < 2; ti++)
        for (int wide = 0; wide < 2; wide++) {
            const uint32_t t = types[ti];
            const int n_tok = wide ? 9 : 3;
            const size_t wb = qi_row_bytes(t, 768), ab = qi_row_bytes(QI_TYPE_Q8_K, 768);
            char *w = malloc(2 * wb), *a = malloc((size_t)n_tok * ab);
            golden_k_inputs(t, n_tok, w, a);
            for (int k = 0; k < n_tabs; k++) {
                float y[18];
                qi_k_gemm_fn g = wide ? tabs[k]->gemm_wide[t] : tabs[k]->gemm[t];
                g(768, w, wb, 2, a, ab, n_tok, y, 2);
                for (int i = 0; i < 2 * n_tok; i++)
                    qi_check_msg(f32_bits(y[i]) == gold[ti][wide][i], "%s %s, %d tokens: token %d row %d: %.9g (%08x), llama.cpp %08x",
                                  tabs[k]->name, qi_type_get(t)->name, n_tok, i / 2, i % 2, y[i], f32_bits(y[i]), gold[ti][wide][i]);
            }
            free(w);
            free(a);
        }
}
END_TEST

/* Planted fault: ggml's generic order (what quant.c computes) is not
 * llama.cpp's x86 result on these cases, so the golden test can fail. */
START_TEST(test_planted_generic_order) {
    require_goldens();
    int differs = 0;
    for (int i = 0; i < N_DOT_TYPES; i++)
        for (int which = 0;; which++) {
            const golden_dot *g = find_dot(k_dot_types[i], which);
            if (!g) break;
            differs += !same_float(qi_vec_dot_ref(g->type, g->n, g->w, g->a), g->s);
        }
    ck_assert_msg(differs > 0, "generic order matched every golden: the goldens cannot tell orders apart");
}
END_TEST

/* ---- block dots: variants against the reference ----------------------------------- */

/* A weight row of `type`: quantised Gaussian data, or (raw) random block
 * bytes with finite fp16 scales, which reach every nibble pattern. */
static void make_weights(uint64_t *s, uint32_t type, int64_t n, void *w, int raw) {
    const size_t bytes = qi_row_bytes(type, n);
    if (!raw) {
        float *x = malloc(sizeof(float) * (size_t)n);
        fill_row(s, x, n, (int)(qi_test_rand(s) % 3));
        qi_quantize_row_ref(type, x, w, n);
        free(x);
        return;
    }
    unsigned char *p = w;
    for (size_t i = 0; i < bytes; i++) p[i] = (unsigned char)qi_test_rand(s);
    /* finite fp16 scales: d first (q6_K: last), then the offset of the
     * formats that have one (m, dmin) */
    const size_t bs = qi_type_get(type)->size;
    for (size_t b = 0; b < bytes; b += bs) {
        uint16_t d = qi_f32_to_fp16(qi_test_randf(s) * 0.02f), m = qi_f32_to_fp16(qi_test_randf(s) * 0.1f);
        memcpy(p + b + (type == QI_TYPE_Q6_K ? bs - 2 : 0), &d, 2);
        if (type == QI_TYPE_Q4_1 || type == QI_TYPE_Q5_1 || type == QI_TYPE_Q4_K) memcpy(p + b + 2, &m, 2);
    }
}

/* Matmul blocks of every shape class: 1..11 weight rows (the four- and
 * eight-row paths and their remainders), 1..40 tokens (passes of sixteen
 * or eight tokens, partial passes of every size, single tokens),
 * one block to 257 blocks (past the batched paths' limit). Outputs are
 * strided with guard slots that must survive. */
START_TEST(test_gemm_variants) {
    const uint32_t t = k_dot_types[_i];
    const qi_kernels *simd[2];
    const int n_simd = simd_tables(simd);
    static const int64_t sizes[] = {32, 64, 96, 160, 576, 1536, 8224};
    static const int64_t sizes_k[] = {256, 512, 768, 2048, 256 * 65};
    const int is_k = qi_type_get(t)->blck == 256;
    const int64_t *sz = is_k ? sizes_k : sizes;
    const int n_sz = is_k ? 5 : 7;
    uint64_t rng = 0x9e3779b97f4a7c15ull + t;
    const uint32_t at = qi_vec_dot_type(t);
    for (int si = 0; si < n_sz; si++) {
        const int64_t n = sz[si];
        const size_t wb = qi_row_bytes(t, n), ab = qi_row_bytes(at, n);
        for (int rep = 0; rep < 8; rep++) {
            const int n_w = 1 + (int)(qi_test_rand(&rng) % 11);
            const int n_a = rep == 0   ? 1
                            : rep == 1 ? 8
                            : rep == 2 ? 16
                            : rep == 3 ? 15
                                       : 1 + (int)(qi_test_rand(&rng) % 40);
            const size_t ys = (size_t)n_w + 2; /* two guard slots per token */
            char *w = malloc(wb * (size_t)n_w), *a = malloc(ab * (size_t)n_a);
            float *x = malloc(sizeof(float) * (size_t)n);
            float *ref = malloc(sizeof(float) * ys * (size_t)n_a), *got = malloc(sizeof(float) * ys * (size_t)n_a);
            for (int r = 0; r < n_w; r++) make_weights(&rng, t, n, w + (size_t)r * wb, (rep + r) & 1);
            for (int j = 0; j < n_a; j++) {
                fill_row(&rng, x, n, (int)(qi_test_rand(&rng) % 4));
                qi_quantize_act_row(at, x, a + (size_t)j * ab, n);
            }
            for (int wide = 0; wide < 2; wide++) {
                qi_k_gemm_fn rf = wide ? qi_kernels_ref()->gemm_wide[t] : qi_kernels_ref()->gemm[t];
                if (!rf) continue;
                for (size_t i = 0; i < ys * (size_t)n_a; i++) ref[i] = -12345.0f;
                rf(n, w, wb, n_w, a, ab, n_a, ref, ys);
                for (int j = 0; j < n_a; j++)
                    for (int r = n_w; r < n_w + 2; r++)
                        qi_check_msg(ref[(size_t)j * ys + r] == -12345.0f, "guard %d,%d overwritten", j, r);
                for (int k = 0; k < n_simd; k++) {
                    qi_k_gemm_fn sf = wide ? simd[k]->gemm_wide[t] : simd[k]->gemm[t];
                    ck_assert_msg(sf != NULL, "%s lacks %s", simd[k]->name, qi_type_get(t)->name);
                    for (size_t i = 0; i < ys * (size_t)n_a; i++) got[i] = -12345.0f;
                    sf(n, w, wb, n_w, a, ab, n_a, got, ys);
                    const long d = first_diff(ref, got, (long)(ys * (size_t)n_a));
                    qi_check_msg(d < 0, "%s %s%s n=%lld %dx%d: token %ld row %ld: ref %.9g, got %.9g",
                                  simd[k]->name, qi_type_get(t)->name, wide ? " (wide)" : "", (long long)n, n_w,
                                  n_a, d / (long)ys, d % (long)ys, d >= 0 ? ref[d] : 0.0f, d >= 0 ? got[d] : 0.0f);
                }
            }
            free(w);
            free(a);
            free(x);
            free(ref);
            free(got);
        }
    }
}
END_TEST

/* The reference matmul block is the single-row reference dot, pair by pair. */
START_TEST(test_gemm_ref_is_dot_ref) {
    static float (*const dots[])(int64_t, const void *, const void *) = {
        qi_k_dot_q4_0_ref, qi_k_dot_q4_1_ref, qi_k_dot_q5_0_ref, qi_k_dot_q5_1_ref,
        qi_k_dot_q8_0_ref, qi_k_dot_q4_K_ref, qi_k_dot_q6_K_ref};
    static float (*const wide_dots[])(int64_t, const void *, const void *) = {
        NULL, NULL, NULL, NULL, NULL, qi_k_dot_q4_K_tiled_ref, qi_k_dot_q6_K_tiled_ref};
    uint64_t rng = 5;
    for (int i = 0; i < N_DOT_TYPES; i++) {
        const uint32_t t = k_dot_types[i], at = qi_vec_dot_type(t);
        const int64_t n = qi_type_get(t)->blck == 256 ? 512 : 96;
        const size_t wb = qi_row_bytes(t, n), ab = qi_row_bytes(at, n);
        char *w = malloc(3 * wb), *a = malloc(2 * ab);
        float x[512], y[2 * 3];
        for (int r = 0; r < 3; r++) make_weights(&rng, t, n, w + r * wb, r & 1);
        for (int j = 0; j < 2; j++) {
            fill_row(&rng, x, n, j);
            qi_quantize_act_row(at, x, a + j * ab, n);
        }
        for (int wide = 0; wide < 2; wide++) {
            qi_k_gemm_fn g = wide ? qi_kernels_ref()->gemm_wide[t] : qi_kernels_ref()->gemm[t];
            float (*dot)(int64_t, const void *, const void *) = wide ? wide_dots[i] : dots[i];
            ck_assert_msg((g == NULL) == (dot == NULL), "table and reference disagree for %s", qi_type_get(t)->name);
            if (!g) continue;
            g(n, w, wb, 3, a, ab, 2, y, 3);
            for (int j = 0; j < 2; j++)
                for (int r = 0; r < 3; r++)
                    qi_check_msg(same_float(y[j * 3 + r], dot(n, w + r * wb, a + j * ab)), "token %d row %d", j, r);
        }
        free(w);
        free(a);
    }
}
END_TEST

/* The x86 order is not ggml's generic order, and the fused multiply-add
 * per block matters: on random rows both variations change some results.
 * (The offset term's fusion cannot matter: m and s are fp16, so m*s is
 * exact in float.) */
START_TEST(test_planted_order_sensitivity) {
    uint64_t rng = 77;
    const int64_t n = 1536;
    const size_t wb = qi_row_bytes(QI_TYPE_Q4_1, n), ab = qi_row_bytes(QI_TYPE_Q8_1, n);
    void *w = malloc(wb), *a = malloc(ab);
    float *x = malloc(sizeof(float) * n);
    int generic_differs = 0, unfused_differs = 0;
    for (int rep = 0; rep < 50; rep++) {
        make_weights(&rng, QI_TYPE_Q4_1, n, w, 0);
        fill_row(&rng, x, n, 2);
        qi_quantize_act_row(QI_TYPE_Q8_1, x, a, n);
        const float ref = qi_k_dot_q4_1_ref(n, w, a);
        generic_differs += !same_float(ref, qi_vec_dot_ref(QI_TYPE_Q4_1, n, w, a));
        /* the reference with acc += d * lane rounded twice */
        const qi_block_q4_1 *xb = w;
        const qi_block_q8_1 *yb = a;
        float acc[8] = {0}, summs = 0.0f;
        for (int64_t b = 0; b < n / 32; b++) {
            summs = fmaf(qi_fp16_to_f32(xb[b].m), qi_fp16_to_f32(yb[b].s), summs);
            const float d = qi_fp16_to_f32(xb[b].d) * qi_fp16_to_f32(yb[b].d);
            for (int j = 0; j < 8; j++) {
                int lane = 0;
                for (int k = 4 * j; k < 4 * j + 4; k++) {
                    const int q = k < 16 ? xb[b].qs[k] & 15 : xb[b].qs[k - 16] >> 4;
                    lane += q * yb[b].qs[k];
                }
                acc[j] += d * (float)lane;
            }
        }
        unfused_differs += !same_float(ref, qi_k_hsum8_ref(acc) + summs);
    }
    ck_assert_msg(generic_differs > 0, "generic order never differed");
    ck_assert_msg(unfused_differs > 0, "unfused block accumulation never differed");
    free(w);
    free(a);
    free(x);
}
END_TEST

/* ---- attention kernels ------------------------------------------------------------------- */

static void fill_f16(uint64_t *s, uint16_t *h, size_t n, float scale) {
    for (size_t i = 0; i < n; i++) h[i] = qi_f32_to_fp16(randn(s) * scale);
}

static const int k_dims[] = {8, 16, 24, 32, 48, 64, 80, 96, 128, 256};
/* 8200: past the 8192 positions whose weights the AVX-512 values kernel
 * converts in one go (longer rows take the AVX2 kernel) */
#define NPOS_MAX 8200
static const int k_npos[] = {1, 2, 15, 16, 17, 31, 63, 64, 65, 130, 300, NPOS_MAX};
#define N_DIMS (int)(sizeof k_dims / sizeof k_dims[0])
#define N_NPOS (int)(sizeof k_npos / sizeof k_npos[0])

START_TEST(test_attn_scores_variants) {
    const qi_kernels *simd[2];
    const int n_simd = simd_tables(simd);
    uint64_t rng = 1234 + (uint64_t)_i;
    const int D = k_dims[_i];
    const size_t stride = (size_t)D * 3 + 8; /* three KV heads plus slack */
    uint16_t *k = malloc(sizeof(uint16_t) * stride * NPOS_MAX), q16[256];
    static float ref[NPOS_MAX], got[NPOS_MAX];
    for (int ni = 0; ni < N_NPOS; ni++)
        for (int ord = 0; ord < 2; ord++) {
            const int n_pos = k_npos[ni];
            fill_f16(&rng, k, stride * (size_t)n_pos, 3.0f);
            fill_f16(&rng, q16, (size_t)D, 3.0f);
            qi_k_attn_scores_ref((qi_k_order)ord, D, q16, k + D, stride, n_pos, ref);
            for (int v = 0; v < n_simd; v++) {
                simd[v]->attn_scores((qi_k_order)ord, D, q16, k + D, stride, n_pos, got);
                const long d = first_diff(ref, got, n_pos);
                qi_check_msg(d < 0, "%s D=%d n_pos=%d ord=%d: position %ld: %.9g vs %.9g", simd[v]->name,
                              D, n_pos, ord, d, d >= 0 ? ref[d] : 0.0f, d >= 0 ? got[d] : 0.0f);
            }
            /* GEMM really is another order whenever tinyBLAS accepts D */
            if (ord == QI_K_ORD_GEMM && D >= 32 && D % 16 == 0 && n_pos >= 64) {
                static float vec[NPOS_MAX];
                qi_k_attn_scores_ref(QI_K_ORD_VEC, D, q16, k + D, stride, n_pos, vec);
                ck_assert_msg(first_diff(ref, vec, n_pos) >= 0, "VEC and GEMM agree everywhere at D=%d", D);
            }
        }
    free(k);
}
END_TEST

START_TEST(test_attn_values_variants) {
    const qi_kernels *simd[2];
    const int n_simd = simd_tables(simd);
    uint64_t rng = 999 + (uint64_t)_i;
    const int D = k_dims[_i];
    const size_t stride = (size_t)D * 3 + 8;
    uint16_t *v = malloc(sizeof(uint16_t) * stride * NPOS_MAX);
    static uint16_t w16[NPOS_MAX];
    float ref[256], got[256];
    for (int ni = 0; ni < N_NPOS; ni++)
        for (int ord = 0; ord < 2; ord++) {
            const int n_pos = k_npos[ni];
            fill_f16(&rng, v, stride * (size_t)n_pos, 2.0f);
            for (int p = 0; p < n_pos; p++)
                w16[p] = qi_f32_to_fp16(fabsf(randn(&rng)) / (float)n_pos * (p % 7 == 3 ? 0.0f : 1.0f));
            qi_k_attn_values_ref((qi_k_order)ord, D, w16, v + 2 * D, stride, n_pos, ref);
            for (int k = 0; k < n_simd; k++) {
                simd[k]->attn_values((qi_k_order)ord, D, w16, v + 2 * D, stride, n_pos, got);
                const long d = first_diff(ref, got, D);
                qi_check_msg(d < 0, "%s D=%d n_pos=%d ord=%d: dim %ld: %.9g vs %.9g", simd[k]->name, D,
                              n_pos, ord, d, d >= 0 ? ref[d] : 0.0f, d >= 0 ? got[d] : 0.0f);
            }
        }
    free(v);
}
END_TEST

/* The block-table form: rows scattered over separately allocated blocks (of
 * 4 and of 64 rows, in reverse allocation order) give exactly what the
 * contiguous reference gives over the same rows, in every variant. */
START_TEST(test_attn_values_blocks) {
    const qi_kernels *all[3] = {qi_kernels_ref(), NULL, NULL};
    const int n_all = 1 + simd_tables(all + 1);
    uint64_t rng = 4321 + (uint64_t)_i;
    const int D = k_dims[_i];
    uint16_t *v = malloc(sizeof(uint16_t) * (size_t)D * NPOS_MAX);
    static uint16_t w16[NPOS_MAX];
    float ref[256], got[256];
    for (int shift = 2; shift <= 6; shift += 4)
        for (int ni = 0; ni < N_NPOS; ni++)
            for (int ord = 0; ord < 2; ord++) {
                const int n_pos = k_npos[ni], B = 1 << shift, nb = (n_pos + B - 1) / B;
                fill_f16(&rng, v, (size_t)D * (size_t)n_pos, 2.0f);
                for (int p = 0; p < n_pos; p++) w16[p] = qi_f32_to_fp16(fabsf(randn(&rng)) / (float)n_pos);
                uint16_t **blk = malloc(sizeof *blk * (size_t)nb);
                for (int b = nb - 1; b >= 0; b--) {
                    blk[b] = malloc(sizeof(uint16_t) * (size_t)B * D);
                    for (int r = 0; r < B && b * B + r < n_pos; r++)
                        memcpy(blk[b] + (size_t)r * D, v + (size_t)(b * B + r) * D, sizeof(uint16_t) * (size_t)D);
                }
                qi_k_attn_values_ref((qi_k_order)ord, D, w16, v, (size_t)D, n_pos, ref);
                for (int k = 0; k < n_all; k++) {
                    all[k]->attn_values_blk((qi_k_order)ord, D, w16, (const uint16_t *const *)blk, shift, (size_t)D,
                                            n_pos, got);
                    const long d = first_diff(ref, got, D);
                    ck_assert_msg(d < 0, "%s blocks of %d, D=%d n_pos=%d ord=%d: dim %ld: %.9g vs %.9g",
                                  all[k]->name, B, D, n_pos, ord, d, d >= 0 ? ref[d] : 0.0f, d >= 0 ? got[d] : 0.0f);
                }
                for (int b = 0; b < nb; b++) free(blk[b]);
                free(blk);
            }
    free(v);
}
END_TEST

START_TEST(test_softmax_variants) {
    const qi_kernels *simd[2];
    const int n_simd = simd_tables(simd);
    uint64_t rng = 4242;
    float *s = malloc(sizeof(float) * 700), *s2 = malloc(sizeof(float) * 700);
    uint16_t *ref = malloc(2 * 700), *got = malloc(2 * 700);
    for (int n = 1; n <= 700; n += (n < 70 ? 1 : 37)) {
        /* spreads from gentle to 200: exp underflows to subnormals and to 0 */
        const float spread = (float)(n % 5) * 50.0f + 1.0f;
        for (int i = 0; i < n; i++) s[i] = randn(&rng) * spread;
        memcpy(s2, s, sizeof(float) * (size_t)n);
        qi_k_softmax_f16_ref(n, s2, ref);
        for (int k = 0; k < n_simd; k++) {
            memcpy(s2, s, sizeof(float) * (size_t)n);
            simd[k]->softmax_f16(n, s2, got);
            for (int i = 0; i < n; i++)
                qi_check_msg(ref[i] == got[i], "%s n=%d i=%d: %04x vs %04x", simd[k]->name, n, i, ref[i], got[i]);
        }
        double sum = 0.0;
        for (int i = 0; i < n; i++) sum += qi_fp16_to_f32(ref[i]);
        ck_assert_msg(fabs(sum - 1.0) < 2e-3 * (1.0 + n / 64.0), "n=%d: weights sum to %g", n, sum);
    }
    free(s);
    free(s2);
    free(ref);
    free(got);
}
END_TEST

/* exp_sum, the first half of softmax_f16 on its own: the same exponentials
 * bit for bit in every variant, the same sum, and a sum within 1e-6 of
 * libm's exponentials summed in double. */
START_TEST(test_exp_sum_variants) {
    const qi_kernels *simd[2];
    const int n_simd = simd_tables(simd);
    uint64_t rng = 4343;
    float *s = malloc(sizeof(float) * 700), *ref = malloc(sizeof(float) * 700), *got = malloc(sizeof(float) * 700);
    for (int n = 1; n <= 700; n += (n < 70 ? 1 : 37)) {
        const float spread = (float)(n % 5) * 50.0f + 1.0f;
        float max = -INFINITY;
        for (int i = 0; i < n; i++) {
            s[i] = randn(&rng) * spread;
            if (i % 7 == 3) s[i] = -INFINITY; /* masked positions */
            max = s[i] > max ? s[i] : max;
        }
        memcpy(ref, s, sizeof(float) * (size_t)n);
        const double sum = qi_k_exp_sum_ref(n, ref, max);
        double libm = 0.0;
        for (int i = 0; i < n; i++) libm += exp((double)s[i] - max);
        ck_assert_msg(fabs(sum - libm) <= 1e-6 * libm, "n=%d: sum %.9g, libm %.9g", n, sum, libm);
        for (int i = 0; i < n; i++)
            if (s[i] == -INFINITY) ck_assert_msg(ref[i] == 0.0f, "n=%d i=%d: exp(-inf) = %g", n, i, ref[i]);
        ck_assert_msg(qi_kernels_ref()->exp_sum == qi_k_exp_sum_ref, "the ref table's exp_sum");
        for (int k = 0; k < n_simd; k++) {
            memcpy(got, s, sizeof(float) * (size_t)n);
            const double gsum = simd[k]->exp_sum(n, got, max);
            ck_assert_msg(gsum == sum, "%s n=%d: sum %.17g vs %.17g", simd[k]->name, n, gsum, sum);
            for (int i = 0; i < n; i++)
                qi_check_msg(!memcmp(&ref[i], &got[i], sizeof(float)), "%s n=%d i=%d: %.9g vs %.9g", simd[k]->name,
                              n, i, ref[i], got[i]);
        }
    }
    free(s);
    free(ref);
    free(got);
}
END_TEST

START_TEST(test_swiglu_variants) {
    const qi_kernels *simd[2];
    const int n_simd = simd_tables(simd);
    uint64_t rng = 31337;
    static const int64_t sizes[] = {1, 7, 15, 16, 17, 33, 1536, 3077};
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        const int64_t n = sizes[si];
        float *g = malloc(sizeof(float) * (size_t)n), *u = malloc(sizeof(float) * (size_t)n);
        float *ref = malloc(sizeof(float) * (size_t)n), *got = malloc(sizeof(float) * (size_t)n);
        for (int64_t i = 0; i < n; i++) {
            /* every exp range: ordinary, overflow of exp(-x), underflow */
            const int kind = (int)(i % 4);
            g[i] = kind == 0 ? randn(&rng) * 4.0f : kind == 1 ? qi_test_randf(&rng) * 250.0f : randn(&rng) * 30.0f;
            u[i] = randn(&rng);
        }
        memcpy(ref, g, sizeof(float) * (size_t)n);
        qi_k_swiglu_ref(n, ref, u);
        for (int k = 0; k < n_simd; k++) {
            memcpy(got, g, sizeof(float) * (size_t)n);
            simd[k]->swiglu(n, got, u);
            const long d = first_diff(ref, got, n);
            ck_assert_msg(d < 0, "%s n=%lld i=%ld: x=%.9g: %.9g vs %.9g", simd[k]->name, (long long)n, d,
                          d >= 0 ? g[d] : 0.0f, d >= 0 ? ref[d] : 0.0f, d >= 0 ? got[d] : 0.0f);
        }
        free(g);
        free(u);
        free(ref);
        free(got);
    }
}
END_TEST

/* RoPE: both pair layouts, head sizes whose pair counts leave a remainder
 * for the vector loops (NORMAL's last n_pairs % 4 pairs are unfused), and a
 * partial rotation whose last elements must stay as they are. */
START_TEST(test_rope_variants) {
    const qi_kernels *simd[2];
    const int n_simd = simd_tables(simd);
    uint64_t rng = 4242;
    static const int shapes[][2] = {{64, 64}, {256, 256}, {6, 6}, {10, 8}, {128, 34}, {2, 2}, {80, 80}, {64, 30}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (int neox = 0; neox < 2; neox++)
            for (int n_heads = 1; n_heads <= 3; n_heads++) {
                const int D = shapes[si][0], n_pairs = shapes[si][1] / 2, n = n_heads * D;
                float *x = malloc(sizeof(float) * (size_t)n), *ref = malloc(sizeof(float) * (size_t)n);
                float *got = malloc(sizeof(float) * (size_t)n), cs[128], sn[128];
                for (int i = 0; i < n_pairs; i++) {
                    const float th = qi_test_randf(&rng) * 1000.0f;
                    cs[i] = cosf(th);
                    sn[i] = sinf(th);
                }
                for (int i = 0; i < n; i++) x[i] = randn(&rng) * (i % 3 ? 1.0f : 100.0f);
                memcpy(ref, x, sizeof(float) * (size_t)n);
                qi_k_rope_ref(ref, n_heads, D, n_pairs, neox, cs, sn);
                for (int h = 0; h < n_heads; h++)
                    for (int i = 2 * n_pairs; i < D; i++)
                        qi_check_msg(f32_bits(ref[h * D + i]) == f32_bits(x[h * D + i]), "head %d dim %d", h, i);
                for (int k = 0; k < n_simd; k++) {
                    memcpy(got, x, sizeof(float) * (size_t)n);
                    simd[k]->rope(got, n_heads, D, n_pairs, neox, cs, sn);
                    const long d = first_diff(ref, got, n);
                    ck_assert_msg(d < 0, "%s D=%d pairs=%d neox=%d heads=%d i=%ld: %.9g vs %.9g", simd[k]->name, D,
                                  n_pairs, neox, n_heads, d, d >= 0 ? ref[d] : 0.0f, d >= 0 ? got[d] : 0.0f);
                }
                free(x);
                free(ref);
                free(got);
            }
}
END_TEST

/* GeGLU: every fp16 input value, the branch edges, and ordinary floats
 * (which are rounded to fp16 for the lookup), SIMD against the reference. */
START_TEST(test_geglu_variants) {
    const qi_kernels *simd[2];
    const int n_simd = simd_tables(simd);
    uint64_t rng = 4242;
    const int64_t n = 65536 + 4099;
    float *g = malloc(sizeof(float) * n), *u = malloc(sizeof(float) * n);
    float *ref = malloc(sizeof(float) * n), *got = malloc(sizeof(float) * n);
    for (int64_t i = 0; i < 65536; i++) {
        g[i] = qi_fp16_to_f32((uint16_t)i);
        u[i] = randn(&rng);
    }
    static const float edges[] = {-10.0f, 10.0f, -10.000001f, 9.999999f, -9.999999f, 10.000001f, 65504.0f, -70000.0f};
    for (int64_t i = 65536; i < n; i++) {
        const int64_t k = i - 65536;
        g[i] = k < 8 ? edges[k] : randn(&rng) * (k % 3 ? 3.0f : 12.0f);
        u[i] = randn(&rng);
    }
    memcpy(ref, g, sizeof(float) * n);
    qi_k_geglu_ref(n, ref, u);
    for (int k = 0; k < n_simd; k++)
        for (int64_t off = 0; off < 3; off++) { /* odd starts and lengths */
            memcpy(got, g, sizeof(float) * n);
            simd[k]->geglu(n - off * 5, got + off, u + off);
            for (int64_t i = 0; i < off; i++) got[i] = ref[i];
            for (int64_t i = n - off * 5 + off; i < n; i++) got[i] = ref[i];
            /* the shifted call must equal the reference element by element */
            float *want = malloc(sizeof(float) * n);
            memcpy(want, g, sizeof(float) * n);
            qi_k_geglu_ref(n - off * 5, want + off, u + off);
            for (int64_t i = 0; i < off; i++) want[i] = ref[i];
            for (int64_t i = n - off * 5 + off; i < n; i++) want[i] = ref[i];
            long d = -1;
            for (int64_t i = 0; i < n && d < 0; i++)
                if (memcmp(&want[i], &got[i], 4) && !(isnan(want[i]) && isnan(got[i]))) d = (long)i;
            qi_check_msg(d < 0, "%s off=%lld i=%ld: x=%.9g: %.9g vs %.9g", simd[k]->name, (long long)off, d,
                          d >= 0 ? g[d] : 0.0f, d >= 0 ? want[d] : 0.0f, d >= 0 ? got[d] : 0.0f);
            free(want);
        }
    free(g);
    free(u);
    free(ref);
    free(got);
}
END_TEST

/* The GELU table against values read back from ggml's own geglu op (u = 1),
 * the branches, and a double-precision gelu_tanh to within fp16 rounding. */
START_TEST(test_geglu_numerics) {
    static const float from_ggml[][2] = {
        {-0x1.3fae14p+3f, -0x0p+0f}, {-0x1.8p+1f, -0x1.dccp-9f},    {-0x1p+0f, -0x1.454p-3f},
        {-0x1p-1f, -0x1.3cp-3f},     {-0x1.0624dep-10f, -0x1.06p-11f}, {0x0p+0f, 0x0p+0f},
        {0x1.0624dep-10f, 0x1.068p-11f}, {0x1p-1f, 0x1.62p-2f},    {0x1p+0f, 0x1.aecp-1f},
        {0x1.8p+0f, 0x1.664p+0f},    {0x1p+1f, 0x1.f48p+0f},       {0x1.8p+1f, 0x1.7f8p+1f},
        {0x1.3fae14p+3f, 0x1.3fcp+3f},
    };
    for (size_t i = 0; i < sizeof from_ggml / sizeof from_ggml[0]; i++) {
        float x = from_ggml[i][0];
        const float one = 1.0f;
        qi_k_geglu_ref(1, &x, &one);
        ck_assert_msg(memcmp(&x, &from_ggml[i][1], 4) == 0, "gelu(%a) = %a, ggml %a", from_ggml[i][0], x,
                      from_ggml[i][1]);
    }
    float x[4] = {-10.0f, -1e6f, 10.0f, 1e6f}, u[4] = {3.0f, 3.0f, 0.5f, -2.0f};
    qi_k_geglu_ref(4, x, u);
    ck_assert(x[0] == 0.0f && !signbit(x[0]) && x[1] == 0.0f);
    ck_assert(x[2] == 5.0f && x[3] == -2e6f);
    const uint16_t *tab = qi_k_gelu_table();
    for (uint32_t h = 0; h < 65536; h++) {
        const float xf = qi_fp16_to_f32((uint16_t)h);
        if (!(fabsf(xf) < 10.0f)) continue;
        const double xd = xf, want = 0.5 * xd * (1.0 + tanh(0.7978845608028654 * xd * (1.0 + 0.044715 * xd * xd)));
        const double got = qi_fp16_to_f32(tab[h]);
        /* one fp16 rounding (half an ulp of 2^-10 relative) plus float tanh noise near the zero of 1 + tanh */
        ck_assert_msg(fabs(got - want) <= 1e-3 * fabs(want) + 1e-6, "x=%g: %.9g vs %.9g", xf, got, want);
    }
}
END_TEST

/* A sweep of exp inputs through the SIMD exp, via SwiGLU with u = 1. */
START_TEST(test_exp_sweep_variants) {
    const qi_kernels *simd[2];
    const int n_simd = simd_tables(simd);
    const int64_t n = 64000;
    float *x = malloc(sizeof(float) * n), *one = malloc(sizeof(float) * n);
    float *ref = malloc(sizeof(float) * n), *got = malloc(sizeof(float) * n);
    for (int64_t i = 0; i < n; i++) {
        x[i] = -200.0f + 400.0f * (float)i / (float)n; /* exp(-x) over [-200, 200] */
        one[i] = 1.0f;
    }
    memcpy(ref, x, sizeof(float) * n);
    qi_k_swiglu_ref(n, ref, one);
    for (int k = 0; k < n_simd; k++) {
        memcpy(got, x, sizeof(float) * n);
        simd[k]->swiglu(n, got, one);
        const long d = first_diff(ref, got, n);
        ck_assert_msg(d < 0, "%s x=%.9g: %.9g vs %.9g", simd[k]->name, d >= 0 ? x[d] : 0.0f,
                      d >= 0 ? ref[d] : 0.0f, d >= 0 ? got[d] : 0.0f);
    }
    free(x);
    free(one);
    free(ref);
    free(got);
}
END_TEST

/* ggml_v_expf against libm: within 3 ulp where the result is normal (the
 * AVX-512 variant adds its constant 1 with a rounding that ggml's other
 * variants avoid; 2.14 ulp is the worst seen on this sweep), exact
 * special values, underflow to 0 and overflow to infinity at the edges. */
START_TEST(test_expf_accuracy) {
    double worst = 0.0;
    for (float x = -87.0f; x <= 88.0f; x += 0.0137f) {
        const float e = qi_k_expf_ref(x);
        const double want = exp((double)x);
        const double ulp = ldexp(1.0, ilogb(want) - 23);
        const double err = fabs((double)e - want) / ulp;
        if (err > worst) worst = err;
        ck_assert_msg(err <= 3.0, "exp(%.9g) = %.9g, %.2f ulp off", x, e, err);
    }
    ck_assert_msg(worst > 0.0, "suspiciously exact");
    ck_assert(qi_k_expf_ref(0.0f) == 1.0f);
    ck_assert(qi_k_expf_ref(-INFINITY) == 0.0f);
    ck_assert(qi_k_expf_ref(INFINITY) == INFINITY);
    ck_assert(isnan(qi_k_expf_ref(NAN)));
    ck_assert(qi_k_expf_ref(-150.0f) == 0.0f);
    ck_assert(qi_k_expf_ref(100.0f) == INFINITY);
    /* the subnormal range is rounded once, like vscalefps */
    const float sub = qi_k_expf_ref(-100.0f);
    ck_assert_msg(sub > 0.0f && sub < 1.2e-38f && fabs(sub - exp(-100.0)) <= ldexp(1.0, -149),
                  "exp(-100) = %g", sub);
}
END_TEST

START_TEST(test_hsum_trees) {
    /* 2^24 + 1 + 1 ...: the tree decides which ones survive rounding */
    float a[16];
    for (int i = 0; i < 16; i++) a[i] = 1.0f;
    a[0] = 16777216.0f;
    /* hsum8: a0 + a4 ties to even and drops its 1; the other pairs are 2
     * each and survive: 2^24 + 6 (a left-to-right sum would give 2^24) */
    ck_assert(qi_k_hsum8_ref(a) == 16777216.0f + 6.0f);
    /* hsum16: t0 = a0 + a8 loses 1, the rest pair up exactly */
    ck_assert(qi_k_hsum16_ref(a) == 16777216.0f + 14.0f);
}
END_TEST


/* ---- packed weights ------------------------------------------------------------------ */

static const uint32_t k_packed_types[] = {QI_TYPE_Q4_0, QI_TYPE_Q4_1, QI_TYPE_Q8_0, QI_TYPE_Q5_0, QI_TYPE_Q5_1};
#define N_PACKED_TYPES 5

/* One packed matmul case: n_w random weight rows of n elements (packed
 * into groups) x n_a quantised activation rows, through every table's
 * gemm_packed, each result bit-identical to the packed-order reference dot
 * on the plain rows, the two guard slots after each token's n_w results
 * untouched. Returns how many of the first token's results differ from the
 * x86-order reference (counted for n <= 1536 only). */
static long packed_case(uint32_t t, int64_t n, int n_w, int n_a, int raw0, uint64_t *rng) {
    const qi_kernels *tabs[3] = {qi_kernels_ref()};
    const int n_tabs = 1 + simd_tables(tabs + 1);
    const uint32_t at = qi_vec_dot_type(t);
    const size_t wb = qi_row_bytes(t, n), ab = qi_row_bytes(at, n);
    const size_t gb = (size_t)qi_k_pack_group_bytes(t, n);
    const int n_g = (n_w + QI_K_PACK_ROWS - 1) / QI_K_PACK_ROWS;
    const size_t ys = (size_t)n_w + 2;
    long order_diffs = 0;
    ck_assert_uint_eq(gb, QI_K_PACK_ROWS * wb);
    char *w = malloc(wb * (size_t)n_w), *a = malloc(ab * (size_t)n_a), *pk = malloc(gb * (size_t)n_g);
    float *x = malloc(sizeof(float) * (size_t)n);
    float *ref = malloc(sizeof(float) * ys * (size_t)n_a), *got = malloc(sizeof(float) * ys * (size_t)n_a);
    ck_assert(w && a && pk && x && ref && got);
    for (int r = 0; r < n_w; r++) make_weights(rng, t, n, w + (size_t)r * wb, (raw0 + r) & 1);
    for (int g = 0; g < n_g; g++) {
        const int rows = n_w - g * QI_K_PACK_ROWS < QI_K_PACK_ROWS ? n_w - g * QI_K_PACK_ROWS : QI_K_PACK_ROWS;
        qi_k_pack_group(t, n, w + (size_t)g * QI_K_PACK_ROWS * wb, wb, rows, pk + (size_t)g * gb);
    }
    for (int j = 0; j < n_a; j++) {
        fill_row(rng, x, n, (int)(qi_test_rand(rng) % 4));
        qi_quantize_act_row(at, x, a + (size_t)j * ab, n);
    }
    for (int j = 0; j < n_a; j++)
        for (int r = 0; r < n_w; r++)
            ref[(size_t)j * ys + r] = qi_k_dot_packed_ref(t, n, w + (size_t)r * wb, a + (size_t)j * ab);
    for (int k = 0; k < n_tabs; k++) {
        qi_k_gemm_fn f = tabs[k]->gemm_packed[t];
        ck_assert_msg(f != NULL, "%s lacks packed %s", tabs[k]->name, qi_type_get(t)->name);
        for (size_t i = 0; i < ys * (size_t)n_a; i++) got[i] = -12345.0f;
        f(n, pk, gb, n_w, a, ab, n_a, got, ys);
        for (int j = 0; j < n_a; j++) {
            for (int r = 0; r < n_w; r++) {
                const size_t i = (size_t)j * ys + (size_t)r;
                qi_check_msg(same_float(ref[i], got[i]), "%s packed %s n=%lld %dx%d: token %d row %d: ref %.9g, got %.9g",
                              tabs[k]->name, qi_type_get(t)->name, (long long)n, n_w, n_a, j, r, ref[i], got[i]);
            }
            for (int r = n_w; r < n_w + 2; r++)
                qi_check_msg(got[(size_t)j * ys + r] == -12345.0f, "%s packed %s: guard %d,%d overwritten",
                              tabs[k]->name, qi_type_get(t)->name, j, r);
        }
    }
    if (n <= 1536) {
        float x86[1];
        for (int r = 0; r < n_w; r++) {
            qi_kernels_ref()->gemm[t](n, w + (size_t)r * wb, wb, 1, a, ab, 1, x86, 1);
            order_diffs += !same_float(x86[0], ref[r]);
        }
    }
    free(w);
    free(a);
    free(pk);
    free(x);
    free(ref);
    free(got);
    return order_diffs;
}

/* Every table's gemm_packed against the packed-order reference dot:
 * bit-identical, for 1..40 rows (partial groups and several groups), 1..40
 * tokens (passes of 16 and every partial pass), one block to past the
 * prepared-scale limit (16384 elements). Also: the packed order is not
 * llama.cpp's (some results differ from the x86-order reference on the
 * same data), so the check could tell the two apart. */
START_TEST(test_gemm_packed_variants) {
    const uint32_t t = k_packed_types[_i];
    static const int64_t sizes[] = {32, 64, 96, 576, 1536, 16416};
    uint64_t rng = 0x51ed27ull + t;
    long order_diffs = 0;
    ck_assert(qi_k_pack_supported(t));
    for (int si = 0; si < 6; si++) {
        const int64_t n = sizes[si];
        for (int rep = 0; rep < (n > 4096 ? 2 : 6); rep++) {
            const int n_w = rep == 0 ? 16 : rep == 1 ? 1 : 1 + (int)(qi_test_rand(&rng) % 40);
            const int n_a = rep == 0 ? 16 : rep == 1 ? 1 : 1 + (int)(qi_test_rand(&rng) % 40);
            order_diffs += packed_case(t, n, n_w, n_a, rep, &rng);
        }
    }
    ck_assert_msg(order_diffs > 0, "packed %s: the packed order never differed from llama.cpp's", qi_type_get(t)->name);
}
END_TEST

/* The same, over a fixed grid of awkward shapes: rows that end a group's
 * first or second half early (1, 7, 8, 9, 15, 17, 24, 33), every token
 * count of a pass and the next (1..17, 31, 32, 33), one, three and 18
 * blocks. And every SIMD table has packed kernels of its own, so the
 * comparison is not the reference against itself. */
START_TEST(test_gemm_packed_shapes) {
    const uint32_t t = k_packed_types[_i];
    static const int64_t sizes[] = {32, 96, 576};
    static const int rows[] = {1, 7, 8, 9, 15, 17, 24, 33};
    static const int toks[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 31, 32, 33};
    uint64_t rng = 0x9ac4e1ull + t;
    const qi_kernels *simd[2];
    const int n_simd = simd_tables(simd);
    for (int k = 0; k < n_simd; k++)
        ck_assert_msg(simd[k]->gemm_packed[t] != qi_kernels_ref()->gemm_packed[t],
                      "%s's packed %s is the reference's", simd[k]->name, qi_type_get(t)->name);
    for (int si = 0; si < 3; si++)
        for (int ri = 0; ri < (int)(sizeof rows / sizeof rows[0]); ri++)
            for (int ti = 0; ti < (int)(sizeof toks / sizeof toks[0]); ti++)
                packed_case(t, sizes[si], rows[ri], toks[ti], ri + ti, &rng);
}
END_TEST

/* ---- activation quantisation -------------------------------------------------------- */

START_TEST(test_quantize_q8_variants) {
    const qi_kernels *simd[2];
    const int n_simd = simd_tables(simd);
    uint64_t rng = 2718;
    static const int64_t sizes[] = {32, 64, 96, 576, 2048};
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++)
        for (int with_sum = 0; with_sum < 2; with_sum++)
            for (int rep = 0; rep < 8; rep++) {
                const int64_t n = sizes[si];
                const size_t bytes = qi_row_bytes(with_sum ? QI_TYPE_Q8_1 : QI_TYPE_Q8_0, n);
                float *x = malloc(sizeof(float) * (size_t)n);
                unsigned char *ref = malloc(bytes), *got = malloc(bytes);
                fill_row(&rng, x, n, rep % 4);
                if (rep == 5) /* halves after scaling: amax 127 makes the inverse 1 */
                    for (int64_t i = 0; i < n; i++) x[i] = i % 32 == 0 ? 127.0f : (float)(i % 7) - 3.5f;
                qi_k_quantize_q8_ref(x, ref, n, with_sum);
                for (int k = 0; k < n_simd; k++) {
                    memset(got, 0xa5, bytes);
                    simd[k]->quantize_q8(x, got, n, with_sum);
                    for (size_t i = 0; i < bytes; i++)
                        qi_check_msg(ref[i] == got[i], "%s n=%lld sum=%d rep %d: byte %zu: %02x vs %02x",
                                      simd[k]->name, (long long)n, with_sum, rep, i, ref[i], got[i]);
                }
                free(x);
                free(ref);
                free(got);
            }
}
END_TEST

/* Every fp16 value, zeros, subnormals, infinities and NaNs included, at
 * every offset of a vector and its tail. */
START_TEST(test_f16_to_f32_variants) {
    const qi_kernels *simd[2];
    const int n_simd = simd_tables(simd);
    const int64_t n = 65536 + 7;
    uint16_t *x = malloc(sizeof(uint16_t) * (size_t)n);
    float *ref = malloc(sizeof(float) * (size_t)n), *got = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) x[i] = (uint16_t)(i * 40503u);
    qi_k_f16_to_f32_ref(x, ref, n);
    for (int k = 0; k < n_simd; k++)
        for (int64_t len = n - 9; len <= n; len++) {
            for (int64_t i = 0; i < n; i++) got[i] = -7.0f;
            simd[k]->f16_to_f32(x, got, len);
            for (int64_t i = 0; i < n; i++) {
                const float want = i < len ? ref[i] : -7.0f;
                qi_check_msg(memcmp(&want, &got[i], sizeof(float)) == 0, "%s n=%lld: element %lld (%04x): %a vs %a",
                              simd[k]->name, (long long)len, (long long)i, x[i], want, got[i]);
            }
        }
    free(x);
    free(ref);
    free(got);
}
END_TEST

/* Every float class: all exponents with random mantissas, the exact
 * halfway points between fp16 neighbours (ties to even), the subnormal
 * and overflow edges, infinities and NaNs with payloads. */
START_TEST(test_f32_to_f16_variants) {
    const qi_kernels *simd[2];
    const int n_simd = simd_tables(simd);
    const int64_t n = 70000 + 5;
    float *x = malloc(sizeof(float) * (size_t)n);
    uint16_t *ref = malloc(sizeof(uint16_t) * (size_t)n), *got = malloc(sizeof(uint16_t) * (size_t)n);
    uint64_t rng = 0xf16f16ull;
    for (int64_t i = 0; i < n; i++) {
        uint32_t b = (uint32_t)qi_test_rand(&rng);
        switch (i % 5) {
        case 0: break;                                                   /* any bit pattern */
        case 1: b = (b & 0x807fffffu) | (uint32_t)(96 + i % 48) << 23; break; /* around fp16's range */
        case 2: b = (b & 0x80000000u) | (uint32_t)(102 + i % 40) << 23 | 0x1000u | (b & 0x3fe000u); break; /* ties */
        case 3: b = (b & 0x80000000u) | (0x477fe000u + (b & 0x3fffu)); break; /* the overflow edge */
        default: b = (b & 0x80000000u) | (0x33000000u + (b & 0xffffffu)); break; /* the subnormal edge */
        }
        memcpy(&x[i], &b, sizeof b);
    }
    const float specials[] = {INFINITY, -INFINITY, NAN, -NAN, 65504.0f, 65519.99f, 65520.0f, 0x1p-24f, 0x1p-25f, 0x1.8p-25f, -0.0f};
    for (size_t i = 0; i < sizeof specials / sizeof specials[0]; i++) x[100 + i] = specials[i];
    const uint32_t payload_nan = 0x7fa00001u;
    memcpy(&x[120], &payload_nan, sizeof payload_nan);
    qi_k_f32_to_f16_ref(x, ref, n);
    for (int k = 0; k < n_simd; k++)
        for (int64_t len = n - 9; len <= n; len++) {
            for (int64_t i = 0; i < n; i++) got[i] = 0x1234;
            simd[k]->f32_to_f16(x, got, len);
            for (int64_t i = 0; i < n; i++) {
                const uint16_t want = i < len ? ref[i] : 0x1234;
                qi_check_msg(want == got[i], "%s n=%lld: element %lld (%a): %04x vs %04x", simd[k]->name,
                              (long long)len, (long long)i, (double)x[i], want, got[i]);
            }
        }
    free(x);
    free(ref);
    free(got);
}
END_TEST

/* The run-time quantiser rounds halves to even, where the format's
 * reference (quant.c) rounds them away from zero: the test above is fed
 * ties, and here is proof that the two conventions really differ on them. */
START_TEST(test_quantize_q8_ties) {
    float x[32];
    for (int i = 0; i < 32; i++) x[i] = (float)(i % 7) - 3.5f;
    x[0] = 127.0f;
    qi_block_q8_0 rt, fmt;
    qi_k_quantize_q8_ref(x, &rt, 32, 0);
    qi_quantize_row_ref(QI_TYPE_Q8_0, x, &fmt, 32);
    /* element 1 is -2.5: even -> -2, away from zero -> -3 */
    ck_assert_int_eq(rt.qs[1], -2);
    ck_assert_int_eq(fmt.qs[1], -3);
    ck_assert_int_eq(rt.qs[4], 0); /* 0.5 -> 0 */
}
END_TEST

/* ---- dispatch ------------------------------------------------------------------------ */

START_TEST(test_dispatch_sane) {
    const qi_kernels *k = qi_kernels_get();
    ck_assert_ptr_nonnull(k);
    ck_assert(!strcmp(k->name, "ref") || !strcmp(k->name, "avx2") || !strcmp(k->name, "avx512") ||
              !strcmp(k->name, "amx"));
    ck_assert_ptr_nonnull(k->attn_scores);
    ck_assert_ptr_nonnull(k->attn_values);
    ck_assert_ptr_nonnull(k->softmax_f16);
    ck_assert_ptr_nonnull(k->exp_sum);
    ck_assert_ptr_nonnull(k->swiglu);
    ck_assert_ptr_nonnull(k->geglu);
    ck_assert_ptr_nonnull(k->quantize_q8);
    ck_assert_ptr_nonnull(k->f16_to_f32);
    ck_assert_ptr_nonnull(k->f32_to_f16);
    for (int i = 0; i < N_DOT_TYPES; i++) ck_assert_ptr_nonnull(k->gemm[k_dot_types[i]]);
    const char *f = getenv("QI_FORCE_REF");
    if (!(f && *f && strcmp(f, "0"))) {
        if (qi_kernels_amx()) ck_assert_str_eq(k->name, "amx");
        else if (qi_kernels_avx512()) ck_assert_str_eq(k->name, "avx512");
        else if (qi_kernels_avx2()) ck_assert_str_eq(k->name, "avx2");
        else ck_assert_str_eq(k->name, "ref");
    }
    ck_assert_ptr_eq(qi_kernels_get(), k); /* chosen once */
    /* only types with an x86-order kernel are in the tables */
    for (uint32_t t = 0; t < QI_TYPE_COUNT; t++) {
        int listed = 0;
        for (int i = 0; i < N_DOT_TYPES; i++) listed |= k_dot_types[i] == t;
        if (!listed) ck_assert_ptr_null(qi_kernels_ref()->gemm[t]);
    }
}
END_TEST

/* Runs in its own forked process (the choice is made once per process). */
START_TEST(test_force_ref) {
    const char *fork = getenv("CK_FORK");
    if (fork && !strcmp(fork, "no")) return; /* the choice was made by an earlier test */
    setenv("QI_FORCE_REF", "1", 1);
    ck_assert_str_eq(qi_kernels_get()->name, "ref");
}
END_TEST

static Suite *kernels_suite(void) {
    Suite *s = suite_create("kernels");
    TCase *tc = tcase_create("golden");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, test_golden_block_dots, 0, N_DOT_TYPES);
    tcase_add_test(tc, test_golden_f16_dot);
    tcase_add_test(tc, test_golden_k_matmul);
    tcase_add_test(tc, test_planted_generic_order);
    tcase_add_test(tc, test_planted_order_sensitivity);
    suite_add_tcase(s, tc);

    tc = tcase_create("variants");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, test_gemm_variants, 0, N_DOT_TYPES);
    tcase_add_test(tc, test_gemm_ref_is_dot_ref);
    tcase_add_loop_test(tc, test_gemm_packed_variants, 0, N_PACKED_TYPES);
    tcase_add_loop_test(tc, test_gemm_packed_shapes, 0, N_PACKED_TYPES);
    tcase_add_loop_test(tc, test_attn_scores_variants, 0, N_DIMS);
    tcase_add_loop_test(tc, test_attn_values_variants, 0, N_DIMS);
    tcase_add_loop_test(tc, test_attn_values_blocks, 0, N_DIMS);
    tcase_add_test(tc, test_softmax_variants);
    tcase_add_test(tc, test_exp_sum_variants);
    tcase_add_test(tc, test_swiglu_variants);
    tcase_add_test(tc, test_rope_variants);
    tcase_add_test(tc, test_exp_sweep_variants);
    tcase_add_test(tc, test_geglu_variants);
    tcase_add_test(tc, test_quantize_q8_variants);
    tcase_add_test(tc, test_quantize_q8_ties);
    tcase_add_test(tc, test_f16_to_f32_variants);
    tcase_add_test(tc, test_f32_to_f16_variants);
    suite_add_tcase(s, tc);

    tc = tcase_create("numerics");
    tcase_add_test(tc, test_expf_accuracy);
    tcase_add_test(tc, test_hsum_trees);
    tcase_add_test(tc, test_geglu_numerics);
    suite_add_tcase(s, tc);

    tc = tcase_create("dispatch");
    tcase_add_test(tc, test_dispatch_sane);
    tcase_add_test(tc, test_force_ref);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    /* loaded once here; forked test processes inherit the parsed cases */
    if (!load_golden_dots()) fprintf(stderr, "test_kernels: %s\n", g_load_err);
    /* which variants this CPU let the suite hold to the reference */
    const qi_kernels *t[2];
    const int n = simd_tables(t);
    /* (not qi_kernels_get(): test_force_ref needs the choice still unmade) */
    printf("test_kernels: SIMD variants covered on this CPU: %s%s%s%s\n", n ? "" : "none", n ? t[0]->name : "",
           n > 1 ? ", " : "", n > 1 ? t[1]->name : "");
    if (n < 2) printf("test_kernels: variants this CPU cannot run were not covered: %s%s\n",
                      qi_kernels_avx2() ? "" : "avx2 ", qi_kernels_avx512() ? "" : "avx512");
    fflush(stdout);
    SRunner *sr = srunner_create(kernels_suite());
    srunner_run_all(sr, CK_NORMAL);
    const int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

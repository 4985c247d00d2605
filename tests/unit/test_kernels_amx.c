/* test_kernels_amx.c - the AMX K-quant matmuls (kernels_amx.c) against the
 * tiled references, bit for bit.
 *
 * gemm_wide q4_K and q6_K of the amx table must equal the reference
 * table's gemm_wide (qi_k_dot_q4_K_tiled_ref, qi_k_dot_q6_K_tiled_ref) on
 * every shape class of the tile code: 1 to 40 weight rows (one 16-row
 * group, partial groups, several), 8 to 530 tokens (one or more 16-token
 * tiles, partial tiles, several passes over the rows), rows of 1 to 35
 * super-blocks, quantised
 * Gaussian weights and raw random block bytes (every code and scale), and
 * activations with huge outliers. Outputs are strided with guard slots that
 * must survive. gemm_wide_packed over the weights packed in 16-row groups
 * (qi_k_amx_pack_group) must give the same outputs, bit for bit. llama.cpp's recorded results for the tiled order are held
 * by test_kernels' golden test, which runs this table too.
 *
 * Planted fault: ggml's order (gemm, not gemm_wide) differs from the
 * tiled one on these inputs, so the comparison can fail.
 *
 * Without AMX (or without the kernel's permission for the tile state) the
 * test exits 77 with the reason.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "qinfer/quant.h"
#include "quant_act.h"
#include "testutil.h"

static const uint32_t k_types[2] = {QI_TYPE_Q4_K, QI_TYPE_Q6_K};

static int same_float(float a, float b) {
    uint32_t x, y;
    memcpy(&x, &a, 4);
    memcpy(&y, &b, 4);
    return x == y || (isnan(a) && isnan(b));
}

static void fill(uint64_t *s, float *x, int64_t n, float scale, int outliers) {
    for (int64_t i = 0; i < n; i++) x[i] = qi_test_randf(s) * scale;
    for (int k = 0; k < outliers; k++) x[qi_test_rand(s) % (uint64_t)n] = 2.2e4f * qi_test_randf(s);
}

/* A weight row: quantised uniform data, or (raw) random block bytes with
 * finite fp16 scales, which reach every code and sub-block scale. */
static void make_row(uint64_t *s, uint32_t t, int64_t n, void *w, int raw, float *x) {
    if (!raw) {
        fill(s, x, n, 1.0f, 0);
        qi_quantize_row_ref(t, x, w, n);
        return;
    }
    const size_t bytes = qi_row_bytes(t, n), bs = qi_type_get(t)->size;
    unsigned char *p = w;
    for (size_t i = 0; i < bytes; i++) p[i] = (unsigned char)qi_test_rand(s);
    for (size_t b = 0; b < bytes; b += bs) {
        const uint16_t d = qi_f32_to_fp16(qi_test_randf(s) * 0.02f), m = qi_f32_to_fp16(qi_test_randf(s) * 0.1f);
        memcpy(p + b + (t == QI_TYPE_Q6_K ? bs - 2 : 0), &d, 2);
        if (t == QI_TYPE_Q4_K) memcpy(p + b + 2, &m, 2);
    }
}

/* The first index where a and b differ, or -1. */
static long first_diff(const float *a, const float *b, long n) {
    for (long i = 0; i < n; i++)
        if (!same_float(a[i], b[i])) return i;
    return -1;
}

typedef struct {
    int64_t n;
    int n_w, n_a;
} shape;

static const shape k_shapes[] = {
    {256, 1, 8},   {256, 16, 16},  {512, 17, 9},    {1536, 16, 32}, {1536, 40, 33},
    {256 * 12, 5, 15}, {256 * 13, 33, 17}, {256 * 35, 16, 8}, {256 * 25, 3, 40}, {768, 32, 24},
    {256 * 35, 17, 130}, /* two passes of the tokens whose quants fit ACT_BYTES */
    {256, 3, 530},       /* more tokens than a row group's running sums hold (TB) */
};
#define N_SHAPES (int)(sizeof k_shapes / sizeof k_shapes[0])

/* Runs gemm_wide of the reference and of `k` (amx) on one shape; returns
 * the number of outputs where `other` (when not NULL) differs from the
 * reference, for the planted fault. */
static long run_shape(uint32_t t, const shape *sh, uint64_t *rng, int raw, qi_k_gemm_fn other) {
    const int64_t n = sh->n;
    const int n_w = sh->n_w, n_a = sh->n_a;
    const size_t wb = qi_row_bytes(t, n), ab = qi_row_bytes(QI_TYPE_Q8_K, n);
    const size_t ys = (size_t)n_w + 2; /* two guard slots per token */
    char *w = malloc(wb * (size_t)n_w), *a = malloc(ab * (size_t)n_a);
    float *x = malloc(sizeof(float) * (size_t)n);
    float *ref = malloc(sizeof(float) * ys * (size_t)n_a), *got = malloc(sizeof(float) * ys * (size_t)n_a);
    for (int r = 0; r < n_w; r++) make_row(rng, t, n, w + (size_t)r * wb, raw, x);
    for (int j = 0; j < n_a; j++) {
        fill(rng, x, n, j % 3 == 2 ? 30.0f : 1.0f, j % 3 == 1 ? 3 : 0);
        qi_quantize_act_row(QI_TYPE_Q8_K, x, a + (size_t)j * ab, n);
    }
    for (size_t i = 0; i < ys * (size_t)n_a; i++) ref[i] = got[i] = -12345.0f;
    qi_kernels_ref()->gemm_wide[t](n, w, wb, n_w, a, ab, n_a, ref, ys);
    long diffs = 0;
    if (other) {
        other(n, w, wb, n_w, a, ab, n_a, got, ys);
        for (size_t i = 0; i < ys * (size_t)n_a; i++) diffs += !same_float(ref[i], got[i]);
    } else {
        qi_kernels_amx()->gemm_wide[t](n, w, wb, n_w, a, ab, n_a, got, ys);
        const long d = first_diff(ref, got, (long)(ys * (size_t)n_a));
        qi_check_msg(d < 0, "amx %s%s n=%lld %dx%d: token %ld row %ld: ref %.9g, got %.9g", qi_type_get(t)->name,
                      raw ? " (raw)" : "", (long long)n, n_w, n_a, d / (long)ys, d % (long)ys, d >= 0 ? ref[d] : 0.0f,
                      d >= 0 ? got[d] : 0.0f);
        for (int j = 0; j < n_a; j++)
            for (int r = n_w; r < n_w + 2; r++)
                qi_check_msg(got[(size_t)j * ys + r] == -12345.0f, "amx %s: guard %d,%d overwritten",
                              qi_type_get(t)->name, j, r);
        /* the packed form: the same outputs from the groups, bit for bit */
        const uint64_t gb = qi_k_amx_pack_group_bytes(t, n);
        const int ng = (n_w + QI_K_PACK_ROWS - 1) / QI_K_PACK_ROWS;
        char *pk = aligned_alloc(64, (size_t)gb * (size_t)ng);
        ck_assert(gb % 64 == 0 && pk);
        for (int g = 0; g < ng; g++) {
            const int rows = n_w - g * QI_K_PACK_ROWS < QI_K_PACK_ROWS ? n_w - g * QI_K_PACK_ROWS : QI_K_PACK_ROWS;
            qi_k_amx_pack_group(t, n, w + (size_t)g * QI_K_PACK_ROWS * wb, wb, rows, pk + (size_t)g * gb);
        }
        for (size_t i = 0; i < ys * (size_t)n_a; i++) got[i] = -12345.0f;
        qi_kernels_amx()->gemm_wide_packed[t](n, pk, gb, n_w, a, ab, n_a, got, ys);
        const long dp = first_diff(ref, got, (long)(ys * (size_t)n_a));
        qi_check_msg(dp < 0, "amx packed %s%s n=%lld %dx%d: token %ld row %ld: ref %.9g, got %.9g",
                      qi_type_get(t)->name, raw ? " (raw)" : "", (long long)n, n_w, n_a, dp / (long)ys, dp % (long)ys,
                      dp >= 0 ? ref[dp] : 0.0f, dp >= 0 ? got[dp] : 0.0f);
        free(pk);
    }
    free(w);
    free(a);
    free(x);
    free(ref);
    free(got);
    return diffs;
}

START_TEST(test_amx_equals_tiled_ref) {
    const uint32_t t = k_types[_i / 2];
    const int raw = _i % 2;
    uint64_t rng = 0x51ed270b27a1c3f5ull + (uint64_t)_i;
    const int quick = qi_test_quick();
    for (int si = 0; si < N_SHAPES; si++) {
        if (quick && k_shapes[si].n > 256 * 13) continue;
        run_shape(t, &k_shapes[si], &rng, raw, NULL);
    }
}
END_TEST

START_TEST(test_planted_order) {
    for (int k = 0; k < 2; k++) {
        uint64_t rng = 77 + (uint64_t)k;
        const shape sh = {1536, 16, 16};
        const long d = run_shape(k_types[k], &sh, &rng, 0, qi_kernels_ref()->gemm[k_types[k]]);
        ck_assert_msg(d > 0, "%s: ggml's order equals the tiled one on every output: the comparison cannot fail",
                      qi_type_get(k_types[k])->name);
    }
}
END_TEST

static Suite *amx_suite(void) {
    Suite *s = suite_create("kernels_amx");
    TCase *tc = tcase_create("amx");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, test_amx_equals_tiled_ref, 0, 4);
    tcase_add_test(tc, test_planted_order);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    const char *why = qi_kernels_amx_absent();
    if (why) {
        printf("test_kernels_amx: skipped: %s\n", why);
        return 77;
    }
    return qi_test_run_suite(amx_suite());
}

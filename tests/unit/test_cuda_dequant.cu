/* test_cuda_dequant.cu - the CUDA kernels' format decoding
 * (engine/backend/cuda/dequant.cuh), run on the host: no GPU needed.
 *
 * The decoders are __host__ __device__, so the code the kernels run is
 * checked here against the CPU reference (qi_dequantize_row_ref) bit for
 * bit, on random blocks of every weight type. The fp16 scales of the
 * blocks are random finite values (the reference's NaN/inf scales are
 * not a case the formats produce); the quant bytes are fully random.
 * The factored matrix-vector step (qd_group_dot, what the decode kernel
 * accumulates) is checked against a double-precision dot product of the
 * reference rows, within a float tolerance.
 *
 * A plain main (no test framework): one line per check, exit status 1 on
 * any failure. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/dequant.cuh"

extern "C" {
#include "qinfer/quant.h"
}

static int g_fail = 0;

static void report(const char *what, long checked, long bad) {
    printf("%-28s %s (%ld checked, %ld mismatched)\n", what, bad ? "FAIL" : "ok", checked, bad);
    if (bad) g_fail = 1;
}

/* xorshift64*: reproducible random bytes */
static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static uint32_t rnd32(void) {
    g_rng ^= g_rng >> 12;
    g_rng ^= g_rng << 25;
    g_rng ^= g_rng >> 27;
    return (uint32_t)((g_rng * 0x2545f4914f6cdd1dull) >> 32);
}

/* A random finite fp16 (any finite bit pattern: subnormals included) */
static uint16_t rnd_half_finite(void) {
    for (;;) {
        const uint16_t h = (uint16_t)rnd32();
        if (((h >> 10) & 0x1f) != 0x1f) return h;
    }
}

/* A random fp16 of moderate magnitude (for the dot products) */
static uint16_t rnd_half_moderate(void) {
    const float v = ((float)(rnd32() % 2001) - 1000.0f) / 1000.0f;
    return qi_f32_to_fp16(v);
}

static void put16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }

struct fmt {
    uint32_t type;
    const char *name;
    int qk, bytes;
    int scale_off[2]; /* offsets of the fp16 scale fields in a block, -1: none */
};

static const fmt g_fmts[] = {
    {QI_TYPE_F32, "f32", 1, 4, {-1, -1}},      {QI_TYPE_F16, "f16", 1, 2, {-1, -1}},
    {QI_TYPE_BF16, "bf16", 1, 2, {-1, -1}},    {QI_TYPE_Q4_0, "q4_0", 32, 18, {0, -1}},
    {QI_TYPE_Q4_1, "q4_1", 32, 20, {0, 2}},    {QI_TYPE_Q5_0, "q5_0", 32, 22, {0, -1}},
    {QI_TYPE_Q5_1, "q5_1", 32, 24, {0, 2}},    {QI_TYPE_Q8_0, "q8_0", 32, 34, {0, -1}},
    {QI_TYPE_Q4_K, "q4_k", 256, 144, {0, 2}},  {QI_TYPE_Q5_K, "q5_k", 256, 176, {0, 2}},
    {QI_TYPE_Q6_K, "q6_k", 256, 210, {208, -1}},
};

/* A random row of n elements of f: random bytes, then finite scales (or,
 * with moderate, small scales and finite float elements). */
static void fill_row(const fmt *f, uint8_t *row, int64_t n, int moderate) {
    const int64_t nb = n / f->qk, len = nb * f->bytes;
    for (int64_t i = 0; i < len; i++) row[i] = (uint8_t)rnd32();
    if (f->type == QI_TYPE_F32 && moderate)
        for (int64_t i = 0; i < n; i++) {
            const float v = qi_fp16_to_f32(rnd_half_moderate());
            memcpy(row + 4 * i, &v, 4);
        }
    if ((f->type == QI_TYPE_F16 || f->type == QI_TYPE_BF16) && moderate)
        for (int64_t i = 0; i < n; i++) {
            const uint16_t h = rnd_half_moderate();
            put16(row + 2 * i, f->type == QI_TYPE_F16 ? h : qi_f32_to_bf16(qi_fp16_to_f32(h)));
        }
    for (int64_t b = 0; b < nb; b++)
        for (int k = 0; k < 2; k++)
            if (f->scale_off[k] >= 0)
                put16(row + b * f->bytes + f->scale_off[k], moderate ? rnd_half_moderate() : rnd_half_finite());
}

/* The scalar conversions, over all their inputs */
static void test_scalars(void) {
    long bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        const float a = qd_h2f((uint16_t)h), b = qi_fp16_to_f32((uint16_t)h);
        bad += memcmp(&a, &b, 4) != 0;
    }
    report("fp16 -> f32 (all 65536)", 65536, bad);
    bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        const float a = qd_bf2f((uint16_t)h), b = qi_bf16_to_f32((uint16_t)h);
        bad += memcmp(&a, &b, 4) != 0;
    }
    report("bf16 -> f32 (all 65536)", 65536, bad);
    bad = 0;
    for (int v = -(1 << 22); v < (1 << 22); v++) bad += qd_i2f(v) != (float)v;
    report("int -> f32 (|v| <= 2^22)", 1L << 23, bad);
}

/* Whole rows through qd_dequant_row, bit for bit against the reference */
static void test_rows(const fmt *f) {
    static const int nblocks[] = {1, 2, 3, 5, 8, 13};
    static const int float_lens[] = {1, 3, 7, 8, 13, 16, 37, 64, 200};
    long checked = 0, bad = 0;
    const int nlen = f->qk == 1 ? (int)(sizeof float_lens / sizeof *float_lens) : (int)(sizeof nblocks / sizeof *nblocks);
    for (int li = 0; li < nlen; li++) {
        const int64_t n = f->qk == 1 ? float_lens[li] : (int64_t)nblocks[li] * f->qk;
        for (int rep = 0; rep < 50; rep++) {
            /* allocated as floats: the 4-byte alignment the float formats need */
            float *rowf = (float *)malloc((size_t)(n / f->qk * f->bytes + 4));
            uint8_t *row = (uint8_t *)rowf;
            float *a = (float *)malloc((size_t)n * 4), *b = (float *)malloc((size_t)n * 4);
            fill_row(f, row, n, 0);
            memset(a, 0xa5, (size_t)n * 4);
            memset(b, 0x5a, (size_t)n * 4);
            const int ok = qd_dequant_row(f->type, row, a, n);
            qi_dequantize_row_ref(f->type, row, b, n);
            if (!ok) bad += n;
            for (int64_t j = 0; j < n; j++) {
                if (memcmp(&a[j], &b[j], 4) != 0) {
                    if (bad < 3)
                        printf("  %s n=%lld [%lld]: cuda %.9g ref %.9g\n", f->name, (long long)n, (long long)j,
                               (double)a[j], (double)b[j]);
                    bad++;
                }
            }
            checked += n;
            free(rowf);
            free(a);
            free(b);
        }
    }
    char what[64];
    snprintf(what, sizeof what, "dequant %s", f->name);
    report(what, checked, bad);
}

/* The decode kernel's arithmetic for one row: lane l accumulates groups
 * l, l + 32, ... through qd_group_dot, then the lanes are summed as the
 * shuffle tree does; compared with a double dot of the reference row. */
template <class TT>
static void test_dot(const fmt *f) {
    const int NT = 8;
    static const int nblocks_q[] = {1, 4, 11};
    static const int nblocks_k[] = {1, 2, 7};
    long checked = 0, bad = 0;
    for (int li = 0; li < 3; li++) {
        const int64_t n = TT::FLOAT ? 8 * (int64_t)(li * 37 + 1)
                                    : (int64_t)(TT::QK == 32 ? nblocks_q[li] : nblocks_k[li]) * TT::QK;
        for (int rep = 0; rep < 20; rep++) {
            const int T = 1 + rep % NT;
            float *rowf = (float *)malloc((size_t)(n / f->qk * f->bytes + 4));
            uint8_t *row = (uint8_t *)rowf;
            float *w = (float *)malloc((size_t)n * 4), *x = (float *)malloc((size_t)n * NT * 4);
            fill_row(f, row, n, 1);
            qi_dequantize_row_ref(f->type, row, w, n);
            for (int64_t j = 0; j < n * NT; j++) x[j] = ((float)(rnd32() % 2001) - 1000.0f) / 500.0f;
            float lanes[32][NT];
            memset(lanes, 0, sizeof lanes);
            for (int lane = 0; lane < 32; lane++)
                for (int i = lane; i < (int)(n / 8); i += 32) qd_group_dot<TT, NT>(row, i, x, n, T, lanes[lane]);
            for (int t = 0; t < T; t++) {
                float s[32];
                for (int l = 0; l < 32; l++) s[l] = lanes[l][t];
                for (int o = 16; o > 0; o >>= 1) {
                    float u[32];
                    for (int l = 0; l < 32; l++) u[l] = s[l] + s[l ^ o];
                    memcpy(s, u, sizeof s);
                }
                double ref = 0.0, mag = 0.0;
                for (int64_t j = 0; j < n; j++) {
                    ref += (double)w[j] * (double)x[t * n + j];
                    mag += fabs((double)w[j] * (double)x[t * n + j]);
                }
                const double err = fabs((double)s[0] - ref);
                if (err > 1e-5 * mag + 1e-30) {
                    if (bad < 3)
                        printf("  %s n=%lld T=%d t=%d: %.9g vs %.9g (mag %.3g)\n", f->name, (long long)n, T, t,
                               (double)s[0], ref, mag);
                    bad++;
                }
                checked++;
            }
            free(rowf);
            free(w);
            free(x);
        }
    }
    char what[64];
    snprintf(what, sizeof what, "matvec step %s", f->name);
    report(what, checked, bad);
}

int main(void) {
    test_scalars();
    for (size_t i = 0; i < sizeof g_fmts / sizeof *g_fmts; i++) test_rows(&g_fmts[i]);
    test_dot<qd_f32>(&g_fmts[0]);
    test_dot<qd_f16>(&g_fmts[1]);
    test_dot<qd_bf16>(&g_fmts[2]);
    test_dot<qd_q4_0>(&g_fmts[3]);
    test_dot<qd_q4_1>(&g_fmts[4]);
    test_dot<qd_q5_0>(&g_fmts[5]);
    test_dot<qd_q5_1>(&g_fmts[6]);
    test_dot<qd_q8_0>(&g_fmts[7]);
    test_dot<qd_q4_K>(&g_fmts[8]);
    test_dot<qd_q5_K>(&g_fmts[9]);
    test_dot<qd_q6_K>(&g_fmts[10]);
    printf("%s\n", g_fail ? "FAILED" : "all passed");
    return g_fail ? 1 : 0;
}

/* attn.c - attention and element-wise kernels: the SIMD variants against the reference, and their numerics. */
#include "kernels_test.h"

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

void kernels_attn_add(TCase *variants, TCase *numerics) {
    tcase_add_loop_test(variants, test_attn_scores_variants, 0, N_DIMS);
    tcase_add_loop_test(variants, test_attn_values_variants, 0, N_DIMS);
    tcase_add_loop_test(variants, test_attn_values_blocks, 0, N_DIMS);
    tcase_add_test(variants, test_softmax_variants);
    tcase_add_test(variants, test_exp_sum_variants);
    tcase_add_test(variants, test_swiglu_variants);
    tcase_add_test(variants, test_rope_variants);
    tcase_add_test(variants, test_exp_sweep_variants);
    tcase_add_test(variants, test_geglu_variants);
    tcase_add_test(numerics, test_expf_accuracy);
    tcase_add_test(numerics, test_hsum_trees);
    tcase_add_test(numerics, test_geglu_numerics);
}

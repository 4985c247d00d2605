/* gemm.c - block dots and packed weights: the SIMD matmuls against the reference, and the activation quantiser. */
#include "kernels_test.h"

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

void kernels_gemm_add(TCase *golden, TCase *variants) {
    tcase_add_test(golden, test_planted_order_sensitivity);
    tcase_add_loop_test(variants, test_gemm_variants, 0, N_DOT_TYPES);
    tcase_add_test(variants, test_gemm_ref_is_dot_ref);
    tcase_add_loop_test(variants, test_gemm_packed_variants, 0, N_PACKED_TYPES);
    tcase_add_loop_test(variants, test_gemm_packed_shapes, 0, N_PACKED_TYPES);
    tcase_add_test(variants, test_quantize_q8_variants);
    tcase_add_test(variants, test_quantize_q8_ties);
    tcase_add_test(variants, test_f16_to_f32_variants);
    tcase_add_test(variants, test_f32_to_f16_variants);
}

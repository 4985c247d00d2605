/* kernels_avx2.c - AVX2 + FMA + F16C versions of the hot kernels.
 *
 * Each function reproduces its reference in kernels_ref.c operation for
 * operation, so the results are bit-identical (test_kernels.c checks):
 *   - block dots: the 8 integer lanes come from maddubs + madd (exact: the
 *     16-bit pair sums cannot saturate for weight quants of these formats
 *     and activation quants in [-127, 127]), then one FMA per block, then
 *     hsum8 with the shuffles of ggml's hsum_float_8. A weight block is
 *     unpacked once and used against eight activation rows, and the scalar
 *     scale arithmetic is vectorised across tokens or rows (see
 *     DEFINE_GEMM); this is where the speed comes from.
 *   - F16 dots: a 16-lane accumulator is a pair of ymm registers (lanes 0-7,
 *     8-15); hsum16(lo, hi) equals hsum8(lo + hi) lane for lane. The values
 *     pass vectorises over the head dimension instead of positions, keeping
 *     one register per position lane (16 for GEMM, 64 in memory for VEC),
 *     so the strided V cache is read row by row.
 *   - K quants: ggml's own integer lanes (maddubs + madd with the sub-block
 *     scales), then either order's float epilogue.
 *   - exp: the AVX-512 ggml_v_expf (not ggml's own AVX2 variant, which
 *     rounds differently), with vscalefps emulated as two exact multiplies
 *     by powers of two (j * 2^n1 is exact, * 2^n2 rounds once).
 *   - the activation quantiser: ggml's x86 quantize_row_q8_0/q8_1 steps.
 *   - packed weights (kernels.h): kernels_avx2_packed.c.
 * Shapes the fast paths do not cover fall back to the reference.
 *
 * Functions carry target attributes instead of the file having -mavx2, so
 * the library still runs on CPUs without AVX2: kernels.c only hands out
 * this table when CPUID says so.
 */
#include "kernels.h"

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)

#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "qinfer/quant.h"

#define T2 __attribute__((target("avx2,fma,f16c")))

T2 static inline float h2f(uint16_t h) { return _cvtsh_ss(h); }

T2 static inline float fma1(float a, float b, float c) {
    return _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(a), _mm_set_ss(b), _mm_set_ss(c)));
}

T2 static inline float hsum8(__m256 x) {
    __m128 r = _mm_add_ps(_mm256_extractf128_ps(x, 1), _mm256_castps256_ps128(x));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    return _mm_cvtss_f32(r);
}

/* ---- block dots ----------------------------------------------------------------- */

T2 static inline __m256i nibbles(const uint8_t *qs) {
    const __m128i t = _mm_loadu_si128((const __m128i *)qs);
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(t, 4), t), _mm256_set1_epi8(0x0f));
}

/* Byte j = 0xff where bit j of the 32 bits at qh is set, else 0. */
T2 static inline __m256i bits_to_bytes(const uint8_t *qh) {
    const int32_t x = (int32_t)((uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 |
                                (uint32_t)qh[3] << 24);
    const __m256i spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(x), _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                                0x0101010101010101, 0x0000000000000000));
    const __m256i bit = _mm256_set1_epi64x((int64_t)0x8040201008040201ull);
    return _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
}

T2 static inline __m256i unpack_q4_0(const qi_block_q4_0 *b) {
    return _mm256_sub_epi8(nibbles(b->qs), _mm256_set1_epi8(8));
}
T2 static inline __m256i unpack_q4_1(const qi_block_q4_1 *b) { return nibbles(b->qs); }
T2 static inline __m256i unpack_q5_0(const qi_block_q5_0 *b) {
    /* q - 16 as int8: a clear fifth bit sets the top four bits */
    return _mm256_or_si256(nibbles(b->qs),
                           _mm256_andnot_si256(bits_to_bytes(b->qh), _mm256_set1_epi8((char)0xf0)));
}
T2 static inline __m256i unpack_q5_1(const qi_block_q5_1 *b) {
    return _mm256_or_si256(nibbles(b->qs),
                           _mm256_and_si256(bits_to_bytes(b->qh), _mm256_set1_epi8(0x10)));
}
T2 static inline __m256i unpack_q8_0(const qi_block_q8_0 *b) {
    return _mm256_loadu_si256((const __m256i *)b->qs);
}

/* Eight lanes of four products each: unsigned x signed, signed x signed. */
T2 static inline __m256 lanes_us(__m256i ux, __m256i sy) {
    const __m256i p16 = _mm256_maddubs_epi16(ux, sy);
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, _mm256_set1_epi16(1)));
}
T2 static inline __m256 lanes_ss(__m256i x, __m256i y) {
    return lanes_us(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
}

#define QLOAD(blk) _mm256_loadu_si256((const __m256i *)(blk).qs)

#define KB_MAX 256 /* blocks per row the batched paths take (n <= 8192) */
#define KT 8       /* tokens per pass over a weight row */

/* The matmul block of one format. The products of scales (and the offset
 * terms of Q4_1/Q5_1) are the scalar part of every dot; here they are
 * vectorised across tokens (prefill: one weight row against up to KT
 * activation rows, whose scales are converted once per call) or across
 * weight rows (one token: four rows at a time). Each lane still computes
 * exactly the reference's sequence for its own (row, token) pair.
 * WT/AT: block types; UNPACK: weight block -> 32 bytes; LANES: the product
 * lanes; HAS_M: the offset term, from fields MF of the weight block and SF
 * of the activation block (the _0 formats name d there, never read). */
#define DEFINE_GEMM(NAME, WT, AT, UNPACK, LANES, HAS_M, MF, SF)                                    \
    T2 static float NAME##_one(int64_t nb, const WT *x, const AT *y) {                            \
        __m256 c = _mm256_setzero_ps();                                                          \
        float m = 0.0f;                                                                          \
        for (int64_t b = 0; b < nb; b++) {                                                       \
            if (HAS_M) m = fma1(h2f(x[b].MF), h2f(y[b].SF), m);                                  \
            c = _mm256_fmadd_ps(_mm256_set1_ps(h2f(x[b].d) * h2f(y[b].d)),                       \
                                LANES(UNPACK(&x[b]), QLOAD(y[b])), c);                           \
        }                                                                                        \
        return HAS_M ? hsum8(c) + m : hsum8(c);                                                  \
    }                                                                                            \
                                                                                                 \
    /* one weight row x NT tokens; da/sa: [nb][KT] activation scales */                         \
    T2 static inline __attribute__((always_inline)) void NAME##_row(                             \
        int64_t nb, const WT *x, const AT *const *ya, const float *da, const float *sa, float *y,  \
        size_t ys, int nt, const int NT) {                                                       \
        __m256 acc[KT];                                                                          \
        __m256 sm = _mm256_setzero_ps();                                                         \
        for (int k = 0; k < NT; k++) acc[k] = _mm256_setzero_ps();                               \
        for (int64_t b = 0; b < nb; b++) {                                                       \
            const __m256i q = UNPACK(&x[b]);                                                     \
            float dp[KT];                                                                        \
            _mm256_storeu_ps(dp, _mm256_mul_ps(_mm256_set1_ps(h2f(x[b].d)), _mm256_loadu_ps(da + KT * b))); \
            if (HAS_M)                                                                           \
                sm = _mm256_fmadd_ps(_mm256_set1_ps(h2f(x[b].MF)), _mm256_loadu_ps(sa + KT * b), sm); \
            _Pragma("GCC unroll 8") for (int k = 0; k < NT; k++)                                 \
                acc[k] = _mm256_fmadd_ps(_mm256_set1_ps(dp[k]), LANES(q, QLOAD(ya[k][b])), acc[k]); \
        }                                                                                        \
        float s[KT];                                                                             \
        _mm256_storeu_ps(s, sm);                                                                 \
        for (int k = 0; k < nt; k++) y[(size_t)k * ys] = HAS_M ? hsum8(acc[k]) + s[k] : hsum8(acc[k]); \
    }                                                                                            \
                                                                                                 \
    /* n_w weight rows x one token, four rows at a time */                                       \
    T2 static void NAME##_rows(int64_t nb, const char *w, size_t ws, int n_w, const AT *y, float *out) { \
        int r = 0;                                                                               \
        for (; r + 4 <= n_w; r += 4) {                                                           \
            const WT *x0 = (const WT *)(w + (size_t)r * ws), *x1 = (const WT *)(w + (size_t)(r + 1) * ws); \
            const WT *x2 = (const WT *)(w + (size_t)(r + 2) * ws), *x3 = (const WT *)(w + (size_t)(r + 3) * ws); \
            __m256 c0 = _mm256_setzero_ps(), c1 = c0, c2 = c0, c3 = c0;                          \
            __m128 sm = _mm_setzero_ps();                                                        \
            for (int64_t b = 0; b < nb; b++) {                                                   \
                const __m128 dw = _mm_cvtph_ps(_mm_setr_epi16((short)x0[b].d, (short)x1[b].d,    \
                                                              (short)x2[b].d, (short)x3[b].d, 0, 0, 0, 0)); \
                float dp[4];                                                                     \
                _mm_storeu_ps(dp, _mm_mul_ps(dw, _mm_set1_ps(h2f(y[b].d))));                     \
                if (HAS_M) {                                                                     \
                    const __m128 mw = _mm_cvtph_ps(_mm_setr_epi16(                               \
                        (short)x0[b].MF, (short)x1[b].MF, (short)x2[b].MF, (short)x3[b].MF, 0, 0, 0, 0)); \
                    sm = _mm_fmadd_ps(mw, _mm_set1_ps(h2f(y[b].SF)), sm);                        \
                }                                                                                \
                const __m256i qy = QLOAD(y[b]);                                                  \
                c0 = _mm256_fmadd_ps(_mm256_set1_ps(dp[0]), LANES(UNPACK(&x0[b]), qy), c0);      \
                c1 = _mm256_fmadd_ps(_mm256_set1_ps(dp[1]), LANES(UNPACK(&x1[b]), qy), c1);      \
                c2 = _mm256_fmadd_ps(_mm256_set1_ps(dp[2]), LANES(UNPACK(&x2[b]), qy), c2);      \
                c3 = _mm256_fmadd_ps(_mm256_set1_ps(dp[3]), LANES(UNPACK(&x3[b]), qy), c3);      \
            }                                                                                    \
            float s[4];                                                                          \
            _mm_storeu_ps(s, sm);                                                                \
            out[r] = HAS_M ? hsum8(c0) + s[0] : hsum8(c0);                                       \
            out[r + 1] = HAS_M ? hsum8(c1) + s[1] : hsum8(c1);                                   \
            out[r + 2] = HAS_M ? hsum8(c2) + s[2] : hsum8(c2);                                   \
            out[r + 3] = HAS_M ? hsum8(c3) + s[3] : hsum8(c3);                                   \
        }                                                                                        \
        for (; r < n_w; r++) out[r] = NAME##_one(nb, (const WT *)(w + (size_t)r * ws), y);       \
    }                                                                                            \
                                                                                                 \
    T2 static void NAME(int64_t n, const void *w, size_t w_stride, int n_w, const void *a,        \
                        size_t a_stride, int n_a, float *y, size_t y_stride) {                   \
        const int64_t nb = n / 32;                                                               \
        const char *wc = w, *ac = a;                                                             \
        if (nb > KB_MAX) {                                                                       \
            for (int t = 0; t < n_a; t++)                                                        \
                for (int r = 0; r < n_w; r++)                                                    \
                    y[(size_t)t * y_stride + (size_t)r] = NAME##_one(                            \
                        nb, (const WT *)(wc + (size_t)r * w_stride), (const AT *)(ac + (size_t)t * a_stride)); \
            return;                                                                              \
        }                                                                                        \
        float da[KB_MAX * KT], sa[KB_MAX * KT];                                                  \
        for (int t0 = 0; t0 < n_a; t0 += KT) {                                                   \
            const int nt = n_a - t0 < KT ? n_a - t0 : KT;                                        \
            float *yt = y + (size_t)t0 * y_stride;                                               \
            if (nt == 1) {                                                                       \
                NAME##_rows(nb, wc, w_stride, n_w, (const AT *)(ac + (size_t)t0 * a_stride), yt); \
                continue;                                                                        \
            }                                                                                    \
            /* lanes past nt repeat token t0: valid memory, results unused */                    \
            const AT *ya[KT];                                                                    \
            for (int k = 0; k < KT; k++) ya[k] = (const AT *)(ac + (size_t)(t0 + (k < nt ? k : 0)) * a_stride); \
            for (int64_t b = 0; b < nb; b++)                                                     \
                for (int k = 0; k < KT; k++) {                                                   \
                    da[KT * b + k] = h2f(ya[k][b].d);                                            \
                    sa[KT * b + k] = HAS_M ? h2f(ya[k][b].SF) : 0.0f;                            \
                }                                                                                \
            for (int r = 0; r < n_w; r++) {                                                      \
                const WT *x = (const WT *)(wc + (size_t)r * w_stride);                           \
                if (nt > 4) NAME##_row(nb, x, ya, da, sa, yt + r, y_stride, nt, 8);              \
                else NAME##_row(nb, x, ya, da, sa, yt + r, y_stride, nt, 4);                     \
            }                                                                                    \
        }                                                                                        \
    }

DEFINE_GEMM(gemm_q4_0_avx2, qi_block_q4_0, qi_block_q8_0, unpack_q4_0, lanes_ss, 0, d, d)
DEFINE_GEMM(gemm_q4_1_avx2, qi_block_q4_1, qi_block_q8_1, unpack_q4_1, lanes_us, 1, m, s)
DEFINE_GEMM(gemm_q5_0_avx2, qi_block_q5_0, qi_block_q8_0, unpack_q5_0, lanes_ss, 0, d, d)
DEFINE_GEMM(gemm_q5_1_avx2, qi_block_q5_1, qi_block_q8_1, unpack_q5_1, lanes_us, 1, m, s)
DEFINE_GEMM(gemm_q8_0_avx2, qi_block_q8_0, qi_block_q8_0, unpack_q8_0, lanes_ss, 0, d, d)

/* ---- K quants --------------------------------------------------------------------------- */

T2 static inline int hsum_i32(__m256i v) {
    __m128i t = _mm_add_epi32(_mm256_extracti128_si256(v, 1), _mm256_castsi256_si128(v));
    t = _mm_add_epi32(t, _mm_unpackhi_epi64(t, t));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 1));
    return _mm_cvtsi128_si32(t);
}

/* ggml's eight integer lanes of one q4_K super-block (see kernels_ref.c). */
T2 static inline __m256i lanes_q4_K(const qi_block_q4_K *x, const uint8_t sc[8], const qi_block_q8_K *y) {
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    __m256i sumi = _mm256_setzero_si256();
    for (int j = 0; j < 4; j++) {
        const __m256i bits = _mm256_loadu_si256((const __m256i *)(x->qs + 32 * j));
        const __m256i lo = _mm256_and_si256(bits, m4), hi = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
        const __m256i pl = _mm256_madd_epi16(_mm256_set1_epi16(sc[2 * j]),
                                             _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)(y->qs + 64 * j))));
        const __m256i ph = _mm256_madd_epi16(_mm256_set1_epi16(sc[2 * j + 1]),
                                             _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(y->qs + 64 * j + 32))));
        sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(pl, ph));
    }
    return sumi;
}

/* ggml's eight integer lanes of one q6_K super-block, the -32 included. */
T2 static inline __m256i lanes_q6_K(const qi_block_q6_K *x, const qi_block_q8_K *y) {
    const __m256i m15 = _mm256_set1_epi8(0x0f), m3 = _mm256_set1_epi8(3);
    __m256i sumi = _mm256_setzero_si256();
    for (int j = 0; j < 2; j++) {
        const __m256i b1 = _mm256_loadu_si256((const __m256i *)(x->ql + 64 * j));
        const __m256i b2 = _mm256_loadu_si256((const __m256i *)(x->ql + 64 * j + 32));
        const __m256i bh = _mm256_loadu_si256((const __m256i *)(x->qh + 32 * j));
        __m256i q[4];
        q[0] = _mm256_or_si256(_mm256_and_si256(b1, m15), _mm256_slli_epi16(_mm256_and_si256(bh, m3), 4));
        q[1] = _mm256_or_si256(_mm256_and_si256(b2, m15),
                               _mm256_slli_epi16(_mm256_and_si256(bh, _mm256_set1_epi8(12)), 2));
        q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b1, 4), m15),
                               _mm256_and_si256(bh, _mm256_set1_epi8(48)));
        q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b2, 4), m15),
                               _mm256_srli_epi16(_mm256_and_si256(bh, _mm256_set1_epi8((char)0xc0)), 2));
        for (int i = 0; i < 4; i++) {
            const int g = 4 * j + i;
            const __m256i scl = _mm256_set_m128i(_mm_set1_epi16(x->scales[2 * g + 1]), _mm_set1_epi16(x->scales[2 * g]));
            sumi = _mm256_add_epi32(
                sumi, _mm256_madd_epi16(scl, _mm256_maddubs_epi16(
                                                 q[i], _mm256_loadu_si256((const __m256i *)(y->qs + 128 * j + 32 * i)))));
        }
    }
    const __m256i sub = _mm256_slli_epi32(
        _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)y->bsums),
                          _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x->scales))),
        5);
    return _mm256_sub_epi32(sumi, sub);
}

#define KK_MAX 64 /* super-blocks per row whose scales are decoded up front */

/* q4_K matmul block; wide selects the tiled order (T >= 8). */
T2 static void gemm_q4_K_any(int64_t n, const void *w, size_t w_stride, int n_w, const void *a,
                             size_t a_stride, int n_a, float *y, size_t y_stride, int wide) {
    const int64_t nb = n / 256;
    uint8_t scs[KK_MAX][8], mns[KK_MAX][8];
    for (int r = 0; r < n_w; r++) {
        const qi_block_q4_K *x = (const qi_block_q4_K *)((const char *)w + (size_t)r * w_stride);
        for (int64_t b = 0; b < nb && b < KK_MAX; b++)
            for (int s = 0; s < 8; s++) qi_k_scale_min(x[b].scales, s, &scs[b][s], &mns[b][s]);
        for (int t = 0; t < n_a; t++) {
            const qi_block_q8_K *ya = (const qi_block_q8_K *)((const char *)a + (size_t)t * a_stride);
            __m256 acc = _mm256_setzero_ps();
            __m128 accm = _mm_setzero_ps();
            float sum = 0.0f;
            for (int64_t b = 0; b < nb; b++) {
                uint8_t scb[8], mnb[8];
                const uint8_t *sc = scb, *mn = mnb;
                if (b < KK_MAX) {
                    sc = scs[b];
                    mn = mns[b];
                } else {
                    for (int s = 0; s < 8; s++) qi_k_scale_min(x[b].scales, s, &scb[s], &mnb[s]);
                }
                const __m256i sumi = lanes_q4_K(&x[b], sc, &ya[b]);
                const int16_t *bs = ya[b].bsums;
                const float dw = h2f(x[b].d), dminw = h2f(x[b].dmin);
                if (wide) {
                    int s2 = 0;
                    for (int s = 0; s < 8; s++) s2 += mn[s] * (bs[2 * s] + bs[2 * s + 1]);
                    const float rr = fma1(-dminw, (float)s2, (float)hsum_i32(sumi) * dw);
                    sum = fma1(rr, ya[b].d, sum);
                } else {
                    const __m128i prod = _mm_setr_epi32(mn[0] * (bs[0] + bs[1]) + mn[1] * (bs[2] + bs[3]),
                                                        mn[2] * (bs[4] + bs[5]) + mn[3] * (bs[6] + bs[7]),
                                                        mn[4] * (bs[8] + bs[9]) + mn[5] * (bs[10] + bs[11]),
                                                        mn[6] * (bs[12] + bs[13]) + mn[7] * (bs[14] + bs[15]));
                    accm = _mm_fmadd_ps(_mm_set1_ps(-ya[b].d * dminw), _mm_cvtepi32_ps(prod), accm);
                    acc = _mm256_fmadd_ps(_mm256_set1_ps(ya[b].d * dw), _mm256_cvtepi32_ps(sumi), acc);
                }
            }
            if (!wide) {
                accm = _mm_add_ps(accm, _mm_movehl_ps(accm, accm));
                accm = _mm_add_ss(accm, _mm_movehdup_ps(accm));
                sum = hsum8(acc) + _mm_cvtss_f32(accm);
            }
            y[(size_t)t * y_stride + (size_t)r] = sum;
        }
    }
}

T2 static void gemm_q6_K_any(int64_t n, const void *w, size_t w_stride, int n_w, const void *a,
                             size_t a_stride, int n_a, float *y, size_t y_stride, int wide) {
    const int64_t nb = n / 256;
    for (int r = 0; r < n_w; r++) {
        const qi_block_q6_K *x = (const qi_block_q6_K *)((const char *)w + (size_t)r * w_stride);
        for (int t = 0; t < n_a; t++) {
            const qi_block_q8_K *ya = (const qi_block_q8_K *)((const char *)a + (size_t)t * a_stride);
            __m256 acc = _mm256_setzero_ps();
            float sum = 0.0f;
            for (int64_t b = 0; b < nb; b++) {
                const __m256i sumi = lanes_q6_K(&x[b], &ya[b]);
                const float dw = h2f(x[b].d);
                if (wide) sum = fma1((float)hsum_i32(sumi) * dw, ya[b].d, sum);
                else acc = _mm256_fmadd_ps(_mm256_set1_ps(ya[b].d * dw), _mm256_cvtepi32_ps(sumi), acc);
            }
            y[(size_t)t * y_stride + (size_t)r] = wide ? sum : hsum8(acc);
        }
    }
}

#define DEFINE_K_GEMM(NAME, ANY, WIDE)                                                            \
    T2 static void NAME(int64_t n, const void *w, size_t w_stride, int n_w, const void *a,        \
                        size_t a_stride, int n_a, float *y, size_t y_stride) {                   \
        ANY(n, w, w_stride, n_w, a, a_stride, n_a, y, y_stride, WIDE);                           \
    }
DEFINE_K_GEMM(gemm_q4_K_avx2, gemm_q4_K_any, 0)
DEFINE_K_GEMM(gemm_q4_K_tiled_avx2, gemm_q4_K_any, 1)
DEFINE_K_GEMM(gemm_q6_K_avx2, gemm_q6_K_any, 0)
DEFINE_K_GEMM(gemm_q6_K_tiled_avx2, gemm_q6_K_any, 1)

/* ---- F16 attention ------------------------------------------------------------------ */

T2 static inline __m256 ld16(const uint16_t *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

#define QF_MAX 1024 /* head dims above this use the reference */

T2 static void attn_scores_avx2(qi_k_order ord, int D, const uint16_t *q16, const uint16_t *k,
                                size_t k_stride, int n_pos, float *s) {
    if (D % 16 != 0 || D > QF_MAX) {
        qi_k_attn_scores_ref(ord, D, q16, k, k_stride, n_pos, s);
        return;
    }
    float qf[QF_MAX];
    for (int i = 0; i < D; i += 8) _mm256_storeu_ps(qf + i, ld16(q16 + i));
    if (ord == QI_K_ORD_GEMM) {
        for (int p = 0; p < n_pos; p++) {
            const uint16_t *kp = k + (size_t)p * k_stride;
            __m256 lo = _mm256_setzero_ps(), hi = lo;
            for (int i = 0; i < D; i += 16) {
                lo = _mm256_fmadd_ps(ld16(kp + i), _mm256_loadu_ps(qf + i), lo);
                hi = _mm256_fmadd_ps(ld16(kp + i + 8), _mm256_loadu_ps(qf + i + 8), hi);
            }
            s[p] = hsum8(_mm256_add_ps(lo, hi));
        }
        return;
    }
    const int np = D & ~63;
    for (int p = 0; p < n_pos; p++) {
        const uint16_t *kp = k + (size_t)p * k_stride;
        __m256 acc[8];
        for (int c = 0; c < 8; c++) acc[c] = _mm256_setzero_ps();
        for (int i = 0; i < np; i += 64)
            for (int c = 0; c < 8; c++)
                acc[c] = _mm256_fmadd_ps(ld16(kp + i + 8 * c), _mm256_loadu_ps(qf + i + 8 * c), acc[c]);
        /* accumulator c16 = lanes (acc[2*c16], acc[2*c16+1]); (0+2) + (1+3) */
        const __m256 lo = _mm256_add_ps(_mm256_add_ps(acc[0], acc[4]), _mm256_add_ps(acc[2], acc[6]));
        const __m256 hi = _mm256_add_ps(_mm256_add_ps(acc[1], acc[5]), _mm256_add_ps(acc[3], acc[7]));
        double sum = (double)hsum8(_mm256_add_ps(lo, hi));
        for (int i = np; i < D; i++) sum += (double)(h2f(kp[i]) * qf[i]);
        s[p] = (float)sum;
    }
}

/* The 16-lane tree over registers r[0..15] (lane l of the reduction is
 * register l; each register holds 8 independent outputs). */
T2 static inline __m256 tree16(const __m256 r[16]) {
    __m256 t[8], u[4];
    for (int l = 0; l < 8; l++) t[l] = _mm256_add_ps(r[l + 8], r[l]);
    for (int l = 0; l < 4; l++) u[l] = _mm256_add_ps(t[l + 4], t[l]);
    return _mm256_add_ps(_mm256_add_ps(u[0], u[2]), _mm256_add_ps(u[1], u[3]));
}

T2 static void attn_values_blk_avx2(qi_k_order ord, int D, const uint16_t *w16, const uint16_t *const *blk, int shift,
                                size_t v_stride, int n_pos, float *out) {
    const size_t mask = ((size_t)1 << shift) - 1;
#define VROW(p) (blk[(size_t)(p) >> shift] + ((size_t)(p) & mask) * v_stride)
    if (D % 8 != 0) {
        qi_k_attn_values_blk_ref(ord, D, w16, blk, shift, v_stride, n_pos, out);
        return;
    }
    const int gemm = ord == QI_K_ORD_GEMM && D % 4 == 0;
    for (int d0 = 0; d0 < D; d0 += 8) {
        if (gemm) {
            __m256 acc[16];
            for (int l = 0; l < 16; l++) acc[l] = _mm256_setzero_ps();
            int p = 0;
            for (; p + 16 <= n_pos; p += 16)
                for (int l = 0; l < 16; l++)
                    acc[l] = _mm256_fmadd_ps(_mm256_set1_ps(h2f(w16[p + l])),
                                             ld16(VROW(p + l) + d0), acc[l]);
            for (; p < n_pos; p++)
                acc[p & 15] = _mm256_fmadd_ps(_mm256_set1_ps(h2f(w16[p])),
                                              ld16(VROW(p) + d0), acc[p & 15]);
            _mm256_storeu_ps(out + d0, tree16(acc));
        } else {
            __m256 acc[64];
            for (int l = 0; l < 64; l++) acc[l] = _mm256_setzero_ps();
            for (int p = 0; p < n_pos; p++)
                acc[p & 63] = _mm256_fmadd_ps(_mm256_set1_ps(h2f(w16[p])),
                                              ld16(VROW(p) + d0), acc[p & 63]);
            __m256 c[16];
            for (int l = 0; l < 16; l++)
                c[l] = _mm256_add_ps(_mm256_add_ps(acc[l], acc[32 + l]),
                                     _mm256_add_ps(acc[16 + l], acc[48 + l]));
            _mm256_storeu_ps(out + d0, tree16(c));
        }
    }
#undef VROW
}

T2 static void attn_values_avx2(qi_k_order ord, int D, const uint16_t *w16, const uint16_t *v,
                                size_t v_stride, int n_pos, float *out) {
    const uint16_t *const one[1] = {v};
    attn_values_blk_avx2(ord, D, w16, one, 30, v_stride, n_pos, out);
}

/* ---- exp, softmax, SwiGLU ------------------------------------------------------------ */

T2 static inline __m256 pow2i(__m256i e) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(e, _mm256_set1_epi32(127)), 23));
}

/* qi_k_expf_ref on 8 lanes. */
T2 static inline __m256 expf8(__m256 x) {
    const __m256 r = _mm256_set1_ps(0x1.8p23f);
    const __m256 z = _mm256_fmadd_ps(x, _mm256_set1_ps(0x1.715476p+0f), r);
    const __m256 n = _mm256_sub_ps(z, r);
    const __m256 b = _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.7f7d1cp-20f),
                                      _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.62e4p-1f), x));
    const __m256 u = _mm256_mul_ps(b, b);
    const __m256 j = _mm256_fmadd_ps(
        _mm256_fmadd_ps(_mm256_fmadd_ps(_mm256_set1_ps(0x1.0e4020p-7f), b, _mm256_set1_ps(0x1.573e2ep-5f)),
                        u, _mm256_fmadd_ps(_mm256_set1_ps(0x1.555e66p-3f), b, _mm256_set1_ps(0x1.fffdb6p-2f))),
        u, _mm256_fmadd_ps(_mm256_set1_ps(0x1.ffffecp-1f), b, _mm256_set1_ps(1.0f)));
    /* j * 2^n for |n| <= 192; garbage elsewhere, replaced below */
    const __m256i ni = _mm256_cvtps_epi32(n);
    const __m256i n1 = _mm256_srai_epi32(ni, 1);
    const __m256 res = _mm256_mul_ps(_mm256_mul_ps(j, pow2i(n1)), pow2i(_mm256_sub_epi32(ni, n1)));
    const __m256 big = _mm256_cmp_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.0f), n), _mm256_set1_ps(192.0f),
                                     _CMP_GT_OQ);
    const __m256 alt = _mm256_blendv_ps(_mm256_set1_ps(INFINITY), _mm256_setzero_ps(),
                                        _mm256_cmp_ps(n, _mm256_setzero_ps(), _CMP_LE_OQ));
    return _mm256_blendv_ps(res, alt, big);
}

T2 static double exp_sum_avx2(int n, float *s, float max) {
    const __m256 vmax = _mm256_set1_ps(max);
    double sum = 0.0;
    int i0 = 0;
    for (; i0 + 16 <= n; i0 += 16) {
        const __m256 lo = expf8(_mm256_sub_ps(_mm256_loadu_ps(s + i0), vmax));
        const __m256 hi = expf8(_mm256_sub_ps(_mm256_loadu_ps(s + i0 + 8), vmax));
        _mm256_storeu_ps(s + i0, lo);
        _mm256_storeu_ps(s + i0 + 8, hi);
        sum += (double)hsum8(_mm256_add_ps(lo, hi));
    }
    if (i0 < n) {
        /* the last partial chunk: missing lanes are masked positions, 0 */
        float e[16];
        for (int l = 0; l < 16; l++) e[l] = i0 + l < n ? s[i0 + l] - max : 0.0f;
        __m256 lo = expf8(_mm256_loadu_ps(e)), hi = expf8(_mm256_loadu_ps(e + 8));
        _mm256_storeu_ps(e, lo);
        _mm256_storeu_ps(e + 8, hi);
        for (int l = 0; l < 16; l++) {
            if (i0 + l < n) s[i0 + l] = e[l];
            else e[l] = 0.0f;
        }
        sum += (double)hsum8(_mm256_add_ps(_mm256_loadu_ps(e), _mm256_loadu_ps(e + 8)));
    }
    return sum;
}

T2 static void softmax_f16_avx2(int n, float *s, uint16_t *w16) {
    float max = -INFINITY;
    for (int i = 0; i < n; i++) max = s[i] > max ? s[i] : max;
    const double sum = exp_sum_avx2(n, s, max);
    const __m256 inv = _mm256_set1_ps((float)(1.0 / sum));
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(w16 + i),
                         _mm256_cvtps_ph(_mm256_mul_ps(_mm256_loadu_ps(s + i), inv), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) w16[i] = qi_f32_to_fp16(s[i] * _mm256_cvtss_f32(inv));
}

/* RoPE, eight pairs (NEOX) or four (NORMAL) per vector with the
 * reference's fused multiply-adds: fmsub(x0, c, x1*s) is fma(x0, c,
 * -(x1*s)). NORMAL pairs are adjacent, so each vector also holds its pairs
 * swapped (x1, x0), and the even lanes take the first result, the odd lanes
 * the second. NORMAL's unfused remainder goes through the reference. */
T2 static void rope_avx2(float *x, int n_heads, int D, int n_pairs, int neox, const float *cs, const float *sn) {
    const __m256i dup = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3);
    for (int h = 0; h < n_heads; h++) {
        float *v = x + (long)h * D;
        int i = 0;
        if (neox) {
            for (; i + 8 <= n_pairs; i += 8) {
                const __m256 x0 = _mm256_loadu_ps(v + i), x1 = _mm256_loadu_ps(v + i + n_pairs);
                const __m256 c = _mm256_loadu_ps(cs + i), s = _mm256_loadu_ps(sn + i);
                _mm256_storeu_ps(v + i, _mm256_fmsub_ps(x0, c, _mm256_mul_ps(x1, s)));
                _mm256_storeu_ps(v + i + n_pairs, _mm256_fmadd_ps(x0, s, _mm256_mul_ps(x1, c)));
            }
            for (; i < n_pairs; i++) { /* the last pairs, fused as in the reference */
                const float x0 = v[i], x1 = v[i + n_pairs];
                v[i] = fmaf(x0, cs[i], -(x1 * sn[i]));
                v[i + n_pairs] = fmaf(x0, sn[i], x1 * cs[i]);
            }
        } else {
            for (; i + 4 <= n_pairs; i += 4) {
                const __m256 xv = _mm256_loadu_ps(v + 2 * i), xs = _mm256_permute_ps(xv, 0xB1);
                const __m256 c = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_loadu_ps(cs + i)), dup);
                const __m256 s = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_loadu_ps(sn + i)), dup);
                const __m256 ev = _mm256_fmsub_ps(xv, c, _mm256_mul_ps(xs, s)); /* lane 2j: x0*c - x1*s */
                const __m256 od = _mm256_fmadd_ps(xs, s, _mm256_mul_ps(xv, c)); /* lane 2j+1: x0*s + x1*c */
                _mm256_storeu_ps(v + 2 * i, _mm256_blend_ps(ev, od, 0xAA));
            }
            /* fewer than four pairs left: unfused, as the reference (offsets keep pairs adjacent) */
            if (i < n_pairs) qi_k_rope_ref(v + 2 * i, 1, D, n_pairs - i, 0, cs + i, sn + i);
        }
    }
}

T2 static void swiglu_avx2(int64_t n, float *g, const float *u) {
    const int64_t nv = n & ~(int64_t)15;
    const __m256 one = _mm256_set1_ps(1.0f);
    for (int64_t i = 0; i < nv; i += 8) {
        const __m256 x = _mm256_loadu_ps(g + i);
        const __m256 e = expf8(_mm256_sub_ps(_mm256_setzero_ps(), x));
        _mm256_storeu_ps(g + i, _mm256_mul_ps(_mm256_div_ps(x, _mm256_add_ps(one, e)), _mm256_loadu_ps(u + i)));
    }
    for (int64_t i = nv; i < n; i++) g[i] = (g[i] / (1.0f + expf(-g[i]))) * u[i];
}

/* GeGLU: the fp16 conversion of 8 lanes at once (F16C rounds to nearest
 * even, as qi_f32_to_fp16), then the table lookups and the multiply. */
T2 static void geglu_avx2(int64_t n, float *g, const float *u) {
    const uint16_t *tab = qi_k_gelu_table();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint16_t h[8];
        float r[8];
        const __m256 x = _mm256_loadu_ps(g + i);
        _mm_storeu_si128((__m128i *)h, _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
        for (int l = 0; l < 8; l++) r[l] = qi_fp16_to_f32(tab[h[l]]);
        __m256 y = _mm256_mul_ps(_mm256_loadu_ps(r), _mm256_loadu_ps(u + i));
        const __m256 lo = _mm256_cmp_ps(x, _mm256_set1_ps(-10.0f), _CMP_LE_OQ);
        const __m256 hi = _mm256_cmp_ps(x, _mm256_set1_ps(10.0f), _CMP_GE_OQ);
        y = _mm256_blendv_ps(y, _mm256_mul_ps(x, _mm256_loadu_ps(u + i)), hi);
        y = _mm256_andnot_ps(lo, y);
        _mm256_storeu_ps(g + i, y);
    }
    if (i < n) qi_k_geglu_ref(n - i, g + i, u + i);
}

/* ---- activation quantisation ------------------------------------------------------------- */

#define QI_RND (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)

T2 static void f16_to_f32_avx2(const uint16_t *x, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i))));
    for (; i < n; i++) y[i] = _cvtsh_ss(x[i]);
}

/* F16C's conversion rounds to nearest even like qi_f32_to_fp16, subnormal
 * results included; only a NaN keeps its payload there, so NaNs are set to
 * the reference's quiet NaN afterwards. */
T2 static void f32_to_f16_avx2(const float *x, uint16_t *y, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        _mm_storeu_si128((__m128i *)(y + i), _mm256_cvtps_ph(v, QI_RND));
        if (_mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)))
            for (int j = 0; j < 8; j++) y[i + j] = qi_f32_to_fp16(x[i + j]);
    }
    for (; i < n; i++) y[i] = qi_f32_to_fp16(x[i]);
}

T2 static void quantize_q8_avx2(const float *x, void *dst, int64_t n, int with_sum) {
    uint8_t *out = dst;
    const size_t bs = with_sum ? sizeof(qi_block_q8_1) : sizeof(qi_block_q8_0);
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t i = 0; i < n / 32; i++, x += 32, out += bs) {
        const __m256 v0 = _mm256_loadu_ps(x), v1 = _mm256_loadu_ps(x + 8);
        const __m256 v2 = _mm256_loadu_ps(x + 16), v3 = _mm256_loadu_ps(x + 24);
        const __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v0), _mm256_andnot_ps(sign, v1)),
                                       _mm256_max_ps(_mm256_andnot_ps(sign, v2), _mm256_andnot_ps(sign, v3)));
        __m128 m4 = _mm_max_ps(_mm256_extractf128_ps(m, 1), _mm256_castps256_ps128(m));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        const float amax = _mm_cvtss_f32(m4);
        const float d = amax / 127.f;
        const float id = amax != 0.0f ? 127.f / amax : 0.0f;
        const uint16_t dh = _cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
        memcpy(out, &dh, 2);
        const __m256 mul = _mm256_set1_ps(id);
        const __m256i i0 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v0, mul), QI_RND));
        const __m256i i1 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v1, mul), QI_RND));
        const __m256i i2 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v2, mul), QI_RND));
        const __m256i i3 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v3, mul), QI_RND));
        /* the packs interleave 128-bit lanes; the permute restores element order */
        const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
        _mm256_storeu_si256((__m256i *)(out + (with_sum ? 4 : 2)),
                            _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
        if (with_sum) {
            __m256i t = _mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3));
            __m128i t4 = _mm_add_epi32(_mm256_extracti128_si256(t, 1), _mm256_castsi256_si128(t));
            t4 = _mm_add_epi32(t4, _mm_unpackhi_epi64(t4, t4));
            t4 = _mm_add_epi32(t4, _mm_shuffle_epi32(t4, 1));
            const uint16_t sh = _cvtss_sh(d * (float)_mm_cvtsi128_si32(t4), _MM_FROUND_TO_NEAREST_INT);
            memcpy(out + 2, &sh, 2);
        }
    }
}

static const qi_kernels k_avx2 = {
    .name = "avx2",
    .gemm = {
        [QI_TYPE_Q4_0] = gemm_q4_0_avx2,
        [QI_TYPE_Q4_1] = gemm_q4_1_avx2,
        [QI_TYPE_Q5_0] = gemm_q5_0_avx2,
        [QI_TYPE_Q5_1] = gemm_q5_1_avx2,
        [QI_TYPE_Q8_0] = gemm_q8_0_avx2,
        [QI_TYPE_Q4_K] = gemm_q4_K_avx2,
        [QI_TYPE_Q6_K] = gemm_q6_K_avx2,
    },
    .gemm_wide = {
        [QI_TYPE_Q4_K] = gemm_q4_K_tiled_avx2,
        [QI_TYPE_Q6_K] = gemm_q6_K_tiled_avx2,
    },
    .attn_scores = attn_scores_avx2,
    .softmax_f16 = softmax_f16_avx2,
    .exp_sum = exp_sum_avx2,
    .attn_values = attn_values_avx2,
    .attn_values_blk = attn_values_blk_avx2,
    .rope = rope_avx2,
    .swiglu = swiglu_avx2,
    .geglu = geglu_avx2,
    .quantize_q8 = quantize_q8_avx2,
    .f16_to_f32 = f16_to_f32_avx2,
    .f32_to_f16 = f32_to_f16_avx2,
    .gemm_packed = {
        [QI_TYPE_Q4_0] = qi_k_gemm_packed_q4_0_avx2,
        [QI_TYPE_Q4_1] = qi_k_gemm_packed_q4_1_avx2,
        [QI_TYPE_Q8_0] = qi_k_gemm_packed_q8_0_avx2,
        [QI_TYPE_Q5_0] = qi_k_gemm_packed_q5_0_avx2,
        [QI_TYPE_Q5_1] = qi_k_gemm_packed_q5_1_avx2,
    },
};

const qi_kernels *qi_kernels_avx2(void) {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && qi_cpu_f16c())
        return &k_avx2;
    return NULL;
}

#else

const qi_kernels *qi_kernels_avx2(void) { return NULL; }

#endif

/* kernels_avx2_packed.c - the AVX2 table's matmuls over packed weights
 * (kernels.h, "Packed weights"), bit-identical to the packed reference
 * (kernels_packed.c; test_kernels.c checks). kernels_avx2.c holds the rest
 * of the table. */
#include "kernels.h"

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)

#include <immintrin.h>
#include <string.h>

#include "qinfer/quant.h"

#define T2 __attribute__((target("avx2,fma,f16c")))

T2 static inline float h2f(uint16_t h) { return _cvtsh_ss(h); }

/* ---- packed weights ----------------------------------------------------------------------
 *
 * A 16-row group (kernels.h, "Packed weights") holds four codes of each row
 * per 64-byte vector: rows 0-7 in its first 32 bytes, rows 8-15 in the
 * second, so a group is two halves of eight float lanes, one lane per row,
 * and every lane performs the reference's steps for its (row, token) in the
 * reference's order: convert the block's exact integer dot, multiply the
 * two scales, one fused multiply-add (then the offset's for q4_1/q5_1).
 * AVX2 has no vpdpbusd; the integer dot is maddubs (unsigned codes x
 * signed activation quants, pairs to 16 bits) and madd with ones (pairs to
 * the row's 32-bit lane), all exact:
 *   - q4_0, q4_1: codes <= 15 and quants at most 128 in magnitude: a pair
 *     is at most 3840, so the eight maddubs of a block are summed in 16 bits
 *     (30720) before one madd;
 *   - q5_0, q5_1: codes <= 31 (7936 a pair): two sums of four;
 *   - q8_0: the stored codes are q + 128 (up to 255: a pair could
 *     saturate), so they go back to signed q and enter as |q| times the
 *     quant with q's sign (32512 a pair at most), each madd on its own.
 * The _0 formats' offsets are corrected as in the AVX-512 version (once
 * per activation block); q8_0's signed codes need none. A group block is
 * unpacked once for up to PKT tokens; the groups ahead are prefetched. */

#define PKT 16 /* tokens per pass */
#ifndef PK_PF
#define PK_PF 8192 /* bytes of packed groups prefetched ahead; 0: none */
#endif
#define PK_MAXB 512 /* blocks per row the prepared scales hold (n <= 16384); longer rows: the reference */

T2 static inline int32_t load_i32(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* q5's fifth bits into the codes of one half: u[v] holds elements
 * 4v..4v+3 of each row (bytes 4r..4r+3), u[v + 4] elements 16+4v..16+4v+3;
 * row r's bits are dword r of qh (bit j: element j). Element group v's four
 * bits lie in one byte of the dword (byte v / 2, or 2 + v / 2), at bits 0-3
 * or 4-7; vpshufb copies that byte to the dword's four bytes and byte i
 * tests its own bit. */
T2 static inline __attribute__((always_inline)) void q5_fifth_bits(__m256i u[8], __m256i qh) {
    const __m256i five = _mm256_set1_epi8(0x10);
    _Pragma("GCC unroll 8") for (int v = 0; v < 8; v++) {
        const int base = v < 4 ? 4 * v : 16 + 4 * (v - 4);
        const int by = base / 8;
        const __m256i idx = _mm256_add_epi8(_mm256_setr_epi32(0, 0x04040404, 0x08080808, 0x0c0c0c0c, 0, 0x04040404,
                                                              0x08080808, 0x0c0c0c0c),
                                            _mm256_set1_epi8((char)by));
        const __m256i bit = _mm256_set1_epi32(base % 8 ? (int32_t)0x80402010 : 0x08040201);
        const __m256i b = _mm256_and_si256(_mm256_shuffle_epi8(qh, idx), bit);
        u[v] = _mm256_or_si256(u[v], _mm256_and_si256(_mm256_cmpeq_epi8(b, bit), five));
    }
}

/* The integer lanes of one half (eight rows) against one token's quants
 * q[v] (four of them, broadcast): NIB/Q5 as in the comment above; for
 * q8_0 u holds |codes| and s the signed codes. */
#define PK_ISUM(NIB, Q5, u, s, q, out)                                                               \
    do {                                                                                           \
        const __m256i one16 = _mm256_set1_epi16(1);                                                \
        if (NIB && !Q5) {                                                                          \
            __m256i p = _mm256_maddubs_epi16(u[0], q[0]);                                          \
            _Pragma("GCC unroll 8") for (int v = 1; v < 8; v++)                                    \
                p = _mm256_add_epi16(p, _mm256_maddubs_epi16(u[v], q[v]));                          \
            out = _mm256_madd_epi16(p, one16);                                                     \
        } else if (NIB) {                                                                          \
            __m256i p0 = _mm256_maddubs_epi16(u[0], q[0]), p1 = _mm256_maddubs_epi16(u[4], q[4]);  \
            _Pragma("GCC unroll 4") for (int v = 1; v < 4; v++) {                                  \
                p0 = _mm256_add_epi16(p0, _mm256_maddubs_epi16(u[v], q[v]));                        \
                p1 = _mm256_add_epi16(p1, _mm256_maddubs_epi16(u[v + 4], q[v + 4]));                \
            }                                                                                      \
            out = _mm256_add_epi32(_mm256_madd_epi16(p0, one16), _mm256_madd_epi16(p1, one16));    \
        } else {                                                                                   \
            __m256i i0 = _mm256_madd_epi16(_mm256_maddubs_epi16(u[0], _mm256_sign_epi8(q[0], s[0])), one16); \
            __m256i i1 = _mm256_madd_epi16(_mm256_maddubs_epi16(u[1], _mm256_sign_epi8(q[1], s[1])), one16); \
            _Pragma("GCC unroll 4") for (int v = 2; v < 8; v += 2) {                               \
                i0 = _mm256_add_epi32(i0, _mm256_madd_epi16(                                       \
                                              _mm256_maddubs_epi16(u[v], _mm256_sign_epi8(q[v], s[v])), one16)); \
                i1 = _mm256_add_epi32(i1, _mm256_madd_epi16(                                       \
                                              _mm256_maddubs_epi16(u[v + 1], _mm256_sign_epi8(q[v + 1], s[v + 1])), one16)); \
            }                                                                                      \
            out = _mm256_add_epi32(i0, i1);                                                        \
        }                                                                                          \
    } while (0)

#define DEFINE_PACKED256(NAME, AT, NIB, Q5, HAS_M, OFS, REF)                                        \
    /* one group x NT tokens: da/sa/ca at [b * PKT + t]; hr[h]: rows of half h to store */         \
    T2 static inline __attribute__((always_inline)) void NAME##_grp(                               \
        int64_t nb, const uint8_t *g, size_t gbb, const AT *const *at, const float *da,           \
        const float *sa, const int32_t *ca, float *y, size_t ys, const int hr[2], const int NT) {  \
        __m256 acc[2][PKT];                                                                        \
        _Pragma("GCC unroll 16") for (int t = 0; t < NT; t++) acc[0][t] = acc[1][t] = _mm256_setzero_ps(); \
        for (int64_t b = 0; b < nb; b++) {                                                         \
            const uint8_t *gb = g + (size_t)b * gbb;                                               \
            if (PK_PF)                                                                             \
                for (size_t o = 0; o < gbb; o += 64) _mm_prefetch((const char *)gb + PK_PF + o, _MM_HINT_T0); \
            __m256 dw[2], mw[2];                                                                   \
            __m256i u[2][8], s[2][8];                                                              \
            const uint8_t *cp = gb + (HAS_M ? 64 : 32);                                            \
            _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {                                  \
                dw[h] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(gb + 16 * h)));         \
                mw[h] = HAS_M ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(gb + 32 + 16 * h))) \
                              : _mm256_setzero_ps();                                               \
                if (NIB) {                                                                         \
                    const __m256i lo = _mm256_set1_epi8(0x0f);                                     \
                    _Pragma("GCC unroll 4") for (int v = 0; v < 4; v++) {                          \
                        const __m256i p = _mm256_loadu_si256((const __m256i *)(cp + 64 * v + 32 * h)); \
                        u[h][v] = _mm256_and_si256(p, lo);                                         \
                        u[h][v + 4] = _mm256_and_si256(_mm256_srli_epi16(p, 4), lo);               \
                    }                                                                              \
                    if (Q5) q5_fifth_bits(u[h], _mm256_loadu_si256((const __m256i *)(cp + 256 + 32 * h))); \
                } else {                                                                           \
                    _Pragma("GCC unroll 8") for (int v = 0; v < 8; v++) {                          \
                        s[h][v] = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(cp + 64 * v + 32 * h)), \
                                                   _mm256_set1_epi8((char)0x80));                 \
                        u[h][v] = _mm256_abs_epi8(s[h][v]);                                        \
                    }                                                                              \
                }                                                                                  \
            }                                                                                      \
            _Pragma("GCC unroll 16") for (int t = 0; t < NT; t++) {                                \
                const int8_t *qa = at[t][b].qs;                                                    \
                __m256i q[8];                                                                      \
                _Pragma("GCC unroll 8") for (int v = 0; v < 8; v++) q[v] = _mm256_set1_epi32(load_i32(qa + 4 * v)); \
                const __m256 dab = _mm256_set1_ps(da[b * PKT + t]);                                \
                _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {                              \
                    __m256i i;                                                                     \
                    PK_ISUM(NIB, Q5, u[h], s[h], q, i);                                            \
                    if (OFS) i = _mm256_add_epi32(i, _mm256_set1_epi32(ca[b * PKT + t]));          \
                    acc[h][t] = _mm256_fmadd_ps(_mm256_mul_ps(dw[h], dab), _mm256_cvtepi32_ps(i), acc[h][t]); \
                    if (HAS_M) acc[h][t] = _mm256_fmadd_ps(mw[h], _mm256_set1_ps(sa[b * PKT + t]), acc[h][t]); \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
        _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {                                      \
            if (hr[h] == 8) {                                                                      \
                _Pragma("GCC unroll 16") for (int t = 0; t < NT; t++)                              \
                    _mm256_storeu_ps(y + (size_t)t * ys + 8 * h, acc[h][t]);                        \
            } else if (hr[h] > 0) {                                                                \
                const __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32(hr[h]), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)); \
                _Pragma("GCC unroll 16") for (int t = 0; t < NT; t++)                              \
                    _mm256_maskstore_ps(y + (size_t)t * ys + 8 * h, m, acc[h][t]);                 \
            }                                                                                      \
        }                                                                                          \
    }                                                                                              \
                                                                                                   \
    T2 void NAME(int64_t n, const void *w, size_t w_stride, int n_w, const void *a,          \
                        size_t a_stride, int n_a, float *y, size_t y_stride) {                     \
        const int64_t nb = n / 32;                                                                 \
        if (nb > PK_MAXB) {                                                                        \
            REF(n, w, w_stride, n_w, a, a_stride, n_a, y, y_stride);                               \
            return;                                                                                \
        }                                                                                          \
        const size_t gbb = w_stride / (size_t)nb;                                                  \
        float da[PKT * PK_MAXB];                                                                   \
        union {                                                                                    \
            float s[PKT * PK_MAXB];                                                                \
            int32_t c[PKT * PK_MAXB];                                                              \
        } ex;                                                                                      \
        for (int t0 = 0; t0 < n_a; t0 += PKT) {                                                    \
            const int nt = n_a - t0 < PKT ? n_a - t0 : PKT;                                        \
            const AT *at[PKT];                                                                     \
            for (int t = 0; t < nt; t++) at[t] = (const AT *)(const void *)((const char *)a + (size_t)(t0 + t) * a_stride); \
            for (int64_t b = 0; b < nb; b++)                                                       \
                for (int t = 0; t < nt; t++) {                                                     \
                    da[b * PKT + t] = h2f(at[t][b].d);                                             \
                    if (HAS_M) ex.s[b * PKT + t] = h2f(ACT_S(at[t][b]));                           \
                    if (OFS) {                                                                     \
                        int32_t sq = 0;                                                            \
                        for (int j = 0; j < 32; j++) sq += at[t][b].qs[j];                         \
                        ex.c[b * PKT + t] = -OFS * sq;                                             \
                    }                                                                              \
                }                                                                                  \
            for (int r0 = 0; r0 < n_w; r0 += 16) {                                                 \
                const uint8_t *g = (const uint8_t *)w + (size_t)(r0 / 16) * w_stride;              \
                const int left = n_w - r0;                                                         \
                const int hr[2] = {left >= 8 ? 8 : left, left >= 16 ? 8 : left > 8 ? left - 8 : 0}; \
                float *yg = y + (size_t)t0 * y_stride + (size_t)r0;                                \
                switch (nt) {                                                                      \
                    PK_CASES(NAME)                                                                 \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
    }

#define PK_CASE(NAME, K) \
    case K: NAME##_grp(nb, g, gbb, at, da, ex.s, ex.c, yg, y_stride, hr, K); break;
#define PK_CASES(NAME)                                                                              \
    PK_CASE(NAME, 1) PK_CASE(NAME, 2) PK_CASE(NAME, 3) PK_CASE(NAME, 4) PK_CASE(NAME, 5)            \
    PK_CASE(NAME, 6) PK_CASE(NAME, 7) PK_CASE(NAME, 8) PK_CASE(NAME, 9) PK_CASE(NAME, 10)           \
    PK_CASE(NAME, 11) PK_CASE(NAME, 12) PK_CASE(NAME, 13) PK_CASE(NAME, 14) PK_CASE(NAME, 15)       \
    PK_CASE(NAME, 16)

#define ACT_S(blk) (blk).s
DEFINE_PACKED256(qi_k_gemm_packed_q4_1_avx2, qi_block_q8_1, 1, 0, 1, 0, qi_k_gemm_packed_q4_1_ref)
DEFINE_PACKED256(qi_k_gemm_packed_q5_1_avx2, qi_block_q8_1, 1, 1, 1, 0, qi_k_gemm_packed_q5_1_ref)
#undef ACT_S
#define ACT_S(blk) (blk).d
DEFINE_PACKED256(qi_k_gemm_packed_q4_0_avx2, qi_block_q8_0, 1, 0, 0, 8, qi_k_gemm_packed_q4_0_ref)
DEFINE_PACKED256(qi_k_gemm_packed_q5_0_avx2, qi_block_q8_0, 1, 1, 0, 16, qi_k_gemm_packed_q5_0_ref)
/* q8_0: signed codes, no offset correction (OFS 0) */
DEFINE_PACKED256(qi_k_gemm_packed_q8_0_avx2, qi_block_q8_0, 0, 0, 0, 0, qi_k_gemm_packed_q8_0_ref)
#undef ACT_S

#endif

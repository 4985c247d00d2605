/* kernels_avx512_packed.c - the AVX-512 table's matmuls over packed
 * weights (kernels.h, "Packed weights"), bit-identical to the packed
 * reference (kernels_packed.c; test_kernels.c checks). kernels_avx512.c
 * holds the rest of the table. */
#include "kernels.h"

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)

#include <immintrin.h>
#include <string.h>

#include "qinfer/quant.h"

#include "kernels_avx512_k.h"

/* ---- packed weights ----------------------------------------------------------------------
 *
 * A 16-row group (kernels.h, "Packed weights") is one zmm per four codes of
 * every row: vpdpbusd against the token's four activation quants, broadcast,
 * adds them into the row's lane, so eight of them give each lane its block's
 * exact integer dot, and the float step (convert, scale product, fused
 * multiply-add) is one instruction per 16 rows. The codes of a group block
 * are unpacked once for up to PKT tokens. */

#define PKT 16      /* tokens per pass */
#ifndef PK_PF
#define PK_PF 8192 /* bytes of packed groups prefetched ahead; 0: none */
#endif
#define PK_MAXB 512 /* blocks per row the prepared scales hold (n <= 16384); longer rows: the reference */

T5 static inline int32_t load_i32(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* q5's fifth bits into the codes: u[v] holds elements 4v..4v+3 of each
 * row (bytes 4r..4r+3), u[v + 4] elements 16+4v..16+4v+3; row r's bits are
 * dword r of qh (bit j: element j). Shifting the dwords brings an element
 * group's four bits to the bottom, vpshufb copies each dword's low byte to
 * its four bytes, and byte i tests bit i. */
T5 static inline __attribute__((always_inline)) void q5_fifth_bits(__m512i u[8], __m512i qh) {
    const __m512i spread = _mm512_set4_epi32(0x0c0c0c0c, 0x08080808, 0x04040404, 0x00000000);
    const __m512i bit = _mm512_set1_epi32(0x08040201), five = _mm512_set1_epi8(0x10);
    _Pragma("GCC unroll 8") for (int v = 0; v < 8; v++) {
        const __m512i b = _mm512_shuffle_epi8(_mm512_srli_epi32(qh, v < 4 ? 4 * v : 16 + 4 * (v - 4)), spread);
        u[v] = _mm512_mask_add_epi8(u[v], _mm512_test_epi8_mask(b, bit), u[v], five);
    }
}

#define DEFINE_PACKED512(NAME, AT, NIB, Q5, HAS_M, OFS, REF)                                        \
    /* one group x NT tokens: da/sa/ca at [b * PKT + t] */                                        \
    T5 static inline __attribute__((always_inline)) void NAME##_grp(                               \
        int64_t nb, const uint8_t *g, size_t gbb, const AT *const *at, const float *da,           \
        const float *sa, const int32_t *ca, float *y, size_t ys, __mmask16 rows, const int NT) {   \
        __m512 acc[PKT];                                                                           \
        _Pragma("GCC unroll 16") for (int t = 0; t < NT; t++) acc[t] = _mm512_setzero_ps();        \
        for (int64_t b = 0; b < nb; b++) {                                                         \
            const uint8_t *gb = g + (size_t)b * gbb;                                               \
            if (PK_PF)                                                                  \
                for (size_t o = 0; o < gbb; o += 64) _mm_prefetch((const char *)gb + PK_PF + o, _MM_HINT_T0); \
            const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)gb));            \
            const __m512 mw = HAS_M ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(gb + 32))) \
                                    : _mm512_setzero_ps();                                         \
            const uint8_t *cp = gb + (HAS_M ? 64 : 32);                                            \
            __m512i u[8];                                                                          \
            if (NIB) {                                                                             \
                const __m512i lo = _mm512_set1_epi8(0x0f);                                         \
                _Pragma("GCC unroll 4") for (int v = 0; v < 4; v++) {                              \
                    const __m512i p = _mm512_loadu_si512((const void *)(cp + 64 * v));             \
                    u[v] = _mm512_and_si512(p, lo);                                                \
                    u[v + 4] = _mm512_and_si512(_mm512_srli_epi16(p, 4), lo);                      \
                }                                                                                  \
                if (Q5) q5_fifth_bits(u, _mm512_loadu_si512((const void *)(cp + 256)));            \
            } else {                                                                               \
                _Pragma("GCC unroll 8") for (int v = 0; v < 8; v++) u[v] = _mm512_loadu_si512((const void *)(cp + 64 * v)); \
            }                                                                                      \
            _Pragma("GCC unroll 16") for (int t = 0; t < NT; t++) {                                \
                const int8_t *q = at[t][b].qs;                                                     \
                /* two chains of four: half the latency of one of eight */                       \
                __m512i i = OFS ? _mm512_set1_epi32(ca[b * PKT + t]) : _mm512_setzero_si512();     \
                __m512i i2 = _mm512_setzero_si512();                                               \
                _Pragma("GCC unroll 4") for (int v = 0; v < 8; v += 2) {                           \
                    i = _mm512_dpbusd_epi32(i, u[v], _mm512_set1_epi32(load_i32(q + 4 * v)));      \
                    i2 = _mm512_dpbusd_epi32(i2, u[v + 1], _mm512_set1_epi32(load_i32(q + 4 * v + 4))); \
                }                                                                                  \
                i = _mm512_add_epi32(i, i2);                                                       \
                acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(dw, _mm512_set1_ps(da[b * PKT + t])),       \
                                         _mm512_cvtepi32_ps(i), acc[t]);                           \
                if (HAS_M) acc[t] = _mm512_fmadd_ps(mw, _mm512_set1_ps(sa[b * PKT + t]), acc[t]);  \
            }                                                                                      \
        }                                                                                          \
        _Pragma("GCC unroll 16") for (int t = 0; t < NT; t++)                                      \
            _mm512_mask_storeu_ps(y + (size_t)t * ys, rows, acc[t]);                               \
    }                                                                                              \
                                                                                                   \
    T5 void NAME(int64_t n, const void *w, size_t w_stride, int n_w, const void *a,          \
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
                const __mmask16 rows = n_w - r0 >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n_w - r0)) - 1); \
                float *yg = y + (size_t)t0 * y_stride + (size_t)r0;                                \
                switch (nt) {                                                                      \
                    PK_CASES(NAME)                                                                 \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
    }

#define PK_CASE(NAME, K) \
    case K: NAME##_grp(nb, g, gbb, at, da, ex.s, ex.c, yg, y_stride, rows, K); break;
#define PK_CASES(NAME)                                                                              \
    PK_CASE(NAME, 1) PK_CASE(NAME, 2) PK_CASE(NAME, 3) PK_CASE(NAME, 4) PK_CASE(NAME, 5)            \
    PK_CASE(NAME, 6) PK_CASE(NAME, 7) PK_CASE(NAME, 8) PK_CASE(NAME, 9) PK_CASE(NAME, 10)           \
    PK_CASE(NAME, 11) PK_CASE(NAME, 12) PK_CASE(NAME, 13) PK_CASE(NAME, 14) PK_CASE(NAME, 15)       \
    PK_CASE(NAME, 16)

#define ACT_S(blk) (blk).s
DEFINE_PACKED512(qi_k_gemm_packed_q4_1_avx512, qi_block_q8_1, 1, 0, 1, 0, qi_k_gemm_packed_q4_1_ref)
DEFINE_PACKED512(qi_k_gemm_packed_q5_1_avx512, qi_block_q8_1, 1, 1, 1, 0, qi_k_gemm_packed_q5_1_ref)
#undef ACT_S
#define ACT_S(blk) (blk).d
DEFINE_PACKED512(qi_k_gemm_packed_q4_0_avx512, qi_block_q8_0, 1, 0, 0, 8, qi_k_gemm_packed_q4_0_ref)
DEFINE_PACKED512(qi_k_gemm_packed_q5_0_avx512, qi_block_q8_0, 1, 1, 0, 16, qi_k_gemm_packed_q5_0_ref)
DEFINE_PACKED512(qi_k_gemm_packed_q8_0_avx512, qi_block_q8_0, 0, 0, 0, 128, qi_k_gemm_packed_q8_0_ref)
#undef ACT_S

#endif

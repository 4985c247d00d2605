/* kernels_avx512_k.h - the K-quant pieces the AVX-512 matmuls share
 * (kernels_avx512.c's ggml and tiled orders, kernels_amx.c's tile matmul):
 * a weight super-block's codes and scales unpacked, its integer dot with
 * one token, and the activation side of a 16-token pass in token lanes.
 * Static inline, compiled for the AVX-512 target T5 in each includer;
 * include after <immintrin.h>. See kernels_avx512.c's "K quants" comment.
 */
#ifndef QI_KERNELS_AVX512_K_H
#define QI_KERNELS_AVX512_K_H

#include <stdint.h>
#include <string.h>

#include "qinfer/quant.h"

#define T5 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))

T5 static inline float h2f(uint16_t h) { return _cvtsh_ss(h); }

#define KQ_MAX 32 /* super-blocks per row of the tiled paths (n <= 8192); longer rows use AVX2 */
#define KTB 16    /* tokens per pass of the tiled paths: one zmm lane each */
#define KTN 4     /* tokens per pass of the T < 8 paths */

/* q4_K scales and mins of a super-block as bytes: u[0..1] sc[0..7],
 * u[2..3] mn[0..7] (qi_k_scale_min, four at a time). */
T5 static inline void q4_K_scales(const uint8_t s[12], uint32_t u[4]) {
    uint32_t v[3];
    memcpy(v, s, 12);
    u[0] = v[0] & 0x3f3f3f3f;
    u[1] = (v[2] & 0x0f0f0f0f) | ((v[0] >> 6) & 0x03030303) << 4;
    u[2] = v[1] & 0x3f3f3f3f;
    u[3] = ((v[2] >> 4) & 0x0f0f0f0f) | ((v[1] >> 6) & 0x03030303) << 4;
}

/* A weight super-block ready for the integer dot: q[j] the codes of
 * elements 64j..64j+63, sc[j] the int16 scale of each of its 32 pairs. */
typedef struct {
    __m512i q[4], sc[4];
} kprep;

T5 static inline void prep_q4_K(const qi_block_q4_K *x, const uint32_t u[4], kprep *p) {
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    const __m512i v0 = _mm512_loadu_si512(x->qs), v1 = _mm512_loadu_si512(x->qs + 64);
    /* low nibbles of qs[0..63] are sub-blocks 0 and 2, high ones 1 and 3 */
    const __m512i l0 = _mm512_and_si512(v0, m4), h0 = _mm512_and_si512(_mm512_srli_epi16(v0, 4), m4);
    const __m512i l1 = _mm512_and_si512(v1, m4), h1 = _mm512_and_si512(_mm512_srli_epi16(v1, 4), m4);
    p->q[0] = _mm512_shuffle_i64x2(l0, h0, 0x44);
    p->q[1] = _mm512_shuffle_i64x2(l0, h0, 0xee);
    p->q[2] = _mm512_shuffle_i64x2(l1, h1, 0x44);
    p->q[3] = _mm512_shuffle_i64x2(l1, h1, 0xee);
    /* pair i of chunk j belongs to sub-block 2j + i / 16 */
    const __m512i sc = _mm512_castsi128_si512(_mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)(const void *)u)));
    for (int j = 0; j < 4; j++) {
        const __m512i idx = _mm512_inserti64x4(_mm512_set1_epi16((short)(2 * j)), _mm256_set1_epi16((short)(2 * j + 1)), 1);
        p->sc[j] = _mm512_permutexvar_epi16(idx, sc);
    }
}

T5 static inline void prep_q6_K(const qi_block_q6_K *x, kprep *p) {
    const __m512i m4 = _mm512_set1_epi8(0x0f), m2 = _mm512_set1_epi8(0x30);
    /* the two bits of qh for elements l, l+32 (chunk 2h) sit at bits 0-1, 2-3;
     * for l+64, l+96 (chunk 2h+1) at 4-5, 6-7: per-half shifts to bits 4-5
     * (16-bit shifts: the bits crossing into the next byte are masked off) */
    const __m512i up = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1);
    const __m512i down = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
    for (int h = 0; h < 2; h++) {
        const __m512i l = _mm512_loadu_si512(x->ql + 64 * h);
        const __m512i hb = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(x->qh + 32 * h)));
        p->q[2 * h] = _mm512_or_si512(_mm512_and_si512(l, m4), _mm512_and_si512(_mm512_sllv_epi16(hb, up), m2));
        p->q[2 * h + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), m4),
                                          _mm512_and_si512(_mm512_srlv_epi16(hb, down), m2));
    }
    /* pair i of chunk j belongs to the 16-element group 4j + i / 8 */
    const __m512i sc = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x->scales)));
    const __m512i step = _mm512_set_epi16(3, 3, 3, 3, 3, 3, 3, 3, 2, 2, 2, 2, 2, 2, 2, 2,
                                          1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    for (int j = 0; j < 4; j++)
        p->sc[j] = _mm512_permutexvar_epi16(_mm512_add_epi16(step, _mm512_set1_epi16((short)(4 * j))), sc);
}

/* The 16 int32 partial sums of one (super-block, token): lane l holds
 * elements 4l..4l+3 of each chunk, scaled. */
T5 static inline __m512i kdot(const kprep *p, const int8_t *qa) {
    __m512i acc = _mm512_setzero_si512();
    for (int j = 0; j < 4; j++)
        acc = _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(p->q[j], _mm512_loadu_si512(qa + 64 * j)), p->sc[j]);
    return acc;
}

/* The activation side of a tiled pass, token lanes: d, and int16 pairs of
 * 16-element sums (q4_K: pair l = S[2l], S[2l+1] with S[s] the sum of
 * 32-element sub-block s; q6_K: pair p = bsums[2p], bsums[2p+1]). Lanes past
 * nt are zero. */
typedef struct {
    __m512 d[KQ_MAX];
    __m512i s[KQ_MAX][8];
} kacts;

T5 static inline void kacts_fill(kacts *ka, int64_t nb, const qi_block_q8_K *const *ya, int nt, int q4) {
    for (int64_t b = 0; b < nb; b++) {
        float d[KTB] = {0};
        uint32_t s[8][KTB] = {{0}};
        for (int t = 0; t < nt; t++) {
            const int16_t *bs = ya[t][b].bsums;
            d[t] = ya[t][b].d;
            for (int p = 0; p < (q4 ? 4 : 8); p++) {
                /* |S[s]| <= 2 * 16 * 128: an int16 */
                const int16_t lo = q4 ? (int16_t)(bs[4 * p] + bs[4 * p + 1]) : bs[2 * p];
                const int16_t hi = q4 ? (int16_t)(bs[4 * p + 2] + bs[4 * p + 3]) : bs[2 * p + 1];
                s[p][t] = (uint16_t)lo | (uint32_t)(uint16_t)hi << 16;
            }
        }
        ka->d[b] = _mm512_loadu_ps(d);
        for (int p = 0; p < 8; p++) ka->s[b][p] = _mm512_loadu_si512(s[p]);
    }
}

/* sum over pairs p < np of ka->s[b][p] . (w16[2p], w16[2p+1]), token lanes */
T5 static inline __m512i kacts_dot(const kacts *ka, int64_t b, const int16_t *w16, int np) {
    uint32_t pr[8];
    memcpy(pr, w16, 4 * (size_t)np);
    __m512i s = _mm512_setzero_si512();
    for (int p = 0; p < np; p++) s = _mm512_dpwssd_epi32(s, ka->s[b][p], _mm512_set1_epi32((int)pr[p]));
    return s;
}

#endif

/* kernels_avx512.c - AVX-512 (F, BW, VL, VNNI) versions of the hottest kernels.
 *
 * Same results as the references, bit for bit, by the same argument as
 * kernels_avx2.c: the integer lanes are exact whichever instructions make
 * them, and every float operation of the reference is performed once, in
 * the same order, on the same operands. What AVX-512 adds is width:
 *   - block dots: one vpdpbusd makes the eight lanes of a block; a zmm holds
 *     the eight-lane accumulators of two (row, token) pairs side by side
 *     (two tokens against one weight block in prefill, two weight rows
 *     against one token in decode), and each half is reduced with the hsum8
 *     tree on its own. Signed weights enter as unsigned codes plus an offset
 *     whose exact integer correction depends on the activations only (see
 *     ucodes_q4_0), so it is made once per activation block, not once per
 *     weight row; prefill prepares a chunk of 16 tokens' activations once
 *     (pairs, corrections, scales) and runs only the token pairs it has.
 *     Decode's eight-row path prefetches the rows PF_ROWS ahead: it streams
 *     weights, and the hardware prefetchers alone leave much of the memory
 *     bandwidth unused (1.3-2x decode throughput where measured). The K
 *     quants' decode path prefetches PF_KBYTES ahead in its rows' stream
 *     (1.2-1.4x tg32 on Qwen2.5-Coder-1.5B Q4_K_M, 3 alternating rounds).
 *   - K quants (q4_K, q6_K): the integer sums of a super-block 64 elements
 *     per instruction pair (vpmaddubsw, then vpdpwssd with the sub-block
 *     scales); a weight super-block is unpacked once per pass over several
 *     tokens (16 in the tiled order, T >= 8, whose epilogue then runs with
 *     one token per lane; 4 in ggml's order); see the section's comment.
 *   - F16 dots: a 16-lane accumulator is one zmm, and _mm512_reduce_add_ps
 *     is the hsum16 tree (GCC's implementation, as in ggml).
 * Softmax and SwiGLU keep the AVX2 versions (a small share of the time);
 * the table starts as a copy of the AVX2 one.
 */
#include "kernels.h"

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)

#include <immintrin.h>
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "qinfer/quant.h"

#include "kernels_avx512_k.h"

T5 static inline float hsum8(__m256 x) {
    __m128 r = _mm_add_ps(_mm256_extractf128_ps(x, 1), _mm256_castps256_ps128(x));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    return _mm_cvtss_f32(r);
}

/* ---- block dots ---------------------------------------------------------------- */

T5 static inline __m256i nibbles(const uint8_t *qs) {
    const __m128i t = _mm_loadu_si128((const __m128i *)qs);
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(t, 4), t), _mm256_set1_epi8(0x0f));
}

T5 static inline __m256i bits_to_bytes(const uint8_t *qh) {
    const uint32_t x = (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 | (uint32_t)qh[3] << 24;
    return _mm256_movm_epi8((__mmask32)x);
}

/* A weight block's codes as unsigned bytes u = q + OFS, OFS the format's
 * offset (q4_0 8, q5_0 16, q8_0 128; the _1 formats' codes are unsigned
 * already), so vpdpbusd takes them as they are. Lane l of a block's integer
 * dot is then vpdpbusd(u, y)_l - OFS * (y_4l + y_4l+1 + y_4l+2 + y_4l+3),
 * exactly: the correction depends on the activations alone, is made once
 * per activation block (ofs_corr) and is the accumulator vpdpbusd starts
 * from. */
T5 static inline __m256i ucodes_q4_0(const qi_block_q4_0 *b) { return nibbles(b->qs); }
T5 static inline __m256i ucodes_q4_1(const qi_block_q4_1 *b) { return nibbles(b->qs); }
T5 static inline __m256i ucodes_q5_0(const qi_block_q5_0 *b) {
    return _mm256_or_si256(nibbles(b->qs), _mm256_and_si256(bits_to_bytes(b->qh), _mm256_set1_epi8(0x10)));
}
T5 static inline __m256i ucodes_q5_1(const qi_block_q5_1 *b) {
    return _mm256_or_si256(nibbles(b->qs), _mm256_and_si256(bits_to_bytes(b->qh), _mm256_set1_epi8(0x10)));
}
T5 static inline __m256i ucodes_q8_0(const qi_block_q8_0 *b) {
    return _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)b->qs), _mm256_set1_epi8((char)0x80));
}

/* -OFS * (the sums of four activation quants), per int32 lane of y. */
T5 static inline __m512i ofs_corr(int ofs, __m512i y) {
    return _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8((char)ofs), y));
}
T5 static inline __m256i ofs_corr256(int ofs, __m256i y) {
    return _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8((char)ofs), y));
}

T5 static inline __m512i dup256(__m256i q) { return _mm512_inserti64x4(_mm512_castsi256_si512(q), q, 1); }
T5 static inline __m512i cat256(__m256i lo, __m256i hi) { return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1); }
T5 static inline __m512i load2(const int8_t *lo, const int8_t *hi) {
    return cat256(_mm256_loadu_si256((const __m256i *)lo), _mm256_loadu_si256((const __m256i *)hi));
}
/* [a x8, b x8] */
T5 static inline __m512 pair_scale(float a, float b) {
    return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_set1_ps(a)),
                                               _mm256_castps_pd(_mm256_set1_ps(b)), 1));
}
T5 static inline __m256 hi256(__m512 a) { return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)); }

#ifndef PF_ROWS
#define PF_ROWS 16 /* rows ahead that decode prefetches; 0: none */
#endif
#define KT 16 /* tokens per prefill pass: KT / 2 pairs, one zmm each */

/* The activations of up to KT tokens, prepared once for a pass over the
 * weight rows: for each block b and token pair k (tokens 2k, 2k+1), at
 * [b * KT / 2 + k], their quants side by side, their offset corrections,
 * their scales (eight lanes each) and, for the _1 formats, their sums (at
 * [b * KT + t]). One allocation per matmul call. */
typedef struct {
    __m512i *y, *c;
    __m512 *d;
    float *s;
} achunk;

static void *achunk_alloc(achunk *ch, int64_t nb) {
    const size_t pairs = (size_t)nb * (KT / 2) * 64;
    char *m = aligned_alloc(64, 3 * pairs + (size_t)nb * KT * sizeof(float) + 64);
    if (!m) return NULL;
    ch->y = (__m512i *)(void *)m;
    ch->c = (__m512i *)(void *)(m + pairs);
    ch->d = (__m512 *)(void *)(m + 2 * pairs);
    ch->s = (float *)(void *)(m + 3 * pairs);
    return m;
}

/* The decode path gathers d (and m) of eight rows as the first four bytes
 * of their blocks. */
_Static_assert(offsetof(qi_block_q4_1, m) == 2 && offsetof(qi_block_q5_1, m) == 2, "m follows d");

/* One case of NAME##_chunk: the rows with NP token pairs. */
#define ROWS_NP(NAME, WT, NP)                                                                    \
    case NP:                                                                                     \
        for (int r = 0; r < n_w; r++) NAME##_rowp(nb, (const WT *)(w + (size_t)r * ws), ch, y + r, ys, nt, NP); \
        break;

#define DEFINE_GEMM512(NAME, WT, AT, UCODES, OFS, HAS_M, MF, SF)                                  \
    T5 static float NAME##_one(int64_t nb, const WT *x, const AT *y) {                            \
        __m256 c = _mm256_setzero_ps();                                                          \
        float m = 0.0f;                                                                          \
        for (int64_t b = 0; b < nb; b++) {                                                       \
            if (HAS_M)                                                                           \
                m = _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(h2f(x[b].MF)), _mm_set_ss(h2f(y[b].SF)), _mm_set_ss(m))); \
            const __m256i qy = _mm256_loadu_si256((const __m256i *)y[b].qs);                     \
            const __m256i l = _mm256_dpbusd_epi32(OFS ? ofs_corr256(OFS, qy) : _mm256_setzero_si256(), UCODES(&x[b]), qy); \
            c = _mm256_fmadd_ps(_mm256_set1_ps(h2f(x[b].d) * h2f(y[b].d)), _mm256_cvtepi32_ps(l), c); \
        }                                                                                        \
        return HAS_M ? hsum8(c) + m : hsum8(c);                                                  \
    }                                                                                            \
                                                                                                 \
    /* one weight row x NP token pairs of a prepared chunk; NP a constant */                     \
    T5 static inline __attribute__((always_inline)) void NAME##_rowp(                            \
        int64_t nb, const WT *x, const achunk *ch, float *y, size_t ys, int nt, const int NP) {   \
        __m512 acc[KT / 2];                                                                      \
        for (int k = 0; k < NP; k++) acc[k] = _mm512_setzero_ps();                               \
        __m512 sm = _mm512_setzero_ps();                                                         \
        for (int64_t b = 0; b < nb; b++) {                                                       \
            const __m512i u = dup256(UCODES(&x[b]));                                             \
            const __m512 dw = _mm512_set1_ps(h2f(x[b].d));                                       \
            if (HAS_M)                                                                           \
                sm = _mm512_fmadd_ps(_mm512_set1_ps(h2f(x[b].MF)), _mm512_loadu_ps(ch->s + KT * b), sm); \
            const __m512i *yb = ch->y + b * (KT / 2), *cb = ch->c + b * (KT / 2);                 \
            const __m512 *db = ch->d + b * (KT / 2);                                             \
            for (int k = 0; k < NP; k++) {                                                       \
                const __m512i l = _mm512_dpbusd_epi32(OFS ? cb[k] : _mm512_setzero_si512(), u, yb[k]); \
                acc[k] = _mm512_fmadd_ps(_mm512_mul_ps(dw, db[k]), _mm512_cvtepi32_ps(l), acc[k]); \
            }                                                                                    \
        }                                                                                        \
        float s[KT];                                                                             \
        _mm512_storeu_ps(s, sm);                                                                 \
        for (int k = 0; k < nt && k < 2 * NP; k++) {                                           \
            const __m512 a = acc[k / 2];                                                         \
            const __m256 h = k & 1 ? hi256(a) : _mm512_castps512_ps256(a);                       \
            y[(size_t)k * ys] = HAS_M ? hsum8(h) + s[k] : hsum8(h);                              \
        }                                                                                        \
    }                                                                                            \
                                                                                                 \
    /* rows [0, n_w) x the chunk's nt tokens (2 <= nt <= KT) */                                  \
    T5 static void NAME##_chunk(int64_t nb, const char *w, size_t ws, int n_w, const achunk *ch, \
                                float *y, size_t ys, int nt) {                                   \
        switch ((nt + 1) / 2) {                                                                  \
            ROWS_NP(NAME, WT, 1) ROWS_NP(NAME, WT, 2) ROWS_NP(NAME, WT, 3) ROWS_NP(NAME, WT, 4)   \
            ROWS_NP(NAME, WT, 5) ROWS_NP(NAME, WT, 6) ROWS_NP(NAME, WT, 7) ROWS_NP(NAME, WT, 8)   \
        }                                                                                        \
    }                                                                                            \
                                                                                                 \
    /* n_w weight rows x one token, eight rows (four zmm) at a time */                           \
    T5 static void NAME##_rows(int64_t nb, const char *w, size_t ws, int n_w, const AT *y, float *out) { \
        int r = 0;                                                                               \
        const __m512i i01 = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);     \
        const __m512i two = _mm512_set1_epi32(2);                                                \
        const __m256i rowoff = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),      \
                                                  _mm256_set1_epi32((int)ws));                   \
        for (; r + 8 <= n_w; r += 8) {                                                           \
            const WT *x[8];                                                                      \
            for (int k = 0; k < 8; k++) x[k] = (const WT *)(w + (size_t)(r + k) * ws);           \
            __m512 c[4];                                                                         \
            for (int k = 0; k < 4; k++) c[k] = _mm512_setzero_ps();                              \
            __m256 sm = _mm256_setzero_ps();                                                     \
            for (int64_t b = 0; b < nb; b++) {                                                   \
                if (PF_ROWS && (b & 1) == 0 && r + 8 + PF_ROWS <= n_w)                              \
                    for (int k = 0; k < 8; k++) _mm_prefetch((const char *)&x[k][b] + PF_ROWS * ws, _MM_HINT_T0); \
                /* the first 4 bytes of each row's block: d, and m for the _1 formats */        \
                const __m256i dm = _mm256_i32gather_epi32((const int *)(const void *)&x[0][b], rowoff, 1); \
                const __m256 dw = _mm256_cvtph_ps(_mm256_cvtepi32_epi16(dm));                    \
                const __m512 dp = _mm512_castps256_ps512(_mm256_mul_ps(dw, _mm256_set1_ps(h2f(y[b].d)))); \
                if (HAS_M) {                                                                     \
                    const __m256 mw = _mm256_cvtph_ps(_mm256_cvtepi32_epi16(_mm256_srli_epi32(dm, 16))); \
                    sm = _mm256_fmadd_ps(mw, _mm256_set1_ps(h2f(y[b].SF)), sm);                  \
                }                                                                                \
                const __m512i yy = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)y[b].qs)); \
                const __m512i cy = OFS ? ofs_corr(OFS, yy) : _mm512_setzero_si512();             \
                __m512i idx = i01;                                                               \
                _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) {                            \
                    const __m512i l = _mm512_dpbusd_epi32(cy, cat256(UCODES(&x[2 * k][b]), UCODES(&x[2 * k + 1][b])), yy); \
                    c[k] = _mm512_fmadd_ps(_mm512_permutexvar_ps(idx, dp), _mm512_cvtepi32_ps(l), c[k]); \
                    idx = _mm512_add_epi32(idx, two);                                            \
                }                                                                                \
            }                                                                                    \
            float s[8];                                                                          \
            _mm256_storeu_ps(s, sm);                                                             \
            for (int k = 0; k < 8; k++) {                                                        \
                const __m256 h = k & 1 ? hi256(c[k / 2]) : _mm512_castps512_ps256(c[k / 2]);     \
                out[r + k] = HAS_M ? hsum8(h) + s[k] : hsum8(h);                                 \
            }                                                                                    \
        }                                                                                        \
        for (; r < n_w; r++) out[r] = NAME##_one(nb, (const WT *)(w + (size_t)r * ws), y);       \
    }                                                                                            \
                                                                                                 \
    T5 static void NAME(int64_t n, const void *w, size_t w_stride, int n_w, const void *a,        \
                        size_t a_stride, int n_a, float *y, size_t y_stride) {                   \
        const int64_t nb = n / 32;                                                               \
        const char *wc = w, *ac = a;                                                             \
        if (n_a == 1) {                                                                          \
            NAME##_rows(nb, wc, w_stride, n_w, (const AT *)ac, y);                               \
            return;                                                                              \
        }                                                                                        \
        achunk ch;                                                                               \
        void *mem = achunk_alloc(&ch, nb);                                                       \
        if (!mem) { /* no memory for the prepared activations: one dot at a time */              \
            for (int t = 0; t < n_a; t++)                                                        \
                for (int r = 0; r < n_w; r++)                                                    \
                    y[(size_t)t * y_stride + (size_t)r] = NAME##_one(                            \
                        nb, (const WT *)(wc + (size_t)r * w_stride), (const AT *)(ac + (size_t)t * a_stride)); \
            return;                                                                              \
        }                                                                                        \
        for (int t0 = 0; t0 < n_a; t0 += KT) {                                                   \
            const int nt = n_a - t0 < KT ? n_a - t0 : KT;                                        \
            float *yt = y + (size_t)t0 * y_stride;                                               \
            if (nt == 1) {                                                                       \
                NAME##_rows(nb, wc, w_stride, n_w, (const AT *)(ac + (size_t)t0 * a_stride), yt); \
                continue;                                                                        \
            }                                                                                    \
            /* an odd count's last pair repeats its token: valid data, result unused */          \
            const AT *ya[KT];                                                                    \
            for (int k = 0; k < KT; k++) ya[k] = (const AT *)(ac + (size_t)(t0 + (k < nt ? k : nt - 1)) * a_stride); \
            for (int64_t b = 0; b < nb; b++)                                                     \
                for (int k = 0; k < (nt + 1) / 2; k++) {                                         \
                    const __m512i q = load2(ya[2 * k][b].qs, ya[2 * k + 1][b].qs);               \
                    const size_t i = (size_t)b * (KT / 2) + (size_t)k;                           \
                    ch.y[i] = q;                                                                 \
                    if (OFS) ch.c[i] = ofs_corr(OFS, q);                                         \
                    ch.d[i] = pair_scale(h2f(ya[2 * k][b].d), h2f(ya[2 * k + 1][b].d));          \
                }                                                                                \
            if (HAS_M)                                                                           \
                for (int64_t b = 0; b < nb; b++)                                                 \
                    for (int k = 0; k < KT; k++) ch.s[(size_t)b * KT + (size_t)k] = h2f(ya[k][b].SF); \
            NAME##_chunk(nb, wc, w_stride, n_w, &ch, yt, y_stride, nt);                          \
        }                                                                                        \
        free(mem);                                                                               \
    }

DEFINE_GEMM512(gemm_q4_0_avx512, qi_block_q4_0, qi_block_q8_0, ucodes_q4_0, 8, 0, d, d)
DEFINE_GEMM512(gemm_q4_1_avx512, qi_block_q4_1, qi_block_q8_1, ucodes_q4_1, 0, 1, m, s)
DEFINE_GEMM512(gemm_q5_0_avx512, qi_block_q5_0, qi_block_q8_0, ucodes_q5_0, 16, 0, d, d)
DEFINE_GEMM512(gemm_q5_1_avx512, qi_block_q5_1, qi_block_q8_1, ucodes_q5_1, 0, 1, m, s)
DEFINE_GEMM512(gemm_q8_0_avx512, qi_block_q8_0, qi_block_q8_0, ucodes_q8_0, 128, 0, d, d)

/* ---- K quants ---------------------------------------------------------------------------- */

/* The integer part of a super-block dot is made 64 elements at a time:
 * vpmaddubsw (codes, unsigned, times activation quants: pair sums within
 * int16, since codes are at most 63) then vpdpwssd against the pairs'
 * sub-block scales, accumulating int32. Lane l of the sum (l < 16) holds
 * elements 4l..4l+3 of every 64-element chunk, so ggml's lane k (k < 8) is
 * lane k plus lane k + 8: exact integers, whatever the grouping. The float
 * epilogues are the references' operations, one per lane.
 *   T < 8 (gemm): ggml's 8 lanes per (row, token), converted and fused into
 *     a ymm accumulator, plus q4_K's four min lanes, as kernels_avx2.c.
 *   T >= 8 (gemm_wide): a weight super-block is unpacked once for up to 16
 *     tokens; each token's 16 int32 partial sums go through one transposing
 *     reduction tree (hsum16x16), so s1 arrives with one token per lane, and
 *     the min (q4_K) or -32 (q6_K) terms come from the activation sums
 *     transposed to token lanes once per pass. The float epilogue then runs
 *     on 16 tokens at once, each lane the reference's sequence. */

/* ggml's eight lanes from the 16 partial sums. */
T5 static inline __m256i kfold(__m512i acc) {
    return _mm256_add_epi32(_mm512_castsi512_si256(acc), _mm512_extracti64x4_epi64(acc, 1));
}

/* Lane t = the sum of the 16 lanes of v[KSLOT(t)]: a transposing tree. */
#define KSLOT(t) (4 * ((t) & 3) + ((t) >> 2))
T5 static inline __m512i hsum16x16(const __m512i v[16]) {
    __m512i w[8], x[4], y[2];
    for (int i = 0; i < 8; i++) /* 128-bit chunks 0-1: v[2i]'s halves summed, 2-3: v[2i+1]'s */
        w[i] = _mm512_add_epi32(_mm512_shuffle_i64x2(v[2 * i], v[2 * i + 1], 0x44),
                                _mm512_shuffle_i64x2(v[2 * i], v[2 * i + 1], 0xee));
    for (int i = 0; i < 4; i++) /* chunk k: v[4i + k] in four lanes */
        x[i] = _mm512_add_epi32(_mm512_shuffle_i64x2(w[2 * i], w[2 * i + 1], 0x88),
                                _mm512_shuffle_i64x2(w[2 * i], w[2 * i + 1], 0xdd));
    for (int i = 0; i < 2; i++) /* chunk k: v[8i + k] in lanes 0-1, v[8i + 4 + k] in 2-3 */
        y[i] = _mm512_add_epi32(_mm512_unpacklo_epi64(x[2 * i], x[2 * i + 1]),
                                _mm512_unpackhi_epi64(x[2 * i], x[2 * i + 1]));
    const __m512 a = _mm512_castsi512_ps(y[0]), b = _mm512_castsi512_ps(y[1]);
    /* chunk k, lane m: v[4m + k] */
    return _mm512_add_epi32(_mm512_castps_si512(_mm512_shuffle_ps(a, b, 0x88)),
                            _mm512_castps_si512(_mm512_shuffle_ps(a, b, 0xdd)));
}

T5 static inline void kstore(__m512 v, float *y, size_t ys, int nt) {
    float o[KTB];
    _mm512_storeu_ps(o, v);
    for (int t = 0; t < nt; t++) y[(size_t)t * ys] = o[t];
}

/* The tiled order for either type; q4 selects q4_K. */
T5 static inline __attribute__((always_inline)) void gemm_k_tiled(int64_t n, const void *w, size_t w_stride,
                                                                  int n_w, const void *a, size_t a_stride,
                                                                  int n_a, float *y, size_t y_stride, int q4) {
    const int64_t nb = n / 256;
    kacts ka;
    for (int t0 = 0; t0 < n_a; t0 += KTB) {
        const int nt = n_a - t0 < KTB ? n_a - t0 : KTB;
        const qi_block_q8_K *ya[KTB];
        for (int t = 0; t < nt; t++) ya[t] = (const qi_block_q8_K *)((const char *)a + (size_t)(t0 + t) * a_stride);
        kacts_fill(&ka, nb, ya, nt, q4);
        __m512i acc[KTB];
        for (int t = nt; t < KTB; t++) acc[KSLOT(t)] = _mm512_setzero_si512();
        for (int r = 0; r < n_w; r++) {
            const char *xr = (const char *)w + (size_t)r * w_stride;
            __m512 sum = _mm512_setzero_ps();
            for (int64_t b = 0; b < nb; b++) {
                kprep p;
                __m512i s1;
                if (q4) {
                    const qi_block_q4_K *x = (const qi_block_q4_K *)(const void *)xr + b;
                    uint32_t u[4];
                    q4_K_scales(x->scales, u);
                    prep_q4_K(x, u, &p);
                    for (int t = 0; t < nt; t++) acc[KSLOT(t)] = kdot(&p, ya[t][b].qs);
                    s1 = hsum16x16(acc);
                    int16_t mn[8];
                    for (int s = 0; s < 8; s++) mn[s] = (int16_t)((u[2 + s / 4] >> (8 * (s % 4))) & 0xff);
                    const __m512i s2 = kacts_dot(&ka, b, mn, 4);
                    __m512 rr = _mm512_mul_ps(_mm512_cvtepi32_ps(s1), _mm512_set1_ps(h2f(x->d)));
                    rr = _mm512_fmadd_ps(_mm512_set1_ps(-h2f(x->dmin)), _mm512_cvtepi32_ps(s2), rr);
                    sum = _mm512_fmadd_ps(rr, ka.d[b], sum);
                } else {
                    const qi_block_q6_K *x = (const qi_block_q6_K *)(const void *)xr + b;
                    prep_q6_K(x, &p);
                    for (int t = 0; t < nt; t++) acc[KSLOT(t)] = kdot(&p, ya[t][b].qs);
                    int16_t sc[16];
                    for (int s = 0; s < 16; s++) sc[s] = x->scales[s];
                    s1 = _mm512_sub_epi32(hsum16x16(acc), _mm512_slli_epi32(kacts_dot(&ka, b, sc, 8), 5));
                    const __m512 rr = _mm512_mul_ps(_mm512_cvtepi32_ps(s1), _mm512_set1_ps(h2f(x->d)));
                    sum = _mm512_fmadd_ps(rr, ka.d[b], sum);
                }
            }
            kstore(sum, y + (size_t)t0 * y_stride + (size_t)r, y_stride, nt);
        }
    }
}

T5 static void gemm_q4_K_tiled_avx512(int64_t n, const void *w, size_t w_stride, int n_w, const void *a,
                                      size_t a_stride, int n_a, float *y, size_t y_stride) {
    if (n / 256 > KQ_MAX) qi_kernels_avx2()->gemm_wide[QI_TYPE_Q4_K](n, w, w_stride, n_w, a, a_stride, n_a, y, y_stride);
    else gemm_k_tiled(n, w, w_stride, n_w, a, a_stride, n_a, y, y_stride, 1);
}

T5 static void gemm_q6_K_tiled_avx512(int64_t n, const void *w, size_t w_stride, int n_w, const void *a,
                                      size_t a_stride, int n_a, float *y, size_t y_stride) {
    if (n / 256 > KQ_MAX) qi_kernels_avx2()->gemm_wide[QI_TYPE_Q6_K](n, w, w_stride, n_w, a, a_stride, n_a, y, y_stride);
    else gemm_k_tiled(n, w, w_stride, n_w, a, a_stride, n_a, y, y_stride, 0);
}

/* Bytes ahead that the K-quant decode path prefetches (0: none): the rows
 * are read as one stream, which the hardware prefetchers follow with
 * fewer requests in flight than DRAM needs to be read at full rate. */
#ifndef PF_KBYTES
#define PF_KBYTES 2048
#endif

/* ggml's order (T < 8): per (row, token) the eight lanes into a ymm. */
T5 static inline __attribute__((always_inline)) void gemm_k_lanes(int64_t n, const void *w, size_t w_stride,
                                                                  int n_w, const void *a, size_t a_stride,
                                                                  int n_a, float *y, size_t y_stride, int q4) {
    const int64_t nb = n / 256;
    for (int t0 = 0; t0 < n_a; t0 += KTN) {
        const int nt = n_a - t0 < KTN ? n_a - t0 : KTN;
        const qi_block_q8_K *ya[KTN];
        for (int t = 0; t < nt; t++) ya[t] = (const qi_block_q8_K *)((const char *)a + (size_t)(t0 + t) * a_stride);
        for (int r = 0; r < n_w; r++) {
            const char *xr = (const char *)w + (size_t)r * w_stride;
            __m256 acc[KTN];
            __m128 accm[KTN];
            for (int t = 0; t < KTN; t++) {
                acc[t] = _mm256_setzero_ps();
                accm[t] = _mm_setzero_ps();
            }
            for (int64_t b = 0; b < nb; b++) {
                kprep p;
                if (PF_KBYTES && r + 1 < n_w) {
                    /* the bytes PF_KBYTES ahead in the rows' stream: the next rows' */
                    const char *pf = xr + (size_t)b * (q4 ? sizeof(qi_block_q4_K) : sizeof(qi_block_q6_K)) + PF_KBYTES;
                    for (int o = 0; o < (q4 ? 192 : 256); o += 64) _mm_prefetch(pf + o, _MM_HINT_T0);
                }
                if (q4) {
                    const qi_block_q4_K *x = (const qi_block_q4_K *)(const void *)xr + b;
                    uint32_t u[4];
                    q4_K_scales(x->scales, u);
                    prep_q4_K(x, u, &p);
                    /* word i = mn[i / 2]: madd with bsums gives mn[s] * S[s] */
                    const __m128i m = _mm_loadl_epi64((const __m128i *)(const void *)(u + 2));
                    const __m256i mnx = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m, m));
                    const float dw = h2f(x->d), dminw = h2f(x->dmin);
                    for (int t = 0; t < nt; t++) {
                        const qi_block_q8_K *yb = &ya[t][b];
                        const __m256i lanes = kfold(kdot(&p, yb->qs));
                        const __m256i ms = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)yb->bsums), mnx);
                        const __m128i prod = _mm_hadd_epi32(_mm256_castsi256_si128(ms), _mm256_extracti128_si256(ms, 1));
                        accm[t] = _mm_fmadd_ps(_mm_set1_ps(-yb->d * dminw), _mm_cvtepi32_ps(prod), accm[t]);
                        acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(yb->d * dw), _mm256_cvtepi32_ps(lanes), acc[t]);
                    }
                } else {
                    const qi_block_q6_K *x = (const qi_block_q6_K *)(const void *)xr + b;
                    prep_q6_K(x, &p);
                    const __m256i sc = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x->scales));
                    const float dw = h2f(x->d);
                    for (int t = 0; t < nt; t++) {
                        const qi_block_q8_K *yb = &ya[t][b];
                        const __m256i sub = _mm256_slli_epi32(
                            _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)yb->bsums), sc), 5);
                        const __m256i lanes = _mm256_sub_epi32(kfold(kdot(&p, yb->qs)), sub);
                        acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(yb->d * dw), _mm256_cvtepi32_ps(lanes), acc[t]);
                    }
                }
            }
            for (int t = 0; t < nt; t++) {
                float s = hsum8(acc[t]);
                if (q4) {
                    __m128 m = _mm_add_ps(accm[t], _mm_movehl_ps(accm[t], accm[t]));
                    m = _mm_add_ss(m, _mm_movehdup_ps(m));
                    s += _mm_cvtss_f32(m);
                }
                y[(size_t)(t0 + t) * y_stride + (size_t)r] = s;
            }
        }
    }
}

T5 static void gemm_q4_K_avx512(int64_t n, const void *w, size_t w_stride, int n_w, const void *a,
                                size_t a_stride, int n_a, float *y, size_t y_stride) {
    gemm_k_lanes(n, w, w_stride, n_w, a, a_stride, n_a, y, y_stride, 1);
}

T5 static void gemm_q6_K_avx512(int64_t n, const void *w, size_t w_stride, int n_w, const void *a,
                                size_t a_stride, int n_a, float *y, size_t y_stride) {
    gemm_k_lanes(n, w, w_stride, n_w, a, a_stride, n_a, y, y_stride, 0);
}

/* ---- F16 attention --------------------------------------------------------------------- */

T5 static inline __m512 ld16(const uint16_t *p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}

#define QF_MAX 1024

/* _mm512_reduce_add_ps of 16 vectors at once: lane p of the result is
 * what _mm512_reduce_add_ps(v[p]) gives, bit for bit. GCC's reduction adds
 * the upper 256 bits to the lower (lane i + 8 to lane i), then the upper
 * 128 of that to the lower, then lanes (2, 3) to (0, 1), then lane 1 to
 * lane 0; here each of those steps is done for several vectors in one
 * instruction, their halves first gathered side by side by shuffles, so
 * every addition adds the same two values in the same operand order (which
 * even decides a NaN's payload). A key's row of scores then costs about 3
 * vector operations for its reduction instead of 8. */
T5 static inline __m512 reduce16(const __m512 v[16]) {
    __m512 w[8], x[4], y[2];
    for (int i = 0; i < 8; i++) /* vectors 2i, 2i+1: upper 256 + lower 256 */
        w[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xEE),
                             _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x44));
    for (int i = 0; i < 4; i++) /* 128-bit lane q of x[i]: vector 4i + q, upper 128 + lower 128 */
        x[i] = _mm512_add_ps(_mm512_shuffle_f32x4(w[2 * i], w[2 * i + 1], 0xDD),
                             _mm512_shuffle_f32x4(w[2 * i], w[2 * i + 1], 0x88));
    for (int i = 0; i < 2; i++) /* elements (0, 1) + (2, 3) */
        y[i] = _mm512_add_ps(_mm512_shuffle_ps(x[2 * i], x[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(x[2 * i], x[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    /* element 0 + element 1; element 4q + m then holds vector 4m + q */
    const __m512 z = _mm512_add_ps(_mm512_shuffle_ps(y[0], y[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm512_shuffle_ps(y[0], y[1], _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), z);
}

/* ggml_vec_dot_f16's vector part over the first np (a multiple of 64)
 * elements of key row kp: four 16-lane accumulators, one per 16 elements
 * of each 64-element step, added (0 + 2) + (1 + 3) before the reduction. */
T5 static inline __m512 vec_lanes(const uint16_t *kp, const __m512 *qv, int np) {
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int i = 0; i < np; i += 64) {
        a0 = _mm512_fmadd_ps(ld16(kp + i), qv[i / 16], a0);
        a1 = _mm512_fmadd_ps(ld16(kp + i + 16), qv[i / 16 + 1], a1);
        a2 = _mm512_fmadd_ps(ld16(kp + i + 32), qv[i / 16 + 2], a2);
        a3 = _mm512_fmadd_ps(ld16(kp + i + 48), qv[i / 16 + 3], a3);
    }
    return _mm512_add_ps(_mm512_add_ps(a0, a2), _mm512_add_ps(a1, a3));
}

/* tinyBLAS's one accumulator over all D elements of key row kp. */
T5 static inline __m512 gemm_lanes(const uint16_t *kp, const __m512 *qv, int D) {
    __m512 acc = _mm512_setzero_ps();
    for (int i = 0; i < D / 16; i++) acc = _mm512_fmadd_ps(ld16(kp + 16 * i), qv[i], acc);
    return acc;
}

T5 static void attn_scores_avx512(qi_k_order ord, int D, const uint16_t *q16, const uint16_t *k,
                                  size_t k_stride, int n_pos, float *s) {
    if (D % 16 != 0 || D > QF_MAX) {
        qi_k_attn_scores_ref(ord, D, q16, k, k_stride, n_pos, s);
        return;
    }
    __m512 qv[QF_MAX / 16];
    for (int i = 0; i < D / 16; i++) qv[i] = ld16(q16 + 16 * i);
    if (ord == QI_K_ORD_GEMM) {
        int p = 0;
        for (; p + 16 <= n_pos; p += 16) {
            __m512 v[16];
            for (int j = 0; j < 16; j++) v[j] = gemm_lanes(k + (size_t)(p + j) * k_stride, qv, D);
            _mm512_storeu_ps(s + p, reduce16(v));
        }
        for (; p < n_pos; p++) s[p] = _mm512_reduce_add_ps(gemm_lanes(k + (size_t)p * k_stride, qv, D));
        return;
    }
    const int np = D & ~63;
    int p = 0;
    /* no elements past the 64-element steps: the double sum of one float
     * gives it back unchanged, so 16 keys can be reduced together */
    if (np == D)
        for (; p + 16 <= n_pos; p += 16) {
            __m512 v[16];
            for (int j = 0; j < 16; j++) v[j] = vec_lanes(k + (size_t)(p + j) * k_stride, qv, np);
            _mm512_storeu_ps(s + p, reduce16(v));
        }
    for (; p < n_pos; p++) {
        const uint16_t *kp = k + (size_t)p * k_stride;
        double sum = (double)_mm512_reduce_add_ps(vec_lanes(kp, qv, np));
        for (int i = np; i < D; i++) sum += (double)(h2f(kp[i]) * h2f(q16[i]));
        s[p] = (float)sum;
    }
}

/* The 16-lane tree over registers (lane l = register l). */
T5 static inline __m512 tree16(const __m512 r[16]) {
    __m512 t[8], u[4];
    for (int l = 0; l < 8; l++) t[l] = _mm512_add_ps(r[l + 8], r[l]);
    for (int l = 0; l < 4; l++) u[l] = _mm512_add_ps(t[l + 4], t[l]);
    return _mm512_add_ps(_mm512_add_ps(u[0], u[2]), _mm512_add_ps(u[1], u[3]));
}

#define WF_MAX 8192 /* positions whose weights attn_values converts once */

/* The VEC order (ggml_vec_dot_f16 over positions): position p feeds slot
 * p & 63 of every output dimension, each slot summing its positions in
 * order; the 64 slots are then combined as the reference does. Here NB
 * (= D / 16, a constant) zmm per slot, 16 / NB slots at a time in registers,
 * so each V row is read once, not once per 16 dimensions. */
T5 static inline __attribute__((always_inline)) void vec_slots(const int NB, const float *wf,
                                                               const uint16_t *const *blk, int shift,
                                                               size_t v_stride, int n_pos, float *out) {
    const size_t mask = ((size_t)1 << shift) - 1;
    const int S = 16 / NB;
    __m512 sl[64][16];
    for (int s0 = 0; s0 < 64; s0 += S) {
        __m512 acc[16];
        for (int i = 0; i < S * NB; i++) acc[i] = _mm512_setzero_ps();
        for (int base = s0; base < n_pos; base += 64)
            for (int s = 0; s < S; s++) {
                const int p = base + s;
                if (p >= n_pos) break;
                const __m512 wv = _mm512_set1_ps(wf[p]);
                const uint16_t *vr = blk[(size_t)p >> shift] + ((size_t)p & mask) * v_stride;
                for (int d = 0; d < NB; d++) acc[s * NB + d] = _mm512_fmadd_ps(wv, ld16(vr + 16 * d), acc[s * NB + d]);
            }
        for (int s = 0; s < S; s++)
            for (int d = 0; d < NB; d++) sl[s0 + s][d] = acc[s * NB + d];
    }
    for (int d = 0; d < NB; d++) {
        __m512 c[16];
        for (int l = 0; l < 16; l++)
            c[l] = _mm512_add_ps(_mm512_add_ps(sl[l][d], sl[32 + l][d]), _mm512_add_ps(sl[16 + l][d], sl[48 + l][d]));
        _mm512_storeu_ps(out + 16 * d, tree16(c));
    }
}

T5 static void attn_values_blk_avx512(qi_k_order ord, int D, const uint16_t *w16, const uint16_t *const *blk, int shift,
                                  size_t v_stride, int n_pos, float *out) {
    const size_t mask = ((size_t)1 << shift) - 1;
#define VROW(p) (blk[(size_t)(p) >> shift] + ((size_t)(p) & mask) * v_stride)
    if (D % 16 != 0 || n_pos > WF_MAX) {
        qi_kernels_avx2()->attn_values_blk(ord, D, w16, blk, shift, v_stride, n_pos, out);
        return;
    }
    /* the weights as floats once, not once per 16 output lanes */
    float wf[WF_MAX];
    int p = 0;
    for (; p + 16 <= n_pos; p += 16) _mm512_storeu_ps(wf + p, ld16(w16 + p));
    for (; p < n_pos; p++) wf[p] = h2f(w16[p]);
    for (int d0 = 0; d0 < D; d0 += 16) {
        if (ord == QI_K_ORD_GEMM) {
            __m512 acc[16];
            for (int l = 0; l < 16; l++) acc[l] = _mm512_setzero_ps();
            for (p = 0; p + 16 <= n_pos; p += 16)
                for (int l = 0; l < 16; l++)
                    acc[l] = _mm512_fmadd_ps(_mm512_set1_ps(wf[p + l]), ld16(VROW(p + l) + d0), acc[l]);
            for (; p < n_pos; p++)
                acc[p & 15] = _mm512_fmadd_ps(_mm512_set1_ps(wf[p]), ld16(VROW(p) + d0), acc[p & 15]);
            _mm512_storeu_ps(out + d0, tree16(acc));
        } else {
            if (D == 64 || D == 128 || D == 256) { /* all of D at once (vec_slots) */
                if (d0 == 0) {
                    if (D == 64) vec_slots(4, wf, blk, shift, v_stride, n_pos, out);
                    else if (D == 128) vec_slots(8, wf, blk, shift, v_stride, n_pos, out);
                    else vec_slots(16, wf, blk, shift, v_stride, n_pos, out);
                }
                continue;
            }
            __m512 acc[64];
            for (int l = 0; l < 64; l++) acc[l] = _mm512_setzero_ps();
            for (p = 0; p < n_pos; p++)
                acc[p & 63] = _mm512_fmadd_ps(_mm512_set1_ps(wf[p]), ld16(VROW(p) + d0), acc[p & 63]);
            __m512 c[16];
            for (int l = 0; l < 16; l++)
                c[l] = _mm512_add_ps(_mm512_add_ps(acc[l], acc[32 + l]), _mm512_add_ps(acc[16 + l], acc[48 + l]));
            _mm512_storeu_ps(out + d0, tree16(c));
        }
    }
#undef VROW
}

T5 static void attn_values_avx512(qi_k_order ord, int D, const uint16_t *w16, const uint16_t *v,
                                size_t v_stride, int n_pos, float *out) {
    const uint16_t *const one[1] = {v};
    attn_values_blk_avx512(ord, D, w16, one, 30, v_stride, n_pos, out);
}

/* ---- the table ------------------------------------------------------------------------ */

static qi_kernels k_avx512;
static pthread_once_t k_once = PTHREAD_ONCE_INIT;

static void build(void) {
    k_avx512 = *qi_kernels_avx2();
    k_avx512.name = "avx512";
    k_avx512.gemm[QI_TYPE_Q4_0] = gemm_q4_0_avx512;
    k_avx512.gemm[QI_TYPE_Q4_1] = gemm_q4_1_avx512;
    k_avx512.gemm[QI_TYPE_Q5_0] = gemm_q5_0_avx512;
    k_avx512.gemm[QI_TYPE_Q5_1] = gemm_q5_1_avx512;
    k_avx512.gemm[QI_TYPE_Q8_0] = gemm_q8_0_avx512;
    k_avx512.gemm[QI_TYPE_Q4_K] = gemm_q4_K_avx512;
    k_avx512.gemm[QI_TYPE_Q6_K] = gemm_q6_K_avx512;
    k_avx512.gemm_wide[QI_TYPE_Q4_K] = gemm_q4_K_tiled_avx512;
    k_avx512.gemm_wide[QI_TYPE_Q6_K] = gemm_q6_K_tiled_avx512;
    k_avx512.attn_scores = attn_scores_avx512;
    k_avx512.attn_values = attn_values_avx512;
    k_avx512.attn_values_blk = attn_values_blk_avx512;
    k_avx512.gemm_packed[QI_TYPE_Q4_0] = qi_k_gemm_packed_q4_0_avx512;
    k_avx512.gemm_packed[QI_TYPE_Q4_1] = qi_k_gemm_packed_q4_1_avx512;
    k_avx512.gemm_packed[QI_TYPE_Q8_0] = qi_k_gemm_packed_q8_0_avx512;
    k_avx512.gemm_packed[QI_TYPE_Q5_0] = qi_k_gemm_packed_q5_0_avx512;
    k_avx512.gemm_packed[QI_TYPE_Q5_1] = qi_k_gemm_packed_q5_1_avx512;
}

const qi_kernels *qi_kernels_avx512(void) {
    __builtin_cpu_init();
    if (!qi_kernels_avx2() || !__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw") ||
        !__builtin_cpu_supports("avx512vl") || !__builtin_cpu_supports("avx512vnni"))
        return NULL;
    pthread_once(&k_once, build);
    return &k_avx512;
}

#else

const qi_kernels *qi_kernels_avx512(void) { return NULL; }

#endif

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
 *     tree on its own. Signed weights use |x| and a sign-masked y, as ggml
 *     does with vpsignb (which AVX-512 lacks).
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
#include <string.h>

#include "qinfer/quant.h"

#define T5 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))

T5 static inline float h2f(uint16_t h) { return _cvtsh_ss(h); }

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

T5 static inline __m256i unpack_q4_0(const qi_block_q4_0 *b) {
    return _mm256_sub_epi8(nibbles(b->qs), _mm256_set1_epi8(8));
}
T5 static inline __m256i unpack_q4_1(const qi_block_q4_1 *b) { return nibbles(b->qs); }
T5 static inline __m256i unpack_q5_0(const qi_block_q5_0 *b) {
    return _mm256_or_si256(nibbles(b->qs),
                           _mm256_andnot_si256(bits_to_bytes(b->qh), _mm256_set1_epi8((char)0xf0)));
}
T5 static inline __m256i unpack_q5_1(const qi_block_q5_1 *b) {
    return _mm256_or_si256(nibbles(b->qs), _mm256_and_si256(bits_to_bytes(b->qh), _mm256_set1_epi8(0x10)));
}
T5 static inline __m256i unpack_q8_0(const qi_block_q8_0 *b) {
    return _mm256_loadu_si256((const __m256i *)b->qs);
}

/* A weight block prepared for vpdpbusd: the unsigned operand, and for
 * signed formats the mask of negative weights (whose y get negated). */
typedef struct {
    __m512i u;
    __mmask64 neg;
} wprep;

T5 static inline wprep prep_signed(__m256i q) {
    const __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(q), q, 1);
    return (wprep){_mm512_abs_epi8(z), _mm512_movepi8_mask(z)};
}
T5 static inline wprep prep_unsigned(__m256i q) {
    return (wprep){_mm512_inserti64x4(_mm512_castsi256_si512(q), q, 1), 0};
}
/* Lanes of two blocks at once: halves of w against halves of y. */
T5 static inline __m512 lanes2(wprep w, __m512i y) {
    const __m512i sy = _mm512_mask_sub_epi8(y, w.neg, _mm512_setzero_si512(), y);
    return _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), w.u, sy));
}
T5 static inline __m512i load2(const int8_t *lo, const int8_t *hi) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)lo)),
                              _mm256_loadu_si256((const __m256i *)hi), 1);
}
/* Two weight blocks for decode: lo/hi halves from two rows. */
T5 static inline wprep prep2_signed(__m256i q0, __m256i q1) {
    const __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(q0), q1, 1);
    return (wprep){_mm512_abs_epi8(z), _mm512_movepi8_mask(z)};
}
T5 static inline wprep prep2_unsigned(__m256i q0, __m256i q1) {
    return (wprep){_mm512_inserti64x4(_mm512_castsi256_si512(q0), q1, 1), 0};
}
/* [a x8, b x8] */
T5 static inline __m512 pair_scale(float a, float b) {
    return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_set1_ps(a)),
                                               _mm256_castps_pd(_mm256_set1_ps(b)), 1));
}
T5 static inline __m256 hi256(__m512 a) { return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)); }

#define KB_MAX 256
#define KT 8

/* The decode path gathers d (and m) of eight rows as the first four bytes
 * of their blocks. */
_Static_assert(offsetof(qi_block_q4_1, m) == 2 && offsetof(qi_block_q5_1, m) == 2, "m follows d");

#define DEFINE_GEMM512(NAME, WT, AT, UNPACK, PREP, PREP2, HAS_M, MF, SF)                           \
    T5 static float NAME##_one(int64_t nb, const WT *x, const AT *y) {                            \
        __m256 c = _mm256_setzero_ps();                                                          \
        float m = 0.0f;                                                                          \
        for (int64_t b = 0; b < nb; b++) {                                                       \
            if (HAS_M)                                                                           \
                m = _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(h2f(x[b].MF)), _mm_set_ss(h2f(y[b].SF)), _mm_set_ss(m))); \
            const __m512 l = lanes2(PREP(UNPACK(&x[b])), load2(y[b].qs, y[b].qs));                \
            c = _mm256_fmadd_ps(_mm256_set1_ps(h2f(x[b].d) * h2f(y[b].d)), _mm512_castps512_ps256(l), c); \
        }                                                                                        \
        return HAS_M ? hsum8(c) + m : hsum8(c);                                                  \
    }                                                                                            \
                                                                                                 \
    /* one weight row x 8 tokens (pairs of tokens per zmm) */                                    \
    T5 static void NAME##_row8(int64_t nb, const WT *x, const AT *const *ya, const float *da,     \
                               const float *sa, float *y, size_t ys, int nt) {                   \
        __m512 acc[KT / 2];                                                                      \
        for (int k = 0; k < KT / 2; k++) acc[k] = _mm512_setzero_ps();                           \
        __m256 sm = _mm256_setzero_ps();                                                         \
        const __m512i i01 = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);     \
        const __m512i two = _mm512_set1_epi32(2);                                                \
        for (int64_t b = 0; b < nb; b++) {                                                       \
            const wprep w = PREP(UNPACK(&x[b]));                                                 \
            const __m512 dp = _mm512_castps256_ps512(                                            \
                _mm256_mul_ps(_mm256_set1_ps(h2f(x[b].d)), _mm256_loadu_ps(da + KT * b)));       \
            if (HAS_M)                                                                           \
                sm = _mm256_fmadd_ps(_mm256_set1_ps(h2f(x[b].MF)), _mm256_loadu_ps(sa + KT * b), sm); \
            __m512i idx = i01;                                                                   \
            _Pragma("GCC unroll 4") for (int k = 0; k < KT / 2; k++) {                           \
                acc[k] = _mm512_fmadd_ps(_mm512_permutexvar_ps(idx, dp),                         \
                                         lanes2(w, load2(ya[2 * k][b].qs, ya[2 * k + 1][b].qs)), acc[k]); \
                idx = _mm512_add_epi32(idx, two);                                                \
            }                                                                                    \
        }                                                                                        \
        float s[KT];                                                                             \
        _mm256_storeu_ps(s, sm);                                                                 \
        for (int k = 0; k < nt; k++) {                                                           \
            const __m512 a = acc[k / 2];                                                         \
            const __m256 h = k & 1 ? hi256(a) : _mm512_castps512_ps256(a);   \
            y[(size_t)k * ys] = HAS_M ? hsum8(h) + s[k] : hsum8(h);                              \
        }                                                                                        \
    }                                                                                            \
                                                                                                 \
    /* n_w weight rows x one token, eight rows (four zmm) at a time */                         \
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
                /* the first 4 bytes of each row's block: d, and m for the _1 formats */        \
                const __m256i dm = _mm256_i32gather_epi32((const int *)(const void *)&x[0][b], rowoff, 1); \
                const __m256 dw = _mm256_cvtph_ps(_mm256_cvtepi32_epi16(dm));                    \
                const __m512 dp = _mm512_castps256_ps512(_mm256_mul_ps(dw, _mm256_set1_ps(h2f(y[b].d)))); \
                if (HAS_M) {                                                                     \
                    const __m256 mw = _mm256_cvtph_ps(_mm256_cvtepi32_epi16(_mm256_srli_epi32(dm, 16))); \
                    sm = _mm256_fmadd_ps(mw, _mm256_set1_ps(h2f(y[b].SF)), sm);                  \
                }                                                                                \
                const __m512i yy = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)y[b].qs)); \
                __m512i idx = i01;                                                               \
                _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) {                            \
                    c[k] = _mm512_fmadd_ps(_mm512_permutexvar_ps(idx, dp),                       \
                                           lanes2(PREP2(UNPACK(&x[2 * k][b]), UNPACK(&x[2 * k + 1][b])), yy), c[k]); \
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
            const AT *ya[KT];                                                                    \
            for (int k = 0; k < KT; k++) ya[k] = (const AT *)(ac + (size_t)(t0 + (k < nt ? k : 0)) * a_stride); \
            for (int64_t b = 0; b < nb; b++)                                                     \
                for (int k = 0; k < KT; k++) {                                                   \
                    da[KT * b + k] = h2f(ya[k][b].d);                                            \
                    sa[KT * b + k] = HAS_M ? h2f(ya[k][b].SF) : 0.0f;                            \
                }                                                                                \
            for (int r = 0; r < n_w; r++)                                                        \
                NAME##_row8(nb, (const WT *)(wc + (size_t)r * w_stride), ya, da, sa, yt + r, y_stride, nt); \
        }                                                                                        \
    }

DEFINE_GEMM512(gemm_q4_0_avx512, qi_block_q4_0, qi_block_q8_0, unpack_q4_0, prep_signed, prep2_signed, 0, d, d)
DEFINE_GEMM512(gemm_q4_1_avx512, qi_block_q4_1, qi_block_q8_1, unpack_q4_1, prep_unsigned, prep2_unsigned, 1, m, s)
DEFINE_GEMM512(gemm_q5_0_avx512, qi_block_q5_0, qi_block_q8_0, unpack_q5_0, prep_signed, prep2_signed, 0, d, d)
DEFINE_GEMM512(gemm_q5_1_avx512, qi_block_q5_1, qi_block_q8_1, unpack_q5_1, prep_unsigned, prep2_unsigned, 1, m, s)
DEFINE_GEMM512(gemm_q8_0_avx512, qi_block_q8_0, qi_block_q8_0, unpack_q8_0, prep_signed, prep2_signed, 0, d, d)

/* ---- F16 attention --------------------------------------------------------------------- */

T5 static inline __m512 ld16(const uint16_t *p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}

#define QF_MAX 1024

T5 static void attn_scores_avx512(qi_k_order ord, int D, const uint16_t *q16, const uint16_t *k,
                                  size_t k_stride, int n_pos, float *s) {
    if (D % 16 != 0 || D > QF_MAX) {
        qi_k_attn_scores_ref(ord, D, q16, k, k_stride, n_pos, s);
        return;
    }
    __m512 qv[QF_MAX / 16];
    for (int i = 0; i < D / 16; i++) qv[i] = ld16(q16 + 16 * i);
    if (ord == QI_K_ORD_GEMM) {
        for (int p = 0; p < n_pos; p++) {
            const uint16_t *kp = k + (size_t)p * k_stride;
            __m512 acc = _mm512_setzero_ps();
            for (int i = 0; i < D / 16; i++) acc = _mm512_fmadd_ps(ld16(kp + 16 * i), qv[i], acc);
            s[p] = _mm512_reduce_add_ps(acc);
        }
        return;
    }
    const int np = D & ~63;
    for (int p = 0; p < n_pos; p++) {
        const uint16_t *kp = k + (size_t)p * k_stride;
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int i = 0; i < np; i += 64) {
            a0 = _mm512_fmadd_ps(ld16(kp + i), qv[i / 16], a0);
            a1 = _mm512_fmadd_ps(ld16(kp + i + 16), qv[i / 16 + 1], a1);
            a2 = _mm512_fmadd_ps(ld16(kp + i + 32), qv[i / 16 + 2], a2);
            a3 = _mm512_fmadd_ps(ld16(kp + i + 48), qv[i / 16 + 3], a3);
        }
        double sum = (double)_mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a2), _mm512_add_ps(a1, a3)));
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

T5 static void attn_values_blk_avx512(qi_k_order ord, int D, const uint16_t *w16, const uint16_t *const *blk, int shift,
                                  size_t v_stride, int n_pos, float *out) {
    const size_t mask = ((size_t)1 << shift) - 1;
#define VROW(p) (blk[(size_t)(p) >> shift] + ((size_t)(p) & mask) * v_stride)
    if (D % 16 != 0) {
        qi_kernels_avx2()->attn_values_blk(ord, D, w16, blk, shift, v_stride, n_pos, out);
        return;
    }
    for (int d0 = 0; d0 < D; d0 += 16) {
        if (ord == QI_K_ORD_GEMM) {
            __m512 acc[16];
            for (int l = 0; l < 16; l++) acc[l] = _mm512_setzero_ps();
            int p = 0;
            for (; p + 16 <= n_pos; p += 16)
                for (int l = 0; l < 16; l++)
                    acc[l] = _mm512_fmadd_ps(_mm512_set1_ps(h2f(w16[p + l])), ld16(VROW(p + l) + d0), acc[l]);
            for (; p < n_pos; p++)
                acc[p & 15] = _mm512_fmadd_ps(_mm512_set1_ps(h2f(w16[p])), ld16(VROW(p) + d0), acc[p & 15]);
            _mm512_storeu_ps(out + d0, tree16(acc));
        } else {
            __m512 acc[64];
            for (int l = 0; l < 64; l++) acc[l] = _mm512_setzero_ps();
            for (int p = 0; p < n_pos; p++)
                acc[p & 63] = _mm512_fmadd_ps(_mm512_set1_ps(h2f(w16[p])), ld16(VROW(p) + d0), acc[p & 63]);
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
    k_avx512.attn_scores = attn_scores_avx512;
    k_avx512.attn_values = attn_values_avx512;
    k_avx512.attn_values_blk = attn_values_blk_avx512;
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

/* kernels_ref.c - reference kernels whose arithmetic is llama.cpp's x86 order.
 *
 * Why: SmolLM2 has activations near 22,000 in a few rows, so the per-block
 * 8-bit activation quantisation flips a quant on a 1e-6 relative difference
 * upstream and a whole row moves. Matching llama.cpp to well within 1e-2
 * therefore needs its floating-point operations in its order, not merely an
 * accurate sum. quant.c keeps ggml's *generic* (non-SIMD) order as the format
 * specification; this file is the specification of what llama.cpp actually
 * runs on x86-64 (AVX-512 + VNNI build, GGML_NATIVE, GCC 12, whose default
 * -ffp-contract=fast fuses some scalar a*b+c into FMAs; the facts below were
 * read from ggml-cpu's source, checked against the built library's
 * disassembly, and confirmed by calling ggml's own ops on the same inputs).
 * Every fused multiply-add is written fmaf; this file is built with
 * -ffp-contract=off, so nothing else is fused.
 *
 * Block dots (q4_0, q4_1, q5_0, q5_1, q8_0 weights; ggml_vec_dot_*_q8_* and
 * tinyBLAS_Q0_AVX, which agree): 8 float lanes; lane j of a 32-element block
 * is the exact integer sum of the products of elements 4j..4j+3 (what
 * vpdpbusd or maddubs+madd produce); per block, in block order,
 *     acc[j] = fmaf(d_w * d_a, (float)lane_j, acc[j])
 * with d_w * d_a rounded to float first. The result is hsum8(acc), where
 *     hsum8(a) = ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)).
 * Q4_1/Q5_1 add the offset term: summs = fmaf(m_w, s_a, summs) per block
 * (GCC contracted ggml's `summs += m * s`), and return hsum8(acc) + summs.
 *
 * K-quant dots (q4_K, q6_K weights, Q8_K activations; 256-element
 * super-blocks). Two orders, chosen by the matmul's token count T:
 *   T < 8, ggml_vec_dot_q4_K_q8_K / _q6_K_q8_K: 8 integer lanes per
 *     super-block, lane k summing, over the sub-blocks, the sub-block scale
 *     times the products of elements 4k..4k+3 of each 32-element group (for
 *     q6_K the scale of the group's 16-element half, minus 32 * (bsums[2k] *
 *     sc[2k] + bsums[2k+1] * sc[2k+1])); acc[k] = fmaf(d_a * d_w, lane_k,
 *     acc[k]); q4_K adds four min lanes, m_l = fmaf(-d_a * dmin_w,
 *     mn[2l] * S[2l] + mn[2l+1] * S[2l+1], m_l) with S the 32-element sums
 *     of the activation, and returns hsum8(acc) + ((m0 + m2) + (m1 + m3)).
 *   T >= 8, ggml's tiled K-quant matmul (ggml-cpu/tiled, on by default):
 *     per super-block the exact integers s1 = sum of scale * raw dot (q6_K:
 *     of (q - 32)) and, for q4_K, s2 = sum of min * activation sum; then
 *     r = (float)s1 * d_w, r = fmaf(-dmin_w, (float)s2, r) (q4_K), and
 *     y = fmaf(r, d_a, y), super-block by super-block from y = 0 (the
 *     source writes buf + r * d_a with intrinsics that GCC fuses).
 *   The integers are exact in either order; only where they are rounded to
 *   float, and how the floats are combined, differs.
 *
 * F16 dots (attention with flash attention off; K and V cache are fp16, the
 * other operand is rounded to fp16 by ggml before the matmul):
 *   VEC (ggml_vec_dot_f16, one-token batches): four accumulators of 16 lanes
 *     over 64-element steps, element i in accumulator (i/16)%4, lane i%16,
 *     acc = fmaf(x, y, acc); then c = (acc0 + acc2) + (acc1 + acc3) lanewise
 *     and hsum16(c), widened to double; elements past the last whole step
 *     add (double)(x*y) each; the double is rounded to float.
 *   GEMM (tinyBLAS<16, __m512>, batches of two or more tokens): one 16-lane
 *     accumulator, element i in lane i%16, fmaf in element order, hsum16,
 *     where hsum16 (GCC's _mm512_reduce_add_ps) is
 *         t_i = a_i + a_{i+8} (i < 8), u_i = t_i + t_{i+4} (i < 4),
 *         (u0 + u2) + (u1 + u3).
 *   tinyBLAS declines (and ggml uses VEC) when the reduced length is not a
 *   multiple of 16 or the row count not a multiple of 4: for the scores that
 *   is D % 16 != 0, for the values D % 4 != 0.
 *   llama.cpp's KV length is padded to a multiple of 256 with masked
 *   positions whose softmax weight is exactly 0. A zero weight times a finite
 *   V adds a signed zero to an accumulator that is never -0, which changes
 *   nothing, so the kernels simply stop at n_pos; but the padding means the
 *   values dot of VEC never has leftover elements: every position is in a
 *   SIMD lane.
 *
 * Softmax (ggml_compute_forward_soft_max_f32 with ggml_vec_soft_max_f32, the
 * AVX-512 branch): the scaled scores' max; then per 16-element chunk
 * e_i = expf_ggml(s_i - max) and sum += (double)hsum16(e) (masked lanes are
 * exp(-inf) = 0); then e_i * (float)(1.0 / sum), rounded to fp16 by the next
 * matmul's conversion of its operand.
 *
 * expf_ggml is ggml_v_expf for AVX-512 (not the AVX2 one: they differ): a
 * degree-5 polynomial in b = x - n*ln2 (ln2 in two pieces) with n =
 * round(x*log2(e)) by the 1.5*2^23 trick, j = poly(b) including its constant
 * 1, and j * 2^n by vscalefps (one rounding, so ldexpf); |n| > 192 gives 0
 * or +inf.
 *
 * SwiGLU (ggml_vec_swiglu_f32): for whole 16-element chunks of a row,
 * (x / (1 + expf_ggml(0 - x))) * g; for the rest of the row libm's expf,
 * (x / (1 + expf(-x))) * g. The backend's op receives T*n_ff elements as
 * one row, which is the same thing whenever n_ff % 16 == 0 (SmolLM2-135M:
 * 1536; Gemma 3 270M: 2048).
 *
 * RoPE (ggml_rope_f32 as GCC built it; checked against the library for
 * NORMAL and NEOX and head sizes 2..256): x0*cos - x1*sin became
 * fma(x0, cos, -(x1*sin)) and x0*sin + x1*cos became fma(x0, sin, x1*cos),
 * except that in NORMAL mode (adjacent pairs) the vector loop covers whole
 * groups of four pairs and the last n_pairs % 4 pairs are computed unfused.
 *
 * GeGLU (ggml_vec_geglu_f32 as built, GGML_GELU_FP16 defined): no SIMD and
 * no tanh at run time. x <= -10 gives 0, x >= 10 gives x * g; otherwise
 * gelu is looked up in a 65536-entry fp16 table indexed by fp16(x) and
 * widened: table[h] = fp16(gelu_tanh(f32(h))), filled once by ggml_cpu_init
 * with gelu_tanh(x) = 0.5f*x*(1.0f + tanhf(S*x*(1.0f + A*x*x))), where GCC
 * fused the inner 1 + (A*x)*x into fmaf(A*x, x, 1) (checked entry by entry
 * against the library's op). The product with g is one float multiply.
 */
#include <math.h>
#include <pthread.h>
#include <string.h>

#include "kernels.h"
#include "qinfer/quant.h"

float qi_k_hsum8_ref(const float a[8]) {
    const float r0 = a[4] + a[0], r1 = a[5] + a[1], r2 = a[6] + a[2], r3 = a[7] + a[3];
    return (r0 + r2) + (r1 + r3);
}

float qi_k_hsum16_ref(const float a[16]) {
    float t[8], u[4];
    for (int i = 0; i < 8; i++) t[i] = a[i + 8] + a[i];
    for (int i = 0; i < 4; i++) u[i] = t[i + 4] + t[i];
    return (u[0] + u[2]) + (u[1] + u[3]);
}

/* ---- block dots -------------------------------------------------------------- */

/* The 32 weight quants of one block as signed integers, in element order. */
static void unpack_q4_0(const qi_block_q4_0 *b, int q[32]) {
    for (int j = 0; j < 16; j++) {
        q[j] = (b->qs[j] & 0x0f) - 8;
        q[j + 16] = (b->qs[j] >> 4) - 8;
    }
}

static void unpack_q4_1(const qi_block_q4_1 *b, int q[32]) {
    for (int j = 0; j < 16; j++) {
        q[j] = b->qs[j] & 0x0f;
        q[j + 16] = b->qs[j] >> 4;
    }
}

static uint32_t load_qh(const uint8_t qh[4]) {
    return (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 | (uint32_t)qh[3] << 24;
}

static void unpack_q5(const uint8_t qs[16], const uint8_t qh4[4], int offset, int q[32]) {
    const uint32_t qh = load_qh(qh4);
    for (int j = 0; j < 16; j++) {
        q[j] = ((qs[j] & 0x0f) | (int)((qh >> j) & 1) << 4) - offset;
        q[j + 16] = ((qs[j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4) - offset;
    }
}

/* acc[j] = fmaf(d, lane_j, acc[j]) for one block. */
static void block_fma(float acc[8], float d, const int qw[32], const int8_t qa[32]) {
    for (int j = 0; j < 8; j++) {
        int lane = 0;
        for (int k = 4 * j; k < 4 * j + 4; k++) lane += qw[k] * qa[k];
        acc[j] = fmaf(d, (float)lane, acc[j]);
    }
}

float qi_k_dot_q4_0_ref(int64_t n, const void *w, const void *a) {
    const qi_block_q4_0 *x = w;
    const qi_block_q8_0 *y = a;
    float acc[8] = {0};
    int q[32];
    for (int64_t b = 0; b < n / 32; b++) {
        unpack_q4_0(&x[b], q);
        block_fma(acc, qi_fp16_to_f32(x[b].d) * qi_fp16_to_f32(y[b].d), q, y[b].qs);
    }
    return qi_k_hsum8_ref(acc);
}

float qi_k_dot_q4_1_ref(int64_t n, const void *w, const void *a) {
    const qi_block_q4_1 *x = w;
    const qi_block_q8_1 *y = a;
    float acc[8] = {0}, summs = 0.0f;
    int q[32];
    for (int64_t b = 0; b < n / 32; b++) {
        summs = fmaf(qi_fp16_to_f32(x[b].m), qi_fp16_to_f32(y[b].s), summs);
        unpack_q4_1(&x[b], q);
        block_fma(acc, qi_fp16_to_f32(x[b].d) * qi_fp16_to_f32(y[b].d), q, y[b].qs);
    }
    return qi_k_hsum8_ref(acc) + summs;
}

float qi_k_dot_q5_0_ref(int64_t n, const void *w, const void *a) {
    const qi_block_q5_0 *x = w;
    const qi_block_q8_0 *y = a;
    float acc[8] = {0};
    int q[32];
    for (int64_t b = 0; b < n / 32; b++) {
        unpack_q5(x[b].qs, x[b].qh, 16, q);
        block_fma(acc, qi_fp16_to_f32(x[b].d) * qi_fp16_to_f32(y[b].d), q, y[b].qs);
    }
    return qi_k_hsum8_ref(acc);
}

float qi_k_dot_q5_1_ref(int64_t n, const void *w, const void *a) {
    const qi_block_q5_1 *x = w;
    const qi_block_q8_1 *y = a;
    float acc[8] = {0}, summs = 0.0f;
    int q[32];
    for (int64_t b = 0; b < n / 32; b++) {
        summs = fmaf(qi_fp16_to_f32(x[b].m), qi_fp16_to_f32(y[b].s), summs);
        unpack_q5(x[b].qs, x[b].qh, 0, q);
        block_fma(acc, qi_fp16_to_f32(x[b].d) * qi_fp16_to_f32(y[b].d), q, y[b].qs);
    }
    return qi_k_hsum8_ref(acc) + summs;
}

float qi_k_dot_q8_0_ref(int64_t n, const void *w, const void *a) {
    const qi_block_q8_0 *x = w;
    const qi_block_q8_0 *y = a;
    float acc[8] = {0};
    int q[32];
    for (int64_t b = 0; b < n / 32; b++) {
        for (int k = 0; k < 32; k++) q[k] = x[b].qs[k];
        block_fma(acc, qi_fp16_to_f32(x[b].d) * qi_fp16_to_f32(y[b].d), q, y[b].qs);
    }
    return qi_k_hsum8_ref(acc);
}

/* ---- K quants ---------------------------------------------------------------------------- */

/* The 256 codes of a q4_K super-block (0..15), element order. */
static void codes_q4_K(const qi_block_q4_K *b, int q[256]) {
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) {
            q[64 * c + l] = b->qs[32 * c + l] & 0x0f;
            q[64 * c + 32 + l] = b->qs[32 * c + l] >> 4;
        }
}

/* The 256 codes of a q6_K super-block (0..63, before the -32), element order. */
static void codes_q6_K(const qi_block_q6_K *b, int q[256]) {
    for (int h = 0; h < 2; h++) {
        const uint8_t *ql = b->ql + 64 * h, *qh = b->qh + 32 * h;
        int *qo = q + 128 * h;
        for (int l = 0; l < 32; l++) {
            qo[l] = (ql[l] & 0x0f) | ((qh[l] >> 0) & 3) << 4;
            qo[l + 32] = (ql[l + 32] & 0x0f) | ((qh[l] >> 2) & 3) << 4;
            qo[l + 64] = (ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4;
            qo[l + 96] = (ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4;
        }
    }
}

/* sum of q[e] * a[e] for e in [lo, lo + len) */
static int idot(const int *q, const int8_t *a, int lo, int len) {
    int s = 0;
    for (int e = lo; e < lo + len; e++) s += q[e] * a[e];
    return s;
}

float qi_k_dot_q4_K_ref(int64_t n, const void *w, const void *a) {
    const qi_block_q4_K *x = w;
    const qi_block_q8_K *y = a;
    float acc[8] = {0}, accm[4] = {0};
    int q[256];
    for (int64_t b = 0; b < n / 256; b++) {
        const float d = y[b].d * qi_fp16_to_f32(x[b].d);
        const float dmin = -y[b].d * qi_fp16_to_f32(x[b].dmin);
        uint8_t sc[8], mn[8];
        for (int s = 0; s < 8; s++) qi_k_scale_min(x[b].scales, s, &sc[s], &mn[s]);
        for (int l = 0; l < 4; l++) {
            const int prod = mn[2 * l] * (y[b].bsums[4 * l] + y[b].bsums[4 * l + 1]) +
                             mn[2 * l + 1] * (y[b].bsums[4 * l + 2] + y[b].bsums[4 * l + 3]);
            accm[l] = fmaf(dmin, (float)prod, accm[l]);
        }
        codes_q4_K(&x[b], q);
        for (int k = 0; k < 8; k++) {
            int lane = 0;
            for (int s = 0; s < 8; s++) lane += sc[s] * idot(q, y[b].qs, 32 * s + 4 * k, 4);
            acc[k] = fmaf(d, (float)lane, acc[k]);
        }
    }
    return qi_k_hsum8_ref(acc) + ((accm[0] + accm[2]) + (accm[1] + accm[3]));
}

float qi_k_dot_q6_K_ref(int64_t n, const void *w, const void *a) {
    const qi_block_q6_K *x = w;
    const qi_block_q8_K *y = a;
    float acc[8] = {0};
    int q[256];
    for (int64_t b = 0; b < n / 256; b++) {
        const float d = y[b].d * qi_fp16_to_f32(x[b].d);
        const int8_t *sc = x[b].scales;
        codes_q6_K(&x[b], q);
        for (int k = 0; k < 8; k++) {
            int lane = 0;
            for (int g = 0; g < 8; g++) lane += sc[2 * g + (k >= 4)] * idot(q, y[b].qs, 32 * g + 4 * k, 4);
            lane -= 32 * (y[b].bsums[2 * k] * sc[2 * k] + y[b].bsums[2 * k + 1] * sc[2 * k + 1]);
            acc[k] = fmaf(d, (float)lane, acc[k]);
        }
    }
    return qi_k_hsum8_ref(acc);
}

float qi_k_dot_q4_K_tiled_ref(int64_t n, const void *w, const void *a) {
    const qi_block_q4_K *x = w;
    const qi_block_q8_K *y = a;
    float sum = 0.0f;
    int q[256];
    for (int64_t b = 0; b < n / 256; b++) {
        codes_q4_K(&x[b], q);
        int s1 = 0, s2 = 0;
        for (int s = 0; s < 8; s++) {
            uint8_t sc, mn;
            qi_k_scale_min(x[b].scales, s, &sc, &mn);
            s1 += sc * idot(q, y[b].qs, 32 * s, 32);
            s2 += mn * (y[b].bsums[2 * s] + y[b].bsums[2 * s + 1]);
        }
        float r = (float)s1 * qi_fp16_to_f32(x[b].d);
        r = fmaf(-qi_fp16_to_f32(x[b].dmin), (float)s2, r);
        sum = fmaf(r, y[b].d, sum);
    }
    return sum;
}

float qi_k_dot_q6_K_tiled_ref(int64_t n, const void *w, const void *a) {
    const qi_block_q6_K *x = w;
    const qi_block_q8_K *y = a;
    float sum = 0.0f;
    int q[256];
    for (int64_t b = 0; b < n / 256; b++) {
        codes_q6_K(&x[b], q);
        int s1 = 0;
        for (int s = 0; s < 16; s++) s1 += x[b].scales[s] * (idot(q, y[b].qs, 16 * s, 16) - 32 * y[b].bsums[s]);
        const float r = (float)s1 * qi_fp16_to_f32(x[b].d);
        sum = fmaf(r, y[b].d, sum);
    }
    return sum;
}

/* The reference tables' matmul blocks: one dot at a time. */
#define DEFINE_GEMM_REF(NAME, DOT)                                                              \
    static void NAME(int64_t n, const void *w, size_t w_stride, int n_w, const void *a,         \
                     size_t a_stride, int n_a, float *y, size_t y_stride) {                     \
        for (int t = 0; t < n_a; t++)                                                           \
            for (int r = 0; r < n_w; r++)                                                       \
                y[(size_t)t * y_stride + (size_t)r] =                                           \
                    DOT(n, (const char *)w + (size_t)r * w_stride, (const char *)a + (size_t)t * a_stride); \
    }
DEFINE_GEMM_REF(gemm_q4_0_ref, qi_k_dot_q4_0_ref)
DEFINE_GEMM_REF(gemm_q4_1_ref, qi_k_dot_q4_1_ref)
DEFINE_GEMM_REF(gemm_q5_0_ref, qi_k_dot_q5_0_ref)
DEFINE_GEMM_REF(gemm_q5_1_ref, qi_k_dot_q5_1_ref)
DEFINE_GEMM_REF(gemm_q8_0_ref, qi_k_dot_q8_0_ref)
DEFINE_GEMM_REF(gemm_q4_K_ref, qi_k_dot_q4_K_ref)
DEFINE_GEMM_REF(gemm_q6_K_ref, qi_k_dot_q6_K_ref)
DEFINE_GEMM_REF(gemm_q4_K_tiled_ref, qi_k_dot_q4_K_tiled_ref)
DEFINE_GEMM_REF(gemm_q6_K_tiled_ref, qi_k_dot_q6_K_tiled_ref)

/* ---- F16 dots ------------------------------------------------------------------ */

static float h2f(uint16_t h) { return qi_fp16_to_f32(h); }

/* ggml_vec_dot_f16 over x[i * xs], y[i * ys]. */
static float dot_f16_vec(int64_t n, const uint16_t *x, size_t xs, const uint16_t *y, size_t ys) {
    float acc[64] = {0}; /* acc[16 * c + l]: accumulator c, lane l */
    const int64_t np = n & ~(int64_t)63;
    for (int64_t i = 0; i < np; i++)
        acc[i & 63] = fmaf(h2f(x[i * xs]), h2f(y[i * ys]), acc[i & 63]);
    float c[16];
    for (int l = 0; l < 16; l++) c[l] = (acc[l] + acc[32 + l]) + (acc[16 + l] + acc[48 + l]);
    double sum = (double)qi_k_hsum16_ref(c);
    for (int64_t i = np; i < n; i++) sum += (double)(h2f(x[i * xs]) * h2f(y[i * ys]));
    return (float)sum;
}

/* tinyBLAS: one 16-lane accumulator; n % 16 == 0. */
static float dot_f16_gemm(int64_t n, const uint16_t *x, size_t xs, const uint16_t *y, size_t ys) {
    float acc[16] = {0};
    for (int64_t i = 0; i < n; i++)
        acc[i & 15] = fmaf(h2f(x[i * xs]), h2f(y[i * ys]), acc[i & 15]);
    return qi_k_hsum16_ref(acc);
}

float qi_k_dot_f16_ref(qi_k_order ord, int64_t n, const uint16_t *x, const uint16_t *y) {
    if (ord == QI_K_ORD_GEMM && n % 16 == 0) return dot_f16_gemm(n, x, 1, y, 1);
    return dot_f16_vec(n, x, 1, y, 1);
}

void qi_k_attn_scores_ref(qi_k_order ord, int D, const uint16_t *q16, const uint16_t *k,
                          size_t k_stride, int n_pos, float *s) {
    const int gemm = ord == QI_K_ORD_GEMM && D % 16 == 0;
    for (int p = 0; p < n_pos; p++) {
        const uint16_t *kp = k + (size_t)p * k_stride;
        s[p] = gemm ? dot_f16_gemm(D, kp, 1, q16, 1) : dot_f16_vec(D, kp, 1, q16, 1);
    }
}

void qi_k_attn_values_blk_ref(qi_k_order ord, int D, const uint16_t *w16, const uint16_t *const *blk,
                              int shift, size_t v_stride, int n_pos, float *out) {
    const int gemm = ord == QI_K_ORD_GEMM && D % 4 == 0;
    const size_t mask = ((size_t)1 << shift) - 1;
#define VROW(p) (blk[(size_t)(p) >> shift] + ((size_t)(p) & mask) * v_stride)
    /* llama.cpp's padded length: a multiple of 64 (indeed of 256), zeros
     * beyond n_pos, so VEC has no leftover elements (see the file comment);
     * the zero terms themselves are skipped. */
    for (int d = 0; d < D; d++) {
        if (gemm) {
            float acc[16] = {0};
            for (int p = 0; p < n_pos; p++) acc[p & 15] = fmaf(h2f(VROW(p)[d]), h2f(w16[p]), acc[p & 15]);
            out[d] = qi_k_hsum16_ref(acc);
        } else {
            float acc[64] = {0};
            for (int p = 0; p < n_pos; p++) acc[p & 63] = fmaf(h2f(VROW(p)[d]), h2f(w16[p]), acc[p & 63]);
            float c[16];
            for (int l = 0; l < 16; l++) c[l] = (acc[l] + acc[32 + l]) + (acc[16 + l] + acc[48 + l]);
            out[d] = qi_k_hsum16_ref(c);
        }
    }
#undef VROW
}

void qi_k_attn_values_ref(qi_k_order ord, int D, const uint16_t *w16, const uint16_t *v,
                          size_t v_stride, int n_pos, float *out) {
    const uint16_t *const one[1] = {v};
    qi_k_attn_values_blk_ref(ord, D, w16, one, 30, v_stride, n_pos, out);
}

/* ---- exp, softmax, SwiGLU --------------------------------------------------------- */

float qi_k_expf_ref(float x) {
    const float r = 0x1.8p23f;
    const float z = fmaf(x, 0x1.715476p+0f, r);
    const float n = z - r;
    const float b = fmaf(-n, 0x1.7f7d1cp-20f, fmaf(-n, 0x1.62e4p-1f, x));
    const float u = b * b;
    const float j = fmaf(fmaf(fmaf(0x1.0e4020p-7f, b, 0x1.573e2ep-5f), u,
                              fmaf(0x1.555e66p-3f, b, 0x1.fffdb6p-2f)),
                         u, fmaf(0x1.ffffecp-1f, b, 1.0f));
    if (isnan(n)) return j; /* NaN in, NaN out */
    if (fabsf(n) > 192.0f) return n <= 0.0f ? 0.0f : INFINITY;
    return ldexpf(j, (int)n);
}

/* softmax_f16's exponentials and sum: 16-element chunks (a short last one
 * padded with zeros), each summed as qi_k_hsum16_ref, accumulated in
 * double. */
double qi_k_exp_sum_ref(int n, float *s, float max) {
    double sum = 0.0;
    for (int i0 = 0; i0 < n; i0 += 16) {
        float e[16];
        for (int l = 0; l < 16; l++) e[l] = i0 + l < n ? qi_k_expf_ref(s[i0 + l] - max) : 0.0f;
        for (int l = 0; l < 16 && i0 + l < n; l++) s[i0 + l] = e[l];
        sum += (double)qi_k_hsum16_ref(e);
    }
    return sum;
}

void qi_k_softmax_f16_ref(int n, float *s, uint16_t *w16) {
    float max = -INFINITY;
    for (int i = 0; i < n; i++) max = s[i] > max ? s[i] : max;
    const double sum = qi_k_exp_sum_ref(n, s, max);
    const float inv = (float)(1.0 / sum);
    for (int i = 0; i < n; i++) w16[i] = qi_f32_to_fp16(s[i] * inv);
}

void qi_k_rope_ref(float *x, int n_heads, int D, int n_pairs, int neox, const float *cs, const float *sn) {
    const int n_fused = neox ? n_pairs : n_pairs / 4 * 4;
    for (int h = 0; h < n_heads; h++) {
        float *v = x + (long)h * D;
        for (int i = 0; i < n_pairs; i++) {
            const int a = neox ? i : 2 * i, b = neox ? i + n_pairs : 2 * i + 1;
            const float x0 = v[a], x1 = v[b];
            if (i < n_fused) {
                v[a] = fmaf(x0, cs[i], -(x1 * sn[i]));
                v[b] = fmaf(x0, sn[i], x1 * cs[i]);
            } else {
                v[a] = x0 * cs[i] - x1 * sn[i];
                v[b] = x0 * sn[i] + x1 * cs[i];
            }
        }
    }
}

void qi_k_swiglu_ref(int64_t n, float *g, const float *u) {
    const int64_t nv = n & ~(int64_t)15;
    for (int64_t i = 0; i < nv; i++) g[i] = (g[i] / (1.0f + qi_k_expf_ref(0.0f - g[i]))) * u[i];
    for (int64_t i = nv; i < n; i++) g[i] = (g[i] / (1.0f + expf(-g[i]))) * u[i];
}

/* ---- activation quantisation -------------------------------------------------------------- */

void qi_k_f16_to_f32_ref(const uint16_t *x, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = qi_fp16_to_f32(x[i]);
}

void qi_k_f32_to_f16_ref(const float *x, uint16_t *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = qi_f32_to_fp16(x[i]);
}

/* llama.cpp's x86 quantize_row_q8_0/q8_1, one 32-element block at a time:
 * d = amax / 127, inverse 127 / amax (not 1 / d), x * inverse rounded half
 * to even, s = fp16(d * sum(q)) with d before its own fp16 rounding. */
void qi_k_quantize_q8_ref(const float *x, void *dst, int64_t n, int with_sum) {
    uint8_t *out = dst;
    const size_t bs = with_sum ? sizeof(qi_block_q8_1) : sizeof(qi_block_q8_0);
    for (int64_t i = 0; i < n / 32; i++, x += 32, out += bs) {
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) {
            const float a = fabsf(x[j]);
            if (a > amax) amax = a;
        }
        const float d = amax / 127.f;
        const float id = amax != 0.0f ? 127.f / amax : 0.0f;
        const uint16_t dh = qi_f32_to_fp16(d);
        memcpy(out, &dh, 2);
        int8_t *qs = (int8_t *)(out + (with_sum ? 4 : 2));
        int sum = 0;
        for (int j = 0; j < 32; j++) {
            /* nearbyintf in the default rounding mode: round half to even */
            const int q = (int)nearbyintf(x[j] * id);
            qs[j] = (int8_t)q;
            sum += q;
        }
        if (with_sum) {
            const uint16_t sh = qi_f32_to_fp16(d * (float)sum);
            memcpy(out + 2, &sh, 2);
        }
    }
}

/* ---- GeGLU ------------------------------------------------------------------------------ */

static uint16_t g_gelu_table[1 << 16];
static pthread_once_t g_gelu_once = PTHREAD_ONCE_INIT;

static void gelu_table_fill(void) {
    const float A = 0.044715f, S = 0.79788456080286535587989211986876f;
    for (uint32_t h = 0; h < (1u << 16); h++) {
        const float x = qi_fp16_to_f32((uint16_t)h);
        const float inner = fmaf(A * x, x, 1.0f);
        g_gelu_table[h] = qi_f32_to_fp16(0.5f * x * (1.0f + tanhf(S * x * inner)));
    }
}

const uint16_t *qi_k_gelu_table(void) {
    pthread_once(&g_gelu_once, gelu_table_fill);
    return g_gelu_table;
}

void qi_k_geglu_ref(int64_t n, float *g, const float *u) {
    const uint16_t *tab = qi_k_gelu_table();
    for (int64_t i = 0; i < n; i++) {
        const float x = g[i];
        if (x <= -10.0f)
            g[i] = 0.0f;
        else if (x >= 10.0f)
            g[i] = x * u[i];
        else
            g[i] = qi_fp16_to_f32(tab[qi_f32_to_fp16(x)]) * u[i];
    }
}

/* ---- the reference table ----------------------------------------------------------- */

static const qi_kernels k_ref = {
    .name = "ref",
    .gemm = {
        [QI_TYPE_Q4_0] = gemm_q4_0_ref,
        [QI_TYPE_Q4_1] = gemm_q4_1_ref,
        [QI_TYPE_Q5_0] = gemm_q5_0_ref,
        [QI_TYPE_Q5_1] = gemm_q5_1_ref,
        [QI_TYPE_Q8_0] = gemm_q8_0_ref,
        [QI_TYPE_Q4_K] = gemm_q4_K_ref,
        [QI_TYPE_Q6_K] = gemm_q6_K_ref,
    },
    .gemm_wide = {
        [QI_TYPE_Q4_K] = gemm_q4_K_tiled_ref,
        [QI_TYPE_Q6_K] = gemm_q6_K_tiled_ref,
    },
    .attn_scores = qi_k_attn_scores_ref,
    .softmax_f16 = qi_k_softmax_f16_ref,
    .exp_sum = qi_k_exp_sum_ref,
    .attn_values = qi_k_attn_values_ref,
    .attn_values_blk = qi_k_attn_values_blk_ref,
    .rope = qi_k_rope_ref,
    .swiglu = qi_k_swiglu_ref,
    .geglu = qi_k_geglu_ref,
    .quantize_q8 = qi_k_quantize_q8_ref,
    .f16_to_f32 = qi_k_f16_to_f32_ref,
    .f32_to_f16 = qi_k_f32_to_f16_ref,
    .gemm_packed = {
        [QI_TYPE_Q4_0] = qi_k_gemm_packed_q4_0_ref,
        [QI_TYPE_Q4_1] = qi_k_gemm_packed_q4_1_ref,
        [QI_TYPE_Q8_0] = qi_k_gemm_packed_q8_0_ref,
        [QI_TYPE_Q5_0] = qi_k_gemm_packed_q5_0_ref,
        [QI_TYPE_Q5_1] = qi_k_gemm_packed_q5_1_ref,
    },
};

const qi_kernels *qi_kernels_ref(void) { return &k_ref; }

/* quant.c - reference (plain C11) kernels for the block formats: fp16/bf16
 * conversion, quantize, dequantize and the quantised dot product.
 *
 * This file is the specification the SIMD kernels are checked against, so it
 * optimises for being obviously the same arithmetic as ggml, not for speed:
 * every float expression is written in ggml's evaluation order (with
 * -ffp-contract=off, no FMA) because the point is bit-identical bytes for
 * the quantizers and the same rounding sequence for the dot products. Where
 * ggml's code is shaped by SIMD (the 8-lane accumulators of the K dot
 * products) the lane structure is kept, since it changes the float sums.
 *
 * Layouts are described once, on the block structs in qinfer/quant.h. Each
 * format below has a dequantizer, a quantizer and (for weight types) a dot
 * product with its activation type; the public functions dispatch on type.
 * Considered and rejected: table-driven dispatch with function pointers
 * (harder to read in a file whose job is to be read) and byte-offset access
 * instead of structs (endian-explicit, but the engine is little-endian only
 * and the structs double as documentation for the SIMD kernels).
 */
#include "qinfer/quant.h"

#include <float.h>
#include <math.h>
#include <string.h>

#include "qinfer/status.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "qinfer's block formats assume a little-endian host"
#endif

_Static_assert(sizeof(qi_block_q4_0) == 18, "q4_0 block size");
_Static_assert(sizeof(qi_block_q4_1) == 20, "q4_1 block size");
_Static_assert(sizeof(qi_block_q5_0) == 22, "q5_0 block size");
_Static_assert(sizeof(qi_block_q5_1) == 24, "q5_1 block size");
_Static_assert(sizeof(qi_block_q8_0) == 34, "q8_0 block size");
_Static_assert(sizeof(qi_block_q8_1) == 36, "q8_1 block size");
_Static_assert(sizeof(qi_block_q4_K) == 144, "q4_K block size");
_Static_assert(sizeof(qi_block_q5_K) == 176, "q5_K block size");
_Static_assert(sizeof(qi_block_q6_K) == 210, "q6_K block size");
_Static_assert(sizeof(qi_block_q8_K) == 292, "q8_K block size");
_Static_assert(sizeof(float) == 4, "IEEE binary32 float");

/* ---- scalar conversions ---------------------------------------------------- */

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float f32_from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

float qi_fp16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    if (exp == 0) {
        /* zero or subnormal: man * 2^-24, exact in binary32 */
        float mag = (float)man * 0x1p-24f;
        return f32_from_bits(sign | f32_bits(mag));
    }
    if (exp == 31) {
        /* inf, or NaN made quiet (ggml's portable path quiets through a
         * float multiply) */
        uint32_t quiet = man ? 0x00400000u : 0;
        return f32_from_bits(sign | 0x7f800000u | quiet | (man << 13));
    }
    return f32_from_bits(sign | ((exp + 112) << 23) | (man << 13));
}

uint16_t qi_f32_to_fp16(float f) {
    uint32_t x = f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return sign | 0x7e00u;   /* NaN */
    if (ax >= 0x477ff000u) return sign | 0x7c00u;  /* >= 65520 rounds to inf */
    if (ax >= 0x38800000u) {
        /* normal result: rebias the exponent (127 -> 15), then round the
         * 23-bit mantissa to 10 bits; a carry ripples into the exponent,
         * which is the right answer */
        uint32_t m = ax - (112u << 23);
        m += 0xfffu + ((m >> 13) & 1u);
        return sign | (uint16_t)(m >> 13);
    }
    if (ax <= 0x33000000u) return sign;  /* <= 2^-25: ties to even give 0 */
    /* subnormal result in units of 2^-24 */
    uint32_t exp = ax >> 23;            /* 102..112 */
    uint32_t man = (ax & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - exp;         /* 14..24 */
    uint32_t q = man >> shift;
    uint32_t rem = man & ((1u << shift) - 1);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) q++;
    return sign | (uint16_t)q;
}

float qi_bf16_to_f32(uint16_t h) {
    return f32_from_bits((uint32_t)h << 16);
}

uint16_t qi_f32_to_bf16(float f) {
    uint32_t x = f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u);
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

/* Round to nearest, ties to even, for |v| < 2^22. Adding 1.5 * 2^23 moves v
 * into the binade where floats are exactly the integers, so the addition's
 * own rounding does the work and the low mantissa bits hold the result plus
 * 2^22. The same arithmetic as ggml's K-quant helper, so the same answers,
 * including out-of-range garbage, without undefined behaviour. */
static int round_even(float v) {
    uint32_t u = f32_bits(v + 12582912.0f);
    return (int)(u & 0x7fffffu) - 0x400000;
}

static int clampi(int v, int lo, int hi) {
    return v < lo ? lo : v > hi ? hi : v;
}

/* ---- F32, F16, BF16 ------------------------------------------------------- */

static float dot_f32(int64_t n, const float *x, const float *y) {
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) sum += (double)(x[i] * y[i]);
    return (float)sum;
}

static float dot_f16(int64_t n, const uint16_t *x, const uint16_t *y) {
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++)
        sum += (double)(qi_fp16_to_f32(x[i]) * qi_fp16_to_f32(y[i]));
    return (float)sum;
}

static float dot_bf16(int64_t n, const uint16_t *x, const uint16_t *y) {
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++)
        sum += (double)(qi_bf16_to_f32(x[i]) * qi_bf16_to_f32(y[i]));
    return (float)sum;
}

/* ---- Q4_0 ------------------------------------------------------------------ */

static void quantize_q4_0(const float *x, qi_block_q4_0 *b, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += QI_QK) {
        /* the signed value of largest magnitude maps to q = 0 exactly */
        float amax = 0.0f, vmax = 0.0f;
        for (int j = 0; j < QI_QK; j++) {
            if (amax < fabsf(x[j])) {
                amax = fabsf(x[j]);
                vmax = x[j];
            }
        }
        const float d = vmax / -8;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        b[i].d = qi_f32_to_fp16(d);
        for (int j = 0; j < QI_QK / 2; j++) {
            /* truncation after +8.5 is round-half-up for these values */
            int lo = (int)(x[j] * id + 8.5f);
            int hi = (int)(x[j + QI_QK / 2] * id + 8.5f);
            if (lo > 15) lo = 15;
            if (hi > 15) hi = 15;
            b[i].qs[j] = (uint8_t)(lo | (hi << 4));
        }
    }
}

static void dequantize_q4_0(const qi_block_q4_0 *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += QI_QK) {
        const float d = qi_fp16_to_f32(b[i].d);
        for (int j = 0; j < QI_QK / 2; j++) {
            y[j] = (float)((b[i].qs[j] & 0x0f) - 8) * d;
            y[j + QI_QK / 2] = (float)((b[i].qs[j] >> 4) - 8) * d;
        }
    }
}

static float dot_q4_0_q8_0(const qi_block_q4_0 *w, const qi_block_q8_0 *a, int64_t nb) {
    float sum = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int s = 0;
        for (int j = 0; j < QI_QK / 2; j++) {
            s += ((w[i].qs[j] & 0x0f) - 8) * a[i].qs[j];
            s += ((w[i].qs[j] >> 4) - 8) * a[i].qs[j + QI_QK / 2];
        }
        sum += (float)s * qi_fp16_to_f32(w[i].d) * qi_fp16_to_f32(a[i].d);
    }
    return sum;
}

/* ---- Q4_1 ------------------------------------------------------------------ */

static void quantize_q4_1(const float *x, qi_block_q4_1 *b, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += QI_QK) {
        float lo = FLT_MAX, hi = -FLT_MAX;
        for (int j = 0; j < QI_QK; j++) {
            if (x[j] < lo) lo = x[j];
            if (x[j] > hi) hi = x[j];
        }
        const float d = (hi - lo) / 15;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        b[i].d = qi_f32_to_fp16(d);
        b[i].m = qi_f32_to_fp16(lo);
        for (int j = 0; j < QI_QK / 2; j++) {
            int q0 = (int)((x[j] - lo) * id + 0.5f);
            int q1 = (int)((x[j + QI_QK / 2] - lo) * id + 0.5f);
            if (q0 > 15) q0 = 15;
            if (q1 > 15) q1 = 15;
            b[i].qs[j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

static void dequantize_q4_1(const qi_block_q4_1 *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += QI_QK) {
        const float d = qi_fp16_to_f32(b[i].d);
        const float m = qi_fp16_to_f32(b[i].m);
        for (int j = 0; j < QI_QK / 2; j++) {
            y[j] = (float)(b[i].qs[j] & 0x0f) * d + m;
            y[j + QI_QK / 2] = (float)(b[i].qs[j] >> 4) * d + m;
        }
    }
}

static float dot_q4_1_q8_1(const qi_block_q4_1 *w, const qi_block_q8_1 *a, int64_t nb) {
    float sum = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int s = 0;
        for (int j = 0; j < QI_QK / 2; j++) {
            s += (w[i].qs[j] & 0x0f) * a[i].qs[j];
            s += (w[i].qs[j] >> 4) * a[i].qs[j + QI_QK / 2];
        }
        /* sum_j (d q_j + m) * da a_j = d da sum q a + m * (da sum a) */
        const float dd = qi_fp16_to_f32(w[i].d) * qi_fp16_to_f32(a[i].d);
        sum += dd * (float)s + qi_fp16_to_f32(w[i].m) * qi_fp16_to_f32(a[i].s);
    }
    return sum;
}

/* ---- Q5_0 / Q5_1 ----------------------------------------------------------- */

static uint32_t load_qh(const uint8_t qh[4]) {
    return (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 |
           (uint32_t)qh[3] << 24;
}

static void store_qh(uint8_t qh[4], uint32_t v) {
    for (int k = 0; k < 4; k++) qh[k] = (uint8_t)(v >> (8 * k));
}

/* The 5-bit quants of one Q5 block, element order. */
static void unpack_q5(const uint8_t qs[16], const uint8_t qh[4], int q[QI_QK]) {
    const uint32_t h = load_qh(qh);
    for (int j = 0; j < QI_QK / 2; j++) {
        q[j] = (qs[j] & 0x0f) | (int)(((h >> j) & 1u) << 4);
        q[j + QI_QK / 2] = (qs[j] >> 4) | (int)(((h >> (j + QI_QK / 2)) & 1u) << 4);
    }
}

static void pack_q5(const int q[QI_QK], uint8_t qs[16], uint8_t qh[4]) {
    uint32_t h = 0;
    for (int j = 0; j < QI_QK / 2; j++) {
        const int q0 = q[j], q1 = q[j + QI_QK / 2];
        qs[j] = (uint8_t)((q0 & 0x0f) | ((q1 & 0x0f) << 4));
        h |= (uint32_t)((q0 >> 4) & 1) << j;
        h |= (uint32_t)((q1 >> 4) & 1) << (j + QI_QK / 2);
    }
    store_qh(qh, h);
}

static void quantize_q5_0(const float *x, qi_block_q5_0 *b, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += QI_QK) {
        float amax = 0.0f, vmax = 0.0f;
        for (int j = 0; j < QI_QK; j++) {
            if (amax < fabsf(x[j])) {
                amax = fabsf(x[j]);
                vmax = x[j];
            }
        }
        const float d = vmax / -16;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        b[i].d = qi_f32_to_fp16(d);
        int q[QI_QK];
        for (int j = 0; j < QI_QK; j++) {
            q[j] = (int)(x[j] * id + 16.5f);
            if (q[j] > 31) q[j] = 31;
        }
        pack_q5(q, b[i].qs, b[i].qh);
    }
}

static void dequantize_q5_0(const qi_block_q5_0 *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += QI_QK) {
        const float d = qi_fp16_to_f32(b[i].d);
        int q[QI_QK];
        unpack_q5(b[i].qs, b[i].qh, q);
        for (int j = 0; j < QI_QK; j++) y[j] = (float)(q[j] - 16) * d;
    }
}

static float dot_q5_0_q8_0(const qi_block_q5_0 *w, const qi_block_q8_0 *a, int64_t nb) {
    float sum = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int q[QI_QK], s = 0;
        unpack_q5(w[i].qs, w[i].qh, q);
        for (int j = 0; j < QI_QK; j++) s += (q[j] - 16) * a[i].qs[j];
        sum += (qi_fp16_to_f32(w[i].d) * qi_fp16_to_f32(a[i].d)) * (float)s;
    }
    return sum;
}

static void quantize_q5_1(const float *x, qi_block_q5_1 *b, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += QI_QK) {
        float lo = FLT_MAX, hi = -FLT_MAX;
        for (int j = 0; j < QI_QK; j++) {
            if (x[j] < lo) lo = x[j];
            if (x[j] > hi) hi = x[j];
        }
        const float d = (hi - lo) / 31;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        b[i].d = qi_f32_to_fp16(d);
        b[i].m = qi_f32_to_fp16(lo);
        /* (x - lo) * id <= 31 within a few ulps, so no clamp is needed
         * (ggml has none either) */
        int q[QI_QK];
        for (int j = 0; j < QI_QK; j++) q[j] = (int)((x[j] - lo) * id + 0.5f);
        pack_q5(q, b[i].qs, b[i].qh);
    }
}

static void dequantize_q5_1(const qi_block_q5_1 *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += QI_QK) {
        const float d = qi_fp16_to_f32(b[i].d);
        const float m = qi_fp16_to_f32(b[i].m);
        int q[QI_QK];
        unpack_q5(b[i].qs, b[i].qh, q);
        for (int j = 0; j < QI_QK; j++) y[j] = (float)q[j] * d + m;
    }
}

static float dot_q5_1_q8_1(const qi_block_q5_1 *w, const qi_block_q8_1 *a, int64_t nb) {
    float sum = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int q[QI_QK], s = 0;
        unpack_q5(w[i].qs, w[i].qh, q);
        for (int j = 0; j < QI_QK; j++) s += q[j] * a[i].qs[j];
        const float dd = qi_fp16_to_f32(w[i].d) * qi_fp16_to_f32(a[i].d);
        sum += dd * (float)s + qi_fp16_to_f32(w[i].m) * qi_fp16_to_f32(a[i].s);
    }
    return sum;
}

/* ---- Q8_0 / Q8_1 ----------------------------------------------------------- */

/* Shared by Q8_0 and Q8_1: scale amax/127, round half away from zero
 * (roundf), using the unrounded d's reciprocal. Returns the float d. */
static float quantize_q8_block(const float *x, int8_t qs[QI_QK]) {
    float amax = 0.0f;
    for (int j = 0; j < QI_QK; j++) amax = amax > fabsf(x[j]) ? amax : fabsf(x[j]);
    const float d = amax / 127;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int j = 0; j < QI_QK; j++) qs[j] = (int8_t)roundf(x[j] * id);
    return d;
}

static void quantize_q8_0(const float *x, qi_block_q8_0 *b, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += QI_QK)
        b[i].d = qi_f32_to_fp16(quantize_q8_block(x, b[i].qs));
}

static void quantize_q8_1(const float *x, qi_block_q8_1 *b, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += QI_QK) {
        const float d = quantize_q8_block(x, b[i].qs);
        int s = 0;
        for (int j = 0; j < QI_QK; j++) s += b[i].qs[j];
        b[i].d = qi_f32_to_fp16(d);
        b[i].s = qi_f32_to_fp16((float)s * d);
    }
}

static void dequantize_q8_0(const qi_block_q8_0 *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += QI_QK) {
        const float d = qi_fp16_to_f32(b[i].d);
        for (int j = 0; j < QI_QK; j++) y[j] = (float)b[i].qs[j] * d;
    }
}

/* ggml has no Q8_1 dequantizer; this is the obvious one, q * d. */
static void dequantize_q8_1(const qi_block_q8_1 *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += QI_QK) {
        const float d = qi_fp16_to_f32(b[i].d);
        for (int j = 0; j < QI_QK; j++) y[j] = (float)b[i].qs[j] * d;
    }
}

static float dot_q8_0_q8_0(const qi_block_q8_0 *w, const qi_block_q8_0 *a, int64_t nb) {
    float sum = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int s = 0;
        for (int j = 0; j < QI_QK; j++) s += w[i].qs[j] * a[i].qs[j];
        sum += (float)s * (qi_fp16_to_f32(w[i].d) * qi_fp16_to_f32(a[i].d));
    }
    return sum;
}

/* ---- K-quant helpers ------------------------------------------------------- */

#define QI_GROUP_EPS 1e-15f /* below this amax a group counts as all zero */

/* Asymmetric fit for Q4_K/Q5_K (ggml's make_qkx2_quants, squared error):
 * find scale s and offset m <= 0 with x ~ s*L + m, L in [0, nmax], by
 * weighted least squares over nstep+1 candidate grids. Writes L, returns s,
 * stores -m in *neg_min. `tmp` is scratch of n bytes. */
static float fit_scale_min(int n, int nmax, const float *x, const float *w, uint8_t *L,
                           float *neg_min, uint8_t *tmp, float rmin, float rdelta,
                           int nstep) {
    float lo = x[0], hi = x[0];
    float sum_w = w[0];
    float sum_x = sum_w * x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < lo) lo = x[i];
        if (x[i] > hi) hi = x[i];
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    if (lo > 0) lo = 0;
    if (hi == lo) {
        memset(L, 0, (size_t)n);
        *neg_min = -lo;
        return 0.0f;
    }
    float iscale = (float)nmax / (hi - lo);
    float scale = 1 / iscale;
    float best_err = 0;
    for (int i = 0; i < n; i++) {
        L[i] = (uint8_t)clampi(round_even(iscale * (x[i] - lo)), 0, nmax);
        const float diff = scale * (float)L[i] + lo - x[i];
        best_err += w[i] * (diff * diff);
    }
    for (int is = 0; is <= nstep; is++) {
        iscale = (rmin + rdelta * (float)is + (float)nmax) / (hi - lo);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; i++) {
            const int l = clampi(round_even(iscale * (x[i] - lo)), 0, nmax);
            tmp[i] = (uint8_t)l;
            const float fl = (float)l;
            sum_l += w[i] * fl;
            sum_l2 += w[i] * fl * fl;
            sum_xl += w[i] * fl * x[i];
        }
        const float det = sum_w * sum_l2 - sum_l * sum_l;
        if (det > 0) {
            float s = (sum_w * sum_xl - sum_x * sum_l) / det;
            float m = (sum_l2 * sum_x - sum_l * sum_xl) / det;
            if (m > 0) {
                m = 0;
                s = sum_xl / sum_l2;
            }
            float err = 0;
            for (int i = 0; i < n; i++) {
                const float diff = s * (float)tmp[i] + m - x[i];
                err += w[i] * (diff * diff);
            }
            if (err < best_err) {
                memcpy(L, tmp, (size_t)n);
                best_err = err;
                scale = s;
                lo = m;
            }
        }
    }
    *neg_min = -lo;
    return scale;
}

/* Symmetric fit for Q6_K (ggml's make_qx_quants with x^2 weights): x ~ s*l,
 * l in [-nmax, nmax-1], trying 19 grids around nmax/max. Writes L = l + nmax
 * and returns s (0 for an all-zero group, whose L are 0). */
static float fit_scale_sym(int n, int nmax, const float *x, int8_t *L) {
    float amax = 0, vmax = 0;
    for (int i = 0; i < n; i++) {
        if (fabsf(x[i]) > amax) {
            amax = fabsf(x[i]);
            vmax = x[i];
        }
    }
    if (amax < QI_GROUP_EPS) {
        memset(L, 0, (size_t)n);
        return 0.0f;
    }
    float iscale = (float)(-nmax) / vmax;
    float sum_lx = 0, sum_l2 = 0;
    for (int i = 0; i < n; i++) {
        const int l = clampi(round_even(iscale * x[i]), -nmax, nmax - 1);
        L[i] = (int8_t)(l + nmax);
        const float w = x[i] * x[i];
        sum_lx += w * x[i] * (float)l;
        sum_l2 += w * (float)l * (float)l;
    }
    float scale = sum_l2 != 0.0f ? sum_lx / sum_l2 : 0.0f;
    float best = scale * sum_lx;
    for (int is = -9; is <= 9; is++) {
        if (is == 0) continue;
        iscale = -((float)nmax + 0.1f * (float)is) / vmax;
        sum_lx = sum_l2 = 0;
        for (int i = 0; i < n; i++) {
            const int l = clampi(round_even(iscale * x[i]), -nmax, nmax - 1);
            const float w = x[i] * x[i];
            sum_lx += w * x[i] * (float)l;
            sum_l2 += w * (float)l * (float)l;
        }
        if (sum_l2 > 0 && sum_lx * sum_lx > best * sum_l2) {
            for (int i = 0; i < n; i++)
                L[i] = (int8_t)(clampi(round_even(iscale * x[i]), -nmax, nmax - 1) + nmax);
            scale = sum_lx / sum_l2;
            best = scale * sum_lx;
        }
    }
    return scale;
}

/* Q4_K/Q5_K scales bytes: sub-blocks 0-3 keep scale and min in the low 6
 * bits of bytes 0-3 and 4-7; sub-blocks 4-7 keep their low 4 bits in the
 * nibbles of bytes 8-11 (scale low, min high) and their top 2 bits in bits
 * 6-7 of bytes 0-3 (scale) and 4-7 (min). */
void qi_k_scale_min(const uint8_t s[12], int b, uint8_t *sc, uint8_t *mn) {
    if (b < 4) {
        *sc = s[b] & 63;
        *mn = s[b + 4] & 63;
    } else {
        *sc = (uint8_t)((s[b + 4] & 0x0f) | ((s[b - 4] >> 6) << 4));
        *mn = (uint8_t)((s[b + 4] >> 4) | ((s[b] >> 6) << 4));
    }
}

static void pack_k_scales(const uint8_t sc[8], const uint8_t mn[8], uint8_t s[12]) {
    for (int b = 0; b < 4; b++) {
        s[b] = (uint8_t)(sc[b] | ((sc[b + 4] >> 4) << 6));
        s[b + 4] = (uint8_t)(mn[b] | ((mn[b + 4] >> 4) << 6));
        s[b + 8] = (uint8_t)((sc[b + 4] & 0x0f) | ((mn[b + 4] & 0x0f) << 4));
    }
}

/* Shared first half of the Q4_K and Q5_K quantizers: fit each 32-element
 * sub-block, quantise the 8 scales and mins to 6 bits against the block's
 * largest, then requantise the elements against the rounded scales. Writes
 * d, dmin, scales and L[256] (values 0..nmax). */
static void quantize_k_asym(const float *x, int nmax, float rmin, int nstep, uint16_t *d_out,
                            uint16_t *dmin_out, uint8_t scales_out[12], uint8_t L[QI_QK_K]) {
    float scales[8], mins[8], weights[32];
    uint8_t tmp[32];
    float max_scale = 0, max_min = 0;
    for (int b = 0; b < 8; b++) {
        const float *xb = x + 32 * b;
        /* weight each element by rms(block) + |x|: large values matter more */
        float sum_x2 = 0;
        for (int l = 0; l < 32; l++) sum_x2 += xb[l] * xb[l];
        const float av_x = sqrtf(sum_x2 / 32);
        for (int l = 0; l < 32; l++) weights[l] = av_x + fabsf(xb[l]);
        scales[b] = fit_scale_min(32, nmax, xb, weights, L + 32 * b, &mins[b], tmp, rmin,
                                  0.1f, nstep);
        if (scales[b] > max_scale) max_scale = scales[b];
        if (mins[b] > max_min) max_min = mins[b];
    }
    const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
    const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
    uint8_t sc[8], mn[8];
    for (int b = 0; b < 8; b++) {
        /* uint8_t wrap then clamp, as ggml (matters only for odd inputs) */
        const uint8_t ls = (uint8_t)round_even(inv_scale * scales[b]);
        const uint8_t lm = (uint8_t)round_even(inv_min * mins[b]);
        sc[b] = ls < 63 ? ls : 63;
        mn[b] = lm < 63 ? lm : 63;
    }
    pack_k_scales(sc, mn, scales_out);
    *d_out = qi_f32_to_fp16(max_scale / 63.f);
    *dmin_out = qi_f32_to_fp16(max_min / 63.f);
    const float dq = qi_fp16_to_f32(*d_out);
    const float mq = qi_fp16_to_f32(*dmin_out);
    for (int b = 0; b < 8; b++) {
        const float d = dq * (float)sc[b];
        if (d == 0.0f) continue; /* keep the fit's L for a zero scale */
        const float dm = mq * (float)mn[b];
        for (int l = 0; l < 32; l++)
            L[32 * b + l] = (uint8_t)clampi(round_even((x[32 * b + l] + dm) / d), 0, nmax);
    }
}

/* ---- Q4_K ------------------------------------------------------------------ */

static void quantize_q4_K(const float *x, qi_block_q4_K *b, int64_t nb) {
    uint8_t L[QI_QK_K];
    for (int64_t i = 0; i < nb; i++, x += QI_QK_K) {
        quantize_k_asym(x, 15, -1.0f, 20, &b[i].d, &b[i].dmin, b[i].scales, L);
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++)
                b[i].qs[32 * c + l] = (uint8_t)(L[64 * c + l] | (L[64 * c + 32 + l] << 4));
    }
}

/* Unsigned 4- or 5-bit quants of a Q4_K/Q5_K block in element order. */
static void unpack_q4_K(const qi_block_q4_K *b, uint8_t q[QI_QK_K]) {
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) {
            q[64 * c + l] = b->qs[32 * c + l] & 0x0f;
            q[64 * c + 32 + l] = b->qs[32 * c + l] >> 4;
        }
}

static void unpack_q5_K(const qi_block_q5_K *b, uint8_t q[QI_QK_K]) {
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) {
            const uint8_t h = b->qh[l];
            q[64 * c + l] = (uint8_t)((b->qs[32 * c + l] & 0x0f) | (((h >> (2 * c)) & 1) << 4));
            q[64 * c + 32 + l] =
                (uint8_t)((b->qs[32 * c + l] >> 4) | (((h >> (2 * c + 1)) & 1) << 4));
        }
}

/* x = (d*sc) * q - (dmin*mn), per 32-element sub-block. */
static void dequantize_k_asym(uint16_t d16, uint16_t dmin16, const uint8_t scales[12],
                              const uint8_t q[QI_QK_K], float *y) {
    const float d = qi_fp16_to_f32(d16);
    const float dmin = qi_fp16_to_f32(dmin16);
    for (int b = 0; b < 8; b++) {
        uint8_t sc, mn;
        qi_k_scale_min(scales, b, &sc, &mn);
        const float ds = d * (float)sc;
        const float ms = dmin * (float)mn;
        for (int l = 0; l < 32; l++) y[32 * b + l] = ds * (float)q[32 * b + l] - ms;
    }
}

static void dequantize_q4_K(const qi_block_q4_K *b, float *y, int64_t nb) {
    uint8_t q[QI_QK_K];
    for (int64_t i = 0; i < nb; i++, y += QI_QK_K) {
        unpack_q4_K(&b[i], q);
        dequantize_k_asym(b[i].d, b[i].dmin, b[i].scales, q, y);
    }
}

/* Dot of one Q4_K/Q5_K block (quants q, scales) with a Q8_K block, in
 * ggml's generic shape: integer products summed into 8 lanes by element
 * index mod 8, each lane scaled by d into its own float accumulator; the
 * min term is an integer sum over the Q8_K bsums, subtracted from *sum. */
static void dot_k_asym_block(uint16_t d16, uint16_t dmin16, const uint8_t scales[12],
                             const uint8_t q[QI_QK_K], const qi_block_q8_K *a,
                             float lanes[8], float *sum) {
    uint8_t sc[8], mn[8];
    for (int b = 0; b < 8; b++) qi_k_scale_min(scales, b, &sc[b], &mn[b]);
    int32_t acc[8] = {0};
    for (int k = 0; k < QI_QK_K; k++) acc[k % 8] += sc[k / 32] * (q[k] * a->qs[k]);
    int summ = 0;
    for (int j = 0; j < QI_QK_K / 16; j++) summ += a->bsums[j] * mn[j / 2];
    const float d = qi_fp16_to_f32(d16) * a->d;
    for (int l = 0; l < 8; l++) lanes[l] += d * (float)acc[l];
    const float dmin = qi_fp16_to_f32(dmin16) * a->d;
    *sum -= dmin * (float)summ;
}

static float dot_q4_K_q8_K(const qi_block_q4_K *w, const qi_block_q8_K *a, int64_t nb) {
    float lanes[8] = {0}, sum = 0.0f;
    uint8_t q[QI_QK_K];
    for (int64_t i = 0; i < nb; i++) {
        unpack_q4_K(&w[i], q);
        dot_k_asym_block(w[i].d, w[i].dmin, w[i].scales, q, &a[i], lanes, &sum);
    }
    for (int l = 0; l < 8; l++) sum += lanes[l];
    return sum;
}

/* ---- Q5_K ------------------------------------------------------------------ */

static void quantize_q5_K(const float *x, qi_block_q5_K *b, int64_t nb) {
    uint8_t L[QI_QK_K];
    for (int64_t i = 0; i < nb; i++, x += QI_QK_K) {
        quantize_k_asym(x, 31, -0.5f, 15, &b[i].d, &b[i].dmin, b[i].scales, L);
        memset(b[i].qh, 0, sizeof b[i].qh);
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++) {
                const int q0 = L[64 * c + l], q1 = L[64 * c + 32 + l];
                b[i].qs[32 * c + l] = (uint8_t)((q0 & 0x0f) | ((q1 & 0x0f) << 4));
                b[i].qh[l] |= (uint8_t)(((q0 >> 4) << (2 * c)) | ((q1 >> 4) << (2 * c + 1)));
            }
    }
}

static void dequantize_q5_K(const qi_block_q5_K *b, float *y, int64_t nb) {
    uint8_t q[QI_QK_K];
    for (int64_t i = 0; i < nb; i++, y += QI_QK_K) {
        unpack_q5_K(&b[i], q);
        dequantize_k_asym(b[i].d, b[i].dmin, b[i].scales, q, y);
    }
}

static float dot_q5_K_q8_K(const qi_block_q5_K *w, const qi_block_q8_K *a, int64_t nb) {
    float lanes[8] = {0}, sum = 0.0f;
    uint8_t q[QI_QK_K];
    for (int64_t i = 0; i < nb; i++) {
        unpack_q5_K(&w[i], q);
        dot_k_asym_block(w[i].d, w[i].dmin, w[i].scales, q, &a[i], lanes, &sum);
    }
    for (int l = 0; l < 8; l++) sum += lanes[l];
    return sum;
}

/* ---- Q6_K ------------------------------------------------------------------ */

static void quantize_q6_K(const float *x, qi_block_q6_K *b, int64_t nb) {
    int8_t L[QI_QK_K];
    float scales[QI_QK_K / 16];
    for (int64_t i = 0; i < nb; i++, x += QI_QK_K) {
        float max_scale = 0, max_abs = 0;
        for (int g = 0; g < QI_QK_K / 16; g++) {
            scales[g] = fit_scale_sym(16, 32, x + 16 * g, L + 16 * g);
            if (fabsf(scales[g]) > max_abs) {
                max_abs = fabsf(scales[g]);
                max_scale = scales[g];
            }
        }
        if (max_abs < QI_GROUP_EPS) {
            memset(&b[i], 0, sizeof b[i]);
            continue;
        }
        /* the signed largest scale maps to -128 */
        const float iscale = -128.f / max_scale;
        b[i].d = qi_f32_to_fp16(1 / iscale);
        for (int g = 0; g < QI_QK_K / 16; g++) {
            const int s = round_even(iscale * scales[g]);
            b[i].scales[g] = (int8_t)(s < 127 ? s : 127);
        }
        const float dq = qi_fp16_to_f32(b[i].d);
        for (int g = 0; g < QI_QK_K / 16; g++) {
            const float d = dq * (float)b[i].scales[g];
            if (d == 0.0f) continue;
            for (int l = 0; l < 16; l++)
                L[16 * g + l] = (int8_t)(clampi(round_even(x[16 * g + l] / d), -32, 31) + 32);
        }
        for (int h = 0; h < 2; h++) {
            const int8_t *Lh = L + 128 * h;
            uint8_t *ql = b[i].ql + 64 * h;
            uint8_t *qh = b[i].qh + 32 * h;
            for (int l = 0; l < 32; l++) {
                const int q0 = Lh[l], q1 = Lh[l + 32], q2 = Lh[l + 64], q3 = Lh[l + 96];
                ql[l] = (uint8_t)((q0 & 0x0f) | ((q2 & 0x0f) << 4));
                ql[l + 32] = (uint8_t)((q1 & 0x0f) | ((q3 & 0x0f) << 4));
                qh[l] = (uint8_t)((q0 >> 4) | ((q1 >> 4) << 2) | ((q2 >> 4) << 4) |
                                  ((q3 >> 4) << 6));
            }
        }
    }
}

/* Signed 6-bit quants (q - 32) of a Q6_K block in element order. */
static void unpack_q6_K(const qi_block_q6_K *b, int8_t q[QI_QK_K]) {
    for (int h = 0; h < 2; h++) {
        const uint8_t *ql = b->ql + 64 * h;
        const uint8_t *qh = b->qh + 32 * h;
        int8_t *qo = q + 128 * h;
        for (int l = 0; l < 32; l++) {
            qo[l] = (int8_t)(((ql[l] & 0x0f) | (((qh[l] >> 0) & 3) << 4)) - 32);
            qo[l + 32] = (int8_t)(((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) - 32);
            qo[l + 64] = (int8_t)(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
            qo[l + 96] = (int8_t)(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
        }
    }
}

static void dequantize_q6_K(const qi_block_q6_K *b, float *y, int64_t nb) {
    int8_t q[QI_QK_K];
    for (int64_t i = 0; i < nb; i++, y += QI_QK_K) {
        const float d = qi_fp16_to_f32(b[i].d);
        unpack_q6_K(&b[i], q);
        for (int k = 0; k < QI_QK_K; k++)
            y[k] = d * (float)b[i].scales[k / 16] * (float)q[k];
    }
}

static float dot_q6_K_q8_K(const qi_block_q6_K *w, const qi_block_q8_K *a, int64_t nb) {
    float lanes[8] = {0}, sum = 0.0f;
    int8_t q[QI_QK_K];
    for (int64_t i = 0; i < nb; i++) {
        unpack_q6_K(&w[i], q);
        int32_t acc[8] = {0};
        for (int k = 0; k < QI_QK_K; k++)
            acc[k % 8] += w[i].scales[k / 16] * (q[k] * a[i].qs[k]);
        const float d = qi_fp16_to_f32(w[i].d) * a[i].d;
        for (int l = 0; l < 8; l++) lanes[l] += d * (float)acc[l];
    }
    for (int l = 0; l < 8; l++) sum += lanes[l];
    return sum;
}

/* ---- Q8_K ------------------------------------------------------------------ */

static void quantize_q8_K(const float *x, qi_block_q8_K *b, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += QI_QK_K) {
        float amax = 0, vmax = 0;
        for (int k = 0; k < QI_QK_K; k++) {
            if (fabsf(x[k]) > amax) {
                amax = fabsf(x[k]);
                vmax = x[k];
            }
        }
        if (amax == 0.0f) {
            memset(&b[i], 0, sizeof b[i]);
            continue;
        }
        /* -127 rather than -128 keeps every q in [-127, 127] */
        const float iscale = -127.f / vmax;
        for (int k = 0; k < QI_QK_K; k++) {
            const int v = round_even(iscale * x[k]);
            b[i].qs[k] = (int8_t)(v < 127 ? v : 127);
        }
        for (int g = 0; g < QI_QK_K / 16; g++) {
            int s = 0;
            for (int l = 0; l < 16; l++) s += b[i].qs[16 * g + l];
            b[i].bsums[g] = (int16_t)s;
        }
        b[i].d = 1 / iscale;
    }
}

static void dequantize_q8_K(const qi_block_q8_K *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += QI_QK_K)
        for (int k = 0; k < QI_QK_K; k++) y[k] = b[i].d * (float)b[i].qs[k];
}

/* ---- dispatch -------------------------------------------------------------- */

bool qi_quant_supported(uint32_t type) {
    switch (type) {
    case QI_TYPE_F32: case QI_TYPE_F16: case QI_TYPE_BF16:
    case QI_TYPE_Q4_0: case QI_TYPE_Q4_1: case QI_TYPE_Q5_0: case QI_TYPE_Q5_1:
    case QI_TYPE_Q8_0: case QI_TYPE_Q8_1:
    case QI_TYPE_Q4_K: case QI_TYPE_Q5_K: case QI_TYPE_Q6_K: case QI_TYPE_Q8_K:
        return true;
    default:
        return false;
    }
}

uint32_t qi_vec_dot_type(uint32_t type) {
    switch (type) {
    case QI_TYPE_F32: case QI_TYPE_F16: case QI_TYPE_BF16:
        return type;
    case QI_TYPE_Q4_0: case QI_TYPE_Q5_0: case QI_TYPE_Q8_0:
        return QI_TYPE_Q8_0;
    case QI_TYPE_Q4_1: case QI_TYPE_Q5_1:
        return QI_TYPE_Q8_1;
    case QI_TYPE_Q4_K: case QI_TYPE_Q5_K: case QI_TYPE_Q6_K:
        return QI_TYPE_Q8_K;
    default:
        return QI_TYPE_COUNT;
    }
}

bool qi_type_can_dot(uint32_t type) {
    return qi_vec_dot_type(type) != QI_TYPE_COUNT;
}

size_t qi_row_bytes(uint32_t type, int64_t n) {
    uint64_t bytes;
    if (n < 0 || !qi_type_row_bytes(type, (uint64_t)n, &bytes) || bytes > SIZE_MAX) return 0;
    return (size_t)bytes;
}

/* Blocks in a row, asserting the caller's contract. */
static int64_t row_blocks(uint32_t type, int64_t n) {
    const qi_type_info *t = qi_type_get(type);
    QI_ASSERT(qi_quant_supported(type) && t);
    QI_ASSERT(n >= 0 && n % t->blck == 0);
    return n / t->blck;
}

void qi_dequantize_row_ref(uint32_t type, const void *src, float *dst, int64_t n) {
    const int64_t nb = row_blocks(type, n);
    switch (type) {
    case QI_TYPE_F32:
        if (nb) memcpy(dst, src, (size_t)nb * sizeof(float));
        break;
    case QI_TYPE_F16:
        for (int64_t i = 0; i < nb; i++) dst[i] = qi_fp16_to_f32(((const uint16_t *)src)[i]);
        break;
    case QI_TYPE_BF16:
        for (int64_t i = 0; i < nb; i++) dst[i] = qi_bf16_to_f32(((const uint16_t *)src)[i]);
        break;
    case QI_TYPE_Q4_0: dequantize_q4_0(src, dst, nb); break;
    case QI_TYPE_Q4_1: dequantize_q4_1(src, dst, nb); break;
    case QI_TYPE_Q5_0: dequantize_q5_0(src, dst, nb); break;
    case QI_TYPE_Q5_1: dequantize_q5_1(src, dst, nb); break;
    case QI_TYPE_Q8_0: dequantize_q8_0(src, dst, nb); break;
    case QI_TYPE_Q8_1: dequantize_q8_1(src, dst, nb); break;
    case QI_TYPE_Q4_K: dequantize_q4_K(src, dst, nb); break;
    case QI_TYPE_Q5_K: dequantize_q5_K(src, dst, nb); break;
    case QI_TYPE_Q6_K: dequantize_q6_K(src, dst, nb); break;
    case QI_TYPE_Q8_K: dequantize_q8_K(src, dst, nb); break;
    default: QI_ASSERT(0 && "unsupported type");
    }
}

void qi_quantize_row_ref(uint32_t type, const float *src, void *dst, int64_t n) {
    const int64_t nb = row_blocks(type, n);
    switch (type) {
    case QI_TYPE_F32:
        if (nb) memcpy(dst, src, (size_t)nb * sizeof(float));
        break;
    case QI_TYPE_F16:
        for (int64_t i = 0; i < nb; i++) ((uint16_t *)dst)[i] = qi_f32_to_fp16(src[i]);
        break;
    case QI_TYPE_BF16:
        for (int64_t i = 0; i < nb; i++) ((uint16_t *)dst)[i] = qi_f32_to_bf16(src[i]);
        break;
    case QI_TYPE_Q4_0: quantize_q4_0(src, dst, nb); break;
    case QI_TYPE_Q4_1: quantize_q4_1(src, dst, nb); break;
    case QI_TYPE_Q5_0: quantize_q5_0(src, dst, nb); break;
    case QI_TYPE_Q5_1: quantize_q5_1(src, dst, nb); break;
    case QI_TYPE_Q8_0: quantize_q8_0(src, dst, nb); break;
    case QI_TYPE_Q8_1: quantize_q8_1(src, dst, nb); break;
    case QI_TYPE_Q4_K: quantize_q4_K(src, dst, nb); break;
    case QI_TYPE_Q5_K: quantize_q5_K(src, dst, nb); break;
    case QI_TYPE_Q6_K: quantize_q6_K(src, dst, nb); break;
    case QI_TYPE_Q8_K: quantize_q8_K(src, dst, nb); break;
    default: QI_ASSERT(0 && "unsupported type");
    }
}

float qi_vec_dot_ref(uint32_t type, int64_t n, const void *w, const void *a) {
    QI_ASSERT(qi_type_can_dot(type));
    const int64_t nb = row_blocks(type, n);
    switch (type) {
    case QI_TYPE_F32: return dot_f32(nb, w, a);
    case QI_TYPE_F16: return dot_f16(nb, w, a);
    case QI_TYPE_BF16: return dot_bf16(nb, w, a);
    case QI_TYPE_Q4_0: return dot_q4_0_q8_0(w, a, nb);
    case QI_TYPE_Q4_1: return dot_q4_1_q8_1(w, a, nb);
    case QI_TYPE_Q5_0: return dot_q5_0_q8_0(w, a, nb);
    case QI_TYPE_Q5_1: return dot_q5_1_q8_1(w, a, nb);
    case QI_TYPE_Q8_0: return dot_q8_0_q8_0(w, a, nb);
    case QI_TYPE_Q4_K: return dot_q4_K_q8_K(w, a, nb);
    case QI_TYPE_Q5_K: return dot_q5_K_q8_K(w, a, nb);
    case QI_TYPE_Q6_K: return dot_q6_K_q8_K(w, a, nb);
    default: QI_ASSERT(0 && "unsupported type"); return 0.0f;
    }
}

/* ---- integer codes (the sparse kernels' column form) ----------------------- */

int qi_code_group(uint32_t type) {
    switch (type) {
    case QI_TYPE_Q4_0:
    case QI_TYPE_Q4_1:
    case QI_TYPE_Q5_0:
    case QI_TYPE_Q5_1:
    case QI_TYPE_Q8_0:
    case QI_TYPE_Q4_K:
    case QI_TYPE_Q5_K: return 32;
    case QI_TYPE_Q6_K: return 16;
    default: return 0;
    }
}

int qi_code_bias(uint32_t type) { return type == QI_TYPE_Q4_0 ? 8 : 0; }

int qi_code_bits(uint32_t type) {
    return type == QI_TYPE_Q4_0 || type == QI_TYPE_Q4_1 || type == QI_TYPE_Q4_K ? 4 : 8;
}

bool qi_row_codes(uint32_t type, const void *row, int64_t n, int8_t *code, float *scale, float *min) {
    const int G = qi_code_group(type);
    if (!G || qi_row_bytes(type, n) == 0 || n <= 0) return false;
    switch (type) {
    case QI_TYPE_Q4_0:
    case QI_TYPE_Q4_1: {
        const bool q41 = type == QI_TYPE_Q4_1;
        for (int64_t i = 0; i < n / QI_QK; i++) {
            const uint8_t *qs = q41 ? ((const qi_block_q4_1 *)row)[i].qs : ((const qi_block_q4_0 *)row)[i].qs;
            const uint16_t d = q41 ? ((const qi_block_q4_1 *)row)[i].d : ((const qi_block_q4_0 *)row)[i].d;
            for (int j = 0; j < QI_QK / 2; j++) {
                code[QI_QK * i + j] = (int8_t)((qs[j] & 0x0f) - (q41 ? 0 : 8));
                code[QI_QK * i + j + QI_QK / 2] = (int8_t)((qs[j] >> 4) - (q41 ? 0 : 8));
            }
            scale[i] = qi_fp16_to_f32(d);
            min[i] = q41 ? qi_fp16_to_f32(((const qi_block_q4_1 *)row)[i].m) : 0.0f;
        }
        return true;
    }
    case QI_TYPE_Q5_0:
    case QI_TYPE_Q5_1: {
        const bool q51 = type == QI_TYPE_Q5_1;
        for (int64_t i = 0; i < n / QI_QK; i++) {
            int q[QI_QK];
            if (q51) {
                const qi_block_q5_1 *b = (const qi_block_q5_1 *)row + i;
                unpack_q5(b->qs, b->qh, q);
                scale[i] = qi_fp16_to_f32(b->d);
                min[i] = qi_fp16_to_f32(b->m);
            } else {
                const qi_block_q5_0 *b = (const qi_block_q5_0 *)row + i;
                unpack_q5(b->qs, b->qh, q);
                scale[i] = qi_fp16_to_f32(b->d);
                min[i] = 0.0f;
            }
            for (int j = 0; j < QI_QK; j++) code[QI_QK * i + j] = (int8_t)(q[j] - (q51 ? 0 : 16));
        }
        return true;
    }
    case QI_TYPE_Q8_0:
        for (int64_t i = 0; i < n / QI_QK; i++) {
            const qi_block_q8_0 *b = (const qi_block_q8_0 *)row + i;
            memcpy(code + QI_QK * i, b->qs, QI_QK);
            scale[i] = qi_fp16_to_f32(b->d);
            min[i] = 0.0f;
        }
        return true;
    case QI_TYPE_Q4_K:
    case QI_TYPE_Q5_K:
        for (int64_t i = 0; i < n / QI_QK_K; i++) {
            uint8_t q[QI_QK_K];
            const uint8_t *scales;
            uint16_t d16, dmin16;
            if (type == QI_TYPE_Q4_K) {
                const qi_block_q4_K *b = (const qi_block_q4_K *)row + i;
                unpack_q4_K(b, q);
                scales = b->scales, d16 = b->d, dmin16 = b->dmin;
            } else {
                const qi_block_q5_K *b = (const qi_block_q5_K *)row + i;
                unpack_q5_K(b, q);
                scales = b->scales, d16 = b->d, dmin16 = b->dmin;
            }
            /* as dequantize_k_asym: x = (d*sc) * q - (dmin*mn) */
            const float d = qi_fp16_to_f32(d16), dmin = qi_fp16_to_f32(dmin16);
            for (int b = 0; b < 8; b++) {
                uint8_t sc, mn;
                qi_k_scale_min(scales, b, &sc, &mn);
                scale[8 * i + b] = d * (float)sc;
                min[8 * i + b] = -(dmin * (float)mn);
            }
            for (int k = 0; k < QI_QK_K; k++) code[QI_QK_K * i + k] = (int8_t)q[k];
        }
        return true;
    case QI_TYPE_Q6_K:
        for (int64_t i = 0; i < n / QI_QK_K; i++) {
            const qi_block_q6_K *b = (const qi_block_q6_K *)row + i;
            unpack_q6_K(b, code + QI_QK_K * i);
            /* as dequantize_q6_K: x = (d * sc) * (q - 32) */
            const float d = qi_fp16_to_f32(b->d);
            for (int s = 0; s < QI_QK_K / 16; s++) {
                scale[16 * i + s] = d * (float)b->scales[s];
                min[16 * i + s] = 0.0f;
            }
        }
        return true;
    default: return false;
    }
}

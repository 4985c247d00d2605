/* quant_legacy.c - the reference kernels of the 32-element block formats:
 * Q4_0, Q4_1, Q5_0, Q5_1 (weights) and Q8_0, Q8_1 (their activations).
 *
 * Written in ggml's generic evaluation order, as quant.c explains; quant.c
 * dispatches to these through quant_int.h.
 */
#include <float.h>
#include <math.h>
#include <string.h>

#include "quant_int.h"

/* ---- Q4_0 ------------------------------------------------------------------ */

void qi_quantize_q4_0(const float *x, qi_block_q4_0 *b, int64_t nb) {
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

void qi_dequantize_q4_0(const qi_block_q4_0 *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += QI_QK) {
        const float d = qi_fp16_to_f32(b[i].d);
        for (int j = 0; j < QI_QK / 2; j++) {
            y[j] = (float)((b[i].qs[j] & 0x0f) - 8) * d;
            y[j + QI_QK / 2] = (float)((b[i].qs[j] >> 4) - 8) * d;
        }
    }
}

float qi_dot_q4_0_q8_0(const qi_block_q4_0 *w, const qi_block_q8_0 *a, int64_t nb) {
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

void qi_quantize_q4_1(const float *x, qi_block_q4_1 *b, int64_t nb) {
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

void qi_dequantize_q4_1(const qi_block_q4_1 *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += QI_QK) {
        const float d = qi_fp16_to_f32(b[i].d);
        const float m = qi_fp16_to_f32(b[i].m);
        for (int j = 0; j < QI_QK / 2; j++) {
            y[j] = (float)(b[i].qs[j] & 0x0f) * d + m;
            y[j + QI_QK / 2] = (float)(b[i].qs[j] >> 4) * d + m;
        }
    }
}

float qi_dot_q4_1_q8_1(const qi_block_q4_1 *w, const qi_block_q8_1 *a, int64_t nb) {
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
void qi_unpack_q5(const uint8_t qs[16], const uint8_t qh[4], int q[QI_QK]) {
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

void qi_quantize_q5_0(const float *x, qi_block_q5_0 *b, int64_t nb) {
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

void qi_dequantize_q5_0(const qi_block_q5_0 *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += QI_QK) {
        const float d = qi_fp16_to_f32(b[i].d);
        int q[QI_QK];
        qi_unpack_q5(b[i].qs, b[i].qh, q);
        for (int j = 0; j < QI_QK; j++) y[j] = (float)(q[j] - 16) * d;
    }
}

float qi_dot_q5_0_q8_0(const qi_block_q5_0 *w, const qi_block_q8_0 *a, int64_t nb) {
    float sum = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int q[QI_QK], s = 0;
        qi_unpack_q5(w[i].qs, w[i].qh, q);
        for (int j = 0; j < QI_QK; j++) s += (q[j] - 16) * a[i].qs[j];
        sum += (qi_fp16_to_f32(w[i].d) * qi_fp16_to_f32(a[i].d)) * (float)s;
    }
    return sum;
}

void qi_quantize_q5_1(const float *x, qi_block_q5_1 *b, int64_t nb) {
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

void qi_dequantize_q5_1(const qi_block_q5_1 *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += QI_QK) {
        const float d = qi_fp16_to_f32(b[i].d);
        const float m = qi_fp16_to_f32(b[i].m);
        int q[QI_QK];
        qi_unpack_q5(b[i].qs, b[i].qh, q);
        for (int j = 0; j < QI_QK; j++) y[j] = (float)q[j] * d + m;
    }
}

float qi_dot_q5_1_q8_1(const qi_block_q5_1 *w, const qi_block_q8_1 *a, int64_t nb) {
    float sum = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int q[QI_QK], s = 0;
        qi_unpack_q5(w[i].qs, w[i].qh, q);
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

void qi_quantize_q8_0(const float *x, qi_block_q8_0 *b, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += QI_QK)
        b[i].d = qi_f32_to_fp16(quantize_q8_block(x, b[i].qs));
}

void qi_quantize_q8_1(const float *x, qi_block_q8_1 *b, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += QI_QK) {
        const float d = quantize_q8_block(x, b[i].qs);
        int s = 0;
        for (int j = 0; j < QI_QK; j++) s += b[i].qs[j];
        b[i].d = qi_f32_to_fp16(d);
        b[i].s = qi_f32_to_fp16((float)s * d);
    }
}

void qi_dequantize_q8_0(const qi_block_q8_0 *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += QI_QK) {
        const float d = qi_fp16_to_f32(b[i].d);
        for (int j = 0; j < QI_QK; j++) y[j] = (float)b[i].qs[j] * d;
    }
}

/* ggml has no Q8_1 dequantizer; this is the obvious one, q * d. */
void qi_dequantize_q8_1(const qi_block_q8_1 *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += QI_QK) {
        const float d = qi_fp16_to_f32(b[i].d);
        for (int j = 0; j < QI_QK; j++) y[j] = (float)b[i].qs[j] * d;
    }
}

float qi_dot_q8_0_q8_0(const qi_block_q8_0 *w, const qi_block_q8_0 *a, int64_t nb) {
    float sum = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int s = 0;
        for (int j = 0; j < QI_QK; j++) s += w[i].qs[j] * a[i].qs[j];
        sum += (float)s * (qi_fp16_to_f32(w[i].d) * qi_fp16_to_f32(a[i].d));
    }
    return sum;
}

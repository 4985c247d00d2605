/* quant_k.c - the reference kernels of the K-quants: Q4_K, Q5_K, Q6_K
 * (weights) and Q8_K (their activations), 256-element super-blocks.
 *
 * Written in ggml's generic evaluation order, with the 8-lane accumulators of
 * its K dot products kept, as quant.c explains; quant.c dispatches to these
 * through quant_int.h.
 */
#include <float.h>
#include <math.h>
#include <string.h>

#include "quant_int.h"

/* Round to nearest, ties to even, for |v| < 2^22. Adding 1.5 * 2^23 moves v
 * into the binade where floats are exactly the integers, so the addition's
 * own rounding does the work and the low mantissa bits hold the result plus
 * 2^22. The same arithmetic as ggml's K-quant helper, so the same answers,
 * including out-of-range garbage, without undefined behaviour. */
static int round_even(float v) {
    uint32_t u = qi_f32_bits(v + 12582912.0f);
    return (int)(u & 0x7fffffu) - 0x400000;
}

static int clampi(int v, int lo, int hi) {
    return v < lo ? lo : v > hi ? hi : v;
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

void qi_quantize_q4_K(const float *x, qi_block_q4_K *b, int64_t nb) {
    uint8_t L[QI_QK_K];
    for (int64_t i = 0; i < nb; i++, x += QI_QK_K) {
        quantize_k_asym(x, 15, -1.0f, 20, &b[i].d, &b[i].dmin, b[i].scales, L);
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++)
                b[i].qs[32 * c + l] = (uint8_t)(L[64 * c + l] | (L[64 * c + 32 + l] << 4));
    }
}

/* Unsigned 4- or 5-bit quants of a Q4_K/Q5_K block in element order. */
void qi_unpack_q4_K(const qi_block_q4_K *b, uint8_t q[QI_QK_K]) {
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) {
            q[64 * c + l] = b->qs[32 * c + l] & 0x0f;
            q[64 * c + 32 + l] = b->qs[32 * c + l] >> 4;
        }
}

void qi_unpack_q5_K(const qi_block_q5_K *b, uint8_t q[QI_QK_K]) {
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

void qi_dequantize_q4_K(const qi_block_q4_K *b, float *y, int64_t nb) {
    uint8_t q[QI_QK_K];
    for (int64_t i = 0; i < nb; i++, y += QI_QK_K) {
        qi_unpack_q4_K(&b[i], q);
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

float qi_dot_q4_K_q8_K(const qi_block_q4_K *w, const qi_block_q8_K *a, int64_t nb) {
    float lanes[8] = {0}, sum = 0.0f;
    uint8_t q[QI_QK_K];
    for (int64_t i = 0; i < nb; i++) {
        qi_unpack_q4_K(&w[i], q);
        dot_k_asym_block(w[i].d, w[i].dmin, w[i].scales, q, &a[i], lanes, &sum);
    }
    for (int l = 0; l < 8; l++) sum += lanes[l];
    return sum;
}

/* ---- Q5_K ------------------------------------------------------------------ */

void qi_quantize_q5_K(const float *x, qi_block_q5_K *b, int64_t nb) {
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

void qi_dequantize_q5_K(const qi_block_q5_K *b, float *y, int64_t nb) {
    uint8_t q[QI_QK_K];
    for (int64_t i = 0; i < nb; i++, y += QI_QK_K) {
        qi_unpack_q5_K(&b[i], q);
        dequantize_k_asym(b[i].d, b[i].dmin, b[i].scales, q, y);
    }
}

float qi_dot_q5_K_q8_K(const qi_block_q5_K *w, const qi_block_q8_K *a, int64_t nb) {
    float lanes[8] = {0}, sum = 0.0f;
    uint8_t q[QI_QK_K];
    for (int64_t i = 0; i < nb; i++) {
        qi_unpack_q5_K(&w[i], q);
        dot_k_asym_block(w[i].d, w[i].dmin, w[i].scales, q, &a[i], lanes, &sum);
    }
    for (int l = 0; l < 8; l++) sum += lanes[l];
    return sum;
}

/* ---- Q6_K ------------------------------------------------------------------ */

void qi_quantize_q6_K(const float *x, qi_block_q6_K *b, int64_t nb) {
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
void qi_unpack_q6_K(const qi_block_q6_K *b, int8_t q[QI_QK_K]) {
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

void qi_dequantize_q6_K(const qi_block_q6_K *b, float *y, int64_t nb) {
    int8_t q[QI_QK_K];
    for (int64_t i = 0; i < nb; i++, y += QI_QK_K) {
        const float d = qi_fp16_to_f32(b[i].d);
        qi_unpack_q6_K(&b[i], q);
        for (int k = 0; k < QI_QK_K; k++)
            y[k] = d * (float)b[i].scales[k / 16] * (float)q[k];
    }
}

float qi_dot_q6_K_q8_K(const qi_block_q6_K *w, const qi_block_q8_K *a, int64_t nb) {
    float lanes[8] = {0}, sum = 0.0f;
    int8_t q[QI_QK_K];
    for (int64_t i = 0; i < nb; i++) {
        qi_unpack_q6_K(&w[i], q);
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

void qi_quantize_q8_K(const float *x, qi_block_q8_K *b, int64_t nb) {
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

void qi_dequantize_q8_K(const qi_block_q8_K *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += QI_QK_K)
        for (int k = 0; k < QI_QK_K; k++) y[k] = b[i].d * (float)b[i].qs[k];
}

/* ---- dispatch -------------------------------------------------------------- */

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
 * format has a dequantizer, a quantizer and (for weight types) a dot product
 * with its activation type: the 32-element formats in quant_legacy.c, the
 * K-quants in quant_k.c (both through quant_int.h). This file holds the
 * scalar conversions, the float formats, and the public functions, which
 * dispatch on type.
 * Considered and rejected: table-driven dispatch with function pointers
 * (harder to read in a file whose job is to be read) and byte-offset access
 * instead of structs (endian-explicit, but the engine is little-endian only
 * and the structs double as documentation for the SIMD kernels).
 */
#include "qinfer/quant.h"

#include <string.h>

#include "qinfer/status.h"
#include "quant_int.h"

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
        return f32_from_bits(sign | qi_f32_bits(mag));
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
    uint32_t x = qi_f32_bits(f);
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
    uint32_t x = qi_f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u);
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
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
    case QI_TYPE_Q4_0: qi_dequantize_q4_0(src, dst, nb); break;
    case QI_TYPE_Q4_1: qi_dequantize_q4_1(src, dst, nb); break;
    case QI_TYPE_Q5_0: qi_dequantize_q5_0(src, dst, nb); break;
    case QI_TYPE_Q5_1: qi_dequantize_q5_1(src, dst, nb); break;
    case QI_TYPE_Q8_0: qi_dequantize_q8_0(src, dst, nb); break;
    case QI_TYPE_Q8_1: qi_dequantize_q8_1(src, dst, nb); break;
    case QI_TYPE_Q4_K: qi_dequantize_q4_K(src, dst, nb); break;
    case QI_TYPE_Q5_K: qi_dequantize_q5_K(src, dst, nb); break;
    case QI_TYPE_Q6_K: qi_dequantize_q6_K(src, dst, nb); break;
    case QI_TYPE_Q8_K: qi_dequantize_q8_K(src, dst, nb); break;
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
    case QI_TYPE_Q4_0: qi_quantize_q4_0(src, dst, nb); break;
    case QI_TYPE_Q4_1: qi_quantize_q4_1(src, dst, nb); break;
    case QI_TYPE_Q5_0: qi_quantize_q5_0(src, dst, nb); break;
    case QI_TYPE_Q5_1: qi_quantize_q5_1(src, dst, nb); break;
    case QI_TYPE_Q8_0: qi_quantize_q8_0(src, dst, nb); break;
    case QI_TYPE_Q8_1: qi_quantize_q8_1(src, dst, nb); break;
    case QI_TYPE_Q4_K: qi_quantize_q4_K(src, dst, nb); break;
    case QI_TYPE_Q5_K: qi_quantize_q5_K(src, dst, nb); break;
    case QI_TYPE_Q6_K: qi_quantize_q6_K(src, dst, nb); break;
    case QI_TYPE_Q8_K: qi_quantize_q8_K(src, dst, nb); break;
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
    case QI_TYPE_Q4_0: return qi_dot_q4_0_q8_0(w, a, nb);
    case QI_TYPE_Q4_1: return qi_dot_q4_1_q8_1(w, a, nb);
    case QI_TYPE_Q5_0: return qi_dot_q5_0_q8_0(w, a, nb);
    case QI_TYPE_Q5_1: return qi_dot_q5_1_q8_1(w, a, nb);
    case QI_TYPE_Q8_0: return qi_dot_q8_0_q8_0(w, a, nb);
    case QI_TYPE_Q4_K: return qi_dot_q4_K_q8_K(w, a, nb);
    case QI_TYPE_Q5_K: return qi_dot_q5_K_q8_K(w, a, nb);
    case QI_TYPE_Q6_K: return qi_dot_q6_K_q8_K(w, a, nb);
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
                qi_unpack_q5(b->qs, b->qh, q);
                scale[i] = qi_fp16_to_f32(b->d);
                min[i] = qi_fp16_to_f32(b->m);
            } else {
                const qi_block_q5_0 *b = (const qi_block_q5_0 *)row + i;
                qi_unpack_q5(b->qs, b->qh, q);
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
                qi_unpack_q4_K(b, q);
                scales = b->scales, d16 = b->d, dmin16 = b->dmin;
            } else {
                const qi_block_q5_K *b = (const qi_block_q5_K *)row + i;
                qi_unpack_q5_K(b, q);
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
            qi_unpack_q6_K(b, code + QI_QK_K * i);
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

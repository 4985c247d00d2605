/* quant_int.h - what quant.c's dispatch shares with the block-format files.
 *
 * quant_legacy.c holds the 32-element formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
 * Q8_1), quant_k.c the 256-element K-quants (Q4_K, Q5_K, Q6_K, Q8_K); quant.c
 * keeps the scalar conversions, the float formats and the public functions
 * that dispatch on type. nb is a count of blocks; layouts are those of
 * qinfer/quant.h. Internal to the engine.
 */
#ifndef QI_QUANT_INT_H
#define QI_QUANT_INT_H

#include <stdint.h>
#include <string.h>

#include "qinfer/quant.h"

/* The bits of a float (the K quantisers' rounding trick, the fp16 code). */
static inline uint32_t qi_f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* ---- the 32-element formats (quant_legacy.c) ---- */
void qi_quantize_q4_0(const float *x, qi_block_q4_0 *b, int64_t nb);
void qi_dequantize_q4_0(const qi_block_q4_0 *b, float *y, int64_t nb);
float qi_dot_q4_0_q8_0(const qi_block_q4_0 *w, const qi_block_q8_0 *a, int64_t nb);
void qi_quantize_q4_1(const float *x, qi_block_q4_1 *b, int64_t nb);
void qi_dequantize_q4_1(const qi_block_q4_1 *b, float *y, int64_t nb);
float qi_dot_q4_1_q8_1(const qi_block_q4_1 *w, const qi_block_q8_1 *a, int64_t nb);
void qi_unpack_q5(const uint8_t qs[16], const uint8_t qh[4], int q[QI_QK]);
void qi_quantize_q5_0(const float *x, qi_block_q5_0 *b, int64_t nb);
void qi_dequantize_q5_0(const qi_block_q5_0 *b, float *y, int64_t nb);
float qi_dot_q5_0_q8_0(const qi_block_q5_0 *w, const qi_block_q8_0 *a, int64_t nb);
void qi_quantize_q5_1(const float *x, qi_block_q5_1 *b, int64_t nb);
void qi_dequantize_q5_1(const qi_block_q5_1 *b, float *y, int64_t nb);
float qi_dot_q5_1_q8_1(const qi_block_q5_1 *w, const qi_block_q8_1 *a, int64_t nb);
void qi_quantize_q8_0(const float *x, qi_block_q8_0 *b, int64_t nb);
void qi_quantize_q8_1(const float *x, qi_block_q8_1 *b, int64_t nb);
void qi_dequantize_q8_0(const qi_block_q8_0 *b, float *y, int64_t nb);
void qi_dequantize_q8_1(const qi_block_q8_1 *b, float *y, int64_t nb);
float qi_dot_q8_0_q8_0(const qi_block_q8_0 *w, const qi_block_q8_0 *a, int64_t nb);

/* ---- the K-quants (quant_k.c) ---- */
void qi_quantize_q4_K(const float *x, qi_block_q4_K *b, int64_t nb);
void qi_unpack_q4_K(const qi_block_q4_K *b, uint8_t q[QI_QK_K]);
void qi_unpack_q5_K(const qi_block_q5_K *b, uint8_t q[QI_QK_K]);
void qi_dequantize_q4_K(const qi_block_q4_K *b, float *y, int64_t nb);
float qi_dot_q4_K_q8_K(const qi_block_q4_K *w, const qi_block_q8_K *a, int64_t nb);
void qi_quantize_q5_K(const float *x, qi_block_q5_K *b, int64_t nb);
void qi_dequantize_q5_K(const qi_block_q5_K *b, float *y, int64_t nb);
float qi_dot_q5_K_q8_K(const qi_block_q5_K *w, const qi_block_q8_K *a, int64_t nb);
void qi_quantize_q6_K(const float *x, qi_block_q6_K *b, int64_t nb);
void qi_unpack_q6_K(const qi_block_q6_K *b, int8_t q[QI_QK_K]);
void qi_dequantize_q6_K(const qi_block_q6_K *b, float *y, int64_t nb);
float qi_dot_q6_K_q8_K(const qi_block_q6_K *w, const qi_block_q8_K *a, int64_t nb);
void qi_quantize_q8_K(const float *x, qi_block_q8_K *b, int64_t nb);
void qi_dequantize_q8_K(const qi_block_q8_K *b, float *y, int64_t nb);

#endif

/* quant.h - block formats and their plain-C reference kernels.
 *
 * These functions are the specification the SIMD and GPU kernels are tested
 * against: byte layouts, rounding and the order of floating-point operations
 * follow ggml (llama.cpp) so that a model quantised here or there is the same
 * bytes, and a dot product computed here is what ggml's generic (non-SIMD)
 * CPU code computes.
 *
 * Supported types (qi_quant_supported): F32, F16, BF16, Q4_0, Q4_1, Q5_0,
 * Q5_1, Q8_0, Q8_1, Q4_K, Q5_K, Q6_K, Q8_K. Weight types (qi_type_can_dot)
 * are those minus the activation-only Q8_1 and Q8_K.
 *
 * The block structs below describe the bytes of one block on a little-endian
 * host (the engine assumes one; quant.c checks at compile time). fp16 and
 * bf16 fields are stored as raw uint16_t bit patterns. Rows handed to these
 * functions must be aligned for their block struct (2 bytes; 4 for Q8_K),
 * which GGUF's 32-byte tensor alignment and malloc both give.
 *
 * Passing an unsupported type, or an n that is not a multiple of the type's
 * block size, is a programmer error (QI_ASSERT): check with
 * qi_quant_supported()/qi_type_row_bytes() before calling with file data.
 * Non-finite inputs to the quantizers give unspecified block contents (as in
 * ggml) but never touch memory outside the row.
 */
#ifndef QINFER_QUANT_H
#define QINFER_QUANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "qinfer/types.h"

#define QI_QK 32   /* elements per block of the Q4_0..Q8_1 formats */
#define QI_QK_K 256 /* elements per super-block of the K formats */

/* Q4_0, 18 bytes: x = d * (q - 8), q in [0, 15]. Byte j of qs holds element
 * j in its low nibble and element j + 16 in its high nibble. */
typedef struct {
    uint16_t d;          /* fp16 scale */
    uint8_t qs[QI_QK / 2];
} qi_block_q4_0;

/* Q4_1, 20 bytes: x = d * q + m, q in [0, 15], nibbles as in Q4_0. */
typedef struct {
    uint16_t d;          /* fp16 scale */
    uint16_t m;          /* fp16 offset (the block minimum) */
    uint8_t qs[QI_QK / 2];
} qi_block_q4_1;

/* Q5_0, 22 bytes: x = d * (q - 16), q in [0, 31]. Low 4 bits as Q4_0's
 * nibbles; bit j of the little-endian uint32 in qh is bit 4 of element j. */
typedef struct {
    uint16_t d;          /* fp16 scale */
    uint8_t qh[4];       /* fifth bits, element j at bit j */
    uint8_t qs[QI_QK / 2];
} qi_block_q5_0;

/* Q5_1, 24 bytes: x = d * q + m, q in [0, 31], bits as in Q5_0. */
typedef struct {
    uint16_t d;          /* fp16 scale */
    uint16_t m;          /* fp16 offset */
    uint8_t qh[4];
    uint8_t qs[QI_QK / 2];
} qi_block_q5_1;

/* Q8_0, 34 bytes: x = d * q, q in [-127, 127]. */
typedef struct {
    uint16_t d;          /* fp16 scale */
    int8_t qs[QI_QK];
} qi_block_q8_0;

/* Q8_1, 36 bytes: Q8_0 plus s = fp16(d * sum(q)), which lets the Q4_1/Q5_1
 * dot products apply the weight offset with one multiply per block. */
typedef struct {
    uint16_t d;          /* fp16 scale */
    uint16_t s;          /* fp16 d * sum(qs), d taken before its fp16 rounding */
    int8_t qs[QI_QK];
} qi_block_q8_1;

/* Q4_K, 144 bytes: 8 sub-blocks of 32; sub-block b has a 6-bit scale sc[b]
 * and 6-bit min mn[b] packed in `scales` (see qi_k_scale_min), and
 * x = d*sc[b]*q - dmin*mn[b], q in [0, 15]. qs is four 32-byte chunks; chunk
 * c holds sub-block 2c in low nibbles and 2c+1 in high nibbles. */
typedef struct {
    uint16_t d;          /* fp16 super-scale of the sub-block scales */
    uint16_t dmin;       /* fp16 super-scale of the sub-block mins */
    uint8_t scales[12];
    uint8_t qs[QI_QK_K / 2];
} qi_block_q4_K;

/* Q5_K, 176 bytes: Q4_K plus a fifth bit per element, q in [0, 31]. Element
 * l (0..31) of sub-block b has its fifth bit at bit b of qh[l]. */
typedef struct {
    uint16_t d;
    uint16_t dmin;
    uint8_t scales[12];
    uint8_t qh[QI_QK_K / 8];
    uint8_t qs[QI_QK_K / 2];
} qi_block_q5_K;

/* Q6_K, 210 bytes: 16 sub-blocks of 16 with signed 8-bit scales,
 * x = d * scales[b] * (q - 32), q in [0, 63]. Each 128-element half h uses
 * ql[64h..64h+63] and qh[32h..32h+31]: for l in 0..31, element l is
 * (low nibble of ql[l], bits 0-1 of qh[l]), element l+32 is (low nibble of
 * ql[l+32], bits 2-3), element l+64 is (high nibble of ql[l], bits 4-5),
 * element l+96 is (high nibble of ql[l+32], bits 6-7). */
typedef struct {
    uint8_t ql[QI_QK_K / 2];  /* low 4 bits */
    uint8_t qh[QI_QK_K / 4];  /* high 2 bits */
    int8_t scales[QI_QK_K / 16];
    uint16_t d;               /* fp16 super-scale */
} qi_block_q6_K;

/* Q8_K, 292 bytes (activations only): x = d * q with a float d, plus the
 * sums of each 16 quants, which the K dot products use for the min term. */
typedef struct {
    float d;
    int8_t qs[QI_QK_K];
    int16_t bsums[QI_QK_K / 16];
} qi_block_q8_K;

/* fp16 <-> f32. qi_fp16_to_f32 is exact (a NaN comes back quiet with its
 * payload); qi_f32_to_fp16 rounds to nearest, ties to even, overflows to
 * infinity and maps every NaN to the quiet NaN 0x7e00 with the input's sign,
 * bit for bit as ggml's portable conversion. */
float qi_fp16_to_f32(uint16_t h);
uint16_t qi_f32_to_fp16(float f);

/* bf16 <-> f32. qi_f32_to_bf16 rounds to nearest even; a NaN keeps its top
 * bits and is forced quiet (bit 6 set), as ggml. */
float qi_bf16_to_f32(uint16_t h);
uint16_t qi_f32_to_bf16(float f);

/* True for the types the functions below accept. */
bool qi_quant_supported(uint32_t type);

/* True for weight types qi_vec_dot_ref accepts (F32, F16, BF16, Q4_0, Q4_1,
 * Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K). */
bool qi_type_can_dot(uint32_t type);

/* The activation type ggml's CPU backend pairs with weight type `type`
 * (F32/F16/BF16 with themselves; Q4_0, Q5_0, Q8_0 with Q8_0; Q4_1, Q5_1
 * with Q8_1; the K types with Q8_K). QI_TYPE_COUNT when !qi_type_can_dot. */
uint32_t qi_vec_dot_type(uint32_t type);

/* Bytes of a row of n elements of `type`; 0 when the type is unknown or n is
 * not a non-negative multiple of its block size. */
size_t qi_row_bytes(uint32_t type, int64_t n);

/* Decode n elements (a multiple of the block size) of `src` into dst[n]. */
void qi_dequantize_row_ref(uint32_t type, const void *src, float *dst, int64_t n);

/* Encode src[n] into qi_row_bytes(type, n) bytes at dst, identical to ggml's
 * quantize_row_<type>_ref (for Q8_K the bsums of an all-zero block are
 * written as zero; ggml leaves them unwritten). */
void qi_quantize_row_ref(uint32_t type, const float *src, void *dst, int64_t n);

/* Dot product of weight row `w` (type `type`, n elements) with activation
 * row `a` already in qi_vec_dot_type(type), computed as ggml's generic
 * vec_dot: integer sums per block scaled in float, block results summed in
 * float in block order (the K types keep 8 float partial sums, one per
 * element index mod 8, added at the end); F32/F16/BF16 sum float products in
 * double. */
float qi_vec_dot_ref(uint32_t type, int64_t n, const void *w, const void *a);

/* The 6-bit scale and min of sub-block b (0..7) of a Q4_K/Q5_K block. */
void qi_k_scale_min(const uint8_t scales[12], int b, uint8_t *sc, uint8_t *mn);

/* Integer codes of a weight row, for the sparse kernels' column form
 * (engine/kernels/sparse.h): element k of a row is exactly
 *   scale[k / G] * code[k] + min[k / G]      (G = qi_code_group(type))
 * in float arithmetic, the product rounded before the sum; min is 0 for the
 * symmetric types (the result then equals qi_dequantize_row_ref's but for
 * the sign of a zero). Codes: Q4_0 q - 8, Q5_0 q - 16, Q6_K q - 32, the
 * others' quants as they are (Q8_0 signed). G is 32, 16 for Q6_K; 0 for
 * types without codes (F32, F16, BF16, Q8_1, Q8_K, unknown).
 * qi_code_bits: 4 when every code + qi_code_bias(type) fits a nibble (Q4_0,
 * Q4_1, Q4_K), else 8. qi_row_codes fills code[n], scale[n / G], min[n / G]
 * and returns false for a type without codes or a bad n. */
int qi_code_group(uint32_t type);
int qi_code_bits(uint32_t type);
int qi_code_bias(uint32_t type);
bool qi_row_codes(uint32_t type, const void *row, int64_t n, int8_t *code, float *scale, float *min);

#endif

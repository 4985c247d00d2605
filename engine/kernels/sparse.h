/* sparse.h - matmuls whose input is mostly zero (activation sparsity).
 *
 * y = W x skips the columns of W where x is zero. Quantised matrices are
 * stored by rows (the output dimension), a block of 32 inputs sharing one
 * scale, so a zero input saves nothing there: a block is read whenever one
 * of its 32 inputs is not zero. The column form turns a matrix round:
 *
 *   codes   column j's n_out integer codes one after another (4 bits for
 *           Q4_0, Q4_1, Q4_K; 8 bits for Q5_0, Q5_1, Q5_K, Q6_K, Q8_0), so
 *           a zero input is a column not read;
 *   scale,  per group g of G consecutive columns (G = qi_code_group: 32, 16
 *   min     for Q6_K) and row i, the row's scale and offset there,
 *           [n_in / G][n_out] floats, held as fp16 where every one of
 *           the matrix's is exactly an fp16 value (the legacy types', whose
 *           blocks store them so): the same floats in half the bytes, a
 *           quarter of what a q4_1 product reads with every input active;
 *
 * with W[i][j] = scale[g][i] * code[j][i] + min[g][i] exactly
 * (qi_row_codes): the same matrix, no requantisation. 4-bit columns hold
 * rows in chunks of 32, byte k of a chunk carrying row 32c + k in its low
 * nibble and row 32c + 16 + k in its high one (stored as code + bias,
 * qi_code_bias). n_out must be a multiple of 32.
 *
 * The product, for the active input columns idx[0 .. n_idx) (ascending),
 * per row i and token t:
 *
 *   y[t][i] = 0
 *   for each group g holding active columns, ascending:
 *       acc = 0, sx = 0
 *       for each active column j of g with x[t][j] != 0, ascending:
 *           acc = fma(x[t][j], code[j][i], acc);  sx = sx + x[t][j]
 *       y[t][i] = fma(scale[g][i], acc, y[t][i])
 *       y[t][i] = fma(min[g][i], sx, y[t][i])      (types with an offset)
 *
 * in float. This is the whole contract: qi_sparse_matmul_ref is it in
 * plain C, and the SIMD versions compute the same operations per row, so
 * the two agree bit for bit (tests/unit/test_sparse.c). It is not the dense
 * matmul's arithmetic (that quantises x to 8 bits and sums in llama.cpp's
 * order): a sparse run is exact only against itself; with nothing to skip
 * the engine takes the dense path. Cost: the active columns' codes, plus
 * the scales of every group holding one.
 */
#ifndef QI_SPARSE_H
#define QI_SPARSE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "qinfer/model.h"
#include "qinfer/status.h"

typedef struct {
    uint32_t type;         /* the matrix's weight type */
    int64_t n_in, n_out;   /* columns (inputs) and rows (outputs) */
    int group, bits, bias; /* qi_code_group, qi_code_bits, qi_code_bias */
    size_t col_bytes;      /* bytes of one column's codes */
    uint8_t *codes;        /* [n_in][col_bytes] */
    float *scale;          /* [n_in / group][n_out], or NULL where scale_h holds them */
    float *min;            /* the same, or NULL (no offsets, or min_h holds them) */
    uint16_t *scale_h;     /* the scales as fp16 where all are exact in it, else NULL */
    uint16_t *min_h;       /* the offsets so, with scale_h, for types with offsets */
} qi_colw;

/* Whether w can be turned round: a type with codes and n_rows % 32 == 0. */
bool qi_colw_supported(const qi_weight *w);
/* The column form of w (host memory, qi_colw_free). QI_ERR_UNSUPPORTED for
 * a matrix qi_colw_supported refuses, QI_ERR_NOMEM. */
qi_status qi_colw_build(const qi_weight *w, qi_colw *out, qi_err *err);
/* Columns [j0, j0 + n) of c made again from w, the matrix c was built
 * from with those columns' bytes changed since (a neuron swap puts another
 * neuron's blocks there): whole blocks of w's type. QI_ERR_INVALID for
 * another type or shape or columns not whole blocks inside it,
 * QI_ERR_NOMEM. Afterwards c is w's column form: qi_colw_same as one
 * qi_colw_build makes (its scales turned back to floats if the new ones
 * are not all exact in fp16). */
qi_status qi_colw_update(qi_colw *c, const qi_weight *w, int64_t j0, int64_t n, qi_err *err);
/* The same matrix: codes byte for byte, and every scale and offset the
 * same float, whichever way each form holds them. */
bool qi_colw_same(const qi_colw *a, const qi_colw *b);
void qi_colw_free(qi_colw *c);
/* Bytes it holds. */
size_t qi_colw_bytes(const qi_colw *c);
/* W[i][j] from the column form (for tests). */
float qi_colw_value(const qi_colw *c, int64_t i, int64_t j);

/* Rows [r0, r1) of the product above (r0 a multiple of 32; r1 too, or
 * n_out), for T tokens: x[t * x_stride + j], y[t * y_stride + i]. */
typedef void (*qi_sparse_fn)(const qi_colw *w, const float *x, size_t x_stride, int T, const int32_t *idx,
                             int n_idx, float *y, size_t y_stride, int64_t r0, int64_t r1);
void qi_sparse_matmul_ref(const qi_colw *w, const float *x, size_t x_stride, int T, const int32_t *idx, int n_idx,
                          float *y, size_t y_stride, int64_t r0, int64_t r1);
/* The AVX2 version, NULL when the CPU lacks AVX2/FMA. */
qi_sparse_fn qi_sparse_matmul_avx2(void);
/* The AVX-512 version, NULL when the CPU lacks AVX-512F (or AVX2/FMA). */
qi_sparse_fn qi_sparse_matmul_avx512(void);
/* The fastest available (the reference when QI_FORCE_REF=1). */
qi_sparse_fn qi_sparse_matmul(void);

/* The active columns of T rows of x (x[t * x_stride + j], j < n): the
 * ascending j where some row is not zero (the union over the batch), into
 * idx; returns their count. */
int qi_sparse_active(const float *x, size_t x_stride, int T, int64_t n, int32_t *idx);

/* x[t * x_stride + j] zeroed where |x| <= thr (thr >= 0; NaN is kept),
 * then qi_sparse_active's list of the columns left, into idx; returns
 * their count and adds the elements zeroed to *n_zeroed. */
int qi_sparse_threshold(float *x, size_t x_stride, int T, int64_t n, float thr, int32_t *idx, long *n_zeroed);

#endif

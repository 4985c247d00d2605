/* kernels_test.h - the parts of test_kernels (see test_kernels.c): what util.c shares and
 * what each part adds to the suite. */
#ifndef QI_KERNELS_TEST_H
#define QI_KERNELS_TEST_H

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "kernels.h"
#include "qinfer/quant.h"
#include "quant_act.h"
#include "testutil.h"

#define GOLDEN_PATH QI_SOURCE_DIR "/tests/golden/quant/quant_golden.txt"
#define N_DOT_TYPES (int)(sizeof k_dot_types / sizeof k_dot_types[0])

/* util.c */
extern const uint32_t k_dot_types[7]; /* the block formats with dot kernels */
uint32_t f32_bits(float f);
int same_float(float a, float b);
long first_diff(const float *a, const float *b, long n);
int simd_tables(const qi_kernels *out[2]);
float randn(uint64_t *s);
void fill_row(uint64_t *s, float *x, int64_t n, int kind);

void kernels_gemm_add(TCase *golden, TCase *variants); /* block dots and packed weights: the SIMD matmuls against the reference, and the activation quantiser. */
void kernels_attn_add(TCase *variants, TCase *numerics); /* attention and element-wise kernels: the SIMD variants against the reference, and their numerics. */

#endif

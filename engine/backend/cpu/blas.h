/* blas.h - OpenBLAS, loaded at run time for the opt-in attention path.
 *
 * The engine neither includes OpenBLAS's headers nor links it: the library
 * is dlopen'ed the first time something asks for it, so qinfer builds and
 * runs where OpenBLAS is absent, and only the attn_blas option needs it.
 */
#ifndef QI_BLAS_H
#define QI_BLAS_H

#include <stdbool.h>

#include "qinfer/status.h"

/* Load OpenBLAS once per process (libopenblas.so.0, else libopenblas.so; the
 * environment variable QI_OPENBLAS_LIB names another file instead) and set
 * it to one thread. Thread-safe; later calls return the first call's result.
 * Failure: QI_ERR_UNSUPPORTED with the loader's message. */
qi_status qi_blas_load(qi_err *err);

/* Row-major C[M][N] = alpha A[M][K] . op(B), op(B) = B[K][N] or, with
 * trans_b, B[N][K] transposed; lda, ldb, ldc in elements. Only after
 * qi_blas_load succeeded; safe to call from several threads at once. */
void qi_blas_sgemm(bool trans_b, int M, int N, int K, float alpha, const float *A, int lda, const float *B, int ldb,
                   float *C, int ldc);

/* The core OpenBLAS chose ("SkylakeX", "Prescott"), or "" when not loaded or
 * the library does not say. */
const char *qi_blas_core(void);

#endif

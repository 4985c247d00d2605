/* cublas_v2.h (host emulation; see cuda_runtime.h here) - the two cuBLAS
 * calls k_matmul.cu makes, as a plain host GEMM with cuBLAS's meaning:
 * column-major matrices, op(A) m x k and op(B) k x n from their
 * transposition flags and leading dimensions, C = alpha op(A) op(B) +
 * beta C with C m x n at ldc (C not read when beta is 0). fp16 inputs are
 * widened exactly; every product is formed and summed in fp32, in order
 * of k. The arguments are checked as cuBLAS does (a leading dimension
 * shorter than its matrix's rows is CUBLAS_STATUS_INVALID_VALUE), and
 * each call is counted in emu_gemm_calls so a test can see the tiles. */
#pragma once
#include <stdint.h>

#include "cuda_fp16.h"
#include "cuda_runtime.h"

typedef void *cublasHandle_t;
typedef enum {
    CUBLAS_STATUS_SUCCESS = 0,
    CUBLAS_STATUS_NOT_INITIALIZED = 1,
    CUBLAS_STATUS_INVALID_VALUE = 7,
    CUBLAS_STATUS_NOT_SUPPORTED = 15
} cublasStatus_t;
typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 } cublasOperation_t;
typedef enum { CUDA_R_32F = 0, CUDA_R_16F = 2 } cudaDataType;
typedef enum { CUBLAS_COMPUTE_32F = 68 } cublasComputeType_t;
typedef enum { CUBLAS_GEMM_DEFAULT = -1 } cublasGemmAlgo_t;

extern long emu_gemm_calls; /* emu.cpp */

/* element (i, j) of op(M), M column-major with leading dimension ld */
static inline float emu_gemm_at(const void *m, cudaDataType t, int ld, cublasOperation_t op, int i, int j) {
    const int64_t at = op == CUBLAS_OP_N ? (int64_t)i + (int64_t)j * ld : (int64_t)j + (int64_t)i * ld;
    return t == CUDA_R_16F ? emu_h2f(((const __half *)m)[at].u) : ((const float *)m)[at];
}

static inline cublasStatus_t emu_gemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                                      int k, float alpha, const void *A, cudaDataType at, int lda, const void *B,
                                      cudaDataType bt, int ldb, float beta, float *C, int ldc) {
    emu_gemm_calls++;
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    const int ra = ta == CUBLAS_OP_N ? m : k, rb = tb == CUBLAS_OP_N ? k : n;
    if (m < 0 || n < 0 || k < 0 || lda < (ra > 1 ? ra : 1) || ldb < (rb > 1 ? rb : 1) || ldc < (m > 1 ? m : 1))
        return CUBLAS_STATUS_INVALID_VALUE;
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            float s = 0.0f;
            for (int l = 0; l < k; l++) s += emu_gemm_at(A, at, lda, ta, i, l) * emu_gemm_at(B, bt, ldb, tb, l, j);
            float *c = C + i + (int64_t)j * ldc;
            *c = beta == 0.0f ? alpha * s : alpha * s + beta * *c;
        }
    return CUBLAS_STATUS_SUCCESS;
}

static inline cublasStatus_t cublasSgemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                                         int k, const float *alpha, const float *A, int lda, const float *B, int ldb,
                                         const float *beta, float *C, int ldc) {
    return emu_gemm(h, ta, tb, m, n, k, *alpha, A, CUDA_R_32F, lda, B, CUDA_R_32F, ldb, *beta, C, ldc);
}

/* only the combination k_matmul.cu uses: fp16 or fp32 A and B, fp32 C,
 * fp32 compute */
static inline cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                                          int k, const void *alpha, const void *A, cudaDataType at, int lda,
                                          const void *B, cudaDataType bt, int ldb, const void *beta, void *C,
                                          cudaDataType ct, int ldc, cublasComputeType_t comp, cublasGemmAlgo_t algo) {
    (void)algo;
    if (ct != CUDA_R_32F || comp != CUBLAS_COMPUTE_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
    return emu_gemm(h, ta, tb, m, n, k, *(const float *)alpha, A, at, lda, B, bt, ldb, *(const float *)beta,
                    (float *)C, ldc);
}

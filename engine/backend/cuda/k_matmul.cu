/* k_matmul.cu - y[T][n_rows] = x[T][n_cols] . W^T for the weight formats
 * of dequant.cuh, and get_rows.
 *
 * Two paths, by the number of tokens:
 * - decode (T <= MV_MAX_T): a matrix-vector kernel reading each weight row
 *   once for all T tokens. One warp per row; lane l takes the row's 8-element
 *   groups l, l + 32, ..., so a warp's loads cover consecutive bytes of the
 *   row (several blocks of a Q4_0 row, one super-block of a Q4_K row) and
 *   the activations it reads are consecutive float4s. fp32 activations and
 *   accumulation, a shuffle reduction per token at the end. The format is a
 *   template parameter, so the inner loop has no branch on it.
 * - prefill (more tokens): W is dequantised to fp16 in tiles of rows inside
 *   the scratch, x converted to fp16 once, and each tile multiplied by
 *   cublasGemmEx (fp16 inputs, fp32 accumulation and output); F32 weights go
 *   to cublasSgemm as they are.
 *
 * Considered and not done (yet): int8 activations with dp4a for the decode
 * kernel (fewer instructions per weight, the way to stay bandwidth-bound on
 * the largest GPUs; fp32 keeps this first version simple and matches the
 * reference more closely), and a fused dequantising GEMM instead of the
 * fp16 tiles (cuBLAS's tensor-core GEMM is hard to beat and the tiles cost
 * one extra pass over W per call, small against T > 8 tokens of work).
 *
 * The GEMM path rounds activations and weights to fp16: a weight element
 * keeps 11 significant bits (a Q4_0 element d*(q-8) may need 15, so it
 * rounds), and an activation beyond fp16's range (|x| > 65504) becomes
 * infinite. bf16 would not overflow but keeps only 8 bits; models known to
 * have such activations want the fp32 path (T <= 8 per call) or an fp32
 * GEMM, which this file does not offer yet.
 *
 * cuBLAS is column-major: row-major W [n_rows][n_cols] is a column-major
 * n_cols x n_rows matrix, x [T][n_cols] is n_cols x T and y [T][n_rows] is
 * n_rows x T, so y = op(W) x with op = transpose, m = rows, n = T,
 * k = n_cols.
 */
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <limits.h>
#include <stdint.h>

#include "dequant.cuh"
#include "k_internal.h"

#define MV_MAX_T 8        /* the most tokens the matrix-vector kernel takes at once */
#define MV_WARPS 4        /* rows (warps) per matrix-vector block */
#define EW_THREADS 256    /* threads per block of the element-wise kernels */
#define EW_MAX_BLOCKS 65535
#define TILE_BYTES ((size_t)64 << 20) /* the fp16 weight tile of the GEMM path */
#define SCRATCH_ALIGN 256

static size_t align_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

/* Bytes of x in fp16 at the front of the scratch */
static size_t x16_bytes(int64_t T, int64_t n_cols) {
    return align_up((size_t)T * (size_t)n_cols * sizeof(__half), SCRATCH_ALIGN);
}

/* Blocks for a grid-stride loop over n items */
static unsigned ew_blocks(int64_t n) {
    const int64_t b = (n + EW_THREADS - 1) / EW_THREADS;
    return (unsigned)(b < 1 ? 1 : b > EW_MAX_BLOCKS ? EW_MAX_BLOCKS : b);
}

/* The error of the launch just queued, with its name */
static int launched(const char *name, const char **what) {
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess && what) *what = name;
    return (int)e;
}

static int fail(int code, const char *name, const char **what) {
    if (what) *what = name;
    return code;
}

/* ---- kernels --------------------------------------------------------------- */

/* One warp per row: y[t][row] = W[row] . x[t] for t < T (T <= NT) */
template <class TT, int NT>
__global__ void __launch_bounds__(MV_WARPS * 32)
    k_matvec(const uint8_t *__restrict__ w, int64_t n_rows, int n_groups, uint64_t row_bytes,
             const float *__restrict__ x, int64_t n_cols, int T, float *__restrict__ y) {
    const int lane = threadIdx.x & 31;
    const int64_t row = (int64_t)blockIdx.x * MV_WARPS + (threadIdx.x >> 5);
    if (row >= n_rows) return; /* whole warps leave: the shuffles below stay full */
    const uint8_t *wr = w + (uint64_t)row * row_bytes;
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = 0.0f;
    /* unrolled so a warp has several groups' loads in flight; with more
     * tokens each group already carries more loads and registers, so less
     * (deeper unrolls of the 2-8 token kernels made ptxas spill) */
#pragma unroll(NT == 1 ? 4 : NT <= 4 ? 2 : 1)
    for (int i = lane; i < n_groups; i += 32) qd_group_dot<TT, NT>(wr, i, x, n_cols, T, acc);
#pragma unroll
    for (int t = 0; t < NT; t++) {
        float s = acc[t];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (lane == 0 && t < T) y[(int64_t)t * n_rows + row] = s;
    }
}

/* Rows [0, n) of W (already offset to the tile's first row), n_cols a
 * multiple of 8, to fp16 out[n][n_cols]: one thread per 8-element group,
 * written as one 16-byte store. */
template <class TT>
__global__ void k_dequant_f16(const uint8_t *__restrict__ w, uint64_t row_bytes, int64_t groups_per_row,
                              int64_t n_groups, __half *__restrict__ out) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n_groups;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i / groups_per_row;
        float v[8];
        qd_group_row<TT>(w + (uint64_t)r * row_bytes, (int)(i - r * groups_per_row), v);
        __align__(16) __half h[8];
#pragma unroll
        for (int k = 0; k < 8; k++) h[k] = __float2half_rn(v[k]);
        *(uint4 *)(out + 8 * i) = *(const uint4 *)h;
    }
}

/* The float formats at any width, one element per thread */
template <class TT>
__global__ void k_dequant_f16_any(const uint8_t *__restrict__ w, uint64_t row_bytes, int64_t n_cols, int64_t n,
                                  __half *__restrict__ out) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i / n_cols;
        out[i] = __float2half_rn(TT::elem(w + (uint64_t)r * row_bytes, i - r * n_cols));
    }
}

/* out[t][.] = row ids[t], one thread per 8-element group; vec4: out is
 * 16-byte aligned, so a group is two float4 stores (the same for every
 * thread, so the branch does not diverge). */
template <class TT>
__global__ void k_get_rows(const uint8_t *__restrict__ w, uint64_t row_bytes, int64_t groups_per_row,
                           const int32_t *__restrict__ ids, int64_t n_groups, float *__restrict__ out, bool vec4) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n_groups;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = i / groups_per_row;
        float v[8];
        qd_group_row<TT>(w + (uint64_t)ids[t] * row_bytes, (int)(i - t * groups_per_row), v);
        if (vec4) {
            float4 *o = (float4 *)(out + 8 * i);
            o[0] = make_float4(v[0], v[1], v[2], v[3]);
            o[1] = make_float4(v[4], v[5], v[6], v[7]);
        } else {
#pragma unroll
            for (int k = 0; k < 8; k++) out[8 * i + k] = v[k];
        }
    }
}

/* The float formats at any width, one element per thread */
template <class TT>
__global__ void k_get_rows_any(const uint8_t *__restrict__ w, uint64_t row_bytes, int64_t n_cols,
                               const int32_t *__restrict__ ids, int64_t n, float *__restrict__ out) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = i / n_cols;
        out[i] = TT::elem(w + (uint64_t)ids[t] * row_bytes, i - t * n_cols);
    }
}

__global__ void k_to_f16(const float *__restrict__ x, int64_t n, __half *__restrict__ out) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        out[i] = __float2half_rn(x[i]);
}

/* ---- launch names ---------------------------------------------------------- */

/* Static names per format, for *what */
template <class TT> struct names;
#define QI_NAMES(T_, s)                                                                        \
    template <> struct names<T_> {                                                             \
        static constexpr const char *matvec = "matmul " s " matvec";                          \
        static constexpr const char *dequant = "matmul " s " dequant";                        \
        static constexpr const char *rows = "get_rows " s;                                    \
    };
QI_NAMES(qd_f32, "f32")
QI_NAMES(qd_f16, "f16")
QI_NAMES(qd_bf16, "bf16")
QI_NAMES(qd_q4_0, "q4_0")
QI_NAMES(qd_q4_1, "q4_1")
QI_NAMES(qd_q5_0, "q5_0")
QI_NAMES(qd_q5_1, "q5_1")
QI_NAMES(qd_q8_0, "q8_0")
QI_NAMES(qd_q4_K, "q4_k")
QI_NAMES(qd_q5_K, "q5_k")
QI_NAMES(qd_q6_K, "q6_k")
#undef QI_NAMES

/* ---- host side ------------------------------------------------------------- */

/* Can the group kernels read this W (whole groups, rows aligned for the
 * format's loads)? Only the float formats have another path when not. */
template <class TT>
static bool groups_ok(const void *w, int64_t n_cols, uint64_t row_bytes) {
    return n_cols % TT::QK == 0 && (uintptr_t)w % TT::ALIGN == 0 && row_bytes % TT::ALIGN == 0;
}

/* The matrix-vector kernel over T <= MV_MAX_T tokens, with the token count
 * rounded up to an instantiated one (the kernel skips tokens >= T). */
template <class TT>
static int matvec(const qi_cuk_ctx *c, const void *w, int64_t n_rows, int64_t n_cols, uint64_t row_bytes,
                  const float *x, int T, float *y, const char **what) {
    cudaStream_t s = (cudaStream_t)c->stream;
    const int64_t blocks = (n_rows + MV_WARPS - 1) / MV_WARPS;
    if (blocks > INT_MAX) return fail((int)cudaErrorInvalidValue, names<TT>::matvec, what);
    const dim3 grid((unsigned)blocks), block(MV_WARPS * 32);
    const uint8_t *wb = (const uint8_t *)w;
    const int ng = (int)(n_cols / 8);
    if (T == 1)
        k_matvec<TT, 1><<<grid, block, 0, s>>>(wb, n_rows, ng, row_bytes, x, n_cols, T, y);
    else if (T == 2)
        k_matvec<TT, 2><<<grid, block, 0, s>>>(wb, n_rows, ng, row_bytes, x, n_cols, T, y);
    else if (T <= 4)
        k_matvec<TT, 4><<<grid, block, 0, s>>>(wb, n_rows, ng, row_bytes, x, n_cols, T, y);
    else
        k_matvec<TT, 8><<<grid, block, 0, s>>>(wb, n_rows, ng, row_bytes, x, n_cols, T, y);
    return launched(names<TT>::matvec, what);
}

/* Rows [r0, r0 + n) of W to fp16 at out */
template <class TT>
static int dequant_tile(cudaStream_t s, const uint8_t *w, int64_t r0, int64_t n, int64_t n_cols, uint64_t row_bytes,
                        bool by_group, __half *out, const char **what) {
    const uint8_t *wt = w + (uint64_t)r0 * row_bytes;
    if (by_group) {
        const int64_t ng = n * (n_cols / 8);
        k_dequant_f16<TT><<<ew_blocks(ng), EW_THREADS, 0, s>>>(wt, row_bytes, n_cols / 8, ng, out);
    } else if constexpr (TT::FLOAT) {
        k_dequant_f16_any<TT><<<ew_blocks(n * n_cols), EW_THREADS, 0, s>>>(wt, row_bytes, n_cols, n * n_cols, out);
    } else {
        return fail((int)cudaErrorInvalidValue, names<TT>::dequant, what); /* partial blocks or misaligned rows */
    }
    return launched(names<TT>::dequant, what);
}

/* F32 weights: one SGEMM straight from W (lda = the row stride in floats) */
static int sgemm(const qi_cuk_ctx *c, const void *w, int64_t n_rows, int64_t n_cols, uint64_t row_bytes,
                 const float *x, int T, float *y, const char **what) {
    if (row_bytes % sizeof(float) || n_rows > INT_MAX || n_cols > INT_MAX || row_bytes / sizeof(float) > INT_MAX)
        return fail((int)cudaErrorInvalidValue, "matmul f32 shape", what);
    const float one = 1.0f, zero = 0.0f;
    const cublasStatus_t st =
        cublasSgemm((cublasHandle_t)c->cublas, CUBLAS_OP_T, CUBLAS_OP_N, (int)n_rows, T, (int)n_cols, &one,
                    (const float *)w, (int)(row_bytes / sizeof(float)), x, (int)n_cols, &zero, y, (int)n_rows);
    return st == CUBLAS_STATUS_SUCCESS ? 0 : fail((int)st, "cublasSgemm", what);
}

/* The GEMM path: x to fp16 at the front of the scratch, then per tile of
 * rows: dequantise into the rest of the scratch, one GemmEx into y's rows.
 * Returns -1 (nothing queued) when the scratch cannot hold x and a row. */
template <class TT>
static int gemm_tiles(const qi_cuk_ctx *c, const void *w, int64_t n_rows, int64_t n_cols, uint64_t row_bytes,
                      const float *x, int T, float *y, const char **what) {
    const size_t xb = x16_bytes(T, n_cols);
    const size_t row16 = (size_t)n_cols * sizeof(__half);
    if (!c->scratch || c->scratch_bytes < xb + row16 || n_cols > INT_MAX || n_rows > INT_MAX) return -1;
    int64_t tile = (int64_t)((c->scratch_bytes - xb) / row16);
    if (tile > n_rows) tile = n_rows;
    cudaStream_t s = (cudaStream_t)c->stream;
    __half *x16 = (__half *)c->scratch;
    __half *w16 = (__half *)((char *)c->scratch + xb);
    const bool by_group = groups_ok<TT>(w, n_cols, row_bytes);

    const int64_t nx = (int64_t)T * n_cols;
    k_to_f16<<<ew_blocks(nx), EW_THREADS, 0, s>>>(x, nx, x16);
    int e = launched("matmul x to fp16", what);
    if (e) return e;
    const float one = 1.0f, zero = 0.0f;
    for (int64_t r0 = 0; r0 < n_rows; r0 += tile) {
        const int64_t n = n_rows - r0 < tile ? n_rows - r0 : tile;
        e = dequant_tile<TT>(s, (const uint8_t *)w, r0, n, n_cols, row_bytes, by_group, w16, what);
        if (e) return e;
        const cublasStatus_t st =
            cublasGemmEx((cublasHandle_t)c->cublas, CUBLAS_OP_T, CUBLAS_OP_N, (int)n, T, (int)n_cols, &one, w16,
                         CUDA_R_16F, (int)n_cols, x16, CUDA_R_16F, (int)n_cols, &zero, y + r0, CUDA_R_32F,
                         (int)n_rows, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        if (st != CUBLAS_STATUS_SUCCESS) return fail((int)st, "cublasGemmEx", what);
    }
    return 0;
}

/* One format's matmul: the matrix-vector kernel for a few tokens, the GEMM
 * path for more; a matrix-vector kernel in chunks of MV_MAX_T tokens when
 * the scratch is too small for GEMM tiles. */
template <class TT>
static int matmul_t(const qi_cuk_ctx *c, const void *w, int64_t n_rows, int64_t n_cols, uint64_t row_bytes,
                    const float *x, int T, float *y, const char **what) {
    /* the matrix-vector kernel reads x as float4s and W in whole groups */
    const bool mv_ok = groups_ok<TT>(w, n_cols, row_bytes) && (uintptr_t)x % 16 == 0;
    if (T <= MV_MAX_T && mv_ok) return matvec<TT>(c, w, n_rows, n_cols, row_bytes, x, T, y, what);
    if constexpr (TT::TYPE == QI_TYPE_F32) {
        return sgemm(c, w, n_rows, n_cols, row_bytes, x, T, y, what);
    } else {
        const int e = gemm_tiles<TT>(c, w, n_rows, n_cols, row_bytes, x, T, y, what);
        if (e >= 0) return e;
        if (!mv_ok) return fail((int)cudaErrorInvalidValue, "matmul scratch", what);
        for (int t0 = 0; t0 < T; t0 += MV_MAX_T) {
            const int nt = T - t0 < MV_MAX_T ? T - t0 : MV_MAX_T;
            const int e2 = matvec<TT>(c, w, n_rows, n_cols, row_bytes, x + (int64_t)t0 * n_cols, nt,
                                      y + (int64_t)t0 * n_rows, what);
            if (e2) return e2;
        }
        return 0;
    }
}

template <class TT>
static int get_rows_t(const qi_cuk_ctx *c, const void *w, int64_t n_cols, uint64_t row_bytes, const int32_t *ids,
                      int T, float *out, const char **what) {
    cudaStream_t s = (cudaStream_t)c->stream;
    const uint8_t *wb = (const uint8_t *)w;
    if (groups_ok<TT>(w, n_cols, row_bytes)) {
        const int64_t ng = (int64_t)T * (n_cols / 8);
        const bool vec4 = (uintptr_t)out % 16 == 0;
        k_get_rows<TT><<<ew_blocks(ng), EW_THREADS, 0, s>>>(wb, row_bytes, n_cols / 8, ids, ng, out, vec4);
    } else if constexpr (TT::FLOAT) {
        const int64_t n = (int64_t)T * n_cols;
        k_get_rows_any<TT><<<ew_blocks(n), EW_THREADS, 0, s>>>(wb, row_bytes, n_cols, ids, n, out);
    } else {
        return fail((int)cudaErrorInvalidValue, names<TT>::rows, what);
    }
    return launched(names<TT>::rows, what);
}

/* ---- the table's entries --------------------------------------------------- */

extern "C" size_t qi_cuk_matmul_scratch(int max_T, int64_t max_cols) {
    if (max_T <= 0 || max_cols <= 0) return 0;
    return x16_bytes(max_T, max_cols) + TILE_BYTES;
}

extern "C" int qi_cuk_type_ok(uint32_t type) {
    switch (type) {
    case QI_TYPE_F32:
    case QI_TYPE_F16:
    case QI_TYPE_BF16:
    case QI_TYPE_Q8_0:
    case QI_TYPE_Q4_0:
    case QI_TYPE_Q4_1:
    case QI_TYPE_Q5_0:
    case QI_TYPE_Q5_1:
    case QI_TYPE_Q4_K:
    case QI_TYPE_Q5_K:
    case QI_TYPE_Q6_K: return 1;
    default: return 0;
    }
}

/* Returns fn<format>(args...) for the format `type`; falls through for a
 * type the kernels do not take. */
#define QI_DISPATCH(type, fn, ...)                                 \
    switch (type) {                                                \
    case QI_TYPE_F32: return fn<qd_f32>(__VA_ARGS__);              \
    case QI_TYPE_F16: return fn<qd_f16>(__VA_ARGS__);              \
    case QI_TYPE_BF16: return fn<qd_bf16>(__VA_ARGS__);            \
    case QI_TYPE_Q4_0: return fn<qd_q4_0>(__VA_ARGS__);            \
    case QI_TYPE_Q4_1: return fn<qd_q4_1>(__VA_ARGS__);            \
    case QI_TYPE_Q5_0: return fn<qd_q5_0>(__VA_ARGS__);            \
    case QI_TYPE_Q5_1: return fn<qd_q5_1>(__VA_ARGS__);            \
    case QI_TYPE_Q8_0: return fn<qd_q8_0>(__VA_ARGS__);            \
    case QI_TYPE_Q4_K: return fn<qd_q4_K>(__VA_ARGS__);            \
    case QI_TYPE_Q5_K: return fn<qd_q5_K>(__VA_ARGS__);            \
    case QI_TYPE_Q6_K: return fn<qd_q6_K>(__VA_ARGS__);            \
    default: break;                                                \
    }

extern "C" int qi_cuk_matmul(const qi_cuk_ctx *c, uint32_t type, const void *w, int64_t n_rows, int64_t n_cols,
                             uint64_t row_bytes, const float *x, int T, float *y, const char **what) {
    if (T <= 0 || n_rows <= 0 || n_cols <= 0) return 0; /* nothing to compute */
    if (n_cols / 8 > INT_MAX) return fail((int)cudaErrorInvalidValue, "matmul shape", what);
    QI_DISPATCH(type, matmul_t, c, w, n_rows, n_cols, row_bytes, x, T, y, what)
    return fail((int)cudaErrorInvalidValue, "matmul type", what);
}

extern "C" int qi_cuk_get_rows(const qi_cuk_ctx *c, uint32_t type, const void *w, int64_t n_cols,
                               uint64_t row_bytes, const int32_t *ids, int T, float *out, const char **what) {
    if (T <= 0 || n_cols <= 0) return 0;
    if (n_cols / 8 > INT_MAX) return fail((int)cudaErrorInvalidValue, "get_rows shape", what);
    QI_DISPATCH(type, get_rows_t, c, w, n_cols, row_bytes, ids, T, out, what)
    return fail((int)cudaErrorInvalidValue, "get_rows type", what);
}

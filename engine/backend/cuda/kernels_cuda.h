/* kernels_cuda.h - the CUDA device's kernels, as C launchers.
 *
 * The CUDA device (backend_cuda.c, plain C) queues work through a table of
 * launchers (qi_cuk), so its host logic runs and is tested without a GPU:
 * the real table (qi_cuk_cuda, the .cu files beside this) launches
 * kernels; a test's table computes on the host.
 *
 * Conventions, for every launcher:
 * - every pointer argument is device memory unless its comment says host;
 * - work is queued on c->stream (a cudaStream_t) and never synchronised;
 * - the return is 0, or the cudaError_t / cublasStatus_t of the failing
 *   launch or library call (cudaGetLastError after a launch), with
 *   *what (when not NULL) set to a static string naming it
 *   ("matmul q4_0 matvec", "cublasGemmEx", ...);
 * - shapes use the backend's vocabulary (T tokens, H heads, Hkv KV
 *   heads, D head dimension) and mean what the same op of the backend
 *   interface means (engine/backend/backend.h); results are the CPU
 *   reference's within the tolerances tests/gpu states, not bit for bit
 *   (summation order, fp32 activations where the CPU quantises them).
 */
#ifndef QI_KERNELS_CUDA_H
#define QI_KERNELS_CUDA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    void *stream;         /* cudaStream_t */
    void *cublas;         /* cublasHandle_t bound to stream */
    void *scratch;        /* device scratch for a launcher's temporaries */
    size_t scratch_bytes; /* its size: at least qi_cuk_scratch_bytes(...) */
} qi_cuk_ctx;

/* A paged attention call with its host-side tables already copied to the
 * device (backend_cuda.c stages them): KV head hk's slots are
 * [slot_off[hk], slot_off[hk + 1]) of pos (their positions), its blocks
 * [blk_off[hk], blk_off[hk + 1]) of kb and vb (device addresses of KV
 * blocks of 2^shift rows of D fp16 values); slot i of head hk is row
 * i & (2^shift - 1) of block kb[blk_off[hk] + (i >> shift)]. Everything
 * else is qi_attn_paged_args's (backend.h), device pointers. */
typedef struct {
    int T, H, Hkv, D, n_swa, shift;
    float scale;
    int max_slots;            /* the most slots of any KV head (host-known; grid and scratch sizes) */
    const int32_t *q_pos;     /* [T] */
    const float *q;           /* [T][H*D] */
    float *out;               /* [T][H*D]; unused in a statistics-only call */
    const int32_t *slot_off;  /* [Hkv + 1] */
    const int32_t *pos;       /* [slot_off[Hkv]] */
    const int32_t *blk_off;   /* [Hkv + 1] */
    const uint16_t *const *kb;/* [blk_off[Hkv]] */
    const uint16_t *const *vb;
    float *stats;             /* NULL or [H][stats_stride] */
    int stats_stride;
    float *part_m, *part_l;   /* NULL or [T][H]: a partial result */
    const float *tot_m, *tot_l; /* NULL or [T][H]: a statistics-only call */
} qi_cuk_attn;

/* A merge of partial results (qi_attn_merge_args, pointers device). */
#define QI_CUK_MAX_PARTS 8
typedef struct {
    int rows, D, n_parts;
    const float *o[QI_CUK_MAX_PARTS], *m[QI_CUK_MAX_PARTS], *l[QI_CUK_MAX_PARTS];
    float *out, *tot_m, *tot_l; /* tot_* may be NULL */
} qi_cuk_merge;

typedef struct qi_cuk {
    const char *name;
    /* The scratch bytes the launchers need for matmuls of up to max_T rows
     * of up to max_cols columns, attention of up to max_T queries of H heads
     * over up to max_pos slots, and gather_rows of up to max_T rows of up to
     * max_width values (the device allocates the largest it may need once). */
    size_t (*scratch_bytes)(int max_T, int64_t max_cols, int H, int max_pos, int64_t max_width);
    /* Is weight type `type` supported by matmul and get_rows? */
    int (*type_ok)(uint32_t type);
    /* y[T][n_rows] = x[T][n_cols] . W^T; W is n_rows rows of row_bytes
     * bytes of type `type` (a qi_type). */
    int (*matmul)(const qi_cuk_ctx *c, uint32_t type, const void *w, int64_t n_rows, int64_t n_cols,
                  uint64_t row_bytes, const float *x, int T, float *y, const char **what);
    /* out[T][n_cols] = rows ids[t] of W, dequantised to fp32 */
    int (*get_rows)(const qi_cuk_ctx *c, uint32_t type, const void *w, int64_t n_cols, uint64_t row_bytes,
                    const int32_t *ids, int T, float *out, const char **what);
    int (*rmsnorm)(const qi_cuk_ctx *c, const float *x, const float *w, int T, int n, float eps, float *y,
                   const char **what);
    /* mode: 0 adjacent pairs (QI_ROPE_NORM), 1 halves (QI_ROPE_NEOX); k may be NULL */
    int (*rope)(const qi_cuk_ctx *c, float *q, int Hq, float *k, int Hk, int T, int D, int n_rot,
                const int32_t *pos, float base, float freq_scale, int mode, const char **what);
    /* gate = silu(gate) * up, or gelu_tanh(gate) * up with gelu */
    int (*glu)(const qi_cuk_ctx *c, int gelu, float *gate, const float *up, int T, int n, const char **what);
    /* *dst[i][0..D) = fp16(*src[i][0..D)) for i < n (src, dst: device arrays of device addresses) */
    int (*kv_write)(const qi_cuk_ctx *c, const float *const *src, uint16_t *const *dst, int n, int D,
                    const char **what);
    int (*add)(const qi_cuk_ctx *c, float *x, const float *y, long n, const char **what);
    int (*scale)(const qi_cuk_ctx *c, float *x, long n, float s, const char **what);
    int (*softcap)(const qi_cuk_ctx *c, float *x, long n, float cap, const char **what);
    /* row r of x[.][width] = row rows[r] (rows ascending, rows[r] >= r), in place */
    /* x[t][i] += bias[i] for t < T, i < n */
    int (*add_bias)(const qi_cuk_ctx *c, float *x, const float *bias, int T, int n, const char **what);
    int (*gather_rows)(const qi_cuk_ctx *c, float *x, const int32_t *rows, int n, int width, const char **what);
    /* a is host memory (the struct); what it points to is device memory */
    int (*attention)(const qi_cuk_ctx *c, const qi_cuk_attn *a, const char **what);
    int (*merge)(const qi_cuk_ctx *c, const qi_cuk_merge *a, const char **what);
} qi_cuk;

/* The kernels of this build (the .cu files); NULL in a build without CUDA. */
const qi_cuk *qi_cuk_cuda(void);

#ifdef __cplusplus
}
#endif

#endif

/* k_internal.h - what each kernel file of the CUDA device defines, for
 * the table (k_table.cu) that gathers them into a qi_cuk. Signatures are
 * the qi_cuk entries' (kernels_cuda.h). */
#ifndef QI_K_INTERNAL_H
#define QI_K_INTERNAL_H

#include "kernels_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

/* k_matmul.cu: quantised matmul (matrix-vector kernels for a few rows,
 * dequantised tiles and cuBLAS for more) and get_rows */
size_t qi_cuk_matmul_scratch(int max_T, int64_t max_cols);
int qi_cuk_type_ok(uint32_t type);
int qi_cuk_matmul(const qi_cuk_ctx *c, uint32_t type, const void *w, int64_t n_rows, int64_t n_cols,
                  uint64_t row_bytes, const float *x, int T, float *y, const char **what);
int qi_cuk_get_rows(const qi_cuk_ctx *c, uint32_t type, const void *w, int64_t n_cols, uint64_t row_bytes,
                    const int32_t *ids, int T, float *out, const char **what);

/* k_elem.cu: row-wise and element-wise ops */
size_t qi_cuk_gather_scratch(int max_T, int64_t max_width);
int qi_cuk_rmsnorm(const qi_cuk_ctx *c, const float *x, const float *w, int T, int n, float eps, float *y,
                   const char **what);
int qi_cuk_rope(const qi_cuk_ctx *c, float *q, int Hq, float *k, int Hk, int T, int D, int n_rot,
                const int32_t *pos, float base, float freq_scale, int mode, const char **what);
int qi_cuk_glu(const qi_cuk_ctx *c, int gelu, float *gate, const float *up, int T, int n, const char **what);
int qi_cuk_kv_write(const qi_cuk_ctx *c, const float *const *src, uint16_t *const *dst, int n, int D,
                    const char **what);
int qi_cuk_add(const qi_cuk_ctx *c, float *x, const float *y, long n, const char **what);
int qi_cuk_scale(const qi_cuk_ctx *c, float *x, long n, float s, const char **what);
int qi_cuk_add_bias(const qi_cuk_ctx *c, float *x, const float *bias, int T, int n, const char **what);
int qi_cuk_softcap(const qi_cuk_ctx *c, float *x, long n, float cap, const char **what);
int qi_cuk_gather_rows(const qi_cuk_ctx *c, float *x, const int32_t *rows, int n, int width, const char **what);

/* k_attn.cu: paged attention (whole, partial, statistics-only) and the
 * merge (the qi_cuk entry `merge`; named qi_cuk_attn_merge because
 * qi_cuk_merge is the type of its argument, and C and C++ give a typedef
 * and a function one namespace) */
size_t qi_cuk_attn_scratch(int max_T, int H, int max_pos);
int qi_cuk_attention(const qi_cuk_ctx *c, const qi_cuk_attn *a, const char **what);
int qi_cuk_attn_merge(const qi_cuk_ctx *c, const qi_cuk_merge *a, const char **what);

#ifdef __cplusplus
}
#endif

#endif

/* cpu_int.h - the CPU backend's state, shared by backend_cpu.c (the ops,
 * the device, its creation) and backend_cpu_attn.c (attention). */
#ifndef QI_CPU_INT_H
#define QI_CPU_INT_H

#include "backend.h"
#include "kernels.h"
#include "threadpool.h"

/* One kept table of RoPE angles (see cpu_rope): rows' cosines and sines,
 * [rope_rows][rope_pairs], for positions pos[0..T) and these parameters;
 * T = 0: empty. */
typedef struct {
    float *cs, *sn;
    int32_t *pos;
    int T, n_rot;
    float base, freq_scale;
} rope_tab;

typedef struct {
    qi_pool *pool;
    const qi_kernels *k;
    rope_tab rope[2];
    int rope_rows, rope_pairs, rope_next;
    void *scratch; /* quantised activations */
    size_t scratch_bytes;
    float *att;     /* per-thread score rows, [n_threads][att_len] */
    uint16_t *w16;  /* per-thread fp16 softmax weights, same shape */
    int att_len;
    /* attn_blas scratch, sized by reserve() for blas_len positions of
     * blas_hkv KV heads of blas_d values */
    bool attn_blas;
    bool repack; /* QI_CPU_REPACK: matrices prepared in the packed order */
    float *bk, *bv;  /* a call's K and V rows as float, [Hkv][blas_len][D] */
    float *bs;       /* per-thread scores, then weights, [n_threads][BLAS_QCHUNK * blas_len] */
    float *bq;       /* per-thread queries rounded to fp16, [n_threads][BLAS_QCHUNK * blas_d] */
    int blas_len, blas_hkv, blas_d;
} cpu_ctx;

/* Queries per sgemm in the attn_blas path: bounds the score scratch to
 * BLAS_QCHUNK rows of the context whatever the prompt's length, and with a
 * causal mask the columns every query of a chunk masks are skipped, so
 * smaller chunks waste less (an eighth more than the triangle for 512
 * tokens from position 0). */
#define BLAS_QCHUNK 64

/* Tokens per pass over the weights: 32 Q8_1 rows of 2048 elements are 72 KiB,
 * about what stays cached next to the weight row. */
#define MM_TOKEN_BLOCK 32

static inline cpu_ctx *C(qi_backend *b) { return (cpu_ctx *)b->ctx; }

/* backend_cpu_attn.c: the paged attention (and its attn_blas variant) and
 * the merge of a split layer's partial results */
void cpu_attention_paged(qi_backend *b, const qi_attn_paged_args *a);
void cpu_attention_paged_n(qi_backend *b, const qi_attn_paged_args *a, int n);
void cpu_attention_merge(qi_backend *b, const qi_attn_merge_args *a);

#endif

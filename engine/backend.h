/* backend.h - the ops a forward pass is made of, behind an interface.
 *
 * A backend is a table of op functions plus its own context (thread pool,
 * device handles). The forward pass in engine.c only calls through this
 * table, so a CUDA backend, or a split plan that sends attention to one
 * backend and the MLP to another, slots in without touching the model code.
 * The CPU backend is the reference every other backend is tested against.
 *
 * Buffers are host float arrays for the CPU backend. Shapes use the fixed
 * vocabulary: T tokens in this step, H heads, Hkv KV heads, D head dim.
 */
#ifndef QI_BACKEND_H
#define QI_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "qinfer/model.h"
#include "qinfer/status.h"

typedef struct qi_backend qi_backend;

/* Attention of one sequence over a paged cache (engine/kv.c): KV head hk
 * holds n_slots[hk] tokens, slot i at row i & (2^shift - 1) of block
 * k_blk[hk][i >> shift] (rows of D fp16 values), position pos[hk][i]. Slot
 * order need not be position order: masking is by position only (a key at
 * a position after the query's is -inf, and so is one at or beyond n_swa
 * positions back when n_swa > 0), and every query scores all the slots, so
 * for slots in position order the lanes are those of a causal attention
 * over a contiguous cache. */
typedef struct {
    int T, H, Hkv, D;
    const int32_t *q_pos;            /* [T] query positions */
    int n_swa;
    float scale;
    const float *q;                  /* [T][H*D] */
    float *out;                      /* [T][H*D] */
    const int *n_slots;              /* [Hkv] */
    const int32_t *const *pos;       /* [Hkv][n_slots[hk]] */
    const uint16_t *const *const *k_blk; /* [Hkv] block tables */
    const uint16_t *const *const *v_blk;
    int shift;
    /* Optional (NULL: none): stats[h * stats_stride + i] += the softmax
     * weight query head h gave slot i, summed over the T queries in query
     * order (t = 0 first), the same sums however the work is split.
     * stats_stride >= every n_slots[hk]; the H rows must not overlap out
     * or another call's stats. */
    float *stats;
    int stats_stride;
    /* A partial result (split attention; NULL: none). With part_m and
     * part_l, the call attends over its slots only and writes, per query
     * and head (row t * H + h of [T][H]): out, the output normalised over
     * these slots; part_m, their largest scaled score (-inf when the query
     * sees none of them, out then 0); part_l, the sum of exp(score -
     * part_m). l * out is the un-normalised output, so partial results
     * over disjoint slot sets merge exactly (attention_merge). The weights
     * are rounded to fp16 as the whole attention rounds them, so a call
     * that holds all of a query's slots gives out bit for bit. No stats. */
    float *part_m, *part_l;
    /* The statistics alone of a split attention (NULL: none): with stats,
     * tot_m and tot_l (the merged max and sum of [T][H], attention_merge's),
     * the call writes no out and adds to stats each of its slots' weight in
     * the softmax over all the parts, exp(score - tot_m) / tot_l rounded to
     * fp16 as the whole attention rounds it. */
    const float *tot_m, *tot_l;
} qi_attn_paged_args;

/* The most partial results one merge takes. */
#define QI_ATTN_MAX_PARTS 8

/* Merging n_parts partial results of rows = T * H (query, head) rows of D
 * values: per row, M = max_p m[p], a_p = l[p] exp(m[p] - M), out =
 * sum_p a_p o[p] / sum_p a_p, in double. A row that only one part sees
 * gets that part's o bit for bit. tot_m and tot_l (may be NULL) receive
 * M and sum_p a_p, for a statistics pass. */
typedef struct {
    int rows, D, n_parts;
    const float *const *o;   /* [n_parts] -> [rows][D] */
    const float *const *m;   /* [n_parts] -> [rows] */
    const float *const *l;   /* [n_parts] -> [rows] */
    float *out;              /* [rows][D] */
    float *tot_m, *tot_l;    /* [rows] each, or NULL */
} qi_attn_merge_args;

typedef struct {
    uint32_t version; /* QI_BACKEND_VERSION */
    const char *name;
    /* y[T][w->n_rows] = x[T][w->n_cols] . W^T, activations quantised per
     * row to the weight type's dot partner first (as llama.cpp does). */
    void (*matmul)(qi_backend *b, const qi_weight *w, const float *x, int T, float *y);
    /* y[i] = matmul(w[i], x) for i < n, weights of equal n_cols reading the
     * same x (Q, K and V; gate and up): the same results as n matmul calls,
     * with the activations quantised once per dot type and the rows of all
     * the weights shared out in one pass of the workers. */
    void (*matmul_n)(qi_backend *b, const qi_weight *const *w, float *const *y, int n, const float *x, int T);
    /* y[T][n] = x / rms(x) * w  (y may alias x) */
    void (*rmsnorm)(qi_backend *b, const float *x, const float *w, int T, int n, float eps, float *y);
    /* RoPE in place on q[T][Hq*D] and, unless k is NULL, k[T][Hk*D]: row
     * t at position pos[t], the first n_rot values of each head rotated
     * (n_rot even, <= D); the angles are computed once per row for both. */
    void (*rope)(qi_backend *b, float *q, int Hq, float *k, int Hk, int T, int D, int n_rot, const int32_t *pos,
                 float base, float freq_scale, int mode);
    void (*attention_paged)(qi_backend *b, const qi_attn_paged_args *a);
    /* n calls of attention_paged at once (independent sequences; no
     * call's out or stats overlaps another's): the same results, outputs
     * and statistics bit for bit, as n calls in turn, in one pass of the
     * workers, so a decode step of many sequences does not pay n rounds of
     * synchronisation. Calls with and without stats may be mixed. */
    void (*attention_paged_n)(qi_backend *b, const qi_attn_paged_args *a, int n);
    void (*attention_merge)(qi_backend *b, const qi_attn_merge_args *a);
    /* gate[T][n] = silu(gate) * up, row by row (the SIMD chunks of
     * llama.cpp's op restart at every row) */
    void (*swiglu)(qi_backend *b, float *gate, const float *up, int T, int n);
    /* gate[T][n] = gelu_tanh(gate) * up, with ggml's fp16 GELU table */
    void (*geglu)(qi_backend *b, float *gate, const float *up, int T, int n);
    /* out[T][w->n_cols] = rows ids[t] of w, dequantised */
    void (*get_rows)(qi_backend *b, const qi_weight *w, const int32_t *ids, int T, float *out);
    /* fn(ctx, ith, nth) on each of the backend's host threads, the caller
     * being ith 0, returning when all have finished; nth is at most the
     * thread count the backend was made with. For a step's host work that
     * is not an op (the KV policy's decisions over a layer's streams). */
    void (*host_run)(qi_backend *b, void (*fn)(void *ctx, int ith, int nth), void *ctx);
    /* Size scratch for activations of up to scratch_bytes (quantised rows),
     * ops of up to max_rows rows (tokens), and attention over up to max_pos
     * positions of Hkv KV heads of D values; called before any op, so
     * nothing allocates inside a step. */
    qi_status (*reserve)(qi_backend *b, size_t scratch_bytes, int max_rows, int max_pos, int Hkv, int D,
                         qi_err *err);
    void (*free)(qi_backend *b);
} qi_backend_i;

#define QI_BACKEND_VERSION 10u

struct qi_backend {
    const qi_backend_i *iface;
    void *ctx;
};

/* The largest row of quantised activations any matmul of m needs (the
 * scratch reserve() sizes per token). */
size_t qi_backend_max_act_row_bytes(const qi_model *m);

/* The CPU reference backend with n_threads workers. With attn_blas, the
 * attention of calls with T >= 2 runs through OpenBLAS sgemm (faster, not
 * bit-identical to llama.cpp; see backend_cpu.c); it loads OpenBLAS here
 * and fails (QI_ERR_UNSUPPORTED, naming the library) when it cannot. */
qi_status qi_backend_cpu_create(int n_threads, bool attn_blas, qi_backend **out, qi_err *err);
void qi_backend_free(qi_backend *b); /* NULL is a no-op */

#endif

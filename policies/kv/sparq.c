/* sparq.c - SparQ Attention, query-aware selection of single tokens (Ribar
 * et al., "SparQ Attention: Bandwidth-Efficient LLM Inference", ICML 2024).
 *
 * Like quest, sparq evicts nothing: the whole cache is held and at each
 * decode step attention reads only `budget` of its tokens, chosen against
 * this step's query. Quest bounds a page's scores by its keys' element-wise
 * minimum and maximum and reads whole pages; sparq scores every token from
 * its own key, but only on the query's largest components, and reads
 * single tokens:
 *   1. the `r` components d with the largest |q_d| (r = dims x D, rounded,
 *      at least 1), chosen by |q_d| summed over the KV head's group of
 *      query heads, since one pick serves the whole group (the paper
 *      chooses per head, on models without grouped-query attention);
 *   2. each head h's approximate scores s_h(t) = c_h (q_h . k_t) over those
 *      components alone (the query rounded to fp16, as attention rounds
 *      it), with the paper's temperature correction
 *      c_h = scale x sqrt(|q_h|_1 / |q_h restricted to them|_1), and their
 *      softmax p_h over every held token;
 *   3. the newest token, then the budget - 1 others with the largest
 *      sum over the group of p_h(t) (ties to the newer), in position order.
 * The budget counts the tokens read, as quest's: per decode step, per
 * (layer, KV head). With dims=1 the scores are exact, so the pick is the
 * tokens that hold the most of the group's attention: the oracle top-k of
 * attention over the budget, a bound for any selection of that many
 * tokens. Prompts (several tokens a step) read everything. Layers below
 * full_layers (default 0) read everything.
 *
 * What it reads to choose: r of every held key's D values. As in the
 * paper, the cache keeps the keys a second time by components (kv.h's key
 * columns: per block of 64 tokens, D columns of 64 values), so those r
 * components are r short contiguous runs per block rather than a gather
 * over whole rows, and a step reads dims / 2 of the cache's K and V bytes
 * to choose, besides the chosen rows. The paper also mixes the mean of
 * all values into the output by the share of the approximate weight left
 * unread; by default that is not done here (attention reads the chosen
 * rows alone, as for every picking policy); with mean=true the policy reports
 * per query head the approximate weight its picks hold (the view's mass)
 * and attention gives the rest to the mean of the held values; measured
 * worse at 25% on SmolLM2 (policies/kv/README.md), so off by default. If
 * the scratch cannot grow, the newest `budget` tokens are read (a choice
 * that needs no memory).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kv/kv_policy.h"
#include "kv/rank_int.h"
#include "kv/sparq_int.h"
#include "kernels.h"
#include "qinfer/quant.h"

/* The most values per head a pick view may have: the attention call's
 * limit (a query of at most 1024 values). */
#define SPARQ_MAX_D 1024
/* Blocks ahead whose chosen columns are fetched early. */
#define SPARQ_AHEAD 2

typedef struct {
    qi_kv_scored s;
    double dims;
    int full_layers;
    bool mean; /* SparQ's mean-value term: the unread weight on the mean value */
    qi_kv_sparq_buf w; /* the weights' scratch */
    uint8_t *mark; /* [n] chosen */
    size_t mark_cap;
} sparq_policy;

extern const qi_kv_policy_i qi_kv_sparq_policy;

static qi_status sparq_create(const qi_params *params, int n_layer, qi_kv_policy **out, qi_err *err) {
    static const char *const known[] = {"dims", "full_layers", "mean", NULL};
    double dims;
    long full_layers;
    bool mean;
    qi_status st = qi_params_check_known(params, "sparq", known, err);
    if (!st) st = qi_params_bool(params, "sparq", "mean", false, &mean, err);
    if (!st) st = qi_params_int(params, "sparq", "full_layers", 0, 0, n_layer, &full_layers, err);
    if (!st) st = qi_params_double(params, "sparq", "dims", 0.125, 0.0, 1.0, &dims, err);
    if (!st && !(dims > 0.0))
        st = QI_ERR(err, QI_ERR_INVALID, "sparq: parameter 'dims' must be in (0, 1], got '%s'",
                    qi_params_get(params, "dims"));
    if (!st) st = qi_kv_scored_new(&qi_kv_sparq_policy, sizeof(sparq_policy), out, err);
    if (st) return st;
    sparq_policy *p = (sparq_policy *)*out;
    p->dims = dims;
    p->full_layers = (int)full_layers;
    p->mean = mean;
    return QI_OK;
}

static void sparq_free(qi_kv_policy *pp) {
    sparq_policy *p = (sparq_policy *)pp;
    if (!p) return;
    qi_kv_sparq_buf_free(&p->w);
    qi_free(p->mark);
    qi_kv_scored_free(pp);
}

/* Never evicts: what attention reads is chosen in pick(). */
static void sparq_select(qi_kv_policy *p, const qi_kv_view *v, uint8_t *fate) {
    (void)p;
    for (int i = 0; i < v->n; i++) fate[i] = QI_KV_KEEP;
}

static bool sparq_exempt(const qi_kv_policy *pp, int layer) {
    return layer < ((const sparq_policy *)pp)->full_layers;
}

static bool grow(void **buf, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return true;
    void *b = qi_malloc(need * elem);
    if (!b) return false;
    qi_free(*buf);
    *buf = b;
    *cap = need;
    return true;
}

/* The r components of the largest |q_d| summed over the group, written to
 * idx[] in ascending order (ties to the lower d): one pass keeping the r
 * best in a list sorted by magnitude (a later d enters only when strictly
 * larger than the r-th, so the lower d wins a tie), then the list's
 * components sorted. */
static void top_components(const float *q, int group, int D, int r, int *idx) {
    float best[SPARQ_MAX_D];
    int at[SPARQ_MAX_D], k = 0;
    for (int d = 0; d < D; d++) {
        float m = 0.0f;
        for (int h = 0; h < group; h++) m += fabsf(q[(size_t)h * D + d]);
        if (k == r && !(m > best[r - 1])) continue;
        int j = k < r ? k++ : r - 1; /* the slot it takes: a new one, or the r-th's */
        for (; j > 0 && m > best[j - 1]; j--) {
            best[j] = best[j - 1];
            at[j] = at[j - 1];
        }
        best[j] = m;
        at[j] = d;
    }
    for (int j = 1; j < r; j++) { /* ascending d */
        const int x = at[j];
        int i = j;
        for (; i > 0 && at[i - 1] > x; i--) at[i] = at[i - 1];
        at[i] = x;
    }
    memcpy(idx, at, sizeof *idx * (size_t)r);
}

#if defined(__GNUC__)
typedef float sparq_v16 __attribute__((vector_size(64))); /* 16 floats: one AVX-512 register, two AVX2 ones */
#endif

/* acc[t] = sum over j < r, in that order, of w[j] x col[j][t] for t < nt
 * (col rows of nt floats): 16 tokens at a time with their sums held in one
 * vector across the r components (GNU C's vector type), the rest one by
 * one; widened for the vector units the CPU has (one clone per target,
 * chosen at load). */
#if defined(__GNUC__) && defined(__x86_64__) && !defined(__clang__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
static void cols_dot(float *restrict acc, const float *restrict col, const float *restrict w, int r, int nt) {
    int t = 0;
#if defined(__GNUC__)
    for (; t + 16 <= nt; t += 16) {
        sparq_v16 a = {0};
        for (int j = 0; j < r; j++) {
            sparq_v16 c;
            memcpy(&c, col + (size_t)j * nt + t, sizeof c);
            a += w[j] * c;
        }
        memcpy(acc + t, &a, sizeof a);
    }
#endif
    for (; t < nt; t++) {
        float a = 0.0f;
        for (int j = 0; j < r; j++) a += w[j] * col[(size_t)j * nt + t];
        acc[t] = a;
    }
}

/* The largest of x[0..n), n >= 1, by eight running maxima (one chain
 * would wait on every comparison). */
static float max_of(const float *x, int n) {
    float m[8];
    for (int l = 0; l < 8; l++) m[l] = x[0];
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) m[l] = x[i + l] > m[l] ? x[i + l] : m[l];
    for (; i < n; i++) m[0] = x[i] > m[0] ? x[i] : m[0];
    for (int l = 1; l < 8; l++) m[0] = m[l] > m[0] ? m[l] : m[0];
    return m[0];
}

/* acc[t] = (first ? 0 : acc[t]) + w x x[t] for t < n (acc may be x). */
#if defined(__GNUC__) && defined(__x86_64__) && !defined(__clang__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
static void scale_add(float *acc, const float *x, float w, int n, bool first) {
    if (first)
        for (int t = 0; t < n; t++) acc[t] = w * x[t];
    else
        for (int t = 0; t < n; t++) acc[t] += w * x[t];
}

void qi_kv_sparq_buf_free(qi_kv_sparq_buf *b) {
    qi_free(b->buf);
    b->buf = NULL;
    b->cap = 0;
}

const float *qi_kv_sparq_weights(qi_kv_sparq_buf *b, const qi_kv_pick_view *v, double dims, const float **heads,
                                 size_t *head_stride) {
    const int n = v->n, D = v->D, G = v->group, rows = 1 << v->k_shift;
    const size_t stride = (size_t)n + (size_t)rows; /* one head's scores, n rounded up to whole blocks */
    const size_t gath = ((size_t)D << v->k_shift) / 2 + 1; /* floats that hold [D][a block] fp16 values */
    if (D > SPARQ_MAX_D || !grow((void **)&b->buf, &b->cap,
                                 (size_t)G * stride + (size_t)n + ((size_t)D << v->k_shift) + (size_t)G * D + gath,
                                 sizeof(float)))
        return NULL;
    long r = lround(dims * D);
    if (r < 1) r = 1;
    if (r > D) r = D;
    int idx[SPARQ_MAX_D];
    top_components(v->q, G, D, (int)r, idx);
    const float scale = v->scale > 0.0f ? v->scale : 1.0f;
    const qi_kernels *K = qi_kernels_get();
    /* sc: [G][stride] each head's scores; sum: [n]; colf: [r][a block]
     * widened columns; qc: [G][r] each head's scaled components; g16: [r][a
     * block] the chosen components of a block read by rows */
    float *sc = b->buf, *sum = sc + (size_t)G * stride, *colf = sum + n, *qc = colf + ((size_t)D << v->k_shift);
    uint16_t *g16 = (uint16_t *)(void *)(qc + (size_t)G * D);
    /* each head's chosen components: in fp16, as attention rounds the
     * query, times its temperature (SparQ's correction for the components
     * left out) */
    for (int h = 0; h < G; h++) {
        const float *qh = v->q + (size_t)h * D;
        double a4[4] = {0.0, 0.0, 0.0, 0.0}, part = 0.0; /* four chains: one would wait on every add */
        int d = 0;
        for (; d + 4 <= D; d += 4)
            for (int l = 0; l < 4; l++) a4[l] += fabs(qh[d + l]);
        for (; d < D; d++) a4[0] += fabs(qh[d]);
        const double all = (a4[0] + a4[1]) + (a4[2] + a4[3]);
        for (int j = 0; j < r; j++) part += fabs(qh[idx[j]]);
        const float c = part > 0.0 ? scale * (float)sqrt(all / part) : scale;
        for (int j = 0; j < r; j++) qc[(size_t)h * r + j] = c * qi_fp16_to_f32(qi_f32_to_fp16(qh[idx[j]]));
    }
    /* the scores, a block at a time from the key columns: each chosen
     * component's column widened once and added into every head's scores,
     * so only r of every key's D values are read. A block with tokens
     * past the columns (the view's k_tail) has its chosen components
     * gathered from the rows into the same layout, so the arithmetic is
     * the same. */
    const int nc = n - v->k_tail; /* tokens with columns */
    const int lines = (int)(((size_t)rows * sizeof(uint16_t) + 63) / 64); /* cache lines per column */
    const int ahead = SPARQ_AHEAD;
    for (int bl = 0; bl < ahead && (long)(bl + 1) * rows <= nc; bl++) /* the columns lie scattered: fetch early */
        for (int j = 0; j < r; j++)
            for (int l = 0; l < lines; l++)
                __builtin_prefetch(v->k_cols + ((size_t)bl * D + (size_t)idx[j]) * rows + (size_t)l * 32);
    for (int bl = 0; (long)bl * rows < n; bl++) {
        const int t0 = bl * rows, nt = n - t0 < rows ? n - t0 : rows;
        if ((long)(bl + ahead + 1) * rows <= nc)
            for (int j = 0; j < r; j++)
                for (int l = 0; l < lines; l++)
                    __builtin_prefetch(v->k_cols + ((size_t)(bl + ahead) * D + (size_t)idx[j]) * rows +
                                       (size_t)l * 32);
        if (t0 + nt <= nc)
            for (int j = 0; j < r; j++) /* widened: [r][nt] */
                K->f16_to_f32(v->k_cols + ((size_t)bl * D + (size_t)idx[j]) * rows, colf + (size_t)j * nt, nt);
        else { /* by rows */
            const size_t mask = (size_t)rows - 1;
            for (int t = 0; t < nt; t++) {
                const uint16_t *k = v->k_blk[(size_t)(t0 + t) >> v->k_shift] + ((size_t)(t0 + t) & mask) * D;
                for (int j = 0; j < r; j++) g16[(size_t)j * nt + t] = k[idx[j]];
            }
            K->f16_to_f32(g16, colf, (int)r * nt);
        }
        for (int h = 0; h < G; h++)
            cols_dot(sc + (size_t)h * stride + (size_t)bl * rows, colf, qc + (size_t)h * r, (int)r, nt);
    }
    /* each head's softmax over the tokens, summed over the group (each
     * head's own weights kept in its row when asked for) */
    for (int h = 0; h < G; h++) {
        float *sh = sc + (size_t)h * stride;
        const float inv = (float)(1.0 / K->exp_sum(n, sh, max_of(sh, n)));
        if (heads)
            for (int t = 0; t < n; t++) sh[t] *= inv;
        scale_add(sum, sh, heads ? 1.0f : inv, n, h == 0);
    }
    if (heads) {
        *heads = sc;
        *head_stride = stride;
    }
    return sum;
}

static int sparq_pick(qi_kv_policy *pp, const qi_kv_pick_view *v, int *blocks) {
    sparq_policy *p = (sparq_policy *)pp;
    const int n = v->n, G = v->group;
    if (v->budget >= n) { /* everything fits: every token, the full cache's arithmetic */
        for (int i = 0; i < n; i++) blocks[i] = i;
        return n;
    }
    const int k = v->budget - 1; /* besides the newest */
    const float *heads = NULL, *sc = NULL;
    size_t stride = 0;
    if (k > 0 && grow((void **)&p->mark, &p->mark_cap, (size_t)n, 1) && qi_kv_scratch_reserve(&p->s.scratch, n))
        sc = qi_kv_sparq_weights(&p->w, v, p->dims, p->mean ? &heads : NULL, &stride);
    if (!sc) { /* the newest budget tokens */
        for (int i = 0; i < v->budget; i++) blocks[i] = n - v->budget + i;
        return v->budget;
    }
    qi_kv_item *it = p->s.scratch.items;
    for (int t = 0; t < n - 1; t++) it[t] = (qi_kv_item){.score = sc[t], .pos = t, .slot = t};
    qi_kv_rank_top_by_score(it, n - 1, k);
    memset(p->mark, 0, (size_t)n);
    for (int i = 0; i < k; i++) p->mark[it[i].slot] = 1;
    p->mark[n - 1] = 1;
    int c = 0;
    for (int t = 0; t < n; t++)
        if (p->mark[t]) blocks[c++] = t;
    if (p->mean && v->mass) /* each head's estimated share of its attention in the picked tokens */
        for (int h = 0; h < G; h++) {
            const float *w = heads + (size_t)h * stride;
            double m = 0.0;
            for (int j = 0; j < c; j++) m += w[blocks[j]];
            v->mass[h] = (float)m;
        }
    return c;
}

const qi_kv_policy_i qi_kv_sparq_policy = {
    .version = QI_KV_POLICY_VERSION,
    .name = "sparq",
    .summary = "SparQ: attention reads the tokens whose keys score best on the query's largest components; nothing "
               "evicted",
    .params = "dims=0.125,full_layers=0,mean=false",
    .create = sparq_create,
    .select = sparq_select,
    .exempt = sparq_exempt,
    .pick = sparq_pick,
    .pick_tokens = true,
    .free = sparq_free,
};

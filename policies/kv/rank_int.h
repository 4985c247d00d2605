/* rank_int.h - the ranking steps the KV policies share (private to
 * policies/kv/).
 *
 * A policy's select() labels the competing tokens QI_KV_UNDECIDED in the
 * fate array itself, settles some of them (sinks, the recent window, the
 * best scores) and finally gives every token still undecided the eviction
 * fate. Position ranks need no memory; score ranks sort a scratch array of
 * items that the policy sizes in create().
 */
#ifndef QI_KV_RANK_INT_H
#define QI_KV_RANK_INT_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#include "kv/kv_policy.h"

/* A working label inside select(); never left in a returned fate array. */
#define QI_KV_UNDECIDED 0xFFu

/* Label the competitors: working tokens, and offloaded ones too when
 * with_offloaded (recall); offloaded tokens that do not compete get
 * QI_KV_OFFLOAD, i.e. stay where they are. Returns the competitor count. */
int qi_kv_rank_begin(const qi_kv_view *v, bool with_offloaded, uint8_t *fate);

/* Give the k newest (newest) or k oldest undecided tokens by position the
 * fate `to` (all of them when fewer). Equal positions, which a cache should
 * not hold, rank the higher slot as newer. O(n log range), no allocation. */
void qi_kv_rank_mark_by_pos(const qi_kv_view *v, uint8_t *fate, int k, bool newest, uint8_t to);

/* Every token still undecided gets `to`. */
void qi_kv_rank_finish(const qi_kv_view *v, uint8_t *fate, uint8_t to);

typedef struct qi_kv_item {
    float score;
    int32_t pos;
    int32_t slot; /* index into the view */
} qi_kv_item;

/* Items for score ranking, grown only when a view holds more tokens than
 * any before (the one allocation a select() may make). */
typedef struct {
    qi_kv_item *items;
    int cap;
} qi_kv_scratch;

#define QI_KV_SCRATCH_INIT 1024

/* Allocate cap items. QI_ERR_NOMEM on failure (s is then empty). */
qi_status qi_kv_scratch_init(qi_kv_scratch *s, int cap, qi_err *err);
/* Room for n items; false if growing failed (the old buffer is kept). */
bool qi_kv_scratch_reserve(qi_kv_scratch *s, int n);
void qi_kv_scratch_fini(qi_kv_scratch *s);

/* Copy the undecided tokens into items (room for v->n); returns the count. */
int qi_kv_rank_gather(const qi_kv_view *v, const uint8_t *fate, qi_kv_item *items);
/* Reorder items so that the first min(k, n) are the k best (in no
 * particular order among themselves): a quickselect, O(n) on average. Best
 * means the higher score; ties: the newer position, then the higher slot;
 * NaN scores rank last. The order is total, so the set is the one a sort
 * would put first. */
void qi_kv_rank_top_by_score(qi_kv_item *items, int n, int k);

/* The rule h2o, keyformer, tova, scissorhands and snapkv share, on the
 * competitors qi_kv_rank_begin labelled: keep the `recent` newest, then the
 * `heavy` best by score (key(score) when key is not NULL: a policy whose
 * stored score is not its rank, as scissorhands' bit masks), and give the
 * rest `evict`. All are kept when they fit in recent + heavy; if the
 * scratch cannot grow to rank them, the recent + heavy newest are kept, a
 * decision that needs no memory. */
void qi_kv_rank_recent_top(const qi_kv_view *v, uint8_t *fate, qi_kv_scratch *s, int recent, int heavy,
                           float (*key)(float), uint8_t evict);

/* Ada-KV's budgets (Feng et al., 2024) for the n KV heads of one
 * (sequence, layer), v[h] head h after observe(). Each head keeps
 * w_h = min(window, its tokens) by position, the tokens its policy keeps
 * whatever their scores (sinks, recent window); cand[h][i] is
 * QI_KV_UNDECIDED for head h's other tokens, the candidates (both tiers,
 * since an offloaded token may be recalled; cand NULL: every token). Only
 * the scored part S = budget - window moves between heads, as Ada-KV keeps
 * every head's observation window: candidates are ranked by rank(score)
 * (NULL: the score) under the order of qi_kv_rank_top_by_score, equal
 * scores and positions going to the higher head; each head is sure of its
 * f_h = min(f, its candidates) best, where f = floor((1 - ada) x S) raised
 * to 1 when S > 0 (Ada-KV's safeguard: no head starves), 0 when S = 0;
 * the other R = n x budget - sum (w_h + f_h) go to the R best of all
 * heads' remaining candidates. out[h] = w_h + f_h + what head h won there,
 * so the budgets sum to n x budget (less only when fewer tokens are held).
 * window 0 shares the whole budget. items needs room for the views' tokens
 * together; no allocation. */
void qi_kv_rank_ada_budgets(const qi_kv_view *v, int n, int budget, int window, double ada, float (*rank)(float),
                            const uint8_t *const *cand, qi_kv_item *items, int *out);

/* A scored policy's object starts with this: its base, then the scratch
 * for score ranking. */
typedef struct {
    qi_kv_policy base;
    qi_kv_scratch scratch;
} qi_kv_scored;

/* create()'s shared tail for a scored policy: a zeroed object of size
 * bytes (a struct whose first member is a qi_kv_scored) with its interface
 * set and a scratch of QI_KV_SCRATCH_INIT items; QI_ERR_NOMEM naming the
 * policy, nothing allocated, on failure. */
qi_status qi_kv_scored_new(const qi_kv_policy_i *pi, size_t size, qi_kv_policy **out, qi_err *err);
/* Frees such an object (its scratch, then it); NULL is a no-op. A policy
 * with no other allocation uses it as its free(). */
void qi_kv_scored_free(qi_kv_policy *p);

/* The `pool` parameter of an observation window's vote (snapkv, qinfer
 * judge=): an odd kernel in [1, 1023], default 7. */
qi_status qi_kv_params_pool(const qi_params *params, const char *who, long *pool, qi_err *err);

/* SnapKV's pooled vote: out[slot] = the largest obs[] among the tokens
 * within kernel / 2 places of it in position order (a max pool over the
 * tokens the stream holds, which after eviction are not every position).
 * items needs room for v->n; kernel 1 copies obs. */
void qi_kv_rank_pool_max(const qi_kv_view *v, const float *obs, int kernel, qi_kv_item *items, float *out);

/* Quest's bound on what a block of keys can score against a group of
 * queries: for each query head h, u_h = sum_d max(q[h][d] min_d,
 * q[h][d] max_d), with min and max the block's element-wise key bounds
 * (bound[0..D) and bound[D..2D)); the result is the sum of u_h over the
 * group's heads. Each u_h is at least q[h] . k for every key k the bounds
 * hold, also in float: each term is at least q[h][d] k[d] (rounding is
 * monotone), and both are summed in the same order, d ascending, from 0.
 * The heads' bounds are summed because one attention call reads one
 * block list for a KV head's whole group (grouped-query attention). */
float qi_kv_bound_score(const float *q, int group, int D, const float *bound);

/* floor(budget * frac), the heavy-hitter share of a budget. The 1e-9
 * allowance absorbs binary rounding, so that 100 * 0.29 gives 29 and not
 * 28 (0.29 is stored as 0.28999...). */
static inline int qi_kv_heavy_count(int budget, double frac) {
    int h = (int)floor((double)budget * frac + 1e-9);
    return h < 0 ? 0 : h > budget ? budget : h;
}

/* The budget a policy sizes its position window from: qi_kv_view's
 * layer_budget, or budget where that is 0. The policy's window is computed
 * at this budget and its scored places are what v->budget leaves beyond
 * the window; without ada= the two budgets are equal. */
static inline int qi_kv_view_layer_budget(const qi_kv_view *v) {
    return v->layer_budget > 0 ? v->layer_budget : v->budget;
}

/* The split of h2o, keyformer and scissorhands: the recent window is
 * budget - floor(budget x heavy) at the layer's budget, capped at the
 * view's budget, and the scored places are the rest of the view's budget
 * (Ada-KV moves only these between heads). */
static inline int qi_kv_recent_of(int layer_budget, double heavy) {
    return layer_budget - qi_kv_heavy_count(layer_budget, heavy);
}
static inline void qi_kv_split_recent(const qi_kv_view *v, double heavy, int *recent, int *scored) {
    int r = qi_kv_recent_of(qi_kv_view_layer_budget(v), heavy);
    if (r > v->budget) r = v->budget;
    *recent = r;
    *scored = v->budget - r;
}

#endif

/* snapkv.c - SnapKV (Li et al., "SnapKV: LLM Knows What You are Looking
 * for Before Generation", 2024).
 *
 * The end of a prompt (the question, the instruction) already attends to
 * what generation will need. SnapKV reads the whole prompt with the full
 * cache, then lets an observation window of the prompt's last `window`
 * queries vote: each token's vote is the weight those queries gave it
 * (summed over them and the stream's query heads), max-pooled over its
 * `pool` neighbours so that a chosen token brings its context along; the
 * prompt is then cut to the window itself plus the best-voted tokens.
 *
 * Here: obs_window() asks the cache for the window's weights (v->obs) on
 * the segment that ends a prompt, and select() keeps every token while more
 * of the prompt follows (v->prompt_more), so a prompt longer than a chunk
 * is judged whole, as in the paper. On the prompt's last segment observe()
 * sets each token's score to its pooled vote, and select() keeps the
 * `window` newest tokens (capped at the budget) plus the best scores.
 *
 * The paper compresses the prompt once and keeps every generated token;
 * with a budget that is a share of the sequence, generation must evict
 * too. The decode-time rule is the same selection with the vote carried
 * on: each decode step adds the new query's weights to the scores (the
 * observation window grows by the generated queries, unpooled), and the
 * `window` newest plus the best scores are kept. Where there is no prompt
 * (decode-mode perplexity feeds one token a step), that rule is all there
 * is: H2O with a `window`-token recent window. Evicted tokens are dropped.
 * Pooling sorts the stream by position in the scratch, which observe()
 * grows when needed, once per prompt; if that fails the vote is unpooled.
 */
#include "kv/kv_policy.h"
#include "kv/rank_int.h"

typedef struct {
    qi_kv_scored sc;
    int window, pool;
} snapkv_policy;

extern const qi_kv_policy_i qi_kv_snapkv_policy;

static qi_status snapkv_create(const qi_params *params, int n_layer, qi_kv_policy **out, qi_err *err) {
    static const char *const known[] = {"window", "pool", NULL};
    const char *who = "snapkv";
    long window, pool;
    qi_status st = qi_params_check_known(params, who, known, err);
    if (!st) st = qi_params_int(params, who, "window", 32, 1, 65536, &window, err);
    if (!st) st = qi_kv_params_pool(params, who, &pool, err);
    if (!st) st = qi_kv_scored_new(&qi_kv_snapkv_policy, sizeof(snapkv_policy), out, err);
    if (st) return st;
    snapkv_policy *p = (snapkv_policy *)*out;
    p->window = (int)window;
    p->pool = (int)pool;
    return QI_OK;
}

static void snapkv_by_position(const qi_kv_policy *pp, int budget, int *oldest, int *newest) {
    const int w = ((const snapkv_policy *)pp)->window;
    *oldest = 0;
    *newest = w < budget ? w : budget;
}

static int snapkv_obs_window(const qi_kv_policy *pp) { return ((const snapkv_policy *)pp)->window; }

static void snapkv_observe(qi_kv_policy *pp, qi_kv_view *v, const float *attn) {
    snapkv_policy *p = (snapkv_policy *)pp;
    if (!v->obs) {
        for (int i = 0; i < v->n; i++) v->score[i] += attn[i];
        return;
    }
    if (p->pool > 1 && qi_kv_scratch_reserve(&p->sc.scratch, v->n))
        qi_kv_rank_pool_max(v, v->obs, p->pool, p->sc.scratch.items, v->score);
    else
        for (int i = 0; i < v->n; i++) v->score[i] = v->obs[i];
}

static void snapkv_select(qi_kv_policy *pp, const qi_kv_view *v, uint8_t *fate) {
    snapkv_policy *p = (snapkv_policy *)pp;
    const int budget = v->budget;
    qi_kv_rank_begin(v, false, fate);
    if (v->prompt_more) {
        qi_kv_rank_finish(v, fate, QI_KV_KEEP);
        return;
    }
    const int lb = qi_kv_view_layer_budget(v), w = p->window < lb ? p->window : lb,
              recent = w < budget ? w : budget;
    qi_kv_rank_recent_top(v, fate, &p->sc.scratch, recent, budget - recent, NULL, QI_KV_DROP);
}

const qi_kv_policy_i qi_kv_snapkv_policy = {
    .version = QI_KV_POLICY_VERSION,
    .name = "snapkv",
    .summary = "SnapKV: the prompt judged at its end by the votes of its last queries, pooled",
    .params = "window=32,pool=7",
    .create = snapkv_create,
    .observe = snapkv_observe,
    .select = snapkv_select,
    .obs_window = snapkv_obs_window,
    .by_position = snapkv_by_position,
    .free = qi_kv_scored_free,
};

/* quest.c - Quest, query-aware selection of whole KV blocks (Tang et al.,
 * "Quest: Query-Aware Sparsity for Efficient Long-Context LLM Inference",
 * ICML 2024).
 *
 * Quest evicts nothing. The whole cache stays in the working tier, and at
 * each decode step attention reads only the blocks whose keys can score
 * highest against this step's query: for a block with element-wise key
 * bounds min and max, sum_d max(q_d min_d, q_d max_d) is at least q . k for
 * every key k in it (qi_kv_bound_score), and the blocks with the largest
 * bounds are read. The cache keeps the bounds (engine/kv.c, updated as rows
 * are written) and calls pick() before attention (kv_policy.h); the budget
 * counts the tokens attention reads.
 *
 * The rule, per (sequence, layer, KV head) on a decode step, in pages
 * ("blocks" below; `page` tokens, default 16 as in the paper; the figures
 * in 2-3 were measured with pages of 64, the cache's block size):
 *   1. the block holding the newest token is always read (the query's own
 *      key and its neighbours; Quest keeps the current page too);
 *   2. with first=true (the default), the first block too if the budget
 *      leaves room for a whole block beside the newest: the attention
 *      sinks of StreamingLLM live in the first tokens, and SmolLM2 (no BOS
 *      token) uses its first tokens as sinks; reading block 0 always took
 *      decode-mode perplexity at 50% from +8.1% to +6.8% of the full
 *      cache's, at 25% from +30.4% to +25.8%, with recent=0
 *      (policies/kv/README.md);
 *   3. the `recent` blocks before the newest (default 1), while whole
 *      blocks fit: the newest block holds from 1 to 64 tokens, so without
 *      it the tokens just before the query are read only when their
 *      block's bound wins a place; the paper's pages of 16 tokens make its
 *      newest page a recent window of that size, and reading one block
 *      more is the same idea at our block size. It took decode-mode
 *      perplexity at 50% from +6.8% to +5.1%, at 25% from +25.8% to
 *      +16.7%, and top-1 agreement with the full cache over 256 generated
 *      tokens from 91.4% to 97.3% (recent=2: +5.6% at 50%, +13.9% at 25%);
 *   4. then the other blocks by their bound, best first, while a whole
 *      block still fits in the budget: floor((budget - read so far) /
 *      block) of them. Ties go to the newer block.
 * Prompt steps (several tokens at once) read the whole cache, as Quest's
 * prefill does. Layers below full_layers read everything (the paper leaves
 * the first two layers dense; here that read more and was worse, +8.9%
 * against +6.8% at 50% with recent=0, so the default is none). With
 * full_share=true their reads count against the budget: the other layers
 * get (n_layer x budget - full_layers x tokens held) / (n_layer -
 * full_layers) each, so the tokens read, averaged over all layers, stay
 * within the budget and the comparison with the other policies is fair.
 *
 * Pages: `page` tokens (a power of two, default 16). The cache keeps key
 * bounds per 16 tokens and shows those as the view's blocks; a page of
 * more is its blocks merged (element-wise min and max: exactly the bounds
 * of all its keys, so pages of 64 choose as blocks of 64 did), pages of 16
 * are the paper's. Pages of 16 were measured better than 64 on both models
 * (decode-mode perplexity at 50%: SmolLM2 +3.03% against +5.08% of the
 * full cache's, Gemma 3 +1.17% against +2.12%; at 25% +10.2% against
 * +16.7%) and in agreement over 256 generated tokens (98.4% against
 * 97.3%), for a policy share of 6.7% of a batch-16 step at 512-token
 * contexts against 4.9%, so they are the default. The attention call reads a chosen 16-token piece of a
 * block through a pointer into it, so no K or V is copied. Every page is
 * whole but the newest; if the newest alone is over the budget, only its
 * part that the cache lets a pick read over it (view->tail: the pages of
 * the cache's newest block of 64) is read, which for pages of at most 64
 * is all of it, as before. Grouped-query attention: one call reads one
 * page list for a KV head's whole group of query heads, so the group
 * chooses together, by the bounds summed over its heads (the paper chooses
 * per head, on a model without GQA). If the ranking scratch cannot grow,
 * the newest pages that fit are read (a choice that needs no memory).
 */
#include <string.h>

#include "kv/kv_policy.h"
#include "kv/rank_int.h"

typedef struct {
    qi_kv_scored s;
    bool first, full_share;
    int recent, full_layers, page;
} quest_policy;

extern const qi_kv_policy_i qi_kv_quest_policy;

/* The most values per head a pick view may have: the attention call's
 * limit (a query of at most 1024 values). */
#define QUEST_MAX_D 1024

static qi_status quest_create(const qi_params *params, int n_layer, qi_kv_policy **out, qi_err *err) {
    static const char *const known[] = {"first", "recent", "full_layers", "page", "full_share", NULL};
    bool first, full_share;
    long recent, full_layers, page;
    qi_status st = qi_params_check_known(params, "quest", known, err);
    if (!st) st = qi_params_bool(params, "quest", "first", true, &first, err);
    if (!st) st = qi_params_int(params, "quest", "recent", 1, 0, 1 << 20, &recent, err);
    if (!st) st = qi_params_int(params, "quest", "full_layers", 0, 0, n_layer, &full_layers, err);
    if (!st) st = qi_params_bool(params, "quest", "full_share", false, &full_share, err);
    if (!st) st = qi_params_int(params, "quest", "page", 16, 1, 4096, &page, err);
    if (!st && (page & (page - 1)))
        st = QI_ERR(err, QI_ERR_INVALID, "quest: parameter 'page' must be a power of two in [1, 4096], got '%s'",
                    qi_params_get(params, "page"));
    if (!st) st = qi_kv_scored_new(&qi_kv_quest_policy, sizeof(quest_policy), out, err);
    if (st) return st;
    quest_policy *p = (quest_policy *)*out;
    p->first = first;
    p->recent = (int)recent;
    p->full_layers = (int)full_layers;
    p->full_share = full_share;
    p->page = (int)page;
    return QI_OK;
}

/* Never evicts: what attention reads is chosen in pick(). */
static void quest_select(qi_kv_policy *p, const qi_kv_view *v, uint8_t *fate) {
    for (int i = 0; i < v->n; i++) fate[i] = QI_KV_KEEP;
}

static bool quest_exempt(const qi_kv_policy *pp, int layer) { return layer < ((const quest_policy *)pp)->full_layers; }

/* Page u's bound score: its view blocks' bounds merged (element-wise min
 * of the minima, max of the maxima: exactly the bounds of all its keys),
 * then scored as one block; one view block is scored in place. */
static float page_score(const qi_kv_pick_view *v, int u, int g) {
    const int D = v->D, b0 = u * g, b1 = b0 + g < v->n_blocks ? b0 + g : v->n_blocks;
    if (b1 - b0 == 1) return qi_kv_bound_score(v->q, v->group, D, v->bounds + (size_t)b0 * 2 * D);
    float m[2 * QUEST_MAX_D];
    memcpy(m, v->bounds + (size_t)b0 * 2 * D, sizeof(float) * 2 * (size_t)D);
    for (int b = b0 + 1; b < b1; b++) {
        const float *mn = v->bounds + (size_t)b * 2 * D, *mx = mn + D;
        for (int d = 0; d < D; d++) {
            m[d] = mn[d] < m[d] ? mn[d] : m[d];
            m[D + d] = mx[d] > m[D + d] ? mx[d] : m[D + d];
        }
    }
    return qi_kv_bound_score(v->q, v->group, D, m);
}

/* Write page u's view blocks to blocks[n..]; returns the new count. */
static int put_page(const qi_kv_pick_view *v, int u, int g, int *blocks, int n) {
    for (int b = u * g; b < (u + 1) * g && b < v->n_blocks; b++) blocks[n++] = b;
    return n;
}

/* The budget of a picked layer: the view's, or with full_share the part of
 * n_layer x budget that the full layers' reads (every working token) leave
 * to the others, shared evenly (at least 1), so that the tokens read,
 * averaged over all layers, stay within the budget. */
static long pick_budget(const quest_policy *p, const qi_kv_pick_view *v) {
    if (!p->full_share || p->full_layers <= 0 || p->full_layers >= v->n_layer) return v->budget;
    const long b = ((long)v->n_layer * v->budget - (long)p->full_layers * v->n) / (v->n_layer - p->full_layers);
    return b < 1 ? 1 : b;
}

static int quest_pick(qi_kv_policy *pp, const qi_kv_pick_view *v, int *blocks) {
    quest_policy *p = (quest_policy *)pp;
    /* pages of `page` tokens, each g of the view's blocks (at least one) */
    const int g = p->page > v->block ? p->page / v->block : 1;
    const long unit = (long)g * v->block;
    if (v->D > QUEST_MAX_D && g > 1) { /* no room to merge bounds: the newest block alone */
        blocks[0] = v->newest;
        return 1;
    }
    const int newest = v->newest / g; /* the page holding the newest token: the last */
    const long budget = pick_budget(p, v);
    long room = budget - (v->n - (long)newest * unit); /* the newest page holds the rest */
    if (room < 0) { /* it alone is over the budget: its part that the cache lets a pick read over it */
        const int tail = v->tail > 1 ? v->tail : 1;
        int n = 0;
        for (int b = newest * g > v->n_blocks - tail ? newest * g : v->n_blocks - tail; b < v->n_blocks; b++)
            blocks[n++] = b;
        return n;
    }
    int n = put_page(v, newest, g, blocks, 0);
    const bool first = p->first && newest > 0 && room >= unit;
    if (first) {
        n = put_page(v, 0, g, blocks, n);
        room -= unit;
    }
    const int lo = first ? 1 : 0;
    int hi = newest; /* the candidates left: pages lo..hi-1, all full */
    for (int r = 0; r < p->recent && hi > lo && room >= unit; r++) {
        n = put_page(v, --hi, g, blocks, n);
        room -= unit;
    }
    const int cand = hi - lo;
    long k = room > 0 ? room / unit : 0;
    if (k > cand) k = cand;
    if (k <= 0) return n;
    if (k < cand && qi_kv_scratch_reserve(&p->s.scratch, cand)) {
        qi_kv_item *it = p->s.scratch.items;
        for (int u = lo; u < hi; u++) it[u - lo] = (qi_kv_item){.score = page_score(v, u, g), .pos = u, .slot = u};
        qi_kv_rank_top_by_score(it, cand, (int)k);
        for (int i = 0; i < k; i++) n = put_page(v, it[i].slot, g, blocks, n);
    } else { /* every candidate fits, or no scratch: the newest k */
        for (int u = hi - 1; u >= hi - k; u--) n = put_page(v, u, g, blocks, n);
    }
    return n;
}

const qi_kv_policy_i qi_kv_quest_policy = {
    .version = QI_KV_POLICY_VERSION,
    .name = "quest",
    .summary = "Quest: attention reads the blocks whose key bounds score best against the query; nothing evicted",
    .params = "first=true,recent=1,full_layers=0,page=16,full_share=false",
    .create = quest_create,
    .select = quest_select,
    .exempt = quest_exempt,
    .pick = quest_pick,
    .free = qi_kv_scored_free,
};

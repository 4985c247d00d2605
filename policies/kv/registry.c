/* registry.c - the KV policies by name, and the wrappers the cache calls.
 *
 * The table is an X-macro list so that adding a policy is one line: the
 * list declares each policy's interface (qi_kv_<name>_policy, defined in
 * <name>.c) and fills the NULL-terminated array. A linker-section or
 * constructor-based self-registration would need no line at all, but it is
 * not portable C11 and makes the set of policies invisible in the source.
 *
 * The wrappers are the only way the cache reaches a policy. They fill in
 * the optional members' defaults and check every select() result before
 * the cache applies it: each fate written and in range (the fate array is
 * poisoned first, so a fate the policy forgot to write is caught), and no
 * more KEEP than the budget unless the layer is exempt (or a prompt is still
 * being read by a policy that judges prompts at their end). A broken policy is
 * then a QI_ERR_BACKEND naming the policy, not a silently wrong cache.
 * The same holds for pick() (a policy that chooses the blocks attention
 * reads, quest): qi_kv_policy_pick checks the blocks against the view and
 * the budget, which for such a policy counts attended tokens, not kept
 * ones (select_within does not hold it to a budget of kept tokens).
 *
 * The wrappers also apply the options every policy takes: pyramid=, the
 * layer budgets of PyramidKV (Cai et al., "PyramidKV: Dynamic KV Cache
 * Compression based on Pyramidal Information Funneling", 2024), by showing
 * the policy a view with its layer's budget and holding it to that; and
 * ada=, the head budgets of Ada-KV (Feng et al., "Ada-KV: Optimizing KV
 * Cache Eviction by Adaptive Budget Allocation for Efficient LLM
 * Inference", 2024): qi_kv_policy_decide observes a (sequence, layer)'s KV
 * heads, leaves each head the tokens its policy keeps by position (its
 * by_position(): sinks, recent window), shares the rest of the layer's
 * budget among them by their ranked scores (rank.c) and shows each
 * select() its head's share. Sharing the whole budget instead shrank a
 * head's recent window with its share, and a head whose attention sat on
 * a few old tokens lost its recent context (h2o at 50% went from +20% to
 * +65% perplexity). Both are options of
 * the registry rather than of each policy because they only move budget
 * between the streams a policy already decides; the policy's rule inside
 * a stream is unchanged. Ada-KV ranks on the policy's own scores, so a
 * policy without observe() (full, window, streaming) has none and refuses
 * ada=.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv/kv_policy.h"
#include "kv/rank_int.h"

#define QI_KV_POLICY_LIST(X)                                                                                   \
    X(full)                                                                                                    \
    X(window)                                                                                                  \
    X(streaming)                                                                                               \
    X(h2o)                                                                                                     \
    X(qinfer)                                                                                                  \
    X(tova)                                                                                                    \
    X(scissorhands)                                                                                            \
    X(keyformer)                                                                                               \
    X(snapkv)                                                                                                  \
    X(quest)                                                                                                   \
    X(sparq)

#define QI_KV_DECLARE(name) extern const qi_kv_policy_i qi_kv_##name##_policy;
#define QI_KV_ENTRY(name) &qi_kv_##name##_policy,
QI_KV_POLICY_LIST(QI_KV_DECLARE)
const qi_kv_policy_i *const qi_kv_policies[] = {QI_KV_POLICY_LIST(QI_KV_ENTRY) NULL};

const qi_kv_policy_i *qi_kv_policy_find(const char *name) {
    if (!name) return NULL;
    for (const qi_kv_policy_i *const *it = qi_kv_policies; *it; it++)
        if (strcmp((*it)->name, name) == 0) return *it;
    return NULL;
}

qi_status qi_kv_policy_create(const char *name, const qi_params *params, int n_layer, qi_kv_policy **out,
                              qi_err *err) {
    *out = NULL;
    const qi_kv_policy_i *pi = qi_kv_policy_find(name);
    if (!pi) {
        char list[256] = "";
        size_t len = 0;
        for (const qi_kv_policy_i *const *it = qi_kv_policies; *it; it++) {
            int w = snprintf(list + len, sizeof list - len, "%s%s", len ? ", " : "", (*it)->name);
            if (w < 0 || (size_t)w >= sizeof list - len) break;
            len += (size_t)w;
        }
        return QI_ERR(err, QI_ERR_INVALID, "unknown KV policy '%s' (known: %s)", name ? name : "(null)", list);
    }
    if (pi->version != QI_KV_POLICY_VERSION)
        return QI_ERR(err, QI_ERR_UNSUPPORTED, "KV policy '%s' has interface version %u, the cache speaks %u",
                      pi->name, pi->version, QI_KV_POLICY_VERSION);
    if (n_layer < 1) return QI_ERR(err, QI_ERR_INVALID, "%s: n_layer must be >= 1, got %d", pi->name, n_layer);
    /* the registry's options, then the rest for the policy */
    qi_params own;
    qi_params_init(&own);
    double pyramid = 0.0, ada = 0.0;
    for (int i = 0; params && i < params->n; i++)
        if (strcmp(params->items[i].key, "pyramid") != 0 && strcmp(params->items[i].key, "ada") != 0)
            own.items[own.n++] = params->items[i];
    qi_status st = qi_params_double(params, pi->name, "pyramid", 0.0, 0.0, 1.0, &pyramid, err);
    if (!st && !(pyramid < 1.0))
        st = QI_ERR(err, QI_ERR_INVALID, "%s: parameter 'pyramid' must be a number in [0, 1), got '%s'", pi->name,
                    qi_params_get(params, "pyramid"));
    if (!st) st = qi_params_double(params, pi->name, "ada", 0.0, 0.0, 1.0, &ada, err);
    if (!st && ada > 0 && !pi->observe)
        st = QI_ERR(err, QI_ERR_INVALID,
                    "%s: parameter 'ada' shares a layer's budget among its KV heads by the policy's scores, and "
                    "'%s' keeps none (name a scored policy: h2o, qinfer, tova, scissorhands, keyformer, snapkv)",
                    pi->name, pi->name);
    if (st) return st;
    qi_kv_policy *p = NULL;
    st = pi->create(&own, n_layer, &p, err);
    if (st) return st;
    if (!p || p->iface != pi) {
        if (p && p->iface && p->iface->free) p->iface->free(p);
        return QI_ERR(err, QI_ERR_BACKEND, "KV policy '%s': create returned no policy of its own", pi->name);
    }
    p->pyramid = pyramid;
    p->ada = ada;
    p->n_layer = n_layer;
    *out = p;
    return QI_OK;
}

/* The budgeted layers' cumulative budget before the r-th of nb: the sum of
 * budget * (1 + B * (1 - 2j / (nb - 1))) over j < r, in closed form, which
 * is budget * nb exactly at r = nb. */
static double pyramid_cum(double budget, double B, int r, int nb) {
    return budget * r + budget * B * ((double)r - (double)r * (r - 1) / (nb - 1));
}

int qi_kv_policy_layer_budget(const qi_kv_policy *p, int layer, int budget) {
    if (!(p->pyramid > 0) || p->n_layer < 2) return budget;
    int nb = 0, r = -1;
    for (int l = 0; l < p->n_layer; l++) {
        if (qi_kv_policy_exempt(p, l)) continue;
        if (l == layer) r = nb;
        nb++;
    }
    if (r < 0 || nb < 2) return budget;
    const long b = lround(pyramid_cum(budget, p->pyramid, r + 1, nb)) - lround(pyramid_cum(budget, p->pyramid, r, nb));
    return b < 1 ? 1 : b > INT32_MAX ? INT32_MAX : (int)b;
}

void qi_kv_policy_observe(qi_kv_policy *p, qi_kv_view *v, const float *attn) {
    if (p->iface->observe && v->n > 0) p->iface->observe(p, v, attn);
}

bool qi_kv_policy_exempt(const qi_kv_policy *p, int layer) {
    return p->iface->exempt ? p->iface->exempt(p, layer) : false;
}

bool qi_kv_policy_probe(const qi_kv_policy *p, long step) {
    return p->iface->probe ? p->iface->probe(p, step) : false;
}

int qi_kv_policy_obs_window(const qi_kv_policy *p) {
    const int w = p->iface->obs_window ? p->iface->obs_window(p) : 0;
    return w > 0 ? w : 0;
}

bool qi_kv_policy_picks(const qi_kv_policy *p) { return p->iface->pick != NULL; }

bool qi_kv_policy_picks_tokens(const qi_kv_policy *p) { return p->iface->pick && p->iface->pick_tokens; }

static int cmp_int(const void *a, const void *b) {
    const int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* The tokens of block b of a pick view: every block is full but the last. */
static int pick_block_tokens(const qi_kv_pick_view *v, int b) {
    return b < v->n_blocks - 1 ? v->block : v->n - b * v->block;
}

qi_status qi_kv_policy_pick(qi_kv_policy *p, const qi_kv_pick_view *v, int *blocks, int *n_out, qi_err *err) {
    const char *name = p->iface->name;
    *n_out = 0;
    if (!p->iface->pick) return QI_ERR(err, QI_ERR_UNSUPPORTED, "KV policy '%s' picks no blocks", name);
    if (v->n < 1 || v->block < 1 || v->n_blocks != (v->n + v->block - 1) / v->block || v->budget < 1 ||
        v->newest != v->n_blocks - 1 || v->group < 1 || v->D < 1 || !v->q || !blocks ||
        (p->iface->pick_tokens ? !v->k_blk || !v->k_cols || v->block != 1 : !v->bounds) || v->k_tail < 0 ||
        v->k_tail > v->n)
        return QI_ERR(err, QI_ERR_INVALID,
                      "KV policy '%s': bad pick view (n %d, block %d, n_blocks %d, newest %d, budget %d, k_tail %d)",
                      name, v->n, v->block, v->n_blocks, v->newest, v->budget, v->k_tail);
    qi_kv_pick_view lv = *v;
    lv.budget = qi_kv_policy_layer_budget(p, v->layer, v->budget);
    const int n = p->iface->pick(p, &lv, blocks);
    if (n < 1 || n > v->n_blocks)
        return QI_ERR(err, QI_ERR_BACKEND,
                      "KV policy '%s' broke its contract: picked %d blocks of %d (layer %d, KV head %d)", name, n,
                      v->n_blocks, v->layer, v->kv_head);
    /* ascending (a token picker's hundreds of picks usually come sorted);
     * distinctness is checked on the way */
    for (int i = 1; i < n; i++)
        if (blocks[i - 1] > blocks[i]) {
            qsort(blocks, (size_t)n, sizeof *blocks, cmp_int);
            break;
        }
    long tokens = 0;
    for (int i = 0; i < n; i++) {
        if (blocks[i] < 0 || blocks[i] >= v->n_blocks || (i > 0 && blocks[i] == blocks[i - 1]))
            return QI_ERR(err, QI_ERR_BACKEND,
                          "KV policy '%s' broke its contract: picked block %d %s (%d blocks; layer %d, KV head %d)",
                          name, blocks[i], blocks[i] < 0 || blocks[i] >= v->n_blocks ? "out of range" : "twice",
                          v->n_blocks, v->layer, v->kv_head);
        tokens += pick_block_tokens(v, blocks[i]);
    }
    if (blocks[n - 1] != v->newest)
        return QI_ERR(err, QI_ERR_BACKEND,
                      "KV policy '%s' broke its contract: the newest block (%d) was not picked (layer %d, KV head %d)",
                      name, v->newest, v->layer, v->kv_head);
    const int tail = v->tail > 1 ? v->tail : 1; /* the newest blocks a pick may read over the budget */
    if (tokens > lv.budget && blocks[0] < v->n_blocks - tail)
        return QI_ERR(err, QI_ERR_BACKEND,
                      "KV policy '%s' broke its contract: picked %ld tokens, over the budget of %d (layer %d, KV "
                      "head %d)",
                      name, tokens, lv.budget, v->layer, v->kv_head);
    *n_out = n;
    return QI_OK;
}

bool qi_kv_policy_fetches(const qi_kv_policy *p) {
    return p->iface->fetch && (!p->iface->fetching || p->iface->fetching(p));
}

bool qi_kv_policy_fetch_off(qi_kv_policy *p) { return p->iface->fetch_off && p->iface->fetch_off(p); }

qi_status qi_kv_policy_fetch(qi_kv_policy *p, const qi_kv_pick_view *v, int *tokens, int *n_out, qi_err *err) {
    const char *name = p->iface->name;
    *n_out = 0;
    if (!qi_kv_policy_fetches(p)) return QI_ERR(err, QI_ERR_UNSUPPORTED, "KV policy '%s' fetches no tokens", name);
    if (v->n < 0 || v->budget < 0 || v->group < 1 || v->D < 1 || !v->q || !tokens ||
        (v->n > 0 && (!v->k_blk || !v->k_cols)) || v->k_tail < 0 || v->k_tail > v->n)
        return QI_ERR(err, QI_ERR_INVALID, "KV policy '%s': bad fetch view (n %d, budget %d, k_tail %d)", name,
                      v->n, v->budget, v->k_tail);
    if (v->n == 0 || v->budget == 0) return QI_OK;
    const int n = p->iface->fetch(p, v, tokens);
    if (n < 0 || n > v->budget || n > v->n)
        return QI_ERR(err, QI_ERR_BACKEND,
                      "KV policy '%s' broke its contract: fetched %d tokens of %d, with room for %d (layer %d, KV "
                      "head %d)",
                      name, n, v->n, v->budget, v->layer, v->kv_head);
    for (int i = 1; i < n; i++)
        if (tokens[i - 1] > tokens[i]) {
            qsort(tokens, (size_t)n, sizeof *tokens, cmp_int);
            break;
        }
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= v->n || (i > 0 && tokens[i] == tokens[i - 1]))
            return QI_ERR(err, QI_ERR_BACKEND,
                          "KV policy '%s' broke its contract: fetched token %d %s (%d offloaded; layer %d, KV head "
                          "%d)",
                          name, tokens[i], tokens[i] < 0 || tokens[i] >= v->n ? "out of range" : "twice", v->n,
                          v->layer, v->kv_head);
    *n_out = n;
    return QI_OK;
}

const char *qi_kv_policy_name(const qi_kv_policy *p) { return p ? p->iface->name : "(none)"; }

void qi_kv_policy_free(qi_kv_policy *p) {
    if (!p) return;
    qi_free(p->ada_items);
    p->iface->free(p);
}

bool qi_kv_policy_heads_together(const qi_kv_policy *p) { return p->ada > 0; }

static qi_status bad_view(const qi_kv_policy *p, const qi_kv_view *v, const uint8_t *fate, qi_err *err) {
    if (v->n < 0 || v->budget < 1 || (v->n > 0 && !fate))
        return QI_ERR(err, QI_ERR_INVALID, "KV policy '%s': bad view (n %d, budget %d, fate %s)", p->iface->name,
                      v->n, v->budget, fate ? "set" : "NULL");
    return QI_OK;
}

/* select() shown the view with `budget` (its layer's, or its head's share
 * of the layer's, layer_budget), and held to it. */
static qi_status select_within(qi_kv_policy *p, const qi_kv_view *v, int budget, int layer_budget, uint8_t *fate,
                               qi_err *err) {
    const char *name = p->iface->name;
    if (v->n == 0) return QI_OK;
    qi_kv_view lv = *v;
    lv.budget = budget;
    lv.layer_budget = layer_budget;
    v = &lv;
    memset(fate, 0xFF, (size_t)v->n); /* poison: an unwritten fate is caught below */
    p->iface->select(p, v, fate);
    int keep = 0;
    for (int i = 0; i < v->n; i++) {
        if (fate[i] > QI_KV_DROP)
            return QI_ERR(err, QI_ERR_BACKEND,
                          "KV policy '%s' broke its contract: token %d (position %d) got fate %u, not keep/offload/"
                          "drop (layer %d, KV head %d)",
                          name, i, (int)v->pos[i], (unsigned)fate[i], v->layer, v->kv_head);
        keep += fate[i] == QI_KV_KEEP;
    }
    /* a policy that picks blocks holds everything: its budget binds what attention reads (qi_kv_policy_pick) */
    if (keep > v->budget && !qi_kv_policy_exempt(p, v->layer) && !qi_kv_policy_picks(p) &&
        !(v->prompt_more && qi_kv_policy_obs_window(p) > 0))
        return QI_ERR(err, QI_ERR_BACKEND,
                      "KV policy '%s' broke its contract: kept %d tokens, over the budget of %d (layer %d, KV "
                      "head %d)",
                      name, keep, v->budget, v->layer, v->kv_head);
    return QI_OK;
}

qi_status qi_kv_policy_select(qi_kv_policy *p, const qi_kv_view *v, uint8_t *fate, qi_err *err) {
    qi_status st = bad_view(p, v, fate, err);
    if (st) return st;
    const int lb = qi_kv_policy_layer_budget(p, v->layer, v->budget);
    return select_within(p, v, lb, lb, fate, err);
}

/* The heads' budgets under ada=, into out[n]; false (uniform budgets) when
 * the layer is exempt, a prompt is still being read by a policy that
 * judges it at its end, or the scratch cannot grow. Each head's window
 * (the tokens its policy keeps by position at the layer's budget) is
 * marked in its fate array, which select() overwrites afterwards, and
 * only the other tokens compete for the rest of the budget. */
static bool ada_budgets(qi_kv_policy *p, const qi_kv_view *v, int n, int budget, uint8_t *const *fate, int *out) {
    if (qi_kv_policy_exempt(p, v[0].layer) || (v[0].prompt_more && qi_kv_policy_obs_window(p) > 0)) return false;
    long total = 0;
    for (int h = 0; h < n; h++) total += v[h].n;
    if (total > INT32_MAX) return false;
    if (total > p->ada_cap) {
        qi_kv_item *it = qi_realloc(p->ada_items, (size_t)total * sizeof *it);
        if (!it) return false;
        p->ada_items = it;
        p->ada_cap = (int)total;
    }
    int oldest = 0, newest = 0;
    if (p->iface->by_position) p->iface->by_position(p, budget, &oldest, &newest);
    if (oldest < 0) oldest = 0;
    if (newest < 0) newest = 0;
    if (oldest > budget) oldest = budget;
    if (newest > budget - oldest) newest = budget - oldest;
    for (int h = 0; h < n; h++) {
        qi_kv_rank_begin(&v[h], true, fate[h]);
        qi_kv_rank_mark_by_pos(&v[h], fate[h], oldest, false, QI_KV_KEEP);
        qi_kv_rank_mark_by_pos(&v[h], fate[h], newest, true, QI_KV_KEEP);
    }
    qi_kv_rank_ada_budgets(v, n, budget, oldest + newest, p->ada, p->iface->rank, (const uint8_t *const *)fate,
                           p->ada_items, out);
    return true;
}

/* Head budgets for at most this many KV heads at once; a model with more
 * is decided in groups of this many. */
#define ADA_MAX_HEADS 64

qi_status qi_kv_policy_decide(qi_kv_policy *p, qi_kv_view *v, int n, const float *const *attn, uint8_t *const *fate,
                              qi_err *err) {
    qi_status st;
    for (int h = 0; h < n; h++)
        if ((st = bad_view(p, &v[h], fate[h], err))) return st;
    if (!(p->ada > 0) || n < 2) {
        for (int h = 0; h < n; h++) {
            qi_kv_policy_observe(p, &v[h], attn[h]);
            if ((st = qi_kv_policy_select(p, &v[h], fate[h], err))) return st;
        }
        return QI_OK;
    }
    for (int h0 = 0; h0 < n; h0 += ADA_MAX_HEADS) {
        const int g = n - h0 < ADA_MAX_HEADS ? n - h0 : ADA_MAX_HEADS;
        int budgets[ADA_MAX_HEADS];
        for (int h = h0; h < h0 + g; h++) qi_kv_policy_observe(p, &v[h], attn[h]);
        const int lb = qi_kv_policy_layer_budget(p, v[h0].layer, v[h0].budget);
        const bool ada = ada_budgets(p, v + h0, g, lb, fate + h0, budgets);
        for (int h = h0; h < h0 + g; h++) {
            /* a head with nothing to keep still shows select() a budget of one */
            const int b = !ada ? lb : budgets[h - h0] > 0 ? budgets[h - h0] : 1;
            if ((st = select_within(p, &v[h], b, lb, fate[h], err))) return st;
        }
    }
    return QI_OK;
}

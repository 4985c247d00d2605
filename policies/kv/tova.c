/* tova.c - TOVA, Token Omission Via Attention (Oren et al., "Transformers
 * are Multi-State RNNs", 2024).
 *
 * TOVA keeps the tokens the current query attends to most: at every step
 * the token with the lowest attention weight from the newest query is
 * dropped, so the cache holds the `budget` tokens with the highest weight
 * this step. No history at all: a token's score is this step's weight, not
 * a sum, which is what separates it from H2O (whose sums favour old tokens)
 * and what the paper argues is enough. The paper ranks by the weight
 * averaged over a layer's heads; here each (layer, KV head) stream ranks by
 * the weight of its own group of query heads (summed, which ranks the same
 * as their mean), as every policy in this folder decides per stream. A step
 * that runs several queries (a prompt chunk) ranks by their summed weight.
 *
 * observe() stores this step's weight as the score; select() keeps the
 * `budget` best scores (ties to the newer position) and drops the rest.
 * The newest token has no special protection, as in the paper: it attends
 * to itself, so it rarely ranks last. If the score scratch cannot grow,
 * select() keeps the newest `budget` tokens. Offloaded tokens, which TOVA
 * never makes, stay where they are and do not compete.
 */
#include "kv/kv_policy.h"
#include "kv/rank_int.h"

typedef struct {
    qi_kv_policy base;
    qi_kv_scratch scratch;
} tova_policy;

extern const qi_kv_policy_i qi_kv_tova_policy;

static void tova_free(qi_kv_policy *pp) {
    tova_policy *p = (tova_policy *)pp;
    if (!p) return;
    qi_kv_scratch_fini(&p->scratch);
    qi_free(p);
}

static qi_status tova_create(const qi_params *params, int n_layer, qi_kv_policy **out, qi_err *err) {
    static const char *const known[] = {NULL};
    qi_status st = qi_params_check_known(params, "tova", known, err);
    if (st) return st;
    tova_policy *p = qi_calloc(1, sizeof *p);
    if (!p) return QI_ERR(err, QI_ERR_NOMEM, "tova: out of memory");
    p->base.iface = &qi_kv_tova_policy;
    if ((st = qi_kv_scratch_init(&p->scratch, QI_KV_SCRATCH_INIT, err))) {
        tova_free(&p->base);
        return st;
    }
    *out = &p->base;
    return QI_OK;
}

static void tova_observe(qi_kv_policy *p, qi_kv_view *v, const float *attn) {
    for (int i = 0; i < v->n; i++)
        if (v->tier[i] == QI_KV_WORKING) v->score[i] = attn[i];
}

static void tova_select(qi_kv_policy *pp, const qi_kv_view *v, uint8_t *fate) {
    tova_policy *p = (tova_policy *)pp;
    const int budget = v->budget;
    int m = qi_kv_rank_begin(v, false, fate);
    if (m <= budget || !qi_kv_scratch_reserve(&p->scratch, m)) {
        qi_kv_rank_mark_by_pos(v, fate, budget, true, QI_KV_KEEP);
        qi_kv_rank_finish(v, fate, QI_KV_DROP);
        return;
    }
    qi_kv_item *it = p->scratch.items;
    int r = qi_kv_rank_gather(v, fate, it);
    qi_kv_rank_top_by_score(it, r, budget);
    for (int k = 0; k < budget && k < r; k++) fate[it[k].slot] = QI_KV_KEEP;
    qi_kv_rank_finish(v, fate, QI_KV_DROP);
}

const qi_kv_policy_i qi_kv_tova_policy = {
    .version = QI_KV_POLICY_VERSION,
    .name = "tova",
    .summary = "TOVA: the tokens the current query attends to most",
    .params = "",
    .create = tova_create,
    .observe = tova_observe,
    .select = tova_select,
    .free = tova_free,
};

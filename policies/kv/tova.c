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

extern const qi_kv_policy_i qi_kv_tova_policy;

static qi_status tova_create(const qi_params *params, int n_layer, qi_kv_policy **out, qi_err *err) {
    static const char *const known[] = {NULL};
    qi_status st = qi_params_check_known(params, "tova", known, err);
    return st ? st : qi_kv_scored_new(&qi_kv_tova_policy, sizeof(qi_kv_scored), out, err);
}

static void tova_observe(qi_kv_policy *p, qi_kv_view *v, const float *attn) {
    for (int i = 0; i < v->n; i++)
        if (v->tier[i] == QI_KV_WORKING) v->score[i] = attn[i];
}

static void tova_select(qi_kv_policy *pp, const qi_kv_view *v, uint8_t *fate) {
    qi_kv_rank_begin(v, false, fate);
    qi_kv_rank_recent_top(v, fate, &((qi_kv_scored *)pp)->scratch, 0, v->budget, NULL, QI_KV_DROP);
}

const qi_kv_policy_i qi_kv_tova_policy = {
    .version = QI_KV_POLICY_VERSION,
    .name = "tova",
    .summary = "TOVA: the tokens the current query attends to most",
    .params = "",
    .create = tova_create,
    .observe = tova_observe,
    .select = tova_select,
    .free = qi_kv_scored_free,
};

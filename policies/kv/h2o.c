/* h2o.c - H2O, the Heavy-Hitter Oracle (Zhang et al., NeurIPS 2023).
 *
 * A token's score is the attention weight it has accumulated over every
 * step it has been cached (observe() adds this step's weight). select()
 * keeps the `recent` newest tokens and, of the rest, the `heavy` highest
 * scores, where heavy = floor(budget * heavy fraction) (qi_kv_heavy_count)
 * and recent = budget - heavy; ties go to the newer position. Everything
 * else is dropped. It is the paper's greedy form: the choice is remade
 * every step from the current scores, and a dropped token is gone, so it
 * can never be reconsidered.
 *
 * The score rank sorts a scratch array sized in create() for
 * QI_KV_SCRATCH_INIT tokens; a view with more tokens grows it (the only
 * allocation outside create, once per new high-water mark). If that growth
 * fails, select() falls back to the newest `budget` tokens, a safe
 * decision that needs no memory. Offloaded tokens, which H2O never makes,
 * stay where they are and do not compete.
 */
#include "kv/kv_policy.h"
#include "kv/rank_int.h"

typedef struct {
    qi_kv_scored sc;
    double heavy; /* fraction of the budget for heavy hitters */
} h2o_policy;

extern const qi_kv_policy_i qi_kv_h2o_policy;

static qi_status h2o_create(const qi_params *params, int n_layer, qi_kv_policy **out, qi_err *err) {
    static const char *const known[] = {"heavy", NULL};
    double heavy;
    qi_status st = qi_params_check_known(params, "h2o", known, err);
    if (!st) st = qi_params_double(params, "h2o", "heavy", 0.5, 0.0, 1.0, &heavy, err);
    if (!st) st = qi_kv_scored_new(&qi_kv_h2o_policy, sizeof(h2o_policy), out, err);
    if (st) return st;
    ((h2o_policy *)*out)->heavy = heavy;
    return QI_OK;
}

static void h2o_observe(qi_kv_policy *p, qi_kv_view *v, const float *attn) {
    for (int i = 0; i < v->n; i++) v->score[i] += attn[i];
}

static void h2o_select(qi_kv_policy *pp, const qi_kv_view *v, uint8_t *fate) {
    h2o_policy *p = (h2o_policy *)pp;
    int recent, heavy;
    qi_kv_split_recent(v, p->heavy, &recent, &heavy);
    qi_kv_rank_begin(v, false, fate);
    qi_kv_rank_recent_top(v, fate, &p->sc.scratch, recent, heavy, NULL, QI_KV_DROP);
}

static void h2o_by_position(const qi_kv_policy *pp, int budget, int *oldest, int *newest) {
    *oldest = 0;
    *newest = qi_kv_recent_of(budget, ((const h2o_policy *)pp)->heavy);
}

const qi_kv_policy_i qi_kv_h2o_policy = {
    .version = QI_KV_POLICY_VERSION,
    .name = "h2o",
    .summary = "H2O: the newest tokens plus the heaviest accumulated-attention hitters",
    .params = "heavy=0.5",
    .create = h2o_create,
    .observe = h2o_observe,
    .select = h2o_select,
    .free = qi_kv_scored_free,
    .by_position = h2o_by_position,
};

/* window.c - a sliding window: keep the `budget` newest tokens.
 *
 * The simplest bounded cache and the lower bar for every scored policy:
 * ranking is by position only (not slot order, which stops following
 * position once anything has been evicted), so it needs no score, no
 * observe() and no memory beyond the policy object. Evicted tokens are
 * dropped. Offloaded tokens, which this policy never makes, stay where they
 * are and do not compete.
 */
#include "kv/kv_policy.h"
#include "kv/rank_int.h"

typedef struct {
    qi_kv_policy base;
} window_policy;

extern const qi_kv_policy_i qi_kv_window_policy;

static qi_status window_create(const qi_params *params, int n_layer, qi_kv_policy **out, qi_err *err) {
    static const char *const known[] = {NULL};
    qi_status st = qi_params_check_known(params, "window", known, err);
    if (st) return st;
    window_policy *p = qi_calloc(1, sizeof *p);
    if (!p) return QI_ERR(err, QI_ERR_NOMEM, "window: out of memory");
    p->base.iface = &qi_kv_window_policy;
    *out = &p->base;
    return QI_OK;
}

static void window_select(qi_kv_policy *p, const qi_kv_view *v, uint8_t *fate) {
    qi_kv_rank_begin(v, false, fate);
    qi_kv_rank_mark_by_pos(v, fate, v->budget, true, QI_KV_KEEP);
    qi_kv_rank_finish(v, fate, QI_KV_DROP);
}

static void window_free(qi_kv_policy *p) { qi_free(p); }

const qi_kv_policy_i qi_kv_window_policy = {
    .version = QI_KV_POLICY_VERSION,
    .name = "window",
    .summary = "sliding window: keep the budget newest tokens",
    .params = "",
    .create = window_create,
    .select = window_select,
    .free = window_free,
};

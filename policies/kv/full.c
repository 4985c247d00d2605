/* full.c - the control: every layer keeps its whole cache.
 *
 * Exempt on every layer, so the budget never applies and nothing is ever
 * evicted or probed; a run with it is the unbounded-cache baseline every
 * other policy is measured against. Its select() still answers (KEEP for
 * all, recalling anything a previous policy left offloaded) so that a cache
 * that calls select() on exempt layers gets a valid decision.
 */
#include "kv/kv_policy.h"

typedef struct {
    qi_kv_policy base;
} full_policy;

extern const qi_kv_policy_i qi_kv_full_policy;

static qi_status full_create(const qi_params *params, int n_layer, qi_kv_policy **out, qi_err *err) {
    static const char *const known[] = {NULL};
    qi_status st = qi_params_check_known(params, "full", known, err);
    if (st) return st;
    full_policy *p = qi_calloc(1, sizeof *p);
    if (!p) return QI_ERR(err, QI_ERR_NOMEM, "full: out of memory");
    p->base.iface = &qi_kv_full_policy;
    *out = &p->base;
    return QI_OK;
}

static void full_select(qi_kv_policy *p, const qi_kv_view *v, uint8_t *fate) {
    for (int i = 0; i < v->n; i++) fate[i] = QI_KV_KEEP;
}

static bool full_exempt(const qi_kv_policy *p, int layer) { return true; }

static void full_free(qi_kv_policy *p) { qi_free(p); }

const qi_kv_policy_i qi_kv_full_policy = {
    .version = QI_KV_POLICY_VERSION,
    .name = "full",
    .summary = "keep every token on every layer (the unbounded baseline)",
    .params = "",
    .create = full_create,
    .select = full_select,
    .exempt = full_exempt,
    .free = full_free,
};

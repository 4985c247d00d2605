/* streaming.c - StreamingLLM (Xiao et al., ICLR 2024): attention sinks plus
 * a sliding window.
 *
 * The first tokens of a sequence soak up attention mass whatever their
 * content ("attention sinks"); evicting them, as a plain window does, wrecks
 * the softmax. So the `sinks` lowest-position tokens are kept for good and
 * the rest of the budget is a window over the newest. The paper keeps 4
 * sinks; that is the default. When budget <= sinks the sinks are capped at
 * the budget: the budget lowest-position tokens are kept and nothing recent
 * (the alternative, reserving one slot for the newest token, would quietly
 * change what `sinks` means). Like window, it ranks by position only and
 * needs no score and no memory; evicted tokens are dropped.
 */
#include <limits.h>

#include "kv/kv_policy.h"
#include "kv/rank_int.h"

typedef struct {
    qi_kv_policy base;
    int sinks;
} streaming_policy;

extern const qi_kv_policy_i qi_kv_streaming_policy;

static qi_status streaming_create(const qi_params *params, int n_layer, qi_kv_policy **out, qi_err *err) {
    static const char *const known[] = {"sinks", NULL};
    long sinks;
    qi_status st = qi_params_check_known(params, "streaming", known, err);
    if (!st) st = qi_params_int(params, "streaming", "sinks", 4, 0, INT_MAX, &sinks, err);
    if (st) return st;
    streaming_policy *p = qi_calloc(1, sizeof *p);
    if (!p) return QI_ERR(err, QI_ERR_NOMEM, "streaming: out of memory");
    p->base.iface = &qi_kv_streaming_policy;
    p->sinks = (int)sinks;
    *out = &p->base;
    return QI_OK;
}

static void streaming_select(qi_kv_policy *pp, const qi_kv_view *v, uint8_t *fate) {
    const streaming_policy *p = (const streaming_policy *)pp;
    int sinks = p->sinks < v->budget ? p->sinks : v->budget;
    qi_kv_rank_begin(v, false, fate);
    qi_kv_rank_mark_by_pos(v, fate, sinks, false, QI_KV_KEEP);
    qi_kv_rank_mark_by_pos(v, fate, v->budget - sinks, true, QI_KV_KEEP);
    qi_kv_rank_finish(v, fate, QI_KV_DROP);
}

static void streaming_free(qi_kv_policy *p) { qi_free(p); }

const qi_kv_policy_i qi_kv_streaming_policy = {
    .version = QI_KV_POLICY_VERSION,
    .name = "streaming",
    .summary = "StreamingLLM: the first `sinks` tokens plus the newest",
    .params = "sinks=4",
    .create = streaming_create,
    .select = streaming_select,
    .free = streaming_free,
};

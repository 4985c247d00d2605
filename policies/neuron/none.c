/* none.c - the dense baseline: no neuron split, every FFN neuron where its
 * layer's MLP runs (the slow device's side of the split, in the slot's
 * terms). It keeps nothing on the fast device whatever the budget, so a
 * run under it is the unsplit engine's, the reference the others are
 * measured against. */
#include "neuron/neuron_policy.h"

extern const qi_neuron_policy_i qi_neuron_none_policy;

static qi_neuron_policy none_obj = {&qi_neuron_none_policy};

static qi_status none_create(const qi_params *params, qi_neuron_policy **out, qi_err *err) {
    static const char *const known[] = {NULL};
    qi_status st = qi_params_check_known(params, "none", known, err);
    if (st) return st;
    *out = &none_obj; /* no state: one shared object */
    return QI_OK;
}

static qi_status none_place(qi_neuron_policy *p, const qi_neuron_groups *g, uint8_t *x, qi_neuron_place_info *info,
                            qi_err *err) {
    (void)p, (void)g, (void)x, (void)err;
    info->optimal = true; /* nothing to choose */
    info->bound = 0.0;
    return QI_OK;
}

static void none_free(qi_neuron_policy *p) { (void)p; }

const qi_neuron_policy_i qi_neuron_none_policy = {
    .version = QI_NEURON_POLICY_VERSION,
    .name = "none",
    .summary = "dense: no split, every neuron with its layer's MLP",
    .params = "",
    .create = none_create,
    .place = none_place,
    .free = none_free,
};

/* static.c - llama.cpp's -ngl rule as a placement policy: as many layers as
 * fit on the accelerator, counted from the last layer down, and the output
 * head once every layer is there.
 *
 * llama.cpp's -ngl N (--n-gpu-layers) offloads the last N repeating layers
 * to the GPU, a layer whole (attention and MLP, and its KV cache with it),
 * and counts the output as one more layer, so N = n_layer + 1 also puts the
 * output head there; the token embedding stays on the host. qi_plan_parse's
 * "ngl=N" builds the same plan; this policy picks N: the largest whose plan
 * passes the memory check (qi_placement_check) with `reserve` bytes kept
 * free, or the N asked by ngl=, refused if it does not fit with the same
 * check. Nothing is split. The accelerator is the last device of the list
 * that is not the CPU; with the CPU alone the plan is all-cpu.
 *
 * Searching N from the top with the full check, rather than adding up
 * layer sizes here, keeps one definition of what a plan needs on a device
 * (the registry's); the cost is n_layer checks of n_layer blocks, nothing
 * beside a forward pass.
 */
#include <limits.h>

#include "placement/placement_policy.h"
#include "qinfer/model.h"

extern const qi_placement_policy_i qi_placement_static_policy;

typedef struct {
    qi_placement_policy base;
    long ngl;     /* forced N, or -1: the most that fit */
    long reserve; /* bytes kept free on the accelerator */
} static_policy;

static qi_status static_create(const qi_params *params, qi_placement_policy **out, qi_err *err) {
    static const char *const known[] = {"ngl", "reserve", NULL};
    long ngl = -1, reserve = 0;
    qi_status st = qi_params_check_known(params, "static", known, err);
    if (!st) st = qi_params_int(params, "static", "ngl", -1, 0, 4097, &ngl, err);
    if (!st) st = qi_params_int(params, "static", "reserve", 0, 0, LONG_MAX, &reserve, err);
    if (st) return st;
    static_policy *p = qi_calloc(1, sizeof *p);
    if (!p) return QI_ERR(err, QI_ERR_NOMEM, "static: out of memory");
    p->base.iface = &qi_placement_static_policy;
    p->ngl = ngl;
    p->reserve = reserve;
    *out = &p->base;
    return QI_OK;
}

/* The ngl=N plan on device acc over out's all-CPU plan. */
static void set_ngl(qi_plan *out, int acc, int n) {
    const int L = out->n_layer;
    for (int l = 0; l < L; l++) out->layers[l].attn_dev = out->layers[l].mlp_dev = l >= L - n ? acc : 0;
    out->head_dev = n > L ? acc : 0;
}

static qi_status static_plan(qi_placement_policy *pp, const qi_model *m, const qi_placement_devices *devs,
                             const qi_placement_workload *wl, qi_plan *out, qi_err *err) {
    const static_policy *p = (const static_policy *)pp;
    const int L = m->hp.n_layer;
    const int acc = qi_placement_accel(devs);
    if (acc < 0) {
        if (p->ngl > 0)
            return QI_ERR(err, QI_ERR_INVALID, "static: ngl=%ld needs an accelerator in the device list", p->ngl);
        return QI_OK; /* all-cpu, as the wrapper made it */
    }
    if (p->ngl >= 0) {
        if (p->ngl > L + 1)
            return QI_ERR(err, QI_ERR_INVALID, "static: ngl=%ld, the model has %d layers (at most %d with the head)",
                          p->ngl, L, L + 1);
        set_ngl(out, acc, (int)p->ngl);
        /* checked with the reserve here; the wrapper checks it again without */
        return qi_placement_check(m, devs, wl, out, (size_t)p->reserve, err);
    }
    for (int n = L + 1; n > 0; n--) {
        set_ngl(out, acc, n);
        if (qi_placement_check(m, devs, wl, out, (size_t)p->reserve, NULL) == QI_OK) return QI_OK;
    }
    set_ngl(out, acc, 0);
    return QI_OK;
}

static void static_free(qi_placement_policy *p) { qi_free(p); }

const qi_placement_policy_i qi_placement_static_policy = {
    .version = QI_PLACEMENT_POLICY_VERSION,
    .name = "static",
    .summary = "llama.cpp's -ngl: the most layers that fit on the accelerator, last layers first, then the head",
    .params = "ngl=N (force N layers; layers + 1 adds the head; default: the most that fit), reserve=0 (bytes "
              "kept free)",
    .create = static_create,
    .plan = static_plan,
    .free = static_free,
};

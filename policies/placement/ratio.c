/* ratio.c - the split-ratio rule of the Q-Infer authors' released code as a
 * placement policy: a baseline for the cost-model policies.
 *
 * The layers are placed as llama.cpp's -ngl places them (the static
 * policy's plan: the most whole layers that fit on the accelerator, last
 * layers first, then the head), and every attention on the accelerator is
 * split toward the CPU (device 0): a share r of the layer's working KV is
 * attended on the CPU while the rest is attended on the accelerator, the
 * two running at once. r starts at `start` for every layer and moves, per
 * layer, by a fixed step toward the device that finished first: after each
 * observation, with gpu the layer's attention time on the accelerator
 * (attn_s: its attention and KV writes, not the projections nor the wait
 * for the CPU) and cpu the time of its share on the CPU (split_s), if
 * |gpu - cpu| > tol (gpu + cpu) and the context is past min_ctx tokens,
 * r rises by step when the accelerator was the slower (more KV to the CPU)
 * and falls by step when the CPU was, within [0, max_r]. A layer whose r
 * reached 0 runs unsplit and is still observed (its CPU share then takes
 * no time, so a slow accelerator moves it back up).
 *
 * The rule has no cost model: it cannot weigh a move against what it
 * costs, so it is marked replan_on_change and qi_placement_ctl_tick applies
 * its plan whenever a ratio moved (a move carries only KV blocks between
 * the two devices; the engine moves them). Its ratios are read back from
 * the plan that ran, so a plan the engine did not take is proposed again
 * rather than drifting away from what runs.
 *
 * The base plan is the static policy's, reached through the registry (one
 * definition of -ngl and of what fits); splitting only takes KV off the
 * accelerator, so the plan with its splits fits wherever the base does. A
 * workload with a KV budget (an evicting KV policy, which a split layer
 * cannot run) gets the base plan unsplit and moves no ratio.
 */
#include <math.h>

#include "placement/placement_policy.h"
#include "qinfer/model.h"

extern const qi_placement_policy_i qi_placement_ratio_policy;

typedef struct {
    qi_placement_policy base;
    qi_placement_policy *base_policy; /* static: the -ngl plan */
    double start, step, tol, max_r;
    long min_ctx;
    int n_layer;  /* the ratios' model (0: none yet) */
    double *r;    /* [n_layer] the share of each layer's KV on the CPU */
} ratio_policy;

static qi_status ratio_create(const qi_params *params, qi_placement_policy **out, qi_err *err) {
    static const char *const known[] = {"start", "step", "tol", "min_ctx", "max_r", NULL};
    double start = 0.25, step = 0.05, tol = 0.025, max_r = 0.75;
    long min_ctx = 256;
    qi_status st = qi_params_check_known(params, "ratio", known, err);
    if (!st) st = qi_params_double(params, "ratio", "max_r", 0.75, 0.0, 1.0, &max_r, err);
    if (!st) st = qi_params_double(params, "ratio", "start", 0.25, 0.0, max_r, &start, err);
    if (!st) st = qi_params_double(params, "ratio", "step", 0.05, 1e-4, 1.0, &step, err);
    if (!st) st = qi_params_double(params, "ratio", "tol", 0.025, 0.0, 1.0, &tol, err);
    if (!st) st = qi_params_int(params, "ratio", "min_ctx", 256, 0, 1L << 30, &min_ctx, err);
    if (st) return st;
    ratio_policy *p = qi_calloc(1, sizeof *p);
    if (!p) return QI_ERR(err, QI_ERR_NOMEM, "ratio: out of memory");
    p->base.iface = &qi_placement_ratio_policy;
    p->start = start, p->step = step, p->tol = tol, p->max_r = max_r, p->min_ctx = min_ctx;
    if ((st = qi_placement_policy_create("static", NULL, &p->base_policy, err))) {
        qi_free(p);
        return st;
    }
    *out = &p->base;
    return QI_OK;
}

/* Every layer at r = start, for a model of L layers. */
static qi_status ratios_for(ratio_policy *p, int L, qi_err *err) {
    if (p->n_layer == L) return QI_OK;
    double *r = qi_malloc(sizeof *r * (size_t)(L > 0 ? L : 1));
    if (!r) return QI_ERR(err, QI_ERR_NOMEM, "ratio: out of memory for %d layers", L);
    for (int l = 0; l < L; l++) r[l] = p->start;
    qi_free(p->r);
    p->r = r;
    p->n_layer = L;
    return QI_OK;
}

static qi_status ratio_plan(qi_placement_policy *pp, const qi_model *m, const qi_placement_devices *devs,
                            const qi_placement_workload *wl, qi_plan *out, qi_err *err) {
    ratio_policy *p = (ratio_policy *)pp;
    const int L = m->hp.n_layer;
    qi_status st = ratios_for(p, L, err);
    if (st) return st;
    qi_plan base = {0};
    if ((st = qi_placement_policy_plan(p->base_policy, m, devs, wl, &base, err))) return st;
    out->embd_dev = base.embd_dev;
    out->head_dev = base.head_dev;
    for (int l = 0; l < L; l++) {
        qi_plan_layer *y = &out->layers[l];
        y->attn_dev = base.layers[l].attn_dev;
        y->mlp_dev = base.layers[l].mlp_dev;
        const bool split = y->attn_dev != 0 && wl->kv_budget == 0 && p->r[l] > 0.0;
        y->split = split ? (float)p->r[l] : 0.0f;
        y->split_dev = split ? 0 : -1;
    }
    qi_plan_free(&base);
    return QI_OK;
}

static void ratio_observe(qi_placement_policy *pp, const qi_placement_times *t) {
    ratio_policy *p = (ratio_policy *)pp;
    const qi_plan *run = t->plan;
    if (!run || !t->attn_s || !t->wl || t->wl->kv_budget > 0 || t->wl->prompt_len <= p->min_ctx ||
        p->n_layer != run->n_layer)
        return;
    for (int l = 0; l < run->n_layer; l++) {
        const qi_plan_layer *y = &run->layers[l];
        if (y->attn_dev == 0 || (y->split > 0.0f && y->split_dev != 0)) continue;
        const int b = 1 + 2 * l;
        const double gpu = t->attn_s[b], cpu = y->split > 0.0f && t->split_s ? t->split_s[b] : 0.0;
        if (!(gpu > 0.0) || fabs(gpu - cpu) <= p->tol * (gpu + cpu)) continue;
        double r = (double)y->split + (gpu > cpu ? p->step : -p->step);
        r = r < 0.0 ? 0.0 : r > p->max_r ? p->max_r : r;
        /* to 1e-4, so that steps up and down return to the same ratio */
        p->r[l] = round(r * 1e4) / 1e4;
    }
}

static void ratio_free(qi_placement_policy *pp) {
    ratio_policy *p = (ratio_policy *)pp;
    qi_placement_policy_free(p->base_policy);
    qi_free(p->r);
    qi_free(p);
}

const qi_placement_policy_i qi_placement_ratio_policy = {
    .version = QI_PLACEMENT_POLICY_VERSION,
    .name = "ratio",
    .summary = "the authors' released rule: -ngl layers, each accelerator attention split toward the CPU, its ratio "
               "stepped toward the faster device",
    .params = "start=0.25 (first ratio), step=0.05, tol=0.025 (share of gpu + cpu), min_ctx=256 (tokens), "
              "max_r=0.75",
    .create = ratio_create,
    .plan = ratio_plan,
    .observe = ratio_observe,
    .free = ratio_free,
    .replan_on_change = true,
};

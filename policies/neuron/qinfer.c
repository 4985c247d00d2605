/* qinfer.c - the Q-Infer authors' neuron placement: balance, not mass.
 *
 * Q-Infer (ACM TACO, DOI 10.1145/3764589) runs each layer's hot neurons on
 * the GPU and its cold ones on the CPU at the same time, and the layer
 * takes as long as the slower of the two. Keeping the most mass on the GPU
 * (PowerInfer's objective, static.c) overloads the GPU side's share of the
 * time as soon as the GPU is not infinitely faster; the authors' released
 * method instead:
 *   1. calibrates at start-up the fast:slow speed ratio R of the sparse up
 *      and down products at the serving batch (qi_neuron_calibrate: the
 *      engine times both devices, this fits the ratio of their per-neuron
 *      slopes, so fixed launch costs do not count);
 *   2. places groups greedily, hottest first, while the fast device's
 *      share of each layer's activity stays below R / (1 + R), the share at
 *      which both sides finish together (fast work / R = slow work), and
 *      its bytes fit (qi_neuron_greedy);
 *   3. at run time rebalances by swapping neurons between the sides as the
 *      activity drifts (neuron_live.c).
 * The greedy goes over all layers' groups by falling mass, so a tight
 * budget goes to the hottest groups of any layer; each layer stops at its
 * own target. The last group added may carry the share past the target by
 * up to one group's share: the rule is "add while below", as released, and
 * the swap worker evens out what a group's granularity leaves.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "neuron/neuron_live.h"
#include "neuron/neuron_policy.h"

typedef struct {
    qi_neuron_policy base;
    double ratio;
    qi_neuron_live_opts live; /* the swap worker's options, ratio included */
} qinfer_policy;

extern const qi_neuron_policy_i qi_neuron_qinfer_policy;

static qi_status qinfer_create(const qi_params *params, qi_neuron_policy **out, qi_err *err) {
    static const char *const known[] = {"ratio", "slow_s", "link_bw", "horizon", "decay", "tol", "max_swaps", NULL};
    const char *who = "qinfer";
    double ratio = 0.0;
    qi_neuron_live_opts o;
    qi_neuron_live_opts_default(&o);
    long max_swaps = o.max_swaps;
    qi_status st = qi_params_check_known(params, who, known, err);
    if (st) return st;
    if (!qi_params_get(params, "ratio"))
        return QI_ERR(err, QI_ERR_INVALID,
                      "qinfer: needs ratio=R, the fast:slow speed ratio of the sparse FFN products (calibrated at "
                      "start-up)");
    st = qi_params_double(params, who, "ratio", 1.0, 1e-6, 1e6, &ratio, err);
    if (!st) st = qi_params_double(params, who, "slow_s", o.slow_s, 1e-15, 1e6, &o.slow_s, err);
    if (!st) st = qi_params_double(params, who, "link_bw", o.link_bw, 1.0, 1e15, &o.link_bw, err);
    if (!st) st = qi_params_double(params, who, "horizon", o.horizon, 1e-6, 1e12, &o.horizon, err);
    if (!st) st = qi_params_double(params, who, "decay", o.decay, 1e-6, 1.0, &o.decay, err);
    if (!st) st = qi_params_double(params, who, "tol", o.tol, 0.0, 0.99, &o.tol, err);
    if (!st) st = qi_params_int(params, who, "max_swaps", o.max_swaps, 1, 1 << 22, &max_swaps, err);
    if (st) return st;
    qinfer_policy *p = qi_calloc(1, sizeof *p);
    if (!p) return QI_ERR(err, QI_ERR_NOMEM, "qinfer: out of memory");
    p->base.iface = &qi_neuron_qinfer_policy;
    p->ratio = ratio;
    o.ratio = ratio;
    o.max_swaps = (int)max_swaps;
    p->live = o;
    *out = &p->base;
    return QI_OK;
}


/* The greedy over a given order (idx[n] of (layer, group) indices). */
static void greedy_in_order(const qi_neuron_groups *g, double ratio, const int32_t *idx, int n, double *fast_mass,
                            uint8_t *x) {
    const double target = ratio / (1.0 + ratio);
    uint64_t left = (uint64_t)g->budget;
    for (int k = 0; k < n; k++) {
        const int i = idx[k], l = i / g->n_groups;
        if (g->mass[i] <= 0.0) break; /* the rest hold nothing */
        if (fast_mass[l] >= target * g->layer_mass[l]) continue;
        if (g->bytes[i] > left) continue;
        x[i] = 1;
        left -= g->bytes[i];
        fast_mass[l] += g->mass[i];
    }
}

void qi_neuron_greedy(const qi_neuron_groups *g, double ratio, uint8_t *x) {
    const int n = g->n_layer * g->n_groups;
    memset(x, 0, (size_t)n);
    int32_t *idx = qi_malloc(sizeof *idx * (size_t)n), *tmp = qi_malloc(sizeof *tmp * (size_t)n);
    double *fm = qi_calloc((size_t)g->n_layer, sizeof *fm);
    if (idx && tmp && fm) {
        for (int i = 0; i < n; i++) idx[i] = i;
        qi_neuron_sort_desc(idx, tmp, n, g->mass);
        greedy_in_order(g, ratio, idx, n, fm, x);
    } else {
        /* without room to sort: layer by layer, group order (each layer's
         * groups already fall in mass), still within the budget */
        double share = 0.0;
        uint64_t left = (uint64_t)g->budget;
        const double target = ratio / (1.0 + ratio);
        for (int l = 0; l < g->n_layer; l++, share = 0.0)
            for (int k = 0; k < g->n_groups; k++) {
                const int i = l * g->n_groups + k;
                if (g->mass[i] <= 0.0 || share >= target * g->layer_mass[l] || g->bytes[i] > left) continue;
                x[i] = 1;
                left -= g->bytes[i];
                share += g->mass[i];
            }
    }
    qi_free(idx);
    qi_free(tmp);
    qi_free(fm);
}

static qi_status qinfer_place(qi_neuron_policy *pp, const qi_neuron_groups *g, uint8_t *x,
                              qi_neuron_place_info *info, qi_err *err) {
    (void)err, (void)info; /* a rule, not an optimum: nothing to claim */
    qi_neuron_greedy(g, ((const qinfer_policy *)pp)->ratio, x);
    return QI_OK;
}

static void qinfer_free(qi_neuron_policy *p) { qi_free(p); }

double qi_neuron_qinfer_ratio(const qi_neuron_policy *p) {
    return p && p->iface == &qi_neuron_qinfer_policy ? ((const qinfer_policy *)p)->ratio : NAN;
}

qi_status qi_neuron_qinfer_live_opts(const qi_neuron_policy *p, qi_neuron_live_opts *o, qi_err *err) {
    if (!p || p->iface != &qi_neuron_qinfer_policy)
        return QI_ERR(err, QI_ERR_INVALID, "neuron policy '%s' has no swap worker (qinfer has)",
                      qi_neuron_policy_name(p));
    *o = ((const qinfer_policy *)p)->live;
    return QI_OK;
}

/* ---- calibration ------------------------------------------------------------------------ */

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

qi_status qi_neuron_calibrate(qi_neuron_time_fn time_fn, void *ctx, int n_ff, int batch, int reps, double *ratio,
                              qi_err *err) {
    *ratio = NAN;
    if (!time_fn) return QI_ERR(err, QI_ERR_INVALID, "neuron calibration: no timer");
    if (n_ff < 8 || batch < 1 || reps < 1 || reps > 1000)
        return QI_ERR(err, QI_ERR_INVALID, "neuron calibration: n_ff %d (at least 8), batch %d, reps %d (1 to 1000)",
                      n_ff, batch, reps);
    enum { NS = 3 };
    const int sizes[NS] = {n_ff / 8, n_ff / 4, n_ff / 2};
    double med[2][NS], t[1000];
    for (int d = 0; d < 2; d++)
        for (int s = 0; s < NS; s++) {
            for (int r = 0; r < reps; r++) {
                t[r] = time_fn(ctx, d, sizes[s], batch);
                if (!isfinite(t[r]) || t[r] < 0.0)
                    return QI_ERR(err, QI_ERR_BACKEND,
                                  "neuron calibration: the %s device's timer gave %g s for %d neurons at batch %d",
                                  d ? "fast" : "slow", t[r], sizes[s], batch);
            }
            qsort(t, (size_t)reps, sizeof *t, cmp_double);
            med[d][s] = reps % 2 ? t[reps / 2] : 0.5 * (t[reps / 2 - 1] + t[reps / 2]);
        }
    /* least-squares slope of median seconds against neurons, per device */
    double slope[2];
    for (int d = 0; d < 2; d++) {
        double mx = 0, my = 0, sxx = 0, sxy = 0;
        for (int s = 0; s < NS; s++) mx += sizes[s] / (double)NS, my += med[d][s] / NS;
        for (int s = 0; s < NS; s++) {
            sxx += (sizes[s] - mx) * (sizes[s] - mx);
            sxy += (sizes[s] - mx) * (med[d][s] - my);
        }
        slope[d] = sxx > 0 ? sxy / sxx : 0.0;
        /* noise that hides the slope: the largest size's mean per neuron */
        if (!(slope[d] > 0.0)) slope[d] = med[d][NS - 1] / sizes[NS - 1];
    }
    if (!(slope[0] > 0.0) || !(slope[1] > 0.0))
        return QI_ERR(err, QI_ERR_BACKEND,
                      "neuron calibration: the %s device's times do not grow with the neurons (all 0 s)",
                      slope[0] > 0.0 ? "fast" : "slow");
    *ratio = slope[0] / slope[1];
    return QI_OK;
}

const qi_neuron_policy_i qi_neuron_qinfer_policy = {
    .version = QI_NEURON_POLICY_VERSION,
    .name = "qinfer",
    .summary = "Q-Infer's placement: hottest groups first while each layer's fast share of activity is below R/(1+R)",
    .params = "ratio=R (required: the fast:slow speed ratio of the sparse FFN products); the swap worker's "
              "slow_s=1e-7, link_bw=16e9, horizon=64, decay=0.25, tol=0.05, max_swaps=64 (neuron_live.h)",
    .create = qinfer_create,
    .place = qinfer_place,
    .free = qinfer_free,
};

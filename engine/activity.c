/* activity.c - FFN activation sparsity as a model for the simulated machine
 * (qinfer/activity.h): levels of firing probability over a layer's ranked
 * neurons, the union a batch touches, presets from published statistics
 * and levels from a neuron profile. */
#include "qinfer/activity.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "neuron/neuron_policy.h"

/* Each figure's source is the row of shared anchors it came from (the
 * published sparsity statistics: PowerInfer, arXiv 2312.12456 v2). */
const qi_activity_preset qi_activity_presets[] = {
    {"opt", "active=0.03,hot=0.26:0.8,pred=0.0577",
     "active 3%: OPT-7B..175B are 96-98% sparse (PowerInfer Table 3), the middle; 26% of neurons give 80% of an "
     "OPT-30B block's activations (PowerInfer 3.1, Fig. 4a); predictor 5.77% of the parameters: OPT-30B is not in "
     "PowerInfer Table 6, interpolated in log size between OPT-13B 6.71% and OPT-66B 4.88% (an estimate)"},
    {"falcon-relu", "active=0.05,hot=0.26:0.8,pred=0.0868",
     "active 5%: ReLU Falcon-40B is 95% sparse (PowerInfer Table 3); its concentration is not published: OPT-30B's "
     "26%:80% (the other ReLU model, PowerInfer Fig. 4a) is assumed; predictor 8.68% (Falcon-40B, PowerInfer Table 6)"},
    {"llama-reglu", "active=0.18,hot=0.43:0.8,pred=0.0808",
     "active 18%: ReGLU LLaMA-2-70B is 82% sparse (PowerInfer Table 3); 43% of neurons give 80% of a ReGLU "
     "LLaMA-2-70B block's activations (PowerInfer Fig. 4a); predictor 8.08% (LLaMA-70B ReGLU, PowerInfer Table 6)"},
    {NULL, NULL, NULL},
};

void qi_activity_fini(qi_activity *a) {
    if (!a) return;
    free(a->edge);
    free(a->p);
    memset(a, 0, sizeof *a);
}

static qi_status alloc_levels(int n_layer, int n_lv, qi_activity *out, qi_err *err) {
    memset(out, 0, sizeof *out);
    out->n_layer = n_layer;
    out->n_lv = n_lv;
    out->edge = calloc((size_t)n_layer * (size_t)(n_lv + 1), sizeof *out->edge);
    out->p = calloc((size_t)n_layer * (size_t)n_lv, sizeof *out->p);
    if (!out->edge || !out->p) {
        qi_activity_fini(out);
        return QI_ERR(err, QI_ERR_NOMEM, "activity model of %d layers x %d levels", n_layer, n_lv);
    }
    return QI_OK;
}

qi_status qi_activity_two_level(double A, double H, double Y, double pred, qi_activity *out, qi_err *err) {
    memset(out, 0, sizeof *out);
    if (!(A > 0.0 && A <= 1.0)) return QI_ERR(err, QI_ERR_INVALID, "activity: active=%g is outside (0, 1]", A);
    if (!(H > 0.0 && H < 1.0)) return QI_ERR(err, QI_ERR_INVALID, "activity: the hot share %g is outside (0, 1)", H);
    if (!(Y >= 0.0 && Y <= 1.0)) return QI_ERR(err, QI_ERR_INVALID, "activity: the hot mass %g is outside [0, 1]", Y);
    if (!(pred >= 0.0 && pred < 1.0)) return QI_ERR(err, QI_ERR_INVALID, "activity: pred=%g is outside [0, 1)", pred);
    const double ph = Y * A / H, pc = (1.0 - Y) * A / (1.0 - H);
    if (ph > 1.0 || pc > 1.0)
        return QI_ERR(err, QI_ERR_INVALID, "activity: %g%% of the neurons cannot give %g%% of the activations at "
                      "%g%% active (a neuron would fire with probability %g)", 100 * H, 100 * Y, 100 * A, ph > 1 ? ph : pc);
    qi_status st = alloc_levels(1, 2, out, err);
    if (st) return st;
    out->edge[0] = 0.0, out->edge[1] = H, out->edge[2] = 1.0;
    out->p[0] = ph, out->p[1] = pc;
    out->pred = pred;
    snprintf(out->name, sizeof out->name, "active %g, %g%% of neurons give %g%%", A, 100 * H, 100 * Y);
    return QI_OK;
}

static int cmp_desc(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x < y) - (x > y);
}

qi_status qi_activity_from_counts(int n_layer, int n_ff, const int64_t *active, const long *layer_tokens,
                                  qi_activity *out, qi_err *err) {
    memset(out, 0, sizeof *out);
    if (n_layer < 1 || n_ff < 1) return QI_ERR(err, QI_ERR_INVALID, "activity: %d layers of %d neurons", n_layer, n_ff);
    qi_status st = alloc_levels(n_layer, n_ff, out, err);
    if (st) return st;
    for (int l = 0; l < n_layer; l++) {
        if (layer_tokens[l] < 1) {
            qi_activity_fini(out);
            return QI_ERR(err, QI_ERR_INVALID, "activity: layer %d of the profile saw no tokens", l);
        }
        double *p = out->p + (size_t)l * n_ff, *e = out->edge + (size_t)l * (n_ff + 1);
        for (int j = 0; j < n_ff; j++) p[j] = (double)active[(size_t)l * n_ff + j] / (double)layer_tokens[l];
        qsort(p, (size_t)n_ff, sizeof *p, cmp_desc);
        for (int j = 0; j <= n_ff; j++) e[j] = (double)j / n_ff;
    }
    snprintf(out->name, sizeof out->name, "a profile of %d layers x %d neurons", n_layer, n_ff);
    return QI_OK;
}

double qi_activity_union(const qi_activity *a, int l, double lo, double hi, int B) {
    if (a->n_layer == 1) l = 0;
    const int n = a->n_lv;
    const double *e = a->edge + (size_t)l * (n + 1), *p = a->p + (size_t)l * n;
    double u = 0.0;
    for (int k = 0; k < n; k++) {
        const double a0 = e[k] > lo ? e[k] : lo, a1 = e[k + 1] < hi ? e[k + 1] : hi;
        if (a1 <= a0) continue;
        u += (a1 - a0) * (p[k] >= 1.0 ? 1.0 : -expm1((double)B * log1p(-p[k])));
    }
    return u;
}

/* "key=value" items of spec, comma-separated, after an optional preset. */
qi_status qi_activity_parse(const char *spec, qi_activity *out, qi_err *err) {
    memset(out, 0, sizeof *out);
    if (!spec || !*spec) return QI_ERR(err, QI_ERR_INVALID, "activity: an empty spec");
    char buf[1024];
    if (strlen(spec) >= sizeof buf) return QI_ERR(err, QI_ERR_INVALID, "activity: a spec past %zu bytes", sizeof buf);
    /* a preset's spec stands in for its name; the items after it still apply */
    const char *rest = "";
    const char *comma = strchr(spec, ',');
    const size_t head = comma ? (size_t)(comma - spec) : strlen(spec);
    const qi_activity_preset *pre = NULL;
    if (!memchr(spec, '=', head)) {
        for (const qi_activity_preset *q = qi_activity_presets; q->name; q++)
            if (strlen(q->name) == head && !strncmp(q->name, spec, head)) pre = q;
        if (!pre) {
            char known[256] = "";
            for (const qi_activity_preset *q = qi_activity_presets; q->name; q++)
                snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s", known[0] ? ", " : "", q->name);
            return QI_ERR(err, QI_ERR_INVALID, "activity: no preset '%.*s' (known: %s; or active=A,hot=H:Y)",
                          (int)head, spec, known);
        }
        rest = comma ? comma : "";
    }
    snprintf(buf, sizeof buf, "%s%s", pre ? pre->spec : spec, rest);
    double A = -1, H = -1, Y = -1, F = 0;
    const char *profile = NULL;
    for (char *save = NULL, *it = strtok_r(buf, ",", &save); it; it = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(it, '='), *end = NULL;
        if (!eq) return QI_ERR(err, QI_ERR_INVALID, "activity: '%s' is not key=value", it);
        *eq = '\0';
        const char *k = it, *v = eq + 1;
        if (!strcmp(k, "profile")) {
            profile = v;
            continue;
        }
        if (!strcmp(k, "hot")) {
            H = strtod(v, &end);
            if (end == v || *end != ':')
                return QI_ERR(err, QI_ERR_INVALID, "activity: hot=%s is not H:Y (H of the neurons give Y)", v);
            const char *y = end + 1;
            Y = strtod(y, &end);
            if (end == y || *end) return QI_ERR(err, QI_ERR_INVALID, "activity: hot=%s is not H:Y", v);
            continue;
        }
        const double x = strtod(v, &end);
        if (end == v || *end) return QI_ERR(err, QI_ERR_INVALID, "activity: %s=%s is not a number", k, v);
        if (!strcmp(k, "active")) A = x;
        else if (!strcmp(k, "pred")) F = x;
        else return QI_ERR(err, QI_ERR_INVALID, "activity: unknown key '%s' (active, hot, pred, profile)", k);
    }
    qi_status st;
    if (profile) {
        if (A >= 0 || H >= 0)
            return QI_ERR(err, QI_ERR_INVALID, "activity: profile= gives the levels; active= and hot= go without it");
        if (!(F >= 0.0 && F < 1.0)) return QI_ERR(err, QI_ERR_INVALID, "activity: pred=%g is outside [0, 1)", F);
        qi_neuron_profile np;
        if ((st = qi_neuron_profile_read(profile, &np, err))) return st;
        st = qi_activity_from_counts(np.n_layer, np.n_ff, np.active, np.layer_tokens, out, err);
        qi_neuron_profile_fini(&np);
        if (st) return st;
        out->pred = F;
        snprintf(out->name, sizeof out->name, "profile %.80s", profile);
        return QI_OK;
    }
    if (A < 0 || H < 0) return QI_ERR(err, QI_ERR_INVALID, "activity: '%s' needs active=A and hot=H:Y", spec);
    if ((st = qi_activity_two_level(A, H, Y, F, out, err))) return st;
    if (pre) snprintf(out->name, sizeof out->name, "%s", pre->name);
    return QI_OK;
}

/* split.c - a neuron policy's split of a model's FFN, made for the engine
 * (neuron_policy.h, qi_neuron_split_make). */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "neuron/neuron_policy.h"
#include "qinfer/engine.h"
#include "qinfer/model.h"

void qi_neuron_split_fini(qi_neuron_split *s) {
    qi_free(s->fast);
    qi_free(s->activity);
    memset(s, 0, sizeof *s);
}

bool qi_neuron_parse_budget(const char *b, double *share, int64_t *bytes) {
    const size_t n = strlen(b);
    char *end;
    errno = 0;
    if (n > 1 && b[n - 1] == '%') {
        const double v = strtod(b, &end) / 100.0;
        if (errno || end != b + n - 1 || !(v >= 0.0 && v <= 1.0)) return false;
        *share = v;
        return true;
    }
    if (!(b[0] >= '0' && b[0] <= '9')) return false;
    double v = strtod(b, &end);
    if (errno || end == b) return false;
    if (*end == 'K') v *= 1024.0, end++;
    else if (*end == 'M') v *= 1048576.0, end++;
    else if (*end == 'G') v *= 1073741824.0, end++;
    if (*end || !isfinite(v) || v < 0 || v >= 4.6e18 || v != floor(v)) return false;
    *bytes = (int64_t)v;
    return true;
}

qi_status qi_neuron_split_make(const qi_model *m, const char *policy, const char *profile, const char *budget,
                               qi_neuron_split *out, qi_err *err) {
    memset(out, 0, sizeof *out);
    const int L = m->hp.n_layer, F = m->hp.n_ff, unit = qi_engine_neuron_unit(m);
    if (unit < 1) return QI_ERR(err, QI_ERR_UNSUPPORTED, "a neuron split needs a gated FFN; %s has none", m->hp.arch_name);
    const int U = F / unit;
    double share = -1.0;
    int64_t bytes = 0;
    if (!qi_neuron_parse_budget(budget, &share, &bytes))
        return QI_ERR(err, QI_ERR_INVALID, "neuron budget '%s' is not a share from 0%% to 100%% nor a size (BYTES, K, "
                      "M or G)", budget);
    qi_neuron_profile prof = {0};
    qi_neuron_policy *pol = NULL;
    qi_neuron_plan plan = {0};
    double *act = qi_calloc((size_t)L * U, sizeof *act);
    uint64_t *nb = qi_malloc(sizeof *nb * (size_t)L);
    qi_status st = act && nb ? QI_OK : QI_ERR(err, QI_ERR_NOMEM, "out of memory for %d x %d units", L, U);
    const bool uniform = strcmp(profile, "uniform") == 0;
    if (!st) st = qi_neuron_policy_from_spec(policy, &pol, err);
    if (!st) out->has_live = qi_neuron_qinfer_live_opts(pol, &out->live, NULL) == QI_OK;
    if (!st && !uniform) st = qi_neuron_profile_read(profile, &prof, err);
    if (!st && !uniform && (prof.n_layer != L || prof.n_ff != F))
        st = QI_ERR(err, QI_ERR_INVALID, "%s is of %d layers x %d neurons, the model %d x %d: not its profile", profile,
                    prof.n_layer, prof.n_ff, L, F);
    if (!st) st = qi_neuron_bytes_of_model(m, nb, err);
    if (!st) {
        for (int l = 0; l < L; l++) {
            out->ffn_bytes += nb[l] * (uint64_t)F;
            nb[l] *= (uint64_t)unit; /* a unit's */
            for (int j = 0; j < F; j++) act[(size_t)l * U + j / unit] += uniform ? 1.0 : prof.mass[(size_t)l * F + j];
        }
        if (share >= 0.0) bytes = (int64_t)floor(share * (double)out->ffn_bytes);
        const int group = QI_NEURON_GROUP_DEFAULT / unit > 1 ? QI_NEURON_GROUP_DEFAULT / unit : 1;
        const qi_neuron_input in = {.n_layer = L, .n_ff = U, .activity = act, .neuron_bytes = nb, .budget = bytes,
                                    .group = group};
        st = qi_neuron_policy_place(pol, &in, &plan, err);
    }
    if (!st) {
        out->fast = qi_malloc((size_t)L * U);
        if (!out->fast) st = QI_ERR(err, QI_ERR_NOMEM, "out of memory for the neuron split");
    }
    if (!st) {
        out->n_layer = L;
        out->n_units = U;
        out->unit = unit;
        memcpy(out->fast, plan.fast, (size_t)L * U);
        for (int l = 0; l < L; l++) out->n_fast += plan.n_fast[l];
        out->bytes = plan.total_bytes;
        out->mass_fast = plan.total_mass_fast;
        out->mass = plan.total_mass;
        snprintf(out->policy, sizeof out->policy, "%s", qi_neuron_policy_name(pol));
        /* the swaps' starting activity: per token */
        for (int l = 0; l < L; l++) {
            const double tok = uniform ? 1.0 : (double)(prof.layer_tokens ? prof.layer_tokens[l] : prof.tokens);
            for (int u = 0; u < U; u++) act[(size_t)l * U + u] /= tok > 0 ? tok : 1.0;
        }
        out->activity = act;
        act = NULL;
    }
    qi_neuron_plan_fini(&plan);
    qi_neuron_policy_free(pol);
    qi_neuron_profile_fini(&prof);
    qi_free(act);
    qi_free(nb);
    if (st) qi_neuron_split_fini(out);
    return st;
}

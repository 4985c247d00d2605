/* registry.c - the FFN neuron policies by name, the wrapper every placement
 * goes through, and the figures around it (groups, the per-neuron plan,
 * bytes per neuron of a model, recall and precision).
 *
 * As in the KV and placement slots the table is an X-macro list, so adding
 * a policy is one line, and the wrapper is the only way to a policy. The
 * wrapper does the work every policy would repeat and must not get wrong:
 * it validates the input, ranks each layer's neurons and forms the groups
 * (so every policy places the same groups, and a test of one policy's
 * choice is a test of groups, not of its sorting), and it checks the
 * choice a policy returns (each entry 0 or 1, the bytes within the budget)
 * before expanding it to neurons. A policy that breaks the budget is then
 * a QI_ERR_BACKEND naming it, never a plan the fast device cannot hold.
 *
 * Groups are formed by rank, not by index: neuron ids carry no heat, and
 * PowerInfer's solver too sorts each layer's neurons by activation before
 * cutting them into batches. Within a layer the groups' masses then fall
 * with their index, and all but the last have the same bytes.
 */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "neuron/neuron_policy.h"
#include "qinfer/model.h"

/* static needs GLPK (CMakeLists.txt builds it only where GLPK is found) */
#ifdef QI_HAVE_GLPK
#define QI_NEURON_POLICY_LIST(X) X(none) X(static) X(qinfer)
#else
#define QI_NEURON_POLICY_LIST(X) X(none) X(qinfer)
#endif

#define QI_NEURON_DECLARE(name) extern const qi_neuron_policy_i qi_neuron_##name##_policy;
#define QI_NEURON_ENTRY(name) &qi_neuron_##name##_policy,

QI_NEURON_POLICY_LIST(QI_NEURON_DECLARE)

const qi_neuron_policy_i *const qi_neuron_policies[] = {QI_NEURON_POLICY_LIST(QI_NEURON_ENTRY) NULL};

const qi_neuron_policy_i *qi_neuron_policy_find(const char *name) {
    if (!name) return NULL;
    for (const qi_neuron_policy_i *const *it = qi_neuron_policies; *it; it++)
        if (strcmp((*it)->name, name) == 0) return *it;
    return NULL;
}

qi_status qi_neuron_policy_create(const char *name, const qi_params *params, qi_neuron_policy **out, qi_err *err) {
    *out = NULL;
    const qi_neuron_policy_i *pi = qi_neuron_policy_find(name);
#ifndef QI_HAVE_GLPK
    if (!pi && name && strcmp(name, "static") == 0)
        return QI_ERR(err, QI_ERR_UNSUPPORTED, "neuron policy 'static' solves with GLPK, and this build has none");
#endif
    if (!pi) {
        char list[256] = "";
        size_t len = 0;
        for (const qi_neuron_policy_i *const *it = qi_neuron_policies; *it; it++) {
            int w = snprintf(list + len, sizeof list - len, "%s%s", len ? ", " : "", (*it)->name);
            if (w < 0 || (size_t)w >= sizeof list - len) break;
            len += (size_t)w;
        }
        return QI_ERR(err, QI_ERR_INVALID, "unknown neuron policy '%s' (known: %s)", name ? name : "(null)", list);
    }
    if (pi->version != QI_NEURON_POLICY_VERSION)
        return QI_ERR(err, QI_ERR_UNSUPPORTED, "neuron policy '%s' has interface version %u, the engine speaks %u",
                      pi->name, pi->version, QI_NEURON_POLICY_VERSION);
    qi_params none;
    qi_params_init(&none);
    qi_neuron_policy *p = NULL;
    qi_status st = pi->create(params ? params : &none, &p, err);
    if (st) return st;
    if (!p || p->iface != pi) {
        if (p && p->iface && p->iface->free) p->iface->free(p);
        return QI_ERR(err, QI_ERR_BACKEND, "neuron policy '%s': create returned no policy of its own", pi->name);
    }
    *out = p;
    return QI_OK;
}

qi_status qi_neuron_policy_from_spec(const char *spec, qi_neuron_policy **out, qi_err *err) {
    *out = NULL;
    char name[64];
    const char *colon = spec ? strchr(spec, ':') : NULL;
    const size_t len = !spec ? 0 : colon ? (size_t)(colon - spec) : strlen(spec);
    if (len == 0 || len >= sizeof name)
        return QI_ERR(err, QI_ERR_INVALID, "neuron policy '%s': NAME[:K=V,...] names no policy", spec ? spec : "");
    memcpy(name, spec, len);
    name[len] = 0;
    qi_params params;
    qi_params_init(&params);
    qi_status st = colon ? qi_params_parse(&params, colon + 1, err) : QI_OK;
    if (!st) st = qi_neuron_policy_create(name, &params, out, err);
    return st;
}

const char *qi_neuron_policy_name(const qi_neuron_policy *p) { return p ? p->iface->name : "(none)"; }

void qi_neuron_policy_free(qi_neuron_policy *p) {
    if (p) p->iface->free(p);
}

/* ---- groups ---------------------------------------------------------------------------- */

void qi_neuron_groups_fini(qi_neuron_groups *g) {
    qi_free(g->rank);
    qi_free(g->mass);
    qi_free(g->bytes);
    qi_free(g->layer_mass);
    memset(g, 0, sizeof *g);
}

/* neuron_policy.h; a neuron's rank within its layer, a group's in the
 * greedy's order */
void qi_neuron_sort_desc(int32_t *a, int32_t *tmp, int n, const double *v) {
    for (int w = 1; w < n; w *= 2) {
        for (int lo = 0; lo < n; lo += 2 * w) {
            const int mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
            int i = lo, j = mid, k = lo;
            while (i < mid && j < hi) tmp[k++] = v[a[j]] > v[a[i]] ? a[j++] : a[i++];
            while (i < mid) tmp[k++] = a[i++];
            while (j < hi) tmp[k++] = a[j++];
        }
        memcpy(a, tmp, sizeof *a * (size_t)n);
    }
}

qi_status qi_neuron_groups_init(qi_neuron_groups *g, const qi_neuron_input *in, qi_err *err) {
    memset(g, 0, sizeof *g);
    const int L = in->n_layer, F = in->n_ff;
    if (L < 1 || L > QI_NEURON_MAX_LAYERS)
        return QI_ERR(err, QI_ERR_INVALID, "neuron placement: %d layers (1 to %d)", L, QI_NEURON_MAX_LAYERS);
    if (F < 1 || F > QI_NEURON_MAX_FF)
        return QI_ERR(err, QI_ERR_INVALID, "neuron placement: %d neurons per layer (1 to %d)", F, QI_NEURON_MAX_FF);
    if (in->group < 0)
        return QI_ERR(err, QI_ERR_INVALID, "neuron placement: group of %d neurons (at least 1)", in->group);
    if (in->budget < 0)
        return QI_ERR(err, QI_ERR_INVALID, "neuron placement: a budget of %lld bytes (0 or more)",
                      (long long)in->budget);
    if (!in->activity || !in->neuron_bytes)
        return QI_ERR(err, QI_ERR_INVALID, "neuron placement: no activity or bytes per neuron given");
    const int G = in->group ? in->group : QI_NEURON_GROUP_DEFAULT;
    const int NG = (F + G - 1) / G;
    /* every neuron's bytes together below 2^62, so no sum of groups overflows */
    uint64_t all = 0;
    for (int l = 0; l < L; l++) {
        const uint64_t b = in->neuron_bytes[l];
        if (b == 0) return QI_ERR(err, QI_ERR_INVALID, "neuron placement: layer %d: 0 bytes per neuron", l);
        if (b > ((UINT64_C(1) << 62) - all) / (uint64_t)F)
            return QI_ERR(err, QI_ERR_INVALID,
                          "neuron placement: layer %d: %llu bytes per neuron takes the FFN past 2^62 bytes", l,
                          (unsigned long long)b);
        all += b * (uint64_t)F;
        for (int j = 0; j < F; j++) {
            const double v = in->activity[(size_t)l * F + j];
            if (!isfinite(v) || v < 0.0)
                return QI_ERR(err, QI_ERR_INVALID, "neuron placement: layer %d neuron %d: activity %g (finite, >= 0)",
                              l, j, v);
        }
    }
    g->n_layer = L;
    g->n_ff = F;
    g->group = G;
    g->n_groups = NG;
    g->budget = in->budget;
    g->rank = qi_malloc(sizeof *g->rank * (size_t)L * F);
    g->mass = qi_calloc((size_t)L * NG, sizeof *g->mass);
    g->bytes = qi_calloc((size_t)L * NG, sizeof *g->bytes);
    g->layer_mass = qi_calloc((size_t)L, sizeof *g->layer_mass);
    int32_t *tmp = qi_malloc(sizeof *tmp * (size_t)F);
    if (!g->rank || !g->mass || !g->bytes || !g->layer_mass || !tmp) {
        qi_free(tmp);
        qi_neuron_groups_fini(g);
        return QI_ERR(err, QI_ERR_NOMEM, "neuron placement: out of memory for %d x %d neurons", L, F);
    }
    for (int l = 0; l < L; l++) {
        const double *v = in->activity + (size_t)l * F;
        int32_t *r = g->rank + (size_t)l * F;
        for (int j = 0; j < F; j++) r[j] = j;
        qi_neuron_sort_desc(r, tmp, F, v);
        for (int k = 0; k < F; k++) {
            g->mass[(size_t)l * NG + k / G] += v[r[k]];
            g->layer_mass[l] += v[r[k]];
        }
        for (int k = 0; k < NG; k++) {
            const int n = (k + 1) * G <= F ? G : F - k * G;
            g->bytes[(size_t)l * NG + k] = (uint64_t)n * in->neuron_bytes[l];
        }
    }
    qi_free(tmp);
    return QI_OK;
}

/* ---- plans ----------------------------------------------------------------------------- */

void qi_neuron_plan_fini(qi_neuron_plan *p) {
    qi_free(p->group_fast);
    qi_free(p->fast);
    qi_free(p->n_fast);
    qi_free(p->groups_fast);
    qi_free(p->mass_fast);
    qi_free(p->mass);
    qi_free(p->bytes);
    memset(p, 0, sizeof *p);
}

qi_status qi_neuron_plan_from_groups(const qi_neuron_groups *g, const uint8_t *x, qi_neuron_plan *p, qi_err *err) {
    memset(p, 0, sizeof *p);
    const int L = g->n_layer, F = g->n_ff, NG = g->n_groups, G = g->group;
    p->n_layer = L;
    p->n_ff = F;
    p->group = G;
    p->n_groups = NG;
    p->budget = g->budget;
    p->bound = NAN;
    p->group_fast = qi_malloc((size_t)L * NG);
    p->fast = qi_calloc((size_t)L * F, 1);
    p->n_fast = qi_calloc((size_t)L, sizeof *p->n_fast);
    p->groups_fast = qi_calloc((size_t)L, sizeof *p->groups_fast);
    p->mass_fast = qi_calloc((size_t)L, sizeof *p->mass_fast);
    p->mass = qi_calloc((size_t)L, sizeof *p->mass);
    p->bytes = qi_calloc((size_t)L, sizeof *p->bytes);
    if (!p->group_fast || !p->fast || !p->n_fast || !p->groups_fast || !p->mass_fast || !p->mass || !p->bytes) {
        qi_neuron_plan_fini(p);
        return QI_ERR(err, QI_ERR_NOMEM, "neuron placement: out of memory for the plan");
    }
    memcpy(p->group_fast, x, (size_t)L * NG);
    for (int l = 0; l < L; l++) {
        p->mass[l] = g->layer_mass[l];
        for (int k = 0; k < NG; k++) {
            if (!x[(size_t)l * NG + k]) continue;
            const int lo = k * G, hi = lo + G < F ? lo + G : F;
            for (int r = lo; r < hi; r++) p->fast[(size_t)l * F + g->rank[(size_t)l * F + r]] = 1;
            p->n_fast[l] += hi - lo;
            p->groups_fast[l]++;
            p->mass_fast[l] += g->mass[(size_t)l * NG + k];
            p->bytes[l] += g->bytes[(size_t)l * NG + k];
        }
        p->total_mass_fast += p->mass_fast[l];
        p->total_mass += p->mass[l];
        p->total_bytes += p->bytes[l];
    }
    return QI_OK;
}

qi_status qi_neuron_policy_place(qi_neuron_policy *p, const qi_neuron_input *in, qi_neuron_plan *out, qi_err *err) {
    memset(out, 0, sizeof *out);
    const char *name = p->iface->name;
    qi_neuron_groups g;
    qi_status st = qi_neuron_groups_init(&g, in, err);
    if (st) return st;
    const size_t n = (size_t)g.n_layer * g.n_groups;
    uint8_t *x = qi_calloc(n, 1);
    if (!x) {
        qi_neuron_groups_fini(&g);
        return QI_ERR(err, QI_ERR_NOMEM, "neuron policy '%s': out of memory", name);
    }
    qi_neuron_place_info info = {.optimal = false, .bound = NAN};
    st = p->iface->place(p, &g, x, &info, err);
    if (!st) {
        uint64_t used = 0;
        for (size_t i = 0; i < n && !st; i++) {
            if (x[i] > 1)
                st = QI_ERR(err, QI_ERR_BACKEND,
                            "neuron policy '%s' broke its contract: group %zu of layer %zu set to %d", name,
                            i % (size_t)g.n_groups, i / (size_t)g.n_groups, x[i]);
            else if (x[i])
                used += g.bytes[i];
        }
        if (!st && used > (uint64_t)g.budget)
            st = QI_ERR(err, QI_ERR_BACKEND,
                        "neuron policy '%s' broke its contract: its groups take %llu bytes of a %lld-byte budget", name,
                        (unsigned long long)used, (long long)g.budget);
    }
    if (!st) st = qi_neuron_plan_from_groups(&g, x, out, err);
    if (!st) {
        out->optimal = info.optimal;
        out->bound = info.bound;
    }
    qi_free(x);
    qi_neuron_groups_fini(&g);
    return st;
}

/* ---- model figures and accuracy -------------------------------------------------------- */

qi_status qi_neuron_bytes_of_model(const qi_model *m, uint64_t *out, qi_err *err) {
    const int64_t F = m->hp.n_ff;
    if (F < 1) return QI_ERR(err, QI_ERR_INVALID, "neuron bytes: the model's FFN width is %lld", (long long)F);
    const bool gated = !qi_ffn_gate_free(m->hp.ffn_act);
    for (int l = 0; l < m->hp.n_layer; l++) {
        const qi_layer *y = &m->layers[l];
        if ((gated && y->w_gate.n_rows != F) || y->w_up.n_rows != F || y->w_down.n_cols != F)
            return QI_ERR(err, QI_ERR_INVALID,
                          "neuron bytes: layer %d's FFN matrices are not %lld neurons wide (gate %lld rows, up %lld, "
                          "down %lld columns)",
                          l, (long long)F, (long long)(gated ? y->w_gate.n_rows : F), (long long)y->w_up.n_rows,
                          (long long)y->w_down.n_cols);
        const uint64_t down = y->w_down.row_bytes * (uint64_t)y->w_down.n_rows;
        out[l] = (gated ? y->w_gate.row_bytes : 0) + y->w_up.row_bytes + (down + (uint64_t)F - 1) / (uint64_t)F;
    }
    return QI_OK;
}

void qi_neuron_recall(const uint8_t *fast, const int64_t *count, int n, long tokens, qi_neuron_rp *out) {
    int64_t hit = 0, active = 0, nf = 0;
    for (int j = 0; j < n; j++) {
        active += count[j];
        if (fast[j]) {
            hit += count[j];
            nf++;
        }
    }
    out->hit = hit;
    out->active = active;
    out->fast = nf;
    out->recall = active > 0 ? (double)hit / (double)active : NAN;
    out->precision = nf > 0 && tokens > 0 ? (double)hit / ((double)tokens * (double)nf) : NAN;
}

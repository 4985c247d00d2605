/* calib_loo.c - `qinfer calibrate --loo`: the calibration checked on what it
 * was not fitted on (calib_int.h).
 *
 * Leave-one-shape-out: the points of every model of one shape (its width,
 * FFN width, layers and heads) are left out, the keys fitted to all the
 * others (fitted and held-out points alike), and the left-out points
 * predicted. Leave-one-weight-type-out: the same for every model that
 * computes with one weight type (a model of mixed types, as Gemma 3's
 * q5_0, q4_K and q6_K, is left out with each of them). Each fit starts at
 * the full fit's values. The errors are kept apart by what they time:
 * prefill, decode of one sequence (B = 1) and batched decode (B > 1).
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "backend.h"
#include "calib_int.h"
#include "qinfer/types.h"

/* the weight types model m's matmuls use, as a mask of type ids < 64 */
static uint64_t type_mask(const qi_model *m) {
    uint64_t mask = 0;
    for (int l = 0; l < m->hp.n_layer; l++) {
        const qi_layer *L = &m->layers[l];
        const qi_weight *w[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (size_t i = 0; i < sizeof w / sizeof w[0]; i++)
            if (w[i]->data && w[i]->type < 64) mask |= 1ull << w[i]->type;
    }
    if (m->output.data && m->output.type < 64) mask |= 1ull << m->output.type;
    return mask;
}

static void shape_key(const qi_model *m, char *out, size_t cap) {
    snprintf(out, cap, "%dx%d/%d, %d layers", m->hp.n_embd, m->hp.n_ff, m->hp.n_head, m->hp.n_layer);
}

typedef struct {
    double s[3];
    int n[3];
} kind_err; /* prefill, decode (B = 1), batched decode (B > 1) */

static void add_err(kind_err *e, const point *p, const double *pred) {
    for (int k = 0; k < 2; k++) {
        const int kind = k == 0 ? 0 : p->batch == 1 ? 1 : 2;
        e->s[kind] += fabs(pred[k] - p->meas[k]) / p->meas[k];
        e->n[kind]++;
    }
}

static void print_row(const char *what, int n_pts, const kind_err *e) {
    printf("| %s | %d |", what, n_pts);
    for (int k = 0; k < 3; k++) {
        if (e->n[k]) printf(" %.1f%% (%d) |", 100 * e->s[k] / e->n[k], e->n[k]);
        else printf(" - |");
    }
    printf("\n");
}

/* Fit to every point outside the group (in[i] false), predict the group. */
static qi_status leave_out(cal_ctx *c, const bool *in, const char *const *keys, const double *vals, const double *lo,
                           const double *hi, int n_keys, int max_evals, double max_others, kind_err *row,
                           kind_err *all, int *n_pts, qi_err *err) {
    double *meas = qi_malloc(sizeof *meas * 2 * (size_t)c->n_pts), v[MAX_KEYS];
    if (!meas) return QI_ERR(err, QI_ERR_NOMEM, "out of memory");
    int n = 0;
    for (int i = 0; i < c->n_pts; i++) {
        point *p = &c->pts[i];
        p->in_fit = !in[i] && !p->excluded;
        if (p->in_fit) meas[n++] = p->meas[0], meas[n++] = p->meas[1];
    }
    memcpy(v, vals, sizeof(double) * (size_t)n_keys);
    qi_status st = n ? qi_calib_fit(keys, v, lo, hi, n_keys, meas, n, calib_predict, c, max_evals, NULL, err) : QI_OK;
    qi_free(meas);
    if (st || !n) return st;
    c->fit_only = false;
    c->pass = 2;
    st = calib_predict(c, keys, v, n_keys, NULL, err);
    c->fit_only = true;
    *n_pts = 0;
    for (int i = 0; !st && i < c->n_pts; i++) {
        const point *p = &c->pts[i];
        if (!in[i] || p->excluded || p->others > max_others) continue;
        add_err(row, p, p->tmp);
        add_err(all, p, p->tmp);
        (*n_pts)++;
    }
    return st;
}

qi_status calib_loo(cal_ctx *c, char (*names)[256], int n_models, const char *const *keys, const double *vals,
                    const double *lo, const double *hi, int n_keys, int max_evals, double max_others, qi_err *err) {
    bool *in = qi_calloc((size_t)c->n_pts, sizeof *in);
    if (!in) return QI_ERR(err, QI_ERR_NOMEM, "out of memory");
    const bool fit_only = c->fit_only;
    c->fit_only = true;
    qi_status st = QI_OK;
    char key[MAX_MODELS][96];
    uint64_t mask[MAX_MODELS], types = 0;
    for (int mi = 0; mi < n_models; mi++) {
        shape_key(c->m[mi], key[mi], sizeof key[mi]);
        mask[mi] = type_mask(c->m[mi]);
        types |= mask[mi];
    }
    printf("\nleave-one-out: each group's points predicted by a fit (%d keys, from the full fit) to every other "
           "point; MAPE (times)\n\n",
           n_keys);
    printf("| left out | points | prefill | decode, B = 1 | batched decode, B > 1 |\n|---|---:|---:|---:|---:|\n");
    kind_err all_shape = {0}, all_type = {0};
    int n_shape = 0, n_type = 0;
    /* shapes: each distinct key once, with the models that share it */
    for (int mi = 0; !st && mi < n_models; mi++) {
        bool first = true;
        for (int j = 0; j < mi; j++) first &= strcmp(key[j], key[mi]) != 0;
        if (!first) continue;
        char what[512];
        int len = snprintf(what, sizeof what, "shape %s:", key[mi]);
        for (int j = 0; j < n_models; j++)
            if (!strcmp(key[j], key[mi]) && len < (int)sizeof what)
                len += snprintf(what + len, sizeof what - (size_t)len, " %s", names[j]);
        for (int i = 0; i < c->n_pts; i++) in[i] = !strcmp(key[c->pts[i].model], key[mi]);
        kind_err row = {0};
        int n_pts = 0;
        st = leave_out(c, in, keys, vals, lo, hi, n_keys, max_evals, max_others, &row, &all_shape, &n_pts, err);
        if (!st) print_row(what, n_pts, &row), n_shape++;
    }
    if (!st) print_row("**every shape, each left out**", n_shape, &all_shape);
    for (uint32_t t = 0; !st && t < 64; t++) {
        if (!(types >> t & 1)) continue;
        const qi_type_info *ti = qi_type_get(t);
        char what[512];
        int len = snprintf(what, sizeof what, "type %s:", ti && ti->name ? ti->name : "?");
        for (int j = 0; j < n_models; j++)
            if ((mask[j] >> t & 1) && len < (int)sizeof what)
                len += snprintf(what + len, sizeof what - (size_t)len, " %s", names[j]);
        for (int i = 0; i < c->n_pts; i++) in[i] = mask[c->pts[i].model] >> t & 1;
        kind_err row = {0};
        int n_pts = 0;
        st = leave_out(c, in, keys, vals, lo, hi, n_keys, max_evals, max_others, &row, &all_type, &n_pts, err);
        if (!st) print_row(what, n_pts, &row), n_type++;
    }
    if (!st) print_row("**every weight type, each left out**", n_type, &all_type);
    /* the points' own fit flags back */
    for (int i = 0; i < c->n_pts; i++) c->pts[i].in_fit = c->pts[i].fit && !c->pts[i].excluded;
    c->fit_only = fit_only;
    qi_free(in);
    return st;
}

/* engine_activity.c - predictor-gated FFN sparsity on a simulated machine
 * (opts.sim_activity, the model of qinfer/activity.h).
 *
 * The simulator computes no activations, so where a system gates its FFN
 * by an activation predictor (PowerInfer, Q-Infer) the rows a step reads
 * come from the activity model: of a layer's neurons of ranks [lo, hi)
 * (the hottest first: a split's fast side holds the hottest share s, its
 * slow side the rest), a step of B tokens reads gate's and up's rows and
 * down's columns of the union over its tokens, union(lo, hi, B) x n_ff
 * neurons, rounded up to whole blocks of down's type. The predictor, a
 * two-matrix MLP (E -> r -> n_ff) of the spec's share of the model's
 * parameters spread evenly over the layers, runs first on the device that
 * holds the layer's hot side (a split's fast device, else the MLP's), in
 * the FFN's weight type. Nothing is computed; the simulated devices time
 * the views. Not modelled: the predictor's weights in the device's memory
 * (an experiment caps the device below them), the copy of the predicted
 * set to the other side. */
#include "engine_int.h"

qi_status eng_activity_setup(qi_engine *e, qi_err *err) {
    const char *spec = e->o.sim_activity;
    if (!spec) return QI_OK;
    const qi_hparams *hp = &e->m->hp;
    if (!e->o.sim)
        return QI_ERR(err, QI_ERR_INVALID, "sim_activity models the activity of a simulated machine, and this one is "
                      "real (its activations are computed: sparsity)");
    if (qi_ffn_gate_free(hp->ffn_act) || hp->parallel)
        return QI_ERR(err, QI_ERR_UNSUPPORTED, "sim_activity reads gate's, up's and down's active neurons, and "
                      "%s's MLP has no gate or runs beside its attention", hp->arch_name);
    if (e->o.sim_cold_density > 0.0)
        return QI_ERR(err, QI_ERR_INVALID, "sim_activity and sim_cold_density both set what the FFN reads: one of them");
    if (e->o.sparsity) return QI_ERR(err, QI_ERR_INVALID, "sim_activity on a simulated machine replaces sparsity");
    e->act = qi_calloc(1, sizeof *e->act);
    if (!e->act) return QI_ERR(err, QI_ERR_NOMEM, "activity model");
    qi_status st = qi_activity_parse(spec, e->act, err);
    if (st) {
        qi_free(e->act);
        e->act = NULL;
        return st;
    }
    if (e->act->n_layer != 1 && (e->act->n_layer != hp->n_layer || e->act->n_lv != hp->n_ff)) {
        const int L = e->act->n_layer, F = e->act->n_lv;
        eng_activity_free(e);
        return QI_ERR(err, QI_ERR_INVALID, "sim_activity: the profile has %d layers of %d neurons, the model %d of %d",
                      L, F, hp->n_layer, hp->n_ff);
    }
    if (e->act->pred > 0.0) {
        const double E = hp->n_embd, qd = (double)hp->n_head * hp->head_dim, kvd = (double)hp->n_head_kv * hp->head_dim;
        const double layer = E * qd * 2 + E * kvd * 2 + 3 * E * hp->n_ff;
        const double params = hp->n_layer * layer + 2.0 * hp->n_vocab * E;
        const double r = e->act->pred * params / hp->n_layer / (E + hp->n_ff);
        e->act_r = (int)ceil(r / 256.0) * 256; /* whole blocks of every type */
        if (e->act_r > hp->n_ff) e->act_r = hp->n_ff;
    }
    return QI_OK;
}

void eng_activity_free(qi_engine *e) {
    if (!e->act) return;
    qi_activity_fini(e->act);
    qi_free(e->act);
    e->act = NULL;
}

void qi_engine_activity_rows(const qi_engine *e, double out[2]) {
    out[0] = e->act_rows[0];
    out[1] = e->act_rows[1];
}

/* The predictor on D over rows tokens: D's xn -> gate (r wide) -> up
 * (n_ff wide), views in the type of up, a weight D holds (its data is
 * never read: the devices are simulated). */
static qi_status predict(qi_engine *e, const dev_state *D, const qi_weight *up, int rows, qi_err *err) {
    if (!e->act_r) return QI_OK;
    qi_weight a = *up, b = *up;
    a.n_rows = e->act_r; /* E -> r */
    a.n_cols = e->m->hp.n_embd;
    b.n_rows = e->m->hp.n_ff; /* r -> n_ff */
    b.n_cols = e->act_r;
    if (!qi_type_row_bytes(a.type, (uint64_t)a.n_cols, &a.row_bytes))
        return QI_ERR(err, QI_ERR_INVALID, "the predictor's %d columns are not whole blocks of its type", (int)a.n_cols);
    if (!qi_type_row_bytes(b.type, (uint64_t)e->act_r, &b.row_bytes))
        return QI_ERR(err, QI_ERR_INVALID, "the predictor's %d columns are not whole blocks of its type", e->act_r);
    qi_status st = eng_matmul(e, D->be, &a, D->xn, rows, D->gate, err);
    return st ? st : eng_matmul(e, D->be, &b, D->gate, rows, D->up, err);
}

/* One side: of its n neurons (w: gate, up, down views of them), those of
 * the layer's ranks [lo, hi) active on any of the rows, left in D->xn. */
static qi_status side(qi_engine *e, const dev_state *D, const qi_weight *w, int n, int l, double lo, double hi, int rows,
                      bool gelu, int s, qi_err *err) {
    const int unit = (int)qi_type_get(w[2].type)->blck;
    const double want = qi_activity_union(e->act, l, lo, hi, rows) * e->m->hp.n_ff;
    int k = (int)ceil(want / unit - 1e-9) * unit;
    k = k > n ? n : k < 0 ? 0 : k;
    e->act_rows[s] += k;
    if (k == 0) return qi_backend_scale(D->be, D->xn, (long)rows * e->m->hp.n_embd, 0.0f, err); /* nothing active */
    qi_weight g = w[0], u = w[1], d = w[2];
    g.n_rows = u.n_rows = k;
    d.n_cols = k;
    if (!qi_type_row_bytes(d.type, (uint64_t)k, &d.row_bytes))
        return QI_ERR(err, QI_ERR_INVALID, "%d neurons are not whole blocks of down's type", k);
    qi_status st;
    const qi_weight *gu[2] = {&g, &u};
    float *const gu_out[2] = {D->gate, D->up};
    if ((st = eng_matmul_n(e, D->be, gu, gu_out, 2, D->xn, rows, err))) return st;
    if ((st = qi_backend_glu(D->be, gelu, D->gate, D->up, rows, k, err))) return st;
    return eng_matmul(e, D->be, &d, D->gate, rows, D->xn, err);
}

qi_status eng_activity_whole(qi_engine *e, const dev_state *M, int l, int rows, bool gelu, qi_err *err) {
    const qi_layer *ly = &M->layers[l];
    const qi_weight w[3] = {ly->w_gate, ly->w_up, ly->w_down};
    qi_status st = predict(e, M, &ly->w_up, rows, err);
    return st ? st : side(e, M, w, e->m->hp.n_ff, l, 0.0, 1.0, rows, gelu, M == &e->dev[0] ? 0 : 1, err);
}

qi_status eng_activity_split(qi_engine *e, int l, int rows, bool gelu, const dev_state *M, const dev_state *F,
                             int n_slow, int n_fast, const qi_weight *w_slow, const qi_weight *w_fast, qi_err *err) {
    const double s = (double)n_fast / e->m->hp.n_ff;
    qi_status st = predict(e, F, &w_fast[1], rows, err);
    if (!st) st = side(e, F, w_fast, n_fast, l, 0.0, s, rows, gelu, 1, err);
    if (!st && n_slow) st = side(e, M, w_slow, n_slow, l, s, 1.0, rows, gelu, 0, err);
    return st;
}

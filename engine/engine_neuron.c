/* engine_neuron.c - a layer's FFN split by neurons (opts.neuron_fast):
 * the hot units gathered onto the fast device, the cold ones on the CPU,
 * both sides computed at once and their partial down products added.
 * Every unit on one side is the unsplit arithmetic bit for bit. Also the
 * split's checks against the model (qi_engine_neuron_check), the active
 * neurons counted per side and the calibration timer. The swaps that move
 * units between the sides are engine_swap.c's. */
#include "engine_int.h"

int qi_engine_neuron_unit(const qi_model *m) {
    if (m->hp.n_layer < 1 || qi_ffn_gate_free(m->hp.ffn_act)) return 0;
    return qi_ffn_split_unit(&m->layers[0]);
}

/* One side of a split layer's FFN, gate, up and down in w, prepared on
 * device d: a buffer of its own where d holds a copy (*buf, NULL when d
 * computes on the host's gathered rows), each matrix at offs[i] in it
 * (offs may be NULL). */
static qi_status neuron_prepare(qi_engine *e, int d, int l, const qi_weight *w, qi_weight *out, qi_buf **buf,
                                size_t *offs, qi_err *err) {
    qi_backend *b = e->dev[d].be;
    size_t total = 0, sz[3];
    for (int i = 0; i < 3; i++) total += eng_walign(sz[i] = qi_dev_weight_size(b, &w[i], true));
    *buf = NULL;
    char what[48];
    snprintf(what, sizeof what, "layer %d's hot neurons", l);
    qi_status st = total ? qi_buf_alloc(b, total, what, buf, err) : QI_OK;
    size_t off = 0;
    for (int i = 0; i < 3 && !st; i++) {
        if (offs) offs[i] = off;
        st = qi_dev_weight_prepare(b, &w[i], true, qi_view_of(*buf, off), &out[i], err);
        off += eng_walign(sz[i]);
    }
    return st;
}

double qi_engine_neuron_time(void *engine, int fast, int n_neurons, int batch) {
    qi_engine *e = engine;
    const qi_model *m = e->m;
    const int unit = qi_engine_neuron_unit(m);
    const long R = (long)e->o.step_tokens + e->o.max_seqs;
    if (e->plan.n_devices < 2 || unit < 1 || batch < 1 || batch > R || n_neurons < 1 || n_neurons > m->hp.n_ff)
        return NAN;
    const int nu = m->hp.n_ff / unit, k = (n_neurons + unit - 1) / unit;
    uint8_t *mask = qi_calloc((size_t)nu, 1);
    if (!mask) return NAN;
    for (int u = 0; u < k; u++) mask[u] = 1;
    qi_ffn_split sp;
    qi_err err = {0};
    double t = NAN;
    if (qi_ffn_split_build(&m->layers[0], mask, !qi_gguf_shapes_only(m->gguf), &sp, &err) == QI_OK) {
        const dev_state *D = &e->dev[fast ? 1 : 0];
        const qi_weight w[3] = {sp.gate[1], sp.up[1], sp.down[1]};
        qi_weight dw[3];
        qi_buf *buf = NULL;
        qi_event *a = NULL, *b = NULL;
        /* the pair NEURON_TIME_ITERS times between the events, so that a
         * small model's products stand above the timer's noise */
        enum { NEURON_TIME_ITERS = 8 };
        bool ok = !neuron_prepare(e, fast ? 1 : 0, 0, w, dw, &buf, NULL, &err) && !qi_dev_synchronize(D->be, &err) &&
                  !qi_event_record(D->be, &a, &err);
        for (int i = 0; i < NEURON_TIME_ITERS && ok; i++)
            ok = !qi_backend_matmul_n(D->be, (const qi_weight *const[]){&dw[1]}, (float *const[]){D->up}, 1, D->xn,
                                      batch, &err) &&
                 !qi_backend_matmul_n(D->be, (const qi_weight *const[]){&dw[2]}, (float *const[]){D->x}, 1, D->up,
                                      batch, &err);
        if (ok && !qi_event_record(D->be, &b, &err)) {
            qi_event_sync(b);
            t = qi_event_elapsed(a, b) / NEURON_TIME_ITERS;
        }
        qi_dev_synchronize(D->be, &err);
        qi_event_free(a);
        qi_event_free(b);
        qi_buf_free(buf);
        qi_ffn_split_free(&sp);
    }
    qi_free(mask);
    return t;
}

/* One layer's check (qi_engine_neuron_check): slot s of the fast side
 * (its bytes in fast, copied back) and the cold side's k-th unit against
 * the model's unit u. */
static bool unit_bytes_eq(const qi_layer *ly, const qi_ffn_split *sp, const char *gate, const char *up,
                          const char *down, uint64_t drow, int k, int u) {
    size_t gb, ub, blk;
    eng_unit_bytes(ly, sp->unit, &gb, &ub, &blk);
    if (memcmp(gate + (size_t)k * gb, (const char *)ly->w_gate.data + (size_t)u * gb, gb) ||
        memcmp(up + (size_t)k * ub, (const char *)ly->w_up.data + (size_t)u * ub, ub))
        return false;
    for (int64_t r = 0; r < ly->w_down.n_rows; r++)
        if (memcmp(down + (size_t)r * drow + (size_t)k * blk,
                   (const char *)ly->w_down.data + (size_t)r * ly->w_down.row_bytes + (size_t)u * blk, blk))
            return false;
    return true;
}

/* The cold side's column form (cats) against one made afresh from its
 * down: the same matrix (qi_colw_same). */
static qi_status colw_check(const qi_colw *c, const qi_weight *down, int l, qi_err *err) {
    qi_colw f;
    qi_status st = qi_colw_build(down, &f, err);
    if (st) return st;
    if (!qi_colw_same(c, &f)) st = QI_ERR(err, QI_ERR_BACKEND, "layer %d: the cold side's column form is not its down's", l);
    qi_colw_free(&f);
    return st;
}

/* Layer l's two sides against the model, slot[] the units in the fast
 * slots (-1: empty, its gate rows then zero: it computes nothing): each
 * slot's bytes copied back, each cold position's unit (the spare's gate
 * rows zero), every unit in exactly one place, the column form its
 * down's. */
static qi_status check_layer(qi_engine *e, int l, const int32_t *slot, qi_err *err) {
    const qi_ffn_split *sp = &e->ns->split[l];
    const qi_layer *ly = &e->m->layers[l];
    qi_backend *fb = e->dev[e->o.neuron_dev].be;
    const int nu = sp->n_units, n1 = sp->n[1] / sp->unit;
    const size_t total = qi_buf_size(e->ns->buf[l][1]);
    char *host = qi_malloc(total);
    uint8_t *seen = qi_calloc((size_t)nu, 1);
    qi_status st = !host || !seen ? QI_ERR(err, QI_ERR_NOMEM, "out of memory checking layer %d", l) : QI_OK;
    /* what the main stream has made of the slots (the ops' order; the
     * copy stream's work reaches the slots only through it) */
    qi_event *ev = NULL;
    if (!st && !(st = qi_dev_download(fb, host, qi_view_of(e->ns->buf[l][1], 0), total, err)) &&
        !(st = qi_event_record(fb, &ev, err))) {
        qi_event_sync(ev);
        qi_event_free(ev);
    }
    size_t gb, ub, blk;
    eng_unit_bytes(ly, sp->unit, &gb, &ub, &blk);
    const size_t *off = e->ns->off[l];
    for (int s = 0; s < n1 && !st; s++) {
        if (slot[s] < 0 && e->o.neuron_swap_worker) { /* emptied by a swap in progress */
            for (size_t i = 0; i < gb && !st; i++)
                if (host[off[0] + (size_t)s * gb + i])
                    st = QI_ERR(err, QI_ERR_BACKEND, "layer %d: the fast device's empty slot %d computes", l, s);
            continue;
        }
        if (slot[s] < 0 || slot[s] >= nu || seen[slot[s]] ||
            !unit_bytes_eq(ly, sp, host + off[0], host + off[1], host + off[2], sp->down[1].row_bytes, s, slot[s]))
            st = QI_ERR(err, QI_ERR_BACKEND, "layer %d: the fast device's slot %d does not hold unit %d", l, s, slot[s]);
        else
            seen[slot[s]] = 1;
    }
    /* the cold side's positions: the units in no slot, in order, or where
     * swaps put them */
    for (int k = 0, u = 0; k < sp->n[0] / sp->unit && !st; k++) {
        while (!e->ns->live && u < nu && seen[u]) u++;
        const int cu = e->ns->live ? e->ns->cold[(size_t)l * nu + k] : u++;
        if (cu < 0 && e->ns->live && k == e->ns->spare[l]) { /* the spare: zero gate rows, computing nothing */
            for (size_t i = 0; i < gb && !st; i++)
                if (((const char *)sp->gate[0].data)[(size_t)k * gb + i])
                    st = QI_ERR(err, QI_ERR_BACKEND, "layer %d: the cold side's spare place %d computes", l, k);
            continue;
        }
        if (cu < 0 || cu >= nu || seen[cu])
            st = QI_ERR(err, QI_ERR_BACKEND, "layer %d: the cold side's position %d holds unit %d, which is "
                        "elsewhere too", l, k, cu);
        else if (!unit_bytes_eq(ly, sp, sp->gate[0].data, sp->up[0].data, sp->down[0].data, sp->down[0].row_bytes, k,
                                cu))
            st = QI_ERR(err, QI_ERR_BACKEND, "layer %d: the cold side's unit %d is not the model's unit %d", l, k, cu);
        else
            seen[cu] = 1;
    }
    for (int u = 0; u < nu && !st; u++)
        if (!seen[u]) st = QI_ERR(err, QI_ERR_BACKEND, "layer %d: unit %d is on neither side", l, u);
    if (!st && e->ns->cw[l].codes) st = colw_check(&e->ns->cw[l], &sp->down[0], l, err);
    qi_free(seen);
    qi_free(host);
    return st;
}

qi_status qi_engine_neuron_check(qi_engine *e, qi_err *err) {
    if (!e->ns || qi_gguf_shapes_only(e->m->gguf)) return QI_OK;
    if (e->ns->live) qi_neuron_live_sync(e->ns->live); /* the background worker's swaps of what was fed */
    qi_status st = QI_OK;
    for (int l = 0; l < e->m->hp.n_layer && !st; l++) {
        const qi_ffn_split *sp = &e->ns->split[l];
        if (!sp->n[1]) continue;
        const int nu = sp->n_units;
        /* the units in the slots: the live state's (held still), or the
         * mask's in order */
        if (e->ns->live) {
            qi_neuron_live_view v;
            qi_neuron_live_begin(e->ns->live, l, &v);
            st = qi_neuron_live_view_check(&v, l, err);
            if (!st) st = check_layer(e, l, v.slot, err);
            qi_neuron_live_end(e->ns->live, l);
            continue;
        }
        int32_t *slot = qi_malloc(sizeof(int32_t) * (size_t)nu);
        if (!slot) return QI_ERR(err, QI_ERR_NOMEM, "out of memory checking layer %d", l);
        for (int u = 0, s = 0; u < nu; u++)
            if (e->ns->mask[(size_t)l * nu + u]) slot[s++] = u;
        st = check_layer(e, l, slot, err);
        qi_free(slot);
    }
    return st;
}

void qi_engine_neuron_check_steps(qi_engine *e, bool on, int stall_us) {
    if (!e->ns) return;
    e->ns->check_steps = on;
    e->ns->stall_us = stall_us;
}

/* opts.neuron_fast (checked by eng_check_neurons): each split layer's FFN
 * gathered into its two sides and the fast side prepared on neuron_dev.
 * The plan and the options stay as asked; qi_engine_plan shows the split
 * (eng_neurons_show). */
qi_status eng_neuron_setup(qi_engine *e, qi_err *err) {
    const qi_model *m = e->m;
    const qi_hparams *hp = &m->hp;
    const int L = hp->n_layer, fd = e->o.neuron_dev;
    if (!e->o.neuron_fast) return QI_OK;
    const qi_plan *p = &e->plan;
    const int unit = qi_engine_neuron_unit(m), nu = hp->n_ff / unit;
    const size_t n = (size_t)L * (size_t)nu;
    if (!(e->ns = qi_calloc(1, sizeof *e->ns))) return QI_ERR(err, QI_ERR_NOMEM, "out of memory for a neuron split");
    if (e->o.neuron_active > 0.0f) e->ns->rp = qi_calloc((size_t)L, sizeof *e->ns->rp);
    if (e->o.neuron_active > 0.0f || e->o.neuron_swap_every > 0) {
        e->ns->obs = qi_malloc(sizeof(float) * ((size_t)e->o.step_tokens + (size_t)e->o.max_seqs) * (size_t)hp->n_ff);
        if ((e->o.neuron_active > 0.0f && !e->ns->rp) || !e->ns->obs)
            return QI_ERR(err, QI_ERR_NOMEM, "out of memory for the neuron counts");
    }
    e->ns->mask = qi_malloc(n);
    e->ns->split = qi_calloc((size_t)L, sizeof *e->ns->split);
    e->ns->w = qi_calloc((size_t)L, sizeof *e->ns->w);
    e->ns->buf = qi_calloc((size_t)L, sizeof *e->ns->buf);
    e->ns->cw = qi_calloc((size_t)L, sizeof *e->ns->cw);
    e->ns->off = qi_calloc((size_t)L, sizeof *e->ns->off);
    if (!e->ns->mask || !e->ns->split || !e->ns->w || !e->ns->buf || !e->ns->cw || !e->ns->off)
        return QI_ERR(err, QI_ERR_NOMEM, "out of memory for a neuron split of %d layers", L);
    memcpy(e->ns->mask, e->o.neuron_fast, n);
    qi_status st = qi_plan_copy(&e->ns->shown, p, err);
    if (st) return st;
    const bool copy = !qi_gguf_shapes_only(m->gguf);
    for (int l = 0; l < L; l++) {
        const uint8_t *mask = e->ns->mask + (size_t)l * (size_t)nu;
        int any = 0;
        for (int i = 0; i < nu; i++) any += mask[i] != 0;
        if (!any) continue;
        if ((st = qi_ffn_split_build_spare(&m->layers[l], mask, copy, e->o.neuron_swap_worker ? 1 : 0, &e->ns->split[l], err)))
            return st;
        for (int s = 0; s < 2; s++) {
            const qi_weight w[3] = {e->ns->split[l].gate[s], e->ns->split[l].up[s], e->ns->split[l].down[s]};
            if (e->ns->split[l].n[s] &&
                (st = neuron_prepare(e, s ? fd : 0, l, w, e->ns->w[l][s], &e->ns->buf[l][s], s ? e->ns->off[l] : NULL, err)))
                return st;
        }
        /* cats on the cold side: its down read by the active columns */
        if (e->sp.w && e->ns->split[l].n[0] && qi_colw_supported(&e->ns->split[l].down[0]) &&
            (st = qi_colw_build(&e->ns->split[l].down[0], &e->ns->cw[l], err)))
            return st;
    }
    if ((st = qi_dev_synchronize(e->dev[fd].be, err))) return st;
    eng_neurons_show(e);
    return e->o.neuron_swap_every > 0 ? eng_live_setup(e, unit, nu, err) : QI_OK;
}

/* The engine's plan with the split shown in it: each split layer's
 * ffn_dev and ffn_rows (qi_engine_plan; a new plan, engine_replan.c). */
void eng_neurons_show(qi_engine *e) {
    qi_plan *v = &e->ns->shown;
    qi_plan_layer *ly = v->layers;
    *v = e->plan;
    v->layers = ly;
    memcpy(ly, e->plan.layers, sizeof *ly * (size_t)e->plan.n_layer);
    for (int l = 0; l < e->plan.n_layer; l++)
        if (e->ns->split[l].n[1]) {
            ly[l].ffn_dev = e->o.neuron_dev;
            ly[l].ffn_rows = e->ns->split[l].n[1];
        }
}

/* The neuron split's memory, all of it (none: nothing), the swap worker
 * stopped first: its swaps write it. */
void eng_neurons_free(qi_engine *e) {
    eng_neurons *ns = e->ns;
    if (!ns) return;
    const int L = e->m->hp.n_layer;
    if (ns->live) qi_neuron_live_stop(ns->live);
    if (ns->stage) { /* the fast stream may still wait for the last swap's event */
        qi_err ign = {0};
        (void)qi_dev_synchronize(qi_buf_device(ns->stage), &ign);
        qi_event_free(ns->stage_up);
        qi_event_free(ns->stage_read);
        qi_buf_free(ns->stage);
    }
    qi_neuron_live_free(ns->live);
    for (int l = 0; l < L; l++) {
        if (ns->split) qi_ffn_split_free(&ns->split[l]);
        if (ns->buf) qi_buf_free(ns->buf[l][0]), qi_buf_free(ns->buf[l][1]);
        if (ns->cw) qi_colw_free(&ns->cw[l]);
    }
    if (ns->mu_made) pthread_mutex_destroy(&ns->mu);
    void *p[] = {ns->mask, ns->split, ns->w, ns->buf, ns->off, ns->cw, ns->zero, ns->rp, ns->obs, ns->feed,
                 ns->acc, ns->acc_tok, ns->hot, ns->cold, ns->cpos, ns->spare};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) qi_free(p[i]);
    qi_plan_free(&ns->shown);
    qi_free(ns);
    e->ns = NULL;
}

/* opts.neuron_active: the active (row, neuron) pairs of layer l's
 * activations a [rows][n], on the fast side or not. */
void eng_count_active(qi_engine *e, int l, const float *a, int rows, int n, bool fast) {
    const float t = e->o.neuron_active;
    long long k = 0;
    for (size_t i = 0; i < (size_t)rows * (size_t)n; i++) k += fabsf(a[i]) > t;
    e->ns->rp[l].active += k;
    if (fast) e->ns->rp[l].hit += k;
}

bool qi_engine_neuron_stats(const qi_engine *e, int l, qi_engine_neuron_rp *out) {
    if (!e->ns || !e->ns->rp || l < 0 || l >= e->m->hp.n_layer) return false;
    *out = e->ns->rp[l];
    out->n_fast = e->ns->split[l].n[1];
    return true;
}

/* The cold side of a split FFN on the CPU under cats (opts.sparsity):
 * gate whole, its neurons with |act(gate)| over the layer's threshold
 * kept (the union over the rows), up's rows of those alone, the others
 * zeroed row by row, and down read by the kept columns (its column form,
 * of the dense path's 8-bit activations) where few enough are kept; the
 * dense matmuls otherwise. As eng_mlp_sparse's
 * cats, on the side's own matrices. */
static qi_status ffn_side_cats(qi_engine *e, const dev_state *M, int l, int rows, bool gelu, qi_err *err) {
    qi_status st;
    qi_event *t_op;
    const qi_weight *w = e->ns->w[l][0];
    const int n = e->ns->split[l].n[0];
    const size_t nn = (size_t)rows * (size_t)n;
    const float tg = eng_sp_thr(e, l, QI_SITE_GATE);
    if ((st = eng_matmul(e, M->be, &w[0], M->xn, rows, M->gate, err))) return st;
    memcpy(e->sp.act, M->gate, sizeof(float) * nn);
    if ((st = qi_backend_glu(M->be, gelu, e->sp.act, e->sp.ones, rows, n, err))) return st;
    const int n_act = eng_cats_keep(e, tg, rows, n);
    const bool sparse = (double)n_act <= e->o.sparse_max_density * n;
    if (sparse) {
        memset(M->up, 0, sizeof(float) * nn);
        if ((st = eng_mm_rows(e, M->be, &w[1], M->xn, rows, e->sp.idx, n_act, M->up, err))) return st;
    } else {
        if ((st = eng_matmul(e, M->be, &w[1], M->xn, rows, M->up, err))) return st;
    }
    if ((st = qi_backend_glu(M->be, gelu, M->gate, M->up, rows, n, err))) return st;
    for (size_t i = 0; i < nn; i++)
        if (e->sp.act[i] == 0.0f) M->gate[i] = 0.0f;
    const qi_colw *cw = &e->ns->cw[l];
    if (!sparse || !cw->codes) return eng_matmul(e, M->be, &w[2], M->gate, rows, M->xn, err);
    sp_job j = {.w = {cw}, .y = {M->xn}, .n_w = 1, .x = e->sp.xd, .T = rows, .idx = e->sp.idx, .n_idx = n_act,
                .fn = qi_sparse_matmul()};
    if ((st = eng_op_begin(e, M->be, &t_op, err))) return st;
    eng_sp_act8(e, qi_vec_dot_type(w[2].type), M->gate, rows, n, e->sp.xd);
    if ((st = eng_op_end(e, M->be, t_op, QI_OP_MATMUL, eng_sp_run(e, &j), err)))
        return st;
    if (e->o.profile)
        e->prof.matmul_bytes += (double)cw->col_bytes * n_act + (double)qi_colw_bytes(cw) -
                                (double)cw->col_bytes * (double)cw->n_in;
    return QI_OK;
}

/* The swap worker's window of layer l: each unit's |act| summed over the
 * rows, the cold side's from M's activations (by cold position; the spare
 * computes nothing) and the hot side's from the copy in ns_obs (by slot,
 * slot[] the live view's: an empty slot computes nothing). Fed at once,
 * or with the background worker summed until eng_live_round feeds it. */
static qi_status live_feed(qi_engine *e, int l, const float *cold, const int32_t *slot, int rows, qi_err *err) {
    const qi_ffn_split *sp = &e->ns->split[l];
    const int unit = sp->unit, n0 = sp->n[0], n1 = sp->n[1];
    const size_t nu = (size_t)sp->n_units;
    double *feed = e->o.neuron_swap_worker ? e->ns->acc + (size_t)l * nu : e->ns->feed;
    if (!e->o.neuron_swap_worker) memset(feed, 0, sizeof(double) * nu);
    for (int side = 0; side < 2; side++) {
        const int32_t *at = side ? slot : e->ns->cold + (size_t)l * nu;
        const int n = side ? n1 : n0;
        const float *a = side ? e->ns->obs : cold;
        for (int k = 0; k < n / unit; k++) {
            if (at[k] < 0) continue;
            for (int t = 0; t < rows; t++)
                for (int j = 0; j < unit; j++) feed[at[k]] += fabsf(a[(size_t)t * n + (size_t)k * unit + j]);
        }
    }
    if (e->o.neuron_swap_worker) {
        e->ns->acc_tok[l] += rows;
        return QI_OK;
    }
    return qi_neuron_live_feed(e->ns->live, l, feed, rows, err);
}

/* Both sides of split layer l's FFN from the normed input (in M->xn and
 * F->xn): F's queued first, so that the host's part overlaps it, each
 * side's partial product left in its xn; the active neurons counted and
 * the activity fed, by slot[] (the live view's) on the fast side. */
static qi_status mlp_split_sides(qi_engine *e, int l, int rows, bool gelu, const dev_state *M, const dev_state *F,
                                 const int32_t *slot, qi_err *err) {
    const qi_ffn_split *sp = &e->ns->split[l];
    qi_status st;
    if (e->act) /* the simulated activity: the predictor, then each side's active neurons */
        st = eng_activity_split(e, l, rows, gelu, M, F, sp->n[0], sp->n[1], e->ns->w[l][0], e->ns->w[l][1], err);
    else
        st = eng_ffn_side(e, F, e->ns->w[l][1], sp->n[1], rows, gelu, err);
    if (st) return st;
    if (!e->act && sp->n[0] && (st = e->sp.w && !e->sp.paused       ? ffn_side_cats(e, M, l, rows, gelu, err)
                          : e->o.sim_cold_density > 0.0 ? eng_ffn_sim_sparse(e, M, &e->ns->w[l][0][0], &e->ns->w[l][0][1],
                                                                         &e->ns->w[l][0][2], sp->n[0], rows, gelu, err)
                                                        : eng_ffn_side(e, M, e->ns->w[l][0], sp->n[0], rows, gelu, err)))
        return st;
    if (e->ns->rp || e->ns->live) { /* both sides' activations, the fast one's copied back */
        const size_t fb = sizeof(float) * (size_t)rows * (size_t)sp->n[1];
        if ((st = qi_dev_download(F->be, e->ns->obs, act_view(F, F->gate), fb, err)) ||
            (st = qi_dev_synchronize(F->be, err)))
            return st;
    }
    if (e->ns->rp) {
        e->ns->rp[l].tokens += rows;
        if (sp->n[0]) eng_count_active(e, l, M->gate, rows, sp->n[0], false);
        eng_count_active(e, l, e->ns->obs, rows, sp->n[1], true);
    }
    return e->ns->live ? live_feed(e, l, M->gate, slot, rows, err) : QI_OK;
}

/* The MLP block of a layer whose neurons are split (opts.neuron_fast):
 * the norm on the CPU (M), its result copied to the fast device (F), each
 * side's neurons computed at once (F's queued first, so that the host's
 * part overlaps it), F's partial product copied back and added to M's,
 * then the residual as in eng_mlp_block. */
qi_status eng_mlp_split(qi_engine *e, int l, int rows, qi_err *err) {
    const qi_hparams *hp = &e->m->hp;
    const dev_state *M = &e->dev[e->plan.layers[l].mlp_dev], *F = &e->dev[e->o.neuron_dev];
    const qi_ffn_split *sp = &e->ns->split[l];
    const bool gelu = hp->ffn_act == QI_FFN_GEGLU_TANH;
    const size_t nb = sizeof(float) * (size_t)rows * (size_t)hp->n_embd;
    qi_status st;
    xfer x;
    if ((st = qi_backend_rmsnorm(M->be, M->x, M->layers[l].ffn_norm.data, rows, hp->n_embd, hp->rms_eps, M->xn, err)))
        return st;
    /* the host overwrites M->xn below: it waits for the copy */
    if ((st = eng_xfer_begin(e, &x, F->be, M->be, err)) ||
        (st = eng_xfer_copy(e, &x, act_view(F, F->xn), act_view(M, M->xn), nb, err)) || (st = eng_xfer_end(e, &x, true, err)))
        return st;
    /* the layer held still while both sides compute it and its activity is
     * read (with the background worker, the time waited for its hold is
     * what the swaps cost this thread) */
    qi_neuron_live_view v = {0};
    if (e->ns->live) {
        const double t0 = e->o.neuron_swap_worker ? eng_now_s() : 0.0;
        qi_neuron_live_begin(e->ns->live, l, &v);
        if (e->o.neuron_swap_worker) {
            pthread_mutex_lock(&e->ns->mu);
            e->ns->swaps.seconds += eng_now_s() - t0;
            pthread_mutex_unlock(&e->ns->mu);
        }
    }
    if (e->o.neuron_swap_worker)
        for (int s = 0; s < sp->n[1] / sp->unit; s++)
            if (v.slot[s] < 0) {
                e->ns->swaps.mid++; /* this thread's alone */
                atomic_fetch_add(&e->ns->mid, 1);
                break;
            }
    if (e->ns->live && e->ns->check_steps && (st = check_layer(e, l, v.slot, err))) {
        qi_neuron_live_end(e->ns->live, l);
        return st;
    }
    st = mlp_split_sides(e, l, rows, gelu, M, F, v.slot, err);
    if (e->ns->live) qi_neuron_live_end(e->ns->live, l);
    if (st) return st;
    float *to = sp->n[0] ? M->nr : M->xn;
    if ((st = eng_xfer_begin(e, &x, M->be, F->be, err)) ||
        (st = eng_xfer_copy(e, &x, act_view(M, to), act_view(F, F->xn), nb, err)) || (st = eng_xfer_end(e, &x, false, err)))
        return st;
    if (sp->n[0] && (st = qi_backend_add(M->be, M->xn, M->nr, (long)rows * hp->n_embd, err))) return st;
    const qi_layer *ly = &M->layers[l];
    if (ly->ffn_post_norm.data &&
        (st = qi_backend_rmsnorm(M->be, M->xn, ly->ffn_post_norm.data, rows, hp->n_embd, hp->rms_eps, M->xn, err)))
        return st;
    return qi_backend_add(M->be, M->x, M->xn, (long)rows * hp->n_embd, err);
}

/* engine_swap.c - the neuron swaps of a split (opts.neuron_swap_every):
 * a round of the qinfer policy's swaps between steps, in the engine's
 * thread, or the background worker's swaps while the steps go on.
 *
 * Who writes what with the worker (the lock table):
 *   ns_hot, ns_cold, ns_cpos, ns_spare   the swap hooks, under the layer's
 *                                        write hold (qi_neuron_live); a
 *                                        step reads them under its read hold
 *   ns_stage, ns_stage_up/read          the worker alone
 *   ns_acc, ns_acc_tok                  the step's thread alone (fed by
 *                                        live_round)
 *   swaps, live_st, live_err            both threads, under swap_mu
 *   ns_mid                              atomic (the tests' pause) */
#include "engine_int.h"

/* A unit's bytes: its gate rows, its up rows, and its block of one row of
 * down. */
void eng_unit_bytes(const qi_layer *ly, int unit, size_t *gb, size_t *ub, size_t *blk) {
    *gb = (size_t)unit * ly->w_gate.row_bytes;
    *ub = (size_t)unit * ly->w_up.row_bytes;
    *blk = qi_type_get(ly->w_down.type)->size;
}

/* Unit u of layer l's model bytes into position k of the cold side, in
 * place: its gate and up rows and its block of every row of down, and
 * those columns of down's column form under cats. The CPU computes on the
 * gathered bytes as they are (eng_live_setup checks), so nothing else moves. */
static qi_status cold_put(qi_engine *e, int l, int k, int u, qi_err *err) {
    const qi_layer *ly = &e->m->layers[l];
    qi_ffn_split *sp = &e->ns->split[l];
    size_t gb, ub, blk;
    eng_unit_bytes(ly, sp->unit, &gb, &ub, &blk);
    memcpy((char *)sp->gate[0].data + (size_t)k * gb, (const char *)ly->w_gate.data + (size_t)u * gb, gb);
    memcpy((char *)sp->up[0].data + (size_t)k * ub, (const char *)ly->w_up.data + (size_t)u * ub, ub);
    for (int64_t r = 0; r < ly->w_down.n_rows; r++)
        memcpy((char *)sp->down[0].data + (size_t)r * sp->down[0].row_bytes + (size_t)k * blk,
               (const char *)ly->w_down.data + (size_t)r * ly->w_down.row_bytes + (size_t)u * blk, blk);
    return e->ns->cw[l].codes ? qi_colw_update(&e->ns->cw[l], &sp->down[0], (int64_t)k * sp->unit, sp->unit, err)
                             : QI_OK;
}

/* A swap's failure: the first is kept, and every later step is refused
 * (a unit may be on neither side). From either thread. */
void eng_swap_failed(qi_engine *e, qi_status st, const qi_err *se) {
    if (e->ns->mu_made) pthread_mutex_lock(&e->ns->mu);
    if (!e->ns->st) {
        e->ns->st = st;
        if (se) e->ns->err = *se; /* a step's err may be NULL */
    }
    if (e->ns->mu_made) pthread_mutex_unlock(&e->ns->mu);
}

qi_status eng_swap_state(qi_engine *e, qi_err *out) {
    if (e->ns->mu_made) pthread_mutex_lock(&e->ns->mu);
    const qi_status st = e->ns->st;
    if (st && out) *out = e->ns->err;
    if (e->ns->mu_made) pthread_mutex_unlock(&e->ns->mu);
    return st;
}

/* Uploads of unit u of layer l into fast slot s, queued on the fast
 * device's stream (ordered before the ops queued after them): its gate
 * rows (one copy), up rows (one copy) and block of every row of down (one
 * strided copy: the slot's blocks are a column of blocks in the matrix).
 * u < 0: zeros into the gate rows alone (the slot then computes nothing). */
static qi_status slot_put(qi_engine *e, int l, int u, int s, qi_err *err) {
    const qi_layer *ly = &e->m->layers[l];
    const qi_ffn_split *sp = &e->ns->split[l];
    qi_backend *fb = e->dev[e->o.neuron_dev].be;
    qi_buf *buf = e->ns->buf[l][1];
    size_t gb, ub, blk;
    eng_unit_bytes(ly, sp->unit, &gb, &ub, &blk);
    qi_status st = qi_dev_upload(fb, qi_view_of(buf, e->ns->off[l][0] + (size_t)s * gb),
                                 u < 0 ? e->ns->zero : (const char *)ly->w_gate.data + (size_t)u * gb, gb, err);
    if (!st && u >= 0)
        st = qi_dev_upload(fb, qi_view_of(buf, e->ns->off[l][1] + (size_t)s * ub),
                           (const char *)ly->w_up.data + (size_t)u * ub, ub, err);
    if (!st && u >= 0)
        st = qi_dev_upload_2d(fb, qi_view_of(buf, e->ns->off[l][2] + (size_t)s * blk), (size_t)sp->down[1].row_bytes,
                              (const char *)ly->w_down.data + (size_t)u * blk, (size_t)ly->w_down.row_bytes, blk,
                              (size_t)ly->w_down.n_rows, err);
    return st;
}

static void swap_count(qi_engine *e, int l) {
    const qi_layer *ly = &e->m->layers[l];
    size_t gb, ub, blk;
    eng_unit_bytes(ly, e->ns->split[l].unit, &gb, &ub, &blk);
    if (e->ns->mu_made) pthread_mutex_lock(&e->ns->mu);
    e->ns->swaps.swaps++;
    e->ns->swaps.bytes += (double)(gb + ub + blk * (size_t)ly->w_down.n_rows);
    if (e->ns->mu_made) pthread_mutex_unlock(&e->ns->mu);
}

/* With the background worker, no hold on the layer: unit a of layer l
 * uploaded into the staging buffer on the fast device's copy stream, so
 * the link's time overlaps the steps' ops instead of queueing among them
 * (on a device with one stream it is queued there, as before). Staging,
 * not the slot: a step may be computing the slot meanwhile (its gate rows
 * zero, so it adds act(0) x up = 0), and the copy stream runs beside the
 * step's ops, so bytes half written there could make that 0 x NaN. The
 * last swap's read of the staging into its slot is waited for first.
 * With neuron_swap_main_stream the uploads go on the main stream instead
 * (the ablation: the link's time among the ops again). */
static qi_status stage_put(qi_engine *e, int l, int a, qi_err *err) {
    const qi_layer *ly = &e->m->layers[l];
    qi_backend *fb = e->dev[e->o.neuron_dev].be;
    const qi_stream q = e->o.neuron_swap_main_stream ? QI_STREAM_MAIN : QI_STREAM_COPY;
    size_t gb, ub, blk;
    eng_unit_bytes(ly, e->ns->split[l].unit, &gb, &ub, &blk);
    if (e->ns->stage_read) qi_event_sync(e->ns->stage_read);
    qi_event_free(e->ns->stage_read); /* after it, the main stream has passed its wait for ns_stage_up */
    qi_event_free(e->ns->stage_up);
    e->ns->stage_read = e->ns->stage_up = NULL;
    qi_status st = qi_dev_upload_on(fb, q, qi_view_of(e->ns->stage, 0),
                                    (const char *)ly->w_gate.data + (size_t)a * gb, gb, err);
    if (!st)
        st = qi_dev_upload_on(fb, q, qi_view_of(e->ns->stage, gb),
                              (const char *)ly->w_up.data + (size_t)a * ub, ub, err);
    if (!st)
        st = qi_dev_upload_2d_on(fb, q, qi_view_of(e->ns->stage, gb + ub), blk,
                                 (const char *)ly->w_down.data + (size_t)a * blk, (size_t)ly->w_down.row_bytes, blk,
                                 (size_t)ly->w_down.n_rows, err);
    if (!st) st = qi_event_record_on(fb, q, &e->ns->stage_up, err);
    return st;
}

/* Under layer l's write hold: the staged unit into fast slot s on the
 * main stream, after the uploads (a copy within the device's memory). */
static qi_status stage_take(qi_engine *e, int l, int s, qi_err *err) {
    const qi_layer *ly = &e->m->layers[l];
    const qi_ffn_split *sp = &e->ns->split[l];
    qi_backend *fb = e->dev[e->o.neuron_dev].be;
    qi_buf *buf = e->ns->buf[l][1];
    size_t gb, ub, blk;
    eng_unit_bytes(ly, sp->unit, &gb, &ub, &blk);
    qi_status st = e->ns->stage_up ? qi_event_wait(fb, e->ns->stage_up, err) : QI_OK;
    if (!st)
        st = qi_dev_copy(fb, qi_view_of(buf, e->ns->off[l][0] + (size_t)s * gb), qi_view_of(e->ns->stage, 0), gb, err);
    if (!st)
        st = qi_dev_copy(fb, qi_view_of(buf, e->ns->off[l][1] + (size_t)s * ub), qi_view_of(e->ns->stage, gb), ub, err);
    if (!st)
        st = qi_dev_copy_2d(fb, qi_view_of(buf, e->ns->off[l][2] + (size_t)s * blk), (size_t)sp->down[1].row_bytes,
                            qi_view_of(e->ns->stage, gb + ub), blk, blk, (size_t)ly->w_down.n_rows, err);
    if (!st) st = qi_event_record(fb, &e->ns->stage_read, err);
    return st;
}

/* The swap's copy (qi_neuron_copy_fn). Between steps, in the engine's
 * thread: unit a of layer l into fast slot s, whose unit b has just left
 * it, all of a's bytes queued at once, and b written into a's position
 * on the cold side, in place. So a swap moves two units' bytes, whatever
 * the layer's size. With the background worker (no hold on the layer: a
 * step may be computing it): a's bytes into the staging (stage_put); the
 * slot's gate rows stay zero until live_enter moves them in. */
static int live_copy(void *ctx, int l, int a, int s) {
    qi_engine *e = ctx;
    const size_t nu = (size_t)e->ns->split[l].n_units;
    qi_err se = {0};
    if (eng_swap_state(e, NULL)) return -1;
    if (e->o.neuron_swap_worker) {
        const qi_status st = stage_put(e, l, a, &se);
        if (st) eng_swap_failed(e, st, &se);
        if (e->ns->stall_us > 0) { /* tests: until a step has met the layer mid-swap, or stall_us */
            /* and until the uploads have run, while steps compute the
             * emptied slot (a copy stream that writes slowly is then met
             * writing, whatever the order of its copies) */
            if (!st && e->ns->stage_up) qi_event_sync(e->ns->stage_up);
            const long mid0 = atomic_load(&e->ns->mid);
            const double t0 = eng_now_s();
            const struct timespec ts = {0, 50000};
            while (atomic_load(&e->ns->mid) == mid0 && eng_now_s() - t0 < 1e-6 * e->ns->stall_us) nanosleep(&ts, NULL);
        }
        return st ? -1 : 0;
    }
    int32_t *hot = e->ns->hot + (size_t)l * nu, *cold = e->ns->cold + (size_t)l * nu, *cpos = e->ns->cpos + (size_t)l * nu;
    const int b = hot[s], k = cpos[a];
    QI_ASSERT(b >= 0 && k >= 0 && cpos[b] < 0);
    qi_status st = slot_put(e, l, a, s, &se);
    if (!st) st = cold_put(e, l, k, b, &se);
    if (st) { /* b is now on neither side: the engine stops */
        eng_swap_failed(e, st, &se);
        return -1;
    }
    hot[s] = a, cold[k] = b, cpos[a] = -1, cpos[b] = k;
    swap_count(e, l);
    return 0;
}

/* With the background worker, under layer l's write hold (no step is
 * computing it). Unit b has left slot s: the slot's gate rows zeroed (it
 * computes act(0) x up = 0 until a unit enters it), b written into the
 * spare position of the cold side. */
static void live_leave(void *ctx, int l, int b, int s) {
    qi_engine *e = ctx;
    const size_t nu = (size_t)e->ns->split[l].n_units;
    int32_t *hot = e->ns->hot + (size_t)l * nu, *cold = e->ns->cold + (size_t)l * nu, *cpos = e->ns->cpos + (size_t)l * nu;
    const int k = e->ns->spare[l];
    qi_err se = {0};
    QI_ASSERT(hot[s] == b && cpos[b] < 0);
    hot[s] = -1;
    qi_status st = k < 0 ? QI_ERR(&se, QI_ERR_BACKEND, "layer %d: no spare place on the cold side for unit %d", l, b)
                         : slot_put(e, l, -1, s, &se);
    if (!st) st = cold_put(e, l, k, b, &se);
    if (st) {
        eng_swap_failed(e, st, &se);
        return;
    }
    cold[k] = b, cpos[b] = k, e->ns->spare[l] = -1;
}

/* Unit a has entered slot s (its bytes staged, stage_put): the staging
 * copied into the slot on the main stream, and a's cold position made the
 * spare, the gate rows there zeroed (they compute nothing; down's blocks
 * stay, and so does the column form, which only the kept neurons' columns
 * are read of). */
static void live_enter(void *ctx, int l, int a, int s) {
    qi_engine *e = ctx;
    const qi_ffn_split *sp = &e->ns->split[l];
    const size_t nu = (size_t)sp->n_units;
    int32_t *hot = e->ns->hot + (size_t)l * nu, *cold = e->ns->cold + (size_t)l * nu, *cpos = e->ns->cpos + (size_t)l * nu;
    const int k = cpos[a];
    qi_err se = {0};
    QI_ASSERT(hot[s] == -1 && k >= 0 && e->ns->spare[l] < 0);
    const qi_status st = stage_take(e, l, s, &se);
    if (st) {
        eng_swap_failed(e, st, &se);
        return;
    }
    size_t gb, ub, blk;
    eng_unit_bytes(&e->m->layers[l], sp->unit, &gb, &ub, &blk);
    memset((char *)sp->gate[0].data + (size_t)k * gb, 0, gb);
    hot[s] = a, cpos[a] = -1, cold[k] = -1, e->ns->spare[l] = k;
    swap_count(e, l);
}

qi_status eng_live_setup(qi_engine *e, int unit, int nu, qi_err *err) {
    const int L = e->m->hp.n_layer;
    const bool bg = e->o.neuron_swap_worker;
    const size_t n = (size_t)L * (size_t)nu;
    uint64_t *nb = qi_malloc(sizeof *nb * (size_t)L);
    e->ns->hot = qi_malloc(sizeof(int32_t) * n);
    e->ns->cold = qi_malloc(sizeof(int32_t) * (n + (size_t)L)); /* a spare position each */
    e->ns->cpos = qi_malloc(sizeof(int32_t) * n);
    e->ns->feed = qi_malloc(sizeof(double) * (size_t)nu);
    e->ns->spare = qi_malloc(sizeof(int32_t) * (size_t)L);
    size_t zb = 0, stage = 0;
    for (int l = 0; l < L; l++) {
        const qi_layer *ly = &e->m->layers[l];
        size_t gb, ub, blk;
        eng_unit_bytes(ly, unit, &gb, &ub, &blk);
        zb = gb > zb ? gb : zb;
        const size_t sb = gb + ub + blk * (size_t)ly->w_down.n_rows;
        stage = sb > stage ? sb : stage;
    }
    if (bg) {
        e->ns->zero = qi_calloc(zb ? zb : 1, 1);
        e->ns->acc = qi_calloc(n, sizeof(double));
        e->ns->acc_tok = qi_calloc((size_t)L, sizeof(long));
    }
    if (!nb || !e->ns->hot || !e->ns->cold || !e->ns->cpos || !e->ns->feed || !e->ns->spare ||
        (bg && (!e->ns->zero || !e->ns->acc || !e->ns->acc_tok))) {
        qi_free(nb);
        return QI_ERR(err, QI_ERR_NOMEM, "out of memory for the swap worker");
    }
    qi_backend *fb = e->dev[e->o.neuron_dev].be;
    qi_status st = bg ? qi_buf_alloc(fb, stage, "a neuron swap's staging", &e->ns->stage, err) : QI_OK;
    if (st) {
        qi_free(nb);
        return st;
    }
    for (int l = 0; l < L; l++) {
        const qi_layer *ly = &e->m->layers[l];
        size_t gb, ub, blk;
        eng_unit_bytes(ly, unit, &gb, &ub, &blk);
        nb[l] = gb + ub + blk * (uint64_t)ly->w_down.n_rows;
        /* both sides in the mask's order: slots and cold positions by
         * unit, the spare (with the worker) last */
        int32_t *hot = e->ns->hot + (size_t)l * nu, *cold = e->ns->cold + (size_t)l * nu, *cpos = e->ns->cpos + (size_t)l * nu;
        int k = 0;
        for (int u = 0, s = 0; u < nu; u++) {
            hot[u] = cold[u] = -1;
            if (e->ns->mask[(size_t)l * nu + u]) {
                hot[s++] = u, cpos[u] = -1;
            } else {
                cold[k] = u, cpos[u] = k++;
            }
        }
        e->ns->spare[l] = e->ns->split[l].spare ? k : -1;
        /* a swap copies a unit's rows and blocks as the file has them, and
         * rewrites the CPU's gathered bytes in place */
        for (int i = 0; i < 3 && e->ns->split[l].n[1]; i++) {
            const qi_weight *w = i == 0 ? &e->ns->split[l].gate[1] : i == 1 ? &e->ns->split[l].up[1] : &e->ns->split[l].down[1];
            if (w->data && qi_dev_weight_size(fb, w, true) != (size_t)(w->row_bytes * (uint64_t)w->n_rows)) {
                qi_free(nb);
                return QI_ERR(err, QI_ERR_UNSUPPORTED, "swapping neurons copies their rows as the file has them, "
                              "and device %s keeps weights in a form of its own", qi_dev_info_get(fb)->name);
            }
        }
        if (e->ns->buf[l][0]) {
            qi_free(nb);
            return QI_ERR(err, QI_ERR_UNSUPPORTED, "swapping neurons rewrites the cold side's bytes in place, and "
                          "the cpu keeps layer %d's cold weights in a form of its own", l);
        }
    }
    st = qi_neuron_live_create(L, nu, e->ns->mask, e->o.neuron_activity, nb, e->o.neuron_live, live_copy, NULL, e,
                               &e->ns->live, err);
    qi_free(nb);
    if (st || !bg) return st;
    if (pthread_mutex_init(&e->ns->mu, NULL))
        return QI_ERR(err, QI_ERR_BACKEND, "cannot make the swap worker's lock");
    e->ns->mu_made = true;
    qi_neuron_live_hooks(e->ns->live, live_leave, live_enter);
    return qi_neuron_live_start(e->ns->live, err);
}

/* Between steps, every neuron_swap_every steps: a round of swaps, its
 * copies waited for, so that a failure stops the step that made it (a
 * failed swap leaves a unit on neither side, so the engine then fails for
 * good); or, with the background worker, the activity summed since the
 * last time fed to it, which wakes it. */
qi_status eng_live_round(qi_engine *e, qi_err *err) {
    if (!e->ns || !e->ns->live || ++e->ns->steps % e->o.neuron_swap_every) return QI_OK;
    if (e->o.neuron_swap_worker) {
        const int L = e->m->hp.n_layer;
        const qi_status st = qi_neuron_live_feed_all(e->ns->live, e->ns->acc, e->ns->acc_tok, err);
        memset(e->ns->acc, 0, sizeof(double) * (size_t)L * (size_t)e->m->hp.n_ff / (size_t)qi_engine_neuron_unit(e->m));
        memset(e->ns->acc_tok, 0, sizeof(long) * (size_t)L);
        return st;
    }
    const double t0 = eng_now_s();
    qi_neuron_live_rebalance(e->ns->live);
    e->ns->swaps.rounds++;
    qi_err se = {0};
    const qi_status st = qi_dev_synchronize(e->dev[e->o.neuron_dev].be, &se);
    if (st) eng_swap_failed(e, st, &se);
    e->ns->swaps.seconds += eng_now_s() - t0;
    return eng_swap_state(e, &se) ? QI_ERR(err, e->ns->st, "a neuron swap's copy: %s", se.msg) : QI_OK;
}

void qi_engine_neuron_swaps_get(const qi_engine *e, qi_engine_neuron_swaps *out) {
    qi_engine *m = (qi_engine *)e; /* the lock only */
    if (!e->ns) {
        *out = (qi_engine_neuron_swaps){0};
        return;
    }
    if (m->ns->mu_made) pthread_mutex_lock(&m->ns->mu);
    *out = e->ns->swaps;
    if (m->ns->mu_made) pthread_mutex_unlock(&m->ns->mu);
    if (e->o.neuron_swap_worker && e->ns->live) { /* the worker's rounds, not the feeds */
        qi_neuron_live_stats ls;
        qi_neuron_live_stats_get(e->ns->live, &ls);
        out->rounds = ls.rounds;
        out->copy_stream = !e->o.neuron_swap_main_stream && qi_dev_has_copy_stream(e->dev[e->o.neuron_dev].be);
    }
}

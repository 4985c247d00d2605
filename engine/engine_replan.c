/* engine_replan.c - a new placement plan between steps: the weight blocks
 * that move prepared where they go, the KV streams whose home changes
 * moved, all or nothing (a failure leaves the engine as it was). */
#include "engine_int.h"

/* Is a layer's working KV homed differently under plan q than under p? */
static bool kv_moves(const qi_plan_layer *a, const qi_plan_layer *b) {
    return a->attn_dev != b->attn_dev || a->split != b->split || (a->split > 0.0f && a->split_dev != b->split_dev);
}

/* The KV bytes (upper bound: the blocks the moves take beyond those free
 * in the pool) a new plan p brings to device d's pool, from the working
 * blocks of the streams whose home changes. */
static size_t kv_arriving(const qi_engine *e, const qi_plan *p, int d) {
    const qi_hparams *hp = &e->m->hp;
    long blocks = 0;
    for (int l = 0; l < hp->n_layer; l++) {
        const qi_plan_layer *y = &p->layers[l];
        if (!kv_moves(&e->plan.layers[l], y) || (y->attn_dev != d && !(y->split > 0.0f && y->split_dev == d)))
            continue;
        for (int i = 0; i < e->o.max_seqs; i++) {
            if (!e->seqs[i].used) continue;
            for (int h = 0; h < hp->n_head_kv; h++) blocks += stream_of(e, &e->seqs[i], l, h)->work.n_blocks;
        }
    }
    const qi_kv_pool *pool = e->dev[d].pool;
    if (pool) blocks -= qi_kv_pool_n_free(pool);
    return blocks > 0 ? (size_t)blocks * (2 * QI_KV_BLOCK * (size_t)hp->head_dim * sizeof(uint16_t)) : 0;
}

qi_status qi_engine_replan(qi_engine *e, const qi_plan *np, qi_engine_replan_cost *cost, qi_err *err) {
    const qi_model *m = e->m;
    const int L = m->hp.n_layer, Hkv = m->hp.n_head_kv, NB = wblock_count(m);
    const double t0 = eng_eclock(e);
    qi_engine_replan_cost c = {0};
    if (cost) *cost = c;
    qi_status st;
    if (np->n_layer != L)
        return QI_ERR(err, QI_ERR_INVALID, "new plan has %d layers, the model %d", np->n_layer, L);
    if (np->n_devices != e->plan.n_devices)
        return QI_ERR(err, QI_ERR_INVALID, "new plan names %d devices, the engine has %d (devices are fixed at "
                      "creation)", np->n_devices, e->plan.n_devices);
    for (int d = 0; d < np->n_devices; d++)
        if (strcmp(np->devices[d], e->plan.devices[d]) != 0)
            return QI_ERR(err, QI_ERR_INVALID, "new plan's device %d is %s, the engine's %s (devices are fixed at "
                          "creation)", d, np->devices[d], e->plan.devices[d]);
    if ((st = qi_plan_validate(np, err)) || (st = eng_check_splits(e, np, err)) || (st = eng_check_observe(e, np, err)) ||
        (st = eng_check_sparse(e, np, err)) || (st = eng_check_picks(e, np, err)) ||
        (st = eng_check_neuron_plan(e, np, err)) || (st = eng_block_check(e, np, err)))
        return st;
    /* refused before any work when what arrives on a device does not fit
     * beside what is there (a block leaves only once its move is done) */
    for (int d = 1; d < np->n_devices; d++) {
        const qi_dev_info *in = qi_dev_info_get(e->dev[d].be);
        const size_t room = eng_dev_room(in);
        int at;
        const size_t w = eng_weights_arriving(e, np, &e->plan, d, room, &at);
        const size_t kv = kv_arriving(e, np, d);
        if (at >= 0 || (room != SIZE_MAX && w + kv > room)) {
            char name[40];
            return QI_ERR(err, QI_ERR_NOMEM,
                          "new plan does not fit device %s: %s%s%s%zu bytes of weights and %zu of KV blocks move there, "
                          "%zu bytes are left (%zu short)",
                          in->name, at >= 0 ? "the weights pass its room at " : "",
                          at >= 0 ? eng_wblock_name(m, at, name, sizeof name) : "", at >= 0 ? "; " : "", w, kv, room,
                          w + kv - room);
        }
    }
    if ((st = eng_stream_apply(e, np, err))) return st; /* the staging streamed layers need */
    qi_plan next = {0};
    qi_buf **nblk = qi_calloc((size_t)NB, sizeof *nblk);
    const long n_streams = (long)e->o.max_seqs * L * Hkv;
    qi_kv_rehome *undo = qi_calloc((size_t)n_streams, sizeof *undo);
    if (!nblk || !undo || (st = qi_plan_copy(&next, np, err))) {
        qi_free(nblk);
        qi_free(undo);
        eng_stream_apply(e, &e->plan, NULL);
        return nblk && undo ? st : QI_ERR(err, QI_ERR_NOMEM, "out of memory for a new plan");
    }
    /* the blocks that arrive on a device, prepared there */
    for (int b = 0; b < NB && !st; b++) {
        const int nd = eng_wblock_dev(np, b);
        if (nd == eng_wblock_dev(&e->plan, b)) continue;
        if (!(st = eng_wblock_prepare(e, &e->dev[nd], b, &nblk[b], err)))
            c.weight_bytes += (double)eng_wblock_bytes(m, &e->dev[nd], b);
    }
    /* pools where attention now runs, then every stream whose home moves */
    for (int l = 0; l < L && !st; l++) {
        const qi_plan_layer *y = &np->layers[l];
        const int ds[2] = {y->attn_dev, y->split > 0.0f ? y->split_dev : -1};
        for (int k = 0; k < 2 && !st; k++)
            if (ds[k] >= 0 && !e->dev[ds[k]].pool)
                st = qi_kv_pool_create(e->dev[ds[k]].be, m->hp.head_dim, e->o.kv_max_bytes, &e->dev[ds[k]].pool, err);
    }
    for (int l = 0; l < L && !st; l++) {
        const qi_plan_layer *y = &np->layers[l];
        if (!kv_moves(&e->plan.layers[l], y)) continue;
        qi_kv_pool *wp = e->dev[y->attn_dev].pool, *sp = y->split > 0.0f ? e->dev[y->split_dev].pool : NULL;
        for (int i = 0; i < e->o.max_seqs && !st; i++) {
            if (!e->seqs[i].used) continue;
            for (int h = 0; h < Hkv && !st; h++) {
                const long k = ((long)i * L + l) * Hkv + h;
                int moved = 0;
                st = qi_kv_stream_rehome(stream_of(e, &e->seqs[i], l, h), wp, sp, y->split, &undo[k], &moved, err);
                c.kv_blocks += moved;
            }
        }
    }
    /* every upload and copy done, or the first failure among them */
    qi_err se = {0};
    const qi_status fin = eng_sync_all(e, st ? &se : err);
    if (!st) st = fin;
    for (int i = 0; i < e->o.max_seqs; i++) {
        if (!e->seqs[i].used) continue;
        for (int l = 0; l < L; l++)
            for (int h = 0; h < Hkv; h++) {
                qi_kv_rehome *u = &undo[((long)i * L + l) * Hkv + h];
                if (st)
                    qi_kv_rehome_undo(stream_of(e, &e->seqs[i], l, h), u);
                else
                    qi_kv_rehome_commit(u);
            }
    }
    if (st) { /* the engine as it was: the new blocks go */
        for (int b = 0; b < NB; b++) {
            qi_buf_free(nblk[b]);
            if (eng_wblock_dev(np, b) == 0 && eng_wblock_dev(&e->plan, b) != 0) eng_wblock_reset(m, &e->dev[0], b);
        }
        qi_plan_free(&next);
        eng_stream_apply(e, &e->plan, NULL); /* the old plan's staging again */
    } else {
        for (int b = 0; b < NB; b++) {
            const int od = eng_wblock_dev(&e->plan, b), nd = eng_wblock_dev(np, b);
            if (od == nd) continue;
            qi_buf_free(e->dev[od].wblk[b]);
            e->dev[od].wblk[b] = NULL;
            if (od == 0) eng_wblock_reset(m, &e->dev[0], b);
            e->dev[nd].wblk[b] = nblk[b];
        }
        /* buffers a device kept for blocks it no longer runs */
        for (int d = 1; d < np->n_devices; d++) {
            dev_state *D = &e->dev[d];
            if (np->head_dev != d) {
                qi_buf_free(D->lbuf);
                D->lbuf = NULL;
                D->cap_logit_rows = 0;
            }
            qi_buf_free(D->sbuf);
            D->sbuf = NULL;
            D->cap_sbuf = 0;
            /* KV blocks kept for reuse by layers that left: room for what came */
            if (D->pool && D->pool != e->pool) qi_kv_pool_trim(D->pool);
        }
        qi_plan_free(&e->plan);
        e->plan = next;
        for (int l = 0; l < L; l++) { /* the neuron split is the engine's, shown by qi_engine_plan */
            e->plan.layers[l].ffn_dev = -1;
            e->plan.layers[l].ffn_rows = 0;
        }
        if (e->ns) eng_neurons_show(e);
        c.kv_bytes = (double)c.kv_blocks * (2.0 * QI_KV_BLOCK * m->hp.head_dim * sizeof(uint16_t));
        c.seconds = eng_eclock(e) - t0;
        e->prof.replans++;
        e->prof.replan_bytes += c.weight_bytes + c.kv_bytes;
        e->prof.replan_kv_blocks += c.kv_blocks;
        e->prof.replan_seconds += c.seconds;
        if (cost) *cost = c;
    }
    qi_free(nblk);
    qi_free(undo);
    return st;
}

qi_status qi_engine_replan_spec(qi_engine *e, const char *placement, qi_engine_replan_cost *cost, qi_err *err) {
    qi_plan p = e->plan;
    p.layers = NULL;
    p.n_layer = 0;
    qi_status st = qi_plan_parse(placement, e->m->hp.n_layer, &p, err);
    if (!st) st = qi_engine_replan(e, &p, cost, err);
    qi_plan_free(&p);
    return st;
}

/* engine_kv_pick.c - what a layer's decode attention reads when the
 * policy chooses it before attention: the blocks or tokens a picking
 * policy picks, the offloaded tokens a fetching policy fetches.
 *
 * A policy that picks blocks (Quest, kv_policy.h's pick()) evicts nothing
 * and is not called after attention: instead, once a layer's K/V rows are
 * written, the host brings the streams' key bounds up to date (kv.c) and,
 * on decode segments, asks the policy which blocks each stream reads; the
 * segment's attention call then points at those blocks (pick_blocks).
 * The host reads the rows and the queries for that, so such a policy runs
 * where attention runs on the CPU, and other plans are refused. */
#include "engine_int.h"

/* A picking policy's layer l (Quest, SparQ), after the step's K/V rows
 * are written: every stream's key bounds brought up to date with its new
 * rows (a page picker's), then on each decode segment (one token) every
 * stream's pages (16-token quarters of its blocks, QI_KV_PAGE) or single
 * tokens picked from the bounds or the keys and the segment's queries, and
 * its attention call pointed at them: K and V pointers into the blocks at
 * the chosen pages (or rows), in ascending order (the newest, the only one
 * not full, last), a shift of QI_KV_PAGE_SHIFT (0 for rows), and their
 * positions gathered, so the call reads no other slot and nothing is
 * copied. The call's scores and sums run over the slots in order whatever
 * the rows per pointer, so all pages in order is the arithmetic of the call
 * eng_attend_prepare made, and a budget that covers the whole cache gives the
 * full cache's. Prompt segments read the whole cache. eng_check_picks has
 * placed the layer's attention on the CPU, so rows and queries are host
 * memory. The streams are shared out over the host threads, each with its
 * own policy object and pick scratch, as the evicting policies' decisions
 * are (eng_policy_all). */
typedef struct {
    qi_engine *e;
    const dev_state *X;
    const segment *segs;
    int n_seg, l;
    bool fetch; /* fetch_stream, not pick_stream */
    atomic_long next; /* the next stream to take (policy_work's sharing) */
} pick_job;

static qi_status pick_stream(qi_engine *e, pol_scratch *ps, int *idx, const dev_state *X, const segment *g, int i,
                             int hk, int l, qi_err *err) {
    const qi_hparams *hp = &e->m->hp;
    const int H = hp->n_head, Hkv = hp->n_head_kv, D = hp->head_dim, group = H / Hkv;
    seq_state *s = &e->seqs[g->id];
    qi_kv_stream *sm = stream_of(e, s, l, hk);
    qi_kv_stream_bounds_from(sm, sm->work.n - g->n);
    if (g->n != 1) return QI_OK;
    const qi_kv_tier *w = &sm->work;
    const bool tok = e->pick_tokens;
    const int nb = tok ? w->n : (w->n + QI_KV_PAGE - 1) / QI_KV_PAGE;
    const qi_kv_pick_view v = {.layer = l, .n_layer = hp->n_layer, .kv_head = hk, .group = group, .D = D,
                               .q = X->q + ((size_t)g->off * H + (size_t)hk * group) * D,
                               .scale = e->acall[i].scale, .n = w->n, .block = tok ? 1 : QI_KV_PAGE,
                               .n_blocks = nb, .bounds = tok ? NULL : w->bound, .newest = nb - 1,
                               .budget = eng_resolve_budget(e, g->pos0),
                               .tail = tok ? 1 : (nb - 1) % QI_KV_PAGES_PER_BLOCK + 1,
                               .k_blk = (const uint16_t *const *)w->k_blk, .k_shift = QI_KV_BLOCK_SHIFT,
                               .k_cols = tok ? w->kcol : NULL,
                               .mass = tok ? e->pick_mix + (size_t)i * H + (size_t)hk * group : NULL};
    const size_t r = (size_t)i * Hkv + hk;
    if (tok) { /* no reallocation unless the policy asks for it; the mean of the values held */
        for (int h = 0; h < group; h++) v.mass[h] = 1.0f;
        float *vm = e->pick_vmean + r * (size_t)D;
        for (int d = 0; d < D; d++) vm[d] = w->vsum[d] / (float)w->n;
        e->pick_vm[r] = vm;
    }
    int n = 0;
    qi_status st = qi_kv_policy_pick(ps->pol, &v, idx, &n, err);
    if (st) return st;
    const uint16_t **kb = e->pick_kb + r * e->pick_max_blocks, **vb = e->pick_vb + r * e->pick_max_blocks;
    int32_t *pos = e->pick_pos + r * (size_t)e->o.n_ctx;
    int n_slots = 0;
    if (tok) { /* token t: its own row, one row per pointer */
        for (int j = 0; j < n; j++) {
            kb[j] = qi_kv_k_row(w, idx[j], D);
            vb[j] = qi_kv_v_row(w, idx[j], D);
            pos[j] = w->pos[idx[j]];
        }
        n_slots = n;
    } else
        for (int j = 0; j < n; j++) { /* page pg: rows (pg mod pages per block) x QI_KV_PAGE on in its block */
            const int pg = idx[j], b0 = pg << QI_KV_PAGE_SHIFT;
            const int nr = w->n - b0 < QI_KV_PAGE ? w->n - b0 : QI_KV_PAGE;
            const size_t in_blk = (size_t)(pg & (QI_KV_PAGES_PER_BLOCK - 1)) * QI_KV_PAGE * (size_t)D;
            kb[j] = w->k_blk[pg / QI_KV_PAGES_PER_BLOCK] + in_blk;
            vb[j] = w->v_blk[pg / QI_KV_PAGES_PER_BLOCK] + in_blk;
            memcpy(pos + n_slots, w->pos + b0, sizeof *pos * (size_t)nr);
            n_slots += nr;
        }
    e->a_nslots[r] = n_slots;
    e->a_pos[r] = pos;
    e->a_kb[r] = (const uint16_t *const *)kb;
    e->a_vb[r] = (const uint16_t *const *)vb;
    sm->attended = n_slots;
    return QI_OK;
}

/* A fetching policy's layer l (qinfer fetch=), after the step's K/V rows
 * are written: on each decode segment, every stream's offloaded tokens
 * that the policy fetches for this step's query (scored from the offload
 * tier's key columns, brought up to date here, and the rows of its newest
 * block, not yet full), at most what the layer's
 * budget leaves beside the working tokens. The segment's attention call
 * keeps the working tier's block table as eng_attend_prepare made it and
 * takes the fetched rows as extra rows (qi_attn_paged_args's x_*), after
 * the table's slots, so that its statistics' first slots are the working
 * tier's as the policy's view reads them. Nothing moves between tiers.
 * Shared out over the host threads as the picks are. */
static qi_status fetch_stream(qi_engine *e, pol_scratch *ps, int *idx, const dev_state *X, const segment *g, int i,
                              int hk, int l, qi_err *err) {
    const qi_hparams *hp = &e->m->hp;
    const int H = hp->n_head, Hkv = hp->n_head_kv, D = hp->head_dim, group = H / Hkv;
    seq_state *s = &e->seqs[g->id];
    qi_kv_stream *sm = stream_of(e, s, l, hk);
    if (g->n != 1) return QI_OK;
    const qi_kv_tier *w = &sm->work, *o = &sm->off;
    const int room = qi_kv_policy_layer_budget(e->pol, l, eng_resolve_budget(e, g->pos0)) - w->n;
    int n = 0;
    if (room > 0 && o->n > 0) {
        int with_cols = 0;
        const uint16_t *cols = qi_kv_stream_off_kcols(sm, &with_cols);
        const qi_kv_pick_view v = {.layer = l, .n_layer = hp->n_layer, .kv_head = hk, .group = group, .D = D,
                                   .q = X->q + ((size_t)g->off * H + (size_t)hk * group) * D,
                                   .scale = e->acall[i].scale, .n = o->n, .block = 1, .n_blocks = o->n,
                                   .newest = o->n - 1, .budget = room, .tail = 1,
                                   .k_blk = (const uint16_t *const *)o->k_blk, .k_shift = QI_KV_BLOCK_SHIFT,
                                   .k_cols = cols, .k_tail = o->n - with_cols};
        qi_status st = qi_kv_policy_fetch(ps->pol, &v, idx, &n, err);
        if (st) return st;
    }
    const size_t r = (size_t)i * Hkv + hk;
    const uint16_t **kb = e->pick_kb + r * e->pick_max_blocks, **vb = e->pick_vb + r * e->pick_max_blocks;
    int32_t *pos = e->pick_pos + r * (size_t)e->o.n_ctx;
    for (int j = 0; j < n; j++) {
        kb[j] = qi_kv_k_row(o, idx[j], D);
        vb[j] = qi_kv_v_row(o, idx[j], D);
        pos[j] = o->pos[idx[j]];
    }
    e->x_n[r] = n;
    e->x_pos[r] = pos;
    e->x_k[r] = (const uint16_t *const *)kb;
    e->x_v[r] = (const uint16_t *const *)vb;
    sm->attended = w->n + n;
    return QI_OK;
}

static void pick_work(void *arg, int ith, int nth) {
    (void)nth;
    pick_job *j = arg;
    qi_engine *e = j->e;
    const int Hkv = e->m->hp.n_head_kv;
    pol_scratch *ps = &e->ps[ith];
    int *idx = e->pick_idx + (size_t)ith * e->pick_max_blocks;
    const long streams = (long)j->n_seg * Hkv;
    for (long k; (k = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed)) < streams;) {
        const int i = (int)(k / Hkv), hk = (int)(k % Hkv);
        qi_status st = (j->fetch ? fetch_stream : pick_stream)(e, ps, idx, j->X, &j->segs[i], i, hk, j->l, &ps->err);
        if (st) {
            ps->err_k = k;
            ps->err_st = st;
            return;
        }
    }
}

qi_status eng_pick_blocks(qi_engine *e, const dev_state *X, const segment *segs, int n_seg, int l, qi_err *err) {
    const bool fetch = eng_fetch_layer(e, l);
    const int Hkv = e->m->hp.n_head_kv;
    for (int i = 0; i < n_seg; i++) /* slot s is row s mod 2^shift of kb[s >> shift] */
        if (segs[i].n == 1 && fetch) { /* the working tier's blocks as they are, and the fetched rows */
            qi_attn_paged_args *a = &e->acall[i];
            a->x_n = e->x_n + (size_t)i * Hkv;
            a->x_pos = e->x_pos + (size_t)i * Hkv;
            a->x_k = e->x_k + (size_t)i * Hkv;
            a->x_v = e->x_v + (size_t)i * Hkv;
        } else if (segs[i].n == 1) {
            e->acall[i].shift = e->pick_tokens ? 0 : QI_KV_PAGE_SHIFT;
            if (e->pick_tokens) { /* the shares the policy estimates (1: none), the means */
                e->acall[i].mix = e->pick_mix + (size_t)i * e->m->hp.n_head;
                e->acall[i].vmean = e->pick_vm + (size_t)i * e->m->hp.n_head_kv;
            }
        }
    for (int t = 0; t < e->o.n_threads; t++) {
        e->ps[t].err_k = -1;
        qi_err_clear(&e->ps[t].err);
    }
    pick_job j = {e, X, segs, n_seg, l, fetch, 0};
    if ((long)n_seg * e->m->hp.n_head_kv > 1)
        qi_backend_cpu_host_run(e->be, pick_work, &j);
    else
        pick_work(&j, 0, 1);
    const pol_scratch *bad = NULL; /* the first failure in stream order, whichever thread met it */
    for (int t = 0; t < e->o.n_threads; t++) {
        const pol_scratch *ps = &e->ps[t];
        if (ps->err_k >= 0 && (!bad || ps->err_k < bad->err_k)) bad = ps;
    }
    if (bad) {
        *err = bad->err;
        return bad->err_st;
    }
    return QI_OK;
}

/* engine_attn.c - the attention block of a layer: its norm, Q/K/V and
 * their biases, norms and RoPE, every segment's K/V written and one
 * backend call for all the step's segments (engine_attn_split.c when the
 * plan splits the layer), the output projection and the residual. The
 * calls' statistics are placed here for the KV policy that reads them
 * (engine_kv_step.c). */
#include "engine_int.h"

/* Segment g (the i-th of the step) at layer l: slots in its streams for
 * its K/V rows (their writes gathered into e->kv_src/kv_dst from *n_kv on,
 * for one kv_write of the layer), and its attention call, e->acall[i],
 * without statistics (attend_all places them). On a split layer, the rows
 * whose slots are in blocks of the second device are gathered into
 * e->kv_src2/kv_dst2 from *n_kv2 on, reading the copy of K/V there, and
 * the call is two partial calls: e->acall[i] over the first slots, on the
 * attention's device, and e->acall[max_seqs + i] over the rest. */
qi_status eng_attend_prepare(qi_engine *e, const segment *g, int i, int l, int *n_kv, int *n_kv2, qi_err *err) {
    const qi_hparams *hp = &e->m->hp;
    seq_state *s = &e->seqs[g->id];
    const int H = hp->n_head, Hkv = hp->n_head_kv, D = hp->head_dim;
    const long kvw = (long)Hkv * D;
    const bool swa = hp->n_swa > 0 && e->m->layers[l].swa;
    const qi_plan_layer *y = &e->plan.layers[l];
    const bool split = y->split > 0.0f;
    const dev_state *A = &e->dev[y->attn_dev], *B = split ? &e->dev[y->split_dev] : NULL;
    qi_status st;
    for (int t = 0; t < g->n; t++)
        for (int hk = 0; hk < Hkv; hk++) {
            const long o = (long)(g->off + t) * kvw + (long)hk * D;
            qi_kv_stream *sm = stream_of(e, s, l, hk);
            uint16_t *kr, *vr;
            int slot;
            if ((st = qi_kv_stream_slot(sm, g->pos0 + t, &slot, &kr, &vr, err))) return st;
            if (split && slot >> QI_KV_BLOCK_SHIFT >= sm->lo_blocks) {
                e->kv_src2[*n_kv2] = B->k + o;
                e->kv_dst2[(*n_kv2)++] = kr;
                e->kv_src2[*n_kv2] = B->v + o;
                e->kv_dst2[(*n_kv2)++] = vr;
            } else {
                e->kv_src[*n_kv] = A->k + o;
                e->kv_dst[(*n_kv)++] = kr;
                e->kv_src[*n_kv] = A->v + o;
                e->kv_dst[(*n_kv)++] = vr;
            }
        }
    for (int hk = 0; hk < Hkv; hk++) {
        qi_kv_stream *sm = stream_of(e, s, l, hk);
        sm->attended = sm->work.n; /* both parts of a split; a picking policy's choice may cut it (eng_pick_blocks) */
    }
    const qi_attn_paged_args base = {.T = g->n, .H = H, .Hkv = Hkv, .D = D, .q_pos = e->q_pos + g->off,
                                     .n_swa = swa ? hp->n_swa : 0,
                                     .scale = hp->q_scale > 0 ? 1.0f : 1.0f / sqrtf((float)D),
                                     .shift = QI_KV_BLOCK_SHIFT};
    for (int part = 0; part < (split ? 2 : 1); part++) {
        const int c = part ? e->o.max_seqs + i : i;
        const dev_state *X = part ? B : A;
        int *n_slots = e->a_nslots + (size_t)c * Hkv;
        const int32_t **pos = e->a_pos + (size_t)c * Hkv;
        const uint16_t *const **kb = e->a_kb + (size_t)c * Hkv, *const **vb = e->a_vb + (size_t)c * Hkv;
        for (int hk = 0; hk < Hkv; hk++) {
            const qi_kv_stream *sm = stream_of(e, s, l, hk);
            const qi_kv_tier *w = &sm->work;
            /* a split stream's first lo_blocks blocks are the attention device's */
            const int b0 = part ? sm->lo_blocks : 0, n0 = b0 << QI_KV_BLOCK_SHIFT;
            const int n_lo = split && (sm->lo_blocks << QI_KV_BLOCK_SHIFT) < w->n ? sm->lo_blocks << QI_KV_BLOCK_SHIFT
                                                                                  : w->n;
            n_slots[hk] = part ? (w->n > n0 ? w->n - n0 : 0) : n_lo;
            pos[hk] = w->pos + n0;
            kb[hk] = (const uint16_t *const *)w->k_blk + b0;
            vb[hk] = (const uint16_t *const *)w->v_blk + b0;
        }
        qi_attn_paged_args *a = &e->acall[c];
        *a = base;
        a->q = X->q + (long)g->off * H * D;
        a->n_slots = n_slots;
        a->pos = pos;
        a->k_blk = kb;
        a->v_blk = vb;
        if (split) {
            a->out = X->so + (long)g->off * H * D;
            a->part_m = X->sm + (long)g->off * H;
            a->part_l = X->sl + (long)g->off * H;
        } else {
            a->out = X->att + (long)g->off * H * D;
        }
    }
    return QI_OK;
}

/* Give every call of the step its own zeroed region of e->stats, [H][its
 * stride], growing the buffer when the step needs more than any before. */
static qi_status place_stats(qi_engine *e, int n_seg, qi_err *err) {
    const int H = e->m->hp.n_head, Hkv = e->m->hp.n_head_kv;
    size_t need = 0;
    for (int i = 0; i < n_seg; i++) {
        int mx = 0;
        for (int hk = 0; hk < Hkv; hk++) {
            const int n = e->acall[i].n_slots[hk] + (e->acall[i].x_n ? e->acall[i].x_n[hk] : 0);
            mx = n > mx ? n : mx;
        }
        e->acall[i].stats_stride = stats_stride(mx);
        need += (size_t)H * (size_t)e->acall[i].stats_stride;
    }
    if (need > e->cap_stats) {
        float *p = qi_realloc(e->stats, sizeof(float) * need);
        if (!p) return QI_ERR(err, QI_ERR_NOMEM, "out of memory for the attention statistics of %d sequences", n_seg);
        e->stats = p;
        e->cap_stats = need;
    }
    size_t off = 0;
    for (int i = 0; i < n_seg; i++) {
        const size_t n = (size_t)H * (size_t)e->acall[i].stats_stride;
        e->acall[i].stats = e->stats + off;
        memset(e->acall[i].stats, 0, sizeof(float) * n);
        off += n;
    }
    e->n_stats = off;
    return QI_OK;
}

/* The statistics of a layer whose attention runs on device X, which the
 * host cannot address: the zeroed regions uploaded to X's buffer and the
 * calls pointed there (to_device), then the sums downloaded into
 * e->stats, the host waiting for them, and the calls pointed back. */
static qi_status stats_move(qi_engine *e, dev_state *X, int n_seg, bool to_device, qi_err *err) {
    const size_t bytes = sizeof(float) * e->n_stats;
    qi_status st;
    if (to_device && e->n_stats > X->cap_sbuf) {
        qi_buf_free(X->sbuf);
        X->sbuf = NULL;
        X->cap_sbuf = 0;
        if ((st = qi_buf_alloc(X->be, bytes, "attention statistics", &X->sbuf, err))) return st;
        X->cap_sbuf = e->n_stats;
    }
    float *dev = qi_buf_ptr(X->be, qi_view_of(X->sbuf, 0), bytes, err);
    if (!dev) return QI_ERR_INVALID;
    if (to_device) {
        if ((st = qi_dev_upload(X->be, qi_view_of(X->sbuf, 0), e->stats, bytes, err))) return st;
    } else {
        if ((st = qi_dev_download(X->be, e->stats, qi_view_of(X->sbuf, 0), bytes, err))) return st;
        qi_event *ev = NULL;
        if ((st = qi_event_record(X->be, &ev, err))) return st;
        qi_event_sync(ev);
        qi_event_free(ev);
    }
    for (int i = 0; i < n_seg; i++) {
        qi_attn_paged_args *a = &e->acall[i];
        a->stats = to_device ? dev + (a->stats - e->stats) : e->stats + (a->stats - dev);
    }
    return QI_OK;
}

/* The attention of a step's segments at layer l: every segment's K/V
 * written, then one backend call for all of them. On a layer the policy
 * decides, each call gathers its statistics into its own region, and the
 * policy then decides every segment's streams (eng_policy_all). */
static qi_status attend_all(qi_engine *e, const segment *segs, int n_seg, int T, int l, qi_err *err) {
    qi_event *t_op;
    if (e->plan.layers[l].split > 0.0f) return eng_attend_split(e, segs, n_seg, T, l, err);
    const bool policy = eng_policy_layer(e, l);
    qi_backend *b = e->dev[e->plan.layers[l].attn_dev].be;
    qi_status st;
    int n_kv = 0;
    for (int i = 0; i < n_seg; i++)
        if ((st = eng_attend_prepare(e, &segs[i], i, l, &n_kv, NULL, err))) return st;
    if ((st = eng_op_begin(e, b, &t_op, err)) ||
        (st = eng_op_end(e, b, t_op, QI_OP_KV,
                         qi_backend_kv_write(b, e->kv_src, e->kv_dst, n_kv, e->m->hp.head_dim, err), err)))
        return st;
    dev_state *X = &e->dev[e->plan.layers[l].attn_dev];
    if (eng_pick_layer(e, l) || eng_fetch_layer(e, l)) {
        const double t0 = eng_host_begin(e);
        st = eng_pick_blocks(e, X, segs, n_seg, l, err);
        eng_host_end(e, QI_OP_POLICY, t0);
        if (st) return st;
    }
    const bool on_dev = policy && !qi_dev_info_get(b)->host_visible;
    if (policy && (st = place_stats(e, n_seg, err))) return st;
    if (on_dev && (st = stats_move(e, X, n_seg, true, err))) return st;
    if ((st = eng_op_begin(e, b, &t_op, err)) ||
        (st = eng_op_end(e, b, t_op, QI_OP_ATTENTION, qi_backend_attention(b, e->acall, n_seg, err), err)))
        return st;
    if (!policy) return QI_OK;
    if (on_dev && (st = stats_move(e, X, n_seg, false, err))) return st;
    const double t0 = eng_host_begin(e);
    st = eng_policy_all(e, segs, n_seg, l, err);
    eng_host_end(e, QI_OP_POLICY, t0);
    return st;
}

/* The model's norm over rows: RMSNorm, or LayerNorm with its bias (opt,
 * falcon). */
qi_status eng_norm_rows(qi_backend *b, const qi_hparams *hp, const float *x, const qi_weight *w,
                        const qi_weight *bias, int T, int n, float *y, qi_err *err) {
    if (!hp->layer_norm) return qi_backend_rmsnorm(b, x, w->data, T, n, hp->rms_eps, y, err);
    return qi_backend_layernorm(b, x, w->data, bias->data, T, n, hp->rms_eps, y, err);
}

/* y[T][..] += a matmul's bias bw, where the model has one (opt). */
qi_status eng_add_bias(qi_backend *b, const qi_weight *bw, float *y, int T, qi_err *err) {
    if (!bw->data) return QI_OK;
    return qi_backend_add_bias(b, y, bw->data, T, (int)bw->n_cols, err);
}

/* The attention block of layer l on its device: x += attn(norm(x)), the
 * step's K/V written and, on the last layer, the rows carried on cut to
 * the output rows (*rows = R). In a parallel layer (falcon) x is left as it
 * is and attn(norm(x)) kept in the device's xn, for the MLP block to add. */
qi_status eng_attention_block(qi_engine *e, const segment *segs, int n_seg, int T, int R, int l, int *rows,
                              qi_err *err) {
    qi_status st;
    const qi_model *m = e->m;
    const qi_hparams *hp = &m->hp;
    const dev_state *A = &e->dev[e->plan.layers[l].attn_dev];
    qi_backend *b = A->be;
    const qi_layer *ly = &A->layers[l];
    const int E = hp->n_embd, H = hp->n_head, Hkv = hp->n_head_kv, D = hp->head_dim;
    const bool swa = hp->n_swa > 0 && ly->swa;
    const float base = swa ? hp->rope_base_swa : hp->rope_base;
    if ((st = eng_norm_rows(b, hp, A->x, &ly->attn_norm, &ly->attn_norm_b, T, E, A->xn, err))) return st;
    const qi_weight *qkv[3] = {&ly->wq, &ly->wk, &ly->wv};
    float *const qkv_out[3] = {A->q, A->k, A->v};
    if (eng_sp_path(e)) {
        static const int wi[3] = {SP_W_Q, SP_W_K, SP_W_V};
        if ((st = eng_mm_site(e, b, l, wi, qkv, qkv_out, 3, A->xn, T, eng_sp_site(e, l, QI_SITE_ATTN_IN, A->xn, T, E), err)))
            return st;
    } else {
        if ((st = eng_matmul_n(e, b, qkv, qkv_out, 3, A->xn, T, err))) return st;
    }
    if ((st = eng_add_bias(b, &ly->bq, A->q, T, err))) return st;
    if ((st = eng_add_bias(b, &ly->bk, A->k, T, err))) return st;
    if ((st = eng_add_bias(b, &ly->bv, A->v, T, err))) return st;
    if (ly->q_norm.data && (st = qi_backend_rmsnorm(b, A->q, ly->q_norm.data, T * H, D, hp->rms_eps, A->q, err)))
        return st;
    if (ly->k_norm.data && (st = qi_backend_rmsnorm(b, A->k, ly->k_norm.data, T * Hkv, D, hp->rms_eps, A->k, err)))
        return st;
    if (hp->n_rot > 0) /* none with learned positions (opt) */
        if ((st = qi_backend_rope(b, A->q, H, A->k, Hkv, T, D, hp->n_rot, e->q_pos, base, hp->rope_freq_scale,
                           hp->rope_mode, err)))
            return st;
    if (hp->q_scale > 0 && (st = qi_backend_scale(b, A->q, (long)T * H * D, hp->q_scale, err))) return st;
    if ((st = attend_all(e, segs, n_seg, T, l, err))) return st;
    if (eng_sp_path(e)) {
        static const int wi[1] = {SP_W_O};
        const qi_weight *wo = &ly->wo;
        float *const out = A->xn;
        if ((st = eng_mm_site(e, b, l, wi, &wo, &out, 1, A->att, T, eng_sp_site(e, l, QI_SITE_ATTN_OUT, A->att, T, H * D), err)))
            return st;
    } else {
        if ((st = eng_matmul(e, b, &ly->wo, A->att, T, A->xn, err))) return st;
    }
    if ((st = eng_add_bias(b, &ly->bo, A->xn, T, err))) return st;
    if (l == hp->n_layer - 1 && R < T) {
        /* carry on with the output rows only */
        *rows = R;
        if (R == 0) return QI_OK;
        if ((st = qi_backend_gather_rows(b, A->x, e->out_rows, R, E, err))) return st;
        if ((st = qi_backend_gather_rows(b, A->xn, e->out_rows, R, E, err))) return st;
    }
    if (ly->attn_post_norm.data &&
        (st = qi_backend_rmsnorm(b, A->xn, ly->attn_post_norm.data, *rows, E, hp->rms_eps, A->xn, err)))
        return st;
    if (hp->parallel) return QI_OK; /* added by the MLP block */
    return qi_backend_add(b, A->x, A->xn, (long)*rows * E, err);
}

/* engine_step.c - one step of the batched engine: the step's inputs, the
 * forward pass over them, and the results handed back to the sequences.
 *
 * The forward pass (llama and gemma3), per layer: x += Wo . attn(rope(Wq .
 * n), rope(Wk . n), Wv . n) with n = rmsnorm(x); then x += Wdown .
 * (silu(Wgate . m) * (Wup . m)) with m = rmsnorm(x). Gemma3 adds, in
 * llama.cpp's order: embeddings scaled by sqrt(n_embd); a per-head RMSNorm
 * of q and k before RoPE; q scaled after RoPE (the softmax then unscaled);
 * RMSNorms of the attention and FFN outputs before each residual add;
 * GeGLU instead of SwiGLU; local layers with a sliding window and their own
 * RoPE base. The window is a mask over the cache, as llama.cpp's. Its local
 * layers' cache is a ring of n_swa + n_ubatch cells rounded up to 256 (1024
 * for Gemma 3 270M), position p landing in cell p % size; once it has
 * wrapped, attention runs over the cells in cell order, which decides the
 * summation order, so the local layers here keep the same ring (kv.c). K
 * and V are kept as fp16, as llama.cpp's default cache keeps them, so
 * attention reads the same rounded values. The matmuls and element-wise
 * ops run over all the step's rows (each weight read once per step); RoPE,
 * the KV writes and attention per segment (each sequence at its own
 * positions, over its own cache streams).
 *
 * The last layer carries on only with the rows whose logits are wanted
 * (all of a segment fed with logits_all, its last row, or none for an inner
 * chunk of a prompt), as llama.cpp selects its output rows there: the
 * remaining matmuls then run with that many tokens, which decides the
 * K-quant summation order (QI_K_WIDE_MIN). Every buffer is sized at creation except the logits,
 * which grow to the largest step's output rows.
 *
 * OPT and Falcon (simulated devices only: their ops are backend.h's
 * optional ones): LayerNorms with biases for the RMSNorms; OPT adds its
 * learned position's row to each token's embedding, has no RoPE, adds a
 * bias after every matmul, and its FFN is down(relu(up(n))), no gate;
 * Falcon's FFN is down(gelu(up(m))), and its layers are parallel, x +=
 * attn(n) + mlp(m) with n and m the two LayerNorms of the same x (plan.h
 * says how that maps onto the attention and MLP blocks).
 */
#include "engine_int.h"

/* The output head on its device, R rows of logits into e->logits (the
 * host's) from row r0 on. */
qi_status eng_head_block(qi_engine *e, int R, int r0, qi_err *err) {
    const qi_hparams *hp = &e->m->hp;
    dev_state *O = &e->dev[e->plan.head_dev];
    qi_backend *b = O->be;
    const size_t bytes = sizeof(float) * (size_t)R * (size_t)hp->n_vocab;
    float *out = e->logits + (size_t)r0 * (size_t)hp->n_vocab;
    qi_status st;
    if (O != &e->dev[0]) {
        if (R > O->cap_logit_rows) {
            qi_buf_free(O->lbuf);
            O->lbuf = NULL;
            O->cap_logit_rows = 0;
            if ((st = qi_buf_alloc(b, bytes, "logits", &O->lbuf, err))) return st;
            O->logits = qi_buf_ptr(b, qi_view_of(O->lbuf, 0), bytes, err);
            O->cap_logit_rows = R;
        }
        out = O->logits;
    }
    if ((st = eng_norm_rows(b, hp, O->x, &O->out_norm, &O->out_norm_b, R, hp->n_embd, O->xn, err))) return st;
    if ((st = eng_matmul(e, b, &O->output, O->xn, R, out, err))) return st;
    if (hp->logit_softcap > 0 && (st = qi_backend_softcap(b, out, (long)R * hp->n_vocab, hp->logit_softcap, err)))
        return st;
    if (O == &e->dev[0]) return QI_OK;
    if ((st = qi_dev_download(b, e->logits + (size_t)r0 * (size_t)hp->n_vocab, qi_view_of(O->lbuf, 0), bytes, err)))
        return st;
    return qi_dev_synchronize(b, err);
}

/* Learned positions (opt): row q_pos[t] of the table added to token t's
 * embedding, through xn. */
static qi_status add_positions(qi_engine *e, const dev_state *X, int T, qi_err *err) {
    qi_status st;
    for (int t = 0; t < T; t++)
        if (e->q_pos[t] >= X->pos_embd.n_rows)
            return QI_ERR(err, QI_ERR_INVALID, "position %d is past the model's %lld learned positions", e->q_pos[t],
                          (long long)X->pos_embd.n_rows);
    if ((st = qi_backend_get_rows(X->be, &X->pos_embd, e->q_pos, T, X->xn, err))) return st;
    return qi_backend_add(X->be, X->x, X->xn, (long)T * e->m->hp.n_embd, err);
}

/* The embedding block on its device: the step's T tokens' rows of the
 * table into x, scaled (gemma3), their learned positions added (opt). */
qi_status eng_embed_block(qi_engine *e, int T, qi_err *err) {
    const qi_hparams *hp = &e->m->hp;
    const dev_state *X = &e->dev[e->plan.embd_dev];
    qi_status st = qi_backend_get_rows(X->be, &X->tok_embd, e->tokens, T, X->x, err);
    if (!st && hp->embd_scale != 1.0f) st = qi_backend_scale(X->be, X->x, (long)T * hp->n_embd, hp->embd_scale, err);
    if (!st && X->pos_embd.data) st = add_positions(e, X, T, err);
    return st;
}

/* Layer l's two blocks, each on its device (the hidden state moved there
 * first) and timed as its span; *rows: the rows carried on (0 after the
 * last layer when no logits are wanted). */
qi_status eng_layer(qi_engine *e, const segment *segs, int n_seg, int T, int R, int l, int *x_dev, int *rows,
                    qi_err *err) {
    const int a = e->plan.layers[l].attn_dev, f = e->plan.layers[l].mlp_dev;
    qi_event *t0;
    qi_status st;
    if ((st = eng_move_x(e, x_dev, a, *rows, err)) || (st = eng_span_begin(e, a, 1 + 2 * l, &t0, err)) ||
        (st = eng_span_end(e, a, 1 + 2 * l, t0, eng_attention_block(e, segs, n_seg, T, R, l, rows, err), err)))
        return st;
    if (*rows == 0) return QI_OK;
    if ((st = eng_move_x(e, x_dev, f, *rows, err)) || (st = eng_span_begin(e, f, 2 + 2 * l, &t0, err)))
        return st;
    return eng_span_end(e, f, 2 + 2 * l, t0, eng_mlp_block(e, l, *rows, err), err);
}

/* The forward pass of a step: T rows of segs (R of them wanted as
 * logits), every block on the device the plan names, each timed as a
 * span of its device (profile), the hidden state moved to the device of
 * the next block. Block b's span: 0 the embedding, 1 + 2l layer l's
 * attention, 2 + 2l its MLP, 2L + 1 the head (plan.h). A streamed layer's
 * weights arrive around it (engine_stream.c); a plan with a block schedule
 * runs the step in GPU batches (engine_zigzag.c). */
static qi_status forward(qi_engine *e, const segment *segs, int n_seg, int T, int R, qi_err *err) {
    const int L = e->m->hp.n_layer;
    const qi_plan *p = &e->plan;
    qi_status st;
    qi_event *t0;
    for (int i = 0; i < n_seg; i++)
        for (int t = 0; t < segs[i].n; t++) e->q_pos[segs[i].off + t] = segs[i].pos0 + t;
    int x_dev = p->embd_dev, rows = T;
    if (p->gpu_batch && n_seg > p->gpu_batch) /* more than one GPU batch: engine_zigzag.c */
        return eng_block_forward(e, segs, n_seg, T, R, err);
    if ((st = eng_span_begin(e, x_dev, 0, &t0, err)) ||
        (st = eng_span_end(e, x_dev, 0, t0, eng_embed_block(e, T, err), err)))
        return st;
    for (int l = 0; l < L && rows > 0; l++)
        if ((st = eng_stream_before(e, l, err)) ||
            (st = eng_stream_after(e, l, eng_layer(e, segs, n_seg, T, R, l, &x_dev, &rows, err), err)))
            return st;
    if (R == 0) return QI_OK;
    const int hb = 2 * L + 1;
    if ((st = eng_move_x(e, &x_dev, p->head_dev, R, err)) || (st = eng_span_begin(e, p->head_dev, hb, &t0, err)))
        return st;
    return eng_span_end(e, p->head_dev, hb, t0, eng_head_block(e, R, 0, err), err);
}

/* The end of a step: every device's stream waited for, the first failure
 * met inside one (a copy that failed on a device's worker) reported, and,
 * with profile on, the step's copies timed by their events. */
static qi_status finish_step(qi_engine *e, qi_err *err) {
    const qi_status first = eng_sync_all(e, err);
    for (int i = 0; i + 1 < e->n_cev; i += 2) {
        qi_event_sync(e->cev[i + 1]);
        const double t = qi_event_elapsed(e->cev[i], e->cev[i + 1]);
        const int kind = e->cev_kind[i / 2], tag = e->cev_tag[i / 2], dev = e->cev_dev[i / 2];
        if (kind < 0) {
            e->prof.copy_seconds += t;
            e->prof.dev_copy_seconds[dev] += t;
            e->copy_dev_s[tag] += t;
        } else if (kind == QI_OP_COUNT) {
            e->blk_s[tag] += t;
            e->prof.dev_span_seconds[dev] += t;
        } else {
            e->prof.seconds[kind] += t;
            e->prof.dev_op_seconds[dev] += t;
            if (tag & 1)
                e->blk_split_s[tag >> 1] += t;
            else if (kind == QI_OP_ATTENTION || kind == QI_OP_KV)
                e->blk_attn_s[tag >> 1] += t;
        }
    }
    if (e->o.profile && e->n_cev) e->blk_steps++;
    for (int i = 0; i < e->n_cev; i++) qi_event_free(e->cev[i]);
    e->n_cev = 0;
    return first;
}

qi_status qi_engine_step(qi_engine *e, int *n_tokens, qi_err *err) {
    if (n_tokens) *n_tokens = 0;
    qi_err se = {0};
    const qi_status sst = e->ns && e->ns->live ? eng_swap_state(e, &se) : QI_OK;
    if (sst) /* a unit on neither side: the FFN's sum would miss it */
        return QI_ERR(err, sst, "a neuron swap failed earlier, and the split is incomplete: %s", se.msg);
    for (int i = 0; i < e->o.max_seqs; i++) e->seqs[i].n_logits = 0;
    int T = 0;
    const int n_seg = eng_schedule(e, &T);
    if (n_seg == 0) return QI_OK;
    /* inputs, output rows */
    int R = 0;
    for (int i = 0; i < n_seg; i++) {
        const segment *g = &e->segs[i];
        seq_state *s = &e->seqs[g->id];
        memcpy(e->tokens + g->off, s->pending + s->head, sizeof(int32_t) * (size_t)g->n);
        for (int r = 0; r < g->n_out; r++) e->out_rows[R++] = g->off + g->out_first + r;
    }
    if (R > e->cap_logit_rows) {
        float *p = qi_realloc(e->logits, sizeof(float) * (size_t)R * e->m->hp.n_vocab);
        if (!p) return QI_ERR(err, QI_ERR_NOMEM, "out of memory for %d rows of logits", R);
        e->logits = p;
        e->cap_logit_rows = R;
    }
    const double t0 = e->o.profile ? eng_eclock(e) : 0.0;
    double before = 0.0;
    for (int k = 0; k < QI_OP_OTHER; k++) before += e->prof.seconds[k];
    qi_status st = forward(e, e->segs, n_seg, T, R, err);
    qi_err fe = {0};
    const qi_status fin = finish_step(e, st ? &fe : err); /* the first failure is the one reported */
    if (!st) st = fin;
    if (!st) st = eng_live_round(e, err);
    /* a device's failure with the background worker: one of its uploads,
     * maybe, so the split can no longer be trusted */
    if (st == QI_ERR_BACKEND && e->ns && e->ns->live && e->o.neuron_swap_worker) eng_swap_failed(e, st, err);
    if (e->o.profile) { /* the ops' device times are in (finish_step); the rest of the step is "other" */
        double after = 0.0;
        for (int k = 0; k < QI_OP_OTHER; k++) after += e->prof.seconds[k];
        e->prof.seconds[QI_OP_OTHER] += (eng_eclock(e) - t0) - (after - before);
        e->prof.calls[QI_OP_OTHER]++;
        e->prof.steps++;
    }
    int row = 0;
    for (int i = 0; i < n_seg; i++) {
        const segment *g = &e->segs[i];
        seq_state *s = &e->seqs[g->id];
        if (st) {
            s->failed = true;
            continue;
        }
        s->head += g->n;
        s->n_pending -= g->n;
        s->n_past += g->n;
        if (g->n == 1) s->decode_steps++;
        s->logit_row = row;
        s->n_logits = g->n_out;
        row += g->n_out;
    }
    if (st) return st;
    if (n_tokens) *n_tokens = T;
    return QI_OK;
}

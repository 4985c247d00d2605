/* engine_seq.c - the engine's sequences: added, fed, removed, swapped to
 * the offload tier and back; and the step's segments chosen among them.
 *
 * A step is a list of segments, one per sequence that runs in it: a run of
 * that sequence's pending tokens at consecutive positions. Decoding
 * sequences (one pending token) come first, one row each, on top of the
 * step's prompt room (step_tokens); then prompt chunks, starting from a
 * cursor that moves every step so no sequence waits for ever. A chunk is
 * always the next min(pending, QI_ENGINE_CHUNK, step_tokens) tokens and runs
 * whole or waits: a sequence's segments, and so the points where a budgeted
 * policy evicts (after each segment, at a budget set by its last position),
 * never depend on what else is in the batch. Cutting a chunk to fill the
 * room would let a neighbour's decode rows move those points and change a
 * sequence's result. */
#include "engine_int.h"

static qi_status check_id(const qi_engine *e, int id, qi_err *err) {
    if (id < 0 || id >= e->o.max_seqs || !e->seqs[id].used)
        return QI_ERR(err, QI_ERR_INVALID, "no sequence %d", id);
    if (e->seqs[id].failed)
        return QI_ERR(err, QI_ERR_INVALID, "sequence %d failed in an earlier step; remove it", id);
    return QI_OK;
}

qi_status qi_engine_seq_add(qi_engine *e, int *id, qi_err *err) {
    *id = -1;
    const qi_hparams *hp = &e->m->hp;
    for (int i = 0; i < e->o.max_seqs; i++) {
        seq_state *s = &e->seqs[i];
        if (s->used) continue;
        memset(s, 0, sizeof *s);
        s->pending = qi_malloc(sizeof(int32_t) * (size_t)e->o.n_ctx);
        s->streams = qi_calloc((size_t)hp->n_layer * hp->n_head_kv, sizeof *s->streams);
        if (!s->pending || !s->streams) {
            qi_free(s->pending);
            qi_free(s->streams);
            memset(s, 0, sizeof *s);
            return QI_ERR(err, QI_ERR_NOMEM, "out of memory adding a sequence");
        }
        for (int l = 0; l < hp->n_layer; l++)
            for (int h = 0; h < hp->n_head_kv; h++) {
                qi_kv_stream *sm = stream_of(e, s, l, h);
                qi_kv_stream_init(sm, hp->n_swa > 0 && e->m->layers[l].swa ? e->swa_cells : 0, work_pool(e, l),
                                  split_pool(e, l), e->pool);
                if (eng_pick_layer(e, l) && !e->pick_tokens) qi_kv_stream_keep_bounds(sm);
                if (eng_pick_layer(e, l) && e->pick_tokens) qi_kv_stream_keep_kcols(sm);
                if (eng_fetch_layer(e, l)) qi_kv_stream_keep_off_kcols(sm);
            }
        s->used = true;
        *id = i;
        return QI_OK;
    }
    return QI_ERR(err, QI_ERR_INVALID, "all %d sequence slots are in use", e->o.max_seqs);
}

qi_status qi_engine_seq_remove(qi_engine *e, int id, qi_err *err) {
    if (id < 0 || id >= e->o.max_seqs || !e->seqs[id].used) return QI_ERR(err, QI_ERR_INVALID, "no sequence %d", id);
    seq_state *s = &e->seqs[id];
    for (int l = 0; l < e->m->hp.n_layer; l++)
        for (int h = 0; h < e->m->hp.n_head_kv; h++) qi_kv_stream_release(stream_of(e, s, l, h));
    qi_free(s->streams);
    qi_free(s->pending);
    memset(s, 0, sizeof *s);
    return QI_OK;
}

qi_status qi_engine_seq_feed(qi_engine *e, int id, const int32_t *tokens, int n, bool logits_all, qi_err *err) {
    qi_status st = check_id(e, id, err);
    if (st) return st;
    seq_state *s = &e->seqs[id];
    const int V = e->m->hp.n_vocab;
    if (n < 1) return QI_ERR(err, QI_ERR_INVALID, "nothing to feed");
    if ((long)s->n_past + s->n_pending + n > e->o.n_ctx)
        return QI_ERR(err, QI_ERR_INVALID, "context full: sequence %d has %d tokens and %d pending, %d more exceed %d",
                      id, s->n_past, s->n_pending, n, e->o.n_ctx);
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= V)
            return QI_ERR(err, QI_ERR_INVALID, "token id %d out of range 0..%d", tokens[i], V - 1);
    if (s->n_pending > 0 && s->logits_all != logits_all)
        return QI_ERR(err, QI_ERR_INVALID, "sequence %d still has pending tokens fed with logits_all=%d", id,
                      (int)s->logits_all);
    if (s->head > 0) {
        memmove(s->pending, s->pending + s->head, sizeof(int32_t) * (size_t)s->n_pending);
        s->head = 0;
    }
    memcpy(s->pending + s->n_pending, tokens, sizeof(int32_t) * (size_t)n);
    s->n_pending += n;
    s->logits_all = logits_all;
    return QI_OK;
}

int qi_engine_seq_pending(const qi_engine *e, int id) {
    return id >= 0 && id < e->o.max_seqs && e->seqs[id].used ? e->seqs[id].n_pending : 0;
}

int qi_engine_seq_n_past(const qi_engine *e, int id) {
    return id >= 0 && id < e->o.max_seqs && e->seqs[id].used ? e->seqs[id].n_past : 0;
}

int qi_engine_seq_n_logits(const qi_engine *e, int id) {
    return id >= 0 && id < e->o.max_seqs && e->seqs[id].used ? e->seqs[id].n_logits : 0;
}

const float *qi_engine_seq_logits(const qi_engine *e, int id, int i) {
    if (id < 0 || id >= e->o.max_seqs || !e->seqs[id].used) return NULL;
    const seq_state *s = &e->seqs[id];
    if (i < 0) i = s->n_logits - 1;
    if (i < 0 || i >= s->n_logits) return NULL;
    return e->logits + (size_t)(s->logit_row + i) * e->m->hp.n_vocab;
}

int qi_engine_max_seqs(const qi_engine *e) { return e->o.max_seqs; }

/* Every stream of the sequence at once, or none: a stream that fails
 * undoes the ones before it (which cannot fail for want of blocks: it
 * gives back what they took). */
static qi_status seq_swap(qi_engine *e, int id, bool out, qi_err *err) {
    qi_status st = check_id(e, id, err);
    if (st) return st;
    seq_state *s = &e->seqs[id];
    if (s->swapped == out)
        return QI_ERR(err, QI_ERR_INVALID, "sequence %d is %s", id, out ? "swapped out already" : "not swapped out");
    const int L = e->m->hp.n_layer, Hkv = e->m->hp.n_head_kv;
    for (int k = 0; k < L * Hkv; k++) {
        qi_kv_stream *kv = stream_of(e, s, k / Hkv, k % Hkv);
        st = out ? qi_kv_stream_swap_out(kv, err) : qi_kv_stream_swap_in(kv, err);
        if (!st) continue;
        qi_err_prefix(err, "sequence %d, layer %d, KV head %d", id, k / Hkv, k % Hkv);
        while (k-- > 0) {
            kv = stream_of(e, s, k / Hkv, k % Hkv);
            if (out ? qi_kv_stream_swap_in(kv, NULL) : qi_kv_stream_swap_out(kv, NULL)) s->failed = true;
        }
        return st;
    }
    s->swapped = out;
    return QI_OK;
}

qi_status qi_engine_seq_swap_out(qi_engine *e, int id, qi_err *err) { return seq_swap(e, id, true, err); }

qi_status qi_engine_seq_swap_in(qi_engine *e, int id, qi_err *err) { return seq_swap(e, id, false, err); }

bool qi_engine_seq_swapped(const qi_engine *e, int id) {
    return id >= 0 && id < e->o.max_seqs && e->seqs[id].used && e->seqs[id].swapped;
}

void qi_engine_kv_seq_stats(const qi_engine *e, int id, qi_engine_kv_seq *out) {
    memset(out, 0, sizeof *out);
    if (id < 0 || id >= e->o.max_seqs || !e->seqs[id].used) return;
    const size_t bb = qi_kv_pool_usage(e->pool)->block_bytes;
    for (int l = 0; l < e->m->hp.n_layer; l++)
        for (int h = 0; h < e->m->hp.n_head_kv; h++) {
            const qi_kv_stream *st = stream_of(e, &e->seqs[id], l, h);
            out->work_tokens += st->work.n;
            out->off_tokens += st->off.n;
            out->attn_tokens += st->attended;
            out->work_bytes += bb * (size_t)st->work.n_blocks;
            out->off_bytes += bb * (size_t)st->off.n_blocks;
        }
}

int qi_engine_kv_stream_tokens(const qi_engine *e, int id, int layer, int kv_head, int tier, const int32_t **pos,
                               const float **score) {
    *pos = NULL;
    if (score) *score = NULL;
    if (id < 0 || id >= e->o.max_seqs || !e->seqs[id].used || layer < 0 || layer >= e->m->hp.n_layer ||
        kv_head < 0 || kv_head >= e->m->hp.n_head_kv || (tier != 0 && tier != 1))
        return -1;
    const qi_kv_stream *st = stream_of(e, &e->seqs[id], layer, kv_head);
    const qi_kv_tier *t = tier == 0 ? &st->work : &st->off;
    *pos = t->pos;
    if (score) *score = t->score;
    return t->n;
}

void qi_engine_kv_pool_stats(const qi_engine *e, qi_engine_kv_pool *out) {
    const qi_kv_usage *u = qi_kv_pool_usage(e->pool);
    out->block_bytes = u->block_bytes;
    out->work_blocks = u->blocks[0];
    out->off_blocks = u->blocks[1];
    out->peak_work_blocks = u->peak_blocks[0];
    out->peak_off_blocks = u->peak_blocks[1];
    out->max_blocks = u->max_blocks;
}

/* Pick the step's segments: every decode (one row each), then whole prompt
 * chunks while the prompt room lasts. The first chunk always fits, so no
 * prompt starves; a chunk that does not fit waits for a later step rather
 * than being cut (see the top of the file). */
int eng_schedule(qi_engine *e, int *T_out) {
    int n_seg = 0, T = 0, room = e->o.step_tokens;
    const int S = e->o.max_seqs, chunk = eng_block_chunk(e); /* with a block schedule, an equal share */
    for (int pass = 0; pass < 2; pass++) {
        for (int k = 0; k < S; k++) {
            const int id = (e->cursor + k) % S;
            seq_state *s = &e->seqs[id];
            if (!s->used || s->failed || s->swapped || s->n_pending == 0 || (pass == 0) != (s->n_pending == 1))
                continue;
            const int n = s->n_pending < chunk ? s->n_pending : chunk;
            if (pass == 1) {
                if (n > room) continue;
                room -= n;
            }
            segment *g = &e->segs[n_seg++];
            g->id = id;
            g->off = T;
            g->n = n;
            g->pos0 = s->n_past;
            if (s->logits_all) {
                g->out_first = 0;
                g->n_out = n;
            } else {
                g->out_first = n - 1;
                g->n_out = n == s->n_pending ? 1 : 0;
            }
            T += n;
        }
    }
    e->cursor = (e->cursor + 1) % S;
    *T_out = T;
    return n_seg;
}

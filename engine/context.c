/* context.c - the single-sequence context (qi_ctx, model.h): a facade over
 * the batched engine, so that the llama.cpp goldens, perplexity, bench's
 * pp/tg rows and everything else run the one forward path users run.
 *
 * A context is an engine of one sequence under the full policy, whose step
 * takes prompt chunks of up to QI_ENGINE_CHUNK tokens (llama.cpp's ubatch,
 * which also sizes Gemma 3's sliding-window ring); eval feeds the tokens
 * and steps until they are consumed, gathering the logits rows the steps
 * produce: every token's with logits_all, else the last token's.
 */
#include <string.h>

#include "qinfer/engine.h"
#include "qinfer/model.h"

struct qi_ctx {
    const qi_model *m;
    qi_engine *e;
    int id; /* the sequence; -1 after a failed reset */
    int n_ctx;
    float *logits; /* [cap_logits][n_vocab] */
    int cap_logits, n_logits;
};

double qi_ctx_now(const qi_ctx *c) { return qi_engine_now(c->e); }
qi_engine *qi_ctx_engine(const qi_ctx *c) { return c->e; }

qi_status qi_ctx_create(const qi_model *m, int n_ctx, int n_threads, qi_ctx **out, qi_err *err) {
    const qi_ctx_opts o = {.n_ctx = n_ctx, .n_threads = n_threads};
    return qi_ctx_create_opts(m, &o, out, err);
}

qi_status qi_ctx_create_opts(const qi_model *m, const qi_ctx_opts *o, qi_ctx **out, qi_err *err) {
    *out = NULL;
    if (o->n_ctx < 1 || o->n_ctx > (1 << 20))
        return QI_ERR(err, QI_ERR_INVALID, "context size %d out of range 1..%d", o->n_ctx, 1 << 20);
    qi_ctx *c = qi_calloc(1, sizeof *c);
    if (!c) return QI_ERR(err, QI_ERR_NOMEM, "out of memory creating a %d-token context", o->n_ctx);
    c->m = m;
    c->n_ctx = o->n_ctx;
    c->id = -1;
    qi_engine_opts eo;
    qi_engine_opts_default(&eo);
    eo.n_threads = o->n_threads;
    eo.max_seqs = 1;
    eo.n_ctx = o->n_ctx;
    eo.step_tokens = QI_ENGINE_CHUNK;
    eo.attn_blas = o->attn_blas;
    eo.repack = o->repack;
    eo.devices = o->devices;
    eo.placement = o->placement;
    eo.sim = o->sim;
    eo.sim_params = o->sim_params;
    eo.sim_cal = o->sim_cal;
    eo.profile = o->profile;
    qi_status st = qi_engine_create(m, &eo, &c->e, err);
    if (!st) st = qi_engine_seq_add(c->e, &c->id, err);
    if (!st) {
        c->logits = qi_malloc(sizeof(float) * (size_t)m->hp.n_vocab);
        c->cap_logits = 1;
        if (!c->logits) st = QI_ERR(err, QI_ERR_NOMEM, "out of memory for a row of %d logits", m->hp.n_vocab);
    }
    if (st) {
        qi_ctx_free(c);
        return st;
    }
    *out = c;
    return QI_OK;
}

void qi_ctx_free(qi_ctx *c) {
    if (!c) return;
    qi_engine_free(c->e);
    qi_free(c->logits);
    qi_free(c);
}

int qi_ctx_n_ctx(const qi_ctx *c) { return c->n_ctx; }
int qi_ctx_n_past(const qi_ctx *c) { return c->id >= 0 ? qi_engine_seq_n_past(c->e, c->id) : 0; }

/* The sequence is removed and added again: its blocks go back to the
 * engine's pool, which hands them out again before allocating. */
void qi_ctx_reset(qi_ctx *c) {
    c->n_logits = 0;
    qi_err err = {0};
    if (c->id >= 0) qi_engine_seq_remove(c->e, c->id, &err);
    c->id = -1;
    /* cannot fail for lack of a slot (the one slot was just freed); on lack
     * of memory the next eval reports it */
    qi_engine_seq_add(c->e, &c->id, &err);
}

qi_status qi_ctx_eval(qi_ctx *c, const int32_t *tokens, int n, bool logits_all, qi_err *err) {
    const int V = c->m->hp.n_vocab;
    if (n < 1) return QI_ERR(err, QI_ERR_INVALID, "nothing to evaluate");
    if (c->id < 0 && qi_engine_seq_add(c->e, &c->id, err)) return QI_ERR_NOMEM;
    const int n_past = qi_engine_seq_n_past(c->e, c->id);
    if (n > c->n_ctx - n_past)
        return QI_ERR(err, QI_ERR_INVALID, "context full: %d tokens already, %d more, context size %d", n_past, n,
                      c->n_ctx);
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= V)
            return QI_ERR(err, QI_ERR_INVALID, "token id %d out of range 0..%d", tokens[i], V - 1);
    const int need = logits_all ? n : 1;
    if (need > c->cap_logits) {
        float *p = qi_realloc(c->logits, sizeof(float) * (size_t)need * V);
        if (!p) return QI_ERR(err, QI_ERR_NOMEM, "out of memory for %d rows of logits", need);
        c->logits = p;
        c->cap_logits = need;
    }
    c->n_logits = 0;
    qi_status st = qi_engine_seq_feed(c->e, c->id, tokens, n, logits_all, err);
    if (st) return st;
    int got = 0;
    while (qi_engine_seq_pending(c->e, c->id) > 0) {
        if ((st = qi_engine_step(c->e, NULL, err))) {
            /* the engine marks the sequence failed: start it again empty */
            qi_ctx_reset(c);
            return st;
        }
        const int rows = qi_engine_seq_n_logits(c->e, c->id);
        QI_ASSERT(got + rows <= need);
        for (int r = 0; r < rows; r++)
            memcpy(c->logits + (size_t)(got + r) * V, qi_engine_seq_logits(c->e, c->id, r), sizeof(float) * (size_t)V);
        got += rows;
    }
    QI_ASSERT(got == need);
    c->n_logits = need;
    return QI_OK;
}

const float *qi_ctx_logits(const qi_ctx *c, int i) {
    if (i < 0) i = c->n_logits - 1;
    if (i < 0 || i >= c->n_logits) return NULL;
    return c->logits + (size_t)i * c->m->hp.n_vocab;
}

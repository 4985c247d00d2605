/* forward.c - the llama and gemma3 forward pass for one sequence, over a
 * backend.
 *
 * Per layer: x += Wo . attn(rope(Wq . n), rope(Wk . n), Wv . n) with
 * n = rmsnorm(x); then x += Wdown . (silu(Wgate . m) * (Wup . m)) with
 * m = rmsnorm(x). Gemma3 adds, in llama.cpp's order: embeddings scaled by
 * sqrt(n_embd); a per-head RMSNorm of q and k before RoPE; q scaled after
 * RoPE (the softmax then unscaled); RMSNorms of the attention and FFN
 * outputs before each residual add; GeGLU instead of SwiGLU; local layers
 * with a sliding window and their own RoPE base. The window is a mask over
 * the cache, as llama.cpp's. Its local layers' cache is a ring of
 * n_swa + n_ubatch cells rounded up to 256 (1024 for Gemma 3 270M), position
 * p landing in cell p % size when one sequence is decoded from position 0
 * in ubatches of up to 512; once it has wrapped, attention runs over the
 * cells in cell order, which decides the summation order, so the local
 * layers here keep the same ring. K and V of every position are kept in an fp16 cache
 * [L][n_ctx][Hkv*D], as llama.cpp's default cache does, so attention reads the
 * same rounded values.
 *
 * A prompt is evaluated in chunks of at most QI_MAX_CHUNK tokens so that
 * scratch stays bounded whatever the prompt length; chunking does not change
 * results (each token attends to the same cache rows either way).
 * All scratch is sized in qi_ctx_create: nothing allocates during eval.
 */
#include <math.h>
#include <string.h>

#include "backend.h"
#include "qinfer/model.h"
#include "qinfer/quant.h"

#define QI_MAX_CHUNK 512

struct qi_ctx {
    const qi_model *m;
    qi_backend *be;
    int n_ctx, n_past;
    int swa_cells; /* rows of the sliding-window layers' ring (see eval_chunk); 0: none */
    uint16_t *k_cache, *v_cache; /* [L][n_ctx][Hkv*D] fp16 */
    /* scratch, [QI_MAX_CHUNK] rows each */
    float *x, *xn, *q, *k, *v, *att, *gate, *up;
    int32_t *pos; /* [QI_MAX_CHUNK] a chunk's positions */
    float *logits; /* [cap_logits][V] */
    int cap_logits, n_logits;
};

qi_status qi_ctx_create(const qi_model *m, int n_ctx, int n_threads, qi_ctx **out, qi_err *err) {
    const qi_ctx_opts o = {.n_ctx = n_ctx, .n_threads = n_threads};
    return qi_ctx_create_opts(m, &o, out, err);
}

qi_status qi_ctx_create_opts(const qi_model *m, const qi_ctx_opts *o, qi_ctx **out, qi_err *err) {
    *out = NULL;
    const int n_ctx = o->n_ctx;
    const qi_hparams *hp = &m->hp;
    if (n_ctx < 1 || n_ctx > (1 << 20))
        return QI_ERR(err, QI_ERR_INVALID, "context size %d out of range 1..%d", n_ctx, 1 << 20);
    qi_ctx *c = qi_calloc(1, sizeof *c);
    if (!c) return QI_ERR(err, QI_ERR_NOMEM, "out of memory");
    c->m = m;
    c->n_ctx = n_ctx;
    if (hp->n_swa > 0) {
        /* llama.cpp's SWA cache: n_swa + n_ubatch cells rounded up to 256 */
        long cells = ((long)hp->n_swa + QI_MAX_CHUNK + 255) / 256 * 256;
        c->swa_cells = cells < n_ctx ? (int)cells : n_ctx;
    }
    qi_status st = qi_backend_cpu_create(o->n_threads, o->attn_blas, &c->be, err);
    if (st) {
        qi_free(c);
        return st;
    }
    const size_t kv = (size_t)hp->n_head_kv * hp->head_dim;
    const size_t q = (size_t)hp->n_head * hp->head_dim;
    const size_t R = QI_MAX_CHUNK;
    c->k_cache = qi_malloc(sizeof(uint16_t) * (size_t)hp->n_layer * n_ctx * kv);
    c->v_cache = qi_malloc(sizeof(uint16_t) * (size_t)hp->n_layer * n_ctx * kv);
    c->x = qi_malloc(sizeof(float) * R * hp->n_embd);
    c->xn = qi_malloc(sizeof(float) * R * ((size_t)hp->n_embd > q ? (size_t)hp->n_embd : q));
    c->q = qi_malloc(sizeof(float) * R * q);
    c->k = qi_malloc(sizeof(float) * R * kv);
    c->v = qi_malloc(sizeof(float) * R * kv);
    c->att = qi_malloc(sizeof(float) * R * q);
    c->gate = qi_malloc(sizeof(float) * R * hp->n_ff);
    c->up = qi_malloc(sizeof(float) * R * hp->n_ff);
    c->pos = qi_malloc(sizeof(int32_t) * R);
    c->cap_logits = 1;
    c->logits = qi_malloc(sizeof(float) * hp->n_vocab);
    if (!c->k_cache || !c->v_cache || !c->x || !c->xn || !c->q || !c->k || !c->v || !c->att ||
        !c->gate || !c->up || !c->pos || !c->logits) {
        qi_ctx_free(c);
        return QI_ERR(err, QI_ERR_NOMEM, "out of memory allocating a %d-token context", n_ctx);
    }
    if ((st = c->be->iface->reserve(c->be, qi_backend_max_act_row_bytes(m) * R, (int)R, n_ctx, hp->n_head_kv,
                                    hp->head_dim, err))) {
        qi_ctx_free(c);
        return st;
    }
    *out = c;
    return QI_OK;
}

void qi_ctx_free(qi_ctx *c) {
    if (!c) return;
    qi_backend_free(c->be);
    qi_free(c->k_cache);
    qi_free(c->v_cache);
    qi_free(c->x);
    qi_free(c->xn);
    qi_free(c->q);
    qi_free(c->k);
    qi_free(c->v);
    qi_free(c->att);
    qi_free(c->gate);
    qi_free(c->up);
    qi_free(c->pos);
    qi_free(c->logits);
    qi_free(c);
}

int qi_ctx_n_ctx(const qi_ctx *c) { return c->n_ctx; }
int qi_ctx_n_past(const qi_ctx *c) { return c->n_past; }
void qi_ctx_reset(qi_ctx *c) {
    c->n_past = 0;
    c->n_logits = 0;
}

/* Scale n floats in place (ggml_scale: one float multiply each). */
static void scale_rows(float *x, long n, float s) {
    for (long i = 0; i < n; i++) x[i] *= s;
}

/* One chunk of T <= QI_MAX_CHUNK tokens at positions n_past..; logits_out
 * NULL skips the output head (an inner chunk of a long prompt).
 *
 * In the last layer, once attention has written its K/V and projected its
 * output, only the rows whose logits are wanted go on (all of them, the last
 * one, or none for an inner chunk), as llama.cpp selects its output rows
 * there: the remaining matmuls then run with that many tokens, which decides
 * the K-quant summation order (QI_K_WIDE_MIN). */
static void eval_chunk(qi_ctx *c, const int32_t *tokens, int T, float *logits_out, bool all) {
    const qi_model *m = c->m;
    const qi_hparams *hp = &m->hp;
    const qi_backend_i *be = c->be->iface;
    qi_backend *b = c->be;
    const int E = hp->n_embd, H = hp->n_head, Hkv = hp->n_head_kv, D = hp->head_dim;
    const long kvw = (long)Hkv * D;
    const int pos0 = c->n_past;

    for (int t = 0; t < T; t++) c->pos[t] = pos0 + t;
    be->get_rows(b, &m->tok_embd, tokens, T, c->x);
    if (hp->embd_scale != 1.0f) scale_rows(c->x, (long)T * E, hp->embd_scale);
    int R = T; /* rows still carried */
    for (int l = 0; l < hp->n_layer; l++) {
        const qi_layer *ly = &m->layers[l];
        const bool swa = hp->n_swa > 0 && ly->swa;
        const float base = swa ? hp->rope_base_swa : hp->rope_base;
        be->rmsnorm(b, c->x, ly->attn_norm.data, T, E, hp->rms_eps, c->xn);
        const qi_weight *qkv[3] = {&ly->wq, &ly->wk, &ly->wv};
        float *const qkv_out[3] = {c->q, c->k, c->v};
        be->matmul_n(b, qkv, qkv_out, 3, c->xn, T);
        if (ly->q_norm.data) be->rmsnorm(b, c->q, ly->q_norm.data, T * H, D, hp->rms_eps, c->q);
        if (ly->k_norm.data) be->rmsnorm(b, c->k, ly->k_norm.data, T * Hkv, D, hp->rms_eps, c->k);
        be->rope(b, c->q, H, c->k, Hkv, T, D, hp->n_rot, c->pos, base, hp->rope_freq_scale, hp->rope_mode);
        if (hp->q_scale > 0) scale_rows(c->q, (long)T * H * D, hp->q_scale);
        uint16_t *kc = c->k_cache + (size_t)l * c->n_ctx * kvw;
        uint16_t *vc = c->v_cache + (size_t)l * c->n_ctx * kvw;
        const int ring = swa ? c->swa_cells : 0;
        for (int t = 0; t < T; t++) {
            const long row = ring ? (pos0 + t) % ring : pos0 + t;
            for (long i = 0; i < kvw; i++) {
                kc[row * kvw + i] = qi_f32_to_fp16(c->k[t * kvw + i]);
                vc[row * kvw + i] = qi_f32_to_fp16(c->v[t * kvw + i]);
            }
        }
        qi_attn_args a = {.T = T, .H = H, .Hkv = Hkv, .D = D, .pos0 = pos0, .n_swa = swa ? hp->n_swa : 0,
                          .n_cells = ring && pos0 + T > ring ? ring : 0,
                          .scale = hp->q_scale > 0 ? 1.0f : 1.0f / sqrtf((float)D),
                          .q = c->q, .k = kc, .v = vc, .out = c->att};
        be->attention(b, &a);
        be->matmul(b, &ly->wo, c->att, T, c->xn);
        if (l == hp->n_layer - 1 && !all) {
            /* keep the last row only, or nothing for an inner chunk */
            R = logits_out ? 1 : 0;
            if (R == 0) break;
            memmove(c->x, c->x + (long)(T - 1) * E, sizeof(float) * E);
            memmove(c->xn, c->xn + (long)(T - 1) * E, sizeof(float) * E);
        }
        if (ly->attn_post_norm.data) be->rmsnorm(b, c->xn, ly->attn_post_norm.data, R, E, hp->rms_eps, c->xn);
        for (long i = 0; i < (long)R * E; i++) c->x[i] += c->xn[i];

        be->rmsnorm(b, c->x, ly->ffn_norm.data, R, E, hp->rms_eps, c->xn);
        const qi_weight *gu[2] = {&ly->w_gate, &ly->w_up};
        float *const gu_out[2] = {c->gate, c->up};
        be->matmul_n(b, gu, gu_out, 2, c->xn, R);
        if (hp->ffn_act == QI_FFN_GEGLU_TANH)
            be->geglu(b, c->gate, c->up, R, hp->n_ff);
        else
            be->swiglu(b, c->gate, c->up, R, hp->n_ff);
        be->matmul(b, &ly->w_down, c->gate, R, c->xn);
        if (ly->ffn_post_norm.data) be->rmsnorm(b, c->xn, ly->ffn_post_norm.data, R, E, hp->rms_eps, c->xn);
        for (long i = 0; i < (long)R * E; i++) c->x[i] += c->xn[i];
    }
    c->n_past += T;
    if (!logits_out) return;
    /* Output head over the R rows kept: all of them, or the last one. */
    be->rmsnorm(b, c->x, m->out_norm.data, R, E, hp->rms_eps, c->xn);
    be->matmul(b, &m->output, c->xn, R, logits_out);
    if (hp->logit_softcap > 0) {
        const float cap = hp->logit_softcap, inv = 1.0f / cap;
        for (long i = 0; i < (long)R * hp->n_vocab; i++) logits_out[i] = tanhf(logits_out[i] * inv) * cap;
    }
}

qi_status qi_ctx_eval(qi_ctx *c, const int32_t *tokens, int n, bool logits_all, qi_err *err) {
    const int V = c->m->hp.n_vocab;
    if (n < 1) return QI_ERR(err, QI_ERR_INVALID, "nothing to evaluate");
    if (n > c->n_ctx - c->n_past)
        return QI_ERR(err, QI_ERR_INVALID, "context full: %d tokens already, %d more, context size %d",
                      c->n_past, n, c->n_ctx);
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= V)
            return QI_ERR(err, QI_ERR_INVALID, "token id %d out of range 0..%d", tokens[i], V - 1);
    int need = logits_all ? n : 1;
    if (need > c->cap_logits) {
        float *p = qi_realloc(c->logits, sizeof(float) * (size_t)need * V);
        if (!p) return QI_ERR(err, QI_ERR_NOMEM, "out of memory for %d rows of logits", need);
        c->logits = p;
        c->cap_logits = need;
    }
    for (int i = 0; i < n; i += QI_MAX_CHUNK) {
        int T = n - i < QI_MAX_CHUNK ? n - i : QI_MAX_CHUNK;
        if (logits_all)
            eval_chunk(c, tokens + i, T, c->logits + (size_t)i * V, true);
        else
            eval_chunk(c, tokens + i, T, i + T == n ? c->logits : NULL, false);
    }
    c->n_logits = need;
    return QI_OK;
}

const float *qi_ctx_logits(const qi_ctx *c, int i) {
    if (i < 0) i = c->n_logits - 1;
    if (i < 0 || i >= c->n_logits) return NULL;
    return c->logits + (size_t)i * c->m->hp.n_vocab;
}

/* model.c - build a qi_model from GGUF metadata and tensors.
 *
 * Hyper-parameters come from "<arch>.*" keys; weights are views into the
 * mapping, each checked for existence, shape and a type the kernels can dot.
 * Anything missing or inconsistent is a QI_ERR_FORMAT naming the file and the
 * key or tensor, so a bad or foreign file never reaches the forward pass.
 *
 * qwen2 is llama's decoder with biases on the query, key and value
 * projections (blk.N.attn_{q,k,v}.bias, f32), RoPE rotating halves (NEOX, as
 * llama.cpp's rope type for qwen2) and, in the larger files, an output head
 * of its own (output.weight; absent: tied to the embedding, as llama.cpp
 * falls back).
 *
 * Gemma norm weights are used as stored: the GGUF converter has already
 * folded Gemma's (1 + w) into them, and llama.cpp multiplies by them as is.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "kernels.h"
#include "qinfer/model.h"
#include "qinfer/quant.h"

static qi_status get_int(const qi_gguf *g, const char *arch, const char *suffix, bool required,
                         int def, int *out, qi_err *err) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    int64_t v;
    const qi_gguf_kv *kv = qi_gguf_kv_find(g, key);
    if (!kv) {
        if (required) return QI_ERR(err, QI_ERR_FORMAT, "%s: missing metadata key %s", qi_gguf_path(g), key);
        *out = def;
        return QI_OK;
    }
    if (!qi_gguf_kv_i64(kv, &v) || v < 0 || v > (1 << 30))
        return QI_ERR(err, QI_ERR_FORMAT, "%s: metadata %s is not a sane non-negative integer",
                      qi_gguf_path(g), key);
    *out = (int)v;
    return QI_OK;
}

static qi_status get_float(const qi_gguf *g, const char *arch, const char *suffix, float def,
                           float *out, qi_err *err) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    const qi_gguf_kv *kv = qi_gguf_kv_find(g, key);
    double v;
    if (!kv) {
        *out = def;
        return QI_OK;
    }
    if (!qi_gguf_kv_f64(kv, &v) || !isfinite(v))
        return QI_ERR(err, QI_ERR_FORMAT, "%s: metadata %s is not a finite number", qi_gguf_path(g), key);
    *out = (float)v;
    return QI_OK;
}

/* Find a tensor and check it is [n_cols, n_rows] (n_rows 0: 1-D of n_cols). */
static qi_status get_weight(const qi_gguf *g, const char *name, int64_t n_cols, int64_t n_rows,
                            bool optional, qi_weight *w, qi_err *err) {
    const qi_gguf_tensor *t = qi_gguf_tensor_find(g, name);
    memset(w, 0, sizeof *w);
    if (!t) {
        if (optional) return QI_OK;
        return QI_ERR(err, QI_ERR_FORMAT, "%s: missing tensor %s", qi_gguf_path(g), name);
    }
    int64_t want_rows = n_rows ? n_rows : 1;
    if ((int64_t)t->ne[0] != n_cols || (int64_t)t->ne[1] != want_rows || t->ne[2] != 1 || t->ne[3] != 1)
        return QI_ERR(err, QI_ERR_FORMAT,
                      "%s: tensor %s has shape [%llu, %llu, %llu, %llu], expected [%lld, %lld]",
                      qi_gguf_path(g), name, (unsigned long long)t->ne[0],
                      (unsigned long long)t->ne[1], (unsigned long long)t->ne[2],
                      (unsigned long long)t->ne[3], (long long)n_cols, (long long)want_rows);
    if (n_rows == 0 && t->type != QI_TYPE_F32)
        return QI_ERR(err, QI_ERR_UNSUPPORTED, "%s: norm tensor %s has type %s, expected f32",
                      qi_gguf_path(g), name, qi_type_get(t->type)->name);
    if (n_rows != 0 && !qi_type_can_dot(t->type))
        return QI_ERR(err, QI_ERR_UNSUPPORTED, "%s: tensor %s has type %s, which the engine cannot compute with",
                      qi_gguf_path(g), name, qi_type_get(t->type)->name);
    w->type = t->type;
    w->n_cols = n_cols;
    w->n_rows = want_rows;
    w->row_bytes = t->n_bytes / (uint64_t)want_rows;
    w->data = t->data;
    return QI_OK;
}

/* gemma3's layer pattern: "attention.sliding_window_pattern" as a per-layer
 * array of booleans (true: sliding), or as an integer N meaning that every
 * N-th layer (il % N == N-1) is global and the rest local; llama.cpp's
 * default for gemma3 is N = 6. */
static qi_status load_swa_pattern(qi_model *m, qi_err *err) {
    qi_gguf *g = m->gguf;
    qi_hparams *hp = &m->hp;
    char key[128];
    snprintf(key, sizeof key, "%s.attention.sliding_window_pattern", hp->arch_name);
    const qi_gguf_kv *kv = qi_gguf_kv_find(g, key);
    qi_gguf_arr arr;
    int64_t n_pattern = 6;
    if (kv && qi_gguf_kv_arr(kv, &arr)) {
        for (int l = 0; l < hp->n_layer; l++) {
            int64_t v;
            if (!qi_gguf_arr_i64(&arr, (uint64_t)l, &v))
                return QI_ERR(err, QI_ERR_FORMAT, "%s: %s has no integer or boolean entry for layer %d",
                              qi_gguf_path(g), key, l);
            m->layers[l].swa = v != 0;
        }
        return QI_OK;
    }
    if (kv && (!qi_gguf_kv_i64(kv, &n_pattern) || n_pattern < 0 || n_pattern > (1 << 20)))
        return QI_ERR(err, QI_ERR_FORMAT, "%s: %s is not a layer count or per-layer array", qi_gguf_path(g), key);
    for (int l = 0; l < hp->n_layer; l++)
        m->layers[l].swa = n_pattern == 0 || l % n_pattern < n_pattern - 1;
    return QI_OK;
}

/* The widths every architecture states the same way (its norm's epsilon
 * under eps_key), checked for consistency. */
static qi_status read_shape(qi_model *m, const char *eps_key, qi_err *err) {
    qi_gguf *g = m->gguf;
    qi_hparams *hp = &m->hp;
    const char *a = hp->arch_name;
    qi_status st;
    if ((st = get_int(g, a, "embedding_length", true, 0, &hp->n_embd, err)) ||
        (st = get_int(g, a, "block_count", true, 0, &hp->n_layer, err)) ||
        (st = get_int(g, a, "feed_forward_length", true, 0, &hp->n_ff, err)) ||
        (st = get_int(g, a, "attention.head_count", true, 0, &hp->n_head, err)) ||
        (st = get_int(g, a, "attention.head_count_kv", false, hp->n_head, &hp->n_head_kv, err)) ||
        (st = get_int(g, a, "context_length", false, 2048, &hp->n_ctx_train, err)) ||
        (st = get_float(g, a, eps_key, 1e-5f, &hp->rms_eps, err)) ||
        (st = get_float(g, a, "rope.freq_base", 10000.0f, &hp->rope_base, err)))
        return st;
    if (hp->n_embd <= 0 || hp->n_layer <= 0 || hp->n_head <= 0 || hp->n_head_kv <= 0 || hp->n_ff <= 0 ||
        hp->n_embd % hp->n_head || hp->n_head % hp->n_head_kv)
        return QI_ERR(err, QI_ERR_FORMAT,
                      "%s: inconsistent hyper-parameters (n_embd %d, n_layer %d, n_head %d, n_head_kv %d, n_ff %d)",
                      qi_gguf_path(g), hp->n_embd, hp->n_layer, hp->n_head, hp->n_head_kv, hp->n_ff);
    /* every layer has tensors of its own: a count past the file's tensors
     * is a lie, and the layer table sized by it could be gigabytes */
    if ((uint64_t)hp->n_layer > qi_gguf_n_tensors(g))
        return QI_ERR(err, QI_ERR_FORMAT, "%s: block_count %d, but the file has %llu tensors", qi_gguf_path(g),
                      hp->n_layer, (unsigned long long)qi_gguf_n_tensors(g));
    return QI_OK;
}

/* The vocabulary's size: the rows of the embedding matrix. */
static qi_status read_vocab(qi_model *m, qi_err *err) {
    qi_gguf *g = m->gguf;
    const qi_gguf_tensor *te = qi_gguf_tensor_find(g, "token_embd.weight");
    if (!te) return QI_ERR(err, QI_ERR_FORMAT, "%s: missing tensor token_embd.weight", qi_gguf_path(g));
    if (te->ne[1] == 0 || te->ne[1] > (1u << 24))
        return QI_ERR(err, QI_ERR_FORMAT, "%s: token_embd.weight has an implausible vocabulary of %llu rows",
                      qi_gguf_path(g), (unsigned long long)te->ne[1]);
    m->hp.n_vocab = (int)te->ne[1];
    return QI_OK;
}

/* llama, gemma3 and qwen2: the same decoder skeleton, gemma3 adding QK-norm,
 * post-attention and post-FFN norms, GeGLU, scaled embeddings and local
 * layers, qwen2 the projections' biases and NEOX RoPE. */
static qi_status load_llama(qi_model *m, qi_err *err) {
    qi_gguf *g = m->gguf;
    qi_hparams *hp = &m->hp;
    const char *a = hp->arch_name;
    qi_status st = read_shape(m, "attention.layer_norm_rms_epsilon", err);
    if (st) return st;
    if ((st = get_int(g, a, "attention.key_length", false, hp->n_embd / hp->n_head, &hp->head_dim, err)) ||
        (st = get_int(g, a, "rope.dimension_count", false, hp->head_dim, &hp->n_rot, err)))
        return st;
    if (hp->head_dim <= 0 || hp->head_dim > 1024 || hp->n_rot <= 0 || hp->n_rot > hp->head_dim || hp->n_rot % 2)
        return QI_ERR(err, QI_ERR_FORMAT, "%s: bad head size %d / rotary dims %d", qi_gguf_path(g),
                      hp->head_dim, hp->n_rot);
    int vlen;
    if ((st = get_int(g, a, "attention.value_length", false, hp->head_dim, &vlen, err))) return st;
    if (vlen != hp->head_dim)
        return QI_ERR(err, QI_ERR_UNSUPPORTED, "%s: value head size %d differs from key head size %d",
                      qi_gguf_path(g), vlen, hp->head_dim);
    if (hp->rope_base <= 0) return QI_ERR(err, QI_ERR_FORMAT, "%s: rope.freq_base must be positive", qi_gguf_path(g));
    if (hp->rms_eps <= 0 || hp->rms_eps > 1)
        return QI_ERR(err, QI_ERR_FORMAT, "%s: layer_norm_rms_epsilon %g is out of range", qi_gguf_path(g), hp->rms_eps);

    /* RoPE scaling: none or linear (freq_scale = 1/factor). */
    const bool gemma = hp->arch == QI_ARCH_GEMMA3;
    hp->rope_freq_scale = 1.0f;
    hp->rope_mode = gemma || hp->arch == QI_ARCH_QWEN2 ? QI_ROPE_NEOX : QI_ROPE_NORM;
    hp->ffn_act = gemma ? QI_FFN_GEGLU_TANH : QI_FFN_SWIGLU;
    hp->embd_scale = 1.0f;
    if (gemma) {
        /* As llama.cpp's gemma3 graph: embeddings times sqrtf((float)n_embd);
         * queries times 1/sqrt(key_length) (1/sqrt(n_embd/n_head) for the
         * 62-layer 27B, after gemma_pytorch's query_pre_attn_scalar), the
         * softmax unscaled; local layers' RoPE base from rope.freq_base_swa,
         * 10000 when absent; logit soft-capping when the key is there. */
        hp->embd_scale = sqrtf((float)hp->n_embd);
        hp->q_scale = hp->n_layer == 62 ? 1.0f / sqrtf((float)(hp->n_embd / hp->n_head))
                                        : 1.0f / sqrtf((float)hp->head_dim);
        if ((st = get_int(g, a, "attention.sliding_window", false, 0, &hp->n_swa, err)) ||
            (st = get_float(g, a, "rope.freq_base_swa", 10000.0f, &hp->rope_base_swa, err)) ||
            (st = get_float(g, a, "final_logit_softcapping", 0.0f, &hp->logit_softcap, err)))
            return st;
        if (hp->rope_base_swa <= 0 || hp->logit_softcap < 0)
            return QI_ERR(err, QI_ERR_FORMAT, "%s: bad rope.freq_base_swa %g or final_logit_softcapping %g",
                          qi_gguf_path(g), hp->rope_base_swa, hp->logit_softcap);
    }
    char key[128];
    snprintf(key, sizeof key, "%s.rope.scaling.type", a);
    qi_str stype;
    if (qi_gguf_get_str(g, key, &stype) && !qi_str_eq(stype, "none")) {
        if (!qi_str_eq(stype, "linear"))
            return QI_ERR(err, QI_ERR_UNSUPPORTED, "%s: rope scaling type '%.*s' is not supported (none, linear)",
                          qi_gguf_path(g), (int)(stype.len > 64 ? 64 : stype.len), stype.ptr);
        float factor;
        if ((st = get_float(g, a, "rope.scaling.factor", 1.0f, &factor, err))) return st;
        if (factor <= 0) return QI_ERR(err, QI_ERR_FORMAT, "%s: rope.scaling.factor must be positive", qi_gguf_path(g));
        hp->rope_freq_scale = 1.0f / factor;
    } else {
        float factor = 0;
        if ((st = get_float(g, a, "rope.scale_linear", 0.0f, &factor, err))) return st;
        if (factor > 0) hp->rope_freq_scale = 1.0f / factor;
    }
    if (qi_gguf_tensor_find(g, "rope_freqs.weight"))
        return QI_ERR(err, QI_ERR_UNSUPPORTED, "%s: per-frequency RoPE factors (rope_freqs.weight) are not supported yet",
                      qi_gguf_path(g));

    if ((st = read_vocab(m, err))) return st;

    const int E = hp->n_embd, Dq = hp->n_head * hp->head_dim, Dkv = hp->n_head_kv * hp->head_dim;
    if ((st = get_weight(g, "token_embd.weight", E, hp->n_vocab, false, &m->tok_embd, err)) ||
        (st = get_weight(g, "output_norm.weight", E, 0, false, &m->out_norm, err)) ||
        (st = get_weight(g, "output.weight", E, hp->n_vocab, true, &m->output, err)))
        return st;
    hp->tied_output = m->output.data == NULL;
    if (hp->tied_output) m->output = m->tok_embd;
    /* what llama.cpp would also take from such a file, and the engine would not */
    static const char *const refused[] = {"output.bias", "blk.0.attn_output.bias", "blk.0.attn_qkv.weight"};
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++)
        if (qi_gguf_tensor_find(g, refused[i]))
            return QI_ERR(err, QI_ERR_UNSUPPORTED, "%s: tensor %s is not supported for %s", qi_gguf_path(g),
                          refused[i], a);

    m->layers = qi_calloc((size_t)hp->n_layer, sizeof *m->layers);
    if (!m->layers) return QI_ERR(err, QI_ERR_NOMEM, "out of memory");
    for (int l = 0; l < hp->n_layer; l++) {
        qi_layer *ly = &m->layers[l];
        /* the projections' biases, where the file has them (every layer of
         * a qwen2 file; optional as llama.cpp loads them) */
        struct {
            const char *name;
            qi_weight *w;
            int64_t n;
        } bias[] = {{"attn_q", &ly->bq, Dq}, {"attn_k", &ly->bk, Dkv}, {"attn_v", &ly->bv, Dkv}};
        for (size_t i = 0; i < sizeof bias / sizeof bias[0]; i++) {
            char name[96];
            snprintf(name, sizeof name, "blk.%d.%s.bias", l, bias[i].name);
            if ((st = get_weight(g, name, bias[i].n, 0, true, bias[i].w, err))) return st;
        }
        struct {
            const char *name;
            qi_weight *w;
            int64_t cols, rows;
        } spec[] = {
            {"attn_norm", &ly->attn_norm, E, 0},     {"attn_q", &ly->wq, E, Dq},
            {"attn_k", &ly->wk, E, Dkv},             {"attn_v", &ly->wv, E, Dkv},
            {"attn_output", &ly->wo, Dq, E},         {"ffn_norm", &ly->ffn_norm, E, 0},
            {"ffn_gate", &ly->w_gate, E, hp->n_ff},  {"ffn_up", &ly->w_up, E, hp->n_ff},
            {"ffn_down", &ly->w_down, hp->n_ff, E},
        };
        for (size_t i = 0; i < sizeof spec / sizeof spec[0]; i++) {
            char name[96];
            snprintf(name, sizeof name, "blk.%d.%s.weight", l, spec[i].name);
            if ((st = get_weight(g, name, spec[i].cols, spec[i].rows, false, spec[i].w, err))) return st;
        }
        if (!gemma) continue;
        struct {
            const char *name;
            qi_weight *w;
            int64_t cols;
        } norms[] = {
            {"attn_q_norm", &ly->q_norm, hp->head_dim},
            {"attn_k_norm", &ly->k_norm, hp->head_dim},
            {"post_attention_norm", &ly->attn_post_norm, E},
            {"post_ffw_norm", &ly->ffn_post_norm, E},
        };
        for (size_t i = 0; i < sizeof norms / sizeof norms[0]; i++) {
            char name[96];
            snprintf(name, sizeof name, "blk.%d.%s.weight", l, norms[i].name);
            if ((st = get_weight(g, name, norms[i].cols, 0, false, norms[i].w, err))) return st;
        }
    }
    if (gemma && hp->n_swa > 0) return load_swa_pattern(m, err);
    return QI_OK;
}

/* OPT and Falcon (shapes for the simulated machine; the real devices have no
 * kernels for their LayerNorm, gate-free FFN, positions and biases). The
 * keys and tensor names follow llama.cpp's where it has the architecture
 * (falcon) and its conventions where it has not (opt, named as its gpt2 and
 * starcoder are):
 *   "<arch>.embedding_length", "block_count", "feed_forward_length",
 *   "attention.head_count", "attention.head_count_kv" (default: the query
 *   heads), "context_length", "attention.layer_norm_epsilon" (default 1e-5),
 *   "rope.freq_base" and "rope.dimension_count" (falcon);
 *   token_embd, output_norm (.weight, .bias), output (absent: tied);
 *   opt: position_embd.weight [n_embd, context_length] (OPT's table without
 *   its two offset rows: row p is position p); per layer attn_norm,
 *   attn_q, attn_k, attn_v, attn_output, ffn_norm, ffn_up (fc1), ffn_down
 *   (fc2), each .weight and .bias;
 *   falcon: per layer attn_norm (ln_attn) and attn_norm_2 (ln_mlp, Falcon-40B;
 *   absent in the 7B, whose one LayerNorm then serves both), .weight and
 *   .bias; attn_qkv.weight fused as llama.cpp's converter writes it (the
 *   query rows, then the keys', then the values': viewed here as three
 *   matrices), attn_output, ffn_up, ffn_down, no biases. */
static qi_status load_opt_falcon(qi_model *m, qi_err *err) {
    qi_gguf *g = m->gguf;
    qi_hparams *hp = &m->hp;
    const char *a = hp->arch_name;
    const bool falcon = hp->arch == QI_ARCH_FALCON;
    qi_status st = read_shape(m, "attention.layer_norm_epsilon", err);
    if (st) return st;
    if (hp->n_ctx_train <= 0)
        return QI_ERR(err, QI_ERR_FORMAT, "%s: context length %d", qi_gguf_path(g), hp->n_ctx_train);
    /* the parallel block keeps the MLP's input and output in the gate's rows */
    if (falcon && hp->n_ff < hp->n_embd)
        return QI_ERR(err, QI_ERR_UNSUPPORTED, "%s: falcon with n_ff %d below n_embd %d", qi_gguf_path(g), hp->n_ff,
                      hp->n_embd);
    hp->head_dim = hp->n_embd / hp->n_head;
    hp->n_rot = 0;
    if (falcon && (st = get_int(g, a, "rope.dimension_count", false, hp->head_dim, &hp->n_rot, err))) return st;
    if (hp->head_dim > 1024 || hp->n_rot < 0 || hp->n_rot > hp->head_dim || hp->n_rot % 2 || (falcon && !hp->n_rot))
        return QI_ERR(err, QI_ERR_FORMAT, "%s: bad head size %d / rotary dims %d", qi_gguf_path(g), hp->head_dim,
                      hp->n_rot);
    if (hp->rope_base <= 0) return QI_ERR(err, QI_ERR_FORMAT, "%s: rope.freq_base must be positive", qi_gguf_path(g));
    if (hp->rms_eps <= 0 || hp->rms_eps > 1)
        return QI_ERR(err, QI_ERR_FORMAT, "%s: layer_norm_epsilon %g is out of range", qi_gguf_path(g), hp->rms_eps);
    hp->rope_freq_scale = 1.0f;
    hp->rope_mode = QI_ROPE_NEOX; /* llama.cpp's for falcon */
    hp->ffn_act = falcon ? QI_FFN_GELU : QI_FFN_RELU;
    hp->embd_scale = 1.0f;
    hp->layer_norm = true;
    hp->parallel = falcon;

    if ((st = read_vocab(m, err))) return st;
    const int E = hp->n_embd, Dq = hp->n_head * hp->head_dim, Dkv = hp->n_head_kv * hp->head_dim, F = hp->n_ff;
    if ((st = get_weight(g, "token_embd.weight", E, hp->n_vocab, false, &m->tok_embd, err)) ||
        (!falcon && (st = get_weight(g, "position_embd.weight", E, hp->n_ctx_train, false, &m->pos_embd, err))) ||
        (st = get_weight(g, "output_norm.weight", E, 0, false, &m->out_norm, err)) ||
        (st = get_weight(g, "output_norm.bias", E, 0, false, &m->out_norm_b, err)) ||
        (st = get_weight(g, "output.weight", E, hp->n_vocab, true, &m->output, err)))
        return st;
    hp->tied_output = m->output.data == NULL;
    if (hp->tied_output) m->output = m->tok_embd;

    m->layers = qi_calloc((size_t)hp->n_layer, sizeof *m->layers);
    if (!m->layers) return QI_ERR(err, QI_ERR_NOMEM, "out of memory");
    for (int l = 0; l < hp->n_layer; l++) {
        qi_layer *ly = &m->layers[l];
        qi_weight qkv;
        struct {
            const char *name;
            qi_weight *w;
            int64_t cols, rows;
            bool optional;
        } opt[] = {
            {"attn_norm.weight", &ly->attn_norm, E, 0, false}, {"attn_norm.bias", &ly->attn_norm_b, E, 0, false},
            {"attn_q.weight", &ly->wq, E, Dq, false},          {"attn_q.bias", &ly->bq, Dq, 0, false},
            {"attn_k.weight", &ly->wk, E, Dkv, false},         {"attn_k.bias", &ly->bk, Dkv, 0, false},
            {"attn_v.weight", &ly->wv, E, Dkv, false},         {"attn_v.bias", &ly->bv, Dkv, 0, false},
            {"attn_output.weight", &ly->wo, Dq, E, false},     {"attn_output.bias", &ly->bo, E, 0, false},
            {"ffn_norm.weight", &ly->ffn_norm, E, 0, false},   {"ffn_norm.bias", &ly->ffn_norm_b, E, 0, false},
            {"ffn_up.weight", &ly->w_up, E, F, false},         {"ffn_up.bias", &ly->b_up, F, 0, false},
            {"ffn_down.weight", &ly->w_down, F, E, false},     {"ffn_down.bias", &ly->b_down, E, 0, false},
        }, fal[] = {
            {"attn_norm.weight", &ly->attn_norm, E, 0, false}, {"attn_norm.bias", &ly->attn_norm_b, E, 0, false},
            {"attn_norm_2.weight", &ly->ffn_norm, E, 0, true}, {"attn_norm_2.bias", &ly->ffn_norm_b, E, 0, true},
            {"attn_qkv.weight", &qkv, E, Dq + 2 * Dkv, false}, {"attn_output.weight", &ly->wo, Dq, E, false},
            {"ffn_up.weight", &ly->w_up, E, F, false},         {"ffn_down.weight", &ly->w_down, F, E, false},
        };
        const size_t n = falcon ? sizeof fal / sizeof fal[0] : sizeof opt / sizeof opt[0];
        for (size_t i = 0; i < n; i++) {
            char name[96];
            snprintf(name, sizeof name, "blk.%d.%s", l, falcon ? fal[i].name : opt[i].name);
            if ((st = falcon ? get_weight(g, name, fal[i].cols, fal[i].rows, fal[i].optional, fal[i].w, err)
                             : get_weight(g, name, opt[i].cols, opt[i].rows, opt[i].optional, opt[i].w, err)))
                return st;
        }
        if (!falcon) continue;
        if (!ly->ffn_norm.data) { /* one LayerNorm for both (Falcon-7B) */
            ly->ffn_norm = ly->attn_norm;
            ly->ffn_norm_b = ly->attn_norm_b;
        } else if (!ly->ffn_norm_b.data) {
            return QI_ERR(err, QI_ERR_FORMAT, "%s: missing tensor blk.%d.attn_norm_2.bias", qi_gguf_path(g), l);
        }
        /* the fused matrix as three: its query, key and value rows */
        ly->wq = ly->wk = ly->wv = qkv;
        ly->wq.n_rows = Dq;
        ly->wk.n_rows = ly->wv.n_rows = Dkv;
        ly->wk.data = (const char *)qkv.data + qkv.row_bytes * (uint64_t)Dq;
        ly->wv.data = (const char *)qkv.data + qkv.row_bytes * (uint64_t)(Dq + Dkv);
    }
    return QI_OK;
}

static void count_params(qi_model *m) {
    qi_gguf *g = m->gguf;
    for (uint64_t i = 0; i < qi_gguf_n_tensors(g); i++) {
        const qi_gguf_tensor *t = qi_gguf_tensor_at(g, i);
        m->n_params += t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
        m->weight_bytes += t->n_bytes;
    }
}

qi_status qi_model_from_gguf(qi_gguf *g, qi_model **out, qi_err *err) {
    *out = NULL;
    qi_model *m = qi_calloc(1, sizeof *m);
    if (!m) {
        qi_gguf_close(g);
        return QI_ERR(err, QI_ERR_NOMEM, "out of memory");
    }
    m->gguf = g;
    qi_status st = QI_OK;
    qi_str arch;
    if (!qi_gguf_get_str(g, "general.architecture", &arch)) {
        st = QI_ERR(err, QI_ERR_FORMAT, "%s: missing metadata key general.architecture", qi_gguf_path(g));
        goto fail;
    }
    if (arch.len >= sizeof m->hp.arch_name) arch.len = sizeof m->hp.arch_name - 1;
    memcpy(m->hp.arch_name, arch.ptr, arch.len);
    m->hp.arch_name[arch.len] = 0;
    if (strcmp(m->hp.arch_name, "llama") == 0) {
        m->hp.arch = QI_ARCH_LLAMA;
        st = load_llama(m, err);
    } else if (strcmp(m->hp.arch_name, "gemma3") == 0) {
        m->hp.arch = QI_ARCH_GEMMA3;
        st = load_llama(m, err);
    } else if (strcmp(m->hp.arch_name, "qwen2") == 0) {
        m->hp.arch = QI_ARCH_QWEN2;
        st = load_llama(m, err);
    } else if (strcmp(m->hp.arch_name, "opt") == 0) {
        m->hp.arch = QI_ARCH_OPT;
        st = load_opt_falcon(m, err);
    } else if (strcmp(m->hp.arch_name, "falcon") == 0) {
        m->hp.arch = QI_ARCH_FALCON;
        st = load_opt_falcon(m, err);
    } else {
        st = QI_ERR(err, QI_ERR_UNSUPPORTED,
                    "%s: architecture '%s' is not supported (supported: llama, gemma3, qwen2; opt, falcon simulated only)",
                    qi_gguf_path(g), m->hp.arch_name);
    }
    if (st) goto fail;

    if ((st = qi_tokenizer_create(g, &m->tok, err))) {
        qi_err_prefix(err, "%s", qi_gguf_path(g));
        goto fail;
    }
    if (qi_tokenizer_n_vocab(m->tok) != m->hp.n_vocab) {
        st = QI_ERR(err, QI_ERR_FORMAT, "%s: tokenizer has %d tokens but the embedding has %d rows",
                    qi_gguf_path(g), qi_tokenizer_n_vocab(m->tok), m->hp.n_vocab);
        goto fail;
    }
    qi_str tmpl;
    if (qi_gguf_get_str(g, "tokenizer.chat_template", &tmpl)) {
        m->chat_template = qi_malloc(tmpl.len + 1);
        if (!m->chat_template) {
            st = QI_ERR(err, QI_ERR_NOMEM, "out of memory");
            goto fail;
        }
        memcpy(m->chat_template, tmpl.ptr, tmpl.len);
        m->chat_template[tmpl.len] = 0;
    }
    count_params(m);
    *out = m;
    return QI_OK;
fail:
    qi_model_free(m);
    return st;
}

qi_status qi_model_load(const char *path, qi_model **out, qi_err *err) {
    qi_gguf *g;
    *out = NULL;
    qi_status st = qi_gguf_open(path, &g, err);
    if (st) return st;
    return qi_model_from_gguf(g, out, err);
}

int qi_model_n_matrices(const qi_model *m) { return (qi_ffn_gate_free(m->hp.ffn_act) ? 6 : 7) * m->hp.n_layer + 1; }

/* The packed order's types, or q4_K and q6_K where the kernels in use hold
 * them in the AMX tiles' form (gemm_wide_packed). */
static int packable(uint32_t type) {
    return qi_k_pack_supported(type) || (type < QI_TYPE_COUNT && qi_kernels_get()->gemm_wide_packed[type]);
}

int qi_model_n_packable(const qi_model *m) {
    int n = packable(m->output.type);
    for (int l = 0; l < m->hp.n_layer; l++) {
        const qi_layer *L = &m->layers[l];
        const qi_weight *ws[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++) n += packable(ws[i]->type);
    }
    return n;
}

void qi_model_release_rows(const qi_model *m, const qi_weight *w) {
    if (!w->data || !qi_gguf_mapped(m->gguf) || qi_gguf_shapes_only(m->gguf)) return;
    const long pg = sysconf(_SC_PAGESIZE);
    if (pg <= 0) return;
    const uintptr_t p = (uintptr_t)w->data, len = (uintptr_t)(w->row_bytes * (uint64_t)w->n_rows);
    const uintptr_t lo = (p + (uintptr_t)pg - 1) & ~(uintptr_t)(pg - 1);
    const uintptr_t hi = (p + len) & ~(uintptr_t)(pg - 1);
    if (hi > lo) (void)madvise((void *)lo, hi - lo, MADV_DONTNEED);
}

void qi_model_free(qi_model *m) {
    if (!m) return;
    qi_tokenizer_free(m->tok);
    qi_free(m->layers);
    qi_free(m->chat_template);
    qi_gguf_close(m->gguf);
    qi_free(m);
}

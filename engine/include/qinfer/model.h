/* model.h - a loaded model (hyper-parameters, weight views, tokenizer) and
 * the single-sequence evaluation context.
 *
 * Everything about a model is read from its GGUF metadata; nothing is
 * hard-coded per model. Weights stay in the read-only mapping of the file and
 * are viewed in place.
 */
#ifndef QINFER_MODEL_H
#define QINFER_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "qinfer/gguf.h"
#include "qinfer/params.h"
#include "qinfer/status.h"
#include "qinfer/tokenizer.h"

/* OPT and Falcon run on simulated devices only (engine/backend/sim/): their
 * LayerNorm, gate-free FFN, learned positions and biases have no kernels on
 * the real devices, and the engine refuses them there. */
typedef enum {
    QI_ARCH_LLAMA = 0,
    QI_ARCH_GEMMA3 = 1,
    QI_ARCH_OPT = 2,
    QI_ARCH_FALCON = 3,
    QI_ARCH_QWEN2 = 4, /* llama's decoder with q, k, v biases and NEOX RoPE */
} qi_arch;

typedef enum {
    QI_FFN_SWIGLU = 0,     /* silu(gate) * up (llama) */
    QI_FFN_GEGLU_TANH = 1, /* gelu_tanh(gate) * up (gemma) */
    QI_FFN_RELU = 2,       /* relu(up), no gate (opt) */
    QI_FFN_GELU = 3        /* gelu(up), no gate (falcon) */
} qi_ffn_act;

/* The FFN has no gate matrix: down(act(up(x))). */
static inline bool qi_ffn_gate_free(qi_ffn_act a) { return a == QI_FFN_RELU || a == QI_FFN_GELU; }

typedef enum {
    QI_ROPE_NORM = 0, /* rotate adjacent pairs (x[2i], x[2i+1]) */
    QI_ROPE_NEOX = 1, /* rotate halves (x[i], x[i + n_rot/2]) */
} qi_rope_mode;

typedef struct {
    qi_arch arch;
    char arch_name[32];
    int n_vocab;
    int n_embd;    /* model width */
    int n_layer;   /* L */
    int n_head;    /* H: query heads */
    int n_head_kv; /* Hkv */
    int head_dim;  /* D */
    int n_ff;      /* FFN hidden width */
    int n_ctx_train;
    int n_rot;         /* rotated dims per head; 0: no RoPE (opt's learned positions) */
    float rope_base;   /* theta base */
    float rope_freq_scale; /* 1 / linear scaling factor */
    qi_rope_mode rope_mode;
    float rms_eps;     /* the norms' epsilon (RMSNorm, or LayerNorm with layer_norm) */
    bool layer_norm;   /* norms are LayerNorm (mean removed) with a bias (opt, falcon), not RMSNorm */
    bool parallel;     /* attention and MLP both read the layer's input, and both outputs are
                          added to it (falcon); else the MLP reads the attention's result */
    bool tied_output; /* output projection is the token embedding */
    qi_ffn_act ffn_act;
    float embd_scale;     /* token embeddings are multiplied by it (gemma: sqrt(n_embd)); 1: none */
    float q_scale;        /* queries are multiplied by it after RoPE, and the softmax scale is 1
                             (gemma); 0: softmax scale 1/sqrt(D), as llama */
    float logit_softcap;  /* > 0: logits = cap * tanh(logits / cap) */
    /* Sliding-window attention: layers with qi_layer.swa set see only the
     * last n_swa positions and rotate with rope_base_swa. n_swa 0: none. */
    int n_swa;
    float rope_base_swa;
} qi_hparams;

/* A 2-D weight view: n_rows rows of n_cols elements of `type`, contiguous. */
typedef struct {
    uint32_t type;
    int64_t n_cols; /* ne[0] */
    int64_t n_rows; /* ne[1] */
    uint64_t row_bytes;
    const void *data;
    /* NULL in the model; in a device's copy, the same rows packed in
     * groups of 16 when the device prepared them so (the CPU backend with
     * QI_CPU_REPACK, engine/backend/backend.h), its matmuls then running
     * in the packed order. */
    const void *packed;
    uint64_t packed_group_bytes;
} qi_weight;

typedef struct {
    qi_weight attn_norm;          /* [n_embd] f32 */
    qi_weight wq, wk, wv, wo;     /* wq: [n_embd -> H*D], wk/wv: [n_embd -> Hkv*D], wo: [H*D -> n_embd] */
    qi_weight ffn_norm;           /* [n_embd] */
    qi_weight w_gate, w_up;       /* [n_embd -> n_ff] */
    qi_weight w_down;             /* [n_ff -> n_embd] */
    /* gemma3 only (data NULL otherwise): */
    qi_weight q_norm, k_norm;     /* [D] f32, RMSNorm of each query / key head before RoPE */
    qi_weight attn_post_norm;     /* [n_embd], on the attention output before the residual add */
    qi_weight ffn_post_norm;      /* [n_embd], on the FFN output before the residual add */
    bool swa;                     /* sliding-window (local) layer */
    /* opt and falcon only (data NULL otherwise): the LayerNorms' biases, [n_embd]
     * f32; opt's matmul biases, f32 vectors of each matrix's n_rows. Falcon's
     * ffn_norm is its ln_mlp, the second LayerNorm of the parallel block.
     * bq, bk, bv also where a llama-family file has them (qwen2: every
     * layer; llama.cpp takes them from any llama, gemma3 or qwen2 file). */
    qi_weight attn_norm_b, ffn_norm_b;
    qi_weight bq, bk, bv, bo, b_up, b_down;
} qi_layer;

typedef struct qi_model {
    qi_gguf *gguf;
    qi_hparams hp;
    qi_tokenizer *tok;
    qi_weight tok_embd; /* [n_embd x n_vocab] */
    qi_weight pos_embd; /* [n_embd x n_ctx_train] learned positions, added to the token's (opt; data NULL otherwise) */
    qi_weight out_norm; /* [n_embd] */
    qi_weight out_norm_b; /* its bias (opt, falcon; data NULL otherwise) */
    qi_weight output;   /* [n_embd -> n_vocab]; == tok_embd when tied */
    qi_layer *layers;   /* [n_layer] */
    char *chat_template; /* NULL if the file has none */
    uint64_t n_params;
    uint64_t weight_bytes;
} qi_model;

/* Load a model from a GGUF file. Messages name the file and the problem
 * (missing tensor, wrong shape, unsupported architecture or tensor type). */
qi_status qi_model_load(const char *path, qi_model **out, qi_err *err);
/* Same over an already-open GGUF; takes ownership of g (closed by
 * qi_model_free, or on failure). */
qi_status qi_model_from_gguf(qi_gguf *g, qi_model **out, qi_err *err);
void qi_model_free(qi_model *m);

/* The matrices a forward pass multiplies by: seven per layer (six without
 * an FFN gate) and the output head. */
int qi_model_n_matrices(const qi_model *m);
/* How many of them have a packed form (q4_0, q4_1, q5_0, q5_1, q8_0; q4_K
 * and q6_K where the CPU's kernels are the AMX ones): those a CPU repacks
 * with the engine's repack option. */
int qi_model_n_packable(const qi_model *m);
/* Give back the resident pages of w's rows in the model file's mapping (a
 * later read faults them in again from the file): for a device that holds
 * its own form of w and no longer reads the rows. Nothing for a model not
 * mapped from a file. */
void qi_model_release_rows(const qi_model *m, const qi_weight *w);

/* ---- Evaluation context: one sequence ----------------------------------- *
 * A facade over the batched engine (engine.h): an engine of one sequence
 * under the full policy, prompts in chunks of QI_ENGINE_CHUNK tokens, so it
 * runs the one forward path every other command runs. */

typedef struct qi_ctx qi_ctx;

typedef struct {
    int n_ctx;      /* maximum positions */
    int n_threads;  /* >= 1 */
    bool attn_blas; /* prompts' attention (2+ tokens per eval) through OpenBLAS sgemm: faster,
                     * but not bit-identical to llama.cpp; needs libopenblas0 at run time */
    bool repack;    /* the engine's repack (engine.h): packed matrices, not llama.cpp's order */
    const char *devices, *placement; /* the engine's (engine.h); NULL: cpu, all-cpu */
    const char *sim;                 /* the engine's (engine.h): a simulated machine's profile; NULL: real */
    const qi_params *sim_params;     /* its efficiencies and noise (engine.h); NULL: defaults */
    const char *sim_cal;             /* a calibration file under sim_params (engine.h); NULL: none */
    bool profile;                    /* the engine's op timing (engine.h; read through qi_ctx_engine) */
} qi_ctx_opts;

/* Fails (QI_ERR_UNSUPPORTED) with attn_blas when OpenBLAS cannot be loaded. */
qi_status qi_ctx_create_opts(const qi_model *m, const qi_ctx_opts *o, qi_ctx **out, qi_err *err);
/* The same with attn_blas off. */
qi_status qi_ctx_create(const qi_model *m, int n_ctx, int n_threads, qi_ctx **out, qi_err *err);
void qi_ctx_free(qi_ctx *c);
int qi_ctx_n_ctx(const qi_ctx *c);
int qi_ctx_n_past(const qi_ctx *c);
void qi_ctx_reset(qi_ctx *c); /* forget the sequence */
/* Its engine's clock (qi_engine_now): seconds, simulated with opts.sim. */
double qi_ctx_now(const qi_ctx *c);
/* Its engine (engine.h), for the engine's profile and devices. */
struct qi_engine *qi_ctx_engine(const qi_ctx *c);

/* Run n tokens at positions n_past..n_past+n-1 (a prompt chunk or one decode
 * step). With logits_all, logits for every token are kept (for perplexity);
 * otherwise only the last token's. Fails if the context would overflow;
 * a failure inside the step (out of memory for KV blocks) leaves the
 * context reset (empty). */
qi_status qi_ctx_eval(qi_ctx *c, const int32_t *tokens, int n, bool logits_all, qi_err *err);
/* Logits of the i-th token of the last eval (i = -1: the last one). [n_vocab] */
const float *qi_ctx_logits(const qi_ctx *c, int i);

#endif

/* perplexity.h - accuracy measurements over a model: perplexity as llama-perplexity
 * computes it. */
#ifndef QINFER_PERPLEXITY_H
#define QINFER_PERPLEXITY_H

#include <stddef.h>
#include <stdint.h>

#include "qinfer/engine.h"
#include "qinfer/model.h"

typedef struct {
    double ppl;     /* exp(mean NLL) */
    double ppl_err; /* ppl * sqrt(var(NLL) / (count - 1)) */
    double nll;     /* mean NLL */
    long count;     /* scored tokens */
    int n_chunks;
} qi_ppl_result;

/* Called after each chunk with the running estimate. */
typedef void (*qi_ppl_progress)(void *ud, int done, int total, double ppl_so_far);

/* Perplexity of ids[0..n_ids) (tokenised with BOS if the model adds one):
 * non-overlapping chunks of n_ctx tokens, at most n_ids / n_ctx of them (and
 * at most max_chunks if > 0); each chunk runs in a fresh context with its
 * first token replaced by BOS (when the model adds BOS) and is scored on
 * positions n_ctx/2 .. n_ctx-2 predicting the next token. c must hold n_ctx
 * positions. Needs n_ids >= 2 * n_ctx. */
qi_status qi_perplexity(const qi_model *m, qi_ctx *c, const int32_t *ids, size_t n_ids, int n_ctx,
                        int max_chunks, qi_ppl_progress cb, void *ud, qi_ppl_result *out, qi_err *err);

/* The same chunks, scored the same way, through the batched engine e: one
 * sequence per chunk, up to `batch` chunks at once. Without decode each
 * chunk is fed whole (logits for every token), which with the full policy
 * gives qi_perplexity's figure exactly. With decode the chunk is fed one
 * token per step, so that e's KV policy evicts at every step as it would
 * while generating; with the full policy that figure is close to
 * qi_perplexity's but not bit-equal, since one-token steps take llama.cpp's
 * one-token order for the attention dots. e must hold n_ctx positions and
 * `batch` sequences, and have none in use. kv (may be NULL) receives the
 * working and offloaded KV tokens per sequence, averaged over the scored
 * positions. */
typedef struct {
    double work_tokens, off_tokens;
    double attn_tokens; /* read by attention (qi_engine_kv_seq's attn_tokens) */
} qi_ppl_kv;
qi_status qi_perplexity_engine(const qi_model *m, qi_engine *e, const int32_t *ids, size_t n_ids, int n_ctx,
                               int max_chunks, int batch, bool decode, qi_ppl_progress cb, void *ud,
                               qi_ppl_result *out, qi_ppl_kv *kv, qi_err *err);

/* log softmax(logits)[tok], summing in double. */
double qi_log_prob(const float *logits, int n_vocab, int tok);

#endif

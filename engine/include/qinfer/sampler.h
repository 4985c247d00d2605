/* sampler.h - next-token sampling: greedy, temperature, top-k, top-p, min-p,
 * repetition penalty, with a seeded RNG (same seed, same logits -> same
 * tokens on every machine).
 *
 * The chain runs in llama.cpp's default order: repetition penalty, top-k,
 * top-p, min-p, temperature, then a draw. temp <= 0 means greedy (argmax of
 * the penalised logits; the lowest id wins a tie).
 */
#ifndef QINFER_SAMPLER_H
#define QINFER_SAMPLER_H

#include <stdint.h>

#include "qinfer/status.h"

typedef struct {
    float temp;           /* <= 0: greedy */
    int top_k;            /* <= 0: off */
    float top_p;          /* >= 1: off */
    float min_p;          /* <= 0: off */
    float repeat_penalty; /* 1: off */
    int repeat_last_n;    /* how many recent tokens the penalty looks at */
    uint64_t seed;
} qi_sampler_params;

/* temp 0.8, top_k 40, top_p 0.95, min_p 0.05, repeat_penalty 1.0 (off),
 * repeat_last_n 64, seed 42. */
qi_sampler_params qi_sampler_defaults(void);

typedef struct qi_sampler qi_sampler;

/* Validates the parameters (message names the bad one). */
qi_status qi_sampler_create(const qi_sampler_params *p, int n_vocab, qi_sampler **out, qi_err *err);
void qi_sampler_free(qi_sampler *s);
/* Record a token of the sequence (prompt or generated) for the penalty. */
void qi_sampler_accept(qi_sampler *s, int32_t token);
/* Choose the next token from raw logits [n_vocab] (not modified). */
int32_t qi_sampler_sample(qi_sampler *s, const float *logits);
/* Index of the largest value (lowest index on ties). */
int32_t qi_argmax(const float *x, int n);

#endif

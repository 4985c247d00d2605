/* workload.h - the requests a serving scenario offers the engine: when each
 * arrives, how long its prompt is and how many tokens it asks for, and
 * where in the evaluation corpus its prompt is taken from.
 *
 * Two kinds, as serving benchmarks use them:
 *   offline  every request at time 0: the throughput scenario;
 *   online   a Poisson process of a given rate (exponential gaps between
 *            arrivals), or a trace file replayed as it was recorded.
 * Lengths are fixed or drawn from a distribution; every draw comes from one
 * seeded generator (xoshiro256**), so a seed and the options give the same
 * workload on every machine.
 */
#ifndef QINFER_WORKLOAD_H
#define QINFER_WORKLOAD_H

#include <stdint.h>

#include "qinfer/status.h"

/* A length distribution, parsed from a spec:
 *   "N" or "fixed:N"           always N
 *   "uniform:A-B"              an integer in A..B, each equally likely
 *   "exp:MEAN"                 exponential of that mean, rounded up (>= 1)
 *   "lognormal:MEDIAN,SIGMA"   exp(ln MEDIAN + SIGMA z), rounded (>= 1): the
 *                              long tail of chat prompts and answers
 * Every draw is clamped to 1..QI_WORKLOAD_MAX_LEN. */
#define QI_WORKLOAD_MAX_LEN (1 << 20)
typedef enum { QI_LEN_FIXED = 0, QI_LEN_UNIFORM, QI_LEN_EXP, QI_LEN_LOGNORMAL } qi_len_kind;
typedef struct {
    qi_len_kind kind;
    double a, b; /* fixed: a; uniform: a..b; exp: mean a; lognormal: median a, sigma b */
} qi_len_dist;

/* Parses spec; QI_ERR_INVALID naming what is wrong. */
qi_status qi_len_dist_parse(const char *spec, qi_len_dist *out, qi_err *err);

typedef struct {
    double arrival_s; /* seconds after the workload starts */
    int n_prompt;     /* prompt tokens */
    int n_out;        /* output tokens asked for */
    long prompt_at;   /* the prompt is corpus tokens [prompt_at, prompt_at + n_prompt); 0 without a corpus */
} qi_work_request;

typedef struct {
    qi_work_request *req; /* [n], by arrival (ties keep their order) */
    long n;
} qi_workload;

typedef struct {
    long n_requests;       /* >= 1 */
    double rate;           /* online: requests per second (> 0); 0: offline, all at time 0 */
    qi_len_dist prompt_len, output_len;
    uint64_t seed;
    long corpus_tokens;    /* prompts are windows of a corpus this long (0: no corpus); a prompt
                            * longer than the corpus is an error */
} qi_workload_opts;

/* A generated workload: arrivals (Poisson at opts->rate, or all at 0), each
 * request's lengths, then its place in the corpus, in that order of draws.
 * Errors: QI_ERR_INVALID (no requests, a negative or non-finite rate, a
 * prompt longer than the corpus), QI_ERR_NOMEM. */
qi_status qi_workload_generate(const qi_workload_opts *o, qi_workload **out, qi_err *err);

/* A recorded workload: a text file of one request per line, "ARRIVAL_S
 * PROMPT_TOKENS OUTPUT_TOKENS" (spaces, tabs or commas between; '#' starts a
 * comment; a first line that is not numbers is a header and skipped).
 * Arrivals must not decrease and lengths must be 1..QI_WORKLOAD_MAX_LEN.
 * Places in the corpus are drawn with seed, as generated ones are. Errors:
 * QI_ERR_IO (cannot read), QI_ERR_FORMAT naming file:line, QI_ERR_INVALID
 * (an empty trace; a prompt longer than the corpus), QI_ERR_NOMEM. */
qi_status qi_workload_trace(const char *path, long corpus_tokens, uint64_t seed, qi_workload **out, qi_err *err);

void qi_workload_free(qi_workload *w); /* NULL is a no-op */

/* The seeded generator the workloads draw from, for callers that draw more
 * alike: xoshiro256** seeded through splitmix64. */
typedef struct {
    uint64_t s[4];
} qi_rng;
void qi_rng_seed(qi_rng *r, uint64_t seed);
uint64_t qi_rng_next(qi_rng *r);
double qi_rng_uniform(qi_rng *r); /* in [0, 1), 53 bits */
int qi_len_draw(const qi_len_dist *d, qi_rng *r);

#endif

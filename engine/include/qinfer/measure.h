/* measure.h - what a step, a request and a run measure: the one definition
 * of every latency and throughput figure the CLI, the Lua API and the
 * results database report (names, units and definitions: results/README.md).
 *
 * A request's timeline is the times, on one monotonic clock in seconds, at
 * which it arrived, was first scheduled, and produced each output token.
 * Everything else is derived from it here:
 *
 *   TTFT   first token - arrival
 *   e2e    last token - arrival
 *   TPOT   (e2e - TTFT) / (output tokens - 1); undefined with fewer than 2
 *   ITL    each gap between consecutive output tokens
 *   queue  first scheduled - arrival
 *
 * A run's figures summarise its requests' (mean, median, p90, p99; the
 * percentiles interpolate linearly between closest ranks, numpy's default)
 * and divide counts by its duration, first arrival to last token: request
 * throughput, output-token throughput, and goodput, the requests per second
 * that met every latency bound (SLO) given.
 *
 * The decode rate of a batch (bench's tg<N> @ b<B> rows, Lua's
 * qinfer.throughput) is qi_measure_decode: B sequences, their prompts, then N
 * engine steps of one token each; tokens_per_s = B * N / (seconds of the N
 * steps). Both callers run this function, so they cannot define it apart.
 * A run's figures are likewise qi_measure_run's whoever reports them: Lua's
 * qinfer.serve and qinfer.measure_requests, qinfer serve's /metrics, qinfer
 * load. tests/cli/test_throughput.sh holds bench, Lua and the server to
 * these definitions on one workload.
 */
#ifndef QINFER_MEASURE_H
#define QINFER_MEASURE_H

#include <stdbool.h>
#include <stdint.h>

#include "qinfer/engine.h"
#include "qinfer/model.h"
#include "qinfer/status.h"

/* Seconds on a monotonic clock: the clock of every figure above. For tests,
 * the environment variable QINFER_FAKE_CLOCK=TICK (seconds, > 0) makes it a
 * counter that advances by TICK on every read, so a measured figure depends
 * only on how many reads its definition spans. Read once, at the first call. */
double qi_measure_now(void);

/* One request. token_t is borrowed; n_out may be 0 (nothing produced). */
typedef struct {
    double arrival;        /* when it arrived (entered the queue) */
    double start;          /* when a step first ran its prompt; NAN: never scheduled */
    const double *token_t; /* [n_out] when each output token was sampled, non-decreasing */
    int n_prompt, n_out;
    bool rejected;         /* refused (admission, preemption limit, cancel): not counted as done */
} qi_request_timeline;

/* A request's figures; NAN where undefined (no token; TPOT with < 2). */
typedef struct {
    double ttft_s, tpot_s, e2e_s, queue_s;
} qi_request_metrics;

/* Fills out from r. QI_ERR_INVALID when the timeline is not one: a token
 * before its arrival or before the one preceding it, negative counts. */
qi_status qi_measure_request(const qi_request_timeline *r, qi_request_metrics *out, qi_err *err);

/* A distribution; every field NAN (n 0) over no values. */
typedef struct {
    long n;
    double mean, median, p90, p99, min, max;
} qi_measure_summary;

/* Summarises v[0..n) (reordered in place: sorted). NANs are ignored. */
void qi_measure_summarize(double *v, long n, qi_measure_summary *out);
/* The p-th percentile (0..100) of sorted[0..n), linear between closest ranks. */
double qi_measure_percentile(const double *sorted, long n, double p);

/* Latency bounds a request must meet to count towards goodput; 0: none. A
 * request with one output token has no TPOT and meets any TPOT bound. */
typedef struct {
    double ttft_s, tpot_s;
} qi_slo;

typedef struct {
    long n_requests, n_done, n_rejected, n_good;
    long prompt_tokens, output_tokens; /* over the requests done */
    double duration_s;                 /* first arrival to last token (0 with none) */
    double requests_per_s;             /* done / duration */
    double output_tokens_per_s;        /* output tokens / duration */
    double total_tokens_per_s;         /* (prompt + output tokens) / duration */
    double goodput_req_per_s;          /* done meeting slo / duration */
    qi_measure_summary ttft, tpot, itl, e2e, queue; /* over the requests done (itl: every gap) */
} qi_run_metrics;

/* A run's figures from its n requests; slo may be NULL (every request done
 * is good). Errors: an invalid timeline (naming its index), out of memory. */
qi_status qi_measure_run(const qi_request_timeline *r, long n, const qi_slo *slo, qi_run_metrics *out, qi_err *err);

/* The run's figures under their results-database names (results/README.md):
 * for i = 0, 1, ... sets *name, *unit and *value and returns true, false past
 * the last. Summaries over no values (a run without two-token requests has
 * no TPOT) are skipped: true with *name NULL. */
bool qi_measure_run_metric(const qi_run_metrics *r, int i, const char **name, const char **unit, double *value);

/* ---- the batched decode rate ---------------------------------------------------- */

typedef struct {
    int batch;              /* sequences, 1..the engine's max_seqs */
    int n_gen;              /* timed steps, >= 1 */
    const int32_t *prompts; /* the prompt of sequence b at prompts + b * prompt_stride */
    int n_prompt;           /* >= 1 */
    int prompt_stride;      /* 0: one prompt shared by every sequence */
    bool greedy;            /* each step feeds the argmax of the last logits; else a pseudo-random id */
    uint64_t seed;          /* of the pseudo-random ids (not greedy) */
    /* Optional (NULL: none): called before the prompts are fed (context
     * n_prompt, untimed) and before every timed step (timed: what it
     * does, a re-plan moving weights, is part of the run) with the
     * workload from then on: batch sequences at context tokens, left
     * steps to go. A placement controller re-plans there
     * (qi_placement_ctl_tick); a failure ends the measurement. */
    qi_status (*tick)(void *ctx, qi_engine *e, int batch, int context, int left, qi_err *err);
    void *tick_ctx;
    /* Under the engine's opts.sparsity: the timed steps alternate between
     * the sparse path and the dense one (qi_engine_sparsity_pause) in
     * pairs, sparse then dense, then dense then sparse, and so on (the
     * order turned each pair, so neither side is always the later, longer
     * context), both sides in the same engine, cache and threads. The
     * result's ab fields then hold each side's time and, into ab_ratio
     * (room for n_gen / 2, or NULL), each pair's sparse / dense step
     * time: a comparison that the machine's drift over seconds does not
     * blur. */
    bool ab_dense;
    double *ab_ratio;
} qi_decode_opts;

typedef struct {
    double prefill_s;   /* the prompts of every sequence, until each one's first token is known */
    double decode_s;    /* the n_gen steps */
    double tpot_s;      /* decode_s / n_gen: a step's mean, a token of each sequence */
    double tokens_per_s;     /* batch * n_gen / decode_s (aggregate) */
    double seq_tokens_per_s; /* n_gen / decode_s (each sequence's) */
    double itl_max_s;   /* the longest step */
    qi_engine_prof prof; /* the engine's profile over the n_gen steps alone (zero unless it profiles) */
    /* ab_dense: the seconds of the sparse and of the dense steps, their
     * counts, and the pairs (ratios written to ab_ratio) */
    double ab_s[2];
    int ab_steps[2], ab_pairs;
} qi_decode_result;

/* Adds o->batch sequences to e, runs their prompts (timed as prefill_s),
 * then n_gen steps of one token per sequence (timed one by one), and removes
 * them again, on failure too. Other sequences of e would share the steps,
 * so callers give it an engine of its own. Errors: the engine's; a step that
 * did not run one token per sequence (QI_ERR_BACKEND). */
qi_status qi_measure_decode(qi_engine *e, const qi_model *m, const qi_decode_opts *o, qi_decode_result *out,
                            qi_err *err);

/* The aggregate decode rate: tokens over the seconds of the steps that made
 * them (INFINITY for 0 seconds). */
double qi_measure_rate(double tokens, double seconds);

#endif

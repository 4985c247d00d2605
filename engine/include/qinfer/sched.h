/* sched.h - serving a workload: requests arrive on the clock, wait in a
 * queue, are admitted to the batched engine under limits, decode, and are
 * preempted when KV memory runs out. Every request ends either done (all
 * its output tokens) or rejected with the reason; nothing is lost.
 *
 * Continuous batching: each engine step runs every admitted request (a
 * decode token each, prompt chunks as the engine's step allows), and after
 * every step finished requests leave and waiting ones are admitted, so the
 * batch changes from step to step. Admission control, checked before each
 * step in arrival order (first come, first served):
 *   max_batch         requests admitted at once;
 *   max_step_tokens   tokens one step runs (decodes plus prompt tokens); a
 *                     request whose prompt would pass it waits, unless
 *                     nothing else runs;
 *   kv_budget_bytes   KV memory the admitted requests may hold: a request
 *                     is admitted only when its prompt's blocks fit beside
 *                     what is held and what the running requests' next
 *                     tokens need.
 * Preemption: when the running requests' next tokens would pass the KV
 * budget, the one admitted last is preempted and goes back to the head of
 * the queue, by one of two policies (opts.preempt):
 *   recompute  its sequence is removed (its blocks freed), and it runs
 *              again with its prompt and the tokens it produced as the new
 *              prompt (greedy decoding recomputes the same cache);
 *   swap       its working KV moves to the offload tier (host memory,
 *              qi_engine_seq_swap_out) and comes back when it is admitted
 *              again, with nothing recomputed. The swapped request keeps
 *              its engine sequence, so swapping needs an engine with more
 *              sequences than max_batch: at most (engine sequences -
 *              max_batch) requests are swapped out at once, and a
 *              preemption past that, of a request with no token pending,
 *              or whose swap the engine refuses (the pool's cap, a split
 *              attention), is a recompute. The budget counts the running
 *              requests' KV, not the swapped-out ones' offload tier.
 * Either way its output is unchanged. Preemptions are counted per request,
 * by kind; past max_preemptions it is rejected.
 *
 * Under qi_sched_run output tokens are greedy (argmax), so a run is
 * reproducible and a preempted request's text can be checked against the
 * same request alone; online (below) the caller chooses each token.
 * Times come from qi_measure_now, so a run's figures are qi_measure_run's.
 */
#ifndef QINFER_SCHED_H
#define QINFER_SCHED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "qinfer/engine.h"
#include "qinfer/measure.h"
#include "qinfer/model.h"
#include "qinfer/status.h"
#include "qinfer/workload.h"

typedef enum { QI_SCHED_RECOMPUTE = 0, QI_SCHED_SWAP } qi_sched_preempt;

/* "recompute" or "swap"; -1 for anything else. */
int qi_sched_preempt_parse(const char *name);
const char *qi_sched_preempt_name(qi_sched_preempt p);

typedef struct {
    int max_batch;          /* requests admitted at once, 1..the engine's max_seqs */
    int max_step_tokens;    /* tokens per step (decodes + prompt tokens); 0: no limit */
    size_t kv_budget_bytes; /* KV bytes the admitted requests may hold; 0: no limit */
    int queue_limit;        /* requests waiting at most; an arrival past it is rejected; 0: no limit */
    int max_preemptions;    /* a request preempted more often is rejected (default 8 when 0) */
    qi_sched_preempt preempt; /* how a request is preempted (default recompute) */
    int n_ctx;              /* the engine's positions per sequence: longer requests are rejected */
    const int32_t *corpus;  /* prompts are corpus[prompt_at ..]; NULL: seeded pseudo-random ids after BOS */
    long n_corpus;
    uint64_t seed;          /* of the pseudo-random prompts */
    qi_slo slo;             /* for goodput */
} qi_sched_opts;

#define QI_SCHED_REASON 96

/* One request's fate. token_t and tokens point into the result. */
typedef struct {
    qi_request_timeline t;   /* arrival, start, token times, n_prompt, n_out produced, rejected */
    int n_asked;             /* output tokens asked for */
    int preemptions;         /* times preempted (one past max_preemptions, which rejects it, included) */
    int swaps, recomputes;   /* those that sent it back to the queue, by kind */
    long prefill_tokens;     /* tokens its admissions fed as a prompt: its prompt, plus each recompute's */
    int32_t *tokens;         /* [n_out] the output ids */
    char reason[QI_SCHED_REASON]; /* why it was rejected; "" when done */
} qi_sched_req;

typedef struct {
    qi_sched_req *req;       /* [n], in the workload's order */
    long n;
    long n_steps, n_preemptions, n_swaps, n_recomputes;
    long prefill_tokens;     /* summed over the requests */
    size_t peak_kv_bytes;    /* the most KV memory the running requests held at once (both tiers) */
    size_t peak_swap_bytes;  /* the most the swapped-out requests held at once in the offload tier */
    qi_run_metrics run;      /* qi_measure_run over the requests, with opts.slo */
    double *times_;          /* storage */
    int32_t *tokens_;
} qi_sched_result;

/* ---- online: requests submitted as they come, tokens chosen by the caller ---------

 * The scheduler itself, for a server whose requests arrive unannounced and
 * sample with their own settings (qinfer serve): the same queue, admission
 * limits and preemption as qi_sched_run (which is built on
 * it), but the caller submits requests when they come, runs the steps, and
 * gives each ready request its next token (or ends it). The options'
 * corpus, seed and slo are not used. Ids are given in submission order from
 * 0 and never reused; a request's record lasts until qi_sched_end, which
 * every request needs (a rejected one too), and an ended or unknown id
 * reads as QI_SCHED_ENDED. */
typedef struct qi_sched qi_sched;
typedef enum { QI_SCHED_WAITING = 0, QI_SCHED_RUNNING, QI_SCHED_ENDED, QI_SCHED_REJECTED } qi_sched_state;

/* e (holding no sequences of its own) and m are borrowed and must outlive
 * the scheduler. Errors: QI_ERR_INVALID for options that cannot hold;
 * QI_ERR_NOMEM. */
qi_status qi_sched_create(qi_engine *e, const qi_model *m, const qi_sched_opts *o, qi_sched **out, qi_err *err);
/* Removes every sequence it still runs. NULL is a no-op. */
void qi_sched_free(qi_sched *s);

/* Queues a request for prompt[n_prompt] (copied), of at most max_tokens
 * output tokens; prompt_logits: every prompt position's logits are given
 * (qi_sched_logits), after a recompute too. Its id in *id. A request that
 * cannot be queued (longer than the context, the queue full) still gets an
 * id, in state QI_SCHED_REJECTED with the reason. Errors: QI_ERR_INVALID (no
 * prompt, max_tokens < 0), QI_ERR_NOMEM. */
qi_status qi_sched_submit(qi_sched *s, const int32_t *prompt, int n_prompt, int max_tokens, bool prompt_logits,
                          long *id, qi_err *err);

/* Preempts while the KV budget would be passed, admits waiting requests in
 * order while the limits allow, and runs one engine step over the admitted
 * ones. *n_tokens (may be NULL): the tokens it ran, 0 when nothing was
 * admitted. A failed engine step rejects the step's requests with its
 * message and is not an error; errors are the engine's on removing or
 * feeding a sequence, and QI_ERR_NOMEM. */
qi_status qi_sched_step(qi_sched *s, int *n_tokens, qi_err *err);

/* The first half of qi_sched_step alone: preemption and admission, no
 * engine step (a server calls it under its lock, so that the requests it
 * admits stop counting as waiting before the step's seconds). Errors as
 * qi_sched_step's. */
qi_status qi_sched_admit(qi_sched *s, qi_err *err);

/* A request's state; *reason (may be NULL) why it was rejected ("" otherwise). */
qi_sched_state qi_sched_req_state(const qi_sched *s, long id, const char **reason);
/* Times it was preempted (all kinds; by swap; by recompute); the tokens its
 * admissions fed as a prompt; when it was first admitted (qi_measure_now;
 * NAN: never). */
int qi_sched_req_preemptions(const qi_sched *s, long id);
int qi_sched_req_swaps(const qi_sched *s, long id);
int qi_sched_req_recomputes(const qi_sched *s, long id);
long qi_sched_req_prefill(const qi_sched *s, long id);
double qi_sched_req_start(const qi_sched *s, long id);
/* Whether the last step left it ready for its next token: running, its
 * input consumed, logits given. */
bool qi_sched_req_ready(const qi_sched *s, long id);
/* The rows of logits the last step gave it, and the position of the first
 * (row j is position first_pos + j; it predicts position first_pos + j + 1);
 * row -1 is the last. Valid until the next step. 0 rows / NULL when none. */
int qi_sched_n_logits(const qi_sched *s, long id, int *first_pos);
const float *qi_sched_logits(const qi_sched *s, long id, int row);
/* The caller's next token for a ready request: fed to its sequence and kept
 * (a recompute feeds it again). Errors: QI_ERR_INVALID (not ready, or past
 * max_tokens), the engine's. */
qi_status qi_sched_push(qi_sched *s, long id, int32_t tok, qi_err *err);
/* Ends a request, whatever its state (done, cancelled, rejected): its
 * sequence is removed (its KV blocks freed) or it leaves the queue, and its
 * record is freed. Unknown ids are ignored. */
void qi_sched_end(qi_sched *s, long id);
/* Requests waiting and running now. */
int qi_sched_n_waiting(const qi_sched *s);
int qi_sched_n_running(const qi_sched *s);
/* Preemptions so far (all kinds, and by swap), and the most KV memory the
 * running requests, and the swapped-out ones, held at once after a step. */
long qi_sched_n_preemptions(const qi_sched *s);
long qi_sched_n_swaps(const qi_sched *s);
size_t qi_sched_peak_kv_bytes(const qi_sched *s);
size_t qi_sched_peak_swap_bytes(const qi_sched *s);

/* ---- a whole workload -------------------------------------------------------------- */

/* Serves workload w on engine e (which must hold no sequences of its own,
 * over model m) until every request is done or rejected, waiting on the
 * clock for arrivals. Errors: QI_ERR_INVALID for options that cannot hold (a
 * batch above the engine's sequences, a corpus too short for a request);
 * QI_ERR_NOMEM. A failed engine step is not an error of the run: the
 * requests of that step are rejected with its message and the run goes on.
 * *out is NULL on failure. */
qi_status qi_sched_run(qi_engine *e, const qi_model *m, const qi_workload *w, const qi_sched_opts *o,
                       qi_sched_result **out, qi_err *err);
void qi_sched_result_free(qi_sched_result *r); /* NULL is a no-op */

#endif

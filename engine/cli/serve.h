/* serve.h - the request loop behind `qinfer serve` (private to the CLI).
 *
 * HTTP threads make a request (its prompt tokens, sampling and stop
 * settings), submit it and then wait on the server's condition variable,
 * reading its text as it grows; one engine thread hands requests to the
 * scheduler (sched.h: admission under the batch, tokens-per-step and KV
 * memory limits, preemption by recompute), runs its steps (continuous
 * batching: requests join and leave between steps), samples, and finishes
 * requests. Everything a request holds that both sides read is
 * guarded by the server's one mutex. A request is reference counted: the
 * HTTP side and the engine side each hold one reference.
 */
#ifndef QI_SERVE_H
#define QI_SERVE_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "qinfer/engine.h"
#include "qinfer/measure.h"
#include "qinfer/model.h"
#include "qinfer/sampler.h"
#include "qinfer/sched.h"
#include "qinfer/tokenizer.h"

#define QI_SERVE_MAX_STOP 4
#define QI_SERVE_MAX_TOP 5
#define QI_SERVE_WINDOW 1024 /* finished requests the run figures of /metrics span */

typedef enum { QI_SREQ_WAITING = 0, QI_SREQ_RUNNING, QI_SREQ_DONE } qi_sreq_state;
typedef enum { QI_FINISH_NONE = 0, QI_FINISH_STOP, QI_FINISH_LENGTH, QI_FINISH_CANCEL, QI_FINISH_ERROR } qi_finish;

typedef struct qi_sreq {
    struct qi_sreq *next; /* in the waiting queue */
    int refs;
    long id;
    /* set before submission, read-only afterwards */
    int32_t *prompt; /* [n_prompt] */
    int n_prompt;
    int max_tokens;
    char *stop[QI_SERVE_MAX_STOP];
    int n_stop;
    size_t max_stop;   /* longest stop string */
    int logprobs;      /* top alternatives per token, 0..QI_SERVE_MAX_TOP; -1: no logprobs */
    bool prompt_lp;    /* the prompt's logprobs too (echo) */
    qi_sampler *smp;   /* owned */
    /* state, under the server's mutex */
    qi_sreq_state state;
    qi_finish finish;
    bool cancel;       /* the client went away */
    long sid;          /* the scheduler's id once handed to it; -1 before and after */
    qi_detok dt;
    char *text;        /* generated text [n_text], NUL-terminated */
    size_t n_text, cap_text;
    size_t n_safe;     /* text that no stop string can still claim: what may be streamed */
    int n_gen;
    int32_t *out;      /* [max_tokens] generated ids */
    double *tok_t;     /* [max_tokens] when each was sampled */
    float *lp;         /* [n_prompt + max_tokens] each token's logprob (NAN: none) */
    int32_t *top_id;   /* [(n_prompt + max_tokens) * logprobs] */
    float *top_lp;
    double arrival, start;
    char error[256];
} qi_sreq;

typedef struct {
    double arrival, start;
    int n_prompt, n_out;
    double *tok_t;
} qi_serve_hist;

typedef struct {
    const qi_model *m;
    qi_engine *e;
    qi_sched *sched;         /* touched by the engine thread only */
    int n_ctx, max_queue;
    pthread_mutex_t mu;
    pthread_cond_t work;     /* the engine thread waits on it */
    pthread_cond_t progress; /* HTTP threads wait on it */
    pthread_t thread;
    bool started, stop;
    qi_sreq *head, *tail;    /* submitted, not yet handed to the scheduler, in order */
    int n_listed;
    qi_sreq **active;        /* [n_active] handed to the scheduler: waiting there or running */
    int n_active, cap_active;
    int n_waiting, n_running; /* waiting (listed or in the scheduler's queue), running */
    long n_preemptions, n_swaps;
    long next_id;
    /* counters since start */
    long n_done, n_cancelled, n_failed, n_refused, n_prompt_tokens, n_output_tokens;
    qi_serve_hist hist[QI_SERVE_WINDOW]; /* the last finished requests, a ring */
    int hist_n, hist_at;
} qi_server;

/* m and e (at least so->max_batch sequences, none added) are borrowed and
 * must outlive s; so are the scheduler's options (max_batch, n_ctx,
 * max_step_tokens, kv_budget_bytes, max_preemptions; its queue is
 * unlimited: max_queue bounds the waiting requests here). */
qi_status qi_server_init(qi_server *s, const qi_model *m, qi_engine *e, const qi_sched_opts *so, int max_queue,
                         qi_err *err);
qi_status qi_server_start(qi_server *s, qi_err *err);
/* Stops the engine thread: every request still waiting or running finishes
 * as cancelled, and later submissions are refused. Idempotent. */
void qi_server_stop(qi_server *s);
/* Stops it if need be and frees what s holds; no thread may use s after. */
void qi_server_fini(qi_server *s);

/* A request for prompt[n_prompt] (copied) of at most max_tokens: its arrays
 * sized, its sampler made (QI_ERR_INVALID naming a bad parameter). */
qi_status qi_sreq_create(const qi_server *s, const int32_t *prompt, int n_prompt, int max_tokens,
                         const qi_sampler_params *sp, int logprobs, bool prompt_lp, qi_sreq **out, qi_err *err);
/* Adds a stop string (copied); false when there are too many or no memory. */
bool qi_sreq_add_stop(qi_sreq *r, const char *stop);
/* Queues r (the caller keeps its reference). 0: queued; 1: the queue is
 * full; 2: the server is stopping. */
int qi_server_submit(qi_server *s, qi_sreq *r);
/* The caller's reference dropped; a request not finished is cancelled: a
 * waiting one leaves the queue at once, a running one's sequence is removed
 * (its KV blocks freed) at the engine's next turn. */
void qi_server_release(qi_server *s, qi_sreq *r);
/* The /metrics text (Prometheus exposition format), qi_malloc'ed; NULL when
 * out of memory. */
char *qi_server_metrics(qi_server *s);

#endif

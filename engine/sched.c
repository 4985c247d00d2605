/* sched.c - serving a workload on the batched engine (sched.h): a queue in
 * arrival order, continuous batching under admission limits, preemption by
 * recompute or by swap to the offload tier when KV memory runs out, and a
 * record of every request's fate.
 *
 * Design: the scheduler sits on the engine's public API only (sequences
 * added, fed, stepped, removed), so it needs no hook inside a step. KV
 * memory is accounted in blocks as the cache holds them: what each admitted
 * request holds now (qi_engine_kv_seq_stats) plus, for the step about to
 * run, the blocks its new tokens open (a new 64-token block in each of the
 * sequence's layer x KV-head streams when a block boundary is crossed). That
 * is an upper bound under an evicting KV policy, which can only hold less,
 * so the budget is never passed.
 *
 * Recompute or swap: recompute needs nothing from the engine but removing a
 * sequence, frees its memory at once, and gives the same output (greedy
 * decoding of the same tokens rebuilds the same cache), at the price of
 * running its prompt and its output again. Swap (qi_engine_seq_swap_out)
 * moves the sequence's working KV to the offload tier, host memory, and
 * back, whole and in slot order, so nothing is run again and the output is
 * the same bit for bit; it costs two copies of its KV and the host memory
 * meanwhile, and it keeps the engine sequence, which is why the swapped-out
 * requests are capped by the sequences the engine has beyond max_batch
 * (then admitting a new request always finds a free one). The request
 * admitted last is preempted first (it has the least work to redo, and the
 * oldest requests keep their place, as vLLM does).
 *
 * The scheduler is online (qi_sched_create, _submit, _step, _push, _end):
 * requests are submitted when they come and the caller chooses each next
 * token, which is what a server needs (qinfer serve); qi_sched_run serves a
 * whole workload through the same calls, submitting each request at its
 * arrival and taking the argmax, so a workload and a server are admitted
 * and preempted by one piece of code.
 *
 * The clock is qi_measure_now; when nothing is admitted and the next arrival
 * lies ahead, qi_sched_run sleeps until it (in slices, so a fake clock
 * advances).
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "kv.h"
#include "qinfer/sampler.h"
#include "qinfer/sched.h"
#include "qinfer/tokenizer.h"

/* One request: its prompt then the tokens it produced, in one buffer, since
 * a recompute feeds them as one prompt. */
typedef struct {
    qi_sched_state state;
    int seq;           /* engine sequence while running; -1 otherwise */
    long admitted;     /* admission order, for preemption */
    int32_t *toks;     /* [n_prompt + max_tokens] */
    int n_prompt, max_tokens, n_out;
    int preemptions, swaps, recomputes;
    long prefill;      /* tokens fed as a prompt by its admissions */
    bool swapped;      /* waiting with its sequence swapped out (seq kept) */
    bool prompt_logits;
    bool ready;        /* the last step left it ready for its next token */
    double start;
    char reason[QI_SCHED_REASON];
} sreq;

struct qi_sched {
    qi_engine *e;
    const qi_model *m;
    qi_sched_opts o;
    int max_preempt;
    size_t block, streams;
    sreq **tab;        /* [n] records of ids base .. base + n - 1; NULL once ended */
    long base, n, cap;
    long *wait;        /* waiting ids, in admission order (preempted ones at the front) */
    long n_wait, cap_wait;
    long admit_seq, n_preemptions, n_swaps;
    int n_running;
    int n_swapped, max_swapped; /* requests swapped out now, and at most */
    size_t peak_kv_bytes, peak_swap_bytes;
};

static size_t streams_of(const qi_model *m) { return (size_t)m->hp.n_layer * (size_t)m->hp.n_head_kv; }

/* Blocks a stream holding n tokens occupies (the full cache's count). */
static size_t blocks_for(long n) { return n <= 0 ? 0 : (size_t)((n + QI_KV_BLOCK - 1) / QI_KV_BLOCK); }

static sreq *rec(const qi_sched *s, long id) {
    return id >= s->base && id < s->base + s->n ? s->tab[id - s->base] : NULL;
}

static void reject(sreq *q, const char *fmt, const char *detail) {
    q->state = QI_SCHED_REJECTED;
    q->ready = false;
    snprintf(q->reason, sizeof q->reason, fmt, detail ? detail : "");
}

int qi_sched_preempt_parse(const char *name) {
    if (!strcmp(name, "recompute")) return QI_SCHED_RECOMPUTE;
    if (!strcmp(name, "swap")) return QI_SCHED_SWAP;
    return -1;
}

const char *qi_sched_preempt_name(qi_sched_preempt p) { return p == QI_SCHED_SWAP ? "swap" : "recompute"; }

static qi_status check_opts(const qi_sched_opts *o, qi_err *err) {
    if (o->max_batch < 1) return QI_ERR(err, QI_ERR_INVALID, "scheduler: max batch %d < 1", o->max_batch);
    if (o->max_step_tokens < 0 || o->queue_limit < 0 || o->max_preemptions < 0 || o->n_ctx < 1)
        return QI_ERR(err, QI_ERR_INVALID, "scheduler: a negative limit, or no context size");
    if (o->preempt != QI_SCHED_RECOMPUTE && o->preempt != QI_SCHED_SWAP)
        return QI_ERR(err, QI_ERR_INVALID, "scheduler: unknown preemption policy %d", (int)o->preempt);
    return QI_OK;
}

qi_status qi_sched_create(qi_engine *e, const qi_model *m, const qi_sched_opts *o, qi_sched **out, qi_err *err) {
    *out = NULL;
    qi_status st = check_opts(o, err);
    if (st) return st;
    qi_sched *s = qi_calloc(1, sizeof *s);
    if (!s) return QI_ERR(err, QI_ERR_NOMEM, "out of memory");
    s->e = e;
    s->m = m;
    s->o = *o;
    s->max_preempt = o->max_preemptions ? o->max_preemptions : 8;
    qi_engine_kv_pool pool;
    qi_engine_kv_pool_stats(e, &pool);
    s->block = pool.block_bytes;
    s->streams = streams_of(m);
    if (o->preempt == QI_SCHED_SWAP && qi_engine_max_seqs(e) > o->max_batch)
        s->max_swapped = qi_engine_max_seqs(e) - o->max_batch;
    *out = s;
    return QI_OK;
}

static void sreq_free(sreq *q) {
    if (!q) return;
    qi_free(q->toks);
    qi_free(q);
}

static void unwait(qi_sched *s, long id) {
    for (long k = 0; k < s->n_wait; k++)
        if (s->wait[k] == id) {
            memmove(s->wait + k, s->wait + k + 1, sizeof(long) * (size_t)(s->n_wait - k - 1));
            s->n_wait--;
            return;
        }
}

/* Its sequence removed (its blocks freed); it is no longer running, or
 * swapped out. */
static qi_status drop_seq(qi_sched *s, sreq *q, qi_err *err) {
    if (q->seq < 0) return QI_OK;
    qi_status st = qi_engine_seq_remove(s->e, q->seq, err);
    q->seq = -1;
    q->ready = false;
    if (q->swapped) {
        q->swapped = false;
        s->n_swapped--;
    } else {
        s->n_running--;
    }
    return st;
}

/* The running request q preempted by swap, when the policy, the cap on
 * swapped-out requests and the engine allow: its sequence kept, parked.
 * It must have a token pending, since a swap keeps no logits. */
static bool swap_out(qi_sched *s, sreq *q) {
    if (s->o.preempt != QI_SCHED_SWAP || s->n_swapped >= s->max_swapped || qi_engine_seq_pending(s->e, q->seq) < 1)
        return false;
    if (qi_engine_seq_swap_out(s->e, q->seq, NULL)) return false;
    q->swapped = true;
    q->ready = false;
    s->n_swapped++;
    s->n_running--;
    return true;
}

void qi_sched_end(qi_sched *s, long id) {
    sreq *q = rec(s, id);
    if (!q) return;
    if (q->state == QI_SCHED_WAITING) unwait(s, id);
    drop_seq(s, q, NULL);
    sreq_free(q);
    s->tab[id - s->base] = NULL;
    /* ended records at the front leave the table */
    long k = 0;
    while (k < s->n && !s->tab[k]) k++;
    if (k > 0 && (k == s->n || k >= 64)) {
        memmove(s->tab, s->tab + k, sizeof *s->tab * (size_t)(s->n - k));
        s->n -= k;
        s->base += k;
    }
}

void qi_sched_free(qi_sched *s) {
    if (!s) return;
    for (long k = 0; k < s->n; k++)
        if (s->tab[k]) {
            drop_seq(s, s->tab[k], NULL);
            sreq_free(s->tab[k]);
        }
    qi_free(s->tab);
    qi_free(s->wait);
    qi_free(s);
}

static bool wait_reserve(qi_sched *s) {
    if (s->n_wait < s->cap_wait) return true;
    long cap = s->cap_wait ? s->cap_wait * 2 : 16;
    long *p = qi_realloc(s->wait, sizeof(long) * (size_t)cap);
    if (!p) return false;
    s->wait = p;
    s->cap_wait = cap;
    return true;
}

static bool wait_push(qi_sched *s, long id, bool front) {
    if (!wait_reserve(s)) return false;
    if (front) {
        memmove(s->wait + 1, s->wait, sizeof(long) * (size_t)s->n_wait);
        s->wait[0] = id;
    } else {
        s->wait[s->n_wait] = id;
    }
    s->n_wait++;
    return true;
}

qi_status qi_sched_submit(qi_sched *s, const int32_t *prompt, int n_prompt, int max_tokens, bool prompt_logits,
                          long *id, qi_err *err) {
    *id = -1;
    if (n_prompt < 1 || !prompt || max_tokens < 0)
        return QI_ERR(err, QI_ERR_INVALID, "scheduler: a request of %d prompt tokens and %d output tokens", n_prompt,
                      max_tokens);
    if (s->n == s->cap) {
        long cap = s->cap ? s->cap * 2 : 64;
        sreq **t = qi_realloc(s->tab, sizeof *t * (size_t)cap);
        if (!t) return QI_ERR(err, QI_ERR_NOMEM, "out of memory");
        s->tab = t;
        s->cap = cap;
    }
    sreq *q = qi_calloc(1, sizeof *q);
    if (q) q->toks = qi_malloc(sizeof(int32_t) * ((size_t)n_prompt + (size_t)max_tokens));
    if (!q || !q->toks || !wait_reserve(s)) {
        sreq_free(q);
        return QI_ERR(err, QI_ERR_NOMEM, "out of memory");
    }
    memcpy(q->toks, prompt, sizeof(int32_t) * (size_t)n_prompt);
    q->n_prompt = n_prompt;
    q->max_tokens = max_tokens;
    q->prompt_logits = prompt_logits;
    q->seq = -1;
    q->start = NAN;
    *id = s->base + s->n;
    s->tab[s->n++] = q;
    if (n_prompt + max_tokens > s->o.n_ctx) {
        char d[80];
        snprintf(d, sizeof d, "%d + %d tokens exceed the context of %d", n_prompt, max_tokens, s->o.n_ctx);
        reject(q, "too long: %s", d);
    } else if (s->o.queue_limit && s->n_wait >= s->o.queue_limit) {
        reject(q, "queue full%s", NULL);
    } else {
        q->state = QI_SCHED_WAITING;
        wait_push(s, *id, false); /* room was reserved above */
    }
    return QI_OK;
}

qi_status qi_sched_admit(qi_sched *s, qi_err *err) {
    qi_engine *e = s->e;
    const size_t block = s->block, streams = s->streams;
    /* the running requests, and what their next tokens need */
    int step_tokens = 0;
    size_t held = 0, growth = 0;
    for (long k = 0; k < s->n; k++) {
        sreq *q = s->tab[k];
        if (!q || q->state != QI_SCHED_RUNNING) continue;
        q->ready = false;
        int pend = qi_engine_seq_pending(e, q->seq), past = qi_engine_seq_n_past(e, q->seq);
        step_tokens += pend;
        qi_engine_kv_seq ks;
        qi_engine_kv_seq_stats(e, q->seq, &ks);
        held += ks.work_bytes + ks.off_bytes;
        growth += streams * block * (blocks_for(past + pend) - blocks_for(past));
    }
    qi_status st;
    /* preempt while the next step would pass the budget */
    while (s->o.kv_budget_bytes && s->n_running > 0 && held + growth > s->o.kv_budget_bytes) {
        long victim = -1;
        for (long k = 0; k < s->n; k++) {
            sreq *q = s->tab[k];
            if (q && q->state == QI_SCHED_RUNNING && (victim < 0 || q->admitted > s->tab[victim]->admitted))
                victim = k;
        }
        sreq *q = s->tab[victim];
        int pend = qi_engine_seq_pending(e, q->seq), past = qi_engine_seq_n_past(e, q->seq);
        qi_engine_kv_seq ks;
        qi_engine_kv_seq_stats(e, q->seq, &ks);
        const bool alone = s->n_running == 1;
        if (alone) {
            /* alone and still over: it can never fit */
            if ((st = drop_seq(s, q, err))) return st;
            reject(q, "needs more KV memory than the budget%s", NULL);
        } else {
            q->preemptions++;
            s->n_preemptions++;
            if (q->preemptions > s->max_preempt) {
                if ((st = drop_seq(s, q, err))) return st;
                char d[32];
                snprintf(d, sizeof d, "%d", s->max_preempt);
                reject(q, "preempted more than %s times", d);
            } else {
                if (swap_out(s, q)) {
                    q->swaps++;
                    s->n_swaps++;
                } else {
                    if ((st = drop_seq(s, q, err))) return st;
                    q->recomputes++;
                }
                q->state = QI_SCHED_WAITING;
                if (!wait_push(s, s->base + victim, true)) return QI_ERR(err, QI_ERR_NOMEM, "out of memory");
            }
        }
        held -= ks.work_bytes + ks.off_bytes;
        growth -= streams * block * (blocks_for(past + pend) - blocks_for(past));
        step_tokens -= pend;
    }
    /* admit in queue order while the limits allow */
    while (s->n_wait > 0 && s->n_running < s->o.max_batch) {
        const long id = s->wait[0];
        sreq *q = rec(s, id);
        const int need = q->n_prompt + q->n_out;
        /* what its step runs: a swapped-out request's pending tokens, else the whole prompt */
        const int run = q->swapped ? qi_engine_seq_pending(e, q->seq) : need;
        size_t kv_need = streams * block * blocks_for(need);
        if (s->o.max_step_tokens && s->n_running > 0 && step_tokens + run > s->o.max_step_tokens) break;
        if (s->o.kv_budget_bytes && held + growth + kv_need > s->o.kv_budget_bytes) {
            if (s->n_running > 0) break;
            if ((st = drop_seq(s, q, err))) return st;
            reject(q, "needs more KV memory than the budget%s", NULL);
            unwait(s, id);
            continue;
        }
        int seq = q->seq;
        if (q->swapped) {
            q->swapped = false;
            s->n_swapped--;
            if (qi_engine_seq_swap_in(e, seq, NULL)) {
                /* the offload tier could not give it back (the pool's cap): recomputed instead */
                qi_engine_seq_remove(e, seq, NULL);
                q->seq = seq = -1;
                q->swaps--;
                s->n_swaps--;
                q->recomputes++;
            }
        }
        if (seq < 0) {
            qi_err add_err = {0};
            if (qi_engine_seq_add(e, &seq, &add_err)) {
                if (s->n_running > 0) break; /* the engine's sequences are all in use: wait */
                reject(q, "the engine refused it: %.60s", add_err.msg);
                unwait(s, id);
                continue;
            }
            if ((st = qi_engine_seq_feed(e, seq, q->toks, need, q->prompt_logits, err))) {
                qi_engine_seq_remove(e, seq, NULL);
                return st;
            }
            q->prefill += need;
        }
        unwait(s, id);
        q->state = QI_SCHED_RUNNING;
        q->seq = seq;
        q->admitted = s->admit_seq++;
        if (isnan(q->start)) q->start = qi_measure_now();
        s->n_running++;
        step_tokens += run;
        growth += kv_need;
    }
    return QI_OK;
}

qi_status qi_sched_step(qi_sched *s, int *n_tokens, qi_err *err) {
    if (n_tokens) *n_tokens = 0;
    qi_engine *e = s->e;
    const size_t block = s->block;
    qi_status st = qi_sched_admit(s, err);
    if (st || s->n_running == 0) return st;
    /* one step */
    int n_tok = 0;
    qi_err step_err = {0};
    if (qi_engine_step(e, &n_tok, &step_err)) {
        /* the step's sequences failed: their requests are rejected with the reason */
        for (long k = 0; k < s->n; k++) {
            sreq *q = s->tab[k];
            if (!q || q->state != QI_SCHED_RUNNING) continue;
            if ((st = drop_seq(s, q, err))) return st;
            reject(q, "engine step failed: %.60s", step_err.msg);
        }
        return QI_OK;
    }
    if (n_tokens) *n_tokens = n_tok;
    qi_engine_kv_pool pool;
    qi_engine_kv_pool_stats(e, &pool);
    size_t in_use = (size_t)(pool.work_blocks + pool.off_blocks) * block, swapped = 0;
    for (long k = 0; k < s->n; k++) {
        sreq *q = s->tab[k];
        if (q && q->state == QI_SCHED_RUNNING && qi_engine_seq_pending(e, q->seq) == 0 &&
            qi_engine_seq_logits(e, q->seq, -1))
            q->ready = true;
        if (q && q->swapped) {
            qi_engine_kv_seq ks;
            qi_engine_kv_seq_stats(e, q->seq, &ks);
            swapped += ks.work_bytes + ks.off_bytes;
        }
    }
    if (in_use - swapped > s->peak_kv_bytes) s->peak_kv_bytes = in_use - swapped;
    if (swapped > s->peak_swap_bytes) s->peak_swap_bytes = swapped;
    return QI_OK;
}

qi_sched_state qi_sched_req_state(const qi_sched *s, long id, const char **reason) {
    const sreq *q = rec(s, id);
    if (reason) *reason = q ? q->reason : "";
    return q ? q->state : QI_SCHED_ENDED;
}

int qi_sched_req_preemptions(const qi_sched *s, long id) {
    const sreq *q = rec(s, id);
    return q ? q->preemptions : 0;
}

int qi_sched_req_swaps(const qi_sched *s, long id) {
    const sreq *q = rec(s, id);
    return q ? q->swaps : 0;
}

int qi_sched_req_recomputes(const qi_sched *s, long id) {
    const sreq *q = rec(s, id);
    return q ? q->recomputes : 0;
}

long qi_sched_req_prefill(const qi_sched *s, long id) {
    const sreq *q = rec(s, id);
    return q ? q->prefill : 0;
}

double qi_sched_req_start(const qi_sched *s, long id) {
    const sreq *q = rec(s, id);
    return q ? q->start : NAN;
}

bool qi_sched_req_ready(const qi_sched *s, long id) {
    const sreq *q = rec(s, id);
    return q && q->ready;
}

int qi_sched_n_logits(const qi_sched *s, long id, int *first_pos) {
    const sreq *q = rec(s, id);
    if (first_pos) *first_pos = 0;
    if (!q || q->state != QI_SCHED_RUNNING) return 0;
    int n = qi_engine_seq_n_logits(s->e, q->seq);
    /* the rows are those of the last tokens the step ran */
    if (first_pos) *first_pos = qi_engine_seq_n_past(s->e, q->seq) - n;
    return n;
}

const float *qi_sched_logits(const qi_sched *s, long id, int row) {
    const sreq *q = rec(s, id);
    return q && q->state == QI_SCHED_RUNNING ? qi_engine_seq_logits(s->e, q->seq, row) : NULL;
}

qi_status qi_sched_push(qi_sched *s, long id, int32_t tok, qi_err *err) {
    sreq *q = rec(s, id);
    if (!q || !q->ready || q->n_out >= q->max_tokens)
        return QI_ERR(err, QI_ERR_INVALID, "scheduler: request %ld is not ready for a token", id);
    qi_status st = qi_engine_seq_feed(s->e, q->seq, &tok, 1, false, err);
    if (st) return st;
    q->toks[q->n_prompt + q->n_out++] = tok;
    q->ready = false;
    return QI_OK;
}

int qi_sched_n_waiting(const qi_sched *s) { return (int)s->n_wait; }
int qi_sched_n_running(const qi_sched *s) { return s->n_running; }
long qi_sched_n_preemptions(const qi_sched *s) { return s->n_preemptions; }
long qi_sched_n_swaps(const qi_sched *s) { return s->n_swaps; }
size_t qi_sched_peak_kv_bytes(const qi_sched *s) { return s->peak_kv_bytes; }
size_t qi_sched_peak_swap_bytes(const qi_sched *s) { return s->peak_swap_bytes; }

/* ---- a whole workload ------------------------------------------------------------ */

/* The prompt of request i: corpus tokens, or seeded pseudo-random ids after BOS. */
static void fill_prompt(const qi_sched_opts *o, const qi_model *m, const qi_work_request *wr, long i, int32_t *buf) {
    if (o->corpus) {
        memcpy(buf, o->corpus + wr->prompt_at, sizeof(int32_t) * (size_t)wr->n_prompt);
    } else {
        uint64_t x = (o->seed ^ 0x9E3779B97F4A7C15ull) + (uint64_t)i * 0xBF58476D1CE4E5B9ull;
        for (int k = 0; k < wr->n_prompt; k++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            buf[k] = (int32_t)(x % (uint64_t)m->hp.n_vocab);
        }
        int32_t bos = qi_tokenizer_bos(m->tok);
        if (bos >= 0) buf[0] = bos;
    }
}

static void sleep_s(double s) {
    if (s <= 0) return;
    if (s > 0.01) s = 0.01;
    struct timespec ts = {0, (long)(s * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

void qi_sched_result_free(qi_sched_result *r) {
    if (!r) return;
    qi_free(r->req);
    qi_free(r->times_);
    qi_free(r->tokens_);
    qi_free(r);
}

/* A request's fate copied out of the scheduler when it ends. */
static void take_end(qi_sched *s, long i, qi_sched_req *q, double t0) {
    const char *reason;
    if (qi_sched_req_state(s, i, &reason) == QI_SCHED_REJECTED) {
        q->t.rejected = true;
        snprintf(q->reason, sizeof q->reason, "%s", reason);
    }
    q->preemptions = qi_sched_req_preemptions(s, i);
    q->swaps = qi_sched_req_swaps(s, i);
    q->recomputes = qi_sched_req_recomputes(s, i);
    q->prefill_tokens = qi_sched_req_prefill(s, i);
    const double start = qi_sched_req_start(s, i);
    q->t.start = isnan(start) ? NAN : start - t0;
    qi_sched_end(s, i);
}

qi_status qi_sched_run(qi_engine *e, const qi_model *m, const qi_workload *w, const qi_sched_opts *o,
                       qi_sched_result **out, qi_err *err) {
    *out = NULL;
    qi_status st = check_opts(o, err);
    if (st) return st;
    size_t total_out = 0;
    int max_prompt = 1;
    for (long i = 0; i < w->n; i++) {
        const qi_work_request *wr = &w->req[i];
        if (o->corpus && (wr->prompt_at < 0 || wr->prompt_at + wr->n_prompt > o->n_corpus))
            return QI_ERR(err, QI_ERR_INVALID, "scheduler: request %ld's prompt lies outside the corpus of %ld tokens",
                          i, o->n_corpus);
        total_out += (size_t)wr->n_out;
        if (wr->n_prompt > max_prompt) max_prompt = wr->n_prompt;
    }
    qi_sched_result *r = qi_calloc(1, sizeof *r);
    bool *live = qi_calloc((size_t)(w->n ? w->n : 1), sizeof *live);
    int32_t *buf = qi_malloc(sizeof(int32_t) * (size_t)max_prompt);
    if (r) {
        r->n = w->n;
        r->req = qi_calloc((size_t)(w->n ? w->n : 1), sizeof *r->req);
        r->times_ = qi_malloc(sizeof(double) * (total_out ? total_out : 1));
        r->tokens_ = qi_malloc(sizeof(int32_t) * (total_out ? total_out : 1));
    }
    qi_sched *s = NULL;
    if (!r || !live || !buf || !r->req || !r->times_ || !r->tokens_) {
        st = QI_ERR(err, QI_ERR_NOMEM, "out of memory for %ld requests", w->n);
        goto done;
    }
    if ((st = qi_sched_create(e, m, o, &s, err))) goto done;
    size_t at = 0;
    for (long i = 0; i < w->n; i++) {
        qi_sched_req *q = &r->req[i];
        q->t.arrival = w->req[i].arrival_s;
        q->t.start = NAN;
        q->t.n_prompt = w->req[i].n_prompt;
        q->t.token_t = r->times_ + at;
        q->tokens = r->tokens_ + at;
        q->n_asked = w->req[i].n_out;
        at += (size_t)w->req[i].n_out;
    }
    const int V = m->hp.n_vocab;
    long next_arrival = 0, n_left = w->n;
    const double t0 = qi_measure_now();
    while (n_left > 0) {
        const double now = qi_measure_now() - t0;
        /* arrivals: request i is the scheduler's id i */
        while (next_arrival < w->n && r->req[next_arrival].t.arrival <= now) {
            const long i = next_arrival++;
            long id;
            fill_prompt(o, m, &w->req[i], i, buf);
            if ((st = qi_sched_submit(s, buf, w->req[i].n_prompt, w->req[i].n_out, false, &id, err))) goto done;
            live[i] = true;
        }
        int n_tok;
        if ((st = qi_sched_step(s, &n_tok, err))) goto done;
        if (n_tok > 0) r->n_steps++;
        const double t_step = qi_measure_now() - t0;
        for (long i = 0; i < next_arrival; i++) {
            if (!live[i]) continue;
            qi_sched_req *q = &r->req[i];
            const qi_sched_state ss = qi_sched_req_state(s, i, NULL);
            if (ss == QI_SCHED_REJECTED) {
                take_end(s, i, q, t0);
                live[i] = false;
                n_left--;
                continue;
            }
            if (!qi_sched_req_ready(s, i)) continue;
            const int32_t tok = qi_argmax(qi_sched_logits(s, i, -1), V);
            q->tokens[q->t.n_out] = tok;
            ((double *)q->t.token_t)[q->t.n_out] = t_step;
            q->t.n_out++;
            if (q->t.n_out == q->n_asked) {
                take_end(s, i, q, t0);
                live[i] = false;
                n_left--;
            } else if ((st = qi_sched_push(s, i, tok, err))) {
                goto done;
            }
        }
        if (n_tok == 0 && qi_sched_n_running(s) == 0 && n_left > 0 && next_arrival < w->n &&
            qi_sched_n_waiting(s) == 0)
            sleep_s(r->req[next_arrival].t.arrival - (qi_measure_now() - t0));
    }
    r->n_preemptions = qi_sched_n_preemptions(s);
    r->n_swaps = qi_sched_n_swaps(s);
    r->peak_kv_bytes = qi_sched_peak_kv_bytes(s);
    r->peak_swap_bytes = qi_sched_peak_swap_bytes(s);
    for (long i = 0; i < w->n; i++) {
        r->n_recomputes += r->req[i].recomputes;
        r->prefill_tokens += r->req[i].prefill_tokens;
    }
    {
        qi_request_timeline *tl = qi_malloc(sizeof *tl * (size_t)(w->n ? w->n : 1));
        if (!tl) {
            st = QI_ERR(err, QI_ERR_NOMEM, "out of memory");
        } else {
            for (long i = 0; i < w->n; i++) tl[i] = r->req[i].t;
            st = qi_measure_run(w->n ? tl : NULL, w->n, &o->slo, &r->run, err);
            qi_free(tl);
        }
    }
done:
    qi_sched_free(s);
    qi_free(live);
    qi_free(buf);
    if (st) {
        qi_sched_result_free(r);
        return st;
    }
    *out = r;
    return QI_OK;
}

/* sched.c - serving a workload on the batched engine (sched.h): a queue in
 * arrival order, continuous batching under admission limits, preemption by
 * recompute when KV memory runs out, and a record of every request's fate.
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
 * Why recompute and not swap: recompute needs nothing from the engine but
 * removing a sequence, frees its memory at once, and gives the same output
 * (greedy decoding of the same tokens rebuilds the same cache); swapping to
 * the offload tier would need the engine to move a whole sequence between
 * tiers, which it does not offer. The request admitted last is preempted
 * first (it has the least work to redo, and the oldest requests keep their
 * place, as vLLM does).
 *
 * The clock is qi_measure_now; when nothing is admitted and the next arrival
 * lies ahead, the loop sleeps until it (in slices, so a fake clock advances).
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

typedef enum { RS_FUTURE = 0, RS_WAITING, RS_RUNNING, RS_DONE, RS_REJECTED } req_state;

typedef struct {
    req_state state;
    int seq;        /* engine sequence while running; -1 otherwise */
    long admitted;  /* admission order, for preemption */
} req_run;

static size_t streams_of(const qi_model *m) { return (size_t)m->hp.n_layer * (size_t)m->hp.n_head_kv; }

/* Blocks a stream holding n tokens occupies (the full cache's count). */
static size_t blocks_for(long n) { return n <= 0 ? 0 : (size_t)((n + QI_KV_BLOCK - 1) / QI_KV_BLOCK); }

static void reject(qi_sched_req *q, req_run *rr, const char *fmt, const char *detail) {
    rr->state = RS_REJECTED;
    q->t.rejected = true;
    snprintf(q->reason, sizeof q->reason, fmt, detail ? detail : "");
}

/* The prompt of request i at (re)admission: its prompt, then the tokens it
 * produced before a preemption. */
static void fill_prompt(const qi_sched_opts *o, const qi_model *m, const qi_work_request *wr, const qi_sched_req *q,
                        long i, int32_t *buf) {
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
    memcpy(buf + wr->n_prompt, q->tokens, sizeof(int32_t) * (size_t)q->t.n_out);
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

qi_status qi_sched_run(qi_engine *e, const qi_model *m, const qi_workload *w, const qi_sched_opts *o,
                       qi_sched_result **out, qi_err *err) {
    *out = NULL;
    if (o->max_batch < 1) return QI_ERR(err, QI_ERR_INVALID, "scheduler: max batch %d < 1", o->max_batch);
    if (o->max_step_tokens < 0 || o->queue_limit < 0 || o->max_preemptions < 0 || o->n_ctx < 1)
        return QI_ERR(err, QI_ERR_INVALID, "scheduler: a negative limit, or no context size");
    size_t total_out = 0;
    int max_len = 1;
    for (long i = 0; i < w->n; i++) {
        const qi_work_request *wr = &w->req[i];
        if (o->corpus && (wr->prompt_at < 0 || wr->prompt_at + wr->n_prompt > o->n_corpus))
            return QI_ERR(err, QI_ERR_INVALID, "scheduler: request %ld's prompt lies outside the corpus of %ld tokens",
                          i, o->n_corpus);
        total_out += (size_t)wr->n_out;
        if (wr->n_prompt + wr->n_out > max_len) max_len = wr->n_prompt + wr->n_out;
    }
    const int max_preempt = o->max_preemptions ? o->max_preemptions : 8;
    qi_sched_result *r = qi_calloc(1, sizeof *r);
    req_run *rr = qi_calloc((size_t)(w->n ? w->n : 1), sizeof *rr);
    int32_t *buf = qi_malloc(sizeof(int32_t) * (size_t)max_len);
    if (r) {
        r->n = w->n;
        r->req = qi_calloc((size_t)(w->n ? w->n : 1), sizeof *r->req);
        r->times_ = qi_malloc(sizeof(double) * (total_out ? total_out : 1));
        r->tokens_ = qi_malloc(sizeof(int32_t) * (total_out ? total_out : 1));
    }
    if (!r || !rr || !buf || !r->req || !r->times_ || !r->tokens_) {
        qi_sched_result_free(r);
        qi_free(rr);
        qi_free(buf);
        return QI_ERR(err, QI_ERR_NOMEM, "out of memory for %ld requests", w->n);
    }
    size_t at = 0;
    for (long i = 0; i < w->n; i++) {
        qi_sched_req *q = &r->req[i];
        q->t.arrival = w->req[i].arrival_s;
        q->t.start = NAN;
        q->t.n_prompt = w->req[i].n_prompt;
        q->t.token_t = r->times_ + at;
        q->tokens = r->tokens_ + at;
        q->n_asked = w->req[i].n_out;
        rr[i].seq = -1;
        at += (size_t)w->req[i].n_out;
    }

    qi_engine_kv_pool pool;
    qi_engine_kv_pool_stats(e, &pool);
    const size_t block = pool.block_bytes, streams = streams_of(m);
    const int V = m->hp.n_vocab;
    qi_status st = QI_OK;
    long next_arrival = 0, n_left = w->n, n_waiting = 0, admit_seq = 0;
    const double t0 = qi_measure_now();
    /* the queue: request indices in admission order; preempted ones return to its head */
    long *queue = qi_malloc(sizeof(long) * (size_t)(w->n ? w->n : 1));
    long q_head = 0, q_len = 0;
    if (!queue) {
        st = QI_ERR(err, QI_ERR_NOMEM, "out of memory");
        goto done;
    }
    /* queue as a ring of capacity n (a request is in it at most once) */
#define Q_AT(k) queue[(q_head + (k)) % w->n]
    while (n_left > 0) {
        double now = qi_measure_now() - t0;
        /* arrivals */
        while (next_arrival < w->n && r->req[next_arrival].t.arrival <= now) {
            long i = next_arrival++;
            qi_sched_req *q = &r->req[i];
            if (q->t.n_prompt + q->n_asked > o->n_ctx) {
                char d[64];
                snprintf(d, sizeof d, "%d + %d tokens exceed the context of %d", q->t.n_prompt, q->n_asked, o->n_ctx);
                reject(q, &rr[i], "too long: %s", d);
                n_left--;
            } else if (o->queue_limit && n_waiting >= o->queue_limit) {
                reject(q, &rr[i], "queue full%s", NULL);
                n_left--;
            } else {
                rr[i].state = RS_WAITING;
                Q_AT(q_len) = i;
                q_len++;
                n_waiting++;
            }
        }
        /* the running requests, and what their next tokens need */
        int n_running = 0, step_tokens = 0;
        size_t held = 0, growth = 0;
        for (long i = 0; i < w->n; i++) {
            if (rr[i].state != RS_RUNNING) continue;
            n_running++;
            int pend = qi_engine_seq_pending(e, rr[i].seq), past = qi_engine_seq_n_past(e, rr[i].seq);
            step_tokens += pend;
            qi_engine_kv_seq ks;
            qi_engine_kv_seq_stats(e, rr[i].seq, &ks);
            held += ks.work_bytes + ks.off_bytes;
            growth += streams * block * (blocks_for(past + pend) - blocks_for(past));
        }
        /* preempt while the next step would pass the budget */
        while (o->kv_budget_bytes && n_running > 0 && held + growth > o->kv_budget_bytes) {
            long victim = -1;
            for (long i = 0; i < w->n; i++)
                if (rr[i].state == RS_RUNNING && (victim < 0 || rr[i].admitted > rr[victim].admitted)) victim = i;
            qi_sched_req *q = &r->req[victim];
            int pend = qi_engine_seq_pending(e, rr[victim].seq), past = qi_engine_seq_n_past(e, rr[victim].seq);
            qi_engine_kv_seq ks;
            qi_engine_kv_seq_stats(e, rr[victim].seq, &ks);
            if (n_running == 1) {
                /* alone and still over: it can never fit */
                reject(q, &rr[victim], "needs more KV memory than the budget%s", NULL);
                n_left--;
            } else {
                q->preemptions++;
                r->n_preemptions++;
                if (q->preemptions > max_preempt) {
                    char d[32];
                    snprintf(d, sizeof d, "%d", max_preempt);
                    reject(q, &rr[victim], "preempted more than %s times", d);
                    n_left--;
                } else {
                    rr[victim].state = RS_WAITING;
                    q_head = (q_head + w->n - 1) % w->n;
                    queue[q_head] = victim;
                    q_len++;
                    n_waiting++;
                }
            }
            if ((st = qi_engine_seq_remove(e, rr[victim].seq, err))) goto done;
            rr[victim].seq = -1;
            held -= ks.work_bytes + ks.off_bytes;
            growth -= streams * block * (blocks_for(past + pend) - blocks_for(past));
            step_tokens -= pend;
            n_running--;
        }
        /* admit in queue order while the limits allow */
        while (q_len > 0 && n_running < o->max_batch) {
            long i = Q_AT(0);
            qi_sched_req *q = &r->req[i];
            int need = q->t.n_prompt + q->t.n_out;
            size_t kv_need = streams * block * blocks_for(need);
            if (o->max_step_tokens && n_running > 0 && step_tokens + need > o->max_step_tokens) break;
            if (o->kv_budget_bytes && held + growth + kv_need > o->kv_budget_bytes) {
                if (n_running > 0) break;
                reject(q, &rr[i], "needs more KV memory than the budget%s", NULL);
                q_head = (q_head + 1) % w->n;
                q_len--;
                n_waiting--;
                n_left--;
                continue;
            }
            int seq;
            qi_err add_err = {0};
            if (qi_engine_seq_add(e, &seq, &add_err)) {
                if (n_running > 0) break; /* the engine's sequences are all in use: wait */
                reject(q, &rr[i], "the engine refused it: %.60s", add_err.msg);
                q_head = (q_head + 1) % w->n;
                q_len--;
                n_waiting--;
                n_left--;
                continue;
            }
            fill_prompt(o, m, &w->req[i], q, i, buf);
            if ((st = qi_engine_seq_feed(e, seq, buf, need, false, err))) {
                qi_engine_seq_remove(e, seq, NULL);
                goto done;
            }
            q_head = (q_head + 1) % w->n;
            q_len--;
            n_waiting--;
            rr[i].state = RS_RUNNING;
            rr[i].seq = seq;
            rr[i].admitted = admit_seq++;
            if (isnan(q->t.start)) q->t.start = qi_measure_now() - t0;
            n_running++;
            step_tokens += need;
            growth += kv_need;
        }
        if (n_running == 0) {
            if (n_left == 0) break;
            if (next_arrival < w->n) sleep_s(r->req[next_arrival].t.arrival - (qi_measure_now() - t0));
            continue;
        }
        /* one step */
        int n_tok;
        qi_err step_err = {0};
        if (qi_engine_step(e, &n_tok, &step_err)) {
            /* the step's sequences failed: their requests are rejected with the reason */
            for (long i = 0; i < w->n; i++) {
                if (rr[i].state != RS_RUNNING) continue;
                reject(&r->req[i], &rr[i], "engine step failed: %.60s", step_err.msg);
                n_left--;
                if ((st = qi_engine_seq_remove(e, rr[i].seq, err))) goto done;
                rr[i].seq = -1;
            }
            continue;
        }
        r->n_steps++;
        qi_engine_kv_pool_stats(e, &pool);
        size_t in_use = (size_t)(pool.work_blocks + pool.off_blocks) * block;
        if (in_use > r->peak_kv_bytes) r->peak_kv_bytes = in_use;
        const double t_step = qi_measure_now() - t0;
        for (long i = 0; i < w->n; i++) {
            if (rr[i].state != RS_RUNNING || qi_engine_seq_pending(e, rr[i].seq) > 0) continue;
            const float *lg = qi_engine_seq_logits(e, rr[i].seq, -1);
            if (!lg) continue; /* nothing of it ran this step */
            qi_sched_req *q = &r->req[i];
            int32_t tok = qi_argmax(lg, V);
            q->tokens[q->t.n_out] = tok;
            ((double *)q->t.token_t)[q->t.n_out] = t_step;
            q->t.n_out++;
            if (q->t.n_out == q->n_asked) {
                rr[i].state = RS_DONE;
                n_left--;
                if ((st = qi_engine_seq_remove(e, rr[i].seq, err))) goto done;
                rr[i].seq = -1;
            } else if ((st = qi_engine_seq_feed(e, rr[i].seq, &tok, 1, false, err))) {
                goto done;
            }
        }
    }
#undef Q_AT
    if (w->n == 0) st = qi_measure_run(NULL, 0, &o->slo, &r->run, err);
    else {
        qi_request_timeline *tl = qi_malloc(sizeof *tl * (size_t)w->n);
        if (!tl) {
            st = QI_ERR(err, QI_ERR_NOMEM, "out of memory");
        } else {
            for (long i = 0; i < w->n; i++) tl[i] = r->req[i].t;
            st = qi_measure_run(tl, w->n, &o->slo, &r->run, err);
            qi_free(tl);
        }
    }
done:
    for (long i = 0; i < w->n; i++)
        if (rr[i].seq >= 0) qi_engine_seq_remove(e, rr[i].seq, NULL);
    qi_free(queue);
    qi_free(rr);
    qi_free(buf);
    if (st) {
        qi_sched_result_free(r);
        return st;
    }
    *out = r;
    return QI_OK;
}

/* serve_loop.c - the engine side of `qinfer serve` (serve.h): one thread
 * that admits waiting requests into the batched engine, steps all of them at
 * once, samples each one's next token and finishes requests.
 *
 * Admission is the scheduler's (sched.h, its online calls), the same code
 * that serves workloads in experiments: first come first served up to the
 * batch, the tokens per step and the KV memory budget, and preemption by
 * recompute when the running requests' next tokens would pass the budget (a
 * preempted request waits at the head of the queue and resumes where it
 * was: its prompt and the tokens it produced are recomputed, and its
 * sampler's state is untouched). The batching is the engine's own
 * (qi_engine_step runs every admitted sequence, prompts in chunks beside
 * decodes). Past --max-queue waiting requests are refused here, before the
 * scheduler sees them.
 *
 * The scheduler and the engine are touched only by this thread, so a step
 * runs with the mutex released; HTTP threads only read a request's text and
 * state under it.
 * Times are qi_measure_now's, and /metrics reports the measurement module's
 * run figures (qi_measure_run) over the last finished requests, so the
 * server's throughput and latencies are defined as bench's and Lua's are.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve.h"

static void sreq_free(qi_sreq *r) {
    if (!r) return;
    qi_sampler_free(r->smp);
    for (int i = 0; i < r->n_stop; i++) qi_free(r->stop[i]);
    qi_free(r->prompt);
    qi_free(r->text);
    qi_free(r->out);
    qi_free(r->tok_t);
    qi_free(r->lp);
    qi_free(r->top_id);
    qi_free(r->top_lp);
    qi_free(r);
}

qi_status qi_sreq_create(const qi_server *s, const int32_t *prompt, int n_prompt, int max_tokens,
                         const qi_sampler_params *sp, int logprobs, bool prompt_lp, qi_sreq **out, qi_err *err) {
    *out = NULL;
    qi_sreq *r = qi_calloc(1, sizeof *r);
    if (!r) return QI_ERR(err, QI_ERR_NOMEM, "out of memory");
    const size_t n_pos = (size_t)n_prompt + (size_t)max_tokens;
    r->n_prompt = n_prompt;
    r->max_tokens = max_tokens;
    r->logprobs = logprobs;
    r->prompt_lp = prompt_lp;
    r->sid = -1;
    r->cap_text = 256;
    r->prompt = qi_malloc(sizeof(int32_t) * (size_t)(n_prompt ? n_prompt : 1));
    r->text = qi_malloc(r->cap_text);
    r->out = qi_malloc(sizeof(int32_t) * (size_t)(max_tokens ? max_tokens : 1));
    r->tok_t = qi_malloc(sizeof(double) * (size_t)(max_tokens ? max_tokens : 1));
    r->lp = qi_malloc(sizeof(float) * (n_pos ? n_pos : 1));
    const size_t n_top = n_pos * (size_t)(logprobs > 0 ? logprobs : 0);
    r->top_id = qi_malloc(sizeof(int32_t) * (n_top ? n_top : 1));
    r->top_lp = qi_malloc(sizeof(float) * (n_top ? n_top : 1));
    if (!r->prompt || !r->text || !r->out || !r->tok_t || !r->lp || !r->top_id || !r->top_lp) {
        sreq_free(r);
        return QI_ERR(err, QI_ERR_NOMEM, "out of memory for a request of %d + %d tokens", n_prompt, max_tokens);
    }
    memcpy(r->prompt, prompt, sizeof(int32_t) * (size_t)n_prompt);
    r->text[0] = '\0';
    for (size_t i = 0; i < n_pos; i++) r->lp[i] = NAN;
    r->start = NAN; /* until the scheduler admits it */
    qi_detok_init(&r->dt);
    if (qi_sampler_create(sp, s->m->hp.n_vocab, &r->smp, err)) {
        sreq_free(r);
        return err ? err->code : QI_ERR_INVALID;
    }
    for (int i = 0; i < n_prompt; i++) qi_sampler_accept(r->smp, prompt[i]);
    r->refs = 1;
    *out = r;
    return QI_OK;
}

bool qi_sreq_add_stop(qi_sreq *r, const char *stop) {
    if (r->n_stop >= QI_SERVE_MAX_STOP) return false;
    const size_t n = strlen(stop);
    char *c = qi_malloc(n + 1);
    if (!c) return false;
    memcpy(c, stop, n + 1);
    r->stop[r->n_stop++] = c;
    if (n > r->max_stop) r->max_stop = n;
    return true;
}

qi_status qi_server_init(qi_server *s, const qi_model *m, qi_engine *e, const qi_sched_opts *so, int max_queue,
                         qi_err *err) {
    memset(s, 0, sizeof *s);
    s->m = m;
    s->e = e;
    s->n_ctx = so->n_ctx;
    s->max_queue = max_queue;
    qi_sched_opts o = *so;
    o.queue_limit = 0;
    qi_status st = qi_sched_create(e, m, &o, &s->sched, err);
    if (st) return st;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->work, NULL);
    pthread_cond_init(&s->progress, NULL);
    return QI_OK;
}

/* ---- the engine thread ----------------------------------------------------------- */

static bool text_append(qi_sreq *r, const char *p, size_t n) {
    if (r->n_text + n + 1 > r->cap_text) {
        size_t cap = r->cap_text * 2;
        while (cap < r->n_text + n + 1) cap *= 2;
        char *t = qi_realloc(r->text, cap);
        if (!t) return false;
        r->text = t;
        r->cap_text = cap;
    }
    memcpy(r->text + r->n_text, p, n);
    r->n_text += n;
    r->text[r->n_text] = '\0';
    return true;
}

/* log-softmax of row at tok, and the n_top best ids with theirs. */
static float row_logprob(const float *row, int V, int32_t tok, int n_top, int32_t *top_id, float *top_lp) {
    float mx = row[0];
    for (int i = 1; i < V; i++) mx = row[i] > mx ? row[i] : mx;
    double sum = 0;
    for (int i = 0; i < V; i++) sum += exp((double)row[i] - mx);
    const double lz = mx + log(sum);
    for (int k = 0; k < n_top; k++) {
        int best = -1;
        for (int i = 0; i < V; i++) {
            bool taken = false;
            for (int j = 0; j < k; j++) taken |= top_id[j] == i;
            if (!taken && (best < 0 || row[i] > row[best])) best = i;
        }
        top_id[k] = best;
        top_lp[k] = (float)(row[best] - lz);
    }
    return (float)(row[tok] - lz);
}

static void record_lp(qi_server *s, qi_sreq *r, int pos, const float *row, int32_t tok) {
    const int k = r->logprobs > 0 ? r->logprobs : 0;
    r->lp[pos] = row_logprob(row, s->m->hp.n_vocab, tok, k, r->top_id + (size_t)pos * k, r->top_lp + (size_t)pos * k);
}

static void hist_add(qi_server *s, qi_sreq *r) {
    qi_serve_hist *h = &s->hist[s->hist_at];
    double *t = qi_malloc(sizeof(double) * (size_t)(r->n_gen ? r->n_gen : 1));
    if (!t) return; /* the window misses it; the counters do not */
    qi_free(h->tok_t);
    memcpy(t, r->tok_t, sizeof(double) * (size_t)r->n_gen);
    *h = (qi_serve_hist){.arrival = r->arrival, .start = r->start, .n_prompt = r->n_prompt, .n_out = r->n_gen,
                         .tok_t = t};
    s->hist_at = (s->hist_at + 1) % QI_SERVE_WINDOW;
    if (s->hist_n < QI_SERVE_WINDOW) s->hist_n++;
}

static void release_locked(qi_sreq *r) {
    if (--r->refs == 0) sreq_free(r);
}

/* Ends r (under the mutex): its sequence removed (its KV blocks freed), its
 * text complete, the waiters woken, the engine's reference dropped. */
static void finish(qi_server *s, qi_sreq *r, qi_finish f, const char *error) {
    char buf[16];
    size_t nb = qi_detok_flush(&r->dt, buf, sizeof buf);
    if (nb) text_append(r, buf, nb);
    r->n_safe = r->n_text;
    if (r->sid >= 0) {
        qi_sched_end(s->sched, r->sid); /* its KV blocks freed, or out of the scheduler's queue */
        for (int i = 0; i < s->n_active; i++)
            if (s->active[i] == r) {
                s->active[i] = s->active[--s->n_active];
                break;
            }
        r->sid = -1;
    }
    r->state = QI_SREQ_DONE;
    r->finish = f;
    if (error) snprintf(r->error, sizeof r->error, "%s", error);
    if (f == QI_FINISH_STOP || f == QI_FINISH_LENGTH) {
        s->n_done++;
        s->n_prompt_tokens += r->n_prompt;
        s->n_output_tokens += r->n_gen;
        hist_add(s, r);
        const qi_request_timeline tl = {.arrival = r->arrival, .start = r->start, .token_t = r->tok_t,
                                        .n_prompt = r->n_prompt, .n_out = r->n_gen};
        qi_request_metrics rm;
        if (r->n_gen == 0)
            fprintf(stderr, "qinfer serve: request %ld: %d prompt tokens, none generated\n", r->id, r->n_prompt);
        else if (qi_measure_request(&tl, &rm, NULL) == QI_OK)
            fprintf(stderr, "qinfer serve: request %ld: %d prompt + %d tokens, TTFT %.3f s, end to end %.3f s, %s\n",
                    r->id, r->n_prompt, r->n_gen, rm.ttft_s, rm.e2e_s, f == QI_FINISH_STOP ? "stop" : "length");
    } else if (f == QI_FINISH_CANCEL) {
        s->n_cancelled++;
        fprintf(stderr, "qinfer serve: request %ld cancelled after %d tokens\n", r->id, r->n_gen);
    } else {
        s->n_failed++;
        fprintf(stderr, "qinfer serve: request %ld failed: %s\n", r->id, r->error);
    }
    pthread_cond_broadcast(&s->progress);
    release_locked(r);
}

/* The token just sampled for r: appended, checked against the stop strings,
 * the length and the context; fed back unless r ends. */
static void take_token(qi_server *s, qi_sreq *r, int32_t tok, const float *row) {
    const qi_tokenizer *tk = s->m->tok;
    if (qi_tokenizer_is_eog(tk, tok)) {
        finish(s, r, QI_FINISH_STOP, NULL);
        return;
    }
    if (r->logprobs >= 0) record_lp(s, r, r->n_prompt + r->n_gen, row, tok);
    r->out[r->n_gen] = tok;
    r->tok_t[r->n_gen] = qi_measure_now();
    r->n_gen++;
    char buf[512];
    size_t cap = sizeof buf, nb = qi_detok_push(tk, &r->dt, tok, false, buf, cap);
    const size_t before = r->n_text;
    if (!text_append(r, buf, nb < cap ? nb : cap)) {
        finish(s, r, QI_FINISH_ERROR, "out of memory");
        return;
    }
    for (int i = 0; i < r->n_stop; i++) {
        const size_t from = before + 1 > r->max_stop ? before + 1 - r->max_stop : 0;
        const char *hit = strstr(r->text + from, r->stop[i]);
        if (hit) {
            r->n_text = (size_t)(hit - r->text);
            r->text[r->n_text] = '\0';
            qi_detok_init(&r->dt); /* what it held lies past the stop string */
            finish(s, r, QI_FINISH_STOP, NULL);
            return;
        }
    }
    if (r->max_stop <= 1) r->n_safe = r->n_text;
    else if (r->n_text + 1 > r->max_stop && r->n_text + 1 - r->max_stop > r->n_safe)
        r->n_safe = r->n_text + 1 - r->max_stop;
    if (r->n_gen >= r->max_tokens || r->n_prompt + r->n_gen > s->n_ctx) {
        finish(s, r, QI_FINISH_LENGTH, NULL);
        return;
    }
    qi_err err = {0};
    if (qi_sched_push(s->sched, r->sid, tok, &err)) finish(s, r, QI_FINISH_ERROR, err.msg);
}

/* The listed requests handed to the scheduler, in order. */
static void hand_over(qi_server *s) {
    while (s->head) {
        qi_sreq *r = s->head;
        s->head = r->next;
        if (!s->head) s->tail = NULL;
        s->n_listed--;
        r->next = NULL;
        if (r->cancel) {
            finish(s, r, QI_FINISH_CANCEL, NULL);
            continue;
        }
        if (s->n_active == s->cap_active) {
            int cap = s->cap_active ? s->cap_active * 2 : 16;
            qi_sreq **a = qi_realloc(s->active, sizeof *a * (size_t)cap);
            if (!a) {
                finish(s, r, QI_FINISH_ERROR, "out of memory");
                continue;
            }
            s->active = a;
            s->cap_active = cap;
        }
        qi_err err = {0};
        long sid;
        if (qi_sched_submit(s->sched, r->prompt, r->n_prompt, r->max_tokens, r->prompt_lp, &sid, &err)) {
            finish(s, r, QI_FINISH_ERROR, err.msg);
            continue;
        }
        r->sid = sid;
        s->active[s->n_active++] = r;
        const char *why;
        if (qi_sched_req_state(s->sched, sid, &why) == QI_SCHED_REJECTED) {
            char msg[QI_SCHED_REASON];
            snprintf(msg, sizeof msg, "%s", why);
            finish(s, r, QI_FINISH_ERROR, msg);
        }
    }
}

/* After a step: each request's state, prompt logprobs, and next token. */
static void after_step(qi_server *s, qi_status st, const char *step_error) {
    qi_sched *sc = s->sched;
    /* backwards: finish() moves the last request into the finished one's place */
    for (int i = s->n_active - 1; i >= 0; i--) {
        if (i >= s->n_active) continue;
        qi_sreq *r = s->active[i];
        if (st) {
            finish(s, r, QI_FINISH_ERROR, step_error);
            continue;
        }
        const char *why;
        const qi_sched_state ss = qi_sched_req_state(sc, r->sid, &why);
        if (ss == QI_SCHED_REJECTED) {
            char msg[QI_SCHED_REASON];
            snprintf(msg, sizeof msg, "%s", why); /* the record goes with qi_sched_end */
            finish(s, r, QI_FINISH_ERROR, msg);
            continue;
        }
        if (ss != QI_SCHED_RUNNING) {
            r->state = QI_SREQ_WAITING; /* not admitted yet, or preempted */
            continue;
        }
        if (r->state == QI_SREQ_WAITING) {
            r->state = QI_SREQ_RUNNING;
            if (isnan(r->start)) r->start = qi_sched_req_start(sc, r->sid);
        }
        if (r->prompt_lp) { /* row j is position first + j, whose logits score position first + j + 1 */
            int first;
            const int rows = qi_sched_n_logits(sc, r->sid, &first);
            for (int j = 0; j < rows; j++) {
                const int pos = first + j + 1;
                if (pos >= 1 && pos < r->n_prompt)
                    record_lp(s, r, pos, qi_sched_logits(sc, r->sid, j), r->prompt[pos]);
            }
        }
        if (!qi_sched_req_ready(sc, r->sid)) continue;
        if (r->n_gen >= r->max_tokens) {
            finish(s, r, QI_FINISH_LENGTH, NULL);
            continue;
        }
        const float *row = qi_sched_logits(sc, r->sid, -1);
        const int32_t tok = qi_sampler_sample(r->smp, row);
        qi_sampler_accept(r->smp, tok);
        take_token(s, r, tok, row);
    }
}

static void recount(qi_server *s) {
    int running = 0, waiting = 0;
    for (int i = 0; i < s->n_active; i++) {
        const qi_sched_state ss = qi_sched_req_state(s->sched, s->active[i]->sid, NULL);
        running += ss == QI_SCHED_RUNNING;
        waiting += ss == QI_SCHED_WAITING;
    }
    s->n_running = running;
    s->n_waiting = s->n_listed + waiting;
    s->n_preemptions = qi_sched_n_preemptions(s->sched);
    s->n_swaps = qi_sched_n_swaps(s->sched);
}

static void *engine_thread(void *arg) {
    qi_server *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->stop && s->n_active == 0 && !s->head) pthread_cond_wait(&s->work, &s->mu);
        if (s->stop) break;
        hand_over(s);
        for (int i = s->n_active - 1; i >= 0; i--)
            if (i < s->n_active && s->active[i]->cancel) finish(s, s->active[i], QI_FINISH_CANCEL, NULL);
        qi_err err = {0};
        qi_status st = qi_sched_admit(s->sched, &err); /* the admitted stop counting as waiting now */
        recount(s);
        if (s->n_active == 0) continue;
        pthread_mutex_unlock(&s->mu);
        if (!st) st = qi_sched_step(s->sched, NULL, &err);
        pthread_mutex_lock(&s->mu);
        after_step(s, st, err.msg);
        recount(s);
        pthread_cond_broadcast(&s->progress);
    }
    /* stopping: nothing is left behind */
    while (s->n_active > 0) finish(s, s->active[s->n_active - 1], QI_FINISH_CANCEL, NULL);
    while (s->head) {
        qi_sreq *r = s->head;
        s->head = r->next;
        s->n_listed--;
        finish(s, r, QI_FINISH_CANCEL, NULL);
    }
    s->tail = NULL;
    recount(s);
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

qi_status qi_server_start(qi_server *s, qi_err *err) {
    if (pthread_create(&s->thread, NULL, engine_thread, s))
        return QI_ERR(err, QI_ERR_NOMEM, "cannot start the engine thread");
    s->started = true;
    return QI_OK;
}

void qi_server_stop(qi_server *s) {
    pthread_mutex_lock(&s->mu);
    s->stop = true;
    pthread_cond_broadcast(&s->work);
    pthread_cond_broadcast(&s->progress);
    pthread_mutex_unlock(&s->mu);
    if (s->started) pthread_join(s->thread, NULL);
    s->started = false;
}

void qi_server_fini(qi_server *s) {
    qi_server_stop(s);
    for (int i = 0; i < QI_SERVE_WINDOW; i++) qi_free(s->hist[i].tok_t);
    qi_sched_free(s->sched); /* the engine thread has stopped: nothing is left in it */
    qi_free(s->active);
    pthread_cond_destroy(&s->work);
    pthread_cond_destroy(&s->progress);
    pthread_mutex_destroy(&s->mu);
}

int qi_server_submit(qi_server *s, qi_sreq *r) {
    pthread_mutex_lock(&s->mu);
    int rc = 0;
    if (s->stop) rc = 2;
    else if (s->max_queue > 0 && s->n_waiting >= s->max_queue) rc = 1, s->n_refused++;
    if (rc == 0) {
        r->refs++;
        r->id = ++s->next_id;
        r->arrival = qi_measure_now();
        r->state = QI_SREQ_WAITING;
        if (s->tail) s->tail->next = r;
        else s->head = r;
        s->tail = r;
        s->n_listed++;
        s->n_waiting++;
        pthread_cond_signal(&s->work);
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

void qi_server_release(qi_server *s, qi_sreq *r) {
    if (!r) return;
    pthread_mutex_lock(&s->mu);
    bool unlisted = false;
    if (r->state == QI_SREQ_WAITING && r->sid < 0 && r->refs > 1) {
        /* not yet handed to the scheduler: out of the list at once, so it holds no place there */
        for (qi_sreq **p = &s->head, *prev = NULL; *p; prev = *p, p = &(*p)->next)
            if (*p == r) {
                *p = r->next;
                if (s->tail == r) s->tail = prev;
                s->n_listed--;
                s->n_waiting--;
                r->next = NULL;
                finish(s, r, QI_FINISH_CANCEL, NULL);
                unlisted = true;
                break;
            }
    }
    if (!unlisted && r->state != QI_SREQ_DONE && r->refs > 1) {
        r->cancel = true;
        pthread_cond_signal(&s->work);
    }
    release_locked(r);
    pthread_mutex_unlock(&s->mu);
}

/* ---- /metrics ---------------------------------------------------------------------- */

typedef struct {
    char *p;
    size_t n, cap;
    bool failed;
} sbuf;

static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...) {
    if (b->failed) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(b->p ? b->p + b->n : NULL, b->p ? b->cap - b->n : 0, fmt, ap);
        va_end(ap);
        if (k < 0) {
            b->failed = true;
            return;
        }
        if (b->p && b->n + (size_t)k < b->cap) {
            b->n += (size_t)k;
            return;
        }
        size_t cap = b->cap ? b->cap * 2 : 4096;
        while (cap < b->n + (size_t)k + 1) cap *= 2;
        char *p = qi_realloc(b->p, cap);
        if (!p) {
            b->failed = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
}

char *qi_server_metrics(qi_server *s) {
    sbuf b = {0};
    pthread_mutex_lock(&s->mu);
    sb_printf(&b, "# HELP qinfer_requests_total Requests by how they ended.\n# TYPE qinfer_requests_total counter\n");
    sb_printf(&b, "qinfer_requests_total{status=\"done\"} %ld\n", s->n_done);
    sb_printf(&b, "qinfer_requests_total{status=\"cancelled\"} %ld\n", s->n_cancelled);
    sb_printf(&b, "qinfer_requests_total{status=\"failed\"} %ld\n", s->n_failed);
    sb_printf(&b, "qinfer_requests_total{status=\"refused\"} %ld\n", s->n_refused);
    sb_printf(&b, "# HELP qinfer_prompt_tokens_total Prompt tokens of the requests done.\n"
                  "# TYPE qinfer_prompt_tokens_total counter\nqinfer_prompt_tokens_total %ld\n", s->n_prompt_tokens);
    sb_printf(&b, "# HELP qinfer_output_tokens_total Output tokens of the requests done.\n"
                  "# TYPE qinfer_output_tokens_total counter\nqinfer_output_tokens_total %ld\n", s->n_output_tokens);
    sb_printf(&b, "# HELP qinfer_preemptions_total Requests preempted (KV memory budget), by swap or recompute.\n"
                  "# TYPE qinfer_preemptions_total counter\nqinfer_preemptions_total %ld\n", s->n_preemptions);
    sb_printf(&b, "# HELP qinfer_preemptions_swap_total Of those, the ones swapped to the offload tier.\n"
                  "# TYPE qinfer_preemptions_swap_total counter\nqinfer_preemptions_swap_total %ld\n", s->n_swaps);
    sb_printf(&b, "# TYPE qinfer_requests_running gauge\nqinfer_requests_running %d\n", s->n_running);
    sb_printf(&b, "# TYPE qinfer_requests_waiting gauge\nqinfer_requests_waiting %d\n", s->n_waiting);
    /* the run figures of the last finished requests, as measure.c defines them */
    qi_request_timeline *tl = qi_malloc(sizeof *tl * (size_t)(s->hist_n ? s->hist_n : 1));
    qi_run_metrics rm;
    bool have = false;
    if (tl && s->hist_n > 0) {
        for (int i = 0; i < s->hist_n; i++)
            tl[i] = (qi_request_timeline){.arrival = s->hist[i].arrival, .start = s->hist[i].start,
                                          .token_t = s->hist[i].tok_t, .n_prompt = s->hist[i].n_prompt,
                                          .n_out = s->hist[i].n_out};
        have = qi_measure_run(tl, s->hist_n, NULL, &rm, NULL) == QI_OK;
    }
    pthread_mutex_unlock(&s->mu);
    qi_free(tl);
    if (have) {
        sb_printf(&b, "# The run figures below (results/README.md names, '.' as '_') span the last %ld requests done.\n",
                  rm.n_requests);
        const char *name, *unit;
        double v;
        for (int i = 0; qi_measure_run_metric(&rm, i, &name, &unit, &v); i++) {
            if (!name || !isfinite(v)) continue;
            char pn[96];
            snprintf(pn, sizeof pn, "qinfer_%s", name);
            for (char *c = pn; *c; c++)
                if (*c == '.') *c = '_';
            sb_printf(&b, "# TYPE %s gauge\n%s %.9g\n", pn, pn, v);
        }
    }
    if (b.failed) {
        qi_free(b.p);
        return NULL;
    }
    if (!b.p) sb_printf(&b, "%s", "");
    return b.p;
}

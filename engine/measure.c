/* measure.c - the one definition of the latency and throughput figures
 * (measure.h): a request's from its timeline, a run's from its requests',
 * and the batched decode rate bench and Lua both report.
 *
 * Why timelines and not running sums: every figure the serving field quotes
 * (TTFT, TPOT, inter-token latency, percentiles, goodput) is a function of
 * when each token appeared, and keeping the times lets one function define
 * each figure for every caller, and lets tests check every definition on a
 * timeline made by hand. The percentile is numpy's default (linear between
 * closest ranks), the one serving benchmarks usually print, so figures can
 * be compared with theirs.
 *
 * The clock: CLOCK_MONOTONIC, or, under QINFER_FAKE_CLOCK, a counter that
 * advances one tick per read. The fake clock lets a test hold two callers
 * (bench and Lua) to the same definition exactly: the same function reads
 * the clock the same number of times whoever calls it, so their figures
 * must agree to the bit.
 */
#include <math.h>
#include <stddef.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "qinfer/measure.h"
#include "qinfer/sampler.h"

static double g_fake_tick;        /* > 0: the fake clock is on */
static atomic_long g_fake_reads;  /* reads of the fake clock so far */
static pthread_once_t g_clock_once = PTHREAD_ONCE_INIT;

static void clock_init(void) {
    const char *s = getenv("QINFER_FAKE_CLOCK");
    if (!s || !*s) return;
    char *end;
    double t = strtod(s, &end);
    if (*end == '\0' && t > 0 && isfinite(t)) g_fake_tick = t;
}

double qi_measure_now(void) {
    pthread_once(&g_clock_once, clock_init);
    if (g_fake_tick > 0) return (double)atomic_fetch_add(&g_fake_reads, 1) * g_fake_tick;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

double qi_measure_rate(double tokens, double seconds) { return seconds > 0 ? tokens / seconds : INFINITY; }

/* ---- requests ------------------------------------------------------------------- */

qi_status qi_measure_request(const qi_request_timeline *r, qi_request_metrics *out, qi_err *err) {
    out->ttft_s = out->tpot_s = out->e2e_s = out->queue_s = NAN;
    if (r->n_out < 0 || r->n_prompt < 0 || (r->n_out > 0 && !r->token_t))
        return QI_ERR(err, QI_ERR_INVALID, "request timeline: negative token counts or no token times");
    if (!isfinite(r->arrival)) return QI_ERR(err, QI_ERR_INVALID, "request timeline: no arrival time");
    if (!isnan(r->start) && r->start < r->arrival)
        return QI_ERR(err, QI_ERR_INVALID, "request timeline: scheduled at %.6f s, before its arrival at %.6f s",
                      r->start, r->arrival);
    for (int i = 0; i < r->n_out; i++) {
        double prev = i ? r->token_t[i - 1] : (isnan(r->start) ? r->arrival : r->start);
        if (!(r->token_t[i] >= prev))
            return QI_ERR(err, QI_ERR_INVALID, "request timeline: token %d at %.6f s comes before %.6f s", i,
                          r->token_t[i], prev);
    }
    if (!isnan(r->start)) out->queue_s = r->start - r->arrival;
    if (r->n_out == 0) return QI_OK;
    out->ttft_s = r->token_t[0] - r->arrival;
    out->e2e_s = r->token_t[r->n_out - 1] - r->arrival;
    if (r->n_out >= 2) out->tpot_s = (out->e2e_s - out->ttft_s) / (r->n_out - 1);
    return QI_OK;
}

/* ---- distributions ------------------------------------------------------------- */

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double qi_measure_percentile(const double *sorted, long n, double p) {
    if (n <= 0) return NAN;
    if (p <= 0) return sorted[0];
    if (p >= 100) return sorted[n - 1];
    double rank = p / 100.0 * (double)(n - 1);
    long lo = (long)floor(rank);
    double frac = rank - (double)lo;
    if (lo + 1 >= n) return sorted[n - 1];
    return sorted[lo] + frac * (sorted[lo + 1] - sorted[lo]);
}

void qi_measure_summarize(double *v, long n, qi_measure_summary *out) {
    long k = 0;
    for (long i = 0; i < n; i++)
        if (!isnan(v[i])) v[k++] = v[i];
    out->n = k;
    if (k == 0) {
        out->mean = out->median = out->p90 = out->p99 = out->min = out->max = NAN;
        return;
    }
    qsort(v, (size_t)k, sizeof *v, cmp_double);
    double sum = 0;
    for (long i = 0; i < k; i++) sum += v[i];
    out->mean = sum / (double)k;
    out->median = qi_measure_percentile(v, k, 50);
    out->p90 = qi_measure_percentile(v, k, 90);
    out->p99 = qi_measure_percentile(v, k, 99);
    out->min = v[0];
    out->max = v[k - 1];
}

/* ---- runs --------------------------------------------------------------------- */

qi_status qi_measure_run(const qi_request_timeline *r, long n, const qi_slo *slo, qi_run_metrics *out, qi_err *err) {
    memset(out, 0, sizeof *out);
    out->n_requests = n;
    long n_itl = 0;
    for (long i = 0; i < n; i++)
        if (!r[i].rejected && r[i].n_out > 1) n_itl += r[i].n_out - 1;
    /* scratch: five per-request columns, then every gap */
    double *buf = qi_malloc(sizeof(double) * (size_t)(5 * (n ? n : 1) + (n_itl ? n_itl : 1)));
    if (!buf) return QI_ERR(err, QI_ERR_NOMEM, "out of memory summarising %ld requests", n);
    double *ttft = buf, *tpot = buf + n, *e2e = buf + 2 * n, *queue = buf + 3 * n, *itl = buf + 5 * n;
    long nd = 0, ni = 0;
    double first = INFINITY, last = -INFINITY;
    for (long i = 0; i < n; i++) {
        qi_request_metrics rm;
        qi_status st = qi_measure_request(&r[i], &rm, err);
        if (st) {
            qi_free(buf);
            qi_err_prefix(err, "request %ld", i);
            return st;
        }
        if (r[i].arrival < first) first = r[i].arrival;
        if (r[i].rejected) {
            out->n_rejected++;
            continue;
        }
        if (r[i].n_out > 0 && r[i].token_t[r[i].n_out - 1] > last) last = r[i].token_t[r[i].n_out - 1];
        ttft[nd] = rm.ttft_s;
        tpot[nd] = rm.tpot_s;
        e2e[nd] = rm.e2e_s;
        queue[nd] = rm.queue_s;
        nd++;
        out->prompt_tokens += r[i].n_prompt;
        out->output_tokens += r[i].n_out;
        for (int t = 1; t < r[i].n_out; t++) itl[ni++] = r[i].token_t[t] - r[i].token_t[t - 1];
        bool good = true;
        if (slo && slo->ttft_s > 0 && !(rm.ttft_s <= slo->ttft_s)) good = false;
        if (slo && slo->tpot_s > 0 && !isnan(rm.tpot_s) && !(rm.tpot_s <= slo->tpot_s)) good = false;
        if (r[i].n_out == 0) good = false;
        out->n_good += good;
    }
    out->n_done = nd;
    out->duration_s = last > first ? last - first : 0;
    double d = out->duration_s;
    out->requests_per_s = d > 0 ? nd / d : 0;
    out->output_tokens_per_s = d > 0 ? out->output_tokens / d : 0;
    out->total_tokens_per_s = d > 0 ? (out->prompt_tokens + out->output_tokens) / d : 0;
    out->goodput_req_per_s = d > 0 ? out->n_good / d : 0;
    qi_measure_summarize(ttft, nd, &out->ttft);
    qi_measure_summarize(tpot, nd, &out->tpot);
    qi_measure_summarize(e2e, nd, &out->e2e);
    qi_measure_summarize(queue, nd, &out->queue);
    qi_measure_summarize(itl, ni, &out->itl);
    qi_free(buf);
    return QI_OK;
}

/* The names: a summary's five latencies times four statistics, then the
 * counts and rates. */
static const struct {
    const char *area;
    size_t off;
} k_dists[] = {
    {"ttft", offsetof(qi_run_metrics, ttft)}, {"tpot", offsetof(qi_run_metrics, tpot)},
    {"itl", offsetof(qi_run_metrics, itl)},   {"e2e", offsetof(qi_run_metrics, e2e)},
    {"queue", offsetof(qi_run_metrics, queue)},
};
static const char *const k_stats[] = {"ttft.mean_s", "ttft.median_s", "ttft.p90_s", "ttft.p99_s",
                                      "tpot.mean_s", "tpot.median_s", "tpot.p90_s", "tpot.p99_s",
                                      "itl.mean_s",  "itl.median_s",  "itl.p90_s",  "itl.p99_s",
                                      "e2e.mean_s",  "e2e.median_s",  "e2e.p90_s",  "e2e.p99_s",
                                      "queue.mean_s", "queue.median_s", "queue.p90_s", "queue.p99_s"};

bool qi_measure_run_metric(const qi_run_metrics *r, int i, const char **name, const char **unit, double *value) {
    const int n_dist = (int)(sizeof k_dists / sizeof k_dists[0]) * 4;
    *name = NULL;
    if (i < 0) return false;
    if (i < n_dist) {
        const qi_measure_summary *d = (const qi_measure_summary *)((const char *)r + k_dists[i / 4].off);
        if (d->n == 0) return true;
        const double v[4] = {d->mean, d->median, d->p90, d->p99};
        *name = k_stats[i];
        *unit = "s";
        *value = v[i % 4];
        return true;
    }
    switch (i - n_dist) {
    case 0: *name = "requests.done", *unit = "1", *value = (double)r->n_done; return true;
    case 1: *name = "requests.rejected", *unit = "1", *value = (double)r->n_rejected; return true;
    case 2: *name = "throughput.requests_per_s", *unit = "req/s", *value = r->requests_per_s; return true;
    case 3: *name = "throughput.output_tokens_per_s", *unit = "tok/s", *value = r->output_tokens_per_s; return true;
    case 4: *name = "throughput.total_tokens_per_s", *unit = "tok/s", *value = r->total_tokens_per_s; return true;
    case 5: *name = "goodput.requests_per_s", *unit = "req/s", *value = r->goodput_req_per_s; return true;
    case 6: *name = "run.duration_s", *unit = "s", *value = r->duration_s; return true;
    default: return false;
    }
}

/* ---- the batched decode rate ----------------------------------------------------- */

static int32_t next_random(uint64_t *x, int n_vocab) {
    *x ^= *x >> 12;
    *x ^= *x << 25;
    *x ^= *x >> 27;
    return (int32_t)((*x * 0x2545f4914f6cdd1dull >> 33) % (uint64_t)n_vocab);
}

qi_status qi_measure_decode(qi_engine *e, const qi_model *m, const qi_decode_opts *o, qi_decode_result *out,
                            qi_err *err) {
    memset(out, 0, sizeof *out);
    if (o->batch < 1 || o->n_gen < 1 || o->n_prompt < 1 || !o->prompts || o->prompt_stride < 0)
        return QI_ERR(err, QI_ERR_INVALID, "decode measurement: batch %d, %d steps, %d prompt tokens", o->batch,
                      o->n_gen, o->n_prompt);
    const int V = m->hp.n_vocab;
    int *ids = qi_malloc(sizeof(int) * (size_t)o->batch);
    int32_t *tok = qi_malloc(sizeof(int32_t) * (size_t)o->batch); /* next token; -1 until the prompt ends */
    if (!ids || !tok) {
        qi_free(ids);
        qi_free(tok);
        return QI_ERR(err, QI_ERR_NOMEM, "out of memory");
    }
    uint64_t rng = o->seed ? o->seed : 0x2545f4914f6cdd1dull;
    int n_added = 0, n;
    qi_status st = QI_OK;
    if (o->tick && (st = o->tick(o->tick_ctx, e, o->batch, o->n_prompt, o->n_gen, err))) goto done;
    double t0 = qi_engine_now(e);
    for (; n_added < o->batch; n_added++) {
        if ((st = qi_engine_seq_add(e, &ids[n_added], err))) goto done;
        tok[n_added] = -1;
        if ((st = qi_engine_seq_feed(e, ids[n_added], o->prompts + (size_t)n_added * (size_t)o->prompt_stride,
                                     o->n_prompt, false, err))) {
            n_added++;
            goto done;
        }
    }
    /* A step holds at most step_tokens prompt tokens, so the prompts of a
     * large batch end in different steps, and logits last only until the
     * next step: each sequence's first token is taken in the step its
     * prompt ends. */
    for (bool pending = true; pending;) {
        if ((st = qi_engine_step(e, &n, err))) goto done;
        pending = false;
        for (int b = 0; b < o->batch; b++) {
            if (qi_engine_seq_pending(e, ids[b]) > 0) {
                pending = true;
            } else if (tok[b] < 0) {
                const float *lg = qi_engine_seq_logits(e, ids[b], -1);
                if (!lg) {
                    st = QI_ERR(err, QI_ERR_BACKEND, "sequence %d has no logits after its prompt", ids[b]);
                    goto done;
                }
                tok[b] = o->greedy ? qi_argmax(lg, V) : next_random(&rng, V);
            }
        }
    }
    qi_engine_prof before;
    qi_engine_profile(e, &before);
    double t_dec = qi_engine_now(e), t_prev = t_dec, pair_first = 0;
    out->prefill_s = t_dec - t0;
    for (int i = 0; i < o->n_gen; i++) {
        for (int b = 0; b < o->batch; b++) {
            if (i > 0) {
                if (o->greedy) {
                    const float *lg = qi_engine_seq_logits(e, ids[b], -1);
                    if (!lg) {
                        st = QI_ERR(err, QI_ERR_BACKEND, "sequence %d has no logits after its step", ids[b]);
                        goto done;
                    }
                    tok[b] = qi_argmax(lg, V);
                } else {
                    tok[b] = next_random(&rng, V);
                }
            }
            if ((st = qi_engine_seq_feed(e, ids[b], &tok[b], 1, false, err))) goto done;
        }
        if (o->tick && (st = o->tick(o->tick_ctx, e, o->batch, o->n_prompt + i, o->n_gen - i, err))) goto done;
        /* ab_dense: pair i / 2 runs sparse first when even, dense first when odd */
        const int dense = (i & 1) ^ ((i >> 1) & 1);
        if (o->ab_dense) qi_engine_sparsity_pause(e, dense);
        const double t_step = o->ab_dense ? qi_engine_now(e) : 0.0; /* no extra clock read otherwise */
        st = qi_engine_step(e, &n, err);
        if (o->ab_dense) qi_engine_sparsity_pause(e, false);
        if (st) goto done;
        if (n != o->batch) {
            st = QI_ERR(err, QI_ERR_BACKEND, "a decode step ran %d tokens, not one for each of %d sequences", n,
                        o->batch);
            goto done;
        }
        double t = qi_engine_now(e);
        if (t - t_prev > out->itl_max_s) out->itl_max_s = t - t_prev;
        t_prev = t;
        if (o->ab_dense) {
            out->ab_s[dense] += t - t_step;
            out->ab_steps[dense]++;
            if (i & 1) { /* the pair's second step: its first was the other side */
                const double mine = t - t_step;
                const double sparse_s = dense ? pair_first : mine, dense_s = dense ? mine : pair_first;
                if (o->ab_ratio) o->ab_ratio[out->ab_pairs] = dense_s > 0 ? sparse_s / dense_s : NAN;
                out->ab_pairs++;
            }
            pair_first = t - t_step;
        }
    }
    out->decode_s = t_prev - t_dec;
    qi_engine_profile(e, &out->prof);
    for (int k = 0; k < QI_OP_COUNT; k++) {
        out->prof.seconds[k] -= before.seconds[k];
        out->prof.calls[k] -= before.calls[k];
    }
    for (int d = 0; d < QI_PLAN_MAX_DEVICES; d++) {
        out->prof.dev_op_seconds[d] -= before.dev_op_seconds[d];
        out->prof.dev_span_seconds[d] -= before.dev_span_seconds[d];
        out->prof.dev_copy_seconds[d] -= before.dev_copy_seconds[d];
    }
    out->prof.matmul_bytes -= before.matmul_bytes;
    out->prof.steps -= before.steps;
    out->tpot_s = out->decode_s / o->n_gen;
    out->tokens_per_s = qi_measure_rate((double)o->batch * o->n_gen, out->decode_s);
    out->seq_tokens_per_s = qi_measure_rate(o->n_gen, out->decode_s);
done:
    for (int b = 0; b < n_added; b++) {
        qi_status st2 = qi_engine_seq_remove(e, ids[b], err);
        if (!st) st = st2;
    }
    qi_free(ids);
    qi_free(tok);
    return st;
}

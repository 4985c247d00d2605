/* bench_run.c - the measurement loop of `qinfer bench` (bench.h): each
 * test's warm-up runs, then its timed repetitions, each on an emptied
 * context or on fresh sequences, and the mean and sample standard deviation
 * of their rates, as llama-bench reports them.
 *
 *   pp<N>  one qi_ctx_eval of N random token ids on an emptied context (BOS
 *          first when the model adds one), logits for the last token only;
 *   tg<N>  N single-token evals with logits, after one untimed warm-up token
 *          on an emptied context (llama-bench times its first token too; one
 *          position of difference is noise);
 *   tg<N> @ b<B>  B sequences in the batched engine, each with a distinct
 *          prompt of `depth` tokens (BOS first), untimed, then N steps that
 *          each feed one random token to every sequence: qi_measure_decode,
 *          the function Lua's qinfer.throughput runs too, so the two report
 *          one rate; B x N / seconds of the steps.
 *
 * Token ids come from one xorshift generator with a fixed seed, so two runs
 * of the same command feed the same tokens. With --cupti, CUPTI records the
 * timed repetitions (not the warm-up) beside the engine's events; with
 * --profile the runner sums the engine's op profile over them. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "bench.h"
#include "cuda/cupti.h"
#include "qinfer/measure.h"
#include "qinfer/tokenizer.h"

static uint64_t g_rng = 0x2545f4914f6cdd1dull;

static int32_t random_token(int n_vocab) {
    g_rng ^= g_rng >> 12;
    g_rng ^= g_rng << 25;
    g_rng ^= g_rng >> 27;
    return (int32_t)((g_rng * 0x2545f4914f6cdd1dull >> 33) % (uint64_t)n_vocab);
}

static int32_t first_token(const qi_model *m) {
    int32_t bos = qi_tokenizer_bos(m->tok);
    return qi_tokenizer_add_bos(m->tok) && bos >= 0 ? bos : random_token(m->hp.n_vocab);
}

static qi_status place_tick(void *ctx, qi_engine *e, int batch, int context, int left, qi_err *err) {
    bench_runner *r = ctx;
    const qi_placement_workload wl = {.batch = batch, .prompt_len = context, .gen_len = left, .kv_budget = r->kv_budget};
    const long before = r->ctl.replans;
    const qi_status st = qi_placement_ctl_tick(&r->ctl, e, r->m, &wl, NULL, err);
    r->replans += r->ctl.replans - before;
    return st;
}

/* acc += p. */
static void prof_add(qi_engine_prof *acc, const qi_engine_prof *p) {
    for (int k = 0; k < QI_OP_COUNT; k++) {
        acc->seconds[k] += p->seconds[k];
        acc->calls[k] += p->calls[k];
    }
    acc->matmul_bytes += p->matmul_bytes;
    acc->steps += p->steps;
}

/* One batched run, as qi_measure_decode defines it (Lua's qinfer.throughput
 * runs the same function): fresh sequences with distinct prompts (untimed
 * here), then n_gen steps of one random token each; *secs is the steps. */
static qi_status run_once_batch(bench_runner *r, bench_test *t, double *secs, qi_err *err) {
    const int V = r->m->hp.n_vocab;
    for (int b = 0; b < t->batch; b++) {
        int32_t *p = r->toks + (size_t)b * (size_t)t->depth;
        p[0] = first_token(r->m);
        for (int i = 1; i < t->depth; i++) p[i] = random_token(V);
    }
    const bool ab = r->vs_dense && t->ab_ratio; /* a timed repetition, not the warm-up */
    const qi_decode_opts o = {.batch = t->batch, .n_gen = t->n_gen, .prompts = r->toks, .n_prompt = t->depth,
                              .prompt_stride = t->depth, .greedy = false, .seed = random_token(V) + 1u,
                              .tick = r->policy ? place_tick : NULL, .tick_ctx = r, .ab_dense = r->vs_dense,
                              .ab_ratio = ab ? t->ab_ratio + t->ab_pairs : NULL};
    if (r->policy) qi_placement_ctl_init(&r->ctl, r->policy, 2.0); /* each run plans afresh, the policy keeps what it learnt */
    qi_decode_result res;
    qi_status st = qi_measure_decode(r->eng, r->m, &o, &res, err);
    if (st) return st;
    *secs = res.decode_s;
    if (r->vs_dense) { /* the row's rate is the sparse steps' */
        *secs = res.ab_s[0] * t->n_gen / (res.ab_steps[0] ? res.ab_steps[0] : 1);
        if (ab) {
            t->ab_pairs += res.ab_pairs;
            for (int k = 0; k < 2; k++) {
                t->ab_s[k] += res.ab_s[k];
                t->ab_steps[k] += res.ab_steps[k];
            }
        }
    }
    prof_add(&r->prof, &res.prof);
    return QI_OK;
}

/* One run of a test on an emptied context; *secs is the timed part. */
static qi_status run_once(bench_runner *r, bench_test *t, double *secs, qi_err *err) {
    if (t->engine) return run_once_batch(r, t, secs, err);
    const qi_model *m = r->m;
    qi_ctx *ctx = r->ctx;
    int32_t *toks = r->toks;
    const int V = m->hp.n_vocab;
    qi_ctx_reset(ctx);
    qi_status st;
    if (t->n_prompt > 0) {
        toks[0] = first_token(m);
        for (int i = 1; i < t->n_prompt; i++) toks[i] = random_token(V);
        double t0 = qi_ctx_now(ctx);
        st = qi_ctx_eval(ctx, toks, t->n_prompt, false, err);
        *secs = qi_ctx_now(ctx) - t0;
        return st;
    }
    int32_t tok = first_token(m);
    if ((st = qi_ctx_eval(ctx, &tok, 1, false, err))) return st; /* the warm-up token */
    double t0 = qi_ctx_now(ctx);
    for (int i = 0; i < t->n_gen; i++) {
        tok = random_token(V);
        if ((st = qi_ctx_eval(ctx, &tok, 1, false, err))) return st;
    }
    *secs = qi_ctx_now(ctx) - t0;
    return QI_OK;
}

qi_status bench_run_test(bench_runner *r, bench_test *t, int n_warmup, qi_err *err) {
    const char *cmd = "bench";
    double n_tok = t->n_prompt > 0 ? t->n_prompt : (double)t->n_gen * t->batch;
    double secs;
    double *ab_ratio = t->ab_ratio;
    t->ab_ratio = NULL; /* the warm-up's pairs are not kept */
    for (int i = 0; i < n_warmup; i++) {
        fprintf(stderr, "qinfer %s: %s warm-up %d/%d\n", cmd, t->name, i + 1, n_warmup);
        qi_status st = run_once(r, t, &secs, err);
        if (st) {
            t->ab_ratio = ab_ratio;
            return st;
        }
    }
    t->ab_ratio = ab_ratio;
    memset(&r->prof, 0, sizeof r->prof); /* the profile covers the timed repetitions */
    /* --cupti: CUPTI and the engine's events over the same repetitions */
    qi_engine *eng = r->eng ? r->eng : r->ctx ? qi_ctx_engine(r->ctx) : NULL;
    qi_engine_prof before;
    if (r->cupti && eng) {
        qi_engine_profile(eng, &before);
        qi_status st = qi_cupti_start(err);
        if (st) return st;
    }
    double sum = 0;
    for (int i = 0; i < t->n_reps; i++) {
        qi_status st = run_once(r, t, &secs, err);
        if (st && r->cupti && eng) { /* the recording ends with the test; the test's failure is the one reported */
            qi_cupti_totals ct;
            qi_err ignored = {0};
            qi_cupti_stop(&ct, &ignored);
        }
        if (st) return st;
        t->ts[i] = qi_measure_rate(n_tok, secs);
        t->secs[i] = secs;
        sum += t->ts[i];
        fprintf(stderr, "qinfer %s: %s run %d/%d: %.2f t/s (%.3f s)\n", cmd, t->name, i + 1, t->n_reps,
                t->ts[i], secs);
    }
    if (r->cupti && eng) {
        qi_cupti_totals ct;
        qi_status st = qi_cupti_stop(&ct, err);
        if (st) return st;
        qi_engine_prof pr;
        qi_engine_profile(eng, &pr);
        qi_cli_prof_since(&pr, &before);
        qi_cli_print_cupti(cmd, t->name, eng, &pr, &ct);
    }
    t->mean = sum / t->n_reps;
    double ss = 0;
    for (int i = 0; i < t->n_reps; i++) ss += (t->ts[i] - t->mean) * (t->ts[i] - t->mean);
    t->sd = t->n_reps > 1 ? sqrt(ss / (t->n_reps - 1)) : 0;
    return QI_OK;
}

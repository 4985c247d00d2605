/* test_sched.c - the scheduler under load, on the synthetic SmolLM2 shape
 * (testutil.h: every check here is exact or of accounting, true for any
 * weights): no
 * request is lost (each finishes with every token it asked for, or is
 * rejected with a reason); batching and preemption by recompute or by swap
 * leave each request's greedy output what it is alone, and swap runs no
 * prompt twice; the engine's swap of a sequence to the offload tier and
 * back leaves its logits bit for bit, on the CPU and on a second device,
 * and a swap the pool's cap refuses leaves it as it was; the KV budget is never passed;
 * the tokens-per-step limit keeps a second prompt out of a prompt's step;
 * the queue limit, the context and a request too big for the budget reject
 * with their reasons; online arrivals are waited for; no KV block is left
 * behind; the online calls (submit, step, push, end) as a server uses
 * them, cancellation included. */
#include <check.h>
#include <math.h>
#include <string.h>

#include "qinfer/engine.h"
#include "qinfer/model.h"
#include "qinfer/sampler.h"
#include "qinfer/sched.h"
#include "qinfer/workload.h"
#include "testutil.h"

static qi_model *g_model;

static qi_engine *engine_with(int max_seqs, const char *devices, const char *placement, size_t kv_max_bytes,
                              const char *kv_policy, int kv_budget_tokens) {
    qi_engine_opts o;
    qi_engine_opts_default(&o);
    o.n_threads = 2;
    o.max_seqs = max_seqs;
    o.n_ctx = 160;
    o.devices = devices;
    o.placement = placement;
    o.kv_max_bytes = kv_max_bytes;
    o.kv_policy = kv_policy;
    o.kv_budget_tokens = kv_budget_tokens;
    qi_engine *e = NULL;
    qi_err err = {0};
    ck_assert_msg(qi_engine_create(g_model, &o, &e, &err) == QI_OK, "%s", err.msg);
    return e;
}

static qi_engine *engine_on(int max_seqs, const char *devices, const char *placement, size_t kv_max_bytes) {
    return engine_with(max_seqs, devices, placement, kv_max_bytes, NULL, 0);
}

static qi_engine *engine(int max_seqs) { return engine_on(max_seqs, NULL, NULL, 0); }

static qi_workload *work(long n, double rate, const char *pl, const char *ol, uint64_t seed) {
    qi_workload_opts o = {.n_requests = n, .rate = rate, .seed = seed};
    qi_err err = {0};
    ck_assert_int_eq(qi_len_dist_parse(pl, &o.prompt_len, &err), QI_OK);
    ck_assert_int_eq(qi_len_dist_parse(ol, &o.output_len, &err), QI_OK);
    qi_workload *w = NULL;
    ck_assert_msg(qi_workload_generate(&o, &w, &err) == QI_OK, "%s", err.msg);
    return w;
}

static qi_sched_opts opts(int max_batch) {
    return (qi_sched_opts){.max_batch = max_batch, .n_ctx = 160, .seed = 5};
}

static qi_sched_result *run(qi_engine *e, const qi_workload *w, const qi_sched_opts *o) {
    qi_sched_result *r = NULL;
    qi_err err = {0};
    ck_assert_msg(qi_sched_run(e, g_model, w, o, &r, &err) == QI_OK, "%s", err.msg);
    ck_assert_int_eq(r->n, w->n);
    /* nothing lost, nothing half-done */
    for (long i = 0; i < r->n; i++) {
        const qi_sched_req *q = &r->req[i];
        if (q->t.rejected) {
            ck_assert_msg(q->reason[0], "request %ld rejected without a reason", i);
        } else {
            ck_assert_msg(q->t.n_out == q->n_asked, "request %ld: %d of %d tokens", i, q->t.n_out, q->n_asked);
            ck_assert_msg(q->reason[0] == 0, "request %ld done with a reason: %s", i, q->reason);
            ck_assert(q->t.start >= q->t.arrival);
            ck_assert(q->t.token_t[0] >= q->t.start);
        }
    }
    qi_engine_kv_pool pool;
    qi_engine_kv_pool_stats(e, &pool);
    ck_assert_msg(pool.work_blocks == 0 && pool.off_blocks == 0, "%ld blocks left behind",
                  pool.work_blocks + pool.off_blocks);
    ck_assert_int_eq(r->run.n_done + r->run.n_rejected, r->n);
    return r;
}

/* Request i of w served alone: its greedy tokens. Its pseudo-random prompt
 * is seeded by its index, so it is served as request i of a workload whose
 * requests before it are one-token stubs, each done before it starts. */
static void alone(const qi_workload *w, long i, const qi_sched_opts *base, int32_t *out, int n) {
    qi_engine *e = engine(1);
    qi_sched_opts o = *base;
    o.max_batch = 1;
    o.kv_budget_bytes = 0;
    o.queue_limit = 0;
    qi_work_request *reqs = qi_calloc((size_t)i + 1, sizeof *reqs);
    ck_assert_ptr_nonnull(reqs);
    for (long k = 0; k < i; k++) reqs[k] = (qi_work_request){.arrival_s = 0, .n_prompt = 1, .n_out = 1};
    reqs[i] = w->req[i];
    reqs[i].arrival_s = 0;
    qi_workload wi = {.req = reqs, .n = i + 1};
    qi_sched_result *r = NULL;
    qi_err err = {0};
    ck_assert_msg(qi_sched_run(e, g_model, &wi, &o, &r, &err) == QI_OK, "%s", err.msg);
    ck_assert_int_eq(r->req[i].t.n_out, n);
    memcpy(out, r->req[i].tokens, sizeof(int32_t) * (size_t)n);
    qi_sched_result_free(r);
    qi_free(reqs);
    qi_engine_free(e);
}

START_TEST(batching_keeps_each_output) {
    qi_workload *w = work(5, 0, "uniform:6-20", "uniform:3-7", 21);
    qi_engine *e = engine(3);
    qi_sched_opts o = opts(3);
    qi_sched_result *r = run(e, w, &o);
    ck_assert_int_eq(r->run.n_done, 5);
    ck_assert_int_eq(r->n_preemptions, 0);
    /* quick mode (the sanitizer build): two requests checked, not five */
    for (long i = 0; i < (qi_test_quick() ? 2 : w->n); i++) {
        int32_t ref[8];
        alone(w, i, &o, ref, w->req[i].n_out);
        ck_assert_msg(!memcmp(ref, r->req[i].tokens, sizeof(int32_t) * (size_t)w->req[i].n_out),
                      "request %ld: batched output differs from alone", i);
    }
    /* the figures are qi_measure_run's over these timelines */
    ck_assert_int_eq(r->run.output_tokens, r->req[0].n_asked + r->req[1].n_asked + r->req[2].n_asked +
                                               r->req[3].n_asked + r->req[4].n_asked);
    ck_assert(r->run.ttft.n == 5 && r->run.ttft.max >= r->run.ttft.min);
    qi_sched_result_free(r);
    qi_engine_free(e);
    qi_workload_free(w);
}
END_TEST

START_TEST(preemption_by_recompute) {
    /* prompts of 60 tokens, 8 out: each crosses into a second 64-token block
     * while decoding; a budget of 3 blocks per stream set admits 3 and must
     * preempt when the first grows */
    qi_workload *w = work(4, 0, "60", "8", 3);
    qi_engine *e = engine(3);
    qi_engine_kv_pool pool;
    qi_engine_kv_pool_stats(e, &pool);
    const size_t set = (size_t)g_model->hp.n_layer * g_model->hp.n_head_kv * pool.block_bytes;
    qi_sched_opts o = opts(3);
    o.kv_budget_bytes = 3 * set;
    qi_sched_result *r = run(e, w, &o);
    ck_assert_int_eq(r->run.n_done, 4);
    ck_assert_msg(r->n_preemptions > 0, "a budget of 3 block sets did not preempt");
    ck_assert_msg(r->peak_kv_bytes <= o.kv_budget_bytes, "peak %zu > budget %zu", r->peak_kv_bytes,
                  o.kv_budget_bytes);
    int preempted = 0;
    for (long i = 0; i < w->n; i++) {
        preempted += r->req[i].preemptions > 0;
        if (qi_test_quick() && r->req[i].preemptions == 0) continue; /* quick: the preempted ones only */
        int32_t ref[8];
        alone(w, i, &o, ref, 8);
        ck_assert_msg(!memcmp(ref, r->req[i].tokens, sizeof ref), "request %ld (preempted %d times) differs", i,
                      r->req[i].preemptions);
    }
    ck_assert_int_gt(preempted, 0);
    qi_sched_result_free(r);
    /* a cap of one preemption: requests preempted more are rejected, with the reason */
    o.max_preemptions = 1;
    o.kv_budget_bytes = 2 * set;
    r = run(e, w, &o);
    for (long i = 0; i < w->n; i++)
        if (r->req[i].t.rejected) ck_assert_msg(strstr(r->req[i].reason, "preempted more than 1"), "%s", r->req[i].reason);
    qi_sched_result_free(r);
    qi_engine_free(e);
    qi_workload_free(w);
}
END_TEST

/* The same workload and budget as preemption_by_recompute, preempted by
 * swap: every preemption a swap (the engine has 3 sequences beyond the
 * batch), every output the recompute run's (which the test above holds to
 * each request alone), and no prompt run twice: the tokens fed as prompts
 * are the prompts, fewer than under recompute, which runs each preempted
 * request's prompt and output again. */
START_TEST(preemption_by_swap) {
    qi_workload *w = work(4, 0, "60", "8", 3);
    qi_engine *e = engine(6);
    qi_engine_kv_pool pool;
    qi_engine_kv_pool_stats(e, &pool);
    const size_t set = (size_t)g_model->hp.n_layer * g_model->hp.n_head_kv * pool.block_bytes;
    qi_sched_opts o = opts(3);
    o.kv_budget_bytes = 3 * set;
    qi_sched_result *rc = run(e, w, &o);
    o.preempt = QI_SCHED_SWAP;
    qi_sched_result *r = run(e, w, &o);
    ck_assert_int_eq(r->run.n_done, 4);
    ck_assert_msg(r->n_swaps > 0, "a budget of 3 block sets swapped nothing");
    ck_assert_int_eq(r->n_swaps, r->n_preemptions);
    ck_assert_int_eq(r->n_recomputes, 0);
    ck_assert_msg(r->peak_kv_bytes <= o.kv_budget_bytes, "peak %zu > budget %zu", r->peak_kv_bytes,
                  o.kv_budget_bytes);
    ck_assert_msg(r->peak_swap_bytes > 0, "nothing was held in the offload tier");
    long prompts = 0;
    for (long i = 0; i < w->n; i++) {
        const qi_sched_req *q = &r->req[i];
        prompts += w->req[i].n_prompt;
        ck_assert_int_eq(q->swaps, q->preemptions);
        ck_assert_int_eq(q->recomputes, 0);
        ck_assert_int_eq(q->prefill_tokens, w->req[i].n_prompt);
        ck_assert_msg(!memcmp(rc->req[i].tokens, q->tokens, sizeof(int32_t) * 8),
                      "request %ld (swapped %d times) differs from its output under recompute", i, q->swaps);
    }
    ck_assert_int_eq(r->prefill_tokens, prompts);
    ck_assert_msg(rc->n_recomputes > 0 && rc->n_swaps == 0, "recompute: %ld recomputes, %ld swaps", rc->n_recomputes,
                  rc->n_swaps);
    ck_assert_msg(rc->prefill_tokens > r->prefill_tokens, "recompute fed %ld prompt tokens, swap %ld",
                  rc->prefill_tokens, r->prefill_tokens);
    qi_sched_result_free(r);
    qi_sched_result_free(rc);
    qi_engine_free(e);
    /* an engine with no sequence beyond the batch: every preemption is a recompute */
    e = engine(3);
    r = run(e, w, &o);
    ck_assert_int_eq(r->run.n_done, 4);
    ck_assert_int_eq(r->n_swaps, 0);
    ck_assert_int_gt(r->n_recomputes, 0);
    qi_sched_result_free(r);
    qi_engine_free(e);
    qi_workload_free(w);
}
END_TEST

/* Greedy tokens of sequence id, n of them, from its last logits on. */
static void decode(qi_engine *e, int id, int32_t *out, int n) {
    const int V = g_model->hp.n_vocab;
    qi_err err = {0};
    for (int k = 0; k < n; k++) {
        out[k] = qi_argmax(qi_engine_seq_logits(e, id, -1), V);
        ck_assert_msg(qi_engine_seq_feed(e, id, &out[k], 1, false, &err) == QI_OK, "%s", err.msg);
        ck_assert_msg(qi_engine_step(e, NULL, &err) == QI_OK, "%s", err.msg);
    }
}

/* The engine's swap on its own: a sequence swapped out after its prompt
 * (70 tokens: two blocks per stream) holds no working KV, is skipped by
 * the steps that run another, and once swapped in decodes the tokens, and
 * the logits bit for bit, of the same sequence never swapped; on the CPU,
 * with every attention on the second device (its working tier there, the
 * copies on its stream; a copy failing there fails the swap and undoes
 * it), and under Q-Infer's policy, whose offload tier already holds tokens
 * when the working ones join them. A pool cap too small for the offload copy
 * refuses the swap and leaves the sequence as it was. */
START_TEST(swap_keeps_logits) {
    char every[16]; /* every layer on testdev */
    snprintf(every, sizeof every, "ngl=%d", g_model->hp.n_layer);
    const char *const devs[][3] = {{NULL, NULL, NULL}, {"cpu,testdev", every, NULL}, {NULL, NULL, "qinfer"}};
    const int V = g_model->hp.n_vocab;
    int32_t prompt[70];
    for (int k = 0; k < 70; k++) prompt[k] = 1 + (k * 53) % 900;
    for (int c = 0; c < 3; c++) {
        qi_engine *e = engine_with(2, devs[c][0], devs[c][1], 0, devs[c][2], devs[c][2] ? 40 : 0);
        qi_err err = {0};
        int a, b;
        ck_assert_int_eq(qi_engine_seq_add(e, &a, &err), QI_OK);
        ck_assert_int_eq(qi_engine_seq_feed(e, a, prompt, 70, false, &err), QI_OK);
        ck_assert_msg(qi_engine_step(e, NULL, &err) == QI_OK, "%s", err.msg);
        int32_t ref[6], got[6];
        float *ref_logits = qi_malloc(sizeof(float) * (size_t)V);
        ck_assert_ptr_nonnull(ref_logits);
        decode(e, a, ref, 6);
        memcpy(ref_logits, qi_engine_seq_logits(e, a, -1), sizeof(float) * (size_t)V);
        ck_assert_int_eq(qi_engine_seq_remove(e, a, &err), QI_OK);

        ck_assert_int_eq(qi_engine_seq_add(e, &a, &err), QI_OK);
        ck_assert_int_eq(qi_engine_seq_feed(e, a, prompt, 70, false, &err), QI_OK);
        ck_assert_msg(qi_engine_step(e, NULL, &err) == QI_OK, "%s", err.msg);
        decode(e, a, got, 2);
        int32_t next = qi_argmax(qi_engine_seq_logits(e, a, -1), V);
        ck_assert_int_eq(qi_engine_seq_feed(e, a, &next, 1, false, &err), QI_OK);
        ck_assert_int_eq(qi_engine_seq_swap_in(e, a, &err), QI_ERR_INVALID);
        qi_engine_kv_seq ks;
        qi_engine_kv_seq_stats(e, a, &ks);
        const long work = ks.work_tokens, off = ks.off_tokens;
        ck_assert_msg(c < 2 ? off == 0 : off > 0, "config %d: %ld tokens offloaded by the policy", c, off);
        if (c == 1) { /* a copy that fails on the device's stream, some streams in: the swap fails, undone */
            qi_engine_inject_fail(e, 1, 0, 1000);
            ck_assert_int_eq(qi_engine_seq_swap_out(e, a, &err), QI_ERR_BACKEND);
            ck_assert_msg(strstr(err.msg, "injected failure"), "%s", err.msg);
            ck_assert(!qi_engine_seq_swapped(e, a));
            qi_engine_kv_seq_stats(e, a, &ks);
            ck_assert_msg(ks.work_tokens == work && ks.off_tokens == 0, "after a failed swap: %ld and %ld tokens",
                          ks.work_tokens, ks.off_tokens);
        }
        ck_assert_msg(qi_engine_seq_swap_out(e, a, &err) == QI_OK, "%s", err.msg);
        ck_assert(qi_engine_seq_swapped(e, a));
        ck_assert_int_eq(qi_engine_seq_swap_out(e, a, &err), QI_ERR_INVALID);
        qi_engine_kv_seq_stats(e, a, &ks);
        ck_assert_msg(ks.work_bytes == 0 && ks.work_tokens == 0 && ks.off_tokens == work + off,
                      "swapped out: %ld working and %ld offloaded tokens, of %ld and %ld", ks.work_tokens,
                      ks.off_tokens, work, off);
        /* another sequence runs; the swapped one waits with its token pending */
        ck_assert_int_eq(qi_engine_seq_add(e, &b, &err), QI_OK);
        ck_assert_int_eq(qi_engine_seq_feed(e, b, prompt, 9, false, &err), QI_OK);
        int n_tok;
        ck_assert_msg(qi_engine_step(e, &n_tok, &err) == QI_OK, "%s", err.msg);
        ck_assert_int_eq(n_tok, 9);
        ck_assert_int_eq(qi_engine_seq_pending(e, a), 1);
        ck_assert_int_eq(qi_engine_seq_remove(e, b, &err), QI_OK);
        ck_assert_msg(qi_engine_seq_swap_in(e, a, &err) == QI_OK, "%s", err.msg);
        ck_assert(!qi_engine_seq_swapped(e, a));
        qi_engine_kv_seq_stats(e, a, &ks);
        ck_assert_msg(ks.work_tokens == work && ks.off_tokens == off, "swapped in: %ld and %ld tokens, of %ld and %ld",
                      ks.work_tokens, ks.off_tokens, work, off);
        ck_assert_msg(qi_engine_step(e, NULL, &err) == QI_OK, "%s", err.msg);
        got[2] = next;
        decode(e, a, got + 3, 3);
        ck_assert_msg(!memcmp(ref, got, sizeof ref), "config %d: tokens differ after a swap", c);
        ck_assert_msg(!memcmp(ref_logits, qi_engine_seq_logits(e, a, -1), sizeof(float) * (size_t)V),
                      "config %d: logits differ after a swap", c);
        ck_assert_int_eq(qi_engine_seq_remove(e, a, &err), QI_OK);
        qi_engine_kv_pool pool;
        qi_engine_kv_pool_stats(e, &pool);
        ck_assert_int_eq(pool.work_blocks + pool.off_blocks, 0);
        qi_free(ref_logits);
        qi_engine_free(e);
    }
    /* a cap of 2 block sets and a block: the prompt holds the sets, and the
     * first stream's copy (2 blocks, its working ones freed after) does not fit */
    qi_engine *e = engine(1);
    qi_engine_kv_pool pool;
    qi_engine_kv_pool_stats(e, &pool);
    const size_t set = (size_t)g_model->hp.n_layer * g_model->hp.n_head_kv * pool.block_bytes;
    qi_engine_free(e);
    e = engine_on(1, NULL, NULL, 2 * set + pool.block_bytes);
    qi_err err = {0};
    int a;
    ck_assert_int_eq(qi_engine_seq_add(e, &a, &err), QI_OK);
    ck_assert_int_eq(qi_engine_seq_feed(e, a, prompt, 70, false, &err), QI_OK);
    ck_assert_msg(qi_engine_step(e, NULL, &err) == QI_OK, "%s", err.msg);
    ck_assert_int_eq(qi_engine_seq_swap_out(e, a, &err), QI_ERR_NOMEM);
    ck_assert_msg(strstr(err.msg, "KV cache full"), "%s", err.msg);
    ck_assert(!qi_engine_seq_swapped(e, a));
    qi_engine_kv_seq ks;
    qi_engine_kv_seq_stats(e, a, &ks);
    ck_assert_int_eq(ks.off_tokens, 0);
    ck_assert_int_eq(ks.work_tokens, 70L * g_model->hp.n_layer * g_model->hp.n_head_kv);
    qi_engine_kv_pool_stats(e, &pool);
    ck_assert_int_eq(pool.off_blocks, 0);
    int32_t t1[2];
    decode(e, a, t1, 2); /* still runs */
    qi_engine_free(e);
}
END_TEST

START_TEST(step_token_limit) {
    /* prompts of 40: under a limit of 50 tokens a step, a second prompt is
     * admitted only once the first is decoding (1 + 40 <= 50), so it starts
     * after the first's first token; without the limit both start at once */
    qi_workload *w = work(3, 0, "40", "3", 6);
    qi_engine *e = engine(3);
    qi_sched_opts o = opts(3);
    qi_sched_result *r = run(e, w, &o);
    ck_assert_msg(r->req[1].t.start < r->req[0].t.token_t[0], "no limit: admitted together");
    qi_sched_result_free(r);
    o.max_step_tokens = 50;
    r = run(e, w, &o);
    ck_assert_int_eq(r->run.n_done, 3);
    for (long i = 1; i < 3; i++)
        ck_assert_msg(r->req[i].t.start >= r->req[i - 1].t.token_t[0], "request %ld admitted beside a prompt", i);
    qi_sched_result_free(r);
    qi_engine_free(e);
    qi_workload_free(w);
}
END_TEST

START_TEST(rejections_have_reasons) {
    qi_engine *e = engine(2);
    /* the queue holds 2: of 6 arriving at once with one admitted at a time, 4 wait too many */
    qi_workload *w = work(6, 0, "8", "2", 4);
    qi_sched_opts o = opts(1);
    o.queue_limit = 2;
    qi_sched_result *r = run(e, w, &o);
    ck_assert_int_eq(r->run.n_rejected, 4);
    for (long i = 2; i < 6; i++) ck_assert_str_eq(r->req[i].reason, "queue full");
    qi_sched_result_free(r);
    qi_workload_free(w);
    /* longer than the context */
    w = work(2, 0, "150", "20", 4);
    o = opts(2);
    r = run(e, w, &o);
    ck_assert_int_eq(r->run.n_rejected, 2);
    ck_assert_msg(strstr(r->req[0].reason, "exceed the context of 160"), "%s", r->req[0].reason);
    qi_sched_result_free(r);
    qi_workload_free(w);
    /* bigger than the whole budget */
    w = work(2, 0, "100", "4", 4);
    o = opts(2);
    qi_engine_kv_pool pool;
    qi_engine_kv_pool_stats(e, &pool);
    o.kv_budget_bytes = (size_t)g_model->hp.n_layer * g_model->hp.n_head_kv * pool.block_bytes; /* one block set */
    r = run(e, w, &o);
    ck_assert_int_eq(r->run.n_rejected, 2);
    ck_assert_msg(strstr(r->req[1].reason, "more KV memory than the budget"), "%s", r->req[1].reason);
    qi_sched_result_free(r);
    qi_workload_free(w);
    qi_engine_free(e);
}
END_TEST

START_TEST(online_arrivals_waited_for) {
    /* 6 requests at 40 per second: about 0.15 s of arrivals */
    qi_workload *w = work(6, 40, "8", "3", 9);
    qi_engine *e = engine(4);
    qi_sched_opts o = opts(4);
    o.slo = (qi_slo){.ttft_s = 60, .tpot_s = 60};
    qi_sched_result *r = run(e, w, &o);
    ck_assert_int_eq(r->run.n_done, 6);
    ck_assert_int_eq(r->run.n_good, 6);
    for (long i = 0; i < w->n; i++) ck_assert(r->req[i].t.start >= w->req[i].arrival_s);
    ck_assert(r->run.duration_s >= w->req[5].arrival_s - w->req[0].arrival_s);
    qi_sched_result_free(r);
    qi_engine_free(e);
    qi_workload_free(w);
}
END_TEST

START_TEST(bad_options_refused) {
    qi_engine *e = engine(1);
    qi_workload *w = work(1, 0, "8", "2", 1);
    qi_sched_result *r = NULL;
    qi_err err = {0};
    qi_sched_opts o = opts(0);
    ck_assert_int_eq(qi_sched_run(e, g_model, w, &o, &r, &err), QI_ERR_INVALID);
    ck_assert_ptr_null(r);
    int32_t corpus[4] = {1, 2, 3, 4};
    o = opts(1);
    o.corpus = corpus;
    o.n_corpus = 4; /* a prompt of 8 does not fit */
    err = (qi_err){0};
    ck_assert_int_eq(qi_sched_run(e, g_model, w, &o, &r, &err), QI_ERR_INVALID);
    ck_assert_msg(strstr(err.msg, "outside the corpus"), "%s", err.msg);
    o = opts(1);
    o.preempt = (qi_sched_preempt)7;
    err = (qi_err){0};
    ck_assert_int_eq(qi_sched_run(e, g_model, w, &o, &r, &err), QI_ERR_INVALID);
    ck_assert_msg(strstr(err.msg, "preemption policy"), "%s", err.msg);
    ck_assert_int_eq(qi_sched_preempt_parse("swap"), QI_SCHED_SWAP);
    ck_assert_int_eq(qi_sched_preempt_parse("recompute"), QI_SCHED_RECOMPUTE);
    ck_assert_int_eq(qi_sched_preempt_parse("Swap"), -1);
    qi_workload_free(w);
    qi_engine_free(e);
}
END_TEST

START_TEST(online_submit_push_cancel) {
    /* the online calls as a server uses them: requests submitted between
     * steps, the caller choosing each token, one cancelled while waiting and
     * one while running; a budget of 2 block sets preempts, and the rows of
     * a prompt_logits request name their positions, after a recompute too */
    qi_engine *e = engine(3);
    qi_engine_kv_pool pool;
    qi_engine_kv_pool_stats(e, &pool);
    const size_t set = (size_t)g_model->hp.n_layer * g_model->hp.n_head_kv * pool.block_bytes;
    qi_sched_opts o = opts(3);
    o.kv_budget_bytes = 2 * set;
    qi_sched *s = NULL;
    qi_err err = {0};
    ck_assert_msg(qi_sched_create(e, g_model, &o, &s, &err) == QI_OK, "%s", err.msg);
    const int V = g_model->hp.n_vocab;
    int32_t prompt[60];
    for (int k = 0; k < 60; k++) prompt[k] = 1 + (k * 37) % 500;
    long id[5];
    int n_out[5] = {0}, seen_rows[5] = {0};
    /* 0 and 1 cross into a second block while decoding: with 2 block sets, one is preempted */
    ck_assert_int_eq(qi_sched_submit(s, prompt, 60, 8, true, &id[0], &err), QI_OK);
    ck_assert_int_eq(qi_sched_submit(s, prompt, 60, 8, false, &id[1], &err), QI_OK);
    ck_assert_int_eq(id[0], 0);
    ck_assert_int_eq(id[1], 1);
    /* not ready before a step: a token is refused */
    ck_assert_int_eq(qi_sched_push(s, id[0], 5, &err), QI_ERR_INVALID);
    /* longer than the context: an id, rejected with the reason */
    int32_t big[170] = {0};
    ck_assert_int_eq(qi_sched_submit(s, big, 150, 20, false, &id[4], &err), QI_OK);
    const char *why;
    ck_assert_int_eq(qi_sched_req_state(s, id[4], &why), QI_SCHED_REJECTED);
    ck_assert_msg(strstr(why, "exceed the context"), "%s", why);
    qi_sched_end(s, id[4]);
    ck_assert_int_eq(qi_sched_req_state(s, id[4], NULL), QI_SCHED_ENDED);
    bool ended[5] = {false, false, false, false, true};
    for (int step = 0; step < 400 && !(ended[0] && ended[1] && ended[2] && ended[3]); step++) {
        if (step == 1) {
            ck_assert_int_eq(qi_sched_submit(s, prompt, 8, 4, false, &id[2], &err), QI_OK);
            ck_assert_int_eq(qi_sched_submit(s, prompt, 8, 50, false, &id[3], &err), QI_OK);
        }
        if (step == 1) { /* cancelled while waiting (the batch of 3 is full) */
            ck_assert_int_eq(qi_sched_req_state(s, id[2], NULL), QI_SCHED_WAITING);
        }
        int n;
        ck_assert_msg(qi_sched_step(s, &n, &err) == QI_OK, "%s", err.msg);
        for (int k = 0; k < 4; k++) {
            if (ended[k] || (k >= 2 && step < 1)) continue;
            ck_assert_int_ne(qi_sched_req_state(s, id[k], NULL), QI_SCHED_REJECTED);
            if (k == 0) { /* prompt rows: position first + j; every prompt position once at least */
                int first, rows = qi_sched_n_logits(s, id[0], &first);
                for (int j = 0; j < rows; j++)
                    if (first + j < 60) seen_rows[0] |= 1;
                if (rows > 1) ck_assert_int_eq(first + rows, 60 + n_out[0]);
            }
            if (!qi_sched_req_ready(s, id[k])) continue;
            if (k == 3 && n_out[3] == 5) { /* cancelled while running */
                qi_sched_end(s, id[k]);
                ended[k] = true;
                continue;
            }
            const int32_t tok = qi_argmax(qi_sched_logits(s, id[k], -1), V);
            if (++n_out[k] == (k == 2 ? 4 : 8) && k != 3) {
                qi_sched_end(s, id[k]);
                ended[k] = true;
            } else {
                ck_assert_msg(qi_sched_push(s, id[k], tok, &err) == QI_OK, "%s", err.msg);
            }
        }
        ck_assert_msg(qi_sched_peak_kv_bytes(s) <= o.kv_budget_bytes, "peak %zu > budget %zu",
                      qi_sched_peak_kv_bytes(s), o.kv_budget_bytes);
    }
    ck_assert_msg(ended[0] && ended[1] && ended[2] && ended[3], "requests left unfinished");
    ck_assert_int_eq(seen_rows[0], 1);
    ck_assert_msg(qi_sched_n_preemptions(s) > 0, "a budget of 2 block sets did not preempt");
    ck_assert_int_eq(qi_sched_n_running(s), 0);
    ck_assert_int_eq(qi_sched_n_waiting(s), 0);
    qi_sched_free(s);
    qi_engine_kv_pool_stats(e, &pool);
    ck_assert_msg(pool.work_blocks == 0 && pool.off_blocks == 0, "%ld blocks left behind",
                  pool.work_blocks + pool.off_blocks);
    /* a request cancelled while waiting leaves the queue at once */
    ck_assert_int_eq(qi_sched_create(e, g_model, &o, &s, &err), QI_OK);
    ck_assert_int_eq(qi_sched_submit(s, prompt, 8, 4, false, &id[0], &err), QI_OK);
    ck_assert_int_eq(qi_sched_n_waiting(s), 1);
    qi_sched_end(s, id[0]);
    ck_assert_int_eq(qi_sched_n_waiting(s), 0);
    int n;
    ck_assert_int_eq(qi_sched_step(s, &n, &err), QI_OK);
    ck_assert_int_eq(n, 0);
    /* freed while running: its blocks go too */
    ck_assert_int_eq(qi_sched_submit(s, prompt, 8, 4, false, &id[1], &err), QI_OK);
    ck_assert_int_eq(qi_sched_step(s, &n, &err), QI_OK);
    ck_assert_int_eq(qi_sched_n_running(s), 1);
    qi_sched_free(s);
    qi_engine_kv_pool_stats(e, &pool);
    ck_assert_int_eq(pool.work_blocks + pool.off_blocks, 0);
    qi_engine_free(e);
}
END_TEST

int main(void) {
    g_model = qi_test_synth(QI_TEST_SYNTH_SMOL);
    if (!g_model) return 1;
    Suite *su = suite_create("sched");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, batching_keeps_each_output);
    tcase_add_test(tc, preemption_by_recompute);
    tcase_add_test(tc, preemption_by_swap);
    tcase_add_test(tc, swap_keeps_logits);
    tcase_add_test(tc, step_token_limit);
    tcase_add_test(tc, rejections_have_reasons);
    tcase_add_test(tc, online_arrivals_waited_for);
    tcase_add_test(tc, bad_options_refused);
    tcase_add_test(tc, online_submit_push_cancel);
    suite_add_tcase(su, tc);
    int rc = qi_test_run_suite(su);
    qi_model_free(g_model);
    return rc;
}

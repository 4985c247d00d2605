/* test_engine.c - the batched engine and its paged, policy-driven KV cache.
 *
 * On the cached SmolLM2-135M (skipped, exit 77, when it is absent):
 *   - with the full policy one sequence's logits are bit-identical to the
 *     single-sequence engine's (qi_ctx) over a multi-chunk prompt and decode
 *     steps;
 *   - 16 sequences decoded together give the same tokens and bit-identical
 *     logits as 16 separate runs, with sequences joining mid-way, with
 *     plain and with packed weights (these three bit for bit on the
 *     synthetic SmolLM2 shape of testutil.h: true for any weights; packed
 *     weights' distributions close to the plain ones' on the real model);
 *   - every policy keeps each stream within its budget, the accounting adds
 *     up, and offloading policies fill the offload tier;
 *   - under a budgeted policy a multi-chunk prompt gives the same logits
 *     beside a decoding neighbour as alone;
 *   - under h2o and qinfer, evicting from the first chunk on, a batch of
 *     sequences (some joining while others decode) gives the logits, kept
 *     tokens and policy scores of the runs alone, bit for bit;
 *   - quest (attention reads the blocks it picks, nothing evicted) with a
 *     budget that covers the whole cache gives the full policy's logits
 *     bit for bit, and with a smaller one reads exactly the blocks its
 *     rule allows; 16 sequences under quest equal 16 separate runs;
 *   - a KV memory cap fails the step with a clear error and marks the
 *     sequences failed, and bad options, ids and feeds are errors (quest on
 *     a device other than the CPU is refused at creation).
 * The KV policies' checks (the "policies" case: the budget, the three
 * after it, and the prompt judged at its end) are bit for bit or of
 * accounting, true for any weights, and run on the synthetic SmolLM2 shape
 * of testutil.h, which needs no fetched model.
 * On the synthetic Gemma 3 shape (testutil.h): the ring of the
 * sliding-window layers wraps (prompt past 1024 positions) and the logits
 * still equal qi_ctx's; on the cached Gemma 3 270M, its packed weights.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "qinfer/engine.h"
#include "qinfer/perplexity.h"
#include "qinfer/model.h"
#include "qinfer/params.h"
#include "testutil.h"

#define SMOL_FILE "models/SmolLM2-135M-Instruct.Q4_1.gguf"
#define GEMMA_FILE "models/gemma-3-270m-q4_k_m.gguf"

static qi_model *g_model;
/* the synthetic SmolLM2 shape (testutil.h) beside the real model in the
 * "engine" case: its bit-for-bit checks hold for any weights */
static qi_model *g_synth;

static qi_model *load(const char *file) { return qi_test_load_cached(file); }

/* Deterministic token ids in the vocabulary (not text: the engine does not
 * care, and any ids exercise the same arithmetic). */
static void make_ids(int32_t *ids, int n, uint64_t seed, int V) {
    uint64_t st = seed * 2654435761u + 1;
    for (int i = 0; i < n; i++) ids[i] = (int32_t)(qi_test_rand(&st) % (uint64_t)(V > 4000 ? 4000 : V));
}

/* KL(a || b) in nats between the softmaxes of two rows of V logits. */
static double kl_logits(const float *a, const float *b, int V) {
    double ma = a[0], mb = b[0], za = 0, zb = 0, kl = 0;
    for (int v = 1; v < V; v++) {
        ma = fmax(ma, a[v]);
        mb = fmax(mb, b[v]);
    }
    for (int v = 0; v < V; v++) {
        za += exp(a[v] - ma);
        zb += exp(b[v] - mb);
    }
    for (int v = 0; v < V; v++) {
        const double la = a[v] - ma - log(za), lb = b[v] - mb - log(zb);
        kl += exp(la) * (la - lb);
    }
    return kl;
}

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* Engines make_engine creates pack their weights (opts.repack): set by the
 * packed-weight tests around their runs. */
static bool g_repack;

static qi_engine *make_engine(const qi_model *m, const char *policy, const char *params, int budget, double frac,
                              int n_ctx, int max_seqs) {
    qi_engine_opts o;
    qi_engine_opts_default(&o);
    o.n_threads = 2;
    o.repack = g_repack;
    o.n_ctx = n_ctx;
    o.max_seqs = max_seqs;
    o.kv_policy = policy;
    qi_params p;
    qi_params_init(&p);
    qi_err e = {0};
    if (params) ck_assert_msg(qi_params_parse(&p, params, &e) == QI_OK, "%s", e.msg);
    o.kv_params = &p;
    o.kv_budget_tokens = budget;
    o.kv_budget_frac = frac;
    qi_engine *eng = NULL;
    ck_assert_msg(qi_engine_create(m, &o, &eng, &e) == QI_OK, "%s", e.msg);
    if (g_repack) ck_assert_int_eq(qi_engine_n_packed(eng), qi_model_n_packable(m));
    return eng;
}

/* Compare the engine's logits for a prompt (logits_all) and greedy decode
 * steps with qi_ctx's, bit for bit. */
static void same_as_ctx(const qi_model *m, int n_prompt, int n_decode, int n_ctx) {
    const int V = m->hp.n_vocab;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)n_prompt);
    make_ids(ids, n_prompt, 7, V);
    qi_err e = {0};
    qi_ctx *c = NULL;
    ck_assert_int_eq(qi_ctx_create(m, n_ctx, 2, &c, &e), QI_OK);
    qi_engine *eng = make_engine(m, "full", NULL, 0, 0.0, n_ctx, 2);
    int id;
    ck_assert_int_eq(qi_engine_seq_add(eng, &id, &e), QI_OK);
    ck_assert_int_eq(qi_ctx_eval(c, ids, n_prompt, true, &e), QI_OK);
    ck_assert_int_eq(qi_engine_seq_feed(eng, id, ids, n_prompt, true, &e), QI_OK);
    int done = 0, checked = 0;
    while (qi_engine_seq_pending(eng, id) > 0) {
        ck_assert_msg(qi_engine_step(eng, NULL, &e) == QI_OK, "%s", e.msg);
        const int nl = qi_engine_seq_n_logits(eng, id);
        for (int i = 0; i < nl; i++) {
            const float *a = qi_ctx_logits(c, done + i), *b = qi_engine_seq_logits(eng, id, i);
            ck_assert_ptr_nonnull(a);
            ck_assert_ptr_nonnull(b);
            ck_assert_msg(memcmp(a, b, sizeof(float) * (size_t)V) == 0, "prompt row %d differs", done + i);
            checked++;
        }
        done += nl;
    }
    ck_assert_int_eq(checked, n_prompt);
    int32_t tok = argmax(qi_ctx_logits(c, -1), V);
    for (int s = 0; s < n_decode; s++) {
        ck_assert_int_eq(qi_ctx_eval(c, &tok, 1, false, &e), QI_OK);
        ck_assert_int_eq(qi_engine_seq_feed(eng, id, &tok, 1, false, &e), QI_OK);
        ck_assert_int_eq(qi_engine_step(eng, NULL, &e), QI_OK);
        ck_assert_int_eq(qi_engine_seq_n_logits(eng, id), 1);
        ck_assert_msg(memcmp(qi_ctx_logits(c, -1), qi_engine_seq_logits(eng, id, -1), sizeof(float) * (size_t)V) == 0,
                      "decode step %d differs", s);
        tok = argmax(qi_ctx_logits(c, -1), V);
    }
    printf("engine (full policy) vs single-sequence engine: %d prompt rows and %d decode steps bit-identical\n",
           n_prompt, n_decode);
    qi_engine_free(eng);
    qi_ctx_free(c);
    free(ids);
}

START_TEST(full_policy_equals_ctx) {
    ck_assert_ptr_nonnull(g_synth);
    same_as_ctx(g_synth, qi_test_quick() ? 40 : 700, qi_test_quick() ? 4 : 24, 1024);
}
END_TEST

/* 16 sequences with different prompts decoded together (four of them join
 * after a few steps) against each run alone, under the full policy, or
 * under `policy` with a budget of `budget` tokens and prompts `plen0`
 * tokens longer. */
static void batched_vs_separate_under(const qi_model *m, const char *what, const char *policy, const char *params,
                                      int budget, int plen0) {
    const int S = qi_test_quick() ? 4 : 16, G = qi_test_quick() ? 4 : 16, V = m->hp.n_vocab;
    static int32_t prompts[16][40 + 160];
    int plen[16];
    int32_t alone[16][16];
    float *alone_logits = malloc(sizeof(float) * (size_t)S * G * V);
    qi_err e = {0};
    ck_assert_int_le(plen0, 160);
    for (int s = 0; s < S; s++) {
        plen[s] = plen0 + 5 + 2 * s;
        make_ids(prompts[s], plen[s], 100 + (uint64_t)s, V);
    }
    /* alone */
    qi_engine *one = make_engine(m, policy, params, budget, 0.0, 256, 1);
    for (int s = 0; s < S; s++) {
        int id;
        ck_assert_int_eq(qi_engine_seq_add(one, &id, &e), QI_OK);
        ck_assert_int_eq(qi_engine_seq_feed(one, id, prompts[s], plen[s], false, &e), QI_OK);
        for (int g = 0; g < G; g++) {
            while (qi_engine_seq_pending(one, id) > 0) ck_assert_int_eq(qi_engine_step(one, NULL, &e), QI_OK);
            const float *lg = qi_engine_seq_logits(one, id, -1);
            memcpy(alone_logits + ((size_t)s * G + g) * V, lg, sizeof(float) * (size_t)V);
            alone[s][g] = argmax(lg, V);
            ck_assert_int_eq(qi_engine_seq_feed(one, id, &alone[s][g], 1, false, &e), QI_OK);
        }
        ck_assert_int_eq(qi_engine_seq_remove(one, id, &e), QI_OK);
    }
    qi_engine_free(one);
    /* together */
    qi_engine *eng = make_engine(m, policy, params, budget, 0.0, 256, 16);
    int ids[16], got[16] = {0};
    const int late = S / 4; /* the last `late` sequences join after 3 steps */
    for (int s = 0; s < S - late; s++) {
        ck_assert_int_eq(qi_engine_seq_add(eng, &ids[s], &e), QI_OK);
        ck_assert_int_eq(qi_engine_seq_feed(eng, ids[s], prompts[s], plen[s], false, &e), QI_OK);
    }
    int steps = 0, max_batch = 0, agree = 0;
    for (;;) {
        if (steps == 3)
            for (int s = S - late; s < S; s++) {
                ck_assert_int_eq(qi_engine_seq_add(eng, &ids[s], &e), QI_OK);
                ck_assert_int_eq(qi_engine_seq_feed(eng, ids[s], prompts[s], plen[s], false, &e), QI_OK);
            }
        int n;
        ck_assert_msg(qi_engine_step(eng, &n, &e) == QI_OK, "%s", e.msg);
        steps++;
        if (n == 0 && steps > 3) break;
        int in_batch = 0;
        for (int s = 0; s < S; s++) {
            if (steps <= 3 && s >= S - late) continue;
            if (qi_engine_seq_n_logits(eng, ids[s]) == 0) continue;
            in_batch++;
            const int g = got[s];
            const float *lg = qi_engine_seq_logits(eng, ids[s], -1);
            ck_assert_msg(memcmp(lg, alone_logits + ((size_t)s * G + g) * V, sizeof(float) * (size_t)V) == 0,
                          "sequence %d step %d: logits differ from its run alone", s, g);
            const int32_t tok = argmax(lg, V);
            agree += tok == alone[s][g];
            got[s]++;
            if (got[s] < G) ck_assert_int_eq(qi_engine_seq_feed(eng, ids[s], &tok, 1, false, &e), QI_OK);
        }
        if (in_batch > max_batch) max_batch = in_batch;
    }
    for (int s = 0; s < S; s++) ck_assert_int_eq(got[s], G);
    ck_assert_int_eq(agree, S * G);
    ck_assert_int_eq(max_batch, S);
    long attn = 0, work = 0;
    for (int s = 0; s < S; s++) {
        qi_engine_kv_seq st;
        qi_engine_kv_seq_stats(eng, ids[s], &st);
        attn += st.attn_tokens;
        work += st.work_tokens;
    }
    printf("batched%s: %d sequences x %d greedy tokens, %d/%d tokens and all logits identical to separate runs "
           "(largest batch %d; the last steps read %ld of %ld working KV tokens)\n",
           what, S, G, agree, S * G, max_batch, attn, work);
    if (strcmp(policy, "full") != 0) ck_assert_msg(attn < work, "%s: every working token was read", what);
    qi_engine_free(eng);
    free(alone_logits);
}

static void batched_vs_separate(const qi_model *m, const char *what) {
    batched_vs_separate_under(m, what, "full", NULL, 0, 0);
}

START_TEST(batched_equals_separate) {
    ck_assert_ptr_nonnull(g_synth);
    batched_vs_separate(g_synth, "");
}
END_TEST

/* The packed order (contexts with repack) against the x86 order on a
 * paragraph: mean KL under 1e-2 nats, the same top token on nine rows in
 * ten, and not identical everywhere (which would mean the packed kernels
 * did not run). */
static void packed_close_to_plain(const qi_model *m, const char *what) {
    static const char text[] =
        "The river runs past the old mill, where the miller once ground wheat for the whole valley. "
        "In winter the water freezes at the edges, and children slide on the ice while their parents "
        "carry bread and firewood up the hill. Every spring the snow melts, the river rises, and the "
        "wheel turns again as it has for two hundred years.";
    int32_t *ids = NULL;
    size_t n_ids = 0;
    qi_err e = {0};
    ck_assert_int_eq(qi_tokenize(m->tok, text, strlen(text), true, false, &ids, &n_ids, &e), QI_OK);
    const int n = (int)n_ids, V = m->hp.n_vocab;
    qi_ctx *cx = NULL, *cp = NULL;
    const qi_ctx_opts po = {.n_ctx = 128, .n_threads = 2, .repack = true};
    ck_assert_int_eq(qi_ctx_create(m, 128, 2, &cx, &e), QI_OK);
    ck_assert_msg(qi_ctx_create_opts(m, &po, &cp, &e) == QI_OK, "%s", e.msg);
    ck_assert_int_eq(qi_ctx_eval(cx, ids, n, true, &e), QI_OK);
    ck_assert_int_eq(qi_ctx_eval(cp, ids, n, true, &e), QI_OK);
    double kl_sum = 0, kl_max = 0;
    int same_top = 0, identical = 0;
    for (int i = 0; i < n; i++) {
        const float *a = qi_ctx_logits(cx, i), *b = qi_ctx_logits(cp, i);
        const double kl = kl_logits(a, b, V);
        kl_sum += kl;
        kl_max = fmax(kl_max, kl);
        same_top += argmax(a, V) == argmax(b, V);
        identical += memcmp(a, b, sizeof(float) * (size_t)V) == 0;
    }
    printf("%s: packed vs x86 order, %d tokens of text: mean KL %.2e nats (max %.2e), same top token %d/%d\n", what,
           n, kl_sum / n, kl_max, same_top, n);
    ck_assert_msg(kl_sum / n < 1e-2, "%s: packed order strays: mean KL %.3g nats", what, kl_sum / n);
    ck_assert_int_ge(same_top, n - n / 10);
    ck_assert_msg(identical < n, "packed logits equal the x86 order's on every row: the packed kernels did not run");
    qi_free(ids);
    qi_ctx_free(cx);
    qi_ctx_free(cp);
}

/* Repacked weights (opts.repack): the packed order does not depend on
 * the batch, so a batch of 16 still equals the runs alone bit for bit; and
 * its next-token distributions stay close to the x86 order's without being
 * the same (the packed kernels really ran). "Close" is set by llama.cpp's
 * own orders: on this text, its x86 order and ggml's generic order (what
 * other CPUs run) are 3.75e-3 nats apart in mean KL, with the same top
 * token on 67 of 69 rows. A summation order moves the 8-bit activation
 * quants that sit on a rounding boundary, and in SmolLM2's outlier blocks
 * (values near 2e4, one quant step about 160) such a flip is no longer a
 * rounding-sized change. */
START_TEST(packed_batched_equals_separate) {
    if (!g_model) return;
    ck_assert_ptr_nonnull(g_synth);
    ck_assert_int_eq(qi_model_n_packable(g_model), 7 * g_model->hp.n_layer + 1);
    ck_assert_int_eq(qi_model_n_packable(g_synth), 7 * g_synth->hp.n_layer + 1);
    g_repack = true; /* make_engine checks that every packable matrix was packed */
    batched_vs_separate(g_synth, " (packed weights)"); /* bit for bit: any weights of SmolLM2's types */
    g_repack = false;
    packed_close_to_plain(g_model, "SmolLM2"); /* to a tolerance: the real weights */
}
END_TEST

/* Each policy on a 200-token prompt fed token by token: working tokens of
 * every budgeted stream stay within the budget; offloading policies use the
 * offload tier; the pool accounting matches the streams'. */
/* quest's decode steps read the pages it picks through the same
 * attention call: a batch of 16 (prompts of 125 to 155 tokens, a budget of
 * 100 tokens) gives each sequence's logits alone, bit for bit, with pages
 * of 16 tokens (the default: the newest page and up to five others, read
 * as pieces of the cache's blocks), of 64 (page=64: two or three blocks,
 * the newest and at most one other) and with dense first layers whose
 * reads come out of the other layers' budgets
 * (full_layers=2,full_share=true). */
START_TEST(quest_batched_equals_separate) {
    if (!g_model) return;
    batched_vs_separate_under(g_model, " (quest, pages of 16, budget 100)", "quest", NULL, 100, 120);
    batched_vs_separate_under(g_model, " (quest page=64, budget 100)", "quest", "page=64", 100, 120);
    batched_vs_separate_under(g_model, " (quest full_layers=2,full_share=true,page=16, budget 100)", "quest",
                              "full_layers=2,full_share=true,page=16", 100, 120);
}
END_TEST

/* quest holds every token and reads, on decode steps, the newest page
 * plus whole pages while they fit the budget: with a budget that covers
 * the cache (100%, or more tokens than the context) that is every page in
 * order, the rows the full policy's call reads in the same order, so its
 * logits are the full policy's bit for bit, with pages of 64 tokens (the
 * default) and of 16 (page=16, pieces of the cache's blocks); at 25% each
 * stream reads exactly its newest page plus floor((budget - newest's
 * tokens) / page) others, and the logits differ. With full_layers=2 and
 * full_share=true the first two layers read everything and the others'
 * budget is what that leaves of 30 x budget, shared: the tokens read,
 * averaged over the layers, stay within the budget. Prompt of 300 tokens
 * (two chunks), 20 decode steps. */
/* A picking policy against the full cache: engines eng[1..ne) (eng[0] the
 * full policy, single sequences, 512-token context) fed the same prompt
 * (300 random tokens, seed; 150 quick) and 20 greedy steps (6 quick) of
 * the full policy's tokens. exact[k]: engine k's logits equal the full
 * policy's at every step, bit for bit; otherwise differ_k[k] counts the
 * steps where they differ, and at least one must. Nothing is evicted, and
 * the tokens attended over the layers and KV heads are all on the
 * prompt's step and on exact engines' steps, read(k, n_past, n_layer)
 * times the KV heads on the others' decode steps. Returns the prompt's
 * length. */
static int picked_vs_full(const char *name, qi_engine *const *eng, const bool *exact, int ne, uint64_t seed,
                          long (*read)(int k, int n_past, int L), int *differ_k) {
    const int V = g_model->hp.n_vocab, L = g_model->hp.n_layer, Hkv = g_model->hp.n_head_kv;
    const int NP = qi_test_quick() ? 150 : 300, G = qi_test_quick() ? 6 : 20;
    int32_t ids[300];
    make_ids(ids, NP, seed, V);
    ck_assert(!qi_engine_kv_budget_attended(eng[0]) && qi_engine_kv_budget_attended(eng[1]));
    int id[16];
    qi_err e = {0};
    ck_assert_int_le(ne, 16);
    for (int k = 0; k < ne; k++) {
        ck_assert_int_eq(qi_engine_seq_add(eng[k], &id[k], &e), QI_OK);
        ck_assert_int_eq(qi_engine_seq_feed(eng[k], id[k], ids, NP, false, &e), QI_OK);
    }
    for (int g = 0; g < G; g++) {
        int32_t tok = 0;
        for (int k = 0; k < ne; k++) {
            while (qi_engine_seq_pending(eng[k], id[k]) > 0)
                ck_assert_msg(qi_engine_step(eng[k], NULL, &e) == QI_OK, "%s", e.msg);
            const float *lg = qi_engine_seq_logits(eng[k], id[k], -1), *ref = qi_engine_seq_logits(eng[0], id[0], -1);
            if (k == 0) tok = argmax(lg, V);
            else if (exact[k])
                ck_assert_msg(memcmp(lg, ref, sizeof(float) * (size_t)V) == 0,
                              "%s (engine %d): step %d: logits differ from the full policy's", name, k, g);
            else
                differ_k[k] += memcmp(lg, ref, sizeof(float) * (size_t)V) != 0;
        }
        const int n_past = qi_engine_seq_n_past(eng[0], id[0]);
        for (int k = 0; k < ne; k++) {
            qi_engine_kv_seq st;
            qi_engine_kv_seq_stats(eng[k], id[k], &st);
            ck_assert_int_eq(st.work_tokens, (long)n_past * L * Hkv); /* nothing evicted */
            ck_assert_int_eq(st.off_tokens, 0);
            /* the prompt's step reads everything, and so does a budget covering the cache */
            const long want = g > 0 && !exact[k] ? read(k, n_past, L) * Hkv : (long)n_past * L * Hkv;
            ck_assert_msg(st.attn_tokens == want, "%s engine %d step %d: %ld tokens attended, want %ld", name, k,
                          g, st.attn_tokens, want);
        }
        if (g < G - 1)
            for (int k = 0; k < ne; k++) ck_assert_int_eq(qi_engine_seq_feed(eng[k], id[k], &tok, 1, false, &e), QI_OK);
    }
    for (int k = 0; k < ne; k++) {
        ck_assert_msg(exact[k] || differ_k[k] > 0, "%s (engine %d) at 25%% gave the full policy's logits at every step",
                      name, k);
        qi_engine_free(eng[k]);
    }
    return NP;
}

/* quest at 25%: the tokens engine k's streams read over the layers at a
 * decode step with n_past tokens held (quest_whole_budget_equals_full's
 * engines: 3 and 6 pages of 64, 5 pages of 16; 6 with its two dense first
 * layers' reads taken out of the others' budgets). */
static long quest_read(int k, int n_past, int L) {
    const int P = k == 5 ? 16 : 64, newest = (n_past - 1) / P, last_n = n_past - newest * P;
    int budget = (int)ceil(0.25 * n_past), dense = 0;
    if (k == 6) { /* the two dense layers' reads come out of the other layers' budgets */
        dense = 2;
        budget = (L * budget - 2 * n_past) / (L - 2);
        if (budget < 1) budget = 1;
    }
    int more = budget > last_n ? (budget - last_n) / P : 0;
    if (more > newest) more = newest;
    const long want = (long)dense * n_past + (long)(L - dense) * (last_n + P * more);
    ck_assert(want <= (long)ceil(0.25 * n_past) * L || more == 0);
    return want;
}

START_TEST(quest_whole_budget_equals_full) {
    if (!g_model) return;
    enum { NE = 7 };
    /* k: 0 full; 1-3 quest at 100% (page=64), 4096 tokens (pages of 16,
     * the default), 25% (page=64); 4-5 the default at 100% and 25%; 6
     * full_layers=2,full_share=true,page=64 at 25% */
    qi_engine *eng[NE] = {make_engine(g_model, "full", NULL, 0, 0.0, 512, 1),
                          make_engine(g_model, "quest", "page=64", 0, 1.0, 512, 1),
                          make_engine(g_model, "quest", NULL, 4096, 0.0, 512, 1),
                          make_engine(g_model, "quest", "page=64", 0, 0.25, 512, 1),
                          make_engine(g_model, "quest", NULL, 0, 1.0, 512, 1),
                          make_engine(g_model, "quest", NULL, 0, 0.25, 512, 1),
                          make_engine(g_model, "quest", "full_layers=2,full_share=true,page=64", 0, 0.25, 512, 1)};
    static const bool exact[NE] = {true, true, true, false, true, false, false};
    int differ_k[NE] = {0};
    const int NP = picked_vs_full("quest", eng, exact, NE, 23, quest_read, differ_k);
    printf("quest: budget 100%% and 4096 tokens (pages of 64 and 16) equal the full policy bit for bit over a "
           "%d-token prompt; at 25%% the logits differ at %d (pages of 64), %d (pages of 16) and %d "
           "(dense first layers, shared) steps, each stream reading its rule's pages\n",
           NP, differ_k[3], differ_k[5], differ_k[6]);
}
END_TEST

/* sparq holds every token and reads, on decode steps, its newest token and
 * the budget's best others, one row per pointer: with a budget that covers
 * the cache (100%, or more tokens than the context) that is every row in
 * order, so its logits are the full policy's bit for bit, with scores on
 * an eighth of the components (the default) and on all (dims=1); at 25%
 * every stream reads exactly ceil(0.25 x tokens) rows and the logits
 * differ. Prompt of 300 tokens (two chunks), 20 decode steps. */
static long sparq_read(int k, int n_past, int L) { /* engines 3-5 and 7 at 25% */
    const int dense = k == 5 ? 2 : 0; /* full_layers=2: the first two layers read everything */
    return (long)dense * n_past + (long)(L - dense) * (long)ceil(0.25 * n_past);
}

START_TEST(sparq_whole_budget_equals_full) {
    if (!g_model) return;
    enum { NE = 8 };
    qi_engine *eng[NE] = {make_engine(g_model, "full", NULL, 0, 0.0, 512, 1),
                          make_engine(g_model, "sparq", NULL, 0, 1.0, 512, 1),
                          make_engine(g_model, "sparq", "dims=1", 4096, 0.0, 512, 1),
                          make_engine(g_model, "sparq", NULL, 0, 0.25, 512, 1),
                          make_engine(g_model, "sparq", "dims=1", 0, 0.25, 512, 1),
                          make_engine(g_model, "sparq", "full_layers=2", 0, 0.25, 512, 1),
                          make_engine(g_model, "sparq", "mean=true", 0, 1.0, 512, 1),
                          make_engine(g_model, "sparq", "mean=true", 0, 0.25, 512, 1)};
    static const bool exact[NE] = {true, true, true, false, false, false, true, false};
    int differ_k[NE] = {0};
    const int NP = picked_vs_full("sparq", eng, exact, NE, 29, sparq_read, differ_k);
    /* the mean-value term changes the output: mean=true at 25% is not mean=false at 25% (engine 3) */
    printf("sparq: budget 100%% and 4096 tokens equal the full policy bit for bit over a %d-token prompt (with and "
           "without the mean-value term); at 25%% the logits differ at %d (dims 0.125, the default), %d (dims 1), "
           "%d (2 dense layers) and %d (mean=true) steps, each stream reading its budget's rows\n",
           NP, differ_k[3], differ_k[4], differ_k[5], differ_k[7]);
}
END_TEST

/* sparq's decode steps read single rows through the same attention call:
 * a batch of 16 gives each sequence's logits alone, bit for bit. */
START_TEST(sparq_batched_equals_separate) {
    if (!g_model) return;
    batched_vs_separate_under(g_model, " (sparq, budget 100)", "sparq", NULL, 100, 120);
    batched_vs_separate_under(g_model, " (sparq dims=1, budget 100)", "sparq", "dims=1", 100, 120);
    batched_vs_separate_under(g_model, " (sparq mean=true, budget 100)", "sparq", "mean=true", 100, 120);
}
END_TEST

START_TEST(policies_respect_budget) {
    if (!g_model) return;
    const int V = g_model->hp.n_vocab, L = g_model->hp.n_layer, Hkv = g_model->hp.n_head_kv;
    const int N = qi_test_quick() ? 70 : 200, B = 48;
    int32_t ids[200];
    make_ids(ids, N, 5, V);
    const char *pols[][2] = {{"window", NULL}, {"streaming", "sinks=4"}, {"h2o", NULL},
                             {"qinfer", NULL}, {"qinfer", "full_layers=0,probe_every=4"}};
    for (size_t k = 0; k < sizeof pols / sizeof pols[0]; k++) {
        qi_engine *eng = make_engine(g_model, pols[k][0], pols[k][1], B, 0.0, 256, 1);
        qi_err e = {0};
        int id;
        ck_assert_int_eq(qi_engine_seq_add(eng, &id, &e), QI_OK);
        for (int i = 0; i < N; i++) {
            ck_assert_int_eq(qi_engine_seq_feed(eng, id, &ids[i], 1, false, &e), QI_OK);
            ck_assert_msg(qi_engine_step(eng, NULL, &e) == QI_OK, "%s: %s", pols[k][0], e.msg);
            const float *lg = qi_engine_seq_logits(eng, id, -1);
            ck_assert_ptr_nonnull(lg);
            ck_assert(isfinite(lg[0]));
        }
        qi_engine_kv_seq st;
        qi_engine_kv_seq_stats(eng, id, &st);
        const bool qinfer = strcmp(pols[k][0], "qinfer") == 0;
        const int full_layers = qinfer && !pols[k][1] ? 2 : 0;
        /* budgeted layers hold exactly B working tokens per stream (qinfer
         * 36: a quarter of the budget is fetched, its default); exempt ones all N */
        const int held = qinfer ? B - (int)lround(0.25 * B) : B;
        const long want_work = (long)Hkv * ((long)(L - full_layers) * held + (long)full_layers * N);
        ck_assert_msg(st.work_tokens == want_work, "%s %s: %ld working tokens, want %ld", pols[k][0],
                      pols[k][1] ? pols[k][1] : "", st.work_tokens, want_work);
        if (qinfer)
            ck_assert_int_eq(st.off_tokens, (long)Hkv * (L - full_layers) * (N - held));
        else
            ck_assert_int_eq(st.off_tokens, 0);
        qi_engine_kv_pool pool;
        qi_engine_kv_pool_stats(eng, &pool);
        ck_assert_int_eq((long)st.work_bytes, pool.work_blocks * (long)pool.block_bytes);
        ck_assert_int_eq((long)st.off_bytes, pool.off_blocks * (long)pool.block_bytes);
        printf("%-9s %-28s budget %d: %ld working + %ld offloaded tokens, %.1f + %.1f KiB\n", pols[k][0],
               pols[k][1] ? pols[k][1] : "(defaults)", B, st.work_tokens, st.off_tokens, st.work_bytes / 1024.0,
               st.off_bytes / 1024.0);
        ck_assert_int_eq(qi_engine_seq_remove(eng, id, &e), QI_OK);
        qi_engine_kv_pool_stats(eng, &pool);
        ck_assert_int_eq(pool.work_blocks + pool.off_blocks, 0);
        qi_engine_free(eng);
    }
}
END_TEST

/* qinfer fetch=0.25 at a budget B of 48 tokens keeps 36 working tokens per
 * stream and on each decode step reads, besides them, the offloaded tokens
 * the query scores best while the budget has room: min(n, 48) tokens
 * attended of n held, every step. Until the first token is fetched its
 * logits are bit for bit those of qinfer without fetch at a budget of 36
 * (the same working tokens, read through row pointers); once tokens are
 * fetched they differ. Token by token, 200 tokens (70 quick). */
START_TEST(qinfer_fetch_reads_its_budget) {
    if (!g_model) return;
    const int V = g_model->hp.n_vocab, L = g_model->hp.n_layer, Hkv = g_model->hp.n_head_kv;
    const int N = qi_test_quick() ? 70 : 200, B = 48, HELD = 36;
    int32_t ids[200];
    make_ids(ids, N, 13, V);
    qi_engine *fe = make_engine(g_model, "qinfer", "fetch=0.25,full_layers=0", B, 0.0, 256, 1),
              *pe = make_engine(g_model, "qinfer", "fetch=0,full_layers=0", HELD, 0.0, 256, 1);
    ck_assert(qi_engine_kv_budget_attended(fe) && !qi_engine_kv_budget_attended(pe));
    qi_err e = {0};
    int fid, pid, differ = 0;
    ck_assert_int_eq(qi_engine_seq_add(fe, &fid, &e), QI_OK);
    ck_assert_int_eq(qi_engine_seq_add(pe, &pid, &e), QI_OK);
    for (int i = 0; i < N; i++) {
        const long n = i + 1;
        ck_assert_int_eq(qi_engine_seq_feed(fe, fid, &ids[i], 1, false, &e), QI_OK);
        ck_assert_int_eq(qi_engine_seq_feed(pe, pid, &ids[i], 1, false, &e), QI_OK);
        ck_assert_msg(qi_engine_step(fe, NULL, &e) == QI_OK, "%s", e.msg);
        ck_assert_msg(qi_engine_step(pe, NULL, &e) == QI_OK, "%s", e.msg);
        qi_engine_kv_seq st;
        qi_engine_kv_seq_stats(fe, fid, &st);
        ck_assert_int_eq(st.work_tokens, (long)L * Hkv * (n < HELD ? n : HELD));
        ck_assert_int_eq(st.off_tokens, (long)L * Hkv * (n > HELD ? n - HELD : 0));
        ck_assert_msg(st.attn_tokens == (long)L * Hkv * (n < B ? n : B), "token %ld: %ld attended, want %ld", n,
                      st.attn_tokens, (long)L * Hkv * (n < B ? n : B));
        const bool same = memcmp(qi_engine_seq_logits(fe, fid, -1), qi_engine_seq_logits(pe, pid, -1),
                                 sizeof(float) * (size_t)V) == 0;
        if (n <= HELD + 1) ck_assert_msg(same, "token %ld: logits differ before any fetch", n);
        differ += !same;
    }
    ck_assert_int_gt(differ, 0);
    printf("qinfer fetch=0.25, budget %d: %d working tokens a stream, min(n, %d) attended; logits equal qinfer at %d "
           "until the first fetch, then differ at %d of %d steps\n",
           B, HELD, B, HELD, differ, N - HELD - 1);
    qi_engine_free(fe);
    qi_engine_free(pe);
}
END_TEST

/* With a budget of the whole sequence, qinfer fetch=0.5 holds half the
 * tokens working and fetches the rest back every decode step: attention
 * reads every token, in another order than the full cache's (working
 * slots as evictions left them, then the fetched ones). Its next-token
 * distributions stay within rounding of the full cache's: mean KL under
 * a quarter of what qinfer without fetch, holding the same half and reading
 * only it, loses (rows read wrong would lose at least as much as rows not
 * read; measured: 2.2e-7 against 3.2e-6, and bit for bit in the quick run). (A one-off build that put the rows in position order
 * gave the full cache's logits bit for bit.) Token by token, 120 tokens
 * (50 quick). */
START_TEST(qinfer_fetch_of_everything_is_the_full_cache) {
    if (!g_model) return;
    const int V = g_model->hp.n_vocab, L = g_model->hp.n_layer, Hkv = g_model->hp.n_head_kv;
    const int N = qi_test_quick() ? 50 : 120;
    int32_t ids[120];
    make_ids(ids, N, 31, V);
    qi_engine *eng[3] = {make_engine(g_model, "full", NULL, 0, 0.0, 256, 1),
                         make_engine(g_model, "qinfer", "fetch=0.5,full_layers=0", 0, 1.0, 256, 1),
                         make_engine(g_model, "qinfer", "fetch=0,full_layers=0", 0, 0.5, 256, 1)};
    qi_err e = {0};
    int id[3];
    double kl[3] = {0, 0, 0}, worst = 0;
    for (int k = 0; k < 3; k++) ck_assert_int_eq(qi_engine_seq_add(eng[k], &id[k], &e), QI_OK);
    for (int i = 0; i < N; i++) {
        for (int k = 0; k < 3; k++) {
            ck_assert_int_eq(qi_engine_seq_feed(eng[k], id[k], &ids[i], 1, false, &e), QI_OK);
            ck_assert_msg(qi_engine_step(eng[k], NULL, &e) == QI_OK, "%s", e.msg);
        }
        const long n = i + 1, held = n - lround(0.5 * n) < 1 ? 1 : n - lround(0.5 * n);
        qi_engine_kv_seq st;
        qi_engine_kv_seq_stats(eng[1], id[1], &st);
        ck_assert_int_eq(st.attn_tokens, (long)L * Hkv * n); /* every token read */
        ck_assert_int_eq(st.work_tokens, (long)L * Hkv * held);
        const float *ref = qi_engine_seq_logits(eng[0], id[0], -1);
        for (int k = 1; k < 3; k++) {
            const double d = kl_logits(ref, qi_engine_seq_logits(eng[k], id[k], -1), V);
            kl[k] += d / N;
            if (k == 1) worst = fmax(worst, d);
        }
    }
    printf("qinfer fetch=0.5 at a budget of the whole sequence: mean KL %.3g nats (max %.3g) from the full cache; "
           "without fetch, half held: %.3g\n", kl[1], worst, kl[2]);
    ck_assert_msg(kl[1] < 0.25 * kl[2], "fetching everything strays from the full cache: mean KL %.3g against %.3g",
                  kl[1], kl[2]);
    for (int k = 0; k < 3; k++) qi_engine_free(eng[k]);
}
END_TEST

/* A fraction budget follows the sequence's length. */
START_TEST(fraction_budget) {
    if (!g_model) return;
    const int V = g_model->hp.n_vocab, L = g_model->hp.n_layer, Hkv = g_model->hp.n_head_kv, N = 100;
    int32_t ids[100];
    make_ids(ids, N, 9, V);
    qi_engine *eng = make_engine(g_model, "window", NULL, 0, 0.25, 256, 1);
    qi_err e = {0};
    int id;
    ck_assert_int_eq(qi_engine_seq_add(eng, &id, &e), QI_OK);
    for (int i = 0; i < N; i++) {
        ck_assert_int_eq(qi_engine_seq_feed(eng, id, &ids[i], 1, false, &e), QI_OK);
        ck_assert_int_eq(qi_engine_step(eng, NULL, &e), QI_OK);
        qi_engine_kv_seq st;
        qi_engine_kv_seq_stats(eng, id, &st);
        const long b = (long)ceil(0.25 * (i + 1));
        ck_assert_int_eq(st.work_tokens, (long)L * Hkv * b);
    }
    qi_engine_free(eng);
}
END_TEST

/* Under a budgeted policy a sequence's logits do not depend on its
 * neighbours: a prompt of several chunks prefilled while another sequence
 * decodes (one row per step) gives, bit for bit, the logits it gives alone,
 * through the prompt and greedy decoding. The policy runs after each of the
 * sequence's segments at a budget set by the segment's last position, so
 * this holds only if the neighbour's rows never change where the prompt's
 * chunks end. Chunks of 32 tokens (step_tokens 32) keep the prompt short. */
static void run_with_neighbour(const char *policy, const char *params, const int32_t *prompt, int n_prompt,
                               bool neighbour, int n_dec, float *logits) {
    const int V = g_model->hp.n_vocab;
    qi_engine_opts o;
    qi_engine_opts_default(&o);
    o.n_threads = 2;
    o.n_ctx = 256;
    o.max_seqs = 2;
    o.step_tokens = 32;
    o.kv_policy = policy;
    qi_params p;
    qi_params_init(&p);
    qi_err e = {0};
    ck_assert_msg(qi_params_parse(&p, params, &e) == QI_OK, "%s", e.msg);
    o.kv_params = &p;
    o.kv_budget_frac = 0.5;
    qi_engine *eng = NULL;
    ck_assert_msg(qi_engine_create(g_model, &o, &eng, &e) == QI_OK, "%s", e.msg);
    int a = -1, b;
    if (neighbour) { /* a short prompt, then one token a step for as long as b runs */
        int32_t start[3];
        make_ids(start, 3, 77, V);
        ck_assert_int_eq(qi_engine_seq_add(eng, &a, &e), QI_OK);
        ck_assert_int_eq(qi_engine_seq_feed(eng, a, start, 3, false, &e), QI_OK);
        ck_assert_int_eq(qi_engine_step(eng, NULL, &e), QI_OK);
    }
    ck_assert_int_eq(qi_engine_seq_add(eng, &b, &e), QI_OK);
    ck_assert_int_eq(qi_engine_seq_feed(eng, b, prompt, n_prompt, false, &e), QI_OK);
    int got = 0;
    while (got < n_dec) {
        if (neighbour) {
            int32_t tok = argmax(qi_engine_seq_logits(eng, a, -1), V);
            ck_assert_int_eq(qi_engine_seq_feed(eng, a, &tok, 1, false, &e), QI_OK);
        }
        ck_assert_msg(qi_engine_step(eng, NULL, &e) == QI_OK, "%s: %s", policy, e.msg);
        if (qi_engine_seq_pending(eng, b) > 0) continue;
        const float *lg = qi_engine_seq_logits(eng, b, -1);
        ck_assert_ptr_nonnull(lg);
        memcpy(logits + (size_t)got * V, lg, sizeof(float) * (size_t)V);
        int32_t tok = argmax(lg, V);
        ck_assert_int_eq(qi_engine_seq_feed(eng, b, &tok, 1, false, &e), QI_OK);
        got++;
    }
    qi_engine_free(eng);
}

START_TEST(budgeted_policy_ignores_neighbours) {
    if (!g_model) return;
    const int V = g_model->hp.n_vocab, N = 100, G = qi_test_quick() ? 3 : 6;
    int32_t prompt[100];
    make_ids(prompt, N, 21, V);
    const char *pols[][2] = {{"h2o", ""}, {"qinfer", "probe_every=2"}, {"window", ""}};
    float *alone = malloc(sizeof(float) * (size_t)G * V), *with = malloc(sizeof(float) * (size_t)G * V);
    for (size_t k = 0; k < sizeof pols / sizeof pols[0]; k++) {
        run_with_neighbour(pols[k][0], pols[k][1], prompt, N, false, G, alone);
        run_with_neighbour(pols[k][0], pols[k][1], prompt, N, true, G, with);
        for (int g = 0; g < G; g++)
            ck_assert_msg(memcmp(alone + (size_t)g * V, with + (size_t)g * V, sizeof(float) * (size_t)V) == 0,
                          "%s %s at 50%%: logits %d differ with a decoding neighbour", pols[k][0], pols[k][1], g);
        printf("%-6s %-14s at 50%%: a %d-token prompt and %d decode steps bit-identical beside a decoding "
               "neighbour\n", pols[k][0], pols[k][1], N, G);
    }
    free(alone);
    free(with);
}
END_TEST

/* Deciding policies in a batch: their layers' attention is one backend
 * call for every sequence, each gathering its statistics into a region of
 * its own. S sequences under a budget well below their lengths (every
 * budgeted stream evicts from the first chunk on), four of them joining
 * once the others decode (steps with prompt chunks and decode rows in one
 * call), and the batch on 3 threads against the runs alone on 2, so the
 * work is cut elsewhere: every logit, and every stream's tokens (positions
 * in slot order, both tiers) and policy scores, bit-identical. */
#define PB_MAX_S 6
#define PB_G 8
#define PB_BUDGET 16

typedef struct {
    int n[2];
    int32_t *pos[2];
    float *score[2];
} stream_copy;

static int g_pb_step_tokens; /* 0: the default; 16 cuts the prompts into chunks */

static qi_engine *make_policy_engine(const char *policy, const char *params, int n_threads, int max_seqs) {
    qi_engine_opts o;
    qi_engine_opts_default(&o);
    if (g_pb_step_tokens > 0) o.step_tokens = g_pb_step_tokens;
    o.n_threads = n_threads;
    o.n_ctx = 128;
    o.max_seqs = max_seqs;
    o.kv_policy = policy;
    qi_params p;
    qi_params_init(&p);
    qi_err e = {0};
    ck_assert_msg(qi_params_parse(&p, params, &e) == QI_OK, "%s", e.msg);
    o.kv_params = &p;
    o.kv_budget_tokens = PB_BUDGET;
    qi_engine *eng = NULL;
    ck_assert_msg(qi_engine_create(g_model, &o, &eng, &e) == QI_OK, "%s", e.msg);
    return eng;
}

/* Copy (keep: cp[L * Hkv]) or compare with the copy (keep false) every
 * stream of sequence id. Returns the tokens moved out of the working tier
 * (offloaded or dropped) over all streams. */
static long streams_match(const qi_engine *eng, int id, stream_copy *cp, bool keep, const char *what, int s) {
    const int L = g_model->hp.n_layer, Hkv = g_model->hp.n_head_kv, n_past = qi_engine_seq_n_past(eng, id);
    long evicted = 0;
    for (int l = 0; l < L; l++)
        for (int hk = 0; hk < Hkv; hk++) {
            stream_copy *c = &cp[l * Hkv + hk];
            for (int tier = 0; tier < 2; tier++) {
                const int32_t *pos;
                const float *score;
                const int n = qi_engine_kv_stream_tokens(eng, id, l, hk, tier, &pos, &score);
                ck_assert_int_ge(n, 0);
                if (tier == 0) evicted += n_past - n;
                if (keep) {
                    c->n[tier] = n;
                    c->pos[tier] = malloc(sizeof(int32_t) * (size_t)(n + 1));
                    c->score[tier] = malloc(sizeof(float) * (size_t)(n + 1));
                    if (n > 0) {
                        memcpy(c->pos[tier], pos, sizeof(int32_t) * (size_t)n);
                        memcpy(c->score[tier], score, sizeof(float) * (size_t)n);
                    }
                    continue;
                }
                ck_assert_msg(n == c->n[tier], "%s: sequence %d layer %d head %d tier %d: %d tokens, alone %d", what,
                              s, l, hk, tier, n, c->n[tier]);
                ck_assert_msg(n == 0 || memcmp(pos, c->pos[tier], sizeof(int32_t) * (size_t)n) == 0,
                              "%s: sequence %d layer %d head %d tier %d: kept positions differ from alone", what, s,
                              l, hk, tier);
                ck_assert_msg(n == 0 || memcmp(score, c->score[tier], sizeof(float) * (size_t)n) == 0,
                              "%s: sequence %d layer %d head %d tier %d: policy scores differ from alone", what, s,
                              l, hk, tier);
            }
        }
    return evicted;
}

static void policy_batched_vs_separate(const char *policy, const char *params) {
    const int S = qi_test_quick() ? 4 : PB_MAX_S, G = PB_G, V = g_model->hp.n_vocab;
    const int L = g_model->hp.n_layer, Hkv = g_model->hp.n_head_kv;
    char what[64];
    snprintf(what, sizeof what, "%s %s", policy, params);
    int32_t prompts[PB_MAX_S][48];
    int plen[PB_MAX_S];
    int32_t alone[PB_MAX_S][PB_G];
    float *alone_logits = malloc(sizeof(float) * (size_t)S * G * V);
    stream_copy *kept = calloc((size_t)S * L * Hkv, sizeof *kept);
    ck_assert(alone_logits && kept);
    qi_err e = {0};
    for (int s = 0; s < S; s++) {
        plen[s] = 24 + 4 * s;
        make_ids(prompts[s], plen[s], 300 + (uint64_t)s, V);
    }
    /* alone */
    qi_engine *one = make_policy_engine(policy, params, 2, 1);
    long evicted = 0, offloaded = 0;
    for (int s = 0; s < S; s++) {
        int id;
        ck_assert_int_eq(qi_engine_seq_add(one, &id, &e), QI_OK);
        ck_assert_int_eq(qi_engine_seq_feed(one, id, prompts[s], plen[s], false, &e), QI_OK);
        for (int g = 0; g < G; g++) {
            while (qi_engine_seq_pending(one, id) > 0)
                ck_assert_msg(qi_engine_step(one, NULL, &e) == QI_OK, "%s: %s", what, e.msg);
            const float *lg = qi_engine_seq_logits(one, id, -1);
            memcpy(alone_logits + ((size_t)s * G + g) * V, lg, sizeof(float) * (size_t)V);
            alone[s][g] = argmax(lg, V);
            if (g < G - 1) ck_assert_int_eq(qi_engine_seq_feed(one, id, &alone[s][g], 1, false, &e), QI_OK);
        }
        evicted += streams_match(one, id, kept + (size_t)s * L * Hkv, true, what, s);
        qi_engine_kv_seq st;
        qi_engine_kv_seq_stats(one, id, &st);
        offloaded += st.off_tokens;
        ck_assert_int_eq(qi_engine_seq_remove(one, id, &e), QI_OK);
    }
    qi_engine_free(one);
    /* the budgeted streams hold PB_BUDGET of their 24.. + G - 1 tokens */
    ck_assert_msg(evicted > 0, "%s: nothing evicted", what);
    if (strcmp(policy, "qinfer") == 0) ck_assert_msg(offloaded > 0, "%s: nothing offloaded", what);
    /* together */
    qi_engine *eng = make_policy_engine(policy, params, 3, S);
    int ids[PB_MAX_S], got[PB_MAX_S] = {0};
    const int late = S - 2; /* sequences 2.. join after 2 steps */
    for (int s = 0; s < 2; s++) {
        ck_assert_int_eq(qi_engine_seq_add(eng, &ids[s], &e), QI_OK);
        ck_assert_int_eq(qi_engine_seq_feed(eng, ids[s], prompts[s], plen[s], false, &e), QI_OK);
    }
    int steps = 0, max_batch = 0, mixed = 0;
    for (;;) {
        if (steps == 2)
            for (int s = 2; s < S; s++) {
                ck_assert_int_eq(qi_engine_seq_add(eng, &ids[s], &e), QI_OK);
                ck_assert_int_eq(qi_engine_seq_feed(eng, ids[s], prompts[s], plen[s], false, &e), QI_OK);
            }
        int n, in_batch = 0;
        ck_assert_msg(qi_engine_step(eng, &n, &e) == QI_OK, "%s: %s", what, e.msg);
        steps++;
        if (n == 0 && steps > 2) break;
        mixed += steps == 3 && n > 2;
        for (int s = 0; s < S; s++) {
            if ((steps <= 2 && s >= 2) || qi_engine_seq_n_logits(eng, ids[s]) == 0) continue;
            in_batch++;
            const int g = got[s];
            const float *lg = qi_engine_seq_logits(eng, ids[s], -1);
            ck_assert_msg(memcmp(lg, alone_logits + ((size_t)s * G + g) * V, sizeof(float) * (size_t)V) == 0,
                          "%s: sequence %d step %d: logits differ from its run alone", what, s, g);
            got[s]++;
            if (got[s] < G) ck_assert_int_eq(qi_engine_seq_feed(eng, ids[s], &alone[s][g], 1, false, &e), QI_OK);
        }
        if (in_batch > max_batch) max_batch = in_batch;
    }
    for (int s = 0; s < S; s++) {
        ck_assert_int_eq(got[s], G);
        streams_match(eng, ids[s], kept + (size_t)s * L * Hkv, false, what, s);
    }
    ck_assert_int_eq(max_batch, S);
    ck_assert_msg(mixed == 1, "%s: no step ran prompt chunks beside decode rows", what);
    printf("%-6s %-28s budget %d: %d sequences (%d joining late) x %d tokens, logits, kept tokens and scores "
           "identical to separate runs (%ld tokens evicted, %ld offloaded)\n",
           policy, params, PB_BUDGET, S, late, G, evicted, offloaded);
    qi_engine_free(eng);
    for (int i = 0; i < S * L * Hkv; i++)
        for (int tier = 0; tier < 2; tier++) {
            free(kept[i].pos[tier]);
            free(kept[i].score[tier]);
        }
    free(kept);
    free(alone_logits);
}

START_TEST(policy_batched_equals_separate) {
    if (!g_model) return;
    policy_batched_vs_separate("h2o", "");
    policy_batched_vs_separate("qinfer", "probe_every=2");
    policy_batched_vs_separate("qinfer", "probe_every=2,catch_up=true");
    policy_batched_vs_separate("qinfer", "fetch=0.25,probe_every=2"); /* offloaded rows read beside the working ones */
    policy_batched_vs_separate("tova", "");
    policy_batched_vs_separate("scissorhands", "history=4");
    policy_batched_vs_separate("keyformer", "steps=64");
    policy_batched_vs_separate("h2o", "pyramid=0.5");
    policy_batched_vs_separate("scissorhands", "history=4,ada=0.5"); /* KV heads decided together */
    /* prompts of several chunks, judged at their end */
    g_pb_step_tokens = 16;
    policy_batched_vs_separate("snapkv", "window=4");
    policy_batched_vs_separate("snapkv", "window=4,ada=1");
    policy_batched_vs_separate("qinfer", "judge=4,probe_every=2");
    policy_batched_vs_separate("qinfer", "judge=0,windows=4,probe_every=2"); /* evicting chunk by chunk */
    policy_batched_vs_separate("qinfer", "judge=4,fetch=0.5");
    g_pb_step_tokens = 0;
    if (!qi_test_quick()) policy_batched_vs_separate("qinfer", "full_layers=0,windows=2,mean=true,probe_every=3");
}
END_TEST

/* A policy with an observation window keeps a prompt of several chunks
 * whole until its last chunk, then cuts it to the budget; h2o cuts it
 * chunk by chunk, and with ada= (budgets moved between KV heads) keeps the
 * same total. Prompt 40 tokens in chunks of 16, budget 16 tokens. */
START_TEST(prompt_judged_at_its_end) {
    if (!g_model) return;
    static const char *const pol[][2] = {
        {"snapkv", "window=4"}, {"qinfer", "judge=4,full_layers=0,fetch=0"}, {"h2o", ""}, {"h2o", "ada=1"}};
    const int L = g_model->hp.n_layer, Hkv = g_model->hp.n_head_kv;
    int32_t ids[40];
    make_ids(ids, 40, 17, g_model->hp.n_vocab);
    for (int k = 0; k < 4; k++) {
        g_pb_step_tokens = 16;
        qi_engine *eng = make_policy_engine(pol[k][0], pol[k][1], 2, 1);
        g_pb_step_tokens = 0;
        qi_err e = {0};
        int id;
        ck_assert_int_eq(qi_engine_seq_add(eng, &id, &e), QI_OK);
        ck_assert_int_eq(qi_engine_seq_feed(eng, id, ids, 40, false, &e), QI_OK);
        const bool judged = k < 2;
        for (int step = 1; step <= 3; step++) {
            ck_assert_msg(qi_engine_step(eng, NULL, &e) == QI_OK, "%s", e.msg);
            const int want = step == 3 || !judged ? PB_BUDGET : 16 * step;
            qi_engine_kv_seq st;
            qi_engine_kv_seq_stats(eng, id, &st);
            ck_assert_msg(st.work_tokens == (long)want * L * Hkv, "%s step %d: %ld working tokens, want %d per stream",
                          pol[k][0], step, st.work_tokens, want);
        }
        ck_assert_int_eq(qi_engine_seq_pending(eng, id), 0);
        if (k == 3) { /* ada=1: every layer holds Hkv x 16, some not 16 a head */
            int uneven = 0;
            for (int l = 0; l < L; l++) {
                int sum = 0, first = -1;
                bool differ = false;
                for (int hk = 0; hk < Hkv; hk++) {
                    const int32_t *pos;
                    const float *score;
                    const int n = qi_engine_kv_stream_tokens(eng, id, l, hk, 0, &pos, &score);
                    sum += n;
                    differ |= first >= 0 && n != first;
                    first = n;
                }
                ck_assert_msg(sum == PB_BUDGET * Hkv, "ada=1 layer %d: %d working tokens over its heads", l, sum);
                uneven += differ;
            }
            ck_assert_msg(Hkv == 1 || uneven > 0, "ada=1: every layer's heads kept the same count");
            printf("ada=1: %d of %d layers with budgets moved between KV heads\n", uneven, L);
        }
        qi_engine_free(eng);
    }
}
END_TEST

START_TEST(errors) {
    if (!g_model) return;
    qi_engine_opts o;
    qi_engine_opts_default(&o);
    o.n_threads = 1;
    qi_err e = {0};
    qi_engine *eng = NULL;
    o.kv_policy = "nope";
    ck_assert_int_eq(qi_engine_create(g_model, &o, &eng, &e), QI_ERR_INVALID);
    ck_assert_ptr_null(eng);
    ck_assert_ptr_nonnull(strstr(e.msg, "nope"));
    qi_err_clear(&e);
    o.kv_policy = "h2o";
    ck_assert_int_eq(qi_engine_create(g_model, &o, &eng, &e), QI_ERR_INVALID);
    ck_assert_ptr_nonnull(strstr(e.msg, "budget"));
    qi_err_clear(&e);
    o.kv_budget_frac = 1.5;
    ck_assert_int_eq(qi_engine_create(g_model, &o, &eng, &e), QI_ERR_INVALID);
    qi_err_clear(&e);
    o.kv_budget_frac = 0.0;
    qi_params p;
    qi_params_init(&p);
    ck_assert_int_eq(qi_params_parse(&p, "heavy=2", &e), QI_OK);
    o.kv_params = &p;
    o.kv_budget_tokens = 16;
    ck_assert_int_eq(qi_engine_create(g_model, &o, &eng, &e), QI_ERR_INVALID);
    ck_assert_ptr_nonnull(strstr(e.msg, "heavy"));
    qi_err_clear(&e);
    /* quest keeps its key bounds on the host: attention on another device is refused at creation */
    o.kv_policy = "quest";
    o.kv_params = NULL;
    o.devices = "cpu,testdev";
    o.placement = "ngl=30";
    ck_assert_int_eq(qi_engine_create(g_model, &o, &eng, &e), QI_ERR_UNSUPPORTED);
    ck_assert_ptr_null(eng);
    ck_assert_msg(strstr(e.msg, "quest") && strstr(e.msg, "testdev") && strstr(e.msg, "CPU only"), "%s", e.msg);
    qi_err_clear(&e);
    o.devices = o.placement = NULL;

    /* ids, feeds, context */
    eng = make_engine(g_model, "full", NULL, 0, 0.0, 32, 2);
    int a, b, c;
    ck_assert_int_eq(qi_engine_seq_add(eng, &a, &e), QI_OK);
    ck_assert_int_eq(qi_engine_seq_add(eng, &b, &e), QI_OK);
    ck_assert_int_eq(qi_engine_seq_add(eng, &c, &e), QI_ERR_INVALID);
    qi_err_clear(&e);
    int32_t big[40] = {0}, bad = -3;
    ck_assert_int_eq(qi_engine_seq_feed(eng, a, big, 40, false, &e), QI_ERR_INVALID);
    ck_assert_ptr_nonnull(strstr(e.msg, "context full"));
    qi_err_clear(&e);
    ck_assert_int_eq(qi_engine_seq_feed(eng, a, &bad, 1, false, &e), QI_ERR_INVALID);
    qi_err_clear(&e);
    ck_assert_int_eq(qi_engine_seq_feed(eng, 7, big, 1, false, &e), QI_ERR_INVALID);
    qi_err_clear(&e);
    ck_assert_int_eq(qi_engine_seq_remove(eng, b, &e), QI_OK);
    ck_assert_int_eq(qi_engine_seq_remove(eng, b, &e), QI_ERR_INVALID);
    qi_err_clear(&e);
    int n = -1;
    ck_assert_int_eq(qi_engine_step(eng, &n, &e), QI_OK);
    ck_assert_int_eq(n, 0);
    qi_engine_free(eng);

    /* a memory cap: one block per stream is too little for 100 tokens */
    qi_engine_opts_default(&o);
    o.n_threads = 1;
    o.n_ctx = 128;
    o.max_seqs = 1;
    o.kv_max_bytes = (size_t)g_model->hp.n_layer * g_model->hp.n_head_kv * 2 * 64 * g_model->hp.head_dim * 2;
    ck_assert_int_eq(qi_engine_create(g_model, &o, &eng, &e), QI_OK);
    ck_assert_int_eq(qi_engine_seq_add(eng, &a, &e), QI_OK);
    int32_t ids[100];
    make_ids(ids, 100, 3, g_model->hp.n_vocab);
    ck_assert_int_eq(qi_engine_seq_feed(eng, a, ids, 64, false, &e), QI_OK);
    ck_assert_int_eq(qi_engine_step(eng, NULL, &e), QI_OK);
    ck_assert_int_eq(qi_engine_seq_feed(eng, a, ids + 64, 36, false, &e), QI_OK);
    ck_assert_int_eq(qi_engine_step(eng, NULL, &e), QI_ERR_NOMEM);
    ck_assert_ptr_nonnull(strstr(e.msg, "KV cache full"));
    qi_err_clear(&e);
    ck_assert_int_eq(qi_engine_seq_feed(eng, a, ids, 1, false, &e), QI_ERR_INVALID);
    ck_assert_ptr_nonnull(strstr(e.msg, "failed"));
    qi_err_clear(&e);
    ck_assert_int_eq(qi_engine_seq_remove(eng, a, &e), QI_OK);
    qi_engine_kv_pool pool;
    qi_engine_kv_pool_stats(eng, &pool);
    ck_assert_int_eq(pool.work_blocks + pool.off_blocks, 0);
    qi_engine_free(eng);
}
END_TEST

/* Perplexity through the engine (whole chunks) equals qi_perplexity exactly,
 * two chunks run one after the other and, in decode mode, two at once. */
START_TEST(perplexity_through_engine) {
    if (!g_model) return;
    const int ctx = qi_test_quick() ? 64 : 256, V = g_model->hp.n_vocab;
    const size_t n = (size_t)ctx * 3;
    int32_t *ids = malloc(sizeof(int32_t) * n);
    make_ids(ids, (int)n, 11, V);
    qi_err e = {0};
    qi_ctx *c = NULL;
    ck_assert_int_eq(qi_ctx_create(g_model, ctx, 2, &c, &e), QI_OK);
    qi_ppl_result want, got, dec;
    ck_assert_int_eq(qi_perplexity(g_model, c, ids, n, ctx, 2, NULL, NULL, &want, &e), QI_OK);
    qi_engine *eng = make_engine(g_model, "full", NULL, 0, 0.0, ctx, 2);
    ck_assert_int_eq(qi_perplexity_engine(g_model, eng, ids, n, ctx, 2, 1, false, NULL, NULL, &got, NULL, &e), QI_OK);
    ck_assert_msg(got.ppl == want.ppl && got.count == want.count, "engine ppl %.9g vs %.9g", got.ppl, want.ppl);
    qi_ppl_kv kv;
    ck_assert_int_eq(qi_perplexity_engine(g_model, eng, ids, n, ctx, 2, 2, true, NULL, NULL, &dec, &kv, &e), QI_OK);
    ck_assert_int_eq(dec.count, want.count);
    ck_assert_msg(fabs(dec.ppl / want.ppl - 1) < 0.02, "decode-mode ppl %.4f vs %.4f", dec.ppl, want.ppl);
    ck_assert(kv.work_tokens > 0 && kv.off_tokens == 0);
    printf("perplexity through the engine: %.6f (qi_ctx %.6f); decode mode %.6f\n", got.ppl, want.ppl, dec.ppl);
    qi_engine_free(eng);
    qi_ctx_free(c);
    free(ids);
}
END_TEST

/* Profiling: every step accounted, the matmuls' bytes equal the weights'. */
START_TEST(profile_counts) {
    if (!g_model) return;
    qi_engine_opts o;
    qi_engine_opts_default(&o);
    o.n_threads = 2;
    o.n_ctx = 64;
    o.max_seqs = 1;
    o.profile = true;
    qi_err e = {0};
    qi_engine *eng = NULL;
    ck_assert_int_eq(qi_engine_create(g_model, &o, &eng, &e), QI_OK);
    int id;
    ck_assert_int_eq(qi_engine_seq_add(eng, &id, &e), QI_OK);
    int32_t ids[4];
    make_ids(ids, 4, 2, g_model->hp.n_vocab);
    for (int i = 0; i < 4; i++) {
        ck_assert_int_eq(qi_engine_seq_feed(eng, id, &ids[i], 1, false, &e), QI_OK);
        ck_assert_int_eq(qi_engine_step(eng, NULL, &e), QI_OK);
    }
    qi_engine_prof p;
    qi_engine_profile(eng, &p);
    ck_assert_int_eq(p.steps, 4);
    ck_assert(p.seconds[QI_OP_MATMUL] > 0 && p.seconds[QI_OP_ATTENTION] > 0 && p.seconds[QI_OP_OTHER] >= 0);
    const qi_model *m = g_model;
    double per_step = (double)m->output.row_bytes * m->output.n_rows;
    for (int l = 0; l < m->hp.n_layer; l++) {
        const qi_layer *ly = &m->layers[l];
        const qi_weight *w[] = {&ly->wq, &ly->wk, &ly->wv, &ly->wo, &ly->w_gate, &ly->w_up, &ly->w_down};
        for (int k = 0; k < 7; k++) per_step += (double)w[k]->row_bytes * w[k]->n_rows;
    }
    ck_assert_msg(p.matmul_bytes == 4 * per_step, "matmul bytes %.0f, want %.0f", p.matmul_bytes, 4 * per_step);
    ck_assert_str_eq(qi_op_kind_name(QI_OP_MATMUL), "matmul");
    qi_engine_free(eng);
}
END_TEST

/* Gemma 3 with packed weights: its q5_0 and q8_0 matrices packed, its q4_K
 * and q6_K ones left in the x86 order (or, where the AMX kernels run, held
 * in their packed form beside it), logits close to the x86 order's.
 * (Batched steps are not compared with separate runs here: llama.cpp's
 * order for q4_K and q6_K, which those matrices keep, changes when a
 * matmul has QI_K_WIDE_MIN tokens or more, so a batch of 16 decodes sums
 * them differently from one, exactly as llama.cpp does.) */
START_TEST(gemma_packed) {
    qi_model *m = load(GEMMA_FILE);
    ck_assert(m);
    /* legacy: the matrices packed in place; want: those and, where the AMX
     * kernels run, the q4_K and q6_K ones held in their packed form too */
    const qi_kernels *k = qi_kernels_get();
    const bool amx = k->gemm_wide_packed[QI_TYPE_Q4_K] != NULL;
    int want = 0, legacy = 0;
    for (int l = -1; l < m->hp.n_layer; l++) {
        const qi_layer *ly = l < 0 ? NULL : &m->layers[l];
        const qi_weight *ws[7] = {&m->output};
        const int n = ly ? 7 : 1;
        if (ly) ws[0] = &ly->wq, ws[1] = &ly->wk, ws[2] = &ly->wv, ws[3] = &ly->wo, ws[4] = &ly->w_gate,
            ws[5] = &ly->w_up, ws[6] = &ly->w_down;
        for (int i = 0; i < n; i++) {
            legacy += qi_k_pack_supported(ws[i]->type);
            want += qi_k_pack_supported(ws[i]->type) || k->gemm_wide_packed[ws[i]->type] != NULL;
        }
    }
    ck_assert_int_eq(qi_model_n_packable(m), want);
    ck_assert_int_gt(legacy, 4 * m->hp.n_layer); /* q, k, gate and up (q5_0) at least */
    ck_assert_int_lt(legacy, qi_model_n_matrices(m));
    ck_assert_int_eq(want > legacy, amx); /* its q4_K and q6_K join them only on AMX */
    g_repack = true;
    qi_engine *eng = make_engine(m, "full", NULL, 0, 0.0, 64, 1); /* checks that `want` were packed */
    qi_engine_free(eng);
    g_repack = false;
    packed_close_to_plain(m, "Gemma 3");
    qi_model_free(m);
}
END_TEST

/* Gemma 3: a prompt past 1024 positions wraps the local layers' ring. */
START_TEST(gemma_ring_equals_ctx) {
    qi_model *m = qi_test_synth(QI_TEST_SYNTH_GEMMA); /* the ring's logic, any weights: bit for bit */
    ck_assert_ptr_nonnull(m);
    same_as_ctx(m, 1100, 8, 1200);
    qi_model_free(m);
}
END_TEST

int main(void) {
    const bool gemma = strcmp(qi_test_case(), "gemma") == 0;
    if (gemma && qi_test_quick()) return qi_test_skip("test_engine_gemma", "quick mode (QI_TEST_QUICK=1)");
    if (gemma && !qi_test_cached(GEMMA_FILE))
        return qi_test_skip("test_engine_gemma", GEMMA_FILE " not cached (models/fetch.sh gemma3-270m)");
    /* the KV policies' checks are bit for bit and of accounting, true for
     * any weights: on the synthetic SmolLM2 shape (testutil.h); the rest
     * read text or compare packed weights' results to a tolerance */
    if (strcmp(qi_test_case(), "policies") == 0) {
        if (!(g_model = qi_test_synth(QI_TEST_SYNTH_SMOL))) return 1;
    } else if (!(g_model = load(SMOL_FILE))) {
        return qi_test_skip("test_engine", SMOL_FILE " not cached (models/fetch.sh smollm2-135m)");
    } else if (strcmp(qi_test_case(), "engine") == 0 || !qi_test_case()[0]) {
        if (!(g_synth = qi_test_synth(QI_TEST_SYNTH_SMOL))) return 1;
    }
    Suite *s = suite_create("engine");
    TCase *tc = tcase_create("engine");
    tcase_set_timeout(tc, 900);
    tcase_add_test(tc, full_policy_equals_ctx);
    tcase_add_test(tc, batched_equals_separate);
    tcase_add_test(tc, packed_batched_equals_separate);
    tcase_add_test(tc, errors);
    tcase_add_test(tc, perplexity_through_engine);
    tcase_add_test(tc, profile_counts);
    suite_add_tcase(s, tc);
    /* the KV policies: a CTest entry of its own (test_engine_policies) */
    tc = tcase_create("policies");
    tcase_set_timeout(tc, 900);
    tcase_add_test(tc, policies_respect_budget);
    tcase_add_test(tc, fraction_budget);
    tcase_add_test(tc, budgeted_policy_ignores_neighbours);
    tcase_add_test(tc, policy_batched_equals_separate);
    tcase_add_test(tc, qinfer_fetch_reads_its_budget);
    tcase_add_test(tc, qinfer_fetch_of_everything_is_the_full_cache);
    tcase_add_test(tc, prompt_judged_at_its_end);
    tcase_add_test(tc, quest_whole_budget_equals_full);
    tcase_add_test(tc, quest_batched_equals_separate);
    tcase_add_test(tc, sparq_whole_budget_equals_full);
    tcase_add_test(tc, sparq_batched_equals_separate);
    suite_add_tcase(s, tc);
    /* Gemma 3: a CTest entry of its own (test_engine_gemma), skipped without the model and in quick mode */
    tc = tcase_create("gemma");
    tcase_set_timeout(tc, 900);
    tcase_add_test(tc, gemma_ring_equals_ctx);
    tcase_add_test(tc, gemma_packed);
    suite_add_tcase(s, tc);
    int rc = qi_test_run_suite(s);
    qi_model_free(g_model);
    qi_model_free(g_synth);
    return rc;
}

/* test_plan_engine.c - placement plans run by the engine on the CPU and
 * testdev (engine/backend/README.md), against the all-CPU run.
 *
 * testdev does the CPU's arithmetic on memory of its own, with copies that
 * complete on a worker thread, so a plan's logits must equal the all-CPU
 * run's bit for bit; a block that read a buffer of the wrong device, or
 * ran before its input's copy completed, shows as an error or as NaN.
 * Each workload is batch 1 and batch 16 (sequences of different prompt
 * lengths, some across KV block boundaries, then greedy decode steps fed
 * with the all-CPU run's tokens). Checked, on SmolLM2 (and Gemma 3 in the
 * "gemma" case):
 *   - ngl=N for N = 0, 1, half the layers, all of them, and all plus the
 *     output head; attention and MLP alternating between the devices; every
 *     block on testdev (embedding and output head too);
 *   - every KV policy with a budget, its attention on the CPU (where the
 *     policies run) and its MLP and output head on testdev;
 *   - refusals before any work: a plan over the device's capacity (naming
 *     the layer and the bytes short), a policy that evicts on a layer whose
 *     attention is on testdev, a split attention, an unknown device;
 *   - testdev's memory: weights and activations counted, KV blocks of its
 *     attention layers in its pool;
 *   - every allocation of the engine's creation, and a sample of a step's,
 *     failing in turn: an out-of-memory error, never a crash, and the
 *     engine usable after a failed step.
 * QI_TEST_QUICK=1 runs batch 4 and fewer plans.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "qinfer/engine.h"
#include "qinfer/model.h"
#include "qinfer/params.h"
#include "testutil.h"

#define SMOL_FILE "models/SmolLM2-135M-Instruct.Q4_1.gguf"
#define GEMMA_FILE "models/gemma-3-270m-q4_k_m.gguf"
#define G 6 /* decode steps */

static qi_model *g_model;

static qi_model *load(const char *file) { return qi_test_load_cached(file); }

typedef struct {
    const char *devices, *placement, *policy, *params;
    double frac;
} config;

static qi_status create(const qi_model *m, const config *c, int S, qi_engine **out, qi_err *e) {
    qi_engine_opts o;
    qi_engine_opts_default(&o);
    o.n_threads = 2;
    o.n_ctx = 256;
    o.max_seqs = S;
    o.devices = c->devices;
    o.placement = c->placement;
    o.kv_policy = c->policy ? c->policy : "full";
    o.kv_budget_frac = c->frac;
    qi_params p;
    qi_params_init(&p);
    if (c->params) ck_assert_msg(qi_params_parse(&p, c->params, e) == QI_OK, "%s", e->msg);
    o.kv_params = &p;
    return qi_engine_create(m, &o, out, e);
}

/* S sequences' logits: each prompt's last row, then G decode steps fed
 * with tokens[s][g] (or, with tokens[s][g] < 0, the argmax, written back).
 * out: [S][G + 1][V]. */
static void run(const qi_model *m, const config *c, int S, int32_t tokens[16][G], float *out) {
    const int V = m->hp.n_vocab;
    qi_engine *eng = NULL;
    qi_err e = {0};
    ck_assert_msg(create(m, c, S, &eng, &e) == QI_OK, "%s / %s: %s", c->devices, c->placement, e.msg);
    int ids[16], done[16] = {0};
    for (int s = 0; s < S; s++) {
        int32_t prompt[140];
        const int n = 3 + 9 * s; /* 3 .. 138: within and across 64-token blocks */
        uint64_t st = 1000 + (uint64_t)s;
        for (int i = 0; i < n; i++) prompt[i] = (int32_t)(qi_test_rand(&st) % 4000);
        ck_assert_int_eq(qi_engine_seq_add(eng, &ids[s], &e), QI_OK);
        ck_assert_int_eq(qi_engine_seq_feed(eng, ids[s], prompt, n, false, &e), QI_OK);
    }
    for (int left = S; left > 0;) {
        int n = 0;
        ck_assert_msg(qi_engine_step(eng, &n, &e) == QI_OK, "%s / %s: %s", c->devices, c->placement, e.msg);
        ck_assert_int_gt(n, 0);
        for (int s = 0; s < S; s++) {
            if (qi_engine_seq_n_logits(eng, ids[s]) == 0 || done[s] > G) continue;
            const float *lg = qi_engine_seq_logits(eng, ids[s], -1);
            memcpy(out + ((size_t)s * (G + 1) + done[s]) * V, lg, sizeof(float) * (size_t)V);
            if (done[s] == G) {
                done[s]++;
                left--;
                continue;
            }
            int32_t *t = &tokens[s][done[s]];
            if (*t < 0) {
                int b = 0;
                for (int v = 1; v < V; v++) b = lg[v] > lg[b] ? v : b;
                *t = b;
            }
            ck_assert_int_eq(qi_engine_seq_feed(eng, ids[s], t, 1, false, &e), QI_OK);
            done[s]++;
        }
    }
    qi_engine_free(eng);
}

/* The workload under c, against the same under the all-CPU plan. */
static void check_plan(const qi_model *m, const config *c, int S, const char *what) {
    const int V = m->hp.n_vocab;
    const size_t n = (size_t)S * (G + 1) * V;
    float *want = malloc(sizeof(float) * n), *got = malloc(sizeof(float) * n);
    int32_t tokens[16][G];
    memset(tokens, 0xff, sizeof tokens); /* -1: the reference chooses */
    const config ref = {.devices = "cpu", .placement = "all-cpu", .policy = c->policy, .params = c->params,
                        .frac = c->frac};
    run(m, &ref, S, tokens, want);
    run(m, c, S, tokens, got);
    for (size_t i = 0; i < n; i++)
        if (memcmp(&want[i], &got[i], sizeof(float)) != 0)
            ck_abort_msg("%s (%s, %s, policy %s) batch %d: logit [seq %zu][row %zu][%zu] = %.9g, all-cpu %.9g", what,
                         c->devices, c->placement, c->policy ? c->policy : "full", S, i / ((size_t)(G + 1) * V),
                         i / V % (G + 1), i % V, got[i], want[i]);
    printf("plan %-34s %-9s batch %2d: %zu logits bit-identical to all-cpu\n", what, c->policy ? c->policy : "full", S,
           n);
    free(want);
    free(got);
}

static char *plan_file(const qi_model *m, int kind) {
    static char path[3][64];
    snprintf(path[kind], sizeof path[kind], "/tmp/qi_test_plan_engine_%d_%d.txt", (int)getpid(), kind);
    FILE *f = fopen(path[kind], "w");
    ck_assert_ptr_nonnull(f);
    const int L = m->hp.n_layer;
    if (kind == 2) fprintf(f, "embd testdev\nhead testdev\n");
    if (kind == 1) fprintf(f, "head testdev\n");
    for (int l = 0; l < L; l++) {
        if (kind == 0) fprintf(f, "%s %s\n", l % 2 ? "testdev" : "cpu", l % 2 ? "cpu" : "testdev");
        if (kind == 1) fprintf(f, "cpu testdev   # attention on the host, MLP on the device\n");
        if (kind == 2) fprintf(f, "1 1\n");
    }
    fclose(f);
    return path[kind];
}

static void plans_for(const qi_model *m, const char *name) {
    const int L = m->hp.n_layer, S = qi_test_quick() ? 4 : 16;
    char ngl[5][16];
    const int ns[5] = {0, 1, L / 2, L, L + 1};
    for (int i = 0; i < 5; i++) snprintf(ngl[i], sizeof ngl[i], "ngl=%d", ns[i]);
    for (int i = 0; i < 5; i++) {
        if (qi_test_quick() && i != 2 && i != 4) continue;
        const config c = {.devices = "cpu,testdev", .placement = ngl[i]};
        char what[64];
        snprintf(what, sizeof what, "%s ngl=%d", name, ns[i]);
        check_plan(m, &c, 1, what);
        check_plan(m, &c, S, what);
    }
    const char *const kinds[] = {"alternating attention/MLP", "MLP and head on testdev", "everything on testdev"};
    for (int k = 0; k < 3; k++) {
        const config c = {.devices = "cpu,testdev", .placement = plan_file(m, k)};
        char what[64];
        snprintf(what, sizeof what, "%s %s", name, kinds[k]);
        check_plan(m, &c, 1, what);
        check_plan(m, &c, S, what);
        unlink(c.placement);
    }
}

START_TEST(smollm2_plans) { plans_for(g_model, "SmolLM2"); }
END_TEST

/* Every KV policy, its attention on the host and the rest on testdev. */
START_TEST(policies_under_plans) {
    static const config pols[] = {{.policy = "window", .frac = 0.5},
                                  {.policy = "streaming", .frac = 0.5},
                                  {.policy = "h2o", .frac = 0.5},
                                  {.policy = "qinfer", .frac = 0.5, .params = "full_layers=0,probe_every=2"}};
    const int S = qi_test_quick() ? 4 : 16;
    for (size_t i = 0; i < sizeof pols / sizeof pols[0]; i++) {
        config c = pols[i];
        c.devices = "cpu,testdev";
        c.placement = plan_file(g_model, 1);
        check_plan(g_model, &c, 1, "SmolLM2 MLP and head on testdev");
        check_plan(g_model, &c, S, "SmolLM2 MLP and head on testdev");
        unlink(c.placement);
    }
}
END_TEST

START_TEST(refusals) {
    qi_engine *eng = NULL;
    qi_err e = {0};
    const int L = g_model->hp.n_layer;
    /* over the capacity: refused before any work, naming the layer and the bytes short */
    config c = {.devices = "cpu,testdev:16M", .placement = "ngl=30"};
    ck_assert_int_eq(create(g_model, &c, 4, &eng, &e), QI_ERR_NOMEM);
    ck_assert_ptr_null(eng);
    ck_assert_msg(strstr(e.msg, "plan does not fit device testdev:16M") && strstr(e.msg, "layer ") &&
                      strstr(e.msg, "short"),
                  "%s", e.msg);
    /* a policy evicting on a layer whose attention is on testdev */
    qi_err_clear(&e);
    c = (config){.devices = "cpu,testdev", .placement = "ngl=2", .policy = "h2o", .frac = 0.5};
    ck_assert_int_eq(create(g_model, &c, 1, &eng, &e), QI_ERR_UNSUPPORTED);
    char want[64];
    snprintf(want, sizeof want, "plan layer %d: KV policy 'h2o' evicts", L - 2);
    ck_assert_msg(strstr(e.msg, want), "%s", e.msg);
    /* split attention */
    qi_err_clear(&e);
    char path[64];
    snprintf(path, sizeof path, "/tmp/qi_test_plan_split_%d.txt", (int)getpid());
    FILE *f = fopen(path, "w");
    for (int l = 0; l < L; l++) fprintf(f, "cpu cpu%s\n", l == 3 ? " 0.5" : "");
    fclose(f);
    c = (config){.devices = "cpu,testdev", .placement = path};
    ck_assert_int_eq(create(g_model, &c, 1, &eng, &e), QI_ERR_UNSUPPORTED);
    ck_assert_msg(strstr(e.msg, "plan layer 3: split attention"), "%s", e.msg);
    unlink(path);
    /* devices and placements that do not exist */
    static const char *const bad_dev[] = {"gpu", "cpu,cuda:0", "cpu,testdev:0", "cpu,testdev:1X", "testdev"};
    for (size_t i = 0; i < sizeof bad_dev / sizeof bad_dev[0]; i++) {
        qi_err_clear(&e);
        c = (config){.devices = bad_dev[i], .placement = "all-cpu"};
        ck_assert_msg(create(g_model, &c, 1, &eng, &e) == QI_ERR_INVALID, "devices '%s' accepted", bad_dev[i]);
        ck_assert_ptr_null(eng);
    }
    qi_err_clear(&e);
    c = (config){.devices = "cpu", .placement = "ngl=3"};
    ck_assert_int_eq(create(g_model, &c, 1, &eng, &e), QI_ERR_INVALID);
    ck_assert_msg(strstr(e.msg, "second device"), "%s", e.msg);
}
END_TEST

/* What testdev holds under ngl=L: the weights and activations, and the KV
 * blocks of every layer (the CPU's pool only the offload tier, empty). */
START_TEST(device_memory) {
    qi_engine *eng = NULL;
    qi_err e = {0};
    const config c = {.devices = "cpu,testdev", .placement = "ngl=31"};
    ck_assert_msg(create(g_model, &c, 2, &eng, &e) == QI_OK, "%s", e.msg);
    qi_engine_dev d;
    ck_assert(qi_engine_device(eng, 1, &d));
    ck_assert_str_eq(d.name, "testdev");
    const size_t before = d.in_use;
    ck_assert_uint_gt(before, (size_t)(0.9 * (double)g_model->weight_bytes));
    int id;
    int32_t prompt[100];
    for (int i = 0; i < 100; i++) prompt[i] = i + 10;
    ck_assert_int_eq(qi_engine_seq_add(eng, &id, &e), QI_OK);
    ck_assert_int_eq(qi_engine_seq_feed(eng, id, prompt, 100, false, &e), QI_OK);
    while (qi_engine_seq_pending(eng, id) > 0) ck_assert_int_eq(qi_engine_step(eng, NULL, &e), QI_OK);
    ck_assert(qi_engine_device(eng, 1, &d));
    qi_engine_kv_pool pool;
    qi_engine_kv_pool_stats(eng, &pool);
    /* 100 tokens: two blocks per stream, on testdev */
    const size_t kv = (size_t)2 * g_model->hp.n_layer * g_model->hp.n_head_kv * pool.block_bytes;
    ck_assert_uint_ge(d.in_use - before, kv);
    ck_assert_int_eq(pool.work_blocks, 0); /* the CPU's pool holds none of them */
    ck_assert(!qi_engine_device(eng, 2, &d));
    ck_assert_str_eq(qi_engine_plan(eng)->devices[1], "testdev");
    qi_engine_free(eng);
}
END_TEST

/* Every allocation in turn fails in the creation of an engine over both
 * devices, and a sample of them in its steps: an error, never a crash;
 * a failed creation leaves nothing, and after a failed step the engine
 * runs a new sequence to the all-CPU logits. (Under ASan in CI.) */
START_TEST(allocation_failures) {
    const config c = {.devices = "cpu,testdev", .placement = "ngl=2"};
    const int V = g_model->hp.n_vocab;
    long n_create = 0;
    for (long n = 1;; n++) {
        qi_engine *eng = NULL;
        qi_err e = {0};
        qi_alloc_fail_after(n);
        const qi_status st = create(g_model, &c, 2, &eng, &e);
        qi_alloc_fail_after(0);
        if (st == QI_OK) {
            qi_engine_free(eng);
            n_create = n - 1;
            break;
        }
        ck_assert_msg(st == QI_ERR_NOMEM, "allocation %ld: status %d (%s)", n, st, e.msg);
        ck_assert_msg(strstr(e.msg, "memory") != NULL, "allocation %ld: '%s'", n, e.msg);
        ck_assert_ptr_null(eng);
        ck_assert_int_lt(n, 100000);
    }
    ck_assert_int_gt(n_create, 20);
    /* steps: a 70-token prompt (two KV blocks a stream) and two decode steps */
    int32_t prompt[70];
    for (int i = 0; i < 70; i++) prompt[i] = 100 + i;
    float *want = malloc(sizeof(float) * (size_t)V);
    {
        qi_engine *ref = NULL;
        qi_err e = {0};
        ck_assert_int_eq(create(g_model, &c, 2, &ref, &e), QI_OK);
        int id;
        ck_assert_int_eq(qi_engine_seq_add(ref, &id, &e), QI_OK);
        ck_assert_int_eq(qi_engine_seq_feed(ref, id, prompt, 70, false, &e), QI_OK);
        while (qi_engine_seq_pending(ref, id) > 0) ck_assert_int_eq(qi_engine_step(ref, NULL, &e), QI_OK);
        memcpy(want, qi_engine_seq_logits(ref, id, -1), sizeof(float) * (size_t)V);
        qi_engine_free(ref);
    }
    /* the step's allocations (KV blocks, their buffers, logits): the first
     * ten, then every 13th, until one passes the last */
    long failed = 0;
    for (long n = 1; n < 100000; n += n < 10 ? 1 : qi_test_quick() ? 41 : 13) {
        qi_engine *eng = NULL;
        qi_err e = {0};
        ck_assert_int_eq(create(g_model, &c, 2, &eng, &e), QI_OK);
        int id;
        ck_assert_int_eq(qi_engine_seq_add(eng, &id, &e), QI_OK);
        ck_assert_int_eq(qi_engine_seq_feed(eng, id, prompt, 70, false, &e), QI_OK);
        qi_alloc_fail_after(n);
        qi_status st = QI_OK;
        while (!st && qi_engine_seq_pending(eng, id) > 0) st = qi_engine_step(eng, NULL, &e);
        qi_alloc_fail_after(0);
        if (st) {
            failed++;
            ck_assert_msg(st == QI_ERR_NOMEM, "step allocation %ld: status %d (%s)", n, st, e.msg);
            ck_assert_int_eq(qi_engine_seq_remove(eng, id, &e), QI_OK);
            ck_assert_int_eq(qi_engine_seq_add(eng, &id, &e), QI_OK);
            ck_assert_int_eq(qi_engine_seq_feed(eng, id, prompt, 70, false, &e), QI_OK);
            while (qi_engine_seq_pending(eng, id) > 0)
                ck_assert_msg(qi_engine_step(eng, NULL, &e) == QI_OK, "after a failure: %s", e.msg);
        }
        ck_assert_msg(memcmp(qi_engine_seq_logits(eng, id, -1), want, sizeof(float) * (size_t)V) == 0,
                      "step allocation %ld: logits differ after %s", n, st ? "a failed step" : "no failure");
        qi_engine_free(eng);
        if (!st) break; /* past the step's last allocation */
    }
    ck_assert_int_gt(failed, 0);
    printf("allocation failures: engine creation failed cleanly at each of its %ld allocations, a step at %ld of "
           "its allocations\n", n_create, failed);
    free(want);
}
END_TEST

START_TEST(gemma_plans) {
    qi_model *m = load(GEMMA_FILE);
    ck_assert_ptr_nonnull(m);
    plans_for(m, "Gemma 3");
    qi_model_free(m);
}
END_TEST

int main(void) {
    const bool gemma = strcmp(qi_test_case(), "gemma") == 0;
    if (gemma && !qi_test_cached(GEMMA_FILE))
        return qi_test_skip("test_plan_engine_gemma", GEMMA_FILE " not cached (models/fetch.sh gemma3-270m)");
    g_model = load(SMOL_FILE);
    if (!g_model)
        return qi_test_skip(gemma ? "test_plan_engine_gemma" : "test_plan_engine",
                            SMOL_FILE " not cached (models/fetch.sh smollm2-135m)");
    Suite *s = suite_create("plan_engine");
    TCase *tc = tcase_create("smollm2");
    tcase_set_timeout(tc, 1200);
    tcase_add_test(tc, smollm2_plans);
    tcase_add_test(tc, policies_under_plans);
    tcase_add_test(tc, refusals);
    tcase_add_test(tc, device_memory);
    tcase_add_test(tc, allocation_failures);
    suite_add_tcase(s, tc);
    tc = tcase_create("gemma");
    tcase_set_timeout(tc, 1200);
    tcase_add_test(tc, gemma_plans);
    suite_add_tcase(s, tc);
    const int rc = qi_test_run_suite(s);
    qi_model_free(g_model);
    return rc;
}

/* test_plan_block.c - the zig-zag block schedule (plan.h's gpu_batch,
 * engine/engine_zigzag.c).
 *
 * "exact" (cpu,testdev, synthetic models of SmolLM2's and Gemma 3's layer
 * shapes): a plan run as a block of GPU batches gives the logits of the
 * same plan run as ordinary steps, bit for bit, over 4 sequences of
 * different prompt lengths and greedy decode steps: GPU batches of 2 (2 x
 * 2) and 1 (4 x 1) under every layer streamed, of 3 (3 + 1) under
 * streamed layers mixed with held and host ones, and of 2 with every
 * layer's attention on the host's KV (split ratio 1, FlexGen's cache on
 * the CPU). QI_TEST_QUICK=1 leaves out the mix and Gemma 3's shapes. Refused: a block with a KV
 * policy other than full, and a plan without a block on an engine made
 * with one (its device holds one GPU batch's activations). testdev's copies
 * complete on a worker thread and fill their destination with NaN first,
 * and are held back (its main stream's 200 us each, its copy stream's
 * until 4 more ops have run), so a host layer that read the store before
 * a GPU batch's rows arrived there (or a weight read before its upload)
 * fails the comparison.
 *
 * "sim" (the simulated round machine, every layer streamed): a decode step
 * of 4 GPU batches of 1 takes the link's time for the layers' weights once
 * (their bytes over the link), not once per GPU batch: within 1.5x of one
 * pass of the weights, where batches run one after another through all
 * layers would take four.
 *
 * "policy" (GLPK builds): the flexgen placement policy with block=1 gives
 * plans with gpu_batch its GPU batch size, and the memory check counts
 * one GPU batch's activations there (less than a whole step's); without
 * block=1 its plans have none, as before.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "placement/placement_policy.h"
#include "qinfer/engine.h"
#include "qinfer/model.h"
#include "testutil.h"

#define S 4 /* sequences */
#define G 4 /* decode steps */

static qi_model *g_model;

/* A plan file: kind 0 every layer streamed to DEV, 1 streamed, held and
 * host layers in turn, 2 every layer held with its attention's KV on the
 * host (split 1); then `gpu_batch gb` unless gb is 0. */
static void plan_file(const char *path, int L, int kind, const char *dev, int gb) {
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    for (int l = 0; l < L; l++) {
        if (kind == 0) fprintf(f, "%s~ %s~\n", dev, dev);
        if (kind == 1)
            fprintf(f, "%s\n", l % 3 == 0 ? "testdev~ testdev~" : l % 3 == 1 ? "testdev testdev" : "cpu cpu");
        if (kind == 2) fprintf(f, "%s %s 1 cpu\n", dev, dev);
    }
    if (gb) fprintf(f, "gpu_batch %d\n", gb);
    fclose(f);
}

/* The engine's options for S sequences over cpu,testdev under placement. */
static qi_engine_opts opts_for(const char *placement) {
    qi_engine_opts o;
    qi_engine_opts_default(&o);
    o.n_threads = 2;
    o.n_ctx = 256;
    o.max_seqs = S;
    o.devices = "cpu,testdev";
    o.placement = placement;
    return o;
}

/* S sequences' logits under placement: each prompt's last row, then G
 * greedy decode steps; out [S][G + 1][V]. */
static void run(const char *placement, float *out) {
    const int V = g_model->hp.n_vocab;
    const qi_engine_opts o = opts_for(placement);
    qi_engine *eng = NULL;
    qi_err e = {0};
    ck_assert_msg(qi_engine_create(g_model, &o, &eng, &e) == QI_OK, "%s: %s", placement, e.msg);
    qi_testdev_slow_copies(qi_engine_backend(eng, 1), 4, 2000);
    qi_testdev_slow_main_copies(qi_engine_backend(eng, 1), 200);
    int ids[S], done[S] = {0};
    for (int s = 0; s < S; s++) {
        int32_t prompt[64];
        const int n = 3 + 17 * s; /* 3 .. 54 */
        uint64_t st = 1000 + (uint64_t)s;
        for (int i = 0; i < n; i++) prompt[i] = (int32_t)(qi_test_rand(&st) % 4000);
        ck_assert_int_eq(qi_engine_seq_add(eng, &ids[s], &e), QI_OK);
        ck_assert_int_eq(qi_engine_seq_feed(eng, ids[s], prompt, n, false, &e), QI_OK);
    }
    for (int left = S; left > 0;) {
        int n = 0;
        ck_assert_msg(qi_engine_step(eng, &n, &e) == QI_OK, "%s: %s", placement, e.msg);
        ck_assert_int_gt(n, 0);
        for (int s = 0; s < S; s++) {
            if (qi_engine_seq_n_logits(eng, ids[s]) == 0 || done[s] > G) continue;
            const float *lg = qi_engine_seq_logits(eng, ids[s], -1);
            memcpy(out + ((size_t)s * (G + 1) + done[s]) * V, lg, sizeof(float) * (size_t)V);
            if (done[s]++ == G) {
                left--;
                continue;
            }
            int32_t b = 0;
            for (int v = 1; v < V; v++) b = lg[v] > lg[b] ? v : b;
            ck_assert_int_eq(qi_engine_seq_feed(eng, ids[s], &b, 1, false, &e), QI_OK);
        }
    }
    qi_engine_free(eng);
}

static void exact_for(const char *name) {
    const int L = g_model->hp.n_layer, V = g_model->hp.n_vocab;
    const size_t n = (size_t)S * (G + 1) * V;
    float *want = malloc(sizeof(float) * n), *got = malloc(sizeof(float) * n);
    ck_assert(want && got);
    char path[64];
    snprintf(path, sizeof path, "/tmp/qi_test_plan_block_%d.txt", (int)getpid());
    static const char *const kinds[] = {"every layer streamed", "streamed, held and host layers",
                                        "KV on the host (split 1)"};
    /* GPU batches of 2 and 1 under every layer streamed, of 3 (3 + 1)
     * under the mix, of 2 under the host's KV; quick: the first and last */
    static const int gbs[3][2] = {{2, 1}, {3, 0}, {2, 0}};
    for (int k = 0; k < 3; k++) {
        if (qi_test_quick() && k == 1) continue;
        plan_file(path, L, k, "testdev", 0);
        run(path, want);
        for (int i = 0; i < 2 && gbs[k][i]; i++) {
            plan_file(path, L, k, "testdev", gbs[k][i]);
            run(path, got);
            for (size_t j = 0; j < n; j++)
                if (memcmp(&want[j], &got[j], sizeof(float)) != 0)
                    ck_abort_msg("%s, %s, GPU batches of %d: logit [seq %zu][row %zu][%zu] = %.9g, ordinary step %.9g",
                                 name, kinds[k], gbs[k][i], j / V / (G + 1), j / V % (G + 1), j % V, got[j], want[j]);
            printf("block %-8s %-32s GPU batches of %d: %zu logits bit-identical to the ordinary step\n", name,
                   kinds[k], gbs[k][i], n);
        }
    }
    unlink(path);
    free(want);
    free(got);
}

START_TEST(smollm2_exact) { exact_for("smollm2"); }
END_TEST

START_TEST(gemma_exact) {
    if (qi_test_quick()) return; /* quick: SmolLM2's shapes only */
    qi_model *m = qi_test_synth(QI_TEST_SYNTH_GEMMA), *keep = g_model;
    ck_assert_ptr_nonnull(m);
    g_model = m;
    exact_for("gemma3");
    g_model = keep;
    qi_model_free(m);
}
END_TEST

/* Refused: a block with a KV policy other than full; a plan without a
 * block on an engine made with one. */
START_TEST(refusals) {
    char path[64];
    snprintf(path, sizeof path, "/tmp/qi_test_plan_block_r_%d.txt", (int)getpid());
    plan_file(path, g_model->hp.n_layer, 0, "testdev", 2);
    qi_engine_opts o = opts_for(path);
    o.kv_policy = "h2o";
    o.kv_budget_frac = 0.5;
    qi_engine *eng = NULL;
    qi_err e = {0};
    ck_assert_int_eq(qi_engine_create(g_model, &o, &eng, &e), QI_ERR_UNSUPPORTED);
    ck_assert_msg(strstr(e.msg, "block schedule"), "%s", e.msg);
    /* made with a block, testdev holds one GPU batch's activations: a new
     * plan without one is refused, the block kept running */
    o.kv_policy = "full";
    o.kv_budget_frac = 0.0;
    qi_err_clear(&e);
    ck_assert_msg(qi_engine_create(g_model, &o, &eng, &e) == QI_OK, "%s", e.msg);
    char spec[80];
    snprintf(spec, sizeof spec, "%s.whole", path);
    plan_file(spec, g_model->hp.n_layer, 0, "testdev", 0);
    ck_assert_int_eq(qi_engine_replan_spec(eng, spec, NULL, &e), QI_ERR_INVALID);
    ck_assert_msg(strstr(e.msg, "one GPU batch"), "%s", e.msg);
    ck_assert_int_eq(qi_engine_plan(eng)->gpu_batch, 2);
    qi_engine_free(eng);
    unlink(spec);
    unlink(path);
}
END_TEST

/* The round machine of test_sim.c with a slow link (1 GB/s), so that a
 * streamed step is the link's time for the weights rather than launches. */
static const char k_round[] =
    "name = round\nkind = server\ngpu.name = round GPU\nlink.name = round link\ncpu.name = round CPU\n"
    "gpu.count = 1 # source: test\ngpu.fp16_tensor = 100 TFLOP/s # source: test\n"
    "gpu.int8_tensor = 200 TOP/s # source: test\ngpu.fp32 = 10 TFLOP/s # source: test\n"
    "gpu.mem_bw = 1 TB/s # source: test\ngpu.mem = 1 GiB # source: test\ngpu.launch = 10 us # source: test\n"
    "link.h2d_bw = 1 GB/s # source: test\nlink.d2h_bw = 1 GB/s # source: test\n"
    "link.latency = 20 us # source: test\ncpu.sockets = 1 # source: test\ncpu.cores = 8 # source: test\n"
    "cpu.fp32 = 100 GFLOP/s # source: test\ncpu.mem_bw = 10 GB/s # source: test\ncpu.mem = 1 GiB # source: test\n";

/* Simulated seconds of one decode step of S sequences under placement. */
static double sim_decode(const char *prof, const char *placement) {
    qi_engine_opts o;
    qi_engine_opts_default(&o);
    o.n_threads = 1;
    o.n_ctx = 64;
    o.max_seqs = S;
    o.sim = prof;
    o.devices = "cpu,gpu";
    o.placement = placement;
    qi_engine *en = NULL;
    qi_err e = {0};
    ck_assert_msg(qi_engine_create(g_model, &o, &en, &e) == QI_OK, "%s", e.msg);
    int ids[S];
    int32_t toks[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    for (int s = 0; s < S; s++) {
        ck_assert_int_eq(qi_engine_seq_add(en, &ids[s], &e), QI_OK);
        ck_assert_int_eq(qi_engine_seq_feed(en, ids[s], toks, 8, false, &e), QI_OK);
    }
    ck_assert_int_eq(qi_engine_step(en, NULL, &e), QI_OK);
    for (int s = 0; s < S; s++) ck_assert_int_eq(qi_engine_seq_feed(en, ids[s], toks, 1, false, &e), QI_OK);
    const double t0 = qi_engine_now(en);
    ck_assert_msg(qi_engine_step(en, NULL, &e) == QI_OK, "%s", e.msg);
    const double dt = qi_engine_now(en) - t0;
    qi_engine_free(en);
    return dt;
}

START_TEST(sim_weights_once) {
    char prof[64], path[64];
    snprintf(prof, sizeof prof, "/tmp/qi_test_plan_block_%d.profile", (int)getpid());
    snprintf(path, sizeof path, "/tmp/qi_test_plan_block_s_%d.txt", (int)getpid());
    FILE *f = fopen(prof, "w");
    ck_assert_ptr_nonnull(f);
    fputs(k_round, f);
    fclose(f);
    const int L = g_model->hp.n_layer;
    double wb = 0;
    for (int k = 1; k < 2 * L + 1; k++) wb += (double)qi_plan_block_bytes(g_model, k);
    qi_sim_params def;
    qi_sim_params_default(&def);
    const double link_s = wb / (1e9 * def.link);
    plan_file(path, L, 0, "gpu", 0);
    const double whole = sim_decode(prof, path);
    plan_file(path, L, 0, "gpu", 1);
    const double block = sim_decode(prof, path);
    printf("sim decode of %d sequences, every layer streamed: one step %.6f s, a block of %d GPU batches %.6f s; "
           "the weights over the link %.6f s\n",
           S, whole, S, block, link_s);
    fflush(stdout);
    ck_assert_msg(whole > link_s && block > link_s, "a step under the link's time for the weights");
    ck_assert_msg(block < 1.5 * link_s, "a block of %d GPU batches %g s: the weights were charged more than once "
                  "(link %g s)", S, block, link_s);
    unlink(path);
    unlink(prof);
}
END_TEST

#ifdef QI_HAVE_GLPK
START_TEST(flexgen_block) {
    ck_assert_int_eq(chdir(QI_SOURCE_DIR), 0);
    const qi_placement_workload wl = {.batch = 16, .prompt_len = 128, .gen_len = 32};
    double wb = 0;
    for (int b = 1; b < qi_plan_n_blocks(g_model->hp.n_layer); b++) wb += (double)qi_plan_block_bytes(g_model, b);
    int n_block = 0;
    for (int blk = 0; blk < 2; blk++) {
        char spec[160];
        snprintf(spec, sizeof spec, "policy:flexgen:profile=engine/backend/sim/profiles/t4-cloud-vm.profile,stream=1%s",
                 blk ? ",block=1" : "");
        qi_placement_policy *p = NULL;
        qi_err e = {0};
        ck_assert_msg(qi_placement_policy_from_spec(spec, &p, &e) == QI_OK, "%s", e.msg);
        for (int k = 1; k <= 8; k++) {
            qi_placement_devices d = {.n_devices = 2};
            snprintf(d.dev[0].name, sizeof d.dev[0].name, "cpu");
            d.dev[0].kind = QI_PLACEMENT_DEV_CPU;
            snprintf(d.dev[1].name, sizeof d.dev[1].name, "gpu");
            d.dev[1].kind = QI_PLACEMENT_DEV_ACCEL;
            d.dev[1].capacity = d.dev[1].free = (size_t)(wb * k / 4);
            qi_plan got = {0};
            ck_assert_msg(qi_placement_policy_plan(p, g_model, &d, &wl, &got, &e) == QI_OK, "%s", e.msg);
            if (!blk) ck_assert_int_eq(got.gpu_batch, 0);
            if (blk && got.gpu_batch > 0) {
                ck_assert_int_le(got.gpu_batch, wl.batch);
                n_block++;
                const size_t need = qi_placement_need(g_model, &wl, &got, 1);
                const int gb = got.gpu_batch;
                got.gpu_batch = 0;
                const size_t whole = qi_placement_need(g_model, &wl, &got, 1);
                printf("flexgen block=1, %zu bytes free: GPU batches of %d, the accelerator needs %zu bytes (a "
                       "whole step's activations: %zu)\n", d.dev[1].capacity, gb, need, whole);
                ck_assert_msg(gb == wl.batch ? need == whole : need < whole,
                              "a GPU batch's activations %zu, a step's %zu", need, whole);
            }
            qi_plan_free(&got);
        }
        qi_placement_policy_free(p);
    }
    ck_assert_msg(n_block > 0, "no plan with a block schedule");
}
END_TEST
#endif

int main(void) {
    const char *cs = qi_test_case();
    if (!(g_model = qi_test_synth(QI_TEST_SYNTH_SMOL))) return 1;
    Suite *s = suite_create("plan_block");
    TCase *tc = tcase_create("exact");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, smollm2_exact);
    tcase_add_test(tc, gemma_exact);
    tcase_add_test(tc, refusals);
    suite_add_tcase(s, tc);
    tc = tcase_create("sim");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, sim_weights_once);
    suite_add_tcase(s, tc);
#ifdef QI_HAVE_GLPK
    tc = tcase_create("policy");
    tcase_add_test(tc, flexgen_block);
    suite_add_tcase(s, tc);
#endif
    (void)cs;
    const int rc = qi_test_run_suite(s);
    qi_model_free(g_model);
    return rc;
}

/* test_ratio.c - the ratio placement policy (policies/placement/ratio.c).
 *
 * "ratio": the rule on hand-made observations: the base plan is static's
 * with every accelerator attention split toward the CPU at `start` and no
 * other; a layer whose accelerator is slower moves its ratio up one step,
 * one whose CPU is slower down one step, one within the tolerance or a
 * context within min_ctx not at all; the ratio stays within [0, max_r];
 * a KV budget gets no splits and moves nothing; parameters and errors.
 *
 * "sim": a simulated A100 server running a LLaMA-2-70B of shapes only on a
 * 24 GiB GPU, eight sequences at a context of 1024, the policy observing
 * and re-planning through qi_placement_ctl_tick between decode steps: the
 * ratios settle (each layer's last ratios within one step of each other)
 * within the steps allowed, and the decode step with the settled ratios
 * takes no longer than with every ratio at `start`.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "placement/placement_policy.h"
#include "qinfer/engine.h"
#include "qinfer/model.h"
#include "testutil.h"

/* ---- a small model of shapes ------------------------------------------------------------- */

enum { L = 8 };
static qi_layer layers[L];

static qi_model small_model(void) {
    qi_model m;
    qi_test_tiny_shapes(&m, layers, L, 1);
    return m;
}

/* cpu and an accelerator with room for about half the layers and their KV */
static qi_placement_devices half_room(const qi_model *m, const qi_placement_workload *wl) {
    qi_placement_devices d = {.n_devices = 2};
    snprintf(d.dev[0].name, sizeof d.dev[0].name, "cpu");
    snprintf(d.dev[1].name, sizeof d.dev[1].name, "testdev");
    d.dev[1].kind = QI_PLACEMENT_DEV_ACCEL;
    size_t all = 0;
    for (int l = 0; l < L; l++)
        all += qi_plan_block_bytes(m, 1 + 2 * l) + qi_plan_block_bytes(m, 2 + 2 * l) + qi_placement_kv_bytes(m, wl, l);
    d.dev[1].capacity = d.dev[1].free = all / 2;
    d.dev[1].holds_act = true;
    return d;
}

static qi_placement_policy *make(const char *spec) {
    qi_placement_policy *p = NULL;
    qi_err e = {0};
    qi_params pr;
    qi_params_init(&pr);
    ck_assert_int_eq(qi_params_parse(&pr, spec, &e), QI_OK);
    ck_assert_msg(qi_placement_policy_create("ratio", &pr, &p, &e) == QI_OK, "%s", e.msg);
    return p;
}

static void plan_of(qi_placement_policy *p, const qi_model *m, const qi_placement_devices *d,
                    const qi_placement_workload *wl, qi_plan *out) {
    qi_err e = {0};
    ck_assert_msg(qi_placement_policy_plan(p, m, d, wl, out, &e) == QI_OK, "%s", e.msg);
}

/* One observation of plan p: layer l's attention took gpu[l] on the
 * accelerator and cpu[l] on the CPU. */
static void observe(qi_placement_policy *p, const qi_plan *run, const qi_placement_workload *wl, const double *gpu,
                    const double *cpu) {
    double block_s[2 * L + 2] = {0}, split_s[2 * L + 2] = {0}, attn_s[2 * L + 2] = {0};
    for (int l = 0; l < L; l++) {
        attn_s[1 + 2 * l] = gpu[l];
        split_s[1 + 2 * l] = cpu[l];
        block_s[1 + 2 * l] = gpu[l] > cpu[l] ? gpu[l] : cpu[l];
    }
    const qi_placement_times t = {.plan = run, .n_blocks = 2 * L + 2, .block_s = block_s, .split_s = split_s,
                                  .attn_s = attn_s, .wl = wl, .steps = 1};
    qi_placement_policy_observe(p, &t);
}

START_TEST(test_base_plan) {
    qi_model m = small_model();
    const qi_placement_workload wl = {.batch = 4, .prompt_len = 512, .gen_len = 64};
    const qi_placement_devices d = half_room(&m, &wl);
    qi_placement_policy *p = make(""), *st = NULL;
    qi_err e = {0};
    ck_assert_int_eq(qi_placement_policy_create("static", NULL, &st, &e), QI_OK);
    qi_plan got, base;
    plan_of(p, &m, &d, &wl, &got);
    plan_of(st, &m, &d, &wl, &base);
    int on_acc = 0;
    for (int l = 0; l < L; l++) {
        const qi_plan_layer *y = &got.layers[l];
        ck_assert_int_eq(y->attn_dev, base.layers[l].attn_dev);
        ck_assert_int_eq(y->mlp_dev, base.layers[l].mlp_dev);
        if (y->attn_dev) {
            on_acc++;
            ck_assert_float_eq(y->split, 0.25f);
            ck_assert_int_eq(y->split_dev, 0);
        } else {
            ck_assert_float_eq(y->split, 0.0f);
            ck_assert_int_eq(y->split_dev, -1);
        }
    }
    ck_assert_int_eq(got.head_dev, base.head_dev);
    /* some layers on each device: the splits follow the accelerator's layers */
    ck_assert_int_gt(on_acc, 0);
    ck_assert_int_lt(on_acc, L);
    qi_plan_free(&got);
    qi_plan_free(&base);
    qi_placement_policy_free(st);
    qi_placement_policy_free(p);
}
END_TEST

/* The ratio of every layer of plan p (0 where not split). */
static void ratios(const qi_plan *p, double *r) {
    for (int l = 0; l < L; l++) r[l] = p->layers[l].split;
}

START_TEST(test_rule) {
    qi_model m = small_model();
    const qi_placement_workload wl = {.batch = 4, .prompt_len = 512, .gen_len = 64};
    const qi_placement_devices d = half_room(&m, &wl);
    qi_placement_policy *p = make("");
    qi_plan p0, p1;
    plan_of(p, &m, &d, &wl, &p0);
    const int top = L - 1; /* the last layers are the accelerator's */
    ck_assert_int_ne(p0.layers[top].attn_dev, 0);
    ck_assert_int_ne(p0.layers[top - 1].attn_dev, 0);
    ck_assert_int_ne(p0.layers[top - 2].attn_dev, 0);
    ck_assert_int_eq(p0.layers[0].attn_dev, 0);
    double gpu[L], cpu[L], r[L];
    for (int l = 0; l < L; l++) gpu[l] = cpu[l] = 1e-3;
    gpu[top] = 2e-3;       /* the accelerator slower: r up */
    cpu[top - 1] = 2e-3;   /* the CPU slower: r down */
    gpu[top - 2] = 1.04e-3; /* 2% of the sum apart: within tol, unchanged */
    gpu[0] = 5e-3;         /* a CPU layer: never split */
    observe(p, &p0, &wl, gpu, cpu);
    plan_of(p, &m, &d, &wl, &p1);
    ratios(&p1, r);
    ck_assert_double_eq_tol(r[top], 0.30, 1e-6);
    ck_assert_double_eq_tol(r[top - 1], 0.20, 1e-6);
    ck_assert_double_eq_tol(r[top - 2], 0.25, 1e-6);
    ck_assert_double_eq(r[0], 0.0);
    ck_assert_int_eq(p1.layers[0].split_dev, -1);
    /* 4% of the sum apart: past tol, moves */
    gpu[top - 2] = 1.09e-3;
    observe(p, &p1, &wl, gpu, cpu);
    qi_plan_free(&p1);
    plan_of(p, &m, &d, &wl, &p1);
    ratios(&p1, r);
    ck_assert_double_eq_tol(r[top - 2], 0.30, 1e-6);
    ck_assert_double_eq_tol(r[top], 0.35, 1e-6);
    /* a context within min_ctx: nothing moves */
    const qi_placement_workload shortwl = {.batch = 4, .prompt_len = 256, .gen_len = 320};
    observe(p, &p1, &shortwl, gpu, cpu);
    qi_plan p2;
    plan_of(p, &m, &d, &wl, &p2);
    for (int l = 0; l < L; l++) ck_assert_float_eq(p2.layers[l].split, p1.layers[l].split);
    qi_plan_free(&p2);
    /* clamped: at most max_r, and at 0 the layer runs unsplit (top - 1
     * from 0.15: 0.10, 0.05, 0, then 0.05 and 0 in turn, as an unsplit
     * layer's CPU share takes no time: 0 after an odd count) */
    for (int i = 0; i < 31; i++) {
        observe(p, &p1, &wl, gpu, cpu);
        qi_plan_free(&p1);
        plan_of(p, &m, &d, &wl, &p1);
    }
    ratios(&p1, r);
    ck_assert_double_eq_tol(r[top], 0.75, 1e-6);
    ck_assert_double_eq(r[top - 1], 0.0);
    ck_assert_int_eq(p1.layers[top - 1].split_dev, -1);
    ck_assert_int_ne(p1.layers[top - 1].attn_dev, 0);
    /* an unsplit accelerator layer is still observed: any accelerator time,
     * none on the CPU, moves it back up */
    cpu[top - 1] = 0;
    observe(p, &p1, &wl, gpu, cpu);
    qi_plan_free(&p1);
    plan_of(p, &m, &d, &wl, &p1);
    ck_assert_double_eq_tol(p1.layers[top - 1].split, 0.05, 1e-6);
    ck_assert_int_eq(p1.layers[top - 1].split_dev, 0);
    qi_plan_free(&p0);
    qi_plan_free(&p1);
    qi_placement_policy_free(p);

    /* the parameters: start, step, max_r */
    p = make("start=0.5,step=0.1,max_r=0.6,tol=0.2,min_ctx=10");
    plan_of(p, &m, &d, &wl, &p0);
    ck_assert_float_eq(p0.layers[top].split, 0.5f);
    for (int l = 0; l < L; l++) gpu[l] = cpu[l] = 1e-3;
    gpu[top] = 1.3e-3;   /* 13% of the sum: within tol=0.2 */
    gpu[top - 1] = 2e-3; /* 33%: up by 0.1, then clamped at 0.6 */
    const qi_placement_workload w20 = {.batch = 4, .prompt_len = 20, .gen_len = 556};
    observe(p, &p0, &w20, gpu, cpu);
    plan_of(p, &m, &d, &wl, &p1);
    ck_assert_double_eq_tol(p1.layers[top].split, 0.5, 1e-6);
    ck_assert_double_eq_tol(p1.layers[top - 1].split, 0.6, 1e-6);
    observe(p, &p1, &w20, gpu, cpu);
    qi_plan_free(&p1);
    plan_of(p, &m, &d, &wl, &p1);
    ck_assert_double_eq_tol(p1.layers[top - 1].split, 0.6, 1e-6);
    qi_plan_free(&p0);
    qi_plan_free(&p1);
    qi_placement_policy_free(p);
}
END_TEST

/* A KV budget (an evicting KV policy, which a split layer cannot run): the
 * base plan unsplit, and its observations move nothing. */
START_TEST(test_budget) {
    qi_model m = small_model();
    const qi_placement_workload wl = {.batch = 4, .prompt_len = 512, .gen_len = 64},
                                bwl = {.batch = 4, .prompt_len = 512, .gen_len = 64, .kv_budget = 128};
    const qi_placement_devices d = half_room(&m, &wl);
    qi_placement_policy *p = make("");
    qi_plan pb, pf;
    plan_of(p, &m, &d, &bwl, &pb);
    int on_acc = 0;
    for (int l = 0; l < L; l++) {
        ck_assert_float_eq(pb.layers[l].split, 0.0f);
        on_acc += pb.layers[l].attn_dev != 0;
    }
    ck_assert_int_gt(on_acc, 0);
    double gpu[L], cpu[L];
    for (int l = 0; l < L; l++) gpu[l] = 3e-3, cpu[l] = 0;
    observe(p, &pb, &bwl, gpu, cpu);
    plan_of(p, &m, &d, &wl, &pf);
    for (int l = 0; l < L; l++)
        if (pf.layers[l].attn_dev) ck_assert_float_eq(pf.layers[l].split, 0.25f);
    qi_plan_free(&pb);
    qi_plan_free(&pf);
    qi_placement_policy_free(p);
}
END_TEST

/* The CPU alone: all-cpu, nothing split. */
START_TEST(test_cpu_only) {
    qi_model m = small_model();
    const qi_placement_workload wl = {.batch = 1, .prompt_len = 512, .gen_len = 64};
    qi_placement_devices d = {.n_devices = 1};
    snprintf(d.dev[0].name, sizeof d.dev[0].name, "cpu");
    qi_placement_policy *p = make("");
    qi_plan out;
    plan_of(p, &m, &d, &wl, &out);
    for (int l = 0; l < L; l++) {
        ck_assert_int_eq(out.layers[l].attn_dev, 0);
        ck_assert_float_eq(out.layers[l].split, 0.0f);
    }
    qi_plan_free(&out);
    qi_placement_policy_free(p);
}
END_TEST

START_TEST(test_params) {
    const char *bad[][2] = {{"speed=2", "speed"},      {"start=-0.1", "start"}, {"start=0.9", "start"},
                            {"max_r=1.5", "max_r"},    {"step=0", "step"},      {"tol=x", "tol"},
                            {"min_ctx=-1", "min_ctx"}, {"start=0.5,max_r=0.4", "start"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        qi_placement_policy *p = NULL;
        qi_err e = {0};
        qi_params pr;
        qi_params_init(&pr);
        ck_assert_int_eq(qi_params_parse(&pr, bad[i][0], &e), QI_OK);
        ck_assert_int_eq(qi_placement_policy_create("ratio", &pr, &p, &e), QI_ERR_INVALID);
        ck_assert_ptr_null(p);
        ck_assert_msg(strstr(e.msg, "ratio") && strstr(e.msg, bad[i][1]), "%s: %s", bad[i][0], e.msg);
    }
    qi_placement_policy *p = NULL;
    qi_err e = {0};
    ck_assert_int_eq(qi_placement_policy_from_spec("policy:ratio:start=0,step=0.1", &p, &e), QI_OK);
    ck_assert_str_eq(qi_placement_policy_name(p), "ratio");
    qi_placement_policy_free(p);
}
END_TEST

/* ---- on a simulated A100 server ------------------------------------------------------------ */

static char g_l70[256];
static qi_model *g_m70;
#define A100 QI_SOURCE_DIR "/engine/backend/sim/profiles/a100-pcie-2xeon.profile"
#define DEVICES "cpu,gpu:24G"
enum { B = 8, CTX = 1024, GEN = 64, MAX_STEPS = 40, SETTLE = 6, TIMED_STEPS = 3 };

static qi_status decode(qi_engine *en, const int *ids, qi_err *e) {
    for (int s = 0; s < B; s++) {
        const int32_t tok = 400;
        ck_assert_int_eq(qi_engine_seq_feed(en, ids[s], &tok, 1, false, e), QI_OK);
    }
    return qi_engine_step(en, NULL, e);
}

static qi_engine *sim_engine(qi_err *e) {
    qi_engine_opts o;
    qi_engine_opts_default(&o);
    o.n_threads = 1;
    o.max_seqs = B;
    o.n_ctx = 2048;
    o.step_tokens = 512;
    o.profile = true;
    o.sim = A100;
    o.devices = DEVICES;
    qi_engine *en = NULL;
    ck_assert_msg(qi_engine_create(g_m70, &o, &en, e) == QI_OK, "%s", e->msg);
    return en;
}

/* B sequences of `prompt` tokens each, prefilled */
static void add_seqs(qi_engine *en, int prompt, int *ids) {
    static int32_t toks[2048];
    qi_err e = {0};
    ck_assert_int_le(prompt, 2048);
    for (int i = 0; i < prompt; i++) toks[i] = 300 + i % 1000;
    for (int s = 0; s < B; s++) {
        ck_assert_int_eq(qi_engine_seq_add(en, &ids[s], &e), QI_OK);
        ck_assert_int_eq(qi_engine_seq_feed(en, ids[s], toks, prompt, false, &e), QI_OK);
    }
    for (int n = 1; n > 0;) ck_assert_msg(qi_engine_step(en, &n, &e) == QI_OK, "%s", e.msg);
}

/* The simulated seconds of one decode step under plan p, B sequences at
 * context ctx: a fresh engine takes the plan, then the prompts (nothing to
 * move), and decodes TIMED_STEPS steps. */
static double step_time(const qi_plan *p, int ctx) {
    qi_err e = {0};
    qi_engine *en = sim_engine(&e);
    ck_assert_msg(qi_engine_replan(en, p, NULL, &e) == QI_OK, "%s", e.msg);
    int ids[B];
    add_seqs(en, ctx, ids);
    const double t0 = qi_engine_now(en);
    for (int i = 0; i < TIMED_STEPS; i++) ck_assert_msg(decode(en, ids, &e) == QI_OK, "%s", e.msg);
    const double t = (qi_engine_now(en) - t0) / TIMED_STEPS;
    qi_engine_free(en);
    return t;
}

START_TEST(test_sim) {
    qi_err e = {0};
    qi_engine *en = sim_engine(&e);
    const int NL = g_m70->hp.n_layer;
    qi_placement_policy *pol = make("");
    qi_placement_ctl ctl;
    qi_placement_ctl_init(&ctl, pol, 2.0);
    /* the plan for the workload first, then its prompts */
    const qi_placement_workload w0 = {.batch = B, .prompt_len = CTX, .gen_len = GEN};
    ck_assert_msg(qi_placement_ctl_tick(&ctl, en, g_m70, &w0, NULL, &e) == QI_OK, "%s", e.msg);
    int ids[B];
    add_seqs(en, CTX, ids);
    qi_engine_block_times_reset(en); /* the prompts are not decode steps */

    /* decode, a tick before every step; the ratios of every step's plan */
    static float hist[MAX_STEPS][256];
    ck_assert_int_le(NL, 256);
    int n_split = 0;
    for (int l = 0; l < NL; l++) n_split += qi_engine_plan(en)->layers[l].attn_dev != 0;
    ck_assert_int_gt(n_split, 0);
    ck_assert_int_lt(n_split, NL);
    qi_engine_prof pr0, pr1;
    qi_engine_profile(en, &pr0);
    const long plans0 = ctl.replans;
    int steps = 0;
    for (; steps < MAX_STEPS; steps++) {
        const qi_placement_workload wl = {.batch = B, .prompt_len = CTX + steps, .gen_len = GEN - steps};
        ck_assert_msg(qi_placement_ctl_tick(&ctl, en, g_m70, &wl, NULL, &e) == QI_OK, "%s", e.msg);
        const qi_plan *cur = qi_engine_plan(en);
        for (int l = 0; l < NL; l++) hist[steps][l] = cur->layers[l].split;
        ck_assert_msg(decode(en, ids, &e) == QI_OK, "%s", e.msg);
        if (getenv("RATIO_DEBUG")) { /* the last layer's two shares in this step */
            qi_engine_block_times bt;
            qi_engine_block_times_get(en, &bt);
            fprintf(stderr, "step %2d: r %.2f, accelerator %.1f us, CPU %.1f us\n", steps, hist[steps][NL - 1],
                    bt.attn_s[2 * NL - 1] * 1e6, bt.split_s[2 * NL - 1] * 1e6);
        }
    }
    /* settled from the first step after which every layer's ratio stays
     * within one step (0.05) to the end, at least SETTLE plans */
    int settled_at = MAX_STEPS;
    for (int k = MAX_STEPS - 1; k >= 0; k--) {
        bool ok = true;
        for (int l = 0; l < NL && ok; l++) {
            float lo = hist[k][l], hi = lo;
            for (int j = k; j < MAX_STEPS; j++) {
                lo = hist[j][l] < lo ? hist[j][l] : lo;
                hi = hist[j][l] > hi ? hist[j][l] : hi;
            }
            ok = hi - lo <= 0.05f + 1e-4f;
        }
        if (!ok) break;
        settled_at = k;
    }
    if (getenv("RATIO_DEBUG"))
        for (int k = 0; k < MAX_STEPS; k++) {
            fprintf(stderr, "step %2d:", k);
            for (int l = NL - n_split; l < NL; l += 4) fprintf(stderr, " %.2f", hist[k][l]);
            fprintf(stderr, "\n");
        }
    const qi_plan *cur = qi_engine_plan(en);
    double sum_r = 0, min_r = 1, max_r = 0;
    for (int l = 0; l < NL; l++)
        if (cur->layers[l].attn_dev) {
            const double r = cur->layers[l].split;
            sum_r += r, min_r = r < min_r ? r : min_r, max_r = r > max_r ? r : max_r;
        }
    fprintf(stderr, "test_ratio: %d split layers of %d; ratios settled from step %d (%d steps run, %ld plans): "
                    "mean %.3f, min %.2f, max %.2f\n",
            n_split, NL, settled_at, steps, ctl.replans, sum_r / n_split, min_r, max_r);
    ck_assert_msg(settled_at <= MAX_STEPS - SETTLE, "the ratios did not settle within %d steps (settled for the "
                  "last %d)", MAX_STEPS, MAX_STEPS - settled_at);
    ck_assert_int_gt(ctl.replans, 1); /* they moved */
    /* a ratio change moves KV blocks only, never weights: at most every
     * split layer's KV per move */
    qi_engine_profile(en, &pr1);
    const long moves = ctl.replans - plans0;
    double kv_split = 0;
    for (int l = 0; l < NL; l++)
        if (cur->layers[l].attn_dev) kv_split += (double)qi_placement_kv_bytes(g_m70, &w0, l);
    fprintf(stderr, "test_ratio: %ld moves of ratios: %.0f MB and %.2f ms each on average (every split layer's KV: "
                    "%.0f MB)\n",
            moves, (pr1.replan_bytes - pr0.replan_bytes) / moves / 1e6,
            (pr1.replan_seconds - pr0.replan_seconds) / moves * 1e3, kv_split / 1e6);
    ck_assert_msg(pr1.replan_bytes - pr0.replan_bytes <= moves * kv_split * 1.01, "%.0f bytes moved in %ld moves",
                  pr1.replan_bytes - pr0.replan_bytes, moves);

    /* the decode step with the settled ratios and with every ratio at
     * start, at the context the run reached, each on a fresh engine */
    qi_plan first = {0};
    ck_assert_int_eq(qi_plan_copy(&first, cur, &e), QI_OK);
    for (int l = 0; l < NL; l++)
        if (first.layers[l].attn_dev) first.layers[l].split = 0.25f, first.layers[l].split_dev = 0;
    const double t_settled = step_time(cur, CTX + steps), t_start = step_time(&first, CTX + steps);
    fprintf(stderr, "test_ratio: decode step, batch %d at context ~%d: %.3f ms with r = 0.25, %.3f ms with the "
                    "settled ratios (%+.2f%%)\n",
            B, CTX + steps, t_start * 1e3, t_settled * 1e3, 100 * (t_settled / t_start - 1));
    ck_assert_msg(t_settled <= t_start * (1 + 1e-6), "settled %.6f s, start %.6f s", t_settled, t_start);
    qi_plan_free(&first);
    qi_placement_policy_free(pol);
    qi_engine_free(en);
}
END_TEST

static Suite *ratio_suite(void) {
    Suite *s = suite_create("ratio");
    TCase *tc = tcase_create("ratio");
    tcase_add_test(tc, test_base_plan);
    tcase_add_test(tc, test_rule);
    tcase_add_test(tc, test_budget);
    tcase_add_test(tc, test_cpu_only);
    tcase_add_test(tc, test_params);
    suite_add_tcase(s, tc);
    if (g_m70) {
        tc = tcase_create("sim");
        tcase_set_timeout(tc, 600);
        tcase_add_test(tc, test_sim);
        suite_add_tcase(s, tc);
    }
    return s;
}

int main(void) {
    const char *cs = qi_test_case();
    if (strcmp(cs, "sim") == 0 || !*cs) {
        g_m70 = qi_test_shapes_70b(g_l70, sizeof g_l70);
        if (!g_m70 && strcmp(cs, "sim") == 0)
            return qi_test_skip("test_ratio_sim", "qinfer synth could not write the 70B shapes");
    }
    const int rc = qi_test_run_suite(ratio_suite());
    qi_model_free(g_m70);
    if (g_l70[0]) unlink(g_l70);
    return rc;
}

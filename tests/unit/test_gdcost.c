/* test_gdcost.c - the gdcost placement policy (policies/placement/gdcost.c).
 *
 * "gdcost": its solver against brute force on a tiny model (every
 * assignment of every layer's attention device, split and MLP device and
 * the head, under the same memory rounding: the same least predicted
 * time); its gradient steps recovering known coefficients from times its
 * own model generates; the policy's parameters and errors.
 *
 * "converge" (the acceptance test of the online cost model): a simulated
 * A100 server running a LLaMA-2-70B of shapes only on a GPU too small for
 * it, with seeded noise; gdcost starts from coefficients off by a factor
 * of two, plans and observes through qi_placement_ctl_tick while one
 * sequence decodes, then the workload changes (eight sequences of 512
 * tokens): within 50 observed steps its plan's step time (measured on a
 * noise-free simulated engine) is within 5% of the best of an exhaustive
 * search over the plans that put the last NA attention blocks, the last
 * NM MLP blocks and optionally the head on the GPU.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "placement/gdcost.h"
#include "placement/placement_policy.h"
#include "qinfer/engine.h"
#include "qinfer/model.h"
#include "testutil.h"

/* ---- a tiny model ------------------------------------------------------------------------ */

enum { L = 4 };
static qi_layer layers[L];

/* a tiny llama of L layers, its rows `mul` times heavier */
static qi_model tiny_x(uint64_t mul) {
    qi_model m;
    qi_test_tiny_shapes(&m, layers, L, mul);
    return m;
}

static qi_model tiny(void) { return tiny_x(1); }

static qi_hwprofile round_machine(void) {
    qi_hwprofile p;
    memset(&p, 0, sizeof p);
    p.has_gpu = true;
#define SET(f, v) (p.f.value = (v), p.f.set = true)
    SET(gpu_fp16_tensor, 1e14);
    SET(gpu_fp32, 1e13);
    SET(gpu_mem_bw, 1e12);
    SET(gpu_mem_bytes, 1e9);
    SET(gpu_launch, 5e-6);
    SET(link_h2d_bw, 2e10);
    SET(link_d2h_bw, 2e10);
    SET(link_latency, 1e-5);
    SET(cpu_fp32, 1e12);
    SET(cpu_mem_bw, 1e11);
    SET(cpu_mem_bytes, 1e11);
#undef SET
    return p;
}

static const qi_model *g_tiny;
static size_t rows_of(const void *ctx, int b) {
    (void)ctx;
    return qi_plan_block_bytes(g_tiny, b);
}

static void plan_init(qi_plan *p) {
    *p = (qi_plan){0};
    qi_err e = {0};
    ck_assert_int_eq(qi_plan_devices_parse("cpu,gpu", p, &e), QI_OK);
    ck_assert_int_eq(qi_plan_all_host(L, p, &e), QI_OK);
}

/* Brute force: every plan of the solver's space, the best predicted time
 * among those whose accelerator units (rounded up per block, as the
 * solver rounds) fit the grid. */
static double brute(const qi_gd_model *g, const qi_model *m, const qi_placement_workload *wl, double room, int grid,
                    const float *rs, int n_rs, qi_plan *best) {
    const double unit = room / grid;
    const int choices = 2 * (n_rs + 1) * 2; /* attn dev, split, mlp dev */
    long total = 2;
    for (int l = 0; l < L; l++) total *= choices;
    double best_t = INFINITY;
    qi_plan p;
    plan_init(&p);
    for (long code = 0; code < total; code++) {
        long c = code;
        int units = 0;
        bool ok = true;
        for (int l = 0; l < L && ok; l++) {
            const int ch = (int)(c % choices);
            c /= choices;
            const int a = ch & 1, si = (ch >> 1) % (n_rs + 1), f = ch / (2 * (n_rs + 1));
            const float r = si ? rs[si - 1] : 0.0f;
            qi_plan_layer *y = &p.layers[l];
            y->attn_dev = a, y->mlp_dev = f, y->split = r, y->split_dev = r > 0 ? 1 - a : -1;
            const double kv = (double)qi_placement_kv_bytes(m, wl, l);
            const double att = a ? (double)qi_plan_block_bytes(m, 1 + 2 * l) + (1.0 - r) * kv : r * kv;
            units += (int)ceil((att + (f ? (double)qi_plan_block_bytes(m, 2 + 2 * l) : 0)) / unit - 1e-9);
        }
        p.head_dev = (int)c;
        if (p.head_dev) units += (int)ceil((double)qi_plan_block_bytes(m, 2 * L + 1) / unit - 1e-9);
        if (units > grid) continue;
        const double t = qi_gd_predict(g, m, wl, &p);
        if (t < best_t) {
            best_t = t;
            qi_plan_free(best);
            qi_plan_copy(best, &p, NULL);
        }
    }
    qi_plan_free(&p);
    return best_t;
}

/* The solver's plan is the brute force's best (up to ties: the same time). */
START_TEST(test_solve_vs_brute) {
    qi_model m = tiny();
    g_tiny = &m;
    const qi_hwprofile hw = round_machine();
    qi_gd_model g;
    qi_gd_model_init(&g, &hw, 1.0);
    static const float rs[3] = {0.25f, 0.5f, 0.75f};
    const qi_placement_workload wls[3] = {{.batch = 1, .prompt_len = 100, .gen_len = 28},
                                          {.batch = 16, .prompt_len = 1000, .gen_len = 24},
                                          {.batch = 64, .prompt_len = 4000, .gen_len = 96}};
    int differ = 0;
    char first[2048] = "";
    for (int wi = 0; wi < 3; wi++)
        for (double frac = 0.05; frac < 1.2; frac += 0.15) {
            double all = 0;
            for (int b = 1; b < qi_plan_n_blocks(L); b++) all += (double)qi_plan_block_bytes(&m, b);
            for (int l = 0; l < L; l++) all += (double)qi_placement_kv_bytes(&m, &wls[wi], l);
            const double room = frac * all;
            qi_plan best = {0}, got;
            const double tb = brute(&g, &m, &wls[wi], room, 256, rs, 3, &best);
            plan_init(&got);
            qi_gd_solve(&g, &m, &wls[wi], 1, room, rows_of, NULL, rs, 3, 256, &got);
            const double tg = qi_gd_predict(&g, &m, &wls[wi], &got);
            ck_assert_msg(fabs(tg - tb) <= 1e-6 * tb, "workload %d, room %.0f%%: solver %.9g s, brute force %.9g s",
                          wi, 100 * frac, tg, tb);
            /* the optimum is not one plan for every case */
            char ja[2048];
            qi_plan_json(&got, ja, sizeof ja);
            if (!first[0]) snprintf(first, sizeof first, "%s", ja);
            differ += strcmp(ja, first) != 0;
            qi_plan_free(&best);
            qi_plan_free(&got);
        }
    ck_assert_int_gt(differ, 0);
}
END_TEST

static int class_of(int b) {
    return b == 0 ? QI_GD_EMBD : b == 2 * L + 1 ? QI_GD_HEAD : (b - 1) % 2 == 0 ? QI_GD_ATTN : QI_GD_MLP;
}

/* The blocks' predicted seconds under plan p (no copies: the observations
 * below give no copy times, so the links are not learnt). */
static double blocks_pred(const qi_gd_model *g, const qi_model *m, const qi_placement_workload *wl, const qi_plan *p) {
    double t = 0, f[QI_GD_FEATURES];
    for (int b = 0; b < qi_plan_n_blocks(L); b++) {
        qi_gd_features(m, wl, b, 1.0, true, f);
        for (int i = 0; i < QI_GD_FEATURES; i++) t += qi_gd_coef(g, class_of(b), qi_plan_block_dev(p, b) ? 1 : 0, i) * f[i];
    }
    return t;
}

/* Times generated by a model with known coefficients: gradient steps from
 * coefficients off by 2 (and by 1/2) predict them within 2% after a few
 * observations of different workloads. */
START_TEST(test_observe_recovers) {
    qi_model m = tiny();
    const qi_hwprofile hw = round_machine();
    qi_gd_model truth, g;
    qi_gd_model_init(&truth, &hw, 1.0);
    /* the truth is not the profile's: slower memory on the GPU, a larger fixed cost, and
     * attention reaching less of the GPU's bandwidth than the rest */
    truth.base[1][QI_GD_BYTES] *= 1.6;
    truth.base[1][QI_GD_FIXED] *= 3;
    truth.base[0][QI_GD_FLOPS] *= 0.7;
    truth.adj[QI_GD_ATTN][1][QI_GD_BYTES] *= 1.3;
    qi_plan p;
    plan_init(&p);
    for (int l = 0; l < L; l++) {
        p.layers[l].attn_dev = l % 2;
        p.layers[l].mlp_dev = (l / 2) % 2;
    }
    p.head_dev = 1;
    for (int start = 0; start < 2; start++) {
        qi_gd_model_init(&g, &hw, start ? 0.5 : 2.0);
        const qi_placement_workload ws[3] = {{.batch = 1, .prompt_len = 100},
                                             {.batch = 32, .prompt_len = 2000},
                                             {.batch = 8, .prompt_len = 500}};
        for (int it = 0; it < 300; it++) {
            const qi_placement_workload *wl = &ws[it % 3];
            double block_s[2 * L + 2], f[QI_GD_FEATURES];
            for (int b = 0; b < qi_plan_n_blocks(L); b++) {
                qi_gd_features(&m, wl, b, 1.0, true, f);
                const int k = qi_plan_block_dev(&p, b) ? 1 : 0;
                const int c = b == 0 ? QI_GD_EMBD : b == 2 * L + 1 ? QI_GD_HEAD : (b - 1) % 2 == 0 ? QI_GD_ATTN : QI_GD_MLP;
                block_s[b] = 0;
                for (int i = 0; i < QI_GD_FEATURES; i++) block_s[b] += qi_gd_coef(&truth, c, k, i) * f[i];
            }
            const qi_placement_times t = {.plan = &p, .n_blocks = 2 * L + 2, .block_s = block_s, .wl = wl, .steps = 1};
            qi_gd_observe(&g, &m, &t, 0.5);
        }
        for (int wi = 0; wi < 3; wi++) {
            const double want = blocks_pred(&truth, &m, &ws[wi], &p), got = blocks_pred(&g, &m, &ws[wi], &p);
            ck_assert_msg(fabs(got / want - 1) < 0.02, "start x%g, workload %d: predicted %g s, true %g s",
                          start ? 0.5 : 2.0, wi, got, want);
        }
    }
    qi_plan_free(&p);
}
END_TEST

/* Learning changes the decision: a truth in which the MLP on the
 * accelerator is eight times slower than the profile says. The untaught
 * model puts MLP blocks there; observing the plans it runs (times from the
 * truth), the plan it makes converges to the truth's optimum (brute force
 * under the truth). */
START_TEST(test_learning_changes_plan) {
    qi_model m = tiny_x(4000);
    g_tiny = &m;
    const qi_hwprofile hw = round_machine();
    qi_gd_model truth, g;
    qi_gd_model_init(&truth, &hw, 1.0);
    qi_gd_model_init(&g, &hw, 1.0);
    truth.adj[QI_GD_MLP][1][QI_GD_BYTES] *= 8;
    truth.adj[QI_GD_MLP][1][QI_GD_FLOPS] *= 8;
    const qi_placement_workload wl = {.batch = 4, .prompt_len = 300, .gen_len = 100};
    double all = 0;
    for (int b = 1; b < qi_plan_n_blocks(L); b++) all += (double)qi_plan_block_bytes(&m, b);
    for (int l = 0; l < L; l++) all += (double)qi_placement_kv_bytes(&m, &wl, l);
    const double room = 0.5 * all;
    qi_plan want = {0}, p;
    const double t_best = brute(&truth, &m, &wl, room, 256, NULL, 0, &want);
    plan_init(&p);
    qi_gd_solve(&g, &m, &wl, 1, room, rows_of, NULL, NULL, 0, 256, &p);
    const double t0 = qi_gd_predict(&truth, &m, &wl, &p);
    ck_assert_msg(t0 > 1.05 * t_best, "the untaught plan is already good: %g s against %g s", t0, t_best);
    int it = 0;
    double t = t0;
    for (; it < 50 && t > 1.001 * t_best; it++) {
        double block_s[2 * L + 2], f[QI_GD_FEATURES];
        for (int b = 0; b < qi_plan_n_blocks(L); b++) {
            qi_gd_features(&m, &wl, b, 1.0, true, f);
            const int k = qi_plan_block_dev(&p, b) ? 1 : 0;
            const int c = b == 0 ? QI_GD_EMBD : b == 2 * L + 1 ? QI_GD_HEAD : (b - 1) % 2 == 0 ? QI_GD_ATTN : QI_GD_MLP;
            block_s[b] = 0;
            for (int i = 0; i < QI_GD_FEATURES; i++) block_s[b] += qi_gd_coef(&truth, c, k, i) * f[i];
        }
        const qi_placement_times tm = {.plan = &p, .n_blocks = 2 * L + 2, .block_s = block_s, .wl = &wl, .steps = 1};
        qi_gd_observe(&g, &m, &tm, 0.5);
        qi_plan_free(&p);
        plan_init(&p);
        qi_gd_solve(&g, &m, &wl, 1, room, rows_of, NULL, NULL, 0, 256, &p);
        t = qi_gd_predict(&truth, &m, &wl, &p);
    }
    ck_assert_msg(t <= 1.001 * t_best, "after %d observations: %g s, the best %g s (untaught %g s)", it, t, t_best,
                  t0);
    qi_plan_free(&p);
    qi_plan_free(&want);
}
END_TEST

START_TEST(test_params) {
    qi_placement_policy *p = NULL;
    qi_err e = {0};
    qi_params pr;
    qi_params_init(&pr);
    ck_assert_int_eq(qi_params_parse(&pr, "lr=0.2,init_scale=2,grid=256,split=0", &e), QI_OK);
    ck_assert_int_eq(qi_placement_policy_create("gdcost", &pr, &p, &e), QI_OK);
    ck_assert_str_eq(qi_placement_policy_name(p), "gdcost");
    /* no profile and no simulated machine: refused when asked to plan */
    qi_model m = tiny();
    qi_placement_devices devs = {.n_devices = 2};
    snprintf(devs.dev[0].name, sizeof devs.dev[0].name, "cpu");
    snprintf(devs.dev[1].name, sizeof devs.dev[1].name, "testdev");
    devs.dev[1].kind = QI_PLACEMENT_DEV_ACCEL;
    const qi_placement_workload wl = {.batch = 1, .prompt_len = 10, .gen_len = 10};
    qi_plan out;
    ck_assert_int_eq(qi_placement_policy_plan(p, &m, &devs, &wl, &out, &e), QI_ERR_INVALID);
    ck_assert_msg(strstr(e.msg, "profile=PATH"), "%s", e.msg);
    qi_placement_policy_free(p);
    const char *bad[] = {"lr=-1", "grid=3", "speed=2", "init_scale=0", "split=maybe", "profile=/nonexistent.profile"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        qi_params_init(&pr);
        qi_err_clear(&e);
        ck_assert_int_eq(qi_params_parse(&pr, bad[i], &e), QI_OK);
        ck_assert_int_ne(qi_placement_policy_create("gdcost", &pr, &p, &e), QI_OK);
        ck_assert_msg(strstr(e.msg, "gdcost"), "%s: %s", bad[i], e.msg);
    }
}
END_TEST

/* ---- convergence on a simulated A100 server ----------------------------------------------- */

static char g_l70[256];
static qi_model *g_m70;
#define A100 QI_SOURCE_DIR "/engine/backend/sim/profiles/a100-pcie-2xeon.profile"
#define DEVICES "cpu,gpu:24G"
enum { B2 = 8, CTX2 = 512, GEN2 = 1000 };

static qi_engine *sim_engine(const qi_params *sp, qi_err *e) {
    qi_engine_opts o;
    qi_engine_opts_default(&o);
    o.n_threads = 1;
    o.max_seqs = B2;
    o.n_ctx = 2048;
    o.step_tokens = 512;
    o.profile = true;
    o.sim = A100;
    o.sim_params = sp;
    o.devices = DEVICES;
    qi_engine *en = NULL;
    ck_assert_msg(qi_engine_create(g_m70, &o, &en, e) == QI_OK, "%s", e->msg);
    return en;
}

/* n sequences of prompt tokens each, prefilled (a failure: the KV cache
 * does not fit the plan's devices) */
static qi_status add_seqs(qi_engine *en, int n, int prompt, int *ids, qi_err *e) {
    int32_t t[CTX2];
    for (int i = 0; i < prompt; i++) t[i] = 300 + i % 1000;
    for (int s = 0; s < n; s++) {
        ck_assert_int_eq(qi_engine_seq_add(en, &ids[s], e), QI_OK);
        ck_assert_int_eq(qi_engine_seq_feed(en, ids[s], t, prompt, false, e), QI_OK);
    }
    int n_tok = 1;
    qi_status st = QI_OK;
    while (n_tok > 0 && !st) st = qi_engine_step(en, &n_tok, e);
    return st;
}

static qi_status decode(qi_engine *en, const int *ids, int n, qi_err *e) {
    for (int s = 0; s < n; s++) {
        const int32_t tok = 400;
        ck_assert_int_eq(qi_engine_seq_feed(en, ids[s], &tok, 1, false, e), QI_OK);
    }
    return qi_engine_step(en, NULL, e);
}

/* The true (noise-free) decode step time of a plan for B2 sequences at
 * about CTX2: one simulated engine holds the sequences (their prompts
 * again every 32 plans, so the context stays within 32 tokens of CTX2);
 * each plan is moved to (through all-CPU when the direct move lacks
 * room) and timed over one step. NAN when it does not fit. */
typedef struct {
    qi_engine *en;
    int ids[B2];
    int uses;
} evaluator;

static void eval_init(evaluator *ev) {
    qi_err e = {0};
    ev->en = sim_engine(NULL, &e);
    ev->uses = 0;
}

static double eval_plan(evaluator *ev, const qi_plan *p) {
    qi_err e = {0};
    if (ev->uses++ % 32 == 0) {
        if (ev->uses > 1)
            for (int s = 0; s < B2; s++) ck_assert_int_eq(qi_engine_seq_remove(ev->en, ev->ids[s], &e), QI_OK);
        ck_assert_int_eq(qi_engine_replan_spec(ev->en, "all-cpu", NULL, &e), QI_OK);
        ck_assert_msg(add_seqs(ev->en, B2, CTX2, ev->ids, &e) == QI_OK, "%s", e.msg);
    }
    if (qi_engine_replan(ev->en, p, NULL, &e) != QI_OK) {
        qi_err_clear(&e);
        ck_assert_int_eq(qi_engine_replan_spec(ev->en, "all-cpu", NULL, &e), QI_OK);
        if (qi_engine_replan(ev->en, p, NULL, &e) != QI_OK) return NAN;
    }
    const double t0 = qi_engine_now(ev->en);
    qi_engine_block_times_reset(ev->en);
    if (decode(ev->en, ev->ids, B2, &e) != QI_OK) { /* the KV grew past the room: start afresh */
        qi_engine_free(ev->en);
        eval_init(ev);
        return NAN;
    }
    if (getenv("GD_DEBUG")) {
        qi_engine_block_times bt;
        qi_engine_block_times_get(ev->en, &bt);
        double sb = 0, sc = 0;
        for (int k = 0; k < bt.n_blocks; k++) sb += bt.block_s[k];
        for (int d = 0; d < 4; d++) sc += bt.copy_s[d];
        fprintf(stderr, "eval: step %.3f ms, spans %.3f ms, copies %.3f ms\n", (qi_engine_now(ev->en) - t0) * 1e3, sb * 1e3, sc * 1e3);
    }
    return qi_engine_now(ev->en) - t0;
}

START_TEST(test_converge) {
    qi_err e = {0};
    const int NL = g_m70->hp.n_layer;
    /* the exhaustive search: the last na attention blocks, the last nm MLP
     * blocks and maybe the head on the GPU */
    double best = INFINITY;
    int n_fit = 0;
    qi_plan p = {0};
    ck_assert_int_eq(qi_plan_devices_parse(DEVICES, &p, &e), QI_OK);
    ck_assert_int_eq(qi_plan_all_host(NL, &p, &e), QI_OK);
    char bestp[64] = "";
    evaluator ev;
    eval_init(&ev);
    /* the plans that hold the workload's KV to its end, as a policy must plan */
    qi_placement_devices devs;
    qi_placement_devices_of_engine(ev.en, &devs);
    const qi_placement_workload w2 = {.batch = B2, .prompt_len = CTX2, .gen_len = GEN2};
    /* quick mode (the sanitizer build): a coarser search, the same checks */
    const int grain = qi_test_quick() ? 16 : 4;
    for (int na = 0; na <= NL; na += grain)
        for (int nm = 0; nm <= NL; nm += grain)
            for (int h = 0; h < 2; h++) {
                for (int l = 0; l < NL; l++) {
                    p.layers[l].attn_dev = l >= NL - na;
                    p.layers[l].mlp_dev = l >= NL - nm;
                }
                p.head_dev = h;
                if (qi_placement_check(g_m70, &devs, &w2, &p, 0, NULL) != QI_OK) continue;
                const double t = eval_plan(&ev, &p);
                if (isnan(t)) continue;
                n_fit++;
                if (t < best) {
                    best = t;
                    snprintf(bestp, sizeof bestp, "attention %d, MLP %d, head %d", na, nm, h);
                }
            }
    qi_plan_free(&p);
    ck_assert_int_gt(n_fit, 10);
    fprintf(stderr, "test_gdcost: exhaustive best of %d plans: %.3f ms per step (%s)\n", n_fit, best * 1e3, bestp);

    /* gdcost from coefficients off by two, on a noisy machine */
    qi_params sp;
    qi_params_init(&sp);
    ck_assert_int_eq(qi_params_parse(&sp, "noise=0.03,seed=11", &e), QI_OK);
    qi_engine *en = sim_engine(&sp, &e);
    qi_params pp;
    qi_params_init(&pp);
    /* off by two: the GPU twice as slow as the profile says, the CPU twice as fast */
    ck_assert_int_eq(qi_params_parse(&pp, "init_gpu=2,init_cpu=0.5", &e), QI_OK);
    /* untaught, its plan for the new workload is not a good one */
    {
        qi_placement_policy *fresh = NULL;
        ck_assert_int_eq(qi_placement_policy_create("gdcost", &pp, &fresh, &e), QI_OK);
        qi_plan fp = {0};
        ck_assert_msg(qi_placement_policy_plan(fresh, g_m70, &devs, &w2, &fp, &e) == QI_OK, "%s", e.msg);
        const double t = eval_plan(&ev, &fp);
        char sm[256];
        qi_plan_summary(&fp, sm, sizeof sm);
        fprintf(stderr, "test_gdcost: untaught, its plan for the workload takes %.3f ms per step, %.1f%% over the "
                        "best (%s)\n", t * 1e3, 100 * (t / best - 1), sm);
        qi_plan_free(&fp);
        qi_placement_policy_free(fresh);
    }
    qi_placement_policy *pol = NULL;
    ck_assert_int_eq(qi_placement_policy_create("gdcost", &pp, &pol, &e), QI_OK);
    qi_placement_ctl ctl;
    qi_placement_ctl_init(&ctl, pol, 2.0);
    int ids[B2];
    /* one sequence of 32 tokens decoding */
    ck_assert_msg(add_seqs(en, 1, 32, ids, &e) == QI_OK, "%s", e.msg);
    for (int s = 0; s < 20; s++) {
        const qi_placement_workload wl = {.batch = 1, .prompt_len = 33 + s, .gen_len = 200 - s};
        ck_assert_msg(qi_placement_ctl_tick(&ctl, en, g_m70, &wl, NULL, &e) == QI_OK, "%s", e.msg);
        ck_assert_msg(decode(en, ids, 1, &e) == QI_OK, "%s", e.msg);
    }
    /* the workload changes: eight sequences at 512; the plan for it comes
     * before their prompts, as a scheduler admitting them would ask */
    ck_assert_int_eq(qi_engine_seq_remove(en, ids[0], &e), QI_OK);
    {
        const qi_placement_workload wl = {.batch = B2, .prompt_len = CTX2, .gen_len = GEN2};
        ck_assert_msg(qi_placement_ctl_tick(&ctl, en, g_m70, &wl, NULL, &e) == QI_OK, "%s", e.msg);
    }
    ck_assert_msg(add_seqs(en, B2, CTX2, ids, &e) == QI_OK, "%s", e.msg);
    qi_engine_block_times_reset(en); /* the prompts are not decode steps */
    int steps = 0;
    double got = INFINITY, first_err = NAN;
    const qi_plan *cur = NULL;
    for (; steps <= 50; steps++) {
        const qi_placement_workload wl = {.batch = B2, .prompt_len = CTX2 + steps, .gen_len = GEN2 - steps};
        ck_assert_msg(qi_placement_ctl_tick(&ctl, en, g_m70, &wl, NULL, &e) == QI_OK, "%s", e.msg);
        cur = qi_engine_plan(en);
        if (steps == 1) first_err = ctl.predicted_s / ctl.measured_s - 1;
        got = eval_plan(&ev, cur);
        if (getenv("GD_DEBUG")) {
            char sm[256];
            qi_plan_summary(cur, sm, sizeof sm);
            fprintf(stderr, "step %d: %.3f ms (%+.1f%%) %s pred %.3f meas %.3f\n", steps, got * 1e3, 100 * (got / best - 1), sm,
                    ctl.predicted_s * 1e3, ctl.measured_s * 1e3);
        } else if (got <= 1.05 * best && steps >= 1 && fabs(ctl.predicted_s / ctl.measured_s - 1) < 0.05) {
            break;
        }
        ck_assert_msg(decode(en, ids, B2, &e) == QI_OK, "%s", e.msg);
    }
    if (getenv("GD_DEBUG")) {
        const qi_placement_workload wl = {.batch = B2, .prompt_len = CTX2 + steps, .gen_len = GEN2 - steps};
        qi_plan bp = {0};
        qi_plan_copy(&bp, cur, NULL);
        for (int l = 0; l < NL; l++) bp.layers[l].attn_dev = l >= NL - 60, bp.layers[l].mlp_dev = l >= NL - 48;
        bp.head_dev = 1;
        fprintf(stderr, "model: current plan %.3f ms, the best %.3f ms; fits %d; free %zu\n",
                qi_placement_policy_predict(pol, g_m70, &devs, &wl, cur) * 1e3,
                qi_placement_policy_predict(pol, g_m70, &devs, &wl, &bp) * 1e3,
                qi_placement_check(g_m70, &devs, &wl, &bp, 0, NULL) == QI_OK, devs.dev[1].free);
        qi_plan_free(&bp);
    }
    char sum[256];
    qi_plan_summary(cur, sum, sizeof sum);
    fprintf(stderr, "test_gdcost: gdcost after %d observed steps: %.3f ms per step, %.1f%% over the best (%s); "
                    "%ld plans, predicted %.3f ms, measured %.3f ms at the last observation\n",
            steps, got * 1e3, 100 * (got / best - 1), sum, ctl.replans, ctl.predicted_s * 1e3, ctl.measured_s * 1e3);
    ck_assert_msg(got <= 1.05 * best, "after %d steps: %.3f ms, the best %.3f ms", steps, got * 1e3, best * 1e3);
    ck_assert_int_le(steps, 50);
    /* and its model has learnt the new workload: within 5% now */
    fprintf(stderr, "test_gdcost: prediction error %+.1f%% at the first observation after the change, %+.1f%% at "
                    "the last\n", 100 * first_err, 100 * (ctl.predicted_s / ctl.measured_s - 1));
    ck_assert_msg(fabs(ctl.predicted_s / ctl.measured_s - 1) < 0.05, "prediction %g s, measured %g s",
                  ctl.predicted_s, ctl.measured_s);
    qi_placement_policy_free(pol);
    qi_engine_free(en);
    qi_engine_free(ev.en);
}
END_TEST

static Suite *gd_suite(void) {
    Suite *s = suite_create("gdcost");
    TCase *tc = tcase_create("gdcost");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_solve_vs_brute);
    tcase_add_test(tc, test_observe_recovers);
    tcase_add_test(tc, test_learning_changes_plan);
    tcase_add_test(tc, test_params);
    suite_add_tcase(s, tc);
    if (g_m70) {
        tc = tcase_create("converge");
        tcase_set_timeout(tc, 600);
        tcase_add_test(tc, test_converge);
        suite_add_tcase(s, tc);
    }
    return s;
}

int main(void) {
    const char *cs = qi_test_case();
    if (strcmp(cs, "converge") == 0 || !*cs) {
        g_m70 = qi_test_shapes_70b(g_l70, sizeof g_l70);
        if (!g_m70 && strcmp(cs, "converge") == 0)
            return qi_test_skip("test_gdcost_converge", "qinfer synth could not write the 70B shapes");
    }
    const int rc = qi_test_run_suite(gd_suite());
    qi_model_free(g_m70);
    if (g_l70[0]) unlink(g_l70);
    return rc;
}

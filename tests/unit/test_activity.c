/* test_activity.c - the simulated machine's FFN activity model
 * (engine/activity.c) and what the engine charges by it
 * (engine/engine_activity.c).
 *
 *   - the union over a batch, sum of 1 - (1 - p_i)^B, against a
 *     Monte-Carlo count of the distinct neurons B independent tokens fire,
 *     for a two-level model and a profile's per-neuron levels;
 *   - the two levels from "H of the neurons give Y of the activations at A
 *     active", the presets, the refusals;
 *   - the rows a decode step of a simulated SmolLM2 shape charges each side
 *     of a neuron split: no split (every neuron on the CPU at the union of
 *     the whole layer), all of them hot (every one on the GPU), half (the
 *     hottest half's union on the GPU, the rest's on the CPU), and a step
 *     with the model that reads less than the dense one, and its predictor
 *     costing time.
 * Seconds.
 */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "qinfer/activity.h"
#include "qinfer/engine.h"
#include "qinfer/model.h"
#include "qinfer/quant.h"
#include "qinfer/types.h"
#include "testutil.h"

#define A100 QI_SOURCE_DIR "/engine/backend/sim/profiles/a100-pcie-2xeon.profile"

/* xorshift: a reproducible uniform in [0, 1) */
static double uni(uint64_t *s) {
    *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
    return (double)(*s >> 11) / 9007199254740992.0;
}

/* Distinct neurons of ranks [lo, hi) of n that fire on any of B tokens,
 * each firing with its level's probability, as a share of n; the mean of
 * `trials` draws. */
static double monte_carlo(const qi_activity *a, int n, double lo, double hi, int B, int trials, uint64_t *seed) {
    double sum = 0;
    for (int t = 0; t < trials; t++) {
        long hit = 0;
        for (int j = 0; j < n; j++) {
            const double r = (j + 0.5) / n;
            if (r < lo || r >= hi) continue;
            double p = 0;
            for (int k = 0; k < a->n_lv; k++)
                if (r >= a->edge[k] && r < a->edge[k + 1]) p = a->p[k];
            for (int b = 0; b < B; b++)
                if (uni(seed) < p) {
                    hit++;
                    break;
                }
        }
        sum += (double)hit / n;
    }
    return sum / trials;
}

START_TEST(union_vs_monte_carlo) {
    qi_activity a;
    qi_err e = {0};
    ck_assert_msg(qi_activity_parse("active=0.18,hot=0.43:0.8", &a, &e) == QI_OK, "%s", e.msg);
    ck_assert_int_eq(a.n_lv, 2);
    ck_assert_double_eq_tol(a.p[0], 0.8 * 0.18 / 0.43, 1e-12);
    ck_assert_double_eq_tol(a.p[1], 0.2 * 0.18 / 0.57, 1e-12);
    /* one token: the mean active share, and the hot set's share of it */
    ck_assert_double_eq_tol(qi_activity_union(&a, 7, 0, 1, 1), 0.18, 1e-12);
    ck_assert_double_eq_tol(qi_activity_union(&a, 0, 0, 0.43, 1) / 0.18, 0.8, 1e-12);
    ck_assert_double_eq(qi_activity_union(&a, 0, 0.3, 0.3, 64), 0.0);
    uint64_t seed = 0x9e3779b97f4a7c15ull;
    const int n = 8192;
    const int Bs[] = {1, 4, 16, 64};
    const double ranges[][2] = {{0, 1}, {0, 0.25}, {0.25, 1}, {0.4, 0.6}};
    for (size_t i = 0; i < sizeof Bs / sizeof Bs[0]; i++)
        for (size_t r = 0; r < sizeof ranges / sizeof ranges[0]; r++) {
            const double lo = ranges[r][0], hi = ranges[r][1];
            const double u = qi_activity_union(&a, 0, lo, hi, Bs[i]);
            const double mc = monte_carlo(&a, n, lo, hi, Bs[i], 8, &seed);
            /* the count's standard error is under 0.003 of the layer */
            ck_assert_msg(fabs(u - mc) < 0.006, "B %d [%g, %g): union %g, Monte Carlo %g", Bs[i], lo, hi, u, mc);
        }
    /* a batch can only touch more: the union grows with B up to the range */
    ck_assert(qi_activity_union(&a, 0, 0, 1, 64) > qi_activity_union(&a, 0, 0, 1, 16));
    ck_assert(qi_activity_union(&a, 0, 0, 1, 4096) <= 1.0);
    qi_activity_fini(&a);

    /* a profile's levels: each neuron its own, ranked hottest first */
    const int L = 2, F = 512;
    int64_t *act = malloc(sizeof *act * L * F);
    long toks[2] = {100, 50};
    for (int l = 0; l < L; l++)
        for (int j = 0; j < F; j++) act[l * F + j] = (int64_t)((j * 37) % (toks[l] + 1));
    ck_assert_msg(qi_activity_from_counts(L, F, act, toks, &a, &e) == QI_OK, "%s", e.msg);
    for (int l = 0; l < L; l++) {
        double mean = 0;
        for (int j = 0; j < F; j++) mean += (double)act[l * F + j] / toks[l] / F;
        ck_assert_double_eq_tol(qi_activity_union(&a, l, 0, 1, 1), mean, 1e-12);
        for (int j = 1; j < F; j++) ck_assert(a.p[l * F + j] <= a.p[l * F + j - 1]);
        qi_activity one = {.n_layer = 1, .n_lv = F, .edge = a.edge + (size_t)l * (F + 1), .p = a.p + (size_t)l * F};
        const double u = qi_activity_union(&a, l, 0.1, 0.7, 8), mc = monte_carlo(&one, F, 0.1, 0.7, 8, 64, &seed);
        ck_assert_msg(fabs(u - mc) < 0.01, "profile layer %d: union %g, Monte Carlo %g", l, u, mc);
    }
    qi_activity_fini(&a);
    free(act);
}
END_TEST

START_TEST(parse) {
    qi_activity a;
    qi_err e = {0};
    for (const qi_activity_preset *q = qi_activity_presets; q->name; q++) {
        ck_assert_msg(qi_activity_parse(q->name, &a, &e) == QI_OK, "%s: %s", q->name, e.msg);
        ck_assert(a.pred > 0 && a.pred < 0.1);
        ck_assert_str_eq(a.name, q->name);
        ck_assert(strstr(q->source, "PowerInfer"));
        qi_activity_fini(&a);
    }
    ck_assert_int_eq(qi_activity_parse("opt,pred=0", &a, &e), QI_OK);
    ck_assert_double_eq(a.pred, 0.0);
    ck_assert_double_eq_tol(qi_activity_union(&a, 0, 0, 1, 1), 0.03, 1e-12);
    qi_activity_fini(&a);
    const char *bad[][2] = {
        {"gpt", "no preset 'gpt' (known: opt, falcon-relu, llama-reglu"},
        {"active=0.5,hot=0.1:0.9", "cannot give 90% of the activations"},
        {"active=0.2", "needs active=A and hot=H:Y"},
        {"active=0.2,hot=0.3", "is not H:Y"},
        {"active=1.5,hot=0.3:0.5", "outside (0, 1]"},
        {"active=0.2,hot=0.3:0.5,pred=1", "pred=1 is outside"},
        {"active=0.2,hot=0.3:0.5,warm=1", "unknown key 'warm'"},
        {"active=x,hot=0.3:0.5", "active=x is not a number"},
        {"", "an empty spec"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        memset(&e, 0, sizeof e);
        ck_assert_int_eq(qi_activity_parse(bad[i][0], &a, &e), QI_ERR_INVALID);
        ck_assert_msg(strstr(e.msg, bad[i][1]), "'%s': %s", bad[i][0], e.msg);
        ck_assert_ptr_null(a.p);
    }
}
END_TEST

/* The rows one decode step of B sequences charges (out[0] CPU, out[1]
 * GPU) and its simulated seconds, with the share `hot` of every layer's
 * units on the GPU (0: no split, every MLP on the CPU). */
static double step_rows(const qi_model *m, const char *act, double hot, int B, double out[2]) {
    const int L = m->hp.n_layer, nu = m->hp.n_ff / qi_engine_neuron_unit(m);
    uint8_t *mask = calloc((size_t)L * nu, 1);
    for (int l = 0; l < L; l++)
        for (int i = 0; i < (int)(hot * nu + 0.5); i++) mask[l * nu + i] = 1;
    qi_engine_opts o;
    qi_engine_opts_default(&o);
    o.n_threads = 1;
    o.n_ctx = 64;
    o.max_seqs = B;
    o.sim = A100;
    o.devices = "cpu,gpu";
    o.placement = "ngl=0";
    o.neuron_fast = hot > 0 ? mask : NULL;
    o.neuron_dev = 1;
    o.sim_activity = act;
    qi_engine *eng = NULL;
    qi_err e = {0};
    ck_assert_msg(qi_engine_create(m, &o, &eng, &e) == QI_OK, "%s", e.msg);
    const int32_t p[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    int id[64], nt;
    for (int b = 0; b < B; b++) {
        ck_assert_int_eq(qi_engine_seq_add(eng, &id[b], &e), QI_OK);
        ck_assert_int_eq(qi_engine_seq_feed(eng, id[b], p, 8, false, &e), QI_OK);
    }
    ck_assert_msg(qi_engine_step(eng, &nt, &e) == QI_OK, "%s", e.msg); /* the prompts: 8 x B tokens, one step */
    const int32_t t = 9;
    for (int b = 0; b < B; b++) ck_assert_int_eq(qi_engine_seq_feed(eng, id[b], &t, 1, false, &e), QI_OK);
    double r0[2], r1[2];
    qi_engine_activity_rows(eng, r0);
    const double t0 = qi_engine_now(eng);
    ck_assert_int_eq(qi_engine_step(eng, &nt, &e), QI_OK);
    const double dt = qi_engine_now(eng) - t0;
    qi_engine_activity_rows(eng, r1);
    out[0] = r1[0] - r0[0];
    out[1] = r1[1] - r0[1];
    qi_engine_free(eng);
    free(mask);
    return dt;
}

/* union x n_ff rounded up to whole blocks of down's type, times the layers */
static double charged(const qi_model *m, const qi_activity *a, double lo, double hi, int B) {
    const double blk = (double)qi_type_get(m->layers[0].w_down.type)->blck;
    return m->hp.n_layer * ceil(qi_activity_union(a, 0, lo, hi, B) * m->hp.n_ff / blk - 1e-9) * blk;
}

START_TEST(split_rows) {
    qi_model *m = qi_test_synth("--preset smollm2-135m --n-layer 4 --n-vocab 4096 --shapes-only");
    ck_assert_ptr_nonnull(m);
    const char *spec = "active=0.2,hot=0.25:0.6,pred=0.05";
    qi_activity a;
    qi_err e = {0};
    ck_assert_int_eq(qi_activity_parse(spec, &a, &e), QI_OK);
    const int unit = qi_engine_neuron_unit(m), nu = m->hp.n_ff / unit;
    for (int B = 1; B <= 16; B *= 4) {
        double r[2];
        /* 0% hot: no split, every MLP on the CPU at the whole layer's union */
        step_rows(m, spec, 0, B, r);
        ck_assert_double_eq_tol(r[0], charged(m, &a, 0, 1, B), 1e-9);
        ck_assert_double_eq(r[1], 0);
        /* 100% hot: every neuron on the GPU */
        step_rows(m, spec, 1, B, r);
        ck_assert_double_eq(r[0], 0);
        ck_assert_double_eq_tol(r[1], charged(m, &a, 0, 1, B), 1e-9);
        /* half: the hottest half's union on the GPU, the rest's on the CPU */
        const double s = (double)(int)(0.5 * nu + 0.5) / nu;
        step_rows(m, spec, 0.5, B, r);
        ck_assert_double_eq_tol(r[1], charged(m, &a, 0, s, B), 1e-9);
        ck_assert_double_eq_tol(r[0], charged(m, &a, s, 1, B), 1e-9);
        printf("split_rows: B %d, half hot: GPU %.0f, CPU %.0f neurons over %d layers of %d\n", B, r[1], r[0],
               m->hp.n_layer, m->hp.n_ff);
    }
    /* the model reads less than the dense FFN; its predictor costs time */
    double r[2];
    const char *nopred = "active=0.2,hot=0.25:0.6";
    const double dense = step_rows(m, NULL, 0, 4, r), sparse = step_rows(m, nopred, 0, 4, r);
    const double pred = step_rows(m, spec, 0, 4, r);
    printf("split_rows: a batch-4 step dense %.3g s, at 20%% active %.3g s, with its predictor %.3g s\n", dense, sparse,
           pred);
    ck_assert_msg(sparse < dense, "a step at 20%% active took %g s, the dense one %g s", sparse, dense);
    ck_assert(pred > sparse);
    /* refusals: with the what-if density, a bad spec (a real machine is
     * refused too, before the model of shapes only is) */
    qi_engine_opts o;
    qi_engine_opts_default(&o);
    o.sim_activity = spec;
    qi_engine *eng = NULL;
    o.sim = A100;
    o.sim_cold_density = 0.5;
    memset(&e, 0, sizeof e);
    ck_assert_int_eq(qi_engine_create(m, &o, &eng, &e), QI_ERR_INVALID);
    ck_assert_msg(strstr(e.msg, "one of them"), "%s", e.msg);
    o.sim_cold_density = 0;
    o.sim_activity = "active=2,hot=0.5:0.5";
    memset(&e, 0, sizeof e);
    ck_assert_int_eq(qi_engine_create(m, &o, &eng, &e), QI_ERR_INVALID);
    ck_assert_msg(strstr(e.msg, "outside (0, 1]"), "%s", e.msg);
    qi_activity_fini(&a);
    qi_model_free(m);
}
END_TEST

int main(void) {
    Suite *s = suite_create("activity");
    TCase *tc = tcase_create("activity");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, union_vs_monte_carlo);
    tcase_add_test(tc, parse);
    tcase_add_test(tc, split_rows);
    suite_add_tcase(s, tc);
    return qi_test_run_suite(s);
}

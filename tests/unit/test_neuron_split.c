/* test_neuron_split.c - the FFN neuron split (engine/ffn_split.h, the
 * engine's opts.neuron_fast).
 *
 *   - gather: each side's gate and up rows and down blocks are the layer's
 *     own bytes, in unit order, for random masks (none, all, one unit,
 *     random) on q4_1 (SmolLM2's shape) and q8_0 (Gemma 3's);
 *   - exact: on the CPU with testdev as the fast device (testdev does the
 *     CPU's arithmetic), every unit fast gives the unsplit logits bit for
 *     bit, counting the active neurons too (each layer's recall then 1),
 *     and a mask of none is no split;
 *   - partial: a random mask on every layer gives logits within a bound of
 *     the unsplit ones (the two partial down products are summed apart, so
 *     only the rounding differs), never equal to them, the same greedy
 *     tokens, and a batch of 4 equal to its sequences run alone bit for
 *     bit; the plan shows each split layer's neurons;
 *   - cold cats: cats thresholds the cold side only (the hot one runs
 *     dense): no unit hot is cats without a split bit for bit, every unit
 *     hot the dense run bit for bit; a partial split's sparse reading of
 *     the cold side within rounding of its dense reading of the same
 *     zeroed activations, a batch equal to its sequences alone;
 *   - swaps: the qinfer policy's swaps between steps, started from an
 *     activity that inverts the heat, on a dense cold side and a cats one:
 *     after every step each unit is on one side with its own bytes, the
 *     cats side's column form its down's (qi_engine_neuron_check), the
 *     dense run's logits within the split's rounding of the unsplit ones;
 *     a copy that fails stops its step and every later one;
 *   - refusals: a fast device out of range, a split layer's MLP off the
 *     CPU, teal and repack beside a split, a fast device too small for
 *     the hot neurons (naming them and the device), a new plan;
 *   - sim: on a LLaMA-2-70B of shapes only on the simulated A100 server
 *     (with the what-if density of the CPU's neurons too),
 *     a decode step's simulated time falls as the fast device takes more
 *     of the FFN (none, half, all), and the GPU's memory grows by the hot
 *     neurons' bytes; the calibration timer grows with the neurons on both
 *     devices and gives a CPU:GPU ratio above 1.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "ffn_split.h"
#include "neuron/neuron_live.h"
#include "neuron/neuron_policy.h"
#include "qinfer/engine.h"
#include "qinfer/model.h"
#include "qinfer/plan.h"
#include "qinfer/sparsity.h"
#include "qinfer/types.h"
#include "testutil.h"

#define A100 QI_SOURCE_DIR "/engine/backend/sim/profiles/a100-pcie-2xeon.profile"
#define S 4 /* sequences */
#define G 4 /* decode steps */

/* down's product over the two sides, summed, against the whole one on the
 * CPU backend: the same blocks' dots, summed in another order, so within
 * float rounding of the sum of |terms| (a block dropped or misplaced is
 * off by a whole block's contribution). */
static void check_sum(const qi_layer *ly, const qi_ffn_split *sp, const uint8_t *mask, int unit, int nu) {
    const int64_t F = ly->w_down.n_cols, E = ly->w_down.n_rows;
    qi_backend *cpu = NULL;
    qi_err e = {0};
    ck_assert_int_eq(qi_backend_cpu_create(1, 0, &cpu, &e), QI_OK);
    ck_assert_int_eq(cpu->iface->reserve(cpu, 4 * (size_t)F, 2, 1, 1, 64, &e), QI_OK);
    float *a = malloc(sizeof(float) * F), *as[2], *y = malloc(sizeof(float) * E), *ys[2];
    uint64_t seed = 9;
    for (int64_t j = 0; j < F; j++) a[j] = (float)((double)(qi_test_rand(&seed) % 2001) / 1000.0 - 1.0);
    for (int s = 0; s < 2; s++) {
        as[s] = malloc(sizeof(float) * (F + 1));
        ys[s] = calloc((size_t)E, sizeof(float));
        int n = 0;
        for (int i = 0; i < nu; i++)
            if (mask[i] == s) memcpy(as[s] + (size_t)n * unit, a + (size_t)i * unit, sizeof(float) * unit), n++;
    }
    const qi_weight *w = &ly->w_down;
    float *yp = y;
    ck_assert_int_eq(qi_backend_matmul_n(cpu, &w, &yp, 1, a, 1, &e), QI_OK);
    double maxd = 0.0, maxy = 0.0;
    for (int s = 0; s < 2; s++) {
        if (!sp->n[s]) continue;
        const qi_weight *ws = &sp->down[s];
        ck_assert_int_eq(qi_backend_matmul_n(cpu, &ws, &ys[s], 1, as[s], 1, &e), QI_OK);
    }
    for (int64_t r = 0; r < E; r++) {
        maxd = fmax(maxd, fabs((double)ys[0][r] + ys[1][r] - y[r]));
        maxy = fmax(maxy, fabs((double)y[r]));
    }
    ck_assert_msg(maxd <= 1e-5 * maxy, "split down product off by %g (largest %g)", maxd, maxy);
    for (int s = 0; s < 2; s++) free(as[s]), free(ys[s]);
    free(a);
    free(y);
    qi_backend_free(cpu);
}

static void check_gather(const qi_model *m, uint64_t seed) {
    const qi_layer *ly = &m->layers[0];
    const int unit = qi_ffn_split_unit(ly), nu = m->hp.n_ff / unit;
    ck_assert_int_gt(unit, 1);
    ck_assert_int_eq(qi_engine_neuron_unit(m), unit);
    uint8_t *mask = malloc((size_t)nu);
    const size_t blk = qi_type_get(ly->w_down.type)->size;
    for (int k = 0; k < 4; k++) {
        for (int i = 0; i < nu; i++)
            mask[i] = k == 0 ? 0 : k == 1 ? 1 : k == 2 ? i == nu / 2 : (uint8_t)(qi_test_rand(&seed) % 2);
        qi_ffn_split sp;
        qi_err e = {0};
        ck_assert_msg(qi_ffn_split_build(ly, mask, true, &sp, &e) == QI_OK, "%s", e.msg);
        ck_assert_int_eq(sp.n[0] + sp.n[1], m->hp.n_ff);
        int at[2] = {0, 0}; /* units placed so far on each side */
        for (int i = 0; i < nu; i++) {
            const int s = mask[i];
            const size_t gb = (size_t)unit * ly->w_gate.row_bytes;
            ck_assert(memcmp((const char *)sp.gate[s].data + (size_t)at[s] * gb, (const char *)ly->w_gate.data + i * gb,
                             gb) == 0);
            ck_assert(memcmp((const char *)sp.up[s].data + (size_t)at[s] * gb, (const char *)ly->w_up.data + i * gb,
                             gb) == 0);
            for (int64_t r = 0; r < ly->w_down.n_rows; r += 37)
                ck_assert(memcmp((const char *)sp.down[s].data + r * sp.down[s].row_bytes + (size_t)at[s] * blk,
                                 (const char *)ly->w_down.data + r * ly->w_down.row_bytes + (size_t)i * blk, blk) == 0);
            at[s]++;
        }
        ck_assert_int_eq(at[1] * unit, sp.n[1]);
        if (k >= 2) check_sum(ly, &sp, mask, unit, nu);
        if (k == 1) /* all on one side: the layer's own matrices */
            ck_assert(memcmp(sp.down[1].data, ly->w_down.data, ly->w_down.row_bytes * ly->w_down.n_rows) == 0);
        qi_ffn_split_free(&sp);
        qi_ffn_split_free(&sp); /* twice is harmless */
    }
    free(mask);
}

START_TEST(gather) {
    qi_model *m = qi_test_synth(QI_TEST_SYNTH_SMOL);
    ck_assert_ptr_nonnull(m);
    ck_assert_int_eq(m->layers[0].w_down.type, QI_TYPE_Q4_1);
    check_gather(m, 1);
    qi_model_free(m);
    m = qi_test_synth(QI_TEST_SYNTH_GEMMA);
    ck_assert_ptr_nonnull(m);
    check_gather(m, 2);
    qi_model_free(m);
}
END_TEST

static qi_model *g_smol;

static void opts(qi_engine_opts *o, const char *devices, const uint8_t *mask, int max_seqs) {
    qi_engine_opts_default(o);
    o->n_threads = 2;
    o->n_ctx = 128;
    o->max_seqs = max_seqs;
    o->devices = devices;
    o->neuron_fast = mask;
    o->neuron_dev = 1;
}

/* Sequences first..first+n-1 of the workload (prompts of 5 + 7 s tokens,
 * then G steps fed with the tokens in tok, or, where tok is -1, the
 * argmax, written back), run together: out[s][G + 1][V]. */
static void run(const qi_engine_opts *o, int first, int n, int32_t tok[S][G], float *out) {
    const int V = g_smol->hp.n_vocab;
    qi_engine *eng = NULL;
    qi_err e = {0};
    ck_assert_msg(qi_engine_create(g_smol, o, &eng, &e) == QI_OK, "%s", e.msg);
    int ids[S];
    for (int k = 0; k < n; k++) {
        const int s = first + k;
        int32_t p[40];
        uint64_t seed = 77 + (uint64_t)s;
        for (int i = 0; i < 5 + 7 * s; i++) p[i] = (int32_t)(qi_test_rand(&seed) % 4000);
        ck_assert_int_eq(qi_engine_seq_add(eng, &ids[k], &e), QI_OK);
        ck_assert_int_eq(qi_engine_seq_feed(eng, ids[k], p, 5 + 7 * s, false, &e), QI_OK);
    }
    for (int g = 0; g <= G; g++) {
        int nt = 0;
        ck_assert_msg(qi_engine_step(eng, &nt, &e) == QI_OK, "%s", e.msg);
        for (int k = 0; k < n; k++) {
            const int s = first + k;
            const float *lg = qi_engine_seq_logits(eng, ids[k], -1);
            memcpy(out + ((size_t)s * (G + 1) + g) * V, lg, sizeof(float) * V);
            if (g == G) continue;
            if (tok[s][g] < 0) {
                int b = 0;
                for (int v = 1; v < V; v++) b = lg[v] > lg[b] ? v : b;
                tok[s][g] = b;
            }
            ck_assert_int_eq(qi_engine_seq_feed(eng, ids[k], &tok[s][g], 1, false, &e), QI_OK);
        }
    }
    qi_engine_free(eng);
}

static size_t n_logits(void) { return (size_t)S * (G + 1) * (size_t)g_smol->hp.n_vocab; }

START_TEST(exact) {
    const int L = g_smol->hp.n_layer, nu = g_smol->hp.n_ff / qi_engine_neuron_unit(g_smol);
    int32_t tok[S][G];
    memset(tok, 0xff, sizeof tok);
    float *want = malloc(sizeof(float) * n_logits()), *got = malloc(sizeof(float) * n_logits());
    qi_engine_opts o;
    opts(&o, NULL, NULL, S);
    run(&o, 0, S, tok, want);
    uint8_t *mask = calloc((size_t)L * nu, 1);
    opts(&o, "cpu,testdev", mask, S); /* none marked: no split */
    run(&o, 0, S, tok, got);
    ck_assert(memcmp(want, got, sizeof(float) * n_logits()) == 0);
    memset(mask, 1, (size_t)L * nu); /* all: the unsplit arithmetic on testdev */
    run(&o, 0, S, tok, got);
    ck_assert(memcmp(want, got, sizeof(float) * n_logits()) == 0);
    /* counting the active neurons changes nothing, and every active one
     * is hot: recall 1 on every layer */
    o.neuron_active = 0.1f;
    run(&o, 0, S, tok, got);
    ck_assert(memcmp(want, got, sizeof(float) * n_logits()) == 0);
    qi_engine *eng = NULL;
    qi_err e = {0};
    ck_assert_int_eq(qi_engine_create(g_smol, &o, &eng, &e), QI_OK);
    int id, nt;
    const int32_t p[6] = {5, 6, 7, 8, 9, 10};
    ck_assert_int_eq(qi_engine_seq_add(eng, &id, &e), QI_OK);
    ck_assert_int_eq(qi_engine_seq_feed(eng, id, p, 6, true, &e), QI_OK);
    ck_assert_int_eq(qi_engine_step(eng, &nt, &e), QI_OK);
    for (int l = 0; l < L; l++) {
        qi_engine_neuron_rp rp;
        ck_assert(qi_engine_neuron_stats(eng, l, &rp));
        ck_assert_int_eq(rp.tokens, 6);
        ck_assert_int_eq(rp.n_fast, g_smol->hp.n_ff);
        ck_assert(rp.active > 0 && rp.hit == rp.active && rp.active <= 6LL * rp.n_fast);
    }
    qi_engine_neuron_rp rp;
    ck_assert(!qi_engine_neuron_stats(eng, L, &rp));
    qi_engine_free(eng);
    free(mask);
    free(want);
    free(got);
}
END_TEST

START_TEST(partial) {
    const int L = g_smol->hp.n_layer, V = g_smol->hp.n_vocab, nu = g_smol->hp.n_ff / qi_engine_neuron_unit(g_smol);
    int32_t tok[S][G];
    memset(tok, 0xff, sizeof tok);
    float *want = malloc(sizeof(float) * n_logits()), *got = malloc(sizeof(float) * n_logits()),
          *alone = malloc(sizeof(float) * n_logits());
    qi_engine_opts o;
    opts(&o, NULL, NULL, S);
    run(&o, 0, S, tok, want);
    uint8_t *mask = calloc((size_t)L * nu, 1);
    uint64_t seed = 5;
    int fast[64] = {0};
    for (int l = 0; l < L; l++)
        for (int i = 0; i < nu; i++) fast[l] += mask[l * nu + i] = qi_test_rand(&seed) % 10 < 4;
    opts(&o, "cpu,testdev", mask, S);
    int32_t tok2[S][G];
    memcpy(tok2, tok, sizeof tok);
    run(&o, 0, S, tok2, got);
    double maxd = 0.0, maxw = 0.0;
    for (size_t i = 0; i < n_logits(); i++) {
        maxd = fmax(maxd, fabs((double)got[i] - want[i]));
        maxw = fmax(maxw, fabs((double)want[i]));
    }
    /* the sides' down products are summed apart, a rounding apart from
     * the whole one; the matmuls after it quantise their input to 8 bits,
     * so a last-bit change moves a logit by up to a quantisation step of
     * that input (measured: 2.3e-3 of the largest logit; a side left out
     * moves them by the FFN's whole output: 3.4e-2 here) */
    ck_assert_msg(maxd > 0.0, "a partial split summed exactly as the unsplit matmul");
    ck_assert_msg(maxd < 1e-2 * maxw, "logits off by %g (largest %g)", maxd, maxw);
    for (int s = 0; s < S; s++)
        for (int g = 0; g <= G; g++) {
            const float *a = want + ((size_t)s * (G + 1) + g) * V, *b = got + ((size_t)s * (G + 1) + g) * V;
            int ia = 0, ib = 0;
            for (int v = 1; v < V; v++) ia = a[v] > a[ia] ? v : ia, ib = b[v] > b[ib] ? v : ib;
            ck_assert_int_eq(ia, ib);
        }
    /* a batch equals its sequences alone */
    opts(&o, "cpu,testdev", mask, 1);
    for (int s = 0; s < S; s++) run(&o, s, 1, tok2, alone);
    ck_assert(memcmp(alone, got, sizeof(float) * n_logits()) == 0);
    /* the plan shows the split */
    opts(&o, "cpu,testdev", mask, 1);
    qi_engine *eng = NULL;
    qi_err e = {0};
    ck_assert_int_eq(qi_engine_create(g_smol, &o, &eng, &e), QI_OK);
    const qi_plan *p = qi_engine_plan(eng);
    for (int l = 0; l < L; l++) {
        ck_assert_int_eq(p->layers[l].ffn_dev, fast[l] ? 1 : -1);
        ck_assert_int_eq(p->layers[l].ffn_rows, fast[l] * qi_engine_neuron_unit(g_smol));
    }
    ck_assert_int_eq(qi_plan_validate(p, &e), QI_OK);
    /* a new plan leaves the split as it was (the replan case) */
    ck_assert_msg(qi_engine_replan_spec(eng, "all-cpu", NULL, &e) == QI_OK, "%s", e.msg);
    for (int l = 0; l < L; l++) ck_assert_int_eq(qi_engine_plan(eng)->layers[l].ffn_dev, fast[l] ? 1 : -1);
    qi_engine_free(eng);
    free(mask);
    free(want);
    free(got);
    free(alone);
}
END_TEST

/* cats on the cold side: thresholds on act(gate) for every layer. */
static float g_thr[64 * QI_SITE_COUNT];
static qi_sparsity cats_at(float t) {
    for (size_t i = 0; i < sizeof g_thr / sizeof g_thr[0]; i++) g_thr[i] = i % QI_SITE_COUNT == QI_SITE_GATE ? t : -1.0f;
    return (qi_sparsity){.mode = QI_SPARSITY_CATS, .target = 0.3, .n_layer = g_smol->hp.n_layer, .thr = g_thr};
}

static double measured_sparsity(const qi_engine_opts *o) {
    qi_engine *eng = NULL;
    qi_err e = {0};
    ck_assert_int_eq(qi_engine_create(g_smol, o, &eng, &e), QI_OK);
    int id, nt;
    int32_t p[16];
    for (int i = 0; i < 16; i++) p[i] = 100 + 37 * i;
    ck_assert_int_eq(qi_engine_seq_add(eng, &id, &e), QI_OK);
    ck_assert_int_eq(qi_engine_seq_feed(eng, id, p, 16, false, &e), QI_OK);
    ck_assert_int_eq(qi_engine_step(eng, &nt, &e), QI_OK);
    const double v = qi_engine_sparsity_measured(eng);
    qi_engine_free(eng);
    return v;
}

START_TEST(cold_cats) {
    const int L = g_smol->hp.n_layer, nu = g_smol->hp.n_ff / qi_engine_neuron_unit(g_smol);
    const size_t n = n_logits();
    int32_t tok[S][G];
    memset(tok, 0xff, sizeof tok);
    float *cats = malloc(sizeof(float) * n), *got = malloc(sizeof(float) * n), *dense = malloc(sizeof(float) * n),
          *alone = malloc(sizeof(float) * n);
    qi_sparsity sp = cats_at(2.0f); /* 91% zeroed: a decode step of 4 rows reads few columns */
    qi_engine_opts o;
    opts(&o, NULL, NULL, S);
    o.sparsity = &sp;
    run(&o, 0, S, tok, cats);
    const double s_all = measured_sparsity(&o);
    /* no unit hot: cats as without a split, bit for bit */
    uint8_t *mask = calloc((size_t)L * nu, 1);
    opts(&o, "cpu,testdev", mask, S);
    o.sparsity = &sp;
    run(&o, 0, S, tok, got);
    ck_assert(memcmp(cats, got, sizeof(float) * n) == 0);
    /* every unit hot: nothing left to threshold, the dense run bit for bit */
    memset(mask, 1, (size_t)L * nu);
    run(&o, 0, S, tok, got);
    opts(&o, NULL, NULL, S);
    run(&o, 0, S, tok, dense);
    ck_assert(memcmp(dense, got, sizeof(float) * n) == 0);
    /* a third of the units hot: the cold side thresholded, read sparse;
     * against its own dense reading of the same zeroed activations
     * (sparse_max_density 0), and a batch against its sequences alone */
    uint64_t seed = 11;
    for (size_t i = 0; i < (size_t)L * nu; i++) mask[i] = qi_test_rand(&seed) % 3 == 0;
    opts(&o, "cpu,testdev", mask, S);
    o.sparsity = &sp;
    run(&o, 0, S, tok, got);
    const double s_cold = measured_sparsity(&o);
    fprintf(stderr, "cold cats: %.3f of every activation zeroed without a split, %.3f of the cold side's with one\n", s_all,
           s_cold);
    ck_assert(s_all > 0.1 && s_all < 0.99);
    ck_assert(s_cold > 0.1 && s_cold < 0.99);
    qi_engine_opts od = o;
    od.sparse_max_density = 0.0;
    int32_t tok2[S][G];
    memcpy(tok2, tok, sizeof tok);
    run(&od, 0, S, tok2, dense);
    double maxd = 0.0, maxw = 0.0, maxc = 0.0;
    for (size_t i = 0; i < n; i++) {
        maxd = fmax(maxd, fabs((double)got[i] - dense[i]));
        maxc = fmax(maxc, fabs((double)got[i] - cats[i]));
        maxw = fmax(maxw, fabs((double)dense[i]));
    }
    fprintf(stderr, "cold cats: sparse against dense reading %g, against cats unsplit %g (largest logit %g)\n", maxd, maxc,
           maxw);
    ck_assert_msg(maxd > 0.0 && maxd < 1e-2 * maxw, "cold side's sparse reading off by %g (largest %g)", maxd, maxw);
    ck_assert_msg(maxc > maxd, "hot neurons unthresholded changed nothing (%g)", maxc);
    opts(&o, "cpu,testdev", mask, 1);
    o.sparsity = &sp;
    for (int s = 0; s < S; s++) run(&o, s, 1, tok, alone);
    ck_assert(memcmp(alone, got, sizeof(float) * n) == 0);
    free(mask);
    free(cats);
    free(got);
    free(dense);
    free(alone);
}
END_TEST

/* The qinfer policy's swaps, run by the engine between steps, from a
 * starting activity that calls the hot units cold and the cold ones hot,
 * so the first rounds swap; with sp, cats on the cold side (its column
 * form rewritten by each swap). After every step each unit is on one side
 * with its own bytes, the column form too (qi_engine_neuron_check); the
 * dense run's logits stay within the split's rounding of the unsplit ones.
 * fail_at > 0: the fast device's fail_at-th copy from round 2 on fails,
 * which must stop that step and every later one. worker 1: the swaps made
 * by the background worker, each step's check waiting for the round its
 * activity woke; worker 2: the worker racing the steps (no wait; 24
 * steps, each step's logits within the bound, the check at the end),
 * pausing inside each swap (until a step has read the layer, 20 ms at
 * most) while every step checks each layer it reads
 * (qi_engine_neuron_check_steps): some reads must meet a layer mid-swap,
 * a slot emptied, and find it computing nothing and the unit that left it
 * on the cold side. The worker's uploads go on testdev's copy stream,
 * beside the steps' ops, and there each copy leaves its destination NaN
 * while 100 of the device's ops run, a step's worth (5 ms at most;
 * qi_testdev_slow_copies): every logit must stay
 * finite, which it would not if a step's op read bytes the copy stream was
 * still writing (a slot uploaded in place instead of through the staging).
 * worker 3: as 1, the uploads on the main stream (none on the copy one). */
static void swap_run(const qi_sparsity *sp, long fail_at, int worker) {
    const int L = g_smol->hp.n_layer, V = g_smol->hp.n_vocab, nu = g_smol->hp.n_ff / qi_engine_neuron_unit(g_smol);
    uint8_t *mask = calloc((size_t)L * nu, 1);
    double *act = malloc(sizeof(double) * (size_t)L * nu);
    for (int l = 0; l < L; l++)
        for (int u = 0; u < nu; u++) {
            mask[l * nu + u] = u < nu / 4;
            act[l * nu + u] = mask[l * nu + u] ? 0.0 : 1.0 + u;
        }
    qi_neuron_live_opts lo;
    qi_neuron_live_opts_default(&lo);
    lo.ratio = 3.0;
    lo.decay = 0.5;
    qi_engine_opts o;
    opts(&o, NULL, NULL, 1);
    qi_engine *dense = NULL, *eng = NULL;
    qi_err e = {0};
    ck_assert_int_eq(qi_engine_create(g_smol, &o, &dense, &e), QI_OK);
    opts(&o, "cpu,testdev", mask, 1);
    o.sparsity = sp;
    o.neuron_swap_every = 1;
    o.neuron_swap_worker = worker > 0;
    o.neuron_swap_main_stream = worker == 3;
    o.neuron_live = &lo;
    o.neuron_activity = act;
    ck_assert_msg(qi_engine_create(g_smol, &o, &eng, &e) == QI_OK, "%s", e.msg);
    ck_assert_int_eq(qi_engine_neuron_check(eng, &e), QI_OK);
    qi_backend *fast = qi_engine_backend(eng, 1);
    ck_assert_ptr_nonnull(fast);
    ck_assert(qi_dev_has_copy_stream(fast));
    const long cs0 = qi_testdev_copies(fast, QI_STREAM_COPY);
    if (worker == 2) {
        qi_engine_neuron_check_steps(eng, true, 20000);
        qi_testdev_slow_copies(fast, 100, 5000);
    }
    int id[2], nt;
    int32_t p[12];
    for (int i = 0; i < 12; i++) p[i] = 300 + 11 * i;
    qi_engine *both[2] = {dense, eng};
    for (int k = 0; k < 2; k++) {
        ck_assert_int_eq(qi_engine_seq_add(both[k], &id[k], &e), QI_OK);
        ck_assert_int_eq(qi_engine_seq_feed(both[k], id[k], p, 12, false, &e), QI_OK);
    }
    double maxd = 0.0, maxw = 0.0;
    const int steps = worker == 2 ? 24 : 8;
    for (int g = 0; g < steps; g++) {
        if (fail_at > 0 && g == 1) qi_engine_inject_fail(eng, 1, 0, fail_at);
        for (int k = 0; k < 2; k++) {
            qi_err_clear(&e);
            const qi_status st = qi_engine_step(both[k], &nt, &e);
            if (k == 1 && fail_at > 0 && g >= 1) { /* this step's round failed, or an earlier one */
                ck_assert_msg(st == QI_ERR_BACKEND, "step %d after a failed copy: %d (%s)", g, st, e.msg);
                ck_assert_msg(strstr(e.msg, g == 1 ? "a neuron swap's copy" : "failed earlier"), "step %d: %s", g, e.msg);
                continue;
            }
            ck_assert_msg(st == QI_OK, "%s", e.msg);
        }
        if (fail_at > 0 && g >= 1) {
            const float *a = qi_engine_seq_logits(dense, id[0], -1);
            int best = 0;
            for (int v = 0; v < V; v++) best = a[v] > a[best] ? v : best;
            const int32_t t = best;
            ck_assert_int_eq(qi_engine_seq_feed(dense, id[0], &t, 1, false, &e), QI_OK);
            continue;
        }
        if (worker < 2 || g == steps - 1)
            ck_assert_msg(qi_engine_neuron_check(eng, &e) == QI_OK, "step %d: %s", g, e.msg);
        const float *a = qi_engine_seq_logits(dense, id[0], -1), *b = qi_engine_seq_logits(eng, id[1], -1);
        int best = 0;
        for (int v = 0; v < V; v++) {
            ck_assert_msg(isfinite(b[v]), "step %d: logit %d is %g", g, v, (double)b[v]);
            maxd = fmax(maxd, fabs((double)a[v] - b[v]));
            maxw = fmax(maxw, fabs((double)a[v]));
            best = a[v] > a[best] ? v : best;
        }
        const int32_t t = best;
        for (int k = 0; k < 2; k++) ck_assert_int_eq(qi_engine_seq_feed(both[k], id[k], &t, 1, false, &e), QI_OK);
    }
    qi_engine_neuron_swaps sw;
    qi_engine_neuron_swaps_get(eng, &sw);
    fprintf(stderr, "swaps%s%s%s: %ld rounds, %ld units moved, %.0f bytes, %.2f ms of the steps' thread; logits within "
            "%g of %g; %ld layer reads mid-swap\n", sp ? ", cold cats" : "", fail_at ? ", a copy failing" : "",
            worker == 1   ? ", background worker"
            : worker == 2 ? ", background worker racing the steps"
            : worker == 3 ? ", background worker uploading on the main stream"
                          : "",
            sw.rounds,
            sw.swaps, sw.bytes, 1e3 * sw.seconds, maxd, maxw, sw.mid);
    /* three uploads a swap (gate, up, down's blocks as one strided copy):
     * on the copy stream with the worker, on the main one without it. A
     * swap counted has queued its uploads, which the synchronise runs;
     * racing, the worker may have queued some of the next one's since. */
    if (!fail_at) {
        ck_assert_int_eq(qi_dev_synchronize(fast, &e), QI_OK);
        const long cs = qi_testdev_copies(fast, QI_STREAM_COPY) - cs0;
        fprintf(stderr, "  %ld copies on the fast device's copy stream\n", cs);
        ck_assert(sw.copy_stream == (worker == 1 || worker == 2));
        if (worker == 2)
            ck_assert_int_ge(cs, 3 * sw.swaps);
        else
            ck_assert_int_eq(cs, worker == 1 ? 3 * sw.swaps : 0);
    }
    if (!fail_at) {
        if (worker != 2) ck_assert_int_eq(sw.rounds, 8);
        if (worker == 2) ck_assert_msg(sw.mid > 0, "no step met a layer mid-swap");
        ck_assert_int_gt(sw.swaps, L);
        if (!sp) ck_assert_msg(maxd < 1e-2 * maxw, "logits off by %g (largest %g)", maxd, maxw);
    }
    qi_engine_free(dense);
    qi_engine_free(eng);
    /* refusals: the main stream without the worker, no rule */
    if (!worker) {
        o.neuron_swap_main_stream = true;
        qi_engine *y = NULL;
        qi_err_clear(&e);
        ck_assert_int_eq(qi_engine_create(g_smol, &o, &y, &e), QI_ERR_INVALID);
        ck_assert_msg(strstr(e.msg, "there is no worker"), "%s", e.msg);
        o.neuron_swap_main_stream = false;
    }
    o.neuron_live = NULL;
    qi_engine *x = NULL;
    qi_err_clear(&e);
    ck_assert_int_eq(qi_engine_create(g_smol, &o, &x, &e), QI_ERR_INVALID);
    ck_assert_ptr_nonnull(strstr(e.msg, "the rule's options"));
    free(mask);
    free(act);
}

START_TEST(swaps) {
    swap_run(NULL, 0, 0);
    const qi_sparsity sp = cats_at(0.5f);
    swap_run(&sp, 0, 0);
    /* a step's own copies on the fast device: per layer the input, the
     * activations back and the partial product back; then the round's
     * uploads, three a swap: the second of the first swap fails */
    swap_run(NULL, 3L * g_smol->hp.n_layer + 2, 0);
}
END_TEST

/* The same swaps made by the background worker while the steps go on. */
START_TEST(swaps_worker) {
    swap_run(NULL, 0, 1);
    const qi_sparsity sp = cats_at(0.5f);
    swap_run(&sp, 0, 1);
    swap_run(NULL, 0, 2);
    swap_run(&sp, 0, 2);
    swap_run(NULL, 0, 3);
}
END_TEST

/* A new plan with a split in force: the attention of every layer moved to
 * the fast device mid-run, every unit fast (so the unsplit arithmetic),
 * gives the all-CPU logits bit for bit, and the plan shows the split
 * before and after; moving a split layer's MLP, or a plan that says
 * another split, is refused and the engine runs on. */
START_TEST(replan) {
    const int L = g_smol->hp.n_layer, V = g_smol->hp.n_vocab, nu = g_smol->hp.n_ff / qi_engine_neuron_unit(g_smol);
    int32_t tok[S][G];
    memset(tok, 0xff, sizeof tok);
    float *want = malloc(sizeof(float) * n_logits());
    qi_engine_opts o;
    opts(&o, NULL, NULL, 1);
    run(&o, 0, 1, tok, want);
    uint8_t *mask = malloc((size_t)L * nu);
    memset(mask, 1, (size_t)L * nu);
    opts(&o, "cpu,testdev", mask, 1);
    qi_engine *eng = NULL;
    qi_err e = {0};
    ck_assert_msg(qi_engine_create(g_smol, &o, &eng, &e) == QI_OK, "%s", e.msg);
    int32_t p[40];
    uint64_t seed = 77;
    for (int i = 0; i < 5; i++) p[i] = (int32_t)(qi_test_rand(&seed) % 4000);
    int id, nt;
    ck_assert_int_eq(qi_engine_seq_add(eng, &id, &e), QI_OK);
    ck_assert_int_eq(qi_engine_seq_feed(eng, id, p, 5, false, &e), QI_OK);
    qi_plan np;
    for (int g = 0; g <= G; g++) {
        ck_assert_msg(qi_engine_step(eng, &nt, &e) == QI_OK, "%s", e.msg);
        ck_assert(memcmp(qi_engine_seq_logits(eng, id, -1), want + (size_t)g * V, sizeof(float) * V) == 0);
        if (g == 1) {
            ck_assert_int_eq(qi_plan_copy(&np, qi_engine_plan(eng), &e), QI_OK);
            np.layers[0] = (qi_plan_layer){.mlp_dev = 1, .split_dev = -1, .ffn_dev = -1}; /* a split layer's MLP */
            ck_assert_int_eq(qi_engine_replan(eng, &np, NULL, &e), QI_ERR_UNSUPPORTED);
            ck_assert_msg(strstr(e.msg, "leave the MLPs of split layers on the cpu"), "%s", e.msg);
            np.layers[0].mlp_dev = 0;
            np.layers[1].ffn_rows -= qi_engine_neuron_unit(g_smol); /* another split */
            qi_err_clear(&e);
            ck_assert_int_eq(qi_engine_replan(eng, &np, NULL, &e), QI_ERR_UNSUPPORTED);
            ck_assert_msg(strstr(e.msg, "fixed at creation"), "%s", e.msg);
            np.layers[1].ffn_rows += qi_engine_neuron_unit(g_smol);
            for (int l = 0; l < L; l++) np.layers[l].attn_dev = 1;
            ck_assert_msg(qi_engine_replan(eng, &np, NULL, &e) == QI_OK, "%s", e.msg);
            qi_plan_free(&np);
            const qi_plan *shown = qi_engine_plan(eng);
            for (int l = 0; l < L; l++) {
                ck_assert_int_eq(shown->layers[l].attn_dev, 1);
                ck_assert_int_eq(shown->layers[l].ffn_dev, 1);
                ck_assert_int_eq(shown->layers[l].ffn_rows, g_smol->hp.n_ff);
            }
        }
        if (g < G) {
            const float *lg = qi_engine_seq_logits(eng, id, -1);
            int b = 0;
            for (int v = 1; v < V; v++) b = lg[v] > lg[b] ? v : b;
            ck_assert_int_eq(b, tok[0][g]);
            ck_assert_int_eq(qi_engine_seq_feed(eng, id, &tok[0][g], 1, false, &e), QI_OK);
        }
    }
    ck_assert_int_eq(qi_engine_neuron_check(eng, &e), QI_OK);
    qi_engine_free(eng);
    free(mask);
    free(want);
}
END_TEST

static void refused(const qi_engine_opts *o, qi_status want, const char *what) {
    qi_engine *eng = NULL;
    qi_err e = {0};
    ck_assert_int_eq(qi_engine_create(g_smol, o, &eng, &e), want);
    ck_assert_ptr_null(eng);
    ck_assert_msg(strstr(e.msg, what) != NULL, "'%s' not in: %s", what, e.msg);
}

START_TEST(refusals) {
    const int L = g_smol->hp.n_layer, nu = g_smol->hp.n_ff / qi_engine_neuron_unit(g_smol);
    uint8_t *mask = calloc((size_t)L * nu, 1);
    mask[(L - 1) * nu] = 1; /* one unit of the last layer */
    qi_engine_opts o;
    opts(&o, "cpu,testdev", mask, 1);
    o.neuron_dev = 2;
    refused(&o, QI_ERR_INVALID, "fast device 2");
    o.neuron_dev = 0;
    refused(&o, QI_ERR_INVALID, "fast device 0");
    o.neuron_dev = 1;
    o.placement = "ngl=1";
    refused(&o, QI_ERR_UNSUPPORTED, "leave the MLPs of split layers on the cpu");
    o.placement = NULL;
    o.repack = true;
    refused(&o, QI_ERR_UNSUPPORTED, "--repack");
    o.repack = false;
    float thr[64 * QI_SITE_COUNT];
    for (size_t i = 0; i < sizeof thr / sizeof thr[0]; i++) thr[i] = -1.0f;
    qi_sparsity sp = {.mode = QI_SPARSITY_TEAL, .target = 0.3, .n_layer = L, .thr = thr};
    o.sparsity = &sp;
    refused(&o, QI_ERR_UNSUPPORTED, "teal sparsity");
    o.sparsity = NULL;
    o.devices = "cpu,testdev:16M"; /* room for the activations, not the hot neurons */
    memset(mask, 1, (size_t)L * nu);
    refused(&o, QI_ERR_NOMEM, "hot neurons");
    /* the simulated density is a what-if of a simulated machine */
    o.devices = "cpu,testdev";
    o.sim_cold_density = 0.5;
    refused(&o, QI_ERR_INVALID, "what-if of a simulated machine");
    o.neuron_fast = NULL;
    refused(&o, QI_ERR_INVALID, "what-if of a simulated machine");
    o.sim_cold_density = 1.5;
    refused(&o, QI_ERR_INVALID, "outside (0, 1]");
    o.sim_cold_density = -0.5;
    refused(&o, QI_ERR_INVALID, "outside (0, 1]");
    /* a gated FFN is needed: every engine-made refusal leaves nothing behind */
    free(mask);
}
END_TEST

/* A decode step of a 70B on the simulated A100 server: simulated seconds
 * and the GPU's bytes in use, with a share of the FFN's units fast. */
static double sim_step(const qi_model *m, double share, double density, size_t *gpu_bytes) {
    const int L = m->hp.n_layer, nu = m->hp.n_ff / qi_engine_neuron_unit(m);
    uint8_t *mask = calloc((size_t)L * nu, 1);
    for (int l = 0; l < L; l++)
        for (int i = 0; i < (int)(share * nu + 0.5); i++) mask[l * nu + i] = 1;
    qi_engine_opts o;
    qi_engine_opts_default(&o);
    o.n_threads = 2;
    o.n_ctx = 64;
    o.max_seqs = 1;
    o.sim = A100;
    o.devices = "cpu,gpu";
    o.neuron_fast = share > 0 ? mask : NULL;
    o.neuron_dev = 1;
    o.sim_cold_density = density;
    qi_engine *eng = NULL;
    qi_err e = {0};
    ck_assert_msg(qi_engine_create(m, &o, &eng, &e) == QI_OK, "%s", e.msg);
    int id;
    const int32_t p[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    ck_assert_int_eq(qi_engine_seq_add(eng, &id, &e), QI_OK);
    ck_assert_int_eq(qi_engine_seq_feed(eng, id, p, 8, false, &e), QI_OK);
    int nt;
    ck_assert_int_eq(qi_engine_step(eng, &nt, &e), QI_OK);
    const int32_t t = 9;
    ck_assert_int_eq(qi_engine_seq_feed(eng, id, &t, 1, false, &e), QI_OK);
    const double t0 = qi_engine_now(eng);
    ck_assert_int_eq(qi_engine_step(eng, &nt, &e), QI_OK);
    const double dt = qi_engine_now(eng) - t0;
    qi_engine_dev d;
    ck_assert(qi_engine_device(eng, 1, &d));
    *gpu_bytes = d.in_use;
    qi_engine_free(eng);
    free(mask);
    return dt;
}

/* The calibration timer on the simulated 70B: up and down of more neurons
 * take longer on both devices, and the CPU's seconds per neuron over the
 * GPU's (qi_neuron_calibrate's ratio) is above 1; a bad call is NAN. */
static void sim_calibration(const qi_model *m) {
    qi_engine_opts o;
    qi_engine_opts_default(&o);
    o.n_threads = 2;
    o.n_ctx = 16;
    o.max_seqs = 1;
    o.step_tokens = 16;
    o.sim = A100;
    o.devices = "cpu,gpu";
    qi_engine *eng = NULL;
    qi_err e = {0};
    ck_assert_msg(qi_engine_create(m, &o, &eng, &e) == QI_OK, "%s", e.msg);
    for (int d = 0; d < 2; d++) {
        const double a = qi_engine_neuron_time(eng, d, 1024, 1), b = qi_engine_neuron_time(eng, d, 8192, 1);
        ck_assert_msg(a > 0 && b > 2 * a, "device %d: %g s for 1024 neurons, %g for 8192", d, a, b);
    }
    ck_assert(isnan(qi_engine_neuron_time(eng, 1, 0, 1)));
    ck_assert(isnan(qi_engine_neuron_time(eng, 1, 1024, 1000)));
    double ratio;
    ck_assert_int_eq(qi_neuron_calibrate(qi_engine_neuron_time, eng, m->hp.n_ff, 1, 3, &ratio, &e), QI_OK);
    fprintf(stderr, "sim: calibrated CPU:GPU ratio %.3f\n", ratio);
    ck_assert(ratio > 1.0 && ratio < 100.0);
    qi_engine_free(eng);
    o.devices = "cpu";
    ck_assert_int_eq(qi_engine_create(m, &o, &eng, &e), QI_OK);
    ck_assert(isnan(qi_engine_neuron_time(eng, 1, 1024, 1))); /* one device */
    qi_engine_free(eng);
}

START_TEST(sim) {
    char path[96];
    qi_model *m = qi_test_shapes_70b(path, sizeof path);
    ck_assert_ptr_nonnull(m);
    size_t b0, b5, b10;
    const double t0 = sim_step(m, 0.0, 0, &b0), t5 = sim_step(m, 0.5, 0, &b5), t10 = sim_step(m, 1.0, 0, &b10);
    printf("sim: 70B decode step %.4f s with no hot neurons, %.4f s with half, %.4f s with all; GPU %.2f, %.2f, "
           "%.2f GiB\n", t0, t5, t10, b0 / 1073741824.0, b5 / 1073741824.0, b10 / 1073741824.0);
    ck_assert(t5 < 0.75 * t0);
    ck_assert(t10 < 0.75 * t5);
    /* the FFN of 80 layers: 3 x 28672 x 8192 q4_0 weights (18 bytes a 32) */
    const double ffn = 80.0 * 3 * 28672 * 8192 / 32 * 18;
    ck_assert_double_eq_tol((double)(b10 - b0), ffn, ffn * 0.01);
    ck_assert_double_eq_tol((double)(b5 - b0), ffn / 2, ffn * 0.01);
    /* the what-if density of the CPU's neurons: every neuron read is the
     * dense step (gate and up launched apart: within 1%); a quarter of them
     * read costs less, on the cold side of a split and on MLPs left whole on
     * the CPU; the GPU's neurons run dense, so with all of them there it
     * changes nothing */
    size_t bx;
    const double d5 = sim_step(m, 0.5, 1.0, &bx), q5 = sim_step(m, 0.5, 0.25, &bx), q0 = sim_step(m, 0.0, 0.25, &bx);
    const double q10 = sim_step(m, 1.0, 0.25, &bx);
    printf("sim: cold side read at density 1 %.4f s, 0.25 %.4f s (half hot); no split at 0.25 %.4f s; all hot at "
           "0.25 %.4f s\n", d5, q5, q0, q10);
    ck_assert_double_eq_tol(d5, t5, 0.01 * t5);
    ck_assert(q5 < 0.75 * d5);
    ck_assert(q0 < 0.75 * t0);
    ck_assert_double_eq_tol(q10, t10, 1e-9);
    sim_calibration(m);
    qi_model_free(m);
    unlink(path);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("neuron_split");
    TCase *tc = tcase_create("neuron_split");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, gather);
    tcase_add_test(tc, exact);
    tcase_add_test(tc, partial);
    tcase_add_test(tc, refusals);
    tcase_add_test(tc, replan);
    tcase_add_test(tc, cold_cats);
    tcase_add_test(tc, swaps);
    tcase_add_test(tc, swaps_worker);
    tcase_add_test(tc, sim);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    g_smol = qi_test_synth(QI_TEST_SYNTH_SMOL);
    if (!g_smol) return 1;
    SRunner *sr = srunner_create(suite());
    srunner_run_all(sr, CK_NORMAL);
    const int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    qi_model_free(g_smol);
    return failed ? 1 : 0;
}

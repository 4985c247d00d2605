/* test_sparsity.c - activation sparsity: calibration, thresholds, and the
 * engine under them (qinfer/sparsity.h, qi_engine_opts.sparsity).
 *
 *   - the calibration's quantiles against hand-computed ones (zeros apart,
 *     a bin's top edge within 1/64 of an octave above the value, NaN not
 *     counted), its file read back, thresholds interpolated between
 *     percentiles, each mode's sites;
 *   - malformed calibration files, each refused with FILE:LINE, and 2000
 *     random garblings of a good one: an error or thresholds, never a
 *     crash (under the sanitizers in CI);
 *   - on the synthetic SmolLM2 shape (testutil.h): a target of 0 gives the
 *     dense logits bit for bit, and so does observing every site; every
 *     site is observed in every layer at its width; teal and cats zero
 *     at least the target share; the sparse matmuls and the dense ones on
 *     the same zeroed activations differ by well under the sparsity's own
 *     effect; a batch under sparsity equals
 *     its sequences run alone bit for bit (the union of active columns
 *     changes no row's sums), and an observer, which takes cats's unfused
 *     path, changes no logit; plans off the CPU, --repack and thresholds
 *     for another layer count are refused;
 *   - paused (qi_engine_sparsity_pause), a sparse engine gives the dense
 *     logits bit for bit and counts nothing zeroed; a decode measurement
 *     alternating the two (ab_dense) runs half its steps each way, in
 *     pairs, and reads a weight byte count between the sparse and the
 *     dense engine's.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "qinfer/engine.h"
#include "qinfer/measure.h"
#include "qinfer/model.h"
#include "qinfer/sparsity.h"
#include "testutil.h"

static qi_model *g_model;
static char g_calib[96]; /* the synthetic model's calibration file */

START_TEST(calib_quantiles) {
    qi_sparsity_calib *c = NULL;
    qi_err e = {0};
    ck_assert_int_eq(qi_sparsity_calib_new(2, &c, &e), QI_OK);
    ck_assert_double_eq(qi_sparsity_calib_quantile(c, 0, QI_SITE_GATE, 0.5), -1.0);
    float v[130];
    for (int i = 0; i < 100; i++) v[i] = (float)(i + 1) * (i % 2 ? 1.0f : -1.0f); /* |v| = 1..100 */
    for (int i = 100; i < 130; i++) v[i] = 0.0f;
    qi_sparsity_calib_add(c, 1, QI_SITE_FFN_IN, v, 130);
    const float nan = NAN;
    qi_sparsity_calib_add(c, 1, QI_SITE_FFN_IN, &nan, 1);
    ck_assert_uint_eq(qi_sparsity_calib_count(c, 1, QI_SITE_FFN_IN), 130);
    /* 30 zeros of 130: up to 30/130 the threshold is 0 */
    ck_assert_double_eq(qi_sparsity_calib_quantile(c, 1, QI_SITE_FFN_IN, 30.0 / 130), 0.0);
    /* the k-th smallest magnitude (k past the zeros) is k - 30: the quantile
     * is its bin's top, at most 1/64 of an octave above it */
    for (int k = 31; k <= 130; k += 11) {
        const double t = qi_sparsity_calib_quantile(c, 1, QI_SITE_FFN_IN, k / 130.0), want = k - 30;
        ck_assert_msg(t > want && t <= want * (1.0 + 1.0 / 64) + 1e-12, "quantile %d/130: %.9g, value %g", k, t, want);
    }
    ck_assert_double_eq(qi_sparsity_calib_quantile(c, 0, QI_SITE_FFN_IN, 0.5), -1.0);
    qi_sparsity_calib_free(c);
}
END_TEST

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    fclose(f);
}

/* A good file for 2 layers, every site, quantile k = base + k. */
static void good_file(const char *path) {
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fprintf(f, "# qinfer sparsity calibration 1\n");
    for (int l = 0; l < 2; l++)
        for (int s = 0; s < QI_SITE_COUNT; s++) {
            fprintf(f, "%d %s", l, qi_sparsity_site_name(s));
            for (int k = 0; k < QI_SPARSITY_PCTS; k++) fprintf(f, " %g", 10.0 * s + k + 100.0 * l);
            fputc('\n', f);
        }
    fclose(f);
}

START_TEST(thresholds_loaded) {
    char path[64];
    snprintf(path, sizeof path, "/tmp/qi_test_spc_%d.txt", (int)getpid());
    good_file(path);
    qi_sparsity sp;
    qi_err e = {0};
    ck_assert_msg(qi_sparsity_load(path, QI_SPARSITY_TEAL, 0.505, 2, &sp, &e) == QI_OK, "%s", e.msg);
    for (int l = 0; l < 2; l++)
        for (int s = 0; s < QI_SITE_COUNT; s++) {
            const float t = sp.thr[l * QI_SITE_COUNT + s];
            if (s == QI_SITE_GATE) ck_assert_float_eq(t, -1.0f);
            else ck_assert_float_eq_tol(t, 10.0 * s + 50.5 + 100.0 * l, 1e-4); /* halfway from 50 to 51 */
        }
    qi_sparsity_free(&sp);
    ck_assert_int_eq(qi_sparsity_load(path, QI_SPARSITY_CATS, 0.9, 2, &sp, &e), QI_OK);
    for (int l = 0; l < 2; l++)
        for (int s = 0; s < QI_SITE_COUNT; s++)
            ck_assert_float_eq(sp.thr[l * QI_SITE_COUNT + s], s == QI_SITE_GATE ? 40.0f + 90.0f + 100.0f * l : -1.0f);
    qi_sparsity_free(&sp);
    /* 0: nothing thresholded (the dense result) */
    ck_assert_int_eq(qi_sparsity_load(path, QI_SPARSITY_TEAL, 0.0, 2, &sp, &e), QI_OK);
    for (int i = 0; i < 2 * QI_SITE_COUNT; i++) ck_assert_float_eq(sp.thr[i], -1.0f);
    qi_sparsity_free(&sp);
    /* the wrong model: fewer layers than the file names */
    ck_assert_int_eq(qi_sparsity_load(path, QI_SPARSITY_TEAL, 0.5, 1, &sp, &e), QI_ERR_FORMAT);
    ck_assert_msg(strstr(e.msg, "layer 1 outside"), "%s", e.msg);
    ck_assert_int_eq(qi_sparsity_load(path, QI_SPARSITY_TEAL, 1.0, 2, &sp, &e), QI_ERR_INVALID);
    unlink(path);
}
END_TEST

START_TEST(bad_files) {
    char path[64];
    snprintf(path, sizeof path, "/tmp/qi_test_spc_bad_%d.txt", (int)getpid());
    char q[2048] = "", line[2200];
    for (int k = 0; k < QI_SPARSITY_PCTS; k++) snprintf(q + strlen(q), sizeof q - strlen(q), " %d", k);
    static const struct {
        const char *head, *tail, *want;
    } cases[] = {
        {"0 gate", "", "no quantiles for layer 0 attn_in"}, /* teal's sites missing */
        {"x gate", "", ":1: expected a layer number"},
        {"0 nosuch", "", ":1: unknown site"},
        {"7 ffn_in", "", ":1: layer 7 outside"},
        {"0 ffn_in", " 5", ":1: more than 101"},
        {"0 ffn_in 9", "", ":1: quantile 1"}, /* 9, then 0: decreasing */
        {"0 ffn_in -1", "", ":1: quantile 0"},
    };
    qi_sparsity sp;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(line, sizeof line, "%s%s%s\n", cases[i].head, q, cases[i].tail);
        write_file(path, line);
        qi_err e = {0};
        ck_assert_int_ne(qi_sparsity_load(path, QI_SPARSITY_TEAL, 0.5, 2, &sp, &e), QI_OK);
        ck_assert_msg(strstr(e.msg, path) && strstr(e.msg, cases[i].want), "case %zu: %s", i, e.msg);
    }
    /* a site twice */
    snprintf(line, sizeof line, "0 gate%s\n0 gate%s\n", q, q);
    write_file(path, line);
    qi_err e = {0};
    ck_assert_int_eq(qi_sparsity_load(path, QI_SPARSITY_CATS, 0.5, 1, &sp, &e), QI_ERR_FORMAT);
    ck_assert_msg(strstr(e.msg, ":2: layer 0 gate given twice"), "%s", e.msg);
    /* too few quantiles */
    qi_err_clear(&e);
    write_file(path, "0 gate 1 2 3\n");
    ck_assert_int_eq(qi_sparsity_load(path, QI_SPARSITY_CATS, 0.5, 1, &sp, &e), QI_ERR_FORMAT);
    ck_assert_msg(strstr(e.msg, ":1: quantile 3"), "%s", e.msg);
    unlink(path);
    qi_err_clear(&e);
    ck_assert_int_eq(qi_sparsity_load(path, QI_SPARSITY_CATS, 0.5, 1, &sp, &e), QI_ERR_IO);
    /* garbled good files: an error or thresholds, never a crash */
    char good[64];
    snprintf(good, sizeof good, "/tmp/qi_test_spc_good_%d.txt", (int)getpid());
    good_file(good);
    size_t n = 0;
    char *text = qi_test_read_file(good, &n);
    ck_assert_ptr_nonnull(text);
    uint64_t st = 99;
    int ok = 0;
    for (int it = 0; it < 2000; it++) {
        char *g = malloc(n + 1);
        memcpy(g, text, n + 1);
        const int edits = 1 + (int)(qi_test_rand(&st) % 4);
        for (int k = 0; k < edits; k++) {
            const size_t at = qi_test_rand(&st) % n;
            static const char pool[] = "0123456789 .-e\n#xgz\t+";
            g[at] = pool[qi_test_rand(&st) % (sizeof pool - 1)];
        }
        size_t len = n;
        if (qi_test_rand(&st) % 5 == 0) len = qi_test_rand(&st) % n; /* truncated */
        g[len] = 0;
        write_file(path, g);
        qi_err ge = {0};
        if (qi_sparsity_load(path, (it & 1) ? QI_SPARSITY_CATS : QI_SPARSITY_TEAL, 0.3, 2, &sp, &ge) == QI_OK) {
            for (int i = 0; i < 2 * QI_SITE_COUNT; i++) ck_assert(isfinite(sp.thr[i]));
            qi_sparsity_free(&sp);
            ok++;
        } else {
            ck_assert_msg(strstr(ge.msg, path), "%s", ge.msg);
        }
        free(g);
    }
    printf("garbled calibration files: %d of 2000 still loaded, the rest refused\n", ok);
    free(text);
    unlink(path);
    unlink(good);
}
END_TEST

/* ---- the engine -------------------------------------------------------- */

typedef struct {
    long calls[64][QI_SITE_COUNT];
    int width[QI_SITE_COUNT];
    qi_sparsity_calib *cal;
} obs;

static void observe(void *ctx, int layer, int site, const float *x, int rows, int width) {
    obs *o = ctx;
    o->calls[layer][site]++;
    o->width[site] = width;
    if (o->cal) qi_sparsity_calib_add(o->cal, layer, site, x, (long)rows * width);
}

#define NSEQ 3
#define STEPS 4

/* NSEQ sequences (prompts of 20, 45, 70 tokens) then STEPS greedy decode
 * steps fed the same tokens, batched together (batch) or one at a time;
 * every row's logits into out [NSEQ][STEPS + 1][V]. */
static bool g_pause; /* run() pauses the sparsity of the engines it makes */

static qi_status run(const qi_engine_opts *base, bool batch, float *out, qi_err *e) {
    const int V = g_model->hp.n_vocab;
    qi_engine_opts o = *base;
    o.n_threads = 2;
    o.n_ctx = 128;
    o.max_seqs = NSEQ;
    for (int s0 = 0; s0 < NSEQ; s0 += batch ? NSEQ : 1) {
        qi_engine *eng = NULL;
        qi_status st = qi_engine_create(g_model, &o, &eng, e);
        if (st) return st;
        if (g_pause) qi_engine_sparsity_pause(eng, true);
        const int n = batch ? NSEQ : 1;
        int ids[NSEQ];
        for (int s = s0; s < s0 + n; s++) {
            int32_t p[70];
            uint64_t r = 40 + (uint64_t)s;
            for (int i = 0; i < 20 + 25 * s; i++) p[i] = (int32_t)(qi_test_rand(&r) % 4000);
            ck_assert_int_eq(qi_engine_seq_add(eng, &ids[s - s0], e), QI_OK);
            ck_assert_int_eq(qi_engine_seq_feed(eng, ids[s - s0], p, 20 + 25 * s, false, e), QI_OK);
        }
        for (int k = 0; k <= STEPS; k++) {
            while (true) {
                bool pending = false;
                for (int i = 0; i < n; i++) pending |= qi_engine_seq_pending(eng, ids[i]) > 0;
                if (!pending) break;
                ck_assert_msg(qi_engine_step(eng, NULL, e) == QI_OK, "%s", e->msg);
            }
            for (int i = 0; i < n; i++) {
                const float *lg = qi_engine_seq_logits(eng, ids[i], -1);
                memcpy(out + ((size_t)(s0 + i) * (STEPS + 1) + k) * V, lg, sizeof(float) * V);
                const int32_t t = (int32_t)((s0 + i) * 131 + k * 17) % 4000;
                if (k < STEPS) ck_assert_int_eq(qi_engine_seq_feed(eng, ids[i], &t, 1, false, e), QI_OK);
            }
        }
        if (g_pause) {
            ck_assert(qi_engine_sparsity_measured(eng) == -1.0); /* paused steps count nothing */
        } else if (o.sparsity && o.sparsity->target > 0) {
            /* thresholds from the dense model's activations zero more
             * downstream, where the zeroed inputs shrink the activations
             * (why the calibration can be run under sparsity) */
            const double z = qi_engine_sparsity_measured(eng);
            ck_assert_msg(z >= o.sparsity->target - 0.05 && z < 1.0, "measured sparsity %.3f for a target of %.2f",
                          z, o.sparsity->target);
        }
        qi_engine_free(eng);
    }
    return QI_OK;
}

static size_t n_logits(void) { return (size_t)NSEQ * (STEPS + 1) * (size_t)g_model->hp.n_vocab; }

START_TEST(engine_dense_and_observed) {
    const size_t n = n_logits();
    float *want = malloc(sizeof(float) * n), *got = malloc(sizeof(float) * n);
    qi_engine_opts o;
    qi_engine_opts_default(&o);
    qi_err e = {0};
    ck_assert_int_eq(run(&o, true, want, &e), QI_OK);
    /* observing every site: the same logits; calibrates the model */
    static obs ob;
    memset(&ob, 0, sizeof ob);
    ck_assert_int_eq(qi_sparsity_calib_new(g_model->hp.n_layer, &ob.cal, &e), QI_OK);
    o.act_observe = observe;
    o.act_observe_ctx = &ob;
    ck_assert_int_eq(run(&o, true, got, &e), QI_OK);
    ck_assert_msg(memcmp(want, got, sizeof(float) * n) == 0, "observing changed the logits");
    const qi_hparams *hp = &g_model->hp;
    const int widths[QI_SITE_COUNT] = {hp->n_embd, hp->n_head * hp->head_dim, hp->n_embd, hp->n_ff, hp->n_ff};
    for (int s = 0; s < QI_SITE_COUNT; s++) {
        ck_assert_int_eq(ob.width[s], widths[s]);
        for (int l = 0; l < hp->n_layer; l++) ck_assert_int_gt(ob.calls[l][s], STEPS);
    }
    ck_assert_int_eq(qi_sparsity_calib_write(ob.cal, g_calib, "synthetic", 135, &e), QI_OK);
    qi_sparsity_calib_free(ob.cal);
    /* a target of 0 from that calibration: dense, bit for bit */
    qi_sparsity sp;
    ck_assert_int_eq(qi_sparsity_load(g_calib, QI_SPARSITY_TEAL, 0.0, hp->n_layer, &sp, &e), QI_OK);
    qi_engine_opts_default(&o);
    o.sparsity = &sp;
    ck_assert_int_eq(run(&o, true, got, &e), QI_OK);
    ck_assert_msg(memcmp(want, got, sizeof(float) * n) == 0, "sparsity 0 changed the logits");
    qi_sparsity_free(&sp);
    free(want);
    free(got);
}
END_TEST

static double mean_kl(const float *a, const float *b, size_t rows, int V) {
    double sum = 0.0;
    for (size_t r = 0; r < rows; r++) {
        const float *w = a + r * V, *g = b + r * V;
        double mw = -INFINITY, mg = -INFINITY, sw = 0, sg = 0, kl = 0;
        for (int v = 0; v < V; v++) mw = fmax(mw, w[v]), mg = fmax(mg, g[v]);
        for (int v = 0; v < V; v++) sw += exp(w[v] - mw), sg += exp(g[v] - mg);
        for (int v = 0; v < V; v++) {
            const double lw = w[v] - mw - log(sw), lg = g[v] - mg - log(sg);
            kl += exp(lw) * (lw - lg);
        }
        sum += kl;
    }
    return sum / (double)rows;
}

START_TEST(engine_sparse_modes) {
    ck_assert_msg(access(g_calib, R_OK) == 0, "the dense case writes the calibration first");
    const size_t n = n_logits();
    float *dense = malloc(sizeof(float) * n), *a = malloc(sizeof(float) * n), *b = malloc(sizeof(float) * n);
    qi_engine_opts o;
    qi_engine_opts_default(&o);
    qi_err e = {0};
    ck_assert_int_eq(run(&o, true, dense, &e), QI_OK);
    for (int mode = QI_SPARSITY_TEAL; mode <= QI_SPARSITY_CATS; mode++) {
        qi_sparsity sp;
        ck_assert_int_eq(qi_sparsity_load(g_calib, (qi_sparsity_mode)mode, 0.5, g_model->hp.n_layer, &sp, &e), QI_OK);
        qi_engine_opts_default(&o);
        o.sparsity = &sp;
        o.sparse_max_density = 1.0; /* every matmul sparse */
        ck_assert_int_eq(run(&o, true, a, &e), QI_OK);
        ck_assert_int_eq(run(&o, false, b, &e), QI_OK);
        ck_assert_msg(memcmp(a, b, sizeof(float) * n) == 0, "%s: batched differs from alone",
                      qi_sparsity_mode_name((qi_sparsity_mode)mode));
        /* an observer takes cats's unfused path (gate, act, up, glu one
         * after another): the same logits */
        static obs ob;
        memset(&ob, 0, sizeof ob);
        o.act_observe = observe;
        o.act_observe_ctx = &ob;
        ck_assert_int_eq(run(&o, true, b, &e), QI_OK);
        ck_assert_msg(memcmp(a, b, sizeof(float) * n) == 0, "%s: observed differs",
                      qi_sparsity_mode_name((qi_sparsity_mode)mode));
        o.sparse_max_density = 0.0; /* the same zeroed activations, dense matmuls */
        float *c = malloc(sizeof(float) * n);
        ck_assert_int_eq(run(&o, true, c, &e), QI_OK);
        o.act_observe = NULL;
        ck_assert_int_eq(run(&o, true, b, &e), QI_OK);
        ck_assert_msg(memcmp(c, b, sizeof(float) * n) == 0, "%s, dense matmuls: observed differs",
                      qi_sparsity_mode_name((qi_sparsity_mode)mode));
        free(c);
        const double kl_paths = mean_kl(b, a, n / g_model->hp.n_vocab, g_model->hp.n_vocab);
        const double kl_dense = mean_kl(dense, a, n / g_model->hp.n_vocab, g_model->hp.n_vocab);
        printf("%s 0.5: sparse vs dense matmuls KL %.2e nats; vs no sparsity %.2e\n",
               qi_sparsity_mode_name((qi_sparsity_mode)mode), kl_paths, kl_dense);
        fflush(stdout);
        /* both paths read the same 8-bit activations and differ in
         * rounding, which the thresholds and quantisers downstream amplify
         * (a value near one flips): well under the sparsity's own effect,
         * where a wrong sparse product is far over it */
        ck_assert_msg(kl_paths < 0.5 * kl_dense, "sparse and dense matmuls of the same activations: KL %g, the "
                      "sparsity itself %g", kl_paths, kl_dense);
        ck_assert(memcmp(a, dense, sizeof(float) * n) != 0);
        qi_sparsity_free(&sp);
    }
    free(dense), free(a), free(b);
}
END_TEST

/* Layer 0's attn_out activations, a row a step (capture). */
typedef struct {
    float *x;
    int rows, width;
} cap0;

static void capture0(void *ctx, int layer, int site, const float *x, int rows, int width) {
    cap0 *c = ctx;
    if (layer != 0 || site != QI_SITE_ATTN_OUT) return;
    memcpy(c->x + (size_t)c->rows * width, x, sizeof(float) * (size_t)rows * width);
    c->rows += rows;
    c->width = width;
}

/* Logits [steps][V] of a sequence fed one token a step (rows under
 * QI_K_WIDE_MIN: a prompt's many rows go to the dense kernels' wide form,
 * summed otherwise), on an engine of opts o; with c, layer 0's attn_out
 * activations too. */
static void run_decode(const qi_engine_opts *base, int steps, float *out, cap0 *c) {
    const int V = g_model->hp.n_vocab;
    qi_engine_opts o = *base;
    o.n_threads = 2;
    o.n_ctx = 64;
    if (c) o.act_observe = capture0, o.act_observe_ctx = c, c->rows = 0;
    qi_err e = {0};
    qi_engine *eng = NULL;
    ck_assert_msg(qi_engine_create(g_model, &o, &eng, &e) == QI_OK, "%s", e.msg);
    int id;
    ck_assert_int_eq(qi_engine_seq_add(eng, &id, &e), QI_OK);
    uint64_t r = 77;
    for (int k = 0; k < steps; k++) {
        const int32_t t = (int32_t)(qi_test_rand(&r) % 4000);
        ck_assert_int_eq(qi_engine_seq_feed(eng, id, &t, 1, false, &e), QI_OK);
        ck_assert_msg(qi_engine_step(eng, NULL, &e) == QI_OK, "%s", e.msg);
        memcpy(out + (size_t)k * V, qi_engine_seq_logits(eng, id, -1), sizeof(float) * V);
    }
    qi_engine_free(eng);
}

/* Thresholds of 0 at every site (a calibration whose quantiles are all 0)
 * zero nothing but exact zeros: the dense matmuls then give the dense
 * result bit for bit, and the column forms (every site sparse) read the
 * same 8-bit activations, so their products differ from the dense
 * matmuls' in rounding alone (q8_0 weights: no block sums in fp16, as
 * q4_1's). Seen at layer 0's attn_out, which q, k and v's products reach
 * through no quantiser (downstream, a rounding flips an 8-bit value now
 * and then, and the logits show that more than the products). The column
 * forms once multiplied the exact float activations: a difference of the
 * dense path's 8-bit quantisation, 2.4e-3 of the largest value against
 * 3.4e-5 (the rounding, through the KV cache's fp16). */
START_TEST(engine_paths_one_arithmetic) {
    qi_model *const q41 = g_model;
    g_model = qi_test_synth(QI_TEST_SYNTH_SMOL " --type q8_0 --n-layer 2");
    ck_assert_ptr_nonnull(g_model);
    char path[96];
    snprintf(path, sizeof path, "/tmp/qi_test_sparsity_zero_%d.txt", (int)getpid());
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    for (int l = 0; l < g_model->hp.n_layer; l++)
        for (int s = 0; s < QI_SITE_COUNT; s++) {
            fprintf(f, "%d %s", l, qi_sparsity_site_name(s));
            for (int k = 0; k < QI_SPARSITY_PCTS; k++) fputs(" 0", f);
            fputc('\n', f);
        }
    fclose(f);
    enum { STEPS0 = 12 };
    const int V = g_model->hp.n_vocab, W = g_model->hp.n_head * g_model->hp.head_dim;
    const size_t n = (size_t)STEPS0 * V;
    float *dense = malloc(sizeof(float) * n), *a = malloc(sizeof(float) * n);
    cap0 c0 = {.x = malloc(sizeof(float) * STEPS0 * W)}, c1 = {.x = malloc(sizeof(float) * STEPS0 * W)};
    qi_engine_opts o;
    qi_engine_opts_default(&o);
    qi_err e = {0};
    run_decode(&o, STEPS0, dense, NULL);
    qi_sparsity sp;
    ck_assert_int_eq(qi_sparsity_load(path, QI_SPARSITY_TEAL, 0.5, g_model->hp.n_layer, &sp, &e), QI_OK);
    qi_engine_opts_default(&o);
    o.sparsity = &sp;
    o.sparse_max_density = 0.0;
    run_decode(&o, STEPS0, a, &c0);
    ck_assert_msg(memcmp(a, dense, sizeof(float) * n) == 0, "thresholds 0, dense matmuls: not the dense result");
    o.sparse_max_density = 1.0;
    run_decode(&o, STEPS0, a, &c1);
    ck_assert_int_eq(c0.rows, STEPS0);
    ck_assert_int_eq(c1.rows, STEPS0);
    double max_d = 0.0, max_v = 0.0;
    for (size_t i = 0; i < (size_t)STEPS0 * W; i++)
        max_d = fmax(max_d, fabs((double)c1.x[i] - c0.x[i])), max_v = fmax(max_v, fabs(c0.x[i]));
    printf("thresholds 0: layer 0's attn_out, column forms against dense matmuls: max |difference| %.2e of %.2e\n",
           max_d, max_v);
    fflush(stdout);
    ck_assert_msg(max_d > 0.0, "the column forms were not run");
    ck_assert_msg(max_d <= 4e-4 * max_v, "thresholds 0: the column forms' products differ from the dense matmuls' "
                  "by %g of %g: not the same activations", max_d, max_v);
    qi_sparsity_free(&sp);
    qi_model_free(g_model);
    g_model = q41;
    unlink(path);
    free(dense), free(a), free(c0.x), free(c1.x);
}
END_TEST

/* The weight bytes a batch-1 decode of 16 steps reads on an engine of
 * opts o, alternating sparse and dense steps or not. */
static double decode_bytes(const qi_engine_opts *base, bool ab, qi_decode_result *res) {
    qi_engine_opts o = *base;
    o.n_threads = 2;
    o.n_ctx = 64;
    o.max_seqs = 1;
    o.profile = true;
    qi_engine *eng = NULL;
    qi_err e = {0};
    ck_assert_msg(qi_engine_create(g_model, &o, &eng, &e) == QI_OK, "%s", e.msg);
    const int32_t prompt[4] = {1, 200, 300, 400};
    double ratio[8];
    for (int i = 0; i < 8; i++) ratio[i] = -1.0;
    const qi_decode_opts d = {.batch = 1, .n_gen = 16, .prompts = prompt, .n_prompt = 4, .seed = 7,
                              .ab_dense = ab, .ab_ratio = ab ? ratio : NULL};
    ck_assert_msg(qi_measure_decode(eng, g_model, &d, res, &e) == QI_OK, "%s", e.msg);
    if (ab) {
        ck_assert_int_eq(res->ab_steps[0], 8);
        ck_assert_int_eq(res->ab_steps[1], 8);
        ck_assert_int_eq(res->ab_pairs, 8);
        for (int i = 0; i < 8; i++) ck_assert_msg(ratio[i] > 0.0 && isfinite(ratio[i]), "pair %d: %g", i, ratio[i]);
        ck_assert(res->ab_s[0] > 0.0 && res->ab_s[1] > 0.0);
        ck_assert(fabs(res->ab_s[0] + res->ab_s[1] - res->decode_s) <= res->decode_s);
    } else {
        ck_assert_int_eq(res->ab_pairs, 0);
    }
    /* the measurement leaves the engine unpaused: one more step is sparse */
    const double z = qi_engine_sparsity_measured(eng);
    ck_assert(base->sparsity ? z > 0.0 : z == -1.0);
    qi_engine_free(eng);
    return res->prof.matmul_bytes;
}

START_TEST(engine_paused) {
    const size_t n = n_logits();
    float *dense = malloc(sizeof(float) * n), *got = malloc(sizeof(float) * n);
    qi_engine_opts o;
    qi_engine_opts_default(&o);
    qi_err e = {0};
    ck_assert_int_eq(run(&o, true, dense, &e), QI_OK);
    qi_decode_result r;
    const double b_dense = decode_bytes(&o, false, &r);
    for (int mode = QI_SPARSITY_TEAL; mode <= QI_SPARSITY_CATS; mode++) {
        const char *name = qi_sparsity_mode_name((qi_sparsity_mode)mode);
        qi_sparsity sp;
        ck_assert_int_eq(qi_sparsity_load(g_calib, (qi_sparsity_mode)mode, 0.5, g_model->hp.n_layer, &sp, &e), QI_OK);
        qi_engine_opts_default(&o);
        o.sparsity = &sp;
        o.sparse_max_density = 1.0;
        g_pause = true;
        ck_assert_int_eq(run(&o, true, got, &e), QI_OK);
        g_pause = false;
        ck_assert_msg(memcmp(dense, got, sizeof(float) * n) == 0, "%s paused: not the dense logits", name);
        const double b_sparse = decode_bytes(&o, false, &r), b_ab = decode_bytes(&o, true, &r);
        printf("%s 0.5: weight bytes of 16 steps: dense %.0f, sparse %.0f, alternating %.0f\n", name, b_dense,
               b_sparse, b_ab);
        /* half the steps each way: the mean of the two, but for the
         * activations, which differ step by step */
        ck_assert_msg(b_sparse < b_ab && b_ab < b_dense, "%s: %g not between %g and %g", name, b_ab, b_sparse,
                      b_dense);
        ck_assert_msg(fabs(b_ab - 0.5 * (b_sparse + b_dense)) < 0.25 * (b_dense - b_sparse), "%s: %g, not about "
                      "half way between %g and %g", name, b_ab, b_sparse, b_dense);
        qi_sparsity_free(&sp);
    }
    free(dense), free(got);
}
END_TEST

START_TEST(engine_refusals) {
    qi_sparsity sp;
    qi_err e = {0};
    ck_assert_int_eq(qi_sparsity_load(g_calib, QI_SPARSITY_TEAL, 0.3, g_model->hp.n_layer, &sp, &e), QI_OK);
    qi_engine_opts o;
    qi_engine_opts_default(&o);
    o.sparsity = &sp;
    o.n_ctx = 64;
    o.max_seqs = 1;
    qi_engine *eng = NULL;
    o.devices = "cpu,testdev";
    o.placement = "ngl=2";
    ck_assert_int_eq(qi_engine_create(g_model, &o, &eng, &e), QI_ERR_UNSUPPORTED);
    ck_assert_msg(strstr(e.msg, "CPU only") && strstr(e.msg, "testdev"), "%s", e.msg);
    o.devices = NULL;
    o.placement = NULL;
    o.repack = true;
    qi_err_clear(&e);
    ck_assert_int_eq(qi_engine_create(g_model, &o, &eng, &e), QI_ERR_UNSUPPORTED);
    ck_assert_msg(strstr(e.msg, "--repack"), "%s", e.msg);
    o.repack = false;
    sp.n_layer--;
    qi_err_clear(&e);
    ck_assert_int_eq(qi_engine_create(g_model, &o, &eng, &e), QI_ERR_INVALID);
    sp.n_layer++;
    /* a new plan off the CPU is refused too */
    o.devices = "cpu,testdev";
    qi_err_clear(&e);
    ck_assert_msg(qi_engine_create(g_model, &o, &eng, &e) == QI_OK, "%s", e.msg);
    ck_assert_int_eq(qi_engine_replan_spec(eng, "ngl=1", NULL, &e), QI_ERR_UNSUPPORTED);
    ck_assert_msg(strstr(e.msg, "CPU only"), "%s", e.msg);
    qi_engine_free(eng);
    ck_assert_ptr_null(eng = NULL);
    qi_sparsity_free(&sp);
}
END_TEST

int main(void) {
    g_model = qi_test_synth(QI_TEST_SYNTH_SMOL);
    if (!g_model) return 1;
    snprintf(g_calib, sizeof g_calib, "/tmp/qi_test_sparsity_calib_%d.txt", (int)getpid());
    Suite *s = suite_create("sparsity");
    TCase *tc = tcase_create("sparsity");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, calib_quantiles);
    tcase_add_test(tc, thresholds_loaded);
    tcase_add_test(tc, bad_files);
    tcase_add_test(tc, engine_dense_and_observed);
    tcase_add_test(tc, engine_sparse_modes);
    tcase_add_test(tc, engine_paths_one_arithmetic);
    tcase_add_test(tc, engine_paused);
    tcase_add_test(tc, engine_refusals);
    suite_add_tcase(s, tc);
    const int rc = qi_test_run_suite(s);
    unlink(g_calib);
    qi_model_free(g_model);
    return rc;
}

/* test_sim_cpu.c - the simulated CPU's machine model (engine/backend/sim/
 * sim_cpu.c) and the calibration's machine record (sim_cal.c).
 *
 * The fit (qi_calib_fit) gives back the model's known parameters from the
 * step times they produce over synthetic models (working sets inside,
 * across and past the usable last-level cache; four weight types, two of
 * them on the kernels' tiled path from 8 tokens; one to 64 tokens; 8 and
 * 2 threads of 8 cores), and a row planted 40% off stays visible in its residual
 * instead of being absorbed. A calibration file with its `# machine:`
 * record loads; the record matches the profile it was written from and
 * not one of another CPU, core count, bandwidth or cache. Seconds.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "qinfer/calibrate.h"
#include "qinfer/quant.h"
#include "qinfer/types.h"
#include "sim/sim_cpu.h"
#include "testutil.h"

static void cpu_profile(qi_hwprofile *p) {
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "host");
    snprintf(p->kind, sizeof p->kind, "cpu-only");
    snprintf(p->cpu_name, sizeof p->cpu_name, "Test CPU 9000");
    p->cpu_sockets = (qi_hwfig){.value = 1, .set = true};
    p->cpu_cores = (qi_hwfig){.value = 8, .set = true};
    p->cpu_fp32 = (qi_hwfig){.value = 400e9, .set = true};
    p->cpu_mem_bw = (qi_hwfig){.value = 40e9, .set = true};
    p->cpu_mem_bytes = (qi_hwfig){.value = 64.0 * (1 << 30), .set = true};
    p->cpu_llc = (qi_hwfig){.value = 32.0 * (1 << 20), .set = true};
    p->cpu_llc_bw = (qi_hwfig){.value = 200e9, .set = true};
}

/* A synthetic model: n layers of four square matrices of width d and one
 * type; its rows at made-up addresses (the model never reads them). */
#define MAX_W 256
typedef struct {
    qi_weight w[MAX_W];
    int n;
} synth_model;

static void synth(synth_model *m, int layers, int d, uint32_t type, uintptr_t base) {
    memset(m, 0, sizeof *m);
    uint64_t rb = 0;
    ck_assert(qi_type_row_bytes(type, (uint64_t)d, &rb));
    for (int i = 0; i < 4 * layers && i < MAX_W; i++) {
        qi_weight *w = &m->w[m->n++];
        w->type = type;
        w->n_rows = d;
        w->n_cols = d;
        w->row_bytes = rb;
        w->data = (void *)(base + (uintptr_t)i * (rb * (uint64_t)d + 4096));
    }
}

/* One step of T tokens over the model, after a step that makes its
 * weights the working set. */
static double step_s(const synth_model *m, const qi_hwprofile *pr, const qi_sim_params *p, int T) {
    qi_sim_cpu_ws *ws = calloc(1, sizeof *ws);
    ck_assert_ptr_nonnull(ws);
    double t = 0;
    for (int pass = 0; pass < 2; pass++) {
        t = 0;
        for (int i = 0; i < m->n; i++) {
            const qi_weight *w = &m->w[i];
            t += qi_sim_cpu_matmul_s(ws, pr, p, &w, 1, T);
        }
    }
    free(ws);
    return t;
}

#define N_MODELS 8
static const int k_T[] = {1, 4, 16, 64};
#define N_T 4
/* threads: all 8 cores, and 2 of them */
static const int k_thr[] = {8, 2};
#define N_THR 2
#define N_ROWS (N_MODELS * N_T * N_THR)

typedef struct {
    synth_model *m;
    qi_hwprofile pr;
} rows_ctx;

static qi_status predict_rows(void *vctx, const char *const *keys, const double *values, int n_keys, double *pred,
                              qi_err *err) {
    const rows_ctx *c = vctx;
    qi_sim_params p;
    qi_sim_params_default(&p);
    for (int i = 0; i < n_keys; i++)
        if (qi_sim_params_set(&p, keys[i], values[i], err)) return QI_ERR_INVALID;
    int k = 0;
    for (int hi = 0; hi < N_THR; hi++) {
        p.cpu_threads = k_thr[hi];
        for (int mi = 0; mi < N_MODELS; mi++)
            for (int ti = 0; ti < N_T; ti++) pred[k++] = step_s(&c->m[mi], &c->pr, &p, k_T[ti]);
    }
    return QI_OK;
}

static const char *const k_keys[] = {"cpu_dram_memory",  "cpu_llc_memory",     "cpu_llc_share", "cpu_matmul_compute",
                                     "cpu_unpack",       "cpu_matmul_overlap", "cpu_op_s",      "cpu_matmul_tiled",
                                     "cpu_tile_unpack",  "cpu_thread_memory"};
static const double k_truth[] = {0.8, 0.6, 0.5, 1.5, 0.8, 0.4, 3e-6, 5.0, 6.0, 0.3};
#define N_KEYS 10

static void make_rows(rows_ctx *c) {
    cpu_profile(&c->pr);
    c->m = calloc(N_MODELS, sizeof *c->m);
    ck_assert_ptr_nonnull(c->m);
    /* working sets: about 6 MiB (in the cache), 24 MiB (across its usable
     * 16 MiB) and 200 MiB (past it), over four types */
    synth(&c->m[0], 6, 512, QI_TYPE_Q4_0, 1ull << 32);
    synth(&c->m[1], 6, 512, QI_TYPE_Q8_0, 2ull << 32);
    synth(&c->m[2], 16, 1024, QI_TYPE_Q4_K, 3ull << 32);
    synth(&c->m[3], 8, 1024, QI_TYPE_Q6_K, 4ull << 32);
    synth(&c->m[4], 12, 2048, QI_TYPE_Q4_0, 5ull << 32);
    synth(&c->m[5], 6, 2048, QI_TYPE_Q8_0, 6ull << 32);
    synth(&c->m[6], 10, 2048, QI_TYPE_Q6_K, 7ull << 32);
    synth(&c->m[7], 40, 256, QI_TYPE_Q4_K, 8ull << 32);
}

static void fit_rows(rows_ctx *c, const double *meas, double *vals, double *pred) {
    double lo[N_KEYS], hi[N_KEYS];
    for (int i = 0; i < N_KEYS; i++) {
        vals[i] = i == 6 ? 4e-6 : i == 7 || i == 8 ? 2 : 0.5;
        lo[i] = i == 6 ? 2e-7 : i == 8 ? 0.5 : i == 9 ? 0.125 : 0.01;
        hi[i] = i == 6 ? 5e-5 : i == 3 || i == 4 ? 4 : i == 7 ? 16 : i == 8 ? 64 : 1;
    }
    qi_err e = {0};
    qi_calib_fit_report rep;
    ck_assert_msg(qi_calib_fit(k_keys, vals, lo, hi, N_KEYS, meas, N_ROWS, predict_rows, c, 6000, &rep, &e) ==
                      QI_OK,
                  "%s", e.msg);
    ck_assert(predict_rows(c, k_keys, vals, N_KEYS, pred, &e) == QI_OK);
}

START_TEST(test_unpack_ops) {
    /* every type the CPU computes with has its unpacking work; the order
     * follows the formats: an 8-bit lane none, a nibble less than a
     * nibble and a high bit */
    const uint32_t ts[] = {QI_TYPE_F32, QI_TYPE_F16, QI_TYPE_BF16, QI_TYPE_Q4_0, QI_TYPE_Q4_1, QI_TYPE_Q5_0,
                           QI_TYPE_Q5_1, QI_TYPE_Q8_0, QI_TYPE_Q4_K, QI_TYPE_Q5_K, QI_TYPE_Q6_K};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) ck_assert(qi_sim_cpu_unpack_ops(ts[i]) >= 0);
    ck_assert(qi_sim_cpu_unpack_ops(QI_TYPE_Q8_0) < qi_sim_cpu_unpack_ops(QI_TYPE_Q4_0));
    ck_assert(qi_sim_cpu_unpack_ops(QI_TYPE_Q4_0) < qi_sim_cpu_unpack_ops(QI_TYPE_Q5_0));
    ck_assert(qi_sim_cpu_unpack_ops(QI_TYPE_I32) < 0);
    /* the kernels' tiled path: q4_K and q6_K from 8 tokens */
    ck_assert(qi_sim_cpu_tiled(QI_TYPE_Q4_K, 8) && qi_sim_cpu_tiled(QI_TYPE_Q6_K, 64));
    ck_assert(!qi_sim_cpu_tiled(QI_TYPE_Q4_K, 7) && !qi_sim_cpu_tiled(QI_TYPE_Q8_0, 64));
    qi_sim_params p;
    qi_sim_params_default(&p);
    ck_assert(!qi_sim_cpu_on(&p)); /* off until a calibration turns it on */
    qi_err e = {0};
    ck_assert(qi_sim_params_set(&p, "cpu_dram_memory", 0.8, &e) == QI_OK);
    ck_assert(qi_sim_cpu_on(&p));
    ck_assert(qi_sim_params_set(&p, "cpu_llc_share", 1.5, &e) != QI_OK); /* a share of the cache */
    ck_assert(qi_sim_params_set(&p, "cpu_unpack", 9, &e) != QI_OK);
    ck_assert(qi_sim_params_set(&p, "cpu_thread_memory", 1.5, &e) != QI_OK); /* a share of the rate */
    /* the tile parts: q6_K's scales in three digits, q4_K's in two */
    ck_assert(qi_sim_cpu_tile_parts(QI_TYPE_Q6_K) == 3 && qi_sim_cpu_tile_parts(QI_TYPE_Q4_K) == 2);
}
END_TEST

START_TEST(test_threads_and_tiles) {
    /* the compute rates scale by the cores the threads use, the read rates
     * by cpu_thread_memory; the tiled path's unpacking is once a call */
    qi_hwprofile pr;
    cpu_profile(&pr); /* 8 cores */
    qi_sim_params p;
    qi_sim_params_default(&p);
    p.cpu_threads = 2;
    p.cpu_thread_memory = 0.3;
    /* the model off: the roofline's whole CPU */
    ck_assert(qi_sim_cpu_thread_share(&pr, &p) == 1 && qi_sim_cpu_thread_mem(&p) == 1);
    p.cpu_dram_memory = 1;
    p.cpu_threads = 0;
    p.cpu_thread_memory = 0;
    ck_assert(qi_sim_cpu_thread_share(&pr, &p) == 1 && qi_sim_cpu_thread_mem(&p) == 1); /* 0 threads: all */
    p.cpu_threads = 2;
    ck_assert(fabs(qi_sim_cpu_thread_share(&pr, &p) - 0.25) < 1e-12);
    ck_assert(qi_sim_cpu_thread_mem(&p) == 1); /* no cpu_thread_memory: every count alike */
    p.cpu_thread_memory = 0.3;
    ck_assert(fabs(qi_sim_cpu_thread_mem(&p) - 0.6) < 1e-12);
    p.cpu_threads = 16; /* more threads than cores: no more */
    ck_assert(qi_sim_cpu_thread_share(&pr, &p) == 1 && qi_sim_cpu_thread_mem(&p) == 1);
    /* a compute-bound tiled matmul (all overlap, no fixed cost, the weights
     * in the cache) */
    synth_model *m = calloc(1, sizeof *m);
    ck_assert_ptr_nonnull(m);
    synth(m, 1, 1024, QI_TYPE_Q6_K, 1ull << 32);
    qi_err e = {0};
    const char *k[] = {"cpu_dram_memory", "cpu_llc_memory", "cpu_llc_share", "cpu_matmul_overlap", "cpu_matmul_tiled",
                       "cpu_tile_unpack"};
    const double v[] = {1, 1, 1, 1, 4, 8};
    for (int i = 0; i < 6; i++) ck_assert(qi_sim_params_set(&p, k[i], v[i], &e) == QI_OK);
    p.cpu_op_s = 0;
    p.cpu_threads = 8;
    const double W = 4.0 * 1024 * 1024, t16 = step_s(m, &pr, &p, 16), t64 = step_s(m, &pr, &p, 64);
    /* 2 W (8 + 3 T / 4) / peak */
    ck_assert_msg(fabs(t16 / (2 * W * (8 + 3 * 16 / 4.0) / 400e9) - 1) < 1e-9, "T 16: %g s", t16);
    ck_assert_msg(fabs(t64 / (2 * W * (8 + 3 * 64 / 4.0) / 400e9) - 1) < 1e-9, "T 64: %g s", t64);
    p.cpu_threads = 2;
    ck_assert_msg(fabs(step_s(m, &pr, &p, 64) / t64 - 4) < 1e-9, "2 of 8 cores: %g x", step_s(m, &pr, &p, 64) / t64);
    /* the row path: q4_0's unpacking once a call of up to 32 tokens, its
     * dot every token */
    synth(m, 1, 1024, QI_TYPE_Q4_0, 2ull << 32);
    ck_assert(qi_sim_params_set(&p, "cpu_unpack", 2, &e) == QI_OK);
    p.compute[0][0] = 1;
    p.cpu_threads = 8;
    const double u = qi_sim_cpu_unpack_ops(QI_TYPE_Q4_0);
    for (int T = 4; T <= 64; T *= 4) {
        const double want = 2 * W * (T + (T + 31) / 32 * 2 * u) / 400e9;
        ck_assert_msg(fabs(step_s(m, &pr, &p, T) / want - 1) < 1e-9, "row path, T %d: %g s, want %g", T,
                      step_s(m, &pr, &p, T), want);
    }
    free(m);
}
END_TEST

START_TEST(test_cache_regimes) {
    /* a working set inside the usable cache reads at the cache's rate,
     * one far past it at DRAM's: a decode step of the same weights */
    rows_ctx c;
    make_rows(&c);
    qi_sim_params p;
    qi_sim_params_default(&p);
    qi_err e = {0};
    for (int i = 0; i < N_KEYS; i++) ck_assert(qi_sim_params_set(&p, k_keys[i], k_truth[i], &e) == QI_OK);
    p.cpu_op_s = 0;
    p.cpu_matmul_overlap = 1;
    const double small = step_s(&c.m[1], &c.pr, &p, 1), big = step_s(&c.m[5], &c.pr, &p, 1);
    const double small_b = (double)c.m[1].n * c.m[1].w[0].row_bytes * 512, big_b = (double)c.m[5].n * c.m[5].w[0].row_bytes * 2048;
    const double llc_bw = 200e9 * 0.6, dram_bw = 40e9 * 0.8, L = 32.0 * (1 << 20) * 0.5;
    /* activations at the cache's rate ride along, a few % of the time */
    ck_assert_msg(fabs(small / (small_b / llc_bw) - 1) < 0.05, "in the cache: %g s for %g bytes", small, small_b);
    const double h = L / big_b;
    ck_assert_msg(fabs(big / (big_b * (h / llc_bw + (1 - h) / dram_bw)) - 1) < 0.05, "past it: %g s", big);
    free(c.m);
}
END_TEST

START_TEST(test_fit_recovers) {
    rows_ctx c;
    make_rows(&c);
    qi_sim_params p;
    qi_sim_params_default(&p);
    qi_err e = {0};
    double meas[N_ROWS], pred[N_ROWS], vals[N_KEYS];
    ck_assert(predict_rows(&c, k_keys, k_truth, N_KEYS, meas, &e) == QI_OK);
    fit_rows(&c, meas, vals, pred);
    for (int i = 0; i < N_KEYS; i++)
        ck_assert_msg(fabs(vals[i] / k_truth[i] - 1) < 0.03, "%s: fitted %g, true %g", k_keys[i], vals[i], k_truth[i]);
    ck_assert_msg(qi_calib_mape(pred, meas, N_ROWS) < 0.005, "fit MAPE %g", qi_calib_mape(pred, meas, N_ROWS));
    /* a planted fault: one row 40% long stays visible, not absorbed */
    const int bad = 2 * N_T + 3;
    meas[bad] *= 1.4;
    fit_rows(&c, meas, vals, pred);
    ck_assert_msg(meas[bad] / pred[bad] - 1 > 0.25, "the planted row is predicted %g of its time", pred[bad] / meas[bad]);
    free(c.m);
}
END_TEST

START_TEST(test_machine_record) {
    qi_hwprofile pr;
    cpu_profile(&pr);
    char line[512], why[1024], path[64];
    qi_sim_cal_machine_line(&pr, line, sizeof line);
    snprintf(path, sizeof path, "/tmp/qi_test_sim_cpu_%d.cal", (int)getpid());
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fprintf(f, "# fitted\n%s\ncpu_dram_memory = 0.8  # source: test\ncpu_llc_share = 0.25  # source: test\n", line);
    fclose(f);
    qi_sim_params p;
    qi_sim_params_default(&p);
    qi_err e = {0};
    ck_assert_msg(qi_sim_params_load(path, &p, &e) == QI_OK, "%s", e.msg);
    ck_assert(p.cpu_dram_memory == 0.8 && p.cpu_llc_share == 0.25 && qi_sim_cpu_on(&p));
    ck_assert_msg(!qi_sim_cal_machine_differs(path, &pr, why, sizeof why), "%s", why);
    qi_hwprofile o = pr;
    o.cpu_mem_bw.value *= 1.1; /* a probe's spread: the same machine */
    ck_assert_msg(!qi_sim_cal_machine_differs(path, &o, why, sizeof why), "%s", why);
    o = pr;
    snprintf(o.cpu_name, sizeof o.cpu_name, "Other CPU 1");
    ck_assert(qi_sim_cal_machine_differs(path, &o, why, sizeof why) && strstr(why, "CPU model"));
    o = pr;
    o.cpu_cores.value = 2;
    ck_assert(qi_sim_cal_machine_differs(path, &o, why, sizeof why) && strstr(why, "core count"));
    o = pr;
    o.cpu_mem_bw.value *= 2;
    ck_assert(qi_sim_cal_machine_differs(path, &o, why, sizeof why) && strstr(why, "memory bandwidth"));
    o = pr;
    o.cpu_llc.value /= 4;
    ck_assert(qi_sim_cal_machine_differs(path, &o, why, sizeof why) && strstr(why, "last-level cache"));
    unlink(path);
}
END_TEST

int main(void) {
    Suite *s = suite_create("sim_cpu");
    TCase *tc = tcase_create("sim_cpu");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_unpack_ops);
    tcase_add_test(tc, test_cache_regimes);
    tcase_add_test(tc, test_threads_and_tiles);
    tcase_add_test(tc, test_fit_recovers);
    tcase_add_test(tc, test_machine_record);
    suite_add_tcase(s, tc);
    return qi_test_run_suite(s);
}

/* test_sim_published.c - published GPU measurements as simulated workloads
 * (qinfer/sim_published.h) and the GPU side's calibration.
 *
 * The table reader resolves each row's words into a profile, a model shape
 * and a workload, and refuses a malformed line with FILE:LINE. The fit
 * gives back known GPU parameters from rows simulated with them on three
 * shipped profiles (a two-layer LLaMA-7B-shaped model, so each prediction
 * takes milliseconds), and a planted fault (one row's figure 40% off)
 * leaves both the error and a parameter visibly off, so the recovery
 * check can fail. The GPU kernel model holds to its formula term by term
 * (sim/README.md). The shipped calibration (profiles/gpu-published.cal)
 * loads, keeps every efficiency at most 1, and times a matmul on every
 * shipped GPU profile.
 */
#include <check.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "qinfer/calibrate.h"
#include "qinfer/hwprofile.h"
#include "qinfer/sim_published.h"
#include "qinfer/types.h"
#include "testutil.h"

#define PROFILES QI_SOURCE_DIR "/engine/backend/sim/profiles"

static char *write_tmp(const char *text) {
    static char path[64];
    snprintf(path, sizeof path, "/tmp/qi_test_pub_%d.tsv", (int)getpid());
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    fclose(f);
    return path;
}

START_TEST(test_table) {
    const char *text =
        "# a comment\n"
        "use\tsystem\tmodel\tweights\thardware\ttest\tvalue\tunit\tsettings\tsource\n"
        "train\tllama.cpp\tLlama-2-7B\tQ4_0\tNVIDIA GeForce RTX 4090\tpp512\t11992.7\ttok/s\t-ngl 99 -fa 0\tsrc\n"
        "train\tllama.cpp\tLlama-2-7B\tQ4_0\tNVIDIA GeForce RTX 4090\ttg128\t186.21\ttok/s\tsame\tsame\n"
        "train\tllama.cpp\tLlama-2-7B\tQ4_0\tNVIDIA GeForce RTX 4090\ttg128 (flash attention)\t188.96\ttok/s\t-fa 1\tsame\n"
        "check\tllama.cpp\tLlama-2-70B\tQ4_0\tNVIDIA A100 80GB\tdecode (1024 tokens after a ~500-token prompt)\t25.68"
        "\ttok/s\t./main -ngl 40\tsrc\n"
        "train\tFlexGen\tOPT-6.7B\tFP16\tNVIDIA T4 16GB\tgeneration throughput, prompt 512, generate 32\t25.26\ttok/s"
        "\teffective batch 2, all on GPU\tsrc\n"
        "train\tFlexGen\tOPT-30B\tFP16\tNVIDIA T4 16GB\tgeneration throughput, prompt 512, generate 32\t7.32\ttok/s"
        "\teffective batch 144, lowest tier CPU\tsrc\n"
        "check\tllama.cpp\tLlama-2-7B\tQ4_0\tNVIDIA L40\tpp512\t100\ttok/s\t-ngl 99\tsrc\n"
        "check\tllama.cpp\tLlama-2-7B\tQ4_0\tAMD MI300X\tpp512\t100\ttok/s\t-ngl 99\tsrc\n"
        "input\tFlexGen\tOPT-30B\tFP16\tT4 16GB\tpolicy\t--percent 20 80\t-\tx\tsrc\n";
    qi_pub_row *r = NULL;
    int n = 0;
    qi_err e = {0};
    ck_assert_msg(qi_pub_load(write_tmp(text), &r, &n, &e) == QI_OK, "%s", e.msg);
    ck_assert_int_eq(n, 9);
    ck_assert(r[0].ok && r[0].kind == QI_PUB_PP && r[0].n_tokens == 512 && r[0].ngl == 99 && !r[0].flash_attn);
    ck_assert_str_eq(r[0].profile, "rtx4090-desktop");
    ck_assert_str_eq(r[0].preset, "llama-7b");
    ck_assert_str_eq(r[0].type, "q4_0");
    ck_assert(r[1].ok && r[1].kind == QI_PUB_TG && r[1].ctx == 64 && r[1].ngl == 99); /* "same": the row above's */
    ck_assert(r[2].flash_attn && r[2].ngl == 99);
    ck_assert(r[3].ok && r[3].kind == QI_PUB_TG && r[3].ctx == 1012 && r[3].ngl == 40);
    ck_assert_str_eq(r[3].profile, "a100-pcie-2xeon");
    ck_assert(r[4].ok && r[4].kind == QI_PUB_GEN && r[4].batch == 2 && r[4].n_tokens == 512 && r[4].n_gen == 32);
    ck_assert_str_eq(r[4].preset, "opt-6.7b");
    ck_assert(r[4].gpu_batch == 2 && r[4].n_gpu_batches == 1 && !r[4].offload); /* all on the GPU: one GPU batch */
    ck_assert(!r[5].ok && strstr(r[5].why, "offload"));
    ck_assert_str_eq(r[6].profile, "l40"); /* not L4 */
    ck_assert(!r[7].ok && strstr(r[7].why, "no profile"));
    ck_assert(!r[8].ok && isnan(r[8].value));
    qi_free(r);
    /* FlexGen's policy in the input row after an offloaded row: its block
     * schedule (the row is then simulated, offloaded) */
    const char *fg = "train\tFlexGen\tOPT-30B\tFP16\tNVIDIA T4 16GB\tgeneration throughput, prompt 512, "
                     "generate 32\t7.32\ttok/s\teffective batch 144, lowest tier CPU; policy in the next row\tsrc\n"
                     "input\tFlexGen\tOPT-30B\tFP16\tT4 16GB\tpolicy at prompt 512\t--percent 20 80 0 100 0 100 "
                     "--gpu-batch-size 48 --num-gpu-batches 3\t-\tx\tsrc\n";
    ck_assert_msg(qi_pub_load(write_tmp(fg), &r, &n, &e) == QI_OK, "%s", e.msg);
    ck_assert_msg(r[0].ok && r[0].offload && r[0].batch == 144, "%s", r[0].why);
    ck_assert(r[0].gpu_batch == 48 && r[0].n_gpu_batches == 3 && r[0].w_gpu == 0.2 && r[0].c_gpu == 0.0);
    qi_free(r);
    /* a short line and a figure that is not a number, each at its line */
    const char *bad[] = {"train\tllama.cpp\tLlama-2-7B\n",
                         "# c\ntrain\tllama.cpp\tLlama-2-7B\tQ4_0\tRTX 4090\tpp512\tfast\ttok/s\tx\tsrc\n"};
    const char *want[] = {":1: 3 columns", ":2: value 'fast'"};
    for (int i = 0; i < 2; i++) {
        qi_err_clear(&e);
        ck_assert_int_eq(qi_pub_load(write_tmp(bad[i]), &r, &n, &e), QI_ERR_FORMAT);
        ck_assert_msg(strstr(e.msg, want[i]), "%s", e.msg);
    }
    unlink(write_tmp(""));
}
END_TEST

/* Rows on three GPUs, figures simulated at the true parameters. */
#define N_ROWS 6
static const char *const k_prof[3] = {PROFILES "/rtx4090-desktop.profile", PROFILES "/t4-cloud-vm.profile",
                                      PROFILES "/a100-pcie-2xeon.profile"};
static const char *const k_keys[3] = {"gpu_matmul_memory", "gpu_matvec_compute", "gpu_op_cycles"};

static void fit_case(bool fault, double *got, double *rms) {
    qi_model *m = qi_test_synth("--preset llama-7b --type q4_0 --shapes-only --n-layer 2 --n-vocab 4096");
    ck_assert_ptr_nonnull(m);
    qi_pub_row rows[N_ROWS];
    const qi_pub_row *rp[N_ROWS];
    const qi_model *mp[N_ROWS];
    const char *pp[N_ROWS];
    for (int i = 0; i < N_ROWS; i++) {
        memset(&rows[i], 0, sizeof rows[i]);
        rows[i].ok = true;
        rows[i].ngl = 100;
        rows[i].batch = 1;
        rows[i].kind = i % 2 ? QI_PUB_TG : QI_PUB_PP;
        rows[i].n_tokens = 64;
        rows[i].ctx = 32;
        rp[i] = &rows[i];
        mp[i] = m;
        pp[i] = k_prof[i / 2];
    }
    qi_engine_opts base;
    qi_engine_opts_default(&base);
    base.n_threads = 1;
    qi_pub_set set = {rp, N_ROWS, mp, pp, &base};
    const double truth[3] = {0.7, 0.2, 3000}, lo[3] = {0.05, 0.01, 100}, hi[3] = {1, 1, 50000};
    double t[N_ROWS], v[3] = {0.5, 0.3, 6000};
    qi_err e = {0};
    ck_assert_msg(qi_pub_predict(&set, k_keys, truth, 3, t, &e) == QI_OK, "%s", e.msg);
    if (fault) t[3] *= 1.4; /* the T4's decode row 40% slow */
    qi_calib_fit_report rep;
    ck_assert_msg(qi_calib_fit(k_keys, v, lo, hi, 3, t, N_ROWS, qi_pub_predict, &set, 600, &rep, &e) == QI_OK, "%s",
                  e.msg);
    for (int k = 0; k < 3; k++) got[k] = v[k] / truth[k] - 1;
    if (getenv("QI_TEST_VERBOSE")) fprintf(stderr, "fit %g %g %g rms %g evals %d\n", v[0], v[1], v[2], rep.rms_log, rep.evals);
    *rms = rep.rms_log;
    qi_model_free(m);
}

START_TEST(test_fit_recovers) {
    double rel[3], rms;
    fit_case(false, rel, &rms);
    ck_assert_msg(rms < 1e-3, "rms log error %g", rms);
    for (int k = 0; k < 3; k++) ck_assert_msg(fabs(rel[k]) < 0.02, "%s off by %+.1f%%", k_keys[k], 100 * rel[k]);
    /* the planted fault: the same check fails */
    fit_case(true, rel, &rms);
    bool off = false;
    for (int k = 0; k < 3; k++) off |= fabs(rel[k]) >= 0.02;
    ck_assert_msg(rms > 0.02 && off, "a row 40%% off went unnoticed: rms %g", rms);
}
END_TEST

/* The GPU's kernel model (sim/README.md, "The GPU's kernel model"), term by
 * term, on the RTX 4090 profile (82.6 TFLOP/s FP32, 165.2 fp16 and 660.6
 * int8 tensor, 1008 GB/s, 2520 MHz, 450 W). */
static double gpu_mm(const qi_sim_params *p, qi_type type, int T) {
    qi_hwprofile prof;
    qi_err e = {0};
    ck_assert_int_eq(qi_hwprofile_load(PROFILES "/rtx4090-desktop.profile", &prof, &e), QI_OK);
    qi_sim *s = NULL;
    qi_backend *g = NULL;
    ck_assert_int_eq(qi_sim_create(&prof, p, &s, &e), QI_OK);
    ck_assert_int_eq(qi_backend_sim_create(s, true, 0, &g, &e), QI_OK);
    static const uint8_t dummy[64];
    uint64_t rb = 0;
    ck_assert(qi_type_row_bytes(type, 4096, &rb));
    qi_weight w = {.type = type, .n_rows = 4096, .n_cols = 4096, .row_bytes = rb, .data = dummy};
    static float x[64 * 4096], y[64 * 4096];
    const qi_weight *ws[1] = {&w};
    float *ys[1] = {y};
    const double t0 = qi_sim_now(s);
    ck_assert_int_eq(qi_backend_matmul_n(g, ws, ys, 1, x, T, &e), QI_OK);
    ck_assert_int_eq(qi_dev_synchronize(g, &e), QI_OK);
    const double dt = qi_sim_now(s) - t0;
    qi_backend_free(g);
    qi_sim_free(s);
    return dt;
}

START_TEST(test_gpu_kernel_model) {
    qi_sim_params p;
    qi_sim_params_default(&p);
    const double F1 = 2.0 * 4096 * 4096, q4 = 4096.0 * 4096 / 32 * 18, f16 = 4096.0 * 4096 * 2;
    const double by1 = q4 + 4.0 * (4096 + 4096), by64 = q4 + 4.0 * 64 * (4096 + 4096);
    /* the defaults: the plain roofline, the profile's launch; a quantised
     * GEMM at the int8 tensor rate */
    double want = fmax(F1 / (82.6e12 * 0.55), by1 / (1008e9 * 0.80)) + 5e-6;
    ck_assert_double_eq_tol(gpu_mm(&p, QI_TYPE_Q4_0, 1), want, want * 1e-9);
    want = fmax(64 * F1 / (660.6e12 * 0.55), by64 / (1008e9 * 0.80)) + 5e-6;
    ck_assert_double_eq_tol(gpu_mm(&p, QI_TYPE_Q4_0, 64), want, want * 1e-9);
    /* every term on */
    qi_err e = {0};
    const char *k[] = {"gpu_matvec_compute", "gpu_gemm_simt", "gpu_matmul_overlap", "gpu_op_cycles", "gpu_power_ref",
                       "gpu_power_exp", "gpu_matmul_memory", "gpu_matmul_compute", "gpu_matmul_compute_f16"};
    const double v[] = {0.25, 0.2, 0.5, 4000, 10, 0.5, 0.8, 0.6, 0.4};
    for (int i = 0; i < 9; i++) ck_assert_msg(qi_sim_params_set(&p, k[i], v[i], &e) == QI_OK, "%s", e.msg);
    const double s = sqrt(450.0 / (82.6 * 10)), over = 4000 / (2520e6 * s);
    double tc = F1 / (82.6e12 * s * 0.25), tm = by1 / (1008e9 * 0.8);
    want = fmax(tc, tm) + 0.5 * fmin(tc, tm) + over;
    ck_assert_double_eq_tol(gpu_mm(&p, QI_TYPE_Q4_0, 1), want, want * 1e-9);
    tc = 64 * F1 / (660.6e12 * s * 0.6) + 0.2 * 64 * F1 / (82.6e12 * s);
    tm = by64 / (1008e9 * 0.8);
    want = fmax(tc, tm) + 0.5 * fmin(tc, tm) + over;
    ck_assert_double_eq_tol(gpu_mm(&p, QI_TYPE_Q4_0, 64), want, want * 1e-9);
    tc = 64 * F1 / (165.2e12 * s * 0.4); /* fp16: its own efficiency, no unpacking */
    tm = (f16 + 4.0 * 64 * (4096 + 4096)) / (1008e9 * 0.8);
    want = fmax(tc, tm) + 0.5 * fmin(tc, tm) + over;
    ck_assert_double_eq_tol(gpu_mm(&p, QI_TYPE_F16, 64), want, want * 1e-9);
    /* a board with power to spare holds its clock: the share is never above 1 */
    ck_assert_int_eq(qi_sim_params_set(&p, "gpu_power_ref", 1, &e), QI_OK);
    tc = F1 / (82.6e12 * 0.25);
    tm = by1 / (1008e9 * 0.8);
    want = fmax(tc, tm) + 0.5 * fmin(tc, tm) + 4000 / 2520e6;
    ck_assert_double_eq_tol(gpu_mm(&p, QI_TYPE_Q4_0, 1), want, want * 1e-9);
    /* out of their physical ranges: refused */
    ck_assert_int_eq(qi_sim_params_set(&p, "gpu_matvec_compute", 1.5, &e), QI_ERR_INVALID);
    ck_assert_int_eq(qi_sim_params_set(&p, "gpu_gemm_simt", 2, &e), QI_ERR_INVALID);
    ck_assert_int_eq(qi_sim_params_set(&p, "gpu_matmul_compute_f16", 1.2, &e), QI_ERR_INVALID);
    ck_assert_int_eq(qi_sim_params_set(&p, "gpu_power_exp", 3, &e), QI_ERR_INVALID);
}
END_TEST

START_TEST(test_shipped_cal) {
    qi_sim_params p;
    qi_sim_params_default(&p);
    qi_err e = {0};
    ck_assert_msg(qi_sim_params_load(PROFILES "/gpu-published.cal", &p, &e) == QI_OK, "%s", e.msg);
    /* fitted, and physical: every efficiency and share at most 1 */
    ck_assert(p.gpu_matvec_compute > 0 && p.gpu_matvec_compute <= 1);
    ck_assert(p.gpu_op_cycles > 0);
    ck_assert(p.gpu_gemm_simt > 0 && p.gpu_gemm_simt <= 1);
    ck_assert(p.gpu_matmul_overlap >= 0 && p.gpu_matmul_overlap <= 1);
    for (int k = 0; k < QI_SIM_OP_CLASSES; k++) ck_assert(p.compute[1][k] <= 1 && p.memory[1][k] <= 1);
    for (int t = 0; t < QI_TYPE_COUNT; t++) ck_assert(p.gpu_matmul_type[t] <= 1);
    /* its validated error, for the figures it makes */
    char v[512];
    ck_assert(qi_sim_cal_validated(PROFILES "/gpu-published.cal", v, sizeof v));
    ck_assert_msg(strstr(v, "against 15 published GPU figures") && strstr(v, "leave-one-GPU-out"), "%s", v);
    ck_assert(!qi_sim_cal_validated(PROFILES "/none.cal", v, sizeof v) && !v[0]);
    /* with every shipped GPU profile: a matmul takes a finite, positive time */
    DIR *d = opendir(PROFILES);
    ck_assert_ptr_nonnull(d);
    struct dirent *de;
    int n_gpu = 0;
    while ((de = readdir(d))) {
        const size_t len = strlen(de->d_name);
        if (len < 9 || strcmp(de->d_name + len - 8, ".profile") != 0) continue;
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", PROFILES, de->d_name);
        qi_hwprofile prof;
        ck_assert_msg(qi_hwprofile_load(path, &prof, &e) == QI_OK, "%s", e.msg);
        if (!prof.has_gpu) continue;
        n_gpu++;
        qi_sim *s = NULL;
        qi_backend *g = NULL;
        ck_assert_int_eq(qi_sim_create(&prof, &p, &s, &e), QI_OK);
        ck_assert_int_eq(qi_backend_sim_create(s, true, 0, &g, &e), QI_OK);
        static const uint8_t dummy[64];
        qi_weight w = {.type = QI_TYPE_Q4_0, .n_rows = 4096, .n_cols = 4096, .row_bytes = 4096 / 32 * 18, .data = dummy};
        static float x[8 * 4096], y[8 * 4096];
        for (int T = 1; T <= 8; T += 7) {
            const double t0 = qi_sim_now(s);
            const qi_weight *ws[1] = {&w};
            float *ys[1] = {y};
            ck_assert_int_eq(qi_backend_matmul_n(g, ws, ys, 1, x, T, &e), QI_OK);
            ck_assert_int_eq(qi_dev_synchronize(g, &e), QI_OK);
            const double dt = qi_sim_now(s) - t0;
            ck_assert_msg(dt > 1e-7 && dt < 1e-2, "%s: T=%d: %g s", de->d_name, T, dt);
        }
        qi_backend_free(g);
        qi_sim_free(s);
    }
    closedir(d);
    ck_assert_int_ge(n_gpu, 25);
}
END_TEST

static Suite *pub_suite(void) {
    Suite *s = suite_create("sim_published");
    TCase *tc = tcase_create("sim_published");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_table);
    tcase_add_test(tc, test_fit_recovers);
    tcase_add_test(tc, test_gpu_kernel_model);
    tcase_add_test(tc, test_shipped_cal);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return qi_test_run_suite(pub_suite()); }

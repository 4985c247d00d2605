/* cmd_calibrate.c - `qinfer calibrate`: measure step times on the machine
 * at hand with the real engine, fit the simulator's parameters so that
 * the simulated engine (the host's hardware profile, the same models and
 * workloads) predicts them, check the fit on workloads it did not see,
 * and write the parameters as a calibration file (--sim-cal).
 *
 * Workload points are (model, batch B, context C) over a grid of batches
 * and contexts (B x C at most --max-tokens, so the prompts stay
 * affordable); each gives two times (qinfer/calibrate.h): the prefill of
 * B prompts of C tokens and one decode step at context C. The split is
 * fixed, a checkerboard on the grid: a point whose batch index plus
 * context index is even is fitted, an odd one held out, so every held-out
 * point lies between fitted ones in both directions.
 *
 * Measurement: every point once per round, in an order that alternates
 * small and large ones, rounds repeated (-r). Within a run a decode time
 * is the median of n steps. Across runs (--stat): by default the least,
 * and a prefill's time the sum over its steps of each step's least time
 * over the runs. The machine is shared, and another process's work only
 * ever adds time, in bursts that can double a run's; the least of a few
 * runs is the machine's own time, where a median of three is only while
 * two of them were spared. --stat median takes the median instead.
 *
 * The devices and placement are passed to both engines alike, so a GPU
 * plan is measured and fitted the same way (--fit names its keys); the
 * default keys are the CPU's. Results go to stdout; progress to stderr.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "cli.h"
#include "qinfer/calibrate.h"
#include "qinfer/hwprofile.h"
#include "qinfer/model_files.h"
#include "threadpool.h"

#include "calib_int.h"

static const char *const k_default_keys =
    "cpu_matmul_compute,cpu_matmul_memory,cpu_attention_compute,cpu_attention_memory,cpu_other_compute,"
    "cpu_other_memory,cpu_op_s";
/* the CPU's machine model (sim/sim_cpu.c), the default where the profile
 * gives the last-level cache and its read rate */
static const char *const k_machine_keys =
    "cpu_dram_memory,cpu_llc_memory,cpu_llc_share,cpu_matmul_compute,cpu_matmul_tiled,cpu_tile_unpack,cpu_unpack,"
    "cpu_matmul_overlap,cpu_op_s,"
    "cpu_attention_compute,cpu_attention_memory,cpu_other_memory";

/* The physical range a fitted key moves in, and its start: a share of a
 * measured rate or of the cache at most 1 (DRAM's at least 0.1: on a
 * shared machine the other tenants take their part of the memory bus); the int8 dot products up to 4x
 * the fp32 FMA rate the profile measured (VNNI's four multiply-adds per
 * lane where an FMA does one); a format's unpacking up to 4 multiply-adds
 * a unit; the tiled path's tile products up to 32x the FMA rate (an
 * AMX tile multiply does 1024 int8 multiply-adds a cycle where the FMA
 * units do 32 fp32 ones), from 8x (the epilogue's share taken back),
 * its rearranging of a weight into the tile layout half a multiply-add
 * (a vector shuffle's lane) to 64 (a byte at a time, split into digits,
 * stored and loaded back); the overlap from 0.8 (a
 * streaming dot product's loads run ahead of its arithmetic); a fixed
 * cost per op of a thread pool's wake and join, 0.2 to 50
 * us; the attention's and element-wise ops' bytes from the caches up to 4x
 * DRAM's rate. The class efficiencies of the older model keep their wide
 * range (up to QI_SIM_EFF_MAX: caches absorbed into them). */
static void key_range(const char *k, const qi_sim_params *def, bool machine, double *v, double *lo, double *hi) {
    static const struct { const char *key; double v, lo, hi; } mk[] = {
        {"cpu_dram_memory", 0.8, 0.1, 1},      {"cpu_llc_memory", 0.5, 0.05, 1},
        {"cpu_matmul_tiled", 8, 0.05, 32},     {"cpu_tile_unpack", 4, 0.5, 64},
        {"cpu_llc_share", 0.5, 0.01, 1},       {"cpu_matmul_compute", 0.5, 0.05, 4},
        {"cpu_unpack", 0.5, 0.01, 4},          {"cpu_matmul_overlap", 0.8, 0.01, 1},
        {"cpu_op_s", 4e-6, 2e-7, 5e-5},        {"cpu_attention_compute", 0.3, 0.02, 1},
        {"cpu_attention_memory", 0.5, 0.05, 4}, {"cpu_other_memory", 0.5, 0.05, 4},
    };
    for (size_t i = 0; machine && i < sizeof mk / sizeof mk[0]; i++)
        if (!strcmp(k, mk[i].key)) {
            *v = mk[i].v, *lo = mk[i].lo, *hi = mk[i].hi;
            return;
        }
    if (!strcmp(k, "cpu_op_s")) {
        *v = def->cpu_op_s, *lo = 1e-8, *hi = 1e-2;
    } else if (!strcmp(k, "link")) {
        *v = def->link, *lo = 1e-3, *hi = 1;
    } else if (!strncmp(k, "cpu_matmul_compute_", 19)) {
        *v = def->compute[0][0], *lo = 1e-3, *hi = QI_SIM_EFF_MAX;
    } else {
        const bool gpu = k[0] == 'g', mem = strstr(k, "_memory") != NULL;
        const int cls = strstr(k, "_matmul_") ? 0 : strstr(k, "_attention_") ? 1 : 2;
        *v = (mem ? def->memory : def->compute)[gpu][cls];
        *lo = 1e-3, *hi = QI_SIM_EFF_MAX;
        if (!strcmp(k, "cpu_dram_memory") || !strcmp(k, "cpu_llc_memory") || !strcmp(k, "cpu_llc_share") ||
            !strcmp(k, "cpu_matmul_overlap"))
            *v = 0.5, *hi = 1;
        else if (!strcmp(k, "cpu_unpack"))
            *v = 0.5, *hi = 4;
    }
}

static void help(void) {
    printf(
        "usage: qinfer calibrate --sim PROFILE [-m MODELS] [-o FILE] [options]\n\n"
        "Measure prefill and decode step times with the real engine on this machine, fit the\n"
        "simulator's parameters so that the simulated engine on PROFILE (this machine's hardware\n"
        "profile, qinfer sysinfo --profile-out) predicts them, and check the fit on held-out\n"
        "workloads: a table of every point (measured, predicted, error) and the fit and\n"
        "held-out mean absolute percentage errors. Points: every batch B and context C of the\n"
        "lists with B x C <= --max-tokens; prefill = B prompts of C tokens, all their steps;\n"
        "decode = one step of B sequences at context C. Fitted: points whose batch index plus\n"
        "context index is even; held out: the others.\n\n"
        "      --sim PROFILE     this machine's hardware profile (required)\n"
        "  -m, --model LIST      models, GGUF paths or cached short names, comma-separated\n"
        "                        (default smollm2-135m,gemma3-270m)\n"
        "  -o, --output FILE     write the fitted parameters as a calibration file (--sim-cal)\n"
        "  -b, --batch LIST      batches (default 1,2,4,8,16)\n"
        "  -c, --ctx LIST        contexts (default 64,128,256,512,1024,2048)\n"
        "      --max-tokens N    largest B x C measured (default 2048)\n"
        "  -r, --reps N          rounds of measurement (default 3)\n"
        "      --stat S          min (default): the least time over the rounds, a prefill's step\n"
        "                        by step (another process's work only adds time); or median\n"
        "  -n, --decode N        decode steps timed per run, the median kept (default 5)\n"
        "  -t, --threads N       worker threads (default: physical cores)\n"
        "      --fit KEYS        the parameters fitted, comma-separated (default, where PROFILE\n"
        "                        gives cpu.llc and cpu.llc_bw, the CPU's machine model:\n"
        "                        %s;\n"
        "                        else the class efficiencies: %s)\n"
        "      --max-evals N     simulated predictions the fit may make (default 1500)\n"
        "      --quick           a small run for tests: -b 1,2 -c 64,128 -r 1 -n 3\n"
        "      --synth DIR       calibrate over shapes: the cached real models and synthetic ones\n"
        "                        (about 100M to 1.1B parameters, q4_K, q6_K, q8_0 beside the real\n"
        "                        models' types), written into DIR once; -b 1,4,16 -c 64,256,1024\n"
        "                        --max-tokens 1024 --max-work 0.3: about 10 minutes on 2 cores\n"
        "      --full            with --synth: up to 7B parameters, q4_0, q4_K, q6_K, q8_0, f16 and\n"
        "                        Qwen2.5-Coder-1.5B; -b 1,4,16,64 -c 64,256,1024,4096 --max-tokens\n"
        "                        4096 --max-work 2 (about an hour; 12 GB in DIR)\n"
        "      --max-work W      leave out points whose B x C x parameters exceed W x 1e12\n"
        "      --loo             also leave out each shape and each weight type in turn, fit the\n"
        "                        rest and predict it: MAPE of prefill, decode and batched decode\n"
        "      --times-out FILE  also write the measured times (model B C prefill_s decode_s runs)\n"
        "      --times-in FILE   fit to those instead of measuring (the same models and grid)\n"
        "      --max-others PCT  leave out of the fit and the check the points whose quietest run\n"
        "                        had other processes above PCT%% of the CPUs (default 100: none)\n"
        "      --devices LIST    devices, for both engines (default cpu)\n"
        "      --placement P     placement, for both engines (default all-cpu)\n"
        "      --published FILE  fit the GPU parameters to published measurements instead\n"
        "                        (qinfer calibrate --published FILE --help)\n"
        "  -h, --help            this help\n"
        "The column others %% is the share of the CPUs other processes used during a point's\n"
        "quietest run (/proc/stat): the measurement is this machine's own only near 0.\n",
        k_machine_keys, k_default_keys);
}

/* "1,2,4" into out (each in lo..hi), at most cap; false with a message. */
static bool int_list(const char *cmd, const char *flag, const char *s, int lo, int hi, int *out, int cap, int *n) {
    *n = 0;
    const char *p = s;
    while (*p) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || (*end && *end != ',') || v < lo || v > hi || *n == cap) {
            qi_cli_error(cmd, "option %s: '%s' is not a list of at most %d integers in %d..%d", flag, s, cap, lo, hi);
            return false;
        }
        out[(*n)++] = (int)v;
        p = *end ? end + 1 : end;
        if (*end && !*p) {
            qi_cli_error(cmd, "option %s: '%s' ends with a comma", flag, s);
            return false;
        }
    }
    if (*n == 0) qi_cli_error(cmd, "option %s: an empty list", flag);
    return *n > 0;
}

/* The median of v (sorted in place). */
static double median(double *v, int n) {
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && v[j] < v[j - 1]; j--) {
            const double t = v[j];
            v[j] = v[j - 1];
            v[j - 1] = t;
        }
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* The CPUs' busy and total time (all of them, /proc/stat) and this
 * process's (/proc/self/stat), in clock ticks; false where unreadable. */
static bool cpu_sample(double *busy, double *total, double *self) {
    FILE *f = fopen("/proc/stat", "r");
    if (!f) return false;
    unsigned long long v[8] = {0};
    const int n = fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5],
                         &v[6], &v[7]);
    fclose(f);
    if (n < 4) return false;
    *total = 0;
    for (int i = 0; i < 8; i++) *total += (double)v[i];
    *busy = *total - (double)v[3] - (double)v[4]; /* less idle and iowait */
    f = fopen("/proc/self/stat", "r");
    if (!f) return false;
    char buf[1024];
    const size_t len = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[len] = 0;
    const char *p = strrchr(buf, ')'); /* the command name may hold spaces */
    unsigned long long ut, st;
    if (!p || sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2) return false;
    *self = (double)(ut + st);
    return true;
}

/* The point's measured times from its runs: the least or the median. */
static void estimate(point *p, bool use_min) {
    if (!use_min) {
        p->meas[0] = median(p->pp, p->n_runs);
        p->meas[1] = median(p->dc, p->n_runs);
        return;
    }
    p->meas[0] = p->pp[0];
    p->meas[1] = p->dc[0];
    for (int r = 1; r < p->n_runs; r++) {
        if (p->pp[r] < p->meas[0]) p->meas[0] = p->pp[r];
        if (p->dc[r] < p->meas[1]) p->meas[1] = p->dc[r];
    }
    if (p->n_steps > 0) {
        /* step by step: each step's least time over the runs */
        double sum = 0;
        for (int k = 0; k < p->n_steps; k++) {
            double m = p->step[k];
            for (int r = 1; r < p->n_runs; r++)
                if (p->step[r * QI_CALIB_MAX_STEPS + k] < m) m = p->step[r * QI_CALIB_MAX_STEPS + k];
            sum += m;
        }
        p->meas[0] = sum;
    }
}

/* The simulated times at the given parameters, for the fitted points (or
 * all), two a point, in pred (NULL: into each point's slot). */
qi_status calib_predict(void *vctx, const char *const *keys, const double *values, int n_keys, double *pred,
                         qi_err *err) {
    cal_ctx *c = vctx;
    qi_params sp;
    qi_status st = qi_calib_params(&sp, keys, values, n_keys, err);
    if (st) return st;
    qi_engine_opts o = *c->base;
    o.sim = c->sim;
    o.sim_params = &sp;
    o.sim_cal = NULL;
    int k = 0;
    for (int i = 0; i < c->n_pts; i++) {
        point *p = &c->pts[i];
        if (c->fit_only && !p->in_fit) continue;
        qi_calib_time t;
        /* one simulated decode step: they are deterministic (calibrate sets
         * no noise), and the median of n_decode measured ones is the step at
         * context C + n_decode / 2, a few slots of attention more (well
         * under 1% of a step at C >= 64), where one step costs the fit's
         * evaluations a fraction of their time */
        st = qi_calib_measure(c->m[p->model], &o, p->batch, p->ctx, 1, &t, err);
        if (st) return st;
        if (pred) {
            pred[k++] = t.prefill_s;
            pred[k++] = t.decode_s;
        } else {
            double *slot = c->pass == 2 ? p->tmp : c->pass ? p->def : p->pred;
            slot[0] = t.prefill_s;
            slot[1] = t.decode_s;
        }
    }
    return QI_OK;
}

/* MAPE over the points of one set (fit or held out), prefill and decode,
 * of the predictions in slot 0 (fitted) or 1 (defaults). */
static double set_mape(const cal_ctx *c, bool fit, int slot, double max_others, int *n_out) {
    double s = 0;
    int n = 0;
    for (int i = 0; i < c->n_pts; i++) {
        const point *p = &c->pts[i];
        if (p->fit != fit || p->excluded || p->others > max_others) continue;
        for (int k = 0; k < 2; k++) {
            const double pr = slot ? p->def[k] : p->pred[k];
            s += fabs(pr - p->meas[k]) / p->meas[k];
            n++;
        }
    }
    if (n_out) *n_out = n;
    return n ? s / n : 0;
}

/* --times-in: the points are the file's lines of the models named (the
 * lists -b, -c and --max-tokens do not apply), cap of them at most; each
 * model's split a checkerboard on the ranks of its own batches and
 * contexts. Several runs' files may be concatenated. */
static int rank_of(const int *v, int n, int x) {
    int r = 0;
    for (int i = 0; i < n; i++) r += v[i] < x;
    return r;
}

static qi_status times_points(const char *path, cal_ctx *c, char (*mnames)[256], int n_models, int cap, qi_err *err) {
    FILE *f = fopen(path, "r");
    if (!f) return QI_ERR(err, QI_ERR_IO, "--times-in %s: cannot open", path);
    char line[512], name[256];
    while (fgets(line, sizeof line, f)) {
        int B, C;
        if (line[0] == '#' || sscanf(line, "%255s %d %d", name, &B, &C) != 3 || B < 1 || C < 1) continue;
        for (int mi = 0; mi < n_models && c->n_pts < cap; mi++)
            if (!strcmp(mnames[mi], name))
                c->pts[c->n_pts++] = (point){.model = mi, .batch = B, .ctx = C, .tokens = (long)B * C};
    }
    fclose(f);
    for (int i = 0; i < c->n_pts; i++) {
        int bs[MAX_GRID * MAX_GRID], cs[MAX_GRID * MAX_GRID], nb = 0, nc = 0;
        for (int j = 0; j < c->n_pts; j++) {
            if (c->pts[j].model != c->pts[i].model) continue;
            bool dup = false;
            for (int k = 0; k < nb; k++) dup |= bs[k] == c->pts[j].batch;
            if (!dup && nb < MAX_GRID * MAX_GRID) bs[nb++] = c->pts[j].batch;
            dup = false;
            for (int k = 0; k < nc; k++) dup |= cs[k] == c->pts[j].ctx;
            if (!dup && nc < MAX_GRID * MAX_GRID) cs[nc++] = c->pts[j].ctx;
        }
        c->pts[i].fit = (rank_of(bs, nb, c->pts[i].batch) + rank_of(cs, nc, c->pts[i].ctx)) % 2 == 0;
    }
    return QI_OK;
}

/* --times-in: every point's measured times from an earlier run's
 * --times-out, found by model name, batch and context. */
static qi_status load_times(const char *path, cal_ctx *c, char (*mnames)[256], qi_err *err) {
    FILE *f = fopen(path, "r");
    if (!f) return QI_ERR(err, QI_ERR_IO, "--times-in %s: cannot open", path);
    char line[512], name[256];
    int ln = 0;
    qi_status st = QI_OK;
    while (!st && fgets(line, sizeof line, f)) {
        ln++;
        if (line[0] == '#' || line[0] == '\n') continue;
        int B, C, runs;
        double pp, dc, others = 0;
        const int n = sscanf(line, "%255s %d %d %lf %lf %d %lf", name, &B, &C, &pp, &dc, &runs, &others);
        if (n < 6 || !(pp > 0) || !(dc > 0) || !(others >= 0)) {
            st = QI_ERR(err, QI_ERR_FORMAT, "%s:%d: not `model B C prefill_s decode_s runs [others]`", path, ln);
            break;
        }
        for (int i = 0; i < c->n_pts; i++) {
            point *p = &c->pts[i];
            if (p->batch == B && p->ctx == C && !strcmp(mnames[p->model], name)) {
                p->meas[0] = pp, p->meas[1] = dc, p->n_runs = runs, p->others = others;
            }
        }
    }
    fclose(f);
    for (int i = 0; !st && i < c->n_pts; i++)
        if (!(c->pts[i].meas[0] > 0))
            st = QI_ERR(err, QI_ERR_FORMAT, "%s: no times for %s at batch %d, context %d", path,
                        mnames[c->pts[i].model], c->pts[i].batch, c->pts[i].ctx);
    return st;
}

static const char *model_name(const char *arg) {
    const char *s = strrchr(arg, '/');
    return s ? s + 1 : arg;
}

int qi_cmd_calibrate(int argc, char **argv) {
    const char *cmd = "calibrate", *models_arg = "smollm2-135m,gemma3-270m", *out_path = NULL, *fit_arg = NULL,
               *times_in = NULL, *times_out = NULL;
    int batches[MAX_GRID] = {1, 2, 4, 8, 16}, n_b = 5, ctxs[MAX_GRID] = {64, 128, 256, 512, 1024, 2048}, n_c = 6;
    int max_tokens = 2048, reps = 3, n_decode = 5, n_threads = qi_n_physical_cores(), max_evals = 1000;
    bool use_min = true;
    float max_others_pct = 100;
    const char *synth_dir = NULL;
    float max_work = 0; /* B x C x parameters, in 1e12 (0: no cap) */
    bool full = false, work_given = false, m_given = false;
    bool quick = false, loo = false, b_given = false, c_given = false, r_given = false, n_given = false;
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--published")) return qi_cmd_calibrate_published(argc, argv);
    qi_cli_kv kvo;
    qi_cli_kv_init(&kvo);
    qi_cli_sim_allow(&kvo);
    qi_args a;
    qi_args_init(&a, cmd, argc, argv);
    while (qi_args_next(&a)) {
        if (qi_args_is(&a, "-h", "--help")) { help(); return 0; }
        else if (qi_args_is(&a, "-m", "--model")) models_arg = qi_args_str(&a), m_given = true;
        else if (qi_args_is(&a, "-o", "--output")) out_path = qi_args_str(&a);
        else if (qi_args_is(&a, "-b", "--batch")) {
            const char *s = qi_args_str(&a);
            if (s && !int_list(cmd, "-b", s, 1, 4096, batches, MAX_GRID, &n_b)) a.failed = true;
            b_given = true;
        } else if (qi_args_is(&a, "-c", "--ctx")) {
            const char *s = qi_args_str(&a);
            if (s && !int_list(cmd, "-c", s, 1, 1 << 20, ctxs, MAX_GRID, &n_c)) a.failed = true;
            c_given = true;
        } else if (qi_args_is(&a, NULL, "--max-tokens")) qi_args_int(&a, 1, 1 << 24, &max_tokens);
        else if (qi_args_is(&a, "-r", "--reps")) r_given = qi_args_int(&a, 1, MAX_REPS, &reps);
        else if (qi_args_is(&a, NULL, "--stat")) {
            const char *s = qi_args_str(&a);
            if (s && strcmp(s, "min") && strcmp(s, "median")) {
                qi_cli_error(cmd, "option --stat: '%s' is not min or median", s);
                a.failed = true;
            } else if (s) {
                use_min = !strcmp(s, "min");
            }
        }
        else if (qi_args_is(&a, "-n", "--decode")) n_given = qi_args_int(&a, 1, 1000, &n_decode);
        else if (qi_args_is(&a, "-t", "--threads")) qi_args_int(&a, 1, 1024, &n_threads);
        else if (qi_args_is(&a, NULL, "--fit")) fit_arg = qi_args_str(&a);
        else if (qi_args_is(&a, NULL, "--max-evals")) qi_args_int(&a, 1, 1000000, &max_evals);
        else if (qi_args_is(&a, NULL, "--quick")) quick = true;
        else if (qi_args_is(&a, NULL, "--loo")) loo = true;
        else if (qi_args_is(&a, NULL, "--synth")) synth_dir = qi_args_str(&a);
        else if (qi_args_is(&a, NULL, "--full")) full = true;
        else if (qi_args_is(&a, NULL, "--max-work")) work_given = qi_args_float(&a, 1e-6f, 1e9f, &max_work);
        else if (qi_args_is(&a, NULL, "--times-out")) times_out = qi_args_str(&a);
        else if (qi_args_is(&a, NULL, "--max-others")) qi_args_float(&a, 0, 100, &max_others_pct);
        else if (qi_args_is(&a, NULL, "--times-in")) times_in = qi_args_str(&a);
        else if (qi_args_is(&a, NULL, "--sim-param") || qi_args_is(&a, NULL, "--sim-cal")) {
            qi_cli_error(cmd, "option %s: calibrate fits the simulator's parameters; it starts from the defaults",
                         a.flag);
            a.failed = true;
        } else if (qi_cli_place_flag(&a, &kvo)) continue;
        else qi_args_unknown(&a);
    }
    if (a.failed) return QI_EXIT_USAGE;
    const double max_others = max_others_pct / 100.0;
    if (!kvo.sim) {
        qi_cli_error(cmd, "no profile given: --sim PROFILE names this machine's hardware profile (qinfer sysinfo "
                          "--profile-out writes one; see qinfer calibrate --help)");
        return QI_EXIT_USAGE;
    }
    char synth_list[4096];
    if (full && !synth_dir) {
        qi_cli_error(cmd, "option --full: it chooses the --synth set (--synth DIR --full)");
        return QI_EXIT_USAGE;
    }
    if (synth_dir) {
        /* the calibration over shapes: its models and grid */
        qi_err se = {0};
        if (m_given) {
            qi_cli_error(cmd, "option --synth: it chooses the models; -m names them instead");
            return QI_EXIT_USAGE;
        }
        if (calib_synth_set(synth_dir, full, synth_list, sizeof synth_list, &se)) return qi_cli_fail(cmd, &se);
        models_arg = synth_list;
        static const int fb[] = {1, 4, 16, 64}, fc[] = {64, 256, 1024, 4096};
        if (!b_given) n_b = full ? 4 : 3, memcpy(batches, fb, sizeof fb);
        if (!c_given) n_c = full ? 4 : 3, memcpy(ctxs, fc, sizeof fc);
        if (max_tokens == 2048) max_tokens = full ? 4096 : 1024;
        if (!work_given) max_work = full ? 2.0f : 0.3f;
    }
    if (quick) {
        if (!b_given) batches[0] = 1, batches[1] = 2, n_b = 2;
        if (!c_given) ctxs[0] = 64, ctxs[1] = 128, n_c = 2;
        if (!r_given) reps = 1;
        if (!n_given) n_decode = 3;
    }

    /* the keys fitted, checked against the simulator's names and bounded */
    char keybuf[512];
    const char *keys[MAX_KEYS];
    double vals[MAX_KEYS], lo[MAX_KEYS], hi[MAX_KEYS];
    int n_keys = 0;
    qi_err err = {0};
    qi_hwprofile prof;
    if (qi_hwprofile_load(kvo.sim, &prof, &err)) return qi_cli_fail(cmd, &err);
    const bool machine = prof.cpu_llc.set && prof.cpu_llc_bw.set;
    snprintf(keybuf, sizeof keybuf, "%s", fit_arg ? fit_arg : machine ? k_machine_keys : k_default_keys);
    qi_sim_params def;
    qi_sim_params_default(&def);
    for (char *tok = strtok(keybuf, ","); tok; tok = strtok(NULL, ",")) {
        qi_sim_params probe = def;
        qi_err e = {0};
        if (n_keys == MAX_KEYS || !strcmp(tok, "noise") || !strcmp(tok, "seed") ||
            qi_sim_params_set(&probe, tok, 0.5, &e) != QI_OK) {
            qi_cli_error(cmd, "option --fit: '%s' is not a parameter a fit can move (%s)", tok,
                         n_keys == MAX_KEYS ? "too many" : "the efficiencies, link and cpu_op_s");
            return QI_EXIT_USAGE;
        }
        keys[n_keys] = tok;
        key_range(tok, &def, machine, &vals[n_keys], &lo[n_keys], &hi[n_keys]);
        n_keys++;
    }
    if (!n_keys) {
        qi_cli_error(cmd, "option --fit: no parameters named");
        return QI_EXIT_USAGE;
    }

    int rc = 0;
    cal_ctx c = {0};
    char mnames[MAX_MODELS][256], mlist[4096];
    int n_models = 0;
    snprintf(mlist, sizeof mlist, "%s", models_arg);
    for (char *tok = strtok(mlist, ","); tok; tok = strtok(NULL, ",")) {
        if (n_models == MAX_MODELS) {
            qi_cli_error(cmd, "option -m: at most %d models", MAX_MODELS);
            rc = QI_EXIT_USAGE;
            goto done;
        }
        char path[1024];
        if (qi_cache_resolve(tok, "model", path, sizeof path, &err) || qi_cli_load_model(path, false, &c.m[n_models], &err))
            goto fail;
        snprintf(mnames[n_models], sizeof mnames[0], "%s", model_name(tok));
        n_models++;
    }
    if (!n_models) {
        qi_cli_error(cmd, "option -m: no models named");
        rc = QI_EXIT_USAGE;
        goto done;
    }

    /* the points, models interleaved so that each round alternates them */
    c.pts = qi_calloc((size_t)(n_models * MAX_GRID * MAX_GRID), sizeof *c.pts);
    if (!c.pts) {
        QI_ERR(&err, QI_ERR_NOMEM, "out of memory");
        goto fail;
    }
    if (times_in && times_points(times_in, &c, mnames, n_models, n_models * MAX_GRID * MAX_GRID, &err)) goto fail;
    for (int i = 0; i < n_b && !times_in; i++)
        for (int j = 0; j < n_c; j++)
            for (int mi = 0; mi < n_models; mi++) {
                if ((long)batches[i] * ctxs[j] > max_tokens) continue;
                if (max_work > 0 && (double)batches[i] * ctxs[j] * (double)c.m[mi]->n_params > max_work * 1e12)
                    continue;
                const int nc = c.m[mi]->hp.n_ctx_train;
                if (ctxs[j] + n_decode + 1 > nc) continue;
                c.pts[c.n_pts++] = (point){.model = mi, .batch = batches[i], .ctx = ctxs[j], .fit = (i + j) % 2 == 0,
                                           .tokens = (long)batches[i] * ctxs[j]};
            }
    int n_fit = 0;
    for (int i = 0; i < c.n_pts; i++) n_fit += c.pts[i].fit;
    if (n_fit == 0) {
        QI_ERR(&err, QI_ERR_INVALID, "no workload point to fit (batches x contexts within --max-tokens %d)",
               max_tokens);
        goto fail;
    }
    n_fit = 0; /* counted again once the loaded points are known */

    qi_engine_opts base;
    qi_engine_opts_default(&base);
    qi_cli_kv_apply(&kvo, &base);
    base.sim = NULL;
    base.sim_cal = NULL;
    base.sim_params = NULL;
    base.n_threads = n_threads;
    c.base = &base;
    c.sim = kvo.sim;
    c.n_decode = n_decode;

    /* the order of a round: by size, alternately from the small end and
     * the large one, so that a burst of another process's work falls on a
     * mix of points rather than on one corner of the grid */
    int *order = qi_malloc(sizeof *order * (size_t)c.n_pts);
    if (!order) {
        QI_ERR(&err, QI_ERR_NOMEM, "out of memory");
        goto fail;
    }
    for (int i = 0; i < c.n_pts; i++) {
        order[i] = i;
        for (int j = i; j > 0 && c.pts[order[j]].tokens < c.pts[order[j - 1]].tokens; j--) {
            const int t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
        }
        if (!(c.pts[i].step = qi_malloc(sizeof(double) * MAX_REPS * QI_CALIB_MAX_STEPS))) {
            QI_ERR(&err, QI_ERR_NOMEM, "out of memory");
            qi_free(order);
            goto fail;
        }
    }
    /* measure: a warm-up run per model (weights paged in), then rounds;
     * or the times of an earlier run (--times-in) */
    const double t_start = qi_now_s();
    double others_sum = 0;
    int others_n = 0;
    qi_calib_time t;
    if (times_in) {
        reps = 0;
        if (load_times(times_in, &c, mnames, &err)) {
            qi_free(order);
            goto fail;
        }
    }
    for (int mi = 0; mi < n_models && reps > 0; mi++)
        if (qi_calib_measure(c.m[mi], &base, 1, 64, 2, &t, &err)) {
            qi_free(order);
            goto fail;
        }
    for (int r = 0; r < reps; r++) {
        for (int k = 0; k < c.n_pts; k++) {
            point *p = &c.pts[order[k % 2 ? c.n_pts - 1 - k / 2 : k / 2]];
            double b0 = 0, t0 = 0, s0 = 0, b1 = 0, t1 = 0, s1 = 0;
            const bool sampled = cpu_sample(&b0, &t0, &s0);
            if (qi_calib_measure(c.m[p->model], &base, p->batch, p->ctx, n_decode, &t, &err)) {
                qi_free(order);
                goto fail;
            }
            /* how much of the machine other processes took meanwhile */
            double others = NAN;
            if (sampled && cpu_sample(&b1, &t1, &s1) && t1 > t0) others = fmax(0, (b1 - b0 - (s1 - s0)) / (t1 - t0));
            if (p->n_runs == 0 || !(others >= p->others)) p->others = others;
            others_sum += isnan(others) ? 0 : others, others_n += !isnan(others);
            p->pp[p->n_runs] = t.prefill_s;
            p->dc[p->n_runs] = t.decode_s;
            const bool same = p->n_runs == 0 || t.n_prefill_steps == p->n_steps;
            p->n_steps = same && t.n_prefill_steps <= QI_CALIB_MAX_STEPS ? t.n_prefill_steps : -1;
            if (p->n_steps > 0)
                memcpy(p->step + p->n_runs * QI_CALIB_MAX_STEPS, t.prefill_step_s, sizeof(double) * (size_t)p->n_steps);
            p->n_runs++;
        }
        fprintf(stderr, "qinfer %s: round %d of %d measured (%d points, %.0f s so far)\n", cmd, r + 1, reps, c.n_pts,
                qi_now_s() - t_start);
    }
    double meas[2 * MAX_MODELS * MAX_GRID * MAX_GRID];
    int n_meas = 0;
    for (int i = 0; i < c.n_pts; i++) {
        point *p = &c.pts[i];
        if (!times_in) estimate(p, use_min);
        p->excluded = p->others > max_others;
        p->in_fit = p->fit && !p->excluded;
        n_fit += p->in_fit;
        if (p->fit && !p->excluded && n_meas + 2 <= (int)(sizeof meas / sizeof meas[0])) {
            meas[n_meas++] = p->meas[0];
            meas[n_meas++] = p->meas[1];
        }
    }
    const double t_meas = qi_now_s() - t_start;
    qi_free(order);
    if (n_meas == 0) {
        QI_ERR(&err, QI_ERR_INVALID, "no fitted point was measured with other processes below --max-others %g%%",
               100 * max_others);
        goto fail;
    }
    if (times_out) {
        FILE *f = fopen(times_out, "w");
        if (!f) {
            QI_ERR(&err, QI_ERR_IO, "--times-out %s: cannot write", times_out);
            goto fail;
        }
        fprintf(f, "# qinfer calibrate's measured times (--times-in): model B C prefill_s decode_s runs others\n");
        for (int i = 0; i < c.n_pts; i++)
            fprintf(f, "%s %d %d %.9g %.9g %d %.3f\n", mnames[c.pts[i].model], c.pts[i].batch, c.pts[i].ctx,
                    c.pts[i].meas[0], c.pts[i].meas[1], c.pts[i].n_runs, c.pts[i].others);
        if (fclose(f)) {
            QI_ERR(&err, QI_ERR_IO, "--times-out %s: write failed", times_out);
            goto fail;
        }
    }

    /* the defaults' predictions, then the fit, then the fit's predictions */
    c.pass = 1;
    if (calib_predict(&c, keys, vals, n_keys, NULL, &err)) goto fail;
    c.fit_only = true;
    qi_calib_fit_report rep;
    if (qi_calib_fit(keys, vals, lo, hi, n_keys, meas, n_meas, calib_predict, &c, max_evals, &rep, &err)) goto fail;
    c.fit_only = false;
    c.pass = 0;
    if (calib_predict(&c, keys, vals, n_keys, NULL, &err)) goto fail;

    printf("calibration of the simulated %s against this machine (%d threads): %d points, %d fitted, %d held out\n\n",
           prof.name, n_threads, c.n_pts, n_fit, c.n_pts - n_fit);
    printf("| model | step | B | C | set | measured s | predicted s | error %% | default s | runs | others %% |\n");
    printf("|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|\n");
    for (int i = 0; i < c.n_pts; i++) {
        const point *p = &c.pts[i];
        for (int k = 0; k < 2; k++)
            printf("| %s | %s | %d | %d | %s | %.5f | %.5f | %+.1f | %.5f | %d | %.0f |\n", mnames[p->model],
                   k ? "decode" : "prefill", p->batch, p->ctx,
                   p->excluded ? (p->fit ? "fit, excluded" : "held-out, excluded") : p->fit ? "fit" : "held-out",
                   p->meas[k], p->pred[k],
                   100 * (p->pred[k] - p->meas[k]) / p->meas[k], p->def[k], p->n_runs, 100 * p->others);
    }
    int nf, nh;
    const double fit_mape = set_mape(&c, true, 0, INFINITY, &nf), held_mape = set_mape(&c, false, 0, INFINITY, &nh);
    printf("\nfitted:");
    for (int i = 0; i < n_keys; i++) printf(" %s=%.4g", keys[i], vals[i]);
    printf("\nfit MAPE %.1f%% over %d times; held-out MAPE %.1f%% over %d times", 100 * fit_mape, nf,
           100 * held_mape, nh);
    printf(" (default parameters: fit %.1f%%, held-out %.1f%%)\n", 100 * set_mape(&c, true, 1, INFINITY, NULL),
           100 * set_mape(&c, false, 1, INFINITY, NULL));
    printf("measured in %.0f s, fitted in %.0f s (%d simulated evaluations)\n", t_meas,
           qi_now_s() - t_start - t_meas, rep.evals);
    if (loo && calib_loo(&c, mnames, n_models, keys, vals, lo, hi, n_keys, max_evals / 2, max_others, &err))
        goto fail;
    if (others_n > 0) {
        /* the measurements are this machine's only while it was not shared */
        const double o = others_sum / others_n;
        printf("other processes used %.0f%% of the CPUs during the runs (the column others %%: the least of a "
               "point's runs)%s\n", 100 * o,
               o > 0.1 ? "; measured times include their interference: rerun on a quiet machine" : "");
        int nq;
        const double q = set_mape(&c, false, 0, 0.1, &nq);
        if (nq > 0 && nq < nh) printf("held-out MAPE over the points measured quiet (others < 10%%): %.1f%% over %d times\n",
                                      100 * q, nq);
    }

    if (out_path) {
        FILE *f = fopen(out_path, "w");
        if (!f) {
            QI_ERR(&err, QI_ERR_IO, "-o %s: cannot write", out_path);
            goto fail;
        }
        char date[32];
        const time_t now = time(NULL);
        strftime(date, sizeof date, "%Y-%m-%d", gmtime(&now));
        fprintf(f, "# The simulator's parameters fitted to this machine by qinfer calibrate: load with\n"
                   "# --sim %s --sim-cal FILE (engine/backend/sim/README.md, Calibration).\n"
                   "# models %s; ", kvo.sim, models_arg);
        if (!times_in) {
            fprintf(f, "batches");
            for (int i = 0; i < n_b; i++) fprintf(f, "%s%d", i ? "," : " ", batches[i]);
            fprintf(f, "; contexts");
            for (int j = 0; j < n_c; j++) fprintf(f, "%s%d", j ? "," : " ", ctxs[j]);
            fprintf(f, "; B x C <= %d; ", max_tokens);
        }
        fprintf(f, "%d threads; ", n_threads);
        if (times_in) fprintf(f, "the points and times of %s", times_in);
        else fprintf(f, "%d rounds, the %s", reps, use_min ? "least" : "median");
        if (max_others < 1) fprintf(f, "; points with other processes above %g%% of the CPUs left out", 100 * max_others);
        char mline[512];
        qi_sim_cal_machine_line(&prof, mline, sizeof mline);
        fprintf(f, "\n%s\n", mline);
        fprintf(f, "# validated: held-out MAPE %.1f%% over %d times (measured on this machine, points the fit did "
                   "not see)\n", 100 * held_mape, nh);
        for (int i = 0; i < n_keys; i++)
            fprintf(f, "%s = %.6g  # source: fitted by qinfer calibrate, %s, profile %s, %d configurations, fit "
                       "MAPE %.1f%%\n", keys[i], vals[i], date, prof.name, n_fit, 100 * fit_mape);
        if (fclose(f)) {
            QI_ERR(&err, QI_ERR_IO, "-o %s: write failed", out_path);
            goto fail;
        }
        /* read back through the reader the engine uses */
        qi_sim_params chk = def;
        if (qi_sim_params_load(out_path, &chk, &err)) goto fail;
        fprintf(stderr, "qinfer %s: wrote %s (use: --sim %s --sim-cal %s)\n", cmd, out_path, kvo.sim, out_path);
    }
    goto done;
fail:
    rc = qi_cli_fail(cmd, &err);
done:
    for (int i = 0; i < n_models; i++) qi_model_free(c.m[i]);
    for (int i = 0; c.pts && i < c.n_pts; i++) qi_free(c.pts[i].step);
    qi_free(c.pts);
    return rc;
}

/* cmd_simpub.c - the simulator's GPU side against published measurements:
 * `qinfer calibrate --published FILE` fits the GPU parameters to the
 * published rows marked train and writes a calibration file that applies
 * to every GPU profile; `qinfer sim-validate` simulates every published
 * row it can and prints, and stores, the published figure beside the
 * simulated one (qinfer/sim_published.h; engine/backend/sim/README.md).
 *
 * The models are shapes only (qinfer synth --shapes-only), written once
 * into --shapes DIR. The fit reports its error on the training rows and
 * leave-one-GPU-out: every GPU's rows predicted by a fit without them.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "backend.h"
#include "cli.h"
#include "harness/db.h"
#include "qinfer/calibrate.h"
#include "qinfer/sim_published.h"

#define MAX_KEYS 16
#define MAX_MODELS 16

static const char *const k_keys =
    "gpu_matmul_memory,gpu_matvec_compute,gpu_matmul_compute,gpu_gemm_simt,gpu_op_cycles,gpu_power_ref,"
    "gpu_power_exp,gpu_matmul_overlap";

/* a key's start and physical range: efficiencies and shares at most 1; a
 * kernel's fixed cost 0.1k..50k cycles (0.07..35 us at 1.4 GHz); the power
 * reference 1..100 W per FP32 TFLOP/s (the boards span 3..20) */
static bool key_range(const char *k, double *start, double *lo, double *hi) {
    static const struct {
        const char *k;
        double s, lo, hi;
    } t[] = {
        {"gpu_matmul_memory", 0.8, 0.05, 1},    {"gpu_matvec_compute", 0.3, 0.01, 1},
        {"gpu_matmul_compute", 0.5, 0.01, 1},   {"gpu_gemm_simt", 0.25, 0.001, 1},
        {"gpu_op_cycles", 5000, 100, 50000},    {"gpu_power_ref", 15, 1, 100},
        {"gpu_power_exp", 0.4, 0.01, 2},        {"gpu_matmul_overlap", 0.5, 0.001, 1},
        {"gpu_matmul_compute_f16", 0.5, 0.01, 1}, {"gpu_other_memory", 0.6, 0.05, 1},
        {"gpu_attention_compute", 0.3, 0.01, 1}, {"gpu_attention_memory", 0.6, 0.05, 1},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        if (!strcmp(k, t[i].k)) {
            *start = t[i].s, *lo = t[i].lo, *hi = t[i].hi;
            return true;
        }
    return false;
}

typedef struct {
    const char *profiles_dir, *shapes_dir, *published, *sim_cal, *db_path, *out_path, *fit_arg;
    int max_evals;
    bool no_loo;
    bool offload;               /* --offload: FlexGen's offloaded rows simulated too */
    qi_pub_row *rows;
    int n_rows;
    qi_model *models[MAX_MODELS];
    char model_key[MAX_MODELS][48];
    int n_models;
    const qi_model **row_model; /* per row */
    char (*row_prof)[512];      /* per row: the profile's path */
} ctx;

static void ctx_free(ctx *c) {
    for (int i = 0; i < c->n_models; i++) qi_model_free(c->models[i]);
    qi_free(c->rows);
    qi_free(c->row_model);
    qi_free(c->row_prof);
}

/* The shapes of every simulated row's model, written once (synth); a
 * FlexGen row whose policy offloads left out unless --offload (its block
 * schedule takes minutes to simulate). */
static qi_status load_models(ctx *c, qi_err *err) {
    for (int i = 0; i < c->n_rows && !c->offload; i++)
        if (c->rows[i].ok && c->rows[i].offload) {
            c->rows[i].ok = false;
            snprintf(c->rows[i].why, sizeof c->rows[i].why,
                     "FlexGen's offload, its block schedule, takes minutes to simulate: add --offload");
        }
    mkdir(c->shapes_dir, 0755);
    c->row_model = qi_calloc((size_t)c->n_rows + 1, sizeof *c->row_model);
    c->row_prof = qi_calloc((size_t)c->n_rows + 1, sizeof *c->row_prof);
    if (!c->row_model || !c->row_prof) return QI_ERR(err, QI_ERR_NOMEM, "out of memory");
    for (int i = 0; i < c->n_rows; i++) {
        qi_pub_row *r = &c->rows[i];
        if (!r->ok) continue;
        snprintf(c->row_prof[i], sizeof c->row_prof[i], "%s/%s.profile", c->profiles_dir, r->profile);
        char key[48];
        snprintf(key, sizeof key, "%s-%s", r->preset, r->type);
        int m = -1;
        for (int j = 0; j < c->n_models; j++)
            if (!strcmp(c->model_key[j], key)) m = j;
        if (m < 0) {
            if (c->n_models == MAX_MODELS) return QI_ERR(err, QI_ERR_INVALID, "more than %d models", MAX_MODELS);
            char path[1024];
            snprintf(path, sizeof path, "%s/%s.gguf", c->shapes_dir, key);
            struct stat sb;
            if (stat(path, &sb) != 0) {
                char *av[] = {"synth", "-o", path, "--preset", (char *)r->preset, "--type", (char *)r->type,
                              "--shapes-only", NULL};
                if (qi_cmd_synth(8, av) != 0) return QI_ERR(err, QI_ERR_IO, "cannot write the shapes of %s", key);
            }
            qi_status st = qi_model_load(path, &c->models[c->n_models], err);
            if (st) return st;
            snprintf(c->model_key[c->n_models], sizeof c->model_key[0], "%s", key);
            m = c->n_models++;
        }
        c->row_model[i] = c->models[m];
    }
    return QI_OK;
}

/* A row the fit uses: a FlexGen offloaded row is predicted only (its
 * minutes a simulation times the fit's hundreds). */
static bool trained(const qi_pub_row *r) {
    return r->ok && !strcmp(r->use, "train") && !r->flash_attn && !r->offload;
}
static bool is_tg(const qi_pub_row *r) { return r->kind == QI_PUB_TG; }

/* Fit keys over the rows idx[0..n) (from the starts in vals); pred of
 * every row in all[] (NAN where not simulated) at the fit. */
static qi_status fit_rows(ctx *c, const qi_engine_opts *base, char **keys, double *vals, int n_keys, const int *idx,
                          int n, double *all, qi_calib_fit_report *rep, qi_err *err) {
    const qi_pub_row *rows[256];
    const qi_model *models[256];
    const char *profs[256];
    double meas[256], lo[MAX_KEYS], hi[MAX_KEYS], s;
    if (n > 256) return QI_ERR(err, QI_ERR_INVALID, "more than 256 training rows");
    for (int i = 0; i < n; i++) {
        rows[i] = &c->rows[idx[i]];
        models[i] = c->row_model[idx[i]];
        profs[i] = c->row_prof[idx[i]];
        meas[i] = 1 / rows[i]->value;
    }
    for (int k = 0; k < n_keys; k++) key_range(keys[k], &s, &lo[k], &hi[k]);
    qi_pub_set set = {rows, n, models, profs, base};
    qi_status st = qi_calib_fit((const char *const *)keys, vals, lo, hi, n_keys, meas, n, qi_pub_predict, &set,
                                c->max_evals, rep, err);
    if (st || !all) return st;
    /* every simulated row at the fit */
    for (int i = 0; i < c->n_rows; i++) {
        all[i] = NAN;
        if (!c->rows[i].ok) continue;
        const qi_pub_row *one[1] = {&c->rows[i]};
        const qi_model *om[1] = {c->row_model[i]};
        const char *op[1] = {c->row_prof[i]};
        qi_pub_set s1 = {one, 1, om, op, base};
        double t;
        if ((st = qi_pub_predict(&s1, (const char *const *)keys, vals, n_keys, &t, err))) return st;
        all[i] = 1 / t;
    }
    return QI_OK;
}

static double median_abs(const double *e, int n) {
    double v[256];
    int k = 0;
    for (int i = 0; i < n && k < 256; i++)
        if (!isnan(e[i])) v[k++] = fabs(e[i]);
    for (int i = 1; i < k; i++)
        for (int j = i; j > 0 && v[j] < v[j - 1]; j--) {
            const double t = v[j];
            v[j] = v[j - 1];
            v[j - 1] = t;
        }
    return k == 0 ? NAN : k % 2 ? v[k / 2] : 0.5 * (v[k / 2 - 1] + v[k / 2]);
}

/* Median |error| of the training rows of one class (tg: decode rows; else prompt and generation rows). */
static double class_median(const ctx *c, const double *sim, bool tg) {
    double e[256];
    int k = 0;
    for (int i = 0; i < c->n_rows && k < 256; i++)
        if (trained(&c->rows[i]) && is_tg(&c->rows[i]) == tg && !isnan(sim[i]))
            e[k++] = sim[i] / c->rows[i].value - 1;
    return median_abs(e, k);
}

static void common_help(void) {
    printf("      --published FILE  the published rows (tab-separated: use system model weights hardware test\n"
           "                        value unit settings source; engine/backend/sim/README.md)\n"
           "      --profiles DIR    the hardware profiles (default engine/backend/sim/profiles)\n"
           "      --shapes DIR      where the models' shapes are written once (default /tmp/qinfer-shapes)\n"
           "      --offload         simulate FlexGen's offloaded rows too (OPT-30B on the T4: its zig-zag block\n"
           "                        schedule, about 3 minutes); predicted, never fitted\n");
}

static bool common_flag(qi_args *a, ctx *c) {
    if (qi_args_is(a, NULL, "--published")) c->published = qi_args_str(a);
    else if (qi_args_is(a, NULL, "--profiles")) c->profiles_dir = qi_args_str(a);
    else if (qi_args_is(a, NULL, "--shapes")) c->shapes_dir = qi_args_str(a);
    else if (qi_args_is(a, NULL, "--offload")) c->offload = true;
    else return false;
    return true;
}

static void ctx_init(ctx *c) {
    memset(c, 0, sizeof *c);
    c->profiles_dir = "engine/backend/sim/profiles";
    c->shapes_dir = "/tmp/qinfer-shapes";
    c->max_evals = 400;
}

static void print_row_head(void) {
    printf("| line | hardware | model | test | published | simulated | error |");
}

/* ---- qinfer calibrate --published ------------------------------------------------------ */

int qi_cmd_calibrate_published(int argc, char **argv) {
    const char *cmd = "calibrate";
    ctx c;
    ctx_init(&c);
    qi_args a;
    qi_args_init(&a, cmd, argc, argv);
    while (qi_args_next(&a)) {
        if (qi_args_is(&a, "-h", "--help")) {
            printf("usage: qinfer calibrate --published FILE [-o FILE] [options]\n\n"
                   "Fit the simulator's GPU parameters to the published rows marked train (flash-attention\n"
                   "rows left out: not modelled), each simulated on its GPU's profile with its model's shapes,\n"
                   "and check them leave-one-GPU-out. Writes a calibration file for --sim-cal that applies\n"
                   "to every GPU profile.\n\n");
            common_help();
            printf("  -o, --output FILE     the calibration file\n"
                   "      --fit KEYS        the parameters fitted (default %s,\n"
                   "                        and gpu_matmul_compute_f16 when an f16 row trains)\n"
                   "      --max-evals N     simulated predictions per fit (default 400)\n"
                   "      --no-loo          skip leave-one-GPU-out\n",
                   k_keys);
            return 0;
        } else if (common_flag(&a, &c)) {
        } else if (qi_args_is(&a, "-o", "--output")) c.out_path = qi_args_str(&a);
        else if (qi_args_is(&a, NULL, "--fit")) c.fit_arg = qi_args_str(&a);
        else if (qi_args_is(&a, NULL, "--max-evals")) qi_args_int(&a, 1, 1000000, &c.max_evals);
        else if (qi_args_is(&a, NULL, "--no-loo")) c.no_loo = true;
        else qi_args_unknown(&a);
    }
    if (a.failed) return QI_EXIT_USAGE;
    if (!c.published) {
        qi_cli_error(cmd, "--published FILE is required");
        return QI_EXIT_USAGE;
    }
    qi_err err = {0};
    int rc = 0;
    double *sim = NULL, *loo = NULL;
    int *idx = NULL;
    char keybuf[1024], *keys[MAX_KEYS];
    double vals[MAX_KEYS], start[MAX_KEYS];
    int n_keys = 0;
    qi_engine_opts base;
    qi_engine_opts_default(&base);
    base.n_threads = 1;
    if (qi_pub_load(c.published, &c.rows, &c.n_rows, &err) || load_models(&c, &err)) goto fail;
    sim = qi_calloc((size_t)c.n_rows + 1, sizeof *sim);
    loo = qi_calloc((size_t)c.n_rows + 1, sizeof *loo);
    idx = qi_calloc((size_t)c.n_rows + 1, sizeof *idx);
    if (!sim || !loo || !idx) {
        QI_ERR(&err, QI_ERR_NOMEM, "out of memory");
        goto fail;
    }
    int n_train = 0;
    bool f16 = false;
    for (int i = 0; i < c.n_rows; i++)
        if (trained(&c.rows[i])) {
            idx[n_train++] = i;
            f16 |= !strcmp(c.rows[i].type, "f16");
        }
    if (n_train == 0) {
        QI_ERR(&err, QI_ERR_INVALID, "%s: no simulated rows marked train", c.published);
        goto fail;
    }
    snprintf(keybuf, sizeof keybuf, "%s%s", c.fit_arg ? c.fit_arg : k_keys,
             !c.fit_arg && f16 ? ",gpu_matmul_compute_f16" : "");
    for (char *p = strtok(keybuf, ","); p; p = strtok(NULL, ",")) {
        double lo, hi;
        if (n_keys == MAX_KEYS || !key_range(p, &start[n_keys], &lo, &hi)) {
            qi_cli_error(cmd, "--fit: '%s' is not a GPU parameter this fit knows (or more than %d)", p, MAX_KEYS);
            rc = QI_EXIT_USAGE;
            goto done;
        }
        keys[n_keys++] = p;
    }
    fprintf(stderr, "qinfer %s: fitting %d parameters to %d published rows\n", cmd, n_keys, n_train);
    memcpy(vals, start, sizeof vals);
    qi_calib_fit_report rep;
    if (fit_rows(&c, &base, keys, vals, n_keys, idx, n_train, sim, &rep, &err)) goto fail;
    for (int i = 0; i < c.n_rows; i++) loo[i] = NAN;
    if (!c.no_loo) {
        /* every GPU (profile) of the training rows left out in turn */
        for (int g = 0; g < c.n_rows; g++) {
            if (!trained(&c.rows[g])) continue;
            bool first = true;
            for (int j = 0; j < g; j++)
                if (trained(&c.rows[j]) && !strcmp(c.rows[j].profile, c.rows[g].profile)) first = false;
            if (!first) continue;
            int n = 0, sub[256];
            for (int i = 0; i < n_train && n < 256; i++)
                if (strcmp(c.rows[idx[i]].profile, c.rows[g].profile)) sub[n++] = idx[i];
            double v[MAX_KEYS], *all = qi_calloc((size_t)c.n_rows, sizeof *all);
            if (!all) {
                QI_ERR(&err, QI_ERR_NOMEM, "out of memory");
                goto fail;
            }
            memcpy(v, start, sizeof v);
            qi_calib_fit_report r2;
            fprintf(stderr, "qinfer %s: leaving out %s (%d rows fitted)\n", cmd, c.rows[g].profile, n);
            if (fit_rows(&c, &base, keys, v, n_keys, sub, n, all, &r2, &err)) {
                qi_free(all);
                goto fail;
            }
            for (int i = 0; i < c.n_rows; i++)
                if (c.rows[i].ok && !strcmp(c.rows[i].profile, c.rows[g].profile)) loo[i] = all[i];
            qi_free(all);
        }
    }
    /* the table */
    print_row_head();
    printf(" leave-one-GPU-out | error |\n|---:|---|---|---|---:|---:|---:|---:|---:|\n");
    for (int i = 0; i < c.n_rows; i++) {
        const qi_pub_row *r = &c.rows[i];
        if (!r->ok) continue;
        printf("| %d%s | %s | %s %s | %s | %.2f | %.2f | %+.1f%% |", r->line, trained(r) ? "" : " (not fitted)",
               r->profile, r->model, r->weights, r->test, r->value, sim[i], 100 * (sim[i] / r->value - 1));
        if (!isnan(loo[i]) && trained(r)) printf(" %.2f | %+.1f%% |\n", loo[i], 100 * (loo[i] / r->value - 1));
        else printf(" | |\n");
    }
    const double tg_fit = class_median(&c, sim, true), pp_fit = class_median(&c, sim, false);
    const double tg_loo = class_median(&c, loo, true), pp_loo = class_median(&c, loo, false);
    printf("\nmedian |error| on the %d training rows: decode %.1f%%, prompt and generation %.1f%%\n", n_train,
           100 * tg_fit, 100 * pp_fit);
    if (!c.no_loo)
        printf("leave-one-GPU-out: decode %.1f%%, prompt and generation %.1f%%\n", 100 * tg_loo, 100 * pp_loo);
    printf("fit: %d predictions, rms log error %.3f\n\n| parameter | fitted | range |\n|---|---:|---|\n", rep.evals,
           rep.rms_log);
    for (int k = 0; k < n_keys; k++) {
        double s = 0, lo = 0, hi = 0;
        key_range(keys[k], &s, &lo, &hi);
        printf("| %s | %.4g | %g..%g |\n", keys[k], vals[k], lo, hi);
    }
    if (c.out_path) {
        FILE *f = fopen(c.out_path, "w");
        if (!f) {
            QI_ERR(&err, QI_ERR_IO, "-o %s: cannot write", c.out_path);
            goto fail;
        }
        char date[32];
        const time_t now = time(NULL);
        strftime(date, sizeof date, "%Y-%m-%d", gmtime(&now));
        fprintf(f, "# The simulator's GPU parameters fitted to published measurements by qinfer calibrate\n"
                   "# --published %s: load with --sim PROFILE --sim-cal FILE for any GPU profile\n"
                   "# (engine/backend/sim/README.md, \"The GPU's cost model\"). %d training rows (flash-attention\n"
                   "# rows left out); median |error| decode %.1f%%, prompt %.1f%%; leave-one-GPU-out decode %.1f%%,\n"
                   "# prompt %.1f%%. Attention and element-wise efficiencies keep their defaults: the rows do\n"
                   "# not determine them (attention is about 1%% of a 512-token prompt's FLOPs).\n",
                c.published, n_train, 100 * tg_fit, 100 * pp_fit, 100 * tg_loo, 100 * pp_loo);
        fprintf(f, "# validated: against %d published GPU figures (%s), median |error| decode %.1f%%, prompt %.1f%%; "
                   "leave-one-GPU-out decode %.1f%%, prompt %.1f%%\n",
                n_train, c.published, 100 * tg_fit, 100 * pp_fit, 100 * tg_loo, 100 * pp_loo);
        for (int k = 0; k < n_keys; k++)
            fprintf(f, "%s = %.6g  # source: fitted by qinfer calibrate --published, %s, %d rows, median |error| "
                       "decode %.1f%% prompt %.1f%%, leave-one-GPU-out %.1f%% %.1f%%\n",
                    keys[k], vals[k], date, n_train, 100 * tg_fit, 100 * pp_fit, 100 * tg_loo, 100 * pp_loo);
        if (fclose(f)) {
            QI_ERR(&err, QI_ERR_IO, "-o %s: write failed", c.out_path);
            goto fail;
        }
        qi_sim_params chk;
        qi_sim_params_default(&chk);
        if (qi_sim_params_load(c.out_path, &chk, &err)) goto fail;
        fprintf(stderr, "qinfer %s: wrote %s (use: --sim PROFILE --sim-cal %s)\n", cmd, c.out_path, c.out_path);
    }
    goto done;
fail:
    rc = qi_cli_fail(cmd, &err);
done:
    qi_free(sim);
    qi_free(loo);
    qi_free(idx);
    ctx_free(&c);
    return rc;
}

/* ---- qinfer sim-validate ---------------------------------------------------------------- */

int qi_cmd_sim_validate(int argc, char **argv) {
    const char *cmd = "sim-validate";
    ctx c;
    ctx_init(&c);
    qi_args a;
    qi_args_init(&a, cmd, argc, argv);
    while (qi_args_next(&a)) {
        if (qi_args_is(&a, "-h", "--help")) {
            printf("usage: qinfer sim-validate --published FILE [--sim-cal FILE] [--db FILE] [options]\n\n"
                   "Simulate every published row it knows (not the input and target rows) on its GPU's\n"
                   "profile and print the published figure, the SIMULATED one and the error; rows it cannot\n"
                   "simulate are listed with the reason. --db stores each row as a run of the experiment\n"
                   "sim-validate: the published figure as measured, the simulated one marked simulated.\n\n");
            common_help();
            printf("      --sim-cal FILE    the calibration (engine/backend/sim/profiles/gpu-published.cal)\n"
                   "      --db FILE         a results database to store the rows in\n");
            return 0;
        } else if (common_flag(&a, &c)) {
        } else if (qi_args_is(&a, NULL, "--sim-cal")) c.sim_cal = qi_args_str(&a);
        else if (qi_args_is(&a, NULL, "--db")) c.db_path = qi_args_str(&a);
        else qi_args_unknown(&a);
    }
    if (a.failed) return QI_EXIT_USAGE;
    if (!c.published) {
        qi_cli_error(cmd, "--published FILE is required");
        return QI_EXIT_USAGE;
    }
    qi_err err = {0};
    int rc = 0;
    qi_db *db = NULL;
    int64_t exp = 0;
    qi_engine_opts base;
    qi_engine_opts_default(&base);
    base.n_threads = 1;
    base.sim_cal = c.sim_cal;
    if (qi_pub_load(c.published, &c.rows, &c.n_rows, &err) || load_models(&c, &err)) goto fail;
    if (c.db_path && (qi_db_open(c.db_path, &db, &err) ||
                      qi_db_experiment(db, "sim-validate", NULL, NULL, &exp, &err)))
        goto fail;
    printf("SIMULATED figures, calibration %s\n\n", c.sim_cal ? c.sim_cal : "none (the default efficiencies)");
    print_row_head();
    printf(" use |\n|---:|---|---|---|---:|---:|---:|---|\n");
    double e_tg[256], e_pp[256];
    int n_tg = 0, n_pp = 0;
    for (int i = 0; i < c.n_rows; i++) {
        const qi_pub_row *r = &c.rows[i];
        if (!strcmp(r->use, "input") || !strcmp(r->use, "target")) continue;
        if (!r->ok) {
            printf("| %d | %s | %s %s | %s | %.2f | not simulated: %s | | %s |\n", r->line, r->hardware, r->model,
                   r->weights, r->test, r->value, r->why, r->use);
            continue;
        }
        qi_engine_opts o = base;
        o.sim = c.row_prof[i];
        double ts;
        if (qi_pub_simulate(r, c.row_model[i], &o, &ts, &err)) goto fail;
        const double e = ts / r->value - 1;
        printf("| %d | %s | %s %s | %s%s | %.2f | %.2f | %+.1f%% | %s |\n", r->line, r->profile, r->model, r->weights,
               r->test, r->flash_attn ? " (not modelled)" : "", r->value, ts, 100 * e, r->use);
        if (!r->flash_attn && n_tg < 256 && n_pp < 256) {
            if (is_tg(r)) e_tg[n_tg++] = e;
            else e_pp[n_pp++] = e;
        }
        if (db) {
            char cfg[1024], key[65];
            snprintf(cfg, sizeof cfg,
                     "{\"line\":%d,\"profile\":\"%s\",\"model\":\"%s-%s\",\"test\":\"%s\",\"ngl\":%d,\"batch\":%d,"
                     "\"sim_cal\":\"%s\",\"use\":\"%s\"}",
                     r->line, r->profile, r->preset, r->type, r->kind == QI_PUB_PP ? "prompt" : r->kind == QI_PUB_TG
                     ? "decode" : "generation", r->ngl, r->batch, c.sim_cal ? c.sim_cal : "", r->use);
            qi_db_host host;
            qi_db_host_get(&host, ".");
            qi_db_run_info info;
            qi_db_run_info_init(&info, &host);
            /* the run is marked simulated by its simulated figures; the
             * published one stays a measurement */
            info.fresh = true;
            info.cpu = NULL;
            info.gpu = r->hardware;
            int64_t run;
            if (qi_db_config_key(cfg, key, &err) || qi_db_run_begin(db, exp, cfg, key, &info, &run, &err)) goto fail;
            qi_status st = qi_db_metric(db, run, "published.tokens_per_s", r->value, "tok/s", 0, false, &err);
            if (!st) st = qi_db_metric(db, run, "sim.tokens_per_s", ts, "tok/s", 0, true, &err);
            if (!st) st = qi_db_metric(db, run, "sim.error", e, "1", 0, true, &err);
            if (st) {
                qi_db_run_end(db, run, false, err.msg, NULL);
                goto fail;
            }
            if (qi_db_run_end(db, run, true, NULL, &err)) goto fail;
        }
    }
    printf("\nmedian |error| (flash-attention rows left out): decode %.1f%% over %d rows, prompt and generation "
           "%.1f%% over %d rows\n",
           100 * median_abs(e_tg, n_tg), n_tg, 100 * median_abs(e_pp, n_pp), n_pp);
    goto done;
fail:
    rc = qi_cli_fail(cmd, &err);
done:
    if (db) qi_db_close(db);
    ctx_free(&c);
    return rc;
}

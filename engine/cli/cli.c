/* cli.c - flag parsing and error reporting shared by the subcommands. */
#include "cli.h"

#include "backend.h"
#include "kv/kv_policy.h"
#include "placement/placement_policy.h"
#include "qinfer/measure.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void qi_args_init(qi_args *a, const char *cmd, int argc, char **argv) {
    memset(a, 0, sizeof *a);
    a->cmd = cmd;
    a->argc = argc;
    a->argv = argv;
    a->i = 1;
}

const char *qi_args_next(qi_args *a) {
    if (a->failed || a->i >= a->argc) return NULL;
    a->flag = a->argv[a->i++];
    return a->flag;
}

bool qi_args_is(const qi_args *a, const char *s, const char *l) {
    return (s && strcmp(a->flag, s) == 0) || (l && strcmp(a->flag, l) == 0);
}

void qi_cli_error(const char *cmd, const char *fmt, ...) {
    va_list ap;
    fprintf(stderr, "qinfer %s: ", cmd);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

const char *qi_args_str(qi_args *a) {
    if (a->i >= a->argc) {
        qi_cli_error(a->cmd, "option %s needs a value (see qinfer %s --help)", a->flag, a->cmd);
        a->failed = true;
        return NULL;
    }
    return a->argv[a->i++];
}

bool qi_args_int(qi_args *a, long lo, long hi, int *out) {
    const char *s = qi_args_str(a);
    if (!s) return false;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        qi_cli_error(a->cmd, "option %s: '%s' is not an integer in %ld..%ld", a->flag, s, lo, hi);
        a->failed = true;
        return false;
    }
    *out = (int)v;
    return true;
}

bool qi_args_u64(qi_args *a, uint64_t *out) {
    const char *s = qi_args_str(a);
    if (!s) return false;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end || s[0] == '-') {
        qi_cli_error(a->cmd, "option %s: '%s' is not a non-negative integer", a->flag, s);
        a->failed = true;
        return false;
    }
    *out = v;
    return true;
}

bool qi_args_float(qi_args *a, double lo, double hi, float *out) {
    const char *s = qi_args_str(a);
    if (!s) return false;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v) || v < lo || v > hi) {
        qi_cli_error(a->cmd, "option %s: '%s' is not a number in %g..%g", a->flag, s, lo, hi);
        a->failed = true;
        return false;
    }
    *out = (float)v;
    return true;
}

void qi_args_unknown(qi_args *a) {
    if (a->flag[0] == '-')
        qi_cli_error(a->cmd, "unknown option '%s' (see qinfer %s --help)", a->flag, a->cmd);
    else
        qi_cli_error(a->cmd, "unexpected argument '%s' (see qinfer %s --help)", a->flag, a->cmd);
    a->failed = true;
}

int qi_cli_fail(const char *cmd, const qi_err *err) {
    qi_cli_error(cmd, "%s", err->msg[0] ? err->msg : qi_status_str(err->code));
    return err->code == QI_ERR_INVALID ? QI_EXIT_USAGE : QI_EXIT_RUNTIME;
}

double qi_now_s(void) { return qi_measure_now(); }

bool qi_cli_output_format(const char *cmd, const char *arg, const char *human, qi_out_format *out) {
    if (!strcmp(arg, human)) *out = QI_OUT_HUMAN;
    else if (!strcmp(arg, "csv")) *out = QI_OUT_CSV;
    else if (!strcmp(arg, "json")) *out = QI_OUT_JSON;
    else {
        qi_cli_error(cmd, "option -o: '%s' is not an output format (%s, csv, json)", arg, human);
        return false;
    }
    return true;
}

void qi_cli_fput_quoted(FILE *f, const char *s, bool json) {
    putc('"', f);
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (json && (ch == '"' || ch == '\\')) fprintf(f, "\\%c", ch);
        else if (json && ch < 0x20) fprintf(f, "\\u%04x", ch);
        else if (!json && ch == '"') fputs("\"\"", f);
        else putc(ch, f);
    }
    putc('"', f);
}

void qi_cli_print_quoted(const char *s, bool json) { qi_cli_fput_quoted(stdout, s, json); }

/* ---- the KV policy flags -------------------------------------------------------- */

void qi_cli_kv_init(qi_cli_kv *k) {
    memset(k, 0, sizeof *k);
    k->policy = "full";
    k->sparsity_mode = "teal";
    k->sparse_max_density = -1.0;
    qi_params_init(&k->params);
    qi_params_init(&k->sim_params);
}

bool qi_cli_kv_flag(qi_args *a, qi_cli_kv *k) {
    if (qi_args_is(a, NULL, "--sparsity")) {
        float v;
        if (qi_args_float(a, 0.0, 0.99, &v)) k->sparsity = v, k->sparsity_given = true;
        return true;
    }
    if (qi_args_is(a, NULL, "--sparsity-mode")) {
        const char *s = qi_args_str(a);
        qi_sparsity_mode m;
        qi_err e = {0};
        if (s && qi_sparsity_mode_parse(s, &m, &e)) {
            qi_cli_error(a->cmd, "option --sparsity-mode: %s", e.msg);
            a->failed = true;
        } else if (s) {
            k->sparsity_mode = s;
        }
        return true;
    }
    if (qi_args_is(a, NULL, "--sparsity-calib")) {
        const char *s = qi_args_str(a);
        if (s) k->sparsity_calib = s;
        return true;
    }
    if (qi_args_is(a, NULL, "--sparse-max-density")) {
        float v;
        if (qi_args_float(a, 0.0, 1.0, &v)) k->sparse_max_density = v;
        return true;
    }
    if (qi_args_is(a, NULL, "--kv-policy")) {
        const char *s = qi_args_str(a);
        if (s && !qi_kv_policy_find(s)) {
            char names[256] = "";
            for (int i = 0; qi_kv_policies[i]; i++) {
                if (i) strncat(names, ", ", sizeof names - strlen(names) - 1);
                strncat(names, qi_kv_policies[i]->name, sizeof names - strlen(names) - 1);
            }
            qi_cli_error(a->cmd, "option --kv-policy: unknown policy '%s' (policies: %s)", s, names);
            a->failed = true;
        } else if (s) {
            k->policy = s;
        }
        return true;
    }
    if (qi_args_is(a, NULL, "--kv-budget")) {
        const char *s = qi_args_str(a);
        if (!s) return true;
        char *end;
        errno = 0;
        const size_t len = strlen(s);
        if (len > 1 && s[len - 1] == '%') {
            double v = strtod(s, &end);
            if (errno || end != s + len - 1 || !(v > 0.0 && v <= 100.0)) goto bad;
            k->budget_frac = v / 100.0;
            k->budget_tokens = 0;
        } else if (strchr(s, '.')) {
            double v = strtod(s, &end);
            if (errno || *end || !(v > 0.0 && v <= 1.0)) goto bad;
            k->budget_frac = v;
            k->budget_tokens = 0;
        } else {
            long v = strtol(s, &end, 10);
            if (errno || end == s || *end || v < 1 || v > (1L << 24)) goto bad;
            k->budget_tokens = (int)v;
            k->budget_frac = 0.0;
        }
        return true;
    bad:
        qi_cli_error(a->cmd, "option --kv-budget: '%s' is not a token count (e.g. 512), a percentage (50%%) "
                             "or a fraction in (0, 1] (0.5)", s);
        a->failed = true;
        return true;
    }
    if (qi_args_is(a, NULL, "--kv-param")) {
        const char *s = qi_args_str(a);
        qi_err e = {0};
        if (s && qi_params_parse(&k->params, s, &e) != QI_OK) {
            qi_cli_error(a->cmd, "option --kv-param: %s", e.msg);
            a->failed = true;
        }
        return true;
    }
    return false;
}

/* --devices with --gpu-mem's cap: each plain "cuda" of the list becomes
 * "cuda:BYTES", and without --devices the list is cpu,cuda:BYTES. False
 * (the message printed) when the list has no cuda to cap, or caps it
 * itself too. */
static bool devices_compose(qi_args *a, qi_cli_kv *k) {
    k->devices = k->devices_arg;
    if (!k->gpu_mem) return true;
    const char *list = k->devices_arg ? k->devices_arg : "cpu,cuda";
    size_t n = 0;
    bool any = false;
    for (const char *d = list; *d;) {
        const size_t len = strcspn(d, ",");
        const bool cuda = len >= 4 && strncmp(d, "cuda", 4) == 0;
        if (cuda && len > 4) {
            qi_cli_error(a->cmd, "--gpu-mem and --devices %s both cap the GPU: give one", list);
            return false;
        }
        const int w = snprintf(k->devices_buf + n, sizeof k->devices_buf - n, "%s%.*s%s%s", n ? "," : "", (int)len,
                               d, cuda ? ":" : "", cuda ? k->gpu_mem : "");
        if (w < 0 || (size_t)w >= sizeof k->devices_buf - n) {
            qi_cli_error(a->cmd, "--devices %s is too long", list);
            return false;
        }
        n += (size_t)w;
        any |= cuda;
        d += len + (d[len] == ',');
    }
    if (!any) {
        qi_cli_error(a->cmd, "--gpu-mem caps the CUDA device, and --devices %s has none: add cuda", list);
        return false;
    }
    k->devices = k->devices_buf;
    return true;
}

bool qi_cli_place_flag(qi_args *a, qi_cli_kv *k) {
    if (qi_args_is(a, NULL, "--devices")) {
        const char *s = qi_args_str(a);
        if (s) k->devices_arg = s;
        if (s && !devices_compose(a, k)) a->failed = true;
        return true;
    }
    if (qi_args_is(a, NULL, "--gpu-mem")) {
        const char *s = qi_args_str(a);
        if (!s) return true;
        /* a size as cuda:BYTES takes it (the engine checks the number) */
        if (!*s || strspn(s, "0123456789.") == 0 || strspn(s, "0123456789.KMG") != strlen(s)) {
            qi_cli_error(a->cmd, "option --gpu-mem: '%s' is not a size (BYTES, or with K, M or G)", s);
            a->failed = true;
            return true;
        }
        k->gpu_mem = s;
        if (!devices_compose(a, k)) a->failed = true;
        return true;
    }
    if (qi_args_is(a, NULL, "--placement")) {
        const char *s = qi_args_str(a);
        if (s) k->placement = s;
        return true;
    }
    const char **nf = qi_args_is(a, NULL, "--neuron-policy")    ? &k->neuron_policy
                      : qi_args_is(a, NULL, "--neuron-profile") ? &k->neuron_profile
                      : qi_args_is(a, NULL, "--neuron-budget")  ? &k->neuron_budget
                                                                : NULL;
    if (qi_args_is(a, NULL, "--neuron-swap-every")) {
        int v;
        if (!k->neuron_ok) {
            qi_cli_error(a->cmd, "option --neuron-swap-every: qinfer %s takes no neuron split (generate, ppl and bench "
                         "do)", a->cmd);
            a->failed = true;
        } else if (qi_args_int(a, 1, 1 << 20, &v)) {
            k->neuron_swap_every = v;
        }
        return true;
    }
    if (qi_args_is(a, NULL, "--neuron-swap-worker")) {
        if (!k->neuron_ok) {
            qi_cli_error(a->cmd, "option --neuron-swap-worker: qinfer %s takes no neuron split (generate, ppl and "
                         "bench do)", a->cmd);
            a->failed = true;
        }
        k->neuron_swap_worker = true;
        return true;
    }
    if (qi_args_is(a, NULL, "--neuron-swap-stream")) {
        const char *s = qi_args_str(a);
        if (!k->neuron_ok) {
            qi_cli_error(a->cmd, "option --neuron-swap-stream: qinfer %s takes no neuron split (generate, ppl and "
                         "bench do)", a->cmd);
            a->failed = true;
        } else if (s && strcmp(s, "copy") != 0 && strcmp(s, "main") != 0) {
            qi_cli_error(a->cmd, "option --neuron-swap-stream: '%s' is not a stream (copy or main)", s);
            a->failed = true;
        } else if (s) {
            k->neuron_swap_stream = s;
        }
        return true;
    }
    if (qi_args_is(a, NULL, "--sim-cold-density")) {
        float v;
        if (!k->neuron_ok) {
            qi_cli_error(a->cmd, "option --sim-cold-density: qinfer %s takes no neuron split (generate, ppl and bench "
                         "do)", a->cmd);
            a->failed = true;
        } else if (qi_args_float(a, 1e-6f, 1.0f, &v)) {
            k->sim_cold_density = v;
        }
        return true;
    }
    if (qi_args_is(a, NULL, "--neuron-active")) {
        float v;
        if (!k->neuron_ok || strcmp(a->cmd, "ppl") != 0) {
            qi_cli_error(a->cmd, "option --neuron-active: qinfer %s does not count active neurons (ppl does)", a->cmd);
            a->failed = true;
        } else if (qi_args_float(a, 1e-9, 1e9, &v)) {
            k->neuron_active = v;
        }
        return true;
    }
    if (nf) {
        const char *s = qi_args_str(a);
        if (s && !k->neuron_ok) {
            qi_cli_error(a->cmd, "option %s: qinfer %s takes no neuron split (generate, ppl and bench do)", a->flag,
                         a->cmd);
            a->failed = true;
        } else if (s) {
            *nf = s;
        }
        return true;
    }
    const bool sim = qi_args_is(a, NULL, "--sim"), sim_param = !sim && qi_args_is(a, NULL, "--sim-param"),
               sim_cal = !sim && !sim_param && qi_args_is(a, NULL, "--sim-cal");
    if (!sim && !sim_param && !sim_cal) return false;
    const char *s = qi_args_str(a);
    if (!s) return true;
    if (!k->sim_ok) {
        qi_cli_error(a->cmd, "option %s: qinfer %s measures what the model computes, and simulated devices compute "
                             "nothing (bench and generate take --sim)", a->flag, a->cmd);
        a->failed = true;
        return true;
    }
    qi_err e = {0};
    if (sim) {
        k->sim = s;
    } else if (sim_cal) {
        k->sim_cal = s;
    } else if (qi_params_parse(&k->sim_params, s, &e) != QI_OK) {
        qi_cli_error(a->cmd, "option --sim-param: %s", e.msg);
        a->failed = true;
    }
    return true;
}

void qi_cli_sim_allow(qi_cli_kv *k) { k->sim_ok = true; }
void qi_cli_neuron_allow(qi_cli_kv *k) { k->neuron_ok = true; }
void qi_cli_kv_fini(qi_cli_kv *k) {
    qi_free(k->neuron_fast);
    qi_free(k->neuron_act);
    k->neuron_fast = NULL;
    k->neuron_act = NULL;
}

void qi_cli_place_help(void) {
    printf("      --devices LIST      devices to place blocks on: cpu (default), cpu,cuda[:BYTES] (the\n"
           "                          first GPU, the memory the engine may use capped at BYTES, so\n"
           "                          hybrid plans can be forced on a large GPU), or cpu,testdev[:BYTES]\n"
           "      --gpu-mem BYTES     the same cap as cuda:BYTES (K, M or G suffixes; without --devices:\n"
           "                          cpu,cuda:BYTES)\n"
           "                          (testdev: a second CPU device with its own memory and stream);\n"
           "                          with --sim, cpu,gpu[:BYTES] (the profile's GPU, its memory capped)\n"
           "      --placement P       all-cpu (default); ngl=N (the last N layers, and the output\n"
           "                          head when N > layers, as -ngl 99, on the second device); or a plan file:\n"
           "                          one line per layer, ATTN MLP [SPLIT [DEV]], devices by name\n"
           "                          (DEV~ DEV~: the layer streamed to DEV, its weights copied from\n"
           "                          host memory each time it runs, as FlexGen's offload; a line\n"
           "                          gpu_batch N: FlexGen's zig-zag block, a step of more sequences run\n"
           "                          in GPU batches of N, layers outside, each layer's weights loaded once);\n"
           "                          or policy:NAME[:K=V,...], a policy's plan (generate; bench --batch):\n");
    for (int i = 0; qi_placement_policies[i]; i++)
        printf("                            %-10s %s%s%s%s\n", qi_placement_policies[i]->name,
               qi_placement_policies[i]->summary, qi_placement_policies[i]->params[0] ? " [" : "",
               qi_placement_policies[i]->params, qi_placement_policies[i]->params[0] ? "]" : "");
}

/* The policy part of a policy:NAME[:K=V,...] placement, or NULL. */
static const char *policy_spec(const qi_cli_kv *k) {
    return k->placement && strncmp(k->placement, "policy:", 7) == 0 ? k->placement + 7 : NULL;
}

void qi_cli_place_policy_allow(qi_cli_kv *k) { k->policy_ok = true; }

qi_status qi_cli_place_policy(const qi_cli_kv *k, qi_engine *e, const qi_model *m, int batch, int prompt_len,
                              int gen_len, qi_err *err) {
    if (!policy_spec(k)) return QI_OK;
    qi_placement_policy *p = NULL;
    qi_status st = qi_placement_policy_from_spec(k->placement, &p, err);
    const qi_placement_workload wl = {.batch = batch, .prompt_len = prompt_len, .gen_len = gen_len,
                                      .kv_budget = k->budget_tokens};
    if (!st) st = qi_placement_apply(p, e, m, &wl, NULL, err);
    qi_placement_policy_free(p);
    return st;
}

void qi_cli_print_plan(const char *cmd, const qi_engine *e) {
    char sum[256];
    qi_plan_summary(qi_engine_plan(e), sum, sizeof sum);
    fprintf(stderr, "qinfer %s: placement %s", cmd, sum);
    qi_engine_dev d;
    for (int i = 0; qi_engine_device(e, i, &d); i++) {
        fprintf(stderr, "%s %s %.1f MiB in use (peak %.1f", i ? ";" : ",", d.name, d.in_use / 1048576.0,
                d.peak / 1048576.0);
        if (d.capacity) fprintf(stderr, " of %.1f", d.capacity / 1048576.0);
        fprintf(stderr, " MiB)");
    }
    fprintf(stderr, "\n");
    qi_engine_prof pr;
    qi_engine_profile(e, &pr);
    if (pr.copies > 0)
        fprintf(stderr,
                "qinfer %s: copies between devices %ld (%.1f MiB, %.3f s of device time), of which KV blocks moved "
                "%ld\n",
                cmd, pr.copies, pr.copy_bytes / 1048576.0, pr.copy_seconds, pr.kv_block_moves);
    if (pr.replans > 0)
        fprintf(stderr, "qinfer %s: new plans %ld, moving %.1f MiB (%ld KV blocks) in %.3f s\n", cmd, pr.replans,
                pr.replan_bytes / 1048576.0, pr.replan_kv_blocks, pr.replan_seconds);
}

void qi_cli_sim_help(void) {
    printf("      --sim PROFILE       run on that machine simulated: a hardware profile such as\n"
           "                          engine/backend/sim/profiles/a100-pcie-2xeon.profile; no arithmetic\n"
           "                          runs and every time is the simulator's, labelled so (a model of\n"
           "                          shapes only, qinfer synth --shapes-only, runs this way only)\n"
           "      --sim-param K=V     the simulator's parameters (repeatable): noise=SIGMA, seed=N,\n"
           "                          link=EFF, cpu_op_s=S, {cpu,gpu}_{matmul,attention,other}_\n"
           "                          {compute,memory}=EFF (engine/backend/sim/README.md)\n"
           "      --sim-cal FILE      the simulator's parameters fitted to a machine (qinfer calibrate\n"
           "                          -o FILE, e.g. engine/backend/sim/profiles/epyc-2core-kvm.cal);\n"
           "                          --sim-param overrides its values\n");
}

void qi_cli_kv_apply(const qi_cli_kv *k, qi_engine_opts *o) {
    o->neuron_fast = k->neuron_fast;
    o->neuron_dev = 1;
    o->neuron_active = k->neuron_fast ? k->neuron_active : 0.0f;
    o->neuron_swap_every = k->neuron_fast ? k->neuron_swap_every : 0;
    o->neuron_swap_worker = k->neuron_fast && k->neuron_swap_worker;
    o->neuron_swap_main_stream = o->neuron_swap_worker && k->neuron_swap_stream && !strcmp(k->neuron_swap_stream, "main");
    o->sim_cold_density = k->sim_cold_density;
    o->neuron_live = &k->neuron_live;
    o->neuron_activity = k->neuron_act;
    o->devices = k->devices;
    o->sim = k->sim;
    o->sim_cal = k->sim_cal;
    o->sim_params = &k->sim_params;
    static bool warned; /* once a run, though commands apply their options more than once */
    if (k->sim && k->sim_cal && !warned) {
        /* a calibration fitted on another machine than the profile's */
        qi_hwprofile prof;
        qi_err e = {0};
        char why[768];
        if (qi_hwprofile_load(k->sim, &prof, &e) == QI_OK && qi_sim_cal_machine_differs(k->sim_cal, &prof, why, sizeof why))
            fprintf(stderr, "qinfer: warning: %s\n", why), warned = true;
    }
    /* a policy's plan comes after creation (qi_cli_place_policy); a command
     * that does not run one passes the value on, and the engine refuses it */
    o->placement = policy_spec(k) && k->policy_ok ? "all-cpu" : k->placement;
    o->kv_policy = k->policy;
    o->kv_params = &k->params;
    o->kv_budget_tokens = k->budget_tokens;
    o->kv_budget_frac = k->budget_frac;
    /* the thresholds are loaded by qi_cli_kv_check, before any engine */
    o->sparsity = k->sparsity_given && (k->sparsity > 0.0 || k->sparsity_calib) ? &k->sp : NULL;
    if (k->sparse_max_density >= 0.0) o->sparse_max_density = k->sparse_max_density;
}

/* Every layer exempt: the policy never applies a budget (full; qinfer with
 * full_layers at n_layer). */
static bool ignores_budget(const char *name, const qi_params *params, int n_layer) {
    qi_kv_policy *p = NULL;
    if (qi_kv_policy_create(name, params, n_layer, &p, NULL) != QI_OK) return false;
    bool all = true;
    for (int l = 0; l < n_layer && all; l++) all = qi_kv_policy_exempt(p, l);
    qi_kv_policy_free(p);
    return all;
}

static qi_status sparsity_check(qi_cli_kv *k, int n_layer, qi_err *err) {
    if (k->sparsity_given && k->sparsity == 0.0 && !k->sparsity_calib)
        k->sparsity_given = false; /* --sparsity 0 alone: dense, no calibration needed */
    if (!k->sparsity_given) {
        if (k->sparsity_calib || k->sparse_max_density >= 0.0)
            return QI_ERR(err, QI_ERR_INVALID, "option %s without --sparsity S", k->sparsity_calib ? "--sparsity-calib"
                                                                                                 : "--sparse-max-density");
        return QI_OK;
    }
    if (!k->sparsity_calib)
        return QI_ERR(err, QI_ERR_INVALID, "option --sparsity needs --sparsity-calib FILE, the thresholds' calibration "
                      "(qinfer profile -m MODEL -f CORPUS --sparsity-out FILE)");
    if (n_layer > QI_CLI_MAX_LAYERS)
        return QI_ERR(err, QI_ERR_UNSUPPORTED, "--sparsity: a model of %d layers (at most %d)", n_layer,
                      QI_CLI_MAX_LAYERS);
    qi_sparsity_mode mode;
    qi_sparsity sp;
    qi_status st;
    if ((st = qi_sparsity_mode_parse(k->sparsity_mode, &mode, err)) ||
        (st = qi_sparsity_load(k->sparsity_calib, mode, k->sparsity, n_layer, &sp, err)))
        return st;
    memcpy(k->sp_thr, sp.thr, sizeof(float) * (size_t)n_layer * QI_SITE_COUNT);
    qi_sparsity_free(&sp);
    sp.thr = k->sp_thr;
    k->sp = sp;
    return QI_OK;
}

qi_status qi_cli_kv_check(qi_cli_kv *k, int n_layer, qi_err *err) {
    qi_status st = sparsity_check(k, n_layer, err);
    if (st) return st;
    if (k->budget_tokens == 0 && k->budget_frac == 0.0) return QI_OK;
    if (!ignores_budget(k->policy, &k->params, n_layer)) return QI_OK;
    char names[256] = "", budget[32];
    qi_params none;
    qi_params_init(&none);
    for (int i = 0; qi_kv_policies[i]; i++) {
        if (ignores_budget(qi_kv_policies[i]->name, &none, n_layer)) continue;
        if (names[0]) strncat(names, ", ", sizeof names - strlen(names) - 1);
        strncat(names, qi_kv_policies[i]->name, sizeof names - strlen(names) - 1);
    }
    if (k->budget_tokens > 0) snprintf(budget, sizeof budget, "%d", k->budget_tokens);
    else snprintf(budget, sizeof budget, "%g%%", k->budget_frac * 100);
    return QI_ERR(err, QI_ERR_INVALID,
                  "option --kv-budget %s: KV policy '%s' keeps every token on every layer and would ignore it; "
                  "name a policy that takes a budget with --kv-policy (%s)",
                  budget, k->policy, names);
}

void qi_cli_kv_describe(const qi_cli_kv *k, char *buf, size_t n) {
    int w = snprintf(buf, n, "%s", k->policy);
    /* a policy that picks what attention reads (quest, sparq) budgets the tokens read */
    const qi_kv_policy_i *pi = qi_kv_policy_find(k->policy);
    const char *attended = pi && pi->pick ? " attended" : "";
    if (k->budget_tokens > 0)
        w += snprintf(buf + w, n > (size_t)w ? n - w : 0, ", budget %d tokens%s", k->budget_tokens, attended);
    else if (k->budget_frac > 0)
        w += snprintf(buf + w, n > (size_t)w ? n - w : 0, ", budget %g%%%s", k->budget_frac * 100, attended);
    for (int i = 0; i < k->params.n; i++)
        w += snprintf(buf + w, n > (size_t)w ? n - w : 0, "%s%s=%s", i ? "," : ", ", k->params.items[i].key,
                      k->params.items[i].value);
    if (k->placement && strcmp(k->placement, "all-cpu") != 0)
        w += snprintf(buf + w, n > (size_t)w ? n - w : 0, "; placement %s on %s", k->placement,
                      k->devices ? k->devices : "cpu");
    if (k->sparsity_given)
        w += snprintf(buf + w, n > (size_t)w ? n - w : 0, "; sparsity %s %g", k->sparsity_mode, k->sparsity);
}

void qi_cli_kv_help(void) {
    printf("      --kv-policy NAME    KV selection policy (default full):\n");
    for (int i = 0; qi_kv_policies[i]; i++)
        printf("                            %-10s %s%s%s%s\n", qi_kv_policies[i]->name, qi_kv_policies[i]->summary,
               qi_kv_policies[i]->params[0] ? " [" : "", qi_kv_policies[i]->params,
               qi_kv_policies[i]->params[0] ? "]" : "");
    printf("      --kv-budget B       working KV tokens per layer and KV head: a count (512),\n"
           "                          a percentage (50%%) or a fraction (0.5) of the sequence;\n"
           "                          for quest and sparq, the tokens attention reads per\n"
           "                          decode step (qinfer with fetch=F: the working tokens\n"
           "                          and those it fetches back from the offload tier)\n"
           "      --kv-param K=V,...  policy parameters (repeatable); any policy also takes\n"
           "                          pyramid=B in [0, 1): budgets falling linearly from the\n"
           "                          lowest budgeted layer to the highest, same total (PyramidKV);\n"
           "                          a scored policy also takes ada=F in [0, 1]: a layer's budget\n"
           "                          shared among its KV heads by their scores, each sure of\n"
           "                          (1-F) of it, same total (Ada-KV)\n");
    printf("      --sparsity S        zero the share S (0..0.99) of the activations (CPU only;\n"
           "                          0: dense, bit for bit); thresholds per layer from\n"
           "      --sparsity-calib F  a calibration file (qinfer profile --sparsity-out F)\n"
           "      --sparsity-mode M   teal (every matmul's input, default) or cats (the MLP's\n"
           "                          neurons by |act(gate)|)\n"
           "      --sparse-max-density D  sparse matmuls where at most D of a matrix's columns\n"
           "                          are active over the step's rows (default 0.6), else dense\n");
}

qi_status qi_cli_load_model(const char *path, bool repack, qi_model **m, qi_err *err) {
    *m = NULL;
    qi_status st = qi_model_load(path, m, err);
    const int n_mat = st == QI_OK ? qi_model_n_matrices(*m) : 0, n_pack = st == QI_OK ? qi_model_n_packable(*m) : 0;
    if (st == QI_OK && repack && n_pack < n_mat)
        fprintf(stderr, "qinfer: --repack: %d of the %d matrices have a packed form (q4_0, q4_1, q5_0, q5_1, q8_0; q4_K, "
                        "q6_K with AMX); the others are read as the file has them\n", n_pack, n_mat);
    return st;
}

void qi_cli_print_profile(const char *cmd, const char *label, const qi_engine_prof *pr) {
    double tot = 0;
    for (int k = 0; k < QI_OP_COUNT; k++) tot += pr->seconds[k];
    fprintf(stderr, "qinfer %s: profile %s%s%sover %ld steps, %.3f s:", cmd, label ? "of " : "", label ? label : "",
            label ? " " : "", pr->steps, tot);
    for (int k = 0; k < QI_OP_COUNT; k++)
        fprintf(stderr, " %s %.1f%%", qi_op_kind_name((qi_op_kind)k), tot > 0 ? 100 * pr->seconds[k] / tot : 0.0);
    fprintf(stderr, "; matmuls read %.1f GB/s of weights\n",
            pr->seconds[QI_OP_MATMUL] > 0 ? pr->matmul_bytes / pr->seconds[QI_OP_MATMUL] / 1e9 : 0.0);
}

bool qi_cli_cupti_check(const char *cmd, const qi_cli_kv *k) {
    for (const char *d = k->devices; d && *d;) {
        const size_t n = strcspn(d, ",");
        if (n >= 4 && strncmp(d, "cuda", 4) == 0 && (n == 4 || d[4] == ':')) return true;
        d += n + (d[n] == ',');
    }
    qi_cli_error(cmd, "--cupti records a CUDA device's kernels and copies, and --devices %s has none: add cuda "
                      "(e.g. --devices cpu,cuda --placement ngl=N)", k->devices ? k->devices : "cpu (the default)");
    return false;
}

void qi_cli_prof_since(qi_engine_prof *pr, const qi_engine_prof *before) {
    for (int i = 0; i < QI_OP_COUNT; i++) {
        pr->seconds[i] -= before->seconds[i];
        pr->calls[i] -= before->calls[i];
    }
    pr->matmul_bytes -= before->matmul_bytes;
    pr->steps -= before->steps;
    pr->copies -= before->copies;
    pr->kv_block_moves -= before->kv_block_moves;
    pr->copy_bytes -= before->copy_bytes;
    pr->copy_seconds -= before->copy_seconds;
    for (int d = 0; d < QI_PLAN_MAX_DEVICES; d++) {
        pr->dev_op_seconds[d] -= before->dev_op_seconds[d];
        pr->dev_span_seconds[d] -= before->dev_span_seconds[d];
        pr->dev_copy_seconds[d] -= before->dev_copy_seconds[d];
    }
    pr->replans -= before->replans;
    pr->replan_kv_blocks -= before->replan_kv_blocks;
    pr->replan_bytes -= before->replan_bytes;
    pr->replan_seconds -= before->replan_seconds;
}

void qi_cli_print_cupti(const char *cmd, const char *label, const qi_engine *e, const qi_engine_prof *pr,
                        const qi_cupti_totals *ct) {
    const char *of = label ? " of " : "", *lb = label ? label : "";
    double memcpy_s = 0;
    long memcpys = 0;
    fprintf(stderr, "qinfer %s: CUPTI%s%s: %ld kernels %.6f s; memcpy", cmd, of, lb, ct->kernels, ct->kernel_s);
    for (int d = 0; d < QI_CUPTI_DIRS; d++) {
        fprintf(stderr, "%s %s %ld (%.2f MiB) %.6f s", d ? "," : "", qi_cupti_dir_name((qi_cupti_dir)d),
                ct->copies[d], ct->copy_bytes[d] / 1048576.0, ct->copy_s[d]);
        memcpy_s += ct->copy_s[d];
        memcpys += ct->copies[d];
    }
    const double gpu_s = ct->kernel_s + memcpy_s;
    fprintf(stderr, "; kernels + %ld memcpys %.6f s, first start to last end %.6f s", memcpys, gpu_s, ct->span_s);
    if (ct->dropped) fprintf(stderr, "; %ld records DROPPED (the totals are short)", ct->dropped);
    fprintf(stderr, "\n");
    /* the engine's events on its CUDA devices over the same span */
    double span_s = 0, copy_s = 0, op_s = 0;
    char names[128] = "";
    size_t used = 0;
    qi_engine_dev dv;
    for (int d = 0; d < QI_PLAN_MAX_DEVICES && qi_engine_device(e, d, &dv); d++) {
        if (!dv.cuda) continue;
        span_s += pr->dev_span_seconds[d];
        copy_s += pr->dev_copy_seconds[d];
        op_s += pr->dev_op_seconds[d];
        const int w = snprintf(names + used, sizeof names - used, "%s%s", used ? "," : "", dv.name);
        if (w > 0 && (size_t)w < sizeof names - used) used += (size_t)w;
    }
    const double ev_s = span_s + copy_s;
    fprintf(stderr, "qinfer %s: events%s%s on %s over %ld steps: block spans %.6f s + copies between devices %.6f s "
                    "= %.6f s (of the spans, the event-timed matmul, attention and kv-write ops %.6f s)\n",
            cmd, of, lb, used ? names : "no CUDA device", pr->steps, span_s, copy_s, ev_s, op_s);
    /* The spans also hold the memcpys issued inside ops (their tables) and
     * the logits' download, and both sides count the gaps differently: the
     * events' from a block's start to its end, CUPTI's not at all. */
    fprintf(stderr, "qinfer %s: events / CUPTI%s%s: %.4f ((spans + copies) / (kernels + memcpys); above 1 by the "
                    "launch gaps inside the spans), spans / kernels %.4f\n",
            cmd, of, lb, gpu_s > 0 ? ev_s / gpu_s : 0.0, ct->kernel_s > 0 ? span_s / ct->kernel_s : 0.0);
}

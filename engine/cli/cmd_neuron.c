/* cmd_neuron.c - `qinfer neuron-plan`: a neuron policy's placement of a
 * profiled model's FFN neurons, per layer.
 *
 * Reads a profile (`qinfer profile -o`), takes each neuron's activity from
 * one of its columns (mass by default), the bytes per neuron from the
 * model (-m, or the model the profile names) or from --neuron-bytes, and
 * the fast device's budget in bytes or as a share of every neuron's
 * bytes; runs the policy through the slot's wrapper (policies/neuron/) and
 * prints, per layer, the groups and neurons on the fast device, their
 * bytes, the share of the layer's activity they hold, and the recall and
 * precision of that set against the neurons the profile (or --eval, a
 * profile of other text) saw active. Nothing runs on a device: this is the
 * plan the engine would be given, to be read before any run.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "neuron/neuron_policy.h"
#include "qinfer/model.h"
#include "qinfer/model_files.h"

static void help(void) {
    printf("usage: qinfer neuron-plan --profile FILE --policy NAME[:K=V,...]\n"
           "                          (--budget BYTES | --budget-frac F) [--group N] [--ratio R]\n"
           "                          [-m MODEL | --neuron-bytes N] [--by mass|active|hot] [--eval FILE]\n\n"
           "Places each layer's FFN neurons (a gate row, an up row and a down column each)\n"
           "on the fast device or the slow one with a neuron policy, from a profile written\n"
           "by qinfer profile -o, and prints per layer the groups and neurons kept on the\n"
           "fast device, their bytes, the share of the layer's activity they hold, and the\n"
           "recall and precision of that set against the neurons seen active.\n\n"
           "  -p, --profile FILE    the profile (qinfer profile -o)\n"
           "      --policy P        none, static or qinfer, with parameters after a colon\n"
           "                        (static:min_groups=2,time_limit=5; see below)\n"
           "      --budget BYTES    the fast device's bytes for FFN neurons (K, M or G: 1024s)\n"
           "      --budget-frac F   the budget as a share of every neuron's bytes, in [0, 1]\n"
           "      --group N         neurons per group, ranked by activity (default %d)\n"
           "      --ratio R         qinfer: the fast:slow speed ratio (its ratio= parameter)\n"
           "  -m, --model MODEL     bytes per neuron from this model's FFN weights (default: the\n"
           "                        model the profile names)\n"
           "      --neuron-bytes N  bytes per neuron, the same in every layer (instead of -m)\n"
           "      --by COLUMN       the activity a policy places by: mass (default), active or hot\n"
           "      --eval FILE       recall and precision against this profile's active counts\n"
           "                        (default: the profile placed from)\n"
           "  -h, --help            this help\n\n"
           "Policies (policies/neuron/README.md):\n",
           QI_NEURON_GROUP_DEFAULT);
    for (const qi_neuron_policy_i *const *it = qi_neuron_policies; *it; it++)
        printf("  %-8s %s\n           parameters: %s\n", (*it)->name, (*it)->summary,
               (*it)->params[0] ? (*it)->params : "none");
    printf("\nColumns: groups and neurons on the fast device; their bytes; kept = their share\n"
           "of the layer's activity; recall = the share of (token, active neuron) pairs the\n"
           "fast set holds; precision = the mean share of the fast set active on a token.\n");
}

/* BYTES, or a number with K, M or G (powers of 1024); whole bytes, < 2^62. */
static bool parse_size(const char *s, int64_t *out) {
    double share = -1.0;
    return s && qi_neuron_parse_budget(s, &share, out) && share < 0.0;
}

static bool parse_frac(const char *s, double *out) {
    if (!s || !*s) return false;
    char *end;
    errno = 0;
    const double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= 0.0 && v <= 1.0)) return false;
    *out = v;
    return true;
}

static void print_rp(double v) {
    if (isnan(v)) printf(" %9s", "-");
    else printf(" %9.3f", v);
}

int qi_cmd_neuron(int argc, char **argv) {
    const char *cmd = "neuron-plan", *profile_arg = NULL, *policy_arg = NULL, *budget_arg = NULL, *frac_arg = NULL,
               *ratio_arg = NULL, *model_arg = NULL, *nb_arg = NULL, *by = "mass", *eval_arg = NULL;
    int group = QI_NEURON_GROUP_DEFAULT;
    qi_args a;
    qi_args_init(&a, cmd, argc, argv);
    while (qi_args_next(&a)) {
        if (qi_args_is(&a, "-h", "--help")) { help(); return 0; }
        else if (qi_args_is(&a, "-p", "--profile")) profile_arg = qi_args_str(&a);
        else if (qi_args_is(&a, NULL, "--policy")) policy_arg = qi_args_str(&a);
        else if (qi_args_is(&a, NULL, "--budget")) budget_arg = qi_args_str(&a);
        else if (qi_args_is(&a, NULL, "--budget-frac")) frac_arg = qi_args_str(&a);
        else if (qi_args_is(&a, NULL, "--group")) qi_args_int(&a, 1, QI_NEURON_MAX_FF, &group);
        else if (qi_args_is(&a, NULL, "--ratio")) ratio_arg = qi_args_str(&a);
        else if (qi_args_is(&a, "-m", "--model")) model_arg = qi_args_str(&a);
        else if (qi_args_is(&a, NULL, "--neuron-bytes")) nb_arg = qi_args_str(&a);
        else if (qi_args_is(&a, NULL, "--by")) by = qi_args_str(&a);
        else if (qi_args_is(&a, NULL, "--eval")) eval_arg = qi_args_str(&a);
        else qi_args_unknown(&a);
        if (a.failed) break;
    }
    if (a.failed) return QI_EXIT_USAGE;
    if (!profile_arg || !*profile_arg) {
        qi_cli_error(cmd, "no profile given: use --profile FILE (written by qinfer profile -o)");
        return QI_EXIT_USAGE;
    }
    if (!policy_arg || !*policy_arg) {
        qi_cli_error(cmd, "no policy given: use --policy none, static or qinfer");
        return QI_EXIT_USAGE;
    }
    if (!by || (strcmp(by, "mass") && strcmp(by, "active") && strcmp(by, "hot"))) {
        qi_cli_error(cmd, "option --by: '%s' is not a column (mass, active or hot)", by ? by : "");
        return QI_EXIT_USAGE;
    }
    int64_t budget = 0, nb_uniform = 0;
    double frac = -1.0;
    if (budget_arg && frac_arg) {
        qi_cli_error(cmd, "--budget and --budget-frac both set the budget: give one");
        return QI_EXIT_USAGE;
    }
    if (budget_arg && !parse_size(budget_arg, &budget)) {
        qi_cli_error(cmd, "option --budget: '%s' is not a size (BYTES, or with K, M or G)", budget_arg);
        return QI_EXIT_USAGE;
    }
    if (frac_arg && !parse_frac(frac_arg, &frac)) {
        qi_cli_error(cmd, "option --budget-frac: '%s' is not a share in [0, 1]", frac_arg);
        return QI_EXIT_USAGE;
    }
    if (nb_arg && (!parse_size(nb_arg, &nb_uniform) || nb_uniform < 1)) {
        qi_cli_error(cmd, "option --neuron-bytes: '%s' is not a size of at least 1 byte", nb_arg);
        return QI_EXIT_USAGE;
    }
    if (nb_arg && model_arg) {
        qi_cli_error(cmd, "-m and --neuron-bytes both give the bytes per neuron: give one");
        return QI_EXIT_USAGE;
    }
    const bool is_none = strncmp(policy_arg, "none", 4) == 0 && (!policy_arg[4] || policy_arg[4] == ':');
    if (!budget_arg && !frac_arg && !is_none) {
        qi_cli_error(cmd, "no budget given: use --budget BYTES or --budget-frac F");
        return QI_EXIT_USAGE;
    }
    /* --ratio R is qinfer's ratio= */
    char spec[512];
    const bool is_qinfer = strncmp(policy_arg, "qinfer", 6) == 0 && (!policy_arg[6] || policy_arg[6] == ':');
    if (ratio_arg && !is_qinfer) {
        qi_cli_error(cmd, "--ratio is the qinfer policy's; policy '%s' takes none", policy_arg);
        return QI_EXIT_USAGE;
    }
    if (ratio_arg && strstr(policy_arg, "ratio=")) {
        qi_cli_error(cmd, "--ratio and the policy's ratio= both give the ratio: give one");
        return QI_EXIT_USAGE;
    }
    if (ratio_arg)
        snprintf(spec, sizeof spec, "%s%sratio=%s", policy_arg, strchr(policy_arg, ':') ? "," : ":", ratio_arg);
    else
        snprintf(spec, sizeof spec, "%s", policy_arg);

    qi_err err = {0};
    qi_neuron_profile prof = {0}, evalp = {0};
    qi_neuron_policy *pol = NULL;
    qi_model *m = NULL;
    qi_neuron_plan plan = {0};
    double *act = NULL;
    uint64_t *nb = NULL;
    int rc = 0;
    if (qi_neuron_policy_from_spec(spec, &pol, &err)) goto fail;
    if (qi_neuron_profile_read(profile_arg, &prof, &err)) goto fail;
    if (eval_arg && qi_neuron_profile_read(eval_arg, &evalp, &err)) goto fail;
    const qi_neuron_profile *ev = eval_arg ? &evalp : &prof;
    if (ev->n_layer != prof.n_layer || ev->n_ff != prof.n_ff) {
        QI_ERR(&err, QI_ERR_INVALID, "%s is %d layers x %d neurons, %s %d x %d: not the same model", eval_arg,
               ev->n_layer, ev->n_ff, profile_arg, prof.n_layer, prof.n_ff);
        goto fail;
    }
    const int L = prof.n_layer, F = prof.n_ff;
    const size_t n = (size_t)L * F;
    act = qi_malloc(sizeof *act * n);
    nb = qi_malloc(sizeof *nb * (size_t)L);
    if (!act || !nb) {
        QI_ERR(&err, QI_ERR_NOMEM, "out of memory for %d x %d neurons", L, F);
        goto fail;
    }
    for (size_t i = 0; i < n; i++)
        act[i] = by[0] == 'm' ? prof.mass[i] : by[0] == 'a' ? (double)prof.active[i] : (double)prof.hot[i];
    const char *bytes_from;
    char mpath[1024];
    if (nb_arg) {
        for (int l = 0; l < L; l++) nb[l] = (uint64_t)nb_uniform;
        bytes_from = "--neuron-bytes";
    } else {
        const char *marg = model_arg ? model_arg : prof.model[0] && strcmp(prof.model, "-") ? prof.model : NULL;
        if (!marg) {
            QI_ERR(&err, QI_ERR_INVALID, "%s names no model: give -m MODEL or --neuron-bytes N", profile_arg);
            goto fail;
        }
        if (qi_cache_resolve(marg, "model", mpath, sizeof mpath, &err)) {
            if (!model_arg) qi_err_prefix(&err, "the profile's model");
            goto fail;
        }
        if (qi_cli_load_model(mpath, false, &m, &err)) goto fail;
        if (m->hp.n_layer != L || m->hp.n_ff != F) {
            QI_ERR(&err, QI_ERR_INVALID, "%s has %d layers x %d neurons, the profile %d x %d: not the same model",
                   mpath, m->hp.n_layer, m->hp.n_ff, L, F);
            goto fail;
        }
        if (qi_neuron_bytes_of_model(m, nb, &err)) goto fail;
        bytes_from = mpath;
    }
    uint64_t all_bytes = 0;
    for (int l = 0; l < L; l++) all_bytes += nb[l] * (uint64_t)F;
    if (frac >= 0.0) budget = (int64_t)floor(frac * (double)all_bytes);
    qi_neuron_input in = {.n_layer = L, .n_ff = F, .activity = act, .neuron_bytes = nb, .budget = budget,
                          .group = group};
    if (qi_neuron_policy_place(pol, &in, &plan, &err)) goto fail;

    printf("policy %s  profile %s (%d layers x %d neurons, %ld tokens)  by %s\n", spec, profile_arg, L, F,
           prof.tokens, by);
    printf("bytes per neuron from %s (layer 0: %llu)  budget %lld bytes (%.1f%% of all %llu)  groups of %d, %d a "
           "layer\n",
           bytes_from, (unsigned long long)nb[0], (long long)budget,
           all_bytes ? 100.0 * (double)budget / (double)all_bytes : 0.0, (unsigned long long)all_bytes, plan.group,
           plan.n_groups);
    if (eval_arg) printf("recall and precision against %s (%ld tokens)\n", eval_arg, ev->tokens);
    printf("%5s %8s %8s %12s %9s %9s %9s\n", "layer", "groups", "neurons", "bytes", "kept", "recall", "precision");
    qi_neuron_rp sum = {0};
    for (int l = 0; l < L; l++) {
        qi_neuron_rp rp;
        qi_neuron_recall(plan.fast + (size_t)l * F, ev->active + (size_t)l * F, F, ev->layer_tokens[l], &rp);
        sum.hit += rp.hit;
        sum.active += rp.active;
        sum.fast += (int64_t)ev->layer_tokens[l] * rp.fast; /* token-neuron pairs on the fast device */
        char g[24];
        snprintf(g, sizeof g, "%d/%d", plan.groups_fast[l], plan.n_groups);
        printf("%5d %8s %8d %12llu", l, g, plan.n_fast[l], (unsigned long long)plan.bytes[l]);
        print_rp(plan.mass[l] > 0 ? plan.mass_fast[l] / plan.mass[l] : NAN);
        print_rp(rp.recall);
        print_rp(rp.precision);
        printf("\n");
    }
    int gsum = 0, nsum = 0;
    for (int l = 0; l < L; l++) gsum += plan.groups_fast[l], nsum += plan.n_fast[l];
    printf("total: %d/%d groups, %d neurons, %llu bytes (%.1f%% of the budget), kept %.3f of the activity, recall ",
           gsum, L * plan.n_groups, nsum, (unsigned long long)plan.total_bytes,
           budget > 0 ? 100.0 * (double)plan.total_bytes / (double)budget : 0.0,
           plan.total_mass > 0 ? plan.total_mass_fast / plan.total_mass : 0.0);
    if (sum.active > 0) printf("%.3f", (double)sum.hit / (double)sum.active);
    else printf("-");
    printf(", precision ");
    if (sum.fast > 0) printf("%.3f", (double)sum.hit / (double)sum.fast);
    else printf("-");
    if (plan.optimal) printf(", optimal\n");
    else if (!isnan(plan.bound))
        printf(", not proven optimal (bound %.6g, kept %.6g)\n", plan.bound, plan.total_mass_fast);
    else printf("\n");
    goto done;
fail:
    rc = qi_cli_fail(cmd, &err);
done:
    qi_neuron_plan_fini(&plan);
    qi_free(act);
    qi_free(nb);
    qi_model_free(m);
    qi_neuron_policy_free(pol);
    qi_neuron_profile_fini(&prof);
    qi_neuron_profile_fini(&evalp);
    return rc;
}

/* ---- the neuron split of the engine commands (cli.h) ------------------------------------ */

void qi_cli_neuron_help(void) {
    printf("      --neuron-policy P   split each layer's FFN by neurons between the cpu and the second\n"
           "                          device of --devices, the hot ones there: none, static or\n"
           "                          qinfer:ratio=R|auto (auto: the speed ratio timed on the devices\n"
           "                          first, at the rows of a decode step: ppl's --batch, bench's\n"
           "                          largest -b; policies/neuron/README.md); neurons go in units\n"
           "                          of down's quantisation block (32 for q4_1), moved whole\n"
           "      --neuron-profile F  the profile the policy places by (qinfer profile -o F), or\n"
           "                          uniform (every neuron alike: where nothing is computed, --sim)\n"
           "      --neuron-budget B   the second device's bytes for hot neurons: BYTES (K, M or G)\n"
           "                          or P%% of the FFN's bytes\n"
           "      --neuron-swap-every N  (qinfer policy) every N steps, feed each layer's activity to\n"
           "                          the policy's swap rule and move the hottest cold units into\n"
           "                          the slots of the coldest hot ones (copied between steps)\n"
           "      --neuron-swap-worker  (with --neuron-swap-every) make those swaps on a background\n"
           "                          thread while the steps go on (each step sees every unit in one\n"
           "                          place; which step a swap lands before varies from run to run)\n"
           "      --neuron-swap-stream S  where the worker uploads: copy (default: the second\n"
           "                          device's copy stream, beside the steps' ops) or main (among\n"
           "                          them: what the copy stream saves)\n"
           "      --sim-cold-density D  (with --sim) a what-if the simulator cannot measure: of the\n"
           "                          FFN neurons the CPU computes (a split's cold side, every MLP\n"
           "                          the plan leaves on the CPU), each step reads up's rows and\n"
           "                          down's columns of the share D (0..1] alone, as cats would\n"
           "                          (gate whole; a GPU's neurons dense)\n"
           "      --sim-activity SPEC  (with --sim) a predictor-gated FFN (PowerInfer's, Q-Infer's) on\n"
           "                          every device: each step runs the predictor and reads the union\n"
           "                          of the neurons its tokens activate, by the activity model SPEC:\n"
           "                          a preset (opt, falcon-relu, llama-reglu: published statistics),\n"
           "                          active=A,hot=H:Y (A active per token; H of the neurons give Y),\n"
           "                          or profile=PATH (`qinfer profile -o`); ,pred=F sets the\n"
           "                          predictor's share of the parameters (engine/backend/sim/README.md)\n"
           "      --neuron-active T   (ppl) print each layer's hot-set recall and precision against\n"
           "                          the neurons active in the run, |act| > T (the profile's 0.1);\n"
           "                          copies the hot side's activations back every layer: slower\n");
}

void qi_cli_neuron_print_rp(const qi_cli_kv *k, const qi_engine *e, int n_layer) {
    if (k->neuron_fast && k->neuron_swap_every) {
        qi_engine_neuron_swaps sw;
        qi_engine_neuron_swaps_get(e, &sw);
        if (k->neuron_swap_worker)
            printf("neuron swaps: %ld rounds, %ld units moved to the second device (%.2f MiB copied) by the "
                   "background worker (uploads on the device's %s stream); the steps waited %.1f ms for its holds "
                   "and met a layer mid-swap %ld times\n",
                   sw.rounds, sw.swaps, sw.bytes / 1048576.0, sw.copy_stream ? "copy" : "main", 1e3 * sw.seconds,
                   sw.mid);
        else
            printf("neuron swaps: %ld rounds, %ld units moved to the second device (%.2f MiB copied), %.1f ms in "
                   "the rounds (%.3f ms a round)\n",
                   sw.rounds, sw.swaps, sw.bytes / 1048576.0, 1e3 * sw.seconds,
                   sw.rounds ? 1e3 * sw.seconds / sw.rounds : 0.0);
    }
    if (!k->neuron_fast || k->neuron_active <= 0.0f) return;
    printf("hot neurons against those active in this run (|act| > %g), per layer:\n"
           "layer  hot neurons   tokens    recall precision\n", k->neuron_active);
    long long hit = 0, active = 0, slots = 0;
    for (int l = 0; l < n_layer; l++) {
        qi_engine_neuron_rp rp;
        if (!qi_engine_neuron_stats(e, l, &rp)) continue;
        printf("%5d %12d %8ld", l, rp.n_fast, rp.tokens);
        print_rp(rp.active ? (double)rp.hit / (double)rp.active : NAN);
        print_rp(rp.n_fast && rp.tokens ? (double)rp.hit / ((double)rp.tokens * rp.n_fast) : NAN);
        printf("\n");
        hit += rp.hit;
        active += rp.active;
        slots += (long long)rp.tokens * rp.n_fast;
    }
    printf("total: recall %.3f, precision %.3f\n", active ? (double)hit / (double)active : NAN,
           slots ? (double)hit / (double)slots : NAN);
}

qi_status qi_cli_neuron_prepare(const char *cmd, qi_cli_kv *k, const qi_model *m, int batch, qi_err *err) {
    if (k->sim_cold_density > 0.0 && !k->sim)
        return QI_ERR(err, QI_ERR_INVALID, "option --sim-cold-density is a what-if of a simulated machine (--sim); "
                      "on a real one, cats on the CPU's neurons: --sparsity S --sparsity-mode cats");
    if (!k->neuron_policy) {
        if (k->neuron_profile || k->neuron_budget || k->neuron_active > 0.0f || k->neuron_swap_every ||
            k->neuron_swap_worker || k->neuron_swap_stream)
            return QI_ERR(err, QI_ERR_INVALID, "option %s without --neuron-policy",
                          k->neuron_profile ? "--neuron-profile" : k->neuron_budget ? "--neuron-budget"
                          : k->neuron_active > 0.0f ? "--neuron-active"
                          : k->neuron_swap_every    ? "--neuron-swap-every"
                          : k->neuron_swap_worker   ? "--neuron-swap-worker"
                                                    : "--neuron-swap-stream");
        return QI_OK;
    }
    if (!k->neuron_profile || !k->neuron_budget)
        return QI_ERR(err, QI_ERR_INVALID, "--neuron-policy needs --neuron-profile FILE (or uniform) and "
                      "--neuron-budget BYTES or P%%");
    if (!k->devices || !strchr(k->devices, ','))
        return QI_ERR(err, QI_ERR_INVALID, "--neuron-policy puts the hot neurons on the second device of --devices, "
                      "and there is none (cpu,cuda; cpu,testdev; with --sim, cpu,gpu)");
    /* qinfer:ratio=auto: the speed ratio calibrated on the devices first */
    char spec[512];
    snprintf(spec, sizeof spec, "%s", k->neuron_policy);
    char *at = strstr(spec, "ratio=auto");
    if (at) {
        qi_engine_opts o;
        qi_engine_opts_default(&o);
        qi_cli_kv_apply(k, &o);
        o.max_seqs = batch < 1 ? 1 : batch;
        o.n_ctx = 16;
        o.step_tokens = 16;
        o.sparsity = NULL;
        qi_engine *eng = NULL;
        double ratio = NAN;
        qi_status cst = qi_engine_create(m, &o, &eng, err);
        if (!cst) cst = qi_neuron_calibrate(qi_engine_neuron_time, eng, m->hp.n_ff, o.max_seqs, 7, &ratio, err);
        qi_engine_free(eng);
        if (cst) {
            qi_err_prefix(err, "calibrating the neuron speed ratio");
            return cst;
        }
        char rest[512];
        snprintf(rest, sizeof rest, "%s", at + strlen("ratio=auto"));
        snprintf(at, sizeof spec - (size_t)(at - spec), "ratio=%.4g%s", ratio, rest);
        fprintf(stderr, "qinfer %s: neuron speed ratio calibrated: %.4g (seconds per neuron of up and down at batch %d, "
                "the cpu's over the second device's)\n", cmd, ratio, o.max_seqs);
    }
    qi_neuron_split sp;
    qi_status st = qi_neuron_split_make(m, spec, k->neuron_profile, k->neuron_budget, &sp, err);
    if (st) return st;
    if (k->neuron_swap_worker && !k->neuron_swap_every) {
        st = QI_ERR(err, QI_ERR_INVALID, "option --neuron-swap-worker needs --neuron-swap-every N (how often the "
                    "worker is fed the activity)");
    } else if (k->neuron_swap_stream && !k->neuron_swap_worker) {
        st = QI_ERR(err, QI_ERR_INVALID, "option --neuron-swap-stream says where the background worker uploads, and "
                    "there is none (--neuron-swap-worker)");
    } else if (k->neuron_swap_every && !sp.has_live) {
        st = QI_ERR(err, QI_ERR_INVALID, "option --neuron-swap-every: swapping is the qinfer policy's, and the policy "
                    "is %s", sp.policy);
    } else {
        fprintf(stderr, "qinfer %s: neuron split %s: %d of %d units of %d neurons (%.1f MiB, %.1f%% of the FFN) on the "
                "second device, holding %.1f%% of the %s activity\n", cmd, sp.policy, sp.n_fast, sp.n_layer * sp.n_units,
                sp.unit, sp.bytes / 1048576.0, sp.ffn_bytes ? 100.0 * (double)sp.bytes / (double)sp.ffn_bytes : 0.0,
                sp.mass > 0 ? 100.0 * sp.mass_fast / sp.mass : 0.0,
                strcmp(k->neuron_profile, "uniform") ? "profiled" : "(uniform)");
        qi_free(k->neuron_fast);
        qi_free(k->neuron_act);
        k->neuron_fast = sp.fast; /* handed over */
        k->neuron_act = sp.activity;
        k->neuron_live = sp.live;
        sp.fast = NULL;
        sp.activity = NULL;
    }
    qi_neuron_split_fini(&sp);
    return st;
}

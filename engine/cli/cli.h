/* cli.h - shared pieces of the qinfer subcommands: strict flag parsing and
 * one-line error reporting. Every value is checked in full (no trailing
 * garbage, range-checked); a bad flag is exit code 2, a runtime failure 1. */
#ifndef QI_CLI_H
#define QI_CLI_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "qinfer/engine.h"
#include "qinfer/params.h"
#include "qinfer/sparsity.h"
#include "qinfer/status.h"
#include "cuda/cupti.h"
#include "neuron/neuron_live.h"

/* Layers a command's --sparsity thresholds hold at most. */
#define QI_CLI_MAX_LAYERS 512

#define QI_EXIT_RUNTIME 1
#define QI_EXIT_USAGE 2

typedef struct {
    const char *cmd; /* "generate" */
    int argc;
    char **argv;
    int i;           /* next argv index */
    const char *flag; /* current flag */
    bool failed;
} qi_args;

void qi_args_init(qi_args *a, const char *cmd, int argc, char **argv);
/* Next flag, or NULL at the end. Positional arguments are returned too
 * (they do not start with '-'). */
const char *qi_args_next(qi_args *a);
bool qi_args_is(const qi_args *a, const char *short_name, const char *long_name);
/* The current flag's value (the next argv element); reports a missing value. */
const char *qi_args_str(qi_args *a);
bool qi_args_int(qi_args *a, long lo, long hi, int *out);
bool qi_args_u64(qi_args *a, uint64_t *out);
bool qi_args_float(qi_args *a, double lo, double hi, float *out);
/* Report an unknown flag or unexpected positional argument. */
void qi_args_unknown(qi_args *a);

/* "qinfer CMD: message" on stderr. */
void qi_cli_error(const char *cmd, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
/* Report a failed status (message from err) and return the exit code. */
int qi_cli_fail(const char *cmd, const qi_err *err);

double qi_now_s(void);

/* -o: the human format (named human: "md" or "text"), csv or json. */
typedef enum { QI_OUT_HUMAN = 0, QI_OUT_CSV, QI_OUT_JSON } qi_out_format;
/* Parse an -o value; a bad one is reported (naming the three choices) and
 * gives false. */
bool qi_cli_output_format(const char *cmd, const char *arg, const char *human, qi_out_format *out);

/* s as a quoted CSV field (json false: "" doubles a quote) or JSON string
 * (json true: '"' and '\\' escaped, control characters as \u00XX), to f;
 * the one quoting of the CLI's outputs. qi_cli_print_quoted: to stdout. */
void qi_cli_fput_quoted(FILE *f, const char *s, bool json);
void qi_cli_print_quoted(const char *s, bool json);

/* The KV policy flags every engine command takes:
 *   --kv-policy NAME      full (default), window, streaming, h2o, qinfer, tova,
 *                         scissorhands, keyformer, snapkv (policies/kv/README.md)
 *   --kv-budget B         working tokens per (layer, KV head): N tokens, P%
 *                         or a fraction 0.F of the sequence's length
 *   --kv-param K=V[,...]  the policy's parameters (repeatable) */
typedef struct {
    const char *policy;
    qi_params params;
    int budget_tokens;
    double budget_frac;
    const char *devices;   /* --devices, with --gpu-mem's cap on cuda (NULL: cpu) */
    const char *devices_arg; /* --devices as given */
    const char *gpu_mem;   /* --gpu-mem BYTES (NULL: none) */
    char devices_buf[256]; /* devices when --gpu-mem rewrote it */
    const char *placement; /* --placement (NULL: all-cpu) */
    bool policy_ok;        /* the command runs policy: placements (qi_cli_place_policy_allow) */
    const char *sim;       /* --sim PROFILE (NULL: the real devices) */
    qi_params sim_params;  /* --sim-param K=V[,...] */
    const char *sim_cal;   /* --sim-cal FILE (NULL: none) */
    bool sim_ok;           /* the command takes --sim (qi_cli_sim_allow) */
    /* activation sparsity (qinfer/sparsity.h):
     *   --sparsity S          the share of activations zeroed (0: dense)
     *   --sparsity-mode M     teal (default) or cats
     *   --sparsity-calib FILE the calibration (qinfer profile --sparsity-out)
     *   --sparse-max-density D  sparse matmuls where at most D of a
     *                         matrix's columns are active (default 0.6) */
    double sparsity;
    bool sparsity_given;
    const char *sparsity_mode, *sparsity_calib;
    double sparse_max_density;
    qi_sparsity sp;        /* its thresholds, loaded by qi_cli_kv_check */
    float sp_thr[QI_CLI_MAX_LAYERS * QI_SITE_COUNT];
    /* the FFN neuron split (policies/neuron/, the engine's neuron_fast):
     *   --neuron-policy P     none, static or qinfer[:K=V,...]
     *   --neuron-profile F    a profile (qinfer profile -o), or "uniform"
     *   --neuron-budget B     the fast device's bytes for hot neurons:
     *                         BYTES (K, M, G) or P% of the FFN's bytes
     * the fast device is the second of --devices; qi_cli_neuron_prepare
     * runs the policy and keeps its mask here (qi_cli_kv_fini frees it) */
    const char *neuron_policy, *neuron_profile, *neuron_budget;
    float neuron_active;   /* --neuron-active T (ppl): count active neurons per side (0: no) */
    int neuron_swap_every; /* --neuron-swap-every N: the qinfer policy's swaps (0: none) */
    bool neuron_swap_worker; /* --neuron-swap-worker: those swaps made by a background thread */
    const char *neuron_swap_stream; /* --neuron-swap-stream copy|main: where the worker uploads (NULL: copy) */
    double sim_cold_density; /* --sim-cold-density D: with --sim, the cold side's share read (0: dense) */
    const char *sim_activity; /* --sim-activity SPEC: with --sim, the predictor-gated FFN's activity model */
    qi_neuron_live_opts neuron_live; /* its rule's options, from the policy */
    double *neuron_act;    /* [n_layer * units] each unit's activity per token (for the swaps) */
    bool neuron_ok;        /* the command takes them (qi_cli_neuron_allow) */
    uint8_t *neuron_fast;
} qi_cli_kv;

/* The placement flags, kept in the same struct and applied with it:
 *   --devices LIST      cpu (default), cpu,cuda[:BYTES] or cpu,testdev[:BYTES];
 *                       with --sim, cpu,gpu[:BYTES]
 *   --gpu-mem BYTES     the memory the engine may use on the GPU: --devices'
 *                       cuda becomes cuda:BYTES (alone: --devices cpu,cuda:BYTES)
 *   --sim PROFILE       run on the machine of a hardware profile, simulated
 *                       (engine/backend/sim/): commands that time (bench,
 *                       generate) take it; those that measure what the model
 *                       computes refuse it, since nothing is computed
 *   --sim-param K=V     the simulator's efficiencies and noise (repeatable)
 *   --sim-cal FILE      a calibration file (qinfer calibrate -o) under them
 *   --placement P       all-cpu (default), ngl=N, a plan file, or (generate)
 *                       policy:NAME[:K=V,...], a placement policy's plan
 *                       (policies/placement/) */
bool qi_cli_place_flag(qi_args *a, qi_cli_kv *k);
void qi_cli_place_help(void);
void qi_cli_sim_help(void); /* --sim and --sim-param, for the commands that take them */
/* A policy:NAME[:K=V,...] placement: the engine is created all-cpu on the
 * device list (qi_cli_kv_apply does that) and qi_cli_place_policy, called
 * right after qi_engine_create, runs the policy's plan for this workload
 * (batch sequences of prompt_len + gen_len tokens, the --kv-budget tokens
 * if given) through qi_placement_apply. Without one it does nothing.
 * Errors: an unknown policy or parameter (QI_ERR_INVALID), a plan that does
 * not fit (QI_ERR_NOMEM naming the device), the engine's. Commands that do
 * not call it refuse a policy: placement (QI_ERR_UNSUPPORTED). */
struct qi_engine;
struct qi_model;
qi_status qi_cli_place_policy(const qi_cli_kv *k, struct qi_engine *e, const struct qi_model *m, int batch,
                              int prompt_len, int gen_len, qi_err *err);
/* The commands that call qi_cli_place_policy say so before qi_cli_kv_apply. */
void qi_cli_place_policy_allow(qi_cli_kv *k);
/* The commands that take --sim say so before parsing their flags. */
void qi_cli_sim_allow(qi_cli_kv *k);
/* The commands that take the neuron split's flags say so before parsing,
 * and call qi_cli_neuron_prepare once the model is loaded (before
 * qi_cli_kv_apply): it checks the flags (a policy without a profile or a
 * budget, a profile of another shape), runs the policy over the model's
 * FFN in units of down's block (qi_engine_neuron_unit; the profile's
 * activity summed per unit, the budget in bytes), prints the split on
 * stderr and keeps its mask for the engine. qinfer:ratio=auto calibrates
 * the speed ratio first, at `batch` rows (the rows of the command's decode
 * steps: the serving batch). Without --neuron-policy it does nothing.
 * qi_cli_neuron_help prints the flags. */
void qi_cli_neuron_allow(qi_cli_kv *k);
struct qi_model;
qi_status qi_cli_neuron_prepare(const char *cmd, qi_cli_kv *k, const struct qi_model *m, int batch, qi_err *err);
void qi_cli_neuron_help(void);
/* With --neuron-swap-every: the swaps made; with --neuron-active (ppl):
 * the hot set's recall and precision per layer against the neurons active
 * in the run; on stdout. */
struct qi_engine;
void qi_cli_neuron_print_rp(const qi_cli_kv *k, const struct qi_engine *e, int n_layer);
void qi_cli_kv_fini(qi_cli_kv *k);
/* With --profile: the plan in force and each device's memory, on stderr. */
void qi_cli_print_plan(const char *cmd, const struct qi_engine *e);

void qi_cli_kv_init(qi_cli_kv *k);
/* If the current flag is one of the KV flags, consume its value (reporting a
 * bad one) and return true. */
bool qi_cli_kv_flag(qi_args *a, qi_cli_kv *k);
/* Copy the choice into engine options (k must outlive o's use). */
void qi_cli_kv_apply(const qi_cli_kv *k, qi_engine_opts *o);
/* A budget given to a policy that keeps every token on every one of the
 * model's n_layer layers (full) would be ignored while the run's header
 * says "budget 50%": QI_ERR_INVALID naming the policies that take one.
 * Anything else (no budget, a budgeted policy, parameters the policy
 * rejects, which the engine reports) is QI_OK. With --sparsity it loads
 * the thresholds (--sparsity-calib, required) for the model's layers. */
qi_status qi_cli_kv_check(qi_cli_kv *k, int n_layer, qi_err *err);
/* "h2o, budget 50%" / "full" for headers. */
void qi_cli_kv_describe(const qi_cli_kv *k, char *buf, size_t n);
/* Help lines for the flags, and the list of policies with their parameters. */
void qi_cli_kv_help(void);

/* --repack's help line (the engine's repack option); the model loader the
 * commands share: path loaded, and with repack a note of the matrices
 * that have no packed form. */
#define QI_CLI_REPACK_HELP                                                                       \
    "      --repack          repack q4_0/q4_1/q5_0/q5_1/q8_0 matrices into 16-row groups:\n" \
    "                        faster, batched above all, but summed in another order\n"     \
    "                        than llama.cpp's (logits differ in the last bits); with\n"  \
    "                        the AMX kernels also q4_K/q6_K, unpacked into the tiles'\n" \
    "                        int8 form beside the file's rows (3.7x their bytes\n" \
    "                        more): 8+ tokens run from it, fewer read the rows, same\n"  \
    "                        results as without\n"
qi_status qi_cli_load_model(const char *path, bool repack, qi_model **m, qi_err *err);

/* An op profile (qi_engine_profile, or a part of one) as one stderr line:
 * "qinfer CMD: profile [of LABEL ]over N steps, T s: matmul X% ...". */
void qi_cli_print_profile(const char *cmd, const char *label, const qi_engine_prof *pr);

/* --cupti (generate, bench): the GPU's own records of its kernels and
 * copies (CUPTI's Activity API, cuda/cupti.h) over the run, beside the
 * CUDA device's event timing of the same span. It needs a CUDA device in
 * the run: qi_cli_cupti_check reports a --devices list without one (false:
 * a usage error). qi_cli_prof_since makes *pr the part of a profile taken
 * after `before`. qi_cli_print_cupti prints, on stderr, CUPTI's totals
 * (kernels, memcpys by direction, counts), the engine's event-based totals
 * of its CUDA devices (qi_engine_prof's per-device spans, copies and ops)
 * and the ratio of the two. */
#define QI_CLI_CUPTI_HELP                                                                        \
    "      --cupti           record every kernel and memcpy on the GPU with CUPTI and print\n"   \
    "                        their totals beside the CUDA device's event timing of the same\n"  \
    "                        span, and the ratio (needs cuda in --devices; turns on the\n"      \
    "                        engine's op timing)\n"
bool qi_cli_cupti_check(const char *cmd, const qi_cli_kv *k);
void qi_cli_prof_since(qi_engine_prof *pr, const qi_engine_prof *before);
void qi_cli_print_cupti(const char *cmd, const char *label, const struct qi_engine *e, const qi_engine_prof *pr,
                        const qi_cupti_totals *ct);

int qi_cmd_generate(int argc, char **argv);
int qi_cmd_ppl(int argc, char **argv);
int qi_cmd_inspect(int argc, char **argv);
int qi_cmd_tokenize(int argc, char **argv);
int qi_cmd_bench(int argc, char **argv);
int qi_cmd_sysinfo(int argc, char **argv);
int qi_cmd_agree(int argc, char **argv);
int qi_cmd_needle(int argc, char **argv);
int qi_cmd_run(int argc, char **argv);
int qi_cmd_lua(int argc, char **argv);
int qi_cmd_submit(int argc, char **argv);
int qi_cmd_results(int argc, char **argv);
int qi_cmd_synth(int argc, char **argv);
int qi_cmd_serve(int argc, char **argv);
int qi_cmd_load(int argc, char **argv);
int qi_cmd_calibrate(int argc, char **argv);
int qi_cmd_calibrate_published(int argc, char **argv); /* calibrate --published (cmd_simpub.c) */
int qi_cmd_sim_validate(int argc, char **argv);
int qi_cmd_profile(int argc, char **argv);
int qi_cmd_neuron(int argc, char **argv);

#endif

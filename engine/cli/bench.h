/* bench.h - the pieces of `qinfer bench` (private to the CLI): the command
 * (cmd_bench.c) parses and checks the flags, loads the model, labels the
 * machine and lists the tests; the runner (bench_run.c) times them; the
 * report (bench_report.c) prints them as md, csv or json; bench_db.c adds
 * them to a results database.
 *
 * A test is one row of the table: pp<N> and tg<N> on a qi_ctx, as
 * llama-bench measures them, or tg<N> @ b<B> in the batched engine. The
 * runner fills its rates; bench_info holds everything a row says besides
 * its test (the machine, the model, the bandwidth, peak RSS), filled by the
 * command once the tests have run, since peak RSS is known only then.
 */
#ifndef QI_BENCH_H
#define QI_BENCH_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "cli.h"
#include "placement/placement_policy.h"
#include "qinfer/engine.h"
#include "qinfer/model.h"
#include "qinfer/params.h"
#include "qinfer/status.h"
#include "qinfer/sysinfo.h"

#define BENCH_MAX_BATCHES 16 /* sizes in one --batch list */
#define BENCH_MAX_BATCH 256  /* sequences in one batched test */
#define BENCH_PROMPT 4       /* prompt tokens of each sequence of a batched test, by default */
#define BENCH_MAX_TESTS (2 + BENCH_MAX_BATCHES)
#define BENCH_PROBE_PASSES 5 /* passes of the bandwidth probe; the best counts */

/* One row: what it runs, and (after bench_run_test) its rates. */
typedef struct {
    char name[32]; /* "pp512", "tg128 @ b16" */
    int n_prompt, n_gen;
    int batch;     /* sequences decoded at once (1 for the qi_ctx tests) */
    int depth;     /* batched tests: each sequence's prompt tokens before the steps */
    bool engine;   /* run in the batched engine */
    int n_reps;
    double *ts; /* [n_reps] tokens/s */
    double *secs; /* [n_reps] seconds of each repetition's timed part (in ts's allocation) */
    double mean, sd;
    /* --vs-dense: every pair's sparse / dense step time over the
     * repetitions, and each side's seconds and steps */
    double *ab_ratio;
    int ab_pairs;
    double ab_s[2];
    int ab_steps[2];
} bench_test;

/* What the tests run on: the qi_ctx for pp/tg, or the engine of a batched
 * test with its live sequences. The command owns every pointer. */
typedef struct {
    const qi_model *m;
    qi_ctx *ctx;
    int32_t *toks; /* [max(n_prompt, depth x largest batch)] */
    qi_engine *eng;
    qi_engine_prof prof; /* --profile: the timed decode steps of a batched test's repetitions */
    /* --placement policy:NAME: the policy, planning for each batched run's
     * workload before its prompts and shown the block times before every
     * step (qi_placement_ctl_tick) */
    qi_placement_policy *policy;
    qi_placement_ctl ctl;
    int kv_budget;
    long replans;
    bool cupti; /* --cupti: CUPTI's records of each test's repetitions beside the events' */
    bool vs_dense; /* --vs-dense: the batched rows' steps alternate with the dense path */
} bench_runner;

/* t's n_warmup untimed runs, then its n_reps timed ones (progress on
 * stderr); fills t->ts, t->secs, t->mean, t->sd and, with --vs-dense, the
 * pairs. A batched test needs r->eng, the others r->ctx. Errors: the
 * engine's, CUPTI's. */
qi_status bench_run_test(bench_runner *r, bench_test *t, int n_warmup, qi_err *err);

/* Everything a row says besides its test. */
typedef struct {
    qi_sysinfo hw;
    uint64_t llc_bytes;  /* 0 if unknown */
    char gpu[256];       /* the GPU name, or "none" */
    char desc[96];       /* "llama 135M Q4_1" */
    char name[128];      /* general.name, or "" */
    const char *path;
    char sha256[65];     /* "" unless computed */
    uint64_t model_size, n_params, bytes_tok;
    const char *kernels; /* "avx512" */
    char backend[80];    /* "CPU (avx512)", "SIM a100-pcie-2xeon" */
    int n_threads, n_layer;
    double bw_gbs;       /* -1: not measured */
    uint64_t probe_bytes;
    long peak_rss;       /* bytes */
    char timestamp[32];
    char kv_desc[160];   /* the batched rows' KV policy: "full", "h2o, budget 50%" */
    bool attn_blas;      /* --attn-blas */
    char sim[64];        /* the simulated machine's profile name ("": measured on this host) */
    const char *sim_cal; /* its calibration file (--sim-cal; NULL: none) */
} bench_info;

/* bi's model columns (desc, name, model_size, n_params, n_layer) and the
 * bytes of weights one decoded token reads (bytes_tok), from m. */
void bench_info_set_model(bench_info *bi, const qi_model *m);
/* The KV policy a row ran with: the qi_ctx keeps every token. */
const char *bench_row_kv(const bench_info *bi, const bench_test *t);
/* Decode's share of the bandwidth roofline for a tg test; NAN otherwise. */
double bench_roofline_share(const bench_info *bi, const bench_test *t);

/* The report, on stdout: the markdown table with the roofline lines, or
 * one CSV line / JSON object per row (QI_OUT_CSV, QI_OUT_JSON). */
void bench_print_md(const bench_info *bi, const bench_test *tests, int n_tests);
void bench_print_rows(qi_out_format fmt, const bench_info *bi, const bench_test *tests, int n_tests);
/* --vs-dense's line for a batched row that has pairs (to stdout under md,
 * else stderr, so that csv and json keep their fields); nothing otherwise. */
void bench_print_vs_dense(FILE *f, const bench_test *t);

#ifdef QI_HAVE_SQLITE
#include "harness/db.h"

#define BENCH_EXPERIMENT "bench"

/* The command's settings a --db row records besides bench_info. */
typedef struct {
    bool repack;
    int n_warmup;
    const char *devices, *placement; /* NULL: the defaults */
    const qi_params *sim_params;     /* with a simulated machine */
    const char *sim_cal;             /* its calibration file (NULL: none) */
} bench_settings;

/* Open (creating or migrating) the results database `file` and its
 * experiment "bench" (*exp), before the tests, so that a bad path fails
 * before minutes of benchmarking. A file holding the older bench table is
 * refused (QI_ERR_DB); else the database's errors. */
qi_status bench_db_open(const char *file, qi_db **out, int64_t *exp, qi_err *err);
/* Each row one run of experiment exp, its rates one metric per repetition.
 * Errors: QI_ERR_NOMEM, the database's. */
qi_status bench_db_insert(qi_db *db, int64_t exp, const bench_info *bi, const bench_test *tests, int n_tests,
                          const bench_settings *bs, qi_err *err);
#endif

#endif

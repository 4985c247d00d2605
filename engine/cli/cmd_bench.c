/* cmd_bench.c - `qinfer bench`: prompt-processing and decode throughput, as
 * llama-bench measures them, plus where decode stands against memory
 * bandwidth.
 *
 * Tests follow llama-bench so the two tables can be read side by side:
 *   pp<N>  one qi_ctx_eval of N random token ids on an emptied context (BOS
 *          first when the model adds one), logits for the last token only;
 *   tg<N>  N single-token evals with logits, after one untimed warm-up token
 *          on an emptied context (llama-bench times its first token too; one
 *          position of difference is noise).
 *   tg<N> @ b<B>  (--batch) the batched engine (qi_engine) with B sequences
 *          at once: each gets a distinct prompt of --depth tokens (default
 *          BATCH_PROMPT; BOS first), untimed, then N steps that each feed one
 *          random token to
 *          every sequence; the rate is aggregate, B * N / seconds, and the
 *          per-sequence rate is that over B. The plain pp/tg rows keep using
 *          qi_ctx, so a list with 1 in it gives tg<N> @ b1 too: the engine's
 *          own single-sequence baseline. The KV policy flags apply to these
 *          rows only (qi_ctx has no policy). Each batch size gets its own
 *          engine, sized for B sequences of depth + N positions, made
 *          after the qi_ctx is freed so two thread pools never compete.
 * Each repetition gives tokens / seconds; the table shows the mean and the
 * sample standard deviation of those rates, as llama-bench does. --warmup N
 * runs each test N times untimed first (page-in of the mapped weights, cold
 * caches, the pool's first wake-up).
 *
 * Decode of a small batch streams every weight once per token, so its ceiling
 * is bytes of weights per token / memory bandwidth. The bandwidth is measured
 * here, not looked up: a STREAM-like read of a buffer several times the
 * last-level cache, with the benchmark's thread count, best of several passes;
 * integer sums, because the build forbids reassociating float sums and an
 * unvectorised float loop would measure the adder, not memory.
 * qi_sysinfo_get_apart (sysinfo.c) runs it in a forked child before the
 * thread pool exists, so its buffer
 * never counts in this process's peak RSS (getrusage of the process itself;
 * the child is a separate process and is waited for before the tests). The
 * same child fills the hardware label (qi_sysinfo, shared with every other
 * figure the harness records): in a CUDA build that query starts the CUDA
 * runtime, whose threads and memory would otherwise stay in the benchmarked
 * process and blur the comparison with a CPU-only llama-bench.
 *
 * Results are collected and printed at the end (md, csv or json), since peak
 * RSS is known only then; progress goes to stderr meanwhile. --db adds each
 * row as a run of experiment "bench" to a results database (the schema of
 * results/README.md, shared with `qinfer run`: `qinfer results bench` reads
 * it), each repetition's rate a metric under the names every figure uses
 * (decode.tokens_per_s, prefill.tokens_per_s; the batch a configuration
 * parameter). The batched rows' rate is qi_measure_decode's, the function
 * Lua's qinfer.throughput runs too. SQLite is optional at build time
 * (QI_HAVE_SQLITE), and without it --db is refused before anything runs.
 *
 * --attn-blas runs prompts' attention through OpenBLAS sgemm (qi_ctx and the
 * engine alike). Only the pp row has prompts of more than one token (the tg
 * rows' steps and the batched rows' timed steps are one token per sequence),
 * so it is the row the option changes; every row records the setting, and
 * the markdown header says so with the core OpenBLAS chose, since a
 * misdetected core changes the figure several times over.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "blas.h"
#include "cli.h"
#include "placement/placement_policy.h"
#include "kernels.h"
#include "qinfer/model_files.h"
#include "qinfer/engine.h"
#include "qinfer/hwprofile.h"
#include "qinfer/measure.h"
#include "qinfer/model.h"
#include "qinfer/sysinfo.h"
#include "sha256.h"
#include "threadpool.h"

#ifdef QI_HAVE_SQLITE
#include <sqlite3.h>

#include "harness/db.h"
#endif

#define MAX_BATCHES 16  /* sizes in one --batch list */
#define MAX_BATCH 256   /* sequences in one batched test */
#define BATCH_PROMPT 4  /* prompt tokens of each sequence of a batched test, by default */
#define BENCH_MAX_TESTS (2 + MAX_BATCHES)
#define PROBE_PASSES 5

typedef qi_out_format out_format;
#define OUT_MD QI_OUT_HUMAN
#define OUT_CSV QI_OUT_CSV
#define OUT_JSON QI_OUT_JSON

static void help(void) {
    printf(
        "usage: qinfer bench [-m MODEL] [-p N] [-n N] [-t N] [-r N] [-b LIST] [options]\n\n"
        "Measure prompt processing (pp<N>) and decode (tg<N>) throughput as llama-bench\n"
        "does, batched decode (tg<N> @ b<B>) in the batched engine, the machine's memory\n"
        "read bandwidth, the bytes of weights read per decoded token and decode's share\n"
        "of that bandwidth roofline.\n\n"
        "  -m, --model MODEL     GGUF path or cached short name (default smollm2-135m)\n"
        "  -p, --n-prompt N      prompt tokens for the pp test (default 512; 0 = no pp test)\n"
        "  -n, --n-gen N         decoded tokens for the tg test (default 128; 0 = no tg test)\n"
        "  -b, --batch LIST      batch sizes, a comma list of 1..%d (default none: no\n"
        "                        batched rows); each size B adds a tg<N> @ b<B> row: B\n"
        "                        sequences with a prompt of --depth tokens each, then N\n"
        "                        steps of one token for every sequence (-b 1: tg<N> @ b1,\n"
        "                        the batched engine's batch-1 row)\n"
        "  -d, --depth N         prompt tokens of each sequence of the batched rows, run\n"
        "                        untimed before the steps (default %d); rows then read\n"
        "                        tg<N> @ b<B> d<N> when N is not the default. A KV\n"
        "                        policy's budget applies from the prompt on\n"
        "  -t, --threads N       worker threads (default: physical cores)\n"
        "  -r, --repetitions N   timed runs of each test (default 5)\n"
        "      --warmup N        untimed runs of each test first (default 1)\n"
        "  -o, --output FMT      md (default), csv or json, to stdout\n"
        "      --db FILE         also add each row as a run of experiment 'bench' to a results\n"
        "                        database (results/README.md; read with qinfer results bench)%s\n"
        "      --probe-mib N     bandwidth probe buffer in MiB (default: 4x the last-level\n"
        "                        cache, at least 512; 0 = skip the probe)\n"
        QI_CLI_REPACK_HELP
        "                        (the backend column then reads \"CPU (<kernels>, packed)\")\n"
        "      --attn-blas       prompts' attention through OpenBLAS sgemm (the pp row):\n"
        "                        faster, but not bit-exact with llama.cpp (needs libopenblas0)\n"
        "      --profile         time every op of the batched rows' timed decode steps (not\n"
        "                        the prompts, not the warm-up) and print each row's shares\n"
        "                        to stderr; the timers cost a little\n"
        QI_CLI_CUPTI_HELP
        "                        (each row's timed repetitions, not its warm-up)\n"
        "      --vs-dense        with --sparsity: each batched row's steps alternate between\n"
        "                        the sparse path and the dense one in the same engine (in\n"
        "                        pairs, the order turned each pair), and a line gives the\n"
        "                        median sparse / dense step time over the pairs with its\n"
        "                        quartiles: a comparison the machine's drift does not blur.\n"
        "                        The row's t/s is then its sparse steps'\n"
        "  -h, --help            this help\n\n"
        "The KV cache, activation sparsity and neuron split of the batched rows (the pp/tg\n"
        "rows keep every token and run dense and unsplit; -b 1 gives a batch-1 row, tg@b1,\n"
        "that takes them):\n",
        MAX_BATCH, BATCH_PROMPT,
#ifdef QI_HAVE_SQLITE
        ""
#else
        "\n                        (unavailable: this qinfer was built without SQLite)"
#endif
    );
    qi_cli_kv_help();
    qi_cli_place_help();
    qi_cli_neuron_help();
    qi_cli_sim_help();
    printf("\nt/s is the mean +- sample standard deviation over the repetitions; for a batched\n"
           "row it is the aggregate, B x N tokens / seconds of the N steps, and the\n"
           "per-sequence rate is that / B. Progress goes to stderr. Peak RSS is this\n"
           "process's getrusage maximum (the bandwidth probe runs in a child process and is\n"
           "not included).\n");
}

/* ---- the model ------------------------------------------------------------------ */

/* llama.cpp's names for general.file_type (enum llama_ftype). */
static const char *ftype_name(int64_t ft) {
    static const struct {
        int id;
        const char *name;
    } k[] = {{0, "all F32"}, {1, "F16"},     {2, "Q4_0"},    {3, "Q4_1"},    {7, "Q8_0"},
             {8, "Q5_0"},    {9, "Q5_1"},    {10, "Q2_K"},   {11, "Q3_K_S"}, {12, "Q3_K_M"},
             {13, "Q3_K_L"}, {14, "Q4_K_S"}, {15, "Q4_K_M"}, {16, "Q5_K_S"}, {17, "Q5_K_M"},
             {18, "Q6_K"},   {32, "BF16"}};
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
        if (k[i].id == ft) return k[i].name;
    return NULL;
}

/* "llama 135M Q4_1": architecture, size label, file type (what is known),
 * and "synthetic" for random weights (qinfer synth). */
static void model_desc(const qi_model *m, char *out, size_t cap) {
    qi_str label;
    int64_t ft;
    size_t n = (size_t)snprintf(out, cap, "%s", m->hp.arch_name);
    if (n < cap && qi_gguf_get_str(m->gguf, "general.size_label", &label) && label.len)
        n += (size_t)snprintf(out + n, cap - n, " %.*s", (int)(label.len < 32 ? label.len : 32), label.ptr);
    if (n < cap && qi_gguf_get_i64(m->gguf, "general.file_type", &ft)) {
        const char *name = ftype_name(ft);
        if (name) n += (size_t)snprintf(out + n, cap - n, " %s", name);
        else n += (size_t)snprintf(out + n, cap - n, " ftype %lld", (long long)ft);
    }
    bool synthetic = false;
    if (n < cap && qi_gguf_get_bool(m->gguf, "qinfer.synthetic", &synthetic) && synthetic)
        snprintf(out + n, cap - n, " synthetic");
}

static uint64_t weight_bytes(const qi_weight *w) { return (uint64_t)w->n_rows * w->row_bytes; }

/* Bytes of weights one decoded token reads: every layer's matrices and norms,
 * the final norm, the whole output head and one embedding row. */
static uint64_t bytes_per_token(const qi_model *m) {
    uint64_t b = m->tok_embd.row_bytes + weight_bytes(&m->out_norm) + weight_bytes(&m->output);
    for (int l = 0; l < m->hp.n_layer; l++) {
        const qi_layer *ly = &m->layers[l];
        const qi_weight *w[] = {&ly->attn_norm, &ly->wq, &ly->wk, &ly->wv, &ly->wo,
                                &ly->ffn_norm, &ly->w_gate, &ly->w_up, &ly->w_down};
        for (size_t i = 0; i < sizeof w / sizeof w[0]; i++) b += weight_bytes(w[i]);
    }
    return b;
}

/* ---- the tests -------------------------------------------------------------------- */

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

static uint64_t g_rng = 0x2545f4914f6cdd1dull;

static int32_t random_token(int n_vocab) {
    g_rng ^= g_rng >> 12;
    g_rng ^= g_rng << 25;
    g_rng ^= g_rng >> 27;
    return (int32_t)((g_rng * 0x2545f4914f6cdd1dull >> 33) % (uint64_t)n_vocab);
}

static int32_t first_token(const qi_model *m) {
    int32_t bos = qi_tokenizer_bos(m->tok);
    return qi_tokenizer_add_bos(m->tok) && bos >= 0 ? bos : random_token(m->hp.n_vocab);
}

/* What the tests run on: the qi_ctx for pp/tg, or the engine of a batched
 * test with its live sequences. */
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

static qi_status place_tick(void *ctx, qi_engine *e, int batch, int context, int left, qi_err *err) {
    bench_runner *r = ctx;
    const qi_placement_workload wl = {.batch = batch, .prompt_len = context, .gen_len = left, .kv_budget = r->kv_budget};
    const long before = r->ctl.replans;
    const qi_status st = qi_placement_ctl_tick(&r->ctl, e, r->m, &wl, NULL, err);
    r->replans += r->ctl.replans - before;
    return st;
}

/* acc += p. */
static void prof_add(qi_engine_prof *acc, const qi_engine_prof *p) {
    for (int k = 0; k < QI_OP_COUNT; k++) {
        acc->seconds[k] += p->seconds[k];
        acc->calls[k] += p->calls[k];
    }
    acc->matmul_bytes += p->matmul_bytes;
    acc->steps += p->steps;
}

/* One batched run, as qi_measure_decode defines it (Lua's qinfer.throughput
 * runs the same function): fresh sequences with distinct prompts (untimed
 * here), then n_gen steps of one random token each; *secs is the steps. */
static qi_status run_once_batch(bench_runner *r, bench_test *t, double *secs, qi_err *err) {
    const int V = r->m->hp.n_vocab;
    for (int b = 0; b < t->batch; b++) {
        int32_t *p = r->toks + (size_t)b * (size_t)t->depth;
        p[0] = first_token(r->m);
        for (int i = 1; i < t->depth; i++) p[i] = random_token(V);
    }
    const bool ab = r->vs_dense && t->ab_ratio; /* a timed repetition, not the warm-up */
    const qi_decode_opts o = {.batch = t->batch, .n_gen = t->n_gen, .prompts = r->toks, .n_prompt = t->depth,
                              .prompt_stride = t->depth, .greedy = false, .seed = random_token(V) + 1u,
                              .tick = r->policy ? place_tick : NULL, .tick_ctx = r, .ab_dense = r->vs_dense,
                              .ab_ratio = ab ? t->ab_ratio + t->ab_pairs : NULL};
    if (r->policy) qi_placement_ctl_init(&r->ctl, r->policy, 2.0); /* each run plans afresh, the policy keeps what it learnt */
    qi_decode_result res;
    qi_status st = qi_measure_decode(r->eng, r->m, &o, &res, err);
    if (st) return st;
    *secs = res.decode_s;
    if (r->vs_dense) { /* the row's rate is the sparse steps' */
        *secs = res.ab_s[0] * t->n_gen / (res.ab_steps[0] ? res.ab_steps[0] : 1);
        if (ab) {
            t->ab_pairs += res.ab_pairs;
            for (int k = 0; k < 2; k++) {
                t->ab_s[k] += res.ab_s[k];
                t->ab_steps[k] += res.ab_steps[k];
            }
        }
    }
    prof_add(&r->prof, &res.prof);
    return QI_OK;
}

/* One run of a test on an emptied context; *secs is the timed part. */
static qi_status run_once(bench_runner *r, bench_test *t, double *secs, qi_err *err) {
    if (t->engine) return run_once_batch(r, t, secs, err);
    const qi_model *m = r->m;
    qi_ctx *ctx = r->ctx;
    int32_t *toks = r->toks;
    const int V = m->hp.n_vocab;
    qi_ctx_reset(ctx);
    qi_status st;
    if (t->n_prompt > 0) {
        toks[0] = first_token(m);
        for (int i = 1; i < t->n_prompt; i++) toks[i] = random_token(V);
        double t0 = qi_ctx_now(ctx);
        st = qi_ctx_eval(ctx, toks, t->n_prompt, false, err);
        *secs = qi_ctx_now(ctx) - t0;
        return st;
    }
    int32_t tok = first_token(m);
    if ((st = qi_ctx_eval(ctx, &tok, 1, false, err))) return st; /* the warm-up token */
    double t0 = qi_ctx_now(ctx);
    for (int i = 0; i < t->n_gen; i++) {
        tok = random_token(V);
        if ((st = qi_ctx_eval(ctx, &tok, 1, false, err))) return st;
    }
    *secs = qi_ctx_now(ctx) - t0;
    return QI_OK;
}

static qi_status run_test(bench_runner *r, bench_test *t, int n_warmup, qi_err *err) {
    const char *cmd = "bench";
    double n_tok = t->n_prompt > 0 ? t->n_prompt : (double)t->n_gen * t->batch;
    double secs;
    double *ab_ratio = t->ab_ratio;
    t->ab_ratio = NULL; /* the warm-up's pairs are not kept */
    for (int i = 0; i < n_warmup; i++) {
        fprintf(stderr, "qinfer %s: %s warm-up %d/%d\n", cmd, t->name, i + 1, n_warmup);
        qi_status st = run_once(r, t, &secs, err);
        if (st) {
            t->ab_ratio = ab_ratio;
            return st;
        }
    }
    t->ab_ratio = ab_ratio;
    memset(&r->prof, 0, sizeof r->prof); /* the profile covers the timed repetitions */
    /* --cupti: CUPTI and the engine's events over the same repetitions */
    qi_engine *eng = r->eng ? r->eng : r->ctx ? qi_ctx_engine(r->ctx) : NULL;
    qi_engine_prof before;
    if (r->cupti && eng) {
        qi_engine_profile(eng, &before);
        qi_status st = qi_cupti_start(err);
        if (st) return st;
    }
    double sum = 0;
    for (int i = 0; i < t->n_reps; i++) {
        qi_status st = run_once(r, t, &secs, err);
        if (st && r->cupti && eng) { /* the recording ends with the test; the test's failure is the one reported */
            qi_cupti_totals ct;
            qi_err ignored = {0};
            qi_cupti_stop(&ct, &ignored);
        }
        if (st) return st;
        t->ts[i] = qi_measure_rate(n_tok, secs);
        t->secs[i] = secs;
        sum += t->ts[i];
        fprintf(stderr, "qinfer %s: %s run %d/%d: %.2f t/s (%.3f s)\n", cmd, t->name, i + 1, t->n_reps,
                t->ts[i], secs);
    }
    if (r->cupti && eng) {
        qi_cupti_totals ct;
        qi_status st = qi_cupti_stop(&ct, err);
        if (st) return st;
        qi_engine_prof pr;
        qi_engine_profile(eng, &pr);
        qi_cli_prof_since(&pr, &before);
        qi_cli_print_cupti(cmd, t->name, eng, &pr, &ct);
    }
    t->mean = sum / t->n_reps;
    double ss = 0;
    for (int i = 0; i < t->n_reps; i++) ss += (t->ts[i] - t->mean) * (t->ts[i] - t->mean);
    t->sd = t->n_reps > 1 ? sqrt(ss / (t->n_reps - 1)) : 0;
    return QI_OK;
}

/* ---- output ---------------------------------------------------------------------- */

/* --vs-dense's line for a batched row (to stdout under md, else stderr, so
 * that csv and json keep their fields). */
static void print_vs_dense(FILE *f, const bench_test *t) {
    if (!t->engine || t->ab_pairs < 1 || !t->ab_steps[0] || !t->ab_steps[1]) return;
    qi_measure_summary sm; /* sorts the ratios */
    qi_measure_summarize(t->ab_ratio, t->ab_pairs, &sm);
    const double sp = t->ab_s[0] / t->ab_steps[0], de = t->ab_s[1] / t->ab_steps[1];
    fprintf(f,
            "%s against its dense path (--vs-dense, steps alternating in one engine): a sparse step takes %.3fx "
            "a dense one (median of %ld pairs, quartiles %.3f-%.3f); mean step %.3f ms sparse, %.3f ms dense: "
            "%.3fx the dense rate\n",
            t->name, sm.median, sm.n, qi_measure_percentile(t->ab_ratio, sm.n, 25),
            qi_measure_percentile(t->ab_ratio, sm.n, 75), 1e3 * sp, 1e3 * de, sp > 0 ? de / sp : NAN);
}

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

/* The command's settings a --db row records besides bench_info. */
typedef struct {
    bool repack;
    int n_warmup;
    const char *devices, *placement; /* NULL: the defaults */
    const qi_params *sim_params;     /* with a simulated machine */
    const char *sim_cal;             /* its calibration file (NULL: none) */
} bench_settings;

/* The KV policy a row ran with: the qi_ctx keeps every token. */
static const char *row_kv(const bench_info *bi, const bench_test *t) { return t->engine ? bi->kv_desc : "full"; }

/* Decode's share of the bandwidth roofline for a tg test; NAN otherwise. A
 * step reads the weights once for all its sequences, so the weight traffic
 * is bytes per token x steps per second, the per-sequence rate. */
static double roofline_share(const bench_info *bi, const bench_test *t) {
    if (t->n_gen == 0 || bi->bw_gbs <= 0) return NAN;
    return (double)bi->bytes_tok * (t->mean / t->batch) / (bi->bw_gbs * 1e9);
}

/* The row a batched row is compared with: tg<N> @ b1 when it ran, else the
 * single-sequence tg<N>; NULL if neither. */
static const bench_test *batch_base(const bench_test *tests, int n_tests) {
    const bench_test *plain = NULL;
    for (int i = 0; i < n_tests; i++) {
        if (tests[i].n_gen == 0 || tests[i].batch != 1) continue;
        if (tests[i].engine) return &tests[i];
        plain = &tests[i];
    }
    return plain;
}

static void fmt_size(uint64_t b, char *out, size_t cap) {
    if (b < (1ull << 30)) snprintf(out, cap, "%.2f MiB", b / 1048576.0);
    else snprintf(out, cap, "%.2f GiB", b / 1073741824.0);
}

static void fmt_params(uint64_t n, char *out, size_t cap) {
    if (n < 1000000000ull) snprintf(out, cap, "%.2f M", n / 1e6);
    else snprintf(out, cap, "%.2f B", n / 1e9);
}

static void print_md(const bench_info *bi, const bench_test *tests, int n_tests) {
    char size[32], params[32];
    fmt_size(bi->model_size, size, sizeof size);
    fmt_params(bi->n_params, params, sizeof params);
    if (bi->sim[0]) {
        printf("SIMULATED machine %s: host %s, %d cores; GPU %s. No arithmetic ran: every figure below is the "
               "simulator's (engine/backend/sim/README.md), not a measurement",
               bi->sim, bi->hw.cpu_model, bi->hw.n_cores, bi->gpu);
        if (bi->sim_cal) printf(" (its parameters from %s)", bi->sim_cal);
    } else {
        printf("hardware: %s, %d physical cores (%d logical)", bi->hw.cpu_model, bi->hw.n_cores, bi->hw.n_threads);
    }
    if (bi->llc_bytes && !bi->sim[0]) printf(", last-level cache %.0f MiB", bi->llc_bytes / 1048576.0);
    if (!bi->sim[0]) printf("; GPU %s", bi->gpu);
    if (strcmp(bi->kv_desc, "full")) printf("\nKV policy of the batched rows: %s", bi->kv_desc);
    if (bi->attn_blas)
        printf("\nattention: OpenBLAS sgemm for prompts (core %s; not bit-exact with llama.cpp)",
               qi_blas_core()[0] ? qi_blas_core() : "unknown");
    const int bw = strlen(bi->backend) > 12 ? (int)strlen(bi->backend) : 12;
    char dashes[64];
    memset(dashes, '-', sizeof dashes);
    printf("\n\n| %-30s | %10s | %10s | %-*s | %7s | %13s | %20s |\n", "model", "size", "params", bw, "backend",
           "threads", "test", "t/s");
    printf("| ------------------------------ | ---------: | ---------: | %.*s | ------: | ------------: "
           "| -------------------: |\n", bw, dashes);
    for (int i = 0; i < n_tests; i++) {
        char ts[48];
        snprintf(ts, sizeof ts, "%.2f ± %.2f", tests[i].mean, tests[i].sd);
        /* "±" is two bytes but one column: pad by one more. */
        printf("| %-30s | %10s | %10s | %-*s | %7d | %13s | %21s |\n", bi->desc, size, params, bw, bi->backend,
               bi->n_threads, tests[i].name, ts);
    }
    printf("\n");
    if (bi->bw_gbs > 0)
        printf("memory read bandwidth: %.1f GB/s (%s; STREAM-like read of %.0f MiB, %d thread%s, best of %d)\n",
               bi->bw_gbs, bi->hw.cpu_model, bi->probe_bytes / 1048576.0, bi->n_threads, bi->n_threads == 1 ? "" : "s",
               PROBE_PASSES);
    else
        printf("memory read bandwidth: not measured\n");
    printf("weights read per decoded token: %.2f MiB (%.1f MB: %d layers' matrices and norms, the output head, "
           "one embedding row)\n",
           bi->bytes_tok / 1048576.0, bi->bytes_tok / 1e6, bi->n_layer);
    for (int i = 0; i < n_tests; i++) {
        double r = roofline_share(bi, &tests[i]);
        if (isnan(r)) continue;
        if (tests[i].engine)
            printf("%s: %.2f steps/s (weights read once per step) x %.1f MB = %.2f GB/s = %.1f%% of the measured "
                   "read bandwidth (%s, %d thread%s)\n",
                   tests[i].name, tests[i].mean / tests[i].batch, bi->bytes_tok / 1e6,
                   bi->bytes_tok * tests[i].mean / tests[i].batch / 1e9, 100 * r, bi->hw.cpu_model, bi->n_threads,
                   bi->n_threads == 1 ? "" : "s");
        else
            printf("%s: %.2f t/s x %.1f MB = %.2f GB/s = %.1f%% of the measured read bandwidth (%s, %d thread%s)\n",
                   tests[i].name, tests[i].mean, bi->bytes_tok / 1e6, bi->bytes_tok * tests[i].mean / 1e9, 100 * r,
                   bi->hw.cpu_model, bi->n_threads, bi->n_threads == 1 ? "" : "s");
    }
    const bench_test *base = batch_base(tests, n_tests);
    for (int i = 0; i < n_tests; i++) {
        const bench_test *t = &tests[i];
        if (!t->engine) continue;
        printf("%s: %d sequence%s, %.2f t/s aggregate = %.2f t/s per sequence", t->name, t->batch,
               t->batch == 1 ? "" : "s", t->mean, t->mean / t->batch);
        if (base && base != t && base->mean > 0)
            printf("; %.2fx the aggregate of %s", t->mean / base->mean, base->name);
        printf("\n");
    }
    if (bi->llc_bytes && bi->bytes_tok < bi->llc_bytes && !bi->sim[0])
        printf("note: the weights read per token (%.0f MiB) fit in the last-level cache (%.0f MiB), so decode can "
               "run above the DRAM roofline\n",
               bi->bytes_tok / 1048576.0, bi->llc_bytes / 1048576.0);
    printf("peak RSS%s: %.2f MiB\n", bi->sim[0] ? " (of this host's simulating process)" : "", bi->peak_rss / 1048576.0);
}

static void csv_str(const char *s) {
    putchar('"');
    for (; *s; s++) {
        if (*s == '"') putchar('"');
        putchar(*s);
    }
    putchar('"');
}

static void json_str(const char *s) {
    putchar('"');
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') printf("\\%c", ch);
        else if (ch < 0x20) printf("\\u%04x", ch);
        else putchar(ch);
    }
    putchar('"');
}

/* The fields of a CSV/JSON row, in order; FLD_* index k_fields. */
enum {
    FLD_VERSION, FLD_TIMESTAMP, FLD_CPU, FLD_N_CORES, FLD_N_LOGICAL, FLD_GPU, FLD_MODEL_TYPE, FLD_MODEL_NAME,
    FLD_MODEL_FILENAME, FLD_MODEL_SHA256, FLD_MODEL_SIZE, FLD_MODEL_N_PARAMS, FLD_BACKEND, FLD_N_THREADS,
    FLD_TEST, FLD_N_PROMPT, FLD_N_GEN, FLD_BATCH, FLD_DEPTH, FLD_KV_POLICY, FLD_ATTN_BLAS, FLD_N_REPS, FLD_AVG_TS, FLD_STDDEV_TS,
    FLD_AVG_SEQ_TS, FLD_SAMPLES_TS, FLD_SAMPLES_S, FLD_MEM_BW, FLD_BYTES_TOK, FLD_ROOFLINE, FLD_PEAK_RSS, FLD_SIMULATED, N_FIELDS
};
static const char *k_fields[N_FIELDS] = {
    [FLD_VERSION] = "qinfer_version", [FLD_TIMESTAMP] = "timestamp", [FLD_CPU] = "cpu",
    [FLD_N_CORES] = "n_cores", [FLD_N_LOGICAL] = "n_logical", [FLD_GPU] = "gpu",
    [FLD_MODEL_TYPE] = "model_type", [FLD_MODEL_NAME] = "model_name", [FLD_MODEL_FILENAME] = "model_filename",
    [FLD_MODEL_SHA256] = "model_sha256", [FLD_MODEL_SIZE] = "model_size", [FLD_MODEL_N_PARAMS] = "model_n_params",
    [FLD_BACKEND] = "backend", [FLD_N_THREADS] = "n_threads", [FLD_TEST] = "test",
    [FLD_N_PROMPT] = "n_prompt", [FLD_N_GEN] = "n_gen", [FLD_BATCH] = "batch", [FLD_DEPTH] = "depth",
    [FLD_KV_POLICY] = "kv_policy", [FLD_ATTN_BLAS] = "attn_blas", [FLD_N_REPS] = "n_reps", [FLD_AVG_TS] = "avg_ts",
    [FLD_STDDEV_TS] = "stddev_ts", [FLD_AVG_SEQ_TS] = "avg_seq_ts", [FLD_SAMPLES_TS] = "samples_ts",
    [FLD_SAMPLES_S] = "samples_s",
    [FLD_MEM_BW] = "mem_bw_gbs", [FLD_BYTES_TOK] = "weight_bytes_per_token", [FLD_ROOFLINE] = "roofline_share",
    [FLD_PEAK_RSS] = "peak_rss_bytes", [FLD_SIMULATED] = "simulated",
};

/* Field f of a row: a string (quoted) or a number (not). */
static void print_field(out_format fmt, int f, const bench_info *bi, const bench_test *t) {
    void (*str)(const char *) = fmt == OUT_CSV ? csv_str : json_str;
    double r;
    switch (f) {
    case FLD_VERSION: str(QI_VERSION); break;
    case FLD_TIMESTAMP: str(bi->timestamp); break;
    case FLD_CPU: str(bi->hw.cpu_model); break;
    case FLD_N_CORES: printf("%d", bi->hw.n_cores); break;
    case FLD_N_LOGICAL: printf("%d", bi->hw.n_threads); break;
    case FLD_GPU: str(bi->gpu); break;
    case FLD_MODEL_TYPE: str(bi->desc); break;
    case FLD_MODEL_NAME: str(bi->name); break;
    case FLD_MODEL_FILENAME: str(bi->path); break;
    case FLD_MODEL_SHA256: str(bi->sha256); break;
    case FLD_MODEL_SIZE: printf("%" PRIu64, bi->model_size); break;
    case FLD_MODEL_N_PARAMS: printf("%" PRIu64, bi->n_params); break;
    case FLD_BACKEND: str(bi->backend); break;
    case FLD_N_THREADS: printf("%d", bi->n_threads); break;
    case FLD_TEST: str(t->name); break;
    case FLD_N_PROMPT: printf("%d", t->n_prompt); break;
    case FLD_N_GEN: printf("%d", t->n_gen); break;
    case FLD_BATCH: printf("%d", t->batch); break;
    case FLD_DEPTH: printf("%d", t->depth); break;
    case FLD_KV_POLICY: str(row_kv(bi, t)); break;
    case FLD_ATTN_BLAS: printf("%d", bi->attn_blas); break;
    case FLD_N_REPS: printf("%d", t->n_reps); break;
    case FLD_AVG_TS: printf("%.6f", t->mean); break;
    case FLD_STDDEV_TS: printf("%.6f", t->sd); break;
    case FLD_AVG_SEQ_TS: printf("%.6f", t->mean / t->batch); break;
    case FLD_SAMPLES_TS:
        /* CSV: one quoted field, values separated by ';'. */
        putchar(fmt == OUT_CSV ? '"' : '[');
        for (int i = 0; i < t->n_reps; i++) printf("%s%.6f", i ? (fmt == OUT_CSV ? ";" : ", ") : "", t->ts[i]);
        putchar(fmt == OUT_CSV ? '"' : ']');
        break;
    case FLD_SAMPLES_S: /* what each rate divides its tokens by */
        putchar(fmt == OUT_CSV ? '"' : '[');
        for (int i = 0; i < t->n_reps; i++) printf("%s%.9g", i ? (fmt == OUT_CSV ? ";" : ", ") : "", t->secs[i]);
        putchar(fmt == OUT_CSV ? '"' : ']');
        break;
    case FLD_MEM_BW:
        if (bi->bw_gbs > 0) printf("%.3f", bi->bw_gbs);
        else printf(fmt == OUT_CSV ? "" : "null");
        break;
    case FLD_BYTES_TOK: printf("%" PRIu64, bi->bytes_tok); break;
    case FLD_ROOFLINE:
        r = roofline_share(bi, t);
        if (!isnan(r)) printf("%.6f", r);
        else printf(fmt == OUT_CSV ? "" : "null");
        break;
    case FLD_PEAK_RSS: printf("%ld", bi->peak_rss); break;
    case FLD_SIMULATED: str(bi->sim); break; /* the profile's name, "" when measured */
    }
}

static void print_rows(out_format fmt, const bench_info *bi, const bench_test *tests, int n_tests) {
    if (fmt == OUT_CSV) {
        for (int f = 0; f < N_FIELDS; f++) printf("%s%s", f ? "," : "", k_fields[f]);
        printf("\n");
        for (int i = 0; i < n_tests; i++) {
            for (int f = 0; f < N_FIELDS; f++) {
                if (f) putchar(',');
                print_field(fmt, f, bi, &tests[i]);
            }
            printf("\n");
        }
        return;
    }
    printf("[\n");
    for (int i = 0; i < n_tests; i++) {
        printf("  {\n");
        for (int f = 0; f < N_FIELDS; f++) {
            printf("    \"%s\": ", k_fields[f]);
            print_field(fmt, f, bi, &tests[i]);
            printf("%s\n", f + 1 < N_FIELDS ? "," : "");
        }
        printf("  }%s\n", i + 1 < n_tests ? "," : "");
    }
    printf("]\n");
}

/* ---- SQLite --------------------------------------------------------------------- */

#ifdef QI_HAVE_SQLITE
/* --db: each row one run of experiment "bench" in a results database
 * (results/README.md), its test and settings the configuration, its rates
 * one metric per repetition under the names every figure uses. Bench rows
 * are appended, never skipped: the key is the configuration's plus when and
 * which row, so the same test run twice is two runs. */
#define BENCH_EXPERIMENT "bench"

/* A file holding the table of the bench before the results schema: not
 * ours to convert, so it is refused with a message saying what it is. */
static bool old_bench_file(const char *file) {
    sqlite3 *c = NULL;
    bool old = false;
    if (sqlite3_open_v2(file, &c, SQLITE_OPEN_READONLY, NULL) == SQLITE_OK) {
        sqlite3_stmt *s = NULL;
        if (sqlite3_prepare_v2(c, "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'bench'", -1, &s,
                               NULL) == SQLITE_OK)
            old = sqlite3_step(s) == SQLITE_ROW;
        sqlite3_finalize(s);
    }
    sqlite3_close(c);
    return old;
}

/* Open (creating or migrating if needed) before the tests, so a bad path
 * fails before minutes of benchmarking. */
static qi_status db_open(const char *file, qi_db **out, int64_t *exp, qi_err *err) {
    if (old_bench_file(file))
        return QI_ERR(err, QI_ERR_DB, "%s holds the bench table of an older qinfer (its rows stay readable with "
                                      "sqlite3); give --db a results database or a new file", file);
    qi_status st = qi_db_open(file, out, err);
    if (st) return st;
    return qi_db_experiment(*out, BENCH_EXPERIMENT, NULL, NULL, exp, err);
}

/* JSON string s (quoted, escaped) appended at buf + *n. */
static void json_put_str(char *buf, size_t cap, size_t *n, const char *s) {
    if (*n < cap) *n += (size_t)snprintf(buf + *n, cap - *n, "\"");
    for (; *s && *n + 8 < cap; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') *n += (size_t)snprintf(buf + *n, cap - *n, "\\%c", ch);
        else if (ch < 0x20) *n += (size_t)snprintf(buf + *n, cap - *n, "\\u%04x", ch);
        else buf[(*n)++] = (char)ch;
    }
    if (*n < cap) *n += (size_t)snprintf(buf + *n, cap - *n, "\"");
}

static qi_status db_insert(qi_db *db, int64_t exp, const bench_info *bi, const bench_test *tests, int n_tests,
                           const bench_settings *bs, qi_err *err) {
    qi_db_host host;
    qi_db_host_get(&host, ".");
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    for (int i = 0; i < n_tests; i++) {
        const bench_test *t = &tests[i];
        char cfg[2048];
        size_t n = 0;
        n += (size_t)snprintf(cfg + n, sizeof cfg - n, "{\"test\":");
        json_put_str(cfg, sizeof cfg, &n, t->name);
        n += (size_t)snprintf(cfg + n, sizeof cfg - n,
                              ",\"n_prompt\":%d,\"n_gen\":%d,\"batch\":%d,\"depth\":%d,\"threads\":%d,\"repack\":%s,"
                              "\"attn_blas\":%s,\"repetitions\":%d,\"warmup\":%d,\"backend\":",
                              t->n_prompt, t->n_gen, t->batch, t->depth, bi->n_threads, bs->repack ? "true" : "false",
                              bi->attn_blas ? "true" : "false", t->n_reps, bs->n_warmup);
        json_put_str(cfg, sizeof cfg, &n, bi->backend);
        n += (size_t)snprintf(cfg + n, sizeof cfg - n, ",\"kv_policy\":");
        json_put_str(cfg, sizeof cfg, &n, row_kv(bi, t));
        n += (size_t)snprintf(cfg + n, sizeof cfg - n, ",\"devices\":");
        json_put_str(cfg, sizeof cfg, &n, bs->devices ? bs->devices : "cpu");
        n += (size_t)snprintf(cfg + n, sizeof cfg - n, ",\"placement\":");
        json_put_str(cfg, sizeof cfg, &n, bs->placement ? bs->placement : "all-cpu");
        if (bi->sim[0]) {
            n += (size_t)snprintf(cfg + n, sizeof cfg - n, ",\"sim\":");
            json_put_str(cfg, sizeof cfg, &n, bi->sim);
            char sp[512] = "";
            for (int k = 0; bs->sim_params && k < bs->sim_params->n; k++)
                snprintf(sp + strlen(sp), sizeof sp - strlen(sp), "%s%s=%s", k ? "," : "",
                         bs->sim_params->items[k].key, bs->sim_params->items[k].value);
            n += (size_t)snprintf(cfg + n, sizeof cfg - n, ",\"sim_params\":");
            json_put_str(cfg, sizeof cfg, &n, sp);
            if (bs->sim_cal) {
                n += (size_t)snprintf(cfg + n, sizeof cfg - n, ",\"sim_cal\":");
                json_put_str(cfg, sizeof cfg, &n, bs->sim_cal);
            }
        }
        if (n + 2 >= sizeof cfg) return QI_ERR(err, QI_ERR_INVALID, "--db: the configuration of %s is too long", t->name);
        snprintf(cfg + n, sizeof cfg - n, "}");
        char key[160], sha[65];
        qi_status st = qi_db_config_key(cfg, sha, err);
        if (st) return st;
        snprintf(key, sizeof key, "%s@%lld.%09ld#%d", sha, (long long)now.tv_sec, now.tv_nsec, i);
        qi_db_run_info info;
        qi_db_run_info_init(&info, &host);
        info.model_path = bi->path;
        info.model_sha256 = bi->sha256[0] ? bi->sha256 : NULL;
        const bool sim = bi->sim[0] != 0;
        info.simulated = sim;
        if (sim) { /* the simulated machine, not this host, ran it */
            info.cpu = bi->hw.cpu_model;
            info.cores = bi->hw.n_cores;
            info.gpu = bi->gpu;
            info.gpu_driver = NULL;
            info.mem_bytes = 0;
        }
        int64_t run;
        if ((st = qi_db_run_begin(db, exp, cfg, key, &info, &run, err))) return st;
        const bool pp = t->n_prompt > 0;
        for (int k = 0; k < t->n_reps && !st; k++) {
            st = qi_db_metric(db, run, pp ? "prefill.tokens_per_s" : "decode.tokens_per_s", t->ts[k], "tok/s", k,
                              sim, err);
            if (!st && !pp)
                st = qi_db_metric(db, run, "decode.per_seq_tokens_per_s", qi_measure_rate(t->n_gen, t->secs[k]),
                                  "tok/s", k, sim, err);
        }
        double r = roofline_share(bi, t);
        if (!st && bi->bw_gbs > 0) st = qi_db_metric(db, run, "mem.read_gb_per_s", bi->bw_gbs, "GB/s", 0, false, err);
        if (!st)
            st = qi_db_metric(db, run, "decode.weight_bytes_per_token", (double)bi->bytes_tok, "B", 0, sim, err);
        if (!st && !isnan(r)) st = qi_db_metric(db, run, "decode.roofline_share", r, "1", 0, sim, err);
        /* this host's process, not the simulated machine's: not recorded for a simulated run */
        if (!st && !sim) st = qi_db_metric(db, run, "mem.peak_rss_bytes", (double)bi->peak_rss, "B", 0, false, err);
        if (st) {
            qi_db_run_end(db, run, false, err->msg, NULL);
            return st;
        }
        if ((st = qi_db_run_end(db, run, true, NULL, err))) return st;
    }
    return QI_OK;
}
#endif

/* ---- the command ----------------------------------------------------------------- */

/* Parse --batch's comma list into out[MAX_BATCHES]; false (reported) if it
 * is not a list of distinct sizes 1..MAX_BATCH. */
/* The largest batch of the batched rows, 1 without them: the serving batch
 * the neuron split's speed ratio is calibrated at. */
static int max_batch(const int *batches, int n, bool batched) {
    int b = 1;
    for (int i = 0; batched && i < n; i++) b = batches[i] > b ? batches[i] : b;
    return b;
}

static bool parse_batches(const char *cmd, const char *s, int *out, int *n_out) {
    int n = 0;
    const char *p = s;
    for (;;) {
        char *end;
        errno = 0;
        long v = *p >= '0' && *p <= '9' ? strtol(p, &end, 10) : -1;
        if (v < 0 || errno || (*end != ',' && *end != '\0')) {
            qi_cli_error(cmd, "option --batch: '%s' is not a comma list of batch sizes (e.g. 1,4,16)", s);
            return false;
        }
        if (v < 1 || v > MAX_BATCH) {
            qi_cli_error(cmd, "option --batch: batch size %ld is not in 1..%d", v, MAX_BATCH);
            return false;
        }
        for (int i = 0; i < n; i++)
            if (out[i] == v) {
                qi_cli_error(cmd, "option --batch: batch size %ld is listed twice", v);
                return false;
            }
        if (n == MAX_BATCHES) {
            qi_cli_error(cmd, "option --batch: more than %d batch sizes", MAX_BATCHES);
            return false;
        }
        out[n++] = (int)v;
        if (*end == '\0') break;
        p = end + 1;
    }
    *n_out = n;
    return true;
}

/* KV cache bytes a batched test needs at full length, at least: fp16 K and
 * V of every position of every (sequence, layer, KV head) stream (the pool
 * rounds each stream up to whole blocks). */
static uint64_t batch_kv_bytes(const qi_model *m, int batch, int n_pos) {
    const qi_hparams *hp = &m->hp;
    return (uint64_t)batch * hp->n_layer * hp->n_head_kv * (uint64_t)n_pos * hp->head_dim * 2 * sizeof(uint16_t);
}

int qi_cmd_bench(int argc, char **argv) {
    const char *cmd = "bench", *model_arg = "smollm2-135m", *db_file = NULL, *out_arg = "md";
    int n_prompt = 512, n_gen = 128, n_reps = 5, n_warmup = 1, probe_mib = -1, depth = -1;
    int n_threads = qi_n_physical_cores();
    bool repack = false, profile = false, cupti = false, vs_dense = false;
    int batches[MAX_BATCHES] = {1}, n_batches = 1;
    bool batch_given = false;
    bool attn_blas = false;
    qi_cli_kv kv;
    qi_cli_kv_init(&kv);
    qi_cli_sim_allow(&kv);
    qi_cli_neuron_allow(&kv);
    qi_cli_place_policy_allow(&kv);
    qi_args a;
    qi_args_init(&a, cmd, argc, argv);
    while (qi_args_next(&a)) {
        if (qi_args_is(&a, "-h", "--help")) { help(); return 0; }
        else if (qi_cli_place_flag(&a, &kv))
            continue;
        else if (qi_cli_kv_flag(&a, &kv)) {}
        else if (qi_args_is(&a, "-b", "--batch")) {
            const char *list = qi_args_str(&a);
            if (list && !parse_batches(cmd, list, batches, &n_batches)) a.failed = true;
            batch_given = list != NULL;
        }
        else if (qi_args_is(&a, "-m", "--model")) model_arg = qi_args_str(&a);
        else if (qi_args_is(&a, "-p", "--n-prompt")) qi_args_int(&a, 0, 1 << 20, &n_prompt);
        else if (qi_args_is(&a, "-n", "--n-gen")) qi_args_int(&a, 0, 1 << 20, &n_gen);
        else if (qi_args_is(&a, "-d", "--depth")) qi_args_int(&a, 1, 1 << 20, &depth);
        else if (qi_args_is(&a, "-t", "--threads")) qi_args_int(&a, 1, 1024, &n_threads);
        else if (qi_args_is(&a, "-r", "--repetitions")) qi_args_int(&a, 0, 1000, &n_reps);
        else if (qi_args_is(&a, NULL, "--warmup")) qi_args_int(&a, 0, 1000, &n_warmup);
        else if (qi_args_is(&a, "-o", "--output")) out_arg = qi_args_str(&a);
        else if (qi_args_is(&a, NULL, "--db")) db_file = qi_args_str(&a);
        else if (qi_args_is(&a, NULL, "--probe-mib")) qi_args_int(&a, 0, 1 << 20, &probe_mib);
        else if (qi_args_is(&a, NULL, "--repack")) repack = true;
        else if (qi_args_is(&a, NULL, "--attn-blas")) attn_blas = true;
        else if (qi_args_is(&a, NULL, "--profile")) profile = true;
        else if (qi_args_is(&a, NULL, "--cupti")) cupti = true;
        else if (qi_args_is(&a, NULL, "--vs-dense")) vs_dense = true;
        else qi_args_unknown(&a);
    }
    if (a.failed) return QI_EXIT_USAGE;
    out_format fmt;
    if (!qi_cli_output_format(cmd, out_arg, "md", &fmt)) return QI_EXIT_USAGE;
    if (n_reps < 1) {
        qi_cli_error(cmd, "-r %d: at least one repetition is needed", n_reps);
        return QI_EXIT_USAGE;
    }
    if (cupti && !qi_cli_cupti_check(cmd, &kv)) return QI_EXIT_USAGE;
    if (n_prompt == 0 && n_gen == 0) {
        qi_cli_error(cmd, "nothing to run: -p and -n are both 0");
        return QI_EXIT_USAGE;
    }
    /* Batched rows where --batch gives their sizes. */
    const bool batched = batch_given;
    if (batched && n_gen == 0) {
        qi_cli_error(cmd, "--batch: the batched rows decode -n tokens, and -n is 0");
        return QI_EXIT_USAGE;
    }
    if (!batched && depth >= 0) {
        qi_cli_error(cmd, "--depth applies to the batched rows only: add --batch");
        return QI_EXIT_USAGE;
    }
    if (depth < 0) depth = BATCH_PROMPT;
    const bool place_policy = qi_placement_is_policy(kv.placement);
    if (place_policy && (!batched || n_prompt > 0 || n_gen == 0)) {
        qi_cli_error(cmd, "--placement %s: a placement policy runs on the batched rows only: give --batch, and -p 0",
                     kv.placement);
        return QI_EXIT_USAGE;
    }
    if (vs_dense && (!batched || !kv.sparsity_given)) {
        qi_cli_error(cmd, "--vs-dense compares the batched rows' activation sparsity with their dense path: give "
                          "--sparsity S (above 0) and --batch");
        return QI_EXIT_USAGE;
    }
    if (!batched && (strcmp(kv.policy, "full") || kv.budget_tokens || kv.budget_frac > 0 || kv.params.n)) {
        qi_cli_error(cmd, "the KV policy flags apply to the batched rows only: add --batch");
        return QI_EXIT_USAGE;
    }
    if (!batched && (kv.sparsity_given || (kv.neuron_policy && strcmp(kv.neuron_policy, "none")))) {
        qi_cli_error(cmd, "%s applies to the batched rows only: add --batch (-b 1: the batch-1 row, tg@b1)",
                     kv.sparsity_given ? "--sparsity" : "--neuron-policy");
        return QI_EXIT_USAGE;
    }
#ifndef QI_HAVE_SQLITE
    if (db_file) {
        qi_cli_error(cmd, "--db: this qinfer was built without SQLite (install libsqlite3-dev and rebuild)");
        return QI_EXIT_USAGE;
    }
#endif

    qi_err err = {0};
    char path[1024];
    qi_model *m = NULL;
    bench_runner run;
    memset(&run, 0, sizeof run);
    bench_test tests[BENCH_MAX_TESTS];
    int n_tests = 0, rc = 0;
    memset(tests, 0, sizeof tests);
#ifdef QI_HAVE_SQLITE
    qi_db *db = NULL;
    int64_t db_exp = 0;
#endif
    bench_info bi;
    memset(&bi, 0, sizeof bi);
    bi.bw_gbs = -1;
    bi.n_threads = n_threads;
    bi.attn_blas = attn_blas;
    qi_cli_kv_describe(&kv, bi.kv_desc, sizeof bi.kv_desc);
    qi_engine_opts eo;
    qi_engine_opts_default(&eo);
    qi_cli_kv_apply(&kv, &eo);
    eo.n_threads = n_threads;
    eo.n_ctx = depth + n_gen;
    eo.attn_blas = attn_blas;
    eo.repack = repack;
    /* a missing OpenBLAS fails now, not after the bandwidth probe */
    if (attn_blas && qi_blas_load(&err)) goto fail;

    if (qi_cache_resolve(model_arg, "model", path, sizeof path, &err) || qi_cli_load_model(path, repack, &m, &err) ||
        qi_cli_kv_check(&kv, m->hp.n_layer, &err) || qi_cli_neuron_prepare(cmd, &kv, m, max_batch(batches, n_batches, batched), &err))
        goto fail;
    qi_cli_kv_apply(&kv, &eo); /* again: the neuron split is made once the model is loaded */
    /* The tg test's warm-up token takes a position too. */
    long need = (long)n_prompt + n_gen + (n_gen > 0);
    if (need > m->hp.n_ctx_train) {
        QI_ERR(&err, QI_ERR_INVALID, "-p %d + -n %d (+1 warm-up token) = %ld tokens exceeds the model's context of %d",
               n_prompt, n_gen, need, m->hp.n_ctx_train);
        goto fail;
    }
    int max_b = 0;
    for (int i = 0; batched && i < n_batches; i++) max_b = batches[i] > max_b ? batches[i] : max_b;
    if (batched) {
        if (eo.n_ctx > m->hp.n_ctx_train) {
            QI_ERR(&err, QI_ERR_INVALID,
                   "--batch: %d prompt + %d decoded tokens per sequence exceed the model's context of %d", depth,
                   n_gen, m->hp.n_ctx_train);
            goto fail;
        }
        uint64_t kv_bytes = batch_kv_bytes(m, max_b, eo.n_ctx), avail = qi_sysinfo_mem_available();
        if (avail && kv_bytes > avail && !kv.sim) { /* a simulated machine's memory is its profile's */
            QI_ERR(&err, QI_ERR_INVALID,
                   "--batch %d: %d sequences of %d positions need %.2f GiB of KV cache, more than the %.2f GiB "
                   "of memory available",
                   max_b, max_b, eo.n_ctx, kv_bytes / 1073741824.0, avail / 1073741824.0);
            goto fail;
        }
        /* Check the KV policy and its budget and parameters now, not after the
         * qi_ctx tests: an engine of one thread, made and freed before the
         * probe forks. */
        qi_engine_opts vo = eo;
        vo.n_threads = 1;
        vo.max_seqs = 1;
        vo.step_tokens = 1;
        qi_engine *probe_eng = NULL;
        if (qi_engine_create(m, &vo, &probe_eng, &err)) goto fail;
        qi_engine_free(probe_eng);
    }
#ifdef QI_HAVE_SQLITE
    if (db_file && db_open(db_file, &db, &db_exp, &err)) goto fail;
#endif

    bi.llc_bytes = qi_sysinfo_llc_bytes();
    bi.path = path;
    model_desc(m, bi.desc, sizeof bi.desc);
    qi_str gname;
    if (qi_gguf_get_str(m->gguf, "general.name", &gname))
        snprintf(bi.name, sizeof bi.name, "%.*s", (int)(gname.len < 127 ? gname.len : 127), gname.ptr);
    bi.model_size = m->weight_bytes;
    bi.n_params = m->n_params;
    bi.bytes_tok = bytes_per_token(m);
    bi.n_layer = m->hp.n_layer;
    bi.kernels = qi_kernels_get()->name;
    snprintf(bi.backend, sizeof bi.backend, "CPU (%s%s)", bi.kernels, repack ? ", packed" : "");
    if (fmt != OUT_MD || db_file) {
        /* A short name was already verified against the manifest's hash. */
        const qi_cache_entry *ce = strcmp(path, model_arg) ? qi_cache_find(model_arg, "model") : NULL;
        if (ce) snprintf(bi.sha256, sizeof bi.sha256, "%s", ce->sha256);
        else if (qi_sha256_file(path, bi.sha256, &err)) goto fail;
    }

    /* A simulated machine's bandwidth is its profile's: no probe. */
    if (kv.sim) probe_mib = 0;
    /* The probe forks, so it runs before the context's thread pool exists. */
    if (probe_mib != 0) {
        uint64_t bytes = probe_mib > 0 ? (uint64_t)probe_mib << 20 : 4 * bi.llc_bytes;
        if (probe_mib < 0) {
            if (bytes < (512ull << 20)) bytes = 512ull << 20;
            uint64_t avail = qi_sysinfo_mem_available();
            if (avail && bytes > avail / 2) bytes = avail / 2;
        }
        bi.probe_bytes = bytes;
        fprintf(stderr, "qinfer %s: measuring memory read bandwidth (%.0f MiB, %d thread%s, best of %d)\n", cmd,
                bytes / 1048576.0, n_threads, n_threads == 1 ? "" : "s", PROBE_PASSES);
    }
    qi_sysinfo_get_apart(bi.probe_bytes, n_threads, PROBE_PASSES, &bi.hw, &bi.bw_gbs);
    if (bi.probe_bytes && bi.bw_gbs <= 0) fprintf(stderr, "qinfer %s: the bandwidth probe failed; reporting n/a\n", cmd);
    snprintf(bi.gpu, sizeof bi.gpu, "%s", bi.hw.n_gpus > 0 ? bi.hw.gpu_name : "none");
    if (kv.sim) {
        /* every label names the simulated machine, never this host */
        qi_hwprofile hp;
        if (qi_hwprofile_load(kv.sim, &hp, &err)) goto fail;
        snprintf(bi.sim, sizeof bi.sim, "%s", hp.name);
        bi.sim_cal = kv.sim_cal;
        snprintf(bi.hw.cpu_model, sizeof bi.hw.cpu_model, "%s", hp.cpu_name);
        bi.hw.n_cores = bi.hw.n_threads = (int)hp.cpu_cores.value;
        snprintf(bi.gpu, sizeof bi.gpu, "%s", hp.has_gpu ? hp.gpu_name : "none");
        bi.llc_bytes = 0;
        snprintf(bi.backend, sizeof bi.backend, "SIM %s", hp.name);
    }

    int n_ctx = n_prompt > n_gen + 1 ? n_prompt : n_gen + 1;
    run.m = m;
    size_t n_toks = (size_t)depth * (size_t)max_b > (size_t)n_prompt ? (size_t)depth * (size_t)max_b : (size_t)n_prompt;
    run.toks = qi_malloc(sizeof *run.toks * (n_toks ? n_toks : 1));
    if (!run.toks) {
        QI_ERR(&err, QI_ERR_NOMEM, "out of memory");
        goto fail;
    }
    const qi_ctx_opts co = {.n_ctx = n_ctx, .n_threads = n_threads, .attn_blas = attn_blas, .repack = repack,
                            .devices = kv.devices, .placement = place_policy ? "all-cpu" : kv.placement,
                            .sim = kv.sim, .sim_params = &kv.sim_params, .sim_cal = kv.sim_cal,
                            .profile = cupti};
    run.cupti = cupti;
    if (place_policy) {
        if (qi_placement_policy_from_spec(kv.placement, &run.policy, &err)) goto fail;
        run.kv_budget = kv.budget_tokens > 0 ? kv.budget_tokens : (int)(kv.budget_frac * (depth + n_gen));
    }
    if (qi_ctx_create_opts(m, &co, &run.ctx, &err)) goto fail;
    if (n_prompt > 0) {
        bench_test *t = &tests[n_tests++];
        snprintf(t->name, sizeof t->name, "pp%d", n_prompt);
        t->n_prompt = n_prompt;
    }
    if (n_gen > 0) {
        bench_test *t = &tests[n_tests++];
        snprintf(t->name, sizeof t->name, "tg%d", n_gen);
        t->n_gen = n_gen;
    }
    for (int i = 0; batched && i < n_batches; i++) {
        bench_test *t = &tests[n_tests++];
        if (depth != BATCH_PROMPT)
            snprintf(t->name, sizeof t->name, "tg%d @ b%d d%d", n_gen, batches[i], depth);
        else
            snprintf(t->name, sizeof t->name, "tg%d @ b%d", n_gen, batches[i]);
        t->n_gen = n_gen;
        t->engine = true;
        t->depth = depth;
    }
    for (int i = 0; i < n_tests; i++) {
        tests[i].batch = tests[i].engine ? batches[i - (n_tests - n_batches)] : 1;
        tests[i].n_reps = n_reps;
        if (!(tests[i].ts = qi_calloc(2 * (size_t)n_reps, sizeof(double)))) {
            QI_ERR(&err, QI_ERR_NOMEM, "out of memory");
            goto fail;
        }
        tests[i].secs = tests[i].ts + n_reps;
        if (vs_dense && tests[i].engine &&
            !(tests[i].ab_ratio = qi_calloc((size_t)n_reps * (size_t)(n_gen / 2 + 1), sizeof(double)))) {
            QI_ERR(&err, QI_ERR_NOMEM, "out of memory");
            goto fail;
        }
    }
    run.vs_dense = vs_dense;
    for (int i = 0; i < n_tests; i++) {
        bench_test *t = &tests[i];
        if (t->engine) {
            /* One pool of workers at a time: the qi_ctx's goes first. */
            qi_ctx_free(run.ctx);
            run.ctx = NULL;
            qi_engine_opts o = eo;
            o.max_seqs = t->batch;
            o.profile = profile || run.policy || cupti; /* a policy learns from the block times */
            if (o.step_tokens < t->batch) o.step_tokens = t->batch;
            if (qi_engine_create(m, &o, &run.eng, &err)) goto fail;
        }
        if (run_test(&run, t, n_warmup, &err)) goto fail;
        if (profile && run.eng) {
            qi_cli_print_profile(cmd, t->name, &run.prof);
            qi_cli_print_plan(cmd, run.eng);
        }
        qi_engine_free(run.eng);
        run.eng = NULL;
    }

    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) == 0) bi.peak_rss = ru.ru_maxrss * 1024L; /* Linux: KiB */
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(bi.timestamp, sizeof bi.timestamp, "%Y-%m-%dT%H:%M:%SZ", &tm);

    if (fmt == OUT_MD) print_md(&bi, tests, n_tests);
    else print_rows(fmt, &bi, tests, n_tests);
    fflush(stdout);
    for (int i = 0; i < n_tests; i++) print_vs_dense(fmt == OUT_MD ? stdout : stderr, &tests[i]);
#ifdef QI_HAVE_SQLITE
    const bench_settings bs = {.repack = repack, .n_warmup = n_warmup, .devices = kv.devices,
                               .placement = kv.placement, .sim_params = &kv.sim_params, .sim_cal = kv.sim_cal};
    if (db && db_insert(db, db_exp, &bi, tests, n_tests, &bs, &err)) goto fail;
    if (db) fprintf(stderr, "qinfer %s: %d runs added to %s (experiment %s)\n", cmd, n_tests, db_file, BENCH_EXPERIMENT);
#endif
    goto done;
fail:
    rc = qi_cli_fail(cmd, &err);
done:
#ifdef QI_HAVE_SQLITE
    qi_db_close(db);
#endif
    for (int i = 0; i < n_tests; i++) qi_free(tests[i].ts), qi_free(tests[i].ab_ratio);
    qi_free(run.toks);
    qi_placement_policy_free(run.policy);
    qi_engine_free(run.eng);
    qi_ctx_free(run.ctx);
    qi_model_free(m);
    qi_cli_kv_fini(&kv);
    return rc;
}

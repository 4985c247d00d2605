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
 * It runs in a forked child before the thread pool exists, so its buffer
 * never counts in this process's peak RSS (getrusage of the process itself;
 * the child is a separate process and is waited for before the tests). The
 * same child fills the hardware label (qi_sysinfo, shared with every other
 * figure the harness records): in a CUDA build that query starts the CUDA
 * runtime, whose threads and memory would otherwise stay in the benchmarked
 * process and blur the comparison with a CPU-only llama-bench.
 *
 * Results are collected and printed at the end (md, csv or json), since peak
 * RSS is known only then; progress goes to stderr meanwhile. --db appends the
 * rows, each repetition's rate included, to a SQLite table; SQLite is
 * optional at build time (QI_HAVE_SQLITE), and without it --db is refused
 * before anything runs. Columns added after the first schema (batch,
 * kv_policy, avg_seq_ts, attn_blas, depth) are added to an older table when
 * it is opened, so one file keeps every run's rows.
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
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "blas.h"
#include "cli.h"
#include "kernels.h"
#include "qinfer/model_files.h"
#include "qinfer/engine.h"
#include "qinfer/model.h"
#include "qinfer/sysinfo.h"
#include "sha256.h"
#include "threadpool.h"

#ifdef QI_HAVE_SQLITE
#include <sqlite3.h>
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
        "  -b, --batch LIST      batch sizes, a comma list of 1..%d (default 1: no batched\n"
        "                        rows); each size B adds a tg<N> @ b<B> row: B sequences\n"
        "                        with a prompt of --depth tokens each, then N steps of\n"
        "                        one token for every sequence\n"
        "  -d, --depth N         prompt tokens of each sequence of the batched rows, run\n"
        "                        untimed before the steps (default %d); rows then read\n"
        "                        tg<N> @ b<B> d<N> when N is not the default. A KV\n"
        "                        policy's budget applies from the prompt on\n"
        "  -t, --threads N       worker threads (default: physical cores)\n"
        "  -r, --repetitions N   timed runs of each test (default 5)\n"
        "      --warmup N        untimed runs of each test first (default 1)\n"
        "  -o, --output FMT      md (default), csv or json, to stdout\n"
        "      --db FILE         also append the rows to table 'bench' of a SQLite file%s\n"
        "      --probe-mib N     bandwidth probe buffer in MiB (default: 4x the last-level\n"
        "                        cache, at least 512; 0 = skip the probe)\n"
        QI_CLI_REPACK_HELP
        "                        (the backend column then reads \"CPU (<kernels>, packed)\")\n"
        "      --attn-blas       prompts' attention through OpenBLAS sgemm (the pp row):\n"
        "                        faster, but not bit-exact with llama.cpp (needs libopenblas0)\n"
        "      --profile         time every op of the batched rows' timed decode steps (not\n"
        "                        the prompts, not the warm-up) and print each row's shares\n"
        "                        to stderr; the timers cost a little\n"
        "  -h, --help            this help\n\n"
        "The KV cache of the batched rows (the pp/tg rows keep every token):\n",
        MAX_BATCH, BATCH_PROMPT,
#ifdef QI_HAVE_SQLITE
        ""
#else
        "\n                        (unavailable: this qinfer was built without SQLite)"
#endif
    );
    qi_cli_kv_help();
    qi_cli_place_help();
    printf("\nt/s is the mean +- sample standard deviation over the repetitions; for a batched\n"
           "row it is the aggregate, B x N tokens / seconds of the N steps, and the\n"
           "per-sequence rate is that / B. Progress goes to stderr. Peak RSS is this\n"
           "process's getrusage maximum (the bandwidth probe runs in a child process and is\n"
           "not included).\n");
}

/* ---- the machine ------------------------------------------------------------ */

/* The last-level cache: the largest cache level cpu0 lists; 0 if unknown. */
static uint64_t llc_bytes(void) {
    uint64_t best = 0;
    int best_level = 0;
    for (int i = 0; i < 16; i++) {
        char p[128], buf[64];
        int level = 0;
        snprintf(p, sizeof p, "/sys/devices/system/cpu/cpu0/cache/index%d/level", i);
        FILE *f = fopen(p, "r");
        if (!f) break;
        if (fscanf(f, "%d", &level) != 1) level = 0;
        fclose(f);
        snprintf(p, sizeof p, "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
        if (!(f = fopen(p, "r"))) continue;
        if (fgets(buf, sizeof buf, f) && level >= best_level) {
            char *end;
            unsigned long long v = strtoull(buf, &end, 10);
            if (*end == 'K') v <<= 10;
            else if (*end == 'M') v <<= 20;
            else if (*end == 'G') v <<= 30;
            if (v) {
                best_level = level;
                best = v;
            }
        }
        fclose(f);
    }
    return best;
}

static uint64_t mem_available_bytes(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    uint64_t kib = 0;
    if (!f) return 0;
    char line[256];
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %" SCNu64 " kB", &kib) == 1) break;
    fclose(f);
    return kib * 1024;
}

/* ---- the bandwidth probe (qi_sysinfo_mem_read_gbs), in a child ---------------- */

/* What the child reports. */
typedef struct {
    qi_sysinfo si;
    double bw_gbs; /* -1: not measured or failed */
} machine_report;

/* The hardware label and, when probe_bytes > 0, the read bandwidth, from a
 * forked child. Never fails: a failed probe is reported as not measured, and
 * without a child the label is taken here. */
static void machine_probe(uint64_t probe_bytes, int n_threads, machine_report *out) {
    memset(out, 0, sizeof *out);
    out->bw_gbs = -1;
    int fd[2];
    pid_t pid = -1;
    if (pipe(fd) == 0) {
        fflush(NULL);
        if ((pid = fork()) < 0) {
            close(fd[0]);
            close(fd[1]);
        }
    }
    if (pid == 0) {
        machine_report r;
        close(fd[0]);
        qi_sysinfo_get(&r.si);
        r.bw_gbs = probe_bytes ? qi_sysinfo_mem_read_gbs(probe_bytes, n_threads, PROBE_PASSES) : -1;
        ssize_t w = write(fd[1], &r, sizeof r);
        _exit(w == (ssize_t)sizeof r ? 0 : 1);
    }
    if (pid < 0) {
        qi_sysinfo_get(&out->si);
        return;
    }
    close(fd[1]);
    size_t got = 0;
    while (got < sizeof *out) {
        ssize_t r = read(fd[0], (char *)out + got, sizeof *out - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += (size_t)r;
    }
    close(fd[0]);
    int status;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
    if (got != sizeof *out) {
        memset(out, 0, sizeof *out);
        out->bw_gbs = -1;
        qi_sysinfo_get(&out->si); /* the child died: label from here */
    }
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
    double mean, sd;
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
    int32_t *toks; /* [max(n_prompt, depth)] */
    qi_engine *eng;
    int ids[MAX_BATCH];
    int n_ids;
    qi_engine_prof prof; /* --profile: the timed decode steps of a batched test's repetitions */
} bench_runner;

/* acc += the engine's profile now less before. */
static void prof_add_since(qi_engine_prof *acc, const qi_engine *e, const qi_engine_prof *before) {
    qi_engine_prof now;
    qi_engine_profile(e, &now);
    for (int k = 0; k < QI_OP_COUNT; k++) {
        acc->seconds[k] += now.seconds[k] - before->seconds[k];
        acc->calls[k] += now.calls[k] - before->calls[k];
    }
    acc->matmul_bytes += now.matmul_bytes - before->matmul_bytes;
    acc->steps += now.steps - before->steps;
}

/* Run every pending token of the engine's sequences. */
static qi_status engine_drain(qi_engine *e, qi_err *err) {
    int n;
    do {
        qi_status st = qi_engine_step(e, &n, err);
        if (st) return st;
    } while (n > 0);
    return QI_OK;
}

/* One batched run: fresh sequences, their prompts (untimed), then n_gen
 * steps of one token each; *secs is the steps. */
static qi_status run_once_batch(bench_runner *r, const bench_test *t, double *secs, qi_err *err) {
    const int V = r->m->hp.n_vocab;
    qi_status st;
    while (r->n_ids > 0)
        if ((st = qi_engine_seq_remove(r->eng, r->ids[--r->n_ids], err))) return st;
    for (int b = 0; b < t->batch; b++) {
        if ((st = qi_engine_seq_add(r->eng, &r->ids[r->n_ids], err))) return st;
        r->n_ids++;
        r->toks[0] = first_token(r->m);
        for (int i = 1; i < t->depth; i++) r->toks[i] = random_token(V);
        if ((st = qi_engine_seq_feed(r->eng, r->ids[b], r->toks, t->depth, false, err))) return st;
    }
    if ((st = engine_drain(r->eng, err))) return st;
    qi_engine_prof before;
    qi_engine_profile(r->eng, &before);
    double t0 = qi_now_s();
    for (int i = 0; i < t->n_gen; i++) {
        for (int b = 0; b < t->batch; b++) {
            int32_t tok = random_token(V);
            if ((st = qi_engine_seq_feed(r->eng, r->ids[b], &tok, 1, false, err))) return st;
        }
        int n;
        if ((st = qi_engine_step(r->eng, &n, err))) return st;
        if (n != t->batch)
            return QI_ERR(err, QI_ERR_BACKEND, "a decode step ran %d tokens, not one for each of %d sequences", n,
                          t->batch);
    }
    *secs = qi_now_s() - t0;
    prof_add_since(&r->prof, r->eng, &before);
    return QI_OK;
}

/* One run of a test on an emptied context; *secs is the timed part. */
static qi_status run_once(bench_runner *r, const bench_test *t, double *secs, qi_err *err) {
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
        double t0 = qi_now_s();
        st = qi_ctx_eval(ctx, toks, t->n_prompt, false, err);
        *secs = qi_now_s() - t0;
        return st;
    }
    int32_t tok = first_token(m);
    if ((st = qi_ctx_eval(ctx, &tok, 1, false, err))) return st; /* the warm-up token */
    double t0 = qi_now_s();
    for (int i = 0; i < t->n_gen; i++) {
        tok = random_token(V);
        if ((st = qi_ctx_eval(ctx, &tok, 1, false, err))) return st;
    }
    *secs = qi_now_s() - t0;
    return QI_OK;
}

static qi_status run_test(bench_runner *r, bench_test *t, int n_warmup, qi_err *err) {
    const char *cmd = "bench";
    double n_tok = t->n_prompt > 0 ? t->n_prompt : (double)t->n_gen * t->batch;
    double secs;
    for (int i = 0; i < n_warmup; i++) {
        fprintf(stderr, "qinfer %s: %s warm-up %d/%d\n", cmd, t->name, i + 1, n_warmup);
        qi_status st = run_once(r, t, &secs, err);
        if (st) return st;
    }
    memset(&r->prof, 0, sizeof r->prof); /* the profile covers the timed repetitions */
    double sum = 0;
    for (int i = 0; i < t->n_reps; i++) {
        qi_status st = run_once(r, t, &secs, err);
        if (st) return st;
        t->ts[i] = secs > 0 ? n_tok / secs : INFINITY;
        sum += t->ts[i];
        fprintf(stderr, "qinfer %s: %s run %d/%d: %.2f t/s (%.3f s)\n", cmd, t->name, i + 1, t->n_reps,
                t->ts[i], secs);
    }
    t->mean = sum / t->n_reps;
    double ss = 0;
    for (int i = 0; i < t->n_reps; i++) ss += (t->ts[i] - t->mean) * (t->ts[i] - t->mean);
    t->sd = t->n_reps > 1 ? sqrt(ss / (t->n_reps - 1)) : 0;
    return QI_OK;
}

/* ---- output ---------------------------------------------------------------------- */

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
    char backend[48];    /* "CPU (avx512)" */
    int n_threads, n_layer;
    double bw_gbs;       /* -1: not measured */
    uint64_t probe_bytes;
    long peak_rss;       /* bytes */
    char timestamp[32];
    char kv_desc[160];   /* the batched rows' KV policy: "full", "h2o, budget 50%" */
    bool attn_blas;      /* --attn-blas */
} bench_info;

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
    printf("hardware: %s, %d physical cores (%d logical)", bi->hw.cpu_model, bi->hw.n_cores, bi->hw.n_threads);
    if (bi->llc_bytes) printf(", last-level cache %.0f MiB", bi->llc_bytes / 1048576.0);
    printf("; GPU %s", bi->gpu);
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
    if (bi->llc_bytes && bi->bytes_tok < bi->llc_bytes)
        printf("note: the weights read per token (%.0f MiB) fit in the last-level cache (%.0f MiB), so decode can "
               "run above the DRAM roofline\n",
               bi->bytes_tok / 1048576.0, bi->llc_bytes / 1048576.0);
    printf("peak RSS: %.2f MiB\n", bi->peak_rss / 1048576.0);
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
    FLD_AVG_SEQ_TS, FLD_SAMPLES_TS, FLD_MEM_BW, FLD_BYTES_TOK, FLD_ROOFLINE, FLD_PEAK_RSS, N_FIELDS
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
    [FLD_MEM_BW] = "mem_bw_gbs", [FLD_BYTES_TOK] = "weight_bytes_per_token", [FLD_ROOFLINE] = "roofline_share",
    [FLD_PEAK_RSS] = "peak_rss_bytes",
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
static const char k_schema[] =
    "CREATE TABLE IF NOT EXISTS bench ("
    " id INTEGER PRIMARY KEY,"
    " timestamp TEXT NOT NULL,"      /* ISO 8601, UTC */
    " qinfer_version TEXT NOT NULL,"
    " cpu TEXT NOT NULL, n_cores INTEGER, n_logical INTEGER, gpu TEXT,"
    " model_type TEXT, model_name TEXT, model_filename TEXT,"
    " model_sha256 TEXT, model_size INTEGER, model_n_params INTEGER,"
    " backend TEXT NOT NULL, n_threads INTEGER NOT NULL,"
    " test TEXT NOT NULL, n_prompt INTEGER, n_gen INTEGER, n_reps INTEGER,"
    " avg_ts REAL, stddev_ts REAL,"
    " samples_ts TEXT,"              /* JSON array: each repetition's t/s */
    " mem_bw_gbs REAL, weight_bytes_per_token INTEGER, roofline_share REAL,"
    " peak_rss_bytes INTEGER)";

/* Columns added since the first schema, by db_migrate, to a new table and
 * to one made before them alike; the defaults are what the older rows were
 * (one sequence, the full cache). */
static const struct {
    const char *name, *decl;
} k_added[] = {
    {"batch", "INTEGER NOT NULL DEFAULT 1"}, /* sequences decoded at once */
    {"kv_policy", "TEXT NOT NULL DEFAULT 'full'"},
    {"avg_seq_ts", "REAL"},                  /* avg_ts / batch */
    {"attn_blas", "INTEGER NOT NULL DEFAULT 0"}, /* 1: --attn-blas */
    {"depth", "INTEGER"}, /* batched rows' prompt tokens per sequence, 0 for pp/tg; NULL in rows made before it */
};

/* Add the k_added columns the table lacks. */
static int db_migrate(sqlite3 *db) {
    for (size_t i = 0; i < sizeof k_added / sizeof k_added[0]; i++) {
        sqlite3_stmt *s = NULL;
        if (sqlite3_prepare_v2(db, "SELECT 1 FROM pragma_table_info('bench') WHERE name = ?", -1, &s, NULL) !=
            SQLITE_OK)
            return SQLITE_ERROR;
        sqlite3_bind_text(s, 1, k_added[i].name, -1, SQLITE_STATIC);
        int rc = sqlite3_step(s);
        sqlite3_finalize(s);
        if (rc == SQLITE_ROW) continue;
        if (rc != SQLITE_DONE) return rc;
        char sql[160];
        snprintf(sql, sizeof sql, "ALTER TABLE bench ADD COLUMN %s %s", k_added[i].name, k_added[i].decl);
        if ((rc = sqlite3_exec(db, sql, NULL, NULL, NULL)) != SQLITE_OK) return rc;
    }
    return SQLITE_OK;
}

static qi_status db_fail(sqlite3 *db, const char *file, qi_err *err) {
    return QI_ERR(err, QI_ERR_DB, "%s: %s", file, db ? sqlite3_errmsg(db) : "cannot open");
}

/* Open (creating the table if needed) before the tests, so a bad path fails
 * before minutes of benchmarking. */
static qi_status db_open(const char *file, sqlite3 **out, qi_err *err) {
    *out = NULL;
    sqlite3 *db = NULL;
    if (sqlite3_open_v2(file, &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL) != SQLITE_OK ||
        sqlite3_busy_timeout(db, 10000) != SQLITE_OK || sqlite3_exec(db, k_schema, NULL, NULL, NULL) != SQLITE_OK ||
        db_migrate(db) != SQLITE_OK) {
        qi_status st = db_fail(db, file, err);
        sqlite3_close(db);
        return st;
    }
    *out = db;
    return QI_OK;
}

static qi_status db_insert(sqlite3 *db, const char *file, const bench_info *bi, const bench_test *tests,
                           int n_tests, qi_err *err) {
    static const char sql[] =
        "INSERT INTO bench (timestamp, qinfer_version, cpu, n_cores, n_logical, gpu, model_type, model_name,"
        " model_filename, model_sha256, model_size, model_n_params, backend, n_threads, test, n_prompt, n_gen,"
        " n_reps, avg_ts, stddev_ts, samples_ts, mem_bw_gbs, weight_bytes_per_token, roofline_share,"
        " peak_rss_bytes, batch, kv_policy, avg_seq_ts, attn_blas, depth)"
        " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)";
    sqlite3_stmt *s = NULL;
    if (sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL) != SQLITE_OK) return db_fail(db, file, err);
    if (sqlite3_prepare_v2(db, sql, -1, &s, NULL) != SQLITE_OK) goto fail;
    for (int i = 0; i < n_tests; i++) {
        const bench_test *t = &tests[i];
        char samples[8192];
        size_t n = (size_t)snprintf(samples, sizeof samples, "[");
        for (int k = 0; k < t->n_reps && n < sizeof samples; k++)
            n += (size_t)snprintf(samples + n, sizeof samples - n, "%s%.6f", k ? ", " : "", t->ts[k]);
        if (n < sizeof samples) snprintf(samples + n, sizeof samples - n, "]");
        double r = roofline_share(bi, t);
        int c = 1;
        sqlite3_reset(s);
        sqlite3_bind_text(s, c++, bi->timestamp, -1, SQLITE_STATIC);
        sqlite3_bind_text(s, c++, QI_VERSION, -1, SQLITE_STATIC);
        sqlite3_bind_text(s, c++, bi->hw.cpu_model, -1, SQLITE_STATIC);
        sqlite3_bind_int(s, c++, bi->hw.n_cores);
        sqlite3_bind_int(s, c++, bi->hw.n_threads);
        sqlite3_bind_text(s, c++, bi->gpu, -1, SQLITE_STATIC);
        sqlite3_bind_text(s, c++, bi->desc, -1, SQLITE_STATIC);
        sqlite3_bind_text(s, c++, bi->name, -1, SQLITE_STATIC);
        sqlite3_bind_text(s, c++, bi->path, -1, SQLITE_STATIC);
        sqlite3_bind_text(s, c++, bi->sha256, -1, SQLITE_STATIC);
        sqlite3_bind_int64(s, c++, (sqlite3_int64)bi->model_size);
        sqlite3_bind_int64(s, c++, (sqlite3_int64)bi->n_params);
        sqlite3_bind_text(s, c++, bi->backend, -1, SQLITE_STATIC);
        sqlite3_bind_int(s, c++, bi->n_threads);
        sqlite3_bind_text(s, c++, t->name, -1, SQLITE_STATIC);
        sqlite3_bind_int(s, c++, t->n_prompt);
        sqlite3_bind_int(s, c++, t->n_gen);
        sqlite3_bind_int(s, c++, t->n_reps);
        sqlite3_bind_double(s, c++, t->mean);
        sqlite3_bind_double(s, c++, t->sd);
        sqlite3_bind_text(s, c++, samples, -1, SQLITE_TRANSIENT);
        if (bi->bw_gbs > 0) sqlite3_bind_double(s, c++, bi->bw_gbs);
        else sqlite3_bind_null(s, c++);
        sqlite3_bind_int64(s, c++, (sqlite3_int64)bi->bytes_tok);
        if (!isnan(r)) sqlite3_bind_double(s, c++, r);
        else sqlite3_bind_null(s, c++);
        sqlite3_bind_int64(s, c++, (sqlite3_int64)bi->peak_rss);
        sqlite3_bind_int(s, c++, t->batch);
        sqlite3_bind_text(s, c++, row_kv(bi, t), -1, SQLITE_STATIC);
        sqlite3_bind_double(s, c++, t->mean / t->batch);
        sqlite3_bind_int(s, c++, bi->attn_blas);
        sqlite3_bind_int(s, c++, t->depth);
        if (sqlite3_step(s) != SQLITE_DONE) goto fail;
    }
    sqlite3_finalize(s);
    s = NULL;
    if (sqlite3_exec(db, "COMMIT", NULL, NULL, NULL) != SQLITE_OK) goto fail;
    return QI_OK;
fail:;
    qi_status st = db_fail(db, file, err);
    sqlite3_finalize(s);
    sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
    return st;
}
#endif

/* ---- the command ----------------------------------------------------------------- */

/* Parse --batch's comma list into out[MAX_BATCHES]; false (reported) if it
 * is not a list of distinct sizes 1..MAX_BATCH. */
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
    bool repack = false, profile = false;
    int batches[MAX_BATCHES] = {1}, n_batches = 1;
    bool attn_blas = false;
    qi_cli_kv kv;
    qi_cli_kv_init(&kv);
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
        else qi_args_unknown(&a);
    }
    if (a.failed) return QI_EXIT_USAGE;
    out_format fmt;
    if (!qi_cli_output_format(cmd, out_arg, "md", &fmt)) return QI_EXIT_USAGE;
    if (n_reps < 1) {
        qi_cli_error(cmd, "-r %d: at least one repetition is needed", n_reps);
        return QI_EXIT_USAGE;
    }
    if (n_prompt == 0 && n_gen == 0) {
        qi_cli_error(cmd, "nothing to run: -p and -n are both 0");
        return QI_EXIT_USAGE;
    }
    /* Batched rows unless the list is the default, batch 1 alone. */
    const bool batched = n_batches > 1 || batches[0] != 1;
    if (batched && n_gen == 0) {
        qi_cli_error(cmd, "--batch: the batched rows decode -n tokens, and -n is 0");
        return QI_EXIT_USAGE;
    }
    if (!batched && depth >= 0) {
        qi_cli_error(cmd, "--depth applies to the batched rows only: add --batch");
        return QI_EXIT_USAGE;
    }
    if (depth < 0) depth = BATCH_PROMPT;
    if (!batched && (strcmp(kv.policy, "full") || kv.budget_tokens || kv.budget_frac > 0 || kv.params.n)) {
        qi_cli_error(cmd, "the KV policy flags apply to the batched rows only: add --batch");
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
    sqlite3 *db = NULL;
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
    /* a missing OpenBLAS fails now, not after the bandwidth probe */
    if (attn_blas && qi_blas_load(&err)) goto fail;

    if (qi_cache_resolve(model_arg, "model", path, sizeof path, &err) || qi_cli_load_model(path, repack, &m, &err) ||
        qi_cli_kv_check(&kv, m->hp.n_layer, &err))
        goto fail;
    /* The tg test's warm-up token takes a position too. */
    long need = (long)n_prompt + n_gen + (n_gen > 0);
    if (need > m->hp.n_ctx_train) {
        QI_ERR(&err, QI_ERR_INVALID, "-p %d + -n %d (+1 warm-up token) = %ld tokens exceeds the model's context of %d",
               n_prompt, n_gen, need, m->hp.n_ctx_train);
        goto fail;
    }
    if (batched) {
        int max_b = 0;
        for (int i = 0; i < n_batches; i++) max_b = batches[i] > max_b ? batches[i] : max_b;
        if (eo.n_ctx > m->hp.n_ctx_train) {
            QI_ERR(&err, QI_ERR_INVALID,
                   "--batch: %d prompt + %d decoded tokens per sequence exceed the model's context of %d", depth,
                   n_gen, m->hp.n_ctx_train);
            goto fail;
        }
        uint64_t kv_bytes = batch_kv_bytes(m, max_b, eo.n_ctx), avail = mem_available_bytes();
        if (avail && kv_bytes > avail) {
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
    if (db_file && db_open(db_file, &db, &err)) goto fail;
#endif

    bi.llc_bytes = llc_bytes();
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

    /* The probe forks, so it runs before the context's thread pool exists. */
    if (probe_mib != 0) {
        uint64_t bytes = probe_mib > 0 ? (uint64_t)probe_mib << 20 : 4 * bi.llc_bytes;
        if (probe_mib < 0) {
            if (bytes < (512ull << 20)) bytes = 512ull << 20;
            uint64_t avail = mem_available_bytes();
            if (avail && bytes > avail / 2) bytes = avail / 2;
        }
        bi.probe_bytes = bytes;
        fprintf(stderr, "qinfer %s: measuring memory read bandwidth (%.0f MiB, %d thread%s, best of %d)\n", cmd,
                bytes / 1048576.0, n_threads, n_threads == 1 ? "" : "s", PROBE_PASSES);
    }
    machine_report mr;
    machine_probe(bi.probe_bytes, n_threads, &mr);
    bi.hw = mr.si;
    bi.bw_gbs = mr.bw_gbs;
    if (bi.probe_bytes && bi.bw_gbs <= 0) fprintf(stderr, "qinfer %s: the bandwidth probe failed; reporting n/a\n", cmd);
    snprintf(bi.gpu, sizeof bi.gpu, "%s", bi.hw.n_gpus > 0 ? bi.hw.gpu_name : "none");

    int n_ctx = n_prompt > n_gen + 1 ? n_prompt : n_gen + 1;
    run.m = m;
    run.toks = qi_malloc(sizeof *run.toks * (size_t)(n_prompt > depth ? n_prompt : depth));
    if (!run.toks) {
        QI_ERR(&err, QI_ERR_NOMEM, "out of memory");
        goto fail;
    }
    const qi_ctx_opts co = {.n_ctx = n_ctx, .n_threads = n_threads, .attn_blas = attn_blas, .devices = kv.devices,
                            .placement = kv.placement};
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
        if (!(tests[i].ts = qi_calloc((size_t)n_reps, sizeof(double)))) {
            QI_ERR(&err, QI_ERR_NOMEM, "out of memory");
            goto fail;
        }
    }
    for (int i = 0; i < n_tests; i++) {
        bench_test *t = &tests[i];
        if (t->engine) {
            /* One pool of workers at a time: the qi_ctx's goes first. */
            qi_ctx_free(run.ctx);
            run.ctx = NULL;
            qi_engine_opts o = eo;
            o.max_seqs = t->batch;
            o.profile = profile;
            if (o.step_tokens < t->batch) o.step_tokens = t->batch;
            run.n_ids = 0;
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
#ifdef QI_HAVE_SQLITE
    if (db && db_insert(db, db_file, &bi, tests, n_tests, &err)) goto fail;
    if (db) fprintf(stderr, "qinfer %s: %d rows appended to %s (table bench)\n", cmd, n_tests, db_file);
#endif
    goto done;
fail:
    rc = qi_cli_fail(cmd, &err);
done:
#ifdef QI_HAVE_SQLITE
    sqlite3_close(db);
#endif
    for (int i = 0; i < n_tests; i++) qi_free(tests[i].ts);
    qi_free(run.toks);
    qi_engine_free(run.eng);
    qi_ctx_free(run.ctx);
    qi_model_free(m);
    return rc;
}

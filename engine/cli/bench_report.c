/* bench_report.c - what a row of `qinfer bench` says and how it is printed
 * (bench.h): the model's description and the bytes of weights a decoded
 * token reads, decode's share of the bandwidth roofline, and the report in
 * md (llama-bench's table, then the roofline and batching lines), csv or
 * json (one row per test, the fields of k_fields in order: llama-bench's
 * names where it has the field), to stdout.
 *
 * Decode of a small batch streams every weight once per token, so its
 * ceiling is bytes of weights per token / memory bandwidth; a step of B
 * sequences reads the weights once for all of them, so a batched row's
 * weight traffic is bytes per token x steps per second. Strings are quoted
 * by the CLI's one quoting helper (qi_cli_print_quoted).
 *
 * --attn-blas changes the pp row only (the one row with prompts of more
 * than one token); every row records the setting, and the markdown header
 * says so with the core OpenBLAS chose, since a misdetected core changes
 * the figure several times over. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "bench.h"
#include "blas.h"
#include "qinfer/gguf.h"
#include "qinfer/measure.h"

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

/* The model's columns and the bytes of weights a decoded token reads. */
void bench_info_set_model(bench_info *bi, const qi_model *m) {
    model_desc(m, bi->desc, sizeof bi->desc);
    qi_str gname;
    if (qi_gguf_get_str(m->gguf, "general.name", &gname))
        snprintf(bi->name, sizeof bi->name, "%.*s", (int)(gname.len < 127 ? gname.len : 127), gname.ptr);
    bi->model_size = m->weight_bytes;
    bi->n_params = m->n_params;
    bi->bytes_tok = bytes_per_token(m);
    bi->n_layer = m->hp.n_layer;
}

/* ---- output ---------------------------------------------------------------------- */

/* --vs-dense's line for a batched row (to stdout under md, else stderr, so
 * that csv and json keep their fields). */
void bench_print_vs_dense(FILE *f, const bench_test *t) {
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

/* The KV policy a row ran with: the qi_ctx keeps every token. */
const char *bench_row_kv(const bench_info *bi, const bench_test *t) { return t->engine ? bi->kv_desc : "full"; }

/* Decode's share of the bandwidth roofline for a tg test; NAN otherwise. A
 * step reads the weights once for all its sequences, so the weight traffic
 * is bytes per token x steps per second, the per-sequence rate. */
double bench_roofline_share(const bench_info *bi, const bench_test *t) {
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

void bench_print_md(const bench_info *bi, const bench_test *tests, int n_tests) {
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
               BENCH_PROBE_PASSES);
    else
        printf("memory read bandwidth: not measured\n");
    printf("weights read per decoded token: %.2f MiB (%.1f MB: %d layers' matrices and norms, the output head, "
           "one embedding row)\n",
           bi->bytes_tok / 1048576.0, bi->bytes_tok / 1e6, bi->n_layer);
    for (int i = 0; i < n_tests; i++) {
        double r = bench_roofline_share(bi, &tests[i]);
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
static void print_field(qi_out_format fmt, int f, const bench_info *bi, const bench_test *t) {
    const bool json = fmt != QI_OUT_CSV;
    double r;
    switch (f) {
    case FLD_VERSION: qi_cli_print_quoted(QI_VERSION, json); break;
    case FLD_TIMESTAMP: qi_cli_print_quoted(bi->timestamp, json); break;
    case FLD_CPU: qi_cli_print_quoted(bi->hw.cpu_model, json); break;
    case FLD_N_CORES: printf("%d", bi->hw.n_cores); break;
    case FLD_N_LOGICAL: printf("%d", bi->hw.n_threads); break;
    case FLD_GPU: qi_cli_print_quoted(bi->gpu, json); break;
    case FLD_MODEL_TYPE: qi_cli_print_quoted(bi->desc, json); break;
    case FLD_MODEL_NAME: qi_cli_print_quoted(bi->name, json); break;
    case FLD_MODEL_FILENAME: qi_cli_print_quoted(bi->path, json); break;
    case FLD_MODEL_SHA256: qi_cli_print_quoted(bi->sha256, json); break;
    case FLD_MODEL_SIZE: printf("%" PRIu64, bi->model_size); break;
    case FLD_MODEL_N_PARAMS: printf("%" PRIu64, bi->n_params); break;
    case FLD_BACKEND: qi_cli_print_quoted(bi->backend, json); break;
    case FLD_N_THREADS: printf("%d", bi->n_threads); break;
    case FLD_TEST: qi_cli_print_quoted(t->name, json); break;
    case FLD_N_PROMPT: printf("%d", t->n_prompt); break;
    case FLD_N_GEN: printf("%d", t->n_gen); break;
    case FLD_BATCH: printf("%d", t->batch); break;
    case FLD_DEPTH: printf("%d", t->depth); break;
    case FLD_KV_POLICY: qi_cli_print_quoted(bench_row_kv(bi, t), json); break;
    case FLD_ATTN_BLAS: printf("%d", bi->attn_blas); break;
    case FLD_N_REPS: printf("%d", t->n_reps); break;
    case FLD_AVG_TS: printf("%.6f", t->mean); break;
    case FLD_STDDEV_TS: printf("%.6f", t->sd); break;
    case FLD_AVG_SEQ_TS: printf("%.6f", t->mean / t->batch); break;
    case FLD_SAMPLES_TS:
        /* CSV: one quoted field, values separated by ';'. */
        putchar(fmt == QI_OUT_CSV ? '"' : '[');
        for (int i = 0; i < t->n_reps; i++) printf("%s%.6f", i ? (fmt == QI_OUT_CSV ? ";" : ", ") : "", t->ts[i]);
        putchar(fmt == QI_OUT_CSV ? '"' : ']');
        break;
    case FLD_SAMPLES_S: /* what each rate divides its tokens by */
        putchar(fmt == QI_OUT_CSV ? '"' : '[');
        for (int i = 0; i < t->n_reps; i++) printf("%s%.9g", i ? (fmt == QI_OUT_CSV ? ";" : ", ") : "", t->secs[i]);
        putchar(fmt == QI_OUT_CSV ? '"' : ']');
        break;
    case FLD_MEM_BW:
        if (bi->bw_gbs > 0) printf("%.3f", bi->bw_gbs);
        else printf(fmt == QI_OUT_CSV ? "" : "null");
        break;
    case FLD_BYTES_TOK: printf("%" PRIu64, bi->bytes_tok); break;
    case FLD_ROOFLINE:
        r = bench_roofline_share(bi, t);
        if (!isnan(r)) printf("%.6f", r);
        else printf(fmt == QI_OUT_CSV ? "" : "null");
        break;
    case FLD_PEAK_RSS: printf("%ld", bi->peak_rss); break;
    case FLD_SIMULATED: qi_cli_print_quoted(bi->sim, json); break; /* the profile's name, "" when measured */
    }
}

void bench_print_rows(qi_out_format fmt, const bench_info *bi, const bench_test *tests, int n_tests) {
    if (fmt == QI_OUT_CSV) {
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

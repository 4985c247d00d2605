/* cmd_bench.c - `qinfer bench`: prompt-processing and decode throughput, as
 * llama-bench measures them, plus where decode stands against memory
 * bandwidth.
 *
 * The command reads and checks its flags, loads the model, labels the
 * machine and lists the tests; bench_run.c times them (what pp<N>, tg<N>
 * and tg<N> @ b<B> run), bench_report.c prints them and bench_db.c adds
 * them to a results database (bench.h). The plain pp/tg rows use qi_ctx, so
 * a --batch list with 1 in it gives tg<N> @ b1 too: the engine's own
 * single-sequence baseline. The KV policy, sparsity and neuron-split flags
 * apply to the batched rows only (qi_ctx has no policy). Each batch size
 * gets its own engine, sized for B sequences of depth + N positions, made
 * after the qi_ctx is freed so two thread pools never compete. Each
 * repetition gives tokens / seconds; the table shows the mean and the
 * sample standard deviation of those rates, as llama-bench does. --warmup N
 * runs each test N times untimed first (page-in of the mapped weights, cold
 * caches, the pool's first wake-up).
 *
 * The read bandwidth is measured here, not looked up (qi_sysinfo_get_apart:
 * a STREAM-like read of a buffer several times the last-level cache, with
 * the benchmark's thread count, best of several passes). It runs in a
 * forked child before the thread pool exists, so its buffer never counts in
 * this process's peak RSS, and the same child fills the hardware label,
 * whose device query in a CUDA build would otherwise leave the CUDA
 * runtime's threads and memory in the benchmarked process.
 *
 * Results are printed at the end (md, csv or json), since peak RSS is known
 * only then; progress goes to stderr meanwhile. Every check that a flag
 * allows runs before the model loads, and every check the model allows
 * (context, KV memory, the KV policy's parameters, --db's file) before the
 * probe and the tests, so that a mistake fails in a second, not after
 * minutes of benchmarking. SQLite is optional at build time
 * (QI_HAVE_SQLITE), and without it --db is refused before anything runs.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "bench.h"
#include "blas.h"
#include "kernels.h"
#include "qinfer/hwprofile.h"
#include "qinfer/model_files.h"
#include "sha256.h"
#include "threadpool.h"

/* The command's flags, as given and then checked. */
typedef struct {
    const char *cmd, *model_arg, *db_file, *out_arg;
    qi_out_format fmt;
    int n_prompt, n_gen, n_reps, n_warmup, probe_mib, depth, n_threads;
    bool repack, profile, cupti, vs_dense, attn_blas;
    int batches[BENCH_MAX_BATCHES], n_batches;
    bool batched;      /* --batch given: the batched rows run */
    bool place_policy; /* --placement policy:NAME */
    qi_cli_kv kv;
} bench_opts;

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
        BENCH_MAX_BATCH, BENCH_PROMPT,
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

/* ---- the flags ------------------------------------------------------------------- */

/* Parse --batch's comma list into out[BENCH_MAX_BATCHES]; false (reported)
 * if it is not a list of distinct sizes 1..BENCH_MAX_BATCH. */
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
        if (v < 1 || v > BENCH_MAX_BATCH) {
            qi_cli_error(cmd, "option --batch: batch size %ld is not in 1..%d", v, BENCH_MAX_BATCH);
            return false;
        }
        for (int i = 0; i < n; i++)
            if (out[i] == v) {
                qi_cli_error(cmd, "option --batch: batch size %ld is listed twice", v);
                return false;
            }
        if (n == BENCH_MAX_BATCHES) {
            qi_cli_error(cmd, "option --batch: more than %d batch sizes", BENCH_MAX_BATCHES);
            return false;
        }
        out[n++] = (int)v;
        if (*end == '\0') break;
        p = end + 1;
    }
    *n_out = n;
    return true;
}

/* The flags into *o (o->kv initialised here; the caller finishes it with
 * qi_cli_kv_fini whatever this returns). -1: go on; else the exit code
 * (0 after --help, QI_EXIT_USAGE for a bad flag, reported). */
static int parse_flags(int argc, char **argv, bench_opts *o) {
    memset(o, 0, sizeof *o);
    o->cmd = "bench";
    o->model_arg = "smollm2-135m";
    o->out_arg = "md";
    o->n_prompt = 512, o->n_gen = 128, o->n_reps = 5, o->n_warmup = 1, o->probe_mib = -1, o->depth = -1;
    o->n_threads = qi_n_physical_cores();
    o->batches[0] = 1, o->n_batches = 1;
    qi_cli_kv *kv = &o->kv;
    qi_cli_kv_init(kv);
    qi_cli_sim_allow(kv);
    qi_cli_neuron_allow(kv);
    qi_cli_place_policy_allow(kv);
    qi_args a;
    qi_args_init(&a, o->cmd, argc, argv);
    while (qi_args_next(&a)) {
        if (qi_args_is(&a, "-h", "--help")) { help(); return 0; }
        else if (qi_cli_place_flag(&a, kv))
            continue;
        else if (qi_cli_kv_flag(&a, kv)) {}
        else if (qi_args_is(&a, "-b", "--batch")) {
            const char *list = qi_args_str(&a);
            if (list && !parse_batches(o->cmd, list, o->batches, &o->n_batches)) a.failed = true;
            o->batched = list != NULL;
        }
        else if (qi_args_is(&a, "-m", "--model")) o->model_arg = qi_args_str(&a);
        else if (qi_args_is(&a, "-p", "--n-prompt")) qi_args_int(&a, 0, 1 << 20, &o->n_prompt);
        else if (qi_args_is(&a, "-n", "--n-gen")) qi_args_int(&a, 0, 1 << 20, &o->n_gen);
        else if (qi_args_is(&a, "-d", "--depth")) qi_args_int(&a, 1, 1 << 20, &o->depth);
        else if (qi_args_is(&a, "-t", "--threads")) qi_args_int(&a, 1, 1024, &o->n_threads);
        else if (qi_args_is(&a, "-r", "--repetitions")) qi_args_int(&a, 0, 1000, &o->n_reps);
        else if (qi_args_is(&a, NULL, "--warmup")) qi_args_int(&a, 0, 1000, &o->n_warmup);
        else if (qi_args_is(&a, "-o", "--output")) o->out_arg = qi_args_str(&a);
        else if (qi_args_is(&a, NULL, "--db")) o->db_file = qi_args_str(&a);
        else if (qi_args_is(&a, NULL, "--probe-mib")) qi_args_int(&a, 0, 1 << 20, &o->probe_mib);
        else if (qi_args_is(&a, NULL, "--repack")) o->repack = true;
        else if (qi_args_is(&a, NULL, "--attn-blas")) o->attn_blas = true;
        else if (qi_args_is(&a, NULL, "--profile")) o->profile = true;
        else if (qi_args_is(&a, NULL, "--cupti")) o->cupti = true;
        else if (qi_args_is(&a, NULL, "--vs-dense")) o->vs_dense = true;
        else qi_args_unknown(&a);
    }
    return a.failed ? QI_EXIT_USAGE : -1;
}

/* The flags' combinations; false (reported) for a usage error. Sets
 * o->fmt, the default depth and o->place_policy. */
static bool check_flags(bench_opts *o) {
    const char *cmd = o->cmd;
    const qi_cli_kv *kv = &o->kv;
    if (!qi_cli_output_format(cmd, o->out_arg, "md", &o->fmt)) return false;
    if (o->n_reps < 1) {
        qi_cli_error(cmd, "-r %d: at least one repetition is needed", o->n_reps);
        return false;
    }
    if (o->cupti && !qi_cli_cupti_check(cmd, kv)) return false;
    if (o->n_prompt == 0 && o->n_gen == 0) {
        qi_cli_error(cmd, "nothing to run: -p and -n are both 0");
        return false;
    }
    if (o->batched && o->n_gen == 0) {
        qi_cli_error(cmd, "--batch: the batched rows decode -n tokens, and -n is 0");
        return false;
    }
    if (!o->batched && o->depth >= 0) {
        qi_cli_error(cmd, "--depth applies to the batched rows only: add --batch");
        return false;
    }
    if (o->depth < 0) o->depth = BENCH_PROMPT;
    o->place_policy = qi_placement_is_policy(kv->placement);
    if (o->place_policy && (!o->batched || o->n_prompt > 0 || o->n_gen == 0)) {
        qi_cli_error(cmd, "--placement %s: a placement policy runs on the batched rows only: give --batch, and -p 0",
                     kv->placement);
        return false;
    }
    if (o->vs_dense && (!o->batched || !kv->sparsity_given)) {
        qi_cli_error(cmd, "--vs-dense compares the batched rows' activation sparsity with their dense path: give "
                          "--sparsity S (above 0) and --batch");
        return false;
    }
    if (!o->batched && (strcmp(kv->policy, "full") || kv->budget_tokens || kv->budget_frac > 0 || kv->params.n)) {
        qi_cli_error(cmd, "the KV policy flags apply to the batched rows only: add --batch");
        return false;
    }
    if (!o->batched && (kv->sparsity_given || (kv->neuron_policy && strcmp(kv->neuron_policy, "none")))) {
        qi_cli_error(cmd, "%s applies to the batched rows only: add --batch (-b 1: the batch-1 row, tg@b1)",
                     kv->sparsity_given ? "--sparsity" : "--neuron-policy");
        return false;
    }
#ifndef QI_HAVE_SQLITE
    if (o->db_file) {
        qi_cli_error(cmd, "--db: this qinfer was built without SQLite (install libsqlite3-dev and rebuild)");
        return false;
    }
#endif
    return true;
}

/* The largest batch of the batched rows, 1 without them: the serving batch
 * the neuron split's speed ratio is calibrated at. */
static int max_batch(const bench_opts *o) {
    int b = 1;
    for (int i = 0; o->batched && i < o->n_batches; i++) b = o->batches[i] > b ? o->batches[i] : b;
    return b;
}

/* ---- the model --------------------------------------------------------------------- */

/* KV cache bytes a batched test needs at full length, at least: fp16 K and
 * V of every position of every (sequence, layer, KV head) stream (the pool
 * rounds each stream up to whole blocks). */
static uint64_t batch_kv_bytes(const qi_model *m, int batch, int n_pos) {
    const qi_hparams *hp = &m->hp;
    return (uint64_t)batch * hp->n_layer * hp->n_head_kv * (uint64_t)n_pos * hp->head_dim * 2 * sizeof(uint16_t);
}

/* What the tests need of the model, checked before any of them runs: the
 * context, the batched rows' KV memory, and the KV policy with its budget
 * and parameters (an engine of one thread, made and freed before the probe
 * forks). */
static qi_status check_model(const bench_opts *o, const qi_model *m, const qi_engine_opts *eo, qi_err *err) {
    /* The tg test's warm-up token takes a position too. */
    long need = (long)o->n_prompt + o->n_gen + (o->n_gen > 0);
    if (need > m->hp.n_ctx_train)
        return QI_ERR(err, QI_ERR_INVALID,
                      "-p %d + -n %d (+1 warm-up token) = %ld tokens exceeds the model's context of %d", o->n_prompt,
                      o->n_gen, need, m->hp.n_ctx_train);
    if (!o->batched) return QI_OK;
    if (eo->n_ctx > m->hp.n_ctx_train)
        return QI_ERR(err, QI_ERR_INVALID,
                      "--batch: %d prompt + %d decoded tokens per sequence exceed the model's context of %d",
                      o->depth, o->n_gen, m->hp.n_ctx_train);
    const int max_b = max_batch(o);
    uint64_t kv_bytes = batch_kv_bytes(m, max_b, eo->n_ctx), avail = qi_sysinfo_mem_available();
    if (avail && kv_bytes > avail && !o->kv.sim) /* a simulated machine's memory is its profile's */
        return QI_ERR(err, QI_ERR_INVALID,
                      "--batch %d: %d sequences of %d positions need %.2f GiB of KV cache, more than the %.2f GiB "
                      "of memory available",
                      max_b, max_b, eo->n_ctx, kv_bytes / 1073741824.0, avail / 1073741824.0);
    qi_engine_opts vo = *eo;
    vo.n_threads = 1;
    vo.max_seqs = 1;
    vo.step_tokens = 1;
    qi_engine *probe_eng = NULL;
    qi_status st = qi_engine_create(m, &vo, &probe_eng, err);
    qi_engine_free(probe_eng);
    return st;
}

/* ---- the machine ------------------------------------------------------------------- */

/* bi's machine: the hardware label and the read bandwidth (from a forked
 * child, before any thread pool exists), or a simulated machine's labels,
 * never this host's. */
static qi_status label_machine(const bench_opts *o, bench_info *bi, qi_err *err) {
    const qi_cli_kv *kv = &o->kv;
    bi->llc_bytes = qi_sysinfo_llc_bytes();
    /* A simulated machine's bandwidth is its profile's: no probe. */
    const int probe_mib = kv->sim ? 0 : o->probe_mib;
    if (probe_mib != 0) {
        uint64_t bytes = probe_mib > 0 ? (uint64_t)probe_mib << 20 : 4 * bi->llc_bytes;
        if (probe_mib < 0) {
            if (bytes < (512ull << 20)) bytes = 512ull << 20;
            uint64_t avail = qi_sysinfo_mem_available();
            if (avail && bytes > avail / 2) bytes = avail / 2;
        }
        bi->probe_bytes = bytes;
        fprintf(stderr, "qinfer %s: measuring memory read bandwidth (%.0f MiB, %d thread%s, best of %d)\n", o->cmd,
                bytes / 1048576.0, o->n_threads, o->n_threads == 1 ? "" : "s", BENCH_PROBE_PASSES);
    }
    qi_sysinfo_get_apart(bi->probe_bytes, o->n_threads, BENCH_PROBE_PASSES, &bi->hw, &bi->bw_gbs);
    if (bi->probe_bytes && bi->bw_gbs <= 0)
        fprintf(stderr, "qinfer %s: the bandwidth probe failed; reporting n/a\n", o->cmd);
    snprintf(bi->gpu, sizeof bi->gpu, "%s", bi->hw.n_gpus > 0 ? bi->hw.gpu_name : "none");
    if (!kv->sim) return QI_OK;
    /* every label names the simulated machine, never this host */
    qi_hwprofile hp;
    qi_status st = qi_hwprofile_load(kv->sim, &hp, err);
    if (st) return st;
    snprintf(bi->sim, sizeof bi->sim, "%s", hp.name);
    bi->sim_cal = kv->sim_cal;
    snprintf(bi->hw.cpu_model, sizeof bi->hw.cpu_model, "%s", hp.cpu_name);
    bi->hw.n_cores = bi->hw.n_threads = (int)hp.cpu_cores.value;
    snprintf(bi->gpu, sizeof bi->gpu, "%s", hp.has_gpu ? hp.gpu_name : "none");
    bi->llc_bytes = 0;
    snprintf(bi->backend, sizeof bi->backend, "SIM %s", hp.name);
    return QI_OK;
}

/* ---- the tests --------------------------------------------------------------------- */

/* The rows, in the table's order: pp<N>, tg<N>, then one tg<N> @ b<B> per
 * batch size, each with its rates' storage. */
static qi_status make_tests(const bench_opts *o, bench_test *tests, int *n_tests, qi_err *err) {
    int n = 0;
    if (o->n_prompt > 0) {
        bench_test *t = &tests[n++];
        snprintf(t->name, sizeof t->name, "pp%d", o->n_prompt);
        t->n_prompt = o->n_prompt;
        t->batch = 1;
    }
    if (o->n_gen > 0) {
        bench_test *t = &tests[n++];
        snprintf(t->name, sizeof t->name, "tg%d", o->n_gen);
        t->n_gen = o->n_gen;
        t->batch = 1;
    }
    for (int i = 0; o->batched && i < o->n_batches; i++) {
        bench_test *t = &tests[n++];
        if (o->depth != BENCH_PROMPT)
            snprintf(t->name, sizeof t->name, "tg%d @ b%d d%d", o->n_gen, o->batches[i], o->depth);
        else
            snprintf(t->name, sizeof t->name, "tg%d @ b%d", o->n_gen, o->batches[i]);
        t->n_gen = o->n_gen;
        t->engine = true;
        t->depth = o->depth;
        t->batch = o->batches[i];
    }
    *n_tests = n;
    for (int i = 0; i < n; i++) {
        bench_test *t = &tests[i];
        t->n_reps = o->n_reps;
        if (!(t->ts = qi_calloc(2 * (size_t)o->n_reps, sizeof(double))))
            return QI_ERR(err, QI_ERR_NOMEM, "out of memory");
        t->secs = t->ts + o->n_reps;
        if (o->vs_dense && t->engine &&
            !(t->ab_ratio = qi_calloc((size_t)o->n_reps * (size_t)(o->n_gen / 2 + 1), sizeof(double))))
            return QI_ERR(err, QI_ERR_NOMEM, "out of memory");
    }
    return QI_OK;
}

/* The runner's qi_ctx (the pp/tg rows; the batched rows make their own
 * engines), its token buffer and the placement policy. */
static qi_status make_runner(const bench_opts *o, const qi_model *m, bench_runner *run, qi_err *err) {
    const qi_cli_kv *kv = &o->kv;
    const int max_b = o->batched ? max_batch(o) : 0;
    run->m = m;
    size_t n_toks = (size_t)o->depth * (size_t)max_b > (size_t)o->n_prompt ? (size_t)o->depth * (size_t)max_b
                                                                            : (size_t)o->n_prompt;
    run->toks = qi_malloc(sizeof *run->toks * (n_toks ? n_toks : 1));
    if (!run->toks) return QI_ERR(err, QI_ERR_NOMEM, "out of memory");
    const int n_ctx = o->n_prompt > o->n_gen + 1 ? o->n_prompt : o->n_gen + 1;
    const qi_ctx_opts co = {.n_ctx = n_ctx, .n_threads = o->n_threads, .attn_blas = o->attn_blas,
                            .repack = o->repack, .devices = kv->devices,
                            .placement = o->place_policy ? "all-cpu" : kv->placement, .sim = kv->sim,
                            .sim_params = &kv->sim_params, .sim_cal = kv->sim_cal, .profile = o->cupti};
    run->cupti = o->cupti;
    run->vs_dense = o->vs_dense;
    if (o->place_policy) {
        qi_status st = qi_placement_policy_from_spec(kv->placement, &run->policy, err);
        if (st) return st;
        run->kv_budget = kv->budget_tokens > 0 ? kv->budget_tokens : (int)(kv->budget_frac * (o->depth + o->n_gen));
    }
    return qi_ctx_create_opts(m, &co, &run->ctx, err);
}

/* Every test in turn; a batched one in an engine of its own, made once the
 * qi_ctx is freed (one pool of workers at a time). */
static qi_status run_tests(const bench_opts *o, const qi_engine_opts *eo, bench_runner *run, bench_test *tests,
                           int n_tests, qi_err *err) {
    for (int i = 0; i < n_tests; i++) {
        bench_test *t = &tests[i];
        if (t->engine) {
            qi_ctx_free(run->ctx);
            run->ctx = NULL;
            qi_engine_opts e = *eo;
            e.max_seqs = t->batch;
            e.profile = o->profile || run->policy || o->cupti; /* a policy learns from the block times */
            if (e.step_tokens < t->batch) e.step_tokens = t->batch;
            qi_status st = qi_engine_create(run->m, &e, &run->eng, err);
            if (st) return st;
        }
        qi_status st = bench_run_test(run, t, o->n_warmup, err);
        if (st) return st;
        if (o->profile && run->eng) {
            qi_cli_print_profile(o->cmd, t->name, &run->prof);
            qi_cli_print_plan(o->cmd, run->eng);
        }
        qi_engine_free(run->eng);
        run->eng = NULL;
    }
    return QI_OK;
}

/* ---- the command ----------------------------------------------------------------- */

/* bi's labels that the flags and the model give, before the machine's. */
static qi_status label_run(const bench_opts *o, const qi_model *m, const char *path, bench_info *bi, qi_err *err) {
    bi->path = path;
    bench_info_set_model(bi, m);
    bi->kernels = qi_kernels_get()->name;
    snprintf(bi->backend, sizeof bi->backend, "CPU (%s%s)", bi->kernels, o->repack ? ", packed" : "");
    if (o->fmt == QI_OUT_HUMAN && !o->db_file) return QI_OK;
    /* A short name was already verified against the manifest's hash. */
    const qi_cache_entry *ce = strcmp(path, o->model_arg) ? qi_cache_find(o->model_arg, "model") : NULL;
    if (ce) {
        snprintf(bi->sha256, sizeof bi->sha256, "%s", ce->sha256);
        return QI_OK;
    }
    return qi_sha256_file(path, bi->sha256, err);
}

/* What only the end of the run knows: peak RSS and the time. */
static void label_end(bench_info *bi) {
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) == 0) bi->peak_rss = ru.ru_maxrss * 1024L; /* Linux: KiB */
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(bi->timestamp, sizeof bi->timestamp, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

static void report(const bench_opts *o, const bench_info *bi, const bench_test *tests, int n_tests) {
    if (o->fmt == QI_OUT_HUMAN) bench_print_md(bi, tests, n_tests);
    else bench_print_rows(o->fmt, bi, tests, n_tests);
    fflush(stdout);
    for (int i = 0; i < n_tests; i++) bench_print_vs_dense(o->fmt == QI_OUT_HUMAN ? stdout : stderr, &tests[i]);
}

int qi_cmd_bench(int argc, char **argv) {
    bench_opts o;
    int rc = parse_flags(argc, argv, &o);
    if (rc < 0 && !check_flags(&o)) rc = QI_EXIT_USAGE;
    if (rc >= 0) {
        qi_cli_kv_fini(&o.kv);
        return rc;
    }
    rc = 0;
    const char *cmd = o.cmd;
    qi_cli_kv *kv = &o.kv;
    qi_err err = {0};
    char path[1024];
    qi_model *m = NULL;
    bench_runner run;
    memset(&run, 0, sizeof run);
    bench_test tests[BENCH_MAX_TESTS];
    int n_tests = 0;
    memset(tests, 0, sizeof tests);
#ifdef QI_HAVE_SQLITE
    qi_db *db = NULL;
    int64_t db_exp = 0;
#endif
    bench_info bi;
    memset(&bi, 0, sizeof bi);
    bi.bw_gbs = -1;
    bi.n_threads = o.n_threads;
    bi.attn_blas = o.attn_blas;
    qi_cli_kv_describe(kv, bi.kv_desc, sizeof bi.kv_desc);
    qi_engine_opts eo;
    qi_engine_opts_default(&eo);
    qi_cli_kv_apply(kv, &eo);
    eo.n_threads = o.n_threads;
    eo.n_ctx = o.depth + o.n_gen;
    eo.attn_blas = o.attn_blas;
    eo.repack = o.repack;
    /* a missing OpenBLAS fails now, not after the bandwidth probe */
    if (o.attn_blas && qi_blas_load(&err)) goto fail;
    if (qi_cache_resolve(o.model_arg, "model", path, sizeof path, &err) ||
        qi_cli_load_model(path, o.repack, &m, &err) || qi_cli_kv_check(kv, m->hp.n_layer, &err) ||
        qi_cli_neuron_prepare(cmd, kv, m, max_batch(&o), &err))
        goto fail;
    qi_cli_kv_apply(kv, &eo); /* again: the neuron split is made once the model is loaded */
    if (check_model(&o, m, &eo, &err)) goto fail;
#ifdef QI_HAVE_SQLITE
    if (o.db_file && bench_db_open(o.db_file, &db, &db_exp, &err)) goto fail;
#endif
    if (label_run(&o, m, path, &bi, &err) || label_machine(&o, &bi, &err) || make_runner(&o, m, &run, &err) ||
        make_tests(&o, tests, &n_tests, &err) || run_tests(&o, &eo, &run, tests, n_tests, &err))
        goto fail;
    label_end(&bi);
    report(&o, &bi, tests, n_tests);
#ifdef QI_HAVE_SQLITE
    const bench_settings bs = {.repack = o.repack, .n_warmup = o.n_warmup, .devices = kv->devices,
                               .placement = kv->placement, .sim_params = &kv->sim_params, .sim_cal = kv->sim_cal};
    if (db && bench_db_insert(db, db_exp, &bi, tests, n_tests, &bs, &err)) goto fail;
    if (db) fprintf(stderr, "qinfer %s: %d runs added to %s (experiment %s)\n", cmd, n_tests, o.db_file,
                    BENCH_EXPERIMENT);
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
    qi_cli_kv_fini(kv);
    return rc;
}

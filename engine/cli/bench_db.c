/* bench_db.c - `qinfer bench --db` (bench.h): each row one run of
 * experiment "bench" in a results database (results/README.md, the schema
 * `qinfer run` writes and `qinfer results bench` reads), its test and
 * settings the run's configuration (JSON, its strings quoted by the CLI's
 * one quoting helper), each repetition's rate one metric under the names
 * every figure uses (prefill.tokens_per_s, decode.tokens_per_s and
 * decode.per_seq_tokens_per_s; the batch a configuration parameter), beside
 * the bandwidth, the weight bytes per token, the roofline share and peak RSS.
 *
 * Bench rows are appended, never skipped: the key is the configuration's
 * hash plus when and which row, so the same test run twice is two runs. The
 * configuration is written to a memory stream, whole whatever its length
 * (long paths of a plan or a calibration file included), never cut. A
 * simulated machine's rows carry its labels, not this host's, and no peak
 * RSS (that of this host's simulating process). Built with SQLite only
 * (QI_HAVE_SQLITE); without it the command refuses --db before anything
 * runs. */
#ifdef QI_HAVE_SQLITE
#include <math.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h"
#include "qinfer/measure.h"


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
qi_status bench_db_open(const char *file, qi_db **out, int64_t *exp, qi_err *err) {
    if (old_bench_file(file))
        return QI_ERR(err, QI_ERR_DB, "%s holds the bench table of an older qinfer (its rows stay readable with "
                                      "sqlite3); give --db a results database or a new file", file);
    qi_status st = qi_db_open(file, out, err);
    if (st) return st;
    return qi_db_experiment(*out, BENCH_EXPERIMENT, NULL, NULL, exp, err);
}
/* The configuration of row t: the test, its settings and, on a simulated
 * machine, the machine's profile, parameters and calibration; a new string
 * in *out (the caller frees it), or QI_ERR_NOMEM. */
static qi_status config_json(const bench_info *bi, const bench_test *t, const bench_settings *bs, char **out,
                             size_t *len, qi_err *err) {
    FILE *f = open_memstream(out, len);
    if (!f) return QI_ERR(err, QI_ERR_NOMEM, "out of memory");
    fprintf(f, "{\"test\":");
    qi_cli_fput_quoted(f, t->name, true);
    fprintf(f,
            ",\"n_prompt\":%d,\"n_gen\":%d,\"batch\":%d,\"depth\":%d,\"threads\":%d,\"repack\":%s,"
            "\"attn_blas\":%s,\"repetitions\":%d,\"warmup\":%d,\"backend\":",
            t->n_prompt, t->n_gen, t->batch, t->depth, bi->n_threads, bs->repack ? "true" : "false",
            bi->attn_blas ? "true" : "false", t->n_reps, bs->n_warmup);
    qi_cli_fput_quoted(f, bi->backend, true);
    fprintf(f, ",\"kv_policy\":");
    qi_cli_fput_quoted(f, bench_row_kv(bi, t), true);
    fprintf(f, ",\"devices\":");
    qi_cli_fput_quoted(f, bs->devices ? bs->devices : "cpu", true);
    fprintf(f, ",\"placement\":");
    qi_cli_fput_quoted(f, bs->placement ? bs->placement : "all-cpu", true);
    if (bi->sim[0]) {
        fprintf(f, ",\"sim\":");
        qi_cli_fput_quoted(f, bi->sim, true);
        char sp[512] = "";
        for (int k = 0; bs->sim_params && k < bs->sim_params->n; k++)
            snprintf(sp + strlen(sp), sizeof sp - strlen(sp), "%s%s=%s", k ? "," : "",
                     bs->sim_params->items[k].key, bs->sim_params->items[k].value);
        fprintf(f, ",\"sim_params\":");
        qi_cli_fput_quoted(f, sp, true);
        if (bs->sim_cal) {
            fprintf(f, ",\"sim_cal\":");
            qi_cli_fput_quoted(f, bs->sim_cal, true);
        }
    }
    fprintf(f, "}");
    if (fclose(f) != 0) {
        free(*out);
        *out = NULL;
        return QI_ERR(err, QI_ERR_NOMEM, "out of memory");
    }
    return QI_OK;
}

/* Row t's metrics in run `run`: its rates, one per repetition, then the
 * figures the row shares with the others. */
static qi_status row_metrics(qi_db *db, int64_t run, const bench_info *bi, const bench_test *t, bool sim,
                             qi_err *err) {
    qi_status st = QI_OK;
    const bool pp = t->n_prompt > 0;
    for (int k = 0; k < t->n_reps && !st; k++) {
        st = qi_db_metric(db, run, pp ? "prefill.tokens_per_s" : "decode.tokens_per_s", t->ts[k], "tok/s", k, sim,
                          err);
        if (!st && !pp)
            st = qi_db_metric(db, run, "decode.per_seq_tokens_per_s", qi_measure_rate(t->n_gen, t->secs[k]),
                              "tok/s", k, sim, err);
    }
    double r = bench_roofline_share(bi, t);
    if (!st && bi->bw_gbs > 0) st = qi_db_metric(db, run, "mem.read_gb_per_s", bi->bw_gbs, "GB/s", 0, false, err);
    if (!st) st = qi_db_metric(db, run, "decode.weight_bytes_per_token", (double)bi->bytes_tok, "B", 0, sim, err);
    if (!st && !isnan(r)) st = qi_db_metric(db, run, "decode.roofline_share", r, "1", 0, sim, err);
    /* this host's process, not the simulated machine's: not recorded for a simulated run */
    if (!st && !sim) st = qi_db_metric(db, run, "mem.peak_rss_bytes", (double)bi->peak_rss, "B", 0, false, err);
    return st;
}

/* Row i (t) as one run, begun and ended (failed, with the message, when a
 * metric could not be added). */
static qi_status insert_row(qi_db *db, int64_t exp, const bench_info *bi, const bench_test *t, int i,
                            const bench_settings *bs, const qi_db_host *host, const struct timespec *now,
                            qi_err *err) {
    char *cfg = NULL;
    size_t len = 0;
    qi_status st = config_json(bi, t, bs, &cfg, &len, err);
    if (st) return st;
    char key[160], sha[65];
    if ((st = qi_db_config_key(cfg, sha, err))) {
        free(cfg);
        return st;
    }
    snprintf(key, sizeof key, "%s@%lld.%09ld#%d", sha, (long long)now->tv_sec, now->tv_nsec, i);
    qi_db_run_info info;
    qi_db_run_info_init(&info, host);
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
    st = qi_db_run_begin(db, exp, cfg, key, &info, &run, err);
    free(cfg);
    if (st) return st;
    if ((st = row_metrics(db, run, bi, t, sim, err))) {
        qi_db_run_end(db, run, false, err->msg, NULL);
        return st;
    }
    return qi_db_run_end(db, run, true, NULL, err);
}

qi_status bench_db_insert(qi_db *db, int64_t exp, const bench_info *bi, const bench_test *tests, int n_tests,
                          const bench_settings *bs, qi_err *err) {
    qi_db_host host;
    qi_db_host_get(&host, ".");
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    for (int i = 0; i < n_tests; i++) {
        qi_status st = insert_row(db, exp, bi, &tests[i], i, bs, &host, &now, err);
        if (st) return st;
    }
    return QI_OK;
}
#endif

/* crash.c - a run killed mid-way, readers during a run, CSV export, summary statistics and metric names. */
#include "db_test.h"

/* ---- crashes and concurrency ------------------------------------------------------------ */

/* A child process redoes a failed configuration, writes enough metrics for
 * SQLite to spill uncommitted pages into the WAL, and is killed with SIGKILL
 * before run_end. The parent then finds the database intact, the failed row
 * as it was, and nothing of the killed run. */
START_TEST(killed_run_leaves_no_trace) {
    tmp_db t;
    tmp_init(&t);
    qi_db *db = open_ok(t.path);
    int64_t exp = exp_ok(db, "crash");
    const char *cfg = "{\"budget\":128}";
    int64_t failed = begin_ok(db, exp, cfg, NULL);
    metric_ok(db, failed, "a.b", 1, "1", 0, false);
    end_ok(db, failed, false, "first attempt failed");
    int64_t done = begin_ok(db, exp, "{\"budget\":64}", NULL);
    metric_ok(db, done, "a.b", 2, "1", 0, false);
    end_ok(db, done, true, NULL);
    qi_db_close(db);

    int n_metrics = 40000; /* about 5 MB of pages: more than the page cache holds */
    int fd[2];
    ck_assert_int_eq(pipe(fd), 0);
    fflush(NULL);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        close(fd[0]);
        qi_db *c = NULL;
        int64_t run = 0;
        if (qi_db_open(t.path, &c, NULL) != QI_OK || qi_db_run_begin(c, exp, cfg, NULL, NULL, &run, NULL) != QI_OK)
            _exit(2);
        for (int i = 0; i < n_metrics; i++)
            if (qi_db_metric(c, run, "decode.token_latency_ms", i * 0.5, "ms", i, false, NULL) != QI_OK) _exit(3);
        if (write(fd[1], "r", 1) != 1) _exit(4);
        for (;;) pause();
    }
    close(fd[1]);
    char ready = 0;
    ssize_t got;
    while ((got = read(fd[0], &ready, 1)) < 0 && errno == EINTR) {}
    close(fd[0]);
    struct stat st;
    char wal[160];
    snprintf(wal, sizeof wal, "%s-wal", t.path);
    off_t wal_bytes = stat(wal, &st) == 0 ? st.st_size : 0;
    kill(pid, SIGKILL);
    int status = 0;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_msg(got == 1 && ready == 'r', "the child failed before the kill (status %d)", status);
    ck_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    /* The child's uncommitted pages reached the WAL file: the recovery below
     * has something to discard. */
    ck_assert_msg(wal_bytes > 64 << 10, "WAL only %lld bytes: the killed run never spilled", (long long)wal_bytes);

    db = open_ok(t.path);
    sqlite3 *c = raw_open(t.path);
    char buf[64], sql[160];
    ck_assert_str_eq(sql_text(c, "PRAGMA integrity_check", buf, sizeof buf), "ok");
    ck_assert_int_eq(sql_int(c, "SELECT count(*) FROM runs"), 2);
    snprintf(sql, sizeof sql, "SELECT status = 'failed' AND error = 'first attempt failed' FROM runs WHERE id = %lld",
             (long long)failed);
    ck_assert_int_eq(sql_int(c, sql), 1);
    ck_assert_int_eq(sql_int(c, "SELECT count(*) FROM metrics"), 2);
    ck_assert_int_eq(sql_int(c, "SELECT count(*) FROM metrics WHERE name = 'decode.token_latency_ms'"), 0);
    sqlite3_close(c);

    /* and the sweep resumes: the configuration is redone */
    ck_assert(!is_done(db, exp, cfg));
    int64_t run = begin_ok(db, exp, cfg, NULL);
    metric_ok(db, run, "a.b", 3, "1", 0, false);
    end_ok(db, run, true, NULL);
    ck_assert(is_done(db, exp, cfg));
    qi_db_close(db);
    ck_assert_int_eq(path_int(t.path, "SELECT count(*) FROM runs"), 2);
    tmp_fini(&t);
}
END_TEST

typedef struct {
    int n;
    int64_t done, failed, running;
    char first[64];
} list_acc;

static int list_cb(const qi_db_experiment_row *r, void *user) {
    list_acc *a = user;
    if (a->n++ == 0) snprintf(a->first, sizeof a->first, "%s", r->name);
    a->done += r->n_done;
    a->failed += r->n_failed;
    a->running += r->n_running;
    return 0;
}

static int list_stop(const qi_db_experiment_row *r, void *user) {
    (void)r;
    ++*(int *)user;
    return 1;
}

/* A reader opens the file and reads while a run holds the write lock; it
 * sees the last committed state. A second writer fails after its busy
 * timeout with a message that names the cause. */
START_TEST(readers_during_a_run) {
    tmp_db t;
    tmp_init(&t);
    qi_db *w = open_ok(t.path);
    int64_t exp = exp_ok(w, "concurrent");
    int64_t r0 = begin_ok(w, exp, "{\"n\":0}", NULL);
    end_ok(w, r0, false, "x");
    int64_t run = begin_ok(w, exp, "{\"n\":1}", NULL);
    metric_ok(w, run, "a.b", 1, "1", 0, false);

    double t0 = qi_test_now();
    qi_db *r = open_ok(t.path);
    ck_assert_msg(qi_test_now() - t0 < 2.0, "opening waited for the writer");
    ck_assert(!is_done(r, exp, "{\"n\":1}"));
    list_acc acc = {0};
    qi_err e = {0};
    ck_assert_int_eq(qi_db_list_experiments(r, list_cb, &acc, &e), QI_OK);
    ck_assert_int_eq(acc.n, 1);
    ck_assert_int_eq(acc.failed, 1);
    ck_assert_int_eq(acc.running, 0); /* the open run is invisible */
    FILE *f = tmpfile();
    ck_assert_int_eq(qi_db_export_csv(r, "concurrent", f, &e), QI_OK);
    ck_assert_int_eq(ftell(f) > 0, 1);
    fclose(f);

    qi_db_busy_timeout(r, 50);
    int64_t id = 0;
    t0 = qi_test_now();
    ck_assert_int_eq(qi_db_experiment(r, "second_writer", NULL, NULL, &id, &e), QI_ERR_DB);
    ck_assert_ptr_nonnull(strstr(e.msg, "another process is writing"));
    ck_assert(qi_test_now() - t0 < 2.0);
    qi_err_clear(&e);
    int64_t run2 = 0;
    ck_assert_int_eq(qi_db_run_begin(r, exp, "{\"n\":2}", NULL, NULL, &run2, &e), QI_ERR_DB);
    ck_assert_ptr_nonnull(strstr(e.msg, "another process is writing"));

    end_ok(w, run, true, NULL);
    ck_assert(is_done(r, exp, "{\"n\":1}"));
    memset(&acc, 0, sizeof acc);
    ck_assert_int_eq(qi_db_list_experiments(r, list_cb, &acc, &e), QI_OK);
    ck_assert_int_eq(acc.done, 1);
    /* now the second handle may write */
    ck_assert_int_eq(qi_db_experiment(r, "second_writer", NULL, NULL, &id, &e), QI_OK);
    int stops = 0;
    ck_assert_int_eq(qi_db_list_experiments(r, list_stop, &stops, &e), QI_OK);
    ck_assert_int_eq(stops, 1);
    qi_db_close(r);
    qi_db_close(w);
    tmp_fini(&t);
}
END_TEST

/* ---- export ---------------------------------------------------------------------------- */

static char *read_stream(FILE *f) {
    long n = ftell(f);
    ck_assert_int_ge(n, 0);
    rewind(f);
    char *s = malloc((size_t)n + 1);
    ck_assert_ptr_nonnull(s);
    ck_assert_uint_eq(fread(s, 1, (size_t)n, f), (size_t)n);
    s[n] = 0;
    return s;
}

START_TEST(export_csv_format) {
    tmp_db t;
    tmp_init(&t);
    qi_db *db = open_ok(t.path);
    int64_t exp = exp_ok(db, "table");
    exp_ok(db, "unrelated");
    qi_db_run_info info;
    qi_db_run_info_init(&info, NULL);
    info.git_rev = "abc123";
    info.git_dirty = 0;
    info.cpu = "Test CPU, 4 cores";
    info.cores = 4;
    info.mem_bytes = 1024;
    info.model_path = "m.gguf";
    info.model_sha256 = "ff";
    info.has_seed = true;
    info.seed = 42;
    int64_t a = begin_ok(db, exp, "{\"model\":\"m1\",\"kv\":{\"policy\":\"h2o\",\"budget\":0.5},\"sizes\":[1,2]}",
                         &info);
    metric_ok(db, a, "kv.working_bytes", 1048576, "B", 0, true);
    metric_ok(db, a, "decode.tokens_per_s", 0.1, "tok/s", 1, false);
    metric_ok(db, a, "decode.tokens_per_s", 41.7, "tok/s", 0, false);
    end_ok(db, a, true, NULL);
    int64_t failed = begin_ok(db, exp, "{\"model\":\"broken\",\"extra\":1}", NULL);
    metric_ok(db, failed, "decode.tokens_per_s", 1, "tok/s", 0, false);
    end_ok(db, failed, false, "x");
    int64_t b = begin_ok(db, exp, "{\"kv\":{\"policy\":\"full\"},\"model\":\"a,\\\"b\\\"\",\"on\":true,\"note\":null}",
                         NULL);
    metric_ok(db, b, "ppl.value", 12.25, "1", 0, false);
    metric_ok(db, b, "op.attn_ms", 1e-300, "ms", 0, false);
    end_ok(db, b, true, NULL);

    FILE *f = tmpfile();
    qi_err e = {0};
    ck_assert_msg(qi_db_export_csv(db, "table", f, &e) == QI_OK, "%s", e.msg);
    char *csv = read_stream(f);
    fclose(f);

    sqlite3 *c = raw_open(t.path);
    char sa[40], fa[40], sb[40], fb[40], sql[128];
    snprintf(sql, sizeof sql, "SELECT started FROM runs WHERE id = %lld", (long long)a);
    sql_text(c, sql, sa, sizeof sa);
    snprintf(sql, sizeof sql, "SELECT finished FROM runs WHERE id = %lld", (long long)a);
    sql_text(c, sql, fa, sizeof fa);
    snprintf(sql, sizeof sql, "SELECT started FROM runs WHERE id = %lld", (long long)b);
    sql_text(c, sql, sb, sizeof sb);
    snprintf(sql, sizeof sql, "SELECT finished FROM runs WHERE id = %lld", (long long)b);
    sql_text(c, sql, fb, sizeof fb);
    sqlite3_close(c);

    char want[4096];
    const char *pa = "abc123,0,\"Test CPU, 4 cores\",4,1024,,,m.gguf,ff,0.1.0,42,0.5,h2o,m1,,,1,2";
    const char *pb = ",,,,,,,,,,,,,full,\"a,\"\"b\"\"\",,true,,";
    snprintf(want, sizeof want,
             "run_id,started,finished,git_rev,git_dirty,cpu,cores,mem_bytes,gpu,gpu_driver,model_path,"
             "model_sha256,engine_version,seed,config.kv.budget,config.kv.policy,config.model,config.note,"
             "config.on,config.sizes[0],config.sizes[1],metric,value,unit,repetition,simulated\r\n"
             "%lld,%s,%s,%s,decode.tokens_per_s,41.7,tok/s,0,0\r\n"
             "%lld,%s,%s,%s,decode.tokens_per_s,0.1,tok/s,1,0\r\n"
             "%lld,%s,%s,%s,kv.working_bytes,1048576,B,0,1\r\n"
             "%lld,%s,%s%s,op.attn_ms,1e-300,ms,0,0\r\n"
             "%lld,%s,%s%s,ppl.value,12.25,1,0,0\r\n",
             (long long)a, sa, fa, pa, (long long)a, sa, fa, pa, (long long)a, sa, fa, pa, (long long)b, sb, fb, pb,
             (long long)b, sb, fb, pb);
    ck_assert_str_eq(csv, want);
    free(csv);

    /* an experiment without finished runs: the header alone */
    f = tmpfile();
    ck_assert_int_eq(qi_db_export_csv(db, "unrelated", f, &e), QI_OK);
    csv = read_stream(f);
    fclose(f);
    ck_assert_str_eq(csv, "run_id,started,finished,git_rev,git_dirty,cpu,cores,mem_bytes,gpu,gpu_driver,model_path,"
                          "model_sha256,engine_version,seed,metric,value,unit,repetition,simulated\r\n");
    free(csv);

    f = tmpfile();
    qi_err_clear(&e);
    ck_assert_int_eq(qi_db_export_csv(db, "no_such", f, &e), QI_ERR_INVALID);
    ck_assert_ptr_nonnull(strstr(e.msg, "no experiment named 'no_such'"));
    fclose(f);
    qi_db_close(db);
    tmp_fini(&t);
}
END_TEST

/* ---- hostile files and paths ---------------------------------------------------------------- */

/* Summaries: grouping by a configuration path, the mean and sample sd over
 * runs x repetitions against hand-computed values, failed runs left out,
 * numeric key order, simulated marks, per-run rows, and the errors. */
START_TEST(summary_statistics) {
    tmp_db t;
    tmp_init(&t);
    qi_db *db = open_ok(t.path);
    int64_t exp = exp_ok(db, "sum");
    /* policy h2o, budgets 0.5 (two runs) and 0.25; full once; one failed run */
    int64_t r1 = begin_ok(db, exp, "{\"kv\":{\"policy\":\"h2o\",\"budget\":0.5},\"seed\":1}", NULL);
    metric_ok(db, r1, "decode.tokens_per_s", 10, "tok/s", 0, false);
    metric_ok(db, r1, "decode.tokens_per_s", 14, "tok/s", 1, false);
    metric_ok(db, r1, "ppl.value", 30, "1", 0, false);
    end_ok(db, r1, true, NULL);
    int64_t r2 = begin_ok(db, exp, "{\"kv\":{\"policy\":\"h2o\",\"budget\":0.5},\"seed\":2}", NULL);
    metric_ok(db, r2, "decode.tokens_per_s", 18, "tok/s", 0, false);
    metric_ok(db, r2, "ppl.value", 31, "1", 0, true);
    end_ok(db, r2, true, NULL);
    int64_t r3 = begin_ok(db, exp, "{\"kv\":{\"policy\":\"h2o\",\"budget\":0.25},\"seed\":1}", NULL);
    metric_ok(db, r3, "decode.tokens_per_s", 20, "tok/s", 0, false);
    end_ok(db, r3, true, NULL);
    int64_t r4 = begin_ok(db, exp, "{\"kv\":{\"policy\":\"full\",\"budget\":1},\"seed\":1}", NULL);
    metric_ok(db, r4, "decode.tokens_per_s", 7, "tok/s", 0, false);
    end_ok(db, r4, true, NULL);
    int64_t bad = begin_ok(db, exp, "{\"kv\":{\"policy\":\"h2o\",\"budget\":0.5},\"seed\":3}", NULL);
    metric_ok(db, bad, "decode.tokens_per_s", 1000, "tok/s", 0, false);
    end_ok(db, bad, false, "crashed");

    qi_err e = {0};
    qi_db_summary *s = NULL;
    const char *by[] = {"kv.policy", "kv.budget"}, *met[] = {"decode.tokens_per_s", "ppl.value"};
    qi_db_summary_opts o = {by, 2, met, 2};
    ck_assert_msg(qi_db_summary_create(db, "sum", &o, &s, &e) == QI_OK, "%s", e.msg);
    ck_assert_int_eq(s->n_rows, 3);
    ck_assert_int_eq(s->n_keys, 2);
    ck_assert_int_eq(s->n_metrics, 2);
    ck_assert_str_eq(s->units[0], "tok/s");
    /* rows sorted by policy, then budget in numeric order */
    ck_assert_str_eq(s->text[0], "full");
    ck_assert_str_eq(s->text[2], "h2o");
    ck_assert_str_eq(s->text[3], "0.25");
    ck_assert_str_eq(s->text[4], "h2o");
    ck_assert_str_eq(s->text[5], "0.5");
    ck_assert_str_eq(s->json[4], "\"h2o\"");
    /* full: one value */
    ck_assert_int_eq(s->cells[0].n, 1);
    ck_assert(s->cells[0].mean == 7 && s->cells[0].sd == 0);
    ck_assert_int_eq(s->cells[1].n, 0);
    ck_assert(isnan(s->cells[1].mean));
    /* h2o 0.5: 10, 14, 18 over two runs (the failed run's 1000 left out):
     * mean 14, sample sd 4 */
    const qi_db_cell *c = &s->cells[2 * 2];
    ck_assert_int_eq(s->n_runs[2], 2);
    ck_assert_int_eq(c->n, 3);
    ck_assert_msg(fabs(c->mean - 14.0) < 1e-12 && fabs(c->sd - 4.0) < 1e-12, "mean %g sd %g", c->mean, c->sd);
    ck_assert(!c->simulated);
    /* ppl 30 and 31 (simulated): mean 30.5, sd sqrt(0.5) */
    c = &s->cells[2 * 2 + 1];
    ck_assert_int_eq(c->n, 2);
    ck_assert(fabs(c->mean - 30.5) < 1e-12 && fabs(c->sd - sqrt(0.5)) < 1e-12);
    ck_assert(c->simulated && s->any_simulated);
    qi_db_summary_free(s);

    /* per run: finished runs only, by id, every configuration leaf a key */
    qi_db_summary_opts all = {NULL, 0, NULL, 0};
    ck_assert_msg(qi_db_summary_create(db, "sum", &all, &s, &e) == QI_OK, "%s", e.msg);
    ck_assert(s->per_run);
    ck_assert_int_eq(s->n_rows, 4);
    ck_assert_int_eq(s->run_ids[0], r1);
    ck_assert_int_eq(s->run_ids[3], r4);
    ck_assert_int_eq(s->n_keys, 3);
    ck_assert_int_eq(s->n_metrics, 2);
    qi_db_summary_free(s);

    /* errors name what exists */
    const char *nope[] = {"kv.nope"}, *nom[] = {"no.metric"};
    qi_db_summary_opts bad_by = {nope, 1, NULL, 0}, bad_m = {NULL, 0, nom, 1};
    ck_assert_int_eq(qi_db_summary_create(db, "sum", &bad_by, &s, &e), QI_ERR_INVALID);
    ck_assert_ptr_null(s);
    ck_assert_msg(strstr(e.msg, "kv.nope") && strstr(e.msg, "kv.policy"), "%s", e.msg);
    e = (qi_err){0};
    ck_assert_int_eq(qi_db_summary_create(db, "sum", &bad_m, &s, &e), QI_ERR_INVALID);
    ck_assert_msg(strstr(e.msg, "no.metric") && strstr(e.msg, "ppl.value"), "%s", e.msg);
    e = (qi_err){0};
    ck_assert_int_eq(qi_db_summary_create(db, "nothing", &all, &s, &e), QI_ERR_INVALID);
    e = (qi_err){0};
    qi_db_close(db);

    /* read-only open: reads, and leaves the file untouched */
    qi_db *ro = NULL;
    ck_assert_msg(qi_db_open_read(t.path, &ro, &e) == QI_OK, "%s", e.msg);
    ck_assert_msg(qi_db_summary_create(ro, "sum", &o, &s, &e) == QI_OK, "%s", e.msg);
    ck_assert_int_eq(s->n_rows, 3);
    qi_db_summary_free(s);
    qi_db_close(ro);
    char missing[600];
    snprintf(missing, sizeof missing, "%s.absent", t.path);
    ck_assert_int_ne(qi_db_open_read(missing, &ro, &e), QI_OK);
    ck_assert_ptr_null(ro);
    tmp_fini(&t);
}
END_TEST

/* A measurement's parameters are not part of its name: one name, values
 * apart per params; shown and selected as name[key=value]. */
START_TEST(metric_params) {
    tmp_db t;
    tmp_init(&t);
    qi_db *db = open_ok(t.path);
    int64_t exp = exp_ok(db, "par");
    int64_t r = begin_ok(db, exp, "{\"kv\":\"full\"}", NULL);
    qi_err e = {0};
    ck_assert_int_eq(qi_db_metric_params(db, r, "decode.tokens_per_s", "{\"batch\":1}", 40, "tok/s", 0, false, &e),
                     QI_OK);
    ck_assert_int_eq(qi_db_metric_params(db, r, "decode.tokens_per_s", " { \"batch\" : 4 } ", 120, "tok/s", 0, false,
                                         &e),
                     QI_OK);
    metric_ok(db, r, "decode.tokens_per_s", 99, "tok/s", 0, false); /* no params: another value again */
    ck_assert_int_eq(qi_db_metric_params(db, r, "decode.tokens_per_s", "{\"batch\":4}", 1, "tok/s", 0, false, &e),
                     QI_ERR_INVALID);
    ck_assert_msg(strstr(e.msg, "recorded twice") && strstr(e.msg, "{\"batch\":4}"), "%s", e.msg);
    e = (qi_err){0};
    ck_assert_int_eq(qi_db_metric_params(db, r, "decode.tokens_per_s", "[4]", 1, "tok/s", 1, false, &e),
                     QI_ERR_INVALID);
    ck_assert_msg(strstr(e.msg, "not a JSON object"), "%s", e.msg);
    e = (qi_err){0};
    ck_assert_int_eq(qi_db_metric_params(db, r, "decode.tokens_per_s", "{batch:4}", 1, "tok/s", 1, false, &e),
                     QI_ERR_INVALID);
    e = (qi_err){0};
    end_ok(db, r, true, NULL);
    char buf[64];
    sqlite3 *c = raw_open(t.path);
    ck_assert_str_eq(sql_text(c, "SELECT params FROM metrics WHERE value = 120", buf, sizeof buf), "{\"batch\":4}");
    ck_assert_str_eq(sql_text(c, "SELECT params FROM metrics WHERE value = 99", buf, sizeof buf), "{}");
    sqlite3_close(c);
    qi_db_summary *s = NULL;
    const char *met[] = {"decode.tokens_per_s[batch=4]", "decode.tokens_per_s[batch=1]", "decode.tokens_per_s"};
    qi_db_summary_opts o = {NULL, 0, met, 3};
    ck_assert_msg(qi_db_summary_create(db, "par", &o, &s, &e) == QI_OK, "%s", e.msg);
    ck_assert_int_eq(s->n_rows, 1);
    ck_assert(s->cells[0].mean == 120 && s->cells[1].mean == 40 && s->cells[2].mean == 99);
    qi_db_summary_free(s);
    qi_db_close(db);
    tmp_fini(&t);
}
END_TEST

/* A database of schema version 2 with the old names reads under the new
 * ones after migration 0003: the batch moves into params, milliseconds
 * become seconds, everything else is kept as it was. */
START_TEST(old_metric_names_mapped) {
    tmp_db t;
    tmp_init(&t);
    sqlite3 *c = NULL;
    ck_assert_int_eq(sqlite3_open(t.path, &c), SQLITE_OK);
    const char *files[] = {QI_SOURCE_DIR "/results/migrations/0001_init.sql",
                           QI_SOURCE_DIR "/results/migrations/0002_placement.sql"};
    for (int i = 0; i < 2; i++) {
        size_t len;
        char *sql = qi_test_read_file(files[i], &len);
        ck_assert_ptr_nonnull(sql);
        ck_assert_msg(sqlite3_exec(c, sql, NULL, NULL, NULL) == SQLITE_OK, "%s: %s", files[i], sqlite3_errmsg(c));
        free(sql);
    }
    ck_assert_msg(sqlite3_exec(c,
                               "PRAGMA application_id = 1363758662; PRAGMA user_version = 2;"
                               "INSERT INTO experiments (id, name) VALUES (1, 'kv_quickstart');"
                               "INSERT INTO runs (id, experiment_id, config_json, config_key, status)"
                               " VALUES (1, 1, '{\"kv_policy\":\"h2o\"}', 'k1', 'done');"
                               "INSERT INTO metrics (run_id, name, value, unit, repetition) VALUES"
                               " (1, 'decode.b1_tokens_per_s', 41.5, 'tok/s', 0),"
                               " (1, 'decode.b1_tokens_per_s', 42.5, 'tok/s', 1),"
                               " (1, 'decode.b16_tokens_per_s', 300, 'tok/s', 0),"
                               " (1, 'prefill.b4_ttft_s', 0.25, 's', 0),"
                               " (1, 'prefill.ttft_ms', 250, 'ms', 1),"
                               " (1, 'decode.tpot_ms', 20, 'ms', 0),"
                               " (1, 'ppl.value', 30.5, '1', 0);",
                               NULL, NULL, NULL) == SQLITE_OK,
                  "%s", sqlite3_errmsg(c));
    sqlite3_close(c);
    /* read-only, it reads as the migration will write it */
    qi_db *ro = NULL;
    qi_err e = {0};
    ck_assert_msg(qi_db_open_read(t.path, &ro, &e) == QI_OK, "%s", e.msg);
    static char before[8192], after[8192];
    FILE *f = fmemopen(before, sizeof before - 1, "w");
    ck_assert_msg(qi_db_export_csv(ro, "kv_quickstart", f, &e) == QI_OK, "%s", e.msg);
    fclose(f);
    qi_db_close(ro);
    ck_assert_ptr_nonnull(strstr(before, "decode.tokens_per_s[batch=16],300,tok/s"));
    ck_assert_ptr_null(strstr(before, "decode.b1"));
    ck_assert_int_eq(path_int(t.path, "PRAGMA user_version"), 2); /* untouched */
    qi_db_close(open_ok(t.path)); /* migrates */
    ck_assert_msg(qi_db_open_read(t.path, &ro, &e) == QI_OK, "%s", e.msg);
    f = fmemopen(after, sizeof after - 1, "w");
    ck_assert_msg(qi_db_export_csv(ro, "kv_quickstart", f, &e) == QI_OK, "%s", e.msg);
    fclose(f);
    qi_db_close(ro);
    ck_assert_str_eq(before, after);
    c = raw_open(t.path);
    ck_assert_int_eq(sql_int(c, "PRAGMA user_version"), qi_db_schema_version());
    ck_assert_int_eq(sql_int(c, "SELECT count(*) FROM metrics"), 7);
    ck_assert_int_eq(sql_int(c, "SELECT count(*) FROM metrics WHERE name = 'decode.tokens_per_s'"
                                " AND params = '{\"batch\":1}' AND unit = 'tok/s'"), 2);
    ck_assert_int_eq(sql_int(c, "SELECT value FROM metrics WHERE name = 'decode.tokens_per_s'"
                                " AND params = '{\"batch\":16}'"), 300);
    ck_assert_int_eq(sql_int(c, "SELECT count(*) FROM metrics WHERE name = 'prefill.ttft_s' AND unit = 's'"
                                " AND abs(value - 0.25) < 1e-12"), 2);
    ck_assert_int_eq(sql_int(c, "SELECT count(*) FROM metrics WHERE name = 'prefill.ttft_s'"
                                " AND params = '{\"batch\":4}'"), 1);
    ck_assert_int_eq(sql_int(c, "SELECT count(*) FROM metrics WHERE name = 'decode.tpot_s' AND unit = 's'"
                                " AND abs(value - 0.02) < 1e-12"), 1);
    ck_assert_int_eq(sql_int(c, "SELECT count(*) FROM metrics WHERE name = 'ppl.value' AND params = '{}'"), 1);
    ck_assert_int_eq(sql_int(c, "SELECT count(*) FROM metrics WHERE name GLOB '*.b[0-9]*' OR name GLOB '*_ms'"), 0);
    ck_assert_int_eq(sql_int(c, "SELECT count(*) FROM pragma_integrity_check WHERE integrity_check = 'ok'"), 1);
    ck_assert_int_eq(sql_int(c, "SELECT count(*) FROM pragma_foreign_key_check"), 0);
    sqlite3_close(c);
    tmp_fini(&t);
}
END_TEST

void db_crash_add(TCase *tc) {
    tcase_add_test(tc, killed_run_leaves_no_trace);
    tcase_add_test(tc, readers_during_a_run);
    tcase_add_test(tc, export_csv_format);
    tcase_add_test(tc, summary_statistics);
    tcase_add_test(tc, metric_params);
    tcase_add_test(tc, old_metric_names_mapped);
}

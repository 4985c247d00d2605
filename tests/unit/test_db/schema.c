/* schema.c - the schema and its migrations; experiments and runs: the lifecycle, resume rules, misuse. */
#include "db_test.h"

/* ---- schema and migrations ------------------------------------------------------------ */

/* The schema as a comparable text: every table, index and trigger with its
 * SQL, comments dropped and whitespace normalised, plus each table's columns
 * as SQLite reports them. */
static void schema_describe(sqlite3 *c, char *out, size_t n) {
    size_t used = 0;
    out[0] = 0;
    sqlite3_stmt *s = NULL;
    ck_assert_int_eq(sqlite3_prepare_v2(c,
                                        "SELECT type, name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'"
                                        " ORDER BY type, name",
                                        -1, &s, NULL),
                     SQLITE_OK);
    while (sqlite3_step(s) == SQLITE_ROW) {
        const char *sql = (const char *)sqlite3_column_text(s, 2);
        used += (size_t)snprintf(out + used, n - used, "%s %s: ", sqlite3_column_text(s, 0), sqlite3_column_text(s, 1));
        ck_assert_uint_lt(used, n);
        bool space = false;
        char prev = 0;
        for (const char *p = sql ? sql : ""; *p; p++) {
            if (p[0] == '-' && p[1] == '-') {
                while (*p && *p != '\n') p++;
                if (!*p) break;
            }
            if (*p == ' ' || *p == '\n' || *p == '\t' || *p == '\r') {
                space = true;
                continue;
            }
            bool punct = strchr("(),", *p) != NULL;
            if (space && !punct && prev && !strchr("(,", prev)) out[used++] = ' ';
            space = false;
            out[used++] = *p;
            prev = *p;
            ck_assert_uint_lt(used + 1, n);
        }
        out[used++] = '\n';
        out[used] = 0;
    }
    sqlite3_finalize(s);
    ck_assert_int_eq(sqlite3_prepare_v2(c,
                                        "SELECT m.name, p.cid, p.name, p.type, p.'notnull', p.dflt_value, p.pk"
                                        " FROM sqlite_master m, pragma_table_xinfo(m.name) p"
                                        " WHERE m.type = 'table' AND m.name NOT LIKE 'sqlite_%' ORDER BY m.name, p.cid",
                                        -1, &s, NULL),
                     SQLITE_OK);
    while (sqlite3_step(s) == SQLITE_ROW) {
        used += (size_t)snprintf(out + used, n - used, "%s.%d %s %s %d %s %d\n", sqlite3_column_text(s, 0),
                                 sqlite3_column_int(s, 1), sqlite3_column_text(s, 2), sqlite3_column_text(s, 3),
                                 sqlite3_column_int(s, 4),
                                 sqlite3_column_text(s, 5) ? (const char *)sqlite3_column_text(s, 5) : "-",
                                 sqlite3_column_int(s, 6));
        ck_assert_uint_lt(used, n);
    }
    sqlite3_finalize(s);
}

START_TEST(fresh_schema) {
    tmp_db t;
    tmp_init(&t);
    ck_assert_int_ge(qi_db_schema_version(), 1);
    qi_db *db = open_ok(t.path);
    sqlite3 *c = raw_open(t.path);
    ck_assert_int_eq(sql_int(c, "PRAGMA user_version"), qi_db_schema_version());
    ck_assert_int_eq(sql_int(c, "PRAGMA application_id"), 0x51494E46);
    ck_assert_int_eq(sql_int(c, "SELECT count(*) FROM sqlite_master WHERE type = 'table'"
                                " AND name IN ('experiments', 'runs', 'metrics')"),
                     3);
    char buf[64];
    ck_assert_str_eq(sql_text(c, "PRAGMA journal_mode", buf, sizeof buf), "wal");
    ck_assert_int_eq(sql_int(c, "SELECT count(*) FROM experiments"), 0);
    sqlite3_close(c);

    /* Foreign keys are enforced on the handle's connection: a metric of a
     * missing run cannot exist, and deleting a run removes its metrics. */
    int64_t exp = exp_ok(db, "fk");
    int64_t run = begin_ok(db, exp, "{}", NULL);
    metric_ok(db, run, "a.b", 1, "1", 0, false);
    end_ok(db, run, true, NULL);
    qi_db_close(db);
    c = raw_open(t.path);
    sqlite3_exec(c, "PRAGMA foreign_keys = ON", NULL, NULL, NULL);
    ck_assert_int_ne(sqlite3_exec(c, "INSERT INTO metrics (run_id, name, value, unit) VALUES (999, 'a.b', 1, '1')",
                                  NULL, NULL, NULL),
                     SQLITE_OK);
    ck_assert_int_eq(sqlite3_exec(c, "DELETE FROM experiments", NULL, NULL, NULL), SQLITE_OK);
    ck_assert_int_eq(sql_int(c, "SELECT count(*) FROM metrics"), 0);
    sqlite3_close(c);
    tmp_fini(&t);
}
END_TEST

/* Every migration file is compiled in: the schema version is their count. */
START_TEST(migrations_embedded) {
    DIR *d = opendir(QI_SOURCE_DIR "/results/migrations");
    ck_assert_ptr_nonnull(d);
    int n = 0;
    struct dirent *ent;
    while ((ent = readdir(d))) {
        size_t len = strlen(ent->d_name);
        if (len > 4 && !strcmp(ent->d_name + len - 4, ".sql")) n++;
    }
    closedir(d);
    ck_assert_int_eq(qi_db_schema_version(), n);
}
END_TEST

/* results/schema.sql, the file people read, describes what the migrations
 * build; a planted difference (a dropped column) must be caught. */
START_TEST(schema_file_matches_migrations) {
    tmp_db t;
    tmp_init(&t);
    qi_db_close(open_ok(t.path));
    static char from_migrations[32768], from_file[32768], planted[32768];
    sqlite3 *c = raw_open(t.path);
    schema_describe(c, from_migrations, sizeof from_migrations);
    sqlite3_close(c);

    size_t len;
    char *sql = qi_test_read_file(QI_SOURCE_DIR "/results/schema.sql", &len);
    ck_assert_ptr_nonnull(sql);
    ck_assert_int_eq(sqlite3_open(":memory:", &c), SQLITE_OK);
    ck_assert_msg(sqlite3_exec(c, sql, NULL, NULL, NULL) == SQLITE_OK, "schema.sql: %s", sqlite3_errmsg(c));
    schema_describe(c, from_file, sizeof from_file);
    sqlite3_close(c);
    ck_assert_msg(!strcmp(from_migrations, from_file), "results/schema.sql differs from the migrations:\n%s\n---\n%s",
                  from_file, from_migrations);

    char *seed = strstr(sql, "    seed ");
    ck_assert_ptr_nonnull(seed);
    char *eol = strchr(seed, '\n');
    memmove(seed, eol + 1, strlen(eol + 1) + 1);
    ck_assert_int_eq(sqlite3_open(":memory:", &c), SQLITE_OK);
    ck_assert_int_eq(sqlite3_exec(c, sql, NULL, NULL, NULL), SQLITE_OK);
    schema_describe(c, planted, sizeof planted);
    sqlite3_close(c);
    ck_assert_msg(strcmp(from_migrations, planted) != 0, "the comparison missed a dropped column");
    free(sql);
    tmp_fini(&t);
}
END_TEST

START_TEST(reopen_is_noop) {
    tmp_db t;
    tmp_init(&t);
    qi_db *db = open_ok(t.path);
    int64_t exp = exp_ok(db, "keep");
    qi_db_close(db);
    int64_t objs = path_int(t.path, "SELECT count(*) FROM sqlite_master");
    for (int i = 0; i < 3; i++) {
        db = open_ok(t.path);
        ck_assert_int_eq(exp_ok(db, "keep"), exp);
        qi_db_close(db);
    }
    ck_assert_int_eq(path_int(t.path, "PRAGMA user_version"), qi_db_schema_version());
    ck_assert_int_eq(path_int(t.path, "SELECT count(*) FROM sqlite_master"), objs);
    ck_assert_int_eq(path_int(t.path, "SELECT count(*) FROM experiments"), 1);

    /* An empty file (what `touch` makes) is a new database. */
    char empty[160];
    snprintf(empty, sizeof empty, "%s/empty.db", t.dir);
    write_file(empty, "", 0);
    qi_db_close(open_ok(empty));
    ck_assert_int_eq(path_int(empty, "PRAGMA user_version"), qi_db_schema_version());
    tmp_fini(&t);
}
END_TEST

/* A database written by a later qinfer (schema version beyond ours) and one
 * of another program are refused, and left as they were. */
START_TEST(future_and_foreign_refused) {
    tmp_db t;
    tmp_init(&t);
    qi_db_close(open_ok(t.path));
    sqlite3 *c = raw_open(t.path);
    char sql[64];
    snprintf(sql, sizeof sql, "PRAGMA user_version = %d", qi_db_schema_version() + 1);
    ck_assert_int_eq(sqlite3_exec(c, sql, NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(c);
    qi_db *db = (qi_db *)1;
    qi_err e = {0};
    ck_assert_int_eq(qi_db_open(t.path, &db, &e), QI_ERR_UNSUPPORTED);
    ck_assert_ptr_null(db);
    ck_assert_ptr_nonnull(strstr(e.msg, "newer than this qinfer knows"));
    ck_assert_ptr_nonnull(strstr(e.msg, t.path));
    ck_assert_int_eq(path_int(t.path, "PRAGMA user_version"), qi_db_schema_version() + 1);

    char other[160];
    snprintf(other, sizeof other, "%s/other.db", t.dir);
    ck_assert_int_eq(sqlite3_open(other, &c), SQLITE_OK);
    ck_assert_int_eq(sqlite3_exec(c, "PRAGMA application_id = 1234; CREATE TABLE t (x)", NULL, NULL, NULL),
                     SQLITE_OK);
    sqlite3_close(c);
    qi_err_clear(&e);
    ck_assert_int_eq(qi_db_open(other, &db, &e), QI_ERR_DB);
    ck_assert_ptr_nonnull(strstr(e.msg, "not a qinfer results database"));

    /* Unmarked but versioned: also someone else's. */
    ck_assert_int_eq(sqlite3_open(other, &c), SQLITE_OK);
    ck_assert_int_eq(sqlite3_exec(c, "PRAGMA application_id = 0; PRAGMA user_version = 7", NULL, NULL, NULL),
                     SQLITE_OK);
    sqlite3_close(c);
    qi_err_clear(&e);
    ck_assert_int_eq(qi_db_open(other, &db, &e), QI_ERR_DB);
    ck_assert_ptr_nonnull(strstr(e.msg, "not a qinfer results database"));

    /* A name clash with an unmarked file: the migration fails whole. */
    char clash[160];
    snprintf(clash, sizeof clash, "%s/clash.db", t.dir);
    ck_assert_int_eq(sqlite3_open(clash, &c), SQLITE_OK);
    ck_assert_int_eq(sqlite3_exec(c, "CREATE TABLE metrics (x)", NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(c);
    qi_err_clear(&e);
    ck_assert_int_eq(qi_db_open(clash, &db, &e), QI_ERR_DB);
    ck_assert_ptr_nonnull(strstr(e.msg, "0001_init.sql"));
    ck_assert_int_eq(path_int(clash, "PRAGMA user_version"), 0);
    ck_assert_int_eq(path_int(clash, "SELECT count(*) FROM sqlite_master WHERE name = 'experiments'"), 0);
    tmp_fini(&t);
}
END_TEST

/* ---- experiments and runs ------------------------------------------------------------ */

START_TEST(experiment_get_or_create) {
    tmp_db t;
    tmp_init(&t);
    qi_db *db = open_ok(t.path);
    int64_t a = 0, a2 = 0, b = 0;
    qi_err e = {0};
    ck_assert_int_eq(qi_db_experiment(db, "kv_sweep", "experiments/kv_sweep.lua", "aa", &a, &e), QI_OK);
    ck_assert_int_eq(qi_db_experiment(db, "other", NULL, NULL, &b, &e), QI_OK);
    ck_assert_int_ne(a, b);
    ck_assert_int_eq(qi_db_experiment(db, "kv_sweep", "experiments/kv_sweep.lua", "bb", &a2, &e), QI_OK);
    ck_assert_int_eq(a, a2);
    ck_assert_int_eq(qi_db_experiment(db, "kv_sweep", NULL, NULL, &a2, &e), QI_OK); /* NULL keeps */
    ck_assert_int_eq(a, a2);
    qi_db_close(db);
    sqlite3 *c = raw_open(t.path);
    char buf[128];
    ck_assert_str_eq(sql_text(c, "SELECT script_sha256 FROM experiments WHERE name = 'kv_sweep'", buf, sizeof buf),
                     "bb");
    ck_assert_str_eq(sql_text(c, "SELECT script_path FROM experiments WHERE name = 'kv_sweep'", buf, sizeof buf),
                     "experiments/kv_sweep.lua");
    ck_assert_int_eq(sql_int(c, "SELECT count(*) FROM experiments"), 2);
    ck_assert_int_eq(sql_int(c, "SELECT created LIKE '____-__-__T__:__:__.___Z' FROM experiments LIMIT 1"), 1);
    sqlite3_close(c);

    db = open_ok(t.path);
    qi_err_clear(&e);
    ck_assert_int_eq(qi_db_experiment(db, "", NULL, NULL, &a2, &e), QI_ERR_INVALID);
    ck_assert_int_eq(a2, 0);
    qi_db_close(db);
    tmp_fini(&t);
}
END_TEST

START_TEST(run_lifecycle) {
    tmp_db t;
    tmp_init(&t);
    qi_db *db = open_ok(t.path);
    int64_t exp = exp_ok(db, "life");
    const char *cfg = "{ \"policy\": \"h2o\", \"budget\": 0.5 }";
    ck_assert(!is_done(db, exp, cfg));

    qi_db_run_info info;
    qi_db_run_info_init(&info, NULL);
    ck_assert_str_eq(info.engine_version, "0.1.0");
    ck_assert_int_eq(info.git_dirty, -1);
    info.git_rev = "0123456789abcdef0123456789abcdef01234567";
    info.git_dirty = 1;
    info.cpu = "Test CPU";
    info.cores = 8;
    info.mem_bytes = 64ull << 30;
    info.gpu = "NVIDIA H200";
    info.gpu_driver = "550.54.15 (CUDA 12.4)";
    info.model_path = "/models/m.gguf";
    info.model_sha256 = "ab";
    info.has_seed = true;
    info.seed = UINT64_MAX; /* stored as -1, the same 64 bits */
    int64_t run = begin_ok(db, exp, cfg, &info);
    metric_ok(db, run, "decode.tokens_per_s", 41.7, "tok/s", 0, false);
    metric_ok(db, run, "decode.tokens_per_s", 42.1, "tok/s", 1, false);
    metric_ok(db, run, "kv.working_bytes", 1048576, "B", 0, false);
    ck_assert(!is_done(db, exp, cfg)); /* not until run_end */
    end_ok(db, run, true, "ignored when ok");
    ck_assert(is_done(db, exp, cfg));
    ck_assert(is_done(db, exp, "{\"budget\":0.5,\"policy\":\"h2o\"}")); /* any spelling */
    ck_assert(!is_done(db, exp, "{\"budget\":0.25,\"policy\":\"h2o\"}"));

    /* A failed run keeps its metrics and its message, and is not done. */
    const char *cfg2 = "{\"policy\":\"window\"}";
    int64_t run2 = begin_ok(db, exp, cfg2, NULL);
    metric_ok(db, run2, "prefill.ms", 12.5, "ms", 0, false);
    end_ok(db, run2, false, "out of memory at step 3");
    ck_assert(!is_done(db, exp, cfg2));
    qi_db_close(db);

    sqlite3 *c = raw_open(t.path);
    char buf[256], sql[256], key[65];
    snprintf(sql, sizeof sql, "SELECT %%s FROM runs WHERE id = %lld", (long long)run);
#define RUN_TEXT(col) (snprintf(buf, sizeof buf, sql, col), sql_text(c, buf, buf, sizeof buf))
#define RUN_INT(col) (snprintf(buf, sizeof buf, sql, col), sql_int(c, buf))
    ck_assert_str_eq(RUN_TEXT("status"), "done");
    ck_assert_str_eq(RUN_TEXT("config_json"), "{\"budget\":0.5,\"policy\":\"h2o\"}");
    sha_hex("{\"budget\":0.5,\"policy\":\"h2o\"}", key);
    ck_assert_str_eq(RUN_TEXT("config_key"), key);
    ck_assert_str_eq(RUN_TEXT("error"), "(null)");
    ck_assert_str_eq(RUN_TEXT("git_rev"), "0123456789abcdef0123456789abcdef01234567");
    ck_assert_int_eq(RUN_INT("git_dirty"), 1);
    ck_assert_str_eq(RUN_TEXT("cpu"), "Test CPU");
    ck_assert_int_eq(RUN_INT("cores"), 8);
    ck_assert_int_eq(RUN_INT("mem_bytes"), 64ll << 30);
    ck_assert_str_eq(RUN_TEXT("gpu"), "NVIDIA H200");
    ck_assert_str_eq(RUN_TEXT("gpu_driver"), "550.54.15 (CUDA 12.4)");
    ck_assert_str_eq(RUN_TEXT("model_path"), "/models/m.gguf");
    ck_assert_str_eq(RUN_TEXT("model_sha256"), "ab");
    ck_assert_str_eq(RUN_TEXT("engine_version"), "0.1.0");
    ck_assert(RUN_INT("seed") == -1 && (uint64_t)RUN_INT("seed") == UINT64_MAX);
    ck_assert_int_eq(RUN_INT("simulated"), 0);
    ck_assert_int_eq(RUN_INT("started <= finished AND finished LIKE '____-__-__T__:__:__.___Z'"), 1);
    snprintf(sql, sizeof sql, "SELECT %%s FROM runs WHERE id = %lld", (long long)run2);
    ck_assert_str_eq(RUN_TEXT("status"), "failed");
    ck_assert_str_eq(RUN_TEXT("error"), "out of memory at step 3");
    ck_assert_int_eq(RUN_INT("git_dirty IS NULL AND seed IS NULL AND cpu IS NULL AND engine_version IS NULL"), 1);
#undef RUN_TEXT
#undef RUN_INT
    snprintf(sql, sizeof sql, "SELECT count(*) FROM metrics WHERE run_id = %lld", (long long)run);
    ck_assert_int_eq(sql_int(c, sql), 3);
    snprintf(sql, sizeof sql, "SELECT value FROM metrics WHERE run_id = %lld AND repetition = 1", (long long)run);
    ck_assert_str_eq(sql_text(c, sql, buf, sizeof buf), "42.1");
    snprintf(sql, sizeof sql, "SELECT count(*) FROM metrics WHERE run_id = %lld", (long long)run2);
    ck_assert_int_eq(sql_int(c, sql), 1);
    sqlite3_close(c);
    tmp_fini(&t);
}
END_TEST

/* Whether any figure is simulated travels to the run, and a simulated run
 * marks every figure. */
START_TEST(simulated_flags) {
    tmp_db t;
    tmp_init(&t);
    qi_db *db = open_ok(t.path);
    int64_t exp = exp_ok(db, "sim");
    int64_t r1 = begin_ok(db, exp, "{\"n\":1}", NULL);
    metric_ok(db, r1, "a.x", 1, "1", 0, false);
    end_ok(db, r1, true, NULL);
    int64_t r2 = begin_ok(db, exp, "{\"n\":2}", NULL);
    metric_ok(db, r2, "a.x", 1, "1", 0, false);
    metric_ok(db, r2, "a.y", 1, "1", 0, true);
    end_ok(db, r2, true, NULL);
    qi_db_run_info info;
    qi_db_run_info_init(&info, NULL);
    info.simulated = true;
    int64_t r3 = begin_ok(db, exp, "{\"n\":3}", &info);
    metric_ok(db, r3, "a.x", 1, "1", 0, false);
    end_ok(db, r3, true, NULL);
    qi_db_close(db);
    sqlite3 *c = raw_open(t.path);
    char sql[160];
    int64_t want[3] = {0, 1, 1}, runs[3] = {r1, r2, r3};
    for (int i = 0; i < 3; i++) {
        snprintf(sql, sizeof sql, "SELECT simulated FROM runs WHERE id = %lld", (long long)runs[i]);
        ck_assert_int_eq(sql_int(c, sql), want[i]);
    }
    snprintf(sql, sizeof sql, "SELECT simulated FROM metrics WHERE run_id = %lld AND name = 'a.x'", (long long)r2);
    ck_assert_int_eq(sql_int(c, sql), 0);
    snprintf(sql, sizeof sql, "SELECT simulated FROM metrics WHERE run_id = %lld", (long long)r3);
    ck_assert_int_eq(sql_int(c, sql), 1);
    sqlite3_close(c);
    tmp_fini(&t);
}
END_TEST

/* Resume: a done configuration is skipped (and refused without fresh); a
 * failed or stale running one is redone in place; fresh redoes a done one.
 * Never two rows for one configuration. */
START_TEST(skip_and_redo) {
    tmp_db t;
    tmp_init(&t);
    qi_db *db = open_ok(t.path);
    int64_t exp = exp_ok(db, "resume");
    const char *cfg = "{\"b\":2,\"a\":1}";
    int64_t r1 = begin_ok(db, exp, cfg, NULL);
    metric_ok(db, r1, "m.x", 1, "1", 0, false);
    end_ok(db, r1, true, NULL);
    ck_assert(is_done(db, exp, cfg));

    /* done, not fresh: refused, and nothing changes */
    int64_t run = 7;
    qi_err e = {0};
    ck_assert_int_eq(qi_db_run_begin(db, exp, cfg, NULL, NULL, &run, &e), QI_ERR_INVALID);
    ck_assert_int_eq(run, 0);
    ck_assert_ptr_nonnull(strstr(e.msg, "already done"));
    ck_assert(is_done(db, exp, cfg));

    /* done, fresh: redone; the old row and its metrics go */
    qi_db_run_info info;
    qi_db_run_info_init(&info, NULL);
    info.fresh = true;
    int64_t r2 = begin_ok(db, exp, cfg, &info);
    ck_assert_int_ne(r2, r1);
    metric_ok(db, r2, "m.x", 2, "1", 0, false);
    end_ok(db, r2, true, NULL);

    /* failed: redone without fresh */
    const char *cfg2 = "{\"a\":2}";
    int64_t r3 = begin_ok(db, exp, cfg2, NULL);
    metric_ok(db, r3, "m.x", 3, "1", 0, false);
    end_ok(db, r3, false, "boom");
    ck_assert(!is_done(db, exp, cfg2));
    int64_t r4 = begin_ok(db, exp, cfg2, NULL);
    metric_ok(db, r4, "m.x", 4, "1", 0, false);
    end_ok(db, r4, true, NULL);
    ck_assert(is_done(db, exp, cfg2));

    /* a keyed run: the caller's key is the identity */
    int64_t r5 = 0;
    qi_err_clear(&e);
    ck_assert_int_eq(qi_db_run_begin(db, exp, "{\"a\":3}", "my-key", NULL, &r5, &e), QI_OK);
    end_ok(db, r5, true, NULL);
    bool done = false;
    ck_assert_int_eq(qi_db_run_done(db, exp, "my-key", &done, &e), QI_OK);
    ck_assert(done);
    qi_db_close(db);

    /* a 'running' row left by some other writer: redone too */
    char key[65], sql[512];
    ck_assert_int_eq(qi_db_config_key("{\"a\":9}", key, NULL), QI_OK);
    sqlite3 *c = raw_open(t.path);
    snprintf(sql, sizeof sql,
             "INSERT INTO runs (experiment_id, config_json, config_key, status) VALUES (%lld, '{\"a\":9}', '%s',"
             " 'running')",
             (long long)exp, key);
    ck_assert_int_eq(sqlite3_exec(c, sql, NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(c);
    db = open_ok(t.path);
    ck_assert(!is_done(db, exp, "{\"a\":9}"));
    int64_t r6 = begin_ok(db, exp, "{\"a\":9}", NULL);
    end_ok(db, r6, true, NULL);
    qi_db_close(db);

    c = raw_open(t.path);
    ck_assert_int_eq(sql_int(c, "SELECT count(*) FROM runs"), 4);
    ck_assert_int_eq(sql_int(c, "SELECT count(*) FROM runs WHERE status = 'done'"), 4);
    ck_assert_int_eq(sql_int(c, "SELECT count(*) FROM metrics"), 2);
    ck_assert_int_eq(sql_int(c, "SELECT sum(value) FROM metrics"), 6); /* r2's 2 and r4's 4 */
    sqlite3_close(c);
    tmp_fini(&t);
}
END_TEST

START_TEST(misuse_is_refused) {
    tmp_db t;
    tmp_init(&t);
    qi_db *db = open_ok(t.path);
    int64_t exp = exp_ok(db, "misuse");
    qi_err e = {0};
    int64_t run = 5;
    ck_assert_int_eq(qi_db_metric(db, 1, "a.b", 1, "1", 0, false, &e), QI_ERR_INVALID);
    ck_assert_ptr_nonnull(strstr(e.msg, "no run is open"));
    qi_err_clear(&e);
    ck_assert_int_eq(qi_db_run_end(db, 1, true, NULL, &e), QI_ERR_INVALID);
    qi_err_clear(&e);
    ck_assert_int_eq(qi_db_run_begin(db, exp + 100, "{}", NULL, NULL, &run, &e), QI_ERR_INVALID);
    ck_assert_ptr_nonnull(strstr(e.msg, "no experiment with id"));
    ck_assert_int_eq(run, 0);
    qi_err_clear(&e);
    ck_assert_int_eq(qi_db_run_begin(db, exp, "{\"a\":", NULL, NULL, &run, &e), QI_ERR_INVALID);
    ck_assert_ptr_nonnull(strstr(e.msg, "config JSON"));
    qi_err_clear(&e);
    ck_assert_int_eq(qi_db_run_begin(db, exp, "{}", "", NULL, &run, &e), QI_ERR_INVALID);

    run = begin_ok(db, exp, "{}", NULL);
    int64_t other = 0;
    qi_err_clear(&e);
    ck_assert_int_eq(qi_db_run_begin(db, exp, "{\"x\":1}", NULL, NULL, &other, &e), QI_ERR_INVALID);
    ck_assert_ptr_nonnull(strstr(e.msg, "still open"));
    static const char *bad_names[] = {"", "tokens_per_s", "Decode.tps", ".a", "a.", "a..b", "a.b-c", "1a.b", "a b.c"};
    for (size_t i = 0; i < sizeof bad_names / sizeof bad_names[0]; i++) {
        qi_err_clear(&e);
        ck_assert_msg(qi_db_metric(db, run, bad_names[i], 1, "1", 0, false, &e) == QI_ERR_INVALID, "name '%s'",
                      bad_names[i]);
        ck_assert_ptr_nonnull(strstr(e.msg, "area.what_unit"));
    }
    qi_err_clear(&e);
    ck_assert_int_eq(qi_db_metric(db, run, NULL, 1, "1", 0, false, &e), QI_ERR_INVALID);
    qi_err_clear(&e);
    ck_assert_int_eq(qi_db_metric(db, run, "a.b", 1, "", 0, false, &e), QI_ERR_INVALID);
    qi_err_clear(&e);
    ck_assert_int_eq(qi_db_metric(db, run, "a.b", 1, NULL, 0, false, &e), QI_ERR_INVALID);
    qi_err_clear(&e);
    ck_assert_int_eq(qi_db_metric(db, run, "a.b", NAN, "1", 0, false, &e), QI_ERR_INVALID);
    qi_err_clear(&e);
    ck_assert_int_eq(qi_db_metric(db, run, "a.b", 1, "1", -1, false, &e), QI_ERR_INVALID);
    qi_err_clear(&e);
    ck_assert_int_eq(qi_db_metric(db, run + 1, "a.b", 1, "1", 0, false, &e), QI_ERR_INVALID);
    ck_assert_ptr_nonnull(strstr(e.msg, "not the open run"));
    metric_ok(db, run, "op.attn_ms", INFINITY, "ms", 0, false);
    metric_ok(db, run, "a.b", 1, "1", 0, false);
    qi_err_clear(&e);
    ck_assert_int_eq(qi_db_metric(db, run, "a.b", 2, "1", 0, false, &e), QI_ERR_INVALID);
    ck_assert_ptr_nonnull(strstr(e.msg, "recorded twice"));
    metric_ok(db, run, "a.b", 2, "1", 1, false); /* the run is still open and usable */
    end_ok(db, run, true, NULL);
    qi_err_clear(&e);
    ck_assert_int_eq(qi_db_run_end(db, run, true, NULL, &e), QI_ERR_INVALID);
    qi_db_close(db);
    ck_assert_int_eq(path_int(t.path, "SELECT count(*) FROM metrics"), 3);
    qi_db_close(NULL);
    tmp_fini(&t);
}
END_TEST

/* Closing with a run open drops the run, as a crash would. */
START_TEST(close_rolls_back_open_run) {
    tmp_db t;
    tmp_init(&t);
    qi_db *db = open_ok(t.path);
    int64_t exp = exp_ok(db, "abandon");
    int64_t run = begin_ok(db, exp, "{}", NULL);
    metric_ok(db, run, "a.b", 1, "1", 0, false);
    qi_db_close(db);
    ck_assert_int_eq(path_int(t.path, "SELECT count(*) FROM runs"), 0);
    ck_assert_int_eq(path_int(t.path, "SELECT count(*) FROM metrics"), 0);
    ck_assert_int_eq(path_int(t.path, "SELECT count(*) FROM experiments"), 1);
    tmp_fini(&t);
}
END_TEST

void db_schema_add(TCase *tc) {
    tcase_add_test(tc, fresh_schema);
    tcase_add_test(tc, migrations_embedded);
    tcase_add_test(tc, schema_file_matches_migrations);
    tcase_add_test(tc, reopen_is_noop);
    tcase_add_test(tc, future_and_foreign_refused);
    tcase_add_test(tc, experiment_get_or_create);
    tcase_add_test(tc, run_lifecycle);
    tcase_add_test(tc, simulated_flags);
    tcase_add_test(tc, skip_and_redo);
    tcase_add_test(tc, misuse_is_refused);
    tcase_add_test(tc, close_rolls_back_open_run);
}

/* test_db.c - the results database (engine/harness/db.c) and canonical JSON
 * (engine/harness/json.c): schema and migrations, experiments, the run
 * lifecycle and resume rules, a run killed mid-way, readers during a run,
 * CSV export, hostile files and paths, allocation failures, merging
 * databases (qi_db_merge, db_merge.c). Every test works
 * in its own temporary directory; SQLite is read directly to check what was
 * stored. Built only when SQLite is found. */
#include <check.h>
#include <errno.h>
#include <dirent.h>
#include <math.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness/db.h"
#include "harness/json.h"
#include "sha256.h"
#include "testutil.h"

/* ---- helpers ---------------------------------------------------------------------- */

typedef struct {
    char dir[64];
    char path[128]; /* dir/results.db */
} tmp_db;

static void tmp_init(tmp_db *t) {
    snprintf(t->dir, sizeof t->dir, "/tmp/qi_db_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(t->dir));
    snprintf(t->path, sizeof t->path, "%s/results.db", t->dir);
}

static void tmp_fini(tmp_db *t) {
    char cmd[160];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", t->dir);
    ck_assert_int_eq(system(cmd), 0);
}

static qi_db *open_ok(const char *path) {
    qi_db *db = NULL;
    qi_err e = {0};
    qi_status st = qi_db_open(path, &db, &e);
    ck_assert_msg(st == QI_OK, "qi_db_open(%s): %s", path, e.msg);
    ck_assert_ptr_nonnull(db);
    return db;
}

static sqlite3 *raw_open(const char *path) {
    sqlite3 *c = NULL;
    ck_assert_int_eq(sqlite3_open_v2(path, &c, SQLITE_OPEN_READWRITE, NULL), SQLITE_OK);
    sqlite3_busy_timeout(c, 5000);
    return c;
}

static int64_t sql_int(sqlite3 *c, const char *sql) {
    sqlite3_stmt *s = NULL;
    ck_assert_msg(sqlite3_prepare_v2(c, sql, -1, &s, NULL) == SQLITE_OK, "%s: %s", sql, sqlite3_errmsg(c));
    int rc = sqlite3_step(s);
    ck_assert_msg(rc == SQLITE_ROW, "%s: no row (%s)", sql, sqlite3_errmsg(c));
    int64_t v = sqlite3_column_int64(s, 0);
    sqlite3_finalize(s);
    return v;
}

/* First column of the first row as text ("(null)" for NULL) into buf. */
static const char *sql_text(sqlite3 *c, const char *sql, char *buf, size_t n) {
    sqlite3_stmt *s = NULL;
    ck_assert_msg(sqlite3_prepare_v2(c, sql, -1, &s, NULL) == SQLITE_OK, "%s: %s", sql, sqlite3_errmsg(c));
    ck_assert_msg(sqlite3_step(s) == SQLITE_ROW, "%s: no row", sql);
    const unsigned char *t = sqlite3_column_text(s, 0);
    snprintf(buf, n, "%s", t ? (const char *)t : "(null)");
    sqlite3_finalize(s);
    return buf;
}

static int64_t path_int(const char *path, const char *sql) {
    sqlite3 *c = raw_open(path);
    int64_t v = sql_int(c, sql);
    sqlite3_close(c);
    return v;
}

static void sha_hex(const char *s, char hex[65]) {
    qi_sha256 h;
    qi_sha256_init(&h);
    qi_sha256_update(&h, s, strlen(s));
    qi_sha256_final(&h, hex);
}

static int64_t begin_ok(qi_db *db, int64_t exp, const char *json, const qi_db_run_info *info) {
    int64_t run = 0;
    qi_err e = {0};
    qi_status st = qi_db_run_begin(db, exp, json, NULL, info, &run, &e);
    ck_assert_msg(st == QI_OK, "run_begin: %s", e.msg);
    ck_assert_int_gt(run, 0);
    return run;
}

static void metric_ok(qi_db *db, int64_t run, const char *name, double v, const char *unit, int rep, bool sim) {
    qi_err e = {0};
    qi_status st = qi_db_metric(db, run, name, v, unit, rep, sim, &e);
    ck_assert_msg(st == QI_OK, "metric %s: %s", name, e.msg);
}

static void end_ok(qi_db *db, int64_t run, bool ok, const char *msg) {
    qi_err e = {0};
    qi_status st = qi_db_run_end(db, run, ok, msg, &e);
    ck_assert_msg(st == QI_OK, "run_end: %s", e.msg);
}

static int64_t exp_ok(qi_db *db, const char *name) {
    int64_t id = 0;
    qi_err e = {0};
    ck_assert_msg(qi_db_experiment(db, name, "experiments/x.lua", "00ff", &id, &e) == QI_OK, "%s", e.msg);
    ck_assert_int_gt(id, 0);
    return id;
}

static bool is_done(qi_db *db, int64_t exp, const char *json) {
    char key[65];
    bool done = true;
    qi_err e = {0};
    ck_assert_int_eq(qi_db_config_key(json, key, &e), QI_OK);
    ck_assert_msg(qi_db_run_done(db, exp, key, &done, &e) == QI_OK, "%s", e.msg);
    return done;
}

static void write_file(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(data, 1, n, f), n);
    ck_assert_int_eq(fclose(f), 0);
}

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

START_TEST(garbage_file_refused) {
    tmp_db t;
    tmp_init(&t);
    char text[8192];
    for (size_t i = 0; i < sizeof text; i++) text[i] = "not a database, only text\n"[i % 26];
    write_file(t.path, text, sizeof text);
    qi_db *db = (qi_db *)1;
    qi_err e = {0};
    ck_assert_int_eq(qi_db_open(t.path, &db, &e), QI_ERR_DB);
    ck_assert_ptr_null(db);
    ck_assert_ptr_nonnull(strstr(e.msg, t.path));
    ck_assert_ptr_nonnull(strstr(e.msg, "not a database"));
    size_t len;
    char *back = qi_test_read_file(t.path, &len);
    ck_assert_ptr_nonnull(back);
    ck_assert(len == sizeof text && memcmp(back, text, len) == 0); /* left alone */
    free(back);

    /* a real database with its first page damaged */
    char dmg[160];
    snprintf(dmg, sizeof dmg, "%s/damaged.db", t.dir);
    qi_db *ok = open_ok(dmg);
    exp_ok(ok, "x");
    qi_db_close(ok);
    FILE *f = fopen(dmg, "r+b");
    ck_assert_ptr_nonnull(f);
    fseek(f, 100, SEEK_SET);
    for (int i = 0; i < 3000; i++) fputc(0xA5, f);
    fclose(f);
    qi_err_clear(&e);
    ck_assert_int_eq(qi_db_open(dmg, &db, &e), QI_ERR_DB);
    ck_assert_ptr_nonnull(strstr(e.msg, dmg));
    tmp_fini(&t);
}
END_TEST

START_TEST(bad_paths_refused) {
    tmp_db t;
    tmp_init(&t);
    qi_db *db = (qi_db *)1;
    qi_err e = {0};
    ck_assert_int_eq(qi_db_open("/nonexistent-qi-dir/sub/results.db", &db, &e), QI_ERR_IO);
    ck_assert_ptr_null(db);
    ck_assert_ptr_nonnull(strstr(e.msg, "/nonexistent-qi-dir/sub/results.db"));
    ck_assert_ptr_nonnull(strstr(e.msg, "No such file or directory"));
    /* a directory nobody may create files in, root included */
    qi_err_clear(&e);
    ck_assert_int_eq(qi_db_open("/proc/qi_results.db", &db, &e), QI_ERR_IO);
    ck_assert_ptr_nonnull(strstr(e.msg, "/proc/qi_results.db"));
    qi_err_clear(&e);
    ck_assert_int_eq(qi_db_open(t.dir, &db, &e), QI_ERR_INVALID);
    ck_assert_ptr_nonnull(strstr(e.msg, "is a directory"));
    qi_err_clear(&e);
    ck_assert_int_eq(qi_db_open("", &db, &e), QI_ERR_INVALID);
    ck_assert_int_eq(qi_db_open(NULL, &db, NULL), QI_ERR_INVALID);

    if (geteuid() == 0) {
        fprintf(stderr, "test_db: running as root, permission checks skipped\n");
    } else {
        char sub[160], path[200];
        snprintf(sub, sizeof sub, "%s/ro", t.dir);
        ck_assert_int_eq(mkdir(sub, 0555), 0);
        snprintf(path, sizeof path, "%s/results.db", sub);
        qi_err_clear(&e);
        ck_assert_int_eq(qi_db_open(path, &db, &e), QI_ERR_IO);
        ck_assert_ptr_nonnull(strstr(e.msg, path));
        chmod(sub, 0755);
        qi_db_close(open_ok(t.path));
        chmod(t.path, 0444);
        qi_err_clear(&e);
        ck_assert_int_eq(qi_db_open(t.path, &db, &e), QI_ERR_IO);
        ck_assert_ptr_nonnull(strstr(e.msg, "read-only"));
    }
    tmp_fini(&t);
}
END_TEST

/* ---- canonical JSON and keys ------------------------------------------------------------------ */

static void canon_is(const char *in, const char *want) {
    char *out = NULL;
    size_t len = 0;
    qi_err e = {0};
    ck_assert_msg(qi_json_canonical(in, &out, &len, &e) == QI_OK, "%s: %s", in, e.msg);
    ck_assert_str_eq(out, want);
    ck_assert_uint_eq(len, strlen(want));
    qi_free(out);
}

static void canon_bad(const char *in, const char *why) {
    char *out = (char *)1;
    qi_err e = {0};
    ck_assert_msg(qi_json_canonical(in, &out, NULL, &e) == QI_ERR_INVALID, "accepted: %s", in);
    ck_assert_ptr_null(out);
    ck_assert_msg(strstr(e.msg, why) != NULL, "%s: '%s' lacks '%s'", in, e.msg, why);
}

START_TEST(json_canonical_form) {
    canon_is(" { \"b\" : 1 ,\n\t\"a\" : [ true , false , null , -0.5E+3 , \"x\" ] } ",
             "{\"a\":[true,false,null,-0.5e+3,\"x\"],\"b\":1}");
    canon_is("{\"z\":{\"y\":1,\"x\":{}},\"a\":[]}", "{\"a\":[],\"z\":{\"x\":{},\"y\":1}}");
    canon_is("\"\\u00e9\\/\\t\\u0001\\ud83d\\ude00\\\"\\\\\\b\\f\\r\\n\"",
             "\"\xc3\xa9/\\t\\u0001\xf0\x9f\x98\x80\\\"\\\\\\b\\f\\r\\n\"");
    canon_is("{\"\xc3\xa9\":1,\"z\":2,\"a\":3}", "{\"a\":3,\"z\":2,\"\xc3\xa9\":1}"); /* UTF-8 byte order */
    canon_is("{\"ab\":1,\"a\":2}", "{\"a\":2,\"ab\":1}");
    canon_is("0", "0");
    canon_is("-0.0e-0", "-0.0e-0");
    canon_is("[1,1.0,10]", "[1,1.0,10]");
    canon_is("{\"\\u0000\":1}", "{\"\\u0000\":1}");

    canon_bad("", "end of text");
    canon_bad("   ", "end of text");
    canon_bad("{", "member name");
    canon_bad("{\"a\":1,}", "member name");
    canon_bad("[1 2]", "expected ','");
    canon_bad("[1,]", "unexpected character");
    canon_bad("01", "text after the value");
    canon_bad("1.", "bad number");
    canon_bad(".5", "unexpected character");
    canon_bad("+1", "unexpected character");
    canon_bad("1e", "bad number");
    canon_bad("tru", "unexpected character");
    canon_bad("\"abc", "unterminated");
    canon_bad("\"a\nb\"", "control character");
    canon_bad("\"\\x\"", "bad escape");
    canon_bad("\"\\u12g4\"", "bad \\u escape");
    canon_bad("\"\\ud800\"", "lone high surrogate");
    canon_bad("\"\\ud800\\u0041\"", "bad surrogate pair");
    canon_bad("\"\\udc00\"", "lone low surrogate");
    canon_bad("\"\xff\"", "invalid UTF-8");
    canon_bad("\"\xc0\xaf\"", "invalid UTF-8");     /* overlong '/' */
    canon_bad("\"\xed\xa0\x80\"", "invalid UTF-8"); /* encoded surrogate */
    canon_bad("{\"a\":1,\"b\":2,\"a\":3}", "appears twice");
    canon_bad("{\"a\":1} x", "text after the value");
    canon_bad("{'a':1}", "member name");

    char deep[2 * QI_JSON_MAX_DEPTH + 8];
    memset(deep, '[', QI_JSON_MAX_DEPTH);
    memset(deep + QI_JSON_MAX_DEPTH, ']', QI_JSON_MAX_DEPTH);
    deep[2 * QI_JSON_MAX_DEPTH] = 0;
    char *out = NULL;
    ck_assert_int_eq(qi_json_canonical(deep, &out, NULL, NULL), QI_OK);
    qi_free(out);
    memset(deep, '[', QI_JSON_MAX_DEPTH + 1);
    memset(deep + QI_JSON_MAX_DEPTH + 1, ']', QI_JSON_MAX_DEPTH + 1);
    deep[2 * QI_JSON_MAX_DEPTH + 2] = 0;
    canon_bad(deep, "nested too deeply");
    ck_assert_int_eq(qi_json_canonical(NULL, &out, NULL, NULL), QI_ERR_INVALID);
}
END_TEST

START_TEST(config_key_is_stable) {
    char k1[65], k2[65], k3[65], want[65];
    qi_err e = {0};
    ck_assert_int_eq(qi_db_config_key("{\"policy\":\"h2o\",\"budget\":64}", k1, &e), QI_OK);
    ck_assert_int_eq(qi_db_config_key(" {\n \"budget\" : 64 , \"policy\" : \"h\\u0032o\" }", k2, &e), QI_OK);
    ck_assert_str_eq(k1, k2);
    sha_hex("{\"budget\":64,\"policy\":\"h2o\"}", want);
    ck_assert_str_eq(k1, want);
    ck_assert_uint_eq(strlen(k1), 64);
    ck_assert_int_eq(qi_db_config_key("{\"policy\":\"h2o\",\"budget\":64.0}", k3, &e), QI_OK);
    ck_assert_str_ne(k1, k3); /* 64 and 64.0 are different configurations */
    ck_assert_int_eq(qi_db_config_key("{\"policy\":\"h2o\",\"budget\":65}", k3, &e), QI_OK);
    ck_assert_str_ne(k1, k3);
    ck_assert_int_eq(qi_db_config_key("{\"policy\":\"h2o\"", k3, &e), QI_ERR_INVALID);
    ck_assert_str_eq(k3, "");
}
END_TEST

/* ---- the machine and the checkout --------------------------------------------------------------- */

START_TEST(git_and_host_facts) {
    char rev[80];
    int dirty = 5;
    ck_assert(!qi_db_git_info("/nonexistent-qi-dir", rev, sizeof rev, &dirty));
    ck_assert_str_eq(rev, "");
    ck_assert_int_eq(dirty, -1);
    if (system("git --version >/dev/null 2>&1") != 0) {
        fprintf(stderr, "test_db: no git, checkout facts not tested\n");
    } else {
        tmp_db t;
        tmp_init(&t);
        ck_assert(!qi_db_git_info(t.dir, rev, sizeof rev, &dirty)); /* not a checkout */
        ck_assert_int_eq(dirty, -1);
        char cmd[512];
        snprintf(cmd, sizeof cmd,
                 "cd '%s' && git init -q . && echo a > a.txt && git add a.txt && "
                 "git -c user.name=t -c user.email=t@t -c commit.gpgsign=false commit -q -m init",
                 t.dir);
        ck_assert_int_eq(system(cmd), 0);
        ck_assert(qi_db_git_info(t.dir, rev, sizeof rev, &dirty));
        ck_assert_uint_eq(strspn(rev, "0123456789abcdef"), strlen(rev));
        ck_assert_uint_ge(strlen(rev), 40);
        ck_assert_int_eq(dirty, 0);
        char f[160];
        snprintf(f, sizeof f, "%s/untracked.lua", t.dir);
        write_file(f, "x", 1);
        ck_assert(qi_db_git_info(t.dir, rev, sizeof rev, &dirty));
        ck_assert_int_eq(dirty, 1);
        char small[8];
        ck_assert(!qi_db_git_info(t.dir, small, sizeof small, &dirty)); /* no room for the revision */
        tmp_fini(&t);
    }

    qi_db_host h;
    qi_db_host_get(&h, NULL);
    ck_assert_str_eq(h.git_rev, "");
    ck_assert_int_eq(h.git_dirty, -1);
    ck_assert_uint_gt(strlen(h.cpu), 0);
    ck_assert_int_gt(h.cores, 0);
    ck_assert_uint_gt(h.mem_bytes, 0);
    qi_db_run_info info;
    qi_db_run_info_init(&info, &h);
    ck_assert_ptr_eq(info.cpu, h.cpu);
    ck_assert_ptr_null(info.git_rev);
    ck_assert_int_eq(info.cores, h.cores);
    ck_assert(h.gpu[0] ? info.gpu == h.gpu : info.gpu == NULL);
    ck_assert_str_eq(info.engine_version, "0.1.0");
    ck_assert(!info.simulated && !info.fresh && !info.has_seed);
}
END_TEST

/* ---- allocation failures --------------------------------------------------------------------- */

/* Fail each allocation of an operation in turn: it must return
 * QI_ERR_NOMEM, leave nothing open, and leak nothing (ASan). */
START_TEST(allocation_failures) {
    tmp_db t;
    tmp_init(&t);
    qi_db_close(open_ok(t.path)); /* created */
    int n_fail = 0;
    for (long n = 1;; n++) {
        qi_db *db = (qi_db *)1;
        qi_err e = {0};
        qi_alloc_fail_after(n);
        qi_status st = qi_db_open(t.path, &db, &e);
        qi_alloc_fail_after(0);
        if (st == QI_OK) {
            qi_db_close(db);
            break;
        }
        ck_assert_int_eq(st, QI_ERR_NOMEM);
        ck_assert_ptr_null(db);
        n_fail++;
    }
    ck_assert_int_gt(n_fail, 0);

    const char *cfg = "{\"b\":[1,2,{\"y\":\"\\u00e9\",\"x\":null}],\"a\":{\"k\":true},\"c\":\"s\"}";
    n_fail = 0;
    for (long n = 1;; n++) {
        char key[65];
        qi_err e = {0};
        qi_alloc_fail_after(n);
        qi_status st = qi_db_config_key(cfg, key, &e);
        qi_alloc_fail_after(0);
        if (st == QI_OK) break;
        ck_assert_int_eq(st, QI_ERR_NOMEM);
        n_fail++;
    }
    ck_assert_int_gt(n_fail, 3);

    qi_db *db = open_ok(t.path);
    int64_t exp = exp_ok(db, "nomem");
    for (long n = 1;; n++) {
        int64_t run = 9;
        qi_err e = {0};
        qi_alloc_fail_after(n);
        qi_status st = qi_db_run_begin(db, exp, cfg, NULL, NULL, &run, &e);
        qi_alloc_fail_after(0);
        if (st == QI_OK) {
            metric_ok(db, run, "a.b", 1, "1", 0, false);
            end_ok(db, run, true, NULL);
            break;
        }
        ck_assert_int_eq(st, QI_ERR_NOMEM);
        ck_assert_int_eq(run, 0);
    }
    ck_assert(is_done(db, exp, cfg));

    n_fail = 0;
    for (long n = 1;; n++) {
        FILE *f = tmpfile();
        qi_err e = {0};
        qi_alloc_fail_after(n);
        qi_status st = qi_db_export_csv(db, "nomem", f, &e);
        qi_alloc_fail_after(0);
        fclose(f);
        if (st == QI_OK) break;
        ck_assert_int_eq(st, QI_ERR_NOMEM);
        n_fail++;
    }
    ck_assert_int_gt(n_fail, 3);
    /* the handle is still usable: no transaction was left open */
    int64_t other = 0;
    qi_err e = {0};
    ck_assert_int_eq(qi_db_experiment(db, "after", NULL, NULL, &other, &e), QI_OK);
    qi_db_close(db);
    tmp_fini(&t);
}
END_TEST

/* ---- merging databases ---------------------------------------------------------------- */

/* A database at dir/name with experiment "e" (script sha `sha`): for each
 * k in ks, a run {"k":k} with metric t.v = value_base + k (repetitions 0
 * and 1), done unless k is in failed. */
static void make_shard(const char *dir, const char *name, const char *sha, const int *ks, int n, int failed,
                       double value_base, char *path, size_t cap) {
    snprintf(path, cap, "%s/%s", dir, name);
    qi_db *db = open_ok(path);
    int64_t exp = 0;
    qi_err e = {0};
    ck_assert_msg(qi_db_experiment(db, "e", "x.lua", sha, &exp, &e) == QI_OK, "%s", e.msg);
    for (int i = 0; i < n; i++) {
        char json[32];
        snprintf(json, sizeof json, "{\"k\":%d}", ks[i]);
        int64_t run = begin_ok(db, exp, json, NULL);
        metric_ok(db, run, "t.v", value_base + ks[i], "1", 0, false);
        metric_ok(db, run, "t.v", value_base + ks[i] + 0.5, "1", 1, false);
        end_ok(db, run, ks[i] != failed, ks[i] == failed ? "boom" : NULL);
    }
    qi_db_close(db);
}

static qi_status merge_into(const char *out, const char *a, const char *b, const char *c, qi_db_merge_stats *st,
                            qi_err *e) {
    const char *in[] = {a, b, c};
    int n = c ? 3 : b ? 2 : 1;
    return qi_db_merge(out, in, n, st, e);
}

/* Everything of a database, by configuration: "k status v0 v1;..." */
static void merged_text(const char *path, char *buf, size_t n) {
    sqlite3 *c = raw_open(path);
    sql_text(c,
             "SELECT group_concat(x, ';') FROM (SELECT json_extract(r.config_json, '$.k') || ' ' || r.status || ' ' ||"
             " (SELECT group_concat(value, ' ') FROM (SELECT value FROM metrics WHERE run_id = r.id ORDER BY"
             " repetition)) AS x FROM runs r ORDER BY json_extract(r.config_json, '$.k'))",
             buf, n);
    sqlite3_close(c);
}

START_TEST(merge_databases) {
    tmp_db t;
    tmp_init(&t);
    char a[160], b[160], c[160], out[160], text[512], again[512];
    const int ka[] = {1, 2}, kb[] = {2, 3, 4}, kc[] = {4};
    make_shard(t.dir, "a.db", "00ff", ka, 2, 0, 10, a, sizeof a);
    make_shard(t.dir, "b.db", "00ff", kb, 3, 4, 20, b, sizeof b);  /* k=2 overlaps a; k=4 failed */
    make_shard(t.dir, "c.db", "00ff", kc, 1, 0, 30, c, sizeof c);  /* k=4 done */
    snprintf(out, sizeof out, "%s/out.db", t.dir);

    qi_db_merge_stats st[3];
    qi_err e = {0};
    ck_assert_msg(merge_into(out, a, b, c, st, &e) == QI_OK, "%s", e.msg);
    ck_assert_int_eq(st[0].n_runs, 2);
    ck_assert_int_eq(st[0].n_added, 2);
    ck_assert_int_eq(st[1].n_runs, 3);
    ck_assert_int_eq(st[1].n_added, 2); /* k=3, and k=4 failed: k=2 is a's */
    ck_assert_int_eq(st[1].n_replaced, 0);
    ck_assert_int_eq(st[2].n_added, 1);
    ck_assert_int_eq(st[2].n_replaced, 1); /* c's done k=4 replaces b's failed one */
    merged_text(out, text, sizeof text);
    ck_assert_str_eq(text, "1 done 11.0 11.5;2 done 12.0 12.5;3 done 23.0 23.5;4 done 34.0 34.5");
    ck_assert_int_eq(path_int(out, "SELECT count(*) FROM metrics"), 8);
    ck_assert_int_eq(path_int(out, "SELECT count(*) FROM experiments WHERE name = 'e' AND script_sha256 = '00ff'"), 1);

    /* idempotent: again, and the inputs in another order, add nothing */
    ck_assert_msg(merge_into(out, c, b, a, st, &e) == QI_OK, "%s", e.msg);
    ck_assert_int_eq(st[0].n_added + st[1].n_added + st[2].n_added, 0);
    merged_text(out, again, sizeof again);
    ck_assert_str_eq(again, text);
    /* an output holding some runs: only the others come */
    char part[160];
    snprintf(part, sizeof part, "%s/part.db", t.dir);
    ck_assert_msg(merge_into(part, b, NULL, NULL, st, &e) == QI_OK, "%s", e.msg);
    ck_assert_msg(merge_into(part, out, NULL, NULL, st, &e) == QI_OK, "%s", e.msg);
    ck_assert_int_eq(st[0].n_runs, 4);
    ck_assert_int_eq(st[0].n_added, 2); /* k=1 and the done k=4; k=2 and k=3 are b's */
    ck_assert_int_eq(st[0].n_replaced, 1);

    /* refusals: nothing written to an existing output, a new one not made */
    char v[160], d[160], tr[160], fresh[160];
    snprintf(fresh, sizeof fresh, "%s/fresh.db", t.dir);
    snprintf(v, sizeof v, "%s/v.db", t.dir);
    make_shard(t.dir, "v.db", "00ff", kc, 1, 0, 40, v, sizeof v);
    sqlite3 *raw = raw_open(v);
    char bump[64];
    snprintf(bump, sizeof bump, "PRAGMA user_version = %d", qi_db_schema_version() + 1);
    ck_assert_int_eq(sqlite3_exec(raw, bump, NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(raw);
    const int k5[] = {5};
    make_shard(t.dir, "d.db", "11ee", k5, 1, 0, 50, d, sizeof d); /* another script */
    snprintf(tr, sizeof tr, "%s/tr.db", t.dir);
    {
        char cmd[600];
        snprintf(cmd, sizeof cmd, "cp '%s' '%s' && truncate -s 5000 '%s'", a, tr, tr);
        ck_assert_int_eq(system(cmd), 0);
    }
    struct {
        const char *in;
        qi_status st;
        const char *msg;
    } bad[] = {
        {v, QI_ERR_UNSUPPORTED, "but this merge writes version"},
        {d, QI_ERR_INVALID, "was run from another script"},
        {tr, QI_ERR_DB, "tr.db"},
        {out, QI_ERR_INVALID, "is the output itself"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        memset(&e, 0, sizeof e);
        qi_status s = merge_into(out, c, bad[i].in, NULL, st, &e);
        ck_assert_msg(s == bad[i].st, "%s: status %d, want %d (%s)", bad[i].in, s, bad[i].st, e.msg);
        ck_assert_msg(strstr(e.msg, bad[i].msg), "%s: '%s' lacks '%s'", bad[i].in, e.msg, bad[i].msg);
        ck_assert_int_eq(st[0].n_added, 0);
        merged_text(out, again, sizeof again);
        ck_assert_str_eq(again, text);
        if (bad[i].in == out) continue;
        s = merge_into(fresh, c, bad[i].in, NULL, st, &e);
        ck_assert_int_eq(s, bad[i].st);
        ck_assert_int_ne(access(fresh, F_OK), 0);
    }
    /* the refused input was not written to either */
    ck_assert_int_eq(path_int(v, "PRAGMA user_version"), qi_db_schema_version() + 1);

    /* out of memory at every allocation: an error, and no output */
    int n_fail = 0;
    for (long n = 1;; n++) {
        memset(&e, 0, sizeof e);
        qi_alloc_fail_after(n);
        qi_status s = merge_into(fresh, a, b, c, st, &e);
        qi_alloc_fail_after(0);
        if (s == QI_OK) break;
        ck_assert_msg(s == QI_ERR_NOMEM, "allocation %ld: %s", n, e.msg);
        ck_assert_int_ne(access(fresh, F_OK), 0);
        n_fail++;
    }
    ck_assert_int_gt(n_fail, 0);
    merged_text(fresh, again, sizeof again);
    ck_assert_str_eq(again, text);
    tmp_fini(&t);
}
END_TEST

START_TEST(shard_paths) {
    char buf[128];
    qi_db_shard_path("results/shards", "kv sweep/1", 3, 16, buf, sizeof buf);
    ck_assert_str_eq(buf, "results/shards/kv_sweep_1.shard-3-of-16.db");
    qi_db_shard_path("/x/", "e", 0, 1, buf, sizeof buf);
    ck_assert_str_eq(buf, "/x/e.shard-0-of-1.db");
    qi_db_shard_path(NULL, "e", 1, 2, buf, sizeof buf);
    ck_assert_str_eq(buf, "./e.shard-1-of-2.db");
    qi_db_shard_path("d", "a-very-long-experiment-name", 1, 2, buf, 24); /* the suffix is kept whole */
    ck_assert_str_eq(buf, "d/a-ver.shard-1-of-2.db");
    qi_db_default_path("kv sweep", buf, sizeof buf);
    ck_assert_str_eq(buf, "results/kv_sweep.db");
}
END_TEST

int main(void) {
    Suite *s = suite_create("db");
    TCase *tc = tcase_create("db");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, fresh_schema);
    tcase_add_test(tc, migrations_embedded);
    tcase_add_test(tc, schema_file_matches_migrations);
    tcase_add_test(tc, metric_params);
    tcase_add_test(tc, old_metric_names_mapped);
    tcase_add_test(tc, reopen_is_noop);
    tcase_add_test(tc, future_and_foreign_refused);
    tcase_add_test(tc, experiment_get_or_create);
    tcase_add_test(tc, run_lifecycle);
    tcase_add_test(tc, simulated_flags);
    tcase_add_test(tc, skip_and_redo);
    tcase_add_test(tc, misuse_is_refused);
    tcase_add_test(tc, close_rolls_back_open_run);
    tcase_add_test(tc, killed_run_leaves_no_trace);
    tcase_add_test(tc, readers_during_a_run);
    tcase_add_test(tc, export_csv_format);
    tcase_add_test(tc, summary_statistics);
    tcase_add_test(tc, garbage_file_refused);
    tcase_add_test(tc, bad_paths_refused);
    tcase_add_test(tc, json_canonical_form);
    tcase_add_test(tc, config_key_is_stable);
    tcase_add_test(tc, git_and_host_facts);
    tcase_add_test(tc, allocation_failures);
    tcase_add_test(tc, merge_databases);
    tcase_add_test(tc, shard_paths);
    suite_add_tcase(s, tc);
    return qi_test_run_suite(s);
}

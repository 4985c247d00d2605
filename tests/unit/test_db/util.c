/* util.c - what the parts of test_db share. */
#include "db_test.h"

/* ---- helpers ---------------------------------------------------------------------- */


void tmp_init(tmp_db *t) {
    snprintf(t->dir, sizeof t->dir, "/tmp/qi_db_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(t->dir));
    snprintf(t->path, sizeof t->path, "%s/results.db", t->dir);
}

void tmp_fini(tmp_db *t) {
    char cmd[160];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", t->dir);
    ck_assert_int_eq(system(cmd), 0);
}

qi_db *open_ok(const char *path) {
    qi_db *db = NULL;
    qi_err e = {0};
    qi_status st = qi_db_open(path, &db, &e);
    ck_assert_msg(st == QI_OK, "qi_db_open(%s): %s", path, e.msg);
    ck_assert_ptr_nonnull(db);
    return db;
}

sqlite3 *raw_open(const char *path) {
    sqlite3 *c = NULL;
    ck_assert_int_eq(sqlite3_open_v2(path, &c, SQLITE_OPEN_READWRITE, NULL), SQLITE_OK);
    sqlite3_busy_timeout(c, 5000);
    return c;
}

int64_t sql_int(sqlite3 *c, const char *sql) {
    sqlite3_stmt *s = NULL;
    ck_assert_msg(sqlite3_prepare_v2(c, sql, -1, &s, NULL) == SQLITE_OK, "%s: %s", sql, sqlite3_errmsg(c));
    int rc = sqlite3_step(s);
    ck_assert_msg(rc == SQLITE_ROW, "%s: no row (%s)", sql, sqlite3_errmsg(c));
    int64_t v = sqlite3_column_int64(s, 0);
    sqlite3_finalize(s);
    return v;
}

/* First column of the first row as text ("(null)" for NULL) into buf. */
const char *sql_text(sqlite3 *c, const char *sql, char *buf, size_t n) {
    sqlite3_stmt *s = NULL;
    ck_assert_msg(sqlite3_prepare_v2(c, sql, -1, &s, NULL) == SQLITE_OK, "%s: %s", sql, sqlite3_errmsg(c));
    ck_assert_msg(sqlite3_step(s) == SQLITE_ROW, "%s: no row", sql);
    const unsigned char *t = sqlite3_column_text(s, 0);
    snprintf(buf, n, "%s", t ? (const char *)t : "(null)");
    sqlite3_finalize(s);
    return buf;
}

int64_t path_int(const char *path, const char *sql) {
    sqlite3 *c = raw_open(path);
    int64_t v = sql_int(c, sql);
    sqlite3_close(c);
    return v;
}

void sha_hex(const char *s, char hex[65]) {
    qi_sha256 h;
    qi_sha256_init(&h);
    qi_sha256_update(&h, s, strlen(s));
    qi_sha256_final(&h, hex);
}

int64_t begin_ok(qi_db *db, int64_t exp, const char *json, const qi_db_run_info *info) {
    int64_t run = 0;
    qi_err e = {0};
    qi_status st = qi_db_run_begin(db, exp, json, NULL, info, &run, &e);
    ck_assert_msg(st == QI_OK, "run_begin: %s", e.msg);
    ck_assert_int_gt(run, 0);
    return run;
}

void metric_ok(qi_db *db, int64_t run, const char *name, double v, const char *unit, int rep, bool sim) {
    qi_err e = {0};
    qi_status st = qi_db_metric(db, run, name, v, unit, rep, sim, &e);
    ck_assert_msg(st == QI_OK, "metric %s: %s", name, e.msg);
}

void end_ok(qi_db *db, int64_t run, bool ok, const char *msg) {
    qi_err e = {0};
    qi_status st = qi_db_run_end(db, run, ok, msg, &e);
    ck_assert_msg(st == QI_OK, "run_end: %s", e.msg);
}

int64_t exp_ok(qi_db *db, const char *name) {
    int64_t id = 0;
    qi_err e = {0};
    ck_assert_msg(qi_db_experiment(db, name, "experiments/x.lua", "00ff", &id, &e) == QI_OK, "%s", e.msg);
    ck_assert_int_gt(id, 0);
    return id;
}

bool is_done(qi_db *db, int64_t exp, const char *json) {
    char key[65];
    bool done = true;
    qi_err e = {0};
    ck_assert_int_eq(qi_db_config_key(json, key, &e), QI_OK);
    ck_assert_msg(qi_db_run_done(db, exp, key, &done, &e) == QI_OK, "%s", e.msg);
    return done;
}

void write_file(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(data, 1, n, f), n);
    ck_assert_int_eq(fclose(f), 0);
}

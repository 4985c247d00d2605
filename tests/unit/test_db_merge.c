/* test_db_merge.c - a refused `qinfer results merge` (qi_db_merge,
 * engine/harness/db_merge.c) leaves the output byte for byte as it was
 * (the SHA-256 of its file before and after), in its journal mode, with no
 * -journal, -wal or -shm file beside it:
 *   - an input whose rows break a CHECK of the schema that SQLite's
 *     integrity_check passes (json_valid(placement), a metric's params) is
 *     refused while the inputs are checked, in the input's name;
 *   - a merge into an output in rollback-journal mode that fails after the
 *     inputs were checked (out of memory at each allocation in turn) does
 *     not leave it switched to WAL;
 *   - a merge refused on a look at a WAL-mode output (an experiment of
 *     another script) leaves no empty -wal and -shm files beside it.
 * The merge's accepting paths are test_db.c's. Built only with SQLite. */
#include <check.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness/db.h"
#include "sha256.h"
#include "testutil.h"

typedef struct {
    char dir[64];
    char out[128], in[128];
} tmp;

static void tmp_init(tmp *t) {
    snprintf(t->dir, sizeof t->dir, "/tmp/qi_merge_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(t->dir));
    snprintf(t->out, sizeof t->out, "%s/out.db", t->dir);
    snprintf(t->in, sizeof t->in, "%s/in.db", t->dir);
}

static void tmp_fini(tmp *t) {
    char cmd[160];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", t->dir);
    ck_assert_int_eq(system(cmd), 0);
}

/* A results database at path, as the harness leaves it (WAL mode, closed):
 * experiment "e" of script `sha` with a done run {"k":k} and a metric. */
static void make_db(const char *path, const char *sha, int k) {
    qi_db *db = NULL;
    qi_err e = {0};
    int64_t exp = 0, run = 0;
    char json[32];
    snprintf(json, sizeof json, "{\"k\":%d}", k);
    ck_assert_msg(qi_db_open(path, &db, &e) == QI_OK, "%s", e.msg);
    ck_assert_msg(qi_db_experiment(db, "e", "x.lua", sha, &exp, &e) == QI_OK, "%s", e.msg);
    ck_assert_msg(qi_db_run_begin(db, exp, json, NULL, NULL, &run, &e) == QI_OK, "%s", e.msg);
    ck_assert_msg(qi_db_metric(db, run, "t.v", k, "1", 0, false, &e) == QI_OK, "%s", e.msg);
    ck_assert_msg(qi_db_run_placement(db, run, "{\"devices\":[\"cpu\"]}", &e) == QI_OK, "%s", e.msg);
    ck_assert_msg(qi_db_run_end(db, run, true, NULL, &e) == QI_OK, "%s", e.msg);
    qi_db_close(db);
}

/* Statements run on path directly (through SQLite, not the harness). */
static void raw_exec(const char *path, const char *sql) {
    sqlite3 *c = NULL;
    ck_assert_int_eq(sqlite3_open_v2(path, &c, SQLITE_OPEN_READWRITE, NULL), SQLITE_OK);
    int rc = sqlite3_exec(c, sql, NULL, NULL, NULL);
    ck_assert_msg(rc == SQLITE_OK, "%s: %s", sql, sqlite3_errmsg(c));
    sqlite3_close(c);
}

static void file_sha(const char *path, char hex[65]) {
    qi_err e = {0};
    ck_assert_msg(qi_sha256_file(path, hex, &e) == QI_OK, "%s", e.msg);
}

/* Nothing beside path: no journal, WAL or shared-memory file. */
static void no_side_files(const char *path, const char *when) {
    static const char *const sfx[] = {"-journal", "-wal", "-shm"};
    for (int i = 0; i < 3; i++) {
        char side[160];
        snprintf(side, sizeof side, "%s%s", path, sfx[i]);
        ck_assert_msg(access(side, F_OK) != 0, "%s: %s is left", when, side);
    }
}

static qi_status merge1(const char *out, const char *in, qi_err *e) {
    const char *ins[1] = {in};
    qi_db_merge_stats st;
    memset(e, 0, sizeof *e);
    return qi_db_merge(out, ins, 1, &st, e);
}

START_TEST(check_constraint_refused_at_the_input) {
    static const struct {
        const char *sql, *want;
    } bad[] = {
        {"UPDATE runs SET placement = '{\"devices\":[\"cpu\"]' WHERE id = 1", "json_valid(placement)"},
        {"UPDATE metrics SET params = '[1]'", "json_type(params)"},
        {"UPDATE runs SET status = 'lost'", "status IN"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        tmp t;
        tmp_init(&t);
        make_db(t.out, "00ff", 1);
        make_db(t.in, "00ff", 2);
        char sql[256];
        snprintf(sql, sizeof sql, "PRAGMA ignore_check_constraints = ON; %s", bad[i].sql);
        raw_exec(t.in, sql);
        char before[65], after[65];
        file_sha(t.out, before);
        qi_err e;
        ck_assert_int_eq(merge1(t.out, t.in, &e), QI_ERR_DB);
        /* named as the input's fault, found before the output is written */
        ck_assert_msg(strstr(e.msg, t.in) == e.msg && strstr(e.msg, "CHECK constraint failed") &&
                          strstr(e.msg, bad[i].want),
                      "%s: %s", bad[i].sql, e.msg);
        file_sha(t.out, after);
        ck_assert_str_eq(after, before);
        no_side_files(t.out, bad[i].sql);
        tmp_fini(&t);
    }
}
END_TEST

START_TEST(journal_mode_kept_on_refusal) {
    tmp t;
    tmp_init(&t);
    make_db(t.out, "00ff", 1);
    raw_exec(t.out, "PRAGMA journal_mode = DELETE");
    make_db(t.in, "00ff", 2);
    char before[65], after[65];
    file_sha(t.out, before);
    int n_fail = 0;
    for (long n = 1;; n++) {
        qi_err e;
        qi_alloc_fail_after(n);
        qi_status s = merge1(t.out, t.in, &e);
        qi_alloc_fail_after(0);
        if (s == QI_OK) break;
        ck_assert_msg(s == QI_ERR_NOMEM, "allocation %ld: %s", n, e.msg);
        file_sha(t.out, after);
        ck_assert_msg(strcmp(after, before) == 0, "allocation %ld failed: the output changed", n);
        no_side_files(t.out, "a refusal");
        n_fail++;
    }
    ck_assert_int_gt(n_fail, 0);
    tmp_fini(&t);
}
END_TEST

START_TEST(no_side_files_on_refusal) {
    tmp t;
    tmp_init(&t);
    make_db(t.out, "00ff", 1);
    make_db(t.in, "11ee", 2); /* experiment "e" from another script */
    no_side_files(t.out, "the harness's close");
    char before[65], after[65];
    file_sha(t.out, before);
    qi_err e;
    ck_assert_int_eq(merge1(t.out, t.in, &e), QI_ERR_INVALID);
    ck_assert_msg(strstr(e.msg, "another script"), "%s", e.msg);
    file_sha(t.out, after);
    ck_assert_str_eq(after, before);
    no_side_files(t.out, "a refusal");
    tmp_fini(&t);
}
END_TEST

int main(void) {
    Suite *s = suite_create("db_merge");
    TCase *tc = tcase_create("db_merge");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, check_constraint_refused_at_the_input);
    tcase_add_test(tc, journal_mode_kept_on_refusal);
    tcase_add_test(tc, no_side_files_on_refusal);
    suite_add_tcase(s, tc);
    return qi_test_run_suite(s);
}

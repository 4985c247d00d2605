/* test_db.c - the results database (engine/harness/db.c) and canonical JSON
 * (engine/harness/json.c): schema and migrations, experiments, the run
 * lifecycle and resume rules, a run killed mid-way, readers during a run,
 * CSV export, hostile files and paths, allocation failures, merging
 * databases (qi_db_merge, db_merge.c). Every test works
 * in its own temporary directory; SQLite is read directly to check what was
 * stored. Built only when SQLite is found.
 *
 * The parts are in test_db/ (db_test.h); this file holds merging
 * databases and the suite.
 */
#include "db_test.h"

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
    db_schema_add(tc);
    db_crash_add(tc);
    db_hostile_add(tc);
    tcase_add_test(tc, merge_databases);
    tcase_add_test(tc, shard_paths);
    suite_add_tcase(s, tc);
    return qi_test_run_suite(s);
}

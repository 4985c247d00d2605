/* hostile.c - hostile files and paths, canonical JSON and keys, the machine and checkout facts, allocation failures. */
#include "db_test.h"

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

void db_hostile_add(TCase *tc) {
    tcase_add_test(tc, garbage_file_refused);
    tcase_add_test(tc, bad_paths_refused);
    tcase_add_test(tc, json_canonical_form);
    tcase_add_test(tc, config_key_is_stable);
    tcase_add_test(tc, git_and_host_facts);
    tcase_add_test(tc, allocation_failures);
}

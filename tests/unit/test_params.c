/* test_params.c - the key=value bag: parsing, replacing, typed reads and
 * every error path, each message naming the policy and the key. */
#include <check.h>
#include <limits.h>
#include <string.h>

#include "qinfer/params.h"
#include "testutil.h"

/* The message of a call expected to fail with QI_ERR_INVALID. */
#define EXPECT_INVALID(call, e)                                                                                \
    do {                                                                                                       \
        qi_err_clear(&(e));                                                                                    \
        ck_assert_int_eq((call), QI_ERR_INVALID);                                                              \
        ck_assert_int_eq((e).code, QI_ERR_INVALID);                                                            \
        ck_assert_msg(strchr((e).msg, '\n') == NULL, "multi-line message: %s", (e).msg);                      \
    } while (0)

static qi_params parsed(const char *spec) {
    qi_params p;
    qi_err e = {0};
    qi_params_init(&p);
    ck_assert_msg(qi_params_parse(&p, spec, &e) == QI_OK, "%s: %s", spec, e.msg);
    return p;
}

START_TEST(parse_and_get) {
    qi_params p = parsed(" window=128 , sinks = 4,name=x_y ");
    ck_assert_int_eq(p.n, 3);
    ck_assert_str_eq(qi_params_get(&p, "window"), "128");
    ck_assert_str_eq(qi_params_get(&p, "sinks"), "4");
    ck_assert_str_eq(qi_params_get(&p, "name"), "x_y");
    ck_assert_ptr_null(qi_params_get(&p, "absent"));
    ck_assert_ptr_null(qi_params_get(NULL, "window"));
}
END_TEST

START_TEST(empty_spec_adds_nothing) {
    qi_params p = parsed("");
    ck_assert_int_eq(p.n, 0);
    p = parsed("   ");
    ck_assert_int_eq(p.n, 0);
    qi_err e = {0};
    ck_assert_int_eq(qi_params_parse(&p, NULL, &e), QI_OK);
    ck_assert_int_eq(p.n, 0);
}
END_TEST

START_TEST(later_value_replaces) {
    qi_params p = parsed("a=1,b=2");
    qi_err e = {0};
    ck_assert_int_eq(qi_params_parse(&p, "a=3", &e), QI_OK);
    ck_assert_int_eq(p.n, 2);
    ck_assert_str_eq(qi_params_get(&p, "a"), "3");
    ck_assert_int_eq(qi_params_set(&p, "b", "20", &e), QI_OK);
    ck_assert_str_eq(qi_params_get(&p, "b"), "20");
    ck_assert_int_eq(p.n, 2);
    p = parsed("k=1,k=2");
    ck_assert_int_eq(p.n, 1);
    ck_assert_str_eq(qi_params_get(&p, "k"), "2");
}
END_TEST

START_TEST(bag_copies_strings) {
    qi_params p;
    qi_params_init(&p);
    char key[8] = "alpha", val[8] = "0.25";
    qi_err e = {0};
    ck_assert_int_eq(qi_params_set(&p, key, val, &e), QI_OK);
    memset(key, 'z', sizeof key - 1);
    memset(val, 'z', sizeof val - 1);
    ck_assert_str_eq(qi_params_get(&p, "alpha"), "0.25");
}
END_TEST

START_TEST(bad_keys_and_values) {
    qi_params p;
    qi_params_init(&p);
    qi_err e = {0};
    EXPECT_INVALID(qi_params_set(&p, "", "1", &e), e);
    EXPECT_INVALID(qi_params_set(&p, NULL, "1", &e), e);
    EXPECT_INVALID(qi_params_set(&p, "bad-key", "1", &e), e);
    ck_assert_ptr_nonnull(strstr(e.msg, "bad-key"));
    EXPECT_INVALID(qi_params_set(&p, "sp ace", "1", &e), e);
    EXPECT_INVALID(qi_params_set(&p, "k", "", &e), e);
    ck_assert_ptr_nonnull(strstr(e.msg, "'k'"));
    EXPECT_INVALID(qi_params_set(&p, "k", NULL, &e), e);
    char long_key[QI_PARAM_KEY_MAX + 1], long_val[QI_PARAM_VALUE_MAX + 1];
    memset(long_key, 'k', sizeof long_key - 1);
    long_key[QI_PARAM_KEY_MAX] = 0;
    memset(long_val, '7', sizeof long_val - 1);
    long_val[QI_PARAM_VALUE_MAX] = 0;
    EXPECT_INVALID(qi_params_set(&p, long_key, "1", &e), e);
    EXPECT_INVALID(qi_params_set(&p, "k", long_val, &e), e);
    /* the longest allowed key and value fit */
    long_key[QI_PARAM_KEY_MAX - 1] = 0;
    long_val[QI_PARAM_VALUE_MAX - 1] = 0;
    ck_assert_int_eq(qi_params_set(&p, long_key, long_val, &e), QI_OK);
    ck_assert_str_eq(qi_params_get(&p, long_key), long_val);
    ck_assert_int_eq(p.n, 1);
    /* parse goes through the same checks, also for over-long items */
    EXPECT_INVALID(qi_params_parse(&p, "a.b=1", &e), e);
    char spec[QI_PARAM_KEY_MAX + 8];
    memset(spec, 'q', QI_PARAM_KEY_MAX);
    strcpy(spec + QI_PARAM_KEY_MAX, "=1");
    EXPECT_INVALID(qi_params_parse(&p, spec, &e), e);
    char vspec[QI_PARAM_VALUE_MAX + 8] = "v=";
    memset(vspec + 2, '5', QI_PARAM_VALUE_MAX);
    vspec[QI_PARAM_VALUE_MAX + 2] = 0;
    EXPECT_INVALID(qi_params_parse(&p, vspec, &e), e);
    ck_assert_int_eq(p.n, 1);
}
END_TEST

START_TEST(bad_items) {
    qi_params p = parsed("keep=1");
    qi_err e = {0};
    EXPECT_INVALID(qi_params_parse(&p, "novalue", &e), e);
    ck_assert_ptr_nonnull(strstr(e.msg, "novalue"));
    EXPECT_INVALID(qi_params_parse(&p, "a=1,,b=2", &e), e);
    EXPECT_INVALID(qi_params_parse(&p, "a=1,", &e), e);
    EXPECT_INVALID(qi_params_parse(&p, ",a=1", &e), e);
    EXPECT_INVALID(qi_params_parse(&p, "a=", &e), e);
    EXPECT_INVALID(qi_params_parse(&p, "=1", &e), e);
    EXPECT_INVALID(qi_params_parse(&p, "a=1=2", &e), e);
    /* a failed parse leaves the bag as it was, even when items before the
     * bad one were fine */
    EXPECT_INVALID(qi_params_parse(&p, "x=1,keep=2,bad", &e), e);
    ck_assert_int_eq(p.n, 1);
    ck_assert_str_eq(qi_params_get(&p, "keep"), "1");
}
END_TEST

START_TEST(too_many_keys) {
    qi_params p;
    qi_params_init(&p);
    qi_err e = {0};
    char k[8];
    for (int i = 0; i < QI_PARAMS_MAX; i++) {
        snprintf(k, sizeof k, "k%d", i);
        ck_assert_int_eq(qi_params_set(&p, k, "1", &e), QI_OK);
    }
    EXPECT_INVALID(qi_params_set(&p, "one_more", "1", &e), e);
    ck_assert_ptr_nonnull(strstr(e.msg, "one_more"));
    ck_assert_int_eq(p.n, QI_PARAMS_MAX);
    /* replacing an existing key is still fine when full */
    ck_assert_int_eq(qi_params_set(&p, "k3", "9", &e), QI_OK);
    ck_assert_str_eq(qi_params_get(&p, "k3"), "9");
}
END_TEST

START_TEST(int_reads) {
    qi_params p = parsed("a=42,b=-7,c=+3,d=0");
    qi_err e = {0};
    long v = 0;
    ck_assert_int_eq(qi_params_int(&p, "pol", "a", 1, 0, 100, &v, &e), QI_OK);
    ck_assert_int_eq(v, 42);
    ck_assert_int_eq(qi_params_int(&p, "pol", "b", 1, -10, 10, &v, &e), QI_OK);
    ck_assert_int_eq(v, -7);
    ck_assert_int_eq(qi_params_int(&p, "pol", "c", 1, 0, 10, &v, &e), QI_OK);
    ck_assert_int_eq(v, 3);
    ck_assert_int_eq(qi_params_int(&p, "pol", "d", 1, 0, 0, &v, &e), QI_OK);
    ck_assert_int_eq(v, 0);
    ck_assert_int_eq(qi_params_int(&p, "pol", "missing", 17, 0, 10, &v, &e), QI_OK);
    ck_assert_int_eq(v, 17);
    ck_assert_int_eq(qi_params_int(NULL, "pol", "a", 5, 0, 10, &v, &e), QI_OK);
    ck_assert_int_eq(v, 5);
}
END_TEST

START_TEST(int_errors_name_policy_and_key) {
    static const char *const bad[] = {"12abc", "abc", "1.5", "0x10", " 5", "5 ", "1e3",
                                      "99999999999999999999999", "-1", "101", "nan", "inf"};
    qi_err e = {0};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        qi_params p;
        qi_params_init(&p);
        ck_assert_int_eq(qi_params_set(&p, "sinks", bad[i], &e), QI_OK);
        long v = 12345;
        EXPECT_INVALID(qi_params_int(&p, "streaming", "sinks", 4, 0, 100, &v, &e), e);
        ck_assert_int_eq(v, 12345); /* untouched on error */
        ck_assert_msg(strstr(e.msg, "streaming") && strstr(e.msg, "'sinks'") && strstr(e.msg, bad[i]) &&
                          strstr(e.msg, "[0, 100]"),
                      "value '%s': %s", bad[i], e.msg);
    }
    qi_params p = parsed("n=-3");
    EXPECT_INVALID(qi_params_int(&p, "w", "n", 0, 0, LONG_MAX, &(long){0}, &e), e);
    ck_assert_str_eq(e.msg, "w: parameter 'n' must be an integer >= 0, got '-3'");
}
END_TEST

START_TEST(double_reads) {
    qi_params p = parsed("h=0.25,one=1,zero=0,sci=5e-1,neg=-0.5,tiny=1e-400");
    qi_err e = {0};
    double v = 0;
    ck_assert_int_eq(qi_params_double(&p, "h2o", "h", 0.5, 0, 1, &v, &e), QI_OK);
    ck_assert(v == 0.25);
    ck_assert_int_eq(qi_params_double(&p, "h2o", "one", 0.5, 0, 1, &v, &e), QI_OK);
    ck_assert(v == 1.0);
    ck_assert_int_eq(qi_params_double(&p, "h2o", "zero", 0.5, 0, 1, &v, &e), QI_OK);
    ck_assert(v == 0.0);
    ck_assert_int_eq(qi_params_double(&p, "h2o", "sci", 0, 0, 1, &v, &e), QI_OK);
    ck_assert(v == 0.5);
    ck_assert_int_eq(qi_params_double(&p, "h2o", "neg", 0, -1, 1, &v, &e), QI_OK);
    ck_assert(v == -0.5);
    ck_assert_int_eq(qi_params_double(&p, "h2o", "tiny", 0.5, 0, 1, &v, &e), QI_OK); /* underflow: ~0 */
    ck_assert(v >= 0 && v < 1e-300);
    ck_assert_int_eq(qi_params_double(&p, "h2o", "missing", 0.75, 0, 1, &v, &e), QI_OK);
    ck_assert(v == 0.75);
}
END_TEST

START_TEST(double_errors_name_policy_and_key) {
    static const char *const bad[] = {"abc", "0.5x", "nan", "NaN", "inf", "-inf", "infinity", "1e999",
                                      "1.5", "-0.1", " 0.5", "0.5 ", "."};
    qi_err e = {0};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        qi_params p;
        qi_params_init(&p);
        ck_assert_int_eq(qi_params_set(&p, "heavy", bad[i], &e), QI_OK);
        double v = 7;
        EXPECT_INVALID(qi_params_double(&p, "h2o", "heavy", 0.5, 0, 1, &v, &e), e);
        ck_assert(v == 7);
        ck_assert_msg(strstr(e.msg, "h2o") && strstr(e.msg, "'heavy'") && strstr(e.msg, bad[i]), "value '%s': %s",
                      bad[i], e.msg);
    }
    qi_params p = parsed("heavy=abc");
    EXPECT_INVALID(qi_params_double(&p, "h2o", "heavy", 0.5, 0, 1, &(double){0}, &e), e);
    ck_assert_str_eq(e.msg, "h2o: parameter 'heavy' must be a number in [0, 1], got 'abc'");
}
END_TEST

START_TEST(bool_spellings) {
    static const char *const yes[] = {"true", "on", "yes", "1", "TRUE", "On", "Yes"};
    static const char *const no[] = {"false", "off", "no", "0", "False", "OFF", "No"};
    qi_err e = {0};
    for (size_t i = 0; i < sizeof yes / sizeof *yes; i++) {
        qi_params p;
        qi_params_init(&p);
        ck_assert_int_eq(qi_params_set(&p, "a", yes[i], &e), QI_OK);
        ck_assert_int_eq(qi_params_set(&p, "b", no[i], &e), QI_OK);
        bool a = false, b = true;
        ck_assert_int_eq(qi_params_bool(&p, "q", "a", false, &a, &e), QI_OK);
        ck_assert_int_eq(qi_params_bool(&p, "q", "b", true, &b, &e), QI_OK);
        ck_assert(a && !b);
    }
    static const char *const bad[] = {"maybe", "2", "tru", "yes!", "t", "-1", " on"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        qi_params p;
        qi_params_init(&p);
        ck_assert_int_eq(qi_params_set(&p, "offload", bad[i], &e), QI_OK);
        bool v = true;
        EXPECT_INVALID(qi_params_bool(&p, "qinfer", "offload", false, &v, &e), e);
        ck_assert(v);
        ck_assert_msg(strstr(e.msg, "qinfer") && strstr(e.msg, "'offload'") && strstr(e.msg, bad[i]), "%s",
                      e.msg);
    }
    bool d = false;
    ck_assert_int_eq(qi_params_bool(NULL, "q", "x", true, &d, &e), QI_OK);
    ck_assert(d);
}
END_TEST

START_TEST(unknown_keys) {
    static const char *const known[] = {"heavy", "sinks", NULL};
    static const char *const none[] = {NULL};
    qi_params p = parsed("heavy=0.5,sinks=2");
    qi_err e = {0};
    ck_assert_int_eq(qi_params_check_known(&p, "h2o", known, &e), QI_OK);
    p = parsed("heavy=0.5,hevy=2");
    EXPECT_INVALID(qi_params_check_known(&p, "h2o", known, &e), e);
    ck_assert_str_eq(e.msg, "h2o: unknown parameter 'hevy' (h2o takes: heavy, sinks)");
    EXPECT_INVALID(qi_params_check_known(&p, "window", none, &e), e);
    ck_assert_str_eq(e.msg, "window: unknown parameter 'heavy' (window takes no parameters)");
    qi_params empty;
    qi_params_init(&empty);
    ck_assert_int_eq(qi_params_check_known(&empty, "window", none, &e), QI_OK);
    ck_assert_int_eq(qi_params_check_known(NULL, "window", none, &e), QI_OK);
}
END_TEST

START_TEST(null_err_is_fine) {
    qi_params p = parsed("a=x");
    long v;
    ck_assert_int_eq(qi_params_int(&p, "w", "a", 0, 0, 1, &v, NULL), QI_ERR_INVALID);
    ck_assert_int_eq(qi_params_parse(&p, "bad", NULL), QI_ERR_INVALID);
    ck_assert_int_eq(qi_params_set(&p, "", "1", NULL), QI_ERR_INVALID);
}
END_TEST

START_TEST(first_error_wins) {
    qi_params p = parsed("a=x,b=y");
    qi_err e = {0};
    long v;
    ck_assert_int_eq(qi_params_int(&p, "w", "a", 0, 0, 1, &v, &e), QI_ERR_INVALID);
    ck_assert_int_eq(qi_params_int(&p, "w", "b", 0, 0, 1, &v, &e), QI_ERR_INVALID);
    ck_assert_ptr_nonnull(strstr(e.msg, "'a'"));
}
END_TEST

/* The bag lives in its struct: nothing it does may allocate. */
START_TEST(never_allocates) {
    qi_alloc_fail_after(1);
    qi_params p;
    qi_params_init(&p);
    qi_err e = {0};
    ck_assert_int_eq(qi_params_parse(&p, "a=1,b=0.5,c=on", &e), QI_OK);
    ck_assert_int_eq(qi_params_set(&p, "d", "x", &e), QI_OK);
    long i;
    double d;
    bool b;
    static const char *const known[] = {"a", "b", "c", "d", NULL};
    ck_assert_int_eq(qi_params_int(&p, "t", "a", 0, 0, 9, &i, &e), QI_OK);
    ck_assert_int_eq(qi_params_double(&p, "t", "b", 0, 0, 1, &d, &e), QI_OK);
    ck_assert_int_eq(qi_params_bool(&p, "t", "c", false, &b, &e), QI_OK);
    ck_assert_int_eq(qi_params_check_known(&p, "t", known, &e), QI_OK);
    ck_assert_int_eq(qi_params_int(&p, "t", "d", 0, 0, 9, &i, &e), QI_ERR_INVALID);
    /* the armed failure is still pending: nothing consumed it */
    void *x = qi_malloc(8);
    ck_assert_ptr_null(x);
    qi_alloc_fail_after(0);
}
END_TEST

int main(void) {
    Suite *su = suite_create("params");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, parse_and_get);
    tcase_add_test(tc, empty_spec_adds_nothing);
    tcase_add_test(tc, later_value_replaces);
    tcase_add_test(tc, bag_copies_strings);
    tcase_add_test(tc, bad_keys_and_values);
    tcase_add_test(tc, bad_items);
    tcase_add_test(tc, too_many_keys);
    tcase_add_test(tc, int_reads);
    tcase_add_test(tc, int_errors_name_policy_and_key);
    tcase_add_test(tc, double_reads);
    tcase_add_test(tc, double_errors_name_policy_and_key);
    tcase_add_test(tc, bool_spellings);
    tcase_add_test(tc, unknown_keys);
    tcase_add_test(tc, null_err_is_fine);
    tcase_add_test(tc, first_error_wins);
    tcase_add_test(tc, never_allocates);
    suite_add_tcase(su, tc);
    return qi_test_run_suite(su);
}

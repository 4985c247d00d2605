/* test_measure.c - every latency and throughput definition of measure.h on
 * timelines made by hand, whose figures are worked out in the comments:
 * TTFT, TPOT, inter-token latency, end-to-end latency, queueing delay, the
 * percentiles, request and token throughput, goodput under SLOs; timelines
 * that are not timelines refused; the canonical metric names; the fake
 * clock the CLI and Lua tests hold bench and Lua to one definition with. */
#include <check.h>
#include <math.h>
#include <regex.h>
#include <stdlib.h>
#include <string.h>

#include "qinfer/measure.h"
#include "testutil.h"

#define NEAR(a, b) near_((double)(a), (double)(b), #a)
static void near_(double a, double b, const char *what) {
    ck_assert_msg(fabs(a - b) <= 1e-12 * (1 + fabs(b)), "%s = %.17g, want %.17g", what, a, b);
}

/* A: queued 0.5 s, tokens at 1.0 1.2 1.5 2.0: TTFT 1, e2e 2, TPOT 1/3, ITL .2 .3 .5
 * B: no wait, one token at 1.5:             TTFT .5, e2e .5, no TPOT
 * C: queued 1 s, tokens at 4.0 4.5:          TTFT 2, e2e 2.5, TPOT .5, ITL .5
 * D: rejected at 2.5 */
static const double tA[] = {1.0, 1.2, 1.5, 2.0}, tB[] = {1.5}, tC[] = {4.0, 4.5};
static const qi_request_timeline k_run[] = {
    {.arrival = 0.0, .start = 0.5, .token_t = tA, .n_prompt = 10, .n_out = 4},
    {.arrival = 1.0, .start = 1.0, .token_t = tB, .n_prompt = 20, .n_out = 1},
    {.arrival = 2.0, .start = 3.0, .token_t = tC, .n_prompt = 30, .n_out = 2},
    {.arrival = 2.5, .start = NAN, .token_t = NULL, .n_prompt = 40, .n_out = 0, .rejected = true},
};

START_TEST(request_definitions) {
    qi_request_metrics m;
    qi_err e = {0};
    ck_assert_int_eq(qi_measure_request(&k_run[0], &m, &e), QI_OK);
    NEAR(m.ttft_s, 1.0);
    NEAR(m.e2e_s, 2.0);
    NEAR(m.tpot_s, 1.0 / 3); /* (2 - 1) / (4 - 1) */
    NEAR(m.queue_s, 0.5);
    ck_assert_int_eq(qi_measure_request(&k_run[1], &m, &e), QI_OK);
    NEAR(m.ttft_s, 0.5);
    NEAR(m.e2e_s, 0.5);
    ck_assert(isnan(m.tpot_s)); /* one token: no time per output token */
    NEAR(m.queue_s, 0.0);
    ck_assert_int_eq(qi_measure_request(&k_run[3], &m, &e), QI_OK);
    ck_assert(isnan(m.ttft_s) && isnan(m.e2e_s) && isnan(m.tpot_s) && isnan(m.queue_s));
}
END_TEST

START_TEST(bad_timelines_refused) {
    qi_request_metrics m;
    qi_err e = {0};
    const double before[] = {0.5}, backwards[] = {2.0, 1.9};
    qi_request_timeline t = {.arrival = 1.0, .start = NAN, .token_t = before, .n_out = 1};
    ck_assert_int_eq(qi_measure_request(&t, &m, &e), QI_ERR_INVALID); /* a token before its arrival */
    ck_assert_ptr_nonnull(strstr(e.msg, "token 0"));
    qi_err_clear(&e);
    t = (qi_request_timeline){.arrival = 1.0, .start = 1.0, .token_t = backwards, .n_out = 2};
    ck_assert_int_eq(qi_measure_request(&t, &m, &e), QI_ERR_INVALID); /* time running backwards */
    ck_assert_ptr_nonnull(strstr(e.msg, "token 1"));
    qi_err_clear(&e);
    t = (qi_request_timeline){.arrival = 1.0, .start = 0.9, .token_t = NULL, .n_out = 0};
    ck_assert_int_eq(qi_measure_request(&t, &m, &e), QI_ERR_INVALID); /* scheduled before it arrived */
    qi_err_clear(&e);
    t = (qi_request_timeline){.arrival = 1.0, .start = 1.0, .token_t = NULL, .n_out = 2};
    ck_assert_int_eq(qi_measure_request(&t, &m, &e), QI_ERR_INVALID); /* tokens without times */
    qi_err_clear(&e);
    t = (qi_request_timeline){.arrival = NAN, .start = NAN};
    ck_assert_int_eq(qi_measure_request(&t, &m, &e), QI_ERR_INVALID);
    /* a run names the request at fault */
    qi_request_timeline run[2] = {k_run[0], {.arrival = 1.0, .start = 0.5}};
    qi_run_metrics rm;
    qi_err_clear(&e);
    ck_assert_int_eq(qi_measure_run(run, 2, NULL, &rm, &e), QI_ERR_INVALID);
    ck_assert_ptr_nonnull(strstr(e.msg, "request 1"));
}
END_TEST

START_TEST(percentiles_are_numpys) {
    double v[] = {4, 1, 3, 2};
    qi_measure_summary s;
    qi_measure_summarize(v, 4, &s);
    ck_assert_int_eq(s.n, 4);
    NEAR(s.mean, 2.5);
    NEAR(s.median, 2.5);
    NEAR(s.p90, 3.7);  /* numpy.percentile([1,2,3,4], 90) */
    NEAR(s.p99, 3.97); /* numpy.percentile([1,2,3,4], 99) */
    NEAR(s.min, 1);
    NEAR(s.max, 4);
    double one[] = {7};
    qi_measure_summarize(one, 1, &s);
    NEAR(s.median, 7);
    NEAR(s.p99, 7);
    double with_nan[] = {NAN, 5, NAN, 1};
    qi_measure_summarize(with_nan, 4, &s);
    ck_assert_int_eq(s.n, 2);
    NEAR(s.mean, 3);
    NEAR(s.p90, 4.6);
    qi_measure_summarize(NULL, 0, &s);
    ck_assert_int_eq(s.n, 0);
    ck_assert(isnan(s.mean) && isnan(s.median) && isnan(s.p99));
    NEAR(qi_measure_percentile((const double[]){10, 20}, 2, 0), 10);
    NEAR(qi_measure_percentile((const double[]){10, 20}, 2, 100), 20);
    NEAR(qi_measure_percentile((const double[]){10, 20}, 2, 25), 12.5);
}
END_TEST

START_TEST(run_definitions) {
    qi_run_metrics r;
    qi_err e = {0};
    ck_assert_int_eq(qi_measure_run(k_run, 4, NULL, &r, &e), QI_OK);
    ck_assert_int_eq(r.n_requests, 4);
    ck_assert_int_eq(r.n_done, 3);
    ck_assert_int_eq(r.n_rejected, 1);
    ck_assert_int_eq(r.n_good, 3); /* no SLO: every request done is good */
    ck_assert_int_eq(r.output_tokens, 7);
    ck_assert_int_eq(r.prompt_tokens, 60); /* the rejected request's 40 not counted */
    NEAR(r.duration_s, 4.5);               /* first arrival 0 to last token 4.5 */
    NEAR(r.requests_per_s, 3 / 4.5);
    NEAR(r.output_tokens_per_s, 7 / 4.5);
    NEAR(r.total_tokens_per_s, 67 / 4.5);
    NEAR(r.goodput_req_per_s, 3 / 4.5);
    /* TTFT {1, .5, 2} */
    ck_assert_int_eq(r.ttft.n, 3);
    NEAR(r.ttft.mean, 3.5 / 3);
    NEAR(r.ttft.median, 1.0);
    NEAR(r.ttft.p90, 1.8);
    NEAR(r.ttft.p99, 1.98);
    /* TPOT {1/3, .5}: B has none */
    ck_assert_int_eq(r.tpot.n, 2);
    NEAR(r.tpot.mean, 5.0 / 12);
    NEAR(r.tpot.median, 5.0 / 12);
    NEAR(r.tpot.p90, 1.0 / 3 + 0.9 / 6);
    /* ITL {.2 .3 .5 .5}: every gap of every request */
    ck_assert_int_eq(r.itl.n, 4);
    NEAR(r.itl.mean, 0.375);
    NEAR(r.itl.median, 0.4);
    NEAR(r.itl.p90, 0.5);
    /* e2e {2, .5, 2.5}, queue {.5, 0, 1} */
    NEAR(r.e2e.mean, 5.0 / 3);
    NEAR(r.e2e.median, 2.0);
    NEAR(r.queue.mean, 0.5);
    NEAR(r.queue.max, 1.0);
}
END_TEST

START_TEST(goodput_under_slos) {
    qi_run_metrics r;
    qi_err e = {0};
    /* TTFT <= 1 and TPOT <= .4: A (1, 1/3) and B (.5, none) meet them; C's TTFT 2 does not */
    qi_slo slo = {.ttft_s = 1.0, .tpot_s = 0.4};
    ck_assert_int_eq(qi_measure_run(k_run, 4, &slo, &r, &e), QI_OK);
    ck_assert_int_eq(r.n_good, 2);
    NEAR(r.goodput_req_per_s, 2 / 4.5);
    slo.tpot_s = 0.3; /* now A's TPOT breaks it too */
    ck_assert_int_eq(qi_measure_run(k_run, 4, &slo, &r, &e), QI_OK);
    ck_assert_int_eq(r.n_good, 1);
    slo = (qi_slo){.tpot_s = 0.5}; /* TPOT alone: A and C (.5 meets <= .5) and B */
    ck_assert_int_eq(qi_measure_run(k_run, 4, &slo, &r, &e), QI_OK);
    ck_assert_int_eq(r.n_good, 3);
    /* goodput never exceeds the request rate */
    ck_assert(r.goodput_req_per_s <= r.requests_per_s);
}
END_TEST

START_TEST(empty_run) {
    qi_run_metrics r;
    qi_err e = {0};
    ck_assert_int_eq(qi_measure_run(NULL, 0, NULL, &r, &e), QI_OK);
    ck_assert_int_eq(r.n_done, 0);
    NEAR(r.duration_s, 0);
    NEAR(r.requests_per_s, 0);
    ck_assert(isnan(r.ttft.mean));
    /* every request rejected: rates 0, no latencies */
    ck_assert_int_eq(qi_measure_run(&k_run[3], 1, NULL, &r, &e), QI_OK);
    ck_assert_int_eq(r.n_rejected, 1);
    ck_assert_int_eq(r.ttft.n, 0);
}
END_TEST

START_TEST(metric_names) {
    qi_run_metrics r;
    qi_err e = {0};
    ck_assert_int_eq(qi_measure_run(k_run, 4, NULL, &r, &e), QI_OK);
    regex_t re;
    ck_assert_int_eq(regcomp(&re, "^[a-z0-9_]+(\\.[a-z0-9_]+)+$", REG_EXTENDED | REG_NOSUB), 0);
    const char *names[64];
    int n = 0;
    const char *name, *unit;
    double v;
    bool saw_p99_tpot = false, saw_goodput = false;
    for (int i = 0; qi_measure_run_metric(&r, i, &name, &unit, &v); i++) {
        if (!name) continue;
        ck_assert_msg(regexec(&re, name, 0, NULL, 0) == 0, "%s is not area.what_unit", name);
        ck_assert_msg(!strstr(name, ".b1") && !strstr(name, "_ms"), "%s: batch or ms in a name", name);
        ck_assert(unit && *unit);
        ck_assert_msg(!isnan(v), "%s is NaN", name);
        for (int j = 0; j < n; j++) ck_assert_msg(strcmp(names[j], name), "%s twice", name);
        ck_assert_int_lt(n, 64);
        names[n++] = name;
        if (!strcmp(name, "tpot.p99_s")) {
            saw_p99_tpot = true;
            NEAR(v, r.tpot.p99);
            ck_assert_str_eq(unit, "s");
        }
        if (!strcmp(name, "goodput.requests_per_s")) {
            saw_goodput = true;
            NEAR(v, r.goodput_req_per_s);
        }
    }
    regfree(&re);
    ck_assert(saw_p99_tpot && saw_goodput);
    ck_assert_int_eq(n, 27); /* 5 latencies x 4 statistics + 7 counts and rates */
    /* a run without two-token requests has no TPOT names */
    ck_assert_int_eq(qi_measure_run(&k_run[1], 1, NULL, &r, &e), QI_OK);
    for (int i = 0; qi_measure_run_metric(&r, i, &name, &unit, &v); i++)
        ck_assert_msg(!name || strncmp(name, "tpot.", 5), "%s over no values", name);
}
END_TEST

START_TEST(fake_clock_ticks) {
    /* each test runs in its own process (fork mode): the clock is read here first */
    setenv("QINFER_FAKE_CLOCK", "0.25", 1);
    double a = qi_measure_now(), b = qi_measure_now(), c = qi_measure_now();
    NEAR(b - a, 0.25);
    NEAR(c - b, 0.25);
    NEAR(qi_measure_rate(8, 0.5), 16);
    ck_assert(isinf(qi_measure_rate(8, 0)));
}
END_TEST

START_TEST(real_clock_advances) {
    unsetenv("QINFER_FAKE_CLOCK");
    double a = qi_measure_now(), b = qi_measure_now();
    ck_assert(b >= a && a > 0);
}
END_TEST

int main(void) {
    Suite *su = suite_create("measure");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, request_definitions);
    tcase_add_test(tc, bad_timelines_refused);
    tcase_add_test(tc, percentiles_are_numpys);
    tcase_add_test(tc, run_definitions);
    tcase_add_test(tc, goodput_under_slos);
    tcase_add_test(tc, empty_run);
    tcase_add_test(tc, metric_names);
    tcase_add_test(tc, fake_clock_ticks);
    tcase_add_test(tc, real_clock_advances);
    suite_add_tcase(su, tc);
    return qi_test_run_suite(su);
}

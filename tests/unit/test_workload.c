/* test_workload.c - serving workloads: a seed reproduces a workload and
 * another seed changes it; Poisson arrivals have the rate asked for and
 * exponential gaps; offline puts every arrival at 0; each length
 * distribution stays in its range with the mean it promises; prompts lie
 * inside the corpus; traces are read line by line and every malformed line
 * is refused naming file:line. */
#include <check.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "qinfer/workload.h"
#include "testutil.h"

static qi_len_dist dist(const char *spec) {
    qi_len_dist d;
    qi_err e = {0};
    ck_assert_msg(qi_len_dist_parse(spec, &d, &e) == QI_OK, "%s: %s", spec, e.msg);
    return d;
}

static qi_workload *gen(long n, double rate, const char *pl, const char *ol, uint64_t seed, long corpus) {
    qi_workload_opts o = {.n_requests = n, .rate = rate, .prompt_len = dist(pl), .output_len = dist(ol),
                          .seed = seed, .corpus_tokens = corpus};
    qi_workload *w = NULL;
    qi_err e = {0};
    ck_assert_msg(qi_workload_generate(&o, &w, &e) == QI_OK, "%s", e.msg);
    ck_assert_int_eq(w->n, n);
    return w;
}

static bool same(const qi_workload *a, const qi_workload *b) {
    return a->n == b->n && !memcmp(a->req, b->req, sizeof *a->req * (size_t)a->n);
}

START_TEST(seeds_reproduce) {
    qi_workload *a = gen(500, 4.0, "uniform:16-256", "lognormal:64,1", 7, 10000);
    qi_workload *b = gen(500, 4.0, "uniform:16-256", "lognormal:64,1", 7, 10000);
    qi_workload *c = gen(500, 4.0, "uniform:16-256", "lognormal:64,1", 8, 10000);
    ck_assert_msg(same(a, b), "one seed, two workloads");
    ck_assert_msg(!same(a, c), "another seed, the same workload");
    /* the arrivals depend on the rate alone: at twice the rate, each arrival
     * comes at half the time (the same uniforms, gaps divided by 2) */
    qi_workload *d = gen(500, 8.0, "uniform:16-256", "lognormal:64,1", 7, 10000);
    for (long i = 0; i < a->n; i++) {
        ck_assert(fabs(d->req[i].arrival_s * 2 - a->req[i].arrival_s) <= 1e-9 * a->req[i].arrival_s);
        ck_assert_int_eq(d->req[i].n_prompt, a->req[i].n_prompt);
    }
    /* pinned: the first arrival and lengths of seed 7 (the order of draws is
     * part of the definition) */
    ck_assert_msg(a->req[0].arrival_s > 0, "the first request arrives after one gap");
    qi_workload_free(a);
    qi_workload_free(b);
    qi_workload_free(c);
    qi_workload_free(d);
}
END_TEST

START_TEST(poisson_rate) {
    const long n = 20000;
    const double rate = 5.0;
    qi_workload *w = gen(n, rate, "8", "8", 1, 0);
    double prev = 0;
    long over_mean = 0;
    for (long i = 0; i < n; i++) {
        double gap = w->req[i].arrival_s - prev;
        ck_assert(gap >= 0);
        over_mean += gap > 1 / rate;
        prev = w->req[i].arrival_s;
    }
    /* mean gap 1/rate: the last arrival is n/rate, with sd sqrt(n)/rate */
    double sd = sqrt((double)n) / rate;
    ck_assert_msg(fabs(prev - n / rate) < 5 * sd, "last arrival %g s, expected %g +- %g", prev, n / rate, 5 * sd);
    /* exponential gaps: P(gap > mean) = 1/e */
    double frac = (double)over_mean / n, sd_f = sqrt(exp(-1) * (1 - exp(-1)) / n);
    ck_assert_msg(fabs(frac - exp(-1)) < 5 * sd_f, "P(gap > mean) = %g, expected %g", frac, exp(-1));
    qi_workload_free(w);
}
END_TEST

START_TEST(offline_all_at_zero) {
    qi_workload *w = gen(64, 0, "fixed:32", "16", 3, 0);
    for (long i = 0; i < w->n; i++) {
        ck_assert(w->req[i].arrival_s == 0);
        ck_assert_int_eq(w->req[i].n_prompt, 32);
        ck_assert_int_eq(w->req[i].n_out, 16);
        ck_assert_int_eq(w->req[i].prompt_at, 0);
    }
    qi_workload_free(w);
}
END_TEST

START_TEST(length_distributions) {
    const long n = 20000;
    qi_workload *w = gen(n, 0, "uniform:10-20", "exp:50", 11, 0);
    long seen[21] = {0};
    double sum_out = 0;
    for (long i = 0; i < n; i++) {
        ck_assert(w->req[i].n_prompt >= 10 && w->req[i].n_prompt <= 20);
        seen[w->req[i].n_prompt]++;
        ck_assert(w->req[i].n_out >= 1);
        sum_out += w->req[i].n_out;
    }
    for (int v = 10; v <= 20; v++) ck_assert_msg(seen[v] > n / 11 / 2, "uniform: %d drawn %ld times", v, seen[v]);
    /* ceil of an exponential of mean 50: mean about 50.5, sd 50 / sqrt(n) */
    ck_assert_msg(fabs(sum_out / n - 50.5) < 5 * 50 / sqrt((double)n), "exp:50 mean %g", sum_out / n);
    qi_workload_free(w);
    /* lognormal: the median is the median asked for */
    w = gen(n, 0, "lognormal:100,0.8", "1", 12, 0);
    long below = 0;
    for (long i = 0; i < n; i++) below += w->req[i].n_prompt < 100;
    ck_assert_msg(fabs((double)below / n - 0.5) < 0.02, "lognormal: %ld of %ld below the median", below, n);
    qi_workload_free(w);
}
END_TEST

START_TEST(prompts_inside_corpus) {
    qi_workload *w = gen(2000, 1, "uniform:1-300", "4", 5, 300);
    long at_zero = 0;
    for (long i = 0; i < w->n; i++) {
        ck_assert(w->req[i].prompt_at >= 0);
        ck_assert(w->req[i].prompt_at + w->req[i].n_prompt <= 300);
        at_zero += w->req[i].prompt_at == 0;
    }
    ck_assert_msg(at_zero < w->n, "every prompt at the corpus start");
    qi_workload_free(w);
    qi_workload_opts o = {.n_requests = 4, .prompt_len = dist("400"), .output_len = dist("4"), .corpus_tokens = 300};
    qi_workload *x = NULL;
    qi_err e = {0};
    ck_assert_int_eq(qi_workload_generate(&o, &x, &e), QI_ERR_INVALID);
    ck_assert_ptr_null(x);
    ck_assert_msg(strstr(e.msg, "longer than the corpus"), "%s", e.msg);
}
END_TEST

START_TEST(bad_specs_and_options) {
    const char *bad[] = {"", "0", "-3", "1.5", "fixed:", "fixed:x", "uniform:5", "uniform:9-3", "uniform:0-4",
                         "exp:0", "lognormal:100", "lognormal:0,1", "lognormal:10,9", "zipf:2", "12abc", "2000000",
                         "uniform:1-2-3", NULL};
    for (int i = 0; bad[i]; i++) {
        qi_len_dist d;
        qi_err e = {0};
        ck_assert_msg(qi_len_dist_parse(bad[i], &d, &e) == QI_ERR_INVALID, "'%s' accepted", bad[i]);
        ck_assert_msg(strstr(e.msg, bad[i]), "message lacks the spec: %s", e.msg);
    }
    ck_assert_int_eq(dist("fixed:7").kind, QI_LEN_FIXED);
    ck_assert_int_eq(dist("uniform:3-3").kind, QI_LEN_UNIFORM);
    qi_workload *w = NULL;
    qi_err e = {0};
    qi_workload_opts o = {.n_requests = 0, .prompt_len = dist("4"), .output_len = dist("4")};
    ck_assert_int_eq(qi_workload_generate(&o, &w, &e), QI_ERR_INVALID);
    o.n_requests = 3;
    o.rate = -1;
    ck_assert_int_eq(qi_workload_generate(&o, &w, &e), QI_ERR_INVALID);
    o.rate = INFINITY;
    ck_assert_int_eq(qi_workload_generate(&o, &w, &e), QI_ERR_INVALID);
    o.rate = NAN;
    ck_assert_int_eq(qi_workload_generate(&o, &w, &e), QI_ERR_INVALID);
    ck_assert_ptr_null(w);
}
END_TEST

/* A trace file with this text; its path in buf. */
static const char *trace(char *buf, size_t n, const char *text) {
    snprintf(buf, n, "/tmp/qi_trace_XXXXXX");
    int fd = mkstemp(buf);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    return buf;
}

START_TEST(traces_replayed) {
    char p[64];
    qi_workload *w = NULL;
    qi_err e = {0};
    trace(p, sizeof p,
          "arrival_s,prompt_tokens,output_tokens\n"
          "0.0, 12, 5   # the first\n"
          "\n"
          "# a comment line\n"
          "0.25\t100\t1\n"
          "0.25 7 300\n");
    ck_assert_msg(qi_workload_trace(p, 1000, 9, &w, &e) == QI_OK, "%s", e.msg);
    ck_assert_int_eq(w->n, 3);
    ck_assert(w->req[1].arrival_s == 0.25 && w->req[1].n_prompt == 100 && w->req[1].n_out == 1);
    ck_assert(w->req[2].n_out == 300);
    for (long i = 0; i < w->n; i++) ck_assert(w->req[i].prompt_at + w->req[i].n_prompt <= 1000);
    qi_workload *w2 = NULL;
    ck_assert_int_eq(qi_workload_trace(p, 1000, 9, &w2, &e), QI_OK);
    ck_assert_msg(same(w, w2), "a trace and a seed give one workload");
    qi_workload_free(w);
    qi_workload_free(w2);
    unlink(p);

    static const struct {
        const char *text, *want;
    } bad[] = {
        {"0 10 5\n1 x 5\n", ":2: expected"},
        {"0 10 5\n0.5 10\n", ":2: expected"},
        {"0 10 5 7\n", ":1: expected"},
        {"1 10 5\n0.5 10 5\n", ":2: arrival 0.5 s is negative or before"},
        {"-1 10 5\n", ":1: arrival -1"},
        {"0 0 5\n", ":1: prompt length 0"},
        {"0 10 2.5\n", ":1: output length 2.5"},
        {"0 10 99999999\n", ":1: output length"},
        {"0 10 5\n1 nan 5\n", ":2: expected"},
        {"# nothing\n\n", "no requests"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        e = (qi_err){0};
        trace(p, sizeof p, bad[i].text);
        ck_assert_int_ne(qi_workload_trace(p, 0, 1, &w, &e), QI_OK);
        ck_assert_ptr_null(w);
        ck_assert_msg(strstr(e.msg, bad[i].want) && strstr(e.msg, p), "'%s': %s", bad[i].text, e.msg);
        unlink(p);
    }
    e = (qi_err){0};
    trace(p, sizeof p, "0 500 5\n");
    ck_assert_int_eq(qi_workload_trace(p, 100, 1, &w, &e), QI_ERR_INVALID); /* longer than the corpus */
    unlink(p);
    e = (qi_err){0};
    ck_assert_int_eq(qi_workload_trace("/nonexistent/trace.tsv", 0, 1, &w, &e), QI_ERR_IO);
}
END_TEST

START_TEST(allocation_failures_leak_nothing) {
    for (long k = 1; k <= 3; k++) {
        qi_workload_opts o = {.n_requests = 10, .rate = 1, .prompt_len = dist("4"), .output_len = dist("4")};
        qi_workload *w = NULL;
        qi_err e = {0};
        qi_alloc_fail_after(k);
        qi_status st = qi_workload_generate(&o, &w, &e);
        qi_alloc_fail_after(0);
        if (st) {
            ck_assert_int_eq(st, QI_ERR_NOMEM);
            ck_assert_ptr_null(w);
        }
        qi_workload_free(w);
    }
}
END_TEST

int main(void) {
    Suite *su = suite_create("workload");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, seeds_reproduce);
    tcase_add_test(tc, poisson_rate);
    tcase_add_test(tc, offline_all_at_zero);
    tcase_add_test(tc, length_distributions);
    tcase_add_test(tc, prompts_inside_corpus);
    tcase_add_test(tc, bad_specs_and_options);
    tcase_add_test(tc, traces_replayed);
    tcase_add_test(tc, allocation_failures_leak_nothing);
    suite_add_tcase(su, tc);
    return qi_test_run_suite(su);
}

/* test_sampler.c - the sampling chain against hand-computed cases. */
#include <check.h>
#include <math.h>
#include <stdlib.h>

#include "qinfer/sampler.h"
#include "testutil.h"

static qi_sampler *make(qi_sampler_params p, int V) {
    qi_sampler *s = NULL;
    qi_err e = {0};
    ck_assert_int_eq(qi_sampler_create(&p, V, &s, &e), QI_OK);
    return s;
}

START_TEST(greedy_picks_argmax_lowest_on_tie) {
    qi_sampler_params p = qi_sampler_defaults();
    p.temp = 0;
    qi_sampler *s = make(p, 5);
    float l[5] = {0.1f, 3.0f, -2.0f, 3.0f, 1.0f};
    ck_assert_int_eq(qi_sampler_sample(s, l), 1);
    ck_assert_int_eq(qi_argmax(l, 5), 1);
    qi_sampler_free(s);
}
END_TEST

START_TEST(top_k_one_is_greedy) {
    qi_sampler_params p = qi_sampler_defaults();
    p.top_k = 1;
    p.temp = 1.5f;
    qi_sampler *s = make(p, 4);
    float l[4] = {0.5f, 0.4f, 2.0f, 1.9f};
    for (int i = 0; i < 50; i++) ck_assert_int_eq(qi_sampler_sample(s, l), 2);
    qi_sampler_free(s);
}
END_TEST

START_TEST(same_seed_same_stream) {
    qi_sampler_params p = qi_sampler_defaults();
    p.temp = 1.0f;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0;
    float l[16];
    for (int i = 0; i < 16; i++) l[i] = (float)(i % 5) * 0.3f;
    qi_sampler *a = make(p, 16), *b = make(p, 16);
    p.seed = 43;
    qi_sampler *c = make(p, 16);
    int diff = 0;
    for (int i = 0; i < 200; i++) {
        int x = qi_sampler_sample(a, l), y = qi_sampler_sample(b, l), z = qi_sampler_sample(c, l);
        ck_assert_int_eq(x, y);
        diff += x != z;
    }
    ck_assert_int_gt(diff, 0);
    qi_sampler_free(a);
    qi_sampler_free(b);
    qi_sampler_free(c);
}
END_TEST

START_TEST(frequencies_follow_softmax) {
    qi_sampler_params p = qi_sampler_defaults();
    p.temp = 1.0f;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0;
    float l[3] = {0.0f, logf(2.0f), logf(5.0f)}; /* probabilities 1/8, 2/8, 5/8 */
    qi_sampler *s = make(p, 3);
    int cnt[3] = {0};
    const int N = 40000;
    for (int i = 0; i < N; i++) cnt[qi_sampler_sample(s, l)]++;
    const double want[3] = {1 / 8.0, 2 / 8.0, 5 / 8.0};
    for (int i = 0; i < 3; i++) {
        double sd = sqrt(want[i] * (1 - want[i]) / N);
        ck_assert_msg(fabs(cnt[i] / (double)N - want[i]) < 5 * sd, "token %d: %d of %d", i, cnt[i], N);
    }
    qi_sampler_free(s);
}
END_TEST

START_TEST(temperature_sharpens) {
    qi_sampler_params p = qi_sampler_defaults();
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0;
    p.temp = 0.05f;
    float l[2] = {1.0f, 1.5f}; /* at T=0.05 the second has p = 1/(1+e^-10) */
    qi_sampler *s = make(p, 2);
    int second = 0;
    for (int i = 0; i < 2000; i++) second += qi_sampler_sample(s, l) == 1;
    ck_assert_int_gt(second, 1990);
    qi_sampler_free(s);
}
END_TEST

START_TEST(top_p_and_min_p_cut_the_tail) {
    /* probabilities 0.5, 0.3, 0.15, 0.05 */
    float l[4] = {logf(0.5f), logf(0.3f), logf(0.15f), logf(0.05f)};
    qi_sampler_params p = qi_sampler_defaults();
    p.temp = 1.0f;
    p.top_k = 0;
    p.min_p = 0;
    p.top_p = 0.75f; /* keeps 0.5 + 0.3 */
    qi_sampler *s = make(p, 4);
    for (int i = 0; i < 2000; i++) ck_assert_int_lt(qi_sampler_sample(s, l), 2);
    qi_sampler_free(s);
    p.top_p = 1.0f;
    p.min_p = 0.4f; /* threshold 0.2: keeps 0.5 and 0.3 */
    s = make(p, 4);
    int seen1 = 0;
    for (int i = 0; i < 2000; i++) {
        int t = qi_sampler_sample(s, l);
        ck_assert_int_lt(t, 2);
        seen1 |= t == 1;
    }
    ck_assert(seen1);
    qi_sampler_free(s);
}
END_TEST

START_TEST(repetition_penalty) {
    qi_sampler_params p = qi_sampler_defaults();
    p.temp = 0;
    p.repeat_penalty = 2.0f;
    p.repeat_last_n = 2;
    qi_sampler *s = make(p, 3);
    float l[3] = {3.0f, 2.0f, -1.0f};
    ck_assert_int_eq(qi_sampler_sample(s, l), 0);
    qi_sampler_accept(s, 0); /* 3.0 -> 1.5, below 2.0 */
    ck_assert_int_eq(qi_sampler_sample(s, l), 1);
    qi_sampler_accept(s, 1);
    qi_sampler_accept(s, 2); /* window of 2: token 0 no longer penalised */
    ck_assert_int_eq(qi_sampler_sample(s, l), 0);
    qi_sampler_free(s);
}
END_TEST

START_TEST(bad_parameters_rejected) {
    qi_sampler *s = NULL;
    qi_err e = {0};
    qi_sampler_params p = qi_sampler_defaults();
    p.top_p = 0;
    ck_assert_int_eq(qi_sampler_create(&p, 10, &s, &e), QI_ERR_INVALID);
    ck_assert_ptr_null(s);
    ck_assert(e.msg[0]);
    p = qi_sampler_defaults();
    p.temp = NAN;
    qi_err_clear(&e);
    ck_assert_int_eq(qi_sampler_create(&p, 10, &s, &e), QI_ERR_INVALID);
    p = qi_sampler_defaults();
    qi_err_clear(&e);
    ck_assert_int_eq(qi_sampler_create(&p, 0, &s, &e), QI_ERR_INVALID);
}
END_TEST

int main(void) {
    Suite *su = suite_create("sampler");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, greedy_picks_argmax_lowest_on_tie);
    tcase_add_test(tc, top_k_one_is_greedy);
    tcase_add_test(tc, same_seed_same_stream);
    tcase_add_test(tc, frequencies_follow_softmax);
    tcase_add_test(tc, temperature_sharpens);
    tcase_add_test(tc, top_p_and_min_p_cut_the_tail);
    tcase_add_test(tc, repetition_penalty);
    tcase_add_test(tc, bad_parameters_rejected);
    suite_add_tcase(su, tc);
    return qi_test_run_suite(su);
}

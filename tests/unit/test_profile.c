/* test_profile.c - the FFN neuron profiler's core (engine/ffn_profile.c).
 *
 * A hand-made activation sequence of 5 neurons, hot sets of k = 2, windows
 * of 2 tokens, threshold 0.5, in two sequences (the second fed in two
 * calls): every neuron's active and hot counts and mass, the consecutive
 * token and window overlaps and the top-k mass share against values worked
 * out by hand below; the sequence break (no pair or window across it);
 * the hot sets on random activations with ties against a full sort; the
 * options' checks; the file's header and rows.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qinfer/ffn_profile.h"
#include "testutil.h"

#define NF 5

/* Sequence A, five tokens; |act| and each token's top 2 (ties to the
 * lower index), active = |act| > 0.5:
 *   t0  1   3   .2  0   2     H {1,4}  active 0,1,4
 *   t1  .1  2.5 0   4   .3    H {1,3}  active 1,3        overlap {1}   1/2
 *   t2  .6  0   5   3.5 0     H {2,3}  active 0,2,3      overlap {3}   1/2
 *   t3  0   1   4   .5  .7    H {1,2}  active 1,2,4      overlap {2}   1/2
 *   t4  0   2   3   0   0     H {1,2}  active 1,2        overlap {1,2} 1
 * windows: t0+t1 = 1.1 5.5 .2 4 2.3 -> {1,3}; t2+t3 = .6 1 9 4 .7 -> {2,3}:
 * overlap 1/2; t4 is a partial window, not counted.
 * Sequence B, three tokens:
 *   u0  0   0   0   1   2     H {3,4}  active 3,4
 *   u1  0   0   0   3   1     H {3,4}  active 3,4        overlap 1
 *   u2  9   0   0   0   0     H {0,1}  active 0          overlap 0
 * windows: u0+u1 -> {3,4}, the sequence's first: no pair.
 * Token overlaps: (.5 + .5 + .5 + 1 + 1 + 0) / 6; window overlaps: .5 / 1.
 * Without the break, (t4, u0) would be a seventh pair and t4 + u0 a window. */
static const float seq_a[5][NF] = {
    {1.0f, -3.0f, 0.2f, 0.0f, 2.0f},
    {0.1f, 2.5f, 0.0f, -4.0f, 0.3f},
    {0.6f, 0.0f, 5.0f, 3.5f, 0.0f},
    {0.0f, 1.0f, 4.0f, 0.5f, -0.7f},
    {0.0f, 2.0f, 3.0f, 0.0f, 0.0f},
};
static const float seq_b[3][NF] = {
    {0.0f, 0.0f, 0.0f, 1.0f, 2.0f},
    {0.0f, 0.0f, 0.0f, -3.0f, 1.0f},
    {9.0f, 0.0f, 0.0f, 0.0f, 0.0f},
};

START_TEST(test_hand) {
    qi_ffnprof_opts o = {.threshold = 0.5f, .top = 0.4, .window = 2};
    qi_ffnprof *p = NULL;
    qi_err err = {0};
    ck_assert_int_eq(qi_ffnprof_create(2, NF, &o, &p, &err), QI_OK);
    ck_assert_int_eq(qi_ffnprof_k(p), 2);
    qi_ffnprof_add(p, 0, &seq_a[0][0], 5);
    qi_ffnprof_add(p, 7, &seq_a[0][0], 5);  /* no such layer: ignored */
    qi_ffnprof_add(p, -1, &seq_a[0][0], 5);
    qi_ffnprof_end_seq(p);
    qi_ffnprof_add(p, 0, &seq_b[0][0], 1);
    qi_ffnprof_add(p, 0, &seq_b[1][0], 2);

    const int64_t want_active[NF] = {3, 4, 3, 4, 4};
    const int64_t want_hot[NF] = {1, 5, 3, 4, 3};
    const double want_mass[NF] = {10.7, 8.5, 12.2, 12.0, 6.0};
    const int64_t *act = qi_ffnprof_active(p, 0), *hot = qi_ffnprof_hot(p, 0);
    const double *mass = qi_ffnprof_mass(p, 0);
    for (int j = 0; j < NF; j++) {
        ck_assert_int_eq(act[j], want_active[j]);
        ck_assert_int_eq(hot[j], want_hot[j]);
        ck_assert_double_eq_tol(mass[j], want_mass[j], 1e-5);
    }
    qi_ffnprof_layer s;
    qi_ffnprof_layer_get(p, 0, &s);
    ck_assert_int_eq(s.tokens, 8);
    ck_assert_int_eq(s.tok_pairs, 6);
    ck_assert_int_eq(s.win_pairs, 1);
    ck_assert_double_eq_tol(s.tok_overlap, 3.5 / 6.0, 1e-12);
    ck_assert_double_eq_tol(s.win_overlap, 0.5, 1e-12);
    ck_assert_double_eq_tol(s.active_frac, 18.0 / 40.0, 1e-12);
    ck_assert_double_eq_tol(s.mass, 49.4, 1e-5);
    ck_assert_double_eq_tol(s.mass_share, 24.2 / 49.4, 1e-6);
    /* the untouched layer */
    qi_ffnprof_layer_get(p, 1, &s);
    ck_assert_int_eq(s.tokens, 0);
    ck_assert_int_eq(s.tok_pairs, 0);
    ck_assert(s.tok_overlap == 0.0 && s.win_overlap == 0.0 && s.mass_share == 0.0);
    ck_assert_ptr_null(qi_ffnprof_mass(p, 2));
    qi_ffnprof_free(p);
}
END_TEST

/* The same tokens as one sequence: the break matters. t4 -> u0 is a pair
 * ({1,2} vs {3,4}: 0), t4 + u0 the third window (0 2 3 1 2 -> {1,2},
 * against {2,3}: 1/2) and u1 + u2 the fourth (9 0 0 3 1 -> {0,3}, against
 * {1,2}: 0). */
START_TEST(test_no_break) {
    qi_ffnprof_opts o = {.threshold = 0.5f, .top = 0.4, .window = 2};
    qi_ffnprof *p = NULL;
    qi_err err = {0};
    ck_assert_int_eq(qi_ffnprof_create(1, NF, &o, &p, &err), QI_OK);
    qi_ffnprof_add(p, 0, &seq_a[0][0], 5);
    qi_ffnprof_add(p, 0, &seq_b[0][0], 3);
    qi_ffnprof_layer s;
    qi_ffnprof_layer_get(p, 0, &s);
    ck_assert_int_eq(s.tok_pairs, 7);
    ck_assert_double_eq_tol(s.tok_overlap, 3.5 / 7.0, 1e-12);
    ck_assert_int_eq(s.win_pairs, 3);
    ck_assert_double_eq_tol(s.win_overlap, (0.5 + 0.5 + 0.0) / 3.0, 1e-12);
    qi_ffnprof_free(p);
}
END_TEST

static int cmp_desc(const void *a, const void *b, const float *v) {
    const int i = *(const int *)a, j = *(const int *)b;
    const float x = fabsf(v[i]), y = fabsf(v[j]);
    if (x != y) return x > y ? -1 : 1;
    return i - j;
}
static const float *g_row;
static int cmp_row(const void *a, const void *b) { return cmp_desc(a, b, g_row); }

/* Random rows with many ties (values on a coarse grid): each token's hot
 * set against a full sort, through the hot counts and the overlaps. */
START_TEST(test_random_vs_sort) {
    enum { N = 97, T = 300 };
    const double tops[] = {0.2, 0.01, 0.5, 1.0};
    for (size_t c = 0; c < sizeof tops / sizeof tops[0]; c++) {
        qi_ffnprof_opts o = {.threshold = 0.0f, .top = tops[c], .window = 1000};
        qi_ffnprof *p = NULL;
        qi_err err = {0};
        ck_assert_int_eq(qi_ffnprof_create(1, N, &o, &p, &err), QI_OK);
        const int k = qi_ffnprof_k(p);
        ck_assert_int_eq(k, (int)fmax(1.0, round(tops[c] * N)));
        static float rows[T][N];
        uint64_t rng = 7 + c;
        for (int t = 0; t < T; t++)
            for (int j = 0; j < N; j++) rows[t][j] = roundf(qi_test_randf(&rng) * 8.0f) / 4.0f;
        qi_ffnprof_add(p, 0, &rows[0][0], T);
        int64_t hot[N] = {0};
        unsigned char prev[N] = {0}, cur[N];
        double ov = 0.0;
        int idx[N];
        for (int t = 0; t < T; t++) {
            for (int j = 0; j < N; j++) idx[j] = j;
            g_row = rows[t];
            qsort(idx, N, sizeof idx[0], cmp_row);
            memset(cur, 0, sizeof cur);
            int common = 0;
            for (int i = 0; i < k; i++) {
                cur[idx[i]] = 1;
                hot[idx[i]]++;
                common += prev[idx[i]];
            }
            if (t > 0) ov += (double)common / k;
            memcpy(prev, cur, sizeof prev);
        }
        const int64_t *got = qi_ffnprof_hot(p, 0);
        for (int j = 0; j < N; j++) ck_assert_int_eq(got[j], hot[j]);
        qi_ffnprof_layer s;
        qi_ffnprof_layer_get(p, 0, &s);
        ck_assert_double_eq_tol(s.tok_overlap, ov / (T - 1), 1e-12);
        if (k == N) ck_assert_double_eq_tol(s.mass_share, 1.0, 1e-12);
        qi_ffnprof_free(p);
    }
}
END_TEST

START_TEST(test_options) {
    qi_ffnprof *p = NULL;
    qi_err err = {0};
    qi_ffnprof_opts o = {.threshold = 0.0f, .top = 0.2, .window = 64};
    const double bad_top[] = {0.0, -0.1, 1.5, NAN};
    for (size_t i = 0; i < sizeof bad_top / sizeof bad_top[0]; i++) {
        o.top = bad_top[i];
        ck_assert_int_eq(qi_ffnprof_create(1, 8, &o, &p, &err), QI_ERR_INVALID);
        ck_assert_ptr_null(p);
        ck_assert(strstr(err.msg, "outside (0, 1]") != NULL);
    }
    o.top = 0.2;
    o.threshold = -1.0f;
    ck_assert_int_eq(qi_ffnprof_create(1, 8, &o, &p, &err), QI_ERR_INVALID);
    o.threshold = NAN;
    ck_assert_int_eq(qi_ffnprof_create(1, 8, &o, &p, &err), QI_ERR_INVALID);
    o.threshold = 0.0f;
    o.window = 0;
    ck_assert_int_eq(qi_ffnprof_create(1, 8, &o, &p, &err), QI_ERR_INVALID);
    o.window = 64;
    ck_assert_int_eq(qi_ffnprof_create(0, 8, &o, &p, &err), QI_ERR_INVALID);
    ck_assert_int_eq(qi_ffnprof_create(1, 0, &o, &p, &err), QI_ERR_INVALID);
    /* k: rounded, at least 1 */
    ck_assert_int_eq(qi_ffnprof_create(1, 10, &o, &p, &err), QI_OK);
    ck_assert_int_eq(qi_ffnprof_k(p), 2);
    qi_ffnprof_free(p);
    o.top = 0.001;
    ck_assert_int_eq(qi_ffnprof_create(1, 10, &o, &p, &err), QI_OK);
    ck_assert_int_eq(qi_ffnprof_k(p), 1);
    qi_ffnprof_free(p);
    qi_ffnprof_free(NULL);
}
END_TEST

START_TEST(test_write) {
    qi_ffnprof_opts o = {.threshold = 0.5f, .top = 0.4, .window = 2};
    qi_ffnprof *p = NULL;
    qi_err err = {0};
    ck_assert_int_eq(qi_ffnprof_create(1, NF, &o, &p, &err), QI_OK);
    qi_ffnprof_add(p, 0, &seq_a[0][0], 5);
    FILE *f = tmpfile();
    ck_assert_ptr_nonnull(f);
    ck_assert_int_eq(qi_ffnprof_write(p, f, "m.gguf", "c.txt", 512, &err), QI_OK);
    rewind(f);
    char buf[4096];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    fclose(f);
    const char *head = "# qinfer ffn-profile 1\n# model m.gguf\n# corpus c.txt\n";
    ck_assert(strncmp(buf, head, strlen(head)) == 0);
    ck_assert(strstr(buf, "# n_layer 1 n_ff 5 tokens 5 ctx 512 threshold 0.5 top 0.4 k 2 window 2\n") != NULL);
    ck_assert(strstr(buf, "# layer 0 tokens 5 tok_overlap 0.625000 win_overlap 0.500000 ") != NULL);
    ck_assert(strstr(buf, "# columns: layer neuron active hot mass\n0 0 2 0 1.70000003\n") != NULL);
    ck_assert(strstr(buf, "\n0 4 2 1 3\n") != NULL);
    qi_ffnprof_free(p);
}
END_TEST

static Suite *profile_suite(void) {
    Suite *s = suite_create("profile");
    TCase *tc = tcase_create("profile");
    tcase_add_test(tc, test_hand);
    tcase_add_test(tc, test_no_break);
    tcase_add_test(tc, test_random_vs_sort);
    tcase_add_test(tc, test_options);
    tcase_add_test(tc, test_write);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return qi_test_run_suite(profile_suite()); }

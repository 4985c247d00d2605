/* test_neuron.c - Check suite for the FFN neuron slot (policies/neuron/):
 * the registry and its parameters; the groups the wrapper forms (ranks,
 * masses, bytes, the last group's size) and the inputs it refuses; the
 * wrapper refusing a policy that breaks the budget (a planted policy);
 * none; static's integer program against exhaustive search on random
 * small cases (2-3 layers, 2-6 groups, random masses and sizes, with and
 * without the per-layer threshold), the comparison shown able to catch a
 * worse choice; qinfer's greedy on hand-made cases; the calibration on
 * synthetic timers; recall and precision on hand-made sets; bytes per
 * neuron of a model of shapes; and the profile reader on a file the
 * profiler wrote, on hand-broken files (each error "NAME:LINE: why") and on
 * garbage and mutations of a good file (no crash; an error or a profile).
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "neuron/neuron_policy.h"
#include "qinfer/ffn_profile.h"
#include "qinfer/model.h"
#include "testutil.h"

/* ---- registry ------------------------------------------------------------------------- */

START_TEST(test_registry) {
    qi_err e = {0};
    qi_neuron_policy *p = NULL;
    ck_assert_ptr_nonnull(qi_neuron_policy_find("none"));
    ck_assert_ptr_nonnull(qi_neuron_policy_find("qinfer"));
#ifdef QI_HAVE_GLPK
    ck_assert_ptr_nonnull(qi_neuron_policy_find("static"));
#else
    ck_assert_int_eq(qi_neuron_policy_create("static", NULL, &p, &e), QI_ERR_UNSUPPORTED);
    ck_assert_msg(strstr(e.msg, "solves with GLPK, and this build has none") != NULL, "%s", e.msg);
    qi_err_clear(&e);
#endif
    ck_assert_ptr_null(qi_neuron_policy_find("bogus"));
    ck_assert_int_eq(qi_neuron_policy_create("bogus", NULL, &p, &e), QI_ERR_INVALID);
    ck_assert_ptr_null(p);
    ck_assert_msg(strstr(e.msg, "unknown neuron policy 'bogus' (known: none, ") != NULL, "%s", e.msg);
    qi_err_clear(&e);
    ck_assert_int_eq(qi_neuron_policy_from_spec("qinfer", &p, &e), QI_ERR_INVALID);
    ck_assert_msg(strstr(e.msg, "qinfer: needs ratio=R") != NULL, "%s", e.msg);
    qi_err_clear(&e);
    ck_assert_int_eq(qi_neuron_policy_from_spec("qinfer:ratio=-1", &p, &e), QI_ERR_INVALID);
    ck_assert_msg(strstr(e.msg, "ratio") != NULL, "%s", e.msg);
    qi_err_clear(&e);
    ck_assert_int_eq(qi_neuron_policy_from_spec("qinfer:ratio=4,bogus=1", &p, &e), QI_ERR_INVALID);
    ck_assert_msg(strstr(e.msg, "unknown parameter 'bogus'") != NULL, "%s", e.msg);
    qi_err_clear(&e);
    ck_assert_int_eq(qi_neuron_policy_from_spec("none:x=1", &p, &e), QI_ERR_INVALID);
    ck_assert_msg(strstr(e.msg, "none takes no parameters") != NULL, "%s", e.msg);
    qi_err_clear(&e);
    ck_assert_int_eq(qi_neuron_policy_from_spec(":ratio=1", &p, &e), QI_ERR_INVALID);
    qi_err_clear(&e);
    ck_assert_int_eq(qi_neuron_policy_from_spec("qinfer:ratio=4", &p, &e), QI_OK);
    ck_assert_str_eq(qi_neuron_policy_name(p), "qinfer");
    ck_assert_double_eq(qi_neuron_qinfer_ratio(p), 4.0);
    qi_neuron_live_opts lo, def;
    qi_neuron_live_opts_default(&def);
    ck_assert_int_eq(qi_neuron_qinfer_live_opts(p, &lo, &e), QI_OK);
    ck_assert_double_eq(lo.ratio, 4.0);
    ck_assert_double_eq(lo.link_bw, def.link_bw);
    ck_assert_int_eq(lo.max_swaps, def.max_swaps);
    qi_neuron_policy_free(p);
    ck_assert_int_eq(qi_neuron_policy_from_spec("qinfer:ratio=2,horizon=8,decay=0.5,max_swaps=3,tol=0", &p, &e), QI_OK);
    ck_assert_int_eq(qi_neuron_qinfer_live_opts(p, &lo, &e), QI_OK);
    ck_assert_double_eq(lo.ratio, 2.0);
    ck_assert_double_eq(lo.horizon, 8.0);
    ck_assert_double_eq(lo.decay, 0.5);
    ck_assert_double_eq(lo.tol, 0.0);
    ck_assert_int_eq(lo.max_swaps, 3);
    qi_neuron_policy_free(p);
    ck_assert_int_eq(qi_neuron_policy_from_spec("qinfer:ratio=2,decay=0", &p, &e), QI_ERR_INVALID);
    ck_assert_msg(strstr(e.msg, "decay") != NULL, "%s", e.msg);
    qi_err_clear(&e);
    ck_assert_int_eq(qi_neuron_policy_from_spec("none", &p, &e), QI_OK);
    ck_assert_int_eq(qi_neuron_qinfer_live_opts(p, &lo, &e), QI_ERR_INVALID);
    ck_assert_msg(strstr(e.msg, "neuron policy 'none' has no swap worker") != NULL, "%s", e.msg);
    qi_err_clear(&e);
    qi_neuron_policy_free(p);
#ifdef QI_HAVE_GLPK
    ck_assert_int_eq(qi_neuron_policy_from_spec("static:min_groups=-1", &p, &e), QI_ERR_INVALID);
    qi_err_clear(&e);
    ck_assert_int_eq(qi_neuron_policy_from_spec("static:gap=2", &p, &e), QI_ERR_INVALID);
    qi_err_clear(&e);
    ck_assert_int_eq(qi_neuron_policy_from_spec("static:min_groups=2,time_limit=5", &p, &e), QI_OK);
    ck_assert(isnan(qi_neuron_qinfer_ratio(p)));
    qi_neuron_policy_free(p);
#endif
    qi_neuron_policy_free(NULL);
}
END_TEST

/* ---- groups and the wrapper ----------------------------------------------------------- */

/* One layer of 5 neurons, groups of 2: ranks 3 (5.0), 1 (4.0), 0 (2.0),
 * 4 (2.0; tie: after 0), 2 (1.0); groups {3,1} 9, {0,4} 4, {2} 1. */
static const double act5[5] = {2.0, 4.0, 1.0, 5.0, 2.0};
static const uint64_t nb10[1] = {10};

START_TEST(test_groups) {
    qi_neuron_input in = {.n_layer = 1, .n_ff = 5, .activity = act5, .neuron_bytes = nb10, .budget = 25, .group = 2};
    qi_neuron_groups g;
    qi_err e = {0};
    ck_assert_int_eq(qi_neuron_groups_init(&g, &in, &e), QI_OK);
    ck_assert_int_eq(g.n_groups, 3);
    const int32_t want_rank[5] = {3, 1, 0, 4, 2};
    for (int k = 0; k < 5; k++) ck_assert_int_eq(g.rank[k], want_rank[k]);
    ck_assert_double_eq(g.mass[0], 9.0);
    ck_assert_double_eq(g.mass[1], 4.0);
    ck_assert_double_eq(g.mass[2], 1.0);
    ck_assert_uint_eq(g.bytes[0], 20);
    ck_assert_uint_eq(g.bytes[2], 10);
    ck_assert_double_eq(g.layer_mass[0], 14.0);
    const uint8_t x[3] = {1, 0, 1};
    qi_neuron_plan p;
    ck_assert_int_eq(qi_neuron_plan_from_groups(&g, x, &p, &e), QI_OK);
    const uint8_t want_fast[5] = {0, 1, 1, 1, 0};
    for (int j = 0; j < 5; j++) ck_assert_int_eq(p.fast[j], want_fast[j]);
    ck_assert_int_eq(p.n_fast[0], 3);
    ck_assert_int_eq(p.groups_fast[0], 2);
    ck_assert_double_eq(p.mass_fast[0], 10.0);
    ck_assert_uint_eq(p.bytes[0], 30);
    ck_assert_uint_eq(p.total_bytes, 30);
    qi_neuron_plan_fini(&p);
    qi_neuron_plan_fini(&p); /* a zeroed plan: no-op */
    qi_neuron_groups_fini(&g);

    /* group 0 means the default, one group for 5 neurons */
    in.group = 0;
    ck_assert_int_eq(qi_neuron_groups_init(&g, &in, &e), QI_OK);
    ck_assert_int_eq(g.group, QI_NEURON_GROUP_DEFAULT);
    ck_assert_int_eq(g.n_groups, 1);
    qi_neuron_groups_fini(&g);
}
END_TEST

static void expect_bad_input(qi_neuron_input in, const char *want) {
    qi_neuron_groups g;
    qi_err e = {0};
    ck_assert_int_eq(qi_neuron_groups_init(&g, &in, &e), QI_ERR_INVALID);
    ck_assert_msg(strstr(e.msg, want) != NULL, "want '%s' in '%s'", want, e.msg);
    ck_assert_ptr_null(g.rank);
}

START_TEST(test_bad_input) {
    const qi_neuron_input ok = {.n_layer = 1, .n_ff = 5, .activity = act5, .neuron_bytes = nb10, .budget = 25, .group = 2};
    qi_neuron_input in = ok;
    in.budget = -1;
    expect_bad_input(in, "a budget of -1 bytes (0 or more)");
    in = ok;
    in.n_layer = 0;
    expect_bad_input(in, "0 layers");
    in = ok;
    in.n_ff = 0;
    expect_bad_input(in, "0 neurons per layer");
    in = ok;
    in.group = -3;
    expect_bad_input(in, "group of -3 neurons");
    const double nan5[5] = {1, 2, NAN, 0, 0}, neg5[5] = {1, 2, 3, -1, 0};
    in = ok;
    in.activity = nan5;
    expect_bad_input(in, "layer 0 neuron 2: activity nan");
    in = ok;
    in.activity = neg5;
    expect_bad_input(in, "layer 0 neuron 3: activity -1");
    const uint64_t zero[1] = {0};
    in = ok;
    in.neuron_bytes = zero;
    expect_bad_input(in, "layer 0: 0 bytes per neuron");
    in = ok;
    in.activity = NULL;
    expect_bad_input(in, "no activity");
    const uint64_t huge[1] = {UINT64_C(1) << 61};
    in = ok;
    in.neuron_bytes = huge;
    expect_bad_input(in, "layer 0: 2305843009213693952 bytes per neuron takes the FFN past 2^62 bytes");

    /* the wrapper too, before any policy runs */
    qi_neuron_policy *p = NULL;
    qi_err e = {0};
    ck_assert_int_eq(qi_neuron_policy_create("none", NULL, &p, &e), QI_OK);
    qi_neuron_plan plan;
    in = ok;
    in.budget = -5;
    ck_assert_int_eq(qi_neuron_policy_place(p, &in, &plan, &e), QI_ERR_INVALID);
    ck_assert_ptr_null(plan.fast);
    qi_neuron_policy_free(p);
}
END_TEST

/* A planted policy that takes every group whatever the budget. */
static qi_status greedy_all_place(qi_neuron_policy *p, const qi_neuron_groups *g, uint8_t *x,
                                  qi_neuron_place_info *info, qi_err *err) {
    (void)p, (void)info, (void)err;
    memset(x, 1, (size_t)g->n_layer * g->n_groups);
    return QI_OK;
}
static qi_status two_place(qi_neuron_policy *p, const qi_neuron_groups *g, uint8_t *x, qi_neuron_place_info *info,
                           qi_err *err) {
    (void)p, (void)g, (void)info, (void)err;
    x[0] = 2;
    return QI_OK;
}
static void nop_free(qi_neuron_policy *p) { (void)p; }

START_TEST(test_wrapper_refuses) {
    const qi_neuron_policy_i bad = {.version = QI_NEURON_POLICY_VERSION, .name = "planted", .place = greedy_all_place,
                                    .free = nop_free};
    qi_neuron_policy obj = {&bad};
    qi_neuron_input in = {.n_layer = 1, .n_ff = 5, .activity = act5, .neuron_bytes = nb10, .budget = 25, .group = 2};
    qi_neuron_plan plan;
    qi_err e = {0};
    ck_assert_int_eq(qi_neuron_policy_place(&obj, &in, &plan, &e), QI_ERR_BACKEND);
    ck_assert_msg(strstr(e.msg, "neuron policy 'planted' broke its contract: its groups take 50 bytes of a 25-byte "
                                "budget") != NULL,
                  "%s", e.msg);
    ck_assert_ptr_null(plan.fast);
    in.budget = 50; /* the same choice within the budget is taken */
    qi_err_clear(&e);
    ck_assert_int_eq(qi_neuron_policy_place(&obj, &in, &plan, &e), QI_OK);
    ck_assert_int_eq(plan.n_fast[0], 5);
    qi_neuron_plan_fini(&plan);
    const qi_neuron_policy_i two = {.version = QI_NEURON_POLICY_VERSION, .name = "two", .place = two_place,
                                    .free = nop_free};
    obj.iface = &two;
    qi_err_clear(&e);
    ck_assert_int_eq(qi_neuron_policy_place(&obj, &in, &plan, &e), QI_ERR_BACKEND);
    ck_assert_msg(strstr(e.msg, "group 0 of layer 0 set to 2") != NULL, "%s", e.msg);
}
END_TEST

START_TEST(test_none) {
    qi_neuron_policy *p = NULL;
    qi_err e = {0};
    ck_assert_int_eq(qi_neuron_policy_create("none", NULL, &p, &e), QI_OK);
    qi_neuron_input in = {.n_layer = 1, .n_ff = 5, .activity = act5, .neuron_bytes = nb10, .budget = 1000};
    qi_neuron_plan plan;
    ck_assert_int_eq(qi_neuron_policy_place(p, &in, &plan, &e), QI_OK);
    ck_assert_int_eq(plan.n_fast[0], 0);
    ck_assert_uint_eq(plan.total_bytes, 0);
    ck_assert_double_eq(plan.total_mass, 14.0);
    ck_assert_double_eq(plan.total_mass_fast, 0.0);
    qi_neuron_plan_fini(&plan);
    qi_neuron_policy_free(p);
}
END_TEST

/* ---- static against brute force -------------------------------------------------------- */

#ifdef QI_HAVE_GLPK
/* The best objective over every choice of the n = L * NG groups that fits
 * (and meets the per-layer threshold m), by enumeration; sums built
 * incrementally from the mask without its lowest bit. */
static double brute_best(const qi_neuron_groups *g, int m) {
    const int n = g->n_layer * g->n_groups;
    const size_t N = (size_t)1 << n;
    double *mass = malloc(sizeof *mass * N);
    uint64_t *bytes = malloc(sizeof *bytes * N);
    ck_assert(mass && bytes);
    mass[0] = 0;
    bytes[0] = 0;
    double best = 0.0;
    if (m > g->n_groups) m = g->n_groups;
    for (size_t s = 1; s < N; s++) {
        const int low = __builtin_ctzll(s);
        mass[s] = mass[s & (s - 1)] + g->mass[low];
        bytes[s] = bytes[s & (s - 1)] + g->bytes[low];
        if (bytes[s] > (uint64_t)g->budget || mass[s] <= best) continue;
        bool ok = true;
        for (int l = 0; l < g->n_layer && ok; l++) {
            const int c = __builtin_popcountll((s >> (l * g->n_groups)) & ((1ull << g->n_groups) - 1));
            ok = c == 0 || c >= m;
        }
        if (ok) best = mass[s];
    }
    free(mass);
    free(bytes);
    return best;
}

/* Objective of choice x, or -1 when it breaks the budget or the threshold. */
static double objective(const qi_neuron_groups *g, const uint8_t *x, int m) {
    double v = 0;
    uint64_t b = 0;
    if (m > g->n_groups) m = g->n_groups;
    for (int l = 0; l < g->n_layer; l++) {
        int c = 0;
        for (int k = 0; k < g->n_groups; k++) {
            const int i = l * g->n_groups + k;
            ck_assert_int_le(x[i], 1);
            if (!x[i]) continue;
            v += g->mass[i];
            b += g->bytes[i];
            c++;
        }
        if (c && c < m) return -1;
    }
    return b <= (uint64_t)g->budget ? v : -1;
}

START_TEST(test_static_vs_brute) {
    uint64_t rng = 17;
    int cases = 0, nonzero = 0, caught = 0;
    for (int t = 0; t < 240; t++) {
        const int L = 2 + (int)(qi_test_rand(&rng) % 2), G = 1 + (int)(qi_test_rand(&rng) % 4);
        const int NG = 2 + (int)(qi_test_rand(&rng) % 5); /* 2..6 groups */
        const int F = (NG - 1) * G + 1 + (int)(qi_test_rand(&rng) % G); /* the last group 1..G neurons */
        if (L * NG > 18) continue;
        double act[3 * 6 * 4];
        uint64_t nb[3];
        uint64_t total = 0;
        for (int l = 0; l < L; l++) {
            nb[l] = 1 + qi_test_rand(&rng) % 1000;
            total += nb[l] * (uint64_t)F;
            for (int j = 0; j < F; j++) {
                const uint64_t r = qi_test_rand(&rng);
                act[l * F + j] = r % 7 == 0 ? 0.0 : (double)(r % 100000) / 1000.0; /* some zeros, some ties */
            }
        }
        const int m = t % 3 == 0 ? (int)(qi_test_rand(&rng) % 4) : 0;
        qi_neuron_input in = {.n_layer = L, .n_ff = F, .activity = act, .neuron_bytes = nb,
                              .budget = (int64_t)(qi_test_rand(&rng) % (total + 1)), .group = G};
        if (t % 17 == 0) in.budget = 0;
        if (t % 19 == 0) in.budget = (int64_t)total;
        qi_neuron_groups g;
        qi_err e = {0};
        ck_assert_int_eq(qi_neuron_groups_init(&g, &in, &e), QI_OK);
        ck_assert_int_eq(g.n_groups, NG);
        uint8_t x[18];
        qi_neuron_place_info info;
        ck_assert_msg(qi_neuron_mip_solve(&g, m, 10.0, 0.0, x, &info, &e) == QI_OK, "%s", e.msg);
        ck_assert(info.optimal);
        const double want = brute_best(&g, m), got = objective(&g, x, m);
        ck_assert_msg(got >= 0, "case %d: the MIP's choice is infeasible", t);
        ck_assert_msg(fabs(got - want) <= 1e-9 * (1.0 + want), "case %d (L %d, %d groups, m %d, budget %lld): MIP %.12g, "
                      "brute force %.12g", t, L, NG, m, (long long)in.budget, got, want);
        ck_assert_msg(info.bound >= want - 1e-9 * (1.0 + want), "case %d: bound %.12g below the optimum %.12g", t,
                      info.bound, want);
        if (in.budget == 0) ck_assert_double_eq(got, 0.0);
        /* the comparison catches a worse choice: drop the heaviest chosen group */
        int drop = -1;
        for (int i = 0; i < L * NG; i++)
            if (x[i] && g.mass[i] > 0 && (drop < 0 || g.mass[i] > g.mass[drop])) drop = i;
        if (drop >= 0) {
            nonzero++;
            x[drop] = 0;
            const double worse = objective(&g, x, m);
            if (worse < 0 || fabs(worse - want) > 1e-9 * (1.0 + want)) caught++;
        }
        qi_neuron_groups_fini(&g);
        cases++;
    }
    ck_assert_int_ge(cases, 150);
    ck_assert_int_ge(nonzero, 100);
    ck_assert_int_eq(caught, nonzero);
}
END_TEST

/* The policy through the wrapper: budget 0 keeps nothing, an ample budget
 * every group with mass, and groups of no mass stay off. */
START_TEST(test_static_policy) {
    qi_neuron_policy *p = NULL;
    qi_err e = {0};
    ck_assert_int_eq(qi_neuron_policy_create("static", NULL, &p, &e), QI_OK);
    const double act[6] = {3, 0, 1, 0, 2, 0};
    const uint64_t nb[1] = {4};
    qi_neuron_input in = {.n_layer = 1, .n_ff = 6, .activity = act, .neuron_bytes = nb, .budget = 0, .group = 1};
    qi_neuron_plan plan;
    ck_assert_int_eq(qi_neuron_policy_place(p, &in, &plan, &e), QI_OK);
    ck_assert_int_eq(plan.n_fast[0], 0);
    ck_assert(plan.optimal);
    qi_neuron_plan_fini(&plan);
    in.budget = 1000;
    ck_assert_int_eq(qi_neuron_policy_place(p, &in, &plan, &e), QI_OK);
    ck_assert_int_eq(plan.n_fast[0], 3);
    ck_assert_uint_eq(plan.total_bytes, 12);
    ck_assert_double_eq(plan.total_mass_fast, 6.0);
    ck_assert(plan.fast[0] && plan.fast[2] && plan.fast[4] && !plan.fast[1]);
    qi_neuron_plan_fini(&plan);
    in.budget = 9; /* two neurons: 3 and 2 */
    ck_assert_int_eq(qi_neuron_policy_place(p, &in, &plan, &e), QI_OK);
    ck_assert(plan.fast[0] && plan.fast[4] && !plan.fast[2]);
    ck_assert_double_eq(plan.total_mass_fast, 5.0);
    qi_neuron_plan_fini(&plan);
    qi_neuron_policy_free(p);
}
END_TEST

/* Model-sized programs: SmolLM2-135M's shape (30 layers x 6 groups)
 * proves its optimum at once; LLaMA-2-70B's (80 x 112 groups, three
 * sizes of neuron across the layers, as a mixed-type quantisation gives)
 * is a knapsack whose last bytes branch and bound cannot close quickly:
 * under a 2 s limit it returns a choice within 0.1% of the relaxation's
 * bound. */
START_TEST(test_static_large) {
    const int shapes[2][2] = {{30, 1536}, {80, 28672}};
    uint64_t rng = 5;
    for (int s = 0; s < 2; s++) {
        const int L = shapes[s][0], F = shapes[s][1];
        double *act = malloc(sizeof *act * (size_t)L * F);
        uint64_t *nb = malloc(sizeof *nb * (size_t)L);
        ck_assert(act && nb);
        uint64_t total = 0;
        for (int l = 0; l < L; l++) {
            nb[l] = 3 * 8192 / 2 + (l % 3) * 64;
            total += nb[l] * (uint64_t)F;
            for (int j = 0; j < F; j++) act[(size_t)l * F + j] = pow((qi_test_randf(&rng) + 1.0) / 2.0, 4.0);
        }
        qi_neuron_input in = {.n_layer = L, .n_ff = F, .activity = act, .neuron_bytes = nb,
                              .budget = (int64_t)(total * 37 / 100)};
        qi_neuron_groups g;
        qi_err e = {0};
        ck_assert_int_eq(qi_neuron_groups_init(&g, &in, &e), QI_OK);
        uint8_t *x = malloc((size_t)L * g.n_groups);
        qi_neuron_place_info info;
        const double limit = 2.0, t0 = qi_test_now();
        ck_assert_msg(qi_neuron_mip_solve(&g, 0, limit, 0.0, x, &info, &e) == QI_OK, "%s", e.msg);
        const double dt = qi_test_now() - t0;
        uint64_t used = 0;
        double got = 0;
        for (int i = 0; i < L * g.n_groups; i++)
            if (x[i]) used += g.bytes[i], got += g.mass[i];
        ck_assert_uint_le(used, (uint64_t)in.budget);
        ck_assert_msg(dt < limit + 3.0, "%d x %d groups took %.2f s", L, g.n_groups, dt);
        ck_assert_msg(got <= info.bound * (1 + 1e-9), "mass %.9g above the bound %.9g", got, info.bound);
        if (s == 0) ck_assert_msg(info.optimal, "%d x %d: not proven optimal in %.2f s", L, F, dt);
        else ck_assert_msg(got >= info.bound * (1 - 1e-3), "%d x %d: mass %.9g, bound %.9g", L, F, got, info.bound);
        printf("static: %d x %d groups in %.2f s, %s, mass %.6g of a bound %.6g\n", L, g.n_groups, dt,
               info.optimal ? "optimal" : "stopped at the time limit", got, info.bound);
        free(x);
        free(act);
        free(nb);
        qi_neuron_groups_fini(&g);
    }
}
END_TEST
#endif

/* ---- qinfer's greedy and calibration -------------------------------------------------- */

START_TEST(test_greedy) {
    /* two layers of four one-neuron groups:
     *   layer 0: 8 4 2 2 (16)   layer 1: 6 1 1 0 (8)
     * ratio 1: target share 1/2. Order 8, 6, 4, 2, 2, 1, 1, 0:
     *   8 -> layer 0 at 8/16 = 0.5 (not below the target: no more there);
     *   6 -> layer 1 at 6/8 (no more there); the rest are skipped. */
    const double act[8] = {8, 4, 2, 2, 6, 1, 1, 0};
    const uint64_t nb[2] = {10, 10};
    qi_neuron_input in = {.n_layer = 2, .n_ff = 4, .activity = act, .neuron_bytes = nb, .budget = 1000, .group = 1};
    qi_neuron_groups g;
    qi_err e = {0};
    ck_assert_int_eq(qi_neuron_groups_init(&g, &in, &e), QI_OK);
    uint8_t x[8];
    qi_neuron_greedy(&g, 1.0, x);
    const uint8_t w1[8] = {1, 0, 0, 0, 1, 0, 0, 0};
    ck_assert_mem_eq(x, w1, 8);
    /* ratio 3: target 3/4. Layer 0: 8 (0.5), 4 (0.75: stop); layer 1: 6 (0.75: stop) */
    qi_neuron_greedy(&g, 3.0, x);
    const uint8_t w3[8] = {1, 1, 0, 0, 1, 0, 0, 0};
    ck_assert_mem_eq(x, w3, 8);
    /* ratio 100: all but the massless neuron, until the budget: 30 bytes
     * take 8, 6, 4 */
    qi_neuron_greedy(&g, 100.0, x);
    const uint8_t w100[8] = {1, 1, 1, 1, 1, 1, 1, 0};
    ck_assert_mem_eq(x, w100, 8);
    qi_neuron_groups_fini(&g);
    in.budget = 30;
    ck_assert_int_eq(qi_neuron_groups_init(&g, &in, &e), QI_OK);
    qi_neuron_greedy(&g, 100.0, x);
    const uint8_t wb[8] = {1, 1, 0, 0, 1, 0, 0, 0};
    ck_assert_mem_eq(x, wb, 8);
    qi_neuron_groups_fini(&g);

    /* a group that does not fit is passed over for a smaller one: groups
     * of 3 neurons at 5 bytes each ({5, 4, 3}: 15 bytes, {1}: 5) */
    const double a2[4] = {5, 4, 3, 1};
    const uint64_t nb1[1] = {5};
    qi_neuron_input in2 = {.n_layer = 1, .n_ff = 4, .activity = a2, .neuron_bytes = nb1, .budget = 15, .group = 3};
    ck_assert_int_eq(qi_neuron_groups_init(&g, &in2, &e), QI_OK);
    qi_neuron_greedy(&g, 100.0, x);
    ck_assert_int_eq(x[0], 1); /* 3 neurons x 5 bytes: exactly the budget */
    ck_assert_int_eq(x[1], 0);
    qi_neuron_groups_fini(&g);
    in2.budget = 14;
    ck_assert_int_eq(qi_neuron_groups_init(&g, &in2, &e), QI_OK);
    qi_neuron_greedy(&g, 100.0, x);
    ck_assert_int_eq(x[0], 0);
    ck_assert_int_eq(x[1], 1);
    qi_neuron_groups_fini(&g);

    /* through the policy */
    qi_neuron_policy *p = NULL;
    ck_assert_int_eq(qi_neuron_policy_from_spec("qinfer:ratio=3", &p, &e), QI_OK);
    in.budget = 1000;
    qi_neuron_plan plan;
    ck_assert_int_eq(qi_neuron_policy_place(p, &in, &plan, &e), QI_OK);
    ck_assert_int_eq(plan.n_fast[0], 2);
    ck_assert_int_eq(plan.n_fast[1], 1);
    ck_assert_double_eq(plan.mass_fast[0], 12.0);
    ck_assert(!plan.optimal);
    qi_neuron_plan_fini(&plan);
    qi_neuron_policy_free(p);
}
END_TEST

typedef struct {
    double fixed[2], per[2];
    int calls;
    double bad;
} fake_timer;

static double fake_time(void *ctx, int fast, int n, int batch) {
    fake_timer *t = ctx;
    t->calls++;
    if (t->bad != 0.0 && fast) return t->bad;
    /* a little alternating noise that the median removes */
    const double noise = (t->calls % 3 == 0) ? 1.5 : 1.0;
    return (t->fixed[fast] + t->per[fast] * n * batch) * noise;
}

START_TEST(test_calibrate) {
    fake_timer t = {.fixed = {1e-6, 2e-5}, .per = {1e-7, 1e-8}};
    double r = 0;
    qi_err e = {0};
    ck_assert_int_eq(qi_neuron_calibrate(fake_time, &t, 1536, 4, 5, &r, &e), QI_OK);
    ck_assert_double_eq_tol(r, 10.0, 1e-9);
    ck_assert_int_eq(t.calls, 2 * 3 * 5);
    t.bad = NAN;
    ck_assert_int_eq(qi_neuron_calibrate(fake_time, &t, 1536, 4, 5, &r, &e), QI_ERR_BACKEND);
    ck_assert(isnan(r));
    ck_assert_msg(strstr(e.msg, "the fast device's timer gave nan s") != NULL, "%s", e.msg);
    qi_err_clear(&e);
    ck_assert_int_eq(qi_neuron_calibrate(fake_time, &t, 4, 4, 5, &r, &e), QI_ERR_INVALID);
    qi_err_clear(&e);
    ck_assert_int_eq(qi_neuron_calibrate(NULL, &t, 1536, 4, 5, &r, &e), QI_ERR_INVALID);
    qi_err_clear(&e);
    fake_timer z = {0};
    ck_assert_int_eq(qi_neuron_calibrate(fake_time, &z, 1536, 1, 1, &r, &e), QI_ERR_BACKEND);
    ck_assert_msg(strstr(e.msg, "do not grow") != NULL, "%s", e.msg);
}
END_TEST

/* ---- recall and precision, bytes per neuron ------------------------------------------- */

START_TEST(test_recall) {
    /* one token: active {0, 2, 3}, fast {2, 3, 5}: hit 2; recall 2/3, precision 2/3 */
    const uint8_t fast[6] = {0, 0, 1, 1, 0, 1};
    const int64_t tok[6] = {1, 0, 1, 1, 0, 0};
    qi_neuron_rp rp;
    qi_neuron_recall(fast, tok, 6, 1, &rp);
    ck_assert_double_eq_tol(rp.recall, 2.0 / 3.0, 1e-15);
    ck_assert_double_eq_tol(rp.precision, 2.0 / 3.0, 1e-15);
    ck_assert_int_eq(rp.hit, 2);
    ck_assert_int_eq(rp.fast, 3);
    /* counts over 4 tokens: 4 0 2 1 0 3; fast hold 2 + 1 + 3 = 6 of 10;
     * precision 6 / (4 x 3) */
    const int64_t cnt[6] = {4, 0, 2, 1, 0, 3};
    qi_neuron_recall(fast, cnt, 6, 4, &rp);
    ck_assert_double_eq_tol(rp.recall, 0.6, 1e-15);
    ck_assert_double_eq_tol(rp.precision, 0.5, 1e-15);
    /* all fast: recall 1; none fast: precision undefined, recall 0 */
    const uint8_t all[6] = {1, 1, 1, 1, 1, 1}, none[6] = {0};
    qi_neuron_recall(all, cnt, 6, 4, &rp);
    ck_assert_double_eq(rp.recall, 1.0);
    ck_assert_double_eq_tol(rp.precision, 10.0 / 24.0, 1e-15);
    qi_neuron_recall(none, cnt, 6, 4, &rp);
    ck_assert_double_eq(rp.recall, 0.0);
    ck_assert(isnan(rp.precision));
    /* nothing active: recall undefined, precision 0 */
    const int64_t zero[6] = {0};
    qi_neuron_recall(fast, zero, 6, 4, &rp);
    ck_assert(isnan(rp.recall));
    ck_assert_double_eq(rp.precision, 0.0);
}
END_TEST

START_TEST(test_bytes_of_model) {
    enum { L = 3 };
    qi_layer layers[L];
    qi_model m;
    qi_test_tiny_shapes(&m, layers, L, 1);
    for (int l = 0; l < L; l++) layers[l].w_down.n_cols = m.hp.n_ff;
    layers[2].w_down.row_bytes = 1000; /* 256 rows x 1000 bytes over 512 neurons: 500 */
    layers[1].w_down.row_bytes = 1001; /* 256256 / 512 = 500.5: 501 */
    uint64_t b[L];
    qi_err e = {0};
    ck_assert_int_eq(qi_neuron_bytes_of_model(&m, b, &e), QI_OK);
    ck_assert_uint_eq(b[0], 512 + 512 + 1024 * 256 / 512);
    ck_assert_uint_eq(b[1], 512 + 512 + 501);
    ck_assert_uint_eq(b[2], 512 + 512 + 500);
    m.hp.ffn_act = QI_FFN_RELU; /* no gate */
    ck_assert_int_eq(qi_neuron_bytes_of_model(&m, b, &e), QI_OK);
    ck_assert_uint_eq(b[0], 512 + 512);
    m.hp.ffn_act = QI_FFN_SWIGLU;
    layers[1].w_up.n_rows = 100;
    ck_assert_int_eq(qi_neuron_bytes_of_model(&m, b, &e), QI_ERR_INVALID);
    ck_assert_msg(strstr(e.msg, "layer 1's FFN matrices are not 512 neurons wide") != NULL, "%s", e.msg);
}
END_TEST


/* ---- the swap worker's rule (without its thread; the threads are
 * tests/unit/tsan_neuron_live.c's, under ThreadSanitizer) -------------------------------- */

typedef struct {
    int copies, swaps, fail_neuron;
    int copy_log[8][3], swap_log[8][4];
} live_log;

static int log_copy(void *ctx, int layer, int neuron, int slot) {
    live_log *g = ctx;
    if (g->copies < 8) g->copy_log[g->copies][0] = layer, g->copy_log[g->copies][1] = neuron,
                       g->copy_log[g->copies][2] = slot;
    g->copies++;
    return neuron == g->fail_neuron ? -1 : 0;
}

static void log_swap(void *ctx, int layer, int in, int out, int slot) {
    live_log *g = ctx;
    if (g->swaps < 8) g->swap_log[g->swaps][0] = layer, g->swap_log[g->swaps][1] = in, g->swap_log[g->swaps][2] = out,
                      g->swap_log[g->swaps][3] = slot;
    g->swaps++;
}

static void live_check(qi_neuron_live *lv, int layer) {
    qi_neuron_live_view v;
    qi_err e = {0};
    qi_neuron_live_begin(lv, layer, &v);
    ck_assert_msg(qi_neuron_live_view_check(&v, layer, &e) == QI_OK, "%s", e.msg);
    qi_neuron_live_end(lv, layer);
}

static const uint8_t live_fast[8] = {1, 1, 0, 0, 0, 0, 0, 0};
static const double live_start[8] = {1, 1, 0, 0, 0, 0, 0, 0};
static const double live_window[8] = {0.1, 0.2, 0, 0, 0, 5, 3, 0};
static const uint64_t live_bytes[1] = {1000};

static qi_neuron_live_opts live_opts(void) {
    qi_neuron_live_opts o;
    qi_neuron_live_opts_default(&o);
    o.ratio = 4;
    o.slow_s = 1;
    o.link_bw = 1000; /* a copy: 1 s */
    o.decay = 1;      /* the new window replaces the average */
    return o;
}

/* One layer of 8 neurons, neurons 0 and 1 in the two slots, ratio 4.
 * At the start the fast side is the slower (t_fast 0.5, t_slow 0): no
 * swap. Then neurons 5 and 6 turn hot (window 0.1 0.2 0 0 0 5 3 0):
 * t_fast 0.075, t_slow 8. Swap 5 into slot 0 (neuron 0, the coldest):
 * t_fast 1.3, t_slow 3.1, gain 4.9 s per token; 6 into slot 1: t_fast 2,
 * t_slow 0.3, gain 1.1; both pay for a 1 s copy over 64 tokens. */
START_TEST(test_live_rule) {
    live_log g = {.fail_neuron = -1};
    qi_neuron_live_opts o = live_opts();
    qi_neuron_live *lv = NULL;
    qi_err e = {0};
    ck_assert_int_eq(qi_neuron_live_create(1, 8, live_fast, live_start, live_bytes, &o, log_copy, log_swap, &g, &lv, &e),
                     QI_OK);
    qi_neuron_live_view v;
    qi_neuron_live_begin(lv, 0, &v);
    ck_assert_int_eq(v.n_slots, 2);
    ck_assert_int_eq(v.slot[0], 0);
    ck_assert_int_eq(v.slot[1], 1);
    const uint64_t gen0 = v.gen;
    qi_neuron_live_end(lv, 0);
    ck_assert_int_eq(qi_neuron_live_rebalance(lv), 0);
    ck_assert_int_eq(qi_neuron_live_feed(lv, 0, live_window, 1, &e), QI_OK);
    ck_assert_int_eq(qi_neuron_live_rebalance(lv), 2);
    ck_assert_int_eq(g.copies, 2);
    const int want_copy[2][3] = {{0, 5, 0}, {0, 6, 1}};
    const int want_swap[2][4] = {{0, 5, 0, 0}, {0, 6, 1, 1}};
    for (int i = 0; i < 2; i++) {
        for (int k = 0; k < 3; k++) ck_assert_int_eq(g.copy_log[i][k], want_copy[i][k]);
        for (int k = 0; k < 4; k++) ck_assert_int_eq(g.swap_log[i][k], want_swap[i][k]);
    }
    qi_neuron_live_begin(lv, 0, &v);
    ck_assert_int_eq(v.slot[0], 5);
    ck_assert_int_eq(v.slot[1], 6);
    ck_assert_int_eq(v.where[0], -1);
    ck_assert_int_eq(v.where[5], 0);
    ck_assert(v.gen != gen0);
    ck_assert_int_eq(qi_neuron_live_view_check(&v, 0, &e), QI_OK);
    qi_neuron_live_end(lv, 0);
    qi_neuron_live_stats st;
    qi_neuron_live_stats_get(lv, &st);
    ck_assert_int_eq(st.swaps, 2);
    ck_assert_double_eq(st.copied_bytes, 2000.0);
    ck_assert_double_eq_tol(st.copy_s, 2.0, 1e-12);
    ck_assert_double_eq_tol(st.t_fast, 2.0, 1e-12);
    ck_assert_double_eq_tol(st.t_slow, 0.3, 1e-12);
    /* now the fast side is the slower: nothing more */
    ck_assert_int_eq(qi_neuron_live_feed(lv, 0, live_window, 1, &e), QI_OK);
    ck_assert_int_eq(qi_neuron_live_rebalance(lv), 0);
    qi_neuron_live_free(lv);

    /* the copy's cost counted: over 0.1 tokens the first swap gains 0.49 s
     * for a 1 s copy, so none is made */
    o.horizon = 0.1;
    g = (live_log){.fail_neuron = -1};
    ck_assert_int_eq(qi_neuron_live_create(1, 8, live_fast, live_start, live_bytes, &o, log_copy, log_swap, &g, &lv, &e),
                     QI_OK);
    ck_assert_int_eq(qi_neuron_live_feed(lv, 0, live_window, 1, &e), QI_OK);
    ck_assert_int_eq(qi_neuron_live_rebalance(lv), 0);
    ck_assert_int_eq(g.copies, 0);
    qi_neuron_live_free(lv);

    /* balanced within tol: t_fast 2 / 4, t_slow 0.52 (4% apart) */
    o = live_opts();
    const double bal[8] = {1, 1, 0.52, 0, 0, 0, 0, 0};
    ck_assert_int_eq(qi_neuron_live_create(1, 8, live_fast, bal, live_bytes, &o, log_copy, log_swap, &g, &lv, &e), QI_OK);
    ck_assert_int_eq(qi_neuron_live_rebalance(lv), 0);
    qi_neuron_live_free(lv);

    /* a failed copy leaves the slot empty, both neurons on the slow side,
     * and the next round fills the empty slot first */
    g = (live_log){.fail_neuron = 5};
    ck_assert_int_eq(qi_neuron_live_create(1, 8, live_fast, live_start, live_bytes, &o, log_copy, log_swap, &g, &lv, &e),
                     QI_OK);
    ck_assert_int_eq(qi_neuron_live_feed(lv, 0, live_window, 1, &e), QI_OK);
    ck_assert_int_eq(qi_neuron_live_rebalance(lv), 0);
    qi_neuron_live_begin(lv, 0, &v);
    ck_assert_int_eq(v.slot[0], -1);
    ck_assert_int_eq(v.where[0], -1);
    ck_assert_int_eq(v.where[5], -1);
    ck_assert_int_eq(qi_neuron_live_view_check(&v, 0, &e), QI_OK);
    qi_neuron_live_end(lv, 0);
    ck_assert_int_eq(g.swap_log[0][1], -1);
    qi_neuron_live_stats_get(lv, &st);
    ck_assert_int_eq(st.failed_copies, 1);
    g.fail_neuron = -1;
    ck_assert_int_eq(qi_neuron_live_rebalance(lv), 2);
    qi_neuron_live_begin(lv, 0, &v);
    ck_assert_int_eq(v.slot[0], 5); /* the empty slot, filled first */
    ck_assert_int_eq(v.slot[1], 6);
    qi_neuron_live_end(lv, 0);
    live_check(lv, 0);
    qi_neuron_live_free(lv);
}
END_TEST

/* The checker catches a neuron in two places (planted views). */
START_TEST(test_live_view_check) {
    qi_err e = {0};
    int32_t slot[2] = {1, 0}, where[3] = {1, 0, -1};
    qi_neuron_live_view v = {.n_ff = 3, .n_slots = 2, .slot = slot, .where = where};
    ck_assert_int_eq(qi_neuron_live_view_check(&v, 0, &e), QI_OK);
    slot[1] = 1; /* neuron 1 in both slots, neuron 0 says slot 1 */
    ck_assert_int_eq(qi_neuron_live_view_check(&v, 0, &e), QI_ERR_BACKEND);
    ck_assert_msg(strstr(e.msg, "neuron 0 says slot 1, which holds 1") != NULL, "%s", e.msg);
    qi_err_clear(&e);
    slot[1] = 0;
    where[0] = -1; /* neuron 0 in slot 1 and on the slow device */
    ck_assert_int_eq(qi_neuron_live_view_check(&v, 0, &e), QI_ERR_BACKEND);
    ck_assert_msg(strstr(e.msg, "neuron 0 is in slot 1 and on the slow device") != NULL, "%s", e.msg);
    qi_err_clear(&e);
    where[0] = 1;
    slot[0] = 2; /* neuron 2 in a slot, but says it is slow */
    ck_assert_int_eq(qi_neuron_live_view_check(&v, 0, &e), QI_ERR_BACKEND);
    qi_err_clear(&e);
    slot[0] = 7;
    ck_assert_int_eq(qi_neuron_live_view_check(&v, 0, &e), QI_ERR_BACKEND);
    ck_assert_msg(strstr(e.msg, "neuron 1 says slot 0, which holds 7") != NULL, "%s", e.msg);
}
END_TEST

START_TEST(test_live_errors) {
    qi_neuron_live_opts o = live_opts();
    qi_neuron_live *lv = NULL;
    qi_err e = {0};
    o.decay = 0;
    ck_assert_int_eq(qi_neuron_live_create(1, 8, live_fast, live_start, live_bytes, &o, NULL, NULL, NULL, &lv, &e),
                     QI_ERR_INVALID);
    ck_assert_msg(strstr(e.msg, "decay 0 (in (0, 1])") != NULL, "%s", e.msg);
    ck_assert_ptr_null(lv);
    o = live_opts();
    o.ratio = NAN;
    qi_err_clear(&e);
    ck_assert_int_eq(qi_neuron_live_create(1, 8, live_fast, live_start, live_bytes, &o, NULL, NULL, NULL, &lv, &e),
                     QI_ERR_INVALID);
    o = live_opts();
    const double neg[8] = {1, -1};
    qi_err_clear(&e);
    ck_assert_int_eq(qi_neuron_live_create(1, 8, live_fast, neg, live_bytes, &o, NULL, NULL, NULL, &lv, &e),
                     QI_ERR_INVALID);
    ck_assert_msg(strstr(e.msg, "layer 0 neuron 1: activity -1") != NULL, "%s", e.msg);
    qi_err_clear(&e);
    ck_assert_int_eq(qi_neuron_live_create(1, 8, live_fast, live_start, live_bytes, &o, NULL, NULL, NULL, &lv, &e), QI_OK);
    ck_assert_int_eq(qi_neuron_live_feed(lv, 1, live_window, 1, &e), QI_ERR_INVALID);
    qi_err_clear(&e);
    ck_assert_int_eq(qi_neuron_live_feed(lv, 0, live_window, 0, &e), QI_ERR_INVALID);
    qi_err_clear(&e);
    ck_assert_int_eq(qi_neuron_live_feed(lv, 0, neg, 1, &e), QI_ERR_INVALID);
    qi_err_clear(&e);
    /* the worker: a window fed, synced, swapped (no copy callback) */
    ck_assert_int_eq(qi_neuron_live_start(lv, &e), QI_OK);
    ck_assert_int_eq(qi_neuron_live_start(lv, &e), QI_ERR_INVALID);
    ck_assert_int_eq(qi_neuron_live_rebalance(lv), -1);
    ck_assert_int_eq(qi_neuron_live_feed(lv, 0, live_window, 1, &e), QI_OK);
    qi_neuron_live_sync(lv);
    qi_neuron_live_stats st;
    qi_neuron_live_stats_get(lv, &st);
    ck_assert_int_eq(st.swaps, 2);
    live_check(lv, 0);
    qi_neuron_live_stop(lv);
    qi_neuron_live_stop(lv);
    qi_neuron_live_sync(lv); /* stopped: returns */
    qi_neuron_live_free(lv);
    qi_neuron_live_free(NULL);
}
END_TEST

/* ---- the profile file ----------------------------------------------------------------- */

static const char good[] = "# qinfer ffn-profile 1\n"
                           "# model m.gguf\n"
                           "# corpus c.txt\n"
                           "# n_layer 2 n_ff 3 tokens 10 ctx 512 threshold 0.1 top 0.2 k 1 window 64\n"
                           "# layer 0 tokens 10 tok_overlap 0.5 win_overlap 0.5 mass_share 0.5 active_frac 0.5\n"
                           "# layer 1 tokens 8 tok_overlap 0.5 win_overlap 0.5 mass_share 0.5 active_frac 0.5\n"
                           "# columns: layer neuron active hot mass\n"
                           "0 0 10 3 4.5\n"
                           "0 1 2 0 0.25\n"
                           "0 2 0 0 0\n"
                           "1 2 8 8 1e3\n"
                           "1 0 1 0 0.5\n"
                           "1 1 7 0 2\n";

static qi_status read_str(const char *text, size_t n, qi_neuron_profile *p, qi_err *e) {
    FILE *f = fmemopen((void *)text, n, "r");
    ck_assert_ptr_nonnull(f);
    qi_status st = qi_neuron_profile_readf(f, "p.txt", p, e);
    fclose(f);
    return st;
}

START_TEST(test_profile_good) {
    qi_neuron_profile p;
    qi_err e = {0};
    ck_assert_msg(read_str(good, strlen(good), &p, &e) == QI_OK, "%s", e.msg);
    ck_assert_int_eq(p.n_layer, 2);
    ck_assert_int_eq(p.n_ff, 3);
    ck_assert_int_eq(p.tokens, 10);
    ck_assert_int_eq(p.layer_tokens[1], 8);
    ck_assert_str_eq(p.model, "m.gguf");
    ck_assert_int_eq(p.active[0], 10);
    ck_assert_int_eq(p.hot[0], 3);
    ck_assert_double_eq(p.mass[0], 4.5);
    ck_assert_double_eq(p.mass[5], 1000.0);
    ck_assert_int_eq(p.active[3], 1);
    qi_neuron_profile_fini(&p);
    qi_neuron_profile_fini(&p);

    /* a file the profiler wrote reads back to its arrays */
    qi_ffnprof_opts o = {.threshold = 0.5f, .top = 0.5, .window = 2};
    qi_ffnprof *fp = NULL;
    ck_assert_int_eq(qi_ffnprof_create(2, 4, &o, &fp, &e), QI_OK);
    const float act[3][4] = {{1, -2, 0.1f, 3}, {0, 0.7f, 2, -1}, {4, 0, 0, 0.2f}};
    qi_ffnprof_add(fp, 0, &act[0][0], 3);
    qi_ffnprof_add(fp, 1, &act[0][0], 2);
    char path[] = "/tmp/qinfer-neuron-profile-XXXXXX";
    const int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    FILE *f = fdopen(fd, "w");
    ck_assert_int_eq(qi_ffnprof_write(fp, f, "model path with spaces.gguf", "c.txt", 64, &e), QI_OK);
    fclose(f);
    ck_assert_msg(qi_neuron_profile_read(path, &p, &e) == QI_OK, "%s", e.msg);
    unlink(path);
    ck_assert_str_eq(p.model, "model path with spaces.gguf");
    ck_assert_int_eq(p.layer_tokens[0], 3);
    ck_assert_int_eq(p.layer_tokens[1], 2);
    for (int l = 0; l < 2; l++)
        for (int j = 0; j < 4; j++) {
            ck_assert_int_eq(p.active[l * 4 + j], qi_ffnprof_active(fp, l)[j]);
            ck_assert_int_eq(p.hot[l * 4 + j], qi_ffnprof_hot(fp, l)[j]);
            ck_assert_double_eq_tol(p.mass[l * 4 + j], qi_ffnprof_mass(fp, l)[j], 1e-6);
        }
    qi_neuron_profile_fini(&p);
    qi_ffnprof_free(fp);
    ck_assert_int_eq(qi_neuron_profile_read("/nonexistent/p.txt", &p, &e), QI_ERR_IO);
    ck_assert_msg(strstr(e.msg, "/nonexistent/p.txt: cannot open") != NULL, "%s", e.msg);
}
END_TEST

/* good with line `line` (1-based) replaced by `with` (NULL: removed). */
static void expect_bad(int line, const char *with, qi_status code, const char *want) {
    char buf[2048] = "";
    const char *s = good;
    for (int i = 1; *s; i++) {
        const char *nl = strchr(s, '\n');
        const size_t n = (size_t)(nl - s) + 1;
        if (i != line) strncat(buf, s, n);
        else if (with) strcat(buf, with);
        s += n;
    }
    qi_neuron_profile p;
    qi_err e = {0};
    ck_assert_int_eq(read_str(buf, strlen(buf), &p, &e), code);
    ck_assert_msg(strstr(e.msg, want) != NULL, "line %d '%s': want '%s' in '%s'", line, with ? with : "(removed)", want,
                  e.msg);
    ck_assert_ptr_null(p.mass);
}

START_TEST(test_profile_bad) {
    expect_bad(1, "# qinfer ffn-profile 2\n", QI_ERR_UNSUPPORTED, "p.txt:1: FFN profile version '2'");
    expect_bad(1, "hello\n", QI_ERR_FORMAT, "p.txt:1: not a qinfer FFN profile");
    expect_bad(4, NULL, QI_ERR_FORMAT, "p.txt:4: a layer line before the settings line");
    expect_bad(4, "# n_layer 2 n_ff 3\n", QI_ERR_FORMAT, "p.txt:4: settings line lacks tokens");
    expect_bad(4, "# n_layer 0 n_ff 3 tokens 10\n", QI_ERR_FORMAT, "p.txt:4: settings line: n_layer '0' is not");
    expect_bad(4, "# n_layer 2 n_ff 3x tokens 10\n", QI_ERR_FORMAT, "n_ff '3x' is not a whole number");
    expect_bad(4, "# n_layer 4000 n_ff 4000000 tokens 10\n", QI_ERR_FORMAT, "is more than");
    expect_bad(4, "# n_layer 2 n_ff 3 tokens 10 n_ff 3\n", QI_ERR_FORMAT, "n_ff given twice");
    expect_bad(4, "# n_layer 2 n_ff 3 tokens\n", QI_ERR_FORMAT, "'tokens' has no value");
    expect_bad(5, "# layer 0 tokens 11\n", QI_ERR_FORMAT, "p.txt:5: layer line: 'tokens N' with N in [0, 10]");
    expect_bad(6, "# layer 0 tokens 10\n", QI_ERR_FORMAT, "p.txt:6: layer line: layer 0 given twice");
    expect_bad(6, "# layer 9 tokens 10\n", QI_ERR_FORMAT, "p.txt:6: layer line: layer '9' is not in [0, 1]");
    expect_bad(8, "0 0 10 3\n", QI_ERR_FORMAT, "p.txt:8: 4 fields, want 5");
    expect_bad(8, "0 0 10 3 4.5 7\n", QI_ERR_FORMAT, "p.txt:8: 6 fields, want 5");
    expect_bad(8, "2 0 10 3 4.5\n", QI_ERR_FORMAT, "p.txt:8: layer '2' is not a whole number in [0, 1]");
    expect_bad(8, "0 3 10 3 4.5\n", QI_ERR_FORMAT, "p.txt:8: neuron '3' is not");
    expect_bad(8, "0 -1 10 3 4.5\n", QI_ERR_FORMAT, "p.txt:8: neuron '-1' is not");
    expect_bad(8, "0 0 11 3 4.5\n", QI_ERR_FORMAT, "p.txt:8: active count '11' is not a whole number in [0, 10]");
    expect_bad(11, "1 2 9 8 1e3\n", QI_ERR_FORMAT, "p.txt:11: active count '9' is not a whole number in [0, 8]");
    expect_bad(8, "0 0 10 -3 4.5\n", QI_ERR_FORMAT, "p.txt:8: hot count '-3'");
    expect_bad(8, "0 0 10 3 nan\n", QI_ERR_FORMAT, "p.txt:8: mass 'nan' is not a finite number >= 0");
    expect_bad(8, "0 0 10 3 inf\n", QI_ERR_FORMAT, "mass 'inf'");
    expect_bad(8, "0 0 10 3 -1\n", QI_ERR_FORMAT, "mass '-1'");
    expect_bad(8, "0 0 10 3 1e999\n", QI_ERR_FORMAT, "mass '1e999'");
    expect_bad(8, "0 0 10 3 4.5x\n", QI_ERR_FORMAT, "mass '4.5x'");
    expect_bad(9, "0 0 2 0 0.25\n", QI_ERR_FORMAT, "p.txt:9: layer 0 neuron 0 given twice");
    expect_bad(9, NULL, QI_ERR_FORMAT, "p.txt:13: the file ends with layer 0 neuron 1 missing");
    expect_bad(10, "# layer 1 tokens 8\n", QI_ERR_FORMAT, "p.txt:10: a layer line after the neuron lines");
    expect_bad(8, "0 0 10 3 4.5\n0 0 10 3 4.5 \n", QI_ERR_FORMAT, "p.txt:9: layer 0 neuron 0 given twice");

    qi_neuron_profile p;
    qi_err e = {0};
    ck_assert_int_eq(read_str("", 0, &p, &e), QI_ERR_FORMAT);
    ck_assert_msg(strstr(e.msg, "p.txt:1: empty file") != NULL, "%s", e.msg);
    qi_err_clear(&e);
    const char only_magic[] = "# qinfer ffn-profile 1\n# model x\n";
    ck_assert_int_eq(read_str(only_magic, strlen(only_magic), &p, &e), QI_ERR_FORMAT);
    ck_assert_msg(strstr(e.msg, "p.txt:3: the file ends without a settings line") != NULL, "%s", e.msg);
    qi_err_clear(&e);
    const char nul[] = "# qinfer ffn-profile 1\n# n_layer 1 n_ff 1 tokens 1\n0 0\0 1 1 1\n";
    ck_assert_int_eq(read_str(nul, sizeof nul - 1, &p, &e), QI_ERR_FORMAT);
    ck_assert_msg(strstr(e.msg, "p.txt:3: a NUL byte") != NULL, "%s", e.msg);
    qi_err_clear(&e);
    /* CRLF line ends and blank lines read */
    const char crlf[] = "# qinfer ffn-profile 1\r\n# n_layer 1 n_ff 2 tokens 3\r\n\r\n0 1 1 1 2\r\n0 0 3 2 5.5\r\n";
    ck_assert_msg(read_str(crlf, strlen(crlf), &p, &e) == QI_OK, "%s", e.msg);
    ck_assert_double_eq(p.mass[0], 5.5);
    qi_neuron_profile_fini(&p);
}
END_TEST

/* Garbage and mutations: never a crash or a leak (ASan builds), always a
 * profile or an error; a format error names the file and a line. */
START_TEST(test_profile_fuzz) {
    uint64_t rng = 99;
    const size_t n = strlen(good);
    char buf[4096];
    int ok = 0, bad = 0;
    for (int t = 0; t < 3000; t++) {
        size_t len;
        if (t % 4 == 0) { /* random bytes, sometimes after a good magic line */
            len = (size_t)(qi_test_rand(&rng) % 300);
            for (size_t i = 0; i < len; i++) buf[i] = (char)(qi_test_rand(&rng) % 256);
            if (t % 8 == 0 && len > 23) memcpy(buf, good, 23);
        } else { /* the good file with a few bytes changed, cut or repeated */
            memcpy(buf, good, n);
            len = n;
            const int k = 1 + (int)(qi_test_rand(&rng) % 4);
            for (int i = 0; i < k && len > 0; i++) {
                const size_t at = (size_t)(qi_test_rand(&rng) % len);
                const uint64_t r = qi_test_rand(&rng);
                if (r % 3 == 0) buf[at] = " 0123456789.-e#\n\tx"[r / 3 % 18];
                else if (r % 3 == 1) len = at;
                else buf[at] = (char)(r >> 8);
            }
        }
        qi_neuron_profile p;
        qi_err e = {0};
        const qi_status st = read_str(buf, len, &p, &e);
        if (st == QI_OK) {
            ok++;
            ck_assert_int_ge(p.n_layer, 1);
            ck_assert_ptr_nonnull(p.mass);
            for (long i = 0; i < (long)p.n_layer * p.n_ff; i++) ck_assert(isfinite(p.mass[i]) && p.mass[i] >= 0);
            qi_neuron_profile_fini(&p);
        } else {
            bad++;
            ck_assert_msg(st == QI_ERR_FORMAT || st == QI_ERR_UNSUPPORTED, "status %d: %s", st, e.msg);
            ck_assert_msg(strncmp(e.msg, "p.txt:", 6) == 0, "%s", e.msg);
            ck_assert_ptr_null(p.mass);
        }
    }
    ck_assert_int_gt(ok, 10);
    ck_assert_int_gt(bad, 1000);
}
END_TEST

/* Every allocation of the reader, the wrapper, each policy and the swap
 * worker's state failed in turn: QI_ERR_NOMEM or a result, never a crash
 * (and, in the ASan build, no leak). */
START_TEST(test_alloc_faults) {
    static const char *const specs[] = {"none", "qinfer:ratio=2",
#ifdef QI_HAVE_GLPK
                                        "static",
#endif
                                        NULL};
    const double act[8] = {8, 4, 2, 2, 6, 1, 1, 0};
    const uint64_t nb[2] = {10, 10};
    const qi_neuron_input in = {.n_layer = 2, .n_ff = 4, .activity = act, .neuron_bytes = nb, .budget = 40, .group = 2};
    int nomem = 0, done = 0;
    for (long n = 1; n <= 40; n++) {
        qi_err e = {0};
        qi_neuron_profile prof;
        qi_alloc_fail_after(n);
        qi_status st = read_str(good, strlen(good), &prof, &e);
        qi_alloc_fail_after(0);
        ck_assert_msg(st == QI_OK || st == QI_ERR_NOMEM, "profile, allocation %ld: %s", n, e.msg);
        nomem += st == QI_ERR_NOMEM;
        done += st == QI_OK;
        qi_neuron_profile_fini(&prof);
        for (const char *const *sp = specs; *sp; sp++) {
            qi_neuron_policy *p = NULL;
            qi_neuron_plan plan;
            qi_err_clear(&e);
            qi_alloc_fail_after(n);
            st = qi_neuron_policy_from_spec(*sp, &p, &e);
            if (!st) st = qi_neuron_policy_place(p, &in, &plan, &e);
            qi_alloc_fail_after(0);
            ck_assert_msg(st == QI_OK || st == QI_ERR_NOMEM, "%s, allocation %ld: %s", *sp, n, e.msg);
            nomem += st == QI_ERR_NOMEM;
            done += st == QI_OK;
            if (!st) qi_neuron_plan_fini(&plan);
            qi_neuron_policy_free(p);
        }
        qi_neuron_live_opts o = live_opts();
        qi_neuron_live *lv = NULL;
        qi_err_clear(&e);
        qi_alloc_fail_after(n);
        st = qi_neuron_live_create(1, 8, live_fast, live_start, live_bytes, &o, NULL, NULL, NULL, &lv, &e);
        qi_alloc_fail_after(0);
        ck_assert_msg(st == QI_OK || st == QI_ERR_NOMEM, "live, allocation %ld: %s", n, e.msg);
        ck_assert(st == QI_OK || lv == NULL);
        nomem += st == QI_ERR_NOMEM;
        qi_neuron_live_free(lv);
    }
    ck_assert_int_gt(nomem, 20);
    ck_assert_int_gt(done, 20);
}
END_TEST

static Suite *neuron_suite(void) {
    Suite *s = suite_create("neuron");
    TCase *tc = tcase_create("neuron");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_registry);
    tcase_add_test(tc, test_groups);
    tcase_add_test(tc, test_bad_input);
    tcase_add_test(tc, test_wrapper_refuses);
    tcase_add_test(tc, test_none);
#ifdef QI_HAVE_GLPK
    tcase_add_test(tc, test_static_vs_brute);
    tcase_add_test(tc, test_static_policy);
    tcase_add_test(tc, test_static_large);
#endif
    tcase_add_test(tc, test_greedy);
    tcase_add_test(tc, test_calibrate);
    tcase_add_test(tc, test_recall);
    tcase_add_test(tc, test_bytes_of_model);
    tcase_add_test(tc, test_live_rule);
    tcase_add_test(tc, test_live_view_check);
    tcase_add_test(tc, test_live_errors);
    tcase_add_test(tc, test_profile_good);
    tcase_add_test(tc, test_profile_bad);
    tcase_add_test(tc, test_profile_fuzz);
    tcase_add_test(tc, test_alloc_faults);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return qi_test_run_suite(neuron_suite()); }

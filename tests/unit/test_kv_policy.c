/* test_kv_policy.c - the KV selection policies and their wrappers.
 *
 * Hand-made attention patterns whose right answer is known; a brute-force
 * oracle (O(n^2) rank counting, no sorting) for every bounded policy on
 * random views and on simulated decoding runs where the fates are applied
 * as the cache would; Q-Infer reduced to H2O fate for fate; planted faulty
 * policies the wrapper must catch; bad names and parameters; allocation
 * failures in create and in select's scratch growth. Quest: its block
 * bound against every key's score, its choice against a full sort, the
 * wrapper's checks of pick(), and the cache's key bounds (engine/kv.c)
 * against a recomputation after writes, evictions and a swap. SparQ: its
 * token choice against an oracle in double on random views, and by hand.
 *
 * The parts are in test_kv_policy/ (kv_policy_test.h says which holds
 * what); this file holds the registry, names and parameters, allocation
 * failures, and the suite.
 */
#include "kv_policy_test.h"

/* ---- the registry, names and parameters ------------------------------------- */

START_TEST(registry_is_consistent) {
    int n = 0;
    for (const qi_kv_policy_i *const *it = qi_kv_policies; *it; it++, n++) {
        const qi_kv_policy_i *pi = *it;
        ck_assert_uint_eq(pi->version, QI_KV_POLICY_VERSION);
        ck_assert(pi->name && pi->summary && pi->params && pi->create && pi->select && pi->free);
        ck_assert_ptr_eq(qi_kv_policy_find(pi->name), pi);
        for (const qi_kv_policy_i *const *o = qi_kv_policies; o != it; o++) ck_assert_str_ne((*o)->name, pi->name);
        /* the documented defaults are accepted as given */
        qi_kv_policy_free(make(pi->name, pi->params));
        /* and NULL params mean the defaults */
        qi_kv_policy *p = NULL;
        ck_assert_int_eq(qi_kv_policy_create(pi->name, NULL, N_LAYER, &p, NULL), QI_OK);
        qi_kv_policy_free(p);
    }
    ck_assert_int_eq(n, 11);
    ck_assert_ptr_null(qi_kv_policy_find("nope"));
    ck_assert_ptr_null(qi_kv_policy_find(NULL));
    qi_kv_policy_free(NULL);
}
END_TEST

static void expect_create_fails(const char *name, const char *spec, int n_layer, const char *const *words) {
    qi_params pa;
    qi_params_init(&pa);
    ck_assert_int_eq(qi_params_parse(&pa, spec, NULL), QI_OK);
    qi_kv_policy *p = (qi_kv_policy *)&pa; /* must be reset to NULL */
    qi_err e = {0};
    ck_assert_int_eq(qi_kv_policy_create(name, &pa, n_layer, &p, &e), QI_ERR_INVALID);
    ck_assert_ptr_null(p);
    ck_assert_ptr_null(strchr(e.msg, '\n'));
    for (; *words; words++) ck_assert_msg(strstr(e.msg, *words) != NULL, "'%s' not in: %s", *words, e.msg);
}

START_TEST(bad_names_and_parameters) {
    expect_create_fails("nope", "", N_LAYER,
                        (const char *[]){"nope", "full", "window", "streaming", "h2o", "qinfer", "tova",
                                         "scissorhands", "keyformer", "snapkv", "quest", "sparq", NULL});
    expect_create_fails("sparq", "dims=0", N_LAYER, (const char *[]){"sparq", "'dims'", "(0, 1]", NULL});
    expect_create_fails("sparq", "dims=1.5", N_LAYER, (const char *[]){"sparq", "'dims'", NULL});
    expect_create_fails("sparq", "dims=many", N_LAYER, (const char *[]){"sparq", "'dims'", NULL});
    expect_create_fails("sparq", "full_layers=9", N_LAYER, (const char *[]){"sparq", "'full_layers'", "[0, 8]", NULL});
    expect_create_fails("sparq", "page=16", N_LAYER, (const char *[]){"sparq", "'page'", "dims, full_layers, mean", NULL});
    expect_create_fails("sparq", "mean=2", N_LAYER, (const char *[]){"sparq", "'mean'", NULL});
    expect_create_fails("sparq", "ada=0.5", N_LAYER, (const char *[]){"sparq", "'ada'", "scored policy", NULL});
    expect_create_fails("quest", "first=2", N_LAYER, (const char *[]){"quest", "'first'", NULL});
    expect_create_fails("quest", "full_layers=9", N_LAYER, (const char *[]){"quest", "'full_layers'", "[0, 8]", NULL});
    expect_create_fails("quest", "heavy=0.5", N_LAYER, (const char *[]){"quest", "'heavy'", "first, recent, full_layers, page, full_share", NULL});
    expect_create_fails("quest", "recent=-1", N_LAYER, (const char *[]){"quest", "'recent'", NULL});
    expect_create_fails("quest", "page=24", N_LAYER, (const char *[]){"quest", "'page'", "power of two", "'24'", NULL});
    expect_create_fails("quest", "page=0", N_LAYER, (const char *[]){"quest", "'page'", NULL});
    expect_create_fails("quest", "page=8192", N_LAYER, (const char *[]){"quest", "'page'", NULL});
    expect_create_fails("quest", "full_share=maybe", N_LAYER, (const char *[]){"quest", "'full_share'", NULL});
    expect_create_fails("quest", "ada=0.5", N_LAYER, (const char *[]){"quest", "'ada'", "scored policy", NULL});
    expect_create_fails("snapkv", "pool=4", N_LAYER, (const char *[]){"snapkv", "'pool'", "odd", NULL});
    expect_create_fails("snapkv", "window=0", N_LAYER, (const char *[]){"snapkv", "'window'", NULL});
    expect_create_fails("qinfer", "pool=2", N_LAYER, (const char *[]){"qinfer", "'pool'", "odd", NULL});
    expect_create_fails("qinfer", "judge=-1", N_LAYER, (const char *[]){"qinfer", "'judge'", NULL});
    expect_create_fails("h2o", "pyramid=1", N_LAYER, (const char *[]){"h2o", "'pyramid'", "[0, 1)", NULL});
    expect_create_fails("h2o", "ada=1.5", N_LAYER, (const char *[]){"h2o", "'ada'", NULL});
    expect_create_fails("window", "ada=0.5", N_LAYER, (const char *[]){"window", "'ada'", "scored policy", NULL});
    expect_create_fails("full", "ada=0.2", N_LAYER, (const char *[]){"full", "'ada'", NULL});
    expect_create_fails("snapkv", "pyramid=-0.1", N_LAYER, (const char *[]){"snapkv", "'pyramid'", NULL});
    expect_create_fails("tova", "heavy=0.5", N_LAYER, (const char *[]){"tova", "'heavy'", NULL});
    expect_create_fails("scissorhands", "history=25", N_LAYER,
                        (const char *[]){"scissorhands", "'history'", "[1, 24]", NULL});
    expect_create_fails("scissorhands", "history=0", N_LAYER, (const char *[]){"scissorhands", "'history'", NULL});
    expect_create_fails("keyformer", "tau_init=0", N_LAYER, (const char *[]){"keyformer", "'tau_init'", NULL});
    expect_create_fails("keyformer", "noise=2", N_LAYER, (const char *[]){"keyformer", "'noise'", NULL});
    expect_create_fails("keyformer", "steps=0", N_LAYER, (const char *[]){"keyformer", "'steps'", NULL});
    expect_create_fails("h2o", "heavy=abc", N_LAYER, (const char *[]){"h2o", "'heavy'", "abc", NULL});
    expect_create_fails("h2o", "heavy=1.5", N_LAYER, (const char *[]){"h2o", "'heavy'", "[0, 1]", NULL});
    expect_create_fails("h2o", "sinks=4", N_LAYER, (const char *[]){"h2o", "'sinks'", "heavy", NULL});
    expect_create_fails("window", "size=4", N_LAYER, (const char *[]){"window", "'size'", "no parameters", NULL});
    expect_create_fails("full", "x=1", N_LAYER, (const char *[]){"full", "'x'", NULL});
    expect_create_fails("streaming", "sinks=-1", N_LAYER, (const char *[]){"streaming", "'sinks'", NULL});
    expect_create_fails("qinfer", "windows=0", N_LAYER, (const char *[]){"qinfer", "'windows'", NULL});
    expect_create_fails("qinfer", "full_layers=9", N_LAYER,
                        (const char *[]){"qinfer", "'full_layers'", "[0, 8]", NULL});
    expect_create_fails("qinfer", "offload=maybe", N_LAYER, (const char *[]){"qinfer", "'offload'", "maybe", NULL});
    expect_create_fails("qinfer", "recall=2", N_LAYER, (const char *[]){"qinfer", "'recall'", NULL});
    expect_create_fails("qinfer", "probe_every=1x", N_LAYER, (const char *[]){"qinfer", "'probe_every'", NULL});
    expect_create_fails("qinfer", "catch_up=2", N_LAYER, (const char *[]){"qinfer", "'catch_up'", NULL});
    expect_create_fails("qinfer", "fetch=1", N_LAYER, (const char *[]){"qinfer", "'fetch'", NULL});
    expect_create_fails("qinfer", "fetch=-0.1", N_LAYER, (const char *[]){"qinfer", "'fetch'", NULL});
    expect_create_fails("qinfer", "fetch=0.2,offload=false", N_LAYER,
                        (const char *[]){"qinfer", "fetch=0.2", "offload=false", NULL});
    expect_create_fails("qinfer", "fetch_dims=0", N_LAYER, (const char *[]){"qinfer", "'fetch_dims'", "(0, 1]", NULL});
    expect_create_fails("qinfer", "fetch_dims=2", N_LAYER, (const char *[]){"qinfer", "'fetch_dims'", NULL});
    expect_create_fails("qinfer", "sinks=nan", N_LAYER, (const char *[]){"qinfer", "'sinks'", NULL});
    expect_create_fails("qinfer", "heavy=0.5,wndows=2", N_LAYER,
                        (const char *[]){"qinfer", "'wndows'", "windows", "probe_every", NULL});
    static const char *const bad_decays[] = {"decay=0", "decay=-0.5", "decay=1.5", "decay=abc", "decay=nan",
                                             "decay=0.9x"};
    for (int k = 0; k < 6; k++)
        expect_create_fails("qinfer", bad_decays[k], N_LAYER, (const char *[]){"qinfer", "'decay'", "(0, 1]", NULL});
    qi_kv_policy_free(make("qinfer", "decay=1e-6"));
    expect_create_fails("h2o", "", 0, (const char *[]){"h2o", "n_layer", NULL});
    /* a one-layer model: full_layers defaults to 1, not 2 */
    qi_kv_policy *p = NULL;
    ck_assert_int_eq(qi_kv_policy_create("qinfer", NULL, 1, &p, NULL), QI_OK);
    ck_assert(qi_kv_policy_exempt(p, 0));
    qi_kv_policy_free(p);
}
END_TEST

/* Every allocation in create can fail: QI_ERR_NOMEM, no policy, no leak
 * (ASan's leak check runs at the end of each forked test). */
START_TEST(create_survives_allocation_failure) {
    for (const qi_kv_policy_i *const *it = qi_kv_policies; *it; it++) {
        int k = 1;
        for (;; k++) {
            ck_assert_int_lt(k, 20);
            qi_kv_policy *p = NULL;
            qi_err e = {0};
            qi_alloc_fail_after(k);
            qi_status st = qi_kv_policy_create((*it)->name, NULL, N_LAYER, &p, &e);
            qi_alloc_fail_after(0);
            if (st == QI_OK) {
                qi_kv_policy_free(p);
                break;
            }
            ck_assert_int_eq(st, QI_ERR_NOMEM);
            ck_assert_ptr_null(p);
            ck_assert_msg(strstr(e.msg, (*it)->name) || strstr(e.msg, "kv policy"), "%s", e.msg);
        }
        ck_assert_int_gt(k, 1); /* at least one allocation was failed */
    }
}
END_TEST

/* A view bigger than any before grows the scratch; if that fails, select
 * still decides safely (sinks and the newest tokens) and works again once
 * memory is back. */
START_TEST(select_survives_scratch_failure) {
    static const config cases[] = {
        {"h2o", "", {0, 1, 0.5, false, QI_KV_DROP, KEY_SCORE, 0}},
        {"qinfer", "sinks=2,full_layers=0", {2, 1, 0.5, true, QI_KV_OFFLOAD, KEY_SCORE, 0}},
    };
    uint64_t rng = 17;
    for (int c = 0; c < 2; c++) {
        qi_kv_policy *p = make(cases[c].name, cases[c].spec);
        tview *t = tv_new(2000, 100, 3);
        for (int i = 0; i < 2000; i++) t->score[i] = (float)(qi_test_rand(&rng) % 1000);
        shuffle(t, &rng);
        qi_alloc_fail_after(1);
        ck_assert_int_eq(sel(p, t), 100);
        void *probe = qi_malloc(1); /* the armed failure was used by select */
        ck_assert_ptr_nonnull(probe);
        qi_free(probe);
        qi_alloc_fail_after(0);
        rule fallback = {cases[c].r.sinks, 1, 0.0, cases[c].r.recall, cases[c].r.evict, KEY_SCORE, 0};
        expect_oracle(t, fallback, "fallback", c);
        ck_assert_int_eq(sel(p, t), 100);
        expect_oracle(t, cases[c].r, cases[c].name, c);
        qi_kv_policy_free(p);
        free(t);
    }
}
END_TEST

int main(void) {
    Suite *su = suite_create("kv_policy");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    kv_cases_add(tc);
    kv_ada_add(tc);
    kv_oracle_add(tc);
    kv_quest_add(tc);
    kv_sparq_add(tc);
    tcase_add_test(tc, registry_is_consistent);
    tcase_add_test(tc, bad_names_and_parameters);
    tcase_add_test(tc, create_survives_allocation_failure);
    tcase_add_test(tc, select_survives_scratch_failure);
    suite_add_tcase(su, tc);
    return qi_test_run_suite(su);
}

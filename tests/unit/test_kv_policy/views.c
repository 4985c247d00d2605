/* views.c - scores against their definitions, score selection, random
 * views and decoding runs against the oracle, and the wrapper against
 * planted faulty policies. */
#include "kv_policy_test.h"

/* ---- scores against their definitions -------------------------------------
 * A decoding run where the test keeps every token's weight at every step
 * and recomputes each policy's score from its definition after every
 * observe(): TOVA's is the step's weight; Scissorhands' the steps of the
 * last `history` in which the token drew less than the step's mean;
 * Keyformer's the sum over steps of softmax((log p + g) / tau), computed
 * here with logs and exponentials in double (the policy uses the power
 * form), with the noise from the same hash, written out again here. */

static double kf_uniform_ref(uint64_t seed, int layer, int kv_head, int32_t pos, int32_t step) {
    uint64_t z = seed * 0x9E3779B97F4A7C15ull ^ ((uint64_t)(uint32_t)layer << 48) ^
                 ((uint64_t)(uint32_t)kv_head << 40) ^ ((uint64_t)(uint32_t)pos << 20) ^ (uint64_t)(uint32_t)step;
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return ((double)(z >> 11) + 0.5) / 9007199254740992.0;
}

#define SC_STEPS 90
#define SC_POS 200

START_TEST(scores_match_their_definitions) {
    static const char *const specs[][2] = {
        {"tova", ""}, {"scissorhands", "history=6"}, {"scissorhands", "history=24"},
        {"keyformer", "seed=3,tau_init=0.5,tau_end=2,steps=60"}, {"keyformer", "noise=false,tau_end=4"}};
    static float hist[SC_POS][SC_STEPS]; /* token weights per step (NAN: not cached yet) */
    static float mean[SC_STEPS];
    static int32_t cur[SC_STEPS];
    for (size_t c = 0; c < sizeof specs / sizeof *specs; c++) {
        qi_kv_policy *p = make(specs[c][0], specs[c][1]);
        const int kind = specs[c][0][0] == 't' ? 0 : specs[c][0][0] == 's' ? 1 : 2;
        const int history = strstr(specs[c][1], "24") ? 24 : 6;
        uint64_t rng = 500 + c;
        tview *t = tv_new(0, 12, 4);
        int32_t next = 0;
        for (int step = 0; step < SC_STEPS; step++) {
            const int add = step == 0 ? 20 : 1;
            for (int k = 0; k < add; k++) {
                int i = t->v.n++;
                t->pos[i] = next++;
                t->score[i] = 0;
                for (int s2 = 0; s2 < SC_STEPS; s2++) hist[t->pos[i]][s2] = NAN;
            }
            t->v.cur_pos = cur[step] = next - 1;
            float attn[MAXN];
            double total = 0;
            for (int i = 0; i < t->v.n; i++) {
                attn[i] = (float)(qi_test_rand(&rng) % 7) * (t->pos[i] % 5 == 0 ? 0.3f : 0.05f);
                hist[t->pos[i]][step] = attn[i];
                total += attn[i];
            }
            mean[step] = (float)(total / t->v.n);
            qi_kv_policy_observe(p, &t->v, attn);
            for (int i = 0; i < t->v.n; i++) {
                const int32_t q = t->pos[i];
                if (kind == 0) {
                    ck_assert(t->score[i] == hist[q][step]);
                } else if (kind == 1) {
                    uint32_t want = 0;
                    for (int s2 = step, b = 0; s2 >= 0 && b < history && !isnan(hist[q][s2]); s2--, b++)
                        want |= (uint32_t)(hist[q][s2] < mean[s2]) << b;
                    ck_assert_msg(t->score[i] == (float)want, "%s step %d position %d: mask %g, want %u",
                                  specs[c][1], step, q, t->score[i], want);
                } else {
                    const bool noise = !strstr(specs[c][1], "noise=false");
                    const double ti = noise ? 0.5 : 1, te = noise ? 2 : 4, steps = noise ? 60 : 2048;
                    double want = 0;
                    for (int s2 = 0; s2 <= step; s2++) {
                        if (isnan(hist[q][s2]) || !(hist[q][s2] > 0)) continue;
                        const double tau = ti + (te - ti) * (cur[s2] >= steps ? 1.0 : cur[s2] / steps);
                        /* the softmax over the step's tokens with weight, by logs */
                        double tot = 0, z = 0, mine = 0;
                        for (int32_t o = 0; o < SC_POS; o++)
                            if (!isnan(hist[o][s2]) && hist[o][s2] > 0) tot += hist[o][s2];
                        for (int32_t o = 0; o < SC_POS; o++) {
                            if (isnan(hist[o][s2]) || !(hist[o][s2] > 0)) continue;
                            double g = noise ? -log(-log(kf_uniform_ref(3, 4, 0, o, cur[s2]))) : 0;
                            double e = exp((log(hist[o][s2] / tot) + g) / tau);
                            z += e;
                            if (o == q) mine = e;
                        }
                        want += mine / z;
                    }
                    ck_assert_msg(fabs(t->score[i] - want) <= 1e-4 * (1 + want), "%s step %d position %d: %g, want %g",
                                  specs[c][1], step, q, t->score[i], want);
                }
            }
            sel(p, t);
            for (int i = 0; i < t->v.n;) {
                if (t->fate[i] == QI_KV_DROP) { /* its past weights still count in those steps' softmax */
                    int last = --t->v.n;
                    t->pos[i] = t->pos[last];
                    t->score[i] = t->score[last];
                    t->fate[i] = t->fate[last];
                    continue;
                }
                i++;
            }
        }
        qi_kv_policy_free(p);
        free(t);
    }
}
END_TEST

/* ---- score selection ------------------------------------------------------ */

/* a ranks before b: higher score, then newer position, then higher slot;
 * NaN last (the order qi_kv_rank_top_by_score documents) */
static bool ranks_before(const qi_kv_item *a, const qi_kv_item *b) {
    const bool na = a->score != a->score, nb = b->score != b->score;
    if (na != nb) return nb;
    if (!na && a->score != b->score) return a->score > b->score;
    if (a->pos != b->pos) return a->pos > b->pos;
    return a->slot > b->slot;
}

START_TEST(top_by_score_selects_the_best) {
    uint64_t rng = 77;
    qi_kv_item it[300], orig[300];
    for (int rep = 0; rep < 400; rep++) {
        const int n = 1 + (int)(qi_test_rand(&rng) % 300), k = (int)(qi_test_rand(&rng) % (uint64_t)(n + 2));
        for (int i = 0; i < n; i++) {
            const uint64_t g = qi_test_rand(&rng) % 20;
            orig[i] = (qi_kv_item){g == 0 ? NAN : (float)(qi_test_rand(&rng) % (rep % 2 ? 3 : 50)),
                                   (int32_t)(qi_test_rand(&rng) % 40), i};
        }
        memcpy(it, orig, sizeof(qi_kv_item) * (size_t)n);
        qi_kv_rank_top_by_score(it, n, k);
        /* a permutation of the input ... */
        int seen[300] = {0};
        for (int i = 0; i < n; i++) seen[it[i].slot]++;
        for (int i = 0; i < n; i++) ck_assert_int_eq(seen[i], 1);
        /* ... whose first k are exactly the items with fewer than k better ones */
        const int kk = k < n ? k : n;
        for (int i = 0; i < n; i++) {
            int better = 0;
            for (int j = 0; j < n; j++) better += ranks_before(&orig[j], &it[i]);
            ck_assert_msg((i < kk) == (better < kk), "rep %d n=%d k=%d: item %d (slot %d) has %d better", rep, n, k,
                          i, it[i].slot, better);
        }
    }
}
END_TEST

/* ---- random views against the oracle --------------------------------------- */

static const config CONFIGS[] = {
    {"window", "", {0, 1, 0.0, false, QI_KV_DROP, KEY_SCORE, 0}},
    {"streaming", "", {4, 1, 0.0, false, QI_KV_DROP, KEY_SCORE, 0}},
    {"streaming", "sinks=1", {1, 1, 0.0, false, QI_KV_DROP, KEY_SCORE, 0}},
    {"h2o", "", {0, 1, 0.5, false, QI_KV_DROP, KEY_SCORE, 0}},
    {"h2o", "heavy=0.3", {0, 1, 0.3, false, QI_KV_DROP, KEY_SCORE, 0}},
    {"h2o", "heavy=1", {0, 1, 1.0, false, QI_KV_DROP, KEY_SCORE, 0}},
    {"qinfer", "", {4, 1, 0.5, false, QI_KV_OFFLOAD, KEY_SCORE, 0}},
    {"qinfer", "windows=4,recall=true", {4, 4, 0.5, true, QI_KV_OFFLOAD, KEY_SCORE, 0}},
    {"qinfer", "sinks=3,windows=3,heavy=0.7,recall=false", {3, 3, 0.7, false, QI_KV_OFFLOAD, KEY_SCORE, 0}},
    {"qinfer", "sinks=1,windows=7,heavy=0.9,offload=false", {1, 7, 0.9, false, QI_KV_DROP, KEY_SCORE, 0}},
    {"qinfer", "windows=16,heavy=0.8,sinks=0,recall=true", {0, 16, 0.8, true, QI_KV_OFFLOAD, KEY_SCORE, 0}},
    {"qinfer", "windows=5,heavy=1,sinks=2,recall=true", {2, 5, 1.0, true, QI_KV_OFFLOAD, KEY_SCORE, 0}},
    {"tova", "", {0, 1, 1.0, false, QI_KV_DROP, KEY_SCORE, 0}},
    {"scissorhands", "", {0, 1, 0.5, false, QI_KV_DROP, KEY_FEWEST_BITS, 0}},
    {"scissorhands", "history=5,heavy=0.8", {0, 1, 0.8, false, QI_KV_DROP, KEY_FEWEST_BITS, 0}},
    {"keyformer", "", {0, 1, 0.5, false, QI_KV_DROP, KEY_SCORE, 0}},
    {"keyformer", "heavy=0.3,noise=false,tau_end=1", {0, 1, 0.3, false, QI_KV_DROP, KEY_SCORE, 0}},
    {"snapkv", "", {0, 1, 0, false, QI_KV_DROP, KEY_SCORE, 32}},
    {"snapkv", "window=5,pool=3", {0, 1, 0, false, QI_KV_DROP, KEY_SCORE, 5}},
    {"qinfer", "judge=8,recall=true", {4, 1, 0.5, true, QI_KV_OFFLOAD, KEY_SCORE, 0}},
    {"qinfer", "judge=0,windows=4,recall=true", {4, 4, 0.5, true, QI_KV_OFFLOAD, KEY_SCORE, 0}},
};
#define N_CONFIGS (int)(sizeof CONFIGS / sizeof *CONFIGS)

START_TEST(policies_match_oracle_on_random_views) {
    uint64_t rng = 2024;
    qi_kv_policy *pol[N_CONFIGS];
    for (int c = 0; c < N_CONFIGS; c++) pol[c] = make(CONFIGS[c].name, CONFIGS[c].spec);
    tview *t = tv_new(1, 1, 3); /* layer 3: past qinfer's full layers */
    const int iters = qi_test_quick() ? 150 : 600;
    for (int it = 0; it < iters; it++) {
        int n = 1 + (int)(qi_test_rand(&rng) % 150);
        /* positions spanning one byte or less, two, and four */
        random_view(t, &rng, n, it % 2 ? 0.25 : 0.0, it % 3 == 0 ? 1 : it % 3 == 1 ? 61 : 40009);
        t->v.budget = 1 + (int)(qi_test_rand(&rng) % (uint64_t)(n + 3));
        for (int c = 0; c < N_CONFIGS; c++) {
            int keep = sel(pol[c], t), compete = 0;
            for (int i = 0; i < n; i++) compete += t->tier[i] == QI_KV_WORKING || CONFIGS[c].r.recall;
            if (keep != (compete < t->v.budget ? compete : t->v.budget)) /* at most the budget, and all of it */
                ck_abort_msg("%s %s: kept %d of %d competitors, budget %d", CONFIGS[c].name, CONFIGS[c].spec, keep,
                             compete, t->v.budget);
            char what[128];
            snprintf(what, sizeof what, "%s %s", CONFIGS[c].name, CONFIGS[c].spec);
            expect_oracle(t, CONFIGS[c].r, what, it);
        }
    }
    for (int c = 0; c < N_CONFIGS; c++) qi_kv_policy_free(pol[c]);
    free(t);
}
END_TEST

/* A small cache: new token in, attention observed, fates applied (dropped
 * tokens leave, swapped with the last slot so slot order drifts from
 * position order). Runs a and b in lockstep on identical streams when b is
 * given, checking a against the oracle for rule r and b's fates against
 * a's. */
static void simulate(qi_kv_policy *a, qi_kv_policy *b, rule r, int budget, int steps, uint64_t seed,
                     const char *what) {
    uint64_t rng = seed;
    tview *t = tv_new(0, budget, 5), *u = tv_new(0, budget, 5);
    int32_t next = 0;
    for (long step = 1; step <= steps; step++) {
        int add = step == 1 ? 1 + (int)(qi_test_rand(&rng) % 40) : 1; /* a prompt, then one token a step */
        for (int k = 0; k < add; k++) {
            int i = t->v.n++;
            t->pos[i] = next++;
            t->tier[i] = QI_KV_WORKING;
            t->score[i] = 0;
        }
        t->v.n_new = add;
        t->v.cur_pos = next - 1;
        t->v.probed = qi_kv_policy_probe(a, step);
        float attn[MAXN];
        for (int i = 0; i < t->v.n; i++) {
            bool seen = t->tier[i] == QI_KV_WORKING || t->v.probed;
            /* a few tokens matter throughout, with noise */
            float base = t->pos[i] % 13 == 0 ? 0.2f : 0.02f;
            attn[i] = seen ? base * (float)(1 + qi_test_rand(&rng) % 4) : 0;
        }
        memcpy(u->pos, t->pos, sizeof(int32_t) * (size_t)t->v.n);
        memcpy(u->tier, t->tier, (size_t)t->v.n);
        memcpy(u->score, t->score, sizeof(float) * (size_t)t->v.n);
        u->v = t->v;
        u->v.pos = u->pos;
        u->v.tier = u->tier;
        u->v.score = u->score;
        qi_kv_policy_observe(a, &t->v, attn);
        sel(a, t);
        expect_oracle(t, r, what, (int)step);
        if (b) {
            qi_kv_policy_observe(b, &u->v, attn);
            sel(b, u);
            for (int i = 0; i < t->v.n; i++) {
                if (t->score[i] != u->score[i])
                    ck_abort_msg("%s step %ld slot %d: score %g vs %g", what, step, i, t->score[i], u->score[i]);
                if (t->fate[i] != u->fate[i])
                    ck_abort_msg("%s step %ld slot %d (position %d): fate %u vs %u", what, step, i, t->pos[i],
                                 t->fate[i], u->fate[i]);
            }
        }
        for (int i = 0; i < t->v.n;) {
            if (t->fate[i] == QI_KV_DROP) {
                int last = --t->v.n;
                t->pos[i] = t->pos[last];
                t->tier[i] = t->tier[last];
                t->score[i] = t->score[last];
                t->fate[i] = t->fate[last];
                continue;
            }
            t->tier[i] = t->fate[i] == QI_KV_KEEP ? QI_KV_WORKING : QI_KV_OFFLOADED;
            i++;
        }
    }
    free(t);
    free(u);
}

START_TEST(policies_match_oracle_while_decoding) {
    for (int c = 0; c < N_CONFIGS; c++) {
        for (int b = 1; b <= 33; b += 8) {
            qi_kv_policy *p = make(CONFIGS[c].name, CONFIGS[c].spec);
            char what[128];
            snprintf(what, sizeof what, "%s %s budget %d", CONFIGS[c].name, CONFIGS[c].spec, b);
            simulate(p, NULL, CONFIGS[c].r, b, qi_test_quick() ? 60 : 200, 100 + (uint64_t)(c * 64 + b), what);
            qi_kv_policy_free(p);
        }
    }
}
END_TEST

/* The reduction: Q-Infer with one window, no sinks, no full layers, no
 * offload, no recall and the plain sum gives exactly H2O's fates. */
static const char *const REDUCED = "windows=1,sinks=0,full_layers=0,offload=false,decay=1";

START_TEST(qinfer_reduces_to_h2o) {
    static const char *const fracs[] = {"0.5", "0.25", "0.8", "0", "1", "0.29"};
    uint64_t rng = 99;
    tview *t = tv_new(1, 1, 0), *u = tv_new(1, 1, 0);
    int views = 0;
    for (size_t f = 0; f < sizeof fracs / sizeof *fracs; f++) {
        char hspec[32], qspec[128];
        snprintf(hspec, sizeof hspec, "heavy=%s", fracs[f]);
        /* recall=false: given, or as the default */
        snprintf(qspec, sizeof qspec, "%s,heavy=%s%s", REDUCED, fracs[f], f % 2 ? ",recall=false" : "");
        qi_kv_policy *h = make("h2o", hspec), *q = make("qinfer", qspec);
        const int iters = qi_test_quick() ? 15 : 60;
        for (int it = 0; it < iters; it++) {
            int n = 1 + (int)(qi_test_rand(&rng) % 80);
            random_view(t, &rng, n, it % 3 == 0 ? 0.2 : 0.0, it % 2 ? 1 : 40009);
            *u = *t;
            u->v.pos = u->pos;
            u->v.tier = u->tier;
            u->v.score = u->score;
            for (int step = 0; step < 4; step++) {
                if (step > 0) {
                    float attn[MAXN];
                    for (int i = 0; i < n; i++)
                        attn[i] = t->tier[i] == QI_KV_WORKING ? (float)(qi_test_rand(&rng) % 5) * 0.25f : 0;
                    qi_kv_policy_observe(h, &t->v, attn);
                    qi_kv_policy_observe(q, &u->v, attn);
                }
                for (int budget = 1; budget <= n + 1; budget++) {
                    t->v.budget = u->v.budget = budget;
                    sel(h, t);
                    sel(q, u);
                    views++;
                    for (int i = 0; i < n; i++) {
                        if (t->score[i] != u->score[i]) ck_abort_msg("slot %d: scores differ", i);
                        if (t->fate[i] != u->fate[i])
                            ck_abort_msg("heavy %s, view %d step %d budget %d slot %d: h2o %u, qinfer %u", fracs[f],
                                         it, step, budget, i, t->fate[i], u->fate[i]);
                    }
                }
            }
        }
        qi_kv_policy_free(h);
        qi_kv_policy_free(q);
        /* and over decoding runs, where fates are applied */
        h = make("h2o", hspec);
        q = make("qinfer", qspec);
        rule r = {0, 1, atof(fracs[f]), false, QI_KV_DROP, KEY_SCORE, 0};
        simulate(h, q, r, 12, 120, 7 + f, "h2o vs reduced qinfer");
        qi_kv_policy_free(h);
        qi_kv_policy_free(q);
    }
    ck_assert_int_gt(views, 1000);
    free(t);
    free(u);
}
END_TEST

/* The comparison above can fail: two windows instead of one must differ
 * from H2O on some random view. */
START_TEST(reduction_check_catches_a_difference) {
    uint64_t rng = 99;
    qi_kv_policy *h = make("h2o", ""), *q = make("qinfer", "windows=2,sinks=0,full_layers=0,offload=false");
    tview *t = tv_new(1, 1, 0);
    uint8_t hf[MAXN];
    int differ = 0;
    for (int it = 0; it < 50 && !differ; it++) {
        int n = 10 + (int)(qi_test_rand(&rng) % 60);
        random_view(t, &rng, n, 0, 1);
        t->v.budget = n / 2;
        sel(h, t);
        memcpy(hf, t->fate, (size_t)n);
        sel(q, t);
        differ = memcmp(hf, t->fate, (size_t)n) != 0;
    }
    ck_assert(differ);
    qi_kv_policy_free(h);
    qi_kv_policy_free(q);
    free(t);
}
END_TEST

/* ---- the wrapper catches broken policies ------------------------------------ */

void keep_all(qi_kv_policy *p, const qi_kv_view *v, uint8_t *fate) {
    for (int i = 0; i < v->n; i++) fate[i] = QI_KV_KEEP;
}
static void bad_value(qi_kv_policy *p, const qi_kv_view *v, uint8_t *fate) {
    for (int i = 0; i < v->n; i++) fate[i] = QI_KV_DROP;
    fate[v->n - 1] = 3;
}
static void forgets_one(qi_kv_policy *p, const qi_kv_view *v, uint8_t *fate) {
    for (int i = 1; i < v->n; i++) fate[i] = QI_KV_DROP;
}
static bool all_exempt(const qi_kv_policy *p, int layer) { return true; }
void no_free(qi_kv_policy *p) {}

static const qi_kv_policy_i GREEDY = {.version = QI_KV_POLICY_VERSION, .name = "planted_greedy",
                                      .select = keep_all, .free = no_free};
static const qi_kv_policy_i BAD_VALUE = {.version = QI_KV_POLICY_VERSION, .name = "planted_value",
                                         .select = bad_value, .free = no_free};
static const qi_kv_policy_i FORGETS = {.version = QI_KV_POLICY_VERSION, .name = "planted_forgets",
                                       .select = forgets_one, .free = no_free};
static const qi_kv_policy_i GREEDY_EXEMPT = {.version = QI_KV_POLICY_VERSION, .name = "planted_exempt",
                                             .select = keep_all, .exempt = all_exempt, .free = no_free};

START_TEST(wrapper_catches_planted_faults) {
    tview *t = tv_new(10, 4, 2);
    qi_err e = {0};
    qi_kv_policy greedy = {.iface = &GREEDY}, bad = {.iface = &BAD_VALUE}, forgets = {.iface = &FORGETS},
                 exempt = {.iface = &GREEDY_EXEMPT};
    ck_assert_int_eq(qi_kv_policy_select(&greedy, &t->v, t->fate, &e), QI_ERR_BACKEND);
    ck_assert_msg(strstr(e.msg, "planted_greedy") && strstr(e.msg, "budget") && strstr(e.msg, "10"), "%s", e.msg);
    qi_err_clear(&e);
    ck_assert_int_eq(qi_kv_policy_select(&bad, &t->v, t->fate, &e), QI_ERR_BACKEND);
    ck_assert_msg(strstr(e.msg, "planted_value") && strstr(e.msg, "fate 3"), "%s", e.msg);
    qi_err_clear(&e);
    ck_assert_int_eq(qi_kv_policy_select(&forgets, &t->v, t->fate, &e), QI_ERR_BACKEND);
    ck_assert_msg(strstr(e.msg, "planted_forgets") && strstr(e.msg, "token 0"), "%s", e.msg);
    qi_err_clear(&e);
    ck_assert_int_eq(qi_kv_policy_select(&exempt, &t->v, t->fate, &e), QI_OK); /* exempt: no budget */
    /* defaults of the optional members */
    ck_assert(!qi_kv_policy_exempt(&greedy, 0));
    ck_assert(!qi_kv_policy_probe(&greedy, 16));
    float attn[10] = {1};
    qi_kv_policy_observe(&greedy, &t->v, attn);
    /* bad views */
    t->v.budget = 0;
    ck_assert_int_eq(qi_kv_policy_select(&exempt, &t->v, t->fate, &e), QI_ERR_INVALID);
    qi_err_clear(&e);
    t->v.budget = 4;
    ck_assert_int_eq(qi_kv_policy_select(&exempt, &t->v, NULL, &e), QI_ERR_INVALID);
    t->v.n = 0;
    ck_assert_int_eq(qi_kv_policy_select(&greedy, &t->v, NULL, NULL), QI_OK);
    free(t);
}
END_TEST

void kv_oracle_add(TCase *tc) {
    tcase_add_test(tc, scores_match_their_definitions);
    tcase_add_test(tc, top_by_score_selects_the_best);
    tcase_add_test(tc, policies_match_oracle_on_random_views);
    tcase_add_test(tc, policies_match_oracle_while_decoding);
    tcase_add_test(tc, qinfer_reduces_to_h2o);
    tcase_add_test(tc, reduction_check_catches_a_difference);
    tcase_add_test(tc, wrapper_catches_planted_faults);
}

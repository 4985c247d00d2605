/* sparq.c - SparQ's token pick and qinfer's fetch of offloaded tokens,
 * against an oracle in double. */
#include "kv_policy_test.h"

/* ---- sparq: single tokens scored on the query's largest components ------------ */

#define SQ_MAXN 700
#define SQ_MAXG 16
#define SQ_MAXD 128

/* A token-pick view: n keys of D fp16 values in blocks of 2^shift rows,
 * group heads of D query values, the attention scale. */
typedef struct {
    qi_kv_pick_view v;
    float q[SQ_MAXG * SQ_MAXD];
    uint16_t keys[SQ_MAXN * SQ_MAXD];
    const uint16_t *blk[SQ_MAXN];
    uint16_t cols[(SQ_MAXN + 64) * SQ_MAXD];
    int picked[SQ_MAXN];
} tsparq;

/* The view's key columns from its keys (kv.h's layout: per block of
 * 2^shift tokens, D columns; zeros past the newest). */
static void ts_cols(tsparq *t) {
    const int n = t->v.n, D = t->v.D, rows = 1 << t->v.k_shift;
    memset(t->cols, 0, sizeof t->cols);
    for (int i = 0; i < n; i++)
        for (int d = 0; d < D; d++)
            t->cols[((size_t)(i / rows) * D + d) * rows + i % rows] = t->keys[(size_t)i * D + d];
    t->v.k_cols = t->cols;
}

/* The newest `tail` tokens shown without columns (the view's k_tail), and
 * their columns poisoned (fp16 NaNs) to catch a read of them; ts_cols
 * restores both. */
static void ts_tail(tsparq *t, int tail) {
    const int n = t->v.n, D = t->v.D, rows = 1 << t->v.k_shift;
    for (int i = n - tail; i < n; i++)
        for (int d = 0; d < D; d++) t->cols[((size_t)(i / rows) * D + d) * rows + i % rows] = 0x7e00;
    t->v.k_tail = tail;
}

/* The same choice, bit for bit, with a random tail of tokens read by rows
 * (kv.h's offload tier shows its newest block so): got tokens in want[]. */
static void expect_same_with_tail(tsparq *t, qi_kv_policy *p, bool fetch, const int *want, int got, uint64_t *rng) {
    static int again[SQ_MAXN];
    ts_tail(t, (int)(qi_test_rand(rng) % (unsigned)(t->v.n + 1)));
    int n2 = -1;
    qi_err e = {0};
    ck_assert_msg((fetch ? qi_kv_policy_fetch : qi_kv_policy_pick)(p, &t->v, again, &n2, &e) == QI_OK, "%s", e.msg);
    ck_assert_msg(n2 == got && memcmp(again, want, sizeof *want * (size_t)got) == 0,
                  "%s with the newest %d of %d tokens by rows: another choice", qi_kv_policy_name(p), t->v.k_tail,
                  t->v.n);
    t->v.k_tail = 0;
    ts_cols(t);
}

static void ts_fill(tsparq *t, int n, int group, int D, int shift, int budget, float scale, uint64_t *rng) {
    ck_assert(n >= 1 && n <= SQ_MAXN && group <= SQ_MAXG && D <= SQ_MAXD);
    for (int i = 0; i < group * D; i++) t->q[i] = 2.0f * qi_test_randf(rng) - 1.0f;
    for (int i = 0; i < n * D; i++) t->keys[i] = qi_f32_to_fp16(3.0f * qi_test_randf(rng) - 1.5f);
    for (int b = 0; (b << shift) < n; b++) t->blk[b] = t->keys + ((size_t)b << shift) * D;
    t->v = (qi_kv_pick_view){.layer = 3, .n_layer = N_LAYER, .group = group, .D = D, .q = t->q, .scale = scale,
                             .n = n, .block = 1, .n_blocks = n, .newest = n - 1, .budget = budget, .tail = 1,
                             .k_blk = t->blk, .k_shift = shift};
    ts_cols(t);
}

/* The oracle, in double and by definition: the r = round(dims x D) (at
 * least 1) components of the largest |q_d| summed over the group (ties to
 * the lower d, by counting); head h's scores c_h q_h . k over them (the
 * query rounded to fp16, as attention rounds it) with
 * c_h = scale sqrt(|q_h|_1 / |q_h on them|_1), softmaxed over all n; a
 * token's score the sum over heads. score[] gets it for every token. */
static void sparq_oracle_scores(const tsparq *t, double dims, double *score) {
    const qi_kv_pick_view *v = &t->v;
    const int D = v->D, G = v->group, n = v->n;
    int r = (int)lround(dims * D);
    r = r < 1 ? 1 : r > D ? D : r;
    bool on[SQ_MAXD] = {false};
    for (int j = 0; j < r; j++) { /* the j-th largest by counting, no sort */
        for (int d = 0; d < D; d++) {
            if (on[d]) continue;
            double md = 0.0;
            for (int h = 0; h < G; h++) md += fabs(v->q[h * D + d]);
            bool best = true;
            for (int e = 0; e < D && best; e++) {
                if (on[e] || e == d) continue;
                double me = 0.0;
                for (int h = 0; h < G; h++) me += fabs(v->q[h * D + e]);
                if ((float)me > (float)md || ((float)me == (float)md && e < d)) best = false;
            }
            if (best) {
                on[d] = true;
                break;
            }
        }
    }
    for (int i = 0; i < n; i++) score[i] = 0.0;
    for (int h = 0; h < G; h++) {
        double all = 0.0, part = 0.0, mx = -INFINITY;
        for (int d = 0; d < D; d++) {
            all += fabs(v->q[h * D + d]);
            if (on[d]) part += fabs(v->q[h * D + d]);
        }
        const double c = v->scale * (part > 0.0 ? sqrt(all / part) : 1.0);
        static double s[SQ_MAXN];
        for (int i = 0; i < n; i++) {
            double u = 0.0;
            for (int d = 0; d < D; d++)
                if (on[d])
                    u += (double)qi_fp16_to_f32(qi_f32_to_fp16(v->q[h * D + d])) *
                         (double)qi_fp16_to_f32(t->keys[(size_t)i * D + d]);
            s[i] = c * u;
            mx = s[i] > mx ? s[i] : mx;
        }
        double sum = 0.0;
        for (int i = 0; i < n; i++) sum += exp(s[i] - mx);
        for (int i = 0; i < n; i++) score[i] += exp(s[i] - mx) / sum;
    }
}

/* sparq's pick through the wrapper against the oracle on random views:
 * 1 to 700 tokens in blocks of 4 and of 64 rows, groups of 1 to 4 heads,
 * 1 to 80 values per head (and three views of 16 heads of 128), dims from one component to all of them,
 * budgets from 1 to past the cache. The pick is the newest token and
 * budget - 1 others in ascending order, the same with a random number of
 * the newest tokens' keys shown by rows alone; every other token it reads scores,
 * by the oracle, at least as well as every token it leaves, up to the
 * float rounding of the scores (1e-5 of the largest); a budget that covers
 * the cache reads every token. */
START_TEST(sparq_pick_matches_oracle) {
    uint64_t rng = 17;
    static tsparq t;
    static double sc[SQ_MAXN];
    static const double dims[] = {1.0, 0.5, 0.125, 0.01};
    static const char *const spec[] = {"dims=1", "dims=0.5", "", "dims=0.01"};
    qi_kv_policy *pol[4];
    for (int f = 0; f < 4; f++) pol[f] = make("sparq", spec[f]);
    int trials = 0, near = 0, whole = 0;
    for (int trial = 0; trial < 400; trial++) {
        /* the first views are wide groups of long heads (16 x 128: more scaled components than any
         * head has values), the rest up to 4 heads of up to 80 */
        const bool wide = trial < 3;
        const int n = wide ? 200 : 1 + (int)(qi_test_rand(&rng) % SQ_MAXN);
        const int G = wide ? 16 : 1 + (int)(qi_test_rand(&rng) % 4), D = wide ? 128 : 1 + (int)(qi_test_rand(&rng) % 80);
        const int budget = 1 + (int)(qi_test_rand(&rng) % (unsigned)(n + 8));
        ts_fill(&t, n, G, D, trial % 2 ? 6 : 2, budget, trial % 3 ? 0.125f : 1.0f, &rng);
        for (int f = 0; f < 4; f++) {
            int got = 0;
            qi_err e = {0};
            ck_assert_msg(qi_kv_policy_pick(pol[f], &t.v, t.picked, &got, &e) == QI_OK, "%s", e.msg);
            const int want = budget < n ? budget : n;
            ck_assert_msg(got == want, "trial %d %s: %d tokens picked, want %d", trial, spec[f], got, want);
            expect_same_with_tail(&t, pol[f], false, t.picked, got, &rng);
            ck_assert_int_eq(t.picked[got - 1], n - 1);
            for (int j = 1; j < got; j++) ck_assert(t.picked[j] > t.picked[j - 1]);
            if (got == n) {
                whole++;
                continue;
            }
            sparq_oracle_scores(&t, dims[f], sc);
            double lo_in = INFINITY, hi_out = -INFINITY, top = 0.0;
            bool in[SQ_MAXN] = {false};
            for (int j = 0; j < got; j++) in[t.picked[j]] = true;
            for (int i = 0; i < n - 1; i++) {
                top = sc[i] > top ? sc[i] : top;
                if (in[i]) lo_in = sc[i] < lo_in ? sc[i] : lo_in;
                else hi_out = sc[i] > hi_out ? sc[i] : hi_out;
            }
            ck_assert_msg(got == 1 || lo_in >= hi_out - 1e-5 * top,
                          "trial %d %s: a token read scores %.9g, one left %.9g (n %d, budget %d, G %d, D %d)",
                          trial, spec[f], lo_in, hi_out, n, budget, G, D);
            near += got > 1 && lo_in < hi_out;
        }
        trials++;
    }
    for (int f = 0; f < 4; f++) qi_kv_policy_free(pol[f]);
    ck_assert(whole > 0);
    printf("sparq: %d random views x 4 dims picked the oracle's best tokens (%d whole caches, %d choices decided "
           "within rounding)\n",
           trials, whole, near);
}
END_TEST

/* Hand-made, one head of 4 values: the key that matches the query is read
 * with the newest; on dims=0.25 only the query's largest component counts,
 * so a key large there wins over one that matches everywhere else; ties go
 * to the newer token; sparq never evicts, its layers below full_layers are
 * exempt; and if the scratch cannot grow it reads the newest tokens. */
START_TEST(sparq_reads_the_matching_token) {
    static tsparq t;
    uint64_t rng = 3;
    ts_fill(&t, 8, 1, 4, 2, 2, 1.0f, &rng);
    for (int i = 0; i < 8 * 4; i++) t.keys[i] = qi_f32_to_fp16(0.0f);
    const float q[4] = {4.0f, 1.0f, 1.0f, 1.0f};
    memcpy(t.q, q, sizeof q);
    for (int d = 1; d < 4; d++) t.keys[2 * 4 + d] = qi_f32_to_fp16(1.0f); /* token 2: 3 on all but d = 0 */
    t.keys[5 * 4] = qi_f32_to_fp16(0.5f);                                  /* token 5: 2 on d = 0 alone */
    ts_cols(&t);
    qi_kv_policy *all = make("sparq", "dims=1"), *one = make("sparq", "dims=0.25");
    int n = 0;
    ck_assert_int_eq(qi_kv_policy_pick(all, &t.v, t.picked, &n, NULL), QI_OK);
    ck_assert(n == 2 && t.picked[0] == 2 && t.picked[1] == 7);
    ck_assert_int_eq(qi_kv_policy_pick(one, &t.v, t.picked, &n, NULL), QI_OK);
    ck_assert(n == 2 && t.picked[0] == 5 && t.picked[1] == 7);
    t.keys[1 * 4] = qi_f32_to_fp16(0.5f); /* token 1 ties token 5: the newer is read */
    ts_cols(&t);
    t.v.budget = 3;
    ck_assert_int_eq(qi_kv_policy_pick(one, &t.v, t.picked, &n, NULL), QI_OK);
    ck_assert(n == 3 && t.picked[0] == 1 && t.picked[1] == 5 && t.picked[2] == 7);
    t.v.budget = 2;
    ck_assert_int_eq(qi_kv_policy_pick(one, &t.v, t.picked, &n, NULL), QI_OK);
    ck_assert(n == 2 && t.picked[0] == 5);
    /* mean=true: the same pick, and each head's estimated share of its
     * attention in it, the oracle's weights summed over the picked tokens */
    {
        qi_kv_policy *mp = make("sparq", "dims=1,mean=true");
        static tsparq u;
        uint64_t r2 = 9;
        ts_fill(&u, 300, 3, 16, 6, 100, 0.25f, &r2);
        float mass[3] = {-1.0f, -1.0f, -1.0f};
        u.v.mass = mass;
        int got = 0, want_idx[300], nw = 0;
        ck_assert_int_eq(qi_kv_policy_pick(all, &u.v, want_idx, &nw, NULL), QI_OK);
        ck_assert_int_eq(qi_kv_policy_pick(mp, &u.v, u.picked, &got, NULL), QI_OK);
        ck_assert_int_eq(got, nw);
        for (int j = 0; j < got; j++) ck_assert_int_eq(u.picked[j], want_idx[j]);
        for (int h = 0; h < 3; h++) { /* head h's softmax over all 300, summed over the picks, in double */
            double mx = -INFINITY, sum = 0.0, in = 0.0, sc[300];
            for (int i = 0; i < 300; i++) {
                double d = 0.0;
                for (int c = 0; c < 16; c++)
                    d += (double)qi_fp16_to_f32(qi_f32_to_fp16(u.q[h * 16 + c])) * qi_fp16_to_f32(u.keys[i * 16 + c]);
                sc[i] = 0.25 * d;
                mx = sc[i] > mx ? sc[i] : mx;
            }
            for (int i = 0; i < 300; i++) sum += exp(sc[i] - mx);
            for (int j = 0; j < got; j++) in += exp(sc[u.picked[j]] - mx) / sum;
            ck_assert_msg(fabs(mass[h] - in) < 1e-4 && in > 0.3 && in < 1.0, "head %d: mass %g, the oracle's %g", h,
                          mass[h], in);
        }
        mass[0] = -1.0f; /* without mean=true the mass is not written */
        ck_assert_int_eq(qi_kv_policy_pick(all, &u.v, u.picked, &got, NULL), QI_OK);
        ck_assert(mass[0] == -1.0f);
        qi_kv_policy_free(mp);
    }
    /* no scratch: the newest budget tokens */
    qi_kv_policy *fresh = make("sparq", "");
    t.v.budget = 3;
    qi_alloc_fail_after(1);
    ck_assert_int_eq(qi_kv_policy_pick(fresh, &t.v, t.picked, &n, NULL), QI_OK);
    qi_alloc_fail_after(0);
    ck_assert(n == 3 && t.picked[0] == 5 && t.picked[1] == 6 && t.picked[2] == 7);
    ck_assert_int_eq(qi_kv_policy_pick(fresh, &t.v, t.picked, &n, NULL), QI_OK);
    ck_assert(n == 3 && t.picked[0] == 1 && t.picked[1] == 5); /* scored again once memory is back */
    /* the view of a token picker needs keys and their columns, not bounds */
    t.v.k_cols = NULL;
    qi_err e = {0};
    ck_assert_int_eq(qi_kv_policy_pick(one, &t.v, t.picked, &n, &e), QI_ERR_INVALID);
    ts_cols(&t);
    t.v.k_blk = NULL;
    ck_assert_int_eq(qi_kv_policy_pick(one, &t.v, t.picked, &n, &e), QI_ERR_INVALID);
    ck_assert(qi_kv_policy_picks(one) && qi_kv_policy_picks_tokens(one));
    qi_kv_policy *qp = make("quest", "");
    ck_assert(qi_kv_policy_picks(qp) && !qi_kv_policy_picks_tokens(qp));
    qi_kv_policy *ex = make("sparq", "full_layers=2");
    ck_assert(qi_kv_policy_exempt(ex, 1) && !qi_kv_policy_exempt(ex, 2) && !qi_kv_policy_exempt(one, 0));
    tview *tv = tv_new(10, 3, 4);
    ck_assert_int_eq(qi_kv_policy_select(one, &tv->v, tv->fate, NULL), QI_OK);
    for (int i = 0; i < 10; i++) ck_assert_int_eq(tv->fate[i], QI_KV_KEEP);
    free(tv);
    qi_kv_policy_free(all);
    qi_kv_policy_free(one);
    qi_kv_policy_free(fresh);
    qi_kv_policy_free(qp);
    qi_kv_policy_free(ex);
}
END_TEST

/* ---- qinfer fetch=: offloaded tokens read by the query ------------------------ */

/* qinfer's fetch through the wrapper against the oracle, on random views
 * of an offload tier (the token-pick views above; fetch has no newest
 * token to keep): budgets from 0 to past the tier, dims from one
 * component to all. The fetch is min(budget, n) distinct tokens in
 * ascending order, the same with a random number of the newest tokens'
 * keys shown by rows alone (as the cache shows its newest block), and
 * every token fetched scores, by the oracle, at
 * least as well as every token left, up to the float rounding of the
 * scores (1e-5 of the largest). */
START_TEST(qinfer_fetch_matches_oracle) {
    uint64_t rng = 29;
    static tsparq t;
    static double sc[SQ_MAXN];
    static const double dims[] = {1.0, 0.25, 0.125, 0.01};
    static const char *const spec[] = {"fetch=0.5,fetch_dims=1", "fetch=0.1,fetch_dims=0.25", "fetch=0.25",
                                       "fetch=0.9,fetch_dims=0.01"};
    qi_kv_policy *pol[4];
    for (int f = 0; f < 4; f++) {
        pol[f] = make("qinfer", spec[f]);
        ck_assert(qi_kv_policy_fetches(pol[f]) && !qi_kv_policy_picks(pol[f]));
    }
    int whole = 0, none = 0, scored = 0;
    for (int trial = 0; trial < 300; trial++) {
        const bool wide = trial < 2;
        const int n = wide ? 200 : 1 + (int)(qi_test_rand(&rng) % SQ_MAXN);
        const int G = wide ? 16 : 1 + (int)(qi_test_rand(&rng) % 4), D = wide ? 128 : 1 + (int)(qi_test_rand(&rng) % 80);
        const int budget = (int)(qi_test_rand(&rng) % (unsigned)(n + 8));
        ts_fill(&t, n, G, D, trial % 2 ? 6 : 2, budget, trial % 3 ? 0.125f : 1.0f, &rng);
        for (int f = 0; f < 4; f++) {
            int got = -1;
            qi_err e = {0};
            ck_assert_msg(qi_kv_policy_fetch(pol[f], &t.v, t.picked, &got, &e) == QI_OK, "%s", e.msg);
            const int want = budget < n ? budget : n;
            ck_assert_msg(got == want, "trial %d %s: %d tokens fetched, want %d", trial, spec[f], got, want);
            expect_same_with_tail(&t, pol[f], true, t.picked, got, &rng);
            for (int j = 1; j < got; j++) ck_assert(t.picked[j] > t.picked[j - 1]);
            if (got == 0 || got == n) {
                none += got == 0;
                whole += got == n;
                continue;
            }
            sparq_oracle_scores(&t, dims[f], sc);
            double lo_in = INFINITY, hi_out = -INFINITY, top = 0.0;
            bool in[SQ_MAXN] = {false};
            for (int j = 0; j < got; j++) in[t.picked[j]] = true;
            for (int i = 0; i < n; i++) {
                top = sc[i] > top ? sc[i] : top;
                if (in[i]) lo_in = sc[i] < lo_in ? sc[i] : lo_in;
                else hi_out = sc[i] > hi_out ? sc[i] : hi_out;
            }
            ck_assert_msg(lo_in >= hi_out - 1e-5 * top,
                          "trial %d %s: a token fetched scores %.9g, one left %.9g (n %d, budget %d, G %d, D %d)",
                          trial, spec[f], lo_in, hi_out, n, budget, G, D);
            scored++;
        }
    }
    for (int f = 0; f < 4; f++) qi_kv_policy_free(pol[f]);
    ck_assert(whole > 0 && none > 0 && scored > 500);
    printf("qinfer fetch: %d random offload tiers x 4 settings fetched the oracle's best tokens (%d scored)\n", 300,
           scored);
}
END_TEST

/* fetch=F leaves room: at a budget B qinfer keeps exactly what it keeps
 * without fetch at B - round(F x B) (at least 1), on random views with
 * offloaded tokens, sinks, windows and the mean rank; the ada= positions
 * shrink the same way. fetch=0 (the default) fetches nothing and is
 * qinfer as before; only qinfer fetches. Hand-made: the key matching the
 * query is fetched, the one matching on the largest component alone at
 * fetch_dims=0.25. Bad views and non-fetching policies are refused; no
 * scratch: nothing fetched. */
START_TEST(qinfer_fetch_leaves_room) {
    uint64_t rng = 41;
    static const char *const spec[][2] = {{"fetch=0.25", ""},
                                          {"fetch=0.5,windows=3,sinks=2", "windows=3,sinks=2"},
                                          {"fetch=0.1,mean=true,full_layers=0", "mean=true,full_layers=0"}};
    for (int k = 0; k < 3; k++) {
        const double F = k == 0 ? 0.25 : k == 1 ? 0.5 : 0.1;
        qi_kv_policy *with = make("qinfer", spec[k][0]), *without = make("qinfer", spec[k][1]);
        for (int it = 0; it < 300; it++) {
            const int n = 2 + (int)(qi_test_rand(&rng) % 300), B = 1 + (int)(qi_test_rand(&rng) % (unsigned)n);
            long h = B - lround(F * B);
            h = h < 1 ? 1 : h;
            tview *a = tv_new(n, B, 3), *b = tv_new(n, (int)h, 3);
            random_view(a, &rng, n, 0.3, 1);
            memcpy(b->pos, a->pos, sizeof a->pos);
            memcpy(b->tier, a->tier, sizeof a->tier);
            memcpy(b->score, a->score, sizeof a->score);
            b->v.n = a->v.n;
            b->v.cur_pos = a->v.cur_pos;
            const int ka = sel(with, a), kb = sel(without, b);
            ck_assert_int_eq(ka, kb);
            ck_assert_int_le(ka, h);
            for (int i = 0; i < n; i++) ck_assert_int_eq(a->fate[i], b->fate[i]);
            int o1, n1, o2, n2;
            with->iface->by_position(with, B, &o1, &n1);
            without->iface->by_position(without, (int)h, &o2, &n2);
            ck_assert(o1 == o2 && n1 == n2);
            free(a);
            free(b);
        }
        qi_kv_policy_free(with);
        qi_kv_policy_free(without);
    }
    /* the default fetches a quarter; a cache that cannot fetch turns a
     * default off (the whole budget working again), not one asked for */
    qi_kv_policy *def = make_as_is("qinfer", ""), *h2o = make("h2o", ""), *sq = make("sparq", "");
    qi_kv_policy *asked = make_as_is("qinfer", "fetch=0.25"), *none = make_as_is("qinfer", "offload=false");
    ck_assert(qi_kv_policy_fetches(def) && qi_kv_policy_fetches(asked) && !qi_kv_policy_fetches(none));
    ck_assert(!qi_kv_policy_fetches(h2o) && !qi_kv_policy_fetches(sq));
    ck_assert(!qi_kv_policy_fetch_off(asked) && qi_kv_policy_fetches(asked));
    ck_assert(!qi_kv_policy_fetch_off(h2o));
    {
        tview *a = tv_new(40, 16, 3), *b = tv_new(40, 16, 3);
        ck_assert_int_eq(sel(def, a), 12); /* 16 - round(0.25 x 16) */
        ck_assert(qi_kv_policy_fetch_off(def) && !qi_kv_policy_fetches(def));
        ck_assert_int_eq(sel(def, b), 16);
        free(a);
        free(b);
    }
    qi_kv_policy_free(asked);
    qi_kv_policy_free(none);
    static tsparq t;
    ts_fill(&t, 8, 1, 4, 2, 1, 1.0f, &rng);
    for (int i = 0; i < 8 * 4; i++) t.keys[i] = qi_f32_to_fp16(0.0f);
    const float q[4] = {4.0f, 1.0f, 1.0f, 1.0f};
    memcpy(t.q, q, sizeof q);
    for (int d = 1; d < 4; d++) t.keys[2 * 4 + d] = qi_f32_to_fp16(1.0f); /* token 2: 3 on all but d = 0 */
    t.keys[5 * 4] = qi_f32_to_fp16(0.5f);                                  /* token 5: 2 on d = 0 alone */
    ts_cols(&t);
    qi_err e = {0};
    int n = -1;
    ck_assert_int_eq(qi_kv_policy_fetch(def, &t.v, t.picked, &n, &e), QI_ERR_UNSUPPORTED);
    ck_assert_msg(strstr(e.msg, "qinfer") && strstr(e.msg, "fetches no"), "%s", e.msg);
    qi_err_clear(&e);
    ck_assert_int_eq(qi_kv_policy_fetch(h2o, &t.v, t.picked, &n, NULL), QI_ERR_UNSUPPORTED);
    qi_kv_policy *all = make("qinfer", "fetch=0.25,fetch_dims=1"), *one = make("qinfer", "fetch=0.25,fetch_dims=0.25");
    ck_assert_int_eq(qi_kv_policy_fetch(all, &t.v, t.picked, &n, NULL), QI_OK);
    ck_assert(n == 1 && t.picked[0] == 2);
    ck_assert_int_eq(qi_kv_policy_fetch(one, &t.v, t.picked, &n, NULL), QI_OK);
    ck_assert(n == 1 && t.picked[0] == 5);
    t.v.budget = 0; /* no room: nothing, without a call */
    ck_assert_int_eq(qi_kv_policy_fetch(one, &t.v, t.picked, &n, NULL), QI_OK);
    ck_assert_int_eq(n, 0);
    t.v.budget = 2;
    qi_kv_policy *fresh = make("qinfer", "fetch=0.25,fetch_dims=1");
    qi_alloc_fail_after(1);
    ck_assert_int_eq(qi_kv_policy_fetch(fresh, &t.v, t.picked, &n, NULL), QI_OK);
    qi_alloc_fail_after(0);
    ck_assert_int_eq(n, 0);
    ck_assert_int_eq(qi_kv_policy_fetch(fresh, &t.v, t.picked, &n, NULL), QI_OK);
    ck_assert(n == 2 && t.picked[0] == 2 && t.picked[1] == 5); /* scored once memory is back */
    /* every key the same, so every weight: the ties go to the newest slots, with or without a tail by rows */
    for (int i = 0; i < 8 * 4; i++) t.keys[i] = qi_f32_to_fp16(0.25f);
    ts_cols(&t);
    t.v.budget = 3;
    for (int tail = 0; tail <= 8; tail += 4) {
        ts_tail(&t, tail);
        ck_assert_int_eq(qi_kv_policy_fetch(all, &t.v, t.picked, &n, NULL), QI_OK);
        ck_assert(n == 3 && t.picked[0] == 5 && t.picked[1] == 6 && t.picked[2] == 7);
        ts_cols(&t);
    }
    t.v.k_tail = 9; /* a tail past the tier */
    ck_assert_int_eq(qi_kv_policy_fetch(one, &t.v, t.picked, &n, &e), QI_ERR_INVALID);
    ck_assert_msg(strstr(e.msg, "k_tail 9"), "%s", e.msg);
    qi_err_clear(&e);
    t.v.k_tail = -1;
    ck_assert_int_eq(qi_kv_policy_fetch(one, &t.v, t.picked, &n, &e), QI_ERR_INVALID);
    t.v.k_tail = 0;
    t.v.k_cols = NULL;
    ck_assert_int_eq(qi_kv_policy_fetch(one, &t.v, t.picked, &n, &e), QI_ERR_INVALID);
    ts_cols(&t);
    t.v.budget = -1;
    ck_assert_int_eq(qi_kv_policy_fetch(one, &t.v, t.picked, &n, &e), QI_ERR_INVALID);
    qi_kv_policy_free(def);
    qi_kv_policy_free(h2o);
    qi_kv_policy_free(sq);
    qi_kv_policy_free(all);
    qi_kv_policy_free(one);
    qi_kv_policy_free(fresh);
}
END_TEST

/* Planted faults in fetch(): too many tokens, one out of range, one twice;
 * each QI_ERR_BACKEND naming the policy; unsorted picks are sorted. */
static int fetch_over(qi_kv_policy *p, const qi_kv_pick_view *v, int *tok) {
    for (int i = 0; i <= v->budget; i++) tok[i] = i;
    return v->budget + 1;
}
static int fetch_range(qi_kv_policy *p, const qi_kv_pick_view *v, int *tok) {
    tok[0] = v->n;
    return 1;
}
static int fetch_twice(qi_kv_policy *p, const qi_kv_pick_view *v, int *tok) {
    tok[0] = tok[1] = 1;
    return 2;
}
static int fetch_unsorted(qi_kv_policy *p, const qi_kv_pick_view *v, int *tok) {
    tok[0] = 3;
    tok[1] = 0;
    return 2;
}
static const qi_kv_policy_i FETCH_OVER = {.version = QI_KV_POLICY_VERSION, .name = "planted_over",
                                          .select = keep_all, .fetch = fetch_over, .free = no_free};
static const qi_kv_policy_i FETCH_RANGE = {.version = QI_KV_POLICY_VERSION, .name = "planted_range",
                                           .select = keep_all, .fetch = fetch_range, .free = no_free};
static const qi_kv_policy_i FETCH_TWICE = {.version = QI_KV_POLICY_VERSION, .name = "planted_twice",
                                           .select = keep_all, .fetch = fetch_twice, .free = no_free};
static const qi_kv_policy_i FETCH_UNSORTED = {.version = QI_KV_POLICY_VERSION, .name = "planted_unsorted",
                                              .select = keep_all, .fetch = fetch_unsorted, .free = no_free};

START_TEST(fetch_wrapper_catches_planted_faults) {
    static tsparq t;
    uint64_t rng = 5;
    ts_fill(&t, 8, 1, 4, 2, 2, 1.0f, &rng);
    qi_kv_policy over = {.iface = &FETCH_OVER}, range = {.iface = &FETCH_RANGE}, twice = {.iface = &FETCH_TWICE},
                 unsorted = {.iface = &FETCH_UNSORTED};
    qi_err e = {0};
    int n = 0;
    ck_assert_int_eq(qi_kv_policy_fetch(&over, &t.v, t.picked, &n, &e), QI_ERR_BACKEND);
    ck_assert_msg(strstr(e.msg, "planted_over") && strstr(e.msg, "fetched 3"), "%s", e.msg);
    qi_err_clear(&e);
    ck_assert_int_eq(qi_kv_policy_fetch(&range, &t.v, t.picked, &n, &e), QI_ERR_BACKEND);
    ck_assert_msg(strstr(e.msg, "planted_range") && strstr(e.msg, "out of range"), "%s", e.msg);
    qi_err_clear(&e);
    ck_assert_int_eq(qi_kv_policy_fetch(&twice, &t.v, t.picked, &n, &e), QI_ERR_BACKEND);
    ck_assert_msg(strstr(e.msg, "planted_twice") && strstr(e.msg, "twice"), "%s", e.msg);
    ck_assert_int_eq(qi_kv_policy_fetch(&unsorted, &t.v, t.picked, &n, NULL), QI_OK);
    ck_assert(n == 2 && t.picked[0] == 0 && t.picked[1] == 3);
}
END_TEST

void kv_sparq_add(TCase *tc) {
    tcase_add_test(tc, sparq_pick_matches_oracle);
    tcase_add_test(tc, sparq_reads_the_matching_token);
    tcase_add_test(tc, qinfer_fetch_matches_oracle);
    tcase_add_test(tc, qinfer_fetch_leaves_room);
    tcase_add_test(tc, fetch_wrapper_catches_planted_faults);
}

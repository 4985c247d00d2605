/* ada.c - Ada-KV's head budgets (ada=) against a brute force. */
#include "kv_policy_test.h"

/* ---- Ada-KV's head budgets (ada=) -----------------------------------------
 * The brute force: each head's window is its `oldest` oldest and `newest`
 * newest tokens by position (counting, ties to the higher slot); every
 * other token of every head is ranked by counting the tokens that beat it
 * (higher rank key, then newer position, then the higher head, then the
 * higher slot); a head's floor is its f_h best within itself, f computed
 * on the budget beyond the window, and of the rest the R best over all
 * heads are won. */

#define ADA_HEADS 5

/* Does token (h, i) beat token (g, j)? key: KEY_SCORE or KEY_FEWEST_BITS. */
static bool ada_beats(tview *const *t, int key, int h, int i, int g, int j) {
    g_key = key;
    const float a = key_of(t[h], i), b = key_of(t[g], j);
    if (a != b) return a > b;
    if (t[h]->pos[i] != t[g]->pos[j]) return t[h]->pos[i] > t[g]->pos[j];
    return h != g ? h > g : i > j;
}

/* Per head: in_window[h][i] (kept by position), floor[h][i] (in its head's
 * f_h best candidates) and the budgets. */
static void ada_oracle(tview *const *t, int n, int budget, int oldest, int newest, double ada, int key,
                       int *budgets, uint8_t in_window[][MAXN], uint8_t floor_of[][MAXN], uint8_t won[][MAXN]) {
    const int S = budget - oldest - newest;
    int f = (int)floor((double)S * (1.0 - ada) + 1e-9);
    if (S > 0 && f < 1) f = 1;
    if (f > S) f = S;
    long R = (long)n * budget;
    for (int h = 0; h < n; h++) {
        const int m = t[h]->v.n;
        int c = 0, wh = 0;
        for (int i = 0; i < m; i++) {
            int older = 0, nw = 0;
            for (int j = 0; j < m; j++) {
                older += newer(t[h], i, j);
                nw += newer(t[h], j, i);
            }
            /* the oldest; then the newest of the rest (every token newer
             * than one of the rest is of the rest) */
            in_window[h][i] = older < oldest || nw < newest;
            wh += in_window[h][i];
            c += !in_window[h][i];
        }
        const int fh = f < c ? f : c;
        for (int i = 0; i < m; i++) {
            int above = 0;
            for (int j = 0; j < m; j++) above += !in_window[h][j] && ada_beats(t, key, h, j, h, i);
            floor_of[h][i] = !in_window[h][i] && above < fh;
        }
        budgets[h] = wh + fh;
        R -= wh + fh;
    }
    for (int h = 0; h < n; h++)
        for (int i = 0; i < t[h]->v.n; i++) {
            won[h][i] = 0;
            if (floor_of[h][i] || in_window[h][i]) continue;
            long above = 0;
            for (int g = 0; g < n; g++)
                for (int j = 0; j < t[g]->v.n; j++)
                    above += !floor_of[g][j] && !in_window[g][j] && ada_beats(t, key, g, j, h, i);
            if (above < R) {
                won[h][i] = 1;
                budgets[h]++;
            }
        }
}

static uint8_t g_window[ADA_HEADS][MAXN], g_floor[ADA_HEADS][MAXN], g_won[ADA_HEADS][MAXN];

/* qi_kv_rank_ada_budgets against the brute force on random heads (some
 * empty, some smaller than the floor, tied scores, shuffled slots, equal
 * positions) with random windows (none in a quarter of the cases, as
 * tova; some filling the budget), the candidates marked as the registry
 * marks them; and the budgets' sum: the heads times the budget, or every
 * token held when there are fewer; and every head at least its window. */
START_TEST(ada_budgets_match_brute_force) {
    uint64_t rng = 91;
    static const double adas[] = {0.0, 0.2, 0.5, 0.9, 1.0};
    tview *t[ADA_HEADS];
    for (int h = 0; h < ADA_HEADS; h++) t[h] = tv_new(0, 1, 3);
    qi_kv_item *items = malloc(sizeof *items * ADA_HEADS * 200);
    ck_assert_ptr_nonnull(items);
    static uint8_t cand[ADA_HEADS][MAXN];
    const uint8_t *cands[ADA_HEADS];
    for (int it = 0; it < 600; it++) {
        const int n = 1 + (int)(qi_test_rand(&rng) % ADA_HEADS), budget = 1 + (int)(qi_test_rand(&rng) % 60);
        const double ada = adas[qi_test_rand(&rng) % 5];
        int oldest = 0, newest = 0;
        if (it % 4 != 0) {
            oldest = (int)(qi_test_rand(&rng) % 5);
            if (oldest > budget) oldest = budget;
            newest = (int)(qi_test_rand(&rng) % (uint64_t)(budget - oldest + 1));
        }
        const int key = it % 4 == 3 ? KEY_FEWEST_BITS : KEY_SCORE;
        long held = 0;
        for (int h = 0; h < n; h++) {
            const int m = (int)(qi_test_rand(&rng) % 8 == 0 ? qi_test_rand(&rng) % 3 : qi_test_rand(&rng) % 200);
            random_view(t[h], &rng, m, 0.1, 1);
            if (key == KEY_FEWEST_BITS)
                for (int i = 0; i < m; i++) t[h]->score[i] = (float)(qi_test_rand(&rng) % 64);
            held += m;
        }
        qi_kv_view v[ADA_HEADS];
        for (int h = 0; h < n; h++) {
            v[h] = t[h]->v;
            qi_kv_rank_begin(&v[h], true, cand[h]);
            qi_kv_rank_mark_by_pos(&v[h], cand[h], oldest, false, QI_KV_KEEP);
            qi_kv_rank_mark_by_pos(&v[h], cand[h], newest, true, QI_KV_KEEP);
            cands[h] = cand[h];
        }
        int got[ADA_HEADS], want[ADA_HEADS];
        qi_kv_rank_ada_budgets(v, n, budget, oldest + newest, ada, key == KEY_FEWEST_BITS ? sh_rank_ref : NULL,
                               it % 4 == 0 && it % 8 == 0 ? NULL : cands, items, got);
        ada_oracle(t, n, budget, oldest, newest, ada, key, want, g_window, g_floor, g_won);
        long sum = 0;
        for (int h = 0; h < n; h++) {
            ck_assert_msg(got[h] == want[h],
                          "case %d (heads %d, budget %d, window %d + %d, ada %g): head %d budget %d, oracle %d", it, n,
                          budget, oldest, newest, ada, h, got[h], want[h]);
            int w = 0;
            for (int i = 0; i < t[h]->v.n; i++) {
                ck_assert_msg(g_window[h][i] == (cand[h][i] == QI_KV_KEEP), "case %d head %d slot %d: window", it, h,
                              i);
                w += g_window[h][i];
            }
            ck_assert_int_ge(got[h], w);
            sum += got[h];
        }
        const long full = (long)n * budget;
        ck_assert_msg(sum == (held < full ? held : full), "case %d: budgets sum to %ld of %ld (held %ld)", it, sum,
                      full, held);
        /* ada 0 with every head full is the uniform budget (a head holding
         * fewer tokens than its floor leaves the rest to the others) */
        bool all_full = true;
        for (int h = 0; h < n; h++) all_full &= t[h]->v.n >= budget;
        for (int h = 0; ada == 0.0 && all_full && h < n; h++) ck_assert_int_eq(got[h], budget);
    }
    free(items);
    for (int h = 0; h < ADA_HEADS; h++) free(t[h]);
}
END_TEST

/* Decide n heads through qi_kv_policy_decide, attention all zero (h2o's
 * and snapkv's scores stay as set) or, for scissorhands, all equal. */
static void decide_heads(qi_kv_policy *p, tview *const *t, int n) {
    static float zero[MAXN], one[MAXN];
    for (int i = 0; i < MAXN; i++) one[i] = 1.0f;
    const bool sh = strcmp(qi_kv_policy_name(p), "scissorhands") == 0;
    qi_kv_view v[ADA_HEADS];
    const float *attn[ADA_HEADS];
    uint8_t *fate[ADA_HEADS];
    for (int h = 0; h < n; h++) {
        v[h] = t[h]->v;
        attn[h] = sh ? one : zero;
        fate[h] = t[h]->fate;
    }
    qi_err e = {0};
    ck_assert_msg(qi_kv_policy_decide(p, v, n, attn, fate, &e) == QI_OK, "%s", e.msg);
}

/* Two heads of ten tokens, budget 4 each, h2o keeping only scores: head 0
 * scores 10..19 by position, head 1 scores 0..9. ada=1: head 1 is sure of
 * its best token only, and head 0 wins the other six; ada=0.5: two and
 * six; ada=0: four each. With h2o's default split each head keeps its two
 * newest and only the other two places a head move. */
START_TEST(ada_moves_budget_to_the_heavier_head) {
    static const struct {
        const char *spec;
        int k0, k1;
    } cases[] = {{"heavy=1,ada=1", 7, 1}, {"heavy=1,ada=0.5", 6, 2}, {"heavy=1", 4, 4}, {"heavy=1,ada=0", 4, 4},
                 /* a recent window of two a head stays; of the other two
                  * places a head, head 1 is sure of one and head 0 wins
                  * the other three */
                 {"heavy=0.5,ada=1", 5, 3}};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        qi_kv_policy *p = make("h2o", cases[c].spec);
        tview *t[2] = {tv_new(10, 4, 1), tv_new(10, 4, 1)};
        t[1]->v.kv_head = 1;
        for (int i = 0; i < 10; i++) {
            t[0]->score[i] = 10.0f + (float)i;
            t[1]->score[i] = (float)i;
        }
        ck_assert(qi_kv_policy_heads_together(p) == (strstr(cases[c].spec, "ada=0.5") || strstr(cases[c].spec, "ada=1")));
        decide_heads(p, t, 2);
        int32_t keep0[10], keep1[10];
        for (int i = 0; i < cases[c].k0; i++) keep0[i] = 9 - i;
        for (int i = 0; i < cases[c].k1; i++) keep1[i] = 9 - i;
        expect_kept(t[0], keep0, cases[c].k0, QI_KV_DROP);
        expect_kept(t[1], keep1, cases[c].k1, QI_KV_DROP);
        qi_kv_policy_free(p);
        free(t[0]);
        free(t[1]);
    }
}
END_TEST

/* Through the wrapper, on random heads: h2o and tova with heavy scores
 * only keep exactly the oracle's floors and winnings; scissorhands
 * (heavy=1, ranked by its rank()) likewise on its masks; with a recent
 * window (h2o at its default split, with pyramid= too; scissorhands;
 * snapkv's window; qinfer's sinks and recent tokens, one window) every
 * head keeps exactly its window at the layer's budget plus the oracle's
 * floors and winnings on the rest; every head keeps its budget, which sum
 * to the heads times the layer's budget (pyramid= applied first). */
START_TEST(ada_policies_keep_the_oracle_set) {
    static const struct {
        const char *name, *spec;
        int key;
        int sinks;    /* the oldest kept by position */
        double heavy; /* the newest: (lb - sinks) - floor((lb - sinks) x heavy) */
        int window;   /* > 0: the newest are min(window, lb) instead */
    } cases[] = {{"h2o", "heavy=1,ada=0.5", KEY_SCORE, 0, 1.0, 0},
                 {"tova", "ada=1", KEY_SCORE, 0, 1.0, 0},
                 {"scissorhands", "heavy=1,ada=0.7", KEY_FEWEST_BITS, 0, 1.0, 0},
                 {"h2o", "ada=0.8,pyramid=0.5", KEY_SCORE, 0, 0.5, 0},
                 {"h2o", "heavy=0.3,ada=1", KEY_SCORE, 0, 0.3, 0},
                 {"scissorhands", "heavy=0.5,ada=0.8", KEY_FEWEST_BITS, 0, 0.5, 0},
                 {"snapkv", "window=3,ada=0.5", KEY_SCORE, 0, 0.0, 3},
                 {"qinfer", "sinks=2,windows=1,full_layers=0,offload=false,recall=false,ada=0.8", KEY_SCORE, 2, 0.5,
                  0}};
    uint64_t rng = 5;
    tview *t[ADA_HEADS];
    for (int h = 0; h < ADA_HEADS; h++) t[h] = tv_new(0, 1, 5);
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        qi_kv_policy *p = make(cases[c].name, cases[c].spec);
        for (int it = 0; it < 60; it++) {
            const int n = 2 + (int)(qi_test_rand(&rng) % (ADA_HEADS - 1)), budget = 1 + (int)(qi_test_rand(&rng) % 50);
            for (int h = 0; h < n; h++) {
                random_view(t[h], &rng, (int)(qi_test_rand(&rng) % 150), 0.0, 1);
                t[h]->v.kv_head = h;
                t[h]->v.budget = budget;
                if (cases[c].key == KEY_FEWEST_BITS)
                    for (int i = 0; i < t[h]->v.n; i++) t[h]->score[i] = (float)(qi_test_rand(&rng) % 4096);
            }
            decide_heads(p, t, n);
            /* the oracle on the scores after observe() */
            const int lb = qi_kv_policy_layer_budget(p, 5, budget);
            int want[ADA_HEADS];
            const double ada = atof(strstr(cases[c].spec, "ada=") + 4);
            const int sinks = cases[c].sinks < lb ? cases[c].sinks : lb,
                      newest = cases[c].window > 0 ? (cases[c].window < lb ? cases[c].window : lb)
                                                   : lb - sinks - (int)floor((lb - sinks) * cases[c].heavy + 1e-9);
            ada_oracle(t, n, lb, sinks, newest, ada, cases[c].key, want, g_window, g_floor, g_won);
            long kept = 0, held = 0;
            for (int h = 0; h < n; h++) {
                int k = 0;
                for (int i = 0; i < t[h]->v.n; i++) {
                    k += t[h]->fate[i] == QI_KV_KEEP;
                    ck_assert_msg((t[h]->fate[i] == QI_KV_KEEP) == (g_window[h][i] || g_floor[h][i] || g_won[h][i]),
                                  "%s %s case %d head %d slot %d (position %d): fate %u, oracle %s", cases[c].name,
                                  cases[c].spec, it, h, i, t[h]->pos[i], t[h]->fate[i],
                                  g_window[h][i]  ? "window"
                                  : g_floor[h][i] ? "floor"
                                  : g_won[h][i]   ? "won"
                                                  : "evict");
                }
                ck_assert_msg(k == want[h], "%s %s case %d head %d: kept %d, budget %d", cases[c].name, cases[c].spec,
                              it, h, k, want[h]);
                kept += k;
                held += t[h]->v.n;
            }
            const long full = (long)n * lb;
            ck_assert_int_eq(kept, held < full ? held : full);
        }
        qi_kv_policy_free(p);
    }
    for (int h = 0; h < ADA_HEADS; h++) free(t[h]);
}
END_TEST

static void noop_observe(qi_kv_policy *p, qi_kv_view *v, const float *attn) {}

/* The wrapper holds each head to its share, not to the nominal budget:
 * a policy keeping 60 tokens a head passes at budget 60 uniform and fails
 * where ada= gives the lighter head less. */
START_TEST(ada_wrapper_holds_heads_to_their_share) {
    static const qi_kv_policy_i KEEP60 = {
        .version = QI_KV_POLICY_VERSION, .name = "planted_60", .select = keep_60, .observe = noop_observe};
    tview *t[2] = {tv_new(200, 60, 0), tv_new(200, 60, 0)};
    t[1]->v.kv_head = 1;
    for (int i = 0; i < 200; i++) {
        t[0]->score[i] = 2.0f;
        t[1]->score[i] = 1.0f;
    }
    static float zero[200];
    qi_kv_view v[2] = {t[0]->v, t[1]->v};
    const float *attn[2] = {zero, zero};
    uint8_t *fate[2] = {t[0]->fate, t[1]->fate};
    qi_err e = {0};
    qi_kv_policy k60 = {.iface = &KEEP60, .n_layer = N_LAYER};
    ck_assert_int_eq(qi_kv_policy_decide(&k60, v, 2, attn, fate, &e), QI_OK);
    k60.ada = 0.5; /* head 1 is sure of 30 only; head 0 wins the other 60 */
    ck_assert_int_eq(qi_kv_policy_decide(&k60, v, 2, attn, fate, &e), QI_ERR_BACKEND);
    ck_assert_msg(strstr(e.msg, "kept 60 tokens, over the budget of 30") && strstr(e.msg, "KV head 1"), "%s", e.msg);
    qi_free(k60.ada_items);
    free(t[0]);
    free(t[1]);
}
END_TEST

void kv_ada_add(TCase *tc) {
    tcase_add_test(tc, ada_budgets_match_brute_force);
    tcase_add_test(tc, ada_moves_budget_to_the_heavier_head);
    tcase_add_test(tc, ada_policies_keep_the_oracle_set);
    tcase_add_test(tc, ada_wrapper_holds_heads_to_their_share);
}

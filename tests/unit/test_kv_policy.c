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
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "kv.h"
#include "kv/kv_policy.h"
#include "kv/rank_int.h"
#include "qinfer/quant.h"
#include "testutil.h"

#define MAXN 4096
#define N_LAYER 8

typedef struct {
    qi_kv_view v;
    int32_t pos[MAXN];
    uint8_t tier[MAXN];
    float score[MAXN];
    uint8_t fate[MAXN];
} tview;

/* n working tokens at positions 0..n-1 in slot order, scores 0. */
static tview *tv_new(int n, int budget, int layer) {
    ck_assert_int_le(n, MAXN);
    tview *t = calloc(1, sizeof *t);
    ck_assert_ptr_nonnull(t);
    for (int i = 0; i < n; i++) t->pos[i] = i;
    t->v = (qi_kv_view){.layer = layer, .n_layer = N_LAYER, .n = n, .pos = t->pos, .tier = t->tier,
                        .score = t->score, .cur_pos = n - 1, .budget = budget};
    return t;
}

/* qinfer's selection rules are tested at its working budget: without
 * fetch= in the spec it is made with fetch=0, so that it keeps the whole
 * budget working (fetch's share is tested on its own, qinfer_fetch_*;
 * make_as_is makes the defaults). */
static qi_kv_policy *make_as_is(const char *name, const char *spec);

static qi_kv_policy *make(const char *name, const char *spec) {
    if (strcmp(name, "qinfer") == 0 && !strstr(spec, "fetch=")) {
        char s[512];
        snprintf(s, sizeof s, "fetch=0%s%s", *spec ? "," : "", spec);
        return make_as_is(name, s);
    }
    return make_as_is(name, spec);
}

static qi_kv_policy *make_as_is(const char *name, const char *spec) {
    qi_params pa;
    qi_params_init(&pa);
    qi_err e = {0};
    ck_assert_msg(qi_params_parse(&pa, spec, &e) == QI_OK, "%s", e.msg);
    qi_kv_policy *p = NULL;
    ck_assert_msg(qi_kv_policy_create(name, &pa, N_LAYER, &p, &e) == QI_OK, "%s %s: %s", name, spec, e.msg);
    ck_assert_ptr_nonnull(p);
    ck_assert_str_eq(qi_kv_policy_name(p), name);
    return p;
}

/* select through the wrapper; returns the KEEP count. */
static int sel(qi_kv_policy *p, tview *t) {
    qi_err e = {0};
    if (qi_kv_policy_select(p, &t->v, t->fate, &e) != QI_OK) ck_abort_msg("%s", e.msg);
    int keep = 0;
    for (int i = 0; i < t->v.n; i++) keep += t->fate[i] == QI_KV_KEEP;
    return keep;
}

static uint8_t fate_at(const tview *t, int32_t pos) {
    for (int i = 0; i < t->v.n; i++)
        if (t->pos[i] == pos) return t->fate[i];
    ck_abort_msg("no token at position %d", pos);
    return 0xFF;
}

/* Exactly the positions in keep[] are KEEP; every other working token has
 * fate `evict`. */
static void expect_kept(const tview *t, const int32_t *keep, int n_keep, uint8_t evict) {
    for (int i = 0; i < t->v.n; i++) {
        bool want = false;
        for (int k = 0; k < n_keep; k++) want |= t->pos[i] == keep[k];
        uint8_t exp = want ? QI_KV_KEEP : t->tier[i] == QI_KV_OFFLOADED ? QI_KV_OFFLOAD : evict;
        ck_assert_msg(t->fate[i] == exp, "position %d: fate %u, want %u", t->pos[i], t->fate[i], exp);
    }
}

static void shuffle(tview *t, uint64_t *rng) {
    for (int i = t->v.n - 1; i > 0; i--) {
        int j = (int)(qi_test_rand(rng) % (uint64_t)(i + 1));
        int32_t p = t->pos[i];
        t->pos[i] = t->pos[j];
        t->pos[j] = p;
        uint8_t r = t->tier[i];
        t->tier[i] = t->tier[j];
        t->tier[j] = r;
        float s = t->score[i];
        t->score[i] = t->score[j];
        t->score[j] = s;
    }
}

/* ---- the oracle ----------------------------------------------------------
 * Every bounded policy is one rule with different settings: window is
 * (sinks 0, heavy 0), streaming (sinks, heavy 0), h2o (sinks 0, one window,
 * heavy), qinfer everything. Decisions by counting, per token, how many
 * competitors rank above it. */

/* What the scored tokens are ranked by: the score itself, or (for
 * scissorhands, whose score is a bit mask of unimportant steps) the fewest
 * bits set. */
enum { KEY_SCORE = 0, KEY_FEWEST_BITS };

typedef struct {
    int sinks, windows;
    double heavy;
    bool recall;   /* offloaded tokens compete */
    uint8_t evict; /* QI_KV_DROP or QI_KV_OFFLOAD */
    int key;       /* KEY_SCORE unless given */
    int recent_n;  /* > 0: recent = min(recent_n, budget - sinks) and the rest scored (snapkv), not by heavy */
} rule;

static bool newer(const tview *t, int i, int j) { return t->pos[i] != t->pos[j] ? t->pos[i] > t->pos[j] : i > j; }

static int bits_set(float mask) {
    int c = 0;
    for (uint32_t m = (uint32_t)mask; m; m >>= 1) c += (int)(m & 1u);
    return c;
}

static int g_key; /* the rule's key, for better() */

static float sh_rank_ref(float mask) { return -(float)bits_set(mask); }

static float key_of(const tview *t, int i) {
    return g_key == KEY_FEWEST_BITS ? -(float)bits_set(t->score[i]) : t->score[i];
}

static bool better(const tview *t, int i, int j) {
    const float a = key_of(t, i), b = key_of(t, j);
    return a != b ? a > b : newer(t, i, j);
}

enum { R_OUT, R_SINK, R_RECENT, R_OLD, R_OLD_KEPT, R_CARRY_KEPT };

static void oracle(const tview *t, rule r, uint8_t *f) {
    const int n = t->v.n, B = t->v.budget;
    static int role[MAXN], win[MAXN];
    g_key = r.key;
    int m = 0;
    for (int i = 0; i < n; i++) {
        bool c = t->tier[i] == QI_KV_WORKING || r.recall;
        role[i] = c ? R_OLD : R_OUT;
        m += c;
    }
    if (m > B) {
        int s = r.sinks < B ? r.sinks : B;
        for (int i = 0; i < n; i++) {
            if (role[i] == R_OUT) continue;
            int older = 0;
            for (int j = 0; j < n; j++) older += role[j] != R_OUT && newer(t, i, j);
            if (older < s) role[i] = R_SINK;
        }
        int heavy = (int)floor((double)(B - s) * r.heavy + 1e-9), recent = B - s - heavy;
        if (r.recent_n > 0) {
            recent = r.recent_n < B - s ? r.recent_n : B - s;
            heavy = B - s - recent;
        }
        /* the recent window; of a policy that offloads (qinfer), the
         * newest working tokens at positions past every offloaded token,
         * places it cannot fill going to the scored tokens */
        int32_t newest_off = INT32_MIN;
        for (int i = 0; r.evict == QI_KV_OFFLOAD && i < n; i++)
            if (t->tier[i] == QI_KV_OFFLOADED && t->pos[i] > newest_off) newest_off = t->pos[i];
        int reach = 0;
        for (int i = 0; i < n; i++) reach += role[i] == R_OLD && t->tier[i] == QI_KV_WORKING && t->pos[i] > newest_off;
        if (recent > reach) {
            heavy += recent - reach;
            recent = reach;
        }
        for (int i = 0; i < n; i++) {
            if (role[i] != R_OLD || t->tier[i] != QI_KV_WORKING || t->pos[i] <= newest_off) continue;
            int nw = 0;
            for (int j = 0; j < n; j++)
                nw += (role[j] == R_OLD || role[j] == R_RECENT) && t->tier[j] == QI_KV_WORKING &&
                      t->pos[j] > newest_off && newer(t, j, i);
            if (nw < recent) role[i] = R_RECENT;
        }
        if (heavy > 0) {
            int32_t pmin = INT32_MAX, pmax = INT32_MIN;
            for (int i = 0; i < n; i++)
                if (role[i] == R_OLD) {
                    if (t->pos[i] < pmin) pmin = t->pos[i];
                    if (t->pos[i] > pmax) pmax = t->pos[i];
                }
            const int W = r.windows;
            int64_t span = (int64_t)pmax - pmin + 1;
            int cnt[64] = {0}, quota[64];
            if (W > 64) ck_abort_msg("oracle: at most 64 windows");
            for (int w = 0; w < W; w++) quota[w] = heavy / W + (w >= W - heavy % W);
            for (int i = 0; i < n; i++)
                if (role[i] == R_OLD) cnt[win[i] = (int)(((int64_t)t->pos[i] - pmin) * W / span)]++;
            int carry = 0;
            for (int w = 0; w < W; w++) carry += quota[w] > cnt[w] ? quota[w] - cnt[w] : 0;
            for (int i = 0; i < n; i++) {
                if (role[i] != R_OLD) continue;
                int above = 0;
                for (int j = 0; j < n; j++)
                    above += (role[j] == R_OLD || role[j] == R_OLD_KEPT) && win[j] == win[i] && better(t, j, i);
                if (above < quota[win[i]]) role[i] = R_OLD_KEPT;
            }
            for (int i = 0; i < n; i++) {
                if (role[i] != R_OLD) continue;
                int above = 0;
                for (int j = 0; j < n; j++) above += (role[j] == R_OLD || role[j] == R_CARRY_KEPT) && better(t, j, i);
                if (above < carry) role[i] = R_CARRY_KEPT;
            }
        }
    }
    for (int i = 0; i < n; i++)
        f[i] = role[i] == R_OUT ? QI_KV_OFFLOAD : role[i] == R_OLD && m > B ? r.evict : QI_KV_KEEP;
}

static void expect_oracle(const tview *t, rule r, const char *what, int iter) {
    static uint8_t want[MAXN];
    oracle(t, r, want);
    for (int i = 0; i < t->v.n; i++)
        if (t->fate[i] != want[i])
            ck_abort_msg("%s, case %d (n %d, budget %d): slot %d position %d score %g tier %u: fate %u, oracle %u",
                         what, iter, t->v.n, t->v.budget, i, t->pos[i], t->score[i], t->tier[i], t->fate[i], want[i]);
}

/* Random positions with gaps (0 sometimes: duplicates must still be
 * decided deterministically; every gap times `stride`, so that positions
 * span more than one byte, or several), shuffled slots, tied scores. */
static void random_view(tview *t, uint64_t *rng, int n, double p_off, int32_t stride) {
    int32_t p = (int32_t)(qi_test_rand(rng) % 50);
    for (int i = 0; i < n; i++) {
        uint64_t g = qi_test_rand(rng) % 100;
        p += (g < 3 ? 0 : g < 80 ? 1 : (int32_t)(g % 17)) * stride;
        t->pos[i] = p;
        t->tier[i] = (qi_test_rand(rng) % 1000) < (uint64_t)(p_off * 1000) ? QI_KV_OFFLOADED : QI_KV_WORKING;
        t->score[i] = (float)(qi_test_rand(rng) % 9) * 0.125f;
    }
    t->v.n = n;
    t->v.cur_pos = p;
    shuffle(t, rng);
}

/* ---- hand-made cases ------------------------------------------------------ */

START_TEST(full_keeps_everything) {
    qi_kv_policy *p = make("full", "");
    tview *t = tv_new(10, 3, 5);
    t->tier[4] = QI_KV_OFFLOADED;
    float attn[10] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
    qi_kv_policy_observe(p, &t->v, attn); /* no observe(): nothing changes */
    ck_assert(t->score[0] == 0);
    ck_assert_int_eq(sel(p, t), 10);
    for (int l = 0; l < N_LAYER; l++) ck_assert(qi_kv_policy_exempt(p, l));
    for (long s = 1; s <= 100; s++) ck_assert(!qi_kv_policy_probe(p, s));
    qi_kv_policy_free(p);
    free(t);
}
END_TEST

START_TEST(window_keeps_newest) {
    uint64_t rng = 7;
    qi_kv_policy *p = make("window", "");
    tview *t = tv_new(20, 5, 0);
    for (int i = 0; i < 20; i++) t->score[i] = (float)(20 - i); /* scores must not matter */
    shuffle(t, &rng);
    ck_assert_int_eq(sel(p, t), 5);
    expect_kept(t, (int32_t[]){15, 16, 17, 18, 19}, 5, QI_KV_DROP);
    ck_assert(!qi_kv_policy_exempt(p, 0));
    ck_assert(!qi_kv_policy_probe(p, 16));
    /* an offloaded token (never made by window) stays put and does not count */
    t->tier[0] = QI_KV_OFFLOADED;
    int32_t off = t->pos[0];
    ck_assert_int_eq(sel(p, t), 5);
    ck_assert_int_eq(fate_at(t, off), QI_KV_OFFLOAD);
    /* under budget: all kept */
    t->tier[0] = QI_KV_WORKING;
    t->v.budget = 20;
    ck_assert_int_eq(sel(p, t), 20);
    t->v.budget = 100;
    ck_assert_int_eq(sel(p, t), 20);
    qi_kv_policy_free(p);
    free(t);
}
END_TEST

START_TEST(streaming_keeps_sinks) {
    uint64_t rng = 11;
    qi_kv_policy *p = make("streaming", "");
    tview *t = tv_new(20, 8, 0);
    shuffle(t, &rng);
    ck_assert_int_eq(sel(p, t), 8);
    expect_kept(t, (int32_t[]){0, 1, 2, 3, 16, 17, 18, 19}, 8, QI_KV_DROP);
    /* budget <= sinks: the sinks are capped at the budget */
    t->v.budget = 3;
    ck_assert_int_eq(sel(p, t), 3);
    expect_kept(t, (int32_t[]){0, 1, 2}, 3, QI_KV_DROP);
    t->v.budget = 4;
    ck_assert_int_eq(sel(p, t), 4);
    expect_kept(t, (int32_t[]){0, 1, 2, 3}, 4, QI_KV_DROP);
    qi_kv_policy_free(p);
    p = make("streaming", "sinks=2");
    t->v.budget = 5;
    ck_assert_int_eq(sel(p, t), 5);
    expect_kept(t, (int32_t[]){0, 1, 17, 18, 19}, 5, QI_KV_DROP);
    qi_kv_policy_free(p);
    p = make("streaming", "sinks=0"); /* a plain window */
    ck_assert_int_eq(sel(p, t), 5);
    expect_kept(t, (int32_t[]){15, 16, 17, 18, 19}, 5, QI_KV_DROP);
    qi_kv_policy_free(p);
    free(t);
}
END_TEST

/* A token far back that keeps drawing attention survives H2O; the window
 * drops it. */
START_TEST(h2o_keeps_heavy_hitter_far_back) {
    uint64_t rng = 3;
    qi_kv_policy *h = make("h2o", ""), *w = make("window", "");
    tview *t = tv_new(32, 8, 1);
    for (int step = 0; step < 10; step++) {
        float attn[32];
        for (int i = 0; i < 32; i++) attn[i] = 0.01f + 0.001f * (float)(qi_test_rand(&rng) % 10);
        attn[2] = 0.5f;
        attn[9] = 0.3f;
        qi_kv_policy_observe(h, &t->v, attn);
    }
    ck_assert(t->score[2] > 4.9f && t->score[2] < 5.1f);
    ck_assert_int_eq(sel(h, t), 8); /* heavy 4, recent 4 */
    ck_assert_int_eq(fate_at(t, 2), QI_KV_KEEP);
    ck_assert_int_eq(fate_at(t, 9), QI_KV_KEEP);
    for (int32_t q = 28; q < 32; q++) ck_assert_int_eq(fate_at(t, q), QI_KV_KEEP);
    for (int i = 0; i < 32; i++) ck_assert_int_ne(t->fate[i], QI_KV_OFFLOAD); /* h2o drops */
    ck_assert_int_eq(sel(w, t), 8);
    ck_assert_int_eq(fate_at(t, 2), QI_KV_DROP);
    qi_kv_policy_free(h);
    qi_kv_policy_free(w);
    free(t);
}
END_TEST

START_TEST(h2o_ties_go_to_newer) {
    qi_kv_policy *h = make("h2o", "heavy=0.5");
    tview *t = tv_new(10, 4, 0); /* heavy 2, recent 2 (8, 9) */
    for (int i = 0; i < 10; i++) t->score[i] = 1.0f;
    ck_assert_int_eq(sel(h, t), 4);
    expect_kept(t, (int32_t[]){6, 7, 8, 9}, 4, QI_KV_DROP);
    t->score[1] = 2.0f;
    ck_assert_int_eq(sel(h, t), 4);
    expect_kept(t, (int32_t[]){1, 7, 8, 9}, 4, QI_KV_DROP);
    qi_kv_policy_free(h);
    /* heavy=1: no recent window at all; heavy=0: a plain window */
    h = make("h2o", "heavy=1");
    ck_assert_int_eq(sel(h, t), 4);
    expect_kept(t, (int32_t[]){1, 7, 8, 9}, 4, QI_KV_DROP);
    t->score[3] = 3.0f;
    t->score[4] = 3.0f;
    ck_assert_int_eq(sel(h, t), 4);
    expect_kept(t, (int32_t[]){1, 3, 4, 9}, 4, QI_KV_DROP);
    qi_kv_policy_free(h);
    h = make("h2o", "heavy=0");
    ck_assert_int_eq(sel(h, t), 4);
    expect_kept(t, (int32_t[]){6, 7, 8, 9}, 4, QI_KV_DROP);
    qi_kv_policy_free(h);
    free(t);
}
END_TEST

/* Four heavy hitters clustered in the oldest window: H2O keeps all four,
 * Q-Infer with 4 windows keeps the best of each window. */
START_TEST(qinfer_spreads_over_windows) {
    uint64_t rng = 5;
    qi_kv_policy *q = make("qinfer", "sinks=0,windows=4,full_layers=0,offload=false");
    qi_kv_policy *h = make("h2o", "");
    tview *t = tv_new(40, 8, 0); /* heavy 4, recent 4 (36..39); older 0..35: windows 0-8, 9-17, 18-26, 27-35 */
    for (int i = 0; i < 40; i++) t->score[i] = 0.1f;
    t->score[1] = 10;
    t->score[2] = 9;
    t->score[3] = 8;
    t->score[4] = 7;
    t->score[12] = 1;
    t->score[20] = 2;
    t->score[30] = 3;
    shuffle(t, &rng);
    ck_assert_int_eq(sel(h, t), 8);
    expect_kept(t, (int32_t[]){1, 2, 3, 4, 36, 37, 38, 39}, 8, QI_KV_DROP);
    ck_assert_int_eq(sel(q, t), 8);
    expect_kept(t, (int32_t[]){1, 12, 20, 30, 36, 37, 38, 39}, 8, QI_KV_DROP);
    qi_kv_policy_free(q);
    /* 6 heavy over 4 windows: quotas 1, 1, 2, 2 (the remainder to the newest) */
    q = make("qinfer", "sinks=0,windows=4,full_layers=0,offload=false,heavy=0.6");
    t->v.budget = 10; /* heavy 6, recent 4 */
    ck_assert_int_eq(sel(q, t), 10);
    /* window 2 (18-26): 20, then the newest 0.1 tie (26); window 3 (27-35): 30 and 35 */
    expect_kept(t, (int32_t[]){1, 12, 20, 26, 30, 35, 36, 37, 38, 39}, 10, QI_KV_DROP);
    qi_kv_policy_free(q);
    qi_kv_policy_free(h);
    free(t);
}
END_TEST

/* Windows with too few tokens pass their quota to the best leftovers. */
START_TEST(qinfer_passes_unused_quota) {
    qi_kv_policy *q = make("qinfer", "sinks=0,windows=4,full_layers=0");
    const int32_t pos[14] = {0, 1, 2, 3, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39};
    const float score[14] = {5, 4, 3, 0, 1, 0.5f, 0, 0, 0, 0, 0, 0, 0, 0};
    tview *t = tv_new(14, 8, 3);
    memcpy(t->pos, pos, sizeof pos);
    memcpy(t->score, score, sizeof score);
    /* older 0..35: window 0 holds 0-3, windows 1 and 2 are empty, window 3
     * holds 30-35; quotas 1 each, 2 passed on: positions 1 and 2 */
    ck_assert_int_eq(sel(q, t), 8);
    expect_kept(t, (int32_t[]){0, 1, 2, 30, 36, 37, 38, 39}, 8, QI_KV_OFFLOAD);
    qi_kv_policy_free(q);
    free(t);
}
END_TEST

START_TEST(qinfer_sinks_and_full_layers) {
    qi_kv_policy *q = make("qinfer", "sinks=2,windows=1");
    tview *t = tv_new(30, 10, 2); /* sinks 0, 1; heavy 4, recent 4 */
    for (int i = 0; i < 30; i++) t->score[i] = (float)i; /* the sinks score lowest */
    ck_assert_int_eq(sel(q, t), 10);
    expect_kept(t, (int32_t[]){0, 1, 22, 23, 24, 25, 26, 27, 28, 29}, 10, QI_KV_OFFLOAD);
    ck_assert(qi_kv_policy_exempt(q, 0) && qi_kv_policy_exempt(q, 1));
    ck_assert(!qi_kv_policy_exempt(q, 2) && !qi_kv_policy_exempt(q, N_LAYER - 1));
    for (int l = 0; l < 2; l++) {
        t->v.layer = l;
        ck_assert_int_eq(sel(q, t), 30);
    }
    qi_kv_policy_free(q);
    q = make("qinfer", "sinks=0,full_layers=0");
    ck_assert(!qi_kv_policy_exempt(q, 0));
    t->v.layer = 0;
    ck_assert_int_eq(sel(q, t), 10);
    qi_kv_policy_free(q);
    q = make("qinfer", "sinks=0,full_layers=8"); /* every layer: the full cache */
    for (int l = 0; l < N_LAYER; l++) ck_assert(qi_kv_policy_exempt(q, l));
    qi_kv_policy_free(q);
    free(t);
}
END_TEST

START_TEST(qinfer_offload_and_probe) {
    qi_kv_policy *q = make("qinfer", "sinks=0,windows=1,full_layers=0,recall=true");
    tview *t = tv_new(20, 6, 0);
    ck_assert_int_eq(sel(q, t), 6);
    int off = 0;
    for (int i = 0; i < 20; i++) off += t->fate[i] == QI_KV_OFFLOAD;
    ck_assert_int_eq(off, 14);
    for (long s = 1; s <= 64; s++) ck_assert(qi_kv_policy_probe(q, s) == (s % 16 == 0));
    ck_assert(!qi_kv_policy_probe(q, 0));
    qi_kv_policy_free(q);
    static const char *const never[] = {"recall=false", "offload=false,recall=true", "probe_every=0,recall=true",
                                        "" /* the default: recall=false */};
    for (int k = 0; k < 4; k++) {
        q = make("qinfer", never[k]);
        for (long s = 1; s <= 64; s++) ck_assert_msg(!qi_kv_policy_probe(q, s), "%s, step %ld", never[k], s);
        qi_kv_policy_free(q);
    }
    q = make("qinfer", "sinks=0,probe_every=1,recall=true");
    for (long s = 1; s <= 10; s++) ck_assert(qi_kv_policy_probe(q, s));
    qi_kv_policy_free(q);
    q = make("qinfer", "sinks=0,offload=off,full_layers=0");
    ck_assert_int_eq(sel(q, t), 6);
    for (int i = 0; i < 20; i++) ck_assert_int_ne(t->fate[i], QI_KV_OFFLOAD);
    qi_kv_policy_free(q);
    free(t);
}
END_TEST

/* An offloaded token whose score rises above a kept one comes back. */
/* mean=true ranks by weight per step cached. 32 tokens, cur_pos 31,
 * budget 4 = 2 recent (30, 31) + 2 heavy, one window, no sinks. Sums:
 * position 0 has 3.2 (0.1 a step over 32 steps), 10 has 2.8 (0.127 over
 * 22), 25 has 1.4 (0.2 over 7): the sum keeps 0 and 10, the mean 25 and 10. */
START_TEST(qinfer_mean_score) {
    const char *base = "windows=1,sinks=0,full_layers=0,offload=false,recall=false,heavy=0.5";
    for (int mean = 0; mean < 2; mean++) {
        char spec[160];
        snprintf(spec, sizeof spec, "%s,mean=%s", base, mean ? "true" : "false");
        qi_kv_policy *q = make("qinfer", spec);
        tview *t = tv_new(32, 4, 3);
        t->score[0] = 3.2f;
        t->score[10] = 2.8f;
        t->score[25] = 1.4f;
        ck_assert_int_eq(sel(q, t), 4);
        const int32_t kept_sum[] = {0, 10, 30, 31}, kept_mean[] = {10, 25, 30, 31};
        expect_kept(t, mean ? kept_mean : kept_sum, 4, QI_KV_DROP);
        qi_kv_policy_free(q);
        free(t);
    }
}
END_TEST

/* decay: token 1 drew 1.0 a step for 10 steps, then nothing; token 6
 * nothing, then 1.0 a step for the last 5. 12 tokens, budget 2 = 1 recent
 * (11) + 1 heavy, one window, no sinks. The plain sum keeps 1 (10 against
 * 5); so does the default, decay 0.99 (0.99^5 (1 - 0.99^10) / 0.01 =
 * 9.0932 against (1 - 0.99^5) / 0.01 = 4.9010); at decay 0.8 token 1 is
 * down to 0.8^5 (1 - 0.8^10) / 0.2 = 1.4625 and token 6 has (1 - 0.8^5) /
 * 0.2 = 3.3616, so 6 is kept. */
START_TEST(qinfer_decay_prefers_recent_weight) {
    const char *base = "windows=1,sinks=0,full_layers=0,offload=false,recall=false,heavy=0.5";
    static const char *const decays[] = {",decay=1", "", ",decay=0.8"};
    static const float want1[] = {10.0f, 9.0932f, 1.4625f}, want6[] = {5.0f, 4.9010f, 3.3616f};
    for (int k = 0; k < 3; k++) {
        char spec[160];
        snprintf(spec, sizeof spec, "%s%s", base, decays[k]);
        qi_kv_policy *q = make("qinfer", spec);
        tview *t = tv_new(12, 2, 3);
        for (int step = 0; step < 15; step++) {
            float attn[12] = {0};
            attn[step < 10 ? 1 : 6] = 1.0f;
            qi_kv_policy_observe(q, &t->v, attn);
        }
        const bool decayed = k == 2;
        ck_assert_msg(fabsf(t->score[1] - want1[k]) < 1e-3f, "%s: score %g", spec, t->score[1]);
        ck_assert_msg(fabsf(t->score[6] - want6[k]) < 1e-3f, "%s: score %g", spec, t->score[6]);
        ck_assert_int_eq(sel(q, t), 2);
        expect_kept(t, (int32_t[]){decayed ? 6 : 1, 11}, 2, QI_KV_DROP);
        qi_kv_policy_free(q);
        free(t);
    }
}
END_TEST

/* An offloaded token has no weight measured between probes: its score
 * waits, and decays only on probe steps. */
START_TEST(qinfer_decay_waits_for_probes) {
    qi_kv_policy *q = make("qinfer", "sinks=0,windows=1,full_layers=0,decay=0.5");
    tview *t = tv_new(4, 2, 3);
    const float s0[4] = {2.0f, 2.0f, 0, 0};
    memcpy(t->score, s0, sizeof s0);
    t->tier[1] = QI_KV_OFFLOADED;
    float attn[4] = {0.25f, 0, 0.5f, 1.0f};
    qi_kv_policy_observe(q, &t->v, attn); /* not probed */
    ck_assert(t->score[0] == 1.25f && t->score[1] == 2.0f && t->score[2] == 0.5f && t->score[3] == 1.0f);
    t->v.probed = true;
    attn[1] = 0.5f;
    qi_kv_policy_observe(q, &t->v, attn);
    ck_assert(t->score[0] == 0.875f && t->score[1] == 1.5f && t->score[2] == 0.75f && t->score[3] == 1.5f);
    qi_kv_policy_free(q);
    free(t);
}
END_TEST

/* catch_up: on a probe step an offloaded token's weight counts for the
 * probe_every steps since the last probe (decayed as a working token's
 * would have been: 1 + d + ... + d^(k-1)), working tokens' once; off
 * probe steps nothing changes for offloaded tokens. A token that draws a
 * kept one's weight at the probe is recalled in its place. */
START_TEST(qinfer_catch_up_counts_the_unmeasured_steps) {
    static const struct {
        const char *spec;
        float w; /* the offloaded token's multiplier */
        float d;
    } cfg[] = {{"sinks=0,full_layers=0,probe_every=4,catch_up=true,recall=true,decay=1", 4.0f, 1.0f},
               {"sinks=0,full_layers=0,probe_every=2,decay=0.5,catch_up=true,recall=true", 1.5f, 0.5f},
               {"sinks=0,full_layers=0,probe_every=4,recall=true,decay=1", 1.0f, 1.0f},
               {"sinks=0,full_layers=0,probe_every=0,catch_up=true,recall=true,decay=1", 1.0f, 1.0f}};
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
        qi_kv_policy *q = make("qinfer", cfg[c].spec);
        tview *t = tv_new(4, 2, 3);
        const float s0[4] = {2.0f, 2.0f, 0, 0};
        memcpy(t->score, s0, sizeof s0);
        t->tier[1] = QI_KV_OFFLOADED;
        float attn[4] = {0.25f, 0, 0.5f, 1.0f};
        qi_kv_policy_observe(q, &t->v, attn); /* not probed: the offloaded score waits */
        const float d = cfg[c].d;
        ck_assert(t->score[0] == d * 2.0f + 0.25f && t->score[1] == 2.0f && t->score[3] == 1.0f);
        t->v.probed = true;
        attn[1] = 0.5f;
        const float before0 = t->score[0];
        qi_kv_policy_observe(q, &t->v, attn);
        ck_assert_msg(t->score[1] == d * 2.0f + cfg[c].w * 0.5f, "%s: offloaded score %g", cfg[c].spec, t->score[1]);
        ck_assert(t->score[0] == d * before0 + 0.25f);
        qi_kv_policy_free(q);
        free(t);
    }
    /* recall: kept 0, 1, 2 with scores 1.0, 0.9, 0.8; token 3 offloaded at
     * 0.1 draws 0.2 at the probe: 0.3 alone, 0.1 + 16 x 0.2 = 3.3 caught up */
    for (int cu = 0; cu < 2; cu++) {
        qi_kv_policy *q = make("qinfer", cu ? "sinks=0,full_layers=0,recall=true,decay=1,catch_up=true"
                                            : "sinks=0,full_layers=0,recall=true,decay=1");
        tview *t = tv_new(10, 6, 4); /* heavy 3, recent 3 (7, 8, 9) */
        const float s0[10] = {1.0f, 0.9f, 0.8f, 0.1f, 0, 0, 0, 0, 0, 0};
        memcpy(t->score, s0, sizeof s0);
        for (int i = 3; i <= 6; i++) t->tier[i] = QI_KV_OFFLOADED;
        t->v.probed = true;
        float attn[10] = {0};
        attn[3] = 0.2f;
        qi_kv_policy_observe(q, &t->v, attn);
        ck_assert_int_eq(sel(q, t), 6);
        expect_kept(t, cu ? (int32_t[]){0, 1, 3, 7, 8, 9} : (int32_t[]){0, 1, 2, 7, 8, 9}, 6, QI_KV_OFFLOAD);
        qi_kv_policy_free(q);
        free(t);
    }
}
END_TEST

START_TEST(qinfer_recall) {
    qi_kv_policy *q = make("qinfer", "sinks=0,windows=1,full_layers=0,probe_every=4,recall=true");
    tview *t = tv_new(10, 6, 4); /* heavy 3, recent 3 (7, 8, 9) */
    const float s0[10] = {1.0f, 0.9f, 0.8f, 0.1f, 0, 0, 0, 0, 0, 0};
    memcpy(t->score, s0, sizeof s0);
    t->tier[3] = QI_KV_OFFLOADED;
    ck_assert_int_eq(sel(q, t), 6);
    expect_kept(t, (int32_t[]){0, 1, 2, 7, 8, 9}, 6, QI_KV_OFFLOAD);
    /* apply: 4, 5, 6 go to the offload tier */
    for (int i = 4; i <= 6; i++) t->tier[i] = QI_KV_OFFLOADED;
    ck_assert(qi_kv_policy_probe(q, 4));
    t->v.probed = true;
    float attn[10];
    for (int i = 0; i < 10; i++) attn[i] = 0.01f;
    attn[3] = 2.0f; /* the probe shows token 3 matters now */
    qi_kv_policy_observe(q, &t->v, attn);
    ck_assert_int_eq(sel(q, t), 6);
    ck_assert_int_eq(t->fate[3], QI_KV_KEEP);                /* recalled */
    ck_assert_int_eq(t->fate[2], QI_KV_OFFLOAD);             /* the weakest kept one makes room */
    for (int i = 4; i <= 6; i++) ck_assert_int_eq(t->fate[i], QI_KV_OFFLOAD);
    expect_kept(t, (int32_t[]){0, 1, 3, 7, 8, 9}, 6, QI_KV_OFFLOAD);
    qi_kv_policy_free(q);
    /* recall off: the offloaded token stays there whatever its score */
    q = make("qinfer", "sinks=0,windows=1,full_layers=0,recall=false");
    ck_assert_int_eq(sel(q, t), 6);
    ck_assert_int_eq(t->fate[3], QI_KV_OFFLOAD);
    qi_kv_policy_free(q);
    free(t);
}
END_TEST

/* TOVA ranks by this step's weight alone: a token heavy in the past but
 * ignored now goes; ties go to the newer position. */
START_TEST(tova_keeps_what_the_query_attends_to) {
    uint64_t rng = 13;
    qi_kv_policy *p = make("tova", ""), *h = make("h2o", "heavy=1");
    tview *t = tv_new(10, 3, 2), *u = tv_new(10, 3, 2);
    float past[10] = {5, 0, 0, 0, 0, 0, 0, 0, 0, 0}, now[10] = {0.01f, 0, 0.3f, 0, 0, 0.2f, 0, 0, 0, 0.1f};
    qi_kv_policy_observe(p, &t->v, past);
    qi_kv_policy_observe(h, &u->v, past);
    qi_kv_policy_observe(p, &t->v, now);
    qi_kv_policy_observe(h, &u->v, now);
    ck_assert(t->score[0] == 0.01f && t->score[2] == 0.3f); /* this step's weight, not a sum */
    shuffle(t, &rng);
    ck_assert_int_eq(sel(p, t), 3);
    expect_kept(t, (int32_t[]){2, 5, 9}, 3, QI_KV_DROP);
    ck_assert_int_eq(sel(h, u), 3); /* the sum keeps the old heavy hitter */
    expect_kept(u, (int32_t[]){0, 2, 5}, 3, QI_KV_DROP);
    /* equal weights: the newest */
    float flat[10] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
    qi_kv_policy_observe(p, &t->v, flat);
    ck_assert_int_eq(sel(p, t), 3);
    expect_kept(t, (int32_t[]){7, 8, 9}, 3, QI_KV_DROP);
    ck_assert(!qi_kv_policy_exempt(p, 0) && !qi_kv_policy_probe(p, 16));
    qi_kv_policy_free(p);
    qi_kv_policy_free(h);
    free(t);
    free(u);
}
END_TEST

/* Eight steps over tokens 0..7, budget 4 = 2 recent (6, 7) + 2 scored.
 * Token 1 is above the step's mean every step, token 2 only in the last
 * four, token 3 only in the first four, 0, 4 and 5 never. Over a history
 * of 4 steps tokens 1 and 2 have no unimportant step: kept. Over 8, token
 * 1 has none and 2 and 3 four each: the tie goes to the newer, 3. */
START_TEST(scissorhands_counts_unimportant_steps) {
    for (int k = 0; k < 2; k++) {
        qi_kv_policy *p = make("scissorhands", k ? "history=8,heavy=0.5" : "history=4,heavy=0.5");
        tview *t = tv_new(8, 4, 2);
        for (int step = 0; step < 8; step++) {
            float attn[8];
            for (int i = 0; i < 8; i++) attn[i] = 0.01f;
            attn[1] = 1.0f;
            attn[step < 4 ? 3 : 2] = 1.0f;
            qi_kv_policy_observe(p, &t->v, attn);
        }
        /* the masks: bit 0 the last step */
        ck_assert(t->score[1] == 0.0f);
        ck_assert(t->score[2] == (k ? 240.0f : 0.0f));
        ck_assert(t->score[3] == (k ? 15.0f : 15.0f));
        ck_assert(t->score[0] == (k ? 255.0f : 15.0f));
        ck_assert_int_eq(sel(p, t), 4);
        expect_kept(t, k ? (int32_t[]){1, 3, 6, 7} : (int32_t[]){1, 2, 6, 7}, 4, QI_KV_DROP);
        qi_kv_policy_free(p);
        free(t);
    }
}
END_TEST

/* Keyformer without noise at temperature 1 accumulates each step's
 * normalised weight: a prompt chunk's large total does not swamp a later
 * step, as it does in H2O's raw sum. Budget 2 = 1 recent (3) + 1 scored. */
START_TEST(keyformer_normalises_each_step) {
    qi_kv_policy *k = make("keyformer", "noise=false,tau_end=1"), *h = make("h2o", "");
    tview *t = tv_new(4, 2, 2), *u = tv_new(4, 2, 2);
    const float chunk[4] = {6, 4, 0, 0}, step[4] = {0.1f, 0.9f, 0, 0};
    qi_kv_policy_observe(k, &t->v, chunk);
    qi_kv_policy_observe(k, &t->v, step);
    qi_kv_policy_observe(h, &u->v, chunk);
    qi_kv_policy_observe(h, &u->v, step);
    ck_assert(fabsf(t->score[0] - 0.7f) < 1e-6f && fabsf(t->score[1] - 1.3f) < 1e-6f && t->score[2] == 0);
    ck_assert_int_eq(sel(k, t), 2);
    expect_kept(t, (int32_t[]){1, 3}, 2, QI_KV_DROP);
    ck_assert_int_eq(sel(h, u), 2);
    expect_kept(u, (int32_t[]){0, 3}, 2, QI_KV_DROP);
    qi_kv_policy_free(k);
    /* the temperature: 1 + (3 - 1) * 3 / 10 = 1.6 at position 3 of 10 steps;
     * f = p^(1/1.6) normalised */
    k = make("keyformer", "noise=false,tau_init=1,tau_end=3,steps=10");
    memset(t->score, 0, sizeof t->score);
    const float w[4] = {0.6f, 0.4f, 0, 0};
    qi_kv_policy_observe(k, &t->v, w);
    const double a = pow(0.6, 1 / 1.6), b = pow(0.4, 1 / 1.6);
    ck_assert_msg(fabs(t->score[0] - a / (a + b)) < 1e-6 && fabs(t->score[1] - b / (a + b)) < 1e-6, "%g %g",
                  t->score[0], t->score[1]);
    qi_kv_policy_free(k);
    /* past `steps` the temperature stays at tau_end */
    k = make("keyformer", "noise=false,tau_init=1,tau_end=3,steps=2");
    memset(t->score, 0, sizeof t->score);
    qi_kv_policy_observe(k, &t->v, w);
    const double c = pow(0.6, 1 / 3.0), d = pow(0.4, 1 / 3.0);
    ck_assert(fabs(t->score[0] - c / (c + d)) < 1e-6);
    qi_kv_policy_free(k);
    /* the noise: the same for the same seed, another for another seed */
    float s1[4], s2[4], s3[4];
    for (int r = 0; r < 3; r++) {
        k = make("keyformer", r < 2 ? "seed=5" : "seed=6");
        memset(t->score, 0, sizeof t->score);
        qi_kv_policy_observe(k, &t->v, w);
        memcpy(r == 0 ? s1 : r == 1 ? s2 : s3, t->score, sizeof s1);
        qi_kv_policy_free(k);
    }
    ck_assert(memcmp(s1, s2, sizeof s1) == 0);
    ck_assert(memcmp(s1, s3, sizeof s1) != 0);
    ck_assert(fabsf(s1[0] + s1[1] - 1.0f) < 1e-6f && s1[2] == 0);
    qi_kv_policy_free(h);
    free(t);
    free(u);
    /* a view larger than the scratch (values computed twice) scores as one
     * within it (values kept): the scratch's size depends on what a thread
     * saw before, so it must not matter */
    uint64_t rng2 = 8;
    qi_kv_policy *fresh = make("keyformer", "tau_end=3,steps=100"), *grown = make("keyformer", "tau_end=3,steps=100");
    t = tv_new(3000, 100, 1);
    u = tv_new(3000, 100, 1);
    ck_assert_int_eq(sel(grown, u), 100); /* grows its scratch to 3000 */
    static float big[3000];
    for (int i = 0; i < 3000; i++) big[i] = (float)(qi_test_rand(&rng2) % 1000) * 1e-4f;
    qi_kv_policy_observe(fresh, &t->v, big);
    qi_kv_policy_observe(grown, &u->v, big);
    ck_assert(memcmp(t->score, u->score, sizeof(float) * 3000) == 0);
    qi_kv_policy_free(fresh);
    qi_kv_policy_free(grown);
    free(t);
    free(u);
}
END_TEST

/* SnapKV keeps the whole prompt while more of it follows, then keeps the
 * observation window plus the best-voted tokens; the vote is max-pooled. */
START_TEST(snapkv_judges_the_prompt_at_its_end) {
    uint64_t rng = 21;
    qi_kv_policy *p = make("snapkv", "window=2,pool=1");
    ck_assert_int_eq(qi_kv_policy_obs_window(p), 2);
    tview *t = tv_new(20, 6, 3);
    shuffle(t, &rng);
    float attn[20], obs[20];
    for (int i = 0; i < 20; i++) attn[i] = 1.0f;
    t->v.prompt_more = true; /* a prompt chunk with more to come: over the budget */
    qi_kv_policy_observe(p, &t->v, attn);
    ck_assert_int_eq(sel(p, t), 20);
    /* a policy without an observation window gets no such licence */
    qi_kv_policy *h = make("h2o", "");
    ck_assert_int_eq(qi_kv_policy_obs_window(h), 0);
    ck_assert_int_eq(sel(h, t), 6);
    qi_kv_policy_free(h);
    /* the prompt's end: the vote replaces the accumulated weight */
    t->v.prompt_more = false;
    for (int i = 0; i < 20; i++) {
        const int32_t q = t->pos[i];
        obs[i] = q == 3 ? 5 : q == 7 ? 4 : q == 11 ? 3 : q == 15 ? 2 : 0.1f;
    }
    t->v.obs = obs;
    t->v.n_obs = 2;
    qi_kv_policy_observe(p, &t->v, attn);
    for (int i = 0; i < 20; i++) ck_assert(t->score[i] == obs[i]);
    ck_assert_int_eq(sel(p, t), 6);
    expect_kept(t, (int32_t[]){3, 7, 11, 15, 18, 19}, 6, QI_KV_DROP);
    /* decoding adds the new query's weights to the vote */
    t->v.obs = NULL;
    t->v.n_obs = 0;
    float more[20] = {0};
    for (int i = 0; i < 20; i++) more[i] = t->pos[i] == 0 ? 10.0f : 0;
    qi_kv_policy_observe(p, &t->v, more);
    ck_assert_int_eq(sel(p, t), 6);
    expect_kept(t, (int32_t[]){0, 3, 7, 11, 18, 19}, 6, QI_KV_DROP);
    qi_kv_policy_free(p);
    /* pooled over 3: the neighbours of a voted token come with it */
    p = make("snapkv", "window=2,pool=3");
    memset(t->score, 0, sizeof t->score);
    for (int i = 0; i < 20; i++) obs[i] = t->pos[i] == 5 ? 10.0f : 0.0f;
    t->v.obs = obs;
    t->v.budget = 5;
    qi_kv_policy_observe(p, &t->v, attn);
    ck_assert_int_eq(sel(p, t), 5);
    expect_kept(t, (int32_t[]){4, 5, 6, 18, 19}, 5, QI_KV_DROP);
    /* a budget under the window: the newest only */
    t->v.budget = 1;
    ck_assert_int_eq(sel(p, t), 1);
    expect_kept(t, (int32_t[]){19}, 1, QI_KV_DROP);
    qi_kv_policy_free(p);
    free(t);
}
END_TEST

/* qinfer judge=W: the same deferral, then on the prompt's end the W newest
 * (the observation window) and the rest of the budget by the vote; with
 * judge_split=false its own split (half the budget recent) on the vote. */
START_TEST(qinfer_judges_the_prompt_at_its_end) {
    static const struct {
        const char *spec;
        int32_t keep[6];
    } cases[] = {{"judge=2,pool=1,sinks=0,windows=1,full_layers=0,offload=false", {1, 3, 6, 8, 10, 11}},
                 {"judge=2,pool=1,sinks=0,windows=1,full_layers=0,offload=false,judge_split=false",
                  {1, 6, 8, 9, 10, 11}}};
    tview *t = tv_new(12, 6, 3);
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        qi_kv_policy *q = make("qinfer", cases[c].spec);
        ck_assert_int_eq(qi_kv_policy_obs_window(q), 2);
        for (int i = 0; i < 12; i++) t->score[i] = i == 0 || i == 2 ? 50.0f : 0; /* accumulated before */
        t->v.prompt_more = true;
        t->v.obs = NULL;
        ck_assert_int_eq(sel(q, t), 12);
        t->v.prompt_more = false;
        float obs[12] = {0}, attn[12] = {0};
        obs[6] = 2;
        obs[8] = 1;
        obs[1] = 0.5f;
        obs[3] = 0.25f;
        t->v.obs = obs;
        t->v.n_obs = 2;
        qi_kv_policy_observe(q, &t->v, attn);
        ck_assert_int_eq(sel(q, t), 6);
        expect_kept(t, cases[c].keep, 6, QI_KV_DROP);
        qi_kv_policy_free(q);
    }
    t->v.obs = NULL;
    t->v.n_obs = 0;
    t->v.budget = 4;
    qi_kv_policy *q;
    /* the default judges with a 32-token window; judge=0 has none and
     * evicts during the prompt */
    q = make("qinfer", "");
    ck_assert_int_eq(qi_kv_policy_obs_window(q), 32);
    qi_kv_policy_free(q);
    q = make("qinfer", "judge=0,sinks=0,windows=1,full_layers=0,offload=false");
    ck_assert_int_eq(qi_kv_policy_obs_window(q), 0);
    t->v.prompt_more = true;
    ck_assert_int_eq(sel(q, t), 4);
    qi_kv_policy_free(q);
    free(t);
}
END_TEST

/* The max pool against brute force: ranks by position counted, not sorted. */
START_TEST(pool_max_matches_brute_force) {
    uint64_t rng = 31;
    tview *t = tv_new(1, 1, 0);
    static qi_kv_item items[MAXN];
    static float obs[MAXN], out[MAXN];
    for (int it = 0; it < 300; it++) {
        const int n = 1 + (int)(qi_test_rand(&rng) % 120), kernel = 1 + 2 * (int)(qi_test_rand(&rng) % 6);
        random_view(t, &rng, n, 0, it % 2 ? 1 : 40009);
        for (int i = 0; i < n; i++) obs[i] = (float)(qi_test_rand(&rng) % 50);
        qi_kv_rank_pool_max(&t->v, obs, kernel, items, out);
        for (int i = 0; i < n; i++) {
            int ri = 0;
            for (int j = 0; j < n; j++) ri += newer(t, i, j);
            float want = obs[i];
            for (int j = 0; j < n; j++) {
                int rj = 0;
                for (int k = 0; k < n; k++) rj += newer(t, j, k);
                if (abs(rj - ri) <= kernel / 2 && obs[j] > want) want = obs[j];
            }
            ck_assert_msg(out[i] == want, "case %d kernel %d slot %d: %g, want %g", it, kernel, i, out[i], want);
        }
    }
    free(t);
}
END_TEST

static void keep_60(qi_kv_policy *p, const qi_kv_view *v, uint8_t *fate) {
    for (int i = 0; i < v->n; i++) fate[i] = i < 60 ? QI_KV_KEEP : QI_KV_DROP;
}

/* pyramid=B: the budgeted layers' budgets fall linearly with depth and
 * sum to what the same budget on every layer gives. 8 layers, budget 100,
 * B 0.5: 150 on layer 0 down to 50 on layer 7; with qinfer's two full
 * layers, 6 budgeted layers from 150 down to 50. Each select keeps its
 * layer's budget and the wrapper holds it to that. */
START_TEST(pyramid_budgets_keep_the_total) {
    static const char *const cases[][2] = {{"h2o", "pyramid=0.5"}, {"qinfer", "pyramid=0.5,sinks=0"},
                                           {"window", "pyramid=0.3"}, {"tova", "pyramid=0.99"}};
    tview *t = tv_new(400, 100, 0);
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        qi_kv_policy *p = make(cases[c][0], cases[c][1]);
        const double B = atof(strchr(cases[c][1], '=') + 1);
        int total = 0, nb = 0, prev = 1 << 30;
        for (int l = 0; l < N_LAYER; l++) {
            t->v.layer = l;
            const int keep = sel(p, t);
            if (qi_kv_policy_exempt(p, l)) {
                ck_assert_int_eq(keep, 400);
                continue;
            }
            ck_assert_int_eq(keep, qi_kv_policy_layer_budget(p, l, 100));
            ck_assert_msg(keep <= prev, "%s: layer %d keeps %d, more than the layer below (%d)", cases[c][1], l, keep,
                          prev);
            prev = keep;
            total += keep;
            nb++;
        }
        ck_assert_msg(total == 100 * nb, "%s %s: %d kept over %d layers", cases[c][0], cases[c][1], total, nb);
        const int first = qi_kv_policy_exempt(p, 0) ? 2 : 0;
        ck_assert_int_eq(qi_kv_policy_layer_budget(p, first, 100), (int)lround(100 * (1 + B)));
        ck_assert_int_eq(qi_kv_policy_layer_budget(p, N_LAYER - 1, 100), (int)lround(100 * (1 - B)));
        qi_kv_policy_free(p);
    }
    /* without pyramid every layer has the budget */
    qi_kv_policy *p = make("h2o", "");
    for (int l = 0; l < N_LAYER; l++) ck_assert_int_eq(qi_kv_policy_layer_budget(p, l, 37), 37);
    qi_kv_policy_free(p);
    /* small budgets: every layer keeps at least one */
    p = make("h2o", "pyramid=0.9");
    for (int l = 0; l < N_LAYER; l++) ck_assert_int_ge(qi_kv_policy_layer_budget(p, l, 1), 1);
    qi_kv_policy_free(p);
    /* the wrapper holds a policy to its layer's budget, not the nominal one */
    static const qi_kv_policy_i KEEP60 = {.version = QI_KV_POLICY_VERSION, .name = "planted_60", .select = keep_60};
    qi_kv_policy k60 = {.iface = &KEEP60, .pyramid = 0.5, .n_layer = N_LAYER};
    qi_err e = {0};
    t->v.layer = 0; /* budget 150 */
    ck_assert_int_eq(qi_kv_policy_select(&k60, &t->v, t->fate, &e), QI_OK);
    t->v.layer = N_LAYER - 1; /* budget 50 */
    ck_assert_int_eq(qi_kv_policy_select(&k60, &t->v, t->fate, &e), QI_ERR_BACKEND);
    ck_assert_msg(strstr(e.msg, "kept 60 tokens, over the budget of 50"), "%s", e.msg);
    free(t);
}
END_TEST

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

typedef struct {
    const char *name, *spec;
    rule r;
} config;

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

static void keep_all(qi_kv_policy *p, const qi_kv_view *v, uint8_t *fate) {
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
static void no_free(qi_kv_policy *p) {}

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


/* ---- quest: block bounds, the pick and the cache's bounds ---------------------- */

#define QB_MAXG 4
#define QB_MAXD 80
#define QB_MAXB 96 /* blocks */

/* A pick view over blocks of `block` tokens with random bounds: nb blocks
 * (the last holding last_n tokens), group heads of D values. */
typedef struct {
    qi_kv_pick_view v;
    float q[QB_MAXG * QB_MAXD];
    float bounds[QB_MAXB * 2 * QB_MAXD];
    int blocks[QB_MAXB];
} tpick;

static void tp_fill(tpick *t, int nb, int block, int last_n, int group, int D, int budget, uint64_t *rng) {
    ck_assert(nb >= 1 && nb <= QB_MAXB && group <= QB_MAXG && D <= QB_MAXD && last_n >= 1 && last_n <= block);
    for (int i = 0; i < group * D; i++) t->q[i] = qi_test_randf(rng);
    for (int b = 0; b < nb; b++)
        for (int d = 0; d < D; d++) {
            const float a = qi_test_randf(rng), c = qi_test_randf(rng);
            t->bounds[(size_t)b * 2 * D + d] = a < c ? a : c;
            t->bounds[(size_t)b * 2 * D + D + d] = a < c ? c : a;
        }
    t->v = (qi_kv_pick_view){.layer = 3, .n_layer = N_LAYER, .group = group, .D = D, .q = t->q,
                             .n = (nb - 1) * block + last_n, .block = block, .n_blocks = nb, .bounds = t->bounds,
                             .newest = nb - 1, .budget = budget};
}

/* The bound, in float as quest computes it, is at least every key's score
 * q[h] . k (summed in float, d ascending) for every head, and their sum at
 * least the group's summed scores: exactly, no tolerance (rounding is
 * monotone and both sums run in the same order). Keys of random blocks,
 * the bounds taken from them; q of both signs, D 1..80, groups 1..4. */
START_TEST(quest_bound_covers_every_key) {
    uint64_t rng = 91;
    static float keys[64 * QB_MAXD], q[QB_MAXG * QB_MAXD], bound[2 * QB_MAXD];
    long checked = 0;
    for (int trial = 0; trial < 400; trial++) {
        const int D = 1 + (int)(qi_test_rand(&rng) % QB_MAXD), group = 1 + (int)(qi_test_rand(&rng) % QB_MAXG);
        const int rows = 1 + (int)(qi_test_rand(&rng) % 64);
        const float scale = trial % 3 == 0 ? 1000.0f : 1.0f;
        for (int i = 0; i < rows * D; i++) keys[i] = qi_fp16_to_f32(qi_f32_to_fp16(scale * qi_test_randf(&rng)));
        for (int i = 0; i < group * D; i++) q[i] = qi_test_randf(&rng) * (trial % 5 == 0 ? 0.0f : 1.0f);
        for (int d = 0; d < D; d++) {
            bound[d] = bound[D + d] = keys[d];
            for (int r = 1; r < rows; r++) {
                const float x = keys[r * D + d];
                bound[d] = x < bound[d] ? x : bound[d];
                bound[D + d] = x > bound[D + d] ? x : bound[D + d];
            }
        }
        const float total = qi_kv_bound_score(q, group, D, bound);
        for (int r = 0; r < rows; r++) {
            float sum = 0.0f;
            for (int h = 0; h < group; h++) {
                float dot = 0.0f;
                for (int d = 0; d < D; d++) dot += q[h * D + d] * keys[r * D + d];
                ck_assert_msg(qi_kv_bound_score(q + h * D, 1, D, bound) >= dot,
                              "trial %d row %d head %d: bound %.9g below the score %.9g", trial, r, h,
                              qi_kv_bound_score(q + h * D, 1, D, bound), dot);
                sum += dot;
                checked++;
            }
            ck_assert_msg(total >= sum, "trial %d row %d: group bound %.9g below the summed scores %.9g", trial, r,
                          total, sum);
        }
    }
    /* a hand-made case: q = (1, -2); keys (1, 1) and (3, -1): min (1, -1), max (3, 1);
     * bound max(1, 3) + max(2, -2) = 5, the best key's score 3 + 2 = 5 */
    const float q2[2] = {1, -2}, b2[4] = {1, -1, 3, 1};
    ck_assert_float_eq(qi_kv_bound_score(q2, 1, 2, b2), 5.0f);
    printf("quest: the block bound covers all %ld (key, head) scores of 400 random blocks\n", checked);
}
END_TEST

typedef struct {
    float score;
    int b;
} qb_item;

static int qb_cmp(const void *x, const void *y) { /* best first: higher score, then the newer block */
    const qb_item *a = x, *c = y;
    if (a->score != c->score) return a->score > c->score ? -1 : 1;
    return c->b - a->b;
}

/* The oracle, on pages of g view blocks (the page of `page` tokens, at
 * least one block; pages aligned at block 0, the last possibly short): the
 * newest page; if it alone is over the budget, only its blocks among the
 * newest v->tail (at least one), and nothing else; the first page if asked
 * and a whole page fits beside it; the `recent` pages before the newest
 * while whole pages fit; then the best of the others by a full sort of
 * their merged bounds while whole pages fit. With full_share (and
 * full_layers dense layers) the budget is (n_layer x budget - full_layers x
 * n) / (n_layer - full_layers), at least 1. want[b] marks the chosen
 * blocks; returns their count. */
static int quest_oracle(const tpick *t, bool first, int recent, int page, int full_share_layers, bool *want) {
    const qi_kv_pick_view *v = &t->v;
    const int g = page > v->block ? page / v->block : 1, D = v->D;
    const long unit = (long)g * v->block;
    memset(want, 0, sizeof(bool) * (size_t)v->n_blocks);
    long budget = v->budget;
    if (full_share_layers > 0) {
        budget = ((long)v->n_layer * v->budget - (long)full_share_layers * v->n) / (v->n_layer - full_share_layers);
        if (budget < 1) budget = 1;
    }
    const int newest = v->newest / g, n_pages = newest + 1;
    long room = budget - (v->n - (long)newest * unit);
    int n = 0;
    if (room < 0) {
        const int tail = v->tail > 1 ? v->tail : 1;
        for (int b = newest * g; b < v->n_blocks; b++)
            if (b >= v->n_blocks - tail) want[b] = true, n++;
        return n;
    }
    bool pw[QB_MAXB] = {false};
    pw[newest] = true;
    if (first && newest > 0 && room >= unit) {
        pw[0] = true;
        room -= unit;
    }
    for (int u = newest - 1; u >= newest - recent && u >= 0 && !pw[u] && room >= unit; u--) {
        pw[u] = true;
        room -= unit;
    }
    qb_item it[QB_MAXB];
    int m = 0;
    for (int u = 0; u < newest; u++) {
        if (pw[u]) continue;
        float bd[2 * QB_MAXD]; /* the page's bounds: its blocks' merged */
        for (int d = 0; d < D; d++) {
            bd[d] = INFINITY;
            bd[D + d] = -INFINITY;
        }
        for (int b = u * g; b < (u + 1) * g; b++)
            for (int d = 0; d < D; d++) {
                bd[d] = fminf(bd[d], v->bounds[(size_t)b * 2 * D + d]);
                bd[D + d] = fmaxf(bd[D + d], v->bounds[(size_t)b * 2 * D + D + d]);
            }
        it[m++] = (qb_item){qi_kv_bound_score(v->q, v->group, D, bd), u};
    }
    qsort(it, (size_t)m, sizeof *it, qb_cmp);
    for (int k = 0; k < m && room >= unit; k++, room -= unit) pw[it[k].b] = true;
    for (int u = 0; u < n_pages; u++)
        for (int b = u * g; pw[u] && b < (u + 1) * g && b < v->n_blocks; b++) want[b] = true, n++;
    return n;
}

/* Quest's choice through the wrapper equals the oracle's on random views:
 * blocks of 64 and of 4 tokens, a last block full or not, budgets from 1
 * to past the whole cache, groups of 1 to 4 heads, with and without the
 * first block, and ties (blocks with the same bounds) decided by the newer
 * block; pages of one block and of several (page=16 and 64 on blocks of
 * 4: a page's bound is its blocks' merged), a tail of 0 to 4 blocks that
 * may be read over the budget, and dense layers whose reads come out of
 * the budget (full_share). The blocks come back in ascending order, within
 * the budget unless they all lie in the tail. */
START_TEST(quest_pick_matches_full_sort) {
    uint64_t rng = 5;
    static tpick t;
    enum { NP = 9 };
    static const struct {
        const char *spec;
        bool first;
        int recent, page, share;
    } cfg[NP] = {{"first=false,recent=0,page=4", false, 0, 4, 0},
                 {"recent=0,page=4", true, 0, 4, 0},
                 {"page=4", true, 1, 4, 0},
                 {"first=false,recent=3,page=4", false, 3, 4, 0},
                 {"", true, 1, 16, 0},
                 {"page=64", true, 1, 64, 0},
                 {"page=16", true, 1, 16, 0},
                 {"first=false,recent=2,page=16", false, 2, 16, 0},
                 {"full_layers=2,full_share=true,page=16", true, 1, 16, 2}};
    qi_kv_policy *pol[NP];
    for (int f = 0; f < NP; f++) pol[f] = make("quest", cfg[f].spec);
    int trials = 0, partial = 0, ties = 0, over = 0;
    for (int trial = 0; trial < 3000; trial++) {
        const int block = trial % 2 ? 64 : 4, nb = 1 + (int)(qi_test_rand(&rng) % QB_MAXB);
        const int last_n = 1 + (int)(qi_test_rand(&rng) % block), n = (nb - 1) * block + last_n;
        const int budget = 1 + (int)(qi_test_rand(&rng) % (unsigned)(n + 2 * block));
        const int group = 1 + (int)(qi_test_rand(&rng) % QB_MAXG), D = 1 + (int)(qi_test_rand(&rng) % 16);
        tp_fill(&t, nb, block, last_n, group, D, budget, &rng);
        t.v.tail = (int)(qi_test_rand(&rng) % 5);
        if (trial % 4 == 0 && nb > 3) /* ties: copies of one block's bounds */
            for (int b = 1; b < nb - 1; b += 2) {
                memcpy(t.bounds + (size_t)b * 2 * D, t.bounds, sizeof(float) * 2 * (size_t)D);
                ties++;
            }
        for (int f = 0; f < NP; f++) {
            bool want[QB_MAXB];
            const int nw = quest_oracle(&t, cfg[f].first, cfg[f].recent, cfg[f].page, cfg[f].share, want);
            int got = 0;
            qi_err e = {0};
            ck_assert_msg(qi_kv_policy_pick(pol[f], &t.v, t.blocks, &got, &e) == QI_OK, "%s", e.msg);
            ck_assert_msg(got == nw, "trial %d %s: %d blocks picked, the oracle %d (budget %d, n %d)", trial,
                          cfg[f].spec, got, nw, budget, n);
            long tokens = 0;
            for (int j = 0; j < got; j++) {
                ck_assert_msg(want[t.blocks[j]], "trial %d %s: block %d picked, not the oracle's", trial,
                              cfg[f].spec, t.blocks[j]);
                ck_assert(j == 0 || t.blocks[j] > t.blocks[j - 1]);
                tokens += t.blocks[j] == nb - 1 ? last_n : block;
            }
            const int tail = t.v.tail > 1 ? t.v.tail : 1;
            ck_assert(tokens <= budget || t.blocks[0] >= nb - tail);
            over += tokens > budget;
            partial += last_n < block;
        }
        trials++;
    }
    ck_assert(over > 0);
    for (int f = 0; f < NP; f++) qi_kv_policy_free(pol[f]);
    printf("quest: %d random views x %d configurations (first, recent, page, full_share) picked as a full sort "
           "picks (%d with a partial last block, %d tied blocks, %d over the budget within the tail)\n",
           trials, NP, partial, ties, over);
}
END_TEST

/* Hand-made: the block holding a key aligned with the query is read, the
 * newest always; equal bounds go to the newer block; first=true keeps
 * block 0 when a block fits beside the newest, before recent=1's block
 * before the newest; quest never evicts, and its layers below full_layers
 * are exempt. */
START_TEST(quest_reads_the_matching_block) {
    static tpick t;
    uint64_t rng = 3;
    tp_fill(&t, 6, 4, 2, 1, 2, 2 + 4, &rng); /* newest holds 2 tokens: room for one more block */
    for (int b = 0; b < 6; b++) {            /* every block's keys in [-0.1, 0.1] ... */
        float *mn = t.bounds + b * 4, *mx = mn + 2;
        mn[0] = mn[1] = -0.1f;
        mx[0] = mx[1] = 0.1f;
    }
    t.bounds[2 * 4 + 2] = 5.0f; /* ... but block 2 holds a key with k_0 = 5 */
    t.q[0] = 1.0f;
    t.q[1] = 0.5f;
    qi_kv_policy *p = make("quest", "first=false,recent=0,page=4");
    int n = 0;
    ck_assert_int_eq(qi_kv_policy_pick(p, &t.v, t.blocks, &n, NULL), QI_OK);
    ck_assert_int_eq(n, 2);
    ck_assert_int_eq(t.blocks[0], 2);
    ck_assert_int_eq(t.blocks[1], 5);
    /* ties: with block 2 like the others, the newest of the rest, block 4 */
    t.bounds[2 * 4 + 2] = 0.1f;
    ck_assert_int_eq(qi_kv_policy_pick(p, &t.v, t.blocks, &n, NULL), QI_OK);
    ck_assert_int_eq(n, 2);
    ck_assert_int_eq(t.blocks[0], 4);
    /* first=true (the default): block 0 takes the one place */
    qi_kv_policy *pf = make("quest", "page=4");
    ck_assert_int_eq(qi_kv_policy_pick(pf, &t.v, t.blocks, &n, NULL), QI_OK);
    ck_assert_int_eq(n, 2);
    ck_assert_int_eq(t.blocks[0], 0);
    /* recent=1 (the default) reads the block before the newest with the next place, whatever its bound */
    t.bounds[2 * 4 + 2] = 5.0f;
    t.v.budget = 2 + 4 + 4;
    ck_assert_int_eq(qi_kv_policy_pick(pf, &t.v, t.blocks, &n, NULL), QI_OK);
    ck_assert_int_eq(n, 3);
    ck_assert(t.blocks[0] == 0 && t.blocks[1] == 4 && t.blocks[2] == 5);
    t.v.budget = 2 + 4 + 4 + 4; /* and block 2, by its bound, with one more */
    ck_assert_int_eq(qi_kv_policy_pick(pf, &t.v, t.blocks, &n, NULL), QI_OK);
    ck_assert_int_eq(n, 4);
    ck_assert(t.blocks[0] == 0 && t.blocks[1] == 2 && t.blocks[2] == 4 && t.blocks[3] == 5);
    /* a budget below the newest block's tokens still reads it */
    t.v.budget = 1;
    ck_assert_int_eq(qi_kv_policy_pick(pf, &t.v, t.blocks, &n, NULL), QI_OK);
    ck_assert_int_eq(n, 1);
    ck_assert_int_eq(t.blocks[0], 5);
    /* pages of two blocks (page=8): a page's bound is its blocks' merged, so
     * page 1 (blocks 2-3) wins with block 2's key; the newest page (block
     * 5, 2 tokens, page 2 being blocks 4-5) is read whole: 6 tokens */
    qi_kv_policy *p8 = make("quest", "first=false,recent=0,page=8");
    t.v.budget = 6 + 8;
    ck_assert_int_eq(qi_kv_policy_pick(p8, &t.v, t.blocks, &n, NULL), QI_OK);
    ck_assert_int_eq(n, 4);
    ck_assert(t.blocks[0] == 2 && t.blocks[1] == 3 && t.blocks[2] == 4 && t.blocks[3] == 5);
    /* merged, not averaged: a page with one block's large maximum wins over
     * a page whose two blocks are both a little above the rest */
    t.bounds[2 * 4 + 2] = 0.1f;
    t.bounds[0 * 4 + 3] = 3.0f; /* block 0's maximum of dimension 1: page 0 scores 0.1 + 1.5 */
    t.bounds[2 * 4 + 3] = 1.0f; /* blocks 2 and 3 at 1.0: page 1 scores 0.1 + 0.5 */
    t.bounds[3 * 4 + 3] = 1.0f;
    ck_assert_int_eq(qi_kv_policy_pick(p8, &t.v, t.blocks, &n, NULL), QI_OK);
    ck_assert_int_eq(n, 4);
    ck_assert(t.blocks[0] == 0 && t.blocks[1] == 1 && t.blocks[2] == 4 && t.blocks[3] == 5);
    /* the newest page alone over the budget: only its part in the tail */
    t.v.budget = 3;
    ck_assert_int_eq(qi_kv_policy_pick(p8, &t.v, t.blocks, &n, NULL), QI_OK);
    ck_assert_int_eq(n, 1);
    ck_assert_int_eq(t.blocks[0], 5);
    t.v.tail = 2;
    ck_assert_int_eq(qi_kv_policy_pick(p8, &t.v, t.blocks, &n, NULL), QI_OK);
    ck_assert_int_eq(n, 2);
    ck_assert(t.blocks[0] == 4 && t.blocks[1] == 5);
    t.v.tail = 0;
    t.bounds[0 * 4 + 3] = t.bounds[2 * 4 + 3] = t.bounds[3 * 4 + 3] = 0.1f;
    qi_kv_policy_free(p8);
    /* full_share: on layer 3 of 8 with full_layers=2, 22 tokens held and a
     * budget of 9, the picked layers get (8 x 9 - 2 x 22) / 6 = 4 tokens:
     * the newest block's 2 and no whole block more */
    qi_kv_policy *ps = make("quest", "first=false,recent=0,page=4,full_layers=2,full_share=true");
    qi_kv_policy *pn = make("quest", "first=false,recent=0,page=4,full_layers=2");
    t.v.budget = 9;
    ck_assert_int_eq(qi_kv_policy_pick(ps, &t.v, t.blocks, &n, NULL), QI_OK);
    ck_assert_int_eq(n, 1);
    ck_assert_int_eq(qi_kv_policy_pick(pn, &t.v, t.blocks, &n, NULL), QI_OK);
    ck_assert_int_eq(n, 2); /* without it, the newest and one block of 4 */
    t.v.budget = 12;        /* (96 - 44) / 6 = 8: the newest and one block; without, two */
    ck_assert_int_eq(qi_kv_policy_pick(ps, &t.v, t.blocks, &n, NULL), QI_OK);
    ck_assert_int_eq(n, 2);
    ck_assert_int_eq(qi_kv_policy_pick(pn, &t.v, t.blocks, &n, NULL), QI_OK);
    ck_assert_int_eq(n, 3);
    qi_kv_policy_free(ps);
    qi_kv_policy_free(pn);
    /* select keeps everything, over the budget: the budget binds the reads */
    tview *tv = tv_new(100, 10, 3);
    ck_assert_int_eq(sel(p, tv), 100);
    qi_kv_policy *h = make("h2o", "");
    ck_assert(qi_kv_policy_picks(p) && !qi_kv_policy_picks(h));
    qi_kv_policy_free(h);
    ck_assert(!qi_kv_policy_exempt(p, 0));
    qi_kv_policy *pl = make("quest", "full_layers=2");
    ck_assert(qi_kv_policy_exempt(pl, 1) && !qi_kv_policy_exempt(pl, 2));
    qi_kv_policy_free(pl);
    free(tv);
    qi_kv_policy_free(p);
    qi_kv_policy_free(pf);
}
END_TEST

static int pick_skips_newest(qi_kv_policy *p, const qi_kv_pick_view *v, int *b) {
    b[0] = 0;
    return 1;
}
static int pick_twice(qi_kv_policy *p, const qi_kv_pick_view *v, int *b) {
    b[0] = b[1] = v->newest;
    return 2;
}
static int pick_out_of_range(qi_kv_policy *p, const qi_kv_pick_view *v, int *b) {
    b[0] = v->newest;
    b[1] = v->n_blocks;
    return 2;
}
static int pick_all(qi_kv_policy *p, const qi_kv_pick_view *v, int *b) {
    for (int i = 0; i < v->n_blocks; i++) b[i] = i;
    return v->n_blocks;
}
static int pick_none(qi_kv_policy *p, const qi_kv_pick_view *v, int *b) { return 0; }

static const qi_kv_policy_i PICK_SKIPS = {.version = QI_KV_POLICY_VERSION, .name = "planted_skips",
                                          .select = keep_all, .pick = pick_skips_newest, .free = no_free};
static const qi_kv_policy_i PICK_TWICE = {.version = QI_KV_POLICY_VERSION, .name = "planted_twice",
                                          .select = keep_all, .pick = pick_twice, .free = no_free};
static const qi_kv_policy_i PICK_RANGE = {.version = QI_KV_POLICY_VERSION, .name = "planted_range",
                                          .select = keep_all, .pick = pick_out_of_range, .free = no_free};
static const qi_kv_policy_i PICK_ALL = {.version = QI_KV_POLICY_VERSION, .name = "planted_all",
                                        .select = keep_all, .pick = pick_all, .free = no_free};
static const qi_kv_policy_i PICK_NONE = {.version = QI_KV_POLICY_VERSION, .name = "planted_none",
                                         .select = keep_all, .pick = pick_none, .free = no_free};

/* Planted faults in pick(): each is QI_ERR_BACKEND naming the policy and
 * what it broke; a bad view is QI_ERR_INVALID; a policy without pick()
 * cannot be asked. Reading every block is fine when the budget covers
 * them. */
/* A view with more candidate blocks than the ranking scratch holds grows
 * it; if that fails, quest still picks within the budget (the newest, the
 * first and recent blocks, then the newest that fit, a choice that needs
 * no memory) and ranks by the bounds again once memory is back. */
START_TEST(quest_pick_survives_scratch_failure) {
    enum { NB = QI_KV_SCRATCH_INIT + 500, BLK = 4 };
    float *bounds = malloc(sizeof(float) * 2 * NB), q[1] = {1.0f};
    int *blocks = malloc(sizeof(int) * NB);
    ck_assert(bounds && blocks);
    for (int b = 0; b < NB; b++) { /* the older a block, the higher its bound */
        bounds[2 * b] = 0.0f;
        bounds[2 * b + 1] = (float)(NB - b);
    }
    const qi_kv_pick_view v = {.layer = 3, .n_layer = N_LAYER, .group = 1, .D = 1, .q = q, .n = NB * BLK,
                               .block = BLK, .n_blocks = NB, .bounds = bounds, .newest = NB - 1,
                               .budget = 10 * BLK};
    qi_kv_policy *p = make("quest", "page=4");
    int n = 0;
    qi_alloc_fail_after(1);
    ck_assert_int_eq(qi_kv_policy_pick(p, &v, blocks, &n, NULL), QI_OK);
    qi_alloc_fail_after(0);
    ck_assert_int_eq(n, 10); /* 0, then the 9 newest: NB-9 .. NB-1 */
    ck_assert_int_eq(blocks[0], 0);
    for (int j = 1; j < 10; j++) ck_assert_int_eq(blocks[j], NB - 10 + j);
    ck_assert_int_eq(qi_kv_policy_pick(p, &v, blocks, &n, NULL), QI_OK);
    ck_assert_int_eq(n, 10); /* 0, 1..7 by their bounds, NB-2 (recent), NB-1 */
    for (int j = 0; j < 8; j++) ck_assert_int_eq(blocks[j], j);
    ck_assert(blocks[8] == NB - 2 && blocks[9] == NB - 1);
    qi_kv_policy_free(p);
    free(bounds);
    free(blocks);
}
END_TEST

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

START_TEST(wrapper_catches_planted_pick_faults) {
    static tpick t;
    uint64_t rng = 11;
    tp_fill(&t, 5, 4, 3, 2, 3, 8, &rng); /* 19 tokens, budget 8 */
    const struct {
        const qi_kv_policy_i *pi;
        const char *words;
    } cases[] = {{&PICK_SKIPS, "newest block (4) was not picked"}, {&PICK_TWICE, "block 4 twice"},
                 {&PICK_RANGE, "block 5 out of range"},             {&PICK_ALL, "picked 19 tokens, over the budget of 8"},
                 {&PICK_NONE, "picked 0 blocks of 5"}};
    for (int c = 0; c < 5; c++) {
        qi_kv_policy p = {.iface = cases[c].pi};
        qi_err e = {0};
        int n = -1;
        ck_assert_int_eq(qi_kv_policy_pick(&p, &t.v, t.blocks, &n, &e), QI_ERR_BACKEND);
        ck_assert_msg(strstr(e.msg, cases[c].pi->name) && strstr(e.msg, cases[c].words), "%s", e.msg);
        ck_assert_int_eq(n, 0);
    }
    /* a tail lets the newest blocks be read over the budget, no others */
    qi_kv_policy all = {.iface = &PICK_ALL};
    int n = 0;
    t.v.tail = 5;
    ck_assert_int_eq(qi_kv_policy_pick(&all, &t.v, t.blocks, &n, NULL), QI_OK);
    ck_assert_int_eq(n, 5);
    t.v.tail = 4;
    qi_err et = {0};
    ck_assert_int_eq(qi_kv_policy_pick(&all, &t.v, t.blocks, &n, &et), QI_ERR_BACKEND);
    ck_assert_msg(strstr(et.msg, "picked 19 tokens, over the budget of 8"), "%s", et.msg);
    t.v.tail = 0;
    t.v.budget = 19;
    ck_assert_int_eq(qi_kv_policy_pick(&all, &t.v, t.blocks, &n, NULL), QI_OK);
    ck_assert_int_eq(n, 5);
    qi_err e = {0};
    t.v.newest = 2;
    ck_assert_int_eq(qi_kv_policy_pick(&all, &t.v, t.blocks, &n, &e), QI_ERR_INVALID);
    t.v.newest = 4;
    t.v.budget = 0;
    ck_assert_int_eq(qi_kv_policy_pick(&all, &t.v, t.blocks, &n, NULL), QI_ERR_INVALID);
    t.v.budget = 8;
    qi_kv_policy *h = make("h2o", "");
    ck_assert_int_eq(qi_kv_policy_pick(h, &t.v, t.blocks, &n, NULL), QI_ERR_UNSUPPORTED);
    qi_kv_policy_free(h);
}
END_TEST

/* The cache's key bounds and key columns (engine/kv.c) equal a
 * recomputation from the rows
 * after every write (tokens added one and several at a time, crossing
 * blocks), after evictions and offloads that move rows into holes and
 * recalls that append them, and after a swap out and in. A stale bound is
 * seen: the check fails on a planted change of one row. */
static void expect_bounds(const qi_kv_stream *s, int D, const char *when) {
    const qi_kv_tier *t = &s->work;
    for (int b = 0; b * QI_KV_PAGE < t->n; b++) /* per page */
        for (int d = 0; d < D; d++) {
            float mn = INFINITY, mx = -INFINITY;
            for (int i = b * QI_KV_PAGE; i < t->n && i < (b + 1) * QI_KV_PAGE; i++) {
                const float x = qi_fp16_to_f32(qi_kv_k_row(t, i, D)[d]);
                mn = x < mn ? x : mn;
                mx = x > mx ? x : mx;
            }
            ck_assert_msg(t->bound[(size_t)b * 2 * D + d] == mn && t->bound[(size_t)b * 2 * D + D + d] == mx,
                          "%s: page %d dim %d: bounds [%g, %g], the rows [%g, %g]", when, b, d,
                          t->bound[(size_t)b * 2 * D + d], t->bound[(size_t)b * 2 * D + D + d], mn, mx);
        }
}

/* With key columns kept too: every working slot's columns equal its row,
 * a block's slots past the last are zero. */
static void expect_kcols(const qi_kv_stream *s, int D, const char *when) {
    const qi_kv_tier *t = &s->work;
    for (int i = 0; i < ((t->n + QI_KV_BLOCK - 1) / QI_KV_BLOCK) * QI_KV_BLOCK; i++)
        for (int d = 0; d < D; d++) {
            const uint16_t c = t->kcol[((size_t)(i / QI_KV_BLOCK) * D + d) * QI_KV_BLOCK + i % QI_KV_BLOCK];
            const uint16_t want = i < t->n ? qi_kv_k_row(t, i, D)[d] : 0;
            ck_assert_msg(c == want, "%s: slot %d component %d: column 0x%04x, row 0x%04x", when, i, d, c, want);
        }
}

/* The offload tier's columns, brought up to date on demand for its whole
 * blocks: every slot's there equal its row. off_cols_seen: the most slots
 * checked at once. */
static int off_cols_seen;
static void expect_off_kcols(qi_kv_stream *s, int D, const char *when) {
    const qi_kv_tier *t = &s->off;
    int nc = -1;
    const uint16_t *kc = qi_kv_stream_off_kcols(s, &nc);
    ck_assert(kc == t->kcol && nc == (t->n / QI_KV_BLOCK) * QI_KV_BLOCK && t->kcol_n == nc);
    off_cols_seen = nc > off_cols_seen ? nc : off_cols_seen;
    for (int i = 0; i < nc; i++)
        for (int d = 0; d < D; d++) {
            const uint16_t c = kc[((size_t)(i / QI_KV_BLOCK) * D + d) * QI_KV_BLOCK + i % QI_KV_BLOCK];
            const uint16_t want = qi_kv_k_row(t, i, D)[d];
            ck_assert_msg(c == want, "%s: offloaded slot %d component %d: column 0x%04x, row 0x%04x", when, i, d, c,
                          want);
        }
}

static bool bounds_stale(const qi_kv_stream *s, int D) {
    const qi_kv_tier *t = &s->work;
    for (int i = 0; i < t->n; i++)
        for (int d = 0; d < D; d++) {
            const float x = qi_fp16_to_f32(qi_kv_k_row(t, i, D)[d]);
            const float *bd = t->bound + (size_t)(i / QI_KV_PAGE) * 2 * D;
            if (x < bd[d] || x > bd[D + d]) return true;
        }
    return false;
}

START_TEST(quest_bounds_follow_the_rows) {
    enum { D = 6 };
    qi_backend *cpu = NULL;
    qi_kv_pool *pool = NULL;
    qi_err e = {0};
    ck_assert_int_eq(qi_backend_cpu_create(1, 0, &cpu, &e), QI_OK);
    ck_assert_int_eq(qi_kv_pool_create(cpu, D, 0, &pool, &e), QI_OK);
    qi_kv_stream s;
    qi_kv_stream_init(&s, 0, pool, NULL, pool);
    qi_kv_stream_keep_bounds(&s);
    qi_kv_stream_keep_kcols(&s);
    qi_kv_stream_keep_off_kcols(&s);
    uint64_t rng = 29;
    int32_t pos = 0;
    /* writes: 1, then runs of 1..70 tokens, to 300 */
    while (pos < 300) {
        const int run = pos == 0 ? 1 : 1 + (int)(qi_test_rand(&rng) % 70), n0 = s.work.n;
        for (int r = 0; r < run && pos < 300; r++, pos++) {
            int slot;
            uint16_t *kr, *vr;
            ck_assert_int_eq(qi_kv_stream_slot(&s, pos, &slot, &kr, &vr, &e), QI_OK);
            for (int d = 0; d < D; d++) {
                kr[d] = qi_f32_to_fp16(qi_test_randf(&rng) * 8.0f);
                vr[d] = 0;
            }
        }
        qi_kv_stream_bounds_from(&s, n0);
        expect_bounds(&s, D, "after a write");
        expect_kcols(&s, D, "after a write");
    }
    /* evictions, offloads and recalls, each applied as the cache does */
    static uint8_t fate[1024];
    for (int round = 0; round < 12; round++) {
        const int nw = s.work.n, no = s.off.n;
        for (int i = 0; i < nw; i++) {
            const uint64_t r = qi_test_rand(&rng) % 10;
            fate[i] = r < 6 ? QI_KV_KEEP : r < 8 ? QI_KV_OFFLOAD : QI_KV_DROP;
        }
        for (int j = 0; j < no; j++) fate[nw + j] = qi_test_rand(&rng) % 3 ? QI_KV_OFFLOAD : QI_KV_KEEP;
        ck_assert_int_eq(qi_kv_stream_apply(&s, fate, &e), QI_OK);
        expect_bounds(&s, D, "after apply");
        expect_kcols(&s, D, "after apply");
        if (round % 3 != 1) expect_off_kcols(&s, D, "after apply"); /* some rounds' changes accumulate */
    }
    ck_assert_int_gt(s.off.n, 16);
    ck_assert_int_eq(qi_kv_stream_swap_out(&s, &e), QI_OK);
    expect_off_kcols(&s, D, "swapped out");
    ck_assert_int_eq(qi_kv_stream_swap_in(&s, &e), QI_OK);
    expect_bounds(&s, D, "after a swap");
    expect_kcols(&s, D, "after a swap");
    expect_off_kcols(&s, D, "after a swap");
    ck_assert_int_ge(off_cols_seen, QI_KV_BLOCK); /* a whole block was checked */
    /* the check sees a stale bound: one row changed behind the cache's back */
    ck_assert(!bounds_stale(&s, D));
    qi_kv_k_row(&s.work, 1, D)[0] = qi_f32_to_fp16(100.0f);
    ck_assert(bounds_stale(&s, D));
    qi_kv_stream_bounds_from(&s, 0);
    expect_bounds(&s, D, "after a rebuild");
    expect_kcols(&s, D, "after a rebuild");
    qi_kv_stream_release(&s);
    qi_kv_pool_free(pool);
    qi_backend_free(cpu);
}
END_TEST

/* ---- the registry, names and parameters ------------------------------------- */

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
    tcase_add_test(tc, full_keeps_everything);
    tcase_add_test(tc, window_keeps_newest);
    tcase_add_test(tc, streaming_keeps_sinks);
    tcase_add_test(tc, h2o_keeps_heavy_hitter_far_back);
    tcase_add_test(tc, h2o_ties_go_to_newer);
    tcase_add_test(tc, qinfer_spreads_over_windows);
    tcase_add_test(tc, qinfer_passes_unused_quota);
    tcase_add_test(tc, qinfer_sinks_and_full_layers);
    tcase_add_test(tc, qinfer_offload_and_probe);
    tcase_add_test(tc, qinfer_recall);
    tcase_add_test(tc, qinfer_mean_score);
    tcase_add_test(tc, qinfer_decay_prefers_recent_weight);
    tcase_add_test(tc, qinfer_decay_waits_for_probes);
    tcase_add_test(tc, qinfer_catch_up_counts_the_unmeasured_steps);
    tcase_add_test(tc, tova_keeps_what_the_query_attends_to);
    tcase_add_test(tc, scissorhands_counts_unimportant_steps);
    tcase_add_test(tc, keyformer_normalises_each_step);
    tcase_add_test(tc, scores_match_their_definitions);
    tcase_add_test(tc, snapkv_judges_the_prompt_at_its_end);
    tcase_add_test(tc, qinfer_judges_the_prompt_at_its_end);
    tcase_add_test(tc, pool_max_matches_brute_force);
    tcase_add_test(tc, pyramid_budgets_keep_the_total);
    tcase_add_test(tc, ada_budgets_match_brute_force);
    tcase_add_test(tc, ada_moves_budget_to_the_heavier_head);
    tcase_add_test(tc, ada_policies_keep_the_oracle_set);
    tcase_add_test(tc, ada_wrapper_holds_heads_to_their_share);
    tcase_add_test(tc, top_by_score_selects_the_best);
    tcase_add_test(tc, policies_match_oracle_on_random_views);
    tcase_add_test(tc, policies_match_oracle_while_decoding);
    tcase_add_test(tc, qinfer_reduces_to_h2o);
    tcase_add_test(tc, reduction_check_catches_a_difference);
    tcase_add_test(tc, wrapper_catches_planted_faults);
    tcase_add_test(tc, quest_bound_covers_every_key);
    tcase_add_test(tc, quest_pick_matches_full_sort);
    tcase_add_test(tc, quest_reads_the_matching_block);
    tcase_add_test(tc, wrapper_catches_planted_pick_faults);
    tcase_add_test(tc, quest_pick_survives_scratch_failure);
    tcase_add_test(tc, quest_bounds_follow_the_rows);
    tcase_add_test(tc, sparq_pick_matches_oracle);
    tcase_add_test(tc, sparq_reads_the_matching_token);
    tcase_add_test(tc, qinfer_fetch_matches_oracle);
    tcase_add_test(tc, qinfer_fetch_leaves_room);
    tcase_add_test(tc, fetch_wrapper_catches_planted_faults);
    tcase_add_test(tc, registry_is_consistent);
    tcase_add_test(tc, bad_names_and_parameters);
    tcase_add_test(tc, create_survives_allocation_failure);
    tcase_add_test(tc, select_survives_scratch_failure);
    suite_add_tcase(su, tc);
    return qi_test_run_suite(su);
}

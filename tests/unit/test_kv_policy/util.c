/* util.c - what the KV policy suite's parts share: test views, making
 * and running policies, and the brute-force oracle. */
#include "kv_policy_test.h"


/* n working tokens at positions 0..n-1 in slot order, scores 0. */
tview *tv_new(int n, int budget, int layer) {
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
qi_kv_policy *make(const char *name, const char *spec) {
    if (strcmp(name, "qinfer") == 0 && !strstr(spec, "fetch=")) {
        char s[512];
        snprintf(s, sizeof s, "fetch=0%s%s", *spec ? "," : "", spec);
        return make_as_is(name, s);
    }
    return make_as_is(name, spec);
}

qi_kv_policy *make_as_is(const char *name, const char *spec) {
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
int sel(qi_kv_policy *p, tview *t) {
    qi_err e = {0};
    if (qi_kv_policy_select(p, &t->v, t->fate, &e) != QI_OK) ck_abort_msg("%s", e.msg);
    int keep = 0;
    for (int i = 0; i < t->v.n; i++) keep += t->fate[i] == QI_KV_KEEP;
    return keep;
}

uint8_t fate_at(const tview *t, int32_t pos) {
    for (int i = 0; i < t->v.n; i++)
        if (t->pos[i] == pos) return t->fate[i];
    ck_abort_msg("no token at position %d", pos);
    return 0xFF;
}

/* Exactly the positions in keep[] are KEEP; every other working token has
 * fate `evict`. */
void expect_kept(const tview *t, const int32_t *keep, int n_keep, uint8_t evict) {
    for (int i = 0; i < t->v.n; i++) {
        bool want = false;
        for (int k = 0; k < n_keep; k++) want |= t->pos[i] == keep[k];
        uint8_t exp = want ? QI_KV_KEEP : t->tier[i] == QI_KV_OFFLOADED ? QI_KV_OFFLOAD : evict;
        ck_assert_msg(t->fate[i] == exp, "position %d: fate %u, want %u", t->pos[i], t->fate[i], exp);
    }
}

void shuffle(tview *t, uint64_t *rng) {
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


bool newer(const tview *t, int i, int j) { return t->pos[i] != t->pos[j] ? t->pos[i] > t->pos[j] : i > j; }

int bits_set(float mask) {
    int c = 0;
    for (uint32_t m = (uint32_t)mask; m; m >>= 1) c += (int)(m & 1u);
    return c;
}

int g_key; /* the rule's key, for better() */

float sh_rank_ref(float mask) { return -(float)bits_set(mask); }

float key_of(const tview *t, int i) {
    return g_key == KEY_FEWEST_BITS ? -(float)bits_set(t->score[i]) : t->score[i];
}

bool better(const tview *t, int i, int j) {
    const float a = key_of(t, i), b = key_of(t, j);
    return a != b ? a > b : newer(t, i, j);
}

enum { R_OUT, R_SINK, R_RECENT, R_OLD, R_OLD_KEPT, R_CARRY_KEPT };

void oracle(const tview *t, rule r, uint8_t *f) {
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

void expect_oracle(const tview *t, rule r, const char *what, int iter) {
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
void random_view(tview *t, uint64_t *rng, int n, double p_off, int32_t stride) {
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

/* cases.c - hand-made attention patterns whose right answer is known. */
#include "kv_policy_test.h"

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

void keep_60(qi_kv_policy *p, const qi_kv_view *v, uint8_t *fate) {
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

void kv_cases_add(TCase *tc) {
    tcase_add_test(tc, full_keeps_everything);
    tcase_add_test(tc, window_keeps_newest);
    tcase_add_test(tc, streaming_keeps_sinks);
    tcase_add_test(tc, h2o_keeps_heavy_hitter_far_back);
    tcase_add_test(tc, h2o_ties_go_to_newer);
    tcase_add_test(tc, qinfer_spreads_over_windows);
    tcase_add_test(tc, qinfer_passes_unused_quota);
    tcase_add_test(tc, qinfer_sinks_and_full_layers);
    tcase_add_test(tc, qinfer_offload_and_probe);
    tcase_add_test(tc, qinfer_mean_score);
    tcase_add_test(tc, qinfer_decay_prefers_recent_weight);
    tcase_add_test(tc, qinfer_decay_waits_for_probes);
    tcase_add_test(tc, qinfer_catch_up_counts_the_unmeasured_steps);
    tcase_add_test(tc, qinfer_recall);
    tcase_add_test(tc, tova_keeps_what_the_query_attends_to);
    tcase_add_test(tc, scissorhands_counts_unimportant_steps);
    tcase_add_test(tc, keyformer_normalises_each_step);
    tcase_add_test(tc, snapkv_judges_the_prompt_at_its_end);
    tcase_add_test(tc, qinfer_judges_the_prompt_at_its_end);
    tcase_add_test(tc, pool_max_matches_brute_force);
    tcase_add_test(tc, pyramid_budgets_keep_the_total);
}

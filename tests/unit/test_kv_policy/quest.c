/* quest.c - Quest: its block bound, its pick against a full sort, the
 * wrapper's checks of pick(), and the cache's key bounds. */
#include "kv_policy_test.h"

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

void kv_quest_add(TCase *tc) {
    tcase_add_test(tc, quest_bound_covers_every_key);
    tcase_add_test(tc, quest_pick_matches_full_sort);
    tcase_add_test(tc, quest_reads_the_matching_block);
    tcase_add_test(tc, quest_pick_survives_scratch_failure);
    tcase_add_test(tc, wrapper_catches_planted_pick_faults);
    tcase_add_test(tc, quest_bounds_follow_the_rows);
}

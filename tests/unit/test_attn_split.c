/* test_attn_split.c - Check suite for split attention (engine/backend/backend.h):
 * partial results over disjoint ranges of a stream's slots, the exact
 * merge, and the statistics pass against the merged totals, held to the
 * unsplit attention of the CPU backend.
 *
 * Property tests on seeded random data: head sizes 64, 128 and 256; query
 * groups (GQA ratios) 1, 3, 4 and 8 over 2 KV heads; streams of 1 to 8200
 * slots, in position order or shuffled (as a policy leaves them), with and
 * without a sliding window; 1 and 5 queries; splits at ratios 0.25, 0.5
 * and 0.75 (two parts, cut at a block boundary as a device split cuts) and
 * into three parts. Checked:
 *   - one part holding every slot gives the unsplit output bit for bit,
 *     and merging that one part changes nothing;
 *   - merged outputs against the unsplit ones: |merged - unsplit| <= TOL_OUT
 *     * c per element, c = sum_i p_i |v_i| (the exact softmax weights, in
 *     double, times |V|: the size of the weighted sum before cancellation).
 *     Both sides round every weight to fp16 (relative error up to 2^-11
 *     each), from exponentials taken against different maxima, so they
 *     may differ by about twice that: TOL_OUT = 2^-9 leaves a factor of
 *     two; measured below 2^-10 (QI_TEST_VERBOSE=1 prints it);
 *   - the statistics pass over every part against the unsplit statistics:
 *     |split - unsplit| <= 2^-9 unsplit + 2 T 2^-24 per slot. The totals'
 *     float sum rounds the normaliser, which can move each query's fp16
 *     weight by one step: at most 2^-10 of it, or 2^-24 below fp16's
 *     normal range; the bound doubles both for the float sums;
 *   - a planted fault (one part's max moved by 1e-2) fails the bound.
 * QI_TEST_QUICK=1 (the sanitizer build) drops the 4100- and 8200-slot
 * streams.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "qinfer/quant.h"
#include "testutil.h"

#define SHIFT 4 /* 16-slot blocks */
#define BLK (1 << SHIFT)
#define HKV 2
#define MAX_T 5
#define TOL_OUT 0x1p-9

static float randn(uint64_t *s) {
    float u = (qi_test_randf(s) + 1.0f) * 0.5f + 1e-7f, v = qi_test_randf(s);
    return sqrtf(-2.0f * logf(u)) * cosf(3.14159265f * v);
}

/* A stream: n slots of HKV KV heads, slot i at position pos[i], its rows in
 * blocks of BLK; T queries at the last T positions, H = HKV * group heads. */
typedef struct {
    int n, T, H, D, n_swa;
    int32_t *pos, qpos[MAX_T];
    uint16_t *k[HKV], *v[HKV];          /* [n_blocks * BLK][D] */
    const uint16_t **kt[HKV], **vt[HKV]; /* block tables */
    float *q;                            /* [T][H][D] */
} stream;

static void stream_init(stream *s, uint64_t *rng, int n, int T, int group, int D, bool shuffled, int n_swa) {
    memset(s, 0, sizeof *s);
    s->n = n;
    s->T = T < n ? T : n;
    s->H = HKV * group;
    s->D = D;
    s->n_swa = n_swa;
    s->pos = malloc(sizeof(int32_t) * (size_t)n);
    for (int i = 0; i < n; i++) s->pos[i] = i;
    if (shuffled)
        for (int i = n - 1; i > 0; i--) {
            const int j = (int)(qi_test_rand(rng) % (uint64_t)(i + 1));
            const int32_t x = s->pos[i];
            s->pos[i] = s->pos[j];
            s->pos[j] = x;
        }
    for (int t = 0; t < s->T; t++) s->qpos[t] = n - s->T + t;
    const int nb = (n + BLK - 1) / BLK;
    for (int hk = 0; hk < HKV; hk++) {
        s->k[hk] = malloc(sizeof(uint16_t) * (size_t)nb * BLK * D);
        s->v[hk] = malloc(sizeof(uint16_t) * (size_t)nb * BLK * D);
        for (long i = 0; i < (long)nb * BLK * D; i++) {
            s->k[hk][i] = qi_f32_to_fp16(randn(rng) * 1.5f);
            s->v[hk][i] = qi_f32_to_fp16(randn(rng));
        }
        s->kt[hk] = malloc(sizeof(uint16_t *) * (size_t)nb);
        s->vt[hk] = malloc(sizeof(uint16_t *) * (size_t)nb);
        for (int b = 0; b < nb; b++) {
            s->kt[hk][b] = s->k[hk] + (long)b * BLK * D;
            s->vt[hk][b] = s->v[hk] + (long)b * BLK * D;
        }
    }
    s->q = malloc(sizeof(float) * (size_t)s->T * s->H * D);
    for (long i = 0; i < (long)s->T * s->H * D; i++) s->q[i] = randn(rng) * 1.5f;
}

static void stream_fini(stream *s) {
    free(s->pos);
    free(s->q);
    for (int hk = 0; hk < HKV; hk++) {
        free(s->k[hk]);
        free(s->v[hk]);
        free(s->kt[hk]);
        free(s->vt[hk]);
    }
}

/* The call over slots [lo, hi) (lo a multiple of BLK). */
typedef struct {
    qi_attn_paged_args a;
    int n_slots[HKV];
    const int32_t *pos[HKV];
    const uint16_t *const *kb[HKV], *const *vb[HKV];
} call;

static void call_init(call *c, const stream *s, int lo, int hi, float *out) {
    for (int hk = 0; hk < HKV; hk++) {
        c->n_slots[hk] = hi - lo;
        c->pos[hk] = s->pos + lo;
        c->kb[hk] = s->kt[hk] + lo / BLK;
        c->vb[hk] = s->vt[hk] + lo / BLK;
    }
    c->a = (qi_attn_paged_args){.T = s->T, .H = s->H, .Hkv = HKV, .D = s->D, .q_pos = s->qpos, .n_swa = s->n_swa,
                                .scale = 1.0f / sqrtf((float)s->D), .q = s->q, .out = out, .n_slots = c->n_slots,
                                .pos = c->pos, .k_blk = c->kb, .v_blk = c->vb, .shift = SHIFT};
}

/* c[(t * H + h) * D + d] = sum_i p_i |v_i[d]| with p the exact softmax (in
 * double, from the fp16-rounded query) of query t, head h. */
static double *condition(const stream *s) {
    const int D = s->D, group = s->H / HKV;
    double *c = calloc((size_t)s->T * s->H * D, sizeof(double)), *sc = malloc(sizeof(double) * (size_t)s->n);
    for (int t = 0; t < s->T; t++)
        for (int h = 0; h < s->H; h++) {
            const int hk = h / group;
            const float *q = s->q + ((long)t * s->H + h) * D;
            double mx = -INFINITY;
            for (int i = 0; i < s->n; i++) {
                const int32_t p = s->pos[i];
                if (p > s->qpos[t] || (s->n_swa > 0 && s->qpos[t] - p >= s->n_swa)) {
                    sc[i] = -INFINITY;
                    continue;
                }
                double d = 0.0;
                for (int k = 0; k < D; k++)
                    d += (double)qi_fp16_to_f32(qi_f32_to_fp16(q[k])) * qi_fp16_to_f32(s->k[hk][(long)i * D + k]);
                sc[i] = d / sqrt((double)D);
                mx = sc[i] > mx ? sc[i] : mx;
            }
            double sum = 0.0;
            for (int i = 0; i < s->n; i++) sum += sc[i] == -INFINITY ? 0.0 : exp(sc[i] - mx);
            double *ct = c + ((long)t * s->H + h) * D;
            for (int i = 0; i < s->n; i++) {
                if (sc[i] == -INFINITY) continue;
                const double p = exp(sc[i] - mx) / sum;
                for (int k = 0; k < D; k++) ct[k] += p * fabs((double)qi_fp16_to_f32(s->v[hk][(long)i * D + k]));
            }
        }
    free(sc);
    return c;
}

static qi_backend *backend(int n_threads, int max_pos, int D) {
    qi_backend *b = NULL;
    qi_err e = {0};
    ck_assert_msg(qi_backend_cpu_create(n_threads, 0, &b, &e) == QI_OK, "%s", e.msg);
    ck_assert_msg(b->iface->reserve(b, 0, MAX_T, max_pos, HKV, D, &e) == QI_OK, "%s", e.msg);
    return b;
}

/* The split of n slots at these fractions, cut down to block boundaries. */
static int split_points(int n, int which, int *cut) {
    static const double ratios[][2] = {{0.25, -1}, {0.5, -1}, {0.75, -1}, {0.3, 0.7}};
    int k = 0;
    cut[k++] = 0;
    for (int j = 0; j < 2 && ratios[which][j] >= 0; j++) {
        int c = (int)(ratios[which][j] * n) / BLK * BLK;
        if (c > cut[k - 1] && c < n) cut[k++] = c;
    }
    cut[k] = n;
    return k; /* parts */
}

static double g_worst_out, g_worst_stats;

static void check_case(int n, int T, int group, int D, bool shuffled, int n_swa, uint64_t seed) {
    uint64_t rng = seed;
    stream s;
    stream_init(&s, &rng, n, T, group, D, shuffled, n_swa);
    const long rows = (long)s.T * s.H, ol = rows * D;
    char what[160];
    snprintf(what, sizeof what, "n=%d T=%d H=%d D=%d %s swa=%d", n, s.T, s.H, D, shuffled ? "shuffled" : "in order",
             n_swa);
    qi_backend *b = backend(2, n, D);
    /* the unsplit attention, with statistics */
    const int stride = (n + 15) / 16 * 16;
    float *want = malloc(sizeof(float) * (size_t)ol), *want_st = calloc((size_t)s.H * stride, sizeof(float));
    call whole;
    call_init(&whole, &s, 0, n, want);
    whole.a.stats = want_st;
    whole.a.stats_stride = stride;
    b->iface->attention_paged_n(b, &whole.a, 1);

    /* one part holding every slot, and its merge */
    float *o[QI_ATTN_MAX_PARTS], *m[QI_ATTN_MAX_PARTS], *l[QI_ATTN_MAX_PARTS];
    for (int p = 0; p < 3; p++) {
        o[p] = malloc(sizeof(float) * (size_t)ol);
        m[p] = malloc(sizeof(float) * (size_t)rows);
        l[p] = malloc(sizeof(float) * (size_t)rows);
    }
    call one;
    call_init(&one, &s, 0, n, o[0]);
    one.a.part_m = m[0];
    one.a.part_l = l[0];
    b->iface->attention_paged_n(b, &one.a, 1);
    ck_assert_msg(memcmp(o[0], want, sizeof(float) * (size_t)ol) == 0, "%s: one part differs from the whole", what);
    float *merged = malloc(sizeof(float) * (size_t)ol), *tm = malloc(sizeof(float) * (size_t)rows),
          *tl = malloc(sizeof(float) * (size_t)rows);
    qi_attn_merge_args mg = {.rows = (int)rows, .D = D, .n_parts = 1, .o = (const float *const *)o,
                             .m = (const float *const *)m, .l = (const float *const *)l, .out = merged, .tot_m = tm,
                             .tot_l = tl};
    b->iface->attention_merge(b, &mg);
    ck_assert_msg(memcmp(merged, want, sizeof(float) * (size_t)ol) == 0, "%s: merging one part changed it", what);

    double *c = condition(&s);
    float *st = malloc(sizeof(float) * (size_t)s.H * stride);
    for (int which = 0; which < 4; which++) {
        int cut[4];
        const int P = split_points(n, which, cut);
        call parts[3];
        for (int p = 0; p < P; p++) {
            call_init(&parts[p], &s, cut[p], cut[p + 1], o[p]);
            parts[p].a.part_m = m[p];
            parts[p].a.part_l = l[p];
        }
        qi_attn_paged_args pa[3];
        for (int p = 0; p < P; p++) pa[p] = parts[p].a;
        b->iface->attention_paged_n(b, pa, P); /* the parts in one call, as a device would take its own */
        mg.n_parts = P;
        b->iface->attention_merge(b, &mg);
        double worst = 0.0;
        long at = 0;
        for (long i = 0; i < ol; i++) {
            const double e = fabs((double)merged[i] - want[i]) / fmax(c[i], 1e-30);
            if (!(e <= worst)) {
                worst = isnan(e) ? INFINITY : e;
                at = i;
            }
        }
        ck_assert_msg(worst <= TOL_OUT, "%s, %d parts: merged [t %ld][h %ld][d %ld] = %.9g, unsplit %.9g (%.3g x c)",
                      what, P, at / ((long)s.H * D), at / D % s.H, at % D, merged[at], want[at], worst);
        g_worst_out = fmax(g_worst_out, worst);
        /* the statistics pass, every part against the merged totals */
        memset(st, 0, sizeof(float) * (size_t)s.H * stride);
        for (int p = 0; p < P; p++) {
            pa[p].part_m = pa[p].part_l = NULL;
            pa[p].out = NULL;
            pa[p].tot_m = tm;
            pa[p].tot_l = tl;
            pa[p].stats = st + cut[p];
            pa[p].stats_stride = stride;
        }
        b->iface->attention_paged_n(b, pa, P);
        for (int h = 0; h < s.H; h++)
            for (int i = 0; i < n; i++) {
                const double w = want_st[(long)h * stride + i], g = st[(long)h * stride + i];
                const double bound = 0x1p-9 * w + 2 * s.T * 0x1p-24;
                ck_assert_msg(fabs(g - w) <= bound, "%s, %d parts: stats [h %d][slot %d] %.9g, unsplit %.9g", what, P,
                              h, i, g, w);
                g_worst_stats = fmax(g_worst_stats, fabs(g - w) / bound);
            }
    }
    if (getenv("QI_TEST_VERBOSE")) printf("%s: worst %.3g x c so far\n", what, g_worst_out);
    for (int p = 0; p < 3; p++) {
        free(o[p]);
        free(m[p]);
        free(l[p]);
    }
    free(want);
    free(want_st);
    free(merged);
    free(tm);
    free(tl);
    free(st);
    free(c);
    qi_backend_free(b);
    stream_fini(&s);
}

static const int k_n[] = {1, 2, 17, 64, 100, 1000, 4100, 8200};
#define N_LEN (int)(sizeof k_n / sizeof k_n[0])
static const int k_group[] = {1, 3, 4, 8};
static const int k_D[] = {64, 128, 256};

/* _i: length x group x head size */
START_TEST(test_split_merge) {
    const int n = k_n[_i % N_LEN], group = k_group[_i / N_LEN % 4], D = k_D[_i / (N_LEN * 4)];
    if (qi_test_quick() && n > 1000) return;
    /* the longest streams with the widest groups and heads cost the most:
     * one query there, five elsewhere */
    const int T = n > 1000 && group * D > 256 ? 1 : MAX_T;
    const uint64_t seed = 1000 + (uint64_t)_i;
    check_case(n, T, group, D, false, 0, seed);
    if (n <= 1000) {
        check_case(n, T, group, D, true, 0, seed + 7);
        check_case(n, T, group, D, _i & 1, n / 3 + 1, seed + 13);
    }
}
END_TEST

/* The bound can fail: one part's max moved by 1e-2 scales its share by
 * about 1%, past 2^-9 of c where both parts weigh. */
START_TEST(test_planted_fault) {
    uint64_t rng = 77;
    stream s;
    stream_init(&s, &rng, 200, 1, 1, 64, false, 0);
    const long rows = s.H, ol = rows * s.D;
    qi_backend *b = backend(1, 200, 64);
    float *want = malloc(sizeof(float) * (size_t)ol), *merged = malloc(sizeof(float) * (size_t)ol);
    float *o[2], *m[2], *l[2];
    call whole, parts[2];
    call_init(&whole, &s, 0, 200, want);
    b->iface->attention_paged_n(b, &whole.a, 1);
    for (int p = 0; p < 2; p++) {
        o[p] = malloc(sizeof(float) * (size_t)ol);
        m[p] = malloc(sizeof(float) * (size_t)rows);
        l[p] = malloc(sizeof(float) * (size_t)rows);
        call_init(&parts[p], &s, p * 96, p ? 200 : 96, o[p]);
        parts[p].a.part_m = m[p];
        parts[p].a.part_l = l[p];
        b->iface->attention_paged_n(b, &parts[p].a, 1);
    }
    m[1][0] += 1e-2f;
    qi_attn_merge_args mg = {.rows = (int)rows, .D = s.D, .n_parts = 2, .o = (const float *const *)o,
                             .m = (const float *const *)m, .l = (const float *const *)l, .out = merged};
    b->iface->attention_merge(b, &mg);
    double *c = condition(&s), worst = 0.0;
    for (long i = 0; i < s.D; i++) worst = fmax(worst, fabs((double)merged[i] - want[i]) / c[i]);
    ck_assert_msg(worst > TOL_OUT, "a part's max moved by 1e-2 passes the bound (%.3g x c)", worst);
    for (int p = 0; p < 2; p++) {
        free(o[p]);
        free(m[p]);
        free(l[p]);
    }
    free(c);
    free(want);
    free(merged);
    qi_backend_free(b);
    stream_fini(&s);
}
END_TEST

START_TEST(test_report) {
    printf("split attention: worst merged error %.3g x c (bound %.3g), worst statistic %.3g of its bound\n",
           g_worst_out, TOL_OUT, g_worst_stats);
}
END_TEST

static Suite *split_suite(void) {
    Suite *s = suite_create("attn_split");
    TCase *tc = tcase_create("split");
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, test_split_merge, 0, N_LEN * 4 * 3);
    tcase_add_test(tc, test_planted_fault);
    tcase_add_test(tc, test_report);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    setenv("CK_FORK", "no", 0); /* the worst errors are gathered across the cases */
    return qi_test_run_suite(split_suite());
}

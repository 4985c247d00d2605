/* test_attn_blas.c - Check suite for the attn_blas attention path of the
 * CPU backend (engine/backend/cpu/backend_cpu.c: OpenBLAS sgemm per head and chunk of
 * queries, float softmax).
 *
 * Paged attention calls (block tables holding a whole cache, a wrapped
 * ring, or what a policy kept, with statistics) run on seeded
 * random data with the option on and off, and both results are held to a
 * reference computed here in double from the same fp16-rounded queries,
 * keys and values: scores, mask (causal by position, sliding window), an
 * exact softmax, the weighted sum of V and the summed weights. Shapes cover
 * T = 2, 17 and 130 queries (less than, and across, the 64-query chunks),
 * up to 600 keys, head sizes 64 and 256, plain heads and groups of 3 and 4
 * query heads per KV head, windows, a wrapped ring, and paged slots with
 * evicted positions, in position order and shuffled.
 *
 * Bounds, per output element, against its condition number
 * c = sum_i p_i |v_i| (the size of the weighted sum before cancellation):
 *   - BLAS path:  |out - ref| <= 2e-5 c. Float sgemm and softmax: float
 *     roundings in sums of up to 600 terms; measured up to 3e-6 c.
 *   - exact path: |out - ref| <= 2^-10 c. It rounds the softmax weights to
 *     fp16 (relative error up to 2^-11 each) as llama.cpp does; measured
 *     up to 4.3e-4 c. Checked so the reference is known to describe what
 *     the exact path computes, not only what the BLAS path does.
 *   - the two paths against each other, in the form of the benchmark's
 *     figure: max |blas - exact| / max |exact| <= 2e-3 (measured up to
 *     4.8e-4: the exact path's fp16 weights).
 * Statistics (each slot's weights summed over the T queries, added to what
 * the buffer held): |added - ref| <= rtol ref + T 2^-24 (held + ref) +
 * 1e-7 T, rtol the path's bound above; the second term is the float
 * accumulation, the third the fp16 weights below 2^-25 that the exact path
 * rounds to zero.
 * The BLAS path must also give the same bits on 1 and 3 threads (each
 * (head, chunk) product is computed whole by one thread), leave one-token
 * calls bit-identical to the exact path, and leave guard floats after the
 * output intact. A planted fault (one weight of the reference perturbed)
 * must fail the BLAS bound.
 *
 * Without OpenBLAS (libopenblas.so.0 cannot be loaded) the suite reports a
 * skip (exit 77). QI_TEST_QUICK=1 (the sanitizer build) drops the largest
 * shapes; QI_TEST_VERBOSE=1 prints every case's errors against the bounds.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "blas.h"
#include "kernels.h"
#include "qinfer/quant.h"
#include "testutil.h"

#define MAX_N 640    /* positions reserved */
#define MAX_HKV 4
#define SHIFT 4      /* paged: 16 rows per block */
#define GUARD 16
#define GUARD_BITS 0x7fa5a5a5u

#define TOL_BLAS 2e-5
#define TOL_EXACT (1.0 / 1024)
#define TOL_PATHS 2e-3

/* ---- data ----------------------------------------------------------------------- */

static float randn(uint64_t *s) {
    float u1 = (qi_test_randf(s) + 1.0f) * 0.5f, u2 = qi_test_randf(s);
    if (u1 < 1e-7f) u1 = 1e-7f;
    return sqrtf(-2.0f * logf(u1)) * cosf(3.14159265f * u2);
}

/* One attention problem in interface-neutral form: query t at qpos[t];
 * KV head hk holds n[hk] keys, key i at kpos[hk][i] with rows
 * k[hk] + i * D and v[hk] + i * D. */
typedef struct {
    int T, H, Hkv, D, n_swa;
    float scale;
    float *q;                       /* [T][H*D] */
    int32_t *qpos;                  /* [T] */
    int n[MAX_HKV];
    int32_t *kpos[MAX_HKV];         /* [n[hk]] */
    uint16_t *k[MAX_HKV], *v[MAX_HKV]; /* [n[hk]][D] */
} problem;

static void problem_free(problem *p) {
    free(p->q);
    free(p->qpos);
    for (int hk = 0; hk < p->Hkv; hk++) {
        free(p->kpos[hk]);
        free(p->k[hk]);
        free(p->v[hk]);
    }
}

static void fill_kv(problem *p, uint64_t *rng) {
    for (int hk = 0; hk < p->Hkv; hk++) {
        const long len = (long)p->n[hk] * p->D;
        p->k[hk] = malloc(sizeof(uint16_t) * (size_t)len);
        p->v[hk] = malloc(sizeof(uint16_t) * (size_t)len);
        ck_assert(p->k[hk] && p->v[hk]);
        for (long i = 0; i < len; i++) {
            p->k[hk][i] = qi_f32_to_fp16(randn(rng) * 2.0f);
            p->v[hk][i] = qi_f32_to_fp16(randn(rng));
        }
    }
}

static void fill_q(problem *p, uint64_t *rng) {
    const long len = (long)p->T * p->H * p->D;
    p->q = malloc(sizeof(float) * (size_t)len);
    p->qpos = malloc(sizeof(int32_t) * (size_t)p->T);
    ck_assert(p->q && p->qpos);
    for (long i = 0; i < len; i++) p->q[i] = randn(rng);
    p->scale = 1.0f / sqrtf((float)p->D);
}

/* ---- the reference ---------------------------------------------------------------- */

typedef struct {
    double *out, *cond; /* [T][H*D] */
    double *stats;      /* [H][MAX_N], summed over the queries */
} reference;

static void ref_compute(const problem *p, reference *r) {
    const long ql = (long)p->T * p->H * p->D;
    r->out = calloc((size_t)ql, sizeof(double));
    r->cond = calloc((size_t)ql, sizeof(double));
    r->stats = calloc((size_t)p->H * MAX_N, sizeof(double));
    double *s = malloc(sizeof(double) * MAX_N), *q = malloc(sizeof(double) * (size_t)p->D);
    ck_assert(r->out && r->cond && r->stats && s && q);
    const int D = p->D, group = p->H / p->Hkv;
    for (int t = 0; t < p->T; t++)
        for (int h = 0; h < p->H; h++) {
            const int hk = h / group, n = p->n[hk], qp = p->qpos[t];
            for (int d = 0; d < D; d++) q[d] = qi_fp16_to_f32(qi_f32_to_fp16(p->q[((long)t * p->H + h) * D + d]));
            double mx = -INFINITY;
            for (int i = 0; i < n; i++) {
                const int32_t kp = p->kpos[hk][i];
                if (kp > qp || (p->n_swa > 0 && qp - kp >= p->n_swa)) {
                    s[i] = -INFINITY;
                    continue;
                }
                double dot = 0.0;
                for (int d = 0; d < D; d++) dot += q[d] * qi_fp16_to_f32(p->k[hk][(long)i * D + d]);
                s[i] = dot * (double)p->scale;
                mx = s[i] > mx ? s[i] : mx;
            }
            ck_assert_msg(mx > -INFINITY, "a query sees no key (a bad test problem)");
            double sum = 0.0;
            for (int i = 0; i < n; i++) sum += s[i] = exp(s[i] - mx);
            double *o = r->out + ((long)t * p->H + h) * D, *c = r->cond + ((long)t * p->H + h) * D;
            for (int i = 0; i < n; i++) {
                const double w = s[i] / sum;
                if (w == 0.0) continue;
                r->stats[(long)h * MAX_N + i] += w;
                for (int d = 0; d < D; d++) {
                    const double v = qi_fp16_to_f32(p->v[hk][(long)i * D + d]);
                    o[d] += w * v;
                    c[d] += w * fabs(v);
                }
            }
        }
    free(s);
    free(q);
}

static void ref_free(reference *r) {
    free(r->out);
    free(r->cond);
    free(r->stats);
}

/* ---- running the backend ------------------------------------------------------------ */

typedef struct {
    float *mem, *out; /* out = mem, GUARD floats after [T][H*D] */
    float *stats;     /* [H][MAX_N] or NULL */
} result;

/* Paged storage of a problem: each block its own allocation. */
typedef struct {
    const uint16_t *const *kt[MAX_HKV], *const *vt[MAX_HKV];
    uint16_t **kb[MAX_HKV], **vb[MAX_HKV];
    int n_blk[MAX_HKV];
} paged;

static void paged_init(paged *pg, const problem *p) {
    const int B = 1 << SHIFT, D = p->D;
    for (int hk = 0; hk < p->Hkv; hk++) {
        const int nb = (p->n[hk] + B - 1) / B;
        pg->n_blk[hk] = nb;
        pg->kb[hk] = calloc((size_t)nb, sizeof(uint16_t *));
        pg->vb[hk] = calloc((size_t)nb, sizeof(uint16_t *));
        ck_assert(pg->kb[hk] && pg->vb[hk]);
        for (int b = 0; b < nb; b++) {
            pg->kb[hk][b] = calloc((size_t)B * D, sizeof(uint16_t));
            pg->vb[hk][b] = calloc((size_t)B * D, sizeof(uint16_t));
            ck_assert(pg->kb[hk][b] && pg->vb[hk][b]);
        }
        for (int i = 0; i < p->n[hk]; i++) {
            memcpy(pg->kb[hk][i >> SHIFT] + (long)(i & (B - 1)) * D, p->k[hk] + (long)i * D, sizeof(uint16_t) * D);
            memcpy(pg->vb[hk][i >> SHIFT] + (long)(i & (B - 1)) * D, p->v[hk] + (long)i * D, sizeof(uint16_t) * D);
        }
        pg->kt[hk] = (const uint16_t *const *)pg->kb[hk];
        pg->vt[hk] = (const uint16_t *const *)pg->vb[hk];
    }
}

static void paged_fini(paged *pg, int Hkv) {
    for (int hk = 0; hk < Hkv; hk++) {
        for (int b = 0; b < pg->n_blk[hk]; b++) {
            free(pg->kb[hk][b]);
            free(pg->vb[hk][b]);
        }
        free(pg->kb[hk]);
        free(pg->vb[hk]);
    }
}

static qi_backend *backend(int n_threads, bool attn_blas, int Hkv, int D) {
    qi_backend *b = NULL;
    qi_err err = {0};
    ck_assert_msg(qi_backend_cpu_create(n_threads, attn_blas ? QI_CPU_ATTN_BLAS : 0u, &b, &err) == QI_OK, "%s",
                  err.msg);
    ck_assert_msg(b->iface->reserve(b, 0, 0, MAX_N, Hkv, D, &err) == QI_OK, "%s", err.msg);
    return b;
}

static void result_init(result *r, const problem *p, bool stats, uint64_t seed) {
    const long ql = (long)p->T * p->H * p->D;
    r->mem = malloc(sizeof(float) * (size_t)(ql + GUARD));
    ck_assert_ptr_nonnull(r->mem);
    r->out = r->mem;
    const uint32_t bits = GUARD_BITS;
    for (long i = 0; i < ql + GUARD; i++) memcpy(&r->mem[i], &bits, 4);
    r->stats = NULL;
    if (stats) {
        /* statistics accumulate: start from the same small values, which
         * leave the float sums' rounding at the weights' scale */
        r->stats = malloc(sizeof(float) * (size_t)p->H * MAX_N);
        ck_assert_ptr_nonnull(r->stats);
        uint64_t s = seed;
        for (long i = 0; i < (long)p->H * MAX_N; i++) r->stats[i] = (float)(qi_test_rand(&s) % 8) / 4096.0f;
    }
}

static void result_check_guard(const result *r, const problem *p, const char *what) {
    const long ql = (long)p->T * p->H * p->D;
    for (long i = 0; i < GUARD; i++) {
        uint32_t u;
        memcpy(&u, &r->out[ql + i], 4);
        ck_assert_msg(u == GUARD_BITS, "%s: guard after the output overwritten", what);
    }
}

static void result_fini(result *r) {
    free(r->mem);
    free(r->stats);
}

/* Run p through a backend over the block tables pg. */
static void run(const problem *p, const paged *pg, int n_threads, bool attn_blas, result *r) {
    qi_backend *b = backend(n_threads, attn_blas, p->Hkv, p->D);
    {
        int n_slots[MAX_HKV];
        const int32_t *pos[MAX_HKV];
        for (int hk = 0; hk < p->Hkv; hk++) {
            n_slots[hk] = p->n[hk];
            pos[hk] = p->kpos[hk];
        }
        const qi_attn_paged_args a = {.T = p->T, .H = p->H, .Hkv = p->Hkv, .D = p->D, .q_pos = p->qpos,
                                      .n_swa = p->n_swa, .scale = p->scale, .q = p->q, .out = r->out,
                                      .n_slots = n_slots, .pos = pos, .k_blk = pg->kt, .v_blk = pg->vt,
                                      .shift = SHIFT, .stats = r->stats, .stats_stride = MAX_N};
        b->iface->attention_paged(b, &a);
    }
    qi_backend_free(b);
}

/* ---- checking --------------------------------------------------------------------- */

/* The largest |got - ref| / cond over the outputs (cond floored so that
 * an all-zero V column counts absolutely); its index in *at. */
static double worst_out(const problem *p, const reference *ref, const float *got, long *at) {
    const long ql = (long)p->T * p->H * p->D;
    double worst = 0.0;
    *at = 0;
    for (long i = 0; i < ql; i++) {
        const double e = fabs((double)got[i] - ref->out[i]) / fmax(ref->cond[i], 1e-30);
        if (!(e <= worst)) { /* NaN counts as the worst */
            worst = isnan(e) ? INFINITY : e;
            *at = i;
        }
    }
    return worst;
}

static double worst_stats(const problem *p, const reference *ref, const float *init, const float *got, double rtol,
                          long *at) {
    double worst = 0.0;
    *at = 0;
    const int group = p->H / p->Hkv;
    for (int h = 0; h < p->H; h++)
        for (int i = 0; i < p->n[h / group]; i++) {
            const long k = (long)h * MAX_N + i;
            const double added = (double)got[k] - (double)init[k];
            const double bound = rtol * ref->stats[k] + p->T * 0x1p-24 * (init[k] + ref->stats[k]) + 1e-7 * p->T;
            const double e = fabs(added - ref->stats[k]) / bound;
            if (!(e <= worst)) {
                worst = isnan(e) ? INFINITY : e;
                *at = k;
            }
        }
    return worst;
}

static double max_abs(const float *x, long n) {
    double m = 0.0;
    for (long i = 0; i < n; i++) m = fmax(m, fabs((double)x[i]));
    return m;
}

static void check_problem(const problem *p, const paged *pg, bool stats, const char *what) {
    const long ql = (long)p->T * p->H * p->D;
    reference ref;
    ref_compute(p, &ref);
    result exact, blas1, blas3, init;
    result_init(&init, p, stats, 99);
    result_init(&exact, p, stats, 99);
    result_init(&blas1, p, stats, 99);
    result_init(&blas3, p, stats, 99);
    run(p, pg, 2, false, &exact);
    run(p, pg, 1, true, &blas1);
    run(p, pg, 3, true, &blas3);
    result_check_guard(&exact, p, what);
    result_check_guard(&blas1, p, what);
    result_check_guard(&blas3, p, what);

    long at;
    double e = worst_out(p, &ref, blas1.out, &at);
    ck_assert_msg(e <= TOL_BLAS, "%s: BLAS output [t %ld][h %ld][d %ld] = %.9g, reference %.9g: error %.3g x cond, "
                  "bound %g", what, at / (p->H * p->D), at / p->D % p->H, at % p->D, blas1.out[at], ref.out[at],
                  e, TOL_BLAS);
    e = worst_out(p, &ref, exact.out, &at);
    ck_assert_msg(e <= TOL_EXACT, "%s: exact output [%ld] = %.9g, reference %.9g: error %.3g x cond, bound %g", what,
                  at, exact.out[at], ref.out[at], e, TOL_EXACT);
    double diff = 0.0;
    for (long i = 0; i < ql; i++) diff = fmax(diff, fabs((double)blas1.out[i] - exact.out[i]));
    const double rel = diff / max_abs(exact.out, ql);
    ck_assert_msg(rel <= TOL_PATHS, "%s: max |BLAS - exact| / max |exact| = %.3g, bound %g", what, rel, TOL_PATHS);
    ck_assert_msg(memcmp(blas1.out, blas3.out, sizeof(float) * (size_t)ql) == 0,
                  "%s: BLAS output differs between 1 and 3 threads", what);
    if (stats) {
        e = worst_stats(p, &ref, init.stats, blas1.stats, TOL_BLAS, &at);
        ck_assert_msg(e <= 1.0, "%s: BLAS stats [h %ld][slot %ld] added %.9g, reference %.9g (%.3g x the bound)",
                      what, at / MAX_N, at % MAX_N, blas1.stats[at] - init.stats[at], ref.stats[at], e);
        e = worst_stats(p, &ref, init.stats, exact.stats, TOL_EXACT, &at);
        ck_assert_msg(e <= 1.0, "%s: exact stats [h %ld][slot %ld] added %.9g, reference %.9g (%.3g x the bound)",
                      what, at / MAX_N, at % MAX_N, exact.stats[at] - init.stats[at], ref.stats[at], e);
        ck_assert_msg(memcmp(blas1.stats, blas3.stats, sizeof(float) * (size_t)p->H * MAX_N) == 0,
                      "%s: BLAS stats differ between 1 and 3 threads", what);
    }
    if (getenv("QI_TEST_VERBOSE")) {
        long a2;
        printf("%s: BLAS %.2e, exact %.2e (x cond); paths %.2e", what, worst_out(p, &ref, blas1.out, &a2),
               worst_out(p, &ref, exact.out, &a2), rel);
        if (stats)
            printf("; stats %.2f, %.2f of their bounds", worst_stats(p, &ref, init.stats, blas1.stats, TOL_BLAS, &a2),
                   worst_stats(p, &ref, init.stats, exact.stats, TOL_EXACT, &a2));
        printf("\n");
    }
    result_fini(&init);
    result_fini(&exact);
    result_fini(&blas1);
    result_fini(&blas3);
    ref_free(&ref);
}

/* ---- the cases ---------------------------------------------------------------------- */

static const int k_T[] = {2, 17, 130};
static const int k_D[] = {64, 256};
#define N_SHAPES 6 /* k_T x k_D */
#define N_VARIANTS 4

/* Quick mode drops the largest shape (130 queries of 256). */
static bool skip_shape(int T, int D) { return qi_test_quick() && T == 130 && D == 256; }

/* A whole cache as a single sequence holds it (slot r holds position r, or
 * in a wrapped ring the newest position that landed in row r): plain heads
 * from position 0; groups of 3 at 470 (600 keys at T = 130); groups of 3
 * with a window of 64 at 300; one KV head for 4 query heads, a window of
 * 100, a ring of 256 wrapped. */
START_TEST(test_att) {
    const int T = k_T[_i % 3], D = k_D[_i / 3 % 2], var = _i / N_SHAPES;
    if (skip_shape(T, D)) return;
    static const int Hs[] = {4, 6, 6, 4}, Hkvs[] = {4, 2, 2, 1}, pos0s[] = {0, 470, 300, 470};
    static const int swas[] = {0, 0, 64, 100}, cells[] = {0, 0, 0, 256};
    uint64_t rng = 1000 + (uint64_t)_i;
    problem p = {.T = T, .H = Hs[var], .Hkv = Hkvs[var], .D = D, .n_swa = swas[var]};
    const int pos0 = pos0s[var], last = pos0 + T - 1;
    const int n_cells = cells[var] > 0 && last + 1 > cells[var] ? cells[var] : 0;
    const int n = n_cells ? n_cells : last + 1;
    fill_q(&p, &rng);
    for (int t = 0; t < T; t++) p.qpos[t] = pos0 + t;
    for (int hk = 0; hk < p.Hkv; hk++) {
        p.n[hk] = n;
        p.kpos[hk] = malloc(sizeof(int32_t) * (size_t)n);
        ck_assert_ptr_nonnull(p.kpos[hk]);
        for (int r = 0; r < n; r++) p.kpos[hk][r] = n_cells ? r + n_cells * ((last - r) / n_cells) : r;
    }
    fill_kv(&p, &rng);
    paged pg;
    paged_init(&pg, &p);
    char what[160];
    snprintf(what, sizeof what, "contiguous T=%d H=%d Hkv=%d D=%d pos0=%d n_swa=%d n_cells=%d", T, p.H, p.Hkv, D,
             pos0, p.n_swa, n_cells);
    check_problem(&p, &pg, false, what);
    paged_fini(&pg, p.Hkv);
    problem_free(&p);
}
END_TEST

/* qi_attn_paged_args variants: groups of 3 in position order with
 * statistics; groups of 3 shuffled, window of 50, statistics; plain heads
 * in order without statistics; groups of 4 shuffled with statistics. Each
 * KV head has lost a different tenth of its older positions (evicted); the
 * queries' own positions are always held. */
START_TEST(test_paged) {
    const int T = k_T[_i % 3], D = k_D[_i / 3 % 2], var = _i / N_SHAPES;
    if (skip_shape(T, D)) return;
    static const int Hs[] = {6, 6, 4, 8}, Hkvs[] = {2, 2, 4, 2}, swas[] = {0, 50, 0, 0};
    static const bool shuffled[] = {false, true, false, true}, with_stats[] = {true, true, false, true};
    uint64_t rng = 2000 + (uint64_t)_i;
    problem p = {.T = T, .H = Hs[var], .Hkv = Hkvs[var], .D = D, .n_swa = swas[var]};
    const int n_pos = 600 - 130 + T; /* positions 0..n_pos-1, the queries the last T */
    fill_q(&p, &rng);
    for (int t = 0; t < T; t++) p.qpos[t] = n_pos - T + t;
    for (int hk = 0; hk < p.Hkv; hk++) {
        p.kpos[hk] = malloc(sizeof(int32_t) * (size_t)n_pos);
        ck_assert_ptr_nonnull(p.kpos[hk]);
        int n = 0;
        for (int pos = 0; pos < n_pos; pos++)
            if (pos >= n_pos - T || qi_test_rand(&rng) % 10 != 0) p.kpos[hk][n++] = pos;
        if (shuffled[var])
            for (int i = n - 1; i > 0; i--) {
                const int j = (int)(qi_test_rand(&rng) % (uint64_t)(i + 1));
                const int32_t x = p.kpos[hk][i];
                p.kpos[hk][i] = p.kpos[hk][j];
                p.kpos[hk][j] = x;
            }
        p.n[hk] = n;
    }
    fill_kv(&p, &rng);
    paged pg;
    paged_init(&pg, &p);
    char what[160];
    snprintf(what, sizeof what, "paged T=%d H=%d Hkv=%d D=%d n_swa=%d %s%s", T, p.H, p.Hkv, D, p.n_swa,
             shuffled[var] ? "shuffled" : "in order", with_stats[var] ? ", stats" : "");
    check_problem(&p, &pg, with_stats[var], what);
    paged_fini(&pg, p.Hkv);
    problem_free(&p);
}
END_TEST

/* Every KV head holds keys at positions 0..n-1, in slot order. */
static void keys_in_order(problem *p, int n) {
    for (int hk = 0; hk < p->Hkv; hk++) {
        p->n[hk] = n;
        p->kpos[hk] = malloc(sizeof(int32_t) * (size_t)n);
        ck_assert_ptr_nonnull(p->kpos[hk]);
        for (int i = 0; i < n; i++) p->kpos[hk][i] = i;
    }
}

/* One-token calls keep the exact path, bit for bit, with the option on. */
START_TEST(test_decode_unchanged) {
    uint64_t rng = 3000;
    problem p = {.T = 1, .H = 6, .Hkv = 2, .D = 64};
    const int n = 300;
    fill_q(&p, &rng);
    p.qpos[0] = n - 1;
    keys_in_order(&p, n);
    fill_kv(&p, &rng);
    paged pg;
    paged_init(&pg, &p);
    result off, on;
    result_init(&off, &p, true, 5);
    result_init(&on, &p, true, 5);
    run(&p, &pg, 2, false, &off);
    run(&p, &pg, 2, true, &on);
    ck_assert(memcmp(off.out, on.out, sizeof(float) * (size_t)p.H * p.D) == 0);
    ck_assert(memcmp(off.stats, on.stats, sizeof(float) * (size_t)p.H * MAX_N) == 0);
    result_fini(&off);
    result_fini(&on);
    paged_fini(&pg, p.Hkv);
    problem_free(&p);
}
END_TEST

/* The BLAS bound can fail: the BLAS output against a reference with one
 * softmax weight moved by 1e-4 of the total. */
START_TEST(test_planted_fault) {
    uint64_t rng = 4000;
    problem p = {.T = 17, .H = 2, .Hkv = 1, .D = 64};
    const int n = 100;
    fill_q(&p, &rng);
    for (int t = 0; t < p.T; t++) p.qpos[t] = n - p.T + t;
    keys_in_order(&p, n);
    fill_kv(&p, &rng);
    paged pg;
    paged_init(&pg, &p);
    reference ref;
    ref_compute(&p, &ref);
    result r;
    result_init(&r, &p, false, 1);
    run(&p, &pg, 1, true, &r);
    long at;
    ck_assert(worst_out(&p, &ref, r.out, &at) <= TOL_BLAS);
    /* query 3, head 1: 1e-4 of the weight moved from key 0 to key 1 in the
     * reference, which moves the output by 1e-4 |v_1 - v_0| */
    for (int d = 0; d < p.D; d++) {
        const long i = ((long)3 * p.H + 1) * p.D + d;
        ref.out[i] += 1e-4 * ((double)qi_fp16_to_f32(p.v[0][p.D + d]) - qi_fp16_to_f32(p.v[0][d]));
    }
    ck_assert_msg(worst_out(&p, &ref, r.out, &at) > TOL_BLAS, "a weight moved by 1e-4 passes the BLAS bound");
    ck_assert_int_eq(at / (p.H * p.D), 3);
    result_fini(&r);
    ref_free(&ref);
    paged_fini(&pg, p.Hkv);
    problem_free(&p);
}
END_TEST

static Suite *attn_blas_suite(void) {
    Suite *s = suite_create("attn_blas");
    TCase *tc = tcase_create("attention");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, test_att, 0, N_SHAPES * N_VARIANTS);
    tcase_add_loop_test(tc, test_paged, 0, N_SHAPES * N_VARIANTS);
    tcase_add_test(tc, test_decode_unchanged);
    tcase_add_test(tc, test_planted_fault);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    qi_err err = {0};
    if (qi_blas_load(&err) != QI_OK) {
        printf("test_attn_blas: skipped: %s\n", err.msg);
        return 77;
    }
    printf("test_attn_blas: kernels %s, OpenBLAS core %s\n", qi_kernels_get()->name,
           qi_blas_core()[0] ? qi_blas_core() : "unknown");
    return qi_test_run_suite(attn_blas_suite());
}

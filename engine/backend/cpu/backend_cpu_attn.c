/* backend_cpu_attn.c - the CPU backend's attention: each query row over a
 * paged block table in llama.cpp's order (scores, softmax, fp16 weights,
 * values), shared out over the pool by (token, head); the exact merge of a
 * split layer's partial results; and the opt-in attn_blas path (OpenBLAS
 * sgemm for prompts, not bit-exact). The ops' table is backend_cpu.c's. */
#include <limits.h>
#include <math.h>
#include <string.h>

#include "blas.h"
#include "cpu_int.h"
#include "kernels.h"
#include "qinfer/quant.h"

/* The paged variant: the same arithmetic as att_work over a block table,
 * for one call or for several independent ones (a step's sequences) in one
 * pool run, so that a decode step of many sequences pays one round of
 * synchronisation rather than one per sequence.
 *
 * Work split: a call's (token, head) pairs are numbered after those of the
 * calls before it and the numbers are split evenly over the threads. A call
 * without statistics is cut anywhere, pair by pair. A call with statistics
 * is cut only between heads: head h's T pairs are one unit, run by the
 * thread whose range holds the unit's first pair, queries in order, so
 * that each row of stats has one writer and its sums the order of a
 * single-threaded run whatever the thread count or the other calls. (Cut by
 * pairs, a row would need per-thread partial sums, and adding those up
 * changes the float summation order.) */
typedef struct {
    const qi_attn_paged_args *a;
    int n;
    cpu_ctx *c;
    long total; /* pairs over all the calls */
} attp_job;

/* Rows rows[0..m) of D fp16 values one after another into g: copies of a
 * size the compiler knows for the usual head sizes (a call per row costs
 * more than the copy). */
static void gather_rows(uint16_t *restrict g, const uint16_t *const *rows, int m, int D) {
#define GATHER_AS(DD)                                                                                         \
    for (int j = 0; j < m; j++) memcpy(g + (size_t)j * (DD), rows[j], sizeof *g * (DD));                      \
    return
    switch (D) {
    case 64: GATHER_AS(64);
    case 128: GATHER_AS(128);
    case 256: GATHER_AS(256);
    default: GATHER_AS((size_t)D);
    }
#undef GATHER_AS
}

/* One (query, head) of a call, in one of three modes (backend.h):
 * attention (out, and stats when given), a partial (out normalised over
 * the call's slots, and their max score and sum of exponentials), or the
 * statistics alone against given totals. */
static void attp_one(const qi_attn_paged_args *a, cpu_ctx *c, int t, int h, float *s, uint16_t *w16) {
    const qi_kernels *K = c->k;
    const int D = a->D, hk = h / (a->H / a->Hkv), B = 1 << a->shift;
    const qi_k_order ord = a->T >= 2 ? QI_K_ORD_GEMM : QI_K_ORD_VEC;
    const int32_t qpos = a->q_pos[t];
    const int32_t *pos = a->pos[hk];
    const long th = (long)t * a->H + h;
    /* Slots after the last one the query sees would get weight 0: they are
     * left out (a prompt's causal triangle in a cache in position order).
     * The sums are unchanged: the softmax adds 16-element chunks padded
     * with zeros, and a zero weight adds nothing to an output or a
     * statistic. */
    int n = a->n_slots[hk];
    const int nx = a->x_n ? a->x_n[hk] : 0; /* extra rows: the table's slots are all kept, theirs follow */
    while (nx == 0 && n > 0 && pos[n - 1] > qpos) n--;
    uint16_t q16[1024];
    const float *q = a->q + th * D;
    K->f32_to_f16(q, q16, D);
    /* one kernel call per block, or, in the VEC order (each dot on its own,
     * whatever the call's length), per run of blocks that lie one after
     * another in memory: a picking policy's pages and single rows are
     * mostly such runs */
    for (int i0 = 0; i0 < n;) {
        const uint16_t *k0 = a->k_blk[hk][i0 >> a->shift];
        int m = n - i0 < B ? n - i0 : B;
        while (ord == QI_K_ORD_VEC && i0 + m < n && a->k_blk[hk][(i0 + m) >> a->shift] == k0 + (size_t)m * D)
            m += n - i0 - m < B ? n - i0 - m : B;
        K->attn_scores(ord, D, q16, k0, (size_t)D, m, s + i0);
        i0 += m;
    }
    /* the extra rows (fetched tokens) after the table's: scattered single
     * rows, gathered into a run for one kernel call in the VEC order (each
     * dot on its own there, so the scores are those of one call per row) */
    const int32_t *xpos = nx ? a->x_pos[hk] : NULL;
    if (nx) {
        const uint16_t *const *xk = a->x_k[hk];
        enum { GATHER = 4096 };
        uint16_t g[GATHER];
        const int per = ord == QI_K_ORD_VEC && D <= GATHER ? GATHER / D : 1;
        for (int j0 = 0; j0 < nx; j0 += per) {
            const int m = nx - j0 < per ? nx - j0 : per;
            if (per == 1) {
                K->attn_scores(ord, D, q16, xk[j0], (size_t)D, 1, s + n + j0);
                continue;
            }
            gather_rows(g, xk + j0, m, D);
            K->attn_scores(ord, D, q16, g, (size_t)D, m, s + n + j0);
        }
    }
    float mx = -INFINITY;
    for (int i = 0; i < n + nx; i++) {
        const int32_t p = i < n ? pos[i] : xpos[i - n];
        s[i] *= a->scale;
        if (p > qpos || (a->n_swa > 0 && qpos - p >= a->n_swa)) s[i] = -INFINITY;
        mx = s[i] > mx ? s[i] : mx;
    }
    if (a->tot_m) {
        /* statistics against the totals of every part */
        const float m = a->tot_m[th];
        const double l = a->tot_l[th];
        if (!(l > 0.0)) return;
        K->exp_sum(n, s, m);
        const float inv = (float)(1.0 / l);
        for (int i = 0; i < n; i++) s[i] *= inv;
        K->f32_to_f16(s, w16, n);
    } else if (a->part_m) {
        float *out = a->out + th * D;
        a->part_m[th] = mx;
        if (mx == -INFINITY) { /* nothing this query sees */
            a->part_l[th] = 0.0f;
            memset(out, 0, sizeof(float) * (size_t)D);
            return;
        }
        /* softmax_f16's steps, with the max and the sum kept */
        const double l = K->exp_sum(n, s, mx);
        const float inv = (float)(1.0 / l);
        for (int i = 0; i < n; i++) s[i] *= inv;
        K->f32_to_f16(s, w16, n);
        a->part_l[th] = (float)l;
        K->attn_values_blk(ord, D, w16, a->v_blk[hk], a->shift, (size_t)D, n, out);
        return;
    } else {
        K->softmax_f16(n + nx, s, w16);
        float *out = a->out + th * D;
        K->attn_values_blk(ord, D, w16, a->v_blk[hk], a->shift, (size_t)D, n, out);
        if (nx) { /* plus the extra rows', summed in 16 lanes (their own order: no reference to keep) */
            float xo[1024];
            K->attn_values_blk(QI_K_ORD_GEMM, D, w16 + n, a->x_v[hk], 0, (size_t)D, nx, xo);
            for (int d = 0; d < D; d++) out[d] += xo[d];
        }
        if (a->mix && a->mix[th] < 1.0f) { /* the unread weight on the mean value */
            const float w = a->mix[th] > 0.0f ? a->mix[th] : 0.0f, *vm = a->vmean[hk];
            for (int d = 0; d < D; d++) out[d] = w * out[d] + (1.0f - w) * vm[d];
        }
    }
    if (a->stats) { /* the extra rows' after the table's slots, all kept then */
        float *st = a->stats + (long)h * a->stats_stride, wf[256];
        for (int i0 = 0; i0 < n + nx; i0 += 256) {
            const int m = n + nx - i0 < 256 ? n + nx - i0 : 256;
            K->f16_to_f32(w16 + i0, wf, m);
            for (int i = 0; i < m; i++) st[i0 + i] += wf[i];
        }
    }
}

static long attp_items(const qi_attn_paged_args *a) { return (long)a->T * a->H; }

static void attp_work(void *arg, int ith, int nth) {
    attp_job *j = arg;
    float *s = j->c->att + (long)ith * j->c->att_len;
    uint16_t *w16 = j->c->w16 + (long)ith * j->c->att_len;
    long lo, hi, next = 0;
    qi_split(j->total, ith, nth, &lo, &hi);
    for (int i = 0; i < j->n && next < hi; i++) {
        const qi_attn_paged_args *a = &j->a[i];
        const long n_it = attp_items(a), base = next; /* the call's pairs: base..next-1 */
        next += n_it;
        if (n_it == 0 || next <= lo) continue;
        if (a->stats) {
            /* the heads whose first pair, base + h * T, is in [lo, hi) */
            const long h0 = lo <= base ? 0 : (lo - base + a->T - 1) / a->T;
            const long h1 = hi >= next ? a->H : (hi - base + a->T - 1) / a->T;
            for (long h = h0; h < h1; h++)
                for (int t = 0; t < a->T; t++) attp_one(a, j->c, t, (int)h, s, w16);
        } else {
            const long k0 = lo > base ? lo - base : 0, k1 = (hi < next ? hi : next) - base;
            for (long k = k0; k < k1; k++) attp_one(a, j->c, (int)(k / a->H), (int)(k % a->H), s, w16);
        }
    }
}

static void attp_check(const cpu_ctx *c, const qi_attn_paged_args *a) {
    QI_ASSERT(a->D <= 1024 && a->H % a->Hkv == 0);
    QI_ASSERT(!a->part_m || (a->part_l && !a->stats && !a->tot_m));
    QI_ASSERT(!a->tot_m || (a->tot_l && a->stats));
    for (int hk = 0; hk < a->Hkv; hk++) {
        const int n = a->n_slots[hk] + (a->x_n ? a->x_n[hk] : 0);
        QI_ASSERT(n <= c->att_len && (!a->stats || n <= a->stats_stride));
    }
}

static void blas_attention_paged(cpu_ctx *c, const qi_attn_paged_args *a);

void cpu_attention_paged(qi_backend *b, const qi_attn_paged_args *a) {
    cpu_ctx *c = C(b);
    attp_check(c, a);
    if (c->attn_blas && a->T >= 2 && !a->part_m && !a->tot_m && !a->x_n) {
        blas_attention_paged(c, a);
        return;
    }
    attp_job j = {a, 1, c, attp_items(a)};
    if (j.total > 0) qi_pool_run(c->pool, attp_work, &j);
}

/* Prompt chunks on the OpenBLAS path go one call at a time. */
void cpu_attention_paged_n(qi_backend *b, const qi_attn_paged_args *a, int n) {
    cpu_ctx *c = C(b);
    attp_job j = {a, n, c, 0};
    bool any_blas = false;
    for (int i = 0; i < n; i++) {
        attp_check(c, &a[i]);
        any_blas |= c->attn_blas && a[i].T >= 2 && !a[i].part_m && !a[i].tot_m && !a[i].x_n;
        j.total += attp_items(&a[i]);
    }
    if (any_blas) {
        for (int i = 0; i < n; i++) cpu_attention_paged(b, &a[i]);
        return;
    }
    if (j.total > 0) qi_pool_run(c->pool, attp_work, &j);
}

/* ---- merging partial attention results -------------------------------------- */

typedef struct {
    const qi_attn_merge_args *a;
} merge_job;

static void merge_work(void *arg, int ith, int nth) {
    const qi_attn_merge_args *a = ((merge_job *)arg)->a;
    const int D = a->D, P = a->n_parts;
    long lo, hi;
    qi_split(a->rows, ith, nth, &lo, &hi);
    for (long r = lo; r < hi; r++) {
        float M = -INFINITY;
        int seen = 0, only = -1;
        for (int p = 0; p < P; p++)
            if (a->l[p][r] > 0.0f) {
                M = a->m[p][r] > M ? a->m[p][r] : M;
                seen++;
                only = p;
            }
        float *out = a->out + r * D;
        double L = 0.0;
        if (seen == 1) {
            memcpy(out, a->o[only] + r * D, sizeof(float) * (size_t)D);
            L = a->l[only][r];
        } else if (seen > 1) {
            double acc[1024] = {0}, w[QI_ATTN_MAX_PARTS];
            for (int p = 0; p < P; p++) {
                w[p] = a->l[p][r] > 0.0f ? (double)a->l[p][r] * exp((double)a->m[p][r] - (double)M) : 0.0;
                L += w[p];
            }
            for (int p = 0; p < P; p++) {
                if (w[p] == 0.0) continue;
                const float *o = a->o[p] + r * D;
                for (int d = 0; d < D; d++) acc[d] += w[p] * (double)o[d];
            }
            for (int d = 0; d < D; d++) out[d] = (float)(acc[d] / L);
        } else {
            memset(out, 0, sizeof(float) * (size_t)D);
        }
        if (a->tot_m) a->tot_m[r] = M;
        if (a->tot_l) a->tot_l[r] = (float)L;
    }
}

void cpu_attention_merge(qi_backend *b, const qi_attn_merge_args *a) {
    QI_ASSERT(a->D <= 1024 && a->n_parts >= 1 && a->n_parts <= QI_ATTN_MAX_PARTS);
    merge_job j = {a};
    if ((long)a->rows * a->D * a->n_parts >= 16384)
        qi_pool_run(C(b)->pool, merge_work, &j);
    else
        merge_work(&j, 0, 1);
}

/* ---- attention through OpenBLAS (attn_blas) ------------------------------------ */

/* Query t at position q_pos[t], KV head hk with n_slots[hk] keys, key i
 * at position pos[hk][i], its rows of D fp16 values in the block table. A key is masked to -inf,
 * exactly as in the exact path, when its position is after the query's or,
 * with a window, n_swa or more before it.
 *
 * Per call: (1) every KV head's K and V rows are converted to float once,
 * shared by the heads of its group (the kernel table's f16_to_f32; every
 * fp16 value is a float, so the copies are exact); (2) per head and chunk of
 * up to BLAS_QCHUNK queries, S = Q_h K^T by sgemm over the columns some
 * query of the chunk can see (with keys in position order, the causal
 * triangle's upper part is never computed), scaled and masked, a float
 * softmax per row (maximum subtracted; the kernel table's exp_sum, ggml's
 * vectorised exp, within 3 ulp of expf; one division), and O = P V by
 * sgemm straight into the output rows.
 *
 * Q is rounded to fp16 first, as the exact path rounds it (and llama.cpp
 * converts it for its F16 products), so the remaining differences from the
 * exact path are the summation orders of sgemm and the softmax weights kept
 * in float rather than rounded to fp16: an output moves by up to about
 * 2^-11 of sum_i p_i |v_i|, the exact path's fp16 rounding of the weights
 * (tests/unit/test_attn_blas.c holds both paths to a reference in double;
 * this one is within 2e-5 of it, the exact one within 2^-10). A row whose
 * keys are all masked gets zeros (the exact path has no such rows: a query
 * always sees its own key).
 *
 * Work split: (head, chunk) pairs, or whole heads when statistics are
 * gathered, so that each thread owns whole rows of stats; each product is
 * single-threaded inside OpenBLAS. */
typedef struct {
    cpu_ctx *c;
    const qi_attn_paged_args *pg;
    int T, H, Hkv, D, n_swa;
    float scale;
    const float *q;
    float *out;
    float *stats;
    int stats_stride;
    int max_n;  /* most keys of any KV head */
} blas_job;

static int bj_n_keys(const blas_job *j, int hk) { return j->pg->n_slots[hk]; }
static const int32_t *bj_kpos(const blas_job *j, int hk) { return j->pg->pos[hk]; }
static int bj_qpos(const blas_job *j, int t) { return j->pg->q_pos[t]; }
static float *bj_keys(const blas_job *j, float *base, int hk) {
    return base + (long)hk * j->c->blas_len * j->D;
}

static void blas_convert(void *arg, int ith, int nth) {
    blas_job *j = arg;
    const qi_kernels *K = j->c->k;
    const int D = j->D;
    long lo, hi;
    qi_split((long)j->Hkv * j->max_n, ith, nth, &lo, &hi);
    for (long r = lo; r < hi; r++) {
        const int hk = (int)(r / j->max_n), i = (int)(r % j->max_n);
        if (i >= bj_n_keys(j, hk)) continue;
        const int blk = i >> j->pg->shift;
        const long row = (long)(i & ((1 << j->pg->shift) - 1)) * D;
        const uint16_t *kr = j->pg->k_blk[hk][blk] + row, *vr = j->pg->v_blk[hk][blk] + row;
        K->f16_to_f32(kr, bj_keys(j, j->c->bk, hk) + (long)i * D, D);
        K->f16_to_f32(vr, bj_keys(j, j->c->bv, hk) + (long)i * D, D);
    }
}

/* Queries t0..t0+m-1 of head h; S and Qc are the thread's scratch. */
static void blas_rows(const blas_job *j, int h, int t0, int m, float *S, float *Qc) {
    const int D = j->D, H = j->H, hk = h / (H / j->Hkv), n = bj_n_keys(j, hk), n_swa = j->n_swa;
    const int32_t *kpos = bj_kpos(j, hk);
    int qmin = INT_MAX, qmax = INT_MIN;
    for (int r = 0; r < m; r++) {
        const int qp = bj_qpos(j, t0 + r);
        qmin = qp < qmin ? qp : qmin;
        qmax = qp > qmax ? qp : qmax;
    }
    /* the columns c0..c1-1 hold every key some query of the chunk sees */
    int c0 = n, c1 = 0;
    for (int i = 0; i < n; i++)
        if (kpos[i] <= qmax && (n_swa <= 0 || kpos[i] > qmin - n_swa)) {
            if (c0 == n) c0 = i;
            c1 = i + 1;
        }
    float *out = j->out + ((long)t0 * H + h) * D;
    if (c0 >= c1) {
        for (int r = 0; r < m; r++) memset(out + (long)r * H * D, 0, sizeof(float) * (size_t)D);
        return;
    }
    const int w = c1 - c0;
    for (int r = 0; r < m; r++) {
        const float *q = j->q + ((long)(t0 + r) * H + h) * D;
        for (int d = 0; d < D; d++) Qc[(long)r * D + d] = qi_fp16_to_f32(qi_f32_to_fp16(q[d]));
    }
    /* scaled by sgemm's alpha, which multiplies each finished dot */
    qi_blas_sgemm(true, m, w, D, j->scale, Qc, D, bj_keys(j, j->c->bk, hk) + (long)c0 * D, D, S, w);
    const int32_t *kp = kpos + c0, lim = n_swa > 0 ? n_swa : INT32_MAX;
    for (int r = 0; r < m; r++) {
        float *s = S + (long)r * w;
        const int32_t qp = bj_qpos(j, t0 + r);
        /* a select without arithmetic, which the compiler vectorises, and
         * eight independent maxima rather than one chain */
        for (int i = 0; i < w; i++) s[i] = (kp[i] <= qp) & (qp - kp[i] < lim) ? s[i] : -INFINITY;
        float m8[8] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
        int i8 = 0;
        for (; i8 + 8 <= w; i8 += 8)
            for (int l = 0; l < 8; l++) m8[l] = s[i8 + l] > m8[l] ? s[i8 + l] : m8[l];
        float mx = -INFINITY;
        for (int i = i8; i < w; i++) mx = s[i] > mx ? s[i] : mx;
        for (int l = 0; l < 8; l++) mx = m8[l] > mx ? m8[l] : mx;
        if (mx == -INFINITY) {
            memset(s, 0, sizeof(float) * (size_t)w);
            continue;
        }
        const float inv = (float)(1.0 / j->c->k->exp_sum(w, s, mx)); /* masked: exp(-inf) = 0 */
        for (int i = 0; i < w; i++) s[i] *= inv;
    }
    qi_blas_sgemm(false, m, D, w, 1.0f, S, w, bj_keys(j, j->c->bv, hk) + (long)c0 * D, D, out, H * D);
    if (j->stats) {
        float *st = j->stats + (long)h * j->stats_stride + c0;
        for (int r = 0; r < m; r++)
            for (int i = 0; i < w; i++) st[i] += S[(long)r * w + i];
    }
}

static void blas_work(void *arg, int ith, int nth) {
    blas_job *j = arg;
    float *S = j->c->bs + (long)ith * BLAS_QCHUNK * j->c->blas_len;
    float *Qc = j->c->bq + (long)ith * BLAS_QCHUNK * j->c->blas_d;
    const int n_chunks = (j->T + BLAS_QCHUNK - 1) / BLAS_QCHUNK;
    long lo, hi;
    if (j->stats) {
        qi_split(j->H, ith, nth, &lo, &hi);
        for (long h = lo; h < hi; h++)
            for (int t0 = 0; t0 < j->T; t0 += BLAS_QCHUNK)
                blas_rows(j, (int)h, t0, j->T - t0 < BLAS_QCHUNK ? j->T - t0 : BLAS_QCHUNK, S, Qc);
        return;
    }
    qi_split((long)j->H * n_chunks, ith, nth, &lo, &hi);
    for (long it = lo; it < hi; it++) {
        const int h = (int)(it / n_chunks), t0 = (int)(it % n_chunks) * BLAS_QCHUNK;
        blas_rows(j, h, t0, j->T - t0 < BLAS_QCHUNK ? j->T - t0 : BLAS_QCHUNK, S, Qc);
    }
}

static void blas_run(blas_job *j) {
    cpu_ctx *c = j->c;
    QI_ASSERT(j->max_n <= c->blas_len && j->Hkv <= c->blas_hkv && j->D <= c->blas_d); /* sized by reserve() */
    qi_pool_run(c->pool, blas_convert, j);
    qi_pool_run(c->pool, blas_work, j);
}

static void blas_attention_paged(cpu_ctx *c, const qi_attn_paged_args *a) {
    int max_n = 0;
    for (int hk = 0; hk < a->Hkv; hk++) max_n = a->n_slots[hk] > max_n ? a->n_slots[hk] : max_n;
    blas_job j = {.c = c, .pg = a, .T = a->T, .H = a->H, .Hkv = a->Hkv, .D = a->D, .n_swa = a->n_swa,
                  .scale = a->scale, .q = a->q, .out = a->out, .stats = a->stats,
                  .stats_stride = a->stats_stride, .max_n = max_n};
    blas_run(&j);
}

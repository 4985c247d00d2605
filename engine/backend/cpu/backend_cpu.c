/* backend_cpu.c - the CPU backend: every op over the kernels of kernels.h,
 * parallelised over a persistent thread pool.
 *
 * The arithmetic is llama.cpp's x86 CPU path, operation for operation, so
 * that logits agree bit for bit rather than approximately (SmolLM2's huge
 * activations turn any 1e-6 difference into a flipped activation quant):
 * activations are quantised per row to the weight type's dot partner exactly
 * as llama.cpp does at run time (quant_act.c); the dots use llama.cpp's x86
 * lanes and FMAs (kernels_ref.c says which; for q4_K/q6_K the order also
 * depends on whether the matmul has 8 tokens or more, as llama.cpp switches
 * to its tiled kernel there), falling back to quant.c's generic order for
 * weight types without an x86-order kernel (q5_K, F16/BF16/F32 weights);
 * RMSNorm sums in double; RoPE angles advance by
 * repeated multiplication in float and the rotation is fused as GCC fused
 * ggml's; attention is the non-flash path: fp16 K/V cache, queries and
 * softmax weights rounded to fp16, F16 dots in the order of ggml_vec_dot_f16
 * for one-token steps and of llamafile's tinyBLAS for batches, softmax with
 * ggml's vectorised exp.
 *
 * Work split: matmuls by output rows (each weight row read once per block of
 * MM_TOKEN_BLOCK tokens, whose quantised activations stay in L1), attention
 * by (token, head) pairs (whole heads of a call that gathers statistics;
 * several sequences' calls in one pool run), SwiGLU / GeGLU by rows, or by
 * 16-element-aligned ranges of each row when there are fewer rows than
 * threads. A sliding window masks the older scores to -inf rather than
 * shortening the row.
 *
 * The attn_blas option trades that agreement for speed in prompts'
 * attention (T >= 2; one-token steps keep the exact path): per (sequence,
 * head), scores and outputs are two OpenBLAS sgemm products over float
 * copies of the fp16 K and V rows, with a float softmax in between (see
 * "attention through OpenBLAS" below). Considered and left: a blocked
 * float GEMM of our own, which would need the tiling and packing OpenBLAS
 * already has; flash-style fused tiles, which change the order further and
 * make the gathered statistics harder to keep.
 */
#include <limits.h>
#include <math.h>
#include <string.h>

#include "backend.h"
#include "blas.h"
#include "kernels.h"
#include "qinfer/quant.h"
#include "quant_act.h"
#include "threadpool.h"
#include "cpu_int.h"


/* ---- matmul ------------------------------------------------------------- */

/* Up to MM_MAX_W weights that read the same activations (Q, K and V; gate
 * and up) in one job: the activations are quantised once, and the rows of
 * all of them are split over the threads in one pool run. */
#define MM_MAX_W 4

/* Activation values from which quantising them is shared out over the
 * pool; below, the caller quantises alone, which costs less than a round
 * of waking the workers (a decode step of a few sequences: one row of
 * SmolLM2's 576 values takes well under a microsecond). */
#define MM_QUANT_POOL_MIN 8192

typedef struct {
    const qi_weight *w[MM_MAX_W];
    float *y[MM_MAX_W];
    qi_k_gemm_fn gemm[MM_MAX_W]; /* NULL: quant.c's generic-order reference */
    bool packed[MM_MAX_W];       /* gemm takes w->packed's 16-row groups */
    int block[MM_MAX_W];         /* tokens per gemm call: MM_TOKEN_BLOCK, or the table's wide_block */
    int n_w;
    long n_rows;                 /* of all the weights */
    const float *x;
    int T;
    int64_t n_cols;
    uint32_t dot_type;
    uint64_t qrow_bytes;
    void *xq;
} mm_job;

static void mm_quantize(void *arg, int ith, int nth) {
    mm_job *j = arg;
    long lo, hi;
    qi_split(j->T, ith, nth, &lo, &hi);
    for (long t = lo; t < hi; t++)
        qi_quantize_act_row(j->dot_type, j->x + t * j->n_cols, (char *)j->xq + t * j->qrow_bytes, j->n_cols);
}

/* Rows [lo, hi) of weight i, MM_TOKEN_BLOCK tokens at a time. */
static void mm_range(const mm_job *j, int i, long lo, long hi) {
    const qi_weight *w = j->w[i];
    if (!j->gemm[i]) {
        for (long r = lo; r < hi; r++) {
            const void *wr = (const char *)w->data + (uint64_t)r * w->row_bytes;
            for (int t = 0; t < j->T; t++)
                j->y[i][(long)t * w->n_rows + r] =
                    qi_vec_dot_ref(w->type, w->n_cols, wr, (const char *)j->xq + t * j->qrow_bytes);
        }
        return;
    }
    const char *base;
    uint64_t stride;
    if (j->packed[i]) {
        base = (const char *)w->packed + (uint64_t)(lo / QI_K_PACK_ROWS) * w->packed_group_bytes;
        stride = w->packed_group_bytes;
    } else {
        base = (const char *)w->data + (uint64_t)lo * w->row_bytes;
        stride = w->row_bytes;
    }
    const int tb = j->block[i];
    for (int t0 = 0; t0 < j->T; t0 += tb) {
        const int nt = j->T - t0 < tb ? j->T - t0 : tb;
        j->gemm[i](w->n_cols, base, stride, (int)(hi - lo), (const char *)j->xq + (uint64_t)t0 * j->qrow_bytes,
                   j->qrow_bytes, nt, j->y[i] + (long)t0 * w->n_rows + lo, (size_t)w->n_rows);
    }
}

/* The rows of all weights, numbered one after another, are split evenly;
 * within a packed weight a split point moves up to a 16-row group boundary
 * (the same point for the threads on both sides of it). */
static long mm_snap(const mm_job *j, int i, long r) {
    if (!j->packed[i] || r % QI_K_PACK_ROWS == 0) return r;
    r += QI_K_PACK_ROWS - r % QI_K_PACK_ROWS;
    return r < j->w[i]->n_rows ? r : j->w[i]->n_rows;
}

static void mm_rows(void *arg, int ith, int nth) {
    mm_job *j = arg;
    long lo, hi, off = 0;
    qi_split(j->n_rows, ith, nth, &lo, &hi);
    for (int i = 0; i < j->n_w; off += j->w[i]->n_rows, i++) {
        const long n = j->w[i]->n_rows;
        const long a = mm_snap(j, i, lo - off < 0 ? 0 : lo - off > n ? n : lo - off);
        const long b = mm_snap(j, i, hi - off < 0 ? 0 : hi - off > n ? n : hi - off);
        if (a < b) mm_range(j, i, a, b);
    }
}

/* y_i[T][w_i->n_rows] = x . W_i^T for i < n, all of w_i->n_cols columns;
 * weights whose activation types differ are taken in separate runs. */
static void cpu_matmul_n(qi_backend *b, const qi_weight *const *w, float *const *y, int n, const float *x, int T) {
    cpu_ctx *c = C(b);
    for (int i0 = 0; i0 < n;) {
        mm_job j = {.x = x, .T = T, .n_cols = w[i0]->n_cols, .dot_type = qi_vec_dot_type(w[i0]->type),
                    .xq = c->scratch};
        for (; i0 < n && j.n_w < MM_MAX_W && qi_vec_dot_type(w[i0]->type) == j.dot_type; i0++) {
            const qi_weight *wi = w[i0];
            QI_ASSERT(wi->n_cols == j.n_cols);
            const int k = j.n_w++;
            j.w[k] = wi;
            j.y[k] = y[i0];
            const bool wide = T >= QI_K_WIDE_MIN && c->k->gemm_wide[wi->type];
            j.gemm[k] = wide ? c->k->gemm_wide[wi->type] : c->k->gemm[wi->type];
            j.block[k] = wide && c->k->wide_block > 0 ? c->k->wide_block : MM_TOKEN_BLOCK;
            if (wi->packed && c->k->gemm_packed[wi->type]) {
                j.gemm[k] = c->k->gemm_packed[wi->type];
                j.packed[k] = true;
                j.block[k] = MM_TOKEN_BLOCK;
            } else if (wi->packed && wide && c->k->gemm_wide_packed[wi->type]) {
                j.gemm[k] = c->k->gemm_wide_packed[wi->type]; /* fewer tokens read the rows */
                j.packed[k] = true;
            }
            j.n_rows += wi->n_rows;
        }
        uint64_t rb = 0;
        qi_type_row_bytes(j.dot_type, (uint64_t)j.n_cols, &rb);
        j.qrow_bytes = rb;
        QI_ASSERT(rb * (uint64_t)T <= c->scratch_bytes); /* sized by reserve() */
        if ((long)T * j.n_cols >= MM_QUANT_POOL_MIN)
            qi_pool_run(c->pool, mm_quantize, &j);
        else
            mm_quantize(&j, 0, 1);
        qi_pool_run(c->pool, mm_rows, &j);
    }
}

static void cpu_matmul(qi_backend *b, const qi_weight *w, const float *x, int T, float *y) {
    cpu_matmul_n(b, &w, &y, 1, x, T);
}

/* ---- element-wise ops ------------------------------------------------------ */

/* Rows per pass of rmsnorm. Each row's sum of squares is one chain of
 * double additions in element order, as ggml's; NORM_ROWS rows' chains
 * advance together, so their additions overlap instead of each waiting on
 * the one before it (one chain is bound by the latency of an addition). */
#define NORM_ROWS 8

static void norm_row(const float *xr, const float *w, int n, double sum, float eps, float *yr) {
    const float scale = 1.0f / sqrtf((float)(sum / n) + eps);
    for (int i = 0; i < n; i++) yr[i] = (xr[i] * scale) * w[i];
}

static void cpu_rmsnorm(qi_backend *b, const float *x, const float *w, int T, int n, float eps,
                        float *y) {
    int t = 0;
    for (; t + NORM_ROWS <= T; t += NORM_ROWS) {
        const float *x0 = x + (long)t * n;
        double sum[NORM_ROWS] = {0};
        for (int i = 0; i < n; i++)
            for (int r = 0; r < NORM_ROWS; r++) {
                const float v = x0[(long)r * n + i];
                sum[r] += (double)(v * v);
            }
        /* every sum is taken before any row is written (y may alias x) */
        for (int r = 0; r < NORM_ROWS; r++) norm_row(x0 + (long)r * n, w, n, sum[r], eps, y + (long)(t + r) * n);
    }
    for (; t < T; t++) {
        const float *xr = x + (long)t * n;
        double sum = 0.0;
        for (int i = 0; i < n; i++) sum += (double)(xr[i] * xr[i]);
        norm_row(xr, w, n, sum, eps, y + (long)t * n);
    }
}

/* ---- RoPE ---------------------------------------------------------------------- */

/* The rotation itself is the kernel table's rope (ggml's fused
 * multiply-adds); here are the angles, as ggml computes them: theta starts
 * at the position and is multiplied by base^(-2/n_rot) pair by pair. They
 * depend only on the row's position and the parameters, so the tables of
 * the last two calls' rows are kept: the layers of a step share its
 * positions, and Gemma 3's two bases take a slot each. Rows beyond what
 * reserve() sized are computed per call. */
#define ROPE_POOL_MIN 16384 /* rotated pairs from which a call is shared out */

static void rope_angles(int32_t pos, int n_pairs, float theta_scale, float freq_scale, float *cs, float *sn) {
    float theta = (float)pos;
    for (int i = 0; i < n_pairs; i++) {
        const float th = theta * freq_scale;
        cs[i] = cosf(th);
        sn[i] = sinf(th);
        theta *= theta_scale;
    }
}

typedef struct {
    const qi_kernels *K;
    float *q, *k;
    int Hq, Hk, T, D, n_pairs, neox;
    const int32_t *pos;
    float theta_scale, freq_scale;
    float *cs, *sn; /* [T][n_pairs], or NULL: each row's angles on the stack */
    bool fill;      /* the table's rows are to be computed */
} rope_job;

static void rope_work(void *arg, int ith, int nth) {
    rope_job *j = arg;
    float cs_row[512], sn_row[512];
    long lo, hi;
    qi_split(j->T, ith, nth, &lo, &hi);
    for (long t = lo; t < hi; t++) {
        float *cs = j->cs ? j->cs + t * j->n_pairs : cs_row, *sn = j->cs ? j->sn + t * j->n_pairs : sn_row;
        if (!j->cs || j->fill) rope_angles(j->pos[t], j->n_pairs, j->theta_scale, j->freq_scale, cs, sn);
        j->K->rope(j->q + t * j->Hq * j->D, j->Hq, j->D, j->n_pairs, j->neox, cs, sn);
        if (j->k) j->K->rope(j->k + t * j->Hk * j->D, j->Hk, j->D, j->n_pairs, j->neox, cs, sn);
    }
}

static void cpu_rope(qi_backend *b, float *q, int Hq, float *k, int Hk, int T, int D, int n_rot,
                     const int32_t *pos, float base, float freq_scale, int mode) {
    cpu_ctx *c = C(b);
    QI_ASSERT(n_rot <= 1024 && n_rot % 2 == 0 && n_rot <= D);
    rope_job j = {.K = c->k, .q = q, .k = k, .Hq = Hq, .Hk = k ? Hk : 0, .T = T, .D = D, .n_pairs = n_rot / 2,
                  .neox = mode == QI_ROPE_NEOX, .pos = pos, .theta_scale = powf(base, -2.0f / (float)n_rot),
                  .freq_scale = freq_scale};
    if (T <= c->rope_rows && j.n_pairs <= c->rope_pairs) {
        rope_tab *hit = NULL;
        for (int i = 0; i < 2 && !hit; i++) {
            rope_tab *r = &c->rope[i];
            if (r->T == T && r->n_rot == n_rot && r->base == base && r->freq_scale == freq_scale &&
                memcmp(r->pos, pos, sizeof(int32_t) * (size_t)T) == 0)
                hit = r;
        }
        if (!hit) {
            hit = &c->rope[c->rope_next];
            c->rope_next ^= 1;
            hit->T = T;
            hit->n_rot = n_rot;
            hit->base = base;
            hit->freq_scale = freq_scale;
            memcpy(hit->pos, pos, sizeof(int32_t) * (size_t)T);
            j.fill = true;
        }
        j.cs = hit->cs;
        j.sn = hit->sn;
    }
    if ((long)T * (j.Hq + j.Hk) * j.n_pairs >= ROPE_POOL_MIN)
        qi_pool_run(c->pool, rope_work, &j);
    else
        rope_work(&j, 0, 1);
}

typedef struct {
    void (*fn)(int64_t n, float *g, const float *u);
    float *gate;
    const float *up;
    int T, n;
} glu_job;

static void glu_work(void *arg, int ith, int nth) {
    glu_job *j = arg;
    /* rows when there are enough to go round; otherwise split the row in
     * 16-element units, so every range starts where one of ggml's 16-lane
     * chunks does */
    if (j->T >= nth) {
        long lo, hi;
        qi_split(j->T, ith, nth, &lo, &hi);
        for (long t = lo; t < hi; t++) j->fn(j->n, j->gate + t * j->n, j->up + t * j->n);
        return;
    }
    for (int t = 0; t < j->T; t++) {
        long lo, hi;
        qi_split((j->n + 15) / 16, ith, nth, &lo, &hi);
        lo *= 16;
        hi = hi * 16 < j->n ? hi * 16 : j->n;
        if (lo < hi) j->fn(hi - lo, j->gate + (long)t * j->n + lo, j->up + (long)t * j->n + lo);
    }
}

static void cpu_swiglu(qi_backend *b, float *gate, const float *up, int T, int n) {
    glu_job j = {C(b)->k->swiglu, gate, up, T, n};
    qi_pool_run(C(b)->pool, glu_work, &j);
}

static void cpu_geglu(qi_backend *b, float *gate, const float *up, int T, int n) {
    glu_job j = {C(b)->k->geglu, gate, up, T, n};
    qi_pool_run(C(b)->pool, glu_work, &j);
}

static void cpu_get_rows(qi_backend *b, const qi_weight *w, const int32_t *ids, int T, float *out) {
    for (int t = 0; t < T; t++)
        qi_dequantize_row_ref(w->type, (const char *)w->data + (uint64_t)ids[t] * w->row_bytes,
                              out + (long)t * w->n_cols, w->n_cols);
}

/* ---- element-wise, in the engine's order (one float operation each) -------------- */

static void cpu_kv_write(qi_backend *b, const float *const *src, uint16_t *const *dst, int n, int D) {
    const qi_kernels *K = C(b)->k;
    for (int i = 0; i < n; i++) K->f32_to_f16(src[i], dst[i], D);
}

static void cpu_add(qi_backend *b, float *x, const float *y, long n) {
    (void)b;
    for (long i = 0; i < n; i++) x[i] += y[i];
}

/* x[t][i] += bias[i]: a matmul's bias (qwen2's q, k, v), one f32 add per
 * element as ggml_add broadcasts it. */
static void cpu_add_bias(qi_backend *b, float *x, const float *bias, int T, int n) {
    (void)b;
    for (int t = 0; t < T; t++) {
        float *xr = x + (long)t * n;
        for (int i = 0; i < n; i++) xr[i] += bias[i];
    }
}

static void cpu_scale(qi_backend *b, float *x, long n, float s) {
    (void)b;
    for (long i = 0; i < n; i++) x[i] *= s;
}

static void cpu_softcap(qi_backend *b, float *x, long n, float cap) {
    (void)b;
    const float inv = 1.0f / cap;
    for (long i = 0; i < n; i++) x[i] = tanhf(x[i] * inv) * cap;
}

static void cpu_gather_rows(qi_backend *b, float *x, const int32_t *rows, int n, int width) {
    (void)b;
    for (int r = 0; r < n; r++)
        if (rows[r] != r) memmove(x + (long)r * width, x + (long)rows[r] * width, sizeof(float) * (size_t)width);
}

static const qi_backend_i k_cpu_iface;

void qi_backend_cpu_host_run(qi_backend *cpu, void (*fn)(void *ctx, int ith, int nth), void *ctx) {
    QI_ASSERT(cpu->iface == &k_cpu_iface);
    qi_pool_run(C(cpu)->pool, fn, ctx);
}

static void cpu_free(qi_backend *b) {
    cpu_ctx *c = C(b);
    if (c) {
        qi_pool_free(c->pool);
        qi_free(c->scratch);
        qi_free(c->att);
        qi_free(c->w16);
        qi_free(c->bk);
        qi_free(c->bv);
        qi_free(c->bs);
        qi_free(c->bq);
        for (int i = 0; i < 2; i++) {
            qi_free(c->rope[i].cs);
            qi_free(c->rope[i].sn);
            qi_free(c->rope[i].pos);
        }
        qi_free(c);
    }
    qi_free(b);
}

static qi_status cpu_reserve(qi_backend *b, size_t scratch_bytes, int max_rows, int max_pos, int Hkv, int D,
                             qi_err *err);

/* ---- the device: host memory, a stream that runs at once ------------------------ */

/* 64-byte aligned, as the packed weight groups and the kernels' vector
 * loads prefer. */
static void *cpu_buf_mem(qi_backend *b, size_t n) {
    (void)b;
    return qi_malloc_aligned(64, n);
}
static void cpu_buf_release(qi_backend *b, void *mem) {
    (void)b;
    qi_free(mem);
}
static void cpu_copy(qi_backend *b, void *dst, const void *src, size_t n) {
    (void)b;
    memmove(dst, src, n);
}
static void cpu_mark(qi_backend *b, qi_event *ev) {
    (void)b;
    qi_event_complete(ev, qi_dev_now());
}
/* The host is the CPU's stream: waiting is waiting on the host. */
static void cpu_wait(qi_backend *b, qi_event *ev) {
    (void)b;
    qi_event_sync(ev);
}
static void cpu_drain(qi_backend *b) { (void)b; }

/* ---- weights: the model's rows, or with QI_CPU_REPACK their packed form --------- */

/* Bytes of one packed 16-row group of w: the packed order's groups, or for
 * q4_K and q6_K on the AMX table that table's packed form; 0 for none. */
static uint64_t pack_group_bytes(const cpu_ctx *c, const qi_weight *w) {
    if (qi_k_pack_supported(w->type)) return qi_k_pack_group_bytes(w->type, w->n_cols);
    if (c->k->gemm_wide_packed[w->type]) return qi_k_amx_pack_group_bytes(w->type, w->n_cols);
    return 0;
}

static size_t cpu_weight_size(qi_backend *b, const qi_weight *w, bool matmul) {
    if (!C(b)->repack || !matmul) return 0;
    const uint64_t groups = (uint64_t)(w->n_rows + QI_K_PACK_ROWS - 1) / QI_K_PACK_ROWS;
    return (size_t)(groups * pack_group_bytes(C(b), w));
}

/* The 16-row groups in mem; the rows stay the model's, host memory the
 * CPU reads (get_rows reads the token embedding by row, also when the
 * output head shares it). */
static void cpu_weight_prepare(qi_backend *b, const qi_weight *w, bool matmul, void *mem, qi_weight *out) {
    (void)matmul;
    const uint64_t gb = pack_group_bytes(C(b), w);
    const bool pk = qi_k_pack_supported(w->type);
    char *dst = mem;
    for (int64_t r0 = 0; r0 < w->n_rows; r0 += QI_K_PACK_ROWS, dst += gb) {
        const int rows = w->n_rows - r0 < QI_K_PACK_ROWS ? (int)(w->n_rows - r0) : QI_K_PACK_ROWS;
        const char *src = (const char *)w->data + (uint64_t)r0 * w->row_bytes;
        if (pk)
            qi_k_pack_group(w->type, w->n_cols, src, w->row_bytes, rows, dst);
        else
            qi_k_amx_pack_group(w->type, w->n_cols, src, w->row_bytes, rows, dst);
    }
    out->data = w->data;
    out->packed = mem;
    out->packed_group_bytes = gb;
}

static const qi_backend_i k_cpu_iface = {
    .version = QI_BACKEND_VERSION,
    .name = "cpu",
    .matmul = cpu_matmul,
    .matmul_n = cpu_matmul_n,
    .rmsnorm = cpu_rmsnorm,
    .rope = cpu_rope,
    .attention_paged = cpu_attention_paged,
    .attention_paged_n = cpu_attention_paged_n,
    .attention_merge = cpu_attention_merge,
    .swiglu = cpu_swiglu,
    .geglu = cpu_geglu,
    .get_rows = cpu_get_rows,
    .kv_write = cpu_kv_write,
    .add = cpu_add,
    .scale = cpu_scale,
    .softcap = cpu_softcap,
    .gather_rows = cpu_gather_rows,
    .add_bias = cpu_add_bias,
    .reserve = cpu_reserve,
    .free = cpu_free,
    .buf_mem = cpu_buf_mem,
    .buf_release = cpu_buf_release,
    .copy = cpu_copy,
    .mark = cpu_mark,
    .wait = cpu_wait,
    .drain = cpu_drain,
    .weight_size = cpu_weight_size,
    .weight_prepare = cpu_weight_prepare,
};

qi_status qi_backend_cpu_create(int n_threads, unsigned flags, qi_backend **out, qi_err *err) {
    *out = NULL;
    const bool attn_blas = flags & QI_CPU_ATTN_BLAS;
    if (attn_blas) {
        qi_status st = qi_blas_load(err);
        if (st) return st;
    }
    qi_backend *b = qi_calloc(1, sizeof *b);
    cpu_ctx *c = qi_calloc(1, sizeof *c);
    if (!b || !c) {
        qi_free(b);
        qi_free(c);
        return QI_ERR(err, QI_ERR_NOMEM, "out of memory creating CPU backend");
    }
    b->iface = &k_cpu_iface;
    b->ctx = c;
    b->info = (qi_dev_info){.name = "cpu", .kind = QI_DEV_CPU, .host_visible = true};
    c->k = qi_kernels_get();
    c->attn_blas = attn_blas;
    c->repack = flags & QI_CPU_REPACK;
    qi_status st = qi_pool_create(n_threads, &c->pool, err);
    if (st) {
        cpu_free(b);
        return st;
    }
    *out = b;
    return QI_OK;
}

/* Grow *p to n floats; false (and *p unchanged) when out of memory or when
 * the size does not fit. */
static bool grow_f32(float **p, size_t n) {
    if (n > SIZE_MAX / sizeof **p) return false;
    float *q = qi_realloc(*p, n * sizeof **p);
    if (!q) return false;
    *p = q;
    return true;
}

static qi_status cpu_reserve(qi_backend *b, size_t scratch_bytes, int max_rows, int max_pos, int Hkv, int D,
                             qi_err *err) {
    cpu_ctx *c = C(b);
    if (max_rows > c->rope_rows || D / 2 > c->rope_pairs) {
        const int rows = max_rows > c->rope_rows ? max_rows : c->rope_rows;
        const int pairs = D / 2 > c->rope_pairs ? D / 2 : c->rope_pairs;
        const size_t n = (size_t)rows * (size_t)pairs;
        for (int i = 0; i < 2; i++) {
            rope_tab *r = &c->rope[i];
            int32_t *pos = qi_realloc(r->pos, sizeof(int32_t) * (size_t)rows);
            if (pos) r->pos = pos;
            if (!pos || !grow_f32(&r->cs, n) || !grow_f32(&r->sn, n))
                return QI_ERR(err, QI_ERR_NOMEM, "out of memory reserving RoPE tables for %d rows", rows);
            r->T = 0; /* the row stride changed: nothing kept is valid */
        }
        c->rope_rows = rows;
        c->rope_pairs = pairs;
    }
    if (scratch_bytes > c->scratch_bytes) {
        void *p = qi_realloc(c->scratch, scratch_bytes);
        if (!p) return QI_ERR(err, QI_ERR_NOMEM, "out of memory reserving %zu scratch bytes", scratch_bytes);
        c->scratch = p;
        c->scratch_bytes = scratch_bytes;
    }
    if (max_pos > c->att_len) {
        const size_t n = (size_t)max_pos * (size_t)qi_pool_size(c->pool);
        float *p = qi_realloc(c->att, sizeof(float) * n);
        if (p) c->att = p;
        uint16_t *p16 = p ? qi_realloc(c->w16, sizeof(uint16_t) * n) : NULL;
        if (p16) c->w16 = p16;
        if (!p || !p16) return QI_ERR(err, QI_ERR_NOMEM, "out of memory reserving attention scratch");
        c->att_len = max_pos;
    }
    if (c->attn_blas && (max_pos > c->blas_len || Hkv > c->blas_hkv || D > c->blas_d)) {
        const int len = max_pos > c->blas_len ? max_pos : c->blas_len;
        const int hkv = Hkv > c->blas_hkv ? Hkv : c->blas_hkv, d = D > c->blas_d ? D : c->blas_d;
        const size_t nt = (size_t)qi_pool_size(c->pool), kv = (size_t)len * (size_t)hkv * (size_t)d;
        if (!grow_f32(&c->bk, kv) || !grow_f32(&c->bv, kv) ||
            !grow_f32(&c->bs, nt * BLAS_QCHUNK * (size_t)len) || !grow_f32(&c->bq, nt * BLAS_QCHUNK * (size_t)d))
            return QI_ERR(err, QI_ERR_NOMEM, "out of memory reserving attn_blas scratch for %d positions", len);
        c->blas_len = len;
        c->blas_hkv = hkv;
        c->blas_d = d;
    }
    return QI_OK;
}

size_t qi_backend_max_act_row_bytes(const qi_model *m) {
    uint64_t best = 0;
    qi_type_row_bytes(qi_vec_dot_type(m->output.type), (uint64_t)m->output.n_cols, &best);
    for (int l = 0; l < m->hp.n_layer; l++) {
        const qi_layer *ly = &m->layers[l];
        const qi_weight *lw[] = {&ly->wq, &ly->wk, &ly->wv, &ly->wo, &ly->w_gate, &ly->w_up, &ly->w_down};
        for (size_t i = 0; i < sizeof lw / sizeof lw[0]; i++) {
            uint64_t rb = 0;
            qi_type_row_bytes(qi_vec_dot_type(lw[i]->type), (uint64_t)lw[i]->n_cols, &rb);
            if (rb > best) best = rb;
        }
    }
    return (size_t)best;
}

void qi_backend_free(qi_backend *b) {
    if (b) b->iface->free(b);
}

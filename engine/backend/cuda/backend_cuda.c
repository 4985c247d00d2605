/* backend_cuda.c - the CUDA device (backend.h): a GPU's memory, a stream
 * for its ops, a copy stream beside it, and the kernels of kernels_cuda.h
 * behind the backend interface.
 *
 * Plain C: every CUDA call goes through a qi_cuda_rt (cuda_rt.h), the
 * build's or a test's, so all of this runs in tests on machines without a
 * GPU. What the device does itself:
 *
 * - Memory: buffers are device allocations, counted by device.c against
 *   the capacity (the GPU's memory, or less: cuda:BYTES). Its private
 *   memory (the kernels' scratch, the staging ring) is counted in in_use
 *   too, so a report of the device's memory is the whole of it.
 * - Host-side tables: the interface passes some op arguments in host
 *   memory (positions, token ids, KV block tables, the rows of a
 *   kv_write). Each op copies its tables into a pinned ring, queues one
 *   copy of them to the device's half of the ring, and launches on the
 *   device copy. The ring is reused from its start when full, after the
 *   stream has drained, so no queued copy reads a part being rewritten.
 * - The copy stream: a second CUDA stream, for uploads that should not
 *   wait behind the ops (the swap worker's), ordered with the main one by
 *   cudaStreamWaitEvent on the device's own events; another device's
 *   event is waited for by the host. Either stream may be fed from
 *   another host thread: the event pool and the clock's anchor are
 *   locked, and so is the failure record.
 * - Events: a marker is a CUDA event recorded on the stream; the host
 *   completes it by asking (ev_sync), its time being the device time since
 *   an anchor event, so op and copy times come from the GPU's clock, not
 *   the host's around an asynchronous call. The anchor moves to a newer
 *   event now and then, so the float milliseconds CUDA gives keep their
 *   precision in long runs.
 * - Errors: every runtime call and launch is checked; a failure inside
 *   the stream's work is recorded (qi_dev_fail) naming the device, the
 *   call or kernel, its arguments and the runtime's reason, and surfaces
 *   at the next synchronise, once.
 * - Scratch: the kernels' temporaries (dequantised weight tiles, attention
 *   scores) in one device allocation, sized in reserve and grown, after a
 *   drain, if an op needs more.
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "backend.h"
#include "cuda/cuda_rt.h"

#define RING_MIN ((size_t)8 << 20)
#define RING_ALIGN 16
#define EV_POOL 64
#define ANCHOR_MOVE_MS 100.0f

typedef struct {
    const qi_cuda_rt *rt;
    const qi_cuk *k;
    void *rx; /* rt->ctx */
    qi_cuk_ctx kc;
    void *stream, *blas;
    void *cstream;         /* the copy stream */
    pthread_mutex_t mu;    /* the failure record (b->lock) */
    pthread_mutex_t ev_mu; /* the event pool and the anchor */
    bool mu_made;
    char *ring_h, *ring_d; /* the staging ring: pinned host, device */
    size_t ring_cap, ring_off;
    long ring_gen;         /* counts the ring's reuses from its start */
    struct {               /* the last array staged alone (stage_array) */
        long gen;
        size_t off, bytes;
    } last;
    void *anchor;          /* a completed CUDA event and its time */
    double anchor_t;
    void *pool[EV_POOL];   /* CUDA events to reuse */
    int n_pool;
    char gpu[96];
    size_t total;
} cu_ctx;

static const qi_cuda_rt *g_rt_override;
void qi_cuda_use_rt(const struct qi_cuda_rt *rt) { g_rt_override = rt; }

static cu_ctx *C(qi_backend *b) { return (cu_ctx *)b->ctx; }

/* ---- failures ------------------------------------------------------------ */

/* Record a failed call (code != 0) as the device's failure: "cuda: WHAT
 * failed: REASON". Returns whether it failed. */
static bool failed(qi_backend *b, int code, bool blas, const char *fmt, ...) {
    if (!code) return false;
    cu_ctx *c = C(b);
    char what[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    qi_err e = {0};
    QI_ERR(&e, QI_ERR_BACKEND, "%s: %s failed: %s (%s error %d)", b->info.name, what,
           c->rt->error_string(c->rx, code, blas), blas ? "cuBLAS" : c->rt->name, code);
    qi_dev_fail(b, QI_ERR_BACKEND, &e);
    return true;
}

/* A kernel launch's result: kernel names starting "cublas" are cuBLAS calls. */
static bool kfailed(qi_backend *b, int code, const char *what, const char *fmt, ...) {
    if (!code) return false;
    char args[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    if (!what) what = "a kernel";
    return failed(b, code, strncmp(what, "cublas", 6) == 0, "%s (%s)", what, args);
}

/* An op the kernels cannot run, recorded as failures inside the stream are. */
static void unsupported(qi_backend *b, const char *fmt, ...) {
    char msg[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    qi_err e = {0};
    QI_ERR(&e, QI_ERR_UNSUPPORTED, "%s: %s", b->info.name, msg);
    qi_dev_fail(b, QI_ERR_UNSUPPORTED, &e);
}

/* The main stream drained (what reads the scratch and the ring). */
static bool drain_ok(qi_backend *b) {
    cu_ctx *c = C(b);
    return !failed(b, c->rt->stream_sync(c->rx, c->stream), false, "cudaStreamSynchronize");
}

/* Both streams drained (before a buffer goes, and for a synchronise). */
static bool drain_all_ok(qi_backend *b) {
    cu_ctx *c = C(b);
    return drain_ok(b) &&
           !failed(b, c->rt->stream_sync(c->rx, c->cstream), false, "cudaStreamSynchronize (the copy stream)");
}

/* ---- private memory: scratch and the staging ring ---------------------------- */

static void count(qi_backend *b, size_t add, size_t sub) {
    qi_dev_info *in = &b->info;
    in->in_use = in->in_use - sub + add;
    if (in->in_use > in->peak) in->peak = in->in_use;
}

/* At least need bytes of kernel scratch (the stream drained before the old
 * one goes). */
static bool scratch(qi_backend *b, size_t need) {
    cu_ctx *c = C(b);
    if (need <= c->kc.scratch_bytes) return true;
    if (c->kc.scratch) {
        if (!drain_ok(b)) return false;
        failed(b, c->rt->dev_free(c->rx, c->kc.scratch), false, "cudaFree(scratch)");
        count(b, 0, c->kc.scratch_bytes);
        c->kc.scratch = NULL;
        c->kc.scratch_bytes = 0;
    }
    need = (need + 0xfffff) & ~(size_t)0xfffff;
    if (failed(b, c->rt->dev_malloc(c->rx, &c->kc.scratch, need), false, "cudaMalloc(%zu bytes of kernel scratch)",
               need)) {
        c->kc.scratch = NULL;
        return false;
    }
    c->kc.scratch_bytes = need;
    count(b, need, 0);
    return true;
}

static void ring_release(qi_backend *b) {
    cu_ctx *c = C(b);
    if (c->ring_h) failed(b, c->rt->host_free(c->rx, c->ring_h), false, "cudaFreeHost(staging ring)");
    if (c->ring_d) {
        failed(b, c->rt->dev_free(c->rx, c->ring_d), false, "cudaFree(staging ring)");
        count(b, 0, c->ring_cap);
    }
    c->ring_h = c->ring_d = NULL;
    c->ring_cap = c->ring_off = 0;
}

/* A ring of at least cap bytes (the stream drained before an old one goes). */
static bool ring_size(qi_backend *b, size_t cap) {
    cu_ctx *c = C(b);
    if (cap <= c->ring_cap) return true;
    if (c->ring_cap && !drain_ok(b)) return false;
    ring_release(b);
    cap = (cap + 0xfffff) & ~(size_t)0xfffff;
    void *h = NULL, *d = NULL;
    if (failed(b, c->rt->host_malloc(c->rx, &h, cap), false, "cudaMallocHost(%zu bytes of staging ring)", cap))
        return false;
    if (failed(b, c->rt->dev_malloc(c->rx, &d, cap), false, "cudaMalloc(%zu bytes of staging ring)", cap)) {
        c->rt->host_free(c->rx, h);
        return false;
    }
    c->ring_h = h;
    c->ring_d = d;
    c->ring_cap = cap;
    c->ring_off = 0;
    c->ring_gen++;
    count(b, cap, 0);
    return true;
}

/* The tables of one op: room for n bytes in the ring, filled on the host
 * through *host, then staged() queues their copy. */
typedef struct {
    size_t off, n, used;
} stage;

static bool stage_begin(qi_backend *b, size_t n, stage *s) {
    cu_ctx *c = C(b);
    n = (n + RING_ALIGN - 1) / RING_ALIGN * RING_ALIGN;
    if (n > c->ring_cap && !ring_size(b, 2 * n > RING_MIN ? 2 * n : RING_MIN)) return false;
    if (c->ring_off + n > c->ring_cap) {
        if (!drain_ok(b)) return false; /* every queued copy out of the ring has run */
        c->ring_off = 0;
        c->ring_gen++;
    }
    *s = (stage){.off = c->ring_off, .n = n};
    c->ring_off += n;
    return true;
}

/* The next `bytes` of the op's tables (aligned for `align`): host address
 * to fill, and its device twin. */
static void *stage_take(qi_backend *b, stage *s, size_t bytes, size_t align, void **dev) {
    cu_ctx *c = C(b);
    s->used = (s->used + align - 1) / align * align;
    char *h = c->ring_h + s->off + s->used;
    *dev = c->ring_d + s->off + s->used;
    s->used += bytes;
    return h;
}

static bool stage_send(qi_backend *b, const stage *s) {
    cu_ctx *c = C(b);
    if (!s->used) return true;
    return !failed(b, c->rt->memcpy_async(c->rx, c->ring_d + s->off, c->ring_h + s->off, s->used, c->stream), false,
                   "cudaMemcpyAsync(%zu bytes of an op's tables to the device)", s->used);
}

/* One host array staged alone: its device copy, or NULL (failure recorded).
 * An array equal to the last one staged alone, whose copy the ring still
 * holds, is not copied again: every layer's RoPE reads the step's same
 * positions. */
static void *stage_array(qi_backend *b, const void *src, size_t bytes) {
    cu_ctx *c = C(b);
    if (c->last.gen == c->ring_gen && c->last.bytes == bytes && c->ring_h &&
        memcmp(c->ring_h + c->last.off, src, bytes) == 0)
        return c->ring_d + c->last.off;
    stage s;
    void *dev;
    if (!stage_begin(b, bytes, &s)) return NULL;
    memcpy(stage_take(b, &s, bytes, 8, &dev), src, bytes);
    if (!stage_send(b, &s)) return NULL;
    c->last.gen = c->ring_gen;
    c->last.off = s.off;
    c->last.bytes = bytes;
    return dev;
}

/* ---- ops ----------------------------------------------------------------- */

static const char *tname(uint32_t t) {
    const qi_type_info *ti = qi_type_get(t);
    return ti && ti->name ? ti->name : "?";
}

static bool type_ok(qi_backend *b, const qi_weight *w, const char *op) {
    if (C(b)->k->type_ok(w->type)) return true;
    unsupported(b, "%s: weights of type %s have no CUDA kernel", op, tname(w->type));
    return false;
}

static void cu_matmul(qi_backend *b, const qi_weight *w, const float *x, int T, float *y) {
    cu_ctx *c = C(b);
    if (!type_ok(b, w, "matmul") || !scratch(b, c->k->scratch_bytes(T, w->n_cols, 0, 0, 0))) return;
    const char *what = NULL;
    const int rc = c->k->matmul(&c->kc, w->type, w->data, w->n_rows, w->n_cols, w->row_bytes, x, T, y, &what);
    kfailed(b, rc, what, "matmul %s %lld x %lld, T=%d", tname(w->type), (long long)w->n_rows, (long long)w->n_cols,
            T);
}

static void cu_matmul_n(qi_backend *b, const qi_weight *const *w, float *const *y, int n, const float *x, int T) {
    for (int i = 0; i < n; i++) cu_matmul(b, w[i], x, T, y[i]);
}

static void cu_rmsnorm(qi_backend *b, const float *x, const float *w, int T, int n, float eps, float *y) {
    cu_ctx *c = C(b);
    const char *what = NULL;
    const int rc = c->k->rmsnorm(&c->kc, x, w, T, n, eps, y, &what);
    kfailed(b, rc, what, "rmsnorm T=%d n=%d", T, n);
}

static void cu_rope(qi_backend *b, float *q, int Hq, float *k, int Hk, int T, int D, int n_rot, const int32_t *pos,
                    float base, float freq_scale, int mode) {
    cu_ctx *c = C(b);
    const int32_t *dpos = stage_array(b, pos, sizeof *pos * (size_t)T);
    if (!dpos) return;
    const char *what = NULL;
    const int rc = c->k->rope(&c->kc, q, Hq, k, Hk, T, D, n_rot, dpos, base, freq_scale, mode, &what);
    kfailed(b, rc, what,
            "rope T=%d Hq=%d Hk=%d D=%d", T, Hq, Hk, D);
}

/* One paged attention call: its tables staged (the query positions, each
 * KV head's slot positions and block addresses, flattened with offsets),
 * then the kernel. */
static void cu_attention_paged(qi_backend *b, const qi_attn_paged_args *a) {
    cu_ctx *c = C(b);
    const int Hkv = a->Hkv, blk = 1 << a->shift;
    long n_slots = 0, n_blk = 0;
    int max_slots = 0;
    for (int hk = 0; hk < Hkv; hk++) {
        n_slots += a->n_slots[hk];
        n_blk += (a->n_slots[hk] + blk - 1) / blk;
        if (a->n_slots[hk] > max_slots) max_slots = a->n_slots[hk];
    }
    const size_t bytes = sizeof(int32_t) * ((size_t)a->T + 2 * ((size_t)Hkv + 1) + (size_t)n_slots) +
                         2 * sizeof(void *) * (size_t)n_blk + 4 * RING_ALIGN;
    stage s;
    if (!stage_begin(b, bytes, &s)) return;
    void *d_qpos, *d_soff, *d_pos, *d_boff, *d_kb, *d_vb;
    memcpy(stage_take(b, &s, sizeof(int32_t) * (size_t)a->T, 4, &d_qpos), a->q_pos, sizeof(int32_t) * (size_t)a->T);
    int32_t *soff = stage_take(b, &s, sizeof(int32_t) * ((size_t)Hkv + 1), 4, &d_soff);
    int32_t *boff = stage_take(b, &s, sizeof(int32_t) * ((size_t)Hkv + 1), 4, &d_boff);
    int32_t *pos = stage_take(b, &s, sizeof(int32_t) * (size_t)n_slots, 4, &d_pos);
    const uint16_t **kb = stage_take(b, &s, sizeof(void *) * (size_t)n_blk, 8, &d_kb);
    const uint16_t **vb = stage_take(b, &s, sizeof(void *) * (size_t)n_blk, 8, &d_vb);
    soff[0] = boff[0] = 0;
    for (int hk = 0; hk < Hkv; hk++) {
        const int ns = a->n_slots[hk], nb = (ns + blk - 1) / blk;
        memcpy(pos + soff[hk], a->pos[hk], sizeof(int32_t) * (size_t)ns);
        for (int i = 0; i < nb; i++) {
            kb[boff[hk] + i] = a->k_blk[hk][i];
            vb[boff[hk] + i] = a->v_blk[hk][i];
        }
        soff[hk + 1] = soff[hk] + ns;
        boff[hk + 1] = boff[hk] + nb;
    }
    if (!stage_send(b, &s) || !scratch(b, c->k->scratch_bytes(a->T, 0, a->H, max_slots, 0))) return;
    const qi_cuk_attn ka = {.T = a->T, .H = a->H, .Hkv = Hkv, .D = a->D, .n_swa = a->n_swa, .shift = a->shift,
                            .scale = a->scale, .max_slots = max_slots, .q_pos = d_qpos, .q = a->q, .out = a->out,
                            .slot_off = d_soff, .pos = d_pos, .blk_off = d_boff,
                            .kb = (const uint16_t *const *)d_kb, .vb = (const uint16_t *const *)d_vb,
                            .stats = a->stats, .stats_stride = a->stats_stride, .part_m = a->part_m,
                            .part_l = a->part_l, .tot_m = a->tot_m, .tot_l = a->tot_l};
    const char *what = NULL;
    const int rc = c->k->attention(&c->kc, &ka, &what);
    kfailed(b, rc, what, "attention T=%d H=%d Hkv=%d D=%d slots<=%d", a->T, a->H,
            Hkv, a->D, max_slots);
}

static void cu_attention_paged_n(qi_backend *b, const qi_attn_paged_args *a, int n) {
    for (int i = 0; i < n; i++) cu_attention_paged(b, &a[i]);
}

static void cu_attention_merge(qi_backend *b, const qi_attn_merge_args *a) {
    cu_ctx *c = C(b);
    qi_cuk_merge km = {.rows = a->rows, .D = a->D, .n_parts = a->n_parts, .out = a->out, .tot_m = a->tot_m,
                       .tot_l = a->tot_l};
    for (int p = 0; p < a->n_parts && p < QI_CUK_MAX_PARTS; p++) {
        km.o[p] = a->o[p];
        km.m[p] = a->m[p];
        km.l[p] = a->l[p];
    }
    const char *what = NULL;
    const int rc = c->k->merge(&c->kc, &km, &what);
    kfailed(b, rc, what, "attention merge rows=%d D=%d parts=%d", a->rows, a->D,
            a->n_parts);
}

static void glu(qi_backend *b, int gelu, float *gate, const float *up, int T, int n) {
    cu_ctx *c = C(b);
    const char *what = NULL;
    const int rc = c->k->glu(&c->kc, gelu, gate, up, T, n, &what);
    kfailed(b, rc, what, "%s T=%d n=%d", gelu ? "geglu" : "swiglu", T,
            n);
}
static void cu_swiglu(qi_backend *b, float *gate, const float *up, int T, int n) { glu(b, 0, gate, up, T, n); }
static void cu_geglu(qi_backend *b, float *gate, const float *up, int T, int n) { glu(b, 1, gate, up, T, n); }

static void cu_kv_write(qi_backend *b, const float *const *src, uint16_t *const *dst, int n, int D) {
    cu_ctx *c = C(b);
    stage s;
    void *d_src, *d_dst;
    if (!stage_begin(b, 2 * sizeof(void *) * (size_t)n + RING_ALIGN, &s)) return;
    memcpy(stage_take(b, &s, sizeof(void *) * (size_t)n, 8, &d_src), src, sizeof(void *) * (size_t)n);
    memcpy(stage_take(b, &s, sizeof(void *) * (size_t)n, 8, &d_dst), dst, sizeof(void *) * (size_t)n);
    if (!stage_send(b, &s)) return;
    const char *what = NULL;
    const int rc = c->k->kv_write(&c->kc, (const float *const *)d_src, (uint16_t *const *)d_dst, n, D, &what);
    kfailed(b, rc, what,
            "kv_write n=%d D=%d", n, D);
}

static void cu_add(qi_backend *b, float *x, const float *y, long n) {
    cu_ctx *c = C(b);
    const char *what = NULL;
    const int rc = c->k->add(&c->kc, x, y, n, &what);
    kfailed(b, rc, what, "add n=%ld", n);
}
static void cu_scale(qi_backend *b, float *x, long n, float s) {
    cu_ctx *c = C(b);
    const char *what = NULL;
    const int rc = c->k->scale(&c->kc, x, n, s, &what);
    kfailed(b, rc, what, "scale n=%ld", n);
}
static void cu_add_bias(qi_backend *b, float *x, const float *bias, int T, int n) {
    cu_ctx *c = C(b);
    const char *what = NULL;
    const int rc = c->k->add_bias(&c->kc, x, bias, T, n, &what);
    kfailed(b, rc, what, "add_bias T=%d n=%d", T, n);
}
static void cu_softcap(qi_backend *b, float *x, long n, float cap) {
    cu_ctx *c = C(b);
    const char *what = NULL;
    const int rc = c->k->softcap(&c->kc, x, n, cap, &what);
    kfailed(b, rc, what, "softcap n=%ld", n);
}

static void cu_gather_rows(qi_backend *b, float *x, const int32_t *rows, int n, int width) {
    cu_ctx *c = C(b);
    const int32_t *d_rows = stage_array(b, rows, sizeof *rows * (size_t)n);
    if (!d_rows || !scratch(b, c->k->scratch_bytes(n, 0, 0, 0, width))) return;
    const char *what = NULL;
    const int rc = c->k->gather_rows(&c->kc, x, d_rows, n, width, &what);
    kfailed(b, rc, what, "gather_rows n=%d width=%d", n, width);
}

static void cu_get_rows(qi_backend *b, const qi_weight *w, const int32_t *ids, int T, float *out) {
    cu_ctx *c = C(b);
    if (!type_ok(b, w, "get_rows")) return;
    const int32_t *d_ids = stage_array(b, ids, sizeof *ids * (size_t)T);
    if (!d_ids) return;
    const char *what = NULL;
    const int rc = c->k->get_rows(&c->kc, w->type, w->data, w->n_cols, w->row_bytes, d_ids, T, out, &what);
    kfailed(b, rc, what,
            "get_rows %s n_cols=%lld T=%d", tname(w->type), (long long)w->n_cols, T);
}

/* The staging ring sized for the largest tables a step may have (an
 * attention call over max_pos slots of every KV head, with its block
 * addresses), and the scratch for the largest matmul the engine sizes
 * (max_rows rows of the widest matmul); attention and gather scratch grow
 * when first needed. */
static qi_status cu_reserve(qi_backend *b, size_t scratch_bytes, int max_rows, int max_pos, int Hkv, int D,
                            qi_err *err) {
    (void)D;
    cu_ctx *c = C(b);
    const size_t attn = (size_t)Hkv * ((size_t)max_pos * (sizeof(int32_t) + 2 * sizeof(void *)) + 64) +
                        sizeof(int32_t) * (size_t)max_rows;
    const size_t ring = 4 * attn > RING_MIN ? 4 * attn : RING_MIN;
    /* scratch_bytes holds max_rows rows of quantised activations: a row's
     * bytes are about the widest matmul's columns */
    const int64_t cols = max_rows > 0 ? (int64_t)(scratch_bytes / (size_t)max_rows) : 0;
    if (!ring_size(b, ring) || !scratch(b, c->k->scratch_bytes(max_rows, cols, 0, 0, 0)))
        return qi_dev_synchronize(b, err);
    return QI_OK;
}

/* ---- memory, copies, events -------------------------------------------------- */

static void *cu_buf_mem(qi_backend *b, size_t n) {
    cu_ctx *c = C(b);
    void *p = NULL;
    return c->rt->dev_malloc(c->rx, &p, n) ? NULL : p;
}

static void cu_buf_release(qi_backend *b, void *mem) {
    cu_ctx *c = C(b);
    if (drain_all_ok(b)) /* no queued work may still use it */
        failed(b, c->rt->dev_free(c->rx, mem), false, "cudaFree(%p)", mem);
}

static void copy_on(qi_backend *b, void *s, void *dst, const void *src, size_t n) {
    cu_ctx *c = C(b);
    failed(b, c->rt->memcpy_async(c->rx, dst, src, n, s), false, "cudaMemcpyAsync(dst=%p, src=%p, %zu bytes%s)", dst,
           src, n, s == c->cstream ? ", copy stream" : "");
}

static void copy_2d_on(qi_backend *b, void *s, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                       size_t height) {
    cu_ctx *c = C(b);
    failed(b, c->rt->memcpy_2d_async(c->rx, dst, dpitch, src, spitch, width, height, s), false,
           "cudaMemcpy2DAsync(dst=%p, pitch %zu, src=%p, pitch %zu, %zu x %zu bytes%s)", dst, dpitch, src, spitch,
           height, width, s == c->cstream ? ", copy stream" : "");
}

static void cu_copy(qi_backend *b, void *dst, const void *src, size_t n) { copy_on(b, C(b)->stream, dst, src, n); }
static void cu_cs_copy(qi_backend *b, void *dst, const void *src, size_t n) {
    copy_on(b, C(b)->cstream, dst, src, n);
}
static void cu_copy_2d(qi_backend *b, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                       size_t height) {
    copy_2d_on(b, C(b)->stream, dst, dpitch, src, spitch, width, height);
}
static void cu_cs_copy_2d(qi_backend *b, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                          size_t height) {
    copy_2d_on(b, C(b)->cstream, dst, dpitch, src, spitch, width, height);
}

static void *ev_get(qi_backend *b) {
    cu_ctx *c = C(b);
    void *e = NULL;
    pthread_mutex_lock(&c->ev_mu);
    if (c->n_pool) e = c->pool[--c->n_pool];
    pthread_mutex_unlock(&c->ev_mu);
    if (e) return e;
    return failed(b, c->rt->event_create(c->rx, &e), false, "cudaEventCreate") ? NULL : e;
}

static void ev_put(qi_backend *b, void *e) {
    cu_ctx *c = C(b);
    if (!e) return;
    pthread_mutex_lock(&c->ev_mu);
    const bool kept = c->n_pool < EV_POOL;
    if (kept) c->pool[c->n_pool++] = e;
    pthread_mutex_unlock(&c->ev_mu);
    if (!kept) failed(b, c->rt->event_destroy(c->rx, e), false, "cudaEventDestroy");
}

static void mark_on(qi_backend *b, void *s, qi_event *ev) {
    cu_ctx *c = C(b);
    void *e = ev_get(b);
    if (e && failed(b, c->rt->event_record(c->rx, e, s), false, "cudaEventRecord")) {
        ev_put(b, e);
        e = NULL;
    }
    *qi_event_impl(ev) = e;
    /* a marker that could not be recorded completes now: the failure is recorded */
    if (!e) {
        pthread_mutex_lock(&c->ev_mu);
        const double t = c->anchor_t;
        pthread_mutex_unlock(&c->ev_mu);
        qi_event_complete(ev, t);
    }
}
static void cu_mark(qi_backend *b, qi_event *ev) { mark_on(b, C(b)->stream, ev); }
static void cu_cs_mark(qi_backend *b, qi_event *ev) { mark_on(b, C(b)->cstream, ev); }

static void cu_ev_sync(qi_backend *b, qi_event *ev) {
    cu_ctx *c = C(b);
    void **slot = qi_event_impl(ev), *e = *slot;
    float ms = 0;
    if (e && failed(b, c->rt->event_sync(c->rx, e), false, "cudaEventSynchronize")) e = NULL;
    pthread_mutex_lock(&c->ev_mu);
    if (e && failed(b, c->rt->event_elapsed(c->rx, &ms, c->anchor, e), false, "cudaEventElapsedTime")) ms = 0;
    const double t = c->anchor_t + ms * 1e-3;
    void *old = NULL;
    if (e && ms > ANCHOR_MOVE_MS) { /* the completed event becomes the anchor */
        old = c->anchor;
        c->anchor = e;
        c->anchor_t = t;
        *slot = NULL;
    }
    pthread_mutex_unlock(&c->ev_mu);
    ev_put(b, old);
    qi_event_complete(ev, t);
}

static void cu_ev_release(qi_backend *b, qi_event *ev) {
    void **slot = qi_event_impl(ev);
    ev_put(b, *slot);
    *slot = NULL;
}

/* Stream s waits for ev: on the GPU for this device's own events (either
 * stream's), by the host for another device's (its marker is not a CUDA
 * event of this context; the CPU's and testdev's complete on their own). */
static void wait_on(qi_backend *b, void *s, qi_event *ev) {
    cu_ctx *c = C(b);
    void *e = qi_event_device(ev) == b ? *qi_event_impl(ev) : NULL;
    if (!e) {
        qi_event_sync(ev);
        return;
    }
    failed(b, c->rt->stream_wait(c->rx, s, e), false, "cudaStreamWaitEvent(%s stream)",
           s == c->cstream ? "the copy" : "the main");
}
static void cu_wait(qi_backend *b, qi_event *ev) { wait_on(b, C(b)->stream, ev); }
static void cu_cs_wait(qi_backend *b, qi_event *ev) { wait_on(b, C(b)->cstream, ev); }

static void cu_drain(qi_backend *b) { drain_all_ok(b); }

static void cu_free(qi_backend *b) {
    cu_ctx *c = C(b);
    if (c) {
        const qi_cuda_rt *rt = c->rt;
        if (c->stream) rt->stream_sync(c->rx, c->stream);
        if (c->cstream) rt->stream_sync(c->rx, c->cstream);
        for (int i = 0; i < c->n_pool; i++) rt->event_destroy(c->rx, c->pool[i]);
        if (c->anchor) rt->event_destroy(c->rx, c->anchor);
        if (c->kc.scratch) rt->dev_free(c->rx, c->kc.scratch);
        if (c->ring_h) rt->host_free(c->rx, c->ring_h);
        if (c->ring_d) rt->dev_free(c->rx, c->ring_d);
        if (c->blas) rt->blas_destroy(c->rx, c->blas);
        if (c->stream) rt->stream_destroy(c->rx, c->stream);
        if (c->cstream) rt->stream_destroy(c->rx, c->cstream);
        if (c->mu_made) {
            pthread_mutex_destroy(&c->mu);
            pthread_mutex_destroy(&c->ev_mu);
        }
        qi_free(c);
    }
    qi_free(b);
}

static const qi_backend_i k_cuda_iface = {
    .version = QI_BACKEND_VERSION,
    .name = "cuda",
    .matmul = cu_matmul,
    .matmul_n = cu_matmul_n,
    .rmsnorm = cu_rmsnorm,
    .rope = cu_rope,
    .attention_paged = cu_attention_paged,
    .attention_paged_n = cu_attention_paged_n,
    .attention_merge = cu_attention_merge,
    .swiglu = cu_swiglu,
    .geglu = cu_geglu,
    .get_rows = cu_get_rows,
    .kv_write = cu_kv_write,
    .add = cu_add,
    .scale = cu_scale,
    .softcap = cu_softcap,
    .add_bias = cu_add_bias,
    .gather_rows = cu_gather_rows,
    .reserve = cu_reserve,
    .free = cu_free,
    .buf_mem = cu_buf_mem,
    .buf_release = cu_buf_release,
    .copy = cu_copy,
    .copy_2d = cu_copy_2d,
    .mark = cu_mark,
    .wait = cu_wait,
    .drain = cu_drain,
    .ev_sync = cu_ev_sync,
    .ev_release = cu_ev_release,
    .cs_copy = cu_cs_copy,
    .cs_copy_2d = cu_cs_copy_2d,
    .cs_mark = cu_cs_mark,
    .cs_wait = cu_cs_wait,
};

/* A failed call while the device is made: the error, everything freed. */
static qi_status create_failed(qi_backend *b, int code, bool blas, const char *call, qi_err *err) {
    cu_ctx *c = C(b);
    qi_status st = QI_ERR(err, QI_ERR_BACKEND, "cuda: %s failed: %s (%s error %d)", call,
                          c->rt->error_string(c->rx, code, blas), blas ? "cuBLAS" : c->rt->name, code);
    cu_free(b);
    return st;
}

qi_status qi_backend_cuda_create(int ordinal, size_t capacity, qi_backend **out, qi_err *err) {
    *out = NULL;
    const qi_cuda_rt *rt = g_rt_override ? g_rt_override : qi_cuda_rt_default();
    if (!rt) return QI_ERR(err, QI_ERR_UNSUPPORTED, "cuda: this build has no CUDA support (configure with nvcc)");
    qi_backend *b = qi_calloc(1, sizeof *b);
    cu_ctx *c = qi_calloc(1, sizeof *c);
    if (!b || !c) {
        qi_free(b);
        qi_free(c);
        return QI_ERR(err, QI_ERR_NOMEM, "out of memory creating the CUDA device");
    }
    b->iface = &k_cuda_iface;
    b->ctx = c;
    c->rt = rt;
    c->k = rt->k;
    c->rx = rt->ctx;
    b->info = (qi_dev_info){.name = "cuda", .kind = QI_DEV_CUDA};
    pthread_mutex_init(&c->mu, NULL);
    pthread_mutex_init(&c->ev_mu, NULL);
    c->mu_made = true;
    b->lock = &c->mu;
    int rc;
    char call[64];
    snprintf(call, sizeof call, "selecting GPU %d", ordinal);
    if ((rc = rt->init(c->rx, ordinal, c->gpu, sizeof c->gpu, &c->total))) return create_failed(b, rc, false, call, err);
    if ((rc = rt->stream_create(c->rx, &c->stream))) return create_failed(b, rc, false, "cudaStreamCreate", err);
    if ((rc = rt->stream_create(c->rx, &c->cstream)))
        return create_failed(b, rc, false, "cudaStreamCreate (the copy stream)", err);
    if ((rc = rt->blas_create(c->rx, &c->blas, c->stream))) return create_failed(b, rc, true, "cublasCreate", err);
    if ((rc = rt->event_create(c->rx, &c->anchor))) return create_failed(b, rc, false, "cudaEventCreate", err);
    if ((rc = rt->event_record(c->rx, c->anchor, c->stream)) || (rc = rt->event_sync(c->rx, c->anchor)))
        return create_failed(b, rc, false, "recording the clock's anchor event", err);
    c->anchor_t = qi_dev_now();
    c->kc.stream = c->stream;
    c->kc.cublas = c->blas;
    b->info.capacity = capacity && capacity < c->total ? capacity : c->total;
    *out = b;
    return QI_OK;
}

const char *qi_backend_cuda_gpu_name(const qi_backend *b) {
    return b && b->iface == &k_cuda_iface ? ((const cu_ctx *)b->ctx)->gpu : NULL;
}

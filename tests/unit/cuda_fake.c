/* cuda_fake.c - the stand-in CUDA runtime of cuda_fake.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_fake.h"
#include "qinfer/status.h"

qi_fake_cuda qi_fake;
#define F qi_fake
#define MAX_ALLOCS QI_FAKE_MAX_ALLOCS

void qi_fake_cuda_reset(qi_backend *cpu, size_t total) {
    memset(&F, 0, sizeof F);
    F.cpu = cpu;
    F.total = total;
}

/* ---- the runtime ---------------------------------------------------------------- */

static bool hit(const char *name) {
    F.calls++;
    if (F.fail_in > 0 && strcmp(name, F.fail_name) == 0 && --F.fail_in == 0) return true;
    return false;
}
void qi_fake_cuda_fail_next(const char *name, long n, int code) {
    F.fail_name = name;
    F.fail_in = n;
    F.fail_code = code;
}
#define ENTRY(name) \
    if (hit(name)) return F.fail_code

static bool in_dev(const void *p, size_t n) {
    for (int i = 0; i < F.n_dev; i++)
        if ((const char *)p >= (const char *)F.dev[i] && (const char *)p + n <= (const char *)F.dev[i] + F.dev_n[i])
            return true;
    return false;
}
static void need_dev(const void *p, size_t n) {
    if (!in_dev(p, n)) F.bad_pointers++;
}

static int f_init(void *ctx, int ordinal, char *name, size_t len, size_t *total) {
    ENTRY("init");
    snprintf(name, len, "Fake GPU %d", ordinal);
    *total = F.total;
    return 0;
}
static int f_dev_malloc(void *ctx, void **p, size_t n) {
    ENTRY("dev_malloc");
    if (F.n_dev == MAX_ALLOCS) return 2;
    *p = qi_malloc_aligned(256, n ? n : 1);
    if (!*p) return 2;
    F.dev[F.n_dev] = *p;
    F.dev_n[F.n_dev++] = n;
    return 0;
}
static int f_dev_free(void *ctx, void *p) {
    ENTRY("dev_free");
    for (int i = 0; i < F.n_dev; i++)
        if (F.dev[i] == p) {
            F.dev[i] = F.dev[--F.n_dev];
            F.dev_n[i] = F.dev_n[F.n_dev];
            qi_free(p);
            return 0;
        }
    return 1; /* not a device allocation */
}
static int f_host_malloc(void *ctx, void **p, size_t n) {
    ENTRY("host_malloc");
    *p = qi_malloc_aligned(64, n);
    if (*p) F.host_live++;
    return *p ? 0 : 2;
}
static int f_host_free(void *ctx, void *p) {
    ENTRY("host_free");
    F.host_live--;
    qi_free(p);
    return 0;
}
/* A stream is its number, 1 up, as a pointer into F.stream_ids. */
static int f_stream_create(void *ctx, void **s) {
    ENTRY("stream_create");
    if (F.n_streams == QI_FAKE_MAX_STREAMS) return 2;
    F.stream_ids[F.n_streams] = F.n_streams + 1;
    *s = &F.stream_ids[F.n_streams++];
    F.streams_live++;
    return 0;
}
static int f_stream_destroy(void *ctx, void *s) {
    F.streams_live--;
    return 0;
}
int qi_fake_stream_no(const void *s) { return s ? *(const int *)s : 0; }
static void on_stream(void *s) {
    const int k = qi_fake_stream_no(s);
    if (k >= 1 && k <= QI_FAKE_MAX_STREAMS) F.copies_on[k - 1]++;
}
static int f_memcpy_async(void *ctx, void *dst, const void *src, size_t n, void *s) {
    ENTRY("memcpy_async");
    memcpy(dst, src, n);
    on_stream(s);
    F.clock_ms += 1;
    return 0;
}
static int f_memcpy_2d_async(void *ctx, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                             size_t height, void *s) {
    ENTRY("memcpy_2d_async");
    for (size_t r = 0; r < height; r++) memcpy((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
    on_stream(s);
    F.clock_ms += 1;
    return 0;
}
static int f_stream_wait(void *ctx, void *s, void *e) {
    ENTRY("stream_wait");
    const int k = qi_fake_stream_no(s);
    if (k >= 1 && k <= QI_FAKE_MAX_STREAMS) F.waits_on[k - 1]++;
    return 0;
}
typedef struct {
    double t;
} f_event;
static int f_event_create(void *ctx, void **e) {
    ENTRY("event_create");
    *e = calloc(1, sizeof(f_event));
    F.events_live++;
    return 0;
}
static int f_event_destroy(void *ctx, void *e) {
    free(e);
    F.events_live--;
    return 0;
}
static int f_event_record(void *ctx, void *e, void *s) {
    ENTRY("event_record");
    ((f_event *)e)->t = F.clock_ms;
    return 0;
}
static int f_event_sync(void *ctx, void *e) {
    ENTRY("event_sync");
    return 0;
}
static int f_event_elapsed(void *ctx, float *ms, void *from, void *to) {
    ENTRY("event_elapsed");
    *ms = (float)(((f_event *)to)->t - ((f_event *)from)->t);
    return 0;
}
static int f_stream_sync(void *ctx, void *s) {
    ENTRY("stream_sync");
    F.stream_syncs++;
    return 0;
}
static int f_blas_create(void *ctx, void **h, void *s) {
    ENTRY("blas_create");
    *h = &F.blas_live;
    F.blas_live++;
    return 0;
}
static int f_blas_destroy(void *ctx, void *h) {
    F.blas_live--;
    return 0;
}
static const char *f_error_string(void *ctx, int code, bool blas) {
    return blas ? "fake cuBLAS says no" : code == 2 ? "out of memory" : "fake failure";
}

/* ---- its kernels: the CPU's ops, after checking every address ---------------- */

#define KERNEL(name)              \
    if (what) *what = name;       \
    F.clock_ms += 1;              \
    if (hit(name)) return F.fail_code

static size_t k_scratch(int max_T, int64_t max_cols, int H, int max_pos, int64_t max_width) {
    return (size_t)max_T * (size_t)(max_cols + max_width) * 4 + (size_t)max_T * (size_t)H * (size_t)max_pos * 4 + 64;
}
static int k_type_ok(uint32_t type) { return type != QI_TYPE_Q2_K; }
static qi_weight wt(uint32_t type, const void *w, int64_t rows, int64_t cols, uint64_t rb) {
    return (qi_weight){.type = type, .n_cols = cols, .n_rows = rows, .row_bytes = rb, .data = w};
}
static int k_matmul(const qi_cuk_ctx *c, uint32_t type, const void *w, int64_t n_rows, int64_t n_cols,
                    uint64_t row_bytes, const float *x, int T, float *y, const char **what) {
    KERNEL("matmul");
    need_dev(w, row_bytes * (uint64_t)n_rows);
    need_dev(x, sizeof *x * (size_t)(T * n_cols));
    need_dev(y, sizeof *y * (size_t)(T * n_rows));
    const qi_weight W = wt(type, w, n_rows, n_cols, row_bytes);
    F.cpu->iface->matmul(F.cpu, &W, x, T, y);
    return 0;
}
static int k_get_rows(const qi_cuk_ctx *c, uint32_t type, const void *w, int64_t n_cols, uint64_t row_bytes,
                      const int32_t *ids, int T, float *out, const char **what) {
    KERNEL("get_rows");
    need_dev(ids, sizeof *ids * (size_t)T);
    need_dev(out, sizeof *out * (size_t)(T * n_cols));
    for (int t = 0; t < T; t++) need_dev((const char *)w + row_bytes * (uint64_t)ids[t], row_bytes);
    const qi_weight W = wt(type, w, 1 << 30, n_cols, row_bytes);
    F.cpu->iface->get_rows(F.cpu, &W, ids, T, out);
    return 0;
}
static int k_rmsnorm(const qi_cuk_ctx *c, const float *x, const float *w, int T, int n, float eps, float *y,
                     const char **what) {
    KERNEL("rmsnorm");
    need_dev(x, sizeof *x * (size_t)T * (size_t)n);
    need_dev(w, sizeof *w * (size_t)n);
    F.cpu->iface->rmsnorm(F.cpu, x, w, T, n, eps, y);
    return 0;
}
static int k_rope(const qi_cuk_ctx *c, float *q, int Hq, float *k, int Hk, int T, int D, int n_rot,
                  const int32_t *pos, float base, float freq_scale, int mode, const char **what) {
    KERNEL("rope");
    need_dev(pos, sizeof *pos * (size_t)T);
    need_dev(q, sizeof *q * (size_t)T * (size_t)Hq * (size_t)D);
    if (k) need_dev(k, sizeof *k * (size_t)T * (size_t)Hk * (size_t)D);
    F.cpu->iface->rope(F.cpu, q, Hq, k, Hk, T, D, n_rot, pos, base, freq_scale, mode);
    return 0;
}
static int k_glu(const qi_cuk_ctx *c, int gelu, float *gate, const float *up, int T, int n, const char **what) {
    KERNEL("glu");
    need_dev(gate, sizeof *gate * (size_t)T * (size_t)n);
    need_dev(up, sizeof *up * (size_t)T * (size_t)n);
    (gelu ? F.cpu->iface->geglu : F.cpu->iface->swiglu)(F.cpu, gate, up, T, n);
    return 0;
}
static int k_kv_write(const qi_cuk_ctx *c, const float *const *src, uint16_t *const *dst, int n, int D,
                      const char **what) {
    KERNEL("kv_write");
    need_dev(src, sizeof *src * (size_t)n);
    need_dev(dst, sizeof *dst * (size_t)n);
    for (int i = 0; i < n; i++) {
        need_dev(src[i], sizeof(float) * (size_t)D);
        need_dev(dst[i], sizeof(uint16_t) * (size_t)D);
    }
    F.cpu->iface->kv_write(F.cpu, src, dst, n, D);
    return 0;
}
static int k_add(const qi_cuk_ctx *c, float *x, const float *y, long n, const char **what) {
    KERNEL("add");
    need_dev(x, sizeof *x * (size_t)n);
    need_dev(y, sizeof *y * (size_t)n);
    F.cpu->iface->add(F.cpu, x, y, n);
    return 0;
}
static int k_scale(const qi_cuk_ctx *c, float *x, long n, float s, const char **what) {
    KERNEL("scale");
    need_dev(x, sizeof *x * (size_t)n);
    F.cpu->iface->scale(F.cpu, x, n, s);
    return 0;
}
static int k_softcap(const qi_cuk_ctx *c, float *x, long n, float cap, const char **what) {
    KERNEL("softcap");
    need_dev(x, sizeof *x * (size_t)n);
    F.cpu->iface->softcap(F.cpu, x, n, cap);
    return 0;
}
static int k_add_bias(const qi_cuk_ctx *c, float *x, const float *bias, int T, int n, const char **what) {
    KERNEL("add_bias");
    need_dev(x, sizeof *x * (size_t)T * (size_t)n);
    need_dev(bias, sizeof *bias * (size_t)n);
    F.cpu->iface->add_bias(F.cpu, x, bias, T, n);
    return 0;
}
static int k_gather_rows(const qi_cuk_ctx *c, float *x, const int32_t *rows, int n, int width, const char **what) {
    KERNEL("gather_rows");
    need_dev(rows, sizeof *rows * (size_t)n);
    if (n) need_dev(x, sizeof *x * (size_t)(rows[n - 1] + 1) * (size_t)width);
    F.cpu->iface->gather_rows(F.cpu, x, rows, n, width);
    return 0;
}
#define MAX_HKV 16
static int k_attention(const qi_cuk_ctx *c, const qi_cuk_attn *a, const char **what) {
    KERNEL("attention");
    const int Hkv = a->Hkv, D = a->D;
    need_dev(a->q_pos, sizeof(int32_t) * (size_t)a->T);
    need_dev(a->q, sizeof(float) * (size_t)a->T * (size_t)a->H * (size_t)D);
    need_dev(a->slot_off, sizeof(int32_t) * (size_t)(Hkv + 1));
    need_dev(a->blk_off, sizeof(int32_t) * (size_t)(Hkv + 1));
    if (a->slot_off[Hkv]) need_dev(a->pos, sizeof(int32_t) * (size_t)a->slot_off[Hkv]);
    if (a->blk_off[Hkv]) {
        need_dev(a->kb, sizeof(void *) * (size_t)a->blk_off[Hkv]);
        need_dev(a->vb, sizeof(void *) * (size_t)a->blk_off[Hkv]);
    }
    int n_slots[MAX_HKV], max_slots = 0;
    const int32_t *pos[MAX_HKV];
    const uint16_t *const *kb[MAX_HKV], *const *vb[MAX_HKV];
    for (int hk = 0; hk < Hkv; hk++) {
        n_slots[hk] = a->slot_off[hk + 1] - a->slot_off[hk];
        if (n_slots[hk] > max_slots) max_slots = n_slots[hk];
        pos[hk] = a->pos + a->slot_off[hk];
        kb[hk] = a->kb + a->blk_off[hk];
        vb[hk] = a->vb + a->blk_off[hk];
        for (int i = 0; i < n_slots[hk]; i++) { /* every row the kernel reads is device memory */
            need_dev(kb[hk][i >> a->shift] + (size_t)(i & ((1 << a->shift) - 1)) * D, sizeof(uint16_t) * D);
            need_dev(vb[hk][i >> a->shift] + (size_t)(i & ((1 << a->shift) - 1)) * D, sizeof(uint16_t) * D);
        }
    }
    if (max_slots != a->max_slots) F.bad_pointers++; /* the grid would be sized wrong */
    const qi_attn_paged_args p = {.T = a->T, .H = a->H, .Hkv = Hkv, .D = D, .q_pos = a->q_pos, .n_swa = a->n_swa,
                                  .scale = a->scale, .q = a->q, .out = a->out, .n_slots = n_slots, .pos = pos,
                                  .k_blk = kb, .v_blk = vb, .shift = a->shift, .stats = a->stats,
                                  .stats_stride = a->stats_stride, .part_m = a->part_m, .part_l = a->part_l,
                                  .tot_m = a->tot_m, .tot_l = a->tot_l};
    if (a->stats) need_dev(a->stats, sizeof(float) * (size_t)a->H * (size_t)a->stats_stride);
    F.cpu->iface->attention_paged(F.cpu, &p);
    return 0;
}
static int k_merge(const qi_cuk_ctx *c, const qi_cuk_merge *a, const char **what) {
    KERNEL("merge");
    for (int p = 0; p < a->n_parts; p++) {
        need_dev(a->o[p], sizeof(float) * (size_t)a->rows * (size_t)a->D);
        need_dev(a->m[p], sizeof(float) * (size_t)a->rows);
        need_dev(a->l[p], sizeof(float) * (size_t)a->rows);
    }
    const qi_attn_merge_args m = {.rows = a->rows, .D = a->D, .n_parts = a->n_parts, .o = a->o, .m = a->m,
                                  .l = a->l, .out = a->out, .tot_m = a->tot_m, .tot_l = a->tot_l};
    F.cpu->iface->attention_merge(F.cpu, &m);
    return 0;
}

static const qi_cuk k_fake_kernels = {
    .name = "cpu ops", .scratch_bytes = k_scratch, .type_ok = k_type_ok, .matmul = k_matmul,
    .get_rows = k_get_rows, .rmsnorm = k_rmsnorm, .rope = k_rope, .glu = k_glu, .kv_write = k_kv_write,
    .add = k_add, .scale = k_scale, .softcap = k_softcap, .add_bias = k_add_bias, .gather_rows = k_gather_rows,
    .attention = k_attention, .merge = k_merge,
};

const qi_cuda_rt qi_fake_cuda_rt = {
    .name = "fake runtime", .ctx = &F, .init = f_init, .dev_malloc = f_dev_malloc, .dev_free = f_dev_free,
    .host_malloc = f_host_malloc, .host_free = f_host_free, .stream_create = f_stream_create,
    .stream_destroy = f_stream_destroy, .memcpy_async = f_memcpy_async,
    .memcpy_2d_async = f_memcpy_2d_async, .event_create = f_event_create,
    .event_destroy = f_event_destroy, .event_record = f_event_record, .event_sync = f_event_sync,
    .event_elapsed = f_event_elapsed, .stream_sync = f_stream_sync, .stream_wait = f_stream_wait, .blas_create = f_blas_create,
    .blas_destroy = f_blas_destroy, .error_string = f_error_string, .k = &k_fake_kernels,
};


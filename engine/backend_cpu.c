/* backend_cpu.c - the CPU backend: every op in plain C over the reference
 * kernels of quant.c, parallelised over a persistent thread pool.
 *
 * The arithmetic follows llama.cpp's CPU path: activations are quantised per
 * row to the weight type's dot partner (Q8_0 / Q8_1 / Q8_K / F16) exactly as
 * llama.cpp does at run time (quant_act.c) before the integer dot; RMSNorm sums in
 * double; RoPE angles advance by repeated multiplication in float; the KV
 * cache is fp16 and queries are rounded to fp16 before QK. Where we differ
 * (softmax order inside attention) the tests against the goldens bound it.
 *
 * Work split: matmuls by output rows (each weight row read once per step for
 * all T tokens), attention by (token, head) pairs.
 */
#include <math.h>
#include <string.h>

#include "backend.h"
#include "qinfer/quant.h"
#include "quant_act.h"
#include "threadpool.h"

typedef struct {
    qi_pool *pool;
    void *scratch; /* quantised activations */
    size_t scratch_bytes;
    float *att; /* per-thread score rows */
    int att_len;
} cpu_ctx;

static cpu_ctx *C(qi_backend *b) { return (cpu_ctx *)b->ctx; }

/* ---- matmul ------------------------------------------------------------- */

typedef struct {
    const qi_weight *w;
    const float *x;
    int T;
    float *y;
    uint32_t dot_type;
    uint64_t qrow_bytes;
    void *xq;
} mm_job;

static void mm_quantize(void *arg, int ith, int nth) {
    mm_job *j = arg;
    long lo, hi;
    qi_split(j->T, ith, nth, &lo, &hi);
    for (long t = lo; t < hi; t++)
        qi_quantize_act_row(j->dot_type, j->x + t * j->w->n_cols,
                            (char *)j->xq + t * j->qrow_bytes, j->w->n_cols);
}

static void mm_rows(void *arg, int ith, int nth) {
    mm_job *j = arg;
    const qi_weight *w = j->w;
    long lo, hi;
    qi_split(w->n_rows, ith, nth, &lo, &hi);
    for (long r = lo; r < hi; r++) {
        const void *wr = (const char *)w->data + (uint64_t)r * w->row_bytes;
        for (int t = 0; t < j->T; t++)
            j->y[(long)t * w->n_rows + r] =
                qi_vec_dot_ref(w->type, w->n_cols, wr, (const char *)j->xq + t * j->qrow_bytes);
    }
}

static void cpu_matmul(qi_backend *b, const qi_weight *w, const float *x, int T, float *y) {
    cpu_ctx *c = C(b);
    mm_job j = {.w = w, .x = x, .T = T, .y = y, .dot_type = qi_vec_dot_type(w->type)};
    uint64_t rb = 0;
    qi_type_row_bytes(j.dot_type, (uint64_t)w->n_cols, &rb);
    j.qrow_bytes = rb;
    QI_ASSERT(rb * (uint64_t)T <= c->scratch_bytes); /* sized by reserve() */
    j.xq = c->scratch;
    qi_pool_run(c->pool, mm_quantize, &j);
    qi_pool_run(c->pool, mm_rows, &j);
}

/* ---- element-wise ops ------------------------------------------------------ */

static void cpu_rmsnorm(qi_backend *b, const float *x, const float *w, int T, int n, float eps,
                        float *y) {
    for (int t = 0; t < T; t++) {
        const float *xr = x + (long)t * n;
        float *yr = y + (long)t * n;
        double sum = 0.0;
        for (int i = 0; i < n; i++) sum += (double)(xr[i] * xr[i]);
        float scale = 1.0f / sqrtf((float)(sum / n) + eps);
        for (int i = 0; i < n; i++) yr[i] = (xr[i] * scale) * w[i];
    }
}

static void cpu_rope(qi_backend *b, float *x, int T, int n_heads, int D, int n_rot, int pos0,
                     float base, float freq_scale, int mode) {
    const float theta_scale = powf(base, -2.0f / (float)n_rot);
    for (int t = 0; t < T; t++) {
        for (int h = 0; h < n_heads; h++) {
            float *v = x + ((long)t * n_heads + h) * D;
            float theta = (float)(pos0 + t);
            for (int i = 0; i < n_rot; i += 2) {
                float th = theta * freq_scale;
                float cs = cosf(th), sn = sinf(th);
                int a = mode == QI_ROPE_NEOX ? i / 2 : i;
                int bb = mode == QI_ROPE_NEOX ? i / 2 + n_rot / 2 : i + 1;
                float x0 = v[a], x1 = v[bb];
                v[a] = x0 * cs - x1 * sn;
                v[bb] = x0 * sn + x1 * cs;
                theta *= theta_scale;
            }
        }
    }
}

static void cpu_swiglu(qi_backend *b, float *gate, const float *up, long n) {
    for (long i = 0; i < n; i++) {
        float g = gate[i];
        gate[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

static void cpu_get_rows(qi_backend *b, const qi_weight *w, const int32_t *ids, int T, float *out) {
    for (int t = 0; t < T; t++)
        qi_dequantize_row_ref(w->type, (const char *)w->data + (uint64_t)ids[t] * w->row_bytes,
                              out + (long)t * w->n_cols, w->n_cols);
}

/* ---- attention --------------------------------------------------------------- */

typedef struct {
    const qi_attn_args *a;
    cpu_ctx *c;
} att_job;

static void att_work(void *arg, int ith, int nth) {
    att_job *j = arg;
    const qi_attn_args *a = j->a;
    const int D = a->D, kv_stride = a->Hkv * D, group = a->H / a->Hkv;
    float *s = j->c->att + (long)ith * j->c->att_len;
    float q16[1024];
    long lo, hi;
    qi_split((long)a->T * a->H, ith, nth, &lo, &hi);
    for (long th = lo; th < hi; th++) {
        int t = (int)(th / a->H), h = (int)(th % a->H), hk = h / group;
        int n_pos = a->pos0 + t + 1;
        const float *q = a->q + ((long)t * a->H + h) * D;
        for (int d = 0; d < D; d++) q16[d] = qi_fp16_to_f32(qi_f32_to_fp16(q[d]));
        float mx = -INFINITY;
        for (int p = 0; p < n_pos; p++) {
            const uint16_t *k = a->k + (long)p * kv_stride + (long)hk * D;
            float dot = 0.0f;
            for (int d = 0; d < D; d++) dot += q16[d] * qi_fp16_to_f32(k[d]);
            s[p] = dot * a->scale;
            if (s[p] > mx) mx = s[p];
        }
        double sum = 0.0;
        for (int p = 0; p < n_pos; p++) {
            s[p] = expf(s[p] - mx);
            sum += s[p];
        }
        float inv = (float)(1.0 / sum);
        float *o = a->out + ((long)t * a->H + h) * D;
        memset(o, 0, sizeof(float) * (size_t)D);
        for (int p = 0; p < n_pos; p++) {
            const uint16_t *v = a->v + (long)p * kv_stride + (long)hk * D;
            float w = qi_fp16_to_f32(qi_f32_to_fp16(s[p] * inv));
            for (int d = 0; d < D; d++) o[d] += w * qi_fp16_to_f32(v[d]);
        }
    }
}

static void cpu_attention(qi_backend *b, const qi_attn_args *a) {
    cpu_ctx *c = C(b);
    QI_ASSERT(a->pos0 + a->T <= c->att_len && a->D <= 1024);
    att_job j = {a, c};
    qi_pool_run(c->pool, att_work, &j);
}

static void cpu_free(qi_backend *b) {
    cpu_ctx *c = C(b);
    if (c) {
        qi_pool_free(c->pool);
        qi_free(c->scratch);
        qi_free(c->att);
        qi_free(c);
    }
    qi_free(b);
}

static qi_status cpu_reserve(qi_backend *b, size_t scratch_bytes, int max_pos, qi_err *err);

static const qi_backend_i k_cpu_iface = {
    .version = QI_BACKEND_VERSION,
    .name = "cpu",
    .matmul = cpu_matmul,
    .rmsnorm = cpu_rmsnorm,
    .rope = cpu_rope,
    .attention = cpu_attention,
    .swiglu = cpu_swiglu,
    .get_rows = cpu_get_rows,
    .reserve = cpu_reserve,
    .free = cpu_free,
};

qi_status qi_backend_cpu_create(int n_threads, qi_backend **out, qi_err *err) {
    *out = NULL;
    qi_backend *b = qi_calloc(1, sizeof *b);
    cpu_ctx *c = qi_calloc(1, sizeof *c);
    if (!b || !c) {
        qi_free(b);
        qi_free(c);
        return QI_ERR(err, QI_ERR_NOMEM, "out of memory creating CPU backend");
    }
    b->iface = &k_cpu_iface;
    b->ctx = c;
    qi_status st = qi_pool_create(n_threads, &c->pool, err);
    if (st) {
        cpu_free(b);
        return st;
    }
    *out = b;
    return QI_OK;
}

static qi_status cpu_reserve(qi_backend *b, size_t scratch_bytes, int max_pos, qi_err *err) {
    cpu_ctx *c = C(b);
    if (scratch_bytes > c->scratch_bytes) {
        void *p = qi_realloc(c->scratch, scratch_bytes);
        if (!p) return QI_ERR(err, QI_ERR_NOMEM, "out of memory reserving %zu scratch bytes", scratch_bytes);
        c->scratch = p;
        c->scratch_bytes = scratch_bytes;
    }
    if (max_pos > c->att_len) {
        float *p = qi_realloc(c->att, sizeof(float) * (size_t)max_pos * (size_t)qi_pool_size(c->pool));
        if (!p) return QI_ERR(err, QI_ERR_NOMEM, "out of memory reserving attention scratch");
        c->att = p;
        c->att_len = max_pos;
    }
    return QI_OK;
}

void qi_backend_free(qi_backend *b) {
    if (b) b->iface->free(b);
}

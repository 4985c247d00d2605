/* backend_testdev.c - "testdev", a second CPU device for tests and CI
 * (backend.h): what an accelerator's contract asks of a device, kept on
 * the CPU so that split plans are exercised where no GPU is.
 *
 * - Memory: its own buffers, counted against its own capacity; other
 *   devices cannot address them (device.c refuses a view of another
 *   device's buffer), so a block that forgot a copy fails instead of
 *   reading the host's memory by accident.
 * - A stream run by a worker thread: copies are queued and return at
 *   once; they complete later, in order, and only events order them with
 *   other devices. Each copy fills its destination with 0xff bytes (NaN in
 *   fp32 and fp16) before writing it, so a reader that did not wait is
 *   likely to see NaN rather than stale bytes that happen to be right.
 * - Weights: the rows uploaded, and with QI_CPU_REPACK their packed form
 *   beside them, as the CPU would prepare it.
 * - Ops: the CPU backend's, on a pool of its own, run on the calling
 *   thread once the stream has drained (an op is ordered after the copies
 *   queued before it, as on a GPU stream). Results equal the CPU's bit for
 *   bit, which is what lets plan tests compare logits exactly.
 */
#include <pthread.h>
#include <string.h>

#include "backend.h"

typedef enum { CMD_COPY, CMD_MARK, CMD_WAIT } cmd_kind;

typedef struct {
    cmd_kind kind;
    void *dst;
    const void *src;
    size_t n;
    qi_event *ev;
} cmd;

typedef struct {
    qi_backend *inner; /* the CPU backend whose ops it runs */
    pthread_t worker;
    pthread_mutex_t mu;
    pthread_cond_t cv;      /* work queued, hold released, stop */
    pthread_cond_t idle_cv; /* the queue ran empty */
    cmd *q;
    long head, n, cap;
    bool busy, hold, stop, started;
    bool op; /* an op runs on the calling thread: the stream waits */
} td_ctx;

static td_ctx *T(qi_backend *b) { return (td_ctx *)b->ctx; }

static void *worker_main(void *arg) {
    qi_backend *b = arg;
    td_ctx *c = T(b);
    pthread_mutex_lock(&c->mu);
    for (;;) {
        while (!c->stop && (c->n == 0 || c->hold || c->op)) pthread_cond_wait(&c->cv, &c->mu);
        if (c->n == 0 && c->stop) break;
        const cmd k = c->q[c->head];
        c->head = (c->head + 1) % c->cap;
        c->n--;
        c->busy = true;
        pthread_mutex_unlock(&c->mu);
        switch (k.kind) {
        case CMD_COPY:
            memset(k.dst, 0xff, k.n);
            memmove(k.dst, k.src, k.n);
            break;
        case CMD_MARK:
            qi_event_complete(k.ev, qi_dev_now());
            break;
        case CMD_WAIT:
            qi_event_sync(k.ev);
            break;
        }
        pthread_mutex_lock(&c->mu);
        c->busy = false;
        if (c->n == 0) pthread_cond_broadcast(&c->idle_cv);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

/* Queue a command; the queue grows as needed (a failed growth is a
 * recorded failure: the command is not queued). */
static void push(qi_backend *b, cmd k) {
    td_ctx *c = T(b);
    pthread_mutex_lock(&c->mu);
    if (c->n == c->cap) {
        const long cap = c->cap ? 2 * c->cap : 64;
        cmd *q = qi_malloc(sizeof *q * (size_t)cap);
        if (!q) {
            pthread_mutex_unlock(&c->mu);
            qi_err e = {0};
            QI_ERR(&e, QI_ERR_NOMEM, "%s: out of memory queueing a command", b->info.name);
            qi_dev_fail(b, QI_ERR_NOMEM, &e);
            if (k.kind == CMD_MARK) qi_event_complete(k.ev, qi_dev_now());
            return;
        }
        for (long i = 0; i < c->n; i++) q[i] = c->q[(c->head + i) % c->cap];
        qi_free(c->q);
        c->q = q;
        c->head = 0;
        c->cap = cap;
    }
    c->q[(c->head + c->n) % c->cap] = k;
    c->n++;
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

static void td_drain(qi_backend *b) {
    td_ctx *c = T(b);
    pthread_mutex_lock(&c->mu);
    while (c->n > 0 || c->busy) pthread_cond_wait(&c->idle_cv, &c->mu);
    pthread_mutex_unlock(&c->mu);
}

void qi_testdev_hold(qi_backend *b, bool hold) {
    td_ctx *c = T(b);
    pthread_mutex_lock(&c->mu);
    c->hold = hold;
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

static void *td_buf_mem(qi_backend *b, size_t n) {
    (void)b;
    return qi_malloc_aligned(64, n);
}
static void td_buf_release(qi_backend *b, void *mem) {
    td_drain(b); /* no queued copy may still write it */
    qi_free(mem);
}
static void td_copy(qi_backend *b, void *dst, const void *src, size_t n) {
    push(b, (cmd){.kind = CMD_COPY, .dst = dst, .src = src, .n = n});
}
static void td_mark(qi_backend *b, qi_event *ev) { push(b, (cmd){.kind = CMD_MARK, .ev = ev}); }
static void td_wait(qi_backend *b, qi_event *ev) { push(b, (cmd){.kind = CMD_WAIT, .ev = ev}); }

/* ---- ops: the CPU's, after the stream ------------------------------------------- */

/* An op runs on the calling thread, after the commands queued before it
 * and before any queued while it runs (another host thread's copy, say):
 * the stream's worker waits for it, as a GPU stream runs its commands one
 * after another. */
static qi_backend *op_begin(qi_backend *b) {
    td_ctx *c = T(b);
    pthread_mutex_lock(&c->mu);
    while (c->n > 0 || c->busy || c->op) pthread_cond_wait(&c->idle_cv, &c->mu);
    c->op = true;
    pthread_mutex_unlock(&c->mu);
    return c->inner;
}
static void op_end(qi_backend *b) {
    td_ctx *c = T(b);
    pthread_mutex_lock(&c->mu);
    c->op = false;
    pthread_cond_broadcast(&c->idle_cv);
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
}
#define INNER(b) (T(b)->inner)
#define OP(b) op_begin(b)

static void td_matmul(qi_backend *b, const qi_weight *w, const float *x, int T_, float *y) {
    qi_backend *in = OP(b);
    in->iface->matmul(in, w, x, T_, y);
    op_end(b);
}
static void td_matmul_n(qi_backend *b, const qi_weight *const *w, float *const *y, int n, const float *x, int T_) {
    qi_backend *in = OP(b);
    in->iface->matmul_n(in, w, y, n, x, T_);
    op_end(b);
}
static void td_rmsnorm(qi_backend *b, const float *x, const float *w, int T_, int n, float eps, float *y) {
    qi_backend *in = OP(b);
    in->iface->rmsnorm(in, x, w, T_, n, eps, y);
    op_end(b);
}
static void td_rope(qi_backend *b, float *q, int Hq, float *k, int Hk, int T_, int D, int n_rot, const int32_t *pos,
                    float base, float freq_scale, int mode) {
    qi_backend *in = OP(b);
    in->iface->rope(in, q, Hq, k, Hk, T_, D, n_rot, pos, base, freq_scale, mode);
    op_end(b);
}
static void td_attention_paged(qi_backend *b, const qi_attn_paged_args *a) {
    qi_backend *in = OP(b);
    in->iface->attention_paged(in, a);
    op_end(b);
}
static void td_attention_paged_n(qi_backend *b, const qi_attn_paged_args *a, int n) {
    qi_backend *in = OP(b);
    in->iface->attention_paged_n(in, a, n);
    op_end(b);
}
static void td_attention_merge(qi_backend *b, const qi_attn_merge_args *a) {
    qi_backend *in = OP(b);
    in->iface->attention_merge(in, a);
    op_end(b);
}
static void td_swiglu(qi_backend *b, float *gate, const float *up, int T_, int n) {
    qi_backend *in = OP(b);
    in->iface->swiglu(in, gate, up, T_, n);
    op_end(b);
}
static void td_geglu(qi_backend *b, float *gate, const float *up, int T_, int n) {
    qi_backend *in = OP(b);
    in->iface->geglu(in, gate, up, T_, n);
    op_end(b);
}
static void td_get_rows(qi_backend *b, const qi_weight *w, const int32_t *ids, int T_, float *out) {
    qi_backend *in = OP(b);
    in->iface->get_rows(in, w, ids, T_, out);
    op_end(b);
}
static void td_kv_write(qi_backend *b, const float *const *src, uint16_t *const *dst, int n, int D) {
    qi_backend *in = OP(b);
    in->iface->kv_write(in, src, dst, n, D);
    op_end(b);
}
static void td_add(qi_backend *b, float *x, const float *y, long n) {
    qi_backend *in = OP(b);
    in->iface->add(in, x, y, n);
    op_end(b);
}
static void td_scale(qi_backend *b, float *x, long n, float s) {
    qi_backend *in = OP(b);
    in->iface->scale(in, x, n, s);
    op_end(b);
}
static void td_softcap(qi_backend *b, float *x, long n, float cap) {
    qi_backend *in = OP(b);
    in->iface->softcap(in, x, n, cap);
    op_end(b);
}
static void td_gather_rows(qi_backend *b, float *x, const int32_t *rows, int n, int width) {
    qi_backend *in = OP(b);
    in->iface->gather_rows(in, x, rows, n, width);
    op_end(b);
}
static qi_status td_reserve(qi_backend *b, size_t scratch_bytes, int max_rows, int max_pos, int Hkv, int D,
                            qi_err *err) {
    qi_backend *in = INNER(b);
    return in->iface->reserve(in, scratch_bytes, max_rows, max_pos, Hkv, D, err);
}

/* Weights: the rows uploaded through the stream, then whatever form the
 * CPU with the same flags adds (the packed groups), made beside them. */
#define TD_ALIGN 64
static size_t td_rows_bytes(const qi_weight *w) {
    const size_t n = (size_t)(w->row_bytes * (uint64_t)w->n_rows);
    return (n + TD_ALIGN - 1) / TD_ALIGN * TD_ALIGN;
}
static size_t td_weight_size(qi_backend *b, const qi_weight *w, bool matmul) {
    qi_backend *in = INNER(b);
    const size_t extra = in->iface->weight_size(in, w, matmul);
    return extra ? td_rows_bytes(w) + extra : (size_t)(w->row_bytes * (uint64_t)w->n_rows);
}
static void td_weight_prepare(qi_backend *b, const qi_weight *w, bool matmul, void *mem, qi_weight *out) {
    qi_backend *in = INNER(b);
    td_copy(b, mem, w->data, (size_t)(w->row_bytes * (uint64_t)w->n_rows));
    out->data = mem;
    out->packed = NULL;
    if (in->iface->weight_size(in, w, matmul)) {
        qi_weight form;
        in->iface->weight_prepare(in, w, matmul, (char *)mem + td_rows_bytes(w), &form);
        out->packed = form.packed;
        out->packed_group_bytes = form.packed_group_bytes;
    }
}

static void td_free(qi_backend *b) {
    td_ctx *c = T(b);
    if (c) {
        if (c->started) {
            pthread_mutex_lock(&c->mu);
            c->stop = true;
            c->hold = false;
            pthread_cond_signal(&c->cv);
            pthread_mutex_unlock(&c->mu);
            pthread_join(c->worker, NULL);
        }
        pthread_mutex_destroy(&c->mu);
        pthread_cond_destroy(&c->cv);
        pthread_cond_destroy(&c->idle_cv);
        qi_backend_free(c->inner);
        qi_free(c->q);
        qi_free(c);
    }
    qi_free(b);
}

static const qi_backend_i k_td_iface = {
    .version = QI_BACKEND_VERSION,
    .name = "testdev",
    .matmul = td_matmul,
    .matmul_n = td_matmul_n,
    .rmsnorm = td_rmsnorm,
    .rope = td_rope,
    .attention_paged = td_attention_paged,
    .attention_paged_n = td_attention_paged_n,
    .attention_merge = td_attention_merge,
    .swiglu = td_swiglu,
    .geglu = td_geglu,
    .get_rows = td_get_rows,
    .kv_write = td_kv_write,
    .add = td_add,
    .scale = td_scale,
    .softcap = td_softcap,
    .gather_rows = td_gather_rows,
    .reserve = td_reserve,
    .free = td_free,
    .buf_mem = td_buf_mem,
    .buf_release = td_buf_release,
    .copy = td_copy,
    .mark = td_mark,
    .wait = td_wait,
    .drain = td_drain,
    .weight_size = td_weight_size,
    .weight_prepare = td_weight_prepare,
};

qi_status qi_backend_testdev_create(int n_threads, size_t capacity, unsigned flags, qi_backend **out, qi_err *err) {
    *out = NULL;
    qi_backend *b = qi_calloc(1, sizeof *b);
    td_ctx *c = qi_calloc(1, sizeof *c);
    if (!b || !c) {
        qi_free(b);
        qi_free(c);
        return QI_ERR(err, QI_ERR_NOMEM, "out of memory creating the test device");
    }
    b->iface = &k_td_iface;
    b->ctx = c;
    b->info = (qi_dev_info){.name = "testdev", .kind = QI_DEV_TEST, .capacity = capacity};
    b->lock = &c->mu;
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    pthread_cond_init(&c->idle_cv, NULL);
    qi_status st = qi_backend_cpu_create(n_threads, flags & QI_CPU_REPACK, &c->inner, err);
    if (!st && !(c->started = pthread_create(&c->worker, NULL, worker_main, b) == 0)) {
        st = QI_ERR(err, QI_ERR_BACKEND, "testdev: cannot start its stream's worker thread");
    }
    if (st) {
        td_free(b);
        return st;
    }
    *out = b;
    return QI_OK;
}

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
 * - A copy stream beside it, run by a second worker: its copies run while
 *   the main stream's ops and copies do, ordered with them by events
 *   alone (a wait on either stream is a command that blocks that stream's
 *   worker until the event completes).
 * - Weights: the rows uploaded, and with QI_CPU_REPACK their packed form
 *   beside them, as the CPU would prepare it.
 * - Ops: the CPU backend's, on a pool of its own, run on the calling
 *   thread once the stream has drained (an op is ordered after the copies
 *   queued before it, as on a GPU stream). Results equal the CPU's bit for
 *   bit, which is what lets plan tests compare logits exactly.
 */
#include <pthread.h>
#include <unistd.h>
#include <string.h>
#include <time.h>

#include "backend.h"

typedef enum { CMD_COPY, CMD_MARK, CMD_WAIT } cmd_kind;

/* A copy is height rows of n bytes (pitches dpitch, spitch): one command
 * however many rows, as a GPU's strided copy is. */
typedef struct {
    cmd_kind kind;
    void *dst;
    const void *src;
    size_t n, dpitch, spitch, height;
    qi_event *ev;
} cmd;

/* A stream's queue and its worker (given the stream). */
typedef struct {
    qi_backend *b;
    int si; /* QI_STREAM_MAIN or QI_STREAM_COPY */
    pthread_t worker;
    cmd *q;
    long head, n, cap;
    bool busy, started;
} td_stream;

typedef struct {
    qi_backend *inner; /* the CPU backend whose ops it runs */
    pthread_mutex_t mu;
    pthread_cond_t cv;      /* work queued, hold released, an op ended, stop */
    pthread_cond_t idle_cv; /* a queue ran empty, an op ended */
    td_stream s[2];         /* [QI_STREAM_MAIN], [QI_STREAM_COPY] */
    bool hold, stop;
    bool op; /* an op runs on the calling thread: the main stream waits */
    long ops;          /* ops run */
    long copies[2];    /* copies run per stream */
    long slow_ops;     /* tests: qi_testdev_slow_copies */
    int slow_us;
    int slow_main_us;  /* tests: qi_testdev_slow_main_copies */
} td_ctx;

static td_ctx *T(qi_backend *b) { return (td_ctx *)b->ctx; }

static bool idle(const td_stream *q) { return q->n == 0 && !q->busy; }

/* Tests (qi_testdev_slow_copies): a copy-stream copy's destination, filled
 * with 0xff, stays so until slow_ops ops have run or slow_us have passed. */
static void slow_copy(td_ctx *c) {
    pthread_mutex_lock(&c->mu);
    if (c->slow_us > 0) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        const long ns = until.tv_nsec + 1000L * c->slow_us;
        until.tv_sec += ns / 1000000000L;
        until.tv_nsec = ns % 1000000000L;
        const long ops0 = c->ops;
        while (c->ops - ops0 < c->slow_ops && !c->stop && pthread_cond_timedwait(&c->cv, &c->mu, &until) == 0) {
        }
    }
    pthread_mutex_unlock(&c->mu);
}

static void *worker_main(void *arg) {
    td_stream *q = arg;
    const int si = q->si;
    td_ctx *c = T(q->b);
    pthread_mutex_lock(&c->mu);
    for (;;) {
        /* the copy stream runs beside the ops; the main one after them */
        while (!c->stop && (q->n == 0 || c->hold || (si == QI_STREAM_MAIN && c->op)))
            pthread_cond_wait(&c->cv, &c->mu);
        if (q->n == 0 && c->stop) break;
        const cmd k = q->q[q->head];
        q->head = (q->head + 1) % q->cap;
        q->n--;
        q->busy = true;
        pthread_mutex_unlock(&c->mu);
        switch (k.kind) {
        case CMD_COPY:
            for (size_t r = 0; r < k.height; r++) memset((char *)k.dst + r * k.dpitch, 0xff, k.n);
            if (si == QI_STREAM_COPY) slow_copy(c);
            if (si == QI_STREAM_MAIN && c->slow_main_us > 0) usleep((useconds_t)c->slow_main_us);
            for (size_t r = 0; r < k.height; r++)
                memmove((char *)k.dst + r * k.dpitch, (const char *)k.src + r * k.spitch, k.n);
            break;
        case CMD_MARK:
            qi_event_complete(k.ev, qi_dev_now());
            break;
        case CMD_WAIT:
            qi_event_sync(k.ev);
            break;
        }
        pthread_mutex_lock(&c->mu);
        if (k.kind == CMD_COPY) c->copies[si]++;
        q->busy = false;
        if (q->n == 0) pthread_cond_broadcast(&c->idle_cv);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

/* Queue a command on stream si; the queue grows as needed (a failed
 * growth is a recorded failure: the command is not queued). */
static void push(qi_backend *b, int si, cmd k) {
    td_ctx *c = T(b);
    td_stream *s = &c->s[si];
    pthread_mutex_lock(&c->mu);
    if (s->n == s->cap) {
        const long cap = s->cap ? 2 * s->cap : 64;
        cmd *q = qi_malloc(sizeof *q * (size_t)cap);
        if (!q) {
            pthread_mutex_unlock(&c->mu);
            qi_err e = {0};
            QI_ERR(&e, QI_ERR_NOMEM, "%s: out of memory queueing a command", b->info.name);
            qi_dev_fail(b, QI_ERR_NOMEM, &e);
            if (k.kind == CMD_MARK) qi_event_complete(k.ev, qi_dev_now());
            return;
        }
        for (long i = 0; i < s->n; i++) q[i] = s->q[(s->head + i) % s->cap];
        qi_free(s->q);
        s->q = q;
        s->head = 0;
        s->cap = cap;
    }
    s->q[(s->head + s->n) % s->cap] = k;
    s->n++;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

static void td_drain(qi_backend *b) {
    td_ctx *c = T(b);
    pthread_mutex_lock(&c->mu);
    while (!idle(&c->s[0]) || !idle(&c->s[1])) pthread_cond_wait(&c->idle_cv, &c->mu);
    pthread_mutex_unlock(&c->mu);
}

void qi_testdev_slow_copies(qi_backend *b, long ops, int us) {
    td_ctx *c = T(b);
    pthread_mutex_lock(&c->mu);
    c->slow_ops = ops;
    c->slow_us = us;
    pthread_mutex_unlock(&c->mu);
}

void qi_testdev_slow_main_copies(qi_backend *b, int us) {
    td_ctx *c = T(b);
    pthread_mutex_lock(&c->mu);
    c->slow_main_us = us;
    pthread_mutex_unlock(&c->mu);
}

long qi_testdev_copies(qi_backend *b, qi_stream s) {
    td_ctx *c = T(b);
    pthread_mutex_lock(&c->mu);
    const long n = c->copies[s == QI_STREAM_COPY];
    pthread_mutex_unlock(&c->mu);
    return n;
}

void qi_testdev_hold(qi_backend *b, bool hold) {
    td_ctx *c = T(b);
    pthread_mutex_lock(&c->mu);
    c->hold = hold;
    pthread_cond_broadcast(&c->cv);
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
static void copy_2d_on(qi_backend *b, int si, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                       size_t height) {
    push(b, si, (cmd){.kind = CMD_COPY, .dst = dst, .src = src, .n = width, .dpitch = dpitch, .spitch = spitch,
                      .height = height});
}
static void td_copy(qi_backend *b, void *dst, const void *src, size_t n) {
    copy_2d_on(b, QI_STREAM_MAIN, dst, n, src, n, n, 1);
}
static void td_copy_2d(qi_backend *b, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                       size_t height) {
    copy_2d_on(b, QI_STREAM_MAIN, dst, dpitch, src, spitch, width, height);
}
static void td_mark(qi_backend *b, qi_event *ev) { push(b, QI_STREAM_MAIN, (cmd){.kind = CMD_MARK, .ev = ev}); }
static void td_wait(qi_backend *b, qi_event *ev) { push(b, QI_STREAM_MAIN, (cmd){.kind = CMD_WAIT, .ev = ev}); }
static void td_cs_copy(qi_backend *b, void *dst, const void *src, size_t n) {
    copy_2d_on(b, QI_STREAM_COPY, dst, n, src, n, n, 1);
}
static void td_cs_copy_2d(qi_backend *b, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                          size_t height) {
    copy_2d_on(b, QI_STREAM_COPY, dst, dpitch, src, spitch, width, height);
}
static void td_cs_mark(qi_backend *b, qi_event *ev) { push(b, QI_STREAM_COPY, (cmd){.kind = CMD_MARK, .ev = ev}); }
static void td_cs_wait(qi_backend *b, qi_event *ev) { push(b, QI_STREAM_COPY, (cmd){.kind = CMD_WAIT, .ev = ev}); }

/* ---- ops: the CPU's, after the stream ------------------------------------------- */

/* An op runs on the calling thread, after the commands queued before it
 * on the main stream and before any queued there while it runs (another
 * host thread's copy, say): the stream's worker waits for it, as a GPU
 * stream runs its commands one after another. The copy stream goes on. */
static qi_backend *op_begin(qi_backend *b) {
    td_ctx *c = T(b);
    pthread_mutex_lock(&c->mu);
    while (!idle(&c->s[QI_STREAM_MAIN]) || c->op) pthread_cond_wait(&c->idle_cv, &c->mu);
    c->op = true;
    pthread_mutex_unlock(&c->mu);
    return c->inner;
}
static void op_end(qi_backend *b) {
    td_ctx *c = T(b);
    pthread_mutex_lock(&c->mu);
    c->op = false;
    c->ops++;
    pthread_cond_broadcast(&c->idle_cv);
    pthread_cond_broadcast(&c->cv);
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
static void td_add_bias(qi_backend *b, float *x, const float *bias, int T, int n) {
    qi_backend *in = OP(b);
    in->iface->add_bias(in, x, bias, T, n);
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
        pthread_mutex_lock(&c->mu);
        c->stop = true;
        c->hold = false;
        pthread_cond_broadcast(&c->cv);
        pthread_mutex_unlock(&c->mu);
        for (int i = 0; i < 2; i++)
            if (c->s[i].started) pthread_join(c->s[i].worker, NULL);
        pthread_mutex_destroy(&c->mu);
        pthread_cond_destroy(&c->cv);
        pthread_cond_destroy(&c->idle_cv);
        qi_backend_free(c->inner);
        for (int i = 0; i < 2; i++) qi_free(c->s[i].q);
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
    .add_bias = td_add_bias,
    .reserve = td_reserve,
    .free = td_free,
    .buf_mem = td_buf_mem,
    .buf_release = td_buf_release,
    .copy = td_copy,
    .copy_2d = td_copy_2d,
    .mark = td_mark,
    .wait = td_wait,
    .drain = td_drain,
    .weight_size = td_weight_size,
    .weight_prepare = td_weight_prepare,
    .cs_copy = td_cs_copy,
    .cs_copy_2d = td_cs_copy_2d,
    .cs_mark = td_cs_mark,
    .cs_wait = td_cs_wait,
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
    for (int i = 0; i < 2 && !st; i++) {
        c->s[i].b = b;
        c->s[i].si = i;
        if (!(c->s[i].started = pthread_create(&c->s[i].worker, NULL, worker_main, &c->s[i]) == 0))
            st = QI_ERR(err, QI_ERR_BACKEND, "testdev: cannot start its %s stream's worker thread",
                        i ? "copy" : "main");
    }
    if (st) {
        td_free(b);
        return st;
    }
    *out = b;
    return QI_OK;
}

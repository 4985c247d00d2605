/* device.c - the device half of the backend interface (backend.h):
 * buffers with capacity accounting, views checked against their device,
 * queued copies, events and the sticky failure record. The devices
 * themselves supply memory, a stream and markers (buf_mem, copy, mark,
 * wait, drain) and, where they have one, a copy stream (cs_copy, cs_mark,
 * cs_wait); everything checked or counted is done here once.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "backend.h"

struct qi_buf {
    qi_backend *dev;
    void *mem;
    size_t size;
    char what[40];
};

struct qi_event {
    qi_backend *dev;
    qi_stream stream;
    atomic_int done;
    double t;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    void *impl; /* the device's own marker (a CUDA event), qi_event_impl */
};

double qi_dev_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

const qi_dev_info *qi_dev_info_get(const qi_backend *b) { return &b->info; }

static void lock(qi_backend *b) {
    if (b->lock) pthread_mutex_lock(b->lock);
}
static void unlock(qi_backend *b) {
    if (b->lock) pthread_mutex_unlock(b->lock);
}

qi_status qi_buf_alloc(qi_backend *b, size_t n, const char *what, qi_buf **out, qi_err *err) {
    *out = NULL;
    qi_dev_info *in = &b->info;
    if (n == 0) return QI_ERR(err, QI_ERR_INVALID, "%s: a buffer of 0 bytes for %s", in->name, what);
    if (in->capacity && (in->in_use > in->capacity || n > in->capacity - in->in_use))
        return QI_ERR(err, QI_ERR_NOMEM, "%s: %zu bytes for %s do not fit: %zu of %zu bytes in use", in->name, n,
                      what, in->in_use, in->capacity);
    qi_buf *buf = qi_calloc(1, sizeof *buf);
    void *mem = buf ? b->iface->buf_mem(b, n) : NULL;
    if (!mem) {
        qi_free(buf);
        return QI_ERR(err, QI_ERR_NOMEM, "%s: out of memory allocating %zu bytes for %s", in->name, n, what);
    }
    buf->dev = b;
    buf->mem = mem;
    buf->size = n;
    snprintf(buf->what, sizeof buf->what, "%s", what);
    in->in_use += n;
    if (in->in_use > in->peak) in->peak = in->in_use;
    *out = buf;
    return QI_OK;
}

void qi_buf_free(qi_buf *buf) {
    if (!buf) return;
    buf->dev->info.in_use -= buf->size;
    buf->dev->iface->buf_release(buf->dev, buf->mem);
    qi_free(buf);
}

size_t qi_buf_size(const qi_buf *buf) { return buf->size; }
qi_backend *qi_buf_device(const qi_buf *buf) { return buf->dev; }

static qi_status check_view(const qi_backend *b, qi_view v, size_t n, bool any_host, qi_err *err) {
    if (!v.buf) return QI_ERR(err, QI_ERR_INVALID, "%s: a view of no buffer", b->info.name);
    if (v.buf->dev != b && !(any_host && v.buf->dev->info.host_visible))
        return QI_ERR(err, QI_ERR_INVALID, "%s: buffer '%s' of device %s given to device %s (a copy is missing)",
                      b->info.name, v.buf->what, v.buf->dev->info.name, b->info.name);
    if (v.off > v.buf->size || n > v.buf->size - v.off)
        return QI_ERR(err, QI_ERR_INVALID, "%s: bytes %zu..%zu of buffer '%s' of %zu bytes", b->info.name, v.off,
                      v.off + n, v.buf->what, v.buf->size);
    return QI_OK;
}

void *qi_buf_ptr(qi_backend *b, qi_view v, size_t n, qi_err *err) {
    if (check_view(b, v, n, false, err)) return NULL;
    return (char *)v.buf->mem + v.off;
}

void qi_dev_inject_fail(qi_backend *b, long n) { b->inject = n; }

/* A command that an injected failure stops: recorded, not performed. */
static bool injected(qi_backend *b, size_t n) {
    if (b->inject <= 0 || --b->inject > 0) return false;
    qi_err e = {0};
    QI_ERR(&e, QI_ERR_BACKEND, "%s: injected failure of a %zu-byte copy", b->info.name, n);
    qi_dev_fail(b, QI_ERR_BACKEND, &e);
    return true;
}

qi_status qi_dev_copy(qi_backend *b, qi_view dst, qi_view src, size_t n, qi_err *err) {
    qi_status st;
    if ((st = check_view(b, dst, n, true, err)) || (st = check_view(b, src, n, true, err))) return st;
    if (dst.buf->dev != b && src.buf->dev != b)
        return QI_ERR(err, QI_ERR_INVALID, "%s: a copy from %s to %s queued on neither's stream", b->info.name,
                      src.buf->dev->info.name, dst.buf->dev->info.name);
    if (n && !injected(b, n))
        b->iface->copy(b, (char *)dst.buf->mem + dst.off, (const char *)src.buf->mem + src.off, n);
    return QI_OK;
}

qi_backend *qi_dev_copy_stream(qi_backend *dst, qi_backend *src) {
    if (dst->info.host_visible) return src;
    if (src->info.host_visible || src == dst) return dst;
    return NULL;
}

bool qi_dev_has_copy_stream(const qi_backend *b) { return b->iface->cs_copy != NULL; }

/* The stream work asked of s goes on: the main one where b has no other. */
static qi_stream stream_of(const qi_backend *b, qi_stream s) {
    return s == QI_STREAM_COPY && qi_dev_has_copy_stream(b) ? QI_STREAM_COPY : QI_STREAM_MAIN;
}

static void queue_copy(qi_backend *b, qi_stream s, void *dst, const void *src, size_t n) {
    (stream_of(b, s) == QI_STREAM_COPY ? b->iface->cs_copy : b->iface->copy)(b, dst, src, n);
}

static void queue_copy_2d(qi_backend *b, qi_stream s, char *d, size_t dpitch, const char *src, size_t spitch,
                          size_t width, size_t height) {
    const bool cs = stream_of(b, s) == QI_STREAM_COPY;
    void (*c2)(qi_backend *, void *, size_t, const void *, size_t, size_t, size_t) =
        cs ? b->iface->cs_copy_2d : b->iface->copy_2d;
    if (c2)
        c2(b, d, dpitch, src, spitch, width, height);
    else
        for (size_t r = 0; r < height; r++) queue_copy(b, s, d + r * dpitch, src + r * spitch, width);
}

qi_status qi_dev_upload_on(qi_backend *b, qi_stream s, qi_view dst, const void *src, size_t n, qi_err *err) {
    qi_status st = check_view(b, dst, n, false, err);
    if (st) return st;
    if (n && !injected(b, n)) queue_copy(b, s, (char *)dst.buf->mem + dst.off, src, n);
    return QI_OK;
}

qi_status qi_dev_upload(qi_backend *b, qi_view dst, const void *src, size_t n, qi_err *err) {
    return qi_dev_upload_on(b, QI_STREAM_MAIN, dst, src, n, err);
}

static qi_status check_pitches(const qi_backend *b, size_t dpitch, size_t spitch, size_t width, qi_err *err) {
    if (dpitch < width || spitch < width)
        return QI_ERR(err, QI_ERR_INVALID, "%s: a strided copy of %zu-byte rows with pitches %zu and %zu",
                      b->info.name, width, dpitch, spitch);
    return QI_OK;
}

/* Rows of a strided copy (height > 0) against a view: their extent in it. */
static qi_status check_rows(const qi_backend *b, qi_view v, size_t pitch, size_t width, size_t height, qi_err *err) {
    if (height - 1 > (SIZE_MAX - width) / pitch)
        return QI_ERR(err, QI_ERR_INVALID, "%s: a strided copy of %zu rows of pitch %zu overflows", b->info.name,
                      height, pitch);
    return check_view(b, v, pitch * (height - 1) + width, false, err);
}

qi_status qi_dev_upload_2d_on(qi_backend *b, qi_stream s, qi_view dst, size_t dpitch, const void *src, size_t spitch,
                              size_t width, size_t height, qi_err *err) {
    qi_status st = check_pitches(b, dpitch, spitch, width, err);
    if (st || !width || !height) return st;
    if ((st = check_rows(b, dst, dpitch, width, height, err))) return st;
    if (injected(b, width * height)) return QI_OK;
    queue_copy_2d(b, s, (char *)dst.buf->mem + dst.off, dpitch, src, spitch, width, height);
    return QI_OK;
}

qi_status qi_dev_upload_2d(qi_backend *b, qi_view dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                           size_t height, qi_err *err) {
    return qi_dev_upload_2d_on(b, QI_STREAM_MAIN, dst, dpitch, src, spitch, width, height, err);
}

qi_status qi_dev_copy_2d(qi_backend *b, qi_view dst, size_t dpitch, qi_view src, size_t spitch, size_t width,
                         size_t height, qi_err *err) {
    qi_status st = check_pitches(b, dpitch, spitch, width, err);
    if (st || !width || !height) return st;
    if ((st = check_rows(b, dst, dpitch, width, height, err)) || (st = check_rows(b, src, spitch, width, height, err)))
        return st;
    if (injected(b, width * height)) return QI_OK;
    queue_copy_2d(b, QI_STREAM_MAIN, (char *)dst.buf->mem + dst.off, dpitch, (const char *)src.buf->mem + src.off,
                  spitch, width, height);
    return QI_OK;
}

size_t qi_dev_weight_size(qi_backend *b, const qi_weight *w, bool matmul) {
    if (!w->data) return 0;
    if (b->iface->weight_size) return b->iface->weight_size(b, w, matmul);
    return (size_t)(w->row_bytes * (uint64_t)w->n_rows);
}

qi_status qi_dev_weight_prepare(qi_backend *b, const qi_weight *w, bool matmul, qi_view dst, qi_weight *out,
                                qi_err *err) {
    *out = *w;
    const size_t n = qi_dev_weight_size(b, w, matmul);
    if (!n) return QI_OK;
    qi_status st = check_view(b, dst, n, false, err);
    if (st) return st;
    void *mem = (char *)dst.buf->mem + dst.off;
    /* a form not made (an injected failure) still addresses its place */
    out->data = mem;
    out->packed = NULL;
    if (injected(b, n)) return QI_OK;
    if (b->iface->weight_prepare)
        b->iface->weight_prepare(b, w, matmul, mem, out);
    else
        b->iface->copy(b, mem, w->data, n);
    return QI_OK;
}

qi_status qi_dev_download(qi_backend *b, void *dst, qi_view src, size_t n, qi_err *err) {
    qi_status st = check_view(b, src, n, false, err);
    if (st) return st;
    if (n && !injected(b, n)) b->iface->copy(b, dst, (const char *)src.buf->mem + src.off, n);
    return QI_OK;
}

qi_status qi_event_record_on(qi_backend *b, qi_stream s, qi_event **out, qi_err *err) {
    *out = NULL;
    qi_event *ev = qi_calloc(1, sizeof *ev);
    if (!ev) return QI_ERR(err, QI_ERR_NOMEM, "%s: out of memory for an event", b->info.name);
    ev->dev = b;
    ev->stream = stream_of(b, s);
    atomic_init(&ev->done, 0);
    pthread_mutex_init(&ev->mu, NULL);
    pthread_cond_init(&ev->cv, NULL);
    (ev->stream == QI_STREAM_COPY ? b->iface->cs_mark : b->iface->mark)(b, ev);
    *out = ev;
    return QI_OK;
}

qi_status qi_event_record(qi_backend *b, qi_event **out, qi_err *err) {
    return qi_event_record_on(b, QI_STREAM_MAIN, out, err);
}

qi_backend *qi_event_device(const qi_event *ev) { return ev->dev; }
qi_stream qi_event_stream(const qi_event *ev) { return ev->stream; }

void qi_event_complete(qi_event *ev, double t) {
    pthread_mutex_lock(&ev->mu);
    ev->t = t;
    atomic_store(&ev->done, 1);
    pthread_cond_broadcast(&ev->cv);
    pthread_mutex_unlock(&ev->mu);
}

void **qi_event_impl(qi_event *ev) { return &ev->impl; }

static void wait_done(qi_event *ev) {
    if (atomic_load(&ev->done)) return;
    /* a marker the host completes by asking the device (ev_sync) */
    if (ev->dev->iface->ev_sync) ev->dev->iface->ev_sync(ev->dev, ev);
    pthread_mutex_lock(&ev->mu);
    while (!atomic_load(&ev->done)) pthread_cond_wait(&ev->cv, &ev->mu);
    pthread_mutex_unlock(&ev->mu);
}

void qi_event_sync(qi_event *ev) {
    wait_done(ev);
    if (ev->dev->iface->host_wait) ev->dev->iface->host_wait(ev->dev, ev->t);
}

double qi_event_time(const qi_event *ev) { return ev->t; }

qi_status qi_event_wait_on(qi_backend *b, qi_stream s, qi_event *ev, qi_err *err) {
    (void)err;
    s = stream_of(b, s);
    if (ev->dev == b && ev->stream == s) return QI_OK; /* stream order */
    (s == QI_STREAM_COPY ? b->iface->cs_wait : b->iface->wait)(b, ev);
    return QI_OK;
}

qi_status qi_event_wait(qi_backend *b, qi_event *ev, qi_err *err) {
    return qi_event_wait_on(b, QI_STREAM_MAIN, ev, err);
}

double qi_event_elapsed(const qi_event *a, const qi_event *b) { return b->t - a->t; }

void qi_event_free(qi_event *ev) {
    if (!ev) return;
    if (ev->dev->iface->ev_release)
        ev->dev->iface->ev_release(ev->dev, ev); /* its marker points at the device's, not at ev */
    else
        wait_done(ev); /* a queued marker still points at it (not a wait of the host's) */
    /* wait_done may have seen done while the completer is still in its
     * broadcast: it has left the mutex once we have held it */
    pthread_mutex_lock(&ev->mu);
    pthread_mutex_unlock(&ev->mu);
    pthread_mutex_destroy(&ev->mu);
    pthread_cond_destroy(&ev->cv);
    qi_free(ev);
}

void qi_dev_fail(qi_backend *b, qi_status st, const qi_err *e) {
    lock(b);
    if (!b->fail_st) {
        b->fail_st = st;
        b->fail = *e;
    }
    unlock(b);
}

qi_status qi_dev_synchronize(qi_backend *b, qi_err *err) {
    b->iface->drain(b);
    lock(b);
    const qi_status st = b->fail_st;
    if (st) {
        *err = b->fail;
        b->fail_st = QI_OK;
        qi_err_clear(&b->fail);
    }
    unlock(b);
    return st;
}

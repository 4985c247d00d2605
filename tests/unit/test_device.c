/* test_device.c - Check suite for the device contract of backend.h, on
 * both devices that run here (the CPU and testdev):
 *   - capacity accounting: bytes in use and peak; a buffer over the
 *     capacity refused with the device and the bytes named, nothing taken;
 *     an allocation that fails for lack of memory (injected) likewise;
 *   - views: a device refuses another device's buffer (a missing copy is
 *     an error, not a silent read) and ranges outside a buffer;
 *   - copies run in stream order and complete later than they are queued
 *     on testdev: with its worker held, the destination is not yet
 *     written; an event recorded after the copies, waited on by the other
 *     device or synced by the host, orders everything after it;
 *   - round trips host -> cpu -> testdev -> cpu -> host keep every byte;
 *   - failures inside the stream stick: an injected copy failure is
 *     returned by the next synchronise, once, naming the device;
 *   - a strided upload writes its column of blocks and nothing else, and
 *     so does a strided copy within a device;
 *   - the copy stream (testdev's; the CPU runs it on its one stream):
 *     ordered with the main stream by events both ways, beside its ops;
 *   - event times are ordered;
 *   - ops on testdev equal the CPU's bit for bit (a matmul and an
 *     attention over its own buffers).
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "qinfer/quant.h"
#include "testutil.h"

static qi_backend *make(int which, size_t capacity) {
    qi_backend *b = NULL;
    qi_err e = {0};
    if (which == 0)
        ck_assert_msg(qi_backend_cpu_create(2, 0, &b, &e) == QI_OK, "%s", e.msg);
    else
        ck_assert_msg(qi_backend_testdev_create(2, capacity, 0, &b, &e) == QI_OK, "%s", e.msg);
    return b;
}

START_TEST(test_capacity) {
    qi_backend *b = make(1, 1000);
    qi_err e = {0};
    qi_buf *a = NULL, *c = NULL, *d = NULL;
    ck_assert_str_eq(qi_dev_info_get(b)->name, "testdev");
    ck_assert_int_eq(qi_dev_info_get(b)->kind, QI_DEV_TEST);
    ck_assert(!qi_dev_info_get(b)->host_visible);
    ck_assert_int_eq(qi_buf_alloc(b, 600, "weights", &a, &e), QI_OK);
    ck_assert_uint_eq(qi_dev_info_get(b)->in_use, 600);
    ck_assert_int_eq(qi_buf_alloc(b, 401, "kv pool", &c, &e), QI_ERR_NOMEM);
    ck_assert_ptr_null(c);
    ck_assert_msg(strstr(e.msg, "testdev") && strstr(e.msg, "401 bytes for kv pool") && strstr(e.msg, "600 of 1000"),
                  "%s", e.msg);
    ck_assert_uint_eq(qi_dev_info_get(b)->in_use, 600);
    ck_assert_int_eq(qi_buf_alloc(b, 400, "kv pool", &c, &e), QI_OK);
    qi_buf_free(a);
    ck_assert_uint_eq(qi_dev_info_get(b)->in_use, 400);
    ck_assert_uint_eq(qi_dev_info_get(b)->peak, 1000);
    /* out of memory (injected) is an error naming the device, nothing counted */
    for (int k = 1; k <= 2; k++) { /* the record, then the memory */
        qi_alloc_fail_after(k);
        qi_err_clear(&e);
        ck_assert_int_eq(qi_buf_alloc(b, 100, "activations", &d, &e), QI_ERR_NOMEM);
        qi_alloc_fail_after(0);
        ck_assert_msg(strstr(e.msg, "testdev: out of memory allocating 100 bytes for activations"), "%s", e.msg);
        ck_assert_ptr_null(d);
        ck_assert_uint_eq(qi_dev_info_get(b)->in_use, 400);
    }
    ck_assert_int_eq(qi_buf_alloc(b, 0, "nothing", &d, &e), QI_ERR_INVALID);
    qi_buf_free(c);
    qi_buf_free(NULL);
    ck_assert_uint_eq(qi_dev_info_get(b)->in_use, 0);
    qi_backend_free(b);
}
END_TEST

START_TEST(test_views) {
    qi_backend *cpu = make(0, 0), *td = make(1, 0);
    qi_err e = {0};
    qi_buf *hc = NULL, *ht = NULL;
    ck_assert_int_eq(qi_buf_alloc(cpu, 64, "x", &hc, &e), QI_OK);
    ck_assert_int_eq(qi_buf_alloc(td, 64, "x", &ht, &e), QI_OK);
    ck_assert_ptr_nonnull(qi_buf_ptr(cpu, qi_view_of(hc, 0), 64, &e));
    ck_assert_ptr_nonnull(qi_buf_ptr(td, qi_view_of(ht, 32), 32, &e));
    /* another device's buffer: refused both ways */
    ck_assert_ptr_null(qi_buf_ptr(cpu, qi_view_of(ht, 0), 4, &e));
    ck_assert_msg(strstr(e.msg, "buffer 'x' of device testdev given to device cpu"), "%s", e.msg);
    qi_err_clear(&e);
    ck_assert_ptr_null(qi_buf_ptr(td, qi_view_of(hc, 0), 4, &e));
    ck_assert_msg(strstr(e.msg, "of device cpu given to device testdev"), "%s", e.msg);
    /* out of range */
    qi_err_clear(&e);
    ck_assert_ptr_null(qi_buf_ptr(td, qi_view_of(ht, 40), 32, &e));
    ck_assert_msg(strstr(e.msg, "bytes 40..72 of buffer 'x' of 64 bytes"), "%s", e.msg);
    qi_err_clear(&e);
    ck_assert_ptr_null(qi_buf_ptr(td, qi_view_of(ht, (size_t)-8), 16, &e));
    /* copies: one side must be the stream's device; host-visible buffers may be the other */
    ck_assert_int_eq(qi_dev_copy(td, qi_view_of(ht, 0), qi_view_of(hc, 0), 64, &e), QI_OK);
    ck_assert_int_eq(qi_dev_copy(td, qi_view_of(ht, 8), qi_view_of(hc, 0), 64, &e), QI_ERR_INVALID);
    qi_buf *ht2 = NULL;
    qi_backend *td2 = make(1, 0);
    ck_assert_int_eq(qi_buf_alloc(td2, 64, "y", &ht2, &e), QI_OK);
    qi_err_clear(&e);
    ck_assert_int_eq(qi_dev_copy(cpu, qi_view_of(ht2, 0), qi_view_of(ht, 0), 64, &e), QI_ERR_INVALID);
    ck_assert_msg(strstr(e.msg, "given to device cpu"), "%s", e.msg);
    ck_assert_int_eq(qi_dev_synchronize(td, &e), QI_OK);
    qi_buf_free(ht2);
    qi_buf_free(hc);
    qi_buf_free(ht);
    qi_backend_free(td2);
    qi_backend_free(cpu);
    qi_backend_free(td);
}
END_TEST

/* Copies complete later than they are queued, in order, and events order
 * them with the other device and the host. */
START_TEST(test_stream_order) {
    qi_backend *cpu = make(0, 0), *td = make(1, 0);
    qi_err e = {0};
    enum { N = 4096 };
    qi_buf *hc = NULL, *ht = NULL, *back = NULL;
    ck_assert_int_eq(qi_buf_alloc(cpu, N * sizeof(float), "src", &hc, &e), QI_OK);
    ck_assert_int_eq(qi_buf_alloc(cpu, N * sizeof(float), "back", &back, &e), QI_OK);
    ck_assert_int_eq(qi_buf_alloc(td, N * sizeof(float), "dst", &ht, &e), QI_OK);
    float *src = qi_buf_ptr(cpu, qi_view_of(hc, 0), N * sizeof(float), &e);
    float *bk = qi_buf_ptr(cpu, qi_view_of(back, 0), N * sizeof(float), &e);
    for (int i = 0; i < N; i++) {
        src[i] = (float)i;
        bk[i] = -1.0f;
    }
    qi_testdev_hold(td, true);
    ck_assert_int_eq(qi_dev_copy(td, qi_view_of(ht, 0), qi_view_of(hc, 0), N * sizeof(float), &e), QI_OK);
    ck_assert_int_eq(qi_dev_copy(td, qi_view_of(back, 0), qi_view_of(ht, 0), N * sizeof(float), &e), QI_OK);
    qi_event *ev = NULL;
    ck_assert_int_eq(qi_event_record(td, &ev, &e), QI_OK);
    /* held: nothing has run, the host still sees the old bytes */
    for (int i = 0; i < N; i++) ck_assert_float_eq(bk[i], -1.0f);
    qi_testdev_hold(td, false);
    ck_assert_int_eq(qi_event_wait(cpu, ev, &e), QI_OK); /* the CPU's stream is the host: it waits here */
    for (int i = 0; i < N; i++) ck_assert_float_eq(bk[i], (float)i);
    qi_event_free(ev);
    /* testdev fills a copy's destination with 0xff before writing it: a
     * copy of a buffer onto itself therefore leaves NaNs, which is what a
     * reader that skips an event sees while a copy is under way */
    ck_assert_int_eq(qi_dev_copy(td, qi_view_of(ht, 0), qi_view_of(ht, 0), N * sizeof(float), &e), QI_OK);
    ck_assert_int_eq(qi_dev_copy(td, qi_view_of(back, 0), qi_view_of(ht, 0), N * sizeof(float), &e), QI_OK);
    ck_assert_int_eq(qi_dev_synchronize(td, &e), QI_OK);
    for (int i = 0; i < N; i++) ck_assert(isnan(bk[i]));
    qi_buf_free(hc);
    qi_buf_free(back);
    qi_buf_free(ht);
    qi_backend_free(cpu);
    qi_backend_free(td);
}
END_TEST

START_TEST(test_round_trip_and_events) {
    qi_backend *cpu = make(0, 0), *td = make(1, 1 << 20);
    qi_err e = {0};
    enum { N = 100000 };
    unsigned char *host = malloc(N), *out = malloc(N);
    uint64_t r = 5;
    for (int i = 0; i < N; i++) host[i] = (unsigned char)qi_test_rand(&r);
    memset(out, 0, N);
    qi_buf *a = NULL, *b = NULL, *c = NULL;
    ck_assert_int_eq(qi_buf_alloc(cpu, N, "a", &a, &e), QI_OK);
    ck_assert_int_eq(qi_buf_alloc(td, N + 100, "b", &b, &e), QI_OK);
    ck_assert_int_eq(qi_buf_alloc(cpu, N, "c", &c, &e), QI_OK);
    qi_event *t0 = NULL, *t1 = NULL;
    ck_assert_int_eq(qi_event_record(td, &t0, &e), QI_OK);
    ck_assert_int_eq(qi_dev_upload(cpu, qi_view_of(a, 0), host, N, &e), QI_OK);
    ck_assert_int_eq(qi_dev_copy(td, qi_view_of(b, 100), qi_view_of(a, 0), N, &e), QI_OK);
    ck_assert_int_eq(qi_dev_copy(td, qi_view_of(c, 0), qi_view_of(b, 100), N, &e), QI_OK);
    ck_assert_int_eq(qi_event_record(td, &t1, &e), QI_OK);
    ck_assert_int_eq(qi_event_wait(cpu, t1, &e), QI_OK);
    ck_assert_int_eq(qi_dev_download(cpu, out, qi_view_of(c, 0), N, &e), QI_OK);
    ck_assert(memcmp(host, out, N) == 0);
    qi_event_sync(t0);
    ck_assert(qi_event_elapsed(t0, t1) >= 0.0);
    /* a download from testdev straight to host memory, ordered by an event */
    memset(out, 0, N);
    ck_assert_int_eq(qi_dev_download(td, out, qi_view_of(b, 100), N, &e), QI_OK);
    qi_event *t2 = NULL;
    ck_assert_int_eq(qi_event_record(td, &t2, &e), QI_OK);
    qi_event_sync(t2);
    ck_assert(memcmp(host, out, N) == 0);
    ck_assert(qi_event_elapsed(t1, t2) >= 0.0);
    /* the host cannot download another device's buffer through the CPU */
    ck_assert_int_eq(qi_dev_download(cpu, out, qi_view_of(b, 0), 10, &e), QI_ERR_INVALID);
    qi_event_free(t0);
    qi_event_free(t1);
    qi_event_free(t2);
    qi_buf_free(a);
    qi_buf_free(b);
    qi_buf_free(c);
    free(host);
    free(out);
    qi_backend_free(cpu);
    qi_backend_free(td);
}
END_TEST

START_TEST(test_sticky_failure) {
    for (int which = 0; which < 2; which++) {
        qi_backend *b = make(which, 0);
        qi_err e = {0};
        qi_buf *x = NULL;
        ck_assert_int_eq(qi_buf_alloc(b, 256, "x", &x, &e), QI_OK);
        char host[256] = {0};
        qi_dev_inject_fail(b, 2);
        ck_assert_int_eq(qi_dev_upload(b, qi_view_of(x, 0), host, 256, &e), QI_OK);
        ck_assert_int_eq(qi_dev_upload(b, qi_view_of(x, 0), host, 128, &e), QI_OK); /* fails in the stream */
        ck_assert_int_eq(qi_dev_upload(b, qi_view_of(x, 0), host, 64, &e), QI_OK);
        ck_assert_int_eq(qi_dev_synchronize(b, &e), QI_ERR_BACKEND);
        ck_assert_msg(strstr(e.msg, "injected failure of a 128-byte copy") && strstr(e.msg, which ? "testdev" : "cpu"),
                      "%s", e.msg);
        /* reported once: the record is cleared */
        qi_err_clear(&e);
        ck_assert_int_eq(qi_dev_synchronize(b, &e), QI_OK);
        /* the first failure sticks over later ones */
        qi_dev_inject_fail(b, 1);
        ck_assert_int_eq(qi_dev_upload(b, qi_view_of(x, 0), host, 16, &e), QI_OK);
        qi_dev_inject_fail(b, 1);
        ck_assert_int_eq(qi_dev_upload(b, qi_view_of(x, 0), host, 32, &e), QI_OK);
        ck_assert_int_eq(qi_dev_synchronize(b, &e), QI_ERR_BACKEND);
        ck_assert_msg(strstr(e.msg, "16-byte copy"), "%s", e.msg);
        qi_buf_free(x);
        qi_backend_free(b);
    }
}
END_TEST

/* A strided upload (qi_dev_upload_2d): a column of 3-byte blocks out of
 * rows of 11 into rows of 7, on both devices: those bytes written, every
 * other byte of the buffer as it was; pitches under the width and an
 * extent past the buffer refused; nothing to copy is no command; an
 * injected failure stops it as one command. */
START_TEST(test_upload_2d) {
    enum { H = 9, SP = 11, DP = 7, W = 3, OFF = 2 };
    unsigned char src[H * SP], want[H * DP + OFF], got[H * DP + OFF];
    for (int i = 0; i < H * SP; i++) src[i] = (unsigned char)(i * 7 + 1);
    for (int which = 0; which < 2; which++) {
        qi_backend *b = make(which, 0);
        qi_err e = {0};
        qi_buf *x = NULL;
        ck_assert_int_eq(qi_buf_alloc(b, sizeof want, "x", &x, &e), QI_OK);
        memset(want, 0xAB, sizeof want);
        ck_assert_int_eq(qi_dev_upload(b, qi_view_of(x, 0), want, sizeof want, &e), QI_OK);
        for (int r = 0; r < H; r++) memcpy(want + OFF + r * DP, src + 4 + r * SP, W);
        ck_assert_int_eq(qi_dev_upload_2d(b, qi_view_of(x, OFF), DP, src + 4, SP, W, H, &e), QI_OK);
        ck_assert_int_eq(qi_dev_download(b, got, qi_view_of(x, 0), sizeof got, &e), QI_OK);
        ck_assert_int_eq(qi_dev_synchronize(b, &e), QI_OK);
        ck_assert_msg(memcmp(got, want, sizeof got) == 0, "%s: strided upload", which ? "testdev" : "cpu");
        ck_assert_int_eq(qi_dev_upload_2d(b, qi_view_of(x, OFF), W - 1, src, SP, W, H, &e), QI_ERR_INVALID);
        ck_assert_msg(strstr(e.msg, "pitches"), "%s", e.msg);
        qi_err_clear(&e);
        ck_assert_int_eq(qi_dev_upload_2d(b, qi_view_of(x, OFF + DP), DP, src, SP, W, H, &e), QI_ERR_INVALID);
        qi_err_clear(&e);
        qi_dev_inject_fail(b, 1); /* nothing to copy: no command, so the failure waits for the next */
        ck_assert_int_eq(qi_dev_upload_2d(b, qi_view_of(x, 0), DP, src, SP, W, 0, &e), QI_OK);
        ck_assert_int_eq(qi_dev_upload_2d(b, qi_view_of(x, 0), DP, src, SP, W, H, &e), QI_OK);
        ck_assert_int_eq(qi_dev_upload(b, qi_view_of(x, 0), src, 1, &e), QI_OK);
        ck_assert_int_eq(qi_dev_synchronize(b, &e), QI_ERR_BACKEND);
        ck_assert_msg(strstr(e.msg, "injected failure of a 27-byte copy"), "%s", e.msg);
        qi_buf_free(x);
        qi_backend_free(b);
    }
}
END_TEST

/* The copy stream. testdev has one, the CPU none (work asked of it goes
 * on the one stream, its events are the main stream's). With testdev's
 * workers held, so that nothing runs until everything is queued: the main
 * stream's download after a wait for a copy-stream event sees the
 * copy-stream upload; the copy stream's upload after a wait for a
 * main-stream event lands after the main stream's. An op runs while a
 * copy-stream copy is still under way (it does not wait for that stream);
 * a synchronise waits for both. */
START_TEST(test_copy_stream) {
    qi_backend *cpu = make(0, 0), *td = make(1, 0);
    qi_err e = {0};
    ck_assert(!qi_dev_has_copy_stream(cpu));
    ck_assert(qi_dev_has_copy_stream(td));
    enum { N = 1 << 16 };
    unsigned char *a = malloc(N), *b = malloc(N), *out = malloc(N);
    memset(a, 1, N);
    memset(b, 2, N);
    qi_buf *x = NULL, *c = NULL;
    ck_assert_int_eq(qi_buf_alloc(td, N, "x", &x, &e), QI_OK);
    ck_assert_int_eq(qi_buf_alloc(cpu, N, "c", &c, &e), QI_OK);
    /* the CPU: the copy stream is the one stream */
    qi_event *ev = NULL;
    ck_assert_int_eq(qi_dev_upload_on(cpu, QI_STREAM_COPY, qi_view_of(c, 0), a, N, &e), QI_OK);
    ck_assert_int_eq(qi_event_record_on(cpu, QI_STREAM_COPY, &ev, &e), QI_OK);
    ck_assert_int_eq(qi_event_stream(ev), QI_STREAM_MAIN);
    ck_assert_ptr_eq(qi_event_device(ev), cpu);
    ck_assert_int_eq(qi_event_wait_on(cpu, QI_STREAM_MAIN, ev, &e), QI_OK);
    ck_assert(memcmp(qi_buf_ptr(cpu, qi_view_of(c, 0), N, &e), a, N) == 0);
    qi_event_free(ev);
    /* the main stream after a copy-stream event */
    const long cs0 = qi_testdev_copies(td, QI_STREAM_COPY), ms0 = qi_testdev_copies(td, QI_STREAM_MAIN);
    qi_event *up = NULL, *done = NULL;
    qi_testdev_hold(td, true);
    ck_assert_int_eq(qi_dev_upload_on(td, QI_STREAM_COPY, qi_view_of(x, 0), a, N, &e), QI_OK);
    ck_assert_int_eq(qi_event_record_on(td, QI_STREAM_COPY, &up, &e), QI_OK);
    ck_assert_int_eq(qi_event_stream(up), QI_STREAM_COPY);
    ck_assert_int_eq(qi_event_wait_on(td, QI_STREAM_MAIN, up, &e), QI_OK);
    ck_assert_int_eq(qi_dev_download(td, out, qi_view_of(x, 0), N, &e), QI_OK);
    ck_assert_int_eq(qi_event_record(td, &done, &e), QI_OK);
    qi_testdev_hold(td, false);
    qi_event_sync(done);
    ck_assert(memcmp(out, a, N) == 0);
    ck_assert_int_eq(qi_testdev_copies(td, QI_STREAM_COPY) - cs0, 1);
    ck_assert_int_eq(qi_testdev_copies(td, QI_STREAM_MAIN) - ms0, 1);
    qi_event_free(up);
    qi_event_free(done);
    /* the copy stream after a main-stream event */
    qi_event *m = NULL, *cev = NULL;
    qi_testdev_hold(td, true);
    ck_assert_int_eq(qi_dev_upload(td, qi_view_of(x, 0), a, N, &e), QI_OK);
    ck_assert_int_eq(qi_event_record(td, &m, &e), QI_OK);
    ck_assert_int_eq(qi_event_wait_on(td, QI_STREAM_COPY, m, &e), QI_OK);
    ck_assert_int_eq(qi_dev_upload_on(td, QI_STREAM_COPY, qi_view_of(x, 0), b, N, &e), QI_OK);
    ck_assert_int_eq(qi_event_record_on(td, QI_STREAM_COPY, &cev, &e), QI_OK);
    ck_assert_int_eq(qi_event_wait(td, cev, &e), QI_OK);
    ck_assert_int_eq(qi_dev_download(td, out, qi_view_of(x, 0), N, &e), QI_OK);
    qi_testdev_hold(td, false);
    ck_assert_int_eq(qi_dev_synchronize(td, &e), QI_OK);
    ck_assert(memcmp(out, b, N) == 0);
    qi_event_free(m);
    qi_event_free(cev);
    /* ops beside a copy-stream copy that waits for an op (2 s at most):
     * they do not wait for it, so the copy is done at once (ops that
     * waited for the copy stream would take the 2 s) */
    float *y = NULL;
    qi_buf *yb = NULL;
    ck_assert_int_eq(qi_buf_alloc(td, 64 * sizeof(float), "y", &yb, &e), QI_OK);
    y = qi_buf_ptr(td, qi_view_of(yb, 0), 64 * sizeof(float), &e);
    ck_assert_int_eq(qi_dev_upload(td, qi_view_of(yb, 0), out, 64 * sizeof(float), &e), QI_OK);
    ck_assert_int_eq(qi_dev_synchronize(td, &e), QI_OK);
    qi_testdev_slow_copies(td, 1, 2000000);
    const double t0 = qi_dev_now();
    const long cs1 = qi_testdev_copies(td, QI_STREAM_COPY);
    ck_assert_int_eq(qi_dev_upload_on(td, QI_STREAM_COPY, qi_view_of(x, 0), a, N, &e), QI_OK);
    while (qi_testdev_copies(td, QI_STREAM_COPY) == cs1 && qi_dev_now() - t0 < 1.0)
        ck_assert_int_eq(qi_backend_scale(td, y, 64, 1.0f, &e), QI_OK);
    ck_assert_int_eq(qi_dev_synchronize(td, &e), QI_OK); /* both streams */
    ck_assert_msg(qi_dev_now() - t0 < 1.0, "the ops waited for the copy stream (%.2f s)", qi_dev_now() - t0);
    ck_assert_int_eq(qi_dev_download(td, out, qi_view_of(x, 0), N, &e), QI_OK);
    ck_assert_int_eq(qi_dev_synchronize(td, &e), QI_OK);
    ck_assert(memcmp(out, a, N) == 0);
    qi_testdev_slow_copies(td, 0, 0);
    qi_buf_free(yb);
    qi_buf_free(x);
    qi_buf_free(c);
    free(a);
    free(b);
    free(out);
    qi_backend_free(cpu);
    qi_backend_free(td);
}
END_TEST

/* A strided copy within a device (qi_dev_copy_2d), on both devices: the
 * rows where they belong and nothing else written; pitches under the width,
 * an extent past either buffer and another device's buffer refused. */
START_TEST(test_copy_2d) {
    enum { H = 6, SP = 10, DP = 4, W = 3, SOFF = 1, DOFF = 5, LEN = 64 };
    unsigned char init[LEN], want[LEN], got[LEN];
    for (int i = 0; i < LEN; i++) init[i] = (unsigned char)(3 * i + 1);
    qi_backend *other = make(1, 0);
    qi_buf *ob = NULL;
    qi_err e = {0};
    ck_assert_int_eq(qi_buf_alloc(other, LEN, "o", &ob, &e), QI_OK);
    for (int which = 0; which < 2; which++) {
        qi_backend *b = make(which, 0);
        qi_buf *s = NULL, *d = NULL;
        ck_assert_int_eq(qi_buf_alloc(b, LEN, "s", &s, &e), QI_OK);
        ck_assert_int_eq(qi_buf_alloc(b, LEN, "d", &d, &e), QI_OK);
        memset(want, 0x5A, LEN);
        ck_assert_int_eq(qi_dev_upload(b, qi_view_of(s, 0), init, LEN, &e), QI_OK);
        ck_assert_int_eq(qi_dev_upload(b, qi_view_of(d, 0), want, LEN, &e), QI_OK);
        for (int r = 0; r < H; r++) memcpy(want + DOFF + r * DP, init + SOFF + r * SP, W);
        ck_assert_int_eq(qi_dev_copy_2d(b, qi_view_of(d, DOFF), DP, qi_view_of(s, SOFF), SP, W, H, &e), QI_OK);
        ck_assert_int_eq(qi_dev_download(b, got, qi_view_of(d, 0), LEN, &e), QI_OK);
        ck_assert_int_eq(qi_dev_synchronize(b, &e), QI_OK);
        ck_assert_msg(memcmp(got, want, LEN) == 0, "%s: strided copy", which ? "testdev" : "cpu");
        ck_assert_int_eq(qi_dev_copy_2d(b, qi_view_of(d, 0), W - 1, qi_view_of(s, 0), SP, W, H, &e), QI_ERR_INVALID);
        ck_assert_msg(strstr(e.msg, "pitches"), "%s", e.msg);
        qi_err_clear(&e);
        /* the source's rows run past it: 1 + 5 x 10 + 3 = 54 fits, from 12 not */
        ck_assert_int_eq(qi_dev_copy_2d(b, qi_view_of(d, 0), DP, qi_view_of(s, 12), SP, W, H, &e), QI_ERR_INVALID);
        qi_err_clear(&e);
        ck_assert_int_eq(qi_dev_copy_2d(b, qi_view_of(d, 0), DP, qi_view_of(ob, 0), SP, W, H, &e), QI_ERR_INVALID);
        ck_assert_msg(strstr(e.msg, "a copy is missing"), "%s", e.msg);
        qi_err_clear(&e);
        qi_buf_free(s);
        qi_buf_free(d);
        qi_backend_free(b);
    }
    qi_buf_free(ob);
    qi_backend_free(other);
}
END_TEST

/* testdev's ops are the CPU's arithmetic: a matmul and an attention on its
 * own buffers give the CPU's bits. */
START_TEST(test_ops_equal_cpu) {
    qi_backend *cpu = make(0, 0), *td = make(1, 0);
    qi_err e = {0};
    enum { COLS = 256, ROWS = 40, TOK = 3 };
    uint64_t r = 9;
    /* a q8_0 weight, uploaded to each device */
    const uint64_t rb = (COLS / 32) * 34;
    char *wraw = malloc(rb * ROWS);
    float *row = malloc(sizeof(float) * COLS);
    for (int i = 0; i < ROWS; i++) {
        for (int j = 0; j < COLS; j++) row[j] = qi_test_randf(&r);
        qi_quantize_row_ref(QI_TYPE_Q8_0, row, wraw + (size_t)i * rb, COLS);
    }
    float x[TOK * COLS], ycpu[TOK * ROWS];
    for (int i = 0; i < TOK * COLS; i++) x[i] = qi_test_randf(&r);
    qi_backend *dev[2] = {cpu, td};
    float got[2][TOK * ROWS];
    for (int d = 0; d < 2; d++) {
        qi_backend *b = dev[d];
        ck_assert_int_eq(b->iface->reserve(b, 4096, TOK, 16, 1, 64, &e), QI_OK);
        qi_buf *wb = NULL, *xb = NULL, *yb = NULL;
        ck_assert_int_eq(qi_buf_alloc(b, rb * ROWS, "w", &wb, &e), QI_OK);
        ck_assert_int_eq(qi_buf_alloc(b, sizeof x, "x", &xb, &e), QI_OK);
        ck_assert_int_eq(qi_buf_alloc(b, sizeof ycpu, "y", &yb, &e), QI_OK);
        ck_assert_int_eq(qi_dev_upload(b, qi_view_of(wb, 0), wraw, rb * ROWS, &e), QI_OK);
        ck_assert_int_eq(qi_dev_upload(b, qi_view_of(xb, 0), x, sizeof x, &e), QI_OK);
        const qi_weight w = {.type = QI_TYPE_Q8_0, .n_cols = COLS, .n_rows = ROWS, .row_bytes = rb,
                             .data = qi_buf_ptr(b, qi_view_of(wb, 0), rb * ROWS, &e)};
        /* the op runs after the stream's uploads (testdev drains first) */
        b->iface->matmul(b, &w, qi_buf_ptr(b, qi_view_of(xb, 0), sizeof x, &e), TOK,
                         qi_buf_ptr(b, qi_view_of(yb, 0), sizeof ycpu, &e));
        ck_assert_int_eq(qi_dev_download(b, got[d], qi_view_of(yb, 0), sizeof ycpu, &e), QI_OK);
        ck_assert_int_eq(qi_dev_synchronize(b, &e), QI_OK);
        qi_buf_free(wb);
        qi_buf_free(xb);
        qi_buf_free(yb);
    }
    ck_assert(memcmp(got[0], got[1], sizeof got[0]) == 0);
    free(wraw);
    free(row);
    qi_backend_free(cpu);
    qi_backend_free(td);
}
END_TEST

/* The qi_backend_* wrappers: bad arguments are errors naming the device
 * and the op (nothing runs), zero rows do nothing, a good call runs the
 * op, and an injected failure stops the n-th op. */
START_TEST(test_op_checks) {
    qi_backend *b = make(1, 0);
    qi_err e = {0};
    ck_assert_int_eq(b->iface->reserve(b, 4096, 4, 16, 1, 64, &e), QI_OK);
    float x[8] = {1, 2, 3, 4, 5, 6, 7, 8}, y[8] = {0}, w[4] = {1, 1, 1, 1};
    ck_assert_int_eq(qi_backend_rmsnorm(b, NULL, w, 2, 4, 1e-6f, y, &e), QI_ERR_INVALID);
    ck_assert_msg(strstr(e.msg, "testdev: rmsnorm:"), "%s", e.msg);
    qi_err_clear(&e);
    ck_assert_int_eq(qi_backend_rmsnorm(b, x, w, -1, 4, 1e-6f, y, &e), QI_ERR_INVALID);
    qi_err_clear(&e);
    ck_assert_int_eq(qi_backend_rmsnorm(b, x, w, 0, 4, 1e-6f, y, &e), QI_OK); /* nothing to do */
    ck_assert(y[0] == 0.0f);
    ck_assert_int_eq(qi_backend_rmsnorm(b, x, w, 2, 4, 1e-6f, y, &e), QI_OK);
    ck_assert(y[0] != 0.0f && y[7] != 0.0f);
    const int32_t bad_rows[2] = {1, 0}, ids[1] = {5};
    ck_assert_int_eq(qi_backend_gather_rows(b, x, bad_rows, 2, 4, &e), QI_ERR_INVALID);
    ck_assert_msg(strstr(e.msg, "gather rows"), "%s", e.msg);
    qi_err_clear(&e);
    const qi_weight emb = {.type = QI_TYPE_F32, .n_cols = 4, .n_rows = 2, .row_bytes = 16, .data = x};
    ck_assert_int_eq(qi_backend_get_rows(b, &emb, ids, 1, y, &e), QI_ERR_INVALID);
    ck_assert_msg(strstr(e.msg, "id 5 of 2 rows"), "%s", e.msg);
    qi_err_clear(&e);
    ck_assert_int_eq(qi_backend_softcap(b, x, 8, 0.0f, &e), QI_ERR_INVALID);
    qi_err_clear(&e);
    const int n_slots[1] = {-1};
    const int32_t qpos[1] = {0};
    const qi_attn_paged_args bad = {.T = 1, .H = 3, .Hkv = 2, .D = 4, .q = x, .out = y, .q_pos = qpos,
                                    .n_slots = n_slots};
    ck_assert_int_eq(qi_backend_attention(b, &bad, 1, &e), QI_ERR_INVALID);
    ck_assert_msg(strstr(e.msg, "3 heads over 2 KV heads"), "%s", e.msg);
    qi_err_clear(&e);
    /* extra rows (a fetch's): without their tables, in a partial result, or a negative count */
    const int one[1] = {1}, minus[1] = {-1};
    const int32_t p0[1] = {0};
    const int32_t *pp[1] = {p0};
    const uint16_t row[4] = {0}, *rows[1] = {row}, *const *rt[1] = {rows};
    float pm[1], pl[1];
    qi_attn_paged_args xa = {.T = 1, .H = 1, .Hkv = 1, .D = 4, .q = x, .out = y, .q_pos = qpos, .n_slots = one,
                             .pos = pp, .k_blk = rt, .v_blk = rt, .x_n = one};
    ck_assert_int_eq(qi_backend_attention(b, &xa, 1, &e), QI_ERR_INVALID);
    ck_assert_msg(strstr(e.msg, "extra rows without their tables"), "%s", e.msg);
    qi_err_clear(&e);
    xa.x_pos = pp;
    xa.x_k = xa.x_v = rt;
    xa.part_m = pm;
    xa.part_l = pl;
    ck_assert_int_eq(qi_backend_attention(b, &xa, 1, &e), QI_ERR_INVALID);
    ck_assert_msg(strstr(e.msg, "extra rows in a partial result"), "%s", e.msg);
    qi_err_clear(&e);
    xa.part_m = xa.part_l = NULL;
    xa.x_n = minus;
    ck_assert_int_eq(qi_backend_attention(b, &xa, 1, &e), QI_ERR_INVALID);
    ck_assert_msg(strstr(e.msg, "-1 extra rows"), "%s", e.msg);
    qi_err_clear(&e);
    xa.x_n = one; /* well formed: one slot and one extra row, all zeros */
    ck_assert_int_eq(qi_backend_attention(b, &xa, 1, &e), QI_OK);
    ck_assert_int_eq(qi_dev_synchronize(b, &e), QI_OK);
    /* the second op from now fails, the first and third run */
    qi_dev_inject_op_fail(b, 2);
    ck_assert_int_eq(qi_backend_scale(b, x, 8, 1.0f, &e), QI_OK);
    ck_assert_int_eq(qi_backend_add(b, x, y, 8, &e), QI_ERR_BACKEND);
    ck_assert_msg(strstr(e.msg, "testdev: add: injected failure"), "%s", e.msg);
    qi_err_clear(&e);
    ck_assert_int_eq(qi_backend_add(b, x, y, 8, &e), QI_OK);
    qi_backend_free(b);
}
END_TEST

static Suite *device_suite(void) {
    Suite *s = suite_create("device");
    TCase *tc = tcase_create("device");
    tcase_add_test(tc, test_capacity);
    tcase_add_test(tc, test_views);
    tcase_add_test(tc, test_stream_order);
    tcase_add_test(tc, test_round_trip_and_events);
    tcase_add_test(tc, test_sticky_failure);
    tcase_add_test(tc, test_upload_2d);
    tcase_add_test(tc, test_copy_stream);
    tcase_add_test(tc, test_copy_2d);
    tcase_add_test(tc, test_ops_equal_cpu);
    tcase_add_test(tc, test_op_checks);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return qi_test_run_suite(device_suite()); }

/* cupti.c - kernels and copies as the GPU records them (cupti.h), through
 * CUPTI's Activity API: CUPTI asks for buffers (buf_requested), fills them
 * with records, and hands each back when full or flushed (buf_completed),
 * where the records are summed. Built only when CMake finds CUPTI. */
#include <cupti.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cupti.h"

/* CUPTI's buffers: records are 8-byte aligned within them. */
#define BUF_SIZE ((size_t)4 << 20)
#define BUF_ALIGN 8

static struct {
    pthread_mutex_t mu;  /* the totals and the failure: buffers complete on CUPTI's thread */
    bool registered;     /* the buffer callbacks given to CUPTI (once per process) */
    bool running;        /* between start and stop */
    qi_cupti_totals tot;
    uint64_t first, last; /* GPU timestamps (ns): the earliest start, the latest end */
    /* the first failure inside a callback, reported by stop */
    CUptiResult cb_res;
    const char *cb_call;
    bool cb_nomem;
} S = {.mu = PTHREAD_MUTEX_INITIALIZER};

const char *qi_cupti_dir_name(qi_cupti_dir d) {
    static const char *const names[QI_CUPTI_DIRS] = {"H2D", "D2H", "D2D", "other"};
    return d >= 0 && d < QI_CUPTI_DIRS ? names[d] : "?";
}

static const char *res_str(CUptiResult r) {
    const char *s = NULL;
    if (cuptiGetResultString(r, &s) != CUPTI_SUCCESS || !s) s = "unknown CUPTI error";
    return s;
}

/* A failed CUPTI call as the error: "CUPTI: CALL failed: TEXT (CODE)". */
static qi_status fail(qi_err *err, const char *call, CUptiResult r) {
    return QI_ERR(err, QI_ERR_BACKEND, "CUPTI: %s failed: %s (%d)", call, res_str(r), (int)r);
}

/* Inside a callback: the first failure is kept for stop (S.mu held). */
static void cb_fail(const char *call, CUptiResult r) {
    if (S.cb_res == CUPTI_SUCCESS && !S.cb_nomem) {
        S.cb_res = r;
        S.cb_call = call;
    }
}

static void CUPTIAPI buf_requested(uint8_t **buffer, size_t *size, size_t *max_records) {
    *max_records = 0; /* as many as fit */
    *buffer = aligned_alloc(BUF_ALIGN, BUF_SIZE);
    *size = *buffer ? BUF_SIZE : 0;
    if (!*buffer) {
        pthread_mutex_lock(&S.mu);
        if (S.cb_res == CUPTI_SUCCESS) S.cb_nomem = true;
        pthread_mutex_unlock(&S.mu);
    }
}

static void span(uint64_t start, uint64_t end) {
    if (S.first == 0 || start < S.first) S.first = start;
    if (end > S.last) S.last = end;
}

static qi_cupti_dir dir_of(uint8_t kind) {
    switch (kind) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD:
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOA: return QI_CUPTI_H2D;
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH:
    case CUPTI_ACTIVITY_MEMCPY_KIND_ATOH: return QI_CUPTI_D2H;
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD:
    case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP: return QI_CUPTI_D2D;
    default: return QI_CUPTI_OTHER;
    }
}

static void CUPTIAPI buf_completed(CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t size, size_t valid) {
    (void)size;
    pthread_mutex_lock(&S.mu);
    CUpti_Activity *rec = NULL;
    for (;;) {
        const CUptiResult r = cuptiActivityGetNextRecord(buffer, valid, &rec);
        if (r == CUPTI_ERROR_MAX_LIMIT_REACHED) break; /* the end of the buffer */
        if (r != CUPTI_SUCCESS) {
            cb_fail("cuptiActivityGetNextRecord", r);
            break;
        }
        if (rec->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || rec->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
            const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)rec;
            if (k->end > k->start) S.tot.kernel_s += (double)(k->end - k->start) * 1e-9;
            S.tot.kernels++;
            span(k->start, k->end);
        } else if (rec->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
            const CUpti_ActivityMemcpy6 *m = (const CUpti_ActivityMemcpy6 *)rec;
            const qi_cupti_dir d = dir_of(m->copyKind);
            if (m->end > m->start) S.tot.copy_s[d] += (double)(m->end - m->start) * 1e-9;
            S.tot.copies[d]++;
            S.tot.copy_bytes[d] += (double)m->bytes;
            span(m->start, m->end);
        }
    }
    size_t dropped = 0;
    const CUptiResult r = cuptiActivityGetNumDroppedRecords(ctx, stream, &dropped);
    if (r != CUPTI_SUCCESS)
        cb_fail("cuptiActivityGetNumDroppedRecords", r);
    else
        S.tot.dropped += (long)dropped;
    pthread_mutex_unlock(&S.mu);
    free(buffer);
}

static const CUpti_ActivityKind kinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY};
static const char *const enable_calls[] = {"cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL)",
                                           "cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY)"};
static const char *const disable_calls[] = {"cuptiActivityDisable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL)",
                                            "cuptiActivityDisable(CUPTI_ACTIVITY_KIND_MEMCPY)"};

qi_status qi_cupti_start(qi_err *err) {
    if (S.running) return QI_ERR(err, QI_ERR_INVALID, "CUPTI: already recording (one recording at a time)");
    pthread_mutex_lock(&S.mu);
    memset(&S.tot, 0, sizeof S.tot);
    S.first = S.last = 0;
    S.cb_res = CUPTI_SUCCESS;
    S.cb_call = NULL;
    S.cb_nomem = false;
    pthread_mutex_unlock(&S.mu);
    CUptiResult r;
    if (!S.registered) {
        if ((r = cuptiActivityRegisterCallbacks(buf_requested, buf_completed)) != CUPTI_SUCCESS)
            return fail(err, "cuptiActivityRegisterCallbacks", r);
        S.registered = true;
    }
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
        if ((r = cuptiActivityEnable(kinds[i])) != CUPTI_SUCCESS) {
            const qi_status st = fail(err, enable_calls[i], r);
            /* best effort: the enable's failure is the one reported */
            for (size_t j = 0; j < i; j++) cuptiActivityDisable(kinds[j]);
            return st;
        }
    S.running = true;
    return QI_OK;
}

qi_status qi_cupti_stop(qi_cupti_totals *out, qi_err *err) {
    memset(out, 0, sizeof *out);
    if (!S.running) return QI_ERR(err, QI_ERR_INVALID, "CUPTI: not recording (qi_cupti_stop without qi_cupti_start)");
    S.running = false;
    /* every record delivered, complete buffers or not, before the kinds go off */
    CUptiResult r = cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    qi_status st = r != CUPTI_SUCCESS ? fail(err, "cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED)", r) : QI_OK;
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
        if ((r = cuptiActivityDisable(kinds[i])) != CUPTI_SUCCESS && !st) st = fail(err, disable_calls[i], r);
    pthread_mutex_lock(&S.mu);
    if (!st && S.cb_nomem)
        st = QI_ERR(err, QI_ERR_NOMEM, "CUPTI: out of memory for an activity buffer of %zu bytes", BUF_SIZE);
    else if (!st && S.cb_res != CUPTI_SUCCESS)
        st = fail(err, S.cb_call, S.cb_res);
    if (!st) {
        *out = S.tot;
        out->span_s = S.last > S.first ? (double)(S.last - S.first) * 1e-9 : 0.0;
    }
    pthread_mutex_unlock(&S.mu);
    return st;
}

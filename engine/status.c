/* status.c - error records and the single allocation entry point.
 *
 * Errors: first error wins, so the stored message names the root cause even
 * when callers up the stack also fail. Allocation: one counter lets tests make
 * the N-th allocation fail and check that every path returns QI_ERR_NOMEM and
 * leaks nothing (under ASan).
 */
#include "qinfer/status.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

qi_status qi_err_set_(qi_err *e, qi_status code, const char *file, int line,
                      const char *fmt, ...) {
    if (!e || e->code != QI_OK) return code;
    e->code = code;
    e->file = file;
    e->line = line;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    return code;
}

void qi_err_prefix(qi_err *e, const char *fmt, ...) {
    if (!e || e->code == QI_OK) return;
    char pre[256], old[sizeof e->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(pre, sizeof pre, fmt, ap);
    va_end(ap);
    memcpy(old, e->msg, sizeof old);
    size_t n = strlen(pre);
    if (n + 2 >= sizeof e->msg) return;
    memcpy(e->msg, pre, n);
    memcpy(e->msg + n, ": ", 2);
    size_t room = sizeof e->msg - n - 3, olen = strlen(old);
    if (olen > room) olen = room; /* truncate the tail of the old message */
    memcpy(e->msg + n + 2, old, olen);
    e->msg[n + 2 + olen] = 0;
}

void qi_err_clear(qi_err *e) {
    if (e) memset(e, 0, sizeof *e);
}

const char *qi_status_str(qi_status s) {
    switch (s) {
    case QI_OK: return "ok";
    case QI_ERR_NOMEM: return "out of memory";
    case QI_ERR_INVALID: return "invalid argument";
    case QI_ERR_IO: return "I/O error";
    case QI_ERR_FORMAT: return "bad format";
    case QI_ERR_UNSUPPORTED: return "unsupported";
    case QI_ERR_BACKEND: return "backend error";
    case QI_ERR_LUA: return "Lua error";
    case QI_ERR_DB: return "database error";
    }
    return "unknown status";
}

static long g_fail_after; /* 0: never fail */

void qi_alloc_fail_after(long n) { g_fail_after = n; }

static int should_fail(void) {
    if (g_fail_after <= 0) return 0;
    return --g_fail_after == 0;
}

void *qi_malloc(size_t n) {
    if (should_fail()) return NULL;
    return malloc(n ? n : 1);
}

void *qi_malloc_aligned(size_t align, size_t n) {
    if (should_fail()) return NULL;
    const size_t r = (n ? n : 1) + align - 1;
    return r < n ? NULL : aligned_alloc(align, r / align * align);
}

void *qi_calloc(size_t n, size_t size) {
    if (should_fail()) return NULL;
    return calloc(n ? n : 1, size ? size : 1);
}

void *qi_realloc(void *p, size_t n) {
    if (should_fail()) return NULL;
    return realloc(p, n ? n : 1);
}

void qi_free(void *p) { free(p); }

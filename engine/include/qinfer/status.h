/* status.h - error codes and the error record every fallible function fills.
 *
 * Library code never exits or aborts on bad input: it returns a qi_status and,
 * when the caller passed a qi_err, writes a one-line message there. The first
 * error wins (later qi_err_set calls on an already-set record are ignored), so
 * the message names the root cause; callers may add context with
 * qi_err_prefix. Only main() turns a status into an exit code.
 */
#ifndef QINFER_STATUS_H
#define QINFER_STATUS_H

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#ifdef __cplusplus
extern "C" { /* the CUDA sources (C++) report errors through these too */
#endif

typedef enum {
    QI_OK = 0,
    QI_ERR_NOMEM,
    QI_ERR_INVALID,     /* bad argument or user input */
    QI_ERR_IO,          /* open/read/mmap failed */
    QI_ERR_FORMAT,      /* file content is malformed */
    QI_ERR_UNSUPPORTED, /* well-formed but not something we implement */
    QI_ERR_BACKEND,
    QI_ERR_LUA,
    QI_ERR_DB,
} qi_status;

typedef struct qi_err {
    qi_status code;
    const char *file; /* source location that raised it */
    int line;
    char msg[512];
} qi_err;

/* Record an error (printf-style message) unless `e` is NULL or already set.
 * Returns `code` so callers can write `return QI_ERR(e, QI_ERR_FORMAT, ...)`. */
qi_status qi_err_set_(qi_err *e, qi_status code, const char *file, int line,
                      const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 5, 6)))
#endif
    ;
#define QI_ERR(e, code, ...) qi_err_set_((e), (code), __FILE__, __LINE__, __VA_ARGS__)

/* Prepend "context: " to an already-set message (no-op if e is NULL/unset). */
void qi_err_prefix(qi_err *e, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

void qi_err_clear(qi_err *e);
const char *qi_status_str(qi_status s);

/* Programmer errors only (never for file contents or user input). */
#define QI_ASSERT(x)                                                              \
    do {                                                                          \
        if (!(x)) {                                                               \
            fprintf(stderr, "%s:%d: assertion failed: %s\n", __FILE__, __LINE__, #x); \
            abort();                                                              \
        }                                                                         \
    } while (0)

/* All heap allocation goes through these so tests can fail the Nth one. */
void *qi_malloc(size_t n);
/* n bytes at a multiple of align (a power of two), freed by qi_free */
void *qi_malloc_aligned(size_t align, size_t n);
void *qi_calloc(size_t n, size_t size);
void *qi_realloc(void *p, size_t n);
void qi_free(void *p);
/* Test hook: make the n-th allocation from now fail (0 disables). */
void qi_alloc_fail_after(long n);

#ifdef __cplusplus
}
#endif

#endif

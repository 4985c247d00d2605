/* cupti.h - the GPU's own record of its kernels and copies, through
 * CUPTI's Activity API, to check the engine's event timing against.
 *
 * Between qi_cupti_start and qi_cupti_stop CUPTI records every kernel
 * (CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) and every memcpy
 * (CUPTI_ACTIVITY_KIND_MEMCPY) on every GPU of the process, with start and
 * end timestamps taken on the GPU; stop flushes the records and returns
 * their totals. One recording at a time per process.
 *
 * Built from cupti.c when CMake finds CUDA and CUPTI (CUDA::cupti); else
 * cupti_none.c, whose start fails with QI_ERR_UNSUPPORTED.
 */
#ifndef QI_CUPTI_H
#define QI_CUPTI_H

#include "qinfer/status.h"

/* The direction of a memcpy. */
typedef enum {
    QI_CUPTI_H2D = 0, /* host to device */
    QI_CUPTI_D2H,     /* device to host */
    QI_CUPTI_D2D,     /* within a device, or between two (peer) */
    QI_CUPTI_OTHER,   /* host to host, arrays, unknown */
    QI_CUPTI_DIRS
} qi_cupti_dir;

typedef struct {
    long kernels;                   /* kernel records */
    double kernel_s;                /* the sum of their durations (end - start) */
    long copies[QI_CUPTI_DIRS];     /* memcpy records by direction */
    double copy_s[QI_CUPTI_DIRS];   /* the sum of their durations */
    double copy_bytes[QI_CUPTI_DIRS];
    double span_s;                  /* the first record's start to the last one's end (0: none) */
    long dropped;                   /* records CUPTI dropped for want of buffer space */
} qi_cupti_totals;

/* The directions' names in messages: "H2D", "D2H", "D2D", "other". */
const char *qi_cupti_dir_name(qi_cupti_dir d);

/* Start recording (every CUPTI call checked; the error names the call). */
qi_status qi_cupti_start(qi_err *err);
/* Stop: the records flushed and their totals in *out (zeros on failure).
 * A failure met while records were delivered is returned here. */
qi_status qi_cupti_stop(qi_cupti_totals *out, qi_err *err);

#endif

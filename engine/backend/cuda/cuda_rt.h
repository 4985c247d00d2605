/* cuda_rt.h - the CUDA runtime calls the CUDA device makes, as a table.
 *
 * backend_cuda.c (plain C) reaches the GPU only through a qi_cuda_rt: the
 * build's (rt_cuda.c: the CUDA runtime and cuBLAS, with the kernels of
 * kernels_cuda.h) or a test's, which gives "device" memory from the host
 * heap, runs the kernels' host equivalents and fails chosen calls. So the
 * device's own logic (buffer accounting, the staging of host-side tables,
 * event timing, error reporting) is tested on machines without a GPU.
 *
 * Every entry returns 0 or the runtime's error code (cudaError_t; a
 * cuBLAS status for blas_create), which error_string names. Streams,
 * events and the cuBLAS handle are opaque pointers.
 */
#ifndef QI_CUDA_RT_H
#define QI_CUDA_RT_H

#include <stdbool.h>
#include <stddef.h>

#include "kernels_cuda.h"

typedef struct qi_cuda_rt {
    const char *name; /* in messages: "CUDA runtime", or a test's */
    void *ctx;        /* passed to every entry */
    /* Select device `ordinal`; its name and its memory in bytes. */
    int (*init)(void *ctx, int ordinal, char *name, size_t name_len, size_t *total_mem);
    int (*dev_malloc)(void *ctx, void **p, size_t n);
    int (*dev_free)(void *ctx, void *p);
    int (*host_malloc)(void *ctx, void **p, size_t n); /* pinned host memory */
    int (*host_free)(void *ctx, void *p);
    int (*stream_create)(void *ctx, void **s);
    int (*stream_destroy)(void *ctx, void *s);
    /* n bytes between any two addresses (device, pinned or pageable host), queued on s */
    int (*memcpy_async)(void *ctx, void *dst, const void *src, size_t n, void *s);
    /* height rows of width bytes, pitches dpitch and spitch, queued on s as one copy */
    int (*memcpy_2d_async)(void *ctx, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                           size_t height, void *s);
    int (*event_create)(void *ctx, void **e); /* with timing */
    int (*event_destroy)(void *ctx, void *e);
    int (*event_record)(void *ctx, void *e, void *s);
    int (*event_sync)(void *ctx, void *e);
    int (*event_elapsed)(void *ctx, float *ms, void *from, void *to);
    int (*stream_sync)(void *ctx, void *s);
    int (*stream_wait)(void *ctx, void *s, void *e); /* s's later work after e (cudaStreamWaitEvent) */
    int (*blas_create)(void *ctx, void **h, void *s); /* a cuBLAS handle on stream s */
    int (*blas_destroy)(void *ctx, void *h);
    /* The text of an error code: of cuBLAS when blas, else of the runtime. */
    const char *(*error_string)(void *ctx, int code, bool blas);
    const qi_cuk *k; /* the kernels */
} qi_cuda_rt;

/* The build's runtime (rt_cuda.c); NULL in a build without CUDA. */
const qi_cuda_rt *qi_cuda_rt_default(void);

#endif

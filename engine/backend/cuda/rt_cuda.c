/* rt_cuda.c - the build's CUDA runtime table (cuda_rt.h): the CUDA runtime
 * API and cuBLAS, and the kernels of k_*.cu. Built only when CMake finds
 * nvcc (rt_none.c says there is none otherwise). */
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <stdio.h>

#include "cuda/cuda_rt.h"

static int rt_init(void *ctx, int ordinal, char *name, size_t name_len, size_t *total) {
    (void)ctx;
    cudaError_t e = cudaSetDevice(ordinal);
    if (e) return (int)e;
    struct cudaDeviceProp p;
    if ((e = cudaGetDeviceProperties(&p, ordinal))) return (int)e;
    snprintf(name, name_len, "%.80s (sm_%d%d)", p.name, p.major, p.minor);
    *total = p.totalGlobalMem;
    return 0;
}
static int rt_dev_malloc(void *ctx, void **p, size_t n) {
    (void)ctx;
    return (int)cudaMalloc(p, n);
}
static int rt_dev_free(void *ctx, void *p) {
    (void)ctx;
    return (int)cudaFree(p);
}
static int rt_host_malloc(void *ctx, void **p, size_t n) {
    (void)ctx;
    return (int)cudaMallocHost(p, n);
}
static int rt_host_free(void *ctx, void *p) {
    (void)ctx;
    return (int)cudaFreeHost(p);
}
static int rt_stream_create(void *ctx, void **s) {
    (void)ctx;
    return (int)cudaStreamCreateWithFlags((cudaStream_t *)s, cudaStreamNonBlocking);
}
static int rt_stream_destroy(void *ctx, void *s) {
    (void)ctx;
    return (int)cudaStreamDestroy((cudaStream_t)s);
}
static int rt_memcpy_async(void *ctx, void *dst, const void *src, size_t n, void *s) {
    (void)ctx;
    return (int)cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, (cudaStream_t)s);
}
static int rt_memcpy_2d_async(void *ctx, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                              size_t height, void *s) {
    (void)ctx;
    return (int)cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, height, cudaMemcpyDefault, (cudaStream_t)s);
}
static int rt_event_create(void *ctx, void **e) {
    (void)ctx;
    return (int)cudaEventCreate((cudaEvent_t *)e);
}
static int rt_event_destroy(void *ctx, void *e) {
    (void)ctx;
    return (int)cudaEventDestroy((cudaEvent_t)e);
}
static int rt_event_record(void *ctx, void *e, void *s) {
    (void)ctx;
    return (int)cudaEventRecord((cudaEvent_t)e, (cudaStream_t)s);
}
static int rt_event_sync(void *ctx, void *e) {
    (void)ctx;
    return (int)cudaEventSynchronize((cudaEvent_t)e);
}
static int rt_event_elapsed(void *ctx, float *ms, void *from, void *to) {
    (void)ctx;
    return (int)cudaEventElapsedTime(ms, (cudaEvent_t)from, (cudaEvent_t)to);
}
static int rt_stream_sync(void *ctx, void *s) {
    (void)ctx;
    return (int)cudaStreamSynchronize((cudaStream_t)s);
}
static int rt_stream_wait(void *ctx, void *s, void *e) {
    (void)ctx;
    return (int)cudaStreamWaitEvent((cudaStream_t)s, (cudaEvent_t)e, 0);
}
static int rt_blas_create(void *ctx, void **h, void *s) {
    (void)ctx;
    cublasStatus_t st = cublasCreate((cublasHandle_t *)h);
    if (st) return (int)st;
    if ((st = cublasSetStream((cublasHandle_t)*h, (cudaStream_t)s))) {
        cublasDestroy((cublasHandle_t)*h);
        *h = NULL;
    }
    return (int)st;
}
static int rt_blas_destroy(void *ctx, void *h) {
    (void)ctx;
    return (int)cublasDestroy((cublasHandle_t)h);
}
static const char *rt_error_string(void *ctx, int code, bool blas) {
    (void)ctx;
    return blas ? cublasGetStatusString((cublasStatus_t)code) : cudaGetErrorString((cudaError_t)code);
}

const qi_cuda_rt *qi_cuda_rt_default(void) {
    static qi_cuda_rt rt = {
        .name = "CUDA runtime",
        .init = rt_init,
        .dev_malloc = rt_dev_malloc,
        .dev_free = rt_dev_free,
        .host_malloc = rt_host_malloc,
        .host_free = rt_host_free,
        .stream_create = rt_stream_create,
        .stream_destroy = rt_stream_destroy,
        .memcpy_async = rt_memcpy_async,
        .memcpy_2d_async = rt_memcpy_2d_async,
        .event_create = rt_event_create,
        .event_destroy = rt_event_destroy,
        .event_record = rt_event_record,
        .event_sync = rt_event_sync,
        .event_elapsed = rt_event_elapsed,
        .stream_sync = rt_stream_sync,
        .stream_wait = rt_stream_wait,
        .blas_create = rt_blas_create,
        .blas_destroy = rt_blas_destroy,
        .error_string = rt_error_string,
    };
    rt.k = qi_cuk_cuda();
    return &rt;
}

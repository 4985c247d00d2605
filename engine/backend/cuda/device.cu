/* device.cu - CUDA device discovery and copy-bandwidth probe through the
 * runtime API.
 *
 * Discovery compiles wherever nvcc exists (no GPU is needed to compile) and
 * at run time reports the device, its memory and the driver/runtime
 * versions, or why there is none (cudaGetDeviceCount's error string: no
 * driver, no device, ...).
 *
 * The probe measures what the placement cost model needs: host<->device
 * bandwidth over the link, from pinned (cudaMallocHost) and from pageable
 * (malloc) memory, and device-to-device bandwidth in HBM. Each figure is a
 * median of single large copies timed with CUDA events, the way NVIDIA's
 * bandwidthTest does it; a median rather than a mean or a maximum so one
 * slow or one lucky copy (clock ramp, a neighbour on the link) moves nothing.
 * Large buffers (256 MiB over the link, 1 GiB within HBM) keep the fixed
 * per-copy cost of a few microseconds out of the figure. Considered and not
 * done: a copy kernel (it measures the kernel, not cudaMemcpy, which is what
 * the engine will call) and several concurrent streams (duplex bandwidth is
 * a different number, for a later probe).
 *
 * Every CUDA call is checked; the first failure becomes a QI_ERR_BACKEND
 * naming the call, and one exit path frees whatever was allocated. */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device.h"

extern "C" void qi_cuda_query(qi_sysinfo *s) {
    s->cuda_built = true;
    cudaRuntimeGetVersion(&s->cuda_runtime);
    if (cudaDriverGetVersion(&s->cuda_driver) != cudaSuccess) s->cuda_driver = 0;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n <= 0) {
        s->n_gpus = 0;
        snprintf(s->gpu_note, sizeof s->gpu_note, "%s",
                 e != cudaSuccess ? cudaGetErrorString(e) : "no CUDA device");
        cudaGetLastError(); /* clear the sticky error for later callers */
        return;
    }
    s->n_gpus = n;
    cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, 0) == cudaSuccess) {
        snprintf(s->gpu_name, sizeof s->gpu_name, "%.200s (sm_%d%d)", p.name, p.major, p.minor);
        s->gpu_mem_bytes = (unsigned long long)p.totalGlobalMem;
    }
    /* attributes, not cudaDeviceProp fields: CUDA 13 dropped the clocks from the struct */
    int v = 0;
    if (cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, 0) == cudaSuccess) s->gpu_sms = v;
    if (cudaDeviceGetAttribute(&v, cudaDevAttrClockRate, 0) == cudaSuccess) s->gpu_clock_mhz = v / 1000;
    if (cudaDeviceGetAttribute(&v, cudaDevAttrMemoryClockRate, 0) == cudaSuccess) s->gpu_mem_clock_mhz = v / 1000;
    if (cudaDeviceGetAttribute(&v, cudaDevAttrGlobalMemoryBusWidth, 0) == cudaSuccess) s->gpu_bus_bits = v;
    cudaGetLastError();
}

/* ---- Bandwidth probe ------------------------------------------------------ */

#define PROBE_HD_BYTES ((size_t)256 << 20) /* each host<->device copy */
#define PROBE_DD_BYTES ((size_t)1 << 30)   /* each device-to-device copy */
#define PROBE_REPS_HD 11                   /* odd, so the median is one copy */
#define PROBE_REPS_DD 21
#define PROBE_REPS_MAX 21

/* Check a CUDA call; on failure record it (first error wins) and jump to the
 * function's single exit. `what` names the measurement for the message. */
#define CK(call)                                                                    \
    do {                                                                            \
        cudaError_t e_ = (call);                                                    \
        if (e_ != cudaSuccess) {                                                    \
            st = QI_ERR(err, QI_ERR_BACKEND, "CUDA probe, %s: %s failed: %s", what, \
                        #call, cudaGetErrorString(e_));                             \
            goto done;                                                              \
        }                                                                           \
    } while (0)

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* One warm-up copy, then n timed copies of `bytes` from src to dst on stream
 * s; *gbs = median of counted_bytes / time, in 1e9 bytes per second. */
static qi_status time_copies(const char *what, void *dst, const void *src, size_t bytes,
                             cudaMemcpyKind kind, int n, double counted_bytes,
                             cudaStream_t s, cudaEvent_t t0, cudaEvent_t t1, double *gbs,
                             qi_err *err) {
    qi_status st = QI_OK;
    double rate[PROBE_REPS_MAX];
    QI_ASSERT(n > 0 && n <= PROBE_REPS_MAX);
    CK(cudaMemcpyAsync(dst, src, bytes, kind, s));
    CK(cudaStreamSynchronize(s));
    for (int i = 0; i < n; i++) {
        float ms = 0.0f;
        CK(cudaEventRecord(t0, s));
        CK(cudaMemcpyAsync(dst, src, bytes, kind, s));
        CK(cudaEventRecord(t1, s));
        CK(cudaEventSynchronize(t1));
        CK(cudaEventElapsedTime(&ms, t0, t1));
        if (ms <= 0.0f) {
            st = QI_ERR(err, QI_ERR_BACKEND, "CUDA probe, %s: a copy timed at %g ms", what, ms);
            goto done;
        }
        rate[i] = counted_bytes / (ms * 1e-3) / 1e9;
    }
    qsort(rate, (size_t)n, sizeof rate[0], cmp_double);
    *gbs = rate[n / 2];
done:
    return st;
}

extern "C" qi_status qi_cuda_probe(qi_cuda_bw *out, qi_err *err) {
    const char *what = "setup";
    qi_status st = QI_OK;
    qi_cuda_bw r;
    int n = 0;
    cudaError_t e;
    void *d_a = NULL, *d_b = NULL, *h_pinned = NULL, *h_pageable = NULL;
    cudaStream_t s = NULL;
    cudaEvent_t t0 = NULL, t1 = NULL;
    const size_t hd = PROBE_HD_BYTES, dd = PROBE_DD_BYTES;

    memset(out, 0, sizeof *out);
    memset(&r, 0, sizeof r);
    e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n <= 0) {
        cudaGetLastError();
        return QI_ERR(err, QI_ERR_BACKEND, "no CUDA device (%s)",
                      e != cudaSuccess ? cudaGetErrorString(e) : "the driver lists none");
    }
    r.device = 0;
    r.hd_bytes = hd;
    r.dd_bytes = dd;
    r.n_reps_hd = PROBE_REPS_HD;
    r.n_reps_dd = PROBE_REPS_DD;

    CK(cudaSetDevice(r.device));
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CK(cudaEventCreate(&t0));
    CK(cudaEventCreate(&t1));
    CK(cudaMalloc(&d_a, dd));
    CK(cudaMalloc(&d_b, dd));
    CK(cudaMemset(d_a, 1, dd));
    CK(cudaMemset(d_b, 2, dd));
    CK(cudaMallocHost(&h_pinned, hd));
    h_pageable = qi_malloc(hd);
    if (!h_pageable) {
        st = QI_ERR(err, QI_ERR_NOMEM, "CUDA probe: out of host memory (%zu MiB pageable buffer)",
                    hd >> 20);
        goto done;
    }
    /* Touch every page first so page faults stay out of the pageable figures. */
    memset(h_pinned, 3, hd);
    memset(h_pageable, 4, hd);
    CK(cudaDeviceSynchronize());

    what = "host-to-device, pinned";
    st = time_copies(what, d_a, h_pinned, hd, cudaMemcpyHostToDevice, r.n_reps_hd, (double)hd, s,
                     t0, t1, &r.h2d_pinned_gbs, err);
    if (st) goto done;
    what = "device-to-host, pinned";
    st = time_copies(what, h_pinned, d_a, hd, cudaMemcpyDeviceToHost, r.n_reps_hd, (double)hd, s,
                     t0, t1, &r.d2h_pinned_gbs, err);
    if (st) goto done;
    what = "host-to-device, pageable";
    st = time_copies(what, d_a, h_pageable, hd, cudaMemcpyHostToDevice, r.n_reps_hd, (double)hd, s,
                     t0, t1, &r.h2d_pageable_gbs, err);
    if (st) goto done;
    what = "device-to-host, pageable";
    st = time_copies(what, h_pageable, d_a, hd, cudaMemcpyDeviceToHost, r.n_reps_hd, (double)hd, s,
                     t0, t1, &r.d2h_pageable_gbs, err);
    if (st) goto done;
    what = "device-to-device";
    st = time_copies(what, d_b, d_a, dd, cudaMemcpyDeviceToDevice, r.n_reps_dd, 2.0 * (double)dd,
                     s, t0, t1, &r.d2d_gbs, err);
    if (st) goto done;
    *out = r;

done:
    /* Free in reverse; a failing free after a failure keeps the first error. */
    what = "cleanup";
    if (s) cudaStreamSynchronize(s);
    qi_free(h_pageable);
    if (h_pinned && (e = cudaFreeHost(h_pinned)) != cudaSuccess && st == QI_OK)
        st = QI_ERR(err, QI_ERR_BACKEND, "CUDA probe, %s: cudaFreeHost failed: %s", what,
                    cudaGetErrorString(e));
    if (d_b && (e = cudaFree(d_b)) != cudaSuccess && st == QI_OK)
        st = QI_ERR(err, QI_ERR_BACKEND, "CUDA probe, %s: cudaFree failed: %s", what,
                    cudaGetErrorString(e));
    if (d_a && (e = cudaFree(d_a)) != cudaSuccess && st == QI_OK)
        st = QI_ERR(err, QI_ERR_BACKEND, "CUDA probe, %s: cudaFree failed: %s", what,
                    cudaGetErrorString(e));
    if (t1) cudaEventDestroy(t1);
    if (t0) cudaEventDestroy(t0);
    if (s) cudaStreamDestroy(s);
    cudaGetLastError(); /* leave no non-sticky error behind for later callers */
    if (st != QI_OK) memset(out, 0, sizeof *out);
    return st;
}

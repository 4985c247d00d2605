/* device.h - CUDA device discovery and copy-bandwidth probe (C linkage).
 * Built from device.cu when CMake finds nvcc; otherwise device_none.c
 * reports that the build has no CUDA. */
#ifndef QI_CUDA_DEVICE_H
#define QI_CUDA_DEVICE_H

#include <stdint.h>

#include "qinfer/status.h"
#include "qinfer/sysinfo.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Fill the cuda_* and gpu_* fields of s. Never fails: without a device or a
 * driver, n_gpus is 0 and gpu_note says why. */
void qi_cuda_query(qi_sysinfo *s);

/* Measured copy bandwidths of one CUDA device: the inputs a placement cost
 * model needs to weigh moving data over the host link (PCIe) against
 * reading it where it lies (HBM).
 *
 * Units: every *_gbs field is in GB/s with 1 GB = 1e9 bytes (not GiB).
 * Each figure is the median over n_reps_* copies of one buffer, each copy a
 * single cudaMemcpyAsync timed by CUDA events on its stream, after one
 * untimed warm-up copy.
 * Byte convention: host<->device figures count each byte once (hd_bytes /
 * time), the bytes that cross the link. The device-to-device figure counts
 * read + write (2 * dd_bytes / time), the traffic HBM serves; halve it for
 * bytes copied per second. */
typedef struct {
    int device;              /* CUDA ordinal measured (always 0 for now) */
    uint64_t hd_bytes;       /* size of each host<->device copy, bytes */
    uint64_t dd_bytes;       /* size of each device-to-device copy, bytes */
    int n_reps_hd;           /* timed copies per host<->device figure */
    int n_reps_dd;           /* timed copies for the device-to-device figure */
    double h2d_pinned_gbs;   /* host (cudaMallocHost) -> device, GB/s */
    double d2h_pinned_gbs;   /* device -> host (cudaMallocHost), GB/s */
    double h2d_pageable_gbs; /* host (ordinary malloc, pages touched) -> device, GB/s */
    double d2h_pageable_gbs; /* device -> host (ordinary malloc), GB/s */
    double d2d_gbs;          /* device -> device, read + write counted, GB/s */
} qi_cuda_bw;

/* Measure device 0's copy bandwidths into *out (2 GiB of device
 * memory, 512 MiB of host memory, a second or two). Returns QI_OK, or
 * QI_ERR_BACKEND when there is no device or a CUDA call fails (err names the
 * call and CUDA's reason), QI_ERR_NOMEM when host memory runs out, and
 * QI_ERR_UNSUPPORTED in a build without CUDA. Frees everything it allocated
 * on every path; *out is all zeros on failure. err may be NULL. */
qi_status qi_cuda_probe(qi_cuda_bw *out, qi_err *err);

#ifdef __cplusplus
}
#endif

#endif

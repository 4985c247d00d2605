/* device.h - CUDA device discovery (C linkage). Built from device.cu when
 * CMake finds nvcc; otherwise device_none.c reports that the build has no
 * CUDA. */
#ifndef QI_CUDA_DEVICE_H
#define QI_CUDA_DEVICE_H

#include "qinfer/sysinfo.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Fill the cuda_* and gpu_* fields of s. Never fails: without a device or a
 * driver, n_gpus is 0 and gpu_note says why. */
void qi_cuda_query(qi_sysinfo *s);

#ifdef __cplusplus
}
#endif

#endif

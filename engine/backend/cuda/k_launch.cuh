/* k_launch.cuh - what every kernel file of the CUDA device does after a
 * launch: the launch's error (cudaGetLastError) as the launcher's result,
 * naming the kernel; and the refusal of arguments a kernel cannot take. */
#ifndef QI_K_LAUNCH_CUH
#define QI_K_LAUNCH_CUH

#include <cuda_runtime.h>

static inline int launched(const char *name, const char **what) {
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess && what) *what = name;
    return (int)e;
}

static inline int refuse(const char *name, const char **what) {
    if (what) *what = name;
    return (int)cudaErrorInvalidValue;
}

#endif

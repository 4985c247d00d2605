/* device.cu - CUDA device discovery through the runtime API.
 *
 * The first CUDA source of the engine: it compiles wherever nvcc exists
 * (no GPU is needed to compile) and at run time reports the device, its
 * memory and the driver/runtime versions, or why there is none
 * (cudaGetDeviceCount's error string: no driver, no device, ...). */
#include <cuda_runtime.h>
#include <stdio.h>
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
        snprintf(s->gpu_name, sizeof s->gpu_name, "%s (sm_%d%d)", p.name, p.major, p.minor);
        s->gpu_mem_bytes = (unsigned long long)p.totalGlobalMem;
    }
}

/* sysinfo.h - what machine a figure was measured on: CPU model and cores,
 * memory, and the CUDA device when the build has CUDA and a device exists.
 * Every benchmark and experiment row carries this, so numbers are always
 * labelled with their hardware. */
#ifndef QINFER_SYSINFO_H
#define QINFER_SYSINFO_H

#include <stdbool.h>
#include <stdint.h>

typedef struct {
    char cpu_model[128];
    int n_cores;   /* physical */
    int n_threads; /* online logical CPUs */
    uint64_t mem_bytes;
    bool cuda_built;     /* compiled with CUDA support */
    int n_gpus;          /* CUDA devices visible (0 without a driver/device) */
    char gpu_name[256];  /* device 0, "" when none */
    uint64_t gpu_mem_bytes;
    int cuda_driver;     /* e.g. 13000, 0 when none */
    int cuda_runtime;
    char gpu_note[160];  /* why there is no GPU, when there is none */
} qi_sysinfo;

void qi_sysinfo_get(qi_sysinfo *out);

/* Host memory read bandwidth: a buffer of `bytes` (make it several times
 * the last-level cache to measure DRAM) first touched, then read `passes`
 * times by n_threads threads, eight independent sums each; the best pass
 * in GB/s, or -1 when memory or threads could not be had. */
double qi_sysinfo_mem_read_gbs(uint64_t bytes, int n_threads, int passes);

#endif

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
    int gpu_sms;            /* device 0's multiprocessors */
    int gpu_clock_mhz;      /* its peak SM clock */
    int gpu_mem_clock_mhz;  /* its peak memory clock */
    int gpu_bus_bits;       /* its memory bus width */
    char gpu_note[160];  /* why there is no GPU, when there is none */
} qi_sysinfo;

void qi_sysinfo_get(qi_sysinfo *out);

/* The last-level cache: the largest cache level cpu0 lists under
 * /sys/devices/system/cpu/cpu0/cache, in bytes; 0 if unknown. */
uint64_t qi_sysinfo_llc_bytes(void);

/* MemAvailable of /proc/meminfo in bytes: what a new buffer can take
 * without swapping; 0 if unknown. */
uint64_t qi_sysinfo_mem_available(void);

/* qi_sysinfo_get and, when probe_bytes > 0, qi_sysinfo_mem_read_gbs
 * (probe_bytes, n_threads, passes), both run in a forked child that is
 * waited for before this returns, so that neither the probe's buffer (in
 * this process's peak RSS) nor the CUDA runtime a CUDA build's device query
 * starts (its threads and memory) stays in the calling process. Call it
 * before the process starts threads of its own. Never fails: *bw_gbs is
 * -1 when the bandwidth was not measured or the probe failed, and without a
 * child (fork failed, the child died) *si is taken in this process. */
void qi_sysinfo_get_apart(uint64_t probe_bytes, int n_threads, int passes, qi_sysinfo *si, double *bw_gbs);

/* Host memory read bandwidth: a buffer of `bytes` (make it several times
 * the last-level cache to measure DRAM) first touched, then read `passes`
 * times by n_threads threads, eight independent sums each; the best pass
 * in GB/s, or -1 when memory or threads could not be had. */
double qi_sysinfo_mem_read_gbs(uint64_t bytes, int n_threads, int passes);

/* Host fp32 compute rate: n_threads threads each running independent
 * chains of 8-wide fused multiply-adds (AVX2 + FMA where the CPU has them,
 * *used_fma then true; else the same arithmetic in plain C), counted as
 * two FLOPs each; the best of `passes` in FLOP/s, or -1 when threads could
 * not be had. 1.6 G multiply-adds per thread and pass (about 0.04 s on
 * a 2.5 GHz core with two 8-wide FMA units). used_fma may be NULL. */
double qi_sysinfo_fp32_flops(int n_threads, int passes, bool *used_fma);

#endif

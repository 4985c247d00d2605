/* cmd_sysinfo.c - `qinfer sysinfo`: the hardware every figure is labelled
 * with (CPU, cores, memory, GPU and CUDA versions when present), and with
 * --probe the measured copy bandwidths of the GPU (engine/backend/cuda/device.h),
 * the link and HBM figures the placement cost model starts from. */
#include <stdbool.h>
#include <stdio.h>

#include "cli.h"
#include "cuda/device.h"
#include "qinfer/sysinfo.h"

static int print_probe(void) {
    qi_err err = {0};
    qi_cuda_bw bw;
    fflush(stdout); /* the machine lines stay first even if the probe fails */
    if (qi_cuda_probe(&bw, &err) != QI_OK) {
        qi_err_prefix(&err, "--probe");
        return qi_cli_fail("sysinfo", &err);
    }
    printf("h2d:     pinned %.1f GB/s, pageable %.1f GB/s\n", bw.h2d_pinned_gbs, bw.h2d_pageable_gbs);
    printf("d2h:     pinned %.1f GB/s, pageable %.1f GB/s\n", bw.d2h_pinned_gbs, bw.d2h_pageable_gbs);
    printf("d2d:     %.1f GB/s (read + write counted)\n", bw.d2d_gbs);
    printf("probe:   device %d; median of %d copies of %llu MiB (h2d, d2h), %d of %llu MiB (d2d);\n"
           "         GB/s = 1e9 bytes/s; h2d and d2h count each byte once\n",
           bw.device, bw.n_reps_hd, (unsigned long long)(bw.hd_bytes >> 20), bw.n_reps_dd,
           (unsigned long long)(bw.dd_bytes >> 20));
    return 0;
}

int qi_cmd_sysinfo(int argc, char **argv) {
    qi_args a;
    bool probe = false;
    qi_args_init(&a, "sysinfo", argc, argv);
    while (qi_args_next(&a)) {
        if (qi_args_is(&a, "-h", "--help")) {
            printf("usage: qinfer sysinfo [--probe]\n\n"
                   "Print the CPU, core count, memory and CUDA device this machine has,\n"
                   "as recorded with every benchmark and experiment row.\n\n"
                   "  --probe   also measure GPU 0's copy bandwidths: host-to-device and\n"
                   "            device-to-host from pinned and from pageable memory (256 MiB\n"
                   "            copies), and device-to-device (1 GiB copies, read + write\n"
                   "            counted); medians in GB/s (1e9 bytes/s). Fails (exit 1) when\n"
                   "            the build has no CUDA or there is no device.\n");
            return 0;
        }
        if (qi_args_is(&a, NULL, "--probe")) {
            probe = true;
            continue;
        }
        qi_args_unknown(&a);
    }
    if (a.failed) return QI_EXIT_USAGE;
    qi_sysinfo s;
    qi_sysinfo_get(&s);
    printf("cpu:     %s\n", s.cpu_model);
    printf("cores:   %d physical, %d logical\n", s.n_cores, s.n_threads);
    printf("memory:  %.1f GiB\n", s.mem_bytes / 1073741824.0);
    if (!s.cuda_built) {
        printf("gpu:     none (%s)\n", s.gpu_note);
    } else if (s.n_gpus == 0) {
        printf("gpu:     none (%s); CUDA runtime %d.%d\n", s.gpu_note, s.cuda_runtime / 1000, s.cuda_runtime % 1000 / 10);
    } else {
        printf("gpu:     %s, %.1f GiB, %d device(s)\n", s.gpu_name, s.gpu_mem_bytes / 1073741824.0, s.n_gpus);
        printf("cuda:    driver %d.%d, runtime %d.%d\n", s.cuda_driver / 1000, s.cuda_driver % 1000 / 10,
               s.cuda_runtime / 1000, s.cuda_runtime % 1000 / 10);
    }
    return probe ? print_probe() : 0;
}

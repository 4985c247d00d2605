/* cmd_sysinfo.c - `qinfer sysinfo`: the hardware every figure is labelled
 * with (CPU, cores, memory, GPU and CUDA versions when present). */
#include <stdio.h>

#include "cli.h"
#include "qinfer/sysinfo.h"

int qi_cmd_sysinfo(int argc, char **argv) {
    qi_args a;
    qi_args_init(&a, "sysinfo", argc, argv);
    while (qi_args_next(&a)) {
        if (qi_args_is(&a, "-h", "--help")) {
            printf("usage: qinfer sysinfo\n\nPrint the CPU, core count, memory and CUDA device this machine has,\n"
                   "as recorded with every benchmark and experiment row.\n");
            return 0;
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
    return 0;
}

/* sysinfo.c - CPU and memory from /proc, GPU through the CUDA runtime when
 * the build has it (engine/backend/cuda/device.cu). */
#include "qinfer/sysinfo.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cuda/device.h"
#include "threadpool.h"

static void cpu_model(char *out, size_t cap) {
    snprintf(out, cap, "unknown CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10) == 0) {
            char *v = strchr(line, ':');
            if (v) {
                v++;
                while (*v == ' ' || *v == '\t') v++;
                v[strcspn(v, "\n")] = 0;
                snprintf(out, cap, "%s", v);
            }
            break;
        }
    }
    fclose(f);
}

void qi_sysinfo_get(qi_sysinfo *s) {
    memset(s, 0, sizeof *s);
    cpu_model(s->cpu_model, sizeof s->cpu_model);
    s->n_cores = qi_n_physical_cores();
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    s->n_threads = n > 0 ? (int)n : 1;
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    if (pages > 0 && psz > 0) s->mem_bytes = (uint64_t)pages * (uint64_t)psz;
    qi_cuda_query(s);
}

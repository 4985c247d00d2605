/* sysinfo.c - CPU and memory from /proc, GPU through the CUDA runtime when
 * the build has it (engine/backend/cuda/device.cu). */
#include "qinfer/sysinfo.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
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

/* ---- host memory read bandwidth ------------------------------------------------ */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}


typedef struct {
    uint64_t *p;
    size_t n; /* words */
    uint64_t sum;
    bool write;
} probe_slice;

static void *probe_worker(void *arg) {
    probe_slice *s = arg;
    if (s->write) {
        for (size_t i = 0; i < s->n; i++) s->p[i] = i * 0x9e3779b97f4a7c15ull;
        return NULL;
    }
    /* Eight independent sums so the loop is load-bound, not add-bound. */
    const uint64_t *p = s->p;
    uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0, a4 = 0, a5 = 0, a6 = 0, a7 = 0;
    size_t n8 = s->n & ~(size_t)7;
    for (size_t i = 0; i < n8; i += 8) {
        a0 += p[i];
        a1 += p[i + 1];
        a2 += p[i + 2];
        a3 += p[i + 3];
        a4 += p[i + 4];
        a5 += p[i + 5];
        a6 += p[i + 6];
        a7 += p[i + 7];
    }
    for (size_t i = n8; i < s->n; i++) a0 += p[i];
    s->sum = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7;
    return NULL;
}

/* One pass over the buffer on n_threads threads; seconds, or -1. */
static double probe_pass(uint64_t *buf, size_t n_words, int n_threads, bool write, uint64_t *sink) {
    pthread_t tid[1024];
    probe_slice sl[1024];
    double t0 = now_s();
    int started = 0;
    for (int i = 0; i < n_threads; i++) {
        long lo, hi;
        qi_split((long)n_words, i, n_threads, &lo, &hi);
        sl[i] = (probe_slice){.p = buf + lo, .n = (size_t)(hi - lo), .write = write};
        if (pthread_create(&tid[i], NULL, probe_worker, &sl[i]) != 0) break;
        started++;
    }
    for (int i = 0; i < started; i++) {
        pthread_join(tid[i], NULL);
        *sink += sl[i].sum;
    }
    return started == n_threads ? now_s() - t0 : -1;
}

double qi_sysinfo_mem_read_gbs(uint64_t bytes, int n_threads, int passes) {
    if (n_threads < 1 || n_threads > 1024 || passes < 1 || bytes < sizeof(uint64_t)) return -1;
    size_t n_words = (size_t)(bytes / sizeof(uint64_t));
    uint64_t *buf = mmap(NULL, n_words * sizeof(uint64_t), PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (buf == MAP_FAILED) return -1;
    uint64_t sink = 0;
    double best = -1;
    /* First touch by the same threads that read, then timed read passes. */
    if (probe_pass(buf, n_words, n_threads, true, &sink) >= 0) {
        for (int k = 0; k < passes; k++) {
            double t = probe_pass(buf, n_words, n_threads, false, &sink);
            if (t <= 0) {
                best = -1;
                break;
            }
            double gbs = (double)(n_words * sizeof(uint64_t)) / t / 1e9;
            if (gbs > best) best = gbs;
        }
    }
    munmap(buf, n_words * sizeof(uint64_t));
    volatile uint64_t keep = sink; /* the sums must be computed */
    (void)keep;
    return best;
}


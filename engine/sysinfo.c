/* sysinfo.c - what machine a figure was measured on, and the host's own
 * rates: CPU, memory and caches from /proc and /sys, the GPU through the
 * CUDA runtime when the build has it (engine/backend/cuda/device.cu); the
 * memory read-bandwidth probe (bench's roofline, sysinfo --profile-out) and
 * the fp32 FMA-rate probe (sysinfo --profile-out).
 *
 * The bandwidth probe is measured, not looked up: a STREAM-like read of a
 * buffer several times the last-level cache, best of several passes, with
 * integer sums, because the build forbids reassociating float sums and an
 * unvectorised float loop would measure the adder, not memory.
 * qi_sysinfo_get_apart runs it and the device query in a forked child, so a
 * benchmark's own process keeps neither the buffer (its peak RSS) nor the
 * CUDA runtime's threads and memory, which would blur a comparison with a
 * CPU-only program; the child's answer comes back over a pipe. */
#include "qinfer/sysinfo.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
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

uint64_t qi_sysinfo_llc_bytes(void) {
    uint64_t best = 0;
    int best_level = 0;
    for (int i = 0; i < 16; i++) {
        char p[128], buf[64];
        int level = 0;
        snprintf(p, sizeof p, "/sys/devices/system/cpu/cpu0/cache/index%d/level", i);
        FILE *f = fopen(p, "r");
        if (!f) break;
        if (fscanf(f, "%d", &level) != 1) level = 0;
        fclose(f);
        snprintf(p, sizeof p, "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
        if (!(f = fopen(p, "r"))) continue;
        if (fgets(buf, sizeof buf, f) && level >= best_level) {
            char *end;
            unsigned long long v = strtoull(buf, &end, 10);
            if (*end == 'K') v <<= 10;
            else if (*end == 'M') v <<= 20;
            else if (*end == 'G') v <<= 30;
            if (v) {
                best_level = level;
                best = v;
            }
        }
        fclose(f);
    }
    return best;
}

uint64_t qi_sysinfo_mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    uint64_t kib = 0;
    if (!f) return 0;
    char line[256];
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %" SCNu64 " kB", &kib) == 1) break;
    fclose(f);
    return kib * 1024;
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

/* ---- the probe apart, in a child ------------------------------------------------ */

/* What the child reports over the pipe. */
typedef struct {
    qi_sysinfo si;
    double bw_gbs; /* -1: not measured or failed */
} apart_report;

void qi_sysinfo_get_apart(uint64_t probe_bytes, int n_threads, int passes, qi_sysinfo *si, double *bw_gbs) {
    apart_report out;
    memset(&out, 0, sizeof out);
    out.bw_gbs = -1;
    int fd[2];
    pid_t pid = -1;
    if (pipe(fd) == 0) {
        fflush(NULL);
        if ((pid = fork()) < 0) {
            close(fd[0]);
            close(fd[1]);
        }
    }
    if (pid == 0) {
        apart_report r;
        close(fd[0]);
        qi_sysinfo_get(&r.si);
        r.bw_gbs = probe_bytes ? qi_sysinfo_mem_read_gbs(probe_bytes, n_threads, passes) : -1;
        ssize_t w = write(fd[1], &r, sizeof r);
        _exit(w == (ssize_t)sizeof r ? 0 : 1);
    }
    if (pid < 0) {
        qi_sysinfo_get(si);
        *bw_gbs = -1;
        return;
    }
    close(fd[1]);
    size_t got = 0;
    while (got < sizeof out) {
        ssize_t r = read(fd[0], (char *)&out + got, sizeof out - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += (size_t)r;
    }
    close(fd[0]);
    int status;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
    if (got != sizeof out) {
        memset(&out, 0, sizeof out);
        out.bw_gbs = -1;
        qi_sysinfo_get(&out.si); /* the child died: label from here */
    }
    *si = out.si;
    *bw_gbs = out.bw_gbs;
}

/* ---- host fp32 compute rate ------------------------------------------------------ */

/* Ten independent chains of fused multiply-adds on 8-wide vectors: enough
 * chains to cover the FMA latency on two ports, so the loop runs at the
 * core's FMA throughput (its fp32 peak, the figure a profile stores). A
 * CPU without AVX2 and FMA runs the same chains in plain C, whose rate is
 * what that machine's compiled kernels would see, not a peak. */
#define FLOP_CHAINS 10
#define FLOP_ITERS 20000000L

typedef struct {
    double seconds;
    float sum;
    bool fma;
} flop_slice;

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#include <immintrin.h>
__attribute__((target("avx2,fma"))) static float flop_chains_fma(long iters) {
    __m256 acc[FLOP_CHAINS];
    for (int j = 0; j < FLOP_CHAINS; j++) acc[j] = _mm256_set1_ps(1.0f + 0.01f * (float)j);
    const __m256 m = _mm256_set1_ps(0.9999999f), c = _mm256_set1_ps(1e-7f);
    for (long it = 0; it < iters; it++)
        for (int j = 0; j < FLOP_CHAINS; j++) acc[j] = _mm256_fmadd_ps(acc[j], m, c);
    float out[8], s = 0;
    for (int j = 0; j < FLOP_CHAINS; j++) {
        _mm256_storeu_ps(out, acc[j]);
        for (int k = 0; k < 8; k++) s += out[k];
    }
    return s;
}
static bool have_fma(void) { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }
#else
static float flop_chains_fma(long iters) { return 0; }
static bool have_fma(void) { return false; }
#endif

static float flop_chains_c(long iters) {
    float acc[FLOP_CHAINS][8];
    for (int j = 0; j < FLOP_CHAINS; j++)
        for (int k = 0; k < 8; k++) acc[j][k] = 1.0f + 0.01f * (float)j;
    for (long it = 0; it < iters; it++)
        for (int j = 0; j < FLOP_CHAINS; j++)
            for (int k = 0; k < 8; k++) acc[j][k] = acc[j][k] * 0.9999999f + 1e-7f;
    float s = 0;
    for (int j = 0; j < FLOP_CHAINS; j++)
        for (int k = 0; k < 8; k++) s += acc[j][k];
    return s;
}

static void *flop_worker(void *arg) {
    flop_slice *s = arg;
    double t0 = now_s();
    s->sum = s->fma ? flop_chains_fma(FLOP_ITERS) : flop_chains_c(FLOP_ITERS);
    s->seconds = now_s() - t0;
    return NULL;
}

double qi_sysinfo_fp32_flops(int n_threads, int passes, bool *used_fma) {
    bool fma = have_fma();
    if (used_fma) *used_fma = fma;
    if (n_threads < 1 || n_threads > 1024 || passes < 1) return -1;
    pthread_t tid[1024];
    flop_slice sl[1024];
    double best = -1;
    volatile float keep = 0; /* the chains must be computed */
    for (int k = 0; k < passes; k++) {
        double t0 = now_s();
        int started = 0;
        for (int i = 0; i < n_threads; i++) {
            sl[i] = (flop_slice){.fma = fma};
            if (pthread_create(&tid[i], NULL, flop_worker, &sl[i]) != 0) break;
            started++;
        }
        for (int i = 0; i < started; i++) {
            pthread_join(tid[i], NULL);
            keep += sl[i].sum;
        }
        double t = now_s() - t0;
        if (started != n_threads || t <= 0) return -1;
        double flops = (double)n_threads * FLOP_ITERS * FLOP_CHAINS * 8 * 2 / t;
        if (flops > best) best = flops;
    }
    (void)keep;
    return best;
}

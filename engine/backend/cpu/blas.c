/* blas.c - OpenBLAS through dlopen, for the opt-in attn_blas attention path.
 *
 * Why at run time rather than linked: the default engine needs no BLAS (its
 * attention reproduces llama.cpp's order bit for bit with its own kernels),
 * and a build that links OpenBLAS would not start where the library is
 * missing. So the two functions used are declared here, resolved with dlsym
 * on first use, and a missing library is an error of the option that wants
 * it, reported once with the loader's message; nothing falls back silently.
 *
 * OpenBLAS runs single-threaded: the calls come from the backend's own
 * thread-pool workers, each on its own (sequence, head) work, and a second
 * layer of threads would only compete with them for the cores.
 */
#include "blas.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* CBLAS, as OpenBLAS declares it for 32-bit integers (libopenblas.so.0;
 * the 64-bit-integer build is a different file with suffixed names). */
enum { CBLAS_ROW_MAJOR = 101, CBLAS_NO_TRANS = 111, CBLAS_TRANS = 112 };
typedef void (*sgemm_fn)(int order, int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A,
                         int lda, const float *B, int ldb, float beta, float *C, int ldc);
typedef void (*set_threads_fn)(int n);
typedef char *(*corename_fn)(void);

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static qi_status g_status;
static char g_msg[480];
static sgemm_fn g_sgemm;
static const char *g_core = "";

/* Debian's OpenBLAS (0.3.21, DYNAMIC_ARCH) picks its kernels from CPUID. On
 * the AVX-512 virtual machine the attention path was measured on, it took
 * the CPU for a Prescott and ran SSE3 kernels, with which sgemm was barely
 * faster than our own attention kernels; told SkylakeX, its AVX-512 kernels
 * ran prefill attention's two products 3-6x faster (bench/attn_blas.c). So
 * when the CPU has AVX-512F and the user has not chosen a core, choose it.
 * Set before dlopen: the library reads it while it loads. */
static void choose_core(void) {
    if (getenv("OPENBLAS_CORETYPE")) return;
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) setenv("OPENBLAS_CORETYPE", "SkylakeX", 0);
#endif
}

static void load(void) {
    const char *want = getenv("QI_OPENBLAS_LIB");
    const char *name = want && *want ? want : "libopenblas.so.0";
    choose_core();
    /* The pthreads build starts its own workers as it loads unless told
     * not to; they would only sleep, as every call here is single-threaded. */
    if (!getenv("OPENBLAS_NUM_THREADS")) setenv("OPENBLAS_NUM_THREADS", "1", 0);
    void *h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        snprintf(g_msg, sizeof g_msg, "%.280s", e ? e : "unknown error");
        if (!(want && *want)) h = dlopen("libopenblas.so", RTLD_NOW | RTLD_LOCAL);
    }
    if (!h) {
        char first[288];
        snprintf(first, sizeof first, "%.280s", g_msg);
        snprintf(g_msg, sizeof g_msg, "--attn-blas: cannot load OpenBLAS (%.120s): %s; install libopenblas0", name,
                 first);
        g_status = QI_ERR_UNSUPPORTED;
        return;
    }
    /* dlsym returns void *; converting it to a function pointer is what
     * POSIX requires to work, through a copy of the bits. */
    void *ps = dlsym(h, "cblas_sgemm"), *pt = dlsym(h, "openblas_set_num_threads");
    void *pc = dlsym(h, "openblas_get_corename");
    if (!ps || !pt) {
        snprintf(g_msg, sizeof g_msg, "--attn-blas: %.120s has no %s; it is not OpenBLAS (install libopenblas0)", name,
                 ps ? "openblas_set_num_threads" : "cblas_sgemm");
        g_status = QI_ERR_UNSUPPORTED;
        dlclose(h);
        return;
    }
    set_threads_fn set_threads;
    memcpy(&g_sgemm, &ps, sizeof g_sgemm);
    memcpy(&set_threads, &pt, sizeof set_threads);
    set_threads(1);
    if (pc) {
        corename_fn corename;
        memcpy(&corename, &pc, sizeof corename);
        const char *c = corename();
        if (c) g_core = c;
    }
    g_status = QI_OK;
}

qi_status qi_blas_load(qi_err *err) {
    pthread_once(&g_once, load);
    if (g_status) return QI_ERR(err, g_status, "%s", g_msg);
    return QI_OK;
}

void qi_blas_sgemm(bool trans_b, int M, int N, int K, float alpha, const float *A, int lda, const float *B, int ldb,
                   float *C, int ldc) {
    g_sgemm(CBLAS_ROW_MAJOR, CBLAS_NO_TRANS, trans_b ? CBLAS_TRANS : CBLAS_NO_TRANS, M, N, K, alpha, A, lda, B, ldb,
            0.0f, C, ldc);
}

const char *qi_blas_core(void) { return g_status == QI_OK && g_sgemm ? g_core : ""; }

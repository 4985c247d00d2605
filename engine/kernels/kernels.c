/* kernels.c - chooses the kernel table once per process.
 *
 * The widest variant the CPU supports wins (AMX, then AVX-512, then AVX2,
 * then the reference); all are bit-identical by construction, so the choice changes
 * speed, never results. QI_FORCE_REF=1 forces the reference, to rule the SIMD
 * code out when debugging; QI_KERNELS=ref|avx2|avx512|amx names a table (for
 * benchmarks; an unavailable one falls back to the default choice). The
 * choice is made on first use under pthread_once, so concurrent backends
 * agree on it.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

static const qi_kernels *g_active;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static int env_true(const char *name) {
    const char *v = getenv(name);
    return v && *v && strcmp(v, "0") != 0;
}

static void choose(void) {
    const qi_kernels *k = NULL;
    const char *want = getenv("QI_KERNELS");
    if (want && !strcmp(want, "ref")) k = qi_kernels_ref();
    if (want && !strcmp(want, "avx2")) k = qi_kernels_avx2();
    if (want && !strcmp(want, "avx512")) k = qi_kernels_avx512();
    if (want && !strcmp(want, "amx")) k = qi_kernels_amx();
    if (env_true("QI_FORCE_REF")) k = qi_kernels_ref();
    if (!k) {
        k = qi_kernels_amx();
        if (!k) k = qi_kernels_avx512();
        if (!k) k = qi_kernels_avx2();
    }
    g_active = k ? k : qi_kernels_ref();
}

const qi_kernels *qi_kernels_get(void) {
    pthread_once(&g_once, choose);
    return g_active;
}

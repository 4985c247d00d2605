/* attn_blas.c - prefill attention products: qinfer's F16 kernels against
 * OpenBLAS sgemm, measured side by side.
 *
 * The only F16/F32 matrix products in the supported models are attention's
 * (every weight matrix is quantised): scores S = Q K^T and outputs O = P V
 * for T queries over n positions of head size D. qinfer computes them with
 * its own kernels in llama.cpp's tinyBLAS lane order (so that logits equal
 * llama.cpp's bit for bit); OpenBLAS would take the same fp16 data converted
 * to float and sum in its own order. This program times both on one head,
 * one thread each, alternating, and prints the medians and the ratio, plus
 * the largest relative difference of the results (different summation
 * orders, so not zero). The fp16-to-float conversion OpenBLAS would need
 * (the KV cache is fp16) is not timed: the comparison favours OpenBLAS.
 *
 *   bench_attn_blas [-T N] [-n N] [-D LIST] [-r N]
 *
 * OpenBLAS picks its kernels from CPUID and can take a virtual machine's CPU
 * for an old one (the header line names the core it chose); then set
 * OPENBLAS_CORETYPE (e.g. SkylakeX) for a fair comparison.
 */
#include <cblas.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "kernels.h"
#include "qinfer/quant.h"

void openblas_set_num_threads(int n);
char *openblas_get_corename(void);

static uint64_t rng_state = 88172645463325252ull;
static float frand(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((double)(rng_state >> 11) / 9007199254740992.0) * 2.0f - 1.0f;
}

static double max_rel_diff(const float *a, const float *b, long n) {
    double m = 0.0, scale = 0.0;
    for (long i = 0; i < n; i++) scale = fmax(scale, fabs((double)a[i]));
    for (long i = 0; i < n; i++) m = fmax(m, fabs((double)a[i] - (double)b[i]));
    return scale > 0 ? m / scale : m;
}

static int usage(FILE *f, int rc) {
    fprintf(f, "usage: bench_attn_blas [-T N] [-n N] [-D LIST] [-r N]\n\n"
               "Time prefill attention's two products on one head, one thread: qinfer's F16\n"
               "kernels (llama.cpp's tinyBLAS order) against OpenBLAS sgemm on the same data\n"
               "as float, alternating, and print the medians.\n\n"
               "  -T N      queries (default 512)\n"
               "  -n N      positions (default 512)\n"
               "  -D LIST   head sizes, a comma list of multiples of 16 up to 1024 (default 64,256)\n"
               "  -r N      timed repetitions of each (default 9)\n"
               "  -h        this help\n");
    return rc;
}

static int bench_one(int T, int n, int D, int reps) {
    const qi_kernels *K = qi_kernels_get();
    const long qd = (long)T * D, kd = (long)n * D, sn = (long)T * n;
    uint16_t *q16 = malloc(sizeof *q16 * (size_t)qd), *k16 = malloc(sizeof *k16 * (size_t)kd);
    uint16_t *v16 = malloc(sizeof *v16 * (size_t)kd), *p16 = malloc(sizeof *p16 * (size_t)sn);
    float *q = malloc(sizeof *q * (size_t)qd), *k = malloc(sizeof *k * (size_t)kd), *v = malloc(sizeof *v * (size_t)kd);
    float *p = malloc(sizeof *p * (size_t)sn), *s_ours = malloc(sizeof(float) * (size_t)sn);
    float *s_blas = malloc(sizeof(float) * (size_t)sn), *o_ours = malloc(sizeof(float) * (size_t)qd);
    float *o_blas = malloc(sizeof(float) * (size_t)qd);
    double *t[4];
    for (int i = 0; i < 4; i++) t[i] = malloc(sizeof(double) * (size_t)reps);
    if (!q16 || !k16 || !v16 || !p16 || !q || !k || !v || !p || !s_ours || !s_blas || !o_ours || !o_blas || !t[0] ||
        !t[1] || !t[2] || !t[3]) {
        fprintf(stderr, "bench_attn_blas: out of memory\n");
        return 1;
    }
    /* the data as the engine holds it (fp16), and as float for OpenBLAS */
    for (long i = 0; i < qd; i++) q[i] = qi_fp16_to_f32(q16[i] = qi_f32_to_fp16(frand()));
    for (long i = 0; i < kd; i++) k[i] = qi_fp16_to_f32(k16[i] = qi_f32_to_fp16(frand()));
    for (long i = 0; i < kd; i++) v[i] = qi_fp16_to_f32(v16[i] = qi_f32_to_fp16(frand()));
    for (long i = 0; i < sn; i++) p[i] = qi_fp16_to_f32(p16[i] = qi_f32_to_fp16(fabsf(frand()) / (float)n));
    for (int r = -1; r < reps; r++) { /* r = -1: warm-up */
        double t0 = bench_now();
        for (int i = 0; i < T; i++) K->attn_scores(QI_K_ORD_GEMM, D, q16 + (long)i * D, k16, (size_t)D, n, s_ours + (long)i * n);
        double t1 = bench_now();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, n, D, 1.0f, q, D, k, D, 0.0f, s_blas, n);
        double t2 = bench_now();
        for (int i = 0; i < T; i++) K->attn_values(QI_K_ORD_GEMM, D, p16 + (long)i * n, v16, (size_t)D, n, o_ours + (long)i * D);
        double t3 = bench_now();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, D, n, 1.0f, p, n, v, D, 0.0f, o_blas, D);
        double t4 = bench_now();
        if (r >= 0) {
            t[0][r] = t1 - t0;
            t[1][r] = t2 - t1;
            t[2][r] = t3 - t2;
            t[3][r] = t4 - t3;
        }
    }
    const double flops = 2.0 * T * n * D;
    const char *names[2] = {"scores  S = Q K^T", "outputs O = P V  "};
    for (int op = 0; op < 2; op++) {
        const double ours = bench_median(t[2 * op], reps), blas = bench_median(t[2 * op + 1], reps);
        printf("| %4d | %4d | %4d | %s | %8.3f | %6.1f | %8.3f | %6.1f | %5.2f | %.1e |\n", T, n, D, names[op],
               ours * 1e3, flops / ours * 1e-9, blas * 1e3, flops / blas * 1e-9, blas / ours,
               op == 0 ? max_rel_diff(s_blas, s_ours, sn) : max_rel_diff(o_blas, o_ours, qd));
    }
    free(q16), free(k16), free(v16), free(p16), free(q), free(k), free(v), free(p);
    free(s_ours), free(s_blas), free(o_ours), free(o_blas);
    for (int i = 0; i < 4; i++) free(t[i]);
    return 0;
}

int main(int argc, char **argv) {
    int T = 512, n = 512, reps = 9, dims[16], nd = 0;
    const char *dl = "64,256";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) return usage(stdout, 0);
        if (i + 1 >= argc || (strcmp(a, "-T") && strcmp(a, "-n") && strcmp(a, "-D") && strcmp(a, "-r"))) {
            fprintf(stderr, "bench_attn_blas: bad argument '%s'\n", a);
            return usage(stderr, 2);
        }
        const char *val = argv[++i];
        if (!strcmp(a, "-D")) {
            dl = val;
            continue;
        }
        char *end;
        long x = strtol(val, &end, 10);
        if (*end || x < 1 || x > 65536) {
            fprintf(stderr, "bench_attn_blas: %s takes an integer in 1..65536, not '%s'\n", a, val);
            return 2;
        }
        if (!strcmp(a, "-T")) T = (int)x;
        else if (!strcmp(a, "-n")) n = (int)x;
        else reps = (int)x;
    }
    for (const char *c = dl; *c && nd < 16;) {
        char *end;
        long x = strtol(c, &end, 10);
        if (end == c || x < 16 || x > 1024 || x % 16 || (*end && *end != ',')) {
            fprintf(stderr, "bench_attn_blas: -D takes multiples of 16 in 16..1024, comma-separated, not '%s'\n", dl);
            return 2;
        }
        dims[nd++] = (int)x;
        c = *end ? end + 1 : end;
    }
    openblas_set_num_threads(1);
    printf("qinfer kernels: %s; OpenBLAS sgemm (core %s) on the same values as float; one thread each; "
           "median of %d alternating repetitions\n\n",
           qi_kernels_get()->name, openblas_get_corename(), reps);
    printf("| T | n | D | product | qinfer ms | qinfer GFLOP/s | OpenBLAS ms | OpenBLAS GFLOP/s | OpenBLAS time / qinfer | max rel. diff |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|\n");
    for (int i = 0; i < nd; i++)
        if (bench_one(T, n, dims[i], reps)) return 1;
    return 0;
}

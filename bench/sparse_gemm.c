/* sparse_gemm.c - the sparse-input matmul (engine/kernels/sparse.h) against
 * the dense one, timed side by side on one thread.
 *
 * A matrix of -R rows by -n columns of type -t (random floats quantised)
 * is multiplied by T tokens' inputs with a share -d of their elements
 * non-zero (the rest zero, at random): dense (the activations quantised as
 * the CPU device quantises them, then the kernel table's matmul, the whole
 * row read) and sparse (the column form, the active columns only; the
 * union over the T tokens), alternating within every repetition. Prints
 * the median time of each per call and sparse / dense: the share of the
 * dense time a sparse matmul takes at that density.
 *
 * -k picks the sparse kernel (ref, avx2, avx512; default the one the
 * engine takes). -c C makes C matrices of that shape (each in both forms)
 * and times a pass over all of them, per matrix: with C times the bytes
 * past the last-level cache, every matrix comes from memory, as a decode
 * step's layers do; one matrix (the default) stays in the caches.
 *
 *   bench_sparse_gemm [-t TYPE] [-R ROWS] [-n N] [-T LIST] [-d LIST] [-r REPS] [-k KERNEL] [-c COPIES]
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "kernels.h"
#include "kernels/sparse.h"
#include "quant_act.h"
#include "qinfer/quant.h"
#include "qinfer/types.h"

static uint64_t rng_state = 88172645463325252ull;
static double rnd(void) { /* uniform in [0, 1) */
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) * 0x1p-53;
}

static void usage(FILE *f) {
    fprintf(f, "usage: bench_sparse_gemm [-t TYPE] [-R ROWS] [-n N] [-T LIST] [-d LIST] [-r REPS] [-k KERNEL] [-c COPIES]\n"
               "  -t TYPE  weight type with codes: q4_0 q4_1 q5_0 q5_1 q8_0 q4_K q5_K q6_K (default q4_1)\n"
               "  -R ROWS  weight rows, a multiple of 32 (default 576)\n"
               "  -n N     columns (inputs), a multiple of the type's block (default 1536)\n"
               "  -T LIST  token counts, comma-separated (default 1,4,16)\n"
               "  -d LIST  shares of non-zero inputs, comma-separated (default 1,0.7,0.5,0.3,0.1)\n"
               "  -r REPS  repetitions, the two alternating (default 21)\n"
               "  -k KERNEL  sparse kernel: ref, avx2 or avx512 (default the fastest here)\n"
               "  -c COPIES  matrices of that shape, timed as a pass over all of them (default 1: in\n"
               "             cache; enough to pass the last-level cache: from memory, as in decode)\n");
}

static int parse_list(const char *s, double *out, int cap) {
    int n = 0;
    for (const char *p = s; *p && n < cap;) {
        char *end;
        out[n++] = strtod(p, &end);
        if (end == p || (*end && *end != ',')) return -1;
        p = *end ? end + 1 : end;
    }
    return n;
}

int main(int argc, char **argv) {
    int R = 576, reps = 21, C = 1;
    int64_t n = 1536;
    const char *tl = "1,4,16", *dl = "1,0.7,0.5,0.3,0.1", *type = "q4_1", *kern = NULL;
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "-t") && v) type = v, i++;
        else if (!strcmp(argv[i], "-R") && v) R = atoi(v), i++;
        else if (!strcmp(argv[i], "-n") && v) n = atoll(v), i++;
        else if (!strcmp(argv[i], "-T") && v) tl = v, i++;
        else if (!strcmp(argv[i], "-d") && v) dl = v, i++;
        else if (!strcmp(argv[i], "-r") && v) reps = atoi(v), i++;
        else if (!strcmp(argv[i], "-k") && v) kern = v, i++;
        else if (!strcmp(argv[i], "-c") && v) C = atoi(v), i++;
        else {
            fprintf(stderr, "bench_sparse_gemm: bad argument '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    uint32_t t = QI_TYPE_COUNT;
    for (uint32_t k = 0; k < QI_TYPE_COUNT; k++)
        if (qi_type_get(k) && qi_type_get(k)->name && strcmp(qi_type_get(k)->name, type) == 0) t = k;
    double tok[16], dens[16];
    const int n_tok = parse_list(tl, tok, 16), n_dens = parse_list(dl, dens, 16);
    if (t == QI_TYPE_COUNT || qi_code_group(t) == 0 || R < 32 || R % 32 || qi_row_bytes(t, n) == 0 || reps < 1 ||
        n_tok < 1 || n_dens < 1 || C < 1 || C > 4096) {
        fprintf(stderr, "bench_sparse_gemm: need a type with codes, ROWS a positive multiple of 32, N a multiple "
                        "of the type's block, REPS >= 1, COPIES in 1..4096, and the lists as numbers\n");
        return 2;
    }
    const size_t rb = qi_row_bytes(t, n);
    unsigned char **data = calloc((size_t)C, sizeof *data);
    qi_colw *c = calloc((size_t)C, sizeof *c);
    float *row = malloc(sizeof(float) * (size_t)n);
    if (!data || !c || !row) {
        fprintf(stderr, "bench_sparse_gemm: out of memory\n");
        return 1;
    }
    for (int m = 0; m < C; m++) {
        data[m] = malloc(rb * (size_t)R);
        if (!data[m]) {
            fprintf(stderr, "bench_sparse_gemm: out of memory for %d matrices\n", C);
            return 1;
        }
        for (int i = 0; i < R; i++) {
            for (int64_t j = 0; j < n; j++) row[j] = (float)(2.0 * rnd() - 1.0);
            qi_quantize_row_ref(t, row, data[m] + (size_t)i * rb, n);
        }
        const qi_weight w = {.type = t, .n_cols = n, .n_rows = R, .row_bytes = rb, .data = data[m]};
        qi_err e = {0};
        if (qi_colw_build(&w, &c[m], &e) != QI_OK) {
            fprintf(stderr, "bench_sparse_gemm: %s\n", e.msg);
            return 1;
        }
    }
    const qi_kernels *k = qi_kernels_get();
    qi_sparse_fn sp = qi_sparse_matmul();
    if (kern) {
        sp = !strcmp(kern, "ref")      ? qi_sparse_matmul_ref
             : !strcmp(kern, "avx2")   ? qi_sparse_matmul_avx2()
             : !strcmp(kern, "avx512") ? qi_sparse_matmul_avx512()
                                       : NULL;
        if (!sp) {
            fprintf(stderr, "bench_sparse_gemm: no sparse kernel '%s' on this CPU (ref, avx2, avx512)\n", kern);
            return 2;
        }
    }
    const char *sp_name = sp == qi_sparse_matmul_ref      ? "ref"
                          : sp == qi_sparse_matmul_avx512() ? "avx512"
                          : sp == qi_sparse_matmul_avx2()   ? "avx2"
                                                            : "?";
    const uint32_t dt = qi_vec_dot_type(t);
    uint64_t qrb = 0;
    qi_type_row_bytes(dt, (uint64_t)n, &qrb);
    printf("%s %d x %lld, one thread, dense kernels %s, sparse %s; median of %d, alternating", type, R, (long long)n,
           k->name, sp_name, reps);
    if (C > 1)
        printf("; a pass over %d matrices (%.1f MiB dense, %.1f MiB column form), time per matrix", C,
               (double)rb * R * C / 1048576.0, (double)qi_colw_bytes(&c[0]) * C / 1048576.0);
    printf("\n");
    printf("| tokens | non-zero | dense us | sparse us | active cols | sparse/dense |\n|---:|---:|---:|---:|---:|---:|\n");
    for (int a = 0; a < n_tok; a++) {
        const int T = (int)tok[a];
        float *x = malloc(sizeof(float) * (size_t)T * (size_t)n), *y = malloc(sizeof(float) * (size_t)T * (size_t)R);
        void *xq = malloc(qrb * (size_t)T);
        int32_t *idx = malloc(sizeof(int32_t) * (size_t)n);
        for (int b = 0; b < n_dens; b++) {
            for (int64_t i = 0; i < T * n; i++) x[i] = rnd() < dens[b] ? (float)(2.0 * rnd() - 1.0) : 0.0f;
            double td[256], ts[256];
            int n_idx = 0;
            const int nr = reps > 256 ? 256 : reps;
            for (int r = 0; r < nr; r++) {
                double t0 = bench_now();
                for (int m = 0; m < C; m++) {
                    for (int tt = 0; tt < T; tt++)
                        qi_quantize_act_row(dt, x + (size_t)tt * n, (char *)xq + tt * qrb, n);
                    k->gemm[t] ? k->gemm[t](n, data[m], rb, R, xq, qrb, T, y, (size_t)R) : (void)0;
                }
                td[r] = (bench_now() - t0) / C;
                t0 = bench_now();
                for (int m = 0; m < C; m++) {
                    n_idx = qi_sparse_active(x, (size_t)n, T, n, idx);
                    sp(&c[m], x, (size_t)n, T, idx, n_idx, y, (size_t)R, 0, R);
                }
                ts[r] = (bench_now() - t0) / C;
            }
            const double md = bench_median(td, nr), ms = bench_median(ts, nr);
            printf("| %d | %.2f | %.1f | %.1f | %d | %.3f |\n", T, dens[b], 1e6 * md, 1e6 * ms, n_idx, ms / md);
        }
        free(x), free(y), free(xq), free(idx);
    }
    for (int m = 0; m < C; m++) qi_colw_free(&c[m]), free(data[m]);
    free(c), free(data), free(row);
    return 0;
}

/* packed_gemm.c - the packed matmul kernels of every kernel table, timed
 * side by side on one thread.
 *
 * For each weight type with a packed form, a matrix of -R rows by -n
 * elements (random codes and scales, packed as the CPU device packs them with QI_CPU_REPACK)
 * is multiplied by T tokens' activations for every T of -T, with the
 * reference's gemm_packed entry and each SIMD table's that has its own
 * (avx512 where the CPU has it), alternating within every repetition. Prints the median time per
 * call and per row x token x 32-element block, and the ratio to the first
 * table; every table's results are checked against the first table's, bit
 * for bit (they all compute the packed reference order).
 *
 *   bench_packed_gemm [-R ROWS] [-n N] [-T LIST] [-r REPS]
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "kernels.h"
#include "quant_act.h"
#include "qinfer/quant.h"
#include "qinfer/types.h"

static uint64_t rng_state = 88172645463325252ull;
static uint32_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 32);
}

static void usage(FILE *f) {
    fprintf(f, "usage: bench_packed_gemm [-R ROWS] [-n N] [-T LIST] [-r REPS]\n"
               "  -R ROWS  weight rows (default 1536)\n"
               "  -n N     elements per row, a multiple of 32 (default 576)\n"
               "  -T LIST  token counts, comma-separated (default 1,4,8,16,64)\n"
               "  -r REPS  repetitions, tables alternating (default 15)\n");
}

int main(int argc, char **argv) {
    int R = 1536, reps = 15;
    int64_t n = 576;
    int tok[16], n_tok = 0;
    const char *tlist = "1,4,8,16,64";
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "-R") && v) R = atoi(v), i++;
        else if (!strcmp(argv[i], "-n") && v) n = atoll(v), i++;
        else if (!strcmp(argv[i], "-T") && v) tlist = v, i++;
        else if (!strcmp(argv[i], "-r") && v) reps = atoi(v), i++;
        else {
            fprintf(stderr, "bench_packed_gemm: bad argument '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    for (const char *p = tlist; *p && n_tok < 16;) {
        char *end;
        long t = strtol(p, &end, 10);
        if (end == p || t < 1 || t > 4096) {
            fprintf(stderr, "bench_packed_gemm: bad token list '%s'\n", tlist);
            return 2;
        }
        tok[n_tok++] = (int)t;
        p = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') {
            fprintf(stderr, "bench_packed_gemm: bad token list '%s'\n", tlist);
            return 2;
        }
    }
    if (R < 1 || n < 32 || n % 32 || reps < 1) {
        fprintf(stderr, "bench_packed_gemm: need ROWS >= 1, N a positive multiple of 32, REPS >= 1\n");
        return 2;
    }
    /* the reference, then the SIMD tables with packed kernels of their own */
    const qi_kernels *tabs[3] = {qi_kernels_ref()};
    int n_tabs = 1;
    const qi_kernels *simd[2] = {qi_kernels_avx2(), qi_kernels_avx512()};
    for (int k = 0; k < 2; k++)
        if (simd[k] && simd[k]->gemm_packed[QI_TYPE_Q4_0] != tabs[n_tabs - 1]->gemm_packed[QI_TYPE_Q4_0])
            tabs[n_tabs++] = simd[k];
    static const uint32_t types[] = {QI_TYPE_Q4_0, QI_TYPE_Q4_1, QI_TYPE_Q5_0, QI_TYPE_Q5_1, QI_TYPE_Q8_0};
    int max_t = 0;
    for (int i = 0; i < n_tok; i++) max_t = tok[i] > max_t ? tok[i] : max_t;
    printf("%d x %lld weights, one thread, median of %d; ns per row x token x block; ratio to %s\n", R,
           (long long)n, reps, tabs[0]->name);
    printf("%-5s %5s", "type", "T");
    for (int k = 0; k < n_tabs; k++) printf(" %12s %8s", tabs[k]->name, "ratio");
    printf("\n");
    int bad = 0;
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        const uint32_t t = types[ti], at = qi_vec_dot_type(t);
        const size_t wb = qi_row_bytes(t, n), ab = qi_row_bytes(at, n);
        const size_t gb = (size_t)qi_k_pack_group_bytes(t, n);
        const int n_g = (R + QI_K_PACK_ROWS - 1) / QI_K_PACK_ROWS;
        uint8_t *w = malloc(wb * (size_t)R), *pk = malloc(gb * (size_t)n_g);
        char *a = malloc(ab * (size_t)max_t);
        float *x = malloc(sizeof(float) * (size_t)n);
        float *y = malloc(sizeof(float) * (size_t)R * (size_t)max_t * (size_t)n_tabs);
        double *ns = malloc(sizeof(double) * (size_t)reps * (size_t)n_tabs);
        if (!w || !pk || !a || !x || !y || !ns) {
            fprintf(stderr, "bench_packed_gemm: out of memory\n");
            return 1;
        }
        /* random codes; scales small positive fp16 (0x2000..0x23ff) */
        for (size_t i = 0; i < wb * (size_t)R; i++) w[i] = (uint8_t)rnd();
        const size_t bs = qi_type_get(t)->size, nb = (size_t)n / 32;
        for (int r = 0; r < R; r++)
            for (size_t b = 0; b < nb; b++) {
                uint16_t *d = (uint16_t *)(void *)(w + (size_t)r * wb + b * bs);
                d[0] = (uint16_t)(0x2000 | (rnd() & 0x3ff));
                if (t == QI_TYPE_Q4_1 || t == QI_TYPE_Q5_1) d[1] = (uint16_t)(0xa000 | (rnd() & 0x3ff));
            }
        for (int g = 0; g < n_g; g++) {
            const int rows = R - g * QI_K_PACK_ROWS < QI_K_PACK_ROWS ? R - g * QI_K_PACK_ROWS : QI_K_PACK_ROWS;
            qi_k_pack_group(t, n, w + (size_t)g * QI_K_PACK_ROWS * wb, wb, rows, pk + (size_t)g * gb);
        }
        for (int j = 0; j < max_t; j++) {
            for (int64_t i = 0; i < n; i++) x[i] = (float)((int)(rnd() % 2001) - 1000) / 250.0f;
            qi_quantize_act_row(at, x, a + (size_t)j * ab, n);
        }
        for (int ni = 0; ni < n_tok; ni++) {
            const int T = tok[ni];
            for (int rep = -1; rep < reps; rep++)
                for (int k = 0; k < n_tabs; k++) {
                    float *yk = y + (size_t)k * (size_t)R * (size_t)max_t;
                    const double t0 = bench_now();
                    tabs[k]->gemm_packed[t](n, pk, gb, R, a, ab, T, yk, (size_t)R);
                    const double dt = bench_now() - t0;
                    if (rep >= 0) ns[(size_t)k * (size_t)reps + (size_t)rep] = dt * 1e9;
                }
            printf("%-5s %5d", qi_type_get(t)->name, T);
            double base = 0.0;
            for (int k = 0; k < n_tabs; k++) {
                const double med =
                    bench_median(ns + (size_t)k * (size_t)reps, reps) / ((double)R * (double)T * (double)nb);
                if (k == 0) base = med;
                printf(" %12.4f %7.2fx", med, base / med);
                if (memcmp(y, y + (size_t)k * (size_t)R * (size_t)max_t, sizeof(float) * (size_t)R * (size_t)T)) {
                    printf(" (results differ from %s!)", tabs[0]->name);
                    bad = 1;
                }
            }
            printf("\n");
        }
        free(w);
        free(pk);
        free(a);
        free(x);
        free(y);
        free(ns);
    }
    return bad;
}

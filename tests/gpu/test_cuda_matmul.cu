/* test_cuda_matmul.cu - the CUDA matmul and get_rows launchers
 * (engine/backend/cuda/k_matmul.cu) on a GPU, against the CPU reference.
 *
 * For every weight type: rows quantised by qi_quantize_row_ref from random
 * floats, then
 * - matmul for several token counts (the matrix-vector kernel up to 8, the
 *   fp16 tiles and cuBLAS above), with the full scratch, with a scratch of
 *   a few rows (several tiles per call) and with none (the matrix-vector
 *   kernel in chunks of tokens; cuBLAS SGEMM for F32), compared with a
 *   double-precision product of the reference's dequantised rows: within
 *   1e-4 of the sum of |w x| for the fp32 kernel, 4e-3 for fp16 GEMMs;
 * - get_rows, bit for bit against qi_dequantize_row_ref.
 * Widths include one that is not a multiple of 8 for the float types (their
 * per-element paths).
 *
 * A plain main: exit 0 when all pass, 1 on a failure, 77 (skipped) without
 * a CUDA device. */
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/k_internal.h"

extern "C" {
#include "qinfer/quant.h"
}

#define MAX_T 40

static int g_fail = 0;
static uint64_t g_rng = 0x2545f4914f6cdd1dull;

static float rnd_unit(void) {
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((g_rng >> 40) & 0xffffff) / 8388608.0f - 1.0f; /* [-1, 1) */
}

#define CK(call)                                                                            \
    do {                                                                                    \
        cudaError_t e_ = (call);                                                            \
        if (e_ != cudaSuccess) {                                                            \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
            exit(1);                                                                        \
        }                                                                                   \
    } while (0)

struct fmt {
    uint32_t type;
    const char *name;
    int qk;
};

static const fmt g_fmts[] = {
    {QI_TYPE_F32, "f32", 1},    {QI_TYPE_F16, "f16", 1},    {QI_TYPE_BF16, "bf16", 1}, {QI_TYPE_Q4_0, "q4_0", 32},
    {QI_TYPE_Q4_1, "q4_1", 32}, {QI_TYPE_Q5_0, "q5_0", 32}, {QI_TYPE_Q5_1, "q5_1", 32}, {QI_TYPE_Q8_0, "q8_0", 32},
    {QI_TYPE_Q4_K, "q4_k", 256}, {QI_TYPE_Q5_K, "q5_k", 256}, {QI_TYPE_Q6_K, "q6_k", 256},
};

/* The scratch a mode gives: all the launcher asks for, room for x in fp16
 * and 7 weight rows (several tiles), or none. */
static size_t mode_scratch(int mode, int T, int64_t n_cols) {
    if (mode == 0) return qi_cuk_matmul_scratch(MAX_T, n_cols);
    if (mode == 1) return ((size_t)T * n_cols * 2 + 255) / 256 * 256 + (size_t)7 * n_cols * 2;
    return 0;
}

static void check_one(const fmt *f, int64_t n_rows, int64_t n_cols, cudaStream_t st, cublasHandle_t cb,
                      void *scratch) {
    const size_t rb = qi_row_bytes(f->type, n_cols);
    uint8_t *w = (uint8_t *)malloc(rb * n_rows);
    float *wf = (float *)malloc(sizeof(float) * n_rows * n_cols);
    float *src = (float *)malloc(sizeof(float) * n_cols);
    float *x = (float *)malloc(sizeof(float) * MAX_T * n_cols);
    float *y = (float *)malloc(sizeof(float) * MAX_T * n_rows);
    for (int64_t r = 0; r < n_rows; r++) {
        for (int64_t j = 0; j < n_cols; j++) src[j] = rnd_unit();
        qi_quantize_row_ref(f->type, src, w + r * rb, n_cols);
        qi_dequantize_row_ref(f->type, w + r * rb, wf + r * n_cols, n_cols);
    }
    for (int64_t j = 0; j < MAX_T * n_cols; j++) x[j] = rnd_unit();

    uint8_t *dw;
    float *dx, *dy, *dout;
    int32_t *dids;
    CK(cudaMalloc((void **)&dw, rb * n_rows));
    CK(cudaMalloc((void **)&dx, sizeof(float) * MAX_T * n_cols));
    CK(cudaMalloc((void **)&dy, sizeof(float) * MAX_T * n_rows));
    CK(cudaMalloc((void **)&dout, sizeof(float) * MAX_T * n_cols));
    CK(cudaMalloc((void **)&dids, sizeof(int32_t) * MAX_T));
    CK(cudaMemcpy(dw, w, rb * n_rows, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dx, x, sizeof(float) * MAX_T * n_cols, cudaMemcpyHostToDevice));

    static const int Ts[] = {1, 2, 3, 5, 8, 9, 17, 40};
    for (int mode = 0; mode < 3; mode++)
        for (size_t ti = 0; ti < sizeof Ts / sizeof *Ts; ti++) {
            const int T = Ts[ti];
            /* F16/BF16 rows of a width that is not a multiple of 8 need the
             * scratch at any T (no matrix-vector kernel for them) */
            if (mode == 2 && n_cols % 8 && f->type != QI_TYPE_F32) continue;
            qi_cuk_ctx c = {st, cb, mode == 2 ? NULL : scratch, mode_scratch(mode, T, n_cols)};
            const char *what = "";
            CK(cudaMemset(dy, 0xff, sizeof(float) * MAX_T * n_rows)); /* NaN: unwritten outputs show */
            int e = qi_cuk_matmul(&c, f->type, dw, n_rows, n_cols, rb, dx, T, dy, &what);
            if (!e) e = (int)cudaStreamSynchronize(st);
            if (e) {
                printf("%-5s %4lld cols T=%2d mode %d: error %d at %s\n", f->name, (long long)n_cols, T, mode, e,
                       what);
                g_fail = 1;
                continue;
            }
            CK(cudaMemcpy(y, dy, sizeof(float) * T * n_rows, cudaMemcpyDeviceToHost));
            /* fp16 GEMM unless the fp32 kernel ran (few tokens, whole groups) or F32 (SGEMM) */
            const bool fp32 = f->type == QI_TYPE_F32 || (n_cols % 8 == 0 && (T <= 8 || mode == 2));
            const double tol = fp32 ? 1e-4 : 4e-3;
            double worst = 0.0;
            for (int t = 0; t < T; t++)
                for (int64_t r = 0; r < n_rows; r++) {
                    double ref = 0.0, mag = 0.0;
                    for (int64_t j = 0; j < n_cols; j++) {
                        const double p = (double)wf[r * n_cols + j] * (double)x[t * n_cols + j];
                        ref += p;
                        mag += fabs(p);
                    }
                    const double err = fabs((double)y[t * n_rows + r] - ref) / (mag + 1e-30);
                    if (!(err <= worst)) worst = err; /* a NaN sticks */
                }
            const bool ok = worst <= tol;
            if (!ok || T == 1 || T == 40)
                printf("%-5s %4lld cols T=%2d mode %d: worst relative error %.2e (tolerance %.0e) %s\n", f->name,
                       (long long)n_cols, T, mode, worst, tol, ok ? "ok" : "FAIL");
            if (!ok) g_fail = 1;
        }

    /* get_rows: bit for bit, repeated ids included */
    int32_t ids[MAX_T];
    for (int t = 0; t < MAX_T; t++) ids[t] = (int32_t)((t * 37 + 11) % n_rows);
    CK(cudaMemcpy(dids, ids, sizeof ids, cudaMemcpyHostToDevice));
    qi_cuk_ctx c = {st, cb, scratch, qi_cuk_matmul_scratch(MAX_T, n_cols)};
    const char *what = "";
    int e = qi_cuk_get_rows(&c, f->type, dw, n_cols, rb, dids, MAX_T, dout, &what);
    if (!e) e = (int)cudaStreamSynchronize(st);
    if (e) {
        printf("%-5s %4lld cols get_rows: error %d at %s\n", f->name, (long long)n_cols, e, what);
        g_fail = 1;
    } else {
        float *out = (float *)malloc(sizeof(float) * MAX_T * n_cols);
        CK(cudaMemcpy(out, dout, sizeof(float) * MAX_T * n_cols, cudaMemcpyDeviceToHost));
        long bad = 0;
        for (int t = 0; t < MAX_T; t++)
            bad += memcmp(out + t * n_cols, wf + ids[t] * n_cols, sizeof(float) * n_cols) != 0;
        printf("%-5s %4lld cols get_rows: %ld of %d rows differ %s\n", f->name, (long long)n_cols, bad, MAX_T,
               bad ? "FAIL" : "ok");
        if (bad) g_fail = 1;
        free(out);
    }

    cudaFree(dw);
    cudaFree(dx);
    cudaFree(dy);
    cudaFree(dout);
    cudaFree(dids);
    free(w);
    free(wf);
    free(src);
    free(x);
    free(y);
}

int main(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        printf("skipped: no CUDA device\n");
        return 77;
    }
    cudaStream_t st;
    cublasHandle_t cb;
    CK(cudaStreamCreate(&st));
    if (cublasCreate(&cb) != CUBLAS_STATUS_SUCCESS || cublasSetStream(cb, st) != CUBLAS_STATUS_SUCCESS) {
        printf("cublasCreate failed\n");
        return 1;
    }
    const size_t sb = qi_cuk_matmul_scratch(MAX_T, 1024);
    void *scratch;
    CK(cudaMalloc(&scratch, sb));
    for (size_t i = 0; i < sizeof g_fmts / sizeof *g_fmts; i++) {
        const fmt *f = &g_fmts[i];
        if (!qi_cuk_type_ok(f->type)) {
            printf("%s: not supported\n", f->name);
            g_fail = 1;
            continue;
        }
        const int64_t widths_q[] = {f->qk * 5, 1024}, widths_k[] = {256, 1024}, widths_f[] = {64, 37, 1024};
        const int64_t *wd = f->qk == 1 ? widths_f : f->qk == 32 ? widths_q : widths_k;
        const int nw = f->qk == 1 ? 3 : 2;
        for (int k = 0; k < nw; k++) check_one(f, 67, wd[k], st, cb, scratch);
    }
    printf("%s\n", g_fail ? "FAILED" : "all passed");
    cudaFree(scratch);
    cublasDestroy(cb);
    cudaStreamDestroy(st);
    return g_fail ? 1 : 0;
}

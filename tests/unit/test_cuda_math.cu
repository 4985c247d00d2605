/* test_cuda_math.cu - the CUDA kernels' shared scalar arithmetic
 * (engine/backend/cuda/k_math.cuh) against the CPU reference, on the host:
 * no GPU is needed. Plain main; exit 0 when every check passes, 1
 * otherwise, each failure printed.
 *
 * Bit for bit: fp16 <-> f32 (every half; edge cases, every half's
 * neighbours and rounding midpoints, and pseudo-random floats), ggml's
 * expf, SwiGLU, the RoPE angles (backend_cpu.c's rope_angles, restated
 * here since it is static there) and rotations (qi_k_rope_ref). Within a
 * tolerance: GeGLU, computed in fp32 where the CPU reads ggml's fp16
 * table.
 *
 * Built by CMake when nvcc is found; by hand, from the repository root:
 *   for f in kernels/kernels_ref kernels/kernels_packed kernels/quant kernels/quant_legacy kernels/quant_k types; do
 *     cc -std=c11 -O2 -ffp-contract=off -I engine/include -I engine \
 *        -c engine/$f.c -o /tmp/$(basename $f).o; done
 *   nvcc -std=c++17 -O2 -I engine/include -I engine tests/unit/test_cuda_math.cu \
 *     /tmp/kernels_ref.o /tmp/kernels_packed.o /tmp/quant.o /tmp/quant_legacy.o \
 *     /tmp/quant_k.o /tmp/types.o -lpthread -lm \
 *     -o /tmp/test_cuda_math && /tmp/test_cuda_math */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/k_math.cuh"

extern "C" {
#include "kernels/kernels.h"
#include "qinfer/quant.h"
}

static long g_fail, g_checks;

#define CHECK(cond, ...)                                                                                               \
    do {                                                                                                               \
        g_checks++;                                                                                                    \
        if (!(cond)) {                                                                                                 \
            if (g_fail++ < 20) {                                                                                       \
                printf("FAIL %s:%d: ", __FILE__, __LINE__);                                                            \
                printf(__VA_ARGS__);                                                                                   \
                printf("\n");                                                                                          \
            }                                                                                                          \
        }                                                                                                              \
    } while (0)

static uint32_t bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* xorshift64*: reproducible pseudo-random bits */
static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static uint32_t rnd32(void) {
    g_rng ^= g_rng >> 12;
    g_rng ^= g_rng << 25;
    g_rng ^= g_rng >> 27;
    return (uint32_t)((g_rng * 0x2545f4914f6cdd1dull) >> 32);
}
static float rndf(float lo, float hi) { return lo + (hi - lo) * (float)(rnd32() >> 8) * 0x1p-24f; }

static void check_f2h(float f) {
    uint16_t ref;
    qi_k_f32_to_f16_ref(&f, &ref, 1);
    const uint16_t got = qk_f2h(f);
    CHECK(got == ref, "f32_to_f16(%a = 0x%08x): 0x%04x, reference 0x%04x", (double)f, bits(f), got, ref);
}

static void test_f16(void) {
    /* every half to float */
    for (uint32_t h = 0; h < 65536; h++) {
        const uint16_t h16 = (uint16_t)h;
        float ref;
        qi_k_f16_to_f32_ref(&h16, &ref, 1);
        const float got = qk_h2f(h16);
        CHECK(bits(got) == bits(ref), "f16_to_f32(0x%04x): 0x%08x, reference 0x%08x", h, bits(got), bits(ref));
        /* and back: every half (NaNs aside) is its own rounding */
        if ((h & 0x7c00u) != 0x7c00u || (h & 0x3ffu) == 0)
            CHECK(qk_f2h(got) == h16, "f16 0x%04x round trip: 0x%04x", h, qk_f2h(got));
    }
    /* edge cases */
    const float edge[] = {0.0f,      -0.0f,        1.0f,          -1.0f,        65504.0f,    -65504.0f,
                          65519.0f,  65519.996f,   65520.0f,      -65520.0f,    65536.0f,    1e30f,
                          -1e30f,    INFINITY,     -INFINITY,     NAN,          -NAN,        0x1p-14f,
                          0x1p-15f,  0x1p-24f,     0x1p-25f,      0x1.000002p-25f, 0x1.8p-25f, 0x1p-26f,
                          0x1.ffcp-15f, 0x1.ffep-15f, 0x1.fffp-15f, 0x1.0008p0f, 0x1.0018p0f, 0x1.00080p-14f,
                          0x1.ffe000p15f, 0x1.ffeffep15f, 0x1p-149f, -0x1p-149f,      FLT_MAX,     FLT_MIN,
                          3.14159265f, -2.71828183f, 0.1f,         1.0f / 3.0f};
    for (size_t i = 0; i < sizeof edge / sizeof edge[0]; i++) check_f2h(edge[i]);
    /* NaN payloads, both signs */
    for (uint32_t m = 1; m < 0x800000u; m = m * 3 + 1) {
        check_f2h(from_bits(0x7f800000u | m));
        check_f2h(from_bits(0xff800000u | m));
    }
    /* around every finite half: its float, the midpoints to its neighbour
     * and the floats one ulp either side of each */
    for (uint32_t h = 0; h < 0x7c00u; h++) {
        for (uint32_t s = 0; s < 2; s++) {
            const uint16_t a = (uint16_t)(h | (s << 15));
            const float fa = qi_fp16_to_f32(a);
            const float fb = qi_fp16_to_f32((uint16_t)(a + 1)); /* the next magnitude (inf after the largest) */
            const float mid = (float)(((double)fa + (double)fb) / 2.0);
            const float probes[] = {fa, mid, nextafterf(mid, 0.0f), nextafterf(mid, INFINITY),
                                    nextafterf(mid, -INFINITY), nextafterf(fa, 0.0f), nextafterf(fa, INFINITY)};
            for (size_t i = 0; i < sizeof probes / sizeof probes[0]; i++) check_f2h(probes[i]);
        }
    }
    /* pseudo-random bit patterns, and random floats in the halves' range */
    for (int i = 0; i < 4000000; i++) check_f2h(from_bits(rnd32()));
    for (int i = 0; i < 2000000; i++) check_f2h(rndf(-70000.0f, 70000.0f));
    for (int i = 0; i < 2000000; i++) check_f2h(rndf(-1e-3f, 1e-3f));
    /* round trip helper */
    for (int i = 0; i < 100000; i++) {
        const float f = rndf(-100.0f, 100.0f);
        CHECK(bits(qk_round_f16(f)) == bits(qi_fp16_to_f32(qi_f32_to_fp16(f))), "round_f16(%a)", (double)f);
    }
}

static void test_expf(void) {
    const float edge[] = {0.0f, -0.0f, 1.0f, -1.0f, 88.0f, 89.0f, -87.0f, -104.0f, -200.0f,
                          200.0f, INFINITY, -INFINITY, NAN, 1e-30f, -1e-30f, 133.0f, -133.0f};
    for (size_t i = 0; i < sizeof edge / sizeof edge[0]; i++) {
        const float r = qi_k_expf_ref(edge[i]), g = qk_expf_ggml(edge[i]);
        CHECK(bits(r) == bits(g) || (isnan(r) && isnan(g)), "expf_ggml(%a): %a, reference %a", (double)edge[i],
              (double)g, (double)r);
    }
    for (int i = 0; i < 2000000; i++) {
        const float x = i % 2 ? rndf(-150.0f, 150.0f) : rndf(-20.0f, 0.0f);
        const float r = qi_k_expf_ref(x), g = qk_expf_ggml(x);
        CHECK(bits(r) == bits(g), "expf_ggml(%a): %a, reference %a", (double)x, (double)g, (double)r);
    }
}

static void test_glu(void) {
    /* SwiGLU rows whose length is not a multiple of 16 (the tail takes the
     * C library's exp): bit for bit */
    const int n = 1000 + 7;
    float *g = (float *)malloc(sizeof(float) * n), *u = (float *)malloc(sizeof(float) * n),
          *r = (float *)malloc(sizeof(float) * n);
    for (int rep = 0; rep < 200; rep++) {
        for (int i = 0; i < n; i++) {
            g[i] = rep % 3 ? rndf(-12.0f, 12.0f) : rndf(-100.0f, 100.0f);
            u[i] = rndf(-4.0f, 4.0f);
            r[i] = g[i];
        }
        qi_k_swiglu_ref(n, r, u);
        for (int i = 0; i < n; i++) {
            const float got = qk_swiglu(g[i], u[i], i < (n & ~15));
            CHECK(bits(got) == bits(r[i]), "swiglu(%a, %a) [%d]: %a, reference %a", (double)g[i], (double)u[i], i,
                  (double)got, (double)r[i]);
        }
    }
    /* GeGLU: fp32 gelu_tanh against ggml's fp16 table, which rounds x and
     * the result to fp16, so within about two fp16 roundings */
    double worst = 0.0;
    for (int rep = 0; rep < 400; rep++) {
        for (int i = 0; i < n; i++) {
            g[i] = rep % 2 ? rndf(-12.0f, 12.0f) : rndf(-1.0f, 1.0f) * powf(10.0f, rndf(-6.0f, 0.0f));
            u[i] = rndf(-4.0f, 4.0f);
            r[i] = g[i];
        }
        qi_k_geglu_ref(n, r, u);
        for (int i = 0; i < n; i++) {
            const float got = qk_geglu(g[i], u[i]);
            const double x = g[i], ge = fabs(got / (u[i] != 0.0f ? u[i] : 1.0f));
            /* relative to x and to the result, and fp16's subnormal step
             * (2^-24) where both are tiny */
            const double tol = (fabs(x) * 0x1p-10 + ge * 0x1p-10 + 0x1p-23) * fabs(u[i]);
            const double err = fabs((double)got - (double)r[i]);
            if (err / tol > worst) worst = err / tol;
            CHECK(err <= tol, "geglu(%g, %g): %g, reference %g", x, (double)u[i], (double)got, (double)r[i]);
        }
    }
    /* the table's own entries: fp32 gelu rounded to fp16 is the entry, or
     * its neighbour (tanhf of another library) */
    const uint16_t *tab = qi_k_gelu_table();
    for (uint32_t h = 0; h < 65536; h++) {
        const float x = qi_fp16_to_f32((uint16_t)h);
        if (!(fabsf(x) < 10.0f)) continue;
        const uint16_t got = qk_f2h(qk_gelu_tanh(x));
        const int d = (int)got - (int)tab[h];
        CHECK(got == tab[h] || ((got & 0x8000u) == (tab[h] & 0x8000u) && (d == 1 || d == -1)),
              "gelu table 0x%04x (%g): 0x%04x, table 0x%04x", h, (double)x, got, tab[h]);
    }
    printf("geglu: worst error %.3f of the tolerance\n", worst);
    free(g);
    free(u);
    free(r);
}

/* backend_cpu.c's rope_angles, restated (it is static there) */
static void cpu_rope_angles(int32_t pos, int n_pairs, float theta_scale, float freq_scale, float *cs, float *sn) {
    float theta = (float)pos;
    for (int i = 0; i < n_pairs; i++) {
        const float th = theta * freq_scale;
        cs[i] = cosf(th);
        sn[i] = sinf(th);
        theta *= theta_scale;
    }
}

static void test_rope(void) {
    const float bases[] = {10000.0f, 500000.0f, 1000000.0f, 10000.0f};
    const float fscales[] = {1.0f, 1.0f, 0.125f, 0.25f};
    const int n_rots[] = {2, 6, 32, 64, 96, 128, 256};
    const int32_t poss[] = {0, 1, 2, 7, 100, 1023, 4095, 32767, 131071};
    float cs[512], sn[512];
    for (size_t b = 0; b < sizeof bases / sizeof bases[0]; b++)
        for (size_t r = 0; r < sizeof n_rots / sizeof n_rots[0]; r++) {
            const int n_rot = n_rots[r], n_pairs = n_rot / 2;
            const float theta_scale = powf(bases[b], -2.0f / (float)n_rot);
            for (size_t p = 0; p < sizeof poss / sizeof poss[0]; p++) {
                cpu_rope_angles(poss[p], n_pairs, theta_scale, fscales[b], cs, sn);
                for (int i = 0; i < n_pairs; i++) {
                    const float th = qk_rope_theta(poss[p], i, theta_scale, fscales[b]);
                    CHECK(bits(cosf(th)) == bits(cs[i]) && bits(sinf(th)) == bits(sn[i]),
                          "rope angle pos %d pair %d/%d base %g: theta %a", poss[p], i, n_pairs, (double)bases[b],
                          (double)th);
                    /* against the formula pos * freq_scale * base^(-2i/n_rot), in double */
                    const double exact = (double)poss[p] * fscales[b] * pow((double)bases[b], -2.0 * i / n_rot);
                    CHECK(fabs(th - exact) <= 1e-5 * fabs(exact) + 1e-30, "rope theta pos %d pair %d: %a vs %a",
                          poss[p], i, (double)th, exact);
                }
            }
        }
    /* rotations: both layouts, head sizes with and without NORM's unfused
     * tail, n_rot < D, against qi_k_rope_ref */
    const int Ds[] = {2, 6, 10, 64, 80, 128, 256};
    for (size_t di = 0; di < sizeof Ds / sizeof Ds[0]; di++)
        for (int neox = 0; neox < 2; neox++)
            for (int part = 0; part < 2; part++) {
                const int D = Ds[di], n_rot = part && D >= 4 ? D / 2 / 2 * 2 : D, n_pairs = n_rot / 2, H = 3;
                const float theta_scale = powf(10000.0f, -2.0f / (float)n_rot);
                cpu_rope_angles(1234, n_pairs, theta_scale, 1.0f, cs, sn);
                float x[3 * 256], ref[3 * 256], got[3 * 256];
                for (int i = 0; i < H * D; i++) x[i] = ref[i] = got[i] = rndf(-3.0f, 3.0f);
                qi_k_rope_ref(ref, H, D, n_pairs, neox, cs, sn);
                const int n_fused = neox ? n_pairs : n_pairs / 4 * 4;
                for (int h = 0; h < H; h++)
                    for (int i = 0; i < n_pairs; i++) {
                        const float th = qk_rope_theta(1234, i, theta_scale, 1.0f);
                        const int a = neox ? i : 2 * i, bb = neox ? i + n_pairs : 2 * i + 1;
                        qk_rope_pair(x[h * D + a], x[h * D + bb], cosf(th), sinf(th), i < n_fused, &got[h * D + a],
                                     &got[h * D + bb]);
                    }
                for (int i = 0; i < H * D; i++)
                    CHECK(bits(got[i]) == bits(ref[i]), "rope D %d n_rot %d neox %d [%d]: %a, reference %a", D,
                          n_rot, neox, i, (double)got[i], (double)ref[i]);
            }
}

int main(void) {
    test_f16();
    test_expf();
    test_glu();
    test_rope();
    printf("test_cuda_math: %ld checks, %ld failed\n", g_checks, g_fail);
    return g_fail ? 1 : 0;
}

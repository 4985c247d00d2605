/* k_math.cuh - scalar arithmetic the CUDA kernels share with the host.
 *
 * Each helper is __host__ __device__ so that tests/unit/test_cuda_math.cu
 * checks it, on a machine without a GPU, against the CPU reference it
 * mirrors (engine/kernels/quant.c, kernels_ref.c, backend_cpu.c). Where a
 * kernel is meant to give the CPU's bits (fp16 rounding, RoPE angles and
 * rotations, SwiGLU's exponential) the helper spells out the CPU's
 * operations one rounding at a time: nvcc contracts a * b + c into a fused
 * multiply-add in device code, so unfused products and sums go through
 * the _rn intrinsics there (which nvcc never fuses).
 */
#ifndef QI_K_MATH_CUH
#define QI_K_MATH_CUH

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define QK_HD __host__ __device__ __forceinline__
#else
#define QK_HD static inline
#endif

QK_HD uint32_t qk_f32_bits(float f) {
#ifdef __CUDA_ARCH__
    return (uint32_t)__float_as_uint(f);
#else
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
#endif
}

QK_HD float qk_f32_from_bits(uint32_t u) {
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, 4);
    return f;
#endif
}

/* Unfused float operations (a * b and a + b each rounded once). */
QK_HD float qk_mul(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
}

QK_HD float qk_add(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fadd_rn(a, b);
#else
    return a + b;
#endif
}

QK_HD float qk_sub(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fsub_rn(a, b);
#else
    return a - b;
#endif
}

/* fp16 bits -> float, exact; a NaN comes back quiet with its payload
 * (qi_fp16_to_f32). */
QK_HD float qk_h2f(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1fu;
    const uint32_t man = h & 0x3ffu;
    if (exp == 0) {
        /* zero or subnormal: man * 2^-24, exact in binary32 */
        const float mag = (float)man * 0x1p-24f;
        return qk_f32_from_bits(sign | qk_f32_bits(mag));
    }
    if (exp == 31) return qk_f32_from_bits(sign | 0x7f800000u | (man ? 0x00400000u : 0u) | (man << 13));
    return qk_f32_from_bits(sign | ((exp + 112) << 23) | (man << 13));
}

/* float -> fp16 bits, round to nearest, ties to even; overflow to
 * infinity, every NaN to the quiet NaN 0x7e00 with the input's sign
 * (qi_f32_to_fp16, bit for bit). */
QK_HD uint16_t qk_f2h(float f) {
    const uint32_t x = qk_f32_bits(f);
    const uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    const uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);
    if (ax >= 0x38800000u) {
        uint32_t m = ax - (112u << 23);
        m += 0xfffu + ((m >> 13) & 1u);
        return (uint16_t)(sign | (uint16_t)(m >> 13));
    }
    if (ax <= 0x33000000u) return sign;
    const uint32_t exp = ax >> 23; /* 102..112 */
    const uint32_t man = (ax & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - exp; /* 14..24 */
    uint32_t q = man >> shift;
    const uint32_t rem = man & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) q++;
    return (uint16_t)(sign | (uint16_t)q);
}

/* f rounded to fp16 and back. */
QK_HD float qk_round_f16(float f) { return qk_h2f(qk_f2h(f)); }

/* ggml's AVX-512 expf (qi_k_expf_ref): the softmax's and SwiGLU's
 * exponential on the CPU. */
QK_HD float qk_expf_ggml(float x) {
    const float r = 0x1.8p23f;
    const float z = fmaf(x, 0x1.715476p+0f, r);
    const float n = qk_sub(z, r);
    const float b = fmaf(-n, 0x1.7f7d1cp-20f, fmaf(-n, 0x1.62e4p-1f, x));
    const float u = qk_mul(b, b);
    const float j = fmaf(fmaf(fmaf(0x1.0e4020p-7f, b, 0x1.573e2ep-5f), u, fmaf(0x1.555e66p-3f, b, 0x1.fffdb6p-2f)),
                         u, fmaf(0x1.ffffecp-1f, b, 1.0f));
    if (isnan(n)) return j;
    if (fabsf(n) > 192.0f) return n <= 0.0f ? 0.0f : INFINITY;
    return ldexpf(j, (int)n);
}

/* SiLU(x) * g as the CPU's swiglu: ggml's exponential for the elements of
 * a row's whole 16-element chunks (vec true), the C library's for the
 * rest. */
QK_HD float qk_swiglu(float x, float g, bool vec) {
    const float e = vec ? qk_expf_ggml(0.0f - x) : expf(-x);
    return qk_mul(x / qk_add(1.0f, e), g);
}

/* gelu_tanh(x) in fp32, the formula ggml fills its fp16 table with
 * (the CPU looks the result up in that table, so it differs by up to an
 * fp16 rounding). */
QK_HD float qk_gelu_tanh(float x) {
    const float A = 0.044715f, S = 0.79788456080286535587989211986876f;
    const float inner = fmaf(qk_mul(A, x), x, 1.0f);
    return qk_mul(qk_mul(0.5f, x), qk_add(1.0f, tanhf(qk_mul(qk_mul(S, x), inner))));
}

/* GeGLU's element as the CPU's geglu: 0 at or below -10, x * g at or
 * above 10, gelu_tanh(x) * g between. */
QK_HD float qk_geglu(float x, float g) {
    if (x <= -10.0f) return 0.0f;
    if (x >= 10.0f) return qk_mul(x, g);
    return qk_mul(qk_gelu_tanh(x), g);
}

/* RoPE angle of pair i (i < n_rot / 2) at position pos, as the CPU
 * backend's rope_angles: theta starts at the position and is multiplied
 * by theta_scale = powf(base, -2.0f / n_rot) (computed once, on the host)
 * pair by pair, then by freq_scale. */
QK_HD float qk_rope_theta(int32_t pos, int i, float theta_scale, float freq_scale) {
    float theta = (float)pos;
    for (int j = 0; j < i; j++) theta = qk_mul(theta, theta_scale);
    return qk_mul(theta, freq_scale);
}

/* One rotated pair as qi_k_rope_ref: fused (fma(x0, c, -(x1 s)) and
 * fma(x0, s, x1 c)) or, for NORM mode's last n_pairs % 4 pairs, unfused. */
QK_HD void qk_rope_pair(float x0, float x1, float c, float s, bool fused, float *y0, float *y1) {
    if (fused) {
        *y0 = fmaf(x0, c, -qk_mul(x1, s));
        *y1 = fmaf(x0, s, qk_mul(x1, c));
    } else {
        *y0 = qk_sub(qk_mul(x0, c), qk_mul(x1, s));
        *y1 = qk_add(qk_mul(x0, s), qk_mul(x1, c));
    }
}

#endif

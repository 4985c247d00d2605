/* util.c - what the parts of test_kernels share. */
#include "kernels_test.h"

#ifndef QI_SOURCE_DIR
#error "QI_SOURCE_DIR must name the source root"
#endif

const uint32_t k_dot_types[7] = {QI_TYPE_Q4_0, QI_TYPE_Q4_1, QI_TYPE_Q5_0, QI_TYPE_Q5_1,
                                       QI_TYPE_Q8_0, QI_TYPE_Q4_K, QI_TYPE_Q6_K};

uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* Same value, or both NaN. */
int same_float(float a, float b) { return f32_bits(a) == f32_bits(b) || (isnan(a) && isnan(b)); }

long first_diff(const float *a, const float *b, long n) {
    for (long i = 0; i < n; i++)
        if (!same_float(a[i], b[i])) return i;
    return -1;
}

/* The SIMD tables this CPU offers (possibly none). */
int simd_tables(const qi_kernels *out[2]) {
    int n = 0;
    if (qi_kernels_avx2()) out[n++] = qi_kernels_avx2();
    if (qi_kernels_avx512()) out[n++] = qi_kernels_avx512();
    return n;
}

float randn(uint64_t *s) {
    float u1 = (qi_test_randf(s) + 1.0f) * 0.5f, u2 = qi_test_randf(s);
    if (u1 < 1e-7f) u1 = 1e-7f;
    return sqrtf(-2.0f * logf(u1)) * cosf(3.14159265f * u2);
}

/* A float row with the features of real activations: Gaussian, some rows
 * with a few huge outliers (SmolLM2 has ~2e4), some all-zero blocks. */
void fill_row(uint64_t *s, float *x, int64_t n, int kind) {
    for (int64_t i = 0; i < n; i++) x[i] = randn(s) * (kind == 2 ? 30.0f : 1.0f);
    if (kind == 1)
        for (int k = 0; k < 3; k++) x[qi_test_rand(s) % (uint64_t)n] = 2.2e4f * qi_test_randf(s);
    if (kind == 3 && n >= 64)
        for (int i = 32; i < 64; i++) x[i] = 0.0f;
}

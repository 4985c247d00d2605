/* dequant.cuh - the weight formats decoded by the CUDA kernels, as
 * __host__ __device__ code so the same functions run (and are tested bit
 * for bit against qi_dequantize_row_ref) on the host.
 *
 * Every format is decoded in groups of 8 consecutive elements: a block of
 * QK elements is GPB = QK / 8 groups, and group g is elements
 * [8g, 8g + 8) of its block. A group decodes to 8 integer-valued floats q
 * plus the block's (or sub-block's) scale a and offset b, the element
 * being a * q + b. The matrix-vector kernel uses that factored form (sum
 * q*x once, scale once per group, so the inner loop is one FMA per
 * element and token); dequantisation (get_rows, the fp16 tiles for cuBLAS)
 * forms a * q + b with the reference's rounding: separately rounded
 * multiply and add, in the reference's operand order, so a dequantised
 * element is the CPU's bit for bit.
 *
 * F32, F16 and BF16 are "blocks" of 8 elements (GPB 1, a = 1, b = 0) so
 * the same kernels serve them; rows whose length is not a multiple of 8
 * use the per-element accessor `elem` of those three formats.
 *
 * Loads are as wide as each format's alignment allows (ALIGN): 16-bit
 * where a block size only guarantees 2 bytes (Q4_0 is 18 bytes, Q6_K 210),
 * 64-bit for the quants of Q4_K/Q5_K (144- and 176-byte blocks keep 8-byte
 * alignment from the row start), 128-bit for the float formats. Callers
 * check a row's alignment against ALIGN; GGUF's 32-byte tensor alignment
 * and cudaMalloc's 256 give it. Host builds go through memcpy, the defined
 * way to read a uint8_t buffer as wider integers.
 */
#ifndef QI_DEQUANT_CUH
#define QI_DEQUANT_CUH

#include <stdint.h>
#include <string.h>

#include "qinfer/types.h"

#ifdef __CUDACC__
#include <cuda_fp16.h>
#define QD_HD __host__ __device__ __forceinline__
#else
#define QD_HD inline
#endif

/* Unrolling matters on the device only (the host compiler would warn about
 * a pragma it does not know). */
#ifdef __CUDA_ARCH__
#define QD_UNROLL _Pragma("unroll")
#else
#define QD_UNROLL
#endif

/* ---- scalar helpers -------------------------------------------------------- */

QD_HD float qd_bits_f32(uint32_t u) {
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
#endif
}

QD_HD uint32_t qd_f32_bits(float f) {
#ifdef __CUDA_ARCH__
    return __float_as_uint(f);
#else
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
#endif
}

/* fp16 -> f32 exactly as qi_fp16_to_f32: subnormals exact, inf kept, NaN
 * quieted with its payload. On the device the hardware conversion gives
 * the same value for every non-NaN input (it is exact) without the
 * branches; only a NaN's payload bits might differ there. */
QD_HD float qd_h2f(uint16_t h) {
#ifdef __CUDA_ARCH__
    return __half2float(__ushort_as_half(h));
#else
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1fu;
    const uint32_t man = h & 0x3ffu;
    if (exp == 0) {
        const float mag = (float)man * 0x1p-24f; /* exact: man < 2^10 */
        return qd_bits_f32(sign | qd_f32_bits(mag));
    }
    if (exp == 31) return qd_bits_f32(sign | 0x7f800000u | (man ? 0x00400000u : 0) | (man << 13));
    return qd_bits_f32(sign | ((exp + 112) << 23) | (man << 13));
#endif
}

/* bf16 is the top half of an f32 */
QD_HD float qd_bf2f(uint16_t h) { return qd_bits_f32((uint32_t)h << 16); }

/* An int in [-2^22, 2^22) to float, exactly, without an int->float
 * conversion instruction (a quarter-rate unit on recent GPUs): 1.5 * 2^23
 * has a unit ulp, so adding v to its bit pattern adds v to its value. */
QD_HD float qd_i2f(int v) { return qd_bits_f32(0x4b400000u + (uint32_t)v) - 12582912.0f; }

/* a * q + b with the multiply and the add each rounded, as the reference
 * (compiled without contraction) does; the device would otherwise fuse. */
QD_HD float qd_mad(float a, float q, float b) {
#ifdef __CUDA_ARCH__
    return __fadd_rn(__fmul_rn(a, q), b);
#else
    return a * q + b;
#endif
}

QD_HD float qd_mul(float a, float q) {
#ifdef __CUDA_ARCH__
    return __fmul_rn(a, q);
#else
    return a * q;
#endif
}

/* 16-bit and 32-bit little-endian loads from 2-byte aligned weight bytes */
QD_HD uint32_t qd_u16(const uint8_t *p) {
#ifdef __CUDA_ARCH__
    return __ldg((const unsigned short *)p);
#else
    uint16_t v;
    memcpy(&v, p, sizeof v);
    return v;
#endif
}

QD_HD uint32_t qd_u32(const uint8_t *p) { return qd_u16(p) | qd_u16(p + 2) << 16; }

/* 32-bit load from 4-byte aligned bytes (the float formats) */
QD_HD uint32_t qd_u32a(const uint8_t *p) {
#ifdef __CUDA_ARCH__
    return __ldg((const unsigned int *)p);
#else
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return v;
#endif
}

/* 8 bytes from 8-byte aligned p, as two little-endian words */
QD_HD void qd_u64a(const uint8_t *p, uint32_t *lo, uint32_t *hi) {
#ifdef __CUDA_ARCH__
    const uint2 v = __ldg((const uint2 *)p);
    *lo = v.x, *hi = v.y;
#else
    memcpy(lo, p, 4);
    memcpy(hi, p + 4, 4);
#endif
}

/* 16 bytes from 16-byte aligned p, as four little-endian words */
QD_HD void qd_u128a(const uint8_t *p, uint32_t w[4]) {
#ifdef __CUDA_ARCH__
    const uint4 v = __ldg((const uint4 *)p);
    w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
#else
    memcpy(w, p, 16);
#endif
}

/* The 4-bit fields at bit `shift` of each byte of lo (bytes 0-3) and hi
 * (bytes 4-7): the nibbles of 8 consecutive quant bytes. */
QD_HD int qd_nib(uint32_t lo, uint32_t hi, int k, int shift) {
    const uint32_t w = k < 4 ? lo : hi;
    return (int)((w >> (8 * (k & 3) + shift)) & 0x0fu);
}

/* Byte k of the 8 bytes lo, hi */
QD_HD int qd_byte(uint32_t lo, uint32_t hi, int k) {
    const uint32_t w = k < 4 ? lo : hi;
    return (int)((w >> (8 * (k & 3))) & 0xffu);
}

/* The 6-bit scale and min of sub-block sb of a Q4_K/Q5_K block (scales
 * s, 4-byte aligned), as qi_k_scale_min: sub-blocks 0-3 in the low 6 bits
 * of bytes 0-3 (scale) and 4-7 (min); 4-7 in the nibbles of bytes 8-11
 * with their top two bits in bits 6-7 of bytes 0-7. Written without a
 * branch on sb: the lanes of a warp take different sub-blocks. */
QD_HD void qd_k_scale_min(const uint8_t *s, int sb, int *sc, int *mn) {
    const int sh = 8 * (sb & 3);
    const uint32_t a = (qd_u32a(s) >> sh) & 0xffu, b = (qd_u32a(s + 4) >> sh) & 0xffu;
    const uint32_t c = (qd_u32a(s + 8) >> sh) & 0xffu;
    const uint32_t hi = 0u - (uint32_t)(sb >> 2); /* all ones for sub-blocks 4-7 */
    *sc = (int)((((c & 0x0fu) | (a >> 6) << 4) & hi) | (a & 63u & ~hi));
    *mn = (int)((((c >> 4) | (b >> 6) << 4) & hi) | (b & 63u & ~hi));
}

/* ---- the formats ----------------------------------------------------------- */

/* Each format: TYPE (qi_type), QK (elements per block), BYTES (per block),
 * GPB (groups per block), HAS_A / HAS_B (whether a and b are not 1 / 0),
 * FLOAT (a plain float format with an `elem` accessor), ALIGN (the byte
 * alignment its loads need), NAME (for launch names), and
 * group(blk, g, q, &a, &b). */

struct qd_q4_0 {
    static constexpr uint32_t TYPE = QI_TYPE_Q4_0;
    static constexpr int QK = 32, BYTES = 18, GPB = 4, HAS_A = 1, HAS_B = 0, FLOAT = 0, ALIGN = 2;
    static constexpr const char *NAME = "q4_0";
    /* groups 0-1: low nibbles of qs[0..16); 2-3: high nibbles */
    static QD_HD void group(const uint8_t *blk, int g, float q[8], float &a, float &b) {
        const uint8_t *qs = blk + 2 + 8 * (g & 1);
        const uint32_t lo = qd_u32(qs), hi = qd_u32(qs + 4);
        const int shift = 4 * (g >> 1);
        QD_UNROLL
        for (int k = 0; k < 8; k++) q[k] = qd_i2f(qd_nib(lo, hi, k, shift) - 8);
        a = qd_h2f((uint16_t)qd_u16(blk));
        b = 0.0f;
    }
};

struct qd_q4_1 {
    static constexpr uint32_t TYPE = QI_TYPE_Q4_1;
    static constexpr int QK = 32, BYTES = 20, GPB = 4, HAS_A = 1, HAS_B = 1, FLOAT = 0, ALIGN = 2;
    static constexpr const char *NAME = "q4_1";
    static QD_HD void group(const uint8_t *blk, int g, float q[8], float &a, float &b) {
        const uint8_t *qs = blk + 4 + 8 * (g & 1);
        const uint32_t lo = qd_u32(qs), hi = qd_u32(qs + 4);
        const int shift = 4 * (g >> 1);
        QD_UNROLL
        for (int k = 0; k < 8; k++) q[k] = qd_i2f(qd_nib(lo, hi, k, shift));
        a = qd_h2f((uint16_t)qd_u16(blk));
        b = qd_h2f((uint16_t)qd_u16(blk + 2));
    }
};

/* Q5: the fifth bits of elements 8g..8g+7 are byte g of qh */
struct qd_q5_0 {
    static constexpr uint32_t TYPE = QI_TYPE_Q5_0;
    static constexpr int QK = 32, BYTES = 22, GPB = 4, HAS_A = 1, HAS_B = 0, FLOAT = 0, ALIGN = 2;
    static constexpr const char *NAME = "q5_0";
    static QD_HD void group(const uint8_t *blk, int g, float q[8], float &a, float &b) {
        const uint8_t *qs = blk + 6 + 8 * (g & 1);
        const uint32_t lo = qd_u32(qs), hi = qd_u32(qs + 4);
        const uint32_t h = (qd_u32(blk + 2) >> (8 * g)) & 0xffu;
        const int shift = 4 * (g >> 1);
        QD_UNROLL
        for (int k = 0; k < 8; k++) q[k] = qd_i2f((qd_nib(lo, hi, k, shift) | (int)((h >> k) & 1u) << 4) - 16);
        a = qd_h2f((uint16_t)qd_u16(blk));
        b = 0.0f;
    }
};

struct qd_q5_1 {
    static constexpr uint32_t TYPE = QI_TYPE_Q5_1;
    static constexpr int QK = 32, BYTES = 24, GPB = 4, HAS_A = 1, HAS_B = 1, FLOAT = 0, ALIGN = 2;
    static constexpr const char *NAME = "q5_1";
    static QD_HD void group(const uint8_t *blk, int g, float q[8], float &a, float &b) {
        const uint8_t *qs = blk + 8 + 8 * (g & 1);
        const uint32_t lo = qd_u32(qs), hi = qd_u32(qs + 4);
        const uint32_t h = (qd_u32(blk + 4) >> (8 * g)) & 0xffu;
        const int shift = 4 * (g >> 1);
        QD_UNROLL
        for (int k = 0; k < 8; k++) q[k] = qd_i2f(qd_nib(lo, hi, k, shift) | (int)((h >> k) & 1u) << 4);
        a = qd_h2f((uint16_t)qd_u16(blk));
        b = qd_h2f((uint16_t)qd_u16(blk + 2));
    }
};

struct qd_q8_0 {
    static constexpr uint32_t TYPE = QI_TYPE_Q8_0;
    static constexpr int QK = 32, BYTES = 34, GPB = 4, HAS_A = 1, HAS_B = 0, FLOAT = 0, ALIGN = 2;
    static constexpr const char *NAME = "q8_0";
    static QD_HD void group(const uint8_t *blk, int g, float q[8], float &a, float &b) {
        const uint8_t *qs = blk + 2 + 8 * g;
        const uint32_t lo = qd_u32(qs), hi = qd_u32(qs + 4);
        QD_UNROLL
        for (int k = 0; k < 8; k++) q[k] = qd_i2f((int)(int8_t)qd_byte(lo, hi, k));
        a = qd_h2f((uint16_t)qd_u16(blk));
        b = 0.0f;
    }
};

/* Q4_K: group g is in sub-block sb = g / 4, whose quants are the low
 * (sb even) or high (sb odd) nibbles of the 32-byte chunk sb / 2; the
 * element is (d*sc) * q - (dmin*mn), so b = -(dmin*mn) (adding the
 * negation is the same IEEE operation as subtracting). A block is 144
 * bytes, so in an 8-byte aligned row every group's 8 quant bytes are
 * 8-byte aligned: one 64-bit load (ALIGN 8; callers check). */
struct qd_q4_K {
    static constexpr uint32_t TYPE = QI_TYPE_Q4_K;
    static constexpr int QK = 256, BYTES = 144, GPB = 32, HAS_A = 1, HAS_B = 1, FLOAT = 0, ALIGN = 8;
    static constexpr const char *NAME = "q4_k";
    static QD_HD void group(const uint8_t *blk, int g, float q[8], float &a, float &b) {
        const int sb = g >> 2, l0 = 8 * (g & 3);
        uint32_t lo, hi;
        qd_u64a(blk + 16 + 32 * (sb >> 1) + l0, &lo, &hi);
        const int shift = 4 * (sb & 1);
        QD_UNROLL
        for (int k = 0; k < 8; k++) q[k] = qd_i2f(qd_nib(lo, hi, k, shift));
        int sc, mn;
        qd_k_scale_min(blk + 4, sb, &sc, &mn);
        const uint32_t dd = qd_u32a(blk); /* d, dmin */
        a = qd_mul(qd_h2f((uint16_t)(dd & 0xffffu)), (float)sc);
        b = -qd_mul(qd_h2f((uint16_t)(dd >> 16)), (float)mn);
    }
};

/* Q5_K: Q4_K's layout with qh (32 bytes) before qs; element l of
 * sub-block sb has its fifth bit at bit sb of qh[l]. 176-byte blocks:
 * 64-bit loads as Q4_K's. */
struct qd_q5_K {
    static constexpr uint32_t TYPE = QI_TYPE_Q5_K;
    static constexpr int QK = 256, BYTES = 176, GPB = 32, HAS_A = 1, HAS_B = 1, FLOAT = 0, ALIGN = 8;
    static constexpr const char *NAME = "q5_k";
    static QD_HD void group(const uint8_t *blk, int g, float q[8], float &a, float &b) {
        const int sb = g >> 2, l0 = 8 * (g & 3);
        uint32_t lo, hi, hlo, hhi;
        qd_u64a(blk + 48 + 32 * (sb >> 1) + l0, &lo, &hi);
        qd_u64a(blk + 16 + l0, &hlo, &hhi);
        const int shift = 4 * (sb & 1);
        QD_UNROLL
        for (int k = 0; k < 8; k++)
            q[k] = qd_i2f(qd_nib(lo, hi, k, shift) | ((qd_byte(hlo, hhi, k) >> sb) & 1) << 4);
        int sc, mn;
        qd_k_scale_min(blk + 4, sb, &sc, &mn);
        const uint32_t dd = qd_u32a(blk); /* d, dmin */
        a = qd_mul(qd_h2f((uint16_t)(dd & 0xffffu)), (float)sc);
        b = -qd_mul(qd_h2f((uint16_t)(dd >> 16)), (float)mn);
    }
};

/* Q6_K: group g is in half h = g / 16 and, within it, quarter s (elements
 * 32s..32s+31 of the half): its low nibbles are ql[64h + 32(s&1) + l]
 * (low nibble for s < 2, high for s >= 2), its top two bits
 * qh[32h + l] >> 2s; its 16-element scale is scales[8h + 2s + (l >= 16)].
 * The element is (d * scale) * (q - 32), the reference's order. */
struct qd_q6_K {
    static constexpr uint32_t TYPE = QI_TYPE_Q6_K;
    static constexpr int QK = 256, BYTES = 210, GPB = 32, HAS_A = 1, HAS_B = 0, FLOAT = 0, ALIGN = 2;
    static constexpr const char *NAME = "q6_k";
    static QD_HD void group(const uint8_t *blk, int g, float q[8], float &a, float &b) {
        const int h = g >> 4, s = (g >> 2) & 3, l0 = 8 * (g & 3);
        const uint8_t *ql = blk + 64 * h + 32 * (s & 1) + l0;
        const uint8_t *qh = blk + 128 + 32 * h + l0;
        const uint32_t lo = qd_u32(ql), hi = qd_u32(ql + 4);
        const uint32_t hlo = qd_u32(qh), hhi = qd_u32(qh + 4);
        const int shift = 4 * (s >> 1);
        QD_UNROLL
        for (int k = 0; k < 8; k++)
            q[k] = qd_i2f((qd_nib(lo, hi, k, shift) | ((qd_byte(hlo, hhi, k) >> (2 * s)) & 3) << 4) - 32);
        const int si = 8 * h + 2 * s + (l0 >= 16);
        const int8_t sc = (int8_t)((qd_u16(blk + 192 + (si & ~1)) >> (8 * (si & 1))) & 0xffu);
        a = qd_mul(qd_h2f((uint16_t)qd_u16(blk + 208)), (float)sc);
        b = 0.0f;
    }
};

/* The float formats: 8 elements a group, one group a block, read with
 * 128-bit loads (ALIGN 16: callers check, and fall back to `elem`, which
 * needs only the element's own alignment). */
struct qd_f32 {
    static constexpr uint32_t TYPE = QI_TYPE_F32;
    static constexpr int QK = 8, BYTES = 32, GPB = 1, HAS_A = 0, HAS_B = 0, FLOAT = 1, ALIGN = 16;
    static constexpr const char *NAME = "f32";
    static QD_HD void group(const uint8_t *blk, int g, float q[8], float &a, float &b) {
        (void)g; /* one group per block */
        uint32_t w[8];
        qd_u128a(blk, w);
        qd_u128a(blk + 16, w + 4);
        QD_UNROLL
        for (int k = 0; k < 8; k++) q[k] = qd_bits_f32(w[k]);
        a = 1.0f;
        b = 0.0f;
    }
    static QD_HD float elem(const uint8_t *row, int64_t j) { return qd_bits_f32(qd_u32a(row + 4 * j)); }
};

struct qd_f16 {
    static constexpr uint32_t TYPE = QI_TYPE_F16;
    static constexpr int QK = 8, BYTES = 16, GPB = 1, HAS_A = 0, HAS_B = 0, FLOAT = 1, ALIGN = 16;
    static constexpr const char *NAME = "f16";
    static QD_HD void group(const uint8_t *blk, int g, float q[8], float &a, float &b) {
        (void)g; /* one group per block */
        uint32_t w[4];
        qd_u128a(blk, w);
        QD_UNROLL
        for (int k = 0; k < 4; k++) {
            q[2 * k] = qd_h2f((uint16_t)(w[k] & 0xffffu));
            q[2 * k + 1] = qd_h2f((uint16_t)(w[k] >> 16));
        }
        a = 1.0f;
        b = 0.0f;
    }
    static QD_HD float elem(const uint8_t *row, int64_t j) { return qd_h2f((uint16_t)qd_u16(row + 2 * j)); }
};

struct qd_bf16 {
    static constexpr uint32_t TYPE = QI_TYPE_BF16;
    static constexpr int QK = 8, BYTES = 16, GPB = 1, HAS_A = 0, HAS_B = 0, FLOAT = 1, ALIGN = 16;
    static constexpr const char *NAME = "bf16";
    static QD_HD void group(const uint8_t *blk, int g, float q[8], float &a, float &b) {
        (void)g; /* one group per block */
        uint32_t w[4];
        qd_u128a(blk, w);
        QD_UNROLL
        for (int k = 0; k < 4; k++) {
            q[2 * k] = qd_bf2f((uint16_t)(w[k] & 0xffffu));
            q[2 * k + 1] = qd_bf2f((uint16_t)(w[k] >> 16));
        }
        a = 1.0f;
        b = 0.0f;
    }
    static QD_HD float elem(const uint8_t *row, int64_t j) { return qd_bf2f((uint16_t)qd_u16(row + 2 * j)); }
};

/* ---- decoding -------------------------------------------------------------- */

/* One element from a group's (q, a, b), with the reference's rounding */
template <class TT>
QD_HD float qd_elem(float q, float a, float b) {
    if (TT::HAS_B) return qd_mad(a, q, b);
    if (TT::HAS_A) return qd_mul(a, q);
    return q;
}

/* Group i (0-based over the whole row: rows are far shorter than 2^34
 * elements) of a row, decoded to out[8] */
template <class TT>
QD_HD void qd_group_row(const uint8_t *row, int i, float out[8]) {
    float q[8], a, b;
    TT::group(row + (unsigned)i / TT::GPB * TT::BYTES, (int)((unsigned)i % TT::GPB), q, a, b);
    QD_UNROLL
    for (int k = 0; k < 8; k++) out[k] = qd_elem<TT>(q[k], a, b);
}

/* A whole row of n elements (a multiple of QK, or any n for the float
 * formats) into out[n]. */
template <class TT>
QD_HD void qd_dequant_row_t(const uint8_t *row, int64_t n, float *out) {
    const int ng = (int)(n / 8);
    for (int i = 0; i < ng; i++) qd_group_row<TT>(row, i, out + 8 * (int64_t)i);
    if constexpr (TT::FLOAT) {
        for (int64_t j = 8 * ng; j < n; j++) out[j] = TT::elem(row, j);
    }
}

/* The same with the type chosen at run time; 0 when the type is not one
 * of the CUDA kernels' weight types. */
QD_HD int qd_dequant_row(uint32_t type, const void *src, float *out, int64_t n) {
    const uint8_t *row = (const uint8_t *)src;
    switch (type) {
    case QI_TYPE_F32: qd_dequant_row_t<qd_f32>(row, n, out); return 1;
    case QI_TYPE_F16: qd_dequant_row_t<qd_f16>(row, n, out); return 1;
    case QI_TYPE_BF16: qd_dequant_row_t<qd_bf16>(row, n, out); return 1;
    case QI_TYPE_Q4_0: qd_dequant_row_t<qd_q4_0>(row, n, out); return 1;
    case QI_TYPE_Q4_1: qd_dequant_row_t<qd_q4_1>(row, n, out); return 1;
    case QI_TYPE_Q5_0: qd_dequant_row_t<qd_q5_0>(row, n, out); return 1;
    case QI_TYPE_Q5_1: qd_dequant_row_t<qd_q5_1>(row, n, out); return 1;
    case QI_TYPE_Q8_0: qd_dequant_row_t<qd_q8_0>(row, n, out); return 1;
    case QI_TYPE_Q4_K: qd_dequant_row_t<qd_q4_K>(row, n, out); return 1;
    case QI_TYPE_Q5_K: qd_dequant_row_t<qd_q5_K>(row, n, out); return 1;
    case QI_TYPE_Q6_K: qd_dequant_row_t<qd_q6_K>(row, n, out); return 1;
    default: return 0;
    }
}

/* ---- the matrix-vector step ------------------------------------------------ */

/* 8 activations x[0..8) (16-byte aligned on the device: callers check) */
QD_HD void qd_load_x8(const float *x, float v[8]) {
#ifdef __CUDA_ARCH__
    const float4 u = __ldg((const float4 *)x), w = __ldg((const float4 *)x + 1);
    v[0] = u.x, v[1] = u.y, v[2] = u.z, v[3] = u.w;
    v[4] = w.x, v[5] = w.y, v[6] = w.z, v[7] = w.w;
#else
    for (int k = 0; k < 8; k++) v[k] = x[k];
#endif
}

/* acc[t] += group i of the row . x[t][8i..8i+8) for t < T (1 <= T <= NT):
 * the weights are decoded once for all tokens; per token the sum of q*x is
 * scaled once, and the offset b applied to the sum of x. Slots t >= T
 * repeat token T - 1 (valid memory, result unused) rather than branch: a
 * branch per token would keep the compiler from issuing the loads of
 * several groups together. */
template <class TT, int NT>
QD_HD void qd_group_dot(const uint8_t *row, int i, const float *x, int64_t ldx, int T, float acc[NT]) {
    float q[8], a, b;
    TT::group(row + (unsigned)i / TT::GPB * TT::BYTES, (int)((unsigned)i % TT::GPB), q, a, b);
    QD_UNROLL
    for (int t = 0; t < NT; t++) {
        const int tt = NT == 1 ? 0 : t < T ? t : T - 1;
        float xv[8];
        qd_load_x8(x + tt * ldx + 8 * (int64_t)i, xv);
        float sq = 0.0f, sx = 0.0f;
        QD_UNROLL
        for (int k = 0; k < 8; k++) {
            sq += q[k] * xv[k];
            if (TT::HAS_B) sx += xv[k];
        }
        if (TT::HAS_B)
            acc[t] += a * sq + b * sx;
        else if (TT::HAS_A)
            acc[t] += a * sq;
        else
            acc[t] += sq;
    }
}

#endif

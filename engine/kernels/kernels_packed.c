/* kernels_packed.c - packed weight groups and their reference order.
 *
 * The layout and the order are described in kernels.h ("Packed weights").
 * The reference dot works on plain rows, so the tests hold a packed kernel
 * to a definition that does not go through the packing; the reference
 * gemm reads packed groups, so the packed path runs on any CPU.
 */
#include "kernels.h"

#include <math.h>
#include <string.h>

#include "qinfer/quant.h"
#include "qinfer/types.h"

#define PR QI_K_PACK_ROWS

int qi_k_pack_supported(uint32_t type) {
    return type == QI_TYPE_Q4_0 || type == QI_TYPE_Q4_1 || type == QI_TYPE_Q5_0 || type == QI_TYPE_Q5_1 ||
           type == QI_TYPE_Q8_0;
}

static int has_m(uint32_t type) { return type == QI_TYPE_Q4_1 || type == QI_TYPE_Q5_1; }

/* Bytes of one block of a group: 16 plain blocks' worth, rearranged. */
static size_t group_block_bytes(uint32_t type) { return PR * qi_type_get(type)->size; }

/* Offset of the codes within a group block: after d[16], and m[16] for
 * q4_1 and q5_1. The fifth bits of q5 follow the four nibble vectors. */
static size_t codes_offset(uint32_t type) { return (has_m(type) ? 2 : 1) * PR * sizeof(uint16_t); }
static size_t qh_offset(uint32_t type) { return codes_offset(type) + 4 * 64; }

uint64_t qi_k_pack_group_bytes(uint32_t type, int64_t n) {
    return (uint64_t)(n / QI_QK) * group_block_bytes(type);
}

void qi_k_pack_group(uint32_t type, int64_t n, const void *w, size_t w_stride, int n_rows, void *dst) {
    const int64_t nb = n / QI_QK;
    const size_t gb = group_block_bytes(type), co = codes_offset(type);
    memset(dst, 0, (size_t)nb * gb);
    for (int r = 0; r < n_rows; r++) {
        const char *row = (const char *)w + (size_t)r * w_stride;
        for (int64_t b = 0; b < nb; b++) {
            uint8_t *g = (uint8_t *)dst + (size_t)b * gb;
            uint16_t *d = (uint16_t *)(void *)g;
            uint8_t *codes = g + co;
            if (type == QI_TYPE_Q8_0) {
                const qi_block_q8_0 *x = (const qi_block_q8_0 *)(const void *)row + b;
                d[r] = x->d;
                for (int v = 0; v < 8; v++)
                    for (int i = 0; i < 4; i++) codes[64 * v + 4 * r + i] = (uint8_t)(x->qs[4 * v + i] + 128);
            } else {
                const uint8_t *qs;
                if (type == QI_TYPE_Q4_1) {
                    const qi_block_q4_1 *x = (const qi_block_q4_1 *)(const void *)row + b;
                    d[r] = x->d;
                    d[PR + r] = x->m;
                    qs = x->qs;
                } else if (type == QI_TYPE_Q5_0) {
                    const qi_block_q5_0 *x = (const qi_block_q5_0 *)(const void *)row + b;
                    d[r] = x->d;
                    memcpy(g + qh_offset(type) + 4 * r, x->qh, 4);
                    qs = x->qs;
                } else if (type == QI_TYPE_Q5_1) {
                    const qi_block_q5_1 *x = (const qi_block_q5_1 *)(const void *)row + b;
                    d[r] = x->d;
                    d[PR + r] = x->m;
                    memcpy(g + qh_offset(type) + 4 * r, x->qh, 4);
                    qs = x->qs;
                } else {
                    const qi_block_q4_0 *x = (const qi_block_q4_0 *)(const void *)row + b;
                    d[r] = x->d;
                    qs = x->qs;
                }
                for (int v = 0; v < 4; v++) memcpy(codes + 64 * v + 4 * r, qs + 4 * v, 4);
            }
        }
    }
}

/* One block's exact integer dot in the packed order's terms: the codes as
 * stored (unsigned) times the activation quants, less the format's offset
 * times the activation sum. */
static int32_t block_isum(const uint8_t *u, int ofs, const int8_t *a) {
    int32_t s = 0, sa = 0;
    for (int j = 0; j < QI_QK; j++) {
        s += (int32_t)u[j] * a[j];
        sa += a[j];
    }
    return s - ofs * sa;
}

/* The order's step for one block: acc after block x (plain format) . y. */
static float block_step(uint32_t type, const void *xb, const void *yb, float acc) {
    uint8_t u[QI_QK];
    if (type == QI_TYPE_Q8_0) {
        const qi_block_q8_0 *x = xb, *y = yb;
        for (int j = 0; j < QI_QK; j++) u[j] = (uint8_t)(x->qs[j] + 128);
        return fmaf(qi_fp16_to_f32(x->d) * qi_fp16_to_f32(y->d), (float)block_isum(u, 128, y->qs), acc);
    }
    if (type == QI_TYPE_Q4_0) {
        const qi_block_q4_0 *x = xb;
        const qi_block_q8_0 *y = yb;
        for (int j = 0; j < 16; j++) {
            u[j] = x->qs[j] & 15;
            u[j + 16] = x->qs[j] >> 4;
        }
        return fmaf(qi_fp16_to_f32(x->d) * qi_fp16_to_f32(y->d), (float)block_isum(u, 8, y->qs), acc);
    }
    if (type == QI_TYPE_Q5_0 || type == QI_TYPE_Q5_1) {
        const uint8_t *qs = type == QI_TYPE_Q5_0 ? ((const qi_block_q5_0 *)xb)->qs : ((const qi_block_q5_1 *)xb)->qs;
        const uint8_t *qhb = type == QI_TYPE_Q5_0 ? ((const qi_block_q5_0 *)xb)->qh : ((const qi_block_q5_1 *)xb)->qh;
        const uint32_t qh = (uint32_t)qhb[0] | (uint32_t)qhb[1] << 8 | (uint32_t)qhb[2] << 16 | (uint32_t)qhb[3] << 24;
        for (int j = 0; j < 16; j++) {
            u[j] = (uint8_t)((qs[j] & 15) | (qh >> j & 1) << 4);
            u[j + 16] = (uint8_t)((qs[j] >> 4) | (qh >> (j + 16) & 1) << 4);
        }
        if (type == QI_TYPE_Q5_0) {
            const qi_block_q8_0 *y = yb;
            return fmaf(qi_fp16_to_f32(((const qi_block_q5_0 *)xb)->d) * qi_fp16_to_f32(y->d),
                        (float)block_isum(u, 16, y->qs), acc);
        }
        const qi_block_q5_1 *x = xb;
        const qi_block_q8_1 *y = yb;
        acc = fmaf(qi_fp16_to_f32(x->d) * qi_fp16_to_f32(y->d), (float)block_isum(u, 0, y->qs), acc);
        return fmaf(qi_fp16_to_f32(x->m), qi_fp16_to_f32(y->s), acc);
    }
    const qi_block_q4_1 *x = xb;
    const qi_block_q8_1 *y = yb;
    for (int j = 0; j < 16; j++) {
        u[j] = x->qs[j] & 15;
        u[j + 16] = x->qs[j] >> 4;
    }
    acc = fmaf(qi_fp16_to_f32(x->d) * qi_fp16_to_f32(y->d), (float)block_isum(u, 0, y->qs), acc);
    return fmaf(qi_fp16_to_f32(x->m), qi_fp16_to_f32(y->s), acc);
}

float qi_k_dot_packed_ref(uint32_t type, int64_t n, const void *w, const void *a) {
    const size_t xs = qi_type_get(type)->size, ys = qi_type_get(qi_vec_dot_type(type))->size;
    float acc = 0.0f;
    for (int64_t b = 0; b < n / QI_QK; b++)
        acc = block_step(type, (const char *)w + (size_t)b * xs, (const char *)a + (size_t)b * ys, acc);
    return acc;
}

/* Row r of block b of a packed group, back in its plain block format. */
static void unpack_block(uint32_t type, const uint8_t *g, int r, void *out) {
    const uint16_t *d = (const uint16_t *)(const void *)g;
    const uint8_t *codes = g + codes_offset(type);
    if (type == QI_TYPE_Q8_0) {
        qi_block_q8_0 *x = out;
        x->d = d[r];
        for (int v = 0; v < 8; v++)
            for (int i = 0; i < 4; i++) x->qs[4 * v + i] = (int8_t)(codes[64 * v + 4 * r + i] - 128);
    } else if (type == QI_TYPE_Q4_1) {
        qi_block_q4_1 *x = out;
        x->d = d[r];
        x->m = d[PR + r];
        for (int v = 0; v < 4; v++) memcpy(x->qs + 4 * v, codes + 64 * v + 4 * r, 4);
    } else if (type == QI_TYPE_Q5_0) {
        qi_block_q5_0 *x = out;
        x->d = d[r];
        memcpy(x->qh, g + qh_offset(type) + 4 * r, 4);
        for (int v = 0; v < 4; v++) memcpy(x->qs + 4 * v, codes + 64 * v + 4 * r, 4);
    } else if (type == QI_TYPE_Q5_1) {
        qi_block_q5_1 *x = out;
        x->d = d[r];
        x->m = d[PR + r];
        memcpy(x->qh, g + qh_offset(type) + 4 * r, 4);
        for (int v = 0; v < 4; v++) memcpy(x->qs + 4 * v, codes + 64 * v + 4 * r, 4);
    } else {
        qi_block_q4_0 *x = out;
        x->d = d[r];
        for (int v = 0; v < 4; v++) memcpy(x->qs + 4 * v, codes + 64 * v + 4 * r, 4);
    }
}

/* The reference gemm over packed groups: each block of a row unpacked back
 * to its plain format, then the order's step. */
static void gemm_packed_ref(uint32_t type, int64_t n, const void *w, size_t w_stride, int n_w, const void *a,
                            size_t a_stride, int n_a, float *y, size_t y_stride) {
    const size_t gb = group_block_bytes(type), ys = qi_type_get(qi_vec_dot_type(type))->size;
    for (int r = 0; r < n_w; r++) {
        const uint8_t *grp = (const uint8_t *)w + (size_t)(r / PR) * w_stride;
        for (int t = 0; t < n_a; t++) {
            const char *at = (const char *)a + (size_t)t * a_stride;
            float acc = 0.0f;
            for (int64_t b = 0; b < n / QI_QK; b++) {
                _Alignas(8) uint8_t blk[sizeof(qi_block_q8_0)];
                unpack_block(type, grp + (size_t)b * gb, r % PR, blk);
                acc = block_step(type, blk, at + (size_t)b * ys, acc);
            }
            y[(size_t)t * y_stride + (size_t)r] = acc;
        }
    }
}

#define DEFINE_GEMM_PACKED_REF(NAME, TYPE)                                                            \
    void NAME(int64_t n, const void *w, size_t w_stride, int n_w, const void *a, size_t a_stride,    \
              int n_a, float *y, size_t y_stride) {                                                   \
        gemm_packed_ref(TYPE, n, w, w_stride, n_w, a, a_stride, n_a, y, y_stride);                   \
    }

DEFINE_GEMM_PACKED_REF(qi_k_gemm_packed_q4_0_ref, QI_TYPE_Q4_0)
DEFINE_GEMM_PACKED_REF(qi_k_gemm_packed_q4_1_ref, QI_TYPE_Q4_1)
DEFINE_GEMM_PACKED_REF(qi_k_gemm_packed_q8_0_ref, QI_TYPE_Q8_0)
DEFINE_GEMM_PACKED_REF(qi_k_gemm_packed_q5_0_ref, QI_TYPE_Q5_0)
DEFINE_GEMM_PACKED_REF(qi_k_gemm_packed_q5_1_ref, QI_TYPE_Q5_1)


/* kernels.h - the CPU backend's inner loops, in llama.cpp's x86 order.
 *
 * Each op has a plain-C reference qi_k_<op>_ref (kernels_ref.c) whose
 * floating-point operations are, by definition, those llama.cpp's CPU
 * backend performs on an x86-64 AVX-512 build: the same lanes, the same fused
 * multiply-adds, the same reduction trees, the same exp approximation. The
 * SIMD variants (kernels_avx2.c, kernels_avx512.c) keep that lane structure
 * and are bit-identical to the reference; tests/unit/test_kernels.c holds
 * them to it. A table of function pointers is chosen once from CPUID.
 *
 * Formats are those of qinfer/quant.h. fp16 values are raw uint16_t bits.
 */
#ifndef QI_KERNELS_H
#define QI_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "qinfer/types.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
/* Whether the CPU has F16C (the fp16 conversions the AVX2 and AVX-512
 * kernels use): CPUID leaf 1, ECX bit 29. __builtin_cpu_supports("f16c")
 * says the same in gcc, but clang before 15 (the libFuzzer build's,
 * tests/fuzz/) does not know the name and refuses to compile it. */
static inline int qi_cpu_f16c(void) {
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
}
#endif

/* Which of llama.cpp's two F16 matmul paths an attention dot follows.
 * VEC:  ggml_vec_dot_f16, taken when the batch has one token (T == 1).
 * GEMM: llamafile's tinyBLAS, taken for T >= 2 (when its shape checks pass;
 *       the kernels fall back to VEC exactly where tinyBLAS declines). */
typedef enum { QI_K_ORD_VEC = 0, QI_K_ORD_GEMM = 1 } qi_k_order;

/* y[t * y_stride + r] = w_r . a_t for r < n_w, t < n_a: a block of a matmul.
 * Weight row w_r = w + r * w_stride bytes holds n elements (a multiple of
 * the type's block size: 32, or 256 for the K types);
 * activation row a_t = a + t * a_stride bytes is in the weight type's dot
 * partner (qi_vec_dot_type) with quants in [-127, 127], as
 * qi_quantize_act_row makes them. Every dot is computed in the order of the
 * type's qi_k_dot_*_ref, independently of n_w, n_a and the strides. */
typedef void (*qi_k_gemm_fn)(int64_t n, const void *w, size_t w_stride, int n_w, const void *a,
                             size_t a_stride, int n_a, float *y, size_t y_stride);

/* llama.cpp's tiled K-quant matmul takes matmuls of this many tokens or more. */
#define QI_K_WIDE_MIN 8

typedef struct qi_kernels {
    const char *name; /* "ref", "avx2", "avx512", "amx" */
    /* Indexed by weight type; NULL where no x86-order kernel exists (the
     * backend then uses quant.c's qi_vec_dot_ref, ggml's generic order). */
    qi_k_gemm_fn gemm[QI_TYPE_COUNT];
    /* The order llama.cpp uses when a matmul has QI_K_WIDE_MIN tokens or
     * more (its tiled K-quant matmul); NULL where that is gemm's order. The
     * choice is by the whole matmul's token count, not a block's. */
    qi_k_gemm_fn gemm_wide[QI_TYPE_COUNT];
    /* Tokens a gemm_wide call should carry, at most: 0 for the caller's own
     * blocking (a few dozen, whose quantised activations stay in L1); more
     * where the kernel reads each weight row once per call and reuses it
     * for all the call's tokens (the AMX table's). Results do not depend
     * on it: every dot is the reference's whatever the call's tokens. */
    int wide_block;
    /* s[p] = q16 . k_p for p < n_pos, k_p = k + p * k_stride (elements);
     * D elements each. */
    void (*attn_scores)(qi_k_order ord, int D, const uint16_t *q16, const uint16_t *k,
                        size_t k_stride, int n_pos, float *s);
    /* w16[p] = fp16(softmax(s)[p]) for p < n; s[n] is clobbered. */
    void (*softmax_f16)(int n, float *s, uint16_t *w16);
    /* s[p] = exp(s[p] - max) for p < n, returning their sum: softmax_f16's
     * exponentials and sum (see the ref), for a softmax kept in float. */
    double (*exp_sum)(int n, float *s, float max);
    /* out[d] = sum_p w16[p] * v[p * v_stride + d] for d < D, p < n_pos. */
    void (*attn_values)(qi_k_order ord, int D, const uint16_t *w16, const uint16_t *v,
                        size_t v_stride, int n_pos, float *out);
    /* The same over a block table: row p is
     * blk[p >> shift] + (p & ((1 << shift) - 1)) * v_stride, so a paged
     * cache is read in place; the lanes are those of attn_values over the
     * same n_pos rows (they depend on p, not on where the row lives). */
    void (*attn_values_blk)(qi_k_order ord, int D, const uint16_t *w16, const uint16_t *const *blk,
                            int shift, size_t v_stride, int n_pos, float *out);
    /* RoPE on n_heads heads of D floats in place, head h at x + h * D:
     * pair i < n_pairs, elements (i, i + n_pairs) when neox, else
     * (2i, 2i + 1), turned by the angle whose cosine and sine are cs[i]
     * and sn[i], with ggml's fused multiply-adds (see the ref); elements
     * from 2 * n_pairs on are left as they are. */
    void (*rope)(float *x, int n_heads, int D, int n_pairs, int neox, const float *cs, const float *sn);
    /* g[i] = silu(g[i]) * u[i] for i < n, n a row length (see the ref). */
    void (*swiglu)(int64_t n, float *g, const float *u);
    /* g[i] = gelu_tanh(g[i]) * u[i] for i < n, through ggml's fp16 table
     * (see the ref); element-wise, so any split of a row gives the same. */
    void (*geglu)(int64_t n, float *g, const float *u);
    /* x[n] (n % 32 == 0) to Q8_0 (with_sum 0) or Q8_1 (with_sum 1) blocks
     * at dst, as llama.cpp's x86 quantize_row_q8_0/q8_1 (see quant_act.c). */
    void (*quantize_q8)(const float *x, void *dst, int64_t n, int with_sum);
    /* y[i] = x[i] as a float for i < n (exact: every fp16 value is one). */
    void (*f16_to_f32)(const uint16_t *x, float *y, int64_t n);
    /* y[i] = qi_f32_to_fp16(x[i]) for i < n: rounded to nearest even, NaN
     * to the quiet NaN 0x7e00 with its sign. */
    void (*f32_to_f16)(const float *x, uint16_t *y, int64_t n);
    /* Matmuls over packed weights (see "Packed weights" below), indexed by
     * weight type, NULL where the type has no packed form: w is the first
     * 16-row group, w_stride the bytes of one group (qi_k_pack_group_bytes),
     * n_w the rows from there (the last group may be partial); otherwise as
     * qi_k_gemm_fn. Every dot is qi_k_dot_packed_ref's, whatever n_a. */
    qi_k_gemm_fn gemm_packed[QI_TYPE_COUNT];
    /* gemm_wide over the AMX table's packed form of q4_K and q6_K (see
     * qi_k_amx_pack_group), NULL elsewhere: w is the first packed 16-row
     * group, w_stride the bytes of one group (qi_k_amx_pack_group_bytes),
     * n_w the rows from there; every dot is gemm_wide's (the tiled order),
     * so a weight that has this form keeps its rows for calls of fewer
     * than QI_K_WIDE_MIN tokens and gives the same results either way. */
    qi_k_gemm_fn gemm_wide_packed[QI_TYPE_COUNT];
} qi_kernels;

/* The kernel table to use: the widest variant the CPU supports; the
 * reference when QI_FORCE_REF=1 is in the environment; the one named by
 * QI_KERNELS=ref|avx2|avx512|amx when set and available. Chosen on the first
 * call (thread-safe); never NULL. */
const qi_kernels *qi_kernels_get(void);

/* Individual tables, for tests and benchmarks. The SIMD ones are NULL when
 * the CPU (or the compiler target) lacks the instructions. Entries a
 * variant does not accelerate point at a narrower variant's or the
 * reference's; every entry of every table is bit-identical to the
 * reference's. */
const qi_kernels *qi_kernels_ref(void);
const qi_kernels *qi_kernels_avx2(void);   /* AVX2 + FMA + F16C */
const qi_kernels *qi_kernels_avx512(void); /* + AVX-512 F/BW/VL/VNNI */
/* The AVX-512 table with the K-quant matmuls of QI_K_WIDE_MIN tokens or more
 * (gemm_wide q4_K, q6_K) on AMX tiles (kernels_amx.c), bit-identical to the
 * tiled references; NULL without AMX-TILE/AMX-INT8 or the kernel's
 * permission for the tile state (asked on the first call). */
const qi_kernels *qi_kernels_amx(void);
/* Why qi_kernels_amx() is NULL (one line), or NULL when it is not. */
const char *qi_kernels_amx_absent(void);
/* The AMX table's packed form of q4_K and q6_K: a 16-row group's weights
 * as gemm_wide unpacks them, held ready (per super-block the int8 parts of
 * codes times scale digits in the tiles' VNNI layout, then the rows' d,
 * dmin and mins; 2.1 bytes a weight for q4_K, 3.1 for q6_K). Bytes of one
 * group of n elements: 0 where the type has no such form. */
uint64_t qi_k_amx_pack_group_bytes(uint32_t type, int64_t n);
/* Pack n_rows <= QI_K_PACK_ROWS rows (row r at w + r * w_stride bytes) into
 * one group at dst, 64-byte aligned; absent rows are zero. Only where
 * qi_kernels_amx() is not NULL. */
void qi_k_amx_pack_group(uint32_t type, int64_t n, const void *w, size_t w_stride, int n_rows, void *dst);

/* ---- Packed weights (kernels_packed.c) ------------------------------------
 *
 * q4_0, q4_1, q5_0, q5_1 and q8_0 rows can be repacked in groups of
 * QI_K_PACK_ROWS rows, interleaved so that one 512-bit vpdpbusd multiplies
 * four codes of each of the 16 rows by four activation quants: block b of a
 * group holds the rows' fp16 scales d[16], for q4_1 and q5_1 their offsets
 * m[16], then the codes in
 * 64-byte vectors, row r's four bytes at 4r:
 *   q4_0, q4_1: 4 vectors; vector g holds bytes 4g..4g+3 of each row's
 *               qs[16] as they are: low nibbles elements 4g..4g+3, high
 *               nibbles elements 16+4g..16+4g+3;
 *   q5_0, q5_1: as q4_0 and q4_1, then one vector of the fifth bits: row
 *               r's qh[4] as they are (bit j: element j);
 *   q8_0:       8 vectors; vector g holds elements 4g..4g+3 + 128 (unsigned).
 * A group is as many bytes as its 16 rows were; a partial last group is
 * padded with zero rows.
 *
 * The packed order is not llama.cpp's: each row is one float lane that sums
 * its blocks in sequence, acc = fma(d_w * d_a, isum_b, acc), then for q4_1
 * and q5_1 acc = fma(m_w, s_a, acc), where isum_b is the block's exact
 * integer dot. It needs one convert, one multiply and one fused multiply-add per 16 rows
 * per block, where llama.cpp's eight partial-sum lanes per row need them
 * per row, so a batch of tokens runs several times faster; the price is
 * logits that differ from llama.cpp's in the last bits. The order does not
 * depend on the token count, so a batched step and single-sequence runs
 * agree bit for bit. */
#define QI_K_PACK_ROWS 16

/* Whether type has a packed form. */
int qi_k_pack_supported(uint32_t type);
/* Bytes of one group of QI_K_PACK_ROWS packed rows of n elements. */
uint64_t qi_k_pack_group_bytes(uint32_t type, int64_t n);
/* Pack n_rows <= QI_K_PACK_ROWS rows (row r at w + r * w_stride bytes) into
 * one group at dst (qi_k_pack_group_bytes bytes); absent rows are zero. */
void qi_k_pack_group(uint32_t type, int64_t n, const void *w, size_t w_stride, int n_rows, void *dst);
/* One plain (unpacked) weight row . one activation row, in the packed
 * order: what every gemm_packed lane computes. */
float qi_k_dot_packed_ref(uint32_t type, int64_t n, const void *w, const void *a);
/* The reference table's gemm_packed entries. */
void qi_k_gemm_packed_q4_0_ref(int64_t n, const void *w, size_t w_stride, int n_w, const void *a,
                               size_t a_stride, int n_a, float *y, size_t y_stride);
void qi_k_gemm_packed_q4_1_ref(int64_t n, const void *w, size_t w_stride, int n_w, const void *a,
                               size_t a_stride, int n_a, float *y, size_t y_stride);
void qi_k_gemm_packed_q8_0_ref(int64_t n, const void *w, size_t w_stride, int n_w, const void *a,
                               size_t a_stride, int n_a, float *y, size_t y_stride);
void qi_k_gemm_packed_q5_0_ref(int64_t n, const void *w, size_t w_stride, int n_w, const void *a,
                               size_t a_stride, int n_a, float *y, size_t y_stride);
void qi_k_gemm_packed_q5_1_ref(int64_t n, const void *w, size_t w_stride, int n_w, const void *a,
                               size_t a_stride, int n_a, float *y, size_t y_stride);
/* The AVX2 and AVX-512 tables' gemm_packed entries (kernels_avx2_packed.c,
 * kernels_avx512_packed.c; x86 with GCC or clang only). */
#define QI_K_PACKED_DECL(NAME) \
    void NAME(int64_t n, const void *w, size_t w_stride, int n_w, const void *a, size_t a_stride, int n_a, float *y, size_t y_stride);
QI_K_PACKED_DECL(qi_k_gemm_packed_q4_0_avx2)
QI_K_PACKED_DECL(qi_k_gemm_packed_q4_1_avx2)
QI_K_PACKED_DECL(qi_k_gemm_packed_q8_0_avx2)
QI_K_PACKED_DECL(qi_k_gemm_packed_q5_0_avx2)
QI_K_PACKED_DECL(qi_k_gemm_packed_q5_1_avx2)
QI_K_PACKED_DECL(qi_k_gemm_packed_q4_0_avx512)
QI_K_PACKED_DECL(qi_k_gemm_packed_q4_1_avx512)
QI_K_PACKED_DECL(qi_k_gemm_packed_q8_0_avx512)
QI_K_PACKED_DECL(qi_k_gemm_packed_q5_0_avx512)
QI_K_PACKED_DECL(qi_k_gemm_packed_q5_1_avx512)
#undef QI_K_PACKED_DECL

/* ---- the references (kernels_ref.c) -------------------------------------- */

/* One weight row . one activation row, n elements, llama.cpp's x86 order. */
float qi_k_dot_q4_0_ref(int64_t n, const void *w, const void *a);
float qi_k_dot_q4_1_ref(int64_t n, const void *w, const void *a);
float qi_k_dot_q5_0_ref(int64_t n, const void *w, const void *a);
float qi_k_dot_q5_1_ref(int64_t n, const void *w, const void *a);
float qi_k_dot_q8_0_ref(int64_t n, const void *w, const void *a);
float qi_k_dot_q4_K_ref(int64_t n, const void *w, const void *a);
float qi_k_dot_q6_K_ref(int64_t n, const void *w, const void *a);
/* The same dots in the order of llama.cpp's tiled matmul (gemm_wide). */
float qi_k_dot_q4_K_tiled_ref(int64_t n, const void *w, const void *a);
float qi_k_dot_q6_K_tiled_ref(int64_t n, const void *w, const void *a);

/* ggml_vec_dot_f16 (VEC) or tinyBLAS (GEMM) order over n elements; GEMM
 * needs n % 16 == 0. */
float qi_k_dot_f16_ref(qi_k_order ord, int64_t n, const uint16_t *x, const uint16_t *y);

/* The table entries' references (see qi_kernels for the contracts). */
void qi_k_attn_scores_ref(qi_k_order ord, int D, const uint16_t *q16, const uint16_t *k,
                          size_t k_stride, int n_pos, float *s);
void qi_k_softmax_f16_ref(int n, float *s, uint16_t *w16);
double qi_k_exp_sum_ref(int n, float *s, float max);
void qi_k_attn_values_blk_ref(qi_k_order ord, int D, const uint16_t *w16, const uint16_t *const *blk,
                              int shift, size_t v_stride, int n_pos, float *out);
void qi_k_attn_values_ref(qi_k_order ord, int D, const uint16_t *w16, const uint16_t *v,
                          size_t v_stride, int n_pos, float *out);
void qi_k_rope_ref(float *x, int n_heads, int D, int n_pairs, int neox, const float *cs, const float *sn);
void qi_k_swiglu_ref(int64_t n, float *g, const float *u);
void qi_k_geglu_ref(int64_t n, float *g, const float *u);
/* ggml's GELU table: [65536] fp16 results indexed by fp16 input bits. */
const uint16_t *qi_k_gelu_table(void);

void qi_k_f16_to_f32_ref(const uint16_t *x, float *y, int64_t n);
void qi_k_f32_to_f16_ref(const float *x, uint16_t *y, int64_t n);

/* llama.cpp's x86 activation quantiser for Q8_0 (with_sum 0) / Q8_1 (1). */
void qi_k_quantize_q8_ref(const float *x, void *dst, int64_t n, int with_sum);

/* One lane of ggml_v_expf (the AVX-512 version): exp(x) within 3 ulp for
 * normal results (2.14 the worst seen), 0 below about -104, +inf above 88.7. */
float qi_k_expf_ref(float x);

/* The horizontal sums of the x86 code: hsum_float_8 (8 lanes) and
 * _mm512_reduce_add_ps (16 lanes), as trees of float additions. */
float qi_k_hsum8_ref(const float a[8]);
float qi_k_hsum16_ref(const float a[16]);

#endif

/* test_sparse.c - the sparse-input matmul (engine/kernels/sparse.h).
 *
 *   - the column form holds the same matrix: every element equals
 *     qi_dequantize_row_ref's, for every type with codes, on random rows
 *     (the values of random floats quantised, and random block bytes with
 *     the scale fields made finite); the legacy types' scales held as
 *     fp16, and the product the same with them widened to floats;
 *   - the product: the AVX2 and AVX-512 versions equal the plain-C
 *     reference bit for bit (each skipped, and said so, where the CPU
 *     lacks it), and the reference is within 2^-17 of sum |x_j| max |w_ij|
 *     of a double product, on random inputs with random masks at every
 *     density from 0 to 1, edge sizes (one group, a partial last group in
 *     the row range, 1..70 tokens, rows in ranges, row counts around the
 *     AVX-512 version's blocks of 128);
 *   - columns updated in place (qi_colw_update) equal a column form built
 *     afresh, byte for byte (qi_colw_equal), for every type; bad column
 *     ranges refused;
 *   - the union of active columns over a batch, the threshold that makes
 *     it (-0, NaN, values at the threshold); matrices without a column
 *     form refused.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/sparse.h"
#include "qinfer/quant.h"
#include "qinfer/types.h"
#include "testutil.h"

static const uint32_t k_types[] = {QI_TYPE_Q4_0, QI_TYPE_Q4_1, QI_TYPE_Q5_0, QI_TYPE_Q5_1,
                                   QI_TYPE_Q8_0, QI_TYPE_Q4_K, QI_TYPE_Q5_K, QI_TYPE_Q6_K};
#define N_TYPES (int)(sizeof k_types / sizeof k_types[0])

static const char *tname(uint32_t t) { return qi_type_get(t)->name; }

/* A random n_out x n_in matrix of type t: rows of random floats quantised. */
static qi_weight make_weight(uint32_t t, int64_t n_out, int64_t n_in, uint64_t *st) {
    const size_t rb = qi_row_bytes(t, n_in);
    ck_assert_uint_gt(rb, 0);
    unsigned char *data = malloc(rb * (size_t)n_out);
    float *row = malloc(sizeof(float) * (size_t)n_in);
    for (int64_t i = 0; i < n_out; i++) {
        const float scale = 0.05f + 2.0f * (qi_test_randf(st) + 1.0f);
        for (int64_t j = 0; j < n_in; j++) row[j] = scale * qi_test_randf(st);
        qi_quantize_row_ref(t, row, data + (size_t)i * rb, n_in);
    }
    free(row);
    return (qi_weight){.type = t, .n_cols = n_in, .n_rows = n_out, .row_bytes = rb, .data = data};
}

static float *dequant(const qi_weight *w) {
    float *d = malloc(sizeof(float) * (size_t)(w->n_rows * w->n_cols));
    for (int64_t i = 0; i < w->n_rows; i++)
        qi_dequantize_row_ref(w->type, (const char *)w->data + (size_t)i * w->row_bytes, d + i * w->n_cols,
                              w->n_cols);
    return d;
}

static void check_values(const qi_weight *w, const char *what) {
    qi_colw c;
    qi_err e = {0};
    ck_assert_msg(qi_colw_build(w, &c, &e) == QI_OK, "%s", e.msg);
    float *d = dequant(w);
    for (int64_t i = 0; i < w->n_rows; i++)
        for (int64_t j = 0; j < w->n_cols; j++) {
            const float want = d[i * w->n_cols + j], got = qi_colw_value(&c, i, j);
            if (got != want) /* ck_abort: no assertion bookkeeping for each element */
                ck_abort_msg("%s %s [%lld][%lld]: column form %.9g, dequantised %.9g", tname(w->type), what,
                             (long long)i, (long long)j, got, want);
        }
    ck_assert_uint_eq(qi_colw_bytes(&c), c.col_bytes * (size_t)c.n_in +
                                             (size_t)(c.n_in / c.group) * (size_t)c.n_out *
                                                 (c.scale_h ? 2 : sizeof(float)) * (c.min || c.min_h ? 2 : 1));
    /* the legacy types' scales (fp16 in their blocks) are held as fp16 */
    const uint32_t t = w->type;
    if (t == QI_TYPE_Q4_0 || t == QI_TYPE_Q4_1 || t == QI_TYPE_Q5_0 || t == QI_TYPE_Q5_1 || t == QI_TYPE_Q8_0)
        ck_assert_msg(c.scale_h && !c.scale && (c.min_h != NULL) == (t == QI_TYPE_Q4_1 || t == QI_TYPE_Q5_1),
                      "%s: scales not held as fp16", tname(t));
    free(d);
    qi_colw_free(&c);
}

START_TEST(column_form_exact) {
    uint64_t st = 7;
    for (int k = 0; k < N_TYPES; k++) {
        const uint32_t t = k_types[k];
        const int64_t blk = t == QI_TYPE_Q4_K || t == QI_TYPE_Q5_K || t == QI_TYPE_Q6_K ? 256 : 32;
        for (int s = 0; s < 3; s++) {
            const int64_t n_out = 32 * (1 + s * 2), n_in = blk * (1 + s);
            qi_weight w = make_weight(t, n_out, n_in, &st);
            check_values(&w, "quantised floats");
            /* random block bytes: every code pattern, scales made finite */
            unsigned char *b = (unsigned char *)w.data;
            for (size_t i = 0; i < w.row_bytes * (size_t)n_out; i++) b[i] = (unsigned char)qi_test_rand(&st);
            for (int64_t r = 0; r < n_out; r++)
                for (int64_t i = 0; i < n_in / blk; i++) {
                    unsigned char *blkp = b + (size_t)r * w.row_bytes + (size_t)i * (w.row_bytes / (size_t)(n_in / blk));
                    uint16_t h[2] = {qi_f32_to_fp16(0.01f * (qi_test_randf(&st) + 1.5f)),
                                     qi_f32_to_fp16(0.02f * qi_test_randf(&st))};
                    if (t == QI_TYPE_Q6_K)
                        memcpy(blkp + 208, h, 2); /* d last */
                    else
                        memcpy(blkp, h, t == QI_TYPE_Q4_1 || t == QI_TYPE_Q5_1 || t == QI_TYPE_Q4_K ||
                                                t == QI_TYPE_Q5_K
                                            ? 4
                                            : 2);
                }
            check_values(&w, "random bytes");
            free((void *)w.data);
        }
    }
}
END_TEST

/* Columns rewritten in place (a neuron swap moves another neuron's blocks
 * into a position of a gathered down): the updated column form equals one
 * built afresh, byte for byte; columns that are not whole blocks of the
 * same shape are refused. */
START_TEST(column_update) {
    uint64_t st = 19;
    for (int k = 0; k < N_TYPES; k++) {
        const uint32_t t = k_types[k];
        const int64_t blk = t == QI_TYPE_Q4_K || t == QI_TYPE_Q5_K || t == QI_TYPE_Q6_K ? 256 : 32;
        const int64_t n_out = 64, n_in = 3 * blk;
        qi_weight w = make_weight(t, n_out, n_in, &st), v = make_weight(t, n_out, n_in, &st);
        qi_colw c, f;
        qi_err e = {0};
        ck_assert_int_eq(qi_colw_build(&w, &c, &e), QI_OK);
        const size_t bb = qi_type_get(t)->size;
        for (int round = 0; round < 3; round++) {
            const int64_t b = round % 3; /* block b of every row from v's block (2 - b) */
            for (int64_t r = 0; r < n_out; r++)
                memcpy((char *)w.data + (size_t)r * w.row_bytes + (size_t)b * bb,
                       (const char *)v.data + (size_t)r * v.row_bytes + (size_t)(2 - b) * bb, bb);
            ck_assert_msg(qi_colw_update(&c, &w, b * blk, blk, &e) == QI_OK, "%s", e.msg);
            ck_assert_int_eq(qi_colw_build(&w, &f, &e), QI_OK);
            ck_assert_msg(qi_colw_same(&c, &f), "%s: block %lld updated is not the column form built afresh", tname(t),
                          (long long)b);
            ck_assert(!c.scale_h == !f.scale_h); /* the same storage too */
            /* and a changed scale or code is told apart */
            const uint16_t h0 = c.scale_h ? c.scale_h[0] : 0;
            const float s0 = c.scale_h ? 0.0f : c.scale[0];
            if (c.scale_h) c.scale_h[0] ^= 1; else c.scale[0] = nextafterf(s0, INFINITY);
            ck_assert(!qi_colw_same(&c, &f));
            if (c.scale_h) c.scale_h[0] = h0; else c.scale[0] = s0;
            c.codes[c.col_bytes * (size_t)b * (size_t)blk] ^= 1;
            ck_assert(!qi_colw_same(&c, &f));
            c.codes[c.col_bytes * (size_t)b * (size_t)blk] ^= 1;
            qi_colw_free(&f);
        }
        /* refusals: part of a block, past the end, another shape */
        ck_assert_int_eq(qi_colw_update(&c, &w, blk / 2, blk, &e), QI_ERR_INVALID);
        ck_assert_msg(strstr(e.msg, "whole blocks"), "%s", e.msg);
        ck_assert_int_eq(qi_colw_update(&c, &w, 2 * blk, 2 * blk, NULL), QI_ERR_INVALID);
        qi_weight x = w;
        x.n_rows = 32;
        ck_assert_int_eq(qi_colw_update(&c, &x, 0, blk, NULL), QI_ERR_INVALID);
        qi_colw_free(&c);
        free((void *)w.data);
        free((void *)v.data);
    }
    /* a q4_K matrix whose scales all happen to be fp16 (every packed
     * sub-block scale and offset 1) is held as fp16; a column of ordinary
     * scales turns it back to floats, still the matrix built afresh */
    const int64_t n_out = 64, n_in = 512;
    qi_weight w = make_weight(QI_TYPE_Q4_K, n_out, n_in, &st), v = make_weight(QI_TYPE_Q4_K, n_out, n_in, &st);
    const size_t bb = qi_type_get(QI_TYPE_Q4_K)->size;
    for (int64_t r = 0; r < n_out; r++)
        for (int b = 0; b < 2; b++) {
            unsigned char *p = (unsigned char *)w.data + (size_t)r * w.row_bytes + (size_t)b * bb;
            memset(p + 4, 0x01, 12);
        }
    qi_colw c, f;
    qi_err e = {0};
    ck_assert_int_eq(qi_colw_build(&w, &c, &e), QI_OK);
    ck_assert_ptr_nonnull(c.scale_h);
    for (int64_t r = 0; r < n_out; r++)
        memcpy((char *)w.data + (size_t)r * w.row_bytes + bb, (const char *)v.data + (size_t)r * v.row_bytes, bb);
    ck_assert_msg(qi_colw_update(&c, &w, 256, 256, &e) == QI_OK, "%s", e.msg);
    ck_assert_ptr_null(c.scale_h);
    ck_assert_ptr_nonnull(c.scale);
    ck_assert_int_eq(qi_colw_build(&w, &f, &e), QI_OK);
    ck_assert_msg(qi_colw_same(&c, &f), "q4_K widened: not the column form built afresh");
    qi_colw_free(&c);
    qi_colw_free(&f);
    free((void *)w.data);
    free((void *)v.data);
}
END_TEST

START_TEST(unsupported) {
    qi_colw c;
    qi_err e = {0};
    uint64_t st = 3;
    qi_weight w = make_weight(QI_TYPE_Q8_0, 40, 64, &st); /* 40 rows: not a multiple of 32 */
    ck_assert(!qi_colw_supported(&w));
    ck_assert_int_eq(qi_colw_build(&w, &c, &e), QI_ERR_UNSUPPORTED);
    ck_assert_msg(strstr(e.msg, "q8_0") && strstr(e.msg, "40 x 64"), "%s", e.msg);
    free((void *)w.data);
    float f[32 * 32] = {0};
    const qi_weight wf = {.type = QI_TYPE_F32, .n_cols = 32, .n_rows = 32, .row_bytes = 128, .data = f};
    ck_assert(!qi_colw_supported(&wf));
    ck_assert_int_eq(qi_colw_build(&wf, &c, &e), QI_ERR_UNSUPPORTED);
    ck_assert_int_eq(qi_code_group(QI_TYPE_F16), 0);
}
END_TEST

START_TEST(active_union) {
    float x[3][8] = {{0, 1, 0, 0, 0, 0, 0, 2}, {0, 0, 0, -3, 0, 0, 0, 0}, {0, 0, 0, 0, 0, 0, 0, 0}};
    int32_t idx[8];
    ck_assert_int_eq(qi_sparse_active(&x[0][0], 8, 3, 8, idx), 3);
    ck_assert_int_eq(idx[0], 1);
    ck_assert_int_eq(idx[1], 3);
    ck_assert_int_eq(idx[2], 7);
    ck_assert_int_eq(qi_sparse_active(&x[2][0], 8, 1, 8, idx), 0);
    ck_assert_int_eq(qi_sparse_active(&x[0][0], 8, 1, 8, idx), 2);
}
END_TEST

/* The threshold against its definition: zeroed where |x| <= thr (-0 and
 * values at the threshold too, NaN kept), then the active columns. */
START_TEST(threshold_then_active) {
    uint64_t st = 17;
    for (int T = 1; T <= 3; T++)
        for (int rep = 0; rep < 20; rep++) {
            const int64_t n = 1 + (int64_t)(qi_test_rand(&st) % 200);
            float *x = malloc(sizeof(float) * (size_t)(T * n)), *want = malloc(sizeof(float) * (size_t)(T * n));
            int32_t *idx = malloc(sizeof(int32_t) * (size_t)n), *idx_want = malloc(sizeof(int32_t) * (size_t)n);
            const float thr = rep % 5 == 0 ? 0.0f : 0.5f;
            for (int64_t i = 0; i < T * n; i++) {
                const uint64_t u = qi_test_rand(&st) % 8;
                x[i] = u == 0 ? 0.0f : u == 1 ? -0.0f : u == 2 ? thr : u == 3 ? NAN : qi_test_randf(&st);
            }
            long z_want = 0;
            for (int64_t i = 0; i < T * n; i++) {
                want[i] = fabsf(x[i]) <= thr ? 0.0f : x[i];
                z_want += fabsf(x[i]) <= thr;
            }
            const int k_want = qi_sparse_active(want, (size_t)n, T, n, idx_want);
            long z = 7;
            const int k = qi_sparse_threshold(x, (size_t)n, T, n, thr, idx, &z);
            ck_assert_int_eq(k, k_want);
            ck_assert_int_eq(z, 7 + z_want);
            ck_assert(memcmp(idx, idx_want, sizeof(int32_t) * (size_t)k) == 0);
            ck_assert(memcmp(x, want, sizeof(float) * (size_t)(T * n)) == 0);
            free(x), free(want), free(idx), free(idx_want);
        }
}
END_TEST

/* x[T][n_in] with each element zero with probability 1 - density (the
 * zeros shared by no token in particular). */
static void random_x(float *x, int T, int64_t n, double density, uint64_t *st) {
    for (int t = 0; t < T; t++)
        for (int64_t j = 0; j < n; j++) {
            const double u = (qi_test_randf(st) + 1.0) / 2.0;
            x[t * n + j] = u < density ? 3.0f * qi_test_randf(st) : 0.0f;
        }
}

/* The SIMD versions, NULL where the CPU lacks one. */
static qi_sparse_fn simd_fn(int v) { return v == 0 ? qi_sparse_matmul_avx2() : qi_sparse_matmul_avx512(); }
static const char *const simd_name[2] = {"avx2", "avx512"};

/* Rows [r0, r1) of the product on random inputs of the density: every
 * SIMD version equal to the reference bit for bit, the rows outside left
 * alone, and with vs_double the reference within rounding of a double
 * product (established once per type, density and token count; the
 * storage and row-block cases check the SIMD versions against it). Each
 * element is checked with ck_abort_msg on failure alone: ck_assert's
 * bookkeeping for every one of millions of elements made this test
 * several times slower. */
static void check_product(const qi_weight *w, const qi_colw *c, const float *dq, int T, double density,
                          int64_t r0, int64_t r1, bool vs_double, uint64_t *st, long *n_checked) {
    const int64_t n_in = w->n_cols, n_out = w->n_rows;
    float *x = malloc(sizeof(float) * (size_t)(T * n_in));
    random_x(x, T, n_in, density, st);
    int32_t *idx = malloc(sizeof(int32_t) * (size_t)n_in);
    const int n_idx = qi_sparse_active(x, (size_t)n_in, T, n_in, idx);
    float *yr = malloc(sizeof(float) * (size_t)(T * n_out)), *ys = malloc(sizeof(float) * (size_t)(T * n_out));
    for (int64_t i = 0; i < T * n_out; i++) yr[i] = 12345.0f; /* rows outside [r0, r1) stay */
    qi_sparse_matmul_ref(c, x, (size_t)n_in, T, idx, n_idx, yr, (size_t)n_out, r0, r1);
    for (int v = 0; v < 2; v++) {
        const qi_sparse_fn simd = simd_fn(v);
        if (!simd) continue;
        for (int64_t i = 0; i < T * n_out; i++) ys[i] = 12345.0f;
        simd(c, x, (size_t)n_in, T, idx, n_idx, ys, (size_t)n_out, r0, r1);
        for (int t = 0; t < T; t++)
            for (int64_t i = 0; i < n_out; i++) {
                const float want = yr[t * n_out + i], got = ys[t * n_out + i];
                if (memcmp(&got, &want, sizeof got) != 0)
                    ck_abort_msg("%s n_out %lld rows [%lld, %lld) T=%d density %.2f: y[%d][%lld] %s %.9g, reference "
                                 "%.9g", tname(w->type), (long long)n_out, (long long)r0, (long long)r1, T, density,
                                 t, (long long)i, simd_name[v], got, want);
            }
    }
    for (int t = 0; t < T; t++)
        for (int64_t i = 0; i < n_out; i++) {
            const float got = yr[t * n_out + i];
            if (i < r0 || i >= r1) {
                if (got != 12345.0f)
                    ck_abort_msg("row %lld outside [%lld, %lld) written", (long long)i, (long long)r0, (long long)r1);
                continue;
            }
            (*n_checked)++;
            if (!vs_double) continue;
            double want = 0.0, sx = 0.0, wmax = 0.0;
            for (int64_t j = 0; j < n_in; j++) {
                want += (double)x[t * n_in + j] * dq[i * n_in + j];
                sx += fabs((double)x[t * n_in + j]);
                wmax = fmax(wmax, fabs((double)dq[i * n_in + j]));
            }
            /* float sums of up to 512 terms, each scale * code and offset
             * as large as the row's largest element or so: 2^-17 of
             * sum |x| max |w| (one wrong element is off by |x w|, about
             * 1/n of it) */
            if (!(fabs(got - want) <= 0x1p-17 * sx * wmax))
                ck_abort_msg("%s T=%d density %.2f: y[%d][%lld] = %.9g, double %.9g (sum |x| max |w| %.3g)",
                             tname(w->type), T, density, t, (long long)i, got, want, sx * wmax);
        }
    free(x), free(idx), free(yr), free(ys);
}

/* The same column form with its scales held as floats (c's fp16 ones
 * widened), to run the float-held code on every type. */
static qi_colw widened(const qi_colw *c) {
    qi_colw f = *c;
    const size_t ns = (size_t)(c->n_in / c->group) * (size_t)c->n_out;
    f.codes = malloc(c->col_bytes * (size_t)c->n_in);
    memcpy(f.codes, c->codes, c->col_bytes * (size_t)c->n_in);
    f.scale = malloc(sizeof(float) * ns);
    f.min = c->min || c->min_h ? malloc(sizeof(float) * ns) : NULL;
    for (size_t i = 0; i < ns; i++) {
        f.scale[i] = c->scale_h ? qi_fp16_to_f32(c->scale_h[i]) : c->scale[i];
        if (f.min) f.min[i] = c->min_h ? qi_fp16_to_f32(c->min_h[i]) : c->min[i];
    }
    f.scale_h = f.min_h = NULL;
    return f;
}

START_TEST(product_against_reference) {
    static const double dens[] = {0.0, 0.01, 0.1, 0.3, 0.5, 0.7, 0.9, 1.0};
    static const int Ts[] = {1, 2, 3, 7, 16, 70};
    uint64_t st = 11;
    long n = 0;
    for (int k = 0; k < N_TYPES; k++) {
        const uint32_t t = k_types[k];
        const bool kq = t == QI_TYPE_Q4_K || t == QI_TYPE_Q5_K || t == QI_TYPE_Q6_K;
        const int64_t n_in = kq ? 512 : 96, n_out = 96;
        qi_weight w = make_weight(t, n_out, n_in, &st);
        qi_colw c;
        qi_err e = {0};
        ck_assert_int_eq(qi_colw_build(&w, &c, &e), QI_OK);
        float *dq = dequant(&w);
        for (size_t d = 0; d < sizeof dens / sizeof dens[0]; d++)
            for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) {
                check_product(&w, &c, dq, Ts[ti], dens[d], 0, n_out, true, &st, &n);
                check_product(&w, &c, dq, Ts[ti], dens[d], 32, 64, true, &st, &n);
            }
        if (c.scale_h) { /* and held as floats */
            qi_colw f = widened(&c);
            ck_assert_uint_eq(qi_colw_bytes(&f), qi_colw_bytes(&c) + (qi_colw_bytes(&c) - c.col_bytes * (size_t)n_in));
            for (size_t d = 0; d < sizeof dens / sizeof dens[0]; d++)
                for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++)
                    check_product(&w, &f, dq, Ts[ti], dens[d], 0, n_out, false, &st, &n);
            qi_colw_free(&f);
        }
        free(dq);
        qi_colw_free(&c);
        free((void *)w.data);
    }
    for (int v = 0; v < 2; v++)
        printf("sparse matmul: %ld outputs checked (%s)\n", n,
               simd_fn(v) ? v ? "avx512 bit for bit against the reference" : "avx2 bit for bit against the reference"
                          : v ? "avx512 skipped: not on this CPU" : "avx2 skipped: not on this CPU");
}
END_TEST

/* Row counts around the AVX-512 version's blocks of 128 rows (one token)
 * and 32 (more), with ranges starting and ending inside and between them. */
START_TEST(product_row_blocks) {
    static const double dens[] = {0.0, 0.3, 0.7, 1.0};
    static const int Ts[] = {1, 2, 9};
    static const int64_t outs[] = {32, 128, 160, 224, 256, 288};
    uint64_t st = 13;
    long n = 0;
    for (int k = 0; k < N_TYPES; k++) {
        const uint32_t t = k_types[k];
        const bool kq = t == QI_TYPE_Q4_K || t == QI_TYPE_Q5_K || t == QI_TYPE_Q6_K;
        for (size_t o = 0; o < sizeof outs / sizeof outs[0]; o++) {
            const int64_t n_in = kq ? 256 : 64, n_out = outs[o];
            qi_weight w = make_weight(t, n_out, n_in, &st);
            qi_colw c;
            qi_err e = {0};
            ck_assert_int_eq(qi_colw_build(&w, &c, &e), QI_OK);
            float *dq = dequant(&w);
            const int64_t ranges[][2] = {{0, n_out}, {32, n_out}, {0, n_out - 32}, {n_out > 64 ? 64 : 0, n_out}};
            for (size_t d = 0; d < sizeof dens / sizeof dens[0]; d++)
                for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++)
                    for (size_t r = 0; r < sizeof ranges / sizeof ranges[0]; r++)
                        if (ranges[r][0] < ranges[r][1])
                            check_product(&w, &c, dq, Ts[ti], dens[d], ranges[r][0], ranges[r][1], false, &st, &n);
            free(dq);
            qi_colw_free(&c);
            free((void *)w.data);
        }
    }
    printf("sparse matmul, row blocks: %ld outputs checked\n", n);
}
END_TEST

/* A planted fault is caught: a code flipped in the column form. */
START_TEST(fault_caught) {
    uint64_t st = 5;
    qi_weight w = make_weight(QI_TYPE_Q4_1, 32, 64, &st);
    qi_colw c;
    qi_err e = {0};
    ck_assert_int_eq(qi_colw_build(&w, &c, &e), QI_OK);
    float *dq = dequant(&w);
    c.codes[3] ^= 0x10;                /* column 0 (group 0), one row */
    c.scale_h[1 * 32 + 7] ^= 0x0400;   /* group 1, row 7: its scale doubled or halved */
    int bad[2] = {0, 0};
    for (int64_t i = 0; i < 32; i++)
        for (int64_t j = 0; j < 64; j++) bad[j / 32] += qi_colw_value(&c, i, j) != dq[i * 64 + j];
    ck_assert_int_eq(bad[0], 1);
    ck_assert_int_ge(bad[1], 16); /* row 7's elements there whose code is not 0 */
    free(dq);
    qi_colw_free(&c);
    free((void *)w.data);
}
END_TEST

int main(void) {
    Suite *s = suite_create("sparse");
    TCase *tc = tcase_create("sparse");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, column_form_exact);
    tcase_add_test(tc, column_update);
    tcase_add_test(tc, unsupported);
    tcase_add_test(tc, active_union);
    tcase_add_test(tc, threshold_then_active);
    tcase_add_test(tc, product_against_reference);
    tcase_add_test(tc, product_row_blocks);
    tcase_add_test(tc, fault_caught);
    suite_add_tcase(s, tc);
    return qi_test_run_suite(s);
}

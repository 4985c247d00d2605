/* sparse.c - the column form and the sparse-input matmul (sparse.h): the
 * plain-C reference, then AVX2 and AVX-512 versions compiled with target
 * attributes (no global flags) and chosen at run time, each equal to the
 * reference bit for bit. */
#include "sparse.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define QI_SPARSE_X86 1
#endif

#include "qinfer/quant.h"
#include "qinfer/types.h"

bool qi_colw_supported(const qi_weight *w) {
    return w && qi_code_group(w->type) > 0 && w->n_rows > 0 && w->n_rows % 32 == 0 && w->n_cols > 0 &&
           qi_row_bytes(w->type, w->n_cols) == w->row_bytes;
}

void qi_colw_free(qi_colw *c) {
    if (!c) return;
    qi_free(c->codes);
    qi_free(c->scale);
    qi_free(c->min);
    qi_free(c->scale_h);
    qi_free(c->min_h);
    memset(c, 0, sizeof *c);
}

size_t qi_colw_bytes(const qi_colw *c) {
    const size_t groups = c->group ? (size_t)(c->n_in / c->group) : 0;
    return c->col_bytes * (size_t)c->n_in + groups * (size_t)c->n_out * (c->scale_h ? 2 : sizeof(float)) *
                                                (c->min || c->min_h ? 2 : 1);
}

/* Scale (min) number k of the column form, whichever way it is held. */
static inline float scale_at(const qi_colw *c, size_t k) {
    return c->scale_h ? qi_fp16_to_f32(c->scale_h[k]) : c->scale[k];
}
static inline float min_at(const qi_colw *c, size_t k) { return c->min_h ? qi_fp16_to_f32(c->min_h[k]) : c->min[k]; }
static inline bool has_offset(const qi_colw *c) { return c->min || c->min_h; }

/* Every value of f[0 .. n) exactly an fp16 (its bits back through one). */
static bool all_half(const float *f, size_t n) {
    for (size_t i = 0; i < n; i++) {
        const float b = qi_fp16_to_f32(qi_f32_to_fp16(f[i]));
        if (memcmp(&b, &f[i], sizeof b) != 0) return false;
    }
    return true;
}

/* *f (n floats) to fp16 in *h where all are exact, *f freed; false for
 * no memory. */
static bool to_half(float **f, uint16_t **h, size_t n) {
    *h = qi_malloc(n * sizeof **h);
    if (!*h) return false;
    for (size_t i = 0; i < n; i++) (*h)[i] = qi_f32_to_fp16((*f)[i]);
    qi_free(*f);
    *f = NULL;
    return true;
}

static bool has_min(uint32_t type) {
    return type == QI_TYPE_Q4_1 || type == QI_TYPE_Q5_1 || type == QI_TYPE_Q4_K || type == QI_TYPE_Q5_K;
}

/* Columns [j0, j0 + n) of c from the same columns of w, every row: the
 * codes of w's blocks there (whole blocks: j0 and n multiples of the
 * type's block) and their groups' scales and offsets. code, sc and mn hold
 * n and n / G entries. False when c holds fp16 and a scale or offset is
 * not exactly one (columns then part written). */
static bool fill_cols(qi_colw *c, const qi_weight *w, int64_t j0, int64_t n, int8_t *code, float *sc, float *mn) {
    const qi_type_info *ti = qi_type_get(w->type);
    const size_t src_off = (size_t)(j0 / (int64_t)ti->blck) * ti->size, n_out = (size_t)c->n_out;
    const size_t g0 = (size_t)(j0 / c->group), groups = (size_t)(n / c->group);
    for (int64_t i = 0; i < c->n_out; i++) {
        const bool ok = qi_row_codes(w->type, (const char *)w->data + (uint64_t)i * w->row_bytes + src_off, n, code,
                                     sc, mn);
        QI_ASSERT(ok);
        for (size_t g = 0; g < groups; g++) {
            const size_t k = (g0 + g) * n_out + (size_t)i;
            if (c->scale_h) {
                if (!all_half(&sc[g], 1) || (c->min_h && !all_half(&mn[g], 1))) return false;
                c->scale_h[k] = qi_f32_to_fp16(sc[g]);
                if (c->min_h) c->min_h[k] = qi_f32_to_fp16(mn[g]);
            } else {
                c->scale[k] = sc[g];
                if (c->min) c->min[k] = mn[g];
            }
        }
        const int64_t ch = i / 32, k = i % 32;
        for (int64_t j = 0; j < n; j++) {
            uint8_t *col = c->codes + (size_t)(j0 + j) * c->col_bytes;
            if (c->bits == 8) {
                col[i] = (uint8_t)code[j];
            } else {
                const uint8_t v = (uint8_t)(code[j] + c->bias);
                uint8_t *byte = col + 16 * ch + (k & 15);
                *byte = (uint8_t)(k < 16 ? (*byte & 0xf0) | v : (*byte & 0x0f) | (v << 4));
            }
        }
    }
    return true;
}

/* *h (n fp16) back to floats in *f, *h freed; false for no memory. */
static bool to_float(uint16_t **h, float **f, size_t n) {
    *f = qi_malloc(n * sizeof **f);
    if (!*f) return false;
    for (size_t i = 0; i < n; i++) (*f)[i] = qi_fp16_to_f32((*h)[i]);
    qi_free(*h);
    *h = NULL;
    return true;
}

qi_status qi_colw_build(const qi_weight *w, qi_colw *out, qi_err *err) {
    memset(out, 0, sizeof *out);
    if (!qi_colw_supported(w))
        return QI_ERR(err, QI_ERR_UNSUPPORTED, "sparse matmul: no column form for a %s matrix of %lld x %lld",
                      w && qi_type_get(w->type) ? qi_type_get(w->type)->name : "missing", w ? (long long)w->n_rows : 0LL,
                      w ? (long long)w->n_cols : 0LL);
    const int64_t n_in = w->n_cols, n_out = w->n_rows;
    const int G = qi_code_group(w->type);
    qi_colw c = {.type = w->type, .n_in = n_in, .n_out = n_out, .group = G, .bits = qi_code_bits(w->type),
                 .bias = qi_code_bias(w->type)};
    c.col_bytes = c.bits == 4 ? (size_t)n_out / 2 : (size_t)n_out;
    const size_t groups = (size_t)(n_in / G);
    c.codes = qi_calloc((size_t)n_in, c.col_bytes);
    c.scale = qi_malloc(groups * (size_t)n_out * sizeof(float));
    if (has_min(w->type)) c.min = qi_malloc(groups * (size_t)n_out * sizeof(float));
    int8_t *code = qi_malloc((size_t)n_in);
    float *sc = qi_malloc(groups * sizeof(float)), *mn = qi_malloc(groups * sizeof(float));
    if (!c.codes || !c.scale || (has_min(w->type) && !c.min) || !code || !sc || !mn) {
        qi_free(code), qi_free(sc), qi_free(mn);
        qi_colw_free(&c);
        return QI_ERR(err, QI_ERR_NOMEM, "sparse matmul: out of memory for the column form of a %lld x %lld matrix",
                      (long long)n_out, (long long)n_in);
    }
    const bool filled = fill_cols(&c, w, 0, n_in, code, sc, mn);
    QI_ASSERT(filled); /* floats hold anything */
    qi_free(code), qi_free(sc), qi_free(mn);
    const size_t ns = groups * (size_t)n_out;
    if (all_half(c.scale, ns) && (!c.min || all_half(c.min, ns)) &&
        (!to_half(&c.scale, &c.scale_h, ns) || (c.min && !to_half(&c.min, &c.min_h, ns)))) {
        qi_colw_free(&c);
        return QI_ERR(err, QI_ERR_NOMEM, "sparse matmul: out of memory for the column form of a %lld x %lld matrix",
                      (long long)n_out, (long long)n_in);
    }
    *out = c;
    return QI_OK;
}

qi_status qi_colw_update(qi_colw *c, const qi_weight *w, int64_t j0, int64_t n, qi_err *err) {
    const qi_type_info *ti = qi_type_get(w->type);
    if (!c->codes || !ti || w->type != c->type || w->n_rows != c->n_out || w->n_cols != c->n_in || n < 1 || j0 < 0 ||
        j0 + n > c->n_in || j0 % (int64_t)ti->blck || n % (int64_t)ti->blck)
        return QI_ERR(err, QI_ERR_INVALID, "sparse matmul: columns [%lld, %lld) of a %s matrix of %lld x %lld cannot "
                      "update a column form of %lld x %lld (whole blocks of the same type and shape only)",
                      (long long)j0, (long long)(j0 + n), ti ? ti->name : "?", (long long)w->n_rows,
                      (long long)w->n_cols, (long long)c->n_out, (long long)c->n_in);
    int8_t *code = qi_malloc((size_t)n);
    float *sc = qi_malloc(sizeof(float) * (size_t)(n / c->group)), *mn = qi_malloc(sizeof(float) * (size_t)(n / c->group));
    if (!code || !sc || !mn) {
        qi_free(code), qi_free(sc), qi_free(mn);
        return QI_ERR(err, QI_ERR_NOMEM, "sparse matmul: out of memory updating %lld columns", (long long)n);
    }
    qi_status st = QI_OK;
    if (!fill_cols(c, w, j0, n, code, sc, mn)) {
        /* a value the fp16 storage cannot hold exactly: back to floats */
        const size_t ns = (size_t)(c->n_in / c->group) * (size_t)c->n_out;
        if (!to_float(&c->scale_h, &c->scale, ns) || (c->min_h && !to_float(&c->min_h, &c->min, ns)))
            st = QI_ERR(err, QI_ERR_NOMEM, "sparse matmul: out of memory widening a column form's scales");
        else {
            const bool filled = fill_cols(c, w, j0, n, code, sc, mn);
            QI_ASSERT(filled);
        }
    }
    qi_free(code), qi_free(sc), qi_free(mn);
    return st;
}

bool qi_colw_same(const qi_colw *a, const qi_colw *b) {
    if (a->type != b->type || a->n_in != b->n_in || a->n_out != b->n_out || a->group != b->group ||
        a->col_bytes != b->col_bytes || has_offset(a) != has_offset(b) ||
        memcmp(a->codes, b->codes, a->col_bytes * (size_t)a->n_in) != 0)
        return false;
    const size_t ns = (size_t)(a->n_in / a->group) * (size_t)a->n_out;
    for (size_t k = 0; k < ns; k++) {
        const float sa = scale_at(a, k), sb = scale_at(b, k);
        if (memcmp(&sa, &sb, sizeof sa) != 0) return false;
        if (has_offset(a)) {
            const float ma = min_at(a, k), mb = min_at(b, k);
            if (memcmp(&ma, &mb, sizeof ma) != 0) return false;
        }
    }
    return true;
}

static inline int code_at(const qi_colw *c, int64_t i, int64_t j) {
    const uint8_t *col = c->codes + (size_t)j * c->col_bytes;
    if (c->bits == 8) return (int8_t)col[i];
    const uint8_t b = col[16 * (i / 32) + (i % 16)];
    return (i % 32 < 16 ? b & 0x0f : b >> 4) - c->bias;
}

float qi_colw_value(const qi_colw *c, int64_t i, int64_t j) {
    const size_t g = (size_t)(j / c->group) * (size_t)c->n_out + (size_t)i;
    const float p = scale_at(c, g) * (float)code_at(c, i, j);
    return has_offset(c) ? p + min_at(c, g) : p;
}

int qi_sparse_active(const float *x, size_t x_stride, int T, int64_t n, int32_t *idx) {
    int k = 0;
    for (int64_t j = 0; j < n; j++)
        for (int t = 0; t < T; t++)
            if (x[(size_t)t * x_stride + (size_t)j] != 0.0f) {
                idx[k++] = (int32_t)j;
                break;
            }
    return k;
}

/* Without branches on the data: at the densities thresholds leave (a
 * quarter to three quarters kept) a branch per element mispredicts about
 * as often as not, which cost more than the rest of a step's bookkeeping. */
/* qi_sparse_threshold's one-token SIMD part: the first n (a multiple of
 * 16) elements; NULL where there is none. */
typedef int (*threshold1_fn)(float *x, int64_t n, float thr, int32_t *idx, long *n_zeroed);
static threshold1_fn threshold1(void);

int qi_sparse_threshold(float *x, size_t x_stride, int T, int64_t n, float thr, int32_t *idx, long *n_zeroed) {
    long z = 0;
    if (T == 1) {
        const threshold1_fn f = threshold1();
        int k = 0;
        int64_t j = 0;
        if (f) j = n / 16 * 16, k = f(x, j, thr, idx, &z);
        for (; j < n; j++) {
            const float v = x[j];
            const int keep = !(fabsf(v) <= thr);
            x[j] = keep ? v : 0.0f;
            idx[k] = (int32_t)j;
            k += keep;
            z += !keep;
        }
        *n_zeroed += z;
        return k;
    }
    for (int t = 0; t < T; t++) {
        float *xt = x + (size_t)t * x_stride;
        for (int64_t j = 0; j < n; j++) {
            const float v = xt[j];
            const int keep = !(fabsf(v) <= thr);
            xt[j] = keep ? v : 0.0f;
            z += !keep;
        }
    }
    *n_zeroed += z;
    return qi_sparse_active(x, x_stride, T, n, idx);
}

/* The end of group idx[p] / G's run of active columns. */
static inline int group_end(const int32_t *idx, int n_idx, int p, int G) {
    const int32_t g = idx[p] / G;
    int q = p + 1;
    while (q < n_idx && idx[q] / G == g) q++;
    return q;
}

void qi_sparse_matmul_ref(const qi_colw *w, const float *x, size_t x_stride, int T, const int32_t *idx, int n_idx,
                          float *y, size_t y_stride, int64_t r0, int64_t r1) {
    const int G = w->group;
    for (int t = 0; t < T; t++)
        for (int64_t i = r0; i < r1; i++) y[(size_t)t * y_stride + (size_t)i] = 0.0f;
    for (int p = 0; p < n_idx;) {
        const int q = group_end(idx, n_idx, p, G);
        const size_t g = (size_t)(idx[p] / G) * (size_t)w->n_out;
        for (int t = 0; t < T; t++) {
            const float *xt = x + (size_t)t * x_stride;
            float sx = 0.0f;
            for (int k = p; k < q; k++) sx = sx + xt[idx[k]];
            for (int64_t i = r0; i < r1; i++) {
                float acc = 0.0f;
                for (int k = p; k < q; k++) {
                    const float xv = xt[idx[k]];
                    if (xv != 0.0f) acc = fmaf(xv, (float)code_at(w, i, idx[k]), acc);
                }
                float *yi = y + (size_t)t * y_stride + (size_t)i;
                *yi = fmaf(scale_at(w, g + (size_t)i), acc, *yi);
                if (has_offset(w)) *yi = fmaf(min_at(w, g + (size_t)i), sx, *yi);
            }
        }
        p = q;
    }
}

#ifdef QI_SPARSE_X86
#define T2 __attribute__((target("avx2,fma,f16c")))

/* 8 scales (offsets) from k on, held as floats (f) or fp16 (h). */
T2 static inline __m256 ld8(const float *f, const uint16_t *h, size_t k) {
    return h ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + k))) : _mm256_loadu_ps(f + k);
}

/* Rows 32c .. 32c + 31 of column j as four vectors of 8 floats. */
T2 static inline void decode32(const qi_colw *w, int64_t j, int64_t i0, __m256 f[4]) {
    const uint8_t *col = w->codes + (size_t)j * w->col_bytes;
    __m256i v[4];
    if (w->bits == 8) {
        const uint8_t *p = col + i0;
        for (int k = 0; k < 4; k++) v[k] = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p + 8 * k)));
    } else {
        const __m128i b = _mm_loadu_si128((const __m128i *)(col + i0 / 2));
        const __m128i m = _mm_set1_epi8(0x0f);
        const __m128i lo = _mm_and_si128(b, m), hi = _mm_and_si128(_mm_srli_epi16(b, 4), m);
        const __m256i bias = _mm256_set1_epi32(w->bias);
        v[0] = _mm256_sub_epi32(_mm256_cvtepu8_epi32(lo), bias);
        v[1] = _mm256_sub_epi32(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8)), bias);
        v[2] = _mm256_sub_epi32(_mm256_cvtepu8_epi32(hi), bias);
        v[3] = _mm256_sub_epi32(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8)), bias);
    }
    for (int k = 0; k < 4; k++) f[k] = _mm256_cvtepi32_ps(v[k]);
}

/* One token, rows [i0, i0 + 64): eight accumulators in registers, so the
 * fused multiply-adds of one column do not wait on each other. */
T2 static void sparse64_t1(const qi_colw *w, const float *x, const int32_t *idx, int n_idx, float *y, int64_t i0) {
    const int G = w->group;
    const size_t n_out = (size_t)w->n_out;
    __m256 yv[8];
    for (int l = 0; l < 8; l++) yv[l] = _mm256_setzero_ps();
    const __m128i m4 = _mm_set1_epi8(0x0f);
    const __m256i bias = _mm256_set1_epi32(w->bias);
    for (int p = 0; p < n_idx;) {
        const int q = group_end(idx, n_idx, p, G);
        __m256 acc[8];
        for (int l = 0; l < 8; l++) acc[l] = _mm256_setzero_ps();
        float sx = 0.0f;
        for (int k = p; k < q; k++) {
            const float xv = x[idx[k]];
            sx = sx + xv;
            if (xv == 0.0f) continue;
            const __m256 xb = _mm256_set1_ps(xv);
            const uint8_t *col = w->codes + (size_t)idx[k] * w->col_bytes;
            __m256i v[8];
            if (w->bits == 8) {
                const uint8_t *c8 = col + i0;
                for (int l = 0; l < 8; l++)
                    v[l] = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(c8 + 8 * l)));
            } else {
                for (int h = 0; h < 2; h++) {
                    const __m128i b = _mm_loadu_si128((const __m128i *)(col + i0 / 2 + 16 * h));
                    const __m128i lo = _mm_and_si128(b, m4), hi = _mm_and_si128(_mm_srli_epi16(b, 4), m4);
                    v[4 * h + 0] = _mm256_sub_epi32(_mm256_cvtepu8_epi32(lo), bias);
                    v[4 * h + 1] = _mm256_sub_epi32(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8)), bias);
                    v[4 * h + 2] = _mm256_sub_epi32(_mm256_cvtepu8_epi32(hi), bias);
                    v[4 * h + 3] = _mm256_sub_epi32(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8)), bias);
                }
            }
            for (int l = 0; l < 8; l++) acc[l] = _mm256_fmadd_ps(xb, _mm256_cvtepi32_ps(v[l]), acc[l]);
        }
        const size_t g = (size_t)(idx[p] / G) * n_out + (size_t)i0;
        const __m256 sxb = _mm256_set1_ps(sx);
        for (int l = 0; l < 8; l++) {
            yv[l] = _mm256_fmadd_ps(ld8(w->scale, w->scale_h, g + 8 * l), acc[l], yv[l]);
            if (has_offset(w)) yv[l] = _mm256_fmadd_ps(ld8(w->min, w->min_h, g + 8 * l), sxb, yv[l]);
        }
        p = q;
    }
    for (int l = 0; l < 8; l++) _mm256_storeu_ps(y + i0 + 8 * l, yv[l]);
}

/* Token counts up to this keep their accumulators on the stack. */
#define SP_MAX_T 64

T2 static void sparse_avx2(const qi_colw *w, const float *x, size_t x_stride, int T, const int32_t *idx, int n_idx,
                           float *y, size_t y_stride, int64_t r0, int64_t r1) {
    if (T > SP_MAX_T) {
        for (int t0 = 0; t0 < T; t0 += SP_MAX_T)
            sparse_avx2(w, x + (size_t)t0 * x_stride, x_stride, T - t0 < SP_MAX_T ? T - t0 : SP_MAX_T, idx, n_idx,
                        y + (size_t)t0 * y_stride, y_stride, r0, r1);
        return;
    }
    if (T == 1)
        for (; r0 + 64 <= r1; r0 += 64) sparse64_t1(w, x, idx, n_idx, y, r0);
    const int G = w->group;
    const size_t n_out = (size_t)w->n_out;
    float sx[SP_MAX_T];
    __m256 acc[SP_MAX_T][4];
    for (int64_t i0 = r0; i0 < r1; i0 += 32) {
        __m256 yv[SP_MAX_T][4];
        for (int t = 0; t < T; t++)
            for (int k = 0; k < 4; k++) yv[t][k] = _mm256_setzero_ps();
        for (int p = 0; p < n_idx;) {
            const int q = group_end(idx, n_idx, p, G);
            const size_t g = (size_t)(idx[p] / G) * n_out + (size_t)i0;
            for (int t = 0; t < T; t++) {
                const float *xt = x + (size_t)t * x_stride;
                float s = 0.0f;
                for (int k = p; k < q; k++) s = s + xt[idx[k]];
                sx[t] = s;
                for (int k = 0; k < 4; k++) acc[t][k] = _mm256_setzero_ps();
            }
            for (int k = p; k < q; k++) {
                __m256 f[4];
                decode32(w, idx[k], i0, f);
                for (int t = 0; t < T; t++) {
                    const float xv = x[(size_t)t * x_stride + (size_t)idx[k]];
                    if (xv == 0.0f) continue;
                    const __m256 xb = _mm256_set1_ps(xv);
                    for (int l = 0; l < 4; l++) acc[t][l] = _mm256_fmadd_ps(xb, f[l], acc[t][l]);
                }
            }
            for (int l = 0; l < 4; l++) {
                const __m256 s = ld8(w->scale, w->scale_h, g + 8 * l);
                for (int t = 0; t < T; t++) yv[t][l] = _mm256_fmadd_ps(s, acc[t][l], yv[t][l]);
                if (has_offset(w)) {
                    const __m256 m = ld8(w->min, w->min_h, g + 8 * l);
                    for (int t = 0; t < T; t++) yv[t][l] = _mm256_fmadd_ps(m, _mm256_set1_ps(sx[t]), yv[t][l]);
                }
            }
            p = q;
        }
        for (int t = 0; t < T; t++)
            for (int l = 0; l < 4; l++) _mm256_storeu_ps(y + (size_t)t * y_stride + (size_t)i0 + 8 * l, yv[t][l]);
    }
}

qi_sparse_fn qi_sparse_matmul_avx2(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && qi_cpu_f16c()
               ? sparse_avx2
               : NULL;
}

/* ---- AVX-512 -------------------------------------------------------------
 *
 * A zmm holds 16 rows. 4-bit codes become floats by one permute each:
 * vpermps reads the low 4 bits of every index, so the 16 bytes of a chunk
 * (rows 32c + k low, 32c + 16 + k high), widened to dwords, index a table
 * of code - bias directly, and shifted right by 4 for the high nibbles; no
 * masking, no conversion. 8-bit codes are widened and converted.
 *
 * Within a group the fused multiply-adds of every token run, x zero or
 * not, for T > 1 (a branch per token and column mispredicts at every
 * density between the extremes): fma(0, c, acc) is acc + 0, acc exactly,
 * since acc, a sum started at +0, is never -0 (a sum of exact zero is +0
 * in round-to-nearest). So each row's arithmetic is still the
 * reference's. */
#define T5 __attribute__((target("avx512f,avx2,fma,f16c")))
#define INL inline __attribute__((always_inline))

/* 16 scales (offsets) from k on, held as floats (f) or fp16 (h). */
T5 static INL __m512 ld16(const float *f, const uint16_t *h, size_t k) {
    return h ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(h + k))) : _mm512_loadu_ps(f + k);
}

T5 static INL __m512 nib_table(int bias) {
    const __m512 k = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    return _mm512_sub_ps(k, _mm512_set1_ps((float)bias));
}

/* Rows i0 + 32c .. + 31 of column col (4-bit codes) as two vectors. */
T5 static INL void dec4(const uint8_t *col, int64_t i0, int c, __m512 tbl, __m512 *f0, __m512 *f1) {
    const __m512i z = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(col + i0 / 2 + 16 * c)));
    *f0 = _mm512_permutexvar_ps(z, tbl);
    *f1 = _mm512_permutexvar_ps(_mm512_srli_epi32(z, 4), tbl);
}

/* Rows i0 + 16l .. + 15 of column col (8-bit codes). */
T5 static INL __m512 dec8(const uint8_t *col, int64_t i0, int l) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(col + i0 + 16 * l))));
}

/* Prefetch distance in active columns: the same rows of the column one
 * group on, so the lines are there when the sweep comes back to those
 * rows (the columns' lines, a stride apart, are not a stream the hardware
 * prefetchers follow in a small matrix). */
#define PF_COLS 32

/* One token, one group's active columns idx[p .. q), rows [i0, i0 + 32 NB)
 * with NB <= 4: 2 NB accumulators in registers, then y there updated. */
T5 static INL void t1_group(const qi_colw *w, const float *x, const int32_t *idx, int n_idx, int p, int q, float sx,
                            float *y, int64_t i0, const int NB, const int BITS) {
    const __m512 tbl = nib_table(w->bias);
    const size_t off = BITS == 8 ? (size_t)i0 : (size_t)i0 / 2, span = (size_t)(BITS == 8 ? 32 : 16) * NB - 1;
    __m512 acc[8];
    for (int l = 0; l < 2 * NB; l++) acc[l] = _mm512_setzero_ps();
    for (int k = p; k < q; k++) {
        if (k + PF_COLS < n_idx) {
            const char *pf = (const char *)w->codes + (size_t)idx[k + PF_COLS] * w->col_bytes + off;
            _mm_prefetch(pf, _MM_HINT_T0);
            _mm_prefetch(pf + span, _MM_HINT_T0);
        }
        const float xv = x[idx[k]];
        if (xv == 0.0f) continue;
        const __m512 xb = _mm512_set1_ps(xv);
        const uint8_t *col = w->codes + (size_t)idx[k] * w->col_bytes;
        if (BITS == 8) {
            for (int l = 0; l < 2 * NB; l++) acc[l] = _mm512_fmadd_ps(xb, dec8(col, i0, l), acc[l]);
        } else {
            for (int c = 0; c < NB; c++) {
                __m512 f0, f1;
                dec4(col, i0, c, tbl, &f0, &f1);
                acc[2 * c] = _mm512_fmadd_ps(xb, f0, acc[2 * c]);
                acc[2 * c + 1] = _mm512_fmadd_ps(xb, f1, acc[2 * c + 1]);
            }
        }
    }
    const size_t g = (size_t)(idx[p] / w->group) * (size_t)w->n_out + (size_t)i0;
    const __m512 sxb = _mm512_set1_ps(sx);
    for (int l = 0; l < 2 * NB; l++) {
        __m512 v = _mm512_fmadd_ps(ld16(w->scale, w->scale_h, g + 16 * l), acc[l], _mm512_loadu_ps(y + i0 + 16 * l));
        if (has_offset(w)) v = _mm512_fmadd_ps(ld16(w->min, w->min_h, g + 16 * l), sxb, v);
        _mm512_storeu_ps(y + i0 + 16 * l, v);
    }
}

/* One token: group after group, each over the row range in blocks of 128
 * rows. A group's columns lie side by side, so the codes are read front
 * to back, a few kilobytes at a time, as the prefetchers like; sweeping
 * every column for one block of rows, then the next, touches one line per
 * column in turn, a stride the prefetchers do not follow (4x slower out
 * of cache). y waits in memory (L1) between groups. */
T5 static void t1_avx512(const qi_colw *w, const float *x, const int32_t *idx, int n_idx, float *y, int64_t r0,
                         int64_t r1) {
    for (int64_t i = r0; i < r1; i += 16) _mm512_storeu_ps(y + i, _mm512_setzero_ps());
    const int nb = (int)((r1 - r0) % 128 / 32);
    const int64_t e = r1 - 32 * nb;
    for (int p = 0; p < n_idx;) {
        const int q = group_end(idx, n_idx, p, w->group);
        float sx = 0.0f;
        for (int k = p; k < q; k++) sx = sx + x[idx[k]];
        if (w->bits == 8) {
            for (int64_t i0 = r0; i0 < e; i0 += 128) t1_group(w, x, idx, n_idx, p, q, sx, y, i0, 4, 8);
            switch (nb) {
            case 3: t1_group(w, x, idx, n_idx, p, q, sx, y, e, 3, 8); break;
            case 2: t1_group(w, x, idx, n_idx, p, q, sx, y, e, 2, 8); break;
            case 1: t1_group(w, x, idx, n_idx, p, q, sx, y, e, 1, 8); break;
            }
        } else {
            for (int64_t i0 = r0; i0 < e; i0 += 128) t1_group(w, x, idx, n_idx, p, q, sx, y, i0, 4, 4);
            switch (nb) {
            case 3: t1_group(w, x, idx, n_idx, p, q, sx, y, e, 3, 4); break;
            case 2: t1_group(w, x, idx, n_idx, p, q, sx, y, e, 2, 4); break;
            case 1: t1_group(w, x, idx, n_idx, p, q, sx, y, e, 1, 4); break;
            }
        }
        p = q;
    }
}

/* TT <= 8 tokens, rows [i0, i0 + 32): a column's 32 codes decoded once
 * for all of them, 2 TT accumulators; y summed in memory (zeroed first),
 * group after group. */
T5 static INL void tn_rows(const qi_colw *w, const float *x, size_t x_stride, const int32_t *idx, int n_idx,
                           float *y, size_t y_stride, int64_t i0, const int TT, const int BITS) {
    const int G = w->group;
    const size_t n_out = (size_t)w->n_out;
    const __m512 tbl = nib_table(w->bias);
    for (int t = 0; t < TT; t++) {
        _mm512_storeu_ps(y + (size_t)t * y_stride + (size_t)i0, _mm512_setzero_ps());
        _mm512_storeu_ps(y + (size_t)t * y_stride + (size_t)i0 + 16, _mm512_setzero_ps());
    }
    __m512 acc[8][2];
    float sx[8];
    for (int p = 0; p < n_idx;) {
        const int q = group_end(idx, n_idx, p, G);
        for (int t = 0; t < TT; t++) {
            acc[t][0] = acc[t][1] = _mm512_setzero_ps();
            const float *xt = x + (size_t)t * x_stride;
            float s = 0.0f;
            for (int k = p; k < q; k++) s = s + xt[idx[k]];
            sx[t] = s;
        }
        for (int k = p; k < q; k++) {
            const uint8_t *col = w->codes + (size_t)idx[k] * w->col_bytes;
            __m512 f0, f1;
            if (BITS == 8)
                f0 = dec8(col, i0, 0), f1 = dec8(col, i0, 1);
            else
                dec4(col, i0, 0, tbl, &f0, &f1);
            const float *xj = x + (size_t)idx[k];
            for (int t = 0; t < TT; t++) {
                const __m512 xb = _mm512_set1_ps(xj[(size_t)t * x_stride]);
                acc[t][0] = _mm512_fmadd_ps(xb, f0, acc[t][0]);
                acc[t][1] = _mm512_fmadd_ps(xb, f1, acc[t][1]);
            }
        }
        const size_t g = (size_t)(idx[p] / G) * n_out + (size_t)i0;
        for (int h = 0; h < 2; h++) {
            const __m512 s = ld16(w->scale, w->scale_h, g + 16 * h);
            const __m512 m = has_offset(w) ? ld16(w->min, w->min_h, g + 16 * h) : _mm512_setzero_ps();
            for (int t = 0; t < TT; t++) {
                float *yt = y + (size_t)t * y_stride + (size_t)i0 + 16 * h;
                __m512 v = _mm512_fmadd_ps(s, acc[t][h], _mm512_loadu_ps(yt));
                if (has_offset(w)) v = _mm512_fmadd_ps(m, _mm512_set1_ps(sx[t]), v);
                _mm512_storeu_ps(yt, v);
            }
        }
        p = q;
    }
}

#define TN_CASE(TT, B)                                                                                          \
    case TT: tn_rows(w, xt, x_stride, idx, n_idx, yt, y_stride, i0, TT, B); break

T5 static void tn_avx512(const qi_colw *w, const float *x, size_t x_stride, int T, const int32_t *idx, int n_idx,
                         float *y, size_t y_stride, int64_t r0, int64_t r1) {
    for (int64_t i0 = r0; i0 < r1; i0 += 32)
        for (int t0 = 0; t0 < T; t0 += 8) {
            const int tt = T - t0 < 8 ? T - t0 : 8;
            const float *xt = x + (size_t)t0 * x_stride;
            float *yt = y + (size_t)t0 * y_stride;
            if (w->bits == 8) {
                switch (tt) {
                    TN_CASE(8, 8); TN_CASE(7, 8); TN_CASE(6, 8); TN_CASE(5, 8);
                    TN_CASE(4, 8); TN_CASE(3, 8); TN_CASE(2, 8); TN_CASE(1, 8);
                }
            } else {
                switch (tt) {
                    TN_CASE(8, 4); TN_CASE(7, 4); TN_CASE(6, 4); TN_CASE(5, 4);
                    TN_CASE(4, 4); TN_CASE(3, 4); TN_CASE(2, 4); TN_CASE(1, 4);
                }
            }
        }
}

T5 static void sparse_avx512(const qi_colw *w, const float *x, size_t x_stride, int T, const int32_t *idx, int n_idx,
                             float *y, size_t y_stride, int64_t r0, int64_t r1) {
    if (T == 1)
        t1_avx512(w, x, idx, n_idx, y, r0, r1);
    else
        tn_avx512(w, x, x_stride, T, idx, n_idx, y, y_stride, r0, r1);
}

/* qi_sparse_threshold for one token, n a multiple of 16: a mask per 16
 * elements, the kept indices compressed in a register and stored whole
 * (idx has room: k <= j), since a compressing store to memory is slow on
 * some CPUs (microcoded on Zen 4). */
T5 static int threshold1_avx512(float *x, int64_t n, float thr, int32_t *idx, long *n_zeroed) {
    const __m512 t = _mm512_set1_ps(thr);
    __m512i jv = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i step = _mm512_set1_epi32(16);
    int k = 0;
    long z = 0;
    for (int64_t j = 0; j < n; j += 16) {
        const __m512 v = _mm512_loadu_ps(x + j);
        const __mmask16 m = _mm512_cmp_ps_mask(_mm512_abs_ps(v), t, _CMP_NLE_UQ); /* !(|v| <= thr) */
        _mm512_storeu_ps(x + j, _mm512_maskz_mov_ps(m, v));
        _mm512_storeu_si512((void *)(idx + k), _mm512_maskz_compress_epi32(m, jv));
        const int c = __builtin_popcount((unsigned)m);
        k += c;
        z += 16 - c;
        jv = _mm512_add_epi32(jv, step);
    }
    *n_zeroed += z;
    return k;
}

qi_sparse_fn qi_sparse_matmul_avx512(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                   qi_cpu_f16c()
               ? sparse_avx512
               : NULL;
}
static threshold1_fn threshold1(void) {
    static threshold1_fn f;
    static int chosen; /* a race to choose picks the same */
    if (!__atomic_load_n(&chosen, __ATOMIC_ACQUIRE)) {
        const char *r = getenv("QI_FORCE_REF");
        __atomic_store_n(&f, (r && strcmp(r, "1") == 0) || !qi_sparse_matmul_avx512() ? NULL : threshold1_avx512,
                         __ATOMIC_RELAXED);
        __atomic_store_n(&chosen, 1, __ATOMIC_RELEASE);
    }
    return __atomic_load_n(&f, __ATOMIC_RELAXED);
}
#else
qi_sparse_fn qi_sparse_matmul_avx2(void) { return NULL; }
qi_sparse_fn qi_sparse_matmul_avx512(void) { return NULL; }
static threshold1_fn threshold1(void) { return NULL; }
#endif

qi_sparse_fn qi_sparse_matmul(void) {
    const char *f = getenv("QI_FORCE_REF");
    if (f && strcmp(f, "1") == 0) return qi_sparse_matmul_ref;
    qi_sparse_fn s = qi_sparse_matmul_avx512();
    if (!s) s = qi_sparse_matmul_avx2();
    return s ? s : qi_sparse_matmul_ref;
}

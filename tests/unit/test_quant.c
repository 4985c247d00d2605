/* test_quant.c - Check suite for the block formats' reference kernels.
 *
 * Three kinds of evidence:
 *   - conversions: fp16 exhaustively (all 65536 values round trip, and
 *     f32 -> fp16 against an independent double-precision oracle), bf16
 *     likewise, plus ggml's own results as checksums from the golden file;
 *   - self-consistency per type: quantize -> dequantize error within a
 *     stated bound, and the integer dot products against a double dot of
 *     the dequantised rows;
 *   - exactness against llama.cpp: tests/golden/quant/quant_golden.txt,
 *     made by gen_quant_golden.py from ggml's C code, holds explicit rows
 *     (input floats, ggml's bytes, ggml's dequantised floats: all must match
 *     bit for bit), dot rows (ggml's generic scalar vec_dot: bit for bit;
 *     its SIMD CPU vec_dot: within 1e-5 of sum|w_i a_i|), and checksums of
 *     ggml's results on 2000 generated stress rows per type, which this file
 *     regenerates with the same PRNG. Planted faults (swapped nibbles, the
 *     wrong rounding mode, a flipped fifth bit, misread K scales) prove the
 *     comparisons bite.
 *
 * Error bounds (relative RMS, sqrt(sum (y-x)^2 / sum x^2), over uniform and
 * Gaussian rows of 1, 2 and 7 blocks) are in rt_bound(); each is the
 * format's worst observed error over many rows times about 1.4, except
 * F16/BF16 whose bounds are the half-ulp limits 2^-11 and 2^-8.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "qinfer/quant.h"
#include "qinfer/types.h"
#include "testutil.h"

#ifndef QI_SOURCE_DIR
#error "QI_SOURCE_DIR must name the source root"
#endif
#define GOLDEN_PATH QI_SOURCE_DIR "/tests/golden/quant/quant_golden.txt"

static const uint32_t k_types[] = {
    QI_TYPE_F32,  QI_TYPE_F16,  QI_TYPE_BF16, QI_TYPE_Q4_0, QI_TYPE_Q4_1,
    QI_TYPE_Q5_0, QI_TYPE_Q5_1, QI_TYPE_Q8_0, QI_TYPE_Q8_1, QI_TYPE_Q4_K,
    QI_TYPE_Q5_K, QI_TYPE_Q6_K, QI_TYPE_Q8_K,
};
#define N_TYPES (int)(sizeof k_types / sizeof k_types[0])

/* Relative RMS round-trip bound per type (see the file comment). */
static double rt_bound(uint32_t t) {
    switch (t) {
    case QI_TYPE_F32: return 0.0;
    case QI_TYPE_F16: return 0x1p-11;
    case QI_TYPE_BF16: return 0x1p-8;
    case QI_TYPE_Q4_0: return 0.18;
    case QI_TYPE_Q4_1: return 0.16;
    case QI_TYPE_Q5_0: return 0.08;
    case QI_TYPE_Q5_1: return 0.07;
    case QI_TYPE_Q8_0: return 0.013;
    case QI_TYPE_Q8_1: return 0.013;
    case QI_TYPE_Q4_K: return 0.12;
    case QI_TYPE_Q5_K: return 0.06;
    case QI_TYPE_Q6_K: return 0.03;
    case QI_TYPE_Q8_K: return 0.015;
    default: return -1.0;
    }
}

static int elems_per_block(uint32_t t) {
    const qi_type_info *ti = qi_type_get(t);
    return ti->blck == 1 ? 32 : (int)ti->blck; /* plain types: 32-wide "blocks" */
}

/* Check's ck_assert_* record a mark point (a write to the runner) on every
 * success; loops that check millions of values use this instead. */
#define EXPECT(cond, ...)                                                      \
    do {                                                                       \
        if (!(cond)) ck_abort_msg(__VA_ARGS__);                                \
    } while (0)

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float f32_from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static float randn(uint64_t *s) {
    const double u1 = (double)(qi_test_rand(s) >> 11) * 0x1p-53 + 0x1p-60;
    const double u2 = (double)(qi_test_rand(s) >> 11) * 0x1p-53;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

/* The golden file's checksum: sum over i of mix64((i << 32) | v_i) mod 2^64
 * (mix64 is splitmix64's finaliser), i counting every value added. */
typedef struct {
    uint64_t total, count;
} checksum;

static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void checksum_add(checksum *c, uint32_t v) {
    c->total += mix64((c->count++ << 32) | v);
}

/* ---- golden file ------------------------------------------------------------- */

typedef enum { CASE_QUANT, CASE_DEQUANT, CASE_DOT } case_kind;

typedef struct {
    case_kind kind;
    uint32_t type;
    int64_t n;
    char label[48];
    float *x;              /* quant: input row */
    unsigned char *q;      /* quant/dequant: ggml's bytes; dot: weight row */
    size_t q_len;
    float *y;              /* quant/dequant: ggml's dequantised floats */
    unsigned char *a;      /* dot: activation row */
    size_t a_len;
    float s;               /* dot: ggml CPU vec_dot */
    float g;               /* dot: ggml generic vec_dot, when has_g */
    bool has_g;
} golden_case;

typedef struct {
    char name[32];
    long count;
    unsigned long long sum;
} golden_checksum;

static golden_case *g_cases;
static int g_n_cases;
static golden_checksum g_sums[8];
static int g_n_sums;

typedef struct {
    uint32_t type;
    int rows;
    unsigned long long q_sum, y_sum, dot_sum;
    bool has_dot;
} golden_stress;

static golden_stress g_stress[QI_TYPE_COUNT];
static int g_n_stress;
static char g_load_err[256];

static uint32_t type_by_name(const char *name) {
    for (uint32_t t = 0; t < QI_TYPE_COUNT; t++) {
        const qi_type_info *ti = qi_type_get(t);
        if (ti && strcasecmp(ti->name, name) == 0) return t;
    }
    return QI_TYPE_COUNT;
}

static float *parse_floats(const char *s, int64_t n) {
    float *v = malloc((size_t)n * sizeof *v);
    if (!v) return NULL;
    for (int64_t i = 0; i < n; i++) {
        char *end;
        v[i] = strtof(s, &end);
        if (end == s) {
            free(v);
            return NULL;
        }
        s = end;
    }
    while (*s == ' ') s++;
    if (*s) {
        free(v);
        return NULL;
    }
    return v;
}

/* Parse the whole golden file into g_cases; false (with g_load_err) on any
 * malformed line, so a damaged file fails loudly rather than testing less. */
static bool load_goldens(void) {
    size_t len;
    char *text = qi_test_read_file(GOLDEN_PATH, &len);
    if (!text) {
        snprintf(g_load_err, sizeof g_load_err, "cannot read %s", GOLDEN_PATH);
        return false;
    }
    int cap = 0, lineno = 0;
    golden_case *cur = NULL;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        lineno++;
        if (line[0] == '#') continue;
        char word[16], tname[16], label[48];
        long long n;
        if (sscanf(line, "%15s", word) != 1) goto bad;
        if (!strcmp(word, "quant") || !strcmp(word, "dequant") || !strcmp(word, "dot")) {
            label[0] = 0;
            int k = sscanf(line + strlen(word), "%15s %lld %47s", tname, &n, label);
            if (k < 2) goto bad;
            if (g_n_cases == cap) {
                cap = cap ? 2 * cap : 64;
                g_cases = realloc(g_cases, (size_t)cap * sizeof *g_cases);
                if (!g_cases) goto bad;
            }
            cur = &g_cases[g_n_cases++];
            memset(cur, 0, sizeof *cur);
            cur->kind = word[0] == 'q' ? CASE_QUANT : word[1] == 'e' ? CASE_DEQUANT : CASE_DOT;
            cur->type = type_by_name(tname);
            cur->n = n;
            snprintf(cur->label, sizeof cur->label, "%s", label);
            if (cur->type == QI_TYPE_COUNT || n <= 0 || qi_row_bytes(cur->type, n) == 0) goto bad;
        } else if (!strcmp(word, "stress")) {
            golden_stress *st = &g_stress[g_n_stress];
            char dot[24];
            if (g_n_stress == QI_TYPE_COUNT ||
                sscanf(line, "stress %15s %d %llx %llx %23s", tname, &st->rows, &st->q_sum,
                       &st->y_sum, dot) != 5)
                goto bad;
            st->type = type_by_name(tname);
            st->has_dot = strcmp(dot, "-") != 0;
            if (st->type == QI_TYPE_COUNT || st->rows <= 0 ||
                (st->has_dot && sscanf(dot, "%llx", &st->dot_sum) != 1))
                goto bad;
            g_n_stress++;
        } else if (!strcmp(word, "checksum")) {
            golden_checksum *c = &g_sums[g_n_sums];
            if (g_n_sums == 8 ||
                sscanf(line, "checksum %31s %ld %llx", c->name, &c->count, &c->sum) != 3)
                goto bad;
            g_n_sums++;
        } else if (!cur) {
            goto bad;
        } else if (!strcmp(word, "x")) {
            if (!(cur->x = parse_floats(line + 2, cur->n))) goto bad;
        } else if (!strcmp(word, "y")) {
            if (!(cur->y = parse_floats(line + 2, cur->n))) goto bad;
        } else if (!strcmp(word, "q") || !strcmp(word, "w")) {
            if (!(cur->q = qi_test_unhex(line + 2, &cur->q_len))) goto bad;
            if (cur->q_len != qi_row_bytes(cur->type, cur->n)) goto bad;
        } else if (!strcmp(word, "a")) {
            if (!(cur->a = qi_test_unhex(line + 2, &cur->a_len))) goto bad;
            if (cur->a_len != qi_row_bytes(qi_vec_dot_type(cur->type), cur->n)) goto bad;
        } else if (!strcmp(word, "s") || !strcmp(word, "g")) {
            char *end;
            const float v = strtof(line + 2, &end);
            if (end == line + 2) goto bad;
            if (word[0] == 's') {
                cur->s = v;
            } else {
                cur->g = v;
                cur->has_g = true;
            }
        } else {
            goto bad;
        }
    }
    free(text);
    for (int i = 0; i < g_n_cases; i++) {
        const golden_case *c = &g_cases[i];
        bool ok = c->kind == CASE_QUANT   ? c->x && c->q && c->y
                  : c->kind == CASE_DEQUANT ? c->q && c->y
                                            : c->q && c->a;
        if (!ok) {
            snprintf(g_load_err, sizeof g_load_err, "case %d (%s %s) is incomplete", i,
                     qi_type_get(c->type)->name, c->label);
            return false;
        }
    }
    return true;
bad:
    snprintf(g_load_err, sizeof g_load_err, "%s: malformed line %d", GOLDEN_PATH, lineno);
    free(text);
    return false;
}

/* Index of the first byte where a and b differ, or -1. */
static long first_byte_diff(const unsigned char *a, const unsigned char *b, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (a[i] != b[i]) return (long)i;
    return -1;
}

/* Index of the first float whose bits differ, or -1. */
static long first_float_diff(const float *a, const float *b, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (f32_bits(a[i]) != f32_bits(b[i])) return (long)i;
    return -1;
}

static void require_goldens(void) {
    ck_assert_msg(g_n_cases > 0, "goldens not loaded: %s", g_load_err);
}

/* ---- fp16 / bf16 ------------------------------------------------------------- */

/* Independent oracle: nearest fp16 (ties to even) computed in double, where
 * every step below is exact. */
static uint16_t oracle_fp16(float f) {
    const uint16_t sign = (f32_bits(f) >> 16) & 0x8000;
    if (isnan(f)) return sign | 0x7e00;
    if (isinf(f)) return sign | 0x7c00;
    double a = fabs((double)f);
    if (a < 0x1p-14) return sign | (uint16_t)nearbyint(a * 0x1p24); /* 0x400 is 2^-14 */
    int e;
    double m = frexp(a, &e); /* a = m * 2^e, m in [0.5, 1) */
    e -= 1;
    m *= 2;                  /* m in [1, 2) */
    double frac = nearbyint((m - 1.0) * 1024.0);
    long bits = ((long)(e + 15) << 10) + (long)frac; /* a carry bumps the exponent */
    if (e + 15 >= 31 || bits >= 0x7c00) return sign | 0x7c00;
    return sign | (uint16_t)bits;
}

START_TEST(test_fp16_exhaustive) {
    for (uint32_t h = 0; h < 65536; h++) {
        const float f = qi_fp16_to_f32((uint16_t)h);
        const uint32_t e = (h >> 10) & 31, m = h & 1023;
        const double want = e == 0    ? ldexp((double)m, -24)
                            : e == 31 ? (m ? NAN : INFINITY)
                                      : ldexp(1024.0 + m, (int)e - 25);
        const bool neg = h & 0x8000;
        if (e == 31 && m) {
            /* quiet, payload kept, sign kept; encodes back to the canonical NaN */
            EXPECT(f32_bits(f) == (((h & 0x8000u) << 16) | 0x7fc00000u | (m << 13)),
                   "fp16 %04x decoded to %08x", h, f32_bits(f));
            EXPECT(qi_f32_to_fp16(f) == ((h & 0x8000u) | 0x7e00u), "NaN %04x encoded to %04x", h,
                   qi_f32_to_fp16(f));
            continue;
        }
        EXPECT((double)f == (neg ? -want : want) && (signbit(f) != 0) == neg,
                      "fp16 %04x decoded to %.9g", h, (double)f);
        EXPECT(qi_f32_to_fp16(f) == h, "fp16 %04x does not round trip (%04x)", h,
                      qi_f32_to_fp16(f));
    }
}
END_TEST

START_TEST(test_fp16_known_values) {
    static const struct { float f; uint16_t h; } k[] = {
        {0.0f, 0x0000},        {-0.0f, 0x8000},          {1.0f, 0x3c00},
        {-2.0f, 0xc000},       {0.5f, 0x3800},           {65504.0f, 0x7bff},
        {65519.99f, 0x7bff},   {65520.0f, 0x7c00},       {1e10f, 0x7c00},
        {-1e10f, 0xfc00},      {0x1p-14f, 0x0400},       {0x1p-24f, 0x0001},
        {0x1p-25f, 0x0000},    {0x1.000002p-25f, 0x0001}, {0x1.8p-24f, 0x0002},
        {0x1.8p-23f, 0x0003},  {0x1.002p0f, 0x3c00},     {0x1.006p0f, 0x3c02},
        {0x1.002002p0f, 0x3c01}, {0.1f, 0x2e66},         {1.0f / 3.0f, 0x3555},
        {0x1.ffcp-15f, 0x0400}, {0x1.ff4p-15f, 0x03fe},  {3.4028235e38f, 0x7c00},
    };
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
        ck_assert_msg(qi_f32_to_fp16(k[i].f) == k[i].h, "fp16(%a) = %04x, want %04x",
                      (double)k[i].f, qi_f32_to_fp16(k[i].f), k[i].h);
    ck_assert_uint_eq(qi_f32_to_fp16(INFINITY), 0x7c00);
    ck_assert_uint_eq(qi_f32_to_fp16(-INFINITY), 0xfc00);
    ck_assert_uint_eq(qi_f32_to_fp16(NAN), 0x7e00);
    ck_assert_uint_eq(qi_f32_to_fp16(f32_from_bits(0xff800001u)), 0xfe00); /* -sNaN */
    ck_assert_uint_eq(qi_f32_to_fp16(f32_from_bits(0x7fffffffu)), 0x7e00);
    ck_assert(isinf(qi_fp16_to_f32(0x7c00)) && qi_fp16_to_f32(0x7c00) > 0);
    ck_assert(isinf(qi_fp16_to_f32(0xfc00)) && qi_fp16_to_f32(0xfc00) < 0);
}
END_TEST

/* f32 -> fp16 against the double oracle over a large sweep of bit patterns,
 * every pattern near each rounding threshold and every fp16 halfway point. */
START_TEST(test_fp16_vs_oracle) {
    for (uint64_t i = 0; i < (1u << 22); i++) {
        const float f = f32_from_bits((uint32_t)(i * 2654435761u));
        EXPECT(qi_f32_to_fp16(f) == oracle_fp16(f), "fp16(%08x) = %04x, oracle %04x",
               f32_bits(f), qi_f32_to_fp16(f), oracle_fp16(f));
    }
    static const uint32_t edges[] = {0x477ff000u, 0x38800000u, 0x33000000u, 0x387fe000u,
                                     0x7f800000u, 0x3f801000u, 0x33800000u};
    for (size_t k = 0; k < sizeof edges / sizeof edges[0]; k++)
        for (uint32_t d = 0; d < 8192; d++) {
            const uint32_t b = edges[k] - 4096 + d;
            for (int s = 0; s < 2; s++) {
                const float f = f32_from_bits(b | (s ? 0x80000000u : 0));
                EXPECT(qi_f32_to_fp16(f) == oracle_fp16(f), "fp16(%08x) = %04x, oracle %04x",
                       f32_bits(f), qi_f32_to_fp16(f), oracle_fp16(f));
            }
        }
    /* exact midpoints between consecutive finite fp16 values */
    for (uint32_t h = 0; h < 0x7bff; h++) {
        const double mid = 0.5 * ((double)qi_fp16_to_f32((uint16_t)h) +
                                  (double)qi_fp16_to_f32((uint16_t)(h + 1)));
        const uint16_t want = (h & 1) ? (uint16_t)(h + 1) : (uint16_t)h;
        EXPECT(qi_f32_to_fp16((float)mid) == want, "midpoint after %04x -> %04x", h,
               qi_f32_to_fp16((float)mid));
    }
}
END_TEST

START_TEST(test_bf16) {
    for (uint32_t h = 0; h < 65536; h++) {
        const float f = qi_bf16_to_f32((uint16_t)h);
        EXPECT(f32_bits(f) == h << 16, "bf16 %04x decoded to %08x", h, f32_bits(f));
        const uint32_t want = isnan(f) ? (h | 0x40u) : h;
        EXPECT(qi_f32_to_bf16(f) == want, "bf16 %04x -> f32 -> %04x", h, qi_f32_to_bf16(f));
    }
    ck_assert_uint_eq(qi_f32_to_bf16(1.0f), 0x3f80);
    ck_assert_uint_eq(qi_f32_to_bf16(f32_from_bits(0x3f808000u)), 0x3f80); /* tie -> even */
    ck_assert_uint_eq(qi_f32_to_bf16(f32_from_bits(0x3f818000u)), 0x3f82); /* tie -> even */
    ck_assert_uint_eq(qi_f32_to_bf16(f32_from_bits(0x3f808001u)), 0x3f81);
    ck_assert_uint_eq(qi_f32_to_bf16(f32_from_bits(0x3f807fffu)), 0x3f80);
    ck_assert_uint_eq(qi_f32_to_bf16(f32_from_bits(0x7f7fffffu)), 0x7f80); /* FLT_MAX -> inf */
    ck_assert_uint_eq(qi_f32_to_bf16(INFINITY), 0x7f80);
    ck_assert_uint_eq(qi_f32_to_bf16(-INFINITY), 0xff80);
    ck_assert_uint_eq(qi_f32_to_bf16(f32_from_bits(0x7f800001u)), 0x7fc0); /* sNaN quieted */
    ck_assert_uint_eq(qi_f32_to_bf16(f32_from_bits(0xffc00000u)), 0xffc0);
    /* subnormals are rounded, not flushed */
    ck_assert_uint_eq(qi_f32_to_bf16(f32_from_bits(0x00000001u)), 0x0000);
    ck_assert_uint_eq(qi_f32_to_bf16(f32_from_bits(0x00018000u)), 0x0002);
}
END_TEST

/* The inputs gen_quant_golden.py's sweep_f32 feeds ggml, in the same order. */
static uint32_t sweep_bits(long i, long n_stride) {
    static const uint32_t bases[] = {0x477ff000u, 0x38800000u, 0x33000000u,
                                     0x387fe000u, 0x7f800000u, 0x3f801000u};
    if (i < n_stride) return (uint32_t)((uint64_t)i * 2654435761u);
    i -= n_stride;
    const long n_near = 6 * 8192;
    const uint32_t sign = i >= n_near ? 0x80000000u : 0;
    i %= n_near;
    return (bases[i / 8192] - 4096 + (uint32_t)(i % 8192)) | sign;
}

static const golden_checksum *find_sum(const char *name) {
    for (int i = 0; i < g_n_sums; i++)
        if (!strcmp(g_sums[i].name, name)) return &g_sums[i];
    return NULL;
}

START_TEST(test_conversions_match_ggml) {
    require_goldens();
    const golden_checksum *c = find_sum("fp16_to_f32");
    ck_assert_msg(c && c->count == 65536, "golden fp16_to_f32 checksum missing");
    checksum sum = {0, 0};
    for (uint32_t h = 0; h < 65536; h++) checksum_add(&sum, f32_bits(qi_fp16_to_f32((uint16_t)h)));
    ck_assert_msg(sum.total == c->sum, "fp16->f32 differs from ggml over all 65536 values");

    const golden_checksum *c16 = find_sum("f32_to_fp16"), *cb = find_sum("f32_to_bf16");
    ck_assert_msg(c16 && cb && c16->count == cb->count, "golden f32 sweep checksums missing");
    const long n_stride = c16->count - 2 * 6 * 8192;
    ck_assert_int_gt(n_stride, 0);
    checksum s16 = {0, 0}, sb = {0, 0};
    for (long i = 0; i < c16->count; i++) {
        const float f = f32_from_bits(sweep_bits(i, n_stride));
        checksum_add(&s16, qi_f32_to_fp16(f));
        checksum_add(&sb, qi_f32_to_bf16(f));
    }
    ck_assert_msg(s16.total == c16->sum, "f32->fp16 differs from ggml on the sweep");
    ck_assert_msg(sb.total == cb->sum, "f32->bf16 differs from ggml on the sweep");
}
END_TEST

/* ---- API ------------------------------------------------------------------- */

START_TEST(test_api_tables) {
    static const struct { uint32_t w, a; } pairs[] = {
        {QI_TYPE_F32, QI_TYPE_F32},   {QI_TYPE_F16, QI_TYPE_F16},   {QI_TYPE_BF16, QI_TYPE_BF16},
        {QI_TYPE_Q4_0, QI_TYPE_Q8_0}, {QI_TYPE_Q5_0, QI_TYPE_Q8_0}, {QI_TYPE_Q8_0, QI_TYPE_Q8_0},
        {QI_TYPE_Q4_1, QI_TYPE_Q8_1}, {QI_TYPE_Q5_1, QI_TYPE_Q8_1}, {QI_TYPE_Q4_K, QI_TYPE_Q8_K},
        {QI_TYPE_Q5_K, QI_TYPE_Q8_K}, {QI_TYPE_Q6_K, QI_TYPE_Q8_K},
    };
    int n_dot = 0;
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
        ck_assert_uint_eq(qi_vec_dot_type(pairs[i].w), pairs[i].a);
        ck_assert(qi_type_can_dot(pairs[i].w));
    }
    for (uint32_t t = 0; t < QI_TYPE_COUNT + 5; t++) n_dot += qi_type_can_dot(t);
    ck_assert_int_eq(n_dot, 11);
    ck_assert(!qi_type_can_dot(QI_TYPE_Q8_1) && !qi_type_can_dot(QI_TYPE_Q8_K));
    ck_assert(!qi_type_can_dot(QI_TYPE_Q2_K) && !qi_type_can_dot(QI_TYPE_I8));
    ck_assert_uint_eq(qi_vec_dot_type(QI_TYPE_Q3_K), QI_TYPE_COUNT);
    for (int i = 0; i < N_TYPES; i++) ck_assert(qi_quant_supported(k_types[i]));
    ck_assert(!qi_quant_supported(QI_TYPE_Q2_K) && !qi_quant_supported(QI_TYPE_I32));
    ck_assert(!qi_quant_supported(99));
    ck_assert_uint_eq(qi_row_bytes(QI_TYPE_Q4_0, 64), 36);
    ck_assert_uint_eq(qi_row_bytes(QI_TYPE_Q6_K, 512), 420);
    ck_assert_uint_eq(qi_row_bytes(QI_TYPE_F16, 3), 6);
    ck_assert_uint_eq(qi_row_bytes(QI_TYPE_Q4_0, 33), 0);
    ck_assert_uint_eq(qi_row_bytes(QI_TYPE_Q4_0, -32), 0);
    ck_assert_uint_eq(qi_row_bytes(77, 32), 0);
    ck_assert_uint_eq(qi_row_bytes(QI_TYPE_Q8_K, 0), 0);
    /* sub-block scale/min unpacking on a hand-packed block */
    const uint8_t s[12] = {0x41, 0x82, 0xc3, 0x04, 0x45, 0x86, 0xc7, 0x08, 0x9a, 0xbc, 0xde, 0xf1};
    uint8_t sc, mn;
    qi_k_scale_min(s, 0, &sc, &mn);
    ck_assert_uint_eq(sc, 0x01);
    ck_assert_uint_eq(mn, 0x05);
    qi_k_scale_min(s, 4, &sc, &mn); /* low nibbles of s[8], top bits of s[0], s[4] */
    ck_assert_uint_eq(sc, 0x0a | (1 << 4));
    ck_assert_uint_eq(mn, 0x09 | (1 << 4));
    qi_k_scale_min(s, 6, &sc, &mn);
    ck_assert_uint_eq(sc, 0x0e | (3 << 4));
    ck_assert_uint_eq(mn, 0x0d | (3 << 4));
}
END_TEST

/* ---- round trips --------------------------------------------------------------- */

#define GUARD 64
#define GUARD_BYTE 0xa5

static void check_guard(const unsigned char *p, const char *what, uint32_t t) {
    for (int i = 0; i < GUARD; i++)
        EXPECT(p[i] == GUARD_BYTE, "%s of %s wrote past the row", what, qi_type_get(t)->name);
}

START_TEST(test_round_trip) {
    const uint32_t t = k_types[_i];
    const int blck = elems_per_block(t);
    uint64_t rng = 0x1234 + (uint64_t)t;
    static const int sizes[] = {1, 2, 7};
    for (int dist = 0; dist < 2; dist++)
        for (int si = 0; si < 3; si++)
            for (int rep = 0; rep < 4; rep++) {
                const int64_t n = (int64_t)sizes[si] * blck;
                const size_t nbytes = qi_row_bytes(t, n);
                ck_assert_uint_gt(nbytes, 0);
                float *x = malloc((size_t)n * sizeof *x);
                float *y = malloc((size_t)n * sizeof *y + GUARD);
                unsigned char *q = malloc(nbytes + GUARD);
                ck_assert(x && y && q);
                for (int64_t i = 0; i < n; i++) x[i] = dist ? randn(&rng) : qi_test_randf(&rng);
                memset(q + nbytes, GUARD_BYTE, GUARD);
                memset((unsigned char *)y + n * sizeof *y, GUARD_BYTE, GUARD);
                qi_quantize_row_ref(t, x, q, n);
                check_guard(q + nbytes, "quantize", t);
                qi_dequantize_row_ref(t, q, y, n);
                check_guard((unsigned char *)y + n * sizeof *y, "dequantize", t);
                double err = 0, ref = 0;
                for (int64_t i = 0; i < n; i++) {
                    err += ((double)y[i] - x[i]) * ((double)y[i] - x[i]);
                    ref += (double)x[i] * x[i];
                }
                const double rel = sqrt(err / ref);
                ck_assert_msg(rel <= rt_bound(t), "%s n=%lld %s: relative RMS error %.4g > %.4g",
                              qi_type_get(t)->name, (long long)n, dist ? "gauss" : "uniform", rel,
                              rt_bound(t));
                if (t == QI_TYPE_Q8_K) { /* bsums are what the K dots rely on */
                    const qi_block_q8_K *b = (const qi_block_q8_K *)q;
                    for (int64_t k = 0; k < n / QI_QK_K; k++)
                        for (int g = 0; g < 16; g++) {
                            int s = 0;
                            for (int l = 0; l < 16; l++) s += b[k].qs[16 * g + l];
                            EXPECT(b[k].bsums[g] == s, "q8_K bsums[%d] = %d, want %d", g,
                                   b[k].bsums[g], s);
                        }
                }
                if (t == QI_TYPE_Q8_1) { /* s = fp16(d * sum q) */
                    const qi_block_q8_1 *b = (const qi_block_q8_1 *)q;
                    for (int64_t k = 0; k < n / QI_QK; k++) {
                        int s = 0;
                        for (int l = 0; l < QI_QK; l++) s += b[k].qs[l];
                        const double want = qi_fp16_to_f32(b[k].d) * (double)s;
                        EXPECT(fabs(qi_fp16_to_f32(b[k].s) - want) <= 0x1p-9 * fabs(want) + 1e-30,
                               "q8_1 s = %g, d * sum = %g", (double)qi_fp16_to_f32(b[k].s), want);
                    }
                }
                free(x);
                free(y);
                free(q);
            }
}
END_TEST

/* All-zero rows must decode to zeros (no NaN from 0/0), the formats with an
 * explicit all-zero path must write all-zero blocks, and n = 0 must touch
 * nothing. */
START_TEST(test_zero_rows) {
    const uint32_t t = k_types[_i];
    const int64_t n = 2 * elems_per_block(t);
    float x[512] = {0}, y[512];
    unsigned char q[1024];
    memset(q, GUARD_BYTE, sizeof q);
    qi_quantize_row_ref(t, x, q, n);
    qi_dequantize_row_ref(t, q, y, n);
    for (int64_t i = 0; i < n; i++)
        EXPECT(y[i] == 0.0f, "%s: y[%lld] = %g", qi_type_get(t)->name, (long long)i, (double)y[i]);
    if (t == QI_TYPE_Q6_K || t == QI_TYPE_Q8_K || t == QI_TYPE_Q8_0 || t == QI_TYPE_Q4_K)
        for (size_t i = 0; i < qi_row_bytes(t, n); i++)
            EXPECT(q[i] == 0, "%s zero row: byte %zu = %02x", qi_type_get(t)->name, i, q[i]);
    unsigned char before[64];
    memcpy(before, q, sizeof before);
    qi_quantize_row_ref(t, x, q, 0);
    qi_dequantize_row_ref(t, q, y, 0);
    ck_assert(!memcmp(before, q, sizeof before));
}
END_TEST

/* ---- dot products ------------------------------------------------------------ */

static const uint32_t k_weight_types[] = {
    QI_TYPE_F32,  QI_TYPE_F16,  QI_TYPE_BF16, QI_TYPE_Q4_0, QI_TYPE_Q4_1, QI_TYPE_Q5_0,
    QI_TYPE_Q5_1, QI_TYPE_Q8_0, QI_TYPE_Q4_K, QI_TYPE_Q5_K, QI_TYPE_Q6_K,
};
#define N_WEIGHT_TYPES (int)(sizeof k_weight_types / sizeof k_weight_types[0])

/* The min term of Q4_1/Q5_1 uses Q8_1's s = fp16(d * sum q), which differs
 * from sum(fp16(d) * q) by up to two fp16 roundings: 2^-10 |m s| a block. */
static double offset_term_slack(uint32_t t, const void *w, const void *a, int64_t n) {
    double slack = 0;
    for (int64_t b = 0; b < n / QI_QK; b++) {
        double m = 0, s;
        if (t == QI_TYPE_Q4_1) m = qi_fp16_to_f32(((const qi_block_q4_1 *)w)[b].m);
        else if (t == QI_TYPE_Q5_1) m = qi_fp16_to_f32(((const qi_block_q5_1 *)w)[b].m);
        else return 0;
        s = qi_fp16_to_f32(((const qi_block_q8_1 *)a)[b].s);
        slack += 0x1.02p-10 * fabs(m * s);
    }
    return slack;
}

/* Tight: the quantised dot equals the double dot of the two dequantised
 * rows within 1e-6 * sum|w_i a_i| (float rounding of per-block scales and
 * of the block sum; observed <= 1.1e-7) plus the Q8_1 offset slack above.
 * Loose: it is within that plus rt_bound(activation type) * |w| |x| of the
 * dot with the unquantised activations x (Cauchy-Schwarz on x - a). */
START_TEST(test_dot_consistency) {
    const uint32_t t = k_weight_types[_i];
    const uint32_t at = qi_vec_dot_type(t);
    const int blck = elems_per_block(t);
    uint64_t rng = 0xd07 + (uint64_t)t;
    static const int sizes[] = {1, 2, 7};
    for (int si = 0; si < 3; si++)
        for (int rep = 0; rep < 8; rep++) {
            const int64_t n = (int64_t)sizes[si] * blck;
            float *xw = malloc((size_t)n * 4), *xa = malloc((size_t)n * 4);
            float *yw = malloc((size_t)n * 4), *ya = malloc((size_t)n * 4);
            void *w = malloc(qi_row_bytes(t, n)), *a = malloc(qi_row_bytes(at, n));
            ck_assert(xw && xa && yw && ya && w && a);
            for (int64_t i = 0; i < n; i++) {
                xw[i] = rep & 1 ? randn(&rng) : qi_test_randf(&rng);
                xa[i] = 3.0f * (rep & 2 ? randn(&rng) : qi_test_randf(&rng));
            }
            qi_quantize_row_ref(t, xw, w, n);
            qi_quantize_row_ref(at, xa, a, n);
            qi_dequantize_row_ref(t, w, yw, n);
            qi_dequantize_row_ref(at, a, ya, n);
            const double s = qi_vec_dot_ref(t, n, w, a);
            double dq = 0, dabs = 0, dx = 0, nw = 0, nx = 0;
            for (int64_t i = 0; i < n; i++) {
                dq += (double)yw[i] * ya[i];
                dabs += fabs((double)yw[i] * ya[i]);
                dx += (double)yw[i] * xa[i];
                nw += (double)yw[i] * yw[i];
                nx += (double)xa[i] * xa[i];
            }
            const double tight = 1e-6 * dabs + offset_term_slack(t, w, a, n);
            ck_assert_msg(fabs(s - dq) <= tight,
                          "%s n=%lld: dot %.9g vs dequantised %.9g (bound %.3g)",
                          qi_type_get(t)->name, (long long)n, s, dq, tight);
            const double loose = tight + rt_bound(at) * sqrt(nw * nx);
            ck_assert_msg(fabs(s - dx) <= loose,
                          "%s n=%lld: dot %.9g vs float activations %.9g (bound %.3g)",
                          qi_type_get(t)->name, (long long)n, s, dx, loose);
            free(xw); free(xa); free(yw); free(ya); free(w); free(a);
        }
}
END_TEST

/* ---- exactness against ggml ------------------------------------------------------ */

START_TEST(test_golden_quantize) {
    require_goldens();
    int n_checked = 0, types_seen[QI_TYPE_COUNT] = {0};
    for (int i = 0; i < g_n_cases; i++) {
        const golden_case *c = &g_cases[i];
        if (c->kind != CASE_QUANT) continue;
        unsigned char *q = malloc(c->q_len + GUARD);
        ck_assert(q);
        memset(q + c->q_len, GUARD_BYTE, GUARD);
        qi_quantize_row_ref(c->type, c->x, q, c->n);
        check_guard(q + c->q_len, "quantize", c->type);
        const long d = first_byte_diff(q, c->q, c->q_len);
        ck_assert_msg(d < 0, "%s %s: byte %ld is %02x, ggml wrote %02x", qi_type_get(c->type)->name,
                      c->label, d, d < 0 ? 0 : q[d], d < 0 ? 0 : c->q[d]);
        free(q);
        types_seen[c->type] = 1;
        n_checked++;
    }
    for (int k = 0; k < N_TYPES; k++)
        ck_assert_msg(types_seen[k_types[k]], "no quantize golden for %s",
                      qi_type_get(k_types[k])->name);
    ck_assert_int_ge(n_checked, 60);
}
END_TEST

START_TEST(test_golden_dequantize) {
    require_goldens();
    int n_checked = 0, random_seen = 0;
    for (int i = 0; i < g_n_cases; i++) {
        const golden_case *c = &g_cases[i];
        if (c->kind == CASE_DOT) continue;
        float *y = malloc((size_t)c->n * sizeof *y);
        ck_assert(y);
        qi_dequantize_row_ref(c->type, c->q, y, c->n);
        const long d = first_float_diff(y, c->y, c->n);
        ck_assert_msg(d < 0, "%s %s: y[%ld] = %.9g, ggml %.9g", qi_type_get(c->type)->name,
                      c->label, d, d < 0 ? 0.0 : (double)y[d], d < 0 ? 0.0 : (double)c->y[d]);
        free(y);
        random_seen += c->kind == CASE_DEQUANT;
        n_checked++;
    }
    ck_assert_int_ge(random_seen, 10); /* one random-bytes case per block format */
    ck_assert_int_ge(n_checked, 70);
}
END_TEST

/* ggml's CPU backend dot (SIMD on the generating machine, so a different
 * summation order) must agree within 1e-5 * sum|w_i a_i|; ggml's generic
 * scalar dot, where recorded (all quantised weight types), bit for bit. */
START_TEST(test_golden_dot) {
    require_goldens();
    int n_checked = 0, n_exact = 0;
    for (int i = 0; i < g_n_cases; i++) {
        const golden_case *c = &g_cases[i];
        if (c->kind != CASE_DOT) continue;
        const uint32_t at = qi_vec_dot_type(c->type);
        float *yw = malloc((size_t)c->n * 4), *ya = malloc((size_t)c->n * 4);
        ck_assert(yw && ya);
        qi_dequantize_row_ref(c->type, c->q, yw, c->n);
        qi_dequantize_row_ref(at, c->a, ya, c->n);
        double dabs = 0;
        for (int64_t k = 0; k < c->n; k++) dabs += fabs((double)yw[k] * ya[k]);
        const float s = qi_vec_dot_ref(c->type, c->n, c->q, c->a);
        ck_assert_msg(fabs((double)s - c->s) <= 1e-5 * dabs, "%s n=%lld: dot %.9g, ggml %.9g",
                      qi_type_get(c->type)->name, (long long)c->n, (double)s, (double)c->s);
        if (c->has_g) {
            ck_assert_msg(f32_bits(s) == f32_bits(c->g), "%s n=%lld: dot %.9g, ggml generic %.9g",
                          qi_type_get(c->type)->name, (long long)c->n, (double)s, (double)c->g);
            n_exact++;
        }
        free(yw);
        free(ya);
        n_checked++;
    }
    ck_assert_int_ge(n_checked, 2 * N_WEIGHT_TYPES);
    ck_assert_int_ge(n_exact, 16); /* 8 quantised weight types x 2 rows */
}
END_TEST

/* Stress rows: the generator's StressRng/stress_row, mirrored exactly. Only
 * exactly rounded float32 operations, so both sides build identical rows. */
static uint64_t stress_rand(uint64_t *s) {
    uint64_t x = *s ? *s : 0x9E3779B97F4A7C15ull;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 0x2545F4914F6CDD1Dull;
}

static float stress_unit(uint64_t *s) {
    return (float)((double)(stress_rand(s) >> 40) / (double)(1 << 24)) * 2.0f - 1.0f;
}

static int64_t stress_row(uint64_t *rng, int r, int blck, float *x) {
    const int64_t n = (int64_t)(1 + r % (blck == 256 ? 2 : 3)) * blck;
    switch (r % 8) {
    case 0:
        for (int64_t i = 0; i < n; i++) x[i] = stress_unit(rng);
        break;
    case 1: {
        const int k = (int)(stress_rand(rng) % 25) - 12;
        for (int64_t i = 0; i < n; i++) x[i] = stress_unit(rng) * ldexpf(1.0f, k);
        break;
    }
    case 2:
        for (int64_t i = 0; i < n; i++) {
            const float v = stress_unit(rng);
            x[i] = v * v * v * 8.0f;
        }
        break;
    case 3:
        for (int64_t i = 0; i < n; i++) x[i] = floorf(stress_unit(rng) * 16.0f) * 0.25f;
        break;
    case 4:
        for (int64_t i = 0; i < n; i++) x[i] = stress_unit(rng) + 3.0f;
        break;
    case 5:
        for (int64_t i = 0; i < n; i++) {
            const bool keep = (stress_rand(rng) & 3) == 0;
            const float v = stress_unit(rng);
            x[i] = keep ? v : 0.0f;
        }
        break;
    case 6:
        for (int64_t i = 0; i < n; i++) {
            x[i] = stress_unit(rng) * 0.01f;
            if (i % 37 == 5) x[i] *= 100.0f;
        }
        break;
    default:
        for (int64_t g = 0; g < n / 32; g++) {
            const float c = stress_unit(rng);
            for (int l = 0; l < 32; l++) x[32 * g + l] = c;
            if (g % 2)
                for (int l = 0; l < 32; l++) x[32 * g + l] = c + stress_unit(rng) * 0.001f;
        }
        break;
    }
    return n;
}

/* Hundreds of rows per type whose ggml results the golden file keeps as
 * checksums: bytes of the quantised rows, bits of their dequantisation and,
 * for quantised weight types, bits of ggml's generic dot with an activation
 * row. Catches the rare-path differences a handful of explicit rows miss. */
START_TEST(test_golden_stress) {
    require_goldens();
    const uint32_t t = k_types[_i];
    const golden_stress *st = NULL;
    for (int k = 0; k < g_n_stress; k++)
        if (g_stress[k].type == t) st = &g_stress[k];
    ck_assert_msg(st, "no stress golden for %s", qi_type_get(t)->name);
    const int blck = elems_per_block(t);
    const uint32_t at = qi_type_can_dot(t) ? qi_vec_dot_type(t) : QI_TYPE_COUNT;
    float *x = malloc(3 * 256 * sizeof *x), *y = malloc(3 * 256 * sizeof *y);
    float *xa = malloc(3 * 256 * sizeof *xa);
    unsigned char *q = malloc(3 * 292 * 2), *a = malloc(3 * 292 * 2);
    ck_assert(x && y && xa && q && a);
    uint64_t rng = 0x5157 ^ ((uint64_t)t * 0x9E3779B97F4A7C15ull);
    checksum cq = {0, 0}, cy = {0, 0}, cd = {0, 0};
    for (int r = 0; r < st->rows; r++) {
        const int64_t n = stress_row(&rng, r, blck, x);
        const size_t nbytes = qi_row_bytes(t, n);
        memset(q, 0, nbytes);
        qi_quantize_row_ref(t, x, q, n);
        for (size_t i = 0; i < nbytes; i++) checksum_add(&cq, q[i]);
        qi_dequantize_row_ref(t, q, y, n);
        for (int64_t i = 0; i < n; i++) checksum_add(&cy, f32_bits(y[i]));
        if (st->has_dot) {
            for (int64_t i = 0; i < n; i++) xa[i] = stress_unit(&rng) * 2.0f;
            memset(a, 0, qi_row_bytes(at, n));
            qi_quantize_row_ref(at, xa, a, n);
            checksum_add(&cd, f32_bits(qi_vec_dot_ref(t, n, q, a)));
        }
    }
    ck_assert_msg(cq.total == st->q_sum, "%s: quantised bytes differ from ggml on the stress rows",
                  qi_type_get(t)->name);
    ck_assert_msg(cy.total == st->y_sum,
                  "%s: dequantised floats differ from ggml on the stress rows",
                  qi_type_get(t)->name);
    if (st->has_dot)
        ck_assert_msg(cd.total == st->dot_sum,
                      "%s: dots differ from ggml's generic vec_dot on the stress rows",
                      qi_type_get(t)->name);
    else
        ck_assert_msg(!qi_type_can_dot(t) || t == QI_TYPE_F32 || t == QI_TYPE_F16 ||
                          t == QI_TYPE_BF16,
                      "%s: stress golden lacks generic dot results", qi_type_get(t)->name);
    free(x); free(y); free(xa); free(q); free(a);
}
END_TEST

/* ---- planted faults ------------------------------------------------------------ */

static const golden_case *find_case(case_kind kind, uint32_t t, const char *label) {
    for (int i = 0; i < g_n_cases; i++)
        if (g_cases[i].kind == kind && g_cases[i].type == t && !strcmp(g_cases[i].label, label))
            return &g_cases[i];
    ck_abort_msg("golden case %s %s missing", qi_type_get(t)->name, label);
    return NULL;
}

/* Swapping the nibbles of Q4_0's quants (element j+16 low, j high) is the
 * classic layout mistake; the byte comparison must see it, and so must the
 * float comparison when a dequantizer makes it. */
START_TEST(test_planted_nibble_swap) {
    require_goldens();
    const golden_case *c = find_case(CASE_QUANT, QI_TYPE_Q4_0, "gauss_outlier");
    unsigned char *q = malloc(c->q_len);
    float *y = malloc((size_t)c->n * 4);
    ck_assert(q && y);
    qi_quantize_row_ref(QI_TYPE_Q4_0, c->x, q, c->n);
    ck_assert(first_byte_diff(q, c->q, c->q_len) < 0);
    for (int64_t b = 0; b < c->n / QI_QK; b++)
        for (int j = 0; j < 16; j++) {
            unsigned char *p = &q[b * 18 + 2 + j];
            *p = (unsigned char)((*p >> 4) | (*p << 4));
        }
    ck_assert_msg(first_byte_diff(q, c->q, c->q_len) >= 0, "swapped nibbles not detected");
    qi_dequantize_row_ref(QI_TYPE_Q4_0, q, y, c->n);
    ck_assert_msg(first_float_diff(y, c->y, c->n) >= 0, "swapped-nibble decode not detected");
    free(q);
    free(y);
}
END_TEST

/* Q8_0 rounds half away from zero (roundf); a kernel using round-to-even
 * (rint, or a SIMD default) must fail the tie-heavy golden row. */
START_TEST(test_planted_round_even) {
    require_goldens();
    const golden_case *c = find_case(CASE_QUANT, QI_TYPE_Q8_0, "zero_ties");
    unsigned char *q = malloc(c->q_len);
    ck_assert(q);
    for (int64_t b = 0; b < c->n / QI_QK; b++) {
        const float *x = c->x + b * QI_QK;
        float amax = 0;
        for (int j = 0; j < QI_QK; j++) amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
        const float d = amax / 127, id = d ? 1.0f / d : 0.0f;
        qi_block_q8_0 blk;
        blk.d = qi_f32_to_fp16(d);
        for (int j = 0; j < QI_QK; j++) blk.qs[j] = (int8_t)nearbyintf(x[j] * id); /* the fault */
        memcpy(q + b * 34, &blk, 34);
    }
    ck_assert_msg(first_byte_diff(q, c->q, c->q_len) >= 0, "round-to-even not detected");
    free(q);
}
END_TEST

/* A flipped fifth bit in Q5_0's qh, and K scales read with the sub-block
 * 0-3 rule for all eight sub-blocks, must both change the decoded floats. */
START_TEST(test_planted_bits) {
    require_goldens();
    const golden_case *c = find_case(CASE_DEQUANT, QI_TYPE_Q5_0, "random_bytes");
    unsigned char *q = malloc(c->q_len);
    float *y = malloc((size_t)c->n * 4);
    ck_assert(q && y);
    memcpy(q, c->q, c->q_len);
    q[2 + 3] ^= 0x10; /* block 0, qh bit 28: element 28 */
    qi_dequantize_row_ref(QI_TYPE_Q5_0, q, y, c->n);
    ck_assert_int_eq(first_float_diff(y, c->y, c->n), 28);
    free(q);
    free(y);

    const golden_case *k = find_case(CASE_DEQUANT, QI_TYPE_Q4_K, "random_bytes");
    const qi_block_q4_K *b = (const qi_block_q4_K *)k->q;
    float *yk = malloc(256 * 4);
    ck_assert(yk);
    const float d = qi_fp16_to_f32(b->d), dmin = qi_fp16_to_f32(b->dmin);
    for (int s = 0; s < 8; s++) {
        const int sc = b->scales[s % 4] & 63, mn = b->scales[s % 4 + 4] & 63; /* the fault */
        for (int l = 0; l < 32; l++) {
            const int qv = (s & 1) ? b->qs[32 * (s / 2) + l] >> 4 : b->qs[32 * (s / 2) + l] & 15;
            yk[32 * s + l] = d * (float)sc * (float)qv - dmin * (float)mn;
        }
    }
    ck_assert_msg(first_float_diff(yk, k->y, 128) < 0, "fault model wrong for sub-blocks 0-3");
    ck_assert_msg(first_float_diff(yk, k->y, 256) >= 128, "misread K scales not detected");
    free(yk);
}
END_TEST

static Suite *quant_suite(void) {
    Suite *s = suite_create("quant");
    TCase *tc = tcase_create("conversions");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_fp16_exhaustive);
    tcase_add_test(tc, test_fp16_known_values);
    tcase_add_test(tc, test_fp16_vs_oracle);
    tcase_add_test(tc, test_bf16);
    tcase_add_test(tc, test_conversions_match_ggml);
    suite_add_tcase(s, tc);

    tc = tcase_create("formats");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_api_tables);
    tcase_add_loop_test(tc, test_round_trip, 0, N_TYPES);
    tcase_add_loop_test(tc, test_zero_rows, 0, N_TYPES);
    tcase_add_loop_test(tc, test_dot_consistency, 0, N_WEIGHT_TYPES);
    suite_add_tcase(s, tc);

    tc = tcase_create("golden");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_golden_quantize);
    tcase_add_test(tc, test_golden_dequantize);
    tcase_add_test(tc, test_golden_dot);
    tcase_add_loop_test(tc, test_golden_stress, 0, N_TYPES);
    tcase_add_test(tc, test_planted_nibble_swap);
    tcase_add_test(tc, test_planted_round_even);
    tcase_add_test(tc, test_planted_bits);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    /* loaded once here; forked test processes inherit the parsed cases */
    if (!load_goldens()) fprintf(stderr, "test_quant: %s\n", g_load_err);
    SRunner *sr = srunner_create(quant_suite());
    srunner_run_all(sr, CK_NORMAL);
    const int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

/* test_gguf.c - Check suite for the GGUF reader and writer.
 *
 * Three kinds of tests: round trips (writer -> reader) over every value type,
 * nested and string arrays, both versions, several alignments and tensor
 * types; one hand-crafted bad file per validation rule, asserting the status
 * and that the message names the file and the problem; and fault injection
 * (every allocation of open and of the writer fails in turn). The real
 * SmolLM2 model is checked against figures read with llama.cpp's gguf-py when
 * it is cached, and skipped otherwise.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "qinfer/gguf.h"
#include "testutil.h"

/* ---- A byte builder for hand-made files ---------------------------------- */

typedef struct {
    unsigned char *p;
    size_t n, cap;
} bb;

static void bb_put(bb *b, const void *d, size_t n) {
    if (b->n + n > b->cap) {
        size_t nc = b->cap ? b->cap : 256;
        while (nc < b->n + n) nc *= 2;
        b->p = realloc(b->p, nc);
        ck_assert_ptr_nonnull(b->p);
        b->cap = nc;
    }
    if (n) memcpy(b->p + b->n, d, n);
    b->n += n;
}

static void bb_le(bb *b, uint64_t v, unsigned n) {
    unsigned char t[8];
    for (unsigned i = 0; i < n; i++) t[i] = (unsigned char)(v >> (8 * i));
    bb_put(b, t, n);
}
static void bb_u32(bb *b, uint32_t v) { bb_le(b, v, 4); }
static void bb_u64(bb *b, uint64_t v) { bb_le(b, v, 8); }
static void bb_strn(bb *b, const char *s, size_t n) {
    bb_u64(b, n);
    bb_put(b, s, n);
}
static void bb_str(bb *b, const char *s) { bb_strn(b, s, strlen(s)); }
static void bb_hdr(bb *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
    bb_put(b, "GGUF", 4);
    bb_u32(b, version);
    bb_u64(b, n_tensors);
    bb_u64(b, n_kv);
}
static void bb_kv_u32(bb *b, const char *key, uint32_t v) {
    bb_str(b, key);
    bb_u32(b, QI_GGUF_U32);
    bb_u32(b, v);
}
static void bb_tinfo(bb *b, const char *name, uint32_t n_dims, const uint64_t *ne, uint32_t type,
                     uint64_t offset) {
    bb_str(b, name);
    bb_u32(b, n_dims);
    for (uint32_t i = 0; i < n_dims; i++) bb_u64(b, ne[i]);
    bb_u32(b, type);
    bb_u64(b, offset);
}
static void bb_pad(bb *b, size_t align) {
    while (b->n % align) bb_put(b, "", 1);
}
static void bb_zeros(bb *b, size_t n) {
    for (size_t i = 0; i < n; i++) bb_put(b, "", 1);
}
static void bb_free(bb *b) {
    free(b->p);
    memset(b, 0, sizeof *b);
}

/* Open a copy of (p, n) in an exactly-sized heap buffer, so ASan sees any
 * overread. On success the copy is returned through *keep (caller frees after
 * closing). */
static qi_status open_copy(const void *p, size_t n, qi_gguf **g, qi_err *e, void **keep) {
    void *c = malloc(n ? n : 1);
    ck_assert_ptr_nonnull(c);
    if (n) memcpy(c, p, n);
    qi_status s = qi_gguf_open_memory(c, n, "bad.gguf", g, e);
    if (s == QI_OK) {
        *keep = c;
    } else {
        free(c);
        *keep = NULL;
    }
    return s;
}

#define expect_fail(b, code_, needle) expect_fail_((b)->p, (b)->n, (code_), (needle), __LINE__)

static void expect_fail_(const void *p, size_t n, qi_status code, const char *needle, int line) {
    qi_gguf *g = (qi_gguf *)&g; /* must be reset to NULL */
    qi_err e = {0};
    void *keep;
    qi_status s = open_copy(p, n, &g, &e, &keep);
    ck_assert_msg(s == code, "line %d: status %d (%s), want %d; msg: %s", line, s,
                  qi_status_str(s), code, e.msg);
    ck_assert_msg(g == NULL, "line %d: out not NULL on failure", line);
    ck_assert_int_eq(e.code, code);
    ck_assert_msg(strncmp(e.msg, "bad.gguf: ", 10) == 0, "line %d: msg lacks file name: %s",
                  line, e.msg);
    ck_assert_msg(strstr(e.msg, needle) != NULL, "line %d: msg '%s' lacks '%s'", line, e.msg,
                  needle);
}

static qi_gguf *open_ok(const void *p, size_t n, void **keep) {
    qi_gguf *g = NULL;
    qi_err e = {0};
    qi_status s = open_copy(p, n, &g, &e, keep);
    ck_assert_msg(s == QI_OK, "open failed: %s", e.msg);
    ck_assert_ptr_nonnull(g);
    return g;
}

static void close_kept(qi_gguf *g, void *keep) {
    qi_gguf_close(g);
    free(keep);
}

/* ---- Writer helpers ------------------------------------------------------ */

static void ok(qi_status s) { ck_assert_int_eq(s, QI_OK); }

static bool qs_eq(qi_str s, const char *p, size_t n) {
    return s.len == n && (n == 0 || memcmp(s.ptr, p, n) == 0);
}

/* Raw scalar encodings for the types without a typed setter. */
static void set_raw_le(qi_gguf_writer *w, const char *key, uint32_t type, uint64_t v,
                       unsigned n) {
    unsigned char t[8];
    for (unsigned i = 0; i < n; i++) t[i] = (unsigned char)(v >> (8 * i));
    ok(qi_gguf_writer_set_raw(w, key, type, t, n));
}

/* A nested array: [[1,2,3] as u32, ["x","", "\xff\x00z"] strings, [[-1 i8]],
 * []] encoded as ARRAY of ARRAY. */
static void build_nested(bb *b) {
    bb_u32(b, QI_GGUF_ARRAY);
    bb_u64(b, 4);
    bb_u32(b, QI_GGUF_U32);
    bb_u64(b, 3);
    bb_u32(b, 1);
    bb_u32(b, 2);
    bb_u32(b, 3);
    bb_u32(b, QI_GGUF_STRING);
    bb_u64(b, 3);
    bb_str(b, "x");
    bb_str(b, "");
    bb_strn(b, "\xff\0z", 3);
    bb_u32(b, QI_GGUF_ARRAY);
    bb_u64(b, 1);
    bb_u32(b, QI_GGUF_I8);
    bb_u64(b, 1);
    bb_put(b, "\xff", 1);
    bb_u32(b, QI_GGUF_F64);
    bb_u64(b, 0);
}

/* Data for a tensor: n_bytes of a deterministic pattern. */
static unsigned char *pattern(uint64_t n, uint64_t seed) {
    unsigned char *d = malloc(n);
    ck_assert_ptr_nonnull(d);
    uint64_t st = seed;
    for (uint64_t i = 0; i < n; i++) d[i] = (unsigned char)qi_test_rand(&st);
    return d;
}

typedef struct {
    const char *name;
    uint32_t type, n_dims;
    uint64_t ne[4];
} tspec;

static const tspec k_tensors[] = {
    {"tok_embd.weight", QI_TYPE_Q8_0, 2, {64, 10, 1, 1}},
    {"blk.0.attn_norm.weight", QI_TYPE_F32, 1, {7, 1, 1, 1}},
    {"blk.0.attn_q.weight", QI_TYPE_Q4_1, 2, {32, 3, 1, 1}},
    {"blk.0.ffn.weight", QI_TYPE_Q4_K, 3, {256, 2, 2, 1}},
    {"f16.4d", QI_TYPE_F16, 4, {3, 2, 2, 3}},
    {"q6k", QI_TYPE_Q6_K, 1, {512, 1, 1, 1}},
    {"ints", QI_TYPE_I32, 2, {5, 1, 1, 1}},
    {"bf16", QI_TYPE_BF16, 1, {1, 1, 1, 1}},
};
#define N_TENSORS (sizeof k_tensors / sizeof k_tensors[0])

static uint64_t spec_bytes(const tspec *t) {
    uint64_t row;
    ck_assert(qi_type_row_bytes(t->type, t->ne[0], &row));
    return row * t->ne[1] * t->ne[2] * t->ne[3];
}

/* Fill a writer with every value type, nested and string arrays and tensors.
 * align 0 means: no general.alignment key. */
static void fill_rich(qi_gguf_writer *w, uint32_t align) {
    set_raw_le(w, "v.u8", QI_GGUF_U8, 200, 1);
    set_raw_le(w, "v.i8", QI_GGUF_I8, (uint8_t)-5, 1);
    set_raw_le(w, "v.u16", QI_GGUF_U16, 65535, 2);
    set_raw_le(w, "v.i16", QI_GGUF_I16, (uint16_t)-300, 2);
    ok(qi_gguf_writer_set_u32(w, "v.u32", 4000000000u));
    ok(qi_gguf_writer_set_i32(w, "v.i32", -7));
    ok(qi_gguf_writer_set_f32(w, "v.f32", 1.5f));
    ok(qi_gguf_writer_set_bool(w, "v.bool", true));
    ok(qi_gguf_writer_set_bool(w, "v.false", false));
    ok(qi_gguf_writer_set_str(w, "v.str", "hello"));
    ok(qi_gguf_writer_set_str(w, "v.empty", ""));
    ok(qi_gguf_writer_set_u64(w, "v.u64", UINT64_MAX));
    ok(qi_gguf_writer_set_u64(w, "v.u64small", 5));
    ok(qi_gguf_writer_set_i64(w, "v.i64", INT64_MIN));
    ok(qi_gguf_writer_set_f64(w, "v.f64", -2.25));
    if (align) ok(qi_gguf_writer_set_u32(w, "general.alignment", align));

    const uint8_t a_u8[] = {0, 1, 255};
    const int8_t a_i8[] = {-128, 0, 127};
    const uint16_t a_u16[] = {0, 65535};
    const int16_t a_i16[] = {-32768, 32767};
    const uint32_t a_u32[] = {0, 4294967295u, 7};
    const int32_t a_i32[] = {INT32_MIN, -1, INT32_MAX};
    const float a_f32[] = {0.5f, -1.0f};
    const uint8_t a_bool[] = {1, 0, 1};
    const uint64_t a_u64[] = {UINT64_MAX, 0};
    const int64_t a_i64[] = {INT64_MIN, INT64_MAX};
    const double a_f64[] = {3.25, -0.0};
    ok(qi_gguf_writer_set_arr(w, "a.u8", QI_GGUF_U8, a_u8, 3));
    ok(qi_gguf_writer_set_arr(w, "a.i8", QI_GGUF_I8, a_i8, 3));
    ok(qi_gguf_writer_set_arr(w, "a.u16", QI_GGUF_U16, a_u16, 2));
    ok(qi_gguf_writer_set_arr(w, "a.i16", QI_GGUF_I16, a_i16, 2));
    ok(qi_gguf_writer_set_arr(w, "a.u32", QI_GGUF_U32, a_u32, 3));
    ok(qi_gguf_writer_set_arr(w, "a.i32", QI_GGUF_I32, a_i32, 3));
    ok(qi_gguf_writer_set_arr(w, "a.f32", QI_GGUF_F32, a_f32, 2));
    ok(qi_gguf_writer_set_arr(w, "a.bool", QI_GGUF_BOOL, a_bool, 3));
    ok(qi_gguf_writer_set_arr(w, "a.u64", QI_GGUF_U64, a_u64, 2));
    ok(qi_gguf_writer_set_arr(w, "a.i64", QI_GGUF_I64, a_i64, 2));
    ok(qi_gguf_writer_set_arr(w, "a.f64", QI_GGUF_F64, a_f64, 2));
    ok(qi_gguf_writer_set_arr(w, "a.empty", QI_GGUF_U32, NULL, 0));
    const char *strs[] = {"<s>", "", "hello world", "\xc4\xa0t"};
    ok(qi_gguf_writer_set_arr_str(w, "a.str", strs, 4));
    ok(qi_gguf_writer_set_arr_str(w, "a.str_empty", NULL, 0));
    bb nb = {0};
    build_nested(&nb);
    ok(qi_gguf_writer_set_raw(w, "a.nested", QI_GGUF_ARRAY, nb.p, nb.n));
    bb_free(&nb);

    for (size_t i = 0; i < N_TENSORS; i++) {
        const tspec *t = &k_tensors[i];
        uint64_t n = spec_bytes(t);
        unsigned char *d = pattern(n, i + 1);
        ok(qi_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, d, n));
        free(d);
    }
}

static void write_rich(uint32_t version, uint32_t align, void **buf, size_t *len) {
    qi_gguf_writer *w = qi_gguf_writer_create();
    ck_assert_ptr_nonnull(w);
    fill_rich(w, align);
    qi_err e = {0};
    qi_status s = qi_gguf_writer_to_memory(w, version, buf, len, &e);
    ck_assert_msg(s == QI_OK, "writer: %s", e.msg);
    qi_gguf_writer_free(w);
}

/* ---- Round trips ----------------------------------------------------------- */

static void check_rich(qi_gguf *g, uint32_t version, uint32_t align, const void *buf) {
    ck_assert_uint_eq(qi_gguf_version(g), version);
    ck_assert_uint_eq(qi_gguf_alignment(g), align ? align : 32);
    ck_assert_uint_eq(qi_gguf_n_kv(g), 15 + (align ? 1 : 0) + 15);
    ck_assert_uint_eq(qi_gguf_data_offset(g) % qi_gguf_alignment(g), 0);

    const qi_gguf_kv *kv = qi_gguf_kv_at(g, 0);
    ck_assert(qi_str_eq(qi_gguf_kv_key(kv), "v.u8"));
    ck_assert_int_eq(qi_gguf_kv_type(kv), QI_GGUF_U8);
    ck_assert_ptr_null(qi_gguf_kv_at(g, qi_gguf_n_kv(g)));
    ck_assert_ptr_null(qi_gguf_kv_find(g, "nope"));
    ck_assert_ptr_null(qi_gguf_kv_find(g, "v.u"));
    for (uint64_t i = 0; i < qi_gguf_n_kv(g); i++) {
        const qi_gguf_kv *k = qi_gguf_kv_at(g, i);
        qi_str key = qi_gguf_kv_key(k);
        char tmp[64];
        ck_assert_uint_lt(key.len, sizeof tmp);
        memcpy(tmp, key.ptr, key.len);
        tmp[key.len] = 0;
        ck_assert_ptr_eq(qi_gguf_kv_find(g, tmp), k);
    }

    int64_t i64;
    uint64_t u64;
    double f;
    bool b;
    qi_str s;
    ck_assert(qi_gguf_get_u64(g, "v.u8", &u64) && u64 == 200);
    ck_assert(qi_gguf_get_i64(g, "v.i8", &i64) && i64 == -5);
    ck_assert(qi_gguf_get_u64(g, "v.u16", &u64) && u64 == 65535);
    ck_assert(qi_gguf_get_i64(g, "v.i16", &i64) && i64 == -300);
    ck_assert(qi_gguf_get_u64(g, "v.u32", &u64) && u64 == 4000000000u);
    ck_assert(qi_gguf_get_i64(g, "v.i32", &i64) && i64 == -7);
    ck_assert(qi_gguf_get_f64(g, "v.f32", &f) && f == 1.5);
    ck_assert(qi_gguf_get_bool(g, "v.bool", &b) && b);
    ck_assert(qi_gguf_get_bool(g, "v.false", &b) && !b);
    ck_assert(qi_gguf_get_str(g, "v.str", &s) && qi_str_eq(s, "hello"));
    ck_assert(qi_gguf_get_str(g, "v.empty", &s) && s.len == 0);
    ck_assert(qi_gguf_get_u64(g, "v.u64", &u64) && u64 == UINT64_MAX);
    ck_assert(qi_gguf_get_i64(g, "v.i64", &i64) && i64 == INT64_MIN);
    ck_assert(qi_gguf_get_f64(g, "v.f64", &f) && f == -2.25);

    qi_gguf_arr a;
    ck_assert(qi_gguf_get_arr(g, "a.u8", &a) && a.type == QI_GGUF_U8 && a.n == 3);
    ck_assert(qi_gguf_arr_i64(&a, 2, &i64) && i64 == 255);
    ck_assert(qi_gguf_get_arr(g, "a.i8", &a) && a.type == QI_GGUF_I8 && a.n == 3);
    ck_assert(qi_gguf_arr_i64(&a, 0, &i64) && i64 == -128);
    ck_assert(qi_gguf_arr_i64(&a, 2, &i64) && i64 == 127);
    ck_assert(qi_gguf_get_arr(g, "a.u16", &a) && a.type == QI_GGUF_U16);
    ck_assert(qi_gguf_arr_i64(&a, 1, &i64) && i64 == 65535);
    ck_assert(qi_gguf_get_arr(g, "a.i16", &a) && a.type == QI_GGUF_I16);
    ck_assert(qi_gguf_arr_i64(&a, 0, &i64) && i64 == -32768);
    ck_assert(qi_gguf_get_arr(g, "a.u32", &a) && a.type == QI_GGUF_U32 && a.n == 3);
    ck_assert(qi_gguf_arr_u64(&a, 1, &u64) && u64 == 4294967295u);
    ck_assert(qi_gguf_get_arr(g, "a.i32", &a) && a.type == QI_GGUF_I32);
    ck_assert(qi_gguf_arr_i64(&a, 0, &i64) && i64 == INT32_MIN);
    ck_assert(qi_gguf_arr_i64(&a, 2, &i64) && i64 == INT32_MAX);
    ck_assert(qi_gguf_get_arr(g, "a.f32", &a) && a.type == QI_GGUF_F32);
    ck_assert(qi_gguf_arr_f64(&a, 1, &f) && f == -1.0);
    ck_assert(qi_gguf_get_arr(g, "a.bool", &a) && a.type == QI_GGUF_BOOL);
    ck_assert(qi_gguf_arr_i64(&a, 1, &i64) && i64 == 0);
    ck_assert(qi_gguf_arr_i64(&a, 2, &i64) && i64 == 1);
    ck_assert(qi_gguf_get_arr(g, "a.u64", &a) && a.type == QI_GGUF_U64);
    ck_assert(qi_gguf_arr_u64(&a, 0, &u64) && u64 == UINT64_MAX);
    ck_assert(qi_gguf_get_arr(g, "a.i64", &a) && a.type == QI_GGUF_I64);
    ck_assert(qi_gguf_arr_i64(&a, 0, &i64) && i64 == INT64_MIN);
    ck_assert(qi_gguf_arr_i64(&a, 1, &i64) && i64 == INT64_MAX);
    ck_assert(qi_gguf_get_arr(g, "a.f64", &a) && a.type == QI_GGUF_F64);
    ck_assert(qi_gguf_arr_f64(&a, 0, &f) && f == 3.25);
    ck_assert(qi_gguf_arr_f64(&a, 1, &f) && f == 0.0 && signbit(f));
    ck_assert(qi_gguf_get_arr(g, "a.empty", &a) && a.type == QI_GGUF_U32 && a.n == 0);
    ck_assert(!qi_gguf_arr_i64(&a, 0, &i64));

    ck_assert(qi_gguf_get_arr(g, "a.str", &a) && a.type == QI_GGUF_STRING && a.n == 4);
    ck_assert(qi_gguf_arr_str(&a, 0, &s) && qi_str_eq(s, "<s>"));
    ck_assert(qi_gguf_arr_str(&a, 1, &s) && s.len == 0);
    ck_assert(qi_gguf_arr_str(&a, 2, &s) && qi_str_eq(s, "hello world"));
    ck_assert(qi_gguf_arr_str(&a, 3, &s) && qi_str_eq(s, "\xc4\xa0t"));
    ck_assert(!qi_gguf_arr_str(&a, 4, &s));
    ck_assert(qi_gguf_get_arr(g, "a.str_empty", &a) && a.type == QI_GGUF_STRING && a.n == 0);
    ck_assert(!qi_gguf_arr_str(&a, 0, &s));

    qi_gguf_arr in, in2;
    ck_assert(qi_gguf_get_arr(g, "a.nested", &a) && a.type == QI_GGUF_ARRAY && a.n == 4);
    ck_assert(qi_gguf_arr_arr(&a, 0, &in) && in.type == QI_GGUF_U32 && in.n == 3);
    ck_assert(qi_gguf_arr_i64(&in, 2, &i64) && i64 == 3);
    ck_assert(qi_gguf_arr_arr(&a, 1, &in) && in.type == QI_GGUF_STRING && in.n == 3);
    ck_assert(qi_gguf_arr_str(&in, 0, &s) && qi_str_eq(s, "x"));
    ck_assert(qi_gguf_arr_str(&in, 1, &s) && s.len == 0);
    ck_assert(qi_gguf_arr_str(&in, 2, &s) && qs_eq(s, "\xff\0z", 3));
    ck_assert(qi_gguf_arr_arr(&a, 2, &in) && in.type == QI_GGUF_ARRAY && in.n == 1);
    ck_assert(qi_gguf_arr_arr(&in, 0, &in2) && in2.type == QI_GGUF_I8 && in2.n == 1);
    ck_assert(qi_gguf_arr_i64(&in2, 0, &i64) && i64 == -1);
    ck_assert(qi_gguf_arr_arr(&a, 3, &in) && in.type == QI_GGUF_F64 && in.n == 0);
    ck_assert(!qi_gguf_arr_arr(&a, 4, &in));

    ck_assert_uint_eq(qi_gguf_n_tensors(g), N_TENSORS);
    const unsigned char *base = buf;
    for (size_t i = 0; i < N_TENSORS; i++) {
        const tspec *ts = &k_tensors[i];
        const qi_gguf_tensor *t = qi_gguf_tensor_at(g, i);
        ck_assert_ptr_nonnull(t);
        ck_assert_ptr_eq(qi_gguf_tensor_find(g, ts->name), t);
        ck_assert(qi_str_eq(t->name, ts->name));
        ck_assert_uint_eq(t->type, ts->type);
        ck_assert_uint_eq(t->n_dims, ts->n_dims);
        for (int d = 0; d < 4; d++) ck_assert_uint_eq(t->ne[d], ts->ne[d]);
        uint64_t n = spec_bytes(ts);
        ck_assert_uint_eq(t->n_bytes, n);
        ck_assert_uint_eq(t->offset % qi_gguf_alignment(g), 0);
        ck_assert_ptr_eq(t->data, base + qi_gguf_data_offset(g) + t->offset);
        unsigned char *d = pattern(n, i + 1);
        ck_assert_int_eq(memcmp(t->data, d, n), 0);
        free(d);
    }
    ck_assert_ptr_null(qi_gguf_tensor_at(g, N_TENSORS));
    ck_assert_ptr_null(qi_gguf_tensor_find(g, "missing"));
}

/* _i: 0..7 -> version 2/3 x alignment {default, 1, 64, 256}. */
START_TEST(t_roundtrip) {
    static const uint32_t aligns[] = {0, 1, 64, 256};
    uint32_t version = 2 + (uint32_t)(_i & 1);
    uint32_t align = aligns[_i / 2];
    void *buf;
    size_t len;
    write_rich(version, align, &buf, &len);
    ck_assert_uint_eq(len % (align ? align : 32), 0);
    void *keep;
    qi_gguf *g = open_ok(buf, len, &keep);
    check_rich(g, version, align, keep);
    ck_assert_uint_eq(qi_gguf_file_size(g), len);
    ck_assert_str_eq(qi_gguf_path(g), "bad.gguf");
    close_kept(g, keep);
    qi_free(buf);
}
END_TEST

START_TEST(t_roundtrip_file) {
    char path[] = "/tmp/test_gguf_XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    close(fd);
    qi_gguf_writer *w = qi_gguf_writer_create();
    fill_rich(w, 64);
    qi_err e = {0};
    ck_assert_int_eq(qi_gguf_writer_to_file(w, 3, path, &e), QI_OK);
    qi_gguf_writer_free(w);
    qi_gguf *g = NULL;
    ck_assert_msg(qi_gguf_open(path, &g, &e) == QI_OK, "%s", e.msg);
    ck_assert_str_eq(qi_gguf_path(g), path);
    size_t len;
    char *bytes = qi_test_read_file(path, &len);
    ck_assert_uint_eq(qi_gguf_file_size(g), len);
    /* check_rich compares data pointers against the buffer: use the mapping's
     * base, derived from the first tensor. */
    const qi_gguf_tensor *t0 = qi_gguf_tensor_at(g, 0);
    const unsigned char *base = (const unsigned char *)t0->data - qi_gguf_data_offset(g) - t0->offset;
    check_rich(g, 3, 64, base);
    ck_assert_int_eq(memcmp(base, bytes, len), 0);
    free(bytes);
    qi_gguf_close(g);
    unlink(path);
}
END_TEST

START_TEST(t_open_errors) {
    qi_gguf *g = (qi_gguf *)&g;
    qi_err e = {0};
    ck_assert_int_eq(qi_gguf_open("/nonexistent/x.gguf", &g, &e), QI_ERR_IO);
    ck_assert_ptr_null(g);
    ck_assert_ptr_nonnull(strstr(e.msg, "/nonexistent/x.gguf"));
    qi_err_clear(&e);
    g = (qi_gguf *)&g;
    ck_assert_int_eq(qi_gguf_open("/tmp", &g, &e), QI_ERR_IO);
    ck_assert_ptr_null(g);
    ck_assert_ptr_nonnull(strstr(e.msg, "not a regular file"));

    /* An empty file goes through the mmap-less path. */
    char path[] = "/tmp/test_gguf_XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    close(fd);
    qi_err_clear(&e);
    ck_assert_int_eq(qi_gguf_open(path, &g, &e), QI_ERR_FORMAT);
    ck_assert_ptr_null(g);
    ck_assert_ptr_nonnull(strstr(e.msg, "truncated"));
    ck_assert_ptr_nonnull(strstr(e.msg, path));
    unlink(path);

    qi_err_clear(&e);
    ck_assert_int_eq(qi_gguf_open_memory(NULL, 4, "x", &g, &e), QI_ERR_INVALID);
    ck_assert_int_eq(qi_gguf_open_memory("GGUF", 4, "x", NULL, NULL), QI_ERR_INVALID);
    qi_gguf_close(NULL);
    qi_gguf_writer_free(NULL);
}
END_TEST

START_TEST(t_minimal) {
    bb b = {0};
    bb_hdr(&b, 3, 0, 0);
    void *keep;
    qi_gguf *g = open_ok(b.p, b.n, &keep);
    ck_assert_uint_eq(qi_gguf_n_kv(g), 0);
    ck_assert_uint_eq(qi_gguf_n_tensors(g), 0);
    ck_assert_uint_eq(qi_gguf_alignment(g), 32);
    ck_assert_ptr_null(qi_gguf_kv_find(g, "x"));
    ck_assert_ptr_null(qi_gguf_tensor_find(g, "x"));
    close_kept(g, keep);

    /* Writer output for an empty writer is the same 24 bytes. */
    qi_gguf_writer *w = qi_gguf_writer_create();
    void *buf;
    size_t len;
    ck_assert_int_eq(qi_gguf_writer_to_memory(w, 3, &buf, &len, NULL), QI_OK);
    ck_assert_uint_eq(len, 24);
    ck_assert_int_eq(memcmp(buf, b.p, 24), 0);
    qi_free(buf);
    qi_gguf_writer_free(w);
    bb_free(&b);
}
END_TEST

START_TEST(t_writer_replace_and_errors) {
    qi_gguf_writer *w = qi_gguf_writer_create();
    ok(qi_gguf_writer_set_u32(w, "k", 1));
    ok(qi_gguf_writer_set_str(w, "k", "now a string"));
    ok(qi_gguf_writer_set_u32(w, "k2", 2));
    ck_assert_int_eq(qi_gguf_writer_set_u32(w, "", 1), QI_ERR_INVALID);
    ck_assert_int_eq(qi_gguf_writer_set_u32(w, NULL, 1), QI_ERR_INVALID);
    ck_assert_int_eq(qi_gguf_writer_set_str(w, "s", NULL), QI_ERR_INVALID);
    ck_assert_int_eq(qi_gguf_writer_set_arr(w, "a", QI_GGUF_STRING, "x", 1), QI_ERR_INVALID);
    ck_assert_int_eq(qi_gguf_writer_set_arr(w, "a", QI_GGUF_ARRAY, "x", 1), QI_ERR_INVALID);
    ck_assert_int_eq(qi_gguf_writer_set_arr(w, "a", QI_GGUF_U8, NULL, 1), QI_ERR_INVALID);

    uint64_t ne[4] = {32, 2, 1, 1};
    float f[64] = {0};
    ck_assert_int_eq(qi_gguf_writer_add_tensor(w, "t", 4, 1, ne, f, 128), QI_ERR_INVALID);
    ck_assert_int_eq(qi_gguf_writer_add_tensor(w, "t", QI_TYPE_F32, 0, ne, f, 128),
                     QI_ERR_INVALID);
    ck_assert_int_eq(qi_gguf_writer_add_tensor(w, "t", QI_TYPE_F32, 5, ne, f, 128),
                     QI_ERR_INVALID);
    ck_assert_int_eq(qi_gguf_writer_add_tensor(w, "t", QI_TYPE_F32, 2, ne, f, 100),
                     QI_ERR_INVALID);
    uint64_t ne_odd[1] = {33};
    ck_assert_int_eq(qi_gguf_writer_add_tensor(w, "t", QI_TYPE_Q4_0, 1, ne_odd, NULL, 18),
                     QI_ERR_INVALID);
    uint64_t ne_zero[2] = {4, 0};
    ck_assert_int_eq(qi_gguf_writer_add_tensor(w, "t", QI_TYPE_F32, 2, ne_zero, NULL, 0),
                     QI_ERR_INVALID);
    ok(qi_gguf_writer_add_tensor(w, "t", QI_TYPE_F32, 2, ne, f, 256));
    ok(qi_gguf_writer_add_tensor(w, "zeros", QI_TYPE_F32, 1, ne, NULL, 128));
    ck_assert_int_eq(qi_gguf_writer_add_tensor(w, "t", QI_TYPE_F32, 2, ne, f, 256),
                     QI_ERR_INVALID);

    void *buf;
    size_t len;
    qi_err e = {0};
    ck_assert_int_eq(qi_gguf_writer_to_memory(w, 1, &buf, &len, &e), QI_ERR_INVALID);
    ck_assert_ptr_null(buf);
    qi_err_clear(&e);
    ck_assert_int_eq(qi_gguf_writer_to_memory(w, 4, &buf, &len, &e), QI_ERR_INVALID);
    ok(qi_gguf_writer_set_u32(w, "general.alignment", 48));
    qi_err_clear(&e);
    ck_assert_int_eq(qi_gguf_writer_to_memory(w, 3, &buf, &len, &e), QI_ERR_INVALID);
    ck_assert_ptr_nonnull(strstr(e.msg, "power of two"));
    ok(qi_gguf_writer_set_u64(w, "general.alignment", 64));
    qi_err_clear(&e);
    ck_assert_int_eq(qi_gguf_writer_to_memory(w, 3, &buf, &len, &e), QI_ERR_INVALID);
    ck_assert_ptr_nonnull(strstr(e.msg, "u32"));
    ok(qi_gguf_writer_set_u32(w, "general.alignment", 64));
    qi_err_clear(&e);
    ck_assert_int_eq(qi_gguf_writer_to_memory(w, 2, &buf, &len, &e), QI_OK);
    ck_assert_int_eq(qi_gguf_writer_to_file(w, 3, "/nonexistent/dir/x.gguf", &e), QI_ERR_IO);
    qi_gguf_writer_free(w);

    void *keep;
    qi_gguf *g = open_ok(buf, len, &keep);
    ck_assert_uint_eq(qi_gguf_n_kv(g), 3);
    qi_str s;
    ck_assert(qi_gguf_get_str(g, "k", &s) && qi_str_eq(s, "now a string"));
    ck_assert(qi_str_eq(qi_gguf_kv_key(qi_gguf_kv_at(g, 0)), "k"));
    ck_assert_uint_eq(qi_gguf_alignment(g), 64);
    const qi_gguf_tensor *t = qi_gguf_tensor_find(g, "zeros");
    ck_assert_ptr_nonnull(t);
    ck_assert_uint_eq(t->offset, 256); /* 256 bytes of "t", aligned to 64 */
    for (uint64_t i = 0; i < t->n_bytes; i++) ck_assert_uint_eq(((const uint8_t *)t->data)[i], 0);
    close_kept(g, keep);
    qi_free(buf);
}
END_TEST

/* ---- Getter coercions ------------------------------------------------------ */

START_TEST(t_coercions) {
    void *buf;
    size_t len;
    write_rich(3, 0, &buf, &len);
    void *keep;
    qi_gguf *g = open_ok(buf, len, &keep);
    int64_t i64 = 42;
    uint64_t u64 = 42;
    double f = 42;
    bool b = false;
    qi_str s = {"untouched", 9};
    qi_gguf_arr a = {0};

    /* Integer getters: any integer type whose value fits, and bool. */
    ck_assert(qi_gguf_get_i64(g, "v.u8", &i64) && i64 == 200);
    ck_assert(qi_gguf_get_i64(g, "v.u32", &i64) && i64 == 4000000000);
    ck_assert(qi_gguf_get_u64(g, "v.i64", &u64) == false && u64 == 42);
    ck_assert(qi_gguf_get_u64(g, "v.i8", &u64) == false && u64 == 42);
    i64 = 42;
    ck_assert(qi_gguf_get_i64(g, "v.u64", &i64) == false && i64 == 42); /* UINT64_MAX */
    ck_assert(qi_gguf_get_i64(g, "v.u64small", &i64) && i64 == 5);
    ck_assert(qi_gguf_get_u64(g, "v.i32", &u64) == false);
    ck_assert(qi_gguf_get_i64(g, "v.bool", &i64) && i64 == 1);
    ck_assert(qi_gguf_get_u64(g, "v.false", &u64) && u64 == 0);
    i64 = 42;
    u64 = 42;
    ck_assert(!qi_gguf_get_i64(g, "v.f32", &i64) && i64 == 42);
    ck_assert(!qi_gguf_get_u64(g, "v.f64", &u64) && u64 == 42);
    ck_assert(!qi_gguf_get_i64(g, "v.str", &i64));
    ck_assert(!qi_gguf_get_i64(g, "a.u8", &i64));
    ck_assert(!qi_gguf_get_i64(g, "missing", &i64) && i64 == 42);

    /* f64: every numeric type, not bool, string or array. */
    ck_assert(qi_gguf_get_f64(g, "v.i8", &f) && f == -5.0);
    ck_assert(qi_gguf_get_f64(g, "v.u64", &f) && f == 18446744073709551615.0);
    ck_assert(qi_gguf_get_f64(g, "v.i64", &f) && f == -9223372036854775808.0);
    f = 42;
    ck_assert(!qi_gguf_get_f64(g, "v.bool", &f) && f == 42);
    ck_assert(!qi_gguf_get_f64(g, "v.str", &f) && f == 42);
    ck_assert(!qi_gguf_get_f64(g, "missing", &f));

    /* bool, str, arr: exact type only. */
    ck_assert(!qi_gguf_get_bool(g, "v.u8", &b) && !b);
    ck_assert(!qi_gguf_get_bool(g, "missing", &b));
    ck_assert(!qi_gguf_get_str(g, "v.u32", &s) && s.len == 9);
    ck_assert(!qi_gguf_get_str(g, "a.str", &s) && s.len == 9);
    ck_assert(!qi_gguf_get_arr(g, "v.str", &a) && a.impl_ == NULL);
    ck_assert(!qi_gguf_get_arr(g, "missing", &a));

    /* kv_* on NULL entries. */
    ck_assert(!qi_gguf_kv_i64(NULL, &i64));
    ck_assert(!qi_gguf_kv_u64(NULL, &u64));
    ck_assert(!qi_gguf_kv_f64(NULL, &f));
    ck_assert(!qi_gguf_kv_bool(NULL, &b));
    ck_assert(!qi_gguf_kv_str(NULL, &s));
    ck_assert(!qi_gguf_kv_arr(NULL, &a));
    ck_assert_uint_eq(qi_gguf_kv_key(NULL).len, 0);

    /* Array elements follow the same rules. */
    ck_assert(qi_gguf_get_arr(g, "a.f32", &a));
    i64 = 42;
    ck_assert(!qi_gguf_arr_i64(&a, 0, &i64) && i64 == 42);
    ck_assert(qi_gguf_arr_f64(&a, 0, &f) && f == 0.5);
    ck_assert(!qi_gguf_arr_f64(&a, 2, &f));
    ck_assert(!qi_gguf_arr_str(&a, 0, &s));
    ck_assert(!qi_gguf_arr_arr(&a, 0, &a) && a.type == QI_GGUF_F32);
    ck_assert(qi_gguf_get_arr(g, "a.i32", &a));
    ck_assert(qi_gguf_arr_f64(&a, 1, &f) && f == -1.0);
    ck_assert(!qi_gguf_arr_u64(&a, 1, &u64));
    ck_assert(qi_gguf_arr_u64(&a, 2, &u64) && u64 == INT32_MAX);
    ck_assert(qi_gguf_get_arr(g, "a.u64", &a));
    ck_assert(!qi_gguf_arr_i64(&a, 0, &i64)); /* UINT64_MAX does not fit */
    ck_assert(qi_gguf_arr_i64(&a, 1, &i64) && i64 == 0);
    ck_assert(qi_gguf_get_arr(g, "a.bool", &a));
    ck_assert(!qi_gguf_arr_f64(&a, 0, &f));
    ck_assert(qi_gguf_arr_u64(&a, 0, &u64) && u64 == 1);
    ck_assert(qi_gguf_get_arr(g, "a.str", &a));
    ck_assert(!qi_gguf_arr_i64(&a, 0, &i64));
    ck_assert(!qi_gguf_arr_f64(&a, 0, &f));
    ck_assert(qi_gguf_get_arr(g, "a.nested", &a));
    ck_assert(!qi_gguf_arr_i64(&a, 0, &i64));
    ck_assert(!qi_gguf_arr_str(&a, 0, &s));
    qi_gguf_arr zero = {0};
    ck_assert(!qi_gguf_arr_i64(&zero, 0, &i64));
    ck_assert(!qi_gguf_arr_str(NULL, 0, &s));

    ck_assert_str_eq(qi_gguf_vtype_name(QI_GGUF_U32), "u32");
    ck_assert_str_eq(qi_gguf_vtype_name(QI_GGUF_STRING), "string");
    ck_assert_str_eq(qi_gguf_vtype_name(QI_GGUF_ARRAY), "array");
    ck_assert_str_eq(qi_gguf_vtype_name(QI_GGUF_F64), "f64");
    ck_assert_str_eq(qi_gguf_vtype_name(13), "?");
    ck_assert(qi_str_eq((qi_str){"ab", 2}, "ab"));
    ck_assert(!qi_str_eq((qi_str){"ab", 2}, "abc"));
    ck_assert(!qi_str_eq((qi_str){"ab", 2}, NULL));
    ck_assert(qi_str_eq((qi_str){NULL, 0}, ""));
    close_kept(g, keep);
    qi_free(buf);
}
END_TEST

/* ---- Validation: one bad file per rule ------------------------------------ */

START_TEST(t_bad_magic) {
    bb b = {0};
    bb_put(&b, "GGML", 4);
    bb_u32(&b, 3);
    bb_u64(&b, 0);
    bb_u64(&b, 0);
    expect_fail(&b, QI_ERR_FORMAT, "bad magic");
    bb_free(&b);
}
END_TEST

START_TEST(t_bad_version) {
    bb b = {0};
    bb_hdr(&b, 1, 0, 0);
    expect_fail(&b, QI_ERR_UNSUPPORTED, "unsupported version 1");
    bb_free(&b);
    bb_hdr(&b, 4, 0, 0);
    expect_fail(&b, QI_ERR_UNSUPPORTED, "unsupported version 4");
    bb_free(&b);
    bb_hdr(&b, 0, 0, 0);
    expect_fail(&b, QI_ERR_UNSUPPORTED, "unsupported version 0");
    bb_free(&b);
    bb_hdr(&b, 0x03000000u, 0, 0);
    expect_fail(&b, QI_ERR_UNSUPPORTED, "big-endian");
    bb_free(&b);
}
END_TEST

/* Every proper prefix of a valid file must be rejected as truncated. */
START_TEST(t_truncation_anywhere) {
    void *buf;
    size_t len;
    write_rich(3, 0, &buf, &len);
    /* The writer pads after the last tensor; cutting only that padding
     * leaves a valid file. */
    void *keep;
    qi_gguf *full = open_ok(buf, len, &keep);
    uint64_t end = 0;
    for (uint64_t i = 0; i < qi_gguf_n_tensors(full); i++) {
        const qi_gguf_tensor *t = qi_gguf_tensor_at(full, i);
        if (qi_gguf_data_offset(full) + t->offset + t->n_bytes > end)
            end = qi_gguf_data_offset(full) + t->offset + t->n_bytes;
    }
    close_kept(full, keep);
    ck_assert_uint_lt(end, len);
    for (size_t n = end; n < len; n++) {
        qi_gguf *g = open_ok(buf, n, &keep);
        close_kept(g, keep);
    }
    for (size_t n = 0; n < end; n++) {
        qi_gguf *g = (qi_gguf *)&g;
        qi_err e = {0};
        qi_status s = open_copy(buf, n, &g, &e, &keep);
        ck_assert_msg(s == QI_ERR_FORMAT, "prefix %zu: status %d: %s", n, s, e.msg);
        ck_assert_ptr_null(g);
        ck_assert_msg(strstr(e.msg, "truncated") || strstr(e.msg, "past end of file") ||
                          strstr(e.msg, "could hold"),
                      "prefix %zu: %s", n, e.msg);
    }
    qi_free(buf);
}
END_TEST

START_TEST(t_string_past_end) {
    bb b = {0};
    bb_hdr(&b, 3, 0, 1);
    bb_u64(&b, 1000); /* key length */
    bb_put(&b, "abc", 3);
    bb_zeros(&b, 20);
    expect_fail(&b, QI_ERR_FORMAT, "key length 1000");
    bb_free(&b);

    bb_hdr(&b, 3, 0, 1);
    bb_str(&b, "k");
    bb_u32(&b, QI_GGUF_STRING);
    bb_u64(&b, UINT64_MAX); /* overflow bait */
    bb_zeros(&b, 8);
    expect_fail(&b, QI_ERR_FORMAT, "past end of file");
    bb_free(&b);

    bb_hdr(&b, 3, 0, 1);
    bb_str(&b, "k");
    bb_u32(&b, QI_GGUF_ARRAY);
    bb_u32(&b, QI_GGUF_STRING);
    bb_u64(&b, 2);
    bb_str(&b, "ok");
    bb_u64(&b, 0x7fffffffffffffffull);
    expect_fail(&b, QI_ERR_FORMAT, "string element 1 length");
    bb_free(&b);
}
END_TEST

START_TEST(t_array_past_end) {
    bb b = {0};
    /* u64 elements: 2^61 * 8 overflows 64 bits if multiplied naively. */
    bb_hdr(&b, 3, 0, 1);
    bb_str(&b, "k");
    bb_u32(&b, QI_GGUF_ARRAY);
    bb_u32(&b, QI_GGUF_U64);
    bb_u64(&b, 1ull << 61);
    bb_zeros(&b, 64);
    expect_fail(&b, QI_ERR_FORMAT, "past end of file");
    bb_free(&b);

    bb_hdr(&b, 3, 0, 1);
    bb_str(&b, "k");
    bb_u32(&b, QI_GGUF_ARRAY);
    bb_u32(&b, QI_GGUF_U32);
    bb_u64(&b, 5);
    bb_zeros(&b, 19);
    expect_fail(&b, QI_ERR_FORMAT, "array of 5 u32 elements");
    bb_free(&b);
}
END_TEST

START_TEST(t_absurd_counts) {
    bb b = {0};
    bb_hdr(&b, 3, 0, 1000);
    bb_kv_u32(&b, "a", 1);
    expect_fail(&b, QI_ERR_FORMAT, "kv count 1000");
    bb_free(&b);

    bb_hdr(&b, 3, UINT64_MAX, 0);
    bb_zeros(&b, 64);
    expect_fail(&b, QI_ERR_FORMAT, "tensor count");
    bb_free(&b);

    bb_hdr(&b, 3, 0, 1);
    bb_str(&b, "k");
    bb_u32(&b, QI_GGUF_ARRAY);
    bb_u32(&b, QI_GGUF_STRING);
    bb_u64(&b, 1ull << 62);
    bb_zeros(&b, 80);
    expect_fail(&b, QI_ERR_FORMAT, "larger than the rest of the file");
    bb_free(&b);

    bb_hdr(&b, 3, 0, 1);
    bb_str(&b, "k");
    bb_u32(&b, QI_GGUF_ARRAY);
    bb_u32(&b, QI_GGUF_ARRAY);
    bb_u64(&b, 100);
    bb_zeros(&b, 80);
    expect_fail(&b, QI_ERR_FORMAT, "array count 100");
    bb_free(&b);
}
END_TEST

START_TEST(t_unknown_value_type) {
    bb b = {0};
    bb_hdr(&b, 3, 0, 1);
    bb_str(&b, "weird");
    bb_u32(&b, 13);
    bb_u64(&b, 0);
    expect_fail(&b, QI_ERR_FORMAT, "kv 0 'weird': unknown value type 13");
    bb_free(&b);

    bb_hdr(&b, 3, 0, 1);
    bb_str(&b, "weird");
    bb_u32(&b, QI_GGUF_ARRAY);
    bb_u32(&b, 0xffffffffu);
    bb_u64(&b, 0);
    expect_fail(&b, QI_ERR_FORMAT, "unknown array element type 4294967295");
    bb_free(&b);
}
END_TEST

/* A file with one tensor info (given), a general.alignment kv when align != 0
 * and `data_bytes` of data. */
static void one_tensor(bb *b, const char *name, uint32_t n_dims, const uint64_t *ne,
                       uint32_t type, uint64_t offset, size_t data_bytes) {
    bb_hdr(b, 3, 1, 0);
    bb_tinfo(b, name, n_dims, ne, type, offset);
    bb_pad(b, 32);
    bb_zeros(b, data_bytes);
}

START_TEST(t_unknown_tensor_type) {
    bb b = {0};
    uint64_t ne[1] = {32};
    one_tensor(&b, "w", 1, ne, 4, 0, 256); /* ids 4 and 5 were retired Q4_2/Q4_3 */
    expect_fail(&b, QI_ERR_UNSUPPORTED, "tensor 0 'w': unknown tensor type 4");
    bb_free(&b);
    one_tensor(&b, "w", 1, ne, 1000, 0, 256);
    expect_fail(&b, QI_ERR_UNSUPPORTED, "unknown tensor type 1000");
    bb_free(&b);
}
END_TEST

START_TEST(t_bad_n_dims) {
    bb b = {0};
    uint64_t ne[5] = {1, 1, 1, 1, 1};
    one_tensor(&b, "w", 0, ne, QI_TYPE_F32, 0, 64);
    expect_fail(&b, QI_ERR_FORMAT, "n_dims 0");
    bb_free(&b);
    one_tensor(&b, "w", 5, ne, QI_TYPE_F32, 0, 64);
    expect_fail(&b, QI_ERR_FORMAT, "n_dims 5");
    bb_free(&b);
    one_tensor(&b, "w", 4, ne, QI_TYPE_F32, 0, 64);
    void *keep;
    qi_gguf *g = open_ok(b.p, b.n, &keep);
    ck_assert_uint_eq(qi_gguf_tensor_at(g, 0)->n_dims, 4);
    close_kept(g, keep);
    bb_free(&b);
}
END_TEST

START_TEST(t_dims_overflow) {
    bb b = {0};
    uint64_t ne[4] = {1ull << 32, 1ull << 32, 2, 1};
    one_tensor(&b, "w", 3, ne, QI_TYPE_F32, 0, 64);
    expect_fail(&b, QI_ERR_FORMAT, "overflow");
    bb_free(&b);
    /* Elements fit int64 but bytes do not fit u64. */
    uint64_t ne2[2] = {1ull << 40, 1ull << 22};
    one_tensor(&b, "w", 2, ne2, QI_TYPE_F64, 0, 64);
    expect_fail(&b, QI_ERR_FORMAT, "overflow");
    bb_free(&b);
    /* One row whose byte size alone overflows. */
    uint64_t ne4[1] = {1ull << 62};
    one_tensor(&b, "w", 1, ne4, QI_TYPE_F64, 0, 64);
    expect_fail(&b, QI_ERR_FORMAT, "size in bytes overflows");
    bb_free(&b);
    uint64_t ne3[2] = {4, 0};
    one_tensor(&b, "w", 2, ne3, QI_TYPE_F32, 0, 64);
    expect_fail(&b, QI_ERR_FORMAT, "dimension 1 is zero");
    bb_free(&b);
}
END_TEST

START_TEST(t_block_multiple) {
    bb b = {0};
    uint64_t ne[2] = {33, 2};
    one_tensor(&b, "blk.0.attn_q.weight", 2, ne, QI_TYPE_Q4_1, 0, 256);
    expect_fail(&b, QI_ERR_FORMAT, "not a multiple of the q4_1 block size 32");
    bb_free(&b);
    uint64_t ne2[1] = {255};
    one_tensor(&b, "w", 1, ne2, QI_TYPE_Q6_K, 0, 256);
    expect_fail(&b, QI_ERR_FORMAT, "block size 256");
    bb_free(&b);
}
END_TEST

START_TEST(t_misaligned_offset) {
    bb b = {0};
    uint64_t ne[1] = {4};
    one_tensor(&b, "w", 1, ne, QI_TYPE_F32, 16, 64);
    expect_fail(&b, QI_ERR_FORMAT, "not aligned to 32");
    bb_free(&b);
    /* With general.alignment = 16 the same offset is fine. */
    bb_hdr(&b, 3, 1, 1);
    bb_kv_u32(&b, "general.alignment", 16);
    bb_tinfo(&b, "w", 1, ne, QI_TYPE_F32, 16);
    bb_pad(&b, 16);
    bb_zeros(&b, 32);
    void *keep;
    qi_gguf *g = open_ok(b.p, b.n, &keep);
    ck_assert_uint_eq(qi_gguf_tensor_at(g, 0)->offset, 16);
    close_kept(g, keep);
    bb_free(&b);
}
END_TEST

START_TEST(t_tensor_past_eof) {
    bb b = {0};
    uint64_t ne[2] = {32, 2};
    /* 2 rows of q4_1 = 40 bytes; only 39 present. */
    one_tensor(&b, "blk.0.attn_q.weight", 2, ne, QI_TYPE_Q4_1, 0, 39);
    expect_fail(&b, QI_ERR_FORMAT, "tensor 0 'blk.0.attn_q.weight': data");
    expect_fail(&b, QI_ERR_FORMAT, "runs past end of file");
    bb_free(&b);
    one_tensor(&b, "w", 2, ne, QI_TYPE_Q4_1, 0xffffffffffffffe0ull, 64);
    expect_fail(&b, QI_ERR_FORMAT, "past end of file");
    bb_free(&b);
    /* Data section itself past the end (no padding present). */
    bb_hdr(&b, 3, 1, 0);
    bb_tinfo(&b, "w", 1, ne, QI_TYPE_F32, 0);
    expect_fail(&b, QI_ERR_FORMAT, "past end of file");
    bb_free(&b);
    /* Exactly fitting is fine. */
    one_tensor(&b, "w", 2, ne, QI_TYPE_Q4_1, 0, 40);
    void *keep;
    qi_gguf *g = open_ok(b.p, b.n, &keep);
    close_kept(g, keep);
    bb_free(&b);
}
END_TEST

START_TEST(t_overlap) {
    bb b = {0};
    uint64_t ne[1] = {16}; /* 64 bytes of f32 */
    bb_hdr(&b, 3, 3, 0);
    bb_tinfo(&b, "a", 1, ne, QI_TYPE_F32, 128);
    bb_tinfo(&b, "b", 1, ne, QI_TYPE_F32, 0);
    bb_tinfo(&b, "c", 1, ne, QI_TYPE_F32, 32); /* overlaps b */
    bb_pad(&b, 32);
    bb_zeros(&b, 192);
    expect_fail(&b, QI_ERR_FORMAT, "tensor 1 'b' (offset 0, 64 bytes) overlaps tensor 2 'c'");
    bb_free(&b);

    bb_hdr(&b, 3, 2, 0);
    bb_tinfo(&b, "a", 1, ne, QI_TYPE_F32, 64);
    bb_tinfo(&b, "b", 1, ne, QI_TYPE_F32, 64); /* same offset */
    bb_pad(&b, 32);
    bb_zeros(&b, 128);
    expect_fail(&b, QI_ERR_FORMAT, "overlaps");
    bb_free(&b);

    /* Touching but not overlapping, out of file order: fine. */
    bb_hdr(&b, 3, 2, 0);
    bb_tinfo(&b, "a", 1, ne, QI_TYPE_F32, 64);
    bb_tinfo(&b, "b", 1, ne, QI_TYPE_F32, 0);
    bb_pad(&b, 32);
    bb_zeros(&b, 128);
    void *keep;
    qi_gguf *g = open_ok(b.p, b.n, &keep);
    close_kept(g, keep);
    bb_free(&b);
}
END_TEST

START_TEST(t_duplicate_key) {
    bb b = {0};
    bb_hdr(&b, 3, 0, 3);
    bb_kv_u32(&b, "x", 1);
    bb_kv_u32(&b, "dup", 2);
    bb_str(&b, "dup");
    bb_u32(&b, QI_GGUF_STRING);
    bb_str(&b, "again");
    expect_fail(&b, QI_ERR_FORMAT, "duplicate key 'dup' (kv 1 and kv 2)");
    bb_free(&b);
}
END_TEST

START_TEST(t_duplicate_tensor) {
    bb b = {0};
    uint64_t ne[1] = {8};
    bb_hdr(&b, 3, 3, 0);
    bb_tinfo(&b, "w", 1, ne, QI_TYPE_F32, 0);
    bb_tinfo(&b, "v", 1, ne, QI_TYPE_F32, 32);
    bb_tinfo(&b, "w", 1, ne, QI_TYPE_F32, 64);
    bb_pad(&b, 32);
    bb_zeros(&b, 96);
    expect_fail(&b, QI_ERR_FORMAT, "duplicate tensor name 'w' (tensors 0 and 2)");
    bb_free(&b);
}
END_TEST

static void nested_chain(bb *b, unsigned depth) {
    bb_hdr(b, 3, 0, 1);
    bb_str(b, "deep");
    bb_u32(b, QI_GGUF_ARRAY);
    for (unsigned d = 1; d < depth; d++) {
        bb_u32(b, QI_GGUF_ARRAY);
        bb_u64(b, 1);
    }
    bb_u32(b, QI_GGUF_U8);
    bb_u64(b, 1);
    bb_put(b, "\x07", 1);
}

START_TEST(t_nesting_depth) {
    bb b = {0};
    nested_chain(&b, QI_GGUF_MAX_DEPTH);
    void *keep;
    qi_gguf *g = open_ok(b.p, b.n, &keep);
    qi_gguf_arr a;
    ck_assert(qi_gguf_get_arr(g, "deep", &a));
    for (unsigned d = 1; d < QI_GGUF_MAX_DEPTH; d++) ck_assert(qi_gguf_arr_arr(&a, 0, &a));
    int64_t v;
    ck_assert(qi_gguf_arr_i64(&a, 0, &v) && v == 7);
    close_kept(g, keep);
    bb_free(&b);

    nested_chain(&b, QI_GGUF_MAX_DEPTH + 1);
    expect_fail(&b, QI_ERR_FORMAT, "nested deeper than 8");
    bb_free(&b);

    /* Deep enough to blow a naive recursive parser's stack. */
    nested_chain(&b, 100000);
    expect_fail(&b, QI_ERR_FORMAT, "nested deeper");
    bb_free(&b);
}
END_TEST

START_TEST(t_bad_alignment) {
    bb b = {0};
    bb_hdr(&b, 3, 0, 1);
    bb_str(&b, "general.alignment");
    bb_u32(&b, QI_GGUF_U64);
    bb_u64(&b, 64);
    expect_fail(&b, QI_ERR_FORMAT, "general.alignment has type u64, expected u32");
    bb_free(&b);
    bb_hdr(&b, 3, 0, 1);
    bb_kv_u32(&b, "general.alignment", 0);
    expect_fail(&b, QI_ERR_FORMAT, "general.alignment 0 is not a power of two");
    bb_free(&b);
    bb_hdr(&b, 3, 0, 1);
    bb_kv_u32(&b, "general.alignment", 48);
    expect_fail(&b, QI_ERR_FORMAT, "48 is not a power of two");
    bb_free(&b);
    bb_hdr(&b, 3, 0, 1);
    bb_kv_u32(&b, "general.alignment", 0x80000000u);
    void *keep;
    qi_gguf *g = open_ok(b.p, b.n, &keep);
    ck_assert_uint_eq(qi_gguf_alignment(g), 0x80000000u);
    close_kept(g, keep);
    bb_free(&b);
}
END_TEST

START_TEST(t_empty_key) {
    bb b = {0};
    bb_hdr(&b, 3, 0, 2);
    bb_kv_u32(&b, "ok", 1);
    bb_kv_u32(&b, "", 1);
    expect_fail(&b, QI_ERR_FORMAT, "kv 1: key is empty");
    bb_free(&b);
}
END_TEST

/* Keys and names need not be UTF-8; messages escape them. */
START_TEST(t_binary_names) {
    bb b = {0};
    bb_hdr(&b, 3, 2, 2);
    bb_strn(&b, "k\xff\0", 3);
    bb_u32(&b, QI_GGUF_U8);
    bb_put(&b, "\x01", 1);
    bb_strn(&b, "k\xff", 2);
    bb_u32(&b, QI_GGUF_BOOL);
    bb_put(&b, "\x02", 1); /* a bool byte other than 0/1 reads as true */
    size_t kv_end = b.n;
    uint64_t ne[1] = {8};
    bb_u64(&b, 2);
    bb_put(&b, "t\n", 2);
    bb_u32(&b, 1);
    bb_u64(&b, ne[0]);
    bb_u32(&b, QI_TYPE_F32);
    bb_u64(&b, 0);
    bb_u64(&b, 2);
    bb_put(&b, "t\n", 2);
    bb_u32(&b, 1);
    bb_u64(&b, ne[0]);
    bb_u32(&b, QI_TYPE_F32);
    bb_u64(&b, 32);
    bb_pad(&b, 32);
    bb_zeros(&b, 64);
    expect_fail(&b, QI_ERR_FORMAT, "duplicate tensor name 't\\x0a'");

    /* The keys alone (differing only after a 0xff byte) are distinct. */
    b.n = kv_end;
    b.p[8] = 0; /* tensor count 0 */
    void *keep;
    qi_gguf *g = open_ok(b.p, b.n, &keep);
    bool v = false;
    ck_assert(qi_gguf_get_bool(g, "k\xff", &v) && v);
    ck_assert(qs_eq(qi_gguf_kv_key(qi_gguf_kv_at(g, 0)), "k\xff\0", 3));
    close_kept(g, keep);
    bb_free(&b);
}
END_TEST

/* ---- Fault injection ------------------------------------------------------- */

START_TEST(t_alloc_failures_open) {
    void *buf;
    size_t len;
    write_rich(3, 64, &buf, &len);
    int failures = 0;
    bool opened = false;
    for (long n = 1; n <= 100 && !opened; n++) {
        qi_gguf *g = (qi_gguf *)&g;
        qi_err e = {0};
        qi_alloc_fail_after(n);
        qi_status s = qi_gguf_open_memory(buf, len, "mem.gguf", &g, &e);
        qi_alloc_fail_after(0);
        if (s == QI_OK) {
            check_rich(g, 3, 64, buf);
            qi_gguf_close(g);
            opened = true;
        } else {
            ck_assert_msg(s == QI_ERR_NOMEM, "n=%ld: %d %s", n, s, e.msg);
            ck_assert_ptr_null(g);
            ck_assert_uint_gt(strlen(e.msg), 0);
            failures++;
        }
    }
    ck_assert(opened);
    ck_assert_int_ge(failures, 5);

    /* Same through the mmap path. */
    char path[] = "/tmp/test_gguf_XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, buf, len), (ssize_t)len);
    close(fd);
    opened = false;
    for (long n = 1; n <= 100 && !opened; n++) {
        qi_gguf *g = (qi_gguf *)&g;
        qi_err e = {0};
        qi_alloc_fail_after(n);
        qi_status s = qi_gguf_open(path, &g, &e);
        qi_alloc_fail_after(0);
        if (s == QI_OK) {
            qi_gguf_close(g);
            opened = true;
        } else {
            ck_assert_msg(s == QI_ERR_NOMEM, "n=%ld: %s", n, e.msg);
            ck_assert_ptr_null(g);
        }
    }
    ck_assert(opened);
    unlink(path);
    qi_free(buf);
}
END_TEST

START_TEST(t_alloc_failures_writer) {
    bool done = false;
    int failures = 0;
    for (long n = 1; n <= 1000 && !done; n++) {
        qi_alloc_fail_after(n);
        qi_gguf_writer *w = qi_gguf_writer_create();
        qi_status s = w ? QI_OK : QI_ERR_NOMEM;
        if (w) {
            /* Reduced fill_rich: ck_assert on every set would abort here. */
            const char *strs[] = {"a", "bc"};
            uint64_t ne[2] = {32, 2};
            uint32_t u[3] = {1, 2, 3};
            s = qi_gguf_writer_set_u32(w, "general.alignment", 64);
            if (!s) s = qi_gguf_writer_set_str(w, "s", "x");
            if (!s) s = qi_gguf_writer_set_u32(w, "s", 5); /* replace */
            if (!s) s = qi_gguf_writer_set_arr(w, "a", QI_GGUF_U32, u, 3);
            if (!s) s = qi_gguf_writer_set_arr_str(w, "as", strs, 2);
            if (!s) s = qi_gguf_writer_set_raw(w, "r", QI_GGUF_U8, "\x01", 1);
            for (int i = 0; i < 12 && !s; i++) {
                char key[16];
                snprintf(key, sizeof key, "k%d", i);
                s = qi_gguf_writer_set_f64(w, key, i);
            }
            for (int i = 0; i < 10 && !s; i++) {
                char name[16];
                snprintf(name, sizeof name, "t%d", i);
                s = qi_gguf_writer_add_tensor(w, name, QI_TYPE_Q4_0, 2, ne, NULL, 36);
            }
            void *buf = NULL;
            size_t len = 0;
            if (!s) s = qi_gguf_writer_to_memory(w, 3, &buf, &len, NULL);
            if (!s) {
                qi_alloc_fail_after(0);
                void *keep;
                qi_gguf *g = open_ok(buf, len, &keep);
                ck_assert_uint_eq(qi_gguf_n_kv(g), 17);
                ck_assert_uint_eq(qi_gguf_n_tensors(g), 10);
                close_kept(g, keep);
                qi_free(buf);
                done = true;
            } else {
                ck_assert_int_eq(s, QI_ERR_NOMEM);
                ck_assert_ptr_null(buf);
            }
        }
        qi_alloc_fail_after(0);
        if (!done) failures++;
        qi_gguf_writer_free(w);
    }
    ck_assert(done);
    ck_assert_int_ge(failures, 10);
}
END_TEST

/* ---- The real model ------------------------------------------------------ */

START_TEST(t_real_model) {
    const char *path = qi_test_cached("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if (!path) {
        fprintf(stderr, "test_gguf: SmolLM2 model not cached; t_real_model skipped\n");
        return;
    }
    qi_gguf *g = NULL;
    qi_err e = {0};
    ck_assert_msg(qi_gguf_open(path, &g, &e) == QI_OK, "%s", e.msg);
    /* Figures from llama.cpp's gguf-py GGUFReader on the same file. */
    ck_assert_uint_eq(qi_gguf_version(g), 3);
    ck_assert_uint_eq(qi_gguf_n_kv(g), 33);
    ck_assert_uint_eq(qi_gguf_n_tensors(g), 272);
    ck_assert_uint_eq(qi_gguf_alignment(g), 32);
    ck_assert_uint_eq(qi_gguf_data_offset(g), 1785664);
    qi_str s;
    ck_assert(qi_gguf_get_str(g, "general.architecture", &s) && qi_str_eq(s, "llama"));
    uint64_t u;
    ck_assert(qi_gguf_get_u64(g, "llama.block_count", &u) && u == 30);
    ck_assert(qi_gguf_get_u64(g, "llama.embedding_length", &u) && u == 576);
    ck_assert(qi_gguf_get_u64(g, "tokenizer.ggml.eos_token_id", &u) && u == 2);
    double f;
    ck_assert(qi_gguf_get_f64(g, "llama.rope.freq_base", &f) && f == 100000.0);
    qi_gguf_arr a;
    ck_assert(qi_gguf_get_arr(g, "tokenizer.ggml.tokens", &a));
    ck_assert_int_eq(a.type, QI_GGUF_STRING);
    ck_assert_uint_eq(a.n, 49152);
    ck_assert(qi_gguf_arr_str(&a, 0, &s) && qi_str_eq(s, "<|endoftext|>"));
    ck_assert(qi_gguf_arr_str(&a, 49151, &s) && qi_str_eq(s, "ectable"));
    ck_assert(qi_gguf_get_arr(g, "tokenizer.ggml.merges", &a));
    ck_assert_uint_eq(a.n, 48900);
    ck_assert(qi_gguf_arr_str(&a, 0, &s) && qi_str_eq(s, "\xc4\xa0 t"));
    ck_assert(qi_gguf_arr_str(&a, 48899, &s) && qi_str_eq(s, "ect able"));
    ck_assert(qi_gguf_get_arr(g, "tokenizer.ggml.token_type", &a));
    ck_assert_int_eq(a.type, QI_GGUF_I32);
    ck_assert_uint_eq(a.n, 49152);

    const qi_gguf_tensor *t = qi_gguf_tensor_find(g, "token_embd.weight");
    ck_assert_ptr_nonnull(t);
    ck_assert_uint_eq(t->type, QI_TYPE_Q8_0);
    ck_assert_uint_eq(t->n_dims, 2);
    ck_assert_uint_eq(t->ne[0], 576);
    ck_assert_uint_eq(t->ne[1], 49152);
    ck_assert_uint_eq(t->n_bytes, 30081024);
    t = qi_gguf_tensor_find(g, "blk.0.attn_q.weight");
    ck_assert_ptr_nonnull(t);
    ck_assert_uint_eq(t->type, QI_TYPE_Q4_1);
    ck_assert_uint_eq(t->ne[0], 576);
    ck_assert_uint_eq(t->ne[1], 576);
    ck_assert_uint_eq(t->n_bytes, 207360);
    t = qi_gguf_tensor_find(g, "blk.29.attn_k.weight");
    ck_assert_ptr_nonnull(t);
    ck_assert_uint_eq(t->ne[1], 192);
    t = qi_gguf_tensor_find(g, "output_norm.weight");
    ck_assert_ptr_nonnull(t);
    ck_assert_uint_eq(t->type, QI_TYPE_F32);
    ck_assert_uint_eq(t->n_dims, 1);
    ck_assert_uint_eq(t->ne[0], 576);
    int counts[QI_TYPE_COUNT] = {0};
    for (uint64_t i = 0; i < qi_gguf_n_tensors(g); i++) counts[qi_gguf_tensor_at(g, i)->type]++;
    ck_assert_int_eq(counts[QI_TYPE_Q4_1], 210);
    ck_assert_int_eq(counts[QI_TYPE_F32], 61);
    ck_assert_int_eq(counts[QI_TYPE_Q8_0], 1);
    qi_gguf_close(g);
}
END_TEST

static Suite *gguf_suite(void) {
    Suite *s = suite_create("gguf");
    TCase *tc = tcase_create("roundtrip");
    tcase_add_loop_test(tc, t_roundtrip, 0, 8);
    tcase_add_test(tc, t_roundtrip_file);
    tcase_add_test(tc, t_open_errors);
    tcase_add_test(tc, t_minimal);
    tcase_add_test(tc, t_writer_replace_and_errors);
    tcase_add_test(tc, t_coercions);
    suite_add_tcase(s, tc);

    tc = tcase_create("validation");
    tcase_add_test(tc, t_bad_magic);
    tcase_add_test(tc, t_bad_version);
    tcase_add_test(tc, t_truncation_anywhere);
    tcase_add_test(tc, t_string_past_end);
    tcase_add_test(tc, t_array_past_end);
    tcase_add_test(tc, t_absurd_counts);
    tcase_add_test(tc, t_unknown_value_type);
    tcase_add_test(tc, t_unknown_tensor_type);
    tcase_add_test(tc, t_bad_n_dims);
    tcase_add_test(tc, t_dims_overflow);
    tcase_add_test(tc, t_block_multiple);
    tcase_add_test(tc, t_misaligned_offset);
    tcase_add_test(tc, t_tensor_past_eof);
    tcase_add_test(tc, t_overlap);
    tcase_add_test(tc, t_duplicate_key);
    tcase_add_test(tc, t_duplicate_tensor);
    tcase_add_test(tc, t_nesting_depth);
    tcase_add_test(tc, t_bad_alignment);
    tcase_add_test(tc, t_empty_key);
    tcase_add_test(tc, t_binary_names);
    suite_add_tcase(s, tc);

    tc = tcase_create("faults");
    tcase_add_test(tc, t_alloc_failures_open);
    tcase_add_test(tc, t_alloc_failures_writer);
    suite_add_tcase(s, tc);

    tc = tcase_create("real_model");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, t_real_model);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    SRunner *sr = srunner_create(gguf_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

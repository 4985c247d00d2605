/* util.c - what the parts of test_gguf share. */
#include "gguf_test.h"

/* ---- A byte builder for hand-made files ---------------------------------- */


void bb_put(bb *b, const void *d, size_t n) {
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

void bb_le(bb *b, uint64_t v, unsigned n) {
    unsigned char t[8];
    for (unsigned i = 0; i < n; i++) t[i] = (unsigned char)(v >> (8 * i));
    bb_put(b, t, n);
}
void bb_u32(bb *b, uint32_t v) { bb_le(b, v, 4); }
void bb_u64(bb *b, uint64_t v) { bb_le(b, v, 8); }
void bb_strn(bb *b, const char *s, size_t n) {
    bb_u64(b, n);
    bb_put(b, s, n);
}
void bb_str(bb *b, const char *s) { bb_strn(b, s, strlen(s)); }
void bb_hdr(bb *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
    bb_put(b, "GGUF", 4);
    bb_u32(b, version);
    bb_u64(b, n_tensors);
    bb_u64(b, n_kv);
}
void bb_kv_u32(bb *b, const char *key, uint32_t v) {
    bb_str(b, key);
    bb_u32(b, QI_GGUF_U32);
    bb_u32(b, v);
}
void bb_tinfo(bb *b, const char *name, uint32_t n_dims, const uint64_t *ne, uint32_t type,
                     uint64_t offset) {
    bb_str(b, name);
    bb_u32(b, n_dims);
    for (uint32_t i = 0; i < n_dims; i++) bb_u64(b, ne[i]);
    bb_u32(b, type);
    bb_u64(b, offset);
}
void bb_pad(bb *b, size_t align) {
    while (b->n % align) bb_put(b, "", 1);
}
void bb_zeros(bb *b, size_t n) {
    for (size_t i = 0; i < n; i++) bb_put(b, "", 1);
}
void bb_free(bb *b) {
    free(b->p);
    memset(b, 0, sizeof *b);
}

/* Open a copy of (p, n) in an exactly-sized heap buffer, so ASan sees any
 * overread. On success the copy is returned through *keep (caller frees after
 * closing). */
qi_status open_copy(const void *p, size_t n, qi_gguf **g, qi_err *e, void **keep) {
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


void expect_fail_(const void *p, size_t n, qi_status code, const char *needle, int line) {
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

qi_gguf *open_ok(const void *p, size_t n, void **keep) {
    qi_gguf *g = NULL;
    qi_err e = {0};
    qi_status s = open_copy(p, n, &g, &e, keep);
    ck_assert_msg(s == QI_OK, "open failed: %s", e.msg);
    ck_assert_ptr_nonnull(g);
    return g;
}

void close_kept(qi_gguf *g, void *keep) {
    qi_gguf_close(g);
    free(keep);
}

/* ---- Writer helpers ------------------------------------------------------ */

void ok(qi_status s) { ck_assert_int_eq(s, QI_OK); }

bool qs_eq(qi_str s, const char *p, size_t n) {
    return s.len == n && (n == 0 || memcmp(s.ptr, p, n) == 0);
}

/* Raw scalar encodings for the types without a typed setter. */
void set_raw_le(qi_gguf_writer *w, const char *key, uint32_t type, uint64_t v,
                       unsigned n) {
    unsigned char t[8];
    for (unsigned i = 0; i < n; i++) t[i] = (unsigned char)(v >> (8 * i));
    ok(qi_gguf_writer_set_raw(w, key, type, t, n));
}

/* A nested array: [[1,2,3] as u32, ["x","", "\xff\x00z"] strings, [[-1 i8]],
 * []] encoded as ARRAY of ARRAY. */
void build_nested(bb *b) {
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
unsigned char *pattern(uint64_t n, uint64_t seed) {
    unsigned char *d = malloc(n);
    ck_assert_ptr_nonnull(d);
    uint64_t st = seed;
    for (uint64_t i = 0; i < n; i++) d[i] = (unsigned char)qi_test_rand(&st);
    return d;
}


const tspec k_tensors[] = {
    {"tok_embd.weight", QI_TYPE_Q8_0, 2, {64, 10, 1, 1}},
    {"blk.0.attn_norm.weight", QI_TYPE_F32, 1, {7, 1, 1, 1}},
    {"blk.0.attn_q.weight", QI_TYPE_Q4_1, 2, {32, 3, 1, 1}},
    {"blk.0.ffn.weight", QI_TYPE_Q4_K, 3, {256, 2, 2, 1}},
    {"f16.4d", QI_TYPE_F16, 4, {3, 2, 2, 3}},
    {"q6k", QI_TYPE_Q6_K, 1, {512, 1, 1, 1}},
    {"ints", QI_TYPE_I32, 2, {5, 1, 1, 1}},
    {"bf16", QI_TYPE_BF16, 1, {1, 1, 1, 1}},
};
const size_t n_k_tensors = sizeof k_tensors / sizeof k_tensors[0];

uint64_t spec_bytes(const tspec *t) {
    uint64_t row;
    ck_assert(qi_type_row_bytes(t->type, t->ne[0], &row));
    return row * t->ne[1] * t->ne[2] * t->ne[3];
}

/* Fill a writer with every value type, nested and string arrays and tensors.
 * align 0 means: no general.alignment key. */
void fill_rich(qi_gguf_writer *w, uint32_t align) {
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

void write_rich(uint32_t version, uint32_t align, void **buf, size_t *len) {
    qi_gguf_writer *w = qi_gguf_writer_create();
    ck_assert_ptr_nonnull(w);
    fill_rich(w, align);
    qi_err e = {0};
    qi_status s = qi_gguf_writer_to_memory(w, version, buf, len, &e);
    ck_assert_msg(s == QI_OK, "writer: %s", e.msg);
    qi_gguf_writer_free(w);
}

/* ---- Round trips ----------------------------------------------------------- */

void check_rich(qi_gguf *g, uint32_t version, uint32_t align, const void *buf) {
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

/* roundtrip.c - round trips through the writer and the reader, and the getters' coercions. */
#include "gguf_test.h"

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

void gguf_roundtrip_add(TCase *tc) {
    tcase_add_loop_test(tc, t_roundtrip, 0, 8);
    tcase_add_test(tc, t_roundtrip_file);
    tcase_add_test(tc, t_open_errors);
    tcase_add_test(tc, t_minimal);
    tcase_add_test(tc, t_writer_replace_and_errors);
    tcase_add_test(tc, t_coercions);
}

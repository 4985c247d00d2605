/* valid.c - validation: one bad file per rule. */
#include "gguf_test.h"

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

void gguf_valid_add(TCase *tc) {
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
}

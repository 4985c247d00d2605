/* test_gguf.c - Check suite for the GGUF reader and writer.
 *
 * Three kinds of tests: round trips (writer -> reader) over every value type,
 * nested and string arrays, both versions, several alignments and tensor
 * types; one hand-crafted bad file per validation rule, asserting the status
 * and that the message names the file and the problem; and fault injection
 * (every allocation of open and of the writer fails in turn). The real
 * SmolLM2 model is checked against figures read with llama.cpp's gguf-py when
 * it is cached, and skipped otherwise.
 *
 * The parts are in test_gguf/ (gguf_test.h); this file holds fault
 * injection, the real model and the suite.
 */
#include "gguf_test.h"

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
    gguf_roundtrip_add(tc);
    suite_add_tcase(s, tc);

    tc = tcase_create("validation");
    gguf_valid_add(tc);
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

/* test_misc.c - small engine pieces: SHA-256, the cache resolver, chat
 * formatting, the thread pool, error records. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "qinfer/model_files.h"
#include "qinfer/chat.h"
#include "sha256.h"
#include "threadpool.h"
#include "testutil.h"

static void hash_str(const char *s, char hex[65]) {
    qi_sha256 h;
    qi_sha256_init(&h);
    qi_sha256_update(&h, s, strlen(s));
    qi_sha256_final(&h, hex);
}

/* the known-answer vectors, through whichever compression function is
 * selected (qi_sha256_set_portable) */
static void sha256_check_vectors(void) {
    char hex[65];
    hash_str("", hex);
    ck_assert_str_eq(hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    hash_str("abc", hex);
    ck_assert_str_eq(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    hash_str("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq", hex);
    ck_assert_str_eq(hex, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    /* a million 'a' fed in odd-sized pieces */
    qi_sha256 h;
    qi_sha256_init(&h);
    char buf[997];
    memset(buf, 'a', sizeof buf);
    size_t left = 1000000;
    while (left) {
        size_t n = left < sizeof buf ? left : sizeof buf;
        qi_sha256_update(&h, buf, n);
        left -= n;
    }
    qi_sha256_final(&h, hex);
    ck_assert_str_eq(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

/* The vectors through the portable C and through the CPU's SHA
 * instructions (where it has them), then the two on random data of every
 * length up to a few blocks and at odd offsets, fed in odd pieces. */
START_TEST(sha256_vectors) {
    qi_sha256_set_portable(1);
    ck_assert_int_eq(qi_sha256_accelerated(), 0);
    sha256_check_vectors();
    qi_sha256_set_portable(0);
    printf("sha256: %s\n", qi_sha256_accelerated() ? "SHA-NI and portable C" : "portable C only");
    sha256_check_vectors();
    static unsigned char data[4096 + 16];
    uint64_t r = 7;
    for (size_t i = 0; i < sizeof data; i++) data[i] = (unsigned char)qi_test_rand(&r);
    for (size_t len = 0; len <= 4096; len += len < 300 ? 1 : 61) {
        const size_t off = len % 13, piece = 1 + len % 157;
        char want[65], got[65];
        for (int ni = 0; ni < 2; ni++) {
            qi_sha256_set_portable(!ni);
            qi_sha256 h;
            qi_sha256_init(&h);
            for (size_t at = 0; at < len; at += piece)
                qi_sha256_update(&h, data + off + at, len - at < piece ? len - at : piece);
            qi_sha256_final(&h, ni ? got : want);
        }
        ck_assert_msg(strcmp(want, got) == 0, "length %zu: portable %s, accelerated %s", len, want, got);
    }
    qi_sha256_set_portable(0);
}
END_TEST

START_TEST(cache_resolve) {
    char dir[] = "/tmp/qi_cache_XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    setenv("QINFER_CACHE", dir, 1);
    char path[1024];
    qi_err e = {0};
    /* unknown name */
    ck_assert_int_eq(qi_cache_resolve("no-such-model", "model", path, sizeof path, &e), QI_ERR_INVALID);
    ck_assert_ptr_nonnull(strstr(e.msg, "smollm2-135m"));
    /* known but not cached: says how to fetch */
    qi_err_clear(&e);
    ck_assert_int_eq(qi_cache_resolve("smollm2-135m", "model", path, sizeof path, &e), QI_ERR_IO);
    ck_assert_ptr_nonnull(strstr(e.msg, "fetch.sh"));
    /* cached with the wrong content: sha mismatch */
    const qi_cache_entry *ent = qi_cache_find("smollm2-135m", "model");
    ck_assert_ptr_nonnull(ent);
    char sub[1200];
    snprintf(sub, sizeof sub, "%s/models", dir);
    mkdir(sub, 0755);
    snprintf(sub, sizeof sub, "%s/models/%s", dir, ent->file);
    FILE *f = fopen(sub, "wb");
    fputs("not a model", f);
    fclose(f);
    qi_err_clear(&e);
    ck_assert_int_eq(qi_cache_resolve("smollm2-135m", "model", path, sizeof path, &e), QI_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(e.msg, "sha256"));
    /* an existing path is used as is */
    qi_err_clear(&e);
    ck_assert_int_eq(qi_cache_resolve(sub, "model", path, sizeof path, &e), QI_OK);
    ck_assert_str_eq(path, sub);
    /* a directory is not a model */
    qi_err_clear(&e);
    ck_assert_int_eq(qi_cache_resolve(dir, "model", path, sizeof path, &e), QI_ERR_INVALID);
    unlink(sub);
    snprintf(sub, sizeof sub, "%s/models", dir);
    rmdir(sub);
    rmdir(dir);
    unsetenv("QINFER_CACHE");
}
END_TEST

START_TEST(chat_chatml) {
    qi_chat_template t;
    qi_err e = {0};
    ck_assert_int_eq(qi_chat_detect("{% for m in messages %}<|im_start|>{{m.role}}...", NULL, &t, &e), QI_OK);
    ck_assert_str_eq(t.default_system, "");
    char *s = NULL;
    ck_assert_int_eq(qi_chat_format(&t, NULL, "Hi", &s, &e), QI_OK);
    ck_assert_str_eq(s, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
    qi_free(s);
    ck_assert_int_eq(qi_chat_format(&t, "Be brief.", "Hi", &s, &e), QI_OK);
    ck_assert_str_eq(s, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
    qi_free(s);
    /* a template that inserts its own system turn (as SmolLM2's does) */
    const char *smol = "{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
                       "You are a helpful bot<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n'}}";
    ck_assert_int_eq(qi_chat_detect(smol, NULL, &t, &e), QI_OK);
    ck_assert_str_eq(t.default_system, "You are a helpful bot");
    ck_assert_int_eq(qi_chat_format(&t, NULL, "Hi", &s, &e), QI_OK);
    ck_assert_str_eq(s, "<|im_start|>system\nYou are a helpful bot<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
    qi_free(s);
    /* Qwen2.5's: the newline an escape inside Jinja strings, and the first
     * system turn the caller's message, the default the one after it */
    const char *qwen = "{%- if messages[0]['role'] == 'system' %}\n"
                       "        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n"
                       "    {%- else %}\n"
                       "        {{- '<|im_start|>system\\nYou are Qwen, a bot.<|im_end|>\\n' }}\n"
                       "{%- endif %}{{- '<|im_start|>' + message.role + '\\n' }}";
    ck_assert_int_eq(qi_chat_detect(qwen, "qwen2", &t, &e), QI_OK);
    ck_assert_int_eq(t.kind, QI_CHAT_CHATML);
    ck_assert_str_eq(t.default_system, "You are Qwen, a bot.");
    ck_assert_int_eq(qi_chat_format(&t, NULL, "Hi", &s, &e), QI_OK);
    ck_assert_str_eq(s, "<|im_start|>system\nYou are Qwen, a bot.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                        "<|im_start|>assistant\n");
    qi_free(s);
    /* a system turn made of template expressions is not a default */
    ck_assert_int_eq(qi_chat_detect("<|im_start|>system\n{{ sys }}<|im_end|>", NULL, &t, &e), QI_OK);
    ck_assert_str_eq(t.default_system, "");
    ck_assert_int_eq(qi_chat_detect("[INST] {{ x }} [/INST]", NULL, &t, &e), QI_ERR_UNSUPPORTED);
    ck_assert(e.msg[0]);
    qi_err_clear(&e);
    ck_assert_int_eq(qi_chat_detect(NULL, NULL, &t, &e), QI_ERR_UNSUPPORTED);
    qi_err_clear(&e);
    ck_assert_int_eq(qi_chat_detect(NULL, "llama", &t, &e), QI_ERR_UNSUPPORTED);
    /* Gemma: by architecture when the file has no template, or by marker */
    ck_assert_int_eq(qi_chat_detect(NULL, "gemma3", &t, &e), QI_OK);
    ck_assert_int_eq(t.kind, QI_CHAT_GEMMA);
    ck_assert_int_eq(qi_chat_format(&t, NULL, "Hi", &s, &e), QI_OK);
    ck_assert_str_eq(s, "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n");
    qi_free(s);
    ck_assert_int_eq(qi_chat_format(&t, "Be brief.", "Hi", &s, &e), QI_OK);
    ck_assert_str_eq(s, "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n");
    qi_free(s);
    const char *conv[] = {"Hi", "Hello.", "Bye"};
    ck_assert_int_eq(qi_chat_format_turns(&t, "Be brief.", conv, 3, &s, &e), QI_OK);
    ck_assert_str_eq(s, "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello.<end_of_turn>\n"
                        "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n");
    qi_free(s);
    ck_assert_int_eq(qi_chat_format_turns(&t, NULL, conv, 2, &s, &e), QI_ERR_INVALID);
    ck_assert_ptr_null(s);
    qi_err_clear(&e);
    ck_assert_int_eq(qi_chat_detect("<|im_start|>", NULL, &t, &e), QI_OK);
    ck_assert_int_eq(qi_chat_format_turns(&t, "Be brief.", conv, 3, &s, &e), QI_OK);
    ck_assert_str_eq(s, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                        "<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n");
    qi_free(s);
    ck_assert_int_eq(qi_chat_detect("{{ '<start_of_turn>' + role }}", "llama", &t, &e), QI_OK);
    ck_assert_int_eq(t.kind, QI_CHAT_GEMMA);
}
END_TEST

typedef struct {
    int *hits;
    long n;
} pool_job;

static void mark(void *arg, int ith, int nth) {
    pool_job *j = arg;
    long lo, hi;
    qi_split(j->n, ith, nth, &lo, &hi);
    for (long i = lo; i < hi; i++) j->hits[i]++;
}

START_TEST(pool_covers_every_index_once) {
    for (int nt = 1; nt <= 4; nt++) {
        qi_pool *p = NULL;
        qi_err e = {0};
        ck_assert_int_eq(qi_pool_create(nt, &p, &e), QI_OK);
        for (long n = 0; n < 40; n += 3) {
            int hits[64] = {0};
            pool_job j = {hits, n};
            for (int rep = 0; rep < 5; rep++) qi_pool_run(p, mark, &j);
            for (long i = 0; i < n; i++) ck_assert_int_eq(hits[i], 5);
            for (long i = n; i < 64; i++) ck_assert_int_eq(hits[i], 0);
        }
        qi_pool_free(p);
    }
    qi_pool *p = NULL;
    qi_err e = {0};
    ck_assert_int_eq(qi_pool_create(0, &p, &e), QI_ERR_INVALID);
    ck_assert_int_ge(qi_n_physical_cores(), 1);
}
END_TEST

START_TEST(first_error_wins) {
    qi_err e = {0};
    ck_assert_int_eq(QI_ERR(&e, QI_ERR_IO, "first %d", 1), QI_ERR_IO);
    QI_ERR(&e, QI_ERR_FORMAT, "second");
    ck_assert_int_eq(e.code, QI_ERR_IO);
    qi_err_prefix(&e, "ctx");
    ck_assert_str_eq(e.msg, "ctx: first 1");
    ck_assert_int_eq(QI_ERR(NULL, QI_ERR_NOMEM, "x"), QI_ERR_NOMEM);
    qi_alloc_fail_after(2);
    void *a = qi_malloc(8), *b = qi_malloc(8), *c = qi_malloc(8);
    ck_assert_ptr_nonnull(a);
    ck_assert_ptr_null(b);
    ck_assert_ptr_nonnull(c);
    qi_free(a);
    qi_free(c);
}
END_TEST

int main(void) {
    Suite *su = suite_create("misc");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, sha256_vectors);
    tcase_add_test(tc, cache_resolve);
    tcase_add_test(tc, chat_chatml);
    tcase_add_test(tc, pool_covers_every_index_once);
    tcase_add_test(tc, first_error_wins);
    suite_add_tcase(su, tc);
    return qi_test_run_suite(su);
}

/* test_tokenizer_wpm.c - Check suite for the tokenizer families and paths
 * that llama.cpp's vocabulary suite (test_tokenizer_vocab, which needs the
 * sdist) covers on real files, here on tiny synthetic vocabularies so they
 * run everywhere, under the sanitizers too:
 *
 *  - WordPiece ("bert"): BERT normalisation (lowercase, accents off through
 *    the first code point of the NFD, control characters dropped,
 *    punctuation, ASCII symbols and CJK apart), greedy longest match with
 *    the U+2581 word marker, [UNK] for a word without a cut, [CLS]/[SEP]
 *    with add_special, the normaliser switches;
 *  - BPE on UTF-8 ("gemma4"): spaces as U+2581, merges over characters,
 *    runs of line feeds, "<0xXX>" byte fallback, pieces and round trip;
 *  - vocabulary-only loading: qi_tokenizer_load on a file without tensors
 *    of an architecture the engine does not run, qi_tokenizer_load_memory;
 *  - the WordPiece Unicode tables (spot values read off UnicodeData.txt).
 *
 * Expected ids were worked out by hand from the rules above (llama.cpp's
 * llm_tokenizer_wpm_session and its gemma4 BPE session).
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "qinfer/gguf.h"
#include "qinfer/tokenizer.h"
#include "testutil.h"
#include "unicode_int.h"

#define M "\xE2\x96\x81" /* U+2581 */

/* Serialise w (and free it) and build a tokenizer from the bytes. */
static qi_status from_writer(qi_gguf_writer *w, qi_tokenizer **t, qi_err *e) {
    void *buf;
    size_t len;
    ck_assert_int_eq(qi_gguf_writer_to_memory(w, 3, &buf, &len, e), QI_OK);
    qi_gguf_writer_free(w);
    qi_status s = qi_tokenizer_load_memory(buf, len, t, e);
    qi_free(buf); /* the tokenizer keeps no reference */
    return s;
}

static qi_tokenizer *open_writer(qi_gguf_writer *w) {
    qi_tokenizer *t = NULL;
    qi_err e = {0};
    ck_assert_msg(from_writer(w, &t, &e) == QI_OK, "create: %s", e.msg);
    return t;
}

/* Tokenise a NUL-terminated text; ids as "1 2 3" into out. */
static const char *ids_of(const qi_tokenizer *t, const char *s, bool add_special) {
    static char out[1024];
    int32_t *ids;
    size_t n;
    qi_err e = {0};
    ck_assert_msg(qi_tokenize(t, s, strlen(s), add_special, false, &ids, &n, &e) == QI_OK,
                  "tokenize: %s", e.msg);
    size_t k = 0;
    out[0] = 0;
    for (size_t i = 0; i < n; i++)
        k += (size_t)snprintf(out + k, sizeof out - k, "%s%d", i ? " " : "", ids[i]);
    qi_free(ids);
    return out;
}

#define EXPECT(t, text, special, want)                                                      \
    do {                                                                                    \
        const char *got_ = ids_of(t, text, special);                                        \
        ck_assert_msg(strcmp(got_, want) == 0, "%s: want [%s], got [%s]", text, want, got_); \
    } while (0)

/* ---- WordPiece ------------------------------------------------------------------ */

/* Ids: 0 [PAD], 1 [UNK], 2 [CLS], 3 [SEP], then the pieces below. */
static const char *const wpm_tokens[] = {
    "[PAD]", "[UNK]", "[CLS]", "[SEP]", M "hello", M "world", M "un", "aff", "able", M ",",
    M "!", M "$", M "\xE4\xB8\xAD", M "\xE6\x96\x87", M "cafe", M "a", "b", M "ab",
    M "\xC3\xA9t\xC3\xA9", M "\xC3\xA9", "t",
};
enum { PAD, UNK, CLS, SEP, HELLO, WORLD, UN, AFF, ABLE, COMMA, BANG, DOLLAR, ZHONG, WEN, CAFE };

static qi_gguf_writer *wpm_writer(void) {
    qi_gguf_writer *w = qi_gguf_writer_create();
    ck_assert_ptr_nonnull(w);
    size_t n = sizeof wpm_tokens / sizeof wpm_tokens[0];
    int32_t types[32];
    for (size_t i = 0; i < n; i++) types[i] = i < 4 ? 3 : 1;
    ck_assert_int_eq(qi_gguf_writer_set_str(w, "general.architecture", "bert"), QI_OK);
    ck_assert_int_eq(qi_gguf_writer_set_str(w, "tokenizer.ggml.model", "bert"), QI_OK);
    ck_assert_int_eq(qi_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", wpm_tokens, n), QI_OK);
    ck_assert_int_eq(qi_gguf_writer_set_arr(w, "tokenizer.ggml.token_type", QI_GGUF_I32, types, n),
                     QI_OK);
    ck_assert_int_eq(qi_gguf_writer_set_u32(w, "tokenizer.ggml.unknown_token_id", UNK), QI_OK);
    ck_assert_int_eq(qi_gguf_writer_set_u32(w, "tokenizer.ggml.seperator_token_id", SEP), QI_OK);
    ck_assert_int_eq(qi_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", CLS), QI_OK);
    return w;
}

START_TEST(t_wpm_words) {
    qi_tokenizer *t = open_writer(wpm_writer());
    EXPECT(t, "Hello world", false, "4 5");
    EXPECT(t, "  HELLO\t\nWorld  ", false, "4 5");          /* case and white space */
    EXPECT(t, "unaffable", false, "6 7 8");                 /* greedy longest, left first */
    EXPECT(t, "hello,world!", false, "4 9 5 10");           /* punctuation apart */
    EXPECT(t, "hello$", false, "4 11");                     /* an ASCII symbol apart */
    EXPECT(t, "\xE4\xB8\xAD\xE6\x96\x87", false, "12 13");  /* CJK ideographs apart */
    EXPECT(t, "Caf\xC3\xA9", false, "14");                  /* e-acute -> e */
    EXPECT(t, "cafe\xCC\x81", false, "14");                 /* a combining mark dropped */
    EXPECT(t, "he\x01llo\xE2\x80\x8B", false, "4");         /* Cc and Cf dropped */
    EXPECT(t, "hello xyz world", false, "4 1 5");           /* no cut: [UNK] */
    EXPECT(t, "abx", false, "1");                           /* a partial cut is discarded */
    EXPECT(t, "ab", false, "17");                           /* whole piece before a + b */
    EXPECT(t, "Hello", true, "2 4 3");                      /* [CLS] ... [SEP] */
    EXPECT(t, "", true, "2 3");
    EXPECT(t, "\xEF\xBF\xBD\xFF", false, "");               /* U+FFFD and invalid bytes */
    ck_assert(qi_tokenizer_add_bos(t));
    ck_assert(!qi_tokenizer_add_eos(t));
    char piece[16];
    ck_assert_uint_eq(qi_token_to_piece(t, HELLO, false, piece, sizeof piece), 6);
    ck_assert_int_eq(memcmp(piece, " hello", 6), 0);
    qi_tokenizer_free(t);
}
END_TEST

START_TEST(t_wpm_normalizer_keys) {
    /* lowercase off (strip_accents follows it): case and accents stay */
    qi_gguf_writer *w = wpm_writer();
    qi_gguf_writer_set_bool(w, "tokenizer.ggml.normalizer.lowercase", false);
    qi_tokenizer *t = open_writer(w);
    EXPECT(t, "Hello", false, "1");
    EXPECT(t, "\xC3\xA9t\xC3\xA9", false, "18");
    EXPECT(t, "\xC3\xA9", false, "19");
    qi_tokenizer_free(t);
    /* lowercase on, strip_accents off */
    w = wpm_writer();
    qi_gguf_writer_set_bool(w, "tokenizer.ggml.normalizer.strip_accents", false);
    t = open_writer(w);
    EXPECT(t, "\xC3\x89T\xC3\x89", false, "18"); /* upper-case E-acute lowercased, kept */
    qi_tokenizer_free(t);
    /* a mistyped key is an error */
    w = wpm_writer();
    qi_gguf_writer_set_u32(w, "tokenizer.ggml.normalizer.lowercase", 1);
    qi_err e = {0};
    qi_tokenizer *bad = NULL;
    ck_assert_int_eq(from_writer(w, &bad, &e), QI_ERR_FORMAT);
    ck_assert_ptr_null(bad);
    ck_assert_ptr_nonnull(strstr(e.msg, "normalizer.lowercase"));
}
END_TEST

/* ---- BPE on UTF-8 ("gemma4") ------------------------------------------------------- */

/* Ids: 0 <pad>, 1 <eos>, 2 <bos>, 3 "\n", 4 "\n\n", 5 M, 6 "h", 7 "i", 8 "hi",
 * 9 M "hi", 10 "é", 11..266 the byte tokens <0x00>..<0xFF>. */
static qi_gguf_writer *gemma4_writer(void) {
    static char names[256][8];
    const char *toks[11 + 256] = {"<pad>", "<eos>", "<bos>", "\n", "\n\n", M, "h", "i", "hi",
                                  M "hi", "\xC3\xA9"};
    int32_t types[11 + 256];
    for (int i = 0; i < 11; i++) types[i] = i < 3 ? 3 : 1;
    for (int b = 0; b < 256; b++) {
        snprintf(names[b], sizeof names[b], "<0x%02X>", b);
        toks[11 + b] = names[b];
        types[11 + b] = 6;
    }
    const char *merges[] = {"h i", M " hi"};
    qi_gguf_writer *w = qi_gguf_writer_create();
    ck_assert_ptr_nonnull(w);
    qi_gguf_writer_set_str(w, "general.architecture", "gemma4");
    qi_gguf_writer_set_str(w, "tokenizer.ggml.model", "gemma4");
    qi_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, 11 + 256);
    qi_gguf_writer_set_arr(w, "tokenizer.ggml.token_type", QI_GGUF_I32, types, 11 + 256);
    qi_gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", merges, 2);
    qi_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 2);
    qi_gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 1);
    qi_gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", false); /* overridden */
    return w;
}

START_TEST(t_gemma4_bpe) {
    qi_tokenizer *t = open_writer(gemma4_writer());
    ck_assert_str_eq(qi_tokenizer_pre_name(t), "gemma4");
    EXPECT(t, "hi hi", false, "8 9");        /* the space is U+2581 and merges */
    EXPECT(t, "hi\n\nhi", false, "8 4 8");   /* a run of line feeds that is a token */
    EXPECT(t, "\n\n\n", false, "3 3 3");     /* one that is not: its characters */
    EXPECT(t, "h\xC3\xA9!", false, "6 10 44"); /* a character without a token: <0x21> */
    EXPECT(t, "\xE2\x82\xAC", false, "237 141 183"); /* its bytes E2 82 AC */
    EXPECT(t, "hi", true, "2 8");            /* add_bos forced on, as llama.cpp does */
    ck_assert(qi_tokenizer_add_bos(t));

    /* pieces: U+2581 back to a space, byte tokens their byte; round trip */
    const char *text = "hi h\xC3\xA9 \xE2\x82\xAC\n\nhi";
    int32_t *ids;
    size_t n;
    qi_err e = {0};
    ck_assert_int_eq(qi_tokenize(t, text, strlen(text), false, false, &ids, &n, &e), QI_OK);
    char back[64];
    size_t nb = qi_detokenize(t, ids, n, false, false, back, sizeof back);
    ck_assert_uint_eq(nb, strlen(text));
    ck_assert_int_eq(memcmp(back, text, nb), 0);
    qi_free(ids);
    qi_tokenizer_free(t);
}
END_TEST

/* ---- Vocabulary-only loading ------------------------------------------------------- */

START_TEST(t_load_vocab_only) {
    char path[] = "/tmp/qi_test_vocab_XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    close(fd);
    qi_gguf_writer *w = wpm_writer(); /* architecture "bert": not one the engine runs */
    qi_err e = {0};
    ck_assert_int_eq(qi_gguf_writer_to_file(w, 3, path, &e), QI_OK);
    qi_gguf_writer_free(w);
    qi_tokenizer *t = NULL;
    ck_assert_msg(qi_tokenizer_load(path, &t, &e) == QI_OK, "load: %s", e.msg);
    EXPECT(t, "hello", false, "4");
    qi_tokenizer_free(t);

    /* the engine still refuses the architecture, with its usual line */
    qi_model *m = NULL;
    ck_assert_int_eq(qi_model_load(path, &m, &e), QI_ERR_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(e.msg, "architecture 'bert' is not supported"));
    unlink(path);

    /* the in-memory entry point (every other case here uses it): garbage is
     * an error */
    ck_assert_int_ne(qi_tokenizer_load_memory("GGUF", 4, &t, &e), QI_OK);
    ck_assert_ptr_null(t);
    ck_assert_int_ne(qi_tokenizer_load_memory(NULL, 0, &t, &e), QI_OK);
    ck_assert_int_eq(qi_tokenizer_load_memory(NULL, 4, &t, &e), QI_ERR_INVALID);

    ck_assert_int_ne(qi_tokenizer_load("/nonexistent/x.gguf", &t, &e), QI_OK);
    ck_assert_ptr_null(t);
    ck_assert_int_eq(qi_tokenizer_load(NULL, &t, &e), QI_ERR_INVALID);
}
END_TEST

/* ---- Unicode tables ---------------------------------------------------------------- */

START_TEST(t_unicode_norm) {
    ck_assert_uint_eq(qi_uc_tolower('A'), 'a');
    ck_assert_uint_eq(qi_uc_tolower('a'), 'a');
    ck_assert_uint_eq(qi_uc_tolower(0xC9), 0xE9);     /* E-acute */
    ck_assert_uint_eq(qi_uc_tolower(0x130), 'i');     /* dotted I: simple mapping */
    ck_assert_uint_eq(qi_uc_tolower(0x100), 0x101);   /* stride-2 run */
    ck_assert_uint_eq(qi_uc_tolower(0x101), 0x101);
    ck_assert_uint_eq(qi_uc_tolower(0x212A), 'k');    /* Kelvin sign */
    ck_assert_uint_eq(qi_uc_tolower(0x10400), 0x10428); /* Deseret */
    ck_assert_uint_eq(qi_uc_tolower(0x10FFFF), 0x10FFFF);
    ck_assert_uint_eq(qi_uc_nfd_first(0xE9), 'e');
    ck_assert_uint_eq(qi_uc_nfd_first(0x1E09), 'c'); /* c-cedilla-acute, two levels */
    ck_assert_uint_eq(qi_uc_nfd_first(0xAC00), 0x1100); /* Hangul GA -> choseong kiyeok */
    ck_assert_uint_eq(qi_uc_nfd_first('e'), 'e');
    ck_assert(qi_uc_is_control(0x00));
    ck_assert(qi_uc_is_control(0x200B)); /* Cf */
    ck_assert(qi_uc_is_control(0xE000)); /* Co */
    ck_assert(!qi_uc_is_control(0x0378)); /* Cn: unassigned, kept */
    ck_assert(!qi_uc_is_control('a'));
}
END_TEST

int main(void) {
    Suite *s = suite_create("tokenizer_wpm");
    TCase *tc = tcase_create("synthetic");
    tcase_add_test(tc, t_wpm_words);
    tcase_add_test(tc, t_wpm_normalizer_keys);
    tcase_add_test(tc, t_gemma4_bpe);
    tcase_add_test(tc, t_load_vocab_only);
    tcase_add_test(tc, t_unicode_norm);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}

/* test_tokenizer.c - Check suite for the BPE tokenizer.
 *
 * The acceptance bar is llama.cpp's output: tests/golden/smollm2-135m/
 * tokenize.tsv holds its tokens for several hundred strings (emoji, CJK,
 * accents, digit and white-space runs, code, invalid UTF-8, special tokens)
 * and every line must match exactly; the first mismatches are printed with
 * input, expected and actual ids. That needs the cached SmolLM2 model; without
 * it the synthetic tests still run and the program exits 77 (skipped) if they
 * pass.
 *
 * Synthetic tests build tiny vocabularies with the GGUF writer (the 256
 * byte-level characters plus a few tokens and merges) to pin down merge
 * order, special-token cutting, BOS/EOS and EOG rules, byte-level decoding,
 * the streaming detokenizer, the Unicode table, metadata errors, and
 * allocation failures at every step.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "qinfer/gguf.h"
#include "qinfer/tokenizer.h"
#include "testutil.h"
#include "unicode_int.h"

#define MODEL_REL "models/SmolLM2-135M-Instruct.Q4_1.gguf"
#define GOLDEN QI_SOURCE_DIR "/tests/golden/smollm2-135m/tokenize.tsv"

/* ---- Synthetic vocabularies --------------------------------------------------- */

/* GPT-2 byte -> code point. */
static int byte_cp(int b) {
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)) return b;
    int n = 0;
    for (int x = 0; x < b; x++)
        if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255))) n++;
    return 256 + n;
}

/* The byte-level text of raw bytes s (NUL-terminated result in out). */
static void bl(const char *s, char *out) {
    for (; *s; s++) {
        int cp = byte_cp((unsigned char)*s);
        if (cp < 0x80) {
            *out++ = (char)cp;
        } else {
            *out++ = (char)(0xC0 | (cp >> 6));
            *out++ = (char)(0x80 | (cp & 0x3F));
        }
    }
    *out = 0;
}

enum { MAX_EXTRA = 32 };

typedef struct {
    char byte_tok[256][3];
    const char *toks[256 + MAX_EXTRA];
    int32_t types[256 + MAX_EXTRA];
    int n;
} vocab;

/* A writer with model "gpt2", the 256 byte-level tokens (ids 0..255) and
 * then extra[i] (raw text, stored as given) with type extra_types[i];
 * merges as given. Pre-tokenizer `pre` (NULL: key absent). */
static qi_gguf_writer *make_writer(vocab *v, const char *pre, const char *const *extra,
                                   const int *extra_types, int n_extra,
                                   const char *const *merges, int n_merges) {
    ck_assert_int_le(n_extra, MAX_EXTRA);
    for (int b = 0; b < 256; b++) {
        char raw[2] = {(char)b, 0};
        if (b == 0) {
            strcpy(v->byte_tok[0], "\xC4\x80"); /* U+0100 */
        } else {
            bl(raw, v->byte_tok[b]);
        }
        v->toks[b] = v->byte_tok[b];
        v->types[b] = 1;
    }
    for (int i = 0; i < n_extra; i++) {
        v->toks[256 + i] = extra[i];
        v->types[256 + i] = extra_types ? extra_types[i] : 1;
    }
    v->n = 256 + n_extra;
    qi_gguf_writer *w = qi_gguf_writer_create();
    ck_assert_ptr_nonnull(w);
    ck_assert_int_eq(qi_gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2"), QI_OK);
    if (pre) ck_assert_int_eq(qi_gguf_writer_set_str(w, "tokenizer.ggml.pre", pre), QI_OK);
    uint64_t n = (uint64_t)v->n;
    ck_assert_int_eq(qi_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", v->toks, n), QI_OK);
    ck_assert_int_eq(
        qi_gguf_writer_set_arr(w, "tokenizer.ggml.token_type", QI_GGUF_I32, v->types, n), QI_OK);
    ck_assert_int_eq(
        qi_gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", merges, (uint64_t)n_merges), QI_OK);
    return w;
}

/* Serialise w (and free it), open it, build a tokenizer. Returns the status;
 * on success *out is set. The GGUF is closed before returning: the
 * tokenizer must not depend on it. */
static qi_status build(qi_gguf_writer *w, qi_tokenizer **out, qi_err *e) {
    void *buf;
    size_t len;
    qi_err we = {0};
    ck_assert_int_eq(qi_gguf_writer_to_memory(w, 3, &buf, &len, &we), QI_OK);
    qi_gguf_writer_free(w);
    qi_gguf *g = NULL;
    ck_assert_int_eq(qi_gguf_open_memory(buf, len, "synthetic.gguf", &g, &we), QI_OK);
    *out = (qi_tokenizer *)&g; /* must be reset on failure */
    qi_status s = qi_tokenizer_create(g, out, e);
    qi_gguf_close(g);
    qi_free(buf);
    if (s) ck_assert_ptr_null(*out);
    return s;
}

static qi_tokenizer *must_build(qi_gguf_writer *w) {
    qi_tokenizer *t;
    qi_err e = {0};
    qi_status s = build(w, &t, &e);
    ck_assert_msg(s == QI_OK, "create: %s", e.msg);
    return t;
}

/* Tokenise a C string; ids into out (at most 64), count returned. */
static size_t tok(const qi_tokenizer *t, const char *s, bool add_special, bool parse_special,
                  int32_t *out) {
    int32_t *ids;
    size_t n;
    qi_err e = {0};
    ck_assert_msg(qi_tokenize(t, s, strlen(s), add_special, parse_special, &ids, &n, &e) == QI_OK,
                  "tokenize: %s", e.msg);
    ck_assert_ptr_nonnull(ids);
    ck_assert_uint_le(n, 64);
    memcpy(out, ids, n * sizeof *ids);
    qi_free(ids);
    return n;
}

static int32_t byte_id(unsigned char b) { return b; }

/* ---- Merges and pre-tokenisation ---------------------------------------------- */

START_TEST(t_merge_order) {
    vocab v;
    /* ids 256.. */
    const char *extra[] = {"bc", "ab", "abc", "aa", "\xC4\xA0" "a", "a\xC3\xB0"};
    const char *merges[] = {"b c", "a b", "a bc", "a a", "\xC4\xA0 a", "a \xC3\xB0"};
    qi_tokenizer *t = must_build(make_writer(&v, "gpt-2", extra, NULL, 6, merges, 6));
    int32_t ids[64];
    /* "b c" has the lower rank: a + bc, then "a bc". */
    ck_assert_uint_eq(tok(t, "abc", false, false, ids), 1);
    ck_assert_int_eq(ids[0], 258);
    /* Ties go to the leftmost pair. */
    ck_assert_uint_eq(tok(t, "aaa", false, false, ids), 2);
    ck_assert_int_eq(ids[0], 259);
    ck_assert_int_eq(ids[1], byte_id('a'));
    /* A space joins the following word as U+0120. */
    ck_assert_uint_eq(tok(t, "x a", false, false, ids), 2);
    ck_assert_int_eq(ids[0], byte_id('x'));
    ck_assert_int_eq(ids[1], 260);
    /* Words do not merge across pre-tokenizer boundaries: "a!" splits. */
    ck_assert_uint_eq(tok(t, "ab!ab", false, false, ids), 3);
    ck_assert_int_eq(ids[0], 257);
    ck_assert_int_eq(ids[1], byte_id('!'));
    ck_assert_int_eq(ids[2], 257);
    /* U+2EBF0 (F0 AE AF B0) is a letter in Unicode 15.1 (not in 14.0): one
     * word with the "a", so "a" + byte F0 merge. */
    ck_assert_uint_eq(tok(t, "a\xF0\xAE\xAF\xB0", false, false, ids), 4);
    ck_assert_int_eq(ids[0], 261);
    /* An emoji is a symbol: a word of its own, no merge. */
    ck_assert_uint_eq(tok(t, "a\xF0\x9F\x99\x82", false, false, ids), 5);
    ck_assert_int_eq(ids[0], byte_id('a'));
    qi_tokenizer_free(t);
}
END_TEST

START_TEST(t_digits_split) {
    vocab v;
    const char *extra[] = {"12", "\xC4\xA0" "1"};
    const char *merges[] = {"1 2", "\xC4\xA0 1"};
    /* smollm: every digit is its own word, so "12" never merges and the
     * space stays apart from the digit. */
    qi_tokenizer *t = must_build(make_writer(&v, "smollm", extra, NULL, 2, merges, 2));
    int32_t ids[64];
    ck_assert_uint_eq(tok(t, " 12", false, false, ids), 3);
    ck_assert_int_eq(ids[0], byte_id(' '));
    ck_assert_int_eq(ids[1], byte_id('1'));
    ck_assert_int_eq(ids[2], byte_id('2'));
    ck_assert_str_eq(qi_tokenizer_pre_name(t), "smollm");
    qi_tokenizer_free(t);
    /* gpt-2: " 12" is one word, where "1 2" (rank 0) wins over " 1". */
    t = must_build(make_writer(&v, "gpt-2", extra, NULL, 2, merges, 2));
    ck_assert_uint_eq(tok(t, " 12", false, false, ids), 2);
    ck_assert_int_eq(ids[0], byte_id(' '));
    ck_assert_int_eq(ids[1], 256);
    ck_assert_uint_eq(tok(t, " 13", false, false, ids), 2);
    ck_assert_int_eq(ids[0], 257);
    ck_assert_int_eq(ids[1], byte_id('3'));
    qi_tokenizer_free(t);
}
END_TEST

START_TEST(t_invalid_utf8) {
    vocab v;
    qi_tokenizer *t = must_build(make_writer(&v, "gpt-2", NULL, NULL, 0, NULL, 0));
    int32_t ids[64];
    /* A stray continuation byte is U+FFFD, EF BF BD. */
    ck_assert_uint_eq(tok(t, "\x80", false, false, ids), 3);
    ck_assert_int_eq(ids[0], 0xEF);
    ck_assert_int_eq(ids[1], 0xBF);
    ck_assert_int_eq(ids[2], 0xBD);
    /* A truncated sequence: one U+FFFD per byte. */
    ck_assert_uint_eq(tok(t, "\xE4\xBD", false, false, ids), 6);
    /* Overlong "/" decodes (leniently, as llama.cpp) to "/". */
    ck_assert_uint_eq(tok(t, "\xC0\xAF", false, false, ids), 1);
    ck_assert_int_eq(ids[0], '/');
    /* NUL bytes are text like any other. */
    int32_t *p;
    size_t n;
    qi_err e = {0};
    ck_assert_int_eq(qi_tokenize(t, "a\0b", 3, false, false, &p, &n, &e), QI_OK);
    ck_assert_uint_eq(n, 3);
    ck_assert_int_eq(p[1], 0);
    qi_free(p);
    /* Above U+10FFFF (llama.cpp aborts): each byte is U+FFFD. */
    ck_assert_uint_eq(tok(t, "\xF4\x90\x80\x80", false, false, ids), 12);
    qi_tokenizer_free(t);
}
END_TEST

/* ---- Special tokens, BOS/EOS, EOG ------------------------------------------- */

START_TEST(t_special_tokens) {
    vocab v;
    const char *extra[] = {"<|im_start|>", "<ud>", "<|im_start|>x"};
    const int types[] = {3, 4, 3};
    qi_tokenizer *t = must_build(make_writer(&v, "gpt-2", extra, types, 3, NULL, 0));
    int32_t ids[64];
    /* parse_special: control tokens are cut out, longest text first. */
    ck_assert_uint_eq(tok(t, "a<|im_start|>b<|im_start|>x", false, true, ids), 4);
    ck_assert_int_eq(ids[0], 'a');
    ck_assert_int_eq(ids[1], 256);
    ck_assert_int_eq(ids[2], 'b');
    ck_assert_int_eq(ids[3], 258);
    /* Without it, control text is plain text; user-defined tokens still count. */
    size_t n = tok(t, "<|im_start|><ud>", false, false, ids);
    ck_assert_uint_eq(n, strlen("<|im_start|>") + 1);
    ck_assert_int_eq(ids[n - 1], 257);
    ck_assert_uint_eq(tok(t, "<ud><ud>", false, true, ids), 2);
    ck_assert_int_eq(qi_token_find(t, "<ud>"), 257);
    ck_assert_int_eq(qi_token_find(t, "<nope>"), -1);
    /* Pieces: control only with special = true, user-defined always. */
    char buf[64];
    ck_assert_uint_eq(qi_token_to_piece(t, 256, false, buf, sizeof buf), 0);
    ck_assert_uint_eq(qi_token_to_piece(t, 256, true, buf, sizeof buf), 12);
    ck_assert(memcmp(buf, "<|im_start|>", 12) == 0);
    ck_assert_uint_eq(qi_token_to_piece(t, 257, false, buf, sizeof buf), 4);
    qi_tokenizer_free(t);
}
END_TEST

START_TEST(t_bos_eos) {
    vocab v;
    const char *extra[] = {"<s>", "</s>"};
    const int types[] = {3, 3};
    qi_gguf_writer *w = make_writer(&v, "gpt-2", extra, types, 2, NULL, 0);
    qi_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 256);
    qi_gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 257);
    qi_gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", true);
    qi_gguf_writer_set_bool(w, "tokenizer.ggml.add_eos_token", true);
    qi_tokenizer *t = must_build(w);
    int32_t ids[64];
    ck_assert(qi_tokenizer_add_bos(t));
    ck_assert_uint_eq(tok(t, "a", true, false, ids), 3);
    ck_assert_int_eq(ids[0], 256);
    ck_assert_int_eq(ids[2], 257);
    ck_assert_uint_eq(tok(t, "a", false, false, ids), 1);
    ck_assert_uint_eq(tok(t, "", true, false, ids), 2);
    ck_assert(qi_tokenizer_is_eog(t, 257)); /* eos, and "</s>" by text */
    ck_assert(!qi_tokenizer_is_eog(t, 256));
    qi_tokenizer_free(t);

    /* Without the keys: gpt2's default ids (11), add_bos false ... */
    t = must_build(make_writer(&v, "gpt-2", NULL, NULL, 0, NULL, 0));
    ck_assert_int_eq(qi_tokenizer_bos(t), 11);
    ck_assert_int_eq(qi_tokenizer_eos(t), 11);
    ck_assert(!qi_tokenizer_add_bos(t));
    ck_assert_uint_eq(tok(t, "a", true, false, ids), 1);
    qi_tokenizer_free(t);
    /* ... except where the pre-tokenizer says otherwise. */
    t = must_build(make_writer(&v, "llama3", NULL, NULL, 0, NULL, 0));
    ck_assert(qi_tokenizer_add_bos(t));
    ck_assert_uint_eq(tok(t, "a", true, false, ids), 2);
    ck_assert_int_eq(ids[0], 11);
    qi_tokenizer_free(t);
    t = must_build(make_writer(&v, "chatglm-bpe", NULL, NULL, 0, NULL, 0));
    ck_assert_int_eq(qi_tokenizer_bos(t), -1);
    qi_tokenizer_free(t);
    /* A model that asks for BOS but has none is an error, not a crash. */
    w = make_writer(&v, "chatglm-bpe", NULL, NULL, 0, NULL, 0);
    qi_gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", true);
    t = must_build(w);
    int32_t *p;
    size_t n;
    qi_err e = {0};
    ck_assert_int_eq(qi_tokenize(t, "a", 1, true, false, &p, &n, &e), QI_ERR_INVALID);
    ck_assert_ptr_null(p);
    ck_assert_ptr_nonnull(strstr(e.msg, "BOS"));
    qi_tokenizer_free(t);
}
END_TEST

START_TEST(t_eog) {
    vocab v;
    /* "<|im_end|>" typed normal: found by text, made EOG and control. */
    const char *extra[] = {"<|im_end|>", "<reponame>", "<|endoftext|>", "<x_unused_1>", "<y>"};
    const int types[] = {1, 3, 3, 3, 3};
    qi_gguf_writer *w = make_writer(&v, "smollm", extra, types, 5, NULL, 0);
    qi_gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 256);
    qi_tokenizer *t = must_build(w);
    ck_assert(qi_tokenizer_is_eog(t, 256));
    ck_assert(qi_tokenizer_is_eog(t, 257)); /* FIM repo token */
    ck_assert(qi_tokenizer_is_eog(t, 258));
    ck_assert(!qi_tokenizer_is_eog(t, 259));
    ck_assert(!qi_tokenizer_is_eog(t, 260));
    ck_assert(!qi_tokenizer_is_eog(t, -1));
    ck_assert(!qi_tokenizer_is_eog(t, 100000));
    char buf[16];
    ck_assert_uint_eq(qi_token_to_piece(t, 256, false, buf, sizeof buf), 0); /* now control */
    int32_t ids[64];
    ck_assert_uint_eq(tok(t, "<|im_end|>", false, true, ids), 1);
    qi_tokenizer_free(t);
}
END_TEST

/* ---- Pieces and the streaming detokenizer -------------------------------------- */

START_TEST(t_pieces) {
    vocab v;
    /* A byte token, an unused one, " hi", U+20AC (no byte-level character). */
    const char *extra[] = {"<0x41>", "<u>", "\xC4\xA0hi", "\xE2\x82\xAC"};
    const int types[] = {6, 5, 1, 1};
    qi_tokenizer *t = must_build(make_writer(&v, "gpt-2", extra, types, 4, NULL, 0));
    char buf[64];
    ck_assert_uint_eq(qi_token_to_piece(t, 256, false, buf, sizeof buf), 1);
    ck_assert_int_eq(buf[0], 'A');
    ck_assert_uint_eq(qi_token_to_piece(t, 257, true, buf, sizeof buf), 0);
    ck_assert_uint_eq(qi_token_to_piece(t, 258, false, buf, sizeof buf), 3);
    ck_assert(memcmp(buf, " hi", 3) == 0);
    /* Too small a buffer: the full length, only cap bytes written. */
    memset(buf, '#', sizeof buf);
    ck_assert_uint_eq(qi_token_to_piece(t, 258, false, buf, 2), 3);
    ck_assert_int_eq(buf[2], '#');
    ck_assert_uint_eq(qi_token_to_piece(t, 258, false, NULL, 0), 3);
    /* A code point that is no byte-level character: llama.cpp's marker. */
    size_t n = qi_token_to_piece(t, 259, false, buf, sizeof buf);
    const char *want = "[UNK_BYTE_0xe282ac\xE2\x82\xAC]";
    ck_assert_uint_eq(n, strlen(want));
    ck_assert(memcmp(buf, want, n) == 0);
    ck_assert_uint_ge(qi_tokenizer_max_piece(t), n);
    ck_assert_uint_eq(qi_token_to_piece(t, -1, true, buf, sizeof buf), 0);
    ck_assert_uint_eq(qi_token_to_piece(t, 9999, true, buf, sizeof buf), 0);
    size_t len;
    ck_assert_ptr_nonnull(qi_token_text(t, 258, &len));
    ck_assert_uint_eq(len, 4);
    ck_assert_ptr_null(qi_token_text(t, 9999, &len));
    qi_tokenizer_free(t);
}
END_TEST

/* Push the raw bytes of s one byte token at a time; check each chunk and
 * return the concatenation (static buffer). */
static const char *stream_bytes(const qi_tokenizer *t, const char *s, size_t len, size_t *out_len,
                                int *n_held) {
    static char all[256];
    size_t n = 0;
    qi_detok d;
    qi_detok_init(&d);
    *n_held = 0;
    for (size_t i = 0; i < len; i++) {
        char buf[16];
        size_t k = qi_detok_push(t, &d, (unsigned char)s[i], false, buf, sizeof buf);
        if (k == 0) (*n_held)++;
        memcpy(all + n, buf, k);
        n += k;
    }
    n += qi_detok_flush(&d, all + n, sizeof all - n);
    *out_len = n;
    return all;
}

START_TEST(t_detok_synthetic) {
    vocab v;
    const char *extra[] = {"<c>"};
    const int types[] = {3};
    qi_tokenizer *t = must_build(make_writer(&v, "gpt-2", extra, types, 1, NULL, 0));
    qi_detok d;
    char buf[16];
    /* A 2-byte character across two tokens: nothing, then both bytes. */
    qi_detok_init(&d);
    ck_assert_uint_eq(qi_detok_push(t, &d, 0xC3, false, buf, sizeof buf), 0);
    ck_assert_int_eq(d.n_pending, 1);
    ck_assert_uint_eq(qi_detok_push(t, &d, 0xA9, false, buf, sizeof buf), 2);
    ck_assert(memcmp(buf, "\xC3\xA9", 2) == 0);
    /* 4 bytes, one at a time. */
    ck_assert_uint_eq(qi_detok_push(t, &d, 0xF0, false, buf, sizeof buf), 0);
    ck_assert_uint_eq(qi_detok_push(t, &d, 0x9F, false, buf, sizeof buf), 0);
    ck_assert_uint_eq(qi_detok_push(t, &d, 0x98, false, buf, sizeof buf), 0);
    ck_assert_uint_eq(qi_detok_push(t, &d, 0x80, false, buf, sizeof buf), 4);
    /* A sequence cut short by ASCII: the held byte goes out as it is. */
    ck_assert_uint_eq(qi_detok_push(t, &d, 0xC3, false, buf, sizeof buf), 0);
    ck_assert_uint_eq(qi_detok_push(t, &d, 'A', false, buf, sizeof buf), 2);
    ck_assert(memcmp(buf, "\xC3" "A", 2) == 0);
    /* Bytes that start nothing pass straight through. */
    ck_assert_uint_eq(qi_detok_push(t, &d, 0x80, false, buf, sizeof buf), 1);
    ck_assert_uint_eq(qi_detok_push(t, &d, 0xFF, false, buf, sizeof buf), 1);
    ck_assert_uint_eq(qi_detok_push(t, &d, 0xC0, false, buf, sizeof buf), 1);
    /* Surrogates and overlong 3-byte forms are refused at the second byte. */
    ck_assert_uint_eq(qi_detok_push(t, &d, 0xED, false, buf, sizeof buf), 0);
    ck_assert_uint_eq(qi_detok_push(t, &d, 0xA0, false, buf, sizeof buf), 2);
    ck_assert_uint_eq(qi_detok_push(t, &d, 0xE0, false, buf, sizeof buf), 0);
    ck_assert_uint_eq(qi_detok_push(t, &d, 0x80, false, buf, sizeof buf), 2);
    /* Control tokens: text only with special. */
    ck_assert_uint_eq(qi_detok_push(t, &d, 256, false, buf, sizeof buf), 0);
    ck_assert_uint_eq(qi_detok_push(t, &d, 256, true, buf, sizeof buf), 3);
    ck_assert_uint_eq(qi_detok_push(t, &d, -5, true, buf, sizeof buf), 0);
    /* Flush hands out an unfinished character as raw bytes. */
    ck_assert_uint_eq(qi_detok_push(t, &d, 0xE2, false, buf, sizeof buf), 0);
    ck_assert_uint_eq(qi_detok_push(t, &d, 0x82, false, buf, sizeof buf), 0);
    ck_assert_uint_eq(qi_detok_flush(&d, buf, sizeof buf), 2);
    ck_assert_int_eq(d.n_pending, 0);
    ck_assert_uint_eq(qi_detok_flush(&d, buf, sizeof buf), 0);
    /* A short output buffer: at most cap bytes. */
    ck_assert_uint_eq(qi_detok_push(t, &d, 256, true, buf, 2), 2);

    /* Whole strings, byte by byte: the output is the input. */
    const char *s = "a\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80z";
    size_t n;
    int held;
    const char *o = stream_bytes(t, s, strlen(s), &n, &held);
    ck_assert_uint_eq(n, strlen(s));
    ck_assert(memcmp(o, s, n) == 0);
    ck_assert_int_eq(held, 1 + 2 + 3);
    const char bad[] = "\xE2\x82" "x\x80\xF0\x9F\x98";
    o = stream_bytes(t, bad, sizeof bad - 1, &n, &held);
    ck_assert_uint_eq(n, sizeof bad - 1);
    ck_assert(memcmp(o, bad, n) == 0);
    qi_tokenizer_free(t);
}
END_TEST

/* ---- Unicode helpers ---------------------------------------------------------- */

START_TEST(t_unicode_table) {
    ck_assert_int_eq(qi_uc_class_of('a'), QI_UC_LETTER);
    ck_assert_int_eq(qi_uc_class_of('7'), QI_UC_NUMBER);
    ck_assert_int_eq(qi_uc_class_of(' '), QI_UC_SPACE);
    ck_assert_int_eq(qi_uc_class_of('\v'), QI_UC_SPACE);
    ck_assert_int_eq(qi_uc_class_of(0x1C), QI_UC_OTHER); /* not White_Space */
    ck_assert_int_eq(qi_uc_class_of('$'), QI_UC_SYMBOL);
    ck_assert_int_eq(qi_uc_class_of('_'), QI_UC_PUNCT);
    ck_assert_int_eq(qi_uc_class_of(0x85), QI_UC_SPACE);
    ck_assert_int_eq(qi_uc_class_of(0xA0), QI_UC_SPACE);
    ck_assert_int_eq(qi_uc_class_of(0x180E), QI_UC_OTHER); /* Cf since Unicode 6.3 */
    ck_assert_int_eq(qi_uc_class_of(0x3000), QI_UC_SPACE);
    ck_assert_int_eq(qi_uc_class_of(0x00E9), QI_UC_LETTER);
    ck_assert_int_eq(qi_uc_class_of(0x0301), QI_UC_MARK);
    ck_assert_int_eq(qi_uc_class_of(0x0660), QI_UC_NUMBER);
    ck_assert_int_eq(qi_uc_class_of(0x00BD), QI_UC_NUMBER);
    ck_assert_int_eq(qi_uc_class_of(0x4F60), QI_UC_LETTER);
    ck_assert_int_eq(qi_uc_class_of(0x1F642), QI_UC_SYMBOL);
    ck_assert_int_eq(qi_uc_class_of(0x2EBF0), QI_UC_LETTER); /* new in 15.1 */
    ck_assert_int_eq(qi_uc_class_of(0x31350), QI_UC_LETTER); /* new in 15.0 */
    ck_assert_int_eq(qi_uc_class_of(0x1C89), QI_UC_OTHER);   /* new in 16.0 */
    ck_assert_int_eq(qi_uc_class_of(0xD800), QI_UC_OTHER);
    ck_assert_int_eq(qi_uc_class_of(0x10FFFF), QI_UC_OTHER);
    ck_assert_int_eq(qi_uc_class_of(0x110000), QI_UC_OTHER);

    size_t used;
    ck_assert_uint_eq(qi_utf8_decode_lax((const unsigned char *)"\xED\xA0\x80", 3, &used), 0xD800);
    ck_assert_uint_eq(used, 3);
    ck_assert_uint_eq(qi_utf8_decode_lax((const unsigned char *)"\xE0\x80\x80", 3, &used), 0);
    ck_assert_uint_eq(qi_utf8_decode_lax((const unsigned char *)"\xE4\xBD", 2, &used), 0xFFFD);
    ck_assert_uint_eq(used, 1);
    const unsigned char big[] = {0xF7, 0xBF, 0xBF, 0xBF}; /* U+1FFFFF */
    ck_assert_uint_eq(qi_utf8_decode_lax(big, 4, &used), 0xFFFD);
    ck_assert_uint_eq(qi_utf8_decode_lax((const unsigned char *)"\xF8", 1, &used), 0xFFFD);
}
END_TEST

/* ---- Metadata errors --------------------------------------------------------------- */

static void expect_error(qi_gguf_writer *w, qi_status want, const char *needle) {
    qi_tokenizer *t;
    qi_err e = {0};
    qi_status s = build(w, &t, &e);
    ck_assert_msg(s == want, "want %s, got %s (%s)", qi_status_str(want), qi_status_str(s), e.msg);
    ck_assert_msg(strstr(e.msg, needle) != NULL, "message '%s' lacks '%s'", e.msg, needle);
}

START_TEST(t_bad_metadata) {
    vocab v;
    const char *bad_merge[] = {"a b", "a zz"};
    expect_error(make_writer(&v, "gpt-2", NULL, NULL, 0, bad_merge, 2), QI_ERR_FORMAT,
                 "'zz' is not a token");
    const char *no_space[] = {"ab"};
    expect_error(make_writer(&v, "gpt-2", NULL, NULL, 0, no_space, 1), QI_ERR_FORMAT,
                 "merges[0]");
    expect_error(make_writer(&v, "no-such-pre", NULL, NULL, 0, NULL, 0), QI_ERR_UNSUPPORTED,
                 "no-such-pre");
    expect_error(make_writer(&v, "gpt2", NULL, NULL, 0, NULL, 0), QI_ERR_UNSUPPORTED,
                 "'gpt2'"); /* llama.cpp's name is "gpt-2" */

    qi_gguf_writer *w = make_writer(&v, "gpt-2", NULL, NULL, 0, NULL, 0);
    qi_gguf_writer_set_str(w, "tokenizer.ggml.model", "llama");
    expect_error(w, QI_ERR_UNSUPPORTED, "'llama'");

    w = qi_gguf_writer_create();
    qi_gguf_writer_set_u32(w, "general.alignment", 32);
    expect_error(w, QI_ERR_FORMAT, "tokenizer.ggml.model");

    w = qi_gguf_writer_create();
    qi_gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2");
    const char *m0[] = {"a b"};
    qi_gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", m0, 0);
    expect_error(w, QI_ERR_FORMAT, "tokenizer.ggml.tokens: missing");

    w = qi_gguf_writer_create();
    qi_gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2");
    int32_t ints[3] = {1, 2, 3};
    qi_gguf_writer_set_arr(w, "tokenizer.ggml.tokens", QI_GGUF_I32, ints, 3);
    expect_error(w, QI_ERR_FORMAT, "not an array of strings");

    w = qi_gguf_writer_create();
    qi_gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2");
    const char *one[] = {"a"};
    qi_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", one, 1);
    expect_error(w, QI_ERR_FORMAT, "tokenizer.ggml.merges: missing");

    w = make_writer(&v, "gpt-2", NULL, NULL, 0, NULL, 0);
    qi_gguf_writer_set_arr(w, "tokenizer.ggml.token_type", QI_GGUF_I32, ints, 3);
    expect_error(w, QI_ERR_FORMAT, "token_type");

    w = make_writer(&v, "gpt-2", NULL, NULL, 0, NULL, 0);
    qi_gguf_writer_set_str(w, "tokenizer.ggml.bos_token_id", "1");
    expect_error(w, QI_ERR_FORMAT, "bos_token_id");

    w = make_writer(&v, "gpt-2", NULL, NULL, 0, NULL, 0);
    qi_gguf_writer_set_u32(w, "tokenizer.ggml.add_bos_token", 1);
    expect_error(w, QI_ERR_FORMAT, "add_bos_token");

    w = make_writer(&v, "gpt-2", NULL, NULL, 0, NULL, 0);
    qi_gguf_writer_set_u32(w, "tokenizer.ggml.pre", 1);
    expect_error(w, QI_ERR_FORMAT, "tokenizer.ggml.pre");

    /* Out-of-range special ids are ignored, as llama.cpp does. */
    w = make_writer(&v, "gpt-2", NULL, NULL, 0, NULL, 0);
    qi_gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 100000);
    qi_tokenizer *t = must_build(w);
    ck_assert_int_eq(qi_tokenizer_eos(t), 11);
    qi_tokenizer_free(t);

    /* NULL arguments. */
    qi_err e = {0};
    ck_assert_int_eq(qi_tokenizer_create(NULL, &t, &e), QI_ERR_INVALID);
    ck_assert_ptr_null(t);
    int32_t *ids;
    size_t n;
    ck_assert_int_eq(qi_tokenize(NULL, "a", 1, false, false, &ids, &n, NULL), QI_ERR_INVALID);
    qi_tokenizer_free(NULL);
}
END_TEST

START_TEST(t_alloc_failures) {
    vocab v;
    const char *extra[] = {"ab", "<s>"};
    const int types[] = {1, 3};
    const char *merges[] = {"a b"};
    qi_gguf_writer *w = make_writer(&v, "smollm", extra, types, 2, merges, 1);
    void *buf;
    size_t len;
    qi_err e = {0};
    ck_assert_int_eq(qi_gguf_writer_to_memory(w, 3, &buf, &len, &e), QI_OK);
    qi_gguf_writer_free(w);
    qi_gguf *g;
    ck_assert_int_eq(qi_gguf_open_memory(buf, len, "mem.gguf", &g, &e), QI_OK);

    /* Fail each allocation of create in turn (PCRE2's included; a failed
     * JIT compile just means interpreted matching, so some runs succeed). */
    int nomem = 0, ok = 0;
    for (long k = 1; k <= 300; k++) {
        qi_tokenizer *t;
        qi_err ke = {0};
        qi_alloc_fail_after(k);
        qi_status s = qi_tokenizer_create(g, &t, &ke);
        qi_alloc_fail_after(0);
        if (s == QI_OK) {
            ok++;
            qi_tokenizer_free(t);
        } else {
            ck_assert_msg(s == QI_ERR_NOMEM, "k=%ld: %s", k, ke.msg);
            ck_assert_ptr_null(t);
            ck_assert_uint_gt(strlen(ke.msg), 0);
            nomem++;
        }
    }
    ck_assert_int_ge(nomem, 10);
    ck_assert_int_ge(ok, 1);

    qi_tokenizer *t;
    ck_assert_int_eq(qi_tokenizer_create(g, &t, &e), QI_OK);
    const char *text = "ab <s> 123 \xC3\xA9t\xC3\xA9 \x80 ab";
    nomem = 0;
    for (long k = 1; k <= 100; k++) {
        int32_t *ids = (int32_t *)&k;
        size_t n = 99;
        qi_err ke = {0};
        qi_alloc_fail_after(k);
        qi_status s = qi_tokenize(t, text, strlen(text), true, true, &ids, &n, &ke);
        qi_alloc_fail_after(0);
        if (s == QI_OK) {
            qi_free(ids);
        } else {
            ck_assert_msg(s == QI_ERR_NOMEM, "k=%ld: %s", k, ke.msg);
            ck_assert_ptr_null(ids);
            ck_assert_uint_eq(n, 0);
            nomem++;
        }
    }
    ck_assert_int_ge(nomem, 5);
    qi_tokenizer_free(t);
    qi_gguf_close(g);
    qi_free(buf);
}
END_TEST

/* ---- The real model: llama.cpp's goldens --------------------------------------------- */

static qi_gguf *g_model;
static qi_tokenizer *g_tok;

static void real_setup(void) {
    const char *path = qi_test_cached(MODEL_REL);
    ck_assert_ptr_nonnull(path);
    qi_err e = {0};
    ck_assert_msg(qi_gguf_open(path, &g_model, &e) == QI_OK, "%s", e.msg);
    ck_assert_msg(qi_tokenizer_create(g_model, &g_tok, &e) == QI_OK, "%s", e.msg);
}

static void real_teardown(void) {
    qi_tokenizer_free(g_tok);
    qi_gguf_close(g_model);
    g_tok = NULL;
    g_model = NULL;
}

START_TEST(t_golden) {
    qi_tok_golden *gl;
    size_t n = qi_tok_golden_read(GOLDEN, &gl);
    ck_assert_uint_ge(n, 300);
    size_t bad = qi_tok_golden_check(g_tok, gl, n, "tokenizer golden");
    qi_tok_golden_free(gl, n);
    ck_assert_msg(bad == 0, "%zu golden lines differ from llama.cpp", bad);
}
END_TEST

static bool valid_utf8(const unsigned char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        int l = qi_utf8_seq_len(s[i]);
        if (l == 0 || i + (size_t)l > n) return false;
        for (int k = 1; k < l; k++)
            if (!qi_utf8_cont_ok(s[i], k, s[i + k])) return false;
        i += (size_t)l;
    }
    return true;
}

/* Detokenise ids with pieces (special = false) and with the streaming
 * detokenizer; both must give s back; every streamed chunk must be whole
 * characters. Returns how many pushes held bytes back. */
static int check_round_trip(const unsigned char *s, size_t len) {
    int32_t *ids;
    size_t n;
    qi_err e = {0};
    ck_assert_int_eq(qi_tokenize(g_tok, (const char *)s, len, false, false, &ids, &n, &e), QI_OK);
    size_t max = qi_tokenizer_max_piece(g_tok) + QI_DETOK_MAX_PENDING;
    char *a = malloc(len + 1), *b = malloc(len + 1), *chunk = malloc(max);
    size_t na = 0, nb = 0;
    int held = 0;
    qi_detok d;
    qi_detok_init(&d);
    for (size_t i = 0; i < n; i++) {
        size_t k = qi_token_to_piece(g_tok, ids[i], false, NULL, 0);
        ck_assert_uint_le(na + k, len);
        qi_token_to_piece(g_tok, ids[i], false, a + na, k);
        na += k;
        size_t c = qi_detok_push(g_tok, &d, ids[i], false, chunk, max);
        ck_assert_msg(valid_utf8((unsigned char *)chunk, c), "streamed chunk is not whole UTF-8");
        if (d.n_pending) held++;
        ck_assert_uint_le(nb + c, len);
        memcpy(b + nb, chunk, c);
        nb += c;
    }
    nb += qi_detok_flush(&d, b + nb, len - nb);
    ck_assert_uint_eq(na, len);
    ck_assert_uint_eq(nb, len);
    ck_assert(memcmp(a, s, len) == 0);
    ck_assert(memcmp(b, s, len) == 0);
    free(a);
    free(b);
    free(chunk);
    qi_free(ids);
    return held;
}

START_TEST(t_round_trip) {
    /* Every valid-UTF-8 golden input. */
    qi_tok_golden *gl;
    size_t n = qi_tok_golden_read(GOLDEN, &gl), checked = 0;
    for (size_t i = 0; i < n; i++)
        if (valid_utf8(gl[i].in, gl[i].len)) {
            check_round_trip(gl[i].in, gl[i].len);
            checked++;
        }
    ck_assert_uint_ge(checked, 200);
    qi_tok_golden_free(gl, n);

    /* Random code points from many blocks. */
    static const uint32_t ranges[][2] = {
        {0x20, 0x7E},     {0x09, 0x0D},     {0xA0, 0x24F},    {0x300, 0x36F},  {0x370, 0x4FF},
        {0x590, 0x6FF},   {0x900, 0x97F},   {0xE00, 0xE7F},   {0x1100, 0x11FF}, {0x2000, 0x206F},
        {0x3000, 0x30FF}, {0x4E00, 0x9FFF}, {0xAC00, 0xD7A3}, {0xE000, 0xE0FF}, {0xFF00, 0xFFEF},
        {0x1F300, 0x1FAFF}, {0x20000, 0x2A6DF}, {0x2EBF0, 0x2EE5D}, {0x10FF00, 0x10FFFF},
    };
    uint64_t st = 12345;
    unsigned char buf[512];
    for (int r = 0; r < 300; r++) {
        size_t len = 0;
        int k = 1 + (int)(qi_test_rand(&st) % 40);
        for (int i = 0; i < k; i++) {
            const uint32_t *rg = ranges[qi_test_rand(&st) % (sizeof ranges / sizeof ranges[0])];
            uint32_t cp = rg[0] + (uint32_t)(qi_test_rand(&st) % (rg[1] - rg[0] + 1));
            len += qi_utf8_encode(cp, buf + len);
        }
        check_round_trip(buf, len);
    }
}
END_TEST

START_TEST(t_streaming_split) {
    /* Emoji and rare CJK come out as several byte-level tokens each. */
    const char *s = "Hi \xF0\x9F\xA6\x99\xF0\x9F\xAB\xA0 \xE4\xB9\x82\xF0\xA0\x80\x8B"
                    " and \xF0\x9F\x98\x80!";
    int held = check_round_trip((const unsigned char *)s, strlen(s));
    ck_assert_int_ge(held, 1);
}
END_TEST

START_TEST(t_real_metadata) {
    ck_assert_int_eq(qi_tokenizer_n_vocab(g_tok), 49152);
    ck_assert_int_eq(qi_tokenizer_bos(g_tok), 1);
    ck_assert_int_eq(qi_tokenizer_eos(g_tok), 2);
    ck_assert(!qi_tokenizer_add_bos(g_tok));
    ck_assert(!qi_tokenizer_add_eos(g_tok));
    ck_assert_str_eq(qi_tokenizer_pre_name(g_tok), "smollm");
    ck_assert_int_eq(qi_token_find(g_tok, "<|im_end|>"), 2);
    ck_assert_int_eq(qi_token_find(g_tok, "<|im_start|>"), 1);
    /* EOG as llama.cpp reports it for this model: 0, 2 and 4. */
    int n_eog = 0;
    for (int32_t i = 0; i < qi_tokenizer_n_vocab(g_tok); i++)
        n_eog += qi_tokenizer_is_eog(g_tok, i);
    ck_assert_int_eq(n_eog, 3);
    ck_assert(qi_tokenizer_is_eog(g_tok, 0));
    ck_assert(qi_tokenizer_is_eog(g_tok, 2));
    ck_assert(qi_tokenizer_is_eog(g_tok, 4));
}
END_TEST

START_TEST(t_speed) {
    /* Reported, not asserted tightly: shared machines vary. */
    double t0 = qi_test_now();
    qi_tokenizer *t;
    qi_err e = {0};
    ck_assert_int_eq(qi_tokenizer_create(g_model, &t, &e), QI_OK);
    double t1 = qi_test_now();
    size_t len = 0, cap = 1 << 20;
    char *text = malloc(cap);
    const char *para = "The quick brown fox, 1234 times: \"caf\xC3\xA9\" "
                       "\xE4\xBD\xA0\xE5\xA5\xBD \xF0\x9F\x99\x82 int main(void) { return 0; }\n";
    while (len + strlen(para) < cap) {
        memcpy(text + len, para, strlen(para));
        len += strlen(para);
    }
    int32_t *ids;
    size_t n;
    double t2 = qi_test_now();
    ck_assert_int_eq(qi_tokenize(t, text, len, false, false, &ids, &n, &e), QI_OK);
    double t3 = qi_test_now();
    fprintf(stderr, "tokenizer: build %.1f ms; tokenise %.1f MB/s, %.2f M tokens/s\n",
            (t1 - t0) * 1e3, len / (t3 - t2) / 1e6, n / (t3 - t2) / 1e6);
    ck_assert_msg(t1 - t0 < 1.0, "building the tokenizer took %.0f ms", (t1 - t0) * 1e3);
    qi_free(ids);
    free(text);
    qi_tokenizer_free(t);
}
END_TEST

static Suite *tokenizer_suite(bool have_model) {
    Suite *s = suite_create("tokenizer");
    TCase *tc = tcase_create("synthetic");
    tcase_add_test(tc, t_merge_order);
    tcase_add_test(tc, t_digits_split);
    tcase_add_test(tc, t_invalid_utf8);
    tcase_add_test(tc, t_special_tokens);
    tcase_add_test(tc, t_bos_eos);
    tcase_add_test(tc, t_eog);
    tcase_add_test(tc, t_pieces);
    tcase_add_test(tc, t_detok_synthetic);
    tcase_add_test(tc, t_unicode_table);
    tcase_add_test(tc, t_bad_metadata);
    tcase_add_test(tc, t_alloc_failures);
    tcase_set_timeout(tc, 60);
    suite_add_tcase(s, tc);
    if (have_model) {
        tc = tcase_create("smollm2");
        tcase_add_checked_fixture(tc, real_setup, real_teardown);
        tcase_set_timeout(tc, 120);
        tcase_add_test(tc, t_golden);
        tcase_add_test(tc, t_round_trip);
        tcase_add_test(tc, t_streaming_split);
        tcase_add_test(tc, t_real_metadata);
        tcase_add_test(tc, t_speed);
        suite_add_tcase(s, tc);
    }
    return s;
}

int main(void) {
    bool have_model = qi_test_cached(MODEL_REL) != NULL;
    SRunner *sr = srunner_create(tokenizer_suite(have_model));
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    if (failed) return EXIT_FAILURE;
    if (!have_model) {
        fprintf(stderr, "test_tokenizer: %s not cached: llama.cpp golden comparison skipped\n",
                MODEL_REL);
        return 77;
    }
    return EXIT_SUCCESS;
}

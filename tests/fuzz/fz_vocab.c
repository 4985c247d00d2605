/* fz_vocab.c - the small vocabularies of the tokenizer and server fuzz
 * targets (fz.h), written with the GGUF writer as the tokenizer tests
 * write theirs, read back and built by qi_tokenizer_create. */
#include <stdio.h>
#include <string.h>

#include "fz.h"
#include "qinfer/gguf.h"

/* GPT-2's byte -> code point map, as UTF-8 into out (NUL-terminated). */
static void byte_level(int b, char out[4]) {
    int cp = b;
    if (!((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255))) {
        int n = 0;
        for (int x = 0; x < b; x++)
            if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255))) n++;
        cp = 256 + n;
    }
    if (cp < 0x80) {
        out[0] = (char)cp, out[1] = 0;
    } else {
        out[0] = (char)(0xC0 | (cp >> 6)), out[1] = (char)(0x80 | (cp & 0x3F)), out[2] = 0;
    }
}

static qi_tokenizer *build(qi_gguf_writer *w, const char *what) {
    void *buf = NULL;
    size_t len = 0;
    qi_err e = {0};
    qi_gguf *g = NULL;
    qi_tokenizer *t = NULL;
    if (qi_gguf_writer_to_memory(w, 3, &buf, &len, &e) || qi_gguf_open_memory(buf, len, what, &g, &e) ||
        qi_tokenizer_create(g, &t, &e)) {
        fprintf(stderr, "fuzz: the %s vocabulary does not build: %s\n", what, e.msg);
        abort();
    }
    qi_gguf_close(g);
    qi_free(buf);
    qi_gguf_writer_free(w);
    return t;
}

#define G "\xC4\xA0" /* byte-level space */

qi_tokenizer *fz_vocab_bpe(const char *pre) {
    static char bytes[256][4];
    static const char *const extra[] = {G "t", "he", G "the", "in", G "a", "12", "123", G G,
                                        "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<user>"};
    static const int extra_type[] = {1, 1, 1, 1, 1, 1, 1, 1, 3, 3, 3, 4};
    static const char *const merges[] = {G " t", "h e", G "t he", "i n", G " a", "1 2", "12 3", G " " G};
    enum { N_EXTRA = sizeof extra / sizeof extra[0] };
    const char *toks[256 + N_EXTRA];
    int32_t types[256 + N_EXTRA];
    for (int b = 0; b < 256; b++) {
        byte_level(b, bytes[b]);
        if (b == 0) strcpy(bytes[0], "\xC4\x80"); /* U+0100 */
        toks[b] = bytes[b];
        types[b] = 1;
    }
    for (int i = 0; i < N_EXTRA; i++) toks[256 + i] = extra[i], types[256 + i] = extra_type[i];
    qi_gguf_writer *w = qi_gguf_writer_create();
    if (!w) abort();
    qi_gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2");
    qi_gguf_writer_set_str(w, "tokenizer.ggml.pre", pre);
    qi_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, 256 + N_EXTRA);
    qi_gguf_writer_set_arr(w, "tokenizer.ggml.token_type", QI_GGUF_I32, types, 256 + N_EXTRA);
    qi_gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", merges, sizeof merges / sizeof merges[0]);
    qi_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 256 + 8);
    qi_gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 256 + 10);
    return build(w, pre);
}

#define M "\xE2\x96\x81" /* U+2581, SentencePiece's space */

qi_tokenizer *fz_vocab_spm(bool space_prefix) {
    static char names[256][8];
    static const char *const extra[] = {M, M "t", M "th", M "the", "he", "h", "e", "t", "a", M "a",
                                        "é", "\xE2\x96\x81\xE2\x96\x81", "<start_of_turn>", "<end_of_turn>", "<user>"};
    static const float extra_score[] = {-1, -2, -3, -1, -4, -5, -5, -5, -5, -2, -6, -3, 0, 0, 0};
    static const int extra_type[] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 3, 3, 4};
    enum { N_EXTRA = sizeof extra / sizeof extra[0], N = 3 + 256 + N_EXTRA };
    const char *toks[N];
    float scores[N];
    int32_t types[N];
    toks[0] = "<unk>", toks[1] = "<s>", toks[2] = "</s>";
    types[0] = 2, types[1] = 3, types[2] = 3;
    scores[0] = scores[1] = scores[2] = 0;
    for (int b = 0; b < 256; b++) {
        snprintf(names[b], sizeof names[b], "<0x%02X>", b);
        toks[3 + b] = names[b], scores[3 + b] = 0, types[3 + b] = 6;
    }
    for (int i = 0; i < N_EXTRA; i++)
        toks[259 + i] = extra[i], scores[259 + i] = extra_score[i], types[259 + i] = extra_type[i];
    qi_gguf_writer *w = qi_gguf_writer_create();
    if (!w) abort();
    qi_gguf_writer_set_str(w, "tokenizer.ggml.model", "llama");
    qi_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, N);
    qi_gguf_writer_set_arr(w, "tokenizer.ggml.scores", QI_GGUF_F32, scores, N);
    qi_gguf_writer_set_arr(w, "tokenizer.ggml.token_type", QI_GGUF_I32, types, N);
    qi_gguf_writer_set_bool(w, "tokenizer.ggml.add_space_prefix", space_prefix);
    return build(w, space_prefix ? "spm" : "spm-no-prefix");
}

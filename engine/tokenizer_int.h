/* tokenizer_int.h - the tokenizer's insides, shared by tokenizer.c (loading,
 * pieces, detokenising) and tokenize.c (text -> ids). Private. */
#ifndef QINFER_TOKENIZER_INT_H
#define QINFER_TOKENIZER_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pretok_int.h"
#include "qinfer/tokenizer.h"

/* Token attributes (llama.cpp's llama_token_attr bits). */
enum {
    QI_TOK_UNKNOWN = 1 << 0,
    QI_TOK_UNUSED = 1 << 1,
    QI_TOK_NORMAL = 1 << 2,
    QI_TOK_CONTROL = 1 << 3,
    QI_TOK_USER_DEFINED = 1 << 4,
    QI_TOK_BYTE = 1 << 5,
    QI_TOK_LSTRIP = 1 << 7,
    QI_TOK_RSTRIP = 1 << 8,
};

typedef struct {
    int32_t rank; /* -1: empty slot */
    int32_t left, right;
    int32_t result; /* id of the merged text, -1 if it is not a token */
} qi_tok_merge;

struct qi_tokenizer {
    int32_t n_vocab;
    char *text;          /* every token's text, back to back */
    size_t *text_off;    /* [n_vocab + 1] */
    uint16_t *attr;      /* [n_vocab] QI_TOK_* */
    uint64_t *vocab_tab; /* open addressing: (hash tag << 32) | id; all ones = empty */
    size_t vocab_mask;
    qi_tok_merge *merge_tab; /* open addressing on (left, right) */
    size_t merge_mask;
    char *piece; /* every token's piece (as for special = true), back to back */
    size_t *piece_off;
    size_t max_piece;
    int32_t *special; /* ids cut out of text before BPE, longest text first */
    int32_t n_special;
    uint64_t *eog; /* bitmap over ids */
    int32_t bos, eos;
    bool add_bos, add_eos;
    qi_pretok pre;

    uint8_t byte_enc[256][2]; /* GPT-2 byte-level character of each byte, UTF-8 */
    uint8_t byte_enc_len[256];
    int16_t char_dec[0x144]; /* inverse: code point -> byte, -1 if none */
    int32_t byte_tok[256];   /* token of each byte's byte-level character, or -1 */
    int32_t single_tok[256]; /* token whose text is that one byte, or -1 */
};

static inline const char *qi_tok_text(const qi_tokenizer *t, int32_t id, size_t *len) {
    *len = t->text_off[id + 1] - t->text_off[id];
    return t->text + t->text_off[id];
}

/* Id of the token with text s[0..n), -1 if none. */
int32_t qi_tok_vocab_find(const qi_tokenizer *t, const char *s, size_t n);
/* The merge of tokens a and b, NULL if there is none. */
const qi_tok_merge *qi_tok_merge_find(const qi_tokenizer *t, int32_t a, int32_t b);
/* First occurrence of needle[0..m) (m >= 1) in hay[0..n). */
bool qi_tok_find_bytes(const char *hay, size_t n, const char *needle, size_t m, size_t *at);

#endif

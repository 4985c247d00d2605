/* tokenizer_int.h - the tokenizer's insides, shared by tokenizer.c (loading,
 * pieces, detokenising), tokenizer_special.c (special ids and the list of
 * special tokens), tokenize.c (text -> ids; BPE, "gpt2" and "gemma4"),
 * tokenizer_spm.c (what differs for SentencePiece "llama" vocabularies) and
 * tokenizer_wpm.c (WordPiece "bert"). Private. */
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

    /* SentencePiece ("llama") vocabularies only (tokenizer_spm.c). */
    bool spm;
    bool add_space_prefix;      /* tokenizer.ggml.add_space_prefix, default true */
    float *score;               /* [n_vocab] tokenizer.ggml.scores */
    int32_t byte_fallback[256]; /* token "<0xXX>", else (SentencePiece only) the one-byte
                                   token, else -1 */
    bool no_default_ids;        /* BOS/EOS only from metadata ("gemma4") */

    /* WordPiece ("bert") vocabularies only (tokenizer_wpm.c). */
    bool wpm;
    bool lowercase, strip_accents; /* tokenizer.ggml.normalizer.* */
    size_t max_token_len;          /* longest token text, bytes */
    int32_t unk, sep;              /* unknown and separator ids, -1 if none (all families) */
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

/* ---- Special tokens (tokenizer_special.c) ---------------------------------------
 * After the tokens (and scores or merges) are read: */

/* Special ids (metadata, else llama.cpp's defaults and well-known texts), the
 * end-of-generation set and the attribute fixes llama.cpp makes from token
 * texts. QI_ERR_FORMAT for mistyped keys, QI_ERR_NOMEM. */
qi_status qi_tok_special_ids(qi_tokenizer *t, const qi_gguf *g, qi_err *err);
/* The list qi_tokenize cuts text at (control, user-defined and unknown
 * tokens, longest text first, then lowest id) and llama.cpp's per-model
 * lstrip/rstrip flags. QI_ERR_NOMEM. */
qi_status qi_tok_special_list(qi_tokenizer *t, const qi_gguf *g, qi_err *err);

/* ---- SentencePiece vocabularies (tokenizer_spm.c) ------------------------------
 * qi_tokenizer_create dispatches on tokenizer.ggml.model == "llama": these
 * replace the pre-tokenizer set-up, the merges, the gpt2 special-id defaults and
 * the byte-level pieces; token texts and types, special ids, EOG and the
 * special-token list are loaded by the shared code. */

/* Mark t as SentencePiece, name its pre-tokenizer "default" (llama.cpp ignores
 * tokenizer.ggml.pre for these) and read tokenizer.ggml.add_space_prefix.
 * QI_ERR_FORMAT if that key is not a bool. */
qi_status qi_tok_spm_init(qi_tokenizer *t, const qi_gguf *g, qi_err *err);
/* After the tokens are read: tokenizer.ggml.scores (f32 or i32 array, at least
 * n_vocab entries, no NaN) and the byte-fallback table. QI_ERR_UNSUPPORTED
 * without scores (valid GGUF, but every merge would tie), QI_ERR_FORMAT for a
 * mistyped, short or NaN array, QI_ERR_NOMEM. */
qi_status qi_tok_spm_scores(qi_tokenizer *t, const qi_gguf *g, qi_err *err);
/* llama.cpp's SPM defaults, before metadata overrides them: BOS 1, EOS 2 (each
 * only if in range), add BOS, no EOS. */
void qi_tok_spm_defaults(qi_tokenizer *t, int32_t *bos, int32_t *eos);
/* Every token's piece: control/unknown/user-defined tokens their text, normal
 * tokens their text with U+2581 turned into spaces, byte tokens their byte,
 * others nothing. QI_ERR_NOMEM. */
qi_status qi_tok_spm_pieces(qi_tokenizer *t, qi_err *err);

/* Scratch for qi_tok_spm_text; zero-initialise, release with _fini. */
typedef struct {
    qi_vec text; /* char: the escaped fragment */
    qi_vec sym;  /* symbols */
    qi_vec heap; /* candidate pairs */
} qi_tok_spm_work;
void qi_tok_spm_work_fini(qi_tok_spm_work *w);
/* Tokenise one raw fragment s[0..len) (len >= 1; no special tokens in it) and
 * append the ids to out (int32_t, *n_out of them so far). after_special: the
 * fragment starts the text or follows a special token, so a space is put in
 * front when the vocabulary asks for it. QI_ERR_UNSUPPORTED when a character
 * that is no token has a byte without a byte token (llama.cpp aborts there),
 * QI_ERR_NOMEM. */
qi_status qi_tok_spm_text(const qi_tokenizer *t, qi_tok_spm_work *w, const char *s, size_t len,
                          bool after_special, qi_vec *out, size_t *n_out, qi_err *err);

/* A whole sequence as llama_detokenize gives it for a SentencePiece vocabulary:
 * remove_special drops a leading BOS (when the model adds one) and a trailing
 * EOS (likewise); unparse_special is qi_token_to_piece's `special`; with
 * add_space_prefix the first remaining token loses one leading space unless a
 * BOS was dropped. (For gpt2 vocabularies it is the pieces concatenated,
 * without llama.cpp's clean_spaces pass.) Writes at most cap bytes to out (may
 * be NULL if cap is 0) and returns the full length. Streaming (qi_detok_push)
 * never strips: it gives what llama_token_to_piece gives, as llama.cpp's
 * programs print generated text. */
size_t qi_tok_spm_detokenize(const qi_tokenizer *t, const int32_t *ids, size_t n,
                             bool remove_special, bool unparse_special, char *out, size_t cap);

/* ---- WordPiece vocabularies (tokenizer_wpm.c) -----------------------------------
 * qi_tokenizer_create dispatches on tokenizer.ggml.model == "bert". */

/* Mark t as WordPiece, name its pre-tokenizer "default" and read the
 * normalizer flags. QI_ERR_FORMAT if one is not a bool. */
qi_status qi_tok_wpm_init(qi_tokenizer *t, const qi_gguf *g, qi_err *err);
/* After the tokens are read: the longest token text. */
void qi_tok_wpm_after_tokens(qi_tokenizer *t);
/* llama.cpp's WPM defaults before metadata: BOS ([CLS]) 101, no EOS, unknown
 * 100, separator 102 (each only if in range), add BOS. */
void qi_tok_wpm_defaults(qi_tokenizer *t, int32_t *bos, int32_t *eos);

typedef struct {
    qi_vec word; /* char: the word being built, U+2581 first */
} qi_tok_wpm_work;
void qi_tok_wpm_work_fini(qi_tok_wpm_work *w);
/* Normalise, split and cut one raw fragment s[0..len) (no special tokens in
 * it), appending the ids to out (int32_t, *n_out so far). QI_ERR_UNSUPPORTED
 * when a word has no cut and there is no unknown token, QI_ERR_NOMEM. */
qi_status qi_tok_wpm_text(const qi_tokenizer *t, qi_tok_wpm_work *w, const char *s, size_t len,
                          qi_vec *out, size_t *n_out, qi_err *err);

/* The byte-level character GPT-2's vocabularies spell byte b (0..255)
 * with, as NUL-terminated UTF-8; returns its length (1 or 2). */
size_t qi_tok_byte_char(int b, char out[5]);

#endif

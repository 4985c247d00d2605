/* tokenizer_wpm.c - WordPiece ("bert") vocabularies: BERT and its kin,
 * token for token as llama.cpp's WPM tokenizer.
 *
 * The shared loader reads token texts and types and the special ids; what is
 * WordPiece's own is here. For each raw fragment between special tokens:
 *
 *  1. Normalise and split into words (BERT's BasicTokenizer, as llama.cpp
 *     does it): with strip_accents each code point is first replaced by the
 *     first code point of its canonical decomposition (so "é" is "e" plus
 *     nothing: one to one, not a full NFD); white space ends a word; NUL,
 *     U+FFFD (also what invalid UTF-8 decodes to) and control/format/private
 *     use characters are dropped, and so are combining marks with
 *     strip_accents; with lowercase each kept code point is lowercased
 *     (simple mapping); punctuation, ASCII symbols and CJK ideographs are
 *     words of their own. Classes are looked up on the decomposed, not yet
 *     lowercased code point.
 *  2. Each word, with U+2581 in front (the converted vocabularies spell
 *     word-initial pieces that way and continuation pieces bare), is cut
 *     greedily into the longest tokens from the left, by bytes; if some
 *     position starts no token, the whole word is the unknown token.
 *
 * normalizer.lowercase (default true) and normalizer.strip_accents (default:
 * as lowercase) come from the metadata. With add_special, the sequence gets
 * BOS ([CLS]) first and the separator ([SEP]) last, as in llama.cpp (which
 * ignores add_bos/add_sep there). Pieces are SentencePiece's (U+2581 back to
 * a space), so qi_tok_spm_pieces makes them.
 *
 * Text does not round-trip: case, accents, control characters and the kind
 * and amount of white space are gone.
 */
#include "tokenizer_int.h"

#include <stdio.h>
#include <string.h>

#include "unicode_int.h"

#define MARKER "\xE2\x96\x81" /* U+2581 */

#define OOM(err) QI_ERR(err, QI_ERR_NOMEM, "tokenizer: out of memory")

static qi_status get_bool(const qi_gguf *g, const char *key, bool *out, qi_err *err) {
    const qi_gguf_kv *kv = qi_gguf_kv_find(g, key);
    if (kv && (qi_gguf_kv_type(kv) != QI_GGUF_BOOL || !qi_gguf_kv_bool(kv, out)))
        return QI_ERR(err, QI_ERR_FORMAT, "%s: expected a bool, got %s", key,
                      qi_gguf_vtype_name(qi_gguf_kv_type(kv)));
    return QI_OK;
}

qi_status qi_tok_wpm_init(qi_tokenizer *t, const qi_gguf *g, qi_err *err) {
    t->wpm = true;
    snprintf(t->pre.name, sizeof t->pre.name, "default");
    t->lowercase = true;
    qi_status st = get_bool(g, "tokenizer.ggml.normalizer.lowercase", &t->lowercase, err);
    t->strip_accents = t->lowercase;
    if (!st) st = get_bool(g, "tokenizer.ggml.normalizer.strip_accents", &t->strip_accents, err);
    return st;
}

void qi_tok_wpm_after_tokens(qi_tokenizer *t) {
    t->max_token_len = 0;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        size_t n = t->text_off[id + 1] - t->text_off[id];
        if (n > t->max_token_len) t->max_token_len = n;
    }
}

void qi_tok_wpm_defaults(qi_tokenizer *t, int32_t *bos, int32_t *eos) {
    *bos = 101 < t->n_vocab ? 101 : -1;
    *eos = -1;
    t->unk = 100 < t->n_vocab ? 100 : -1;
    t->sep = 102 < t->n_vocab ? 102 : -1;
    t->add_bos = true;
    t->add_eos = false;
}

/* CJK ideographs that BERT splits apart (its _is_chinese_char ranges, with
 * the extension range starting at U+2B920 as in the Rust tokenizers). */
static bool is_cjk(uint32_t c) {
    return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) ||
           (c >= 0x20000 && c <= 0x2A6DF) || (c >= 0x2A700 && c <= 0x2B73F) ||
           (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
           (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

void qi_tok_wpm_work_fini(qi_tok_wpm_work *w) {
    if (!w) return;
    qi_free(w->word.p);
    memset(w, 0, sizeof *w);
}

/* Greedy longest-first cut of word[0..n) (which starts with the marker);
 * the unknown token if some position starts no token. */
static qi_status cut_word(const qi_tokenizer *t, const char *word, size_t n, qi_vec *out,
                          size_t *n_out, qi_err *err) {
    const size_t start = *n_out;
    for (size_t i = 0; i < n;) {
        size_t j = i + t->max_token_len < n ? i + t->max_token_len : n;
        int32_t id = -1;
        for (; j > i; j--)
            if ((id = qi_tok_vocab_find(t, word + i, j - i)) >= 0) break;
        if (id < 0) {
            *n_out = start; /* discard the word's tokens */
            break;
        }
        if (!qi_vec_need(out, *n_out + 1, sizeof(int32_t))) return OOM(err);
        ((int32_t *)out->p)[(*n_out)++] = id;
        i = j;
    }
    if (*n_out == start) {
        if (t->unk < 0)
            return QI_ERR(err, QI_ERR_UNSUPPORTED,
                          "tokenize: a word has no WordPiece cut and the vocabulary no unknown "
                          "token");
        if (!qi_vec_need(out, *n_out + 1, sizeof(int32_t))) return OOM(err);
        ((int32_t *)out->p)[(*n_out)++] = t->unk;
    }
    return QI_OK;
}

qi_status qi_tok_wpm_text(const qi_tokenizer *t, qi_tok_wpm_work *w, const char *s, size_t len,
                          qi_vec *out, size_t *n_out, qi_err *err) {
    /* The current word, marker first; m is its length (3: empty). */
    if (!qi_vec_need(&w->word, 3 + 4 * len, 1)) return OOM(err);
    char *word = w->word.p;
    memcpy(word, MARKER, 3);
    size_t m = 3;
    qi_status st = QI_OK;
    for (size_t i = 0; i < len && !st;) {
        size_t used;
        uint32_t c = qi_utf8_decode_lax((const unsigned char *)s + i, len - i, &used);
        i += used;
        if (t->strip_accents) c = qi_uc_nfd_first(c);
        qi_uc_class cls = qi_uc_class_of(c);
        if (cls == QI_UC_SPACE) {
            if (m > 3) st = cut_word(t, word, m, out, n_out, err);
            m = 3;
            continue;
        }
        if (c == 0 || c == 0xFFFD || qi_uc_is_control(c)) continue;
        if (t->strip_accents && cls == QI_UC_MARK) continue;
        unsigned char u[4];
        size_t k = qi_utf8_encode(t->lowercase ? qi_uc_tolower(c) : c, u);
        if (cls == QI_UC_PUNCT || (c < 0x7F && cls == QI_UC_SYMBOL) || is_cjk(c)) {
            if (m > 3 && (st = cut_word(t, word, m, out, n_out, err))) break;
            memcpy(word + 3, u, k); /* a word of its own */
            st = cut_word(t, word, 3 + k, out, n_out, err);
            m = 3;
        } else {
            memcpy(word + m, u, k);
            m += k;
        }
    }
    if (!st && m > 3) st = cut_word(t, word, m, out, n_out, err);
    return st;
}

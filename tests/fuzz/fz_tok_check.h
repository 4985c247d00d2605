/* fz_tok_check.h - the properties both tokenizer fuzz targets check on one
 * tokenisation (fz_tok_bpe.c, fz_tok_spm.c). */
#ifndef QI_FZ_TOK_CHECK_H
#define QI_FZ_TOK_CHECK_H

#include <string.h>

#include "fz.h"

/* Whether s[0..n) is well-formed UTF-8 (no overlong forms, surrogates or
 * values past U+10FFFF): the text the tokenizers promise to give back. */
static inline bool fz_utf8_valid(const uint8_t *s, size_t n) {
    for (size_t i = 0; i < n;) {
        const uint8_t c = s[i];
        const size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        if (!len || i + len > n || (len == 2 && c < 0xC2) || c > 0xF4) return false;
        for (size_t k = 1; k < len; k++)
            if ((s[i + k] & 0xC0) != 0x80) return false;
        if (len > 2) {
            const uint8_t c1 = s[i + 1];
            if ((c == 0xE0 && c1 < 0xA0) || (c == 0xED && c1 >= 0xA0) || (c == 0xF0 && c1 < 0x90) ||
                (c == 0xF4 && c1 >= 0x90))
                return false;
        }
        i += len;
    }
    return true;
}

/* Tokenises text[0..n) with t and checks: success (any bytes are text), every
 * id inside the vocabulary, the streaming detokenizer giving exactly the
 * concatenated pieces, and, when `want` is not NULL, those pieces (special
 * tokens' texts left out) equal to want[0..n_want). */
static inline void fz_tok_check(const qi_tokenizer *t, const uint8_t *text, size_t n, bool add_special,
                                bool parse_special, const uint8_t *want, size_t n_want) {
    int32_t *ids = NULL;
    size_t n_ids = 0;
    qi_err e = {0};
    qi_status st = qi_tokenize(t, (const char *)text, n, add_special, parse_special, &ids, &n_ids, &e);
    FZ_CHECK(st == QI_OK, "qi_tokenize failed on %zu bytes: %s", n, e.msg);
    FZ_CHECK(ids != NULL, "no id array for %zu bytes", n);
    const int32_t n_vocab = qi_tokenizer_n_vocab(t);
    const size_t max = qi_tokenizer_max_piece(t) + QI_DETOK_MAX_PENDING;
    char *pieces = malloc(n_ids * max + 16), *streamed = malloc(n_ids * max + 16), *chunk = malloc(max);
    if (!pieces || !streamed || !chunk) abort();
    size_t np = 0, ns = 0;
    qi_detok d;
    qi_detok_init(&d);
    for (size_t i = 0; i < n_ids; i++) {
        FZ_CHECK(ids[i] >= 0 && ids[i] < n_vocab, "id %d at %zu is outside the vocabulary of %d", ids[i], i, n_vocab);
        const size_t k = qi_token_to_piece(t, ids[i], want == NULL, NULL, 0);
        FZ_CHECK(k <= max, "piece of %d is %zu bytes, over the longest %zu", ids[i], k, max);
        FZ_CHECK(qi_token_to_piece(t, ids[i], want == NULL, pieces + np, k) == k, "piece length changed");
        np += k;
        const size_t c = qi_detok_push(t, &d, ids[i], want == NULL, chunk, max);
        FZ_CHECK(c <= max, "detok push wrote %zu of %zu", c, max);
        memcpy(streamed + ns, chunk, c);
        ns += c;
    }
    ns += qi_detok_flush(&d, streamed + ns, QI_DETOK_MAX_PENDING);
    FZ_CHECK(ns == np && memcmp(pieces, streamed, np) == 0, "streamed %zu bytes, pieces %zu bytes, differ", ns, np);
    if (want)
        FZ_CHECK(np == n_want && memcmp(pieces, want, n_want) == 0,
                 "decode(encode(x)) != x: %zu bytes in, %zu out (%zu ids)", n_want, np, n_ids);
    free(pieces), free(streamed), free(chunk);
    qi_free(ids);
}

#endif

/* fz_tok_spm.c - libFuzzer target: the SentencePiece tokenizer on arbitrary
 * bytes, on the small vocabulary of fz_vocab.c (byte fallback, scored
 * pieces, control and user-defined tokens), with and without
 * add_space_prefix.
 *
 * Input: one byte (bit 0: add_space_prefix; bits 4 and 5: add_special,
 * parse_special), then the text. Checked: every id in the vocabulary, the
 * streaming detokenizer equal to the pieces, and decode(encode(x)) == x for
 * well-formed UTF-8 without the space prefix, special-token parsing or
 * U+2581 (every byte has a byte token; U+2581 is the vocabulary's space,
 * and decodes as one).
 */
#define _GNU_SOURCE /* memmem */
#include <string.h>

#include "fz.h"
#include "fz_tok_check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static qi_tokenizer *tok[2];
    if (size < 1) return 0;
    const int prefix = data[0] & 1;
    const bool add_special = data[0] & 0x10, parse_special = data[0] & 0x20;
    if (!tok[prefix]) tok[prefix] = fz_vocab_spm(prefix);
    const uint8_t *text = data + 1;
    const size_t n = size - 1;
    /* U+2581 in the text is SentencePiece's own space mark: it comes back as a space */
    const bool exact = !prefix && !add_special && !parse_special && fz_utf8_valid(text, n) &&
                       !memmem(text, n, "\xE2\x96\x81", 3);
    fz_tok_check(tok[prefix], text, n, add_special, parse_special, exact ? text : NULL, n);
    return 0;
}

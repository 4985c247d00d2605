/* fz_tok_bpe.c - libFuzzer target: byte-level BPE on arbitrary bytes, under
 * each pre-tokenizer regex set (default, smollm, gpt-2, llama3, qwen2, and
 * chatglm-bpe's flags), on the small vocabulary of fz_vocab.c.
 *
 * Input: one byte choosing the set (low bits) and the add_special /
 * parse_special flags (bits 4 and 5), then the text. Checked: every id in
 * the vocabulary, the streaming detokenizer equal to the pieces, and
 * decode(encode(x)) == x for well-formed UTF-8 without special-token
 * parsing (every byte has a token, so nothing is lost).
 */
#include "fz.h"
#include "fz_tok_check.h"

static const char *const k_pre[] = {"default", "smollm", "gpt-2", "llama3", "qwen2", "chatglm-bpe"};
enum { N_PRE = sizeof k_pre / sizeof k_pre[0] };

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static qi_tokenizer *tok[N_PRE];
    if (size < 1) return 0;
    const int which = (data[0] & 0x0F) % N_PRE;
    const bool add_special = data[0] & 0x10, parse_special = data[0] & 0x20;
    if (!tok[which]) tok[which] = fz_vocab_bpe(k_pre[which]);
    const uint8_t *text = data + 1;
    const size_t n = size - 1;
    const bool exact = !add_special && !parse_special && fz_utf8_valid(text, n);
    fz_tok_check(tok[which], text, n, add_special, parse_special, exact ? text : NULL, n);
    return 0;
}

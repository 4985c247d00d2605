/* tokenizer.h - the tokenizers of GGUF vocabularies: byte-level BPE
 * ("gpt2", SmolLM2 and other GPT-2-style models), BPE on UTF-8 with
 * SentencePiece spaces ("gemma4"), SentencePiece ("llama", Gemma 3 and other
 * SPM models; tokenizer_spm.c) and WordPiece ("bert"; tokenizer_wpm.c).
 *
 * Built from a model's tokenizer.ggml.* metadata and meant to give, token for
 * token, what llama.cpp gives for the same model: same pre-tokenizer splits,
 * same merges, same special-token handling, same output for bytes that are
 * not valid UTF-8. A tokenizer is immutable after qi_tokenizer_create, so one
 * may be shared by threads; it copies what it needs and does not keep a
 * reference to the qi_gguf.
 *
 * Ids are int32_t; -1 means "no such token".
 */
#ifndef QINFER_TOKENIZER_H
#define QINFER_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "qinfer/gguf.h"
#include "qinfer/status.h"

typedef struct qi_tokenizer qi_tokenizer;

/* Build from metadata: tokenizer.ggml.model "gpt2", "gemma4" (merges on
 * UTF-8 characters, spaces as U+2581, "<0xXX>" byte fallback), "llama"
 * (SentencePiece: score-ordered merges, byte fallback, U+2581 for spaces,
 * add_space_prefix; a character with neither a token nor a byte token is
 * QI_ERR_UNSUPPORTED at tokenisation time) or "bert" (WordPiece: BERT
 * normalisation, greedy longest match, [UNK] for words without a cut). For
 * "gpt2", tokenizer.ggml.pre names the pre-tokenizer, one of llama.cpp's
 * names: "smollm" (digits apart, then GPT-2's; also starcoder, refact,
 * command-r, ...), "gpt-2" (also phi-2, olmo, mpt, ...), "llama3" (also
 * llama-bpe, dbrx, ...), "qwen2" (also stablelm2, ...), "qwen35", "falcon",
 * "deepseek-llm", "deepseek-coder" or "default" (also when absent; see
 * pretok_table.c for the full list); tokens, token types, merges, special
 * ids and add_bos/add_eos as llama.cpp reads them. Errors: QI_ERR_FORMAT for
 * missing or mistyped keys and for merges naming unknown tokens,
 * QI_ERR_UNSUPPORTED for another tokenizer model or pre-tokenizer name,
 * QI_ERR_NOMEM. On failure *out is NULL. g is borrowed and may be closed
 * once this returns. */
qi_status qi_tokenizer_create(const qi_gguf *g, qi_tokenizer **out, qi_err *err);
void qi_tokenizer_free(qi_tokenizer *t); /* NULL is a no-op */
/* The tokenizer of the GGUF file at path, without loading a model: any file
 * whose metadata carries a tokenizer will do, with or without tensors and
 * whatever its general.architecture (llama.cpp's vocabulary-only files
 * included). Errors as qi_gguf_open and qi_tokenizer_create, prefixed with
 * the path; QI_ERR_INVALID for NULL arguments. */
qi_status qi_tokenizer_load(const char *path, qi_tokenizer **out, qi_err *err);
/* The same from len bytes of GGUF in memory (borrowed only for the call: the
 * tokenizer copies what it needs). The entry point for fuzzing: any bytes
 * give a tokenizer or an error status (never an abort), and a tokenizer so
 * made takes any bytes in qi_tokenize, qi_token_to_piece, qi_detokenize and
 * qi_detok_push. QI_ERR_INVALID for NULL out, or NULL buf with len > 0. */
qi_status qi_tokenizer_load_memory(const void *buf, size_t len, qi_tokenizer **out, qi_err *err);

int32_t qi_tokenizer_n_vocab(const qi_tokenizer *t);
int32_t qi_tokenizer_bos(const qi_tokenizer *t); /* -1 if none */
int32_t qi_tokenizer_eos(const qi_tokenizer *t); /* -1 if none */
/* Whether add_special tokenisation puts BOS first (tokenizer.ggml.add_bos_token,
 * else llama.cpp's default for the pre-tokenizer: true for the llama3 family,
 * false otherwise; always for gemma4 and WordPiece) and EOS last
 * (tokenizer.ggml.add_eos_token, else false; never for WordPiece, which puts
 * its separator token last instead). */
bool qi_tokenizer_add_bos(const qi_tokenizer *t);
bool qi_tokenizer_add_eos(const qi_tokenizer *t);
/* End of generation: eos, eot, eom, the FIM pad/repo/file-separator tokens and
 * tokens whose text llama.cpp lists ("<|im_end|>", "<|endoftext|>", ...). */
bool qi_tokenizer_is_eog(const qi_tokenizer *t, int32_t id);
/* Name of the pre-tokenizer in use (tokenizer.ggml.pre, "default" if absent). */
const char *qi_tokenizer_pre_name(const qi_tokenizer *t);

/* Tokenise len bytes of text (any bytes: NUL and invalid UTF-8 included;
 * text may be NULL if len is 0). Invalid UTF-8 is tokenised as llama.cpp does:
 * its decoder takes a sequence's length from the lead byte and checks only
 * the continuation bytes' top bits; each byte where that fails stands for
 * U+FFFD, so such text does not round-trip; overlong forms and surrogates
 * decode to their value (and overlong ones are re-encoded short); values
 * above U+10FFFF, on which llama.cpp aborts, are U+FFFD per byte here.
 * add_special: BOS/EOS as the model asks (see
 * qi_tokenizer_add_bos/_eos). parse_special: text equal to a control token's
 * text (e.g. "<|im_start|>") becomes that token; user-defined tokens are
 * matched either way, as in llama.cpp. On success *ids is qi_malloc'ed (never
 * NULL, even for 0 ids; free with qi_free). On failure *ids is NULL and *n_ids
 * 0. Errors: QI_ERR_NOMEM; QI_ERR_INVALID for NULL arguments or when the model
 * asks for BOS/EOS but has none. */
qi_status qi_tokenize(const qi_tokenizer *t, const char *text, size_t len, bool add_special,
                      bool parse_special, int32_t **ids, size_t *n_ids, qi_err *err);

/* Id of the token whose text is exactly `text` (NUL-terminated), -1 if none.
 * Texts are as stored in the vocabulary (byte-level encoded for normal tokens:
 * " the" is "Ġthe"); meant for special tokens such as "<|im_end|>". */
int32_t qi_token_find(const qi_tokenizer *t, const char *text);
/* The stored text of a token (not NUL-terminated), NULL if id is out of range. */
const char *qi_token_text(const qi_tokenizer *t, int32_t id, size_t *len);

/* The bytes a token stands for: normal tokens byte-level decoded; control and
 * unknown tokens give their text only if `special`, else nothing; user-defined
 * tokens always give their text; unused tokens give nothing. Out-of-range ids
 * give nothing. Writes at most cap bytes to buf (buf may be NULL if cap is 0)
 * and returns the full length, which may exceed cap. */
size_t qi_token_to_piece(const qi_tokenizer *t, int32_t id, bool special, char *buf, size_t cap);
/* The longest piece any token gives (special = true): an output buffer of
 * qi_tokenizer_max_piece(t) + QI_DETOK_MAX_PENDING bytes always suffices for
 * qi_detok_push. */
size_t qi_tokenizer_max_piece(const qi_tokenizer *t);

/* A whole sequence back to text, as llama.cpp's llama_detokenize gives it
 * (without its clean_spaces pass, so byte-level vocabularies give exactly the
 * concatenated pieces): remove_special drops a leading BOS and a trailing EOS
 * where the model adds them; unparse_special is qi_token_to_piece's
 * `special`; a SentencePiece-style vocabulary that puts a space in front of
 * the text (add_space_prefix) takes it off the first token again unless a
 * BOS was dropped. Writes at most cap bytes to out (may be NULL if cap is 0)
 * and returns the full length. */
size_t qi_detokenize(const qi_tokenizer *t, const int32_t *ids, size_t n, bool remove_special,
                     bool unparse_special, char *out, size_t cap);

/* Streaming detokeniser. Push ids one at a time; what comes back is only whole
 * UTF-8 characters: the bytes of a character split across tokens are held
 * (in `pending`) until its last byte arrives. Bytes that cannot be part of a
 * valid UTF-8 character (a stray continuation byte, C0/C1/F5..FF, a sequence
 * cut short by a byte that cannot continue it, an overlong form or surrogate)
 * are emitted unchanged, in order, as soon as that is certain; nothing is
 * replaced by U+FFFD. Concatenating every push and the final flush gives
 * exactly the concatenated pieces. The caller owns the qi_detok. */
typedef struct {
    unsigned char pending[8]; /* an incomplete but so far valid sequence (<= 3 bytes) */
    int n_pending;
} qi_detok;
#define QI_DETOK_MAX_PENDING 4

void qi_detok_init(qi_detok *d);
/* Append the piece of `id` (see qi_token_to_piece) and write what is now
 * complete to out; returns bytes written. At most cap bytes are written: with
 * cap >= qi_tokenizer_max_piece(t) + QI_DETOK_MAX_PENDING nothing is lost;
 * with less, output past cap is dropped. */
size_t qi_detok_push(const qi_tokenizer *t, qi_detok *d, int32_t id, bool special, char *out,
                     size_t cap);
/* Emit whatever is still held (an incomplete sequence, as raw bytes) and reset
 * d. Returns bytes written (at most cap; QI_DETOK_MAX_PENDING always suffices). */
size_t qi_detok_flush(qi_detok *d, char *out, size_t cap);

#endif

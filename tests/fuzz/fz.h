/* fz.h - what the fuzz targets (tests/fuzz/fz_*.c) share: a failed
 * property aborts with a message (libFuzzer saves the input as a crash; the
 * replay driver's run fails), a private scratch folder for the doors that
 * read files by path, and the small vocabularies of fz_vocab.c. */
#ifndef QI_FZ_H
#define QI_FZ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "qinfer/tokenizer.h"

/* A property the door promises, checked: abort() with the reason when it
 * does not hold. */
#define FZ_CHECK(cond, ...)                                                          \
    do {                                                                             \
        if (!(cond)) {                                                               \
            fprintf(stderr, "%s:%d: property failed: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                            \
            fputc('\n', stderr);                                                     \
            abort();                                                                 \
        }                                                                            \
    } while (0)

/* With QI_FZ_VERBOSE set, a line on stderr saying how an input ended (a
 * refusal's message, a script's error): for checking that seeds reach
 * where they are meant to. */
void fz_note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* This process's scratch folder (made once under $TMPDIR or /tmp, removed
 * at exit with what the targets left in it). */
const char *fz_tmpdir(void);
/* dir/name into buf; returns buf. */
const char *fz_path(char *buf, size_t cap, const char *name);
/* Writes data[0..n) to path (truncating); aborts when it cannot. */
void fz_write(const char *path, const void *data, size_t n);
/* A NUL-terminated copy of data[0..n) (malloc'ed). */
char *fz_strndup(const uint8_t *data, size_t n);

/* The small vocabularies the tokenizer tests build (tests/unit/test_tokenizer*.c):
 * byte-level BPE ("gpt2") with the 256 byte tokens, a few merges and
 * special tokens, under the pre-tokenizer `pre`; SentencePiece ("llama")
 * with <unk> <s> </s>, the 256 <0xXX> byte tokens, a few scored pieces and
 * special tokens. Abort when they cannot be built. */
qi_tokenizer *fz_vocab_bpe(const char *pre);
qi_tokenizer *fz_vocab_spm(bool space_prefix);

#endif

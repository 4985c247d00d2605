/* pretok_int.h - regex pre-tokenisation for the BPE tokenizer (private).
 *
 * Splits text into the words BPE then works on, with the regexes llama.cpp
 * attaches to a tokenizer.ggml.pre name. See pretok.c.
 */
#ifndef QINFER_PRETOK_INT_H
#define QINFER_PRETOK_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "qinfer/status.h"

/* A growable array (cap counts elements; memory from qi_realloc). */
typedef struct {
    void *p;
    size_t cap;
} qi_vec;

/* Make room for n elements of elem bytes; false on OOM (v unchanged). */
bool qi_vec_need(qi_vec *v, size_t n, size_t elem);

#define QI_PRETOK_MAX_REGEX 8

/* What a pre-tokenizer name implies besides its regexes (llama.cpp's
 * per-name settings that matter for tokenising). */
enum {
    QI_PRETOK_IGNORE_MERGES = 1, /* a word that is a token is taken whole */
    QI_PRETOK_ADD_BOS = 2,       /* add_bos defaults to true */
    QI_PRETOK_NO_BOS = 4,        /* no default BOS id */
    QI_PRETOK_ESCAPE_SPACES = 8, /* spaces become U+2581 before splitting (and back in pieces) */
    QI_PRETOK_RAW_BYTES = 16,    /* BPE on the UTF-8 itself, not GPT-2's byte-level
                                    characters; bytes fall back to "<0xXX>" tokens */
    QI_PRETOK_NEWLINE_RUNS = 32, /* a word of line feeds only that is a token is taken whole */
    QI_PRETOK_FORCE_BOS = 64,    /* add_bos is true whatever the metadata says */
};

/* The regexes (NULL-terminated within QI_PRETOK_MAX_REGEX) and QI_PRETOK_*
 * flags of the pre-tokenizer named name[0..len); false for names we do not
 * have (pretok_table.c). */
bool qi_pretok_lookup(const char *name, size_t len, const char *const **regex, unsigned *flags);

typedef struct {
    char name[64];
    unsigned flags; /* QI_PRETOK_* */
    pcre2_general_context *gctx; /* allocates through qi_malloc */
    pcre2_code *re[QI_PRETOK_MAX_REGEX];
    bool raw[QI_PRETOK_MAX_REGEX]; /* matched on the text itself, not the collapsed copy */
    int n_re;
} qi_pretok;

/* Per-call scratch, reusable across calls; zero-initialise it. */
typedef struct {
    qi_vec cp;     /* uint32_t: code points of the text, as decoded */
    qi_vec coff;   /* size_t: byte offset of each code point in coll, [n + 1] */
    qi_vec coll;   /* unsigned char: the collapsed copy PCRE2 matches on */
    qi_vec roff;   /* size_t: byte offset of each code point in raw, [n + 1] */
    qi_vec raw;    /* unsigned char: the text re-encoded for regexes without classes */
    qi_vec bound;  /* size_t: word k ends at code point bound[k] */
    qi_vec bound2; /* size_t: scratch */
    pcre2_match_data *md;
} qi_pretok_work;

/* Set up the pre-tokenizer named name[0..len) (len 0: "default").
 * QI_ERR_UNSUPPORTED for names we do not have, QI_ERR_NOMEM. On failure p
 * needs only qi_pretok_fini. */
qi_status qi_pretok_init(qi_pretok *p, const char *name, size_t len, qi_err *err);
void qi_pretok_fini(qi_pretok *p);

/* Decode len (>= 1) bytes into w->cp (invalid bytes become U+FFFD) and split
 * them into *n_words words ending at w->bound[0..*n_words). */
qi_status qi_pretok_split(const qi_pretok *p, qi_pretok_work *w, const unsigned char *s,
                          size_t len, size_t *n_words, qi_err *err);
void qi_pretok_work_fini(qi_pretok_work *w);

#endif

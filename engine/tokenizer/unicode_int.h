/* unicode_int.h - UTF-8 coding and Unicode character classes for the
 * tokenizer (private to the engine).
 *
 * The classes are those that pre-tokenizer regexes ask about (\p{L}, \p{N},
 * \p{P}, \p{M}, \p{S}, \s), pinned to Unicode 15.1 because that is the data the
 * reference tokenizer (llama.cpp) was built with. See unicode.c for why the
 * tokenizer does not use the system PCRE2's own Unicode tables.
 */
#ifndef QINFER_UNICODE_INT_H
#define QINFER_UNICODE_INT_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
    QI_UC_OTHER = 0, /* C* (control, format, private use, unassigned), non-white-space Z* */
    QI_UC_LETTER,    /* L* */
    QI_UC_NUMBER,    /* N* */
    QI_UC_PUNCT,     /* P* */
    QI_UC_MARK,      /* M* */
    QI_UC_SYMBOL,    /* S* */
    QI_UC_SPACE,     /* the 25 White_Space code points (wins over the category) */
} qi_uc_class;

/* Class of a code point; anything above U+10FFFF is QI_UC_OTHER. */
qi_uc_class qi_uc_class_of(uint32_t cp);

/* Decode one code point from s[0..n) (n >= 1) the way llama.cpp does: the
 * length comes from the lead byte and only the continuation bytes' top bits
 * are checked, so overlong forms and surrogates decode to their value. An
 * invalid or truncated sequence, and (our choice; llama.cpp aborts) a value
 * above U+10FFFF, give U+FFFD and consume one byte. *used gets the bytes
 * consumed. */
uint32_t qi_utf8_decode_lax(const unsigned char *s, size_t n, size_t *used);

/* Encode cp (<= 0x10FFFF; surrogates encode like any other value) into out;
 * returns the byte count (1..4). */
size_t qi_utf8_encode(uint32_t cp, unsigned char out[4]);

/* Bytes of the character starting with b as llama.cpp's unicode_len_utf8
 * counts them: by the top four bits only (continuation bytes and F8..FF
 * included), 1 to 4. */
size_t qi_utf8_lead_len(unsigned char b);

/* Strict UTF-8 (RFC 3629): how many bytes the sequence starting with lead byte
 * b has, or 0 if b cannot start one (continuation byte, C0, C1, F5..FF). */
int qi_utf8_seq_len(unsigned char b);
/* Whether byte b may stand at position i (1..3) of a strict sequence whose
 * lead byte is lead (checks the E0/ED/F0/F4 second-byte ranges). */
int qi_utf8_cont_ok(unsigned char lead, int i, unsigned char b);

/* ---- WordPiece normalisation (unicode_norm.c; tables generated into
 * unicode_norm_data.c by scripts/gen_unicode_norm.py, Unicode 15.1) ---------- */

/* The simple lowercase mapping of cp (UnicodeData.txt), cp itself if none. */
uint32_t qi_uc_tolower(uint32_t cp);
/* The first code point of cp's canonical decomposition (NFD), cp itself if it
 * has none: a one-to-one map, as llama.cpp's WordPiece normaliser uses it. */
uint32_t qi_uc_nfd_first(uint32_t cp);
/* General category Cc, Cf, Co or Cs (unassigned code points are not). */
int qi_uc_is_control(uint32_t cp);

typedef struct {
    uint32_t start;
    uint16_t count;
    uint8_t stride;
    int32_t delta;
} qi_uc_lower_run;
typedef struct {
    uint32_t first, last, target;
} qi_uc_range_map;
typedef struct {
    uint32_t first, last;
} qi_uc_range;
extern const qi_uc_lower_run qi_uc_lower_runs[];
extern const size_t qi_uc_lower_runs_n;
extern const qi_uc_range_map qi_uc_nfd_ranges[];
extern const size_t qi_uc_nfd_ranges_n;
extern const qi_uc_range qi_uc_control_ranges[];
extern const size_t qi_uc_control_ranges_n;

#endif

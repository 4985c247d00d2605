/* tokenizer.c - loading a byte-level BPE ("gpt2") vocabulary from GGUF
 * metadata, and token -> text.
 *
 * The loader reproduces what llama.cpp's llama_vocab::impl::load decides for
 * a gpt2 vocabulary, because every decision shows in the tokens: token texts
 * read as C strings (cut at a NUL; an empty one becomes "[EMPTY_<id>]"), the
 * last id winning for duplicate texts, merge ranks (the first of duplicate
 * pairs wins); the special tokens (default BOS/EOS ids, end-of-generation
 * tokens found by text, "unused" control tokens, per-model attribute fixes,
 * the special-token list sorted longest first) are tokenizer_special.c's.
 * Where llama.cpp's choice depends on hash-map order (several candidate
 * texts for one role), we take the lowest id.
 *
 * Stricter than llama.cpp, on purpose: both halves of every merge must be
 * tokens (llama.cpp would keep a merge of unknown strings that can still fire
 * on single characters missing from the vocabulary; we reject such files so
 * merges can be keyed by token ids), and a merge without a space is an error.
 *
 * Tables: token text -> id and (left id, right id) -> (rank, merged id) are
 * open-addressing hash tables; the vocabulary slot holds 32 bits of the hash
 * so that most non-matching probes never touch token text. Every token's piece
 * (its bytes, byte-level decoded) is made once here, as llama.cpp caches them.
 * Tokenising itself is in tokenize.c, pre-tokenisation in pretok.c.
 */
#include "tokenizer_int.h"

#include <stdio.h>
#include <string.h>

#include "unicode_int.h"

/* ---- Hashing ----------------------------------------------------------------- */

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 0x100000001b3ull;
    h ^= h >> 33; /* FNV's low bits mix poorly: finish as murmur3 does */
    h *= 0xff51afd7ed558ccdull;
    return h ^ (h >> 33);
}

static uint64_t hash_pair(int32_t a, int32_t b) {
    uint64_t x = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    x ^= x >> 33; /* murmur3 finaliser */
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

static size_t table_size(size_t n) {
    size_t s = 16;
    while (s < 2 * n) s <<= 1;
    return s;
}

#define VOCAB_EMPTY UINT64_MAX

/* The slot's upper half holds the hash's upper bits, so most probes that do
 * not match are rejected without touching the token text. */
int32_t qi_tok_vocab_find(const qi_tokenizer *t, const char *s, size_t n) {
    uint64_t h = hash_bytes(s, n), tag = h >> 32;
    for (size_t i = h & t->vocab_mask;; i = (i + 1) & t->vocab_mask) {
        uint64_t e = t->vocab_tab[i];
        if (e == VOCAB_EMPTY) return -1;
        if ((e >> 32) != tag) continue;
        int32_t id = (int32_t)(uint32_t)e;
        size_t len;
        const char *p = qi_tok_text(t, id, &len);
        if (len == n && memcmp(p, s, n) == 0) return id;
    }
}

/* Later ids replace earlier ones with the same text. */
static void vocab_insert(qi_tokenizer *t, int32_t id) {
    size_t n;
    const char *s = qi_tok_text(t, id, &n);
    uint64_t h = hash_bytes(s, n), tag = h >> 32;
    for (size_t i = h & t->vocab_mask;; i = (i + 1) & t->vocab_mask) {
        uint64_t e = t->vocab_tab[i];
        if (e != VOCAB_EMPTY) {
            if ((e >> 32) != tag) continue;
            size_t len;
            const char *p = qi_tok_text(t, (int32_t)(uint32_t)e, &len);
            if (len != n || memcmp(p, s, n) != 0) continue;
        }
        t->vocab_tab[i] = (tag << 32) | (uint32_t)id;
        return;
    }
}

const qi_tok_merge *qi_tok_merge_find(const qi_tokenizer *t, int32_t a, int32_t b) {
    for (size_t i = hash_pair(a, b) & t->merge_mask;; i = (i + 1) & t->merge_mask) {
        const qi_tok_merge *m = &t->merge_tab[i];
        if (m->rank < 0) return NULL;
        if (m->left == a && m->right == b) return m;
    }
}

bool qi_tok_find_bytes(const char *hay, size_t n, const char *needle, size_t m, size_t *at) {
    if (m == 0 || m > n) return false;
    const char *end = hay + n - m + 1, *p = hay;
    while (p < end && (p = memchr(p, needle[0], (size_t)(end - p))) != NULL) {
        if (memcmp(p, needle, m) == 0) {
            *at = (size_t)(p - hay);
            return true;
        }
        p++;
    }
    return false;
}

/* ---- Loading ---------------------------------------------------------------- */

/* GPT-2's printable bytes stand for themselves; the others, in byte
 * order, for U+0100 upwards. */
static uint32_t byte_cp(int b) {
    const bool self = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    if (self) return (uint32_t)b;
    int n = 0;
    for (int x = 0; x < b; x++) n += !((x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || x >= 0xAE);
    return 256u + (uint32_t)n;
}

size_t qi_tok_byte_char(int b, char out[5]) {
    const size_t n = qi_utf8_encode(byte_cp(b), (unsigned char *)out);
    out[n] = 0;
    return n;
}

static void byte_tables(qi_tokenizer *t) {
    for (int i = 0; i < 0x144; i++) t->char_dec[i] = -1;
    for (int b = 0; b < 256; b++) {
        const uint32_t cp = byte_cp(b);
        unsigned char u[4];
        t->byte_enc_len[b] = (uint8_t)qi_utf8_encode(cp, u);
        memcpy(t->byte_enc[b], u, t->byte_enc_len[b]);
        t->char_dec[cp] = (int16_t)b;
    }
    static const char hex[] = "0123456789ABCDEF";
    for (int b = 0; b < 256; b++) {
        char c = (char)b, name[6] = {'<', '0', 'x', hex[b >> 4], hex[b & 15], '>'};
        t->byte_tok[b] = qi_tok_vocab_find(t, (const char *)t->byte_enc[b], t->byte_enc_len[b]);
        t->single_tok[b] = qi_tok_vocab_find(t, &c, 1);
        /* BPE on raw UTF-8 falls back to "<0xXX>" only (SentencePiece
         * vocabularies redo this in qi_tok_spm_scores) */
        t->byte_fallback[b] = qi_tok_vocab_find(t, name, sizeof name);
    }
}

static qi_status read_tokens(qi_tokenizer *t, const qi_gguf *g, qi_err *err) {
    qi_gguf_arr toks;
    const qi_gguf_kv *kv = qi_gguf_kv_find(g, "tokenizer.ggml.tokens");
    if (!kv) return QI_ERR(err, QI_ERR_FORMAT, "tokenizer.ggml.tokens: missing");
    if (!qi_gguf_kv_arr(kv, &toks) || toks.type != QI_GGUF_STRING)
        return QI_ERR(err, QI_ERR_FORMAT, "tokenizer.ggml.tokens: not an array of strings");
    if (toks.n == 0) return QI_ERR(err, QI_ERR_FORMAT, "tokenizer.ggml.tokens: empty");
    if (toks.n > INT32_MAX / 2)
        return QI_ERR(err, QI_ERR_FORMAT, "tokenizer.ggml.tokens: %llu tokens is too many",
                      (unsigned long long)toks.n);
    int32_t n = (int32_t)toks.n;
    t->n_vocab = n;

    /* Texts are cut at a NUL (llama.cpp reads them as C strings); an empty
     * one becomes "[EMPTY_<id>]". Two passes: sizes, then copies. */
    t->text_off = qi_malloc(((size_t)n + 1) * sizeof *t->text_off);
    if (!t->text_off) return QI_ERR(err, QI_ERR_NOMEM, "tokenizer: out of memory");
    size_t total = 0;
    for (int pass = 0; pass < 2; pass++) {
        total = 0;
        for (int32_t i = 0; i < n; i++) {
            qi_str s;
            if (!qi_gguf_arr_str(&toks, (uint64_t)i, &s))
                return QI_ERR(err, QI_ERR_FORMAT, "tokenizer.ggml.tokens[%d]: unreadable", i);
            const char *nul = memchr(s.ptr, 0, (size_t)s.len);
            size_t len = nul ? (size_t)(nul - s.ptr) : (size_t)s.len;
            char empty[32];
            const char *src = s.ptr;
            if (len == 0) {
                len = (size_t)snprintf(empty, sizeof empty, "[EMPTY_%d]", (int)i);
                src = empty;
            }
            if (pass == 1) {
                memcpy(t->text + total, src, len);
                t->text_off[i] = total;
            }
            total += len;
        }
        if (pass == 0) {
            t->text = qi_malloc(total);
            if (!t->text) return QI_ERR(err, QI_ERR_NOMEM, "tokenizer: out of memory");
        }
    }
    t->text_off[n] = total;

    t->vocab_mask = table_size((size_t)n) - 1;
    t->vocab_tab = qi_malloc((t->vocab_mask + 1) * sizeof *t->vocab_tab);
    if (!t->vocab_tab) return QI_ERR(err, QI_ERR_NOMEM, "tokenizer: out of memory");
    memset(t->vocab_tab, 0xFF, (t->vocab_mask + 1) * sizeof *t->vocab_tab);
    for (int32_t i = 0; i < n; i++) vocab_insert(t, i);

    /* Token types (optional; all normal without them). */
    t->attr = qi_malloc((size_t)n * sizeof *t->attr);
    if (!t->attr) return QI_ERR(err, QI_ERR_NOMEM, "tokenizer: out of memory");
    kv = qi_gguf_kv_find(g, "tokenizer.ggml.token_type");
    qi_gguf_arr types;
    if (kv) {
        if (!qi_gguf_kv_arr(kv, &types) || types.type == QI_GGUF_STRING ||
            types.type == QI_GGUF_ARRAY || types.type == QI_GGUF_F32 ||
            types.type == QI_GGUF_F64)
            return QI_ERR(err, QI_ERR_FORMAT,
                          "tokenizer.ggml.token_type: not an array of integers");
        if (types.n < (uint64_t)n)
            return QI_ERR(err, QI_ERR_FORMAT,
                          "tokenizer.ggml.token_type: %llu entries for %d tokens",
                          (unsigned long long)types.n, (int)n);
    }
    for (int32_t i = 0; i < n; i++) {
        int64_t ty = 1;
        if (kv && !qi_gguf_arr_i64(&types, (uint64_t)i, &ty))
            return QI_ERR(err, QI_ERR_FORMAT, "tokenizer.ggml.token_type[%d]: unreadable", i);
        static const uint16_t map[] = {0, QI_TOK_NORMAL, QI_TOK_UNKNOWN, QI_TOK_CONTROL,
                                       QI_TOK_USER_DEFINED, QI_TOK_UNUSED, QI_TOK_BYTE};
        t->attr[i] = (ty >= 0 && ty <= 6) ? map[ty] : 0;
    }
    return QI_OK;
}

static qi_status read_merges(qi_tokenizer *t, const qi_gguf *g, qi_err *err) {
    qi_gguf_arr merges;
    const qi_gguf_kv *kv = qi_gguf_kv_find(g, "tokenizer.ggml.merges");
    if (!kv) return QI_ERR(err, QI_ERR_FORMAT, "tokenizer.ggml.merges: missing");
    if (!qi_gguf_kv_arr(kv, &merges) || merges.type != QI_GGUF_STRING)
        return QI_ERR(err, QI_ERR_FORMAT, "tokenizer.ggml.merges: not an array of strings");
    if (merges.n > INT32_MAX / 2)
        return QI_ERR(err, QI_ERR_FORMAT, "tokenizer.ggml.merges: too many entries");
    t->merge_mask = table_size((size_t)merges.n) - 1;
    t->merge_tab = qi_malloc((t->merge_mask + 1) * sizeof *t->merge_tab);
    if (!t->merge_tab) return QI_ERR(err, QI_ERR_NOMEM, "tokenizer: out of memory");
    for (size_t i = 0; i <= t->merge_mask; i++) t->merge_tab[i].rank = -1;

    char *cat = NULL; /* "left" + "right", to find the merged token */
    size_t cat_cap = 0;
    for (uint64_t r = 0; r < merges.n; r++) {
        qi_str s;
        if (!qi_gguf_arr_str(&merges, r, &s)) {
            qi_free(cat);
            return QI_ERR(err, QI_ERR_FORMAT, "tokenizer.ggml.merges[%llu]: unreadable",
                          (unsigned long long)r);
        }
        const char *nul = memchr(s.ptr, 0, (size_t)s.len);
        size_t len = nul ? (size_t)(nul - s.ptr) : (size_t)s.len;
        /* "left right", split at the first space after the first byte. */
        const char *sp = len > 1 ? memchr(s.ptr + 1, ' ', len - 1) : NULL;
        int32_t a = -1, b = -1;
        size_t la = 0, lb = 0;
        if (sp) {
            la = (size_t)(sp - s.ptr);
            lb = len - la - 1;
            a = qi_tok_vocab_find(t, s.ptr, la);
            b = qi_tok_vocab_find(t, sp + 1, lb);
        }
        if (a < 0 || b < 0) {
            qi_free(cat);
            int shown = len > 64 ? 64 : (int)len;
            if (!sp)
                return QI_ERR(err, QI_ERR_FORMAT,
                              "tokenizer.ggml.merges[%llu] '%.*s': not two space-separated tokens",
                              (unsigned long long)r, shown, s.ptr);
            const char *bad = a < 0 ? s.ptr : sp + 1;
            size_t nbad = a < 0 ? la : lb;
            return QI_ERR(err, QI_ERR_FORMAT,
                          "tokenizer.ggml.merges[%llu] '%.*s': '%.*s' is not a token",
                          (unsigned long long)r, shown, s.ptr, (int)(nbad > 64 ? 64 : nbad), bad);
        }
        if (la + lb > cat_cap) {
            cat_cap = 2 * (la + lb) + 64;
            qi_free(cat);
            cat = qi_malloc(cat_cap);
            if (!cat) return QI_ERR(err, QI_ERR_NOMEM, "tokenizer: out of memory");
        }
        memcpy(cat, s.ptr, la);
        memcpy(cat + la, sp + 1, lb);
        int32_t res = qi_tok_vocab_find(t, cat, la + lb);
        /* The first occurrence of a pair keeps its rank (llama.cpp's emplace). */
        for (size_t i = hash_pair(a, b) & t->merge_mask;; i = (i + 1) & t->merge_mask) {
            qi_tok_merge *m = &t->merge_tab[i];
            if (m->rank < 0) {
                *m = (qi_tok_merge){.rank = (int32_t)r, .left = a, .right = b, .result = res};
                break;
            }
            if (m->left == a && m->right == b) break;
        }
    }
    qi_free(cat);
    return QI_OK;
}

/* Append to a growable byte buffer, counting past what fits. */
typedef struct {
    char *buf;
    size_t len, cap;
    bool oom;
} bytebuf;

static bool bb_reserve(bytebuf *b, size_t n) {
    if (b->oom) return false;
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n) cap *= 2;
        char *nb = qi_realloc(b->buf, cap);
        if (!nb) {
            b->oom = true;
            return false;
        }
        b->buf = nb;
        b->cap = cap;
    }
    return true;
}

static void bb_put(bytebuf *b, const void *p, size_t n) {
    if (!bb_reserve(b, n)) return;
    memcpy(b->buf + b->len, p, n);
    b->len += n;
}

/* A normal token's bytes: each code point of its text is a GPT-2 byte-level
 * character; anything else comes out as llama.cpp writes it,
 * "[UNK_BYTE_0x<utf-8 hex><token text>]". */
static void decode_text(const qi_tokenizer *t, const char *s, size_t n, bytebuf *b) {
    for (size_t i = 0; i < n;) {
        size_t used;
        uint32_t cp = qi_utf8_decode_lax((const unsigned char *)s + i, n - i, &used);
        i += used;
        if (cp < 0x144 && t->char_dec[cp] >= 0) {
            char c = (char)t->char_dec[cp];
            bb_put(b, &c, 1);
            continue;
        }
        unsigned char u[4];
        size_t k = qi_utf8_encode(cp, u);
        char hex[16];
        bb_put(b, "[UNK_BYTE_0x", 12);
        for (size_t j = 0; j < k; j++) {
            snprintf(hex, sizeof hex, "%02x", u[j]);
            bb_put(b, hex, 2);
        }
        bb_put(b, s, n);
        bb_put(b, "]", 1);
    }
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static qi_status build_pieces(qi_tokenizer *t, qi_err *err) {
    int32_t n = t->n_vocab;
    bytebuf b = {0};
    t->piece_off = qi_malloc(((size_t)n + 1) * sizeof *t->piece_off);
    /* Pieces of normal tokens are never longer than their text. */
    if (!t->piece_off || !bb_reserve(&b, t->text_off[n] + 64))
        return QI_ERR(err, QI_ERR_NOMEM, "tokenizer: out of memory");
    t->max_piece = 0;
    for (int32_t id = 0; id < n; id++) {
        size_t len, start = b.len;
        const char *s = qi_tok_text(t, id, &len);
        uint16_t a = t->attr[id];
        t->piece_off[id] = b.len;
        if (a & (QI_TOK_UNKNOWN | QI_TOK_CONTROL | QI_TOK_USER_DEFINED)) {
            bb_put(&b, s, len);
        } else if (a & QI_TOK_NORMAL) {
            /* Fast path: every code point is a byte-level character, so the
             * piece is at most as long as the text. */
            bool plain = true;
            size_t k = 0;
            if (bb_reserve(&b, len)) {
                for (size_t i = 0; i < len && plain;) {
                    size_t used;
                    uint32_t cp = qi_utf8_decode_lax((const unsigned char *)s + i, len - i, &used);
                    i += used;
                    if (cp < 0x144 && t->char_dec[cp] >= 0)
                        b.buf[b.len + k++] = (char)t->char_dec[cp];
                    else
                        plain = false;
                }
            }
            if (plain) b.len += k;
            else decode_text(t, s, len, &b);
        } else if (a & QI_TOK_BYTE) {
            /* "<0xAB>": the two characters after "<0x", read as hex. */
            int v = 0;
            for (size_t i = 3; i < 5 && i < len && hexval(s[i]) >= 0; i++)
                v = v * 16 + hexval(s[i]);
            char c = (char)v;
            bb_put(&b, &c, 1);
        }
        if (b.len - start > t->max_piece) t->max_piece = b.len - start;
    }
    t->piece_off[n] = b.len;
    if (b.oom) {
        qi_free(b.buf);
        return QI_ERR(err, QI_ERR_NOMEM, "tokenizer: out of memory");
    }
    t->piece = b.buf ? b.buf : qi_malloc(1);
    if (!t->piece) return QI_ERR(err, QI_ERR_NOMEM, "tokenizer: out of memory");
    return QI_OK;
}

qi_status qi_tokenizer_create(const qi_gguf *g, qi_tokenizer **out, qi_err *err) {
    if (!out) return QI_ERR(err, QI_ERR_INVALID, "qi_tokenizer_create: out is NULL");
    *out = NULL;
    if (!g) return QI_ERR(err, QI_ERR_INVALID, "qi_tokenizer_create: g is NULL");
    qi_str model;
    const qi_gguf_kv *kv = qi_gguf_kv_find(g, "tokenizer.ggml.model");
    if (!kv) return QI_ERR(err, QI_ERR_FORMAT, "tokenizer.ggml.model: missing");
    if (!qi_gguf_kv_str(kv, &model))
        return QI_ERR(err, QI_ERR_FORMAT, "tokenizer.ggml.model: expected a string, got %s",
                      qi_gguf_vtype_name(qi_gguf_kv_type(kv)));
    bool spm = qi_str_eq(model, "llama"); /* SentencePiece: tokenizer_spm.c */
    /* Gemma 4: BPE merges on raw UTF-8 with SentencePiece's U+2581 spaces;
     * its pre-tokenizer is "gemma4" whatever tokenizer.ggml.pre says. */
    bool gemma4 = qi_str_eq(model, "gemma4");
    bool wpm = qi_str_eq(model, "bert"); /* WordPiece: tokenizer_wpm.c */
    if (!spm && !gemma4 && !wpm && !qi_str_eq(model, "gpt2"))
        return QI_ERR(err, QI_ERR_UNSUPPORTED,
                      "tokenizer.ggml.model '%.*s': only 'gpt2' (byte-level BPE), 'gemma4' (BPE "
                      "on UTF-8), 'llama' (SentencePiece) and 'bert' (WordPiece) are supported",
                      (int)(model.len > 64 ? 64 : model.len), model.ptr);

    qi_tokenizer *t = qi_calloc(1, sizeof *t);
    if (!t) return QI_ERR(err, QI_ERR_NOMEM, "tokenizer: out of memory");
    qi_str pre = {"", 0};
    kv = qi_gguf_kv_find(g, "tokenizer.ggml.pre");
    if (kv && !qi_gguf_kv_str(kv, &pre)) {
        qi_free(t);
        return QI_ERR(err, QI_ERR_FORMAT, "tokenizer.ggml.pre: expected a string, got %s",
                      qi_gguf_vtype_name(qi_gguf_kv_type(kv)));
    }
    if (gemma4) pre = (qi_str){"gemma4", 6};
    t->no_default_ids = gemma4;
    qi_status st = spm   ? qi_tok_spm_init(t, g, err)
                   : wpm ? qi_tok_wpm_init(t, g, err)
                         : qi_pretok_init(&t->pre, pre.ptr, (size_t)pre.len, err);
    if (!st) st = read_tokens(t, g, err);
    if (!st) {
        byte_tables(t);
        if (wpm) qi_tok_wpm_after_tokens(t); /* no scores, no merges */
        else st = spm ? qi_tok_spm_scores(t, g, err) : read_merges(t, g, err);
    }
    if (!st) st = qi_tok_special_ids(t, g, err);
    if (!st) st = qi_tok_special_list(t, g, err);
    if (!st)
        st = spm || wpm || (t->pre.flags & QI_PRETOK_ESCAPE_SPACES) ? qi_tok_spm_pieces(t, err)
                                                                    : build_pieces(t, err);
    if (st) {
        qi_tokenizer_free(t);
        return st;
    }
    *out = t;
    return QI_OK;
}

qi_status qi_tokenizer_load(const char *path, qi_tokenizer **out, qi_err *err) {
    if (!out) return QI_ERR(err, QI_ERR_INVALID, "qi_tokenizer_load: out is NULL");
    *out = NULL;
    if (!path) return QI_ERR(err, QI_ERR_INVALID, "qi_tokenizer_load: path is NULL");
    qi_gguf *g = NULL;
    qi_status st = qi_gguf_open(path, &g, err);
    if (st) return st;
    st = qi_tokenizer_create(g, out, err);
    if (st) qi_err_prefix(err, "%s", path);
    qi_gguf_close(g);
    return st;
}

qi_status qi_tokenizer_load_memory(const void *buf, size_t len, qi_tokenizer **out, qi_err *err) {
    if (!out) return QI_ERR(err, QI_ERR_INVALID, "qi_tokenizer_load_memory: out is NULL");
    *out = NULL;
    if (!buf && len) return QI_ERR(err, QI_ERR_INVALID, "qi_tokenizer_load_memory: buf is NULL");
    qi_gguf *g = NULL;
    qi_status st = qi_gguf_open_memory(buf ? buf : "", len, "memory", &g, err);
    if (st) return st;
    st = qi_tokenizer_create(g, out, err); /* copies what it needs: buf may go afterwards */
    qi_gguf_close(g);
    return st;
}

void qi_tokenizer_free(qi_tokenizer *t) {
    if (!t) return;
    qi_pretok_fini(&t->pre);
    qi_free(t->text);
    qi_free(t->text_off);
    qi_free(t->attr);
    qi_free(t->vocab_tab);
    qi_free(t->merge_tab);
    qi_free(t->piece);
    qi_free(t->piece_off);
    qi_free(t->special);
    qi_free(t->eog);
    qi_free(t->score);
    qi_free(t);
}

int32_t qi_tokenizer_n_vocab(const qi_tokenizer *t) { return t ? t->n_vocab : 0; }
int32_t qi_tokenizer_bos(const qi_tokenizer *t) { return t ? t->bos : -1; }
int32_t qi_tokenizer_eos(const qi_tokenizer *t) { return t ? t->eos : -1; }
bool qi_tokenizer_add_bos(const qi_tokenizer *t) { return t && t->add_bos; }
bool qi_tokenizer_add_eos(const qi_tokenizer *t) { return t && t->add_eos; }
const char *qi_tokenizer_pre_name(const qi_tokenizer *t) { return t ? t->pre.name : ""; }
size_t qi_tokenizer_max_piece(const qi_tokenizer *t) { return t ? t->max_piece : 0; }

bool qi_tokenizer_is_eog(const qi_tokenizer *t, int32_t id) {
    if (!t || !t->eog || id < 0 || id >= t->n_vocab) return false;
    return (t->eog[id >> 6] >> (id & 63)) & 1;
}

int32_t qi_token_find(const qi_tokenizer *t, const char *text) {
    if (!t || !text) return -1;
    return qi_tok_vocab_find(t, text, strlen(text));
}

const char *qi_token_text(const qi_tokenizer *t, int32_t id, size_t *len) {
    if (!t || id < 0 || id >= t->n_vocab) {
        if (len) *len = 0;
        return NULL;
    }
    size_t n;
    const char *s = qi_tok_text(t, id, &n);
    if (len) *len = n;
    return s;
}

/* ---- Detokenising ------------------------------------------------------------ */

size_t qi_token_to_piece(const qi_tokenizer *t, int32_t id, bool special, char *buf, size_t cap) {
    if (!t || id < 0 || id >= t->n_vocab) return 0;
    if (!special && (t->attr[id] & (QI_TOK_UNKNOWN | QI_TOK_CONTROL))) return 0;
    size_t n = t->piece_off[id + 1] - t->piece_off[id];
    if (buf && cap) memcpy(buf, t->piece + t->piece_off[id], n < cap ? n : cap);
    return n;
}

size_t qi_detokenize(const qi_tokenizer *t, const int32_t *ids, size_t n, bool remove_special,
                     bool unparse_special, char *out, size_t cap) {
    return qi_tok_spm_detokenize(t, ids, n, remove_special, unparse_special, out, cap);
}

void qi_detok_init(qi_detok *d) {
    if (d) memset(d, 0, sizeof *d);
}

static void out_put(char *out, size_t cap, size_t *n, const unsigned char *p, size_t k) {
    for (size_t i = 0; i < k; i++, (*n)++)
        if (*n < cap) out[*n] = (char)p[i];
}

size_t qi_detok_push(const qi_tokenizer *t, qi_detok *d, int32_t id, bool special, char *out,
                     size_t cap) {
    if (!t || !d || id < 0 || id >= t->n_vocab) return 0;
    if (!out) cap = 0;
    if (!special && (t->attr[id] & (QI_TOK_UNKNOWN | QI_TOK_CONTROL))) return 0;
    const unsigned char *p = (const unsigned char *)t->piece + t->piece_off[id];
    size_t np = t->piece_off[id + 1] - t->piece_off[id], n = 0;
    for (size_t i = 0; i < np;) {
        unsigned char b = p[i];
        if (d->n_pending == 0) {
            int sl = qi_utf8_seq_len(b);
            if (sl <= 1) {
                out_put(out, cap, &n, &b, 1); /* ASCII, or a byte no character starts with */
            } else {
                d->pending[0] = b;
                d->n_pending = 1;
            }
            i++;
            continue;
        }
        if (!qi_utf8_cont_ok(d->pending[0], d->n_pending, b)) {
            /* The held bytes can never complete: out as they are; b is
             * looked at afresh. */
            out_put(out, cap, &n, d->pending, (size_t)d->n_pending);
            d->n_pending = 0;
            continue;
        }
        d->pending[d->n_pending++] = b;
        i++;
        if (d->n_pending == qi_utf8_seq_len(d->pending[0])) {
            out_put(out, cap, &n, d->pending, (size_t)d->n_pending);
            d->n_pending = 0;
        }
    }
    return n < cap ? n : cap;
}

size_t qi_detok_flush(qi_detok *d, char *out, size_t cap) {
    if (!d) return 0;
    size_t n = 0;
    if (!out) cap = 0;
    out_put(out, cap, &n, d->pending, (size_t)d->n_pending);
    d->n_pending = 0;
    return n < cap ? n : cap;
}

/* tokenizer_spm.c - SentencePiece ("llama") vocabularies: Gemma, Llama 2,
 * Mistral and their kin, token for token as llama.cpp's SPM tokenizer.
 *
 * What differs from the byte-level BPE path, and only that, lives here; the
 * shared loader in tokenizer.c reads token texts and types, special ids, EOG
 * and the special-token list for both (llama.cpp's load does the same for
 * every vocabulary type), and tokenize.c cuts special tokens out of the text
 * for both. For each raw fragment between special tokens:
 *
 *  1. Spaces become U+2581 ("▁"); a space goes in front first when the
 *     vocabulary asks for it (tokenizer.ggml.add_space_prefix, default true;
 *     false for Gemma) and the fragment starts the text or follows a special
 *     token. There is no pre-tokenizer: the fragment is one word.
 *  2. The fragment is cut into characters by the UTF-8 lead byte alone, as
 *     llama.cpp's unicode_len_utf8 does (no check of the continuation bytes; a
 *     sequence cut off by the end is shorter). Invalid UTF-8 needs no special
 *     case: it ends up as byte tokens, whose pieces are those bytes. Two things
 *     do not read back as typed, in llama.cpp neither: a typed U+2581 (it
 *     becomes a space) and a space right after a broken lead byte (the lead
 *     byte takes in part of its marker, so it comes back as U+2581's bytes).
 *  3. Adjacent symbols whose concatenation is a token are candidate pairs; the
 *     pair whose token has the highest score merges first, the leftmost on
 *     ties, through a binary heap. A popped pair is stale when either side was
 *     merged away or grew since it was queued; sizes only grow, so comparing
 *     the two sizes' sum with the queued one is exact (llama.cpp's test).
 *     Scores are compared as floats, exactly.
 *  4. Each final symbol is its token, or else the byte tokens of its bytes:
 *     "<0xXX>", failing that the token whose text is the byte itself.
 *
 * llama.cpp looks up a merge's token without looking at its type, so control
 * or byte tokens can be merge results when their text is typed; we do the
 * same. Its "rev_merge" resegmentation never fires (it is keyed by texts that
 * are tokens and consulted only for texts that are not), so it is left out.
 *
 * Stricter than llama.cpp, on purpose: a vocabulary without scores is refused
 * (llama.cpp scores every token 0, so every merge ties) and NaN scores are an
 * error (they break the heap's order); a byte without a byte token is an error
 * where llama.cpp throws and aborts.
 *
 * Detokenising: pieces are made once here (marker back to space, byte tokens
 * to their byte) and the streaming qi_detok_* of tokenizer.c uses them as they
 * are. llama.cpp strips the leading space that add_space_prefix put in only in
 * llama_detokenize, on a whole sequence; qi_tok_spm_detokenize does that.
 */
#include "tokenizer_int.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "unicode_int.h"

#define MARKER "\xE2\x96\x81" /* U+2581, SentencePiece's space */
#define MARKER_LEN 3

#define OOM(err) QI_ERR(err, QI_ERR_NOMEM, "tokenizer: out of memory")

/* ---- Loading -------------------------------------------------------------------- */

qi_status qi_tok_spm_init(qi_tokenizer *t, const qi_gguf *g, qi_err *err) {
    t->spm = true;
    snprintf(t->pre.name, sizeof t->pre.name, "default");
    t->add_space_prefix = true;
    const qi_gguf_kv *kv = qi_gguf_kv_find(g, "tokenizer.ggml.add_space_prefix");
    if (kv && (qi_gguf_kv_type(kv) != QI_GGUF_BOOL || !qi_gguf_kv_bool(kv, &t->add_space_prefix)))
        return QI_ERR(err, QI_ERR_FORMAT,
                      "tokenizer.ggml.add_space_prefix: expected a bool, got %s",
                      qi_gguf_vtype_name(qi_gguf_kv_type(kv)));
    return QI_OK;
}

qi_status qi_tok_spm_scores(qi_tokenizer *t, const qi_gguf *g, qi_err *err) {
    int32_t n = t->n_vocab;
    const qi_gguf_kv *kv = qi_gguf_kv_find(g, "tokenizer.ggml.scores");
    if (!kv)
        return QI_ERR(err, QI_ERR_UNSUPPORTED,
                      "tokenizer.ggml.model 'llama' without tokenizer.ggml.scores: a "
                      "SentencePiece vocabulary needs its scores");
    qi_gguf_arr a;
    if (!qi_gguf_kv_arr(kv, &a) || (a.type != QI_GGUF_F32 && a.type != QI_GGUF_I32))
        return QI_ERR(err, QI_ERR_FORMAT, "tokenizer.ggml.scores: not an array of f32 or i32");
    if (a.n < (uint64_t)n)
        return QI_ERR(err, QI_ERR_FORMAT, "tokenizer.ggml.scores: %llu entries for %d tokens",
                      (unsigned long long)a.n, (int)n);
    t->score = qi_malloc((size_t)n * sizeof *t->score);
    if (!t->score) return OOM(err);
    for (int32_t i = 0; i < n; i++) {
        double v;
        if (!qi_gguf_arr_f64(&a, (uint64_t)i, &v))
            return QI_ERR(err, QI_ERR_FORMAT, "tokenizer.ggml.scores[%d]: unreadable", (int)i);
        if (isnan(v)) return QI_ERR(err, QI_ERR_FORMAT, "tokenizer.ggml.scores[%d]: NaN", (int)i);
        t->score[i] = (float)v; /* i32 scores: llama.cpp's static_cast<float> */
    }

    /* llama.cpp's byte_to_token: "<0xXX>" (upper-case hex), else the one-byte
     * text (never for byte 0: a C-string lookup of "" finds nothing). */
    static const char hex[] = "0123456789ABCDEF";
    for (int b = 0; b < 256; b++) {
        char name[6] = {'<', '0', 'x', hex[b >> 4], hex[b & 15], '>'}, c = (char)b;
        int32_t id = qi_tok_vocab_find(t, name, sizeof name);
        if (id < 0 && b != 0) id = qi_tok_vocab_find(t, &c, 1);
        t->byte_fallback[b] = id;
    }
    return QI_OK;
}

void qi_tok_spm_defaults(qi_tokenizer *t, int32_t *bos, int32_t *eos) {
    *bos = 1 < t->n_vocab ? 1 : -1;
    *eos = 2 < t->n_vocab ? 2 : -1;
    t->add_bos = true;
    t->add_eos = false;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

qi_status qi_tok_spm_pieces(qi_tokenizer *t, qi_err *err) {
    int32_t n = t->n_vocab;
    /* No piece is longer than its text, byte tokens' included (one byte). */
    size_t total = t->text_off[n];
    t->piece_off = qi_malloc(((size_t)n + 1) * sizeof *t->piece_off);
    t->piece = qi_malloc(total ? total : 1);
    if (!t->piece_off || !t->piece) return OOM(err);
    size_t at = 0;
    t->max_piece = 0;
    for (int32_t id = 0; id < n; id++) {
        size_t len, start = at;
        const char *s = qi_tok_text(t, id, &len);
        uint16_t a = t->attr[id];
        t->piece_off[id] = at;
        if (a & (QI_TOK_UNKNOWN | QI_TOK_CONTROL | QI_TOK_USER_DEFINED)) {
            memcpy(t->piece + at, s, len);
            at += len;
        } else if (a & QI_TOK_NORMAL) {
            for (size_t i = 0; i < len;) {
                if (len - i >= MARKER_LEN && memcmp(s + i, MARKER, MARKER_LEN) == 0) {
                    t->piece[at++] = ' ';
                    i += MARKER_LEN;
                } else {
                    t->piece[at++] = s[i++];
                }
            }
        } else if (a & QI_TOK_BYTE) {
            /* "<0xAB>": the hex digits among the two characters after "<0x"
             * (llama.cpp: strtol of text.substr(3, 2), base 16). */
            int v = 0;
            for (size_t i = 3; i < 5 && i < len && hexval(s[i]) >= 0; i++)
                v = v * 16 + hexval(s[i]);
            t->piece[at++] = (char)v;
        }
        if (at - start > t->max_piece) t->max_piece = at - start;
    }
    t->piece_off[n] = at;
    return QI_OK;
}

/* ---- Tokenising ----------------------------------------------------------------- */

typedef struct {
    int32_t prev, next;
    uint32_t off, n; /* bytes of the escaped text; n is 0 once merged away */
    int32_t id;      /* token of those bytes, -1 if none */
} spm_sym;

typedef struct {
    float score;
    int32_t left, right; /* symbol indices */
    uint32_t size;       /* bytes of the pair when queued */
    int32_t id;          /* token of the merged text */
} spm_pair;

static bool pair_first(const spm_pair *a, const spm_pair *b) {
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}

typedef struct {
    spm_pair *h;
    size_t n;
} heap;

static void heap_push(heap *q, spm_pair p) {
    size_t i = q->n++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!pair_first(&p, &q->h[parent])) break;
        q->h[i] = q->h[parent];
        i = parent;
    }
    q->h[i] = p;
}

static spm_pair heap_pop(heap *q) {
    spm_pair top = q->h[0], last = q->h[--q->n];
    size_t i = 0, n = q->n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && pair_first(&q->h[c + 1], &q->h[c])) c++;
        if (!pair_first(&q->h[c], &last)) break;
        q->h[i] = q->h[c];
        i = c;
    }
    if (n) q->h[i] = last;
    return top;
}

static void try_pair(const qi_tokenizer *t, const char *text, const spm_sym *sym, heap *q,
                     int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    uint32_t size = sym[left].n + sym[right].n;
    int32_t id = qi_tok_vocab_find(t, text + sym[left].off, size);
    if (id >= 0) heap_push(q, (spm_pair){t->score[id], left, right, size, id});
}

qi_status qi_tok_spm_text(const qi_tokenizer *t, qi_tok_spm_work *w, const char *s, size_t len,
                          bool after_special, qi_vec *out, size_t *n_out, qi_err *err) {
    /* 1. Escape: a space prefix if asked, then every ' ' as U+2581. */
    size_t cap = MARKER_LEN * (len + 1);
    if (cap > INT32_MAX) return QI_ERR(err, QI_ERR_INVALID, "tokenize: text too long");
    if (!qi_vec_need(&w->text, cap, 1)) return OOM(err);
    char *text = w->text.p;
    size_t m = 0;
    if (t->add_space_prefix && after_special) {
        memcpy(text, MARKER, MARKER_LEN);
        m = MARKER_LEN;
    }
    for (size_t i = 0; i < len; i++) {
        if (s[i] == ' ') {
            memcpy(text + m, MARKER, MARKER_LEN);
            m += MARKER_LEN;
        } else {
            text[m++] = s[i];
        }
    }
    if (m == 0) return QI_OK;

    /* 2. Characters. At most m symbols; each merge queues at most two pairs,
     * so 3m bounds the heap. */
    if (!qi_vec_need(&w->sym, m, sizeof(spm_sym)) ||
        !qi_vec_need(&w->heap, 3 * m, sizeof(spm_pair)))
        return OOM(err);
    spm_sym *sym = w->sym.p;
    int32_t n_sym = 0;
    for (size_t off = 0; off < m;) {
        uint32_t n = (uint32_t)qi_utf8_lead_len((unsigned char)text[off]);
        if (n > m - off) n = (uint32_t)(m - off);
        sym[n_sym] = (spm_sym){n_sym - 1, off + n < m ? n_sym + 1 : -1, (uint32_t)off, n,
                               qi_tok_vocab_find(t, text + off, n)};
        n_sym++;
        off += n;
    }

    /* 3. Merge the best-scoring pairs while there are any. */
    heap q = {w->heap.p, 0};
    for (int32_t i = 1; i < n_sym; i++) try_pair(t, text, sym, &q, i - 1, i);
    while (q.n) {
        spm_pair p = heap_pop(&q);
        spm_sym *l = &sym[p.left], *r = &sym[p.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != p.size) continue;
        l->n += r->n;
        l->id = p.id;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) sym[r->next].prev = p.left;
        try_pair(t, text, sym, &q, l->prev, p.left);
        try_pair(t, text, sym, &q, p.left, l->next);
    }

    /* 4. Tokens, or byte tokens for symbols that are none. */
    for (int32_t i = 0; i >= 0; i = sym[i].next) {
        const spm_sym *y = &sym[i];
        uint32_t k = y->id >= 0 ? 1 : y->n;
        if (!qi_vec_need(out, *n_out + k, sizeof(int32_t))) return OOM(err);
        int32_t *o = out->p;
        if (y->id >= 0) {
            o[(*n_out)++] = y->id;
            continue;
        }
        for (uint32_t j = 0; j < y->n; j++) {
            unsigned char b = (unsigned char)text[y->off + j];
            if (t->byte_fallback[b] < 0)
                return QI_ERR(err, QI_ERR_UNSUPPORTED,
                              "tokenize: byte 0x%02X is not in the vocabulary and has no <0x%02X> "
                              "token", b, b);
            o[(*n_out)++] = t->byte_fallback[b];
        }
    }
    return QI_OK;
}

void qi_tok_spm_work_fini(qi_tok_spm_work *w) {
    if (!w) return;
    qi_free(w->text.p);
    qi_free(w->sym.p);
    qi_free(w->heap.p);
    memset(w, 0, sizeof *w);
}

/* ---- Detokenising a whole sequence ------------------------------------------------ */

size_t qi_tok_spm_detokenize(const qi_tokenizer *t, const int32_t *ids, size_t n,
                             bool remove_special, bool unparse_special, char *out, size_t cap) {
    if (!t || (!ids && n)) return 0;
    if (!out) cap = 0;
    bool strip = t->add_space_prefix;
    if (remove_special && t->add_bos && n > 0 && ids[0] == t->bos) {
        strip = false;
        ids++;
        n--;
    }
    if (remove_special && t->add_eos && n > 0 && ids[n - 1] == t->eos) n--;
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        bool first = strip;
        strip = false;
        if (id < 0 || id >= t->n_vocab) continue;
        if (!unparse_special && (t->attr[id] & (QI_TOK_UNKNOWN | QI_TOK_CONTROL))) continue;
        const char *p = t->piece + t->piece_off[id];
        size_t k = t->piece_off[id + 1] - t->piece_off[id];
        if (first && k > 0 && p[0] == ' ') {
            p++;
            k--;
        }
        for (size_t j = 0; j < k; j++, total++)
            if (total < cap) out[total] = p[j];
    }
    return total;
}

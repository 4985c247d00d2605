/* tokenize.c - text -> token ids, as llama.cpp's BPE tokenizer produces them.
 *
 * qi_tokenize follows llama_vocab::impl::tokenize for BPE vocabularies:
 *  1. Special tokens: the text is cut at every occurrence of a special token's
 *     text, longest tokens first (control and unknown tokens only when
 *     parse_special, user-defined ones always; llama.cpp's
 *     tokenizer_st_partition, strip flags included). The raw pieces in between
 *     go on; special tokens are emitted as they are.
 *  2. Pre-tokenisation of each raw piece into words (pretok.c). Invalid UTF-8
 *     bytes have become U+FFFD there, as in llama.cpp, so such input does not
 *     round-trip.
 *  3. BPE per word, on the word's UTF-8 bytes: each byte starts as the token of
 *     its GPT-2 byte-level character; adjacent pairs merge lowest rank first,
 *     leftmost pair first on ties, through a binary heap of candidate pairs
 *     that are skipped when popped if either side has changed since they were
 *     queued (llama.cpp's work queue, same order). Merges are looked up by the
 *     two token ids, which the loader makes equivalent to llama.cpp's lookup by
 *     text. A final symbol that is no token becomes the tokens of the single
 *     bytes of its byte-level text, where such tokens exist (normally none:
 *     llama.cpp's fallback, kept for odd vocabularies).
 *
 * BPE on UTF-8 (tokenizer.ggml.model "gemma4", QI_PRETOK_RAW_BYTES and
 * QI_PRETOK_ESCAPE_SPACES): spaces become U+2581 before step 2; symbols
 * start as characters (length from the lead byte), not bytes; a word of
 * line feeds only that is a token is taken whole; and a final symbol that is
 * no token becomes the "<0xXX>" tokens of its bytes (none for a byte
 * without one, as in llama.cpp). SentencePiece and WordPiece fragments go to
 * tokenizer_spm.c and tokenizer_wpm.c after step 1.
 *
 * All scratch memory lives in one per-call `work` and grows as needed, so a
 * tokenizer is never written to and may be shared between threads.
 */
#include "tokenizer_int.h"

#include <string.h>

#include "unicode_int.h"

typedef struct {
    int32_t id; /* token of the symbol's bytes, -1 if they are no token */
    int32_t prev, next;
    uint32_t start, len; /* bytes of the word; len 0 once merged away */
} bpe_sym;

typedef struct {
    int32_t rank, left, right; /* symbol indices */
    int32_t lid, rid, result;  /* ids when queued: the pair is stale once they change */
} bpe_pair;

typedef struct {
    const qi_tokenizer *t;
    qi_pretok_work pre;
    qi_vec word; /* unsigned char: one word's UTF-8 */
    qi_vec enc;  /* char: its byte-level text (ignore-merges lookups only) */
    qi_vec esc;  /* unsigned char: a fragment with its spaces escaped (QI_PRETOK_ESCAPE_SPACES) */
    qi_vec sym;  /* bpe_sym */
    qi_vec heap; /* bpe_pair */
    size_t n_heap;
    qi_vec out; /* int32_t */
    size_t n_out;
} work;

static bool emit(work *w, int32_t id) {
    if (!qi_vec_need(&w->out, w->n_out + 1, sizeof(int32_t))) return false;
    ((int32_t *)w->out.p)[w->n_out++] = id;
    return true;
}

static bool pair_less(const bpe_pair *a, const bpe_pair *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->left < b->left);
}

static void heap_push(work *w, bpe_pair p) {
    bpe_pair *h = w->heap.p;
    size_t i = w->n_heap++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!pair_less(&p, &h[parent])) break;
        h[i] = h[parent];
        i = parent;
    }
    h[i] = p;
}

static bpe_pair heap_pop(work *w) {
    bpe_pair *h = w->heap.p;
    bpe_pair top = h[0], last = h[--w->n_heap];
    size_t i = 0, n = w->n_heap;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && pair_less(&h[c + 1], &h[c])) c++;
        if (!pair_less(&h[c], &last)) break;
        h[i] = h[c];
        i = c;
    }
    if (n) h[i] = last;
    return top;
}

static void try_pair(work *w, int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const bpe_sym *sym = w->sym.p;
    int32_t a = sym[left].id, b = sym[right].id;
    if (a < 0 || b < 0) return;
    const qi_tok_merge *m = qi_tok_merge_find(w->t, a, b);
    if (m) heap_push(w, (bpe_pair){m->rank, left, right, a, b, m->result});
}

#define OOM(err) QI_ERR(err, QI_ERR_NOMEM, "tokenize: out of memory")

/* BPE over the n (>= 1) bytes of w->word; appends the ids. */
static qi_status bpe_word(work *w, size_t n, qi_err *err) {
    const qi_tokenizer *t = w->t;
    const unsigned char *word = w->word.p;

    const bool raw = (t->pre.flags & QI_PRETOK_RAW_BYTES) != 0;
    if (t->pre.flags & QI_PRETOK_NEWLINE_RUNS) {
        /* Gemma 4: a run of line feeds that is a token is that token. */
        size_t k = 0;
        while (k < n && word[k] == '\n') k++;
        int32_t id = k == n ? qi_tok_vocab_find(t, (const char *)word, n) : -1;
        if (id >= 0) return emit(w, id) ? QI_OK : OOM(err);
    }
    if (t->pre.flags & QI_PRETOK_IGNORE_MERGES) {
        /* A word that is a token as a whole is that token. */
        if (!qi_vec_need(&w->enc, 2 * n, 1)) return OOM(err);
        char *enc = w->enc.p;
        size_t m = 0;
        for (size_t i = 0; i < n; i++) {
            memcpy(enc + m, t->byte_enc[word[i]], t->byte_enc_len[word[i]]);
            m += t->byte_enc_len[word[i]];
        }
        int32_t id = qi_tok_vocab_find(t, enc, m);
        if (id >= 0) return emit(w, id) ? QI_OK : OOM(err);
    }

    /* Each merge queues at most two pairs, so 3n bounds the heap. */
    if (!qi_vec_need(&w->sym, n, sizeof(bpe_sym)) ||
        !qi_vec_need(&w->heap, 3 * n, sizeof(bpe_pair)))
        return OOM(err);
    bpe_sym *sym = w->sym.p;
    size_t ns = 0;
    if (raw) {
        /* Symbols are characters, their length from the lead byte alone
         * (llama.cpp's unicode_len_utf8; cut short at the end of the word). */
        for (size_t i = 0; i < n; ns++) {
            size_t k = qi_utf8_lead_len(word[i]);
            if (k > n - i) k = n - i;
            sym[ns] = (bpe_sym){qi_tok_vocab_find(t, (const char *)word + i, k), (int32_t)ns - 1,
                                -1, (uint32_t)i, (uint32_t)k};
            i += k;
        }
    } else {
        for (; ns < n; ns++) /* each byte as its byte-level character */
            sym[ns] = (bpe_sym){t->byte_tok[word[ns]], (int32_t)ns - 1, -1, (uint32_t)ns, 1};
    }
    for (size_t i = 0; i + 1 < ns; i++) sym[i].next = (int32_t)i + 1;
    w->n_heap = 0;
    for (size_t i = 1; i < ns; i++) try_pair(w, (int32_t)i - 1, (int32_t)i);
    while (w->n_heap) {
        bpe_pair p = heap_pop(w);
        bpe_sym *l = &sym[p.left], *r = &sym[p.right];
        if (l->len == 0 || r->len == 0 || l->id != p.lid || r->id != p.rid) continue;
        l->len += r->len;
        l->id = p.result;
        r->len = 0;
        l->next = r->next;
        if (r->next >= 0) sym[r->next].prev = p.left;
        try_pair(w, l->prev, p.left);
        try_pair(w, p.left, l->next);
    }

    for (int32_t i = 0; i >= 0; i = sym[i].next) {
        const bpe_sym *s = &sym[i];
        if (s->id >= 0) {
            if (!emit(w, s->id)) return OOM(err);
            continue;
        }
        for (uint32_t k = s->start; k < s->start + s->len; k++) {
            unsigned char b = word[k];
            if (raw) { /* its "<0xXX>" token; a byte without one is dropped, as in llama.cpp */
                if (t->byte_fallback[b] >= 0 && !emit(w, t->byte_fallback[b])) return OOM(err);
                continue;
            }
            for (int j = 0; j < t->byte_enc_len[b]; j++) {
                int32_t id = t->single_tok[t->byte_enc[b][j]];
                if (id >= 0 && !emit(w, id)) return OOM(err);
            }
        }
    }
    return QI_OK;
}

/* Tokenise len (>= 1) bytes of raw text (no special tokens in it). */
static qi_status tokenize_text(work *w, const unsigned char *s, size_t len, qi_err *err) {
    size_t nw = 0;
    if (w->t->pre.flags & QI_PRETOK_ESCAPE_SPACES) {
        /* Spaces become U+2581 first (SentencePiece-style BPE). */
        size_t m = 0;
        if (!qi_vec_need(&w->esc, 3 * len, 1)) return OOM(err);
        unsigned char *e = w->esc.p;
        for (size_t i = 0; i < len; i++) {
            if (s[i] == ' ') memcpy(e + m, "\xE2\x96\x81", 3), m += 3;
            else e[m++] = s[i];
        }
        s = e;
        len = m;
    }
    qi_status st = qi_pretok_split(&w->t->pre, &w->pre, s, len, &nw, err);
    if (st) return st;
    /* Each word's UTF-8 as decoded (U+FFFD for invalid bytes, overlong forms
     * shortened: llama.cpp re-encodes too), then BPE. */
    const uint32_t *cps = w->pre.cp.p;
    size_t a = 0;
    for (size_t k = 0; k < nw; k++) {
        size_t b = ((const size_t *)w->pre.bound.p)[k], m = 0;
        if (!qi_vec_need(&w->word, 4 * (b - a), 1)) return OOM(err);
        unsigned char *word = w->word.p;
        for (size_t i = a; i < b; i++) m += qi_utf8_encode(cps[i], word + m);
        if ((st = bpe_word(w, m, err))) return st;
        a = b;
    }
    return QI_OK;
}

/* A piece of the input: raw text (tok < 0) or a special token. */
typedef struct {
    int32_t tok;
    size_t off, len;
} fragment;

static bool is_ascii_space(char c) {
    return c == ' ' || (c >= '\t' && c <= '\r');
}

/* Cut text[0..len) at special tokens' texts, longest tokens first; the
 * fragments end up in *frags (count *n_frags). */
static qi_status partition(const qi_tokenizer *t, const char *text, size_t len,
                           bool parse_special, qi_vec *frags, size_t *n_frags, qi_err *err) {
    qi_vec next = {0};
    size_t n = 1;
    if (!qi_vec_need(frags, 1, sizeof(fragment))) return OOM(err);
    ((fragment *)frags->p)[0] = (fragment){-1, 0, len};
    for (int32_t k = 0; k < t->n_special; k++) {
        int32_t id = t->special[k];
        uint16_t attr = t->attr[id];
        if (!parse_special && (attr & (QI_TOK_CONTROL | QI_TOK_UNKNOWN))) continue;
        size_t tl;
        const char *tt = qi_tok_text(t, id, &tl);
        size_t m = 0;
        for (size_t f = 0; f < n; f++) {
            fragment fr = ((const fragment *)frags->p)[f];
            if (!qi_vec_need(&next, m + 1, sizeof(fragment))) goto oom;
            if (fr.tok >= 0) {
                ((fragment *)next.p)[m++] = fr;
                continue;
            }
            size_t base = fr.off, blen = fr.len, at;
            while (qi_tok_find_bytes(text + base, blen, tt, tl, &at)) {
                if (!qi_vec_need(&next, m + 3, sizeof(fragment))) goto oom;
                fragment *nx = next.p;
                size_t llen = at;
                if (attr & QI_TOK_LSTRIP)
                    while (llen > 0 && is_ascii_space(text[base + llen - 1])) llen--;
                if (llen > 0) nx[m++] = (fragment){-1, base, llen};
                nx[m++] = (fragment){id, 0, 0};
                size_t roff = base + at + tl, rlen = blen - at - tl;
                if (attr & QI_TOK_RSTRIP)
                    while (rlen > 0 && is_ascii_space(text[roff])) roff++, rlen--;
                base = roff;
                blen = rlen;
            }
            if (blen > 0) ((fragment *)next.p)[m++] = (fragment){-1, base, blen};
        }
        qi_vec tmp = *frags;
        *frags = next;
        next = tmp;
        n = m;
    }
    qi_free(next.p);
    *n_frags = n;
    return QI_OK;
oom:
    qi_free(next.p);
    return OOM(err);
}

qi_status qi_tokenize(const qi_tokenizer *t, const char *text, size_t len, bool add_special,
                      bool parse_special, int32_t **ids, size_t *n_ids, qi_err *err) {
    if (ids) *ids = NULL;
    if (n_ids) *n_ids = 0;
    if (!t || !ids || !n_ids || (!text && len))
        return QI_ERR(err, QI_ERR_INVALID, "qi_tokenize: NULL argument");
    if (add_special && t->add_bos && t->bos < 0)
        return QI_ERR(err, QI_ERR_INVALID, "qi_tokenize: the model asks for BOS but has none");
    if (add_special && t->add_eos && t->eos < 0)
        return QI_ERR(err, QI_ERR_INVALID, "qi_tokenize: the model asks for EOS but has none");
    if (add_special && t->wpm && t->sep < 0)
        return QI_ERR(err, QI_ERR_INVALID,
                      "qi_tokenize: a WordPiece vocabulary without a separator token");

    work w = {.t = t};
    qi_tok_spm_work spm = {0};
    qi_tok_wpm_work wpm = {0};
    qi_vec frags = {0};
    size_t n_frags = 0;
    qi_status st = QI_OK;
    if (!qi_vec_need(&w.out, 16, sizeof(int32_t))) {
        st = OOM(err);
        goto done;
    }
    if (add_special && t->add_bos) emit(&w, t->bos); /* room reserved above */
    if (len) st = partition(t, text, len, parse_special, &frags, &n_frags, err);
    for (size_t f = 0; f < n_frags && !st; f++) {
        const fragment *fr = &((const fragment *)frags.p)[f];
        if (fr->tok >= 0) st = emit(&w, fr->tok) ? QI_OK : OOM(err);
        else if (t->spm) /* SentencePiece: tokenizer_spm.c */
            st = qi_tok_spm_text(t, &spm, text + fr->off, fr->len,
                                 f == 0 || ((const fragment *)frags.p)[f - 1].tok >= 0, &w.out,
                                 &w.n_out, err);
        else if (t->wpm) /* WordPiece: tokenizer_wpm.c */
            st = qi_tok_wpm_text(t, &wpm, text + fr->off, fr->len, &w.out, &w.n_out, err);
        else st = tokenize_text(&w, (const unsigned char *)text + fr->off, fr->len, err);
    }
    if (!st && add_special && t->add_eos && !emit(&w, t->eos)) st = OOM(err);
    if (!st && add_special && t->wpm && !emit(&w, t->sep)) st = OOM(err);
done:
    qi_free(frags.p);
    if (!st) {
        *ids = w.out.p;
        *n_ids = w.n_out;
        w.out.p = NULL;
    }
    qi_free(w.out.p);
    qi_free(w.word.p);
    qi_free(w.enc.p);
    qi_free(w.esc.p);
    qi_free(w.sym.p);
    qi_free(w.heap.p);
    qi_pretok_work_fini(&w.pre);
    qi_tok_spm_work_fini(&spm);
    qi_tok_wpm_work_fini(&wpm);
    return st;
}

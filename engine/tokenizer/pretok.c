/* pretok.c - regex pre-tokenisation: text -> words, as llama.cpp splits it.
 *
 * llama.cpp maps each tokenizer.ggml.pre name to a list of regexes applied in
 * sequence: each splits every word the previous one produced into its matches
 * and the gaps between them (gaps are words too). We keep that scheme and
 * match with PCRE2 (UTF + UCP, JIT when available), but not on the text
 * itself: on a "collapsed" copy in which every non-ASCII code point is
 * replaced by a fixed stand-in of its class (letter U+A500, number U+00B2,
 * punctuation U+00A1, mark U+0300, symbol U+00A6, other U+E000, white space
 * U+000B), the class coming from our Unicode 15.1 table (unicode.c). ASCII
 * stays as it is. Code point i of the copy is code point i of the text, so
 * match offsets map straight back.
 *
 * Why collapse: llama.cpp classifies with Unicode 15.1 data, both in its
 * hand-written matchers (GPT-2, Llama 3 and Qwen2 regexes) and in the
 * collapsed text it feeds std::regex for the others. The system PCRE2 has its
 * own Unicode version (10.42: 14.0, which lacks ~5000 letters and numbers
 * and calls U+180E a space), so letting it classify would split differently on
 * such characters; the stand-ins are classified alike by every Unicode
 * version. It also means PCRE2 only ever sees valid UTF-8 without surrogates
 * (which the lax, llama.cpp-compatible decoding can produce from ED A0 80),
 * so PCRE2_MATCH_INVALID_UTF is not needed: invalid bytes were already turned
 * into U+FFFD by the decoder, exactly as llama.cpp does.
 *
 * Regexes that name no Unicode class (DeepSeek's explicit code point ranges,
 * "[0-9][0-9][0-9]", "[\r\n]", ...) are matched, as llama.cpp matches them
 * with std::wregex, on the code points themselves instead, white space
 * beyond ASCII turned into U+000B, and with ASCII-only \s (no PCRE2_UCP).
 * Every regex is compiled with PCRE2_DOLLAR_ENDONLY: ECMAScript's $ does not
 * match before a final line feed. The name -> regex table is pretok_table.c.
 *
 * Verified against llama.cpp's own splitter (unicode_regex_split) on ~30k
 * generated strings for every regex list here: identical words. Note that
 * llama.cpp's hand-written GPT-2 matcher also ends with "|\s+", which its
 * regex string lacks; a lone white-space character that nothing matches
 * becomes a gap word, the same thing.
 *
 * Considered: a hand-written matcher per regex (llama.cpp's choice, faster
 * for those few regexes, but each a new place for behaviour to drift); PCRE2
 * on the raw text with PCRE2_MATCH_INVALID_UTF (classes from the system
 * PCRE2's Unicode version, and invalid bytes split differently).
 */
#include "pretok_int.h"

#include <stdio.h>
#include <string.h>

#include "unicode_int.h"

bool qi_vec_need(qi_vec *v, size_t n, size_t elem) {
    if (n <= v->cap) return true;
    size_t c = v->cap ? v->cap : 64;
    while (c < n) c *= 2;
    void *np = qi_realloc(v->p, c * elem);
    if (!np) return false;
    v->p = np;
    v->cap = c;
    return true;
}

/* UTF-8 of the stand-in for each qi_uc_class in the collapsed text. */
static const char *const collapse_rep[] = {
    [QI_UC_OTHER] = "\xEE\x80\x80",  /* U+E000, private use */
    [QI_UC_LETTER] = "\xEA\x94\x80", /* U+A500, Vai syllable ee (Lo) */
    [QI_UC_NUMBER] = "\xC2\xB2",     /* U+00B2, superscript two (No, so not \d) */
    [QI_UC_PUNCT] = "\xC2\xA1",      /* U+00A1, inverted exclamation mark */
    [QI_UC_MARK] = "\xCC\x80",       /* U+0300, combining grave accent */
    [QI_UC_SYMBOL] = "\xC2\xA6",     /* U+00A6, broken bar */
    [QI_UC_SPACE] = "\x0B",          /* what llama.cpp substitutes too */
};

static void *re_malloc(PCRE2_SIZE n, void *u) {
    (void)u;
    return qi_malloc(n);
}

static void re_free(void *p, void *u) {
    (void)u;
    qi_free(p);
}

qi_status qi_pretok_init(qi_pretok *p, const char *name, size_t len, qi_err *err) {
    memset(p, 0, sizeof *p);
    if (len == 0) name = "default", len = 7;
    const char *const *regex;
    if (!qi_pretok_lookup(name, len, &regex, &p->flags))
        return QI_ERR(err, QI_ERR_UNSUPPORTED,
                      "tokenizer.ggml.pre '%.*s': pre-tokenizer not supported (supported: the "
                      "names of engine/tokenizer/pretok_table.c)",
                      (int)(len > 64 ? 64 : len), name);
    snprintf(p->name, sizeof p->name, "%.*s", (int)(len > 63 ? 63 : len), name);

    p->gctx = pcre2_general_context_create(re_malloc, re_free, NULL);
    if (!p->gctx) return QI_ERR(err, QI_ERR_NOMEM, "pre-tokenizer: out of memory");
    pcre2_compile_context *cc = pcre2_compile_context_create(p->gctx);
    if (!cc) return QI_ERR(err, QI_ERR_NOMEM, "pre-tokenizer: out of memory");
    qi_status st = QI_OK;
    for (int i = 0; i < QI_PRETOK_MAX_REGEX && regex[i]; i++) {
        /* A regex that names no Unicode class matches the text itself, and
         * its \s, like std::regex's, is ASCII white space (no PCRE2_UCP);
         * $ is the end of the word only, as in ECMAScript. */
        const bool raw = strstr(regex[i], "\\p{") == NULL;
        int code;
        PCRE2_SIZE off;
        p->re[i] = pcre2_compile((PCRE2_SPTR)regex[i], PCRE2_ZERO_TERMINATED,
                                 PCRE2_UTF | PCRE2_DOLLAR_ENDONLY | (raw ? 0 : PCRE2_UCP), &code,
                                 &off, cc);
        if (!p->re[i]) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(code, msg, sizeof msg);
            st = code == PCRE2_ERROR_HEAP_FAILED
                     ? QI_ERR(err, QI_ERR_NOMEM, "pre-tokenizer: out of memory")
                     : QI_ERR(err, QI_ERR_UNSUPPORTED,
                              "pre-tokenizer '%s' regex %d: PCRE2 error at offset %zu: %s",
                              p->name, i, (size_t)off, (const char *)msg);
            break;
        }
        p->raw[i] = raw;
        p->n_re = i + 1;
        (void)pcre2_jit_compile(p->re[i], PCRE2_JIT_COMPLETE); /* else interpreted */
    }
    pcre2_compile_context_free(cc);
    return st;
}

void qi_pretok_fini(qi_pretok *p) {
    if (!p) return;
    for (int i = 0; i < p->n_re; i++) pcre2_code_free(p->re[i]);
    pcre2_general_context_free(p->gctx);
    memset(p, 0, sizeof *p);
}

void qi_pretok_work_fini(qi_pretok_work *w) {
    if (!w) return;
    qi_free(w->cp.p);
    qi_free(w->coff.p);
    qi_free(w->coll.p);
    qi_free(w->roff.p);
    qi_free(w->raw.p);
    qi_free(w->bound.p);
    qi_free(w->bound2.p);
    pcre2_match_data_free(w->md);
    memset(w, 0, sizeof *w);
}

/* Split code points [a, b) by re into matches and the gaps between them,
 * matching on text (the collapsed or the raw copy) whose code point i starts
 * at byte coff[i]; appends the word ends to bound2 (count *nb). */
static qi_status split_segment(qi_pretok_work *w, const pcre2_code *re, const unsigned char *text,
                               const size_t *coff, size_t a, size_t b, size_t *nb, qi_err *err) {
    PCRE2_SPTR subj = text + coff[a];
    size_t len = coff[b] - coff[a], pos = 0, last = a, cur = a;
    uint32_t opts = PCRE2_NO_UTF_CHECK; /* the collapsed text is valid UTF-8 by construction */
    while (pos < len) {
        int rc = pcre2_match(re, subj, len, pos, opts, w->md, NULL);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT && !(opts & PCRE2_NO_JIT)) {
            opts |= PCRE2_NO_JIT; /* the interpreter keeps its frames on the heap */
            continue;
        }
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            if (rc == PCRE2_ERROR_NOMEMORY || rc == PCRE2_ERROR_HEAPLIMIT)
                return QI_ERR(err, QI_ERR_NOMEM, "pre-tokenizer: out of memory");
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return QI_ERR(err, QI_ERR_INVALID, "pre-tokenizer: PCRE2 match failed: %s",
                          (const char *)msg);
        }
        const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(w->md);
        size_t ms = ov[0], me = ov[1];
        if (me <= ms) { /* an empty match (none of our regexes has one): step on */
            pos = ms + 1;
            while (pos < len && (subj[pos] & 0xC0) == 0x80) pos++;
            continue;
        }
        /* Byte offsets to code point indices; matches come left to right. */
        while (coff[cur] - coff[a] < ms) cur++;
        size_t cs = cur;
        while (coff[cur] - coff[a] < me) cur++;
        if (!qi_vec_need(&w->bound2, *nb + 2, sizeof(size_t)))
            return QI_ERR(err, QI_ERR_NOMEM, "pre-tokenizer: out of memory");
        size_t *bd = w->bound2.p;
        if (cs > last) bd[(*nb)++] = cs;
        bd[(*nb)++] = cur;
        last = cur;
        pos = me;
    }
    if (last < b) {
        if (!qi_vec_need(&w->bound2, *nb + 1, sizeof(size_t)))
            return QI_ERR(err, QI_ERR_NOMEM, "pre-tokenizer: out of memory");
        ((size_t *)w->bound2.p)[(*nb)++] = b;
    }
    return QI_OK;
}

/* The copy the class-free regexes match on: the code points as decoded,
 * except that white space beyond ASCII becomes U+000B (as llama.cpp does
 * before std::wregex, whose \s knows only ASCII) and surrogates, which
 * PCRE2 cannot take, U+FFFF (in none of the tables' ranges either way). */
static qi_status raw_copy(const qi_pretok *p, qi_pretok_work *w, size_t n, qi_err *err) {
    bool need = false;
    for (int r = 0; r < p->n_re; r++) need |= p->raw[r];
    if (!need) return QI_OK;
    if (!qi_vec_need(&w->roff, n + 1, sizeof(size_t)) || !qi_vec_need(&w->raw, 4 * n + 1, 1))
        return QI_ERR(err, QI_ERR_NOMEM, "pre-tokenizer: out of memory");
    const uint32_t *cps = w->cp.p;
    size_t *roff = w->roff.p, nr = 0;
    unsigned char *raw = w->raw.p;
    for (size_t i = 0; i < n; i++) {
        uint32_t cp = cps[i];
        if (cp >= 0x80 && qi_uc_class_of(cp) == QI_UC_SPACE) cp = 0x0B;
        else if (cp >= 0xD800 && cp <= 0xDFFF) cp = 0xFFFF;
        roff[i] = nr;
        nr += qi_utf8_encode(cp, raw + nr);
    }
    roff[n] = nr;
    return QI_OK;
}

qi_status qi_pretok_split(const qi_pretok *p, qi_pretok_work *w, const unsigned char *s,
                          size_t len, size_t *n_words, qi_err *err) {
    qi_status st;
    *n_words = 0;
    if (!w->md && !(w->md = pcre2_match_data_create(1, p->gctx)))
        return QI_ERR(err, QI_ERR_NOMEM, "pre-tokenizer: out of memory");
    /* Code points and the collapsed copy (at most 3 bytes per code point). */
    if (!qi_vec_need(&w->cp, len, sizeof(uint32_t)) ||
        !qi_vec_need(&w->coff, len + 1, sizeof(size_t)) || !qi_vec_need(&w->coll, 3 * len, 1) ||
        !qi_vec_need(&w->bound, 1, sizeof(size_t)))
        return QI_ERR(err, QI_ERR_NOMEM, "pre-tokenizer: out of memory");
    uint32_t *cps = w->cp.p;
    size_t *coff = w->coff.p;
    unsigned char *coll = w->coll.p;
    size_t n = 0, nc = 0;
    for (size_t i = 0; i < len;) {
        size_t used;
        uint32_t cp = qi_utf8_decode_lax(s + i, len - i, &used);
        i += used;
        cps[n] = cp;
        coff[n++] = nc;
        if (cp < 0x80) {
            coll[nc++] = (unsigned char)cp;
        } else {
            const char *rep = collapse_rep[qi_uc_class_of(cp)];
            size_t k = strlen(rep);
            memcpy(coll + nc, rep, k);
            nc += k;
        }
    }
    coff[n] = nc;
    if ((st = raw_copy(p, w, n, err))) return st;

    /* The regexes in sequence, each splitting the words of the one before. */
    size_t nw = 1;
    ((size_t *)w->bound.p)[0] = n;
    for (int r = 0; r < p->n_re; r++) {
        size_t nb = 0, a = 0;
        for (size_t k = 0; k < nw; k++) {
            size_t b = ((const size_t *)w->bound.p)[k];
            st = p->raw[r] ? split_segment(w, p->re[r], w->raw.p, w->roff.p, a, b, &nb, err)
                                     : split_segment(w, p->re[r], w->coll.p, w->coff.p, a, b, &nb, err);
            if (st) return st;
            a = b;
        }
        qi_vec tmp = w->bound;
        w->bound = w->bound2;
        w->bound2 = tmp;
        nw = nb;
    }
    *n_words = nw;
    return QI_OK;
}

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

/* ---- Names and regexes (llama-vocab.cpp's tables) -------------------------- */

#define RE_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
#define RE_CONTRACTIONS "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"

enum { SET_DIGITS_GPT2, SET_GPT2, SET_DEFAULT, SET_LLAMA3, SET_QWEN2 };

static const char *const set_regex[][QI_PRETOK_MAX_REGEX] = {
    [SET_DIGITS_GPT2] = {"\\p{N}", RE_GPT2},
    [SET_GPT2] = {RE_GPT2},
    [SET_DEFAULT] = {"[\\p{P}\\$\\+<=>\\^~\\|]+", RE_GPT2, "\\p{N}+", "[0-9][0-9][0-9]"},
    [SET_LLAMA3] = {RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
                                    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
    [SET_QWEN2] = {RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
                                   "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
};

static const struct {
    const char *name;
    int set;
    unsigned flags;
} pre_names[] = {
    {"default", SET_DEFAULT, 0},
    {"smollm", SET_DIGITS_GPT2, 0},
    {"starcoder", SET_DIGITS_GPT2, 0},
    {"refact", SET_DIGITS_GPT2, 0},
    {"command-r", SET_DIGITS_GPT2, 0},
    {"codeshell", SET_DIGITS_GPT2, 0},
    {"exaone", SET_DIGITS_GPT2, 0},
    {"minerva-7b", SET_DIGITS_GPT2, 0},
    {"mellum2", SET_DIGITS_GPT2, 0},
    {"gpt-2", SET_GPT2, 0},
    {"phi-2", SET_GPT2, 0},
    {"jina-es", SET_GPT2, 0},
    {"jina-de", SET_GPT2, 0},
    {"gigachat", SET_GPT2, 0},
    {"jina-v2-es", SET_GPT2, 0},
    {"jina-v2-de", SET_GPT2, 0},
    {"a.x-4.0", SET_GPT2, 0},
    {"mellum", SET_GPT2, 0},
    {"modern-bert", SET_GPT2, 0},
    {"jina-v1-en", SET_GPT2, 0},
    {"jina-v2-code", SET_GPT2, 0},
    {"roberta-bpe", SET_GPT2, 0},
    {"mpt", SET_GPT2, 0},
    {"olmo", SET_GPT2, 0},
    {"jais", SET_GPT2, 0},
    {"exaone4", SET_GPT2, 0},
    {"trillion", SET_GPT2, 0},
    {"granite-docling", SET_GPT2, 0},
    {"llama3", SET_LLAMA3, QI_PRETOK_IGNORE_MERGES | QI_PRETOK_ADD_BOS},
    {"llama-v3", SET_LLAMA3, QI_PRETOK_IGNORE_MERGES | QI_PRETOK_ADD_BOS},
    {"llama-bpe", SET_LLAMA3, QI_PRETOK_IGNORE_MERGES | QI_PRETOK_ADD_BOS},
    {"falcon3", SET_LLAMA3, QI_PRETOK_IGNORE_MERGES | QI_PRETOK_ADD_BOS},
    {"falcon-h1", SET_LLAMA3, QI_PRETOK_IGNORE_MERGES | QI_PRETOK_ADD_BOS},
    {"pixtral", SET_LLAMA3, QI_PRETOK_IGNORE_MERGES | QI_PRETOK_ADD_BOS},
    {"midm-2.0", SET_LLAMA3, QI_PRETOK_IGNORE_MERGES | QI_PRETOK_ADD_BOS},
    {"lfm2", SET_LLAMA3, QI_PRETOK_IGNORE_MERGES | QI_PRETOK_ADD_BOS},
    {"jina-v5-nano", SET_LLAMA3, QI_PRETOK_IGNORE_MERGES | QI_PRETOK_ADD_BOS},
    {"dbrx", SET_LLAMA3, 0},
    {"smaug-bpe", SET_LLAMA3, 0},
    {"chatglm-bpe", SET_LLAMA3, QI_PRETOK_NO_BOS},
    {"glm4", SET_LLAMA3, QI_PRETOK_NO_BOS | QI_PRETOK_IGNORE_MERGES},
    {"glm5", SET_LLAMA3, QI_PRETOK_NO_BOS | QI_PRETOK_IGNORE_MERGES},
    {"qwen2", SET_QWEN2, 0},
    {"deepseek-r1-qwen", SET_QWEN2, 0},
    {"kormo", SET_QWEN2, 0},
    {"f2llmv2", SET_QWEN2, 0},
    {"megrez", SET_QWEN2, 0},
    {"stablelm2", SET_QWEN2, 0},
    {"hunyuan", SET_QWEN2, 0},
    {"solar-open", SET_QWEN2, 0},
    {"grok-2", SET_QWEN2, 0},
};

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
    int set = -1;
    for (size_t i = 0; i < sizeof pre_names / sizeof pre_names[0]; i++)
        if (strlen(pre_names[i].name) == len && memcmp(pre_names[i].name, name, len) == 0) {
            set = pre_names[i].set;
            p->flags = pre_names[i].flags;
            break;
        }
    if (set < 0)
        return QI_ERR(err, QI_ERR_UNSUPPORTED,
                      "tokenizer.ggml.pre '%.*s': pre-tokenizer not supported (supported: "
                      "smollm, gpt-2, llama3, qwen2, default and the names sharing their regexes)",
                      (int)(len > 64 ? 64 : len), name);
    snprintf(p->name, sizeof p->name, "%.*s", (int)(len > 63 ? 63 : len), name);

    p->gctx = pcre2_general_context_create(re_malloc, re_free, NULL);
    if (!p->gctx) return QI_ERR(err, QI_ERR_NOMEM, "pre-tokenizer: out of memory");
    pcre2_compile_context *cc = pcre2_compile_context_create(p->gctx);
    if (!cc) return QI_ERR(err, QI_ERR_NOMEM, "pre-tokenizer: out of memory");
    qi_status st = QI_OK;
    for (int i = 0; i < QI_PRETOK_MAX_REGEX && set_regex[set][i]; i++) {
        int code;
        PCRE2_SIZE off;
        p->re[i] = pcre2_compile((PCRE2_SPTR)set_regex[set][i], PCRE2_ZERO_TERMINATED,
                                 PCRE2_UTF | PCRE2_UCP, &code, &off, cc);
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
    qi_free(w->bound.p);
    qi_free(w->bound2.p);
    pcre2_match_data_free(w->md);
    memset(w, 0, sizeof *w);
}

/* Split code points [a, b) by re into matches and the gaps between them;
 * appends the word ends to bound2 (count *nb). */
static qi_status split_segment(qi_pretok_work *w, const pcre2_code *re, size_t a, size_t b,
                               size_t *nb, qi_err *err) {
    const size_t *coff = w->coff.p;
    PCRE2_SPTR subj = (const unsigned char *)w->coll.p + coff[a];
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

qi_status qi_pretok_split(const qi_pretok *p, qi_pretok_work *w, const unsigned char *s,
                          size_t len, size_t *n_words, qi_err *err) {
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

    /* The regexes in sequence, each splitting the words of the one before. */
    size_t nw = 1;
    ((size_t *)w->bound.p)[0] = n;
    for (int r = 0; r < p->n_re; r++) {
        size_t nb = 0, a = 0;
        for (size_t k = 0; k < nw; k++) {
            size_t b = ((const size_t *)w->bound.p)[k];
            qi_status st = split_segment(w, p->re[r], a, b, &nb, err);
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

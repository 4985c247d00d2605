/* tokenizer_special.c - the special tokens of a vocabulary, as llama.cpp's
 * llama_vocab::impl::load decides them: BOS/EOS/EOT/EOM and FIM ids from
 * metadata or, failing that, from well-known token texts (which also makes
 * them control tokens), the end-of-generation set, "unused" control tokens,
 * the few per-model attribute fixes, and the list of special tokens that
 * qi_tokenize cuts text at, longest first. Shared by every tokenizer family
 * (tokenizer.c calls it after the tokens are read). */
#include "tokenizer_int.h"

#include <stdlib.h>
#include <string.h>

/* An integer metadata value as a token id: out-of-range values are ignored
 * (llama.cpp warns and keeps the default), other types are an error. */
static qi_status read_id(const qi_tokenizer *t, const qi_gguf *g, const char *key, int32_t *id,
                         qi_err *err) {
    const qi_gguf_kv *kv = qi_gguf_kv_find(g, key);
    if (!kv) return QI_OK;
    int64_t v;
    qi_gguf_vtype ty = qi_gguf_kv_type(kv);
    if (ty == QI_GGUF_BOOL || ty == QI_GGUF_F32 || ty == QI_GGUF_F64 || !qi_gguf_kv_i64(kv, &v)) {
        uint64_t u;
        if (ty != QI_GGUF_U64 || !qi_gguf_kv_u64(kv, &u))
            return QI_ERR(err, QI_ERR_FORMAT, "%s: expected an integer, got %s", key,
                          qi_gguf_vtype_name(ty));
        return QI_OK; /* a u64 beyond int64: out of range */
    }
    if (v >= 0 && v < t->n_vocab) *id = (int32_t)v;
    return QI_OK;
}

static qi_status read_bool(const qi_gguf *g, const char *key, bool *out, qi_err *err) {
    const qi_gguf_kv *kv = qi_gguf_kv_find(g, key);
    if (!kv) return QI_OK;
    if (qi_gguf_kv_type(kv) != QI_GGUF_BOOL || !qi_gguf_kv_bool(kv, out))
        return QI_ERR(err, QI_ERR_FORMAT, "%s: expected a bool, got %s", key,
                      qi_gguf_vtype_name(qi_gguf_kv_type(kv)));
    return QI_OK;
}

static int32_t find_cstr(const qi_tokenizer *t, const char *s) {
    return qi_tok_vocab_find(t, s, strlen(s));
}

static bool text_is(const qi_tokenizer *t, int32_t id, const char *s) {
    size_t n, m = strlen(s);
    const char *p = qi_tok_text(t, id, &n);
    return n == m && memcmp(p, s, n) == 0;
}

static void eog_set(qi_tokenizer *t, int32_t id, bool on) {
    if (id < 0 || id >= t->n_vocab) return;
    if (on) t->eog[id >> 6] |= 1ull << (id & 63);
    else t->eog[id >> 6] &= ~(1ull << (id & 63));
}

/* Lowest id among the tokens with one of these texts (llama.cpp takes the
 * first in its hash map's order; with one candidate, as usual, the same). */
static int32_t first_of(const qi_tokenizer *t, const char *const *texts) {
    int32_t best = -1;
    for (; *texts; texts++) {
        int32_t id = find_cstr(t, *texts);
        if (id >= 0 && (best < 0 || id < best)) best = id;
    }
    return best;
}

static bool contains_any(const char *s, size_t n, const char *const *subs) {
    for (; *subs; subs++) {
        size_t at;
        if (qi_tok_find_bytes(s, n, *subs, strlen(*subs), &at)) return true;
    }
    return false;
}

/* Special ids, end-of-generation set and the attribute fixes llama.cpp makes
 * from token texts (llama_vocab::impl::load, in its order). */
qi_status qi_tok_special_ids(qi_tokenizer *t, const qi_gguf *g, qi_err *err) {
    static const char *const eot_texts[] = {
        "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
        "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]",
        "<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>",
        "<end_of_utterance>", NULL};
    static const char *const eom_texts[] = {"<|eom_id|>", NULL};
    static const char *const fim_pre_texts[] = {
        "<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>",
        "<\xEF\xBD\x9C" "fim\xE2\x96\x81" "begin\xEF\xBD\x9C>", "<PRE>", "\xE2\x96\x81<PRE>",
        "<|code_prefix|>", "<|prefix|>", NULL};
    static const char *const fim_suf_texts[] = {
        "<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>",
        "<\xEF\xBD\x9C" "fim\xE2\x96\x81hole\xEF\xBD\x9C>", "<SUF>", "\xE2\x96\x81<SUF>",
        "<|code_suffix|>", "<|suffix|>", NULL};
    static const char *const fim_mid_texts[] = {
        "<|fim_middle|>", "<fim-middle>", "<fim_middle>",
        "<\xEF\xBD\x9C" "fim\xE2\x96\x81" "end\xEF\xBD\x9C>", "<MID>", "\xE2\x96\x81<MID>",
        "<|code_middle|>", "<|middle|>", NULL};
    static const char *const fim_pad_texts[] = {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>",
                                                "[PAD]", NULL};
    static const char *const fim_rep_texts[] = {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>",
                                                "<REPO>", "<reponame>", NULL};
    static const char *const fim_sep_texts[] = {"<|file_sep|>", NULL};
    static const char *const eog_texts[] = {
        "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>",
        "<|calls|>", "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>",
        "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>", "<end_of_utterance>", "<eos>",
        "<turn|>", "<|tool_response>",
        "<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>", "[e~[", NULL};
    static const char *const user_defined_texts[] = {"<|channel|>", "<|message|>", "<|start|>",
                                                     "<|constrain|>", NULL};

    int32_t n = t->n_vocab;
    /* gpt2 defaults: BOS = EOS = 11 (disabled if out of range); some
     * pre-tokenizers have no BOS, some add it by default. */
    int32_t eos = 11 < n && !t->no_default_ids ? 11 : -1;
    int32_t bos = (t->pre.flags & QI_PRETOK_NO_BOS) ? -1 : eos;
    int32_t eot = -1, eom = -1;
    t->add_bos = (t->pre.flags & QI_PRETOK_ADD_BOS) != 0;
    t->unk = t->sep = -1;
    if (t->spm) qi_tok_spm_defaults(t, &bos, &eos);
    if (t->wpm) qi_tok_wpm_defaults(t, &bos, &eos);
    int32_t fim[6] = {-1, -1, -1, -1, -1, -1}; /* pre, suf, mid, pad, rep, sep */
    struct {
        const char *key;
        int32_t *id;
    } keys[] = {
        {"tokenizer.ggml.bos_token_id", &bos},
        {"tokenizer.ggml.eos_token_id", &eos},
        {"tokenizer.ggml.eot_token_id", &eot},
        {"tokenizer.ggml.eom_token_id", &eom},
        {"tokenizer.ggml.fim_pre_token_id", &fim[0]},
        {"tokenizer.ggml.fim_suf_token_id", &fim[1]},
        {"tokenizer.ggml.fim_mid_token_id", &fim[2]},
        {"tokenizer.ggml.fim_pad_token_id", &fim[3]},
        {"tokenizer.ggml.fim_rep_token_id", &fim[4]},
        {"tokenizer.ggml.fim_sep_token_id", &fim[5]},
        {"tokenizer.ggml.prefix_token_id", &fim[0]}, /* deprecated spellings */
        {"tokenizer.ggml.suffix_token_id", &fim[1]},
        {"tokenizer.ggml.middle_token_id", &fim[2]},
        {"tokenizer.ggml.unknown_token_id", &t->unk},
        {"tokenizer.ggml.seperator_token_id", &t->sep}, /* sic */
    };
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        qi_status st = read_id(t, g, keys[i].key, keys[i].id, err);
        if (st) return st;
    }
    /* Keys that must have the right type even though we do not use them. */
    static const char *const other_ids[] = {"tokenizer.ggml.padding_token_id",
                                            "tokenizer.ggml.mask_token_id", NULL};
    for (const char *const *k = other_ids; *k; k++) {
        int32_t dummy = -1;
        qi_status st = read_id(t, g, *k, &dummy, err);
        if (st) return st;
    }
    qi_status st = read_bool(g, "tokenizer.ggml.add_bos_token", &t->add_bos, err);
    if (!st) st = read_bool(g, "tokenizer.ggml.add_eos_token", &t->add_eos, err);
    if (st) return st;
    /* llama.cpp's Gemma 4 override; WordPiece always adds [CLS] */
    if ((t->pre.flags & QI_PRETOK_FORCE_BOS) || t->wpm) t->add_bos = true;
    if (t->wpm) t->add_eos = false; /* [SEP] instead */

    /* Find unset ids by text; such tokens become control tokens. */
    struct {
        int32_t *id;
        const char *const *texts;
    } by_text[] = {
        {&eot, eot_texts},        {&eom, eom_texts},         {&fim[0], fim_pre_texts},
        {&fim[1], fim_suf_texts}, {&fim[2], fim_mid_texts},  {&fim[3], fim_pad_texts},
        {&fim[4], fim_rep_texts}, {&fim[5], fim_sep_texts},
    };
    for (size_t i = 0; i < sizeof by_text / sizeof by_text[0]; i++) {
        if (*by_text[i].id >= 0) continue;
        int32_t id = first_of(t, by_text[i].texts);
        if (id >= 0) {
            *by_text[i].id = id;
            t->attr[id] |= QI_TOK_CONTROL;
        }
    }

    /* Control tokens named "...unused..." are unused. */
    static const char *const unused[] = {"unused", NULL};
    for (int32_t id = 0; id < n; id++) {
        size_t len;
        const char *s = qi_tok_text(t, id, &len);
        if ((t->attr[id] & QI_TOK_CONTROL) && contains_any(s, len, unused))
            t->attr[id] |= QI_TOK_UNUSED;
    }

    t->eog = qi_calloc(((size_t)n + 63) / 64, sizeof *t->eog);
    if (!t->eog) return QI_ERR(err, QI_ERR_NOMEM, "tokenizer: out of memory");
    eog_set(t, fim[3], true);
    eog_set(t, fim[4], true);
    eog_set(t, fim[5], true);
    for (const char *const *s = eog_texts; *s; s++) {
        int32_t id = find_cstr(t, *s);
        if (id >= 0) {
            eog_set(t, id, true);
            t->attr[id] |= QI_TOK_CONTROL;
        }
    }
    for (const char *const *s = user_defined_texts; *s; s++) {
        int32_t id = find_cstr(t, *s);
        if (id >= 0) t->attr[id] = QI_TOK_USER_DEFINED;
    }
    eog_set(t, eos, true);
    eog_set(t, eot, true);
    eog_set(t, eom, true);

    /* "<|end|>" is no EOG next to "<|return|>" + "<|call|>" (or "<|calls|>" +
     * "<|flush|>"); "</s>" is no EOG next to "<|tool_response>" or
     * "<|plamo:eos|>". The last such id in the set is the one affected. */
    bool has_return = false, has_call = false, has_flush = false, has_marker = false;
    int32_t end_id = -1, s_id = -1;
    for (int32_t id = 0; id < n; id++) {
        if (!qi_tokenizer_is_eog(t, id)) continue;
        if (text_is(t, id, "<|return|>")) has_return = true;
        else if (text_is(t, id, "<|call|>") || text_is(t, id, "<|calls|>")) has_call = true;
        else if (text_is(t, id, "<|flush|>")) has_flush = true;
        else if (text_is(t, id, "<|end|>")) end_id = id;
        if (text_is(t, id, "<|tool_response>") || text_is(t, id, "<|plamo:eos|>"))
            has_marker = true;
        else if (text_is(t, id, "</s>")) s_id = id;
    }
    if (end_id >= 0 && has_call && (has_return || has_flush)) {
        eog_set(t, end_id, false);
        t->attr[end_id] = QI_TOK_USER_DEFINED;
    }
    if (has_marker && s_id >= 0) {
        eog_set(t, s_id, false);
        t->attr[s_id] = QI_TOK_NORMAL;
    }
    t->bos = bos;
    t->eos = eos;
    return QI_OK;
}

static int cmp_u64(const void *pa, const void *pb) {
    uint64_t a = *(const uint64_t *)pa, b = *(const uint64_t *)pb;
    return (a > b) - (a < b);
}

/* The list qi_tokenize cuts text with, plus llama.cpp's per-model strip
 * flags (by general.name / tokenizer.ggml.pre / general.architecture). */
qi_status qi_tok_special_list(qi_tokenizer *t, const qi_gguf *g, qi_err *err) {
    const uint16_t is_special = QI_TOK_CONTROL | QI_TOK_USER_DEFINED | QI_TOK_UNKNOWN;
    int32_t n = t->n_vocab, k = 0;
    for (int32_t id = 0; id < n; id++) k += (t->attr[id] & is_special) != 0;
    /* Sort keys: longest text first, then lowest id (llama.cpp's std::sort
     * leaves ties unordered; this fixes an order). */
    uint64_t *key = qi_malloc((size_t)(k ? k : 1) * sizeof *key);
    t->special = qi_malloc((size_t)(k ? k : 1) * sizeof *t->special);
    if (!key || !t->special) {
        qi_free(key);
        return QI_ERR(err, QI_ERR_NOMEM, "tokenizer: out of memory");
    }
    k = 0;
    for (int32_t id = 0; id < n; id++) {
        if (!(t->attr[id] & is_special)) continue;
        size_t len;
        qi_tok_text(t, id, &len);
        uint64_t rank = len < UINT32_MAX ? UINT32_MAX - (uint32_t)len : 0;
        key[k++] = (rank << 32) | (uint32_t)id;
    }
    qsort(key, (size_t)k, sizeof *key, cmp_u64);
    for (int32_t i = 0; i < k; i++) t->special[i] = (int32_t)(uint32_t)key[i];
    t->n_special = k;
    qi_free(key);

    qi_str name = {"", 0}, pre = {"", 0}, arch = {"", 0};
    qi_gguf_get_str(g, "general.name", &name);
    qi_gguf_get_str(g, "tokenizer.ggml.pre", &pre);
    qi_gguf_get_str(g, "general.architecture", &arch);
    char lname[256];
    size_t nl = name.len < sizeof lname ? (size_t)name.len : sizeof lname;
    for (size_t i = 0; i < nl; i++) {
        char c = name.ptr[i];
        lname[i] = (c >= 'A' && c <= 'Z') ? (char)(c - 'A' + 'a') : c;
    }
    static const char *const jina[] = {"jina-v2-de", "jina-v2-es", "jina-v2-code", NULL};
    static const char *const jina_arch[] = {"nomic-bert-moe", "jina-bert-v3", NULL};
    static const char *const phi3[] = {"phi-3", "phi3", NULL};
    static const char *const mbert[] = {"modern-bert", NULL};
    if (contains_any(pre.ptr, (size_t)pre.len, jina) ||
        contains_any(arch.ptr, (size_t)arch.len, jina_arch)) {
        int32_t id = find_cstr(t, "<mask>");
        if (id >= 0) t->attr[id] |= QI_TOK_LSTRIP;
    } else if (contains_any(lname, nl, phi3)) {
        for (int32_t i = 0; i < k; i++) t->attr[t->special[i]] |= QI_TOK_RSTRIP;
        int32_t id = find_cstr(t, "</s>");
        if (id >= 0) t->attr[id] |= QI_TOK_RSTRIP;
        static const char *const keep[] = {"<unk>", "<s>", "<|endoftext|>", NULL};
        for (const char *const *s = keep; *s; s++)
            if ((id = find_cstr(t, *s)) >= 0) t->attr[id] &= (uint16_t)~QI_TOK_RSTRIP;
    } else if (contains_any(lname, nl, mbert)) {
        int32_t id = find_cstr(t, "[MASK]");
        if (id >= 0) t->attr[id] |= QI_TOK_LSTRIP;
    }
    return QI_OK;
}


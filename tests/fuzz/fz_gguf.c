/* fz_gguf.c - libFuzzer target: the GGUF reader, then the model loader on
 * what it accepted (every architecture's required tensors and keys:
 * llama, gemma3, opt, falcon; seeds of each from `qinfer synth`).
 *
 * The reader opens the input from memory (exactly sized, so ASan sees any
 * overread). A rejection must come with a message and no handle; an
 * accepted file is walked (every key, array element and tensor, each
 * tensor's first and last byte read) and handed to qi_model_from_gguf,
 * whose model, when it loads, has every weight inside the file and its
 * tokenizer (if any) tokenises a short text. The structure-aware mutation
 * fuzzer (fuzz_gguf.c) stays beside this one as the second GGUF target.
 */
#include <string.h>

#include "fz.h"
#include "qinfer/gguf.h"
#include "qinfer/model.h"

static volatile unsigned g_sink;

static void walk_arr(const qi_gguf_arr *a, unsigned depth) {
    for (uint64_t i = 0; i < a->n && i < 4096; i++) {
        int64_t v;
        double f;
        qi_str s;
        qi_gguf_arr sub;
        if (qi_gguf_arr_i64(a, i, &v)) g_sink += (unsigned)v;
        if (qi_gguf_arr_f64(a, i, &f)) g_sink += f > 0;
        if (qi_gguf_arr_str(a, i, &s) && s.len) g_sink += (unsigned char)s.ptr[s.len - 1];
        if (qi_gguf_arr_arr(a, i, &sub)) {
            FZ_CHECK(depth < QI_GGUF_MAX_DEPTH, "arrays nested past %u", QI_GGUF_MAX_DEPTH);
            walk_arr(&sub, depth + 1);
        }
    }
}

static void in_file(const uint8_t *data, size_t size, const void *p, uint64_t n, const char *what) {
    const uint8_t *b = p;
    FZ_CHECK(b >= data && n <= size && (size_t)(b - data) <= size - n, "%s: %llu bytes outside the file", what,
             (unsigned long long)n);
    if (n) g_sink += b[0] + b[n - 1];
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    qi_gguf *g = (qi_gguf *)&g_sink;
    qi_err e = {0};
    if (qi_gguf_open_memory(data, size, "fuzz.gguf", &g, &e) != QI_OK) {
        FZ_CHECK(g == NULL && e.msg[0], "a rejection without a message or with a handle");
        fz_note("reader: %s", e.msg);
        return 0;
    }
    for (uint64_t i = 0; i < qi_gguf_n_kv(g); i++) {
        const qi_gguf_kv *kv = qi_gguf_kv_at(g, i);
        qi_str key = qi_gguf_kv_key(kv), s;
        qi_gguf_arr a;
        in_file(data, size, key.ptr, key.len, "a key");
        char name[256];
        snprintf(name, sizeof name, "%.*s", (int)(key.len < 255 ? key.len : 255), key.ptr);
        if (key.len < 255 && !memchr(key.ptr, 0, key.len))
            FZ_CHECK(qi_gguf_kv_find(g, name) != NULL, "key '%s' listed but not found", name);
        if (qi_gguf_kv_str(kv, &s)) in_file(data, size, s.ptr, s.len, "a string");
        if (qi_gguf_kv_arr(kv, &a)) walk_arr(&a, 1);
    }
    const uint64_t align = qi_gguf_alignment(g);
    FZ_CHECK(align && (align & (align - 1)) == 0, "alignment %llu", (unsigned long long)align);
    for (uint64_t i = 0; i < qi_gguf_n_tensors(g); i++) {
        const qi_gguf_tensor *t = qi_gguf_tensor_at(g, i);
        FZ_CHECK(t->n_dims >= 1 && t->n_dims <= 4, "tensor of %u dims", t->n_dims);
        if (!qi_gguf_shapes_only(g)) in_file(data, size, t->data, t->n_bytes, "tensor data");
    }
    qi_model *m = NULL;
    if (qi_model_from_gguf(g, &m, &e) != QI_OK) { /* g is closed either way */
        FZ_CHECK(m == NULL && e.msg[0], "a model refused without a message or with a handle");
        fz_note("model: %s", e.msg);
        return 0;
    }
    FZ_CHECK(m->hp.n_layer > 0 && m->hp.n_embd > 0 && m->hp.n_vocab > 0, "model of %d layers, width %d, %d tokens",
             m->hp.n_layer, m->hp.n_embd, m->hp.n_vocab);
    if (!qi_gguf_shapes_only(m->gguf)) {
        in_file(data, size, m->tok_embd.data, m->tok_embd.row_bytes * (uint64_t)m->tok_embd.n_rows, "token embeddings");
        in_file(data, size, m->output.data, m->output.row_bytes * (uint64_t)m->output.n_rows, "output head");
        for (int l = 0; l < m->hp.n_layer; l++) {
            const qi_layer *L = &m->layers[l];
            const qi_weight *w[] = {&L->attn_norm, &L->wq, &L->wk, &L->wv, &L->wo, &L->ffn_norm, &L->w_up, &L->w_down};
            for (size_t k = 0; k < sizeof w / sizeof w[0]; k++)
                if (w[k]->data) in_file(data, size, w[k]->data, w[k]->row_bytes * (uint64_t)w[k]->n_rows, "a weight");
        }
    }
    if (m->tok) {
        int32_t *ids = NULL;
        size_t n = 0;
        if (qi_tokenize(m->tok, "Hello, world!", 13, false, false, &ids, &n, &e) == QI_OK) {
            for (size_t i = 0; i < n; i++)
                FZ_CHECK(ids[i] >= 0 && ids[i] < qi_tokenizer_n_vocab(m->tok), "id %d outside the vocabulary", ids[i]);
            qi_free(ids);
        }
    }
    fz_note("model of %d layers loaded", m->hp.n_layer);
    qi_model_free(m);
    return 0;
}

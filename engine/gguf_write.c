/* gguf_write.c - the GGUF v3 writer (qinfer/gguf.h), apart from the reader.
 *
 * Keys, values (already encoded) and tensors are copied into the
 * writer; serialisation computes the total size with overflow checks, makes
 * one allocation, and lays out header, kvs, tensor infos, padding, then each
 * tensor's data at an aligned offset (padded after each tensor, as llama.cpp
 * does).
 */
#include "qinfer/gguf.h"

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf_int.h"

/* ---- Writer -------------------------------------------------------------- */

typedef struct {
    char *key;
    size_t key_len;
    uint32_t type;
    uint8_t *val; /* encoded value */
    size_t val_len;
} wkv;

typedef struct {
    char *name;
    size_t name_len;
    uint32_t type, n_dims;
    uint64_t ne[4];
    uint8_t *data;
    uint64_t n_bytes;
} wtensor;

struct qi_gguf_writer {
    wkv *kvs;
    size_t n_kv, cap_kv;
    wtensor *ts;
    size_t n_t, cap_t;
};

qi_gguf_writer *qi_gguf_writer_create(void) { return qi_calloc(1, sizeof(qi_gguf_writer)); }

void qi_gguf_writer_free(qi_gguf_writer *w) {
    if (!w) return;
    for (size_t i = 0; i < w->n_kv; i++) {
        qi_free(w->kvs[i].key);
        qi_free(w->kvs[i].val);
    }
    for (size_t i = 0; i < w->n_t; i++) {
        qi_free(w->ts[i].name);
        qi_free(w->ts[i].data);
    }
    qi_free(w->kvs);
    qi_free(w->ts);
    qi_free(w);
}

/* Grow *arr (of elem-byte entries) so one more fits; false on OOM. */
static bool grow(void **arr, size_t *cap, size_t n, size_t elem) {
    if (n < *cap) return true;
    size_t nc = *cap ? *cap * 2 : 8;
    if (nc > SIZE_MAX / elem) return false;
    void *p = qi_realloc(*arr, nc * elem);
    if (!p) return false;
    *arr = p;
    *cap = nc;
    return true;
}

/* Store a copy of an encoded value under key (replacing an existing one). On
 * failure the writer is unchanged. */
static qi_status w_set(qi_gguf_writer *w, const char *key, uint32_t type, const void *val,
                       size_t len) {
    if (!w || !key || !*key || (!val && len)) return QI_ERR_INVALID;
    uint8_t *copy = qi_malloc(len);
    if (!copy) return QI_ERR_NOMEM;
    if (len) memcpy(copy, val, len);
    size_t kl = strlen(key);
    for (size_t i = 0; i < w->n_kv; i++) {
        if (w->kvs[i].key_len == kl && memcmp(w->kvs[i].key, key, kl) == 0) {
            qi_free(w->kvs[i].val);
            w->kvs[i].type = type;
            w->kvs[i].val = copy;
            w->kvs[i].val_len = len;
            return QI_OK;
        }
    }
    char *k = qi_malloc(kl + 1);
    if (!k || !grow((void **)&w->kvs, &w->cap_kv, w->n_kv, sizeof *w->kvs)) {
        qi_free(k);
        qi_free(copy);
        return QI_ERR_NOMEM;
    }
    memcpy(k, key, kl + 1);
    w->kvs[w->n_kv++] = (wkv){k, kl, type, copy, len};
    return QI_OK;
}

static qi_status w_set_le(qi_gguf_writer *w, const char *key, uint32_t type, uint64_t bits) {
    uint8_t b[8];
    unsigned sz = vtype_size(type);
    store_le(b, bits, sz);
    return w_set(w, key, type, b, sz);
}

qi_status qi_gguf_writer_set_u32(qi_gguf_writer *w, const char *key, uint32_t v) {
    return w_set_le(w, key, QI_GGUF_U32, v);
}
qi_status qi_gguf_writer_set_i32(qi_gguf_writer *w, const char *key, int32_t v) {
    return w_set_le(w, key, QI_GGUF_I32, (uint32_t)v);
}
qi_status qi_gguf_writer_set_u64(qi_gguf_writer *w, const char *key, uint64_t v) {
    return w_set_le(w, key, QI_GGUF_U64, v);
}
qi_status qi_gguf_writer_set_i64(qi_gguf_writer *w, const char *key, int64_t v) {
    return w_set_le(w, key, QI_GGUF_I64, (uint64_t)v);
}
qi_status qi_gguf_writer_set_f32(qi_gguf_writer *w, const char *key, float v) {
    uint32_t b;
    memcpy(&b, &v, sizeof b);
    return w_set_le(w, key, QI_GGUF_F32, b);
}
qi_status qi_gguf_writer_set_f64(qi_gguf_writer *w, const char *key, double v) {
    uint64_t b;
    memcpy(&b, &v, sizeof b);
    return w_set_le(w, key, QI_GGUF_F64, b);
}
qi_status qi_gguf_writer_set_bool(qi_gguf_writer *w, const char *key, bool v) {
    return w_set_le(w, key, QI_GGUF_BOOL, v ? 1 : 0);
}

qi_status qi_gguf_writer_set_str(qi_gguf_writer *w, const char *key, const char *v) {
    if (!v) return QI_ERR_INVALID;
    size_t n = strlen(v);
    if (n > SIZE_MAX - 8) return QI_ERR_NOMEM;
    uint8_t *b = qi_malloc(8 + n);
    if (!b) return QI_ERR_NOMEM;
    store_le(b, n, 8);
    memcpy(b + 8, v, n);
    qi_status s = w_set(w, key, QI_GGUF_STRING, b, 8 + n);
    qi_free(b);
    return s;
}

qi_status qi_gguf_writer_set_arr(qi_gguf_writer *w, const char *key, qi_gguf_vtype elem,
                                 const void *data, uint64_t n) {
    unsigned esz = vtype_size((uint32_t)elem);
    if (!esz || (!data && n)) return QI_ERR_INVALID;
    if (n > (SIZE_MAX - 12) / esz) return QI_ERR_NOMEM;
    size_t len = 12 + (size_t)n * esz;
    uint8_t *b = qi_malloc(len);
    if (!b) return QI_ERR_NOMEM;
    store_le(b, (uint32_t)elem, 4);
    store_le(b + 4, n, 8);
    if (n) memcpy(b + 12, data, (size_t)n * esz);
    qi_status s = w_set(w, key, QI_GGUF_ARRAY, b, len);
    qi_free(b);
    return s;
}

qi_status qi_gguf_writer_set_arr_str(qi_gguf_writer *w, const char *key,
                                     const char *const *strs, uint64_t n) {
    if (!strs && n) return QI_ERR_INVALID;
    size_t len = 12;
    for (uint64_t i = 0; i < n; i++) {
        if (!strs[i]) return QI_ERR_INVALID;
        size_t sl = strlen(strs[i]);
        if (sl > SIZE_MAX - 8 - len) return QI_ERR_NOMEM;
        len += 8 + sl;
    }
    uint8_t *b = qi_malloc(len);
    if (!b) return QI_ERR_NOMEM;
    store_le(b, QI_GGUF_STRING, 4);
    store_le(b + 4, n, 8);
    size_t o = 12;
    for (uint64_t i = 0; i < n; i++) {
        size_t sl = strlen(strs[i]);
        store_le(b + o, sl, 8);
        memcpy(b + o + 8, strs[i], sl);
        o += 8 + sl;
    }
    qi_status s = w_set(w, key, QI_GGUF_ARRAY, b, len);
    qi_free(b);
    return s;
}

qi_status qi_gguf_writer_set_raw(qi_gguf_writer *w, const char *key, uint32_t type,
                                 const void *value, size_t n_bytes) {
    return w_set(w, key, type, value, n_bytes);
}

static qi_status add_tensor(qi_gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                            const uint64_t *ne, const void *data, uint64_t n_bytes, bool shape_only) {
    if (!w || !name || !ne || n_dims == 0 || n_dims > 4 || !qi_type_get(type))
        return QI_ERR_INVALID;
    uint64_t n_el = 1, row;
    for (uint32_t d = 0; d < n_dims; d++) {
        if (ne[d] == 0 || n_el > (uint64_t)INT64_MAX / ne[d]) return QI_ERR_INVALID;
        n_el *= ne[d];
    }
    if (!qi_type_row_bytes(type, ne[0], &row)) return QI_ERR_INVALID;
    uint64_t rows = n_el / ne[0];
    if (row > UINT64_MAX / rows || row * rows != n_bytes) return QI_ERR_INVALID;
    if (n_bytes > SIZE_MAX) return QI_ERR_NOMEM;
    size_t nl = strlen(name);
    for (size_t i = 0; i < w->n_t; i++)
        if (w->ts[i].name_len == nl && memcmp(w->ts[i].name, name, nl) == 0)
            return QI_ERR_INVALID;
    char *nm = qi_malloc(nl + 1);
    uint8_t *copy = nm && !shape_only ? qi_malloc((size_t)n_bytes) : NULL;
    if (!nm || (!shape_only && !copy) || !grow((void **)&w->ts, &w->cap_t, w->n_t, sizeof *w->ts)) {
        qi_free(nm);
        qi_free(copy);
        return QI_ERR_NOMEM;
    }
    memcpy(nm, name, nl + 1);
    if (copy && data) memcpy(copy, data, (size_t)n_bytes);
    else if (copy) memset(copy, 0, (size_t)n_bytes);
    wtensor *t = &w->ts[w->n_t++];
    *t = (wtensor){nm, nl, type, n_dims, {1, 1, 1, 1}, copy, n_bytes};
    for (uint32_t d = 0; d < n_dims; d++) t->ne[d] = ne[d];
    return QI_OK;
}

qi_status qi_gguf_writer_add_tensor(qi_gguf_writer *w, const char *name, uint32_t type,
                                    uint32_t n_dims, const uint64_t *ne, const void *data,
                                    uint64_t n_bytes) {
    return add_tensor(w, name, type, n_dims, ne, data, n_bytes, false);
}

qi_status qi_gguf_writer_add_tensor_shape(qi_gguf_writer *w, const char *name, uint32_t type,
                                          uint32_t n_dims, const uint64_t *ne, uint64_t n_bytes) {
    return add_tensor(w, name, type, n_dims, ne, NULL, n_bytes, true);
}

static bool add_ov(uint64_t *acc, uint64_t v) {
    if (v > UINT64_MAX - *acc) return false;
    *acc += v;
    return true;
}

static bool align_ov(uint64_t *acc, uint64_t a) {
    uint64_t r = *acc % a;
    return r == 0 || add_ov(acc, a - r);
}

qi_status qi_gguf_writer_to_memory(const qi_gguf_writer *w, uint32_t version, void **buf,
                                   size_t *len, qi_err *err) {
    if (buf) *buf = NULL;
    if (len) *len = 0;
    if (!w || !buf || !len) return QI_ERR(err, QI_ERR_INVALID, "gguf writer: NULL argument");
    if (version != 2 && version != 3)
        return QI_ERR(err, QI_ERR_INVALID, "gguf writer: version %" PRIu32 " (only 2 and 3)",
                      version);
    uint64_t align = GGUF_DEFAULT_ALIGNMENT;
    for (size_t i = 0; i < w->n_kv; i++) {
        const wkv *kv = &w->kvs[i];
        if (strcmp(kv->key, "general.alignment") != 0) continue;
        if (kv->type != QI_GGUF_U32 || kv->val_len != 4)
            return QI_ERR(err, QI_ERR_INVALID, "gguf writer: general.alignment must be a u32");
        align = load_le(kv->val, 4);
        if (align == 0 || (align & (align - 1)))
            return QI_ERR(err, QI_ERR_INVALID,
                          "gguf writer: general.alignment %" PRIu64 " is not a power of two",
                          align);
    }

    /* a writer with shape-only tensors writes no data section, and only
     * with the key that tells readers so */
    bool shapes = false, marked = false;
    for (size_t i = 0; i < w->n_t; i++) shapes = shapes || !w->ts[i].data;
    for (size_t i = 0; i < w->n_kv; i++)
        if (strcmp(w->kvs[i].key, "qinfer.shapes_only") == 0)
            marked = w->kvs[i].type == QI_GGUF_BOOL && w->kvs[i].val_len == 1 && w->kvs[i].val[0] == 1;
    if (shapes != marked)
        return QI_ERR(err, QI_ERR_INVALID, "gguf writer: %s", shapes ? "tensors without data need qinfer.shapes_only = true"
                                                                      : "qinfer.shapes_only = true with tensor data");

    uint64_t total = GGUF_HEADER_BYTES;
    bool ok = true;
    for (size_t i = 0; i < w->n_kv; i++)
        ok = ok && add_ov(&total, 12) && add_ov(&total, w->kvs[i].key_len) &&
             add_ov(&total, w->kvs[i].val_len);
    for (size_t i = 0; i < w->n_t; i++)
        ok = ok && add_ov(&total, 24 + 8ull * w->ts[i].n_dims) &&
             add_ov(&total, w->ts[i].name_len);
    uint64_t data_off = total, data_len = 0;
    if (w->n_t) {
        ok = ok && align_ov(&data_off, align);
        for (size_t i = 0; i < w->n_t; i++)
            ok = ok && add_ov(&data_len, w->ts[i].n_bytes) && align_ov(&data_len, align);
        total = data_off;
        if (!shapes) ok = ok && add_ov(&total, data_len);
    }
    if (!ok || total > SIZE_MAX)
        return QI_ERR(err, QI_ERR_NOMEM, "gguf writer: file size overflows");
    uint8_t *b = qi_calloc(1, (size_t)total);
    if (!b) return QI_ERR(err, QI_ERR_NOMEM, "gguf writer: out of memory (%" PRIu64 " bytes)", total);

    size_t o = 0;
    memcpy(b, "GGUF", 4);
    store_le(b + 4, version, 4);
    store_le(b + 8, w->n_t, 8);
    store_le(b + 16, w->n_kv, 8);
    o = GGUF_HEADER_BYTES;
    for (size_t i = 0; i < w->n_kv; i++) {
        const wkv *kv = &w->kvs[i];
        store_le(b + o, kv->key_len, 8);
        memcpy(b + o + 8, kv->key, kv->key_len);
        o += 8 + kv->key_len;
        store_le(b + o, kv->type, 4);
        o += 4;
        if (kv->val_len) memcpy(b + o, kv->val, kv->val_len);
        o += kv->val_len;
    }
    uint64_t off = 0;
    for (size_t i = 0; i < w->n_t; i++) {
        const wtensor *t = &w->ts[i];
        store_le(b + o, t->name_len, 8);
        memcpy(b + o + 8, t->name, t->name_len);
        o += 8 + t->name_len;
        store_le(b + o, t->n_dims, 4);
        o += 4;
        for (uint32_t d = 0; d < t->n_dims; d++, o += 8) store_le(b + o, t->ne[d], 8);
        store_le(b + o, t->type, 4);
        store_le(b + o + 4, off, 8);
        o += 12;
        if (t->data) memcpy(b + data_off + off, t->data, (size_t)t->n_bytes);
        off += t->n_bytes;
        off = (off + align - 1) / align * align; /* cannot overflow: checked above */
    }
    *buf = b;
    *len = (size_t)total;
    return QI_OK;
}

qi_status qi_gguf_writer_to_file(const qi_gguf_writer *w, uint32_t version, const char *path,
                                 qi_err *err) {
    if (!path) return QI_ERR(err, QI_ERR_INVALID, "gguf writer: path is NULL");
    void *buf;
    size_t len;
    qi_status s = qi_gguf_writer_to_memory(w, version, &buf, &len, err);
    if (s) return s;
    FILE *f = fopen(path, "wb");
    if (!f) {
        int e = errno;
        qi_free(buf);
        return QI_ERR(err, QI_ERR_IO, "%s: cannot create: %s", path, strerror(e));
    }
    size_t wr = fwrite(buf, 1, len, f);
    int e = errno;
    int rc = fclose(f);
    if (rc != 0 && wr == len) e = errno;
    qi_free(buf);
    if (wr != len || rc != 0) {
        remove(path);
        return QI_ERR(err, QI_ERR_IO, "%s: write failed: %s", path, strerror(e));
    }
    return QI_OK;
}

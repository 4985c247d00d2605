/* gguf_get.c - typed access to a GGUF file that gguf.c has opened and
 * validated: the file's figures, metadata values by index or key, array
 * elements, tensors by index or name. Nothing here re-checks the file;
 * every view points into the mapping or the tables built at open.
 *
 * Numbers convert between the file's types only where no value is lost:
 * a signed value reads as unsigned only when it is not negative, an
 * unsigned one as signed only below 2^63, integers read as floats, floats
 * never as integers, and a bool only as itself or an integer. */
#include "qinfer/gguf.h"

#include "gguf_int.h"
#include "gguf_read.h"

#include <stdint.h>
#include <string.h>

/* ---- Numeric decoding (shared by scalar and array element getters) ------- */

typedef enum { NUM_SIGNED, NUM_UNSIGNED, NUM_FLOAT, NUM_BOOL } num_kind;

typedef struct {
    num_kind kind;
    int64_t i;
    uint64_t u;
    double f;
} num;

/* Decode the raw little-endian bits of a fixed-size value; false for STRING,
 * ARRAY and unknown types. */
static bool num_decode(uint32_t type, uint64_t bits, num *out) {
    memset(out, 0, sizeof *out);
    switch (type) {
    case QI_GGUF_U8:
    case QI_GGUF_U16:
    case QI_GGUF_U32:
    case QI_GGUF_U64: out->kind = NUM_UNSIGNED; out->u = bits; return true;
    case QI_GGUF_I8: out->kind = NUM_SIGNED; out->i = (int8_t)(uint8_t)bits; return true;
    case QI_GGUF_I16: out->kind = NUM_SIGNED; out->i = (int16_t)(uint16_t)bits; return true;
    case QI_GGUF_I32: out->kind = NUM_SIGNED; out->i = (int32_t)(uint32_t)bits; return true;
    case QI_GGUF_I64: out->kind = NUM_SIGNED; out->i = (int64_t)bits; return true;
    case QI_GGUF_BOOL: out->kind = NUM_BOOL; out->u = bits != 0; return true;
    case QI_GGUF_F32: {
        uint32_t b = (uint32_t)bits;
        float f;
        memcpy(&f, &b, sizeof f);
        out->kind = NUM_FLOAT;
        out->f = f;
        return true;
    }
    case QI_GGUF_F64: {
        double d;
        memcpy(&d, &bits, sizeof d);
        out->kind = NUM_FLOAT;
        out->f = d;
        return true;
    }
    default: return false;
    }
}

static bool num_to_i64(uint32_t type, uint64_t bits, int64_t *out) {
    num n;
    if (!num_decode(type, bits, &n)) return false;
    switch (n.kind) {
    case NUM_SIGNED: *out = n.i; return true;
    case NUM_UNSIGNED:
    case NUM_BOOL:
        if (n.u > (uint64_t)INT64_MAX) return false;
        *out = (int64_t)n.u;
        return true;
    case NUM_FLOAT: return false;
    }
    return false;
}

static bool num_to_u64(uint32_t type, uint64_t bits, uint64_t *out) {
    num n;
    if (!num_decode(type, bits, &n)) return false;
    switch (n.kind) {
    case NUM_SIGNED:
        if (n.i < 0) return false;
        *out = (uint64_t)n.i;
        return true;
    case NUM_UNSIGNED:
    case NUM_BOOL: *out = n.u; return true;
    case NUM_FLOAT: return false;
    }
    return false;
}

static bool num_to_f64(uint32_t type, uint64_t bits, double *out) {
    num n;
    if (!num_decode(type, bits, &n)) return false;
    switch (n.kind) {
    case NUM_SIGNED: *out = (double)n.i; return true;
    case NUM_UNSIGNED: *out = (double)n.u; return true;
    case NUM_FLOAT: *out = n.f; return true;
    case NUM_BOOL: return false;
    }
    return false;
}

/* ---- Accessors ----------------------------------------------------------- */

uint32_t qi_gguf_version(const qi_gguf *g) { return g ? g->version : 0; }
uint64_t qi_gguf_alignment(const qi_gguf *g) { return g ? g->alignment : 0; }
uint64_t qi_gguf_file_size(const qi_gguf *g) { return g ? g->size : 0; }
const char *qi_gguf_path(const qi_gguf *g) { return g ? g->path : NULL; }
bool qi_gguf_mapped(const qi_gguf *g) { return g && g->map; }
uint64_t qi_gguf_data_offset(const qi_gguf *g) { return g ? g->data_off : 0; }
bool qi_gguf_shapes_only(const qi_gguf *g) { return g && g->shapes_map; }
uint64_t qi_gguf_n_kv(const qi_gguf *g) { return g ? g->n_kv : 0; }

const qi_gguf_kv *qi_gguf_kv_at(const qi_gguf *g, uint64_t i) {
    return g && i < g->n_kv ? &g->kvs[i] : NULL;
}

const qi_gguf_kv *qi_gguf_kv_find(const qi_gguf *g, const char *key) {
    if (!g || !key || !g->n_kv) return NULL;
    qi_str k = {key, strlen(key)};
    uint64_t lo = 0, hi = g->n_kv;
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        int c = gguf_str_cmp(g->kv_sorted[mid]->key, k);
        if (c == 0) return g->kv_sorted[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

qi_str qi_gguf_kv_key(const qi_gguf_kv *kv) {
    if (!kv) return (qi_str){"", 0};
    return kv->key;
}

qi_gguf_vtype qi_gguf_kv_type(const qi_gguf_kv *kv) {
    return kv ? (qi_gguf_vtype)kv->type : QI_GGUF_U8;
}

bool qi_gguf_kv_i64(const qi_gguf_kv *kv, int64_t *out) {
    return kv && out && num_to_i64(kv->type, kv->bits, out);
}

bool qi_gguf_kv_u64(const qi_gguf_kv *kv, uint64_t *out) {
    return kv && out && num_to_u64(kv->type, kv->bits, out);
}

bool qi_gguf_kv_f64(const qi_gguf_kv *kv, double *out) {
    return kv && out && num_to_f64(kv->type, kv->bits, out);
}

bool qi_gguf_kv_bool(const qi_gguf_kv *kv, bool *out) {
    if (!kv || !out || kv->type != QI_GGUF_BOOL) return false;
    *out = kv->bits != 0;
    return true;
}

bool qi_gguf_kv_str(const qi_gguf_kv *kv, qi_str *out) {
    if (!kv || !out || kv->type != QI_GGUF_STRING) return false;
    *out = kv->str;
    return true;
}

bool qi_gguf_kv_arr(const qi_gguf_kv *kv, qi_gguf_arr *out) {
    if (!kv || !out || kv->type != QI_GGUF_ARRAY) return false;
    out->type = (qi_gguf_vtype)kv->arr->type;
    out->n = kv->arr->n;
    out->impl_ = kv->arr;
    return true;
}

bool qi_gguf_get_i64(const qi_gguf *g, const char *key, int64_t *out) {
    return qi_gguf_kv_i64(qi_gguf_kv_find(g, key), out);
}
bool qi_gguf_get_u64(const qi_gguf *g, const char *key, uint64_t *out) {
    return qi_gguf_kv_u64(qi_gguf_kv_find(g, key), out);
}
bool qi_gguf_get_f64(const qi_gguf *g, const char *key, double *out) {
    return qi_gguf_kv_f64(qi_gguf_kv_find(g, key), out);
}
bool qi_gguf_get_bool(const qi_gguf *g, const char *key, bool *out) {
    return qi_gguf_kv_bool(qi_gguf_kv_find(g, key), out);
}
bool qi_gguf_get_str(const qi_gguf *g, const char *key, qi_str *out) {
    return qi_gguf_kv_str(qi_gguf_kv_find(g, key), out);
}
bool qi_gguf_get_arr(const qi_gguf *g, const char *key, qi_gguf_arr *out) {
    return qi_gguf_kv_arr(qi_gguf_kv_find(g, key), out);
}

/* The node behind an array view, with i checked; NULL otherwise. */
static const arr_node *arr_elem(const qi_gguf_arr *a, uint64_t i) {
    if (!a || !a->impl_) return NULL;
    const arr_node *n = a->impl_;
    return i < n->n ? n : NULL;
}

static bool arr_bits(const qi_gguf_arr *a, uint64_t i, uint32_t *type, uint64_t *bits) {
    const arr_node *n = arr_elem(a, i);
    if (!n) return false;
    unsigned sz = vtype_size(n->type);
    if (!sz) return false;
    *type = n->type;
    *bits = load_le(n->data + i * sz, sz);
    return true;
}

bool qi_gguf_arr_i64(const qi_gguf_arr *a, uint64_t i, int64_t *out) {
    uint32_t t;
    uint64_t b;
    return out && arr_bits(a, i, &t, &b) && num_to_i64(t, b, out);
}

bool qi_gguf_arr_u64(const qi_gguf_arr *a, uint64_t i, uint64_t *out) {
    uint32_t t;
    uint64_t b;
    return out && arr_bits(a, i, &t, &b) && num_to_u64(t, b, out);
}

bool qi_gguf_arr_f64(const qi_gguf_arr *a, uint64_t i, double *out) {
    uint32_t t;
    uint64_t b;
    return out && arr_bits(a, i, &t, &b) && num_to_f64(t, b, out);
}

bool qi_gguf_arr_str(const qi_gguf_arr *a, uint64_t i, qi_str *out) {
    const arr_node *n = arr_elem(a, i);
    if (!n || !out || n->type != QI_GGUF_STRING) return false;
    *out = n->strs[i];
    return true;
}

bool qi_gguf_arr_arr(const qi_gguf_arr *a, uint64_t i, qi_gguf_arr *out) {
    const arr_node *n = arr_elem(a, i);
    if (!n || !out || n->type != QI_GGUF_ARRAY) return false;
    const arr_node *c = &n->subs[i];
    out->type = (qi_gguf_vtype)c->type;
    out->n = c->n;
    out->impl_ = c;
    return true;
}

uint64_t qi_gguf_n_tensors(const qi_gguf *g) { return g ? g->n_tensors : 0; }

const qi_gguf_tensor *qi_gguf_tensor_at(const qi_gguf *g, uint64_t i) {
    return g && i < g->n_tensors ? &g->tensors[i] : NULL;
}

const qi_gguf_tensor *qi_gguf_tensor_find(const qi_gguf *g, const char *name) {
    if (!g || !name || !g->n_tensors) return NULL;
    qi_str k = {name, strlen(name)};
    uint64_t lo = 0, hi = g->n_tensors;
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        int c = gguf_str_cmp(g->t_sorted[mid]->name, k);
        if (c == 0) return g->t_sorted[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

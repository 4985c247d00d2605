/* gguf.c - GGUF v2/v3 reader (validate everything at open); the writer is
 * gguf_write.c.
 *
 * Reader. The file is mapped read-only (or a caller buffer is used) and the
 * whole header is checked before qi_gguf_open returns, so accessors never
 * need to re-check anything and can hand out views into the mapping. Parsing
 * goes through a bounds-checked cursor: every read asks "are there n bytes
 * left?" with the subtraction written so that it cannot overflow, and every
 * count read from the file is compared with the bytes that could possibly
 * hold it before anything is allocated for it.
 *
 * Metadata is parsed twice. Pass 1 validates every value (types, lengths,
 * nesting depth, truncation) and counts the side tables: string-array
 * elements and array nodes. Pass 2 re-reads the same bytes into exactly-sized
 * tables. This costs a second walk over the metadata (a few ms for a 49k
 * token vocabulary) but means no growable vectors, no pointer fix-ups, few
 * allocations (which keeps the allocation-failure tests short) and allocation
 * sizes that are proven by the bytes already walked. The alternative, one pass
 * with realloc-doubled tables, needs index-based links and is harder to get
 * right under fault injection.
 *
 * Arrays: an array value is an arr_node. Fixed-size element types point at
 * the packed elements in the mapping; string elements are indexed into a
 * qi_str table (so qi_gguf_arr_str is O(1)); array elements own a contiguous
 * run of child nodes (so qi_gguf_arr_arr is O(1)). Nesting is limited to
 * QI_GGUF_MAX_DEPTH, which also bounds the parser's recursion.
 *
 * Lookup: keys and tensor names are sorted (pointer arrays, qsort) once; this
 * finds duplicates (adjacent after sorting) and gives O(log n) find. Tensor
 * overlap is checked the same way on a temporary array sorted by offset.
 *
 * Stricter than llama.cpp in two places: tensors with a zero dimension are
 * rejected (so every tensor has at least one data byte), and keys must be
 * non-empty. Like llama.cpp, a bool byte is not checked (nonzero is true),
 * strings need not be UTF-8, and a file without tensors need not be padded.
 *
 * The typed accessors over what was read are gguf_get.c; the tables both
 * files see are gguf_read.h.
 */
#include "qinfer/gguf.h"

#include "gguf_int.h"
#include "gguf_read.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Smallest possible kv: u64 key length, 1 key byte, u32 type, 1-byte value. */
#define GGUF_MIN_KV_BYTES 14u
/* Smallest tensor info: u64 name length (empty name), u32 n_dims, one u64
 * dim, u32 type, u64 offset. */
#define GGUF_MIN_TENSOR_BYTES 32u
/* Smallest array element of type STRING (u64 length) and ARRAY (u32 type +
 * u64 count). */
#define GGUF_MIN_STR_BYTES 8u
#define GGUF_MIN_ARR_BYTES 12u

/* ---- Shared helpers ------------------------------------------------------ */

static const char *const k_vtype_names[GGUF_N_VTYPES] = {
    "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64",
};

const char *qi_gguf_vtype_name(uint32_t t) {
    return t < GGUF_N_VTYPES ? k_vtype_names[t] : "?";
}

/* Bytes per element for fixed-size value types; 0 for STRING, ARRAY and
 * unknown ids. */
bool qi_str_eq(qi_str s, const char *cstr) {
    if (!cstr) return false;
    size_t n = strlen(cstr);
    return s.len == n && (n == 0 || memcmp(s.ptr, cstr, n) == 0);
}

/* Printable rendering of an untrusted name for messages: at most ~60 bytes,
 * non-printable bytes as \xNN. */
static void fmt_name(char *dst, size_t cap, const char *p, uint64_t len) {
    size_t o = 0;
    uint64_t i = 0;
    for (; i < len && o + 8 < cap && i < 60; i++) {
        unsigned char c = (unsigned char)p[i];
        if (c >= 0x20 && c < 0x7f && c != '\\' && c != '\'') {
            dst[o++] = (char)c;
        } else {
            o += (size_t)snprintf(dst + o, cap - o, "\\x%02x", c);
        }
    }
    if (i < len && o + 4 < cap) {
        memcpy(dst + o, "...", 3);
        o += 3;
    }
    dst[o] = 0;
}

typedef struct {
    const uint8_t *p;
    uint64_t size, pos;
    const char *name;
    qi_err *err;
    char where[320]; /* "kv 3 'general.name'" etc.; "" at the header */
    bool fill;       /* pass 2: write into the tables below */
    uint64_t n_strs, n_nodes;
    qi_str *strs;
    arr_node *nodes;
} parser;

static qi_status perr(parser *ps, qi_status code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

static qi_status perr(parser *ps, qi_status code, const char *fmt, ...) {
    char msg[320];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (ps->where[0]) return QI_ERR(ps->err, code, "%s: %s: %s", ps->name, ps->where, msg);
    return QI_ERR(ps->err, code, "%s: %s", ps->name, msg);
}

static uint64_t left(const parser *ps) { return ps->size - ps->pos; }

static qi_status need(parser *ps, uint64_t n, const char *what) {
    if (n <= left(ps)) return QI_OK;
    return perr(ps, QI_ERR_FORMAT,
                "truncated: %s at offset %" PRIu64 " runs past end of file (%" PRIu64 " bytes)",
                what, ps->pos, ps->size);
}

static qi_status rd_u32(parser *ps, uint32_t *v, const char *what) {
    qi_status s = need(ps, 4, what);
    if (s) return s;
    *v = (uint32_t)load_le(ps->p + ps->pos, 4);
    ps->pos += 4;
    return QI_OK;
}

static qi_status rd_u64(parser *ps, uint64_t *v, const char *what) {
    qi_status s = need(ps, 8, what);
    if (s) return s;
    *v = load_le(ps->p + ps->pos, 8);
    ps->pos += 8;
    return QI_OK;
}

static qi_status rd_str(parser *ps, qi_str *out, const char *what) {
    uint64_t at = ps->pos, len;
    qi_status s = rd_u64(ps, &len, what);
    if (s) return s;
    if (len > left(ps))
        return perr(ps, QI_ERR_FORMAT,
                    "%s length %" PRIu64 " at offset %" PRIu64 " runs past end of file (%" PRIu64
                    " bytes)",
                    what, len, at, ps->size);
    out->ptr = (const char *)ps->p + ps->pos;
    out->len = len;
    ps->pos += len;
    return QI_OK;
}

/* One array value (its header is at the cursor). `node` is NULL in pass 1.
 * depth is 1 for a top-level array. */
static qi_status parse_array(parser *ps, unsigned depth, arr_node *node) {
    if (depth > QI_GGUF_MAX_DEPTH)
        return perr(ps, QI_ERR_FORMAT, "arrays nested deeper than %u levels", QI_GGUF_MAX_DEPTH);
    uint32_t et;
    uint64_t n;
    qi_status s = rd_u32(ps, &et, "array element type");
    if (!s) s = rd_u64(ps, &n, "array count");
    if (s) return s;
    if (et >= GGUF_N_VTYPES)
        return perr(ps, QI_ERR_FORMAT, "unknown array element type %" PRIu32, et);
    if (node) {
        node->type = et;
        node->n = n;
    }
    unsigned esz = vtype_size(et);
    if (esz) {
        if (n > left(ps) / esz)
            return perr(ps, QI_ERR_FORMAT,
                        "array of %" PRIu64 " %s elements at offset %" PRIu64
                        " runs past end of file (%" PRIu64 " bytes)",
                        n, k_vtype_names[et], ps->pos, ps->size);
        if (node) node->data = ps->p + ps->pos;
        ps->pos += n * esz;
        return QI_OK;
    }
    uint64_t min = et == QI_GGUF_STRING ? GGUF_MIN_STR_BYTES : GGUF_MIN_ARR_BYTES;
    if (n > left(ps) / min)
        return perr(ps, QI_ERR_FORMAT,
                    "array count %" PRIu64 " at offset %" PRIu64
                    " is larger than the rest of the file could hold",
                    n, ps->pos - 8);
    /* Reserve this array's elements as one contiguous run of the table. */
    uint64_t first = et == QI_GGUF_STRING ? ps->n_strs : ps->n_nodes;
    if (et == QI_GGUF_STRING) ps->n_strs += n;
    else ps->n_nodes += n;
    if (node && n && et == QI_GGUF_STRING) node->strs = ps->strs + first;
    if (node && n && et == QI_GGUF_ARRAY) node->subs = ps->nodes + first;
    for (uint64_t i = 0; i < n; i++) {
        if (et == QI_GGUF_STRING) {
            qi_str tmp;
            uint64_t at = ps->pos, len;
            if ((s = rd_u64(ps, &len, "string element"))) return s;
            if (len > left(ps))
                return perr(ps, QI_ERR_FORMAT,
                            "string element %" PRIu64 " length %" PRIu64 " at offset %" PRIu64
                            " runs past end of file (%" PRIu64 " bytes)",
                            i, len, at, ps->size);
            tmp.ptr = (const char *)ps->p + ps->pos;
            tmp.len = len;
            ps->pos += len;
            if (node) ps->strs[first + i] = tmp;
        } else {
            s = parse_array(ps, depth + 1, node ? ps->nodes + first + i : NULL);
            if (s) return s;
        }
    }
    return QI_OK;
}

/* Walk all kvs from the cursor. Pass 1 (kvs == NULL) validates and counts;
 * pass 2 fills kvs and the side tables. */
static qi_status parse_kvs(parser *ps, uint64_t n_kv, qi_gguf_kv *kvs) {
    for (uint64_t i = 0; i < n_kv; i++) {
        qi_gguf_kv tmp;
        qi_gguf_kv *kv = kvs ? &kvs[i] : &tmp;
        memset(kv, 0, sizeof *kv);
        snprintf(ps->where, sizeof ps->where, "kv %" PRIu64, i);
        qi_status s = rd_str(ps, &kv->key, "key");
        if (s) return s;
        if (kv->key.len == 0) return perr(ps, QI_ERR_FORMAT, "key is empty");
        char kname[256];
        fmt_name(kname, sizeof kname, kv->key.ptr, kv->key.len);
        snprintf(ps->where, sizeof ps->where, "kv %" PRIu64 " '%s'", i, kname);
        if ((s = rd_u32(ps, &kv->type, "value type"))) return s;
        if (kv->type >= GGUF_N_VTYPES)
            return perr(ps, QI_ERR_FORMAT, "unknown value type %" PRIu32, kv->type);
        if (kv->type == QI_GGUF_STRING) {
            s = rd_str(ps, &kv->str, "string value");
        } else if (kv->type == QI_GGUF_ARRAY) {
            arr_node *node = NULL;
            if (kvs) {
                node = ps->nodes + ps->n_nodes;
                kv->arr = node;
            }
            ps->n_nodes++;
            s = parse_array(ps, 1, node);
        } else {
            unsigned sz = vtype_size(kv->type);
            s = need(ps, sz, k_vtype_names[kv->type]);
            if (!s) {
                kv->bits = load_le(ps->p + ps->pos, sz);
                ps->pos += sz;
            }
        }
        if (s) return s;
    }
    ps->where[0] = 0;
    return QI_OK;
}

static int cmp_kv_ptr(const void *a, const void *b) {
    const qi_gguf_kv *x = *(const qi_gguf_kv *const *)a, *y = *(const qi_gguf_kv *const *)b;
    int c = gguf_str_cmp(x->key, y->key);
    if (c) return c;
    return x < y ? -1 : x > y; /* stable: file order among equal keys */
}

static int cmp_tensor_name(const void *a, const void *b) {
    const qi_gguf_tensor *x = *(const qi_gguf_tensor *const *)a;
    const qi_gguf_tensor *y = *(const qi_gguf_tensor *const *)b;
    int c = gguf_str_cmp(x->name, y->name);
    if (c) return c;
    return x < y ? -1 : x > y;
}

static int cmp_tensor_off(const void *a, const void *b) {
    const qi_gguf_tensor *x = *(const qi_gguf_tensor *const *)a;
    const qi_gguf_tensor *y = *(const qi_gguf_tensor *const *)b;
    if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
    return x < y ? -1 : x > y;
}

static qi_status nomem(parser *ps, const char *what) {
    return perr(ps, QI_ERR_NOMEM, "out of memory allocating %s", what);
}

static qi_status parse_header(parser *ps, qi_gguf *g, uint64_t *n_tensors, uint64_t *n_kv) {
    if (ps->size < 4)
        return perr(ps, QI_ERR_FORMAT, "truncated: %" PRIu64 " bytes is too short for a GGUF header",
                    ps->size);
    if (memcmp(ps->p, "GGUF", 4) != 0) {
        char m[64];
        fmt_name(m, sizeof m, (const char *)ps->p, 4);
        return perr(ps, QI_ERR_FORMAT, "not a GGUF file (bad magic '%s')", m);
    }
    ps->pos = 4;
    qi_status s = rd_u32(ps, &g->version, "version");
    if (s) return s;
    if (g->version == 1)
        return perr(ps, QI_ERR_UNSUPPORTED,
                    "unsupported version 1 (GGUF v1 is obsolete; only v2 and v3 are read)");
    if (g->version != 0 && (g->version & 0xffffu) == 0)
        return perr(ps, QI_ERR_UNSUPPORTED,
                    "unsupported version 0x%08" PRIx32 " (a big-endian GGUF file?)", g->version);
    if (g->version != 2 && g->version != 3)
        return perr(ps, QI_ERR_UNSUPPORTED, "unsupported version %" PRIu32 " (only v2 and v3)",
                    g->version);
    if ((s = rd_u64(ps, n_tensors, "tensor count"))) return s;
    if ((s = rd_u64(ps, n_kv, "kv count"))) return s;
    if (*n_kv > left(ps) / GGUF_MIN_KV_BYTES)
        return perr(ps, QI_ERR_FORMAT,
                    "kv count %" PRIu64 " is larger than the file (%" PRIu64 " bytes) could hold",
                    *n_kv, ps->size);
    if (*n_tensors > left(ps) / GGUF_MIN_TENSOR_BYTES)
        return perr(ps, QI_ERR_FORMAT,
                    "tensor count %" PRIu64 " is larger than the file (%" PRIu64
                    " bytes) could hold",
                    *n_tensors, ps->size);
    return QI_OK;
}

static qi_status parse_metadata(parser *ps, qi_gguf *g, uint64_t n_kv) {
    uint64_t start = ps->pos;
    qi_status s = parse_kvs(ps, n_kv, NULL);
    if (s) return s;
    /* Pass 1 proved these counts are backed by bytes of the file. */
    uint64_t n_strs = ps->n_strs, n_nodes = ps->n_nodes;
    if (n_kv && !(g->kvs = qi_calloc((size_t)n_kv, sizeof *g->kvs))) return nomem(ps, "kv table");
    if (n_kv && !(g->kv_sorted = qi_malloc((size_t)n_kv * sizeof *g->kv_sorted)))
        return nomem(ps, "kv index");
    if (n_strs && !(g->strs = qi_malloc((size_t)n_strs * sizeof *g->strs)))
        return nomem(ps, "string table");
    if (n_nodes && !(g->nodes = qi_calloc((size_t)n_nodes, sizeof *g->nodes)))
        return nomem(ps, "array table");
    g->n_kv = n_kv;
    ps->pos = start;
    ps->fill = true;
    ps->n_strs = ps->n_nodes = 0;
    ps->strs = g->strs;
    ps->nodes = g->nodes;
    if ((s = parse_kvs(ps, n_kv, g->kvs))) return s;
    QI_ASSERT(ps->n_strs == n_strs && ps->n_nodes == n_nodes);

    for (uint64_t i = 0; i < n_kv; i++) g->kv_sorted[i] = &g->kvs[i];
    if (n_kv > 1) qsort(g->kv_sorted, (size_t)n_kv, sizeof *g->kv_sorted, cmp_kv_ptr);
    for (uint64_t i = 1; i < n_kv; i++) {
        const qi_gguf_kv *a = g->kv_sorted[i - 1], *b = g->kv_sorted[i];
        if (gguf_str_cmp(a->key, b->key) == 0) {
            char k[256];
            fmt_name(k, sizeof k, a->key.ptr, a->key.len);
            return perr(ps, QI_ERR_FORMAT, "duplicate key '%s' (kv %td and kv %td)", k,
                        a - g->kvs, b - g->kvs);
        }
    }

    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    const qi_gguf_kv *al = qi_gguf_kv_find(g, "general.alignment");
    if (al) {
        if (al->type != QI_GGUF_U32)
            return perr(ps, QI_ERR_FORMAT, "general.alignment has type %s, expected u32",
                        qi_gguf_vtype_name(al->type));
        uint64_t a = al->bits;
        if (a == 0 || (a & (a - 1)) != 0)
            return perr(ps, QI_ERR_FORMAT, "general.alignment %" PRIu64 " is not a power of two",
                        a);
        g->alignment = a;
    }
    return QI_OK;
}

static qi_status parse_tensor_info(parser *ps, qi_gguf *g, uint64_t i) {
    qi_gguf_tensor *t = &g->tensors[i];
    snprintf(ps->where, sizeof ps->where, "tensor %" PRIu64, i);
    qi_status s = rd_str(ps, &t->name, "tensor name");
    if (s) return s;
    char tname[256];
    fmt_name(tname, sizeof tname, t->name.ptr, t->name.len);
    snprintf(ps->where, sizeof ps->where, "tensor %" PRIu64 " '%s'", i, tname);
    if ((s = rd_u32(ps, &t->n_dims, "n_dims"))) return s;
    if (t->n_dims == 0 || t->n_dims > 4)
        return perr(ps, QI_ERR_FORMAT, "n_dims %" PRIu32 " is out of range (1..4)", t->n_dims);
    uint64_t n_el = 1;
    for (uint32_t d = 0; d < 4; d++) t->ne[d] = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        if ((s = rd_u64(ps, &t->ne[d], "dimension"))) return s;
        if (t->ne[d] == 0) return perr(ps, QI_ERR_FORMAT, "dimension %" PRIu32 " is zero", d);
        /* Element counts must fit int64 (what ggml and our shapes use). */
        if (n_el > (uint64_t)INT64_MAX / t->ne[d])
            return perr(ps, QI_ERR_FORMAT,
                        "dimensions [%" PRIu64 ", %" PRIu64 ", %" PRIu64 ", %" PRIu64
                        "] overflow the element count",
                        t->ne[0], t->ne[1], t->ne[2], t->ne[3]);
        n_el *= t->ne[d];
    }
    if ((s = rd_u32(ps, &t->type, "tensor type"))) return s;
    const qi_type_info *ti = qi_type_get(t->type);
    if (!ti) return perr(ps, QI_ERR_UNSUPPORTED, "unknown tensor type %" PRIu32, t->type);
    if (t->ne[0] % ti->blck)
        return perr(ps, QI_ERR_FORMAT,
                    "ne[0] = %" PRIu64 " is not a multiple of the %s block size %" PRIu32,
                    t->ne[0], ti->name, ti->blck);
    uint64_t row, rows = n_el / t->ne[0];
    if (!qi_type_row_bytes(t->type, t->ne[0], &row) || row > UINT64_MAX / rows)
        return perr(ps, QI_ERR_FORMAT, "size in bytes overflows");
    t->n_bytes = row * rows;
    if ((s = rd_u64(ps, &t->offset, "tensor offset"))) return s;
    if (t->offset % g->alignment)
        return perr(ps, QI_ERR_FORMAT,
                    "data offset %" PRIu64 " is not aligned to %" PRIu64 " bytes", t->offset,
                    g->alignment);
    return QI_OK;
}

static qi_status parse_tensors(parser *ps, qi_gguf *g, uint64_t n_tensors) {
    if (n_tensors > left(ps) / GGUF_MIN_TENSOR_BYTES)
        return perr(ps, QI_ERR_FORMAT,
                    "tensor count %" PRIu64 " is larger than the rest of the file could hold",
                    n_tensors);
    if (!n_tensors) {
        g->data_off = ps->pos;
        return QI_OK;
    }
    if (!(g->tensors = qi_calloc((size_t)n_tensors, sizeof *g->tensors)))
        return nomem(ps, "tensor table");
    if (!(g->t_sorted = qi_malloc((size_t)n_tensors * sizeof *g->t_sorted)))
        return nomem(ps, "tensor index");
    g->n_tensors = n_tensors;
    qi_status s;
    for (uint64_t i = 0; i < n_tensors; i++)
        if ((s = parse_tensor_info(ps, g, i))) return s;
    ps->where[0] = 0;

    /* pos <= size (< 2^63 in practice) and alignment <= 2^31: no overflow. */
    g->data_off = (ps->pos + g->alignment - 1) / g->alignment * g->alignment;
    if (g->data_off > ps->size)
        return perr(ps, QI_ERR_FORMAT,
                    "truncated: data section at offset %" PRIu64 " starts past end of file (%" PRIu64
                    " bytes)",
                    g->data_off, ps->size);
    uint64_t room = ps->size - g->data_off;
    bool shapes = false;
    if (qi_gguf_kv_find(g, "qinfer.shapes_only") && (!qi_gguf_get_bool(g, "qinfer.shapes_only", &shapes)))
        return perr(ps, QI_ERR_FORMAT, "qinfer.shapes_only is not a bool");
    const uint8_t *data = ps->p + g->data_off;
    if (shapes) {
        /* no data section: the tensors address a reservation of its size
         * that no one may read (a simulated device never does) */
        uint64_t end = 0;
        for (uint64_t i = 0; i < n_tensors; i++) {
            const qi_gguf_tensor *t = &g->tensors[i];
            if (t->n_bytes > (UINT64_C(1) << 50) || t->offset > (UINT64_C(1) << 50))
                return perr(ps, QI_ERR_FORMAT, "shapes-only tensor %" PRIu64 " past 2^50 bytes", i);
            if (t->offset + t->n_bytes > end) end = t->offset + t->n_bytes;
        }
        room = end;
        g->shapes_len = end ? (size_t)end : 1;
        g->shapes_map = mmap(NULL, g->shapes_len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (g->shapes_map == MAP_FAILED) {
            g->shapes_map = NULL;
            return perr(ps, QI_ERR_NOMEM, "cannot reserve %" PRIu64 " bytes of address space for a shapes-only model",
                        end);
        }
        data = g->shapes_map;
    }
    for (uint64_t i = 0; i < n_tensors; i++) {
        qi_gguf_tensor *t = &g->tensors[i];
        if (t->offset > room || t->n_bytes > room - t->offset) {
            char tname[256];
            fmt_name(tname, sizeof tname, t->name.ptr, t->name.len);
            return perr(ps, QI_ERR_FORMAT,
                        "tensor %" PRIu64 " '%s': data (offset %" PRIu64 ", %" PRIu64
                        " bytes) runs past end of file",
                        i, tname, t->offset, t->n_bytes);
        }
        t->data = data + t->offset;
    }

    for (uint64_t i = 0; i < n_tensors; i++) g->t_sorted[i] = &g->tensors[i];
    qsort(g->t_sorted, (size_t)n_tensors, sizeof *g->t_sorted, cmp_tensor_name);
    for (uint64_t i = 1; i < n_tensors; i++) {
        const qi_gguf_tensor *a = g->t_sorted[i - 1], *b = g->t_sorted[i];
        if (gguf_str_cmp(a->name, b->name) == 0) {
            char tname[256];
            fmt_name(tname, sizeof tname, a->name.ptr, a->name.len);
            return perr(ps, QI_ERR_FORMAT, "duplicate tensor name '%s' (tensors %td and %td)",
                        tname, a - g->tensors, b - g->tensors);
        }
    }

    if (n_tensors > 1) {
        const qi_gguf_tensor **by_off = qi_malloc((size_t)n_tensors * sizeof *by_off);
        if (!by_off) return nomem(ps, "tensor offset index");
        memcpy(by_off, g->t_sorted, (size_t)n_tensors * sizeof *by_off);
        qsort(by_off, (size_t)n_tensors, sizeof *by_off, cmp_tensor_off);
        s = QI_OK;
        for (uint64_t i = 1; i < n_tensors && !s; i++) {
            const qi_gguf_tensor *a = by_off[i - 1], *b = by_off[i];
            if (a->offset + a->n_bytes > b->offset) {
                char an[256], bn[256];
                fmt_name(an, sizeof an, a->name.ptr, a->name.len);
                fmt_name(bn, sizeof bn, b->name.ptr, b->name.len);
                s = perr(ps, QI_ERR_FORMAT,
                         "tensor %td '%s' (offset %" PRIu64 ", %" PRIu64
                         " bytes) overlaps tensor %td '%s' (offset %" PRIu64 ")",
                         a - g->tensors, an, a->offset, a->n_bytes, b - g->tensors, bn,
                         b->offset);
            }
        }
        qi_free(by_off);
        if (s) return s;
    }
    return QI_OK;
}

/* Takes ownership of `map` (munmapped by qi_gguf_close, also on failure). */
static qi_status open_common(const uint8_t *buf, uint64_t len, void *map, size_t map_len,
                             const char *name, qi_gguf **out, qi_err *err) {
    qi_gguf *g = qi_calloc(1, sizeof *g);
    if (!g) {
        if (map) munmap(map, map_len);
        return QI_ERR(err, QI_ERR_NOMEM, "%s: out of memory", name);
    }
    g->map = map;
    g->map_len = map_len;
    g->base = buf;
    g->size = len;
    size_t nl = strlen(name);
    if (!(g->path = qi_malloc(nl + 1))) {
        qi_gguf_close(g);
        return QI_ERR(err, QI_ERR_NOMEM, "%s: out of memory", name);
    }
    memcpy(g->path, name, nl + 1);

    parser ps;
    memset(&ps, 0, sizeof ps);
    ps.p = buf;
    ps.size = len;
    ps.name = name;
    ps.err = err;
    uint64_t n_tensors = 0, n_kv = 0;
    qi_status s = parse_header(&ps, g, &n_tensors, &n_kv);
    if (!s) s = parse_metadata(&ps, g, n_kv);
    if (!s) s = parse_tensors(&ps, g, n_tensors);
    if (s) {
        qi_gguf_close(g);
        return s;
    }
    *out = g;
    return QI_OK;
}

qi_status qi_gguf_open_memory(const void *buf, size_t len, const char *name, qi_gguf **out,
                              qi_err *err) {
    if (!name) name = "<memory>";
    if (!out) return QI_ERR(err, QI_ERR_INVALID, "%s: qi_gguf_open_memory: out is NULL", name);
    *out = NULL;
    if (!buf && len) return QI_ERR(err, QI_ERR_INVALID, "%s: buffer is NULL", name);
    static const uint8_t empty[1];
    return open_common(buf ? buf : empty, len, NULL, 0, name, out, err);
}

qi_status qi_gguf_open(const char *path, qi_gguf **out, qi_err *err) {
    if (!out) return QI_ERR(err, QI_ERR_INVALID, "qi_gguf_open: out is NULL");
    *out = NULL;
    if (!path) return QI_ERR(err, QI_ERR_INVALID, "qi_gguf_open: path is NULL");
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return QI_ERR(err, QI_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return QI_ERR(err, QI_ERR_IO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return QI_ERR(err, QI_ERR_IO, "%s: not a regular file", path);
    }
    if ((uint64_t)st.st_size > SIZE_MAX) {
        close(fd);
        return QI_ERR(err, QI_ERR_IO, "%s: file too large to map", path);
    }
    size_t len = (size_t)st.st_size;
    void *map = NULL;
    if (len) {
        map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            int e = errno;
            close(fd);
            return QI_ERR(err, QI_ERR_IO, "%s: cannot mmap: %s", path, strerror(e));
        }
    }
    close(fd); /* the mapping keeps the file alive */
    static const uint8_t empty[1];
    return open_common(map ? map : empty, len, map, len, path, out, err);
}

void qi_gguf_close(qi_gguf *g) {
    if (!g) return;
    if (g->map) munmap(g->map, g->map_len);
    if (g->shapes_map) munmap(g->shapes_map, g->shapes_len);
    qi_free(g->path);
    qi_free(g->kvs);
    qi_free(g->kv_sorted);
    qi_free(g->strs);
    qi_free(g->nodes);
    qi_free(g->tensors);
    qi_free(g->t_sorted);
    qi_free(g);
}

/* gguf.h - GGUF v2/v3 reader (mmap, fully validated) and writer.
 *
 * The reader maps the file read-only and validates the whole header, every
 * metadata value (nested arrays included) and every tensor record before
 * returning: afterwards every accessor is bounds-safe and never touches bytes
 * outside the mapping. Strings returned are views into the mapping (not NUL
 * terminated) and live as long as the qi_gguf.
 *
 * The writer builds files in memory (used by tests to make tiny models with
 * random weights, and by the fuzzer as a seed generator).
 */
#ifndef QINFER_GGUF_H
#define QINFER_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "qinfer/status.h"
#include "qinfer/types.h"

typedef enum {
    QI_GGUF_U8 = 0,
    QI_GGUF_I8 = 1,
    QI_GGUF_U16 = 2,
    QI_GGUF_I16 = 3,
    QI_GGUF_U32 = 4,
    QI_GGUF_I32 = 5,
    QI_GGUF_F32 = 6,
    QI_GGUF_BOOL = 7,
    QI_GGUF_STRING = 8,
    QI_GGUF_ARRAY = 9,
    QI_GGUF_U64 = 10,
    QI_GGUF_I64 = 11,
    QI_GGUF_F64 = 12,
} qi_gguf_vtype;

typedef struct {
    const char *ptr; /* into the mapping; not NUL-terminated */
    uint64_t len;
} qi_str;

/* An array value. Elements are read with the qi_gguf_arr_* accessors, which
 * check the index and element type. For arrays of arrays, qi_gguf_arr_arr
 * gives the i-th inner array. */
typedef struct {
    qi_gguf_vtype type; /* element type */
    uint64_t n;         /* element count */
    const void *impl_;  /* reader-private */
} qi_gguf_arr;

typedef struct qi_gguf_kv qi_gguf_kv; /* opaque metadata entry */

typedef struct {
    qi_str name;
    uint32_t n_dims;  /* 1..4 */
    uint64_t ne[4];   /* ne[0] is the contiguous dimension; unused dims = 1 */
    uint32_t type;    /* qi_type */
    uint64_t offset;  /* from the start of the data section */
    uint64_t n_bytes; /* validated: fits the file, no overlap */
    const void *data; /* into the mapping */
} qi_gguf_tensor;

typedef struct qi_gguf qi_gguf;

/* Arrays may nest (arrays of arrays) at most this deep; deeper files are
 * rejected at open. */
#define QI_GGUF_MAX_DEPTH 8u

/* Open, map and validate. On failure *out is NULL and err names the file and
 * the problem (e.g. "model.gguf: tensor 3 'blk.0.attn_q.weight': data runs past
 * end of file"). */
qi_status qi_gguf_open(const char *path, qi_gguf **out, qi_err *err);
/* Same over a caller-owned buffer that must outlive the qi_gguf; `name` is
 * used in messages. */
qi_status qi_gguf_open_memory(const void *buf, size_t len, const char *name,
                              qi_gguf **out, qi_err *err);
void qi_gguf_close(qi_gguf *g); /* NULL is a no-op */

uint32_t qi_gguf_version(const qi_gguf *g);
uint64_t qi_gguf_alignment(const qi_gguf *g);
uint64_t qi_gguf_file_size(const qi_gguf *g);
const char *qi_gguf_path(const qi_gguf *g);
/* Whether g is a read-only mapping of a file (qi_gguf_open), not memory the
 * caller gave (qi_gguf_open_memory). */
bool qi_gguf_mapped(const qi_gguf *g);
/* File offset of the data section (tensor offsets are relative to it). */
uint64_t qi_gguf_data_offset(const qi_gguf *g);
/* A shapes-only file: metadata and tensor infos without the data section
 * (the key qinfer.shapes_only = true; `qinfer synth --shapes-only`), for
 * the simulated devices, which time ops from shapes and never read
 * weights. Its tensors' data pointers address reserved, inaccessible
 * memory of the data section's size, so any read of them faults at once
 * rather than computing on garbage. */
bool qi_gguf_shapes_only(const qi_gguf *g);

/* Metadata. */
uint64_t qi_gguf_n_kv(const qi_gguf *g);
const qi_gguf_kv *qi_gguf_kv_at(const qi_gguf *g, uint64_t i);
const qi_gguf_kv *qi_gguf_kv_find(const qi_gguf *g, const char *key); /* NULL if absent */
qi_str qi_gguf_kv_key(const qi_gguf_kv *kv);
qi_gguf_vtype qi_gguf_kv_type(const qi_gguf_kv *kv);
const char *qi_gguf_vtype_name(uint32_t t); /* "u32", "string", "array", ...; "?" if unknown */

/* Typed getters by key: return false (and leave *out alone) when the key is
 * missing or its value has an incompatible type. Integer getters accept any
 * integer type (and bool) whose value fits; f64 accepts any numeric type
 * (integers and floats, not bool); bool, str and arr accept only their own
 * type. */
bool qi_gguf_get_i64(const qi_gguf *g, const char *key, int64_t *out);
bool qi_gguf_get_u64(const qi_gguf *g, const char *key, uint64_t *out);
bool qi_gguf_get_f64(const qi_gguf *g, const char *key, double *out);
bool qi_gguf_get_bool(const qi_gguf *g, const char *key, bool *out);
bool qi_gguf_get_str(const qi_gguf *g, const char *key, qi_str *out);
bool qi_gguf_get_arr(const qi_gguf *g, const char *key, qi_gguf_arr *out);

/* Same, on an entry already found. */
bool qi_gguf_kv_i64(const qi_gguf_kv *kv, int64_t *out);
bool qi_gguf_kv_u64(const qi_gguf_kv *kv, uint64_t *out);
bool qi_gguf_kv_f64(const qi_gguf_kv *kv, double *out);
bool qi_gguf_kv_bool(const qi_gguf_kv *kv, bool *out);
bool qi_gguf_kv_str(const qi_gguf_kv *kv, qi_str *out);
bool qi_gguf_kv_arr(const qi_gguf_kv *kv, qi_gguf_arr *out);

/* Array elements: false on index out of range or element type mismatch
 * (integer/float coercions as for the getters above). O(1) for every type,
 * string arrays included (the reader indexes them at open). */
bool qi_gguf_arr_i64(const qi_gguf_arr *a, uint64_t i, int64_t *out);
bool qi_gguf_arr_u64(const qi_gguf_arr *a, uint64_t i, uint64_t *out);
bool qi_gguf_arr_f64(const qi_gguf_arr *a, uint64_t i, double *out);
bool qi_gguf_arr_str(const qi_gguf_arr *a, uint64_t i, qi_str *out);
bool qi_gguf_arr_arr(const qi_gguf_arr *a, uint64_t i, qi_gguf_arr *out);

/* Tensors. */
uint64_t qi_gguf_n_tensors(const qi_gguf *g);
const qi_gguf_tensor *qi_gguf_tensor_at(const qi_gguf *g, uint64_t i);
const qi_gguf_tensor *qi_gguf_tensor_find(const qi_gguf *g, const char *name);

/* qi_str helpers. */
bool qi_str_eq(qi_str s, const char *cstr);

/* ---- Writer ---------------------------------------------------------- */

typedef struct qi_gguf_writer qi_gguf_writer;

qi_gguf_writer *qi_gguf_writer_create(void); /* NULL on OOM */
void qi_gguf_writer_free(qi_gguf_writer *w);

/* Keys are copied. Setting an existing key replaces it. */
qi_status qi_gguf_writer_set_u32(qi_gguf_writer *w, const char *key, uint32_t v);
qi_status qi_gguf_writer_set_i32(qi_gguf_writer *w, const char *key, int32_t v);
qi_status qi_gguf_writer_set_u64(qi_gguf_writer *w, const char *key, uint64_t v);
qi_status qi_gguf_writer_set_i64(qi_gguf_writer *w, const char *key, int64_t v);
qi_status qi_gguf_writer_set_f32(qi_gguf_writer *w, const char *key, float v);
qi_status qi_gguf_writer_set_f64(qi_gguf_writer *w, const char *key, double v);
qi_status qi_gguf_writer_set_bool(qi_gguf_writer *w, const char *key, bool v);
qi_status qi_gguf_writer_set_str(qi_gguf_writer *w, const char *key, const char *v);
/* Array of a fixed-size element type (not STRING/ARRAY); data is n packed
 * little-endian elements, copied. */
qi_status qi_gguf_writer_set_arr(qi_gguf_writer *w, const char *key, qi_gguf_vtype elem,
                                 const void *data, uint64_t n);
qi_status qi_gguf_writer_set_arr_str(qi_gguf_writer *w, const char *key,
                                     const char *const *strs, uint64_t n);
/* A value of any type given as its exact on-disk encoding (for ARRAY: u32
 * element type, u64 count, elements; nested arrays encoded the same way). The
 * bytes are copied but NOT validated: this is how tests write u8/i8/u16/i16
 * scalars, nested arrays and deliberately malformed values. */
qi_status qi_gguf_writer_set_raw(qi_gguf_writer *w, const char *key, uint32_t type,
                                 const void *value, size_t n_bytes);
/* A tensor: data (n_bytes, must equal the size implied by type and ne) is
 * copied; NULL data means zero-filled. Every ne[d] must be nonzero (the reader
 * rejects empty tensors) and the name unique, else QI_ERR_INVALID. */
qi_status qi_gguf_writer_add_tensor(qi_gguf_writer *w, const char *name, uint32_t type,
                                    uint32_t n_dims, const uint64_t *ne, const void *data,
                                    uint64_t n_bytes);
/* A tensor's info alone, for a shapes-only file: n_bytes as for add_tensor,
 * no data held. A writer with any such tensor writes no data section and
 * must have qinfer.shapes_only set true (to_memory refuses otherwise). */
qi_status qi_gguf_writer_add_tensor_shape(qi_gguf_writer *w, const char *name, uint32_t type,
                                          uint32_t n_dims, const uint64_t *ne, uint64_t n_bytes);
/* Serialise (version 2 or 3; alignment from "general.alignment" if set,
 * else 32). *buf is qi_malloc'ed; caller frees with qi_free. */
qi_status qi_gguf_writer_to_memory(const qi_gguf_writer *w, uint32_t version, void **buf,
                                   size_t *len, qi_err *err);
qi_status qi_gguf_writer_to_file(const qi_gguf_writer *w, uint32_t version, const char *path,
                                 qi_err *err);

#endif

/* gguf_read.h - the tables the GGUF reader (gguf.c) builds at open and its
 * accessors (gguf_get.c) hand out views into. Private to those two files. */
#ifndef QI_GGUF_READ_H
#define QI_GGUF_READ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "qinfer/gguf.h"

typedef struct arr_node {
    uint32_t type;               /* element type */
    uint64_t n;                  /* element count */
    const uint8_t *data;         /* fixed-size elements, packed, in the mapping */
    const qi_str *strs;          /* STRING elements: n entries of the string table */
    const struct arr_node *subs; /* ARRAY elements: n consecutive child nodes */
} arr_node;

struct qi_gguf_kv {
    qi_str key;
    uint32_t type;
    uint64_t bits;       /* fixed-size scalars: raw little-endian bits */
    qi_str str;          /* STRING */
    const arr_node *arr; /* ARRAY */
};

struct qi_gguf {
    char *path;
    const uint8_t *base;
    uint64_t size;
    void *map; /* non-NULL when we own an mmap of map_len bytes */
    size_t map_len;
    uint32_t version;
    uint64_t alignment;
    uint64_t data_off; /* file offset of the data section */
    void *shapes_map;  /* a shapes-only file: the reserved, inaccessible data section */
    size_t shapes_len;

    uint64_t n_kv;
    qi_gguf_kv *kvs;
    const qi_gguf_kv **kv_sorted; /* by key */
    qi_str *strs;                 /* all string-array elements */
    arr_node *nodes;              /* all array nodes */

    uint64_t n_tensors;
    qi_gguf_tensor *tensors;
    const qi_gguf_tensor **t_sorted; /* by name */
};

/* Byte order of two names, shorter first on a common prefix: the order the
 * key and tensor tables are sorted in and searched by. */
static inline int gguf_str_cmp(qi_str a, qi_str b) {
    uint64_t n = a.len < b.len ? a.len : b.len;
    int c = n ? memcmp(a.ptr, b.ptr, (size_t)n) : 0;
    if (c) return c;
    return a.len < b.len ? -1 : a.len > b.len;
}

#endif

/* gguf_test.h - the parts of test_gguf (see test_gguf.c): what util.c shares and
 * what each part adds to the suite. */
#ifndef QI_GGUF_TEST_H
#define QI_GGUF_TEST_H

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "qinfer/gguf.h"
#include "testutil.h"

typedef struct {
    unsigned char *p;
    size_t n, cap;
} bb;
typedef struct {
    const char *name;
    uint32_t type, n_dims;
    uint64_t ne[4];
} tspec;
#define expect_fail(b, code_, needle) expect_fail_((b)->p, (b)->n, (code_), (needle), __LINE__)

/* util.c */
extern const tspec k_tensors[];
extern const size_t n_k_tensors; /* entries of k_tensors */
#define N_TENSORS n_k_tensors
void bb_put(bb *b, const void *d, size_t n);
void bb_le(bb *b, uint64_t v, unsigned n);
void bb_u32(bb *b, uint32_t v);
void bb_u64(bb *b, uint64_t v);
void bb_strn(bb *b, const char *s, size_t n);
void bb_str(bb *b, const char *s);
void bb_hdr(bb *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv);
void bb_kv_u32(bb *b, const char *key, uint32_t v);
void bb_tinfo(bb *b, const char *name, uint32_t n_dims, const uint64_t *ne, uint32_t type, uint64_t offset);
void bb_pad(bb *b, size_t align);
void bb_zeros(bb *b, size_t n);
void bb_free(bb *b);
qi_status open_copy(const void *p, size_t n, qi_gguf **g, qi_err *e, void **keep);
void expect_fail_(const void *p, size_t n, qi_status code, const char *needle, int line);
qi_gguf *open_ok(const void *p, size_t n, void **keep);
void close_kept(qi_gguf *g, void *keep);
void ok(qi_status s);
bool qs_eq(qi_str s, const char *p, size_t n);
void set_raw_le(qi_gguf_writer *w, const char *key, uint32_t type, uint64_t v, unsigned n);
void build_nested(bb *b);
unsigned char *pattern(uint64_t n, uint64_t seed);
uint64_t spec_bytes(const tspec *t);
void fill_rich(qi_gguf_writer *w, uint32_t align);
void write_rich(uint32_t version, uint32_t align, void **buf, size_t *len);
void check_rich(qi_gguf *g, uint32_t version, uint32_t align, const void *buf);

void gguf_roundtrip_add(TCase *tc); /* round trips through the writer and the reader, and the getters' coercions. */
void gguf_valid_add(TCase *tc); /* validation: one bad file per rule. */

#endif

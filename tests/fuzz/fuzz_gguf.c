/* fuzz_gguf.c - deterministic mutation fuzzer for the GGUF reader.
 *
 * usage: fuzz_gguf --iterations N --seed S [--verbose] [--help]
 *
 * Seeds come from the writer (every value type, nested and string arrays,
 * tensors of several types, several alignments, both versions) plus, when the
 * SmolLM2 model is cached, its first 2 MiB (header and vocabulary, cut short
 * of the data section). Each case applies a few random mutations: bit flips,
 * random bytes, "interesting" integers (0, 1, 0x7fffffff, 0xffffffff,
 * UINT64_MAX, large counts) written either anywhere or into a known header
 * field (lengths, counts, types, dims, offsets - found by opening the seed
 * with the reader), truncation, and chunk insertion, deletion and
 * duplication.
 *
 * Every case is opened from an exactly-sized heap copy (so ASan flags any
 * overread) and every 50th also through a temp file (the mmap path). An
 * accepted file is walked completely - every kv, every array element at every
 * depth, every tensor's first and last data byte - and its invariants checked
 * (tensor data inside the buffer, aligned, types known, lookups consistent).
 * A rejection must carry a nonzero status, a NULL handle and a message. Any
 * violation prints the case, saves it as fuzz_gguf_fail.gguf and exits 1.
 *
 * A plain RNG (xorshift64*) rather than libFuzzer keeps this a normal ctest
 * program that any compiler builds; the structure-aware "field" mutation
 * makes up for most of what coverage guidance would find in a format this
 * shallow.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "qinfer/gguf.h"

/* ---- RNG --------------------------------------------------------------------- */

static uint64_t g_rng;

static uint64_t rnd(void) {
    uint64_t x = g_rng;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    g_rng = x;
    return x * 0x2545F4914F6CDD1Dull;
}

static uint64_t rnd_below(uint64_t n) { return n ? rnd() % n : 0; }

/* ---- Buffers ----------------------------------------------------------------- */

typedef struct {
    unsigned char *p;
    size_t n, cap;
} buf;

static void die_oom(void) {
    fprintf(stderr, "fuzz_gguf: out of memory\n");
    exit(1);
}

static void buf_reserve(buf *b, size_t n) {
    if (n <= b->cap) return;
    size_t nc = b->cap ? b->cap : 4096;
    while (nc < n) nc *= 2;
    unsigned char *p = realloc(b->p, nc);
    if (!p) die_oom();
    b->p = p;
    b->cap = nc;
}

static void buf_set(buf *b, const void *d, size_t n) {
    buf_reserve(b, n);
    if (n) memcpy(b->p, d, n);
    b->n = n;
}

/* A field the mutator may overwrite: offset and width (4 or 8). */
typedef struct {
    size_t off;
    unsigned width;
} field;

typedef struct {
    char what[64];
    unsigned char *p;
    size_t n;
    field *fields;
    size_t n_fields, cap_fields;
} seed;

static void add_field(seed *s, size_t off, unsigned width) {
    if (off + width > s->n) return;
    if (s->n_fields == s->cap_fields) {
        size_t nc = s->cap_fields ? s->cap_fields * 2 : 64;
        field *f = realloc(s->fields, nc * sizeof *f);
        if (!f) die_oom();
        s->fields = f;
        s->cap_fields = nc;
    }
    s->fields[s->n_fields++] = (field){off, width};
}

/* ---- Seed construction -------------------------------------------------------- */

static void le(buf *b, uint64_t v, unsigned n) {
    buf_reserve(b, b->n + n);
    for (unsigned i = 0; i < n; i++) b->p[b->n++] = (unsigned char)(v >> (8 * i));
}

static void lestr(buf *b, const char *s) {
    size_t n = strlen(s);
    le(b, n, 8);
    buf_reserve(b, b->n + n);
    memcpy(b->p + b->n, s, n);
    b->n += n;
}

static void check_ok(qi_status s, const char *what) {
    if (s != QI_OK) {
        fprintf(stderr, "fuzz_gguf: seed writer failed at %s: %s\n", what, qi_status_str(s));
        exit(1);
    }
}

/* Nested array value: depth levels, mixing element types at each level. */
static void nested_value(buf *b, unsigned depth) {
    if (depth <= 1) {
        le(b, QI_GGUF_STRING, 4);
        le(b, 3, 8);
        lestr(b, "alpha");
        lestr(b, "");
        lestr(b, "\xe2\x96\x81x");
        return;
    }
    le(b, QI_GGUF_ARRAY, 4);
    le(b, 3, 8);
    nested_value(b, depth - 1);
    le(b, QI_GGUF_I16, 4);
    le(b, 2, 8);
    le(b, 0x8000, 2);
    le(b, 0x7fff, 2);
    le(b, QI_GGUF_ARRAY, 4);
    le(b, 0, 8);
}

static void add_tensor(qi_gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                       uint64_t ne0, uint64_t ne1, uint64_t ne2, uint64_t ne3) {
    uint64_t ne[4] = {ne0, ne1, ne2, ne3}, row;
    if (!qi_type_row_bytes(type, ne0, &row)) check_ok(QI_ERR_INVALID, name);
    uint64_t n = row;
    for (uint32_t d = 1; d < n_dims; d++) n *= ne[d];
    unsigned char *data = malloc(n);
    if (!data) die_oom();
    for (uint64_t i = 0; i < n; i++) data[i] = (unsigned char)rnd();
    check_ok(qi_gguf_writer_add_tensor(w, name, type, n_dims, ne, data, n), name);
    free(data);
}

static void seed_from_writer(seed *s, const char *what, qi_gguf_writer *w, uint32_t version) {
    void *p;
    size_t n;
    qi_err e = {0};
    if (qi_gguf_writer_to_memory(w, version, &p, &n, &e) != QI_OK) {
        fprintf(stderr, "fuzz_gguf: seed %s: %s\n", what, e.msg);
        exit(1);
    }
    snprintf(s->what, sizeof s->what, "%s", what);
    s->p = malloc(n ? n : 1);
    if (!s->p) die_oom();
    memcpy(s->p, p, n);
    s->n = n;
    qi_free(p);
    qi_gguf_writer_free(w);
}

static qi_gguf_writer *new_writer(void) {
    qi_gguf_writer *w = qi_gguf_writer_create();
    if (!w) die_oom();
    return w;
}

static void build_rich(seed *s, uint32_t version, uint32_t align) {
    qi_gguf_writer *w = new_writer();
    if (align) check_ok(qi_gguf_writer_set_u32(w, "general.alignment", align), "alignment");
    check_ok(qi_gguf_writer_set_str(w, "general.architecture", "llama"), "arch");
    check_ok(qi_gguf_writer_set_raw(w, "v.u8", QI_GGUF_U8, "\xc8", 1), "u8");
    check_ok(qi_gguf_writer_set_raw(w, "v.i8", QI_GGUF_I8, "\xfb", 1), "i8");
    check_ok(qi_gguf_writer_set_raw(w, "v.u16", QI_GGUF_U16, "\xff\xff", 2), "u16");
    check_ok(qi_gguf_writer_set_raw(w, "v.i16", QI_GGUF_I16, "\x00\x80", 2), "i16");
    check_ok(qi_gguf_writer_set_u32(w, "llama.block_count", 2), "u32");
    check_ok(qi_gguf_writer_set_i32(w, "v.i32", -7), "i32");
    check_ok(qi_gguf_writer_set_f32(w, "llama.rope.freq_base", 10000.0f), "f32");
    check_ok(qi_gguf_writer_set_bool(w, "v.bool", true), "bool");
    check_ok(qi_gguf_writer_set_u64(w, "v.u64", UINT64_MAX), "u64");
    check_ok(qi_gguf_writer_set_i64(w, "v.i64", INT64_MIN), "i64");
    check_ok(qi_gguf_writer_set_f64(w, "v.f64", 0.125), "f64");
    int32_t ti[6] = {1, 2, 3, -4, 5, 6};
    check_ok(qi_gguf_writer_set_arr(w, "tokenizer.ggml.token_type", QI_GGUF_I32, ti, 6), "arr");
    double fd[2] = {1.0, -2.0};
    check_ok(qi_gguf_writer_set_arr(w, "a.f64", QI_GGUF_F64, fd, 2), "arr f64");
    uint8_t bo[3] = {1, 0, 1};
    check_ok(qi_gguf_writer_set_arr(w, "a.bool", QI_GGUF_BOOL, bo, 3), "arr bool");
    const char *toks[] = {"<s>", "</s>", "\xc4\xa0the", "", "a", "bb"};
    check_ok(qi_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, 6), "tokens");
    const char *merges[] = {"\xc4\xa0 t", "h e"};
    check_ok(qi_gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", merges, 2), "merges");
    buf nb = {0};
    nested_value(&nb, 3);
    check_ok(qi_gguf_writer_set_raw(w, "a.nested", QI_GGUF_ARRAY, nb.p, nb.n), "nested");
    free(nb.p);
    add_tensor(w, "token_embd.weight", QI_TYPE_Q8_0, 2, 64, 6, 1, 1);
    add_tensor(w, "blk.0.attn_norm.weight", QI_TYPE_F32, 1, 64, 1, 1, 1);
    add_tensor(w, "blk.0.attn_q.weight", QI_TYPE_Q4_1, 2, 64, 64, 1, 1);
    add_tensor(w, "blk.0.ffn_down.weight", QI_TYPE_Q4_K, 2, 256, 2, 1, 1);
    add_tensor(w, "f16.3d", QI_TYPE_F16, 3, 3, 5, 2, 1);
    add_tensor(w, "q6k.4d", QI_TYPE_Q6_K, 4, 256, 1, 1, 2);
    add_tensor(w, "i8", QI_TYPE_I8, 1, 3, 1, 1, 1);
    char what[64];
    snprintf(what, sizeof what, "rich v%u align %u", version, align ? align : 32);
    seed_from_writer(s, what, w, version);
}

static void build_many_tensors(seed *s) {
    qi_gguf_writer *w = new_writer();
    check_ok(qi_gguf_writer_set_u32(w, "general.alignment", 16), "alignment");
    static const uint32_t types[] = {QI_TYPE_F32,  QI_TYPE_F16,  QI_TYPE_Q4_0, QI_TYPE_Q4_1,
                                     QI_TYPE_Q5_0, QI_TYPE_Q5_1, QI_TYPE_Q8_0, QI_TYPE_Q8_1,
                                     QI_TYPE_BF16, QI_TYPE_I16,  QI_TYPE_I64,  QI_TYPE_F64};
    for (unsigned i = 0; i < 24; i++) {
        char name[32];
        snprintf(name, sizeof name, "blk.%u.w", i);
        uint32_t t = types[i % (sizeof types / sizeof types[0])];
        uint64_t ne0 = qi_type_get(t)->blck * (1 + i % 3);
        add_tensor(w, name, t, 1 + i % 4, ne0, 1 + i % 2, 1, 1);
    }
    seed_from_writer(s, "many tensors align 16", w, 3);
}

static void build_deep(seed *s) {
    qi_gguf_writer *w = new_writer();
    buf nb = {0};
    nested_value(&nb, QI_GGUF_MAX_DEPTH);
    check_ok(qi_gguf_writer_set_raw(w, "deep", QI_GGUF_ARRAY, nb.p, nb.n), "deep");
    free(nb.p);
    const char *strs[64];
    char store[64][16];
    for (int i = 0; i < 64; i++) {
        snprintf(store[i], sizeof store[i], "t%d", i);
        strs[i] = store[i];
    }
    check_ok(qi_gguf_writer_set_arr_str(w, "strings", strs, 64), "strings");
    check_ok(qi_gguf_writer_set_u32(w, "general.alignment", 1), "alignment");
    add_tensor(w, "one", QI_TYPE_F32, 1, 1, 1, 1, 1);
    add_tensor(w, "odd", QI_TYPE_I8, 1, 7, 1, 1, 1);
    seed_from_writer(s, "deep arrays align 1", w, 2);
}

static void build_empty(seed *s) { seed_from_writer(s, "empty", new_writer(), 3); }

/* First 2 MiB of the cached model, if any (no testutil in this program). */
static bool build_real(seed *s) {
    char path[1024];
    const char *c = getenv("QINFER_CACHE");
    const char *home = getenv("HOME");
    if (c && *c) snprintf(path, sizeof path, "%s/models/SmolLM2-135M-Instruct.Q4_1.gguf", c);
    else snprintf(path, sizeof path, "%s/.cache/qinfer/models/SmolLM2-135M-Instruct.Q4_1.gguf",
                  home ? home : ".");
    FILE *f = fopen(path, "rb");
    if (!f) return false;
    size_t cap = 2u << 20;
    s->p = malloc(cap);
    if (!s->p) die_oom();
    s->n = fread(s->p, 1, cap, f);
    fclose(f);
    snprintf(s->what, sizeof s->what, "SmolLM2 first 2 MiB");
    return s->n > 24;
}

/* Field offsets of a seed, found by opening the intact seed with the reader
 * (for the real-model prefix, by opening a copy with the tensor count zeroed
 * and the kv count as is: the kvs all lie in the first 2 MiB). */
static void find_fields(seed *s) {
    add_field(s, 4, 4);  /* version */
    add_field(s, 8, 8);  /* tensor count */
    add_field(s, 16, 8); /* kv count */
    unsigned char *copy = malloc(s->n);
    if (!copy) die_oom();
    memcpy(copy, s->p, s->n);
    if (s->n >= 16) memset(copy + 8, 0, 8);
    qi_gguf *g = NULL;
    bool zeroed = true;
    if (qi_gguf_open_memory(s->p, s->n, s->what, &g, NULL) == QI_OK) zeroed = false;
    else if (qi_gguf_open_memory(copy, s->n, s->what, &g, NULL) != QI_OK) g = NULL;
    const unsigned char *base = zeroed ? copy : s->p;
    if (g) {
        for (uint64_t i = 0; i < qi_gguf_n_kv(g); i++) {
            const qi_gguf_kv *kv = qi_gguf_kv_at(g, i);
            qi_str k = qi_gguf_kv_key(kv);
            size_t koff = (size_t)((const unsigned char *)k.ptr - base);
            add_field(s, koff - 8, 8);           /* key length */
            add_field(s, koff + k.len, 4);       /* value type */
            size_t voff = koff + k.len + 4;
            qi_str v;
            qi_gguf_arr a;
            if (qi_gguf_kv_str(kv, &v)) add_field(s, voff, 8);
            if (qi_gguf_kv_arr(kv, &a)) {
                add_field(s, voff, 4);     /* element type */
                add_field(s, voff + 4, 8); /* count */
                for (uint64_t j = 0; j < a.n && j < 16; j++) {
                    qi_str e;
                    qi_gguf_arr in;
                    if (qi_gguf_arr_str(&a, j, &e))
                        add_field(s, (size_t)((const unsigned char *)e.ptr - base) - 8, 8);
                    if (qi_gguf_arr_arr(&a, j, &in) && qi_gguf_arr_str(&in, 0, &e)) {
                        size_t eo = (size_t)((const unsigned char *)e.ptr - base);
                        add_field(s, eo - 20, 4); /* inner element type */
                        add_field(s, eo - 16, 8); /* inner count */
                    }
                }
            }
        }
        for (uint64_t i = 0; !zeroed && i < qi_gguf_n_tensors(g); i++) {
            const qi_gguf_tensor *t = qi_gguf_tensor_at(g, i);
            size_t o = (size_t)((const unsigned char *)t->name.ptr - s->p);
            add_field(s, o - 8, 8); /* name length */
            o += t->name.len;
            add_field(s, o, 4); /* n_dims */
            o += 4;
            for (uint32_t d = 0; d < t->n_dims; d++, o += 8) add_field(s, o, 8);
            add_field(s, o, 4);     /* type */
            add_field(s, o + 4, 8); /* offset */
        }
        qi_gguf_close(g);
    }
    free(copy);
}

/* ---- Mutation ------------------------------------------------------------------ */

static const uint64_t k_interesting[] = {
    0, 1, 2, 3, 4, 7, 8, 15, 16, 31, 32, 33, 63, 64, 255, 256, 4095, 4096, 65535, 65536,
    0x7fffffffull, 0x80000000ull, 0xffffffffull, 0x100000000ull, 0x7fffffffffffffffull,
    0x8000000000000000ull, 0xffffffffffffffffull, 0xfffffffffffffff8ull, 0x0fffffffffffffffull,
    1ull << 40, 1ull << 61, 1ull << 62, 1000000, 49152,
};
#define N_INTERESTING (sizeof k_interesting / sizeof k_interesting[0])

static uint64_t interesting(void) {
    uint64_t v = k_interesting[rnd_below(N_INTERESTING)];
    switch (rnd_below(4)) {
    case 0: return v + 1;
    case 1: return v - 1;
    default: return v;
    }
}

static void put_le(buf *b, size_t off, uint64_t v, unsigned width) {
    for (unsigned i = 0; i < width && off + i < b->n; i++) b->p[off + i] = (unsigned char)(v >> (8 * i));
}

static void mutate(buf *b, const seed *s) {
    if (b->n == 0) {
        buf_reserve(b, 1);
        b->p[0] = (unsigned char)rnd();
        b->n = 1;
        return;
    }
    switch (rnd_below(10)) {
    case 0: /* bit flip */
        b->p[rnd_below(b->n)] ^= (unsigned char)(1u << rnd_below(8));
        break;
    case 1: /* random byte */
        b->p[rnd_below(b->n)] = (unsigned char)rnd();
        break;
    case 2: /* interesting integer anywhere */
        put_le(b, rnd_below(b->n), interesting(), rnd_below(2) ? 8 : 4);
        break;
    case 3:
    case 4:
    case 5: /* interesting integer, or a small tweak, into a known field */
        if (s->n_fields) {
            const field *f = &s->fields[rnd_below(s->n_fields)];
            if (f->off + f->width > b->n) break;
            uint64_t v;
            if (rnd_below(3) == 0) {
                v = 0;
                for (unsigned i = 0; i < f->width; i++) v |= (uint64_t)b->p[f->off + i] << (8 * i);
                v += rnd_below(2) ? rnd_below(64) : -(uint64_t)rnd_below(64);
            } else {
                v = interesting();
            }
            put_le(b, f->off, v, f->width);
        }
        break;
    case 6: /* truncate */
        b->n = (size_t)rnd_below(b->n);
        break;
    case 7: { /* insert random bytes */
        size_t at = (size_t)rnd_below(b->n + 1), len = (size_t)(1 + rnd_below(64));
        buf_reserve(b, b->n + len);
        memmove(b->p + at + len, b->p + at, b->n - at);
        for (size_t i = 0; i < len; i++) b->p[at + i] = (unsigned char)rnd();
        b->n += len;
        break;
    }
    case 8: { /* delete a chunk */
        size_t at = (size_t)rnd_below(b->n), len = (size_t)(1 + rnd_below(64));
        if (len > b->n - at) len = b->n - at;
        memmove(b->p + at, b->p + at + len, b->n - at - len);
        b->n -= len;
        break;
    }
    case 9: { /* duplicate a chunk somewhere else */
        size_t from = (size_t)rnd_below(b->n), len = (size_t)(1 + rnd_below(128));
        if (len > b->n - from) len = b->n - from;
        size_t at = (size_t)rnd_below(b->n + 1);
        buf_reserve(b, b->n + len);
        unsigned char tmp[128];
        memcpy(tmp, b->p + from, len);
        memmove(b->p + at + len, b->p + at, b->n - at);
        memcpy(b->p + at, tmp, len);
        b->n += len;
        break;
    }
    }
}

/* ---- Checking ------------------------------------------------------------------ */

static const unsigned char *g_case;
static size_t g_case_n;
static uint64_t g_iter;
static const char *g_tmp_path;
static volatile unsigned g_sink;

static void fail(const char *fmt, const char *detail)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 0), noreturn))
#endif
    ;

static void fail(const char *fmt, const char *detail) {
    fprintf(stderr, "fuzz_gguf: iteration %" PRIu64 ": ", g_iter);
    fprintf(stderr, fmt, detail);
    fprintf(stderr, "\nfuzz_gguf: case is %zu bytes, starting:", g_case_n);
    for (size_t i = 0; i < g_case_n && i < 64; i++) fprintf(stderr, " %02x", g_case[i]);
    fprintf(stderr, "\n");
    FILE *f = fopen("fuzz_gguf_fail.gguf", "wb");
    if (f) {
        fwrite(g_case, 1, g_case_n, f);
        fclose(f);
        fprintf(stderr, "fuzz_gguf: case (%zu bytes) saved as fuzz_gguf_fail.gguf\n", g_case_n);
    }
    if (g_tmp_path) unlink(g_tmp_path);
    exit(1);
}

static void touch(const void *p, uint64_t n) {
    if (!n) return;
    const volatile unsigned char *c = p;
    g_sink += c[0] + c[n - 1];
}

static void in_range(const void *p, uint64_t n, const unsigned char *base, size_t len,
                     const char *what) {
    const unsigned char *c = p;
    if (n == 0) return;
    if (c < base || c > base + len || n > (uint64_t)(base + len - c)) fail("%s outside the file", what);
}

static void walk_arr(const qi_gguf_arr *a, unsigned depth, const unsigned char *base, size_t len) {
    if (depth > QI_GGUF_MAX_DEPTH) fail("%s", "array nesting beyond the limit was accepted");
    int64_t i64;
    uint64_t u64;
    double f;
    qi_str s;
    qi_gguf_arr in;
    for (uint64_t i = 0; i < a->n; i++) {
        switch (a->type) {
        case QI_GGUF_STRING:
            if (!qi_gguf_arr_str(a, i, &s)) fail("%s", "string element not readable");
            in_range(s.ptr, s.len, base, len, "string element");
            touch(s.ptr, s.len);
            break;
        case QI_GGUF_ARRAY:
            if (!qi_gguf_arr_arr(a, i, &in)) fail("%s", "array element not readable");
            walk_arr(&in, depth + 1, base, len);
            break;
        default:
            if (!qi_gguf_arr_f64(a, i, &f) && a->type != QI_GGUF_BOOL)
                fail("%s", "numeric element not readable as f64");
            g_sink += qi_gguf_arr_i64(a, i, &i64) + qi_gguf_arr_u64(a, i, &u64);
            if (qi_gguf_arr_str(a, i, &s) || qi_gguf_arr_arr(a, i, &in))
                fail("%s", "numeric element readable as string/array");
        }
    }
    if (qi_gguf_arr_i64(a, a->n, &i64) || qi_gguf_arr_str(a, a->n, &s) ||
        qi_gguf_arr_arr(a, a->n, &in))
        fail("%s", "array index past the end accepted");
}

static int cmp_offset(const void *a, const void *b) {
    const qi_gguf_tensor *x = *(const qi_gguf_tensor *const *)a;
    const qi_gguf_tensor *y = *(const qi_gguf_tensor *const *)b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* Accepted tensors must not share bytes. */
static void check_no_overlap(qi_gguf *g) {
    uint64_t n = qi_gguf_n_tensors(g);
    if (n < 2) return;
    const qi_gguf_tensor **v = malloc(n * sizeof *v);
    if (!v) die_oom();
    for (uint64_t i = 0; i < n; i++) v[i] = qi_gguf_tensor_at(g, i);
    qsort(v, n, sizeof *v, cmp_offset);
    for (uint64_t i = 1; i < n; i++)
        if ((const unsigned char *)v[i - 1]->data + v[i - 1]->n_bytes >
            (const unsigned char *)v[i]->data)
            fail("%s", "overlapping tensors accepted");
    free(v);
}

static void walk(qi_gguf *g, const unsigned char *base, size_t len) {
    if (qi_gguf_file_size(g) != len) fail("%s", "file size mismatch");
    uint64_t align = qi_gguf_alignment(g);
    if (!align || (align & (align - 1))) fail("%s", "alignment not a power of two");
    for (uint64_t i = 0; i < qi_gguf_n_kv(g); i++) {
        const qi_gguf_kv *kv = qi_gguf_kv_at(g, i);
        if (!kv) fail("%s", "kv_at returned NULL");
        qi_str k = qi_gguf_kv_key(kv);
        if (k.len == 0) fail("%s", "empty key accepted");
        in_range(k.ptr, k.len, base, len, "key");
        if (k.len < 256 && !memchr(k.ptr, 0, k.len)) {
            char key[256];
            memcpy(key, k.ptr, k.len);
            key[k.len] = 0;
            if (qi_gguf_kv_find(g, key) != kv) fail("%s", "kv_find disagrees with kv_at");
        }
        int64_t i64;
        uint64_t u64;
        double f;
        bool b;
        qi_str s;
        qi_gguf_arr a;
        g_sink += qi_gguf_kv_i64(kv, &i64) + qi_gguf_kv_u64(kv, &u64) + qi_gguf_kv_f64(kv, &f) +
                  qi_gguf_kv_bool(kv, &b);
        if (qi_gguf_kv_str(kv, &s)) {
            in_range(s.ptr, s.len, base, len, "string value");
            touch(s.ptr, s.len);
        }
        if (qi_gguf_kv_arr(kv, &a)) walk_arr(&a, 1, base, len);
        if (qi_gguf_vtype_name(qi_gguf_kv_type(kv))[0] == '?') fail("%s", "unknown type accepted");
    }
    if (qi_gguf_kv_at(g, qi_gguf_n_kv(g))) fail("%s", "kv_at past the end");
    for (uint64_t i = 0; i < qi_gguf_n_tensors(g); i++) {
        const qi_gguf_tensor *t = qi_gguf_tensor_at(g, i);
        if (!t) fail("%s", "tensor_at returned NULL");
        if (t->n_dims < 1 || t->n_dims > 4) fail("%s", "bad n_dims accepted");
        if (!qi_type_get(t->type)) fail("%s", "unknown tensor type accepted");
        if (t->offset % align) fail("%s", "misaligned tensor accepted");
        if (t->n_bytes == 0) fail("%s", "empty tensor accepted");
        in_range(t->data, t->n_bytes, base, len, "tensor data");
        touch(t->data, t->n_bytes);
        in_range(t->name.ptr, t->name.len, base, len, "tensor name");
        if (t->name.len < 256 && !memchr(t->name.ptr, 0, t->name.len)) {
            char name[256];
            memcpy(name, t->name.ptr, t->name.len);
            name[t->name.len] = 0;
            if (qi_gguf_tensor_find(g, name) != t) fail("%s", "tensor_find disagrees");
        }
    }
    if (qi_gguf_tensor_at(g, qi_gguf_n_tensors(g))) fail("%s", "tensor_at past the end");
    check_no_overlap(g);
}

static void check_rejection(qi_status s, qi_gguf *g, const qi_err *e) {
    if (g) fail("%s", "handle not NULL after a failed open");
    if (e->code != s) fail("%s", "qi_err code differs from the returned status");
    if (!e->msg[0]) fail("%s", "rejection without a message");
    if (s != QI_ERR_FORMAT && s != QI_ERR_UNSUPPORTED) fail("unexpected status: %s", e->msg);
}

/* Returns true when accepted. */
static bool run_case(const unsigned char *p, size_t n, bool via_file, bool verbose) {
    unsigned char *copy = malloc(n ? n : 1);
    if (!copy) die_oom();
    if (n) memcpy(copy, p, n);
    g_case = copy;
    g_case_n = n;
    qi_gguf *g = NULL;
    qi_err e = {0};
    qi_status s = qi_gguf_open_memory(copy, n, "fuzz.gguf", &g, &e);
    bool accepted = s == QI_OK;
    if (accepted) {
        if (!g) fail("%s", "QI_OK with a NULL handle");
        walk(g, copy, n);
        qi_gguf_close(g);
    } else {
        check_rejection(s, g, &e);
        if (verbose) printf("  %" PRIu64 ": %s\n", g_iter, e.msg);
    }
    if (via_file && g_tmp_path) {
        FILE *f = fopen(g_tmp_path, "wb");
        if (!f || fwrite(copy, 1, n, f) != n || fclose(f) != 0) {
            fprintf(stderr, "fuzz_gguf: cannot write %s: %s\n", g_tmp_path, strerror(errno));
            exit(1);
        }
        qi_gguf *h = NULL;
        qi_err e2 = {0};
        qi_status s2 = qi_gguf_open(g_tmp_path, &h, &e2);
        if ((s2 == QI_OK) != accepted) fail("%s", "mmap path and memory path disagree");
        if (s2 == QI_OK) {
            /* The mapping's base, from an object at a known file offset:
             * tensor 0's data, or kv 0's key (always at offset 32). */
            const qi_gguf_tensor *t0 = qi_gguf_tensor_at(h, 0);
            const unsigned char *base = NULL;
            if (t0) base = (const unsigned char *)t0->data - qi_gguf_data_offset(h) - t0->offset;
            else if (qi_gguf_n_kv(h))
                base = (const unsigned char *)qi_gguf_kv_key(qi_gguf_kv_at(h, 0)).ptr - 32;
            if (base) walk(h, base, n);
            qi_gguf_close(h);
        } else {
            check_rejection(s2, h, &e2);
        }
    }
    free(copy);
    return accepted;
}

static void usage(FILE *f) {
    fprintf(f, "usage: fuzz_gguf --iterations N --seed S [--verbose] [--help]\n"
               "Mutation fuzzer for the GGUF reader; exits 1 on the first violation.\n");
}

int main(int argc, char **argv) {
    uint64_t iterations = 10000, seed_v = 1;
    bool verbose = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--verbose") || !strcmp(argv[i], "-v")) {
            verbose = true;
        } else if ((!strcmp(argv[i], "--iterations") || !strcmp(argv[i], "--seed")) &&
                   i + 1 < argc) {
            char *end;
            errno = 0;
            unsigned long long v = strtoull(argv[i + 1], &end, 0);
            if (errno || *end || end == argv[i + 1]) {
                fprintf(stderr, "fuzz_gguf: bad number '%s'\n", argv[i + 1]);
                return 2;
            }
            if (argv[i][2] == 'i') iterations = v;
            else seed_v = v;
            i++;
        } else {
            usage(stderr);
            return 2;
        }
    }
    g_rng = seed_v * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull;
    if (!g_rng) g_rng = 1;

    seed seeds[8];
    memset(seeds, 0, sizeof seeds);
    size_t n_seeds = 0;
    build_rich(&seeds[n_seeds++], 3, 0);
    build_rich(&seeds[n_seeds++], 2, 64);
    build_rich(&seeds[n_seeds++], 3, 8);
    build_many_tensors(&seeds[n_seeds++]);
    build_deep(&seeds[n_seeds++]);
    build_empty(&seeds[n_seeds++]);
    size_t real = SIZE_MAX;
    if (build_real(&seeds[n_seeds])) real = n_seeds++;
    for (size_t i = 0; i < n_seeds; i++) {
        find_fields(&seeds[i]);
        if (verbose)
            printf("seed %zu: %s, %zu bytes, %zu fields\n", i, seeds[i].what, seeds[i].n,
                   seeds[i].n_fields);
    }
    /* The writer's seeds must themselves be accepted. */
    for (size_t i = 0; i < n_seeds; i++)
        if (i != real && !run_case(seeds[i].p, seeds[i].n, false, false))
            fail("seed '%s' rejected", seeds[i].what);

    char tmp_path[4096];
    const char *tmpdir = getenv("TMPDIR");
    snprintf(tmp_path, sizeof tmp_path, "%s/fuzz_gguf_XXXXXX", tmpdir && *tmpdir ? tmpdir : "/tmp");
    int fd = mkstemp(tmp_path);
    if (fd >= 0) {
        close(fd);
        g_tmp_path = tmp_path;
    } else {
        fprintf(stderr, "fuzz_gguf: no temp file (%s); mmap path not fuzzed\n", strerror(errno));
    }

    clock_t t0 = clock();
    buf work = {0};
    uint64_t accepted = 0, rejected = 0;
    for (g_iter = 0; g_iter < iterations; g_iter++) {
        /* The 2 MiB real-model seed is costly: use it in ~2% of cases. */
        size_t si;
        if (real != SIZE_MAX && rnd_below(50) == 0) si = real;
        else si = (size_t)rnd_below(real != SIZE_MAX ? n_seeds - 1 : n_seeds);
        const seed *s = &seeds[si];
        buf_set(&work, s->p, s->n);
        if (si == real) {
            work.n = (size_t)rnd_below(work.n + 1);
            if (rnd_below(2)) mutate(&work, s);
        } else {
            unsigned n_mut = (unsigned)rnd_below(5); /* 0: the intact seed */
            for (unsigned m = 0; m < n_mut; m++) mutate(&work, s);
        }
        bool via_file = g_iter % 50 == 0;
        if (run_case(work.p, work.n, via_file, verbose)) accepted++;
        else rejected++;
    }
    double secs = (double)(clock() - t0) / CLOCKS_PER_SEC;
    printf("fuzz_gguf: %" PRIu64 " cases, %" PRIu64 " accepted, %" PRIu64
           " rejected (seed %" PRIu64 ", %zu seeds, %.1f s)\n",
           iterations, accepted, rejected, seed_v, n_seeds, secs);
    if (g_tmp_path) unlink(g_tmp_path);
    free(work.p);
    for (size_t i = 0; i < n_seeds; i++) {
        free(seeds[i].p);
        free(seeds[i].fields);
    }
    (void)g_sink;
    return 0;
}

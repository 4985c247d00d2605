/* testutil.c - see testutil.h. */
#include "testutil.h"

#include <check.h>
#include <time.h>

#include "qinfer/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const char *qi_test_cache_dir(void) {
    static char buf[1024];
    const char *c = getenv("QINFER_CACHE");
    if (c && *c) return c;
    const char *home = getenv("HOME");
    snprintf(buf, sizeof buf, "%s/.cache/qinfer", home ? home : ".");
    return buf;
}

const char *qi_test_cached(const char *relpath) {
    static char buf[2048];
    snprintf(buf, sizeof buf, "%s/%s", qi_test_cache_dir(), relpath);
    return access(buf, R_OK) == 0 ? buf : NULL;
}

char *qi_test_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    if (fseek(f, 0, SEEK_END) != 0) { fclose(f); return NULL; }
    long n = ftell(f);
    if (n < 0) { fclose(f); return NULL; }
    rewind(f);
    char *b = malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) { free(b); b = NULL; }
    fclose(f);
    if (!b) return NULL;
    b[n] = 0;
    if (len) *len = (size_t)n;
    return b;
}

static int hexval(int c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

unsigned char *qi_test_unhex(const char *hex, size_t *len) {
    size_t n = strlen(hex) / 2;
    unsigned char *b = malloc(n + 1);
    if (!b) return NULL;
    for (size_t i = 0; i < n; i++) {
        int hi = hexval(hex[2 * i]), lo = hexval(hex[2 * i + 1]);
        if (hi < 0 || lo < 0) { free(b); return NULL; }
        b[i] = (unsigned char)(hi * 16 + lo);
    }
    b[n] = 0;
    *len = n;
    return b;
}

uint64_t qi_test_rand(uint64_t *s) {
    uint64_t x = *s ? *s : 0x9E3779B97F4A7C15ull;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 0x2545F4914F6CDD1Dull;
}

float qi_test_randf(uint64_t *s) {
    return (float)((qi_test_rand(s) >> 40) / (double)(1ull << 24)) * 2.0f - 1.0f;
}

int qi_test_run_suite(Suite *s) {
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}

double qi_test_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

size_t qi_tok_golden_read(const char *path, qi_tok_golden **out) {
    size_t flen;
    char *text = qi_test_read_file(path, &flen);
    ck_assert_msg(text != NULL, "cannot read %s", path);
    size_t cap = 1024, n = 0;
    qi_tok_golden *v = calloc(cap, sizeof *v);
    ck_assert_ptr_nonnull(v);
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        if (line[0] == '#' || line[0] == 0) continue;
        char *f[4] = {line, NULL, NULL, NULL};
        for (int k = 1; k < 4; k++) {
            f[k] = strchr(f[k - 1], '\t');
            ck_assert_msg(f[k] != NULL, "%s line %zu: expected 4 columns", path, n + 1);
            *f[k]++ = 0;
        }
        if (n == cap) {
            v = realloc(v, (cap *= 2) * sizeof *v);
            ck_assert_ptr_nonnull(v);
        }
        qi_tok_golden *g = &v[n++];
        g->in = qi_test_unhex(f[0], &g->len);
        ck_assert_ptr_nonnull(g->in);
        g->add = atoi(f[1]);
        g->parse = atoi(f[2]);
        g->ids = malloc(sizeof(int32_t) * (strlen(f[3]) / 2 + 1));
        g->n = 0;
        for (char *p = f[3]; *p;) {
            char *end;
            long id = strtol(p, &end, 10);
            ck_assert_msg(end != p, "%s line %zu: bad id list", path, n);
            g->ids[g->n++] = (int32_t)id;
            p = end;
            while (*p == ' ') p++;
        }
    }
    free(text);
    *out = v;
    return n;
}

void qi_tok_golden_free(qi_tok_golden *v, size_t n) {
    for (size_t i = 0; i < n; i++) {
        free(v[i].in);
        free(v[i].ids);
    }
    free(v);
}

static void print_ids(const char *label, const int32_t *ids, size_t n) {
    fprintf(stderr, "  %s:", label);
    for (size_t i = 0; i < n; i++) fprintf(stderr, " %d", ids[i]);
    fprintf(stderr, "\n");
}

/* Tokenise a golden line's input; whether the ids are the recorded ones. */
static bool golden_matches(const qi_tokenizer *t, const qi_tok_golden *gl, int32_t **ids, size_t *k) {
    qi_err e = {0};
    ck_assert_msg(qi_tokenize(t, (const char *)gl->in, gl->len, gl->add, gl->parse, ids, k, &e) == QI_OK,
                  "tokenize: %s", e.msg);
    return *k == gl->n && memcmp(*ids, gl->ids, *k * sizeof **ids) == 0;
}

size_t qi_tok_golden_check(const qi_tokenizer *t, qi_tok_golden *v, size_t n, const char *label) {
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t *ids;
        size_t k;
        if (!golden_matches(t, &v[i], &ids, &k) && bad++ < 5) {
            fprintf(stderr, "golden mismatch, line %zu (add_special=%d parse_special=%d), input hex: ", i + 1,
                    v[i].add, v[i].parse);
            for (size_t j = 0; j < v[i].len; j++) fprintf(stderr, "%02x", v[i].in[j]);
            fprintf(stderr, "\n");
            print_ids("expected", v[i].ids, v[i].n);
            print_ids("got     ", ids, k);
        }
        qi_free(ids);
    }
    fprintf(stderr, "%s: %zu/%zu lines match llama.cpp\n", label, n - bad, n);
    /* A planted fault must be caught: one recorded id changed. */
    for (size_t i = 0; i < n; i++) {
        if (v[i].n < 2) continue;
        v[i].ids[v[i].n - 1] ^= 1;
        int32_t *ids;
        size_t k;
        ck_assert(!golden_matches(t, &v[i], &ids, &k));
        v[i].ids[v[i].n - 1] ^= 1;
        qi_free(ids);
        break;
    }
    return bad;
}

int qi_test_quick(void) {
    const char *q = getenv("QI_TEST_QUICK");
    return q && *q && *q != '0';
}

int qi_test_parse_ids(const char *s, int32_t *out, int cap) {
    int n = 0;
    char *end;
    while (*s && n < cap) {
        long v = strtol(s, &end, 10);
        if (end == s) break;
        out[n++] = (int32_t)v;
        s = end;
    }
    return n;
}

int qi_test_split_tabs(char *line, char **f, int cap) {
    int n = 0;
    f[n++] = line;
    for (char *p = line; *p && n < cap; p++)
        if (*p == '\t') {
            *p = 0;
            f[n++] = p + 1;
        }
    return n;
}

char *qi_test_next_line(char **cur) {
    char *s = *cur;
    if (!*s) return NULL;
    char *nl = strchr(s, '\n');
    if (nl) {
        *nl = 0;
        *cur = nl + 1;
    } else {
        *cur = s + strlen(s);
    }
    return s;
}

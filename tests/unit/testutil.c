/* testutil.c - see testutil.h. */
#include "testutil.h"

#include <check.h>

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

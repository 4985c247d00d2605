/* fz_util.c - the fuzz targets' scratch folder and file helpers (fz.h). */
#define _XOPEN_SOURCE 700
#include <ftw.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fz.h"

static char g_dir[4096];

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)flag, (void)ftw;
    remove(path);
    return 0;
}

static void rm_dir(void) {
    if (g_dir[0]) nftw(g_dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

const char *fz_tmpdir(void) {
    if (!g_dir[0]) {
        const char *t = getenv("TMPDIR");
        snprintf(g_dir, sizeof g_dir, "%s/qinfer-fuzz-XXXXXX", t && *t ? t : "/tmp");
        if (!mkdtemp(g_dir)) {
            perror("fuzz: mkdtemp");
            abort();
        }
        atexit(rm_dir);
    }
    return g_dir;
}

const char *fz_path(char *buf, size_t cap, const char *name) {
    snprintf(buf, cap, "%s/%s", fz_tmpdir(), name);
    return buf;
}

void fz_write(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || (n && fwrite(data, 1, n, f) != n) || fclose(f)) {
        perror(path);
        abort();
    }
}

char *fz_strndup(const uint8_t *data, size_t n) {
    char *s = malloc(n + 1);
    if (!s) abort();
    if (n) memcpy(s, data, n);
    s[n] = 0;
    return s;
}

void fz_note(const char *fmt, ...) {
    static int verbose = -1;
    if (verbose < 0) verbose = getenv("QI_FZ_VERBOSE") != NULL;
    if (!verbose) return;
    va_list ap;
    va_start(ap, fmt);
    fputs("  fuzz: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

/* model_files.c - short names -> verified cached files (see model_files.h).
 *
 * The manifest text is compiled in (generated qi_manifest.h) so the binary and
 * models/fetch.sh can never disagree about a name or a checksum.
 */
#include "qinfer/model_files.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "qi_manifest.h"
#include "sha256.h"

#define MAX_ENTRIES 64

static qi_cache_entry g_entries[MAX_ENTRIES];
static int g_n = -1;

static void parse_manifest(void) {
    if (g_n >= 0) return;
    g_n = 0;
    const char *p = qi_manifest_tsv;
    while (*p && g_n < MAX_ENTRIES) {
        const char *eol = strchr(p, '\n');
        size_t len = eol ? (size_t)(eol - p) : strlen(p);
        char line[1024];
        if (len < sizeof line && *p != '#') {
            memcpy(line, p, len);
            line[len] = 0;
            char *f[6] = {0};
            char *save = NULL, *tok = strtok_r(line, "\t", &save);
            int n = 0;
            while (tok && n < 6) {
                f[n++] = tok;
                tok = strtok_r(NULL, "\t", &save);
            }
            if (n == 6) {
                qi_cache_entry *e = &g_entries[g_n++];
                snprintf(e->name, sizeof e->name, "%s", f[0]);
                snprintf(e->kind, sizeof e->kind, "%s", f[1]);
                snprintf(e->source, sizeof e->source, "%s", f[2]);
                snprintf(e->file, sizeof e->file, "%s", f[4]);
                snprintf(e->sha256, sizeof e->sha256, "%s", f[5]);
            }
        }
        p += len + (eol ? 1 : 0);
    }
}

const char *qi_cache_dir(char *buf, size_t cap) {
    const char *c = getenv("QINFER_CACHE");
    if (c && *c) {
        snprintf(buf, cap, "%s", c);
    } else {
        const char *home = getenv("HOME");
        snprintf(buf, cap, "%s/.cache/qinfer", home && *home ? home : ".");
    }
    size_t n = strlen(buf);
    while (n > 1 && buf[n - 1] == '/') buf[--n] = 0;
    return buf;
}

int qi_cache_n_entries(void) {
    parse_manifest();
    return g_n;
}

const qi_cache_entry *qi_cache_entry_at(int i) {
    parse_manifest();
    return i >= 0 && i < g_n ? &g_entries[i] : NULL;
}

const qi_cache_entry *qi_cache_find(const char *name, const char *kind) {
    parse_manifest();
    for (int i = 0; i < g_n; i++)
        if (strcmp(g_entries[i].name, name) == 0 && (!kind || strcmp(g_entries[i].kind, kind) == 0))
            return &g_entries[i];
    return NULL;
}

qi_status qi_cache_resolve(const char *arg, const char *kind, char *path, size_t cap, qi_err *err) {
    struct stat st;
    if (!arg || !*arg) return QI_ERR(err, QI_ERR_INVALID, "no %s given", kind);
    if (stat(arg, &st) == 0) {
        if (!S_ISREG(st.st_mode)) return QI_ERR(err, QI_ERR_INVALID, "%s: not a regular file", arg);
        snprintf(path, cap, "%s", arg);
        return QI_OK;
    }
    const qi_cache_entry *e = qi_cache_find(arg, kind);
    if (!e) {
        char names[512] = "";
        for (int i = 0; i < qi_cache_n_entries(); i++)
            if (strcmp(g_entries[i].kind, kind) == 0) {
                strncat(names, names[0] ? ", " : "", sizeof names - strlen(names) - 1);
                strncat(names, g_entries[i].name, sizeof names - strlen(names) - 1);
            }
        return QI_ERR(err, QI_ERR_INVALID, "%s: no such file, and not a known %s name (known: %s)", arg, kind, names);
    }
    char dir[768];
    qi_cache_dir(dir, sizeof dir);
    snprintf(path, cap, "%s/%s/%s", dir, strcmp(kind, "corpus") == 0 ? "corpora" : "models", e->file);
    if (stat(path, &st) != 0)
        return QI_ERR(err, QI_ERR_IO, "%s '%s' is not cached at %s; fetch it with: models/fetch.sh %s", kind,
                      arg, path, e->name);
    char hex[65];
    qi_status s = qi_sha256_file(path, hex, err);
    if (s) return s;
    if (strcmp(hex, e->sha256) != 0)
        return QI_ERR(err, QI_ERR_FORMAT,
                      "%s: sha256 %s does not match the manifest's %s (corrupt or partial file; "
                      "delete it and run models/fetch.sh %s)", path, hex, e->sha256, e->name);
    return QI_OK;
}

/* model_files.h - where fetched models and corpora live, and short names for them.
 *
 * models/manifest.tsv (compiled in) maps a short name such as "smollm2-135m"
 * to a file in the cache ($QINFER_CACHE, default ~/.cache/qinfer) and its
 * sha256, which is checked on every use. models/fetch.sh fills the cache; the
 * engine itself never downloads anything.
 */
#ifndef QINFER_MODEL_FILES_H
#define QINFER_MODEL_FILES_H

#include <stddef.h>

#include "qinfer/status.h"

typedef struct {
    char name[64];
    char kind[16]; /* "model" or "corpus" */
    char source[128];
    char file[256];
    char sha256[65];
} qi_cache_entry;

/* The cache root (no trailing slash). */
const char *qi_cache_dir(char *buf, size_t cap);
/* Number of manifest entries and the i-th one. */
int qi_cache_n_entries(void);
const qi_cache_entry *qi_cache_entry_at(int i);
const qi_cache_entry *qi_cache_find(const char *name, const char *kind);
/* Resolve a command-line argument naming a file of `kind`: an existing path
 * is used as is; otherwise a short name from the manifest, whose cached file
 * must exist and match its sha256. Errors say how to fetch. */
qi_status qi_cache_resolve(const char *arg, const char *kind, char *path, size_t cap, qi_err *err);

#endif

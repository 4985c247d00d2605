/* calib_sets.c - `qinfer calibrate --synth DIR`: the models a calibration
 * over shapes measures (calib_int.h).
 *
 * Timing needs weights in memory, not meaningful ones: the set is the
 * cached real models where present and synthetic models of random weights
 * (qinfer synth), written into DIR once and reused, from about 100M to
 * 7B parameters over every weight type synth writes. The default set
 * keeps a run near ten minutes on two cores; --full adds the large shapes
 * and the remaining types (about an hour, and 12 GB in DIR).
 */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "calib_int.h"
#include "cli.h"
#include "qinfer/model_files.h"

typedef struct {
    const char *file;  /* in DIR */
    const char *preset;
    const char *type;
    const char *shape; /* extra synth flags, or NULL */
    bool full;         /* only in --full */
} synth_entry;

/* 512 wide: the K-quants' 256-weight blocks divide it (576, SmolLM2's, does not) */
#define W512 "--n-embd 512 --n-head 8 --n-head-kv 4 --n-ff 1536"
#define W3B "--n-embd 3072 --n-ff 8192 --n-layer 26 --n-head 24 --n-head-kv 24"
static const synth_entry k_synth[] = {
    {"sm-q8_0.gguf", "smollm2-135m", "q8_0", NULL, false},
    {"s5-q6_K.gguf", "smollm2-135m", "q6_K", W512, false},
    {"tl-q4_K.gguf", "tinyllama-1.1b", "q4_K", NULL, false},
    {"sm-q4_0.gguf", "smollm2-135m", "q4_0", NULL, true},
    {"sm-f16.gguf", "smollm2-135m", "f16", NULL, true},
    {"s5-q4_K.gguf", "smollm2-135m", "q4_K", W512, true},
    {"tl-q8_0.gguf", "tinyllama-1.1b", "q8_0", NULL, true},
    {"m3-q6_K.gguf", "llama-7b", "q6_K", W3B, true},
    {"l7-q4_K.gguf", "llama-7b", "q4_K", NULL, true},
};
static const char *const k_real[] = {"smollm2-135m", "gemma3-270m", "qwen2.5-coder-1.5b"};

qi_status calib_synth_set(const char *dir, bool full, char *out, size_t cap, qi_err *err) {
    size_t len = 0;
    out[0] = 0;
    for (size_t i = 0; i < sizeof k_real / sizeof k_real[0]; i++) {
        char path[1024];
        qi_err e = {0};
        if (!full && i == 2) continue; /* the 1.5B real model: --full */
        if (qi_cache_resolve(k_real[i], "model", path, sizeof path, &e) != QI_OK) {
            fprintf(stderr, "qinfer calibrate: %s not cached, left out (models/fetch.sh %s)\n", k_real[i], k_real[i]);
            continue;
        }
        len += (size_t)snprintf(out + len, cap > len ? cap - len : 0, "%s%s", len ? "," : "", k_real[i]);
    }
    if (mkdir(dir, 0755) != 0) {
        struct stat st;
        if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
            return QI_ERR(err, QI_ERR_IO, "--synth %s: not a directory and cannot be made", dir);
    }
    for (size_t i = 0; i < sizeof k_synth / sizeof k_synth[0]; i++) {
        const synth_entry *s = &k_synth[i];
        if (s->full && !full) continue;
        char path[1024], shape[256];
        snprintf(path, sizeof path, "%s/%s", dir, s->file);
        struct stat st;
        if (stat(path, &st) != 0) {
            char *av[24] = {"synth", "-o", path, "--preset", (char *)s->preset, "--type", (char *)s->type};
            int ac = 7;
            snprintf(shape, sizeof shape, "%s", s->shape ? s->shape : "");
            for (char *t = strtok(shape, " "); t && ac < 23; t = strtok(NULL, " ")) av[ac++] = t;
            fprintf(stderr, "qinfer calibrate: writing %s (synthetic %s, %s)\n", path, s->preset, s->type);
            if (qi_cmd_synth(ac, av) != 0) return QI_ERR(err, QI_ERR_IO, "--synth: cannot write %s", path);
        }
        len += (size_t)snprintf(out + len, cap > len ? cap - len : 0, "%s%s", len ? "," : "", path);
    }
    if (len >= cap) return QI_ERR(err, QI_ERR_INVALID, "--synth %s: the model list is too long", dir);
    return QI_OK;
}

/* profile.c - the FFN neuron profile (`qinfer profile -o`) read back for
 * the neuron policies.
 *
 * The file is text the profiler writes (qinfer/ffn_profile.h): a magic
 * line, '#' header lines, then "layer neuron active hot mass" per neuron.
 * It is also a file people edit, cut and copy between machines, so the
 * reader trusts nothing: every line is checked in full and the first
 * problem is reported as "PATH:LINE: why", the way a compiler would, and
 * nothing is allocated from a figure before it has been range-checked (a
 * settings line claiming 10^9 layers is an error, not an allocation).
 * Neuron lines may come in any order, each (layer, neuron) exactly once;
 * the writer's order is not required, so that a file sorted or merged by
 * other tools still reads. Unknown '#' lines are comments, so later
 * versions of the writer may add header lines without breaking readers;
 * a different version number is refused.
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "neuron/neuron_policy.h"

#define MAGIC "# qinfer ffn-profile "
#define MAX_LINE 4096
#define MAX_NEURONS (1L << 24) /* layers x n_ff a profile may hold (LLaMA-2-70B: 2.3M; 405B: 6.7M) */

void qi_neuron_profile_fini(qi_neuron_profile *p) {
    qi_free(p->layer_tokens);
    qi_free(p->active);
    qi_free(p->hot);
    qi_free(p->mass);
    memset(p, 0, sizeof *p);
}

/* A whole token as an integer in [lo, hi]. */
static bool parse_int(const char *s, long long lo, long long hi, long long *out) {
    if (!s || !*s) return false;
    char *end;
    errno = 0;
    const long long v = strtoll(s, &end, 10);
    if (errno || *end || v < lo || v > hi) return false;
    *out = v;
    return true;
}

/* A whole token as a finite number >= 0. */
static bool parse_mass(const char *s, double *out) {
    if (!s || !*s) return false;
    char *end;
    errno = 0;
    const double v = strtod(s, &end);
    if (errno == ERANGE && fabs(v) > 1.0) return false;
    if (*end || !isfinite(v) || v < 0.0) return false;
    *out = v;
    return true;
}

typedef struct {
    const char *name;
    long line;
    qi_err *err;
} where;

/* Record "NAME:LINE: why" as a format error. */
#define BAD(w, ...) bad_(w, __FILE__, __LINE__, __VA_ARGS__)
#if defined(__GNUC__)
__attribute__((format(printf, 4, 5)))
#endif
static qi_status bad_(const where *w, const char *file, int line, const char *fmt, ...) {
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return qi_err_set_(w->err, QI_ERR_FORMAT, file, line, "%s:%ld: %s", w->name, w->line, msg);
}

/* "# n_layer L n_ff F tokens N ..." (key value pairs; other keys ignored). */
static qi_status read_settings(char *rest, const where *w, qi_neuron_profile *p) {
    long long L = -1, F = -1, T = -1;
    char *save = NULL;
    for (char *k = strtok_r(rest, " \t", &save); k; k = strtok_r(NULL, " \t", &save)) {
        char *v = strtok_r(NULL, " \t", &save);
        if (!v) return BAD(w, "settings line: '%s' has no value", k);
        long long *dst = strcmp(k, "n_layer") == 0 ? &L
                         : strcmp(k, "n_ff") == 0  ? &F
                         : strcmp(k, "tokens") == 0 ? &T
                                                    : NULL;
        if (!dst) continue;
        if (*dst >= 0) return BAD(w, "settings line: %s given twice", k);
        const long long hi = dst == &L ? QI_NEURON_MAX_LAYERS : dst == &F ? QI_NEURON_MAX_FF : (1LL << 40);
        if (!parse_int(v, dst == &T ? 0 : 1, hi, dst))
            return BAD(w, "settings line: %s '%s' is not a whole number in [%d, %lld]", k, v, dst == &T ? 0 : 1, hi);
    }
    if (L < 0 || F < 0 || T < 0)
        return BAD(w, "settings line lacks %s", L < 0 ? "n_layer" : F < 0 ? "n_ff" : "tokens");
    if (L * F > MAX_NEURONS)
        return BAD(w, "settings line: %lld layers x %lld neurons is more than %ld neurons", L, F, MAX_NEURONS);
    p->n_layer = (int)L;
    p->n_ff = (int)F;
    p->tokens = (long)T;
    const size_t n = (size_t)(L * F);
    p->layer_tokens = qi_malloc(sizeof *p->layer_tokens * (size_t)L);
    p->active = qi_malloc(sizeof *p->active * n);
    p->hot = qi_malloc(sizeof *p->hot * n);
    p->mass = qi_malloc(sizeof *p->mass * n);
    if (!p->layer_tokens || !p->active || !p->hot || !p->mass)
        return QI_ERR(w->err, QI_ERR_NOMEM, "%s: out of memory for %lld x %lld neurons", w->name, L, F);
    for (int l = 0; l < L; l++) p->layer_tokens[l] = p->tokens;
    return QI_OK;
}

qi_status qi_neuron_profile_readf(FILE *f, const char *name, qi_neuron_profile *p, qi_err *err) {
    memset(p, 0, sizeof *p);
    where w = {name, 0, err};
    char *buf = NULL;
    size_t cap = 0;
    uint8_t *seen = NULL, *layer_seen = NULL;
    size_t n_seen = 0;
    bool have_magic = false, have_settings = false, have_neurons = false;
    qi_status st = QI_OK;
    ssize_t len;
    while (!st && (len = getline(&buf, &cap, f)) >= 0) {
        w.line++;
        if ((size_t)len != strlen(buf)) {
            st = BAD(&w, "a NUL byte: not a text profile");
            break;
        }
        if (len > MAX_LINE) {
            st = BAD(&w, "line of %zd bytes (at most %d)", len, MAX_LINE);
            break;
        }
        while (len > 0 && (buf[len - 1] == '\n' || buf[len - 1] == '\r')) buf[--len] = 0;
        if (!have_magic) {
            if (strncmp(buf, MAGIC, strlen(MAGIC)) != 0) {
                st = BAD(&w, "not a qinfer FFN profile (the first line is not '%s1')", MAGIC);
            } else if (strcmp(buf + strlen(MAGIC), "1") != 0) {
                st = qi_err_set_(err, QI_ERR_UNSUPPORTED, __FILE__, __LINE__,
                                 "%s:%ld: FFN profile version '%s' (this build reads version 1)", name, w.line,
                                 buf + strlen(MAGIC));
            }
            have_magic = true;
            continue;
        }
        const char *s = buf;
        while (*s == ' ' || *s == '\t') s++;
        if (!*s) continue; /* a blank line */
        if (*s == '#') {
            char *rest = buf + (s - buf) + 1;
            while (*rest == ' ' || *rest == '\t') rest++;
            if (strncmp(rest, "model ", 6) == 0) {
                snprintf(p->model, sizeof p->model, "%s", rest + 6);
            } else if (strncmp(rest, "n_layer ", 8) == 0) {
                if (have_settings) st = BAD(&w, "a second settings line");
                else st = read_settings(rest, &w, p);
                if (!st) {
                    have_settings = true;
                    n_seen = (size_t)p->n_layer * p->n_ff;
                    seen = qi_calloc(n_seen, 1);
                    layer_seen = qi_calloc((size_t)p->n_layer, 1);
                    if (!seen || !layer_seen) st = QI_ERR(err, QI_ERR_NOMEM, "%s: out of memory", name);
                }
            } else if (strncmp(rest, "layer ", 6) == 0) {
                char *save = NULL;
                strtok_r(rest, " \t", &save);
                const char *li = strtok_r(NULL, " \t", &save), *tk = strtok_r(NULL, " \t", &save),
                           *tv = strtok_r(NULL, " \t", &save);
                long long l, t;
                if (!have_settings) st = BAD(&w, "a layer line before the settings line (# n_layer ...)");
                else if (have_neurons) st = BAD(&w, "a layer line after the neuron lines");
                else if (!parse_int(li, 0, p->n_layer - 1, &l))
                    st = BAD(&w, "layer line: layer '%s' is not in [0, %d]", li ? li : "", p->n_layer - 1);
                else if (layer_seen[l]) st = BAD(&w, "layer line: layer %lld given twice", l);
                else if (!tk || strcmp(tk, "tokens") != 0 || !parse_int(tv, 0, p->tokens, &t))
                    st = BAD(&w, "layer line: 'tokens N' with N in [0, %ld] must follow the layer", p->tokens);
                else {
                    layer_seen[l] = 1;
                    p->layer_tokens[l] = (long)t;
                }
            }
            continue;
        }
        if (!have_settings) {
            st = BAD(&w, "a neuron line before the settings line (# n_layer L n_ff F tokens N ...)");
            break;
        }
        have_neurons = true;
        char *save = NULL, *f5[6];
        int nf = 0;
        for (char *t = strtok_r(buf, " \t", &save); t; t = strtok_r(NULL, " \t", &save)) {
            if (nf == 6) break;
            f5[nf++] = t;
        }
        long long l, j, act, hot;
        double mass;
        if (nf != 5) {
            st = BAD(&w, "%d fields, want 5 (layer neuron active hot mass)", nf == 6 ? 6 : nf);
        } else if (!parse_int(f5[0], 0, p->n_layer - 1, &l)) {
            st = BAD(&w, "layer '%s' is not a whole number in [0, %d]", f5[0], p->n_layer - 1);
        } else if (!parse_int(f5[1], 0, p->n_ff - 1, &j)) {
            st = BAD(&w, "neuron '%s' is not a whole number in [0, %d]", f5[1], p->n_ff - 1);
        } else if (!parse_int(f5[2], 0, p->layer_tokens[l], &act)) {
            st = BAD(&w, "active count '%s' is not a whole number in [0, %ld] (layer %lld's tokens)", f5[2],
                     p->layer_tokens[l], l);
        } else if (!parse_int(f5[3], 0, p->layer_tokens[l], &hot)) {
            st = BAD(&w, "hot count '%s' is not a whole number in [0, %ld] (layer %lld's tokens)", f5[3],
                     p->layer_tokens[l], l);
        } else if (!parse_mass(f5[4], &mass)) {
            st = BAD(&w, "mass '%s' is not a finite number >= 0", f5[4]);
        } else {
            const size_t i = (size_t)l * p->n_ff + (size_t)j;
            if (seen[i]) {
                st = BAD(&w, "layer %lld neuron %lld given twice", l, j);
            } else {
                seen[i] = 1;
                p->active[i] = act;
                p->hot[i] = hot;
                p->mass[i] = mass;
            }
        }
    }
    if (!st && ferror(f)) st = QI_ERR(err, QI_ERR_IO, "%s: read error: %s", name, strerror(errno));
    if (!st && !have_magic) {
        w.line = 1;
        st = BAD(&w, "empty file, not a qinfer FFN profile");
    }
    if (!st && !have_settings) {
        w.line++;
        st = BAD(&w, "the file ends without a settings line (# n_layer L n_ff F tokens N ...)");
    }
    for (size_t i = 0; !st && i < n_seen; i++)
        if (!seen[i]) {
            w.line++;
            st = BAD(&w, "the file ends with layer %zu neuron %zu missing", i / (size_t)p->n_ff, i % (size_t)p->n_ff);
        }
    free(buf); /* getline's, not ours */
    qi_free(seen);
    qi_free(layer_seen);
    if (st) qi_neuron_profile_fini(p);
    return st;
}

qi_status qi_neuron_profile_read(const char *path, qi_neuron_profile *out, qi_err *err) {
    memset(out, 0, sizeof *out);
    FILE *f = fopen(path, "r");
    if (!f) return QI_ERR(err, QI_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    qi_status st = qi_neuron_profile_readf(f, path, out, err);
    fclose(f);
    return st;
}

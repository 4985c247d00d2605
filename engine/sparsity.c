/* sparsity.c - activation-sparsity calibration and thresholds
 * (qinfer/sparsity.h). */
#include "qinfer/sparsity.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const site_names[QI_SITE_COUNT] = {"attn_in", "attn_out", "ffn_in", "ffn_act", "gate"};

const char *qi_sparsity_site_name(int site) { return site >= 0 && site < QI_SITE_COUNT ? site_names[site] : NULL; }

const char *qi_sparsity_mode_name(qi_sparsity_mode m) {
    return m == QI_SPARSITY_TEAL ? "teal" : m == QI_SPARSITY_CATS ? "cats" : "?";
}

qi_status qi_sparsity_mode_parse(const char *s, qi_sparsity_mode *out, qi_err *err) {
    if (s && strcmp(s, "teal") == 0) return *out = QI_SPARSITY_TEAL, QI_OK;
    if (s && strcmp(s, "cats") == 0) return *out = QI_SPARSITY_CATS, QI_OK;
    return QI_ERR(err, QI_ERR_INVALID, "sparsity mode '%s': expected teal or cats", s ? s : "");
}

int qi_sparsity_uses(qi_sparsity_mode m, int site) {
    if (m == QI_SPARSITY_CATS) return site == QI_SITE_GATE;
    return m == QI_SPARSITY_TEAL && site >= QI_SITE_ATTN_IN && site <= QI_SITE_FFN_ACT;
}

/* ---- calibration ------------------------------------------------------ */

#define OCT_LO (-64)
#define OCTAVES 128
#define PER_OCT 64
#define N_BINS (OCTAVES * PER_OCT)

struct qi_sparsity_calib {
    int n_layer;
    uint64_t *bins;  /* [n_layer][QI_SITE_COUNT][N_BINS] */
    uint64_t *zeros; /* [n_layer][QI_SITE_COUNT] */
    uint64_t *count; /* the same */
};

qi_status qi_sparsity_calib_new(int n_layer, qi_sparsity_calib **out, qi_err *err) {
    *out = NULL;
    if (n_layer < 1) return QI_ERR(err, QI_ERR_INVALID, "sparsity calibration for %d layers", n_layer);
    qi_sparsity_calib *c = qi_calloc(1, sizeof *c);
    const size_t sites = (size_t)n_layer * QI_SITE_COUNT;
    if (c) {
        c->n_layer = n_layer;
        c->bins = qi_calloc(sites * N_BINS, sizeof(uint64_t));
        c->zeros = qi_calloc(sites, sizeof(uint64_t));
        c->count = qi_calloc(sites, sizeof(uint64_t));
    }
    if (!c || !c->bins || !c->zeros || !c->count) {
        qi_sparsity_calib_free(c);
        return QI_ERR(err, QI_ERR_NOMEM, "out of memory for the sparsity calibration of %d layers", n_layer);
    }
    *out = c;
    return QI_OK;
}

void qi_sparsity_calib_free(qi_sparsity_calib *c) {
    if (!c) return;
    qi_free(c->bins);
    qi_free(c->zeros);
    qi_free(c->count);
    qi_free(c);
}

/* |x| = m 2^e, m in [0.5, 1): bin (e - OCT_LO) * PER_OCT + floor((m - 0.5) * 2 PER_OCT) */
static int bin_of(float v) {
    int e;
    const float m = frexpf(v, &e);
    if (e < OCT_LO + 1) return 0;
    if (e > OCT_LO + OCTAVES) return N_BINS - 1;
    int k = (int)((m - 0.5f) * (2 * PER_OCT));
    k = k < 0 ? 0 : k >= PER_OCT ? PER_OCT - 1 : k;
    return (e - 1 - OCT_LO) * PER_OCT + k;
}

/* The upper edge of bin b: 2^(b / PER_OCT + OCT_LO) * (1 + (b % PER_OCT + 1) / PER_OCT). */
static double bin_top(int b) {
    return ldexp(1.0 + (double)(b % PER_OCT + 1) / PER_OCT, b / PER_OCT + OCT_LO);
}

void qi_sparsity_calib_add(qi_sparsity_calib *c, int layer, int site, const float *x, long n) {
    QI_ASSERT(layer >= 0 && layer < c->n_layer && site >= 0 && site < QI_SITE_COUNT);
    const size_t s = (size_t)layer * QI_SITE_COUNT + (size_t)site;
    uint64_t *bins = c->bins + s * N_BINS;
    for (long i = 0; i < n; i++) {
        const float v = fabsf(x[i]);
        if (v == 0.0f)
            c->zeros[s]++;
        else if (v == v)
            bins[bin_of(v)]++;
        else
            continue; /* a NaN is not a magnitude */
        c->count[s]++;
    }
}

uint64_t qi_sparsity_calib_count(const qi_sparsity_calib *c, int layer, int site) {
    return c->count[(size_t)layer * QI_SITE_COUNT + (size_t)site];
}

double qi_sparsity_calib_quantile(const qi_sparsity_calib *c, int layer, int site, double q) {
    const size_t s = (size_t)layer * QI_SITE_COUNT + (size_t)site;
    if (c->count[s] == 0) return -1.0;
    const double want = q * (double)c->count[s];
    double cum = (double)c->zeros[s];
    if (cum >= want) return 0.0;
    const uint64_t *bins = c->bins + s * N_BINS;
    for (int b = 0; b < N_BINS; b++) {
        cum += (double)bins[b];
        if (cum >= want && bins[b]) return bin_top(b);
    }
    return bin_top(N_BINS - 1);
}

qi_status qi_sparsity_calib_write(const qi_sparsity_calib *c, const char *path, const char *model, long tokens,
                                  qi_err *err) {
    FILE *f = fopen(path, "w");
    if (!f) return QI_ERR(err, QI_ERR_IO, "%s: cannot write: %s", path, strerror(errno));
    fprintf(f, "# qinfer sparsity calibration 1\n# model %s\n# tokens %ld\n", model ? model : "?", tokens);
    fprintf(f, "# layer site, then the |activation| under which k%% of the values seen there fall, k = 0..100\n");
    for (int l = 0; l < c->n_layer; l++)
        for (int s = 0; s < QI_SITE_COUNT; s++) {
            if (!qi_sparsity_calib_count(c, l, s)) continue;
            fprintf(f, "%d %s", l, site_names[s]);
            for (int k = 0; k < QI_SPARSITY_PCTS; k++)
                fprintf(f, " %.9g", qi_sparsity_calib_quantile(c, l, s, k / 100.0));
            fputc('\n', f);
        }
    const bool bad = ferror(f) != 0;
    if (fclose(f) != 0 || bad) return QI_ERR(err, QI_ERR_IO, "%s: write failed: %s", path, strerror(errno));
    return QI_OK;
}

/* ---- thresholds ------------------------------------------------------- */

void qi_sparsity_free(qi_sparsity *s) {
    if (!s) return;
    qi_free(s->thr);
    s->thr = NULL;
}

qi_status qi_sparsity_load(const char *path, qi_sparsity_mode mode, double target, int n_layer, qi_sparsity *out,
                           qi_err *err) {
    memset(out, 0, sizeof *out);
    if (mode != QI_SPARSITY_TEAL && mode != QI_SPARSITY_CATS)
        return QI_ERR(err, QI_ERR_INVALID, "sparsity: unknown mode %d", (int)mode);
    if (!(target >= 0.0 && target < 1.0))
        return QI_ERR(err, QI_ERR_INVALID, "sparsity %g: expected a share in [0, 1)", target);
    if (n_layer < 1) return QI_ERR(err, QI_ERR_INVALID, "sparsity for %d layers", n_layer);
    FILE *f = fopen(path, "r");
    if (!f) return QI_ERR(err, QI_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    float *thr = qi_malloc(sizeof(float) * (size_t)n_layer * QI_SITE_COUNT);
    unsigned char *seen = qi_calloc((size_t)n_layer * QI_SITE_COUNT, 1);
    if (!thr || !seen) {
        fclose(f);
        qi_free(thr), qi_free(seen);
        return QI_ERR(err, QI_ERR_NOMEM, "out of memory for the sparsity thresholds");
    }
    for (int i = 0; i < n_layer * QI_SITE_COUNT; i++) thr[i] = -1.0f;
    qi_status st = QI_OK;
    char line[4096];
    int lineno = 0;
    const double pos = target * 100.0;
    const int k0 = (int)floor(pos);
    const double frac = pos - k0;
    while (!st && fgets(line, sizeof line, f)) {
        lineno++;
        if (!strchr(line, '\n') && !feof(f)) {
            st = QI_ERR(err, QI_ERR_FORMAT, "%s:%d: line too long", path, lineno);
            break;
        }
        char *p = line;
        while (isspace((unsigned char)*p)) p++;
        if (*p == '#' || *p == 0) continue;
        char *end;
        errno = 0;
        const long l = strtol(p, &end, 10);
        if (end == p || errno || !isspace((unsigned char)*end)) {
            st = QI_ERR(err, QI_ERR_FORMAT, "%s:%d: expected a layer number", path, lineno);
            break;
        }
        if (l < 0 || l >= n_layer) {
            st = QI_ERR(err, QI_ERR_FORMAT, "%s:%d: layer %ld outside the model's 0..%d (a calibration of another "
                        "model?)", path, lineno, l, n_layer - 1);
            break;
        }
        p = end;
        while (isspace((unsigned char)*p)) p++;
        int site = -1;
        for (int s = 0; s < QI_SITE_COUNT; s++) {
            const size_t n = strlen(site_names[s]);
            if (strncmp(p, site_names[s], n) == 0 && isspace((unsigned char)p[n])) site = s, p += n;
        }
        if (site < 0) {
            st = QI_ERR(err, QI_ERR_FORMAT, "%s:%d: unknown site (expected attn_in, attn_out, ffn_in, ffn_act or gate)",
                        path, lineno);
            break;
        }
        const size_t at = (size_t)l * QI_SITE_COUNT + (size_t)site;
        if (seen[at]) {
            st = QI_ERR(err, QI_ERR_FORMAT, "%s:%d: layer %ld %s given twice", path, lineno, l, site_names[site]);
            break;
        }
        seen[at] = 1;
        double q[QI_SPARSITY_PCTS];
        for (int k = 0; k < QI_SPARSITY_PCTS && !st; k++) {
            errno = 0;
            q[k] = strtod(p, &end);
            if (end == p || errno == ERANGE || !isfinite(q[k]) || q[k] < 0 || (k && q[k] < q[k - 1]))
                st = QI_ERR(err, QI_ERR_FORMAT, "%s:%d: quantile %d: expected a finite magnitude, at least the one "
                            "before", path, lineno, k);
            p = end;
        }
        if (st) break;
        while (isspace((unsigned char)*p)) p++;
        if (*p) {
            st = QI_ERR(err, QI_ERR_FORMAT, "%s:%d: more than %d quantiles", path, lineno, QI_SPARSITY_PCTS);
            break;
        }
        if (qi_sparsity_uses(mode, site))
            thr[at] = (float)(k0 + 1 < QI_SPARSITY_PCTS ? q[k0] + frac * (q[k0 + 1] - q[k0]) : q[k0]);
    }
    if (!st && ferror(f)) st = QI_ERR(err, QI_ERR_IO, "%s: read failed", path);
    fclose(f);
    for (int l = 0; l < n_layer && !st; l++)
        for (int s = 0; s < QI_SITE_COUNT && !st; s++)
            if (qi_sparsity_uses(mode, s) && !seen[(size_t)l * QI_SITE_COUNT + (size_t)s])
                st = QI_ERR(err, QI_ERR_FORMAT, "%s: no quantiles for layer %d %s, which %s thresholds (calibrate "
                            "with qinfer profile --sparsity-out)", path, l, site_names[s], qi_sparsity_mode_name(mode));
    qi_free(seen);
    if (st) {
        qi_free(thr);
        return st;
    }
    /* target 0 zeroes nothing: the dense result, bit for bit */
    if (target == 0.0)
        for (int i = 0; i < n_layer * QI_SITE_COUNT; i++) thr[i] = -1.0f;
    *out = (qi_sparsity){.mode = mode, .target = target, .n_layer = n_layer, .thr = thr};
    return QI_OK;
}

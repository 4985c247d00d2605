/* ffn_profile.c - the FFN neuron profiler's core (qinfer/ffn_profile.h):
 * per-neuron counts and mass, hot sets and their overlaps. */
#include "qinfer/ffn_profile.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "qinfer/types.h"

typedef struct {
    int64_t *active, *hot;
    double *mass;
    long tokens, tok_pairs, win_pairs;
    double tok_sum, win_sum_ov;
    int64_t n_active;
    /* the sequence's state: the last token's hot set, the window being
     * filled and the last complete window's hot set */
    bool have_tok, have_win;
    uint8_t *tok_mask, *win_mask; /* [n_ff] */
    int *tok_idx, *win_idx;       /* [k] */
    double *win_acc;              /* [n_ff] */
    int win_fill;
} layer_state;

struct qi_ffnprof {
    int n_layer, n_ff, k;
    qi_ffnprof_opts o;
    layer_state *L;
    double *key; /* selection scratch [n_ff] */
    int *idx;    /* [n_ff] */
};

/* a comes before b: larger key, then lower index */
static inline bool before(const double *key, int a, int b) { return key[a] > key[b] || (key[a] == key[b] && a < b); }

/* Reorders idx[0..n) so its first k entries are the k first neurons in
 * `before` order (a strict total order, so the set is exact). */
static void select_top(const double *key, int *idx, int n, int k) {
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        /* median of three as the pivot, moved to hi */
        const int mid = lo + (hi - lo) / 2;
        int a = idx[lo], b = idx[mid], c = idx[hi], piv;
        if (before(key, a, b)) piv = before(key, b, c) ? mid : (before(key, a, c) ? hi : lo);
        else piv = before(key, a, c) ? lo : (before(key, b, c) ? hi : mid);
        int t = idx[piv]; idx[piv] = idx[hi]; idx[hi] = t;
        const int p = idx[hi];
        int s = lo;
        for (int i = lo; i < hi; i++)
            if (before(key, idx[i], p)) { t = idx[i]; idx[i] = idx[s]; idx[s] = t; s++; }
        t = idx[s]; idx[s] = idx[hi]; idx[hi] = t;
        /* idx[lo..s) come before p, idx(s..hi] after */
        if (s == k - 1 || s == k) return;
        if (s < k) lo = s + 1;
        else hi = s - 1;
    }
}

/* The top k of key into idx[0..k); returns how many of them were in mask
 * (the previous set, listed in prev), then makes them the mask. */
static int hot_set(qi_ffnprof *p, uint8_t *mask, int *prev, bool have_prev) {
    const int n = p->n_ff, k = p->k;
    for (int j = 0; j < n; j++) p->idx[j] = j;
    if (k < n) select_top(p->key, p->idx, n, k);
    int common = 0;
    if (have_prev) {
        for (int i = 0; i < k; i++) common += mask[p->idx[i]];
        for (int i = 0; i < k; i++) mask[prev[i]] = 0;
    }
    for (int i = 0; i < k; i++) {
        mask[p->idx[i]] = 1;
        prev[i] = p->idx[i];
    }
    return common;
}

qi_status qi_ffnprof_create(int n_layer, int n_ff, const qi_ffnprof_opts *o, qi_ffnprof **out, qi_err *err) {
    *out = NULL;
    if (n_layer < 1 || n_ff < 1)
        return QI_ERR(err, QI_ERR_INVALID, "profile of %d layers of %d neurons: both must be positive", n_layer, n_ff);
    if (!(o->top > 0.0 && o->top <= 1.0))
        return QI_ERR(err, QI_ERR_INVALID, "hot-set fraction %g is outside (0, 1]", o->top);
    if (!(o->threshold >= 0.0f) || !isfinite(o->threshold))
        return QI_ERR(err, QI_ERR_INVALID, "threshold %g is not a finite value >= 0", (double)o->threshold);
    if (o->window < 1) return QI_ERR(err, QI_ERR_INVALID, "window of %d tokens: must be at least 1", o->window);
    qi_ffnprof *p = qi_calloc(1, sizeof *p);
    if (!p) return QI_ERR(err, QI_ERR_NOMEM, "out of memory for the profile");
    p->n_layer = n_layer;
    p->n_ff = n_ff;
    p->o = *o;
    long k = lround(o->top * n_ff);
    p->k = k < 1 ? 1 : k > n_ff ? n_ff : (int)k;
    p->L = qi_calloc((size_t)n_layer, sizeof *p->L);
    p->key = qi_malloc(sizeof(double) * (size_t)n_ff);
    p->idx = qi_malloc(sizeof(int) * (size_t)n_ff);
    bool ok = p->L && p->key && p->idx;
    for (int l = 0; ok && l < n_layer; l++) {
        layer_state *s = &p->L[l];
        s->active = qi_calloc((size_t)n_ff, sizeof *s->active);
        s->hot = qi_calloc((size_t)n_ff, sizeof *s->hot);
        s->mass = qi_calloc((size_t)n_ff, sizeof *s->mass);
        s->win_acc = qi_calloc((size_t)n_ff, sizeof *s->win_acc);
        s->tok_mask = qi_calloc((size_t)n_ff, 1);
        s->win_mask = qi_calloc((size_t)n_ff, 1);
        s->tok_idx = qi_calloc((size_t)p->k, sizeof(int));
        s->win_idx = qi_calloc((size_t)p->k, sizeof(int));
        ok = s->active && s->hot && s->mass && s->win_acc && s->tok_mask && s->win_mask && s->tok_idx && s->win_idx;
    }
    if (!ok) {
        qi_ffnprof_free(p);
        return QI_ERR(err, QI_ERR_NOMEM, "out of memory for a profile of %d layers of %d neurons", n_layer, n_ff);
    }
    *out = p;
    return QI_OK;
}

void qi_ffnprof_free(qi_ffnprof *p) {
    if (!p) return;
    for (int l = 0; p->L && l < p->n_layer; l++) {
        layer_state *s = &p->L[l];
        qi_free(s->active);
        qi_free(s->hot);
        qi_free(s->mass);
        qi_free(s->win_acc);
        qi_free(s->tok_mask);
        qi_free(s->win_mask);
        qi_free(s->tok_idx);
        qi_free(s->win_idx);
    }
    qi_free(p->L);
    qi_free(p->key);
    qi_free(p->idx);
    qi_free(p);
}

int qi_ffnprof_k(const qi_ffnprof *p) { return p->k; }

void qi_ffnprof_add(qi_ffnprof *p, int layer, const float *act, int rows) {
    if (layer < 0 || layer >= p->n_layer) return;
    layer_state *s = &p->L[layer];
    const int n = p->n_ff;
    const float thr = p->o.threshold;
    for (int r = 0; r < rows; r++) {
        const float *a = act + (size_t)r * (size_t)n;
        for (int j = 0; j < n; j++) {
            const double v = fabs((double)a[j]);
            p->key[j] = v;
            s->mass[j] += v;
            s->win_acc[j] += v;
            if (v > thr) {
                s->active[j]++;
                s->n_active++;
            }
        }
        const int common = hot_set(p, s->tok_mask, s->tok_idx, s->have_tok);
        for (int i = 0; i < p->k; i++) s->hot[s->tok_idx[i]]++;
        if (s->have_tok) {
            s->tok_sum += (double)common / p->k;
            s->tok_pairs++;
        }
        s->have_tok = true;
        s->tokens++;
        if (++s->win_fill == p->o.window) {
            memcpy(p->key, s->win_acc, sizeof(double) * (size_t)n);
            const int wc = hot_set(p, s->win_mask, s->win_idx, s->have_win);
            if (s->have_win) {
                s->win_sum_ov += (double)wc / p->k;
                s->win_pairs++;
            }
            s->have_win = true;
            s->win_fill = 0;
            memset(s->win_acc, 0, sizeof(double) * (size_t)n);
        }
    }
}

void qi_ffnprof_end_seq(qi_ffnprof *p) {
    for (int l = 0; l < p->n_layer; l++) {
        layer_state *s = &p->L[l];
        if (s->have_tok)
            for (int i = 0; i < p->k; i++) s->tok_mask[s->tok_idx[i]] = 0;
        if (s->have_win)
            for (int i = 0; i < p->k; i++) s->win_mask[s->win_idx[i]] = 0;
        s->have_tok = s->have_win = false;
        s->win_fill = 0;
        memset(s->win_acc, 0, sizeof(double) * (size_t)p->n_ff);
    }
}

void qi_ffnprof_layer_get(const qi_ffnprof *p, int layer, qi_ffnprof_layer *out) {
    memset(out, 0, sizeof *out);
    if (layer < 0 || layer >= p->n_layer) return;
    const layer_state *s = &p->L[layer];
    out->tokens = s->tokens;
    out->tok_pairs = s->tok_pairs;
    out->win_pairs = s->win_pairs;
    out->tok_overlap = s->tok_pairs ? s->tok_sum / s->tok_pairs : 0.0;
    out->win_overlap = s->win_pairs ? s->win_sum_ov / s->win_pairs : 0.0;
    out->active_frac = s->tokens ? (double)s->n_active / ((double)s->tokens * p->n_ff) : 0.0;
    /* the top k by total mass: selected on the scratch (const in effect:
     * the scratch holds nothing between calls) */
    qi_ffnprof *q = (qi_ffnprof *)p;
    double total = 0.0, top = 0.0;
    for (int j = 0; j < p->n_ff; j++) {
        q->key[j] = s->mass[j];
        q->idx[j] = j;
        total += s->mass[j];
    }
    if (p->k < p->n_ff) select_top(q->key, q->idx, p->n_ff, p->k);
    for (int i = 0; i < p->k; i++) top += s->mass[q->idx[i]];
    out->mass = total;
    out->mass_share = total > 0.0 ? top / total : 0.0;
}

const int64_t *qi_ffnprof_active(const qi_ffnprof *p, int layer) {
    return layer >= 0 && layer < p->n_layer ? p->L[layer].active : NULL;
}
const int64_t *qi_ffnprof_hot(const qi_ffnprof *p, int layer) {
    return layer >= 0 && layer < p->n_layer ? p->L[layer].hot : NULL;
}
const double *qi_ffnprof_mass(const qi_ffnprof *p, int layer) {
    return layer >= 0 && layer < p->n_layer ? p->L[layer].mass : NULL;
}

qi_status qi_ffnprof_write(const qi_ffnprof *p, FILE *f, const char *model, const char *corpus, int ctx,
                           qi_err *err) {
    long tokens = p->L[0].tokens;
    fprintf(f, "# qinfer ffn-profile 1\n# model %s\n# corpus %s\n", model ? model : "-", corpus ? corpus : "-");
    fprintf(f, "# n_layer %d n_ff %d tokens %ld ctx %d threshold %g top %g k %d window %d\n", p->n_layer, p->n_ff,
            tokens, ctx, (double)p->o.threshold, p->o.top, p->k, p->o.window);
    for (int l = 0; l < p->n_layer; l++) {
        qi_ffnprof_layer s;
        qi_ffnprof_layer_get(p, l, &s);
        fprintf(f, "# layer %d tokens %ld tok_overlap %.6f win_overlap %.6f mass_share %.6f active_frac %.6f\n", l,
                s.tokens, s.tok_overlap, s.win_overlap, s.mass_share, s.active_frac);
    }
    fprintf(f, "# columns: layer neuron active hot mass\n");
    for (int l = 0; l < p->n_layer; l++) {
        const layer_state *s = &p->L[l];
        for (int j = 0; j < p->n_ff; j++)
            fprintf(f, "%d %d %lld %lld %.9g\n", l, j, (long long)s->active[j], (long long)s->hot[j], s->mass[j]);
    }
    if (fflush(f) != 0 || ferror(f)) return QI_ERR(err, QI_ERR_IO, "writing the profile failed");
    return QI_OK;
}

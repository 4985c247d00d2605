/* ffn_split.c - an FFN's neurons gathered into two sides (ffn_split.h). */
#include "ffn_split.h"

#include <string.h>

#include "qinfer/types.h"

#define ALIGN 64
static size_t up64(size_t n) { return (n + ALIGN - 1) / ALIGN * ALIGN; }

int qi_ffn_split_unit(const qi_layer *ly) {
    const qi_type_info *ti = qi_type_get(ly->w_down.type);
    return ti ? (int)ti->blck : 0;
}

void qi_ffn_split_free(qi_ffn_split *s) {
    qi_free(s->mem);
    memset(s, 0, sizeof *s);
}

qi_status qi_ffn_split_build(const qi_layer *ly, const uint8_t *fast, bool copy, qi_ffn_split *out, qi_err *err) {
    return qi_ffn_split_build_spare(ly, fast, copy, 0, out, err);
}

qi_status qi_ffn_split_build_spare(const qi_layer *ly, const uint8_t *fast, bool copy, int spare, qi_ffn_split *out,
                                   qi_err *err) {
    memset(out, 0, sizeof *out);
    const qi_weight *g = &ly->w_gate, *u = &ly->w_up, *d = &ly->w_down;
    const int64_t F = u->n_rows, E = u->n_cols;
    const int unit = qi_ffn_split_unit(ly);
    if (!g->n_rows) return QI_ERR(err, QI_ERR_INVALID, "a neuron split needs a gated FFN (gate, up and down)");
    if (g->n_rows != F || g->n_cols != E || d->n_cols != F || d->n_rows != E)
        return QI_ERR(err, QI_ERR_INVALID, "FFN shapes do not match: gate %lldx%lld, up %lldx%lld, down %lldx%lld",
                      (long long)g->n_rows, (long long)g->n_cols, (long long)F, (long long)E, (long long)d->n_rows,
                      (long long)d->n_cols);
    if (unit < 1 || F % unit)
        return QI_ERR(err, QI_ERR_INVALID, "FFN width %lld is not a whole number of down's %d-neuron blocks",
                      (long long)F, unit);
    const int nu = (int)(F / unit);
    const size_t blk_bytes = qi_type_get(d->type)->size;
    if (spare < 0 || spare > nu)
        return QI_ERR(err, QI_ERR_INVALID, "%d spare units beside an FFN of %d", spare, nu);
    int n_units[2] = {spare, 0};
    for (int i = 0; i < nu; i++) n_units[fast[i] ? 1 : 0]++;
    out->unit = unit;
    out->n_units = nu;
    out->spare = spare;
    size_t total = 0, sz[2][3];
    for (int s = 0; s < 2; s++) {
        out->n[s] = n_units[s] * unit;
        const int64_t n = out->n[s];
        out->gate[s] = (qi_weight){.type = g->type, .n_cols = E, .n_rows = n, .row_bytes = g->row_bytes};
        out->up[s] = (qi_weight){.type = u->type, .n_cols = E, .n_rows = n, .row_bytes = u->row_bytes};
        out->down[s] = (qi_weight){.type = d->type, .n_cols = n, .n_rows = E, .row_bytes = (uint64_t)n_units[s] * blk_bytes};
        sz[s][0] = up64((size_t)n * g->row_bytes);
        sz[s][1] = up64((size_t)n * u->row_bytes);
        sz[s][2] = up64((size_t)E * out->down[s].row_bytes);
        total += sz[s][0] + sz[s][1] + sz[s][2];
    }
    if (!copy || !g->data || !u->data || !d->data) { /* shapes only */
        for (int s = 0; s < 2; s++) {
            out->gate[s].data = g->data;
            out->up[s].data = u->data;
            out->down[s].data = d->data;
        }
        return QI_OK;
    }
    out->mem = qi_malloc_aligned(ALIGN, total ? total : ALIGN);
    if (!out->mem) {
        memset(out, 0, sizeof *out);
        return QI_ERR(err, QI_ERR_NOMEM, "out of memory gathering an FFN's neurons (%zu bytes)", total);
    }
    char *p = out->mem;
    for (int s = 0; s < 2; s++) {
        char *gp = p, *upp = p + sz[s][0], *dp = upp + sz[s][1];
        p = dp + sz[s][2];
        out->gate[s].data = gp;
        out->up[s].data = upp;
        out->down[s].data = dp;
        const size_t gb = (size_t)unit * g->row_bytes, ub = (size_t)unit * u->row_bytes;
        for (int i = 0; i < nu; i++) {
            if ((fast[i] ? 1 : 0) != s) continue;
            memcpy(gp, (const char *)g->data + (size_t)i * gb, gb);
            memcpy(upp, (const char *)u->data + (size_t)i * ub, ub);
            gp += gb;
            upp += ub;
        }
        const size_t zs = s ? 0 : (size_t)spare; /* units of zero bytes: zero weights */
        memset(gp, 0, zs * gb);
        memset(upp, 0, zs * ub);
        /* down: each row's blocks of this side's units, in unit order */
        for (int64_t r = 0; r < E; r++) {
            const char *src = (const char *)d->data + (size_t)r * d->row_bytes;
            char *dst = (char *)out->down[s].data + (size_t)r * out->down[s].row_bytes;
            for (int i = 0; i < nu; i++)
                if ((fast[i] ? 1 : 0) == s) {
                    memcpy(dst, src + (size_t)i * blk_bytes, blk_bytes);
                    dst += blk_bytes;
                }
            memset(dst, 0, zs * blk_bytes);
        }
    }
    return QI_OK;
}

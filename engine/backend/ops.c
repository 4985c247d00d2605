/* ops.c - the op half of the backend interface as the engine calls it
 * (backend.h, qi_backend_*): every op's arguments checked before the
 * device sees them, a failure returned naming the device and the op
 * rather than an assertion inside a kernel, and failures injected on
 * demand for tests. An op of no rows does nothing. Timing is the
 * caller's: it records the device's events around the call
 * (engine.c), so an asynchronous device is timed on its own clock.
 */
#include <stdio.h>
#include <string.h>

#include "backend.h"

void qi_dev_inject_op_fail(qi_backend *b, long n) { b->inject_op = n; }

/* The checks every op makes: a device, the injected failure's turn. */
static qi_status op_enter(qi_backend *b, const char *op, qi_err *err) {
    if (!b) return QI_ERR(err, QI_ERR_INVALID, "%s: no device", op);
    if (b->inject_op > 0 && --b->inject_op == 0)
        return QI_ERR(err, QI_ERR_BACKEND, "%s: %s: injected failure", b->info.name, op);
    return QI_OK;
}

#define OP_CHECK(cond, ...)                                                                   \
    do {                                                                                      \
        if (!(cond)) {                                                                        \
            char why_[160];                                                                   \
            snprintf(why_, sizeof why_, __VA_ARGS__);                                         \
            return QI_ERR(err, QI_ERR_INVALID, "%s: %s: %s", b->info.name, op, why_);          \
        }                                                                                     \
    } while (0)

#define OP_ENTER(name)                                 \
    static const char op[] = name;                     \
    qi_status st_ = op_enter(b, op, err);              \
    if (st_) return st_

static bool weight_ok(const qi_weight *w) { return w && w->data && w->n_rows > 0 && w->n_cols > 0; }

qi_status qi_backend_matmul_n(qi_backend *b, const qi_weight *const *w, float *const *y, int n, const float *x, int T,
                              qi_err *err) {
    OP_ENTER("matmul");
    OP_CHECK(n >= 1 && n <= 4 && w && y, "%d weights", n);
    OP_CHECK(x && T >= 0, "input of %d rows", T);
    for (int i = 0; i < n; i++) {
        OP_CHECK(weight_ok(w[i]) && y[i], "weight %d has no data or no output", i);
        OP_CHECK(w[i]->n_cols == w[0]->n_cols, "weights of %lld and %lld columns read one input",
                 (long long)w[0]->n_cols, (long long)w[i]->n_cols);
    }
    if (T) b->iface->matmul_n(b, w, y, n, x, T);
    return QI_OK;
}

qi_status qi_backend_rmsnorm(qi_backend *b, const float *x, const float *w, int T, int n, float eps, float *y,
                             qi_err *err) {
    OP_ENTER("rmsnorm");
    OP_CHECK(x && w && y && T >= 0 && n > 0 && eps >= 0.0f, "%d rows of %d", T, n);
    if (T) b->iface->rmsnorm(b, x, w, T, n, eps, y);
    return QI_OK;
}

qi_status qi_backend_rope(qi_backend *b, float *q, int Hq, float *k, int Hk, int T, int D, int n_rot,
                          const int32_t *pos, float base, float freq_scale, int mode, qi_err *err) {
    OP_ENTER("rope");
    OP_CHECK(q && pos && Hq > 0 && (!k || Hk > 0) && T >= 0, "%d rows of %d and %d heads", T, Hq, Hk);
    OP_CHECK(D > 0 && n_rot > 0 && n_rot <= D && n_rot % 2 == 0, "%d of %d values rotated", n_rot, D);
    if (T) b->iface->rope(b, q, Hq, k, Hk, T, D, n_rot, pos, base, freq_scale, mode);
    return QI_OK;
}

/* One call's shape and its slots' tables, and the partial/statistics
 * combinations backend.h allows. */
static qi_status attn_check(qi_backend *b, const char *op, const qi_attn_paged_args *a, qi_err *err) {
    OP_CHECK(a->T >= 0 && a->H > 0 && a->Hkv > 0 && a->H % a->Hkv == 0, "%d rows, %d heads over %d KV heads", a->T,
             a->H, a->Hkv);
    OP_CHECK(a->D > 0 && a->D <= 1024, "head size %d", a->D);
    OP_CHECK(a->q && a->out && a->q_pos && a->n_slots && a->pos && a->k_blk && a->v_blk, "a missing array");
    OP_CHECK(a->shift >= 0 && a->shift < 16 && a->n_swa >= 0, "block shift %d, window %d", a->shift, a->n_swa);
    OP_CHECK(!a->part_m == !a->part_l && !a->tot_m == !a->tot_l, "partial or total without its pair");
    OP_CHECK(!a->part_m || (!a->stats && !a->tot_m), "a partial result with statistics");
    OP_CHECK(!a->tot_m || a->stats, "a statistics pass without statistics");
    OP_CHECK(!a->mix || (a->vmean && !a->part_m && !a->tot_m), "a mix without mean values, or in a partial result");
    OP_CHECK(!a->x_n || (a->x_pos && a->x_k && a->x_v), "extra rows without their tables");
    OP_CHECK(!a->x_n || (!a->part_m && !a->tot_m), "extra rows in a partial result");
    OP_CHECK(!a->x_n || b->info.kind == QI_DEV_CPU || b->info.kind == QI_DEV_TEST,
             "extra rows (fetched tokens) on a device other than the host's");
    for (int hk = 0; hk < a->Hkv; hk++) {
        const int nx = a->x_n ? a->x_n[hk] : 0;
        OP_CHECK(a->n_slots[hk] >= 0 && nx >= 0, "KV head %d with %d slots and %d extra rows", hk, a->n_slots[hk], nx);
        OP_CHECK(!a->stats || a->n_slots[hk] + nx <= a->stats_stride, "KV head %d: %d slots in a statistics row of %d",
                 hk, a->n_slots[hk] + nx, a->stats_stride);
        OP_CHECK(a->n_slots[hk] == 0 || (a->pos[hk] && a->k_blk[hk] && a->v_blk[hk]), "KV head %d has no table", hk);
        OP_CHECK(nx == 0 || (a->x_pos[hk] && a->x_k[hk] && a->x_v[hk]), "KV head %d has no extra rows' table", hk);
    }
    return QI_OK;
}

qi_status qi_backend_attention(qi_backend *b, const qi_attn_paged_args *a, int n, qi_err *err) {
    OP_ENTER("attention");
    OP_CHECK(n >= 0 && (n == 0 || a), "%d calls", n);
    for (int i = 0; i < n; i++) {
        qi_status st = attn_check(b, op, &a[i], err);
        if (st) return st;
    }
    if (n) b->iface->attention_paged_n(b, a, n);
    return QI_OK;
}

qi_status qi_backend_attention_merge(qi_backend *b, const qi_attn_merge_args *a, qi_err *err) {
    OP_ENTER("attention merge");
    OP_CHECK(a && a->rows >= 0 && a->D > 0 && a->n_parts >= 1 && a->n_parts <= QI_ATTN_MAX_PARTS,
             "%d parts of %d rows", a ? a->n_parts : 0, a ? a->rows : 0);
    OP_CHECK(a->o && a->m && a->l && a->out && !a->tot_m == !a->tot_l, "a missing array");
    for (int p = 0; p < a->n_parts; p++) OP_CHECK(a->o[p] && a->m[p] && a->l[p], "part %d has no arrays", p);
    if (a->rows) b->iface->attention_merge(b, a);
    return QI_OK;
}

qi_status qi_backend_glu(qi_backend *b, bool gelu, float *gate, const float *up, int T, int n, qi_err *err) {
    OP_ENTER("glu");
    OP_CHECK(gate && up && T >= 0 && n > 0, "%d rows of %d", T, n);
    if (T) (gelu ? b->iface->geglu : b->iface->swiglu)(b, gate, up, T, n);
    return QI_OK;
}

qi_status qi_backend_kv_write(qi_backend *b, const float *const *src, uint16_t *const *dst, int n, int D, qi_err *err) {
    OP_ENTER("kv write");
    OP_CHECK(n >= 0 && D > 0 && (n == 0 || (src && dst)), "%d rows of %d", n, D);
    if (n) b->iface->kv_write(b, src, dst, n, D);
    return QI_OK;
}

qi_status qi_backend_add(qi_backend *b, float *x, const float *y, long n, qi_err *err) {
    OP_ENTER("add");
    OP_CHECK(x && y && n >= 0, "%ld values", n);
    if (n) b->iface->add(b, x, y, n);
    return QI_OK;
}

qi_status qi_backend_scale(qi_backend *b, float *x, long n, float s, qi_err *err) {
    OP_ENTER("scale");
    OP_CHECK(x && n >= 0, "%ld values", n);
    if (n) b->iface->scale(b, x, n, s);
    return QI_OK;
}

qi_status qi_backend_softcap(qi_backend *b, float *x, long n, float cap, qi_err *err) {
    OP_ENTER("softcap");
    OP_CHECK(x && n >= 0 && cap > 0.0f, "%ld values, cap %g", n, cap);
    if (n) b->iface->softcap(b, x, n, cap);
    return QI_OK;
}

qi_status qi_backend_gather_rows(qi_backend *b, float *x, const int32_t *rows, int n, int width, qi_err *err) {
    OP_ENTER("gather rows");
    OP_CHECK(x && width > 0 && n >= 0 && (n == 0 || rows), "%d rows of %d", n, width);
    for (int r = 0; r < n; r++)
        OP_CHECK(rows[r] >= r && (r == 0 || rows[r] > rows[r - 1]), "row %d from row %d", r, rows[r]);
    if (n) b->iface->gather_rows(b, x, rows, n, width);
    return QI_OK;
}

qi_status qi_backend_get_rows(qi_backend *b, const qi_weight *w, const int32_t *ids, int T, float *out, qi_err *err) {
    OP_ENTER("get rows");
    OP_CHECK(weight_ok(w) && ids && out && T >= 0, "%d rows", T);
    for (int t = 0; t < T; t++) OP_CHECK(ids[t] >= 0 && ids[t] < w->n_rows, "id %d of %lld rows", ids[t], (long long)w->n_rows);
    if (T) b->iface->get_rows(b, w, ids, T, out);
    return QI_OK;
}

/* The optional ops: a device without one says so rather than failing later. */
#define OP_OPTIONAL(fn)                                                                                        \
    do {                                                                                                       \
        if (!b->iface->fn)                                                                                     \
            return QI_ERR(err, QI_ERR_UNSUPPORTED, "%s: %s: not available on this device", b->info.name, op); \
    } while (0)

qi_status qi_backend_layernorm(qi_backend *b, const float *x, const float *w, const float *bias, int T, int n,
                               float eps, float *y, qi_err *err) {
    OP_ENTER("layernorm");
    OP_OPTIONAL(layernorm);
    OP_CHECK(x && w && y && T >= 0 && n > 0 && eps >= 0.0f, "%d rows of %d", T, n);
    if (T) b->iface->layernorm(b, x, w, bias, T, n, eps, y);
    return QI_OK;
}

qi_status qi_backend_add_bias(qi_backend *b, float *x, const float *bias, int T, int n, qi_err *err) {
    OP_ENTER("add bias");
    OP_OPTIONAL(add_bias);
    OP_CHECK(x && bias && T >= 0 && n > 0, "%d rows of %d", T, n);
    if (T) b->iface->add_bias(b, x, bias, T, n);
    return QI_OK;
}

qi_status qi_backend_act(qi_backend *b, bool gelu, float *x, int T, int n, qi_err *err) {
    OP_ENTER("activation");
    OP_OPTIONAL(act);
    OP_CHECK(x && T >= 0 && n > 0, "%d rows of %d", T, n);
    if (T) b->iface->act(b, gelu, x, T, n);
    return QI_OK;
}

/* gdcost.c - the Q-Infer paper's placement: a cost model per block and
 * device, linear in the block's features, whose coefficients gradient
 * descent corrects online from measured times, and a solver that picks
 * each layer's attention device, split ratio and MLP device to minimise
 * the predicted step time within the accelerator's memory.
 *
 * Cost model (gdcost.h): a block of class c (embedding, attention, MLP,
 * head) on a device of kind k (CPU, accelerator) takes
 * (base[k] x adj[c][k]) . (FLOPs, bytes read, 1): the device's rates,
 * shared by every class, times the class's own factors; a copy into a
 * device of kind k takes link[k] . (bytes, 1). Sharing the device's rates
 * matters: a plan runs only some classes on a device, and what its MLP
 * blocks teach about the GPU's bandwidth must reach the attention blocks
 * that a better plan would move there. The coefficients start from the hardware's
 * peaks (a profile: the simulated machine's, or profile=PATH) times
 * init_scale, and every observation moves them by a gradient step on the
 * squared relative error of predicted against measured times, taken in
 * log space so that they stay positive: coef *= exp(-lr x err x share),
 * share being the coefficient's part of the prediction. A linear model of
 * a roofline (the max of compute and memory time) is exact only per
 * workload; the online steps re-fit it as the workload moves, which is
 * what the paper's correction is for.
 *
 * Solver: a dynamic program over the layers whose state is the device
 * holding the hidden state and the accelerator memory used so far (in
 * `grid` units), with the copies between consecutive blocks in the cost,
 * the head chosen last and the embedding on the host. With identical
 * layers the states stay few; the program is exact for the model up to
 * the rounding of memory to the grid (qi_placement_check has the last
 * word, and a plan it refuses is solved again with 2% less room).
 *
 * Re-planning between steps is the caller's (qi_placement_ctl_tick): it
 * weighs predict() of the current and the new plan over the steps left
 * against the time to move the weights and KV.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "placement/gdcost.h"
#include "qinfer/model.h"

extern const qi_placement_policy_i qi_placement_gdcost_policy;

/* ---- features ------------------------------------------------------------------------- */

static int block_class(int n_layer, int b) {
    if (b == 0) return QI_GD_EMBD;
    if (b == 2 * n_layer + 1) return QI_GD_HEAD;
    return (b - 1) % 2 == 0 ? QI_GD_ATTN : QI_GD_MLP;
}

/* the context a layer's attention reads: a sliding-window layer's window */
static double layer_ctx(const qi_model *m, const qi_placement_workload *wl, int l) {
    double ctx = wl->prompt_len > 0 ? wl->prompt_len : 1;
    if (m->hp.n_swa > 0 && m->layers[l].swa && ctx > m->hp.n_swa) ctx = m->hp.n_swa;
    return ctx;
}

void qi_gd_features(const qi_model *m, const qi_placement_workload *wl, int b, double share, bool main,
                    double f[QI_GD_FEATURES]) {
    const qi_hparams *hp = &m->hp;
    const double T = wl->batch > 0 ? wl->batch : 1, E = hp->n_embd, F = hp->n_ff, V = hp->n_vocab,
                 qw = (double)hp->n_head * hp->head_dim, kw = (double)hp->n_head_kv * hp->head_dim;
    const int c = block_class(hp->n_layer, b);
    f[QI_GD_FIXED] = 1;
    switch (c) {
    case QI_GD_EMBD:
        f[QI_GD_FLOPS] = 0;
        f[QI_GD_BYTES] = T * ((double)m->tok_embd.row_bytes + 4 * E);
        break;
    case QI_GD_ATTN: {
        const double ctx = layer_ctx(m, wl, (b - 1) / 2);
        const double att_f = share * 4 * T * ctx * qw, kv_b = share * T * ctx * kw * 4;
        if (main) {
            f[QI_GD_FLOPS] = 2 * T * (2 * E * qw + 2 * E * kw) + att_f;
            f[QI_GD_BYTES] = (double)qi_plan_block_bytes(m, b) + kv_b + T * 4 * (3 * E + 2 * qw + 2 * kw);
        } else {
            f[QI_GD_FLOPS] = att_f;
            f[QI_GD_BYTES] = kv_b + T * 4 * (2 * qw + 2 * kw);
        }
        break;
    }
    case QI_GD_MLP:
        f[QI_GD_FLOPS] = 2 * T * 3 * E * F;
        f[QI_GD_BYTES] = (double)qi_plan_block_bytes(m, b) + T * 4 * (2 * E + 3 * F);
        break;
    default: /* the head */
        f[QI_GD_FLOPS] = 2 * T * E * V;
        f[QI_GD_BYTES] = (double)qi_plan_block_bytes(m, b) + T * 4 * (E + V);
        break;
    }
}

double qi_gd_coef(const qi_gd_model *g, int c, int k, int f) { return g->base[k][f] * g->adj[c][k][f]; }

/* predicted seconds of features f as class c on kind k */
static double cost(const qi_gd_model *g, int c, int k, const double *f) {
    double t = 0;
    for (int i = 0; i < QI_GD_FEATURES; i++) t += qi_gd_coef(g, c, k, i) * f[i];
    return t;
}

void qi_gd_model_init(qi_gd_model *g, const qi_hwprofile *hw, double scale) {
    memset(g, 0, sizeof *g);
    /* kernels per block as the engine issues them (norms, matmuls, RoPE,
     * KV write, attention, residual), for the fixed cost */
    static const double kernels[QI_GD_CLASSES] = {2, 9, 6, 3};
    const double cpu_rate = hw->cpu_int8.set ? hw->cpu_int8.value : hw->cpu_fp32.value;
    g->base[0][QI_GD_FLOPS] = scale / cpu_rate;
    g->base[0][QI_GD_BYTES] = scale / hw->cpu_mem_bw.value;
    g->base[0][QI_GD_FIXED] = scale * 4e-6;
    g->base[1][QI_GD_FLOPS] = hw->has_gpu ? scale / hw->gpu_fp16_tensor.value : 0;
    g->base[1][QI_GD_BYTES] = hw->has_gpu ? scale / hw->gpu_mem_bw.value : 0;
    g->base[1][QI_GD_FIXED] = hw->has_gpu ? scale * hw->gpu_launch.value : 0;
    for (int c = 0; c < QI_GD_CLASSES; c++)
        for (int k = 0; k < 2; k++) {
            g->adj[c][k][QI_GD_FLOPS] = g->adj[c][k][QI_GD_BYTES] = 1;
            g->adj[c][k][QI_GD_FIXED] = kernels[c];
        }
    if (hw->has_gpu) {
        g->link[0][0] = scale / hw->link_d2h_bw.value;
        g->link[1][0] = scale / hw->link_h2d_bw.value;
        g->link[0][1] = g->link[1][1] = scale * hw->link_latency.value;
    }
}

static double copy_t(const qi_gd_model *g, int kind, double bytes) {
    return g->link[kind][0] * bytes + g->link[kind][1];
}

static int kind_of(int d) { return d == 0 ? 0 : 1; }

/* A layer's attention on device a with r of its KV on s: its time and the
 * copies it makes. Split, the queries, keys and values go to s after the
 * projections and the partial result comes back, and the two partial
 * attentions overlap: the second device's part costs only what it takes
 * beyond the first's own attention. */
static double attn_time(const qi_gd_model *g, const qi_model *m, const qi_placement_workload *wl, int l, int a, float r,
                        int s) {
    double f[QI_GD_FEATURES];
    const int b = 1 + 2 * l;
    qi_gd_features(m, wl, b, r > 0 ? 1.0 - r : 1.0, true, f);
    const double main_t = cost(g, QI_GD_ATTN, kind_of(a), f);
    if (r <= 0) return main_t;
    const qi_hparams *hp = &m->hp;
    const double T = wl->batch > 0 ? wl->batch : 1, qw = (double)hp->n_head * hp->head_dim,
                 kw = (double)hp->n_head_kv * hp->head_dim;
    qi_gd_features(m, wl, b, 1.0 - r, false, f);
    const double own = cost(g, QI_GD_ATTN, kind_of(a), f);
    qi_gd_features(m, wl, b, r, false, f);
    const double part = cost(g, QI_GD_ATTN, kind_of(s), f);
    const double copies =
        copy_t(g, kind_of(s), T * 4 * (qw + 2 * kw)) + copy_t(g, kind_of(a), T * 4 * (qw + 2 * hp->n_head));
    return main_t + copies + (part > own ? part - own : 0);
}

static double block_time(const qi_gd_model *g, const qi_model *m, const qi_placement_workload *wl, int b, int d) {
    double f[QI_GD_FEATURES];
    qi_gd_features(m, wl, b, 1.0, true, f);
    return cost(g, block_class(m->hp.n_layer, b), kind_of(d), f);
}

double qi_gd_predict(const qi_gd_model *g, const qi_model *m, const qi_placement_workload *wl, const qi_plan *p) {
    const qi_hparams *hp = &m->hp;
    const double T = wl->batch > 0 ? wl->batch : 1, hid = T * 4 * hp->n_embd;
    int x = p->embd_dev;
    double t = block_time(g, m, wl, 0, x);
    for (int l = 0; l < hp->n_layer; l++) {
        const qi_plan_layer *y = &p->layers[l];
        if (x != y->attn_dev) t += copy_t(g, kind_of(y->attn_dev), hid);
        t += attn_time(g, m, wl, l, y->attn_dev, y->split, y->split_dev);
        if (y->attn_dev != y->mlp_dev) t += copy_t(g, kind_of(y->mlp_dev), hid);
        t += block_time(g, m, wl, 2 + 2 * l, y->mlp_dev);
        x = y->mlp_dev;
    }
    if (x != p->head_dev) t += copy_t(g, kind_of(p->head_dev), hid);
    t += block_time(g, m, wl, 2 * hp->n_layer + 1, p->head_dev);
    if (p->head_dev != 0) t += copy_t(g, 0, T * 4 * hp->n_vocab);
    return t;
}

/* ---- the solver ----------------------------------------------------------------------- */

typedef struct {
    float time;  /* predicted seconds so far (INFINITY: unreachable) */
    int prev_u;  /* the memory state before this layer */
    uint8_t prev_x, choice; /* choice: attn dev | split index << 1 | mlp dev << 4 */
} dp_cell;

void qi_gd_solve(const qi_gd_model *g, const qi_model *m, const qi_placement_workload *wl, int acc, double room,
                 size_t (*block_bytes)(const void *ctx, int b), const void *ctx, const float *splits, int n_splits,
                 int grid, qi_plan *out) {
    const qi_hparams *hp = &m->hp;
    const int L = hp->n_layer, G = grid, NS = n_splits + 1;
    const double unit = room > 0 ? room / G : 1.0;
    const double T = wl->batch > 0 ? wl->batch : 1, hid = T * 4 * hp->n_embd;
    float rs[16] = {0};
    for (int i = 0; i < n_splits && i < 15; i++) rs[i + 1] = splits[i];
    /* cells [l + 1][x][u]: after layer l, hidden state on x (0 CPU, 1 acc), u units used */
    const size_t per = 2 * (size_t)(G + 1);
    dp_cell *cell = qi_malloc(sizeof *cell * per * (size_t)(L + 1));
    if (!cell) return; /* out keeps the all-CPU plan it came with */
    for (size_t i = 0; i < per * (size_t)(L + 1); i++) cell[i] = (dp_cell){INFINITY, 0, 0, 0};
#define CELL(l, x, u) cell[(size_t)(l) * per + (size_t)(x) * (G + 1) + (size_t)(u)]
    CELL(0, 0, 0).time = (float)block_time(g, m, wl, 0, 0);
    for (int l = 0; l < L; l++) {
        const double kv = (double)qi_placement_kv_bytes(m, wl, l);
        const double wa = (double)block_bytes(ctx, 1 + 2 * l), wm = (double)block_bytes(ctx, 2 + 2 * l);
        const double t_mlp[2] = {block_time(g, m, wl, 2 + 2 * l, 0), block_time(g, m, wl, 2 + 2 * l, acc)};
        for (int a = 0; a < 2; a++)
            for (int si = 0; si < NS; si++) {
                const float r = rs[si];
                const int ad = a ? acc : 0, sd = a ? 0 : acc;
                const double t_att = attn_time(g, m, wl, l, ad, r, sd);
                /* accelerator bytes of the attention: its weights and KV share there */
                const double att_mem = a ? wa + (1.0 - r) * kv : r * kv;
                for (int f = 0; f < 2; f++) {
                    const double mem = att_mem + (f ? wm : 0);
                    const int du = (int)ceil(mem / unit - 1e-9);
                    if (du > G) continue;
                    const double step = t_att + (a != f ? copy_t(g, f, hid) : 0) + t_mlp[f];
                    for (int x = 0; x < 2; x++)
                        for (int u = 0; u + du <= G; u++) {
                            const dp_cell *c = &CELL(l, x, u);
                            if (!isfinite(c->time)) continue;
                            const double t = c->time + (x != a ? copy_t(g, a, hid) : 0) + step;
                            dp_cell *n = &CELL(l + 1, f, u + du);
                            if (t < n->time) *n = (dp_cell){(float)t, u, (uint8_t)x, (uint8_t)(a | si << 1 | f << 4)};
                        }
                }
            }
    }
    /* the head, and the best end */
    const int hb = 2 * L + 1;
    const double wh = (double)block_bytes(ctx, hb);
    const int dh = (int)ceil(wh / unit - 1e-9);
    double best = INFINITY;
    int bx = 0, bu = 0, bh = 0;
    for (int x = 0; x < 2; x++)
        for (int u = 0; u <= G; u++) {
            const dp_cell *c = &CELL(L, x, u);
            if (!isfinite(c->time)) continue;
            for (int h = 0; h < 2; h++) {
                if (h && u + dh > G) continue;
                const double t = c->time + (x != h ? copy_t(g, h, hid) : 0) + block_time(g, m, wl, hb, h ? acc : 0) +
                                 (h ? copy_t(g, 0, T * 4 * hp->n_vocab) : 0);
                if (t < best) best = t, bx = x, bu = u, bh = h;
            }
        }
    if (isfinite(best)) {
        out->embd_dev = 0;
        out->head_dev = bh ? acc : 0;
        int x = bx, u = bu;
        for (int l = L; l > 0; l--) {
            const dp_cell *c = &CELL(l, x, u);
            const int a = c->choice & 1, si = (c->choice >> 1) & 7, f = (c->choice >> 4) & 1;
            qi_plan_layer *y = &out->layers[l - 1];
            y->attn_dev = a ? acc : 0;
            y->mlp_dev = f ? acc : 0;
            y->split = rs[si];
            y->split_dev = rs[si] > 0 ? (a ? 0 : acc) : -1;
            x = c->prev_x;
            u = c->prev_u;
        }
    }
#undef CELL
    qi_free(cell);
}

/* ---- learning -------------------------------------------------------------------------- */

/* sums per (class, kind): predicted, measured, and each feature's part */
typedef struct {
    double pred, meas, part[QI_GD_FEATURES];
} fit_acc;

static void acc_add(fit_acc *a, const qi_gd_model *g, int c, int k, const double *f, double meas) {
    for (int i = 0; i < QI_GD_FEATURES; i++) a->part[i] += qi_gd_coef(g, c, k, i) * f[i];
    a->pred += cost(g, c, k, f);
    a->meas += meas;
}

/* The clamped relative error of a sum, 0 when there is nothing to fit. */
static double rel_err(const fit_acc *a) {
    if (!(a->pred > 0) || !(a->meas > 0)) return 0;
    const double e = a->pred / a->meas - 1;
    return e > 3 ? 3 : e < -0.9 ? -0.9 : e;
}

/* coef *= exp(-lr x e x share), for each part */
static void step(double *coef, int n, const fit_acc *a, double lr) {
    const double e = rel_err(a);
    if (e == 0) return;
    for (int k = 0; k < n; k++)
        if (a->part[k] > 0) coef[k] *= exp(-lr * e * a->part[k] / a->pred);
}

void qi_gd_observe(qi_gd_model *g, const qi_model *m, const qi_placement_times *t, double lr) {
    if (!t || !t->plan || !t->wl || !t->block_s) return;
    const qi_plan *p = t->plan;
    const qi_hparams *hp = &m->hp;
    const int L = hp->n_layer;
    fit_acc acc[QI_GD_CLASSES][2];
    memset(acc, 0, sizeof acc);
    double f[QI_GD_FEATURES];
    for (int b = 0; b < qi_plan_n_blocks(L); b++) {
        const int c = block_class(L, b);
        if (c == QI_GD_ATTN && p->layers[(b - 1) / 2].split > 0) {
            const qi_plan_layer *y = &p->layers[(b - 1) / 2];
            if (!t->split_s) continue;
            qi_gd_features(m, t->wl, b, y->split, false, f);
            acc_add(&acc[c][kind_of(y->split_dev)], g, c, kind_of(y->split_dev), f, t->split_s[b]);
            continue;
        }
        const int k = kind_of(qi_plan_block_dev(p, b));
        qi_gd_features(m, t->wl, b, 1.0, true, f);
        acc_add(&acc[c][k], g, c, k, f, t->block_s[b]);
    }
    /* the devices' bases from every class they ran, each class weighted by
     * its share of the device's measured time; then the classes' own */
    double base_step[2][QI_GD_FEATURES], dev_meas[2] = {0, 0};
    memset(base_step, 0, sizeof base_step);
    for (int c = 0; c < QI_GD_CLASSES; c++)
        for (int k = 0; k < 2; k++)
            if (rel_err(&acc[c][k]) != 0) dev_meas[k] += acc[c][k].meas;
    for (int c = 0; c < QI_GD_CLASSES; c++)
        for (int k = 0; k < 2; k++) {
            const fit_acc *a = &acc[c][k];
            const double e = rel_err(a);
            if (e == 0) continue;
            for (int i = 0; i < QI_GD_FEATURES; i++)
                if (a->part[i] > 0) base_step[k][i] += -lr * e * a->part[i] / a->pred * a->meas / dev_meas[k];
            step(g->adj[c][k], QI_GD_FEATURES, a, lr / 4);
        }
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < QI_GD_FEATURES; i++) g->base[k][i] *= exp(base_step[k][i]);
    if (!t->copy_s) return;
    /* the copies into each device the plan makes in a step */
    const double T = t->wl->batch > 0 ? t->wl->batch : 1, hid = T * 4 * hp->n_embd;
    const double qw = (double)hp->n_head * hp->head_dim, kw = (double)hp->n_head_kv * hp->head_dim;
    fit_acc la[2];
    memset(la, 0, sizeof la);
    double lf[2];
    for (int d = 0; d < p->n_devices; d++) {
        double bytes = 0, n = 0;
        int x = p->embd_dev;
        for (int l = 0; l < L; l++) {
            const qi_plan_layer *y = &p->layers[l];
            if (x != y->attn_dev && y->attn_dev == d) bytes += hid, n++;
            if (y->split > 0 && y->split_dev == d) bytes += T * 4 * (qw + 2 * kw), n++;
            if (y->split > 0 && y->attn_dev == d) bytes += T * 4 * (qw + 2 * hp->n_head), n++;
            if (y->attn_dev != y->mlp_dev && y->mlp_dev == d) bytes += hid, n++;
            x = y->mlp_dev;
        }
        if (x != p->head_dev && p->head_dev == d) bytes += hid, n++;
        if (n == 0) continue;
        lf[0] = bytes, lf[1] = n;
        fit_acc *a = &la[kind_of(d)];
        a->part[0] += g->link[kind_of(d)][0] * lf[0];
        a->part[1] += g->link[kind_of(d)][1] * lf[1];
        a->pred += g->link[kind_of(d)][0] * lf[0] + g->link[kind_of(d)][1] * lf[1];
        a->meas += t->copy_s[d];
    }
    for (int k = 0; k < 2; k++) step(g->link[k], 2, &la[k], lr);
}

/* ---- the policy ------------------------------------------------------------------------ */

typedef struct {
    qi_placement_policy base;
    qi_gd_model g;
    bool ready; /* g initialised from a profile */
    qi_hwprofile prof; /* profile=PATH, when given */
    bool have_prof;
    double scale, lr, s_kind[2]; /* init_scale; init_cpu, init_gpu */
    long grid, reserve;
    bool splits;
    /* the model and devices of the last plan: the sizes of blocks during a
     * solve, and the model the observed times come from */
    const qi_model *m;
    const qi_placement_devices *devs;
    int acc;
} gd_policy;

static qi_status gd_create(const qi_params *params, qi_placement_policy **out, qi_err *err) {
    static const char *const known[] = {"profile", "init_scale", "init_cpu", "init_gpu", "lr", "grid", "split",
                                        "reserve", NULL};
    double scale = 1, lr = 0.5, s_cpu = 1, s_gpu = 1;
    long grid = 4096, reserve = 0;
    bool split = true;
    qi_status st = qi_params_check_known(params, "gdcost", known, err);
    if (!st) st = qi_params_double(params, "gdcost", "init_scale", 1, 1e-3, 1e3, &scale, err);
    if (!st) st = qi_params_double(params, "gdcost", "init_cpu", 1, 1e-3, 1e3, &s_cpu, err);
    if (!st) st = qi_params_double(params, "gdcost", "init_gpu", 1, 1e-3, 1e3, &s_gpu, err);
    if (!st) st = qi_params_double(params, "gdcost", "lr", 0.5, 0, 10, &lr, err);
    if (!st) st = qi_params_int(params, "gdcost", "grid", 4096, 16, 65536, &grid, err);
    if (!st) st = qi_params_int(params, "gdcost", "reserve", 0, 0, 1L << 50, &reserve, err);
    if (!st) st = qi_params_bool(params, "gdcost", "split", true, &split, err);
    if (st) return st;
    gd_policy *p = qi_calloc(1, sizeof *p);
    if (!p) return QI_ERR(err, QI_ERR_NOMEM, "gdcost: out of memory");
    p->base.iface = &qi_placement_gdcost_policy;
    p->scale = scale, p->lr = lr, p->grid = grid, p->reserve = reserve, p->splits = split;
    p->s_kind[0] = s_cpu, p->s_kind[1] = s_gpu;
    const char *path = qi_params_get(params, "profile");
    if (path) {
        qi_err e = {0};
        st = qi_hwprofile_load(path, &p->prof, &e);
        if (!st && !p->prof.has_gpu) st = QI_ERR(&e, QI_ERR_INVALID, "%s: kind %s has no GPU", path, p->prof.kind);
        if (st) {
            qi_free(p);
            return QI_ERR(err, st, "gdcost: profile: %s", e.msg);
        }
        p->have_prof = true;
    }
    *out = &p->base;
    return QI_OK;
}

/* The coefficients' start: profile=PATH, else the simulated machine's. */
static qi_status ready(gd_policy *p, const qi_placement_devices *devs, qi_err *err) {
    if (p->ready) return QI_OK;
    const qi_hwprofile *hw = p->have_prof ? &p->prof : devs->profile;
    if (!hw || !hw->has_gpu)
        return QI_ERR(err, QI_ERR_INVALID, "gdcost: its cost model starts from a profile's figures: give "
                                           "profile=PATH (engine/backend/sim/profiles/) or run on --sim PROFILE");
    qi_gd_model_init(&p->g, hw, p->scale);
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < QI_GD_FEATURES; i++) p->g.base[k][i] *= p->s_kind[k];
    p->ready = true;
    return QI_OK;
}

/* A block's bytes on the accelerator: its own form's with an engine, else the rows. */
static size_t bytes_on(const void *ctx, int b) {
    const gd_policy *p = ctx;
    return p->devs->engine ? qi_engine_block_bytes(p->devs->engine, p->acc, b) : qi_plan_block_bytes(p->m, b);
}

static qi_status gd_plan(qi_placement_policy *pp, const qi_model *m, const qi_placement_devices *devs,
                         const qi_placement_workload *wl, qi_plan *out, qi_err *err) {
    gd_policy *p = (gd_policy *)pp;
    const int acc = qi_placement_accel(devs);
    if (acc < 0) return QI_OK;
    qi_status st = ready(p, devs, err);
    if (st) return st;
    const qi_placement_device *dv = &devs->dev[acc];
    double room = dv->capacity ? (double)(dv->free < dv->capacity ? dv->free : dv->capacity) : 1e18;
    if (!dv->holds_act) room -= (double)qi_placement_act_bytes(m, wl, devs->n_devices);
    room -= (double)p->reserve;
    if (room < 0) room = 0;
    static const float ratios[3] = {0.25f, 0.5f, 0.75f};
    p->devs = devs;
    p->m = m;
    p->acc = acc;
    for (int tries = 0; tries < 20; tries++) {
        qi_plan_all_host(m->hp.n_layer, out, NULL);
        /* a budgeted KV policy evicts, which a split layer cannot (the engine refuses it) */
        const int n_splits = p->splits && wl->kv_budget == 0 ? 3 : 0;
        qi_gd_solve(&p->g, m, wl, acc, room, bytes_on, p, ratios, n_splits, (int)p->grid, out);
        if (qi_placement_check(m, devs, wl, out, (size_t)p->reserve, NULL) == QI_OK) return QI_OK;
        room *= 0.98; /* the grid rounded a little past the room */
    }
    return qi_plan_all_host(m->hp.n_layer, out, err);
}

static void gd_observe(qi_placement_policy *pp, const qi_placement_times *t) {
    gd_policy *p = (gd_policy *)pp;
    if (!p->ready || !t->wl || !p->m || t->plan->n_layer != p->m->hp.n_layer) return;
    qi_gd_observe(&p->g, p->m, t, p->lr); /* the model of the plans it made */
}

static double gd_predict(qi_placement_policy *pp, const qi_model *m, const qi_placement_devices *devs,
                         const qi_placement_workload *wl, const qi_plan *plan) {
    gd_policy *p = (gd_policy *)pp;
    if (ready(p, devs, NULL)) return NAN;
    return qi_gd_predict(&p->g, m, wl, plan);
}

static void gd_free(qi_placement_policy *p) { qi_free(p); }

const qi_placement_policy_i qi_placement_gdcost_policy = {
    .version = QI_PLACEMENT_POLICY_VERSION,
    .name = "gdcost",
    .summary = "Q-Infer's: a per-block cost model corrected online by gradient descent, solved per layer by "
               "dynamic programming (attention device, split ratio, MLP device)",
    .params = "profile=PATH (default: the simulated machine's), init_scale=1, init_cpu=1, init_gpu=1 (factors on the "
              "starting coefficients), lr=0.5, grid=4096, split=1, reserve=0",
    .create = gd_create,
    .plan = gd_plan,
    .observe = gd_observe,
    .free = gd_free,
    .predict = gd_predict,
};

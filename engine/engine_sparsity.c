/* engine_sparsity.c - training-free activation sparsity on the CPU
 * (opts.sparsity: teal thresholds the inputs of every matrix, cats the
 * gate's activations) and the activation observers. A thresholded site
 * keeps the union of its active columns over the step's rows; the
 * matrices are then read by those rows (cats's up: the dense kernels,
 * equal bit for bit to the dense matmul of the zeroed input) or by those
 * columns (their column forms, sparse.h: a float product over the exact
 * weights of the activations the dense matmul reads, quantised to 8 bits
 * and turned back to floats; the two paths' results differ in rounding
 * only, paper-repro claim 12).
 * Paused (qi_engine_sparsity_pause), a step takes the dense path. */
#include "engine_int.h"

float eng_sp_thr(const qi_engine *e, int l, int site) {
    return e->o.sparsity && !e->sp.paused ? e->o.sparsity->thr[(size_t)l * QI_SITE_COUNT + (size_t)site] : -1.0f;
}

/* The activations x [T][n] at a site of layer l (on the CPU, where every
 * layer runs when either is set): shown to opts.act_observe, then zeroed
 * where |x| <= the site's threshold. Returns the active columns (the union
 * over the rows, in e->sp.idx), or -1 where the site is not thresholded. */
int eng_sp_site(qi_engine *e, int l, int site, float *x, int T, int n) {
    if (e->o.act_observe) e->o.act_observe(e->o.act_observe_ctx, l, site, x, T, n);
    const float t = eng_sp_thr(e, l, site);
    if (t < 0.0f) return -1;
    long z = 0;
    const int k = qi_sparse_threshold(x, (size_t)n, T, n, t, e->sp.idx, &z);
    e->sp.zeroed += (double)z;
    e->sp.seen += (double)T * n;
    return k;
}

/* The 32-row chunks of all the job's matrices, one after another, split
 * evenly over the threads. */
static void sp_work(void *arg, int ith, int nth) {
    const sp_job *j = arg;
    long total = 0;
    for (int i = 0; i < j->n_w; i++) total += (long)(j->w[i]->n_out / 32);
    long lo, hi, off = 0;
    qi_split(total, ith, nth, &lo, &hi);
    for (int i = 0; i < j->n_w; i++) {
        const long n = (long)(j->w[i]->n_out / 32);
        const long a = lo - off < 0 ? 0 : lo - off > n ? n : lo - off, b = hi - off < 0 ? 0 : hi - off > n ? n : hi - off;
        if (a < b)
            j->fn(j->w[i], j->x, (size_t)j->w[i]->n_in, j->T, j->idx, j->n_idx, j->y[i], (size_t)j->w[i]->n_out,
                  32 * a, 32 * b);
        off += n;
    }
}

qi_status eng_sp_run(qi_engine *e, sp_job *j) {
    qi_backend_cpu_host_run(e->be, sp_work, j);
    return QI_OK;
}

/* x [T][n] as the dense matmul of w's type reads it: each row quantised
 * to qi_vec_dot_type's 8-bit blocks (the kernels' quantiser, in
 * e->sp.xq) and turned back to floats in xd, so that the column forms
 * multiply the dense path's activations (zeros stay zeros). */
void eng_sp_act8(qi_engine *e, uint32_t dt, const float *x, int T, int64_t n, float *xd) {
    uint64_t qb = 0;
    qi_type_row_bytes(dt, (uint64_t)n, &qb);
    for (int t = 0; t < T; t++) {
        char *q = (char *)e->sp.xq + (uint64_t)t * qb;
        qi_quantize_act_row(dt, x + (size_t)t * (size_t)n, q, n);
        qi_dequantize_row_ref(dt, q, xd + (size_t)t * (size_t)n, n);
    }
}

/* Matmuls of layer l's matrices wi[0..n) (SP_W_*) reading x [T][n_in]
 * whose active columns are e->sp.idx[0..n_idx) (n_idx < 0: not
 * thresholded): the sparse kernels where every matrix has a column form
 * and few enough columns are active, else the dense matmul of the zeroed
 * x. Both read the same 8-bit activations (eng_sp_act8: the column forms take
 * them as floats), so the path a site takes changes the rounding and no
 * more: a perplexity curve does not depend on which steps went sparse
 * (before, the column forms' exact float activations scored 0.4-0.9%
 * lower on SmolLM2 than the dense path at every sparsity, 0 included). */
qi_status eng_mm_site(qi_engine *e, qi_backend *b, int l, const int *wi, const qi_weight *const *w, float *const *y,
                      int n, const float *x, int T, int n_idx, qi_err *err) {
    qi_status st;
    qi_event *t_op;
    bool sparse = n_idx >= 0 && e->sp.w && !e->sp.paused &&
                  (double)n_idx <= e->o.sparse_max_density * (double)w[0]->n_cols;
    const qi_colw *cw[SP_W_COUNT];
    for (int i = 0; i < n && sparse; i++) {
        cw[i] = &e->sp.w[(size_t)l * SP_W_COUNT + (size_t)wi[i]];
        sparse = cw[i]->codes != NULL;
    }
    if (!sparse) return eng_matmul_n(e, b, w, y, n, x, T, err);
    /* the matrices in runs of one activation type, each run's x quantised once */
    for (int i0 = 0; i0 < n;) {
        const uint32_t dt = qi_vec_dot_type(w[i0]->type);
        sp_job j = {.x = e->sp.xd, .T = T, .idx = e->sp.idx, .n_idx = n_idx, .fn = qi_sparse_matmul()};
        for (; i0 < n && qi_vec_dot_type(w[i0]->type) == dt; i0++) {
            j.w[j.n_w] = cw[i0];
            j.y[j.n_w++] = y[i0];
        }
        if ((st = eng_op_begin(e, b, &t_op, err))) return st;
        eng_sp_act8(e, dt, x, T, w[0]->n_cols, e->sp.xd);
        if ((st = eng_op_end(e, b, t_op, QI_OP_MATMUL, eng_sp_run(e, &j), err))) return st;
        if (e->o.profile)
            for (int i = 0; i < j.n_w; i++)
                e->prof.matmul_bytes += (double)j.w[i]->col_bytes * n_idx + (double)qi_colw_bytes(j.w[i]) -
                                        (double)j.w[i]->col_bytes * (double)j.w[i]->n_in;
    }
    return QI_OK;
}

typedef struct {
    const qi_weight *w;
    qi_k_gemm_fn gemm;
    const void *xq;
    uint64_t qrow_bytes;
    int T;
    const int32_t *rows;
    int n_rows;
    float *y;
} rows_job;

/* Rows [r0, r1) of w, every token: y[t][r] = w_r . xq_t, in the dense
 * matmul's order (the kernels' dots do not depend on how many rows a call
 * takes), so they equal the dense matmul's bit for bit. */
static void rows_range(const qi_weight *w, qi_k_gemm_fn gemm, const void *xq, uint64_t qrow_bytes, int T, long r0,
                       long r1, float *y) {
    const void *wr = (const char *)w->data + (uint64_t)r0 * w->row_bytes;
    if (!gemm) {
        for (long r = r0; r < r1; r++)
            for (int t = 0; t < T; t++)
                y[(long)t * w->n_rows + r] = qi_vec_dot_ref(w->type, w->n_cols,
                                                            (const char *)w->data + (uint64_t)r * w->row_bytes,
                                                            (const char *)xq + (uint64_t)t * qrow_bytes);
        return;
    }
    for (int t0 = 0; t0 < T; t0 += 32) {
        const int nt = T - t0 < 32 ? T - t0 : 32;
        gemm(w->n_cols, wr, w->row_bytes, (int)(r1 - r0), (const char *)xq + (uint64_t)t0 * qrow_bytes, qrow_bytes,
             nt, y + (long)t0 * w->n_rows + r0, (size_t)w->n_rows);
    }
}

/* rows_range over the listed rows rows[0 .. n) (ascending), each run of
 * consecutive ones in one call, so the kernels' multi-row paths work as in
 * the dense matmul. */
static void rows_runs(const qi_weight *w, qi_k_gemm_fn gemm, const void *xq, uint64_t qrow_bytes, int T,
                      const int32_t *rows, long n, float *y) {
    for (long k = 0; k < n;) {
        long q = k + 1;
        while (q < n && rows[q] == rows[q - 1] + 1) q++;
        rows_range(w, gemm, xq, qrow_bytes, T, rows[k], rows[q - 1] + 1, y);
        k = q;
    }
}

/* Rows of up for cats: the listed rows, split evenly over the threads. */
static void rows_work(void *arg, int ith, int nth) {
    const rows_job *j = arg;
    long lo, hi;
    qi_split(j->n_rows, ith, nth, &lo, &hi);
    rows_runs(j->w, j->gemm, j->xq, j->qrow_bytes, j->T, j->rows + lo, hi - lo, j->y);
}

static qi_status rows_run(qi_engine *e, rows_job *j, const float *x) {
    const uint32_t dt = qi_vec_dot_type(j->w->type);
    for (int t = 0; t < j->T; t++)
        qi_quantize_act_row(dt, x + (size_t)t * (size_t)j->w->n_cols, (char *)j->xq + (uint64_t)t * j->qrow_bytes,
                            j->w->n_cols);
    qi_backend_cpu_host_run(e->be, rows_work, j);
    return QI_OK;
}

/* y [T][w->n_rows] = x . W^T at the rows listed (the others left as they
 * are): cats's up. */
qi_status eng_mm_rows(qi_engine *e, qi_backend *b, const qi_weight *w, const float *x, int T, const int32_t *rows,
                      int n_rows, float *y, qi_err *err) {
    qi_status st;
    qi_event *t_op;
    const qi_kernels *k = qi_kernels_get();
    rows_job j = {.w = w, .xq = e->sp.xq, .T = T, .rows = rows, .n_rows = n_rows, .y = y};
    j.gemm = T >= QI_K_WIDE_MIN && k->gemm_wide[w->type] ? k->gemm_wide[w->type] : k->gemm[w->type];
    qi_type_row_bytes(qi_vec_dot_type(w->type), (uint64_t)w->n_cols, &j.qrow_bytes);
    if ((st = eng_op_begin(e, b, &t_op, err)) ||
        (st = eng_op_end(e, b, t_op, QI_OP_MATMUL, rows_run(e, &j, x), err)))
        return st;
    if (e->o.profile) e->prof.matmul_bytes += (double)w->row_bytes * n_rows;
    return QI_OK;
}

double qi_engine_sparsity_measured(const qi_engine *e) { return e->sp.seen > 0 ? e->sp.zeroed / e->sp.seen : -1.0; }

void qi_engine_sparsity_pause(qi_engine *e, bool paused) { e->sp.paused = paused && e->sp.w; }

/* Whether a step's sites go through the sparsity path: under opts.sparsity
 * not paused, or with an observer (which sees every step). */
bool eng_sp_path(const qi_engine *e) { return (e->sp.w && !e->sp.paused) || e->o.act_observe; }

/* The column forms opts.sparsity's mode reads (teal: every matrix of a
 * layer; cats: down) and the scratch for R rows a step. */
qi_status eng_sparse_setup(qi_engine *e, size_t R, qi_err *err) {
    const qi_hparams *hp = &e->m->hp;
    const qi_sparsity *sp = e->o.sparsity;
    if (!sp && !e->o.act_observe) return QI_OK;
    if (sp && (sp->n_layer != hp->n_layer || !sp->thr || (sp->mode != QI_SPARSITY_TEAL && sp->mode != QI_SPARSITY_CATS)))
        return QI_ERR(err, QI_ERR_INVALID, "sparsity thresholds for %d layers, and the model has %d", sp->n_layer,
                      hp->n_layer);
    if (!(e->o.sparse_max_density >= 0.0 && e->o.sparse_max_density <= 1.0))
        return QI_ERR(err, QI_ERR_INVALID, "sparse_max_density %g outside [0, 1]", e->o.sparse_max_density);
    if (sp) { /* the engine's own copy: the caller's may go */
        const size_t n = (size_t)hp->n_layer * QI_SITE_COUNT;
        e->sp.cfg = *sp;
        e->sp.cfg.thr = qi_malloc(sizeof(float) * n);
        if (!e->sp.cfg.thr) return QI_ERR(err, QI_ERR_NOMEM, "out of memory for the sparsity thresholds");
        memcpy(e->sp.cfg.thr, sp->thr, sizeof(float) * n);
        e->o.sparsity = sp = &e->sp.cfg;
    }
    const size_t F = (size_t)hp->n_ff, W = (size_t)(hp->n_embd > hp->n_head * hp->head_dim ? hp->n_embd
                                                                                            : hp->n_head * hp->head_dim);
    e->sp.idx = qi_malloc(sizeof(int32_t) * (F > W ? F : W));
    e->sp.act = qi_malloc(sizeof(float) * R * F);
    e->sp.ones = qi_malloc(sizeof(float) * R * F);
    e->sp.xq = qi_malloc(qi_backend_max_act_row_bytes(e->m) * R);
    e->sp.xd = qi_malloc(sizeof(float) * R * (F > W ? F : W));
    e->sp.cnt = qi_malloc(sizeof(int32_t) * (F / 32 + 1));
    e->sp.zc = qi_malloc(sizeof(long) * (F / 32 + 1));
    if (!e->sp.idx || !e->sp.act || !e->sp.ones || !e->sp.xq || !e->sp.xd || !e->sp.cnt || !e->sp.zc)
        return QI_ERR(err, QI_ERR_NOMEM, "out of memory for the sparsity scratch");
    for (size_t i = 0; i < R * F; i++) e->sp.ones[i] = 1.0f;
    if (!sp || sp->target == 0.0) return QI_OK; /* nothing thresholded: the dense matmuls */
    e->sp.w = qi_calloc((size_t)hp->n_layer * SP_W_COUNT, sizeof *e->sp.w);
    if (!e->sp.w) return QI_ERR(err, QI_ERR_NOMEM, "out of memory for the column forms");
    for (int l = 0; l < hp->n_layer; l++) {
        const qi_layer *ly = &e->m->layers[l];
        const qi_weight *ws[SP_W_COUNT] = {&ly->wq, &ly->wk, &ly->wv, &ly->wo, &ly->w_gate, &ly->w_up, &ly->w_down};
        for (int k = 0; k < SP_W_COUNT; k++) {
            if (sp->mode == QI_SPARSITY_CATS && k != SP_W_DOWN) continue;
            if (!qi_colw_supported(ws[k])) continue; /* read dense */
            qi_status st = qi_colw_build(ws[k], &e->sp.w[(size_t)l * SP_W_COUNT + (size_t)k], err);
            if (st) return st;
        }
    }
    return QI_OK;
}

void eng_sparsity_free(qi_engine *e) {
    eng_sparsity *sp = &e->sp;
    if (sp->w)
        for (int i = 0; i < e->m->hp.n_layer * SP_W_COUNT; i++) qi_colw_free(&sp->w[i]);
    void *p[] = {sp->w, sp->idx, sp->cnt, sp->zc, sp->act, sp->ones, sp->xq, sp->xd, sp->cfg.thr};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) qi_free(p[i]);
}

/* cats: act(gate) in e->sp.act [rows][n] zeroed where |x| <= tg, counted;
 * the neurons kept by some row (the union) in e->sp.idx, their number
 * returned. */
int eng_cats_keep(qi_engine *e, float tg, int rows, int n) {
    long z = 0;
    const int k = qi_sparse_threshold(e->sp.act, (size_t)n, rows, n, tg, e->sp.idx, &z);
    e->sp.zeroed += (double)z;
    e->sp.seen += (double)rows * n;
    return k;
}

typedef struct {
    const qi_weight *wg, *wu;
    qi_k_gemm_fn gemm_g, gemm_u;
    void (*glu)(int64_t n, float *g, const float *u);
    const void *xq;
    uint64_t qrow_bytes;
    int T, F;
    float tg;
    double max_density; /* up's rows all computed where more are kept */
    float *g, *u, *act; /* [T][F]: gate, up, act(gate) */
    const float *ones;
    int32_t *idx, *cnt; /* chunk c's neurons listed at idx + 32 c, cnt[c] of them */
    long *zeroed;       /* [chunk] */
} cats_job;

/* cats's gate, up and glu for the 32-neuron chunks of one thread, with no
 * wait between them: whether a neuron is kept depends on its own gate row
 * alone (over the rows of the step), so each thread thresholds the gate
 * rows it made and computes the up rows it keeps. Every operation is the
 * unfused path's, on the same elements: the gate's and up's rows in the
 * dense matmul's order, the glu on ranges starting at multiples of 16 (as
 * the backend splits a row). Lists, per chunk, the neurons whose output
 * is not zero for some row (down's active columns). */
static void cats_work(void *arg, int ith, int nth) {
    const cats_job *j = arg;
    const int F = j->F, T = j->T;
    long lo, hi;
    qi_split((F + 31) / 32, ith, nth, &lo, &hi);
    if (lo >= hi) return;
    const long a = 32 * lo, b = 32 * hi < F ? 32 * hi : F, n = b - a;
    rows_range(j->wg, j->gemm_g, j->xq, j->qrow_bytes, T, a, b, j->g);
    for (int t = 0; t < T; t++) {
        float *act = j->act + (size_t)t * F + a, *u = j->u + (size_t)t * F + a;
        memcpy(act, j->g + (size_t)t * F + a, sizeof(float) * (size_t)n);
        j->glu(n, act, j->ones + (size_t)t * F + a);
        memset(u, 0, sizeof(float) * (size_t)n);
    }
    /* the kept neurons of the thread's chunks, listed one after another
     * from idx + a (this thread's part of idx) */
    long n_kept = 0;
    for (long c = lo; c < hi; c++) {
        const long c0 = 32 * c, c1 = c0 + 32 < F ? c0 + 32 : F;
        long z = 0;
        for (long i = c0; i < c1; i++) {
            int any = 0;
            for (int t = 0; t < T; t++) {
                float *p = j->act + (size_t)t * F + i;
                const int keep = !(fabsf(*p) <= j->tg);
                *p = keep ? *p : 0.0f;
                z += !keep;
                any |= keep;
            }
            j->idx[a + n_kept] = (int32_t)i;
            n_kept += any;
        }
        j->zeroed[c] = z;
    }
    /* many kept: the kernels' runs would be short, slower than the whole
     * range in one call (the dropped rows' values are zeroed below) */
    if ((double)n_kept > j->max_density * (double)n)
        rows_range(j->wu, j->gemm_u, j->xq, j->qrow_bytes, T, a, b, j->u);
    else
        rows_runs(j->wu, j->gemm_u, j->xq, j->qrow_bytes, T, j->idx + a, n_kept, j->u);
    for (int t = 0; t < T; t++) {
        float *g = j->g + (size_t)t * F;
        const float *act = j->act + (size_t)t * F;
        j->glu(n, g + a, j->u + (size_t)t * F + a);
        for (long i = a; i < b; i++) g[i] = act[i] == 0.0f ? 0.0f : g[i];
    }
    for (long c = lo; c < hi; c++) {
        const long c0 = 32 * c, c1 = c0 + 32 < F ? c0 + 32 : F;
        int k = 0;
        for (long i = c0; i < c1; i++) {
            int any = 0;
            for (int t = 0; t < T; t++) any |= j->g[(size_t)t * F + i] != 0.0f;
            j->idx[c0 + k] = (int32_t)i;
            k += any;
        }
        j->cnt[c] = k;
    }
}

/* cats's gate, up and glu on the CPU in one pass over the threads (the
 * unfused path's results, bit for bit): M->gate [rows][F] then holds the
 * glu's output with each row's dropped neurons zeroed, e->sp.act the
 * thresholded act(gate); returns the count of down's active columns, listed
 * in e->sp.idx. */
static qi_status cats_ffn(qi_engine *e, qi_backend *b, const dev_state *M, const qi_layer *ly, int rows, bool gelu,
                          float tg, int *n_act, qi_err *err) {
    qi_status st;
    qi_event *t_op;
    const int F = e->m->hp.n_ff;
    const qi_kernels *k = qi_kernels_get();
    cats_job j = {.wg = &ly->w_gate, .wu = &ly->w_up, .glu = gelu ? k->geglu : k->swiglu, .xq = e->sp.xq, .T = rows,
                  .F = F, .tg = tg, .max_density = e->o.sparse_max_density, .g = M->gate, .u = M->up, .act = e->sp.act, .ones = e->sp.ones, .idx = e->sp.idx,
                  .cnt = e->sp.cnt, .zeroed = e->sp.zc};
    j.gemm_g = rows >= QI_K_WIDE_MIN && k->gemm_wide[j.wg->type] ? k->gemm_wide[j.wg->type] : k->gemm[j.wg->type];
    j.gemm_u = rows >= QI_K_WIDE_MIN && k->gemm_wide[j.wu->type] ? k->gemm_wide[j.wu->type] : k->gemm[j.wu->type];
    const uint32_t dt = qi_vec_dot_type(j.wg->type);
    QI_ASSERT(dt == qi_vec_dot_type(j.wu->type));
    qi_type_row_bytes(dt, (uint64_t)j.wg->n_cols, &j.qrow_bytes);
    for (int t = 0; t < rows; t++)
        qi_quantize_act_row(dt, M->xn + (size_t)t * (size_t)j.wg->n_cols,
                            (char *)e->sp.xq + (uint64_t)t * j.qrow_bytes, j.wg->n_cols);
    if ((st = eng_op_begin(e, b, &t_op, err)) ||
        (st = eng_op_end(e, b, t_op, QI_OP_MATMUL, (qi_backend_cpu_host_run(e->be, cats_work, &j), QI_OK), err)))
        return st;
    int total = 0;
    long z = 0;
    for (int c = 0; c < (F + 31) / 32; c++) {
        memmove(e->sp.idx + total, e->sp.idx + 32 * c, sizeof(int32_t) * (size_t)e->sp.cnt[c]);
        total += e->sp.cnt[c];
        z += e->sp.zc[c];
    }
    e->sp.zeroed += (double)z;
    e->sp.seen += (double)rows * F;
    if (e->o.profile) {
        long kept = 0; /* up's rows read: those some row keeps, or all */
        for (size_t i = 0; i < (size_t)F; i++) {
            int any = 0;
            for (int t = 0; t < rows; t++) any |= e->sp.act[(size_t)t * F + i] != 0.0f;
            kept += any;
        }
        const double up_rows = (double)kept > j.max_density * F ? F : (double)kept; /* as most threads chose */
        e->prof.matmul_bytes += (double)j.wg->row_bytes * (double)F + (double)j.wu->row_bytes * up_rows;
    }
    *n_act = total;
    return QI_OK;
}

/* The MLP block of a gated FFN under opts.sparsity or opts.act_observe,
 * on the CPU, from its normed input in M->xn: teal thresholds gate and
 * up's input and down's; cats computes the gate, keeps the neurons whose
 * |act(gate)| is over the threshold (the union over the rows), computes
 * up's rows of those alone and zeroes each row's other neurons before down.
 * Without a threshold at a site the matmuls there are the dense ones. */
qi_status eng_mlp_sparse(qi_engine *e, int l, int rows, qi_err *err) {
    qi_status st;
    const qi_hparams *hp = &e->m->hp;
    const dev_state *M = &e->dev[e->plan.layers[l].mlp_dev];
    qi_backend *b = M->be;
    const qi_layer *ly = &M->layers[l];
    const int E = hp->n_embd, F = hp->n_ff;
    const bool gelu = hp->ffn_act == QI_FFN_GEGLU_TANH;
    const float tg = eng_sp_thr(e, l, QI_SITE_GATE);
    const qi_weight *gu[2] = {&ly->w_gate, &ly->w_up};
    float *const gu_out[2] = {M->gate, M->up};
    const int n_in = eng_sp_site(e, l, QI_SITE_FFN_IN, M->xn, rows, E);
    int n_act = -1;
    const bool fused = tg >= 0.0f && n_in < 0 && !e->o.act_observe && !e->o.ffn_observe &&
                       eng_sp_thr(e, l, QI_SITE_FFN_ACT) < 0.0f && !ly->w_gate.packed && !ly->w_up.packed &&
                       qi_vec_dot_type(ly->w_gate.type) == qi_vec_dot_type(ly->w_up.type);
    if (fused) {
        if ((st = cats_ffn(e, b, M, ly, rows, gelu, tg, &n_act, err))) return st;
    } else if (tg < 0.0f && !e->o.act_observe) {
        static const int wi[2] = {SP_W_GATE, SP_W_UP};
        if ((st = eng_mm_site(e, b, l, wi, gu, gu_out, 2, M->xn, rows, n_in, err))) return st;
    } else {
        static const int wi[1] = {SP_W_GATE};
        if ((st = eng_mm_site(e, b, l, wi, gu, gu_out, 1, M->xn, rows, n_in, err))) return st;
        /* act(gate), as the glu computes it (times 1) */
        const size_t n = (size_t)rows * (size_t)F;
        memcpy(e->sp.act, M->gate, sizeof(float) * n);
        if ((st = qi_backend_glu(b, gelu, e->sp.act, e->sp.ones, rows, F, err))) return st;
        if (e->o.act_observe) e->o.act_observe(e->o.act_observe_ctx, l, QI_SITE_GATE, e->sp.act, rows, F);
        if (tg < 0.0f) {
            static const int wi_up[1] = {SP_W_UP};
            if ((st = eng_mm_site(e, b, l, wi_up, &gu[1], &gu_out[1], 1, M->xn, rows, n_in, err))) return st;
        } else {
            const int n_keep = eng_cats_keep(e, tg, rows, F);
            if ((double)n_keep <= e->o.sparse_max_density * F) {
                memset(M->up, 0, sizeof(float) * n);
                if ((st = eng_mm_rows(e, b, &ly->w_up, M->xn, rows, e->sp.idx, n_keep, M->up, err))) return st;
            } else {
                if ((st = eng_matmul(e, b, &ly->w_up, M->xn, rows, M->up, err))) return st;
            }
        }
    }
    if (!fused) {
        if ((st = qi_backend_glu(b, gelu, M->gate, M->up, rows, F, err))) return st;
        if (e->o.ffn_observe && (st = eng_observe_ffn(e, b, l, M->gate, rows, err))) return st;
        if (tg >= 0.0f) /* a neuron off for this row, on for another's: zero here */
            for (size_t i = 0; i < (size_t)rows * (size_t)F; i++)
                if (e->sp.act[i] == 0.0f) M->gate[i] = 0.0f;
    }
    if (e->ns && e->ns->rp) { /* a layer not split, under cats */
        e->ns->rp[l].tokens += rows;
        eng_count_active(e, l, M->gate, rows, F, false);
    }
    if (!fused) {
        n_act = eng_sp_site(e, l, QI_SITE_FFN_ACT, M->gate, rows, F);
        if (n_act < 0 && tg >= 0.0f) n_act = qi_sparse_active(M->gate, (size_t)F, rows, F, e->sp.idx);
    }
    static const int wi_down[1] = {SP_W_DOWN};
    const qi_weight *down = &ly->w_down;
    float *const out = M->xn;
    if ((st = eng_mm_site(e, b, l, wi_down, &down, &out, 1, M->gate, rows, n_act, err))) return st;
    if (ly->ffn_post_norm.data &&
        (st = qi_backend_rmsnorm(b, M->xn, ly->ffn_post_norm.data, rows, E, hp->rms_eps, M->xn, err)))
        return st;
    return qi_backend_add(b, M->x, M->xn, (long)rows * E, err);
}

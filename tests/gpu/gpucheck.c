/* gpucheck.c - what only a GPU can verify of the CUDA device, as one
 * program that tests/gpu/check.sh runs (README.md beside it):
 *
 *   qi_gpucheck ops                 every op of the CUDA device against a
 *                                   reference on random data, every weight
 *                                   type, edge sizes; a table of errors and
 *                                   the tolerance each is held to
 *   qi_gpucheck greedy [--gpu-mem BYTES] MODEL...
 *                                   greedy decoding on the GPU (all layers,
 *                                   ngl=half, split attention; or, under a
 *                                   cap, a third of the layers and the
 *                                   attention alone) against the CPU, 32
 *                                   tokens on several prompts
 *   qi_gpucheck speed MODEL         prefill and decode tokens/s for all-CPU,
 *                                   all-GPU, ngl=half and split attention at
 *                                   batch 1, 16 and 64, and all-GPU decode's
 *                                   share of the measured HBM bandwidth
 *
 * Exit status: 0 every check passed, 1 one failed, 77 no usable GPU.
 * With --fake first, it runs on the stand-in runtime of tests/unit/
 * cuda_fake.c, whose kernels are the CPU's ops: that checks the program
 * itself on a machine without a GPU (matmuls then show the CPU's error).
 *
 * Errors are measured as max |got - ref| / max |ref| over an op's output
 * (0 when both are 0). The references: a matmul is compared with the
 * double-precision product of the dequantised weights and the fp32
 * activations (the CPU engine's own result, which quantises activations
 * to 8 bits first, is printed beside it for scale); every other op with
 * the CPU device's result. The tolerances, and why:
 *   matmul, T <= 8 (matrix-vector kernels, fp32 activations, fp32 sums in
 *     another order): 2e-4; or 1.5e-2 where the kernel quantises the
 *     activations to 8 bits per block as the CPU does (its own error is
 *     printed: about 5e-3);
 *   matmul, T > 8 (weights and activations rounded to fp16 for tensor-core
 *     GEMM, fp32 sums): fp16 keeps 11 bits, so 4e-3;
 *   get_rows, kv_write, add, add_bias, scale, gather_rows: the same arithmetic as the
 *     CPU but for fused multiply-adds: 1e-6;
 *   rmsnorm, swiglu, softcap, rope: fp32 with the GPU's own expf, tanhf,
 *     sinf/cosf and square root (a few ulp): 1e-5; rope at positions up
 *     to 8000 (argument reduction): 2e-5;
 *   geglu: the CPU reads GELU from a table of fp16 inputs, the GPU
 *     computes it: the input's fp16 rounding, 2e-3;
 *   attention: both round the softmax weights to fp16, and an expf one ulp
 *     off can move a weight to the next fp16 value: 2e-3 for the output,
 *     2e-3 for the statistics;
 *   merge: double arithmetic on both sides: 1e-6.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "cuda_fake.h"
#include "qinfer/engine.h"
#include "qinfer/quant.h"
#include "qinfer/types.h"

static qi_backend *g_cpu, *g_gpu;
static int g_fail, g_cases;
static uint64_t g_rng = 0x9e3779b97f4a7c15ull;

static float rnd(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (float)((g_rng >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}
static void fill(float *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = rnd();
}

static void die(const char *what, const qi_err *e) {
    fprintf(stderr, "gpucheck: %s: %s\n", what, e->msg);
    exit(1);
}

/* ---- device memory -------------------------------------------------------- */

typedef struct {
    qi_buf *buf;
    void *p;
    size_t n;
} dmem;

static dmem dput(const void *src, size_t n) {
    dmem d = {.n = n};
    qi_err e = {0};
    if (qi_buf_alloc(g_gpu, n, "gpucheck", &d.buf, &e)) die("alloc", &e);
    d.p = qi_buf_ptr(g_gpu, qi_view_of(d.buf, 0), n, &e);
    if (src && qi_dev_upload(g_gpu, qi_view_of(d.buf, 0), src, n, &e)) die("upload", &e);
    return d;
}
static void dget(dmem d, void *dst) {
    qi_err e = {0};
    if (qi_dev_download(g_gpu, dst, qi_view_of(d.buf, 0), d.n, &e) || qi_dev_synchronize(g_gpu, &e))
        die("download", &e);
}
static void dfree(dmem d) { qi_buf_free(d.buf); }

static double rel_err(const float *got, const float *ref, size_t n) {
    double mx = 0, mr = 0;
    for (size_t i = 0; i < n; i++) {
        const double d = fabs((double)got[i] - (double)ref[i]);
        if (!(d <= mx)) mx = d; /* NaN propagates */
        if (fabs((double)ref[i]) > mr) mr = fabs((double)ref[i]);
    }
    return mx == 0 ? 0 : mr > 0 ? mx / mr : INFINITY;
}

static void report(const char *op, const char *what, double err, double tol, const char *extra) {
    const int ok = err <= tol;
    g_cases++;
    if (!ok) g_fail++;
    printf("%-12s %-34s err %9.2e  tol %8.1e  %s%s%s\n", op, what, err, tol, ok ? "ok" : "FAIL", extra ? "  " : "",
           extra ? extra : "");
}

/* ---- ops ------------------------------------------------------------------- */

static const uint32_t k_types[] = {QI_TYPE_F32,  QI_TYPE_F16,  QI_TYPE_BF16, QI_TYPE_Q8_0, QI_TYPE_Q4_0, QI_TYPE_Q4_1,
                                   QI_TYPE_Q5_0, QI_TYPE_Q5_1, QI_TYPE_Q4_K, QI_TYPE_Q5_K, QI_TYPE_Q6_K};

static double g_tol_matvec = 2e-4;

static void check_matmul(uint32_t type, int rows, int cols, int T) {
    const qi_type_info *ti = qi_type_get(type);
    uint64_t rb = 0;
    if (!qi_type_row_bytes(type, (uint64_t)cols, &rb)) return;
    float *wf = malloc(sizeof(float) * (size_t)rows * cols), *x = malloc(sizeof(float) * (size_t)T * cols);
    float *deq = malloc(sizeof(float) * (size_t)cols), *ref = malloc(sizeof(float) * (size_t)T * rows);
    float *got = malloc(sizeof(float) * (size_t)T * rows), *cpu = malloc(sizeof(float) * (size_t)T * rows);
    uint8_t *wq = malloc(rb * (size_t)rows);
    fill(wf, (size_t)rows * cols);
    fill(x, (size_t)T * cols);
    for (int r = 0; r < rows; r++) qi_quantize_row_ref(type, wf + (size_t)r * cols, wq + rb * r, cols);
    for (int r = 0; r < rows; r++) {
        qi_dequantize_row_ref(type, wq + rb * r, deq, cols);
        for (int t = 0; t < T; t++) {
            double s = 0;
            for (int c = 0; c < cols; c++) s += (double)deq[c] * x[(size_t)t * cols + c];
            ref[(size_t)t * rows + r] = (float)s;
        }
    }
    const qi_weight W = {.type = type, .n_cols = cols, .n_rows = rows, .row_bytes = rb, .data = wq};
    g_cpu->iface->matmul(g_cpu, &W, x, T, cpu);
    dmem dw = dput(wq, rb * rows), dx = dput(x, sizeof(float) * (size_t)T * cols),
         dy = dput(NULL, sizeof(float) * (size_t)T * rows);
    const qi_weight Wd = {.type = type, .n_cols = cols, .n_rows = rows, .row_bytes = rb, .data = dw.p};
    qi_err e = {0};
    if (qi_backend_matmul_n(g_gpu, (const qi_weight *const[]){&Wd}, (float *const[]){dy.p}, 1, dx.p, T, &e))
        die("matmul", &e);
    dget(dy, got);
    char what[64], extra[48];
    snprintf(what, sizeof what, "%s %dx%d T=%d", ti->name, rows, cols, T);
    snprintf(extra, sizeof extra, "(cpu engine %.1e)", rel_err(cpu, ref, (size_t)T * rows));
    report("matmul", what, rel_err(got, ref, (size_t)T * rows), T <= 8 ? g_tol_matvec : 4e-3, extra);
    /* get_rows of the same weight */
    const int32_t ids[3] = {rows - 1, 0, rows / 2};
    float *g_cpu_rows = malloc(sizeof(float) * 3 * (size_t)cols), *g_gpu_rows = malloc(sizeof(float) * 3 * (size_t)cols);
    g_cpu->iface->get_rows(g_cpu, &W, ids, 3, g_cpu_rows);
    dmem dg = dput(NULL, sizeof(float) * 3 * (size_t)cols);
    if (qi_backend_get_rows(g_gpu, &Wd, ids, 3, dg.p, &e)) die("get_rows", &e);
    dget(dg, g_gpu_rows);
    if (T == 1) report("get_rows", what, rel_err(g_gpu_rows, g_cpu_rows, 3 * (size_t)cols), 1e-6, NULL);
    dfree(dw), dfree(dx), dfree(dy), dfree(dg);
    free(wf), free(x), free(deq), free(ref), free(got), free(cpu), free(wq), free(g_cpu_rows), free(g_gpu_rows);
}

static void check_small(int T, int n) {
    const size_t N = (size_t)T * n;
    float *x = malloc(sizeof(float) * N), *y = malloc(sizeof(float) * N), *w = malloc(sizeof(float) * n);
    float *c = malloc(sizeof(float) * N), *g = malloc(sizeof(float) * N);
    fill(x, N), fill(y, N), fill(w, (size_t)n);
    for (size_t i = 0; i < N; i++) x[i] *= 4.0f; /* GELU and softcap away from 0 */
    char what[48];
    snprintf(what, sizeof what, "T=%d n=%d", T, n);
    dmem dx = dput(NULL, sizeof(float) * N), dy = dput(y, sizeof(float) * N), dw = dput(w, sizeof(float) * n);
    qi_err e = {0};
    const char *names[] = {"rmsnorm", "swiglu", "geglu", "add", "scale", "softcap", "add_bias"};
    const double tols[] = {1e-5, 1e-5, 2e-3, 1e-6, 1e-6, 1e-5, 1e-6};
    for (int op = 0; op < 7; op++) {
        memcpy(c, x, sizeof(float) * N);
        if (qi_dev_upload(g_gpu, qi_view_of(dx.buf, 0), x, sizeof(float) * N, &e)) die("upload", &e);
        qi_status st = QI_OK;
        switch (op) {
        case 0:
            g_cpu->iface->rmsnorm(g_cpu, c, w, T, n, 1e-6f, c);
            st = qi_backend_rmsnorm(g_gpu, dx.p, dw.p, T, n, 1e-6f, dx.p, &e);
            break;
        case 1:
        case 2:
            (op == 2 ? g_cpu->iface->geglu : g_cpu->iface->swiglu)(g_cpu, c, y, T, n);
            st = qi_backend_glu(g_gpu, op == 2, dx.p, dy.p, T, n, &e);
            break;
        case 3:
            g_cpu->iface->add(g_cpu, c, y, (long)N);
            st = qi_backend_add(g_gpu, dx.p, dy.p, (long)N, &e);
            break;
        case 4:
            g_cpu->iface->scale(g_cpu, c, (long)N, 0.7f);
            st = qi_backend_scale(g_gpu, dx.p, (long)N, 0.7f, &e);
            break;
        case 5:
            g_cpu->iface->softcap(g_cpu, c, (long)N, 3.0f);
            st = qi_backend_softcap(g_gpu, dx.p, (long)N, 3.0f, &e);
            break;
        case 6: /* w as a bias of n over T rows (qwen2's q, k, v) */
            g_cpu->iface->add_bias(g_cpu, c, w, T, n);
            st = qi_backend_add_bias(g_gpu, dx.p, dw.p, T, n, &e);
            break;
        }
        if (st) die(names[op], &e);
        dget(dx, g);
        report(names[op], what, rel_err(g, c, N), tols[op], NULL);
    }
    dfree(dx), dfree(dy), dfree(dw);
    free(x), free(y), free(w), free(c), free(g);
}

static void check_rope(int T, int H, int Hk, int D, int n_rot, int mode) {
    const size_t nq = (size_t)T * H * D, nk = (size_t)T * Hk * D;
    float *q = malloc(sizeof(float) * nq), *k = malloc(sizeof(float) * nk), *gq = malloc(sizeof(float) * nq),
          *gk = malloc(sizeof(float) * nk);
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)T);
    fill(q, nq), fill(k, nk);
    for (int t = 0; t < T; t++) pos[t] = (t * 997) % 8000;
    dmem dq = dput(q, sizeof(float) * nq), dk = dput(k, sizeof(float) * nk);
    g_cpu->iface->rope(g_cpu, q, H, k, Hk, T, D, n_rot, pos, 10000.0f, 1.0f, mode);
    qi_err e = {0};
    if (qi_backend_rope(g_gpu, dq.p, H, dk.p, Hk, T, D, n_rot, pos, 10000.0f, 1.0f, mode, &e)) die("rope", &e);
    dget(dq, gq), dget(dk, gk);
    char what[64];
    snprintf(what, sizeof what, "%s T=%d H=%d/%d D=%d rot=%d", mode ? "neox" : "norm", T, H, Hk, D, n_rot);
    report("rope", what, fmax(rel_err(gq, q, nq), rel_err(gk, k, nk)), 2e-5, NULL);
    dfree(dq), dfree(dk);
    free(q), free(k), free(gq), free(gk), free(pos);
}

/* Attention over a paged cache: slots in a scrambled order, blocks in a
 * scrambled order; whole (with statistics), then two parts merged and a
 * statistics pass, against the CPU over the same rows. */
static void check_attention(int T, int H, int Hkv, int D, int ns, int n_swa) {
    const int SH = 6, BLK = 1 << SH, NB = (ns + BLK - 1) / BLK;
    const size_t rows = (size_t)Hkv * NB * BLK * 2;
    uint16_t *pool = malloc(sizeof(uint16_t) * rows * D);
    for (size_t i = 0; i < rows * D; i++) pool[i] = qi_f32_to_fp16(rnd());
    dmem dp = dput(pool, sizeof(uint16_t) * rows * D);
    const uint16_t **kh = malloc(sizeof(void *) * Hkv * NB * 4), **vh = kh + Hkv * NB, **kd = vh + Hkv * NB,
                   **vd = kd + Hkv * NB;
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)Hkv * ns), *q_pos = malloc(sizeof(int32_t) * T);
    for (int hk = 0; hk < Hkv; hk++) {
        for (int i = 0; i < NB; i++) {
            const size_t kr = (size_t)(hk * NB + (NB - 1 - i)) * 2 * BLK;
            kh[hk * NB + i] = pool + kr * D;
            vh[hk * NB + i] = pool + (kr + BLK) * D;
            kd[hk * NB + i] = (uint16_t *)dp.p + kr * D;
            vd[hk * NB + i] = (uint16_t *)dp.p + (kr + BLK) * D;
        }
        for (int i = 0; i < ns; i++) pos[hk * ns + i] = (int32_t)(((long)i * 7919 + hk) % ns);
    }
    for (int t = 0; t < T; t++) q_pos[t] = ns - T + t;
    const size_t nq = (size_t)T * H * D;
    float *q = malloc(sizeof(float) * nq), *oc = malloc(sizeof(float) * nq), *og = malloc(sizeof(float) * nq);
    fill(q, nq);
    const int stride = ns;
    float *sc = calloc((size_t)H * stride, sizeof(float)), *sg = malloc(sizeof(float) * (size_t)H * stride);
    dmem dq = dput(q, sizeof(float) * nq), dout = dput(NULL, sizeof(float) * nq),
         ds = dput(sc, sizeof(float) * (size_t)H * stride);
    int *n_slots = malloc(sizeof(int) * Hkv);
    const int32_t **posp = malloc(sizeof(void *) * Hkv);
    const uint16_t *const **kbh = malloc(sizeof(void *) * Hkv * 4), *const **vbh = kbh + Hkv, *const **kbd = vbh + Hkv,
                          *const **vbd = kbd + Hkv;
    for (int hk = 0; hk < Hkv; hk++) {
        n_slots[hk] = ns;
        posp[hk] = pos + hk * ns;
        kbh[hk] = kh + hk * NB, vbh[hk] = vh + hk * NB, kbd[hk] = kd + hk * NB, vbd[hk] = vd + hk * NB;
    }
    qi_attn_paged_args a = {.T = T, .H = H, .Hkv = Hkv, .D = D, .q_pos = q_pos, .n_swa = n_swa,
                            .scale = 1.0f / sqrtf((float)D), .q = q, .out = oc, .n_slots = n_slots, .pos = posp,
                            .k_blk = kbh, .v_blk = vbh, .shift = SH, .stats = sc, .stats_stride = stride};
    g_cpu->iface->attention_paged(g_cpu, &a);
    a.q = dq.p, a.out = dout.p, a.k_blk = kbd, a.v_blk = vbd, a.stats = ds.p;
    qi_err e = {0};
    if (qi_backend_attention(g_gpu, &a, 1, &e)) die("attention", &e);
    dget(dout, og), dget(ds, sg);
    char what[64];
    snprintf(what, sizeof what, "T=%d H=%d/%d D=%d slots=%d swa=%d", T, H, Hkv, D, ns, n_swa);
    report("attention", what, rel_err(og, oc, nq), 2e-3, NULL);
    report("attn stats", what, rel_err(sg, sc, (size_t)H * stride), 2e-3, NULL);
    /* two parts (the first block, the rest) merged */
    if (NB >= 2) {
        const size_t nr = (size_t)T * H;
        int *n1 = malloc(sizeof(int) * Hkv * 2), *n2 = n1 + Hkv;
        const int32_t **pos2 = malloc(sizeof(void *) * Hkv);
        const uint16_t *const **k2h = malloc(sizeof(void *) * Hkv * 4), *const **v2h = k2h + Hkv,
                              *const **k2d = v2h + Hkv, *const **v2d = k2d + Hkv;
        for (int hk = 0; hk < Hkv; hk++) {
            n1[hk] = BLK, n2[hk] = ns - BLK, pos2[hk] = posp[hk] + BLK;
            k2h[hk] = kbh[hk] + 1, v2h[hk] = vbh[hk] + 1, k2d[hk] = kbd[hk] + 1, v2d[hk] = vbd[hk] + 1;
        }
        float *o1 = malloc(sizeof(float) * nq * 3), *o2 = o1 + nq, *mo = o2 + nq;
        float *ml = malloc(sizeof(float) * nr * 6), *m1 = ml, *l1 = ml + nr, *m2 = ml + 2 * nr, *l2 = ml + 3 * nr,
              *tm = ml + 4 * nr, *tl = ml + 5 * nr;
        qi_attn_paged_args p[2] = {{.T = T, .H = H, .Hkv = Hkv, .D = D, .q_pos = q_pos, .n_swa = n_swa,
                                    .scale = a.scale, .q = q, .out = o1, .n_slots = n1, .pos = posp, .k_blk = kbh,
                                    .v_blk = vbh, .shift = SH, .part_m = m1, .part_l = l1}};
        p[1] = p[0];
        p[1].out = o2, p[1].n_slots = n2, p[1].pos = pos2, p[1].k_blk = k2h, p[1].v_blk = v2h, p[1].part_m = m2,
        p[1].part_l = l2;
        g_cpu->iface->attention_paged_n(g_cpu, p, 2);
        const float *os[2] = {o1, o2}, *ms[2] = {m1, m2}, *ls[2] = {l1, l2};
        qi_attn_merge_args mg = {.rows = (int)nr, .D = D, .n_parts = 2, .o = os, .m = ms, .l = ls, .out = mo,
                                 .tot_m = tm, .tot_l = tl};
        g_cpu->iface->attention_merge(g_cpu, &mg);
        dmem d_o = dput(NULL, sizeof(float) * nq * 3), d_ml = dput(NULL, sizeof(float) * nr * 6);
        float *go = d_o.p, *gm = d_ml.p;
        qi_attn_paged_args pd[2] = {p[0], p[1]};
        pd[0].q = pd[1].q = dq.p;
        pd[0].k_blk = kbd, pd[0].v_blk = vbd, pd[1].k_blk = k2d, pd[1].v_blk = v2d;
        pd[0].out = go, pd[1].out = go + nq;
        pd[0].part_m = gm, pd[0].part_l = gm + nr, pd[1].part_m = gm + 2 * nr, pd[1].part_l = gm + 3 * nr;
        if (qi_backend_attention(g_gpu, pd, 2, &e)) die("attention parts", &e);
        const float *osd[2] = {go, go + nq}, *msd[2] = {gm, gm + 2 * nr}, *lsd[2] = {gm + nr, gm + 3 * nr};
        qi_attn_merge_args mgd = {.rows = (int)nr, .D = D, .n_parts = 2, .o = osd, .m = msd, .l = lsd,
                                  .out = go + 2 * nq, .tot_m = gm + 4 * nr, .tot_l = gm + 5 * nr};
        if (qi_backend_attention_merge(g_gpu, &mgd, &e)) die("merge", &e);
        float *all = malloc(sizeof(float) * nq * 3), *allm = malloc(sizeof(float) * nr * 6);
        dget(d_o, all), dget(d_ml, allm);
        report("attn part", what, fmax(rel_err(all, o1, nq), rel_err(all + nq, o2, nq)), 2e-3, NULL);
        report("attn merge", what, rel_err(all + 2 * nq, mo, nq), 2e-3, NULL);
        /* the merge alone, on the CPU's parts: double arithmetic on both sides */
        dmem dparts = dput(o1, sizeof(float) * nq * 2), dmls = dput(ml, sizeof(float) * nr * 4);
        float *P = dparts.p, *Q = dmls.p;
        const float *o3[2] = {P, P + nq}, *m3[2] = {Q, Q + 2 * nr}, *l3[2] = {Q + nr, Q + 3 * nr};
        qi_attn_merge_args mg3 = {.rows = (int)nr, .D = D, .n_parts = 2, .o = o3, .m = m3, .l = l3, .out = go};
        if (qi_backend_attention_merge(g_gpu, &mg3, &e)) die("merge", &e);
        dget(d_o, all);
        report("merge", what, rel_err(all, mo, nq), 1e-6, NULL);
        /* the statistics pass over the second part, against the merged max and sum */
        memset(sc, 0, sizeof(float) * (size_t)H * stride);
        if (qi_dev_upload(g_gpu, qi_view_of(ds.buf, 0), sc, sizeof(float) * (size_t)H * stride, &e)) die("up", &e);
        qi_attn_paged_args s2 = p[1];
        s2.out = o1, s2.part_m = s2.part_l = NULL, s2.stats = sc, s2.stats_stride = stride, s2.tot_m = tm,
        s2.tot_l = tl;
        g_cpu->iface->attention_paged(g_cpu, &s2);
        dmem dtot = dput(tm, sizeof(float) * nr * 2);
        s2.q = dq.p, s2.out = go, s2.k_blk = k2d, s2.v_blk = v2d, s2.stats = ds.p, s2.tot_m = dtot.p,
        s2.tot_l = (float *)dtot.p + nr;
        if (qi_backend_attention(g_gpu, &s2, 1, &e)) die("attention stats", &e);
        dget(ds, sg);
        report("attn statpass", what, rel_err(sg, sc, (size_t)H * stride), 2e-3, NULL);
        dfree(d_o), dfree(d_ml), dfree(dparts), dfree(dmls), dfree(dtot);
        free(n1), free(pos2), free(k2h), free(o1), free(ml), free(all), free(allm);
    }
    /* kv_write: four rows of q into the pool */
    const int nw = T * H < 4 ? T * H : 4;
    const float *src_h[4], *src_d[4];
    uint16_t *dst_h[4], *dst_d[4];
    for (int i = 0; i < nw; i++) {
        src_h[i] = q + (size_t)i * D, src_d[i] = (float *)dq.p + (size_t)i * D;
        dst_h[i] = pool + (size_t)(3 * i + 1) * D, dst_d[i] = (uint16_t *)dp.p + (size_t)(3 * i + 1) * D;
    }
    g_cpu->iface->kv_write(g_cpu, src_h, dst_h, nw, D);
    if (qi_backend_kv_write(g_gpu, src_d, dst_d, nw, D, &e)) die("kv_write", &e);
    uint16_t *pg = malloc(sizeof(uint16_t) * rows * D);
    dget(dp, pg);
    report("kv_write", what, memcmp(pg, pool, sizeof(uint16_t) * rows * D) ? 1.0 : 0.0, 1e-6, NULL);
    dfree(dp), dfree(dq), dfree(dout), dfree(ds);
    free(pool), free(kh), free(pos), free(q_pos), free(q), free(oc), free(og), free(sc), free(sg), free(n_slots),
        free(posp), free(kbh), free(pg);
}

static void check_gather(int n_rows, int width) {
    float *x = malloc(sizeof(float) * (size_t)n_rows * width), *g = malloc(sizeof(float) * (size_t)n_rows * width);
    int32_t *rows = malloc(sizeof(int32_t) * (size_t)n_rows);
    fill(x, (size_t)n_rows * width);
    int n = 0;
    for (int r = 0; r < n_rows; r++)
        if (r % 3 != 1) rows[n++] = r; /* ascending, rows[i] >= i */
    dmem dx = dput(x, sizeof(float) * (size_t)n_rows * width);
    g_cpu->iface->gather_rows(g_cpu, x, rows, n, width);
    qi_err e = {0};
    if (qi_backend_gather_rows(g_gpu, dx.p, rows, n, width, &e)) die("gather_rows", &e);
    dget(dx, g);
    char what[48];
    snprintf(what, sizeof what, "rows=%d of %d width=%d", n, n_rows, width);
    report("gather_rows", what, rel_err(g, x, (size_t)n * width), 1e-6, NULL);
    dfree(dx);
    free(x), free(g), free(rows);
}

static int cmd_ops(void) {
    for (size_t k = 0; k < sizeof k_types / sizeof *k_types; k++) {
        const int kq = qi_type_get(k_types[k])->blck == 256;
        const int shapes[][2] = {{1, kq ? 256 : 32}, {67, 512}, {1000, 2304}, {4096, 4096}};
        const int Ts[] = {1, 3, 8, 9, 64};
        for (int s = 0; s < 4; s++)
            for (int t = 0; t < 5; t++) {
                if (s == 3 && Ts[t] != 1 && Ts[t] != 64) continue;
                check_matmul(k_types[k], shapes[s][0], shapes[s][1], Ts[t]);
            }
    }
    const int small[][2] = {{1, 576}, {7, 640}, {64, 2048}, {3, 1}};
    for (int i = 0; i < 4; i++) check_small(small[i][0], small[i][1]);
    check_rope(1, 9, 3, 64, 64, 0);
    check_rope(17, 4, 1, 256, 256, 1);
    check_rope(5, 8, 8, 128, 64, 0);
    const int att[][6] = {{1, 9, 3, 64, 1, 0},     {1, 9, 3, 64, 65, 0},     {1, 9, 3, 64, 4096, 0},
                          {7, 4, 1, 256, 700, 512}, {64, 8, 8, 128, 1000, 0}, {1, 32, 8, 128, 2048, 0},
                          {3, 4, 1, 256, 64, 0}};
    for (int i = 0; i < 7; i++) check_attention(att[i][0], att[i][1], att[i][2], att[i][3], att[i][4], att[i][5]);
    check_gather(10, 576);
    check_gather(64, 49152);
    printf("ops: %d of %d checks passed\n", g_cases - g_fail, g_cases);
    return g_fail ? 1 : 0;
}

/* ---- the engine: greedy equality and speed ---------------------------------------- */

static qi_engine *engine(const qi_model *m, const char *devices, const char *placement, int seqs, int n_ctx,
                         int threads) {
    qi_engine_opts o;
    qi_engine_opts_default(&o);
    o.n_threads = threads;
    o.n_ctx = n_ctx;
    o.max_seqs = seqs;
    o.devices = devices;
    o.placement = placement;
    qi_engine *eng = NULL;
    qi_err e = {0};
    if (qi_engine_create(m, &o, &eng, &e)) {
        fprintf(stderr, "gpucheck: %s / %s: %s\n", devices, placement, e.msg);
        return NULL;
    }
    return eng;
}

static int argmax(const float *x, int n, float *gap) {
    int b = 0, s = -1;
    for (int i = 1; i < n; i++) {
        if (x[i] > x[b]) {
            s = b;
            b = i;
        } else if (s < 0 || x[i] > x[s]) {
            s = i;
        }
    }
    if (gap) *gap = s >= 0 ? x[b] - x[s] : INFINITY;
    return b;
}

/* Greedy ids of one prompt under a plan (ids[N]) and each step's top-2
 * logit gap; false when the engine failed. */
static bool greedy(const qi_model *m, const char *devices, const char *placement, const int32_t *prompt, int n,
                   int N, int32_t *ids, float *gaps) {
    qi_engine *eng = engine(m, devices, placement, 1, 512, 4);
    if (!eng) return false;
    qi_err e = {0};
    int id, nt;
    bool ok = !qi_engine_seq_add(eng, &id, &e) && !qi_engine_seq_feed(eng, id, prompt, n, false, &e);
    for (int i = 0; ok && i < N; i++) {
        while (ok && qi_engine_seq_n_logits(eng, id) == 0) ok = !qi_engine_step(eng, &nt, &e);
        if (!ok) break;
        ids[i] = argmax(qi_engine_seq_logits(eng, id, -1), m->hp.n_vocab, &gaps[i]);
        ok = !qi_engine_seq_feed(eng, id, &ids[i], 1, false, &e);
    }
    if (!ok) fprintf(stderr, "gpucheck: %s / %s: %s\n", devices, placement, e.msg);
    qi_engine_free(eng);
    return ok;
}

/* Near ties: the CPU's top two logits within this much of each other may
 * swap on the GPU (a matmul's error is about 1e-3 of the logits' range). */
#define NEAR_TIE 0.02f

/* greedy [--gpu-mem BYTES] MODEL...: without a cap, all layers on the
 * GPU, the last half, and split attention (every layer's KV half on each
 * device); with one (cuda:BYTES, a model too big for it), the last third of
 * the layers, and every layer's attention on the GPU with its MLP on the
 * CPU. */
static int cmd_greedy(int argc, char **argv) {
    enum { N = 32 };
    const char *cap = NULL;
    if (argc >= 2 && !strcmp(argv[0], "--gpu-mem")) {
        cap = argv[1];
        argc -= 2, argv += 2;
    }
    char devices[64];
    snprintf(devices, sizeof devices, "cpu,cuda%s%s", cap ? ":" : "", cap ? cap : "");
    for (int a = 0; a < argc; a++) {
        qi_model *m = NULL;
        qi_err e = {0};
        if (qi_model_load(argv[a], &m, &e)) die(argv[a], &e);
        const int L = m->hp.n_layer;
        char p1[32], p2[32], split[512];
        snprintf(p1, sizeof p1, "ngl=%d", cap ? L / 3 : L + 1);
        snprintf(p2, sizeof p2, "ngl=%d", L / 2);
        snprintf(split, sizeof split, "%s.gpucheck.plan", argv[a]);
        FILE *f = fopen(split, "w");
        if (!f) return 1;
        if (!cap) fprintf(f, "embd cuda\nhead cuda\n");
        for (int l = 0; l < L; l++)
            if (cap)
                fprintf(f, "cuda cpu\n");
            else
                fprintf(f, "%s cuda 0.5 %s\n", l % 2 ? "cuda" : "cpu", l % 2 ? "cpu" : "cuda");
        fclose(f);
        const char *plans[] = {p1, cap ? split : p2, cap ? NULL : split};
        const char *names[] = {cap ? "ngl=third" : "all-GPU", cap ? "attention on GPU" : "ngl=half", "split attention"};
        const int n_prompts = m->hp.n_embd >= 4096 ? 3 : 5;
        for (int p = 0; p < n_prompts; p++) {
            int32_t prompt[200], ref[N], got[N];
            float gr[N], gg[N];
            const int n = 1 + p * 41;
            uint64_t st = 77 + (uint64_t)p;
            for (int i = 0; i < n; i++) {
                st = st * 6364136223846793005ull + 1442695040888963407ull;
                prompt[i] = (int32_t)((st >> 33) % (uint64_t)(m->hp.n_vocab < 256 ? m->hp.n_vocab : 256));
            }
            if (!greedy(m, "cpu", "all-cpu", prompt, n, N, ref, gr)) return 1;
            for (int k = 0; k < 3 && plans[k]; k++) {
                g_cases++;
                if (!greedy(m, devices, plans[k], prompt, n, N, got, gg)) {
                    g_fail++;
                    continue;
                }
                int i = 0;
                while (i < N && got[i] == ref[i]) i++;
                const bool tie = i < N && gr[i] < NEAR_TIE;
                const bool ok = i == N || tie;
                if (!ok) g_fail++;
                printf("greedy %-10s %-14s prompt %3d tokens  %-18s %2d/%d ids equal%s  %s\n", m->hp.arch_name,
                       cap ? devices : "", n, names[k], i, N, tie ? " (then a near tie)" : "", ok ? "ok" : "FAIL");
            }
        }
        remove(split);
        qi_model_free(m);
    }
    printf("greedy: %d of %d checks passed\n", g_cases - g_fail, g_cases);
    return g_fail ? 1 : 0;
}

/* Prefill and decode tokens/s of B sequences under a plan: each sequence
 * gets a prompt of P tokens (timed: prefill), then G steps of one token
 * each (timed: decode). */
static bool speed(const qi_model *m, const char *devices, const char *placement, int B, int P, int G, int threads,
                  double *pp, double *tg) {
    qi_engine *eng = engine(m, devices, placement, B, P + G + 8, threads);
    if (!eng) return false;
    qi_err e = {0};
    int32_t *prompt = malloc(sizeof(int32_t) * (size_t)P);
    for (int i = 0; i < P; i++) prompt[i] = (int32_t)(i * 31 % 256);
    int *ids = malloc(sizeof(int) * (size_t)B), nt;
    bool ok = true;
    const double t0 = qi_engine_now(eng);
    for (int s = 0; ok && s < B; s++)
        ok = !qi_engine_seq_add(eng, &ids[s], &e) && !qi_engine_seq_feed(eng, ids[s], prompt, P, false, &e);
    for (bool more = true; ok && more;) {
        ok = !qi_engine_step(eng, &nt, &e);
        more = false;
        for (int s = 0; s < B; s++) more |= qi_engine_seq_pending(eng, ids[s]) > 0;
    }
    const double t1 = qi_engine_now(eng);
    for (int g = 0; ok && g < G; g++) {
        for (int s = 0; ok && s < B; s++) {
            const int32_t t = (int32_t)((g + s) % 256);
            ok = !qi_engine_seq_feed(eng, ids[s], &t, 1, false, &e);
        }
        if (ok) ok = !qi_engine_step(eng, &nt, &e);
    }
    const double t2 = qi_engine_now(eng);
    if (!ok) fprintf(stderr, "gpucheck: speed %s / %s b%d: %s\n", devices, placement, B, e.msg);
    *pp = (double)B * P / (t1 - t0);
    *tg = (double)B * G / (t2 - t1);
    qi_engine_free(eng);
    free(prompt), free(ids);
    return ok;
}

static int cmd_speed(int argc, char **argv) {
    if (argc < 1) return 2;
    qi_model *m = NULL;
    qi_err e = {0};
    if (qi_model_load(argv[0], &m, &e)) die(argv[0], &e);
    const double hbm_gbs = argc > 1 ? atof(argv[1]) : 0; /* measured device memory bandwidth, GB/s */
    const int L = m->hp.n_layer;
    char half[32], all[32], split[512];
    snprintf(half, sizeof half, "ngl=%d", L / 2);
    snprintf(all, sizeof all, "ngl=%d", L + 1);
    snprintf(split, sizeof split, "%s.speed.plan", argv[0]);
    FILE *f = fopen(split, "w");
    if (!f) return 1;
    fprintf(f, "embd cuda\nhead cuda\n");
    for (int l = 0; l < L; l++) fprintf(f, "cuda cuda 0.5 cpu\n");
    fclose(f);
    const char *devs[] = {"cpu", "cpu,cuda", "cpu,cuda", "cpu,cuda"};
    const char *plans[] = {"all-cpu", all, half, split};
    const char *names[] = {"all-CPU (2 threads)", "all-GPU", "ngl=half", "split attention 50%"};
    const int Bs[] = {1, 16, 64};
    double tg_cpu1 = 0, tg_gpu1 = 0;
    printf("%-22s %5s %12s %12s\n", "plan", "batch", "prefill t/s", "decode t/s");
    for (int p = 0; p < 4; p++)
        for (int b = 0; b < 3; b++) {
            double pp = 0, tg = 0;
            const bool big = m->hp.n_embd >= 4096;
            if (p == 0 && big && Bs[b] > 1) continue; /* minutes of a 2-thread CPU */
            const int P = p == 0 && (big || Bs[b] > 1) ? 32 : 128, G = p == 0 ? 8 : 32;
            if (!speed(m, devs[p], plans[p], Bs[b], P, G, 2, &pp, &tg)) {
                g_fail++;
                continue;
            }
            if (b == 0 && p == 0) tg_cpu1 = tg;
            if (b == 0 && p == 1) tg_gpu1 = tg;
            printf("%-22s %5d %12.1f %12.1f\n", names[p], Bs[b], pp, tg);
        }
    remove(split);
    /* the bytes one decode step reads: every weight once (and the KV, small here) */
    double bytes = 0;
    for (int l = 0; l < L; l++) {
        const qi_layer *y = &m->layers[l];
        const qi_weight *w[] = {&y->wq, &y->wk, &y->wv, &y->wo, &y->w_gate, &y->w_up, &y->w_down};
        for (int i = 0; i < 7; i++) bytes += (double)w[i]->row_bytes * (double)w[i]->n_rows;
    }
    bytes += (double)m->output.row_bytes * (double)m->output.n_rows;
    printf("decode b1 all-GPU / all-CPU: %.2fx\n", tg_cpu1 > 0 ? tg_gpu1 / tg_cpu1 : 0);
    if (hbm_gbs > 0)
        printf("decode b1 all-GPU reads %.1f MB a token: %.1f GB/s, %.1f%% of the measured %.0f GB/s\n", bytes / 1e6,
               bytes * tg_gpu1 / 1e9, 100.0 * bytes * tg_gpu1 / 1e9 / hbm_gbs, hbm_gbs);
    qi_model_free(m);
    return g_fail ? 1 : 0;
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        printf("usage: qi_gpucheck [--fake] ops | greedy [--gpu-mem BYTES] MODEL... | speed MODEL [HBM_GB/s]\n"
               "Checks of the CUDA device on a GPU (tests/gpu/README.md); exit 77 without one.\n");
        return argc < 2 ? 2 : 0;
    }
    qi_err e = {0};
    qi_backend *fake_cpu = NULL;
    if (!strcmp(argv[1], "--fake")) {
        if (qi_backend_cpu_create(2, 0, &fake_cpu, &e) || fake_cpu->iface->reserve(fake_cpu, (size_t)16 << 20, 64, 8192, 8, 256, &e))
            die("the stand-in runtime's CPU", &e);
        qi_fake_cuda_reset(fake_cpu, (size_t)8 << 30);
        qi_cuda_use_rt(&qi_fake_cuda_rt);
        argc--, argv++;
    }
    qi_status st = qi_backend_cuda_create(0, 0, &g_gpu, &e);
    if (st) {
        printf("gpucheck: skipped: no usable GPU: %s\n", e.msg);
        return 77;
    }
    if (qi_backend_cpu_create(2, 0, &g_cpu, &e) ||
        g_cpu->iface->reserve(g_cpu, (size_t)16 << 20, 64, 8192, 8, 256, &e) ||
        g_gpu->iface->reserve(g_gpu, (size_t)16 << 20, 64, 8192, 8, 256, &e))
        die("devices", &e);
    printf("gpucheck: %s\n", qi_backend_cuda_gpu_name(g_gpu));
    int rc = 2;
    if (!strcmp(argv[1], "ops")) rc = cmd_ops();
    else if (!strcmp(argv[1], "greedy")) rc = cmd_greedy(argc - 2, argv + 2);
    else if (!strcmp(argv[1], "speed")) rc = cmd_speed(argc - 2, argv + 2);
    else fprintf(stderr, "gpucheck: unknown command '%s'\n", argv[1]);
    qi_backend_free(g_gpu);
    qi_backend_free(g_cpu);
    qi_backend_free(fake_cpu);
    if (fake_cpu && qi_fake.bad_pointers) {
        printf("gpucheck: %ld kernel arguments were not device memory\n", qi_fake.bad_pointers);
        rc = 1;
    }
    return rc;
}

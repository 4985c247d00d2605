/* test_cuda_host.c - the CUDA device's host logic (engine/backend/cuda/
 * backend_cuda.c) on a machine without a GPU, through the stand-in
 * runtime of cuda_fake.c (qi_cuda_use_rt): "device" memory from the heap,
 * copies done at once, a clock that advances a millisecond per command,
 * and kernels that run the CPU backend's ops on what they are given. What
 * is checked:
 *
 *   - the device's identity and capacity (the GPU's memory, or a cap);
 *   - every op through the device equals the CPU's bit for bit (the
 *     kernels here are the CPU's, so any difference is the device's: a
 *     table staged wrong, an argument passed wrong);
 *   - no kernel is given host memory: every pointer a kernel receives,
 *     and every KV block address and row address in its tables, lies in a
 *     live device allocation (the host's tables must be staged);
 *   - the staging ring: reused from its start when full, after a drain,
 *     and grown for a table larger than it, its bytes counted in in_use;
 *   - failures: each runtime call and each kernel, failed on purpose,
 *     surfaces at the next synchronise once, naming the call or kernel, its
 *     arguments and the runtime's reason; a failed creation frees what it
 *     made and says which call failed;
 *   - event times come from the device's clock (the runtime's elapsed
 *     times), also after the anchor event has moved;
 *   - the copy stream: its copies and events on the second stream, waits
 *     between the two streams on the GPU, a synchronise draining both, its
 *     failures named;
 *   - the engine on cpu,cuda: all-GPU, ngl=half and split-attention plans
 *     give the all-CPU logits bit for bit (a synthetic model written by
 *     `qinfer synth`).
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "cuda/cuda_rt.h"
#include "cuda_fake.h"
#include "qinfer/engine.h"
#include "qinfer/quant.h"
#include "testutil.h"

#define F qi_fake
#define fail_next qi_fake_cuda_fail_next

static qi_weight wt(uint32_t type, const void *w, int64_t rows, int64_t cols, uint64_t rb) {
    return (qi_weight){.type = type, .n_cols = cols, .n_rows = rows, .row_bytes = rb, .data = w};
}

static void setup(void) {
    qi_backend *cpu = NULL;
    qi_err e = {0};
    ck_assert_msg(qi_backend_cpu_create(1, 0, &cpu, &e) == QI_OK, "%s", e.msg);
    ck_assert_int_eq(cpu->iface->reserve(cpu, 1 << 16, 64, 4096, 4, 64, &e), QI_OK);
    qi_fake_cuda_reset(cpu, (size_t)1 << 30);
    qi_cuda_use_rt(&qi_fake_cuda_rt);
}
static void teardown(void) {
    qi_cuda_use_rt(NULL);
    qi_backend_free(F.cpu);
    ck_assert_int_eq(F.n_dev, 0); /* every device allocation freed */
    ck_assert_int_eq(F.host_live, 0);
    ck_assert_int_eq(F.events_live, 0);
    ck_assert_int_eq(F.streams_live, 0);
    ck_assert_int_eq(F.blas_live, 0);
}

static qi_backend *make(size_t cap) {
    qi_backend *b = NULL;
    qi_err e = {0};
    ck_assert_msg(qi_backend_cuda_create(0, cap, &b, &e) == QI_OK, "%s", e.msg);
    ck_assert_int_eq(b->iface->reserve(b, 1 << 12, 16, 512, 4, 64, &e), QI_OK);
    return b;
}

/* A device buffer holding n bytes of src (NULL: zeros), and its address. */
static void *dev_put(qi_backend *b, qi_buf **buf, const void *src, size_t n) {
    qi_err e = {0};
    ck_assert_int_eq(qi_buf_alloc(b, n, "test data", buf, &e), QI_OK);
    void *p = qi_buf_ptr(b, qi_view_of(*buf, 0), n, &e);
    if (src) ck_assert_int_eq(qi_dev_upload(b, qi_view_of(*buf, 0), src, n, &e), QI_OK);
    else memset(p, 0, n);
    return p;
}
static void dev_get(qi_backend *b, qi_buf *buf, void *dst, size_t n) {
    qi_err e = {0};
    ck_assert_int_eq(qi_dev_download(b, dst, qi_view_of(buf, 0), n, &e), QI_OK);
    ck_assert_msg(qi_dev_synchronize(b, &e) == QI_OK, "%s", e.msg);
}

static void randf(float *x, size_t n, uint64_t *st) {
    for (size_t i = 0; i < n; i++) x[i] = qi_test_randf(st);
}

START_TEST(test_identity) {
    qi_backend *b = make(0);
    const qi_dev_info *in = qi_dev_info_get(b);
    ck_assert_str_eq(in->name, "cuda");
    ck_assert_int_eq(in->kind, QI_DEV_CUDA);
    ck_assert(!in->host_visible);
    ck_assert_uint_eq(in->capacity, F.total);
    ck_assert_str_eq(qi_backend_cuda_gpu_name(b), "Fake GPU 0");
    ck_assert_ptr_null(qi_backend_cuda_gpu_name(F.cpu));
    /* the staging ring and the scratch are the device's memory too */
    ck_assert_uint_ge(in->in_use, (size_t)8 << 20);
    qi_backend_free(b);
    b = make((size_t)64 << 20);
    ck_assert_uint_eq(qi_dev_info_get(b)->capacity, (size_t)64 << 20);
    qi_backend_free(b);
    b = make((size_t)4 << 30); /* a cap above the GPU's memory is the GPU's memory */
    ck_assert_uint_eq(qi_dev_info_get(b)->capacity, F.total);
    qi_backend_free(b);
}
END_TEST

/* matmul and get_rows on quantised and float weights, on the device and
 * on the CPU, bit for bit. */
START_TEST(test_matmul_get_rows) {
    qi_backend *b = make(0);
    uint64_t st = 7;
    const uint32_t types[] = {QI_TYPE_F32, QI_TYPE_F16, QI_TYPE_Q4_0, QI_TYPE_Q8_0, QI_TYPE_Q4_K, QI_TYPE_Q6_K};
    const int rows = 19, cols = 512, T = 3;
    float *wf = malloc(sizeof(float) * rows * cols), x[T * cols], y_cpu[T * rows], y_dev[T * rows];
    randf(wf, (size_t)rows * cols, &st);
    randf(x, (size_t)T * cols, &st);
    for (size_t k = 0; k < sizeof types / sizeof *types; k++) {
        uint64_t rb = 0;
        ck_assert(qi_type_row_bytes(types[k], cols, &rb));
        uint8_t *wq = malloc(rb * rows);
        for (int r = 0; r < rows; r++) qi_quantize_row_ref(types[k], wf + (size_t)r * cols, wq + rb * r, cols);
        const qi_weight W = wt(types[k], wq, rows, cols, rb);
        F.cpu->iface->matmul(F.cpu, &W, x, T, y_cpu);
        qi_buf *bw, *bx, *by;
        const qi_weight Wd = wt(types[k], dev_put(b, &bw, wq, rb * rows), rows, cols, rb);
        float *dx = dev_put(b, &bx, x, sizeof x), *dy = dev_put(b, &by, NULL, sizeof y_dev);
        b->iface->matmul(b, &Wd, dx, T, dy);
        dev_get(b, by, y_dev, sizeof y_dev);
        ck_assert_msg(memcmp(y_cpu, y_dev, sizeof y_dev) == 0, "matmul type %u", types[k]);
        /* get_rows: ids from the host */
        const int32_t ids[4] = {18, 0, 7, 7};
        float g_cpu[4 * cols], g_dev[4 * cols];
        F.cpu->iface->get_rows(F.cpu, &W, ids, 4, g_cpu);
        qi_buf *bg;
        float *dg = dev_put(b, &bg, NULL, sizeof g_dev);
        b->iface->get_rows(b, &Wd, ids, 4, dg);
        dev_get(b, bg, g_dev, sizeof g_dev);
        ck_assert_msg(memcmp(g_cpu, g_dev, sizeof g_dev) == 0, "get_rows type %u", types[k]);
        qi_buf_free(bw);
        qi_buf_free(bx);
        qi_buf_free(by);
        qi_buf_free(bg);
        free(wq);
    }
    ck_assert_int_eq(F.bad_pointers, 0);
    free(wf);
    qi_backend_free(b);
}
END_TEST

/* The element-wise and row-wise ops. */
START_TEST(test_small_ops) {
    qi_backend *b = make(0);
    uint64_t st = 11;
    enum { T = 5, H = 4, Hk = 2, D = 16, N = T * H * D };
    float q[N], k[T * Hk * D], w[H * D], up[N], r_cpu[N], r_dev[N], k_cpu[T * Hk * D], k_dev[T * Hk * D];
    randf(q, N, &st);
    randf(k, T * Hk * D, &st);
    randf(w, H * D, &st);
    randf(up, N, &st);
    const int32_t pos[T] = {3, 4, 9, 100, 7000};
    qi_buf *bq, *bk, *bw, *bu;
    float *dq = dev_put(b, &bq, q, sizeof q), *dk = dev_put(b, &bk, k, sizeof k), *dw = dev_put(b, &bw, w, sizeof w),
          *du = dev_put(b, &bu, up, sizeof up);
    for (int op = 0; op < 10; op++) {
        memcpy(r_cpu, q, sizeof q);
        memcpy(k_cpu, k, sizeof k);
        ck_assert_int_eq(qi_dev_upload(b, qi_view_of(bq, 0), q, sizeof q, &(qi_err){0}), QI_OK);
        ck_assert_int_eq(qi_dev_upload(b, qi_view_of(bk, 0), k, sizeof k, &(qi_err){0}), QI_OK);
        const int32_t rows[3] = {1, 3, 4};
        switch (op) {
        case 0:
            F.cpu->iface->rmsnorm(F.cpu, r_cpu, w, T * H * D / (H * D), H * D, 1e-5f, r_cpu);
            b->iface->rmsnorm(b, dq, dw, T, H * D, 1e-5f, dq);
            break;
        case 1:
        case 2:
            F.cpu->iface->rope(F.cpu, r_cpu, H, k_cpu, Hk, T, D, D - 4, pos, 10000.0f, 0.5f, op - 1);
            b->iface->rope(b, dq, H, dk, Hk, T, D, D - 4, pos, 10000.0f, 0.5f, op - 1);
            break;
        case 3:
            F.cpu->iface->swiglu(F.cpu, r_cpu, up, T, H * D);
            b->iface->swiglu(b, dq, du, T, H * D);
            break;
        case 4:
            F.cpu->iface->geglu(F.cpu, r_cpu, up, T, H * D);
            b->iface->geglu(b, dq, du, T, H * D);
            break;
        case 5:
            F.cpu->iface->add(F.cpu, r_cpu, up, N);
            b->iface->add(b, dq, du, N);
            break;
        case 6:
            F.cpu->iface->scale(F.cpu, r_cpu, N, 0.3f);
            b->iface->scale(b, dq, N, 0.3f);
            break;
        case 7:
            F.cpu->iface->softcap(F.cpu, r_cpu, N, 0.5f);
            b->iface->softcap(b, dq, N, 0.5f);
            break;
        case 8:
            F.cpu->iface->gather_rows(F.cpu, r_cpu, rows, 3, H * D);
            b->iface->gather_rows(b, dq, rows, 3, H * D);
            break;
        case 9: /* a bias of H * D over T rows, from device memory (dw) */
            F.cpu->iface->add_bias(F.cpu, r_cpu, w, T, H * D);
            b->iface->add_bias(b, dq, dw, T, H * D);
            break;
        }
        dev_get(b, bq, r_dev, sizeof r_dev);
        dev_get(b, bk, k_dev, sizeof k_dev);
        ck_assert_msg(memcmp(r_cpu, r_dev, sizeof r_dev) == 0, "op %d", op);
        ck_assert_msg(memcmp(k_cpu, k_dev, sizeof k_dev) == 0, "op %d (k)", op);
    }
    ck_assert_int_eq(F.bad_pointers, 0);
    /* the same positions again (each layer's RoPE): not copied again; others are */
    b->iface->rope(b, dq, H, dk, Hk, T, D, D, pos, 10000.0f, 1.0f, 0);
    const long calls = F.calls;
    b->iface->rope(b, dq, H, dk, Hk, T, D, D, pos, 10000.0f, 1.0f, 0);
    ck_assert_int_eq(F.calls, calls + 1); /* the kernel alone */
    const int32_t pos2[T] = {3, 4, 9, 100, 7001};
    b->iface->rope(b, dq, H, dk, Hk, T, D, D, pos2, 10000.0f, 1.0f, 0);
    ck_assert_int_eq(F.calls, calls + 3); /* a copy and the kernel */
    qi_buf_free(bq);
    qi_buf_free(bk);
    qi_buf_free(bw);
    qi_buf_free(bu);
    qi_backend_free(b);
}
END_TEST

/* Paged attention over blocks in device memory, tables from the host:
 * whole with statistics, two partial calls merged, a statistics pass; and
 * kv_write into the blocks. Equal to the CPU over the same rows. */
START_TEST(test_attention) {
    qi_backend *b = make(0);
    uint64_t st = 5;
    enum { T = 3, H = 4, Hkv = 2, D = 32, SH = 3, BLK = 1 << SH, NS = 37, NB = (NS + BLK - 1) / BLK };
    const size_t pool_rows = (size_t)Hkv * NB * BLK * 2;
    uint16_t *pool = malloc(sizeof(uint16_t) * pool_rows * D);
    for (size_t i = 0; i < pool_rows * D; i++) pool[i] = qi_f32_to_fp16(qi_test_randf(&st));
    qi_buf *bp;
    uint16_t *dpool = dev_put(b, &bp, pool, sizeof(uint16_t) * pool_rows * D);
    /* blocks in a scrambled order, slots in a scrambled position order */
    const uint16_t *kb_h[Hkv][NB], *vb_h[Hkv][NB], *kb_d[Hkv][NB], *vb_d[Hkv][NB];
    int32_t pos[Hkv][NS];
    for (int hk = 0; hk < Hkv; hk++) {
        for (int i = 0; i < NB; i++) {
            const size_t kr = ((size_t)(hk * NB + (NB - 1 - i)) * 2) * BLK, vr = kr + BLK;
            kb_h[hk][i] = pool + kr * D;
            vb_h[hk][i] = pool + vr * D;
            kb_d[hk][i] = dpool + kr * D;
            vb_d[hk][i] = dpool + vr * D;
        }
        for (int i = 0; i < NS; i++) pos[hk][i] = (i * 7 + hk) % NS;
    }
    const int32_t q_pos[T] = {20, 35, 36};
    float q[T * H * D];
    randf(q, T * H * D, &st);
    qi_buf *bq, *bo, *bs, *bo2, *bm, *bl, *bm2, *bl2, *btm, *btl, *bmo;
    float *dq = dev_put(b, &bq, q, sizeof q);
    float *dout = dev_put(b, &bo, NULL, sizeof q), *dstats = dev_put(b, &bs, NULL, sizeof(float) * H * 64);
    const int n_slots[Hkv] = {NS, NS - 5};
    const int32_t *posp[Hkv] = {pos[0], pos[1]};
    const uint16_t *const *kbh[Hkv] = {kb_h[0], kb_h[1]}, *const *vbh[Hkv] = {vb_h[0], vb_h[1]};
    const uint16_t *const *kbd[Hkv] = {kb_d[0], kb_d[1]}, *const *vbd[Hkv] = {vb_d[0], vb_d[1]};
    float out_cpu[T * H * D], out_dev[T * H * D], st_cpu[H * 64] = {0}, st_dev[H * 64];
    for (int swa = 0; swa < 2; swa++) {
        qi_attn_paged_args a = {.T = T, .H = H, .Hkv = Hkv, .D = D, .q_pos = q_pos, .n_swa = swa ? 9 : 0,
                                .scale = 0.125f, .q = q, .out = out_cpu, .n_slots = n_slots, .pos = posp,
                                .k_blk = kbh, .v_blk = vbh, .shift = SH, .stats = st_cpu, .stats_stride = 64};
        F.cpu->iface->attention_paged(F.cpu, &a);
        a.q = dq;
        a.out = dout;
        a.k_blk = kbd;
        a.v_blk = vbd;
        a.stats = dstats;
        b->iface->attention_paged_n(b, &a, 1);
        dev_get(b, bo, out_dev, sizeof out_dev);
        dev_get(b, bs, st_dev, sizeof st_dev);
        ck_assert_msg(memcmp(out_cpu, out_dev, sizeof out_dev) == 0, "attention swa %d", swa);
        ck_assert_msg(memcmp(st_cpu, st_dev, sizeof st_dev) == 0, "attention stats swa %d", swa);
    }
    /* two partial calls (the first 16 slots, the rest), merged, then a
     * statistics pass against the merged max and sum */
    float *do2 = dev_put(b, &bo2, NULL, sizeof q);
    float *dm = dev_put(b, &bm, NULL, sizeof(float) * T * H), *dl = dev_put(b, &bl, NULL, sizeof(float) * T * H);
    float *dm2 = dev_put(b, &bm2, NULL, sizeof(float) * T * H), *dl2 = dev_put(b, &bl2, NULL, sizeof(float) * T * H);
    float *dtm = dev_put(b, &btm, NULL, sizeof(float) * T * H), *dtl = dev_put(b, &btl, NULL, sizeof(float) * T * H);
    float *dmo = dev_put(b, &bmo, NULL, sizeof q);
    float o1[T * H * D], o2[T * H * D], m1[T * H], l1[T * H], m2[T * H], l2[T * H], mo[T * H * D], tm[T * H],
        tl[T * H], mo_dev[T * H * D];
    const int n1[Hkv] = {16, 16}, n2[Hkv] = {NS - 16, NS - 5 - 16};
    const int32_t *pos2[Hkv] = {pos[0] + 16, pos[1] + 16};
    const uint16_t *const *kbh2[Hkv] = {kb_h[0] + 2, kb_h[1] + 2}, *const *vbh2[Hkv] = {vb_h[0] + 2, vb_h[1] + 2};
    const uint16_t *const *kbd2[Hkv] = {kb_d[0] + 2, kb_d[1] + 2}, *const *vbd2[Hkv] = {vb_d[0] + 2, vb_d[1] + 2};
    qi_attn_paged_args p1 = {.T = T, .H = H, .Hkv = Hkv, .D = D, .q_pos = q_pos, .scale = 0.125f, .q = q,
                             .out = o1, .n_slots = n1, .pos = posp, .k_blk = kbh, .v_blk = vbh, .shift = SH,
                             .part_m = m1, .part_l = l1};
    qi_attn_paged_args p2 = p1;
    p2.out = o2;
    p2.n_slots = n2;
    p2.pos = pos2;
    p2.k_blk = kbh2;
    p2.v_blk = vbh2;
    p2.part_m = m2;
    p2.part_l = l2;
    qi_attn_paged_args both[2] = {p1, p2};
    F.cpu->iface->attention_paged_n(F.cpu, both, 2);
    const float *os[2] = {o1, o2}, *ms[2] = {m1, m2}, *ls[2] = {l1, l2};
    qi_attn_merge_args mg = {.rows = T * H, .D = D, .n_parts = 2, .o = os, .m = ms, .l = ls, .out = mo, .tot_m = tm,
                             .tot_l = tl};
    F.cpu->iface->attention_merge(F.cpu, &mg);
    both[0].q = both[1].q = dq;
    both[0].k_blk = kbd;
    both[0].v_blk = vbd;
    both[1].k_blk = kbd2;
    both[1].v_blk = vbd2;
    both[0].out = dout;
    both[1].out = do2;
    both[0].part_m = dm;
    both[0].part_l = dl;
    both[1].part_m = dm2;
    both[1].part_l = dl2;
    b->iface->attention_paged_n(b, both, 2);
    const float *osd[2] = {dout, do2}, *msd[2] = {dm, dm2}, *lsd[2] = {dl, dl2};
    qi_attn_merge_args mgd = {.rows = T * H, .D = D, .n_parts = 2, .o = osd, .m = msd, .l = lsd, .out = dmo,
                              .tot_m = dtm, .tot_l = dtl};
    b->iface->attention_merge(b, &mgd);
    dev_get(b, bmo, mo_dev, sizeof mo_dev);
    ck_assert(memcmp(mo, mo_dev, sizeof mo) == 0);
    /* statistics pass over the second part */
    float sc[H * 64] = {0}, sd[H * 64];
    ck_assert_int_eq(qi_dev_upload(b, qi_view_of(bs, 0), sc, sizeof sc, &(qi_err){0}), QI_OK);
    qi_attn_paged_args s2 = p2;
    s2.part_m = s2.part_l = NULL;
    s2.out = NULL;
    s2.stats = sc;
    s2.stats_stride = 64;
    s2.tot_m = tm;
    s2.tot_l = tl;
    F.cpu->iface->attention_paged(F.cpu, &s2);
    s2.q = dq;
    s2.k_blk = kbd2;
    s2.v_blk = vbd2;
    s2.stats = dstats;
    s2.tot_m = dtm;
    s2.tot_l = dtl;
    b->iface->attention_paged(b, &s2);
    dev_get(b, bs, sd, sizeof sd);
    ck_assert(memcmp(sc, sd, sizeof sd) == 0);
    /* kv_write: rows of q into blocks of the pool, addresses from the host */
    const float *src_h[4], *src_d[4];
    uint16_t *dst_h[4], *dst_d[4];
    for (int i = 0; i < 4; i++) {
        src_h[i] = q + i * D;
        src_d[i] = dq + i * D;
        dst_h[i] = pool + (size_t)(5 * i + 1) * D;
        dst_d[i] = dpool + (size_t)(5 * i + 1) * D;
    }
    F.cpu->iface->kv_write(F.cpu, src_h, dst_h, 4, D);
    b->iface->kv_write(b, src_d, dst_d, 4, D);
    uint16_t *pool_dev = malloc(sizeof(uint16_t) * pool_rows * D);
    dev_get(b, bp, pool_dev, sizeof(uint16_t) * pool_rows * D);
    ck_assert(memcmp(pool, pool_dev, sizeof(uint16_t) * pool_rows * D) == 0);
    ck_assert_int_eq(F.bad_pointers, 0);
    qi_buf *all[] = {bp, bq, bo, bs, bo2, bm, bl, bm2, bl2, btm, btl, bmo};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) qi_buf_free(all[i]);
    free(pool);
    free(pool_dev);
    qi_backend_free(b);
}
END_TEST

/* The ring: full, it is reused after a drain; a table larger than it grows
 * it (counted in in_use). kv_write's address tables are the big ones. */
START_TEST(test_staging_ring) {
    qi_backend *b = make(0);
    enum { D = 4 };
    qi_buf *bs, *bd;
    float *src = dev_put(b, &bs, NULL, sizeof(float) * D);
    uint16_t *dst = dev_put(b, &bd, NULL, sizeof(uint16_t) * D);
    const size_t ring0 = qi_dev_info_get(b)->in_use;
    const int n = 300000; /* 4.8 MB of addresses a call: the 8 MB ring fills on the second */
    const float **s = malloc(sizeof *s * 2 * (size_t)n);
    uint16_t **d = malloc(sizeof *d * 2 * (size_t)n);
    for (int i = 0; i < 2 * n; i++) {
        s[i] = src;
        d[i] = dst;
    }
    const long syncs = F.stream_syncs;
    b->iface->kv_write(b, s, d, n, D);
    ck_assert_int_eq(F.stream_syncs, syncs);
    b->iface->kv_write(b, s, d, n, D);
    ck_assert_int_eq(F.stream_syncs, syncs + 1); /* wrapped: drained first */
    ck_assert_uint_eq(qi_dev_info_get(b)->in_use, ring0);
    b->iface->kv_write(b, s, d, 2 * n, D); /* 9.6 MB: the ring grows */
    ck_assert_uint_gt(qi_dev_info_get(b)->in_use, ring0);
    ck_assert_uint_ge(qi_dev_info_get(b)->peak, qi_dev_info_get(b)->in_use);
    qi_err e = {0};
    ck_assert_int_eq(qi_dev_synchronize(b, &e), QI_OK);
    ck_assert_int_eq(F.bad_pointers, 0);
    free(s);
    free(d);
    qi_buf_free(bs);
    qi_buf_free(bd);
    qi_backend_free(b);
}
END_TEST

/* A failure of each kind surfaces at the next synchronise, once, named. */
START_TEST(test_failures) {
    qi_backend *b = make(0);
    qi_err e = {0};
    float x[64] = {0};
    qi_buf *bx;
    float *dx = dev_put(b, &bx, x, sizeof x);
    ck_assert_int_eq(qi_dev_synchronize(b, &e), QI_OK);
    /* a copy */
    fail_next("memcpy_async", 1, 700);
    ck_assert_int_eq(qi_dev_upload(b, qi_view_of(bx, 0), x, 64, &e), QI_OK); /* queued: fails in the stream */
    ck_assert_int_eq(qi_dev_synchronize(b, &e), QI_ERR_BACKEND);
    ck_assert_msg(strstr(e.msg, "cuda: cudaMemcpyAsync(") && strstr(e.msg, "64 bytes) failed: fake failure") &&
                      strstr(e.msg, "fake runtime error 700"),
                  "%s", e.msg);
    qi_err_clear(&e);
    ck_assert_int_eq(qi_dev_synchronize(b, &e), QI_OK); /* once */
    /* a strided upload: one cudaMemcpy2DAsync, its rows where they belong */
    float col[8];
    for (int i = 0; i < 8; i++) col[i] = (float)i + 0.5f;
    ck_assert_int_eq(qi_dev_upload_2d(b, qi_view_of(bx, sizeof(float)), 8 * sizeof(float), col, 2 * sizeof(float),
                                      sizeof(float), 4, &e),
                     QI_OK);
    float back[64];
    ck_assert_int_eq(qi_dev_download(b, back, qi_view_of(bx, 0), sizeof back, &e), QI_OK);
    ck_assert_int_eq(qi_dev_synchronize(b, &e), QI_OK);
    for (int r = 0; r < 4; r++) ck_assert(back[1 + 8 * r] == col[2 * r] && back[8 * r] == 0.0f);
    fail_next("memcpy_2d_async", 1, 700);
    ck_assert_int_eq(qi_dev_upload_2d(b, qi_view_of(bx, 0), 64, x, 64, 16, 3, &e), QI_OK);
    ck_assert_int_eq(qi_dev_synchronize(b, &e), QI_ERR_BACKEND);
    ck_assert_msg(strstr(e.msg, "cudaMemcpy2DAsync(") && strstr(e.msg, "3 x 16 bytes) failed"), "%s", e.msg);
    qi_err_clear(&e);
    ck_assert_int_eq(qi_dev_upload(b, qi_view_of(bx, 0), x, sizeof x, &e), QI_OK); /* zeros again */
    /* a kernel, with its arguments */
    qi_err_clear(&e);
    fail_next("scale", 1, 719);
    b->iface->scale(b, dx, 64, 2.0f);
    b->iface->add(b, dx, dx, 64); /* the first failure sticks */
    fail_next("add", 1, 1);
    b->iface->add(b, dx, dx, 64);
    ck_assert_int_eq(qi_dev_synchronize(b, &e), QI_ERR_BACKEND);
    ck_assert_msg(strstr(e.msg, "cuda: scale (scale n=64) failed") && strstr(e.msg, "error 719"), "%s", e.msg);
    qi_err_clear(&e);
    ck_assert_int_eq(qi_dev_synchronize(b, &e), QI_OK);
    /* a table's staging copy */
    qi_err_clear(&e);
    const int32_t pos[2] = {0, 1};
    fail_next("memcpy_async", 1, 700);
    b->iface->rope(b, dx, 1, NULL, 0, 2, 32, 32, pos, 10000.0f, 1.0f, 0);
    ck_assert_int_eq(qi_dev_synchronize(b, &e), QI_ERR_BACKEND);
    ck_assert_msg(strstr(e.msg, "8 bytes of an op's tables"), "%s", e.msg); /* 2 positions, aligned to 16 */
    /* the synchronise itself (a fault in earlier work) */
    qi_err_clear(&e);
    fail_next("stream_sync", 1, 700);
    ck_assert_int_eq(qi_dev_synchronize(b, &e), QI_ERR_BACKEND);
    ck_assert_msg(strstr(e.msg, "cudaStreamSynchronize failed"), "%s", e.msg);
    /* a weight type without a kernel */
    qi_err_clear(&e);
    uint64_t rb;
    ck_assert(qi_type_row_bytes(QI_TYPE_Q2_K, 256, &rb));
    const qi_weight w = wt(QI_TYPE_Q2_K, dx, 1, 256, rb);
    b->iface->matmul(b, &w, dx, 1, dx);
    ck_assert_int_eq(qi_dev_synchronize(b, &e), QI_ERR_UNSUPPORTED);
    ck_assert_msg(strstr(e.msg, "matmul: weights of type q2_k have no CUDA kernel"), "%s", e.msg);
    /* out of device memory: refused at once, nothing counted */
    const size_t used = qi_dev_info_get(b)->in_use;
    fail_next("dev_malloc", 1, 2);
    qi_buf *big = NULL;
    qi_err_clear(&e);
    ck_assert_int_eq(qi_buf_alloc(b, 1000, "weights", &big, &e), QI_ERR_NOMEM);
    ck_assert_uint_eq(qi_dev_info_get(b)->in_use, used);
    ck_assert_msg(strstr(e.msg, "cuda: out of memory allocating 1000 bytes for weights"), "%s", e.msg);
    /* over the capacity */
    qi_err_clear(&e);
    ck_assert_int_eq(qi_buf_alloc(b, F.total, "weights", &big, &e), QI_ERR_NOMEM);
    ck_assert_msg(strstr(e.msg, "cuda:") && strstr(e.msg, "do not fit"), "%s", e.msg);
    qi_buf_free(bx);
    qi_backend_free(b);
    /* creation: each failing call named, nothing left behind (teardown checks) */
    const char *calls[] = {"init", "stream_create", "blas_create", "event_create", "event_record"};
    const char *says[] = {"selecting GPU 0 failed: fake failure", "cudaStreamCreate failed",
                          "cublasCreate failed: fake cuBLAS says no (cuBLAS error 3)", "cudaEventCreate failed",
                          "clock's anchor event failed"};
    for (int i = 0; i < 5; i++) {
        fail_next(calls[i], 1, 3);
        qi_backend *bad = NULL;
        qi_err_clear(&e);
        ck_assert_int_eq(qi_backend_cuda_create(0, 0, &bad, &e), QI_ERR_BACKEND);
        ck_assert_ptr_null(bad);
        ck_assert_msg(strstr(e.msg, says[i]), "%s: %s", calls[i], e.msg);
    }
}
END_TEST

/* The copy stream, a second CUDA stream (the fake's stream 2; the main
 * one is 1): copies asked of it are queued there and its events recorded
 * there; a wait for the other stream's event is a cudaStreamWaitEvent on
 * the waiting stream (the host does not wait), one for the same stream's
 * none, and one for another device's event is the host's; a synchronise
 * drains both; a failure there names the copy stream. */
START_TEST(test_copy_stream) {
    qi_backend *b = make(0);
    qi_err e = {0};
    ck_assert(qi_dev_has_copy_stream(b));
    float x[64], back[64];
    for (int i = 0; i < 64; i++) x[i] = (float)i + 0.25f;
    qi_buf *bx;
    dev_put(b, &bx, NULL, sizeof x);
    const long m0 = F.copies_on[0], c0 = F.copies_on[1];
    ck_assert_int_eq(qi_dev_upload_on(b, QI_STREAM_COPY, qi_view_of(bx, 0), x, 32 * sizeof(float), &e), QI_OK);
    ck_assert_int_eq(qi_dev_upload_2d_on(b, QI_STREAM_COPY, qi_view_of(bx, 32 * sizeof(float)), 8 * sizeof(float),
                                         x + 32, 8 * sizeof(float), 8 * sizeof(float), 4, &e),
                     QI_OK);
    ck_assert_int_eq(F.copies_on[1], c0 + 2);
    ck_assert_int_eq(F.copies_on[0], m0);
    qi_event *cev = NULL, *mev = NULL, *hev = NULL;
    ck_assert_int_eq(qi_event_record_on(b, QI_STREAM_COPY, &cev, &e), QI_OK);
    ck_assert_int_eq(qi_event_stream(cev), QI_STREAM_COPY);
    ck_assert_int_eq(qi_event_record(b, &mev, &e), QI_OK);
    ck_assert_int_eq(qi_event_record(F.cpu, &hev, &e), QI_OK);
    const long w0 = F.waits_on[0], w1 = F.waits_on[1];
    ck_assert_int_eq(qi_event_wait(b, cev, &e), QI_OK);                   /* main after copy: on the GPU */
    ck_assert_int_eq(qi_event_wait_on(b, QI_STREAM_COPY, mev, &e), QI_OK); /* copy after main: on the GPU */
    ck_assert_int_eq(qi_event_wait_on(b, QI_STREAM_COPY, cev, &e), QI_OK); /* its own stream: order */
    ck_assert_int_eq(qi_event_wait_on(b, QI_STREAM_COPY, hev, &e), QI_OK); /* the CPU's: the host */
    ck_assert_int_eq(F.waits_on[0], w0 + 1);
    ck_assert_int_eq(F.waits_on[1], w1 + 1);
    ck_assert_int_eq(qi_dev_download(b, back, qi_view_of(bx, 0), sizeof back, &e), QI_OK);
    const long s0 = F.stream_syncs;
    ck_assert_int_eq(qi_dev_synchronize(b, &e), QI_OK);
    ck_assert_int_eq(F.stream_syncs, s0 + 2); /* both streams */
    ck_assert(memcmp(back, x, sizeof x) == 0);
    qi_event_free(cev);
    qi_event_free(mev);
    qi_event_free(hev);
    /* failures there */
    fail_next("memcpy_async", 1, 700);
    ck_assert_int_eq(qi_dev_upload_on(b, QI_STREAM_COPY, qi_view_of(bx, 0), x, 16, &e), QI_OK);
    ck_assert_int_eq(qi_dev_synchronize(b, &e), QI_ERR_BACKEND);
    ck_assert_msg(strstr(e.msg, "16 bytes, copy stream) failed: fake failure"), "%s", e.msg);
    qi_err_clear(&e);
    ck_assert_int_eq(qi_event_record_on(b, QI_STREAM_COPY, &cev, &e), QI_OK);
    fail_next("stream_wait", 1, 700);
    ck_assert_int_eq(qi_event_wait(b, cev, &e), QI_OK);
    ck_assert_int_eq(qi_dev_synchronize(b, &e), QI_ERR_BACKEND);
    ck_assert_msg(strstr(e.msg, "cudaStreamWaitEvent(the main stream) failed"), "%s", e.msg);
    qi_err_clear(&e);
    fail_next("stream_sync", 2, 700); /* the copy stream's, after the main one's */
    ck_assert_int_eq(qi_dev_synchronize(b, &e), QI_ERR_BACKEND);
    ck_assert_msg(strstr(e.msg, "cudaStreamSynchronize (the copy stream) failed"), "%s", e.msg);
    qi_event_free(cev);
    qi_buf_free(bx);
    qi_backend_free(b);
    /* made without its copy stream: the failing call named */
    fail_next("stream_create", 2, 3);
    qi_backend *bad = NULL;
    qi_err_clear(&e);
    ck_assert_int_eq(qi_backend_cuda_create(0, 0, &bad, &e), QI_ERR_BACKEND);
    ck_assert_ptr_null(bad);
    ck_assert_msg(strstr(e.msg, "cudaStreamCreate (the copy stream) failed"), "%s", e.msg);
}
END_TEST

/* Event times are the device clock's (a millisecond per command here),
 * also after the anchor moves (beyond 100 ms from it). */
START_TEST(test_event_times) {
    qi_backend *b = make(0);
    qi_err e = {0};
    float x[16] = {0};
    qi_buf *bx;
    float *dx = dev_put(b, &bx, x, sizeof x);
    for (int round = 0; round < 3; round++) {
        qi_event *a, *c;
        ck_assert_int_eq(qi_event_record(b, &a, &e), QI_OK);
        for (int i = 0; i < 150; i++) b->iface->scale(b, dx, 16, 1.0f);
        ck_assert_int_eq(qi_event_record(b, &c, &e), QI_OK);
        qi_event_sync(c);
        qi_event_sync(a);
        ck_assert_double_eq_tol(qi_event_elapsed(a, c), 0.150, 1e-6);
        qi_event_free(a);
        qi_event_free(c);
    }
    /* an event freed unsynced lets its CUDA event go to the pool */
    qi_event *u;
    ck_assert_int_eq(qi_event_record(b, &u, &e), QI_OK);
    qi_event_free(u);
    /* a failed record completes the event at once; the failure surfaces */
    fail_next("event_record", 1, 700);
    ck_assert_int_eq(qi_event_record(b, &u, &e), QI_OK);
    qi_event_sync(u);
    qi_event_free(u);
    ck_assert_int_eq(qi_dev_synchronize(b, &e), QI_ERR_BACKEND);
    ck_assert_msg(strstr(e.msg, "cudaEventRecord failed"), "%s", e.msg);
    qi_buf_free(bx);
    qi_backend_free(b);
}
END_TEST

/* ---- the engine on cpu,cuda -------------------------------------------------------- */

static char g_model_path[256];

static qi_model *synth_model(void) {
    snprintf(g_model_path, sizeof g_model_path, "%s/qi_cuda_host_%d.gguf", P_tmpdir, (int)getpid());
    char cmd[640];
    snprintf(cmd, sizeof cmd,
             "%s/qinfer synth -o %s --type q4_0 --n-embd 128 --n-ff 256 --n-layer 4 --n-head 4 --n-head-kv 2 "
             "--n-vocab 300 --n-ctx 512 >/dev/null",
             QI_BINARY_DIR, g_model_path);
    ck_assert_msg(system(cmd) == 0, "%s", cmd);
    qi_model *m = NULL;
    qi_err e = {0};
    ck_assert_msg(qi_model_load(g_model_path, &m, &e) == QI_OK, "%s", e.msg);
    return m;
}

/* Greedy logits of two sequences over 6 steps under a plan. */
static void run_plan(const qi_model *m, const char *devices, const char *placement, float *out) {
    qi_engine_opts o;
    qi_engine_opts_default(&o);
    o.n_threads = 1;
    o.n_ctx = 256;
    o.max_seqs = 2;
    o.devices = devices;
    o.placement = placement;
    qi_engine *eng = NULL;
    qi_err e = {0};
    ck_assert_msg(qi_engine_create(m, &o, &eng, &e) == QI_OK, "%s %s: %s", devices, placement, e.msg);
    const int V = m->hp.n_vocab;
    int ids[2];
    for (int s = 0; s < 2; s++) {
        int32_t prompt[80];
        const int n = s ? 75 : 9; /* across a 64-token KV block */
        uint64_t st = 40 + (uint64_t)s;
        for (int i = 0; i < n; i++) prompt[i] = (int32_t)(qi_test_rand(&st) % 256);
        ck_assert_int_eq(qi_engine_seq_add(eng, &ids[s], &e), QI_OK);
        ck_assert_int_eq(qi_engine_seq_feed(eng, ids[s], prompt, n, false, &e), QI_OK);
    }
    for (int step = 0; step < 6; step++) {
        int n = 0;
        ck_assert_msg(qi_engine_step(eng, &n, &e) == QI_OK, "%s %s: %s", devices, placement, e.msg);
        for (int s = 0; s < 2; s++) {
            const float *lg = qi_engine_seq_logits(eng, ids[s], -1);
            memcpy(out + ((size_t)step * 2 + s) * V, lg, sizeof(float) * (size_t)V);
            int32_t t = 0;
            for (int v = 1; v < V; v++) t = lg[v] > lg[t] ? v : t;
            ck_assert_int_eq(qi_engine_seq_feed(eng, ids[s], &t, 1, false, &e), QI_OK);
        }
    }
    qi_engine_free(eng);
}

/* A plan file for devices cpu and DEV: split attention (half the KV on
 * each device) both ways, the MLP on DEV, the embedding and head on DEV. */
static void split_plan(const char *path, const char *dev) {
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fprintf(f, "embd %s\nhead %s\ncpu %s 0.5 %s\n%s %s 0.5 cpu\ncpu cpu 0.5 %s\n%s %s\n", dev, dev, dev, dev, dev,
            dev, dev, dev, dev);
    fclose(f);
}

START_TEST(test_engine_plans) {
    qi_model *m = synth_model();
    const int V = m->hp.n_vocab;
    const size_t n = (size_t)6 * 2 * V;
    float *ref = malloc(sizeof(float) * n), *got = malloc(sizeof(float) * n);
    /* whole layers on the GPU: the all-CPU logits */
    run_plan(m, "cpu", "all-cpu", ref);
    const char *ngl[] = {"ngl=5", "ngl=2"};
    for (int i = 0; i < 2; i++) {
        run_plan(m, "cpu,cuda", ngl[i], got);
        ck_assert_msg(memcmp(ref, got, sizeof(float) * n) == 0, "%s differs from all-cpu", ngl[i]);
    }
    /* split attention merges partial results in a different order from
     * one attention (engine/backend/backend.h), so it is held to testdev
     * running the same plan, which does the CPU's arithmetic too */
    char split[300];
    snprintf(split, sizeof split, "%s.plan", g_model_path);
    split_plan(split, "testdev");
    run_plan(m, "cpu,testdev", split, ref);
    split_plan(split, "cuda");
    run_plan(m, "cpu,cuda", split, got);
    ck_assert_msg(memcmp(ref, got, sizeof(float) * n) == 0, "split plan differs from testdev's");
    /* a cap the plan does not fit in is refused, naming the device */
    qi_engine_opts o;
    qi_engine_opts_default(&o);
    o.devices = "cpu,cuda:64K";
    o.placement = "ngl=5";
    qi_engine *eng = NULL;
    qi_err e = {0};
    ck_assert_int_ne(qi_engine_create(m, &o, &eng, &e), QI_OK);
    ck_assert_msg(strstr(e.msg, "cuda"), "%s", e.msg);
    ck_assert_int_eq(F.bad_pointers, 0);
    remove(split);
    remove(g_model_path);
    free(ref);
    free(got);
    qi_model_free(m);
}
END_TEST

static Suite *cuda_host_suite(void) {
    Suite *s = suite_create("cuda_host");
    TCase *tc = tcase_create("host");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_identity);
    tcase_add_test(tc, test_matmul_get_rows);
    tcase_add_test(tc, test_small_ops);
    tcase_add_test(tc, test_attention);
    tcase_add_test(tc, test_staging_ring);
    tcase_add_test(tc, test_failures);
    tcase_add_test(tc, test_event_times);
    tcase_add_test(tc, test_copy_stream);
    tcase_add_test(tc, test_engine_plans);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return qi_test_run_suite(cuda_host_suite()); }

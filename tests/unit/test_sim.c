/* test_sim.c - the simulated devices (engine/backend/sim/backend_sim.c).
 *
 * The "sim" case holds the devices to their cost model and timeline
 * through the wrappers the engine calls (qi_backend_*, qi_dev_*): an op's
 * time is max(FLOPs / (peak x eff), bytes / (bw x eff)) + its overhead,
 * exactly; a GPU op overlaps the host's work that follows it and a
 * synchronise or an event joins them; copies take the link's latency and
 * bandwidth in their direction; the GPU's copy stream keeps a clock of its
 * own; memory is counted against the profile's
 * capacity; noise is seeded; a shapes-only GGUF round-trips. The "engine"
 * case (label model) runs SmolLM2 on a simulated machine: nothing is
 * computed, times are deterministic, a memory-bound op class scales with
 * its efficiency, streamed layers' uploads overlap the compute, and a plan
 * that does not fit the simulated GPU is refused. Calibration (qinfer/calibrate.h): the calibration file reader
 * (strict, FILE:LINE: KEY: why) and the fit, which must give back known
 * parameters from the times they produce, on synthetic ops ("sim") and on
 * SmolLM2's simulated steps ("engine").
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "qinfer/calibrate.h"
#include "qinfer/engine.h"
#include "qinfer/gguf.h"
#include "qinfer/model.h"
#include "qinfer/types.h"
#include "testutil.h"
#include "tokenizer_int.h"

/* A machine with round figures, so expected times are simple sums. */
static void test_profile(qi_hwprofile *p) {
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "round");
    snprintf(p->kind, sizeof p->kind, "server");
    p->has_gpu = true;
    snprintf(p->gpu_name, sizeof p->gpu_name, "round GPU");
#define SET(f, v) (p->f.value = (v), p->f.set = true)
    SET(gpu_count, 1);
    SET(gpu_fp16_tensor, 1e14);
    SET(gpu_int8_tensor, 2e14);
    SET(gpu_fp32, 1e13);
    SET(gpu_mem_bw, 1e12);
    SET(gpu_mem_bytes, 1 << 30);
    SET(gpu_launch, 1e-5);
    SET(link_h2d_bw, 1e10);
    SET(link_d2h_bw, 5e9);
    SET(link_latency, 2e-5);
    SET(cpu_sockets, 1);
    SET(cpu_cores, 8);
    SET(cpu_fp32, 1e11);
    SET(cpu_mem_bw, 1e10);
    SET(cpu_mem_bytes, 1u << 30);
#undef SET
}

typedef struct {
    qi_sim *sim;
    qi_backend *cpu, *gpu;
    qi_sim_params par;
} machine;

static void machine_open(machine *m, const qi_sim_params *par, size_t gpu_cap) {
    qi_hwprofile p;
    test_profile(&p);
    qi_err e = {0};
    if (par) m->par = *par;
    else qi_sim_params_default(&m->par);
    ck_assert_msg(qi_sim_create(&p, &m->par, &m->sim, &e) == QI_OK, "%s", e.msg);
    ck_assert_msg(qi_backend_sim_create(m->sim, false, 0, &m->cpu, &e) == QI_OK, "%s", e.msg);
    ck_assert_msg(qi_backend_sim_create(m->sim, true, gpu_cap, &m->gpu, &e) == QI_OK, "%s", e.msg);
}

static void machine_close(machine *m) {
    qi_backend_free(m->gpu);
    qi_backend_free(m->cpu);
    qi_sim_free(m->sim);
}

/* A q8_0 weight of n_rows x n_cols that the simulator never reads. */
static qi_weight weight(int n_rows, int n_cols) {
    static const uint8_t dummy[64];
    qi_weight w = {0};
    w.type = QI_TYPE_Q8_0;
    w.n_rows = n_rows;
    w.n_cols = n_cols;
    uint64_t rb = 0;
    ck_assert(qi_type_row_bytes(QI_TYPE_Q8_0, (uint64_t)n_cols, &rb));
    w.row_bytes = rb;
    w.data = dummy;
    return w;
}

static double maxd(double a, double b) { return a > b ? a : b; }

static qi_status mm(qi_backend *b, const qi_weight *w, const float *x, int T, float *y, qi_err *e) {
    const qi_weight *ws[1] = {w};
    float *ys[1] = {y};
    return qi_backend_matmul_n(b, ws, ys, 1, x, T, e);
}

START_TEST(test_params) {
    qi_sim_params p;
    qi_sim_params_default(&p);
    for (int d = 0; d < 2; d++)
        for (int k = 0; k < QI_SIM_OP_CLASSES; k++) {
            ck_assert(p.compute[d][k] > 0 && p.compute[d][k] <= 1);
            ck_assert(p.memory[d][k] > 0 && p.memory[d][k] <= 1);
        }
    qi_err e = {0};
    ck_assert_int_eq(qi_sim_params_set(&p, "gpu_attention_memory", 0.5, &e), QI_OK);
    ck_assert(p.memory[1][1] == 0.5);
    ck_assert_int_eq(qi_sim_params_set(&p, "cpu_matmul_compute", 0.25, &e), QI_OK);
    ck_assert(p.compute[0][0] == 0.25);
    ck_assert_int_eq(qi_sim_params_set(&p, "noise", 0.1, &e), QI_OK);
    ck_assert_int_eq(qi_sim_params_set(&p, "gpu_matmul_speed", 0.5, &e), QI_ERR_INVALID);
    ck_assert_msg(strstr(e.msg, "gpu_matmul_speed"), "%s", e.msg);
    qi_err_clear(&e);
    /* above 1 (caches faster than the profile's bandwidth) up to QI_SIM_EFF_MAX; the link's at most 1 */
    ck_assert_int_eq(qi_sim_params_set(&p, "gpu_matmul_memory", 1.5, &e), QI_OK);
    ck_assert_int_eq(qi_sim_params_set(&p, "cpu_other_compute", QI_SIM_EFF_MAX, &e), QI_OK);
    ck_assert_int_eq(qi_sim_params_set(&p, "gpu_matmul_memory", QI_SIM_EFF_MAX + 0.5, &e), QI_ERR_INVALID);
    ck_assert_int_eq(qi_sim_params_set(&p, "link", 1.5, &e), QI_ERR_INVALID);
    ck_assert_int_eq(qi_sim_params_set(&p, "link", 0, &e), QI_ERR_INVALID);
    ck_assert_int_eq(qi_sim_params_set(&p, "noise", -1, &e), QI_ERR_INVALID);
    ck_assert_int_eq(qi_sim_params_set(&p, "noise", NAN, &e), QI_ERR_INVALID);
    /* a weight type's own CPU matmul compute efficiency */
    qi_err_clear(&e);
    ck_assert_int_eq(qi_sim_params_set(&p, "cpu_matmul_compute_q4_k", 0.3, &e), QI_OK);
    ck_assert(p.cpu_matmul_type[QI_TYPE_Q4_K] == 0.3 && p.cpu_matmul_type[QI_TYPE_Q8_0] == 0);
    ck_assert_int_eq(qi_sim_params_set(&p, "cpu_matmul_compute_q9_9", 0.3, &e), QI_ERR_INVALID);
    ck_assert_int_eq(qi_sim_params_set(&p, "cpu_matmul_compute_q4_k", 17, &e), QI_ERR_INVALID);
    ck_assert_str_eq(qi_sim_op_class_name(0), "matmul");
    ck_assert_str_eq(qi_sim_op_class_name(3), "copy");
}
END_TEST

/* An op's time is the cost model's, on the clock of the device it ran on. */
START_TEST(test_op_time) {
    machine M;
    machine_open(&M, NULL, 0);
    const qi_sim_params *p = &M.par;
    qi_err e = {0};
    static float x[4096], y[4096];
    const qi_weight w = weight(1024, 1024);
    const double wb = (double)w.row_bytes * w.n_rows;
    /* CPU, one token: memory-bound at 1e10 B/s x the matmul memory efficiency */
    double t0 = qi_sim_now(M.sim);
    ck_assert_int_eq(mm(M.cpu, &w, x, 1, y, &e), QI_OK);
    double f = 2.0 * 1024 * 1024, by = wb + 4.0 * (1024 + 1024);
    double want = maxd(f / (1e11 * p->compute[0][0]), by / (1e10 * p->memory[0][0])) + p->cpu_op_s;
    ck_assert_double_eq_tol(qi_sim_now(M.sim) - t0, want, want * 1e-12);
    /* GPU, 64 tokens: the tensor-core rate; the host does not wait */
    t0 = qi_sim_now(M.sim);
    ck_assert_int_eq(mm(M.gpu, &w, x, 4, y, &e), QI_OK); /* 4 rows: the CUDA-core rate */
    ck_assert(qi_sim_now(M.sim) == t0);
    f = 2.0 * 4 * 1024 * 1024;
    by = wb + 4.0 * 4 * (1024 + 1024);
    const double g1 = maxd(f / (1e13 * p->compute[1][0]), by / (1e12 * p->memory[1][0])) + 1e-5;
    ck_assert_int_eq(qi_dev_synchronize(M.gpu, &e), QI_OK);
    ck_assert_double_eq_tol(qi_sim_now(M.sim) - t0, g1, g1 * 1e-12);
    ck_assert_double_eq_tol(qi_sim_busy(M.gpu, 0), g1, g1 * 1e-12);
    /* a weight type with its own compute efficiency: its FLOPs at that */
    machine T;
    qi_sim_params tp = M.par;
    ck_assert_int_eq(qi_sim_params_set(&tp, "cpu_matmul_compute_q8_0", 0.125, &e), QI_OK);
    machine_open(&T, &tp, 0);
    t0 = qi_sim_now(T.sim);
    ck_assert_int_eq(mm(T.cpu, &w, x, 64, y, &e), QI_OK);
    f = 2.0 * 64 * 1024 * 1024;
    by = wb + 4.0 * 64 * (1024 + 1024);
    want = maxd(f / (1e11 * 0.125), by / (1e10 * p->memory[0][0])) + p->cpu_op_s;
    ck_assert_double_eq_tol(qi_sim_now(T.sim) - t0, want, want * 1e-12);
    machine_close(&T);
    /* an elementwise op: bytes over bandwidth */
    t0 = qi_sim_now(M.sim);
    ck_assert_int_eq(qi_backend_add(M.cpu, x, y, 4096, &e), QI_OK);
    want = maxd(4096.0 / (1e11 * p->compute[0][2]), 12.0 * 4096 / (1e10 * p->memory[0][2])) + p->cpu_op_s;
    ck_assert_double_eq_tol(qi_sim_now(M.sim) - t0, want, want * 1e-12);
    machine_close(&M);
}
END_TEST

/* The timeline: a GPU op runs while the host goes on; a synchronise, an
 * event the host waits for, or a stream waiting for an event joins them. */
START_TEST(test_overlap) {
    machine M;
    machine_open(&M, NULL, 0);
    qi_err e = {0};
    static float x[8192], y[8192];
    const qi_weight big = weight(4096, 4096);
    ck_assert_int_eq(mm(M.gpu, &big, x, 1, y, &e), QI_OK);
    const double g = qi_sim_busy(M.gpu, 0);
    ck_assert(g > 0);
    ck_assert(qi_sim_now(M.sim) == 0); /* issued, not waited for */
    qi_event *ev = NULL;
    ck_assert_int_eq(qi_event_record(M.gpu, &ev, &e), QI_OK);
    /* the host's own work meanwhile */
    ck_assert_int_eq(qi_backend_add(M.cpu, x, y, 8192, &e), QI_OK);
    const double c = qi_sim_now(M.sim);
    ck_assert(c > 0 && c < g);
    /* the CPU's stream waits for the GPU's event: the host is at g */
    ck_assert_int_eq(qi_event_wait(M.cpu, ev, &e), QI_OK);
    ck_assert_double_eq_tol(qi_sim_now(M.sim), g, g * 1e-12);
    qi_event *ev2 = NULL;
    ck_assert_int_eq(qi_event_record(M.cpu, &ev2, &e), QI_OK);
    qi_event_sync(ev2);
    ck_assert_double_eq_tol(qi_event_elapsed(ev, ev2), 0, 1e-15);
    /* a GPU op issued now starts at the host's time, after the first */
    ck_assert_int_eq(mm(M.gpu, &big, x, 1, y, &e), QI_OK);
    qi_event *ev3 = NULL;
    ck_assert_int_eq(qi_event_record(M.gpu, &ev3, &e), QI_OK);
    ck_assert_double_eq_tol(qi_event_elapsed(ev, ev3), g, g * 1e-12);
    /* the host waiting for that event moves the host clock up */
    qi_event_sync(ev3);
    ck_assert_double_eq_tol(qi_sim_now(M.sim), 2 * g, g * 1e-12);
    /* freeing an event the host did not wait for moves nothing */
    ck_assert_int_eq(mm(M.gpu, &big, x, 1, y, &e), QI_OK);
    qi_event *ev4 = NULL;
    ck_assert_int_eq(qi_event_record(M.gpu, &ev4, &e), QI_OK);
    qi_event_free(ev4);
    ck_assert_double_eq_tol(qi_sim_now(M.sim), 2 * g, g * 1e-12);
    ck_assert_int_eq(qi_dev_synchronize(M.gpu, &e), QI_OK);
    ck_assert_double_eq_tol(qi_sim_now(M.sim), 3 * g, g * 1e-12);
    qi_event_free(ev);
    qi_event_free(ev2);
    qi_event_free(ev3);
    machine_close(&M);
}
END_TEST

/* Copies: the link's latency and bandwidth in their direction; nothing
 * computed comes back (zeros); a strided upload pays one latency. */
START_TEST(test_copies) {
    machine M;
    machine_open(&M, NULL, 0);
    qi_err e = {0};
    const size_t n = 1 << 20;
    qi_buf *gb = NULL, *hb = NULL;
    ck_assert_int_eq(qi_buf_alloc(M.gpu, n, "g", &gb, &e), QI_OK);
    ck_assert_int_eq(qi_buf_alloc(M.cpu, n, "h", &hb, &e), QI_OK);
    unsigned char *h = qi_buf_ptr(M.cpu, qi_view_of(hb, 0), n, &e);
    ck_assert_ptr_nonnull(h);
    memset(h, 0x5a, n);
    ck_assert_int_eq(qi_dev_copy(M.gpu, qi_view_of(gb, 0), qi_view_of(hb, 0), n, &e), QI_OK);
    ck_assert_int_eq(qi_dev_synchronize(M.gpu, &e), QI_OK);
    const double up = 2e-5 + (double)n / (1e10 * M.par.link);
    ck_assert_double_eq_tol(qi_sim_now(M.sim), up, up * 1e-12);
    ck_assert_int_eq(qi_dev_copy(M.gpu, qi_view_of(hb, 0), qi_view_of(gb, 0), n, &e), QI_OK);
    ck_assert_int_eq(qi_dev_synchronize(M.gpu, &e), QI_OK);
    const double down = 2e-5 + (double)n / (5e9 * M.par.link);
    ck_assert_double_eq_tol(qi_sim_now(M.sim), up + down, (up + down) * 1e-12);
    for (size_t i = 0; i < n; i += 4097) ck_assert_uint_eq(h[i], 0);
    ck_assert_double_eq_tol(qi_sim_busy(M.gpu, QI_SIM_OP_CLASSES), up + down, (up + down) * 1e-12);
    /* a strided upload of 256 rows of 32 bytes is one copy: one latency, not 256 */
    ck_assert_int_eq(qi_dev_upload_2d(M.gpu, qi_view_of(gb, 0), 4096, h, 64, 32, 256, &e), QI_OK);
    ck_assert_int_eq(qi_dev_synchronize(M.gpu, &e), QI_OK);
    const double strided = 2e-5 + 32.0 * 256 / (1e10 * M.par.link);
    ck_assert_double_eq_tol(qi_sim_now(M.sim), up + down + strided, (up + down + strided) * 1e-12);
    /* extra rows (a fetch's, scored on the host) are the host's devices' alone */
    {
        const int one[1] = {1};
        const int32_t p0[1] = {0};
        const int32_t *pp[1] = {p0};
        const uint16_t row[4] = {0}, *rows[1] = {row}, *const *rt[1] = {rows};
        float q[4] = {0}, o[4];
        const qi_attn_paged_args xa = {.T = 1, .H = 1, .Hkv = 1, .D = 4, .q = q, .out = o, .q_pos = p0,
                                       .n_slots = one, .pos = pp, .k_blk = rt, .v_blk = rt, .x_n = one,
                                       .x_pos = pp, .x_k = rt, .x_v = rt};
        ck_assert_int_eq(qi_backend_attention(M.gpu, &xa, 1, &e), QI_ERR_INVALID);
        ck_assert_msg(strstr(e.msg, "extra rows (fetched tokens) on a device other than the host's"), "%s", e.msg);
        qi_err_clear(&e);
    }
    /* a GPU buffer is not the host's: a view of it given to the CPU is refused */
    ck_assert_ptr_null(qi_buf_ptr(M.cpu, qi_view_of(gb, 0), 8, &e));
    qi_buf_free(gb);
    qi_buf_free(hb);
    machine_close(&M);
}
END_TEST

/* The GPU's copy stream (sim_stream.c): an upload there runs beside the
 * main stream's op on a clock of its own, the main stream waits for it
 * only through an event, and a synchronise waits for both; the CPU's copy
 * stream is its one stream. */
START_TEST(test_copy_stream) {
    machine M;
    machine_open(&M, NULL, 0);
    qi_err e = {0};
    static float x[8192], y[8192];
    const size_t n = 1 << 12;
    qi_buf *gb = NULL;
    ck_assert_int_eq(qi_buf_alloc(M.gpu, n, "g", &gb, &e), QI_OK);
    static unsigned char h[1 << 20];
    ck_assert(qi_dev_has_copy_stream(M.gpu));
    const qi_weight big = weight(4096, 4096);
    ck_assert_int_eq(mm(M.gpu, &big, x, 1, y, &e), QI_OK);
    const double g = qi_sim_busy(M.gpu, 0);
    const double up = 2e-5 + (double)n / (1e10 * M.par.link);
    ck_assert(up < g);
    /* beside the op: both start at 0 */
    ck_assert_int_eq(qi_dev_upload_on(M.gpu, QI_STREAM_COPY, qi_view_of(gb, 0), h, n, &e), QI_OK);
    qi_event *cev = NULL, *mev = NULL;
    ck_assert_int_eq(qi_event_record_on(M.gpu, QI_STREAM_COPY, &cev, &e), QI_OK);
    ck_assert_double_eq_tol(qi_event_time(cev), up, up * 1e-12);
    ck_assert_int_eq(qi_event_record(M.gpu, &mev, &e), QI_OK);
    ck_assert_double_eq_tol(qi_event_time(mev), g, g * 1e-12);
    /* a second upload after the op's event: from g on */
    ck_assert_int_eq(qi_event_wait_on(M.gpu, QI_STREAM_COPY, mev, &e), QI_OK);
    ck_assert_int_eq(qi_dev_upload_on(M.gpu, QI_STREAM_COPY, qi_view_of(gb, 0), h, n, &e), QI_OK);
    qi_event *cev2 = NULL;
    ck_assert_int_eq(qi_event_record_on(M.gpu, QI_STREAM_COPY, &cev2, &e), QI_OK);
    ck_assert_double_eq_tol(qi_event_time(cev2), g + up, (g + up) * 1e-12);
    /* the main stream waits for it: an op then starts at g + up */
    ck_assert_int_eq(qi_event_wait(M.gpu, cev2, &e), QI_OK);
    ck_assert_int_eq(mm(M.gpu, &big, x, 1, y, &e), QI_OK);
    qi_event *mev2 = NULL;
    ck_assert_int_eq(qi_event_record(M.gpu, &mev2, &e), QI_OK);
    ck_assert_double_eq_tol(qi_event_time(mev2), 2 * g + up, (2 * g + up) * 1e-12);
    /* copies count as the device's copies, on whichever stream */
    ck_assert_double_eq_tol(qi_sim_busy(M.gpu, QI_SIM_OP_CLASSES), 2 * up, up * 1e-12);
    /* a synchronise waits for the copy stream too */
    ck_assert_int_eq(qi_dev_upload_on(M.gpu, QI_STREAM_COPY, qi_view_of(gb, 0), h, n, &e), QI_OK);
    ck_assert_int_eq(qi_dev_upload_on(M.gpu, QI_STREAM_COPY, qi_view_of(gb, 0), h, n, &e), QI_OK);
    ck_assert_int_eq(qi_dev_synchronize(M.gpu, &e), QI_OK);
    const double end = fmax(2 * g + up, g + 3 * up); /* the main stream's end, the copy stream's */
    ck_assert_double_eq_tol(qi_sim_now(M.sim), end, end * 1e-12);
    /* after it, an upload starts at the host's time */
    ck_assert_int_eq(qi_dev_upload_on(M.gpu, QI_STREAM_COPY, qi_view_of(gb, 0), h, n, &e), QI_OK);
    ck_assert_int_eq(qi_dev_synchronize(M.gpu, &e), QI_OK);
    ck_assert_double_eq_tol(qi_sim_now(M.sim), end + up, (end + up) * 1e-12);
    /* the CPU's copy stream is its host clock */
    const double t = qi_sim_now(M.sim);
    qi_buf *hb = NULL;
    ck_assert_int_eq(qi_buf_alloc(M.cpu, n, "h", &hb, &e), QI_OK);
    ck_assert_int_eq(qi_dev_upload_on(M.cpu, QI_STREAM_COPY, qi_view_of(hb, 0), h, n, &e), QI_OK);
    ck_assert(qi_sim_now(M.sim) > t);
    qi_event *ev[] = {cev, mev, cev2, mev2};
    for (int i = 0; i < 4; i++) qi_event_free(ev[i]);
    qi_buf_free(gb);
    qi_buf_free(hb);
    machine_close(&M);
}
END_TEST

/* Memory is counted against the profile's capacity (or a smaller cap), and
 * freed ranges are reused. */
START_TEST(test_capacity) {
    machine M;
    machine_open(&M, NULL, 64u << 20);
    ck_assert_uint_eq(qi_dev_info_get(M.gpu)->capacity, 64u << 20);
    ck_assert_uint_eq(qi_dev_info_get(M.cpu)->capacity, 1u << 30);
    ck_assert(qi_dev_info_get(M.cpu)->host_visible && !qi_dev_info_get(M.gpu)->host_visible);
    qi_err e = {0};
    qi_buf *a = NULL, *b = NULL, *c = NULL;
    ck_assert_int_eq(qi_buf_alloc(M.gpu, 40u << 20, "a", &a, &e), QI_OK);
    ck_assert_int_eq(qi_buf_alloc(M.gpu, 40u << 20, "b", &b, &e), QI_ERR_NOMEM);
    ck_assert_msg(strstr(e.msg, "gpu") && strstr(e.msg, "do not fit"), "%s", e.msg);
    qi_buf_free(a);
    ck_assert_uint_eq(qi_dev_info_get(M.gpu)->in_use, 0);
    /* 1000 rounds of the same size from one range: reuse, not growth */
    for (int i = 0; i < 1000; i++) {
        ck_assert_int_eq(qi_buf_alloc(M.gpu, 60u << 20, "c", &c, &e), QI_OK);
        qi_buf_free(c);
    }
    /* many small buffers live at once, freed in another order */
    enum { N = 5000 };
    static qi_buf *bs[N];
    for (int i = 0; i < N; i++) ck_assert_int_eq(qi_buf_alloc(M.gpu, 4096 + 64 * (i % 3), "k", &bs[i], &e), QI_OK);
    for (int i = 0; i < N; i += 2) qi_buf_free(bs[i]);
    for (int i = 1; i < N; i += 2) qi_buf_free(bs[i]);
    ck_assert_uint_eq(qi_dev_info_get(M.gpu)->in_use, 0);
    machine_close(&M);
    /* a cpu-only profile has no GPU */
    qi_hwprofile p;
    test_profile(&p);
    p.has_gpu = false;
    snprintf(p.kind, sizeof p.kind, "cpu-only");
    qi_sim *s = NULL;
    ck_assert_int_eq(qi_sim_create(&p, NULL, &s, &e), QI_OK);
    qi_backend *g = NULL;
    qi_err_clear(&e);
    ck_assert_int_eq(qi_backend_sim_create(s, true, 0, &g, &e), QI_ERR_INVALID);
    ck_assert_msg(strstr(e.msg, "no GPU"), "%s", e.msg);
    qi_sim_free(s);
}
END_TEST

/* Noise: a log-normal factor of the sigma asked, the same for the same
 * seed. */
START_TEST(test_noise) {
    qi_sim_params par;
    qi_sim_params_default(&par);
    par.noise = 0.1;
    par.seed = 3;
    machine A, B, C;
    machine_open(&A, &par, 0);
    machine_open(&B, &par, 0);
    par.seed = 4;
    machine_open(&C, &par, 0);
    qi_err e = {0};
    static float x[1024];
    const int n = 4000;
    double base = 12.0 * 1024 / (1e10 * A.par.memory[0][2]) + A.par.cpu_op_s, s1 = 0, s2 = 0;
    bool differ = false;
    for (int i = 0; i < n; i++) {
        const double a0 = qi_sim_now(A.sim), b0 = qi_sim_now(B.sim), c0 = qi_sim_now(C.sim);
        ck_assert_int_eq(qi_backend_add(A.cpu, x, x, 1024, &e), QI_OK);
        ck_assert_int_eq(qi_backend_add(B.cpu, x, x, 1024, &e), QI_OK);
        ck_assert_int_eq(qi_backend_add(C.cpu, x, x, 1024, &e), QI_OK);
        const double da = qi_sim_now(A.sim) - a0, db = qi_sim_now(B.sim) - b0, dc = qi_sim_now(C.sim) - c0;
        ck_assert(da == db);
        differ |= da != dc;
        const double z = log(da / base);
        s1 += z;
        s2 += z * z;
    }
    ck_assert(differ);
    const double mean = s1 / n, sd = sqrt(s2 / n - mean * mean);
    ck_assert_msg(fabs(mean) < 0.01 && sd > 0.09 && sd < 0.11, "log-factor mean %g sd %g", mean, sd);
    machine_close(&A);
    machine_close(&B);
    machine_close(&C);
}
END_TEST

/* A shapes-only GGUF: the tensor infos without a data section; the reader
 * gives every tensor an address no one may read. */
START_TEST(test_shapes_only_gguf) {
    qi_gguf_writer *w = qi_gguf_writer_create();
    const uint64_t ne[2] = {4096, 4096};
    uint64_t rb = 0;
    ck_assert(qi_type_row_bytes(QI_TYPE_Q4_0, 4096, &rb));
    ck_assert_int_eq(qi_gguf_writer_add_tensor_shape(w, "a", QI_TYPE_Q4_0, 2, ne, rb * 4096), QI_OK);
    ck_assert_int_eq(qi_gguf_writer_add_tensor_shape(w, "b", QI_TYPE_Q4_0, 2, ne, rb * 4096), QI_OK);
    void *buf = NULL;
    size_t len = 0;
    qi_err e = {0};
    /* without the key that says so, no file */
    ck_assert_int_eq(qi_gguf_writer_to_memory(w, 3, &buf, &len, &e), QI_ERR_INVALID);
    ck_assert_msg(strstr(e.msg, "qinfer.shapes_only"), "%s", e.msg);
    ck_assert_int_eq(qi_gguf_writer_set_bool(w, "qinfer.shapes_only", true), QI_OK);
    ck_assert_int_eq(qi_gguf_writer_to_memory(w, 3, &buf, &len, &e), QI_OK);
    ck_assert_uint_lt(len, 1024); /* 18 MiB of weights, none written */
    qi_gguf *g = NULL;
    ck_assert_msg(qi_gguf_open_memory(buf, len, "shapes", &g, &e) == QI_OK, "%s", e.msg);
    ck_assert(qi_gguf_shapes_only(g));
    const qi_gguf_tensor *a = qi_gguf_tensor_find(g, "a"), *b = qi_gguf_tensor_find(g, "b");
    ck_assert_ptr_nonnull(a);
    ck_assert_ptr_nonnull(b);
    ck_assert_ptr_nonnull(a->data);
    ck_assert_uint_eq(a->n_bytes, rb * 4096);
    ck_assert((const char *)b->data >= (const char *)a->data + a->n_bytes ||
              (const char *)a->data >= (const char *)b->data + b->n_bytes);
    qi_gguf_close(g);
    qi_free(buf);
    /* the key with data: refused too */
    qi_gguf_writer *w2 = qi_gguf_writer_create();
    static const uint8_t row[18];
    const uint64_t ne1[1] = {32};
    ck_assert_int_eq(qi_gguf_writer_add_tensor(w2, "c", QI_TYPE_Q4_0, 1, ne1, row, 18), QI_OK);
    ck_assert_int_eq(qi_gguf_writer_set_bool(w2, "qinfer.shapes_only", true), QI_OK);
    ck_assert_int_eq(qi_gguf_writer_to_memory(w2, 3, &buf, &len, &e), QI_ERR_INVALID);
    qi_gguf_writer_free(w2);
    /* a normal file does not say shapes-only */
    qi_gguf_writer_free(w);
}
END_TEST

/* ---- the engine on a simulated machine --------------------------------------------------- */

#define SMOL_FILE "models/SmolLM2-135M-Instruct.Q4_1.gguf"
static qi_model *g_model;
static char g_prof[256];

/* The round machine as a profile file, for the engine's opts.sim. */
static void write_profile(void) {
    snprintf(g_prof, sizeof g_prof, "/tmp/qinfer-test-sim-%d.profile", (int)getpid());
    FILE *f = fopen(g_prof, "w");
    if (!f) {
        perror(g_prof);
        exit(1);
    }
    fprintf(f, "name = round\nkind = server\ngpu.name = round GPU\nlink.name = round link\ncpu.name = round CPU\n"
               "gpu.count = 1 # source: test\ngpu.fp16_tensor = 100 TFLOP/s # source: test\n"
               "gpu.int8_tensor = 200 TOP/s # source: test\ngpu.fp32 = 10 TFLOP/s # source: test\n"
               "gpu.mem_bw = 1 TB/s # source: test\ngpu.mem = 1 GiB # source: test\ngpu.launch = 10 us # source: test\n"
               "link.h2d_bw = 10 GB/s # source: test\nlink.d2h_bw = 5 GB/s # source: test\n"
               "link.latency = 20 us # source: test\ncpu.sockets = 1 # source: test\ncpu.cores = 8 # source: test\n"
               "cpu.fp32 = 100 GFLOP/s # source: test\ncpu.mem_bw = 10 GB/s # source: test\n"
               "cpu.mem = 1 GiB # source: test\n");
    fclose(f);
}

typedef struct {
    double prefill_s, decode_s, matmul_s; /* matmul_s: the decode steps' */
    double dev1_span_s;                   /* the block spans on the plan's second device */
    bool zeros;
} sim_run;

/* One sequence: a 32-token prompt, then 8 decode steps, on the simulated
 * machine with the given placement and parameters. */
static void write_plan(const char *path, int L, const char *attn, const char *mlp);

static qi_status run_sim(const char *devices, const char *placement, const qi_params *par, sim_run *out, qi_err *e) {
    qi_engine_opts o;
    qi_engine_opts_default(&o);
    o.n_threads = 1;
    o.max_seqs = 1;
    o.n_ctx = 128;
    o.profile = true;
    o.sim = g_prof;
    o.sim_params = par;
    o.devices = devices;
    o.placement = placement;
    qi_engine *en = NULL;
    qi_status st = qi_engine_create(g_model, &o, &en, e);
    if (st) return st;
    ck_assert_str_eq(qi_engine_sim_profile(en), "round");
    int id;
    ck_assert_int_eq(qi_engine_seq_add(en, &id, e), QI_OK);
    int32_t toks[32];
    for (int i = 0; i < 32; i++) toks[i] = 100 + i;
    const double t0 = qi_engine_now(en);
    ck_assert_int_eq(qi_engine_seq_feed(en, id, toks, 32, false, e), QI_OK);
    while (qi_engine_seq_pending(en, id) > 0) ck_assert_int_eq(qi_engine_step(en, NULL, e), QI_OK);
    const double t1 = qi_engine_now(en);
    qi_engine_prof p0;
    qi_engine_profile(en, &p0);
    out->zeros = true;
    for (int s = 0; s < 8; s++) {
        const float *lg = qi_engine_seq_logits(en, id, -1);
        for (int v = 0; v < g_model->hp.n_vocab; v++) out->zeros &= lg[v] == 0.0f;
        const int32_t t = 7;
        ck_assert_int_eq(qi_engine_seq_feed(en, id, &t, 1, false, e), QI_OK);
        ck_assert_int_eq(qi_engine_step(en, NULL, e), QI_OK);
    }
    out->prefill_s = t1 - t0;
    out->decode_s = qi_engine_now(en) - t1;
    qi_engine_prof pr;
    qi_engine_profile(en, &pr);
    out->matmul_s = pr.seconds[QI_OP_MATMUL] - p0.seconds[QI_OP_MATMUL]; /* decode's */
    /* the per-device event times add up to the totals: the event-timed
     * kinds' seconds, the copies', the block spans' */
    double ops = 0, copies = 0, spans = 0, blocks = 0;
    for (int d = 0; d < QI_PLAN_MAX_DEVICES; d++) {
        ops += pr.dev_op_seconds[d];
        copies += pr.dev_copy_seconds[d];
        spans += pr.dev_span_seconds[d];
    }
    const double kinds = pr.seconds[QI_OP_MATMUL] + pr.seconds[QI_OP_ATTENTION] + pr.seconds[QI_OP_KV];
    qi_engine_block_times bt;
    qi_engine_block_times_get(en, &bt);
    for (int b = 0; b < bt.n_blocks; b++) blocks += bt.block_s[b];
    ck_assert(kinds > 0 && spans > 0);
    ck_assert_msg(fabs(ops - kinds) <= 1e-9 * kinds, "device ops %g s, kinds %g s", ops, kinds);
    ck_assert_msg(fabs(copies - pr.copy_seconds) <= 1e-9 * (pr.copy_seconds + 1e-12), "device copies %g s, copies %g s",
                  copies, pr.copy_seconds);
    ck_assert_msg(fabs(spans - blocks) <= 1e-9 * blocks, "device spans %g s, blocks %g s", spans, blocks);
    out->dev1_span_s = pr.dev_span_seconds[1];
    qi_engine_free(en);
    return QI_OK;
}

START_TEST(test_engine_sim) {
    qi_err e = {0};
    sim_run a, b;
    /* all on the GPU, twice: nothing computed, the same times */
    ck_assert_msg(run_sim("cpu,gpu", "ngl=31", NULL, &a, &e) == QI_OK, "%s", e.msg);
    ck_assert_msg(run_sim("cpu,gpu", "ngl=31", NULL, &b, &e) == QI_OK, "%s", e.msg);
    ck_assert(a.dev1_span_s > 0); /* every layer's span is the GPU's */
    ck_assert(a.zeros);
    ck_assert(a.prefill_s > 0 && a.decode_s > 0);
    ck_assert(a.prefill_s == b.prefill_s && a.decode_s == b.decode_s);
    /* the CPU alone: decode reads every layer's and the head's weights once
     * a step at the CPU's bandwidth, which bounds its time from below, and
     * is slower than the GPU (whose small ops are mostly launch cost) */
    sim_run c;
    ck_assert_msg(run_sim("cpu", "all-cpu", NULL, &c, &e) == QI_OK, "%s", e.msg);
    qi_sim_params def;
    qi_sim_params_default(&def);
    double wb = 0;
    for (int k = 1; k < qi_plan_n_blocks(g_model->hp.n_layer); k++) wb += (double)qi_plan_block_bytes(g_model, k);
    const double floor_s = 8 * wb / (10e9 * def.memory[0][0]);
    ck_assert_msg(c.decode_s > floor_s && c.decode_s < 1.5 * floor_s, "cpu decode %g s, bandwidth floor %g s",
                  c.decode_s, floor_s);
    ck_assert_msg(c.decode_s > 2 * a.decode_s, "cpu %g s, gpu %g s", c.decode_s, a.decode_s);
    /* decode on the CPU is memory-bound: doubling the matmul memory
     * efficiency halves the matmul time but for the fixed cost per op */
    qi_params p;
    qi_params_init(&p);
    char v[32];
    snprintf(v, sizeof v, "%.17g", def.memory[0][0] / 2);
    ck_assert_int_eq(qi_params_set(&p, "cpu_matmul_memory", v, &e), QI_OK);
    sim_run d;
    ck_assert_msg(run_sim("cpu", "all-cpu", &p, &d, &e) == QI_OK, "%s", e.msg);
    ck_assert(d.matmul_s > 1.9 * c.matmul_s && d.matmul_s < 2.0 * c.matmul_s);
    /* every layer streamed (engine_stream.c): decode waits for the link,
     * each step's layers' bytes over it at least, but the copy stream runs
     * beside the compute, so the step is not the two one after the other
     * (measured: link 0.110 s, held 0.062 s, streamed 0.140 s; with the
     * copies on the compute stream's clock 0.172 s, their sum) */
    {
        const int L = g_model->hp.n_layer;
        char path[64];
        snprintf(path, sizeof path, "/tmp/qinfer-test-sim-stream-%d.plan", (int)getpid());
        write_plan(path, L, "gpu", "gpu");
        sim_run held, str;
        ck_assert_msg(run_sim("cpu,gpu", path, NULL, &held, &e) == QI_OK, "%s", e.msg);
        write_plan(path, L, "gpu~", "gpu~");
        ck_assert_msg(run_sim("cpu,gpu", path, NULL, &str, &e) == QI_OK, "%s", e.msg);
        unlink(path);
        /* one upload a weight: its bytes over the link and its latency */
        double lb = 0;
        int nw = 0;
        for (int k = 1; k < 2 * L + 1; k++) {
            const qi_weight *w[QI_PLAN_BLOCK_MAX_WEIGHTS];
            bool mmw[QI_PLAN_BLOCK_MAX_WEIGHTS];
            const int n = qi_plan_block_weights(g_model, k, w, mmw);
            for (int i = 0; i < n; i++) {
                if (!w[i]->data) continue;
                lb += (double)w[i]->row_bytes * (double)w[i]->n_rows;
                nw++;
            }
        }
        const double link_s = 8 * (lb / (10e9 * def.link) + nw * 20e-6);
        printf("sim decode, 8 steps: layers held %.6f s, streamed %.6f s; the link's time for them %.6f s\n",
               held.decode_s, str.decode_s, link_s);
        ck_assert_msg(str.decode_s > link_s, "streamed decode %g s, the link's floor %g s", str.decode_s, link_s);
        ck_assert_msg(str.decode_s < link_s + 0.75 * held.decode_s, "streamed decode %g s: link %g s + compute %g s",
                      str.decode_s, link_s, held.decode_s);
    }
    /* a plan that does not fit the simulated GPU's memory is refused */
    qi_engine_opts o;
    qi_engine_opts_default(&o);
    o.n_threads = 1;
    o.max_seqs = 1;
    o.n_ctx = 128;
    o.sim = g_prof;
    o.devices = "cpu,gpu:40M";
    o.placement = "ngl=31";
    qi_engine *en = NULL;
    ck_assert_int_eq(qi_engine_create(g_model, &o, &en, &e), QI_ERR_NOMEM);
    ck_assert_msg(strstr(e.msg, "gpu:40M"), "%s", e.msg);
    /* a simulated machine has no testdev; a real one no gpu */
    qi_err_clear(&e);
    o.devices = "cpu,testdev";
    o.placement = NULL;
    ck_assert_int_eq(qi_engine_create(g_model, &o, &en, &e), QI_ERR_INVALID);
    qi_err_clear(&e);
    o.sim = NULL;
    o.devices = "cpu,gpu";
    ck_assert_int_eq(qi_engine_create(g_model, &o, &en, &e), QI_ERR_INVALID);
    ck_assert_msg(strstr(e.msg, "--sim"), "%s", e.msg);
    /* a bad profile names the file */
    qi_err_clear(&e);
    o.sim = "/nonexistent/x.profile";
    o.devices = NULL;
    ck_assert_int_ne(qi_engine_create(g_model, &o, &en, &e), QI_OK);
    ck_assert_msg(strstr(e.msg, "/nonexistent/x.profile"), "%s", e.msg);
    /* and a bad simulator parameter names it */
    qi_err_clear(&e);
    o.sim = g_prof;
    qi_params_init(&p);
    ck_assert_int_eq(qi_params_set(&p, "gpu_matmul_memroy", "0.5", &e), QI_OK);
    o.sim_params = &p;
    ck_assert_int_eq(qi_engine_create(g_model, &o, &en, &e), QI_ERR_INVALID);
    ck_assert_msg(strstr(e.msg, "gpu_matmul_memroy"), "%s", e.msg);
}
END_TEST

/* ---- OPT and Falcon, shapes only ---------------------------------------------------- */

/* A shapes-only model of an architecture (the keys and tensors model.c
 * reads, as qinfer synth writes them), matrices of type t. */
static void *g_arch_buf[2];
static qi_model *arch_model(int slot, const char *arch, int E, int F, int L, int H, int Hkv, int V, int ctx,
                            uint32_t t) {
    qi_gguf_writer *w = qi_gguf_writer_create();
    const bool opt = !strcmp(arch, "opt");
    char key[96];
#define K(suffix) (snprintf(key, sizeof key, "%s.%s", arch, suffix), key)
    qi_gguf_writer_set_str(w, "general.architecture", arch);
    qi_gguf_writer_set_bool(w, "qinfer.shapes_only", true);
    qi_gguf_writer_set_u32(w, K("embedding_length"), (uint32_t)E);
    qi_gguf_writer_set_u32(w, K("block_count"), (uint32_t)L);
    qi_gguf_writer_set_u32(w, K("feed_forward_length"), (uint32_t)F);
    qi_gguf_writer_set_u32(w, K("attention.head_count"), (uint32_t)H);
    qi_gguf_writer_set_u32(w, K("attention.head_count_kv"), (uint32_t)Hkv);
    qi_gguf_writer_set_u32(w, K("context_length"), (uint32_t)ctx);
#undef K
    /* the vocabulary synth writes: the GPT-2 byte tokens, then control tokens */
    static char store[70000][16];
    static const char *toks[70000];
    static int32_t types[70000];
    ck_assert_int_le(V, 70000);
    for (int i = 0; i < V; i++) {
        if (i < 256) qi_tok_byte_char(i, store[i]);
        else snprintf(store[i], sizeof store[i], "<|s%d|>", i - 256);
        toks[i] = store[i];
        types[i] = i < 256 ? 1 : 3;
    }
    qi_gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2");
    qi_gguf_writer_set_str(w, "tokenizer.ggml.pre", "gpt-2");
    qi_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, (uint64_t)V);
    qi_gguf_writer_set_arr(w, "tokenizer.ggml.token_type", QI_GGUF_I32, types, (uint64_t)V);
    const char *no_merges[1] = {""};
    qi_gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", no_merges, 0);
    qi_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 256);
    qi_gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 256);
    const int D = E / H, kvw = Hkv * D;
    struct {
        char name[64];
        int64_t cols, rows;
    } ts[32];
    int n = 0;
#define T_(nm, c, r) (snprintf(ts[n].name, sizeof ts[n].name, "%s", nm), ts[n].cols = (c), ts[n++].rows = (r))
    T_("token_embd.weight", E, V);
    if (opt) T_("position_embd.weight", E, ctx);
    T_("output_norm.weight", E, 1);
    T_("output_norm.bias", E, 1);
    const int n_top = n;
    if (opt) {
        T_("attn_norm.weight", E, 1), T_("attn_norm.bias", E, 1), T_("attn_q.weight", E, E), T_("attn_q.bias", E, 1);
        T_("attn_k.weight", E, kvw), T_("attn_k.bias", kvw, 1), T_("attn_v.weight", E, kvw), T_("attn_v.bias", kvw, 1);
        T_("attn_output.weight", E, E), T_("attn_output.bias", E, 1), T_("ffn_norm.weight", E, 1);
        T_("ffn_norm.bias", E, 1), T_("ffn_up.weight", E, F), T_("ffn_up.bias", F, 1), T_("ffn_down.weight", F, E);
        T_("ffn_down.bias", E, 1);
    } else {
        T_("attn_norm.weight", E, 1), T_("attn_norm.bias", E, 1), T_("attn_norm_2.weight", E, 1);
        T_("attn_norm_2.bias", E, 1), T_("attn_qkv.weight", E, E + 2 * kvw), T_("attn_output.weight", E, E);
        T_("ffn_up.weight", E, F), T_("ffn_down.weight", F, E);
    }
#undef T_
    for (int l = -1; l < L; l++)
        for (int i = l < 0 ? 0 : n_top; i < (l < 0 ? n_top : n); i++) {
            char nm[96];
            if (l < 0) snprintf(nm, sizeof nm, "%s", ts[i].name);
            else snprintf(nm, sizeof nm, "blk.%d.%s", l, ts[i].name);
            const uint32_t ty = ts[i].rows == 1 ? QI_TYPE_F32 : t;
            uint64_t rb = 0;
            ck_assert(qi_type_row_bytes(ty, (uint64_t)ts[i].cols, &rb));
            const uint64_t ne[2] = {(uint64_t)ts[i].cols, (uint64_t)ts[i].rows};
            ck_assert_int_eq(qi_gguf_writer_add_tensor_shape(w, nm, ty, ts[i].rows > 1 ? 2 : 1, ne,
                                                             rb * (uint64_t)ts[i].rows), QI_OK);
        }
    size_t len = 0;
    qi_err e = {0};
    ck_assert_msg(qi_gguf_writer_to_memory(w, 3, &g_arch_buf[slot], &len, &e) == QI_OK, "%s", e.msg);
    qi_gguf_writer_free(w);
    qi_gguf *g = NULL;
    ck_assert_msg(qi_gguf_open_memory(g_arch_buf[slot], len, arch, &g, &e) == QI_OK, "%s", e.msg);
    qi_model *m = NULL;
    ck_assert_msg(qi_model_from_gguf(g, &m, &e) == QI_OK, "%s", e.msg);
    return m;
}

#define A100_PROFILE QI_SOURCE_DIR "/engine/backend/sim/profiles/a100-pcie-2xeon.profile"

typedef struct {
    double decode_s;               /* per decode step */
    double ops[QI_SIM_OP_CLASSES + 1]; /* the GPU's per decode step, by class (copies last) */
} arch_run;

/* A 32-token prompt, then 8 decode steps, on the A100 server. */
static void run_arch(const qi_model *m, const char *placement, arch_run *out) {
    qi_engine_opts o;
    qi_engine_opts_default(&o);
    o.n_threads = 1;
    o.max_seqs = 1;
    o.n_ctx = 128;
    o.sim = A100_PROFILE;
    o.devices = "cpu,gpu";
    o.placement = placement;
    qi_engine *en = NULL;
    qi_err e = {0};
    ck_assert_msg(qi_engine_create(m, &o, &en, &e) == QI_OK, "%s: %s", placement, e.msg);
    int id;
    ck_assert_int_eq(qi_engine_seq_add(en, &id, &e), QI_OK);
    int32_t toks[32];
    for (int i = 0; i < 32; i++) toks[i] = 100 + i;
    ck_assert_int_eq(qi_engine_seq_feed(en, id, toks, 32, false, &e), QI_OK);
    while (qi_engine_seq_pending(en, id) > 0) ck_assert_msg(qi_engine_step(en, NULL, &e) == QI_OK, "%s", e.msg);
    const qi_sim *sim = qi_engine_sim(en);
    long c0[QI_SIM_OP_CLASSES + 1];
    for (int k = 0; k <= QI_SIM_OP_CLASSES; k++) c0[k] = qi_sim_op_count(sim, true, k);
    const double t1 = qi_engine_now(en);
    for (int s = 0; s < 8; s++) {
        const int32_t t = 7;
        ck_assert_int_eq(qi_engine_seq_feed(en, id, &t, 1, false, &e), QI_OK);
        ck_assert_msg(qi_engine_step(en, NULL, &e) == QI_OK, "%s", e.msg);
    }
    out->decode_s = (qi_engine_now(en) - t1) / 8;
    for (int k = 0; k <= QI_SIM_OP_CLASSES; k++) out->ops[k] = (double)(qi_sim_op_count(sim, true, k) - c0[k]) / 8;
    qi_engine_free(en);
}

/* A plan file: every layer's attention on `attn`, its MLP on `mlp`. */
static void write_plan(const char *path, int L, const char *attn, const char *mlp) {
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    for (int l = 0; l < L; l++) fprintf(f, "%s %s\n", attn, mlp);
    fclose(f);
}

START_TEST(test_archs) {
    qi_model *opt = arch_model(0, "opt", 7168, 28672, 48, 56, 56, 50272, 2048, QI_TYPE_F16);
    qi_model *fal = arch_model(1, "falcon", 8192, 32768, 60, 128, 8, 65024, 2048, QI_TYPE_Q8_0);
    ck_assert_int_eq(opt->hp.arch, QI_ARCH_OPT);
    ck_assert_int_eq(fal->hp.arch, QI_ARCH_FALCON);
    ck_assert(opt->hp.layer_norm && fal->hp.layer_norm && fal->hp.parallel && !opt->hp.parallel);
    ck_assert_int_eq(opt->hp.n_rot, 0);
    ck_assert_int_eq(fal->hp.n_rot, 64);
    ck_assert_int_eq(fal->hp.n_head_kv, 8);
    ck_assert(opt->hp.tied_output && fal->hp.tied_output);
    ck_assert_int_eq(qi_model_n_matrices(opt), 6 * 48 + 1);
    /* Falcon's fused QKV as three matrices over its rows */
    ck_assert_int_eq(fal->layers[3].wk.n_rows, 8 * 64);
    ck_assert_ptr_eq((const char *)fal->layers[3].wv.data,
                     (const char *)fal->layers[3].wk.data + fal->layers[3].wk.row_bytes * 512);
    /* every tensor in a weight block (the tied head counted in its block too) */
    const qi_model *ms[2] = {opt, fal};
    for (int i = 0; i < 2; i++) {
        const qi_model *m = ms[i];
        double sum = 0;
        for (int b = 0; b < qi_plan_n_blocks(m->hp.n_layer); b++) sum += (double)qi_plan_block_bytes(m, b);
        const double tied = (double)m->output.row_bytes * (double)m->output.n_rows;
        const double slack = 64.0 * 20 * (m->hp.n_layer + 2);
        ck_assert_msg(sum - tied >= (double)m->weight_bytes && sum - tied <= (double)m->weight_bytes + slack,
                      "%s: blocks %.0f, tensors %.0f", m->hp.arch_name, sum - tied, (double)m->weight_bytes);
    }
    /* the engine refuses them on real devices */
    qi_engine_opts o;
    qi_engine_opts_default(&o);
    o.n_threads = 1;
    o.n_ctx = 64;
    qi_engine *en = NULL;
    qi_err e = {0};
    ck_assert_int_eq(qi_engine_create(opt, &o, &en, &e), QI_ERR_UNSUPPORTED);
    ck_assert_msg(strstr(e.msg, "OPT runs on simulated devices only in this build (its LayerNorm"), "%s", e.msg);
    qi_err_clear(&e);
    ck_assert_int_eq(qi_engine_create(fal, &o, &en, &e), QI_ERR_UNSUPPORTED);
    ck_assert_msg(strstr(e.msg, "Falcon runs on simulated devices only"), "%s", e.msg);

    char split[64], apart[64];
    snprintf(apart, sizeof apart, "/tmp/qinfer-test-archs-%d.plan", (int)getpid());
    qi_sim_params def;
    qi_sim_params_default(&def);
    for (int i = 0; i < 2; i++) {
        const qi_model *m = ms[i];
        const int L = m->hp.n_layer;
        arch_run cpu, gpu, half, ap;
        char all[32];
        snprintf(all, sizeof all, "ngl=%d", L + 1);
        snprintf(split, sizeof split, "ngl=%d", L / 2);
        run_arch(m, "all-cpu", &cpu);
        run_arch(m, all, &gpu);
        run_arch(m, split, &half);
        /* all on the GPU: decode reads every block's weights once a step at
         * the GPU's bandwidth times the matmul efficiency */
        double wb = 0;
        for (int b = 1; b < qi_plan_n_blocks(L); b++) wb += (double)qi_plan_block_bytes(m, b);
        const double floor_s = wb / (1935e9 * def.memory[1][0]);
        ck_assert_msg(gpu.decode_s > floor_s && gpu.decode_s < 1.5 * floor_s, "%s: gpu decode %g s, floor %g s",
                      m->hp.arch_name, gpu.decode_s, floor_s);
        ck_assert_msg(cpu.decode_s > half.decode_s && half.decode_s > gpu.decode_s, "%s: cpu %g, half %g, gpu %g",
                      m->hp.arch_name, cpu.decode_s, half.decode_s, gpu.decode_s);
        ck_assert(cpu.ops[0] == 0 && cpu.ops[2] == 0);
        /* per layer on the GPU (ngl=L+1 adds the head's norm and matmul):
         * OPT: LayerNorm, Q/K/V biases, KV write, output bias, residual;
         * LayerNorm, fc1 bias, ReLU, fc2 bias, residual: 12, no RoPE.
         * Falcon: LayerNorm, RoPE, KV write; LayerNorm, GELU, two residual
         * adds: 7. Both: QKV, Wo, up, down: 4 matmul launches, 1 attention. */
        const double other = i == 0 ? 12 : 7;
        ck_assert_msg(gpu.ops[2] == other * L + 1, "%s: %g other ops a step", m->hp.arch_name, gpu.ops[2]);
        ck_assert_msg(gpu.ops[0] == 4.0 * L + 1, "%s: %g matmuls a step", m->hp.arch_name, gpu.ops[0]);
        ck_assert(gpu.ops[1] == L);
        /* attention on the CPU, MLP on the GPU: x goes over and back every
         * layer; Falcon's parallel MLP also takes the attention's output */
        write_plan(apart, L, "cpu", "gpu");
        run_arch(m, apart, &ap);
        ck_assert_msg(ap.ops[QI_SIM_OP_CLASSES] == (i == 0 ? 2.0 : 3.0) * L, "%s: %g copies a step",
                      m->hp.arch_name, ap.ops[QI_SIM_OP_CLASSES]);
        ck_assert_msg(ap.ops[2] == (i == 0 ? 5.0 : 4.0) * L, "%s: %g GPU other ops", m->hp.arch_name, ap.ops[2]);
    }
    unlink(apart);
    qi_model_free(opt);
    qi_model_free(fal);
    for (int i = 0; i < 2; i++) qi_free(g_arch_buf[i]);
}
END_TEST

/* A calibration file with the given text; its path (static). */
static const char *cal_file(const char *text) {
    static char path[64];
    snprintf(path, sizeof path, "/tmp/qi_test_sim_%d.cal", (int)getpid());
    FILE *f = fopen(path, "w");
    ck_assert(f);
    fputs(text, f);
    fclose(f);
    return path;
}

/* The reader applies a good file over what the parameters hold, and
 * refuses a bad one with FILE:LINE: KEY: why, leaving them as they were. */
START_TEST(test_cal_file) {
    qi_sim_params p, d;
    qi_sim_params_default(&d);
    p = d;
    qi_err e = {0};
    const char *path = cal_file("# fitted\n\ncpu_matmul_memory = 2.5  # source: fitted, test\n"
                                "  cpu_op_s=3e-6 # source: fitted, test\n");
    ck_assert_msg(qi_sim_params_load(path, &p, &e) == QI_OK, "%s", e.msg);
    ck_assert(p.memory[0][0] == 2.5 && p.cpu_op_s == 3e-6);
    ck_assert(p.compute[0][0] == d.compute[0][0] && p.link == d.link);
    static const struct {
        const char *text, *want;
    } bad[] = {
        {"cpu_matmul_memory = 0.5  # source: t\ncpu_matmul_memroy = 0.5  # source: t\n", ":2: cpu_matmul_memroy: unknown parameter"},
        {"cpu_op_s = 1e-5x  # source: t\n", ":1: cpu_op_s: '1e-5x' is not a number"},
        {"cpu_op_s =   # source: t\n", ":1: cpu_op_s: '' is not a number"},
        {"cpu_op_s = nan  # source: t\n", ":1: cpu_op_s: 'nan' is not a number"},
        {"cpu_op_s = 1e-5\n", ":1: cpu_op_s: no `# source: TEXT`"},
        {"cpu_op_s = 1e-5  # from a fit\n", ":1: cpu_op_s: no `# source: TEXT`"},
        {"cpu_op_s = 1e-5  # source:\n", ":1: cpu_op_s: no `# source: TEXT`"},
        {"cpu_op_s = 1e-5  # source: a\n\ncpu_op_s = 1e-5  # source: b\n", ":3: cpu_op_s: given twice"},
        {"cpu_other_memory = 17  # source: t\n", ":1: cpu_other_memory: 17 is not an efficiency in (0, 16]"},
        {"link = 1.5  # source: t\n", ":1: link: 1.5 is not an efficiency in (0, 1]"},
        {"cpu_op_s = -1  # source: t\n", ":1: cpu_op_s: -1 is not a finite number >= 0"},
        {"cpu_op_s 1e-5  # source: t\n", ":1: not a `key = value"},
        {" = 1  # source: t\n", ":1: a value without a key"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        qi_err_clear(&e);
        p = d;
        path = cal_file(bad[i].text);
        ck_assert_int_eq(qi_sim_params_load(path, &p, &e), QI_ERR_FORMAT);
        ck_assert_msg(strncmp(e.msg, path, strlen(path)) == 0 && strstr(e.msg, bad[i].want), "%zu: %s", i, e.msg);
        ck_assert_msg(!strchr(e.msg, '\n'), "%s", e.msg);
        ck_assert(memcmp(&p, &d, sizeof p) == 0);
    }
    unlink(path);
    qi_err_clear(&e);
    ck_assert_int_eq(qi_sim_params_load("/nonexistent/x.cal", &p, &e), QI_ERR_IO);
    ck_assert_msg(strstr(e.msg, "/nonexistent/x.cal"), "%s", e.msg);
}
END_TEST

/* A synthetic workload for the fit: matmuls of 1 to 256 tokens (memory-
 * to compute-bound) and elementwise ops on the simulated CPU, in sizes
 * and counts that do not grow together (times that all grew with T
 * would leave the matmul's and the adds' efficiencies one product); its
 * times at given parameters are what the fit has to invert. */
typedef struct {
    int calls;
} synth_ctx;

static qi_status synth_predict(void *vctx, const char *const *keys, const double *values, int n_keys, double *pred,
                               qi_err *err) {
    synth_ctx *c = vctx;
    c->calls++;
    qi_sim_params par;
    qi_sim_params_default(&par);
    for (int i = 0; i < n_keys; i++) {
        qi_status st = qi_sim_params_set(&par, keys[i], values[i], err);
        if (st) return st;
    }
    static const int Ts[] = {1, 2, 8, 32, 64, 256}, n_add[] = {3, 12, 1, 16, 2, 6};
    static const long add_len[] = {1L << 20, 1L << 12, 1L << 18, 1L << 14, 1L << 19, 1L << 10};
    static float x[1 << 20], y[1 << 20];
    const qi_weight w = weight(1024, 1024);
    int k = 0;
    for (size_t i = 0; i < sizeof Ts / sizeof Ts[0]; i++) {
        machine M;
        machine_open(&M, &par, 0);
        const double t0 = qi_sim_now(M.sim);
        ck_assert_int_eq(mm(M.cpu, &w, x, Ts[i], y, err), QI_OK);
        for (int r = 0; r < n_add[i]; r++) ck_assert_int_eq(qi_backend_add(M.cpu, x, y, add_len[i], err), QI_OK);
        pred[k++] = qi_sim_now(M.sim) - t0;
        machine_close(&M);
    }
    return QI_OK;
}

/* The fit recovers known parameters from their own times, starting from
 * the defaults. */
START_TEST(test_fit_synthetic) {
    static const char *const keys[] = {"cpu_matmul_compute", "cpu_matmul_memory", "cpu_other_memory", "cpu_op_s"};
    const double truth[] = {0.9, 0.6, 2.3, 2e-5};
    double meas[6], vals[4], lo[4] = {1e-3, 1e-3, 1e-3, 1e-8}, hi[4] = {16, 16, 16, 1e-2};
    qi_err e = {0};
    synth_ctx c = {0};
    ck_assert_int_eq(synth_predict(&c, keys, truth, 4, meas, &e), QI_OK);
    qi_sim_params d;
    qi_sim_params_default(&d);
    vals[0] = d.compute[0][0], vals[1] = d.memory[0][0], vals[2] = d.memory[0][2], vals[3] = d.cpu_op_s;
    qi_calib_fit_report rep;
    ck_assert_msg(qi_calib_fit(keys, vals, lo, hi, 4, meas, 6, synth_predict, &c, 3000, &rep, &e) == QI_OK, "%s",
                  e.msg);
    for (int i = 0; i < 4; i++)
        ck_assert_msg(fabs(vals[i] / truth[i] - 1) < 0.02, "%s: fitted %g, true %g (%d evaluations, MAPE %g)", keys[i],
                      vals[i], truth[i], rep.evals, rep.mape);
    ck_assert_msg(rep.mape < 0.005, "fit MAPE %g", rep.mape);
    ck_assert(rep.evals > 10 && rep.evals <= 3010 && c.calls == rep.evals + 1);
    /* bad arguments */
    meas[2] = 0;
    ck_assert_int_eq(qi_calib_fit(keys, vals, lo, hi, 4, meas, 6, synth_predict, &c, 100, &rep, &e), QI_ERR_INVALID);
    ck_assert_double_eq_tol(qi_calib_mape((const double[]){1.1, 0.8}, (const double[]){1, 1}, 2), 0.15, 1e-12);
}
END_TEST

/* The same on the engine: SmolLM2's prefill and decode times, simulated
 * with known parameters (qi_calib_measure, as qinfer calibrate measures
 * the real engine), fitted from the defaults, give the parameters back. */
typedef struct {
    int batch[4], ctx[4], n;
} engine_points;

static qi_status engine_predict(void *vctx, const char *const *keys, const double *values, int n_keys, double *pred,
                                qi_err *err) {
    const engine_points *pts = vctx;
    qi_params sp;
    qi_params_init(&sp);
    for (int i = 0; i < n_keys; i++) {
        char v[40];
        snprintf(v, sizeof v, "%.17g", values[i]);
        ck_assert_int_eq(qi_params_set(&sp, keys[i], v, err), QI_OK);
    }
    qi_engine_opts o;
    qi_engine_opts_default(&o);
    o.n_threads = 1;
    o.sim = g_prof;
    o.sim_params = &sp;
    for (int i = 0; i < pts->n; i++) {
        qi_calib_time t;
        qi_status st = qi_calib_measure(g_model, &o, pts->batch[i], pts->ctx[i], 3, &t, err);
        if (st) return st;
        pred[2 * i] = t.prefill_s;
        pred[2 * i + 1] = t.decode_s;
    }
    return QI_OK;
}

START_TEST(test_engine_fit) {
    /* not cpu_op_s: every step of one model runs the same ops, so its
     * fixed cost and the weights' read time are one constant per step,
     * which only several models with different op counts tell apart */
    static const char *const keys[] = {"cpu_matmul_compute", "cpu_matmul_memory", "cpu_attention_memory"};
    const double truth[] = {0.6, 1.2, 0.4}; /* decode of one sequence memory-bound, of four compute-bound */
    const engine_points pts = {.batch = {1, 1, 4, 2}, .ctx = {16, 512, 64, 256}, .n = 4};
    double meas[8], vals[3], lo[3] = {1e-3, 1e-3, 1e-3}, hi[3] = {16, 16, 16};
    qi_err e = {0};
    ck_assert_msg(engine_predict((void *)&pts, keys, truth, 3, meas, &e) == QI_OK, "%s", e.msg);
    /* decode is one step, prefill all of the prompt's */
    ck_assert(meas[0] > 0 && meas[1] > 0 && meas[2] > meas[0] && meas[3] > meas[1]);
    qi_sim_params d;
    qi_sim_params_default(&d);
    vals[0] = d.compute[0][0], vals[1] = d.memory[0][0], vals[2] = d.memory[0][1];
    qi_calib_fit_report rep;
    ck_assert_msg(qi_calib_fit(keys, vals, lo, hi, 3, meas, 8, engine_predict, (void *)&pts, 1500, &rep, &e) == QI_OK,
                  "%s", e.msg);
    for (int i = 0; i < 3; i++)
        ck_assert_msg(fabs(vals[i] / truth[i] - 1) < 0.03, "%s: fitted %g, true %g (%d evaluations, MAPE %g)", keys[i],
                      vals[i], truth[i], rep.evals, rep.mape);
    ck_assert_msg(rep.mape < 0.005, "fit MAPE %g", rep.mape);
}
END_TEST

static Suite *sim_suite(void) {
    Suite *s = suite_create("sim");
    TCase *tc = tcase_create("sim");
    tcase_add_test(tc, test_params);
    tcase_add_test(tc, test_op_time);
    tcase_add_test(tc, test_overlap);
    tcase_add_test(tc, test_copies);
    tcase_add_test(tc, test_copy_stream);
    tcase_add_test(tc, test_capacity);
    tcase_add_test(tc, test_noise);
    tcase_add_test(tc, test_shapes_only_gguf);
    tcase_add_test(tc, test_archs);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_cal_file);
    tcase_add_test(tc, test_fit_synthetic);
    suite_add_tcase(s, tc);
    if (g_model) {
        tc = tcase_create("engine");
        tcase_set_timeout(tc, 120);
        tcase_add_test(tc, test_engine_sim);
        tcase_add_test(tc, test_engine_fit);
        suite_add_tcase(s, tc);
    }
    return s;
}

int main(void) {
    const char *cs = qi_test_case();
    if (strcmp(cs, "engine") == 0 || !*cs) g_model = qi_test_load_cached(SMOL_FILE);
    if (strcmp(cs, "engine") == 0 && !g_model)
        return qi_test_skip("test_sim_engine", SMOL_FILE " not cached (models/fetch.sh smollm2-135m)");
    if (g_model) write_profile();
    const int rc = qi_test_run_suite(sim_suite());
    if (g_model) unlink(g_prof);
    qi_model_free(g_model);
    return rc;
}

/* backend_sim.c - the simulated devices (backend.h): a machine described by
 * a hardware profile (hwprofile.h), on which the engine runs unchanged
 * while no arithmetic is done.
 *
 * An op does nothing to its data and advances a virtual clock by
 *
 *     max(FLOPs / (peak x compute efficiency), bytes / (bandwidth x memory efficiency)) + overhead
 *
 * with the peak, bandwidth and overhead of the device it runs on (the
 * profile's GPU, or its host CPU) and the efficiencies of its op class
 * (matmul, attention, other), times an optional seeded noise factor.
 * Copies move no bytes either: one between the host and the GPU takes the
 * link's latency plus bytes over its bandwidth in that direction; one
 * within a device, bytes over its memory bandwidth.
 *
 * Clocks (a discrete-event timeline with one queue per stream): the host
 * and the simulated CPU are one clock, `host`, since the CPU's ops run on
 * the thread that issues everything; the GPU's stream has its own, `t`. A
 * GPU op or copy starts when both its stream and the host have reached
 * it (max(t, host): the host issued it then) and ends its duration later;
 * the host goes on at once, so the CPU's work that follows overlaps it, as
 * on a real machine. An event records its stream's clock; a stream that
 * waits for one moves its clock up to the event's time; the host waiting
 * (qi_event_sync, a synchronise) moves the host's clock up. The GPU's
 * copy stream (its copy engine) has a clock of its own too (sim_stream.c).
 * The engine's own host work between ops (scheduling, the KV policy's decisions, the
 * sampler) costs no simulated time.
 *
 * Memory: buffers come from one reserved range of address space per
 * device, counted against its capacity (the profile's GPU memory or host
 * memory) by device.c as every device's. The GPU's range is inaccessible (PROT_NONE): nothing may
 * read a device's memory from the host, and a bug that does faults at
 * once. The CPU's is host memory the engine may read and write (it is
 * host-visible), reserved without backing, so untouched weights and
 * caches of a 70B model cost no RAM; what the engine writes there is
 * real. Sizes are handed out from per-size free lists and a bump pointer,
 * since the engine frees and allocates blocks of a few sizes.
 */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

#include "backend.h"
#include "qinfer/types.h"
#include "sim_cpu.h"
#include "sim_stream.h"

struct qi_sim {
    qi_hwprofile prof;
    qi_sim_params par;
    double host;   /* the host's clock, and the simulated CPU's stream */
    uint64_t rng;  /* noise */
    long ops, copies;
    long n_ops[2][QI_SIM_OP_CLASSES + 1]; /* per device (CPU, GPU) and class, copies last */
    qi_sim_cpu_ws ws; /* the CPU's weights, for its machine model (sim_cpu.c) */
};

typedef struct free_run {
    size_t size;
    void *mem;
    struct free_run *next;
} free_run;

typedef struct {
    qi_sim *sim;
    bool gpu;
    double t; /* the GPU stream's clock (the CPU uses sim->host) */
    double tcopy; /* the GPU's copy stream's clock (sim_stream.c) */
    char *base;
    size_t len, bump;
    free_run *free; /* released ranges, reused by exact size */
    uint64_t *key;  /* the live buffers' sizes (size_put) */
    size_t *val, cap_live, n_live, n_tomb;
    double busy[QI_SIM_OP_CLASSES + 1]; /* simulated seconds per op class, and copies */
} sim_dev;

static sim_dev *S(qi_backend *b) { return (sim_dev *)b->ctx; }

/* The live buffers' sizes by address (buf_release is given the address
 * only): open addressing, keys offset / SIM_ALIGN + 1 (0: empty), tombstones
 * UINT64_MAX, grown at half full. */
#define SIM_ALIGN 64
#define TOMB UINT64_MAX

static size_t slot_of(uint64_t key, size_t cap) { return (size_t)((key * 0x9e3779b97f4a7c15ull) >> 20) & (cap - 1); }

static bool size_put(sim_dev *d, const void *mem, size_t n) {
    if (2 * (d->n_live + d->n_tomb + 1) > d->cap_live) {
        const size_t cap = d->cap_live ? (2 * (d->n_live + 1) > d->cap_live / 2 ? 2 * d->cap_live : d->cap_live)
                                       : 1024;
        uint64_t *k = qi_calloc(cap, sizeof *k);
        size_t *v = qi_calloc(cap, sizeof *v);
        if (!k || !v) {
            qi_free(k);
            qi_free(v);
            return false;
        }
        for (size_t i = 0; i < d->cap_live; i++) {
            if (!d->key[i] || d->key[i] == TOMB) continue;
            size_t j = slot_of(d->key[i], cap);
            while (k[j]) j = (j + 1) & (cap - 1);
            k[j] = d->key[i];
            v[j] = d->val[i];
        }
        qi_free(d->key);
        qi_free(d->val);
        d->key = k;
        d->val = v;
        d->cap_live = cap;
        d->n_tomb = 0;
    }
    const uint64_t key = (uint64_t)((const char *)mem - d->base) / SIM_ALIGN + 1;
    size_t j = slot_of(key, d->cap_live);
    while (d->key[j] && d->key[j] != TOMB) j = (j + 1) & (d->cap_live - 1);
    d->key[j] = key;
    d->val[j] = n;
    d->n_live++;
    return true;
}

static size_t size_take(sim_dev *d, const void *mem) {
    if (!d->cap_live) return 0;
    const uint64_t key = (uint64_t)((const char *)mem - d->base) / SIM_ALIGN + 1;
    for (size_t j = slot_of(key, d->cap_live);; j = (j + 1) & (d->cap_live - 1)) {
        if (!d->key[j]) return 0;
        if (d->key[j] == key) {
            d->key[j] = TOMB;
            d->n_live--;
            d->n_tomb++;
            return d->val[j];
        }
    }
}

/* ---- parameters --------------------------------------------------------------------- */

void qi_sim_params_default(qi_sim_params *p) {
    *p = (qi_sim_params){0};
    /* Untuned starting points, meant to be replaced by a calibration
     * (the device README says where each comes from): a bandwidth-bound
     * kernel reaches 70-85% of a datasheet's bandwidth, a tensor-core GEMM
     * of a quantised model 50-60% of its peak, attention less of both. */
    static const double gpu_c[QI_SIM_OP_CLASSES] = {0.55, 0.30, 0.50};
    static const double gpu_m[QI_SIM_OP_CLASSES] = {0.80, 0.60, 0.60};
    static const double cpu_c[QI_SIM_OP_CLASSES] = {0.50, 0.30, 0.50};
    static const double cpu_m[QI_SIM_OP_CLASSES] = {0.75, 0.50, 0.50};
    for (int k = 0; k < QI_SIM_OP_CLASSES; k++) {
        p->compute[1][k] = gpu_c[k];
        p->memory[1][k] = gpu_m[k];
        p->compute[0][k] = cpu_c[k];
        p->memory[0][k] = cpu_m[k];
    }
    p->gpu_matmul_overlap = 1;
    /* the CPU's machine model, off; where a calibration turns it on, these
     * are the fit's starting points */
    p->cpu_llc_memory = 0.5;
    p->cpu_llc_share = 0.5;
    p->cpu_unpack = 0.5;
    p->cpu_matmul_overlap = 0.5;
    p->link = 0.80;
    p->cpu_op_s = 4e-6;
    p->noise = 0;
    p->seed = 1;
}

static const char *const k_class[QI_SIM_OP_CLASSES] = {"matmul", "attention", "other"};

const char *qi_sim_op_class_name(int k) { return k >= 0 && k < QI_SIM_OP_CLASSES ? k_class[k] : "copy"; }

qi_status qi_sim_params_set(qi_sim_params *p, const char *key, double v, qi_err *err) {
    if (!(v >= 0) || !isfinite(v)) return QI_ERR(err, QI_ERR_INVALID, "sim: %s = %g is not a finite number >= 0", key, v);
    if (!strcmp(key, "noise")) return p->noise = v, QI_OK;
    if (!strcmp(key, "seed")) return p->seed = (uint64_t)v, QI_OK;
    if (!strcmp(key, "cpu_op_s")) return p->cpu_op_s = v, QI_OK;
    if (!strncmp(key, "cpu_matmul_compute_", 19)) {
        for (int t = 0; t < QI_TYPE_COUNT; t++) {
            const qi_type_info *ti = qi_type_get((uint32_t)t);
            if (!ti || !ti->name || strcmp(key + 19, ti->name) != 0) continue;
            if (!(v > 0) || v > QI_SIM_EFF_MAX)
                return QI_ERR(err, QI_ERR_INVALID, "sim: %s = %g is not an efficiency in (0, %g]", key, v,
                              (double)QI_SIM_EFF_MAX);
            p->cpu_matmul_type[t] = v;
            return QI_OK;
        }
    }
    if (!strncmp(key, "gpu_matmul_compute_", 19)) {
        for (int t = 0; t < QI_TYPE_COUNT; t++) {
            const qi_type_info *ti = qi_type_get((uint32_t)t);
            if (!ti || !ti->name || strcmp(key + 19, ti->name) != 0) continue;
            if (!(v > 0) || v > 1)
                return QI_ERR(err, QI_ERR_INVALID, "sim: %s = %g is not an efficiency in (0, 1]", key, v);
            p->gpu_matmul_type[t] = v;
            return QI_OK;
        }
    }
    /* the GPU's kernel model: fractions of a peak at most 1 (a GPU's
     * datasheet rates are the silicon's, no cache serves above them) */
    static const struct {
        const char *key;
        size_t off;
        double hi;
        bool zero_ok;
    } gk[] = {
        {"gpu_matvec_compute", offsetof(qi_sim_params, gpu_matvec_compute), 1, false},
        {"gpu_gemm_simt", offsetof(qi_sim_params, gpu_gemm_simt), 1, true},
        {"gpu_matmul_overlap", offsetof(qi_sim_params, gpu_matmul_overlap), 1, true},
        {"gpu_op_cycles", offsetof(qi_sim_params, gpu_op_cycles), 1e6, true},
        {"gpu_power_ref", offsetof(qi_sim_params, gpu_power_ref), 1000, true},
        {"gpu_power_exp", offsetof(qi_sim_params, gpu_power_exp), 2, true},
        /* the CPU's machine model (sim_cpu.c): shares of measured rates and
         * of the cache, at most 1; the unpacking cost a few multiply-adds */
        {"cpu_dram_memory", offsetof(qi_sim_params, cpu_dram_memory), 1, true},
        {"cpu_llc_memory", offsetof(qi_sim_params, cpu_llc_memory), 1, false},
        {"cpu_llc_share", offsetof(qi_sim_params, cpu_llc_share), 1, false},
        {"cpu_unpack", offsetof(qi_sim_params, cpu_unpack), 8, true},
        {"cpu_matmul_overlap", offsetof(qi_sim_params, cpu_matmul_overlap), 1, true},
        {"cpu_matmul_tiled", offsetof(qi_sim_params, cpu_matmul_tiled), 32, true}, /* AMX: 32x the FMAs */
        {"cpu_tile_unpack", offsetof(qi_sim_params, cpu_tile_unpack), 256, true},
        {"cpu_thread_memory", offsetof(qi_sim_params, cpu_thread_memory), 1, true},
    };
    for (size_t i = 0; i < sizeof gk / sizeof gk[0]; i++) {
        if (strcmp(key, gk[i].key) != 0) continue;
        if ((!gk[i].zero_ok && !(v > 0)) || v > gk[i].hi)
            return QI_ERR(err, QI_ERR_INVALID, "sim: %s = %g is out of its range %s%g]", key, v,
                          gk[i].zero_ok ? "[0, " : "(0, ", gk[i].hi);
        *(double *)((char *)p + gk[i].off) = v;
        return QI_OK;
    }
    if (!strcmp(key, "link")) {
        if (!(v > 0) || v > 1) return QI_ERR(err, QI_ERR_INVALID, "sim: link = %g is not an efficiency in (0, 1]", v);
        return p->link = v, QI_OK;
    }
    /* DEV_CLASS_compute / DEV_CLASS_memory */
    for (int d = 0; d < 2; d++)
        for (int k = 0; k < QI_SIM_OP_CLASSES; k++)
            for (int w = 0; w < 2; w++) {
                char name[48];
                snprintf(name, sizeof name, "%s_%s_%s", d ? "gpu" : "cpu", k_class[k], w ? "memory" : "compute");
                if (strcmp(key, name) != 0) continue;
                /* above 1 where caches serve more than the profile's DRAM
                 * bandwidth (a calibration finds such; sim/README.md) */
                if (!(v > 0) || v > QI_SIM_EFF_MAX)
                    return QI_ERR(err, QI_ERR_INVALID, "sim: %s = %g is not an efficiency in (0, %g]", key, v,
                                  (double)QI_SIM_EFF_MAX);
                (w ? p->memory : p->compute)[d][k] = v;
                return QI_OK;
            }
    return QI_ERR(err, QI_ERR_INVALID,
                  "sim: unknown parameter '%s' (noise, seed, cpu_op_s, link, {cpu,gpu}_{matmul,attention,other}_"
                  "{compute,memory}, {cpu,gpu}_matmul_compute_TYPE, TYPE a weight type such as q4_k, "
                  "gpu_matvec_compute, gpu_gemm_simt, gpu_matmul_overlap, gpu_op_cycles, gpu_power_ref, "
                  "gpu_power_exp, cpu_dram_memory, cpu_llc_memory, cpu_llc_share, cpu_unpack, cpu_matmul_overlap, cpu_matmul_tiled, "
                  "cpu_tile_unpack, cpu_thread_memory)",
                  key);
}

/* ---- the simulated machine --------------------------------------------------------- */

qi_status qi_sim_create(const qi_hwprofile *prof, const qi_sim_params *par, qi_sim **out, qi_err *err) {
    *out = NULL;
    qi_sim *s = qi_calloc(1, sizeof *s);
    if (!s) return QI_ERR(err, QI_ERR_NOMEM, "out of memory creating a simulated machine");
    s->prof = *prof;
    if (par) s->par = *par;
    else qi_sim_params_default(&s->par);
    s->rng = 0x9e3779b97f4a7c15ull ^ (s->par.seed * 0xbf58476d1ce4e5b9ull);
    if (!s->rng) s->rng = 1;
    *out = s;
    return QI_OK;
}

void qi_sim_free(qi_sim *s) { qi_free(s); }
double qi_sim_now(const qi_sim *s) { return s->host; }
const qi_hwprofile *qi_sim_profile(const qi_sim *s) { return &s->prof; }
const qi_sim_params *qi_sim_get_params(const qi_sim *s) { return &s->par; }

double qi_sim_busy(qi_backend *b, int op_class) {
    if (b->info.kind != QI_DEV_SIM || op_class < 0 || op_class > QI_SIM_OP_CLASSES) return 0;
    return S(b)->busy[op_class];
}

long qi_sim_op_count(const qi_sim *s, bool gpu, int op_class) {
    if (op_class < 0 || op_class > QI_SIM_OP_CLASSES) return 0;
    return s->n_ops[gpu][op_class];
}

static double noise(qi_sim *s) {
    if (s->par.noise <= 0) return 1;
    /* a standard normal from two uniforms (Box-Muller), then exp(sigma z) */
    double u[2];
    for (int i = 0; i < 2; i++) {
        s->rng ^= s->rng << 13;
        s->rng ^= s->rng >> 7;
        s->rng ^= s->rng << 17;
        u[i] = ((double)(s->rng >> 11) + 0.5) / 9007199254740992.0;
    }
    const double z = sqrt(-2 * log(u[0])) * cos(6.283185307179586 * u[1]);
    return exp(s->par.noise * z);
}

/* The duration of an op on device d: FLOPs at rate `peak` and bytes at the
 * device's memory bandwidth, with the class's efficiencies; tc_given >= 0
 * is the compute time worked out by the caller instead (a CPU matmul of
 * weights whose types have efficiencies of their own). */
/* The share of its boost clock a power-limited GPU holds (gpu_power_ref,
 * gpu_power_exp): 1 without the parameters or the profile's gpu.tdp. */
static double gpu_clock_share(const qi_sim *s) {
    const qi_sim_params *p = &s->par;
    if (!(p->gpu_power_ref > 0) || !s->prof.gpu_tdp.set || !(s->prof.gpu_fp32.value > 0)) return 1;
    const double r = s->prof.gpu_tdp.value / (s->prof.gpu_fp32.value * 1e-12 * p->gpu_power_ref);
    return r >= 1 ? 1 : pow(r, p->gpu_power_exp);
}

/* A GPU kernel's fixed cost: gpu_op_cycles at the clock it holds, else the
 * profile's launch. */
static double gpu_overhead(const qi_sim *s) {
    if (s->par.gpu_op_cycles > 0 && s->prof.gpu_clock.set)
        return s->par.gpu_op_cycles / (s->prof.gpu_clock.value * gpu_clock_share(s));
    return s->prof.gpu_launch.value;
}

static double op_time_tc(qi_backend *b, int cls, double flops, double bytes, double peak, double tc_given) {
    sim_dev *d = S(b);
    const qi_sim_params *p = &d->sim->par;
    const int g = d->gpu;
    /* the CPU's rates at the share its threads reach (sim_cpu.c) */
    const double bw = g ? d->sim->prof.gpu_mem_bw.value : d->sim->prof.cpu_mem_bw.value * qi_sim_cpu_thread_mem(p);
    const double clk = g ? gpu_clock_share(d->sim) : qi_sim_cpu_thread_share(&d->sim->prof, p);
    const double tc = tc_given >= 0 ? tc_given : flops > 0 ? flops / (peak * clk * p->compute[g][cls]) : 0;
    const double tm = bytes > 0 ? bytes / (bw * p->memory[g][cls]) : 0;
    const double over = g ? gpu_overhead(d->sim) : p->cpu_op_s;
    const double hi = tc > tm ? tc : tm, lo = tc > tm ? tm : tc;
    /* a GPU matmul's compute and memory overlap as far as gpu_matmul_overlap says */
    const double t = g && cls == 0 ? hi + (1 - p->gpu_matmul_overlap) * lo : hi;
    return (t + over) * noise(d->sim);
}

static double op_time(qi_backend *b, int cls, double flops, double bytes, double peak) {
    return op_time_tc(b, cls, flops, bytes, peak, -1);
}

/* Run a piece of work of `dur` seconds on b's stream. */
static void advance(qi_backend *b, int cls, double dur) {
    sim_dev *d = S(b);
    qi_sim *s = d->sim;
    if (d->gpu) {
        const double start = d->t > s->host ? d->t : s->host;
        d->t = start + dur;
    } else {
        s->host += dur;
    }
    d->busy[cls] += dur;
    if (cls < QI_SIM_OP_CLASSES) s->ops++;
    else s->copies++;
    s->n_ops[d->gpu][cls]++;
}

static void run_op(qi_backend *b, int cls, double flops, double bytes, double peak) {
    advance(b, cls, op_time(b, cls, flops, bytes, peak));
}

/* FLOP/s of the general (non-matmul) arithmetic */
static double vec_peak(qi_backend *b) {
    const qi_hwprofile *pr = &S(b)->sim->prof;
    return S(b)->gpu ? pr->gpu_fp32.value : pr->cpu_fp32.value;
}

/* A weight matmul's rate: on the GPU, the tensor cores once a step has
 * rows enough for a GEMM (dequantised to fp16 tiles), the CUDA cores for
 * the matrix-vector kernels of decode; on the CPU, the integer dot
 * products of a quantised weight where the profile gives their rate. */
static bool is_quant(const qi_weight *w) {
    return w->type != QI_TYPE_F32 && w->type != QI_TYPE_F16 && w->type != QI_TYPE_BF16;
}

static double matmul_peak(qi_backend *b, const qi_weight *w, int T) {
    const qi_hwprofile *pr = &S(b)->sim->prof;
    if (S(b)->gpu) return T >= 8 ? (is_quant(w) ? pr->gpu_int8_tensor.value : pr->gpu_fp16_tensor.value)
                                 : pr->gpu_fp32.value;
    return is_quant(w) && pr->cpu_int8.set ? pr->cpu_int8.value : pr->cpu_fp32.value;
}

/* A GPU matmul's compute time: below 8 rows the matrix-vector kernels at
 * the FP32 rate (gpu_matvec_compute); from 8 a GEMM on the tensor cores,
 * int8 for a quantised weight (its activations quantised to 8 bits, as
 * llama.cpp's MMQ) or fp16, at its type's efficiency, plus for a
 * quantised one the unpacking on the CUDA cores (gpu_gemm_simt); all at
 * the clock the board holds. */
static double gpu_mm_tc(qi_backend *b, const qi_weight *w, int T, double f) {
    const qi_sim *s = S(b)->sim;
    const qi_sim_params *p = &s->par;
    const double clk = gpu_clock_share(s), fp32 = s->prof.gpu_fp32.value * clk;
    if (T < 8) return f / (fp32 * (p->gpu_matvec_compute > 0 ? p->gpu_matvec_compute : p->compute[1][0]));
    const double eff = w->type < QI_TYPE_COUNT && p->gpu_matmul_type[w->type] > 0 ? p->gpu_matmul_type[w->type]
                                                                                    : p->compute[1][0];
    return f / (matmul_peak(b, w, T) * clk * eff) + (is_quant(w) ? p->gpu_gemm_simt * f / fp32 : 0);
}

static double wbytes(const qi_weight *w) { return (double)w->row_bytes * (double)w->n_rows; }

/* A matmul's compute time for a weight's FLOPs: on the GPU always
 * (gpu_mm_tc); on the CPU where its type has an efficiency of its own
 * (cpu_matmul_compute_TYPE), else -1. */
static double type_tc(qi_backend *b, const qi_weight *w, int T, double f) {
    const qi_sim_params *p = &S(b)->sim->par;
    if (S(b)->gpu) return gpu_mm_tc(b, w, T, f);
    if ( w->type >= QI_TYPE_COUNT || !(p->cpu_matmul_type[w->type] > 0)) return -1;
    return f / (matmul_peak(b, w, T) * p->cpu_matmul_type[w->type]);
}

/* A CPU matmul under the machine model (sim_cpu.c), when it is on. */
static bool cpu_model_matmul(qi_backend *b, const qi_weight *const *w, int n, int T) {
    qi_sim *s = S(b)->sim;
    if (S(b)->gpu || !qi_sim_cpu_on(&s->par)) return false;
    advance(b, 0, qi_sim_cpu_matmul_s(&s->ws, &s->prof, &s->par, w, n, T) * noise(s));
    return true;
}

static void sim_matmul(qi_backend *b, const qi_weight *w, const float *x, int T, float *y) {
    (void)x, (void)y;
    if (cpu_model_matmul(b, &w, 1, T)) return;
    const double f = 2.0 * T * (double)w->n_rows * (double)w->n_cols;
    advance(b, 0, op_time_tc(b, 0, f, wbytes(w) + 4.0 * T * ((double)w->n_cols + (double)w->n_rows),
                             matmul_peak(b, w, T), type_tc(b, w, T, f)));
}

static void sim_matmul_n(qi_backend *b, const qi_weight *const *w, float *const *y, int n, const float *x, int T) {
    (void)x, (void)y;
    if (cpu_model_matmul(b, w, n, T)) return;
    double f = 0, by = 4.0 * T * (double)w[0]->n_cols, tc = 0;
    bool typed = false;
    for (int i = 0; i < n; i++) {
        const double fi = 2.0 * T * (double)w[i]->n_rows * (double)w[i]->n_cols;
        f += fi;
        by += wbytes(w[i]) + 4.0 * T * (double)w[i]->n_rows;
        typed |= type_tc(b, w[i], T, fi) >= 0;
    }
    /* one launch for all of them, at the first weight's rate; on the GPU,
     * and on the CPU with a type's own efficiency, each weight's FLOPs at
     * its own */
    double tc_given = -1;
    if (typed) {
        const qi_sim_params *p = &S(b)->sim->par;
        for (int i = 0; i < n; i++) {
            const double fi = 2.0 * T * (double)w[i]->n_rows * (double)w[i]->n_cols, ti = type_tc(b, w[i], T, fi);
            tc += ti >= 0 ? ti : fi / (matmul_peak(b, w[i], T) * p->compute[0][0]);
        }
        tc_given = tc;
    }
    advance(b, 0, op_time_tc(b, 0, f, by, matmul_peak(b, w[0], T), tc_given));
}

static void sim_rmsnorm(qi_backend *b, const float *x, const float *w, int T, int n, float eps, float *y) {
    (void)x, (void)w, (void)eps, (void)y;
    run_op(b, 2, 4.0 * T * n, 8.0 * T * n + 4.0 * n, vec_peak(b));
}

static void sim_rope(qi_backend *b, float *q, int Hq, float *k, int Hk, int T, int D, int n_rot, const int32_t *pos,
                     float base, float freq_scale, int mode) {
    (void)q, (void)pos, (void)base, (void)freq_scale, (void)mode;
    const double heads = Hq + (k ? Hk : 0);
    run_op(b, 2, 6.0 * T * heads * n_rot, 8.0 * T * heads * D, vec_peak(b));
}

/* One attention call's FLOPs and bytes: every query head scores and
 * weighs its KV head's slots; each KV row (fp16) is read once per call. */
static void attn_cost(const qi_attn_paged_args *a, double *f, double *by) {
    double slots = 0;
    for (int hk = 0; hk < a->Hkv; hk++) slots += a->n_slots[hk];
    const double per_q = (double)a->H / a->Hkv;
    *f += 4.0 * a->T * per_q * slots * a->D;
    *by += 2.0 * 2.0 * slots * a->D + 8.0 * a->T * a->H * a->D + (a->stats ? 4.0 * a->H * slots / a->Hkv : 0);
}

static void sim_attention_paged(qi_backend *b, const qi_attn_paged_args *a) {
    double f = 0, by = 0;
    attn_cost(a, &f, &by);
    run_op(b, 1, f, by, S(b)->gpu ? S(b)->sim->prof.gpu_fp16_tensor.value : vec_peak(b));
}

static void sim_attention_paged_n(qi_backend *b, const qi_attn_paged_args *a, int n) {
    double f = 0, by = 0;
    for (int i = 0; i < n; i++) attn_cost(&a[i], &f, &by);
    run_op(b, 1, f, by, S(b)->gpu ? S(b)->sim->prof.gpu_fp16_tensor.value : vec_peak(b));
}

static void sim_attention_merge(qi_backend *b, const qi_attn_merge_args *a) {
    const double rd = (double)a->rows * a->D;
    run_op(b, 1, 4.0 * rd * a->n_parts, 4.0 * rd * (a->n_parts + 1) + 8.0 * a->rows * a->n_parts, vec_peak(b));
}

static void sim_glu(qi_backend *b, float *gate, const float *up, int T, int n) {
    (void)gate, (void)up;
    run_op(b, 2, 10.0 * T * n, 12.0 * T * n, vec_peak(b));
}

static void sim_get_rows(qi_backend *b, const qi_weight *w, const int32_t *ids, int T, float *out) {
    (void)ids, (void)out;
    run_op(b, 2, 2.0 * T * (double)w->n_cols, T * ((double)w->row_bytes + 4.0 * (double)w->n_cols), vec_peak(b));
}

static void sim_kv_write(qi_backend *b, const float *const *src, uint16_t *const *dst, int n, int D) {
    (void)src, (void)dst;
    run_op(b, 2, 0, 6.0 * n * D, vec_peak(b));
}

static void sim_add(qi_backend *b, float *x, const float *y, long n) {
    (void)x, (void)y;
    run_op(b, 2, (double)n, 12.0 * n, vec_peak(b));
}
static void sim_scale(qi_backend *b, float *x, long n, float s) {
    (void)x, (void)s;
    run_op(b, 2, (double)n, 8.0 * n, vec_peak(b));
}
static void sim_softcap(qi_backend *b, float *x, long n, float cap) {
    (void)x, (void)cap;
    run_op(b, 2, 20.0 * n, 8.0 * n, vec_peak(b));
}
static void sim_gather_rows(qi_backend *b, float *x, const int32_t *rows, int n, int width) {
    (void)x, (void)rows;
    run_op(b, 2, 0, 8.0 * n * width, vec_peak(b));
}

/* The optional ops (OPT, Falcon): a LayerNorm reads its rows twice in
 * registers (mean, then variance) and writes them once, with its weight and
 * bias; a bias add and an activation read and write their rows. */
static void sim_layernorm(qi_backend *b, const float *x, const float *w, const float *bias, int T, int n, float eps,
                          float *y) {
    (void)x, (void)w, (void)eps, (void)y;
    run_op(b, 2, 7.0 * T * n, 8.0 * T * n + (bias ? 8.0 : 4.0) * n, vec_peak(b));
}
static void sim_add_bias(qi_backend *b, float *x, const float *bias, int T, int n) {
    (void)x, (void)bias;
    run_op(b, 2, (double)T * n, 8.0 * T * n + 4.0 * n, vec_peak(b));
}
static void sim_act(qi_backend *b, bool gelu, float *x, int T, int n) {
    (void)x;
    run_op(b, 2, (gelu ? 10.0 : 1.0) * T * n, 8.0 * T * n, vec_peak(b));
}

static qi_status sim_reserve(qi_backend *b, size_t scratch_bytes, int max_rows, int max_pos, int Hkv, int D,
                             qi_err *err) {
    (void)b, (void)scratch_bytes, (void)max_rows, (void)max_pos, (void)Hkv, (void)D, (void)err;
    return QI_OK;
}

/* ---- memory, copies, events ---------------------------------------------------------- */

static void *sim_buf_mem(qi_backend *b, size_t n) {
    sim_dev *d = S(b);
    n = (n + SIM_ALIGN - 1) / SIM_ALIGN * SIM_ALIGN;
    void *mem = NULL;
    for (free_run **pp = &d->free; *pp && !mem; pp = &(*pp)->next)
        if ((*pp)->size == n) {
            free_run *r = *pp;
            *pp = r->next;
            mem = r->mem;
            qi_free(r);
            break;
        }
    bool bumped = false;
    if (!mem) {
        if (n > d->len - d->bump) return NULL;
        mem = d->base + d->bump;
        d->bump += n;
        bumped = true;
    }
    if (!size_put(d, mem, n)) {
        if (bumped) d->bump -= n;
        return NULL; /* device.c reports it as out of memory */
    }
    return mem;
}

static void sim_buf_release(qi_backend *b, void *mem) {
    sim_dev *d = S(b);
    const size_t n = size_take(d, mem);
    if (!n) return;
    if (!d->gpu) (void)madvise(mem, n, MADV_DONTNEED); /* pages the engine wrote go back */
    free_run *r = qi_calloc(1, sizeof *r);
    if (!r) return; /* the range is lost to reuse, nothing else */
    r->mem = mem;
    r->size = n;
    r->next = d->free;
    d->free = r;
}

/* Which way a copy goes: from or to this GPU's range, or the host. */
static bool in_dev(const sim_dev *d, const void *p) {
    return (const char *)p >= d->base && (const char *)p < d->base + d->len;
}

/* height rows of width bytes (pitches dpitch, spitch) as one copy: one
 * latency or launch, the bytes at the path's bandwidth; its duration (the
 * host's side of it done: zeros received, host bytes moved) */
double sim_copy_cost(qi_backend *b, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                     size_t height) {
    sim_dev *d = S(b);
    const qi_hwprofile *pr = &d->sim->prof;
    const qi_sim_params *p = &d->sim->par;
    const double n = (double)width * (double)height;
    double dur;
    if (!d->gpu) {
        /* host to host: the bytes are real (the engine reads what it copies
         * within host memory), at the host's bandwidth */
        for (size_t r = 0; r < height; r++) memmove((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
        dur = 2.0 * n / (pr->cpu_mem_bw.value * p->memory[0][2]);
    } else if (in_dev(d, dst) && in_dev(d, src)) {
        dur = 2.0 * n / (pr->gpu_mem_bw.value * p->memory[1][2]) + gpu_overhead(d->sim);
    } else if (in_dev(d, dst)) {
        dur = pr->link_latency.value + n / (pr->link_h2d_bw.value * p->link);
    } else {
        /* to the host: nothing was computed, so the host gets zeros */
        for (size_t r = 0; r < height; r++) memset((char *)dst + r * dpitch, 0, width);
        dur = pr->link_latency.value + n / (pr->link_d2h_bw.value * p->link);
    }
    return dur * noise(d->sim);
}

static void sim_copy_2d(qi_backend *b, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                        size_t height) {
    advance(b, QI_SIM_OP_CLASSES, sim_copy_cost(b, dst, dpitch, src, spitch, width, height));
}

static void sim_copy(qi_backend *b, void *dst, const void *src, size_t n) { sim_copy_2d(b, dst, n, src, n, n, 1); }

sim_clocks sim_clocks_of(qi_backend *b) {
    sim_dev *d = S(b);
    return (sim_clocks){.gpu = d->gpu, .host = &d->sim->host, .main = d->gpu ? &d->t : &d->sim->host,
                        .copy = d->gpu ? &d->tcopy : &d->sim->host, .busy_copies = &d->busy[QI_SIM_OP_CLASSES],
                        .copies = &d->sim->copies, .n_copies = &d->sim->n_ops[d->gpu][QI_SIM_OP_CLASSES]};
}

/* A marker completes when the stream reaches it, which is no earlier than
 * the host issued it: an idle GPU's clock is behind the host's. */
static void sim_mark(qi_backend *b, qi_event *ev) {
    sim_dev *d = S(b);
    if (d->gpu && d->t < d->sim->host) d->t = d->sim->host;
    qi_event_complete(ev, d->gpu ? d->t : d->sim->host);
}

static void sim_wait(qi_backend *b, qi_event *ev) {
    sim_dev *d = S(b);
    const double t = qi_event_time(ev);
    double *clk = d->gpu ? &d->t : &d->sim->host;
    if (t > *clk) *clk = t;
}

static void sim_drain(qi_backend *b) {
    sim_dev *d = S(b);
    if (d->gpu && d->t > d->sim->host) d->sim->host = d->t;
    if (d->gpu && d->tcopy > d->sim->host) d->sim->host = d->tcopy;
}

static void sim_host_wait(qi_backend *b, double t) {
    sim_dev *d = S(b);
    if (t > d->sim->host) d->sim->host = t;
}

/* Weights: a GPU holds an uploaded copy of the rows (the link's time); the
 * CPU computes on the model's own. */
static size_t sim_weight_size(qi_backend *b, const qi_weight *w, bool matmul) {
    (void)matmul;
    return S(b)->gpu ? (size_t)wbytes(w) : 0;
}

static void sim_weight_prepare(qi_backend *b, const qi_weight *w, bool matmul, void *mem, qi_weight *out) {
    (void)matmul;
    if (S(b)->gpu) {
        sim_dev *d = S(b);
        const qi_hwprofile *pr = &d->sim->prof;
        advance(b, QI_SIM_OP_CLASSES,
                pr->link_latency.value + wbytes(w) / (pr->link_h2d_bw.value * d->sim->par.link));
    }
    out->data = mem;
    out->packed = NULL;
}

static void sim_free(qi_backend *b) {
    sim_dev *d = S(b);
    if (d) {
        if (d->base) munmap(d->base, d->len);
        qi_free(d->key);
        qi_free(d->val);
        while (d->free) {
            free_run *r = d->free;
            d->free = r->next;
            qi_free(r);
        }
        qi_free(d);
    }
    qi_free(b);
}

static const qi_backend_i k_sim_iface = {
    .version = QI_BACKEND_VERSION,
    .name = "sim",
    .matmul = sim_matmul,
    .matmul_n = sim_matmul_n,
    .rmsnorm = sim_rmsnorm,
    .rope = sim_rope,
    .attention_paged = sim_attention_paged,
    .attention_paged_n = sim_attention_paged_n,
    .attention_merge = sim_attention_merge,
    .swiglu = sim_glu,
    .geglu = sim_glu,
    .get_rows = sim_get_rows,
    .kv_write = sim_kv_write,
    .add = sim_add,
    .scale = sim_scale,
    .softcap = sim_softcap,
    .gather_rows = sim_gather_rows,
    .reserve = sim_reserve,
    .free = sim_free,
    .buf_mem = sim_buf_mem,
    .buf_release = sim_buf_release,
    .copy = sim_copy,
    .copy_2d = sim_copy_2d,
    .mark = sim_mark,
    .wait = sim_wait,
    .drain = sim_drain,
    .weight_size = sim_weight_size,
    .weight_prepare = sim_weight_prepare,
    .host_wait = sim_host_wait,
    .layernorm = sim_layernorm,
    .add_bias = sim_add_bias,
    .act = sim_act,
    .cs_copy = sim_cs_copy,
    .cs_copy_2d = sim_cs_copy_2d,
    .cs_mark = sim_cs_mark,
    .cs_wait = sim_cs_wait,
};

qi_status qi_backend_sim_create(qi_sim *s, bool gpu, size_t capacity, qi_backend **out, qi_err *err) {
    *out = NULL;
    const qi_hwprofile *pr = &s->prof;
    if (gpu && !pr->has_gpu)
        return QI_ERR(err, QI_ERR_INVALID, "sim: profile %s has no GPU (kind %s)", pr->name, pr->kind);
    size_t cap = (size_t)(gpu ? pr->gpu_mem_bytes.value : pr->cpu_mem_bytes.value);
    if (capacity && capacity < cap) cap = capacity;
    qi_backend *b = qi_calloc(1, sizeof *b);
    sim_dev *d = qi_calloc(1, sizeof *d);
    if (!b || !d) {
        qi_free(b);
        qi_free(d);
        return QI_ERR(err, QI_ERR_NOMEM, "out of memory creating a simulated device");
    }
    d->sim = s;
    d->gpu = gpu;
    b->iface = &k_sim_iface;
    b->ctx = d;
    b->info = (qi_dev_info){.kind = QI_DEV_SIM, .capacity = cap, .host_visible = !gpu};
    snprintf(b->info.name, sizeof b->info.name, "%s", gpu ? "gpu" : "cpu");
    /* the address range its buffers come from: no memory behind it until
     * written (the CPU's), none ever (the GPU's: no access at all) */
    /* capacity is device.c's to count; the range only has to outlast the
     * churn of buffers of many sizes (freed ranges are reused by exact
     * size), so it is larger: address space, not memory */
    d->len = (size_t)1 << 42;
    if (d->len < 2 * cap) d->len = (2 * cap + SIM_ALIGN - 1) / SIM_ALIGN * SIM_ALIGN;
    void *base = mmap(NULL, d->len, gpu ? PROT_NONE : PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED) {
        sim_free(b);
        return QI_ERR(err, QI_ERR_NOMEM, "sim: cannot reserve %zu bytes of address space for the simulated %s's memory",
                      cap, gpu ? "GPU" : "CPU");
    }
    d->base = base;
    *out = b;
    return QI_OK;
}

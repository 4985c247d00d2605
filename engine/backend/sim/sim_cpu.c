/* sim_cpu.c - the simulated host CPU's machine model for matmuls
 * (sim_cpu.h; sim/README.md, "The CPU's machine model").
 *
 * A CPU matmul of weights W_i (R_i x C_i, B_i bytes) over T tokens takes
 *
 *     tm = sum B_i (h / bw_llc + (1 - h) / bw_dram) + 4 T (R + C) / bw_llc
 *     tc = sum 2 R_i C_i (T + ceil(T / 32) cpu_unpack x u(type_i))
 *                        / (peak x cpu_matmul_compute)
 *     t  = max(tc, tm) + (1 - cpu_matmul_overlap) min(tc, tm) + cpu_op_s
 *
 * - bw_dram = cpu.mem_bw x cpu_dram_memory: the profile's measured read
 *   bandwidth, the share a dequantising dot product's stream reaches.
 * - bw_llc = cpu.llc_bw x cpu_llc_memory, where the profile measured its
 *   last-level cache's read rate (else bw_dram: no cache term).
 * - h, the share of a weight's bytes the last-level cache serves: the
 *   weights the CPU computes with are re-read every step, so they stay in
 *   the cache when their working set S (every distinct weight seen so
 *   far) fits its usable part L = cpu.llc x cpu_llc_share (shared with
 *   the other cores and tenants, the KV cache and the activations): h = 1;
 *   past it a cyclic stream keeps about L / S of itself.
 * - The row kernels unpack a block of weights once per call of up to 32
 *   tokens (the CPU backend's MM_TOKEN_BLOCK) and dot it with each token
 *   of the call: the unpacking is paid ceil(T / 32) times, the dot T
 *   times.
 * - u(type), the format's unpacking work per weight (qi_sim_cpu_unpack_ops
 *   below), weighs the per-weight cost of the dot product: a 4-bit
 *   format's nibbles are split, a 5- or 6-bit one's high bits merged, a
 *   K-quant's sub-block scales decoded. One coefficient (cpu_unpack) for
 *   every format, so a type the fit never saw is predicted from its
 *   layout; a type with an efficiency of its own (cpu_matmul_compute_TYPE:
 *   the float types, whose dot products run on the FMA units rather than
 *   the int8 ones) takes that instead.
 * - peak: cpu.int8 for a quantised weight where the profile gives it,
 *   else cpu.fp32 (the probe's FMA rate); the share cpu_matmul_compute,
 *   or on the kernels' tiled path (qi_sim_cpu_tiled: q4_K and q6_K from
 *   8 tokens, each unpacked block reused across a tile of tokens and its
 *   activations across a tile of rows) cpu_matmul_tiled where set.
 * - bw_llc is at least bw_dram: the cache is never slower than DRAM.
 *
 * The tiled path is costed apart: its kernels (gemm_wide; on AMX tiles
 * where the CPU has them) rearrange each block of the weights once per
 * call into the tile layout, for every token of the call, then multiply
 * tiles. So its compute is a part per weight and a part per token:
 *
 *     tc = sum 2 R_i C_i (cpu_tile_unpack + T x parts(type_i) / cpu_matmul_tiled) / peak
 *
 * with parts (qi_sim_cpu_tile_parts) the tile products a token's dot over a
 * block takes (q4_K's 6-bit scales split into two 3-bit digits, q6_K's
 * signed 8-bit ones into three, so that every byte of a tile stays within
 * int8). At a decode step's 16 tokens the unpacking outweighs the
 * products; over a prompt's hundreds the products take over.
 *
 * Threads: the profile's probes (peak, read rates) ran on every core, so a
 * run of n threads computes at share(n) = min(n, cpu.cores) / cpu.cores of
 * every peak (qi_sim_cpu_thread_share), and reads at min(1, n x
 * cpu_thread_memory) of every read rate (qi_sim_cpu_thread_mem), its
 * matmuls and its other ops alike, while the machine model is on (a CPU
 * calibrated for it; the class roofline of an uncalibrated one is the
 * profile's whole CPU whatever the threads).
 */
#include "sim_cpu.h"

#include <math.h>

#include "kernels/kernels.h"
#include "qinfer/types.h"

bool qi_sim_cpu_on(const qi_sim_params *p) { return p->cpu_dram_memory > 0; }

double qi_sim_cpu_unpack_ops(uint32_t type) {
    switch (type) {
    case QI_TYPE_F32:
        return 0; /* the value is read as is */
    case QI_TYPE_Q8_0:
        return 0; /* the int8 lane is the value; one scale per 32 */
    case QI_TYPE_BF16:
        return 0.5; /* a shift into an fp32 lane */
    case QI_TYPE_F16:
        return 1; /* a conversion to fp32 */
    case QI_TYPE_Q4_0:
    case QI_TYPE_Q4_1:
        return 1; /* a nibble: a mask or a shift */
    case QI_TYPE_Q5_0:
    case QI_TYPE_Q5_1:
        return 2; /* a nibble, and its fifth bit from qh spread and or-ed in */
    case QI_TYPE_Q2_K:
    case QI_TYPE_Q4_K:
        return 1.5; /* a bit-field, and a sub-block's 6-bit scale and min from 12 packed bytes */
    case QI_TYPE_Q3_K:
    case QI_TYPE_Q5_K:
    case QI_TYPE_Q6_K:
        return 2.5; /* low bits and high bits merged, and the sub-block scales */
    default:
        return -1;
    }
}

double qi_sim_cpu_tile_parts(uint32_t type) {
    return type == QI_TYPE_Q4_K ? 2 : type == QI_TYPE_Q6_K ? 3 : 1;
}

double qi_sim_cpu_thread_share(const qi_hwprofile *pr, const qi_sim_params *p) {
    const double cores = pr->cpu_cores.set && pr->cpu_cores.value >= 1 ? pr->cpu_cores.value : 0;
    if (!qi_sim_cpu_on(p) || p->cpu_threads < 1 || !(cores > 0)) return 1;
    return p->cpu_threads >= cores ? 1 : p->cpu_threads / cores;
}

double qi_sim_cpu_thread_mem(const qi_sim_params *p) {
    if (!qi_sim_cpu_on(p) || p->cpu_threads < 1 || !(p->cpu_thread_memory > 0)) return 1;
    const double m = p->cpu_threads * p->cpu_thread_memory;
    return m < 1 ? m : 1;
}

/* Add w to the working set (a weight counted once, by its rows' address). */
static void ws_add(qi_sim_cpu_ws *ws, const qi_weight *w) {
    const void *key = w->data;
    if (!key) return;
    size_t j = (size_t)(((uintptr_t)key >> 6) * 0x9e3779b97f4a7c15ull >> 40) & (QI_SIM_CPU_WS_SLOTS - 1);
    for (size_t k = 0; k < QI_SIM_CPU_WS_SLOTS; k++, j = (j + 1) & (QI_SIM_CPU_WS_SLOTS - 1)) {
        if (ws->seen[j] == key) return;
        if (!ws->seen[j]) {
            /* a full table keeps counting the bytes, its later weights
             * treated as new every time: a set past the cache anyway */
            if (ws->n + 1 < QI_SIM_CPU_WS_SLOTS) ws->seen[j] = key, ws->n++;
            break;
        }
    }
    ws->bytes += (double)w->row_bytes * (double)w->n_rows;
}

static bool is_quant(uint32_t t) {
    return t != QI_TYPE_F32 && t != QI_TYPE_F16 && t != QI_TYPE_BF16;
}

/* The engine's kernels take a tiled path (gemm_wide: a tile of rows
 * against a tile of tokens, each unpacked block reused across the tokens)
 * for q4_K and q6_K from QI_K_WIDE_MIN tokens, on AVX2 and AVX-512 alike
 * (kernels/kernels.h); every other type, and fewer tokens, a row at a time. */
bool qi_sim_cpu_tiled(uint32_t type, int T) {
    return T >= QI_K_WIDE_MIN && (type == QI_TYPE_Q4_K || type == QI_TYPE_Q6_K);
}

double qi_sim_cpu_matmul_s(qi_sim_cpu_ws *ws, const qi_hwprofile *pr, const qi_sim_params *p,
                           const qi_weight *const *w, int n, int T) {
    for (int i = 0; i < n; i++) ws_add(ws, w[i]);
    const double thr = qi_sim_cpu_thread_share(pr, p), thm = qi_sim_cpu_thread_mem(p);
    const double bw_dram = pr->cpu_mem_bw.value * p->cpu_dram_memory * thm;
    const bool llc = pr->cpu_llc.set && pr->cpu_llc_bw.set && p->cpu_llc_memory > 0 && p->cpu_llc_share > 0;
    /* the cache is never slower than the memory behind it */
    const double bw_llc = llc ? fmax(pr->cpu_llc_bw.value * p->cpu_llc_memory * thm, bw_dram) : bw_dram;
    double h = 0;
    if (llc) {
        const double L = pr->cpu_llc.value * p->cpu_llc_share;
        h = ws->bytes <= L ? 1 : L / ws->bytes;
    }
    double tm = 0, tc = 0, rows = 0;
    for (int i = 0; i < n; i++) {
        const qi_weight *wi = w[i];
        const double b = (double)wi->row_bytes * (double)wi->n_rows;
        tm += b * (h / bw_llc + (1 - h) / bw_dram);
        rows += (double)wi->n_rows;
        const double f = 2.0 * T * (double)wi->n_rows * (double)wi->n_cols;
        const uint32_t t = wi->type;
        const double peak = thr * (is_quant(t) && pr->cpu_int8.set ? pr->cpu_int8.value : pr->cpu_fp32.value);
        const double own = t < QI_TYPE_COUNT ? p->cpu_matmul_type[t] : 0;
        double u = qi_sim_cpu_unpack_ops(t);
        if (u < 0) u = 1; /* a type the CPU does not compute with: as a 4-bit one */
        if (own > 0) {
            tc += f / (peak * own);
        } else if (qi_sim_cpu_tiled(t, T) && p->cpu_matmul_tiled > 0) {
            const double wts = (double)wi->n_rows * (double)wi->n_cols;
            tc += (2.0 * wts * p->cpu_tile_unpack + f * qi_sim_cpu_tile_parts(t) / p->cpu_matmul_tiled) / peak;
        } else {
            const double wts = (double)wi->n_rows * (double)wi->n_cols, calls = ceil(T / 32.0);
            tc += 2.0 * wts * (T + calls * p->cpu_unpack * u) / (peak * p->compute[0][0]);
        }
    }
    tm += 4.0 * T * ((double)w[0]->n_cols + rows) / bw_llc;
    const double hi = tc > tm ? tc : tm, lo = tc > tm ? tm : tc;
    return hi + (1 - p->cpu_matmul_overlap) * lo + p->cpu_op_s;
}

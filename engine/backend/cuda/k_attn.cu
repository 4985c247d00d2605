/* k_attn.cu - the CUDA device's paged attention and the merge of partial
 * results.
 *
 * Attention follows the CPU backend's attp_one (backend_cpu.c) in three
 * modes: whole (out, and stats when given), partial (out over the call's
 * slots with part_m and part_l) and statistics-only (stats against tot_m
 * and tot_l, no out). The arithmetic is the CPU's where it costs nothing:
 * the query is rounded to fp16 as ggml rounds the matmul's operand, the
 * exponentials are ggml's (qk_expf_ggml), the weights are e * (float)(1 /
 * sum) rounded to fp16, and the statistics are added query by query in
 * query order, so they are the CPU's sums of the same weights. What
 * differs is the order of the fp32 sums of the dot products and of the
 * weighted values, and the order of the double sum of exponentials.
 *
 * Kernel k_attn: one block of ATT_THREADS threads per (query t, head h),
 * blockIdx.x = t * H + h. The query goes to shared memory; each warp
 * scores slots i = warp, warp + n_warps, ... (lanes over d, a K row read
 * as D contiguous fp16, a warp-shuffle sum; masked slots -inf without
 * reading K, and skipped for V: they have weight 0) into the scratch row
 * [t][h][max_slots]; a block reduction gives the max, a second one the sum
 * of exponentials (double); the weights, fp16-rounded, overwrite the
 * scores. For the values the block is G = ATT_THREADS / min(D,
 * ATT_THREADS) groups of min(D, ATT_THREADS) threads: group g sums slots
 * i = g, g + G, ... with each thread on columns d (a V row read
 * coalesced), and the groups' sums are added in group order. Decode (T =
 * 1, many slots) thus spreads a head's slots over the whole block.
 *
 * Statistics (whole and statistics-only calls): k_attn leaves every
 * query's fp16-rounded weights in the scratch (0 for masked slots and for
 * queries that see nothing), and k_attn_stats then adds them, one thread
 * per (head, slot), over t = 0..T-1 in order: no atomics, the same sums
 * run to run, and the CPU's order of additions.
 *
 * Scratch: T * H * max_slots floats (qi_cuk_attn_scratch).
 *
 * Merge (k_merge): one block per row, the parts' weights l_p exp(m_p - M)
 * and their sum in double by every thread (at most 8 parts), then threads
 * over d: the CPU's attention_merge formula, a row only one part sees
 * copied from it.
 */
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "k_internal.h"
#include "k_launch.cuh"
#include "k_math.cuh"

#define ATT_THREADS 256
#define ATT_WARPS (ATT_THREADS / 32)
#define ATT_MAX_D 1024
#define ATT_MAX_COLS (ATT_MAX_D / ATT_THREADS) /* columns per thread when D > ATT_THREADS */
#define STATS_THREADS 256
#define MERGE_THREADS 128


__device__ __forceinline__ float h16(uint16_t h) { return __half2float(__ushort_as_half(h)); }

/* The block-wide max of v (every thread gets it). */
__device__ float block_max(float v, float *red) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads(); /* red may still be read from a previous reduction */
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float m = red[0];
    for (int k = 1; k < ATT_WARPS; k++) m = fmaxf(m, red[k]);
    return m;
}

/* The block-wide sum of v, in a fixed order (every thread gets it). */
__device__ double block_sum(double v, double *red) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    double s = 0.0;
    for (int k = 0; k < ATT_WARPS; k++) s += red[k];
    return s;
}

__global__ void __launch_bounds__(ATT_THREADS) k_attn(qi_cuk_attn a, float *scr) {
    __shared__ float qs[ATT_MAX_D];
    __shared__ float vred[ATT_MAX_D];
    __shared__ float fred[ATT_WARPS];
    __shared__ double dred[ATT_WARPS];

    const int H = a.H, D = a.D;
    const long th = blockIdx.x; /* t * H + h */
    const int t = (int)(th / H), h = (int)(th % H);
    const int hk = h / (H / a.Hkv);
    const int s0 = a.slot_off[hk], n = a.slot_off[hk + 1] - s0;
    const int32_t *pos = a.pos + s0;
    const uint16_t *const *kb = a.kb + a.blk_off[hk];
    const uint16_t *const *vb = a.vb + a.blk_off[hk];
    const int mask = (1 << a.shift) - 1;
    const int32_t qpos = a.q_pos[t];
    float *s = scr + th * (long)a.max_slots;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

    /* the query, rounded to fp16 as the CPU rounds it */
    for (int d = threadIdx.x; d < D; d += blockDim.x) qs[d] = qk_round_f16(a.q[th * D + d]);
    __syncthreads();

    /* scores: a warp per slot; a masked slot's dot product is skipped
     * (half of a causal prompt's) */
    float mx = -INFINITY;
    for (int i = warp; i < n; i += ATT_WARPS) {
        const int32_t p = pos[i];
        if (p > qpos || (a.n_swa > 0 && qpos - p >= a.n_swa)) {
            if (lane == 0) s[i] = -INFINITY;
            continue;
        }
        const uint16_t *kr = kb[i >> a.shift] + (size_t)(i & mask) * D;
        float acc = 0.0f;
        if ((D & 1) == 0) {
            const __half2 *k2 = (const __half2 *)kr;
            for (int d2 = lane; d2 < D / 2; d2 += 32) {
                const float2 kf = __half22float2(k2[d2]);
                acc = fmaf(kf.x, qs[2 * d2], acc);
                acc = fmaf(kf.y, qs[2 * d2 + 1], acc);
            }
        } else {
            for (int d = lane; d < D; d += 32) acc = fmaf(h16(kr[d]), qs[d], acc);
        }
        for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
        if (lane == 0) {
            const float sc = qk_mul(acc, a.scale);
            s[i] = sc;
            mx = fmaxf(mx, sc);
        }
    }
    mx = block_max(mx, fred); /* its barriers also publish s */

    const bool stats_only = a.tot_m != NULL;
    float m;
    double l;
    if (stats_only) {
        m = a.tot_m[th];
        l = (double)a.tot_l[th];
        if (!(l > 0.0)) { /* the query sees nothing in any part: no weight */
            for (int i = threadIdx.x; i < n; i += blockDim.x) s[i] = 0.0f;
            return;
        }
    } else {
        m = mx;
        if (m == -INFINITY) { /* nothing this query sees */
            for (int i = threadIdx.x; i < n; i += blockDim.x) s[i] = 0.0f;
            for (int d = threadIdx.x; d < D; d += blockDim.x) a.out[th * D + d] = 0.0f;
            if (a.part_m && threadIdx.x == 0) {
                a.part_m[th] = -INFINITY;
                a.part_l[th] = 0.0f;
            }
            return;
        }
        double part = 0.0;
        for (int i = threadIdx.x; i < n; i += blockDim.x) {
            const float e = qk_expf_ggml(qk_sub(s[i], m));
            s[i] = e;
            part += (double)e;
        }
        l = block_sum(part, dred);
        if (a.part_m && threadIdx.x == 0) {
            a.part_m[th] = m;
            a.part_l[th] = (float)l;
        }
    }
    const float inv = (float)(1.0 / l);
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float e = stats_only ? qk_expf_ggml(qk_sub(s[i], m)) : s[i];
        s[i] = qk_round_f16(qk_mul(e, inv));
    }
    if (stats_only) return;
    __syncthreads();

    /* values: G groups of gs threads, group g over slots g, g + G, ... */
    const int gs = D < ATT_THREADS ? D : ATT_THREADS, G = ATT_THREADS / gs;
    const int g = threadIdx.x / gs, c = threadIdx.x % gs;
    float acc[ATT_MAX_COLS] = {0.0f};
    if (g < G) {
        for (int i = g; i < n; i += G) {
            const float w = s[i];
            if (w == 0.0f) continue;
            const uint16_t *vr = vb[i >> a.shift] + (size_t)(i & mask) * D;
#pragma unroll
            for (int k = 0; k < ATT_MAX_COLS; k++) {
                const int d = c + k * gs;
                if (d < D) acc[k] = fmaf(h16(vr[d]), w, acc[k]);
            }
        }
#pragma unroll
        for (int k = 0; k < ATT_MAX_COLS; k++) {
            const int d = c + k * gs;
            if (d < D) vred[g * D + d] = acc[k];
        }
    }
    __syncthreads();
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        float o = vred[d];
        for (int k = 1; k < G; k++) o = qk_add(o, vred[k * D + d]);
        a.out[th * D + d] = o;
    }
}

/* stats[h][i] += the weights of slot i for head h, t = 0..T-1 in order. */
__global__ void k_attn_stats(qi_cuk_attn a, const float *scr, int chunks) {
    const int h = blockIdx.x / chunks;
    const int i = (blockIdx.x % chunks) * blockDim.x + threadIdx.x;
    const int hk = h / (a.H / a.Hkv);
    const int n = a.slot_off[hk + 1] - a.slot_off[hk];
    if (i >= n) return;
    float *st = a.stats + (long)h * a.stats_stride + i;
    float acc = *st;
    for (int t = 0; t < a.T; t++) acc = qk_add(acc, scr[((long)t * a.H + h) * a.max_slots + i]);
    *st = acc;
}

extern "C" size_t qi_cuk_attn_scratch(int max_T, int H, int max_pos) {
    if (max_T <= 0 || H <= 0 || max_pos <= 0) return 0;
    return sizeof(float) * (size_t)max_T * (size_t)H * (size_t)max_pos;
}

extern "C" int qi_cuk_attention(const qi_cuk_ctx *c, const qi_cuk_attn *a, const char **what) {
    if (a->T <= 0 || a->H <= 0) return 0;
    if (a->D <= 0 || a->D > ATT_MAX_D || a->Hkv <= 0 || a->H % a->Hkv != 0 || a->max_slots < 0 || a->shift < 0 ||
        a->shift > 30 || (a->part_m && (!a->part_l || a->stats || a->tot_m)) ||
        (a->tot_m && (!a->tot_l || !a->stats)))
        return refuse("attention", what);
    const size_t need = qi_cuk_attn_scratch(a->T, a->H, a->max_slots);
    if (need > c->scratch_bytes || (need && !c->scratch)) return refuse("attention scratch", what);
    cudaStream_t st = (cudaStream_t)c->stream;
    float *scr = (float *)c->scratch;
    k_attn<<<(unsigned)((long)a->T * a->H), ATT_THREADS, 0, st>>>(*a, scr);
    int e = launched("attention", what);
    if (e || !a->stats || a->max_slots == 0) return e;
    const int chunks = (a->max_slots + STATS_THREADS - 1) / STATS_THREADS;
    k_attn_stats<<<(unsigned)((long)a->H * chunks), STATS_THREADS, 0, st>>>(*a, scr, chunks);
    return launched("attention stats", what);
}

/* ---- merge ------------------------------------------------------------------------- */

__global__ void k_merge(qi_cuk_merge a) {
    const long r = blockIdx.x;
    const int D = a.D, P = a.n_parts;
    float M = -INFINITY;
    int seen = 0, only = -1;
    for (int p = 0; p < P; p++) {
        const float l = a.l[p][r];
        if (l > 0.0f) {
            M = fmaxf(M, a.m[p][r]);
            seen++;
            only = p;
        }
    }
    float *out = a.out + r * D;
    double L = 0.0;
    if (seen == 1) {
        const float *o = a.o[only] + r * D;
        for (int d = threadIdx.x; d < D; d += blockDim.x) out[d] = o[d];
        L = a.l[only][r];
    } else if (seen > 1) {
        double w[QI_CUK_MAX_PARTS];
        for (int p = 0; p < P; p++) {
            const float l = a.l[p][r];
            w[p] = l > 0.0f ? (double)l * exp((double)a.m[p][r] - (double)M) : 0.0;
            L += w[p];
        }
        for (int d = threadIdx.x; d < D; d += blockDim.x) {
            double acc = 0.0;
            for (int p = 0; p < P; p++)
                if (w[p] != 0.0) acc = __dadd_rn(acc, __dmul_rn(w[p], (double)a.o[p][r * D + d]));
            out[d] = (float)(acc / L);
        }
    } else {
        for (int d = threadIdx.x; d < D; d += blockDim.x) out[d] = 0.0f;
    }
    if (threadIdx.x == 0) {
        if (a.tot_m) a.tot_m[r] = M;
        if (a.tot_l) a.tot_l[r] = (float)L;
    }
}

extern "C" int qi_cuk_attn_merge(const qi_cuk_ctx *c, const qi_cuk_merge *a, const char **what) {
    if (a->rows <= 0) return 0;
    if (a->D <= 0 || a->n_parts < 1 || a->n_parts > QI_CUK_MAX_PARTS) return refuse("attention merge", what);
    k_merge<<<(unsigned)a->rows, MERGE_THREADS, 0, (cudaStream_t)c->stream>>>(*a);
    return launched("attention merge", what);
}

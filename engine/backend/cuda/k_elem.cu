/* k_elem.cu - the CUDA device's row-wise and element-wise ops.
 *
 * Each op is the same op of the backend interface (backend.h) with the CPU
 * backend's arithmetic where it costs nothing (k_math.cuh): RMSNorm sums
 * the squares in double and scales as the CPU does, RoPE computes its
 * angles by the CPU's iterated product and rotates with the CPU's fused
 * and unfused pairs, SwiGLU uses ggml's exponential on a row's whole
 * 16-element chunks, kv_write rounds to nearest even. What differs:
 * RMSNorm's double sum is added in another order; sine, cosine, tanh and
 * the C library's exp are CUDA's (within an ulp or two of glibc's); GeGLU
 * computes gelu_tanh in fp32 where the CPU looks up ggml's fp16 table.
 *
 * Shapes: one block per row for rmsnorm (256 threads, a block reduction)
 * and rope (the row's angles in shared memory, then the (head, pair)
 * rotations of q and k), one per row for kv_write, grid-stride loops for
 * the element-wise ops. gather_rows copies through c->scratch, since rows
 * gathered in place in parallel would read rows already overwritten.
 * Nothing synchronises; every launch is checked with cudaGetLastError.
 */
#include <cuda_runtime.h>

#include "k_internal.h"
#include "k_launch.cuh"
#include "k_math.cuh"

#define ELEM_THREADS 256
#define ELEM_MAX_BLOCKS 4096
#define ROPE_MAX_PAIRS 512

static cudaStream_t stream_of(const qi_cuk_ctx *c) { return (cudaStream_t)c->stream; }


static unsigned grid_for(long n) {
    const long b = (n + ELEM_THREADS - 1) / ELEM_THREADS;
    return (unsigned)(b < ELEM_MAX_BLOCKS ? (b > 0 ? b : 1) : ELEM_MAX_BLOCKS);
}

/* ---- RMSNorm ------------------------------------------------------------------ */

/* y = (x * (1 / sqrt(mean(x^2) + eps))) * w, one block per row; every
 * thread reads its elements before the reduction's barrier and writes the
 * same elements after it, so y may alias x. */
__global__ void k_rmsnorm(const float *x, const float *w, int n, float eps, float *y) {
    __shared__ double part[ELEM_THREADS / 32];
    const long row = blockIdx.x;
    const float *xr = x + row * n;
    float *yr = y + row * n;
    double sum = 0.0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float v = xr[i];
        sum += (double)qk_mul(v, v);
    }
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    if (lane == 0) part[warp] = sum;
    __syncthreads();
    double tot = 0.0;
    for (int k = 0; k < nw; k++) tot += part[k];
    const float scale = 1.0f / sqrtf((float)(tot / n) + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) yr[i] = qk_mul(qk_mul(xr[i], scale), w[i]);
}

extern "C" int qi_cuk_rmsnorm(const qi_cuk_ctx *c, const float *x, const float *w, int T, int n, float eps, float *y,
                              const char **what) {
    if (T <= 0 || n <= 0) return 0;
    k_rmsnorm<<<T, ELEM_THREADS, 0, stream_of(c)>>>(x, w, n, eps, y);
    return launched("rmsnorm", what);
}

/* ---- RoPE --------------------------------------------------------------------- */

/* One block per row t: the row's cosines and sines (pairs < n_pairs) in
 * shared memory, then every (head, pair) of q's Hq heads and k's Hk. */
__global__ void k_rope(float *q, int Hq, float *k, int Hk, int D, int n_pairs, const int32_t *pos,
                       float theta_scale, float freq_scale, int neox) {
    __shared__ float cs[ROPE_MAX_PAIRS], sn[ROPE_MAX_PAIRS];
    const long t = blockIdx.x;
    const int32_t p = pos[t];
    for (int i = threadIdx.x; i < n_pairs; i += blockDim.x) {
        const float th = qk_rope_theta(p, i, theta_scale, freq_scale);
        cs[i] = cosf(th);
        sn[i] = sinf(th);
    }
    __syncthreads();
    const int n_fused = neox ? n_pairs : n_pairs / 4 * 4;
    const int items = (Hq + Hk) * n_pairs;
    for (int it = threadIdx.x; it < items; it += blockDim.x) {
        const int h = it / n_pairs, i = it % n_pairs;
        float *v = h < Hq ? q + (t * Hq + h) * D : k + (t * Hk + (h - Hq)) * D;
        const int a = neox ? i : 2 * i, b = neox ? i + n_pairs : 2 * i + 1;
        float y0, y1;
        qk_rope_pair(v[a], v[b], cs[i], sn[i], i < n_fused, &y0, &y1);
        v[a] = y0;
        v[b] = y1;
    }
}

extern "C" int qi_cuk_rope(const qi_cuk_ctx *c, float *q, int Hq, float *k, int Hk, int T, int D, int n_rot,
                           const int32_t *pos, float base, float freq_scale, int mode, const char **what) {
    if (T <= 0 || n_rot <= 0) return 0;
    if (n_rot % 2 != 0 || n_rot > D || n_rot / 2 > ROPE_MAX_PAIRS) return refuse("rope", what);
    /* the host's powf, as the CPU backend computes it */
    const float theta_scale = powf(base, -2.0f / (float)n_rot);
    k_rope<<<T, ELEM_THREADS, 0, stream_of(c)>>>(q, Hq, k, k ? Hk : 0, D, n_rot / 2, pos, theta_scale, freq_scale,
                                                 mode == 1);
    return launched("rope", what);
}

/* ---- GLU ---------------------------------------------------------------------- */

__global__ void k_swiglu(float *gate, const float *up, long total, int n) {
    const int nv = n & ~15;
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (long)gridDim.x * blockDim.x)
        gate[i] = qk_swiglu(gate[i], up[i], (int)(i % n) < nv);
}

__global__ void k_geglu(float *gate, const float *up, long total) {
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (long)gridDim.x * blockDim.x)
        gate[i] = qk_geglu(gate[i], up[i]);
}

extern "C" int qi_cuk_glu(const qi_cuk_ctx *c, int gelu, float *gate, const float *up, int T, int n,
                          const char **what) {
    const long total = (long)T * n;
    if (T <= 0 || n <= 0) return 0;
    if (gelu) {
        k_geglu<<<grid_for(total), ELEM_THREADS, 0, stream_of(c)>>>(gate, up, total);
        return launched("geglu", what);
    }
    k_swiglu<<<grid_for(total), ELEM_THREADS, 0, stream_of(c)>>>(gate, up, total, n);
    return launched("swiglu", what);
}

/* ---- KV rows into the cache ----------------------------------------------------- */

__global__ void k_kv_write(const float *const *src, uint16_t *const *dst, int D) {
    const float *s = src[blockIdx.x];
    uint16_t *d = dst[blockIdx.x];
    for (int i = threadIdx.x; i < D; i += blockDim.x) d[i] = qk_f2h(s[i]);
}

extern "C" int qi_cuk_kv_write(const qi_cuk_ctx *c, const float *const *src, uint16_t *const *dst, int n, int D,
                               const char **what) {
    if (n <= 0 || D <= 0) return 0;
    k_kv_write<<<n, D < ELEM_THREADS ? (D + 31) / 32 * 32 : ELEM_THREADS, 0, stream_of(c)>>>(src, dst, D);
    return launched("kv_write", what);
}

/* ---- element-wise ---------------------------------------------------------------- */

__global__ void k_add(float *x, const float *y, long n) {
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x)
        x[i] = qk_add(x[i], y[i]);
}

__global__ void k_scale(float *x, long n, float s) {
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x)
        x[i] = qk_mul(x[i], s);
}

/* x[t][i] += bias[i] (a matmul's bias): one f32 add per element, as the CPU */
__global__ void k_add_bias(float *x, const float *bias, long n, int width) {
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x)
        x[i] = qk_add(x[i], bias[i % width]);
}

/* cap * tanh(x / cap) as the CPU: tanhf(x * (1 / cap)) * cap */
__global__ void k_softcap(float *x, long n, float inv, float cap) {
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x)
        x[i] = qk_mul(tanhf(qk_mul(x[i], inv)), cap);
}

extern "C" int qi_cuk_add(const qi_cuk_ctx *c, float *x, const float *y, long n, const char **what) {
    if (n <= 0) return 0;
    k_add<<<grid_for(n), ELEM_THREADS, 0, stream_of(c)>>>(x, y, n);
    return launched("add", what);
}

extern "C" int qi_cuk_scale(const qi_cuk_ctx *c, float *x, long n, float s, const char **what) {
    if (n <= 0) return 0;
    k_scale<<<grid_for(n), ELEM_THREADS, 0, stream_of(c)>>>(x, n, s);
    return launched("scale", what);
}

extern "C" int qi_cuk_add_bias(const qi_cuk_ctx *c, float *x, const float *bias, int T, int n, const char **what) {
    if (T <= 0 || n <= 0) return 0;
    const long total = (long)T * n;
    k_add_bias<<<grid_for(total), ELEM_THREADS, 0, stream_of(c)>>>(x, bias, total, n);
    return launched("add_bias", what);
}

extern "C" int qi_cuk_softcap(const qi_cuk_ctx *c, float *x, long n, float cap, const char **what) {
    if (n <= 0) return 0;
    k_softcap<<<grid_for(n), ELEM_THREADS, 0, stream_of(c)>>>(x, n, 1.0f / cap, cap);
    return launched("softcap", what);
}

/* ---- gathering rows in place ------------------------------------------------------- */

/* Rows ascend with rows[r] >= r, so copying in place in parallel would let
 * row r read a row that some r' < r has already overwritten: the rows go
 * to scratch first, then back. */
__global__ void k_gather_out(const float *x, const int32_t *rows, int width, float *tmp) {
    const long r = blockIdx.x;
    const float *s = x + (long)rows[r] * width;
    for (int i = threadIdx.x; i < width; i += blockDim.x) tmp[r * width + i] = s[i];
}

__global__ void k_copy(float *dst, const float *src, long n) {
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x)
        dst[i] = src[i];
}

extern "C" size_t qi_cuk_gather_scratch(int max_T, int64_t max_width) {
    return max_T > 0 && max_width > 0 ? sizeof(float) * (size_t)max_T * (size_t)max_width : 0;
}

extern "C" int qi_cuk_gather_rows(const qi_cuk_ctx *c, float *x, const int32_t *rows, int n, int width,
                                  const char **what) {
    if (n <= 0 || width <= 0) return 0;
    if (qi_cuk_gather_scratch(n, width) > c->scratch_bytes || !c->scratch) return refuse("gather_rows scratch", what);
    float *tmp = (float *)c->scratch;
    k_gather_out<<<n, ELEM_THREADS, 0, stream_of(c)>>>(x, rows, width, tmp);
    int e = launched("gather_rows", what);
    if (e) return e;
    const long total = (long)n * width;
    k_copy<<<grid_for(total), ELEM_THREADS, 0, stream_of(c)>>>(x, tmp, total);
    return launched("gather_rows copy", what);
}

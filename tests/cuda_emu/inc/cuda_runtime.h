/* cuda_runtime.h (host emulation) - the pieces of the CUDA runtime and
 * language the kernels of engine/backend/cuda use, for running them on the
 * host in tests/cuda_emu (see run.sh). Not a CUDA implementation: one OS
 * thread per CUDA thread, blocks one after another, __shared__ variables
 * as statics (one block runs at a time), barriers and warp shuffles with
 * pthread barriers. */
#pragma once
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include <functional>

typedef void *cudaStream_t;
typedef int cudaError_t;
enum { cudaSuccess = 0, cudaErrorInvalidValue = 1, cudaErrorInvalidConfiguration = 9 };

struct emu_dim {
    unsigned x, y, z;
};
extern thread_local emu_dim threadIdx, blockIdx;
extern emu_dim blockDim, gridDim;
extern int emu_err;

static inline cudaError_t cudaGetLastError(void) {
    const int e = emu_err;
    emu_err = 0;
    return e;
}

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(x)
#define __shared__ static
#define __align__(n) alignas(n)

/* the vector types the kernels use; a launch's dim3 is one-dimensional
 * here (emu_launch takes its x) */
struct dim3 {
    unsigned x, y, z;
    dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
    operator unsigned() const { return x; }
};
struct float4 {
    float x, y, z, w;
};
struct uint2 {
    unsigned x, y;
};
struct uint4 {
    unsigned x, y, z, w;
};
static inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }

void emu_sync(void);
double emu_shfl_xor(double v, int lane_mask);
#define __syncthreads() emu_sync()
template <class T> static inline T __shfl_xor_sync(unsigned, T v, int lane_mask) {
    return (T)emu_shfl_xor((double)v, lane_mask);
}
static inline double __dadd_rn(double a, double b) { return a + b; }
static inline double __dmul_rn(double a, double b) { return a * b; }

/* kernel<<<grid, block, smem, stream>>>(args) becomes emu_launch(grid,
 * block, stream, ...) (launch.py); the stream is ignored */
void emu_launch(unsigned grid, unsigned block, cudaStream_t stream, std::function<void()> fn);

/* cuda_fp16.h (host emulation; see cuda_runtime.h here) */
#pragma once
#include <stdint.h>

struct __half {
    uint16_t u;
};
struct __half2 {
    __half x, y;
};
struct float2 {
    float x, y;
};
float emu_h2f(uint16_t h); /* the tests give qi_fp16_to_f32 */
static inline float __half2float(__half h) { return emu_h2f(h.u); }
static inline __half __ushort_as_half(uint16_t u) { return __half{u}; }
static inline float2 __half22float2(__half2 h) { return float2{emu_h2f(h.x.u), emu_h2f(h.y.u)}; }

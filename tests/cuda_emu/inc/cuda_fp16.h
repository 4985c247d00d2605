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
float emu_h2f(uint16_t h);    /* the tests give qi_fp16_to_f32 */
uint16_t emu_f2h(float f);   /* and qi_f32_to_fp16 (round to nearest even) */
static inline float __half2float(__half h) { return emu_h2f(h.u); }
static inline __half __float2half_rn(float f) { return __half{emu_f2h(f)}; }
static inline __half __ushort_as_half(uint16_t u) { return __half{u}; }
static inline float2 __half22float2(__half2 h) { return float2{emu_h2f(h.x.u), emu_h2f(h.y.u)}; }

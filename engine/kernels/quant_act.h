/* quant_act.h - activation quantisation as llama.cpp's CPU backend performs it
 * at run time on x86 (see quant_act.c for why this differs from the _ref
 * quantisers in quant.c). */
#ifndef QI_QUANT_ACT_H
#define QI_QUANT_ACT_H

#include <stdint.h>

/* Quantise one activation row of n floats into `type` (a dot partner type:
 * F32, F16, BF16, Q8_0, Q8_1 or Q8_K). */
void qi_quantize_act_row(uint32_t type, const float *x, void *dst, int64_t n);

#endif

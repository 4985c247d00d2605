/* quant_act.c - activation quantisation matching llama.cpp's x86 CPU path.
 *
 * ggml's reference quantisers (quantize_row_q8_0_ref / _q8_1_ref, mirrored in
 * quant.c) compute the inverse scale as 1/(amax/127) and round halves away
 * from zero. The quantisers llama.cpp actually runs on x86 (AVX/AVX2/AVX-512
 * builds) compute it as 127/amax and round halves to even. The two disagree
 * in the last bit of the inverse scale often enough to flip a rounding in
 * some block of most rows, and one flipped quant shifts every output of that
 * row's matmul (through the block sum s of Q8_1). Measured on SmolLM2: a
 * 3e-4 difference in a whole V row at layer 0, amplified by the FFN into
 * ~0.1 at the logits. So the engine quantises activations the way llama.cpp
 * does at run time; the _ref quantisers remain the specification of the
 * formats (weights, tests). Q8_K has no x86-specific quantiser in ggml: the
 * reference one is used. The x86 quantiser itself is a kernel
 * (qi_k_quantize_q8_ref and its SIMD variants, kernels.h), bit-identical in
 * every variant.
 */
#include "quant_act.h"

#include "kernels.h"
#include "qinfer/quant.h"
#include "qinfer/types.h"

void qi_quantize_act_row(uint32_t type, const float *x, void *dst, int64_t n) {
    switch (type) {
    case QI_TYPE_Q8_0: qi_kernels_get()->quantize_q8(x, dst, n, 0); break;
    case QI_TYPE_Q8_1: qi_kernels_get()->quantize_q8(x, dst, n, 1); break;
    default: qi_quantize_row_ref(type, x, dst, n); break;
    }
}

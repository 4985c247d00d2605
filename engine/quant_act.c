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
 * reference one is used.
 */
#include "quant_act.h"

#include <math.h>
#include <string.h>

#include "qinfer/quant.h"
#include "qinfer/types.h"

/* One 32-element block: d (fp16), optionally s (fp16), 32 int8 quants. */
static void q8_block(const float *x, uint8_t *out, int with_sum) {
    float amax = 0.0f;
    for (int j = 0; j < 32; j++) {
        float a = fabsf(x[j]);
        if (a > amax) amax = a;
    }
    const float d = amax / 127.f;
    const float id = amax != 0.0f ? 127.f / amax : 0.0f;
    uint16_t dh = qi_f32_to_fp16(d);
    memcpy(out, &dh, 2);
    int8_t *qs = (int8_t *)(out + (with_sum ? 4 : 2));
    int sum = 0;
    for (int j = 0; j < 32; j++) {
        /* nearbyintf in the default rounding mode: round half to even */
        int q = (int)nearbyintf(x[j] * id);
        qs[j] = (int8_t)q;
        sum += q;
    }
    if (with_sum) {
        uint16_t sh = qi_f32_to_fp16(d * (float)sum);
        memcpy(out + 2, &sh, 2);
    }
}

void qi_quantize_act_row(uint32_t type, const float *x, void *dst, int64_t n) {
    uint8_t *o = dst;
    switch (type) {
    case QI_TYPE_Q8_0:
        for (int64_t i = 0; i < n / 32; i++) q8_block(x + 32 * i, o + 34 * i, 0);
        break;
    case QI_TYPE_Q8_1:
        for (int64_t i = 0; i < n / 32; i++) q8_block(x + 32 * i, o + 36 * i, 1);
        break;
    default:
        qi_quantize_row_ref(type, x, dst, n);
        break;
    }
}

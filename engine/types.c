/* types.c - the table of tensor element types: name, block size, block bytes.
 * Sizes follow the GGUF block formats (see quant.c for the layouts). */
#include "qinfer/types.h"

static const qi_type_info k_types[QI_TYPE_COUNT] = {
    [QI_TYPE_F32] = {"f32", 1, 4},
    [QI_TYPE_F16] = {"f16", 1, 2},
    [QI_TYPE_Q4_0] = {"q4_0", 32, 18},
    [QI_TYPE_Q4_1] = {"q4_1", 32, 20},
    [QI_TYPE_Q5_0] = {"q5_0", 32, 22},
    [QI_TYPE_Q5_1] = {"q5_1", 32, 24},
    [QI_TYPE_Q8_0] = {"q8_0", 32, 34},
    [QI_TYPE_Q8_1] = {"q8_1", 32, 36},
    [QI_TYPE_Q2_K] = {"q2_k", 256, 84},
    [QI_TYPE_Q3_K] = {"q3_k", 256, 110},
    [QI_TYPE_Q4_K] = {"q4_k", 256, 144},
    [QI_TYPE_Q5_K] = {"q5_k", 256, 176},
    [QI_TYPE_Q6_K] = {"q6_k", 256, 210},
    [QI_TYPE_Q8_K] = {"q8_k", 256, 292},
    [QI_TYPE_I8] = {"i8", 1, 1},
    [QI_TYPE_I16] = {"i16", 1, 2},
    [QI_TYPE_I32] = {"i32", 1, 4},
    [QI_TYPE_I64] = {"i64", 1, 8},
    [QI_TYPE_F64] = {"f64", 1, 8},
    [QI_TYPE_BF16] = {"bf16", 1, 2},
};

const qi_type_info *qi_type_get(uint32_t type) {
    if (type >= QI_TYPE_COUNT || !k_types[type].name) return 0;
    return &k_types[type];
}

bool qi_type_row_bytes(uint32_t type, uint64_t n, uint64_t *out) {
    const qi_type_info *t = qi_type_get(type);
    if (!t || n % t->blck) return false;
    uint64_t blocks = n / t->blck;
    if (blocks > UINT64_MAX / t->size) return false;
    *out = blocks * t->size;
    return true;
}

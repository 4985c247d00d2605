/* k_table.cu - the CUDA kernels of this build as a qi_cuk table
 * (kernels_cuda.h), gathered from k_matmul.cu, k_elem.cu and k_attn.cu. */
#include "k_internal.h"

/* The largest scratch any op sized by the non-zero arguments needs. */
static size_t scratch_bytes(int max_T, int64_t max_cols, int H, int max_pos, int64_t max_width) {
    size_t n = 0, m;
    if (max_cols > 0 && (m = qi_cuk_matmul_scratch(max_T, max_cols)) > n) n = m;
    if (max_pos > 0 && H > 0 && (m = qi_cuk_attn_scratch(max_T, H, max_pos)) > n) n = m;
    if (max_width > 0 && (m = qi_cuk_gather_scratch(max_T, max_width)) > n) n = m;
    return n;
}

static int type_ok(uint32_t type) { return qi_cuk_type_ok(type); }

extern "C" const qi_cuk *qi_cuk_cuda(void) {
    static const qi_cuk k = {
        "cuda",
        scratch_bytes,
        type_ok,
        qi_cuk_matmul,
        qi_cuk_get_rows,
        qi_cuk_rmsnorm,
        qi_cuk_rope,
        qi_cuk_glu,
        qi_cuk_kv_write,
        qi_cuk_add,
        qi_cuk_scale,
        qi_cuk_softcap,
        qi_cuk_add_bias,
        qi_cuk_gather_rows,
        qi_cuk_attention,
        qi_cuk_attn_merge,
    };
    return &k;
}

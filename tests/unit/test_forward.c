/* test_forward.c - the llama forward pass on tiny synthetic models against an
 * independent, naive float implementation written here from the equations.
 *
 * The models are built with the GGUF writer (random weights, a byte-level
 * vocabulary) in several weight types. The naive reference dequantises the
 * weights and works in double, applying the same roundings the engine
 * defines (activations through the activation quantiser of the weight type,
 * q/K/V and softmax weights to fp16), so what remains is float summation
 * order: the bound is tight for every type, and a wrong RoPE pairing, GQA
 * head mapping, norm or causal mask shows up as a large error.
 * The qwen2 variant adds random biases to q, k and v and rotates halves of
 * each head (NEOX), as llama.cpp's qwen2 graph does; a bias added to the
 * wrong element or a RoPE pairing of the other layout is an O(1) error.
 * Also: loader errors for missing tensors, bad shapes and metadata.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qinfer/gguf.h"
#include "qinfer/model.h"
#include "qinfer/quant.h"
#include "quant_act.h"
#include "testutil.h"

enum { E = 64, H = 4, HKV = 2, D = 16, FF = 96, L = 2, NV = 258, NCTX = 32 };

typedef struct {
    float *emb;                 /* [NV][E] */
    float *out;                 /* [NV][E] or NULL when tied */
    float *norm_out;            /* [E] */
    float *an[L], *fn[L];       /* [E] */
    float *wq[L], *wk[L], *wv[L], *wo[L], *wg[L], *wu[L], *wd[L];
    float *bq[L], *bk[L], *bv[L]; /* qwen2 only (NULL otherwise) */
} ref_model;

/* the architecture the next build() writes and ref_forward() computes:
 * llama, or qwen2 (q/k/v biases, NEOX RoPE) */
static bool g_qwen2;

static float *rand_mat(uint64_t *st, int n, float scale) {
    float *m = malloc(sizeof(float) * (size_t)n);
    for (int i = 0; i < n; i++) m[i] = qi_test_randf(st) * scale;
    return m;
}

/* GPT-2 byte -> unicode code point. */
static int byte_cp(int b) {
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)) return b;
    int n = 0;
    for (int x = 0; x < b; x++)
        if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255))) n++;
    return 256 + n;
}

static void utf8(int cp, char *out) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        out[1] = 0;
    } else {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        out[2] = 0;
    }
}

/* Quantise a [rows][cols] float matrix to `type` and add it; the model's
 * reference copy is replaced by the dequantised values so both sides use
 * identical weights. */
/* The quantised bytes of every weight matrix, so the reference can use the
 * format's own dot (qi_vec_dot_ref) exactly as the format defines it. */
static struct {
    const float *m;
    char *q;
    uint64_t rb;
    uint32_t type;
} g_qw[64];
static int g_nqw;

static void add_w(qi_gguf_writer *w, const char *name, uint32_t type, float *m, int cols, int rows) {
    uint64_t rb;
    ck_assert(qi_type_row_bytes(type, (uint64_t)cols, &rb));
    char *buf = malloc(rb * (size_t)rows);
    ck_assert_int_lt(g_nqw, 64);
    for (int r = 0; r < rows; r++) {
        qi_quantize_row_ref(type, m + (size_t)r * cols, buf + rb * r, cols);
        qi_dequantize_row_ref(type, buf + rb * r, m + (size_t)r * cols, cols);
    }
    uint64_t ne[2] = {(uint64_t)cols, (uint64_t)rows};
    ck_assert_int_eq(qi_gguf_writer_add_tensor(w, name, type, rows > 1 ? 2 : 1, ne, buf, rb * (size_t)rows), QI_OK);
    g_qw[g_nqw].m = m;
    g_qw[g_nqw].q = buf;
    g_qw[g_nqw].rb = rb;
    g_qw[g_nqw].type = type;
    g_nqw++;
}

static void free_qw(void) {
    for (int i = 0; i < g_nqw; i++) free(g_qw[i].q);
    g_nqw = 0;
}

/* Build a model of weight type `type`; skip (NULL) one tensor by name to test
 * errors. Returns the serialised file. */
static void *build(uint32_t type, bool tied, ref_model *rm, const char *skip, int n_head_kv_meta, size_t *len) {
    uint64_t st = 1234 + type;
    qi_gguf_writer *w = qi_gguf_writer_create();
    ck_assert_ptr_nonnull(w);
    const char *arch = g_qwen2 ? "qwen2" : "llama";
    char key[64];
#define K(suffix) (snprintf(key, sizeof key, "%s.%s", arch, suffix), key)
    qi_gguf_writer_set_str(w, "general.architecture", arch);
    qi_gguf_writer_set_u32(w, K("embedding_length"), E);
    qi_gguf_writer_set_u32(w, K("block_count"), L);
    qi_gguf_writer_set_u32(w, K("feed_forward_length"), FF);
    qi_gguf_writer_set_u32(w, K("attention.head_count"), H);
    qi_gguf_writer_set_u32(w, K("attention.head_count_kv"), (uint32_t)n_head_kv_meta);
    qi_gguf_writer_set_u32(w, K("context_length"), 128);
    qi_gguf_writer_set_f32(w, K("attention.layer_norm_rms_epsilon"), 1e-5f);
    qi_gguf_writer_set_f32(w, K("rope.freq_base"), 10000.0f);
    qi_gguf_writer_set_u32(w, K("rope.dimension_count"), D);
#undef K
    /* vocabulary: the 256 byte tokens, then two specials */
    char *toks[NV];
    static char store[NV][16];
    int32_t types[NV];
    for (int b = 0; b < 256; b++) {
        utf8(byte_cp(b), store[b]);
        toks[b] = store[b];
        types[b] = 1;
    }
    strcpy(store[256], "<|endoftext|>");
    strcpy(store[257], "<|im_end|>");
    toks[256] = store[256];
    toks[257] = store[257];
    types[256] = types[257] = 3;
    qi_gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2");
    qi_gguf_writer_set_str(w, "tokenizer.ggml.pre", "gpt-2");
    qi_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)toks, NV);
    qi_gguf_writer_set_arr(w, "tokenizer.ggml.token_type", QI_GGUF_I32, types, NV);
    const char *merges[1] = {"a b"};
    qi_gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", merges, 0);
    qi_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 256);
    qi_gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 256);

    rm->emb = rand_mat(&st, NV * E, 1.0f);
    rm->norm_out = rand_mat(&st, E, 0.5f);
    for (int i = 0; i < E; i++) rm->norm_out[i] += 1.0f;
    add_w(w, "token_embd.weight", type, rm->emb, E, NV);
    add_w(w, "output_norm.weight", QI_TYPE_F32, rm->norm_out, E, 1);
    rm->out = NULL;
    if (!tied) {
        rm->out = rand_mat(&st, NV * E, 0.3f);
        add_w(w, "output.weight", type, rm->out, E, NV);
    }
    for (int l = 0; l < L; l++) {
        char name[64];
#define W(field, nm, cols, rows, scale, ty)                                      \
    rm->field[l] = rand_mat(&st, (cols) * (rows), scale);                        \
    if (rows == 1)                                                               \
        for (int i = 0; i < (cols); i++) rm->field[l][i] += 1.0f;                \
    snprintf(name, sizeof name, "blk.%d.%s.weight", l, nm);                      \
    if (!skip || strcmp(skip, name) != 0) add_w(w, name, ty, rm->field[l], cols, rows);
        W(an, "attn_norm", E, 1, 0.2f, QI_TYPE_F32)
        W(wq, "attn_q", E, H * D, 0.25f, type)
        W(wk, "attn_k", E, HKV * D, 0.25f, type)
        W(wv, "attn_v", E, HKV * D, 0.25f, type)
        W(wo, "attn_output", H * D, E, 0.2f, type)
        W(fn, "ffn_norm", E, 1, 0.2f, QI_TYPE_F32)
        W(wg, "ffn_gate", E, FF, 0.25f, type)
        W(wu, "ffn_up", E, FF, 0.25f, type)
        W(wd, "ffn_down", FF, E, 0.2f, type)
#undef W
        rm->bq[l] = rm->bk[l] = rm->bv[l] = NULL;
        if (!g_qwen2) continue;
        struct {
            float **b;
            const char *nm;
            int n;
        } bias[] = {{&rm->bq[l], "attn_q", H * D}, {&rm->bk[l], "attn_k", HKV * D}, {&rm->bv[l], "attn_v", HKV * D}};
        for (int i = 0; i < 3; i++) {
            *bias[i].b = rand_mat(&st, bias[i].n, 1.0f);
            snprintf(name, sizeof name, "blk.%d.%s.bias", l, bias[i].nm);
            if (!skip || strcmp(skip, name) != 0) add_w(w, name, QI_TYPE_F32, *bias[i].b, bias[i].n, 1);
        }
    }
    void *buf = NULL;
    qi_err e = {0};
    ck_assert_msg(qi_gguf_writer_to_memory(w, 3, &buf, len, &e) == QI_OK, "%s", e.msg);
    qi_gguf_writer_free(w);
    return buf;
}

static void free_ref(ref_model *rm) {
    free(rm->emb);
    free(rm->out);
    free(rm->norm_out);
    for (int l = 0; l < L; l++) {
        free(rm->an[l]);
        free(rm->fn[l]);
        free(rm->wq[l]);
        free(rm->wk[l]);
        free(rm->wv[l]);
        free(rm->wo[l]);
        free(rm->wg[l]);
        free(rm->wu[l]);
        free(rm->wd[l]);
        free(rm->bq[l]);
        free(rm->bk[l]);
        free(rm->bv[l]);
    }
}

static float h16(float x) { return qi_fp16_to_f32(qi_f32_to_fp16(x)); }

/* y = W x. F32 weights: a double-precision dot. Other types: x goes through
 * the activation quantiser of the weight type and each row uses the format's
 * reference dot, which is how the formats define the product. */
static void mv(const float *W, const float *x, int cols, int rows, float *y) {
    int k = 0;
    while (k < g_nqw && g_qw[k].m != W) k++;
    ck_assert_int_lt(k, g_nqw);
    if (g_qw[k].type == QI_TYPE_F32) {
        for (int r = 0; r < rows; r++) {
            double s = 0;
            for (int c = 0; c < cols; c++) s += (double)W[(size_t)r * cols + c] * x[c];
            y[r] = (float)s;
        }
        return;
    }
    uint32_t at = qi_vec_dot_type(g_qw[k].type);
    uint64_t rb;
    ck_assert(qi_type_row_bytes(at, (uint64_t)cols, &rb));
    char *q = malloc(rb);
    qi_quantize_act_row(at, x, q, cols);
    for (int r = 0; r < rows; r++) y[r] = qi_vec_dot_ref(g_qw[k].type, cols, g_qw[k].q + g_qw[k].rb * r, q);
    free(q);
}

static void rms(const float *x, const float *w, float *y) {
    double s = 0;
    for (int i = 0; i < E; i++) s += (double)x[i] * x[i];
    float k = 1.0f / sqrtf((float)(s / E) + 1e-5f);
    for (int i = 0; i < E; i++) y[i] = x[i] * k * w[i];
}

/* rotate pairs of every head by pos * 10000^(-2i/D): adjacent pairs
 * (x[2i], x[2i+1]) for llama, halves (x[i], x[i + D/2]) for qwen2 */
static void rope(float *v, int nh, int pos) {
    for (int h = 0; h < nh; h++)
        for (int i = 0; i < D; i += 2) {
            double th = pos * pow(10000.0, -(double)i / D);
            float c = (float)cos(th), s = (float)sin(th);
            float *p = v + h * D + (g_qwen2 ? i / 2 : i), *p1 = g_qwen2 ? p + D / 2 : p + 1, a = p[0], b = p1[0];
            p[0] = a * c - b * s;
            p1[0] = a * s + b * c;
        }
}

static void add_bias(float *x, const float *b, int n) {
    for (int i = 0; b && i < n; i++) x[i] += b[i];
}

/* Naive forward of a whole sequence; logits [T][NV]. */
static void ref_forward(const ref_model *rm, const int32_t *ids, int T, float *logits) {
    static float K[L][NCTX][HKV * D], Vc[L][NCTX][HKV * D];
    for (int t = 0; t < T; t++) {
        float x[E], n[E], q[H * D], k[HKV * D], v[HKV * D], att[H * D], o[E], g[FF], u[FF];
        memcpy(x, rm->emb + (size_t)ids[t] * E, sizeof x);
        for (int l = 0; l < L; l++) {
            rms(x, rm->an[l], n);
            mv(rm->wq[l], n, E, H * D, q);
            mv(rm->wk[l], n, E, HKV * D, k);
            mv(rm->wv[l], n, E, HKV * D, v);
            add_bias(q, rm->bq[l], H * D);
            add_bias(k, rm->bk[l], HKV * D);
            add_bias(v, rm->bv[l], HKV * D);
            rope(q, H, t);
            rope(k, HKV, t);
            for (int i = 0; i < HKV * D; i++) {
                K[l][t][i] = h16(k[i]);
                Vc[l][t][i] = h16(v[i]);
            }
            for (int h = 0; h < H; h++) {
                int hk = h / (H / HKV);
                float sc[NCTX], mx = -INFINITY;
                double sum = 0;
                for (int p = 0; p <= t; p++) {
                    float s = 0;
                    for (int d = 0; d < D; d++) s += h16(q[h * D + d]) * K[l][p][hk * D + d];
                    sc[p] = s * (1.0f / sqrtf((float)D));
                    if (sc[p] > mx) mx = sc[p];
                }
                for (int p = 0; p <= t; p++) { sc[p] = expf(sc[p] - mx); sum += sc[p]; }
                float inv = (float)(1.0 / sum);
                for (int d = 0; d < D; d++) att[h * D + d] = 0;
                for (int p = 0; p <= t; p++) {
                    float w = h16(sc[p] * inv);
                    for (int d = 0; d < D; d++) att[h * D + d] += w * Vc[l][p][hk * D + d];
                }
            }
            mv(rm->wo[l], att, H * D, E, o);
            for (int i = 0; i < E; i++) x[i] += o[i];
            rms(x, rm->fn[l], n);
            mv(rm->wg[l], n, E, FF, g);
            mv(rm->wu[l], n, E, FF, u);
            for (int i = 0; i < FF; i++) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
            mv(rm->wd[l], g, FF, E, o);
            for (int i = 0; i < E; i++) x[i] += o[i];
        }
        rms(x, rm->norm_out, n);
        mv(rm->out ? rm->out : rm->emb, n, E, NV, logits + (size_t)t * NV);
    }
}

static void check_type(uint32_t type, bool tied, float tol) {
    ref_model rm;
    size_t len;
    void *buf = build(type, tied, &rm, NULL, HKV, &len);
    qi_gguf *g = NULL;
    qi_model *m = NULL;
    qi_err e = {0};
    ck_assert_msg(qi_gguf_open_memory(buf, len, "tiny.gguf", &g, &e) == QI_OK, "%s", e.msg);
    ck_assert_msg(qi_model_from_gguf(g, &m, &e) == QI_OK, "%s", e.msg);
    ck_assert_int_eq(m->hp.tied_output, tied);
    ck_assert_int_eq(m->hp.arch, g_qwen2 ? QI_ARCH_QWEN2 : QI_ARCH_LLAMA);
    ck_assert_int_eq(m->hp.rope_mode, g_qwen2 ? QI_ROPE_NEOX : QI_ROPE_NORM);
    ck_assert(g_qwen2 == (m->layers[0].bq.data != NULL && m->layers[L - 1].bv.data != NULL));
    ck_assert_int_eq(m->hp.n_head_kv, HKV);
    int32_t ids[NCTX];
    uint64_t st = 99;
    for (int i = 0; i < NCTX; i++) ids[i] = (int32_t)(qi_test_rand(&st) % NV);
    const int T = 20;
    float *want = malloc(sizeof(float) * T * NV);
    ref_forward(&rm, ids, T, want);
    for (int threads = 1; threads <= 3; threads++) {
        qi_ctx *c = NULL;
        ck_assert_int_eq(qi_ctx_create(m, NCTX, threads, &c, &e), QI_OK);
        /* a prompt of 7, then one token at a time */
        ck_assert_int_eq(qi_ctx_eval(c, ids, 7, true, &e), QI_OK);
        float worst = 0;
        for (int t = 0; t < T; t++) {
            if (t >= 7) ck_assert_int_eq(qi_ctx_eval(c, ids + t, 1, false, &e), QI_OK);
            const float *got = qi_ctx_logits(c, t < 7 ? t : -1);
            if (getenv("QI_TEST_VERBOSE") && threads == 1) {
                float w2 = 0, mx = 0;
                for (int v = 0; v < NV; v++) {
                    float d = fabsf(got[v] - want[(size_t)t * NV + v]);
                    if (d > w2) w2 = d;
                    if (fabsf(want[(size_t)t * NV + v]) > mx) mx = fabsf(want[(size_t)t * NV + v]);
                }
                printf("  %s pos %d: max diff %.2e, max |logit| %.2f\n", qi_type_get(type)->name, t, w2, mx);
                continue;
            }
            /* position 0 attends to itself only: no softmax rounding, so
             * every type must agree to float summation order */
            const float bound = t == 0 ? 1e-4f : tol;
            for (int v = 0; v < NV; v++) {
                float d = fabsf(got[v] - want[(size_t)t * NV + v]);
                if (d > worst) worst = d;
                ck_assert_msg(d <= bound * (1 + fabsf(want[(size_t)t * NV + v])),
                              "type %s pos %d vocab %d: %g vs %g", qi_type_get(type)->name, t, v, got[v],
                              want[(size_t)t * NV + v]);
            }
        }
        if (threads == 1)
            printf("forward %s %-5s tied=%d: max |logit diff| %.2e (bound %.0e relative)\n", g_qwen2 ? "qwen2" : "llama",
                   qi_type_get(type)->name, tied, worst, tol);
        qi_ctx_free(c);
    }
    free(want);
    qi_model_free(m);
    qi_free(buf);
    free_ref(&rm);
    free_qw();
}

/* Bounds. Position 0 must agree to 1e-4 for every type (no softmax). Later
 * positions: the reference computes attention in the engine's documented
 * order (float scores, float exp, fp16 softmax weights), which today makes
 * the two agree exactly; the bounds leave room for the engine to reorder its
 * float sums (as its SIMD kernels may), where a 1-ulp change of an fp16
 * softmax weight is amplified by 8-bit activation quantisation (a flipped
 * quant moves a value by 1/127 of its row's maximum) to ~0.1 at the logits.
 * Wiring errors (RoPE pairing, GQA mapping, masks, norms) are O(1). */
START_TEST(forward_f32) { check_type(QI_TYPE_F32, false, 5e-3f); }
END_TEST
START_TEST(forward_f16_tied) { check_type(QI_TYPE_F16, true, 2e-2f); }
END_TEST
START_TEST(forward_q8_0) { check_type(QI_TYPE_Q8_0, false, 2.5e-1f); }
END_TEST
START_TEST(forward_q4_1) { check_type(QI_TYPE_Q4_1, true, 2.5e-1f); }
END_TEST
/* qwen2: biases and NEOX RoPE, an output head of its own and a tied one */
START_TEST(forward_qwen2_f32) {
    g_qwen2 = true;
    check_type(QI_TYPE_F32, false, 5e-3f);
    g_qwen2 = false;
}
END_TEST
START_TEST(forward_qwen2_q8_0_tied) {
    g_qwen2 = true;
    check_type(QI_TYPE_Q8_0, true, 2.5e-1f);
    g_qwen2 = false;
}
END_TEST

static void expect_load_error(const char *skip, int n_head_kv_meta, const char *needle) {
    ref_model rm;
    size_t len;
    void *buf = build(QI_TYPE_F32, true, &rm, skip, n_head_kv_meta, &len);
    qi_gguf *g = NULL;
    qi_model *m = NULL;
    qi_err e = {0};
    ck_assert_int_eq(qi_gguf_open_memory(buf, len, "tiny.gguf", &g, &e), QI_OK);
    ck_assert_int_ne(qi_model_from_gguf(g, &m, &e), QI_OK);
    ck_assert_ptr_null(m);
    ck_assert_msg(strstr(e.msg, needle) != NULL, "message '%s' lacks '%s'", e.msg, needle);
    ck_assert_msg(strstr(e.msg, "tiny.gguf") != NULL, "message '%s' does not name the file", e.msg);
    qi_free(buf);
    free_ref(&rm);
    free_qw();
    free_qw();
}

START_TEST(loader_errors) {
    expect_load_error("blk.1.ffn_up.weight", HKV, "blk.1.ffn_up.weight");
    expect_load_error(NULL, 3, "head");  /* 4 heads not divisible into 3 KV heads */
    expect_load_error(NULL, 1, "shape"); /* attn_k has 2 KV heads' rows */
    g_qwen2 = true; /* the biases are optional, as llama.cpp loads them; their shape is not */
    ref_model rm;
    size_t len;
    void *buf = build(QI_TYPE_F32, true, &rm, "blk.1.attn_k.bias", HKV, &len);
    qi_gguf *g = NULL;
    qi_model *m = NULL;
    qi_err e = {0};
    ck_assert_int_eq(qi_gguf_open_memory(buf, len, "tiny.gguf", &g, &e), QI_OK);
    ck_assert_msg(qi_model_from_gguf(g, &m, &e) == QI_OK, "%s", e.msg);
    ck_assert_ptr_null(m->layers[1].bk.data);
    ck_assert_ptr_nonnull(m->layers[1].bq.data);
    qi_model_free(m);
    qi_free(buf);
    free_ref(&rm);
    free_qw();
    g_qwen2 = false;
}
END_TEST

int main(void) {
    Suite *su = suite_create("forward");
    TCase *tc = tcase_create("tiny");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, forward_f32);
    tcase_add_test(tc, forward_f16_tied);
    tcase_add_test(tc, forward_q8_0);
    tcase_add_test(tc, forward_q4_1);
    tcase_add_test(tc, forward_qwen2_f32);
    tcase_add_test(tc, forward_qwen2_q8_0_tied);
    tcase_add_test(tc, loader_errors);
    suite_add_tcase(su, tc);
    return qi_test_run_suite(su);
}

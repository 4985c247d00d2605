/* test_kernels.c - Check suite for the CPU kernels (engine/kernels*.c).
 *
 * Evidence, strongest first:
 *   - the references against llama.cpp itself: the "dot" cases of
 *     tests/golden/quant/quant_golden.txt carry ggml's SIMD vec_dot result
 *     from the x86 build the engine is matched to (line "s"); the x86-order
 *     references must reproduce it bit for bit (q4_0, q4_1, q5_0, q5_1,
 *     q8_0, q4_K, q6_K, and f16 in the VEC order); and embedded outputs of
 *     ggml_mul_mat on q4_K/q6_K weights pin both K-quant orders (vec_dot
 *     below 8 tokens, the tiled kernel from 8);
 *   - every SIMD variant against the reference: bit-identical (tolerance 0,
 *     the design), over random data of every size class (one block, odd
 *     block counts, rows of thousands and past the batched paths' limit,
 *     1..11 weight rows x 1..20 tokens, head dims that the fast paths do
 *     and do not cover, positions around 16 and 64, softmax and exp inputs
 *     that underflow and overflow (exp_sum's also with -inf, masked, inputs),
 *     quantiser rows with exact ties), with guard values between strided
 *     outputs that must stay untouched;
 *   - the exp approximation against libm within 3 ulp (the worst seen is
 *     2.14), plus its special values;
 *   - planted faults: ggml's generic order (quant.c) and a non-fused block
 *     accumulation both disagree with the references on these inputs, so
 *     the bit-identity checks are able to fail;
 *   - dispatch: the chosen table is sane, and QI_FORCE_REF=1 yields the
 *     reference.
 * Each test reports the first mismatching index.
 *
 * The parts are in test_kernels/ (kernels_test.h); this file holds the
 * goldens from llama.cpp, the dispatch and the suite.
 */
#include "kernels_test.h"

/* ---- goldens from llama.cpp ------------------------------------------------------ */

typedef struct {
    uint32_t type;
    int64_t n;
    unsigned char *w, *a;
    size_t w_len, a_len;
    float s; /* ggml's SIMD vec_dot */
    int has_s;
} golden_dot;

static golden_dot g_dots[64];
static int g_n_dots;
static char g_load_err[256];

static uint32_t type_by_name(const char *name) {
    for (uint32_t t = 0; t < QI_TYPE_COUNT; t++) {
        const qi_type_info *ti = qi_type_get(t);
        if (ti && ti->name && !strcasecmp(ti->name, name)) return t;
    }
    return QI_TYPE_COUNT;
}

static int load_golden_dots(void) {
    size_t len;
    char *text = qi_test_read_file(GOLDEN_PATH, &len);
    if (!text) {
        snprintf(g_load_err, sizeof g_load_err, "cannot read %s", GOLDEN_PATH);
        return 0;
    }
    golden_dot *cur = NULL;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        char tname[16];
        long long n;
        if (!strncmp(line, "dot ", 4)) {
            if (g_n_dots == 64 || sscanf(line + 4, "%15s %lld", tname, &n) != 2) goto bad;
            cur = &g_dots[g_n_dots++];
            memset(cur, 0, sizeof *cur);
            cur->type = type_by_name(tname);
            cur->n = n;
            if (cur->type == QI_TYPE_COUNT) goto bad;
        } else if (!strncmp(line, "quant ", 6) || !strncmp(line, "dequant ", 8) ||
                   !strncmp(line, "stress ", 7) || !strncmp(line, "checksum ", 9)) {
            cur = NULL;
        } else if (cur && !strncmp(line, "w ", 2)) {
            if (!(cur->w = qi_test_unhex(line + 2, &cur->w_len))) goto bad;
        } else if (cur && !strncmp(line, "a ", 2)) {
            if (!(cur->a = qi_test_unhex(line + 2, &cur->a_len))) goto bad;
        } else if (cur && !strncmp(line, "s ", 2)) {
            char *end;
            cur->s = strtof(line + 2, &end); /* %.9g: round-trips a float */
            if (end == line + 2) goto bad;
            cur->has_s = 1;
        }
    }
    free(text);
    return 1;
bad:
    snprintf(g_load_err, sizeof g_load_err, "malformed dot case in %s", GOLDEN_PATH);
    free(text);
    return 0;
}

static const golden_dot *find_dot(uint32_t type, int which) {
    for (int i = 0; i < g_n_dots; i++)
        if (g_dots[i].type == type && g_dots[i].has_s && g_dots[i].w && g_dots[i].a && which-- == 0)
            return &g_dots[i];
    return NULL;
}

static void require_goldens(void) {
    ck_assert_msg(g_n_dots > 0, "goldens not loaded: %s", g_load_err);
}

START_TEST(test_golden_block_dots) {
    require_goldens();
    const uint32_t t = k_dot_types[_i];
    const qi_kernels *tabs[3] = {qi_kernels_ref()};
    const int n_tabs = 1 + simd_tables(tabs + 1);
    int seen = 0;
    for (int which = 0;; which++) {
        const golden_dot *g = find_dot(t, which);
        if (!g) break;
        seen++;
        ck_assert_uint_eq(g->w_len, qi_row_bytes(t, g->n));
        ck_assert_uint_eq(g->a_len, qi_row_bytes(qi_vec_dot_type(t), g->n));
        for (int k = 0; k < n_tabs; k++) {
            float got = NAN;
            tabs[k]->gemm[t](g->n, g->w, 0, 1, g->a, 0, 1, &got, 1);
            qi_check_msg(same_float(got, g->s), "%s %s n=%lld: %.9g, llama.cpp %.9g",
                          tabs[k]->name, qi_type_get(t)->name, (long long)g->n, got, g->s);
        }
    }
    ck_assert_msg(seen >= 2, "expected two golden dot cases for %s", qi_type_get(t)->name);
}
END_TEST

START_TEST(test_golden_f16_dot) {
    require_goldens();
    int seen = 0;
    for (int which = 0;; which++) {
        const golden_dot *g = find_dot(QI_TYPE_F16, which);
        if (!g) break;
        seen++;
        const float got = qi_k_dot_f16_ref(QI_K_ORD_VEC, g->n, (const uint16_t *)g->w,
                                           (const uint16_t *)g->a);
        ck_assert_msg(same_float(got, g->s), "f16 n=%lld: %.9g, llama.cpp %.9g", (long long)g->n, got, g->s);
    }
    ck_assert_int_ge(seen, 2);
}
END_TEST

/* llama.cpp's matmul of q4_K/q6_K weights, as ggml_mul_mat computed it in
 * the vendored build (a harness linked against its libggml-cpu): 2 weight
 * rows of 768, against 9 tokens (its tiled kernel) and 3 tokens (vec_dot),
 * on the inputs golden_k_inputs() makes. Output [token][row], float bits. */
static const uint32_t k_golden_q4_K_9[18] = {
    0xc03a69b3, 0x420b04dd, 0x41458362, 0x4286dd8a, 0x408b31e7, 0xc0bfbb4e,
    0x407e3610, 0x40d7d616, 0x3ff9ecac, 0xc19ed0e4, 0xc149f995, 0x4057707a,
    0xc1099339, 0xc2053ddb, 0xc215cfca, 0xc279dfe5, 0x400a563a, 0x413b39d5};
static const uint32_t k_golden_q4_K_3[6] = {0xc03a69bc, 0x420b04dc, 0x4145836c,
                                            0x4286dd8a, 0x408b31f0, 0xc0bfbb53};
static const uint32_t k_golden_q6_K_9[18] = {
    0x42e01722, 0xc2b3b835, 0xc235fc5a, 0x4265d0b1, 0x42556282, 0x42058086,
    0xc106f1ca, 0x42325861, 0xc10af201, 0x41a2f9b7, 0xc18bd57f, 0x41891499,
    0x41bfcb98, 0xc1c6d05f, 0xc109b7ed, 0x42299607, 0x41950391, 0xc187885b};
static const uint32_t k_golden_q6_K_3[6] = {0x42e01720, 0xc2b3b835, 0xc235fc5c,
                                            0x4265d0b0, 0x42556282, 0x42058086};

/* 2 rows of 768 weights of `type` and n_tok activation rows in Q8_K, from
 * the uniform generator only (no libm), so the bytes are the harness's. */
static void golden_k_inputs(uint32_t type, int n_tok, void *w, void *a) {
    uint64_t s = 4242 + type;
    float x[768];
    for (int m = 0; m < 2; m++) {
        for (int k = 0; k < 768; k++) x[k] = qi_test_randf(&s) * (k % 97 == 0 ? 5.0f : 1.0f);
        qi_quantize_row_ref(type, x, (char *)w + (size_t)m * qi_row_bytes(type, 768), 768);
    }
    for (int t = 0; t < n_tok; t++) {
        for (int k = 0; k < 768; k++) x[k] = qi_test_randf(&s) * ((t * 768 + k) % 331 == 0 ? 50.0f : 1.0f);
        qi_quantize_act_row(QI_TYPE_Q8_K, x, (char *)a + (size_t)t * qi_row_bytes(QI_TYPE_Q8_K, 768), 768);
    }
}

START_TEST(test_golden_k_matmul) {
    const qi_kernels *tabs[4] = {qi_kernels_ref()};
    int n_tabs = 1 + simd_tables(tabs + 1);
    if (qi_kernels_amx()) tabs[n_tabs++] = qi_kernels_amx(); /* its own suite: test_kernels_amx */
    static const uint32_t types[2] = {QI_TYPE_Q4_K, QI_TYPE_Q6_K};
    const uint32_t *gold[2][2] = {{k_golden_q4_K_3, k_golden_q4_K_9}, {k_golden_q6_K_3, k_golden_q6_K_9}};
    for (int ti = 0; ti < 2; ti++)
        for (int wide = 0; wide < 2; wide++) {
            const uint32_t t = types[ti];
            const int n_tok = wide ? 9 : 3;
            const size_t wb = qi_row_bytes(t, 768), ab = qi_row_bytes(QI_TYPE_Q8_K, 768);
            char *w = malloc(2 * wb), *a = malloc((size_t)n_tok * ab);
            golden_k_inputs(t, n_tok, w, a);
            for (int k = 0; k < n_tabs; k++) {
                float y[18];
                qi_k_gemm_fn g = wide ? tabs[k]->gemm_wide[t] : tabs[k]->gemm[t];
                g(768, w, wb, 2, a, ab, n_tok, y, 2);
                for (int i = 0; i < 2 * n_tok; i++)
                    qi_check_msg(f32_bits(y[i]) == gold[ti][wide][i], "%s %s, %d tokens: token %d row %d: %.9g (%08x), llama.cpp %08x",
                                  tabs[k]->name, qi_type_get(t)->name, n_tok, i / 2, i % 2, y[i], f32_bits(y[i]), gold[ti][wide][i]);
            }
            free(w);
            free(a);
        }
}
END_TEST

/* Planted fault: ggml's generic order (what quant.c computes) is not
 * llama.cpp's x86 result on these cases, so the golden test can fail. */
START_TEST(test_planted_generic_order) {
    require_goldens();
    int differs = 0;
    for (int i = 0; i < N_DOT_TYPES; i++)
        for (int which = 0;; which++) {
            const golden_dot *g = find_dot(k_dot_types[i], which);
            if (!g) break;
            differs += !same_float(qi_vec_dot_ref(g->type, g->n, g->w, g->a), g->s);
        }
    ck_assert_msg(differs > 0, "generic order matched every golden: the goldens cannot tell orders apart");
}
END_TEST

/* ---- dispatch ------------------------------------------------------------------------ */

START_TEST(test_dispatch_sane) {
    const qi_kernels *k = qi_kernels_get();
    ck_assert_ptr_nonnull(k);
    ck_assert(!strcmp(k->name, "ref") || !strcmp(k->name, "avx2") || !strcmp(k->name, "avx512") ||
              !strcmp(k->name, "amx"));
    ck_assert_ptr_nonnull(k->attn_scores);
    ck_assert_ptr_nonnull(k->attn_values);
    ck_assert_ptr_nonnull(k->softmax_f16);
    ck_assert_ptr_nonnull(k->exp_sum);
    ck_assert_ptr_nonnull(k->swiglu);
    ck_assert_ptr_nonnull(k->geglu);
    ck_assert_ptr_nonnull(k->quantize_q8);
    ck_assert_ptr_nonnull(k->f16_to_f32);
    ck_assert_ptr_nonnull(k->f32_to_f16);
    for (int i = 0; i < N_DOT_TYPES; i++) ck_assert_ptr_nonnull(k->gemm[k_dot_types[i]]);
    const char *f = getenv("QI_FORCE_REF");
    if (!(f && *f && strcmp(f, "0"))) {
        if (qi_kernels_amx()) ck_assert_str_eq(k->name, "amx");
        else if (qi_kernels_avx512()) ck_assert_str_eq(k->name, "avx512");
        else if (qi_kernels_avx2()) ck_assert_str_eq(k->name, "avx2");
        else ck_assert_str_eq(k->name, "ref");
    }
    ck_assert_ptr_eq(qi_kernels_get(), k); /* chosen once */
    /* only types with an x86-order kernel are in the tables */
    for (uint32_t t = 0; t < QI_TYPE_COUNT; t++) {
        int listed = 0;
        for (int i = 0; i < N_DOT_TYPES; i++) listed |= k_dot_types[i] == t;
        if (!listed) ck_assert_ptr_null(qi_kernels_ref()->gemm[t]);
    }
}
END_TEST

/* Runs in its own forked process (the choice is made once per process). */
START_TEST(test_force_ref) {
    const char *fork = getenv("CK_FORK");
    if (fork && !strcmp(fork, "no")) return; /* the choice was made by an earlier test */
    setenv("QI_FORCE_REF", "1", 1);
    ck_assert_str_eq(qi_kernels_get()->name, "ref");
}
END_TEST

static Suite *kernels_suite(void) {
    Suite *s = suite_create("kernels");
    TCase *golden = tcase_create("golden");
    tcase_set_timeout(golden, 120);
    tcase_add_loop_test(golden, test_golden_block_dots, 0, N_DOT_TYPES);
    tcase_add_test(golden, test_golden_f16_dot);
    tcase_add_test(golden, test_golden_k_matmul);
    tcase_add_test(golden, test_planted_generic_order);

    TCase *variants = tcase_create("variants");
    tcase_set_timeout(variants, 300);
    TCase *numerics = tcase_create("numerics");
    kernels_gemm_add(golden, variants);
    kernels_attn_add(variants, numerics);
    suite_add_tcase(s, golden);
    suite_add_tcase(s, variants);
    suite_add_tcase(s, numerics);

    TCase *tc = tcase_create("dispatch");
    tcase_add_test(tc, test_dispatch_sane);
    tcase_add_test(tc, test_force_ref);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    /* loaded once here; forked test processes inherit the parsed cases */
    if (!load_golden_dots()) fprintf(stderr, "test_kernels: %s\n", g_load_err);
    /* which variants this CPU let the suite hold to the reference */
    const qi_kernels *t[2];
    const int n = simd_tables(t);
    /* (not qi_kernels_get(): test_force_ref needs the choice still unmade) */
    printf("test_kernels: SIMD variants covered on this CPU: %s%s%s%s\n", n ? "" : "none", n ? t[0]->name : "",
           n > 1 ? ", " : "", n > 1 ? t[1]->name : "");
    if (n < 2) printf("test_kernels: variants this CPU cannot run were not covered: %s%s\n",
                      qi_kernels_avx2() ? "" : "avx2 ", qi_kernels_avx512() ? "" : "avx512");
    fflush(stdout);
    SRunner *sr = srunner_create(kernels_suite());
    srunner_run_all(sr, CK_NORMAL);
    const int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

/* test_model_gemma.c - Gemma 3 270M (gemma3 architecture, Q4_K_M) against
 * llama.cpp's recorded outputs (tests/golden/gemma3-270m/, flash attention
 * off): the hyper-parameters the loader derives, first-position logits, and
 * greedy continuations step by step as in test_model.c, including passages
 * longer than the 512-token sliding window of the local layers, and a
 * perplexity long enough for the local layers' cache ring to wrap.
 *
 * QI_TEST_QUICK=1 checks only the first few prompts (16 steps each), and
 * the window's chunking on the synthetic Gemma 3 shape; perplexity is the
 * Check case "ppl", the CTest entry test_model_gemma_ppl, skipped (77) in
 * quick mode. Without the cached model both entries are skipped.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qinfer/perplexity.h"
#include "qinfer/model.h"
#include "qinfer/sampler.h"
#include "testutil.h"

#define MODEL_FILE "models/gemma-3-270m-q4_k_m.gguf"
#define GOLDEN_DIR QI_SOURCE_DIR "/tests/golden/gemma3-270m/"
#define CORPUS_FILE "corpora/devils-dictionary.txt"

static qi_model *g_model;

static void setup(void) {
    const char *path = qi_test_cached(MODEL_FILE);
    ck_assert_ptr_nonnull(path);
    qi_err e = {0};
    ck_assert_msg(qi_model_load(path, &g_model, &e) == QI_OK, "%s", e.msg);
}

static void teardown(void) {
    qi_model_free(g_model);
    g_model = NULL;
}

START_TEST(greedy_matches_llama_cpp) {
    qi_test_greedy r;
    qi_test_golden_greedy(g_model, GOLDEN_DIR "greedy.tsv", g_model->hp.n_swa, &r);
    ck_assert_int_ge(r.n_prompts, qi_test_quick() ? 3 : 20);
    if (!qi_test_quick()) ck_assert_int_ge(r.n_long, 3);
    ck_assert_msg(r.agree == r.steps, "argmax agrees with llama.cpp at %d of %d steps", r.agree, r.steps);
    ck_assert_msg(r.exact == r.steps, "top-2 logits bit-identical at %d of %d steps (max |diff| %g)", r.exact,
                  r.steps, r.worst);
}
END_TEST

START_TEST(first_logits_match_llama_cpp) { qi_test_golden_first_logits(g_model, GOLDEN_DIR "logits.tsv"); }
END_TEST

START_TEST(hparams_from_metadata) {
    const qi_hparams *hp = &g_model->hp;
    ck_assert_int_eq(hp->arch, QI_ARCH_GEMMA3);
    ck_assert_int_eq(hp->n_layer, 18);
    ck_assert_int_eq(hp->n_embd, 640);
    ck_assert_int_eq(hp->n_head, 4);
    ck_assert_int_eq(hp->n_head_kv, 1);
    ck_assert_int_eq(hp->head_dim, 256);
    ck_assert_int_eq(hp->n_rot, 256);
    ck_assert_int_eq(hp->n_ff, 2048);
    ck_assert_int_eq(hp->n_swa, 512);
    ck_assert_int_eq(hp->rope_mode, QI_ROPE_NEOX);
    ck_assert_int_eq(hp->ffn_act, QI_FFN_GEGLU_TANH);
    ck_assert(hp->rope_base == 1000000.0f);
    ck_assert(hp->rope_base_swa == 10000.0f);
    ck_assert(hp->q_scale == 0.0625f);
    ck_assert(hp->embd_scale == sqrtf(640.0f));
    ck_assert(hp->logit_softcap == 0.0f);
    ck_assert(hp->tied_output);
    /* every 6th layer is global */
    for (int l = 0; l < hp->n_layer; l++) {
        const qi_layer *ly = &g_model->layers[l];
        ck_assert_msg(ly->swa == (l % 6 != 5), "layer %d", l);
        ck_assert_ptr_nonnull(ly->q_norm.data);
        ck_assert_ptr_nonnull(ly->k_norm.data);
        ck_assert_ptr_nonnull(ly->attn_post_norm.data);
        ck_assert_ptr_nonnull(ly->ffn_post_norm.data);
    }
}
END_TEST

START_TEST(window_chunking_does_not_change_logits) {
    /* 1100 tokens, past the window and past the 1024-cell ring of the local
     * layers: as one call (chunks of 512 + 512 + 76 on two threads) and as
     * four calls of 275 on one thread. Batches of 8 or more tokens use the
     * same orders whatever their size, so the last position's logits agree
     * bit for bit. QI_TEST_QUICK=1 (the sanitizer build) runs it on the
     * synthetic Gemma 3 shape (testutil.h: the same window and ring, 6
     * layers), the Release build on the real model. */
    enum { N = 1100, CALL = 275 };
    qi_model *m = qi_test_quick() ? qi_test_synth(QI_TEST_SYNTH_GEMMA) : g_model;
    ck_assert_ptr_nonnull(m);
    ck_assert_int_eq(m->hp.n_swa, 512);
    qi_err e = {0};
    qi_ctx *a = NULL, *b = NULL;
    ck_assert_int_eq(qi_ctx_create(m, 2048, 2, &a, &e), QI_OK);
    ck_assert_int_eq(qi_ctx_create(m, 2048, 1, &b, &e), QI_OK);
    static int32_t ids[N];
    const int V = m->hp.n_vocab;
    const uint64_t span = V > 21000 ? 20000 : (uint64_t)V - 1000;
    uint64_t s = 12345;
    ids[0] = 2; /* BOS */
    for (int i = 1; i < N; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        ids[i] = 1000 + (int32_t)((s >> 33) % span);
    }
    ck_assert_int_eq(qi_ctx_eval(a, ids, N, false, &e), QI_OK);
    for (int i = 0; i < N; i += CALL) ck_assert_int_eq(qi_ctx_eval(b, ids + i, CALL, false, &e), QI_OK);
    ck_assert(memcmp(qi_ctx_logits(a, -1), qi_ctx_logits(b, -1), sizeof(float) * V) == 0);
    qi_ctx_free(a);
    qi_ctx_free(b);
    if (m != g_model) qi_model_free(m);
}
END_TEST

/* Perplexity against llama-perplexity's figures in ppl.tsv (recorded by
 * tests/golden/record.py gemma3-270m --only ppl --ppl-runs
 * 512:4,2048:2,512:all,2048:all; the commands are in its header): ctx 512
 * over 4 chunks, and ctx 2048 over 2 chunks, where past 1024 positions the local layers' ring has wrapped
 * (positions 1024.. overwrite cells 0..), so this checks the cell-order
 * attention too. Figures are printed to 4 decimals, hence the tolerance. */
START_TEST(perplexity_matches_llama_cpp) {
    ck_assert_int_ge(qi_test_golden_ppl(g_model, CORPUS_FILE, GOLDEN_DIR "ppl.tsv", 0, 4, false), 2);
}
END_TEST

int main(void) {
    const bool ppl = strcmp(qi_test_case(), "ppl") == 0;
    if (ppl && qi_test_quick()) return qi_test_skip("test_model_gemma_ppl", "quick mode (QI_TEST_QUICK=1)");
    if (!qi_test_cached(MODEL_FILE))
        return qi_test_skip(ppl ? "test_model_gemma_ppl" : "test_model_gemma",
                            MODEL_FILE " not cached (models/fetch.sh gemma3-270m)");
    Suite *su = suite_create("model_gemma");
    TCase *tc = tcase_create("golden");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 1800);
    tcase_add_test(tc, hparams_from_metadata);
    tcase_add_test(tc, window_chunking_does_not_change_logits);
    tcase_add_test(tc, first_logits_match_llama_cpp);
    tcase_add_test(tc, greedy_matches_llama_cpp);
    suite_add_tcase(su, tc);
    /* a CTest entry of its own (test_model_gemma_ppl), skipped in quick mode */
    tc = tcase_create("ppl");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 1800);
    tcase_add_test(tc, perplexity_matches_llama_cpp);
    suite_add_tcase(su, tc);
    return qi_test_run_suite(su);
}

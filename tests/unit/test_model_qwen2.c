/* test_model_qwen2.c - Qwen2.5-Coder-1.5B-Instruct (qwen2 architecture,
 * Q4_K_M) against llama.cpp's recorded outputs (tests/golden/qwen2.5-coder-1.5b/,
 * flash attention off): the hyper-parameters and biases the loader finds,
 * the tokenizer on the 613 strings of tests/golden/strings.tsv, the first
 * generated position's top-10 logits and greedy continuations step by step
 * (llama.cpp's top-2 logits bit for bit at every step), and perplexity at
 * ctx 512. The first real model that does not fit in this machine's cache:
 * a decode step reads 1 GB, so the goldens are few prompts (7) and short
 * continuations (16 tokens), recorded with record.py --greedy small --n-gen 16.
 *
 * QI_TEST_QUICK=1 (the sanitizer build) checks the hyper-parameters, the
 * tokenizer and the first logits of three prompts; the greedy steps and
 * perplexity (the Check case "ppl", CTest entry test_model_qwen2_ppl) are the
 * Release build's. Without the cached model both entries are skipped (77),
 * except under CI=true, where the model is fetched (.ci/run) and its absence
 * is a failure.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qinfer/chat.h"
#include "qinfer/model.h"
#include "qinfer/perplexity.h"
#include "qinfer/sampler.h"
#include "kernels.h"
#include "testutil.h"

#define MODEL_FILE "models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
#define GOLDEN_DIR QI_SOURCE_DIR "/tests/golden/qwen2.5-coder-1.5b/"
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

START_TEST(hparams_from_metadata) {
    const qi_hparams *hp = &g_model->hp;
    ck_assert_int_eq(hp->arch, QI_ARCH_QWEN2);
    ck_assert_str_eq(hp->arch_name, "qwen2");
    ck_assert_int_eq(hp->n_layer, 28);
    ck_assert_int_eq(hp->n_embd, 1536);
    ck_assert_int_eq(hp->n_head, 12);
    ck_assert_int_eq(hp->n_head_kv, 2);
    ck_assert_int_eq(hp->head_dim, 128);
    ck_assert_int_eq(hp->n_rot, 128);
    ck_assert_int_eq(hp->n_ff, 8960);
    ck_assert_int_eq(hp->n_vocab, 151936);
    ck_assert_int_eq(hp->rope_mode, QI_ROPE_NEOX);
    ck_assert_int_eq(hp->ffn_act, QI_FFN_SWIGLU);
    ck_assert(hp->rope_base == 1000000.0f);
    ck_assert(hp->rms_eps == 1e-6f);
    ck_assert(hp->q_scale == 0.0f && hp->embd_scale == 1.0f && hp->logit_softcap == 0.0f && hp->n_swa == 0);
    /* an output head of its own, Q6_K; the embedding Q4_K */
    ck_assert(!hp->tied_output);
    ck_assert_ptr_ne(g_model->output.data, g_model->tok_embd.data);
    ck_assert_uint_eq(g_model->output.type, QI_TYPE_Q6_K);
    ck_assert_uint_eq(g_model->tok_embd.type, QI_TYPE_Q4_K);
    for (int l = 0; l < hp->n_layer; l++) {
        const qi_layer *ly = &g_model->layers[l];
        ck_assert_msg(ly->bq.data && ly->bq.n_cols == 1536, "layer %d: q bias", l);
        ck_assert_msg(ly->bk.data && ly->bk.n_cols == 256, "layer %d: k bias", l);
        ck_assert_msg(ly->bv.data && ly->bv.n_cols == 256, "layer %d: v bias", l);
        ck_assert_ptr_null(ly->bo.data);
        ck_assert_ptr_null(ly->q_norm.data);
    }
    ck_assert_ptr_nonnull(g_model->chat_template);
}
END_TEST

/* --chat: the model's own template as record.py rendered it (Jinja, no
 * system message: Qwen's default system turn) is what the ChatML format
 * builds from the template's text */
START_TEST(chat_prompt_matches_template) {
    char *text = qi_test_read_file(GOLDEN_DIR "greedy.tsv", NULL);
    ck_assert_ptr_nonnull(text);
    qi_chat_template t;
    qi_err e = {0};
    ck_assert_msg(qi_chat_detect(g_model->chat_template, g_model->hp.arch_name, &t, &e) == QI_OK, "%s", e.msg);
    ck_assert_int_eq(t.kind, QI_CHAT_CHATML);
    char *mine = NULL;
    ck_assert_int_eq(qi_chat_format(&t, NULL, "What is the capital of France?", &mine, &e), QI_OK);
    int found = 0;
    char *cur = text, *line;
    while ((line = qi_test_next_line(&cur))) {
        if (line[0] == '#' || !line[0]) continue;
        char *f[4];
        ck_assert_int_ge(qi_test_split_tabs(line, f, 4), 1);
        size_t n;
        unsigned char *prompt = qi_test_unhex(f[0], &n);
        if (n > 12 && !memcmp(prompt, "<|im_start|>", 12)) {
            ck_assert_msg(n == strlen(mine) && !memcmp(prompt, mine, n), "template rendered %.*s, --chat builds %s",
                          (int)n, prompt, mine);
            found++;
        }
        free(prompt);
    }
    ck_assert_int_eq(found, 1);
    qi_free(mine);
    free(text);
}
END_TEST

START_TEST(tokenizer_matches_llama_cpp) {
    qi_tok_golden *gl;
    size_t n = qi_tok_golden_read(GOLDEN_DIR "tokenize.tsv", &gl);
    ck_assert_uint_eq(n, 613);
    size_t bad = qi_tok_golden_check(g_model->tok, gl, n, "qwen2 tokenizer golden");
    qi_tok_golden_free(gl, n);
    ck_assert_msg(bad == 0, "%zu golden lines differ from llama.cpp", bad);
}
END_TEST

START_TEST(first_logits_match_llama_cpp) { qi_test_golden_first_logits(g_model, GOLDEN_DIR "logits.tsv"); }
END_TEST

/* With --repack on the AMX kernels the q4_K/q6_K matrices are also held in
 * the tiles' packed form, which the prompts' matmuls (8+ tokens) read: the
 * same logits, bit for bit. Added only where that form exists. */
START_TEST(first_logits_match_llama_cpp_repacked) {
    ck_assert_int_eq(qi_model_n_packable(g_model), qi_model_n_matrices(g_model));
    qi_test_repack = true;
    qi_test_golden_first_logits(g_model, GOLDEN_DIR "logits.tsv");
    qi_test_repack = false;
}
END_TEST

START_TEST(greedy_matches_llama_cpp) {
    qi_test_greedy r;
    qi_test_golden_greedy(g_model, GOLDEN_DIR "greedy.tsv", 0, &r);
    ck_assert_int_ge(r.n_prompts, 7);
    ck_assert_int_ge(r.steps, 7 * 16);
    ck_assert_msg(r.agree == r.steps, "argmax agrees with llama.cpp at %d of %d steps", r.agree, r.steps);
    ck_assert_msg(r.exact == r.steps, "top-2 logits bit-identical at %d of %d steps (max |diff| %g)", r.exact,
                  r.steps, r.worst);
}
END_TEST

/* Perplexity against llama-perplexity's figures in ppl.tsv (the commands
 * are in its header): ctx 512 over the first chunks the file records (the
 * whole-corpus figure is for the record, not for CI). Printed to 4
 * decimals, hence the tolerance. */
START_TEST(perplexity_matches_llama_cpp) {
    ck_assert_int_ge(qi_test_golden_ppl(g_model, CORPUS_FILE, GOLDEN_DIR "ppl.tsv", 512, 2, true), 1);
}
END_TEST

int main(void) {
    const bool ppl = strcmp(qi_test_case(), "ppl") == 0;
    const char *name = ppl ? "test_model_qwen2_ppl" : "test_model_qwen2";
    if (ppl && qi_test_quick()) return qi_test_skip(name, "quick mode (QI_TEST_QUICK=1)");
    if (!qi_test_cached(MODEL_FILE)) {
        const char *ci = getenv("CI");
        if (ci && !strcmp(ci, "true")) {
            fprintf(stderr, "%s: FAILED: " MODEL_FILE " not cached under CI=true (.ci/run fetches it)\n", name);
            return 1;
        }
        return qi_test_skip(name, MODEL_FILE " not cached (models/fetch.sh qwen2.5-coder-1.5b)");
    }
    Suite *su = suite_create("model_qwen2");
    TCase *tc = tcase_create("golden");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 1800);
    tcase_add_test(tc, hparams_from_metadata);
    tcase_add_test(tc, tokenizer_matches_llama_cpp);
    tcase_add_test(tc, chat_prompt_matches_template);
    tcase_add_test(tc, first_logits_match_llama_cpp); /* quick mode: the first 3 prompts */
    if (qi_kernels_amx())
        tcase_add_test(tc, first_logits_match_llama_cpp_repacked);
    else
        printf("first_logits_match_llama_cpp_repacked: skipped: %s\n", qi_kernels_amx_absent());
    if (!qi_test_quick()) tcase_add_test(tc, greedy_matches_llama_cpp);
    suite_add_tcase(su, tc);
    /* a CTest entry of its own (test_model_qwen2_ppl), skipped in quick mode */
    tc = tcase_create("ppl");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 1800);
    tcase_add_test(tc, perplexity_matches_llama_cpp);
    suite_add_tcase(su, tc);
    return qi_test_run_suite(su);
}

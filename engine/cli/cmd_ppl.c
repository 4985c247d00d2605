/* cmd_ppl.c - `qinfer ppl`: perplexity as llama-perplexity computes it.
 *
 * The whole text is tokenised once (with BOS if the model adds one), cut into
 * non-overlapping chunks of n_ctx tokens (at most n_tokens / n_ctx of them);
 * each chunk starts a fresh context with its first token replaced by BOS
 * (when the model adds BOS) and only the second half is scored: the logits at
 * positions n_ctx/2 .. n_ctx-2 predict the next token. PPL = exp(mean NLL);
 * the +/- is ppl * sqrt(var(NLL) / (count - 1)), as llama-perplexity prints.
 *
 * With --decode, or any KV policy flag, the same chunks are decoded token by
 * token through the batched engine (several chunks at once, --batch), so the
 * policy's evictions really apply while the second half is scored.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "qinfer/model_files.h"
#include "qinfer/perplexity.h"
#include "qinfer/model.h"
#include "threadpool.h"

static void help(void) {
    printf(
        "usage: qinfer ppl [-m MODEL] -f FILE [--ctx N] [--chunks N] [-t N]\n"
        "                  [--decode] [--batch N] [--kv-policy P --kv-budget B ...]\n\n"
        "Perplexity of a text file, computed as llama-perplexity does: non-overlapping\n"
        "chunks of N tokens, each scored on its second half. By default each chunk is\n"
        "one batch with the full KV cache (equal to llama-perplexity -fa off). With\n"
        "--decode or a KV policy, chunks are decoded one token per step so that the\n"
        "policy evicts as it would during generation.\n\n"
        "  -m, --model MODEL   GGUF path or cached short name (default smollm2-135m)\n"
        "  -f, --file FILE     text file, or a cached corpus short name (e.g. devil)\n"
        "  -c, --ctx N         tokens per chunk (default 512)\n"
        "      --chunks N      score only the first N chunks (default: all)\n"
        "  -t, --threads N     worker threads (default: physical cores)\n"
        "      --decode        decode token by token (implied by the KV flags)\n"
        "      --batch N       chunks decoded at once in decode mode (default 4)\n"
        QI_CLI_REPACK_HELP
        "      --attn-blas     prompt chunks' attention through OpenBLAS sgemm: faster,\n"
        "                      but not bit-exact with llama.cpp (needs libopenblas0)\n");
    qi_cli_kv_help();
    qi_cli_place_help();
    qi_cli_neuron_help();
    printf("  -h, --help          this help\n");
}

typedef struct {
    double t0;
} progress_state;

static void progress(void *ud, int done, int total, double ppl) {
    progress_state *ps = ud;
    double el = qi_now_s() - ps->t0;
    fprintf(stderr, "[%d/%d] ppl %.4f  %.1f s/chunk, ETA %.0f s\n", done, total, ppl, el / done,
            el / done * (total - done));
}

int qi_cmd_ppl(int argc, char **argv) {
    const char *cmd = "ppl", *model_arg = "smollm2-135m", *file_arg = NULL;
    int n_ctx = 512, max_chunks = -1, n_threads = qi_n_physical_cores(), batch = 4;
    bool decode = false, repack = false, attn_blas = false;
    qi_cli_kv kvo;
    qi_cli_kv_init(&kvo);
    qi_cli_neuron_allow(&kvo);
    qi_args a;
    qi_args_init(&a, cmd, argc, argv);
    while (qi_args_next(&a)) {
        if (qi_args_is(&a, "-h", "--help")) { help(); return 0; }
        else if (qi_args_is(&a, "-m", "--model")) model_arg = qi_args_str(&a);
        else if (qi_args_is(&a, "-f", "--file")) file_arg = qi_args_str(&a);
        else if (qi_args_is(&a, "-c", "--ctx")) qi_args_int(&a, 8, 1 << 20, &n_ctx);
        else if (qi_args_is(&a, NULL, "--chunks")) qi_args_int(&a, 1, 1 << 30, &max_chunks);
        else if (qi_args_is(&a, "-t", "--threads")) qi_args_int(&a, 1, 1024, &n_threads);
        else if (qi_args_is(&a, NULL, "--decode")) decode = true;
        else if (qi_args_is(&a, NULL, "--repack")) repack = true;
        else if (qi_args_is(&a, NULL, "--attn-blas")) attn_blas = true;
        else if (qi_args_is(&a, NULL, "--batch")) qi_args_int(&a, 1, 256, &batch);
        else if (qi_cli_place_flag(&a, &kvo))
            continue;
        else if (qi_cli_kv_flag(&a, &kvo)) decode = true;
        else qi_args_unknown(&a);
    }
    if (a.failed) return QI_EXIT_USAGE;
    if (!file_arg) {
        qi_cli_error(cmd, "no text given: use -f FILE (see qinfer ppl --help)");
        return QI_EXIT_USAGE;
    }
    qi_err err = {0};
    char mpath[1024], fpath[1024];
    qi_model *m = NULL;
    qi_engine *eng = NULL;
    char *text = NULL;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    int rc = 0;
    if (qi_cache_resolve(model_arg, "model", mpath, sizeof mpath, &err) ||
        qi_cache_resolve(file_arg, "corpus", fpath, sizeof fpath, &err) || qi_cli_load_model(mpath, repack, &m, &err) ||
        qi_cli_kv_check(&kvo, m->hp.n_layer, &err) || qi_cli_neuron_prepare(cmd, &kvo, m, decode ? batch : 1, &err))
        goto fail;
    if (n_ctx > m->hp.n_ctx_train) {
        QI_ERR(&err, QI_ERR_INVALID, "--ctx %d exceeds the model's training context %d", n_ctx, m->hp.n_ctx_train);
        goto fail;
    }
    FILE *f = fopen(fpath, "rb");
    if (!f) {
        QI_ERR(&err, QI_ERR_IO, "%s: cannot open", fpath);
        goto fail;
    }
    size_t cap = 1 << 16, len = 0, got;
    text = qi_malloc(cap);
    while (text && (got = fread(text + len, 1, cap - len, f)) > 0) {
        len += got;
        if (len == cap) {
            char *p = qi_realloc(text, cap * 2);
            if (!p) { qi_free(text); text = NULL; break; }
            text = p;
            cap *= 2;
        }
    }
    fclose(f);
    if (!text) {
        QI_ERR(&err, QI_ERR_NOMEM, "out of memory reading %s", fpath);
        goto fail;
    }
    /* llama-perplexity drops one trailing newline before tokenising */
    if (len > 0 && text[len - 1] == '\n') len--;
    if (qi_tokenize(m->tok, text, len, true, false, &ids, &n_ids, &err)) goto fail;
    if (n_ids < 2 * (size_t)n_ctx) {
        QI_ERR(&err, QI_ERR_INVALID, "%s is %zu tokens; perplexity at --ctx %d needs at least %d", fpath, n_ids,
               n_ctx, 2 * n_ctx);
        goto fail;
    }
    int n_chunk = (int)(n_ids / (size_t)n_ctx);
    if (max_chunks > 0 && max_chunks < n_chunk) n_chunk = max_chunks;
    progress_state ps = {qi_now_s()};
    qi_ppl_result r;
    qi_engine_opts eo;
    qi_engine_opts_default(&eo);
    eo.n_threads = n_threads;
    eo.n_ctx = n_ctx;
    eo.attn_blas = attn_blas;
    eo.repack = repack;
    if (!decode) batch = 1; /* whole chunks run one after another */
    eo.max_seqs = batch < n_chunk ? batch : n_chunk;
    qi_cli_kv_apply(&kvo, &eo);
    if (qi_engine_create(m, &eo, &eng, &err)) goto fail;
    char desc[512];
    qi_cli_kv_describe(&kvo, desc, sizeof desc);
    const char *blas_note = attn_blas ? ", prompt attention through OpenBLAS" : "";
    if (decode)
        fprintf(stderr, "qinfer ppl: %s, %zu tokens, %d chunks of %d decoded token by token, %d at once, KV %s, "
                        "%d threads%s\n", fpath, n_ids, n_chunk, n_ctx, eo.max_seqs, desc, n_threads, blas_note);
    else
        fprintf(stderr, "qinfer ppl: %s, %zu tokens, %d chunks of %d, %d threads%s\n", fpath, n_ids, n_chunk, n_ctx,
                n_threads, blas_note);
    qi_ppl_kv kv;
    if (qi_perplexity_engine(m, eng, ids, n_ids, n_ctx, max_chunks, eo.max_seqs, decode, progress, &ps, &r, &kv,
                             &err))
        goto fail;
    if (!decode) {
        printf("chunks %d  ctx %d  scored %ld tokens\n", r.n_chunks, n_ctx, r.count);
        printf("Final estimate: PPL = %.4f +/- %.5f\n", r.ppl, r.ppl_err);
        qi_cli_neuron_print_rp(&kvo, eng, m->hp.n_layer);
        goto done;
    }
    const long streams = (long)m->hp.n_layer * m->hp.n_head_kv;
    printf("chunks %d  ctx %d  scored %ld tokens  decode mode  kv %s\n", r.n_chunks, n_ctx, r.count, desc);
    if (qi_engine_kv_budget_attended(eng)) /* the budget counts what attention reads */
        printf("kv: attended tokens per layer and KV head %.1f, of %.1f working, offloaded %.1f (mean over scored "
               "steps; positions %d..%d)\n", kv.attn_tokens / streams, kv.work_tokens / streams,
               kv.off_tokens / streams, n_ctx / 2, n_ctx - 2);
    else
        printf("kv: working tokens per layer and KV head %.1f, offloaded %.1f (mean over scored steps; positions "
               "%d..%d)\n", kv.work_tokens / streams, kv.off_tokens / streams, n_ctx / 2, n_ctx - 2);
    if (qi_engine_sparsity_measured(eng) >= 0)
        printf("sparsity: %s, target %g, measured %.4f of the thresholded activations zeroed\n", kvo.sparsity_mode,
               kvo.sparsity, qi_engine_sparsity_measured(eng));
    printf("Final estimate: PPL = %.4f +/- %.5f\n", r.ppl, r.ppl_err);
    qi_cli_neuron_print_rp(&kvo, eng, m->hp.n_layer);
    goto done;
fail:
    rc = qi_cli_fail(cmd, &err);
done:
    qi_free(ids);
    qi_free(text);
    qi_engine_free(eng);
    qi_model_free(m);
    qi_cli_kv_fini(&kvo);
    return rc;
}

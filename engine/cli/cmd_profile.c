/* cmd_profile.c - `qinfer profile`: the FFN neuron profiler.
 *
 * How concentrated and how stable the FFN's work is, on a real model over a
 * real text: the corpus is tokenised once (with BOS if the model adds one),
 * and its first --tokens tokens (after the first --skip, so that a calibration
 * can come from another part of the text than a perplexity scores) run
 * through the engine in chunks of --ctx,
 * each chunk a fresh sequence whose first token is BOS (when the model adds
 * one; as qinfer ppl does), every row observed (logits for every token, so
 * the last layer sees every row too). The engine's FFN observer
 * (qi_engine_opts.ffn_observe) hands each layer's activations act =
 * act_fn(gate) * up, before the down projection, to the profiler's core
 * (engine/ffn_profile.c, qinfer/ffn_profile.h), which counts per neuron
 * the tokens with |act| > threshold, the tokens it is among the token's
 * hot set (top --top of the layer's neurons by |act|) and its mass (sum of
 * |act|), and per layer the hot sets' overlap between consecutive tokens
 * and between consecutive --window-token windows, and the mass share of the
 * top --top neurons by mass. Consecutive pairs and windows never span two
 * chunks.
 *
 * The threshold: the gated SiLU/GELU activations of these models are
 * almost never exactly zero, so "fires" needs a magnitude cut, and any
 * cut is a choice. The default, 0.1, is absolute; the hot counts (a
 * neuron in its token's top fraction) and the masses do not depend on it
 * and are the figures the locality and placement questions read.
 *
 * -o FILE: the per-neuron figures, text (format in qinfer/ffn_profile.h):
 * a header of '#' lines naming the model, corpus, tokens, chunk length,
 * threshold, top fraction and window and each layer's figures, then one
 * line per neuron: layer neuron active hot mass.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "qinfer/ffn_profile.h"
#include "qinfer/model.h"
#include "qinfer/model_files.h"
#include "qinfer/sparsity.h"
#include "qinfer/tokenizer.h"
#include "threadpool.h"

static void help(void) {
    printf(
        "usage: qinfer profile [-m MODEL] -f CORPUS [--tokens N] [--skip N] [--ctx N] [--threshold T]\n"
        "                      [--top F] [--window N] [-o FILE] [--sparsity-out FILE] [-t N]\n"
        "                      [--devices LIST --placement P]   (every MLP on the CPU)\n\n"
        "FFN neuron profile: runs the model over a text in chunks and records, per layer\n"
        "and neuron, how often and how strongly the FFN's activation act = act(gate) * up\n"
        "(before the down projection) fires, and how stable each token's hot set is.\n"
        "Prints a table per layer and a summary line; -o writes every neuron's figures.\n\n"
        "  -m, --model MODEL   GGUF path or cached short name (default smollm2-135m)\n"
        "  -f, --file CORPUS   text file, or a cached corpus short name (e.g. devil)\n"
        "      --tokens N      tokens profiled, from the corpus's start (default 4096;\n"
        "                      fewer if the corpus is shorter)\n"
        "      --skip N        start at the corpus's token N (default 0), e.g. to calibrate\n"
        "                      on another part of it than qinfer ppl --chunks scores\n"
        "  -c, --ctx N         tokens per chunk, each a fresh sequence (default 512)\n"
        "      --threshold T   a neuron is active on a token when |act| > T (default 0.1;\n"
        "                      gated activations are rarely exactly 0, so a cut is needed)\n"
        "      --top F         hot-set fraction of the layer's neurons, in (0, 1] (default 0.2)\n"
        "      --window N      tokens per window for the window overlap (default 64)\n"
        "  -o, --output FILE   per-neuron figures: '#' header lines (model, corpus, tokens,\n"
        "                      ctx, threshold, top, k, window, each layer's figures), then\n"
        "                      one line per neuron: layer neuron active hot mass\n"
        "      --sparsity-out FILE  the activation-sparsity calibration: per layer, the\n"
        "                      |activation| quantiles at every site (the inputs of q/k/v,\n"
        "                      o, gate/up and down, and act(gate)) over the profiled tokens,\n"
        "                      which --sparsity S --sparsity-calib FILE thresholds at S;\n"
        "                      run under --sparsity S --sparsity-calib F0 [--sparsity-mode M]\n"
        "                      it observes the activations under that sparsity (each site's\n"
        "                      input shrunk by the sites before it), a second pass whose\n"
        "                      thresholds hit S more closely at every site\n"
        "      --sparsity S, --sparsity-calib F, --sparsity-mode M  (see qinfer ppl --help)\n"
        "  -t, --threads N     worker threads (default: physical cores)\n");
    qi_cli_place_help();
    printf(
        "  -h, --help          this help\n\n"
        "Columns: active = mean share of neurons with |act| > T per token; tok_ov = mean\n"
        "|H_t & H_t+1| / k over consecutive tokens, H_t the top k = F * n_ff neurons by\n"
        "|act| at token t; win_ov = the same between consecutive N-token windows, a\n"
        "window's hot set by summed |act|; mass_top = share of the layer's activation mass\n"
        "(sum of |act|) on the top k neurons by mass over the run. Hot sets drawn at\n"
        "random would overlap by F on average. Every MLP must run on the CPU.\n");
}

typedef struct {
    qi_ffnprof *p;
} observe_ctx;

static void observe_act(void *ctx, int layer, int site, const float *x, int rows, int width) {
    qi_sparsity_calib_add(ctx, layer, site, x, (long)rows * width);
}

static void observe(void *ctx, int layer, const float *act, int rows, int n_ff) {
    (void)n_ff;
    qi_ffnprof_add(((observe_ctx *)ctx)->p, layer, act, rows);
}

static qi_status read_text(const char *path, char **out, size_t *n, qi_err *err) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return QI_ERR(err, QI_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    size_t cap = 1 << 16, len = 0, got;
    char *text = qi_malloc(cap);
    while (text && (got = fread(text + len, 1, cap - len, f)) > 0) {
        len += got;
        if (len == cap) {
            char *q = qi_realloc(text, cap * 2);
            if (!q) { qi_free(text); text = NULL; break; }
            text = q;
            cap *= 2;
        }
    }
    const bool bad = ferror(f);
    fclose(f);
    if (!text) return QI_ERR(err, QI_ERR_NOMEM, "out of memory reading %s", path);
    if (bad) {
        qi_free(text);
        return QI_ERR(err, QI_ERR_IO, "%s: read error", path);
    }
    *out = text;
    *n = len;
    return QI_OK;
}

int qi_cmd_profile(int argc, char **argv) {
    const char *cmd = "profile", *model_arg = "smollm2-135m", *file_arg = NULL, *out_arg = NULL, *sp_out = NULL;
    int n_tokens = 4096, n_skip = 0, n_ctx = 512, n_threads = qi_n_physical_cores(), window = 64;
    float threshold = 0.1f;
    double top = 0.2;
    qi_cli_kv kvo;
    qi_cli_kv_init(&kvo);
    qi_args a;
    qi_args_init(&a, cmd, argc, argv);
    while (qi_args_next(&a)) {
        if (qi_args_is(&a, "-h", "--help")) { help(); return 0; }
        else if (qi_args_is(&a, "-m", "--model")) model_arg = qi_args_str(&a);
        else if (qi_args_is(&a, "-f", "--file")) file_arg = qi_args_str(&a);
        else if (qi_args_is(&a, "-o", "--output")) out_arg = qi_args_str(&a);
        else if (qi_args_is(&a, NULL, "--sparsity-out")) sp_out = qi_args_str(&a);
        else if (qi_args_is(&a, NULL, "--tokens")) qi_args_int(&a, 1, 1 << 30, &n_tokens);
        else if (qi_args_is(&a, NULL, "--skip")) qi_args_int(&a, 0, 1 << 30, &n_skip);
        else if (qi_args_is(&a, "-c", "--ctx")) qi_args_int(&a, 2, 1 << 20, &n_ctx);
        else if (qi_args_is(&a, NULL, "--window")) qi_args_int(&a, 1, 1 << 20, &window);
        else if (qi_args_is(&a, "-t", "--threads")) qi_args_int(&a, 1, 1024, &n_threads);
        else if (qi_args_is(&a, NULL, "--threshold")) qi_args_float(&a, 0.0, 1e30, &threshold);
        else if (qi_args_is(&a, NULL, "--top")) {
            const char *s = qi_args_str(&a);
            if (!s) continue;
            char *end;
            errno = 0;
            const double v = strtod(s, &end);
            if (errno || end == s || *end || !(v > 0.0 && v <= 1.0)) {
                qi_cli_error(cmd, "option --top: '%s' is not a fraction in (0, 1]", s);
                a.failed = true;
            } else {
                top = v;
            }
        } else if (qi_cli_place_flag(&a, &kvo) || qi_cli_kv_flag(&a, &kvo)) continue;
        else qi_args_unknown(&a);
        if (a.failed) break;
    }
    if (a.failed) return QI_EXIT_USAGE;
    if (!file_arg) {
        qi_cli_error(cmd, "no corpus given: use -f CORPUS (see qinfer profile --help)");
        return QI_EXIT_USAGE;
    }
    if ((out_arg && !*out_arg) || (sp_out && !*sp_out)) {
        qi_cli_error(cmd, "option %s: empty file name", out_arg && !*out_arg ? "-o" : "--sparsity-out");
        return QI_EXIT_USAGE;
    }
    qi_err err = {0};
    char mpath[1024], fpath[1024];
    qi_model *m = NULL;
    qi_engine *eng = NULL;
    qi_ffnprof *prof = NULL;
    qi_sparsity_calib *cal = NULL;
    char *text = NULL;
    int32_t *ids = NULL;
    size_t n_ids = 0, len = 0;
    FILE *out = NULL;
    int rc = 0;
    if (qi_cache_resolve(model_arg, "model", mpath, sizeof mpath, &err) ||
        qi_cache_resolve(file_arg, "corpus", fpath, sizeof fpath, &err))
        goto fail;
    if (out_arg && !(out = fopen(out_arg, "w"))) { /* before the run, not after it */
        QI_ERR(&err, QI_ERR_IO, "%s: cannot write: %s", out_arg, strerror(errno));
        goto fail;
    }
    if (sp_out) {
        FILE *f = fopen(sp_out, "a");
        if (!f) {
            QI_ERR(&err, QI_ERR_IO, "%s: cannot write: %s", sp_out, strerror(errno));
            goto fail;
        }
        fclose(f);
    }
    if (qi_cli_load_model(mpath, false, &m, &err) || qi_cli_kv_check(&kvo, m->hp.n_layer, &err)) goto fail;
    if (n_ctx > m->hp.n_ctx_train) {
        QI_ERR(&err, QI_ERR_INVALID, "--ctx %d exceeds the model's training context %d", n_ctx, m->hp.n_ctx_train);
        goto fail;
    }
    if (read_text(fpath, &text, &len, &err) || qi_tokenize(m->tok, text, len, true, false, &ids, &n_ids, &err))
        goto fail;
    if (n_ids < (size_t)n_skip + 2) {
        QI_ERR(&err, QI_ERR_INVALID, "%s is %zu tokens; the profile needs at least 2 after --skip %d", fpath, n_ids,
               n_skip);
        goto fail;
    }
    const int32_t *const from = ids + n_skip;
    const size_t n_from = n_ids - (size_t)n_skip;
    const int total = n_from < (size_t)n_tokens ? (int)n_from : n_tokens;
    qi_ffnprof_opts po = {.threshold = threshold, .top = top, .window = window};
    if (qi_ffnprof_create(m->hp.n_layer, m->hp.n_ff, &po, &prof, &err)) goto fail;
    observe_ctx oc = {prof};
    qi_engine_opts eo;
    qi_engine_opts_default(&eo);
    eo.n_threads = n_threads;
    eo.max_seqs = 1;
    eo.n_ctx = n_ctx;
    eo.ffn_observe = observe;
    eo.ffn_observe_ctx = &oc;
    if (sp_out) {
        if (qi_sparsity_calib_new(m->hp.n_layer, &cal, &err)) goto fail;
        eo.act_observe = observe_act;
        eo.act_observe_ctx = cal;
    }
    qi_cli_kv_apply(&kvo, &eo);
    if (qi_engine_create(m, &eo, &eng, &err)) goto fail;
    const int n_chunk = (total + n_ctx - 1) / n_ctx;
    fprintf(stderr, "qinfer profile: %s, %s: %d of %zu tokens from token %d in %d chunks of up to %d, %d threads\n",
            mpath, fpath, total, n_ids, n_skip, n_chunk, n_ctx, n_threads);
    const bool add_bos = qi_tokenizer_add_bos(m->tok);
    const int32_t bos = qi_tokenizer_bos(m->tok);
    const double t0 = qi_now_s();
    for (int c = 0; c < n_chunk; c++) {
        const int off = c * n_ctx, n = total - off < n_ctx ? total - off : n_ctx;
        if (add_bos && bos >= 0) ids[n_skip + off] = bos;
        int id;
        if (qi_engine_seq_add(eng, &id, &err) || qi_engine_seq_feed(eng, id, from + off, n, true, &err)) goto fail;
        while (qi_engine_seq_pending(eng, id) > 0)
            if (qi_engine_step(eng, NULL, &err)) goto fail;
        if (qi_engine_seq_remove(eng, id, &err)) goto fail;
        qi_ffnprof_end_seq(prof);
        const double el = qi_now_s() - t0;
        fprintf(stderr, "[%d/%d] %.1f s/chunk, ETA %.0f s\n", c + 1, n_chunk, el / (c + 1),
                el / (c + 1) * (n_chunk - c - 1));
    }
    const int k = qi_ffnprof_k(prof);
    printf("model %s  corpus %s  tokens %d  ctx %d  layers %d  n_ff %d\n", mpath, fpath, total, n_ctx, m->hp.n_layer,
           m->hp.n_ff);
    printf("threshold %g  top %g (k = %d neurons; random hot sets overlap %.3f)  window %d\n", (double)threshold,
           top, k, (double)k / m->hp.n_ff, window);
    printf("%5s %8s %8s %8s %8s\n", "layer", "active", "tok_ov", "win_ov", "mass_top");
    double s_act = 0, s_tok = 0, s_win = 0, s_mass = 0;
    for (int l = 0; l < m->hp.n_layer; l++) {
        qi_ffnprof_layer s;
        qi_ffnprof_layer_get(prof, l, &s);
        printf("%5d %8.3f %8.3f %8.3f %8.3f\n", l, s.active_frac, s.tok_overlap, s.win_overlap, s.mass_share);
        s_act += s.active_frac;
        s_tok += s.tok_overlap;
        s_win += s.win_overlap;
        s_mass += s.mass_share;
    }
    const double L = m->hp.n_layer;
    printf("summary: %s  layers %d  mean active %.3f  tok_ov %.3f  win_ov %.3f  mass_top %.3f  (top %g, window %d, "
           "%d tokens)\n", mpath, m->hp.n_layer, s_act / L, s_tok / L, s_win / L, s_mass / L, top, window, total);
    if (out) {
        if (qi_ffnprof_write(prof, out, mpath, fpath, n_ctx, &err)) goto fail;
        const int cl = fclose(out);
        out = NULL;
        if (cl != 0) {
            QI_ERR(&err, QI_ERR_IO, "%s: writing failed: %s", out_arg, strerror(errno));
            goto fail;
        }
        fprintf(stderr, "qinfer profile: wrote %s\n", out_arg);
    }
    if (cal) {
        if (qi_sparsity_calib_write(cal, sp_out, mpath, total, &err)) goto fail;
        fprintf(stderr, "qinfer profile: wrote %s (sparsity calibration)\n", sp_out);
    }
    goto done;
fail:
    rc = qi_cli_fail(cmd, &err);
done:
    if (out) fclose(out);
    qi_ffnprof_free(prof);
    qi_sparsity_calib_free(cal);
    qi_free(ids);
    qi_free(text);
    qi_engine_free(eng);
    qi_model_free(m);
    return rc;
}

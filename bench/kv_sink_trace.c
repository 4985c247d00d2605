/* kv_sink_trace.c - which of a sequence's first tokens a KV policy keeps,
 * step by step, beside the perplexity of the same steps.
 *
 * SmolLM2 has no BOS token and uses its first tokens as attention sinks;
 * StreamingLLM showed that a cache which drops them collapses. This
 * program decodes one chunk of a corpus token by token, as `qinfer ppl
 * --decode` does (the same engine, the same scoring of the chunk's second
 * half), under a policy and a budget, and after every scored step counts
 * the streams (layer x KV head) whose working tier still holds each of
 * positions 0..3. It prints, per window of scored steps, the window's
 * perplexity and those counts, so a rise in perplexity can be laid beside
 * the loss of the sinks. A chunk's result does not depend on the others
 * decoded beside it (test_engine checks it), so one chunk alone gives the
 * figures `ppl --batch 4` gets for it. --from N starts the windows at step
 * N instead of the first scored one (steps before the scored half show no
 * perplexity), and --steps N stops after N steps, to see when the first
 * tokens go.
 *
 *   bench_kv_sink_trace -m MODEL -f CORPUS [--ctx N] [--chunk I] [--window N] [--from N]
 *                       [--steps N] [-t N] [--kv-policy P] [--kv-budget B] [--kv-param K=V,...]
 *
 * Only an analysis aid; `qinfer ppl` is the measurement.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qinfer/engine.h"
#include "qinfer/model.h"
#include "qinfer/model_files.h"
#include "qinfer/params.h"
#include "qinfer/perplexity.h"
#include "qinfer/tokenizer.h"

#define N_SINKS 4

static int usage(void) {
    fprintf(stderr, "usage: bench_kv_sink_trace -m MODEL -f CORPUS [--ctx N] [--chunk I] [--window N] [--from N] "
                    "[--steps N] [-t N] [--kv-policy P] [--kv-budget B] [--kv-param K=V,...]\n");
    return 2;
}

static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) {
        free(s);
        s = NULL;
    }
    fclose(f);
    *len = s ? (size_t)n : 0;
    return s;
}

int main(int argc, char **argv) {
    const char *model = "smollm2-135m", *corpus = "devil", *policy = "full", *budget = NULL, *kvp = "";
    int n_ctx = 2048, chunk = 0, window = 128, threads = 2, from = -1, steps = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) return usage();
        if (!strcmp(a, "-m")) model = v;
        else if (!strcmp(a, "-f")) corpus = v;
        else if (!strcmp(a, "--ctx")) n_ctx = atoi(v);
        else if (!strcmp(a, "--chunk")) chunk = atoi(v);
        else if (!strcmp(a, "--window")) window = atoi(v);
        else if (!strcmp(a, "--from")) from = atoi(v);
        else if (!strcmp(a, "--steps")) steps = atoi(v);
        else if (!strcmp(a, "-t")) threads = atoi(v);
        else if (!strcmp(a, "--kv-policy")) policy = v;
        else if (!strcmp(a, "--kv-budget")) budget = v;
        else if (!strcmp(a, "--kv-param")) kvp = v;
        else return usage();
        i++;
    }
    if (n_ctx < 8 || chunk < 0 || window < 1 || threads < 1) return usage();
    qi_err err = {0};
    char mpath[4096], fpath[4096];
    qi_model *m = NULL;
    if (qi_cache_resolve(model, "model", mpath, sizeof mpath, &err) ||
        qi_cache_resolve(corpus, "corpus", fpath, sizeof fpath, &err) || qi_model_load(mpath, &m, &err)) {
        fprintf(stderr, "bench_kv_sink_trace: %s\n", err.msg);
        return 1;
    }
    size_t len;
    char *text = read_file(fpath, &len);
    if (!text) {
        fprintf(stderr, "bench_kv_sink_trace: cannot read %s\n", fpath);
        return 1;
    }
    if (len > 0 && text[len - 1] == '\n') len--; /* as qinfer ppl */
    int32_t *ids = NULL;
    size_t n_ids = 0;
    if (qi_tokenize(m->tok, text, len, true, false, &ids, &n_ids, &err)) {
        fprintf(stderr, "bench_kv_sink_trace: %s\n", err.msg);
        return 1;
    }
    if ((size_t)(chunk + 1) * (size_t)n_ctx > n_ids) {
        fprintf(stderr, "bench_kv_sink_trace: the text has %zu tokens, no chunk %d of %d\n", n_ids, chunk, n_ctx);
        return 1;
    }
    qi_params params;
    qi_params_init(&params);
    if (qi_params_parse(&params, kvp, &err)) {
        fprintf(stderr, "bench_kv_sink_trace: --kv-param: %s\n", err.msg);
        return 1;
    }
    qi_engine_opts o;
    qi_engine_opts_default(&o);
    o.n_threads = threads;
    o.n_ctx = n_ctx;
    o.max_seqs = 1;
    o.kv_policy = policy;
    o.kv_params = &params;
    if (budget) {
        const size_t bl = strlen(budget);
        if (bl > 0 && budget[bl - 1] == '%') o.kv_budget_frac = atof(budget) / 100.0;
        else o.kv_budget_tokens = atoi(budget);
    }
    qi_engine *e = NULL;
    int id;
    if (qi_engine_create(m, &o, &e, &err) || qi_engine_seq_add(e, &id, &err)) {
        fprintf(stderr, "bench_kv_sink_trace: %s\n", err.msg);
        return 1;
    }
    const int L = m->hp.n_layer, Hkv = m->hp.n_head_kv, V = m->hp.n_vocab, first = n_ctx / 2;
    if (from < 0 || from > first) from = first;
    const int last = steps > 0 && steps < n_ctx - 1 ? steps - 1 : n_ctx - 2; /* the last step traced */
    const int32_t *c = ids + (size_t)chunk * n_ctx;
    printf("kv_sink_trace: %s, chunk %d of %d tokens, policy %s, budget %s%s%s; %d streams (layer x KV head)\n",
           model, chunk + 1, n_ctx, policy, budget ? budget : "none", kvp[0] ? ", " : "", kvp, L * Hkv);
    printf("| scored steps | PPL | streams holding position 0 | 1 | 2 | 3 | all of 0..3 |\n|---|---|---|---|---|---|---|\n");
    double nll = 0, nll_all = 0, held[N_SINKS + 1] = {0};
    int in_win = 0, scored = 0, w0 = from;
    for (int j = 0; j <= last; j++) {
        int32_t tok = c[j];
        if (j == 0 && qi_tokenizer_add_bos(m->tok)) tok = qi_tokenizer_bos(m->tok);
        if (qi_engine_seq_feed(e, id, &tok, 1, false, &err) || qi_engine_step(e, NULL, &err)) {
            fprintf(stderr, "bench_kv_sink_trace: step %d: %s\n", j, err.msg);
            return 1;
        }
        if (j < from) continue;
        if (j >= first) {
            const double lp = qi_log_prob(qi_engine_seq_logits(e, id, -1), V, c[j + 1]);
            nll -= lp;
            nll_all -= lp;
            scored++;
        }
        for (int l = 0; l < L; l++)
            for (int hk = 0; hk < Hkv; hk++) {
                const int32_t *pos;
                const float *score;
                const int n = qi_engine_kv_stream_tokens(e, id, l, hk, 0, &pos, &score);
                int got = 0;
                for (int i = 0; i < n; i++)
                    if (pos[i] < N_SINKS) {
                        held[pos[i]]++;
                        got++;
                    }
                held[N_SINKS] += got == N_SINKS;
            }
        if (++in_win == window || j == last) {
            if (j >= first && w0 >= first) printf("| %d-%d | %.2f |", w0, j, exp(nll / in_win));
            else printf("| %d-%d | - |", w0, j);
            for (int s = 0; s <= N_SINKS; s++) printf(" %.1f |", held[s] / in_win);
            printf("\n");
            nll = 0;
            in_win = 0;
            w0 = j + 1;
            memset(held, 0, sizeof held);
        }
    }
    if (scored > 0) printf("chunk perplexity %.4f over %d scored tokens\n", exp(nll_all / scored), scored);
    qi_engine_free(e);
    qi_model_free(m);
    qi_free(ids);
    free(text);
    return 0;
}

/* cmd_agree.c - `qinfer agree`: how closely a KV policy follows the full
 * cache over a long greedy generation.
 *
 * Two engines over one model: the reference with the full policy, the other
 * with the policy under test. Both prefill the same prompt; then, step after
 * step, the reference's greedy token is fed to both (teacher forcing), so the
 * two always condition on the same history and a single early disagreement
 * cannot send them down different texts that no longer compare. At every
 * step the two next-token distributions are compared: top-1 agreement
 * (argmax equal) and KL(full || policy) in nats, from log-softmax in double
 * with the maximum subtracted first.
 *
 * Why teacher forcing rather than two free runs compared by text: free runs
 * diverge for good at the first differing token, after which every later
 * step measures the divergence, not the policy. Why two engines rather than
 * one: the policy is an engine-wide choice. With --kv-policy full both
 * engines do the same arithmetic in the same order, so the comparison must
 * give 100% and a KL of exactly 0 (the CLI tests hold it to that).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "qinfer/model_files.h"
#include "qinfer/engine.h"
#include "qinfer/model.h"
#include "threadpool.h"

static void help(void) {
    printf(
        "usage: qinfer agree [-m MODEL] (-p TEXT | -f FILE) [options]\n\n"
        "Compare a KV policy with the full cache over a greedy generation: both see the\n"
        "same prompt, then the full cache's greedy token is fed to both at every step\n"
        "(end-of-generation tokens included), and their next-token distributions are\n"
        "compared: top-1 agreement and KL(full || policy) in nats.\n\n"
        "  -m, --model MODEL     GGUF path or cached short name (default smollm2-135m)\n"
        "  -p, --prompt TEXT     the prompt\n"
        "  -f, --file FILE       take the prompt from a text file, or a cached corpus\n"
        "                        short name (e.g. devil)\n"
        "      --prompt-tokens N with -f: the first N tokens of the file (default 512)\n"
        "  -n, --n N             steps to compare (default 256)\n"
        "  -c, --ctx N           positions per sequence (default: prompt + steps, rounded\n"
        "                        up to a multiple of 64)\n"
        "  -t, --threads N       worker threads (default: physical cores)\n"
        "  -o, --output FMT      text (default), csv or json, to stdout\n"
        QI_CLI_REPACK_HELP
        "  -h, --help            this help\n\n"
        "The policy under test:\n");
    qi_cli_kv_help();
    qi_cli_place_help();
}

/* Read at most cap bytes from the start of path into a qi_malloc'ed buffer;
 * *eof says whether that was the whole file. */
static qi_status read_prefix(const char *path, size_t cap, char **out, size_t *len, bool *eof, qi_err *err) {
    *out = NULL;
    *len = 0;
    *eof = false;
    FILE *f = fopen(path, "rb");
    if (!f) return QI_ERR(err, QI_ERR_IO, "%s: cannot open", path);
    char *buf = qi_malloc(cap + 1);
    if (!buf) {
        fclose(f);
        return QI_ERR(err, QI_ERR_NOMEM, "out of memory reading %s", path);
    }
    size_t n = fread(buf, 1, cap, f);
    bool bad = ferror(f) != 0;
    *eof = n < cap || fgetc(f) == EOF;
    fclose(f);
    if (bad) {
        qi_free(buf);
        return QI_ERR(err, QI_ERR_IO, "%s: read error", path);
    }
    *out = buf;
    *len = n;
    return QI_OK;
}

/* The first n_want tokens of a file (with BOS if the model adds one). The
 * file is read in growing prefixes so a large corpus is not tokenised whole;
 * a prefix must give a margin of tokens past n_want, so the cut in the bytes
 * cannot change the tokens kept. */
static qi_status file_prompt(const qi_model *m, const char *path, int n_want, int32_t **ids, size_t *n_ids,
                             qi_err *err) {
    *ids = NULL;
    *n_ids = 0;
    for (size_t cap = (size_t)n_want * 8 + 4096;; cap *= 2) {
        char *text;
        size_t len;
        bool eof;
        qi_status st = read_prefix(path, cap, &text, &len, &eof, err);
        if (st) return st;
        int32_t *t = NULL;
        size_t n = 0;
        st = qi_tokenize(m->tok, text, len, true, false, &t, &n, err);
        qi_free(text);
        if (st) return st;
        if (n >= (size_t)n_want + (eof ? 0 : 16)) {
            *ids = t;
            *n_ids = (size_t)n_want;
            return QI_OK;
        }
        qi_free(t);
        if (eof)
            return QI_ERR(err, QI_ERR_INVALID, "%s is only %zu tokens; --prompt-tokens %d needs more", path, n,
                          n_want);
    }
}

/* Run the engine until sequence id has consumed what it was fed. */
static qi_status drain(qi_engine *e, int id, qi_err *err) {
    while (qi_engine_seq_pending(e, id) > 0) {
        qi_status st = qi_engine_step(e, NULL, err);
        if (st) return st;
    }
    return QI_OK;
}

static int argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* log-softmax of x into out, in double, max subtracted first. */
static void log_softmax(const float *x, int n, double *out) {
    double mx = x[0];
    for (int i = 1; i < n; i++)
        if (x[i] > mx) mx = x[i];
    double sum = 0.0;
    for (int i = 0; i < n; i++) sum += exp((double)x[i] - mx);
    const double lse = mx + log(sum);
    for (int i = 0; i < n; i++) out[i] = (double)x[i] - lse;
}

/* KL(p || q) from log-probabilities. Rounding can leave a value a few ulps
 * below zero when the two are nearly equal; KL is never negative, so clamp. */
static double kl_div(const double *lp, const double *lq, int n) {
    double kl = 0.0;
    for (int i = 0; i < n; i++) kl += exp(lp[i]) * (lp[i] - lq[i]);
    return kl > 0.0 ? kl : 0.0;
}

typedef qi_out_format out_format;
#define OUT_TEXT QI_OUT_HUMAN
#define OUT_CSV QI_OUT_CSV
#define OUT_JSON QI_OUT_JSON

typedef struct {
    const char *model, *policy_desc;
    int n_prompt, n_steps, n_agree, n_ctx, n_threads;
    double mean_kl, max_kl;
    long work_tokens, off_tokens, full_tokens;
    long attn_tokens; /* read by the last step's attention; -1 unless the budget counts them (quest) */
    double seconds;
} agree_result;

static void print_result(out_format fmt, const agree_result *r) {
    const double rate = r->n_steps > 0 ? (double)r->n_agree / r->n_steps : 0.0;
    if (fmt == OUT_TEXT) {
        printf("agree: top-1 %.2f%% (%d/%d), mean KL %.4e nats, max KL %.4e, working KV tokens at end %ld "
               "(of %ld for full)",
               100.0 * rate, r->n_agree, r->n_steps, r->mean_kl, r->max_kl, r->work_tokens, r->full_tokens);
        if (r->off_tokens > 0) printf(", offloaded %ld", r->off_tokens);
        if (r->attn_tokens >= 0) printf(", attended at the last step %ld", r->attn_tokens);
        printf("\n");
        return;
    }
    if (fmt == OUT_CSV) {
        printf("model,policy,prompt_tokens,steps,top1_agree,top1_rate,mean_kl,max_kl,work_tokens,off_tokens,"
               "full_tokens,n_ctx,threads,seconds,attn_tokens\n");
        qi_cli_print_quoted(r->model, false);
        putchar(',');
        qi_cli_print_quoted(r->policy_desc, false);
        printf(",%d,%d,%d,%.6f,%.6e,%.6e,%ld,%ld,%ld,%d,%d,%.3f,%ld\n", r->n_prompt, r->n_steps, r->n_agree,
               rate, r->mean_kl, r->max_kl, r->work_tokens, r->off_tokens, r->full_tokens, r->n_ctx, r->n_threads,
               r->seconds, r->attn_tokens);
        return;
    }
    printf("{\n  \"model\": ");
    qi_cli_print_quoted(r->model, true);
    printf(",\n  \"policy\": ");
    qi_cli_print_quoted(r->policy_desc, true);
    printf(",\n  \"prompt_tokens\": %d,\n  \"steps\": %d,\n  \"top1_agree\": %d,\n  \"top1_rate\": %.6f,\n"
           "  \"mean_kl\": %.6e,\n  \"max_kl\": %.6e,\n  \"work_tokens\": %ld,\n  \"off_tokens\": %ld,\n"
           "  \"full_tokens\": %ld,\n  \"n_ctx\": %d,\n  \"threads\": %d,\n  \"seconds\": %.3f,\n"
           "  \"attn_tokens\": %ld\n}\n",
           r->n_prompt, r->n_steps, r->n_agree, rate, r->mean_kl, r->max_kl, r->work_tokens, r->off_tokens,
           r->full_tokens, r->n_ctx, r->n_threads, r->seconds, r->attn_tokens);
}

int qi_cmd_agree(int argc, char **argv) {
    const char *cmd = "agree", *model_arg = "smollm2-135m", *prompt = NULL, *file_arg = NULL, *out_arg = "text";
    int n_prompt_want = 512, n_steps = 256, n_ctx = 0, n_threads = qi_n_physical_cores();
    bool prompt_tokens_given = false, repack = false;
    qi_cli_kv kv;
    qi_cli_kv_init(&kv);
    qi_args a;
    qi_args_init(&a, cmd, argc, argv);
    while (qi_args_next(&a)) {
        if (qi_args_is(&a, "-h", "--help")) { help(); return 0; }
        else if (qi_cli_place_flag(&a, &kv))
            continue;
        else if (qi_cli_kv_flag(&a, &kv)) continue;
        else if (qi_args_is(&a, "-m", "--model")) model_arg = qi_args_str(&a);
        else if (qi_args_is(&a, "-p", "--prompt")) prompt = qi_args_str(&a);
        else if (qi_args_is(&a, "-f", "--file")) file_arg = qi_args_str(&a);
        else if (qi_args_is(&a, NULL, "--prompt-tokens")) prompt_tokens_given = qi_args_int(&a, 1, 1 << 20, &n_prompt_want);
        else if (qi_args_is(&a, "-n", "--n")) qi_args_int(&a, 1, 1 << 20, &n_steps);
        else if (qi_args_is(&a, "-c", "--ctx")) qi_args_int(&a, 1, 1 << 20, &n_ctx);
        else if (qi_args_is(&a, "-t", "--threads")) qi_args_int(&a, 1, 1024, &n_threads);
        else if (qi_args_is(&a, "-o", "--output")) out_arg = qi_args_str(&a);
        else if (qi_args_is(&a, NULL, "--repack")) repack = true;
        else qi_args_unknown(&a);
    }
    if (a.failed) return QI_EXIT_USAGE;
    out_format fmt;
    if (!qi_cli_output_format(cmd, out_arg, "text", &fmt)) return QI_EXIT_USAGE;
    if (!prompt && !file_arg) {
        qi_cli_error(cmd, "no prompt given: use -p TEXT or -f FILE (see qinfer agree --help)");
        return QI_EXIT_USAGE;
    }
    if (prompt && file_arg) {
        qi_cli_error(cmd, "-p and -f both given: choose one");
        return QI_EXIT_USAGE;
    }
    if (prompt_tokens_given && !file_arg) {
        qi_cli_error(cmd, "--prompt-tokens needs -f");
        return QI_EXIT_USAGE;
    }

    qi_err err = {0};
    char mpath[1024], fpath[1024];
    qi_model *m = NULL;
    qi_engine *ef = NULL, *ep = NULL;
    int32_t *ids = NULL;
    double *lp = NULL, *lq = NULL;
    size_t n_ids = 0;
    int rc = 0;
    if (qi_cache_resolve(model_arg, "model", mpath, sizeof mpath, &err) ||
        (file_arg && qi_cache_resolve(file_arg, "corpus", fpath, sizeof fpath, &err)) ||
        qi_cli_load_model(mpath, repack, &m, &err) || qi_cli_kv_check(&kv, m->hp.n_layer, &err))
        goto fail;
    if (file_arg) {
        if (file_prompt(m, fpath, n_prompt_want, &ids, &n_ids, &err)) goto fail;
    } else if (qi_tokenize(m->tok, prompt, strlen(prompt), true, false, &ids, &n_ids, &err)) {
        goto fail;
    }
    if (n_ids == 0) {
        QI_ERR(&err, QI_ERR_INVALID, "the prompt tokenises to nothing");
        goto fail;
    }
    /* the last compared distribution follows prompt + n_steps - 1 tokens */
    const long need = (long)n_ids + n_steps - 1;
    if (n_ctx == 0) {
        long c = (need + 63) / 64 * 64;
        n_ctx = (int)(c < (1 << 20) ? c : (1 << 20));
    }
    if (need > n_ctx) {
        QI_ERR(&err, QI_ERR_INVALID,
               "the prompt (%zu token%s) and %d steps need %ld positions, more than the context of %d (use --ctx)",
               n_ids, n_ids == 1 ? "" : "s", n_steps, need, n_ctx);
        goto fail;
    }
    if (need > m->hp.n_ctx_train) {
        QI_ERR(&err, QI_ERR_INVALID, "the prompt (%zu token%s) and %d steps need %ld positions, more than the "
               "model's training context %d", n_ids, n_ids == 1 ? "" : "s", n_steps, need, m->hp.n_ctx_train);
        goto fail;
    }

    qi_engine_opts of, op;
    qi_engine_opts_default(&of);
    of.n_threads = n_threads;
    of.max_seqs = 1;
    of.n_ctx = n_ctx;
    of.repack = repack;
    op = of;
    qi_cli_kv_apply(&kv, &op);
    if (qi_engine_create(m, &of, &ef, &err) || qi_engine_create(m, &op, &ep, &err)) goto fail;
    int sf, sp;
    if (qi_engine_seq_add(ef, &sf, &err) || qi_engine_seq_add(ep, &sp, &err)) goto fail;

    char desc[256];
    qi_cli_kv_describe(&kv, desc, sizeof desc);
    if (fmt == OUT_TEXT)
        printf("agree: model %s, policy %s, prompt %zu tokens, %d steps, ctx %d, %d threads\n", model_arg, desc,
               n_ids, n_steps, n_ctx, n_threads);
    fflush(stdout);

    const int V = m->hp.n_vocab;
    lp = qi_malloc(sizeof(double) * (size_t)V);
    lq = qi_malloc(sizeof(double) * (size_t)V);
    if (!lp || !lq) {
        QI_ERR(&err, QI_ERR_NOMEM, "out of memory for %d-entry distributions", V);
        goto fail;
    }
    const double t0 = qi_now_s();
    if (qi_engine_seq_feed(ef, sf, ids, (int)n_ids, false, &err) || qi_engine_seq_feed(ep, sp, ids, (int)n_ids, false, &err) ||
        drain(ef, sf, &err) || drain(ep, sp, &err))
        goto fail;
    const double t1 = qi_now_s();
    int n_agree = 0;
    double kl_sum = 0.0, kl_max = 0.0;
    const bool show_progress = n_steps >= 64;
    for (int i = 0; i < n_steps; i++) {
        const float *xf = qi_engine_seq_logits(ef, sf, -1), *xp = qi_engine_seq_logits(ep, sp, -1);
        QI_ASSERT(xf && xp);
        const int32_t tok = argmax(xf, V);
        n_agree += tok == argmax(xp, V);
        log_softmax(xf, V, lp);
        log_softmax(xp, V, lq);
        const double kl = kl_div(lp, lq, V);
        kl_sum += kl;
        if (kl > kl_max) kl_max = kl;
        if (show_progress && (i + 1) % 32 == 0) {
            const double el = qi_now_s() - t1;
            fprintf(stderr, "[%d/%d] top-1 %.2f%%, mean KL %.4e, %.3f s/step, ETA %.0f s\n", i + 1, n_steps,
                    100.0 * n_agree / (i + 1), kl_sum / (i + 1), el / (i + 1), el / (i + 1) * (n_steps - i - 1));
        }
        if (i + 1 == n_steps) break;
        if (qi_engine_seq_feed(ef, sf, &tok, 1, false, &err) || qi_engine_seq_feed(ep, sp, &tok, 1, false, &err) ||
            drain(ef, sf, &err) || drain(ep, sp, &err))
            goto fail;
    }
    const double t2 = qi_now_s();
    qi_engine_kv_seq ksf, ksp;
    qi_engine_kv_seq_stats(ef, sf, &ksf);
    qi_engine_kv_seq_stats(ep, sp, &ksp);
    agree_result r = {.model = model_arg, .policy_desc = desc, .n_prompt = (int)n_ids, .n_steps = n_steps,
                      .n_agree = n_agree, .n_ctx = n_ctx, .n_threads = n_threads, .mean_kl = kl_sum / n_steps,
                      .max_kl = kl_max, .work_tokens = ksp.work_tokens, .off_tokens = ksp.off_tokens,
                      .full_tokens = ksf.work_tokens,
                      .attn_tokens = qi_engine_kv_budget_attended(ep) ? ksp.attn_tokens : -1, .seconds = t2 - t0};
    print_result(fmt, &r);
    fprintf(stderr, "qinfer agree: prefill %.2f s, %d steps in %.2f s (both engines)\n", t1 - t0, n_steps, t2 - t1);
    goto done;
fail:
    rc = qi_cli_fail(cmd, &err);
done:
    qi_free(lp);
    qi_free(lq);
    qi_free(ids);
    qi_engine_free(ep);
    qi_engine_free(ef);
    qi_model_free(m);
    return rc;
}

/* cmd_generate.c - `qinfer generate`: prompt in, tokens streamed out.
 *
 * Output is streamed through the UTF-8-safe detokeniser, so a character split
 * across tokens appears once complete. Timing goes to stderr so stdout holds
 * only the generated text. It runs on the batched engine with one sequence,
 * so the KV policy flags apply; with the default full cache its logits are
 * those of the single-sequence path, bit for bit.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "cli.h"
#include "qinfer/measure.h"
#include "qinfer/model_files.h"
#include "qinfer/chat.h"
#include "qinfer/engine.h"
#include "qinfer/model.h"
#include "qinfer/sampler.h"
#include "threadpool.h"

static void help(void) {
    printf(
        "usage: qinfer generate [-m MODEL] -p PROMPT [options]\n\n"
        "Generate text from PROMPT with the model, streaming tokens to stdout.\n\n"
        "  -m, --model MODEL     GGUF path or cached short name (default smollm2-135m)\n"
        "  -p, --prompt TEXT     the prompt (required)\n"
        "  -n, --n-predict N     tokens to generate (default 128; stops early at end-of-generation)\n"
        "  -c, --ctx N           context size in tokens (default 2048, at most the model's)\n"
        "  -t, --threads N       worker threads (default: physical cores)\n"
        "      --chat            wrap the prompt in the model's chat template\n"
        "      --system TEXT     system message (with --chat; default: the template's own, if any)\n"
        "      --seed S          RNG seed (default 42); same seed, same text\n"
        "      --temp T          temperature (default 0.8; 0 = greedy)\n"
        "      --top-k N         (default 40; 0 = off)\n"
        "      --top-p P         (default 0.95; 1 = off)\n"
        "      --min-p P         (default 0.05; 0 = off)\n"
        "      --repeat-penalty R  (default 1.0 = off)\n"
        "      --repeat-last-n N   tokens the penalty looks back over (default 64)\n"
        "      --ignore-eos      keep generating past end-of-generation tokens\n"
        "      --ids             print token ids instead of text\n"
        "      --kv-stats        print the KV cache's working and offloaded tokens at the end\n"
        QI_CLI_REPACK_HELP
        "      --profile         time every op; print where the time went at the end\n"
        QI_CLI_CUPTI_HELP
        "      --attn-blas       the prompt's attention through OpenBLAS sgemm: faster, but\n"
        "                        not bit-exact with llama.cpp (needs libopenblas0)\n");
    qi_cli_kv_help();
    qi_cli_place_help();
    qi_cli_neuron_help();
    qi_cli_sim_help();
    printf("  -h, --help            this help\n");
}

int qi_cmd_generate(int argc, char **argv) {
    const char *cmd = "generate", *model_arg = "smollm2-135m", *prompt = NULL, *system = NULL;
    int n_predict = 128, n_ctx = 2048, n_threads = qi_n_physical_cores();
    bool chat = false, ignore_eos = false, print_ids = false, kv_stats = false, profile = false, repack = false, attn_blas = false;
    bool cupti = false;
    qi_cli_kv kvo;
    qi_cli_kv_init(&kvo);
    qi_cli_sim_allow(&kvo);
    qi_cli_neuron_allow(&kvo);
    qi_sampler_params sp = qi_sampler_defaults();
    qi_args a;
    qi_args_init(&a, cmd, argc, argv);
    while (qi_args_next(&a)) {
        if (qi_args_is(&a, "-h", "--help")) { help(); return 0; }
        else if (qi_args_is(&a, "-m", "--model")) model_arg = qi_args_str(&a);
        else if (qi_args_is(&a, "-p", "--prompt")) prompt = qi_args_str(&a);
        else if (qi_args_is(&a, "-n", "--n-predict")) qi_args_int(&a, 0, 1 << 20, &n_predict);
        else if (qi_args_is(&a, "-c", "--ctx")) qi_args_int(&a, 1, 1 << 20, &n_ctx);
        else if (qi_args_is(&a, "-t", "--threads")) qi_args_int(&a, 1, 1024, &n_threads);
        else if (qi_args_is(&a, NULL, "--chat")) chat = true;
        else if (qi_args_is(&a, NULL, "--system")) system = qi_args_str(&a);
        else if (qi_args_is(&a, NULL, "--seed")) qi_args_u64(&a, &sp.seed);
        else if (qi_args_is(&a, NULL, "--temp")) qi_args_float(&a, 0, 100, &sp.temp);
        else if (qi_args_is(&a, NULL, "--top-k")) qi_args_int(&a, 0, 1 << 30, &sp.top_k);
        else if (qi_args_is(&a, NULL, "--top-p")) qi_args_float(&a, 1e-6, 1, &sp.top_p);
        else if (qi_args_is(&a, NULL, "--min-p")) qi_args_float(&a, 0, 1, &sp.min_p);
        else if (qi_args_is(&a, NULL, "--repeat-penalty")) qi_args_float(&a, 1e-3, 100, &sp.repeat_penalty);
        else if (qi_args_is(&a, NULL, "--repeat-last-n")) qi_args_int(&a, 0, 1 << 20, &sp.repeat_last_n);
        else if (qi_args_is(&a, NULL, "--ignore-eos")) ignore_eos = true;
        else if (qi_args_is(&a, NULL, "--ids")) print_ids = true;
        else if (qi_args_is(&a, NULL, "--kv-stats")) kv_stats = true;
        else if (qi_args_is(&a, NULL, "--profile")) profile = true;
        else if (qi_args_is(&a, NULL, "--cupti")) cupti = true;
        else if (qi_args_is(&a, NULL, "--repack")) repack = true;
        else if (qi_args_is(&a, NULL, "--attn-blas")) attn_blas = true;
        else if (qi_cli_place_flag(&a, &kvo))
            continue;
        else if (qi_cli_kv_flag(&a, &kvo)) continue;
        else qi_args_unknown(&a);
    }
    if (a.failed) return QI_EXIT_USAGE;
    if (!prompt) {
        qi_cli_error(cmd, "no prompt given: use -p TEXT (see qinfer generate --help)");
        return QI_EXIT_USAGE;
    }
    if (system && !chat) {
        qi_cli_error(cmd, "--system needs --chat");
        return QI_EXIT_USAGE;
    }
    if (cupti && !qi_cli_cupti_check(cmd, &kvo)) return QI_EXIT_USAGE;

    qi_err err = {0};
    char path[1024];
    qi_model *m = NULL;
    qi_engine *eng = NULL;
    int sid = -1;
    qi_sampler *smp = NULL;
    char *text = NULL;
    int32_t *ids = NULL;
    double *tok_t = NULL; /* [n_predict] when each token was sampled */
    size_t n_ids = 0;
    int rc = 0;
    bool recording = false; /* --cupti, between start and stop */
    qi_cupti_totals cupti_tot = {0};
    if (qi_cache_resolve(model_arg, "model", path, sizeof path, &err) || qi_cli_load_model(path, repack, &m, &err) ||
        qi_cli_kv_check(&kvo, m->hp.n_layer, &err) || qi_cli_neuron_prepare(cmd, &kvo, m, 1, &err))
        goto fail;
    if (n_ctx > m->hp.n_ctx_train) n_ctx = m->hp.n_ctx_train;
    if (chat) {
        qi_chat_template ct;
        if (qi_chat_detect(m->chat_template, m->hp.arch_name, &ct, &err) || qi_chat_format(&ct, system, prompt, &text, &err))
            goto fail;
    }
    const char *in = text ? text : prompt;
    if (qi_tokenize(m->tok, in, strlen(in), true, chat, &ids, &n_ids, &err)) goto fail;
    if (n_ids == 0) {
        QI_ERR(&err, QI_ERR_INVALID, "the prompt tokenises to nothing");
        goto fail;
    }
    if ((long)n_ids >= n_ctx) {
        QI_ERR(&err, QI_ERR_INVALID, "the prompt is %zu tokens, which does not fit the context of %d (use -c)",
               n_ids, n_ctx);
        goto fail;
    }
    qi_engine_opts eo;
    qi_engine_opts_default(&eo);
    eo.n_threads = n_threads;
    eo.n_ctx = n_ctx;
    eo.max_seqs = 1;
    eo.profile = profile || cupti; /* --cupti compares with the events' timing */
    eo.attn_blas = attn_blas;
    eo.repack = repack;
    qi_cli_place_policy_allow(&kvo);
    qi_cli_kv_apply(&kvo, &eo);
    if (qi_engine_create(m, &eo, &eng, &err) ||
        qi_cli_place_policy(&kvo, eng, m, 1, (int)n_ids, n_predict, &err) || qi_engine_seq_add(eng, &sid, &err) ||
        qi_sampler_create(&sp, m->hp.n_vocab, &smp, &err))
        goto fail;
    for (size_t i = 0; i < n_ids; i++) qi_sampler_accept(smp, ids[i]);
    /* CUPTI records from the first step on, as the engine's profile does */
    if (cupti) {
        if (qi_cupti_start(&err)) goto fail;
        recording = true;
    }

    /* when each token was sampled: the request's timeline (measure.h) */
    if (!(tok_t = qi_malloc(sizeof *tok_t * (size_t)(n_predict > 0 ? n_predict : 1)))) {
        QI_ERR(&err, QI_ERR_NOMEM, "out of memory");
        goto fail;
    }
    double t0 = qi_engine_now(eng);
    if (qi_engine_seq_feed(eng, sid, ids, (int)n_ids, false, &err)) goto fail;
    while (qi_engine_seq_pending(eng, sid) > 0)
        if (qi_engine_step(eng, NULL, &err)) goto fail;
    double t1 = qi_engine_now(eng);
    qi_detok dt;
    qi_detok_init(&dt);
    char buf[256];
    int n_gen = 0;
    for (; n_gen < n_predict && qi_engine_seq_n_past(eng, sid) < n_ctx; n_gen++) {
        int32_t tok = qi_sampler_sample(smp, qi_engine_seq_logits(eng, sid, -1));
        qi_sampler_accept(smp, tok);
        if (!ignore_eos && qi_tokenizer_is_eog(m->tok, tok)) break;
        tok_t[n_gen] = qi_engine_now(eng);
        if (print_ids) {
            printf("%s%d", n_gen ? " " : "", tok);
        } else {
            size_t nb = qi_detok_push(m->tok, &dt, tok, false, buf, sizeof buf);
            fwrite(buf, 1, nb < sizeof buf ? nb : sizeof buf, stdout);
        }
        fflush(stdout);
        if (n_gen + 1 < n_predict && qi_engine_seq_n_past(eng, sid) < n_ctx &&
            (qi_engine_seq_feed(eng, sid, &tok, 1, false, &err) || qi_engine_step(eng, NULL, &err)))
            goto fail;
    }
    if (!print_ids) {
        size_t nb = qi_detok_flush(&dt, buf, sizeof buf);
        fwrite(buf, 1, nb < sizeof buf ? nb : sizeof buf, stdout);
    }
    printf("\n");
    fflush(stdout);
    double t2 = qi_engine_now(eng);
    if (recording) {
        recording = false;
        if (qi_cupti_stop(&cupti_tot, &err)) goto fail;
    }
    fprintf(stderr, "qinfer generate: prompt %zu tokens in %.2f s (%.1f t/s), generated %d tokens in %.2f s (%.1f t/s), %d threads%s\n",
            n_ids, t1 - t0, n_ids / (t1 - t0), n_gen, t2 - t1, n_gen > 0 ? n_gen / (t2 - t1) : 0.0, n_threads,
            attn_blas ? ", prompt attention through OpenBLAS" : "");
    if (qi_engine_sim_profile(eng)) {
        char v[512];
        const bool val = qi_sim_cal_validated(eo.sim_cal, v, sizeof v);
        fprintf(stderr, "qinfer generate: SIMULATED on %s: no arithmetic ran (the text is noise) and every time "
                        "here is the simulator's (%s; %s%s)\n", qi_engine_sim_profile(eng),
                eo.sim_cal ? eo.sim_cal : "the default efficiencies", val ? "validated: " : "its error not validated",
                val ? v : "");
    }
    /* TTFT and TPOT as every figure defines them (measure.h, results/README.md) */
    const qi_request_timeline tl = {.arrival = t0, .start = t0, .token_t = tok_t, .n_prompt = (int)n_ids,
                                    .n_out = n_gen};
    qi_request_metrics rm;
    if (n_gen > 0 && qi_measure_request(&tl, &rm, &err) == QI_OK) {
        fprintf(stderr, "qinfer generate: TTFT %.3f s", rm.ttft_s);
        if (n_gen > 1) fprintf(stderr, ", TPOT %.4f s (%.1f t/s), ", rm.tpot_s, 1.0 / rm.tpot_s);
        else fprintf(stderr, ", ");
        fprintf(stderr, "end to end %.3f s\n", rm.e2e_s);
    }
    if (profile) {
        qi_engine_prof pr;
        qi_engine_profile(eng, &pr);
        qi_cli_print_profile(cmd, NULL, &pr);
        qi_cli_print_plan(cmd, eng);
    }
    if (cupti) {
        qi_engine_prof pr;
        qi_engine_profile(eng, &pr);
        qi_cli_print_cupti(cmd, NULL, eng, &pr, &cupti_tot);
    }
    if (kv_stats) {
        qi_engine_kv_seq ks;
        qi_engine_kv_seq_stats(eng, sid, &ks);
        char desc[512];
        qi_cli_kv_describe(&kvo, desc, sizeof desc);
        const double streams = (double)m->hp.n_layer * m->hp.n_head_kv;
        char attended[64] = "";
        if (qi_engine_kv_budget_attended(eng)) /* the budget counts what the last step's attention read */
            snprintf(attended, sizeof attended, "%.1f attended (last step), ", ks.attn_tokens / streams);
        fprintf(stderr, "qinfer generate: kv %s: %d positions; per layer and KV head %s%.1f working, %.1f "
                        "offloaded tokens; %.1f KiB working, %.1f KiB offloaded\n", desc,
                qi_engine_seq_n_past(eng, sid), attended, ks.work_tokens / streams, ks.off_tokens / streams,
                ks.work_bytes / 1024.0, ks.off_bytes / 1024.0);
    }
    goto done;
fail:
    rc = qi_cli_fail(cmd, &err);
    if (recording) { /* the recording ends with the run; the run's failure is the one reported */
        qi_err ignored = {0};
        qi_cupti_stop(&cupti_tot, &ignored);
    }
done:
    qi_free(ids);
    qi_free(tok_t);
    qi_free(text);
    qi_sampler_free(smp);
    qi_engine_free(eng);
    qi_model_free(m);
    qi_cli_kv_fini(&kvo);
    return rc;
}

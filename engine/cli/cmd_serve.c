/* cmd_serve.c - `qinfer serve`: an OpenAI-compatible HTTP endpoint over the
 * batched engine.
 *
 * HTTP is libmicrohttpd's (a thread per connection, so a handler may block
 * while its request runs), JSON is cJSON's; nothing here parses either by
 * hand. Each completion request becomes a qi_sreq handed to the engine
 * thread (serve_loop.c), which batches every admitted request into one
 * engine step. A non-streaming handler waits for its request to finish; a
 * streaming one returns a response whose reader blocks until more text is
 * ready and sends it as server-sent events, with a comment line every second
 * of silence, so a client that went away is noticed (the write fails), the
 * response is destroyed and its request cancelled, freeing its KV blocks.
 *
 * The HTTP daemon and its handlers are serve_http.c's, the API's JSON
 * (requests checked, answers written) serve_api.c's. Built
 * only when libmicrohttpd and cJSON are found (QI_HAVE_SERVE); without them
 * the command says so.
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"

#ifndef QI_HAVE_SERVE
int qi_cmd_serve(int argc, char **argv) {
    (void)argc;
    (void)argv;
    qi_cli_error("serve", "not built: libmicrohttpd and cJSON were not found at configure time "
                          "(apt-get install libmicrohttpd-dev libcjson-dev, then configure again)");
    return QI_EXIT_RUNTIME;
}
#else

#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <signal.h>
#include <stdlib.h>
#include <time.h>

#include "qinfer/chat.h"
#include "qinfer/model_files.h"
#include "serve_api.h"
#include "threadpool.h"

static void help(void) {
    printf(
        "usage: qinfer serve [-m MODEL] [--host ADDR] [--port N] [options]\n\n"
        "Serve the model over HTTP with an OpenAI-compatible API: POST /v1/completions and\n"
        "/v1/chat/completions (\"stream\": true for server-sent events), GET /v1/models,\n"
        "/health and /metrics (Prometheus text). Concurrent requests share the engine's\n"
        "steps (continuous batching). Stop with Ctrl-C; log lines go to stderr.\n\n"
        "  -m, --model MODEL     GGUF path or cached short name (default smollm2-135m); the\n"
        "                        API's model id is the name as given\n"
        "      --host ADDR       IPv4 address to bind (default 127.0.0.1: this machine only)\n"
        "      --port N          TCP port (default 8080; 0: any free one, printed at start)\n"
        "      --max-batch N     requests run at once (default 8)\n"
        "      --max-queue N     requests waiting at most; more get 429 (default 64)\n"
        "      --kv-memory MIB   KV memory the running requests may hold: a request is admitted\n"
        "                        only when its prompt fits, and when their next tokens would not,\n"
        "                        the one admitted last is preempted (default 0: no budget)\n"
        "      --preempt KIND    how: recompute (default; its sequence freed, its prompt and\n"
        "                        output run again when readmitted) or swap (its KV moved to the\n"
        "                        offload tier, host memory, and back, nothing run again; up to\n"
        "                        --max-batch requests swapped out at once, past that recompute)\n"
        "      --max-step-tokens N  tokens one engine step runs (decodes plus prompt tokens); a\n"
        "                        prompt that would pass it waits (default 0: no limit)\n"
        "      --max-preemptions N  a request preempted more often fails (default 8)\n"
        "  -c, --ctx N           context per request in tokens (default 2048, at most the model's)\n"
        "  -t, --threads N       worker threads (default: physical cores)\n"
        QI_CLI_REPACK_HELP
        "      --attn-blas       the prompts' attention through OpenBLAS sgemm (not bit-exact)\n");
    qi_cli_kv_help();
    qi_cli_place_help();
    printf("  -h, --help            this help\n\n"
           "Requests: model, prompt (completions; a string or a list of one string) or\n"
           "messages (chat: an optional system message, then user and assistant messages in\n"
           "turn, the last one the user's), max_tokens\n"
           "(default 16; 0 with echo: the prompt's logprobs alone), temperature (default 1;\n"
           "0: greedy), top_p, seed, stop (a string or up to 4), stream; completions also\n"
           "echo and logprobs (0-5 alternatives per token). qinfer_timeline: true adds to\n"
           "the answer (the last event when streamed) the request's arrival, start and\n"
           "token times in seconds on the server's clock, what /metrics is computed from.\n");
}


/* The API's model id: the -m argument, or a path's file name without .gguf. */
static void model_id_of(const char *arg, char *out, size_t cap) {
    const char *b = strrchr(arg, '/');
    snprintf(out, cap, "%s", b ? b + 1 : arg);
    size_t n = strlen(out);
    if (n > 5 && !strcmp(out + n - 5, ".gguf")) out[n - 5] = '\0';
}

int qi_cmd_serve(int argc, char **argv) {
    const char *cmd = "serve", *model_arg = "smollm2-135m", *host = "127.0.0.1";
    int port = 8080, max_batch = 8, max_queue = 64, n_ctx = 2048, n_threads = qi_n_physical_cores();
    int kv_mib = 0, max_step_tokens = 0, max_preemptions = 8, preempt = QI_SCHED_RECOMPUTE;
    bool repack = false, attn_blas = false;
    qi_cli_kv kvo;
    qi_cli_kv_init(&kvo);
    qi_args a;
    qi_args_init(&a, cmd, argc, argv);
    while (qi_args_next(&a)) {
        if (qi_args_is(&a, "-h", "--help")) { help(); return 0; }
        else if (qi_args_is(&a, "-m", "--model")) model_arg = qi_args_str(&a);
        else if (qi_args_is(&a, NULL, "--host")) host = qi_args_str(&a);
        else if (qi_args_is(&a, NULL, "--port")) qi_args_int(&a, 0, 65535, &port);
        else if (qi_args_is(&a, NULL, "--max-batch")) qi_args_int(&a, 1, 256, &max_batch);
        else if (qi_args_is(&a, NULL, "--max-queue")) qi_args_int(&a, 1, 1 << 20, &max_queue);
        else if (qi_args_is(&a, NULL, "--kv-memory")) qi_args_int(&a, 0, 1 << 24, &kv_mib);
        else if (qi_args_is(&a, NULL, "--max-step-tokens")) qi_args_int(&a, 0, 1 << 24, &max_step_tokens);
        else if (qi_args_is(&a, NULL, "--max-preemptions")) qi_args_int(&a, 1, 1 << 20, &max_preemptions);
        else if (qi_args_is(&a, NULL, "--preempt")) {
            const char *v = qi_args_str(&a);
            if (v && (preempt = qi_sched_preempt_parse(v)) < 0) {
                qi_cli_error(cmd, "option --preempt: '%s' is not recompute or swap", v);
                a.failed = true;
            }
        }
        else if (qi_args_is(&a, "-c", "--ctx")) qi_args_int(&a, 1, 1 << 20, &n_ctx);
        else if (qi_args_is(&a, "-t", "--threads")) qi_args_int(&a, 1, 1024, &n_threads);
        else if (qi_args_is(&a, NULL, "--repack")) repack = true;
        else if (qi_args_is(&a, NULL, "--attn-blas")) attn_blas = true;
        else if (qi_cli_place_flag(&a, &kvo)) continue;
        else if (qi_cli_kv_flag(&a, &kvo)) continue;
        else qi_args_unknown(&a);
    }
    if (a.failed) return QI_EXIT_USAGE;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) {
        qi_cli_error(cmd, "option --host: '%s' is not an IPv4 address", host);
        return QI_EXIT_USAGE;
    }

    static qi_serve_app ap; /* the HTTP threads' view; lives until they are stopped */
    memset(&ap, 0, sizeof ap);
    char model_id[256];
    model_id_of(model_arg, model_id, sizeof model_id);
    ap.model_id = model_id;
    qi_err err = {0};
    char path[1024];
    qi_model *m = NULL;
    qi_engine *eng = NULL;
    struct MHD_Daemon *d = NULL;
    bool srv_up = false;
    int rc = 0;
    if (qi_cache_resolve(model_arg, "model", path, sizeof path, &err) || qi_cli_load_model(path, repack, &m, &err) ||
        qi_cli_kv_check(&kvo, m->hp.n_layer, &err))
        goto fail;
    if (n_ctx > m->hp.n_ctx_train) n_ctx = m->hp.n_ctx_train;
    qi_err cerr = {0};
    ap.have_chat = qi_chat_detect(m->chat_template, m->hp.arch_name, &ap.chat, &cerr) == QI_OK;
    if (!ap.have_chat) snprintf(ap.chat_error, sizeof ap.chat_error, "%s", cerr.msg);
    qi_engine_opts eo;
    qi_engine_opts_default(&eo);
    eo.n_threads = n_threads;
    eo.n_ctx = n_ctx;
    /* a swapped-out request keeps its sequence: as many again for them */
    eo.max_seqs = preempt == QI_SCHED_SWAP ? 2 * max_batch : max_batch;
    eo.attn_blas = attn_blas;
    eo.repack = repack;
    qi_cli_kv_apply(&kvo, &eo);
    const qi_sched_opts so = {.max_batch = max_batch, .n_ctx = n_ctx, .max_step_tokens = max_step_tokens,
                              .kv_budget_bytes = (size_t)kv_mib << 20, .max_preemptions = max_preemptions,
                              .preempt = (qi_sched_preempt)preempt};
    if (qi_engine_create(m, &eo, &eng, &err) || qi_server_init(&ap.srv, m, eng, &so, max_queue, &err))
        goto fail;
    srv_up = true;
    /* the signals are taken by sigwait below, in this thread only */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);
    if (qi_server_start(&ap.srv, &err)) goto fail;
    d = qi_serve_http_start(&ap, (struct sockaddr *)&sa);
    if (!d) {
        QI_ERR(&err, QI_ERR_IO, "cannot listen on %s:%d: %s", host, port, strerror(errno));
        goto fail;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    char desc[512];
    qi_cli_kv_describe(&kvo, desc, sizeof desc);
    char budget[48] = "no KV budget";
    if (kv_mib) snprintf(budget, sizeof budget, "KV budget %d MiB, preempt by %s", kv_mib,
                         qi_sched_preempt_name((qi_sched_preempt)preempt));
    fprintf(stderr, "qinfer serve: %s on http://%s:%u (batch %d, queue %d, context %d, kv %s, %s, %d threads)\n",
            model_id, host, di ? di->port : (unsigned)port, max_batch, max_queue, n_ctx, desc, budget, n_threads);
    int sig = 0;
    sigwait(&sigs, &sig);
    fprintf(stderr, "qinfer serve: signal %d, stopping\n", sig);
    goto done;
fail:
    rc = qi_cli_fail(cmd, &err);
done:
    if (srv_up) qi_server_stop(&ap.srv); /* every open request ends, so the HTTP threads can */
    if (d) MHD_stop_daemon(d);
    if (srv_up) qi_server_fini(&ap.srv);
    qi_engine_free(eng);
    qi_model_free(m);
    return rc;
}

#endif

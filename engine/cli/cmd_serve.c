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
 * The API's JSON (requests checked, answers written) is serve_api.c's. Built
 * only when libmicrohttpd and cJSON are found (QI_HAVE_SERVE); without them
 * the command says so.
 */
#define _GNU_SOURCE /* POLLRDHUP */
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
#include <cJSON.h>
#include <errno.h>
#include <math.h>
#include <microhttpd.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <time.h>

#include "qinfer/chat.h"
#include "qinfer/model_files.h"
#include "serve_api.h"
#include "threadpool.h"

#define BODY_LIMIT (1u << 20) /* request bodies past 1 MiB get 413 */


/* One connection's request: its body as it arrives. */
typedef struct {
    char *body;
    size_t n;
    bool too_big, answered;
} conn;

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

/* ---- replies ------------------------------------------------------------------------ */

static enum MHD_Result reply(struct MHD_Connection *c, unsigned status, const char *type, char *body) {
    struct MHD_Response *rs = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (!rs) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(rs, "Content-Type", type);
    enum MHD_Result ret = MHD_queue_response(c, status, rs);
    MHD_destroy_response(rs);
    return ret;
}

static enum MHD_Result reply_json(struct MHD_Connection *c, unsigned status, cJSON *j) {
    char *s = j ? cJSON_PrintUnformatted(j) : NULL;
    cJSON_Delete(j);
    if (!s) return MHD_NO;
    return reply(c, status, "application/json", s);
}

static enum MHD_Result reply_error(struct MHD_Connection *c, unsigned status, const char *type, const char *fmt,
                                   ...) __attribute__((format(printf, 4, 5)));
static enum MHD_Result reply_error(struct MHD_Connection *c, unsigned status, const char *type, const char *fmt,
                                   ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    cJSON *j = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(j, "error");
    cJSON_AddStringToObject(e, "message", msg);
    cJSON_AddStringToObject(e, "type", type);
    cJSON_AddNullToObject(e, "param");
    cJSON_AddNullToObject(e, "code");
    return reply_json(c, status, j);
}


/* ---- streaming --------------------------------------------------------------------------- */

typedef struct {
    qi_serve_app *ap;
    qi_serve_job j;
    long created;
    size_t sent;      /* bytes of the request's text sent */
    bool role_sent, done;
    char *buf;        /* events ready to go: buf[at..n) */
    size_t n, at, cap;
} stream;

static bool st_push(stream *st, const char *s, size_t n) {
    if (st->n + n > st->cap) {
        size_t cap = st->cap ? st->cap : 1024;
        while (cap < st->n + n) cap *= 2;
        char *b = qi_realloc(st->buf, cap);
        if (!b) return false;
        st->buf = b;
        st->cap = cap;
    }
    memcpy(st->buf + st->n, s, n);
    st->n += n;
    return true;
}

/* One event: data: {chunk}\n\n with text (NULL: none) and the finish reason (NULL: not yet). */
static bool st_event(stream *st, const char *text, size_t n_text, const char *finish, bool role) {
    const qi_sreq *r = st->j.r;
    char id[48];
    snprintf(id, sizeof id, "%s-%ld", st->j.chat ? "chatcmpl" : "cmpl", r->id);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", id);
    cJSON_AddStringToObject(o, "object", st->j.chat ? "chat.completion.chunk" : "text_completion");
    cJSON_AddNumberToObject(o, "created", (double)st->created);
    cJSON_AddStringToObject(o, "model", st->ap->model_id);
    cJSON *cs = cJSON_AddArrayToObject(o, "choices"), *c = cJSON_CreateObject();
    cJSON_AddItemToArray(cs, c);
    cJSON_AddNumberToObject(c, "index", 0);
    if (st->j.chat) {
        cJSON *d = cJSON_AddObjectToObject(c, "delta");
        if (role) cJSON_AddStringToObject(d, "role", "assistant");
        if (text) cJSON_AddItemToObject(d, "content", qi_serve_json_text(text, n_text));
    } else {
        cJSON_AddItemToObject(c, "text", qi_serve_json_text(text ? text : "", text ? n_text : 0));
        cJSON_AddNullToObject(c, "logprobs");
    }
    if (finish) cJSON_AddStringToObject(c, "finish_reason", finish);
    else cJSON_AddNullToObject(c, "finish_reason");
    if (finish) qi_serve_add_usage(o, &st->j);
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    bool ok = s && st_push(st, "data: ", 6) && st_push(st, s, strlen(s)) && st_push(st, "\n\n", 2);
    free(s);
    return ok;
}

static ssize_t stream_read(void *cls, uint64_t pos, char *out, size_t max) {
    stream *st = cls;
    (void)pos;
    if (st->at == st->n) {
        st->at = st->n = 0;
        if (st->done) return MHD_CONTENT_READER_END_OF_STREAM;
        qi_server *s = &st->ap->srv;
        qi_sreq *r = st->j.r;
        bool ok = true;
        pthread_mutex_lock(&s->mu);
        if (!st->role_sent && (st->j.chat || st->j.echo)) {
            /* chat: the role first; echo: the prompt first */
            ok = st->j.chat ? st_event(st, NULL, 0, NULL, true)
                            : st_event(st, st->j.prompt_text, strlen(st->j.prompt_text), NULL, false);
            st->role_sent = true;
        } else {
            size_t end = r->n_safe;
            /* never cut a character in two */
            while (end > st->sent && end < r->n_text && ((unsigned char)r->text[end] & 0xC0) == 0x80) end--;
            if (end == st->sent && r->state != QI_SREQ_DONE) {
                struct timespec ts;
                clock_gettime(CLOCK_REALTIME, &ts);
                ts.tv_sec += 1;
                pthread_cond_timedwait(&s->progress, &s->mu, &ts);
                end = r->n_safe;
                while (end > st->sent && end < r->n_text && ((unsigned char)r->text[end] & 0xC0) == 0x80) end--;
            }
            if (end > st->sent) {
                ok = st_event(st, r->text + st->sent, end - st->sent, NULL, false);
                st->sent = end;
            } else if (r->state == QI_SREQ_DONE) {
                if (r->finish == QI_FINISH_ERROR || r->finish == QI_FINISH_CANCEL) {
                    cJSON *o = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(o, "error");
                    cJSON_AddStringToObject(e, "message", r->finish == QI_FINISH_ERROR ? r->error : "cancelled: the server is stopping");
                    cJSON_AddStringToObject(e, "type", "server_error");
                    char *js = cJSON_PrintUnformatted(o);
                    cJSON_Delete(o);
                    ok = js && st_push(st, "data: ", 6) && st_push(st, js, strlen(js)) && st_push(st, "\n\n", 2);
                    free(js);
                } else {
                    ok = st_event(st, st->j.chat ? NULL : "", 0, qi_serve_finish_name(r->finish), false);
                }
                ok = ok && st_push(st, "data: [DONE]\n\n", 14);
                st->done = true;
            } else {
                ok = st_push(st, ": waiting\n\n", 11); /* finds a client that went away */
            }
        }
        pthread_mutex_unlock(&s->mu);
        if (!ok) return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    size_t k = st->n - st->at < max ? st->n - st->at : max;
    memcpy(out, st->buf + st->at, k);
    st->at += k;
    return (ssize_t)k;
}

static void stream_free(void *cls) {
    stream *st = cls;
    qi_server_release(&st->ap->srv, st->j.r); /* cancels it when unfinished: the client went away */
    qi_free(st->j.prompt_text);
    qi_free(st->buf);
    qi_free(st);
}

/* ---- routing --------------------------------------------------------------------------- */

static enum MHD_Result complete(qi_serve_app *ap, struct MHD_Connection *c, conn *cn, bool chat) {
    char msg[512];
    const char *etype;
    qi_serve_job j;
    unsigned st = qi_serve_parse_job(ap, cn->body ? cn->body : "", cn->n, chat, &j, msg, sizeof msg, &etype);
    if (st) return reply_error(c, st, st == 500 ? "server_error" : etype, "%s", msg);
    int q = qi_server_submit(&ap->srv, j.r);
    if (q) {
        qi_server_release(&ap->srv, j.r);
        qi_free(j.prompt_text);
        return q == 1 ? reply_error(c, 429, "rate_limit_exceeded", "the queue is full (%d requests waiting); retry later",
                                    ap->srv.max_queue)
                      : reply_error(c, 503, "server_error", "the server is stopping");
    }
    const long created = (long)time(NULL);
    if (j.stream) {
        stream *sm = qi_calloc(1, sizeof *sm);
        struct MHD_Response *rs =
            sm ? MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_read, sm, stream_free) : NULL;
        if (!rs) {
            qi_server_release(&ap->srv, j.r);
            qi_free(j.prompt_text);
            qi_free(sm);
            return reply_error(c, 500, "server_error", "out of memory");
        }
        *sm = (stream){.ap = ap, .j = j, .created = created};
        MHD_add_response_header(rs, "Content-Type", "text/event-stream");
        MHD_add_response_header(rs, "Cache-Control", "no-cache");
        enum MHD_Result ret = MHD_queue_response(c, 200, rs);
        MHD_destroy_response(rs);
        return ret;
    }
    /* wait, looking every second for a client that hung up: its request is cancelled */
    qi_server *s = &ap->srv;
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    pthread_mutex_lock(&s->mu);
    double looked = qi_measure_now();
    while (j.r->state != QI_SREQ_DONE) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += 1;
        pthread_cond_timedwait(&s->progress, &s->mu, &ts); /* woken after every step, too */
        if (ci && !j.r->cancel && qi_measure_now() - looked >= 1.0) {
            looked = qi_measure_now();
            struct pollfd pf = {.fd = ci->connect_fd, .events = POLLRDHUP};
            if (poll(&pf, 1, 0) == 1 && (pf.revents & (POLLRDHUP | POLLHUP | POLLERR))) {
                j.r->cancel = true;
                pthread_cond_signal(&s->work);
            }
        }
    }
    pthread_mutex_unlock(&s->mu);
    enum MHD_Result ret;
    if (j.r->finish == QI_FINISH_ERROR) ret = reply_error(c, 500, "server_error", "%s", j.r->error);
    else if (j.r->finish == QI_FINISH_CANCEL)
        ret = reply_error(c, 503, "server_error", "the request was cancelled (the client went away, or the server is stopping)");
    else ret = reply_json(c, 200, qi_serve_answer(ap, &j, created));
    qi_server_release(s, j.r);
    qi_free(j.prompt_text);
    return ret;
}

static enum MHD_Result route(qi_serve_app *ap, struct MHD_Connection *c, const char *url, const char *method, conn *cn) {
    const bool get = !strcmp(method, "GET"), post = !strcmp(method, "POST");
    if (!strcmp(url, "/health")) {
        if (get) return reply(c, 200, "application/json", strdup("{\"status\":\"ok\"}"));
    } else if (!strcmp(url, "/v1/models")) {
        if (get) {
            cJSON *o = cJSON_CreateObject(), *d = cJSON_AddArrayToObject(o, "data"), *m = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "object", "list");
            cJSON_AddItemToArray(d, m);
            cJSON_AddStringToObject(m, "id", ap->model_id);
            cJSON_AddStringToObject(m, "object", "model");
            cJSON_AddNumberToObject(m, "created", 0);
            cJSON_AddStringToObject(m, "owned_by", "qinfer");
            return reply_json(c, 200, o);
        }
    } else if (!strcmp(url, "/metrics")) {
        if (get) {
            char *t = qi_server_metrics(&ap->srv);
            char *s = t ? strdup(t) : NULL;
            qi_free(t);
            if (!s) return reply_error(c, 500, "server_error", "out of memory");
            return reply(c, 200, "text/plain; version=0.0.4", s);
        }
    } else if (!strcmp(url, "/v1/completions") || !strcmp(url, "/v1/chat/completions")) {
        if (post) return complete(ap, c, cn, !strcmp(url, "/v1/chat/completions"));
    } else {
        return reply_error(c, 404, "not_found", "no such path: %s", url);
    }
    return reply_error(c, 405, "invalid_request_error", "method %s not allowed on %s", method, url);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    qi_serve_app *ap = cls;
    (void)version;
    conn *cn = *con_cls;
    if (!cn) {
        if (!(cn = qi_calloc(1, sizeof *cn))) return MHD_NO;
        *con_cls = cn;
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        if (cl && strtoull(cl, NULL, 10) > BODY_LIMIT) {
            cn->answered = true;
            return reply_error(c, 413, "invalid_request_error", "the body is over %u bytes", BODY_LIMIT);
        }
        return MHD_YES;
    }
    if (*upload_size) {
        if (!cn->too_big && cn->n + *upload_size > BODY_LIMIT) {
            cn->too_big = true;
            qi_free(cn->body);
            cn->body = NULL;
            cn->n = 0;
        }
        if (!cn->too_big && !cn->answered) {
            char *b = qi_realloc(cn->body, cn->n + *upload_size + 1);
            if (!b) return MHD_NO;
            memcpy(b + cn->n, upload, *upload_size);
            cn->body = b;
            cn->n += *upload_size;
            cn->body[cn->n] = '\0';
        }
        *upload_size = 0;
        return MHD_YES;
    }
    if (cn->answered) return MHD_YES;
    cn->answered = true;
    if (cn->too_big) return reply_error(c, 413, "invalid_request_error", "the body is over %u bytes", BODY_LIMIT);
    return route(ap, c, url, method, cn);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    (void)cls, (void)c, (void)toe;
    conn *cn = *con_cls;
    if (cn) {
        qi_free(cn->body);
        qi_free(cn);
    }
    *con_cls = NULL;
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
    d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION, 0, NULL, NULL, on_request,
                         &ap, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa, MHD_OPTION_NOTIFY_COMPLETED, on_completed,
                         &ap, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)15, MHD_OPTION_CONNECTION_LIMIT,
                         (unsigned)64, MHD_OPTION_END);
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

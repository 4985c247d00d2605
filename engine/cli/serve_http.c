/* serve_http.c - the HTTP side of `qinfer serve` (serve_api.h,
 * qi_serve_http_start): libmicrohttpd's daemon, a thread per connection
 * (so a handler may block while its request runs), and its handlers: the
 * routes, a body collected up to BODY_LIMIT, a completion request parsed
 * (serve_api.c) and submitted to the server (serve_loop.c), its answer
 * waited for or streamed. A non-streaming handler waits for its request to
 * finish; a streaming one returns a response whose reader blocks until more
 * text is ready and sends it as server-sent events, with a comment line
 * every second of silence, so a client that went away is noticed (the write
 * fails), the response is destroyed and its request cancelled, freeing its
 * KV blocks. Built only with QI_HAVE_SERVE.
 */
#ifdef QI_HAVE_SERVE
#define _GNU_SOURCE /* POLLRDHUP */
#include <cJSON.h>
#include <errno.h>
#include <math.h>
#include <microhttpd.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "serve_api.h"

#define BODY_LIMIT (1u << 20) /* request bodies past 1 MiB get 413 */

/* One connection's request: its body as it arrives. */
typedef struct {
    char *body;
    size_t n;
    bool too_big, answered;
} conn;

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

struct MHD_Daemon *qi_serve_http_start(qi_serve_app *ap, const struct sockaddr *sa) {
    return MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION |
                                (sa ? 0 : MHD_USE_NO_LISTEN_SOCKET),
                            0, NULL, NULL, on_request, ap, MHD_OPTION_SOCK_ADDR, sa, MHD_OPTION_NOTIFY_COMPLETED,
                            on_completed, ap, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)15,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)64, MHD_OPTION_END);
}

#endif

/* serve_api.h - the OpenAI API's JSON for `qinfer serve` (private to the
 * CLI): completion and chat requests read and checked into a qi_sreq, and
 * the answers written, with cJSON. */
#ifndef QI_SERVE_API_H
#define QI_SERVE_API_H

#include <cJSON.h>
#include <stdbool.h>

#include "qinfer/chat.h"
#include "serve.h"

/* What the HTTP side shares with every handler. */
typedef struct {
    qi_server srv;
    const char *model_id;
    qi_chat_template chat;
    bool have_chat;
    char chat_error[512];
} qi_serve_app;

/* One completion request, parsed. */
typedef struct {
    bool chat, stream, echo;
    bool timeline;     /* "qinfer_timeline": true: the answer carries the request's timeline */
    qi_sreq *r;
    char *prompt_text; /* the prompt as sent (echo) */
} qi_serve_job;

/* Parses and checks a completion (chat: a chat completion) request body into
 * j, its qi_sreq made but not submitted. Returns 0, or the HTTP status of a
 * bad request (400; 500 when out of memory) with *msg and *etype (the
 * error's type) set. */
unsigned qi_serve_parse_job(qi_serve_app *ap, const char *body, size_t n, bool chat, qi_serve_job *j, char *msg,
                            size_t cap, const char **etype);
/* The answer to a finished request, not streamed. */
cJSON *qi_serve_answer(const qi_serve_app *ap, const qi_serve_job *j, long created);
const char *qi_serve_finish_name(qi_finish f);
/* The finished request's usage object, and its timeline when asked for
 * (j->timeline): "qinfer_timeline": {arrival_s, start_s, token_s: [...]},
 * seconds on the server's clock (qi_measure_now), the times /metrics'
 * figures are computed from. */
void qi_serve_add_usage(cJSON *o, const qi_serve_job *j);
/* Text as valid UTF-8 (JSON strings must be): bytes that are not part of a
 * well-formed character become U+FFFD. qi_malloc'ed, NULL when out of memory. */
char *qi_serve_utf8_clean(const char *s, size_t n);
/* A JSON string of s[0..n), cleaned; NULL when out of memory. */
cJSON *qi_serve_json_text(const char *s, size_t n);

struct sockaddr;
struct MHD_Daemon;
/* The HTTP daemon serving ap's API (serve_http.c): libmicrohttpd, a thread
 * per connection, listening on sa; sa NULL: on no socket, its connections
 * handed to it with MHD_add_connection. NULL when it cannot start (errno
 * says why). Stop it with MHD_stop_daemon before ap's server. */
struct MHD_Daemon *qi_serve_http_start(qi_serve_app *ap, const struct sockaddr *sa);

#endif

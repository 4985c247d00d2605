/* load.h - the HTTP side of `qinfer load` (private to the CLI): streaming
 * completion requests over libcurl's multi interface, their server-sent
 * events timed as they arrive, plain GETs, and the `qinfer serve` child the
 * command may start. Built only with QI_HAVE_LOAD. */
#ifndef QI_LOAD_H
#define QI_LOAD_H

#include <curl/curl.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "qinfer/status.h"

/* One streaming request. Zero it before use; qi_load_req_fini frees what it
 * holds but ev_t (the times of the events that carried text, qi_malloc'ed),
 * which stays for the request's timeline and is the caller's to free. */
typedef struct {
    CURL *h;
    struct curl_slist *hdr;
    char *body;       /* the request's JSON */
    char *buf;        /* bytes of the response not yet parsed */
    size_t n, cap;
    double t_send, t_finish;
    double *ev_t;     /* times of events carrying text */
    int n_ev, cap_ev;
    int n_prompt, n_out; /* usage, from the last event */
    bool sent, finished, done_event, failed;
    char reason[160]; /* why it was rejected */
} qi_load_req;

/* Fills *q with a POST of body (JSON, taken: freed by qi_load_req_fini) to
 * url/v1/completions and adds it to mh; the events are timed and parsed as
 * they arrive. Marks it sent (t_send) first. false: it could not be made or
 * added. */
bool qi_load_req_start(CURLM *mh, const char *url, char *body, qi_load_req *q);
/* Its transfer finished with rc: done when it streamed to the end ([DONE]
 * after a finish_reason), else rejected with why (an HTTP error and its
 * message, a transport error, a stream cut short). */
void qi_load_req_end(qi_load_req *q, CURLcode rc);
/* Marks it rejected with the reason fmt (one %s: s), unless it already is. */
void qi_load_req_reject(qi_load_req *q, const char *fmt, const char *s);
/* Its handle removed from mh and freed, and its buffers but ev_t. */
void qi_load_req_fini(CURLM *mh, qi_load_req *q);

/* GET url + path; the body (qi_malloc'ed, NUL-terminated) in *out.
 * QI_ERR_IO naming the URL when it cannot be reached or is not 200. */
qi_status qi_load_http_get(const char *url, const char *path, char **out, qi_err *err);
/* Waits (up to 30 s) until the server's /metrics shows nothing running or
 * waiting. */
void qi_load_wait_idle(const char *url);

/* The `qinfer serve` child. log: its stderr (set before start to choose
 * the file; "" makes a temporary one, removed at stop). */
typedef struct {
    pid_t pid;
    char log[512];
    bool own_log;
} qi_load_child;

/* Starts `qinfer serve -m model --port 0 extra...` (this program) with its
 * stderr in c->log, dying with this process, and waits up to 120 s for the
 * line that gives its address, written to url. Errors: QI_ERR_IO (it
 * exited, with its last line; it did not start in time). */
qi_status qi_load_child_start(qi_load_child *c, const char *model, char **extra, int n_extra, char *url, size_t cap,
                              qi_err *err);
/* SIGTERM, then SIGKILL after 20 s; waited for. Its temporary log removed
 * (unless own_log was cleared). No child: only that. */
void qi_load_child_stop(qi_load_child *c);

#endif

/* load_http.c - the HTTP side of `qinfer load` (load.h): a streaming
 * completion request on libcurl's multi interface, whose server-sent events
 * are split and parsed (cJSON) as the bytes arrive, each event carrying
 * text timed on qi_measure_now's clock; plain GETs (health, models,
 * metrics); and the `qinfer serve` child process.
 *
 * Why the child's stderr goes to a file and not a pipe: the server logs a
 * line per request, and a pipe nobody drains would block it once full; the
 * file is read for the address line it prints when it listens.
 */
#define _GNU_SOURCE /* prctl */
#ifdef QI_HAVE_LOAD
#include <cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "load.h"
#include "qinfer/measure.h"

/* ---- one request ------------------------------------------------------------------ */

void qi_load_req_reject(qi_load_req *q, const char *fmt, const char *s) {
    if (!q->failed) snprintf(q->reason, sizeof q->reason, fmt, s);
    q->failed = true;
}

/* One server-sent event's data. */
static void on_event(qi_load_req *q, const char *data, double now) {
    if (!strcmp(data, "[DONE]")) {
        q->done_event = true;
        return;
    }
    cJSON *o = cJSON_Parse(data);
    if (!o) {
        qi_load_req_reject(q, "bad event: %.100s", data);
        return;
    }
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(o, "error");
    if (e) {
        const cJSON *m = cJSON_GetObjectItemCaseSensitive(e, "message");
        qi_load_req_reject(q, "server error: %.120s", cJSON_IsString(m) ? m->valuestring : "?");
    }
    const cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(o, "choices"), 0);
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(c, "text");
    if (cJSON_IsString(t) && t->valuestring[0]) {
        if (q->n_ev == q->cap_ev) {
            int cap = q->cap_ev ? q->cap_ev * 2 : 64;
            double *p = qi_realloc(q->ev_t, sizeof *p * (size_t)cap);
            if (!p) {
                qi_load_req_reject(q, "%s", "out of memory");
                cJSON_Delete(o);
                return;
            }
            q->ev_t = p;
            q->cap_ev = cap;
        }
        q->ev_t[q->n_ev++] = now;
    }
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(c, "finish_reason");
    if (cJSON_IsString(f)) {
        const cJSON *u = cJSON_GetObjectItemCaseSensitive(o, "usage");
        const cJSON *np = cJSON_GetObjectItemCaseSensitive(u, "prompt_tokens");
        const cJSON *nc = cJSON_GetObjectItemCaseSensitive(u, "completion_tokens");
        q->n_prompt = cJSON_IsNumber(np) ? np->valueint : 0;
        q->n_out = cJSON_IsNumber(nc) ? nc->valueint : 0;
        q->finished = true;
        q->t_finish = now;
    }
    cJSON_Delete(o);
}

static size_t on_data(char *p, size_t size, size_t nmemb, void *user) {
    qi_load_req *q = user;
    size_t n = size * nmemb;
    const double now = qi_measure_now();
    if (q->n + n + 1 > q->cap) {
        size_t cap = q->cap ? q->cap : 4096;
        while (cap < q->n + n + 1) cap *= 2;
        char *b = qi_realloc(q->buf, cap);
        if (!b) return 0; /* aborts the transfer */
        q->buf = b;
        q->cap = cap;
    }
    memcpy(q->buf + q->n, p, n);
    q->n += n;
    q->buf[q->n] = '\0';
    long code = 0;
    curl_easy_getinfo(q->h, CURLINFO_RESPONSE_CODE, &code);
    if (code != 200) return n; /* an error body: read whole at the end */
    /* events end with a blank line; each line "data: X", or ": comment" */
    char *start = q->buf, *end;
    while ((end = strstr(start, "\n\n"))) {
        *end = '\0';
        for (char *line = start; line && *line;) {
            char *nl = strchr(line, '\n');
            if (nl) *nl = '\0';
            if (!strncmp(line, "data: ", 6)) on_event(q, line + 6, now);
            line = nl ? nl + 1 : NULL;
        }
        start = end + 2;
    }
    q->n -= (size_t)(start - q->buf);
    memmove(q->buf, start, q->n + 1);
    return n;
}

void qi_load_req_fini(CURLM *mh, qi_load_req *q) {
    if (q->h) {
        curl_multi_remove_handle(mh, q->h);
        curl_easy_cleanup(q->h);
    }
    curl_slist_free_all(q->hdr);
    free(q->body);
    qi_free(q->buf); /* ev_t stays: the request's timeline */
    q->h = NULL;
    q->hdr = NULL;
    q->body = NULL;
    q->buf = NULL;
}

/* ---- the qi_load_child server ------------------------------------------------------------- */


void qi_load_child_stop(qi_load_child *c) {
    if (c->own_log && c->log[0]) unlink(c->log);
    c->own_log = false;
    if (c->pid <= 0) return;
    kill(c->pid, SIGTERM);
    int status = 0;
    for (int i = 0; i < 200; i++) { /* 20 s */
        if (waitpid(c->pid, &status, WNOHANG) == c->pid) {
            c->pid = 0;
            break;
        }
        usleep(100000);
    }
    if (c->pid > 0) {
        kill(c->pid, SIGKILL);
        waitpid(c->pid, &status, 0);
        c->pid = 0;
    }
}

/* Starts `qinfer serve -m model --port 0 extra...` with its stderr in c->log
 * and waits (up to 120 s) for the line that gives its address. */
qi_status qi_load_child_start(qi_load_child *c, const char *model, char **extra, int n_extra, char *url, size_t cap,
                             qi_err *err) {
    int fd;
    if (c->log[0]) {
        fd = open(c->log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    } else {
        snprintf(c->log, sizeof c->log, "%s/qinfer-load-serve-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
        fd = mkstemp(c->log);
        c->own_log = fd >= 0;
    }
    if (fd < 0) return QI_ERR(err, QI_ERR_IO, "%s: cannot create the server's log: %s", c->log, strerror(errno));
    char **av = calloc((size_t)n_extra + 8, sizeof *av);
    if (!av) {
        close(fd);
        return QI_ERR(err, QI_ERR_NOMEM, "out of memory");
    }
    int k = 0;
    av[k++] = "qinfer";
    av[k++] = "serve";
    av[k++] = "-m";
    av[k++] = (char *)model;
    av[k++] = "--port";
    av[k++] = "0";
    for (int i = 0; i < n_extra; i++) av[k++] = extra[i];
    const pid_t parent = getpid();
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGTERM); /* never outlive the load test */
        if (getppid() != parent) _exit(1);
        dup2(fd, 2);
        int nul = open("/dev/null", O_RDWR);
        if (nul >= 0) dup2(nul, 0), dup2(nul, 1);
        execv("/proc/self/exe", av);
        fprintf(stderr, "qinfer load: cannot run qinfer serve: %s\n", strerror(errno));
        _exit(127);
    }
    free(av);
    close(fd);
    if (pid < 0) return QI_ERR(err, QI_ERR_IO, "cannot start qinfer serve: %s", strerror(errno));
    c->pid = pid;
    for (int i = 0; i < 1200; i++) {
        FILE *f = fopen(c->log, "r");
        char line[1024];
        while (f && fgets(line, sizeof line, f)) {
            const char *p = strstr(line, " on http://");
            if (p) {
                size_t n = strcspn(p + 4, " \n");
                snprintf(url, cap, "%.*s", (int)n, p + 4);
                fclose(f);
                return QI_OK;
            }
        }
        if (f) fclose(f);
        int status;
        if (waitpid(pid, &status, WNOHANG) == pid) {
            c->pid = 0;
            FILE *g = fopen(c->log, "r");
            char last[1024] = "";
            while (g && fgets(line, sizeof line, g)) snprintf(last, sizeof last, "%s", line);
            if (g) fclose(g);
            last[strcspn(last, "\n")] = '\0';
            return QI_ERR(err, QI_ERR_IO, "qinfer serve exited at start: %s", last[0] ? last : "(no message)");
        }
        usleep(100000);
    }
    return QI_ERR(err, QI_ERR_IO, "qinfer serve did not start within 120 s (its log: %s)", c->log);
}

/* ---- plain requests --------------------------------------------------------------- */

static size_t on_body(char *p, size_t size, size_t nmemb, void *user) {
    qi_load_req *q = user;
    size_t n = size * nmemb;
    if (q->n + n + 1 > q->cap) {
        size_t cap = q->cap ? q->cap : 1024;
        while (cap < q->n + n + 1) cap *= 2;
        char *b = qi_realloc(q->buf, cap);
        if (!b) return 0;
        q->buf = b;
        q->cap = cap;
    }
    memcpy(q->buf + q->n, p, n);
    q->n += n;
    q->buf[q->n] = '\0';
    return n;
}

/* GET url/path; the body (qi_malloc'ed) in *out. */
qi_status qi_load_http_get(const char *url, const char *path, char **out, qi_err *err) {
    *out = NULL;
    char full[1024];
    snprintf(full, sizeof full, "%s%s", url, path);
    qi_load_req q = {0};
    CURL *h = curl_easy_init();
    if (!h) return QI_ERR(err, QI_ERR_NOMEM, "curl_easy_init failed");
    curl_easy_setopt(h, CURLOPT_URL, full);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &q);
    curl_easy_setopt(h, CURLOPT_TIMEOUT, 10L);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    CURLcode rc = curl_easy_perform(h);
    long code = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code);
    curl_easy_cleanup(h);
    if (rc != CURLE_OK) {
        qi_free(q.buf);
        return QI_ERR(err, QI_ERR_IO, "%s: %s (is qinfer serve running there?)", full, curl_easy_strerror(rc));
    }
    if (code != 200) {
        qi_free(q.buf);
        return QI_ERR(err, QI_ERR_IO, "%s: HTTP %ld", full, code);
    }
    *out = q.buf ? q.buf : qi_calloc(1, 1);
    return QI_OK;
}

/* Waits (up to 30 s) until the server has nothing running or waiting, so
 * that what a rate abandoned at its time bound does not load the next one
 * (a cancelled request leaves at the server's next step). */
void qi_load_wait_idle(const char *url) {
    for (int i = 0; i < 300; i++) {
        char *m = NULL;
        if (qi_load_http_get(url, "/metrics", &m, NULL)) return;
        const char *r = strstr(m, "\nqinfer_requests_running "), *w = strstr(m, "\nqinfer_requests_waiting ");
        const bool idle = r && w && atol(r + 25) == 0 && atol(w + 25) == 0;
        qi_free(m);
        if (idle) return;
        usleep(100000);
    }
}


bool qi_load_req_start(CURLM *mh, const char *url, char *body, qi_load_req *q) {
    q->body = body;
    char full[1024];
    snprintf(full, sizeof full, "%s/v1/completions", url);
    if (!(q->h = curl_easy_init())) return false;
    q->hdr = curl_slist_append(NULL, "Content-Type: application/json");
    curl_easy_setopt(q->h, CURLOPT_URL, full);
    curl_easy_setopt(q->h, CURLOPT_HTTPHEADER, q->hdr);
    curl_easy_setopt(q->h, CURLOPT_POSTFIELDS, q->body);
    curl_easy_setopt(q->h, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(q->h, CURLOPT_WRITEDATA, q);
    curl_easy_setopt(q->h, CURLOPT_PRIVATE, q);
    curl_easy_setopt(q->h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(q->h, CURLOPT_TCP_NODELAY, 1L);
    q->t_send = qi_measure_now();
    q->sent = true;
    return curl_multi_add_handle(mh, q->h) == CURLM_OK;
}

/* A finished transfer: done when it streamed to the end, else rejected with why. */
void qi_load_req_end(qi_load_req *q, CURLcode rc) {
    long code = 0;
    curl_easy_getinfo(q->h, CURLINFO_RESPONSE_CODE, &code);
    if (rc != CURLE_OK) {
        qi_load_req_reject(q, "transfer failed: %s", curl_easy_strerror(rc));
    } else if (code != 200) {
        char what[160];
        cJSON *o = q->buf ? cJSON_Parse(q->buf) : NULL;
        const cJSON *m = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(o, "error"), "message");
        snprintf(what, sizeof what, "HTTP %ld: %.120s", code, cJSON_IsString(m) ? m->valuestring : "no message");
        cJSON_Delete(o);
        qi_load_req_reject(q, "%s", what);
    } else if (!q->finished || !q->done_event) {
        qi_load_req_reject(q, "%s", "the stream ended without a finish");
    }
}

#endif

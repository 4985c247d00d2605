/* fz_http.c - libFuzzer target: raw HTTP requests to `qinfer serve`'s
 * daemon (serve_http.c: libmicrohttpd's parser, then the routes, body
 * collection and limits, the JSON request parser and the queue), on a
 * server with a tokenizer and no engine, stopping: a completion request
 * that parses is refused with 503 rather than generated.
 *
 * Each input is written whole to one connection (a socket pair handed to
 * the daemon, which listens on nothing), the writing side then shut, and
 * the answer read to the end. Checked: whatever comes back is an HTTP
 * response; every connection is closed and forgotten before the next input
 * (no thread or memory of it left behind).
 */
#include <arpa/inet.h>
#include <microhttpd.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "fz.h"
#include "serve_api.h"

static struct MHD_Daemon *g_d;

static void setup(void) {
    static qi_model model;
    static qi_serve_app ap;
    signal(SIGPIPE, SIG_IGN);
    model.tok = fz_vocab_bpe("smollm");
    model.hp.n_vocab = qi_tokenizer_n_vocab(model.tok);
    snprintf(model.hp.arch_name, sizeof model.hp.arch_name, "llama");
    ap.srv.m = &model;
    ap.srv.n_ctx = 256;
    ap.srv.max_queue = 4;
    ap.srv.stop = true;
    pthread_mutex_init(&ap.srv.mu, NULL);
    pthread_cond_init(&ap.srv.work, NULL);
    pthread_cond_init(&ap.srv.progress, NULL);
    ap.model_id = "fuzz-model";
    qi_err e = {0};
    ap.have_chat = qi_chat_detect("<|im_start|>", "llama", &ap.chat, &e) == QI_OK;
    g_d = qi_serve_http_start(&ap, NULL);
    FZ_CHECK(g_d != NULL, "the daemon does not start");
}

static unsigned connections(void) {
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(g_d, MHD_DAEMON_INFO_CURRENT_CONNECTIONS);
    return di ? di->num_connections : 0;
}

static void nap(void) { nanosleep(&(struct timespec){0, 200000}, NULL); }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!g_d) setup();
    int sv[2];
    FZ_CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0, "socketpair");
    struct sockaddr_in peer = {.sin_family = AF_INET, .sin_port = htons(40000)};
    peer.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    FZ_CHECK(MHD_add_connection(g_d, sv[1], (struct sockaddr *)&peer, sizeof peer) == MHD_YES, "add_connection");
    char buf[65536];
    size_t got = 0, off = 0;
    bool shut = false, closed = false;
    for (int idle = 0; idle < 10000;) { /* 10000 quiet 1 ms polls: 10 s, a hang */
        if (off >= size && !shut) shutdown(sv[0], SHUT_WR), shut = true; /* all sent: the client is done */
        struct pollfd pf = {.fd = sv[0], .events = POLLIN | (off < size ? POLLOUT : 0)};
        if (poll(&pf, 1, 1) <= 0) {
            idle++;
            continue;
        }
        if ((pf.revents & POLLOUT) && off < size) {
            ssize_t k = write(sv[0], data + off, size - off);
            if (k > 0) off += (size_t)k;
            else off = size; /* the daemon closed: it read what it wanted */
        }
        if (pf.revents & (POLLIN | POLLHUP)) {
            ssize_t k = read(sv[0], got < sizeof buf ? buf + got : buf, got < sizeof buf ? sizeof buf - got : sizeof buf);
            if (k <= 0) {
                closed = true;
                break;
            }
            if (got < sizeof buf) got += (size_t)k;
        }
    }
    close(sv[0]);
    FZ_CHECK(closed, "the daemon neither answered nor closed within 10 s of the request's end");
    FZ_CHECK(got == 0 || (got >= 12 && memcmp(buf, "HTTP/1.", 7) == 0), "an answer that is not HTTP: %.40s", buf);
    if (got) fz_note("%.12s", buf + 0);
    for (int i = 0; connections() > 0; i++) {
        FZ_CHECK(i < 50000, "a connection still open 10 s after its client left");
        nap();
    }
    return 0;
}

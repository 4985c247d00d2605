/* cmd_load.c - `qinfer load`: a load test of `qinfer serve` from a second
 * process, over loopback HTTP, at rising arrival rates until the latency SLO
 * breaks.
 *
 * Each rate is one run: a workload of the workload module (Poisson arrivals
 * at the rate, lengths from the given distributions, prompts at the places
 * of the evaluation corpus it draws, seeded) sent as streaming
 * /v1/completions requests. The client times each request itself (sent,
 * each server-sent event carrying text, the last event) and hands the
 * timelines to qi_measure_run, so TTFT, TPOT, ITL, percentiles, throughput
 * and goodput are the one definition of engine/measure.c, seen from the
 * client's side of the socket. A run is bounded in requests (--requests) and
 * in time (--max-seconds: what is not sent by then is not sent, what is
 * still running is abandoned, and both count as rejected, with the reason);
 * the rates rise until the share of the requests sent that met every bound
 * falls below --slo-goodput (the requests the time bound kept from being
 * sent are the test's limit, not the server's, so they do not count
 * against it; those abandoned at the bound do). Between rates it waits for
 * the server to be idle (/metrics), so one rate's leftovers do not load the
 * next.
 *
 * Why libcurl's multi interface: many requests in flight from one thread,
 * each a streaming response read as it arrives, without hand-written HTTP.
 * Why the prompt is text: the API takes text, so a corpus window's tokens
 * are turned back into text with the model's tokenizer (read from the GGUF
 * alone, no weights) and the server tokenises it again; the prompt length
 * recorded is the server's count (usage.prompt_tokens), which may differ
 * from the drawn one by a token or two at the window's edges.
 *
 * A streamed event carries at least one token's text, and usually exactly
 * one; when the server reports more tokens (usage.completion_tokens) than
 * events, the tokens whose text came together are given the time of the
 * last event, so the first and last token times (TTFT, end to end, TPOT)
 * are the ones the client saw and the inter-token gaps of such tokens are 0.
 *
 * With -m the command starts `qinfer serve` itself (this same program, on a
 * free loopback port) as a qi_load_child process and stops it at the end, on
 * failure too; with --url it drives a server already running. Built only
 * with libcurl and cJSON (QI_HAVE_LOAD); results need SQLite.
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"

#ifndef QI_HAVE_LOAD
int qi_cmd_load(int argc, char **argv) {
    (void)argc;
    (void)argv;
    qi_cli_error("load", "not built: libcurl and cJSON were not found at configure time "
                         "(apt-get install libcurl4-openssl-dev libcjson-dev, then configure again)");
    return QI_EXIT_RUNTIME;
}
#else

#include <cJSON.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <time.h>

#include "qinfer/gguf.h"
#include "qinfer/measure.h"
#include "qinfer/model_files.h"
#include "qinfer/tokenizer.h"
#include "qinfer/workload.h"
#include "load.h"
#ifdef QI_HAVE_SQLITE
#include "harness/db.h"
#endif

#define MAX_RATES 32
#define LOAD_EXPERIMENT "load_test"

static void help(void) {
    printf(
        "usage: qinfer load [--url URL | -m MODEL] [options] [-- serve options]\n\n"
        "Load-test qinfer serve from this process over HTTP: streaming /v1/completions\n"
        "requests arriving as a Poisson process, with prompts from the evaluation corpus,\n"
        "at rising rates until the latency SLO breaks. Each rate is one run in the results\n"
        "database, its figures (TTFT, TPOT, ITL, end to end, throughput, goodput) measured\n"
        "at the client as engine/measure.c defines them (results/README.md).\n\n"
        "  -m, --model MODEL     start `qinfer serve -m MODEL` on a free loopback port for the\n"
        "                        test and stop it at the end; anything after -- is passed to it\n"
        "                        (e.g. -- -t 2 --max-batch 8; -- --kv-memory 64 --preempt swap\n"
        "                        for a KV budget whose preemptions swap to the offload tier)\n"
        "      --url URL         drive the server already running there instead (default\n"
        "                        http://127.0.0.1:8080); its model's tokenizer is read from the\n"
        "                        cache under the model id it reports, or --tokenizer\n"
        "      --tokenizer MODEL GGUF path or cached name whose tokenizer turns corpus windows\n"
        "                        into prompt text (default: the server's model)\n"
        "      --rates LIST      arrival rates in requests/s, rising (e.g. 0.5,1,2,4)\n"
        "      --rate-start R    without --rates: R, R*F, R*F^2, ... (default 0.5)\n"
        "      --rate-factor F   (default 2)\n"
        "      --max-rates K     at most K rates (default 8)\n"
        "      --requests N      requests per rate (default 32)\n"
        "      --max-seconds S   each rate's time bound: nothing is sent after S s, and what is\n"
        "                        still running at S s is abandoned (default 60)\n"
        "      --prompt-len D    prompt tokens: N, uniform:A-B, exp:MEAN, lognormal:MEDIAN,SIGMA\n"
        "                        (default 64)\n"
        "      --output-len D    output tokens asked for (default 32)\n"
        "  -f, --corpus NAME     corpus the prompts are taken from (default devil)\n"
        "  -s, --seed N          workload seed (default 1; rate i uses seed + i)\n"
        "      --temp T          sampling temperature (default 0: greedy)\n"
        "      --slo-ttft-ms MS  TTFT bound (default 1000; 0: none)\n"
        "      --slo-tpot-ms MS  TPOT bound (default 200; 0: none)\n"
        "      --slo-goodput F   the SLO holds while at least this share of the requests sent\n"
        "                        meet every bound (default 0.9); the first rate below it is the last\n"
        "      --db FILE         results database (default results/load_test.db)\n"
        "      --experiment NAME experiment name (default load_test)\n"
        "      --no-db           print only\n"
        "      --serve-log FILE  the started server's stderr (default: a temporary file, removed)\n"
        "  -h, --help            this help\n\n"
        "Each rate prints one line: requests done and rejected, goodput, TTFT and TPOT p99,\n"
        "output-token throughput. Exit 0 when the test ran (the SLO breaking is a result),\n"
        "1 when it could not (no server, a database error), 2 on a bad flag.\n");
}

/* ---- a run ------------------------------------------------------------------------ */

typedef struct {
    const char *url;
    int n_requests;
    double max_seconds, temp;
    qi_len_dist prompt_len, output_len;
    uint64_t seed;
    qi_slo slo;
    double slo_goodput;
    const qi_tokenizer *tok;
    const int32_t *corpus;
    long n_corpus;
} load_opts;

static volatile sig_atomic_t g_interrupted;
static void on_signal(int sig) {
    (void)sig;
    g_interrupted = 1;
}

/* The text of corpus tokens [at, at + n), qi_malloc'ed. */
static char *window_text(const load_opts *o, long at, int n) {
    size_t cap = 256, len = 0;
    char *s = qi_malloc(cap);
    if (!s) return NULL;
    for (int i = 0; i < n; i++) {
        char piece[256];
        size_t k = qi_token_to_piece(o->tok, o->corpus[at + i], false, piece, sizeof piece);
        if (k > sizeof piece) k = sizeof piece;
        if (len + k + 1 > cap) {
            while (len + k + 1 > cap) cap *= 2;
            char *p = qi_realloc(s, cap);
            if (!p) {
                qi_free(s);
                return NULL;
            }
            s = p;
        }
        memcpy(s + len, piece, k);
        len += k;
    }
    s[len] = '\0';
    return s;
}

static bool start_request(CURLM *mh, const load_opts *o, const qi_work_request *w, qi_load_req *q) {
    char *text = window_text(o, w->prompt_at, w->n_prompt);
    cJSON *b = cJSON_CreateObject();
    if (!text || !b) {
        qi_free(text);
        cJSON_Delete(b);
        return false;
    }
    cJSON_AddStringToObject(b, "prompt", text);
    qi_free(text);
    cJSON_AddNumberToObject(b, "max_tokens", w->n_out);
    cJSON_AddNumberToObject(b, "temperature", o->temp);
    cJSON_AddNumberToObject(b, "seed", (double)(o->seed & 0xffffffffu));
    cJSON_AddTrueToObject(b, "stream");
    char *body = cJSON_PrintUnformatted(b);
    cJSON_Delete(b);
    return body && qi_load_req_start(mh, o->url, body, q);
}

typedef struct {
    qi_run_metrics rm;
    long n_sent;
    double good_frac; /* good / sent: what the SLO is judged by */
    long n_rejected_time, n_rejected_other;
} run_result;

#ifdef QI_HAVE_SQLITE
typedef struct {
    qi_db *db;
    int64_t exp;
    qi_db_host host;
    const char *model_path, *model_id, *corpus, *sweep, *prompt_spec, *output_spec, *serve_args;
} db_ctx;
#endif

static qi_status run_rate(const load_opts *o, double rate, uint64_t seed, run_result *res, qi_load_req **out_q,
                          qi_request_timeline **out_tl, qi_workload **out_w, qi_err *err) {
    memset(res, 0, sizeof *res);
    qi_workload_opts wo = {.n_requests = o->n_requests, .rate = rate, .prompt_len = o->prompt_len,
                           .output_len = o->output_len, .seed = seed, .corpus_tokens = o->n_corpus};
    qi_workload *w = NULL;
    qi_status st = qi_workload_generate(&wo, &w, err);
    if (st) return st;
    *out_w = w;
    qi_load_req *q = qi_calloc((size_t)w->n, sizeof *q);
    qi_request_timeline *tl = qi_calloc((size_t)w->n, sizeof *tl);
    *out_q = q;
    *out_tl = tl;
    if (!q || !tl) return QI_ERR(err, QI_ERR_NOMEM, "out of memory");
    CURLM *mh = curl_multi_init();
    if (!mh) return QI_ERR(err, QI_ERR_NOMEM, "curl_multi_init failed");
    const double t0 = qi_measure_now();
    long next = 0, running = 0;
    for (;;) {
        double now = qi_measure_now();
        const bool out_of_time = now - t0 >= o->max_seconds || g_interrupted;
        while (!out_of_time && next < w->n && now - t0 >= w->req[next].arrival_s) {
            if (!start_request(mh, o, &w->req[next], &q[next])) qi_load_req_reject(&q[next], "%s", "cannot build the request");
            else running++;
            next++;
        }
        int still = 0;
        curl_multi_perform(mh, &still);
        CURLMsg *msg;
        int left;
        while ((msg = curl_multi_info_read(mh, &left))) {
            if (msg->msg != CURLMSG_DONE) continue;
            qi_load_req *r = NULL;
            curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&r);
            qi_load_req_end(r, msg->data.result);
            curl_multi_remove_handle(mh, r->h);
            curl_easy_cleanup(r->h);
            r->h = NULL;
            running--;
        }
        if (out_of_time || (next == w->n && running == 0)) break;
        double wait = next < w->n ? t0 + w->req[next].arrival_s - qi_measure_now() : 0.1;
        if (wait > 0.1) wait = 0.1;
        if (t0 + o->max_seconds - qi_measure_now() < wait) wait = t0 + o->max_seconds - qi_measure_now();
        int ms = wait > 0 ? (int)ceil(wait * 1000) : 0;
        curl_multi_poll(mh, NULL, 0, ms, NULL);
    }
    /* the time bound: the unsent are not sent, the running abandoned (closing
     * the connection cancels them at the server) */
    for (long i = 0; i < w->n; i++) {
        if (!q[i].sent) qi_load_req_reject(&q[i], "%s", "not sent: the time bound came first");
        else if (q[i].h) qi_load_req_reject(&q[i], "%s", "abandoned at the time bound");
        if (q[i].failed && (!q[i].sent || q[i].h)) res->n_rejected_time++;
        else if (q[i].failed) res->n_rejected_other++;
        qi_load_req_fini(mh, &q[i]);
    }
    curl_multi_cleanup(mh);
    /* timelines: tokens on the events that carried them */
    for (long i = 0; i < w->n; i++) {
        qi_load_req *r = &q[i];
        tl[i] = (qi_request_timeline){.arrival = r->sent ? r->t_send : t0 + w->req[i].arrival_s, .start = NAN,
                                      .rejected = r->failed};
        if (r->failed) continue;
        const int n = r->n_out, k = r->n_ev;
        double *t = qi_malloc(sizeof(double) * (size_t)(n ? n : 1));
        if (!t) return QI_ERR(err, QI_ERR_NOMEM, "out of memory");
        for (int j = 0; j < n; j++) t[j] = k == 0 ? r->t_finish : r->ev_t[j < k - 1 ? j : k - 1];
        qi_free(r->ev_t);
        r->ev_t = t; /* owned through q, freed by the caller */
        tl[i].token_t = t;
        tl[i].n_out = n;
        tl[i].n_prompt = r->n_prompt;
    }
    if ((st = qi_measure_run(tl, w->n, &o->slo, &res->rm, err))) return st;
    for (long i = 0; i < w->n; i++) res->n_sent += q[i].sent;
    res->good_frac = res->n_sent ? (double)res->rm.n_good / (double)res->n_sent : 0;
    return QI_OK;
}

static void free_rate(qi_load_req *q, qi_request_timeline *tl, qi_workload *w) {
    if (q && w)
        for (long i = 0; i < w->n; i++) qi_free(q[i].ev_t);
    qi_free(q);
    qi_free(tl);
    qi_workload_free(w);
}

#ifdef QI_HAVE_SQLITE
/* One rate's run: its configuration, the run's figures with params {"rate": R},
 * and each request's with {"rate": R, "request": i} (rejected: its reason). */
static qi_status db_record(db_ctx *d, const load_opts *o, double rate, int rate_index, uint64_t seed,
                           const run_result *res, const qi_load_req *q, const qi_request_timeline *tl, long n, qi_err *err) {
    cJSON *c = cJSON_CreateObject();
    cJSON_AddStringToObject(c, "experiment", "load");
    cJSON_AddStringToObject(c, "model", d->model_id);
    cJSON_AddStringToObject(c, "url", o->url);
    cJSON_AddStringToObject(c, "serve_args", d->serve_args);
    cJSON_AddStringToObject(c, "corpus", d->corpus);
    cJSON_AddStringToObject(c, "sweep", d->sweep);
    cJSON_AddNumberToObject(c, "rate", rate);
    cJSON_AddNumberToObject(c, "requests", o->n_requests);
    cJSON_AddNumberToObject(c, "max_seconds", o->max_seconds);
    cJSON_AddStringToObject(c, "prompt_len", d->prompt_spec);
    cJSON_AddStringToObject(c, "output_len", d->output_spec);
    cJSON_AddNumberToObject(c, "temp", o->temp);
    cJSON_AddNumberToObject(c, "slo_ttft_ms", o->slo.ttft_s * 1000);
    cJSON_AddNumberToObject(c, "slo_tpot_ms", o->slo.tpot_s * 1000);
    cJSON_AddNumberToObject(c, "slo_goodput", o->slo_goodput);
    char *cfg = cJSON_PrintUnformatted(c);
    cJSON_Delete(c);
    if (!cfg) return QI_ERR(err, QI_ERR_NOMEM, "out of memory");
    char sha[65], key[128];
    qi_status st = qi_db_config_key(cfg, sha, err);
    if (st) {
        free(cfg);
        return st;
    }
    snprintf(key, sizeof key, "%s#%d", sha, rate_index);
    qi_db_run_info info;
    qi_db_run_info_init(&info, &d->host);
    info.model_path = d->model_path;
    info.has_seed = true;
    info.seed = seed;
    int64_t run;
    st = qi_db_run_begin(d->db, d->exp, cfg, key, &info, &run, err);
    free(cfg);
    if (st) return st;
    char params[256];
    snprintf(params, sizeof params, "{\"rate\":%.17g}", rate);
    const char *name, *unit;
    double v;
    for (int i = 0; !st && qi_measure_run_metric(&res->rm, i, &name, &unit, &v); i++)
        if (name && !isnan(v)) st = qi_db_metric_params(d->db, run, name, params, v, unit, 0, false, err);
    if (!st) st = qi_db_metric_params(d->db, run, "requests.offered", params, (double)n, "1", 0, false, err);
    if (!st) st = qi_db_metric_params(d->db, run, "requests.sent", params, (double)res->n_sent, "1", 0, false, err);
    if (!st) st = qi_db_metric_params(d->db, run, "goodput.fraction", params, res->good_frac, "1", 0, false, err);
    for (long i = 0; !st && i < n; i++) {
        if (q[i].failed) {
            cJSON *p = cJSON_CreateObject();
            cJSON_AddNumberToObject(p, "rate", rate);
            cJSON_AddNumberToObject(p, "request", (double)i);
            cJSON_AddStringToObject(p, "reason", q[i].reason);
            char *ps = cJSON_PrintUnformatted(p);
            cJSON_Delete(p);
            st = ps ? qi_db_metric_params(d->db, run, "request.rejected", ps, 1, "1", 0, false, err)
                    : QI_ERR(err, QI_ERR_NOMEM, "out of memory");
            free(ps);
            continue;
        }
        qi_request_metrics m;
        if ((st = qi_measure_request(&tl[i], &m, err))) break;
        snprintf(params, sizeof params, "{\"rate\":%.17g,\"request\":%ld}", rate, i);
        const struct {
            const char *name, *unit;
            double v;
        } per[] = {{"request.ttft_s", "s", m.ttft_s},
                   {"request.tpot_s", "s", m.tpot_s},
                   {"request.e2e_s", "s", m.e2e_s},
                   {"request.prompt_tokens", "1", tl[i].n_prompt},
                   {"request.output_tokens", "1", tl[i].n_out}};
        for (size_t k = 0; !st && k < sizeof per / sizeof per[0]; k++)
            if (!isnan(per[k].v)) st = qi_db_metric_params(d->db, run, per[k].name, params, per[k].v, per[k].unit, 0,
                                                           false, err);
    }
    if (st) {
        qi_db_run_end(d->db, run, false, err->msg, NULL);
        return st;
    }
    return qi_db_run_end(d->db, run, true, NULL, err);
}
#endif

/* ---- the command ------------------------------------------------------------------- */

static bool parse_rates(const char *cmd, const char *s, double *rates, int *n) {
    *n = 0;
    const char *p = s;
    while (*p) {
        char *end;
        errno = 0;
        double v = strtod(p, &end);
        if (end == p || errno || !isfinite(v) || v <= 0 || v > 1e6 || (*end && *end != ',') || *n == MAX_RATES ||
            (*n > 0 && v <= rates[*n - 1])) {
            qi_cli_error(cmd, "option --rates: '%s' is not a rising list of at most %d rates > 0 (e.g. 0.5,1,2,4)", s,
                         MAX_RATES);
            return false;
        }
        rates[(*n)++] = v;
        p = *end ? end + 1 : end;
        if (*end == ',' && !*p) {
            qi_cli_error(cmd, "option --rates: '%s' ends with a comma", s);
            return false;
        }
    }
    if (*n == 0) {
        qi_cli_error(cmd, "option --rates: no rate given");
        return false;
    }
    return true;
}

static qi_status read_corpus(const qi_tokenizer *tok, const char *name, char *path, size_t cap, int32_t **ids,
                             size_t *n_ids, qi_err *err) {
    qi_status st = qi_cache_resolve(name, "corpus", path, cap, err);
    if (st) return st;
    FILE *f = fopen(path, "rb");
    if (!f) return QI_ERR(err, QI_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = len >= 0 ? qi_malloc((size_t)len + 1) : NULL;
    if (!text || fread(text, 1, (size_t)len, f) != (size_t)len) {
        fclose(f);
        qi_free(text);
        return QI_ERR(err, QI_ERR_IO, "%s: cannot read", path);
    }
    fclose(f);
    if (len > 0 && text[len - 1] == '\n') len--; /* as lq_model_corpus reads it */
    st = qi_tokenize(tok, text, (size_t)len, true, false, ids, n_ids, err);
    qi_free(text);
    return st;
}

int qi_cmd_load(int argc, char **argv) {
    const char *cmd = "load", *url_arg = NULL, *model = NULL, *tok_arg = NULL, *rates_arg = NULL;
    const char *prompt_spec = "64", *output_spec = "32", *corpus = "devil", *db_file = NULL;
    const char *experiment = LOAD_EXPERIMENT, *serve_log = NULL;
    float rate_start = 0.5f, rate_factor = 2, max_seconds = 60, temp = 0, slo_ttft_ms = 1000, slo_tpot_ms = 200,
          slo_goodput = 0.9f;
    int max_rates = 8, n_requests = 32;
    uint64_t seed = 1;
    bool no_db = false, rate_start_set = false;
    /* what follows "--" goes to the started server */
    int n_args = argc, n_extra = 0;
    char **extra = NULL;
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--")) {
            n_args = i;
            extra = argv + i + 1;
            n_extra = argc - i - 1;
            break;
        }
    qi_args a;
    qi_args_init(&a, cmd, n_args, argv);
    while (qi_args_next(&a)) {
        if (qi_args_is(&a, "-h", "--help")) { help(); return 0; }
        else if (qi_args_is(&a, "-m", "--model")) model = qi_args_str(&a);
        else if (qi_args_is(&a, NULL, "--url")) url_arg = qi_args_str(&a);
        else if (qi_args_is(&a, NULL, "--tokenizer")) tok_arg = qi_args_str(&a);
        else if (qi_args_is(&a, NULL, "--rates")) rates_arg = qi_args_str(&a);
        else if (qi_args_is(&a, NULL, "--rate-start")) rate_start_set = qi_args_float(&a, 1e-6, 1e6, &rate_start);
        else if (qi_args_is(&a, NULL, "--rate-factor")) qi_args_float(&a, 1.01, 1000, &rate_factor);
        else if (qi_args_is(&a, NULL, "--max-rates")) qi_args_int(&a, 1, MAX_RATES, &max_rates);
        else if (qi_args_is(&a, NULL, "--requests")) qi_args_int(&a, 1, 1 << 20, &n_requests);
        else if (qi_args_is(&a, NULL, "--max-seconds")) qi_args_float(&a, 0.1, 86400, &max_seconds);
        else if (qi_args_is(&a, NULL, "--prompt-len")) prompt_spec = qi_args_str(&a);
        else if (qi_args_is(&a, NULL, "--output-len")) output_spec = qi_args_str(&a);
        else if (qi_args_is(&a, "-f", "--corpus")) corpus = qi_args_str(&a);
        else if (qi_args_is(&a, "-s", "--seed")) qi_args_u64(&a, &seed);
        else if (qi_args_is(&a, NULL, "--temp")) qi_args_float(&a, 0, 2, &temp);
        else if (qi_args_is(&a, NULL, "--slo-ttft-ms")) qi_args_float(&a, 0, 1e7, &slo_ttft_ms);
        else if (qi_args_is(&a, NULL, "--slo-tpot-ms")) qi_args_float(&a, 0, 1e7, &slo_tpot_ms);
        else if (qi_args_is(&a, NULL, "--slo-goodput")) qi_args_float(&a, 0, 1, &slo_goodput);
        else if (qi_args_is(&a, NULL, "--db")) db_file = qi_args_str(&a);
        else if (qi_args_is(&a, NULL, "--experiment")) experiment = qi_args_str(&a);
        else if (qi_args_is(&a, NULL, "--no-db")) no_db = true;
        else if (qi_args_is(&a, NULL, "--serve-log")) serve_log = qi_args_str(&a);
        else qi_args_unknown(&a);
    }
    if (a.failed) return QI_EXIT_USAGE;
    if (model && url_arg) {
        qi_cli_error(cmd, "give -m (start a server) or --url (use a running one), not both");
        return QI_EXIT_USAGE;
    }
    if (extra && !model) {
        qi_cli_error(cmd, "options after -- go to the server that -m starts; there is none with --url");
        return QI_EXIT_USAGE;
    }
    if (url_arg && strncmp(url_arg, "http://", 7)) {
        qi_cli_error(cmd, "option --url: '%s' is not an http:// URL", url_arg);
        return QI_EXIT_USAGE;
    }
    if (rates_arg && rate_start_set) {
        qi_cli_error(cmd, "give --rates or --rate-start, not both");
        return QI_EXIT_USAGE;
    }
    if (no_db && db_file) {
        qi_cli_error(cmd, "give --db or --no-db, not both");
        return QI_EXIT_USAGE;
    }
    if (!experiment[0]) {
        qi_cli_error(cmd, "option --experiment: an empty name");
        return QI_EXIT_USAGE;
    }
#ifndef QI_HAVE_SQLITE
    if (!no_db) {
        qi_cli_error(cmd, "this qinfer was built without SQLite: give --no-db (or install libsqlite3-dev and rebuild)");
        return QI_EXIT_USAGE;
    }
#endif
    double rates[MAX_RATES];
    int n_rates = 0;
    if (rates_arg) {
        if (!parse_rates(cmd, rates_arg, rates, &n_rates)) return QI_EXIT_USAGE;
        if (n_rates > max_rates) n_rates = max_rates;
    } else {
        for (double r = rate_start; n_rates < max_rates; r *= rate_factor) rates[n_rates++] = r;
    }
    load_opts o = {.n_requests = n_requests, .max_seconds = max_seconds, .temp = temp, .seed = seed,
                   .slo = {.ttft_s = slo_ttft_ms / 1000.0, .tpot_s = slo_tpot_ms / 1000.0},
                   .slo_goodput = slo_goodput};
    qi_err err = {0};
    if (qi_len_dist_parse(prompt_spec, &o.prompt_len, &err) || qi_len_dist_parse(output_spec, &o.output_len, &err)) {
        qi_cli_error(cmd, "%s", err.msg);
        return QI_EXIT_USAGE;
    }

    int rc = 0;
    qi_load_child ch = {0};
    qi_gguf *g = NULL;
    qi_tokenizer *tok = NULL;
    int32_t *corpus_ids = NULL;
    size_t n_corpus = 0;
    char url[512], tok_path[1024] = "", corpus_path[1024], model_id[256] = "", *body = NULL;
#ifdef QI_HAVE_SQLITE
    db_ctx d = {0};
#endif
    struct sigaction sa = {.sa_handler = on_signal}, old_int, old_term;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    signal(SIGPIPE, SIG_IGN);
    curl_global_init(CURL_GLOBAL_DEFAULT);
    char serve_args[512] = "";
    for (int i = 0; i < n_extra; i++)
        snprintf(serve_args + strlen(serve_args), sizeof serve_args - strlen(serve_args), "%s%s", i ? " " : "",
                 extra[i]);
    if (model) {
        if (qi_cache_resolve(model, "model", tok_path, sizeof tok_path, &err)) goto fail;
        if (serve_log) snprintf(ch.log, sizeof ch.log, "%s", serve_log);
        fprintf(stderr, "qinfer load: starting qinfer serve -m %s%s%s\n", model, n_extra ? " " : "", serve_args);
        if (qi_load_child_start(&ch, model, extra, n_extra, url, sizeof url, &err)) goto fail;
        fprintf(stderr, "qinfer load: the server is up at %s (its log: %s)\n", url, ch.log);
    } else {
        snprintf(url, sizeof url, "%s", url_arg ? url_arg : "http://127.0.0.1:8080");
        size_t n = strlen(url);
        while (n > 7 && url[n - 1] == '/') url[--n] = '\0';
    }
    o.url = url;
    if (qi_load_http_get(url, "/health", &body, &err)) goto fail;
    qi_free(body);
    if (qi_load_http_get(url, "/v1/models", &body, &err)) goto fail;
    {
        cJSON *j = cJSON_Parse(body);
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(
            cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(j, "data"), 0), "id");
        if (cJSON_IsString(id)) snprintf(model_id, sizeof model_id, "%s", id->valuestring);
        cJSON_Delete(j);
    }
    qi_free(body);
    body = NULL;
    if (!model_id[0]) {
        QI_ERR(&err, QI_ERR_IO, "%s/v1/models names no model: is this qinfer serve?", url);
        goto fail;
    }
    if (!tok_path[0] || tok_arg) {
        const char *t = tok_arg ? tok_arg : model_id;
        if (qi_cache_resolve(t, "model", tok_path, sizeof tok_path, &err)) {
            qi_err_prefix(&err, "the tokenizer of model '%s' (give --tokenizer)", t);
            goto fail;
        }
    }
    if (qi_gguf_open(tok_path, &g, &err) || qi_tokenizer_create(g, &tok, &err) ||
        read_corpus(tok, corpus, corpus_path, sizeof corpus_path, &corpus_ids, &n_corpus, &err))
        goto fail;
    o.tok = tok;
    o.corpus = corpus_ids;
    o.n_corpus = (long)n_corpus;

#ifdef QI_HAVE_SQLITE
    char db_path[1024], sweep[40];
    if (!no_db) {
        if (db_file) snprintf(db_path, sizeof db_path, "%s", db_file);
        else qi_db_default_path(experiment, db_path, sizeof db_path);
        if (qi_db_open(db_path, &d.db, &err) || qi_db_experiment(d.db, experiment, NULL, NULL, &d.exp, &err))
            goto fail;
        qi_db_host_get(&d.host, ".");
        time_t now = time(NULL);
        strftime(sweep, sizeof sweep, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
        d.model_path = tok_path;
        d.model_id = model_id;
        d.corpus = corpus;
        d.sweep = sweep;
        d.prompt_spec = prompt_spec;
        d.output_spec = output_spec;
        d.serve_args = serve_args;
    }
#endif
    printf("# load test of %s (%s) at %s: %d requests per rate, at most %g s each; prompts %s, outputs %s tokens\n",
           model_id, tok_path, url, n_requests, (double)max_seconds, prompt_spec, output_spec);
    printf("# SLO: TTFT <= %g ms, TPOT <= %g ms for at least %.0f%% of the requests sent\n",
           (double)slo_ttft_ms, (double)slo_tpot_ms, slo_goodput * 100.0);
    printf("%8s %5s %5s %5s %8s %8s %9s %9s %9s %9s %s\n", "rate", "sent", "done", "rej", "goodput", "good%",
           "ttft_p99", "tpot_p99", "tok/s", "req/s", "slo");
    fflush(stdout);
    for (int i = 0; i < n_rates && !g_interrupted; i++) {
        run_result res;
        qi_load_req *q = NULL;
        qi_request_timeline *tl = NULL;
        qi_workload *w = NULL;
        const uint64_t s = seed + (uint64_t)i;
        if (i > 0) qi_load_wait_idle(url);
        qi_status st = run_rate(&o, rates[i], s, &res, &q, &tl, &w, &err);
#ifdef QI_HAVE_SQLITE
        if (!st && !no_db) st = db_record(&d, &o, rates[i], i, s, &res, q, tl, w->n, &err);
#endif
        if (!st) {
            const qi_run_metrics *m = &res.rm;
            const bool ok = res.good_frac >= slo_goodput;
            printf("%8.3g %5ld %5ld %5ld %8.3f %7.1f%% %8.1fms %8.1fms %9.2f %9.3f %s\n", rates[i], res.n_sent, m->n_done,
                   m->n_rejected, m->goodput_req_per_s, 100 * res.good_frac, m->ttft.p99 * 1000,
                   m->tpot.p99 * 1000, m->output_tokens_per_s, m->requests_per_s, ok ? "met" : "BROKEN");
            /* the reasons of the rejected, counted */
            for (long k = 0; k < w->n; k++) {
                if (!q[k].failed) continue;
                bool seen = false;
                for (long j = 0; j < k && !seen; j++) seen = q[j].failed && !strcmp(q[j].reason, q[k].reason);
                if (seen) continue;
                long c = 0;
                for (long j = k; j < w->n; j++) c += q[j].failed && !strcmp(q[j].reason, q[k].reason);
                printf("#   %ld rejected: %s\n", c, q[k].reason);
            }
            fflush(stdout);
            free_rate(q, tl, w);
            if (!ok) {
                printf("# the SLO broke at %g requests/s\n", rates[i]);
                break;
            }
        } else {
            free_rate(q, tl, w);
            goto fail;
        }
    }
    if (g_interrupted) {
        qi_cli_error(cmd, "interrupted");
        rc = QI_EXIT_RUNTIME;
    }
#ifdef QI_HAVE_SQLITE
    if (!no_db) fprintf(stderr, "qinfer load: results in %s (experiment %s)\n", db_path, experiment);
#endif
    goto done;
fail:
    rc = qi_cli_fail(cmd, &err);
    if (rc == QI_EXIT_USAGE) rc = QI_EXIT_RUNTIME;
    if (ch.pid > 0 && ch.own_log) {
        /* keep the log of a server that was part of the failure */
        fprintf(stderr, "qinfer load: the server's log is kept: %s\n", ch.log);
        ch.own_log = false;
    }
done:
    qi_load_child_stop(&ch);
#ifdef QI_HAVE_SQLITE
    qi_db_close(d.db);
#endif
    qi_free(body);
    qi_free(corpus_ids);
    qi_tokenizer_free(tok);
    qi_gguf_close(g);
    curl_global_cleanup();
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    return rc;
}

#endif

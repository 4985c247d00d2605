/* cmd_needle.c - `qinfer needle`: passkey retrieval (a needle in a haystack)
 * under a KV policy.
 *
 * Each trial hides "The pass key is NNNNN. Remember it. NNNNN is the pass
 * key." at a relative depth of a long filler text, asks for the key at the
 * end, generates greedily and checks that the first 5-digit number of the
 * answer is the key. The filler is a fixed set of plain sentences cycled in
 * order, so nothing in it looks like a number or competes with the needle;
 * the needle goes in at a sentence boundary. Each prompt is sized to its
 * length in the model's own tokens: a search on the number of filler
 * sentences gives the longest prompt of at most that many tokens (galloping
 * up, then bisecting), since tokens per sentence vary by tokenizer.
 *
 * Passkeys come from a splitmix64 stream seeded by (--seed, length, depth),
 * so a cell's keys do not change when other lengths or depths are
 * added; keys within a cell differ. Trials run as concurrent sequences of
 * one engine (--batch), so the prompts' prefill and the short decodes share
 * weight reads; under every policy the result of a trial does not depend on
 * what else is in the batch or on --batch (for all weight types but the
 * K-quants; see engine.h). What else was considered:
 * random filler text (as some passkey tests use) would make results depend
 * on a corpus; repeating one sentence lets a model copy by position, which
 * a cycle of several sentences makes harder without making it harder to
 * tokenise stably.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "qinfer/model_files.h"
#include "qinfer/engine.h"
#include "qinfer/model.h"
#include "threadpool.h"

#define MAX_LIST 32
#define N_GEN 8

static const char *const k_filler[] = {
    "The river runs slowly past the old mill.",
    "A grey cat sleeps on the warm stone wall.",
    "The baker opens his shop before sunrise.",
    "Rain taps softly on the kitchen window.",
    "The morning train leaves the station on time.",
    "Children walk to school along the narrow lane.",
    "The clock in the hall ticks through the night.",
    "A light wind moves across the tall grass.",
};
#define N_FILLER (sizeof k_filler / sizeof k_filler[0])

static const char k_preamble[] =
    "There is an important piece of information hidden in the long text below. Find it and remember it, "
    "because you will be asked about it at the end.";
static const char k_question[] = "What is the pass key? The pass key is";

static void help(void) {
    printf(
        "usage: qinfer needle [-m MODEL] [options]\n\n"
        "Passkey retrieval: a 5-digit key hidden at a relative depth of a filler text\n"
        "sized to each length in tokens, asked for at the end; greedy answer of up to %d\n"
        "tokens, correct when its first 5-digit number is the key.\n\n"
        "  -m, --model MODEL     GGUF path or cached short name (default smollm2-135m)\n"
        "      --lengths L,...   prompt lengths in tokens (default 1024,2048,4096; at most\n"
        "                        the model's training context)\n"
        "      --depths D,...    relative depths of the key in [0, 1] (default 0,0.25,0.5,0.75,1)\n"
        "      --trials N        trials per (length, depth), each with its own key (default 3)\n"
        "      --seed S          seed of the keys (default 1)\n"
        "  -b, --batch B         trials run as concurrent sequences (default 4)\n"
        "  -t, --threads N       worker threads (default: physical cores)\n"
        "  -o, --output FMT      md (default), csv or json, to stdout\n"
        "      --attn-blas       prompts' attention through OpenBLAS sgemm: faster, but\n"
        "                        not bit-exact with llama.cpp (needs libopenblas0)\n"
        QI_CLI_REPACK_HELP
        "  -h, --help            this help\n\n"
        "The KV policy, applied throughout (prefill and decode):\n",
        N_GEN);
    qi_cli_kv_help();
    qi_cli_place_help();
}

/* ---- flags ------------------------------------------------------------------------ */

/* "a,b,c" of integers in [lo, hi], or of numbers in [lo, hi] (is_int false). */
static bool parse_list(qi_args *a, bool is_int, double lo, double hi, double *out, int *n) {
    const char *s = qi_args_str(a);
    if (!s) return false;
    const char *p = s;
    *n = 0;
    for (;;) {
        char *end;
        double v = is_int ? (double)strtol(p, &end, 10) : strtod(p, &end);
        if (end == p || (*end && *end != ',') || !isfinite(v) || v < lo || v > hi || *n == MAX_LIST) {
            if (is_int)
                qi_cli_error(a->cmd, "option %s: '%s' is not a list of up to %d integers in %.0f..%.0f", a->flag, s,
                             MAX_LIST, lo, hi);
            else
                qi_cli_error(a->cmd, "option %s: '%s' is not a list of up to %d numbers in %g..%g", a->flag, s,
                             MAX_LIST, lo, hi);
            a->failed = true;
            return false;
        }
        out[(*n)++] = v;
        if (!*end) return true;
        p = end + 1;
    }
}

/* ---- prompts ---------------------------------------------------------------------- */

static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* The text of a trial: preamble, n_fill filler sentences with the needle
 * after the first at_fill of them, then the question. Returns a qi_malloc'ed
 * string or NULL. */
static char *build_text(int n_fill, int at_fill, int key) {
    char needle[96];
    snprintf(needle, sizeof needle, "The pass key is %d. Remember it. %d is the pass key.", key, key);
    size_t cap = sizeof k_preamble + sizeof k_question + strlen(needle) + 4;
    for (int i = 0; i < n_fill; i++) cap += strlen(k_filler[i % N_FILLER]) + 1;
    char *t = qi_malloc(cap);
    if (!t) return NULL;
    size_t w = 0;
#define PUT(str)                                  \
    do {                                          \
        const char *s_ = (str);                   \
        size_t l_ = strlen(s_);                   \
        t[w++] = ' ';                             \
        memcpy(t + w, s_, l_);                    \
        w += l_;                                  \
    } while (0)
    memcpy(t, k_preamble, sizeof k_preamble - 1);
    w = sizeof k_preamble - 1;
    for (int i = 0; i <= n_fill; i++) {
        if (i == at_fill) PUT(needle);
        if (i < n_fill) PUT(k_filler[i % N_FILLER]);
    }
    PUT(k_question);
#undef PUT
    t[w] = '\0';
    return t;
}

static int fill_at(double depth, int n_fill) { return (int)floor(depth * n_fill + 0.5); }

static qi_status count_tokens(const qi_model *m, int n_fill, double depth, int key, size_t *n, qi_err *err) {
    char *t = build_text(n_fill, fill_at(depth, n_fill), key);
    if (!t) return QI_ERR(err, QI_ERR_NOMEM, "out of memory building a prompt");
    int32_t *ids = NULL;
    qi_status st = qi_tokenize(m->tok, t, strlen(t), true, false, &ids, n, err);
    qi_free(ids);
    qi_free(t);
    return st;
}

/* The prompt of at most `length` tokens with the most filler sentences. */
static qi_status build_prompt(const qi_model *m, int length, double depth, int key, int32_t **ids, size_t *n_ids,
                              qi_err *err) {
    *ids = NULL;
    *n_ids = 0;
    size_t n;
    qi_status st = count_tokens(m, 0, depth, key, &n, err);
    if (st) return st;
    if (n > (size_t)length)
        return QI_ERR(err, QI_ERR_INVALID, "length %d cannot hold the needle and the question (%zu tokens without filler)",
                      length, n);
    int lo = 0, hi = 1; /* lo fits, hi is the first known not to */
    for (;;) {
        if ((st = count_tokens(m, hi, depth, key, &n, err))) return st;
        if (n > (size_t)length) break;
        lo = hi;
        hi *= 2;
    }
    while (hi - lo > 1) {
        const int mid = lo + (hi - lo) / 2;
        if ((st = count_tokens(m, mid, depth, key, &n, err))) return st;
        if (n <= (size_t)length) lo = mid;
        else hi = mid;
    }
    char *t = build_text(lo, fill_at(depth, lo), key);
    if (!t) return QI_ERR(err, QI_ERR_NOMEM, "out of memory building a prompt");
    st = qi_tokenize(m->tok, t, strlen(t), true, false, ids, n_ids, err);
    qi_free(t);
    return st;
}

/* The value of the first run of exactly five digits in s, or -1. */
static int first_key(const char *s) {
    const char *p = s;
    while (*p) {
        if (*p < '0' || *p > '9') {
            p++;
            continue;
        }
        const char *q = p;
        while (*q >= '0' && *q <= '9') q++;
        if (q - p == 5) return atoi(p);
        p = q;
    }
    return -1;
}

/* ---- the run ---------------------------------------------------------------------- */

typedef struct {
    int length, depth_i, key;
    int n_prompt, n_gen;
    bool ok;
    char answer[N_GEN * 32];
    size_t answer_len;
    qi_detok dt;
} trial;

typedef qi_out_format out_format;
#define OUT_MD QI_OUT_HUMAN
#define OUT_CSV QI_OUT_CSV
#define OUT_JSON QI_OUT_JSON

typedef struct {
    const char *model, *policy;
    const double *lengths, *depths;
    int n_len, n_dep, n_trials, batch;
    uint64_t seed;
    const trial *tr; /* [n_len][n_dep][n_trials] */
    double seconds;
} report;

static const trial *cell(const report *r, int li, int di) {
    return &r->tr[((size_t)li * r->n_dep + di) * r->n_trials];
}

static int cell_ok(const report *r, int li, int di) {
    int k = 0;
    for (int t = 0; t < r->n_trials; t++) k += cell(r, li, di)[t].ok;
    return k;
}

static void tokens_range(const report *r, int li, int di, int *lo, int *hi) {
    *lo = 1 << 30;
    *hi = 0;
    for (int d = di < 0 ? 0 : di; d < (di < 0 ? r->n_dep : di + 1); d++)
        for (int t = 0; t < r->n_trials; t++) {
            const int n = cell(r, li, d)[t].n_prompt;
            if (n < *lo) *lo = n;
            if (n > *hi) *hi = n;
        }
}

static void print_md(const report *r) {
    printf("| length | prompt tokens |");
    for (int d = 0; d < r->n_dep; d++) printf(" depth %g |", r->depths[d]);
    printf(" all |\n|-------:|--------------:|");
    for (int d = 0; d < r->n_dep; d++) printf("---------:|");
    printf("----:|\n");
    int total_ok = 0;
    for (int l = 0; l < r->n_len; l++) {
        int lo, hi, row_ok = 0;
        tokens_range(r, l, -1, &lo, &hi);
        printf("| %.0f | %d-%d |", r->lengths[l], lo, hi);
        for (int d = 0; d < r->n_dep; d++) {
            const int k = cell_ok(r, l, d);
            row_ok += k;
            printf(" %.1f%% (%d/%d) |", 100.0 * k / r->n_trials, k, r->n_trials);
        }
        const int n = r->n_dep * r->n_trials;
        printf(" %.1f%% (%d/%d) |\n", 100.0 * row_ok / n, row_ok, n);
        total_ok += row_ok;
    }
    printf("| all | |");
    for (int d = 0; d < r->n_dep; d++) {
        int k = 0;
        for (int l = 0; l < r->n_len; l++) k += cell_ok(r, l, d);
        const int n = r->n_len * r->n_trials;
        printf(" %.1f%% (%d/%d) |", 100.0 * k / n, k, n);
    }
    const int n = r->n_len * r->n_dep * r->n_trials;
    printf(" %.1f%% (%d/%d) |\n\n", 100.0 * total_ok / n, total_ok, n);
    printf("overall: %.1f%% (%d/%d) in %.1f s\n", 100.0 * total_ok / n, total_ok, n, r->seconds);
}

static void print_csv(const report *r) {
    printf("model,policy,length,depth,trials,correct,accuracy,min_prompt_tokens,max_prompt_tokens\n");
    for (int l = 0; l <= r->n_len; l++)
        for (int d = 0; d <= r->n_dep; d++) {
            int k = 0, n = 0, lo = 1 << 30, hi = 0;
            for (int ll = (l < r->n_len ? l : 0); ll < (l < r->n_len ? l + 1 : r->n_len); ll++)
                for (int dd = (d < r->n_dep ? d : 0); dd < (d < r->n_dep ? d + 1 : r->n_dep); dd++) {
                    int a, b;
                    tokens_range(r, ll, dd, &a, &b);
                    k += cell_ok(r, ll, dd);
                    n += r->n_trials;
                    lo = a < lo ? a : lo;
                    hi = b > hi ? b : hi;
                }
            qi_cli_print_quoted(r->model, false);
            putchar(',');
            qi_cli_print_quoted(r->policy, false);
            if (l < r->n_len) printf(",%.0f", r->lengths[l]);
            else printf(",all");
            if (d < r->n_dep) printf(",%g", r->depths[d]);
            else printf(",all");
            printf(",%d,%d,%.6f,%d,%d\n", n, k, (double)k / n, lo, hi);
        }
}

static void print_json(const report *r) {
    printf("{\n  \"model\": ");
    qi_cli_print_quoted(r->model, true);
    printf(",\n  \"policy\": ");
    qi_cli_print_quoted(r->policy, true);
    printf(",\n  \"seed\": %llu,\n  \"trials_per_cell\": %d,\n  \"batch\": %d,\n  \"seconds\": %.3f,\n  \"cells\": [\n",
           (unsigned long long)r->seed, r->n_trials, r->batch, r->seconds);
    for (int l = 0; l < r->n_len; l++)
        for (int d = 0; d < r->n_dep; d++) {
            const int k = cell_ok(r, l, d);
            printf("    {\"length\": %.0f, \"depth\": %g, \"trials\": %d, \"correct\": %d, \"accuracy\": %.6f, "
                   "\"results\": [",
                   r->lengths[l], r->depths[d], r->n_trials, k, (double)k / r->n_trials);
            for (int t = 0; t < r->n_trials; t++) {
                const trial *x = &cell(r, l, d)[t];
                printf("%s{\"key\": %d, \"ok\": %s, \"prompt_tokens\": %d, \"answer\": ", t ? ", " : "", x->key,
                       x->ok ? "true" : "false", x->n_prompt);
                qi_cli_print_quoted(x->answer, true);
                printf("}");
            }
            printf("]}%s\n", l + 1 < r->n_len || d + 1 < r->n_dep ? "," : "");
        }
    printf("  ],\n  \"lengths\": [\n");
    int all_ok = 0;
    for (int l = 0; l < r->n_len; l++) {
        int k = 0;
        for (int d = 0; d < r->n_dep; d++) k += cell_ok(r, l, d);
        const int n = r->n_dep * r->n_trials;
        all_ok += k;
        printf("    {\"length\": %.0f, \"trials\": %d, \"correct\": %d, \"accuracy\": %.6f}%s\n", r->lengths[l], n,
               k, (double)k / n, l + 1 < r->n_len ? "," : "");
    }
    const int n = r->n_len * r->n_dep * r->n_trials;
    printf("  ],\n  \"overall\": {\"trials\": %d, \"correct\": %d, \"accuracy\": %.6f}\n}\n", n, all_ok,
           (double)all_ok / n);
}

/* Record a finished trial's verdict. */
static void finish(trial *x, char *piece, size_t cap) {
    size_t nb = qi_detok_flush(&x->dt, piece, cap);
    size_t room = sizeof x->answer - 1 - x->answer_len;
    nb = nb < room ? nb : room;
    memcpy(x->answer + x->answer_len, piece, nb);
    x->answer_len += nb;
    x->answer[x->answer_len] = '\0';
    x->ok = first_key(x->answer) == x->key;
}

int qi_cmd_needle(int argc, char **argv) {
    const char *cmd = "needle", *model_arg = "smollm2-135m", *out_arg = "md";
    double lengths[MAX_LIST] = {1024, 2048, 4096}, depths[MAX_LIST] = {0, 0.25, 0.5, 0.75, 1};
    int n_len = 3, n_dep = 5, n_trials = 3, batch = 4, n_threads = qi_n_physical_cores();
    uint64_t seed = 1;
    bool attn_blas = false, repack = false;
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
        else if (qi_args_is(&a, NULL, "--lengths")) parse_list(&a, true, 16, 1 << 20, lengths, &n_len);
        else if (qi_args_is(&a, NULL, "--depths")) parse_list(&a, false, 0, 1, depths, &n_dep);
        else if (qi_args_is(&a, NULL, "--trials")) qi_args_int(&a, 1, 1000, &n_trials);
        else if (qi_args_is(&a, NULL, "--seed")) qi_args_u64(&a, &seed);
        else if (qi_args_is(&a, "-b", "--batch")) qi_args_int(&a, 1, 256, &batch);
        else if (qi_args_is(&a, "-t", "--threads")) qi_args_int(&a, 1, 1024, &n_threads);
        else if (qi_args_is(&a, "-o", "--output")) out_arg = qi_args_str(&a);
        else if (qi_args_is(&a, NULL, "--attn-blas")) attn_blas = true;
        else if (qi_args_is(&a, NULL, "--repack")) repack = true;
        else qi_args_unknown(&a);
    }
    if (a.failed) return QI_EXIT_USAGE;
    out_format fmt;
    if (!qi_cli_output_format(cmd, out_arg, "md", &fmt)) return QI_EXIT_USAGE;

    qi_err err = {0};
    char mpath[1024];
    qi_model *m = NULL;
    qi_engine *e = NULL;
    trial *tr = NULL;
    int *slot_trial = NULL, *slot_seq = NULL;
    char *piece = NULL;
    int32_t *ids = NULL;
    int rc = 0;
    if (qi_cache_resolve(model_arg, "model", mpath, sizeof mpath, &err) || qi_cli_load_model(mpath, repack, &m, &err) ||
        qi_cli_kv_check(&kv, m->hp.n_layer, &err))
        goto fail;
    int max_len = 0;
    for (int l = 0; l < n_len; l++) {
        if (lengths[l] > m->hp.n_ctx_train) {
            QI_ERR(&err, QI_ERR_INVALID, "length %.0f exceeds the model's training context of %d tokens", lengths[l],
                   m->hp.n_ctx_train);
            goto fail;
        }
        if (lengths[l] > max_len) max_len = (int)lengths[l];
    }
    /* the shortest length must hold the preamble, the needle and the question (checked here so a
     * run does not stop half-way; every key has five digits, so 10000 stands for them all) */
    int min_len = max_len;
    for (int l = 0; l < n_len; l++) min_len = lengths[l] < min_len ? (int)lengths[l] : min_len;
    size_t n_base;
    if (count_tokens(m, 0, 0.0, 10000, &n_base, &err)) goto fail;
    if (n_base > (size_t)min_len) {
        QI_ERR(&err, QI_ERR_INVALID, "length %d cannot hold the needle and the question (%zu tokens without filler)",
               min_len, n_base);
        goto fail;
    }
    const int total = n_len * n_dep * n_trials;
    tr = qi_calloc((size_t)total, sizeof *tr);
    slot_trial = qi_malloc(sizeof(int) * (size_t)batch);
    slot_seq = qi_malloc(sizeof(int) * (size_t)batch);
    const size_t piece_cap = qi_tokenizer_max_piece(m->tok) + QI_DETOK_MAX_PENDING;
    piece = qi_malloc(piece_cap);
    if (!tr || !slot_trial || !slot_seq || !piece) {
        QI_ERR(&err, QI_ERR_NOMEM, "out of memory for %d trials", total);
        goto fail;
    }
    for (int l = 0; l < n_len; l++)
        for (int d = 0; d < n_dep; d++) {
            uint64_t h = (uint64_t)lengths[l] * 1000003u + (uint64_t)llround(depths[d] * 1e6),
                     s = seed ^ splitmix64(&h);
            trial *c = &tr[((size_t)l * n_dep + d) * n_trials];
            for (int t = 0; t < n_trials; t++) {
                c[t] = (trial){.length = (int)lengths[l], .depth_i = d};
                for (bool dup = true; dup;) {
                    c[t].key = 10000 + (int)(splitmix64(&s) % 90000);
                    dup = false;
                    for (int u = 0; u < t; u++) dup |= c[u].key == c[t].key;
                }
                qi_detok_init(&c[t].dt);
            }
        }
    qi_engine_opts o;
    qi_engine_opts_default(&o);
    o.n_threads = n_threads;
    o.max_seqs = batch;
    o.n_ctx = max_len + N_GEN;
    o.attn_blas = attn_blas;
    o.repack = repack;
    qi_cli_kv_apply(&kv, &o);
    if (qi_engine_create(m, &o, &e, &err)) goto fail;

    char desc[256];
    qi_cli_kv_describe(&kv, desc, sizeof desc);
    if (fmt == OUT_MD) {
        printf("needle: model %s, policy %s, lengths", model_arg, desc);
        for (int l = 0; l < n_len; l++) printf("%s%.0f", l ? "," : " ", lengths[l]);
        printf(", depths");
        for (int d = 0; d < n_dep; d++) printf("%s%g", d ? "," : " ", depths[d]);
        printf(", %d trial%s per cell, batch %d, seed %llu, %d threads%s%s\n\n", n_trials, n_trials == 1 ? "" : "s",
               batch, (unsigned long long)seed, n_threads, attn_blas ? ", prompt attention through OpenBLAS" : "",
               repack ? ", packed weights" : "");
        fflush(stdout);
    }

    for (int i = 0; i < batch; i++) slot_trial[i] = -1;
    const double t0 = qi_now_s();
    double last_print = t0;
    /* ETA from tokens run, not trials done: with a batch, the first trials finish only after
     * several prompts' prefill, so a per-trial rate would overestimate for a long while */
    long work_total = 0, work_done = 0;
    for (int i = 0; i < total; i++) work_total += tr[i].length + N_GEN;
    int next = 0, done = 0;
    while (done < total) {
        for (int i = 0; i < batch && next < total; i++) {
            if (slot_trial[i] >= 0) continue;
            trial *x = &tr[next];
            size_t n_ids;
            if (build_prompt(m, x->length, depths[x->depth_i], x->key, &ids, &n_ids, &err)) goto fail;
            x->n_prompt = (int)n_ids;
            work_total += x->n_prompt - x->length;
            if (qi_engine_seq_add(e, &slot_seq[i], &err) ||
                qi_engine_seq_feed(e, slot_seq[i], ids, (int)n_ids, false, &err))
                goto fail;
            qi_free(ids);
            ids = NULL;
            slot_trial[i] = next++;
        }
        int n_run;
        if (qi_engine_step(e, &n_run, &err)) goto fail;
        work_done += n_run;
        if (n_run == 0) { /* every live sequence has something pending, so this is an engine bug */
            QI_ERR(&err, QI_ERR_BACKEND, "the engine ran nothing with %d trials unfinished", total - done);
            goto fail;
        }
        for (int i = 0; i < batch; i++) {
            if (slot_trial[i] < 0) continue;
            const int id = slot_seq[i];
            if (qi_engine_seq_pending(e, id) > 0 || qi_engine_seq_n_logits(e, id) == 0) continue;
            trial *x = &tr[slot_trial[i]];
            const float *lg = qi_engine_seq_logits(e, id, -1);
            int32_t tok = 0;
            for (int v = 1; v < m->hp.n_vocab; v++)
                if (lg[v] > lg[tok]) tok = v;
            bool end = qi_tokenizer_is_eog(m->tok, tok);
            if (!end) {
                size_t nb = qi_detok_push(m->tok, &x->dt, tok, false, piece, piece_cap);
                size_t room = sizeof x->answer - 1 - x->answer_len;
                nb = nb < room ? nb : room;
                memcpy(x->answer + x->answer_len, piece, nb);
                x->answer_len += nb;
                end = ++x->n_gen == N_GEN;
            }
            if (!end) {
                if (qi_engine_seq_feed(e, id, &tok, 1, false, &err)) goto fail;
                continue;
            }
            finish(x, piece, piece_cap);
            if (qi_engine_seq_remove(e, id, &err)) goto fail;
            slot_trial[i] = -1;
            done++;
        }
        const double now = qi_now_s();
        if (now - last_print >= 2.0 || done == total) {
            const double el = now - t0, left = work_total > work_done ? (double)(work_total - work_done) : 0.0;
            fprintf(stderr, "[%d/%d] trials, %.1f s, ETA %.0f s\n", done, total, el,
                    done == total ? 0.0 : el / (work_done > 0 ? work_done : 1) * left);
            last_print = now;
        }
    }
    report r = {.model = model_arg, .policy = desc, .lengths = lengths, .depths = depths, .n_len = n_len,
                .n_dep = n_dep, .n_trials = n_trials, .batch = batch, .seed = seed, .tr = tr,
                .seconds = qi_now_s() - t0};
    if (fmt == OUT_MD) print_md(&r);
    else if (fmt == OUT_CSV) print_csv(&r);
    else print_json(&r);
    goto done;
fail:
    rc = qi_cli_fail(cmd, &err);
done:
    qi_free(ids);
    qi_free(piece);
    qi_free(slot_seq);
    qi_free(slot_trial);
    qi_free(tr);
    qi_engine_free(e);
    qi_model_free(m);
    return rc;
}

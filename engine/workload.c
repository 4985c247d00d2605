/* workload.c - serving workloads (workload.h): offline batches, Poisson
 * arrivals, replayed traces, lengths from distributions, prompts placed in
 * the evaluation corpus; every draw from one seeded generator.
 *
 * Why xoshiro256** and not rand(): the same seed must give the same
 * workload on every machine and C library, and a sweep over seeds must give
 * independent streams; splitmix64 spreads a small seed over the state, as
 * the generator's authors advise. Poisson arrivals are exponential gaps,
 * -ln(1 - u) / rate, u uniform in [0, 1), so a gap is never infinite. The
 * normal draws of the lognormal use Box-Muller (two uniforms per draw, the
 * second value thrown away, so each draw costs the same two numbers and a
 * workload does not depend on how draws pair up).
 *
 * The order of draws is part of the definition (tests pin it): all arrival
 * gaps first, then per request its prompt length, its output length and
 * its place in the corpus.
 */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qinfer/workload.h"

/* ---- the generator --------------------------------------------------------------- */

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

void qi_rng_seed(qi_rng *r, uint64_t seed) {
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&seed);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t qi_rng_next(qi_rng *r) {
    uint64_t *s = r->s;
    const uint64_t out = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return out;
}

double qi_rng_uniform(qi_rng *r) { return (double)(qi_rng_next(r) >> 11) * 0x1.0p-53; }

/* ---- lengths ---------------------------------------------------------------------- */

static int clamp_len(double v) {
    if (!(v >= 1)) return 1;
    if (v > QI_WORKLOAD_MAX_LEN) return QI_WORKLOAD_MAX_LEN;
    return (int)v;
}

int qi_len_draw(const qi_len_dist *d, qi_rng *r) {
    switch (d->kind) {
    case QI_LEN_FIXED: return clamp_len(d->a);
    case QI_LEN_UNIFORM: {
        uint64_t span = (uint64_t)(d->b - d->a) + 1;
        return clamp_len(d->a + (double)(qi_rng_next(r) % span));
    }
    case QI_LEN_EXP: return clamp_len(ceil(-log1p(-qi_rng_uniform(r)) * d->a));
    case QI_LEN_LOGNORMAL: {
        double u1 = qi_rng_uniform(r), u2 = qi_rng_uniform(r);
        double z = sqrt(-2.0 * log1p(-u1)) * cos(6.283185307179586 * u2);
        return clamp_len(round(exp(log(d->a) + d->b * z)));
    }
    }
    return 1;
}

/* A number of spec at *p (advanced past it); false if there is none. */
static bool parse_num(const char **p, double *v) {
    char *end;
    errno = 0;
    *v = strtod(*p, &end);
    if (end == *p || errno || !isfinite(*v)) return false;
    *p = end;
    return true;
}

qi_status qi_len_dist_parse(const char *spec, qi_len_dist *out, qi_err *err) {
    memset(out, 0, sizeof *out);
    if (!spec) return QI_ERR(err, QI_ERR_INVALID, "length distribution: none given");
    const char *colon = strchr(spec, ':'), *p = colon ? colon + 1 : spec;
    size_t kl = colon ? (size_t)(colon - spec) : 0;
    double a = 0, b = 0;
    bool ok = parse_num(&p, &a);
    if (!colon || (kl == 5 && !strncmp(spec, "fixed", 5))) {
        out->kind = QI_LEN_FIXED;
        ok = ok && *p == 0 && a >= 1 && a <= QI_WORKLOAD_MAX_LEN && a == floor(a);
    } else if (kl == 7 && !strncmp(spec, "uniform", 7)) {
        out->kind = QI_LEN_UNIFORM;
        ok = ok && *p++ == '-' && parse_num(&p, &b) && *p == 0 && a >= 1 && b >= a && b <= QI_WORKLOAD_MAX_LEN &&
             a == floor(a) && b == floor(b);
    } else if (kl == 3 && !strncmp(spec, "exp", 3)) {
        out->kind = QI_LEN_EXP;
        ok = ok && *p == 0 && a >= 1 && a <= QI_WORKLOAD_MAX_LEN;
    } else if (kl == 9 && !strncmp(spec, "lognormal", 9)) {
        out->kind = QI_LEN_LOGNORMAL;
        ok = ok && *p++ == ',' && parse_num(&p, &b) && *p == 0 && a >= 1 && a <= QI_WORKLOAD_MAX_LEN && b >= 0 &&
             b <= 4;
    } else {
        return QI_ERR(err, QI_ERR_INVALID,
                      "length distribution '%s': unknown kind (N, fixed:N, uniform:A-B, exp:MEAN, "
                      "lognormal:MEDIAN,SIGMA)",
                      spec);
    }
    if (!ok)
        return QI_ERR(err, QI_ERR_INVALID,
                      "length distribution '%s': expected N, fixed:N, uniform:A-B (integers, 1 <= A <= B), exp:MEAN "
                      "or lognormal:MEDIAN,SIGMA (MEDIAN >= 1, SIGMA in 0..4), lengths at most %d",
                      spec, QI_WORKLOAD_MAX_LEN);
    out->a = a;
    out->b = b;
    return QI_OK;
}

/* ---- workloads ---------------------------------------------------------------------- */

static qi_status place_prompts(qi_workload *w, long corpus_tokens, qi_rng *r, bool draw_lengths,
                               const qi_workload_opts *o, qi_err *err) {
    for (long i = 0; i < w->n; i++) {
        qi_work_request *q = &w->req[i];
        if (draw_lengths) {
            q->n_prompt = qi_len_draw(&o->prompt_len, r);
            q->n_out = qi_len_draw(&o->output_len, r);
        }
        if (corpus_tokens > 0) {
            if (q->n_prompt > corpus_tokens)
                return QI_ERR(err, QI_ERR_INVALID, "request %ld: a prompt of %d tokens is longer than the corpus (%ld)",
                              i, q->n_prompt, corpus_tokens);
            q->prompt_at = (long)(qi_rng_next(r) % (uint64_t)(corpus_tokens - q->n_prompt + 1));
        }
    }
    return QI_OK;
}

static qi_workload *workload_alloc(long n) {
    qi_workload *w = qi_calloc(1, sizeof *w);
    if (!w) return NULL;
    if (!(w->req = qi_calloc((size_t)n, sizeof *w->req))) {
        qi_free(w);
        return NULL;
    }
    w->n = n;
    return w;
}

qi_status qi_workload_generate(const qi_workload_opts *o, qi_workload **out, qi_err *err) {
    *out = NULL;
    if (o->n_requests < 1 || o->n_requests > (1L << 26))
        return QI_ERR(err, QI_ERR_INVALID, "workload: %ld requests (1..%ld)", o->n_requests, 1L << 26);
    if (!(o->rate >= 0) || !isfinite(o->rate))
        return QI_ERR(err, QI_ERR_INVALID, "workload: arrival rate %g is not a finite number >= 0", o->rate);
    if (o->corpus_tokens < 0) return QI_ERR(err, QI_ERR_INVALID, "workload: corpus of %ld tokens", o->corpus_tokens);
    qi_workload *w = workload_alloc(o->n_requests);
    if (!w) return QI_ERR(err, QI_ERR_NOMEM, "out of memory for %ld requests", o->n_requests);
    qi_rng r;
    qi_rng_seed(&r, o->seed);
    double t = 0;
    for (long i = 0; i < w->n; i++) {
        if (o->rate > 0) t += -log1p(-qi_rng_uniform(&r)) / o->rate;
        w->req[i].arrival_s = t;
    }
    qi_status st = place_prompts(w, o->corpus_tokens, &r, true, o, err);
    if (st) {
        qi_workload_free(w);
        return st;
    }
    *out = w;
    return QI_OK;
}

/* Splits line into at most 4 numeric fields; their count, or -1 when a
 * field is not a number. */
static int split_fields(char *line, double *v) {
    int n = 0;
    char *p = line;
    for (;;) {
        while (*p == ' ' || *p == '\t' || *p == ',' || *p == '\r' || *p == '\n') p++;
        if (!*p) return n;
        if (n == 4) return -1;
        char *end;
        errno = 0;
        v[n] = strtod(p, &end);
        if (end == p || errno || !isfinite(v[n]) || (*end && !strchr(" \t,\r\n", *end))) return -1;
        n++;
        p = end;
    }
}

qi_status qi_workload_trace(const char *path, long corpus_tokens, uint64_t seed, qi_workload **out, qi_err *err) {
    *out = NULL;
    FILE *f = fopen(path, "r");
    if (!f) return QI_ERR(err, QI_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    long cap = 64, n = 0, lineno = 0;
    qi_work_request *req = qi_malloc(sizeof *req * (size_t)cap);
    char line[512];
    qi_status st = QI_OK;
    bool first = true;
    double last = 0;
    if (!req) st = QI_ERR(err, QI_ERR_NOMEM, "out of memory");
    while (!st && fgets(line, sizeof line, f)) {
        lineno++;
        if (!strchr(line, '\n') && !feof(f)) {
            st = QI_ERR(err, QI_ERR_FORMAT, "%s:%ld: line longer than %zu bytes", path, lineno, sizeof line - 2);
            break;
        }
        char *hash = strchr(line, '#');
        if (hash) *hash = 0;
        double v[4];
        int k = split_fields(line, v);
        if (k == 0) continue;
        if (k < 0 && first && !hash) { /* a header line */
            first = false;
            continue;
        }
        first = false;
        if (k != 3) {
            st = QI_ERR(err, QI_ERR_FORMAT, "%s:%ld: expected ARRIVAL_S PROMPT_TOKENS OUTPUT_TOKENS", path, lineno);
            break;
        }
        if (v[0] < 0 || v[0] < last) {
            st = QI_ERR(err, QI_ERR_FORMAT, "%s:%ld: arrival %g s is negative or before the previous one (%g s)", path,
                        lineno, v[0], last);
            break;
        }
        for (int j = 1; j < 3; j++)
            if (!(v[j] >= 1 && v[j] <= QI_WORKLOAD_MAX_LEN && v[j] == floor(v[j]))) {
                st = QI_ERR(err, QI_ERR_FORMAT, "%s:%ld: %s length %g is not an integer in 1..%d", path, lineno,
                            j == 1 ? "prompt" : "output", v[j], QI_WORKLOAD_MAX_LEN);
                break;
            }
        if (st) break;
        if (n == (1L << 26)) {
            st = QI_ERR(err, QI_ERR_FORMAT, "%s:%ld: more than %ld requests", path, lineno, 1L << 26);
            break;
        }
        if (n == cap) {
            qi_work_request *p = qi_realloc(req, sizeof *req * (size_t)(cap * 2));
            if (!p) {
                st = QI_ERR(err, QI_ERR_NOMEM, "out of memory");
                break;
            }
            req = p;
            cap *= 2;
        }
        req[n++] = (qi_work_request){.arrival_s = v[0], .n_prompt = (int)v[1], .n_out = (int)v[2]};
        last = v[0];
    }
    if (!st && ferror(f)) st = QI_ERR(err, QI_ERR_IO, "%s: read error", path);
    fclose(f);
    if (!st && n == 0) st = QI_ERR(err, QI_ERR_INVALID, "%s: no requests", path);
    if (st) {
        qi_free(req);
        return st;
    }
    qi_workload *w = qi_calloc(1, sizeof *w);
    if (!w) {
        qi_free(req);
        return QI_ERR(err, QI_ERR_NOMEM, "out of memory");
    }
    w->req = req;
    w->n = n;
    qi_rng r;
    qi_rng_seed(&r, seed);
    if ((st = place_prompts(w, corpus_tokens, &r, false, NULL, err))) {
        qi_workload_free(w);
        return st;
    }
    *out = w;
    return QI_OK;
}

void qi_workload_free(qi_workload *w) {
    if (!w) return;
    qi_free(w->req);
    qi_free(w);
}

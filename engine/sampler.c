/* sampler.c - the sampling chain over a candidate list.
 *
 * Candidates are (id, logit) pairs; each stage narrows or reshapes the list.
 * Sorting is done once, lazily, when top-k/top-p/min-p first needs order
 * (a partial sort would do for top-k alone; the full sort of 50k floats costs
 * well under a millisecond and keeps one code path). The RNG is splitmix64
 * seeding xoshiro256**, so a seed means the same stream everywhere.
 */
#include "qinfer/sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int32_t id;
    float logit;
    float p;
} cand;

struct qi_sampler {
    qi_sampler_params p;
    int n_vocab;
    cand *c;
    int32_t *hist; /* ring of recent tokens */
    int n_hist, hist_pos;
    uint64_t s[4];
};

qi_sampler_params qi_sampler_defaults(void) {
    qi_sampler_params p = {.temp = 0.8f, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f,
                           .repeat_penalty = 1.0f, .repeat_last_n = 64, .seed = 42};
    return p;
}

static uint64_t splitmix(uint64_t *x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t next_u64(qi_sampler *s) {
    uint64_t *q = s->s;
    uint64_t r = rotl(q[1] * 5, 7) * 9, t = q[1] << 17;
    q[2] ^= q[0];
    q[3] ^= q[1];
    q[1] ^= q[2];
    q[0] ^= q[3];
    q[2] ^= t;
    q[3] = rotl(q[3], 45);
    return r;
}

static double next_unit(qi_sampler *s) { return (double)(next_u64(s) >> 11) * (1.0 / 9007199254740992.0); }

qi_status qi_sampler_create(const qi_sampler_params *p, int n_vocab, qi_sampler **out, qi_err *err) {
    *out = NULL;
    if (!(p->temp >= 0) || p->temp > 100) return QI_ERR(err, QI_ERR_INVALID, "temperature %g out of range 0..100", p->temp);
    if (!(p->top_p > 0) || p->top_p > 1) return QI_ERR(err, QI_ERR_INVALID, "top-p %g out of range (0, 1]", p->top_p);
    if (!(p->min_p >= 0) || p->min_p > 1) return QI_ERR(err, QI_ERR_INVALID, "min-p %g out of range [0, 1]", p->min_p);
    if (!(p->repeat_penalty > 0) || p->repeat_penalty > 100)
        return QI_ERR(err, QI_ERR_INVALID, "repeat penalty %g out of range (0, 100]", p->repeat_penalty);
    if (p->repeat_last_n < 0 || p->repeat_last_n > 1 << 20)
        return QI_ERR(err, QI_ERR_INVALID, "repeat-last-n %d out of range", p->repeat_last_n);
    if (n_vocab < 1) return QI_ERR(err, QI_ERR_INVALID, "empty vocabulary");
    qi_sampler *s = qi_calloc(1, sizeof *s);
    if (!s) return QI_ERR(err, QI_ERR_NOMEM, "out of memory");
    s->p = *p;
    s->n_vocab = n_vocab;
    s->c = qi_malloc(sizeof *s->c * (size_t)n_vocab);
    s->hist = qi_malloc(sizeof *s->hist * (size_t)(p->repeat_last_n > 0 ? p->repeat_last_n : 1));
    if (!s->c || !s->hist) {
        qi_sampler_free(s);
        return QI_ERR(err, QI_ERR_NOMEM, "out of memory");
    }
    uint64_t x = p->seed;
    for (int i = 0; i < 4; i++) s->s[i] = splitmix(&x);
    *out = s;
    return QI_OK;
}

void qi_sampler_free(qi_sampler *s) {
    if (!s) return;
    qi_free(s->c);
    qi_free(s->hist);
    qi_free(s);
}

void qi_sampler_accept(qi_sampler *s, int32_t token) {
    if (s->p.repeat_last_n <= 0) return;
    s->hist[s->hist_pos] = token;
    s->hist_pos = (s->hist_pos + 1) % s->p.repeat_last_n;
    if (s->n_hist < s->p.repeat_last_n) s->n_hist++;
}

int32_t qi_argmax(const float *x, int n) {
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

static int cmp_desc(const void *a, const void *b) {
    const cand *x = a, *y = b;
    if (x->logit > y->logit) return -1;
    if (x->logit < y->logit) return 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* Softmax over the first n candidates (sorted or not) into .p. */
static void softmax(cand *c, int n) {
    float mx = c[0].logit;
    for (int i = 1; i < n; i++)
        if (c[i].logit > mx) mx = c[i].logit;
    double sum = 0;
    for (int i = 0; i < n; i++) {
        c[i].p = expf(c[i].logit - mx);
        sum += c[i].p;
    }
    for (int i = 0; i < n; i++) c[i].p = (float)(c[i].p / sum);
}

int32_t qi_sampler_sample(qi_sampler *s, const float *logits) {
    const int V = s->n_vocab;
    cand *c = s->c;
    for (int i = 0; i < V; i++) c[i] = (cand){i, logits[i], 0};
    /* Repetition penalty on each distinct recent token (as llama.cpp: divide
     * positive logits, multiply negative ones). */
    if (s->p.repeat_penalty != 1.0f) {
        for (int i = 0; i < s->n_hist; i++) {
            int32_t t = s->hist[i];
            if (t < 0 || t >= V) continue;
            int seen = 0;
            for (int j = 0; j < i; j++) seen |= s->hist[j] == t;
            if (seen) continue;
            c[t].logit = c[t].logit > 0 ? c[t].logit / s->p.repeat_penalty : c[t].logit * s->p.repeat_penalty;
        }
    }
    if (s->p.temp <= 0) {
        int32_t best = 0;
        for (int i = 1; i < V; i++)
            if (c[i].logit > c[best].logit) best = i;
        return best;
    }
    int n = V;
    qsort(c, (size_t)n, sizeof *c, cmp_desc);
    if (s->p.top_k > 0 && s->p.top_k < n) n = s->p.top_k;
    if (s->p.top_p < 1.0f) {
        softmax(c, n);
        double cum = 0;
        for (int i = 0; i < n; i++) {
            cum += c[i].p;
            if (cum >= s->p.top_p) {
                n = i + 1;
                break;
            }
        }
    }
    if (s->p.min_p > 0) {
        softmax(c, n);
        float thr = c[0].p * s->p.min_p;
        int keep = 1;
        while (keep < n && c[keep].p >= thr) keep++;
        n = keep;
    }
    for (int i = 0; i < n; i++) c[i].logit /= s->p.temp;
    softmax(c, n);
    double r = next_unit(s), cum = 0;
    for (int i = 0; i < n; i++) {
        cum += c[i].p;
        if (r < cum) return c[i].id;
    }
    return c[n - 1].id;
}

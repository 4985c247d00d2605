/* kv_pick.c - what one pick of a picking KV policy costs, alone.
 *
 * A picking policy (quest, sparq) chooses, per (sequence, layer, KV head)
 * and decode step, what attention reads; a fetching one (qinfer) which
 * offloaded tokens it reads besides the working ones (then --tokens is the
 * offload tier's and --budget the room the working tier leaves). `qinfer bench --profile` gives its
 * share of a step; this program times the choice itself on synthetic
 * streams of the shape a model gives (tokens held, query heads per KV
 * head, values per head), through the registry's wrapper as the engine
 * calls it, with the key rows, their columns (sparq) or their page bounds
 * (quest) laid out as the cache lays them out. With --streams N it cycles
 * over N streams, each with its own keys, as a step over N streams does,
 * so that the keys come from memory rather than from cache.
 *
 *   bench_kv_pick [--policy P] [--param K=V,...] [--tokens N] [--budget B]
 *                 [--group G] [--dim D] [--streams S] [--reps R]
 *
 * Defaults: sparq at its defaults, 544 tokens, budget 272, group 3,
 * D 64 (SmolLM2's shape at the end of a 512-token context, 50%), 1
 * stream, 20000 picks. Only an analysis aid: one thread, random keys.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kv.h"
#include "kv/kv_policy.h"
#include "qinfer/params.h"
#include "qinfer/quant.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int usage(void) {
    fprintf(stderr, "usage: bench_kv_pick [--policy P] [--param K=V,...] [--tokens N] [--budget B] [--group G] "
                    "[--dim D] [--streams S] [--reps R]\n");
    return 2;
}

static bool int_arg(const char *s, long lo, long hi, int *out) {
    char *end;
    const long v = strtol(s, &end, 10);
    if (!*s || *end || v < lo || v > hi) return false;
    *out = (int)v;
    return true;
}

/* One stream: its key rows in blocks of QI_KV_BLOCK, their columns and
 * their page bounds, as engine/kv.c keeps them. */
typedef struct {
    uint16_t *rows, *cols;
    const uint16_t **blk;
    float *bounds;
} stream;

static bool stream_make(stream *s, int n, int D, unsigned *seed) {
    const int nb = (n + QI_KV_BLOCK - 1) / QI_KV_BLOCK, np = (n + QI_KV_PAGE - 1) / QI_KV_PAGE;
    s->rows = malloc(sizeof(uint16_t) * (size_t)nb * QI_KV_BLOCK * D);
    s->cols = calloc((size_t)nb * QI_KV_BLOCK * D, sizeof(uint16_t));
    s->blk = malloc(sizeof *s->blk * (size_t)nb);
    s->bounds = malloc(sizeof(float) * 2 * (size_t)np * D);
    if (!s->rows || !s->cols || !s->blk || !s->bounds) return false;
    for (int i = 0; i < n; i++)
        for (int d = 0; d < D; d++) {
            const float x = 3.0f * (float)rand_r(seed) / (float)RAND_MAX - 1.5f;
            const uint16_t h = qi_f32_to_fp16(x);
            s->rows[(size_t)i * D + d] = h;
            s->cols[((size_t)(i / QI_KV_BLOCK) * D + d) * QI_KV_BLOCK + i % QI_KV_BLOCK] = h;
            float *mn = s->bounds + (size_t)(i / QI_KV_PAGE) * 2 * D, *mx = mn + D;
            const float y = qi_fp16_to_f32(h);
            if (i % QI_KV_PAGE == 0 || y < mn[d]) mn[d] = y;
            if (i % QI_KV_PAGE == 0 || y > mx[d]) mx[d] = y;
        }
    for (int b = 0; b < nb; b++) s->blk[b] = s->rows + (size_t)b * QI_KV_BLOCK * D;
    return true;
}

int main(int argc, char **argv) {
    const char *policy = "sparq", *param = "";
    int n = 544, budget = 272, G = 3, D = 64, S = 1, R = 20000;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage();
            return 0;
        }
        if (!v) return usage();
        bool ok = true;
        if (!strcmp(a, "--policy")) policy = v;
        else if (!strcmp(a, "--param")) param = v;
        else if (!strcmp(a, "--tokens")) ok = int_arg(v, 1, 1 << 20, &n);
        else if (!strcmp(a, "--budget")) ok = int_arg(v, 1, 1 << 20, &budget);
        else if (!strcmp(a, "--group")) ok = int_arg(v, 1, 64, &G);
        else if (!strcmp(a, "--dim")) ok = int_arg(v, 1, 1024, &D);
        else if (!strcmp(a, "--streams")) ok = int_arg(v, 1, 1 << 16, &S);
        else if (!strcmp(a, "--reps")) ok = int_arg(v, 1, 1 << 30, &R);
        else return usage();
        if (!ok) {
            fprintf(stderr, "bench_kv_pick: bad value '%s' for %s\n", v, a);
            return 2;
        }
        i++;
    }
    qi_params pa;
    qi_params_init(&pa);
    qi_err e = {0};
    qi_kv_policy *p = NULL;
    if (qi_params_parse(&pa, param, &e) || qi_kv_policy_create(policy, &pa, 30, &p, &e)) {
        fprintf(stderr, "bench_kv_pick: %s\n", e.msg);
        return 1;
    }
    const bool fetch = !qi_kv_policy_picks(p) && qi_kv_policy_fetches(p);
    if (!qi_kv_policy_picks(p) && !fetch) {
        fprintf(stderr, "bench_kv_pick: KV policy '%s' picks and fetches nothing (quest, sparq and qinfer do)\n",
                policy);
        qi_kv_policy_free(p);
        return 1;
    }
    const bool tok = fetch || qi_kv_policy_picks_tokens(p);
    stream *st = calloc((size_t)S, sizeof *st);
    float *q = malloc(sizeof(float) * (size_t)G * D);
    int *out = malloc(sizeof(int) * (size_t)n);
    unsigned seed = 1;
    if (!st || !q || !out) return 1;
    for (int s = 0; s < S; s++)
        if (!stream_make(&st[s], n, D, &seed)) {
            fprintf(stderr, "bench_kv_pick: out of memory for %d streams of %d tokens\n", S, n);
            return 1;
        }
    for (int i = 0; i < G * D; i++) q[i] = 2.0f * (float)rand_r(&seed) / (float)RAND_MAX - 1.0f;
    const int np = (n + QI_KV_PAGE - 1) / QI_KV_PAGE;
    qi_kv_pick_view v = {.layer = 3, .n_layer = 30, .group = G, .D = D, .q = q, .scale = 1.0f / sqrtf((float)D),
                         .n = n, .block = tok ? 1 : QI_KV_PAGE, .n_blocks = tok ? n : np,
                         .newest = (tok ? n : np) - 1, .budget = budget,
                         .tail = tok ? 1 : (np - 1) % QI_KV_PAGES_PER_BLOCK + 1, .k_shift = QI_KV_BLOCK_SHIFT};
    long read = 0;
    const double t0 = now();
    for (int r = 0; r < R; r++) {
        const stream *s = &st[r % S];
        v.k_blk = s->blk;
        v.k_cols = tok ? s->cols : NULL;
        v.bounds = tok ? NULL : s->bounds;
        int got = 0;
        if ((fetch ? qi_kv_policy_fetch : qi_kv_policy_pick)(p, &v, out, &got, &e)) {
            fprintf(stderr, "bench_kv_pick: %s\n", e.msg);
            return 1;
        }
        read += got;
    }
    const double dt = now() - t0;
    printf("bench_kv_pick: %s%s%s, %d tokens, budget %d, group %d, D %d, %d stream%s: %.2f us per %s (%ld %s read "
           "per %s)\n",
           policy, *param ? " " : "", param, n, budget, G, D, S, S == 1 ? "" : "s", dt / R * 1e6,
           fetch ? "fetch" : "pick", read / R, tok ? "tokens" : "pages", fetch ? "fetch" : "pick");
    for (int s = 0; s < S; s++) {
        free(st[s].rows);
        free(st[s].cols);
        free(st[s].blk);
        free(st[s].bounds);
    }
    free(st);
    free(q);
    free(out);
    qi_kv_policy_free(p);
    return 0;
}

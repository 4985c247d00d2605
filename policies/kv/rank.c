/* rank.c - position and score ranking for the KV policies.
 *
 * Position ranks ("the k newest undecided tokens", ties broken by slot)
 * first count the tokens beyond a dense guess at the threshold (the recent
 * window and the sinks are usually whole), and otherwise find the k-th
 * position by a radix select over the positions' offsets from
 * the smallest, eight bits a pass with a histogram on the stack: no memory
 * and one pass per byte of the positions' span (two for a span under 65536)
 * where a binary search over the span took one pass per bit, so window and
 * streaming need no state at all and every policy has an allocation-free
 * fallback. Score ranks select the k best of an item array (a quickselect)
 * under one total order over (score, position, slot): no two tokens tie, so
 * the kept set is the one any correct selection or sort would give, which
 * is what lets two policies be compared fate for fate. The max pool of an
 * observation window's vote (snapkv, qinfer judge=) sorts a copy by
 * position and slides over it.
 */
#include "kv/rank_int.h"

#include <stdint.h>
#include <stdlib.h>

int qi_kv_rank_begin(const qi_kv_view *v, bool with_offloaded, uint8_t *fate) {
    int m = 0;
    for (int i = 0; i < v->n; i++) {
        bool compete = v->tier[i] == QI_KV_WORKING || with_offloaded;
        fate[i] = compete ? QI_KV_UNDECIDED : QI_KV_OFFLOAD;
        m += compete;
    }
    return m;
}

/* The k-th newest (newest) or oldest position among the c undecided tokens
 * (1 <= k <= c, counting equal positions apart), whose positions lie in
 * [lo, hi]: a most-significant-digit radix select over pos - lo, 8 bits a
 * pass, each pass counting the tokens that share the digits chosen so far. */
static int64_t kth_position(const qi_kv_view *v, const uint8_t *fate, int k, bool newest, int64_t lo, int64_t hi) {
    const uint64_t span = (uint64_t)(hi - lo);
    int bits = 0;
    while (bits < 64 && (span >> bits) != 0) bits++;
    uint64_t prefix = 0, mask = 0;
    for (int shift = bits > 0 ? (bits - 1) / 8 * 8 : 0; shift >= 0; shift -= 8) {
        int hist[256] = {0};
        for (int i = 0; i < v->n; i++) {
            const uint64_t d = (uint64_t)((int64_t)v->pos[i] - lo);
            hist[(d >> shift) & 255] += fate[i] == QI_KV_UNDECIDED && (d & mask) == prefix;
        }
        int digit = 0;
        for (int j = 0; j < 256; j++) {
            const int b = newest ? 255 - j : j;
            if (hist[b] >= k) {
                digit = b;
                break;
            }
            k -= hist[b];
        }
        prefix |= (uint64_t)digit << shift;
        mask |= (uint64_t)255 << shift;
    }
    return lo + (int64_t)prefix;
}

void qi_kv_rank_mark_by_pos(const qi_kv_view *v, uint8_t *fate, int k, bool newest, uint8_t to) {
    if (k <= 0) return;
    /* A guess at the threshold: the k newest are usually the positions
     * cur_pos - k + 1 .. cur_pos (the recent window is kept every step),
     * the k oldest 0 .. k - 1 (sinks). Whatever the guess g, if exactly k
     * tokens lie at g or beyond, they are the k newest (oldest), and
     * marking from P = g gives the same set as from the k-th position. */
    const int64_t g64 = newest ? (int64_t)v->cur_pos - k + 1 : (int64_t)k - 1;
    const int32_t g = g64 < INT32_MIN ? INT32_MIN : g64 > INT32_MAX ? INT32_MAX : (int32_t)g64; /* same counts */
    /* The loops here have no branch on a token's fate (a policy's earlier
     * marks leave the undecided tokens scattered over the slots, and a
     * branch on each would be mispredicted half the time), and they are
     * simple enough for the compiler to vectorise. */
    const int32_t *pos = v->pos;
    const int n = v->n;
    int c = 0, at_g = 0;
    if (newest)
        for (int i = 0; i < n; i++) {
            const int u = fate[i] == QI_KV_UNDECIDED;
            c += u;
            at_g += u & (pos[i] >= g);
        }
    else
        for (int i = 0; i < n; i++) {
            const int u = fate[i] == QI_KV_UNDECIDED;
            c += u;
            at_g += u & (pos[i] <= g);
        }
    if (c == 0) return;
    if (k >= c) {
        qi_kv_rank_finish(v, fate, to);
        return;
    }
    /* The threshold position P: newest, the largest with k tokens at P or
     * newer; oldest, the smallest with k tokens at P or older (or the
     * guess, when it holds exactly k). */
    int32_t P = g;
    if (at_g != k) {
        int32_t lo = INT32_MAX, hi = INT32_MIN;
        for (int i = 0; i < n; i++) {
            const int u = fate[i] == QI_KV_UNDECIDED;
            lo = u && pos[i] < lo ? pos[i] : lo;
            hi = u && pos[i] > hi ? pos[i] : hi;
        }
        P = (int32_t)kth_position(v, fate, k, newest, lo, hi);
    }
    /* Everything strictly beyond P, then ties at P by slot: the larger slot
     * counts as newer. */
    int left = k;
    if (newest)
        for (int i = 0; i < n; i++) {
            const int take = fate[i] == QI_KV_UNDECIDED && pos[i] > P;
            fate[i] = take ? to : fate[i];
            left -= take;
        }
    else
        for (int i = 0; i < n; i++) {
            const int take = fate[i] == QI_KV_UNDECIDED && pos[i] < P;
            fate[i] = take ? to : fate[i];
            left -= take;
        }
    if (newest) {
        for (int i = n - 1; i >= 0 && left > 0; i--)
            if (fate[i] == QI_KV_UNDECIDED && pos[i] == P) {
                fate[i] = to;
                left--;
            }
    } else {
        for (int i = 0; i < n && left > 0; i++)
            if (fate[i] == QI_KV_UNDECIDED && pos[i] == P) {
                fate[i] = to;
                left--;
            }
    }
}

void qi_kv_rank_finish(const qi_kv_view *v, uint8_t *fate, uint8_t to) {
    for (int i = 0; i < v->n; i++) fate[i] = fate[i] == QI_KV_UNDECIDED ? to : fate[i];
}

qi_status qi_kv_scratch_init(qi_kv_scratch *s, int cap, qi_err *err) {
    s->items = qi_malloc((size_t)cap * sizeof *s->items);
    s->cap = s->items ? cap : 0;
    return s->items ? QI_OK : QI_ERR(err, QI_ERR_NOMEM, "kv policy: out of memory for %d scratch items", cap);
}

bool qi_kv_scratch_reserve(qi_kv_scratch *s, int n) {
    if (n <= s->cap) return true;
    int cap = s->cap > 0 ? s->cap : QI_KV_SCRATCH_INIT;
    while (cap < n) cap = cap > (1 << 29) ? n : cap * 2;
    qi_kv_item *it = qi_realloc(s->items, (size_t)cap * sizeof *it);
    if (!it) return false;
    s->items = it;
    s->cap = cap;
    return true;
}

void qi_kv_scratch_fini(qi_kv_scratch *s) {
    qi_free(s->items);
    s->items = NULL;
    s->cap = 0;
}

int qi_kv_rank_gather(const qi_kv_view *v, const uint8_t *fate, qi_kv_item *items) {
    int m = 0;
    for (int i = 0; i < v->n; i++)
        if (fate[i] == QI_KV_UNDECIDED) items[m++] = (qi_kv_item){v->score[i], v->pos[i], i};
    return m;
}

/* Newer first: position, then slot. */
static int newer_first(const qi_kv_item *a, const qi_kv_item *b) {
    if (a->pos != b->pos) return a->pos > b->pos ? -1 : 1;
    return a->slot > b->slot ? -1 : a->slot < b->slot;
}

static int cmp_score(const qi_kv_item *a, const qi_kv_item *b) {
    if (a->score > b->score) return -1;
    if (a->score < b->score) return 1;
    bool na = a->score != a->score, nb = b->score != b->score;
    if (na != nb) return na ? 1 : -1;
    return newer_first(a, b);
}

static void swap_items(qi_kv_item *a, qi_kv_item *b) {
    const qi_kv_item t = *a;
    *a = *b;
    *b = t;
}

void qi_kv_rank_top_by_score(qi_kv_item *it, int n, int k) {
    if (k <= 0 || k >= n) return;
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        /* median of three as the pivot; Hoare partition around it */
        const int mid = lo + (hi - lo) / 2;
        if (cmp_score(&it[mid], &it[lo]) < 0) swap_items(&it[mid], &it[lo]);
        if (cmp_score(&it[hi], &it[lo]) < 0) swap_items(&it[hi], &it[lo]);
        if (cmp_score(&it[hi], &it[mid]) < 0) swap_items(&it[hi], &it[mid]);
        const qi_kv_item pv = it[mid];
        int i = lo, j = hi;
        while (i <= j) {
            while (cmp_score(&it[i], &pv) < 0) i++;
            while (cmp_score(&pv, &it[j]) < 0) j--;
            if (i <= j) swap_items(&it[i++], &it[j--]);
        }
        /* it[lo..j] rank at or before the pivot, it[i..hi] at or after */
        if (k - 1 <= j) hi = j;
        else if (k - 1 >= i) lo = i;
        else break;
    }
}

void qi_kv_rank_recent_top(const qi_kv_view *v, uint8_t *fate, qi_kv_scratch *s, int recent, int heavy,
                           float (*key)(float), uint8_t evict) {
    int m = 0;
    for (int i = 0; i < v->n; i++) m += fate[i] == QI_KV_UNDECIDED;
    if (m <= recent + heavy || (heavy > 0 && !qi_kv_scratch_reserve(s, m))) {
        qi_kv_rank_mark_by_pos(v, fate, recent + heavy, true, QI_KV_KEEP);
        qi_kv_rank_finish(v, fate, evict);
        return;
    }
    qi_kv_rank_mark_by_pos(v, fate, recent, true, QI_KV_KEEP);
    if (heavy > 0) {
        qi_kv_item *it = s->items;
        const int r = qi_kv_rank_gather(v, fate, it);
        if (key)
            for (int i = 0; i < r; i++) it[i].score = key(it[i].score);
        qi_kv_rank_top_by_score(it, r, heavy);
        for (int k = 0; k < heavy && k < r; k++) fate[it[k].slot] = QI_KV_KEEP;
    }
    qi_kv_rank_finish(v, fate, evict);
}

void qi_kv_rank_ada_budgets(const qi_kv_view *v, int n, int budget, int window, double ada, float (*rank)(float),
                            const uint8_t *const *cand, qi_kv_item *items, int *out) {
    if (window < 0) window = 0;
    if (window > budget) window = budget;
    const int S = budget - window;
    int f = S > 0 ? qi_kv_heavy_count(S, 1.0 - ada) : 0;
    if (S > 0 && f < 1) f = 1;
    /* Each head's candidates, its f_h best moved to the front of its run
     * and the rest packed after the previous heads' rest: the pool. A slot
     * is numbered across the heads (base + slot), which orders equal scores
     * and positions by head and tells whose a pooled token is. */
    long R = (long)n * budget;
    int pooled = 0, base = 0;
    for (int h = 0; h < n; h++) {
        qi_kv_item *run = items + pooled;
        int c = 0;
        for (int i = 0; i < v[h].n; i++)
            if (!cand || cand[h][i] == QI_KV_UNDECIDED)
                run[c++] = (qi_kv_item){rank ? rank(v[h].score[i]) : v[h].score[i], v[h].pos[i], base + i};
        const int wh = window < v[h].n ? window : v[h].n, fh = f < c ? f : c;
        qi_kv_rank_top_by_score(run, c, fh);
        out[h] = wh + fh;
        R -= wh + fh;
        for (int i = fh; i < c; i++) items[pooled++] = run[i];
        base += v[h].n;
    }
    if (R <= 0 || pooled == 0) return;
    const int won = R < pooled ? (int)R : pooled;
    qi_kv_rank_top_by_score(items, pooled, won);
    for (int k = 0; k < won; k++) {
        int h = 0, b = 0;
        while (items[k].slot >= b + v[h].n) b += v[h++].n;
        out[h]++;
    }
}

qi_status qi_kv_scored_new(const qi_kv_policy_i *pi, size_t size, qi_kv_policy **out, qi_err *err) {
    *out = NULL;
    qi_kv_scored *p = qi_calloc(1, size);
    if (!p) return QI_ERR(err, QI_ERR_NOMEM, "%s: out of memory", pi->name);
    p->base.iface = pi;
    qi_status st = qi_kv_scratch_init(&p->scratch, QI_KV_SCRATCH_INIT, err);
    if (st) {
        qi_free(p);
        return st;
    }
    *out = &p->base;
    return QI_OK;
}

void qi_kv_scored_free(qi_kv_policy *pp) {
    qi_kv_scored *p = (qi_kv_scored *)pp;
    if (!p) return;
    qi_kv_scratch_fini(&p->scratch);
    qi_free(p);
}

qi_status qi_kv_params_pool(const qi_params *params, const char *who, long *pool, qi_err *err) {
    qi_status st = qi_params_int(params, who, "pool", 7, 1, 1023, pool, err);
    if (!st && *pool % 2 == 0)
        st = QI_ERR(err, QI_ERR_INVALID, "%s: parameter 'pool' must be odd (a window centred on the token), got %ld",
                    who, *pool);
    return st;
}

static int by_position(const void *a, const void *b) {
    const qi_kv_item *x = a, *y = b;
    if (x->pos != y->pos) return x->pos < y->pos ? -1 : 1;
    return (x->slot > y->slot) - (x->slot < y->slot);
}

void qi_kv_rank_pool_max(const qi_kv_view *v, const float *obs, int kernel, qi_kv_item *items, float *out) {
    const int n = v->n, half = kernel / 2;
    for (int i = 0; i < n; i++) items[i] = (qi_kv_item){obs[i], v->pos[i], i};
    qsort(items, (size_t)n, sizeof *items, by_position);
    for (int j = 0; j < n; j++) {
        float mx = items[j].score;
        const int lo = j - half < 0 ? 0 : j - half, hi = j + half >= n ? n - 1 : j + half;
        for (int k = lo; k <= hi; k++)
            if (items[k].score > mx) mx = items[k].score;
        out[items[j].slot] = mx;
    }
}

float qi_kv_bound_score(const float *q, int group, int D, const float *bound) {
    const float *mn = bound, *mx = bound + D;
    float total = 0.0f;
    for (int h = 0; h < group; h++) {
        const float *qh = q + (size_t)h * D;
        float u = 0.0f;
        for (int d = 0; d < D; d++) {
            const float a = qh[d] * mn[d], b = qh[d] * mx[d];
            u += a > b ? a : b;
        }
        total += u;
    }
    return total;
}

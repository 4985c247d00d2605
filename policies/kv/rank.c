/* rank.c - position and score ranking for the KV policies.
 *
 * Position ranks ("the k newest undecided tokens") are a binary search for
 * the k-th key over (position, slot) keys, counting in one pass per probe:
 * no memory and about 50 passes at most, so window and streaming need no
 * state at all and every policy has an allocation-free fallback. Score
 * ranks need an order over (score, position, slot) and are a qsort of an
 * item array; a partial selection (nth_element) would be O(n) but the
 * full sort keeps one simple, total order whose result does not depend on
 * the sorting algorithm, which is what lets two policies be compared fate
 * for fate. Keys include the slot so that no two tokens tie and every
 * decision is deterministic.
 */
#include "kv/rank_int.h"

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

/* Order-preserving: flipping the sign bit maps int32 order onto uint32. */
static uint64_t pos_key(const qi_kv_view *v, int i) {
    return (uint64_t)((uint32_t)v->pos[i] ^ 0x80000000u) << 32 | (uint32_t)i;
}

static int count_beyond(const qi_kv_view *v, const uint8_t *fate, uint64_t t, bool newest) {
    int c = 0;
    for (int i = 0; i < v->n; i++) {
        if (fate[i] != QI_KV_UNDECIDED) continue;
        uint64_t k = pos_key(v, i);
        c += newest ? k >= t : k <= t;
    }
    return c;
}

void qi_kv_rank_mark_by_pos(const qi_kv_view *v, uint8_t *fate, int k, bool newest, uint8_t to) {
    if (k <= 0) return;
    int c = 0;
    uint64_t lo = UINT64_MAX, hi = 0;
    for (int i = 0; i < v->n; i++) {
        if (fate[i] != QI_KV_UNDECIDED) continue;
        uint64_t key = pos_key(v, i);
        if (key < lo) lo = key;
        if (key > hi) hi = key;
        c++;
    }
    if (c == 0) return;
    if (k < c) {
        /* newest: the largest t with k keys >= t is the k-th largest key;
         * oldest: the smallest t with k keys <= t is the k-th smallest. */
        while (lo < hi) {
            uint64_t d = hi - lo;
            if (newest) {
                uint64_t mid = lo + d / 2 + (d & 1);
                if (count_beyond(v, fate, mid, true) >= k) lo = mid;
                else hi = mid - 1;
            } else {
                uint64_t mid = lo + d / 2;
                if (count_beyond(v, fate, mid, false) >= k) hi = mid;
                else lo = mid + 1;
            }
        }
    } else {
        lo = newest ? lo : hi; /* everything */
    }
    for (int i = 0; i < v->n; i++) {
        if (fate[i] != QI_KV_UNDECIDED) continue;
        uint64_t key = pos_key(v, i);
        if (newest ? key >= lo : key <= lo) fate[i] = to;
    }
}

void qi_kv_rank_finish(const qi_kv_view *v, uint8_t *fate, uint8_t to) {
    for (int i = 0; i < v->n; i++)
        if (fate[i] == QI_KV_UNDECIDED) fate[i] = to;
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

static int cmp_score(const void *pa, const void *pb) {
    const qi_kv_item *a = pa, *b = pb;
    if (a->score > b->score) return -1;
    if (a->score < b->score) return 1;
    bool na = a->score != a->score, nb = b->score != b->score;
    if (na != nb) return na ? 1 : -1;
    return newer_first(a, b);
}

static int cmp_pos(const void *pa, const void *pb) { return newer_first(pa, pb); }

void qi_kv_rank_sort_by_score(qi_kv_item *items, int n) {
    if (n > 1) qsort(items, (size_t)n, sizeof *items, cmp_score);
}

void qi_kv_rank_sort_by_pos(qi_kv_item *items, int n) {
    if (n > 1) qsort(items, (size_t)n, sizeof *items, cmp_pos);
}

/* live.c - the qinfer neuron policy's run-time half: the swap worker and
 * the per-layer state the engine reads (neuron_live.h has the protocol and
 * the rule).
 *
 * Why a hold per layer and not a copy per step: a reader computes with the
 * weights in the slots it sees, so a slot must not be rewritten while any
 * reader may still use it; copying the slot table out (a seqlock, a double
 * buffer) would show a consistent table but not keep its weights valid.
 * So each layer has a small reader-writer hold (mutex, condition variable,
 * reader count, writer-waiting count): readers of a layer share it, the
 * worker takes it alone twice per swap, for a few stores each time, and
 * the copy itself runs with no hold, on a slot no view contains. Writer
 * preference keeps a stream of readers from starving the worker.
 *
 * Threads: the engine's threads call begin/end and feed; the worker owns
 * the moving averages and the scratch arrays; `mu` guards the windows fed,
 * the sequence numbers and the figures. Every array is sized in create().
 */
#include <math.h>
#include <pthread.h>
#include <string.h>

#include "neuron/neuron_live.h"

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int readers, writers_waiting;
    bool writing;
    int n_slots;
    int32_t *slot;  /* [n_slots] */
    int32_t *where; /* [n_ff] */
    uint64_t gen;
    /* the worker's own */
    double *avg; /* [n_ff] activity per token */
    /* guarded by the live state's mu */
    double *pend; /* [n_ff] activity fed since the last round */
    long pend_tokens;
} layer_state;

struct qi_neuron_live {
    int n_layer, n_ff;
    qi_neuron_live_opts o;
    uint64_t *neuron_bytes;
    qi_neuron_copy_fn copy;
    qi_neuron_swap_fn swap;
    qi_neuron_move_fn leave, enter;
    void *ctx;
    layer_state *L;
    /* worker scratch, [n_ff + n_slots max] */
    int32_t *hot, *cold, *tmp;
    double *key;
    pthread_mutex_t mu;
    pthread_cond_t fed_cv, done_cv;
    uint64_t fed_seq, done_seq;
    bool running, stop;
    pthread_t thread;
    qi_neuron_live_stats st;
};

void qi_neuron_live_opts_default(qi_neuron_live_opts *o) {
    *o = (qi_neuron_live_opts){.ratio = 1.0, .slow_s = 1e-7, .link_bw = 16e9, .horizon = 64.0, .decay = 0.25,
                               .tol = 0.05, .max_swaps = 64};
}

/* ---- the per-layer hold ---------------------------------------------------------------- */

static void write_begin(layer_state *s) {
    pthread_mutex_lock(&s->mu);
    s->writers_waiting++;
    while (s->readers > 0 || s->writing) pthread_cond_wait(&s->cv, &s->mu);
    s->writers_waiting--;
    s->writing = true;
    pthread_mutex_unlock(&s->mu);
}

static void write_end(layer_state *s) {
    pthread_mutex_lock(&s->mu);
    s->writing = false;
    s->gen++;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

void qi_neuron_live_begin(qi_neuron_live *lv, int layer, qi_neuron_live_view *v) {
    QI_ASSERT(layer >= 0 && layer < lv->n_layer);
    layer_state *s = &lv->L[layer];
    pthread_mutex_lock(&s->mu);
    while (s->writing || s->writers_waiting > 0) pthread_cond_wait(&s->cv, &s->mu);
    s->readers++;
    *v = (qi_neuron_live_view){.n_ff = lv->n_ff, .n_slots = s->n_slots, .slot = s->slot, .where = s->where,
                               .gen = s->gen};
    pthread_mutex_unlock(&s->mu);
}

void qi_neuron_live_end(qi_neuron_live *lv, int layer) {
    QI_ASSERT(layer >= 0 && layer < lv->n_layer);
    layer_state *s = &lv->L[layer];
    pthread_mutex_lock(&s->mu);
    if (--s->readers == 0) pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

qi_status qi_neuron_live_view_check(const qi_neuron_live_view *v, int layer, qi_err *err) {
    for (int j = 0; j < v->n_ff; j++) {
        const int32_t s = v->where[j];
        if (s < -1 || s >= v->n_slots)
            return QI_ERR(err, QI_ERR_BACKEND, "layer %d: neuron %d in slot %d of %d", layer, j, s, v->n_slots);
        if (s >= 0 && v->slot[s] != j)
            return QI_ERR(err, QI_ERR_BACKEND, "layer %d: neuron %d says slot %d, which holds %d", layer, j, s,
                          v->slot[s]);
    }
    for (int s = 0; s < v->n_slots; s++) {
        const int32_t j = v->slot[s];
        if (j < -1 || j >= v->n_ff)
            return QI_ERR(err, QI_ERR_BACKEND, "layer %d: slot %d holds neuron %d of %d", layer, s, j, v->n_ff);
        /* a neuron in two slots: the second one's where[] names the other */
        if (j >= 0 && v->where[j] < 0)
            return QI_ERR(err, QI_ERR_BACKEND, "layer %d: neuron %d is in slot %d and on the slow device", layer, j, s);
        if (j >= 0 && v->where[j] != s)
            return QI_ERR(err, QI_ERR_BACKEND, "layer %d: neuron %d is in slots %d and %d", layer, j, s, v->where[j]);
    }
    return QI_OK;
}

/* ---- create, free ----------------------------------------------------------------------- */

void qi_neuron_live_free(qi_neuron_live *lv) {
    if (!lv) return;
    qi_neuron_live_stop(lv);
    if (lv->L) {
        for (int l = 0; l < lv->n_layer; l++) {
            layer_state *s = &lv->L[l];
            qi_free(s->slot);
            qi_free(s->where);
            qi_free(s->avg);
            qi_free(s->pend);
            pthread_mutex_destroy(&s->mu);
            pthread_cond_destroy(&s->cv);
        }
        qi_free(lv->L);
    }
    qi_free(lv->neuron_bytes);
    qi_free(lv->hot);
    qi_free(lv->cold);
    qi_free(lv->tmp);
    qi_free(lv->key);
    pthread_mutex_destroy(&lv->mu);
    pthread_cond_destroy(&lv->fed_cv);
    pthread_cond_destroy(&lv->done_cv);
    qi_free(lv);
}

static qi_status check_opts(const qi_neuron_live_opts *o, qi_err *err) {
    const struct {
        const char *name;
        double v, lo, hi;
        bool lo_open;
    } c[] = {{"ratio", o->ratio, 0, 1e9, true},     {"slow_s", o->slow_s, 0, 1e6, true},
             {"link_bw", o->link_bw, 0, 1e15, true}, {"horizon", o->horizon, 0, 1e12, true},
             {"decay", o->decay, 0, 1, true},        {"tol", o->tol, 0, 0.999999, false}};
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++)
        if (!isfinite(c[i].v) || (c[i].lo_open ? c[i].v <= c[i].lo : c[i].v < c[i].lo) || c[i].v > c[i].hi)
            return QI_ERR(err, QI_ERR_INVALID, "neuron swap worker: %s %g (in %s%g, %g])", c[i].name, c[i].v,
                          c[i].lo_open ? "(" : "[", c[i].lo, c[i].hi);
    if (o->max_swaps < 1)
        return QI_ERR(err, QI_ERR_INVALID, "neuron swap worker: max_swaps %d (1 or more)", o->max_swaps);
    return QI_OK;
}

qi_status qi_neuron_live_create(int n_layer, int n_ff, const uint8_t *fast, const double *activity,
                                const uint64_t *neuron_bytes, const qi_neuron_live_opts *o, qi_neuron_copy_fn copy,
                                qi_neuron_swap_fn swap, void *ctx, qi_neuron_live **out, qi_err *err) {
    *out = NULL;
    if (n_layer < 1 || n_layer > 4096 || n_ff < 1 || n_ff > (1 << 22))
        return QI_ERR(err, QI_ERR_INVALID, "neuron swap worker: %d layers of %d neurons", n_layer, n_ff);
    if (!fast || !activity || !neuron_bytes || !o)
        return QI_ERR(err, QI_ERR_INVALID, "neuron swap worker: no placement, activity, bytes or options given");
    qi_status st = check_opts(o, err);
    if (st) return st;
    for (int l = 0; l < n_layer; l++) {
        if (neuron_bytes[l] == 0)
            return QI_ERR(err, QI_ERR_INVALID, "neuron swap worker: layer %d: 0 bytes per neuron", l);
        for (int j = 0; j < n_ff; j++) {
            const double a = activity[(size_t)l * n_ff + j];
            if (!isfinite(a) || a < 0)
                return QI_ERR(err, QI_ERR_INVALID, "neuron swap worker: layer %d neuron %d: activity %g", l, j, a);
            if (fast[(size_t)l * n_ff + j] > 1)
                return QI_ERR(err, QI_ERR_INVALID, "neuron swap worker: layer %d neuron %d: placement %d (0 or 1)", l,
                              j, fast[(size_t)l * n_ff + j]);
        }
    }
    qi_neuron_live *lv = qi_calloc(1, sizeof *lv);
    if (!lv) return QI_ERR(err, QI_ERR_NOMEM, "neuron swap worker: out of memory");
    pthread_mutex_init(&lv->mu, NULL);
    pthread_cond_init(&lv->fed_cv, NULL);
    pthread_cond_init(&lv->done_cv, NULL);
    lv->n_layer = n_layer;
    lv->n_ff = n_ff;
    lv->o = *o;
    lv->copy = copy;
    lv->swap = swap;
    lv->ctx = ctx;
    lv->L = qi_calloc((size_t)n_layer, sizeof *lv->L);
    lv->neuron_bytes = qi_malloc(sizeof *lv->neuron_bytes * (size_t)n_layer);
    lv->hot = qi_malloc(sizeof *lv->hot * (size_t)n_ff);
    lv->cold = qi_malloc(sizeof *lv->cold * (size_t)n_ff);
    lv->tmp = qi_malloc(sizeof *lv->tmp * (size_t)n_ff);
    lv->key = qi_malloc(sizeof *lv->key * (size_t)n_ff);
    if (!lv->L || !lv->neuron_bytes || !lv->hot || !lv->cold || !lv->tmp || !lv->key) {
        if (lv->L) lv->n_layer = 0; /* no layer initialised yet */
        qi_neuron_live_free(lv);
        return QI_ERR(err, QI_ERR_NOMEM, "neuron swap worker: out of memory");
    }
    memcpy(lv->neuron_bytes, neuron_bytes, sizeof *neuron_bytes * (size_t)n_layer);
    for (int l = 0; l < n_layer; l++) {
        layer_state *s = &lv->L[l];
        pthread_mutex_init(&s->mu, NULL);
        pthread_cond_init(&s->cv, NULL);
        const uint8_t *f = fast + (size_t)l * n_ff;
        for (int j = 0; j < n_ff; j++) s->n_slots += f[j];
        s->slot = qi_malloc(sizeof *s->slot * (size_t)(s->n_slots ? s->n_slots : 1));
        s->where = qi_malloc(sizeof *s->where * (size_t)n_ff);
        s->avg = qi_malloc(sizeof *s->avg * (size_t)n_ff);
        s->pend = qi_calloc((size_t)n_ff, sizeof *s->pend);
        if (!s->slot || !s->where || !s->avg || !s->pend) {
            lv->n_layer = l + 1;
            qi_neuron_live_free(lv);
            return QI_ERR(err, QI_ERR_NOMEM, "neuron swap worker: out of memory");
        }
        int k = 0;
        for (int j = 0; j < n_ff; j++) {
            s->where[j] = f[j] ? k : -1;
            if (f[j]) s->slot[k++] = j;
            s->avg[j] = activity[(size_t)l * n_ff + j];
        }
    }
    *out = lv;
    return QI_OK;
}

void qi_neuron_live_hooks(qi_neuron_live *lv, qi_neuron_move_fn leave, qi_neuron_move_fn enter) {
    QI_ASSERT(!lv->running);
    lv->leave = leave;
    lv->enter = enter;
}

/* ---- feeding ------------------------------------------------------------------------------ */

static qi_status check_window(const qi_neuron_live *lv, int layer, const double *activity, long tokens,
                              qi_err *err) {
    if (layer < 0 || layer >= lv->n_layer)
        return QI_ERR(err, QI_ERR_INVALID, "neuron swap worker: layer %d of %d", layer, lv->n_layer);
    if (tokens < 1) return QI_ERR(err, QI_ERR_INVALID, "neuron swap worker: a window of %ld tokens", tokens);
    for (int j = 0; j < lv->n_ff; j++)
        if (!isfinite(activity[j]) || activity[j] < 0)
            return QI_ERR(err, QI_ERR_INVALID, "neuron swap worker: layer %d neuron %d: activity %g", layer, j,
                          activity[j]);
    return QI_OK;
}

/* Add a checked window (mu held). */
static void add_window(qi_neuron_live *lv, int layer, const double *activity, long tokens) {
    layer_state *s = &lv->L[layer];
    for (int j = 0; j < lv->n_ff; j++) s->pend[j] += activity[j];
    s->pend_tokens += tokens;
}

qi_status qi_neuron_live_feed(qi_neuron_live *lv, int layer, const double *activity, long tokens, qi_err *err) {
    qi_status st = check_window(lv, layer, activity, tokens, err);
    if (st) return st;
    pthread_mutex_lock(&lv->mu);
    add_window(lv, layer, activity, tokens);
    lv->fed_seq++;
    pthread_cond_signal(&lv->fed_cv);
    pthread_mutex_unlock(&lv->mu);
    return QI_OK;
}

qi_status qi_neuron_live_feed_all(qi_neuron_live *lv, const double *activity, const long *tokens, qi_err *err) {
    for (int l = 0; l < lv->n_layer; l++) {
        qi_status st = tokens[l] ? check_window(lv, l, activity + (size_t)l * lv->n_ff, tokens[l], err) : QI_OK;
        if (st) return st;
    }
    pthread_mutex_lock(&lv->mu);
    for (int l = 0; l < lv->n_layer; l++)
        if (tokens[l]) add_window(lv, l, activity + (size_t)l * lv->n_ff, tokens[l]);
    lv->fed_seq++;
    pthread_cond_signal(&lv->fed_cv);
    pthread_mutex_unlock(&lv->mu);
    return QI_OK;
}

/* Take the windows fed into the moving averages (mu held). */
static void take_windows(qi_neuron_live *lv) {
    const double d = lv->o.decay;
    for (int l = 0; l < lv->n_layer; l++) {
        layer_state *s = &lv->L[l];
        if (s->pend_tokens == 0) continue;
        const double inv = 1.0 / (double)s->pend_tokens;
        for (int j = 0; j < lv->n_ff; j++) {
            s->avg[j] = (1.0 - d) * s->avg[j] + d * s->pend[j] * inv;
            s->pend[j] = 0.0;
        }
        s->pend_tokens = 0;
    }
}

/* ---- the rule -------------------------------------------------------------------------- */

/* Sort ids a[n] by key (falling when desc, else rising; ties to the lower
 * id): a stable merge sort over the preallocated tmp. */
static void sort_ids(int32_t *a, int32_t *tmp, int n, const double *key, bool desc) {
    for (int w = 1; w < n; w *= 2) {
        for (int lo = 0; lo < n; lo += 2 * w) {
            const int mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
            int i = lo, j = mid, k = lo;
            while (i < mid && j < hi) {
                const bool right = desc ? key[a[j]] > key[a[i]] : key[a[j]] < key[a[i]];
                tmp[k++] = right ? a[j++] : a[i++];
            }
            while (i < mid) tmp[k++] = a[i++];
            while (j < hi) tmp[k++] = a[j++];
        }
        memcpy(a, tmp, sizeof *a * (size_t)n);
    }
}

static double fmax2(double a, double b) { return a > b ? a : b; }

/* One round on layer l (the worker's thread, or the caller's without a
 * worker: the only writer either way). Returns the swaps made. */
static int rebalance_layer(qi_neuron_live *lv, int l, double *t_fast_out, double *t_slow_out) {
    layer_state *s = &lv->L[l];
    const qi_neuron_live_opts *o = &lv->o;
    const int F = lv->n_ff;
    /* the writer alone changes slot[] and where[]: it reads them without a hold */
    double wf = 0, ws = 0;
    int n_hot = 0;
    for (int j = 0; j < F; j++) {
        if (s->where[j] >= 0) {
            wf += s->avg[j];
        } else {
            ws += s->avg[j];
            lv->hot[n_hot++] = j;
        }
    }
    /* the slots, coldest first, an empty one (key -1) before any neuron */
    const int n_cold = s->n_slots;
    for (int k = 0; k < n_cold; k++) {
        lv->cold[k] = k;
        lv->key[k] = s->slot[k] >= 0 ? s->avg[s->slot[k]] : -1.0;
    }
    sort_ids(lv->cold, lv->tmp, n_cold, lv->key, false);
    sort_ids(lv->hot, lv->tmp, n_hot, s->avg, true);
    const double copy_s = (double)lv->neuron_bytes[l] / o->link_bw;
    int swaps = 0;
    for (int i = 0; i < n_hot && i < n_cold && swaps < o->max_swaps; i++) {
        const double tf = o->slow_s * wf / o->ratio, ts = o->slow_s * ws;
        if (ts <= tf || ts - tf <= o->tol * ts) break;
        const int a = lv->hot[i], slot = lv->cold[i], b = s->slot[slot];
        const double aa = s->avg[a], ab = b >= 0 ? s->avg[b] : 0.0;
        const double wf2 = wf - ab + aa, ws2 = ws - aa + ab;
        const double gain = fmax2(tf, ts) - fmax2(o->slow_s * wf2 / o->ratio, o->slow_s * ws2);
        if (!(gain * o->horizon > copy_s)) break;
        /* 1: b leaves the slot */
        write_begin(s);
        if (b >= 0) s->where[b] = -1;
        s->slot[slot] = -1;
        if (b >= 0 && lv->leave) lv->leave(lv->ctx, l, b, slot);
        write_end(s);
        /* 2: a's weights into the slot, no hold: no view holds this slot */
        const int rc = lv->copy ? lv->copy(lv->ctx, l, a, slot) : 0;
        /* 3: a enters it */
        if (rc == 0) {
            write_begin(s);
            s->slot[slot] = a;
            s->where[a] = slot;
            if (lv->enter) lv->enter(lv->ctx, l, a, slot);
            write_end(s);
            wf = wf2;
            ws = ws2;
        } else {
            wf -= ab;
            ws += ab;
        }
        pthread_mutex_lock(&lv->mu);
        if (rc == 0) {
            lv->st.swaps++;
            lv->st.copied_bytes += (double)lv->neuron_bytes[l];
            lv->st.copy_s += copy_s;
        } else {
            lv->st.failed_copies++;
        }
        pthread_mutex_unlock(&lv->mu);
        if (lv->swap) lv->swap(lv->ctx, l, rc == 0 ? a : -1, b, slot);
        if (rc != 0) break;
        swaps++;
    }
    *t_fast_out = o->slow_s * wf / o->ratio;
    *t_slow_out = o->slow_s * ws;
    return swaps;
}

static int round_all(qi_neuron_live *lv) {
    int swaps = 0;
    double tf = 0, ts = 0;
    for (int l = 0; l < lv->n_layer; l++) {
        double a, b;
        swaps += rebalance_layer(lv, l, &a, &b);
        tf += a;
        ts += b;
    }
    pthread_mutex_lock(&lv->mu);
    lv->st.rounds++;
    lv->st.t_fast = tf;
    lv->st.t_slow = ts;
    pthread_mutex_unlock(&lv->mu);
    return swaps;
}

int qi_neuron_live_rebalance(qi_neuron_live *lv) {
    pthread_mutex_lock(&lv->mu);
    if (lv->running) {
        pthread_mutex_unlock(&lv->mu);
        return -1;
    }
    take_windows(lv);
    lv->done_seq = lv->fed_seq;
    pthread_mutex_unlock(&lv->mu);
    return round_all(lv);
}

/* ---- the worker ------------------------------------------------------------------------ */

static void *worker(void *arg) {
    qi_neuron_live *lv = arg;
    pthread_mutex_lock(&lv->mu);
    while (!lv->stop) {
        while (!lv->stop && lv->fed_seq == lv->done_seq) pthread_cond_wait(&lv->fed_cv, &lv->mu);
        if (lv->stop) break;
        const uint64_t seq = lv->fed_seq;
        take_windows(lv);
        pthread_mutex_unlock(&lv->mu);
        round_all(lv);
        pthread_mutex_lock(&lv->mu);
        lv->done_seq = seq;
        pthread_cond_broadcast(&lv->done_cv);
    }
    pthread_mutex_unlock(&lv->mu);
    return NULL;
}

qi_status qi_neuron_live_start(qi_neuron_live *lv, qi_err *err) {
    pthread_mutex_lock(&lv->mu);
    if (lv->running) {
        pthread_mutex_unlock(&lv->mu);
        return QI_ERR(err, QI_ERR_INVALID, "neuron swap worker: already running");
    }
    lv->stop = false;
    const int rc = pthread_create(&lv->thread, NULL, worker, lv);
    lv->running = rc == 0;
    pthread_mutex_unlock(&lv->mu);
    if (rc != 0) return QI_ERR(err, QI_ERR_BACKEND, "neuron swap worker: cannot start a thread (error %d)", rc);
    return QI_OK;
}

void qi_neuron_live_stop(qi_neuron_live *lv) {
    pthread_mutex_lock(&lv->mu);
    if (!lv->running) {
        pthread_mutex_unlock(&lv->mu);
        return;
    }
    lv->stop = true;
    pthread_cond_broadcast(&lv->fed_cv);
    pthread_mutex_unlock(&lv->mu);
    pthread_join(lv->thread, NULL);
    pthread_mutex_lock(&lv->mu);
    lv->running = false;
    pthread_cond_broadcast(&lv->done_cv); /* a sync waiting on a stopped worker returns */
    pthread_mutex_unlock(&lv->mu);
}

void qi_neuron_live_sync(qi_neuron_live *lv) {
    pthread_mutex_lock(&lv->mu);
    const uint64_t want = lv->fed_seq;
    while (lv->running && lv->done_seq < want) pthread_cond_wait(&lv->done_cv, &lv->mu);
    pthread_mutex_unlock(&lv->mu);
}

void qi_neuron_live_stats_get(qi_neuron_live *lv, qi_neuron_live_stats *out) {
    pthread_mutex_lock(&lv->mu);
    *out = lv->st;
    pthread_mutex_unlock(&lv->mu);
}

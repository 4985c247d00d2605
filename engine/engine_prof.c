/* engine_prof.c - the engine's clocks and its profile (opts.profile):
 * host work by the engine's clock; ops, copies and block spans by their
 * devices' events, summed when the step has synchronised. No cost when
 * profiling is off. */
#include "engine_int.h"

static const char *const k_op_names[QI_OP_COUNT] = {"matmul", "attention", "kv-write", "kv-policy", "other"};

const char *qi_op_kind_name(qi_op_kind k) { return k >= 0 && k < QI_OP_COUNT ? k_op_names[k] : "?"; }

void qi_engine_profile(const qi_engine *e, qi_engine_prof *out) { *out = e->prof; }

double eng_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The engine's clock: the host's, or a simulated machine's (on which the
 * host's own work takes no time). */
double eng_eclock(const qi_engine *e) { return e->sim ? qi_sim_now(e->sim) : eng_now_s(); }

/* Outside, the measurement clock (which a test may replace with a fake
 * one, QINFER_FAKE_CLOCK) when the machine is real. */
double qi_engine_now(const qi_engine *e) { return e->sim ? qi_sim_now(e->sim) : qi_measure_now(); }

/* A step's timed intervals: pairs of events (start, end) on one device's
 * stream, of an op kind or (-1) a batch of copies, summed when the step
 * has synchronised (finish_step). */
qi_status eng_keep_events(qi_engine *e, qi_event *a, qi_event *b, int kind, int tag, int dev, qi_err *err) {
    if (e->n_cev + 2 > e->cap_cev) {
        const int cap = e->cap_cev ? 2 * e->cap_cev : 256;
        qi_event **p = qi_realloc(e->cev, sizeof *p * (size_t)cap);
        if (p) e->cev = p;
        int *k = p ? qi_realloc(e->cev_kind, sizeof *k * (size_t)(cap / 2)) : NULL;
        if (k) e->cev_kind = k;
        int *g = k ? qi_realloc(e->cev_tag, sizeof *g * (size_t)(cap / 2)) : NULL;
        if (g) e->cev_tag = g;
        int *v = g ? qi_realloc(e->cev_dev, sizeof *v * (size_t)(cap / 2)) : NULL;
        if (v) e->cev_dev = v;
        if (!p || !k || !g || !v) {
            qi_event_free(a);
            qi_event_free(b);
            return QI_ERR(err, QI_ERR_NOMEM, "out of memory for the events timing a step");
        }
        e->cap_cev = cap;
    }
    e->cev_tag[e->n_cev / 2] = tag;
    e->cev_kind[e->n_cev / 2] = kind;
    e->cev_dev[e->n_cev / 2] = dev;
    e->cev[e->n_cev++] = a;
    e->cev[e->n_cev++] = b;
    return QI_OK;
}

/* The plan's index of device b (0 when it is none of them). */
int eng_dev_index(const qi_engine *e, const qi_backend *b) {
    for (int d = 0; d < e->plan.n_devices; d++)
        if (e->dev[d].be == b) return d;
    return 0;
}

/* Host work (the KV policy's decisions) timed by the engine's clock as
 * `kind`: its start, then its end. */
double eng_host_begin(const qi_engine *e) { return e->o.profile ? eng_eclock(e) : 0.0; }

void eng_host_end(qi_engine *e, int kind, double t0) {
    if (!e->o.profile) return;
    e->prof.seconds[kind] += eng_eclock(e) - t0;
    e->prof.calls[kind]++;
}

/* An op on device b, timed as `kind` with profile on: an event before it
 * (eng_op_begin), and one after it, its status st passed through
 * (eng_op_end), so a caller writes
 *     if ((st = eng_op_begin(e, b, &t, err)) || (st = eng_op_end(e, b, t, kind, the_op(...), err))) return st; */
qi_status eng_op_begin(qi_engine *e, qi_backend *b, qi_event **t0, qi_err *err) {
    *t0 = NULL;
    return e->o.profile ? qi_event_record(b, t0, err) : QI_OK;
}

qi_status eng_op_end(qi_engine *e, qi_backend *b, qi_event *t0, int kind, qi_status st, qi_err *err) {
    if (!t0 || st) {
        qi_event_free(t0);
        return st;
    }
    qi_event *t1 = NULL;
    if ((st = qi_event_record(b, &t1, err))) {
        qi_event_free(t0);
        return st;
    }
    e->prof.calls[kind]++;
    /* an op on another device than the span's is a split's second part */
    const int d = eng_dev_index(e, b);
    return eng_keep_events(e, t0, t1, kind, e->span_blk << 1 | (d != e->span_dev), d, err);
}

/* A block's span on its device (profile on): an event where it starts,
 * and one where it ends, kept as the block's time. */
qi_status eng_span_begin(qi_engine *e, int d, int blk, qi_event **t0, qi_err *err) {
    e->span_blk = blk;
    e->span_dev = d;
    return eng_op_begin(e, e->dev[d].be, t0, err);
}

qi_status eng_span_end(qi_engine *e, int d, int blk, qi_event *t0, qi_status st, qi_err *err) {
    if (!t0 || st) {
        qi_event_free(t0);
        return st;
    }
    qi_event *t1 = NULL;
    if ((st = qi_event_record(e->dev[d].be, &t1, err))) {
        qi_event_free(t0);
        return st;
    }
    return eng_keep_events(e, t0, t1, QI_OP_COUNT, blk, d, err);
}

/* Weight matmuls reading the same x, on device b, timed, with the bytes
 * they read counted. */
qi_status eng_matmul_n(qi_engine *e, qi_backend *b, const qi_weight *const *w, float *const *y, int n,
                       const float *x, int T, qi_err *err) {
    qi_status st;
    qi_event *t_op;
    if ((st = eng_op_begin(e, b, &t_op, err)) ||
        (st = eng_op_end(e, b, t_op, QI_OP_MATMUL, qi_backend_matmul_n(b, w, y, n, x, T, err), err)))
        return st;
    if (e->o.profile)
        for (int i = 0; i < n; i++) e->prof.matmul_bytes += (double)w[i]->row_bytes * (double)w[i]->n_rows;
    return QI_OK;
}

qi_status eng_matmul(qi_engine *e, qi_backend *b, const qi_weight *w, const float *x, int T, float *y,
                     qi_err *err) {
    return eng_matmul_n(e, b, &w, &y, 1, x, T, err);
}

void qi_engine_block_times_get(const qi_engine *e, qi_engine_block_times *out) {
    *out = (qi_engine_block_times){.n_blocks = wblock_count(e->m), .steps = e->blk_steps, .block_s = e->blk_s,
                                   .split_s = e->blk_split_s, .attn_s = e->blk_attn_s};
    memcpy(out->copy_s, e->copy_dev_s, sizeof out->copy_s);
}

void qi_engine_block_times_reset(qi_engine *e) {
    const size_t n = (size_t)wblock_count(e->m);
    memset(e->blk_s, 0, sizeof *e->blk_s * n);
    memset(e->blk_split_s, 0, sizeof *e->blk_split_s * n);
    memset(e->blk_attn_s, 0, sizeof *e->blk_attn_s * n);
    memset(e->copy_dev_s, 0, sizeof e->copy_dev_s);
    e->blk_steps = 0;
}

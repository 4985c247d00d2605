/* engine_stream.c - streamed layers (plan.h's `stream`, FlexGen's
 * offload): a layer whose weights stay in host memory and are copied to
 * its device every time it runs, over the device's copy stream, so the
 * link's time overlaps the compute of the layer before.
 *
 * The device holds two staging slots, each of the largest streamed
 * layer's bytes (both its blocks, the rows as they are). Before streamed
 * layer l computes (eng_stream_before): its upload is issued into a slot
 * if an earlier layer did not prefetch it; the next streamed layer's
 * (cyclically: the last one prefetches the first for the next step) is
 * issued into the other slot; the device's main stream waits for l's
 * upload, and its views of l's weights point into l's slot. After it
 * (eng_stream_after) an event on the main stream marks the slot read, and
 * the copy stream waits for it before it overwrites the slot. The device
 * computes on the same bytes as it would hold them uploaded once, so a
 * streamed plan's logits are the unstreamed one's bit for bit. On a
 * device with one stream (the CPU) the copies queue among its ops.
 *
 * Streamed weights are the model's rows: the host must not repack them
 * (opts.repack), and the device must hold a weight as its rows (no form of
 * its own, qi_dev_weight_size); both refused when a plan is applied. */
#include "engine_int.h"

struct eng_stream {
    int dev;              /* the device of the streamed layers */
    qi_buf *slot[2];
    int in[2];            /* the layer a slot holds or receives (-1: none) */
    int last;             /* the slot the last streamed layer computed from */
    qi_event *loaded[2];  /* copy stream: the slot's uploads done */
    qi_event *freed[2];   /* main stream: the last layer read from the slot done */
};

/* Layer l's weights (both blocks) with their rows' bytes, into w and n,
 * and whether each is a matmul's matrix into mm (NULL: not wanted);
 * returns how many. */
static int layer_weights(const qi_model *m, int l, const qi_weight **w, size_t *n, bool *mm) {
    bool mm_[2 * QI_PLAN_BLOCK_MAX_WEIGHTS];
    if (!mm) mm = mm_;
    int k = qi_plan_block_weights(m, 1 + 2 * l, w, mm);
    k += qi_plan_block_weights(m, 2 + 2 * l, w + k, mm + k);
    for (int i = 0; i < k; i++) n[i] = w[i]->data ? (size_t)(w[i]->row_bytes * (uint64_t)w[i]->n_rows) : 0;
    return k;
}

static void stream_free(eng_stream *s) {
    if (!s) return;
    for (int k = 0; k < 2; k++) {
        qi_event_free(s->loaded[k]);
        qi_event_free(s->freed[k]);
        qi_buf_free(s->slot[k]);
    }
    qi_free(s);
}

void eng_stream_free(qi_engine *e) {
    stream_free(e->stream);
    e->stream = NULL;
}

qi_status eng_stream_apply(qi_engine *e, const qi_plan *p, qi_err *err) {
    const qi_model *m = e->m;
    const qi_weight *w[2 * QI_PLAN_BLOCK_MAX_WEIGHTS];
    size_t n[2 * QI_PLAN_BLOCK_MAX_WEIGHTS], need = 0;
    bool mm[2 * QI_PLAN_BLOCK_MAX_WEIGHTS];
    int dev = -1;
    for (int l = 0; l < p->n_layer; l++) {
        if (!p->layers[l].stream) continue;
        if (dev >= 0 && p->layers[l].attn_dev != dev)
            return QI_ERR(err, QI_ERR_UNSUPPORTED, "plan layer %d: streamed layers on two devices (%s and %s); they "
                          "share one device's staging", l, p->devices[dev], p->devices[p->layers[l].attn_dev]);
        dev = p->layers[l].attn_dev;
        if (e->o.repack)
            return QI_ERR(err, QI_ERR_UNSUPPORTED, "plan layer %d is streamed: its weights are the model's rows in "
                          "host memory, which repack replaces", l);
        const int k = layer_weights(m, l, w, n, mm);
        size_t bytes = 0;
        for (int i = 0; i < k; i++) {
            if (n[i] && qi_dev_weight_size(e->dev[dev].be, w[i], mm[i]) != n[i])
                return QI_ERR(err, QI_ERR_UNSUPPORTED, "plan layer %d is streamed to %s, which holds weights in a form "
                              "of its own (streaming uploads the rows as they are)", l, p->devices[dev]);
            bytes += eng_walign(n[i]);
        }
        if (bytes > need) need = bytes;
    }
    /* the old staging goes once the device is done with it */
    if (e->stream) {
        qi_status st = qi_dev_synchronize(e->dev[e->stream->dev].be, err);
        if (st) return st;
    }
    eng_stream_free(e);
    if (dev < 0) return QI_OK;
    eng_stream *s = qi_calloc(1, sizeof *s);
    if (!s) return QI_ERR(err, QI_ERR_NOMEM, "out of memory for streamed layers");
    *s = (eng_stream){.dev = dev, .in = {-1, -1}, .last = 1};
    qi_status st = QI_OK;
    for (int k = 0; k < 2 && !st; k++) st = qi_buf_alloc(e->dev[dev].be, need, "streamed layer staging", &s->slot[k], err);
    if (st) {
        stream_free(s);
        return st;
    }
    e->stream = s;
    return QI_OK;
}

/* Layer l's uploads into slot k on the copy stream, after the last layer
 * that read the slot. */
static qi_status issue(qi_engine *e, int l, int k, qi_err *err) {
    eng_stream *s = e->stream;
    qi_backend *b = e->dev[s->dev].be;
    const qi_weight *w[2 * QI_PLAN_BLOCK_MAX_WEIGHTS];
    size_t n[2 * QI_PLAN_BLOCK_MAX_WEIGHTS], off = 0;
    const int nw = layer_weights(e->m, l, w, n, NULL);
    qi_event *t0 = NULL;
    qi_status st = s->freed[k] ? qi_event_wait_on(b, QI_STREAM_COPY, s->freed[k], err) : QI_OK;
    if (!st && e->o.profile) st = qi_event_record_on(b, QI_STREAM_COPY, &t0, err);
    for (int i = 0; i < nw && !st; i++) {
        if (!n[i]) continue;
        st = qi_dev_upload_on(b, QI_STREAM_COPY, qi_view_of(s->slot[k], off), w[i]->data, n[i], err);
        off += eng_walign(n[i]);
        e->prof.copies++;
        e->prof.copy_bytes += (double)n[i];
    }
    qi_event_free(s->loaded[k]);
    s->loaded[k] = NULL;
    s->in[k] = -1;
    if (!st) st = qi_event_record_on(b, QI_STREAM_COPY, &s->loaded[k], err);
    if (!st && t0) {
        st = eng_keep_events(e, t0, s->loaded[k], -1, s->dev, s->dev, err);
        if (!st) { /* the profile keeps its own pair: the slot's event stays ours */
            qi_event *ev = NULL;
            st = qi_event_record_on(b, QI_STREAM_COPY, &ev, err);
            s->loaded[k] = ev;
        }
        t0 = NULL;
    }
    qi_event_free(t0);
    if (!st) s->in[k] = l;
    return st;
}

/* The streamed layer after l, cyclically (l itself when it is the only one). */
static int next_streamed(const qi_engine *e, int l) {
    const int L = e->plan.n_layer;
    for (int i = 1; i <= L; i++)
        if (e->plan.layers[(l + i) % L].stream) return (l + i) % L;
    return l;
}

qi_status eng_stream_before(qi_engine *e, int l, qi_err *err) {
    eng_stream *s = e->stream;
    if (!s || !e->plan.layers[l].stream) return QI_OK;
    qi_status st;
    int k = s->in[0] == l ? 0 : s->in[1] == l ? 1 : -1;
    if (k < 0 && (st = issue(e, l, k = 1 - s->last, err))) return st;
    const int nx = next_streamed(e, l);
    if (nx != l && s->in[1 - k] != nx && (st = issue(e, nx, 1 - k, err))) return st;
    dev_state *D = &e->dev[s->dev];
    if ((st = qi_event_wait(D->be, s->loaded[k], err))) return st;
    /* the device's views of the layer's weights: the slot's rows */
    const qi_weight *w[2 * QI_PLAN_BLOCK_MAX_WEIGHTS];
    size_t n[2 * QI_PLAN_BLOCK_MAX_WEIGHTS], off = 0;
    const int nw = layer_weights(e->m, l, w, n, NULL);
    char *base = qi_buf_ptr(D->be, qi_view_of(s->slot[k], 0), qi_buf_size(s->slot[k]), err);
    if (!base) return QI_ERR_INVALID;
    for (int i = 0; i < nw; i++) {
        qi_weight *dst = (qi_weight *)((char *)&D->layers[l] + ((const char *)w[i] - (const char *)&e->m->layers[l]));
        *dst = *w[i];
        if (!n[i]) continue;
        dst->data = base + off;
        dst->packed = NULL;
        off += eng_walign(n[i]);
    }
    s->last = k;
    return QI_OK;
}

qi_status eng_stream_after(qi_engine *e, int l, qi_status st, qi_err *err) {
    eng_stream *s = e->stream;
    if (st || !s || !e->plan.layers[l].stream) return st;
    const int k = s->in[0] == l ? 0 : 1;
    qi_event_free(s->freed[k]);
    s->freed[k] = NULL;
    return qi_event_record(e->dev[s->dev].be, &s->freed[k], err);
}

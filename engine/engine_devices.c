/* engine_devices.c - the plan's devices: opened by name, each given the
 * weight blocks it runs (in its own form), its activations and its KV
 * pool; and the copies between devices that order their streams. */
#include "engine_int.h"
#include "kernels.h"

/* The capacity of a device name "NAME:BYTES" (K, M or G suffixes), 0 for
 * "NAME" (len: NAME's length). */
static qi_status parse_capacity(const char *name, size_t len, size_t *cap, qi_err *err) {
    *cap = 0;
    if (name[len] != ':') return QI_OK;
    char *end;
    errno = 0;
    const double v = strtod(name + len + 1, &end);
    const double mul = *end == 'K' ? 1024.0 : *end == 'M' ? 1048576.0 : *end == 'G' ? 1073741824.0 : 1.0;
    if (mul != 1.0) end++;
    if (end == name + len + 1 || *end || errno || !(v > 0) || v * mul > 1e15)
        return QI_ERR(err, QI_ERR_INVALID, "device '%s': capacity is not a size (BYTES, or with K, M or G)", name);
    *cap = (size_t)(v * mul);
    return QI_OK;
}

/* A device of --devices by name: "cpu" is the engine's own; "cuda" or
 * "cuda:BYTES" the first GPU, the memory the engine may use capped at
 * BYTES; "testdev" or "testdev:BYTES" the test device; "gpu" or
 * "gpu:BYTES" the simulated machine's GPU (opts.sim), its memory capped at
 * BYTES. */
static qi_status open_device(const qi_engine *e, const char *name, qi_backend **out, qi_err *err) {
    size_t cap = 0;
    qi_status st;
    if (strncmp(name, "testdev", 7) == 0 && (name[7] == 0 || name[7] == ':')) {
        if (e->sim)
            return QI_ERR(err, QI_ERR_INVALID, "device '%s' is a real device; a simulated machine has cpu and gpu[:BYTES]",
                          name);
        if ((st = parse_capacity(name, 7, &cap, err))) return st;
        return qi_backend_testdev_create(e->o.n_threads, cap, e->o.repack ? QI_CPU_REPACK : 0u, out, err);
    }
    if (strncmp(name, "gpu", 3) == 0 && (name[3] == 0 || name[3] == ':')) {
        if (!e->sim)
            return QI_ERR(err, QI_ERR_INVALID, "device '%s' is a simulated machine's GPU: name its profile with --sim "
                          "PROFILE", name);
        if ((st = parse_capacity(name, 3, &cap, err))) return st;
        return qi_backend_sim_create(e->sim, true, cap, out, err);
    }
    if (strncmp(name, "cuda", 4) == 0 && (name[4] == 0 || name[4] == ':')) {
        if (e->sim)
            return QI_ERR(err, QI_ERR_INVALID, "device '%s' is a real device; a simulated machine has cpu and gpu[:BYTES]",
                          name);
        if ((st = parse_capacity(name, 4, &cap, err))) return st;
        return qi_backend_cuda_create(0, cap, out, err);
    }
    return QI_ERR(err, QI_ERR_INVALID, "no device '%s' in this build (devices: cpu, cuda[:BYTES], testdev[:BYTES]; with "
                  "--sim, gpu[:BYTES])", name);
}

#define WALIGN 64

size_t eng_walign(size_t n) { return (n + WALIGN - 1) / WALIGN * WALIGN; }

/* Weight blocks: what a device holds of the model, one buffer each: the
 * token embedding (block 0), per layer l its attention (1 + 2l) and its
 * MLP (2 + 2l), the output head (2L + 1). Each device prepares the blocks
 * it runs in its own form (qi_dev_weight_prepare): the CPU runs on the
 * model's own views, or on its packed groups with repack; another device
 * holds an uploaded copy. A new plan moves a block by preparing it where
 * it goes and freeing it where it was. A streamed layer's blocks are the
 * host's: their weights stay there (engine_stream.c). */
int eng_wblock_dev(const qi_plan *p, int b) {
    if (b > 0 && b < 2 * p->n_layer + 1 && p->layers[(b - 1) / 2].stream) return 0;
    return qi_plan_block_dev(p, b);
}

const char *eng_wblock_name(const qi_model *m, int b, char *buf, size_t n) {
    return qi_plan_block_name(m->hp.n_layer, b, buf, n);
}

/* Block b's weights in the model (qi_plan_block_weights), their places in
 * device D (the same fields of D's views), and whether each is the matrix
 * of a matmul. */
static int wblock_weights(const qi_model *m, dev_state *D, int b, const qi_weight **src, qi_weight **dst, bool *mm) {
    const int n = qi_plan_block_weights(m, b, src, mm);
    for (int i = 0; i < n; i++) {
        const qi_weight *w = src[i];
        if (w == &m->tok_embd) {
            dst[i] = &D->tok_embd;
        } else if (w == &m->pos_embd) {
            dst[i] = &D->pos_embd;
        } else if (w == &m->out_norm) {
            dst[i] = &D->out_norm;
        } else if (w == &m->out_norm_b) {
            dst[i] = &D->out_norm_b;
        } else if (w == &m->output) {
            dst[i] = &D->output;
        } else {
            const int l = (b - 1) / 2;
            dst[i] = (qi_weight *)((char *)&D->layers[l] + ((const char *)w - (const char *)&m->layers[l]));
        }
    }
    return n;
}

/* The bytes of block b in device D's form (0: D runs on the model's own). */
size_t eng_wblock_bytes(const qi_model *m, dev_state *D, int b) {
    const qi_weight *src[QI_PLAN_BLOCK_MAX_WEIGHTS];
    qi_weight *dst[QI_PLAN_BLOCK_MAX_WEIGHTS];
    bool mm[QI_PLAN_BLOCK_MAX_WEIGHTS];
    const int n = wblock_weights(m, D, b, src, dst, mm);
    size_t total = 0;
    for (int i = 0; i < n; i++) total += eng_walign(qi_dev_weight_size(D->be, src[i], mm[i]));
    return total;
}

/* Device D's views of block b back to the model's own (the CPU's, for a
 * block it no longer holds in a form of its own). */
void eng_wblock_reset(const qi_model *m, dev_state *D, int b) {
    const qi_weight *src[QI_PLAN_BLOCK_MAX_WEIGHTS];
    qi_weight *dst[QI_PLAN_BLOCK_MAX_WEIGHTS];
    bool mm[QI_PLAN_BLOCK_MAX_WEIGHTS];
    const int n = wblock_weights(m, D, b, src, dst, mm);
    for (int i = 0; i < n; i++) *dst[i] = *src[i];
}

/* Block b prepared on device D: one buffer, *out (NULL when D needs none),
 * and D's views of the weights pointing into it. The work is queued on
 * D's stream. On the CPU, the rows of a matrix it packed in the packed
 * order go back to the file (the embedding table's stay: it is still read
 * by row; so do q4_K's and q6_K's beside their AMX form: fewer than
 * QI_K_WIDE_MIN tokens read them). */
qi_status eng_wblock_prepare(const qi_engine *e, dev_state *D, int b, qi_buf **out, qi_err *err) {
    *out = NULL;
    const size_t total = eng_wblock_bytes(e->m, D, b);
    const qi_weight *src[QI_PLAN_BLOCK_MAX_WEIGHTS];
    qi_weight *dst[QI_PLAN_BLOCK_MAX_WEIGHTS];
    bool mm[QI_PLAN_BLOCK_MAX_WEIGHTS];
    const int n = wblock_weights(e->m, D, b, src, dst, mm);
    char name[40];
    qi_status st = QI_OK;
    if (total && (st = qi_buf_alloc(D->be, total, eng_wblock_name(e->m, b, name, sizeof name), out, err))) return st;
    size_t off = 0;
    for (int i = 0; i < n && !st; i++) {
        const size_t nb = qi_dev_weight_size(D->be, src[i], mm[i]);
        st = qi_dev_weight_prepare(D->be, src[i], mm[i], qi_view_of(*out, off), dst[i], err);
        off += eng_walign(nb);
        if (!st && nb && D->be == e->be && dst[i]->packed && qi_k_pack_supported(src[i]->type) &&
            src[i]->data != e->m->tok_embd.data)
            qi_model_release_rows(e->m, src[i]);
    }
    if (st) {
        qi_buf_free(*out);
        *out = NULL;
    }
    return st;
}

/* Bytes a device has left (SIZE_MAX: no capacity set). */
size_t eng_dev_room(const qi_dev_info *in) {
    if (!in->capacity) return SIZE_MAX;
    return in->capacity > in->in_use ? in->capacity - in->in_use : 0;
}

/* The weight bytes plan p puts on device d that plan `have` does not (have
 * NULL: all of them), and in *at the first block at which they pass `room`
 * bytes (-1: none). */
size_t eng_weights_arriving(const qi_engine *e, const qi_plan *p, const qi_plan *have, int d, size_t room,
                            int *at) {
    size_t need = 0;
    *at = -1;
    for (int b = 0; b < wblock_count(e->m); b++) {
        if (eng_wblock_dev(p, b) != d || (have && eng_wblock_dev(have, b) == d)) continue;
        need += eng_wblock_bytes(e->m, (dev_state *)&e->dev[d], b);
        if (*at < 0 && need > room) *at = b;
    }
    return need;
}

/* The activations of R rows on device d: one buffer, the arrays in it
 * (those of split attention only when there is a second device). */
static qi_status place_activations(qi_engine *e, int d, size_t R, qi_err *err) {
    const qi_hparams *hp = &e->m->hp;
    dev_state *D = &e->dev[d];
    const size_t E = (size_t)hp->n_embd, qw = (size_t)hp->n_head * hp->head_dim,
                 kvw = (size_t)hp->n_head_kv * hp->head_dim, F = (size_t)hp->n_ff, H = (size_t)hp->n_head;
    const size_t widths[15] = {E, E > qw ? E : qw, qw, kvw, kvw, qw, F, F, qw, H, H, qw, H, H, E};
    float **arr[15] = {&D->x, &D->xn, &D->q, &D->k, &D->v, &D->att, &D->gate, &D->up,
                       &D->so, &D->sm, &D->sl, &D->ro, &D->rm, &D->rl, &D->nr};
    /* with more than one device, any may take part in a split (a new plan
     * may split a layer) */
    const int n_arr = e->plan.n_devices > 1 ? 15 : 8;
    size_t total = 0;
    for (int i = 0; i < n_arr; i++) total += eng_walign(sizeof(float) * R * widths[i]);
    qi_status st = qi_buf_alloc(D->be, total, "activations", &D->act, err);
    if (st) return st;
    D->act_rows = R;
    size_t off = 0;
    D->act_base = qi_buf_ptr(D->be, qi_view_of(D->act, 0), total, err);
    for (int i = 0; i < n_arr; i++) {
        *arr[i] = qi_buf_ptr(D->be, qi_view_of(D->act, off), sizeof(float) * R * widths[i], err);
        off += eng_walign(sizeof(float) * R * widths[i]);
    }
    return QI_OK;
}

/* Parse and check the plan, open its devices, and give each its weights,
 * activations and KV pool. A plan that does not fit a device is refused
 * here, before any work, naming the block and the bytes short. */
qi_status eng_setup_devices(qi_engine *e, size_t R, qi_err *err) {
    const qi_model *m = e->m;
    const int L = m->hp.n_layer;
    qi_plan *p = &e->plan;
    qi_status st;
    if (e->o.plan)
        st = e->o.plan->n_layer == L ? qi_plan_copy(p, e->o.plan, err)
                                     : QI_ERR(err, QI_ERR_INVALID, "a plan of %d layers for a model of %d",
                                              e->o.plan->n_layer, L);
    else if (!(st = qi_plan_devices_parse(e->o.devices ? e->o.devices : "cpu", p, err)))
        st = qi_plan_parse(e->o.placement ? e->o.placement : "all-cpu", L, p, err);
    if (!st) st = qi_plan_validate(p, err);
    if (!st) st = eng_check_splits(e, p, err);
    if (st) return st;
    e->dev[0].be = e->be;
    e->dev[0].pool = e->pool;
    for (int d = 0; d < p->n_devices; d++) {
        dev_state *D = &e->dev[d];
        if (d > 0 && (st = open_device(e, p->devices[d], &D->be, err))) return st;
        if ((st = eng_check_arch_ops(m, D->be, err))) return st;
        /* the name as --devices gave it, so the plan prints as it was asked */
        snprintf(D->be->info.name, sizeof D->be->info.name, "%s", p->devices[d]);
        D->layers = qi_calloc((size_t)L, sizeof *D->layers);
        D->wblk = qi_calloc((size_t)wblock_count(m), sizeof *D->wblk);
        if (!D->layers || !D->wblk) return QI_ERR(err, QI_ERR_NOMEM, "out of memory for a plan of %d layers", L);
        for (int l = 0; l < L; l++) D->layers[l].swa = m->layers[l].swa;
        if ((st = place_activations(e, d, d ? eng_block_rows(e, p, R) : R, err))) return st;
        if (d == 0) {
            /* the model's own views until a block is prepared (the CPU runs
             * on them unless it repacks); another device's stay empty but
             * for the blocks it holds */
            memcpy(D->layers, m->layers, sizeof *D->layers * (size_t)L);
            D->tok_embd = m->tok_embd;
            D->pos_embd = m->pos_embd;
            D->out_norm = m->out_norm;
            D->out_norm_b = m->out_norm_b;
            D->output = m->output;
        }
        /* count first: refuse a plan that does not fit, naming the block */
        const qi_dev_info *in = qi_dev_info_get(D->be);
        const size_t room = eng_dev_room(in);
        int at;
        const size_t need = eng_weights_arriving(e, p, NULL, d, room, &at);
        if (at >= 0) {
            char name[40];
            return QI_ERR(err, QI_ERR_NOMEM,
                          "plan does not fit device %s: its weights up to %s need more than the %zu bytes left "
                          "after its activations (%zu bytes in all, %zu short)",
                          in->name, eng_wblock_name(m, at, name, sizeof name), room, need, need - room);
        }
        for (int b = 0; b < wblock_count(m); b++)
            if (eng_wblock_dev(p, b) == d && (st = eng_wblock_prepare(e, D, b, &D->wblk[b], err))) return st;
        if ((st = qi_dev_synchronize(D->be, err))) return st;
        if (d == 0) continue; /* the CPU's pool is the engine's */
        bool attn = false;
        for (int l = 0; l < L; l++) attn |= p->layers[l].attn_dev == d || (p->layers[l].split > 0.0f && p->layers[l].split_dev == d);
        if (attn && (st = qi_kv_pool_create(D->be, m->hp.head_dim, e->o.kv_max_bytes, &D->pool, err))) return st;
    }
    return eng_stream_apply(e, p, err);
}

const qi_plan *qi_engine_plan(const qi_engine *e) { return e->ns ? &e->ns->shown : &e->plan; }

int qi_engine_n_packed(const qi_engine *e) {
    int n = 0;
    for (int b = 0; b < wblock_count(e->m); b++) {
        const qi_weight *src[QI_PLAN_BLOCK_MAX_WEIGHTS];
        qi_weight *dst[QI_PLAN_BLOCK_MAX_WEIGHTS];
        bool mm[QI_PLAN_BLOCK_MAX_WEIGHTS];
        const int k = wblock_weights(e->m, (dev_state *)&e->dev[eng_wblock_dev(&e->plan, b)], b, src, dst, mm);
        for (int i = 0; i < k; i++) n += mm[i] && dst[i]->packed;
    }
    return n;
}

/* Every device waited for; the first failure recorded inside one (a copy
 * that failed on a worker) is returned, each device's record cleared. */
qi_status eng_sync_all(qi_engine *e, qi_err *err) {
    qi_status first = QI_OK;
    for (int d = 0; d < e->plan.n_devices; d++) {
        qi_err de = {0};
        const qi_status st = qi_dev_synchronize(e->dev[d].be, &de);
        if (st && !first) {
            first = st;
            if (err) *err = de;
        }
    }
    return first;
}

bool qi_engine_device(const qi_engine *e, int d, qi_engine_dev *out) {
    if (d < 0 || d >= e->plan.n_devices || !e->dev[d].be) return false;
    const qi_dev_info *in = qi_dev_info_get(e->dev[d].be);
    snprintf(out->name, sizeof out->name, "%s", e->plan.devices[d]);
    out->capacity = in->capacity;
    out->in_use = in->in_use;
    out->peak = in->peak;
    out->cuda = in->kind == QI_DEV_CUDA;
    return true;
}

size_t qi_engine_plan_bytes(const qi_engine *e, int d) {
    if (d <= 0 || d >= e->plan.n_devices || !e->dev[d].be) return 0;
    size_t n = 0;
    for (int b = 0; b < wblock_count(e->m); b++)
        if (e->dev[d].wblk[b]) n += qi_buf_size(e->dev[d].wblk[b]);
    const qi_kv_pool *pool = e->dev[d].pool;
    if (pool && pool != e->pool) {
        const qi_kv_usage *u = qi_kv_pool_usage(pool);
        n += (size_t)(u->blocks[0] + u->blocks[1] + qi_kv_pool_n_free(pool)) * u->block_bytes;
    }
    return n;
}

size_t qi_engine_block_bytes(const qi_engine *e, int d, int b) {
    if (d < 0 || d >= e->plan.n_devices || !e->dev[d].be || b < 0 || b >= qi_plan_n_blocks(e->m->hp.n_layer))
        return 0;
    return eng_wblock_bytes(e->m, (dev_state *)&e->dev[d], b);
}

void qi_engine_inject_fail(qi_engine *e, int d, long n_op, long n_copy) {
    if (d < 0 || d >= e->plan.n_devices || !e->dev[d].be) return;
    qi_dev_inject_op_fail(e->dev[d].be, n_op);
    qi_dev_inject_fail(e->dev[d].be, n_copy);
}

qi_backend *qi_engine_backend(qi_engine *e, int d) {
    return d >= 0 && d < e->plan.n_devices ? e->dev[d].be : NULL;
}

qi_status eng_xfer_begin(qi_engine *e, xfer *x, qi_backend *to, qi_backend *from, qi_err *err) {
    *x = (xfer){.cs = qi_dev_copy_stream(to, from), .to = to, .from = from};
    if (!x->cs)
        return QI_ERR(err, QI_ERR_UNSUPPORTED, "no stream copies from %s to %s (neither is host-visible)",
                      qi_dev_info_get(from)->name, qi_dev_info_get(to)->name);
    return e->o.profile ? qi_event_record(x->cs, &x->t0, err) : QI_OK;
}

qi_status eng_xfer_copy(qi_engine *e, xfer *x, qi_view dst, qi_view src, size_t n, qi_err *err) {
    e->prof.copies++;
    e->prof.copy_bytes += (double)n;
    qi_status st = qi_dev_copy(x->cs, dst, src, n, err);
    if (st) { /* the batch ends here: its start event is no longer wanted */
        qi_event_free(x->t0);
        x->t0 = NULL;
    }
    return st;
}

qi_status eng_xfer_end(qi_engine *e, xfer *x, bool from_waits, qi_err *err) {
    const bool wait_to = x->to != x->cs, wait_from = from_waits && x->from != x->cs;
    if (!wait_to && !wait_from && !x->t0) return QI_OK;
    qi_event *ev = NULL;
    qi_status st = qi_event_record(x->cs, &ev, err);
    if (!st && wait_to) st = qi_event_wait(x->to, ev, err);
    if (!st && wait_from) st = qi_event_wait(x->from, ev, err);
    if (!st && x->t0) {
        st = eng_keep_events(e, x->t0, ev, -1, eng_dev_index(e, x->to), eng_dev_index(e, x->cs), err);
        x->t0 = ev = NULL;
    }
    qi_event_free(x->t0);
    qi_event_free(ev);
    x->t0 = NULL;
    return st;
}

/* The hidden state (rows of n_embd) moves to device d where the next block
 * runs: a copy on the stream that orders it (xfer), d's later work after
 * it. */
qi_status eng_move_x(qi_engine *e, int *x_dev, int d, int rows, qi_err *err) {
    if (*x_dev == d || rows == 0) {
        *x_dev = d;
        return QI_OK;
    }
    const dev_state *from = &e->dev[*x_dev], *to = &e->dev[d];
    const size_t n = sizeof(float) * (size_t)rows * (size_t)e->m->hp.n_embd;
    xfer x;
    qi_status st;
    if ((st = eng_xfer_begin(e, &x, to->be, from->be, err)) ||
        (st = eng_xfer_copy(e, &x, act_view(to, to->x), act_view(from, from->x), n, err)) ||
        (st = eng_xfer_end(e, &x, false, err)))
        return st;
    *x_dev = d;
    return QI_OK;
}

/* engine_zigzag.c - FlexGen's zig-zag block schedule (plan.h's
 * gpu_batch): a step's sequences, a block, run in GPU batches of
 * gpu_batch sequences each, the layers outside and the GPU batches inside.
 *
 * Per layer: a streamed layer's weights arrive once (engine_stream.c's
 * hooks around the layer, the next streamed layer's upload issued at once
 * so that it overlaps this layer's GPU batches), then each GPU batch runs
 * the layer's blocks on its own rows: its hidden state copied from the
 * block's store in host memory into rows 0.. of the device's activations,
 * the layer run as a step of that batch's segments alone, and the hidden
 * state copied back. The store holds the block's hidden states between
 * layers as FlexGen keeps its activations on the host, so a device's
 * activations need one GPU batch's rows only (eng_block_rows), and every
 * copy in and out is counted, and charged on the link when simulated. The
 * embedding runs per GPU batch into the store, the output head per GPU
 * batch from it, each batch's logits into its own rows.
 *
 * A GPU batch is run as a step of its own segments, their rows from 0:
 * the step's tokens, positions and output rows are pointed at the batch's
 * (e->tokens, e->q_pos, e->out_rows, restored after), so the blocks
 * (engine_attn.c, engine_mlp.c) address its rows as they address a whole
 * step's. A row's result does not depend on the rows beside it, so a
 * blocked step gives the ordinary step's logits bit for bit where the
 * matmuls' summation order does not depend on the number of rows
 * (tests/unit/test_plan_block.c).
 *
 * In a block step every sequence of the block gets an equal share of the
 * step's prompt rows (eng_block_chunk), so the block's prompts go through
 * the layers together, as FlexGen's prefill does. A step of one GPU
 * batch is the ordinary step (its hidden state stays on the device, as
 * FlexGen's does when it keeps activations on the GPU). Refused with KV
 * policies other than full, sparsity and a neuron split (not built with
 * GPU batches). */
#include "engine_int.h"

/* One GPU batch of a step: its segments segs[s0 .. s0 + n_seg) (their
 * rows from off, T of them), its output rows r0 .. r0 + R of the step's,
 * and the rows it carries on now (T, then R after the last layer). */
typedef struct {
    int s0, n_seg, off, T, r0, R, rows;
} gbatch;

struct eng_block {
    qi_buf *hid;        /* [rows][n_embd] on the CPU: the block's hidden states between layers */
    size_t rows;
    int32_t *out;       /* [rows] the GPU batches' output rows, each from its own first row */
    segment *segs;      /* [max_seqs] the GPU batches' segments, each batch's rows from 0 */
    gbatch *gb;         /* [max_seqs] */
    int32_t *tokens, *q_pos, *out_rows; /* the step's own, while a GPU batch's are in e */
};

/* The most prompt rows a sequence gets in a step under plan p: with a
 * block schedule its equal share of the step's rows. */
static int chunk_of(const qi_engine *e, const qi_plan *p) {
    const int chunk = e->o.step_tokens < QI_ENGINE_CHUNK ? e->o.step_tokens : QI_ENGINE_CHUNK;
    if (!p->gpu_batch) return chunk;
    const int share = e->o.step_tokens / e->o.max_seqs;
    return share < 1 ? 1 : share < chunk ? share : chunk;
}

int eng_block_chunk(const qi_engine *e) { return chunk_of(e, &e->plan); }

size_t eng_block_rows(const qi_engine *e, const qi_plan *p, size_t R) {
    const size_t n = (size_t)p->gpu_batch * (size_t)chunk_of(e, p);
    return p->gpu_batch && n < R ? n : R;
}

qi_status eng_block_check(const qi_engine *e, const qi_plan *p, qi_err *err) {
    if (!p->gpu_batch) {
        for (int d = 1; d < p->n_devices; d++)
            if (e->dev[d].act_rows && e->dev[d].act_rows < e->dev[0].act_rows)
                return QI_ERR(err, QI_ERR_INVALID, "plan without a block schedule: device %s holds activations of "
                              "one GPU batch (%zu rows, the engine was made with a block schedule), a step needs %zu",
                              p->devices[d], e->dev[d].act_rows, e->dev[0].act_rows);
        return QI_OK;
    }
    const char *no = strcmp(e->o.kv_policy, "full") ? "a KV policy other than full"
                     : e->o.sparsity || e->o.act_observe || e->o.ffn_observe ? "sparsity or an activation observer"
                     : e->ns                                               ? "a neuron split"
                                                                           : NULL;
    if (no)
        return QI_ERR(err, QI_ERR_UNSUPPORTED, "a block schedule (gpu_batch %d) is not built with %s", p->gpu_batch,
                      no);
    const size_t need = eng_block_rows(e, p, e->dev[0].act_rows);
    for (int d = 1; d < p->n_devices; d++)
        if (e->dev[d].act_rows && e->dev[d].act_rows < need)
            return QI_ERR(err, QI_ERR_INVALID, "plan's GPU batches of %d sequences need %zu rows of activations on "
                          "device %s, which holds %zu", p->gpu_batch, need, p->devices[d], e->dev[d].act_rows);
    return QI_OK;
}

void eng_block_free(qi_engine *e) {
    eng_block *k = e->block;
    if (!k) return;
    qi_buf_free(k->hid);
    qi_free(k->out);
    qi_free(k->segs);
    qi_free(k->gb);
    qi_free(k);
    e->block = NULL;
}

static qi_status setup(qi_engine *e, size_t R, qi_err *err) {
    eng_block *k = qi_calloc(1, sizeof *k);
    if (!k) return QI_ERR(err, QI_ERR_NOMEM, "out of memory for the block schedule");
    e->block = k;
    k->rows = R;
    k->out = qi_malloc(sizeof *k->out * R);
    k->segs = qi_malloc(sizeof *k->segs * (size_t)e->o.max_seqs);
    k->gb = qi_malloc(sizeof *k->gb * (size_t)e->o.max_seqs);
    if (!k->out || !k->segs || !k->gb) return QI_ERR(err, QI_ERR_NOMEM, "out of memory for the block schedule");
    return qi_buf_alloc(e->be, sizeof(float) * R * (size_t)e->m->hp.n_embd, "block hidden states", &k->hid, err);
}

/* The step's segments in GPU batches of gpu_batch, each batch's segments
 * and output rows from its own row 0; returns how many batches. */
static int batches(qi_engine *e, const segment *segs, int n_seg) {
    eng_block *k = e->block;
    const int G = e->plan.gpu_batch;
    int nb = 0, r0 = 0;
    for (int s0 = 0; s0 < n_seg; s0 += G, nb++) {
        gbatch *g = &k->gb[nb];
        *g = (gbatch){.s0 = s0, .n_seg = n_seg - s0 < G ? n_seg - s0 : G, .off = segs[s0].off, .r0 = r0};
        for (int i = s0; i < s0 + g->n_seg; i++) {
            k->segs[i] = segs[i];
            k->segs[i].off -= g->off;
            g->T += segs[i].n;
            g->R += segs[i].n_out;
        }
        for (int r = r0; r < r0 + g->R; r++) k->out[r] = k->out_rows[r] - g->off;
        g->rows = g->T;
        r0 += g->R;
    }
    return nb;
}

/* The step's tokens, positions and output rows as GPU batch g's. */
static void enter(qi_engine *e, const gbatch *g) {
    const eng_block *k = e->block;
    e->tokens = k->tokens + g->off;
    e->q_pos = k->q_pos + g->off;
    e->out_rows = k->out + g->r0;
}

/* rows of the hidden state from the store (from GPU batch g's first row)
 * into device d's activations (from row 0), or back (in false). */
static qi_status store(qi_engine *e, const gbatch *g, int d, int rows, bool in, qi_err *err) {
    if (rows == 0) return QI_OK;
    const dev_state *D = &e->dev[d];
    const size_t E = (size_t)e->m->hp.n_embd;
    const qi_view h = qi_view_of(e->block->hid, sizeof(float) * (size_t)g->off * E), x = act_view(D, D->x);
    qi_backend *to = in ? D->be : e->be, *from = in ? e->be : D->be;
    xfer t;
    qi_status st;
    if ((st = eng_xfer_begin(e, &t, to, from, err)) ||
        (st = eng_xfer_copy(e, &t, in ? x : h, in ? h : x, sizeof(float) * (size_t)rows * E, err)))
        return st;
    return eng_xfer_end(e, &t, !in, err);
}

static qi_status embed(qi_engine *e, const gbatch *g, qi_err *err) {
    const int d = e->plan.embd_dev;
    qi_event *t0;
    qi_status st;
    enter(e, g);
    if ((st = eng_span_begin(e, d, 0, &t0, err)) ||
        (st = eng_span_end(e, d, 0, t0, eng_embed_block(e, g->T, err), err)))
        return st;
    return store(e, g, d, g->T, false, err);
}

static qi_status layer(qi_engine *e, gbatch *g, int l, qi_err *err) {
    if (g->rows == 0) return QI_OK;
    int x_dev = e->plan.layers[l].attn_dev;
    qi_status st;
    enter(e, g);
    if ((st = store(e, g, x_dev, g->rows, true, err)) ||
        (st = eng_layer(e, e->block->segs + g->s0, g->n_seg, g->T, g->R, l, &x_dev, &g->rows, err)))
        return st;
    return store(e, g, x_dev, g->rows, false, err);
}

static qi_status head(qi_engine *e, const gbatch *g, qi_err *err) {
    if (g->R == 0) return QI_OK;
    const int d = e->plan.head_dev, hb = 2 * e->m->hp.n_layer + 1;
    qi_event *t0;
    qi_status st;
    if ((st = store(e, g, d, g->R, true, err)) || (st = eng_span_begin(e, d, hb, &t0, err))) return st;
    return eng_span_end(e, d, hb, t0, eng_head_block(e, g->R, g->r0, err), err);
}

qi_status eng_block_forward(qi_engine *e, const segment *segs, int n_seg, int T, int R, qi_err *err) {
    qi_status st = QI_OK;
    if (!e->block && (st = setup(e, e->dev[0].act_rows, err))) { /* at the first block step */
        eng_block_free(e);
        return st;
    }
    eng_block *k = e->block;
    if ((size_t)T > k->rows || (size_t)R > k->rows)
        return QI_ERR(err, QI_ERR_INVALID, "block schedule: a step of %d rows, %zu held", T, k->rows);
    k->tokens = e->tokens, k->q_pos = e->q_pos, k->out_rows = e->out_rows;
    const int nb = batches(e, segs, n_seg), L = e->m->hp.n_layer;
    size_t held = k->rows;
    for (int d = 0; d < e->plan.n_devices; d++) held = e->dev[d].act_rows < held ? e->dev[d].act_rows : held;
    for (int b = 0; !st && b < nb; b++)
        if ((size_t)k->gb[b].T > held)
            st = QI_ERR(err, QI_ERR_INVALID, "block schedule: a GPU batch of %d rows, activations of %zu", k->gb[b].T,
                        held);
    for (int b = 0; !st && b < nb; b++) st = embed(e, &k->gb[b], err);
    for (int l = 0; !st && l < L; l++) {
        if ((st = eng_stream_before(e, l, err))) break;
        qi_status ls = QI_OK;
        for (int b = 0; !ls && b < nb; b++) ls = layer(e, &k->gb[b], l, err);
        st = eng_stream_after(e, l, ls, err);
    }
    for (int b = 0; !st && b < nb; b++) st = head(e, &k->gb[b], err);
    e->tokens = k->tokens, e->q_pos = k->q_pos, e->out_rows = k->out_rows;
    return st;
}

/* engine_attn_split.c - a layer's attention split across two devices:
 * each device attends over its share of the working blocks and the two
 * partial results are merged exactly (the softmax's maxima and sums
 * carried with them), so a split differs from one device by float
 * rounding only. */
#include "engine_int.h"

/* One device's part of a split layer: its share of the step's K/V rows
 * written, then its partial attention over its slots (n_seg calls). */
static qi_status attend_part(qi_engine *e, qi_backend *b, const float *const *src, uint16_t *const *dst, int n_kv,
                             const qi_attn_paged_args *calls, int n_seg, qi_err *err) {
    qi_status st;
    qi_event *t_op;
    if ((st = eng_op_begin(e, b, &t_op, err)) ||
        (st = eng_op_end(e, b, t_op, QI_OP_KV, qi_backend_kv_write(b, src, dst, n_kv, e->m->hp.head_dim, err), err)) ||
        (st = eng_op_begin(e, b, &t_op, err)) ||
        (st = eng_op_end(e, b, t_op, QI_OP_ATTENTION, qi_backend_attention(b, calls, n_seg, err), err)))
        return st;
    return QI_OK;
}

/* Layer l's attention split across two devices (A, the attention's, and B,
 * the split's): the working blocks shared out for the step's tokens (the
 * blocks that become A's moved from B), the K/V of the step written on the
 * device holding each slot, the queries copied to B, a partial attention
 * on each over its slots, B's copied back, and the exact merge on A into
 * A's attention output. A split layer keeps every token (eng_setup_devices
 * refuses an evicting policy on one), so it has no statistics. */
qi_status eng_attend_split(qi_engine *e, const segment *segs, int n_seg, int T, int l, qi_err *err) {
    qi_event *t_op;
    const qi_hparams *hp = &e->m->hp;
    const qi_plan_layer *y = &e->plan.layers[l];
    const dev_state *A = &e->dev[y->attn_dev], *B = &e->dev[y->split_dev];
    const int H = hp->n_head, Hkv = hp->n_head_kv, D = hp->head_dim;
    qi_status st;
    xfer x;
    /* the share of the blocks, for the tokens to come */
    if ((st = eng_xfer_begin(e, &x, A->be, B->be, err))) return st;
    long moved = 0;
    for (int i = 0; i < n_seg && !st; i++)
        for (int hk = 0; hk < Hkv && !st; hk++) {
            int m = 0;
            st = qi_kv_stream_split(stream_of(e, &e->seqs[segs[i].id], l, hk), segs[i].n, y->split, &m, err);
            moved += m;
        }
    e->prof.kv_block_moves += moved;
    e->prof.copies += moved;
    e->prof.copy_bytes += (double)moved * (double)qi_kv_block_bytes(A->pool);
    qi_status st2 = QI_OK;
    if (moved) {
        st2 = eng_xfer_end(e, &x, true, err); /* B reuses the blocks it gave back */
    } else { /* nothing queued: nobody waits */
        qi_event_free(x.t0);
        x.t0 = NULL;
    }
    if (st || (st = st2)) return st;
    int n_kv = 0, n_kv2 = 0;
    for (int i = 0; i < n_seg; i++)
        if ((st = eng_attend_prepare(e, &segs[i], i, l, &n_kv, &n_kv2, err))) return st;
    /* the step's queries, keys and values to B */
    const size_t qb = sizeof(float) * (size_t)T * H * D, kb = sizeof(float) * (size_t)T * Hkv * D;
    if ((st = eng_xfer_begin(e, &x, B->be, A->be, err)) || (st = eng_xfer_copy(e, &x, act_view(B, B->q), act_view(A, A->q), qb, err)) ||
        (st = eng_xfer_copy(e, &x, act_view(B, B->k), act_view(A, A->k), kb, err)) ||
        (st = eng_xfer_copy(e, &x, act_view(B, B->v), act_view(A, A->v), kb, err)) || (st = eng_xfer_end(e, &x, false, err)))
        return st;
    /* The two parts run at once: the part of a device with a stream of its
     * own (a GPU) is queued first, so the host's part (the CPU's, which
     * runs on the calling thread) overlaps it instead of preceding it. */
    const bool a_first = qi_dev_info_get(B->be)->host_visible && !qi_dev_info_get(A->be)->host_visible;
    for (int k = 0; k < 2; k++)
        if ((st = k == (a_first ? 0 : 1)
                      ? attend_part(e, A->be, e->kv_src, e->kv_dst, n_kv, e->acall, n_seg, err)
                      : attend_part(e, B->be, e->kv_src2, e->kv_dst2, n_kv2, e->acall + e->o.max_seqs, n_seg, err)))
            return st;
    /* B's partial result back to A, and the merge */
    const size_t mb = sizeof(float) * (size_t)T * H;
    if ((st = eng_xfer_begin(e, &x, A->be, B->be, err)) ||
        (st = eng_xfer_copy(e, &x, act_view(A, A->ro), act_view(B, B->so), qb, err)) ||
        (st = eng_xfer_copy(e, &x, act_view(A, A->rm), act_view(B, B->sm), mb, err)) ||
        (st = eng_xfer_copy(e, &x, act_view(A, A->rl), act_view(B, B->sl), mb, err)) || (st = eng_xfer_end(e, &x, false, err)))
        return st;
    const float *o[2] = {A->so, A->ro}, *mx[2] = {A->sm, A->rm}, *sum[2] = {A->sl, A->rl};
    const qi_attn_merge_args ma = {.rows = T * H, .D = D, .n_parts = 2, .o = o, .m = mx, .l = sum, .out = A->att};
    if ((st = eng_op_begin(e, A->be, &t_op, err)) ||
        (st = eng_op_end(e, A->be, t_op, QI_OP_ATTENTION, qi_backend_attention_merge(A->be, &ma, err), err)))
        return st;
    return QI_OK;
}

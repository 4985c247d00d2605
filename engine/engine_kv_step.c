/* engine_kv_step.c - the KV policy after a layer's attention: each
 * stream's weights shown to the policy, its decisions made on the host
 * threads, then applied stream by stream.
 *
 * A layer's attention is one backend call for all the segments (one pass
 * of the workers, not one per sequence), under every policy: on layers the
 * policy does not exempt each segment's call gathers its statistics into a
 * region of its own, and after the call every stream of the layer goes
 * through the policy: the softmax weights of the segment's queries, summed
 * over each KV head's query heads, are shown to observe(); select()
 * decides each token's fate within the budget. Those decisions touch only
 * their own stream, so they are shared out over the backend's host threads
 * (one policy object per thread); kv.c then applies the fates stream by
 * stream in segment order, since that takes and returns blocks of the
 * shared pool. A segment's streams are its own, so this equals running
 * each segment's attention and policy in turn, except that every segment's
 * new K/V rows are in the pool before any is evicted (a KV memory cap sees
 * the step's rows together). On probe steps the weights are recomputed over both tiers
 * (one softmax over every held token) so that offloaded tokens can be
 * recalled; the attention output never reads the offload tier. For a
 * policy with an observation window (kv_policy.h) the segment that ends a
 * prompt also gets the weights of its last queries alone, computed the same
 * way, and the segments before it are marked as prompt still being read. The
 * sliding-window layers of Gemma 3 keep their ring and are not subject to
 * the policy: the window is their budget. */
#include "engine_int.h"

int eng_resolve_budget(const qi_engine *e, int32_t cur_pos) {
    if (e->o.kv_budget_tokens > 0) return e->o.kv_budget_tokens;
    long b = (long)ceil(e->o.kv_budget_frac * (double)(cur_pos + 1));
    return b < 1 ? 1 : (int)b;
}

/* Probe: the weights every query head of kv head hk gives every held token
 * of both tiers, from one softmax over them all, summed over the segment's
 * queries from the t0-th on and the group's heads, into out (working tokens
 * first): ps->attn on probe steps, ps->obs for a prompt's observation
 * window. */
static void probe_weights(const qi_engine *e, pol_scratch *ps, const segment *g, const qi_kv_stream *st, int hk,
                          const uint16_t *const *wk, int t0, float *out) {
    const qi_hparams *hp = &e->m->hp;
    const qi_kernels *K = qi_kernels_get();
    const int D = hp->head_dim, H = hp->n_head, group = H / hp->n_head_kv;
    const int nw = st->work.n, n = nw + st->off.n;
    float *s = ps->probe_s;
    const float scale = hp->q_scale > 0 ? 1.0f : 1.0f / sqrtf((float)D);
    memset(out, 0, sizeof(float) * (size_t)n);
    for (int t = t0; t < g->n; t++) {
        const int32_t qpos = g->pos0 + t;
        for (int h = hk * group; h < (hk + 1) * group; h++) {
            /* the host's copy of the queries (eng_policy_all) */
            const float *q = e->dev[0].q + ((long)(g->off + t) * H + h) * D;
            K->f32_to_f16(q, ps->probe_q16, D);
            const qi_kv_tier *tiers[2] = {&st->work, &st->off};
            const uint16_t *const *kt[2] = {wk, (const uint16_t *const *)st->off.k_blk};
            int base = 0;
            for (int ti = 0; ti < 2; ti++) {
                const qi_kv_tier *tr = tiers[ti];
                for (int i0 = 0; i0 < tr->n; i0 += QI_KV_BLOCK)
                    K->attn_scores(QI_K_ORD_VEC, D, ps->probe_q16, kt[ti][i0 >> QI_KV_BLOCK_SHIFT], (size_t)D,
                                   tr->n - i0 < QI_KV_BLOCK ? tr->n - i0 : QI_KV_BLOCK, s + base + i0);
                for (int i = 0; i < tr->n; i++)
                    if (tr->pos[i] > qpos) s[base + i] = -INFINITY;
                base += tr->n;
            }
            float mx = -INFINITY;
            for (int i = 0; i < n; i++) {
                if (s[i] != -INFINITY) s[i] *= scale;
                if (s[i] > mx) mx = s[i];
            }
            double sum = 0.0;
            for (int i = 0; i < n; i++) {
                s[i] = s[i] == -INFINITY ? 0.0f : expf(s[i] - mx);
                sum += s[i];
            }
            for (int i = 0; i < n; i++) out[i] += (float)(s[i] / sum);
        }
    }
}

/* The view of stream k of the layer (segment g, layer l, KV head hk) in
 * the r-th region of ps (ps arrays + r * n_ctx), its weights in *attn.
 * The statistics of the segment's attention are in its call a; a probe
 * reads the stream's working keys from the host's copy when the layer's
 * device is not host-visible (stage_for_probes). */
static void view_stream(const qi_engine *e, pol_scratch *ps, int r, seq_state *s, const segment *g,
                        const qi_attn_paged_args *a, int l, int hk, long k, qi_kv_view *out, float **attn) {
    const qi_hparams *hp = &e->m->hp;
    const qi_kv_stream *st = stream_of(e, s, l, hk);
    const uint16_t *const *wk = e->kst_at[k] >= 0 ? e->kst_blk + e->kst_at[k] : (const uint16_t *const *)st->work.k_blk;
    const int group = hp->n_head / hp->n_head_kv;
    const int nw = st->work.n, no = st->off.n, n = nw + no;
    const size_t o = (size_t)r * (size_t)e->o.n_ctx; /* the region's arrays */
    float *w_attn = ps->attn + o, *vscore = ps->vscore + o, *obs = ps->obs + o;
    int32_t *vpos = ps->vpos + o;
    uint8_t *vtier = ps->vtier + o;
    const bool probed = g->n == 1 && no > 0 && qi_kv_policy_probe(ps->pol, s->decode_steps + 1);
    if (probed) {
        probe_weights(e, ps, g, st, hk, wk, 0, w_attn);
    } else {
        for (int i = 0; i < nw; i++) {
            float w = 0.0f;
            for (int h = hk * group; h < (hk + 1) * group; h++) w += a->stats[(size_t)h * a->stats_stride + i];
            w_attn[i] = w;
        }
        memset(w_attn + nw, 0, sizeof(float) * (size_t)no);
    }
    /* an empty offload tier has no arrays yet (NULL), and memcpy's pointers must be valid even for 0 bytes */
    memcpy(vpos, st->work.pos, sizeof(int32_t) * (size_t)nw);
    memcpy(vscore, st->work.score, sizeof(float) * (size_t)nw);
    if (no > 0) {
        memcpy(vpos + nw, st->off.pos, sizeof(int32_t) * (size_t)no);
        memcpy(vscore + nw, st->off.score, sizeof(float) * (size_t)no);
    }
    memset(vtier, QI_KV_WORKING, (size_t)nw);
    memset(vtier + nw, QI_KV_OFFLOADED, (size_t)no);
    const int32_t cur = g->pos0 + g->n - 1;
    /* a prompt: more of it pending after this segment, or this segment
     * ends it (several tokens, nothing pending after) */
    const int W = qi_kv_policy_obs_window(ps->pol), n_obs = g->n > 1 && s->n_pending == g->n ? (W < g->n ? W : g->n) : 0;
    if (n_obs > 0) probe_weights(e, ps, g, st, hk, wk, g->n - n_obs, obs);
    *out = (qi_kv_view){.layer = l, .n_layer = hp->n_layer, .kv_head = hk, .n = n, .pos = vpos,
                        .tier = vtier, .score = vscore, .n_new = g->n < nw ? g->n : nw, .cur_pos = cur,
                        .budget = eng_resolve_budget(e, cur), .probed = probed, .prompt_more = s->n_pending > g->n,
                        .obs = n_obs > 0 ? obs : NULL, .n_obs = n_obs};
    *attn = w_attn;
}

/* Show the nh streams (segment g, layer l, KV heads hk0..hk0+nh-1) to the
 * policy and write their decisions to fate[0..nh) (each stream's working
 * then offloaded tokens); the scores go back to the streams, the fates are
 * applied later. Touches only these streams and ps, so the streams of
 * different units run on different threads at once. */
static qi_status decide_streams(const qi_engine *e, pol_scratch *ps, seq_state *s, const segment *g,
                                const qi_attn_paged_args *a, int l, int hk0, long k0, int nh, uint8_t *const *fate,
                                qi_err *err) {
    qi_kv_view v[MAX_TOGETHER];
    float *attn[MAX_TOGETHER];
    for (int r = 0; r < nh; r++) view_stream(e, ps, r, s, g, a, l, hk0 + r, k0 + r, &v[r], &attn[r]);
    qi_status rc = qi_kv_policy_decide(ps->pol, v, nh, (const float *const *)attn, fate, err);
    if (rc) return rc;
    for (int r = 0; r < nh; r++) {
        qi_kv_stream *st = stream_of(e, s, l, hk0 + r);
        const int nw = st->work.n, no = st->off.n;
        memcpy(st->work.score, v[r].score, sizeof(float) * (size_t)nw);
        if (no > 0) memcpy(st->off.score, v[r].score + nw, sizeof(float) * (size_t)no);
    }
    return QI_OK;
}

/* The policy's decisions for a layer's streams, stream k = segment k / Hkv,
 * KV head k % Hkv, shared out over the host threads by units: a stream
 * each, or a segment's Hkv streams together when the policy decides a
 * layer's KV heads together (ada=). Each thread takes the next unit as it
 * finishes one (streams differ in cost, and a thread may start late), with
 * its own policy object and scratch: a stream's decision depends on the
 * stream alone, so the split does not change it. */
typedef struct {
    qi_engine *e;
    const segment *segs;
    int n_seg, l;
    atomic_long next; /* the next unit to take */
} policy_job;

static void policy_work(void *arg, int ith, int nth) {
    (void)nth;
    policy_job *j = arg;
    qi_engine *e = j->e;
    const int Hkv = e->m->hp.n_head_kv, nh = qi_kv_policy_heads_together(e->pol) ? Hkv : 1;
    pol_scratch *ps = &e->ps[ith];
    const long units = (long)j->n_seg * (Hkv / nh);
    for (long u; (u = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed)) < units;) {
        const long k = u * nh; /* the unit's first stream */
        const int i = (int)(k / Hkv), hk = (int)(k % Hkv);
        const segment *g = &j->segs[i];
        uint8_t *fate[MAX_TOGETHER];
        for (int r = 0; r < nh; r++) fate[r] = e->fates + e->fate_off[k + r];
        qi_status st = decide_streams(e, ps, &e->seqs[g->id], g, &e->acall[i], j->l, hk, k, nh, fate, &ps->err);
        if (st) {
            ps->err_k = k;
            ps->err_st = st;
            return;
        }
    }
}

/* Whether stream (segment g, its sequence s) is probed this step or has a
 * prompt's observation window: decide_stream's conditions, ahead of it. */
static bool reads_keys(const qi_engine *e, const seq_state *s, const segment *g, const qi_kv_stream *st) {
    const bool probed = g->n == 1 && st->off.n > 0 && qi_kv_policy_probe(e->pol, s->decode_steps + 1);
    const bool obs = g->n > 1 && s->n_pending == g->n && qi_kv_policy_obs_window(e->pol) > 0;
    return probed || obs;
}

/* A layer whose attention runs on a device the host cannot address: the
 * policy reads the step's queries and, for the streams it probes, their
 * working keys, so both are copied to the host first (the queries into
 * the CPU's activations, free while another device runs the layer; the
 * keys into e->kstage, each stream's rows behind a block table of its
 * own), and the host waits for the copies. kst_at[k] is stream k's first
 * entry of e->kst_blk, or -1: read the stream's own blocks. */
static qi_status stage_for_probes(qi_engine *e, const segment *segs, int n_seg, int l, qi_err *err) {
    const qi_hparams *hp = &e->m->hp;
    const dev_state *X = &e->dev[e->plan.layers[l].attn_dev];
    const int Hkv = hp->n_head_kv, D = hp->head_dim;
    const long n_streams = (long)n_seg * Hkv;
    for (long k = 0; k < n_streams; k++) e->kst_at[k] = -1;
    if (qi_dev_info_get(X->be)->host_visible) return QI_OK;
    size_t rows = 0, blocks = 0;
    for (long k = 0; k < n_streams; k++) {
        const segment *g = &segs[k / Hkv];
        const qi_kv_stream *st = stream_of(e, &e->seqs[g->id], l, (int)(k % Hkv));
        if (!reads_keys(e, &e->seqs[g->id], g, st)) continue;
        const int nb = (st->work.n + QI_KV_BLOCK - 1) / QI_KV_BLOCK;
        e->kst_at[k] = (long)blocks;
        blocks += (size_t)nb;
        rows += (size_t)nb * QI_KV_BLOCK;
    }
    if (blocks == 0) return QI_OK; /* no stream probes: the policy reads only the statistics */
    int T = 0;
    for (int i = 0; i < n_seg; i++) T += segs[i].n;
    const size_t qbytes = sizeof(float) * (size_t)T * hp->n_head * D;
    qi_status st = qi_dev_download(X->be, e->dev[0].q, act_view(X, X->q), qbytes, err);
    if (st) return st;
    if (rows > e->cap_kstage) {
        uint16_t *p = qi_realloc(e->kstage, sizeof *p * rows * (size_t)D);
        if (!p) return QI_ERR(err, QI_ERR_NOMEM, "out of memory staging %zu keys for the KV policy", rows);
        e->kstage = p;
        e->cap_kstage = rows;
    }
    if (blocks > e->cap_kst_blk) {
        const uint16_t **p = qi_realloc(e->kst_blk, sizeof *p * blocks);
        if (!p) return QI_ERR(err, QI_ERR_NOMEM, "out of memory staging %zu KV blocks for the KV policy", blocks);
        e->kst_blk = p;
        e->cap_kst_blk = blocks;
    }
    for (long k = 0; k < n_streams; k++) {
        if (e->kst_at[k] < 0) continue;
        const segment *g = &segs[k / Hkv];
        const qi_kv_tier *w = &stream_of(e, &e->seqs[g->id], l, (int)(k % Hkv))->work;
        for (int b = 0; b * QI_KV_BLOCK < w->n; b++) {
            const long at = e->kst_at[k] + b;
            uint16_t *dst = e->kstage + (size_t)at * QI_KV_BLOCK * D;
            const int nr = w->n - b * QI_KV_BLOCK < QI_KV_BLOCK ? w->n - b * QI_KV_BLOCK : QI_KV_BLOCK;
            e->kst_blk[at] = dst;
            /* a block holds its K rows first */
            if ((st = qi_dev_download(X->be, dst, qi_view_of(w->blk[b], 0), sizeof *dst * (size_t)nr * D, err)))
                return st;
        }
    }
    qi_event *ev = NULL;
    if ((st = qi_event_record(X->be, &ev, err))) return st;
    qi_event_sync(ev);
    qi_event_free(ev);
    return QI_OK;
}

/* The policy over every stream of layer l's segments: the decisions in
 * parallel (each stream's own arithmetic, so the same fates and scores
 * whatever the split), then the fates applied stream by stream in order,
 * since applying takes and gives back blocks of the shared pool. */
qi_status eng_policy_all(qi_engine *e, const segment *segs, int n_seg, int l, qi_err *err) {
    const int Hkv = e->m->hp.n_head_kv;
    qi_status st0;
    const long n_streams = (long)n_seg * Hkv;
    size_t need = 0;
    for (long k = 0; k < n_streams; k++) {
        const qi_kv_stream *st = stream_of(e, &e->seqs[segs[k / Hkv].id], l, (int)(k % Hkv));
        e->fate_off[k] = need;
        need += (size_t)st->work.n + (size_t)st->off.n;
    }
    if (need > e->cap_fates) {
        uint8_t *p = qi_realloc(e->fates, need);
        if (!p) return QI_ERR(err, QI_ERR_NOMEM, "out of memory for the KV fates of %d sequences", n_seg);
        e->fates = p;
        e->cap_fates = need;
    }
    if ((st0 = stage_for_probes(e, segs, n_seg, l, err))) return st0;
    /* every thread's record, not only those this run uses: a failure of an
     * earlier step must not be reported again, and qi_err keeps its first
     * message until cleared */
    for (int t = 0; t < e->o.n_threads; t++) {
        e->ps[t].err_k = -1;
        qi_err_clear(&e->ps[t].err);
    }
    policy_job j = {e, segs, n_seg, l, 0};
    if (n_streams > 1 && !e->sim)
        qi_backend_cpu_host_run(e->be, policy_work, &j);
    else
        policy_work(&j, 0, 1);
    /* the first failure in stream order, whichever thread met it */
    const pol_scratch *bad = NULL;
    for (int t = 0; t < e->o.n_threads; t++) {
        const pol_scratch *ps = &e->ps[t];
        if (ps->err_k >= 0 && (!bad || ps->err_k < bad->err_k)) bad = ps;
    }
    if (bad) {
        *err = bad->err;
        return bad->err_st;
    }
    for (long k = 0; k < n_streams; k++) {
        qi_status st = qi_kv_stream_apply(stream_of(e, &e->seqs[segs[k / Hkv].id], l, (int)(k % Hkv)),
                                          e->fates + e->fate_off[k], err);
        if (st) return st;
    }
    return QI_OK;
}

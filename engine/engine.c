/* engine.c - the batched engine (qinfer/engine.h): sequences, the step
 * scheduler, the forward pass over a batch, and the KV policy loop.
 *
 * A step is a list of segments, one per sequence that runs in it: a run of
 * that sequence's pending tokens at consecutive positions. Decoding
 * sequences (one pending token) come first, one row each, on top of the
 * step's prompt room (step_tokens); then prompt chunks, starting from a
 * cursor that moves every step so no sequence waits for ever. A chunk is
 * always the next min(pending, QI_ENGINE_CHUNK, step_tokens) tokens and runs
 * whole or waits: a sequence's segments, and so the points where a budgeted
 * policy evicts (after each segment, at a budget set by its last position),
 * never depend on what else is in the batch. Cutting a chunk to fill the
 * room would let a neighbour's decode rows move those points and change a
 * sequence's result.
 *
 * The forward pass (llama and gemma3), per layer: x += Wo . attn(rope(Wq .
 * n), rope(Wk . n), Wv . n) with n = rmsnorm(x); then x += Wdown .
 * (silu(Wgate . m) * (Wup . m)) with m = rmsnorm(x). Gemma3 adds, in
 * llama.cpp's order: embeddings scaled by sqrt(n_embd); a per-head RMSNorm
 * of q and k before RoPE; q scaled after RoPE (the softmax then unscaled);
 * RMSNorms of the attention and FFN outputs before each residual add;
 * GeGLU instead of SwiGLU; local layers with a sliding window and their own
 * RoPE base. The window is a mask over the cache, as llama.cpp's. Its local
 * layers' cache is a ring of n_swa + n_ubatch cells rounded up to 256 (1024
 * for Gemma 3 270M), position p landing in cell p % size; once it has
 * wrapped, attention runs over the cells in cell order, which decides the
 * summation order, so the local layers here keep the same ring (kv.c). K
 * and V are kept as fp16, as llama.cpp's default cache keeps them, so
 * attention reads the same rounded values. The matmuls and element-wise
 * ops run over all the step's rows (each weight read once per step); RoPE,
 * the KV writes and attention per segment (each sequence at its own
 * positions, over its own cache streams).
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
 * the policy: the window is their budget.
 *
 * A policy that picks blocks (Quest, kv_policy.h's pick()) evicts nothing
 * and is not called after attention: instead, once a layer's K/V rows are
 * written, the host brings the streams' key bounds up to date (kv.c) and,
 * on decode segments, asks the policy which blocks each stream reads; the
 * segment's attention call then points at those blocks (pick_blocks).
 * The host reads the rows and the queries for that, so such a policy runs
 * where attention runs on the CPU, and other plans are refused.
 *
 * The last layer carries on only with the rows whose logits are wanted
 * (all of a segment fed with logits_all, its last row, or none for an inner
 * chunk of a prompt), as llama.cpp selects its output rows there: the
 * remaining matmuls then run with that many tokens, which decides the
 * K-quant summation order (QI_K_WIDE_MIN). Every buffer is sized at creation except the logits,
 * which grow to the largest step's output rows.
 *
 * OPT and Falcon (simulated devices only: their ops are backend.h's
 * optional ones): LayerNorms with biases for the RMSNorms; OPT adds its
 * learned position's row to each token's embedding, has no RoPE, adds a
 * bias after every matmul, and its FFN is down(relu(up(n))), no gate;
 * Falcon's FFN is down(gelu(up(m))), and its layers are parallel, x +=
 * attn(n) + mlp(m) with n and m the two LayerNorms of the same x (plan.h
 * says how that maps onto the attention and MLP blocks).
 */
#include "qinfer/engine.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "ffn_split.h"
#include "kernels.h"
#include "kv.h"
#include "kv/kv_policy.h"
#include "neuron/neuron_live.h"
#include "qinfer/gguf.h"
#include "qinfer/measure.h"
#include "qinfer/quant.h"
#include "qinfer/sparsity.h"
#include "quant_act.h"
#include "sparse.h"
#include "threadpool.h"

typedef struct {
    bool used, failed;
    bool swapped;     /* its working KV in the offload tier: steps skip it (qi_engine_seq_swap_out) */
    int32_t *pending; /* [n_ctx] */
    int head, n_pending;
    bool logits_all;
    int n_past;
    long decode_steps;
    int logit_row, n_logits; /* into e->logits, from the last step */
    qi_kv_stream *streams;   /* [n_layer][Hkv] */
} seq_state;

/* The most KV heads a policy decides together (ada=). */
#define MAX_TOGETHER 64

/* A host thread's policy scratch, [n_ctx] each per stream it decides at
 * once (one, or a layer's Hkv streams of a sequence when the policy decides
 * KV heads together): the view of the stream, its attention weights, the
 * probe's scores. The policy object is the thread's own (a policy keeps no
 * state across streams, kv_policy.h), so selects of different streams run
 * at once. */
typedef struct {
    qi_kv_policy *pol;
    float *attn;
    int32_t *vpos;
    uint8_t *vtier;
    float *vscore;
    float *probe_s; /* [n_ctx + 16] */
    float *obs;     /* [n_ctx] a prompt's observation window (kv_policy.h) */
    uint16_t *probe_q16; /* [head_dim] */
    /* the first failure in this thread's share: stream number, status */
    long err_k;
    qi_status err_st;
    qi_err err;
} pol_scratch;

typedef struct {
    int id, off, n, pos0;
    int out_first, n_out; /* rows of this segment whose logits are wanted: out_first.. within the segment */
} segment;

/* A device of the plan: its backend, its activations (one buffer, [R]
 * rows of each), the weights of the blocks it runs (in the device's own
 * form: the model's views on the CPU, or its packed groups with repack;
 * an uploaded copy elsewhere), and the pool of the working KV
 * of the layers whose attention it runs. */
typedef struct {
    qi_backend *be;
    qi_buf *act;
    float *x, *xn, *q, *k, *v, *att, *gate, *up;
    /* split attention (when the device takes part in one): its partial
     * result (out [R][H*D], max and sum [R][H]), and, where the merge runs,
     * the other device's copied over */
    float *so, *sm, *sl, *ro, *rm, *rl;
    float *nr;              /* [R][n_embd]: a neuron split's fast partial product, received */
    char *act_base;         /* the address of act's first byte, for views of the arrays */
    qi_buf **wblk;          /* [2 n_layer + 2] its form of the weight blocks it runs (NULL: none
                             * needed, the CPU on the model's rows; see wblock_count) */
    qi_layer *layers;       /* [n_layer]: weights of its blocks (others stale or zero) */
    qi_weight tok_embd, pos_embd, out_norm, out_norm_b, output;
    qi_buf *lbuf;           /* logits rows when it runs the output head (not the CPU) */
    float *logits;
    long cap_logit_rows;
    qi_kv_pool *pool;       /* NULL: no attention here */
    qi_buf *sbuf;           /* the policy's attention statistics, when it decides a layer here (not the CPU) */
    size_t cap_sbuf;        /* floats */
} dev_state;

/* The view of array p of device D's activations. */
static qi_view act_view(const dev_state *D, const float *p) {
    return qi_view_of(D->act, (size_t)((const char *)p - D->act_base));
}

/* Weight blocks a device may hold (plan.h's numbering). */
static int wblock_count(const qi_model *m) { return qi_plan_n_blocks(m->hp.n_layer); }

/* The matrices of a layer in column form (opts.sparsity), by SP_W_* index. */
enum { SP_W_Q, SP_W_K, SP_W_V, SP_W_O, SP_W_GATE, SP_W_UP, SP_W_DOWN, SP_W_COUNT };

struct qi_engine {
    const qi_model *m;
    qi_engine_opts o;
    /* opts.sparsity: [n_layer][SP_W_COUNT] column forms (zeroed where the
     * mode reads the matrix dense or it has none); scratch sized for the
     * step's rows: active columns, act(gate), ones, a step's activations
     * quantised for the rows of up that cats computes, per 32 neurons the
     * count kept and zeroed (cats_ffn); zeroed / seen activations over the
     * thresholded sites */
    qi_colw *sp_w;
    qi_sparsity sp;         /* opts.sparsity's copy (e->o.sparsity points here), its thr owned */
    int32_t *sp_idx, *sp_cnt;
    long *sp_zc;
    float *sp_act, *sp_ones;
    void *sp_xq;
    double sp_zeroed, sp_seen;
    bool sp_paused;         /* qi_engine_sparsity_pause: steps run the dense path */
    qi_backend *be;         /* the CPU device, dev[0].be */
    qi_sim *sim;            /* opts.sim: the simulated machine its devices are (NULL: real ones) */
    qi_kv_pool *pool;       /* the CPU's KV pool: its attention layers' working tiers, every offload tier */
    qi_kv_policy *pol;
    qi_plan plan;
    dev_state dev[QI_PLAN_MAX_DEVICES];
    int swa_cells;
    seq_state *seqs;
    int cursor;
    /* step scratch, [step_tokens + max_seqs] rows */
    int32_t *tokens, *q_pos;
    const float **kv_src;   /* a layer's K/V rows to write, [2 R Hkv] */
    uint16_t **kv_dst;
    segment *segs;
    int32_t *out_rows;
    float *logits;
    long cap_logit_rows;
    /* policy scratch: a layer's attention statistics, one region of
     * [H][stride] per segment (stride: the segment's most working slots,
     * rounded up to STATS_ALIGN), cap_stats floats, grown by the largest
     * step; then [n_ctx] per stream */
    float *stats;
    size_t cap_stats, n_stats; /* floats: allocated, placed for this layer */
    /* the policy's pass over a layer's streams, shared out over the
     * backend's host threads: one scratch (and one policy object) per
     * thread, then every stream's fates, kept for the serial apply */
    pol_scratch *ps;     /* [n_threads] */
    uint8_t *fates;      /* the streams' fates one after another, cap_fates bytes */
    size_t cap_fates;
    size_t *fate_off;    /* [max_seqs * Hkv + 1] */
    /* one layer's attention calls, [max_seqs] calls of [Hkv] streams each,
     * then as many for the second device of a split */
    qi_attn_paged_args *acall;
    int *a_nslots;
    const int32_t **a_pos;
    const uint16_t *const **a_kb, *const **a_vb;
    /* a policy that picks blocks (Quest): the chosen blocks' tables and
     * positions of each call's streams, [max_seqs * Hkv] regions of
     * pick_max_blocks pointers and of n_ctx positions, and one stream's
     * choice */
    bool picks, pick_tokens; /* the policy picks what attention reads; single tokens (SparQ) */
    bool fetches;            /* the (evicting) policy fetches offloaded tokens for attention (qinfer fetch=) */
    int pick_max_blocks;
    const uint16_t **pick_kb, **pick_vb;
    int32_t *pick_pos;
    int *pick_idx;
    /* a token picker's reallocation of the unread weight (SparQ): per
     * segment [H] shares the read tokens hold, [Hkv][D] mean values and
     * their [Hkv] pointers */
    float *pick_mix, *pick_vmean;
    const float **pick_vm;
    /* a fetching policy's rows besides the working tier's blocks, per
     * segment [Hkv]: their count and tables (qi_attn_paged_args's x_*),
     * pointing into pick_kb, pick_vb and pick_pos */
    int *x_n;
    const int32_t **x_pos;
    const uint16_t *const **x_k, *const **x_v;
    /* a device layer's keys staged for the policy's probe
     * (stage_for_probes): rows, block tables, each stream's first entry */
    uint16_t *kstage;
    size_t cap_kstage;
    const uint16_t **kst_blk;
    size_t cap_kst_blk;
    long *kst_at;           /* [max_seqs * Hkv] */
    /* a split layer's K/V writes on its second device, [2 R Hkv] */
    const float **kv_src2;
    uint16_t **kv_dst2;
    /* with profile: the step's copies as pairs of events (start, end) on
     * their stream, timed when the step has synchronised */
    qi_event **cev;
    int *cev_kind;          /* [cap_cev / 2] an op kind, -1: copies, QI_OP_COUNT: a block's span */
    int *cev_tag;           /* [cap_cev / 2] for an op, its block << 1 | 1 on a split's second device;
                             * for copies, the device they fill; for a span, its block */
    int *cev_dev;           /* [cap_cev / 2] the device whose stream holds the two events */
    int n_cev, cap_cev;
    int cur_blk, cur_slot;  /* the block the ops issued now belong to, and whether on its split device */
    /* with profile: per weight block the device time of its span on its
     * device, of a split attention's ops on the second device and of an
     * attention block's attention and KV writes on its own device, and the
     * copies into each device, since the last reset (placement policies'
     * observations) */
    double *blk_s, *blk_split_s, *blk_attn_s;
    double copy_dev_s[QI_PLAN_MAX_DEVICES];
    long blk_steps;
    qi_engine_prof prof;
    /* opts.neuron_fast (its copy): each layer's FFN gathered into its two
     * sides (ns[l].n[1] == 0: not split), and the sides' matrices as the
     * devices run them (ns_w[l][0]: gate, up, down on the CPU; ns_w[l][1]
     * on neuron_dev), in buffers of theirs where a device holds a copy */
    uint8_t *ns_mask;
    qi_ffn_split *ns;
    qi_colw *ns_cw;         /* [n_layer] with cats: the CPU side's down in column form */
    qi_engine_neuron_rp *ns_rp; /* [n_layer] with opts.neuron_active */
    float *ns_obs;          /* [R][n_ff] the fast side's activations, copied back */
    /* opts.neuron_swap_every: the live state (units as its neurons); per
     * layer [n_layer][n_units] the unit in each fast slot, the unit at each
     * position of the cold side and each unit's cold position (-1: in a
     * slot); a layer's activity per unit, the steps and what was copied; a
     * copy's failure */
    qi_neuron_live *live;
    int32_t *ns_hot, *ns_cold, *ns_cpos;
    double *ns_feed;
    /* with neuron_swap_worker: each layer's spare cold position (-1:
     * none), zeros for a slot's gate rows, the activity summed since the
     * last feed [n_layer][n_units] and its tokens; swaps and live_st are
     * then written by the worker's thread too, under swap_mu */
    int32_t *ns_spare;
    void *ns_zero;
    /* with neuron_swap_worker: a unit's bytes as a slot holds them (gate
     * rows, up rows, down's blocks by row), on the fast device, where the
     * worker's uploads land on its copy stream; the last swap's events:
     * those uploads done (copy stream), the staging read into its slot
     * (main stream); the worker's alone */
    qi_buf *ns_stage;
    qi_event *ns_stage_up, *ns_stage_read;
    double *ns_acc;
    long *ns_acc_tok;
    pthread_mutex_t swap_mu;
    bool swap_mu_made;
    /* tests (qi_engine_neuron_check_steps): every split layer checked as a
     * step reads it; the worker's pause inside each swap */
    bool ns_check_steps;
    int ns_stall_us;
    atomic_long ns_mid; /* swaps.mid, read by the worker's pause */
    long live_steps;
    qi_engine_neuron_swaps swaps;
    qi_status live_st;
    qi_err live_err;
    qi_weight (*ns_w)[2][3];
    qi_buf *(*ns_buf)[2];
    size_t (*ns_off)[3];    /* [n_layer] the fast side's gate, up and down in its buffer */
};

static const char *const k_op_names[QI_OP_COUNT] = {"matmul", "attention", "kv-write", "kv-policy", "other"};
const char *qi_op_kind_name(qi_op_kind k) { return k >= 0 && k < QI_OP_COUNT ? k_op_names[k] : "?"; }
void qi_engine_profile(const qi_engine *e, qi_engine_prof *out) { *out = e->prof; }

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The engine's clock: the host's, or a simulated machine's (on which the
 * host's own work takes no time). */
static double eclock(const qi_engine *e) { return e->sim ? qi_sim_now(e->sim) : now_s(); }

/* Outside, the measurement clock (which a test may replace with a fake
 * one, QINFER_FAKE_CLOCK) when the machine is real. */
double qi_engine_now(const qi_engine *e) { return e->sim ? qi_sim_now(e->sim) : qi_measure_now(); }
const char *qi_engine_sim_profile(const qi_engine *e) { return e->sim ? qi_sim_profile(e->sim)->name : NULL; }
const qi_hwprofile *qi_engine_sim_hwprofile(const qi_engine *e) { return e->sim ? qi_sim_profile(e->sim) : NULL; }
const qi_sim *qi_engine_sim(const qi_engine *e) { return e->sim; }

/* Profiling (opts.profile): host work (the KV policy's decisions) by the
 * engine's clock, HOST_PROF_BEGIN/END around it; ops by their device's events
 * (TIMED, after keep_events below). No cost when off. */
#define HOST_PROF_BEGIN(e) double prof_t0_ = (e)->o.profile ? eclock(e) : 0.0
#define HOST_PROF_END(e, kind)                                   \
    do {                                                         \
        if ((e)->o.profile) {                                    \
            (e)->prof.seconds[kind] += eclock(e) - prof_t0_;     \
            (e)->prof.calls[kind]++;                             \
        }                                                        \
    } while (0)

/* A step's timed intervals: pairs of events (start, end) on one device's
 * stream, of an op kind or (-1) a batch of copies, summed when the step
 * has synchronised (finish_step). */
static qi_status keep_events(qi_engine *e, qi_event *a, qi_event *b, int kind, int tag, int dev, qi_err *err) {
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
static int dev_index(const qi_engine *e, const qi_backend *b) {
    for (int d = 0; d < e->plan.n_devices; d++)
        if (e->dev[d].be == b) return d;
    return 0;
}

static qi_status op_begin(qi_engine *e, qi_backend *b, qi_event **t0, qi_err *err) {
    *t0 = NULL;
    return e->o.profile ? qi_event_record(b, t0, err) : QI_OK;
}

static qi_status op_end(qi_engine *e, qi_backend *b, qi_event *t0, int kind, qi_status st, qi_err *err) {
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
    return keep_events(e, t0, t1, kind, e->cur_blk << 1 | e->cur_slot, dev_index(e, b), err);
}

/* A block's span on its device (profile on): an event where it starts,
 * and one where it ends, kept as the block's time. */
static qi_status span_begin(qi_engine *e, int d, int blk, qi_event **t0, qi_err *err) {
    e->cur_blk = blk;
    e->cur_slot = 0;
    return op_begin(e, e->dev[d].be, t0, err);
}

static qi_status span_end(qi_engine *e, int d, int blk, qi_event *t0, qi_status st, qi_err *err) {
    if (!t0 || st) {
        qi_event_free(t0);
        return st;
    }
    qi_event *t1 = NULL;
    if ((st = qi_event_record(e->dev[d].be, &t1, err))) {
        qi_event_free(t0);
        return st;
    }
    return keep_events(e, t0, t1, QI_OP_COUNT, blk, d, err);
}

/* An op on device b: timed as `kind` with profile on, its failure
 * returned from the enclosing function (which has qi_err *err). */
#define TIMED(e, b, kind, call)                                          \
    do {                                                                 \
        qi_event *t0_;                                                   \
        qi_status s_ = op_begin(e, b, &t0_, err);                        \
        if (!s_) s_ = op_end(e, b, t0_, kind, (call), err);              \
        if (s_) return s_;                                               \
    } while (0)
/* An op whose time is counted in "other" (the step's rest). */
#define OP(call)                                                         \
    do {                                                                 \
        const qi_status s_ = (call);                                     \
        if (s_) return s_;                                               \
    } while (0)

/* Weight matmuls reading the same x, on device b, timed, with the bytes
 * they read counted. */
static qi_status matmul_n(qi_engine *e, qi_backend *b, const qi_weight *const *w, float *const *y, int n,
                          const float *x, int T, qi_err *err) {
    TIMED(e, b, QI_OP_MATMUL, qi_backend_matmul_n(b, w, y, n, x, T, err));
    if (e->o.profile)
        for (int i = 0; i < n; i++) e->prof.matmul_bytes += (double)w[i]->row_bytes * (double)w[i]->n_rows;
    return QI_OK;
}

static qi_status matmul(qi_engine *e, qi_backend *b, const qi_weight *w, const float *x, int T, float *y,
                        qi_err *err) {
    return matmul_n(e, b, &w, &y, 1, x, T, err);
}

/* ---- activation sparsity (opts.sparsity, opts.act_observe) ------------------ */

static float sp_thr(const qi_engine *e, int l, int site) {
    return e->o.sparsity && !e->sp_paused ? e->o.sparsity->thr[(size_t)l * QI_SITE_COUNT + (size_t)site] : -1.0f;
}

/* The activations x [T][n] at a site of layer l (on the CPU, where every
 * layer runs when either is set): shown to opts.act_observe, then zeroed
 * where |x| <= the site's threshold. Returns the active columns (the union
 * over the rows, in e->sp_idx), or -1 where the site is not thresholded. */
static int sp_site(qi_engine *e, int l, int site, float *x, int T, int n) {
    if (e->o.act_observe) e->o.act_observe(e->o.act_observe_ctx, l, site, x, T, n);
    const float t = sp_thr(e, l, site);
    if (t < 0.0f) return -1;
    long z = 0;
    const int k = qi_sparse_threshold(x, (size_t)n, T, n, t, e->sp_idx, &z);
    e->sp_zeroed += (double)z;
    e->sp_seen += (double)T * n;
    return k;
}

typedef struct {
    const qi_colw *w[3];
    float *y[3];
    int n_w;
    const float *x;
    int T;
    const int32_t *idx;
    int n_idx;
    qi_sparse_fn fn;
} sp_job;

/* The 32-row chunks of all the job's matrices, one after another, split
 * evenly over the threads. */
static void sp_work(void *arg, int ith, int nth) {
    const sp_job *j = arg;
    long total = 0;
    for (int i = 0; i < j->n_w; i++) total += (long)(j->w[i]->n_out / 32);
    long lo, hi, off = 0;
    qi_split(total, ith, nth, &lo, &hi);
    for (int i = 0; i < j->n_w; i++) {
        const long n = (long)(j->w[i]->n_out / 32);
        const long a = lo - off < 0 ? 0 : lo - off > n ? n : lo - off, b = hi - off < 0 ? 0 : hi - off > n ? n : hi - off;
        if (a < b)
            j->fn(j->w[i], j->x, (size_t)j->w[i]->n_in, j->T, j->idx, j->n_idx, j->y[i], (size_t)j->w[i]->n_out,
                  32 * a, 32 * b);
        off += n;
    }
}

static qi_status sp_run(qi_engine *e, sp_job *j) {
    qi_backend_cpu_host_run(e->be, sp_work, j);
    return QI_OK;
}

/* Matmuls of layer l's matrices wi[0..n) (SP_W_*) reading x [T][n_in]
 * whose active columns are e->sp_idx[0..n_idx) (n_idx < 0: not
 * thresholded): the sparse kernels where every matrix has a column form
 * and few enough columns are active, else the dense matmul (of the zeroed
 * x: the same activations, the dense arithmetic). */
static qi_status mm_site(qi_engine *e, qi_backend *b, int l, const int *wi, const qi_weight *const *w, float *const *y,
                         int n, const float *x, int T, int n_idx, qi_err *err) {
    bool sparse = n_idx >= 0 && e->sp_w && !e->sp_paused &&
                  (double)n_idx <= e->o.sparse_max_density * (double)w[0]->n_cols;
    sp_job j = {.n_w = n, .x = x, .T = T, .idx = e->sp_idx, .n_idx = n_idx, .fn = qi_sparse_matmul()};
    for (int i = 0; i < n && sparse; i++) {
        j.w[i] = &e->sp_w[(size_t)l * SP_W_COUNT + (size_t)wi[i]];
        j.y[i] = y[i];
        sparse = j.w[i]->codes != NULL;
    }
    if (!sparse) return matmul_n(e, b, w, y, n, x, T, err);
    TIMED(e, b, QI_OP_MATMUL, sp_run(e, &j));
    if (e->o.profile)
        for (int i = 0; i < n; i++)
            e->prof.matmul_bytes += (double)j.w[i]->col_bytes * n_idx +
                                    (double)qi_colw_bytes(j.w[i]) - (double)j.w[i]->col_bytes * (double)j.w[i]->n_in;
    return QI_OK;
}

typedef struct {
    const qi_weight *w;
    qi_k_gemm_fn gemm;
    const void *xq;
    uint64_t qrow_bytes;
    int T;
    const int32_t *rows;
    int n_rows;
    float *y;
} rows_job;

/* Rows [r0, r1) of w, every token: y[t][r] = w_r . xq_t, in the dense
 * matmul's order (the kernels' dots do not depend on how many rows a call
 * takes), so they equal the dense matmul's bit for bit. */
static void rows_range(const qi_weight *w, qi_k_gemm_fn gemm, const void *xq, uint64_t qrow_bytes, int T, long r0,
                       long r1, float *y) {
    const void *wr = (const char *)w->data + (uint64_t)r0 * w->row_bytes;
    if (!gemm) {
        for (long r = r0; r < r1; r++)
            for (int t = 0; t < T; t++)
                y[(long)t * w->n_rows + r] = qi_vec_dot_ref(w->type, w->n_cols,
                                                            (const char *)w->data + (uint64_t)r * w->row_bytes,
                                                            (const char *)xq + (uint64_t)t * qrow_bytes);
        return;
    }
    for (int t0 = 0; t0 < T; t0 += 32) {
        const int nt = T - t0 < 32 ? T - t0 : 32;
        gemm(w->n_cols, wr, w->row_bytes, (int)(r1 - r0), (const char *)xq + (uint64_t)t0 * qrow_bytes, qrow_bytes,
             nt, y + (long)t0 * w->n_rows + r0, (size_t)w->n_rows);
    }
}

/* rows_range over the listed rows rows[0 .. n) (ascending), each run of
 * consecutive ones in one call, so the kernels' multi-row paths work as in
 * the dense matmul. */
static void rows_runs(const qi_weight *w, qi_k_gemm_fn gemm, const void *xq, uint64_t qrow_bytes, int T,
                      const int32_t *rows, long n, float *y) {
    for (long k = 0; k < n;) {
        long q = k + 1;
        while (q < n && rows[q] == rows[q - 1] + 1) q++;
        rows_range(w, gemm, xq, qrow_bytes, T, rows[k], rows[q - 1] + 1, y);
        k = q;
    }
}

/* Rows of up for cats: the listed rows, split evenly over the threads. */
static void rows_work(void *arg, int ith, int nth) {
    const rows_job *j = arg;
    long lo, hi;
    qi_split(j->n_rows, ith, nth, &lo, &hi);
    rows_runs(j->w, j->gemm, j->xq, j->qrow_bytes, j->T, j->rows + lo, hi - lo, j->y);
}

static qi_status rows_run(qi_engine *e, rows_job *j, const float *x) {
    const uint32_t dt = qi_vec_dot_type(j->w->type);
    for (int t = 0; t < j->T; t++)
        qi_quantize_act_row(dt, x + (size_t)t * (size_t)j->w->n_cols, (char *)j->xq + (uint64_t)t * j->qrow_bytes,
                            j->w->n_cols);
    qi_backend_cpu_host_run(e->be, rows_work, j);
    return QI_OK;
}

/* y [T][w->n_rows] = x . W^T at the rows listed (the others left as they
 * are): cats's up. */
static qi_status mm_rows(qi_engine *e, qi_backend *b, const qi_weight *w, const float *x, int T, const int32_t *rows,
                         int n_rows, float *y, qi_err *err) {
    const qi_kernels *k = qi_kernels_get();
    rows_job j = {.w = w, .xq = e->sp_xq, .T = T, .rows = rows, .n_rows = n_rows, .y = y};
    j.gemm = T >= QI_K_WIDE_MIN && k->gemm_wide[w->type] ? k->gemm_wide[w->type] : k->gemm[w->type];
    qi_type_row_bytes(qi_vec_dot_type(w->type), (uint64_t)w->n_cols, &j.qrow_bytes);
    TIMED(e, b, QI_OP_MATMUL, rows_run(e, &j, x));
    if (e->o.profile) e->prof.matmul_bytes += (double)w->row_bytes * n_rows;
    return QI_OK;
}

double qi_engine_sparsity_measured(const qi_engine *e) { return e->sp_seen > 0 ? e->sp_zeroed / e->sp_seen : -1.0; }

void qi_engine_sparsity_pause(qi_engine *e, bool paused) { e->sp_paused = paused && e->sp_w; }

/* Whether a step's sites go through the sparsity path: under opts.sparsity
 * not paused, or with an observer (which sees every step). */
static bool sp_path(const qi_engine *e) { return (e->sp_w && !e->sp_paused) || e->o.act_observe; }

void qi_engine_opts_default(qi_engine_opts *o) {
    memset(o, 0, sizeof *o);
    o->n_threads = qi_n_physical_cores();
    o->max_seqs = 16;
    o->n_ctx = 2048;
    o->step_tokens = QI_ENGINE_CHUNK;
    o->kv_policy = "full";
    o->sparse_max_density = 0.6;
}

/* Rows of statistics are padded to whole multiples of 16 floats (a 64-byte
 * cache line), so rows of neighbouring heads, which different threads
 * write, seldom share a line. */
#define STATS_ALIGN 16

static int stats_stride(int n_slots) { return (n_slots + STATS_ALIGN - 1) / STATS_ALIGN * STATS_ALIGN; }

static qi_kv_stream *stream_of(const qi_engine *e, const seq_state *s, int l, int hk) {
    return &s->streams[(size_t)l * e->m->hp.n_head_kv + hk];
}

/* The pool of layer l's working KV: its attention device's; and that of
 * the second device of a split attention (NULL: not split). */
static qi_kv_pool *work_pool(const qi_engine *e, int l) { return e->dev[e->plan.layers[l].attn_dev].pool; }
static qi_kv_pool *split_pool(const qi_engine *e, int l) {
    const qi_plan_layer *y = &e->plan.layers[l];
    return y->split > 0.0f ? e->dev[y->split_dev].pool : NULL;
}

void qi_engine_free(qi_engine *e) {
    if (!e) return;
    if (e->live) qi_neuron_live_stop(e->live); /* its swaps write what is freed below */
    if (e->seqs) {
        for (int i = 0; i < e->o.max_seqs; i++) {
            seq_state *s = &e->seqs[i];
            if (s->streams)
                for (int l = 0; l < e->m->hp.n_layer; l++)
                    for (int h = 0; h < e->m->hp.n_head_kv; h++)
                        qi_kv_stream_release(stream_of(e, s, l, h));
            qi_free(s->streams);
            qi_free(s->pending);
        }
        qi_free(e->seqs);
    }
    if (e->ps)
        for (int t = 0; t < e->o.n_threads; t++) {
            pol_scratch *ps = &e->ps[t];
            if (ps->pol != e->pol) qi_kv_policy_free(ps->pol);
            void *pb[] = {ps->attn, ps->vpos, ps->vtier, ps->vscore, ps->probe_s, ps->probe_q16, ps->obs};
            for (size_t i = 0; i < sizeof pb / sizeof pb[0]; i++) qi_free(pb[i]);
        }
    qi_free(e->ps);
    if (e->sp_w)
        for (int i = 0; i < e->m->hp.n_layer * SP_W_COUNT; i++) qi_colw_free(&e->sp_w[i]);
    void *sp[] = {e->sp_w, e->sp_idx, e->sp_cnt, e->sp_zc, e->sp_act, e->sp_ones, e->sp_xq, e->sp.thr};
    for (size_t i = 0; i < sizeof sp / sizeof sp[0]; i++) qi_free(sp[i]);
    qi_kv_policy_free(e->pol);
    if (e->ns)
        for (int l = 0; l < e->m->hp.n_layer; l++) qi_ffn_split_free(&e->ns[l]);
    if (e->ns_buf)
        for (int l = 0; l < e->m->hp.n_layer; l++) qi_buf_free(e->ns_buf[l][0]), qi_buf_free(e->ns_buf[l][1]);
    if (e->ns_stage) { /* the fast stream may still wait for the last swap's event */
        qi_err ign = {0};
        (void)qi_dev_synchronize(qi_buf_device(e->ns_stage), &ign);
        qi_event_free(e->ns_stage_up);
        qi_event_free(e->ns_stage_read);
        qi_buf_free(e->ns_stage);
    }
    qi_neuron_live_free(e->live);
    qi_free(e->ns_hot);
    qi_free(e->ns_cold);
    qi_free(e->ns_cpos);
    qi_free(e->ns_spare);
    qi_free(e->ns_zero);
    qi_free(e->ns_acc);
    qi_free(e->ns_acc_tok);
    if (e->swap_mu_made) pthread_mutex_destroy(&e->swap_mu);
    qi_free(e->ns_feed);
    if (e->ns_cw)
        for (int l = 0; l < e->m->hp.n_layer; l++) qi_colw_free(&e->ns_cw[l]);
    qi_free(e->ns_cw);
    qi_free(e->ns_rp);
    qi_free(e->ns_obs);
    qi_free(e->ns);
    qi_free(e->ns_w);
    qi_free(e->ns_buf);
    qi_free(e->ns_off);
    qi_free(e->ns_mask);
    for (int d = QI_PLAN_MAX_DEVICES - 1; d >= 0; d--) {
        dev_state *D = &e->dev[d];
        if (D->pool != e->pool) qi_kv_pool_free(D->pool);
        qi_buf_free(D->act);
        if (D->wblk)
            for (int b = 0; b < wblock_count(e->m); b++) qi_buf_free(D->wblk[b]);
        qi_free(D->wblk);
        qi_buf_free(D->lbuf);
        qi_buf_free(D->sbuf);
        qi_free(D->layers);
        if (d > 0) qi_backend_free(D->be);
    }
    qi_kv_pool_free(e->pool);
    qi_backend_free(e->be);
    qi_sim_free(e->sim);
    qi_plan_free(&e->plan);
    for (int i = 0; i < e->n_cev; i++) qi_event_free(e->cev[i]);
    void *bufs[] = {e->tokens, e->q_pos, e->kv_src, e->kv_dst, e->segs, e->out_rows, e->logits, e->stats, e->fates,
                    e->fate_off, e->acall, e->a_nslots, (void *)e->a_pos, (void *)e->a_kb, (void *)e->a_vb,
                    (void *)e->kv_src2, e->kv_dst2, e->cev, e->cev_kind, e->cev_tag, e->cev_dev, e->kstage,
                    (void *)e->kst_blk, e->kst_at, e->blk_s, e->blk_split_s, e->blk_attn_s, (void *)e->pick_kb,
                    (void *)e->pick_vb, e->pick_pos, e->pick_idx, e->pick_mix, e->pick_vmean, (void *)e->pick_vm,
                    e->x_n, (void *)e->x_pos, (void *)e->x_k, (void *)e->x_v};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) qi_free(bufs[i]);
    qi_free(e);
}

/* ---- devices and the plan ---------------------------------------------------------- */

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
static size_t walign(size_t n) { return (n + WALIGN - 1) / WALIGN * WALIGN; }

/* Weight blocks: what a device holds of the model, one buffer each: the
 * token embedding (block 0), per layer l its attention (1 + 2l) and its
 * MLP (2 + 2l), the output head (2L + 1). Each device prepares the blocks
 * it runs in its own form (qi_dev_weight_prepare): the CPU runs on the
 * model's own views, or on its packed groups with repack; another device
 * holds an uploaded copy. A new plan moves a block by preparing it where
 * it goes and freeing it where it was. */
static int wblock_dev(const qi_plan *p, int b) { return qi_plan_block_dev(p, b); }

static const char *wblock_name(const qi_model *m, int b, char *buf, size_t n) {
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
static size_t wblock_bytes(const qi_model *m, dev_state *D, int b) {
    const qi_weight *src[QI_PLAN_BLOCK_MAX_WEIGHTS];
    qi_weight *dst[QI_PLAN_BLOCK_MAX_WEIGHTS];
    bool mm[QI_PLAN_BLOCK_MAX_WEIGHTS];
    const int n = wblock_weights(m, D, b, src, dst, mm);
    size_t total = 0;
    for (int i = 0; i < n; i++) total += walign(qi_dev_weight_size(D->be, src[i], mm[i]));
    return total;
}

/* Device D's views of block b back to the model's own (the CPU's, for a
 * block it no longer holds in a form of its own). */
static void wblock_reset(const qi_model *m, dev_state *D, int b) {
    const qi_weight *src[QI_PLAN_BLOCK_MAX_WEIGHTS];
    qi_weight *dst[QI_PLAN_BLOCK_MAX_WEIGHTS];
    bool mm[QI_PLAN_BLOCK_MAX_WEIGHTS];
    const int n = wblock_weights(m, D, b, src, dst, mm);
    for (int i = 0; i < n; i++) *dst[i] = *src[i];
}

/* Block b prepared on device D: one buffer, *out (NULL when D needs none),
 * and D's views of the weights pointing into it. The work is queued on
 * D's stream. On the CPU, the rows of a matrix it packed go back to the
 * file (the embedding table's stay: it is still read by row). */
static qi_status wblock_prepare(const qi_engine *e, dev_state *D, int b, qi_buf **out, qi_err *err) {
    *out = NULL;
    const size_t total = wblock_bytes(e->m, D, b);
    const qi_weight *src[QI_PLAN_BLOCK_MAX_WEIGHTS];
    qi_weight *dst[QI_PLAN_BLOCK_MAX_WEIGHTS];
    bool mm[QI_PLAN_BLOCK_MAX_WEIGHTS];
    const int n = wblock_weights(e->m, D, b, src, dst, mm);
    char name[40];
    qi_status st = QI_OK;
    if (total && (st = qi_buf_alloc(D->be, total, wblock_name(e->m, b, name, sizeof name), out, err))) return st;
    size_t off = 0;
    for (int i = 0; i < n && !st; i++) {
        const size_t nb = qi_dev_weight_size(D->be, src[i], mm[i]);
        st = qi_dev_weight_prepare(D->be, src[i], mm[i], qi_view_of(*out, off), dst[i], err);
        off += walign(nb);
        if (!st && nb && D->be == e->be && dst[i]->packed && src[i]->data != e->m->tok_embd.data)
            qi_model_release_rows(e->m, src[i]);
    }
    if (st) {
        qi_buf_free(*out);
        *out = NULL;
    }
    return st;
}

/* Bytes a device has left (SIZE_MAX: no capacity set). */
static size_t dev_room(const qi_dev_info *in) {
    if (!in->capacity) return SIZE_MAX;
    return in->capacity > in->in_use ? in->capacity - in->in_use : 0;
}

/* The weight bytes plan p puts on device d that plan `have` does not (have
 * NULL: all of them), and in *at the first block at which they pass `room`
 * bytes (-1: none). */
static size_t weights_arriving(const qi_engine *e, const qi_plan *p, const qi_plan *have, int d, size_t room,
                               int *at) {
    size_t need = 0;
    *at = -1;
    for (int b = 0; b < wblock_count(e->m); b++) {
        if (wblock_dev(p, b) != d || (have && wblock_dev(have, b) == d)) continue;
        need += wblock_bytes(e->m, (dev_state *)&e->dev[d], b);
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
    for (int i = 0; i < n_arr; i++) total += walign(sizeof(float) * R * widths[i]);
    qi_status st = qi_buf_alloc(D->be, total, "activations", &D->act, err);
    if (st) return st;
    size_t off = 0;
    D->act_base = qi_buf_ptr(D->be, qi_view_of(D->act, 0), total, err);
    for (int i = 0; i < n_arr; i++) {
        *arr[i] = qi_buf_ptr(D->be, qi_view_of(D->act, off), sizeof(float) * R * widths[i], err);
        off += walign(sizeof(float) * R * widths[i]);
    }
    return QI_OK;
}

/* A layer the KV policy budgets: not a sliding-window layer of Gemma 3
 * (its ring is its budget), not one the policy exempts. */
static bool budgeted_layer(const qi_engine *e, int l) {
    return !(e->m->hp.n_swa > 0 && e->m->layers[l].swa) && !qi_kv_policy_exempt(e->pol, l);
}

/* A layer the KV policy decides (evicts on) after attention; it may not be
 * split. */
static bool policy_layer(const qi_engine *e, int l) { return budgeted_layer(e, l) && !e->picks; }

/* A layer whose decode attention reads the blocks the policy picks
 * (Quest), from key bounds the host computes over the working rows. */
static bool pick_layer(const qi_engine *e, int l) { return budgeted_layer(e, l) && e->picks; }

/* A layer whose decode attention also reads the offloaded tokens the
 * policy fetches, scored on the host from the offload tier's key columns. */
static bool fetch_layer(const qi_engine *e, int l) { return policy_layer(e, l) && e->fetches; }

static qi_status check_splits(const qi_engine *e, const qi_plan *p, qi_err *err) {
    for (int l = 0; l < p->n_layer; l++)
        if (p->layers[l].split > 0.0f && policy_layer(e, l))
            return QI_ERR(err, QI_ERR_UNSUPPORTED,
                          "plan layer %d: KV policy '%s' evicts on this layer, whose attention is split (a split "
                          "layer keeps every token for now)",
                          l, e->o.kv_policy);
    return QI_OK;
}

/* A picking policy's layers (Quest) attend on a host-visible device that
 * computes, the CPU, and are not split: the host keeps the key bounds from
 * the working rows and reads the queries. Other devices (testdev, cuda,
 * simulated ones) would need the bounds kept on the device, which none
 * does yet: refused at creation (and at a new plan) rather than run wrong.
 * p's devices are open. */
static qi_status check_picks(const qi_engine *e, const qi_plan *p, qi_err *err) {
    for (int l = 0; l < p->n_layer; l++) {
        if (fetch_layer(e, l) && (e->o.sim || !qi_dev_info_get(e->dev[p->layers[l].attn_dev].be)->host_visible))
            return QI_ERR(err, QI_ERR_UNSUPPORTED,
                          "plan layer %d: KV policy '%s' fetches offloaded tokens for attention, scoring them on "
                          "the host, and this layer's attention runs on %s (implemented for the CPU only): place "
                          "the attention of every layer on the CPU, or leave fetch= out",
                          l, e->o.kv_policy, e->o.sim ? "a simulated machine" : p->devices[p->layers[l].attn_dev]);
        if (!pick_layer(e, l)) continue;
        if (e->o.sim)
            return QI_ERR(err, QI_ERR_UNSUPPORTED,
                          "KV policy '%s' picks %s by their keys, and a simulated machine (%s) computes none",
                          e->o.kv_policy, e->pick_tokens ? "tokens" : "blocks", e->o.sim);
        if (p->layers[l].split > 0.0f)
            return QI_ERR(err, QI_ERR_UNSUPPORTED,
                          "plan layer %d: KV policy '%s' picks what attention reads, and this layer's "
                          "attention is split across two devices (not supported)",
                          l, e->o.kv_policy);
        if (!qi_dev_info_get(e->dev[p->layers[l].attn_dev].be)->host_visible)
            return QI_ERR(err, QI_ERR_UNSUPPORTED,
                          "plan layer %d: KV policy '%s' %s on the host and picks %s there; "
                          "this layer's attention runs on %s, which the host cannot read (implemented for the "
                          "CPU only): place the attention of every layer on the CPU",
                          l, e->o.kv_policy, e->pick_tokens ? "reads the keys" : "keeps its key bounds",
                          e->pick_tokens ? "tokens" : "blocks", p->devices[p->layers[l].attn_dev]);
    }
    return QI_OK;
}

/* opts.ffn_observe reads the activations on the host: every MLP of plan p
 * on a host-visible device, and real arithmetic (no simulated machine). */
static qi_status check_observe(const qi_engine *e, const qi_plan *p, qi_err *err) {
    if (!e->o.ffn_observe) return QI_OK;
    if (e->o.sim)
        return QI_ERR(err, QI_ERR_UNSUPPORTED, "the FFN observer needs real activations; a simulated machine (%s) "
                      "computes none", e->o.sim);
    for (int l = 0; l < p->n_layer; l++) {
        const int f = p->layers[l].mlp_dev;
        if (!qi_dev_info_get(e->dev[f].be)->host_visible)
            return QI_ERR(err, QI_ERR_UNSUPPORTED, "the FFN observer reads activations on the host, and the plan "
                          "puts layer %d's MLP on device %s, which the host cannot read: place every MLP on the CPU",
                          l, p->devices[f]);
    }
    return QI_OK;
}

/* opts.sparsity and opts.act_observe run on the host's arithmetic: every
 * layer whole on the CPU, a gated MLP, no simulated machine, no repack. */
static qi_status check_sparse(const qi_engine *e, const qi_plan *p, qi_err *err) {
    if (!e->o.sparsity && !e->o.act_observe) return QI_OK;
    const char *what = e->o.sparsity ? "activation sparsity" : "the activation observer";
    if (e->o.sim)
        return QI_ERR(err, QI_ERR_UNSUPPORTED, "%s needs real activations; a simulated machine (%s) computes none",
                      what, e->o.sim);
    if (e->o.repack)
        return QI_ERR(err, QI_ERR_UNSUPPORTED, "%s reads the matrices' rows as the file has them: leave out --repack",
                      what);
    if (qi_ffn_gate_free(e->m->hp.ffn_act))
        return QI_ERR(err, QI_ERR_UNSUPPORTED, "%s needs a gated MLP (llama, gemma3)", what);
    for (int l = 0; l < p->n_layer; l++) {
        const qi_plan_layer *y = &p->layers[l];
        if (y->attn_dev != 0 || y->mlp_dev != 0 || y->split > 0.0f)
            return QI_ERR(err, QI_ERR_UNSUPPORTED, "%s runs on the CPU only, and the plan puts layer %d's %s on %s", what,
                          l, y->mlp_dev != 0 ? "MLP" : "attention", p->devices[y->mlp_dev != 0 ? y->mlp_dev : y->split > 0.0f ? y->split_dev : y->attn_dev]);
    }
    return QI_OK;
}

/* The column forms opts.sparsity's mode reads (teal: every matrix of a
 * layer; cats: down) and the scratch for R rows a step. */
static qi_status sparse_setup(qi_engine *e, size_t R, qi_err *err) {
    const qi_hparams *hp = &e->m->hp;
    const qi_sparsity *sp = e->o.sparsity;
    if (!sp && !e->o.act_observe) return QI_OK;
    if (sp && (sp->n_layer != hp->n_layer || !sp->thr || (sp->mode != QI_SPARSITY_TEAL && sp->mode != QI_SPARSITY_CATS)))
        return QI_ERR(err, QI_ERR_INVALID, "sparsity thresholds for %d layers, and the model has %d", sp->n_layer,
                      hp->n_layer);
    if (!(e->o.sparse_max_density >= 0.0 && e->o.sparse_max_density <= 1.0))
        return QI_ERR(err, QI_ERR_INVALID, "sparse_max_density %g outside [0, 1]", e->o.sparse_max_density);
    if (sp) { /* the engine's own copy: the caller's may go */
        const size_t n = (size_t)hp->n_layer * QI_SITE_COUNT;
        e->sp = *sp;
        e->sp.thr = qi_malloc(sizeof(float) * n);
        if (!e->sp.thr) return QI_ERR(err, QI_ERR_NOMEM, "out of memory for the sparsity thresholds");
        memcpy(e->sp.thr, sp->thr, sizeof(float) * n);
        e->o.sparsity = sp = &e->sp;
    }
    const size_t F = (size_t)hp->n_ff, W = (size_t)(hp->n_embd > hp->n_head * hp->head_dim ? hp->n_embd
                                                                                            : hp->n_head * hp->head_dim);
    e->sp_idx = qi_malloc(sizeof(int32_t) * (F > W ? F : W));
    e->sp_act = qi_malloc(sizeof(float) * R * F);
    e->sp_ones = qi_malloc(sizeof(float) * R * F);
    e->sp_xq = qi_malloc(qi_backend_max_act_row_bytes(e->m) * R);
    e->sp_cnt = qi_malloc(sizeof(int32_t) * (F / 32 + 1));
    e->sp_zc = qi_malloc(sizeof(long) * (F / 32 + 1));
    if (!e->sp_idx || !e->sp_act || !e->sp_ones || !e->sp_xq || !e->sp_cnt || !e->sp_zc)
        return QI_ERR(err, QI_ERR_NOMEM, "out of memory for the sparsity scratch");
    for (size_t i = 0; i < R * F; i++) e->sp_ones[i] = 1.0f;
    if (!sp || sp->target == 0.0) return QI_OK; /* nothing thresholded: the dense matmuls */
    e->sp_w = qi_calloc((size_t)hp->n_layer * SP_W_COUNT, sizeof *e->sp_w);
    if (!e->sp_w) return QI_ERR(err, QI_ERR_NOMEM, "out of memory for the column forms");
    for (int l = 0; l < hp->n_layer; l++) {
        const qi_layer *ly = &e->m->layers[l];
        const qi_weight *ws[SP_W_COUNT] = {&ly->wq, &ly->wk, &ly->wv, &ly->wo, &ly->w_gate, &ly->w_up, &ly->w_down};
        for (int k = 0; k < SP_W_COUNT; k++) {
            if (sp->mode == QI_SPARSITY_CATS && k != SP_W_DOWN) continue;
            if (!qi_colw_supported(ws[k])) continue; /* read dense */
            qi_status st = qi_colw_build(ws[k], &e->sp_w[(size_t)l * SP_W_COUNT + (size_t)k], err);
            if (st) return st;
        }
    }
    return QI_OK;
}

int qi_engine_neuron_unit(const qi_model *m) {
    if (m->hp.n_layer < 1 || qi_ffn_gate_free(m->hp.ffn_act)) return 0;
    return qi_ffn_split_unit(&m->layers[0]);
}

/* One side of a split layer's FFN, gate, up and down in w, prepared on
 * device d: a buffer of its own where d holds a copy (*buf, NULL when d
 * computes on the host's gathered rows), each matrix at offs[i] in it
 * (offs may be NULL). */
static qi_status neuron_prepare(qi_engine *e, int d, int l, const qi_weight *w, qi_weight *out, qi_buf **buf,
                                size_t *offs, qi_err *err) {
    qi_backend *b = e->dev[d].be;
    size_t total = 0, sz[3];
    for (int i = 0; i < 3; i++) total += walign(sz[i] = qi_dev_weight_size(b, &w[i], true));
    *buf = NULL;
    char what[48];
    snprintf(what, sizeof what, "layer %d's hot neurons", l);
    qi_status st = total ? qi_buf_alloc(b, total, what, buf, err) : QI_OK;
    size_t off = 0;
    for (int i = 0; i < 3 && !st; i++) {
        if (offs) offs[i] = off;
        st = qi_dev_weight_prepare(b, &w[i], true, qi_view_of(*buf, off), &out[i], err);
        off += walign(sz[i]);
    }
    return st;
}

/* A unit's bytes: its gate rows, its up rows, and its block of one row of
 * down. */
static void unit_bytes(const qi_layer *ly, int unit, size_t *gb, size_t *ub, size_t *blk) {
    *gb = (size_t)unit * ly->w_gate.row_bytes;
    *ub = (size_t)unit * ly->w_up.row_bytes;
    *blk = qi_type_get(ly->w_down.type)->size;
}

/* Unit u of layer l's model bytes into position k of the cold side, in
 * place: its gate and up rows and its block of every row of down, and
 * those columns of down's column form under cats. The CPU computes on the
 * gathered bytes as they are (live_setup checks), so nothing else moves. */
static qi_status cold_put(qi_engine *e, int l, int k, int u, qi_err *err) {
    const qi_layer *ly = &e->m->layers[l];
    qi_ffn_split *sp = &e->ns[l];
    size_t gb, ub, blk;
    unit_bytes(ly, sp->unit, &gb, &ub, &blk);
    memcpy((char *)sp->gate[0].data + (size_t)k * gb, (const char *)ly->w_gate.data + (size_t)u * gb, gb);
    memcpy((char *)sp->up[0].data + (size_t)k * ub, (const char *)ly->w_up.data + (size_t)u * ub, ub);
    for (int64_t r = 0; r < ly->w_down.n_rows; r++)
        memcpy((char *)sp->down[0].data + (size_t)r * sp->down[0].row_bytes + (size_t)k * blk,
               (const char *)ly->w_down.data + (size_t)r * ly->w_down.row_bytes + (size_t)u * blk, blk);
    return e->ns_cw[l].codes ? qi_colw_update(&e->ns_cw[l], &sp->down[0], (int64_t)k * sp->unit, sp->unit, err)
                             : QI_OK;
}

/* A swap's failure: the first is kept, and every later step is refused
 * (a unit may be on neither side). From either thread. */
static void swap_failed(qi_engine *e, qi_status st, const qi_err *se) {
    if (e->swap_mu_made) pthread_mutex_lock(&e->swap_mu);
    if (!e->live_st) {
        e->live_st = st;
        if (se) e->live_err = *se; /* a step's err may be NULL */
    }
    if (e->swap_mu_made) pthread_mutex_unlock(&e->swap_mu);
}

static qi_status swap_state(qi_engine *e, qi_err *out) {
    if (e->swap_mu_made) pthread_mutex_lock(&e->swap_mu);
    const qi_status st = e->live_st;
    if (st && out) *out = e->live_err;
    if (e->swap_mu_made) pthread_mutex_unlock(&e->swap_mu);
    return st;
}

/* Uploads of unit u of layer l into fast slot s, queued on the fast
 * device's stream (ordered before the ops queued after them): its gate
 * rows (one copy), up rows (one copy) and block of every row of down (one
 * strided copy: the slot's blocks are a column of blocks in the matrix).
 * u < 0: zeros into the gate rows alone (the slot then computes nothing). */
static qi_status slot_put(qi_engine *e, int l, int u, int s, qi_err *err) {
    const qi_layer *ly = &e->m->layers[l];
    const qi_ffn_split *sp = &e->ns[l];
    qi_backend *fb = e->dev[e->o.neuron_dev].be;
    qi_buf *buf = e->ns_buf[l][1];
    size_t gb, ub, blk;
    unit_bytes(ly, sp->unit, &gb, &ub, &blk);
    qi_status st = qi_dev_upload(fb, qi_view_of(buf, e->ns_off[l][0] + (size_t)s * gb),
                                 u < 0 ? e->ns_zero : (const char *)ly->w_gate.data + (size_t)u * gb, gb, err);
    if (!st && u >= 0)
        st = qi_dev_upload(fb, qi_view_of(buf, e->ns_off[l][1] + (size_t)s * ub),
                           (const char *)ly->w_up.data + (size_t)u * ub, ub, err);
    if (!st && u >= 0)
        st = qi_dev_upload_2d(fb, qi_view_of(buf, e->ns_off[l][2] + (size_t)s * blk), (size_t)sp->down[1].row_bytes,
                              (const char *)ly->w_down.data + (size_t)u * blk, (size_t)ly->w_down.row_bytes, blk,
                              (size_t)ly->w_down.n_rows, err);
    return st;
}

static void swap_count(qi_engine *e, int l) {
    const qi_layer *ly = &e->m->layers[l];
    size_t gb, ub, blk;
    unit_bytes(ly, e->ns[l].unit, &gb, &ub, &blk);
    if (e->swap_mu_made) pthread_mutex_lock(&e->swap_mu);
    e->swaps.swaps++;
    e->swaps.bytes += (double)(gb + ub + blk * (size_t)ly->w_down.n_rows);
    if (e->swap_mu_made) pthread_mutex_unlock(&e->swap_mu);
}

/* With the background worker, no hold on the layer: unit a of layer l
 * uploaded into the staging buffer on the fast device's copy stream, so
 * the link's time overlaps the steps' ops instead of queueing among them
 * (on a device with one stream it is queued there, as before). Staging,
 * not the slot: a step may be computing the slot meanwhile (its gate rows
 * zero, so it adds act(0) x up = 0), and the copy stream runs beside the
 * step's ops, so bytes half written there could make that 0 x NaN. The
 * last swap's read of the staging into its slot is waited for first.
 * With neuron_swap_main_stream the uploads go on the main stream instead
 * (the ablation: the link's time among the ops again). */
static qi_status stage_put(qi_engine *e, int l, int a, qi_err *err) {
    const qi_layer *ly = &e->m->layers[l];
    qi_backend *fb = e->dev[e->o.neuron_dev].be;
    const qi_stream q = e->o.neuron_swap_main_stream ? QI_STREAM_MAIN : QI_STREAM_COPY;
    size_t gb, ub, blk;
    unit_bytes(ly, e->ns[l].unit, &gb, &ub, &blk);
    if (e->ns_stage_read) qi_event_sync(e->ns_stage_read);
    qi_event_free(e->ns_stage_read); /* after it, the main stream has passed its wait for ns_stage_up */
    qi_event_free(e->ns_stage_up);
    e->ns_stage_read = e->ns_stage_up = NULL;
    qi_status st = qi_dev_upload_on(fb, q, qi_view_of(e->ns_stage, 0),
                                    (const char *)ly->w_gate.data + (size_t)a * gb, gb, err);
    if (!st)
        st = qi_dev_upload_on(fb, q, qi_view_of(e->ns_stage, gb),
                              (const char *)ly->w_up.data + (size_t)a * ub, ub, err);
    if (!st)
        st = qi_dev_upload_2d_on(fb, q, qi_view_of(e->ns_stage, gb + ub), blk,
                                 (const char *)ly->w_down.data + (size_t)a * blk, (size_t)ly->w_down.row_bytes, blk,
                                 (size_t)ly->w_down.n_rows, err);
    if (!st) st = qi_event_record_on(fb, q, &e->ns_stage_up, err);
    return st;
}

/* Under layer l's write hold: the staged unit into fast slot s on the
 * main stream, after the uploads (a copy within the device's memory). */
static qi_status stage_take(qi_engine *e, int l, int s, qi_err *err) {
    const qi_layer *ly = &e->m->layers[l];
    const qi_ffn_split *sp = &e->ns[l];
    qi_backend *fb = e->dev[e->o.neuron_dev].be;
    qi_buf *buf = e->ns_buf[l][1];
    size_t gb, ub, blk;
    unit_bytes(ly, sp->unit, &gb, &ub, &blk);
    qi_status st = e->ns_stage_up ? qi_event_wait(fb, e->ns_stage_up, err) : QI_OK;
    if (!st)
        st = qi_dev_copy(fb, qi_view_of(buf, e->ns_off[l][0] + (size_t)s * gb), qi_view_of(e->ns_stage, 0), gb, err);
    if (!st)
        st = qi_dev_copy(fb, qi_view_of(buf, e->ns_off[l][1] + (size_t)s * ub), qi_view_of(e->ns_stage, gb), ub, err);
    if (!st)
        st = qi_dev_copy_2d(fb, qi_view_of(buf, e->ns_off[l][2] + (size_t)s * blk), (size_t)sp->down[1].row_bytes,
                            qi_view_of(e->ns_stage, gb + ub), blk, blk, (size_t)ly->w_down.n_rows, err);
    if (!st) st = qi_event_record(fb, &e->ns_stage_read, err);
    return st;
}

/* The swap's copy (qi_neuron_copy_fn). Between steps, in the engine's
 * thread: unit a of layer l into fast slot s, whose unit b has just left
 * it, all of a's bytes queued at once, and b written into a's position
 * on the cold side, in place. So a swap moves two units' bytes, whatever
 * the layer's size. With the background worker (no hold on the layer: a
 * step may be computing it): a's bytes into the staging (stage_put); the
 * slot's gate rows stay zero until live_enter moves them in. */
static int live_copy(void *ctx, int l, int a, int s) {
    qi_engine *e = ctx;
    const size_t nu = (size_t)e->ns[l].n_units;
    qi_err se = {0};
    if (swap_state(e, NULL)) return -1;
    if (e->o.neuron_swap_worker) {
        const qi_status st = stage_put(e, l, a, &se);
        if (st) swap_failed(e, st, &se);
        if (e->ns_stall_us > 0) { /* tests: until a step has met the layer mid-swap, or stall_us */
            /* and until the uploads have run, while steps compute the
             * emptied slot (a copy stream that writes slowly is then met
             * writing, whatever the order of its copies) */
            if (!st && e->ns_stage_up) qi_event_sync(e->ns_stage_up);
            const long mid0 = atomic_load(&e->ns_mid);
            const double t0 = now_s();
            const struct timespec ts = {0, 50000};
            while (atomic_load(&e->ns_mid) == mid0 && now_s() - t0 < 1e-6 * e->ns_stall_us) nanosleep(&ts, NULL);
        }
        return st ? -1 : 0;
    }
    int32_t *hot = e->ns_hot + (size_t)l * nu, *cold = e->ns_cold + (size_t)l * nu, *cpos = e->ns_cpos + (size_t)l * nu;
    const int b = hot[s], k = cpos[a];
    QI_ASSERT(b >= 0 && k >= 0 && cpos[b] < 0);
    qi_status st = slot_put(e, l, a, s, &se);
    if (!st) st = cold_put(e, l, k, b, &se);
    if (st) { /* b is now on neither side: the engine stops */
        swap_failed(e, st, &se);
        return -1;
    }
    hot[s] = a, cold[k] = b, cpos[a] = -1, cpos[b] = k;
    swap_count(e, l);
    return 0;
}

/* With the background worker, under layer l's write hold (no step is
 * computing it). Unit b has left slot s: the slot's gate rows zeroed (it
 * computes act(0) x up = 0 until a unit enters it), b written into the
 * spare position of the cold side. */
static void live_leave(void *ctx, int l, int b, int s) {
    qi_engine *e = ctx;
    const size_t nu = (size_t)e->ns[l].n_units;
    int32_t *hot = e->ns_hot + (size_t)l * nu, *cold = e->ns_cold + (size_t)l * nu, *cpos = e->ns_cpos + (size_t)l * nu;
    const int k = e->ns_spare[l];
    qi_err se = {0};
    QI_ASSERT(hot[s] == b && cpos[b] < 0);
    hot[s] = -1;
    qi_status st = k < 0 ? QI_ERR(&se, QI_ERR_BACKEND, "layer %d: no spare place on the cold side for unit %d", l, b)
                         : slot_put(e, l, -1, s, &se);
    if (!st) st = cold_put(e, l, k, b, &se);
    if (st) {
        swap_failed(e, st, &se);
        return;
    }
    cold[k] = b, cpos[b] = k, e->ns_spare[l] = -1;
}

/* Unit a has entered slot s (its bytes staged, stage_put): the staging
 * copied into the slot on the main stream, and a's cold position made the
 * spare, the gate rows there zeroed (they compute nothing; down's blocks
 * stay, and so does the column form, which only the kept neurons' columns
 * are read of). */
static void live_enter(void *ctx, int l, int a, int s) {
    qi_engine *e = ctx;
    const qi_ffn_split *sp = &e->ns[l];
    const size_t nu = (size_t)sp->n_units;
    int32_t *hot = e->ns_hot + (size_t)l * nu, *cold = e->ns_cold + (size_t)l * nu, *cpos = e->ns_cpos + (size_t)l * nu;
    const int k = cpos[a];
    qi_err se = {0};
    QI_ASSERT(hot[s] == -1 && k >= 0 && e->ns_spare[l] < 0);
    const qi_status st = stage_take(e, l, s, &se);
    if (st) {
        swap_failed(e, st, &se);
        return;
    }
    size_t gb, ub, blk;
    unit_bytes(&e->m->layers[l], sp->unit, &gb, &ub, &blk);
    memset((char *)sp->gate[0].data + (size_t)k * gb, 0, gb);
    hot[s] = a, cpos[a] = -1, cold[k] = -1, e->ns_spare[l] = k;
    swap_count(e, l);
}

static qi_status live_setup(qi_engine *e, int unit, int nu, qi_err *err) {
    const int L = e->m->hp.n_layer;
    const bool bg = e->o.neuron_swap_worker;
    const size_t n = (size_t)L * (size_t)nu;
    uint64_t *nb = qi_malloc(sizeof *nb * (size_t)L);
    e->ns_hot = qi_malloc(sizeof(int32_t) * n);
    e->ns_cold = qi_malloc(sizeof(int32_t) * (n + (size_t)L)); /* a spare position each */
    e->ns_cpos = qi_malloc(sizeof(int32_t) * n);
    e->ns_feed = qi_malloc(sizeof(double) * (size_t)nu);
    e->ns_spare = qi_malloc(sizeof(int32_t) * (size_t)L);
    size_t zb = 0, stage = 0;
    for (int l = 0; l < L; l++) {
        const qi_layer *ly = &e->m->layers[l];
        size_t gb, ub, blk;
        unit_bytes(ly, unit, &gb, &ub, &blk);
        zb = gb > zb ? gb : zb;
        const size_t sb = gb + ub + blk * (size_t)ly->w_down.n_rows;
        stage = sb > stage ? sb : stage;
    }
    if (bg) {
        e->ns_zero = qi_calloc(zb ? zb : 1, 1);
        e->ns_acc = qi_calloc(n, sizeof(double));
        e->ns_acc_tok = qi_calloc((size_t)L, sizeof(long));
    }
    if (!nb || !e->ns_hot || !e->ns_cold || !e->ns_cpos || !e->ns_feed || !e->ns_spare ||
        (bg && (!e->ns_zero || !e->ns_acc || !e->ns_acc_tok))) {
        qi_free(nb);
        return QI_ERR(err, QI_ERR_NOMEM, "out of memory for the swap worker");
    }
    qi_backend *fb = e->dev[e->o.neuron_dev].be;
    qi_status st = bg ? qi_buf_alloc(fb, stage, "a neuron swap's staging", &e->ns_stage, err) : QI_OK;
    if (st) {
        qi_free(nb);
        return st;
    }
    for (int l = 0; l < L; l++) {
        const qi_layer *ly = &e->m->layers[l];
        size_t gb, ub, blk;
        unit_bytes(ly, unit, &gb, &ub, &blk);
        nb[l] = gb + ub + blk * (uint64_t)ly->w_down.n_rows;
        /* both sides in the mask's order: slots and cold positions by
         * unit, the spare (with the worker) last */
        int32_t *hot = e->ns_hot + (size_t)l * nu, *cold = e->ns_cold + (size_t)l * nu, *cpos = e->ns_cpos + (size_t)l * nu;
        int k = 0;
        for (int u = 0, s = 0; u < nu; u++) {
            hot[u] = cold[u] = -1;
            if (e->ns_mask[(size_t)l * nu + u]) {
                hot[s++] = u, cpos[u] = -1;
            } else {
                cold[k] = u, cpos[u] = k++;
            }
        }
        e->ns_spare[l] = e->ns[l].spare ? k : -1;
        /* a swap copies a unit's rows and blocks as the file has them, and
         * rewrites the CPU's gathered bytes in place */
        for (int i = 0; i < 3 && e->ns[l].n[1]; i++) {
            const qi_weight *w = i == 0 ? &e->ns[l].gate[1] : i == 1 ? &e->ns[l].up[1] : &e->ns[l].down[1];
            if (w->data && qi_dev_weight_size(fb, w, true) != (size_t)(w->row_bytes * (uint64_t)w->n_rows)) {
                qi_free(nb);
                return QI_ERR(err, QI_ERR_UNSUPPORTED, "swapping neurons copies their rows as the file has them, "
                              "and device %s keeps weights in a form of its own", qi_dev_info_get(fb)->name);
            }
        }
        if (e->ns_buf[l][0]) {
            qi_free(nb);
            return QI_ERR(err, QI_ERR_UNSUPPORTED, "swapping neurons rewrites the cold side's bytes in place, and "
                          "the cpu keeps layer %d's cold weights in a form of its own", l);
        }
    }
    st = qi_neuron_live_create(L, nu, e->ns_mask, e->o.neuron_activity, nb, e->o.neuron_live, live_copy, NULL, e,
                               &e->live, err);
    qi_free(nb);
    if (st || !bg) return st;
    if (pthread_mutex_init(&e->swap_mu, NULL))
        return QI_ERR(err, QI_ERR_BACKEND, "cannot make the swap worker's lock");
    e->swap_mu_made = true;
    qi_neuron_live_hooks(e->live, live_leave, live_enter);
    return qi_neuron_live_start(e->live, err);
}

/* Between steps, every neuron_swap_every steps: a round of swaps, its
 * copies waited for, so that a failure stops the step that made it (a
 * failed swap leaves a unit on neither side, so the engine then fails for
 * good); or, with the background worker, the activity summed since the
 * last time fed to it, which wakes it. */
static qi_status live_round(qi_engine *e, qi_err *err) {
    if (!e->live || ++e->live_steps % e->o.neuron_swap_every) return QI_OK;
    if (e->o.neuron_swap_worker) {
        const int L = e->m->hp.n_layer;
        const qi_status st = qi_neuron_live_feed_all(e->live, e->ns_acc, e->ns_acc_tok, err);
        memset(e->ns_acc, 0, sizeof(double) * (size_t)L * (size_t)e->m->hp.n_ff / (size_t)qi_engine_neuron_unit(e->m));
        memset(e->ns_acc_tok, 0, sizeof(long) * (size_t)L);
        return st;
    }
    const double t0 = now_s();
    qi_neuron_live_rebalance(e->live);
    e->swaps.rounds++;
    qi_err se = {0};
    const qi_status st = qi_dev_synchronize(e->dev[e->o.neuron_dev].be, &se);
    if (st) swap_failed(e, st, &se);
    e->swaps.seconds += now_s() - t0;
    return swap_state(e, &se) ? QI_ERR(err, e->live_st, "a neuron swap's copy: %s", se.msg) : QI_OK;
}

void qi_engine_neuron_swaps_get(const qi_engine *e, qi_engine_neuron_swaps *out) {
    qi_engine *m = (qi_engine *)e; /* the lock only */
    if (m->swap_mu_made) pthread_mutex_lock(&m->swap_mu);
    *out = e->swaps;
    if (m->swap_mu_made) pthread_mutex_unlock(&m->swap_mu);
    if (e->o.neuron_swap_worker && e->live) { /* the worker's rounds, not the feeds */
        qi_neuron_live_stats ls;
        qi_neuron_live_stats_get(e->live, &ls);
        out->rounds = ls.rounds;
        out->copy_stream = !e->o.neuron_swap_main_stream && qi_dev_has_copy_stream(e->dev[e->o.neuron_dev].be);
    }
}

double qi_engine_neuron_time(void *engine, int fast, int n_neurons, int batch) {
    qi_engine *e = engine;
    const qi_model *m = e->m;
    const int unit = qi_engine_neuron_unit(m);
    const long R = (long)e->o.step_tokens + e->o.max_seqs;
    if (e->plan.n_devices < 2 || unit < 1 || batch < 1 || batch > R || n_neurons < 1 || n_neurons > m->hp.n_ff)
        return NAN;
    const int nu = m->hp.n_ff / unit, k = (n_neurons + unit - 1) / unit;
    uint8_t *mask = qi_calloc((size_t)nu, 1);
    if (!mask) return NAN;
    for (int u = 0; u < k; u++) mask[u] = 1;
    qi_ffn_split sp;
    qi_err err = {0};
    double t = NAN;
    if (qi_ffn_split_build(&m->layers[0], mask, !qi_gguf_shapes_only(m->gguf), &sp, &err) == QI_OK) {
        const dev_state *D = &e->dev[fast ? 1 : 0];
        const qi_weight w[3] = {sp.gate[1], sp.up[1], sp.down[1]};
        qi_weight dw[3];
        qi_buf *buf = NULL;
        qi_event *a = NULL, *b = NULL;
        /* the pair NEURON_TIME_ITERS times between the events, so that a
         * small model's products stand above the timer's noise */
        enum { NEURON_TIME_ITERS = 8 };
        bool ok = !neuron_prepare(e, fast ? 1 : 0, 0, w, dw, &buf, NULL, &err) && !qi_dev_synchronize(D->be, &err) &&
                  !qi_event_record(D->be, &a, &err);
        for (int i = 0; i < NEURON_TIME_ITERS && ok; i++)
            ok = !qi_backend_matmul_n(D->be, (const qi_weight *const[]){&dw[1]}, (float *const[]){D->up}, 1, D->xn,
                                      batch, &err) &&
                 !qi_backend_matmul_n(D->be, (const qi_weight *const[]){&dw[2]}, (float *const[]){D->x}, 1, D->up,
                                      batch, &err);
        if (ok && !qi_event_record(D->be, &b, &err)) {
            qi_event_sync(b);
            t = qi_event_elapsed(a, b) / NEURON_TIME_ITERS;
        }
        qi_dev_synchronize(D->be, &err);
        qi_event_free(a);
        qi_event_free(b);
        qi_buf_free(buf);
        qi_ffn_split_free(&sp);
    }
    qi_free(mask);
    return t;
}

/* One layer's check (qi_engine_neuron_check): slot s of the fast side
 * (its bytes in fast, copied back) and the cold side's k-th unit against
 * the model's unit u. */
static bool unit_bytes_eq(const qi_layer *ly, const qi_ffn_split *sp, const char *gate, const char *up,
                          const char *down, uint64_t drow, int k, int u) {
    size_t gb, ub, blk;
    unit_bytes(ly, sp->unit, &gb, &ub, &blk);
    if (memcmp(gate + (size_t)k * gb, (const char *)ly->w_gate.data + (size_t)u * gb, gb) ||
        memcmp(up + (size_t)k * ub, (const char *)ly->w_up.data + (size_t)u * ub, ub))
        return false;
    for (int64_t r = 0; r < ly->w_down.n_rows; r++)
        if (memcmp(down + (size_t)r * drow + (size_t)k * blk,
                   (const char *)ly->w_down.data + (size_t)r * ly->w_down.row_bytes + (size_t)u * blk, blk))
            return false;
    return true;
}

/* The cold side's column form (cats) against one made afresh from its
 * down: the same matrix (qi_colw_same). */
static qi_status colw_check(const qi_colw *c, const qi_weight *down, int l, qi_err *err) {
    qi_colw f;
    qi_status st = qi_colw_build(down, &f, err);
    if (st) return st;
    if (!qi_colw_same(c, &f)) st = QI_ERR(err, QI_ERR_BACKEND, "layer %d: the cold side's column form is not its down's", l);
    qi_colw_free(&f);
    return st;
}

/* Layer l's two sides against the model, slot[] the units in the fast
 * slots (-1: empty, its gate rows then zero: it computes nothing): each
 * slot's bytes copied back, each cold position's unit (the spare's gate
 * rows zero), every unit in exactly one place, the column form its
 * down's. */
static qi_status check_layer(qi_engine *e, int l, const int32_t *slot, qi_err *err) {
    const qi_ffn_split *sp = &e->ns[l];
    const qi_layer *ly = &e->m->layers[l];
    qi_backend *fb = e->dev[e->o.neuron_dev].be;
    const int nu = sp->n_units, n1 = sp->n[1] / sp->unit;
    const size_t total = qi_buf_size(e->ns_buf[l][1]);
    char *host = qi_malloc(total);
    uint8_t *seen = qi_calloc((size_t)nu, 1);
    qi_status st = !host || !seen ? QI_ERR(err, QI_ERR_NOMEM, "out of memory checking layer %d", l) : QI_OK;
    /* what the main stream has made of the slots (the ops' order; the
     * copy stream's work reaches the slots only through it) */
    qi_event *ev = NULL;
    if (!st && !(st = qi_dev_download(fb, host, qi_view_of(e->ns_buf[l][1], 0), total, err)) &&
        !(st = qi_event_record(fb, &ev, err))) {
        qi_event_sync(ev);
        qi_event_free(ev);
    }
    size_t gb, ub, blk;
    unit_bytes(ly, sp->unit, &gb, &ub, &blk);
    const size_t *off = e->ns_off[l];
    for (int s = 0; s < n1 && !st; s++) {
        if (slot[s] < 0 && e->o.neuron_swap_worker) { /* emptied by a swap in progress */
            for (size_t i = 0; i < gb && !st; i++)
                if (host[off[0] + (size_t)s * gb + i])
                    st = QI_ERR(err, QI_ERR_BACKEND, "layer %d: the fast device's empty slot %d computes", l, s);
            continue;
        }
        if (slot[s] < 0 || slot[s] >= nu || seen[slot[s]] ||
            !unit_bytes_eq(ly, sp, host + off[0], host + off[1], host + off[2], sp->down[1].row_bytes, s, slot[s]))
            st = QI_ERR(err, QI_ERR_BACKEND, "layer %d: the fast device's slot %d does not hold unit %d", l, s, slot[s]);
        else
            seen[slot[s]] = 1;
    }
    /* the cold side's positions: the units in no slot, in order, or where
     * swaps put them */
    for (int k = 0, u = 0; k < sp->n[0] / sp->unit && !st; k++) {
        while (!e->live && u < nu && seen[u]) u++;
        const int cu = e->live ? e->ns_cold[(size_t)l * nu + k] : u++;
        if (cu < 0 && e->live && k == e->ns_spare[l]) { /* the spare: zero gate rows, computing nothing */
            for (size_t i = 0; i < gb && !st; i++)
                if (((const char *)sp->gate[0].data)[(size_t)k * gb + i])
                    st = QI_ERR(err, QI_ERR_BACKEND, "layer %d: the cold side's spare place %d computes", l, k);
            continue;
        }
        if (cu < 0 || cu >= nu || seen[cu])
            st = QI_ERR(err, QI_ERR_BACKEND, "layer %d: the cold side's position %d holds unit %d, which is "
                        "elsewhere too", l, k, cu);
        else if (!unit_bytes_eq(ly, sp, sp->gate[0].data, sp->up[0].data, sp->down[0].data, sp->down[0].row_bytes, k,
                                cu))
            st = QI_ERR(err, QI_ERR_BACKEND, "layer %d: the cold side's unit %d is not the model's unit %d", l, k, cu);
        else
            seen[cu] = 1;
    }
    for (int u = 0; u < nu && !st; u++)
        if (!seen[u]) st = QI_ERR(err, QI_ERR_BACKEND, "layer %d: unit %d is on neither side", l, u);
    if (!st && e->ns_cw[l].codes) st = colw_check(&e->ns_cw[l], &sp->down[0], l, err);
    qi_free(seen);
    qi_free(host);
    return st;
}

qi_status qi_engine_neuron_check(qi_engine *e, qi_err *err) {
    if (!e->ns || qi_gguf_shapes_only(e->m->gguf)) return QI_OK;
    if (e->live) qi_neuron_live_sync(e->live); /* the background worker's swaps of what was fed */
    qi_status st = QI_OK;
    for (int l = 0; l < e->m->hp.n_layer && !st; l++) {
        const qi_ffn_split *sp = &e->ns[l];
        if (!sp->n[1]) continue;
        const int nu = sp->n_units;
        /* the units in the slots: the live state's (held still), or the
         * mask's in order */
        if (e->live) {
            qi_neuron_live_view v;
            qi_neuron_live_begin(e->live, l, &v);
            st = qi_neuron_live_view_check(&v, l, err);
            if (!st) st = check_layer(e, l, v.slot, err);
            qi_neuron_live_end(e->live, l);
            continue;
        }
        int32_t *slot = qi_malloc(sizeof(int32_t) * (size_t)nu);
        if (!slot) return QI_ERR(err, QI_ERR_NOMEM, "out of memory checking layer %d", l);
        for (int u = 0, s = 0; u < nu; u++)
            if (e->ns_mask[(size_t)l * nu + u]) slot[s++] = u;
        st = check_layer(e, l, slot, err);
        qi_free(slot);
    }
    return st;
}

void qi_engine_neuron_check_steps(qi_engine *e, bool on, int stall_us) {
    e->ns_check_steps = on;
    e->ns_stall_us = stall_us;
}

/* opts.neuron_fast: checked against the model, the plan and the other
 * options, each split layer's FFN gathered into its two sides and the fast
 * side prepared on neuron_dev; the plan's ffn_dev and ffn_rows say so. */
static qi_status neuron_setup(qi_engine *e, qi_err *err) {
    const qi_model *m = e->m;
    const qi_hparams *hp = &m->hp;
    const int L = hp->n_layer, fd = e->o.neuron_dev;
    const double dens = e->o.sim_cold_density;
    if (dens != 0.0 && !(dens > 0.0 && dens <= 1.0))
        return QI_ERR(err, QI_ERR_INVALID, "sim_cold_density %g is outside (0, 1]", dens);
    if (dens > 0.0 && !e->o.sim)
        return QI_ERR(err, QI_ERR_INVALID, "sim_cold_density is a what-if of a simulated machine, and this one is "
                      "real (it runs cats on the CPU's neurons: sparsity)");
    if (dens > 0.0 && (qi_ffn_gate_free(hp->ffn_act) || hp->parallel))
        return QI_ERR(err, QI_ERR_UNSUPPORTED, "sim_cold_density reads up and down by gate's active neurons (cats), "
                      "and %s's MLP has no gate", hp->arch_name);
    if (!e->o.neuron_fast) return QI_OK;
    qi_plan *p = &e->plan;
    if (qi_ffn_gate_free(hp->ffn_act) || hp->parallel)
        return QI_ERR(err, QI_ERR_UNSUPPORTED, "a neuron split needs a gated MLP (llama, gemma3); %s has none",
                      hp->arch_name);
    if (fd < 1 || fd >= p->n_devices)
        return QI_ERR(err, QI_ERR_INVALID, "the neuron split's fast device %d is not one of the devices after the "
                      "cpu (%d named)", fd, p->n_devices);
    const char *other = e->o.sparsity && e->o.sparsity->mode != QI_SPARSITY_CATS
                            ? "teal sparsity (a split's hot side runs dense; cats thresholds its cold side)"
                        : e->o.ffn_observe || e->o.act_observe ? "an activation observer"
                        : e->o.repack                          ? "--repack"
                                                               : NULL;
    if (other) return QI_ERR(err, QI_ERR_UNSUPPORTED, "a neuron split and %s cannot be combined", other);
    const int unit = qi_engine_neuron_unit(m), nu = unit > 0 ? hp->n_ff / unit : 0;
    for (int l = 0; l < L; l++)
        if (qi_ffn_split_unit(&m->layers[l]) != unit)
            return QI_ERR(err, QI_ERR_UNSUPPORTED, "a neuron split moves down's blocks whole, and layer %d's are of %d "
                          "neurons where layer 0's are of %d", l, qi_ffn_split_unit(&m->layers[l]), unit);
    const size_t n = (size_t)L * (size_t)nu;
    if (!(e->o.neuron_active >= 0.0f))
        return QI_ERR(err, QI_ERR_INVALID, "neuron_active %g is negative", e->o.neuron_active);
    if (e->o.neuron_swap_every < 0)
        return QI_ERR(err, QI_ERR_INVALID, "neuron_swap_every %d is negative", e->o.neuron_swap_every);
    if (e->o.neuron_swap_every > 0 && (!e->o.neuron_live || !e->o.neuron_activity))
        return QI_ERR(err, QI_ERR_INVALID, "swapping neurons needs the rule's options and each unit's activity");
    if (e->o.neuron_swap_worker && e->o.neuron_swap_every < 1)
        return QI_ERR(err, QI_ERR_INVALID, "the background swap worker needs neuron_swap_every (how often to feed it)");
    if (e->o.neuron_swap_main_stream && !e->o.neuron_swap_worker)
        return QI_ERR(err, QI_ERR_INVALID, "neuron_swap_main_stream says where the background swap worker uploads, "
                      "and there is no worker");
    if (e->o.neuron_swap_every > 0 && e->o.sim)
        return QI_ERR(err, QI_ERR_UNSUPPORTED, "swapping neurons follows the activations, and a simulated machine "
                      "(%s) computes none", e->o.sim);
    if (e->o.neuron_active > 0.0f) e->ns_rp = qi_calloc((size_t)L, sizeof *e->ns_rp);
    if (e->o.neuron_active > 0.0f || e->o.neuron_swap_every > 0) {
        e->ns_obs = qi_malloc(sizeof(float) * ((size_t)e->o.step_tokens + (size_t)e->o.max_seqs) * (size_t)hp->n_ff);
        if ((e->o.neuron_active > 0.0f && !e->ns_rp) || !e->ns_obs)
            return QI_ERR(err, QI_ERR_NOMEM, "out of memory for the neuron counts");
    }
    e->ns_mask = qi_malloc(n);
    e->ns = qi_calloc((size_t)L, sizeof *e->ns);
    e->ns_w = qi_calloc((size_t)L, sizeof *e->ns_w);
    e->ns_buf = qi_calloc((size_t)L, sizeof *e->ns_buf);
    e->ns_cw = qi_calloc((size_t)L, sizeof *e->ns_cw);
    e->ns_off = qi_calloc((size_t)L, sizeof *e->ns_off);
    if (!e->ns_mask || !e->ns || !e->ns_w || !e->ns_buf || !e->ns_cw || !e->ns_off)
        return QI_ERR(err, QI_ERR_NOMEM, "out of memory for a neuron split of %d layers", L);
    memcpy(e->ns_mask, e->o.neuron_fast, n);
    e->o.neuron_fast = e->ns_mask;
    const bool copy = !qi_gguf_shapes_only(m->gguf);
    qi_status st;
    for (int l = 0; l < L; l++) {
        const uint8_t *mask = e->ns_mask + (size_t)l * (size_t)nu;
        int any = 0;
        for (int i = 0; i < nu; i++) any += mask[i] != 0;
        if (!any) continue;
        if (p->layers[l].mlp_dev != 0)
            return QI_ERR(err, QI_ERR_UNSUPPORTED, "the neuron split runs layer %d's cold neurons on the cpu, and the "
                          "plan puts its MLP on %s: leave the MLPs of split layers on the cpu", l,
                          p->devices[p->layers[l].mlp_dev]);
        if ((st = qi_ffn_split_build_spare(&m->layers[l], mask, copy, e->o.neuron_swap_worker ? 1 : 0, &e->ns[l], err)))
            return st;
        for (int s = 0; s < 2; s++) {
            const qi_weight w[3] = {e->ns[l].gate[s], e->ns[l].up[s], e->ns[l].down[s]};
            if (e->ns[l].n[s] &&
                (st = neuron_prepare(e, s ? fd : 0, l, w, e->ns_w[l][s], &e->ns_buf[l][s], s ? e->ns_off[l] : NULL, err)))
                return st;
        }
        /* cats on the cold side: its down read by the active columns */
        if (e->sp_w && e->ns[l].n[0] && qi_colw_supported(&e->ns[l].down[0]) &&
            (st = qi_colw_build(&e->ns[l].down[0], &e->ns_cw[l], err)))
            return st;
        p->layers[l].ffn_dev = fd;
        p->layers[l].ffn_rows = e->ns[l].n[1];
    }
    if ((st = qi_dev_synchronize(e->dev[fd].be, err))) return st;
    st = e->o.neuron_swap_every > 0 ? live_setup(e, unit, nu, err) : QI_OK;
    e->o.neuron_live = NULL; /* the caller's, read here only */
    e->o.neuron_activity = NULL;
    return st;
}

/* OPT and Falcon need ops only the simulated devices have (backend.h's
 * optional ones): refused on any device of the list without them, since a
 * placement policy may move any block to any device. */
static qi_status check_arch_ops(const qi_model *m, qi_backend *b, qi_err *err) {
    const qi_hparams *hp = &m->hp;
    const qi_backend_i *f = b->iface;
    if (!hp->layer_norm && !qi_ffn_gate_free(hp->ffn_act)) return QI_OK;
    if (f->layernorm && f->add_bias && f->act) return QI_OK;
    const bool opt = hp->arch == QI_ARCH_OPT;
    return QI_ERR(err, QI_ERR_UNSUPPORTED,
                  "%s runs on simulated devices only in this build (its LayerNorm, gate-free %s FFN%s have no "
                  "kernels on device %s): run it with --sim PROFILE",
                  opt ? "OPT" : hp->arch == QI_ARCH_FALCON ? "Falcon" : hp->arch_name, opt ? "ReLU" : "GELU",
                  opt ? ", learned positions and biases" : " and parallel block", b->info.name);
}

/* Parse and check the plan, open its devices, and give each its weights,
 * activations and KV pool. A plan that does not fit a device is refused
 * here, before any work, naming the block and the bytes short. */
static qi_status setup_devices(qi_engine *e, size_t R, qi_err *err) {
    const qi_model *m = e->m;
    const int L = m->hp.n_layer;
    qi_plan *p = &e->plan;
    qi_status st = qi_plan_devices_parse(e->o.devices ? e->o.devices : "cpu", p, err);
    if (!st) st = qi_plan_parse(e->o.placement ? e->o.placement : "all-cpu", L, p, err);
    if (!st) st = qi_plan_validate(p, err);
    if (!st) st = check_splits(e, p, err);
    if (st) return st;
    e->dev[0].be = e->be;
    e->dev[0].pool = e->pool;
    for (int d = 0; d < p->n_devices; d++) {
        dev_state *D = &e->dev[d];
        if (d > 0 && (st = open_device(e, p->devices[d], &D->be, err))) return st;
        if ((st = check_arch_ops(m, D->be, err))) return st;
        /* the name as --devices gave it, so the plan prints as it was asked */
        snprintf(D->be->info.name, sizeof D->be->info.name, "%s", p->devices[d]);
        D->layers = qi_calloc((size_t)L, sizeof *D->layers);
        D->wblk = qi_calloc((size_t)wblock_count(m), sizeof *D->wblk);
        if (!D->layers || !D->wblk) return QI_ERR(err, QI_ERR_NOMEM, "out of memory for a plan of %d layers", L);
        for (int l = 0; l < L; l++) D->layers[l].swa = m->layers[l].swa;
        if ((st = place_activations(e, d, R, err))) return st;
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
        const size_t room = dev_room(in);
        int at;
        const size_t need = weights_arriving(e, p, NULL, d, room, &at);
        if (at >= 0) {
            char name[40];
            return QI_ERR(err, QI_ERR_NOMEM,
                          "plan does not fit device %s: its weights up to %s need more than the %zu bytes left "
                          "after its activations (%zu bytes in all, %zu short)",
                          in->name, wblock_name(m, at, name, sizeof name), room, need, need - room);
        }
        for (int b = 0; b < wblock_count(m); b++)
            if (wblock_dev(p, b) == d && (st = wblock_prepare(e, D, b, &D->wblk[b], err))) return st;
        if ((st = qi_dev_synchronize(D->be, err))) return st;
        if (d == 0) continue; /* the CPU's pool is the engine's */
        bool attn = false;
        for (int l = 0; l < L; l++) attn |= p->layers[l].attn_dev == d || (p->layers[l].split > 0.0f && p->layers[l].split_dev == d);
        if (attn && (st = qi_kv_pool_create(D->be, m->hp.head_dim, e->o.kv_max_bytes, &D->pool, err))) return st;
    }
    return QI_OK;
}

const qi_plan *qi_engine_plan(const qi_engine *e) { return &e->plan; }

int qi_engine_n_packed(const qi_engine *e) {
    int n = 0;
    for (int b = 0; b < wblock_count(e->m); b++) {
        const qi_weight *src[QI_PLAN_BLOCK_MAX_WEIGHTS];
        qi_weight *dst[QI_PLAN_BLOCK_MAX_WEIGHTS];
        bool mm[QI_PLAN_BLOCK_MAX_WEIGHTS];
        const int k = wblock_weights(e->m, (dev_state *)&e->dev[wblock_dev(&e->plan, b)], b, src, dst, mm);
        for (int i = 0; i < k; i++) n += mm[i] && dst[i]->packed;
    }
    return n;
}

/* ---- a new plan between steps --------------------------------------------------------- */

/* Is a layer's working KV homed differently under plan q than under p? */
static bool kv_moves(const qi_plan_layer *a, const qi_plan_layer *b) {
    return a->attn_dev != b->attn_dev || a->split != b->split || (a->split > 0.0f && a->split_dev != b->split_dev);
}

/* The KV bytes (upper bound: the blocks the moves take beyond those free
 * in the pool) a new plan p brings to device d's pool, from the working
 * blocks of the streams whose home changes. */
static size_t kv_arriving(const qi_engine *e, const qi_plan *p, int d) {
    const qi_hparams *hp = &e->m->hp;
    long blocks = 0;
    for (int l = 0; l < hp->n_layer; l++) {
        const qi_plan_layer *y = &p->layers[l];
        if (!kv_moves(&e->plan.layers[l], y) || (y->attn_dev != d && !(y->split > 0.0f && y->split_dev == d)))
            continue;
        for (int i = 0; i < e->o.max_seqs; i++) {
            if (!e->seqs[i].used) continue;
            for (int h = 0; h < hp->n_head_kv; h++) blocks += stream_of(e, &e->seqs[i], l, h)->work.n_blocks;
        }
    }
    const qi_kv_pool *pool = e->dev[d].pool;
    if (pool) blocks -= qi_kv_pool_n_free(pool);
    return blocks > 0 ? (size_t)blocks * (2 * QI_KV_BLOCK * (size_t)hp->head_dim * sizeof(uint16_t)) : 0;
}

/* Every device waited for; the first failure recorded inside one (a copy
 * that failed on a worker) is returned, each device's record cleared. */
static qi_status sync_all(qi_engine *e, qi_err *err) {
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

qi_status qi_engine_replan(qi_engine *e, const qi_plan *np, qi_engine_replan_cost *cost, qi_err *err) {
    const qi_model *m = e->m;
    const int L = m->hp.n_layer, Hkv = m->hp.n_head_kv, NB = wblock_count(m);
    const double t0 = eclock(e);
    qi_engine_replan_cost c = {0};
    if (cost) *cost = c;
    qi_status st;
    if (np->n_layer != L)
        return QI_ERR(err, QI_ERR_INVALID, "new plan has %d layers, the model %d", np->n_layer, L);
    if (np->n_devices != e->plan.n_devices)
        return QI_ERR(err, QI_ERR_INVALID, "new plan names %d devices, the engine has %d (devices are fixed at "
                      "creation)", np->n_devices, e->plan.n_devices);
    for (int d = 0; d < np->n_devices; d++)
        if (strcmp(np->devices[d], e->plan.devices[d]) != 0)
            return QI_ERR(err, QI_ERR_INVALID, "new plan's device %d is %s, the engine's %s (devices are fixed at "
                          "creation)", d, np->devices[d], e->plan.devices[d]);
    if (e->ns)
        return QI_ERR(err, QI_ERR_UNSUPPORTED, "the engine runs a neuron split, which is fixed at creation: no new "
                      "plan");
    if ((st = qi_plan_validate(np, err)) || (st = check_splits(e, np, err)) || (st = check_observe(e, np, err)) ||
        (st = check_sparse(e, np, err)) || (st = check_picks(e, np, err)))
        return st;
    /* refused before any work when what arrives on a device does not fit
     * beside what is there (a block leaves only once its move is done) */
    for (int d = 1; d < np->n_devices; d++) {
        const qi_dev_info *in = qi_dev_info_get(e->dev[d].be);
        const size_t room = dev_room(in);
        int at;
        const size_t w = weights_arriving(e, np, &e->plan, d, room, &at);
        const size_t kv = kv_arriving(e, np, d);
        if (at >= 0 || (room != SIZE_MAX && w + kv > room)) {
            char name[40];
            return QI_ERR(err, QI_ERR_NOMEM,
                          "new plan does not fit device %s: %s%s%s%zu bytes of weights and %zu of KV blocks move there, "
                          "%zu bytes are left (%zu short)",
                          in->name, at >= 0 ? "the weights pass its room at " : "",
                          at >= 0 ? wblock_name(m, at, name, sizeof name) : "", at >= 0 ? "; " : "", w, kv, room,
                          w + kv - room);
        }
    }
    qi_plan next = {0};
    qi_buf **nblk = qi_calloc((size_t)NB, sizeof *nblk);
    const long n_streams = (long)e->o.max_seqs * L * Hkv;
    qi_kv_rehome *undo = qi_calloc((size_t)n_streams, sizeof *undo);
    if (!nblk || !undo || (st = qi_plan_copy(&next, np, err))) {
        qi_free(nblk);
        qi_free(undo);
        return nblk && undo ? st : QI_ERR(err, QI_ERR_NOMEM, "out of memory for a new plan");
    }
    /* the blocks that arrive on a device, prepared there */
    for (int b = 0; b < NB && !st; b++) {
        const int nd = wblock_dev(np, b);
        if (nd == wblock_dev(&e->plan, b)) continue;
        if (!(st = wblock_prepare(e, &e->dev[nd], b, &nblk[b], err)))
            c.weight_bytes += (double)wblock_bytes(m, &e->dev[nd], b);
    }
    /* pools where attention now runs, then every stream whose home moves */
    for (int l = 0; l < L && !st; l++) {
        const qi_plan_layer *y = &np->layers[l];
        const int ds[2] = {y->attn_dev, y->split > 0.0f ? y->split_dev : -1};
        for (int k = 0; k < 2 && !st; k++)
            if (ds[k] >= 0 && !e->dev[ds[k]].pool)
                st = qi_kv_pool_create(e->dev[ds[k]].be, m->hp.head_dim, e->o.kv_max_bytes, &e->dev[ds[k]].pool, err);
    }
    for (int l = 0; l < L && !st; l++) {
        const qi_plan_layer *y = &np->layers[l];
        if (!kv_moves(&e->plan.layers[l], y)) continue;
        qi_kv_pool *wp = e->dev[y->attn_dev].pool, *sp = y->split > 0.0f ? e->dev[y->split_dev].pool : NULL;
        for (int i = 0; i < e->o.max_seqs && !st; i++) {
            if (!e->seqs[i].used) continue;
            for (int h = 0; h < Hkv && !st; h++) {
                const long k = ((long)i * L + l) * Hkv + h;
                int moved = 0;
                st = qi_kv_stream_rehome(stream_of(e, &e->seqs[i], l, h), wp, sp, y->split, &undo[k], &moved, err);
                c.kv_blocks += moved;
            }
        }
    }
    /* every upload and copy done, or the first failure among them */
    qi_err se = {0};
    const qi_status fin = sync_all(e, st ? &se : err);
    if (!st) st = fin;
    for (int i = 0; i < e->o.max_seqs; i++) {
        if (!e->seqs[i].used) continue;
        for (int l = 0; l < L; l++)
            for (int h = 0; h < Hkv; h++) {
                qi_kv_rehome *u = &undo[((long)i * L + l) * Hkv + h];
                if (st)
                    qi_kv_rehome_undo(stream_of(e, &e->seqs[i], l, h), u);
                else
                    qi_kv_rehome_commit(u);
            }
    }
    if (st) { /* the engine as it was: the new blocks go */
        for (int b = 0; b < NB; b++) {
            qi_buf_free(nblk[b]);
            if (wblock_dev(np, b) == 0 && wblock_dev(&e->plan, b) != 0) wblock_reset(m, &e->dev[0], b);
        }
        qi_plan_free(&next);
    } else {
        for (int b = 0; b < NB; b++) {
            const int od = wblock_dev(&e->plan, b), nd = wblock_dev(np, b);
            if (od == nd) continue;
            qi_buf_free(e->dev[od].wblk[b]);
            e->dev[od].wblk[b] = NULL;
            if (od == 0) wblock_reset(m, &e->dev[0], b);
            e->dev[nd].wblk[b] = nblk[b];
        }
        /* buffers a device kept for blocks it no longer runs */
        for (int d = 1; d < np->n_devices; d++) {
            dev_state *D = &e->dev[d];
            if (np->head_dev != d) {
                qi_buf_free(D->lbuf);
                D->lbuf = NULL;
                D->cap_logit_rows = 0;
            }
            qi_buf_free(D->sbuf);
            D->sbuf = NULL;
            D->cap_sbuf = 0;
            /* KV blocks kept for reuse by layers that left: room for what came */
            if (D->pool && D->pool != e->pool) qi_kv_pool_trim(D->pool);
        }
        qi_plan_free(&e->plan);
        e->plan = next;
        c.kv_bytes = (double)c.kv_blocks * (2.0 * QI_KV_BLOCK * m->hp.head_dim * sizeof(uint16_t));
        c.seconds = eclock(e) - t0;
        e->prof.replans++;
        e->prof.replan_bytes += c.weight_bytes + c.kv_bytes;
        e->prof.replan_kv_blocks += c.kv_blocks;
        e->prof.replan_seconds += c.seconds;
        if (cost) *cost = c;
    }
    qi_free(nblk);
    qi_free(undo);
    return st;
}

qi_status qi_engine_replan_spec(qi_engine *e, const char *placement, qi_engine_replan_cost *cost, qi_err *err) {
    qi_plan p = e->plan;
    p.layers = NULL;
    p.n_layer = 0;
    qi_status st = qi_plan_parse(placement, e->m->hp.n_layer, &p, err);
    if (!st) st = qi_engine_replan(e, &p, cost, err);
    qi_plan_free(&p);
    return st;
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
    return wblock_bytes(e->m, (dev_state *)&e->dev[d], b);
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

void qi_engine_inject_fail(qi_engine *e, int d, long n_op, long n_copy) {
    if (d < 0 || d >= e->plan.n_devices || !e->dev[d].be) return;
    qi_dev_inject_op_fail(e->dev[d].be, n_op);
    qi_dev_inject_fail(e->dev[d].be, n_copy);
}

qi_backend *qi_engine_backend(qi_engine *e, int d) {
    return d >= 0 && d < e->plan.n_devices ? e->dev[d].be : NULL;
}

/* opts.sim: the profile read and the machine made from it, with
 * opts.sim_cal's and then opts.sim_params' over the default efficiencies. */
static qi_status open_sim(qi_engine *e, const qi_engine_opts *o, qi_err *err) {
    qi_hwprofile *prof = qi_malloc(sizeof *prof);
    if (!prof) return QI_ERR(err, QI_ERR_NOMEM, "out of memory reading a profile");
    qi_status st = qi_hwprofile_load(o->sim, prof, err);
    qi_sim_params par;
    qi_sim_params_default(&par);
    if (!st && o->sim_cal) st = qi_sim_params_load(o->sim_cal, &par, err);
    for (int i = 0; !st && o->sim_params && i < o->sim_params->n; i++) {
        const char *k = o->sim_params->items[i].key, *v = o->sim_params->items[i].value;
        char *end;
        errno = 0;
        const double x = strtod(v, &end);
        if (end == v || *end || errno)
            st = QI_ERR(err, QI_ERR_INVALID, "sim: %s = '%s' is not a number", k, v);
        else
            st = qi_sim_params_set(&par, k, x, err);
    }
    if (!st) st = qi_sim_create(prof, &par, &e->sim, err);
    qi_free(prof);
    return st;
}

qi_status qi_engine_create(const qi_model *m, const qi_engine_opts *o, qi_engine **out, qi_err *err) {
    *out = NULL;
    const qi_hparams *hp = &m->hp;
    if (o->n_threads < 1 || o->n_threads > 1024)
        return QI_ERR(err, QI_ERR_INVALID, "thread count %d out of range 1..1024", o->n_threads);
    if (o->max_seqs < 1 || o->max_seqs > 4096)
        return QI_ERR(err, QI_ERR_INVALID, "max sequences %d out of range 1..4096", o->max_seqs);
    if (o->n_ctx < 1 || o->n_ctx > (1 << 20))
        return QI_ERR(err, QI_ERR_INVALID, "context size %d out of range 1..%d", o->n_ctx, 1 << 20);
    if (o->step_tokens < 1 || o->step_tokens > 65536)
        return QI_ERR(err, QI_ERR_INVALID, "step token budget %d out of range 1..65536", o->step_tokens);
    if (o->kv_budget_tokens < 0) return QI_ERR(err, QI_ERR_INVALID, "KV budget %d tokens is negative", o->kv_budget_tokens);
    if (!(o->kv_budget_frac >= 0.0 && o->kv_budget_frac <= 1.0))
        return QI_ERR(err, QI_ERR_INVALID, "KV budget fraction %g is outside (0, 1]", o->kv_budget_frac);
    if (o->kv_budget_tokens > 0 && o->kv_budget_frac > 0.0)
        return QI_ERR(err, QI_ERR_INVALID, "KV budget given both as tokens and as a fraction");
    if (hp->head_dim > 1024) return QI_ERR(err, QI_ERR_UNSUPPORTED, "head size %d above 1024", hp->head_dim);

    qi_engine *e = qi_calloc(1, sizeof *e);
    if (!e) return QI_ERR(err, QI_ERR_NOMEM, "out of memory creating the engine");
    e->m = m;
    e->o = *o;
    e->o.kv_params = NULL; /* read in create only */
    if (!e->o.kv_policy) e->o.kv_policy = "full";
    qi_status st;
    qi_params none;
    qi_params_init(&none);
    if ((st = qi_kv_policy_create(e->o.kv_policy, o->kv_params ? o->kv_params : &none, hp->n_layer, &e->pol, err)))
        goto fail;
    e->o.kv_policy = qi_kv_policy_name(e->pol);
    e->picks = qi_kv_policy_picks(e->pol);
    e->pick_tokens = qi_kv_policy_picks_tokens(e->pol);
    e->fetches = !e->picks && qi_kv_policy_fetches(e->pol);
    bool any_budgeted = false;
    for (int l = 0; l < hp->n_layer; l++) any_budgeted |= !qi_kv_policy_exempt(e->pol, l);
    if (any_budgeted && o->kv_budget_tokens == 0 && o->kv_budget_frac == 0.0) {
        st = QI_ERR(err, QI_ERR_INVALID, "KV policy '%s' needs a budget (tokens or a fraction)", e->o.kv_policy);
        goto fail;
    }
    if (hp->n_swa > 0) {
        long cells = ((long)hp->n_swa + QI_ENGINE_CHUNK + 255) / 256 * 256;
        e->swa_cells = cells < o->n_ctx ? (int)cells : o->n_ctx;
    }
    const unsigned cpu_flags = (o->attn_blas ? QI_CPU_ATTN_BLAS : 0u) | (o->repack ? QI_CPU_REPACK : 0u);
    if (o->sim_cal && !o->sim) {
        st = QI_ERR(err, QI_ERR_INVALID, "a calibration file (%s) is for a simulated machine: name its profile with "
                    "--sim", o->sim_cal);
        goto fail;
    }
    if (o->sim) {
        if ((st = open_sim(e, o, err)) || (st = qi_backend_sim_create(e->sim, false, 0, &e->be, err))) goto fail;
    } else if ((st = qi_backend_cpu_create(o->n_threads, cpu_flags, &e->be, err)) ||
               (st = check_arch_ops(m, e->be, err))) { /* an architecture the CPU cannot run says so first */
        goto fail;
    } else if (qi_gguf_shapes_only(m->gguf)) {
        st = QI_ERR(err, QI_ERR_INVALID, "%s has shapes only, no weights (qinfer synth --shapes-only): it runs on "
                    "simulated devices only (--sim PROFILE)", qi_gguf_path(m->gguf));
        goto fail;
    }
    if ((st = qi_kv_pool_create(e->be, hp->head_dim, o->kv_max_bytes, &e->pool, err))) goto fail;

    /* rows of a step: the prompt room plus one decode row per sequence */
    const size_t R = (size_t)o->step_tokens + (size_t)o->max_seqs;
    const size_t N = (size_t)o->n_ctx;
    if ((st = setup_devices(e, R, err))) goto fail;
    /* a fetch scores offloaded tokens on the host and points the CPU's
     * attention at them: on a run with other devices (or simulated ones),
     * whose plans may place attention elsewhere, a fetch the policy does by
     * default is turned off (one asked for is refused there: check_picks) */
    if (e->fetches && (o->sim || e->plan.n_devices > 1) && qi_kv_policy_fetch_off(e->pol)) e->fetches = false;
    if ((st = check_observe(e, &e->plan, err)) ||
        (st = check_sparse(e, &e->plan, err)) || (st = sparse_setup(e, R, err)) ||
        (st = check_picks(e, &e->plan, err)) || (st = neuron_setup(e, err)))
        goto fail;
    e->o.devices = e->o.placement = NULL; /* read in create only; the plan is e->plan */
    e->seqs = qi_calloc((size_t)o->max_seqs, sizeof *e->seqs);
    e->tokens = qi_malloc(sizeof(int32_t) * R);
    e->q_pos = qi_malloc(sizeof(int32_t) * R);
    e->kv_src = qi_malloc(sizeof *e->kv_src * 2 * R * (size_t)hp->n_head_kv);
    e->kv_dst = qi_malloc(sizeof *e->kv_dst * 2 * R * (size_t)hp->n_head_kv);
    e->kv_src2 = qi_malloc(sizeof *e->kv_src2 * 2 * R * (size_t)hp->n_head_kv);
    e->kv_dst2 = qi_malloc(sizeof *e->kv_dst2 * 2 * R * (size_t)hp->n_head_kv);
    e->segs = qi_malloc(sizeof(segment) * (size_t)o->max_seqs);
    e->out_rows = qi_malloc(sizeof(int32_t) * R);
    e->cap_stats = (size_t)hp->n_head * stats_stride(o->n_ctx);
    e->stats = qi_malloc(sizeof(float) * e->cap_stats);
    e->fate_off = qi_malloc(sizeof(size_t) * ((size_t)o->max_seqs * (size_t)hp->n_head_kv + 1));
    e->kst_at = qi_malloc(sizeof(long) * (size_t)o->max_seqs * (size_t)hp->n_head_kv);
    e->blk_s = qi_calloc((size_t)wblock_count(m), sizeof *e->blk_s);
    e->blk_split_s = qi_calloc((size_t)wblock_count(m), sizeof *e->blk_split_s);
    e->blk_attn_s = qi_calloc((size_t)wblock_count(m), sizeof *e->blk_attn_s);
    e->ps = qi_calloc((size_t)o->n_threads, sizeof *e->ps);
    if (!e->ps) {
        st = QI_ERR(err, QI_ERR_NOMEM, "out of memory sizing the engine for %d threads", o->n_threads);
        goto fail;
    }
    /* regions per thread: a stream's, or a layer's KV heads' together */
    const int together = qi_kv_policy_heads_together(e->pol) ? hp->n_head_kv : 1;
    if (together > MAX_TOGETHER) {
        st = QI_ERR(err, QI_ERR_UNSUPPORTED, "KV policy '%s' with ada= decides a layer's KV heads together, at most "
                    "%d, and the model has %d", e->o.kv_policy, MAX_TOGETHER, together);
        goto fail;
    }
    const size_t NR = N * (size_t)together;
    for (int t = 0; t < o->n_threads; t++) {
        pol_scratch *ps = &e->ps[t];
        if (t == 0)
            ps->pol = e->pol;
        else if ((st = qi_kv_policy_create(e->o.kv_policy, o->kv_params ? o->kv_params : &none, hp->n_layer,
                                           &ps->pol, err)))
            goto fail;
        if (t > 0 && !e->fetches && qi_kv_policy_fetches(ps->pol)) qi_kv_policy_fetch_off(ps->pol); /* as e->pol */
        ps->attn = qi_malloc(sizeof(float) * NR);
        ps->vpos = qi_malloc(sizeof(int32_t) * NR);
        ps->vtier = qi_malloc(NR);
        ps->vscore = qi_malloc(sizeof(float) * NR);
        ps->probe_s = qi_malloc(sizeof(float) * (N + 16));
        ps->probe_q16 = qi_malloc(sizeof(uint16_t) * (size_t)hp->head_dim);
        ps->obs = qi_malloc(sizeof(float) * NR);
        if (!ps->attn || !ps->vpos || !ps->vtier || !ps->vscore || !ps->probe_s || !ps->probe_q16 || !ps->obs) {
            st = QI_ERR(err, QI_ERR_NOMEM, "out of memory for the KV policy's scratch of %d positions", o->n_ctx);
            goto fail;
        }
    }
    const size_t ns = 2 * (size_t)o->max_seqs * (size_t)hp->n_head_kv;
    e->acall = qi_malloc(sizeof *e->acall * 2 * (size_t)o->max_seqs);
    e->a_nslots = qi_malloc(sizeof *e->a_nslots * ns);
    e->a_pos = qi_malloc(sizeof *e->a_pos * ns);
    e->a_kb = qi_malloc(sizeof *e->a_kb * ns);
    e->a_vb = qi_malloc(sizeof *e->a_vb * ns);
    if (!e->acall || !e->a_nslots || !e->a_pos || !e->a_kb || !e->a_vb) {
        st = QI_ERR(err, QI_ERR_NOMEM, "out of memory sizing the engine for %d sequences", o->max_seqs);
        goto fail;
    }
    if (e->picks || e->fetches) { /* a fetching policy's fetched rows are single tokens, as a token picker's */
        const size_t nst = (size_t)o->max_seqs * (size_t)hp->n_head_kv;
        e->pick_max_blocks = e->pick_tokens || e->fetches ? o->n_ctx : (o->n_ctx + QI_KV_PAGE - 1) / QI_KV_PAGE; /* tokens, pages */
        e->pick_kb = qi_malloc(sizeof *e->pick_kb * nst * (size_t)e->pick_max_blocks);
        e->pick_vb = qi_malloc(sizeof *e->pick_vb * nst * (size_t)e->pick_max_blocks);
        e->pick_pos = qi_malloc(sizeof *e->pick_pos * nst * N);
        e->pick_idx = qi_malloc(sizeof *e->pick_idx * (size_t)e->pick_max_blocks * (size_t)o->n_threads);
        e->pick_mix = qi_malloc(sizeof *e->pick_mix * (size_t)o->max_seqs * (size_t)hp->n_head);
        e->pick_vmean = qi_malloc(sizeof *e->pick_vmean * nst * (size_t)hp->head_dim);
        e->pick_vm = qi_malloc(sizeof *e->pick_vm * nst);
        bool x_ok = true;
        if (e->fetches) {
            e->x_n = qi_malloc(sizeof *e->x_n * nst);
            e->x_pos = qi_malloc(sizeof *e->x_pos * nst);
            e->x_k = qi_malloc(sizeof *e->x_k * nst);
            e->x_v = qi_malloc(sizeof *e->x_v * nst);
            x_ok = e->x_n && e->x_pos && e->x_k && e->x_v;
        }
        if (!e->pick_kb || !e->pick_vb || !e->pick_pos || !e->pick_idx || !e->pick_mix || !e->pick_vmean ||
            !e->pick_vm || !x_ok) {
            st = QI_ERR(err, QI_ERR_NOMEM, "out of memory for the block tables of KV policy '%s'", e->o.kv_policy);
            goto fail;
        }
    }
    if (!e->seqs || !e->blk_s || !e->blk_split_s || !e->blk_attn_s || !e->tokens || !e->q_pos || !e->kv_src || !e->kv_dst || !e->kv_src2 || !e->kv_dst2 || !e->segs || !e->out_rows || !e->stats ||
        !e->fate_off || !e->kst_at) {
        st = QI_ERR(err, QI_ERR_NOMEM, "out of memory sizing the engine for %d rows per step and %d positions",
                    (int)R, o->n_ctx);
        goto fail;
    }
    for (int d = 0; d < e->plan.n_devices; d++)
        if ((st = e->dev[d].be->iface->reserve(e->dev[d].be, qi_backend_max_act_row_bytes(m) * R, (int)R, o->n_ctx,
                                               hp->n_head_kv, hp->head_dim, err)))
            goto fail;
    *out = e;
    return QI_OK;
fail:
    qi_engine_free(e);
    return st;
}

const char *qi_engine_kv_policy_name(const qi_engine *e) { return e->o.kv_policy; }
bool qi_engine_kv_budget_attended(const qi_engine *e) { return e->picks || e->fetches; }

static qi_status check_id(const qi_engine *e, int id, qi_err *err) {
    if (id < 0 || id >= e->o.max_seqs || !e->seqs[id].used)
        return QI_ERR(err, QI_ERR_INVALID, "no sequence %d", id);
    if (e->seqs[id].failed)
        return QI_ERR(err, QI_ERR_INVALID, "sequence %d failed in an earlier step; remove it", id);
    return QI_OK;
}

qi_status qi_engine_seq_add(qi_engine *e, int *id, qi_err *err) {
    *id = -1;
    const qi_hparams *hp = &e->m->hp;
    for (int i = 0; i < e->o.max_seqs; i++) {
        seq_state *s = &e->seqs[i];
        if (s->used) continue;
        memset(s, 0, sizeof *s);
        s->pending = qi_malloc(sizeof(int32_t) * (size_t)e->o.n_ctx);
        s->streams = qi_calloc((size_t)hp->n_layer * hp->n_head_kv, sizeof *s->streams);
        if (!s->pending || !s->streams) {
            qi_free(s->pending);
            qi_free(s->streams);
            memset(s, 0, sizeof *s);
            return QI_ERR(err, QI_ERR_NOMEM, "out of memory adding a sequence");
        }
        for (int l = 0; l < hp->n_layer; l++)
            for (int h = 0; h < hp->n_head_kv; h++) {
                qi_kv_stream *sm = stream_of(e, s, l, h);
                qi_kv_stream_init(sm, hp->n_swa > 0 && e->m->layers[l].swa ? e->swa_cells : 0, work_pool(e, l),
                                  split_pool(e, l), e->pool);
                if (pick_layer(e, l) && !e->pick_tokens) qi_kv_stream_keep_bounds(sm);
                if (pick_layer(e, l) && e->pick_tokens) qi_kv_stream_keep_kcols(sm);
                if (fetch_layer(e, l)) qi_kv_stream_keep_off_kcols(sm);
            }
        s->used = true;
        *id = i;
        return QI_OK;
    }
    return QI_ERR(err, QI_ERR_INVALID, "all %d sequence slots are in use", e->o.max_seqs);
}

qi_status qi_engine_seq_remove(qi_engine *e, int id, qi_err *err) {
    if (id < 0 || id >= e->o.max_seqs || !e->seqs[id].used) return QI_ERR(err, QI_ERR_INVALID, "no sequence %d", id);
    seq_state *s = &e->seqs[id];
    for (int l = 0; l < e->m->hp.n_layer; l++)
        for (int h = 0; h < e->m->hp.n_head_kv; h++) qi_kv_stream_release(stream_of(e, s, l, h));
    qi_free(s->streams);
    qi_free(s->pending);
    memset(s, 0, sizeof *s);
    return QI_OK;
}

qi_status qi_engine_seq_feed(qi_engine *e, int id, const int32_t *tokens, int n, bool logits_all, qi_err *err) {
    qi_status st = check_id(e, id, err);
    if (st) return st;
    seq_state *s = &e->seqs[id];
    const int V = e->m->hp.n_vocab;
    if (n < 1) return QI_ERR(err, QI_ERR_INVALID, "nothing to feed");
    if ((long)s->n_past + s->n_pending + n > e->o.n_ctx)
        return QI_ERR(err, QI_ERR_INVALID, "context full: sequence %d has %d tokens and %d pending, %d more exceed %d",
                      id, s->n_past, s->n_pending, n, e->o.n_ctx);
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= V)
            return QI_ERR(err, QI_ERR_INVALID, "token id %d out of range 0..%d", tokens[i], V - 1);
    if (s->n_pending > 0 && s->logits_all != logits_all)
        return QI_ERR(err, QI_ERR_INVALID, "sequence %d still has pending tokens fed with logits_all=%d", id,
                      (int)s->logits_all);
    if (s->head > 0) {
        memmove(s->pending, s->pending + s->head, sizeof(int32_t) * (size_t)s->n_pending);
        s->head = 0;
    }
    memcpy(s->pending + s->n_pending, tokens, sizeof(int32_t) * (size_t)n);
    s->n_pending += n;
    s->logits_all = logits_all;
    return QI_OK;
}

int qi_engine_seq_pending(const qi_engine *e, int id) {
    return id >= 0 && id < e->o.max_seqs && e->seqs[id].used ? e->seqs[id].n_pending : 0;
}
int qi_engine_seq_n_past(const qi_engine *e, int id) {
    return id >= 0 && id < e->o.max_seqs && e->seqs[id].used ? e->seqs[id].n_past : 0;
}
int qi_engine_seq_n_logits(const qi_engine *e, int id) {
    return id >= 0 && id < e->o.max_seqs && e->seqs[id].used ? e->seqs[id].n_logits : 0;
}
const float *qi_engine_seq_logits(const qi_engine *e, int id, int i) {
    if (id < 0 || id >= e->o.max_seqs || !e->seqs[id].used) return NULL;
    const seq_state *s = &e->seqs[id];
    if (i < 0) i = s->n_logits - 1;
    if (i < 0 || i >= s->n_logits) return NULL;
    return e->logits + (size_t)(s->logit_row + i) * e->m->hp.n_vocab;
}

int qi_engine_max_seqs(const qi_engine *e) { return e->o.max_seqs; }

/* Every stream of the sequence at once, or none: a stream that fails
 * undoes the ones before it (which cannot fail for want of blocks: it
 * gives back what they took). */
static qi_status seq_swap(qi_engine *e, int id, bool out, qi_err *err) {
    qi_status st = check_id(e, id, err);
    if (st) return st;
    seq_state *s = &e->seqs[id];
    if (s->swapped == out)
        return QI_ERR(err, QI_ERR_INVALID, "sequence %d is %s", id, out ? "swapped out already" : "not swapped out");
    const int L = e->m->hp.n_layer, Hkv = e->m->hp.n_head_kv;
    for (int k = 0; k < L * Hkv; k++) {
        qi_kv_stream *kv = stream_of(e, s, k / Hkv, k % Hkv);
        st = out ? qi_kv_stream_swap_out(kv, err) : qi_kv_stream_swap_in(kv, err);
        if (!st) continue;
        qi_err_prefix(err, "sequence %d, layer %d, KV head %d", id, k / Hkv, k % Hkv);
        while (k-- > 0) {
            kv = stream_of(e, s, k / Hkv, k % Hkv);
            if (out ? qi_kv_stream_swap_in(kv, NULL) : qi_kv_stream_swap_out(kv, NULL)) s->failed = true;
        }
        return st;
    }
    s->swapped = out;
    return QI_OK;
}

qi_status qi_engine_seq_swap_out(qi_engine *e, int id, qi_err *err) { return seq_swap(e, id, true, err); }
qi_status qi_engine_seq_swap_in(qi_engine *e, int id, qi_err *err) { return seq_swap(e, id, false, err); }
bool qi_engine_seq_swapped(const qi_engine *e, int id) {
    return id >= 0 && id < e->o.max_seqs && e->seqs[id].used && e->seqs[id].swapped;
}

void qi_engine_kv_seq_stats(const qi_engine *e, int id, qi_engine_kv_seq *out) {
    memset(out, 0, sizeof *out);
    if (id < 0 || id >= e->o.max_seqs || !e->seqs[id].used) return;
    const size_t bb = qi_kv_pool_usage(e->pool)->block_bytes;
    for (int l = 0; l < e->m->hp.n_layer; l++)
        for (int h = 0; h < e->m->hp.n_head_kv; h++) {
            const qi_kv_stream *st = stream_of(e, &e->seqs[id], l, h);
            out->work_tokens += st->work.n;
            out->off_tokens += st->off.n;
            out->attn_tokens += st->attended;
            out->work_bytes += bb * (size_t)st->work.n_blocks;
            out->off_bytes += bb * (size_t)st->off.n_blocks;
        }
}

int qi_engine_kv_stream_tokens(const qi_engine *e, int id, int layer, int kv_head, int tier, const int32_t **pos,
                               const float **score) {
    *pos = NULL;
    if (score) *score = NULL;
    if (id < 0 || id >= e->o.max_seqs || !e->seqs[id].used || layer < 0 || layer >= e->m->hp.n_layer ||
        kv_head < 0 || kv_head >= e->m->hp.n_head_kv || (tier != 0 && tier != 1))
        return -1;
    const qi_kv_stream *st = stream_of(e, &e->seqs[id], layer, kv_head);
    const qi_kv_tier *t = tier == 0 ? &st->work : &st->off;
    *pos = t->pos;
    if (score) *score = t->score;
    return t->n;
}

void qi_engine_kv_pool_stats(const qi_engine *e, qi_engine_kv_pool *out) {
    const qi_kv_usage *u = qi_kv_pool_usage(e->pool);
    out->block_bytes = u->block_bytes;
    out->work_blocks = u->blocks[0];
    out->off_blocks = u->blocks[1];
    out->peak_work_blocks = u->peak_blocks[0];
    out->peak_off_blocks = u->peak_blocks[1];
    out->max_blocks = u->max_blocks;
}

/* ---- the step ------------------------------------------------------------------------- */

/* Pick the step's segments: every decode (one row each), then whole prompt
 * chunks while the prompt room lasts. The first chunk always fits, so no
 * prompt starves; a chunk that does not fit waits for a later step rather
 * than being cut (see the top of the file). */
static int schedule(qi_engine *e, int *T_out) {
    int n_seg = 0, T = 0, room = e->o.step_tokens;
    const int S = e->o.max_seqs, chunk = room < QI_ENGINE_CHUNK ? room : QI_ENGINE_CHUNK;
    for (int pass = 0; pass < 2; pass++) {
        for (int k = 0; k < S; k++) {
            const int id = (e->cursor + k) % S;
            seq_state *s = &e->seqs[id];
            if (!s->used || s->failed || s->swapped || s->n_pending == 0 || (pass == 0) != (s->n_pending == 1))
                continue;
            const int n = s->n_pending < chunk ? s->n_pending : chunk;
            if (pass == 1) {
                if (n > room) continue;
                room -= n;
            }
            segment *g = &e->segs[n_seg++];
            g->id = id;
            g->off = T;
            g->n = n;
            g->pos0 = s->n_past;
            if (s->logits_all) {
                g->out_first = 0;
                g->n_out = n;
            } else {
                g->out_first = n - 1;
                g->n_out = n == s->n_pending ? 1 : 0;
            }
            T += n;
        }
    }
    e->cursor = (e->cursor + 1) % S;
    *T_out = T;
    return n_seg;
}

static int resolve_budget(const qi_engine *e, int32_t cur_pos) {
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
            /* the host's copy of the queries (policy_all) */
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
                        .budget = resolve_budget(e, cur), .probed = probed, .prompt_more = s->n_pending > g->n,
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
static qi_status policy_all(qi_engine *e, const segment *segs, int n_seg, int l, qi_err *err) {
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

/* Segment g (the i-th of the step) at layer l: slots in its streams for
 * its K/V rows (their writes gathered into e->kv_src/kv_dst from *n_kv on,
 * for one kv_write of the layer), and its attention call, e->acall[i],
 * without statistics (attend_all places them). On a split layer, the rows
 * whose slots are in blocks of the second device are gathered into
 * e->kv_src2/kv_dst2 from *n_kv2 on, reading the copy of K/V there, and
 * the call is two partial calls: e->acall[i] over the first slots, on the
 * attention's device, and e->acall[max_seqs + i] over the rest. */
static qi_status attend_prepare(qi_engine *e, const segment *g, int i, int l, int *n_kv, int *n_kv2, qi_err *err) {
    const qi_hparams *hp = &e->m->hp;
    seq_state *s = &e->seqs[g->id];
    const int H = hp->n_head, Hkv = hp->n_head_kv, D = hp->head_dim;
    const long kvw = (long)Hkv * D;
    const bool swa = hp->n_swa > 0 && e->m->layers[l].swa;
    const qi_plan_layer *y = &e->plan.layers[l];
    const bool split = y->split > 0.0f;
    const dev_state *A = &e->dev[y->attn_dev], *B = split ? &e->dev[y->split_dev] : NULL;
    qi_status st;
    for (int t = 0; t < g->n; t++)
        for (int hk = 0; hk < Hkv; hk++) {
            const long o = (long)(g->off + t) * kvw + (long)hk * D;
            qi_kv_stream *sm = stream_of(e, s, l, hk);
            uint16_t *kr, *vr;
            int slot;
            if ((st = qi_kv_stream_slot(sm, g->pos0 + t, &slot, &kr, &vr, err))) return st;
            if (split && slot >> QI_KV_BLOCK_SHIFT >= sm->lo_blocks) {
                e->kv_src2[*n_kv2] = B->k + o;
                e->kv_dst2[(*n_kv2)++] = kr;
                e->kv_src2[*n_kv2] = B->v + o;
                e->kv_dst2[(*n_kv2)++] = vr;
            } else {
                e->kv_src[*n_kv] = A->k + o;
                e->kv_dst[(*n_kv)++] = kr;
                e->kv_src[*n_kv] = A->v + o;
                e->kv_dst[(*n_kv)++] = vr;
            }
        }
    for (int hk = 0; hk < Hkv; hk++) {
        qi_kv_stream *sm = stream_of(e, s, l, hk);
        sm->attended = sm->work.n; /* both parts of a split; a picking policy's choice may cut it (pick_blocks) */
    }
    const qi_attn_paged_args base = {.T = g->n, .H = H, .Hkv = Hkv, .D = D, .q_pos = e->q_pos + g->off,
                                     .n_swa = swa ? hp->n_swa : 0,
                                     .scale = hp->q_scale > 0 ? 1.0f : 1.0f / sqrtf((float)D),
                                     .shift = QI_KV_BLOCK_SHIFT};
    for (int part = 0; part < (split ? 2 : 1); part++) {
        const int c = part ? e->o.max_seqs + i : i;
        const dev_state *X = part ? B : A;
        int *n_slots = e->a_nslots + (size_t)c * Hkv;
        const int32_t **pos = e->a_pos + (size_t)c * Hkv;
        const uint16_t *const **kb = e->a_kb + (size_t)c * Hkv, *const **vb = e->a_vb + (size_t)c * Hkv;
        for (int hk = 0; hk < Hkv; hk++) {
            const qi_kv_stream *sm = stream_of(e, s, l, hk);
            const qi_kv_tier *w = &sm->work;
            /* a split stream's first lo_blocks blocks are the attention device's */
            const int b0 = part ? sm->lo_blocks : 0, n0 = b0 << QI_KV_BLOCK_SHIFT;
            const int n_lo = split && (sm->lo_blocks << QI_KV_BLOCK_SHIFT) < w->n ? sm->lo_blocks << QI_KV_BLOCK_SHIFT
                                                                                  : w->n;
            n_slots[hk] = part ? (w->n > n0 ? w->n - n0 : 0) : n_lo;
            pos[hk] = w->pos + n0;
            kb[hk] = (const uint16_t *const *)w->k_blk + b0;
            vb[hk] = (const uint16_t *const *)w->v_blk + b0;
        }
        qi_attn_paged_args *a = &e->acall[c];
        *a = base;
        a->q = X->q + (long)g->off * H * D;
        a->n_slots = n_slots;
        a->pos = pos;
        a->k_blk = kb;
        a->v_blk = vb;
        if (split) {
            a->out = X->so + (long)g->off * H * D;
            a->part_m = X->sm + (long)g->off * H;
            a->part_l = X->sl + (long)g->off * H;
        } else {
            a->out = X->att + (long)g->off * H * D;
        }
    }
    return QI_OK;
}

/* Give every call of the step its own zeroed region of e->stats, [H][its
 * stride], growing the buffer when the step needs more than any before. */
static qi_status place_stats(qi_engine *e, int n_seg, qi_err *err) {
    const int H = e->m->hp.n_head, Hkv = e->m->hp.n_head_kv;
    size_t need = 0;
    for (int i = 0; i < n_seg; i++) {
        int mx = 0;
        for (int hk = 0; hk < Hkv; hk++) {
            const int n = e->acall[i].n_slots[hk] + (e->acall[i].x_n ? e->acall[i].x_n[hk] : 0);
            mx = n > mx ? n : mx;
        }
        e->acall[i].stats_stride = stats_stride(mx);
        need += (size_t)H * (size_t)e->acall[i].stats_stride;
    }
    if (need > e->cap_stats) {
        float *p = qi_realloc(e->stats, sizeof(float) * need);
        if (!p) return QI_ERR(err, QI_ERR_NOMEM, "out of memory for the attention statistics of %d sequences", n_seg);
        e->stats = p;
        e->cap_stats = need;
    }
    size_t off = 0;
    for (int i = 0; i < n_seg; i++) {
        const size_t n = (size_t)H * (size_t)e->acall[i].stats_stride;
        e->acall[i].stats = e->stats + off;
        memset(e->acall[i].stats, 0, sizeof(float) * n);
        off += n;
    }
    e->n_stats = off;
    return QI_OK;
}

/* The statistics of a layer whose attention runs on device X, which the
 * host cannot address: the zeroed regions uploaded to X's buffer and the
 * calls pointed there (to_device), then the sums downloaded into
 * e->stats, the host waiting for them, and the calls pointed back. */
static qi_status stats_move(qi_engine *e, dev_state *X, int n_seg, bool to_device, qi_err *err) {
    const size_t bytes = sizeof(float) * e->n_stats;
    qi_status st;
    if (to_device && e->n_stats > X->cap_sbuf) {
        qi_buf_free(X->sbuf);
        X->sbuf = NULL;
        X->cap_sbuf = 0;
        if ((st = qi_buf_alloc(X->be, bytes, "attention statistics", &X->sbuf, err))) return st;
        X->cap_sbuf = e->n_stats;
    }
    float *dev = qi_buf_ptr(X->be, qi_view_of(X->sbuf, 0), bytes, err);
    if (!dev) return QI_ERR_INVALID;
    if (to_device) {
        if ((st = qi_dev_upload(X->be, qi_view_of(X->sbuf, 0), e->stats, bytes, err))) return st;
    } else {
        if ((st = qi_dev_download(X->be, e->stats, qi_view_of(X->sbuf, 0), bytes, err))) return st;
        qi_event *ev = NULL;
        if ((st = qi_event_record(X->be, &ev, err))) return st;
        qi_event_sync(ev);
        qi_event_free(ev);
    }
    for (int i = 0; i < n_seg; i++) {
        qi_attn_paged_args *a = &e->acall[i];
        a->stats = to_device ? dev + (a->stats - e->stats) : e->stats + (a->stats - dev);
    }
    return QI_OK;
}

/* ---- copies between devices ---------------------------------------------------------- */

/* A batch of copies from device `from` to device `to`, queued on the
 * stream that orders them with the device that is not host-visible
 * (qi_dev_copy_stream). xfer_end makes `to` wait for them, and `from` too
 * when its buffers are reused before its own stream would meet the
 * copies. Every copy is counted in the profile; with profile on, their
 * device time is taken from events around the batch when the step has
 * synchronised. */
typedef struct {
    qi_backend *cs, *to, *from;
    qi_event *t0;
} xfer;

static qi_status xfer_begin(qi_engine *e, xfer *x, qi_backend *to, qi_backend *from, qi_err *err) {
    *x = (xfer){.cs = qi_dev_copy_stream(to, from), .to = to, .from = from};
    if (!x->cs)
        return QI_ERR(err, QI_ERR_UNSUPPORTED, "no stream copies from %s to %s (neither is host-visible)",
                      qi_dev_info_get(from)->name, qi_dev_info_get(to)->name);
    return e->o.profile ? qi_event_record(x->cs, &x->t0, err) : QI_OK;
}

static qi_status xfer_copy(qi_engine *e, xfer *x, qi_view dst, qi_view src, size_t n, qi_err *err) {
    e->prof.copies++;
    e->prof.copy_bytes += (double)n;
    qi_status st = qi_dev_copy(x->cs, dst, src, n, err);
    if (st) { /* the batch ends here: its start event is no longer wanted */
        qi_event_free(x->t0);
        x->t0 = NULL;
    }
    return st;
}

static qi_status xfer_end(qi_engine *e, xfer *x, bool from_waits, qi_err *err) {
    const bool wait_to = x->to != x->cs, wait_from = from_waits && x->from != x->cs;
    if (!wait_to && !wait_from && !x->t0) return QI_OK;
    qi_event *ev = NULL;
    qi_status st = qi_event_record(x->cs, &ev, err);
    if (!st && wait_to) st = qi_event_wait(x->to, ev, err);
    if (!st && wait_from) st = qi_event_wait(x->from, ev, err);
    if (!st && x->t0) {
        st = keep_events(e, x->t0, ev, -1, dev_index(e, x->to), dev_index(e, x->cs), err);
        x->t0 = ev = NULL;
    }
    qi_event_free(x->t0);
    qi_event_free(ev);
    x->t0 = NULL;
    return st;
}

/* Layer l's attention split across two devices (A, the attention's, and B,
 * the split's): the working blocks shared out for the step's tokens (the
 * blocks that become A's moved from B), the K/V of the step written on the
 * device holding each slot, the queries copied to B, a partial attention
 * on each over its slots, B's copied back, and the exact merge on A into
 * A's attention output. A split layer keeps every token (setup_devices
 * refuses an evicting policy on one), so it has no statistics. */
static qi_status attend_split(qi_engine *e, const segment *segs, int n_seg, int T, int l, qi_err *err) {
    const qi_hparams *hp = &e->m->hp;
    const qi_plan_layer *y = &e->plan.layers[l];
    const dev_state *A = &e->dev[y->attn_dev], *B = &e->dev[y->split_dev];
    const int H = hp->n_head, Hkv = hp->n_head_kv, D = hp->head_dim;
    qi_status st;
    xfer x;
    /* the share of the blocks, for the tokens to come */
    if ((st = xfer_begin(e, &x, A->be, B->be, err))) return st;
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
        st2 = xfer_end(e, &x, true, err); /* B reuses the blocks it gave back */
    } else { /* nothing queued: nobody waits */
        qi_event_free(x.t0);
        x.t0 = NULL;
    }
    if (st || (st = st2)) return st;
    int n_kv = 0, n_kv2 = 0;
    for (int i = 0; i < n_seg; i++)
        if ((st = attend_prepare(e, &segs[i], i, l, &n_kv, &n_kv2, err))) return st;
    /* the step's queries, keys and values to B */
    const size_t qb = sizeof(float) * (size_t)T * H * D, kb = sizeof(float) * (size_t)T * Hkv * D;
    if ((st = xfer_begin(e, &x, B->be, A->be, err)) || (st = xfer_copy(e, &x, act_view(B, B->q), act_view(A, A->q), qb, err)) ||
        (st = xfer_copy(e, &x, act_view(B, B->k), act_view(A, A->k), kb, err)) ||
        (st = xfer_copy(e, &x, act_view(B, B->v), act_view(A, A->v), kb, err)) || (st = xfer_end(e, &x, false, err)))
        return st;
    /* The two parts run at once: the part of a device with a stream of its
     * own (a GPU) is queued first, so the host's part (the CPU's, which
     * runs on the calling thread) overlaps it instead of preceding it. */
    const bool a_first = qi_dev_info_get(B->be)->host_visible && !qi_dev_info_get(A->be)->host_visible;
    for (int k = 0; k < 2; k++) {
        if (k == (a_first ? 0 : 1)) {
            TIMED(e, A->be, QI_OP_KV, qi_backend_kv_write(A->be, e->kv_src, e->kv_dst, n_kv, D, err));
            TIMED(e, A->be, QI_OP_ATTENTION, qi_backend_attention(A->be, e->acall, n_seg, err));
        } else {
            e->cur_slot = 1;
            TIMED(e, B->be, QI_OP_KV, qi_backend_kv_write(B->be, e->kv_src2, e->kv_dst2, n_kv2, D, err));
            TIMED(e, B->be, QI_OP_ATTENTION, qi_backend_attention(B->be, e->acall + e->o.max_seqs, n_seg, err));
            e->cur_slot = 0;
        }
    }
    /* B's partial result back to A, and the merge */
    const size_t mb = sizeof(float) * (size_t)T * H;
    if ((st = xfer_begin(e, &x, A->be, B->be, err)) ||
        (st = xfer_copy(e, &x, act_view(A, A->ro), act_view(B, B->so), qb, err)) ||
        (st = xfer_copy(e, &x, act_view(A, A->rm), act_view(B, B->sm), mb, err)) ||
        (st = xfer_copy(e, &x, act_view(A, A->rl), act_view(B, B->sl), mb, err)) || (st = xfer_end(e, &x, false, err)))
        return st;
    const float *o[2] = {A->so, A->ro}, *mx[2] = {A->sm, A->rm}, *sum[2] = {A->sl, A->rl};
    const qi_attn_merge_args ma = {.rows = T * H, .D = D, .n_parts = 2, .o = o, .m = mx, .l = sum, .out = A->att};
    TIMED(e, A->be, QI_OP_ATTENTION, qi_backend_attention_merge(A->be, &ma, err));
    return QI_OK;
}

/* A picking policy's layer l (Quest, SparQ), after the step's K/V rows
 * are written: every stream's key bounds brought up to date with its new
 * rows (a page picker's), then on each decode segment (one token) every
 * stream's pages (16-token quarters of its blocks, QI_KV_PAGE) or single
 * tokens picked from the bounds or the keys and the segment's queries, and
 * its attention call pointed at them: K and V pointers into the blocks at
 * the chosen pages (or rows), in ascending order (the newest, the only one
 * not full, last), a shift of QI_KV_PAGE_SHIFT (0 for rows), and their
 * positions gathered, so the call reads no other slot and nothing is
 * copied. The call's scores and sums run over the slots in order whatever
 * the rows per pointer, so all pages in order is the arithmetic of the call
 * attend_prepare made, and a budget that covers the whole cache gives the
 * full cache's. Prompt segments read the whole cache. check_picks has
 * placed the layer's attention on the CPU, so rows and queries are host
 * memory. The streams are shared out over the host threads, each with its
 * own policy object and pick scratch, as the evicting policies' decisions
 * are (policy_all). */
typedef struct {
    qi_engine *e;
    const dev_state *X;
    const segment *segs;
    int n_seg, l;
    bool fetch; /* fetch_stream, not pick_stream */
    atomic_long next; /* the next stream to take (policy_work's sharing) */
} pick_job;

static qi_status fetch_stream(qi_engine *e, pol_scratch *ps, int *idx, const dev_state *X, const segment *g, int i,
                              int hk, int l, qi_err *err);

static qi_status pick_stream(qi_engine *e, pol_scratch *ps, int *idx, const dev_state *X, const segment *g, int i,
                             int hk, int l, qi_err *err) {
    const qi_hparams *hp = &e->m->hp;
    const int H = hp->n_head, Hkv = hp->n_head_kv, D = hp->head_dim, group = H / Hkv;
    seq_state *s = &e->seqs[g->id];
    qi_kv_stream *sm = stream_of(e, s, l, hk);
    qi_kv_stream_bounds_from(sm, sm->work.n - g->n);
    if (g->n != 1) return QI_OK;
    const qi_kv_tier *w = &sm->work;
    const bool tok = e->pick_tokens;
    const int nb = tok ? w->n : (w->n + QI_KV_PAGE - 1) / QI_KV_PAGE;
    const qi_kv_pick_view v = {.layer = l, .n_layer = hp->n_layer, .kv_head = hk, .group = group, .D = D,
                               .q = X->q + ((size_t)g->off * H + (size_t)hk * group) * D,
                               .scale = e->acall[i].scale, .n = w->n, .block = tok ? 1 : QI_KV_PAGE,
                               .n_blocks = nb, .bounds = tok ? NULL : w->bound, .newest = nb - 1,
                               .budget = resolve_budget(e, g->pos0),
                               .tail = tok ? 1 : (nb - 1) % QI_KV_PAGES_PER_BLOCK + 1,
                               .k_blk = (const uint16_t *const *)w->k_blk, .k_shift = QI_KV_BLOCK_SHIFT,
                               .k_cols = tok ? w->kcol : NULL,
                               .mass = tok ? e->pick_mix + (size_t)i * H + (size_t)hk * group : NULL};
    const size_t r = (size_t)i * Hkv + hk;
    if (tok) { /* no reallocation unless the policy asks for it; the mean of the values held */
        for (int h = 0; h < group; h++) v.mass[h] = 1.0f;
        float *vm = e->pick_vmean + r * (size_t)D;
        for (int d = 0; d < D; d++) vm[d] = w->vsum[d] / (float)w->n;
        e->pick_vm[r] = vm;
    }
    int n = 0;
    qi_status st = qi_kv_policy_pick(ps->pol, &v, idx, &n, err);
    if (st) return st;
    const uint16_t **kb = e->pick_kb + r * e->pick_max_blocks, **vb = e->pick_vb + r * e->pick_max_blocks;
    int32_t *pos = e->pick_pos + r * (size_t)e->o.n_ctx;
    int n_slots = 0;
    if (tok) { /* token t: its own row, one row per pointer */
        for (int j = 0; j < n; j++) {
            kb[j] = qi_kv_k_row(w, idx[j], D);
            vb[j] = qi_kv_v_row(w, idx[j], D);
            pos[j] = w->pos[idx[j]];
        }
        n_slots = n;
    } else
        for (int j = 0; j < n; j++) { /* page pg: rows (pg mod pages per block) x QI_KV_PAGE on in its block */
            const int pg = idx[j], b0 = pg << QI_KV_PAGE_SHIFT;
            const int nr = w->n - b0 < QI_KV_PAGE ? w->n - b0 : QI_KV_PAGE;
            const size_t in_blk = (size_t)(pg & (QI_KV_PAGES_PER_BLOCK - 1)) * QI_KV_PAGE * (size_t)D;
            kb[j] = w->k_blk[pg / QI_KV_PAGES_PER_BLOCK] + in_blk;
            vb[j] = w->v_blk[pg / QI_KV_PAGES_PER_BLOCK] + in_blk;
            memcpy(pos + n_slots, w->pos + b0, sizeof *pos * (size_t)nr);
            n_slots += nr;
        }
    e->a_nslots[r] = n_slots;
    e->a_pos[r] = pos;
    e->a_kb[r] = (const uint16_t *const *)kb;
    e->a_vb[r] = (const uint16_t *const *)vb;
    sm->attended = n_slots;
    return QI_OK;
}

static void pick_work(void *arg, int ith, int nth) {
    (void)nth;
    pick_job *j = arg;
    qi_engine *e = j->e;
    const int Hkv = e->m->hp.n_head_kv;
    pol_scratch *ps = &e->ps[ith];
    int *idx = e->pick_idx + (size_t)ith * e->pick_max_blocks;
    const long streams = (long)j->n_seg * Hkv;
    for (long k; (k = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed)) < streams;) {
        const int i = (int)(k / Hkv), hk = (int)(k % Hkv);
        qi_status st = (j->fetch ? fetch_stream : pick_stream)(e, ps, idx, j->X, &j->segs[i], i, hk, j->l, &ps->err);
        if (st) {
            ps->err_k = k;
            ps->err_st = st;
            return;
        }
    }
}

static qi_status pick_blocks(qi_engine *e, const dev_state *X, const segment *segs, int n_seg, int l, qi_err *err) {
    const bool fetch = fetch_layer(e, l);
    const int Hkv = e->m->hp.n_head_kv;
    for (int i = 0; i < n_seg; i++) /* slot s is row s mod 2^shift of kb[s >> shift] */
        if (segs[i].n == 1 && fetch) { /* the working tier's blocks as they are, and the fetched rows */
            qi_attn_paged_args *a = &e->acall[i];
            a->x_n = e->x_n + (size_t)i * Hkv;
            a->x_pos = e->x_pos + (size_t)i * Hkv;
            a->x_k = e->x_k + (size_t)i * Hkv;
            a->x_v = e->x_v + (size_t)i * Hkv;
        } else if (segs[i].n == 1) {
            e->acall[i].shift = e->pick_tokens ? 0 : QI_KV_PAGE_SHIFT;
            if (e->pick_tokens) { /* the shares the policy estimates (1: none), the means */
                e->acall[i].mix = e->pick_mix + (size_t)i * e->m->hp.n_head;
                e->acall[i].vmean = e->pick_vm + (size_t)i * e->m->hp.n_head_kv;
            }
        }
    for (int t = 0; t < e->o.n_threads; t++) {
        e->ps[t].err_k = -1;
        qi_err_clear(&e->ps[t].err);
    }
    pick_job j = {e, X, segs, n_seg, l, fetch, 0};
    if ((long)n_seg * e->m->hp.n_head_kv > 1)
        qi_backend_cpu_host_run(e->be, pick_work, &j);
    else
        pick_work(&j, 0, 1);
    const pol_scratch *bad = NULL; /* the first failure in stream order, whichever thread met it */
    for (int t = 0; t < e->o.n_threads; t++) {
        const pol_scratch *ps = &e->ps[t];
        if (ps->err_k >= 0 && (!bad || ps->err_k < bad->err_k)) bad = ps;
    }
    if (bad) {
        *err = bad->err;
        return bad->err_st;
    }
    return QI_OK;
}

/* A fetching policy's layer l (qinfer fetch=), after the step's K/V rows
 * are written: on each decode segment, every stream's offloaded tokens
 * that the policy fetches for this step's query (scored from the offload
 * tier's key columns, brought up to date here, and the rows of its newest
 * block, not yet full), at most what the layer's
 * budget leaves beside the working tokens. The segment's attention call
 * keeps the working tier's block table as attend_prepare made it and
 * takes the fetched rows as extra rows (qi_attn_paged_args's x_*), after
 * the table's slots, so that its statistics' first slots are the working
 * tier's as the policy's view reads them. Nothing moves between tiers.
 * Shared out over the host threads as the picks are. */
static qi_status fetch_stream(qi_engine *e, pol_scratch *ps, int *idx, const dev_state *X, const segment *g, int i,
                              int hk, int l, qi_err *err) {
    const qi_hparams *hp = &e->m->hp;
    const int H = hp->n_head, Hkv = hp->n_head_kv, D = hp->head_dim, group = H / Hkv;
    seq_state *s = &e->seqs[g->id];
    qi_kv_stream *sm = stream_of(e, s, l, hk);
    if (g->n != 1) return QI_OK;
    const qi_kv_tier *w = &sm->work, *o = &sm->off;
    const int room = qi_kv_policy_layer_budget(e->pol, l, resolve_budget(e, g->pos0)) - w->n;
    int n = 0;
    if (room > 0 && o->n > 0) {
        int with_cols = 0;
        const uint16_t *cols = qi_kv_stream_off_kcols(sm, &with_cols);
        const qi_kv_pick_view v = {.layer = l, .n_layer = hp->n_layer, .kv_head = hk, .group = group, .D = D,
                                   .q = X->q + ((size_t)g->off * H + (size_t)hk * group) * D,
                                   .scale = e->acall[i].scale, .n = o->n, .block = 1, .n_blocks = o->n,
                                   .newest = o->n - 1, .budget = room, .tail = 1,
                                   .k_blk = (const uint16_t *const *)o->k_blk, .k_shift = QI_KV_BLOCK_SHIFT,
                                   .k_cols = cols, .k_tail = o->n - with_cols};
        qi_status st = qi_kv_policy_fetch(ps->pol, &v, idx, &n, err);
        if (st) return st;
    }
    const size_t r = (size_t)i * Hkv + hk;
    const uint16_t **kb = e->pick_kb + r * e->pick_max_blocks, **vb = e->pick_vb + r * e->pick_max_blocks;
    int32_t *pos = e->pick_pos + r * (size_t)e->o.n_ctx;
    for (int j = 0; j < n; j++) {
        kb[j] = qi_kv_k_row(o, idx[j], D);
        vb[j] = qi_kv_v_row(o, idx[j], D);
        pos[j] = o->pos[idx[j]];
    }
    e->x_n[r] = n;
    e->x_pos[r] = pos;
    e->x_k[r] = (const uint16_t *const *)kb;
    e->x_v[r] = (const uint16_t *const *)vb;
    sm->attended = w->n + n;
    return QI_OK;
}

/* The attention of a step's segments at layer l: every segment's K/V
 * written, then one backend call for all of them. On a layer the policy
 * decides, each call gathers its statistics into its own region, and the
 * policy then decides every segment's streams (policy_all). */
static qi_status attend_all(qi_engine *e, const segment *segs, int n_seg, int T, int l, qi_err *err) {
    if (e->plan.layers[l].split > 0.0f) return attend_split(e, segs, n_seg, T, l, err);
    const bool policy = policy_layer(e, l);
    qi_backend *b = e->dev[e->plan.layers[l].attn_dev].be;
    qi_status st;
    int n_kv = 0;
    for (int i = 0; i < n_seg; i++)
        if ((st = attend_prepare(e, &segs[i], i, l, &n_kv, NULL, err))) return st;
    TIMED(e, b, QI_OP_KV, qi_backend_kv_write(b, e->kv_src, e->kv_dst, n_kv, e->m->hp.head_dim, err));
    dev_state *X = &e->dev[e->plan.layers[l].attn_dev];
    if (pick_layer(e, l) || fetch_layer(e, l)) {
        HOST_PROF_BEGIN(e);
        st = pick_blocks(e, X, segs, n_seg, l, err);
        HOST_PROF_END(e, QI_OP_POLICY);
        if (st) return st;
    }
    const bool on_dev = policy && !qi_dev_info_get(b)->host_visible;
    if (policy && (st = place_stats(e, n_seg, err))) return st;
    if (on_dev && (st = stats_move(e, X, n_seg, true, err))) return st;
    TIMED(e, b, QI_OP_ATTENTION, qi_backend_attention(b, e->acall, n_seg, err));
    if (!policy) return QI_OK;
    if (on_dev && (st = stats_move(e, X, n_seg, false, err))) return st;
    HOST_PROF_BEGIN(e);
    st = policy_all(e, segs, n_seg, l, err);
    HOST_PROF_END(e, QI_OP_POLICY);
    return st;
}

/* The hidden state (rows of n_embd) moves to device d where the next block
 * runs: a copy on the stream that orders it (xfer), d's later work after
 * it. */
static qi_status move_x(qi_engine *e, int *x_dev, int d, int rows, qi_err *err) {
    if (*x_dev == d || rows == 0) {
        *x_dev = d;
        return QI_OK;
    }
    const dev_state *from = &e->dev[*x_dev], *to = &e->dev[d];
    const size_t n = sizeof(float) * (size_t)rows * (size_t)e->m->hp.n_embd;
    xfer x;
    qi_status st;
    if ((st = xfer_begin(e, &x, to->be, from->be, err)) ||
        (st = xfer_copy(e, &x, act_view(to, to->x), act_view(from, from->x), n, err)) ||
        (st = xfer_end(e, &x, false, err)))
        return st;
    *x_dev = d;
    return QI_OK;
}

/* The model's norm over rows: RMSNorm, or LayerNorm with its bias (opt,
 * falcon). */
static qi_status norm_rows(qi_backend *b, const qi_hparams *hp, const float *x, const qi_weight *w,
                           const qi_weight *bias, int T, int n, float *y, qi_err *err) {
    if (!hp->layer_norm) return qi_backend_rmsnorm(b, x, w->data, T, n, hp->rms_eps, y, err);
    return qi_backend_layernorm(b, x, w->data, bias->data, T, n, hp->rms_eps, y, err);
}

/* y[T][..] += a matmul's bias bw, where the model has one (opt). */
static qi_status add_bias(qi_backend *b, const qi_weight *bw, float *y, int T, qi_err *err) {
    if (!bw->data) return QI_OK;
    return qi_backend_add_bias(b, y, bw->data, T, (int)bw->n_cols, err);
}

/* The attention block of layer l on its device: x += attn(norm(x)), the
 * step's K/V written and, on the last layer, the rows carried on cut to
 * the output rows (*rows = R). In a parallel layer (falcon) x is left as it
 * is and attn(norm(x)) kept in the device's xn, for the MLP block to add. */
static qi_status attention_block(qi_engine *e, const segment *segs, int n_seg, int T, int R, int l, int *rows,
                                 qi_err *err) {
    const qi_model *m = e->m;
    const qi_hparams *hp = &m->hp;
    const dev_state *A = &e->dev[e->plan.layers[l].attn_dev];
    qi_backend *b = A->be;
    const qi_layer *ly = &A->layers[l];
    const int E = hp->n_embd, H = hp->n_head, Hkv = hp->n_head_kv, D = hp->head_dim;
    const bool swa = hp->n_swa > 0 && ly->swa;
    const float base = swa ? hp->rope_base_swa : hp->rope_base;
    OP(norm_rows(b, hp, A->x, &ly->attn_norm, &ly->attn_norm_b, T, E, A->xn, err));
    const qi_weight *qkv[3] = {&ly->wq, &ly->wk, &ly->wv};
    float *const qkv_out[3] = {A->q, A->k, A->v};
    if (sp_path(e)) {
        static const int wi[3] = {SP_W_Q, SP_W_K, SP_W_V};
        OP(mm_site(e, b, l, wi, qkv, qkv_out, 3, A->xn, T, sp_site(e, l, QI_SITE_ATTN_IN, A->xn, T, E), err));
    } else {
        OP(matmul_n(e, b, qkv, qkv_out, 3, A->xn, T, err));
    }
    OP(add_bias(b, &ly->bq, A->q, T, err));
    OP(add_bias(b, &ly->bk, A->k, T, err));
    OP(add_bias(b, &ly->bv, A->v, T, err));
    if (ly->q_norm.data) OP(qi_backend_rmsnorm(b, A->q, ly->q_norm.data, T * H, D, hp->rms_eps, A->q, err));
    if (ly->k_norm.data) OP(qi_backend_rmsnorm(b, A->k, ly->k_norm.data, T * Hkv, D, hp->rms_eps, A->k, err));
    if (hp->n_rot > 0) /* none with learned positions (opt) */
        OP(qi_backend_rope(b, A->q, H, A->k, Hkv, T, D, hp->n_rot, e->q_pos, base, hp->rope_freq_scale,
                           hp->rope_mode, err));
    if (hp->q_scale > 0) OP(qi_backend_scale(b, A->q, (long)T * H * D, hp->q_scale, err));
    OP(attend_all(e, segs, n_seg, T, l, err));
    if (sp_path(e)) {
        static const int wi[1] = {SP_W_O};
        const qi_weight *wo = &ly->wo;
        float *const out = A->xn;
        OP(mm_site(e, b, l, wi, &wo, &out, 1, A->att, T, sp_site(e, l, QI_SITE_ATTN_OUT, A->att, T, H * D), err));
    } else {
        OP(matmul(e, b, &ly->wo, A->att, T, A->xn, err));
    }
    OP(add_bias(b, &ly->bo, A->xn, T, err));
    if (l == hp->n_layer - 1 && R < T) {
        /* carry on with the output rows only */
        *rows = R;
        if (R == 0) return QI_OK;
        OP(qi_backend_gather_rows(b, A->x, e->out_rows, R, E, err));
        OP(qi_backend_gather_rows(b, A->xn, e->out_rows, R, E, err));
    }
    if (ly->attn_post_norm.data)
        OP(qi_backend_rmsnorm(b, A->xn, ly->attn_post_norm.data, *rows, E, hp->rms_eps, A->xn, err));
    if (hp->parallel) return QI_OK; /* added by the MLP block */
    return qi_backend_add(b, A->x, A->xn, (long)*rows * E, err);
}

/* opts.ffn_observe: layer l's FFN activations, [rows][n_ff] on b (a
 * host-visible device: check_observe), handed to the observer once b's
 * queued work has run. */
static qi_status observe_ffn(qi_engine *e, qi_backend *b, int l, const float *act, int rows, qi_err *err) {
    OP(qi_dev_synchronize(b, err));
    e->o.ffn_observe(e->o.ffn_observe_ctx, l, act, rows, e->m->hp.n_ff);
    return QI_OK;
}

/* The MLP block of a gate-free FFN (opt, falcon): x += down(act(up(norm(x)))),
 * with the matmuls' biases where the model has them. In a parallel layer
 * (falcon) the MLP's input and output go through the gate's rows (unused
 * without a gate, and at least n_embd wide: model.c checks n_ff), since xn
 * holds the attention's output on its device; that output, copied over
 * when the attention ran on another device, is added to x after the MLP's. */
static qi_status mlp_gate_free(qi_engine *e, int l, int rows, qi_err *err) {
    const qi_hparams *hp = &e->m->hp;
    const int a = e->plan.layers[l].attn_dev, f = e->plan.layers[l].mlp_dev;
    const dev_state *M = &e->dev[f];
    qi_backend *b = M->be;
    const qi_layer *ly = &M->layers[l];
    const int E = hp->n_embd;
    float *h = hp->parallel ? M->gate : M->xn;
    OP(norm_rows(b, hp, M->x, &ly->ffn_norm, &ly->ffn_norm_b, rows, E, h, err));
    OP(matmul(e, b, &ly->w_up, h, rows, M->up, err));
    OP(add_bias(b, &ly->b_up, M->up, rows, err));
    OP(qi_backend_act(b, hp->ffn_act == QI_FFN_GELU, M->up, rows, hp->n_ff, err));
    if (e->o.ffn_observe) OP(observe_ffn(e, b, l, M->up, rows, err));
    OP(matmul(e, b, &ly->w_down, M->up, rows, h, err));
    OP(add_bias(b, &ly->b_down, h, rows, err));
    OP(qi_backend_add(b, M->x, h, (long)rows * E, err));
    if (!hp->parallel) return QI_OK;
    if (a != f) {
        const dev_state *A = &e->dev[a];
        xfer x;
        qi_status st;
        if ((st = xfer_begin(e, &x, M->be, A->be, err)) ||
            (st = xfer_copy(e, &x, act_view(M, M->xn), act_view(A, A->xn), sizeof(float) * (size_t)rows * E, err)) ||
            (st = xfer_end(e, &x, false, err)))
            return st;
    }
    return qi_backend_add(b, M->x, M->xn, (long)rows * E, err);
}

/* opts.neuron_active: the active (row, neuron) pairs of layer l's
 * activations a [rows][n], on the fast side or not. */
static void count_active(qi_engine *e, int l, const float *a, int rows, int n, bool fast) {
    const float t = e->o.neuron_active;
    long long k = 0;
    for (size_t i = 0; i < (size_t)rows * (size_t)n; i++) k += fabsf(a[i]) > t;
    e->ns_rp[l].active += k;
    if (fast) e->ns_rp[l].hit += k;
}

bool qi_engine_neuron_stats(const qi_engine *e, int l, qi_engine_neuron_rp *out) {
    if (!e->ns_rp || l < 0 || l >= e->m->hp.n_layer) return false;
    *out = e->ns_rp[l];
    out->n_fast = e->ns[l].n[1];
    return true;
}

/* cats: act(gate) in e->sp_act [rows][n] zeroed where |x| <= tg, counted;
 * the neurons kept by some row (the union) in e->sp_idx, their number
 * returned. */
static int cats_keep(qi_engine *e, float tg, int rows, int n) {
    long z = 0;
    const int k = qi_sparse_threshold(e->sp_act, (size_t)n, rows, n, tg, e->sp_idx, &z);
    e->sp_zeroed += (double)z;
    e->sp_seen += (double)rows * n;
    return k;
}

typedef struct {
    const qi_weight *wg, *wu;
    qi_k_gemm_fn gemm_g, gemm_u;
    void (*glu)(int64_t n, float *g, const float *u);
    const void *xq;
    uint64_t qrow_bytes;
    int T, F;
    float tg;
    double max_density; /* up's rows all computed where more are kept */
    float *g, *u, *act; /* [T][F]: gate, up, act(gate) */
    const float *ones;
    int32_t *idx, *cnt; /* chunk c's neurons listed at idx + 32 c, cnt[c] of them */
    long *zeroed;       /* [chunk] */
} cats_job;

/* cats's gate, up and glu for the 32-neuron chunks of one thread, with no
 * wait between them: whether a neuron is kept depends on its own gate row
 * alone (over the rows of the step), so each thread thresholds the gate
 * rows it made and computes the up rows it keeps. Every operation is the
 * unfused path's, on the same elements: the gate's and up's rows in the
 * dense matmul's order, the glu on ranges starting at multiples of 16 (as
 * the backend splits a row). Lists, per chunk, the neurons whose output
 * is not zero for some row (down's active columns). */
static void cats_work(void *arg, int ith, int nth) {
    const cats_job *j = arg;
    const int F = j->F, T = j->T;
    long lo, hi;
    qi_split((F + 31) / 32, ith, nth, &lo, &hi);
    if (lo >= hi) return;
    const long a = 32 * lo, b = 32 * hi < F ? 32 * hi : F, n = b - a;
    rows_range(j->wg, j->gemm_g, j->xq, j->qrow_bytes, T, a, b, j->g);
    for (int t = 0; t < T; t++) {
        float *act = j->act + (size_t)t * F + a, *u = j->u + (size_t)t * F + a;
        memcpy(act, j->g + (size_t)t * F + a, sizeof(float) * (size_t)n);
        j->glu(n, act, j->ones + (size_t)t * F + a);
        memset(u, 0, sizeof(float) * (size_t)n);
    }
    /* the kept neurons of the thread's chunks, listed one after another
     * from idx + a (this thread's part of idx) */
    long n_kept = 0;
    for (long c = lo; c < hi; c++) {
        const long c0 = 32 * c, c1 = c0 + 32 < F ? c0 + 32 : F;
        long z = 0;
        for (long i = c0; i < c1; i++) {
            int any = 0;
            for (int t = 0; t < T; t++) {
                float *p = j->act + (size_t)t * F + i;
                const int keep = !(fabsf(*p) <= j->tg);
                *p = keep ? *p : 0.0f;
                z += !keep;
                any |= keep;
            }
            j->idx[a + n_kept] = (int32_t)i;
            n_kept += any;
        }
        j->zeroed[c] = z;
    }
    /* many kept: the kernels' runs would be short, slower than the whole
     * range in one call (the dropped rows' values are zeroed below) */
    if ((double)n_kept > j->max_density * (double)n)
        rows_range(j->wu, j->gemm_u, j->xq, j->qrow_bytes, T, a, b, j->u);
    else
        rows_runs(j->wu, j->gemm_u, j->xq, j->qrow_bytes, T, j->idx + a, n_kept, j->u);
    for (int t = 0; t < T; t++) {
        float *g = j->g + (size_t)t * F;
        const float *act = j->act + (size_t)t * F;
        j->glu(n, g + a, j->u + (size_t)t * F + a);
        for (long i = a; i < b; i++) g[i] = act[i] == 0.0f ? 0.0f : g[i];
    }
    for (long c = lo; c < hi; c++) {
        const long c0 = 32 * c, c1 = c0 + 32 < F ? c0 + 32 : F;
        int k = 0;
        for (long i = c0; i < c1; i++) {
            int any = 0;
            for (int t = 0; t < T; t++) any |= j->g[(size_t)t * F + i] != 0.0f;
            j->idx[c0 + k] = (int32_t)i;
            k += any;
        }
        j->cnt[c] = k;
    }
}

/* cats's gate, up and glu on the CPU in one pass over the threads (the
 * unfused path's results, bit for bit): M->gate [rows][F] then holds the
 * glu's output with each row's dropped neurons zeroed, e->sp_act the
 * thresholded act(gate); returns the count of down's active columns, listed
 * in e->sp_idx. */
static qi_status cats_ffn(qi_engine *e, qi_backend *b, const dev_state *M, const qi_layer *ly, int rows, bool gelu,
                          float tg, int *n_act, qi_err *err) {
    const int F = e->m->hp.n_ff;
    const qi_kernels *k = qi_kernels_get();
    cats_job j = {.wg = &ly->w_gate, .wu = &ly->w_up, .glu = gelu ? k->geglu : k->swiglu, .xq = e->sp_xq, .T = rows,
                  .F = F, .tg = tg, .max_density = e->o.sparse_max_density, .g = M->gate, .u = M->up, .act = e->sp_act, .ones = e->sp_ones, .idx = e->sp_idx,
                  .cnt = e->sp_cnt, .zeroed = e->sp_zc};
    j.gemm_g = rows >= QI_K_WIDE_MIN && k->gemm_wide[j.wg->type] ? k->gemm_wide[j.wg->type] : k->gemm[j.wg->type];
    j.gemm_u = rows >= QI_K_WIDE_MIN && k->gemm_wide[j.wu->type] ? k->gemm_wide[j.wu->type] : k->gemm[j.wu->type];
    const uint32_t dt = qi_vec_dot_type(j.wg->type);
    QI_ASSERT(dt == qi_vec_dot_type(j.wu->type));
    qi_type_row_bytes(dt, (uint64_t)j.wg->n_cols, &j.qrow_bytes);
    for (int t = 0; t < rows; t++)
        qi_quantize_act_row(dt, M->xn + (size_t)t * (size_t)j.wg->n_cols,
                            (char *)e->sp_xq + (uint64_t)t * j.qrow_bytes, j.wg->n_cols);
    TIMED(e, b, QI_OP_MATMUL, (qi_backend_cpu_host_run(e->be, cats_work, &j), QI_OK));
    int total = 0;
    long z = 0;
    for (int c = 0; c < (F + 31) / 32; c++) {
        memmove(e->sp_idx + total, e->sp_idx + 32 * c, sizeof(int32_t) * (size_t)e->sp_cnt[c]);
        total += e->sp_cnt[c];
        z += e->sp_zc[c];
    }
    e->sp_zeroed += (double)z;
    e->sp_seen += (double)rows * F;
    if (e->o.profile) {
        long kept = 0; /* up's rows read: those some row keeps, or all */
        for (size_t i = 0; i < (size_t)F; i++) {
            int any = 0;
            for (int t = 0; t < rows; t++) any |= e->sp_act[(size_t)t * F + i] != 0.0f;
            kept += any;
        }
        const double up_rows = (double)kept > j.max_density * F ? F : (double)kept; /* as most threads chose */
        e->prof.matmul_bytes += (double)j.wg->row_bytes * (double)F + (double)j.wu->row_bytes * up_rows;
    }
    *n_act = total;
    return QI_OK;
}

/* The MLP block of a gated FFN under opts.sparsity or opts.act_observe,
 * on the CPU, from its normed input in M->xn: teal thresholds gate and
 * up's input and down's; cats computes the gate, keeps the neurons whose
 * |act(gate)| is over the threshold (the union over the rows), computes
 * up's rows of those alone and zeroes each row's other neurons before down.
 * Without a threshold at a site the matmuls there are the dense ones. */
static qi_status mlp_sparse(qi_engine *e, int l, int rows, qi_err *err) {
    const qi_hparams *hp = &e->m->hp;
    const dev_state *M = &e->dev[e->plan.layers[l].mlp_dev];
    qi_backend *b = M->be;
    const qi_layer *ly = &M->layers[l];
    const int E = hp->n_embd, F = hp->n_ff;
    const bool gelu = hp->ffn_act == QI_FFN_GEGLU_TANH;
    const float tg = sp_thr(e, l, QI_SITE_GATE);
    const qi_weight *gu[2] = {&ly->w_gate, &ly->w_up};
    float *const gu_out[2] = {M->gate, M->up};
    const int n_in = sp_site(e, l, QI_SITE_FFN_IN, M->xn, rows, E);
    int n_act = -1;
    const bool fused = tg >= 0.0f && n_in < 0 && !e->o.act_observe && !e->o.ffn_observe &&
                       sp_thr(e, l, QI_SITE_FFN_ACT) < 0.0f && !ly->w_gate.packed && !ly->w_up.packed &&
                       qi_vec_dot_type(ly->w_gate.type) == qi_vec_dot_type(ly->w_up.type);
    if (fused) {
        OP(cats_ffn(e, b, M, ly, rows, gelu, tg, &n_act, err));
    } else if (tg < 0.0f && !e->o.act_observe) {
        static const int wi[2] = {SP_W_GATE, SP_W_UP};
        OP(mm_site(e, b, l, wi, gu, gu_out, 2, M->xn, rows, n_in, err));
    } else {
        static const int wi[1] = {SP_W_GATE};
        OP(mm_site(e, b, l, wi, gu, gu_out, 1, M->xn, rows, n_in, err));
        /* act(gate), as the glu computes it (times 1) */
        const size_t n = (size_t)rows * (size_t)F;
        memcpy(e->sp_act, M->gate, sizeof(float) * n);
        OP(qi_backend_glu(b, gelu, e->sp_act, e->sp_ones, rows, F, err));
        if (e->o.act_observe) e->o.act_observe(e->o.act_observe_ctx, l, QI_SITE_GATE, e->sp_act, rows, F);
        if (tg < 0.0f) {
            static const int wi_up[1] = {SP_W_UP};
            OP(mm_site(e, b, l, wi_up, &gu[1], &gu_out[1], 1, M->xn, rows, n_in, err));
        } else {
            const int n_keep = cats_keep(e, tg, rows, F);
            if ((double)n_keep <= e->o.sparse_max_density * F) {
                memset(M->up, 0, sizeof(float) * n);
                OP(mm_rows(e, b, &ly->w_up, M->xn, rows, e->sp_idx, n_keep, M->up, err));
            } else {
                OP(matmul(e, b, &ly->w_up, M->xn, rows, M->up, err));
            }
        }
    }
    if (!fused) {
        OP(qi_backend_glu(b, gelu, M->gate, M->up, rows, F, err));
        if (e->o.ffn_observe) OP(observe_ffn(e, b, l, M->gate, rows, err));
        if (tg >= 0.0f) /* a neuron off for this row, on for another's: zero here */
            for (size_t i = 0; i < (size_t)rows * (size_t)F; i++)
                if (e->sp_act[i] == 0.0f) M->gate[i] = 0.0f;
    }
    if (e->ns_rp) { /* a layer not split, under cats */
        e->ns_rp[l].tokens += rows;
        count_active(e, l, M->gate, rows, F, false);
    }
    if (!fused) {
        n_act = sp_site(e, l, QI_SITE_FFN_ACT, M->gate, rows, F);
        if (n_act < 0 && tg >= 0.0f) n_act = qi_sparse_active(M->gate, (size_t)F, rows, F, e->sp_idx);
    }
    static const int wi_down[1] = {SP_W_DOWN};
    const qi_weight *down = &ly->w_down;
    float *const out = M->xn;
    OP(mm_site(e, b, l, wi_down, &down, &out, 1, M->gate, rows, n_act, err));
    if (ly->ffn_post_norm.data)
        OP(qi_backend_rmsnorm(b, M->xn, ly->ffn_post_norm.data, rows, E, hp->rms_eps, M->xn, err));
    return qi_backend_add(b, M->x, M->xn, (long)rows * E, err);
}

/* One side of a split FFN on device D, from its normed input in D->xn:
 * D->xn = down_s . glu(gate_s xn, up_s xn) over its n neurons. */
static qi_status ffn_side(qi_engine *e, const dev_state *D, const qi_weight *w, int n, int rows, bool gelu,
                          qi_err *err) {
    const qi_weight *gu[2] = {&w[0], &w[1]};
    float *const gu_out[2] = {D->gate, D->up};
    OP(matmul_n(e, D->be, gu, gu_out, 2, D->xn, rows, err));
    OP(qi_backend_glu(D->be, gelu, D->gate, D->up, rows, n, err));
    return matmul(e, D->be, &w[2], D->gate, rows, D->xn, err);
}

/* The cold side of a split FFN on the CPU under cats (opts.sparsity):
 * gate whole, its neurons with |act(gate)| over the layer's threshold
 * kept (the union over the rows), up's rows of those alone, the others
 * zeroed row by row, and down read by the kept columns (its column form)
 * where few enough are kept; the dense matmuls otherwise. As mlp_sparse's
 * cats, on the side's own matrices. */
static qi_status ffn_side_cats(qi_engine *e, const dev_state *M, int l, int rows, bool gelu, qi_err *err) {
    const qi_weight *w = e->ns_w[l][0];
    const int n = e->ns[l].n[0];
    const size_t nn = (size_t)rows * (size_t)n;
    const float tg = sp_thr(e, l, QI_SITE_GATE);
    OP(matmul(e, M->be, &w[0], M->xn, rows, M->gate, err));
    memcpy(e->sp_act, M->gate, sizeof(float) * nn);
    OP(qi_backend_glu(M->be, gelu, e->sp_act, e->sp_ones, rows, n, err));
    const int n_act = cats_keep(e, tg, rows, n);
    const bool sparse = (double)n_act <= e->o.sparse_max_density * n;
    if (sparse) {
        memset(M->up, 0, sizeof(float) * nn);
        OP(mm_rows(e, M->be, &w[1], M->xn, rows, e->sp_idx, n_act, M->up, err));
    } else {
        OP(matmul(e, M->be, &w[1], M->xn, rows, M->up, err));
    }
    OP(qi_backend_glu(M->be, gelu, M->gate, M->up, rows, n, err));
    for (size_t i = 0; i < nn; i++)
        if (e->sp_act[i] == 0.0f) M->gate[i] = 0.0f;
    const qi_colw *cw = &e->ns_cw[l];
    if (!sparse || !cw->codes) return matmul(e, M->be, &w[2], M->gate, rows, M->xn, err);
    sp_job j = {.w = {cw}, .y = {M->xn}, .n_w = 1, .x = M->gate, .T = rows, .idx = e->sp_idx, .n_idx = n_act,
                .fn = qi_sparse_matmul()};
    TIMED(e, M->be, QI_OP_MATMUL, sp_run(e, &j));
    if (e->o.profile)
        e->prof.matmul_bytes += (double)cw->col_bytes * n_act + (double)qi_colw_bytes(cw) -
                                (double)cw->col_bytes * (double)cw->n_in;
    return QI_OK;
}

/* Neurons the CPU computes on a simulated machine with a what-if density
 * (opts.sim_cold_density): gate whole, then up's rows and down's columns
 * of that share of the n neurons alone (rounded up to whole blocks of
 * down's type: views of the weights with fewer rows or columns, which is
 * all the simulator reads of them), the bytes and FLOPs cats reads when
 * that share is active. Nothing is computed. */
static qi_status ffn_sim_sparse(qi_engine *e, const dev_state *M, const qi_weight *gate, const qi_weight *up_w,
                                const qi_weight *down_w, int n, int rows, bool gelu, qi_err *err) {
    const int unit = (int)qi_type_get(down_w->type)->blck;
    int k = (int)ceil(e->o.sim_cold_density * n / unit) * unit;
    k = k > n ? n : k < unit ? unit : k;
    qi_weight up = *up_w, down = *down_w;
    up.n_rows = k;
    down.n_cols = k;
    if (!qi_type_row_bytes(down.type, (uint64_t)k, &down.row_bytes))
        return QI_ERR(err, QI_ERR_INVALID, "%d neurons are not whole blocks of down's type", k);
    OP(matmul(e, M->be, gate, M->xn, rows, M->gate, err));
    OP(matmul(e, M->be, &up, M->xn, rows, M->up, err));
    OP(qi_backend_glu(M->be, gelu, M->gate, M->up, rows, k, err));
    return matmul(e, M->be, &down, M->gate, rows, M->xn, err);
}

/* The swap worker's window of layer l: each unit's |act| summed over the
 * rows, the cold side's from M's activations (by cold position; the spare
 * computes nothing) and the hot side's from the copy in ns_obs (by slot,
 * slot[] the live view's: an empty slot computes nothing). Fed at once,
 * or with the background worker summed until live_round feeds it. */
static qi_status live_feed(qi_engine *e, int l, const float *cold, const int32_t *slot, int rows, qi_err *err) {
    const qi_ffn_split *sp = &e->ns[l];
    const int unit = sp->unit, n0 = sp->n[0], n1 = sp->n[1];
    const size_t nu = (size_t)sp->n_units;
    double *feed = e->o.neuron_swap_worker ? e->ns_acc + (size_t)l * nu : e->ns_feed;
    if (!e->o.neuron_swap_worker) memset(feed, 0, sizeof(double) * nu);
    for (int side = 0; side < 2; side++) {
        const int32_t *at = side ? slot : e->ns_cold + (size_t)l * nu;
        const int n = side ? n1 : n0;
        const float *a = side ? e->ns_obs : cold;
        for (int k = 0; k < n / unit; k++) {
            if (at[k] < 0) continue;
            for (int t = 0; t < rows; t++)
                for (int j = 0; j < unit; j++) feed[at[k]] += fabsf(a[(size_t)t * n + (size_t)k * unit + j]);
        }
    }
    if (e->o.neuron_swap_worker) {
        e->ns_acc_tok[l] += rows;
        return QI_OK;
    }
    return qi_neuron_live_feed(e->live, l, feed, rows, err);
}

/* Both sides of split layer l's FFN from the normed input (in M->xn and
 * F->xn): F's queued first, so that the host's part overlaps it, each
 * side's partial product left in its xn; the active neurons counted and
 * the activity fed, by slot[] (the live view's) on the fast side. */
static qi_status mlp_split_sides(qi_engine *e, int l, int rows, bool gelu, const dev_state *M, const dev_state *F,
                                 const int32_t *slot, qi_err *err) {
    const qi_ffn_split *sp = &e->ns[l];
    qi_status st;
    e->cur_slot = 1;
    st = ffn_side(e, F, e->ns_w[l][1], sp->n[1], rows, gelu, err);
    e->cur_slot = 0;
    if (st) return st;
    if (sp->n[0] && (st = e->sp_w && !e->sp_paused       ? ffn_side_cats(e, M, l, rows, gelu, err)
                          : e->o.sim_cold_density > 0.0 ? ffn_sim_sparse(e, M, &e->ns_w[l][0][0], &e->ns_w[l][0][1],
                                                                         &e->ns_w[l][0][2], sp->n[0], rows, gelu, err)
                                                        : ffn_side(e, M, e->ns_w[l][0], sp->n[0], rows, gelu, err)))
        return st;
    if (e->ns_rp || e->live) { /* both sides' activations, the fast one's copied back */
        const size_t fb = sizeof(float) * (size_t)rows * (size_t)sp->n[1];
        if ((st = qi_dev_download(F->be, e->ns_obs, act_view(F, F->gate), fb, err)) ||
            (st = qi_dev_synchronize(F->be, err)))
            return st;
    }
    if (e->ns_rp) {
        e->ns_rp[l].tokens += rows;
        if (sp->n[0]) count_active(e, l, M->gate, rows, sp->n[0], false);
        count_active(e, l, e->ns_obs, rows, sp->n[1], true);
    }
    return e->live ? live_feed(e, l, M->gate, slot, rows, err) : QI_OK;
}

/* The MLP block of a layer whose neurons are split (opts.neuron_fast):
 * the norm on the CPU (M), its result copied to the fast device (F), each
 * side's neurons computed at once (F's queued first, so that the host's
 * part overlaps it), F's partial product copied back and added to M's,
 * then the residual as in mlp_block. */
static qi_status mlp_split(qi_engine *e, int l, int rows, qi_err *err) {
    const qi_hparams *hp = &e->m->hp;
    const dev_state *M = &e->dev[e->plan.layers[l].mlp_dev], *F = &e->dev[e->o.neuron_dev];
    const qi_ffn_split *sp = &e->ns[l];
    const bool gelu = hp->ffn_act == QI_FFN_GEGLU_TANH;
    const size_t nb = sizeof(float) * (size_t)rows * (size_t)hp->n_embd;
    qi_status st;
    xfer x;
    OP(qi_backend_rmsnorm(M->be, M->x, M->layers[l].ffn_norm.data, rows, hp->n_embd, hp->rms_eps, M->xn, err));
    /* the host overwrites M->xn below: it waits for the copy */
    if ((st = xfer_begin(e, &x, F->be, M->be, err)) ||
        (st = xfer_copy(e, &x, act_view(F, F->xn), act_view(M, M->xn), nb, err)) || (st = xfer_end(e, &x, true, err)))
        return st;
    /* the layer held still while both sides compute it and its activity is
     * read (with the background worker, the time waited for its hold is
     * what the swaps cost this thread) */
    qi_neuron_live_view v = {0};
    if (e->live) {
        const double t0 = e->o.neuron_swap_worker ? now_s() : 0.0;
        qi_neuron_live_begin(e->live, l, &v);
        if (e->o.neuron_swap_worker) {
            pthread_mutex_lock(&e->swap_mu);
            e->swaps.seconds += now_s() - t0;
            pthread_mutex_unlock(&e->swap_mu);
        }
    }
    if (e->o.neuron_swap_worker)
        for (int s = 0; s < sp->n[1] / sp->unit; s++)
            if (v.slot[s] < 0) {
                e->swaps.mid++; /* this thread's alone */
                atomic_fetch_add(&e->ns_mid, 1);
                break;
            }
    if (e->live && e->ns_check_steps && (st = check_layer(e, l, v.slot, err))) {
        qi_neuron_live_end(e->live, l);
        return st;
    }
    st = mlp_split_sides(e, l, rows, gelu, M, F, v.slot, err);
    if (e->live) qi_neuron_live_end(e->live, l);
    if (st) return st;
    float *to = sp->n[0] ? M->nr : M->xn;
    if ((st = xfer_begin(e, &x, M->be, F->be, err)) ||
        (st = xfer_copy(e, &x, act_view(M, to), act_view(F, F->xn), nb, err)) || (st = xfer_end(e, &x, false, err)))
        return st;
    if (sp->n[0]) OP(qi_backend_add(M->be, M->xn, M->nr, (long)rows * hp->n_embd, err));
    const qi_layer *ly = &M->layers[l];
    if (ly->ffn_post_norm.data)
        OP(qi_backend_rmsnorm(M->be, M->xn, ly->ffn_post_norm.data, rows, hp->n_embd, hp->rms_eps, M->xn, err));
    return qi_backend_add(M->be, M->x, M->xn, (long)rows * hp->n_embd, err);
}

/* The MLP block of layer l on its device: x += down(glu(gate(norm(x)), up(norm(x)))). */
static qi_status mlp_block(qi_engine *e, int l, int rows, qi_err *err) {
    const qi_hparams *hp = &e->m->hp;
    const dev_state *M = &e->dev[e->plan.layers[l].mlp_dev];
    qi_backend *b = M->be;
    const qi_layer *ly = &M->layers[l];
    const int E = hp->n_embd;
    if (qi_ffn_gate_free(hp->ffn_act)) return mlp_gate_free(e, l, rows, err);
    if (e->ns && e->ns[l].n[1]) return mlp_split(e, l, rows, err);
    OP(qi_backend_rmsnorm(b, M->x, ly->ffn_norm.data, rows, E, hp->rms_eps, M->xn, err));
    if (e->o.sim_cold_density > 0.0 && M == &e->dev[0]) { /* the what-if on the CPU's whole MLP */
        OP(ffn_sim_sparse(e, M, &ly->w_gate, &ly->w_up, &ly->w_down, hp->n_ff, rows,
                          hp->ffn_act == QI_FFN_GEGLU_TANH, err));
        if (ly->ffn_post_norm.data) OP(qi_backend_rmsnorm(b, M->xn, ly->ffn_post_norm.data, rows, E, hp->rms_eps, M->xn, err));
        return qi_backend_add(b, M->x, M->xn, (long)rows * E, err);
    }
    const qi_weight *gu[2] = {&ly->w_gate, &ly->w_up};
    float *const gu_out[2] = {M->gate, M->up};
    if (sp_path(e)) return mlp_sparse(e, l, rows, err);
    OP(matmul_n(e, b, gu, gu_out, 2, M->xn, rows, err));
    OP(qi_backend_glu(b, hp->ffn_act == QI_FFN_GEGLU_TANH, M->gate, M->up, rows, hp->n_ff, err));
    if (e->o.ffn_observe) OP(observe_ffn(e, b, l, M->gate, rows, err));
    if (e->ns_rp && M == &e->dev[0]) { /* a layer not split: nothing on the fast side */
        e->ns_rp[l].tokens += rows;
        count_active(e, l, M->gate, rows, hp->n_ff, false);
    }
    OP(matmul(e, b, &ly->w_down, M->gate, rows, M->xn, err));
    if (ly->ffn_post_norm.data)
        OP(qi_backend_rmsnorm(b, M->xn, ly->ffn_post_norm.data, rows, E, hp->rms_eps, M->xn, err));
    return qi_backend_add(b, M->x, M->xn, (long)rows * E, err);
}

/* The output head on its device, R rows of logits into e->logits (the
 * host's). */
static qi_status head_block(qi_engine *e, int R, qi_err *err) {
    const qi_hparams *hp = &e->m->hp;
    dev_state *O = &e->dev[e->plan.head_dev];
    qi_backend *b = O->be;
    const size_t bytes = sizeof(float) * (size_t)R * (size_t)hp->n_vocab;
    float *out = e->logits;
    qi_status st;
    if (O != &e->dev[0]) {
        if (R > O->cap_logit_rows) {
            qi_buf_free(O->lbuf);
            O->lbuf = NULL;
            O->cap_logit_rows = 0;
            if ((st = qi_buf_alloc(b, bytes, "logits", &O->lbuf, err))) return st;
            O->logits = qi_buf_ptr(b, qi_view_of(O->lbuf, 0), bytes, err);
            O->cap_logit_rows = R;
        }
        out = O->logits;
    }
    OP(norm_rows(b, hp, O->x, &O->out_norm, &O->out_norm_b, R, hp->n_embd, O->xn, err));
    OP(matmul(e, b, &O->output, O->xn, R, out, err));
    if (hp->logit_softcap > 0) OP(qi_backend_softcap(b, out, (long)R * hp->n_vocab, hp->logit_softcap, err));
    if (O == &e->dev[0]) return QI_OK;
    if ((st = qi_dev_download(b, e->logits, qi_view_of(O->lbuf, 0), bytes, err))) return st;
    return qi_dev_synchronize(b, err);
}

/* Learned positions (opt): row q_pos[t] of the table added to token t's
 * embedding, through xn. */
static qi_status add_positions(qi_engine *e, const dev_state *X, int T, qi_err *err) {
    for (int t = 0; t < T; t++)
        if (e->q_pos[t] >= X->pos_embd.n_rows)
            return QI_ERR(err, QI_ERR_INVALID, "position %d is past the model's %lld learned positions", e->q_pos[t],
                          (long long)X->pos_embd.n_rows);
    OP(qi_backend_get_rows(X->be, &X->pos_embd, e->q_pos, T, X->xn, err));
    return qi_backend_add(X->be, X->x, X->xn, (long)T * e->m->hp.n_embd, err);
}

static qi_status forward(qi_engine *e, const segment *segs, int n_seg, int T, int R, qi_err *err) {
    const qi_model *m = e->m;
    const qi_hparams *hp = &m->hp;
    const qi_plan *p = &e->plan;
    qi_status st;

    for (int i = 0; i < n_seg; i++)
        for (int t = 0; t < segs[i].n; t++) e->q_pos[segs[i].off + t] = segs[i].pos0 + t;
    int x_dev = p->embd_dev;
    qi_event *t0;
    {
        const dev_state *X = &e->dev[x_dev];
        if ((st = span_begin(e, x_dev, 0, &t0, err))) return st;
        st = qi_backend_get_rows(X->be, &X->tok_embd, e->tokens, T, X->x, err);
        if (!st && hp->embd_scale != 1.0f)
            st = qi_backend_scale(X->be, X->x, (long)T * hp->n_embd, hp->embd_scale, err);
        if (!st && X->pos_embd.data) st = add_positions(e, X, T, err);
        if ((st = span_end(e, x_dev, 0, t0, st, err))) return st;
    }
    int rows = T;
    for (int l = 0; l < hp->n_layer; l++) {
        const int a = p->layers[l].attn_dev, f = p->layers[l].mlp_dev;
        if ((st = move_x(e, &x_dev, a, rows, err)) || (st = span_begin(e, a, 1 + 2 * l, &t0, err)) ||
            (st = span_end(e, a, 1 + 2 * l, t0, attention_block(e, segs, n_seg, T, R, l, &rows, err), err)))
            return st;
        if (rows == 0) break;
        if ((st = move_x(e, &x_dev, f, rows, err)) || (st = span_begin(e, f, 2 + 2 * l, &t0, err)) ||
            (st = span_end(e, f, 2 + 2 * l, t0, mlp_block(e, l, rows, err), err)))
            return st;
    }
    if (R == 0) return QI_OK;
    const int hb = 2 * hp->n_layer + 1;
    if ((st = move_x(e, &x_dev, p->head_dev, R, err)) || (st = span_begin(e, p->head_dev, hb, &t0, err)))
        return st;
    return span_end(e, p->head_dev, hb, t0, head_block(e, R, err), err);
}

/* The end of a step: every device's stream waited for, the first failure
 * met inside one (a copy that failed on a device's worker) reported, and,
 * with profile on, the step's copies timed by their events. */
static qi_status finish_step(qi_engine *e, qi_err *err) {
    const qi_status first = sync_all(e, err);
    for (int i = 0; i + 1 < e->n_cev; i += 2) {
        qi_event_sync(e->cev[i + 1]);
        const double t = qi_event_elapsed(e->cev[i], e->cev[i + 1]);
        const int kind = e->cev_kind[i / 2], tag = e->cev_tag[i / 2], dev = e->cev_dev[i / 2];
        if (kind < 0) {
            e->prof.copy_seconds += t;
            e->prof.dev_copy_seconds[dev] += t;
            e->copy_dev_s[tag] += t;
        } else if (kind == QI_OP_COUNT) {
            e->blk_s[tag] += t;
            e->prof.dev_span_seconds[dev] += t;
        } else {
            e->prof.seconds[kind] += t;
            e->prof.dev_op_seconds[dev] += t;
            if (tag & 1)
                e->blk_split_s[tag >> 1] += t;
            else if (kind == QI_OP_ATTENTION || kind == QI_OP_KV)
                e->blk_attn_s[tag >> 1] += t;
        }
    }
    if (e->o.profile && e->n_cev) e->blk_steps++;
    for (int i = 0; i < e->n_cev; i++) qi_event_free(e->cev[i]);
    e->n_cev = 0;
    return first;
}

qi_status qi_engine_step(qi_engine *e, int *n_tokens, qi_err *err) {
    if (n_tokens) *n_tokens = 0;
    qi_err se = {0};
    const qi_status sst = e->live ? swap_state(e, &se) : QI_OK;
    if (sst) /* a unit on neither side: the FFN's sum would miss it */
        return QI_ERR(err, sst, "a neuron swap failed earlier, and the split is incomplete: %s", se.msg);
    for (int i = 0; i < e->o.max_seqs; i++) e->seqs[i].n_logits = 0;
    int T = 0;
    const int n_seg = schedule(e, &T);
    if (n_seg == 0) return QI_OK;
    /* inputs, output rows */
    int R = 0;
    for (int i = 0; i < n_seg; i++) {
        const segment *g = &e->segs[i];
        seq_state *s = &e->seqs[g->id];
        memcpy(e->tokens + g->off, s->pending + s->head, sizeof(int32_t) * (size_t)g->n);
        for (int r = 0; r < g->n_out; r++) e->out_rows[R++] = g->off + g->out_first + r;
    }
    if (R > e->cap_logit_rows) {
        float *p = qi_realloc(e->logits, sizeof(float) * (size_t)R * e->m->hp.n_vocab);
        if (!p) return QI_ERR(err, QI_ERR_NOMEM, "out of memory for %d rows of logits", R);
        e->logits = p;
        e->cap_logit_rows = R;
    }
    const double t0 = e->o.profile ? eclock(e) : 0.0;
    double before = 0.0;
    for (int k = 0; k < QI_OP_OTHER; k++) before += e->prof.seconds[k];
    qi_status st = forward(e, e->segs, n_seg, T, R, err);
    qi_err fe = {0};
    const qi_status fin = finish_step(e, st ? &fe : err); /* the first failure is the one reported */
    if (!st) st = fin;
    if (!st) st = live_round(e, err);
    /* a device's failure with the background worker: one of its uploads,
     * maybe, so the split can no longer be trusted */
    if (st == QI_ERR_BACKEND && e->live && e->o.neuron_swap_worker) swap_failed(e, st, err);
    if (e->o.profile) { /* the ops' device times are in (finish_step); the rest of the step is "other" */
        double after = 0.0;
        for (int k = 0; k < QI_OP_OTHER; k++) after += e->prof.seconds[k];
        e->prof.seconds[QI_OP_OTHER] += (eclock(e) - t0) - (after - before);
        e->prof.calls[QI_OP_OTHER]++;
        e->prof.steps++;
    }
    int row = 0;
    for (int i = 0; i < n_seg; i++) {
        const segment *g = &e->segs[i];
        seq_state *s = &e->seqs[g->id];
        if (st) {
            s->failed = true;
            continue;
        }
        s->head += g->n;
        s->n_pending -= g->n;
        s->n_past += g->n;
        if (g->n == 1) s->decode_steps++;
        s->logit_row = row;
        s->n_logits = g->n_out;
        row += g->n_out;
    }
    if (st) return st;
    if (n_tokens) *n_tokens = T;
    return QI_OK;
}

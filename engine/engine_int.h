/* engine_int.h - the batched engine's state, shared by its rooms
 * (engine.c lists them), and the calls they make of each other. */
#ifndef QI_ENGINE_INT_H
#define QI_ENGINE_INT_H

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
#include "qinfer/activity.h"
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
    size_t act_rows;        /* the rows act holds (one GPU batch's under a block schedule, engine_zigzag.c) */
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
static inline qi_view act_view(const dev_state *D, const float *p) {
    return qi_view_of(D->act, (size_t)((const char *)p - D->act_base));
}

/* Weight blocks a device may hold (plan.h's numbering). */
static inline int wblock_count(const qi_model *m) { return qi_plan_n_blocks(m->hp.n_layer); }

/* The matrices of a layer in column form (opts.sparsity), by SP_W_* index. */
enum { SP_W_Q, SP_W_K, SP_W_V, SP_W_O, SP_W_GATE, SP_W_UP, SP_W_DOWN, SP_W_COUNT };

/* One layer's attention calls (engine_attn.c), a value built in named
 * stages every layer of a step, then read only:
 *   1. eng_attend_prepare: each segment's call over its streams' working
 *      blocks (n_slots, pos, kb, vb: [max_seqs] calls of [Hkv] streams
 *      each, then as many for the second device of a split), its K/V
 *      writes gathered;
 *   2. eng_pick_blocks (a picking or fetching policy, engine_kv_pick.c):
 *      the decode calls pointed at the pages or tokens picked (pick_*), or
 *      given the offloaded rows fetched (x_*);
 *   3. place_stats and stats_move (a layer the KV policy decides): each
 *      call's region of the statistics, on the device that fills them;
 * then the backend's attention fills the statistics, and the KV policy's
 * step (eng_policy_all) reads them through the calls, which it does not
 * change. */
typedef struct {
    qi_attn_paged_args *call;
    int *n_slots;
    const int32_t **pos;
    const uint16_t *const **kb, *const **vb;
    /* a picking policy (Quest, SparQ): the chosen blocks' tables and
     * positions of each call's streams, [max_seqs * Hkv] regions of
     * pick_max_blocks pointers and of n_ctx positions, and one stream's
     * choice per thread */
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
    /* the statistics: one region of [H][stride] per call (stride: the
     * call's most slots, rounded up to STATS_ALIGN), cap_stats floats,
     * grown by the largest step; n_stats placed for this layer */
    float *stats;
    size_t cap_stats, n_stats;
} eng_attn_calls;

/* Activation sparsity (opts.sparsity, opts.act_observe; engine_sparsity.c):
 * the engine's copy of the thresholds (opts.sparsity then points here);
 * [n_layer][SP_W_COUNT] column forms (zeroed where the mode reads the
 * matrix dense or it has none); scratch sized for the step's rows: active
 * columns, act(gate), ones, a step's activations quantised for the rows
 * of up that cats computes (or for the column forms), those activations
 * turned back to floats (the column forms' input, xd), per 32 neurons
 * the count kept and zeroed (cats_ffn); zeroed / seen activations over
 * the thresholded sites. */
typedef struct {
    qi_sparsity cfg;        /* its thr owned */
    qi_colw *w;
    int32_t *idx, *cnt;
    long *zc;
    float *act, *ones, *xd;
    void *xq;
    double zeroed, seen;
    bool paused;            /* qi_engine_sparsity_pause: steps run the dense path */
} eng_sparsity;

/* A neuron split (opts.neuron_fast), made at creation (engine_neuron.c)
 * and freed with the engine; NULL without one. It leaves the engine's
 * plan and options as they were asked: qi_engine_plan shows it in a copy
 * of the plan. Its fields by who writes them after creation (the lock
 * table is engine_swap.c's). */
typedef struct {
    /* fixed at creation: the mask (its copy); each layer's FFN gathered
     * into its two sides (split[l].n[1] == 0: the layer is not split), and
     * the sides' matrices as the devices run them (w[l][0]: gate, up, down
     * on the CPU; w[l][1] on neuron_dev), in buffers of theirs where a
     * device holds a copy (off[l]: the fast side's gate, up and down in its
     * buffer); with cats, the CPU side's down in column form; zeros for a
     * slot's gate rows */
    uint8_t *mask;
    qi_ffn_split *split;    /* [n_layer] */
    qi_weight (*w)[2][3];
    qi_buf *(*buf)[2];
    size_t (*off)[3];
    qi_colw *cw;            /* [n_layer] */
    void *zero;
    /* the step's thread alone: the active neurons per layer
     * (opts.neuron_active), the fast side's activations copied back
     * [R][n_ff], a layer's activity per unit for a round of swaps, or with
     * the worker summed since its last feed [n_layer][n_units] and their
     * tokens; the steps since the first; the tests' per-step check and the
     * worker's pause inside each swap (qi_engine_neuron_check_steps) */
    qi_engine_neuron_rp *rp;
    float *obs;
    double *feed;
    double *acc;
    long *acc_tok;
    long steps;
    bool check_steps;
    int stall_us;
    /* the units' places (opts.neuron_swap_every), per layer
     * [n_layer][n_units]: the unit in each fast slot, the unit at each
     * position of the cold side and each unit's cold position (-1: in a
     * slot), each layer's spare cold position (-1: none); written by the
     * swaps: between steps in the step's thread, or with the worker by its
     * hooks under the layer's write hold, which a step's read hold keeps
     * still */
    qi_neuron_live *live;
    int32_t *hot, *cold, *cpos, *spare;
    /* the worker alone: the staging of a unit's bytes as a slot holds them
     * (gate rows, up rows, down's blocks by row) on the fast device, where
     * its uploads land on the copy stream; the last swap's events: those
     * uploads done (copy stream), the staging read into its slot (main
     * stream) */
    qi_buf *stage;
    qi_event *stage_up, *stage_read;
    /* either thread, under mu (with the worker; mu_made): what the swaps
     * did, and the first swap's failure (a unit then on neither side: every
     * later step is refused); swaps.mid also counted in mid, which the
     * worker's pause reads */
    pthread_mutex_t mu;
    bool mu_made;
    qi_engine_neuron_swaps swaps;
    qi_status st;
    qi_err err;
    atomic_long mid;
    qi_plan shown; /* the plan with the split in it (eng_neurons_show) */
} eng_neurons;

typedef struct eng_stream eng_stream; /* streamed layers (engine_stream.c) */
typedef struct eng_block eng_block;   /* the block schedule's store (engine_zigzag.c) */

struct qi_engine {
    const qi_model *m;
    /* the caller's request as given (its pointers borrowed for
     * qi_engine_create only, but opts.sparsity: the engine's copy, sp.cfg);
     * what creation resolved lives beside it: the plan, the policy, the
     * devices, the sparsity and the neuron split */
    qi_engine_opts o;

    /* devices and the plan (engine_devices.c, engine_replan.c) */
    qi_backend *be;         /* the CPU device, dev[0].be */
    qi_sim *sim;            /* opts.sim: the simulated machine its devices are (NULL: real ones) */
    qi_kv_pool *pool;       /* the CPU's KV pool: its attention layers' working tiers, every offload tier */
    qi_plan plan;           /* as asked (a neuron split is shown in ns->shown) */
    dev_state dev[QI_PLAN_MAX_DEVICES];

    /* sequences and the step (engine_seq.c, engine_step.c); step scratch
     * of [step_tokens + max_seqs] rows */
    seq_state *seqs;
    int cursor;
    int swa_cells;
    int32_t *tokens, *q_pos;
    segment *segs;
    int32_t *out_rows;
    float *logits;
    long cap_logit_rows;

    /* attention (engine_attn.c, engine_attn_split.c): a layer's K/V rows
     * to write, [2 R Hkv], and a split layer's on its second device */
    const float **kv_src;
    uint16_t **kv_dst;
    const float **kv_src2;
    uint16_t **kv_dst2;
    eng_attn_calls at;

    /* the KV policy (engine_kv_step.c), and whether it picks what decode
     * attention reads, single tokens (SparQ) rather than pages, or (an
     * evicting one) fetches offloaded tokens for it (qinfer fetch=;
     * engine_kv_pick.c): pick_max_blocks, the most pages or tokens a
     * stream's pick holds */
    qi_kv_policy *pol;
    bool picks, pick_tokens, fetches;
    int pick_max_blocks;
    /* the policy's pass over a layer's streams, shared out over the
     * backend's host threads: one scratch (and one policy object) per
     * thread, then every stream's fates, kept for the serial apply */
    pol_scratch *ps;     /* [n_threads] */
    uint8_t *fates;      /* the streams' fates one after another, cap_fates bytes */
    size_t cap_fates;
    size_t *fate_off;    /* [max_seqs * Hkv + 1] */
    /* a device layer's keys staged for the policy's probe
     * (stage_for_probes): rows, block tables, each stream's first entry */
    uint16_t *kstage;
    size_t cap_kstage;
    const uint16_t **kst_blk;
    size_t cap_kst_blk;
    long *kst_at;           /* [max_seqs * Hkv] */

    /* picks and fetches (engine_kv_pick.c) */

    /* the profile (engine_prof.c) */
    /* with profile: the step's copies as pairs of events (start, end) on
     * their stream, timed when the step has synchronised */
    qi_event **cev;
    int *cev_kind;          /* [cap_cev / 2] an op kind, -1: copies, QI_OP_COUNT: a block's span */
    int *cev_tag;           /* [cap_cev / 2] for an op, its block << 1 | 1 on a split's second device;
                             * for copies, the device they fill; for a span, its block */
    int *cev_dev;           /* [cap_cev / 2] the device whose stream holds the two events */
    int n_cev, cap_cev;
    int span_blk, span_dev; /* the block whose span is open, and its device: the ops issued now are its */
    /* with profile: per weight block the device time of its span on its
     * device, of a split attention's ops on the second device and of an
     * attention block's attention and KV writes on its own device, and the
     * copies into each device, since the last reset (placement policies'
     * observations) */
    double *blk_s, *blk_split_s, *blk_attn_s;
    double copy_dev_s[QI_PLAN_MAX_DEVICES];
    long blk_steps;
    qi_engine_prof prof;

    eng_sparsity sp;        /* opts.sparsity, opts.act_observe (engine_sparsity.c) */
    eng_neurons *ns;        /* opts.neuron_fast: the neuron split (NULL: none; engine_neuron.c, engine_swap.c) */
    eng_stream *stream;     /* the plan's streamed layers' staging (NULL: none; engine_stream.c) */
    eng_block *block;       /* the block schedule's store of hidden states (engine_zigzag.c) */
    /* opts.sim_activity (engine_activity.c): the model (NULL: none), the
     * predictor's inner width (0: none), the neurons charged so far on the
     * CPU (0) and on other devices (1) */
    qi_activity *act;
    int act_r;
    double act_rows[2];
};

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

/* Rows of statistics are padded to whole multiples of 16 floats (a 64-byte
 * cache line), so rows of neighbouring heads, which different threads
 * write, seldom share a line. */
#define STATS_ALIGN 16

static inline int stats_stride(int n_slots) { return (n_slots + STATS_ALIGN - 1) / STATS_ALIGN * STATS_ALIGN; }

static inline qi_kv_stream *stream_of(const qi_engine *e, const seq_state *s, int l, int hk) {
    return &s->streams[(size_t)l * e->m->hp.n_head_kv + hk];
}

/* The pool of layer l's working KV: its attention device's; and that of
 * the second device of a split attention (NULL: not split). */
static inline qi_kv_pool *work_pool(const qi_engine *e, int l) { return e->dev[e->plan.layers[l].attn_dev].pool; }

static inline qi_kv_pool *split_pool(const qi_engine *e, int l) {
    const qi_plan_layer *y = &e->plan.layers[l];
    return y->split > 0.0f ? e->dev[y->split_dev].pool : NULL;
}

/* A batch of copies from device `from` to device `to`, queued on the
 * stream that orders them with the device that is not host-visible
 * (qi_dev_copy_stream). eng_xfer_end makes `to` wait for them, and `from` too
 * when its buffers are reused before its own stream would meet the
 * copies. Every copy is counted in the profile; with profile on, their
 * device time is taken from events around the batch when the step has
 * synchronised. */
typedef struct {
    qi_backend *cs, *to, *from;
    qi_event *t0;
} xfer;

/* engine_prof.c */
double eng_now_s(void);
double eng_eclock(const qi_engine *e);
qi_status eng_keep_events(qi_engine *e, qi_event *a, qi_event *b, int kind, int tag, int dev, qi_err *err);
int eng_dev_index(const qi_engine *e, const qi_backend *b);
double eng_host_begin(const qi_engine *e);
void eng_host_end(qi_engine *e, int kind, double t0);
qi_status eng_op_begin(qi_engine *e, qi_backend *b, qi_event **t0, qi_err *err);
qi_status eng_op_end(qi_engine *e, qi_backend *b, qi_event *t0, int kind, qi_status st, qi_err *err);
qi_status eng_span_begin(qi_engine *e, int d, int blk, qi_event **t0, qi_err *err);
qi_status eng_span_end(qi_engine *e, int d, int blk, qi_event *t0, qi_status st, qi_err *err);
qi_status eng_matmul_n(qi_engine *e, qi_backend *b, const qi_weight *const *w, float *const *y, int n, const float *x,
                       int T, qi_err *err);
qi_status eng_matmul(qi_engine *e, qi_backend *b, const qi_weight *w, const float *x, int T, float *y, qi_err *err);

/* engine_devices.c */
size_t eng_walign(size_t n);
int eng_wblock_dev(const qi_plan *p, int b);
const char *eng_wblock_name(const qi_model *m, int b, char *buf, size_t n);
size_t eng_wblock_bytes(const qi_model *m, dev_state *D, int b);
void eng_wblock_reset(const qi_model *m, dev_state *D, int b);
qi_status eng_wblock_prepare(const qi_engine *e, dev_state *D, int b, qi_buf **out, qi_err *err);
size_t eng_dev_room(const qi_dev_info *in);
size_t eng_weights_arriving(const qi_engine *e, const qi_plan *p, const qi_plan *have, int d, size_t room, int *at);
qi_status eng_setup_devices(qi_engine *e, size_t R, qi_err *err);
qi_status eng_sync_all(qi_engine *e, qi_err *err);
qi_status eng_xfer_begin(qi_engine *e, xfer *x, qi_backend *to, qi_backend *from, qi_err *err);
qi_status eng_xfer_copy(qi_engine *e, xfer *x, qi_view dst, qi_view src, size_t n, qi_err *err);
qi_status eng_xfer_end(qi_engine *e, xfer *x, bool from_waits, qi_err *err);
qi_status eng_move_x(qi_engine *e, int *x_dev, int d, int rows, qi_err *err);

/* engine_checks.c */
bool eng_policy_layer(const qi_engine *e, int l);
bool eng_pick_layer(const qi_engine *e, int l);
bool eng_fetch_layer(const qi_engine *e, int l);
qi_status eng_check_splits(const qi_engine *e, const qi_plan *p, qi_err *err);
qi_status eng_check_picks(const qi_engine *e, const qi_plan *p, qi_err *err);
qi_status eng_check_observe(const qi_engine *e, const qi_plan *p, qi_err *err);
qi_status eng_check_sparse(const qi_engine *e, const qi_plan *p, qi_err *err);
qi_status eng_check_neurons(const qi_engine *e, qi_err *err);
qi_status eng_check_neuron_plan(const qi_engine *e, const qi_plan *p, qi_err *err);
qi_status eng_check_arch_ops(const qi_model *m, qi_backend *b, qi_err *err);

/* engine_seq.c */
int eng_schedule(qi_engine *e, int *T_out);

/* engine_attn.c */
qi_status eng_attend_prepare(qi_engine *e, const segment *g, int i, int l, int *n_kv, int *n_kv2, qi_err *err);
qi_status eng_norm_rows(qi_backend *b, const qi_hparams *hp, const float *x, const qi_weight *w, const qi_weight *bias,
                        int T, int n, float *y, qi_err *err);
qi_status eng_add_bias(qi_backend *b, const qi_weight *bw, float *y, int T, qi_err *err);
qi_status eng_attention_block(qi_engine *e, const segment *segs, int n_seg, int T, int R, int l, int *rows,
                              qi_err *err);

/* engine_attn_split.c */
qi_status eng_attend_split(qi_engine *e, const segment *segs, int n_seg, int T, int l, qi_err *err);

/* engine_kv_step.c */
int eng_resolve_budget(const qi_engine *e, int32_t cur_pos);
qi_status eng_policy_all(qi_engine *e, const qi_attn_paged_args *calls, const segment *segs, int n_seg, int l,
                         qi_err *err);

/* engine_activity.c */
qi_status eng_activity_setup(qi_engine *e, qi_err *err);
void eng_activity_free(qi_engine *e);
qi_status eng_activity_whole(qi_engine *e, const dev_state *M, int l, int rows, bool gelu, qi_err *err);
qi_status eng_activity_split(qi_engine *e, int l, int rows, bool gelu, const dev_state *M, const dev_state *F,
                             int n_slow, int n_fast, const qi_weight *w_slow, const qi_weight *w_fast, qi_err *err);

/* engine_kv_pick.c */
qi_status eng_pick_blocks(qi_engine *e, const dev_state *X, const segment *segs, int n_seg, int l, qi_err *err);

/* engine_mlp.c */
qi_status eng_observe_ffn(qi_engine *e, qi_backend *b, int l, const float *act, int rows, qi_err *err);
qi_status eng_ffn_side(qi_engine *e, const dev_state *D, const qi_weight *w, int n, int rows, bool gelu, qi_err *err);
qi_status eng_ffn_sim_sparse(qi_engine *e, const dev_state *M, const qi_weight *gate, const qi_weight *up_w,
                             const qi_weight *down_w, int n, int rows, bool gelu, qi_err *err);
qi_status eng_mlp_block(qi_engine *e, int l, int rows, qi_err *err);

/* engine_sparsity.c */
float eng_sp_thr(const qi_engine *e, int l, int site);
/* x [T][n] as the dense matmul reads it, 8-bit blocks of qi_vec_dot_type
 * dt, turned back to floats in xd [T][n]: the column forms' input. */
void eng_sp_act8(qi_engine *e, uint32_t dt, const float *x, int T, int64_t n, float *xd);
int eng_sp_site(qi_engine *e, int l, int site, float *x, int T, int n);
qi_status eng_sp_run(qi_engine *e, sp_job *j);
qi_status eng_mm_site(qi_engine *e, qi_backend *b, int l, const int *wi, const qi_weight *const *w, float *const *y,
                      int n, const float *x, int T, int n_idx, qi_err *err);
qi_status eng_mm_rows(qi_engine *e, qi_backend *b, const qi_weight *w, const float *x, int T, const int32_t *rows,
                      int n_rows, float *y, qi_err *err);
bool eng_sp_path(const qi_engine *e);
qi_status eng_sparse_setup(qi_engine *e, size_t R, qi_err *err);
void eng_sparsity_free(qi_engine *e);
int eng_cats_keep(qi_engine *e, float tg, int rows, int n);
qi_status eng_mlp_sparse(qi_engine *e, int l, int rows, qi_err *err);

/* engine_neuron.c */
qi_status eng_neuron_setup(qi_engine *e, qi_err *err);
void eng_neurons_show(qi_engine *e);
void eng_neurons_free(qi_engine *e);
void eng_count_active(qi_engine *e, int l, const float *a, int rows, int n, bool fast);
qi_status eng_mlp_split(qi_engine *e, int l, int rows, qi_err *err);

/* engine_stream.c: streamed layers. apply: the staging for plan p (the
 * old one let go; at creation and by a re-plan); before and after: the
 * hooks around layer l in the forward pass (after passes st through). */
qi_status eng_stream_apply(qi_engine *e, const qi_plan *p, qi_err *err);
void eng_stream_free(qi_engine *e);
qi_status eng_stream_before(qi_engine *e, int l, qi_err *err);
qi_status eng_stream_after(qi_engine *e, int l, qi_status st, qi_err *err);

/* engine_step.c: the forward pass's blocks, which the block schedule runs
 * per GPU batch */
qi_status eng_embed_block(qi_engine *e, int T, qi_err *err);
qi_status eng_layer(qi_engine *e, const segment *segs, int n_seg, int T, int R, int l, int *x_dev, int *rows,
                    qi_err *err);
qi_status eng_head_block(qi_engine *e, int R, int r0, qi_err *err);
/* engine_zigzag.c: the block schedule (plan.h's gpu_batch). chunk: the
 * most prompt rows a sequence gets in a step; rows: a device's rows of
 * activations for plan p (R: a whole step's); check: plan p against the
 * options and the activations held (creation, re-plan); forward: a
 * step's forward pass in GPU batches (the store made at the first). */
int eng_block_chunk(const qi_engine *e);
size_t eng_block_rows(const qi_engine *e, const qi_plan *p, size_t R);
qi_status eng_block_check(const qi_engine *e, const qi_plan *p, qi_err *err);
void eng_block_free(qi_engine *e);
qi_status eng_block_forward(qi_engine *e, const segment *segs, int n_seg, int T, int R, qi_err *err);
/* engine_swap.c */
void eng_unit_bytes(const qi_layer *ly, int unit, size_t *gb, size_t *ub, size_t *blk);
void eng_swap_failed(qi_engine *e, qi_status st, const qi_err *se);
qi_status eng_swap_state(qi_engine *e, qi_err *out);
qi_status eng_live_setup(qi_engine *e, int unit, int nu, qi_err *err);
qi_status eng_live_round(qi_engine *e, qi_err *err);

#endif

/* engine.h - the batched engine: many sequences, one forward step for all
 * of them, a paged KV cache whose contents a KV policy chooses.
 *
 * Use: create an engine over a loaded model; add sequences (each gets an id
 * in 0..max_seqs-1); feed each its prompt, later each sampled token; call
 * qi_engine_step until nothing is pending. A step runs every sequence that
 * has a single pending token (decode) and then whole prompt chunks of the
 * others while the step's prompt room lasts (continuous batching), reading
 * every weight once for all of them. A sequence's chunks are the same
 * whatever else runs: a chunk that does not fit waits, it is never cut.
 * After a step, qi_engine_seq_logits gives the
 * rows a sequence produced: its last token's once its pending tokens are
 * all consumed, or every token's when it was fed with logits_all.
 *
 * Arithmetic: each sequence's logits do not depend on what else is in the
 * batch, under every KV policy (the policy runs after each of the
 * sequence's own segments, which the batch does not change), for weight
 * types whose dot does not depend on the number of tokens in a matmul (all
 * but the K-quants, where llama.cpp's order changes at 8 tokens and a batch
 * decides which applies). The single-sequence context (qi_ctx, model.h) is
 * this engine with one sequence under the full policy.
 */
#ifndef QINFER_ENGINE_H
#define QINFER_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "qinfer/model.h"
#include "qinfer/params.h"
#include "qinfer/plan.h"
#include "qinfer/status.h"

typedef struct qi_engine qi_engine;

/* Most tokens of one sequence in one step (a prompt chunk): llama.cpp's
 * ubatch, which also sizes the sliding-window ring. */
#define QI_ENGINE_CHUNK 512

typedef struct {
    int n_threads;          /* worker threads (default: physical cores) */
    int max_seqs;           /* sequences at once (default 16) */
    int n_ctx;              /* positions per sequence (default 2048) */
    int step_tokens;        /* prompt tokens per step over all sequences, and the most in
                             * one chunk (default 512); each decoding sequence adds one row */
    const char *kv_policy;  /* default "full" */
    const qi_params *kv_params; /* the policy's parameters; NULL: none */
    int kv_budget_tokens;   /* working tokens per (layer, KV head) stream; 0: use the fraction */
    double kv_budget_frac;  /* of the sequence's current length, in (0, 1]; 0 with 0 tokens: no budget */
    size_t kv_max_bytes;    /* cap on KV memory over both tiers (0: none) */
    bool profile;           /* time every op (qi_engine_profile) */
    const char *devices;    /* --devices: "cpu" (default), "cpu,cuda[:BYTES]" or "cpu,testdev[:BYTES]" (plan.h) */
    const char *placement;  /* --placement: "all-cpu" (default), "ngl=N" or a plan file (plan.h) */
    const qi_plan *plan;    /* a plan made by the caller, its devices with it (devices and placement then
                             * unread; NULL: none); read in qi_engine_create only */
    bool attn_blas;         /* prompt chunks' attention through OpenBLAS sgemm (default off):
                             * faster, but the logits are no longer bit-identical to llama.cpp's;
                             * one-token steps are unchanged. Needs libopenblas0 at run time:
                             * qi_engine_create fails without it. */
    bool repack;            /* the CPU devices prepare the q4_0/q4_1/q5_0/q5_1/q8_0 matrices of
                             * their blocks in 16-row groups (default off; QI_CPU_REPACK in
                             * engine/backend/backend.h): faster, above all batched, but the
                             * logits are no longer llama.cpp's bit for bit; a batched step
                             * still equals single-sequence runs. */
    const char *sim;        /* a hardware profile (engine/backend/sim/profiles/): run on that machine
                             * simulated: device "cpu" is its host and "gpu[:BYTES]" its GPU; no
                             * arithmetic is done (logits are zeros) and every time is the simulated
                             * machine's (qi_engine_now). NULL: the real devices. A model of shapes
                             * only (qinfer synth --shapes-only) needs it. */
    const char *sim_cal;    /* with sim: a calibration file (qinfer calibrate -o) over the default
                             * efficiencies; sim_params apply after it. NULL: none */
    const qi_params *sim_params; /* the simulator's efficiencies and noise (backend.h's qi_sim_params
                                  * names: gpu_matmul_memory=0.8, noise=0.05, seed=3, ...); NULL: defaults */
    /* An observer of the FFN's hidden activations (qinfer profile): called
     * in every layer of a gated MLP after act = act_fn(gate) * up, before
     * the down projection (in a gate-free MLP after act_fn(up)), with the
     * step's rows of that layer, row-major [rows][n_ff], borrowed for the
     * call. rows is the step's token count T, except in the last layer,
     * which runs only the rows that produce logits (feed with logits_all
     * to see every token there). Rows follow the step's order: sequences
     * one after another, each's tokens in order. Only for plans whose
     * every MLP runs on a host-visible device (the CPU): qi_engine_create
     * and qi_engine_replan refuse others, and a simulated machine (sim),
     * which computes nothing. NULL (default): no call, no cost. */
    void (*ffn_observe)(void *ctx, int layer, const float *act, int rows, int n_ff);
    void *ffn_observe_ctx;
    /* Activation sparsity (qinfer/sparsity.h: teal or cats, per-layer
     * thresholds; NULL, or a target of 0: dense, the engine's result bit
     * for bit). Activations under a site's threshold are zeroed, every
     * token of every step, and the matmuls that read them skip them where
     * the batch leaves few enough active (at most sparse_max_density of
     * the columns, the union over the step's rows; default 0.6): the
     * column form of each matrix (engine/kernels/sparse.h), built at
     * creation, in host memory beside the weights. Only on the CPU: every
     * layer on the CPU device, no simulated machine, no repack, a gated
     * MLP; qi_engine_create and qi_engine_replan refuse others. Copied
     * at creation. */
    const struct qi_sparsity_s *sparsity;
    double sparse_max_density;
    /* An observer of the activations at every sparsity site (qinfer/
     * sparsity.h's qi_sparsity_site) before any threshold: `qinfer profile
     * --sparsity-out` calibrates with it. Rows as ffn_observe's; the gate
     * site (act(gate)) is computed for it when the mode does not need it.
     * The same plans as ffn_observe's. NULL: no call, no cost. */
    void (*act_observe)(void *ctx, int layer, int site, const float *x, int rows, int width);
    void *act_observe_ctx;
    /* An FFN neuron split (hot neurons, policies/neuron/): neuron_fast
     * [n_layer * units] marks, per layer, the units of its neurons whose
     * gate and up rows and down columns live and run on device neuron_dev
     * (the fast one, an index into the device list, >= 1); the layer's
     * other neurons run on its MLP device, which must be the CPU (device
     * 0). A unit is qi_engine_neuron_unit(m) consecutive neurons (down's
     * quantisation block, which the split moves whole: engine/ffn_split.h),
     * units = n_ff / unit. Both sides compute their neurons of the same
     * rows at once and the fast side's partial down product is added to
     * the slow side's before the residual. A layer with no unit marked is
     * not split; with every unit marked, its MLP's arithmetic is the
     * unsplit one on neuron_dev. A gated MLP only; not with sparsity, the
     * observers or --repack; fixed at creation: a new plan
     * (qi_engine_replan) may move any block but the MLPs of split layers,
     * which stay on the cpu. The plan (qi_engine_plan) shows it: ffn_dev
     * and ffn_rows of each split layer. Copied at creation. NULL: no
     * split. */
    const uint8_t *neuron_fast;
    int neuron_dev;
    /* With a split: > 0 counts, per layer, the FFN neurons active in each
     * row (|act(gate) * up| > neuron_active, the activation the profiler
     * thresholds) on each side, for qi_engine_neuron_stats (the fast
     * side's activations are copied back every layer: slower). 0: none. */
    float neuron_active;
    /* With a split: the qinfer neuron policy's run time (policies/neuron/
     * neuron_live.h): every neuron_swap_every steps the engine feeds each
     * layer's activity per unit (|act| summed over the step's rows, both
     * sides, the hot side's copied back) to the live state and makes one
     * round of swaps in its own thread, between steps: a hot unit's slot
     * refilled with a cold unit's rows and blocks copied to the fast
     * device, the unit it held written into the cold unit's place on the
     * CPU's side (both in place: a swap moves two units' bytes, however
     * large the layer). neuron_live: the rule's
     * options (ratio, slow_s, link_bw, ...); neuron_activity [n_layer *
     * units]: each unit's starting activity per token (the profile's).
     * Not on a simulated machine (it computes no activations). 0: the
     * split stays as placed. */
    int neuron_swap_every;
    /* With neuron_swap_every: the rounds made by the live state's
     * background worker thread instead, while the steps go on. Every N
     * steps the engine feeds the activity it summed; the worker swaps,
     * each swap in the live state's three steps: the unit leaving a slot
     * is written into a spare place of the CPU's side and the slot's gate
     * rows are zeroed (it then computes nothing), the incoming unit's
     * rows and blocks are uploaded with no hold on the layer into a
     * staging buffer on the fast device, on its copy stream (beside the
     * steps' ops; backend.h), then copied into the slot on the main
     * stream after them, and its old place on the CPU's side becomes the
     * spare (its gate rows zeroed). A step holds each split layer while it
     * computes its FFN, so every step sees each unit in one place. Which
     * step a swap lands before depends on the threads' timing, so runs
     * are not repeatable to the bit. */
    bool neuron_swap_worker;
    /* With neuron_swap_worker: the uploads queued on the fast device's
     * main stream, among the steps' ops, instead of its copy stream (an
     * ablation of the overlap; the same staging and copies otherwise). */
    bool neuron_swap_main_stream;
    const struct qi_neuron_live_opts *neuron_live;
    const double *neuron_activity;
    /* On a simulated machine (sim): in (0, 1], the share of the FFN
     * neurons the CPU computes (a split's cold side, and every MLP the plan
     * leaves on the CPU) that a step reads past gate, a what-if that the
     * simulator cannot measure (it computes no activations): gate whole,
     * then up's rows and down's columns of that share alone (rounded up to
     * whole blocks of down's type), as cats reads them. Other devices'
     * neurons run dense. A gated MLP only. 0: dense. */
    double sim_cold_density;
} qi_engine_opts;

/* The neurons of a unit of m's FFN split (opts.neuron_fast): its first
 * layer's down block (the layers of the models here share one type of
 * down per width; qi_engine_create refuses a split of a model whose layers
 * differ). 0 for a model with no gated FFN. */
int qi_engine_neuron_unit(const qi_model *m);

void qi_engine_opts_default(qi_engine_opts *o);

/* The engine's clock in seconds: qi_measure_now (measure.h), or with
 * opts.sim the simulated machine's, which advances only by the simulated
 * devices' work. Measure with it, never with a clock of one's own. */
double qi_engine_now(const qi_engine *e);
/* The simulated machine's profile name, or NULL when the devices are real;
 * and its figures (qinfer/hwprofile.h), or NULL. */
const char *qi_engine_sim_profile(const qi_engine *e);
struct qi_hwprofile;
const struct qi_hwprofile *qi_engine_sim_hwprofile(const qi_engine *e);
struct qi_sim;
/* The simulated machine itself (backend.h's qi_sim; NULL when real). */
const struct qi_sim *qi_engine_sim(const qi_engine *e);

/* Validates the options (a policy that needs a budget without one, an
 * unknown policy or parameter: an error naming it). m must outlive it. */
qi_status qi_engine_create(const qi_model *m, const qi_engine_opts *o, qi_engine **out, qi_err *err);
void qi_engine_free(qi_engine *e); /* NULL is a no-op */

qi_status qi_engine_seq_add(qi_engine *e, int *id, qi_err *err);
/* Frees the sequence's cache blocks; its id may be reused. */
qi_status qi_engine_seq_remove(qi_engine *e, int id, qi_err *err);
/* Queue tokens (copied). Fails if they would overflow n_ctx or are out of
 * the vocabulary. logits_all applies to these tokens. */
qi_status qi_engine_seq_feed(qi_engine *e, int id, const int32_t *tokens, int n, bool logits_all, qi_err *err);
int qi_engine_seq_pending(const qi_engine *e, int id);
/* Sequences the engine holds at most (opts.max_seqs). */
int qi_engine_max_seqs(const qi_engine *e);

/* Swap (a scheduler's preemption without recompute): swap_out moves every
 * working KV row of the sequence, in slot order, to its offload tier (host
 * memory) and parks it: steps skip it, and it keeps its position and its
 * pending tokens (more may be fed). swap_in moves the rows back into the
 * same slots, so what it computes next is bit for bit what it would have
 * computed without the swap. Every stream or none: a failure (the pool's
 * cap, memory; unsupported on a layer whose attention is split) leaves it
 * as it was, except when undoing failed too, which marks it failed.
 * Errors: QI_ERR_INVALID (no such sequence, already in that state). */
qi_status qi_engine_seq_swap_out(qi_engine *e, int id, qi_err *err);
qi_status qi_engine_seq_swap_in(qi_engine *e, int id, qi_err *err);
bool qi_engine_seq_swapped(const qi_engine *e, int id);
int qi_engine_seq_n_past(const qi_engine *e, int id);

/* One forward step. *n_tokens (may be NULL) receives the tokens it ran (0
 * when nothing was pending). A failure (KV cache full, out of memory) marks
 * the sequences of the step as failed: later calls on them fail and they
 * must be removed. */
qi_status qi_engine_step(qi_engine *e, int *n_tokens, qi_err *err);

/* Rows of logits the last step produced for id (0 if none), and row i of
 * them (-1: the last), [n_vocab] floats valid until the next step. */
int qi_engine_seq_n_logits(const qi_engine *e, int id);
const float *qi_engine_seq_logits(const qi_engine *e, int id, int i);

typedef struct {
    long work_tokens, off_tokens;  /* summed over the sequence's streams */
    /* the tokens the sequence's last attention read, summed over its
     * streams (each stream's at the last step it ran): its working tokens,
     * or under a policy whose budget counts attended tokens (Quest) the
     * tokens of the blocks it picked */
    long attn_tokens;
    size_t work_bytes, off_bytes;  /* blocks held, K and V */
} qi_engine_kv_seq;

typedef struct {
    size_t block_bytes;
    long work_blocks, off_blocks, peak_work_blocks, peak_off_blocks, max_blocks;
} qi_engine_kv_pool;

void qi_engine_kv_seq_stats(const qi_engine *e, int id, qi_engine_kv_seq *out);
/* The tokens one stream of sequence id holds (layer, KV head, tier 0 the
 * working tier, 1 the offload tier), in slot order: returns their number n
 * and points *pos at their positions and *score (may be NULL) at the
 * policy's per-token scores, n of each, borrowed until the next step or
 * removal. A bad id, layer, head or tier gives -1 and NULL pointers. For
 * inspecting what a policy kept. */
int qi_engine_kv_stream_tokens(const qi_engine *e, int id, int layer, int kv_head, int tier, const int32_t **pos,
                               const float **score);
void qi_engine_kv_pool_stats(const qi_engine *e, qi_engine_kv_pool *out);
/* Under opts.sparsity: the share of the thresholded sites' activations
 * zeroed so far, over every step (-1 before any, or without sparsity). */
double qi_engine_sparsity_measured(const qi_engine *e);
/* Under opts.sparsity: while paused, steps take the dense path, as the
 * engine made without opts.sparsity does (the same logits bit for bit,
 * given the same cache), and count nothing towards the share zeroed; a
 * measurement alternates the two within one engine (qi_measure_decode's
 * ab_dense). Without opts.sparsity a no-op. */
void qi_engine_sparsity_pause(qi_engine *e, bool paused);
/* With opts.neuron_active: layer l's FFN over every step so far, the rows
 * it ran (tokens), its neurons on the fast device (n_fast; 0 where the
 * layer is not split or runs off the CPU) and the (row, neuron) pairs
 * active on the fast side (hit) and on both (active): recall = hit /
 * active, the share of the active pairs the fast device held; precision
 * = hit / (tokens * n_fast), the share of the fast set active on a row
 * (qi_neuron_recall's definitions). False for l out of range or without
 * opts.neuron_active. Layers whose MLP runs off the CPU are not counted. */
typedef struct {
    long tokens;
    int n_fast;
    long long hit, active;
} qi_engine_neuron_rp;
bool qi_engine_neuron_stats(const qi_engine *e, int l, qi_engine_neuron_rp *out);
/* With opts.neuron_swap_every: rounds of swaps made, units swapped, the
 * bytes copied to the fast device for them, and the engine thread's wall
 * seconds spent on them: in the rounds between steps (the rule, the
 * copies queued and waited for, the cold side rewritten), or with
 * neuron_swap_worker waiting for the worker's holds on a layer (the
 * worker's own time is not in it), so far (zeros without). */
typedef struct {
    long rounds, swaps;
    double bytes, seconds;
    long mid; /* with neuron_swap_worker: a step's reads of a layer with a swap in progress (a slot empty) */
    bool copy_stream; /* with neuron_swap_worker: its uploads ran on the fast device's copy stream */
} qi_engine_neuron_swaps;
void qi_engine_neuron_swaps_get(const qi_engine *e, qi_engine_neuron_swaps *out);
/* The qinfer neuron policy's start-up calibration timer (a
 * qi_neuron_time_fn of policies/neuron/neuron_policy.h, ctx the engine):
 * device seconds of layer 0's up product of n_neurons neurons (rounded up
 * to whole units) and of down's over their columns, at `batch` rows, on
 * the CPU (fast 0) or on device 1 (fast 1), timed by the device's events
 * (a simulated device's clock on a simulated machine). The neurons'
 * matrices are gathered and prepared on the device first, untimed. NAN
 * when the engine has one device, batch is outside 1 to its rows per step,
 * or a device fails. */
double qi_engine_neuron_time(void *engine, int fast, int n_neurons, int batch);
/* Tests: every split layer's two sides against the model, between steps:
 * each unit on exactly one side (the swaps' live state consistent), the
 * fast device's slot s holding its unit's gate and up rows and down
 * blocks byte for byte (copied back), the cold side's gathered matrices
 * the other units' (in order, or where swaps put them), its column form
 * under cats the one its down gives. QI_ERR_BACKEND naming the first layer and
 * unit at fault; QI_OK without a split or for a model of shapes only. */
qi_status qi_engine_neuron_check(qi_engine *e, qi_err *err);
/* Tests: with on, every step checks each split layer as it reads it, under
 * the layer's hold, as qi_engine_neuron_check does, except that a slot a
 * background swap has emptied must compute nothing (its gate rows zero):
 * the step fails on a layer that would count a unit twice or not at all.
 * stall_us > 0: the background worker pauses inside each swap (its unit
 * out of the slot, the incoming one not in) until a step has read the
 * layer so, or for stall_us at most, so that steps meet layers mid-swap. */
void qi_engine_neuron_check_steps(qi_engine *e, bool on, int stall_us);
const char *qi_engine_kv_policy_name(const qi_engine *e);
/* Whether the policy's budget counts the tokens attention reads on decode
 * steps (a policy that picks blocks, Quest) rather than the tokens held. */
bool qi_engine_kv_budget_attended(const qi_engine *e);
/* The placement plan the engine runs (opts.devices and opts.placement, or
 * the last qi_engine_replan), with a neuron split's ffn_dev and ffn_rows
 * (opts.neuron_fast). */
const qi_plan *qi_engine_plan(const qi_engine *e);
/* The matrices the devices multiply by in a packed form of their own
 * (opts.repack), over the blocks of the plan in force. */
int qi_engine_n_packed(const qi_engine *e);

/* What a new plan moved and what it cost: the weight bytes the devices
 * that now run blocks prepared in their own form (uploaded, or packed by
 * a CPU with opts.repack; a block that goes to a CPU without it costs
 * nothing: the CPU runs on the model's own views), the working KV blocks copied to
 * the pools of the layers whose attention moved or whose split changed,
 * and the wall time from the call until every device had finished. */
typedef struct {
    double weight_bytes;
    long kv_blocks;
    double kv_bytes;
    double seconds;
} qi_engine_replan_cost;

/* Run plan p from the next step on (between steps; the devices are those
 * of creation, named in the same order). Checked as at creation, and
 * refused before any work when the weights and KV blocks that arrive on a
 * device do not fit beside what is there (what leaves is freed only once
 * the move is done), naming the device and the bytes short. The move is
 * all or nothing: a failed upload or copy leaves the engine on its old
 * plan, its sequences intact. *cost (may be NULL) receives the move's
 * cost, also summed in the profile. A neuron split stays as it was made:
 * p's ffn_dev and ffn_rows are either unset (-1) or the split's, as in a
 * copy of qi_engine_plan's. qi_engine_replan_spec takes a --placement
 * value instead. */
qi_status qi_engine_replan(qi_engine *e, const qi_plan *p, qi_engine_replan_cost *cost, qi_err *err);
qi_status qi_engine_replan_spec(qi_engine *e, const char *placement, qi_engine_replan_cost *cost, qi_err *err);
/* Device d of the plan: its name, capacity and bytes in use now and at
 * peak (weights, activations, KV blocks); false when d is out of range. */
typedef struct {
    char name[QI_PLAN_DEV_NAME];
    size_t capacity, in_use, peak;
    bool cuda; /* a CUDA GPU (what CUPTI's activity records cover) */
} qi_engine_dev;
bool qi_engine_device(const qi_engine *e, int d, qi_engine_dev *out);
/* The bytes weight block b (qi_plan_block_weights' numbering) takes on
 * device d in that device's own form, as the engine allocates it (0: the
 * device runs on the model's own rows, or d or b out of range). */
size_t qi_engine_block_bytes(const qi_engine *e, int d, int b);
/* The bytes device d (not the CPU) holds for the plan in force: its weight
 * blocks and its KV pool's blocks, in use or kept for reuse; what a new
 * plan could have there beside the rest (activations, logits). */
size_t qi_engine_plan_bytes(const qi_engine *e, int d);
/* Tests: the n_op-th op and the n_copy-th copy queued on device d from now
 * fail (0: not), as a device's failure would: the step returns the error,
 * naming the device, and the engine stays usable for new sequences. */
void qi_engine_inject_fail(qi_engine *e, int d, long n_op, long n_copy);
/* Tests: device d's backend (engine/backend/backend.h), NULL for none. */
struct qi_backend;
struct qi_backend *qi_engine_backend(qi_engine *e, int d);

/* Wall time per kind of op since creation (with opts.profile), and the
 * weight bytes the matmuls read: what a placement cost model is fitted to. */
typedef enum {
    QI_OP_MATMUL = 0, /* every weight matmul, output head included */
    QI_OP_ATTENTION,  /* attention over the cache */
    QI_OP_KV,         /* writing K/V into the cache */
    QI_OP_POLICY,     /* the KV policy: observe, select, apply */
    QI_OP_OTHER,      /* norms, RoPE, GLU, embeddings, residuals */
    QI_OP_COUNT
} qi_op_kind;
typedef struct {
    double seconds[QI_OP_COUNT];
    long calls[QI_OP_COUNT];
    double matmul_bytes; /* weight bytes read by the matmuls */
    long steps;
    /* Copies between the plan's devices (counted with profile off too):
     * the hidden state where consecutive blocks differ, a split
     * attention's queries, keys, values and partial results, and the KV
     * blocks a split moves to the attention's device as its share grows;
     * with profile on, their device time, from events around them. */
    long copies, kv_block_moves;
    double copy_bytes, copy_seconds;
    /* With profile on, per device of the plan (its index): the device time
     * of its event-timed ops (the kinds above timed by the device's events:
     * matmul, attention, kv-write), of its blocks' spans (from an event
     * where a block starts on it to one where it ends: every op of the
     * block, the gaps between them and, for the output head, the logits'
     * download), and of the copies between devices queued on its stream.
     * A device's busy time in the steps is about its spans plus its copies. */
    double dev_op_seconds[QI_PLAN_MAX_DEVICES], dev_span_seconds[QI_PLAN_MAX_DEVICES],
        dev_copy_seconds[QI_PLAN_MAX_DEVICES];
    /* New plans (qi_engine_replan, counted with profile off too): how
     * many, the weight and KV bytes they moved, their KV blocks, and
     * their wall time. */
    long replans, replan_kv_blocks;
    double replan_bytes, replan_seconds;
} qi_engine_prof;
void qi_engine_profile(const qi_engine *e, qi_engine_prof *out);

/* With opts.profile, what a placement policy observes: per weight block
 * (plan.h's numbering) the device time of its span on the device the plan
 * put it on (from an event where it starts to one where it ends, so a
 * split attention's span includes waiting for its second device), the
 * time of a split attention's ops on its second device, the time of an
 * attention block's attention and KV-write ops on its own device (without
 * the projections or the wait: with split_s, the two devices' shares of a
 * split attention), and the time of the activation copies into each
 * device; summed over the steps since the last reset (steps). The arrays
 * are the engine's, valid until it is freed. All zeros with profile off. */
typedef struct {
    int n_blocks;
    long steps;
    const double *block_s; /* [n_blocks] */
    const double *split_s; /* [n_blocks] */
    const double *attn_s;  /* [n_blocks] */
    double copy_s[QI_PLAN_MAX_DEVICES];
} qi_engine_block_times;
void qi_engine_block_times_get(const qi_engine *e, qi_engine_block_times *out);
void qi_engine_block_times_reset(qi_engine *e);
const char *qi_op_kind_name(qi_op_kind k);

#endif

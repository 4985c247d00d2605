/* plan.h - a placement plan: which device runs each block of the forward
 * pass. Plain data: placement policies produce plans, the engine executes
 * them, and a plan is printed with --profile and stored with every run.
 *
 * The forward pass is a sequence of blocks: the token embedding; per layer
 * an attention block (norm, Q/K/V, RoPE, KV write, attention, output
 * projection, residual) and an MLP block (norm, gate/up, GLU, down,
 * residual); the output head (final norm, logits). A plan names, for
 * every block, a device by its index in the engine's device list (0 is the
 * host CPU). A layer's attention may be split: the first 1 - r of each
 * stream's working KV slots (in whole KV blocks, rounded) are attended on
 * the attention's device, the rest on split_dev, and the partial results
 * are merged exactly up to rounding (backend.h). In a parallel layer
 * (Falcon: attention and MLP both read the layer's input, qi_hparams.parallel)
 * the attention block leaves the hidden state as it found it and keeps its
 * output; the MLP block reads the same input and adds both outputs to it,
 * the attention's copied to the MLP's device first when the two blocks are
 * on different devices. A layer's FFN may be split by neurons (rows of
 * gate/up and the matching columns of down on ffn_dev, the rest on the
 * MLP's device): the engine sets ffn_dev and ffn_rows from its neuron
 * split (qinfer/engine.h, opts.neuron_fast), so a plan shows it and stores
 * it in JSON; plan files have no syntax for it (qi_plan_format writes it
 * as a comment). A layer may be streamed (FlexGen's offload, where
 * llama.cpp's computes a layer left on the host there): both its blocks
 * run on one device other than the host, whose copy stream brings the
 * layer's weights from host memory every time it runs, overlapped with the
 * compute of the layer before (engine/engine_stream.c); a plan file marks
 * it with `~` after both devices (`gpu~ gpu~`). A plan may run a step as
 * FlexGen's zig-zag block: the step's sequences in GPU batches of
 * gpu_batch each, the layers outside and the GPU batches inside, so a
 * layer's weights (streamed or held) serve every GPU batch of the block
 * once loaded, and the block's hidden states wait in host memory between
 * layers (engine/engine_zigzag.c); a plan file says `gpu_batch N`.
 */
#ifndef QINFER_PLAN_H
#define QINFER_PLAN_H

#include <stddef.h>

#include "qinfer/model.h"
#include "qinfer/status.h"

#define QI_PLAN_MAX_DEVICES 4
#define QI_PLAN_DEV_NAME 24

typedef struct {
    int attn_dev;   /* device of the attention block */
    int mlp_dev;    /* device of the MLP block */
    float split;    /* r in [0, 1]: the share of the working KV attended on split_dev */
    int split_dev;  /* the second attention device; -1 when split is 0 */
    int ffn_dev;    /* the fast device of an FFN neuron split (-1: none) */
    int ffn_rows;   /* the neurons (gate/up rows, down columns) on ffn_dev (0 with ffn_dev -1) */
    bool stream;    /* the layer's weights stay in host memory and are streamed to its device each time it runs */
} qi_plan_layer;

typedef struct {
    int n_layer;
    int n_devices;
    char devices[QI_PLAN_MAX_DEVICES][QI_PLAN_DEV_NAME]; /* names, [0] the host CPU */
    int embd_dev, head_dev;
    qi_plan_layer *layers; /* [n_layer] */
    int gpu_batch;         /* sequences per GPU batch of the block schedule (0: none, a step runs whole) */
} qi_plan;

/* The device list of --devices: comma-separated names, the first of which
 * must be "cpu" (the host, where the embeddings, the KV offload tier and
 * the sampler live). Names are checked for syntax and repeats only; which
 * names exist is the engine's affair. */
qi_status qi_plan_devices_parse(const char *spec, qi_plan *p, qi_err *err);

/* Fill p for n_layer layers over the devices already in p (from
 * qi_plan_devices_parse, or just "cpu") from a --placement value:
 *   all-cpu  every block on device 0 (the default);
 *   ngl=N    llama.cpp's -ngl: the last N layers (attention and MLP) on
 *            device 1, and the output head too when N exceeds the layer
 *            count (any N above n_layer: all of them, as -ngl 99);
 *   a file   one line per layer, in order: ATTN MLP [SPLIT [SPLIT_DEV]]
 *            (devices by name or index, SPLIT a ratio in [0, 1], its
 *            device by default the other of a two-device list; ATTN~
 *            MLP~, one device other than the host, a streamed layer), and
 *            optionally `embd DEV`, `head DEV` and `gpu_batch N` (the
 *            block schedule, N sequences per GPU batch) lines; '#' starts a
 *            comment. Errors name the file and the line.
 * A value policy:NAME[:K=V,...] names a placement policy
 * (policies/placement/), whose plan a command makes once the engine
 * exists: here it is QI_ERR_UNSUPPORTED.
 * Allocates p->layers (qi_plan_free). */
qi_status qi_plan_parse(const char *spec, int n_layer, qi_plan *p, qi_err *err);
/* Every block on device 0 of the devices in p. */
qi_status qi_plan_all_host(int n_layer, qi_plan *p, qi_err *err);
/* Checks indices, ratios, the neuron split's fields and streamed layers
 * (one device, not the host, for both blocks; no neuron split). */
qi_status qi_plan_validate(const qi_plan *p, qi_err *err);
void qi_plan_free(qi_plan *p);
/* A deep copy (dst's old layers are not freed). */
qi_status qi_plan_copy(qi_plan *dst, const qi_plan *src, qi_err *err);

/* The plan in a few words ("all-cpu", "ngl=N" when it is one, else "plan"
 * with per-device counts), and in full as text in the plan-file format
 * (loadable by qi_plan_parse) or as canonical JSON for the results DB.
 * Each returns what snprintf would (bytes needed, without the NUL). */
int qi_plan_summary(const qi_plan *p, char *buf, size_t len);
int qi_plan_format(const qi_plan *p, char *buf, size_t len);
int qi_plan_json(const qi_plan *p, char *buf, size_t len);

/* Weight blocks: what a device holds of the model, numbered as the engine
 * numbers them: the token embedding (0: tok_embd, and pos_embd where the
 * model has one), per layer l its attention (1 + 2l: attn_norm, wq, wk,
 * wv, wo, and where the model has them q_norm, k_norm, attn_post_norm, the
 * norm's bias and the biases bq, bk, bv, bo) and its MLP (2 + 2l: ffn_norm,
 * w_gate, w_up, w_down, and ffn_post_norm, the norm's bias, b_up, b_down
 * where it has them), the output head (2L + 1: out_norm, output, and the
 * norm's bias). Placement
 * policies size plans with these; the engine prepares the same blocks on
 * their devices. */
int qi_plan_n_blocks(int n_layer); /* 2 n_layer + 2 */
/* The device plan p runs block b on. */
int qi_plan_block_dev(const qi_plan *p, int b);
/* "layer 3's attention", "the output head" and the like, in buf. */
const char *qi_plan_block_name(int n_layer, int b, char *buf, size_t len);
/* Block b's weights in m (at most QI_PLAN_BLOCK_MAX_WEIGHTS, some of them
 * absent, data NULL, where the model has no such weight) into w, and
 * whether each is the matrix of a matmul (not a norm vector, nor the
 * embedding table read by row) into matmul; returns their number (0 for
 * b out of range). */
#define QI_PLAN_BLOCK_MAX_WEIGHTS 16
int qi_plan_block_weights(const qi_model *m, int b, const qi_weight **w, bool *matmul);
/* Block b's bytes uploaded to a device that holds the rows as they are:
 * each weight's rows (row_bytes x n_rows) rounded up to 64 bytes as the
 * engine allocates them (a device with a form of its own, qi_dev_weight_size,
 * may need more). 0 for b out of range. */
size_t qi_plan_block_bytes(const qi_model *m, int b);

#endif

/* gdcost.h - the gdcost placement policy's cost model and solver, on plain
 * numbers so that tests can drive them without an engine.
 *
 * The model predicts a decode step's time under a plan: per weight block
 * class (the embedding, a layer's attention, a layer's MLP, the output
 * head) and per device kind (the host CPU, the accelerator) a time linear
 * in the block's features, coef . (FLOPs, bytes read, 1), and per link
 * direction a copy time coef . (bytes, 1). Gradient descent on the
 * relative error of predicted against measured times corrects the
 * coefficients online; a dynamic program over the layers picks each
 * layer's attention device, split ratio and MLP device to minimise the
 * predicted step time within the accelerator's memory.
 */
#ifndef QI_PLACEMENT_GDCOST_H
#define QI_PLACEMENT_GDCOST_H

#include "placement/placement_policy.h"
#include "qinfer/hwprofile.h"

enum { QI_GD_EMBD = 0, QI_GD_ATTN, QI_GD_MLP, QI_GD_HEAD, QI_GD_CLASSES };
enum { QI_GD_FLOPS = 0, QI_GD_BYTES, QI_GD_FIXED, QI_GD_FEATURES };

/* A block of class c on a device of kind k (0 the CPU, 1 the accelerator)
 * takes sum over features f of base[k][f] x adj[c][k][f] x feature f:
 * base the device's seconds per FLOP, per byte and per kernel, shared by
 * every class (what one class teaches about a device applies to the
 * others it has not run), adj a class's own factors (its share of the
 * device's rates, its kernel count). */
typedef struct {
    double base[2][QI_GD_FEATURES];
    double adj[QI_GD_CLASSES][2][QI_GD_FEATURES];
    /* copies into [0] the CPU (device to host), [1] the accelerator: seconds per byte, per copy */
    double link[2][2];
} qi_gd_model;

/* A class's coefficient on a device kind: base x adj. */
double qi_gd_coef(const qi_gd_model *g, int c, int k, int f);

/* The coefficients a profile's peaks give (a block at the full rate of its
 * device: 1 / FLOP/s, 1 / bytes/s, the launch cost times the block's
 * kernels on a GPU), all times `scale` (2: a model off by a factor of two). */
void qi_gd_model_init(qi_gd_model *g, const qi_hwprofile *hw, double scale);

/* The features of block b (plan.h's numbering) in a decode step of wl
 * (wl->batch rows, each sequence at context wl->prompt_len): share is the
 * fraction of a layer's attention over the KV (1 - r on the attention's
 * device, r on a split's second device; `main` false for that second
 * part, which has no projections). */
void qi_gd_features(const qi_model *m, const qi_placement_workload *wl, int b, double share, bool main,
                    double f[QI_GD_FEATURES]);
/* A decode step's predicted seconds under plan p (devices: 0 the CPU,
 * every other the accelerator). */
double qi_gd_predict(const qi_gd_model *g, const qi_model *m, const qi_placement_workload *wl, const qi_plan *p);
/* The plan of least predicted step time whose blocks on device acc take at
 * most room bytes (block_bytes(ctx, b): a block's bytes there; the KV of
 * the workload by qi_placement_kv_bytes), over: each layer's attention on
 * the CPU or acc, split toward the other by one of the ratios `splits`
 * (n_splits of them, 0 always allowed), its MLP on either, the head on
 * either; the embedding on the CPU. Memory is counted in `grid` units of
 * room / grid, rounded up. out comes with its devices and layers set. */
void qi_gd_solve(const qi_gd_model *g, const qi_model *m, const qi_placement_workload *wl, int acc, double room,
                 size_t (*block_bytes)(const void *ctx, int b), const void *ctx, const float *splits, int n_splits,
                 int grid, qi_plan *out);
/* One gradient step from measured times t (per step) of the plan that
 * ran: per (class, device) the blocks' predicted and measured seconds are
 * summed, and each factor of a coefficient moves by -lr x relative error x
 * its share of the prediction, in log space (a multiplicative step, so
 * that it stays positive): the device's base by lr, the class's own factor
 * by lr / 4 (the base learns what is common to the classes a device ran);
 * the links likewise from the copies. A split attention's span
 * includes waiting for its second device, so only the second part
 * (split_s) is fitted for it. */
void qi_gd_observe(qi_gd_model *g, const qi_model *m, const qi_placement_times *t, double lr);

#endif

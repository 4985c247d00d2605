/* activity.h - FFN activation sparsity as a model, for the simulated
 * machine: which share of a layer's neurons fire on a token, how
 * concentrated they are, and how many distinct ones a batch of B tokens
 * touches.
 *
 * The simulator computes no activations, so a split's sides cannot see
 * which neurons fire; this model stands in for them. Each layer's neurons,
 * ranked hottest first, are cut into levels: a level covers a range of
 * ranks (as shares of the layer, [edge[k], edge[k+1])) whose neurons each
 * fire on a token with probability p[k], independently of each other and
 * of the other tokens. Then, for the neurons of ranks [lo, hi):
 *
 *     union(lo, hi, B) = sum over neurons of 1 - (1 - p_i)^B
 *
 * as a share of the layer (so union(0, 1, 1) is the mean active share);
 * the tokens of a batch are independent draws, which is the most a batch
 * can read (tokens that agree on their neurons read fewer).
 *
 * Sources of a model (qi_activity_parse):
 *   - a two-level model from published statistics: "active=A,hot=H:Y"
 *     (the mean active share A; the hottest share H of the neurons gives
 *     the share Y of the activations): the hot level fires with
 *     p_h = Y A / H, the rest with p_c = (1 - Y) A / (1 - H);
 *   - presets of it, each figure with its source (qi_activity_presets);
 *   - a neuron profile of a real model (`qinfer profile -o`): one level a
 *     neuron, p = its active tokens / the layer's tokens, per layer
 *     (qi_activity_from_profile).
 * `pred=F` adds an activation predictor (PowerInfer's and Q-Infer's: a
 * two-matrix MLP per layer, E -> r -> n_ff) of the share F of the model's
 * parameters, spread evenly over the layers.
 */
#ifndef QINFER_ACTIVITY_H
#define QINFER_ACTIVITY_H

#include "qinfer/status.h"

typedef struct qi_activity {
    int n_layer;   /* 1: every layer the same (a preset or A,H:Y); else a profile's */
    int n_lv;      /* levels per layer */
    double *edge;  /* [n_layer * (n_lv + 1)]: level k of layer l covers ranks [edge[l(n_lv+1)+k], ..+1) */
    double *p;     /* [n_layer * n_lv]: a neuron's probability of firing on a token */
    double pred;   /* the predictor's share of the model's parameters (0: none) */
    char name[96]; /* what it came from, for labels */
} qi_activity;

/* The expected share of layer l's neurons, of ranks [lo, hi) (shares of
 * the layer, 0 <= lo <= hi <= 1), active on at least one of B tokens.
 * A model of one layer serves every l. */
double qi_activity_union(const qi_activity *a, int l, double lo, double hi, int B);

/* A spec: a preset name (qi_activity_presets), or
 * "active=A,hot=H:Y[,pred=F]", or "profile=PATH[,pred=F]". A preset may
 * be followed by ",pred=F" to change its predictor. Errors: QI_ERR_INVALID
 * naming the bad part (an unknown preset lists the known ones; a hot
 * level that would fire above 1, Y A > H; shares outside their ranges),
 * the profile reader's errors. *out is owned: qi_activity_fini. */
qi_status qi_activity_parse(const char *spec, qi_activity *out, qi_err *err);

/* Two levels from A, H and Y (above), with the predictor share F. */
qi_status qi_activity_two_level(double active, double hot, double hot_mass, double pred, qi_activity *out, qi_err *err);

/* One level a neuron from per-neuron active counts over each layer's
 * tokens ([n_layer * n_ff], ranked here). */
qi_status qi_activity_from_counts(int n_layer, int n_ff, const int64_t *active, const long *layer_tokens,
                                  qi_activity *out, qi_err *err);

void qi_activity_fini(qi_activity *a);

/* The presets: name, spec, and the source of each figure (NULL-terminated). */
typedef struct {
    const char *name, *spec, *source;
} qi_activity_preset;
extern const qi_activity_preset qi_activity_presets[];

#endif

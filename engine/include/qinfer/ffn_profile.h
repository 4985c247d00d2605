/* ffn_profile.h - the FFN neuron profiler's core (`qinfer profile`): what
 * it accumulates from a run's FFN activations (qi_engine_opts.ffn_observe),
 * kept apart from the engine so it can be fed hand-made activations.
 *
 * Per layer and neuron j (n_ff of them), over every token fed:
 *   active[j]  tokens with |act_j| > threshold;
 *   hot[j]     tokens where j is in the token's hot set H_t, the k neurons
 *              of largest |act| (k = qi_ffnprof_k: the top fraction of
 *              n_ff, rounded, at least 1; ties go to the lower index);
 *   mass[j]    the sum of |act_j| (activation mass).
 * Per layer, the locality figures:
 *   token overlap   mean over consecutive tokens t, t+1 of the same
 *                   sequence of |H_t & H_{t+1}| / k;
 *   window overlap  the same between consecutive complete windows of
 *                   `window` tokens of a sequence (tokens [0, w), [w, 2w),
 *                   ...; a window's hot set is the k neurons of largest
 *                   summed |act| over its tokens; a sequence's trailing
 *                   partial window is not counted);
 *   mass share      the share of the layer's total mass carried by the k
 *                   neurons of largest total mass over the run.
 * Hot sets chosen at random would overlap by k / n_ff on average: the
 * baseline the overlaps are read against.
 *
 * Feeding: qi_ffnprof_add(layer, rows) with a sequence's consecutive
 * tokens, in order, in as many calls as it takes; qi_ffnprof_end_seq
 * between sequences (no pair or window spans it). Layers are independent:
 * each keeps its own position in the current sequence.
 */
#ifndef QINFER_FFN_PROFILE_H
#define QINFER_FFN_PROFILE_H

#include <stdint.h>
#include <stdio.h>

#include "qinfer/status.h"

typedef struct {
    float threshold; /* |act| > threshold counts as active (>= 0) */
    double top;      /* hot-set fraction of n_ff, in (0, 1] */
    int window;      /* tokens per window, >= 1 */
} qi_ffnprof_opts;

typedef struct {
    long tokens;                 /* tokens fed to the layer */
    long tok_pairs, win_pairs;   /* consecutive pairs counted */
    double tok_overlap;          /* mean |H_t & H_t+1| / k (0 without pairs) */
    double win_overlap;          /* mean over consecutive windows (0 without pairs) */
    double active_frac;          /* mean share of neurons active per token */
    double mass_share;           /* share of the mass on the top-k neurons by mass */
    double mass;                 /* the layer's total mass */
} qi_ffnprof_layer;

typedef struct qi_ffnprof qi_ffnprof;

/* Errors: QI_ERR_INVALID for a bad shape or option, QI_ERR_NOMEM. */
qi_status qi_ffnprof_create(int n_layer, int n_ff, const qi_ffnprof_opts *o, qi_ffnprof **out, qi_err *err);
void qi_ffnprof_free(qi_ffnprof *p); /* NULL is a no-op */
/* The hot-set size: round(top * n_ff), at least 1, at most n_ff. */
int qi_ffnprof_k(const qi_ffnprof *p);
/* rows consecutive tokens of the current sequence for one layer, row-major
 * [rows][n_ff]. A layer out of range is ignored. */
void qi_ffnprof_add(qi_ffnprof *p, int layer, const float *act, int rows);
/* The current sequence ends: the next tokens start a new one. */
void qi_ffnprof_end_seq(qi_ffnprof *p);

void qi_ffnprof_layer_get(const qi_ffnprof *p, int layer, qi_ffnprof_layer *out);
/* Per-neuron arrays of a layer, [n_ff] each, the profiler's own. */
const int64_t *qi_ffnprof_active(const qi_ffnprof *p, int layer);
const int64_t *qi_ffnprof_hot(const qi_ffnprof *p, int layer);
const double *qi_ffnprof_mass(const qi_ffnprof *p, int layer);

/* The profile file (text, one neuron a line; docs in engine/cli/cmd_profile.c
 * and paper-repro/README.md):
 *   # qinfer ffn-profile 1
 *   # model PATH
 *   # corpus PATH
 *   # n_layer L n_ff F tokens N ctx C threshold T top P k K window W
 *   # layer I tokens N tok_overlap X win_overlap Y mass_share Z active_frac A   (one per layer)
 *   # columns: layer neuron active hot mass
 *   0 0 812 95 301.25
 *   ...
 * ctx is the caller's chunk length, written as given. Errors: QI_ERR_IO. */
qi_status qi_ffnprof_write(const qi_ffnprof *p, FILE *f, const char *model, const char *corpus, int ctx,
                           qi_err *err);

#endif

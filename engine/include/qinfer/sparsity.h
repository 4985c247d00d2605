/* sparsity.h - training-free activation sparsity: which activations the
 * engine zeroes, and the calibration that picks the thresholds.
 *
 * Two modes, each a magnitude threshold per layer, calibrated on a corpus
 * so that a target share of the activations falls under it:
 *
 *   teal  (Liu et al., "Training-Free Activation Sparsity in Large Language
 *         Models", 2024): the input of every matmul of a layer is
 *         thresholded: the attention's normed input (q, k, v), its output
 *         (o), the MLP's normed input (gate, up) and act(gate) * up
 *         (down). A zero input is a column of the matrix not read.
 *   cats  (Lee et al., "CATS: Contextually-Aware Thresholding for Sparsity
 *         in Large Language Models", 2024): the gate is computed whole;
 *         neuron j is kept where |act(gate_j)| is over the threshold, and
 *         for the others neither up's row j nor down's column j is read.
 *
 * Sites (per layer) where activations are observed and thresholded: */
#ifndef QINFER_SPARSITY_H
#define QINFER_SPARSITY_H

#include <stdint.h>

#include "qinfer/status.h"

typedef enum { QI_SPARSITY_TEAL = 1, QI_SPARSITY_CATS = 2 } qi_sparsity_mode;

typedef enum {
    QI_SITE_ATTN_IN,  /* the attention's normed input: q, k and v's (teal) */
    QI_SITE_ATTN_OUT, /* the attention's output: o's input (teal) */
    QI_SITE_FFN_IN,   /* the MLP's normed input: gate and up's (teal) */
    QI_SITE_FFN_ACT,  /* act(gate) * up: down's input (teal) */
    QI_SITE_GATE,     /* act(gate), whose magnitude picks the neurons (cats) */
    QI_SITE_COUNT
} qi_sparsity_site;

/* "attn_in", "attn_out", "ffn_in", "ffn_act", "gate"; NULL out of range. */
const char *qi_sparsity_site_name(int site);
const char *qi_sparsity_mode_name(qi_sparsity_mode m); /* "teal", "cats" */
qi_status qi_sparsity_mode_parse(const char *s, qi_sparsity_mode *out, qi_err *err);
/* Whether mode thresholds site. */
int qi_sparsity_uses(qi_sparsity_mode m, int site);

/* ---- calibration ----------------------------------------------------------
 * A histogram of |x| per (layer, site): bins of 1/64 of an octave from
 * 2^-64 to 2^64 (values outside clamp to the end bins) and zeros apart, so
 * a quantile is known to 1.1% of its value. */
typedef struct qi_sparsity_calib qi_sparsity_calib;

qi_status qi_sparsity_calib_new(int n_layer, qi_sparsity_calib **out, qi_err *err);
void qi_sparsity_calib_free(qi_sparsity_calib *c); /* NULL is a no-op */
void qi_sparsity_calib_add(qi_sparsity_calib *c, int layer, int site, const float *x, long n);
/* Values seen at (layer, site). */
uint64_t qi_sparsity_calib_count(const qi_sparsity_calib *c, int layer, int site);
/* The smallest bin edge t with at least a share q (in [0, 1]) of the
 * values seen at (layer, site) at most t in magnitude (0 when zeros alone
 * make up q); -1 when nothing was seen there. */
double qi_sparsity_calib_quantile(const qi_sparsity_calib *c, int layer, int site, double q);
/* The calibration file: `#` header lines (the model, the tokens), then one
 * line per (layer, site) seen: `layer site t_0 t_1 ... t_100`, t_k the
 * quantile at k / 100. */
qi_status qi_sparsity_calib_write(const qi_sparsity_calib *c, const char *path, const char *model, long tokens,
                                  qi_err *err);

/* ---- thresholds -------------------------------------------------------- */

#define QI_SPARSITY_PCTS 101

typedef struct qi_sparsity_s {
    qi_sparsity_mode mode;
    double target;  /* the share of the thresholded sites' activations zeroed, in [0, 1) */
    int n_layer;
    float *thr;     /* [n_layer][QI_SITE_COUNT]: |x| <= thr is zeroed; < 0 where not thresholded */
} qi_sparsity;

/* Thresholds for mode at target (in [0, 1)) from a calibration file:
 * every site the mode uses gets the quantile at target, interpolated
 * between the file's percentiles. Errors name the file and line: a
 * missing or repeated (layer, site), a layer out of range, quantiles not
 * finite, negative or decreasing, a file of another layer count. */
qi_status qi_sparsity_load(const char *path, qi_sparsity_mode mode, double target, int n_layer, qi_sparsity *out,
                           qi_err *err);
void qi_sparsity_free(qi_sparsity *s);

#endif

/* ffn_split.h - an FFN's neurons cut between two devices (the hot-neuron
 * split of policies/neuron/).
 *
 * Neuron j of a gated FFN is row j of gate, row j of up and column j of
 * down. Rows of gate and up are stored apart, so any set of them can be
 * gathered as it is; down is stored by rows of n_ff inputs, cut into
 * quantisation blocks along the neuron axis (32 neurons for q4_0 ... q8_0,
 * 256 for the K-quants), so a set of its columns can be gathered without
 * requantisation only in whole blocks. The split is therefore made in
 * units of down's block: unit u holds neurons [u * unit, (u + 1) * unit).
 * (PowerInfer stores down transposed, requantised, to place single
 * neurons; here every weight stays the file's bytes.)
 *
 * A split gathers, for each side, that side's rows of gate and up and its
 * blocks of every row of down, in unit order, into matrices of the file's
 * types: side 1 (fast) the units the mask marks, side 0 (slow) the rest.
 * Each side's product down_s . glu(gate_s x, up_s x) is the FFN's output
 * summed over its neurons only, and the two add up to the whole. With
 * every unit on one side that side's matrices are the layer's own rows
 * and blocks in order, so its matmuls are the unsplit ones bit for bit.
 */
#ifndef QI_FFN_SPLIT_H
#define QI_FFN_SPLIT_H

#include <stdbool.h>
#include <stdint.h>

#include "qinfer/model.h"
#include "qinfer/status.h"

typedef struct {
    int unit;              /* neurons per unit: down's block */
    int n_units;           /* n_ff / unit */
    int n[2];              /* neurons on side 0 (slow) and 1 (fast), side 0's spare units included */
    int spare;             /* units of zeros after side 0's own (qi_ffn_split_build_spare) */
    qi_weight gate[2], up[2], down[2]; /* each side's gathered matrices (data NULL when the model has none) */
    void *mem;             /* their bytes */
} qi_ffn_split;

/* The unit of a layer's split: the block of its down matrix (1 for plain
 * types, making every neuron a unit). */
int qi_ffn_split_unit(const qi_layer *ly);
/* Gather ly's FFN (gated: gate, up and down) into the two sides of
 * fast[n_units] (1: the unit on side 1). With copy false (a model of
 * shapes only, whose bytes cannot be read) nothing is copied: the
 * matrices have their shapes and point at the layer's own (unread). Errors:
 * QI_ERR_INVALID (no gate, shapes that do not match, n_ff not a whole
 * number of units), QI_ERR_NOMEM. *out zeroed on failure. */
qi_status qi_ffn_split_build(const qi_layer *ly, const uint8_t *fast, bool copy, qi_ffn_split *out, qi_err *err);
/* The same with `spare` units of zero bytes after side 0's own units
 * (gate and up rows and down blocks of zeros: zero weights, so their
 * neurons' activations are act(0) x 0 and add nothing), room for a unit
 * to move into the slow side while another is still leaving it (the
 * engine's background swaps). QI_ERR_INVALID for spare outside 0..n_units. */
qi_status qi_ffn_split_build_spare(const qi_layer *ly, const uint8_t *fast, bool copy, int spare, qi_ffn_split *out,
                                   qi_err *err);
void qi_ffn_split_free(qi_ffn_split *s); /* zeroed; a zeroed one is a no-op */

#endif

/* neuron_live.h - the qinfer neuron policy at run time: a fast-device
 * neuron set that follows the activity, with a background worker that
 * swaps neurons between the devices and an engine that reads the set
 * while it does.
 *
 * State, per layer: the fast device's slots (as many as the placement put
 * neurons there; each holds one neuron's gate row, up row and down column,
 * or nothing while a copy fills it) and, per neuron, its slot or -1 (on
 * the slow device, which keeps every neuron's weights in the model's own
 * mapping and so can compute any neuron at any time). A neuron is computed
 * where it is: in a slot on the fast device, else on the slow one. At
 * every moment a reader can observe, each neuron is in exactly one place:
 * either in one slot whose entry names it, or in none and marked -1.
 *
 * Reading: qi_neuron_live_begin(layer) returns the layer's state and holds
 * it still until qi_neuron_live_end(layer); the engine brackets a layer's
 * FFN with them (both devices compute from the one view), and may cache
 * what it derives from a view by its generation, which changes whenever
 * the layer's state does.
 *
 * A swap (hottest slow neuron a into the slot s of the coldest fast
 * neuron b) is made in three steps, so that the copy runs without holding
 * readers off:
 *   1. under the layer's write hold: b leaves slot s (b is slow; s empty);
 *   2. without it: the engine's copy callback writes a's weights into s
 *      (no reader uses s: it is empty in every view taken since step 1);
 *   3. under the write hold: a enters s.
 * Between 1 and 3 both neurons are on the slow device: one place each.
 * A copy that fails leaves s empty (a stays slow); later rounds may fill it.
 * The write hold waits for readers to end and, once asked for, lets no
 * new reader begin (a reader-writer lock that prefers the writer, built
 * on a mutex and a condition variable so it is fair on every libc).
 *
 * The rule (qi_neuron_live_rebalance, each round of the worker): per
 * layer, with the observed activity a_j (a moving average of activity per
 * token), work on each side W_fast = sum a_j over fast neurons, W_slow over
 * slow ones, and predicted seconds per token t_slow = slow_s * W_slow,
 * t_fast = slow_s * W_fast / ratio (the fast device `ratio` times faster).
 * While t_slow > t_fast and |t_slow - t_fast| > tol * t_slow, pair the
 * hottest slow neuron with the coldest fast one (an empty slot first, as
 * an entry of activity 0); the swap's gain is the drop of max(t_fast,
 * t_slow) per token, its cost the copy's seconds, neuron_bytes / link_bw;
 * it is made when gain * horizon > cost (the gain counted over `horizon`
 * tokens), and the round stops at the first pair that does not pay or
 * after max_swaps swaps. When the fast side is the slower the rule does
 * nothing: the placement's greedy keeps the fast share below balance, and
 * the released method only swaps toward the fast device.
 */
#ifndef QI_NEURON_LIVE_H
#define QI_NEURON_LIVE_H

#include <stdbool.h>
#include <stdint.h>

#include "qinfer/status.h"

typedef struct qi_neuron_live_opts {
    double ratio;   /* R = fast speed / slow speed of the sparse FFN products (> 0) */
    double slow_s;  /* slow device seconds per unit of activity per token (> 0) */
    double link_bw; /* bytes per second of a copy into the fast device (> 0) */
    double horizon; /* tokens a swap's gain is counted over (> 0) */
    double decay;   /* weight of a new window in the moving average, in (0, 1] */
    double tol;     /* balance tolerance, a share of t_slow, in [0, 1) */
    int max_swaps;  /* per layer and round, >= 1 */
} qi_neuron_live_opts;

/* Defaults: ratio 1, slow_s 1e-7, link_bw 16e9 (PCIe 4.0 x16), horizon
 * 64, decay 0.25, tol 0.05, max_swaps 64. */
void qi_neuron_live_opts_default(qi_neuron_live_opts *o);

/* The engine's copy of neuron `neuron`'s weights of layer `layer` into
 * fast slot `slot` (called by the worker with no lock held, never for a
 * slot a reader may be using); 0 on success. */
typedef int (*qi_neuron_copy_fn)(void *ctx, int layer, int neuron, int slot);
/* Called after every swap (no lock held): for tests and traces. */
typedef void (*qi_neuron_swap_fn)(void *ctx, int layer, int neuron_in, int neuron_out, int slot);

/* A neuron's move, seen by the engine while no reader can see the layer:
 * called under the layer's write hold, right after neuron left `slot`
 * (step 1) or entered it (step 3), so that what a reader computes from
 * changes with the view (the engine, say, lets the slot compute nothing
 * while it is empty, and the slow side take the neuron that left). */
typedef void (*qi_neuron_move_fn)(void *ctx, int layer, int neuron, int slot);

typedef struct qi_neuron_live qi_neuron_live;

/* From a placement: fast[n_layer * n_ff] (1: on the fast device; each
 * layer's count is its slots, filled in neuron order), activity[n_layer *
 * n_ff] the starting activity per token (>= 0, finite; the profile's mass
 * / tokens, say), neuron_bytes[n_layer] (> 0). copy may be NULL (no weights
 * to move: a simulation), swap may be NULL. Everything is allocated here;
 * nothing is allocated afterwards. Errors: QI_ERR_INVALID naming the bad
 * option or value, QI_ERR_NOMEM. */
qi_status qi_neuron_live_create(int n_layer, int n_ff, const uint8_t *fast, const double *activity,
                                const uint64_t *neuron_bytes, const qi_neuron_live_opts *o, qi_neuron_copy_fn copy,
                                qi_neuron_swap_fn swap, void *ctx, qi_neuron_live **out, qi_err *err);
/* Stops the worker if running; NULL is a no-op. */
void qi_neuron_live_free(qi_neuron_live *lv);

/* The move hooks (either may be NULL), set before the worker starts. */
void qi_neuron_live_hooks(qi_neuron_live *lv, qi_neuron_move_fn leave, qi_neuron_move_fn enter);

/* Start the background worker (pthreads). Errors: QI_ERR_INVALID when it
 * runs already, QI_ERR_BACKEND when the thread cannot start. */
qi_status qi_neuron_live_start(qi_neuron_live *lv, qi_err *err);
/* Stop it and wait for it (a round in progress finishes its swap). */
void qi_neuron_live_stop(qi_neuron_live *lv);

/* Observed activity of layer `layer` over the last `tokens` tokens
 * (activity[n_ff], summed over them: mass or active counts, the same
 * measure the live state was created with). Windows add up until the
 * worker (or qi_neuron_live_rebalance) takes them into the moving average.
 * Safe from any thread. Errors: QI_ERR_INVALID (layer out of range, tokens
 * < 1, a value negative or not finite: nothing is added). */
qi_status qi_neuron_live_feed(qi_neuron_live *lv, int layer, const double *activity, long tokens, qi_err *err);
/* Windows of every layer at once (activity[n_layer * n_ff], tokens[n_layer],
 * 0 for a layer not fed): one wake-up of the worker, so one round takes
 * them all in. The same errors, per layer; nothing is added on one. */
qi_status qi_neuron_live_feed_all(qi_neuron_live *lv, const double *activity, const long *tokens, qi_err *err);
/* With the worker running: wait until every window fed before the call
 * has been taken in and its round of swaps made. */
void qi_neuron_live_sync(qi_neuron_live *lv);
/* Without the worker: take in the windows fed and make one round of swaps
 * on every layer, in this thread. Returns the swaps made. (With the
 * worker running it does nothing and returns -1.) */
int qi_neuron_live_rebalance(qi_neuron_live *lv);

/* A layer's state as a reader sees it. */
typedef struct {
    int n_ff, n_slots;
    const int32_t *slot;  /* [n_slots] the neuron in each fast slot, -1 while a copy fills it */
    const int32_t *where; /* [n_ff] the neuron's slot, -1 on the slow device */
    uint64_t gen;         /* changes whenever the layer's state does */
} qi_neuron_live_view;

/* Hold layer's state still and show it; end the hold with
 * qi_neuron_live_end (the view is valid until then). Holds of different
 * layers are independent; any number of readers may hold one layer. A
 * layer out of range is a programmer's error (QI_ASSERT). */
void qi_neuron_live_begin(qi_neuron_live *lv, int layer, qi_neuron_live_view *v);
void qi_neuron_live_end(qi_neuron_live *lv, int layer);
/* Check a view: every neuron in exactly one place (where[] and slot[]
 * agree, no neuron in two slots, ids in range). QI_ERR_BACKEND naming the
 * first neuron or slot at fault. */
qi_status qi_neuron_live_view_check(const qi_neuron_live_view *v, int layer, qi_err *err);

typedef struct {
    long rounds, swaps, failed_copies;
    double copied_bytes, copy_s; /* bytes moved and their predicted seconds */
    double t_fast, t_slow;       /* the last round's predicted seconds per token, summed over layers */
} qi_neuron_live_stats;
/* The figures so far (consistent with each other; safe from any thread). */
void qi_neuron_live_stats_get(qi_neuron_live *lv, qi_neuron_live_stats *out);

#endif

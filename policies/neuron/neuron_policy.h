/* neuron_policy.h - the FFN neuron slot: which neurons of each layer's FFN
 * (rows of gate and up, the matching columns of down) live and run on the
 * fast device (the accelerator) and which on the slow one (the host CPU).
 *
 * A policy is shown, per layer, every neuron's profiled activity (its
 * activation mass from `qinfer profile -o`, or its activation count), the
 * bytes one neuron takes on the fast device (a gate row, an up row and a
 * down column at the layer's weight types) and the fast device's byte
 * budget. Neurons are placed in groups: each layer's neurons are ranked by
 * activity (hottest first, ties to the lower index) and cut into groups of
 * `group` consecutive ranks (256 by default, the last one smaller when the
 * layer's width is not a multiple), so a group is a set of neurons of alike
 * heat, as PowerInfer's solver forms them. The policy chooses, per (layer,
 * group), fast or slow; the wrapper (registry.c) forms the groups, checks
 * the choice against the budget (a policy that exceeds it is refused,
 * whatever it is) and expands it to a per-neuron plan with its summary
 * figures. The engine executes such a plan: the fast device computes its
 * neurons while the slow device computes the rest, and the two partial
 * down products are added before the next op.
 *
 * Everything here works on plain numbers, so it runs without a model or a
 * device; qi_neuron_bytes_of_model reads the bytes per neuron off a loaded
 * model. The run-time side of the qinfer policy (the swap worker) is in
 * neuron_live.h. A new policy is one file plus one line in registry.c.
 */
#ifndef QI_NEURON_POLICY_H
#define QI_NEURON_POLICY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "neuron/neuron_live.h"
#include "qinfer/params.h"
#include "qinfer/status.h"

#define QI_NEURON_POLICY_VERSION 1u
#define QI_NEURON_GROUP_DEFAULT 256
#define QI_NEURON_MAX_LAYERS 4096
#define QI_NEURON_MAX_FF (1 << 22)

struct qi_model;

/* ---- the profile file --------------------------------------------------------------- */

/* A profile written by `qinfer profile -o` (format in qinfer/ffn_profile.h),
 * read back. Arrays are [n_layer * n_ff], neuron j of layer l at
 * l * n_ff + j. */
typedef struct {
    int n_layer, n_ff;
    long tokens;        /* tokens profiled (the settings line) */
    long *layer_tokens; /* [n_layer] each layer's tokens (its '# layer' line; tokens if absent) */
    int64_t *active;    /* tokens the neuron was active on (|act| > threshold) */
    int64_t *hot;       /* tokens it was among the token's hot set */
    double *mass;       /* its summed |act| */
    char model[256];    /* the '# model' line ("" if absent; cut to fit) */
} qi_neuron_profile;

/* Read the profile at path into *out (owned: qi_neuron_profile_fini).
 * Every line is checked: the first must be "# qinfer ffn-profile 1"; the
 * settings line "# n_layer L n_ff F tokens N ..." must come before the
 * first neuron line; each neuron line is "layer neuron active hot mass"
 * with every (layer, neuron) in range and given once, counts whole and in
 * [0, the layer's tokens], mass finite and >= 0; other '#' lines are
 * comments (the '# layer' lines are read for their tokens). Errors:
 * QI_ERR_IO (cannot open or read), QI_ERR_FORMAT "PATH:LINE: why" for a
 * malformed file (at the end, the first missing neuron), QI_ERR_UNSUPPORTED
 * for another version, QI_ERR_NOMEM. *out is zeroed on failure. */
qi_status qi_neuron_profile_read(const char *path, qi_neuron_profile *out, qi_err *err);
/* The same from an open stream; name is used in messages. */
qi_status qi_neuron_profile_readf(FILE *f, const char *name, qi_neuron_profile *out, qi_err *err);
void qi_neuron_profile_fini(qi_neuron_profile *p); /* zeroed; a zeroed one is a no-op */

/* ---- what a policy is given ---------------------------------------------------------- */

/* The placement problem in neurons. Borrowed pointers. */
typedef struct {
    int n_layer, n_ff;
    const double *activity;       /* [n_layer * n_ff] >= 0, finite: what a neuron on the fast device saves */
    const uint64_t *neuron_bytes; /* [n_layer] > 0: one neuron's gate row + up row + down column there */
    int64_t budget;               /* fast device bytes for FFN neurons (>= 0; 0 keeps nothing) */
    int group;                    /* neurons per group (>= 1; 0: QI_NEURON_GROUP_DEFAULT) */
} qi_neuron_input;

/* The same problem in groups, as the wrapper forms it for a policy. Group
 * g of layer l (index l * n_groups + g) holds the neurons of ranks
 * [g * group, min((g + 1) * group, n_ff)) of the layer, rank[] listing
 * them. */
typedef struct {
    int n_layer, n_ff, group, n_groups;
    int32_t *rank;          /* [n_layer * n_ff] neuron ids by falling activity, per layer */
    double *mass;           /* [n_layer * n_groups] the group's summed activity */
    uint64_t *bytes;        /* [n_layer * n_groups] its bytes on the fast device */
    double *layer_mass;     /* [n_layer] the layer's summed activity */
    int64_t budget;
} qi_neuron_groups;

/* Form in's groups into *g (owned: qi_neuron_groups_fini). Errors:
 * QI_ERR_INVALID for a bad input (shape out of range, group < 0, a
 * negative budget, an activity negative or not finite, 0 bytes per neuron,
 * every neuron's bytes together past 2^62), naming the first bad value;
 * QI_ERR_NOMEM. */
qi_status qi_neuron_groups_init(qi_neuron_groups *g, const qi_neuron_input *in, qi_err *err);
void qi_neuron_groups_fini(qi_neuron_groups *g);

/* ---- what a policy returns ----------------------------------------------------------- */

/* A placement: per layer which neurons are on the fast device, and its
 * figures. Arrays owned (qi_neuron_plan_fini). */
typedef struct {
    int n_layer, n_ff, group, n_groups;
    uint8_t *group_fast;  /* [n_layer * n_groups] 1: the group is on the fast device */
    uint8_t *fast;        /* [n_layer * n_ff] 1: neuron j of layer l is */
    int *n_fast;          /* [n_layer] neurons on the fast device */
    int *groups_fast;     /* [n_layer] groups on the fast device */
    double *mass_fast;    /* [n_layer] their activity */
    double *mass;         /* [n_layer] the layer's activity */
    uint64_t *bytes;      /* [n_layer] their bytes */
    double total_mass_fast, total_mass;
    uint64_t total_bytes;
    int64_t budget;
    bool optimal;         /* the policy proved its choice optimal for its objective (static) */
    double bound;         /* an upper bound on total_mass_fast over every choice within the
                           * budget (static: the LP relaxation's), NAN where none is known */
} qi_neuron_plan;

void qi_neuron_plan_fini(qi_neuron_plan *p); /* zeroed; a zeroed one is a no-op */
/* Fill *p from groups g and the per-group choice x ([n_layer * n_groups],
 * 0/1): the per-neuron mask and the figures. Errors: QI_ERR_NOMEM. */
qi_status qi_neuron_plan_from_groups(const qi_neuron_groups *g, const uint8_t *x, qi_neuron_plan *p, qi_err *err);

/* ---- the policies -------------------------------------------------------------------- */

typedef struct qi_neuron_policy qi_neuron_policy;

/* What a policy says of its choice (both come unset: false, NAN). */
typedef struct {
    bool optimal; /* proven optimal for the policy's objective */
    double bound; /* an upper bound on the mass any choice within the budget keeps, or NAN */
} qi_neuron_place_info;

typedef struct {
    uint32_t version;    /* QI_NEURON_POLICY_VERSION */
    const char *name;    /* "static" */
    const char *summary; /* one line for --help */
    const char *params;  /* one line: the keys it takes with defaults, or "" */
    /* Validate params (an unknown key or a bad value: an error naming the
     * policy and the key) and build the policy. */
    qi_status (*create)(const qi_params *params, qi_neuron_policy **out, qi_err *err);
    /* Choose: x[l * n_groups + g] = 1 puts group g of layer l on the fast
     * device (x comes zeroed), within g->budget bytes, and say what is
     * known of the choice in *info. */
    qi_status (*place)(qi_neuron_policy *p, const qi_neuron_groups *g, uint8_t *x, qi_neuron_place_info *info,
                       qi_err *err);
    void (*free)(qi_neuron_policy *p);
} qi_neuron_policy_i;

/* Every policy object starts with its interface. */
struct qi_neuron_policy {
    const qi_neuron_policy_i *iface;
};

/* registry.c: the policies, NULL-terminated (static only where GLPK is built in). */
extern const qi_neuron_policy_i *const qi_neuron_policies[];
const qi_neuron_policy_i *qi_neuron_policy_find(const char *name); /* NULL if unknown */
/* Create by name; params may be NULL. Errors: an unknown name
 * (QI_ERR_INVALID listing the known ones; static in a build without GLPK:
 * QI_ERR_UNSUPPORTED saying so), create's. *out NULL on failure. */
qi_status qi_neuron_policy_create(const char *name, const qi_params *params, qi_neuron_policy **out, qi_err *err);
/* From "NAME[:K=V,...]". */
qi_status qi_neuron_policy_from_spec(const char *spec, qi_neuron_policy **out, qi_err *err);
const char *qi_neuron_policy_name(const qi_neuron_policy *p);
void qi_neuron_policy_free(qi_neuron_policy *p); /* NULL is a no-op */
/* The policy's placement of in into *out (owned: qi_neuron_plan_fini;
 * zeroed on failure). Errors: those of qi_neuron_groups_init, the
 * policy's, QI_ERR_BACKEND when the policy's choice exceeds the budget or
 * is not 0/1 (naming the policy). */
qi_status qi_neuron_policy_place(qi_neuron_policy *p, const qi_neuron_input *in, qi_neuron_plan *out, qi_err *err);

/* ---- the algorithms, on groups (for tests and other callers) ------------------------- */

/* static's integer program (static.c; built with GLPK): binary x per
 * (layer, group), maximise sum mass * x subject to sum bytes * x <=
 * budget and, when min_groups > 0, per layer either no group or at least
 * min_groups of them on the fast device (PowerInfer's communication
 * threshold; a binary y per layer, x <= y, sum_g x >= min_groups * y).
 * (a min_groups above the layer's groups is taken as all of them).
 * time_limit_s > 0 bounds GLPK's branch and bound and gap in [0, 1] lets
 * it stop within that relative gap of the bound. info->optimal is true
 * only when the optimum is proven with gap 0; when the search stops early
 * with a feasible choice, that choice is returned with optimal false (an
 * error when it has none); info->bound is the LP relaxation's value, an
 * upper bound on every choice's mass. x[n_layer * n_groups] is
 * overwritten. Budget 0 keeps nothing. Errors: QI_ERR_INVALID (min_groups
 * < 0, gap out of range), QI_ERR_BACKEND (GLPK failed), QI_ERR_NOMEM. */
qi_status qi_neuron_mip_solve(const qi_neuron_groups *g, int min_groups, double time_limit_s, double gap,
                              uint8_t *x, qi_neuron_place_info *info, qi_err *err);

/* qinfer's greedy (qinfer.c): with ratio R = fast speed / slow speed, a
 * layer is balanced when the fast device holds a share R / (1 + R) of its
 * activity. Every (layer, group) in falling order of mass (ties: lower
 * layer, lower group) is put on the fast device while its layer's fast
 * share is below that target and its bytes fit in what is left of the
 * budget; a group that does not fit is passed over, and a group of no
 * activity is never placed. R > 0, finite. x[n_layer * n_groups] is
 * overwritten. */
void qi_neuron_greedy(const qi_neuron_groups *g, double ratio, uint8_t *x);
/* a[0..n) (indices into v) sorted by falling v, ties to the lower index: a
 * merge sort (stable, the same order on every libc); tmp is n scratch. */
void qi_neuron_sort_desc(int32_t *a, int32_t *tmp, int n, const double *v);
/* A qinfer policy's ratio (NAN for another policy or NULL). */
double qi_neuron_qinfer_ratio(const qi_neuron_policy *p);
/* A qinfer policy's options for its swap worker (neuron_live.h: ratio and
 * the parameters slow_s, link_bw, horizon, decay, tol, max_swaps, each
 * with its default when not given). Errors: QI_ERR_INVALID for another
 * policy. */
qi_status qi_neuron_qinfer_live_opts(const qi_neuron_policy *p, qi_neuron_live_opts *o, qi_err *err);

/* qinfer's start-up calibration (qinfer.c). The engine supplies the timer:
 * seconds one sparse up and down product of n_neurons active neurons
 * takes at batch rows on the slow (fast 0) or fast (fast 1) device. Each
 * device is timed reps times at n_ff / 8, n_ff / 4 and n_ff / 2 neurons;
 * the ratio is the slow device's least-squares slope (seconds per neuron,
 * of the medians) over the fast device's, so a fixed launch cost does not
 * count (where noise hides a slope, the largest size's seconds per neuron
 * stand in). Errors: QI_ERR_INVALID (n_ff < 8, batch < 1, reps outside 1
 * to 1000, no timer), QI_ERR_BACKEND (a time negative or not finite, or a
 * device whose times are all 0). *ratio is NAN on failure. */
typedef double (*qi_neuron_time_fn)(void *ctx, int fast, int n_neurons, int batch);
qi_status qi_neuron_calibrate(qi_neuron_time_fn time_fn, void *ctx, int n_ff, int batch, int reps, double *ratio,
                              qi_err *err);

/* ---- model figures and accuracy ------------------------------------------------------ */

/* Bytes one neuron of each layer takes (out[n_layer]): its gate row and
 * up row (row_bytes each; no gate in a gate-free FFN) and its share of
 * down, down's bytes / n_ff rounded up (a block-quantised down's column
 * is not stored apart; PowerInfer keeps down transposed, so that each
 * neuron's down weights are a row of the same size). Errors:
 * QI_ERR_INVALID when a layer's FFN matrices do not have n_ff rows (gate,
 * up) or columns (down). */
qi_status qi_neuron_bytes_of_model(const struct qi_model *m, uint64_t *out, qi_err *err);

/* Recall and precision of a fast set against the neurons actually active.
 * With per-neuron counts count[j] (tokens on which neuron j was active, out
 * of `tokens`) and the fast mask fast[j] over n neurons:
 *   recall    = sum_{j fast} count[j] / sum_j count[j]
 *             (the share of active (token, neuron) pairs the fast device
 *             holds; NAN when nothing was active),
 *   precision = sum_{j fast} count[j] / (tokens * |fast|)
 *             (the mean share of the fast set active on a token; NAN when
 *             the fast set is empty or tokens is 0).
 * One token's mask is count[j] in {0, 1} with tokens 1. */
typedef struct {
    double recall, precision;
    int64_t hit, active, fast; /* sum_{fast} count, sum count, |fast| */
} qi_neuron_rp;
void qi_neuron_recall(const uint8_t *fast, const int64_t *count, int n, long tokens, qi_neuron_rp *out);

/* ---- a split for the engine (split.c) ------------------------------------------------ */

/* A policy's placement of model m's FFN as the engine runs it
 * (qinfer/engine.h, opts.neuron_fast): neurons in units of down's
 * quantisation block (qi_engine_neuron_unit), each unit's activity the
 * sum of its neurons' in the profile (its mass column; "uniform": every
 * neuron 1), its bytes theirs, groups of QI_NEURON_GROUP_DEFAULT / unit
 * units; the budget "P%" of the FFN's bytes or BYTES (K, M, G). */
typedef struct {
    int n_layer, n_units, unit;
    uint8_t *fast;        /* [n_layer * n_units] 1: on the fast device (opts.neuron_fast) */
    double *activity;     /* [n_layer * n_units] per token (opts.neuron_activity) */
    int n_fast;           /* units on the fast device */
    uint64_t bytes, ffn_bytes; /* theirs, and the whole FFN's */
    double mass_fast, mass;    /* the activity they hold, and all of it */
    bool has_live;             /* the qinfer policy: its swap rule's options in live */
    qi_neuron_live_opts live;
    char policy[32];
} qi_neuron_split;
/* Errors: a bad budget or profile (QI_ERR_INVALID, QI_ERR_FORMAT naming
 * the file and line), a profile of another shape ("not its profile"), a
 * model without a gated FFN (QI_ERR_UNSUPPORTED), the policy's. *out
 * zeroed on failure (qi_neuron_split_fini). */
qi_status qi_neuron_split_make(const struct qi_model *m, const char *policy, const char *profile, const char *budget,
                               qi_neuron_split *out, qi_err *err);
void qi_neuron_split_fini(qi_neuron_split *s); /* zeroed; a zeroed one is a no-op */
/* A budget: "P%" (P from 0 to 100: *share = P / 100, *bytes untouched)
 * or BYTES, a whole number with K, M or G (powers of 1024) below 2^62
 * (*bytes; *share untouched). False for anything else. */
bool qi_neuron_parse_budget(const char *b, double *share, int64_t *bytes);

#endif

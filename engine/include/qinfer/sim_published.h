/* sim_published.h - published GPU measurements as workloads of the
 * simulated machine: read a table of them, say which profile, model shape
 * and workload each row stands for, simulate it, and fit the simulator's
 * GPU parameters to them (`qinfer calibrate --published`, `qinfer
 * sim-validate`; engine/backend/sim/README.md, "Against published
 * measurements").
 *
 * The table (tab-separated, '#' lines ignored, one header line starting
 * `use`): use, system, model, weights, hardware, test, value, unit,
 * settings, source. use is train (fit on it), input (a fact, not a
 * figure to predict), target (a paper's claim) or anything else (a row to
 * validate against). A row is simulated when its hardware, model, weights
 * and test are ones qi_pub_resolve knows; else it says why not.
 */
#ifndef QINFER_SIM_PUBLISHED_H
#define QINFER_SIM_PUBLISHED_H

#include <stdbool.h>

#include "qinfer/calibrate.h"
#include "qinfer/engine.h"
#include "qinfer/model.h"
#include "qinfer/params.h"
#include "qinfer/status.h"

typedef enum {
    QI_PUB_PP,  /* a prompt of n_tokens on one sequence: n_tokens / prefill time */
    QI_PUB_TG,  /* decode steps of one sequence at context ctx: 1 / step time */
    QI_PUB_GEN, /* batch prompts of n_tokens, then n_gen decode steps: batch x n_gen / total */
} qi_pub_kind;

typedef struct {
    int line; /* in the file */
    char use[16], system[48], model[64], weights[16], hardware[160], test[128], unit[16];
    char settings[320], source[320];
    double value;
    /* what qi_pub_resolve made of it */
    bool ok;                  /* simulated; else why */
    char why[160];
    const char *profile;      /* a profile's name (engine/backend/sim/profiles/NAME.profile) */
    const char *preset, *type; /* qinfer synth --preset and --type of its model's shapes */
    qi_pub_kind kind;
    int n_tokens, ctx, batch, n_gen;
    int ngl;                  /* the layers on the GPU (as --placement ngl=N); large: all */
    bool flash_attn;          /* -fa 1: flash attention, which the simulator does not model */
    /* FlexGen's policy (generation rows): GPU batch size and GPU batches
     * (the block schedule), the weights' and KV cache's shares on the GPU */
    int gpu_batch, n_gpu_batches;
    double w_gpu, c_gpu;
    bool offload;             /* the policy offloads: streamed layers, GPU batches (minutes to simulate) */
} qi_pub_row;

/* Read the table at path into *rows (qi_free it), n of them, each resolved.
 * Errors (QI_ERR_FORMAT, `FILE:LINE: why`): a line without the ten
 * columns, a value that is not a number where the row is not input or
 * target; QI_ERR_IO. */
qi_status qi_pub_load(const char *path, qi_pub_row **rows, int *n, qi_err *err);
/* Fill in the resolved fields of r from its text. */
void qi_pub_resolve(qi_pub_row *r);
/* The row's figure (tokens/s) on the engine options o (whose sim is the
 * profile's path, sim_cal and sim_params the parameters) over model m. */
qi_status qi_pub_simulate(const qi_pub_row *r, const qi_model *m, const qi_engine_opts *o, double *tok_s,
                          qi_err *err);

/* The fit of the GPU parameters to published rows. */
typedef struct {
    const qi_pub_row *const *rows; /* the rows fitted */
    int n;
    const qi_model *const *models;   /* rows[i]'s model */
    const char *const *profiles;     /* rows[i]'s profile path */
    const qi_engine_opts *base;      /* devices, threads; sim and placement are set per row */
} qi_pub_set;
/* Predict (qi_calib_predict_fn): seconds per token of every row of a
 * qi_pub_set at the given parameters (over the defaults). */
qi_status qi_pub_predict(void *set, const char *const *keys, const double *values, int n_keys, double *pred,
                         qi_err *err);

#endif

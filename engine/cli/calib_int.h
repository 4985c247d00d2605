/* calib_int.h - what `qinfer calibrate`'s files share (cmd_calibrate.c, the
 * measurement and the fit; calib_loo.c, the leave-one-out checks): a
 * workload point and the calibration's context. */
#ifndef QINFER_CALIB_INT_H
#define QINFER_CALIB_INT_H

#include <stdbool.h>

#include "qinfer/calibrate.h"

#define MAX_MODELS 16
#define MAX_GRID 16
#define MAX_KEYS 16
#define MAX_REPS 16

typedef struct {
    int model, batch, ctx;
    bool fit;
    int n_runs, n_steps;             /* n_steps: the prefill's (-1: runs differ, or too many) */
    double pp[MAX_REPS], dc[MAX_REPS]; /* measured, per run */
    double *step;                    /* [MAX_REPS][QI_CALIB_MAX_STEPS] the prefill's steps, per run */
    double meas[2], pred[2], def[2]; /* [0] prefill, [1] decode */
    long tokens;                     /* B x C */
    double others;                   /* the least share of the CPUs other processes used in a run */
    bool excluded;                   /* others above --max-others: neither fitted nor validated */
    bool in_fit;                     /* in the fit now: a fitted point, or every point outside a left-out group */
    double tmp[2], loo[2];           /* a prediction; the leave-one-out prediction */
    int group;                       /* the left-out group it is in (calib_loo) */
} point;

typedef struct {
    qi_model *m[MAX_MODELS];
    point *pts;
    int n_pts;
    const qi_engine_opts *base; /* the real engine's options */
    const char *sim;
    int n_decode;
    bool fit_only; /* predict the fitted points only */
    int pass;      /* which prediction slot to fill: 0 pred, 1 def, 2 tmp */
} cal_ctx;

/* The simulated times at the given parameters, two a point (prefill,
 * decode), of the points in the fit (fit_only) or all, in pred (NULL: into
 * each point's slot, c->pass). */
qi_status calib_predict(void *vctx, const char *const *keys, const double *values, int n_keys, double *pred,
                        qi_err *err);

/* Leave-one-shape-out and leave-one-weight-type-out: for each shape (model
 * dimensions) and each weight type, fit keys (starting from vals, the full
 * fit) to every point outside it and predict its points; prints the
 * tables of MAPE for prefill, decode (B = 1) and batched decode (B > 1).
 * names[i] is model i's name. */
qi_status calib_loo(cal_ctx *c, char (*names)[256], int n_models, const char *const *keys, const double *vals,
                    const double *lo, const double *hi, int n_keys, int max_evals, double max_others, qi_err *err);

/* --synth DIR: the models of a calibration over shapes, comma-separated
 * into out: the cached real ones (a missing one left out, said on stderr)
 * and synthetic ones written into DIR where not there yet (full: the
 * larger set). Errors: DIR or a model cannot be written. */
qi_status calib_synth_set(const char *dir, bool full, char *out, size_t cap, qi_err *err);

#endif

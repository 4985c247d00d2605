/* calibrate.h - fitting the simulated machine to the machine at hand
 * (`qinfer calibrate`, engine/backend/sim/README.md "Calibration").
 *
 * A workload point is B sequences with prompts of C tokens: its prefill
 * time is the engine's time from feeding the B prompts until every token
 * of them is consumed (all the steps that takes), its decode time one
 * step of the B sequences at context C (the median of n_decode steps).
 * The same function times a real engine and a simulated one (the options
 * say which), with qi_engine_now, so that a measured and a predicted time
 * mean the same thing. The fit moves named simulator parameters
 * (qi_sim_params_set's keys) to minimise the mean squared log error
 * between predicted and measured times.
 */
#ifndef QINFER_CALIBRATE_H
#define QINFER_CALIBRATE_H

#include "qinfer/engine.h"
#include "qinfer/model.h"
#include "qinfer/status.h"

#define QI_CALIB_MAX_STEPS 256

typedef struct {
    double prefill_s; /* B prompts of C tokens, all their steps */
    double decode_s;  /* one step of B sequences at context C: the median */
    /* the prefill's steps one by one (the first QI_CALIB_MAX_STEPS; their
     * number may be larger), so that runs can be compared step by step */
    int n_prefill_steps;
    double prefill_step_s[QI_CALIB_MAX_STEPS];
} qi_calib_time;

/* Time one point (batch B, context C) on an engine made with o over m
 * (o's max_seqs and n_ctx are set from B and C; the rest, devices,
 * placement, sim, threads, are o's). The prompts are fixed token ids, the
 * decode tokens too: the same work every time. n_decode >= 1 steps are
 * timed; *out gets their median. Errors: the engine's. */
qi_status qi_calib_measure(const qi_model *m, const qi_engine_opts *o, int batch, int ctx, int n_decode,
                           qi_calib_time *out, qi_err *err);

/* The times the simulator predicts at parameters p, n of them in pred, in
 * the order of the measured ones; called many times by the fit. */
typedef qi_status (*qi_calib_predict_fn)(void *ctx, const char *const *keys, const double *values, int n_keys,
                                         double *pred, qi_err *err);

typedef struct {
    int evals;          /* predictions made */
    double rms_log;     /* the objective at the fit: sqrt(mean (log pred - log meas)^2) */
    double mape;        /* mean |pred - meas| / meas at the fit, a fraction */
} qi_calib_fit_report;

/* Fit: values[n_keys] holds the starting point on entry and the fit on
 * return; each moves within [lo[i], hi[i]] (lo > 0). Nelder-Mead on the
 * logarithms of the values, restarted from its best point until a
 * restart no longer improves it, at most max_evals predictions. The
 * objective is the mean squared log error over the n measured times
 * (all > 0), plus a slight pull (1e-6 per squared unit of log) toward the start,
 * so a parameter the points do not determine stays where it began.
 * Errors: the predictor's; QI_ERR_INVALID for a bad argument. */
qi_status qi_calib_fit(const char *const *keys, double *values, const double *lo, const double *hi, int n_keys,
                       const double *measured, int n, qi_calib_predict_fn fn, void *ctx, int max_evals,
                       qi_calib_fit_report *rep, qi_err *err);

/* The parameters keys[i] = values[i] as the engine's sim_params (sp is
 * initialised first). Errors: qi_params_set's. */
qi_status qi_calib_params(qi_params *sp, const char *const *keys, const double *values, int n_keys, qi_err *err);

/* Mean absolute percentage error of pred against meas, as a fraction. */
double qi_calib_mape(const double *pred, const double *meas, int n);

#endif

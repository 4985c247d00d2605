/* calibrate.c - timing a workload point on an engine, real or simulated,
 * and fitting the simulator's parameters to measured times
 * (qinfer/calibrate.h; `qinfer calibrate`).
 *
 * One timing function serves both sides so that a predicted time is the
 * same quantity as a measured one: the engine's clock (qi_engine_now,
 * the host's or the simulated machine's) around the same calls.
 *
 * The fit is Nelder-Mead on the parameters' logarithms. Why not a
 * per-op-class least squares against --profile's per-kind times: the
 * simulator's classes (matmul, attention, other) are not the profile's
 * kinds (the KV writes are "other" to it), its cost is a max of two
 * terms per op plus a fixed cost, and what has to come out right is the
 * whole step; a derivative-free search over ~7 parameters, each
 * evaluation a simulated run of milliseconds, is simple and fits exactly
 * that. Logarithms because efficiencies and per-op costs are scale
 * parameters (a factor of two either way is the same distance), and the
 * error is measured on log time for the same reason: a 10% miss on a
 * 1 ms step counts as much as one on a 1 s step.
 */
#include "qinfer/calibrate.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qinfer/types.h"

/* ---- timing ------------------------------------------------------------------------- */

/* A fixed token id for sequence s, position i: spread over the vocabulary
 * away from the first ids, where the special tokens are. */
static int32_t token_at(int n_vocab, int s, int i) {
    const int lo = n_vocab > 2048 ? 1000 : 0, span = n_vocab - lo;
    return (int32_t)(lo + (int)(((uint64_t)(s + 1) * 7919u + (uint64_t)i * 104729u) % (uint64_t)span));
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

qi_status qi_calib_measure(const qi_model *m, const qi_engine_opts *o, int batch, int ctx, int n_decode,
                           qi_calib_time *out, qi_err *err) {
    if (batch < 1 || ctx < 1 || n_decode < 1)
        return QI_ERR(err, QI_ERR_INVALID, "calibrate: batch %d, context %d, %d decode steps", batch, ctx, n_decode);
    qi_engine_opts eo = *o;
    eo.max_seqs = batch;
    eo.n_ctx = ctx + n_decode + 1;
    qi_engine *e = NULL;
    int32_t *toks = qi_malloc(sizeof *toks * (size_t)ctx);
    double *dt = qi_malloc(sizeof *dt * (size_t)n_decode);
    int *ids = qi_malloc(sizeof *ids * (size_t)batch);
    qi_status st = !toks || !dt || !ids ? QI_ERR(err, QI_ERR_NOMEM, "out of memory") : qi_engine_create(m, &eo, &e, err);
    const int V = m->hp.n_vocab;
    for (int s = 0; !st && s < batch; s++) {
        for (int i = 0; i < ctx; i++) toks[i] = token_at(V, s, i);
        if (!(st = qi_engine_seq_add(e, &ids[s], err))) st = qi_engine_seq_feed(e, ids[s], toks, ctx, false, err);
    }
    if (!st) {
        /* prefill: every prompt consumed */
        const double t0 = qi_engine_now(e);
        double t = t0;
        int n = 1;
        out->n_prefill_steps = 0;
        while (!st && n > 0) {
            st = qi_engine_step(e, &n, err);
            const double t1 = qi_engine_now(e);
            if (n > 0 && out->n_prefill_steps < QI_CALIB_MAX_STEPS) out->prefill_step_s[out->n_prefill_steps] = t1 - t;
            if (n > 0) out->n_prefill_steps++;
            t = t1;
        }
        out->prefill_s = qi_engine_now(e) - t0;
    }
    for (int k = 0; !st && k < n_decode; k++) {
        for (int s = 0; !st && s < batch; s++) {
            const int32_t t = token_at(V, s, ctx + k);
            st = qi_engine_seq_feed(e, ids[s], &t, 1, false, err);
        }
        const double t0 = qi_engine_now(e);
        if (!st) st = qi_engine_step(e, NULL, err);
        dt[k] = qi_engine_now(e) - t0;
    }
    if (!st) {
        qsort(dt, (size_t)n_decode, sizeof *dt, cmp_double);
        out->decode_s = n_decode % 2 ? dt[n_decode / 2] : 0.5 * (dt[n_decode / 2 - 1] + dt[n_decode / 2]);
    }
    qi_engine_free(e);
    qi_free(toks);
    qi_free(dt);
    qi_free(ids);
    return st;
}

qi_status qi_calib_params(qi_params *sp, const char *const *keys, const double *values, int n_keys, qi_err *err) {
    qi_params_init(sp);
    for (int i = 0; i < n_keys; i++) {
        char v[40];
        snprintf(v, sizeof v, "%.17g", values[i]);
        qi_status st = qi_params_set(sp, keys[i], v, err);
        if (st) return st;
    }
    return QI_OK;
}

/* ---- the fit --------------------------------------------------------------------------- */

double qi_calib_mape(const double *pred, const double *meas, int n) {
    double s = 0;
    for (int i = 0; i < n; i++) s += fabs(pred[i] - meas[i]) / meas[i];
    return n > 0 ? s / n : 0;
}

#define PULL 1e-6
#define FIT_MAX_KEYS 32

typedef struct {
    const char *const *keys;
    const double *lo, *hi, *start_log, *measured;
    int n_keys, n, evals, max_evals;
    qi_calib_predict_fn fn;
    void *ctx;
    double *pred, *vals;
    qi_status st;
    qi_err *err;
} fit_state;

/* The objective at log-parameters x (clamped to the bounds): the mean
 * squared log error plus the pull toward the start. */
static double objective(fit_state *f, const double *x) {
    if (f->st) return INFINITY;
    double pull = 0;
    for (int i = 0; i < f->n_keys; i++) {
        double v = exp(x[i]);
        if (v < f->lo[i]) v = f->lo[i];
        if (v > f->hi[i]) v = f->hi[i];
        f->vals[i] = v;
        const double d = log(v) - f->start_log[i];
        pull += PULL * d * d;
    }
    f->evals++;
    if ((f->st = f->fn(f->ctx, f->keys, f->vals, f->n_keys, f->pred, f->err))) return INFINITY;
    double s = 0;
    for (int i = 0; i < f->n; i++) {
        if (!(f->pred[i] > 0)) return INFINITY;
        const double d = log(f->pred[i]) - log(f->measured[i]);
        s += d * d;
    }
    return s / f->n + pull;
}

/* One Nelder-Mead run from x (improved in place), simplex steps of `step`
 * in log units; returns the best objective. */
static double nelder_mead(fit_state *f, double *x, double step, double *fx_out) {
    const int N = f->n_keys;
    double p[FIT_MAX_KEYS + 1][FIT_MAX_KEYS], fv[FIT_MAX_KEYS + 1], c[FIT_MAX_KEYS], xr[FIT_MAX_KEYS],
        xe[FIT_MAX_KEYS];
    for (int i = 0; i <= N; i++) {
        memcpy(p[i], x, sizeof(double) * (size_t)N);
        if (i > 0) p[i][i - 1] += step;
        fv[i] = objective(f, p[i]);
    }
    for (int it = 0; f->evals < f->max_evals && !f->st; it++) {
        /* order: best first */
        for (int i = 1; i <= N; i++)
            for (int j = i; j > 0 && fv[j] < fv[j - 1]; j--) {
                double t = fv[j];
                fv[j] = fv[j - 1];
                fv[j - 1] = t;
                for (int k = 0; k < N; k++) {
                    t = p[j][k];
                    p[j][k] = p[j - 1][k];
                    p[j - 1][k] = t;
                }
            }
        double diam = 0;
        for (int i = 1; i <= N; i++)
            for (int k = 0; k < N; k++) diam = fmax(diam, fabs(p[i][k] - p[0][k]));
        if (fv[N] - fv[0] < 1e-14 * (1 + fabs(fv[0])) || diam < 1e-7) break;
        for (int k = 0; k < N; k++) {
            c[k] = 0;
            for (int i = 0; i < N; i++) c[k] += p[i][k] / N;
        }
        for (int k = 0; k < N; k++) xr[k] = c[k] + (c[k] - p[N][k]);
        const double fr = objective(f, xr);
        if (fr < fv[0]) {
            for (int k = 0; k < N; k++) xe[k] = c[k] + 2 * (c[k] - p[N][k]);
            const double fe = objective(f, xe);
            memcpy(p[N], fe < fr ? xe : xr, sizeof(double) * (size_t)N);
            fv[N] = fe < fr ? fe : fr;
        } else if (fr < fv[N - 1]) {
            memcpy(p[N], xr, sizeof(double) * (size_t)N);
            fv[N] = fr;
        } else {
            /* contract toward the better of the worst and its reflection */
            const bool outside = fr < fv[N];
            for (int k = 0; k < N; k++) xe[k] = c[k] + 0.5 * ((outside ? xr[k] : p[N][k]) - c[k]);
            const double fc = objective(f, xe);
            if (fc < (outside ? fr : fv[N])) {
                memcpy(p[N], xe, sizeof(double) * (size_t)N);
                fv[N] = fc;
            } else {
                for (int i = 1; i <= N; i++) {
                    for (int k = 0; k < N; k++) p[i][k] = p[0][k] + 0.5 * (p[i][k] - p[0][k]);
                    fv[i] = objective(f, p[i]);
                }
            }
        }
    }
    int b = 0;
    for (int i = 1; i <= N; i++)
        if (fv[i] < fv[b]) b = i;
    memcpy(x, p[b], sizeof(double) * (size_t)N);
    *fx_out = fv[b];
    return fv[b];
}

qi_status qi_calib_fit(const char *const *keys, double *values, const double *lo, const double *hi, int n_keys,
                       const double *measured, int n, qi_calib_predict_fn fn, void *ctx, int max_evals,
                       qi_calib_fit_report *rep, qi_err *err) {
    if (n_keys < 1 || n_keys > FIT_MAX_KEYS || n < 1 || !fn || max_evals < 1)
        return QI_ERR(err, QI_ERR_INVALID, "calibrate: fit of %d parameters to %d times", n_keys, n);
    for (int i = 0; i < n; i++)
        if (!(measured[i] > 0) || !isfinite(measured[i]))
            return QI_ERR(err, QI_ERR_INVALID, "calibrate: measured time %d is %g, not a positive number", i,
                          measured[i]);
    for (int i = 0; i < n_keys; i++)
        if (!(lo[i] > 0) || !(hi[i] >= lo[i]))
            return QI_ERR(err, QI_ERR_INVALID, "calibrate: %s: bounds [%g, %g]", keys[i], lo[i], hi[i]);
    double start_log[FIT_MAX_KEYS], x[FIT_MAX_KEYS], vals[FIT_MAX_KEYS];
    double *pred = qi_malloc(sizeof *pred * (size_t)n);
    if (!pred) return QI_ERR(err, QI_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n_keys; i++) {
        double v = values[i] < lo[i] ? lo[i] : values[i] > hi[i] ? hi[i] : values[i];
        start_log[i] = x[i] = log(v);
    }
    fit_state f = {.keys = keys, .lo = lo, .hi = hi, .start_log = start_log, .measured = measured,
                   .n_keys = n_keys, .n = n, .max_evals = max_evals, .fn = fn, .ctx = ctx, .pred = pred,
                   .vals = vals, .err = err};
    /* restarts with a shrinking simplex: Nelder-Mead stalls on a max()
     * kink, and a fresh simplex around its best point gets it moving */
    double best = INFINITY, fx;
    for (double step = 1.0; f.evals < max_evals && !f.st; step = step > 0.1 ? step * 0.5 : step) {
        nelder_mead(&f, x, step, &fx);
        const bool better = fx < best - 1e-12 * (1 + fabs(best));
        best = fx < best ? fx : best;
        if (!better && step <= 0.1) break;
    }
    qi_status st = f.st;
    if (!st) {
        /* the fit's values, clamped as the objective saw them, and its report */
        for (int i = 0; i < n_keys; i++) {
            double v = exp(x[i]);
            values[i] = v < lo[i] ? lo[i] : v > hi[i] ? hi[i] : v;
        }
        st = fn(ctx, keys, values, n_keys, pred, err);
        if (!st && rep) {
            double s = 0;
            for (int i = 0; i < n; i++) {
                const double d = log(pred[i]) - log(measured[i]);
                s += d * d;
            }
            rep->evals = f.evals + 1;
            rep->rms_log = sqrt(s / n);
            rep->mape = qi_calib_mape(pred, measured, n);
        }
    }
    qi_free(pred);
    return st;
}

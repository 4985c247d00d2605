/* threadpool.h - a persistent pool of worker threads for data-parallel ops.
 *
 * Workers are created once and sleep on a condition variable between jobs. A
 * job is fn(ctx, ith, nth) called once on each of nth threads (the caller is
 * thread 0); qi_pool_run returns when all have finished. Ops split their work
 * by output rows using ith/nth, so no task queue is needed.
 */
#ifndef QI_THREADPOOL_H
#define QI_THREADPOOL_H

#include "qinfer/status.h"

typedef struct qi_pool qi_pool;
typedef void (*qi_pool_fn)(void *ctx, int ith, int nth);

/* n_threads >= 1 (1 means no workers: jobs run on the caller). */
qi_status qi_pool_create(int n_threads, qi_pool **out, qi_err *err);
void qi_pool_free(qi_pool *p); /* NULL is a no-op */
int qi_pool_size(const qi_pool *p);
void qi_pool_run(qi_pool *p, qi_pool_fn fn, void *ctx);

/* Split [0, n) evenly: the range of thread ith of nth. */
static inline void qi_split(long n, int ith, int nth, long *lo, long *hi) {
    long per = (n + nth - 1) / nth;
    *lo = per * ith < n ? per * ith : n;
    *hi = *lo + per < n ? *lo + per : n;
}

/* Number of physical cores (best effort; >= 1). */
int qi_n_physical_cores(void);

#endif

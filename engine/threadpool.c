/* threadpool.c - persistent workers woken per job by a generation counter.
 *
 * Why not spawn threads per op: a decode step runs a few hundred small ops and
 * thread creation would dominate. Why a condition variable rather than
 * spinning: the engine shares 2-core machines with other work, where spinning
 * waiters steal the cycles the job needs. (A spin-then-sleep barrier is a later
 * optimisation and must be measured against this.)
 */
#include "threadpool.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

struct qi_pool {
    int n;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t wake, done;
    unsigned long gen; /* bumped per job */
    int pending;       /* workers still running the current job */
    int stop;
    qi_pool_fn fn;
    void *ctx;
};

typedef struct {
    qi_pool *p;
    int ith;
} worker_arg;

static void *worker(void *arg) {
    worker_arg *wa = arg;
    qi_pool *p = wa->p;
    int ith = wa->ith;
    qi_free(wa);
    unsigned long seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->stop && p->gen == seen) pthread_cond_wait(&p->wake, &p->mu);
        if (p->stop) break;
        seen = p->gen;
        qi_pool_fn fn = p->fn;
        void *ctx = p->ctx;
        pthread_mutex_unlock(&p->mu);
        fn(ctx, ith, p->n);
        pthread_mutex_lock(&p->mu);
        if (--p->pending == 0) pthread_cond_signal(&p->done);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

qi_status qi_pool_create(int n_threads, qi_pool **out, qi_err *err) {
    *out = NULL;
    if (n_threads < 1 || n_threads > 1024)
        return QI_ERR(err, QI_ERR_INVALID, "thread count %d out of range 1..1024", n_threads);
    qi_pool *p = qi_calloc(1, sizeof *p);
    if (!p) return QI_ERR(err, QI_ERR_NOMEM, "out of memory creating thread pool");
    p->n = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->wake, NULL);
    pthread_cond_init(&p->done, NULL);
    if (n_threads > 1) {
        p->threads = qi_calloc((size_t)n_threads - 1, sizeof *p->threads);
        if (!p->threads) {
            qi_pool_free(p);
            return QI_ERR(err, QI_ERR_NOMEM, "out of memory creating thread pool");
        }
    }
    for (int i = 1; i < n_threads; i++) {
        worker_arg *wa = qi_malloc(sizeof *wa);
        if (!wa || (wa->p = p, wa->ith = i, pthread_create(&p->threads[i - 1], NULL, worker, wa) != 0)) {
            qi_free(wa);
            p->n = i; /* only i-1 workers exist */
            qi_pool_free(p);
            return QI_ERR(err, QI_ERR_NOMEM, "cannot start worker thread %d", i);
        }
    }
    *out = p;
    return QI_OK;
}

void qi_pool_free(qi_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n; i++) pthread_join(p->threads[i - 1], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->wake);
    pthread_cond_destroy(&p->done);
    qi_free(p->threads);
    qi_free(p);
}

int qi_pool_size(const qi_pool *p) { return p ? p->n : 1; }

void qi_pool_run(qi_pool *p, qi_pool_fn fn, void *ctx) {
    if (!p || p->n == 1) {
        fn(ctx, 0, 1);
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->ctx = ctx;
    p->pending = p->n - 1;
    p->gen++;
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    fn(ctx, 0, p->n);
    pthread_mutex_lock(&p->mu);
    while (p->pending > 0) pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}

int qi_n_physical_cores(void) {
    /* Count distinct (physical id, core id) pairs in /proc/cpuinfo. */
    FILE *f = fopen("/proc/cpuinfo", "r");
    int n = 0;
    if (f) {
        char line[256];
        int phys = -1, seen_n = 0;
        int seen[1024][2];
        while (fgets(line, sizeof line, f)) {
            int v;
            if (sscanf(line, "physical id : %d", &v) == 1) phys = v;
            else if (sscanf(line, "core id : %d", &v) == 1) {
                int dup = 0;
                for (int i = 0; i < seen_n; i++)
                    if (seen[i][0] == phys && seen[i][1] == v) dup = 1;
                if (!dup && seen_n < 1024) {
                    seen[seen_n][0] = phys;
                    seen[seen_n][1] = v;
                    seen_n++;
                }
            }
        }
        fclose(f);
        n = seen_n;
    }
    if (n < 1) {
        long c = sysconf(_SC_NPROCESSORS_ONLN);
        n = c > 0 ? (int)c : 1;
    }
    return n;
}

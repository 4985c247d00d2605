/* threadpool.c - persistent workers woken per job by a generation counter.
 *
 * Why not spawn threads per op: a decode step runs a few hundred small ops and
 * thread creation would dominate. How a job is handed over: the caller
 * publishes (fn, ctx) and bumps an atomic generation counter; workers spin on
 * that counter for a while (QI_SPIN microseconds, default SPIN_US_DEFAULT,
 * on a pause instruction and the monotonic clock) and only then sleep on a
 * condition variable; the caller, done with its own share, likewise spins on
 * the count of pending workers before sleeping. A decode step's ops are tens
 * to a few hundred microseconds apart (the host's serial work between them:
 * a KV policy's moves, a batch's bookkeeping), so a worker usually finds the
 * next job while still spinning and no system call is made; a pool left
 * idle (between requests, or on a machine shared with other work) stops
 * spinning after a bounded time and costs nothing. The bound is time, not
 * a count of pauses: a pause takes 10 to 140 cycles depending on the core,
 * and a count tuned on one missed most gaps on another (measured: 1000
 * pauses, 27 us on the 2-core AMD EPYC test machine, left a batch-16 decode
 * step 20-30% slower than 250 us of spinning). Pure condition-variable
 * hand-off, the earlier design, paid two futex round trips per op.
 *
 * Sleeping is race-free by a Dekker-style pairing of sequentially consistent
 * atomics: a worker announces itself in n_sleeping before re-checking the
 * generation under the mutex, and the caller bumps the generation before
 * reading n_sleeping, so one of them always sees the other. The same pairing
 * guards the caller's wait for completion (caller_sleeping / pending).
 *
 * Pinning: with QI_PIN=1 worker i is bound to the i-th CPU the process may
 * run on (pthread_setaffinity_np), the caller to the first; a failure to pin
 * is ignored. It is off by default: on a machine shared with other jobs a
 * pinned thread cannot move away from a busy core.
 */
#define _GNU_SOURCE /* sched_getaffinity, pthread_setaffinity_np */
#include "threadpool.h"

#include <pthread.h>
#include <stdbool.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#else
#define CPU_RELAX() ((void)0)
#endif

/* Microseconds of spinning before sleeping; nanoseconds of it before the
 * spinning thread also yields (spun_out). */
#define SPIN_US_DEFAULT 250
#define SPIN_YIELD_NS 20000

struct qi_pool {
    int n;
    long spin_ns; /* spinning before sleeping */
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t wake, done;
    atomic_ulong gen;          /* bumped per job */
    atomic_int pending;        /* workers still running the current job */
    atomic_int n_sleeping;     /* workers asleep (or about to be) on wake */
    atomic_int caller_sleeping;
    atomic_int stop;
    qi_pool_fn fn;             /* published before gen is bumped */
    void *ctx;
    int pin;
};

typedef struct {
    qi_pool *p;
    int ith;
} worker_arg;

static long env_long(const char *name, long def, long lo, long hi) {
    const char *s = getenv(name);
    if (!s || !*s) return def;
    char *end;
    long v = strtol(s, &end, 10);
    return (*end || v < lo || v > hi) ? def : v;
}

/* Bind the calling thread to the ith CPU of the process's mask, if any. */
static void pin_self(int ith) {
#if defined(__linux__)
    cpu_set_t allowed, one;
    if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) return;
    int k = 0;
    for (int cpu = 0; cpu < CPU_SETSIZE; cpu++) {
        if (!CPU_ISSET(cpu, &allowed)) continue;
        if (k++ == ith) {
            CPU_ZERO(&one);
            CPU_SET(cpu, &one);
            pthread_setaffinity_np(pthread_self(), sizeof one, &one);
            return;
        }
    }
#else
    (void)ith;
#endif
}

static long long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

/* Whether a spin that began at *start (0: not yet, set now) has run out:
 * the clock is read once per 32 pauses (a read costs about one pause).
 * Past SPIN_YIELD_NS the spinning thread also yields its core at each
 * read, so that on a machine with more runnable threads than cores (tests
 * run side by side, other jobs) it gives way to them instead of burning
 * the rest of its spin; on an idle core the yield returns at once. */
static bool spun_out(const qi_pool *p, int i, long long *start) {
    if (i & 31) return false;
    const long long t = now_ns();
    if (!*start) *start = t;
    if (t - *start >= p->spin_ns) return true;
    if (t - *start >= SPIN_YIELD_NS) sched_yield();
    return false;
}

static void *worker(void *arg) {
    worker_arg *wa = arg;
    qi_pool *p = wa->p;
    int ith = wa->ith;
    qi_free(wa);
    if (p->pin) pin_self(ith);
    unsigned long seen = 0;
    for (;;) {
        unsigned long g = atomic_load(&p->gen);
        long long start = 0;
        for (int i = 0; g == seen && !spun_out(p, i, &start) && !atomic_load_explicit(&p->stop, memory_order_relaxed);
             i++) {
            CPU_RELAX();
            g = atomic_load(&p->gen);
        }
        if (g == seen) {
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->n_sleeping, 1);
            while (!atomic_load(&p->stop) && (g = atomic_load(&p->gen)) == seen) pthread_cond_wait(&p->wake, &p->mu);
            atomic_fetch_sub(&p->n_sleeping, 1);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load(&p->stop)) break;
        seen = g;
        p->fn(p->ctx, ith, p->n);
        if (atomic_fetch_sub(&p->pending, 1) == 1 && atomic_load(&p->caller_sleeping)) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->done);
            pthread_mutex_unlock(&p->mu);
        }
    }
    return NULL;
}

qi_status qi_pool_create(int n_threads, qi_pool **out, qi_err *err) {
    *out = NULL;
    if (n_threads < 1 || n_threads > 1024)
        return QI_ERR(err, QI_ERR_INVALID, "thread count %d out of range 1..1024", n_threads);
    qi_pool *p = qi_calloc(1, sizeof *p);
    if (!p) return QI_ERR(err, QI_ERR_NOMEM, "out of memory creating thread pool");
    p->n = n_threads;
    p->spin_ns = 1000 * env_long("QI_SPIN", SPIN_US_DEFAULT, 0, 10000000L); /* microseconds */
    p->pin = (int)env_long("QI_PIN", 0, 0, 1);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->wake, NULL);
    pthread_cond_init(&p->done, NULL);
    if (n_threads > 1) {
        p->threads = qi_calloc((size_t)n_threads - 1, sizeof *p->threads);
        if (!p->threads) {
            p->n = 1; /* no workers to stop */
            qi_pool_free(p);
            return QI_ERR(err, QI_ERR_NOMEM, "out of memory creating thread pool");
        }
    }
    for (int i = 1; i < n_threads; i++) {
        worker_arg *wa = qi_malloc(sizeof *wa);
        if (!wa || (wa->p = p, wa->ith = i, pthread_create(&p->threads[i - 1], NULL, worker, wa) != 0)) {
            const bool nomem = !wa;
            qi_free(wa);
            p->n = i; /* only i-1 workers exist */
            qi_pool_free(p);
            return nomem ? QI_ERR(err, QI_ERR_NOMEM, "out of memory starting worker thread %d", i)
                         : QI_ERR(err, QI_ERR_NOMEM, "cannot start worker thread %d (out of threads or memory)", i);
        }
    }
    if (p->pin && n_threads > 1) pin_self(0);
    *out = p;
    return QI_OK;
}

void qi_pool_free(qi_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, 1);
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
    p->fn = fn;
    p->ctx = ctx;
    atomic_store(&p->pending, p->n - 1);
    atomic_fetch_add(&p->gen, 1); /* publishes fn, ctx and pending */
    if (atomic_load(&p->n_sleeping) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->wake);
        pthread_mutex_unlock(&p->mu);
    }
    fn(ctx, 0, p->n);
    long long start = 0;
    for (int i = 0; atomic_load(&p->pending) > 0 && !spun_out(p, i, &start); i++) CPU_RELAX();
    if (atomic_load(&p->pending) > 0) {
        pthread_mutex_lock(&p->mu);
        atomic_store(&p->caller_sleeping, 1);
        while (atomic_load(&p->pending) > 0) pthread_cond_wait(&p->done, &p->mu);
        atomic_store(&p->caller_sleeping, 0);
        pthread_mutex_unlock(&p->mu);
    }
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

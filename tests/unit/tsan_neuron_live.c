/* tsan_neuron_live.c - the neuron swap worker (policies/neuron/live.c)
 * under ThreadSanitizer: no neuron is ever on neither device or on both.
 *
 * Built with -fsanitize=thread with the worker's sources (CMakeLists.txt,
 * CTest entry test_neuron_live_tsan; skipped, 77, where the compiler
 * cannot). Three layers of 96 neurons, 24 slots each; a stand-in fast
 * device (dev[layer][slot], the neuron whose weights the slot holds) that
 * the copy callback writes with plain stores, outside any lock, as a real
 * copy would. The main thread feeds windows whose hot neurons wander over
 * the slow side, so the worker keeps swapping; after every swap its hook
 * checks the layer's whole state under a read hold; meanwhile four reader
 * threads, as the engine's would, hold layers and check every view (each
 * neuron in exactly one place, and each filled slot's weights those of
 * the neuron it names). TSan reports any access to the slot table or the
 * weights that the holds do not order (it exits 66 then); the checks
 * report a neuron in two places or none. Exit 0 when both are clean, with
 * at least a few hundred swaps and many thousands of reads.
 *
 * Built again with QI_PLANT_FAULT (CTest entry
 * test_neuron_live_tsan_fault, expected to fail), its copy writes the
 * neighbouring slot, one readers may be using: the run must fail, which
 * shows that the checks and TSan see such a copy.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "neuron/neuron_live.h"

enum { L = 3, F = 96, SLOTS = 24, READERS = 4, WINDOWS = 400 };

static int32_t dev[L][SLOTS]; /* the stand-in fast device: plain memory, as device weights are */
static qi_neuron_live *lv;
static atomic_int bad, swaps_seen, stop_readers;
static atomic_long reads;

static int copy_fn(void *ctx, int layer, int neuron, int slot) {
    (void)ctx;
#ifdef QI_PLANT_FAULT
    slot = (slot + 1) % SLOTS;
#endif
    dev[layer][slot] = neuron;
    return 0;
}

/* Check a view, and that every filled slot holds its neuron's weights. */
static void check_view(const qi_neuron_live_view *v, int layer, const char *who) {
    qi_err e = {0};
    if (qi_neuron_live_view_check(v, layer, &e)) {
        fprintf(stderr, "%s: %s\n", who, e.msg);
        atomic_fetch_add(&bad, 1);
        return;
    }
    int on_fast = 0;
    for (int j = 0; j < v->n_ff; j++) on_fast += v->where[j] >= 0;
    int filled = 0;
    for (int s = 0; s < v->n_slots; s++) {
        if (v->slot[s] < 0) continue;
        filled++;
        if (dev[layer][s] != v->slot[s]) {
            fprintf(stderr, "%s: layer %d slot %d names neuron %d but holds %d's weights\n", who, layer, s, v->slot[s],
                    dev[layer][s]);
            atomic_fetch_add(&bad, 1);
        }
    }
    if (on_fast != filled) {
        fprintf(stderr, "%s: layer %d: %d neurons say fast, %d slots are filled\n", who, layer, on_fast, filled);
        atomic_fetch_add(&bad, 1);
    }
}

static void swap_fn(void *ctx, int layer, int in, int out, int slot) {
    (void)ctx, (void)in, (void)out, (void)slot;
    qi_neuron_live_view v;
    qi_neuron_live_begin(lv, layer, &v);
    check_view(&v, layer, "after a swap");
    qi_neuron_live_end(lv, layer);
    atomic_fetch_add(&swaps_seen, 1);
}

static void *reader(void *arg) {
    int layer = (int)(long)arg % L;
    while (!atomic_load(&stop_readers)) {
        qi_neuron_live_view v;
        qi_neuron_live_begin(lv, layer, &v);
        check_view(&v, layer, "reader");
        qi_neuron_live_end(lv, layer);
        atomic_fetch_add(&reads, 1);
        layer = (layer + 1) % L;
    }
    return NULL;
}

int main(void) {
    static uint8_t fast[L * F];
    static double act[L * F];
    static const uint64_t bytes[L] = {4096, 4096, 4096};
    for (int l = 0; l < L; l++)
        for (int j = 0; j < F; j++) {
            fast[l * F + j] = j < SLOTS;
            act[l * F + j] = j < SLOTS ? 1.0 : 0.5;
        }
    int k = 0;
    for (int l = 0; l < L; l++, k = 0)
        for (int j = 0; j < SLOTS; j++) dev[l][k++] = j; /* the placement's weights, in neuron order */
    qi_neuron_live_opts o;
    qi_neuron_live_opts_default(&o);
    o.ratio = 3.0;
    o.slow_s = 1e-3;
    o.decay = 0.5;
    o.max_swaps = 8;
    qi_err e = {0};
    if (qi_neuron_live_create(L, F, fast, act, bytes, &o, copy_fn, swap_fn, NULL, &lv, &e) ||
        qi_neuron_live_start(lv, &e)) {
        fprintf(stderr, "tsan_neuron_live: %s\n", e.msg);
        return 1;
    }
    pthread_t th[READERS];
    for (long r = 0; r < READERS; r++)
        if (pthread_create(&th[r], NULL, reader, (void *)r) != 0) {
            fprintf(stderr, "tsan_neuron_live: cannot start reader %ld\n", r);
            return 1;
        }
    /* windows: a block of 12 hot neurons that moves over the layer */
    double w[F];
    for (int t = 0; t < WINDOWS; t++) {
        for (int l = 0; l < L; l++) {
            const int at = (t * 7 + l * 31) % F;
            for (int j = 0; j < F; j++) w[j] = ((j - at + F) % F) < 12 ? 40.0 : 0.1;
            if (qi_neuron_live_feed(lv, l, w, 4, &e)) {
                fprintf(stderr, "tsan_neuron_live: %s\n", e.msg);
                return 1;
            }
        }
        if (t % 16 == 0) qi_neuron_live_sync(lv);
    }
    qi_neuron_live_sync(lv);
    qi_neuron_live_stop(lv);
    atomic_store(&stop_readers, 1);
    for (int r = 0; r < READERS; r++) pthread_join(th[r], NULL);
    qi_neuron_live_stats st;
    qi_neuron_live_stats_get(lv, &st);
    for (int l = 0; l < L; l++) {
        qi_neuron_live_view v;
        qi_neuron_live_begin(lv, l, &v);
        check_view(&v, l, "at the end");
        qi_neuron_live_end(lv, l);
    }
    qi_neuron_live_free(lv);
    printf("tsan_neuron_live: %ld rounds, %ld swaps (%d checked after the swap), %ld reads, %d bad\n", st.rounds,
           st.swaps, atomic_load(&swaps_seen), atomic_load(&reads), atomic_load(&bad));
    if (atomic_load(&bad)) return 1;
    if (st.swaps < 200 || atomic_load(&swaps_seen) != st.swaps || atomic_load(&reads) < 1000) {
        fprintf(stderr, "tsan_neuron_live: too little happened to show anything\n");
        return 1;
    }
    return 0;
}

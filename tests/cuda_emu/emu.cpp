/* emu.cpp - the host emulation's launches, barriers and warp shuffles
 * (inc/cuda_runtime.h). One OS thread per CUDA thread for a launch; each
 * runs every block in turn with a barrier between blocks, since the
 * blocks' __shared__ statics are reused. Threads of a block really run
 * concurrently, so a missing barrier can show as a wrong result (not
 * reliably: the host schedules them as it likes). */
#include <stdio.h>
#include <stdlib.h>

#include <vector>

#include "cuda_runtime.h"

thread_local emu_dim threadIdx, blockIdx;
emu_dim blockDim, gridDim;
int emu_err;
long emu_gemm_calls; /* inc/cublas_v2.h */

static pthread_barrier_t g_block_bar, g_next_bar, g_warp_bar[32];
static double g_warp_val[32][32];

void emu_sync(void) { pthread_barrier_wait(&g_block_bar); }

double emu_shfl_xor(double v, int lane_mask) {
    const int w = threadIdx.x / 32, l = threadIdx.x % 32;
    g_warp_val[w][l] = v;
    pthread_barrier_wait(&g_warp_bar[w]);
    const double r = g_warp_val[w][l ^ lane_mask];
    pthread_barrier_wait(&g_warp_bar[w]);
    return r;
}

struct emu_thread {
    unsigned tid, grid;
    std::function<void()> *fn;
};

static void *run_thread(void *p) {
    const emu_thread *a = (const emu_thread *)p;
    threadIdx = {a->tid, 0, 0};
    for (unsigned b = 0; b < a->grid; b++) {
        blockIdx = {b, 0, 0};
        (*a->fn)();
        pthread_barrier_wait(&g_next_bar);
    }
    return NULL;
}

void emu_launch(unsigned grid, unsigned block, cudaStream_t stream, std::function<void()> fn) {
    (void)stream;
    if (grid == 0 || block == 0 || block > 1024 || block % 32) {
        fprintf(stderr, "emu: invalid launch %u blocks of %u threads\n", grid, block);
        emu_err = cudaErrorInvalidConfiguration;
        return;
    }
    gridDim = {grid, 1, 1};
    blockDim = {block, 1, 1};
    pthread_barrier_init(&g_block_bar, NULL, block);
    pthread_barrier_init(&g_next_bar, NULL, block);
    for (unsigned w = 0; w < block / 32; w++) pthread_barrier_init(&g_warp_bar[w], NULL, 32);
    std::vector<pthread_t> th(block);
    std::vector<emu_thread> arg(block);
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setstacksize(&at, 256 * 1024);
    for (unsigned t = 0; t < block; t++) {
        arg[t] = {t, grid, &fn};
        if (pthread_create(&th[t], &at, run_thread, &arg[t]) != 0) {
            fprintf(stderr, "emu: pthread_create failed\n");
            exit(2);
        }
    }
    for (unsigned t = 0; t < block; t++) pthread_join(th[t], NULL);
    pthread_attr_destroy(&at);
    pthread_barrier_destroy(&g_block_bar);
    pthread_barrier_destroy(&g_next_bar);
    for (unsigned w = 0; w < block / 32; w++) pthread_barrier_destroy(&g_warp_bar[w]);
}

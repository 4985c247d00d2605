/* cuda_fake.h - a stand-in CUDA runtime (engine/backend/cuda/cuda_rt.h)
 * for machines without a GPU: "device" memory from the heap, copies done at
 * once, a clock that advances a millisecond per copy or kernel, kernels
 * that run a CPU device's ops on what they are given after checking that
 * every address they receive (and every address in their tables) lies in
 * a live device allocation, and chosen calls failed on purpose. Used by
 * test_cuda_host.c and by tests/gpu/gpucheck.c --fake (which checks the
 * program, not a GPU). */
#ifndef QI_CUDA_FAKE_H
#define QI_CUDA_FAKE_H

#include <stdbool.h>
#include <stddef.h>

#include "backend.h"
#include "cuda/cuda_rt.h"

#define QI_FAKE_MAX_ALLOCS 4096
#define QI_FAKE_MAX_STREAMS 8

typedef struct {
    qi_backend *cpu;      /* whose ops the kernels run */
    void *dev[QI_FAKE_MAX_ALLOCS]; /* live device allocations */
    size_t dev_n[QI_FAKE_MAX_ALLOCS];
    int n_dev;
    long host_live, events_live, streams_live, blas_live;
    double clock_ms;      /* advances 1 ms per copy or kernel */
    long calls;           /* runtime entries and kernels called */
    const char *fail_name; /* the entry or kernel to fail ... */
    long fail_in;          /* ... at its fail_in-th call from now (0: none) */
    int fail_code;
    long stream_syncs;
    int stream_ids[QI_FAKE_MAX_STREAMS]; /* stream k (from 1) is &stream_ids[k - 1], in creation order */
    int n_streams;
    long copies_on[QI_FAKE_MAX_STREAMS]; /* copies queued on stream k at [k - 1] */
    long waits_on[QI_FAKE_MAX_STREAMS];  /* cudaStreamWaitEvent on stream k at [k - 1] */
    long bad_pointers; /* kernel arguments outside the device's memory */
    size_t total;      /* the GPU's memory */
} qi_fake_cuda;

extern qi_fake_cuda qi_fake;
extern const qi_cuda_rt qi_fake_cuda_rt;

/* Reset the stand-in, its kernels running on cpu (reserved by the caller),
 * with total bytes of "GPU" memory. */
void qi_fake_cuda_reset(qi_backend *cpu, size_t total);
/* A stream's number (1 the first made since the reset), 0 for NULL. */
int qi_fake_stream_no(const void *s);
/* The n-th call from now of entry or kernel `name` fails with code. */
void qi_fake_cuda_fail_next(const char *name, long n, int code);

#endif

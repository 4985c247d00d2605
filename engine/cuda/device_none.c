/* device_none.c - CUDA discovery in a build without CUDA: says so. */
#include <stdio.h>

#include "device.h"

void qi_cuda_query(qi_sysinfo *s) {
    s->cuda_built = false;
    s->n_gpus = 0;
    snprintf(s->gpu_note, sizeof s->gpu_note, "this build has no CUDA support");
}

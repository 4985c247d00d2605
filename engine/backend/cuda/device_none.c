/* device_none.c - CUDA discovery and probe in a build without CUDA: both
 * say so. */
#include <stdio.h>
#include <string.h>

#include "device.h"

void qi_cuda_query(qi_sysinfo *s) {
    s->cuda_built = false;
    s->n_gpus = 0;
    snprintf(s->gpu_note, sizeof s->gpu_note, "this build has no CUDA support");
}

qi_status qi_cuda_probe(qi_cuda_bw *out, qi_err *err) {
    memset(out, 0, sizeof *out);
    return QI_ERR(err, QI_ERR_UNSUPPORTED, "built without CUDA");
}

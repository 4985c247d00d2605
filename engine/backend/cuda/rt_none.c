/* rt_none.c - a build without CUDA has no runtime: the CUDA device says so
 * when asked for (tests bring a runtime of their own, qi_cuda_use_rt). */
#include "cuda/cuda_rt.h"

const qi_cuda_rt *qi_cuda_rt_default(void) { return NULL; }

/* sim_stream.h - the simulated GPU's copy stream (sim_stream.c) and what
 * it takes of the simulated devices (backend_sim.c). */
#ifndef QI_SIM_STREAM_H
#define QI_SIM_STREAM_H

#include "backend.h"

/* A simulated device's clocks and copy counters: the host's, its main
 * stream's (the host's on the CPU) and its copy stream's (the main one's
 * on the CPU, which has one stream). */
typedef struct {
    bool gpu;
    double *host, *main, *copy;
    double *busy_copies;
    long *copies, *n_copies;
} sim_clocks;

/* backend_sim.c */
sim_clocks sim_clocks_of(qi_backend *b);
double sim_copy_cost(qi_backend *b, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                     size_t height);

/* sim_stream.c: the backend's cs_* */
void sim_cs_copy(qi_backend *b, void *dst, const void *src, size_t n);
void sim_cs_copy_2d(qi_backend *b, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                    size_t height);
void sim_cs_mark(qi_backend *b, qi_event *ev);
void sim_cs_wait(qi_backend *b, qi_event *ev);

#endif

/* sim_cpu.h - the simulated host CPU's machine model for matmuls
 * (sim_cpu.c; sim/README.md, "The CPU's machine model"): a weight's bytes
 * from the last-level cache or DRAM by the working set of the weights the
 * CPU computes with, a compute rate per weight type from its format's
 * unpacking work, their overlap and a fixed cost per op. Used by
 * backend_sim.c for the CPU device's matmuls while qi_sim_cpu_on. */
#ifndef QINFER_SIM_CPU_H
#define QINFER_SIM_CPU_H

#include <stdbool.h>
#include <stdint.h>

#include "backend.h"

#define QI_SIM_CPU_WS_SLOTS 8192

/* The weights the CPU has computed with, by their rows' address, and
 * their bytes: the working set a step streams (a decode step reads every
 * weight once, so it is the model's weights on the CPU). */
typedef struct {
    const void *seen[QI_SIM_CPU_WS_SLOTS];
    double bytes;
    long n;
} qi_sim_cpu_ws;

/* The machine model is on (a calibration set cpu_dram_memory). */
bool qi_sim_cpu_on(const qi_sim_params *p);

/* Dequantisation work of a weight type's format, in bit-field extractions
 * per weight beyond an 8-bit lane (sim_cpu.c gives each its reason); a
 * float type's conversion to fp32 for f16 and bf16, 0 for f32 and q8_0;
 * -1 for a type the CPU does not compute with. */
double qi_sim_cpu_unpack_ops(uint32_t type);

/* The engine's kernels take their tiled path for weights of type over T
 * tokens (q4_K and q6_K from QI_K_WIDE_MIN tokens). */
bool qi_sim_cpu_tiled(uint32_t type, int T);

/* The tile products a token's dot over one block of a tiled-path type
 * takes (q4_K 2, q6_K 3: its scales split into digits that keep every tile
 * byte within int8; 1 for the others). */
double qi_sim_cpu_tile_parts(uint32_t type);

/* The share of the profile's compute rates a run of p->cpu_threads threads
 * reaches: min(threads, cpu.cores) / cpu.cores (1 where either is 0, or
 * the machine model is off). */
double qi_sim_cpu_thread_share(const qi_hwprofile *pr, const qi_sim_params *p);

/* The share of the profile's read rates it reaches: min(1, threads x
 * cpu_thread_memory) (1 where either is 0, or the model is off). */
double qi_sim_cpu_thread_mem(const qi_sim_params *p);

/* Seconds of one CPU matmul launch over n weights (one matmul_n) of T
 * tokens on profile pr with parameters p, its fixed cost included (no
 * noise); ws gets the weights added first. */
double qi_sim_cpu_matmul_s(qi_sim_cpu_ws *ws, const qi_hwprofile *pr, const qi_sim_params *p,
                           const qi_weight *const *w, int n, int T);

#endif

/* flexgen.h - the cost model of the flexgen placement policy (flexgen.c) on
 * plain numbers, so that it can be solved and checked without a model file
 * or a hardware profile on disk.
 *
 * The model is FlexGen's (Sheng et al., ICML 2023) with its disk tier
 * removed: per layer, a prefill and a decode step each take the longest of
 * their compute and the host-device transfers that overlap it; the policy
 * variables are the shares of the weights (wg, wc), the KV cache (cg, cc)
 * and the activations (hg, hc) held on the GPU and on the CPU, each pair
 * summing to 1; peak memory per tier bounds them. For a GPU batch size gbs
 * and a number of GPU batches num_gb (a block of gbs x num_gb sequences)
 * the fractions come from a linear program; the outer search keeps the
 * (gbs, num_gb) of the highest throughput. The terms and the search are
 * written out in policies/placement/README.md.
 *
 * Only built with GLPK (QI_HAVE_GLPK).
 */
#ifndef QI_PLACEMENT_FLEXGEN_H
#define QI_PLACEMENT_FLEXGEN_H

#include <stdbool.h>

#include "qinfer/status.h"

typedef struct {
    /* the model: one layer (attention and MLP) */
    int n_layer;           /* L */
    double layer_bytes;    /* weight bytes of one layer as uploaded */
    double layer_flops;    /* FLOPs of one layer's matmuls per token (2 x their elements) */
    int n_embd;            /* E: the hidden state's width */
    int q_width;           /* H x D: the queries' width */
    int kv_width;          /* Hkv x D: the keys' (and values') width */
    int n_ff;              /* the MLP's inner width */
    int n_head;            /* H */
    /* the workload */
    int prompt_len;        /* s */
    int gen_len;           /* n: tokens generated per sequence (>= 1) */
    int kv_tokens;         /* KV tokens kept per sequence (s + n, or the budget) */
    int batch;             /* sequences at once: the block never holds more */
    /* the hardware: peaks in SI units, and the share of each reached */
    double gpu_flops, gpu_bw, gpu_mem; /* FLOP/s, bytes/s, bytes */
    double cpu_flops, cpu_bw, cpu_mem;
    double h2d_bw, d2h_bw;             /* the link, bytes/s each way */
    double eff_gpu, eff_cpu, eff_link; /* in (0, 1] */
    /* the outer search */
    int gbs_max, num_gb_max;
    /* the plan runs the block schedule (flexgen block=1): each GPU batch
     * reads the layer's weights from GPU memory again in decode; without
     * it the engine runs the whole batch as one, reading them once */
    bool blocked;
} qi_flexgen_inputs;

typedef struct {
    int gbs, num_gb;        /* the GPU batch size and the number of GPU batches */
    double wg, wc, cg, cc, hg, hc;
    double t_pre, t_gen;    /* seconds per layer: a prefill, one decode step (of the block) */
    double total_s;         /* the LP's objective: L t_pre + L (n - 1) t_gen */
    double tokens_per_s;    /* gbs num_gb n / total_s */
    int n_lp;               /* linear programs solved (the outer search) */
} qi_flexgen_solution;

/* The fractions that minimise the block's time for this (gbs, num_gb), in
 * *out (its gbs, num_gb, fractions, times, throughput; n_lp 1). Returns
 * QI_OK, or QI_ERR_NOMEM when no fractions fit the memory (a result, not a
 * failure of the solver: *out is cleared), QI_ERR_INVALID for inputs that
 * are not positive finite numbers, QI_ERR_BACKEND when GLPK fails. Every
 * message names "flexgen". */
qi_status qi_flexgen_solve_lp(const qi_flexgen_inputs *in, int gbs, int num_gb, qi_flexgen_solution *out,
                              qi_err *err);

/* FlexGen's outer search: gbs over 1, 2, 3, 4, 8, 16, ... up to
 * min(gbs_max, batch), and for each num_gb from 1 while gbs x num_gb stays
 * within the batch and num_gb_max, until the memory no longer fits; the
 * best throughput wins (the first found on a tie). QI_ERR_NOMEM when not
 * even one sequence fits; other errors as qi_flexgen_solve_lp's. */
qi_status qi_flexgen_solve(const qi_flexgen_inputs *in, qi_flexgen_solution *out, qi_err *err);

#endif

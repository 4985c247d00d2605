/* sparq_int.h - SparQ's approximate attention weights (Ribar et al., ICML
 * 2024), shared by the policies that score tokens from a few components of
 * their keys: sparq's pick() over the working tier and qinfer's fetch()
 * over the offload tier (private to policies/kv/).
 */
#ifndef QI_KV_SPARQ_INT_H
#define QI_KV_SPARQ_INT_H

#include <stdbool.h>
#include <stddef.h>

#include "kv/kv_policy.h"

/* The scratch the weights are computed in, grown on use. */
typedef struct {
    float *buf;
    size_t cap;
} qi_kv_sparq_buf;

void qi_kv_sparq_buf_free(qi_kv_sparq_buf *b);

/* The approximate attention weights of v's n tokens (v->n >= 1; v->k_cols,
 * k_shift, q, group, D and scale read): the r = round(dims x D) components
 * (at least 1) with the largest |q_d| summed over the group; each head's
 * scores over those components, with its query in fp16 and SparQ's
 * temperature scale x sqrt(|q_h|_1 / |q_h on them|_1); each head's softmax
 * over the n tokens. Returns their sum over the group ([n], in b), or NULL
 * if b could not grow (or D is over the attention call's 1024). With
 * heads != NULL each head's own weights are kept as well: head h's at
 * *heads + h x *head_stride. */
const float *qi_kv_sparq_weights(qi_kv_sparq_buf *b, const qi_kv_pick_view *v, double dims, const float **heads,
                                 size_t *head_stride);

#endif

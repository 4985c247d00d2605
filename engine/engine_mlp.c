/* engine_mlp.c - the MLP block of a layer, chosen once per layer: the
 * neuron split (engine_neuron.c), the sparse paths (engine_sparsity.c),
 * the gate-free FFN of OPT and Falcon, or the dense gated FFN; and the
 * what-if of a simulated machine whose CPU reads a share of the neurons. */
#include "engine_int.h"

/* opts.ffn_observe: layer l's FFN activations, [rows][n_ff] on b (a
 * host-visible device: eng_check_observe), handed to the observer once b's
 * queued work has run. */
qi_status eng_observe_ffn(qi_engine *e, qi_backend *b, int l, const float *act, int rows, qi_err *err) {
    qi_status st;
    if ((st = qi_dev_synchronize(b, err))) return st;
    e->o.ffn_observe(e->o.ffn_observe_ctx, l, act, rows, e->m->hp.n_ff);
    return QI_OK;
}

/* The MLP block of a gate-free FFN (opt, falcon): x += down(act(up(norm(x)))),
 * with the matmuls' biases where the model has them. In a parallel layer
 * (falcon) the MLP's input and output go through the gate's rows (unused
 * without a gate, and at least n_embd wide: model.c checks n_ff), since xn
 * holds the attention's output on its device; that output, copied over
 * when the attention ran on another device, is added to x after the MLP's. */
static qi_status mlp_gate_free(qi_engine *e, int l, int rows, qi_err *err) {
    const qi_hparams *hp = &e->m->hp;
    const int a = e->plan.layers[l].attn_dev, f = e->plan.layers[l].mlp_dev;
    const dev_state *M = &e->dev[f];
    qi_backend *b = M->be;
    const qi_layer *ly = &M->layers[l];
    const int E = hp->n_embd;
    float *h = hp->parallel ? M->gate : M->xn;
    qi_status st;
    if ((st = eng_norm_rows(b, hp, M->x, &ly->ffn_norm, &ly->ffn_norm_b, rows, E, h, err))) return st;
    if ((st = eng_matmul(e, b, &ly->w_up, h, rows, M->up, err))) return st;
    if ((st = eng_add_bias(b, &ly->b_up, M->up, rows, err))) return st;
    if ((st = qi_backend_act(b, hp->ffn_act == QI_FFN_GELU, M->up, rows, hp->n_ff, err))) return st;
    if (e->o.ffn_observe && (st = eng_observe_ffn(e, b, l, M->up, rows, err))) return st;
    if ((st = eng_matmul(e, b, &ly->w_down, M->up, rows, h, err))) return st;
    if ((st = eng_add_bias(b, &ly->b_down, h, rows, err))) return st;
    if ((st = qi_backend_add(b, M->x, h, (long)rows * E, err))) return st;
    if (!hp->parallel) return QI_OK;
    if (a != f) {
        const dev_state *A = &e->dev[a];
        xfer x;
        if ((st = eng_xfer_begin(e, &x, M->be, A->be, err)) ||
            (st = eng_xfer_copy(e, &x, act_view(M, M->xn), act_view(A, A->xn), sizeof(float) * (size_t)rows * E, err)) ||
            (st = eng_xfer_end(e, &x, false, err)))
            return st;
    }
    return qi_backend_add(b, M->x, M->xn, (long)rows * E, err);
}

/* One side of a split FFN on device D, from its normed input in D->xn:
 * D->xn = down_s . glu(gate_s xn, up_s xn) over its n neurons. */
qi_status eng_ffn_side(qi_engine *e, const dev_state *D, const qi_weight *w, int n, int rows, bool gelu,
                       qi_err *err) {
    qi_status st;
    const qi_weight *gu[2] = {&w[0], &w[1]};
    float *const gu_out[2] = {D->gate, D->up};
    if ((st = eng_matmul_n(e, D->be, gu, gu_out, 2, D->xn, rows, err))) return st;
    if ((st = qi_backend_glu(D->be, gelu, D->gate, D->up, rows, n, err))) return st;
    return eng_matmul(e, D->be, &w[2], D->gate, rows, D->xn, err);
}

/* Neurons the CPU computes on a simulated machine with a what-if density
 * (opts.sim_cold_density): gate whole, then up's rows and down's columns
 * of that share of the n neurons alone (rounded up to whole blocks of
 * down's type: views of the weights with fewer rows or columns, which is
 * all the simulator reads of them), the bytes and FLOPs cats reads when
 * that share is active. Nothing is computed. */
qi_status eng_ffn_sim_sparse(qi_engine *e, const dev_state *M, const qi_weight *gate, const qi_weight *up_w,
                             const qi_weight *down_w, int n, int rows, bool gelu, qi_err *err) {
    qi_status st;
    const int unit = (int)qi_type_get(down_w->type)->blck;
    int k = (int)ceil(e->o.sim_cold_density * n / unit) * unit;
    k = k > n ? n : k < unit ? unit : k;
    qi_weight up = *up_w, down = *down_w;
    up.n_rows = k;
    down.n_cols = k;
    if (!qi_type_row_bytes(down.type, (uint64_t)k, &down.row_bytes))
        return QI_ERR(err, QI_ERR_INVALID, "%d neurons are not whole blocks of down's type", k);
    if ((st = eng_matmul(e, M->be, gate, M->xn, rows, M->gate, err))) return st;
    if ((st = eng_matmul(e, M->be, &up, M->xn, rows, M->up, err))) return st;
    if ((st = qi_backend_glu(M->be, gelu, M->gate, M->up, rows, k, err))) return st;
    return eng_matmul(e, M->be, &down, M->gate, rows, M->xn, err);
}

/* The MLP block of layer l on its device: x += down(glu(gate(norm(x)), up(norm(x)))). */
qi_status eng_mlp_block(qi_engine *e, int l, int rows, qi_err *err) {
    qi_status st;
    const qi_hparams *hp = &e->m->hp;
    const dev_state *M = &e->dev[e->plan.layers[l].mlp_dev];
    qi_backend *b = M->be;
    const qi_layer *ly = &M->layers[l];
    const int E = hp->n_embd;
    if (qi_ffn_gate_free(hp->ffn_act)) return mlp_gate_free(e, l, rows, err);
    if (e->ns && e->ns->split[l].n[1]) return eng_mlp_split(e, l, rows, err);
    if ((st = qi_backend_rmsnorm(b, M->x, ly->ffn_norm.data, rows, E, hp->rms_eps, M->xn, err))) return st;
    if (e->act || (e->o.sim_cold_density > 0.0 && M == &e->dev[0])) { /* the simulated activity, or the what-if */
        const bool gelu = hp->ffn_act == QI_FFN_GEGLU_TANH;
        if ((st = e->act ? eng_activity_whole(e, M, l, rows, gelu, err)
                         : eng_ffn_sim_sparse(e, M, &ly->w_gate, &ly->w_up, &ly->w_down, hp->n_ff, rows, gelu, err)))
            return st;
        if (ly->ffn_post_norm.data && (st = qi_backend_rmsnorm(b, M->xn, ly->ffn_post_norm.data, rows, E, hp->rms_eps, M->xn, err)))
            return st;
        return qi_backend_add(b, M->x, M->xn, (long)rows * E, err);
    }
    const qi_weight *gu[2] = {&ly->w_gate, &ly->w_up};
    float *const gu_out[2] = {M->gate, M->up};
    if (eng_sp_path(e)) return eng_mlp_sparse(e, l, rows, err);
    if ((st = eng_matmul_n(e, b, gu, gu_out, 2, M->xn, rows, err))) return st;
    if ((st = qi_backend_glu(b, hp->ffn_act == QI_FFN_GEGLU_TANH, M->gate, M->up, rows, hp->n_ff, err))) return st;
    if (e->o.ffn_observe && (st = eng_observe_ffn(e, b, l, M->gate, rows, err))) return st;
    if (e->ns && e->ns->rp && M == &e->dev[0]) { /* a layer not split: nothing on the fast side */
        e->ns->rp[l].tokens += rows;
        eng_count_active(e, l, M->gate, rows, hp->n_ff, false);
    }
    if ((st = eng_matmul(e, b, &ly->w_down, M->gate, rows, M->xn, err))) return st;
    if (ly->ffn_post_norm.data &&
        (st = qi_backend_rmsnorm(b, M->xn, ly->ffn_post_norm.data, rows, E, hp->rms_eps, M->xn, err)))
        return st;
    return qi_backend_add(b, M->x, M->xn, (long)rows * E, err);
}

/* engine_checks.c - which options, plans and devices go together: every
 * rule that refuses a combination, at creation and at a new plan, in one
 * place, each with the line that says why. */
#include "engine_int.h"

/* A layer the KV policy budgets: not a sliding-window layer of Gemma 3
 * (its ring is its budget), not one the policy exempts. */
static bool budgeted_layer(const qi_engine *e, int l) {
    return !(e->m->hp.n_swa > 0 && e->m->layers[l].swa) && !qi_kv_policy_exempt(e->pol, l);
}

/* A layer the KV policy decides (evicts on) after attention; it may not be
 * split. */
bool eng_policy_layer(const qi_engine *e, int l) { return budgeted_layer(e, l) && !e->picks; }

/* A layer whose decode attention reads the blocks the policy picks
 * (Quest), from key bounds the host computes over the working rows. */
bool eng_pick_layer(const qi_engine *e, int l) { return budgeted_layer(e, l) && e->picks; }

/* A layer whose decode attention also reads the offloaded tokens the
 * policy fetches, scored on the host from the offload tier's key columns. */
bool eng_fetch_layer(const qi_engine *e, int l) { return eng_policy_layer(e, l) && e->fetches; }

qi_status eng_check_splits(const qi_engine *e, const qi_plan *p, qi_err *err) {
    for (int l = 0; l < p->n_layer; l++)
        if (p->layers[l].split > 0.0f && eng_policy_layer(e, l))
            return QI_ERR(err, QI_ERR_UNSUPPORTED,
                          "plan layer %d: KV policy '%s' evicts on this layer, whose attention is split (a split "
                          "layer keeps every token for now)",
                          l, e->o.kv_policy);
    return QI_OK;
}

/* A picking policy's layers (Quest) attend on a host-visible device that
 * computes, the CPU, and are not split: the host keeps the key bounds from
 * the working rows and reads the queries. Other devices (testdev, cuda,
 * simulated ones) would need the bounds kept on the device, which none
 * does yet: refused at creation (and at a new plan) rather than run wrong.
 * p's devices are open. */
qi_status eng_check_picks(const qi_engine *e, const qi_plan *p, qi_err *err) {
    for (int l = 0; l < p->n_layer; l++) {
        if (eng_fetch_layer(e, l) && (e->o.sim || !qi_dev_info_get(e->dev[p->layers[l].attn_dev].be)->host_visible))
            return QI_ERR(err, QI_ERR_UNSUPPORTED,
                          "plan layer %d: KV policy '%s' fetches offloaded tokens for attention, scoring them on "
                          "the host, and this layer's attention runs on %s (implemented for the CPU only): place "
                          "the attention of every layer on the CPU, or leave fetch= out",
                          l, e->o.kv_policy, e->o.sim ? "a simulated machine" : p->devices[p->layers[l].attn_dev]);
        if (!eng_pick_layer(e, l)) continue;
        if (e->o.sim)
            return QI_ERR(err, QI_ERR_UNSUPPORTED,
                          "KV policy '%s' picks %s by their keys, and a simulated machine (%s) computes none",
                          e->o.kv_policy, e->pick_tokens ? "tokens" : "blocks", e->o.sim);
        if (p->layers[l].split > 0.0f)
            return QI_ERR(err, QI_ERR_UNSUPPORTED,
                          "plan layer %d: KV policy '%s' picks what attention reads, and this layer's "
                          "attention is split across two devices (not supported)",
                          l, e->o.kv_policy);
        if (!qi_dev_info_get(e->dev[p->layers[l].attn_dev].be)->host_visible)
            return QI_ERR(err, QI_ERR_UNSUPPORTED,
                          "plan layer %d: KV policy '%s' %s on the host and picks %s there; "
                          "this layer's attention runs on %s, which the host cannot read (implemented for the "
                          "CPU only): place the attention of every layer on the CPU",
                          l, e->o.kv_policy, e->pick_tokens ? "reads the keys" : "keeps its key bounds",
                          e->pick_tokens ? "tokens" : "blocks", p->devices[p->layers[l].attn_dev]);
    }
    return QI_OK;
}

/* opts.ffn_observe reads the activations on the host: every MLP of plan p
 * on a host-visible device, and real arithmetic (no simulated machine). */
qi_status eng_check_observe(const qi_engine *e, const qi_plan *p, qi_err *err) {
    if (!e->o.ffn_observe) return QI_OK;
    if (e->o.sim)
        return QI_ERR(err, QI_ERR_UNSUPPORTED, "the FFN observer needs real activations; a simulated machine (%s) "
                      "computes none", e->o.sim);
    for (int l = 0; l < p->n_layer; l++) {
        const int f = p->layers[l].mlp_dev;
        if (!qi_dev_info_get(e->dev[f].be)->host_visible)
            return QI_ERR(err, QI_ERR_UNSUPPORTED, "the FFN observer reads activations on the host, and the plan "
                          "puts layer %d's MLP on device %s, which the host cannot read: place every MLP on the CPU",
                          l, p->devices[f]);
    }
    return QI_OK;
}

/* opts.sparsity and opts.act_observe run on the host's arithmetic: every
 * layer whole on the CPU, a gated MLP, no simulated machine, no repack. */
qi_status eng_check_sparse(const qi_engine *e, const qi_plan *p, qi_err *err) {
    if (!e->o.sparsity && !e->o.act_observe) return QI_OK;
    const char *what = e->o.sparsity ? "activation sparsity" : "the activation observer";
    if (e->o.sim)
        return QI_ERR(err, QI_ERR_UNSUPPORTED, "%s needs real activations; a simulated machine (%s) computes none",
                      what, e->o.sim);
    if (e->o.repack)
        return QI_ERR(err, QI_ERR_UNSUPPORTED, "%s reads the matrices' rows as the file has them: leave out --repack",
                      what);
    if (qi_ffn_gate_free(e->m->hp.ffn_act))
        return QI_ERR(err, QI_ERR_UNSUPPORTED, "%s needs a gated MLP (llama, gemma3)", what);
    for (int l = 0; l < p->n_layer; l++) {
        const qi_plan_layer *y = &p->layers[l];
        if (y->attn_dev != 0 || y->mlp_dev != 0 || y->split > 0.0f)
            return QI_ERR(err, QI_ERR_UNSUPPORTED, "%s runs on the CPU only, and the plan puts layer %d's %s on %s", what,
                          l, y->mlp_dev != 0 ? "MLP" : "attention", p->devices[y->mlp_dev != 0 ? y->mlp_dev : y->split > 0.0f ? y->split_dev : y->attn_dev]);
    }
    return QI_OK;
}

/* OPT and Falcon need ops only the simulated devices have (backend.h's
 * optional ones): refused on any device of the list without them, since a
 * placement policy may move any block to any device. */
qi_status eng_check_arch_ops(const qi_model *m, qi_backend *b, qi_err *err) {
    const qi_hparams *hp = &m->hp;
    const qi_backend_i *f = b->iface;
    if (!hp->layer_norm && !qi_ffn_gate_free(hp->ffn_act)) return QI_OK;
    if (f->layernorm && f->add_bias && f->act) return QI_OK;
    const bool opt = hp->arch == QI_ARCH_OPT;
    return QI_ERR(err, QI_ERR_UNSUPPORTED,
                  "%s runs on simulated devices only in this build (its LayerNorm, gate-free %s FFN%s have no "
                  "kernels on device %s): run it with --sim PROFILE",
                  opt ? "OPT" : hp->arch == QI_ARCH_FALCON ? "Falcon" : hp->arch_name, opt ? "ReLU" : "GELU",
                  opt ? ", learned positions and biases" : " and parallel block", b->info.name);
}

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

/* opts.neuron_fast and opts.sim_cold_density against the model, the
 * devices and the other options (eng_check_neuron_plan: against a plan). */
qi_status eng_check_neurons(const qi_engine *e, qi_err *err) {
    const qi_hparams *hp = &e->m->hp;
    const double dens = e->o.sim_cold_density;
    if (dens != 0.0 && !(dens > 0.0 && dens <= 1.0))
        return QI_ERR(err, QI_ERR_INVALID, "sim_cold_density %g is outside (0, 1]", dens);
    if (dens > 0.0 && !e->o.sim)
        return QI_ERR(err, QI_ERR_INVALID, "sim_cold_density is a what-if of a simulated machine, and this one is "
                      "real (it runs cats on the CPU's neurons: sparsity)");
    if (dens > 0.0 && (qi_ffn_gate_free(hp->ffn_act) || hp->parallel))
        return QI_ERR(err, QI_ERR_UNSUPPORTED, "sim_cold_density reads up and down by gate's active neurons (cats), "
                      "and %s's MLP has no gate", hp->arch_name);
    if (!e->o.neuron_fast) return QI_OK;
    if (qi_ffn_gate_free(hp->ffn_act) || hp->parallel)
        return QI_ERR(err, QI_ERR_UNSUPPORTED, "a neuron split needs a gated MLP (llama, gemma3); %s has none",
                      hp->arch_name);
    const int fd = e->o.neuron_dev;
    if (fd < 1 || fd >= e->plan.n_devices)
        return QI_ERR(err, QI_ERR_INVALID, "the neuron split's fast device %d is not one of the devices after the "
                      "cpu (%d named)", fd, e->plan.n_devices);
    const char *other = e->o.sparsity && e->o.sparsity->mode != QI_SPARSITY_CATS
                            ? "teal sparsity (a split's hot side runs dense; cats thresholds its cold side)"
                        : e->o.ffn_observe || e->o.act_observe ? "an activation observer"
                        : e->o.repack                          ? "--repack"
                                                               : NULL;
    if (other) return QI_ERR(err, QI_ERR_UNSUPPORTED, "a neuron split and %s cannot be combined", other);
    const int unit = qi_engine_neuron_unit(e->m);
    for (int l = 0; l < hp->n_layer; l++)
        if (qi_ffn_split_unit(&e->m->layers[l]) != unit)
            return QI_ERR(err, QI_ERR_UNSUPPORTED, "a neuron split moves down's blocks whole, and layer %d's are of %d "
                          "neurons where layer 0's are of %d", l, qi_ffn_split_unit(&e->m->layers[l]), unit);
    if (!(e->o.neuron_active >= 0.0f))
        return QI_ERR(err, QI_ERR_INVALID, "neuron_active %g is negative", e->o.neuron_active);
    if (e->o.neuron_swap_every < 0)
        return QI_ERR(err, QI_ERR_INVALID, "neuron_swap_every %d is negative", e->o.neuron_swap_every);
    if (e->o.neuron_swap_every > 0 && (!e->o.neuron_live || !e->o.neuron_activity))
        return QI_ERR(err, QI_ERR_INVALID, "swapping neurons needs the rule's options and each unit's activity");
    if (e->o.neuron_swap_worker && e->o.neuron_swap_every < 1)
        return QI_ERR(err, QI_ERR_INVALID, "the background swap worker needs neuron_swap_every (how often to feed it)");
    if (e->o.neuron_swap_main_stream && !e->o.neuron_swap_worker)
        return QI_ERR(err, QI_ERR_INVALID, "neuron_swap_main_stream says where the background swap worker uploads, "
                      "and there is no worker");
    if (e->o.neuron_swap_every > 0 && e->o.sim)
        return QI_ERR(err, QI_ERR_UNSUPPORTED, "swapping neurons follows the activations, and a simulated machine "
                      "(%s) computes none", e->o.sim);
    return eng_check_neuron_plan(e, &e->plan, err);
}

/* A neuron split runs its layers' cold neurons on the CPU: plan p keeps
 * their MLPs there. Its own ffn_dev and ffn_rows, where set (a copy of
 * qi_engine_plan's), are the split's: the split is fixed at creation. */
qi_status eng_check_neuron_plan(const qi_engine *e, const qi_plan *p, qi_err *err) {
    if (!e->o.neuron_fast && !e->ns) return QI_OK;
    const int nu = e->m->hp.n_ff / qi_engine_neuron_unit(e->m);
    for (int l = 0; l < p->n_layer; l++) {
        const uint8_t *mask = (e->ns ? e->ns->mask : e->o.neuron_fast) + (size_t)l * (size_t)nu;
        int any = 0;
        for (int i = 0; i < nu; i++) any += mask[i] != 0;
        const qi_plan_layer *y = &p->layers[l];
        if (any && y->mlp_dev != 0)
            return QI_ERR(err, QI_ERR_UNSUPPORTED, "the neuron split runs layer %d's cold neurons on the cpu, and the "
                          "plan puts its MLP on %s: leave the MLPs of split layers on the cpu", l,
                          p->devices[y->mlp_dev]);
        if (e->ns && y->ffn_dev != -1 &&
            (y->ffn_dev != e->o.neuron_dev || y->ffn_rows != e->ns->split[l].n[1]))
            return QI_ERR(err, QI_ERR_UNSUPPORTED, "plan layer %d: %d FFN neurons on device %d, and the engine's "
                          "neuron split (fixed at creation) has %d there", l, y->ffn_rows, y->ffn_dev,
                          e->ns->split[l].n[1]);
    }
    return QI_OK;
}

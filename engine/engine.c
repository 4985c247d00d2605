/* engine.c - the batched engine (qinfer/engine.h): its options, its creation
 * and its end. The engine is in rooms, one mechanism a file, sharing the
 * state of engine_int.h:
 *
 *   engine.c            options, create, free
 *   engine_step.c       the step: the forward pass over a batch, the head
 *   engine_seq.c        sequences, their swap to the offload tier, the step's segments
 *   engine_attn.c       the attention block and its calls
 *   engine_attn_split.c a layer's attention split across two devices
 *   engine_kv_step.c    the KV policy after attention
 *   engine_kv_pick.c    a picking or fetching policy's choice before attention
 *   engine_mlp.c        the MLP block (dense, gate-free)
 *   engine_sparsity.c   activation sparsity (teal, cats) on the CPU
 *   engine_neuron.c     the FFN split by neurons
 *   engine_swap.c       the neuron swaps, between steps or by the worker
 *   engine_stream.c     streamed layers: weights copied from the host each time they run
 *   engine_zigzag.c     FlexGen's block schedule: layers outside, GPU batches inside
 *   engine_devices.c    devices, weight blocks, activations, copies
 *   engine_replan.c     a new plan between steps
 *   engine_checks.c     which options, plans and devices go together
 *   engine_prof.c       clocks, timed ops, block spans
 *
 * Creation reads the options once: the caller's request stays in e->o;
 * the devices, the plan and every buffer are sized here so that a step
 * allocates nothing but the logits of a larger step. */
#include "engine_int.h"

const char *qi_engine_sim_profile(const qi_engine *e) { return e->sim ? qi_sim_profile(e->sim)->name : NULL; }

const qi_hwprofile *qi_engine_sim_hwprofile(const qi_engine *e) { return e->sim ? qi_sim_profile(e->sim) : NULL; }

const qi_sim *qi_engine_sim(const qi_engine *e) { return e->sim; }

void qi_engine_opts_default(qi_engine_opts *o) {
    memset(o, 0, sizeof *o);
    o->n_threads = qi_n_physical_cores();
    o->max_seqs = 16;
    o->n_ctx = 2048;
    o->step_tokens = QI_ENGINE_CHUNK;
    o->kv_policy = "full";
    o->sparse_max_density = 0.6;
}

void qi_engine_free(qi_engine *e) {
    if (!e) return;
    eng_neurons_free(e); /* first: the swap worker writes what is freed below */
    eng_activity_free(e);
    if (e->seqs) {
        for (int i = 0; i < e->o.max_seqs; i++) {
            seq_state *s = &e->seqs[i];
            if (s->streams)
                for (int l = 0; l < e->m->hp.n_layer; l++)
                    for (int h = 0; h < e->m->hp.n_head_kv; h++)
                        qi_kv_stream_release(stream_of(e, s, l, h));
            qi_free(s->streams);
            qi_free(s->pending);
        }
        qi_free(e->seqs);
    }
    if (e->ps)
        for (int t = 0; t < e->o.n_threads; t++) {
            pol_scratch *ps = &e->ps[t];
            if (ps->pol != e->pol) qi_kv_policy_free(ps->pol);
            void *pb[] = {ps->attn, ps->vpos, ps->vtier, ps->vscore, ps->probe_s, ps->probe_q16, ps->obs};
            for (size_t i = 0; i < sizeof pb / sizeof pb[0]; i++) qi_free(pb[i]);
        }
    qi_free(e->ps);
    eng_sparsity_free(e);
    eng_stream_free(e);
    eng_block_free(e);
    qi_kv_policy_free(e->pol);
    for (int d = QI_PLAN_MAX_DEVICES - 1; d >= 0; d--) {
        dev_state *D = &e->dev[d];
        if (D->pool != e->pool) qi_kv_pool_free(D->pool);
        qi_buf_free(D->act);
        if (D->wblk)
            for (int b = 0; b < wblock_count(e->m); b++) qi_buf_free(D->wblk[b]);
        qi_free(D->wblk);
        qi_buf_free(D->lbuf);
        qi_buf_free(D->sbuf);
        qi_free(D->layers);
        if (d > 0) qi_backend_free(D->be);
    }
    qi_kv_pool_free(e->pool);
    qi_backend_free(e->be);
    qi_sim_free(e->sim);
    qi_plan_free(&e->plan);
    for (int i = 0; i < e->n_cev; i++) qi_event_free(e->cev[i]);
    void *bufs[] = {e->tokens, e->q_pos, e->kv_src, e->kv_dst, e->segs, e->out_rows, e->logits, e->at.stats, e->fates,
                    e->fate_off, e->at.call, e->at.n_slots, (void *)e->at.pos, (void *)e->at.kb, (void *)e->at.vb,
                    (void *)e->kv_src2, e->kv_dst2, e->cev, e->cev_kind, e->cev_tag, e->cev_dev, e->kstage,
                    (void *)e->kst_blk, e->kst_at, e->blk_s, e->blk_split_s, e->blk_attn_s, (void *)e->at.pick_kb,
                    (void *)e->at.pick_vb, e->at.pick_pos, e->at.pick_idx, e->at.pick_mix, e->at.pick_vmean, (void *)e->at.pick_vm,
                    e->at.x_n, (void *)e->at.x_pos, (void *)e->at.x_k, (void *)e->at.x_v};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) qi_free(bufs[i]);
    qi_free(e);
}

/* opts.sim: the profile read and the machine made from it, with
 * opts.sim_cal's and then opts.sim_params' over the default efficiencies. */
static qi_status open_sim(qi_engine *e, const qi_engine_opts *o, qi_err *err) {
    qi_hwprofile *prof = qi_malloc(sizeof *prof);
    if (!prof) return QI_ERR(err, QI_ERR_NOMEM, "out of memory reading a profile");
    qi_status st = qi_hwprofile_load(o->sim, prof, err);
    qi_sim_params par;
    qi_sim_params_default(&par);
    if (!st && o->sim_cal) st = qi_sim_params_load(o->sim_cal, &par, err);
    for (int i = 0; !st && o->sim_params && i < o->sim_params->n; i++) {
        const char *k = o->sim_params->items[i].key, *v = o->sim_params->items[i].value;
        char *end;
        errno = 0;
        const double x = strtod(v, &end);
        if (end == v || *end || errno)
            st = QI_ERR(err, QI_ERR_INVALID, "sim: %s = '%s' is not a number", k, v);
        else
            st = qi_sim_params_set(&par, k, x, err);
    }
    par.cpu_threads = o->n_threads; /* the CPU's compute scales by the cores they use */
    if (!st) st = qi_sim_create(prof, &par, &e->sim, err);
    qi_free(prof);
    return st;
}

qi_status qi_engine_create(const qi_model *m, const qi_engine_opts *o, qi_engine **out, qi_err *err) {
    *out = NULL;
    const qi_hparams *hp = &m->hp;
    if (o->n_threads < 1 || o->n_threads > 1024)
        return QI_ERR(err, QI_ERR_INVALID, "thread count %d out of range 1..1024", o->n_threads);
    if (o->max_seqs < 1 || o->max_seqs > 4096)
        return QI_ERR(err, QI_ERR_INVALID, "max sequences %d out of range 1..4096", o->max_seqs);
    if (o->n_ctx < 1 || o->n_ctx > (1 << 20))
        return QI_ERR(err, QI_ERR_INVALID, "context size %d out of range 1..%d", o->n_ctx, 1 << 20);
    if (o->step_tokens < 1 || o->step_tokens > 65536)
        return QI_ERR(err, QI_ERR_INVALID, "step token budget %d out of range 1..65536", o->step_tokens);
    if (o->kv_budget_tokens < 0) return QI_ERR(err, QI_ERR_INVALID, "KV budget %d tokens is negative", o->kv_budget_tokens);
    if (!(o->kv_budget_frac >= 0.0 && o->kv_budget_frac <= 1.0))
        return QI_ERR(err, QI_ERR_INVALID, "KV budget fraction %g is outside (0, 1]", o->kv_budget_frac);
    if (o->kv_budget_tokens > 0 && o->kv_budget_frac > 0.0)
        return QI_ERR(err, QI_ERR_INVALID, "KV budget given both as tokens and as a fraction");
    if (hp->head_dim > 1024) return QI_ERR(err, QI_ERR_UNSUPPORTED, "head size %d above 1024", hp->head_dim);

    qi_engine *e = qi_calloc(1, sizeof *e);
    if (!e) return QI_ERR(err, QI_ERR_NOMEM, "out of memory creating the engine");
    e->m = m;
    e->o = *o;
    e->o.kv_params = NULL; /* read in create only */
    if (!e->o.kv_policy) e->o.kv_policy = "full";
    qi_status st;
    qi_params none;
    qi_params_init(&none);
    if ((st = qi_kv_policy_create(e->o.kv_policy, o->kv_params ? o->kv_params : &none, hp->n_layer, &e->pol, err)))
        goto fail;
    e->o.kv_policy = qi_kv_policy_name(e->pol);
    e->picks = qi_kv_policy_picks(e->pol);
    e->pick_tokens = qi_kv_policy_picks_tokens(e->pol);
    e->fetches = !e->picks && qi_kv_policy_fetches(e->pol);
    bool any_budgeted = false;
    for (int l = 0; l < hp->n_layer; l++) any_budgeted |= !qi_kv_policy_exempt(e->pol, l);
    if (any_budgeted && o->kv_budget_tokens == 0 && o->kv_budget_frac == 0.0) {
        st = QI_ERR(err, QI_ERR_INVALID, "KV policy '%s' needs a budget (tokens or a fraction)", e->o.kv_policy);
        goto fail;
    }
    if (hp->n_swa > 0) {
        long cells = ((long)hp->n_swa + QI_ENGINE_CHUNK + 255) / 256 * 256;
        e->swa_cells = cells < o->n_ctx ? (int)cells : o->n_ctx;
    }
    const unsigned cpu_flags = (o->attn_blas ? QI_CPU_ATTN_BLAS : 0u) | (o->repack ? QI_CPU_REPACK : 0u);
    if (o->sim_cal && !o->sim) {
        st = QI_ERR(err, QI_ERR_INVALID, "a calibration file (%s) is for a simulated machine: name its profile with "
                    "--sim", o->sim_cal);
        goto fail;
    }
    if (o->sim) {
        if ((st = open_sim(e, o, err)) || (st = qi_backend_sim_create(e->sim, false, 0, &e->be, err))) goto fail;
    } else if ((st = qi_backend_cpu_create(o->n_threads, cpu_flags, &e->be, err)) ||
               (st = eng_check_arch_ops(m, e->be, err))) { /* an architecture the CPU cannot run says so first */
        goto fail;
    } else if (qi_gguf_shapes_only(m->gguf)) {
        st = QI_ERR(err, QI_ERR_INVALID, "%s has shapes only, no weights (qinfer synth --shapes-only): it runs on "
                    "simulated devices only (--sim PROFILE)", qi_gguf_path(m->gguf));
        goto fail;
    }
    if ((st = qi_kv_pool_create(e->be, hp->head_dim, o->kv_max_bytes, &e->pool, err))) goto fail;

    /* rows of a step: the prompt room plus one decode row per sequence */
    const size_t R = (size_t)o->step_tokens + (size_t)o->max_seqs;
    const size_t N = (size_t)o->n_ctx;
    if ((st = eng_setup_devices(e, R, err))) goto fail;
    /* a fetch scores offloaded tokens on the host and points the CPU's
     * attention at them: on a run with other devices (or simulated ones),
     * whose plans may place attention elsewhere, a fetch the policy does by
     * default is turned off (one asked for is refused there: eng_check_picks) */
    if (e->fetches && (o->sim || e->plan.n_devices > 1) && qi_kv_policy_fetch_off(e->pol)) e->fetches = false;
    if ((st = eng_check_observe(e, &e->plan, err)) ||
        (st = eng_check_sparse(e, &e->plan, err)) || (st = eng_sparse_setup(e, R, err)) ||
        (st = eng_check_picks(e, &e->plan, err)) || (st = eng_check_neurons(e, err)) ||
        (st = eng_neuron_setup(e, err)) || (st = eng_activity_setup(e, err)) ||
        (st = eng_block_check(e, &e->plan, err)))
        goto fail;
    e->o.devices = e->o.placement = NULL; /* read in create only; the plan is e->plan */
    e->o.plan = NULL;
    e->seqs = qi_calloc((size_t)o->max_seqs, sizeof *e->seqs);
    e->tokens = qi_malloc(sizeof(int32_t) * R);
    e->q_pos = qi_malloc(sizeof(int32_t) * R);
    e->kv_src = qi_malloc(sizeof *e->kv_src * 2 * R * (size_t)hp->n_head_kv);
    e->kv_dst = qi_malloc(sizeof *e->kv_dst * 2 * R * (size_t)hp->n_head_kv);
    e->kv_src2 = qi_malloc(sizeof *e->kv_src2 * 2 * R * (size_t)hp->n_head_kv);
    e->kv_dst2 = qi_malloc(sizeof *e->kv_dst2 * 2 * R * (size_t)hp->n_head_kv);
    e->segs = qi_malloc(sizeof(segment) * (size_t)o->max_seqs);
    e->out_rows = qi_malloc(sizeof(int32_t) * R);
    e->at.cap_stats = (size_t)hp->n_head * stats_stride(o->n_ctx);
    e->at.stats = qi_malloc(sizeof(float) * e->at.cap_stats);
    e->fate_off = qi_malloc(sizeof(size_t) * ((size_t)o->max_seqs * (size_t)hp->n_head_kv + 1));
    e->kst_at = qi_malloc(sizeof(long) * (size_t)o->max_seqs * (size_t)hp->n_head_kv);
    e->blk_s = qi_calloc((size_t)wblock_count(m), sizeof *e->blk_s);
    e->blk_split_s = qi_calloc((size_t)wblock_count(m), sizeof *e->blk_split_s);
    e->blk_attn_s = qi_calloc((size_t)wblock_count(m), sizeof *e->blk_attn_s);
    e->ps = qi_calloc((size_t)o->n_threads, sizeof *e->ps);
    if (!e->ps) {
        st = QI_ERR(err, QI_ERR_NOMEM, "out of memory sizing the engine for %d threads", o->n_threads);
        goto fail;
    }
    /* regions per thread: a stream's, or a layer's KV heads' together */
    const int together = qi_kv_policy_heads_together(e->pol) ? hp->n_head_kv : 1;
    if (together > MAX_TOGETHER) {
        st = QI_ERR(err, QI_ERR_UNSUPPORTED, "KV policy '%s' with ada= decides a layer's KV heads together, at most "
                    "%d, and the model has %d", e->o.kv_policy, MAX_TOGETHER, together);
        goto fail;
    }
    const size_t NR = N * (size_t)together;
    for (int t = 0; t < o->n_threads; t++) {
        pol_scratch *ps = &e->ps[t];
        if (t == 0)
            ps->pol = e->pol;
        else if ((st = qi_kv_policy_create(e->o.kv_policy, o->kv_params ? o->kv_params : &none, hp->n_layer,
                                           &ps->pol, err)))
            goto fail;
        if (t > 0 && !e->fetches && qi_kv_policy_fetches(ps->pol)) qi_kv_policy_fetch_off(ps->pol); /* as e->pol */
        ps->attn = qi_malloc(sizeof(float) * NR);
        ps->vpos = qi_malloc(sizeof(int32_t) * NR);
        ps->vtier = qi_malloc(NR);
        ps->vscore = qi_malloc(sizeof(float) * NR);
        ps->probe_s = qi_malloc(sizeof(float) * (N + 16));
        ps->probe_q16 = qi_malloc(sizeof(uint16_t) * (size_t)hp->head_dim);
        ps->obs = qi_malloc(sizeof(float) * NR);
        if (!ps->attn || !ps->vpos || !ps->vtier || !ps->vscore || !ps->probe_s || !ps->probe_q16 || !ps->obs) {
            st = QI_ERR(err, QI_ERR_NOMEM, "out of memory for the KV policy's scratch of %d positions", o->n_ctx);
            goto fail;
        }
    }
    const size_t ns = 2 * (size_t)o->max_seqs * (size_t)hp->n_head_kv;
    e->at.call = qi_malloc(sizeof *e->at.call * 2 * (size_t)o->max_seqs);
    e->at.n_slots = qi_malloc(sizeof *e->at.n_slots * ns);
    e->at.pos = qi_malloc(sizeof *e->at.pos * ns);
    e->at.kb = qi_malloc(sizeof *e->at.kb * ns);
    e->at.vb = qi_malloc(sizeof *e->at.vb * ns);
    if (!e->at.call || !e->at.n_slots || !e->at.pos || !e->at.kb || !e->at.vb) {
        st = QI_ERR(err, QI_ERR_NOMEM, "out of memory sizing the engine for %d sequences", o->max_seqs);
        goto fail;
    }
    if (e->picks || e->fetches) { /* a fetching policy's fetched rows are single tokens, as a token picker's */
        const size_t nst = (size_t)o->max_seqs * (size_t)hp->n_head_kv;
        e->pick_max_blocks = e->pick_tokens || e->fetches ? o->n_ctx : (o->n_ctx + QI_KV_PAGE - 1) / QI_KV_PAGE; /* tokens, pages */
        e->at.pick_kb = qi_malloc(sizeof *e->at.pick_kb * nst * (size_t)e->pick_max_blocks);
        e->at.pick_vb = qi_malloc(sizeof *e->at.pick_vb * nst * (size_t)e->pick_max_blocks);
        e->at.pick_pos = qi_malloc(sizeof *e->at.pick_pos * nst * N);
        e->at.pick_idx = qi_malloc(sizeof *e->at.pick_idx * (size_t)e->pick_max_blocks * (size_t)o->n_threads);
        e->at.pick_mix = qi_malloc(sizeof *e->at.pick_mix * (size_t)o->max_seqs * (size_t)hp->n_head);
        e->at.pick_vmean = qi_malloc(sizeof *e->at.pick_vmean * nst * (size_t)hp->head_dim);
        e->at.pick_vm = qi_malloc(sizeof *e->at.pick_vm * nst);
        bool x_ok = true;
        if (e->fetches) {
            e->at.x_n = qi_malloc(sizeof *e->at.x_n * nst);
            e->at.x_pos = qi_malloc(sizeof *e->at.x_pos * nst);
            e->at.x_k = qi_malloc(sizeof *e->at.x_k * nst);
            e->at.x_v = qi_malloc(sizeof *e->at.x_v * nst);
            x_ok = e->at.x_n && e->at.x_pos && e->at.x_k && e->at.x_v;
        }
        if (!e->at.pick_kb || !e->at.pick_vb || !e->at.pick_pos || !e->at.pick_idx || !e->at.pick_mix || !e->at.pick_vmean ||
            !e->at.pick_vm || !x_ok) {
            st = QI_ERR(err, QI_ERR_NOMEM, "out of memory for the block tables of KV policy '%s'", e->o.kv_policy);
            goto fail;
        }
    }
    if (!e->seqs || !e->blk_s || !e->blk_split_s || !e->blk_attn_s || !e->tokens || !e->q_pos || !e->kv_src || !e->kv_dst || !e->kv_src2 || !e->kv_dst2 || !e->segs || !e->out_rows || !e->at.stats ||
        !e->fate_off || !e->kst_at) {
        st = QI_ERR(err, QI_ERR_NOMEM, "out of memory sizing the engine for %d rows per step and %d positions",
                    (int)R, o->n_ctx);
        goto fail;
    }
    for (int d = 0; d < e->plan.n_devices; d++)
        if ((st = e->dev[d].be->iface->reserve(e->dev[d].be, qi_backend_max_act_row_bytes(m) * R, (int)R, o->n_ctx,
                                               hp->n_head_kv, hp->head_dim, err)))
            goto fail;
    *out = e;
    return QI_OK;
fail:
    qi_engine_free(e);
    return st;
}

const char *qi_engine_kv_policy_name(const qi_engine *e) { return e->o.kv_policy; }

bool qi_engine_kv_budget_attended(const qi_engine *e) { return e->picks || e->fetches; }

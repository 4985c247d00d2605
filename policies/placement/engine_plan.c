/* engine_plan.c - a placement policy's plan run by an engine.
 *
 * The engine takes its placement as a --placement value at creation; rather
 * than teach it the policies, the caller creates it with a fixed placement
 * on the device list it wants, reads the devices back (their capacities and
 * what the engine already holds there) and hands the policy's plan to
 * qi_engine_replan, between steps, before any sequence: nothing moves but
 * the weights. The engine checks the plan again as it allocates; the policy
 * slot's check (registry.c) counts the workload's KV too, so a plan it
 * passes is one the engine takes.
 */
#include <math.h>
#include <stdio.h>

#include "placement/placement_policy.h"
#include "qinfer/model.h"
#include "qinfer/hwprofile.h"

void qi_placement_devices_of_engine(const qi_engine *e, qi_placement_devices *out) {
    *out = (qi_placement_devices){0};
    qi_engine_dev d;
    for (int i = 0; i < QI_PLAN_MAX_DEVICES && qi_engine_device(e, i, &d); i++) {
        qi_placement_device *o = &out->dev[i];
        snprintf(o->name, sizeof o->name, "%s", d.name);
        o->kind = i == 0 ? QI_PLACEMENT_DEV_CPU : QI_PLACEMENT_DEV_ACCEL;
        o->capacity = d.capacity;
        /* room for a whole plan: what the plan in force holds there counts as free */
        const size_t used = d.in_use - (i ? qi_engine_plan_bytes(e, i) : 0);
        o->free = d.capacity > used ? d.capacity - used : 0;
        o->holds_act = true;
        out->n_devices = i + 1;
    }
    out->engine = e;
    out->profile = qi_engine_sim_hwprofile(e);
}

static void cost_add(qi_engine_replan_cost *a, const qi_engine_replan_cost *b) {
    a->weight_bytes += b->weight_bytes;
    a->kv_blocks += b->kv_blocks;
    a->kv_bytes += b->kv_bytes;
    a->seconds += b->seconds;
}

/* Whether plans a and b differ only in their splits (every block on the
 * same device): a move of KV blocks alone. */
static bool splits_only(const qi_plan *a, const qi_plan *b) {
    if (a->n_layer != b->n_layer || a->embd_dev != b->embd_dev || a->head_dev != b->head_dev) return false;
    for (int l = 0; l < a->n_layer; l++)
        if (a->layers[l].attn_dev != b->layers[l].attn_dev || a->layers[l].mlp_dev != b->layers[l].mlp_dev)
            return false;
    return true;
}

/* A move of splits alone that the engine refuses for room (it lays a
 * changed layer's KV out anew before it frees the old) is made a few
 * layers at a time, halving the group at each refusal: it needs room for
 * one layer's KV, not every changed layer's, and moves no weights. NOMEM
 * when even one layer does not fit; the engine keeps the layers moved so
 * far then. */
static qi_status move_splits(qi_engine *e, const qi_plan *next, qi_engine_replan_cost *cost, qi_err *err) {
    qi_plan step = {0};
    qi_status st = qi_plan_copy(&step, qi_engine_plan(e), err);
    if (st) return st;
    const int n = next->n_layer;
    int group = n;
    for (int l = 0; l < n && !st;) {
        int end = l, changed = 0;
        for (; end < n && changed < group; end++) {
            const qi_plan_layer *x = &step.layers[end], *y = &next->layers[end];
            changed += x->split != y->split || (y->split > 0.0f && x->split_dev != y->split_dev);
        }
        qi_plan trial = {0};
        if ((st = qi_plan_copy(&trial, &step, err))) break;
        for (int k = l; k < end; k++) trial.layers[k] = next->layers[k];
        qi_engine_replan_cost c = {0};
        qi_err e1 = {0};
        st = qi_engine_replan(e, &trial, &c, &e1);
        if (!st) {
            for (int k = l; k < end; k++) step.layers[k] = next->layers[k];
            if (cost) cost_add(cost, &c);
            l = end;
        } else if (st == QI_ERR_NOMEM && group > 1) {
            group = changed > 1 ? changed / 2 : 1;
            st = QI_OK;
        } else {
            *err = e1;
        }
        qi_plan_free(&trial);
    }
    qi_plan_free(&step);
    return st;
}

/* The move to plan next: at once; for a change of splits alone refused
 * for room, a few layers at a time (move_splits); otherwise, or when that
 * fails, through the plan that keeps on every device only what both plans
 * put there (it only frees room). */
static qi_status move_to(qi_engine *e, const qi_plan *next, qi_engine_replan_cost *cost, qi_err *err) {
    qi_err e1 = {0};
    qi_status st = qi_engine_replan(e, next, cost, &e1);
    if (st != QI_ERR_NOMEM) {
        if (st) *err = e1;
        return st;
    }
    qi_engine_replan_cost c0 = {0};
    if (splits_only(qi_engine_plan(e), next)) {
        qi_err e2 = {0};
        st = move_splits(e, next, &c0, &e2);
        if (st != QI_ERR_NOMEM) {
            if (st) *err = e2;
            if (cost) *cost = c0;
            return st;
        }
    }
    const qi_plan *cur = qi_engine_plan(e);
    qi_plan mid = {0};
    if ((st = qi_plan_copy(&mid, next, err))) return st;
    for (int l = 0; l < mid.n_layer; l++) {
        qi_plan_layer *y = &mid.layers[l];
        const qi_plan_layer *x = &cur->layers[l];
        if (y->attn_dev != x->attn_dev || y->split != x->split || y->split_dev != x->split_dev)
            y->attn_dev = 0, y->split = 0.0f, y->split_dev = -1;
        if (y->mlp_dev != x->mlp_dev) y->mlp_dev = 0;
    }
    if (mid.head_dev != cur->head_dev) mid.head_dev = 0;
    if (mid.embd_dev != cur->embd_dev) mid.embd_dev = 0;
    qi_engine_replan_cost c1 = {0}, c2 = {0};
    st = qi_engine_replan(e, &mid, &c1, err);
    if (!st) st = qi_engine_replan(e, next, &c2, err);
    qi_plan_free(&mid);
    if (cost) {
        cost_add(&c0, &c1);
        cost_add(&c0, &c2);
        *cost = c0;
    }
    return st;
}

qi_status qi_placement_apply(qi_placement_policy *p, qi_engine *e, const qi_model *m,
                             const qi_placement_workload *wl, qi_engine_replan_cost *cost, qi_err *err) {
    qi_placement_devices devs;
    qi_placement_devices_of_engine(e, &devs);
    qi_plan plan = {0};
    qi_status st = qi_placement_policy_plan(p, m, &devs, wl, &plan, err);
    if (st) return st;
    st = move_to(e, &plan, cost, err);
    qi_plan_free(&plan);
    return st;
}

/* ---- re-planning while the engine runs ------------------------------------------------- */

void qi_placement_ctl_init(qi_placement_ctl *c, qi_placement_policy *p, double bucket) {
    *c = (qi_placement_ctl){.policy = p, .bucket = bucket > 1.0 ? bucket : 2.0, .bucket_batch = -1,
                            .bucket_ctx = -1, .predicted_s = NAN, .measured_s = NAN};
}

static int bucket_of(double v, double base) { return v < 1.0 ? 0 : (int)floor(log(v) / log(base) + 1e-9); }

/* The bytes a move from plan a to plan b carries: the weight blocks that
 * change device (to a device other than the CPU) and the working KV of
 * the layers whose attention moves or whose split changes. */
static double moved_bytes(const qi_engine *e, const qi_model *m, const qi_placement_workload *wl, const qi_plan *a,
                          const qi_plan *b) {
    double n = 0;
    for (int k = 0; k < qi_plan_n_blocks(m->hp.n_layer); k++) {
        const int d = qi_plan_block_dev(b, k);
        if (qi_plan_block_dev(a, k) != d && d != 0) n += (double)qi_engine_block_bytes(e, d, k);
    }
    for (int l = 0; l < m->hp.n_layer; l++) {
        const qi_plan_layer *x = &a->layers[l], *y = &b->layers[l];
        if (x->attn_dev != y->attn_dev || x->split != y->split || x->split_dev != y->split_dev)
            n += (double)qi_placement_kv_bytes(m, wl, l);
    }
    return n;
}

/* Whether plans a and b put every block, and every split, alike. */
static bool same_plan(const qi_plan *a, const qi_plan *b) {
    if (a->n_layer != b->n_layer || a->embd_dev != b->embd_dev || a->head_dev != b->head_dev) return false;
    for (int l = 0; l < a->n_layer; l++) {
        const qi_plan_layer *x = &a->layers[l], *y = &b->layers[l];
        if (x->attn_dev != y->attn_dev || x->mlp_dev != y->mlp_dev || x->split != y->split ||
            (x->split > 0.0f && x->split_dev != y->split_dev))
            return false;
    }
    return true;
}

qi_status qi_placement_ctl_tick(qi_placement_ctl *c, qi_engine *e, const qi_model *m, const qi_placement_workload *wl,
                                bool *replanned, qi_err *err) {
    if (replanned) *replanned = false;
    c->ticks++;
    qi_placement_devices devs;
    qi_placement_devices_of_engine(e, &devs);
    const qi_plan *cur = qi_engine_plan(e);
    /* what ran since the last tick, to the policy */
    qi_engine_block_times bt;
    qi_engine_block_times_get(e, &bt);
    if (c->have_obs && bt.steps > 0) {
        const int nb = bt.n_blocks;
        double *avg = qi_malloc(sizeof *avg * 3 * (size_t)nb);
        if (!avg) return QI_ERR(err, QI_ERR_NOMEM, "out of memory for a placement observation");
        double copy[QI_PLAN_MAX_DEVICES], total = 0;
        for (int k = 0; k < nb; k++) {
            avg[k] = bt.block_s[k] / (double)bt.steps;
            avg[nb + k] = bt.split_s[k] / (double)bt.steps;
            avg[2 * nb + k] = bt.attn_s[k] / (double)bt.steps;
            total += avg[k];
        }
        for (int d = 0; d < QI_PLAN_MAX_DEVICES; d++) {
            copy[d] = bt.copy_s[d] / (double)bt.steps;
            total += copy[d];
        }
        const qi_placement_times t = {.plan = cur, .n_blocks = nb, .block_s = avg, .split_s = avg + nb,
                                      .attn_s = avg + 2 * nb, .copy_s = copy, .wl = &c->obs_wl, .steps = bt.steps};
        c->predicted_s = qi_placement_policy_predict(c->policy, m, &devs, &c->obs_wl, cur);
        c->measured_s = total;
        qi_placement_policy_observe(c->policy, &t);
        c->observed_steps += bt.steps;
        qi_free(avg);
    }
    qi_engine_block_times_reset(e);
    c->obs_wl = *wl;
    c->have_obs = true;

    const int bb = bucket_of(wl->batch, c->bucket), bc = bucket_of(wl->prompt_len, c->bucket);
    const bool moved_bucket = bb != c->bucket_batch || bc != c->bucket_ctx;
    qi_plan next = {0};
    qi_status st = qi_placement_policy_plan(c->policy, m, &devs, wl, &next, err);
    if (st) return st;
    bool go = moved_bucket || (c->policy->iface->replan_on_change && !same_plan(cur, &next));
    if (!go && c->policy->iface->predict) {
        /* the gain over the steps left against the time to move */
        const double now = qi_placement_policy_predict(c->policy, m, &devs, wl, cur),
                     then = qi_placement_policy_predict(c->policy, m, &devs, wl, &next);
        const double bytes = moved_bytes(e, m, wl, cur, &next);
        const double bw = devs.profile && devs.profile->has_gpu ? devs.profile->link_h2d_bw.value : 10e9;
        go = bytes > 0 && isfinite(now) && isfinite(then) && then < now * (1 - 1e-3) &&
             (now - then) * (wl->gen_len > 0 ? wl->gen_len : 1) > bytes / bw;
    }
    if (go) {
        const double bytes = moved_bytes(e, m, wl, cur, &next);
        st = move_to(e, &next, NULL, err);
        if (!st) {
            c->replans++;
            c->moved_bytes += bytes;
            c->bucket_batch = bb;
            c->bucket_ctx = bc;
            if (replanned) *replanned = true;
        }
    }
    qi_plan_free(&next);
    return st;
}

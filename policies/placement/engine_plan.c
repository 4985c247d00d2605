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
#include <stdio.h>

#include "placement/placement_policy.h"
#include "qinfer/model.h"

void qi_placement_devices_of_engine(const qi_engine *e, qi_placement_devices *out) {
    *out = (qi_placement_devices){0};
    qi_engine_dev d;
    for (int i = 0; i < QI_PLAN_MAX_DEVICES && qi_engine_device(e, i, &d); i++) {
        qi_placement_device *o = &out->dev[i];
        snprintf(o->name, sizeof o->name, "%s", d.name);
        o->kind = i == 0 ? QI_PLACEMENT_DEV_CPU : QI_PLACEMENT_DEV_ACCEL;
        o->capacity = d.capacity;
        o->free = d.capacity > d.in_use ? d.capacity - d.in_use : 0;
        o->holds_act = true;
        out->n_devices = i + 1;
    }
    out->engine = e;
}

qi_status qi_placement_apply(qi_placement_policy *p, qi_engine *e, const qi_model *m,
                             const qi_placement_workload *wl, qi_engine_replan_cost *cost, qi_err *err) {
    qi_placement_devices devs;
    qi_placement_devices_of_engine(e, &devs);
    qi_plan plan = {0};
    qi_status st = qi_placement_policy_plan(p, m, &devs, wl, &plan, err);
    if (st) return st;
    st = qi_engine_replan(e, &plan, cost, err);
    qi_plan_free(&plan);
    return st;
}

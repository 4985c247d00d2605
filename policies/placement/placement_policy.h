/* placement_policy.h - the placement slot: which device runs each block of
 * the forward pass (a qi_plan, qinfer/plan.h), chosen from the model's
 * shape, the devices' memory and the workload.
 *
 * A policy is shown the model (its weights give every block's bytes through
 * qi_plan_block_bytes), the devices (the engine's device list: index 0 the
 * host CPU; each with its kind, capacity and bytes free) and the workload
 * (sequences at once, prompt and generated lengths, the KV budget per
 * sequence), and fills a plan. It may be shown measured times afterwards
 * (observe(): per weight block and per copy between devices) and use them
 * for its next plan; a policy without state ignores them.
 *
 * Every plan goes through qi_placement_policy_plan, which validates it and
 * checks it against the devices' memory (qi_placement_check): a plan that
 * does not fit is refused naming the device, the block and the bytes
 * short, whatever policy made it. A new policy is one file plus one line in
 * registry.c.
 */
#ifndef QI_PLACEMENT_POLICY_H
#define QI_PLACEMENT_POLICY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "qinfer/engine.h"
#include "qinfer/params.h"
#include "qinfer/plan.h"
#include "qinfer/status.h"

struct qi_hwprofile;

#define QI_PLACEMENT_POLICY_VERSION 3u

struct qi_model;

typedef enum { QI_PLACEMENT_DEV_CPU = 0, QI_PLACEMENT_DEV_ACCEL = 1 } qi_placement_dev_kind;

typedef struct {
    char name[QI_PLAN_DEV_NAME]; /* as in --devices */
    qi_placement_dev_kind kind;
    size_t capacity; /* bytes it may hold in all (0: no limit) */
    size_t free;     /* bytes free now (ignored when capacity is 0) */
    bool holds_act;  /* free already leaves out the engine's activations there
                      * (an engine's device): the check does not count them again */
} qi_placement_device;

typedef struct {
    int n_devices; /* 1..QI_PLAN_MAX_DEVICES; dev[0] the host CPU */
    qi_placement_device dev[QI_PLAN_MAX_DEVICES];
    /* The engine these are the devices of (qi_placement_devices_of_engine),
     * or NULL: with one, a block's bytes on a device are those the device's
     * own weight form takes (qi_engine_block_bytes: a packed form beside
     * the rows, say), not only the rows (qi_plan_block_bytes). */
    const qi_engine *engine;
    /* The hardware's figures where known (a simulated machine's profile;
     * NULL on real devices): a policy with a cost model may start from
     * them. */
    const struct qi_hwprofile *profile;
} qi_placement_devices;

typedef struct {
    int batch;      /* B: sequences at once (>= 1) */
    int prompt_len; /* tokens per prompt */
    int gen_len;    /* tokens generated per sequence */
    int kv_budget;  /* working KV tokens kept per sequence (0: prompt + generated, all of it) */
    int step_rows;  /* rows of the largest step (0: batch x prompt_len, a prompt read in one step) */
} qi_placement_workload;

/* Measured times, for observe(), per step (averaged over the steps
 * observed): block_s[b] the seconds weight block b (qi_plan_block_dev's
 * numbering) took on the device the plan put it on (its span, so a split
 * attention's includes waiting for its second device), split_s[b] a split
 * attention's ops on its second device, attn_s[b] an attention block's
 * attention and KV-write ops on its own device (its share of a split
 * attention, without the projections or the wait), copy_s[d] the seconds
 * spent copying activations to device d. Any may be NULL. wl: the
 * workload the steps ran (batch decoding at context prompt_len, gen_len
 * still to go). */
typedef struct {
    const qi_plan *plan; /* the plan that ran */
    int n_blocks;        /* qi_plan_n_blocks(plan->n_layer) */
    const double *block_s; /* [n_blocks] */
    const double *split_s; /* [n_blocks] */
    const double *attn_s;  /* [n_blocks] */
    const double *copy_s;  /* [plan->n_devices] */
    const qi_placement_workload *wl;
    long steps;
} qi_placement_times;

typedef struct qi_placement_policy qi_placement_policy;

typedef struct {
    uint32_t version;    /* QI_PLACEMENT_POLICY_VERSION */
    const char *name;    /* "static" */
    const char *summary; /* one line for --help */
    const char *params;  /* one line: the keys it takes with defaults, or "" */
    /* Validate params (unknown key, bad value: an error naming the policy
     * and the key) and build the policy. */
    qi_status (*create)(const qi_params *params, qi_placement_policy **out, qi_err *err);
    /* Fill *out (its devices are set to devs' names and its layers
     * allocated for the model, every block on the CPU, before the call). */
    qi_status (*plan)(qi_placement_policy *p, const struct qi_model *m, const qi_placement_devices *devs,
                      const qi_placement_workload *wl, qi_plan *out, qi_err *err);
    /* optional: NULL ignores measurements */
    void (*observe)(qi_placement_policy *p, const qi_placement_times *t);
    void (*free)(qi_placement_policy *p);
    /* optional (NULL: no cost model): the policy's predicted seconds of
     * one decode step of workload wl under plan p, so that a caller can
     * weigh a new plan's gain against the cost of moving to it */
    double (*predict)(qi_placement_policy *p, const struct qi_model *m, const qi_placement_devices *devs,
                      const qi_placement_workload *wl, const qi_plan *plan);
    /* optional (false: re-planned on a workload bucket, or on a predicted
     * gain): a policy whose plan follows its observations by a rule, with
     * no cost model to weigh a move (ratio); qi_placement_ctl_tick applies
     * its plan whenever it differs from the one in force */
    bool replan_on_change;
} qi_placement_policy_i;

/* Every policy object starts with its interface. */
struct qi_placement_policy {
    const qi_placement_policy_i *iface;
};

/* registry.c: the policies, NULL-terminated. */
extern const qi_placement_policy_i *const qi_placement_policies[];

/* The policy called name, or NULL. */
const qi_placement_policy_i *qi_placement_policy_find(const char *name);
/* Create by name; an unknown name is QI_ERR_INVALID listing the known
 * ones, an unknown parameter QI_ERR_INVALID naming it (the policy's
 * create()). params may be NULL. *out is NULL on failure. */
qi_status qi_placement_policy_create(const char *name, const qi_params *params, qi_placement_policy **out,
                                     qi_err *err);
/* The policy's plan for this model, these devices and this workload, in
 * *out (allocated: qi_plan_free; left empty on failure). The plan is
 * validated (qi_plan_validate, its layers and devices those asked for) and
 * checked with qi_placement_check: QI_ERR_NOMEM naming the device, the
 * block and the bytes short when it does not fit, QI_ERR_BACKEND when the
 * policy returned a plan that is not one. */
qi_status qi_placement_policy_plan(qi_placement_policy *p, const struct qi_model *m, const qi_placement_devices *devs,
                                   const qi_placement_workload *wl, qi_plan *out, qi_err *err);
/* The accelerator a policy places on: the last device of the list that is
 * not the CPU, or -1 when there is none. */
int qi_placement_accel(const qi_placement_devices *devs);
/* A policy from a --placement value "policy:NAME[:K=V,...]" (the "policy:"
 * may be left out). Errors: no name, bad parameters, those of create. */
qi_status qi_placement_policy_from_spec(const char *spec, qi_placement_policy **out, qi_err *err);
/* Whether a --placement value names a policy ("policy:..."). */
bool qi_placement_is_policy(const char *placement);
void qi_placement_policy_observe(qi_placement_policy *p, const qi_placement_times *t);
/* The policy's predicted seconds per decode step (NAN without a cost model). */
double qi_placement_policy_predict(qi_placement_policy *p, const struct qi_model *m, const qi_placement_devices *devs,
                                   const qi_placement_workload *wl, const qi_plan *plan);
const char *qi_placement_policy_name(const qi_placement_policy *p);
void qi_placement_policy_free(qi_placement_policy *p); /* NULL is a no-op */

/* The bytes plan p needs on device d for workload wl: its weight blocks
 * (qi_plan_block_bytes; the check takes the engine's figure where devs
 * has an engine), the working KV of the layers whose attention runs
 * there (each sequence's KV budget, or a sliding-window layer's window if
 * smaller, in whole KV blocks of 64 tokens, F16 keys and values; a split
 * layer's share by its ratio) and an activations estimate
 * (qi_placement_act_bytes); a streamed layer's weights stay on the host,
 * and the device it streams to holds two slots of the largest one's bytes
 * (engine/engine_stream.c). The CPU (device 0) runs on the model's own
 * mapping and is not counted: 0. */
size_t qi_placement_kv_bytes(const struct qi_model *m, const qi_placement_workload *wl, int layer);
size_t qi_placement_act_bytes(const struct qi_model *m, const qi_placement_workload *wl, int n_devices);
size_t qi_placement_need(const struct qi_model *m, const qi_placement_workload *wl, const qi_plan *p, int d);
/* Does plan p fit devs for workload wl, with `reserve` bytes kept free on
 * every device but the CPU? Each such device's activations, then its
 * blocks in order (a layer's attention with its KV) are added up; at the
 * first that passes the device's free bytes: QI_ERR_NOMEM "plan does not
 * fit device NAME: ... up to BLOCK ... N bytes short". A device with
 * capacity 0 has no limit. */
qi_status qi_placement_check(const struct qi_model *m, const qi_placement_devices *devs,
                             const qi_placement_workload *wl, const qi_plan *p, size_t reserve, qi_err *err);

/* ---- with an engine (engine_plan.c) ------------------------------------------------ */

/* The integration that needs no change to the engine: the engine is created
 * on its device list with a fixed placement (all-cpu), its devices are read
 * back, and the policy's plan is run from the next step on through
 * qi_engine_replan, which checks it again as it allocates. */
/* e's devices as the engine has them now: names, capacities, free bytes
 * (capacity - in use, so its activations are held: holds_act, but with
 * what the plan in force holds there, its weights and KV blocks, counted
 * free: the room for a whole new plan), device 0 the CPU and every other
 * an accelerator. */
void qi_placement_devices_of_engine(const qi_engine *e, qi_placement_devices *out);
/* p's plan for e's model (m, as given to qi_engine_create), devices and
 * workload wl, run through qi_engine_replan; cost may be NULL. A move the
 * engine refuses for room (it frees what leaves only once the rest has
 * arrived) is made, when only splits change, a few layers at a time
 * (halving the group at each refusal), and otherwise, or when even one
 * layer does not fit, in two: first to the plan that keeps on each device
 * only the blocks both plans put there, then to the new one. Errors:
 * those of qi_placement_policy_plan, then qi_engine_replan's. */
qi_status qi_placement_apply(qi_placement_policy *p, qi_engine *e, const struct qi_model *m,
                             const qi_placement_workload *wl, qi_engine_replan_cost *cost, qi_err *err);

/* Re-planning while an engine runs (engine_plan.c): between steps, tick()
 * hands the policy the block times the engine measured since the last
 * tick (opts.profile must be on; qi_engine_block_times) with the workload
 * they ran, then re-plans when the workload has left its bucket (the batch
 * or the context has moved past a power of `bucket` since the last plan)
 * or, for a policy with a cost model (predict), when the new plan's
 * predicted gain over the steps left (wl->gen_len) beats the time to move
 * the weights and KV it moves over the link, or, for a policy marked
 * replan_on_change, when its plan differs from the one in force. The
 * first tick always plans. */
typedef struct {
    qi_placement_policy *policy;
    double bucket;       /* > 1 (default 2) */
    int bucket_batch, bucket_ctx; /* the buckets of the last plan; -1: none yet */
    qi_placement_workload obs_wl; /* the workload since the last tick */
    bool have_obs;
    long ticks, replans, observed_steps;
    double moved_bytes;  /* over every re-plan */
    double predicted_s;  /* the policy's prediction of the last observed steps (NAN: none) */
    double measured_s;   /* their measured seconds per step (sum of block spans and copies) */
} qi_placement_ctl;
void qi_placement_ctl_init(qi_placement_ctl *c, qi_placement_policy *p, double bucket);
/* One tick between steps, wl the workload from now on (batch sequences at
 * context prompt_len, gen_len steps to go). *replanned (may be NULL) says
 * whether a new plan was applied. Errors: the policy's and the engine's
 * (qi_placement_apply's); the engine keeps its old plan then. */
qi_status qi_placement_ctl_tick(qi_placement_ctl *c, qi_engine *e, const struct qi_model *m,
                                const qi_placement_workload *wl, bool *replanned, qi_err *err);

#endif

/* registry.c - the placement policies by name, the wrappers every plan goes
 * through, and the memory check they apply.
 *
 * As in the KV slot (policies/kv/registry.c) the table is an X-macro list,
 * so that adding a policy is one line, and the wrappers are the only way to
 * a policy. The wrapper checks the plan a policy returns rather than
 * trusting each policy to size its own: the check is then written once, a
 * policy that miscounts (or a forced parameter that asks too much) is
 * refused with the device, the block and the bytes short, and the engine
 * is never handed a plan that fails half-way through its uploads.
 *
 * The memory a plan needs on a device is counted here, before any device
 * is opened, from the model's weights (qi_plan_block_bytes, the sizes the
 * engine uploads) and the workload's KV; the engine still checks what it
 * allocates. The activations are an estimate from the widest step: the
 * engine's activation arrays are those rows times the model's widths.
 */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "placement/placement_policy.h"
#include "qinfer/model.h"

/* flexgen needs GLPK (CMakeLists.txt builds it only where GLPK is found) */
#ifdef QI_HAVE_GLPK
#define QI_PLACEMENT_POLICY_LIST(X) X(static) X(gdcost) X(ratio) X(flexgen)
#else
#define QI_PLACEMENT_POLICY_LIST(X) X(static) X(gdcost) X(ratio)
#endif

#define QI_PLACEMENT_DECLARE(name) extern const qi_placement_policy_i qi_placement_##name##_policy;
#define QI_PLACEMENT_ENTRY(name) &qi_placement_##name##_policy,

QI_PLACEMENT_POLICY_LIST(QI_PLACEMENT_DECLARE)

const qi_placement_policy_i *const qi_placement_policies[] = {QI_PLACEMENT_POLICY_LIST(QI_PLACEMENT_ENTRY) NULL};

const qi_placement_policy_i *qi_placement_policy_find(const char *name) {
    if (!name) return NULL;
    for (const qi_placement_policy_i *const *it = qi_placement_policies; *it; it++)
        if (strcmp((*it)->name, name) == 0) return *it;
    return NULL;
}

qi_status qi_placement_policy_create(const char *name, const qi_params *params, qi_placement_policy **out,
                                     qi_err *err) {
    *out = NULL;
    const qi_placement_policy_i *pi = qi_placement_policy_find(name);
    if (!pi) {
        char list[256] = "";
        size_t len = 0;
        for (const qi_placement_policy_i *const *it = qi_placement_policies; *it; it++) {
            int w = snprintf(list + len, sizeof list - len, "%s%s", len ? ", " : "", (*it)->name);
            if (w < 0 || (size_t)w >= sizeof list - len) break;
            len += (size_t)w;
        }
        return QI_ERR(err, QI_ERR_INVALID, "unknown placement policy '%s' (known: %s)", name ? name : "(null)",
                      list);
    }
    if (pi->version != QI_PLACEMENT_POLICY_VERSION)
        return QI_ERR(err, QI_ERR_UNSUPPORTED,
                      "placement policy '%s' has interface version %u, the engine speaks %u", pi->name, pi->version,
                      QI_PLACEMENT_POLICY_VERSION);
    qi_placement_policy *p = NULL;
    qi_params none;
    qi_params_init(&none);
    qi_status st = pi->create(params ? params : &none, &p, err);
    if (st) return st;
    if (!p || p->iface != pi) {
        if (p && p->iface && p->iface->free) p->iface->free(p);
        return QI_ERR(err, QI_ERR_BACKEND, "placement policy '%s': create returned no policy of its own", pi->name);
    }
    *out = p;
    return QI_OK;
}

const char *qi_placement_policy_name(const qi_placement_policy *p) { return p ? p->iface->name : "(none)"; }

void qi_placement_policy_free(qi_placement_policy *p) {
    if (p) p->iface->free(p);
}

void qi_placement_policy_observe(qi_placement_policy *p, const qi_placement_times *t) {
    if (p->iface->observe && t) p->iface->observe(p, t);
}

int qi_placement_accel(const qi_placement_devices *devs) {
    for (int d = devs->n_devices - 1; d > 0; d--)
        if (devs->dev[d].kind != QI_PLACEMENT_DEV_CPU) return d;
    return -1;
}

bool qi_placement_is_policy(const char *placement) {
    return placement && strncmp(placement, "policy:", 7) == 0;
}

qi_status qi_placement_policy_from_spec(const char *spec, qi_placement_policy **out, qi_err *err) {
    *out = NULL;
    const char *s = qi_placement_is_policy(spec) ? spec + 7 : spec;
    char name[64];
    const char *colon = s ? strchr(s, ':') : NULL;
    const size_t len = !s ? 0 : colon ? (size_t)(colon - s) : strlen(s);
    if (len == 0 || len >= sizeof name)
        return QI_ERR(err, QI_ERR_INVALID, "placement '%s': policy:NAME[:K=V,...] names no policy", spec ? spec : "");
    memcpy(name, s, len);
    name[len] = 0;
    qi_params params;
    qi_params_init(&params);
    qi_status st = colon ? qi_params_parse(&params, colon + 1, err) : QI_OK;
    if (!st) st = qi_placement_policy_create(name, &params, out, err);
    return st;
}

double qi_placement_policy_predict(qi_placement_policy *p, const qi_model *m, const qi_placement_devices *devs,
                                   const qi_placement_workload *wl, const qi_plan *plan) {
    return p->iface->predict ? p->iface->predict(p, m, devs, wl, plan) : NAN;
}

/* ---- what a plan needs on a device ---------------------------------------------------- */

#define KV_BLOCK 64 /* tokens per KV block, as the cache allocates them (engine/kv.h) */

size_t qi_placement_kv_bytes(const qi_model *m, const qi_placement_workload *wl, int layer) {
    const qi_hparams *hp = &m->hp;
    long tokens = wl->kv_budget > 0 ? wl->kv_budget : (long)wl->prompt_len + wl->gen_len;
    if (hp->n_swa > 0 && m->layers[layer].swa && tokens > hp->n_swa) tokens = hp->n_swa;
    if (tokens <= 0) return 0;
    const size_t blocks = (size_t)((tokens + KV_BLOCK - 1) / KV_BLOCK);
    /* per KV head stream and block: keys and values, F16 */
    return (size_t)(wl->batch > 0 ? wl->batch : 1) * (size_t)hp->n_head_kv * blocks *
           (2 * KV_BLOCK * (size_t)hp->head_dim * sizeof(uint16_t));
}

size_t qi_placement_act_bytes(const qi_model *m, const qi_placement_workload *wl, int n_devices) {
    const qi_hparams *hp = &m->hp;
    const size_t B = (size_t)(wl->batch > 0 ? wl->batch : 1);
    size_t R = wl->step_rows > 0 ? (size_t)wl->step_rows : B * (size_t)(wl->prompt_len > 0 ? wl->prompt_len : 1);
    const size_t E = (size_t)hp->n_embd, qw = (size_t)hp->n_head * hp->head_dim,
                 kvw = (size_t)hp->n_head_kv * hp->head_dim, F = (size_t)hp->n_ff, H = (size_t)hp->n_head;
    /* the engine's arrays: x, xn, q, k, v, att, gate, up, and with a second
     * device the split-attention partials */
    const size_t widths[14] = {E, E > qw ? E : qw, qw, kvw, kvw, qw, F, F, qw, H, H, qw, H, H};
    const int n = n_devices > 1 ? 14 : 8;
    size_t total = 0;
    for (int i = 0; i < n; i++) total += (sizeof(float) * R * widths[i] + 63) / 64 * 64;
    return total;
}

/* The activations a device other than the CPU holds for plan p: a whole
 * step's rows, or under a block schedule one GPU batch's (its sequences'
 * share of the step's rows, engine/engine_zigzag.c). */
static size_t act_need(const qi_model *m, const qi_placement_workload *wl, const qi_plan *p) {
    if (!p->gpu_batch) return qi_placement_act_bytes(m, wl, p->n_devices);
    const long B = wl->batch > 0 ? wl->batch : 1;
    const long R = wl->step_rows > 0 ? wl->step_rows : B * (wl->prompt_len > 0 ? wl->prompt_len : 1);
    const long per = (R + B - 1) / B, gb = (long)p->gpu_batch * per;
    qi_placement_workload w = *wl;
    w.step_rows = (int)(gb < R ? gb : R);
    return qi_placement_act_bytes(m, &w, p->n_devices);
}

/* Whether block b is a streamed layer's: its weights stay on the host. */
static bool streamed(const qi_plan *p, int b) {
    return b > 0 && b < 2 * p->n_layer + 1 && p->layers[(b - 1) / 2].stream;
}

/* The staging of plan p's streamed layers on device d: two slots of the
 * largest streamed layer's bytes (engine/engine_stream.c). */
static size_t stream_need(const qi_model *m, const qi_plan *p, int d) {
    size_t most = 0;
    for (int l = 0; l < p->n_layer; l++) {
        if (!p->layers[l].stream || p->layers[l].attn_dev != d) continue;
        const size_t n = qi_plan_block_bytes(m, 1 + 2 * l) + qi_plan_block_bytes(m, 2 + 2 * l);
        most = n > most ? n : most;
    }
    return 2 * most;
}

/* Bytes of block b of plan p that fall on device d (a layer's attention
 * with its share of the KV; a streamed layer's KV alone). */
static size_t block_need(const qi_model *m, const qi_placement_devices *devs, const qi_placement_workload *wl,
                         const qi_plan *p, int d, int b) {
    size_t n = 0;
    if (qi_plan_block_dev(p, b) == d && !streamed(p, b))
        n = devs && devs->engine ? qi_engine_block_bytes(devs->engine, d, b) : qi_plan_block_bytes(m, b);
    if (b == 0 || b == 2 * p->n_layer + 1 || (b - 1) % 2) return n;
    const qi_plan_layer *y = &p->layers[(b - 1) / 2];
    const size_t kv = qi_placement_kv_bytes(m, wl, (b - 1) / 2);
    if (y->split > 0.0f) {
        const size_t far = (size_t)((double)kv * y->split + 0.5);
        if (y->attn_dev == d) n += kv - far;
        if (y->split_dev == d) n += far;
    } else if (y->attn_dev == d) {
        n += kv;
    }
    return n;
}

static bool uses(const qi_plan *p, int d) {
    for (int b = 0; b < qi_plan_n_blocks(p->n_layer); b++)
        if (qi_plan_block_dev(p, b) == d) return true;
    for (int l = 0; l < p->n_layer; l++)
        if (p->layers[l].split > 0.0f && p->layers[l].split_dev == d) return true;
    return false;
}

size_t qi_placement_need(const qi_model *m, const qi_placement_workload *wl, const qi_plan *p, int d) {
    if (d == 0 || !uses(p, d)) return 0;
    size_t n = act_need(m, wl, p) + stream_need(m, p, d);
    for (int b = 0; b < qi_plan_n_blocks(p->n_layer); b++) n += block_need(m, NULL, wl, p, d, b);
    return n;
}

qi_status qi_placement_check(const qi_model *m, const qi_placement_devices *devs, const qi_placement_workload *wl,
                             const qi_plan *p, size_t reserve, qi_err *err) {
    for (int d = 1; d < p->n_devices && d < devs->n_devices; d++) {
        const qi_placement_device *dv = &devs->dev[d];
        if (!dv->capacity || !uses(p, d)) continue;
        const size_t free = dv->free > dv->capacity ? dv->capacity : dv->free;
        const size_t room = free > reserve ? free - reserve : 0;
        size_t need = (dv->holds_act ? 0 : act_need(m, wl, p)) + stream_need(m, p, d);
        if (need > room)
            return QI_ERR(err, QI_ERR_NOMEM,
                          "plan does not fit device %s: its activations and streaming slots need %zu bytes of the "
                          "%zu free%s (%zu short)",
                          dv->name, need, room, reserve ? " after the reserve" : "", need - room);
        for (int b = 0; b < qi_plan_n_blocks(p->n_layer); b++) {
            need += block_need(m, devs, wl, p, d, b);
            if (need <= room) continue;
            size_t total = need;
            for (int c = b + 1; c < qi_plan_n_blocks(p->n_layer); c++) total += block_need(m, devs, wl, p, d, c);
            char name[40];
            return QI_ERR(err, QI_ERR_NOMEM,
                          "plan does not fit device %s: its blocks up to %s need %zu bytes of the %zu free%s (%zu "
                          "in all, %zu short)",
                          dv->name, qi_plan_block_name(p->n_layer, b, name, sizeof name), need, room,
                          reserve ? " after the reserve" : "", total, total - room);
        }
    }
    return QI_OK;
}

qi_status qi_placement_policy_plan(qi_placement_policy *p, const qi_model *m, const qi_placement_devices *devs,
                                   const qi_placement_workload *wl, qi_plan *out, qi_err *err) {
    const char *name = p->iface->name;
    const int L = m->hp.n_layer;
    *out = (qi_plan){0};
    if (devs->n_devices < 1 || devs->n_devices > QI_PLAN_MAX_DEVICES || devs->dev[0].kind != QI_PLACEMENT_DEV_CPU)
        return QI_ERR(err, QI_ERR_INVALID, "placement policy '%s': %d devices, the first must be the CPU", name,
                      devs->n_devices);
    if (wl->batch < 1 || wl->prompt_len < 0 || wl->gen_len < 0 || wl->kv_budget < 0 || wl->step_rows < 0)
        return QI_ERR(err, QI_ERR_INVALID,
                      "placement policy '%s': bad workload (batch %d, prompt %d, generated %d, KV budget %d)", name,
                      wl->batch, wl->prompt_len, wl->gen_len, wl->kv_budget);
    out->n_devices = devs->n_devices;
    for (int d = 0; d < devs->n_devices; d++) snprintf(out->devices[d], QI_PLAN_DEV_NAME, "%s", devs->dev[d].name);
    qi_status st = qi_plan_all_host(L, out, err);
    if (!st) st = p->iface->plan(p, m, devs, wl, out, err);
    if (!st && (out->n_layer != L || out->n_devices != devs->n_devices || !out->layers))
        st = QI_ERR(err, QI_ERR_BACKEND,
                    "placement policy '%s' broke its contract: a plan of %d layers over %d devices, asked %d over %d",
                    name, out->n_layer, out->n_devices, L, devs->n_devices);
    if (!st) {
        qi_err ve = {0};
        if (qi_plan_validate(out, &ve))
            st = QI_ERR(err, QI_ERR_BACKEND, "placement policy '%s' broke its contract: %s", name, ve.msg);
    }
    if (!st) st = qi_placement_check(m, devs, wl, out, 0, err);
    if (st) {
        qi_plan_free(out);
        *out = (qi_plan){0};
    }
    return st;
}

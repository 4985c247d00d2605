/* flexgen.c - FlexGen's cost model (Sheng et al., ICML 2023) solved as a
 * linear program with GLPK, and its answer turned into a qinfer plan.
 *
 * FlexGen chooses where a block of gbs x num_gb sequences keeps its
 * weights, KV cache and activations (shares on the GPU and on the CPU) by
 * minimising the block's time: per layer, a prefill and each decode step
 * last as long as the longest of their compute and the host-device copies
 * overlapped with it, under the peak memory of each tier. The shares enter
 * every term linearly, so the step times are maxima of linear functions:
 * written in epigraph form (an auxiliary time >= each term) the whole is a
 * linear program, solved here by GLPK's simplex. An outer search over the
 * GPU batch size and the number of GPU batches keeps the block of the best
 * throughput. qinfer has no disk tier: FlexGen's disk shares are 0 and its
 * disk copies vanish. The terms are written out in README.md.
 *
 * The plan: the weight share wg becomes whole layers held on the
 * accelerator (the last first, the head once every layer is there, as
 * static.c), and the KV share cg becomes each layer's attention split
 * (qi_plan_layer.split). The other layers run on the CPU (stream=0, the
 * default: llama.cpp's offload, as the placement ablation measured it), or
 * with stream=1 FlexGen's way: on the accelerator, their weights streamed
 * from host memory each time they run (qi_plan_layer.stream,
 * engine/engine_stream.c). With block=1 FlexGen's GPU batch size is the
 * plan's gpu_batch, and the engine runs a step as its zig-zag block
 * (engine/engine_zigzag.c): the layers outside, the GPU batches inside,
 * each layer's weights loaded once for all of them (block=0, the default:
 * a step runs the batch it is given whole). The registry's memory check
 * has the last word (a GPU batch's activations under a block): while the
 * mapped plan does not fit, a layer goes back to the CPU.
 *
 * An LP rather than a search over a grid of shares: the optimum of a
 * linear program lies on a vertex, which a grid misses, and the simplex
 * finds it in a few pivots; tests/unit/test_placement.c sets it against
 * the grid. The hardware comes from a profile (qinfer/hwprofile.h); the
 * share of each peak a kernel reaches (FlexGen fits its constants to runs)
 * is a parameter, eff_gpu, eff_cpu, eff_link, 1.0 until calibration.
 */
#include <glpk.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "placement/flexgen.h"
#include "placement/placement_policy.h"
#include "qinfer/hwprofile.h"
#include "qinfer/model.h"

extern const qi_placement_policy_i qi_placement_flexgen_policy;

/* ---- the cost model -------------------------------------------------------------------- */

#define ACT_BYTES 4.0 /* an activation element: the engine's arrays are F32 */
#define KV_BYTES 4.0  /* a KV width element: a key and a value, F16 each */

enum { WG, WC, CG, CC, HG, HC, TP, TG, N_COLS };

/* One linear term: coef[c] . x <= or >= rhs. */
typedef struct {
    double coef[N_COLS];
    double rhs;
} row;

/* The LP's rows for one block; times in seconds, bytes in bytes. */
typedef struct {
    row pre[3];  /* Tp >= ctog, gtoc, comp: as Tp - terms >= constant */
    row gen[3];  /* Tg >= ctog, gtoc, comp */
    row mem[4];  /* GPU prefill, GPU decode, CPU prefill, CPU decode: terms <= capacity - constant */
    double w_pre, w_gen; /* the objective: w_pre Tp + w_gen Tg */
} lp_rows;

static bool positive(double x) { return isfinite(x) && x > 0.0; }

static qi_status check_inputs(const qi_flexgen_inputs *in, qi_err *err) {
    const double pos[] = {in->layer_bytes, in->layer_flops, in->gpu_flops, in->gpu_bw, in->gpu_mem, in->cpu_flops,
                          in->cpu_bw, in->cpu_mem, in->h2d_bw, in->d2h_bw, in->eff_gpu, in->eff_cpu, in->eff_link};
    static const char *const names[] = {"layer bytes", "layer FLOPs", "GPU FLOP/s", "GPU bandwidth", "GPU memory",
                                        "CPU FLOP/s", "CPU bandwidth", "CPU memory", "host-to-device bandwidth",
                                        "device-to-host bandwidth", "eff_gpu", "eff_cpu", "eff_link"};
    for (size_t i = 0; i < sizeof pos / sizeof pos[0]; i++)
        if (!positive(pos[i]))
            return QI_ERR(err, QI_ERR_INVALID, "flexgen: %s is %g, not a positive number", names[i], pos[i]);
    if (in->n_layer < 1 || in->n_embd < 1 || in->q_width < 1 || in->kv_width < 1 || in->n_ff < 1 || in->n_head < 1 ||
        in->prompt_len < 0 || in->gen_len < 1 || in->kv_tokens < 1 || in->batch < 1 || in->gbs_max < 1 ||
        in->num_gb_max < 1)
        return QI_ERR(err, QI_ERR_INVALID,
                      "flexgen: bad shape or workload (layers %d, prompt %d, generated %d, KV tokens %d, batch %d)",
                      in->n_layer, in->prompt_len, in->gen_len, in->kv_tokens, in->batch);
    return QI_OK;
}

static void build_rows(const qi_flexgen_inputs *in, int gbs, int num_gb, lp_rows *r) {
    memset(r, 0, sizeof *r);
    const double L = in->n_layer, g = gbs, B = (double)gbs * num_gb, s = in->prompt_len, n = in->gen_len,
                 kt = in->kv_tokens, E = in->n_embd, qw = in->q_width, kw = in->kv_width, F = in->n_ff,
                 H = in->n_head, Wl = in->layer_bytes;
    const double link_h = in->h2d_bw * in->eff_link, link_d = in->d2h_bw * in->eff_link;
    const double gpu_f = in->gpu_flops * in->eff_gpu, gpu_b = in->gpu_bw * in->eff_gpu;
    const double cpu_f = in->cpu_flops * in->eff_cpu, cpu_b = in->cpu_bw * in->eff_cpu;
    const double s_kv = s < kt ? s : kt;               /* KV tokens a prompt leaves */
    const double kr = s + n / 2 < kt ? s + n / 2 : kt; /* KV tokens a decode step reads, on average */
    const double hid_p = B * s * E * ACT_BYTES, hid_g = B * E * ACT_BYTES; /* the block's hidden states */
    const double kv_home = B * kt * kw * KV_BYTES;                         /* one layer's KV */
    const double work = 2 * E + qw + 2 * kw + 2 * F; /* the widths of a GPU batch's working arrays */

    /* prefill: weights and hidden states held on the CPU come in, the KV
     * the CPU keeps and its hidden states go back, the GPU computes all */
    r->pre[0].coef[TP] = 1, r->pre[0].coef[WC] = -Wl / link_h, r->pre[0].coef[HC] = -hid_p / link_h;
    r->pre[1].coef[TP] = 1, r->pre[1].coef[CC] = -B * s_kv * kw * KV_BYTES / link_d,
    r->pre[1].coef[HC] = -hid_p / link_d;
    r->pre[2].coef[TP] = 1, r->pre[2].rhs = (B * s * in->layer_flops + 2 * B * s * s * qw) / gpu_f;
    /* decode: the same copies for one token; the matmuls on the GPU (the
     * slower of their FLOPs and reading the layer's weights, once a GPU
     * batch under the block schedule), attention where its KV is, reading
     * it all (4 qw FLOPs per KV token) */
    const double mm = in->blocked ? num_gb * fmax(g * in->layer_flops / gpu_f, Wl / gpu_b)
                                  : fmax(B * in->layer_flops / gpu_f, Wl / gpu_b);
    const double kv_read = B * kr * kw * KV_BYTES, att_flops = B * kr * 4 * qw;
    r->gen[0].coef[TG] = 1, r->gen[0].coef[WC] = -Wl / link_h, r->gen[0].coef[HC] = -hid_g / link_h;
    r->gen[1].coef[TG] = 1, r->gen[1].coef[CC] = -B * kw * KV_BYTES / link_d, r->gen[1].coef[HC] = -hid_g / link_d;
    r->gen[2].coef[TG] = 1, r->gen[2].coef[CG] = -fmax(kv_read / gpu_b, att_flops / gpu_f),
    r->gen[2].coef[CC] = -fmax(kv_read / cpu_b, att_flops / cpu_f), r->gen[2].rhs = mm;
    /* GPU: its weights and a double buffer for a streamed layer, its hidden
     * states (and a GPU batch's double buffer for those on the CPU), its KV,
     * a GPU batch's working arrays (attention scores included) */
    for (int k = 0; k < 2; k++) {
        const double rows = k == 0 ? s : 1, hid = k == 0 ? hid_p : hid_g;
        row *m = &r->mem[k];
        m->coef[WG] = L * Wl, m->coef[WC] = 2 * Wl, m->coef[HG] = hid, m->coef[HC] = 2 * g * rows * E * ACT_BYTES;
        m->coef[CG] = L * kv_home;
        m->rhs = in->gpu_mem - g * rows * work * ACT_BYTES - g * H * rows * (k == 0 ? s_kv : kt) * ACT_BYTES;
        /* CPU: its weights, hidden states and KV */
        m = &r->mem[2 + k];
        m->coef[WC] = L * Wl, m->coef[HC] = hid, m->coef[CC] = L * kv_home;
        m->rhs = in->cpu_mem;
    }
    r->w_pre = L;
    r->w_gen = L * (n - 1);
}

qi_status qi_flexgen_solve_lp(const qi_flexgen_inputs *in, int gbs, int num_gb, qi_flexgen_solution *out,
                              qi_err *err) {
    *out = (qi_flexgen_solution){0};
    qi_status st = check_inputs(in, err);
    if (st) return st;
    if (gbs < 1 || num_gb < 1)
        return QI_ERR(err, QI_ERR_INVALID, "flexgen: GPU batch size %d, %d GPU batches", gbs, num_gb);
    lp_rows r;
    build_rows(in, gbs, num_gb, &r);
    /* Conditioning: times in units of u (a few of the terms, so that the
     * time rows are of order 1) and each memory row divided by its
     * capacity; GLPK's tolerances are then relative in effect. */
    const double u = r.pre[2].rhs + r.gen[2].rhs - r.gen[0].coef[WC];
    for (int k = 0; k < 4; k++)
        if (r.mem[k].rhs < 0) return QI_ERR(err, QI_ERR_NOMEM, "flexgen: a GPU batch of %d does not fit", gbs);

    /* GLPK writes to the terminal unless told not to (its scaling, its
     * simplex); the previous setting is restored after */
    const int was = glp_term_out(GLP_OFF);
    glp_prob *lp = glp_create_prob();
    glp_set_obj_dir(lp, GLP_MIN);
    glp_add_cols(lp, N_COLS);
    for (int c = 0; c < N_COLS; c++) {
        if (c < TP)
            glp_set_col_bnds(lp, c + 1, GLP_DB, 0.0, 1.0);
        else
            glp_set_col_bnds(lp, c + 1, GLP_LO, 0.0, 0.0);
    }
    glp_set_obj_coef(lp, TP + 1, r.w_pre);
    glp_set_obj_coef(lp, TG + 1, r.w_gen);
    /* Ties: a share that no time term binds (weights whose copy hides
     * under the compute, say) could sit on either tier; a cost of 1e-9 of
     * the block's time scale on the CPU's shares keeps it on the GPU. */
    for (int c = WC; c <= HC; c += 2) glp_set_obj_coef(lp, c + 1, 1e-9 * (r.w_pre + r.w_gen));
    /* rows: 3 sums, 6 times, 4 memories; at most 4 nonzeros each */
    int ia[1 + 13 * N_COLS], ja[1 + 13 * N_COLS], nz = 0;
    double ar[1 + 13 * N_COLS];
    glp_add_rows(lp, 13);
    for (int k = 0; k < 3; k++) {
        glp_set_row_bnds(lp, k + 1, GLP_FX, 1.0, 1.0);
        for (int c = 2 * k; c < 2 * k + 2; c++) nz++, ia[nz] = k + 1, ja[nz] = c + 1, ar[nz] = 1.0;
    }
    for (int k = 0; k < 10; k++) {
        const row *w = k < 3 ? &r.pre[k] : k < 6 ? &r.gen[k - 3] : &r.mem[k - 6];
        const bool mem = k >= 6;
        const double sc = !mem ? 1.0 / u : k < 8 ? 1.0 / in->gpu_mem : 1.0 / in->cpu_mem;
        for (int c = 0; c < N_COLS; c++) {
            if (w->coef[c] == 0.0) continue;
            /* the time columns count in units of u already: their 1 stays */
            const double a = c == TP || c == TG ? w->coef[c] : w->coef[c] * sc;
            nz++, ia[nz] = 4 + k, ja[nz] = c + 1, ar[nz] = a;
        }
        if (mem)
            glp_set_row_bnds(lp, 4 + k, GLP_UP, 0.0, w->rhs * sc);
        else
            glp_set_row_bnds(lp, 4 + k, GLP_LO, w->rhs * sc, 0.0);
    }
    glp_load_matrix(lp, nz, ia, ja, ar);
    glp_scale_prob(lp, GLP_SF_AUTO);

    glp_smcp parm;
    glp_init_smcp(&parm);
    parm.msg_lev = GLP_MSG_OFF;
    parm.presolve = GLP_ON;
    const int ret = glp_simplex(lp, &parm);
    const int status = ret == 0 ? glp_get_status(lp) : 0;
    if (ret == GLP_ENOPFS || (ret == 0 && (status == GLP_NOFEAS || status == GLP_INFEAS)))
        st = QI_ERR(err, QI_ERR_NOMEM, "flexgen: no shares fit the memory for %d GPU batches of %d", num_gb, gbs);
    else if (ret != 0)
        st = QI_ERR(err, QI_ERR_BACKEND, "flexgen: GLPK's simplex failed (glp_simplex returned %d)", ret);
    else if (status != GLP_OPT)
        st = QI_ERR(err, QI_ERR_BACKEND, "flexgen: GLPK found no optimum (status %d)", status);
    if (!st) {
        double x[N_COLS];
        for (int c = 0; c < N_COLS; c++) x[c] = glp_get_col_prim(lp, c + 1);
        out->gbs = gbs, out->num_gb = num_gb;
        out->wg = x[WG], out->wc = x[WC], out->cg = x[CG], out->cc = x[CC], out->hg = x[HG], out->hc = x[HC];
        out->t_pre = x[TP] * u, out->t_gen = x[TG] * u;
        out->total_s = r.w_pre * out->t_pre + r.w_gen * out->t_gen;
        out->tokens_per_s = out->total_s > 0 ? (double)gbs * num_gb * in->gen_len / out->total_s : 0.0;
        out->n_lp = 1;
    }
    glp_delete_prob(lp);
    glp_term_out(was);
    return st;
}

qi_status qi_flexgen_solve(const qi_flexgen_inputs *in, qi_flexgen_solution *out, qi_err *err) {
    *out = (qi_flexgen_solution){0};
    qi_status st = check_inputs(in, err);
    if (st) return st;
    const int gbs_top = in->gbs_max < in->batch ? in->gbs_max : in->batch;
    int n_lp = 0;
    qi_flexgen_solution best = {0};
    for (int gbs = 1; gbs <= gbs_top; gbs = gbs < 4 ? gbs + 1 : 2 * gbs) {
        int fitted = 0;
        for (int nb = 1; nb <= in->num_gb_max && (long)gbs * nb <= in->batch; nb++) {
            qi_flexgen_solution s;
            qi_err e = {0};
            n_lp++;
            st = qi_flexgen_solve_lp(in, gbs, nb, &s, &e);
            if (st == QI_ERR_NOMEM) break; /* more sequences need more memory still */
            if (st) {
                QI_ERR(err, st, "%s", e.msg);
                return st;
            }
            fitted++;
            if (s.tokens_per_s > best.tokens_per_s) best = s;
        }
        if (!fitted) break; /* a larger GPU batch fits no better */
        if (gbs > INT_MAX / 2) break;
    }
    if (best.gbs == 0)
        return QI_ERR(err, QI_ERR_NOMEM, "flexgen: not even one sequence fits the memory the profile gives");
    best.n_lp = n_lp;
    *out = best;
    return QI_OK;
}

/* ---- the policy ------------------------------------------------------------------------ */

typedef struct {
    qi_placement_policy base;
    bool have_profile;
    qi_hwprofile prof;
    double eff_gpu, eff_cpu, eff_link;
    long gbs_max, num_gb_max;
    bool stream;              /* layers not held on the accelerator streamed to it (else on the CPU) */
    bool block;               /* the plan runs FlexGen's block schedule (gpu_batch = the solution's gbs) */
    qi_flexgen_solution last; /* the solution behind the last plan */
} flexgen_policy;

static qi_status flexgen_create(const qi_params *params, qi_placement_policy **out, qi_err *err) {
    static const char *const known[] = {"profile", "eff_gpu",    "eff_cpu", "eff_link",
                                        "gbs_max", "num_gb_max", "stream",  "block", NULL};
    double eg = 1.0, ec = 1.0, el = 1.0;
    long gbs_max = 256, num_gb_max = 64, stream = 0, block = 0;
    qi_status st = qi_params_check_known(params, "flexgen", known, err);
    if (!st) st = qi_params_double(params, "flexgen", "eff_gpu", 1.0, 1e-6, 1.0, &eg, err);
    if (!st) st = qi_params_double(params, "flexgen", "eff_cpu", 1.0, 1e-6, 1.0, &ec, err);
    if (!st) st = qi_params_double(params, "flexgen", "eff_link", 1.0, 1e-6, 1.0, &el, err);
    if (!st) st = qi_params_int(params, "flexgen", "gbs_max", 256, 1, 1 << 20, &gbs_max, err);
    if (!st) st = qi_params_int(params, "flexgen", "num_gb_max", 64, 1, 1 << 20, &num_gb_max, err);
    if (!st) st = qi_params_int(params, "flexgen", "stream", 0, 0, 1, &stream, err);
    if (!st) st = qi_params_int(params, "flexgen", "block", 0, 0, 1, &block, err);
    if (st) return st;
    flexgen_policy *p = qi_calloc(1, sizeof *p);
    if (!p) return QI_ERR(err, QI_ERR_NOMEM, "flexgen: out of memory");
    p->base.iface = &qi_placement_flexgen_policy;
    p->eff_gpu = eg, p->eff_cpu = ec, p->eff_link = el;
    p->gbs_max = gbs_max, p->num_gb_max = num_gb_max;
    p->stream = stream != 0;
    p->block = block != 0;
    const char *path = qi_params_get(params, "profile");
    if (path) {
        qi_err e = {0};
        st = qi_hwprofile_load(path, &p->prof, &e);
        if (!st && !p->prof.has_gpu)
            st = QI_ERR(&e, QI_ERR_INVALID, "%s: kind %s has no GPU to place blocks on", path, p->prof.kind);
        if (st) {
            qi_free(p);
            return QI_ERR(err, st, "flexgen: profile: %s", e.msg);
        }
        p->have_profile = true;
    }
    *out = &p->base;
    return QI_OK;
}

/* The layers' weight bytes (attention and MLP), all of them. */
static double layers_bytes(const qi_model *m) {
    double b = 0;
    for (int l = 0; l < m->hp.n_layer; l++)
        b += (double)qi_plan_block_bytes(m, 1 + 2 * l) + qi_plan_block_bytes(m, 2 + 2 * l);
    return b;
}

/* A split ratio to two decimals; below 0.01 none. */
static float split_of(double r) {
    const double q = round(r * 100.0) / 100.0;
    return q < 0.01 ? 0.0f : (float)(q > 1.0 ? 1.0 : q);
}

/* The plan of n layers (and the head when n = L + 1) on acc, the rest on
 * the CPU or streamed to acc, with the KV share cg as splits, and a block
 * schedule of GPU batches of gbs (0: none). */
static void set_plan(qi_plan *out, int acc, int n, double cg, bool splits, bool stream, int gbs) {
    const int L = out->n_layer;
    out->gpu_batch = gbs;
    for (int l = 0; l < L; l++) {
        qi_plan_layer *y = &out->layers[l];
        const bool held = l >= L - n, on_acc = held || stream;
        y->attn_dev = y->mlp_dev = on_acc ? acc : 0;
        y->stream = on_acc && !held;
        y->split = splits ? split_of(on_acc ? 1.0 - cg : cg) : 0.0f;
        y->split_dev = y->split > 0.0f ? (on_acc ? 0 : acc) : -1;
    }
    out->head_dev = n > L ? acc : 0;
}

static qi_status flexgen_plan(qi_placement_policy *pp, const qi_model *m, const qi_placement_devices *devs,
                              const qi_placement_workload *wl, qi_plan *out, qi_err *err) {
    flexgen_policy *p = (flexgen_policy *)pp;
    const qi_hparams *hp = &m->hp;
    const int L = hp->n_layer;
    const int acc = qi_placement_accel(devs);
    if (acc < 0) return QI_OK; /* all-cpu, as the wrapper made it */
    /* the hardware: profile=PATH, else the simulated machine's */
    const qi_hwprofile *hw = p->have_profile ? &p->prof : devs->profile;
    if (!hw || !hw->has_gpu)
        return QI_ERR(err, QI_ERR_INVALID,
                      "flexgen: profile=PATH (a hardware profile, engine/backend/sim/profiles/) is required with an "
                      "accelerator in the device list, unless the machine is simulated (--sim)");
    const qi_placement_device *dv = &devs->dev[acc];
    const double E = hp->n_embd, qw = (double)hp->n_head * hp->head_dim, kw = (double)hp->n_head_kv * hp->head_dim;
    qi_flexgen_inputs in = {
        .n_layer = L,
        .layer_bytes = layers_bytes(m) / L,
        .layer_flops = 2.0 * (E * qw * 2 + E * kw * 2 + 3.0 * E * hp->n_ff),
        .n_embd = hp->n_embd,
        .q_width = (int)qw,
        .kv_width = (int)kw,
        .n_ff = hp->n_ff,
        .n_head = hp->n_head,
        .prompt_len = wl->prompt_len,
        .gen_len = wl->gen_len > 0 ? wl->gen_len : 1,
        .kv_tokens = wl->kv_budget > 0 ? wl->kv_budget : wl->prompt_len + (wl->gen_len > 0 ? wl->gen_len : 1),
        .batch = wl->batch,
        .gpu_flops = hw->gpu_fp16_tensor.value,
        .gpu_bw = hw->gpu_mem_bw.value,
        .gpu_mem = dv->capacity ? (double)(dv->free < dv->capacity ? dv->free : dv->capacity) : hw->gpu_mem_bytes.value,
        .cpu_flops = hw->cpu_fp32.value,
        .cpu_bw = hw->cpu_mem_bw.value,
        .cpu_mem = hw->cpu_mem_bytes.value,
        .h2d_bw = hw->link_h2d_bw.value,
        .d2h_bw = hw->link_d2h_bw.value,
        .eff_gpu = p->eff_gpu,
        .eff_cpu = p->eff_cpu,
        .eff_link = p->eff_link,
        .gbs_max = (int)p->gbs_max,
        .num_gb_max = (int)p->num_gb_max,
        .blocked = p->block,
    };
    qi_flexgen_solution sol;
    qi_err e = {0};
    qi_status st = qi_flexgen_solve(&in, &sol, &e);
    if (st == QI_ERR_NOMEM) {
        /* nothing fits by the model: the weights and KV stay on the CPU */
        p->last = (qi_flexgen_solution){0};
        return QI_OK;
    }
    if (st) return QI_ERR(err, st, "%s", e.msg);
    p->last = sol;
    /* wg of the layers' bytes, last layers first */
    const double target = sol.wg * layers_bytes(m) * (1.0 + 1e-9);
    double got = 0;
    int n = 0;
    while (n < L) {
        const int l = L - 1 - n;
        const double b = (double)qi_plan_block_bytes(m, 1 + 2 * l) + qi_plan_block_bytes(m, 2 + 2 * l);
        if (got + b > target) break;
        got += b, n++;
    }
    if (n == L) n = L + 1; /* every layer: the head too */
    /* a budgeted KV policy evicts, which a split layer cannot: no splits then */
    const bool splits = wl->kv_budget == 0;
    for (; n >= 0; n--) {
        set_plan(out, acc, n, sol.cg, splits, p->stream, p->block ? sol.gbs : 0);
        if (qi_placement_check(m, devs, wl, out, 0, NULL) == QI_OK) return QI_OK;
    }
    set_plan(out, acc, 0, 0.0, false, false, 0); /* not even the KV's share fits: all-cpu */
    return QI_OK;
}

static void flexgen_free(qi_placement_policy *p) { qi_free(p); }

const qi_placement_policy_i qi_placement_flexgen_policy = {
    .version = QI_PLACEMENT_POLICY_VERSION,
    .name = "flexgen",
    .summary = "FlexGen's cost model as an LP (GLPK): weight share as layers on the accelerator, KV share as splits",
    .params = "profile=PATH (hardware profile, required with an accelerator), eff_gpu=1, eff_cpu=1, eff_link=1 "
              "(share of each peak reached), gbs_max=256, num_gb_max=64, stream=0 (1: the layers not held on the "
              "accelerator streamed to it, FlexGen's offload, rather than computed by the CPU), block=0 (1: a step "
              "runs as FlexGen's zig-zag block, GPU batches of the chosen GPU batch size inside each layer, the "
              "weights loaded once for all of them; FlexGen's whole policy is stream=1,block=1)",
    .create = flexgen_create,
    .plan = flexgen_plan,
    .free = flexgen_free,
};

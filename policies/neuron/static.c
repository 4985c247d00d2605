/* static.c - PowerInfer's offline neuron placement: an integer program over
 * neuron groups, solved once from the profile, fixed for the run.
 *
 * PowerInfer (Song et al., "PowerInfer: Fast Large Language Model Serving
 * with a Consumer-grade GPU", SOSP 2024, section 6) places each layer's
 * neurons, sorted by activation and cut into batches, by an integer linear
 * program that maximises the profiled activation kept on the GPU within
 * its memory. The formulation here, per (layer l, group g) a binary x:
 *
 *     maximise    sum_{l,g} mass[l,g] x[l,g]
 *     subject to  sum_{l,g} bytes[l,g] x[l,g] <= budget
 *                 x[l,g] in {0, 1}
 *     and, with min_groups = m > 0 (PowerInfer's communication threshold:
 *     a layer split at all must keep enough on the GPU to pay for the
 *     merge), per layer a binary y[l] with
 *                 x[l,g] <= y[l],   sum_g x[l,g] >= m y[l].
 *
 * One memory row, not one per layer: the layers share the fast device's
 * memory, so a per-layer cap would only forbid placements that fit. The
 * 0/1 bounds are explicit: PowerInfer's shipped solver declares its
 * variables integer without an upper bound, which lets a batch be counted
 * twice. Two kinds of row are added that cut only dominated solutions,
 * and so leave the optimum's value unchanged: within a layer, groups of
 * equal bytes come in falling mass (the wrapper ranks them), so choosing
 * group g + 1 without group g can be swapped for choosing g at no loss:
 * x[l,g] >= x[l,g+1] for those groups. They turn the knapsack's many
 * equivalent solutions into one and make branch and bound short.
 *
 * GLPK (a maintained MIP solver, packaged by Debian as libglpk-dev, and
 * already used by the flexgen placement) solves the LP relaxation first
 * (its value is an upper bound on every choice, reported beside the
 * answer), then branches with cover and MIR cuts. Its tolerances are
 * relative, so the choice it returns is checked again in integers here:
 * should its bytes pass the budget by a rounding slop, the row is
 * tightened by the excess and the program solved again. Groups with no
 * mass are dropped from the answer when min_groups is 0 (they add bytes
 * and nothing else).
 *
 * Limits: a knapsack row is where branch and bound is weakest. Small and
 * model-sized programs of one neuron size (SmolLM2: 30 x 6 groups) prove
 * their optimum in milliseconds; LLaMA-2-70B's 80 x 112 groups with three
 * neuron sizes do not close within seconds, so time_limit (10 s by
 * default) returns the best choice found, not proven optimal, with the
 * bound beside it (in the test, 2.5e-5 below the bound after 2 s).
 * Considered: CBC (Debian's coinor-cbc) is stronger on such rows, but
 * GLPK is already linked; a dynamic program over bytes is exact only
 * where the sizes share a large divisor.
 */
#include <glpk.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "neuron/neuron_policy.h"

typedef struct {
    qi_neuron_policy base;
    long min_groups;
    double time_limit_s;
    double gap;
} static_policy;

extern const qi_neuron_policy_i qi_neuron_static_policy;

static qi_status static_create(const qi_params *params, qi_neuron_policy **out, qi_err *err) {
    static const char *const known[] = {"min_groups", "time_limit", "gap", NULL};
    long min_groups = 0;
    double tl = 10.0, gap = 0.0;
    qi_status st = qi_params_check_known(params, "static", known, err);
    if (!st) st = qi_params_int(params, "static", "min_groups", 0, 0, QI_NEURON_MAX_FF, &min_groups, err);
    if (!st) st = qi_params_double(params, "static", "time_limit", 10.0, 0.001, 86400.0, &tl, err);
    if (!st) st = qi_params_double(params, "static", "gap", 0.0, 0.0, 1.0, &gap, err);
    if (st) return st;
    static_policy *p = qi_calloc(1, sizeof *p);
    if (!p) return QI_ERR(err, QI_ERR_NOMEM, "static: out of memory");
    p->base.iface = &qi_neuron_static_policy;
    p->min_groups = min_groups;
    p->time_limit_s = tl;
    p->gap = gap;
    *out = &p->base;
    return QI_OK;
}

/* One solve of the program with the memory row's bound `cap`. */
static qi_status solve_once(const qi_neuron_groups *g, int m, double time_limit_s, double gap, double cap, uint8_t *x,
                            qi_neuron_place_info *info, qi_err *err) {
    const int L = g->n_layer, NG = g->n_groups;
    const int nx = L * NG, ny = m > 0 ? L : 0;
    /* rows: memory; ordering (at most NG - 1 per layer); with m, per layer NG links and one count */
    const int max_rows = 1 + L * (NG - 1) + (m > 0 ? L * (NG + 1) : 0);
    const size_t max_nz = (size_t)nx + (size_t)2 * L * NG + (m > 0 ? (size_t)L * (3 * NG + 1) : 0) + 1;
    int *ia = qi_malloc(sizeof *ia * (max_nz + 1)), *ja = qi_malloc(sizeof *ja * (max_nz + 1));
    double *ar = qi_malloc(sizeof *ar * (max_nz + 1));
    if (!ia || !ja || !ar) {
        qi_free(ia);
        qi_free(ja);
        qi_free(ar);
        return QI_ERR(err, QI_ERR_NOMEM, "static: out of memory for the program of %d groups", nx);
    }
    const int was = glp_term_out(GLP_OFF);
    glp_prob *lp = glp_create_prob();
    glp_set_obj_dir(lp, GLP_MAX);
    glp_add_cols(lp, nx + ny);
    /* masses scaled by the largest, so GLPK's tolerances are relative to them */
    double top = 0.0;
    for (int i = 0; i < nx; i++) top = g->mass[i] > top ? g->mass[i] : top;
    for (int i = 0; i < nx; i++) {
        glp_set_col_kind(lp, i + 1, GLP_BV); /* binary: 0/1 bounds and integer */
        glp_set_obj_coef(lp, i + 1, top > 0.0 ? g->mass[i] / top : 0.0);
        if ((double)g->bytes[i] > cap) glp_set_col_bnds(lp, i + 1, GLP_FX, 0.0, 0.0);
    }
    for (int l = 0; l < ny; l++) glp_set_col_kind(lp, nx + l + 1, GLP_BV);
    glp_add_rows(lp, max_rows);
    int row = 1;
    size_t nz = 0;
    glp_set_row_bnds(lp, row, GLP_UP, 0.0, cap);
    for (int i = 0; i < nx; i++) ia[++nz] = row, ja[nz] = i + 1, ar[nz] = (double)g->bytes[i];
    row++;
    for (int l = 0; l < L; l++)
        for (int k = 0; k + 1 < NG; k++) {
            const int i = l * NG + k;
            if (g->bytes[i] != g->bytes[i + 1]) continue;
            glp_set_row_bnds(lp, row, GLP_LO, 0.0, 0.0); /* x[l,k] - x[l,k+1] >= 0 */
            ia[++nz] = row, ja[nz] = i + 1, ar[nz] = 1.0;
            ia[++nz] = row, ja[nz] = i + 2, ar[nz] = -1.0;
            row++;
        }
    if (m > 0)
        for (int l = 0; l < L; l++) {
            const int y = nx + l + 1;
            for (int k = 0; k < NG; k++) {
                glp_set_row_bnds(lp, row, GLP_UP, 0.0, 0.0); /* x - y <= 0 */
                ia[++nz] = row, ja[nz] = l * NG + k + 1, ar[nz] = 1.0;
                ia[++nz] = row, ja[nz] = y, ar[nz] = -1.0;
                row++;
            }
            glp_set_row_bnds(lp, row, GLP_LO, 0.0, 0.0); /* sum_k x - m y >= 0 */
            for (int k = 0; k < NG; k++) ia[++nz] = row, ja[nz] = l * NG + k + 1, ar[nz] = 1.0;
            ia[++nz] = row, ja[nz] = y, ar[nz] = -(double)m;
            row++;
        }
    const int n_rows = row - 1;
    if (n_rows < max_rows) {
        int *del = qi_malloc(sizeof *del * (size_t)(max_rows - n_rows + 1));
        if (del) {
            for (int r = n_rows + 1; r <= max_rows; r++) del[r - n_rows] = r;
            glp_del_rows(lp, max_rows - n_rows, del);
            qi_free(del);
        } else { /* leave them free rows: harmless */
            for (int r = n_rows + 1; r <= max_rows; r++) glp_set_row_bnds(lp, r, GLP_FR, 0.0, 0.0);
        }
    }
    glp_load_matrix(lp, (int)nz, ia, ja, ar);
    qi_free(ia);
    qi_free(ja);
    qi_free(ar);
    /* the relaxation first: its value bounds every choice, and branch and
     * bound starts from its basis */
    glp_scale_prob(lp, GLP_SF_AUTO);
    glp_smcp sp;
    glp_init_smcp(&sp);
    sp.msg_lev = GLP_MSG_OFF;
    const int lp_ret = glp_simplex(lp, &sp), lp_status = glp_get_status(lp);
    if (lp_ret != 0 || lp_status != GLP_OPT) {
        glp_delete_prob(lp);
        glp_term_out(was);
        return QI_ERR(err, QI_ERR_BACKEND,
                      "static: GLPK's simplex failed on the relaxation (glp_simplex %d, status %d)", lp_ret, lp_status);
    }
    info->bound = glp_get_obj_val(lp) * top;
    glp_iocp parm;
    glp_init_iocp(&parm);
    parm.msg_lev = GLP_MSG_OFF;
    parm.cov_cuts = GLP_ON;
    parm.mir_cuts = GLP_ON;
    parm.mip_gap = gap;
    parm.tm_lim = (int)fmin(time_limit_s * 1000.0, 2e9);
    const int ret = glp_intopt(lp, &parm);
    const int status = glp_mip_status(lp);
    qi_status st = QI_OK;
    if ((ret == 0 || ret == GLP_ETMLIM || ret == GLP_EMIPGAP) && (status == GLP_OPT || status == GLP_FEAS)) {
        for (int i = 0; i < nx; i++) x[i] = glp_mip_col_val(lp, i + 1) > 0.5;
        info->optimal = ret == 0 && status == GLP_OPT && gap == 0.0;
    } else if (ret == GLP_ETMLIM) {
        st = QI_ERR(err, QI_ERR_BACKEND, "static: GLPK found no placement within the time limit of %g s",
                    time_limit_s);
    } else {
        st = QI_ERR(err, QI_ERR_BACKEND, "static: GLPK's branch and bound failed (glp_intopt %d, status %d)", ret,
                    status);
    }
    glp_delete_prob(lp);
    glp_term_out(was);
    return st;
}

qi_status qi_neuron_mip_solve(const qi_neuron_groups *g, int min_groups, double time_limit_s, double gap,
                              uint8_t *x, qi_neuron_place_info *info, qi_err *err) {
    if (min_groups < 0) return QI_ERR(err, QI_ERR_INVALID, "static: min_groups %d (0 or more)", min_groups);
    if (!(gap >= 0.0 && gap <= 1.0)) return QI_ERR(err, QI_ERR_INVALID, "static: gap %g (in [0, 1])", gap);
    const int nx = g->n_layer * g->n_groups;
    const int m = min_groups < g->n_groups ? min_groups : g->n_groups;
    memset(x, 0, (size_t)nx);
    info->optimal = false;
    info->bound = NAN;
    if (g->budget == 0) { /* nothing fits: the empty choice, and it is optimal */
        info->optimal = true;
        info->bound = 0.0;
        return QI_OK;
    }
    double cap = (double)g->budget;
    for (int attempt = 0; attempt < 4; attempt++) {
        qi_status st = solve_once(g, m, time_limit_s > 0 ? time_limit_s : 1e9, gap, cap, x, info, err);
        if (st) return st;
        uint64_t used = 0;
        for (int i = 0; i < nx; i++) used += x[i] ? g->bytes[i] : 0;
        if (used <= (uint64_t)g->budget) {
            if (m == 0)
                for (int i = 0; i < nx; i++) x[i] = x[i] && g->mass[i] > 0.0;
            return QI_OK;
        }
        cap -= (double)(used - (uint64_t)g->budget);
    }
    return QI_ERR(err, QI_ERR_BACKEND, "static: GLPK's choices keep passing the budget of %lld bytes",
                  (long long)g->budget);
}

static qi_status static_place(qi_neuron_policy *pp, const qi_neuron_groups *g, uint8_t *x,
                              qi_neuron_place_info *info, qi_err *err) {
    const static_policy *p = (const static_policy *)pp;
    return qi_neuron_mip_solve(g, (int)p->min_groups, p->time_limit_s, p->gap, x, info, err);
}

static void static_free(qi_neuron_policy *p) { qi_free(p); }

const qi_neuron_policy_i qi_neuron_static_policy = {
    .version = QI_NEURON_POLICY_VERSION,
    .name = "static",
    .summary = "PowerInfer's placement: an integer program keeping the most profiled mass within the budget (GLPK)",
    .params = "min_groups=0 (per layer: none or at least this many groups), time_limit=10 (s; then the best "
              "found), gap=0 (relative)",
    .create = static_create,
    .place = static_place,
    .free = static_free,
};

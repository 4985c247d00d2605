/* scissorhands.c - Scissorhands (Liu et al., "Scissorhands: Exploiting the
 * Persistence of Importance Hypothesis for LLM KV Cache Compression at Test
 * Time", NeurIPS 2023).
 *
 * The persistence of importance: a token that mattered over the last few
 * steps will matter in the next ones. Scissorhands watches every token over
 * a history window of the last `history` steps and counts the steps in
 * which it was unimportant, i.e. drew less attention than the step's
 * average (the step's total weight over the working tokens it was spread
 * on; 1/t for one query over t tokens, the paper's threshold). select()
 * keeps the `recent` newest tokens and, of the rest, the `heavy` tokens with
 * the fewest unimportant steps (ties to the newer position), where heavy =
 * floor(budget * heavy fraction) as in h2o; the rest are dropped. A young
 * token has had fewer steps in which to be unimportant, so it is favoured,
 * as in the paper.
 *
 * The counts need each token's verdicts of the last `history` steps, not a
 * sum: a step leaving the window must leave the count. The one float of
 * per-token state the cache carries holds them as a bit mask (bit 0 the
 * newest step, set when unimportant), an integer below 2^24 and so exact in
 * a float; that caps `history` at 24 steps. The paper compresses in bursts
 * (when the cache fills, drop a share of it at once); here, like every
 * policy in this folder, the choice is remade each step within the budget.
 * Offloaded tokens, which it never makes, stay where they are.
 */
#include "kv/kv_policy.h"
#include "kv/rank_int.h"

#define SH_MAX_HISTORY 24

typedef struct {
    qi_kv_scored sc;
    int history;
    double heavy;
} sh_policy;

extern const qi_kv_policy_i qi_kv_scissorhands_policy;

static qi_status sh_create(const qi_params *params, int n_layer, qi_kv_policy **out, qi_err *err) {
    static const char *const known[] = {"history", "heavy", NULL};
    const char *who = "scissorhands";
    long history;
    double heavy;
    qi_status st = qi_params_check_known(params, who, known, err);
    if (!st) st = qi_params_int(params, who, "history", 16, 1, SH_MAX_HISTORY, &history, err);
    if (!st) st = qi_params_double(params, who, "heavy", 0.5, 0.0, 1.0, &heavy, err);
    if (!st) st = qi_kv_scored_new(&qi_kv_scissorhands_policy, sizeof(sh_policy), out, err);
    if (st) return st;
    sh_policy *p = (sh_policy *)*out;
    p->history = (int)history;
    p->heavy = heavy;
    return QI_OK;
}

/* The verdict of this step shifted into each working token's mask. */
static void sh_observe(qi_kv_policy *pp, qi_kv_view *v, const float *attn) {
    const sh_policy *p = (const sh_policy *)pp;
    double total = 0.0;
    int nw = 0;
    for (int i = 0; i < v->n; i++)
        if (v->tier[i] == QI_KV_WORKING) {
            total += attn[i];
            nw++;
        }
    if (nw == 0) return;
    const float mean = (float)(total / nw);
    const uint32_t keep = (1u << p->history) - 1u;
    for (int i = 0; i < v->n; i++) {
        if (v->tier[i] != QI_KV_WORKING) continue;
        uint32_t m = (uint32_t)v->score[i];
        m = ((m << 1) | (attn[i] < mean)) & keep;
        v->score[i] = (float)m;
    }
}

/* A token's rank: minus its unimportant steps, so the fewest rank first. */
static float sh_rank(float mask) {
    int c = 0;
    for (uint32_t m = (uint32_t)mask; m; m &= m - 1) c++;
    return -(float)c;
}

static void sh_select(qi_kv_policy *pp, const qi_kv_view *v, uint8_t *fate) {
    sh_policy *p = (sh_policy *)pp;
    int recent, heavy;
    qi_kv_split_recent(v, p->heavy, &recent, &heavy);
    qi_kv_rank_begin(v, false, fate);
    qi_kv_rank_recent_top(v, fate, &p->sc.scratch, recent, heavy, sh_rank, QI_KV_DROP);
}

static void sh_by_position(const qi_kv_policy *pp, int budget, int *oldest, int *newest) {
    *oldest = 0;
    *newest = qi_kv_recent_of(budget, ((const sh_policy *)pp)->heavy);
}

const qi_kv_policy_i qi_kv_scissorhands_policy = {
    .version = QI_KV_POLICY_VERSION,
    .name = "scissorhands",
    .summary = "Scissorhands: the newest tokens plus those least often below average attention lately",
    .params = "history=16,heavy=0.5",
    .create = sh_create,
    .observe = sh_observe,
    .select = sh_select,
    .free = qi_kv_scored_free,
    .rank = sh_rank,
    .by_position = sh_by_position,
};

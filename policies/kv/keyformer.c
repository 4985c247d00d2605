/* keyformer.c - Keyformer (Adnan et al., "Keyformer: KV Cache Reduction
 * through Key Tokens Selection for Efficient Generative Inference", MLSys
 * 2024).
 *
 * Keyformer is H2O's rule (the newest tokens plus the best accumulated
 * scores) with another score: evicting tokens skews the softmax towards
 * the survivors, so the accumulated weight is taken from a regularised
 * softmax, f_i = softmax((x_i + g_i) / tau), where x_i are the attention
 * logits, g_i Gumbel noise (which spreads the mass over tokens that the
 * plain softmax would all but ignore) and tau a temperature that rises
 * linearly from tau_init to tau_end over the generation (a flatter
 * distribution as more has been evicted). Each step adds f_i to token i's
 * score.
 *
 * The cache shows a policy softmax weights, not logits. For one query and
 * one head the logits are log-weights up to a constant, which the softmax
 * cancels; a stream's weights are summed over its group of query heads (and
 * a prompt chunk's queries), so the normalised sum p_i = w_i / sum w stands
 * for the distribution and x_i = log p_i. Then f_i is proportional to
 * p_i^(1/tau) * e^(g_i / tau). The noise is not random: g_i is the Gumbel
 * transform of a hash of (seed, layer, KV head, position, step position),
 * so a run is reproducible and a sequence's scores do not depend on what
 * else is in its batch. The temperature follows the position, tau = tau_init
 * + (tau_end - tau_init) * min(1, cur_pos / steps): the policy is not told
 * how long a generation will be, so `steps` stands for the paper's text
 * length (default 2048 positions, the contexts measured here).
 *
 * With noise=false and tau_init = tau_end = 1 the score is the accumulated
 * normalised weight, H2O's sum divided by each step's total, which ranks as
 * H2O's when every step's total is the same (one query, one head).
 * Tokens with no weight this step (offloaded ones, which it never makes)
 * get nothing. Evicted tokens are dropped.
 */
#include <math.h>

#include "kv/kv_policy.h"
#include "kv/rank_int.h"

typedef struct {
    qi_kv_scored sc;
    double heavy, tau_init, tau_end;
    long steps;
    uint64_t seed;
    bool noise;
} kf_policy;

extern const qi_kv_policy_i qi_kv_keyformer_policy;

static qi_status kf_create(const qi_params *params, int n_layer, qi_kv_policy **out, qi_err *err) {
    static const char *const known[] = {"heavy", "tau_init", "tau_end", "steps", "noise", "seed", NULL};
    const char *who = "keyformer";
    double heavy, tau_init, tau_end;
    long steps, seed;
    bool noise;
    qi_status st = qi_params_check_known(params, who, known, err);
    if (!st) st = qi_params_double(params, who, "heavy", 0.5, 0.0, 1.0, &heavy, err);
    if (!st) st = qi_params_double(params, who, "tau_init", 1.0, 0.01, 100.0, &tau_init, err);
    if (!st) st = qi_params_double(params, who, "tau_end", 2.0, 0.01, 100.0, &tau_end, err);
    if (!st) st = qi_params_int(params, who, "steps", 2048, 1, 1L << 30, &steps, err);
    if (!st) st = qi_params_bool(params, who, "noise", true, &noise, err);
    if (!st) st = qi_params_int(params, who, "seed", 1, 0, 1L << 30, &seed, err);
    if (!st) st = qi_kv_scored_new(&qi_kv_keyformer_policy, sizeof(kf_policy), out, err);
    if (st) return st;
    kf_policy *p = (kf_policy *)*out;
    p->heavy = heavy;
    p->tau_init = tau_init;
    p->tau_end = tau_end;
    p->steps = steps;
    p->noise = noise;
    p->seed = (uint64_t)seed;
    return QI_OK;
}

/* A uniform in (0, 1) from the token's identity: splitmix64's finaliser. */
static double kf_uniform(uint64_t seed, int layer, int kv_head, int32_t pos, int32_t step) {
    uint64_t z = seed * 0x9E3779B97F4A7C15ull ^ ((uint64_t)(uint32_t)layer << 48) ^
                 ((uint64_t)(uint32_t)kv_head << 40) ^ ((uint64_t)(uint32_t)pos << 20) ^ (uint64_t)(uint32_t)step;
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return ((double)(z >> 11) + 0.5) / 9007199254740992.0; /* (k + 0.5) / 2^53 */
}

static double kf_tau(const kf_policy *p, int32_t cur_pos) {
    const double t = cur_pos >= p->steps ? 1.0 : (double)cur_pos / (double)p->steps;
    return p->tau_init + (p->tau_end - p->tau_init) * t;
}

/* Token i's unnormalised f: e^((log p + g) / tau) = (p * e^g)^(1/tau), and
 * e^g = 1 / -log(u) for Gumbel noise g = -log(-log u). */
static double kf_value(const kf_policy *p, const qi_kv_view *v, int i, double p_i, double inv_tau) {
    if (p->noise) p_i /= -log(kf_uniform(p->seed, v->layer, v->kv_head, v->pos[i], v->cur_pos));
    return inv_tau == 1.0 ? p_i : pow(p_i, inv_tau);
}

/* f_i = softmax((log p_i + g_i) / tau) over the tokens with weight, added
 * to the scores. The values wait in the scratch between the sum and the
 * normalisation when it has room (it is sized in create() and grown only by
 * select()), otherwise they are computed twice; both ways round them to
 * float first, so the scores do not depend on how large the scratch has
 * grown, which depends on the streams this thread saw before. */
static void kf_observe(qi_kv_policy *pp, qi_kv_view *v, const float *attn) {
    kf_policy *p = (kf_policy *)pp;
    double total = 0.0;
    for (int i = 0; i < v->n; i++) total += attn[i] > 0 ? attn[i] : 0;
    if (!(total > 0)) return;
    const double inv_tau = 1.0 / kf_tau(p, v->cur_pos);
    qi_kv_item *keep = v->n <= p->sc.scratch.cap ? p->sc.scratch.items : NULL;
    double z = 0.0;
    for (int i = 0; i < v->n; i++) {
        if (!(attn[i] > 0)) continue;
        const float e = (float)kf_value(p, v, i, attn[i] / total, inv_tau);
        if (keep) keep[i].score = e;
        z += e;
    }
    for (int i = 0; i < v->n; i++) {
        if (!(attn[i] > 0)) continue;
        const double e = keep ? (double)keep[i].score : (double)(float)kf_value(p, v, i, attn[i] / total, inv_tau);
        v->score[i] += (float)(e / z);
    }
}

static void kf_select(qi_kv_policy *pp, const qi_kv_view *v, uint8_t *fate) {
    kf_policy *p = (kf_policy *)pp;
    int recent, heavy;
    qi_kv_split_recent(v, p->heavy, &recent, &heavy);
    qi_kv_rank_begin(v, false, fate);
    qi_kv_rank_recent_top(v, fate, &p->sc.scratch, recent, heavy, NULL, QI_KV_DROP);
}

static void kf_by_position(const qi_kv_policy *pp, int budget, int *oldest, int *newest) {
    *oldest = 0;
    *newest = qi_kv_recent_of(budget, ((const kf_policy *)pp)->heavy);
}

const qi_kv_policy_i qi_kv_keyformer_policy = {
    .version = QI_KV_POLICY_VERSION,
    .name = "keyformer",
    .summary = "Keyformer: the newest tokens plus the best scores of a Gumbel-regularised, tempered softmax",
    .params = "heavy=0.5,tau_init=1,tau_end=2,steps=2048,noise=true,seed=1",
    .create = kf_create,
    .observe = kf_observe,
    .select = kf_select,
    .free = qi_kv_scored_free,
    .by_position = kf_by_position,
};

/* qinfer.c - the Q-Infer multi-window policy (ACM TACO, DOI 10.1145/3764589).
 *
 * H2O keeps the globally heaviest tokens, and accumulated attention favours
 * old tokens (they have been scored for longer) and clusters: the survivors
 * often all come from one stretch of the context. Q-Infer spreads them:
 *
 *   sinks        the `sinks` lowest-position tokens are always kept (default
 *                4, as StreamingLLM; 0 off);
 *   recent       of the rest of the budget B' = budget - sinks, heavy =
 *                floor(B' * heavy) goes to scored tokens and recent = B' -
 *                heavy to the newest working tokens past every offloaded
 *                one (places the window cannot fill are scored);
 *   windows      the older region (neither sink nor recent) is cut into
 *                `windows` windows of equal position span, oldest to
 *                newest, and each keeps its best scores within a quota of
 *                heavy / windows, the remainder going one each to the
 *                newest windows; quota a window cannot fill (too few
 *                tokens) passes to the best leftovers of the whole region,
 *                so the budget is always used (1 window, the default, is
 *                H2O's rule: measured, 4 windows cost passkey retrieval a
 *                sixth of its keys at length 1024, since a prompt's vote
 *                concentrates on the key's stretch and a quota cuts it,
 *                and gave no better perplexity);
 *   full_layers  layers below it keep everything (exempt), since the first
 *                layers attend broadly and suffer most from eviction;
 *   offload      evicted tokens go to the offload tier, not away;
 *   recall       (off by default) offloaded tokens compete in select() on
 *                their scores like working ones, so one whose score rises
 *                comes back as KEEP; their scores rise only on probe steps,
 *                every probe_every-th decode step, when attention is also
 *                computed over the offload tier (probe_every=0: never).
 *                Measured, recall costs decode-mode perplexity on both
 *                models (a token recalled on one probe's weight displaces
 *                one kept on many steps'), with the plain sum and with
 *                decay=0.99, so the offload tier only holds what was
 *                evicted unless recall=true.
 *
 * Score is accumulated attention weight, as in H2O; with windows=1,
 * sinks=0, full_layers=0, offload=false, recall=false and decay=1 the fates
 * are exactly H2O's, which a unit test checks on random views. mean=true ranks
 * the scored region by accumulated weight divided by the steps a token has
 * been cached (cur_pos - pos + 1) instead, an ablation of the sum's bias
 * towards old tokens.
 *
 * decay (in (0, 1], default 0.99; 1 is the plain sum) makes the score a
 * decayed sum,
 * score = decay * score + attn at each step the token's weight is measured,
 * so attention from k steps back counts decay^k and a token that was heavy
 * long ago but is no longer attended to gives way to one that is attended to
 * now. A step is one observe() call (one token in decode; a prefill chunk
 * counts as one step). Only measured weights decay: working tokens every
 * step, offloaded tokens only on probe steps. Between probes an offloaded
 * token has no weight measured, not zero weight; decaying it there would
 * read the missing measurements as zeros: at decay 0.9 and probe_every=16 a
 * token drawing the same weight as a kept one would score about an eighth of
 * it even on the probe step where recall is decided, so recall would all but
 * stop. Decayed per measurement, a token drawing a steady weight a tends to
 * a / (1 - decay) in either tier, and the two compete on one scale; the
 * price is that an offloaded score is staler (it spans probe_every times as
 * many steps). With mean=true the decayed sum is divided by the steps
 * cached, as the plain sum is. The default 0.99 (attention about 100 steps
 * old counts a third) was measured better than the plain sum on SmolLM2,
 * on held-out chunks too, and together with recall=false on SmolLM2 and
 * Gemma 3 (policies/kv/README.md).
 *
 * catch_up (default false) puts an offloaded token's score on the working
 * tokens' scale at a probe: between probes a working token adds its weight
 * every step and an offloaded one nothing, so at the probe where recall is
 * decided an offloaded token drawing a kept one's weight trails it by the
 * probe_every - 1 steps it was not measured. With catch_up its weight on a
 * probe step counts for those steps too (probe_every times, or 1 + d + ...
 * + d^(probe_every - 1) with decay d), an estimate from one measurement.
 *
 * judge (default 32; 0: off) judges a prompt once it has been read, as
 * snapkv does: while more of the prompt follows nothing is evicted, and on
 * the prompt's last segment every token's score becomes the vote of the
 * prompt's last `judge` queries (their weights, max-pooled over `pool`
 * neighbours by position), so the choice of scored tokens is made by the
 * queries nearest the question rather than by the accumulated attention of
 * the text before it, chunk by chunk, before the question exists. On that
 * segment the recent window is the `judge` newest tokens and the rest of
 * the budget goes to the vote (judge_split=true; false keeps the usual
 * split, which gives half the budget to the filler before the question);
 * decoding then adds to the scores. The recent window's rule (only past
 * the newest offloaded token) keeps the next steps from taking back, by
 * position, the tokens the vote evicted: the window starts at the
 * judgement's own and grows with the generated tokens. Where every
 * eviction is of tokens older than the window, which is so while decoding
 * token by token (the window's start only moves forward) and with judge=0,
 * the rule is the plain `recent` newest tokens. Decode-mode perplexity
 * feeds no prompt, so judge changes nothing there.
 *
 * fetch (default 0.25; 0: off) makes the policy query-aware: the working
 * tier holds budget - round(fetch x budget) tokens by the rules above, and
 * on each decode step, before attention, fetch() chooses from the offload
 * tier the tokens this step's query scores best (SparQ's approximate
 * weights from the offload tier's key columns, on a share fetch_dims of
 * the components, default 0.125) to fill the rest of the budget, and
 * attention reads them with the working tokens. They stay offloaded: the
 * next step chooses again. The accumulated scores decide what is held;
 * the query decides what else is read. The evicted tokens' place is the
 * offload tier (host memory), so the fetch is what the tier is for: with
 * offload=false the default is off, and fetch>0 is refused. The cache
 * scores on the host and fetches for the CPU's attention only: on a run
 * with other or simulated devices the default is turned off (fetch_off()),
 * and an explicit fetch is refused there. Measured on both models at 50%
 * (policies/kv/README.md, "Fetching by the query").
 *
 * Windows are by position span rather than by equal token counts so that a
 * window means a stretch of the text: after eviction the older region is
 * sparse, and equal counts would let the surviving clusters define the
 * windows, which is the clustering this policy works against. The score
 * rank uses a scratch array sized in create() and grown in select() only
 * when a view holds more tokens than any before; if growing fails, select()
 * keeps the sinks and the newest tokens, a safe decision needing no memory.
 */
#include <limits.h>

#include <math.h>
#include <string.h>

#include "kv/kv_policy.h"
#include "kv/rank_int.h"
#include "kv/sparq_int.h"

/* fetch's default: the share of the budget fetched by the query */
#define QINFER_FETCH 0.25

typedef struct {
    qi_kv_policy base;
    int sinks, windows, full_layers, probe_every, judge, pool;
    double heavy;
    double fetch, fetch_dims; /* the budget's share fetched by the query; SparQ's share of components to score with */
    float decay; /* per measured step, (0, 1] */
    float catch_w; /* with catch_up, an offloaded token's weight on a probe step counts this many times */
    bool offload, recall, mean, judge_split, catch_up;
    bool fetch_set; /* fetch= given (not its default) */
    qi_kv_scratch scratch; /* room for 2m items: the region, and it by window */
    int *wstart;           /* [windows + 1] the windows' starts in that copy */
    qi_kv_sparq_buf w;     /* fetch's scratch: the offloaded tokens' approximate weights */
    qi_kv_scratch fitems;  /* fetch's ranking scratch */
    uint8_t *fmark;        /* [n] fetched, to write them in slot order; grown on use */
    size_t fmark_cap;
} qinfer_policy;

extern const qi_kv_policy_i qi_kv_qinfer_policy;

/* A working label in select(): a competitor out of the recent window's
 * reach, set aside while the window is taken. */
#define QI_KV_SET_ASIDE 0xFEu

static void qinfer_free(qi_kv_policy *pp) {
    qinfer_policy *p = (qinfer_policy *)pp;
    if (!p) return;
    qi_kv_scratch_fini(&p->scratch);
    qi_kv_scratch_fini(&p->fitems);
    qi_kv_sparq_buf_free(&p->w);
    qi_free(p->fmark);
    qi_free(p->wstart);
    qi_free(p);
}

static qi_status qinfer_create(const qi_params *params, int n_layer, qi_kv_policy **out, qi_err *err) {
    static const char *const known[] = {"sinks", "windows", "heavy", "full_layers", "offload",     "recall",   "probe_every",
                                        "mean",  "decay",   "judge", "pool",        "judge_split", "catch_up", "fetch",
                                        "fetch_dims", NULL};
    const char *who = "qinfer";
    long sinks, windows, full_layers, probe_every;
    double heavy;
    bool offload, recall;
    qi_status st = qi_params_check_known(params, who, known, err);
    if (!st) st = qi_params_int(params, who, "sinks", 4, 0, INT_MAX, &sinks, err);
    if (!st) st = qi_params_int(params, who, "windows", 1, 1, 65536, &windows, err);
    if (!st) st = qi_params_double(params, who, "heavy", 0.5, 0.0, 1.0, &heavy, err);
    if (!st) st = qi_params_int(params, who, "full_layers", 2 < n_layer ? 2 : n_layer, 0, n_layer, &full_layers, err);
    if (!st) st = qi_params_bool(params, who, "offload", true, &offload, err);
    if (!st) st = qi_params_bool(params, who, "recall", false, &recall, err);
    if (!st) st = qi_params_int(params, who, "probe_every", 16, 0, INT_MAX, &probe_every, err);
    bool mean;
    if (!st) st = qi_params_bool(params, who, "mean", false, &mean, err);
    double decay = 0.99;
    /* (0, 1]: the range check is inclusive, so 0 is refused here, with one
     * message for every bad value */
    if (!st && (qi_params_double(params, who, "decay", 0.99, 0.0, 1.0, &decay, NULL) || !(decay > 0)))
        st = QI_ERR(err, QI_ERR_INVALID, "qinfer: parameter 'decay' must be a number in (0, 1], got '%s'",
                    qi_params_get(params, "decay"));
    long judge, pool;
    bool judge_split;
    if (!st) st = qi_params_int(params, who, "judge", 32, 0, 65536, &judge, err);
    if (!st) st = qi_params_bool(params, who, "judge_split", true, &judge_split, err);
    if (!st) st = qi_kv_params_pool(params, who, &pool, err);
    bool catch_up;
    if (!st) st = qi_params_bool(params, who, "catch_up", false, &catch_up, err);
    double fetch = QINFER_FETCH, fetch_dims = 0.125;
    if (!st) st = qi_params_double(params, who, "fetch", QINFER_FETCH, 0.0, 0.9, &fetch, err);
    if (!st && (qi_params_double(params, who, "fetch_dims", 0.125, 0.0, 1.0, &fetch_dims, NULL) || !(fetch_dims > 0)))
        st = QI_ERR(err, QI_ERR_INVALID, "qinfer: parameter 'fetch_dims' must be a number in (0, 1], got '%s'",
                    qi_params_get(params, "fetch_dims"));
    if (!st && !offload && !qi_params_get(params, "fetch")) fetch = 0.0; /* nothing offloaded, nothing to fetch */
    if (!st && fetch > 0 && !offload)
        st = QI_ERR(err, QI_ERR_INVALID,
                    "qinfer: fetch=%g reads offloaded tokens, and offload=false keeps none (drop fetch= or "
                    "offload=false)",
                    fetch);
    if (st) return st;
    qinfer_policy *p = qi_calloc(1, sizeof *p);
    if (!p) return QI_ERR(err, QI_ERR_NOMEM, "qinfer: out of memory");
    p->base.iface = &qi_kv_qinfer_policy;
    p->sinks = (int)sinks;
    p->windows = (int)windows;
    p->heavy = heavy;
    p->full_layers = (int)full_layers;
    p->offload = offload;
    p->recall = recall;
    p->probe_every = (int)probe_every;
    p->mean = mean;
    p->decay = (float)decay;
    p->judge = (int)judge;
    p->judge_split = judge_split;
    p->pool = (int)pool;
    p->catch_up = catch_up;
    p->fetch = fetch;
    p->fetch_dims = fetch_dims;
    p->fetch_set = qi_params_get(params, "fetch") != NULL;
    /* the probe_every steps since the last probe, decayed as the working
     * tokens' were: 1 + d + ... + d^(k-1) */
    double cw = 0.0, dk = 1.0;
    for (long k = 0; k < (probe_every > 0 ? probe_every : 1) && k < 1 << 20; k++, dk *= decay) cw += dk;
    p->catch_w = (float)cw;
    if ((st = qi_kv_scratch_init(&p->scratch, QI_KV_SCRATCH_INIT, err)) ||
        (fetch > 0 && (st = qi_kv_scratch_init(&p->fitems, QI_KV_SCRATCH_INIT, err)))) {
        qinfer_free(&p->base);
        return st;
    }
    if (!(p->wstart = qi_malloc(sizeof *p->wstart * (size_t)(windows + 1)))) {
        qinfer_free(&p->base);
        return QI_ERR(err, QI_ERR_NOMEM, "qinfer: out of memory for %ld windows", windows);
    }
    *out = &p->base;
    return QI_OK;
}

static void qinfer_observe(qi_kv_policy *pp, qi_kv_view *v, const float *attn) {
    qinfer_policy *p = (qinfer_policy *)pp;
    if (v->obs) { /* the end of a prompt: its last queries' pooled vote replaces the scores */
        if (p->pool > 1 && qi_kv_scratch_reserve(&p->scratch, v->n))
            qi_kv_rank_pool_max(v, v->obs, p->pool, p->scratch.items, v->score);
        else
            for (int i = 0; i < v->n; i++) v->score[i] = v->obs[i];
        return;
    }
    /* at decay 1 this is the plain sum exactly: 1 * s is s, and a skipped
     * (unmeasured) token's weight is 0 */
    const float d = p->decay;
    if (p->catch_up && v->probed) { /* an offloaded token's weight stands in for the steps it was not measured */
        for (int i = 0; i < v->n; i++)
            v->score[i] = d * v->score[i] + (v->tier[i] == QI_KV_WORKING ? attn[i] : p->catch_w * attn[i]);
        return;
    }
    for (int i = 0; i < v->n; i++)
        if (v->probed || v->tier[i] == QI_KV_WORKING) v->score[i] = d * v->score[i] + attn[i];
}

static bool qinfer_exempt(const qi_kv_policy *pp, int layer) {
    return layer < ((const qinfer_policy *)pp)->full_layers;
}

static int qinfer_obs_window(const qi_kv_policy *pp) { return ((const qinfer_policy *)pp)->judge; }

static bool qinfer_probe(const qi_kv_policy *pp, long step) {
    const qinfer_policy *p = (const qinfer_policy *)pp;
    return p->offload && p->recall && p->probe_every > 0 && step > 0 && step % p->probe_every == 0;
}

/* Keep, in the older region it[0..r), the best scores of each window within
 * its quota, then hand unused quota to the best leftovers of the whole
 * region. Windows split the region's position span evenly; the items are
 * bucketed by window into by[0..r) (a counting sort) and each window's best
 * are selected, not sorted. */
static void keep_per_window(const qinfer_policy *p, const qi_kv_view *v, qi_kv_item *it, qi_kv_item *by, int r,
                            int heavy, uint8_t *fate) {
    const int W = p->windows, base = heavy / W, rem = heavy % W;
    int32_t pmin = it[0].pos, pmax = it[0].pos;
    for (int i = 1; i < r; i++) {
        if (it[i].pos < pmin) pmin = it[i].pos;
        if (it[i].pos > pmax) pmax = it[i].pos;
    }
    const int64_t span = (int64_t)pmax - pmin + 1;
    int *ws = p->wstart;
    for (int w = 0; w <= W; w++) ws[w] = 0;
    for (int i = 0; i < r; i++) ws[(int64_t)(it[i].pos - (int64_t)pmin) * W / span + 1]++;
    for (int w = 0; w < W; w++) ws[w + 1] += ws[w];
    for (int i = 0; i < r; i++) by[ws[(int64_t)(it[i].pos - (int64_t)pmin) * W / span]++] = it[i];
    /* ws[w] is now the end of window w, i.e. the start of w + 1 */
    int carry = 0;
    for (int w = W - 1; w >= 0; w--) {
        const int start = w > 0 ? ws[w - 1] : 0, cnt = ws[w] - start;
        const int quota = base + (w >= W - rem), take = quota < cnt ? quota : cnt;
        qi_kv_rank_top_by_score(by + start, cnt, take);
        for (int k = 0; k < take; k++) fate[by[start + k].slot] = QI_KV_KEEP;
        carry += quota - take;
    }
    if (carry > 0) {
        int left = qi_kv_rank_gather(v, fate, it);
        qi_kv_rank_top_by_score(it, left, carry);
        for (int k = 0; k < carry && k < left; k++) fate[it[k].slot] = QI_KV_KEEP;
    }
}

/* The working tokens kept at a budget B: B less the share fetch() may
 * fill, round(fetch x B), at least one. */
static int qinfer_held(const qinfer_policy *p, int budget) {
    const long f = lround(p->fetch * budget), h = budget - f;
    return h < 1 ? 1 : (int)h;
}

/* The sinks and the recent window at a layer budget: sinks capped at it,
 * and of B' = budget - sinks, B' - floor(B' x heavy) newest. */
static void qinfer_window(const qinfer_policy *p, int budget, int *sinks, int *recent) {
    *sinks = p->sinks < budget ? p->sinks : budget;
    *recent = budget - *sinks - qi_kv_heavy_count(budget - *sinks, p->heavy);
}

static void qinfer_by_position(const qi_kv_policy *pp, int budget, int *oldest, int *newest) {
    const qinfer_policy *p = (const qinfer_policy *)pp;
    qinfer_window(p, qinfer_held(p, budget), oldest, newest);
}

static void qinfer_select(qi_kv_policy *pp, const qi_kv_view *v, uint8_t *fate) {
    qinfer_policy *p = (qinfer_policy *)pp;
    if (v->layer < p->full_layers) {
        for (int i = 0; i < v->n; i++) fate[i] = QI_KV_KEEP;
        return;
    }
    const uint8_t evict = p->offload ? QI_KV_OFFLOAD : QI_KV_DROP;
    const int budget = qinfer_held(p, v->budget);
    int sinks, recent;
    qinfer_window(p, qinfer_held(p, qi_kv_view_layer_budget(v)), &sinks, &recent);
    if (sinks > budget) sinks = budget;
    if (recent > budget - sinks) recent = budget - sinks;
    if (p->judge > 0 && v->prompt_more) { /* judged at the prompt's end */
        qi_kv_rank_begin(v, false, fate);
        qi_kv_rank_finish(v, fate, QI_KV_KEEP);
        return;
    }
    int m = qi_kv_rank_begin(v, p->offload && p->recall, fate);
    qi_kv_rank_mark_by_pos(v, fate, sinks, false, QI_KV_KEEP);
    if (m <= budget || m > INT_MAX / 2 || !qi_kv_scratch_reserve(&p->scratch, 2 * m)) {
        qi_kv_rank_mark_by_pos(v, fate, budget - sinks, true, QI_KV_KEEP);
        qi_kv_rank_finish(v, fate, evict);
        return;
    }
    if (v->obs && p->judge > 0 && p->judge_split) /* the prompt's end: its observation window, the rest voted */
        recent = p->judge < budget - sinks ? p->judge : budget - sinks;
    /* The recent window: the newest working tokens newer than every
     * offloaded one, at most `recent`; places it cannot fill are scored.
     * While every eviction is of tokens older than the window (decoding
     * token by token: the window's start only moves forward) this is the
     * `recent` newest tokens. After a judged prompt the vote has evicted
     * tokens near its end, and a window by position would take back the
     * filler before the question in place of the voted tokens; this one
     * starts at the judgement's own window and grows with new tokens. */
    int32_t newest_off = INT32_MIN; /* without offload, whatever else is offloaded is not this policy's */
    for (int i = 0; p->offload && i < v->n; i++) {
        const int32_t q = v->pos[i];
        newest_off = v->tier[i] == QI_KV_OFFLOADED && q > newest_off ? q : newest_off;
    }
    int in_reach = 0;
    for (int i = 0; i < v->n; i++) { /* no branch on the fates, scattered over the slots */
        const bool u = fate[i] == QI_KV_UNDECIDED;
        const bool aside = u && (v->tier[i] == QI_KV_OFFLOADED || v->pos[i] <= newest_off);
        fate[i] = aside ? QI_KV_SET_ASIDE : fate[i];
        in_reach += u && !aside;
    }
    if (recent > in_reach) recent = in_reach;
    const int heavy = budget - sinks - recent;
    qi_kv_rank_mark_by_pos(v, fate, recent, true, QI_KV_KEEP);
    for (int i = 0; i < v->n; i++) fate[i] = fate[i] == QI_KV_SET_ASIDE ? QI_KV_UNDECIDED : fate[i];
    if (heavy > 0) {
        /* m > budget, so the older region holds r > heavy >= 1 tokens */
        qi_kv_item *it = p->scratch.items;
        int r = qi_kv_rank_gather(v, fate, it);
        if (p->mean) /* attention per step the token has been seen */
            for (int i = 0; i < r; i++) it[i].score /= (float)(v->cur_pos - it[i].pos + 1);
        keep_per_window(p, v, it, it + m, r, heavy, fate);
    }
    qi_kv_rank_finish(v, fate, evict);
}

static bool qinfer_fetching(const qi_kv_policy *pp) { return ((const qinfer_policy *)pp)->fetch > 0; }

static bool qinfer_fetch_off(qi_kv_policy *pp) {
    qinfer_policy *p = (qinfer_policy *)pp;
    if (p->fetch_set && p->fetch > 0) return false;
    p->fetch = 0.0;
    return true;
}

/* The k-th largest (1 <= k <= n) of w[0..n), a NaN counting below every
 * number, found in scratch a and b (n floats each) by a quickselect whose
 * partitions have no data-dependent branch: each element is written to
 * both ends of the other buffer and only one end advances, so a pass costs
 * the same whatever the weights (a branchy one mispredicts half its
 * comparisons on softmax weights). A pass splits off the elements above
 * the pivot, then those equal to it, so runs of equal weights (zeros that
 * underflowed) end it at once. */
static float kth_largest(const float *w, float *restrict a, float *restrict b, int n, int k) {
    for (int t = 0; t < n; t++) a[t] = w[t] == w[t] ? w[t] : -INFINITY;
    const float *cur = a; /* the candidates, in buffer a (in_a) or b */
    bool in_a = true;
    for (int m = n;;) {
        float *out = in_a ? b : a, *back = in_a ? a : b; /* the other buffer; cur's, free once read through */
        float p0 = cur[0], p1 = cur[m / 2], p2 = cur[m - 1]; /* the median of three */
        if (p0 < p1) { const float t = p0; p0 = p1; p1 = t; }
        if (p1 < p2) { const float t = p1; p1 = p2; p2 = t; }
        const float pv = p0 < p1 ? p0 : p1;
        int g = 0, l = m - 1;
        for (int i = 0; i < m; i++) { /* above the pivot to out's front, the rest to its back */
            const float e = cur[i];
            const int up = e > pv;
            out[g] = e;
            out[l] = e;
            g += up;
            l -= 1 - up;
        }
        if (k <= g) { /* among those above */
            cur = out;
            in_a = !in_a;
            m = g;
            continue;
        }
        k -= g;
        const float *rest = out + g;
        const int mr = m - g;
        int q = 0;
        l = mr - 1;
        for (int i = 0; i < mr; i++) { /* equal to the pivot to the front, below it to the back */
            const float e = rest[i];
            const int eq = e == pv;
            back[q] = e;
            back[l] = e;
            q += eq;
            l -= 1 - eq;
        }
        if (k <= q) return pv;
        k -= q;
        cur = back + q;
        m = mr - q;
    }
}

/* The offloaded tokens of the largest approximate weight for this step's
 * queries (SparQ's, qi_kv_sparq_weights, over the offload tier alone: its
 * softmax leaves out the working tokens, which every head shares, so the
 * ranking within a head is the one a softmax over both tiers would give
 * and only the heads' weighting of one another differs), the budget's
 * worth, in slot order. Without memory to score, none. */
static int qinfer_fetch(qi_kv_policy *pp, const qi_kv_pick_view *v, int *tokens) {
    qinfer_policy *p = (qinfer_policy *)pp;
    const int n = v->n;
    if (n < 1) return 0;
    if (v->budget >= n) {
        for (int i = 0; i < n; i++) tokens[i] = i;
        return n;
    }
    if ((size_t)n > p->fmark_cap) {
        uint8_t *m = qi_malloc((size_t)n);
        if (!m) return 0;
        qi_free(p->fmark);
        p->fmark = m;
        p->fmark_cap = (size_t)n;
    }
    const float *w = qi_kv_scratch_reserve(&p->fitems, n) ? qi_kv_sparq_weights(&p->w, v, p->fetch_dims, NULL, NULL)
                                                          : NULL;
    if (!w) return 0;
    /* The budget's best under qi_kv_rank_top_by_score's order with the
     * slot as the position (the higher slot wins a tie): the k-th best
     * weight (kth_largest), then those above it and, from the highest slot
     * down, as many equal to it as fit. A NaN weight (a model gone wrong)
     * is never fetched, and may leave fewer fetched. */
    _Static_assert(sizeof(qi_kv_item) >= 2 * sizeof(float), "the ranking scratch holds two floats an item");
    float *restrict x = (float *)(void *)p->fitems.items;
    uint8_t *restrict mark = p->fmark;
    const int k = v->budget;
    const float thr = kth_largest(w, x, x + n, n, k);
    int above = 0;
    for (int t = 0; t < n; t++) { /* in slot order, without a sort */
        mark[t] = w[t] > thr;
        above += mark[t];
    }
    for (int t = n - 1, tie = k - above; t >= 0 && tie > 0; t--)
        if (w[t] == thr) {
            mark[t] = 1;
            tie--;
        }
    int c = 0;
    for (int t = 0; t < n; t++) { /* no branch: a fifth of the tokens at random */
        tokens[c] = t;
        c += mark[t];
    }
    return c;
}

const qi_kv_policy_i qi_kv_qinfer_policy = {
    .version = QI_KV_POLICY_VERSION,
    .name = "qinfer",
    .summary = "Q-Infer: sinks, recent tokens and per-window heavy hitters; offload with recall",
    .params = "sinks=4,windows=1,heavy=0.5,full_layers=2,offload=true,recall=false,probe_every=16,mean=false,decay=0.99,"
              "judge=32,pool=7,judge_split=true,catch_up=false,fetch=0.25,fetch_dims=0.125",
    .create = qinfer_create,
    .observe = qinfer_observe,
    .select = qinfer_select,
    .exempt = qinfer_exempt,
    .probe = qinfer_probe,
    .obs_window = qinfer_obs_window,
    .free = qinfer_free,
    .by_position = qinfer_by_position,
    .fetch = qinfer_fetch,
    .fetching = qinfer_fetching,
    .fetch_off = qinfer_fetch_off,
};

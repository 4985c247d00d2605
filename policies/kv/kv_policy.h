/* kv_policy.h - the KV selection slot: which cached tokens stay in the
 * working tier (what attention reads), which move to the offload tier (host
 * memory, recallable) and which are dropped.
 *
 * The KV cache (engine/kv.c) keeps, for every (sequence, layer, KV head), a
 * stream of tokens. After each attention step it shows the policy that
 * stream through a qi_kv_view: the tokens' positions and tiers, the
 * attention weights they just received, and a per-token score array that
 * belongs to the policy (the cache moves each score with its token and
 * starts new tokens at 0). The policy updates its scores in observe(), then
 * decides every token's fate in select(). The cache applies the fates and
 * checks the budget.
 *
 * Attention weights are softmax outputs of this step's queries, summed over
 * the query heads of the KV head's group (grouped-query attention) and over
 * the step's query tokens of that sequence. Offloaded tokens receive weight
 * only on probe steps (see probe_every): there attention weights are also
 * computed over the offload tier, from one softmax over every held token,
 * so that recall can see an evicted token's importance rise; the attention
 * output itself always uses the working tier only.
 *
 * A policy sizes its state in create() and allocates nothing in observe()
 * or select() (a scratch array for ranking may grow in select() when a view
 * holds more tokens than any before; if growing fails the policy still
 * decides, without it). Per-token state lives in the view's score array,
 * and a policy keeps no state across streams beyond its parameters and its
 * scratch: the cache makes one policy object per host thread and gives each
 * a share of a step's streams, so calls on one object come one at a time
 * (its scratch is its own) while different objects run at once. A new
 * policy is one file plus one line in registry.c.
 *
 * A policy may instead choose what attention reads without evicting
 * anything (Quest): its pick() is called on decode steps before attention
 * with the step's queries and per-block key bounds (qi_kv_pick_view), and
 * returns the blocks of the working tier to read. Its budget counts the
 * tokens attention reads, not the tokens held; the cache never evicts for
 * it, and select() is not asked on the layers it picks for. A policy that
 * sets pick_tokens (SparQ) picks single tokens instead, from the keys
 * themselves, which the view also shows.
 *
 * An evicting policy may also fetch: its fetch() is called on decode steps
 * before attention with the step's queries and the offload tier's keys,
 * and returns offloaded tokens that attention reads this step besides the
 * working tier (they stay offloaded). Attention then reads at most the
 * budget in all: the policy keeps fewer working tokens to leave room.
 */
#ifndef QI_KV_POLICY_H
#define QI_KV_POLICY_H

#include <stdbool.h>
#include <stdint.h>

#include "qinfer/params.h"
#include "qinfer/status.h"

#define QI_KV_POLICY_VERSION 9u

enum { QI_KV_WORKING = 0, QI_KV_OFFLOADED = 1 };            /* tier[] values */
enum { QI_KV_KEEP = 0, QI_KV_OFFLOAD = 1, QI_KV_DROP = 2 }; /* fate[] values */

/* One (sequence, layer, KV head) stream, as shown to observe() and select().
 * Tokens are in the cache's slot order, which is not position order once a
 * policy has evicted anything. */
typedef struct {
    int layer, n_layer, kv_head;
    int n;                /* tokens held, both tiers */
    const int32_t *pos;   /* [n] positions */
    const uint8_t *tier;  /* [n] QI_KV_WORKING or QI_KV_OFFLOADED */
    float *score;         /* [n] the policy's per-token statistic (read-write) */
    int n_new;            /* tokens added this step (working tier); may be 0 */
    int32_t cur_pos;      /* the newest position in the sequence */
    int budget;           /* most working tokens select() may keep (>= 1) */
    bool probed;          /* this step's weights cover the offload tier too */
    /* Prompts, for policies with an observation window (obs_window()):
     * prompt_more is true on a prompt's segments while more of the prompt
     * follows (a prompt longer than one chunk); on the segment that ends a
     * prompt (more than one token, nothing pending after it) obs holds,
     * for each token, the weight the segment's last n_obs queries gave it
     * (n_obs = min(window, the segment's tokens); one softmax over both
     * tiers per query and head, summed over them, as on probe steps).
     * Otherwise obs is NULL and n_obs 0. */
    bool prompt_more;
    const float *obs;     /* [n] or NULL */
    int n_obs;
    /* The budget a policy sizes what it keeps by position (sinks, recent
     * window) from: the layer's budget. It equals budget except under ada=,
     * where budget is the head's share and only the part beyond the window
     * moves between heads. 0 (a view made by hand) means budget; read it
     * through qi_kv_view_layer_budget (rank_int.h). */
    int layer_budget;
} qi_kv_view;

/* One (sequence, layer, KV head) stream as shown to pick(), on a decode
 * step before its attention. The working tier is in position order (a
 * policy with pick() never evicts), cut into blocks of `block` slots; every
 * block is full but the last, which holds the newest token. The cache shows
 * its pages of 16 tokens (a quarter of its blocks of 64) as blocks, the
 * smallest piece its attention call reads with whole pages; to a policy
 * with pick_tokens every token is a block (block 1, tail 1) and bounds is
 * NULL (the cache keeps none for it). */
typedef struct {
    int layer, n_layer, kv_head;
    int group, D;         /* query heads sharing the KV head; values per head */
    const float *q;       /* [group][D] this step's queries, after RoPE (and any query scale) */
    float scale;          /* attention's score is scale * (q . k) (0, a view made by hand, means 1) */
    int n;                /* working tokens */
    int block;            /* tokens per block */
    int n_blocks;         /* ceil(n / block) */
    /* [n_blocks][2][D]: block b's element-wise minimum of its keys at
     * bounds + 2bD, its maximum at bounds + (2b + 1)D (the fp16 keys as
     * attention reads them, widened exactly) */
    const float *bounds;
    int newest;           /* the block holding the newest token: n_blocks - 1 */
    int budget;           /* most tokens attention may read (>= 1) */
    /* The newest blocks a pick may read over the budget (the pages of the
     * cache's newest block of 64 tokens; 0, a view made by hand, means 1:
     * the newest block alone). */
    int tail;
    /* The keys (NULL in a view made by hand for a policy that reads none):
     * token i's, D fp16 values, at k_blk[i >> k_shift] + (i & ((1 <<
     * k_shift) - 1)) * D, exactly what attention reads. */
    const uint16_t *const *k_blk;
    int k_shift;
    /* The same keys by columns, for a policy with pick_tokens (NULL for
     * the others): component d of token i's key at k_cols + ((i >> k_shift)
     * x D + d) x 2^k_shift + (i mod 2^k_shift); a block's slots past the
     * newest token hold zeros. A few components of every key are read
     * without the rest. */
    const uint16_t *k_cols;
    /* The newest k_tail tokens have no columns (0: every token has them):
     * their keys are read from k_blk. A fetch's view of the offload tier
     * shows its newest block, not yet full, this way (kv.h). */
    int k_tail;
    /* Out, optional (NULL: not asked): a token picker may write here, per
     * query head of the group, its estimate of the share of the head's
     * attention the tokens it picked hold; attention then gives the rest
     * to the mean of every held value (SparQ's reallocation). The cache
     * fills it with 1 (no reallocation) before the call. */
    float *mass;
} qi_kv_pick_view;

typedef struct qi_kv_policy qi_kv_policy;

typedef struct {
    uint32_t version; /* QI_KV_POLICY_VERSION */
    const char *name;    /* "h2o" */
    const char *summary; /* one line for --help */
    const char *params;  /* one line: the keys it takes with defaults, or "" */
    /* Validate params (unknown key, bad value: an error naming the policy
     * and the key) and build the policy. n_layer is the model's. */
    qi_status (*create)(const qi_params *params, int n_layer, qi_kv_policy **out, qi_err *err);
    /* After attention: attn[i] is token i's weight this step (0 for
     * offloaded tokens unless v->probed). Optional. */
    void (*observe)(qi_kv_policy *p, qi_kv_view *v, const float *attn);
    /* Decide fate[i] for i < v->n. At most v->budget KEEP unless exempt()
     * says the layer is exempt. A token never returns from QI_KV_DROP. */
    void (*select)(qi_kv_policy *p, const qi_kv_view *v, uint8_t *fate);
    /* Layers that keep their whole cache whatever the budget (full: every
     * layer; qinfer: the first full_layers). Optional: NULL means none. */
    bool (*exempt)(const qi_kv_policy *p, int layer);
    /* Probe the offload tier at this decode step (step counts from 1)?
     * Optional: NULL means never. */
    bool (*probe)(const qi_kv_policy *p, long step);
    void (*free)(qi_kv_policy *p);
    /* Judge a prompt once it has been read, by the queries at its end
     * (SnapKV's observation window): W > 0 asks the cache for the weights
     * of a prompt's last W queries (v->obs, on the segment that ends it),
     * and lets select() keep every token, over the budget, while more of
     * the prompt follows (v->prompt_more), so that nothing is evicted
     * before the end of the prompt, where the question usually is.
     * Optional: NULL or 0 means none (evict segment by segment). */
    int (*obs_window)(const qi_kv_policy *p);
    /* A stored score as a rank comparable across a layer's KV heads, higher
     * better (scissorhands: minus the unimportant steps its bit mask
     * counts). Read by the per-head budgets (ada=). Optional: NULL means
     * the score itself. */
    float (*rank)(float score);
    /* How many tokens select() keeps by position, whatever their scores, at
     * a layer budget of `budget`: *oldest the oldest (sinks), *newest the
     * newest (the recent window), on a layer that is not exempt. ada=
     * leaves every head these and shares out only the rest of the budget
     * (Ada-KV keeps each head's observation window). Optional: NULL means
     * none (tova: every place goes by score). */
    void (*by_position)(const qi_kv_policy *p, int budget, int *oldest, int *newest);
    /* Query-aware selection: on a decode step, before attention, the blocks
     * attention reads, written to blocks[] (room for v->n_blocks), their
     * count returned. They must be distinct and in range, include
     * v->newest, and hold at most v->budget tokens unless they all lie in
     * the newest v->tail blocks. A policy with pick() never evicts (its select() keeps
     * every token and is not called on the layers it picks for), and its
     * budget counts the tokens read. Prompts (several tokens a step) read
     * the whole cache. Optional: NULL means the policy evicts instead. */
    int (*pick)(qi_kv_policy *p, const qi_kv_pick_view *v, int *blocks);
    /* pick() chooses single tokens, not pages: its view's blocks are tokens
     * and it scores them from the keys (SparQ); the cache keeps no key
     * bounds and points attention at each chosen row. */
    bool pick_tokens;
    /* Query-aware fetch for an evicting policy: on a decode step, before
     * attention, the offloaded tokens attention reads besides the whole
     * working tier, written to tokens[] (room for v->n) in ascending
     * order, their count returned (0 to v->budget). The view shows the
     * offload tier as pick_tokens' views show a working tier (tokens as
     * blocks, slot order, not position order; k_blk and k_cols its keys;
     * newest, tail and mass unused), and its budget is what the layer's
     * budget leaves beside the working tokens. Fetched tokens stay
     * offloaded: the next step chooses again. Prompts fetch nothing.
     * Optional: NULL means none; fetching(), when given, says whether this
     * policy object fetches at all (a parameter may turn it off, and then
     * the cache runs as without fetch()). */
    int (*fetch)(qi_kv_policy *p, const qi_kv_pick_view *v, int *tokens);
    bool (*fetching)(const qi_kv_policy *p);
    /* The cache cannot fetch on this run (it scores offloaded tokens on the
     * host, and some attention may run elsewhere): a policy that fetches
     * by default turns fetching off for good (fetching() false, the whole
     * budget kept working) and returns true; one asked to fetch by a
     * parameter returns false, and the cache refuses the run. Optional:
     * NULL means it cannot be turned off. */
    bool (*fetch_off)(qi_kv_policy *p);
} qi_kv_policy_i;

/* Every policy object starts with its interface. The fields after it
 * belong to the registry (a policy's create() leaves them zero): options
 * any policy takes, applied by the wrappers. */
struct qi_kv_policy {
    const qi_kv_policy_i *iface;
    /* pyramid=B (PyramidKV's layer budgets), in [0, 1): the budgeted layers
     * (those not exempt), lowest first, get budgets falling linearly from
     * (1 + B) x budget to (1 - B) x budget, rounded so that their sum is
     * the layers' count x budget; 0 is the same budget on every layer. */
    double pyramid;
    /* ada=F (Ada-KV's head budgets), in [0, 1]: a (sequence, layer)'s KV
     * heads are decided together. Each head keeps the tokens its policy
     * keeps by position (by_position()) and of the rest of the budget S is
     * sure of floor((1 - F) x S) tokens (at least one); what is left of
     * the layer's heads x budget goes to the best ranks over all heads'
     * other tokens; 0 is the same budget for every head. Only for
     * policies with observe(). */
    double ada;
    int n_layer;
    struct qi_kv_item *ada_items; /* the ranking scratch of ada=, grown on use */
    int ada_cap;
};

/* registry.c: the policies, NULL-terminated. */
extern const qi_kv_policy_i *const qi_kv_policies[];

/* The policy called name, or NULL. */
const qi_kv_policy_i *qi_kv_policy_find(const char *name);

/* Create by name; an unknown name is an error listing the known ones.
 * The registry's own options (pyramid=, ada=) are taken out of params before
 * the policy sees them. */
qi_status qi_kv_policy_create(const char *name, const qi_params *params, int n_layer, qi_kv_policy **out,
                              qi_err *err);
/* The wrappers the cache calls: they check the interface's optional
 * members. qi_kv_policy_select also verifies the result (every fate written
 * and in range, the budget respected unless the layer is exempt) and
 * returns QI_ERR_BACKEND naming the policy if the policy broke its
 * contract, QI_ERR_INVALID for a bad view (n < 0, budget < 1). The budget
 * does not bind while v->prompt_more for a policy with an observation
 * window. That a DROP is never undone needs no check: the cache forgets a
 * dropped token. */
void qi_kv_policy_observe(qi_kv_policy *p, qi_kv_view *v, const float *attn);
qi_status qi_kv_policy_select(qi_kv_policy *p, const qi_kv_view *v, uint8_t *fate, qi_err *err);
bool qi_kv_policy_exempt(const qi_kv_policy *p, int layer);
/* The budget select() works to on this layer: v->budget, or its share under
 * pyramid=. qi_kv_policy_select shows the policy that budget and holds it
 * to it. */
int qi_kv_policy_layer_budget(const qi_kv_policy *p, int layer, int budget);
bool qi_kv_policy_probe(const qi_kv_policy *p, long step);
/* With ada= a (sequence, layer)'s KV heads are decided together, by
 * qi_kv_policy_decide over all of them, not stream by stream. */
bool qi_kv_policy_heads_together(const qi_kv_policy *p);
/* observe() then select() for the n streams of one (sequence, layer), one
 * per KV head, v[h] showing head h (attn[h] its weights, fate[h] its
 * decision; every v[h].budget the nominal budget). Without ada= (or with
 * n = 1) it is qi_kv_policy_observe and qi_kv_policy_select on each; with
 * it, after observing all, the layer's budget (pyramid= applied) times n
 * is shared among the heads (qi_kv_rank_ada_budgets in rank_int.h: each
 * head keeps its policy's position window, the rest is shared) and each
 * select() is shown and held to its head's share, with layer_budget the
 * layer's. If the scratch for that cannot grow, every head gets the
 * layer's budget. Errors as qi_kv_policy_select's, for the first head that
 * fails. */
qi_status qi_kv_policy_decide(qi_kv_policy *p, qi_kv_view *v, int n, const float *const *attn, uint8_t *const *fate,
                              qi_err *err);
int qi_kv_policy_obs_window(const qi_kv_policy *p); /* 0 if none */
/* Whether the policy picks blocks (has pick()): its budget counts attended
 * tokens, and it never evicts. */
bool qi_kv_policy_picks(const qi_kv_policy *p);
/* Whether what it picks are single tokens (pick_tokens). */
bool qi_kv_policy_picks_tokens(const qi_kv_policy *p);
/* pick() shown v with its layer's budget (pyramid= applied) and checked:
 * the blocks distinct, in range, v->newest among them, their tokens within
 * that budget unless they all lie in the newest v->tail blocks (at least
 * v->newest alone). blocks[] (room for
 * v->n_blocks) receives them in ascending order, *n_out their count.
 * bounds must be set unless the policy picks tokens, and then k_blk and
 * k_cols must be.
 * QI_ERR_BACKEND naming the policy if it broke that contract,
 * QI_ERR_INVALID for a bad view (no blocks, a budget below 1, newest not
 * the last block), QI_ERR_UNSUPPORTED for a policy without pick(). */
qi_status qi_kv_policy_pick(qi_kv_policy *p, const qi_kv_pick_view *v, int *blocks, int *n_out, qi_err *err);
/* Whether the policy fetches offloaded tokens for attention (fetch(), and
 * fetching() true if given). */
bool qi_kv_policy_fetches(const qi_kv_policy *p);
/* fetch() shown v (the offload tier of one stream; v->budget the tokens it
 * may add, 0 or more) and checked: at most v->budget tokens, distinct, in
 * range. tokens[] (room for v->n) receives them in ascending order, *n_out
 * their count (0 without a call when v->n or v->budget is 0). k_blk and
 * k_cols must be set. QI_ERR_BACKEND naming the policy if it broke that
 * contract, QI_ERR_INVALID for a bad view, QI_ERR_UNSUPPORTED for a policy
 * that does not fetch. */
qi_status qi_kv_policy_fetch(qi_kv_policy *p, const qi_kv_pick_view *v, int *tokens, int *n_out, qi_err *err);
/* fetch_off(), if the policy has it: true if fetching is now off. */
bool qi_kv_policy_fetch_off(qi_kv_policy *p);
const char *qi_kv_policy_name(const qi_kv_policy *p);
void qi_kv_policy_free(qi_kv_policy *p); /* NULL is a no-op */

#endif

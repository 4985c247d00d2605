/* lua_measure.c - the measured helpers of the qinfer Lua module:
 * generate, perplexity and throughput, each one C call over the engine, so
 * that what is timed is the engine and not the Lua loop around it, plus the
 * clock and machine facts experiments label their figures with.
 *
 *   qinfer.generate(engine_or_model, prompt, {n, greedy, temp, ...}) -> text, ids, timing
 *   qinfer.perplexity(model, corpus, {ctx, chunks, decode, batch, kv_...}) -> table
 *   qinfer.throughput(model, {batch, n_gen, prompt, kv_...}) -> table
 *   qinfer.now() -> monotonic seconds; qinfer.sleep(seconds); qinfer.sysinfo() -> table
 *
 * generate repeats the loop of `qinfer generate` (tokenisation, engine size,
 * sampler), so its greedy text is byte-identical to the command's;
 * perplexity calls qi_perplexity_engine as `qinfer ppl` does. Temporaries
 * live in a to-be-closed scratch (lua_int.h): a Lua error raised midway
 * frees the engine, its threads and the token arrays at once.
 */
#include <errno.h>
#include <lauxlib.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "lua_int.h"
#include "placement/placement_policy.h"
#include "qinfer/measure.h"
#include "qinfer/model_files.h"
#include "qinfer/perplexity.h"
#include "qinfer/sysinfo.h"
#include "qinfer/tokenizer.h"

/* The engine of a helper: the one at idx (its positions in *n_ctx), or a new
 * one over the model at idx (owned by s) with the engine options of opts. */
static qi_engine *helper_engine(lua_State *L, int idx, int opts, lq_scratch *s, const qi_model **m, int max_seqs,
                                int *n_ctx) {
    lq_engine_ud *eu = luaL_testudata(L, idx, LQ_ENGINE);
    if (eu) {
        static const char *const eng_keys[] = {"n_ctx", LQ_ENGINE_KEYS, NULL};
        for (int i = 0; eng_keys[i]; i++) {
            bool given = lq_opt_get(L, opts, eng_keys[i]) != LUA_TNIL;
            lua_pop(L, 1);
            if (given)
                luaL_argerror(L, opts, lua_pushfstring(L, "option '%s' applies only when a model is given, not an "
                                                          "engine", eng_keys[i]));
        }
        if (!eu->e) luaL_argerror(L, idx, "engine is closed");
        *m = eu->mb->m;
        *n_ctx = eu->n_ctx;
        return eu->e;
    }
    lq_model_ud *mu = luaL_testudata(L, idx, LQ_MODEL);
    if (!mu) luaL_typeerror(L, idx, "qinfer engine or model");
    if (!mu->mb) luaL_argerror(L, idx, "model is closed");
    lq_eopts eo;
    lq_read_engine_opts(L, opts, opts, &eo, mu->mb);
    eo.o.max_seqs = max_seqs;
    eo.o.n_ctx = *n_ctx;
    qi_err err = {0};
    if (qi_engine_create(mu->mb->m, &eo.o, &s->engine, &err)) lq_fail(L, &err);
    lq_note_plan(L, s->engine);
    s->mb = mu->mb;
    mu->mb->refs++;
    *m = mu->mb->m;
    return s->engine;
}

static const qi_model *arg_model(lua_State *L, int idx) {
    lq_engine_ud *eu = luaL_testudata(L, idx, LQ_ENGINE);
    if (eu) return lq_check_engine(L, idx)->mb->m;
    lq_model_ud *mu = luaL_testudata(L, idx, LQ_MODEL);
    if (!mu) luaL_typeerror(L, idx, "qinfer engine or model");
    return lq_check_model(L, idx)->m;
}

/* qinfer.generate(engine_or_model, prompt, opts) -> text, ids, timing
 * The loop of `qinfer generate`: the same tokenisation, engine sizes and
 * sampler, so greedy output is byte-identical to `qinfer generate --temp 0`.
 * With an engine, one sequence is added for the call and removed after. */
static int l_generate(lua_State *L) {
    static const char *const keys[] = {"n", "greedy", "temp", "top_k", "top_p", "min_p", "repeat_penalty",
                                       "repeat_last_n", "seed", "ignore_eos", "n_ctx", LQ_ENGINE_KEYS, NULL};
    const qi_model *m = arg_model(L, 1);
    if (lua_type(L, 2) != LUA_TSTRING && lua_type(L, 2) != LUA_TTABLE) luaL_typeerror(L, 2, "string or table of ids");
    lq_opts_check(L, 3, 3, keys);
    int n_predict = (int)lq_opt_int(L, 3, 3, "n", 128, 0, 1 << 20);
    qi_sampler_params sp = qi_sampler_defaults();
    bool greedy = lq_opt_bool(L, 3, 3, "greedy", true);
    sp.temp = (float)lq_opt_num(L, 3, 3, "temp", greedy ? 0.0 : sp.temp);
    sp.top_k = (int)lq_opt_int(L, 3, 3, "top_k", sp.top_k, 0, 1 << 30);
    sp.top_p = (float)lq_opt_num(L, 3, 3, "top_p", sp.top_p);
    sp.min_p = (float)lq_opt_num(L, 3, 3, "min_p", sp.min_p);
    sp.repeat_penalty = (float)lq_opt_num(L, 3, 3, "repeat_penalty", sp.repeat_penalty);
    sp.repeat_last_n = (int)lq_opt_int(L, 3, 3, "repeat_last_n", sp.repeat_last_n, 0, 1 << 20);
    sp.seed = (uint64_t)lq_opt_int(L, 3, 3, "seed", (long)sp.seed, 0, LONG_MAX);
    bool ignore_eos = lq_opt_bool(L, 3, 3, "ignore_eos", false);
    int n_ctx = (int)lq_opt_int(L, 3, 3, "n_ctx", 2048 < m->hp.n_ctx_train ? 2048 : m->hp.n_ctx_train, 1,
                             m->hp.n_ctx_train);

    lq_scratch *s = lq_scratch_push(L);
    qi_err err = {0};
    size_t n_ids;
    if (lua_type(L, 2) == LUA_TSTRING) {
        size_t len;
        const char *p = lua_tolstring(L, 2, &len);
        if (qi_tokenize(m->tok, p, len, true, false, &s->ids, &n_ids, &err)) return lq_fail(L, &err);
    } else {
        n_ids = (size_t)lq_read_ids(L, 2, &s->ids);
    }
    if (n_ids == 0) return luaL_argerror(L, 2, "the prompt tokenises to nothing");
    qi_engine *e = helper_engine(L, 1, 3, s, &m, 1, &n_ctx);
    if ((long)n_ids >= n_ctx)
        return luaL_error(L, "the prompt is %d tokens, which does not fit the context of %d", (int)n_ids, n_ctx);
    int sid;
    if (qi_engine_seq_add(e, &sid, &err)) return lq_fail(L, &err);
    s->seq_eng = e;
    s->seq_id = sid;
    if (qi_sampler_create(&sp, m->hp.n_vocab, &s->smp, &err)) return lq_fail(L, &err);
    for (size_t i = 0; i < n_ids; i++) qi_sampler_accept(s->smp, s->ids[i]);
    s->ids2 = qi_malloc(sizeof(int32_t) * (size_t)(n_predict > 0 ? n_predict : 1));
    if (!s->ids2) return luaL_error(L, "out of memory");

    /* when each token was sampled: the request's timeline (measure.h) */
    double *tt = lua_newuserdatauv(L, sizeof(double) * (size_t)(n_predict > 0 ? n_predict : 1), 0);
    double t0 = lq_now();
    if (qi_engine_seq_feed(e, sid, s->ids, (int)n_ids, false, &err)) return lq_fail(L, &err);
    while (qi_engine_seq_pending(e, sid) > 0)
        if (qi_engine_step(e, NULL, &err)) return lq_fail(L, &err);
    int n_gen = 0;
    for (; n_gen < n_predict && qi_engine_seq_n_past(e, sid) < n_ctx; n_gen++) {
        int32_t tok = qi_sampler_sample(s->smp, qi_engine_seq_logits(e, sid, -1));
        qi_sampler_accept(s->smp, tok);
        tt[n_gen] = lq_now();
        if (!ignore_eos && qi_tokenizer_is_eog(m->tok, tok)) break;
        s->ids2[n_gen] = tok;
        if (n_gen + 1 < n_predict && qi_engine_seq_n_past(e, sid) < n_ctx &&
            (qi_engine_seq_feed(e, sid, &tok, 1, false, &err) || qi_engine_step(e, NULL, &err)))
            return lq_fail(L, &err);
    }
    double t_end = lq_now();

    size_t cap = qi_tokenizer_max_piece(m->tok) + QI_DETOK_MAX_PENDING;
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    qi_detok d;
    qi_detok_init(&d);
    for (int i = 0; i < n_gen; i++) {
        char *p = luaL_prepbuffsize(&b, cap);
        luaL_addsize(&b, qi_detok_push(m->tok, &d, s->ids2[i], false, p, cap));
    }
    char *p = luaL_prepbuffsize(&b, QI_DETOK_MAX_PENDING);
    luaL_addsize(&b, qi_detok_flush(&d, p, QI_DETOK_MAX_PENDING));
    luaL_pushresult(&b);
    lq_push_ids(L, s->ids2, (size_t)n_gen);
    const qi_request_timeline tl = {.arrival = t0, .start = t0, .token_t = tt, .n_prompt = (int)n_ids,
                                    .n_out = n_gen};
    qi_request_metrics rm;
    if (qi_measure_request(&tl, &rm, &err)) return lq_fail(L, &err);
    lua_createtable(L, 0, 7);
    lq_set_num(L, "ttft_s", n_gen > 0 ? rm.ttft_s : 0.0);
    double tpot = n_gen > 1 ? rm.tpot_s : 0.0;
    lq_set_num(L, "tpot_s", tpot);
    lq_set_num(L, "tokens_per_s", tpot > 0 ? 1.0 / tpot : 0.0);
    lq_set_num(L, "e2e_s", n_gen > 0 ? rm.e2e_s : 0.0);
    lq_set_num(L, "total_s", t_end - t0);
    lq_set_int(L, "n_prompt", (lua_Integer)n_ids);
    lq_set_int(L, "n_gen", n_gen);
    return 3;
}

/* Read a text file whole into *slot (qi_malloc'ed); its length. */
static size_t read_file(lua_State *L, const char *path, char **slot) {
    FILE *f = fopen(path, "rb");
    if (!f) return (size_t)luaL_error(L, "%s: cannot open", path);
    size_t cap = 1 << 16, len = 0, got;
    *slot = qi_malloc(cap);
    while (*slot && (got = fread(*slot + len, 1, cap - len, f)) > 0) {
        len += got;
        if (len == cap) {
            char *p = qi_realloc(*slot, cap * 2);
            if (!p) {
                qi_free(*slot);
                *slot = NULL;
                break;
            }
            *slot = p;
            cap *= 2;
        }
    }
    fclose(f);
    if (!*slot) return (size_t)luaL_error(L, "out of memory reading %s", path);
    return len;
}

const char *lq_model_corpus(lua_State *L, lq_model *mb, const char *corpus, lq_scratch *s) {
    qi_err err = {0};
    char path[1024];
    if (qi_cache_resolve(corpus, "corpus", path, sizeof path, &err)) lq_fail(L, &err);
    if (!mb->corpus_ids || strcmp(mb->corpus, path) != 0) {
        qi_free(mb->corpus_ids);
        mb->corpus_ids = NULL;
        mb->corpus[0] = 0;
        size_t len = read_file(L, path, &s->text);
        /* llama-perplexity drops one trailing newline before tokenising */
        if (len > 0 && s->text[len - 1] == '\n') len--;
        if (qi_tokenize(mb->m->tok, s->text, len, true, false, &mb->corpus_ids, &mb->n_corpus_ids, &err))
            lq_fail(L, &err);
        snprintf(mb->corpus, sizeof mb->corpus, "%s", path);
    }
    return mb->corpus;
}

/* qinfer.perplexity(model, corpus, {ctx=512, chunks, decode, batch=4, kv_...})
 * -> {ppl, err, nll, count, chunks, work_tokens, off_tokens, attn_tokens, seconds,
 * sparsity (the share of thresholded activations zeroed; -1 without sparsity)}; as
 * `qinfer ppl` computes it (decode mode implied by a KV policy or budget).
 * work/off/attn_tokens: per (layer, KV head) stream, averaged over scored
 * steps (attn: the tokens attention read). */
static int l_perplexity(lua_State *L) {
    lq_model *mb = lq_check_model(L, 1);
    const char *corpus = luaL_checkstring(L, 2);
    static const char *const keys[] = {"ctx", "chunks", "decode", "batch", LQ_ENGINE_KEYS, NULL};
    lq_opts_check(L, 3, 3, keys);
    int n_ctx = (int)lq_opt_int(L, 3, 3, "ctx", 512, 8, mb->m->hp.n_ctx_train);
    int max_chunks = (int)lq_opt_int(L, 3, 3, "chunks", -1, -1, 1 << 30);
    int batch = (int)lq_opt_int(L, 3, 3, "batch", 4, 1, 256);
    lq_eopts eo;
    lq_read_engine_opts(L, 3, 3, &eo, mb);
    bool decode = lq_opt_bool(L, 3, 3, "decode", eo.kv_given);
    if (max_chunks == 0) return luaL_argerror(L, 3, "option 'chunks': 0 chunks");

    lq_scratch *s = lq_scratch_push(L);
    qi_err err = {0};
    const char *path = lq_model_corpus(L, mb, corpus, s);
    size_t n_ids = mb->n_corpus_ids;
    if (n_ids < 2 * (size_t)n_ctx)
        return luaL_error(L, "%s is %d tokens; perplexity at ctx %d needs at least %d", path, (int)n_ids, n_ctx,
                          2 * n_ctx);
    int n_chunk = (int)(n_ids / (size_t)n_ctx);
    if (max_chunks > 0 && max_chunks < n_chunk) n_chunk = max_chunks;
    if (!decode) batch = 1;
    eo.o.n_ctx = n_ctx;
    eo.o.max_seqs = batch < n_chunk ? batch : n_chunk;
    if (qi_engine_create(mb->m, &eo.o, &s->engine, &err)) return lq_fail(L, &err);
    lq_note_plan(L, s->engine);
    qi_ppl_result r;
    qi_ppl_kv kv;
    double t0 = lq_now();
    if (qi_perplexity_engine(mb->m, s->engine, mb->corpus_ids, n_ids, n_ctx, max_chunks, eo.o.max_seqs, decode,
                             NULL, NULL, &r, &kv, &err))
        return lq_fail(L, &err);
    const double streams = (double)mb->m->hp.n_layer * mb->m->hp.n_head_kv;
    lua_createtable(L, 0, 10);
    lq_set_num(L, "ppl", r.ppl);
    lq_set_num(L, "err", r.ppl_err);
    lq_set_num(L, "nll", r.nll);
    lq_set_int(L, "count", r.count);
    lq_set_int(L, "chunks", r.n_chunks);
    lq_set_num(L, "work_tokens", decode ? kv.work_tokens / streams : 0.0);
    lq_set_num(L, "off_tokens", decode ? kv.off_tokens / streams : 0.0);
    lq_set_num(L, "attn_tokens", decode ? kv.attn_tokens / streams : 0.0);
    lq_set_num(L, "seconds", lq_now() - t0);
    lq_set_num(L, "sparsity", qi_engine_sparsity_measured(s->engine));
    lua_pushboolean(L, decode);
    lua_setfield(L, -2, "decode");
    return 1;
}

/* A placement policy run by qinfer.throughput: planned before the prompts
 * for the workload, then (replan) ticked before every step. */
typedef struct {
    qi_placement_ctl ctl;
    const qi_model *m;
    int kv_budget;
    bool replan;
} place_run;

static qi_status place_tick(void *ctx, qi_engine *e, int batch, int context, int left, qi_err *err) {
    place_run *p = ctx;
    if (!p->replan && p->ctl.ticks > 0) return QI_OK;
    const qi_placement_workload wl = {.batch = batch, .prompt_len = context, .gen_len = left,
                                      .kv_budget = p->kv_budget};
    return qi_placement_ctl_tick(&p->ctl, e, p->m, &wl, NULL, err);
}

/* qinfer.throughput(model, {batch=1, n_gen=32, prompt=32|text, vs_dense=false, kv_...})
 * -> {tokens_per_s, per_seq_tokens_per_s, ttft_s, tpot_s, decode_s, batch, n_gen, n_prompt,
 *     device1_peak_bytes (with two devices or more: the second's peak memory),
 *     vs_dense = {pairs, ratio_median, ratio_q1, ratio_q3, sparse_step_s, dense_step_s}}
 * qi_measure_decode, as bench's batched rows: batch sequences get the
 * prompt (a text, or that many pseudo-random ids after BOS, distinct per
 * sequence); ttft_s is the prefill of all of them until each one's first
 * token; then n_gen steps of greedy decoding, one token per sequence each:
 * tpot_s is a step's mean time and tokens_per_s the aggregate rate,
 * batch * n_gen / decode_s. vs_dense (with sparsity) alternates the steps
 * with the dense path in pairs (qi_measure_decode's ab_dense, as bench
 * --vs-dense): the figures above are then the sparse steps', and
 * vs_dense holds the pairs' sparse / dense step time (median, quartiles)
 * and each side's mean step. */
static int l_throughput(lua_State *L) {
    lq_model *mb = lq_check_model(L, 1);
    static const char *const keys[] = {"batch",    "n_gen",        "prompt", "n_ctx", "replan", "bucket",
                                       "vs_dense", LQ_ENGINE_KEYS, NULL};
    lq_opts_check(L, 2, 2, keys);
    const qi_model *m = mb->m;
    int batch = (int)lq_opt_int(L, 2, 2, "batch", 1, 1, 256);
    int n_gen = (int)lq_opt_int(L, 2, 2, "n_gen", 32, 1, 1 << 20);
    lq_scratch *s = lq_scratch_push(L);
    qi_err err = {0};
    size_t n_prompt;
    int pt = lq_opt_get(L, 2, "prompt");
    if (pt == LUA_TSTRING) {
        size_t len;
        const char *p = lua_tolstring(L, -1, &len);
        if (qi_tokenize(m->tok, p, len, true, false, &s->ids, &n_prompt, &err)) return lq_fail(L, &err);
        if (n_prompt == 0) return luaL_argerror(L, 2, "option 'prompt': tokenises to nothing");
    } else if (pt == LUA_TNIL || lua_isinteger(L, -1)) {
        lua_Integer np = pt == LUA_TNIL ? 32 : lua_tointeger(L, -1);
        if (np < 1 || np > (1 << 20)) return luaL_argerror(L, 2, "option 'prompt': token count not in 1..1048576");
        n_prompt = (size_t)np;
        s->ids = qi_malloc(sizeof(int32_t) * n_prompt * (size_t)batch);
        if (!s->ids) return luaL_error(L, "out of memory");
        uint64_t x = 0x9E3779B97F4A7C15ull;
        for (size_t i = 0; i < n_prompt * (size_t)batch; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            s->ids[i] = (int32_t)(x % (uint64_t)m->hp.n_vocab);
        }
        int32_t bos = qi_tokenizer_bos(m->tok);
        if (bos >= 0)
            for (int b = 0; b < batch; b++) s->ids[(size_t)b * n_prompt] = bos;
    } else {
        return lq_opt_wrong(L, 2, "prompt", "string or integer");
    }
    bool per_seq = pt != LUA_TSTRING;
    lua_pop(L, 1);
    int n_ctx = (int)lq_opt_int(L, 2, 2, "n_ctx", (long)n_prompt + n_gen + 1, 1, m->hp.n_ctx_train);
    if ((long)n_prompt + n_gen > n_ctx)
        return luaL_error(L, "prompt %d + n_gen %d tokens exceed the context of %d", (int)n_prompt, n_gen, n_ctx);
    lq_eopts eo;
    lq_read_engine_opts(L, 2, 2, &eo, mb);
    eo.o.max_seqs = batch;
    eo.o.n_ctx = n_ctx;
    /* placement = "policy:NAME[:K=V,...]": the policy plans for this
     * workload before the prompts and, with replan (default true), is
     * ticked before every step (qi_placement_ctl_tick), learning from the
     * block times the engine then measures */
    place_run pr = {0};
    const bool policy = qi_placement_is_policy(eo.o.placement);
    pr.replan = lq_opt_bool(L, 2, 2, "replan", true);
    const double bucket = lq_opt_num(L, 2, 2, "bucket", 2.0);
    if (!(bucket > 1.0)) return luaL_argerror(L, 2, "option 'bucket': a factor above 1 expected");
    if (policy) {
        if (qi_placement_policy_from_spec(eo.o.placement, &s->policy, &err)) return lq_fail(L, &err);
        qi_placement_ctl_init(&pr.ctl, s->policy, bucket);
        pr.m = m;
        pr.kv_budget = eo.o.kv_budget_tokens > 0 ? eo.o.kv_budget_tokens
                                                 : (int)(eo.o.kv_budget_frac * ((double)n_prompt + n_gen));
        eo.o.placement = "all-cpu";
        eo.o.profile = eo.o.profile || pr.replan; /* the block times it learns from */
    }
    const bool vs_dense = lq_opt_bool(L, 2, 2, "vs_dense", false);
    if (vs_dense && !(eo.o.sparsity && eo.o.sparsity->target > 0))
        return luaL_argerror(L, 2, "option 'vs_dense': compares activation sparsity with the dense path: give "
                                   "sparsity (above 0)");
    double *ratio = vs_dense ? lua_newuserdatauv(L, sizeof(double) * (size_t)(n_gen / 2 + 1), 0) : NULL;
    if (qi_engine_create(m, &eo.o, &s->engine, &err)) return lq_fail(L, &err);
    const qi_decode_opts o = {.batch = batch, .n_gen = n_gen, .prompts = s->ids, .n_prompt = (int)n_prompt,
                              .prompt_stride = per_seq ? (int)n_prompt : 0, .greedy = true,
                              .tick = policy ? place_tick : NULL, .tick_ctx = &pr, .ab_dense = vs_dense,
                              .ab_ratio = ratio};
    qi_decode_result r;
    if (qi_measure_decode(s->engine, m, &o, &r, &err)) return lq_fail(L, &err);
    if (vs_dense) { /* the figures of the sparse steps */
        const double per_step = r.ab_steps[0] ? r.ab_s[0] / r.ab_steps[0] : NAN;
        r.decode_s = per_step * n_gen;
        r.tpot_s = per_step;
        r.tokens_per_s = qi_measure_rate((double)batch * n_gen, r.decode_s);
        r.seq_tokens_per_s = qi_measure_rate(n_gen, r.decode_s);
    }
    lq_note_plan(L, s->engine);
    lua_createtable(L, 0, 14);
    if (policy) {
        char sum[256];
        qi_plan_summary(qi_engine_plan(s->engine), sum, sizeof sum);
        lq_set_str(L, "plan", sum);
        lq_set_int(L, "replans", pr.ctl.replans);
        lq_set_num(L, "moved_bytes", pr.ctl.moved_bytes);
        lq_set_num(L, "predicted_step_s", pr.ctl.predicted_s);
        lq_set_num(L, "measured_step_s", pr.ctl.measured_s);
    }
    qi_engine_dev d1;
    if (qi_engine_device(s->engine, 1, &d1)) lq_set_num(L, "device1_peak_bytes", (double)d1.peak);
    lq_set_num(L, "ttft_s", r.prefill_s);
    lq_set_num(L, "tpot_s", r.tpot_s);
    lq_set_num(L, "tokens_per_s", r.tokens_per_s);
    lq_set_num(L, "per_seq_tokens_per_s", r.seq_tokens_per_s);
    lq_set_num(L, "decode_s", r.decode_s);
    lq_set_int(L, "batch", batch);
    lq_set_int(L, "n_gen", n_gen);
    lq_set_int(L, "n_prompt", (lua_Integer)n_prompt);
    if (vs_dense && r.ab_pairs > 0 && r.ab_steps[1] > 0) {
        qi_measure_summary sm; /* sorts the ratios */
        qi_measure_summarize(ratio, r.ab_pairs, &sm);
        lua_createtable(L, 0, 6);
        lq_set_int(L, "pairs", sm.n);
        lq_set_num(L, "ratio_median", sm.median);
        lq_set_num(L, "ratio_q1", qi_measure_percentile(ratio, sm.n, 25));
        lq_set_num(L, "ratio_q3", qi_measure_percentile(ratio, sm.n, 75));
        lq_set_num(L, "sparse_step_s", r.ab_s[0] / r.ab_steps[0]);
        lq_set_num(L, "dense_step_s", r.ab_s[1] / r.ab_steps[1]);
        lua_setfield(L, -2, "vs_dense");
    }
    return 1;
}

/* Summary d as a table {n, mean, median, p90, p99, min, max} at t[k]. */
static void push_summary(lua_State *L, const char *k, const qi_measure_summary *d) {
    lua_createtable(L, 0, 7);
    lq_set_int(L, "n", d->n);
    lq_set_num(L, "mean", d->mean);
    lq_set_num(L, "median", d->median);
    lq_set_num(L, "p90", d->p90);
    lq_set_num(L, "p99", d->p99);
    lq_set_num(L, "min", d->min);
    lq_set_num(L, "max", d->max);
    lua_setfield(L, -2, k);
}

void lq_push_run(lua_State *L, const qi_run_metrics *rm_) {
    const qi_run_metrics rm = *rm_;
    lq_set_int(L, "n_requests", rm.n_requests);
    lq_set_int(L, "n_done", rm.n_done);
    lq_set_int(L, "n_rejected", rm.n_rejected);
    lq_set_int(L, "n_good", rm.n_good);
    lq_set_int(L, "prompt_tokens", rm.prompt_tokens);
    lq_set_int(L, "output_tokens", rm.output_tokens);
    lq_set_num(L, "duration_s", rm.duration_s);
    lq_set_num(L, "requests_per_s", rm.requests_per_s);
    lq_set_num(L, "output_tokens_per_s", rm.output_tokens_per_s);
    lq_set_num(L, "total_tokens_per_s", rm.total_tokens_per_s);
    lq_set_num(L, "goodput_req_per_s", rm.goodput_req_per_s);
    push_summary(L, "ttft", &rm.ttft);
    push_summary(L, "tpot", &rm.tpot);
    push_summary(L, "itl", &rm.itl);
    push_summary(L, "e2e", &rm.e2e);
    push_summary(L, "queue", &rm.queue);
    lua_newtable(L);
    const char *name, *unit;
    double v;
    int k = 0;
    for (int i = 0; qi_measure_run_metric(&rm, i, &name, &unit, &v); i++) {
        if (!name) continue;
        lua_createtable(L, 3, 0);
        lua_pushstring(L, name);
        lua_rawseti(L, -2, 1);
        lua_pushnumber(L, v);
        lua_rawseti(L, -2, 2);
        lua_pushstring(L, unit);
        lua_rawseti(L, -2, 3);
        lua_rawseti(L, -2, ++k);
    }
    lua_setfield(L, -2, "metrics");
}

/* Field k of the table at idx as a number; def when absent. */
static double req_num(lua_State *L, int idx, lua_Integer i, const char *k, double def) {
    int t = lua_getfield(L, idx, k);
    if (t == LUA_TNIL) {
        lua_pop(L, 1);
        return def;
    }
    if (t != LUA_TNUMBER)
        luaL_error(L, "request %d: field '%s' is a %s, not a number", (int)i, k, lua_typename(L, t));
    double v = lua_tonumber(L, -1);
    lua_pop(L, 1);
    return v;
}

/* qinfer.measure_requests({{arrival=, start=, tokens={t1, t2, ...}, n_prompt=, rejected=}, ...},
 *                         {ttft_slo_s=, tpot_slo_s=})
 * -> {n_requests, n_done, n_rejected, n_good, duration_s, requests_per_s,
 *     output_tokens_per_s, total_tokens_per_s, goodput_req_per_s,
 *     ttft = {n, mean, median, p90, p99, min, max}, tpot, itl, e2e, queue,
 *     metrics = {{name, value, unit}, ...}}
 * A run's figures from its requests' timelines, by qi_measure_run (the
 * definitions bench, Lua and the engine share: results/README.md); metrics
 * is what ctx.metric should record, under the canonical names. */
static int l_measure_requests(lua_State *L) {
    luaL_checktype(L, 1, LUA_TTABLE);
    static const char *const keys[] = {"ttft_slo_s", "tpot_slo_s", NULL};
    lq_opts_check(L, 2, 2, keys);
    qi_slo slo = {.ttft_s = lq_opt_num(L, 2, 2, "ttft_slo_s", 0), .tpot_s = lq_opt_num(L, 2, 2, "tpot_slo_s", 0)};
    if (slo.ttft_s < 0 || slo.tpot_s < 0) return luaL_argerror(L, 2, "a latency bound is negative");
    lua_Integer n = luaL_len(L, 1);
    if (n < 0 || n > (1 << 24)) return luaL_argerror(L, 1, "too many requests");
    long n_tok = 0;
    for (lua_Integer i = 1; i <= n; i++) {
        if (lua_geti(L, 1, i) != LUA_TTABLE) return luaL_error(L, "request %d is not a table", (int)i);
        if (lua_getfield(L, -1, "tokens") == LUA_TTABLE) n_tok += (long)luaL_len(L, -1);
        else if (!lua_isnil(L, -1)) return luaL_error(L, "request %d: field 'tokens' is not a list of times", (int)i);
        lua_pop(L, 2);
        if (n_tok > (1L << 28)) return luaL_argerror(L, 1, "too many tokens");
    }
    /* timelines and token times in userdata: collected whatever happens */
    qi_request_timeline *tl = lua_newuserdatauv(L, sizeof *tl * (size_t)(n ? n : 1), 0);
    double *times = lua_newuserdatauv(L, sizeof *times * (size_t)(n_tok ? n_tok : 1), 0);
    long at = 0;
    for (lua_Integer i = 1; i <= n; i++) {
        lua_geti(L, 1, i);
        int r = lua_gettop(L);
        qi_request_timeline *t = &tl[i - 1];
        t->arrival = req_num(L, r, i, "arrival", NAN);
        t->start = req_num(L, r, i, "start", NAN);
        double np = req_num(L, r, i, "n_prompt", 0);
        if (!(np >= 0 && np <= INT_MAX)) return luaL_error(L, "request %d: n_prompt out of range", (int)i);
        t->n_prompt = (int)np;
        lua_getfield(L, r, "rejected");
        t->rejected = lua_toboolean(L, -1);
        lua_pop(L, 1);
        t->token_t = times + at;
        t->n_out = 0;
        if (lua_getfield(L, r, "tokens") == LUA_TTABLE) {
            lua_Integer k = luaL_len(L, -1);
            for (lua_Integer j = 1; j <= k; j++) {
                if (lua_geti(L, -1, j) != LUA_TNUMBER)
                    return luaL_error(L, "request %d: token time %d is not a number", (int)i, (int)j);
                times[at + t->n_out++] = lua_tonumber(L, -1);
                lua_pop(L, 1);
            }
        }
        at += t->n_out;
        lua_pop(L, 2);
    }
    qi_run_metrics rm;
    qi_err err = {0};
    if (qi_measure_run(tl, (long)n, &slo, &rm, &err)) return lq_fail(L, &err);
    lua_createtable(L, 0, 16);
    lq_push_run(L, &rm);
    return 1;
}

/* qinfer.now() -> seconds on a monotonic clock; qinfer.sleep(seconds) */
static int l_now(lua_State *L) {
    lua_pushnumber(L, lq_now());
    return 1;
}

static int l_sleep(lua_State *L) {
    double s = luaL_checknumber(L, 1);
    luaL_argcheck(L, s >= 0 && s <= 86400, 1, "seconds must be in 0..86400");
    struct timespec ts = {(time_t)s, (long)((s - floor(s)) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR && !lq_interrupted) {
    }
    return 0;
}

static int l_sysinfo(lua_State *L) {
    qi_sysinfo si;
    qi_sysinfo_get(&si);
    lua_createtable(L, 0, 10);
    lq_set_str(L, "cpu", si.cpu_model);
    lq_set_int(L, "cores", si.n_cores);
    lq_set_int(L, "threads", si.n_threads);
    lq_set_int(L, "mem_bytes", (lua_Integer)si.mem_bytes);
    lua_pushboolean(L, si.cuda_built);
    lua_setfield(L, -2, "cuda_built");
    lq_set_int(L, "gpus", si.n_gpus);
    lq_set_str(L, "gpu", si.gpu_name);
    lq_set_int(L, "gpu_mem_bytes", (lua_Integer)si.gpu_mem_bytes);
    lq_set_int(L, "cuda_driver", si.cuda_driver);
    lq_set_int(L, "cuda_runtime", si.cuda_runtime);
    lq_set_str(L, "gpu_note", si.gpu_note);
    return 1;
}

const luaL_Reg lq_measure_functions[] = {
    {"generate", l_generate},
    {"perplexity", l_perplexity},
    {"throughput", l_throughput},
    {"measure_requests", l_measure_requests},
    {"now", l_now},
    {"sleep", l_sleep},
    {"sysinfo", l_sysinfo},
    {NULL, NULL},
};

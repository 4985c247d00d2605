/* lua_serve.c - serving scenarios in the qinfer Lua module: workloads
 * (workload.h) and a workload served by the scheduler (sched.h), each one C
 * call so that what is timed is the engine, not a Lua loop.
 *
 *   qinfer.workload{n=, rate=0, prompt_len=, output_len=, seed=, trace=, model=, corpus=}
 *       -> {{arrival, n_prompt, n_out, prompt_at}, ...}
 *   qinfer.serve(model, workload, {max_batch, max_step_tokens, kv_memory, queue_limit,
 *                max_preemptions, preempt, n_ctx, corpus, seed, ttft_slo_s, tpot_slo_s, kv_...})
 *       -> {requests = {{..., ttft_s, tpot_s, e2e_s, queue_s, preemptions, swaps, recomputes,
 *           prefill_tokens}, ...}, n_steps, n_preemptions, n_swaps, n_recomputes, prefill_tokens,
 *           peak_kv_bytes, peak_swap_bytes, <the run's figures>}
 *
 * preempt = "swap" gives the engine twice max_batch sequences, the room
 * the scheduler needs to keep the swapped-out requests' (sched.h).
 *
 * The run's figures are qi_measure_run's (the names of results/README.md in
 * `metrics`), so an experiment records what bench and the C API report.
 * Temporaries are userdata or the call's to-be-closed scratch: a Lua error
 * midway leaks nothing.
 */
#include <lauxlib.h>
#include <limits.h>
#include <math.h>
#include <string.h>

#include "lua_int.h"
#include "qinfer/sched.h"
#include "qinfer/workload.h"

/* A length distribution option: an integer (fixed) or a spec string. */
static qi_len_dist opt_len(lua_State *L, int arg, const char *key, const char *def) {
    qi_len_dist d;
    qi_err err = {0};
    int t = lq_opt_get(L, arg, key);
    const char *spec = def;
    char buf[32];
    if (t == LUA_TNUMBER && lua_isinteger(L, -1)) {
        snprintf(buf, sizeof buf, "%lld", (long long)lua_tointeger(L, -1));
        spec = buf;
    } else if (t == LUA_TSTRING) {
        spec = lua_tostring(L, -1);
    } else if (t != LUA_TNIL) {
        lq_opt_wrong(L, arg, key, "integer or distribution string");
    }
    if (qi_len_dist_parse(spec, &d, &err))
        luaL_argerror(L, arg, lua_pushfstring(L, "option '%s': %s", key, err.msg));
    lua_pop(L, 1);
    return d;
}

/* qi_workload userdata: freed by __gc */
#define LQ_WORKLOAD "qinfer.workload_tmp"
static int workload_gc(lua_State *L) {
    qi_workload **p = luaL_checkudata(L, 1, LQ_WORKLOAD);
    qi_workload_free(*p);
    *p = NULL;
    return 0;
}

static qi_workload **new_workload_slot(lua_State *L) {
    qi_workload **p = lua_newuserdatauv(L, sizeof *p, 0);
    *p = NULL;
    if (luaL_newmetatable(L, LQ_WORKLOAD)) {
        lua_pushcfunction(L, workload_gc);
        lua_setfield(L, -2, "__gc");
        lua_pushcfunction(L, workload_gc);
        lua_setfield(L, -2, "__close");
    }
    lua_setmetatable(L, -2);
    return p;
}

static int l_workload(lua_State *L) {
    static const char *const keys[] = {"n", "rate", "prompt_len", "output_len", "seed", "trace", "model", "corpus",
                                       NULL};
    luaL_checktype(L, 1, LUA_TTABLE);
    lq_opts_check(L, 1, 1, keys);
    uint64_t seed = (uint64_t)lq_opt_int(L, 1, 1, "seed", 1, 0, LONG_MAX);
    lq_scratch *s = lq_scratch_push(L);
    long corpus_tokens = 0;
    if (lq_opt_get(L, 1, "corpus") != LUA_TNIL) {
        if (lua_type(L, -1) != LUA_TSTRING) return lq_opt_wrong(L, 1, "corpus", "string");
        const char *corpus = lua_tostring(L, -1);
        if (lq_opt_get(L, 1, "model") == LUA_TNIL)
            return luaL_argerror(L, 1, "option 'corpus' needs option 'model' (its tokenizer)");
        lq_model *mb = lq_check_model(L, lua_gettop(L));
        lq_model_corpus(L, mb, corpus, s);
        corpus_tokens = (long)mb->n_corpus_ids;
        lua_pop(L, 1);
    }
    lua_pop(L, 1);
    qi_workload **slot = new_workload_slot(L);
    qi_err err = {0};
    if (lq_opt_get(L, 1, "trace") != LUA_TNIL) {
        const char *path = luaL_checkstring(L, -1);
        static const char *const gen_only[] = {"n", "rate", "prompt_len", "output_len", NULL};
        for (int i = 0; gen_only[i]; i++) {
            bool given = lq_opt_get(L, 1, gen_only[i]) != LUA_TNIL;
            lua_pop(L, 1);
            if (given)
                return luaL_argerror(L, 1, lua_pushfstring(L, "option '%s' does not apply to a trace", gen_only[i]));
        }
        if (qi_workload_trace(path, corpus_tokens, seed, slot, &err)) return lq_fail(L, &err);
    } else {
        qi_workload_opts o = {.n_requests = lq_opt_int(L, 1, 1, "n", 1, 1, 1L << 26),
                              .rate = lq_opt_num(L, 1, 1, "rate", 0),
                              .prompt_len = opt_len(L, 1, "prompt_len", "32"),
                              .output_len = opt_len(L, 1, "output_len", "32"),
                              .seed = seed,
                              .corpus_tokens = corpus_tokens};
        if (qi_workload_generate(&o, slot, &err)) return lq_fail(L, &err);
    }
    lua_pop(L, 1);
    const qi_workload *w = *slot;
    lua_createtable(L, (int)w->n, 0);
    for (long i = 0; i < w->n; i++) {
        lua_createtable(L, 0, 4);
        lq_set_num(L, "arrival", w->req[i].arrival_s);
        lq_set_int(L, "n_prompt", w->req[i].n_prompt);
        lq_set_int(L, "n_out", w->req[i].n_out);
        lq_set_int(L, "prompt_at", w->req[i].prompt_at);
        lua_rawseti(L, -2, i + 1);
    }
    return 1;
}

/* The workload list at idx as a qi_workload in *slot. */
static void read_workload(lua_State *L, int idx, qi_workload **slot) {
    luaL_checktype(L, idx, LUA_TTABLE);
    lua_Integer n = luaL_len(L, idx);
    if (n < 1 || n > (1 << 26)) luaL_argerror(L, idx, "a workload of 1.. requests expected");
    qi_workload *w = qi_calloc(1, sizeof *w);
    if (!w || !(w->req = qi_calloc((size_t)n, sizeof *w->req))) {
        qi_free(w);
        luaL_error(L, "out of memory");
    }
    *slot = w;
    w->n = (long)n;
    double last = 0;
    for (lua_Integer i = 1; i <= n; i++) {
        if (lua_geti(L, idx, i) != LUA_TTABLE) luaL_error(L, "workload request %d is not a table", (int)i);
        static const char *const f[] = {"arrival", "n_prompt", "n_out", "prompt_at"};
        double v[4];
        for (int k = 0; k < 4; k++) {
            int t = lua_getfield(L, -1, f[k]);
            if (t == LUA_TNIL && k == 3) v[k] = 0;
            else if (t != LUA_TNUMBER) luaL_error(L, "workload request %d: field '%s' is not a number", (int)i, f[k]);
            else v[k] = lua_tonumber(L, -1);
            lua_pop(L, 1);
        }
        if (!(v[0] >= last) || !isfinite(v[0]))
            luaL_error(L, "workload request %d: arrival %f is before the previous one", (int)i, v[0]);
        if (!(v[1] >= 1 && v[1] <= QI_WORKLOAD_MAX_LEN && v[2] >= 1 && v[2] <= QI_WORKLOAD_MAX_LEN && v[3] >= 0 &&
              v[3] < (double)LONG_MAX))
            luaL_error(L, "workload request %d: lengths must be 1..%d and prompt_at >= 0", (int)i,
                       QI_WORKLOAD_MAX_LEN);
        w->req[i - 1] = (qi_work_request){.arrival_s = v[0], .n_prompt = (int)v[1], .n_out = (int)v[2],
                                          .prompt_at = (long)v[3]};
        last = v[0];
        lua_pop(L, 1);
    }
}

#define LQ_SCHED "qinfer.sched_tmp"
static int sched_gc(lua_State *L) {
    qi_sched_result **p = luaL_checkudata(L, 1, LQ_SCHED);
    qi_sched_result_free(*p);
    *p = NULL;
    return 0;
}

static int l_serve(lua_State *L) {
    static const char *const keys[] = {"max_batch", "max_step_tokens", "kv_memory", "queue_limit",
                                       "max_preemptions", "preempt", "n_ctx", "corpus", "seed", "ttft_slo_s",
                                       "tpot_slo_s",
                                       LQ_ENGINE_KEYS, NULL};
    lq_model *mb = lq_check_model(L, 1);
    lq_opts_check(L, 3, 3, keys);
    qi_workload **wslot = new_workload_slot(L);
    read_workload(L, 2, wslot);
    const qi_model *m = mb->m;
    qi_sched_opts so = {
        .max_batch = (int)lq_opt_int(L, 3, 3, "max_batch", 8, 1, 256),
        .max_step_tokens = (int)lq_opt_int(L, 3, 3, "max_step_tokens", 0, 0, 1 << 20),
        .kv_budget_bytes = (size_t)lq_opt_int(L, 3, 3, "kv_memory", 0, 0, LONG_MAX),
        .queue_limit = (int)lq_opt_int(L, 3, 3, "queue_limit", 0, 0, 1 << 26),
        .max_preemptions = (int)lq_opt_int(L, 3, 3, "max_preemptions", 0, 0, 1 << 20),
        .n_ctx = (int)lq_opt_int(L, 3, 3, "n_ctx", 2048 < m->hp.n_ctx_train ? 2048 : m->hp.n_ctx_train, 1,
                                 m->hp.n_ctx_train),
        .seed = (uint64_t)lq_opt_int(L, 3, 3, "seed", 1, 0, LONG_MAX),
        .slo = {.ttft_s = lq_opt_num(L, 3, 3, "ttft_slo_s", 0), .tpot_s = lq_opt_num(L, 3, 3, "tpot_slo_s", 0)},
    };
    if (so.slo.ttft_s < 0 || so.slo.tpot_s < 0) return luaL_argerror(L, 3, "a latency bound is negative");
    const char *preempt = lq_opt_str(L, 3, 3, "preempt", "recompute");
    const int pk = qi_sched_preempt_parse(preempt);
    if (pk < 0)
        return luaL_argerror(L, 3, lua_pushfstring(L, "option 'preempt': '%s' is not 'recompute' or 'swap'", preempt));
    so.preempt = (qi_sched_preempt)pk;
    lq_scratch *s = lq_scratch_push(L);
    if (lq_opt_get(L, 3, "corpus") != LUA_TNIL) {
        lq_model_corpus(L, mb, luaL_checkstring(L, -1), s);
        so.corpus = mb->corpus_ids;
        so.n_corpus = (long)mb->n_corpus_ids;
    }
    lua_pop(L, 1);
    lq_eopts eo;
    lq_read_engine_opts(L, 3, 3, &eo, mb);
    eo.o.max_seqs = so.preempt == QI_SCHED_SWAP ? 2 * so.max_batch : so.max_batch;
    eo.o.n_ctx = so.n_ctx;
    qi_err err = {0};
    if (qi_engine_create(m, &eo.o, &s->engine, &err)) return lq_fail(L, &err);
    lq_note_plan(L, s->engine);
    qi_sched_result **rslot = lua_newuserdatauv(L, sizeof *rslot, 0);
    *rslot = NULL;
    if (luaL_newmetatable(L, LQ_SCHED)) {
        lua_pushcfunction(L, sched_gc);
        lua_setfield(L, -2, "__gc");
    }
    lua_setmetatable(L, -2);
    if (qi_sched_run(s->engine, m, *wslot, &so, rslot, &err)) return lq_fail(L, &err);
    const qi_sched_result *r = *rslot;
    lua_createtable(L, 0, 24);
    lq_set_int(L, "n_steps", r->n_steps);
    lq_set_int(L, "n_preemptions", r->n_preemptions);
    lq_set_int(L, "n_swaps", r->n_swaps);
    lq_set_int(L, "n_recomputes", r->n_recomputes);
    lq_set_int(L, "prefill_tokens", r->prefill_tokens);
    lq_set_int(L, "peak_kv_bytes", (lua_Integer)r->peak_kv_bytes);
    lq_set_int(L, "peak_swap_bytes", (lua_Integer)r->peak_swap_bytes);
    lq_push_run(L, &r->run);
    lua_createtable(L, (int)r->n, 0);
    for (long i = 0; i < r->n; i++) {
        const qi_sched_req *q = &r->req[i];
        lua_createtable(L, 0, 14);
        lq_set_num(L, "arrival", q->t.arrival);
        if (!isnan(q->t.start)) lq_set_num(L, "start", q->t.start);
        lq_set_int(L, "n_prompt", q->t.n_prompt);
        lq_set_int(L, "n_out", q->t.n_out);
        lq_set_int(L, "n_asked", q->n_asked);
        lq_set_int(L, "preemptions", q->preemptions);
        lq_set_int(L, "swaps", q->swaps);
        lq_set_int(L, "recomputes", q->recomputes);
        lq_set_int(L, "prefill_tokens", q->prefill_tokens);
        qi_request_metrics rq;
        qi_err rerr = {0};
        if (qi_measure_request(&q->t, &rq, &rerr) == QI_OK) { /* NaN (undefined) figures are left out */
            if (!isnan(rq.ttft_s)) lq_set_num(L, "ttft_s", rq.ttft_s);
            if (!isnan(rq.tpot_s)) lq_set_num(L, "tpot_s", rq.tpot_s);
            if (!isnan(rq.e2e_s)) lq_set_num(L, "e2e_s", rq.e2e_s);
            if (!isnan(rq.queue_s)) lq_set_num(L, "queue_s", rq.queue_s);
        }
        lua_pushboolean(L, q->t.rejected);
        lua_setfield(L, -2, "rejected");
        if (q->reason[0]) lq_set_str(L, "reason", q->reason);
        lua_createtable(L, q->t.n_out, 0);
        for (int k = 0; k < q->t.n_out; k++) {
            lua_pushnumber(L, q->t.token_t[k]);
            lua_rawseti(L, -2, k + 1);
        }
        lua_setfield(L, -2, "tokens");
        lq_push_ids(L, q->tokens, (size_t)q->t.n_out);
        lua_setfield(L, -2, "ids");
        lua_rawseti(L, -2, i + 1);
    }
    lua_setfield(L, -2, "requests");
    return 1;
}

const luaL_Reg lq_serve_functions[] = {
    {"workload", l_workload},
    {"serve", l_serve},
    {NULL, NULL},
};

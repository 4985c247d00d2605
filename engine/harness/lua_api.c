/* lua_api.c - the `qinfer` Lua module's objects: models and engines, and
 * the option tables every call takes (lua_measure.c holds the measured
 * helpers generate / perplexity / throughput, lua_opts.c the option tables
 * read into an engine's options).
 *
 *   qinfer.load(name_or_path, {threads=, repack=})  -> model
 *   model:tokenize(text, {add_special=true, parse_special=false}) -> {ids}
 *   model:detokenize(ids, {special=false})  -> string
 *   model:info()                            -> {arch, n_params, n_layer, ..., sha256}
 *   model:engine{max_seqs, n_ctx, step_tokens, threads, kv_policy,
 *                kv_params={...}, kv_budget=N|F|'P%', kv_max_bytes, profile,
 *                attn_blas, repack, devices, placement, sim, sim_params, sim_cal,
 *                sparsity, sparsity_mode, sparsity_calib, sparse_max_density,
 *                neuron_policy, neuron_profile, neuron_budget, neuron_swap_every,
 *                neuron_swap_worker, neuron_swap_stream, sim_cold_density,
 *                sim_activity}
 *   engine:add() -> id; :remove(id); :feed(id, ids, logits_all); :step() -> n
 *   engine:pending(id), :n_past(id), :argmax(id[, row]), :logprob(id, tok[, row]),
 *   engine:topk(id, k[, row]) -> ids, logprobs; :kv_stats(id); :pool_stats();
 *   engine:profile(); :policy(); :close()
 *
 * Logits are never handed out whole (262k-entry tables for Gemma): argmax,
 * logprob and topk read them in C. A Lua table of logits per step was the
 * alternative; it would cost more than the step for small models.
 *
 * Lua errors longjmp over C frames, so nothing here holds C-owned memory
 * across a call that may raise: objects live in userdata (__gc), and the
 * temporaries of one call (an engine, a sequence, a sampler, token arrays)
 * in a "scratch" userdata marked to-be-closed, whose __close frees them at
 * once on return or error; an engine's KV memory and thread pool are too big
 * to leave for the collector. A model is shared by its engines through a
 * reference count, so collection order never frees weights an engine reads.
 * Options come as tables: an unknown key or a wrong type is an argument
 * error naming the key ("bad argument #1 to 'engine' (option 'max_seqs':
 * integer expected, got string)").
 */
#include <lauxlib.h>
#include <lualib.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "lua_int.h"
#include "placement/placement_policy.h"
#include "qinfer/measure.h"
#include "qinfer/model_files.h"
#include "qinfer/perplexity.h"
#include "qinfer/tokenizer.h"
#include "sha256.h"
#include "threadpool.h"

double lq_now(void) { return qi_measure_now(); }

/* ---- models -------------------------------------------------------------------- */

void lq_model_unref(lq_model *mb) {
    if (!mb || --mb->refs > 0) return;
    qi_model_free(mb->m);
    qi_free(mb->corpus_ids);
    qi_free(mb);
}

static int default_threads(lua_State *L) {
    lua_getfield(L, LUA_REGISTRYINDEX, "qinfer.threads");
    int n = (int)lua_tointeger(L, -1);
    lua_pop(L, 1);
    return n > 0 ? n : qi_n_physical_cores();
}

void lq_set_threads(lua_State *L, int n) {
    lua_pushinteger(L, n);
    lua_setfield(L, LUA_REGISTRYINDEX, "qinfer.threads");
}

/* sha256 per file path, for files outside the manifest: hashing a model is
 * a fraction of a second, but a sweep asks for every configuration. */
static struct {
    char path[1024];
    char sha[65];
} g_sha_memo[8];
static int g_sha_next;

qi_status lq_model_identity(const char *arg, char *path, size_t cap, char sha[65], qi_err *err) {
    sha[0] = 0;
    qi_status st = qi_cache_resolve(arg, "model", path, cap, err);
    if (st) return st;
    const qi_cache_entry *e = qi_cache_find(arg, "model");
    if (e && strcmp(path, arg) != 0) {
        snprintf(sha, 65, "%s", e->sha256);
        return QI_OK;
    }
    for (int i = 0; i < 8; i++)
        if (g_sha_memo[i].path[0] && strcmp(g_sha_memo[i].path, path) == 0) {
            memcpy(sha, g_sha_memo[i].sha, 65);
            return QI_OK;
        }
    if ((st = qi_sha256_file(path, sha, err))) return st;
    int i = g_sha_next++ % 8;
    snprintf(g_sha_memo[i].path, sizeof g_sha_memo[i].path, "%s", path);
    memcpy(g_sha_memo[i].sha, sha, 65);
    return QI_OK;
}

lq_model *lq_check_model(lua_State *L, int idx) {
    lq_model_ud *u = luaL_checkudata(L, idx, LQ_MODEL);
    if (!u->mb) luaL_argerror(L, idx, "model is closed");
    return u->mb;
}

/* ---- scratch: a call's temporaries, freed by __close ------------------------------ */

static int scratch_close(lua_State *L) {
    lq_scratch *s = luaL_checkudata(L, 1, LQ_SCRATCH);
    if (s->seq_eng) qi_engine_seq_remove(s->seq_eng, s->seq_id, NULL);
    qi_engine_free(s->engine);
    lq_model_unref(s->mb);
    qi_sampler_free(s->smp);
    qi_free(s->ids);
    qi_free(s->ids2);
    qi_free(s->text);
    qi_placement_policy_free(s->policy);
    memset(s, 0, sizeof *s);
    return 0;
}

/* Push a scratch, marked to-be-closed: it is freed when the C function
 * returns or raises. */
lq_scratch *lq_scratch_push(lua_State *L) {
    lq_scratch *s = lua_newuserdatauv(L, sizeof *s, 0);
    memset(s, 0, sizeof *s);
    luaL_setmetatable(L, LQ_SCRATCH);
    lua_toclose(L, -1);
    return s;
}

int lq_fail(lua_State *L, const qi_err *e) {
    return luaL_error(L, "%s", e->msg[0] ? e->msg : qi_status_str(e->code));
}

/* ---- engines ---------------------------------------------------------------------------- */

lq_engine_ud *lq_check_engine(lua_State *L, int idx) {
    lq_engine_ud *u = luaL_checkudata(L, idx, LQ_ENGINE);
    if (!u->e) luaL_argerror(L, idx, "engine is closed");
    return u;
}

static int engine_close(lua_State *L) {
    lq_engine_ud *u = luaL_checkudata(L, 1, LQ_ENGINE);
    qi_engine_free(u->e);
    u->e = NULL;
    lq_model_unref(u->mb);
    u->mb = NULL;
    return 0;
}

/* model:engine{...} */
static int model_engine(lua_State *L) {
    lq_model *mb = lq_check_model(L, 1);
    static const char *const keys[] = {"max_seqs", "n_ctx", "step_tokens", LQ_ENGINE_KEYS, NULL};
    lq_opts_check(L, 2, 2, keys);
    lq_eopts eo;
    lq_read_engine_opts(L, 2, 2, &eo, mb);
    eo.o.max_seqs = (int)lq_opt_int(L, 2, 2, "max_seqs", eo.o.max_seqs, 1, 4096);
    eo.o.n_ctx = (int)lq_opt_int(L, 2, 2, "n_ctx", eo.o.n_ctx < mb->m->hp.n_ctx_train ? eo.o.n_ctx : mb->m->hp.n_ctx_train,
                              1, mb->m->hp.n_ctx_train);
    eo.o.step_tokens = (int)lq_opt_int(L, 2, 2, "step_tokens", eo.o.step_tokens, 1, 65536);
    lq_engine_ud *u = lua_newuserdatauv(L, sizeof *u, 0);
    u->e = NULL;
    u->mb = NULL;
    u->n_ctx = eo.o.n_ctx;
    luaL_setmetatable(L, LQ_ENGINE);
    qi_err err = {0};
    if (qi_engine_create(mb->m, &eo.o, &u->e, &err)) return lq_fail(L, &err);
    lq_note_plan(L, u->e);
    u->mb = mb;
    mb->refs++;
    return 1;
}

static int check_seq(lua_State *L, int idx) {
    lua_Integer id = luaL_checkinteger(L, idx);
    luaL_argcheck(L, id >= 0 && id <= 1 << 20, idx, "not a sequence id");
    return (int)id;
}

static int engine_add(lua_State *L) {
    lq_engine_ud *u = lq_check_engine(L, 1);
    int id;
    qi_err err = {0};
    if (qi_engine_seq_add(u->e, &id, &err)) return lq_fail(L, &err);
    lua_pushinteger(L, id);
    return 1;
}

static int engine_remove(lua_State *L) {
    lq_engine_ud *u = lq_check_engine(L, 1);
    qi_err err = {0};
    if (qi_engine_seq_remove(u->e, check_seq(L, 2), &err)) return lq_fail(L, &err);
    return 0;
}

/* Read a token list (a table of integers, or one integer) at idx into a
 * qi_malloc'ed array owned by *slot (a scratch field). */
int lq_read_ids(lua_State *L, int idx, int32_t **slot) {
    if (lua_isinteger(L, idx)) {
        *slot = qi_malloc(sizeof(int32_t));
        if (!*slot) return luaL_error(L, "out of memory");
        lua_Integer v = lua_tointeger(L, idx);
        luaL_argcheck(L, v >= 0 && v <= INT32_MAX, idx, "token id out of range");
        (*slot)[0] = (int32_t)v;
        return 1;
    }
    luaL_checktype(L, idx, LUA_TTABLE);
    lua_Integer n = luaL_len(L, idx);
    luaL_argcheck(L, n >= 0 && n <= (1 << 24), idx, "too many tokens");
    *slot = qi_malloc(sizeof(int32_t) * (size_t)(n > 0 ? n : 1));
    if (!*slot) return luaL_error(L, "out of memory");
    for (lua_Integer i = 1; i <= n; i++) {
        lua_geti(L, idx, i);
        if (!lua_isinteger(L, -1))
            luaL_argerror(L, idx, lua_pushfstring(L, "token %I: integer expected, got %s", i, luaL_typename(L, -1)));
        lua_Integer v = lua_tointeger(L, -1);
        if (v < 0 || v > INT32_MAX) luaL_argerror(L, idx, lua_pushfstring(L, "token %I: id %I out of range", i, v));
        (*slot)[i - 1] = (int32_t)v;
        lua_pop(L, 1);
    }
    return (int)n;
}

void lq_push_ids(lua_State *L, const int32_t *ids, size_t n) {
    lua_createtable(L, (int)n, 0);
    for (size_t i = 0; i < n; i++) {
        lua_pushinteger(L, ids[i]);
        lua_rawseti(L, -2, (lua_Integer)i + 1);
    }
}

static int engine_feed(lua_State *L) {
    lq_engine_ud *u = lq_check_engine(L, 1);
    int id = check_seq(L, 2);
    bool all = lua_toboolean(L, 4);
    lq_scratch *s = lq_scratch_push(L);
    int n = lq_read_ids(L, 3, &s->ids);
    qi_err err = {0};
    if (qi_engine_seq_feed(u->e, id, s->ids, n, all, &err)) return lq_fail(L, &err);
    return 0;
}

static int engine_step(lua_State *L) {
    lq_engine_ud *u = lq_check_engine(L, 1);
    int n = 0;
    qi_err err = {0};
    if (qi_engine_step(u->e, &n, &err)) return lq_fail(L, &err);
    lua_pushinteger(L, n);
    return 1;
}

static int engine_pending(lua_State *L) {
    lua_pushinteger(L, qi_engine_seq_pending(lq_check_engine(L, 1)->e, check_seq(L, 2)));
    return 1;
}

static int engine_n_past(lua_State *L) {
    lua_pushinteger(L, qi_engine_seq_n_past(lq_check_engine(L, 1)->e, check_seq(L, 2)));
    return 1;
}

/* The logits row of (id, row) for argmax/logprob/topk. */
static const float *logits_of(lua_State *L, lq_engine_ud *u, int id, int row_arg) {
    lua_Integer row = luaL_optinteger(L, row_arg, -1);
    int n = qi_engine_seq_n_logits(u->e, id);
    if (n == 0) luaL_error(L, "sequence %d has no logits (feed it and step first)", id);
    luaL_argcheck(L, row == -1 || (row >= 1 && row <= n), row_arg, "row out of range (1..n_logits, or -1 for the last)");
    return qi_engine_seq_logits(u->e, id, row == -1 ? -1 : (int)row - 1);
}

static int engine_argmax(lua_State *L) {
    lq_engine_ud *u = lq_check_engine(L, 1);
    int id = check_seq(L, 2);
    const float *lg = logits_of(L, u, id, 3);
    lua_pushinteger(L, qi_argmax(lg, u->mb->m->hp.n_vocab));
    return 1;
}

static int engine_logprob(lua_State *L) {
    lq_engine_ud *u = lq_check_engine(L, 1);
    int id = check_seq(L, 2);
    lua_Integer tok = luaL_checkinteger(L, 3);
    const int V = u->mb->m->hp.n_vocab;
    luaL_argcheck(L, tok >= 0 && tok < V, 3, "token id out of the vocabulary");
    lua_pushnumber(L, qi_log_prob(logits_of(L, u, id, 4), V, (int)tok));
    return 1;
}

/* engine:topk(id, k[, row]) -> ids, logprobs (best first). */
static int engine_topk(lua_State *L) {
    lq_engine_ud *u = lq_check_engine(L, 1);
    int id = check_seq(L, 2);
    lua_Integer k = luaL_checkinteger(L, 3);
    luaL_argcheck(L, k >= 1 && k <= 1024, 3, "k must be in 1..1024");
    const float *lg = logits_of(L, u, id, 4);
    const int V = u->mb->m->hp.n_vocab;
    if (k > V) k = V;
    lq_scratch *s = lq_scratch_push(L);
    s->ids = qi_malloc(sizeof(int32_t) * (size_t)k);
    if (!s->ids) return luaL_error(L, "out of memory");
    int n = 0; /* insertion into a sorted list of at most k: k is small */
    for (int i = 0; i < V; i++) {
        if (n == k && !(lg[i] > lg[s->ids[n - 1]])) continue;
        int j = n < k ? n++ : n - 1;
        while (j > 0 && lg[i] > lg[s->ids[j - 1]]) {
            s->ids[j] = s->ids[j - 1];
            j--;
        }
        s->ids[j] = i;
    }
    lq_push_ids(L, s->ids, (size_t)n);
    lua_createtable(L, n, 0);
    for (int i = 0; i < n; i++) {
        lua_pushnumber(L, qi_log_prob(lg, V, s->ids[i]));
        lua_rawseti(L, -2, i + 1);
    }
    return 2;
}

void lq_set_num(lua_State *L, const char *k, double v) {
    lua_pushnumber(L, v);
    lua_setfield(L, -2, k);
}
void lq_set_int(lua_State *L, const char *k, lua_Integer v) {
    lua_pushinteger(L, v);
    lua_setfield(L, -2, k);
}
void lq_set_str(lua_State *L, const char *k, const char *v) {
    lua_pushstring(L, v);
    lua_setfield(L, -2, k);
}

/* engine:kv_stats(id): working/offloaded tokens and bytes, summed over the
 * sequence's (layer, KV head) streams, and per stream. */
static int engine_kv_stats(lua_State *L) {
    lq_engine_ud *u = lq_check_engine(L, 1);
    int id = check_seq(L, 2);
    qi_engine_kv_seq ks;
    qi_engine_kv_seq_stats(u->e, id, &ks);
    const qi_hparams *hp = &u->mb->m->hp;
    const double streams = (double)hp->n_layer * hp->n_head_kv;
    lua_createtable(L, 0, 10);
    lq_set_int(L, "work_tokens", ks.work_tokens);
    lq_set_int(L, "attn_tokens", ks.attn_tokens);
    lq_set_num(L, "attn_tokens_per_stream", ks.attn_tokens / streams);
    lq_set_int(L, "off_tokens", ks.off_tokens);
    lq_set_int(L, "work_bytes", (lua_Integer)ks.work_bytes);
    lq_set_int(L, "off_bytes", (lua_Integer)ks.off_bytes);
    lq_set_num(L, "work_tokens_per_stream", ks.work_tokens / streams);
    lq_set_num(L, "off_tokens_per_stream", ks.off_tokens / streams);
    lq_set_int(L, "streams", (lua_Integer)streams);
    lq_set_int(L, "n_past", qi_engine_seq_n_past(u->e, id));
    return 1;
}

static int engine_pool_stats(lua_State *L) {
    lq_engine_ud *u = lq_check_engine(L, 1);
    qi_engine_kv_pool p;
    qi_engine_kv_pool_stats(u->e, &p);
    lua_createtable(L, 0, 7);
    lq_set_int(L, "block_bytes", (lua_Integer)p.block_bytes);
    lq_set_int(L, "work_blocks", p.work_blocks);
    lq_set_int(L, "off_blocks", p.off_blocks);
    lq_set_int(L, "peak_work_blocks", p.peak_work_blocks);
    lq_set_int(L, "peak_off_blocks", p.peak_off_blocks);
    lq_set_int(L, "max_blocks", p.max_blocks);
    return 1;
}

/* engine:profile() -> {seconds = {matmul=, ...}, calls = {...}, matmul_bytes, steps, copies, copy_bytes,
 * kv_block_moves, replans, replan_bytes, replan_seconds} */
static int engine_profile(lua_State *L) {
    lq_engine_ud *u = lq_check_engine(L, 1);
    qi_engine_prof p;
    qi_engine_profile(u->e, &p);
    lua_createtable(L, 0, 4);
    lua_createtable(L, 0, QI_OP_COUNT);
    for (int k = 0; k < QI_OP_COUNT; k++) lq_set_num(L, qi_op_kind_name((qi_op_kind)k), p.seconds[k]);
    lua_setfield(L, -2, "seconds");
    lua_createtable(L, 0, QI_OP_COUNT);
    for (int k = 0; k < QI_OP_COUNT; k++) lq_set_int(L, qi_op_kind_name((qi_op_kind)k), p.calls[k]);
    lua_setfield(L, -2, "calls");
    lq_set_num(L, "matmul_bytes", p.matmul_bytes);
    lq_set_int(L, "steps", p.steps);
    lq_set_int(L, "copies", p.copies);
    lq_set_num(L, "copy_bytes", p.copy_bytes);
    lq_set_int(L, "kv_block_moves", p.kv_block_moves);
    lq_set_int(L, "replans", p.replans);
    lq_set_num(L, "replan_bytes", p.replan_bytes);
    lq_set_num(L, "replan_seconds", p.replan_seconds);
    return 1;
}

/* engine:replan(placement): the plan from the next step on (a --placement
 * value); the move's cost. */
static int engine_replan(lua_State *L) {
    lq_engine_ud *u = lq_check_engine(L, 1);
    const char *spec = luaL_checkstring(L, 2);
    qi_engine_replan_cost c;
    qi_err err = {0};
    if (qi_engine_replan_spec(u->e, spec, &c, &err)) return lq_fail(L, &err);
    lua_createtable(L, 0, 4);
    lq_set_num(L, "weight_bytes", c.weight_bytes);
    lq_set_int(L, "kv_blocks", c.kv_blocks);
    lq_set_num(L, "kv_bytes", c.kv_bytes);
    lq_set_num(L, "seconds", c.seconds);
    return 1;
}

/* engine:plan(): the plan in force, in the plan-file format. */
static int engine_plan(lua_State *L) {
    const qi_plan *p = qi_engine_plan(lq_check_engine(L, 1)->e);
    const int n = qi_plan_format(p, NULL, 0);
    char *buf = lua_newuserdatauv(L, (size_t)n + 1, 0);
    qi_plan_format(p, buf, (size_t)n + 1);
    lua_pushlstring(L, buf, (size_t)n);
    return 1;
}

/* engine:sim(): the simulated machine's profile name, or nil (real devices). */
static int engine_sim(lua_State *L) {
    const char *p = qi_engine_sim_profile(lq_check_engine(L, 1)->e);
    if (p) lua_pushstring(L, p);
    else lua_pushnil(L);
    return 1;
}

/* engine:packed(): the matrices its devices multiply by in a packed form
 * of their own (the engine option repack). */
static int engine_packed(lua_State *L) {
    lua_pushinteger(L, qi_engine_n_packed(lq_check_engine(L, 1)->e));
    return 1;
}

static int engine_policy(lua_State *L) {
    lua_pushstring(L, qi_engine_kv_policy_name(lq_check_engine(L, 1)->e));
    return 1;
}

static int engine_tostring(lua_State *L) {
    lq_engine_ud *u = luaL_checkudata(L, 1, LQ_ENGINE);
    if (u->e) lua_pushfstring(L, "qinfer.engine (%s, %p)", qi_engine_kv_policy_name(u->e), (void *)u->e);
    else lua_pushstring(L, "qinfer.engine (closed)");
    return 1;
}

/* ---- model methods ------------------------------------------------------------------ */

static int model_gc(lua_State *L) {
    lq_model_ud *u = luaL_checkudata(L, 1, LQ_MODEL);
    lq_model_unref(u->mb);
    u->mb = NULL;
    return 0;
}

/* qinfer.load(name_or_path, {threads=, repack=false}) */
static int l_load(lua_State *L) {
    const char *arg = luaL_checkstring(L, 1);
    static const char *const keys[] = {"threads", "repack", NULL};
    lq_opts_check(L, 2, 2, keys);
    int threads = (int)lq_opt_int(L, 2, 2, "threads", default_threads(L), 1, 1024);
    const bool repack = lq_opt_bool(L, 2, 2, "repack", false);
    /* One model per (argument, threads, repack) and state: a sweep loads
     * each once. */
    lua_getfield(L, LUA_REGISTRYINDEX, "qinfer.models");
    int cache = lua_gettop(L);
    lua_pushfstring(L, "%s\n%d\n%d", arg, threads, (int)repack);
    if (lua_gettable(L, cache) == LUA_TUSERDATA) return 1;
    lua_pop(L, 1);
    lq_model_ud *u = lua_newuserdatauv(L, sizeof *u, 0);
    u->mb = NULL;
    luaL_setmetatable(L, LQ_MODEL);
    lq_model *mb = qi_calloc(1, sizeof *mb);
    if (!mb) return luaL_error(L, "out of memory");
    u->mb = mb;
    mb->refs = 1;
    mb->n_threads = threads;
    mb->repack = repack;
    qi_err err = {0};
    if (qi_cache_resolve(arg, "model", mb->path, sizeof mb->path, &err) || qi_model_load(mb->path, &mb->m, &err))
        return lq_fail(L, &err);
    const qi_cache_entry *e = qi_cache_find(arg, "model");
    if (e && strcmp(mb->path, arg) != 0) snprintf(mb->sha256, sizeof mb->sha256, "%s", e->sha256);
    lua_pushfstring(L, "%s\n%d\n%d", arg, threads, (int)repack);
    lua_pushvalue(L, -2);
    lua_settable(L, cache);
    return 1;
}

/* model:tokenize(text, {add_special=true, parse_special=false}) -> {ids} */
static int model_tokenize(lua_State *L) {
    lq_model *mb = lq_check_model(L, 1);
    size_t len;
    const char *text = luaL_checklstring(L, 2, &len);
    static const char *const keys[] = {"add_special", "parse_special", NULL};
    lq_opts_check(L, 3, 3, keys);
    bool add = lq_opt_bool(L, 3, 3, "add_special", true), parse = lq_opt_bool(L, 3, 3, "parse_special", false);
    lq_scratch *s = lq_scratch_push(L);
    size_t n;
    qi_err err = {0};
    if (qi_tokenize(mb->m->tok, text, len, add, parse, &s->ids, &n, &err)) return lq_fail(L, &err);
    lq_push_ids(L, s->ids, n);
    return 1;
}

/* model:detokenize(ids, {special=false}) -> text */
static int model_detokenize(lua_State *L) {
    lq_model *mb = lq_check_model(L, 1);
    static const char *const keys[] = {"special", NULL};
    lq_opts_check(L, 3, 3, keys);
    bool special = lq_opt_bool(L, 3, 3, "special", false);
    lq_scratch *s = lq_scratch_push(L);
    int n = lq_read_ids(L, 2, &s->ids);
    size_t cap = qi_tokenizer_max_piece(mb->m->tok) + QI_DETOK_MAX_PENDING;
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    qi_detok d;
    qi_detok_init(&d);
    for (int i = 0; i < n; i++) {
        char *p = luaL_prepbuffsize(&b, cap);
        luaL_addsize(&b, qi_detok_push(mb->m->tok, &d, s->ids[i], special, p, cap));
    }
    char *p = luaL_prepbuffsize(&b, QI_DETOK_MAX_PENDING);
    luaL_addsize(&b, qi_detok_flush(&d, p, QI_DETOK_MAX_PENDING));
    luaL_pushresult(&b);
    return 1;
}

static int model_info(lua_State *L) {
    lq_model *mb = lq_check_model(L, 1);
    if (!mb->sha256[0]) {
        qi_err err = {0};
        char path[1024];
        if (lq_model_identity(mb->path, path, sizeof path, mb->sha256, &err)) return lq_fail(L, &err);
    }
    const qi_hparams *hp = &mb->m->hp;
    lua_createtable(L, 0, 16);
    lq_set_str(L, "arch", hp->arch_name);
    lq_set_int(L, "n_params", (lua_Integer)mb->m->n_params);
    lq_set_int(L, "weight_bytes", (lua_Integer)mb->m->weight_bytes);
    lq_set_int(L, "n_layer", hp->n_layer);
    lq_set_int(L, "n_ctx_train", hp->n_ctx_train);
    lq_set_int(L, "n_vocab", hp->n_vocab);
    lq_set_int(L, "n_embd", hp->n_embd);
    lq_set_int(L, "n_head", hp->n_head);
    lq_set_int(L, "n_head_kv", hp->n_head_kv);
    lq_set_int(L, "head_dim", hp->head_dim);
    lq_set_int(L, "n_ff", hp->n_ff);
    lq_set_int(L, "threads", mb->n_threads);
    /* the matrices its engines pack by default (qinfer.load's repack) */
    lq_set_int(L, "packed", mb->repack ? qi_model_n_packable(mb->m) : 0);
    lq_set_int(L, "bos", qi_tokenizer_bos(mb->m->tok));
    lq_set_int(L, "eos", qi_tokenizer_eos(mb->m->tok));
    lq_set_str(L, "path", mb->path);
    lq_set_str(L, "sha256", mb->sha256);
    return 1;
}

static int model_tostring(lua_State *L) {
    lq_model_ud *u = luaL_checkudata(L, 1, LQ_MODEL);
    if (u->mb) lua_pushfstring(L, "qinfer.model (%s)", u->mb->path);
    else lua_pushstring(L, "qinfer.model (closed)");
    return 1;
}

/* ---- registration --------------------------------------------------------------------- */

static const luaL_Reg k_model_methods[] = {
    {"tokenize", model_tokenize},
    {"detokenize", model_detokenize},
    {"info", model_info},
    {"engine", model_engine},
    {NULL, NULL},
};

static const luaL_Reg k_engine_methods[] = {
    {"add", engine_add},
    {"remove", engine_remove},
    {"feed", engine_feed},
    {"step", engine_step},
    {"pending", engine_pending},
    {"n_past", engine_n_past},
    {"argmax", engine_argmax},
    {"logprob", engine_logprob},
    {"topk", engine_topk},
    {"kv_stats", engine_kv_stats},
    {"pool_stats", engine_pool_stats},
    {"profile", engine_profile},
    {"policy", engine_policy},
    {"replan", engine_replan},
    {"plan", engine_plan},
    {"packed", engine_packed},
    {"sim", engine_sim},
    {"close", engine_close},
    {NULL, NULL},
};

static const luaL_Reg k_functions[] = {
    {"load", l_load},
    {NULL, NULL},
};

/* close: also the __close metamethod (`local e <close> = m:engine{}`). Not
 * for models, which qinfer.load shares through its cache. */
static void new_class(lua_State *L, const char *name, const luaL_Reg *methods, lua_CFunction gc, bool close,
                      lua_CFunction tostring) {
    luaL_newmetatable(L, name);
    lua_newtable(L);
    luaL_setfuncs(L, methods, 0);
    lua_setfield(L, -2, "__index");
    lua_pushcfunction(L, gc);
    lua_setfield(L, -2, "__gc");
    if (close) {
        lua_pushcfunction(L, gc);
        lua_setfield(L, -2, "__close");
    }
    lua_pushcfunction(L, tostring);
    lua_setfield(L, -2, "__tostring");
    lua_pop(L, 1);
}

int luaopen_qinfer(lua_State *L) {
    new_class(L, LQ_MODEL, k_model_methods, model_gc, false, model_tostring);
    new_class(L, LQ_ENGINE, k_engine_methods, engine_close, true, engine_tostring);
    luaL_newmetatable(L, LQ_SCRATCH);
    lua_pushcfunction(L, scratch_close);
    lua_setfield(L, -2, "__close");
    lua_pushcfunction(L, scratch_close);
    lua_setfield(L, -2, "__gc");
    lua_pop(L, 1);
    luaL_getsubtable(L, LUA_REGISTRYINDEX, "qinfer.models");
    lua_pop(L, 1);
    luaL_newlib(L, k_functions);
    luaL_setfuncs(L, lq_measure_functions, 0);
    luaL_setfuncs(L, lq_serve_functions, 0);
    lq_set_str(L, "version", QI_VERSION);
    return 1;
}

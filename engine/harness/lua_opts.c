/* lua_opts.c - the option tables of the `qinfer` Lua module: unknown keys
 * and wrong types refused as argument errors naming the key, and an
 * engine's table (model:engine{...}, and the measured helpers' options)
 * read into qi_engine_opts: the KV budget and parameters, the simulated
 * machine, sparsity and the neuron split, whose profile and policy live in
 * userdata so that an error raised half-way frees them (lua_api.c says
 * why). */
#include <lauxlib.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lua_int.h"
#include "neuron/neuron_policy.h"
#include "placement/placement_policy.h"

/* ---- option tables ----------------------------------------------------------------- */

/* Fail on a key of the table at idx (argument `arg`) not in `known`. */
void lq_opts_check(lua_State *L, int idx, int arg, const char *const *known) {
    if (lua_isnoneornil(L, idx)) return;
    luaL_checktype(L, idx, LUA_TTABLE);
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        lua_pop(L, 1);
        if (lua_type(L, -1) != LUA_TSTRING) luaL_argerror(L, arg, "option keys must be strings");
        const char *k = lua_tostring(L, -1);
        bool ok = false;
        for (int i = 0; known[i] && !ok; i++) ok = strcmp(known[i], k) == 0;
        if (!ok) {
            luaL_Buffer b;
            luaL_buffinit(L, &b);
            for (int i = 0; known[i]; i++) {
                if (i) luaL_addstring(&b, ", ");
                luaL_addstring(&b, known[i]);
            }
            luaL_pushresult(&b);
            luaL_argerror(L, arg, lua_pushfstring(L, "unknown option '%s' (options: %s)", k, lua_tostring(L, -1)));
        }
    }
}

/* Push opts[key] (nil when opts is absent). */
int lq_opt_get(lua_State *L, int idx, const char *key) {
    if (lua_type(L, idx) != LUA_TTABLE) {
        lua_pushnil(L);
        return LUA_TNIL;
    }
    return lua_getfield(L, idx, key);
}

int lq_opt_wrong(lua_State *L, int arg, const char *key, const char *want) {
    return luaL_argerror(L, arg, lua_pushfstring(L, "option '%s': %s expected, got %s", key, want,
                                                 luaL_typename(L, -1)));
}

long lq_opt_int(lua_State *L, int idx, int arg, const char *key, long def, long lo, long hi) {
    if (lq_opt_get(L, idx, key) == LUA_TNIL) {
        lua_pop(L, 1);
        return def;
    }
    if (!lua_isinteger(L, -1)) lq_opt_wrong(L, arg, key, "integer");
    lua_Integer v = lua_tointeger(L, -1);
    if (v < lo || v > hi)
        luaL_argerror(L, arg, lua_pushfstring(L, "option '%s': %I is not in %I..%I", key, v, (lua_Integer)lo,
                                              (lua_Integer)hi));
    lua_pop(L, 1);
    return (long)v;
}

double lq_opt_num(lua_State *L, int idx, int arg, const char *key, double def) {
    if (lq_opt_get(L, idx, key) == LUA_TNIL) {
        lua_pop(L, 1);
        return def;
    }
    if (lua_type(L, -1) != LUA_TNUMBER) lq_opt_wrong(L, arg, key, "number");
    double v = lua_tonumber(L, -1);
    lua_pop(L, 1);
    return v;
}

bool lq_opt_bool(lua_State *L, int idx, int arg, const char *key, bool def) {
    int t = lq_opt_get(L, idx, key);
    if (t == LUA_TNIL) {
        lua_pop(L, 1);
        return def;
    }
    if (t != LUA_TBOOLEAN) lq_opt_wrong(L, arg, key, "boolean");
    bool v = lua_toboolean(L, -1);
    lua_pop(L, 1);
    return v;
}

/* The string stays valid while the options table holds it. */
const char *lq_opt_str(lua_State *L, int idx, int arg, const char *key, const char *def) {
    if (lq_opt_get(L, idx, key) == LUA_TNIL) {
        lua_pop(L, 1);
        return def;
    }
    if (lua_type(L, -1) != LUA_TSTRING) lq_opt_wrong(L, arg, key, "string");
    const char *v = lua_tostring(L, -1);
    lua_pop(L, 1);
    return v;
}

/* kv_budget: an integer is tokens, a float a fraction in (0, 1], a string
 * "P%" a percentage (or "N" / "0.F" as the command line takes). */
static void read_budget(lua_State *L, int idx, int arg, lq_eopts *eo) {
    int t = lq_opt_get(L, idx, "kv_budget");
    if (t == LUA_TNIL) {
        lua_pop(L, 1);
        return;
    }
    eo->kv_given = true;
    if (lua_isinteger(L, -1)) {
        lua_Integer v = lua_tointeger(L, -1);
        if (v < 1 || v > (1 << 24))
            luaL_argerror(L, arg, lua_pushfstring(L, "option 'kv_budget': %I tokens is not in 1..%d", v, 1 << 24));
        eo->o.kv_budget_tokens = (int)v;
    } else if (t == LUA_TNUMBER) {
        double v = lua_tonumber(L, -1);
        if (!(v > 0.0 && v <= 1.0))
            luaL_argerror(L, arg, lua_pushfstring(L, "option 'kv_budget': %f is a fraction and must lie in (0, 1] "
                                                     "(an integer is a token count)", v));
        eo->o.kv_budget_frac = v;
    } else if (t == LUA_TSTRING) {
        const char *s = lua_tostring(L, -1);
        size_t len = strlen(s);
        char *end;
        double v = strtod(s, &end);
        bool pct = len > 1 && s[len - 1] == '%';
        if (end == s || (pct ? end != s + len - 1 : *end != 0) || !isfinite(v))
            luaL_argerror(L, arg, lua_pushfstring(L, "option 'kv_budget': '%s' is not a token count, a percentage "
                                                     "('50%%') or a fraction", s));
        if (pct || strchr(s, '.')) {
            if (pct) v /= 100.0;
            if (!(v > 0.0 && v <= 1.0))
                luaL_argerror(L, arg, lua_pushfstring(L, "option 'kv_budget': '%s' is not in (0, 100%%]", s));
            eo->o.kv_budget_frac = v;
        } else {
            if (!(v >= 1 && v <= (1 << 24) && v == floor(v)))
                luaL_argerror(L, arg, lua_pushfstring(L, "option 'kv_budget': '%s' is not a token count", s));
            eo->o.kv_budget_tokens = (int)v;
        }
    } else {
        lq_opt_wrong(L, arg, "kv_budget", "number or string");
    }
    lua_pop(L, 1);
}

static void read_kv_params(lua_State *L, int idx, int arg, lq_eopts *eo) {
    int t = lq_opt_get(L, idx, "kv_params");
    if (t == LUA_TNIL) {
        lua_pop(L, 1);
        return;
    }
    if (t != LUA_TTABLE) lq_opt_wrong(L, arg, "kv_params", "table");
    int tbl = lua_gettop(L);
    lua_pushnil(L);
    while (lua_next(L, tbl)) {
        if (lua_type(L, -2) != LUA_TSTRING) luaL_argerror(L, arg, "option 'kv_params': keys must be strings");
        const char *k = lua_tostring(L, -2);
        char val[QI_PARAM_VALUE_MAX];
        switch (lua_type(L, -1)) {
        case LUA_TBOOLEAN: snprintf(val, sizeof val, "%s", lua_toboolean(L, -1) ? "true" : "false"); break;
        case LUA_TNUMBER:
            if (lua_isinteger(L, -1)) snprintf(val, sizeof val, "%lld", (long long)lua_tointeger(L, -1));
            else snprintf(val, sizeof val, "%.17g", (double)lua_tonumber(L, -1));
            break;
        case LUA_TSTRING: snprintf(val, sizeof val, "%s", lua_tostring(L, -1)); break;
        default:
            luaL_argerror(L, arg, lua_pushfstring(L, "option 'kv_params.%s': number, string or boolean expected, "
                                                     "got %s", k, luaL_typename(L, -1)));
        }
        qi_err e = {0};
        if (qi_params_set(&eo->params, k, val, &e))
            luaL_argerror(L, arg, lua_pushfstring(L, "option 'kv_params.%s': %s", k, e.msg));
        lua_pop(L, 1);
    }
    lua_pop(L, 1);
    eo->kv_given = eo->kv_given || eo->params.n > 0;
}

/* sim_params = {gpu_matmul_memory = 0.6, noise = 0.05, ...}: numbers; the
 * simulator checks the names and ranges when the engine is made. */
static void read_sim_params(lua_State *L, int idx, int arg, lq_eopts *eo) {
    const int t = lq_opt_get(L, idx, "sim_params");
    if (t == LUA_TNIL) {
        lua_pop(L, 1);
        return;
    }
    if (t != LUA_TTABLE) lq_opt_wrong(L, arg, "sim_params", "table");
    if (!eo->o.sim) luaL_argerror(L, arg, "option 'sim_params' without 'sim' (a hardware profile)");
    lua_pushnil(L);
    while (lua_next(L, -2)) {
        if (lua_type(L, -2) != LUA_TSTRING) luaL_argerror(L, arg, "option 'sim_params': keys must be strings");
        const char *k = lua_tostring(L, -2);
        if (!lua_isnumber(L, -1) || lua_type(L, -1) != LUA_TNUMBER)
            luaL_argerror(L, arg, lua_pushfstring(L, "option 'sim_params.%s': number expected, got %s", k,
                                                  luaL_typename(L, -1)));
        char val[64];
        snprintf(val, sizeof val, "%.17g", (double)lua_tonumber(L, -1));
        qi_err e = {0};
        if (qi_params_set(&eo->sim_params, k, val, &e))
            luaL_argerror(L, arg, lua_pushfstring(L, "option 'sim_params.%s': %s", k, e.msg));
        lua_pop(L, 1);
    }
    lua_pop(L, 1);
}

/* sparsity=S in [0, 1) with sparsity_calib=FILE (qinfer profile
 * --sparsity-out) and sparsity_mode='teal'|'cats' (default teal);
 * sparse_max_density=D in [0, 1]. S = 0 without a file: dense. */
static void read_sparsity(lua_State *L, int idx, int arg, lq_eopts *eo, const lq_model *mb) {
    const char *calib = lq_opt_str(L, idx, arg, "sparsity_calib", NULL);
    const char *mode_s = lq_opt_str(L, idx, arg, "sparsity_mode", "teal");
    lua_getfield(L, idx, "sparsity");
    const bool given = !lua_isnil(L, -1);
    if (given && lua_type(L, -1) != LUA_TNUMBER) lq_opt_wrong(L, arg, "sparsity", "number");
    const double s = given ? lua_tonumber(L, -1) : 0.0;
    lua_pop(L, 1);
    lua_getfield(L, idx, "sparse_max_density");
    if (!lua_isnil(L, -1)) {
        if (lua_type(L, -1) != LUA_TNUMBER) lq_opt_wrong(L, arg, "sparse_max_density", "number");
        const double d = lua_tonumber(L, -1);
        if (!(d >= 0.0 && d <= 1.0)) luaL_argerror(L, arg, "option 'sparse_max_density': not in [0, 1]");
        eo->o.sparse_max_density = d;
    }
    lua_pop(L, 1);
    qi_sparsity_mode mode;
    qi_err e = {0};
    if (qi_sparsity_mode_parse(mode_s, &mode, &e))
        luaL_argerror(L, arg, lua_pushfstring(L, "option 'sparsity_mode': %s", e.msg));
    if (!given && !calib) return;
    if (!(s >= 0.0 && s < 1.0)) luaL_argerror(L, arg, "option 'sparsity': not in [0, 1)");
    if (s == 0.0 && !calib) return; /* dense */
    if (!calib) luaL_argerror(L, arg, "option 'sparsity' needs 'sparsity_calib' (qinfer profile --sparsity-out FILE)");
    const int n_layer = mb->m->hp.n_layer;
    if (n_layer > LQ_MAX_LAYERS) luaL_argerror(L, arg, "option 'sparsity': the model has too many layers");
    qi_sparsity sp;
    if (qi_sparsity_load(calib, mode, s, n_layer, &sp, &e))
        luaL_argerror(L, arg, lua_pushfstring(L, "option 'sparsity_calib': %s", e.msg));
    memcpy(eo->sp_thr, sp.thr, sizeof(float) * (size_t)n_layer * QI_SITE_COUNT);
    qi_sparsity_free(&sp);
    sp.thr = eo->sp_thr;
    eo->sp = sp;
    eo->o.sparsity = &eo->sp;
    eo->kv_given = true; /* perplexity decodes token by token, as with a KV policy */
}

/* The registry's current split (read_neuron), freed when collected. */
#define LQ_NSPLIT_KEY "qinfer.nsplit"
static int nsplit_gc(lua_State *L) {
    qi_neuron_split_fini(luaL_checkudata(L, 1, LQ_NSPLIT_KEY));
    return 0;
}

/* neuron_policy='static'|'qinfer:ratio=3' with neuron_profile=FILE or
 * 'uniform' and neuron_budget='30%' or bytes (a string with K, M or G, or
 * an integer); neuron_swap_every=N (the qinfer policy's swaps) and
 * neuron_swap_worker=true (made by the background worker, uploading on
 * the fast device's copy stream, or its main one with
 * neuron_swap_stream='main'): the hot
 * neurons on the second device of `devices` (qi_neuron_split_make). */
static void read_neuron(lua_State *L, int idx, int arg, lq_eopts *eo, const lq_model *mb) {
    /* sim_cold_density=D: the what-if density of the CPU's FFN neurons on
     * a simulated machine (the engine checks it) */
    eo->o.sim_cold_density = lq_opt_num(L, idx, arg, "sim_cold_density", 0.0);
    /* sim_activity=SPEC: the predictor-gated FFN's activity model (qinfer/activity.h) */
    eo->o.sim_activity = lq_opt_str(L, idx, arg, "sim_activity", NULL);
    const char *pol = lq_opt_str(L, idx, arg, "neuron_policy", NULL);
    const char *prof = lq_opt_str(L, idx, arg, "neuron_profile", NULL);
    const int every = (int)lq_opt_int(L, idx, arg, "neuron_swap_every", 0, 0, 1 << 20);
    const bool worker = lq_opt_bool(L, idx, arg, "neuron_swap_worker", false);
    const char *stream = lq_opt_str(L, idx, arg, "neuron_swap_stream", NULL);
    if (stream && strcmp(stream, "copy") != 0 && strcmp(stream, "main") != 0)
        luaL_argerror(L, arg, lua_pushfstring(L, "option 'neuron_swap_stream': '%s' is not a stream (copy or main)",
                                              stream));
    char budget[64] = "";
    lua_getfield(L, idx, "neuron_budget");
    if (lua_isinteger(L, -1)) snprintf(budget, sizeof budget, "%lld", (long long)lua_tointeger(L, -1));
    else if (lua_type(L, -1) == LUA_TSTRING) snprintf(budget, sizeof budget, "%s", lua_tostring(L, -1));
    else if (!lua_isnil(L, -1)) lq_opt_wrong(L, arg, "neuron_budget", "string or integer");
    lua_pop(L, 1);
    if (!pol) {
        if (prof || budget[0] || every || worker || stream)
            luaL_argerror(L, arg, lua_pushfstring(L, "option '%s' without 'neuron_policy'",
                                                  prof        ? "neuron_profile"
                                                  : budget[0] ? "neuron_budget"
                                                  : every     ? "neuron_swap_every"
                                                  : worker    ? "neuron_swap_worker"
                                                              : "neuron_swap_stream"));
        return;
    }
    if (!prof || !budget[0])
        luaL_argerror(L, arg, "option 'neuron_policy' needs 'neuron_profile' (a file or 'uniform') and "
                              "'neuron_budget' ('30%' or bytes)");
    qi_neuron_split *sp = lua_newuserdatauv(L, sizeof *sp, 0);
    memset(sp, 0, sizeof *sp);
    if (luaL_newmetatable(L, LQ_NSPLIT_KEY)) {
        lua_pushcfunction(L, nsplit_gc);
        lua_setfield(L, -2, "__gc");
    }
    lua_setmetatable(L, -2);
    lua_setfield(L, LUA_REGISTRYINDEX, LQ_NSPLIT_KEY ".current"); /* held there; the last one collected */
    qi_err e = {0};
    if (qi_neuron_split_make(mb->m, pol, prof, budget, sp, &e))
        luaL_argerror(L, arg, lua_pushfstring(L, "option 'neuron_policy': %s", e.msg));
    if (worker && !every)
        luaL_argerror(L, arg, "option 'neuron_swap_worker' needs 'neuron_swap_every' (how often the worker is fed)");
    if (stream && !worker)
        luaL_argerror(L, arg, "option 'neuron_swap_stream' says where the background worker uploads, and there is "
                              "none ('neuron_swap_worker')");
    if (every && !sp->has_live)
        luaL_argerror(L, arg, lua_pushfstring(L, "option 'neuron_swap_every': swapping is the qinfer policy's, and the "
                                                 "policy is %s", sp->policy));
    eo->live = sp->live;
    eo->o.neuron_fast = sp->fast;
    eo->o.neuron_activity = sp->activity;
    eo->o.neuron_dev = 1;
    eo->o.neuron_swap_every = every;
    eo->o.neuron_swap_worker = worker;
    eo->o.neuron_swap_main_stream = stream && !strcmp(stream, "main");
    eo->o.neuron_live = &eo->live;
}

void lq_read_engine_opts(lua_State *L, int idx, int arg, lq_eopts *eo, const lq_model *mb) {
    memset(eo, 0, sizeof *eo);
    qi_engine_opts_default(&eo->o);
    qi_params_init(&eo->params);
    eo->o.kv_params = &eo->params;
    eo->o.n_threads = (int)lq_opt_int(L, idx, arg, "threads", mb->n_threads, 1, 1024);
    eo->o.kv_policy = lq_opt_str(L, idx, arg, "kv_policy", "full");
    eo->kv_given = strcmp(eo->o.kv_policy, "full") != 0;
    eo->o.kv_max_bytes = (size_t)lq_opt_int(L, idx, arg, "kv_max_bytes", 0, 0, LONG_MAX);
    eo->o.profile = lq_opt_bool(L, idx, arg, "profile", false);
    eo->o.attn_blas = lq_opt_bool(L, idx, arg, "attn_blas", false);
    eo->o.repack = lq_opt_bool(L, idx, arg, "repack", mb->repack);
    eo->o.devices = lq_opt_str(L, idx, arg, "devices", "cpu");
    eo->o.placement = lq_opt_str(L, idx, arg, "placement", "all-cpu");
    eo->o.sim = lq_opt_str(L, idx, arg, "sim", NULL);
    eo->o.sim_cal = lq_opt_str(L, idx, arg, "sim_cal", NULL);
    if (eo->o.sim_cal && !eo->o.sim) luaL_argerror(L, arg, "option 'sim_cal' without 'sim' (a hardware profile)");
    qi_params_init(&eo->sim_params);
    eo->o.sim_params = &eo->sim_params;
    read_budget(L, idx, arg, eo);
    read_kv_params(L, idx, arg, eo);
    read_sim_params(L, idx, arg, eo);
    read_sparsity(L, idx, arg, eo, mb);
    read_neuron(L, idx, arg, eo, mb);
}

void lq_note_plan(lua_State *L, const qi_engine *e) {
    char json[8192];
    const int n = qi_plan_json(qi_engine_plan(e), json, sizeof json);
    if (n < 0 || (size_t)n >= sizeof json) return; /* a plan that long is not recorded */
    lua_pushstring(L, json);
    lua_setfield(L, LUA_REGISTRYINDEX, LQ_PLACEMENT_KEY);
    if (qi_engine_sim_profile(e)) {
        lua_pushstring(L, qi_engine_sim_profile(e));
        lua_setfield(L, LUA_REGISTRYINDEX, LQ_SIM_KEY);
    }
}

/* lua_run.c - `qinfer run`: an experiment script's sweep, one database run
 * per configuration.
 *
 * The script is loaded and run once; what it returns (or its global
 * `experiment`) is checked and laid out by lua/qinfer/sweep.lua (so the
 * order of configurations and the conversion of --set values are plain Lua,
 * tested by themselves). Each configuration's canonical JSON is hashed into
 * its key (qi_db_config_key); a key the database holds as done is skipped
 * unless --fresh. Otherwise the run is opened (qi_db_run_begin, one
 * transaction), run(cfg, ctx) is called warmup + repetitions times under
 * lq_pcall, and the run is closed done or failed with the Lua message. A
 * failure does not stop the sweep; an interrupt (SIGINT, SIGTERM) does: the
 * open run is rolled back, as a kill would leave it, and qinfer exits.
 *
 * The run function sees ctx = { metric = function(name, value, unit[, opts]),
 * repetition (0..), warmup (true during warm-up calls, whose metrics are
 * dropped), seed, threads, experiment, cache (a table kept for the whole
 * sweep) }. math.randomseed(seed) is called before each configuration.
 *
 * The runner, not the script, loops over repetitions: every metric then
 * carries its repetition number and warm-up is the same for every script
 * without bookkeeping in it (stats.measure is there for loops inside one
 * call). Configurations are enumerated in Lua rather than C because the
 * values are Lua values: their types decide the JSON and the --set
 * conversion.
 *
 * With a shard (--shard I/N) sweep.lua keeps only the configurations of
 * part I of its split; the rest is unchanged, so a shard resumes in its own
 * database as a whole sweep does.
 *
 * Progress is one line on stderr, rewritten in place on a terminal and
 * printed line by line otherwise; each configuration's result (metric means
 * over repetitions) is one line on stdout.
 */
#include <errno.h>
#include <lauxlib.h>
#include <lualib.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "db.h"
#include "lua_harness.h"
#include "lua_int.h"
#include "sha256.h"

volatile sig_atomic_t lq_interrupted;
static lua_State *g_L; /* the state a signal interrupts */

static void interrupt_hook(lua_State *L, lua_Debug *ar) {
    (void)ar;
    lua_sethook(L, NULL, 0, 0);
    luaL_error(L, "interrupted");
}

static void on_signal(int sig) {
    lq_interrupted = 1;
    signal(sig, SIG_DFL); /* a second one ends the process at once */
    /* lua_sethook is safe in a signal handler (the standalone lua does this). */
    if (g_L) lua_sethook(g_L, interrupt_hook, LUA_MASKCALL | LUA_MASKRET | LUA_MASKCOUNT, 1);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- ctx.metric ---------------------------------------------------------------- */

#define MAX_SUMMARY 24

typedef struct {
    qi_db *db;
    int64_t run_id; /* 0: no run open */
    int repetition;
    bool warmup;
    struct {
        char name[64], unit[16];
        double sum, sumsq;
        int n;
    } m[MAX_SUMMARY];
    int n_m;
} run_state;

static bool has_ctrl(const char *v) {
    for (; *v; v++)
        if ((unsigned char)*v < 0x20 || *v == 0x7f) return true;
    return false;
}

static int cmp_cstr(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

/* The params table at idx ({batch = 4}: string keys, number, boolean or
 * string values) as a JSON object, keys sorted, into json (cap bytes), and
 * as "[batch=4]" into label; raises a Lua error for anything else. */
static void params_json(lua_State *L, int idx, char *json, size_t cap, char *label, size_t lcap) {
    const char *keys[16];
    int n = 0;
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        lua_pop(L, 1);
        if (lua_type(L, -1) != LUA_TSTRING) luaL_argerror(L, 4, "option 'params': keys must be strings");
        if (n == 16) luaL_argerror(L, 4, "option 'params': more than 16 keys");
        keys[n++] = lua_tostring(L, -1);
    }
    qsort(keys, (size_t)n, sizeof *keys, cmp_cstr);
    size_t u = (size_t)snprintf(json, cap, "{"), lu = 0;
    label[0] = 0;
    for (int i = 0; i < n; i++) {
        for (const char *k = keys[i]; *k; k++)
            if (!((*k >= 'a' && *k <= 'z') || (*k >= '0' && *k <= '9') || *k == '_'))
                luaL_argerror(L, 4, lua_pushfstring(L, "option 'params': key '%s' is not lower-case letters, digits "
                                                       "and '_'", keys[i]));
        lua_getfield(L, idx, keys[i]);
        char val[64];
        int t = lua_type(L, -1);
        if (t == LUA_TNUMBER && lua_isinteger(L, -1)) snprintf(val, sizeof val, "%lld", (long long)lua_tointeger(L, -1));
        else if (t == LUA_TNUMBER && isfinite(lua_tonumber(L, -1))) snprintf(val, sizeof val, "%.17g", lua_tonumber(L, -1));
        else if (t == LUA_TBOOLEAN) snprintf(val, sizeof val, "%s", lua_toboolean(L, -1) ? "true" : "false");
        else if (t == LUA_TSTRING) {
            const char *v = lua_tostring(L, -1);
            if (strlen(v) > 48 || strpbrk(v, "\"\\,=[]") || has_ctrl(v))
                luaL_argerror(L, 4, "option 'params': a string value is longer than 48 bytes or holds quotes, "
                                    "backslashes, ',', '=', '[', ']' or control characters");
            snprintf(val, sizeof val, "\"%s\"", v);
        } else
            luaL_argerror(L, 4, "option 'params': values must be finite numbers, booleans or strings");
        lua_pop(L, 1);
        u += (size_t)snprintf(json + u, u < cap ? cap - u : 0, "%s\"%s\":%s", i ? "," : "", keys[i], val);
        const char *plain = t == LUA_TSTRING ? val + 1 : val;
        int plen = t == LUA_TSTRING ? (int)strlen(val) - 2 : (int)strlen(val);
        lu += (size_t)snprintf(label + lu, lu < lcap ? lcap - lu : 0, "%s%s=%.*s", i ? "," : "[", keys[i], plen, plain);
    }
    if (n) lu += (size_t)snprintf(label + lu, lu < lcap ? lcap - lu : 0, "]");
    u += (size_t)snprintf(json + u, u < cap ? cap - u : 0, "}");
    if (u >= cap || lu >= lcap) luaL_argerror(L, 4, "option 'params': too long");
}

/* ctx.metric(name, value, unit[, {repetition=, simulated=, params={...}}]) */
static int ctx_metric(lua_State *L) {
    run_state *rs = lua_touserdata(L, lua_upvalueindex(1));
    const char *name = luaL_checkstring(L, 1);
    double v = luaL_checknumber(L, 2);
    const char *unit = luaL_checkstring(L, 3);
    int rep = rs->repetition;
    bool sim = false, has_params = false;
    char pjson[1024], plabel[1024];
    if (!lua_isnoneornil(L, 4)) {
        luaL_checktype(L, 4, LUA_TTABLE);
        if (lua_getfield(L, 4, "repetition") != LUA_TNIL) {
            if (!lua_isinteger(L, -1) || lua_tointeger(L, -1) < 0 || lua_tointeger(L, -1) > (1 << 30))
                luaL_argerror(L, 4, "option 'repetition': integer >= 0 expected");
            rep = (int)lua_tointeger(L, -1);
        }
        if (lua_getfield(L, 4, "simulated") != LUA_TNIL) {
            if (!lua_isboolean(L, -1)) luaL_argerror(L, 4, "option 'simulated': boolean expected");
            sim = lua_toboolean(L, -1);
        }
        lua_pop(L, 2);
        int pt = lua_getfield(L, 4, "params");
        if (pt == LUA_TTABLE) {
            params_json(L, lua_gettop(L), pjson, sizeof pjson, plabel, sizeof plabel);
            has_params = true;
        } else if (pt != LUA_TNIL) {
            luaL_argerror(L, 4, "option 'params': table expected");
        }
        lua_pop(L, 1);
    }
    if (!rs->run_id) return luaL_error(L, "ctx.metric: no run is open (called outside run()?)");
    if (rs->warmup) return 0;
    /* a configuration that made a simulated engine measured nothing real */
    if (lua_getfield(L, LUA_REGISTRYINDEX, LQ_SIM_KEY) == LUA_TSTRING) sim = true;
    lua_pop(L, 1);
    qi_err err = {0};
    if (qi_db_metric_params(rs->db, rs->run_id, name, has_params ? pjson : NULL, v, unit, rep, sim, &err))
        return luaL_error(L, "ctx.metric: %s", err.msg);
    /* the summary line shows the metric as `qinfer results` does: name[key=value] */
    char label[64];
    if (snprintf(label, sizeof label, "%s%s", name, has_params ? plabel : "") >= (int)sizeof label) return 0;
    int i = 0;
    while (i < rs->n_m && strcmp(rs->m[i].name, label) != 0) i++;
    if (i == rs->n_m && i < MAX_SUMMARY) {
        rs->n_m++;
        memset(&rs->m[i], 0, sizeof rs->m[i]);
        snprintf(rs->m[i].name, sizeof rs->m[i].name, "%s", label);
        snprintf(rs->m[i].unit, sizeof rs->m[i].unit, "%s", unit);
    }
    if (i < rs->n_m) {
        rs->m[i].sum += v;
        rs->m[i].sumsq += v * v;
        rs->m[i].n++;
    }
    return 0;
}

/* ---- helpers ---------------------------------------------------------------------- */

void lq_dir_of(const char *path, char *out, size_t cap) {
    const char *slash = strrchr(path, '/');
    if (!slash) snprintf(out, cap, ".");
    else if (slash == path) snprintf(out, cap, "/");
    else snprintf(out, cap, "%.*s", (int)(slash - path), path);
}

static void fmt_eta(double s, char *out, size_t cap) {
    long t = (long)(s + 0.5);
    if (t >= 3600) snprintf(out, cap, "%ldh%02ldm", t / 3600, t / 60 % 60);
    else if (t >= 60) snprintf(out, cap, "%ldm%02lds", t / 60, t % 60);
    else snprintf(out, cap, "%lds", t);
}

/* Load the script, run it, leave its experiment table on the stack. */
qi_status lq_load_experiment(lua_State *L, const char *script, qi_err *err) {
    if (luaL_loadfile(L, script) != LUA_OK) {
        QI_ERR(err, QI_ERR_LUA, "%s", lua_tostring(L, -1));
        lua_pop(L, 1);
        return QI_ERR_LUA;
    }
    char msg[2048];
    if (!lq_pcall(L, 0, 1, msg, sizeof msg, NULL, 0)) return QI_ERR(err, QI_ERR_LUA, "%s", msg);
    if (lua_isnil(L, -1)) {
        lua_pop(L, 1);
        lua_getglobal(L, "experiment");
    }
    return QI_OK;
}

/* sweep.prepare(exp, sets, shard): the plan table replaces the experiment. */
qi_status lq_prepare(lua_State *L, const qi_lua_run_opts *o, qi_err *err) {
    char msg[2048];
    int exp = lua_gettop(L);
    lua_getglobal(L, "require");
    lua_pushstring(L, "qinfer.sweep");
    if (!lq_pcall(L, 1, 1, msg, sizeof msg, NULL, 0)) return QI_ERR(err, QI_ERR_LUA, "%s", msg);
    lua_pushvalue(L, -1);
    lua_setfield(L, LUA_REGISTRYINDEX, "qinfer.sweep");
    lua_getfield(L, -1, "prepare");
    lua_pushvalue(L, exp);
    lua_createtable(L, o->n_sets, 0);
    for (int i = 0; i < o->n_sets; i++) {
        lua_pushstring(L, o->sets[i]);
        lua_rawseti(L, -2, i + 1);
    }
    if (o->shard_count > 0) {
        lua_pushinteger(L, o->shard_index);
        lua_pushinteger(L, o->shard_count);
    } else {
        lua_pushnil(L);
        lua_pushnil(L);
    }
    if (!lq_pcall(L, 4, 1, msg, sizeof msg, NULL, 0)) return QI_ERR(err, QI_ERR_INVALID, "%s: %s", o->script, msg);
    lua_replace(L, exp);
    lua_settop(L, exp);
    return QI_OK;
}

static int plan_int(lua_State *L, int plan, const char *key) {
    lua_getfield(L, plan, key);
    int v = (int)lua_tointeger(L, -1);
    lua_pop(L, 1);
    return v;
}

/* "k=v k=v" of configuration i (1-based) into out. */
static void describe(lua_State *L, int plan, int i, char *out, size_t cap) {
    lua_getfield(L, LUA_REGISTRYINDEX, "qinfer.sweep");
    lua_getfield(L, -1, "describe");
    lua_getfield(L, plan, "configs");
    lua_geti(L, -1, i);
    lua_remove(L, -2);
    lua_getfield(L, plan, "shown");
    char msg[256];
    if (lq_pcall(L, 2, 1, msg, sizeof msg, NULL, 0)) {
        snprintf(out, cap, "%s", lua_tostring(L, -1));
        lua_pop(L, 1);
    } else {
        snprintf(out, cap, "configuration %d", i);
    }
    lua_pop(L, 1);
}

static void print_result(const char *head, const run_state *rs) {
    printf("%s:", head);
    for (int i = 0; i < rs->n_m; i++) {
        const double n = rs->m[i].n, mean = rs->m[i].sum / n;
        printf("%s %s %.6g", i ? "," : "", rs->m[i].name, mean);
        if (n > 1) {
            double var = (rs->m[i].sumsq - n * mean * mean) / (n - 1);
            printf(" ±%.2g", var > 0 ? sqrt(var) : 0.0);
        }
        if (strcmp(rs->m[i].unit, "1") != 0) printf(" %s", rs->m[i].unit);
    }
    if (rs->n_m == 0) printf(" (no metrics)");
    printf("\n");
    fflush(stdout);
}

/* Call plan.run(cfg, ctx) for every warm-up and repetition. */
static bool run_config(lua_State *L, int plan, int cfg_i, int ctx, run_state *rs, int warmup, int reps, char *msg,
                       size_t msg_cap, char *tb, size_t tb_cap) {
    for (int r = -warmup; r < reps; r++) {
        rs->warmup = r < 0;
        rs->repetition = r < 0 ? 0 : r;
        lua_pushboolean(L, r < 0);
        lua_setfield(L, ctx, "warmup");
        lua_pushinteger(L, rs->repetition);
        lua_setfield(L, ctx, "repetition");
        lua_getfield(L, plan, "run");
        lua_getfield(L, plan, "configs");
        lua_geti(L, -1, cfg_i);
        lua_remove(L, -2);
        lua_pushvalue(L, ctx);
        if (!lq_pcall(L, 2, 0, msg, msg_cap, tb, tb_cap)) return false;
    }
    return true;
}

qi_status qi_lua_run_experiment(const qi_lua_run_opts *o, qi_lua_run_summary *sum, qi_err *err) {
    memset(sum, 0, sizeof *sum);
    char script_dir[1024];
    lq_dir_of(o->script, script_dir, sizeof script_dir);
    lua_State *L = lq_state_new(script_dir);
    if (!L) return QI_ERR(err, QI_ERR_NOMEM, "out of memory creating the Lua state");
    lq_set_threads(L, o->n_threads);
    qi_db *db = NULL;
    qi_status st;
    char *msg = NULL, *tb = NULL;
    const size_t msg_cap = 2048, tb_cap = 8192;
    lq_interrupted = 0;
    g_L = L;
    void (*old_int)(int) = signal(SIGINT, on_signal);
    void (*old_term)(int) = signal(SIGTERM, on_signal);

    if ((st = lq_load_experiment(L, o->script, err)) || (st = lq_prepare(L, o, err))) goto done;
    const int plan = lua_gettop(L);
    lua_getfield(L, plan, "configs");
    const int n_cfg = (int)luaL_len(L, -1);
    lua_pop(L, 1);
    lua_getfield(L, plan, "name");
    char name[256];
    snprintf(name, sizeof name, "%s", lua_tostring(L, -1));
    lua_pop(L, 1);
    const int reps = plan_int(L, plan, "repetitions"), warmup = plan_int(L, plan, "warmup");
    const int seed = plan_int(L, plan, "seed");
    sum->n_configs = n_cfg;
    sum->n_total = plan_int(L, plan, "total");
    char shard_desc[128] = "";
    if (o->shard_count > 0) {
        lua_getfield(L, plan, "load");
        snprintf(shard_desc, sizeof shard_desc, ", shard %d/%d (%d of %d configurations, cost %.6g)", o->shard_index,
                 o->shard_count, n_cfg, sum->n_total, lua_tonumber(L, -1));
        lua_pop(L, 1);
    }

    char desc[1024];
    if (o->list) {
        for (int i = 1; i <= n_cfg; i++) {
            lua_getfield(L, plan, "json");
            lua_geti(L, -1, i);
            describe(L, plan, i, desc, sizeof desc);
            if (o->shard_count > 0) {
                lua_getfield(L, plan, "index");
                lua_geti(L, -1, i);
                printf("[%d/%d] #%d %s  %s\n", i, n_cfg, (int)lua_tointeger(L, -1), desc, lua_tostring(L, -3));
                lua_pop(L, 2);
            } else {
                printf("[%d/%d] %s  %s\n", i, n_cfg, desc, lua_tostring(L, -1));
            }
            lua_pop(L, 2);
        }
        goto done;
    }

    char db_path[1024];
    if (o->db_path) {
        snprintf(db_path, sizeof db_path, "%s", o->db_path);
    } else {
        const char *dir = o->shard_count > 0 ? "results/shards" : "results";
        if ((mkdir("results", 0777) != 0 && errno != EEXIST) || (mkdir(dir, 0777) != 0 && errno != EEXIST)) {
            st = QI_ERR(err, QI_ERR_IO, "cannot create the folder %s/ (%s); name a database with --db", dir,
                        strerror(errno));
            goto done;
        }
        if (o->shard_count > 0) qi_db_shard_path(dir, name, o->shard_index, o->shard_count, db_path, sizeof db_path);
        else qi_db_default_path(name, db_path, sizeof db_path);
    }
    char script_sha[65] = "";
    int64_t exp_id;
    if ((st = qi_db_open(db_path, &db, err)) || (st = qi_sha256_file(o->script, script_sha, err)) ||
        (st = qi_db_experiment(db, name, o->script, script_sha, &exp_id, err))) {
        qi_err_prefix(err, "%s", db_path);
        goto done;
    }
    qi_db_host host;
    qi_db_host_get(&host, script_dir);

    /* ctx and its metric closure; rs lives as long as ctx (a userdata upvalue). */
    run_state *rs = lua_newuserdatauv(L, sizeof *rs, 0);
    memset(rs, 0, sizeof *rs);
    rs->db = db;
    lua_createtable(L, 0, 8);
    const int ctx = lua_gettop(L);
    lua_pushvalue(L, -2);
    lua_pushcclosure(L, ctx_metric, 1);
    lua_setfield(L, ctx, "metric");
    lua_pushinteger(L, seed);
    lua_setfield(L, ctx, "seed");
    lua_pushinteger(L, o->n_threads);
    lua_setfield(L, ctx, "threads");
    lua_pushstring(L, name);
    lua_setfield(L, ctx, "experiment");
    lua_newtable(L);
    lua_setfield(L, ctx, "cache");

    msg = malloc(msg_cap);
    tb = malloc(tb_cap);
    if (!msg || !tb) {
        st = QI_ERR(err, QI_ERR_NOMEM, "out of memory");
        goto done;
    }
    const bool tty = isatty(STDERR_FILENO);
    fprintf(stderr, "qinfer run: %s%s, %d configuration%s x %d repetition%s (+%d warm-up), database %s\n", name,
            shard_desc, n_cfg, n_cfg == 1 ? "" : "s", reps, reps == 1 ? "" : "s", warmup, db_path);
    double t_start = now_s();
    int n_ran = 0;
    char head[1200], fails[4096] = "";
    for (int i = 1; i <= n_cfg && !lq_interrupted; i++) {
        describe(L, plan, i, desc, sizeof desc);
        lua_getfield(L, plan, "json");
        lua_geti(L, -1, i);
        const char *json = lua_tostring(L, -1);
        char key[65];
        bool done;
        if ((st = qi_db_config_key(json, key, err)) || (st = qi_db_run_done(db, exp_id, key, &done, err))) goto done;
        snprintf(head, sizeof head, "[%d/%d] %s", i, n_cfg, desc);
        if (done && !o->fresh) {
            sum->n_skipped++;
            if (!tty) fprintf(stderr, "%s  already done\n", head);
            lua_pop(L, 2);
            continue;
        }
        char eta[32] = "";
        if (n_ran > 0) fmt_eta((now_s() - t_start) / n_ran * (n_cfg - i + 1), eta, sizeof eta);
        if (tty) fprintf(stderr, "\r\033[K%s%s%s", head, eta[0] ? "  ETA " : "", eta);
        else fprintf(stderr, "%s%s%s\n", head, eta[0] ? "  ETA " : "", eta);
        fflush(stderr);

        /* The model the configuration names, when it names one. */
        qi_db_run_info info;
        qi_db_run_info_init(&info, &host);
        char mpath[1024], msha[65];
        lua_getfield(L, plan, "configs");
        lua_geti(L, -1, i);
        if (lua_getfield(L, -1, "model") == LUA_TSTRING &&
            lq_model_identity(lua_tostring(L, -1), mpath, sizeof mpath, msha, NULL) == QI_OK) {
            info.model_path = mpath;
            info.model_sha256 = msha;
        }
        int64_t cfg_seed = seed;
        lua_pop(L, 1);
        if (lua_getfield(L, -1, "seed") == LUA_TNUMBER && lua_isinteger(L, -1) && lua_tointeger(L, -1) >= 0)
            cfg_seed = lua_tointeger(L, -1);
        lua_pop(L, 3);
        info.has_seed = true;
        info.seed = (uint64_t)cfg_seed;
        info.fresh = o->fresh;
        int64_t run_id;
        if ((st = qi_db_run_begin(db, exp_id, json, key, &info, &run_id, err))) goto done;
        lua_pop(L, 2); /* json, the json list */
        rs->run_id = run_id;
        rs->n_m = 0;
        lua_pushinteger(L, cfg_seed);
        lua_setfield(L, ctx, "seed");
        lua_getglobal(L, "math");
        lua_getfield(L, -1, "randomseed");
        lua_remove(L, -2);
        lua_pushinteger(L, cfg_seed);
        lq_pcall(L, 1, 0, NULL, 0, NULL, 0);

        /* the plan of the engines the configuration creates (lq_note_plan) */
        lua_pushnil(L);
        lua_setfield(L, LUA_REGISTRYINDEX, LQ_PLACEMENT_KEY);
        lua_pushnil(L);
        lua_setfield(L, LUA_REGISTRYINDEX, LQ_SIM_KEY);
        double t0 = now_s();
        bool ok = run_config(L, plan, i, ctx, rs, warmup, reps, msg, msg_cap, tb, tb_cap);
        rs->run_id = 0;
        if (lua_getfield(L, LUA_REGISTRYINDEX, LQ_PLACEMENT_KEY) == LUA_TSTRING &&
            (st = qi_db_run_placement(db, run_id, lua_tostring(L, -1), err))) {
            lua_pop(L, 1);
            goto done;
        }
        lua_pop(L, 1);
        n_ran++;
        if (lq_interrupted) {
            /* Not the configuration's fault: roll it back, as a kill would. */
            sum->interrupted = true;
            if (tty) fprintf(stderr, "\r\033[K");
            fprintf(stderr, "qinfer run: interrupted during %s; that run was rolled back\n", head);
            break;
        }
        if ((st = qi_db_run_end(db, run_id, ok, ok ? NULL : msg, err))) goto done;
        lua_gc(L, LUA_GCCOLLECT); /* engines the run made: memory and threads back now */
        if (tty) fprintf(stderr, "\r\033[K");
        if (ok) {
            sum->n_done++;
            char h2[1300];
            snprintf(h2, sizeof h2, "%s (%.1f s)", head, now_s() - t0);
            print_result(h2, rs);
        } else {
            sum->n_failed++;
            fprintf(stderr, "%s  FAILED: %s\n", head, msg);
            if (o->verbose && tb[0]) fprintf(stderr, "%s\n", tb);
            size_t fl = strlen(fails);
            snprintf(fails + fl, sizeof fails - fl, "  %s: %s\n", desc, msg);
        }
    }
    if (tty) fprintf(stderr, "\r\033[K");
    fprintf(stderr, "qinfer run: %s: %d configuration%s, %d done, %d skipped (already done), %d failed%s, %.1f s\n",
            name, n_cfg, n_cfg == 1 ? "" : "s", sum->n_done, sum->n_skipped, sum->n_failed,
            sum->interrupted ? ", interrupted" : "", now_s() - t_start);
    if (sum->n_failed) fprintf(stderr, "qinfer run: failed configurations:\n%s", fails);
    st = QI_OK;
done:
    signal(SIGINT, old_int);
    signal(SIGTERM, old_term);
    g_L = NULL;
    qi_db_close(db); /* rolls back a run still open */
    lua_close(L);
    free(msg);
    free(tb);
    return st;
}

qi_status qi_lua_exec(const char *script, int n_args, char **args, int n_threads, qi_err *err) {
    char script_dir[1024];
    lq_dir_of(script, script_dir, sizeof script_dir);
    lua_State *L = lq_state_new(script_dir);
    if (!L) return QI_ERR(err, QI_ERR_NOMEM, "out of memory creating the Lua state");
    lq_set_threads(L, n_threads);
    lua_createtable(L, n_args, 1);
    lua_pushstring(L, script);
    lua_rawseti(L, -2, 0);
    for (int i = 0; i < n_args; i++) {
        lua_pushstring(L, args[i]);
        lua_rawseti(L, -2, i + 1);
    }
    lua_setglobal(L, "arg");
    qi_status st = QI_OK;
    if (luaL_loadfile(L, script) != LUA_OK) {
        st = QI_ERR(err, QI_ERR_LUA, "%s", lua_tostring(L, -1));
    } else {
        char msg[2048];
        if (!lq_pcall(L, 0, 0, msg, sizeof msg, NULL, 0)) st = QI_ERR(err, QI_ERR_LUA, "%s", msg);
    }
    lua_close(L);
    return st;
}

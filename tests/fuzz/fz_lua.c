/* fz_lua.c - libFuzzer target: Lua experiment scripts in the harness's own
 * state (lq_state_new: the standard libraries, the qinfer module, the
 * compiled-in qinfer.* modules), and through them the qinfer module's
 * argument checks (option tables, token lists, model and engine methods).
 *
 * Each input is one script, loaded as text (a binary chunk is refused, as
 * Lua does not verify bytecode), run in a fresh state bounded to
 * LUA_STEPS instructions and LUA_MEM bytes of Lua memory. What the state
 * could reach outside the harness is taken away first: io, os.execute,
 * os.exit, os.remove, os.rename, os.tmpname, dofile, loadfile, C modules
 * (package.cpath, package.loadlib), debug (its hooks and upvalue joins
 * would undo the bounds) and qinfer.sleep (wall time the count
 * hook cannot bound); load and require load text only. qinfer.load loads
 * only the tiny synthetic model fuzz-seeds/gguf/llama.gguf of the build
 * (tests/fuzz/make_seeds.sh; QI_FZ_LUA_MODEL names another), named MODEL
 * in the script, at most 2 threads. If the script returns a table,
 * it is handed to qinfer.sweep's prepare (the experiment table checks of
 * `qinfer run`). A Lua error is a normal outcome; only a crash, a
 * sanitizer report, a leak or an exhausted bound that Lua did not catch
 * is a finding.
 */
#include <lauxlib.h>
#include <lualib.h>
#include <string.h>

#include "fz.h"
#include "lua_int.h"

#ifndef QI_FZ_LUA_MODEL_PATH
#define QI_FZ_LUA_MODEL_PATH "fuzz-seeds/gguf/llama.gguf"
#endif

enum { LUA_STEPS = 2000000, LUA_MEM = 64 << 20 };

typedef struct {
    lua_Alloc real;
    void *real_ud;
    size_t used;
} mem_limit;

static void *bounded_alloc(void *ud, void *p, size_t osize, size_t nsize) {
    mem_limit *m = ud;
    const size_t old = p ? osize : 0;
    if (nsize > old && m->used + (nsize - old) > LUA_MEM) return NULL;
    void *q = m->real(m->real_ud, p, osize, nsize);
    if (q || nsize == 0) m->used = m->used - old + nsize;
    return q;
}

static int g_steps;

static void count_hook(lua_State *L, lua_Debug *ar) {
    (void)ar;
    if ((g_steps += 1000) > LUA_STEPS) luaL_error(L, "fuzz: instruction limit");
}

static const char k_prelude[] =
    "io = nil; dofile = nil; loadfile = nil\n"
    "os.execute = nil; os.exit = nil; os.remove = nil; os.rename = nil; os.tmpname = nil\n"
    "package.cpath = ''; package.loadlib = nil\n"
    "table.remove(package.searchers, 4); table.remove(package.searchers, 3)\n"
    "debug = nil; package.loaded.debug = nil; package.loaded.io = nil\n"
    "local real_load = load\n"
    "load = function(chunk, name, mode, env) return real_load(chunk, name, 't', env) end\n"
    "qinfer.sleep = nil\n"
    "local qload = qinfer.load\n"
    "qinfer.load = function(path, opts)\n"
    "  if path ~= MODEL then error('fuzz: only MODEL loads') end\n"
    "  if type(opts) == 'table' and math.type(opts.threads) == 'integer' and opts.threads > 2 then opts.threads = 2 end\n"
    "  return qload(path, opts)\n"
    "end\n";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static const char *model;
    if (!model) {
        const char *env = getenv("QI_FZ_LUA_MODEL");
        model = env && *env ? env : QI_FZ_LUA_MODEL_PATH;
    }
    lua_State *L = lq_state_new(NULL);
    FZ_CHECK(L != NULL, "no Lua state");
    mem_limit m = {0};
    m.real = lua_getallocf(L, &m.real_ud);
    m.used = (size_t)lua_gc(L, LUA_GCCOUNT, 0) * 1024 + (size_t)lua_gc(L, LUA_GCCOUNTB, 0);
    lua_setallocf(L, bounded_alloc, &m);
    lua_pushstring(L, model);
    lua_setglobal(L, "MODEL");
    FZ_CHECK(luaL_loadbufferx(L, k_prelude, sizeof k_prelude - 1, "=prelude", "t") == LUA_OK &&
                 lua_pcall(L, 0, 0, 0) == LUA_OK,
             "the prelude fails: %s", lua_tostring(L, -1));
    g_steps = 0;
    lua_sethook(L, count_hook, LUA_MASKCOUNT, 1000);
    char msg[512];
    if (luaL_loadbufferx(L, (const char *)data, size, "=fuzz", "t") != LUA_OK) {
        fz_note("load: %s", lua_tostring(L, -1));
    } else if (!lq_pcall(L, 0, 1, msg, sizeof msg, NULL, 0)) {
        fz_note("run: %s", msg);
    } else if (lua_istable(L, -1)) {
        /* an experiment table: qinfer.sweep's checks and plan */
        lua_getglobal(L, "require");
        lua_pushstring(L, "qinfer.sweep");
        if (lq_pcall(L, 1, 1, msg, sizeof msg, NULL, 0) && lua_istable(L, -1)) {
            lua_getfield(L, -1, "prepare");
            if (lua_isfunction(L, -1)) {
                lua_pushvalue(L, -3);
                fz_note("prepare: %s", lq_pcall(L, 1, 0, msg, sizeof msg, NULL, 0) ? "ok" : msg);
            }
        }
    } else {
        fz_note("ran");
    }
    lua_close(L);
    return 0;
}

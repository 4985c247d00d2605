/* lua_state.c - the Lua state experiments run in: standard libraries, the
 * qinfer module, where `require` looks, and the protected-call boundary.
 *
 * Modules under qinfer.* (lua/qinfer/NAME.lua) are looked up first on
 * package.path (the script's folder, then the source tree's lua/, so an
 * edit there needs no rebuild), then in the copies compiled into the
 * program (qi_lua_modules.h), so an installed qinfer without its source
 * tree still finds them. $QINFER_LUA_PATH, when set, replaces the two
 * folders (tests use it to prove the compiled-in copies load).
 *
 * lq_pcall is the one place a Lua error becomes a C value: errors longjmp,
 * so C code between here and the error must own nothing that is not on the
 * Lua stack (lua_api.c keeps its temporaries in to-be-closed userdata).
 */
#include <lauxlib.h>
#include <lualib.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lua_int.h"
#include "qi_lua_modules.h"

#ifndef QI_SOURCE_DIR
#define QI_SOURCE_DIR "."
#endif

/* package.searchers entry: the compiled-in copy of module `name`. */
static int embedded_searcher(lua_State *L) {
    const char *name = luaL_checkstring(L, 1);
    for (const qi_lua_module *m = qi_lua_modules; m->name; m++) {
        if (strcmp(m->name, name) != 0) continue;
        lua_pushfstring(L, "@%s", m->file);
        if (luaL_loadbufferx(L, m->src, strlen(m->src), lua_tostring(L, -1), "t") != LUA_OK)
            return lua_error(L);
        lua_pushfstring(L, "[compiled in] %s", m->file);
        return 2;
    }
    lua_pushfstring(L, "\n\tno compiled-in module '%s'", name);
    return 1;
}

static int open_state(lua_State *L) {
    const char *script_dir = lua_touserdata(L, 1);
    luaL_openlibs(L);
    luaL_getsubtable(L, LUA_REGISTRYINDEX, LUA_PRELOAD_TABLE);
    lua_pushcfunction(L, luaopen_qinfer);
    lua_setfield(L, -2, "qinfer");
    lua_pop(L, 1);
    luaL_requiref(L, "qinfer", luaopen_qinfer, 1);
    lua_pop(L, 1);

    lua_getglobal(L, "package");
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    if (script_dir) {
        luaL_addstring(&b, script_dir);
        luaL_addstring(&b, "/?.lua;");
    }
    const char *env = getenv("QINFER_LUA_PATH");
    if (env) {
        luaL_addstring(&b, env);
        luaL_addchar(&b, ';');
    } else {
        luaL_addstring(&b, QI_SOURCE_DIR "/lua/?.lua;" QI_SOURCE_DIR "/lua/?/init.lua;");
    }
    lua_getfield(L, -2, "path");
    luaL_addvalue(&b);
    luaL_pushresult(&b);
    lua_setfield(L, -2, "path");

    lua_getfield(L, -1, "searchers");
    lua_pushcfunction(L, embedded_searcher);
    lua_rawseti(L, -2, (lua_Integer)luaL_len(L, -2) + 1);
    lua_pop(L, 2);
    return 0;
}

lua_State *lq_state_new(const char *script_dir) {
    lua_State *L = luaL_newstate();
    if (!L) return NULL;
    lua_pushcfunction(L, open_state);
    lua_pushlightuserdata(L, (void *)script_dir);
    if (lua_pcall(L, 1, 0, 0) != LUA_OK) {
        lua_close(L);
        return NULL;
    }
    return L;
}

/* Message handler: keep the message as it is (file:line first) and put the
 * traceback in the registry for lq_pcall to fetch. */
static int msgh(lua_State *L) {
    const char *msg = lua_tostring(L, 1);
    if (!msg) {
        if (luaL_callmeta(L, 1, "__tostring") && lua_type(L, -1) == LUA_TSTRING)
            msg = lua_tostring(L, -1);
        else
            msg = lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
    }
    luaL_traceback(L, L, NULL, 1);
    lua_setfield(L, LUA_REGISTRYINDEX, "qinfer.traceback");
    lua_pushstring(L, msg);
    return 1;
}

static void copy(char *dst, size_t cap, const char *src) {
    if (dst && cap) snprintf(dst, cap, "%s", src ? src : "");
}

bool lq_pcall(lua_State *L, int nargs, int nresults, char *msg, size_t msg_cap, char *tb, size_t tb_cap) {
    int base = lua_gettop(L) - nargs;
    lua_pushcfunction(L, msgh);
    lua_insert(L, base);
    int rc = lua_pcall(L, nargs, nresults, base);
    lua_remove(L, base);
    if (rc == LUA_OK) return true;
    copy(msg, msg_cap, lua_tostring(L, -1));
    lua_pop(L, 1);
    lua_getfield(L, LUA_REGISTRYINDEX, "qinfer.traceback");
    copy(tb, tb_cap, rc == LUA_ERRRUN ? lua_tostring(L, -1) : NULL);
    lua_pop(L, 1);
    lua_pushnil(L);
    lua_setfield(L, LUA_REGISTRYINDEX, "qinfer.traceback");
    return false;
}

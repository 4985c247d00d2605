/* lua_int.h - shared by the Lua harness files (lua_api.c, lua_state.c,
 * lua_run.c); not a public interface. */
#ifndef QI_LUA_INT_H
#define QI_LUA_INT_H

#include "neuron/neuron_live.h"
#include <lauxlib.h>
#include <lua.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>

#include "qinfer/engine.h"
#include "qinfer/measure.h"
#include "qinfer/model.h"
#include "qinfer/params.h"
#include "qinfer/sampler.h"
#include "qinfer/sparsity.h"
#include "qinfer/status.h"
#include "lua_harness.h"

/* Layers a model's sparsity thresholds may have (sparsity=). */
#define LQ_MAX_LAYERS 512

#define LQ_MODEL "qinfer.model"
#define LQ_ENGINE "qinfer.engine"
#define LQ_SCRATCH "qinfer.scratch"

/* A loaded model, shared by its userdata and its engines (refs). */
typedef struct {
    qi_model *m;
    int refs; /* the model userdata, plus one per engine */
    int n_threads;
    bool repack; /* qinfer.load's repack: its engines' default */
    char path[1024];
    char sha256[65]; /* "" until known */
    char corpus[1024]; /* the corpus whose tokens are cached below */
    int32_t *corpus_ids;
    size_t n_corpus_ids;
} lq_model;

typedef struct {
    lq_model *mb;
} lq_model_ud;

typedef struct {
    qi_engine *e;
    lq_model *mb;
    int n_ctx; /* positions per sequence */
} lq_engine_ud;

/* The engine options every engine-making call takes (keys LQ_ENGINE_KEYS):
 * read by lq_read_engine_opts; o.kv_params points into params. */
typedef struct {
    qi_engine_opts o;
    qi_params params;
    qi_params sim_params; /* o.sim_params points here */
    bool kv_given; /* a policy other than full, or a budget: decode-mode perplexity */
    /* sparsity= (with sparsity_calib=, sparsity_mode=): o.sparsity points
     * at sp, whose thresholds are in sp_thr (the engine copies them) */
    qi_sparsity sp;
    float sp_thr[LQ_MAX_LAYERS * QI_SITE_COUNT];
    /* neuron_policy= (with neuron_profile=, neuron_budget=,
     * neuron_swap_every=): o.neuron_fast and o.neuron_activity point into
     * a split held in the registry until the next options replace it (the
     * engine copies them); o.neuron_live at live */
    qi_neuron_live_opts live;
} lq_eopts;

#define LQ_ENGINE_KEYS \
    "threads", "kv_policy", "kv_params", "kv_budget", "kv_max_bytes", "profile", "attn_blas", "repack", "devices", \
        "placement", "sim", "sim_params", "sim_cal", "sparsity", "sparsity_mode", "sparsity_calib", "sparse_max_density", \
        "neuron_policy", "neuron_profile", "neuron_budget", "neuron_swap_every", "neuron_swap_worker", \
        "neuron_swap_stream", "sim_cold_density", "sim_activity"

/* A call's temporaries: pushed to-be-closed by lq_scratch_push, freed by
 * __close when the C function returns or raises. */
typedef struct {
    qi_engine *engine;   /* owned: freed */
    qi_engine *seq_eng;  /* a sequence added to a borrowed engine: removed */
    int seq_id;
    lq_model *mb;        /* a reference taken for `engine`: dropped after it */
    qi_sampler *smp;
    int32_t *ids, *ids2;
    char *text;
    struct qi_placement_policy *policy; /* owned: freed */
} lq_scratch;

/* ---- shared by lua_api.c (objects) and lua_measure.c (measured helpers) ---- */

double lq_now(void); /* monotonic seconds */
void lq_model_unref(lq_model *mb);
lq_model *lq_check_model(lua_State *L, int idx);        /* raises on a closed one */
lq_engine_ud *lq_check_engine(lua_State *L, int idx);
lq_scratch *lq_scratch_push(lua_State *L);
int lq_fail(lua_State *L, const qi_err *e);              /* raise e's message */

/* Option tables at idx, reported as argument `arg`: unknown keys (known is
 * NULL-terminated), then typed reads whose errors name the key. */
void lq_opts_check(lua_State *L, int idx, int arg, const char *const *known);
int lq_opt_get(lua_State *L, int idx, const char *key);  /* pushes opts[key] (nil without opts) */
int lq_opt_wrong(lua_State *L, int arg, const char *key, const char *want);
long lq_opt_int(lua_State *L, int idx, int arg, const char *key, long def, long lo, long hi);
double lq_opt_num(lua_State *L, int idx, int arg, const char *key, double def);
bool lq_opt_bool(lua_State *L, int idx, int arg, const char *key, bool def);
const char *lq_opt_str(lua_State *L, int idx, int arg, const char *key, const char *def);
void lq_read_engine_opts(lua_State *L, int idx, int arg, lq_eopts *eo, const lq_model *mb);
/* Note the plan a new engine runs, for the run being recorded (the
 * registry's LQ_PLACEMENT_KEY; qinfer run stores it with the run). */
#define LQ_PLACEMENT_KEY "qinfer.placement"
/* It also notes a simulated engine's profile name in LQ_SIM_KEY: every
 * metric qinfer run records for that configuration is then marked
 * simulated, whatever the script says. */
#define LQ_SIM_KEY "qinfer.sim"
void lq_note_plan(lua_State *L, const qi_engine *e);

/* Token lists: a table of integers (or one integer) into a qi_malloc'ed
 * array owned by *slot (a scratch field); its length. */
int lq_read_ids(lua_State *L, int idx, int32_t **slot);
void lq_push_ids(lua_State *L, const int32_t *ids, size_t n);
void lq_set_num(lua_State *L, const char *k, double v);  /* t[k] = v, t on top */
void lq_set_int(lua_State *L, const char *k, lua_Integer v);
void lq_set_str(lua_State *L, const char *k, const char *v);

/* qinfer.generate, perplexity, throughput, now, sleep, sysinfo. */
extern const luaL_Reg lq_measure_functions[];
extern const luaL_Reg lq_serve_functions[];
/* The fields of a run's figures (qi_measure_run) set in the table on top:
 * counts, rates, the latency summaries and `metrics`, the list of {name,
 * value, unit} under the canonical names. */
void lq_push_run(lua_State *L, const qi_run_metrics *rm);
/* The corpus (a path or a cached corpus name) tokenised by mb's tokenizer,
 * kept in mb->corpus_ids until another corpus is asked for; its resolved
 * path (owned by mb). Raises a Lua error on failure (s holds temporaries). */
const char *lq_model_corpus(lua_State *L, lq_model *mb, const char *corpus, lq_scratch *s);

/* Set by SIGINT/SIGTERM while an experiment runs (lua_run.c). */
extern volatile sig_atomic_t lq_interrupted;

/* The `qinfer` module table (qinfer.load, qinfer.generate, ...). */
int luaopen_qinfer(lua_State *L);

/* Default worker threads for qinfer.load and engines (<= 0: physical cores). */
void lq_set_threads(lua_State *L, int n);

/* A fresh state: standard libraries, `qinfer` preloaded and global, and
 * package.path + an embedded-module searcher for qinfer.* (script_dir, may
 * be NULL, searched first). NULL on out of memory. */
lua_State *lq_state_new(const char *script_dir);

/* lua_pcall with a traceback handler. On error returns false, leaves nothing
 * on the stack, and copies the message (file:line first) to msg and, when tb
 * is not NULL, the traceback to tb. */
bool lq_pcall(lua_State *L, int nargs, int nresults, char *msg, size_t msg_cap, char *tb, size_t tb_cap);

/* The file a model argument names (path or short name) and its sha256: the
 * manifest's for a short name, else computed (and remembered per path). */
/* lua_run.c, shared with lua_submit.c: the folder of a path ("." for a bare
 * name); the script run, its experiment table left on the stack; that table
 * replaced by sweep.prepare's plan (o's sets and shard). */
void lq_dir_of(const char *path, char *out, size_t cap);
qi_status lq_load_experiment(lua_State *L, const char *script, qi_err *err);
qi_status lq_prepare(lua_State *L, const qi_lua_run_opts *o, qi_err *err);
qi_status lq_model_identity(const char *arg, char *path, size_t cap, char sha[65], qi_err *err);

#endif

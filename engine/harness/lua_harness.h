/* lua_harness.h - experiments as Lua 5.4 scripts, recorded in the results
 * database.
 *
 * An experiment script returns (or defines as the global `experiment`) a
 * table:
 *
 *     return {
 *       name = "kv_sweep",
 *       params = { model = {"smollm2-135m"}, kv_policy = {"full", "h2o"},
 *                  kv_budget = {0.25, 0.5} },  -- the sweep: cartesian product
 *       order = {"model", "kv_policy"},        -- optional: outermost first
 *       repetitions = 3, warmup = 1, seed = 42,
 *       run = function(cfg, ctx) ctx.metric("ppl.value", v, "1") end,
 *     }
 *
 * qi_lua_run_experiment enumerates the configurations (lua/qinfer/sweep.lua:
 * keys in `order`, then the rest sorted; the first key outermost), skips
 * those the database already holds as done, and runs the others: each in one
 * database run (one transaction), calling run(cfg, ctx) `warmup` times with
 * metrics ignored and then `repetitions` times with ctx.repetition = 0, 1,
 * ... A Lua error fails that configuration only (recorded 'failed' with the
 * message, file:line included); the sweep goes on.
 */
#ifndef QI_HARNESS_LUA_H
#define QI_HARNESS_LUA_H

#include <stdbool.h>

#include "qinfer/status.h"

typedef struct {
    const char *script;   /* the experiment script */
    const char *db_path;  /* NULL: results/NAME.db (the folder made if missing) */
    const char *const *sets; /* "key=value" pins, n_sets of them */
    int n_sets;
    int shard_index, shard_count; /* shard_count >= 1: only shard shard_index (0-based) of
                                   * shard_count (sweep.lua's split); 0: the whole sweep */
    bool fresh;    /* redo configurations already done */
    bool list;     /* print the configurations and stop (no database) */
    bool verbose;  /* tracebacks of failures on stderr */
    int n_threads; /* default worker threads of qinfer.load/engines; <= 0: physical cores */
} qi_lua_run_opts;

typedef struct {
    int n_configs; /* of this run: the shard's when sharded */
    int n_total;   /* of the whole sweep */
    int n_done, n_skipped, n_failed;
    bool interrupted; /* SIGINT/SIGTERM: the run in flight was rolled back */
} qi_lua_run_summary;

/* Run the experiment. Progress goes to stderr (one updating line on a
 * terminal), each configuration's result line to stdout, failures to
 * stderr. Returns QI_OK when the sweep ran to its end, even with failed
 * configurations (count them in *sum); an error when it could not start or
 * continue: the script does not load or run, its table is malformed, a pin
 * names an unknown parameter (QI_ERR_INVALID) or the database fails. The
 * message carries the script's file:line where Lua knows it. */
qi_status qi_lua_run_experiment(const qi_lua_run_opts *o, qi_lua_run_summary *sum, qi_err *err);

/* Run a plain Lua script with the qinfer module loaded (`qinfer lua`): args
 * become the global `arg` (arg[0] the script). The script's os.exit is its
 * own; an error is QI_ERR_LUA with the message and file:line. */
qi_status qi_lua_exec(const char *script, int n_args, char **args, int n_threads, qi_err *err);

#endif

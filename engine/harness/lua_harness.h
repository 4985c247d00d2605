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
 *       cost = function(cfg) return 1 end,     -- optional: balances shards
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
#include <stdio.h>

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

/* ---- qinfer submit: the sweep as a Slurm job array ------------------------------- */

/* Tasks of a submission without --array: one per configuration, at most
 * this many (Slurm's default MaxArraySize is 1001). */
#define QI_SUBMIT_MAX_TASKS 1000

typedef struct {
    const char *script;        /* the experiment script */
    const char *const *sets;   /* "key=value" pins, passed on to every task */
    int n_sets;
    int n_tasks;               /* array tasks = shards; <= 0: one per configuration, at most QI_SUBMIT_MAX_TASKS */
    const char *partition;     /* #SBATCH --partition; NULL: the cluster's default */
    const char *time;          /* #SBATCH --time; NULL: the partition's default */
    const char *gpus;          /* #SBATCH --gpus (per task); NULL: none asked for */
    int n_threads;             /* #SBATCH --cpus-per-task and qinfer run -t; <= 0: $SLURM_CPUS_PER_TASK or 1 */
    const char *db_dir;        /* the shards' databases, the batch script and logs/; NULL: results/shards */
    const char *const *sbatch_args; /* more #SBATCH options, each one "--mem=8G"-like line */
    int n_sbatch_args;
    const char *qinfer_path;   /* the program the tasks run */
    bool dry_run;              /* write the script to script_out, submit nothing */
} qi_lua_submit_opts;

typedef struct {
    char experiment[256];
    int n_configs;       /* of the sweep (pins applied) */
    int n_tasks;         /* shards */
    int n_pending;       /* shards with configurations not done in their database */
    int n_missing;       /* configurations not done */
    char array[8192];    /* the --array list submitted ("0-3", "1,3"); "" when nothing is left */
    char job_id[64];     /* sbatch's job id; "" when nothing was submitted */
    char db_dir[2048];   /* absolute */
    char script_path[2304]; /* the batch script, DB_DIR/NAME.sbatch */
} qi_lua_submit_result;

/* Lay out the experiment's sweep (as `qinfer run` does), split it into
 * n_tasks shards (as `qinfer run --shard` does), find which configurations
 * each shard's database (DB_DIR/NAME.shard-I-of-N.db) holds as done, write
 * the batch script and submit the shards with work left: `sbatch --parsable
 * --array=LIST DB_DIR/NAME.sbatch` (sbatch from PATH). With nothing left,
 * nothing is submitted (res->array ""). dry_run: the script and the sbatch
 * command go to script_out (may be NULL) and nothing is written or run.
 * Errors: QI_ERR_LUA / QI_ERR_INVALID as qi_lua_run_experiment (and more
 * tasks than configurations, a value spanning lines); QI_ERR_DB for a shard
 * database that cannot be read; QI_ERR_IO when the folder or script cannot
 * be written or sbatch cannot run or fails (its message is on stderr). */
qi_status qi_lua_submit(const qi_lua_submit_opts *o, qi_lua_submit_result *res, FILE *script_out, qi_err *err);

/* Run a plain Lua script with the qinfer module loaded (`qinfer lua`): args
 * become the global `arg` (arg[0] the script). The script's os.exit is its
 * own; an error is QI_ERR_LUA with the message and file:line. */
qi_status qi_lua_exec(const char *script, int n_args, char **args, int n_threads, qi_err *err);

#endif

/* db.h - the results database: experiments, their runs, the runs' metrics.
 *
 * One SQLite file (results/README.md describes the tables). An experiment
 * script records each configuration it measures as one run:
 *
 *     qi_db_experiment(db, "kv_sweep", path, sha, &exp, err);
 *     qi_db_config_key(cfg_json, key, err);
 *     qi_db_run_done(db, exp, key, &done, err);          skip it when done
 *     qi_db_run_begin(db, exp, cfg_json, key, &info, &run, err);
 *     qi_db_metric(db, run, "decode.tokens_per_s", 41.7, "tok/s", 0, false, err);
 *     qi_db_run_end(db, run, true, NULL, err);           commits the run
 *
 * A run is written in one transaction, from qi_db_run_begin to
 * qi_db_run_end: a process killed in between leaves nothing of it, and the
 * next invocation measures that configuration again. While a run is open the
 * handle holds the database's write lock, so a second process writing to the
 * same file waits (up to the busy timeout) and then fails with a message
 * saying so; readers are never blocked (WAL mode).
 *
 * A qi_db is used by one thread at a time. Every function returns a
 * qi_status and fills `err` (which may be NULL) on failure. Strings are
 * borrowed for the call only.
 */
#ifndef QI_HARNESS_DB_H
#define QI_HARNESS_DB_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "qinfer/status.h"

typedef struct qi_db qi_db;

/* The schema version this build creates and understands: the number of
 * migrations compiled in (results/migrations/). */
int qi_db_schema_version(void);

/* Open or create the database at `path` for reading and writing: WAL
 * journal, foreign keys on, a 10 s busy timeout, and the compiled-in
 * migrations the file lacks applied in order, each in its own transaction.
 * Errors: QI_ERR_IO when the file cannot be opened or written (missing
 * directory, no permission, a read-only file); QI_ERR_DB when it is not a
 * SQLite database, belongs to another program, or a migration fails;
 * QI_ERR_UNSUPPORTED when its schema is newer than this build knows;
 * QI_ERR_NOMEM. *out is NULL on failure. */
qi_status qi_db_open(const char *path, qi_db **out, qi_err *err);

/* Open an existing results database for reading only (`qinfer results`,
 * figures): nothing is created, migrated or written, so a read-only file or
 * one being written by a running sweep can be read (WAL: the last committed
 * state). The reading functions below work on such a handle; the writing
 * ones fail. Errors: QI_ERR_IO when the file does not exist or cannot be
 * read; QI_ERR_DB when it is not a qinfer results database;
 * QI_ERR_UNSUPPORTED when its schema is newer than this build knows;
 * QI_ERR_NOMEM. *out is NULL on failure. */
qi_status qi_db_open_read(const char *path, qi_db **out, qi_err *err);

/* The database an experiment named `name` uses when none is given:
 * "results/NAME.db" (relative to the working directory), with every
 * character of NAME outside [A-Za-z0-9_.-] replaced by '_', written to buf
 * (n bytes, truncated to fit). `qinfer run` and `qinfer results` agree on it
 * through this function. */
void qi_db_default_path(const char *name, char *buf, size_t n);

/* The database of shard `shard_index` of `shard_count` of experiment `name`
 * in folder `dir` (NULL or "": the working directory):
 * "DIR/NAME.shard-I-of-N.db", NAME's characters replaced as above, written
 * to buf (n bytes, truncated to fit). `qinfer run --shard`, `qinfer submit`
 * and the batch scripts it writes agree on it through this function. */
void qi_db_shard_path(const char *dir, const char *name, int shard_index, int shard_count, char *buf, size_t n);

/* Close the handle. A run still open is rolled back (as if the process had
 * been killed). NULL is a no-op. */
void qi_db_close(qi_db *db);

/* How long a write waits for another process's lock before failing. */
void qi_db_busy_timeout(qi_db *db, int ms);

/* The experiment named `name` (non-empty), created if it does not exist;
 * its id in *id. script_path and script_sha256 (either may be NULL, which
 * keeps the stored value) describe the script as it was last run. */
qi_status qi_db_experiment(qi_db *db, const char *name, const char *script_path, const char *script_sha256,
                           int64_t *id, qi_err *err);

/* The id of the experiment named `name` in *id, 0 when the database has
 * none (works on a read-only handle). */
qi_status qi_db_experiment_find(qi_db *db, const char *name, int64_t *id, qi_err *err);

/* The key a configuration is found by: the SHA-256 (lower-case hex) of its
 * canonical JSON text (qi_json_canonical), so key order and whitespace do not
 * matter. Errors: QI_ERR_INVALID for text that is not JSON; QI_ERR_NOMEM. */
qi_status qi_db_config_key(const char *config_json, char out[65], qi_err *err);

/* *done = whether experiment `exp_id` has a finished ('done') run with this
 * configuration key: the skip test of a resumed sweep. */
qi_status qi_db_run_done(qi_db *db, int64_t exp_id, const char *config_key, bool *done, qi_err *err);

/* Where and how a run was measured. Every pointer may be NULL (stored as
 * NULL: unknown or not applicable). qi_db_run_info_init fills the machine
 * and checkout facts; the caller adds the model, seed and flags. */
typedef struct {
    const char *git_rev;
    int git_dirty; /* 1 uncommitted changes, 0 clean, -1 unknown */
    const char *cpu;
    int cores; /* physical; <= 0 unknown */
    uint64_t mem_bytes; /* 0 unknown */
    const char *gpu;
    const char *gpu_driver;
    const char *model_path;
    const char *model_sha256;
    const char *engine_version;
    bool has_seed;
    uint64_t seed; /* stored as the SQLite integer with the same 64 bits */
    bool simulated; /* every figure of the run is simulated */
    bool fresh;     /* not stored: replace a 'done' run with this key too */
} qi_db_run_info;

/* Storage for the facts about this machine and checkout that a run records. */
typedef struct {
    char git_rev[80]; /* "" unknown */
    int git_dirty;    /* as in qi_db_run_info */
    char cpu[128];
    int cores;
    uint64_t mem_bytes;
    char gpu[256];        /* "" none */
    char gpu_driver[64];  /* "550.54.15 (CUDA 12.4)": the driver and the CUDA version it serves; "" none */
} qi_db_host;

/* Query the machine (qi_sysinfo_get; in a CUDA build this starts the CUDA
 * runtime) and the git checkout holding `source_dir` (may be NULL: no git
 * facts). */
void qi_db_host_get(qi_db_host *h, const char *source_dir);

/* Zero *info, then point its machine and checkout fields into `host` (may be
 * NULL), and set engine_version to this build's version. */
void qi_db_run_info_init(qi_db_run_info *info, const qi_db_host *host);

/* The commit checked out at `dir` (`git -C dir rev-parse HEAD`) into rev (n
 * bytes) and whether the work tree differs from it (`git status
 * --porcelain`: modified, staged or untracked files) into *dirty. Returns
 * false, with rev "" and *dirty -1, when git is absent or dir is not in a
 * checkout. Runs git without a shell. */
bool qi_db_git_info(const char *dir, char *rev, size_t n, int *dirty);

/* Start a run of experiment `exp_id` with configuration `config_json` (any
 * JSON; stored canonically) found by `config_key` (NULL: computed with
 * qi_db_config_key). Opens the run's transaction and inserts the run as
 * 'running'; its id in *run_id. A 'running' or 'failed' run with the same key
 * is deleted with its metrics (it is being redone); a 'done' one too when
 * info->fresh, else that is QI_ERR_INVALID (check qi_db_run_done first).
 * info may be NULL (nothing known). One run is open at a time per handle.
 * Errors: QI_ERR_INVALID (bad JSON, unknown experiment, a run already open,
 * a done run without fresh); QI_ERR_DB (another process holds the write lock
 * past the busy timeout, or SQLite fails); QI_ERR_NOMEM. On failure nothing
 * is written and *run_id is 0. */
qi_status qi_db_run_begin(qi_db *db, int64_t exp_id, const char *config_json, const char *config_key,
                          const qi_db_run_info *info, int64_t *run_id, qi_err *err);

/* Record one number of the open run: `name` is area.what_unit (lower-case
 * letters, digits and '_', at least two parts joined by '.'), `unit`
 * non-empty ("1" for a pure number), `repetition` >= 0 and unique per name
 * in the run, `value` not NaN. `simulated`: this figure comes from a model
 * of the hardware, not a measurement (a run marked simulated marks all its
 * figures). Errors: QI_ERR_INVALID (bad name, unit or value, a repeated
 * (name, repetition), run_id not the open run); QI_ERR_DB. A failed metric
 * leaves the run open. */
qi_status qi_db_metric(qi_db *db, int64_t run_id, const char *name, double value, const char *unit,
                       int repetition, bool simulated, qi_err *err);
/* qi_db_metric with the measurement's parameters: params_json (NULL: none,
 * stored '{}') a JSON object of what the measurement varied within the run
 * that its configuration does not say ({"batch":4}), stored canonically; a
 * parameter is never part of a name. One value per (name, params,
 * repetition). Errors as qi_db_metric's, and QI_ERR_INVALID for params that
 * are not a JSON object. */
qi_status qi_db_metric_params(qi_db *db, int64_t run_id, const char *name, const char *params_json, double value,
                              const char *unit, int repetition, bool simulated, qi_err *err);

/* The placement plan (JSON, qi_plan_json's) the open run's engines ran
 * under. Errors: QI_ERR_INVALID (run_id not the open run, JSON not
 * valid); QI_ERR_DB. */
qi_status qi_db_run_placement(qi_db *db, int64_t run_id, const char *plan_json, qi_err *err);

/* Finish the open run: 'done' when ok, else 'failed' with error_msg (may be
 * NULL); the run is marked simulated if any of its figures is; then COMMIT.
 * Metrics recorded before a failure are kept. When the commit fails the run
 * is rolled back (nothing of it is stored) and the handle has no open run.
 * Errors: QI_ERR_INVALID (run_id not the open run); QI_ERR_IO, QI_ERR_DB. */
qi_status qi_db_run_end(qi_db *db, int64_t run_id, bool ok, const char *error_msg, qi_err *err);

/* One experiment, as qi_db_list_experiments reports it. Strings are valid
 * during the callback only; NULL when not stored. */
typedef struct {
    int64_t id;
    const char *name;
    const char *script_path;
    const char *script_sha256;
    const char *created;
    int64_t n_done, n_failed, n_running;
    const char *last_finished; /* the latest run's end; NULL when none */
} qi_db_experiment_row;

/* Return non-zero to stop the listing. */
typedef int (*qi_db_experiment_fn)(const qi_db_experiment_row *row, void *user);

/* Call fn for every experiment, by name. */
qi_status qi_db_list_experiments(qi_db *db, qi_db_experiment_fn fn, void *user, qi_err *err);

/* Write the finished runs of experiment `exp_name` to `out` as CSV (RFC
 * 4180, header line first): one line per (run, metric), in run then metric
 * order, with the run's facts, each leaf of its configuration as a column
 * named "config.<path>" (path as in "kv.budget" or "sizes[2]"; empty where a
 * run's configuration lacks it; true/false spelled out), then metric, value,
 * unit, repetition, simulated (0/1). Numbers are written with the fewest
 * digits that read back exactly. Errors: QI_ERR_INVALID (no such
 * experiment); QI_ERR_IO (writing failed); QI_ERR_DB; QI_ERR_NOMEM. */
qi_status qi_db_export_csv(qi_db *db, const char *exp_name, FILE *out, qi_err *err);

/* A number as text with the fewest digits (15 to 17) that read back as the
 * same double; "inf", "-inf" and "nan" for the others. */
void qi_db_format_number(double v, char *buf, size_t n);

/* ---- merging databases ------------------------------------------------------------ */

/* What one input of a merge brought. */
typedef struct {
    int64_t n_runs;     /* its finished runs ('done' or 'failed') */
    int64_t n_added;    /* of those, copied into the output */
    int64_t n_replaced; /* of the added, how many replaced a 'failed' run of the output */
} qi_db_merge_stats;

/* Merge the results databases in_paths[0..n_in-1] into out_path (created
 * as a results database when missing): every experiment, and every run with
 * its metrics, unless the output already holds that experiment's
 * configuration (same config_key) as 'done'. A 'done' run replaces a
 * 'failed' one; a 'failed' run is copied only where the output has none.
 * Inputs are read-only and merged in order (the first to hold a
 * configuration done wins), so merging twice, or overlapping inputs, adds
 * nothing twice. Everything is written in one transaction, after every
 * input has been checked: a failure writes nothing (an output created by
 * the call is removed; an existing one is left byte for byte as it was,
 * in its journal mode). stats (may be NULL) receives n_in entries.
 * Errors: QI_ERR_IO (a missing or unreadable file); QI_ERR_DB (not a
 * qinfer results database, a truncated or corrupt one: integrity_check
 * fails, or a row breaks one of the schema's constraints, such as a
 * placement that is not JSON; or SQLite fails); QI_ERR_UNSUPPORTED (a schema version other than
 * this build's); QI_ERR_INVALID (one experiment name run from two different
 * scripts, i.e. different script_sha256, across the databases; an input
 * that is the output); QI_ERR_NOMEM. */
qi_status qi_db_merge(const char *out_path, const char *const *in_paths, int n_in, qi_db_merge_stats *stats,
                      qi_err *err);

/* ---- summaries: an experiment's metrics as a table --------------------------------- */

typedef struct {
    /* Configuration paths to group runs by, as the CSV export names them
     * without "config." ("kv_policy", "kv.budget", "sizes[2]"). n_by == 0:
     * one row per run, keyed by every configuration leaf. */
    const char *const *by;
    int n_by;
    /* Metric names, in column order. n_metrics == 0: every metric the
     * experiment's finished runs have, by name. */
    const char *const *metrics;
    int n_metrics;
} qi_db_summary_opts;

/* The values of one metric in one row. */
typedef struct {
    int64_t n;       /* values: runs x repetitions; 0 when the row has none */
    double mean;     /* NaN when n == 0 */
    double sd;       /* sample standard deviation; 0 when n < 2 */
    bool simulated;  /* any of the values is simulated */
} qi_db_cell;

/* An experiment's finished runs as a table: one row per distinct value
 * combination of the key columns (or per run), one column per metric. */
typedef struct {
    char *experiment;
    int n_keys;
    char **keys;         /* [n_keys] key column names: the by paths, or every leaf path */
    bool per_run;        /* one row per run (n_by was 0) */
    int n_metrics;
    char **metrics;      /* [n_metrics] metric names */
    char **units;        /* [n_metrics] each metric's unit, as first recorded */
    int n_rows;
    int64_t *run_ids;    /* [n_rows] per_run: the row's run; else its first run */
    int64_t *n_runs;     /* [n_rows] runs in the row */
    char **json;         /* [n_rows * n_keys] the key's value as JSON text ("\"full\"", "0.5",
                          * "true"); NULL where a run's configuration lacks the path */
    char **text;         /* [n_rows * n_keys] the same for people: strings without quotes */
    qi_db_cell *cells;   /* [n_rows * n_metrics] */
    bool any_simulated;  /* some cell is simulated */
} qi_db_summary;

/* Summarise experiment `exp_name`'s finished runs: rows sorted by the key
 * values (numbers in numeric order, then strings), or by run id when per
 * run; metric values averaged over the row's runs and repetitions. Errors:
 * QI_ERR_INVALID for an unknown experiment, a path that is no configuration
 * leaf of its runs or a metric none of its runs has (the message lists what
 * exists); QI_ERR_DB; QI_ERR_NOMEM. *out is NULL on failure; free it with
 * qi_db_summary_free. */
qi_status qi_db_summary_create(qi_db *db, const char *exp_name, const qi_db_summary_opts *opts,
                               qi_db_summary **out, qi_err *err);

/* NULL is a no-op. */
void qi_db_summary_free(qi_db_summary *s);

#endif

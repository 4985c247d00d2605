/* lua_submit.c - `qinfer submit --slurm`: an experiment's sweep handed to
 * Slurm as a job array, one shard (`qinfer run --shard I/N`) per task.
 *
 * Slurm schedules; qinfer does not. This file only decides what to submit
 * and writes the batch script: every task runs the same `qinfer run` with
 * its $SLURM_ARRAY_TASK_ID as the shard number, into its own database
 * (qi_db_shard_path in the database folder), so tasks never share a file
 * and SQLite's one-writer lock is never contended across nodes (nor trusted
 * to network file systems, whose locks are often broken).
 *
 * Resubmitting: before submitting, the sweep is laid out as the tasks will
 * lay it out (sweep.lua: the same configurations, costs and split) and each
 * shard's database, where it exists, is asked which configurations are
 * done (qi_db_run_done, the test of a resumed sweep). Only the shards with
 * work left are submitted (--array=1,3), and each of those skips what its
 * database already holds: a cancelled, timed-out or failed task is redone,
 * a finished one is not started again.
 *
 * sbatch is run without a shell (posix_spawnp, found on PATH), with
 * --parsable so its output is the job id alone; its messages go to our
 * stderr. The batch script quotes every path and pin for the shell.
 */
#include <errno.h>
#include <lauxlib.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "db.h"
#include "lua_harness.h"
#include "lua_int.h"

extern char **environ;

/* A growing string; ok false once an allocation failed. */
typedef struct {
    char *s;
    size_t n, cap;
    bool ok;
} sbuf;

static void sb_add(sbuf *b, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

static void sb_add(sbuf *b, const char *fmt, ...) {
    if (!b->ok) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(b->s ? b->s + b->n : NULL, b->s ? b->cap - b->n : 0, fmt, ap);
        va_end(ap);
        if (k < 0) {
            b->ok = false;
            return;
        }
        if (b->s && b->n + (size_t)k < b->cap) {
            b->n += (size_t)k;
            return;
        }
        size_t cap = (b->cap ? b->cap * 2 : 1024) + (size_t)k;
        char *s = qi_realloc(b->s, cap);
        if (!s) {
            b->ok = false;
            return;
        }
        b->s = s;
        b->cap = cap;
    }
}

/* s single-quoted for the shell ('it'\''s'). */
static void sb_quote(sbuf *b, const char *s) {
    sb_add(b, "'");
    for (const char *c = s; *c; c++) {
        if (*c == '\'') sb_add(b, "'\\''");
        else sb_add(b, "%c", *c);
    }
    sb_add(b, "'");
}

/* s as one argument of an #SBATCH line: sbatch splits those lines at
 * blanks and reads '#' as a comment, but keeps both inside double quotes
 * (checked with Slurm 22.05; its backslash escapes vary across versions,
 * so they are not relied on). */
static qi_status sb_sbatch_arg(sbuf *b, const char *what, const char *s, qi_err *err) {
    if (strpbrk(s, "\"\\\n\r"))
        return QI_ERR(err, QI_ERR_INVALID, "%s '%s': a path with '\"', '\\' or a line break cannot be given to sbatch",
                      what, s);
    bool quote = strpbrk(s, " \t#'") != NULL;
    sb_add(b, quote ? "\"%s" : "%s", s);
    return QI_OK;
}

/* path made absolute against the working directory (not resolved: the
 * batch runs on other nodes, where the same shared path is wanted). */
static qi_status absolute(const char *path, char *out, size_t cap, qi_err *err) {
    if (path[0] == '/') {
        if ((size_t)snprintf(out, cap, "%s", path) >= cap) return QI_ERR(err, QI_ERR_INVALID, "%s: path too long", path);
        return QI_OK;
    }
    char cwd[2048];
    if (!getcwd(cwd, sizeof cwd)) return QI_ERR(err, QI_ERR_IO, "cannot read the working directory: %s", strerror(errno));
    const char *p = path;
    while (p[0] == '.' && p[1] == '/') p += 2;
    if (!strcmp(p, ".")) p = "";
    if ((size_t)snprintf(out, cap, "%s%s%s", cwd, *p ? "/" : "", p) >= cap)
        return QI_ERR(err, QI_ERR_INVALID, "%s: path too long", path);
    return QI_OK;
}

/* mkdir -p */
static qi_status make_dirs(const char *dir, qi_err *err) {
    char p[2400];
    if ((size_t)snprintf(p, sizeof p, "%s", dir) >= sizeof p) return QI_ERR(err, QI_ERR_INVALID, "%s: path too long", dir);
    for (char *c = p + 1;; c++) {
        if (*c == '/' || *c == 0) {
            char keep = *c;
            *c = 0;
            if (mkdir(p, 0777) != 0 && errno != EEXIST)
                return QI_ERR(err, QI_ERR_IO, "cannot create the folder %s: %s", p, strerror(errno));
            *c = keep;
            if (!keep) break;
        }
    }
    return QI_OK;
}

/* A value that goes into an #SBATCH line as it is: no line breaks. */
static qi_status check_line(const char *what, const char *v, qi_err *err) {
    if (!v) return QI_OK;
    if (!*v || strpbrk(v, "\n\r")) return QI_ERR(err, QI_ERR_INVALID, "%s: '%s' is empty or spans lines", what, v);
    return QI_OK;
}

/* "0-3,5,7-8" of the tasks marked in pending[0..n-1]. */
static void array_spec(const bool *pending, int n, sbuf *b) {
    bool first = true;
    for (int i = 0; i < n; i++) {
        if (!pending[i]) continue;
        int j = i;
        while (j + 1 < n && pending[j + 1]) j++;
        sb_add(b, "%s%d", first ? "" : ",", i);
        if (j > i) sb_add(b, "-%d", j);
        first = false;
        i = j;
    }
}

/* For each configuration (its JSON in plan.json) the shard it belongs to
 * among n (sweep.assign over plan.cost, as every task computes it), and
 * whether that shard's database holds it as done. */
static qi_status count_missing(lua_State *L, int plan, const char *name, const char *db_dir, int n_tasks,
                               int *missing, qi_err *err) {
    char msg[1024];
    lua_getfield(L, LUA_REGISTRYINDEX, "qinfer.sweep");
    lua_getfield(L, -1, "assign");
    lua_remove(L, -2);
    lua_getfield(L, plan, "cost");
    lua_pushinteger(L, n_tasks);
    if (!lq_pcall(L, 2, 1, msg, sizeof msg, NULL, 0)) return QI_ERR(err, QI_ERR_LUA, "splitting the sweep: %s", msg);
    const int shard = lua_gettop(L);
    lua_getfield(L, plan, "json");
    const int json = lua_gettop(L);
    const int n_cfg = (int)luaL_len(L, json);
    for (int t = 0; t < n_tasks; t++) missing[t] = 0;

    qi_status st = QI_OK;
    qi_db *db = NULL;
    int64_t exp_id = 0;
    for (int t = 0; t < n_tasks && st == QI_OK; t++) {
        char path[2048];
        qi_db_shard_path(db_dir, name, t, n_tasks, path, sizeof path);
        struct stat sb;
        /* an empty file: a task killed as it created its database */
        const bool exists = stat(path, &sb) == 0 && sb.st_size > 0;
        if (exists) {
            if ((st = qi_db_open_read(path, &db, err)) || (st = qi_db_experiment_find(db, name, &exp_id, err))) break;
        }
        for (int i = 1; i <= n_cfg; i++) {
            lua_geti(L, shard, i);
            int s = (int)lua_tointeger(L, -1);
            lua_pop(L, 1);
            if (s != t) continue;
            bool done = false;
            if (exists && exp_id) {
                lua_geti(L, json, i);
                char key[65];
                st = qi_db_config_key(lua_tostring(L, -1), key, err);
                lua_pop(L, 1);
                if (st || (st = qi_db_run_done(db, exp_id, key, &done, err))) break;
            }
            if (!done) missing[t]++;
        }
        qi_db_close(db);
        db = NULL;
        exp_id = 0;
    }
    qi_db_close(db);
    lua_settop(L, plan);
    return st;
}

/* Run sbatch ARGS without a shell; its stdout (the job id) into out. */
static qi_status run_sbatch(char *const argv[], char *out, size_t cap, qi_err *err) {
    int fd[2];
    if (pipe(fd) != 0) return QI_ERR(err, QI_ERR_IO, "sbatch: cannot make a pipe: %s", strerror(errno));
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fd[1], STDOUT_FILENO);
    posix_spawn_file_actions_addclose(&fa, fd[0]);
    posix_spawn_file_actions_addclose(&fa, fd[1]);
    pid_t pid;
    int rc = posix_spawnp(&pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(fd[1]);
    if (rc != 0) {
        close(fd[0]);
        return QI_ERR(err, QI_ERR_IO, "cannot run %s: %s (is this a Slurm login node? sbatch must be on PATH)",
                      argv[0], strerror(rc));
    }
    size_t n = 0;
    ssize_t k;
    while ((k = read(fd[0], out + n, cap - 1 - n)) > 0 || (k < 0 && errno == EINTR))
        if (k > 0) n += (size_t)k;
    out[n] = 0;
    close(fd[0]);
    int status;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        return QI_ERR(err, QI_ERR_IO, "sbatch failed (%s %d); its message is above",
                      WIFEXITED(status) ? "exit" : "signal", WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
    /* "1234" or "1234;cluster", then a newline */
    out[strcspn(out, ";\n\r")] = 0;
    if (!*out) return QI_ERR(err, QI_ERR_IO, "sbatch printed no job id");
    return QI_OK;
}

qi_status qi_lua_submit(const qi_lua_submit_opts *o, qi_lua_submit_result *res, FILE *script_out, qi_err *err) {
    memset(res, 0, sizeof *res);
    qi_status st;
    if ((st = check_line("--partition", o->partition, err)) || (st = check_line("--time", o->time, err)) ||
        (st = check_line("--gpus", o->gpus, err)))
        return st;
    for (int i = 0; i < o->n_sbatch_args; i++) {
        if ((st = check_line("sbatch option", o->sbatch_args[i], err))) return st;
        if (o->sbatch_args[i][0] != '-')
            return QI_ERR(err, QI_ERR_INVALID, "sbatch option '%s' does not start with '-'", o->sbatch_args[i]);
    }
    char script_dir[1024];
    lq_dir_of(o->script, script_dir, sizeof script_dir);
    lua_State *L = lq_state_new(script_dir);
    if (!L) return QI_ERR(err, QI_ERR_NOMEM, "out of memory creating the Lua state");
    int *missing = NULL;
    bool *pending = NULL;
    sbuf b = {.ok = true}, spec = {.ok = true};
    qi_lua_run_opts ro = {.script = o->script, .sets = o->sets, .n_sets = o->n_sets};
    if ((st = lq_load_experiment(L, o->script, err)) || (st = lq_prepare(L, &ro, err))) goto done;
    const int plan = lua_gettop(L);
    lua_getfield(L, plan, "name");
    snprintf(res->experiment, sizeof res->experiment, "%s", lua_tostring(L, -1));
    lua_pop(L, 1);
    lua_getfield(L, plan, "total");
    res->n_configs = (int)lua_tointeger(L, -1);
    lua_pop(L, 1);
    const char *name = res->experiment;
    int n = o->n_tasks > 0 ? o->n_tasks : (res->n_configs < QI_SUBMIT_MAX_TASKS ? res->n_configs : QI_SUBMIT_MAX_TASKS);
    if (n > res->n_configs) {
        st = QI_ERR(err, QI_ERR_INVALID, "--array %d: more tasks than the sweep has configurations (%d)", n,
                    res->n_configs);
        goto done;
    }
    res->n_tasks = n;

    char qinfer[2048], script[2048], dir[2048], cwd[2048], db_pat[2300], sh_path[2300];
    if ((st = absolute(o->qinfer_path, qinfer, sizeof qinfer, err)) ||
        (st = absolute(o->script, script, sizeof script, err)) ||
        (st = absolute(o->db_dir ? o->db_dir : "results/shards", dir, sizeof dir, err)) ||
        (st = absolute(".", cwd, sizeof cwd, err)))
        goto done;
    snprintf(res->db_dir, sizeof res->db_dir, "%s", dir);

    missing = qi_calloc((size_t)n, sizeof *missing);
    pending = qi_calloc((size_t)n, sizeof *pending);
    if (!missing || !pending) {
        st = QI_ERR(err, QI_ERR_NOMEM, "out of memory");
        goto done;
    }
    if ((st = count_missing(L, plan, name, dir, n, missing, err))) goto done;
    for (int t = 0; t < n; t++) {
        pending[t] = missing[t] > 0;
        res->n_pending += pending[t];
        res->n_missing += missing[t];
    }
    array_spec(pending, n, &spec);
    if (!spec.ok) {
        st = QI_ERR(err, QI_ERR_NOMEM, "out of memory");
        goto done;
    }
    if (spec.n >= sizeof res->array) {
        st = QI_ERR(err, QI_ERR_INVALID, "the list of tasks to submit is too long (%zu characters); use fewer tasks",
                    spec.n);
        goto done;
    }
    snprintf(res->array, sizeof res->array, "%s", spec.s ? spec.s : "");

    /* The batch script. */
    char jobname[1024], file_base[1024];
    qi_db_shard_path("", name, 0, 1, file_base, sizeof file_base); /* "./NAME.shard-0-of-1.db": NAME as files have it */
    snprintf(jobname, sizeof jobname, "%s", file_base + 2);
    jobname[strlen(jobname) - strlen(".shard-0-of-1.db")] = 0;
    snprintf(sh_path, sizeof sh_path, "%s/%s.sbatch", dir, jobname);
    snprintf(res->script_path, sizeof res->script_path, "%s", sh_path);
    snprintf(db_pat, sizeof db_pat, "%s/%s.shard-", dir, jobname);
    sb_add(&b, "#!/bin/bash\n");
    sb_add(&b, "# Written by qinfer submit: experiment %s (%s), %d configurations split into %d shards,\n", name,
           script, res->n_configs, n);
    sb_add(&b, "# one per task of a Slurm job array; submitted as sbatch --array=%s %s.sbatch\n",
           res->array[0] ? res->array : "(none)", jobname);
    sb_add(&b, "# (qinfer submit again submits only the shards with configurations left to run).\n");
    sb_add(&b, "#SBATCH --job-name=qinfer-%s\n", jobname);
    /* an opening quote spans the rest of the argument: closed after it */
    sb_add(&b, "#SBATCH --output=");
    if ((st = sb_sbatch_arg(&b, "--db-dir", dir, err))) goto done;
    sb_add(&b, "/logs/%s.shard-%%a-of-%d.job-%%A.log%s\n", jobname, n, strpbrk(dir, " \t#'") ? "\"" : "");
    sb_add(&b, "#SBATCH --chdir=");
    if ((st = sb_sbatch_arg(&b, "the working directory", cwd, err))) goto done;
    sb_add(&b, "%s\n", strpbrk(cwd, " \t#'") ? "\"" : "");
    if (o->n_threads > 0) sb_add(&b, "#SBATCH --cpus-per-task=%d\n", o->n_threads);
    if (o->partition) sb_add(&b, "#SBATCH --partition=%s\n", o->partition);
    if (o->time) sb_add(&b, "#SBATCH --time=%s\n", o->time);
    if (o->gpus) sb_add(&b, "#SBATCH --gpus=%s\n", o->gpus);
    for (int i = 0; i < o->n_sbatch_args; i++) sb_add(&b, "#SBATCH %s\n", o->sbatch_args[i]);
    sb_add(&b, "set -eu\n");
    sb_add(&b, "i=${SLURM_ARRAY_TASK_ID:?run this script as a task of a Slurm job array: sbatch --array=0-%d}\n",
           n - 1);
    sb_add(&b, "exec ");
    sb_quote(&b, qinfer);
    sb_add(&b, " run ");
    sb_quote(&b, script);
    sb_add(&b, " --shard \"$i/%d\" --db ", n);
    sb_quote(&b, db_pat);
    sb_add(&b, "\"$i\"'-of-%d.db'", n);
    if (o->n_threads > 0) sb_add(&b, " -t %d", o->n_threads);
    else sb_add(&b, " -t \"${SLURM_CPUS_PER_TASK:-1}\"");
    for (int i = 0; i < o->n_sets; i++) {
        sb_add(&b, " --set ");
        sb_quote(&b, o->sets[i]);
    }
    sb_add(&b, "\n");
    if (!b.ok) {
        st = QI_ERR(err, QI_ERR_NOMEM, "out of memory writing the batch script");
        goto done;
    }

    if (o->dry_run) {
        if (script_out) {
            fputs(b.s, script_out);
            fprintf(script_out, "# sbatch --parsable --array=%s %s\n", res->array[0] ? res->array : "(nothing to run)",
                    sh_path);
        }
        goto done;
    }
    if (res->n_pending == 0) goto done; /* every shard is done: nothing to submit */
    char logs[2300];
    snprintf(logs, sizeof logs, "%s/logs", dir);
    if ((st = make_dirs(logs, err))) goto done;
    FILE *f = fopen(sh_path, "w");
    if (!f) {
        st = QI_ERR(err, QI_ERR_IO, "%s: cannot write the batch script: %s", sh_path, strerror(errno));
        goto done;
    }
    bool wrote = fputs(b.s, f) >= 0;
    if (fclose(f) != 0 || !wrote) {
        st = QI_ERR(err, QI_ERR_IO, "%s: cannot write the batch script: %s", sh_path, strerror(errno));
        goto done;
    }
    chmod(sh_path, 0755);
    char array_arg[sizeof res->array + 16];
    snprintf(array_arg, sizeof array_arg, "--array=%s", res->array);
    char *argv[] = {"sbatch", "--parsable", array_arg, sh_path, NULL};
    st = run_sbatch(argv, res->job_id, sizeof res->job_id, err);

done:
    lua_close(L);
    qi_free(missing);
    qi_free(pending);
    qi_free(b.s);
    qi_free(spec.s);
    return st;
}

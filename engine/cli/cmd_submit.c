/* cmd_submit.c - `qinfer submit`: an experiment's sweep handed to a cluster's
 * scheduler as a job array, one shard per task (the work is in
 * engine/harness/lua_submit.c; this file is flags and exit codes).
 *
 * Slurm is the one scheduler supported, and --slurm says so explicitly, so
 * that another can be added later without changing what a command line
 * means. Exit codes: 0 submitted (or nothing left to submit, or --dry-run),
 * 1 when the script, a shard database or sbatch fails, 2 for bad flags.
 * stdout carries the job id alone (or the script with --dry-run), so that
 * scripts can use it; stderr what was submitted and how to merge it.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#ifdef QI_HAVE_LUA
#include "harness/lua_harness.h"
#endif

static void help(void) {
    printf(
        "usage: qinfer submit EXPERIMENT.lua --slurm [--array N] [--partition P] [--time T]\n"
        "                     [--gpus G] [-t N] [--db-dir DIR] [--set KEY=VALUE ...] [--dry-run]\n"
        "                     [-- SBATCH_OPTION ...]\n\n"
        "Hand an experiment's sweep to Slurm as a job array: task I of N runs\n"
        "  qinfer run EXPERIMENT.lua --shard I/N --db DIR/NAME.shard-I-of-N.db\n"
        "(each task its own part of the configurations and its own database, with\n"
        "the task's hardware recorded as usual). The batch script is written to\n"
        "DIR/NAME.sbatch and submitted with sbatch --array; task logs go to DIR/logs/.\n"
        "Submitting again runs only what is missing: shards whose databases hold\n"
        "every configuration done are not submitted, the others skip what is done.\n"
        "When the job has finished, merge the shards:\n"
        "  qinfer results merge results/NAME.db DIR/NAME.shard-*-of-N.db\n\n"
        "  --slurm            submit to Slurm (sbatch on PATH); required\n"
        "  --array N          tasks (shards); default one per configuration, at most %d\n"
        "  --partition P      #SBATCH --partition\n"
        "  --time T           #SBATCH --time (a task's limit: D-HH:MM:SS, MM, ...)\n"
        "  --gpus G           #SBATCH --gpus (per task; G as sbatch takes it: 1, h100:1)\n"
        "  -t, --threads N    #SBATCH --cpus-per-task=N and qinfer run -t N (default: the\n"
        "                     task's $SLURM_CPUS_PER_TASK, else 1)\n"
        "  --db-dir DIR       the shards' databases, batch script and logs (default\n"
        "                     results/shards)\n"
        "  --set KEY=VALUE    pin a parameter, in every task (as qinfer run --set)\n"
        "  --dry-run          print the batch script and the sbatch command; submit nothing\n"
        "  -- OPTION ...      further sbatch options, each written as an #SBATCH line\n"
        "                     (--mem=16G --account=lab --constraint=h100 ...)\n"
        "  -h, --help         this help\n\n"
        "stdout is the job id (nothing when every shard is done).\n",
#ifdef QI_HAVE_LUA
        QI_SUBMIT_MAX_TASKS
#else
        1000
#endif
    );
#ifndef QI_HAVE_LUA
    printf("\n(this qinfer was built without Lua/SQLite: qinfer submit is unavailable)\n");
#endif
}

#ifndef QI_HAVE_LUA
int qi_cmd_submit(int argc, char **argv) {
    if (argc >= 2 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0)) {
        help();
        return 0;
    }
    qi_cli_error("submit", "built without Lua/SQLite (install liblua5.4-dev and libsqlite3-dev, then reconfigure)");
    return QI_EXIT_RUNTIME;
}
#else
int qi_cmd_submit(int argc, char **argv) {
    const char *cmd = "submit";
    qi_lua_submit_opts o;
    memset(&o, 0, sizeof o);
    const char *sets[64];
    bool slurm = false;
    int extra = argc; /* argv index of the first option after "--" */
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--") == 0) {
            extra = i;
            break;
        }
    qi_args a;
    qi_args_init(&a, cmd, extra, argv);
    while (qi_args_next(&a)) {
        if (qi_args_is(&a, "-h", "--help")) { help(); return 0; }
        else if (qi_args_is(&a, NULL, "--slurm")) slurm = true;
        else if (qi_args_is(&a, NULL, "--array")) qi_args_int(&a, 1, QI_SUBMIT_MAX_TASKS * 100, &o.n_tasks);
        else if (qi_args_is(&a, NULL, "--partition")) o.partition = qi_args_str(&a);
        else if (qi_args_is(&a, NULL, "--time")) o.time = qi_args_str(&a);
        else if (qi_args_is(&a, NULL, "--gpus")) o.gpus = qi_args_str(&a);
        else if (qi_args_is(&a, "-t", "--threads")) qi_args_int(&a, 1, 1024, &o.n_threads);
        else if (qi_args_is(&a, NULL, "--db-dir")) o.db_dir = qi_args_str(&a);
        else if (qi_args_is(&a, NULL, "--dry-run")) o.dry_run = true;
        else if (qi_args_is(&a, NULL, "--set")) {
            const char *s = qi_args_str(&a);
            if (!s) break;
            if (!strchr(s, '=') || s[0] == '=') {
                qi_cli_error(cmd, "option --set: '%s' is not KEY=VALUE", s);
                return QI_EXIT_USAGE;
            }
            if (o.n_sets == (int)(sizeof sets / sizeof sets[0])) {
                qi_cli_error(cmd, "option --set: more than %d pins", (int)(sizeof sets / sizeof sets[0]));
                return QI_EXIT_USAGE;
            }
            sets[o.n_sets++] = s;
        }
        else if (a.flag[0] != '-' && !o.script) o.script = a.flag;
        else qi_args_unknown(&a);
    }
    if (a.failed) return QI_EXIT_USAGE;
    if (!o.script) {
        qi_cli_error(cmd, "no experiment script given (see qinfer submit --help)");
        return QI_EXIT_USAGE;
    }
    if (!slurm) {
        qi_cli_error(cmd, "name the scheduler: --slurm (the one supported)");
        return QI_EXIT_USAGE;
    }
    for (const char *const *opt = (const char *const *)argv + extra + 1; opt < (const char *const *)argv + argc; opt++)
        if ((*opt)[0] != '-' || strpbrk(*opt, "\n\r")) {
            qi_cli_error(cmd, "sbatch option '%s' after -- does not start with '-' or spans lines", *opt);
            return QI_EXIT_USAGE;
        }
    o.sbatch_args = extra < argc ? (const char *const *)argv + extra + 1 : NULL;
    o.n_sbatch_args = extra < argc ? argc - extra - 1 : 0;
    o.sets = sets;

    /* The tasks run this very program. */
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) {
        qi_cli_error(cmd, "cannot find this program's path (/proc/self/exe)");
        return QI_EXIT_RUNTIME;
    }
    self[n] = 0;
    o.qinfer_path = self;

    qi_lua_submit_result *r = qi_calloc(1, sizeof *r);
    if (!r) {
        qi_cli_error(cmd, "out of memory");
        return QI_EXIT_RUNTIME;
    }
    qi_err err = {0};
    int rc = 0;
    if (qi_lua_submit(&o, r, stdout, &err) != QI_OK) {
        rc = qi_cli_fail(cmd, &err);
    } else if (o.dry_run) {
        fprintf(stderr, "qinfer submit: %s: %d configurations in %d shards, %d left to run in %d shard%s (dry run: "
                        "nothing written or submitted)\n",
                r->experiment, r->n_configs, r->n_tasks, r->n_missing, r->n_pending, r->n_pending == 1 ? "" : "s");
    } else if (!r->job_id[0]) {
        fprintf(stderr, "qinfer submit: %s: every configuration of the %d shards in %s is done; nothing submitted. "
                        "Merge them: qinfer results merge results/%s.db %s/%s.shard-*-of-%d.db\n",
                r->experiment, r->n_tasks, r->db_dir, r->experiment, r->db_dir, r->experiment, r->n_tasks);
    } else {
        printf("%s\n", r->job_id);
        fprintf(stderr, "qinfer submit: %s: job %s, tasks %s (%d of %d shards, %d of %d configurations to run); "
                        "script %s. When it is done: qinfer results merge results/%s.db %s/%s.shard-*-of-%d.db\n",
                r->experiment, r->job_id, r->array, r->n_pending, r->n_tasks, r->n_missing, r->n_configs,
                r->script_path, r->experiment, r->db_dir, r->experiment, r->n_tasks);
    }
    qi_free(r);
    return rc;
}
#endif

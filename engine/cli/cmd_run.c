/* cmd_run.c - `qinfer run`: an experiment script's sweep into the results
 * database; `qinfer lua`: a plain Lua script with the qinfer module.
 *
 * Both need Lua 5.4 and SQLite at build time (QI_HAVE_LUA); without them
 * they say so and fail, so scripts and tests can tell a missing feature from
 * a broken one. The work is in engine/harness/lua_*.c; this file is flags
 * and exit codes: 0 when every configuration is done (or skipped as done
 * before), 1 when one failed or the script could not run, 2 for bad flags,
 * a malformed experiment table or an unknown --set key, 130 on interrupt.
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "threadpool.h"
#ifdef QI_HAVE_LUA
#include "harness/lua_harness.h"
#endif

static void help_run(void) {
    printf(
        "usage: qinfer run EXPERIMENT.lua [--db FILE] [--set KEY=VALUE ...] [--shard I/N] [--fresh] [-t N]\n\n"
        "Run an experiment script: every configuration of its parameter sweep (the\n"
        "cartesian product of its params lists), each recorded as one run in the\n"
        "results database. Configurations already done there are skipped, so an\n"
        "interrupted sweep resumes where it stopped.\n\n"
        "  --db FILE          results database (default results/NAME.db, NAME the experiment's)\n"
        "  --set KEY=VALUE    run only KEY=VALUE of that parameter (repeatable; VALUE takes\n"
        "                     the type of the parameter's values)\n"
        "  --shard I/N        only part I (0 .. N-1) of the sweep split into N disjoint parts\n"
        "                     (the same split in every shard; balanced by the script's cost\n"
        "                     function if it has one), into results/shards/NAME.shard-I-of-N.db\n"
        "                     unless --db; merge the parts with qinfer results merge\n"
        "  --fresh            redo configurations already done\n"
        "  --list             print the configurations (and their JSON) and stop\n"
        "  -t, --threads N    worker threads of models and engines (default: physical cores)\n"
        "  -v, --verbose      print a Lua traceback with each failure\n"
        "  -h, --help         this help\n\n"
        "The script returns { name = ..., params = { key = {values...} }, repetitions = N,\n"
        "warmup = N, cost = function(cfg) ... end (optional), run = function(cfg, ctx) ...\n"
        "ctx.metric(name, value, unit) end };\n"
        "see experiments/quickstart.lua and lua/README.md.\n");
#ifndef QI_HAVE_LUA
    printf("\n(this qinfer was built without Lua/SQLite: qinfer run is unavailable)\n");
#endif
}

static void help_lua(void) {
    printf("usage: qinfer lua SCRIPT.lua [ARGS...] [-t N before SCRIPT]\n\n"
           "Run a Lua 5.4 script with the qinfer module (require \"qinfer\"); ARGS are in\n"
           "the global arg. No sweep, no database: for tests and quick checks.\n");
#ifndef QI_HAVE_LUA
    printf("\n(this qinfer was built without Lua/SQLite: qinfer lua is unavailable)\n");
#endif
}

#ifndef QI_HAVE_LUA
int qi_cmd_run(int argc, char **argv) {
    if (argc >= 2 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0)) {
        help_run();
        return 0;
    }
    qi_cli_error("run", "built without Lua/SQLite (install liblua5.4-dev and libsqlite3-dev, then reconfigure)");
    return QI_EXIT_RUNTIME;
}

int qi_cmd_lua(int argc, char **argv) {
    if (argc >= 2 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0)) {
        help_lua();
        return 0;
    }
    qi_cli_error("lua", "built without Lua/SQLite (install liblua5.4-dev and libsqlite3-dev, then reconfigure)");
    return QI_EXIT_RUNTIME;
}
#else
/* "I/N" with 0 <= I < N <= 100000; false, reported, otherwise. */
static bool parse_shard(const char *cmd, const char *s, int *index, int *count) {
    long i = -1, n = -1;
    int used = 0;
    if (!s || strspn(s, "0123456789/") != strlen(s) || sscanf(s, "%ld/%ld%n", &i, &n, &used) != 2 || s[used] != 0 ||
        n < 1 || n > 100000 || i < 0 || i >= n) {
        qi_cli_error(cmd, "option --shard: '%s' is not I/N with 0 <= I < N <= 100000 (I counts from 0)",
                     s ? s : "");
        return false;
    }
    *index = (int)i;
    *count = (int)n;
    return true;
}

int qi_cmd_run(int argc, char **argv) {
    const char *cmd = "run";
    qi_lua_run_opts o;
    memset(&o, 0, sizeof o);
    o.n_threads = qi_n_physical_cores();
    const char *sets[64];
    qi_args a;
    qi_args_init(&a, cmd, argc, argv);
    while (qi_args_next(&a)) {
        if (qi_args_is(&a, "-h", "--help")) { help_run(); return 0; }
        else if (qi_args_is(&a, NULL, "--db")) o.db_path = qi_args_str(&a);
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
        else if (qi_args_is(&a, NULL, "--shard")) {
            const char *v = qi_args_str(&a);
            if (!v) break;
            if (!parse_shard(cmd, v, &o.shard_index, &o.shard_count)) return QI_EXIT_USAGE;
        }
        else if (qi_args_is(&a, NULL, "--fresh")) o.fresh = true;
        else if (qi_args_is(&a, NULL, "--list")) o.list = true;
        else if (qi_args_is(&a, "-v", "--verbose")) o.verbose = true;
        else if (qi_args_is(&a, "-t", "--threads")) qi_args_int(&a, 1, 1024, &o.n_threads);
        else if (a.flag[0] != '-' && !o.script) o.script = a.flag;
        else qi_args_unknown(&a);
    }
    if (a.failed) return QI_EXIT_USAGE;
    if (!o.script) {
        qi_cli_error(cmd, "no experiment script given (see qinfer run --help)");
        return QI_EXIT_USAGE;
    }
    o.sets = sets;
    qi_lua_run_summary sum;
    qi_err err = {0};
    qi_status st = qi_lua_run_experiment(&o, &sum, &err);
    if (st) return qi_cli_fail(cmd, &err);
    if (sum.interrupted) return 130;
    return sum.n_failed ? QI_EXIT_RUNTIME : 0;
}

int qi_cmd_lua(int argc, char **argv) {
    int n_threads = qi_n_physical_cores(), i = 1;
    for (; i < argc && argv[i][0] == '-'; i++) {
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            help_lua();
            return 0;
        }
        qi_args a;
        qi_args_init(&a, "lua", argc, argv);
        a.i = i + 1;
        a.flag = argv[i];
        if (qi_args_is(&a, "-t", "--threads")) {
            if (!qi_args_int(&a, 1, 1024, &n_threads)) return QI_EXIT_USAGE;
            i = a.i - 1;
        } else {
            qi_args_unknown(&a);
            return QI_EXIT_USAGE;
        }
    }
    if (i >= argc) {
        qi_cli_error("lua", "no script given (see qinfer lua --help)");
        return QI_EXIT_USAGE;
    }
    qi_err err = {0};
    if (qi_lua_exec(argv[i], argc - i - 1, argv + i + 1, n_threads, &err)) return qi_cli_fail("lua", &err);
    return 0;
}
#endif

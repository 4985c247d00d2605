/* cmd_results.c - `qinfer results`: what the results database holds, for
 * people (an aligned table) and for scripts (CSV, JSON).
 *
 *   qinfer results                      the experiments of every results/ database
 *   qinfer results EXP --by P,Q         EXP's metrics, one row per (P, Q) value pair
 *   qinfer results EXP                  one row per run, with its configuration
 *   qinfer results EXP --csv            the full long export (qi_db_export_csv)
 *   qinfer results merge OUT IN...      databases (a sweep's shards) merged into OUT
 *
 * The numbers come from qi_db_summary_create (engine/harness/db_query.c),
 * which groups and averages; this file picks the database, parses flags and
 * lays the table out. Databases are opened read-only (qi_db_open_read), so
 * looking at results never creates, upgrades or locks a file, and works
 * while a sweep is writing to it. The default database of an experiment is
 * the one `qinfer run` writes (qi_db_default_path), so the two commands
 * agree without --db.
 *
 * Simulated figures are never shown as if measured: a text cell carries
 * "sim", CSV a NAME:simulated column, JSON "simulated": true.
 *
 * Exit codes: 0; 1 when a database cannot be read (missing file, not a
 * results database) or a merge is refused (qi_db_merge: corrupt input,
 * another schema version or experiment definition); 2 for bad flags, an
 * unknown experiment, parameter or metric (the message lists the ones that
 * exist).
 */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#ifdef QI_HAVE_SQLITE
#include "harness/db.h"
#endif

static void help(void) {
    printf(
        "usage: qinfer results [--db FILE] [-o FMT]\n"
        "       qinfer results EXPERIMENT [--db FILE] [--by P[,P...]] [--metric M[,M...]] [-o FMT]\n"
        "       qinfer results EXPERIMENT [--db FILE] --csv\n"
        "       qinfer results merge OUT.db IN.db... (see qinfer results merge --help)\n\n"
        "Without EXPERIMENT: the experiments of a results database (--db), or of every\n"
        "results/*.db, with their runs done and failed and when the last run finished.\n\n"
        "With EXPERIMENT: its finished runs' metrics. With --by, one row per distinct\n"
        "combination of the parameters' values; without, one row per run with its\n"
        "configuration. Each metric is shown as its mean over the row's runs and\n"
        "repetitions, its sample standard deviation and the number of values.\n\n"
        "  --db FILE            results database (default results/EXPERIMENT.db, the one\n"
        "                       qinfer run writes)\n"
        "  --by P[,P...]        group by these configuration parameters (a path as in\n"
        "                       kv_policy or kv.budget)\n"
        "  --metric M[,M...]    only these metrics, in this order (default every one, by name)\n"
        "  -o, --output FMT     text (default), csv or json, to stdout\n"
        "  --csv                the whole export: one CSV line per (run, metric) with every\n"
        "                       run fact and configuration leaf (no --by, --metric or -o)\n"
        "  -h, --help           this help\n\n"
        "Simulated values are marked: \"sim\" in a text cell, a METRIC:simulated column in\n"
        "CSV, \"simulated\": true in JSON. CSV columns per metric: METRIC (the mean),\n"
        "METRIC:sd, METRIC:n, METRIC:simulated.\n");
#ifndef QI_HAVE_SQLITE
    printf("\n(this qinfer was built without SQLite: qinfer results is unavailable)\n");
#endif
}

static void help_merge(void) {
    printf(
        "usage: qinfer results merge OUT.db IN.db [IN.db...]\n\n"
        "Merge results databases (the shards of a sweep: qinfer run --shard, qinfer\n"
        "submit) into OUT.db, created when missing. Every run of every experiment is\n"
        "copied with its metrics unless OUT.db already holds that configuration of\n"
        "the experiment as done; a done run replaces a failed one. Merging twice, or\n"
        "inputs that overlap, adds nothing twice. Inputs are only read.\n\n"
        "Refused, with nothing written to OUT.db (left byte for byte as it was): an\n"
        "input that is missing, not a results database, truncated or corrupt (PRAGMA\n"
        "integrity_check), holding a row the schema forbids (a placement that is not\n"
        "JSON), of another schema version, or holding an experiment of the same name\n"
        "run from another script (a different experiment definition).\n\n"
        "  -h, --help   this help\n");
}

#ifndef QI_HAVE_SQLITE
int qi_cmd_results(int argc, char **argv) {
    if (argc >= 3 && strcmp(argv[1], "merge") == 0 && (strcmp(argv[2], "-h") == 0 || strcmp(argv[2], "--help") == 0)) {
        help_merge();
        return 0;
    }
    if (argc >= 2 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0)) {
        help();
        return 0;
    }
    qi_cli_error("results", "built without SQLite (install libsqlite3-dev, then reconfigure)");
    return QI_EXIT_RUNTIME;
}
#else

#define MAX_LIST 64

/* Split a comma list (modified in place) into items; false, reported, when
 * an item is empty or there are too many. */
static bool split_list(const char *cmd, const char *flag, char *s, const char **items, int *n) {
    *n = 0;
    for (char *p = s;;) {
        char *comma = strchr(p, ',');
        if (comma) *comma = 0;
        if (!*p) {
            qi_cli_error(cmd, "option %s: an empty item (the list is comma-separated: a,b)", flag);
            return false;
        }
        if (*n == MAX_LIST) {
            qi_cli_error(cmd, "option %s: more than %d items", flag, MAX_LIST);
            return false;
        }
        items[(*n)++] = p;
        if (!comma) return true;
        p = comma + 1;
    }
}

/* ---- an aligned text table ------------------------------------------------------------ */

typedef struct {
    int n_cols, n_rows; /* n_rows counts the header */
    char **cell;        /* [n_rows * n_cols], owned */
    bool *right;        /* [n_cols] right-aligned (numbers) */
} text_table;

static bool table_init(text_table *t, int n_cols, int n_rows) {
    t->n_cols = n_cols;
    t->n_rows = n_rows;
    t->cell = qi_calloc((size_t)n_cols * (size_t)n_rows + 1, sizeof *t->cell);
    t->right = qi_calloc((size_t)n_cols + 1, sizeof *t->right);
    return t->cell && t->right;
}

static void table_free(text_table *t) {
    if (t->cell)
        for (size_t i = 0; i < (size_t)t->n_cols * (size_t)t->n_rows; i++) qi_free(t->cell[i]);
    qi_free(t->cell);
    qi_free(t->right);
}

static bool table_set(text_table *t, int row, int col, const char *s) {
    size_t n = strlen(s);
    char *d = qi_malloc(n + 1);
    if (!d) return false;
    memcpy(d, s, n + 1);
    t->cell[(size_t)row * (size_t)t->n_cols + (size_t)col] = d;
    return true;
}

static void table_print(const text_table *t) {
    size_t *w = qi_calloc((size_t)t->n_cols + 1, sizeof *w);
    if (!w) return;
    for (int r = 0; r < t->n_rows; r++)
        for (int c = 0; c < t->n_cols; c++) {
            const char *s = t->cell[(size_t)r * (size_t)t->n_cols + (size_t)c];
            size_t n = s ? strlen(s) : 0;
            if (n > w[c]) w[c] = n;
        }
    for (int r = 0; r < t->n_rows; r++) {
        for (int c = 0; c < t->n_cols; c++) {
            const char *s = t->cell[(size_t)r * (size_t)t->n_cols + (size_t)c];
            bool last = c + 1 == t->n_cols;
            if (t->right[c]) printf("%*s", (int)w[c], s ? s : "");
            else if (last) printf("%s", s ? s : "");
            else printf("%-*s", (int)w[c], s ? s : "");
            if (!last) printf("  ");
        }
        putchar('\n');
        if (r == 0) {
            for (int c = 0; c < t->n_cols; c++) {
                for (size_t i = 0; i < w[c]; i++) putchar('-');
                if (c + 1 < t->n_cols) printf("  ");
            }
            putchar('\n');
        }
    }
    qi_free(w);
}

/* ---- formatting ------------------------------------------------------------------------- */

/* A number for people: 4 significant digits, no exponent below 1e12. */
static void fmt_human(double v, int digits, char *buf, size_t n) {
    if (isfinite(v) && fabs(v) >= 1e4 && fabs(v) < 1e12) snprintf(buf, n, "%.0f", v);
    else if (isfinite(v)) snprintf(buf, n, "%.*g", digits, v);
    else snprintf(buf, n, "%s", isnan(v) ? "nan" : v < 0 ? "-inf" : "inf");
}

/* One CSV field: quoted only when it holds a comma, a quote or a line break. */
static void csv_field(const char *s, bool first) {
    if (!first) putchar(',');
    if (!s) return;
    if (s[strcspn(s, ",\"\r\n")]) qi_cli_print_quoted(s, false);
    else fputs(s, stdout);
}

static void json_number(double v) {
    char num[40];
    if (!isfinite(v)) {
        fputs("null", stdout);
        return;
    }
    qi_db_format_number(v, num, sizeof num);
    fputs(num, stdout);
}

/* ---- the experiments of one or more databases ------------------------------------------------ */

typedef struct {
    const char *db_path;
    qi_out_format fmt;
    text_table *t; /* text: rows collected here */
    int n;         /* rows so far (all databases) */
    bool failed;   /* out of memory */
} list_ctx;

static int list_row(const qi_db_experiment_row *r, void *user) {
    list_ctx *lc = user;
    char done[24], failed[24];
    snprintf(done, sizeof done, "%lld", (long long)r->n_done);
    snprintf(failed, sizeof failed, "%lld", (long long)r->n_failed);
    const char *last = r->last_finished ? r->last_finished : "-";
    if (lc->fmt == QI_OUT_CSV) {
        csv_field(lc->db_path, true);
        csv_field(r->name, false);
        csv_field(done, false);
        csv_field(failed, false);
        csv_field(r->last_finished, false);
        csv_field(r->script_path, false);
        fputs("\r\n", stdout);
    } else if (lc->fmt == QI_OUT_JSON) {
        printf("%s\n  {\"database\": ", lc->n ? "," : "");
        qi_cli_print_quoted(lc->db_path, true);
        printf(", \"experiment\": ");
        qi_cli_print_quoted(r->name, true);
        printf(", \"done\": %s, \"failed\": %s, \"last_finished\": ", done, failed);
        if (r->last_finished) qi_cli_print_quoted(r->last_finished, true);
        else fputs("null", stdout);
        printf(", \"script\": ");
        if (r->script_path) qi_cli_print_quoted(r->script_path, true);
        else fputs("null", stdout);
        putchar('}');
    } else {
        text_table *t = lc->t;
        int row = lc->n + 1;
        if (row >= t->n_rows) {
            int nr = t->n_rows * 2;
            char **g = qi_realloc(t->cell, (size_t)nr * (size_t)t->n_cols * sizeof *g);
            if (!g) {
                lc->failed = true;
                return 1;
            }
            memset(g + (size_t)t->n_rows * (size_t)t->n_cols, 0, (size_t)(nr - t->n_rows) * (size_t)t->n_cols * sizeof *g);
            t->cell = g;
            t->n_rows = nr;
        }
        if (!table_set(t, row, 0, r->name) || !table_set(t, row, 1, done) || !table_set(t, row, 2, failed) ||
            !table_set(t, row, 3, last) || !table_set(t, row, 4, lc->db_path)) {
            lc->failed = true;
            return 1;
        }
    }
    lc->n++;
    return 0;
}

static int cmp_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* The *.db files of results/, sorted; NULL with *n 0 when there are none. */
static char **results_dbs(int *n) {
    *n = 0;
    DIR *d = opendir("results");
    if (!d) return NULL;
    char **v = NULL;
    int cap = 0;
    for (struct dirent *e; (e = readdir(d));) {
        size_t len = strlen(e->d_name);
        if (len < 4 || strcmp(e->d_name + len - 3, ".db") != 0) continue;
        if (*n == cap) {
            cap = cap ? 2 * cap : 16;
            char **g = qi_realloc(v, (size_t)cap * sizeof *g);
            if (!g) break;
            v = g;
        }
        char *p = qi_malloc(len + sizeof "results/");
        if (!p) break;
        snprintf(p, len + sizeof "results/", "results/%s", e->d_name);
        v[(*n)++] = p;
    }
    closedir(d);
    if (*n) qsort(v, (size_t)*n, sizeof *v, cmp_name);
    return v;
}

static int list_experiments(const char *cmd, const char *db_arg, qi_out_format fmt) {
    int n_dbs = 0, rc = 0;
    char **dbs = NULL;
    const char *one[1] = {db_arg};
    if (!db_arg) {
        dbs = results_dbs(&n_dbs);
        if (n_dbs == 0) {
            qi_free(dbs);
            qi_cli_error(cmd, "no results databases in results/ (run an experiment with qinfer run, or name "
                              "a database with --db)");
            return QI_EXIT_RUNTIME;
        }
    }
    text_table t = {0};
    list_ctx lc = {.fmt = fmt, .t = &t};
    if (fmt == QI_OUT_HUMAN) {
        if (!table_init(&t, 5, 8)) {
            table_free(&t);
            qi_cli_error(cmd, "out of memory");
            return QI_EXIT_RUNTIME;
        }
        static const char *const head[] = {"experiment", "done", "failed", "last run finished", "database"};
        bool ok = true;
        for (int c = 0; c < 5; c++) ok &= table_set(&t, 0, c, head[c]);
        if (!ok) {
            table_free(&t);
            qi_cli_error(cmd, "out of memory");
            return QI_EXIT_RUNTIME;
        }
        t.right[1] = t.right[2] = true;
    } else if (fmt == QI_OUT_CSV) {
        fputs("database,experiment,done,failed,last_finished,script\r\n", stdout);
    } else {
        putchar('[');
    }
    const int n = db_arg ? 1 : n_dbs;
    for (int i = 0; i < n && !lc.failed; i++) {
        const char *path = db_arg ? one[0] : dbs[i];
        qi_db *db = NULL;
        qi_err err = {0};
        lc.db_path = path;
        if (qi_db_open_read(path, &db, &err) || qi_db_list_experiments(db, list_row, &lc, &err)) {
            /* one unreadable file does not hide the others */
            fflush(stdout);
            rc = qi_cli_fail(cmd, &err);
            if (rc == QI_EXIT_USAGE) rc = QI_EXIT_RUNTIME;
        }
        qi_db_close(db);
    }
    if (lc.failed) {
        qi_cli_error(cmd, "out of memory");
        rc = QI_EXIT_RUNTIME;
    } else if (fmt == QI_OUT_HUMAN && lc.n > 0) {
        t.n_rows = lc.n + 1;
        table_print(&t);
    } else if (fmt == QI_OUT_JSON) {
        printf("%s]\n", lc.n ? "\n" : "");
    }
    table_free(&t);
    for (int i = 0; i < n_dbs; i++) qi_free(dbs[i]);
    qi_free(dbs);
    return rc;
}

/* ---- one experiment's summary ---------------------------------------------------------------- */

static void print_csv(const qi_db_summary *s) {
    bool first = true;
    if (s->per_run) {
        csv_field("run_id", first);
        first = false;
    }
    for (int k = 0; k < s->n_keys; k++) {
        csv_field(s->keys[k], first);
        first = false;
    }
    if (!s->per_run) csv_field("runs", first), first = false;
    for (int m = 0; m < s->n_metrics; m++) {
        static const char *const suffix[] = {"", ":sd", ":n", ":simulated"};
        for (int j = 0; j < 4; j++) {
            char name[256];
            snprintf(name, sizeof name, "%s%s", s->metrics[m], suffix[j]);
            csv_field(name, first);
            first = false;
        }
    }
    fputs("\r\n", stdout);
    for (int r = 0; r < s->n_rows; r++) {
        char num[40];
        first = true;
        if (s->per_run) {
            snprintf(num, sizeof num, "%lld", (long long)s->run_ids[r]);
            csv_field(num, first);
            first = false;
        }
        for (int k = 0; k < s->n_keys; k++) {
            csv_field(s->text[(size_t)r * (size_t)s->n_keys + (size_t)k], first);
            first = false;
        }
        if (!s->per_run) {
            snprintf(num, sizeof num, "%lld", (long long)s->n_runs[r]);
            csv_field(num, first);
            first = false;
        }
        for (int m = 0; m < s->n_metrics; m++) {
            const qi_db_cell *c = &s->cells[(size_t)r * (size_t)s->n_metrics + (size_t)m];
            if (c->n == 0) { /* never the first field: run_id or runs comes before */
                fputs(",,,0,0", stdout);
                continue;
            }
            qi_db_format_number(c->mean, num, sizeof num);
            csv_field(num, first);
            qi_db_format_number(c->sd, num, sizeof num);
            csv_field(num, false);
            snprintf(num, sizeof num, "%lld", (long long)c->n);
            csv_field(num, false);
            csv_field(c->simulated ? "1" : "0", false);
            first = false;
        }
        fputs("\r\n", stdout);
    }
}

static void print_json(const qi_db_summary *s, const char *db_path) {
    printf("{\n  \"experiment\": ");
    qi_cli_print_quoted(s->experiment, true);
    printf(",\n  \"database\": ");
    qi_cli_print_quoted(db_path, true);
    printf(",\n  \"by\": ");
    if (s->per_run) {
        fputs("null", stdout);
    } else {
        putchar('[');
        for (int k = 0; k < s->n_keys; k++) {
            if (k) printf(", ");
            qi_cli_print_quoted(s->keys[k], true);
        }
        putchar(']');
    }
    printf(",\n  \"rows\": [");
    for (int r = 0; r < s->n_rows; r++) {
        printf("%s\n    {", r ? "," : "");
        if (s->per_run) printf("\"run_id\": %lld, ", (long long)s->run_ids[r]);
        else printf("\"runs\": %lld, ", (long long)s->n_runs[r]);
        printf("\"config\": {");
        bool first = true;
        for (int k = 0; k < s->n_keys; k++) {
            const char *v = s->json[(size_t)r * (size_t)s->n_keys + (size_t)k];
            if (!v) continue;
            printf("%s", first ? "" : ", ");
            qi_cli_print_quoted(s->keys[k], true);
            printf(": %s", v);
            first = false;
        }
        printf("},\n     \"metrics\": {");
        first = true;
        for (int m = 0; m < s->n_metrics; m++) {
            const qi_db_cell *c = &s->cells[(size_t)r * (size_t)s->n_metrics + (size_t)m];
            if (c->n == 0) continue;
            printf("%s\n       ", first ? "" : ",");
            qi_cli_print_quoted(s->metrics[m], true);
            printf(": {\"mean\": ");
            json_number(c->mean);
            printf(", \"sd\": ");
            json_number(c->sd);
            printf(", \"n\": %lld, \"unit\": ", (long long)c->n);
            qi_cli_print_quoted(s->units[m], true);
            printf(", \"simulated\": %s}", c->simulated ? "true" : "false");
            first = false;
        }
        printf("}}");
    }
    printf("%s]\n}\n", s->n_rows ? "\n  " : "");
}

static int print_text(const qi_db_summary *s, const char *db_path) {
    const int lead = (s->per_run ? 1 : 0) + s->n_keys + (s->per_run ? 0 : 1);
    text_table t = {0};
    if (!table_init(&t, lead + s->n_metrics, s->n_rows + 1)) {
        table_free(&t);
        return -1;
    }
    bool ok = true, spread = false;
    int c = 0;
    if (s->per_run) t.right[c] = true, ok &= table_set(&t, 0, c++, "run");
    for (int k = 0; k < s->n_keys; k++) ok &= table_set(&t, 0, c++, s->keys[k]);
    if (!s->per_run) t.right[c] = true, ok &= table_set(&t, 0, c++, "runs");
    for (int m = 0; m < s->n_metrics; m++) {
        char head[300];
        if (strcmp(s->units[m], "1") != 0) snprintf(head, sizeof head, "%s [%s]", s->metrics[m], s->units[m]);
        else snprintf(head, sizeof head, "%s", s->metrics[m]);
        t.right[c] = true;
        ok &= table_set(&t, 0, c++, head);
    }
    int64_t n_runs = 0;
    for (int r = 0; r < s->n_rows && ok; r++) {
        char buf[128];
        c = 0;
        n_runs += s->n_runs[r];
        if (s->per_run) {
            snprintf(buf, sizeof buf, "%lld", (long long)s->run_ids[r]);
            ok &= table_set(&t, r + 1, c++, buf);
        }
        for (int k = 0; k < s->n_keys; k++) {
            const char *v = s->text[(size_t)r * (size_t)s->n_keys + (size_t)k];
            ok &= table_set(&t, r + 1, c++, v ? v : "-");
        }
        if (!s->per_run) {
            snprintf(buf, sizeof buf, "%lld", (long long)s->n_runs[r]);
            ok &= table_set(&t, r + 1, c++, buf);
        }
        for (int m = 0; m < s->n_metrics; m++) {
            const qi_db_cell *cell = &s->cells[(size_t)r * (size_t)s->n_metrics + (size_t)m];
            if (cell->n == 0) {
                ok &= table_set(&t, r + 1, c++, "-");
                continue;
            }
            char mean[48], sd[48];
            fmt_human(cell->mean, 4, mean, sizeof mean);
            int w = snprintf(buf, sizeof buf, "%s", mean);
            if (cell->n > 1) {
                fmt_human(cell->sd, 2, sd, sizeof sd);
                w += snprintf(buf + w, sizeof buf - (size_t)w, " ±%s (%lld)", sd, (long long)cell->n);
                spread = true;
            }
            if (cell->simulated) snprintf(buf + w, sizeof buf - (size_t)w, " sim");
            ok &= table_set(&t, r + 1, c++, buf);
        }
    }
    if (!ok) {
        table_free(&t);
        return -1;
    }
    printf("%s: %lld run%s in %s", s->experiment, (long long)n_runs, n_runs == 1 ? "" : "s", db_path);
    if (!s->per_run) {
        printf(", by ");
        for (int k = 0; k < s->n_keys; k++) printf("%s%s", k ? ", " : "", s->keys[k]);
    }
    printf("\n\n");
    if (s->n_rows) table_print(&t);
    else printf("(no finished runs)\n");
    if (spread || s->any_simulated) {
        printf("\n");
        if (spread) printf("mean ±sample standard deviation (number of values: runs x repetitions)\n");
        if (s->any_simulated) printf("sim: simulated (a model of the hardware), not measured\n");
    }
    table_free(&t);
    return 0;
}

/* qinfer results merge OUT IN... */
static int cmd_merge(int argc, char **argv) {
    const char *cmd = "results merge";
    const char **paths = qi_calloc((size_t)argc + 1, sizeof *paths);
    if (!paths) {
        qi_cli_error(cmd, "out of memory");
        return QI_EXIT_RUNTIME;
    }
    int n = 0;
    qi_args a;
    qi_args_init(&a, cmd, argc, argv);
    while (qi_args_next(&a)) {
        if (qi_args_is(&a, "-h", "--help")) {
            help_merge();
            qi_free(paths);
            return 0;
        }
        else if (a.flag[0] != '-' || a.flag[1] == 0) paths[n++] = a.flag;
        else qi_args_unknown(&a);
    }
    if (a.failed) {
        qi_free(paths);
        return QI_EXIT_USAGE;
    }
    if (n < 2) {
        qi_cli_error(cmd, "%s (usage: qinfer results merge OUT.db IN.db...)",
                     n == 0 ? "no output and no input database given" : "no input database given");
        qi_free(paths);
        return QI_EXIT_USAGE;
    }
    qi_db_merge_stats *st = qi_calloc((size_t)n, sizeof *st);
    if (!st) {
        qi_cli_error(cmd, "out of memory");
        qi_free(paths);
        return QI_EXIT_RUNTIME;
    }
    qi_err err = {0};
    int rc = 0;
    if (qi_db_merge(paths[0], paths + 1, n - 1, st, &err) != QI_OK) {
        qi_cli_fail(cmd, &err);
        rc = QI_EXIT_RUNTIME; /* the files' fault, not the flags' */
    } else {
        int64_t added = 0, runs = 0;
        for (int i = 0; i < n - 1; i++) {
            printf("%s: %lld run%s, %lld added", paths[i + 1], (long long)st[i].n_runs, st[i].n_runs == 1 ? "" : "s",
                   (long long)st[i].n_added);
            if (st[i].n_replaced) printf(" (%lld replacing failed runs)", (long long)st[i].n_replaced);
            if (st[i].n_runs > st[i].n_added) printf(", %lld already there", (long long)(st[i].n_runs - st[i].n_added));
            printf("\n");
            added += st[i].n_added;
            runs += st[i].n_runs;
        }
        fprintf(stderr, "qinfer results merge: %s: %lld run%s added from %d database%s (%lld already there)\n",
                paths[0], (long long)added, added == 1 ? "" : "s", n - 1, n == 2 ? "" : "s",
                (long long)(runs - added));
    }
    qi_free(st);
    qi_free(paths);
    return rc;
}

int qi_cmd_results(int argc, char **argv) {
    if (argc >= 2 && strcmp(argv[1], "merge") == 0) return cmd_merge(argc - 1, argv + 1);
    const char *cmd = "results", *db_arg = NULL, *exp = NULL, *out_arg = NULL;
    char *by_arg = NULL, *metric_arg = NULL;
    bool full_csv = false;
    qi_args a;
    qi_args_init(&a, cmd, argc, argv);
    while (qi_args_next(&a)) {
        if (qi_args_is(&a, "-h", "--help")) { help(); return 0; }
        else if (qi_args_is(&a, NULL, "--db")) db_arg = qi_args_str(&a);
        else if (qi_args_is(&a, NULL, "--by")) by_arg = (char *)qi_args_str(&a);
        else if (qi_args_is(&a, NULL, "--metric")) metric_arg = (char *)qi_args_str(&a);
        else if (qi_args_is(&a, "-o", "--output")) out_arg = qi_args_str(&a);
        else if (qi_args_is(&a, NULL, "--csv")) full_csv = true;
        else if (a.flag[0] != '-' && !exp) exp = a.flag;
        else qi_args_unknown(&a);
    }
    if (a.failed) return QI_EXIT_USAGE;
    qi_out_format fmt = QI_OUT_HUMAN;
    if (out_arg && !qi_cli_output_format(cmd, out_arg, "text", &fmt)) return QI_EXIT_USAGE;
    if (db_arg && !*db_arg) {
        qi_cli_error(cmd, "option --db: empty file name");
        return QI_EXIT_USAGE;
    }
    const char *by[MAX_LIST], *metrics[MAX_LIST];
    int n_by = 0, n_metrics = 0;
    if (by_arg && !split_list(cmd, "--by", by_arg, by, &n_by)) return QI_EXIT_USAGE;
    if (metric_arg && !split_list(cmd, "--metric", metric_arg, metrics, &n_metrics)) return QI_EXIT_USAGE;
    if (!exp) {
        if (by_arg || metric_arg || full_csv) {
            qi_cli_error(cmd, "%s needs an experiment (qinfer results EXPERIMENT ...)",
                         by_arg ? "--by" : metric_arg ? "--metric" : "--csv");
            return QI_EXIT_USAGE;
        }
        return list_experiments(cmd, db_arg, fmt);
    }
    if (full_csv && (by_arg || metric_arg || out_arg)) {
        qi_cli_error(cmd, "--csv exports everything: it takes no --by, --metric or -o");
        return QI_EXIT_USAGE;
    }

    char db_path[1024];
    if (db_arg) snprintf(db_path, sizeof db_path, "%s", db_arg);
    else qi_db_default_path(exp, db_path, sizeof db_path);
    qi_err err = {0};
    qi_db *db = NULL;
    qi_db_summary *s = NULL;
    int rc = 0;
    if (!db_arg && access(db_path, F_OK) != 0) {
        qi_cli_error(cmd, "%s: no such file, so no results of experiment '%s' (run its script with qinfer run, "
                          "or name the database with --db)", db_path, exp);
        return QI_EXIT_RUNTIME;
    }
    if (qi_db_open_read(db_path, &db, &err)) {
        rc = qi_cli_fail(cmd, &err);
        /* a missing or unreadable file is a failure, not a usage error */
        return rc == QI_EXIT_USAGE ? QI_EXIT_RUNTIME : rc;
    }
    if (full_csv) {
        if (qi_db_export_csv(db, exp, stdout, &err)) rc = qi_cli_fail(cmd, &err);
        qi_db_close(db);
        return rc;
    }
    qi_db_summary_opts so = {.by = by, .n_by = n_by, .metrics = metrics, .n_metrics = n_metrics};
    if (qi_db_summary_create(db, exp, &so, &s, &err)) {
        rc = qi_cli_fail(cmd, &err);
    } else if (fmt == QI_OUT_CSV) {
        print_csv(s);
    } else if (fmt == QI_OUT_JSON) {
        print_json(s, db_path);
    } else if (print_text(s, db_path) != 0) {
        qi_cli_error(cmd, "out of memory");
        rc = QI_EXIT_RUNTIME;
    }
    if (rc == 0 && (fflush(stdout) != 0 || ferror(stdout))) {
        qi_cli_error(cmd, "writing the output failed");
        rc = QI_EXIT_RUNTIME;
    }
    qi_db_summary_free(s);
    qi_db_close(db);
    return rc;
}
#endif

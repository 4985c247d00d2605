/* db_query.c - reading the results database: the experiments with their
 * run counts, and an experiment's finished runs as CSV.
 *
 * The CSV is long rather than wide: one line per (run, metric), so a figure
 * script filters by metric name and needs no knowledge of which metrics a run
 * has. The configuration is flattened with SQLite's json_tree into one column
 * per leaf path, the union over the experiment's runs (sorted, so the column
 * order does not depend on which run came first); both passes read one
 * snapshot. Numbers are printed with the fewest digits that read back to the
 * same double, so the file is exact without being noisy.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "db_int.h"

static const char *col_text(sqlite3_stmt *s, int i) { return (const char *)sqlite3_column_text(s, i); }

qi_status qi_db_list_experiments(qi_db *db, qi_db_experiment_fn fn, void *user, qi_err *err) {
    if (!db || !fn) return QI_ERR(err, QI_ERR_INVALID, "qi_db_list_experiments: missing argument");
    static const char sql[] =
        "SELECT e.id, e.name, e.script_path, e.script_sha256, e.created,"
        " (SELECT count(*) FROM runs r WHERE r.experiment_id = e.id AND r.status = 'done'),"
        " (SELECT count(*) FROM runs r WHERE r.experiment_id = e.id AND r.status = 'failed'),"
        " (SELECT count(*) FROM runs r WHERE r.experiment_id = e.id AND r.status = 'running'),"
        " (SELECT max(r.finished) FROM runs r WHERE r.experiment_id = e.id)"
        " FROM experiments e ORDER BY e.name";
    sqlite3_stmt *s = NULL;
    int rc = sqlite3_prepare_v2(db->conn, sql, -1, &s, NULL);
    while (rc == SQLITE_OK && (rc = sqlite3_step(s)) == SQLITE_ROW) {
        qi_db_experiment_row r = {
            .id = sqlite3_column_int64(s, 0),
            .name = col_text(s, 1),
            .script_path = col_text(s, 2),
            .script_sha256 = col_text(s, 3),
            .created = col_text(s, 4),
            .n_done = sqlite3_column_int64(s, 5),
            .n_failed = sqlite3_column_int64(s, 6),
            .n_running = sqlite3_column_int64(s, 7),
            .last_finished = col_text(s, 8),
        };
        rc = SQLITE_OK;
        if (fn(&r, user)) rc = SQLITE_DONE;
    }
    qi_status st = rc == SQLITE_DONE ? QI_OK : qi_db_fail(db, rc, err, "listing experiments");
    sqlite3_finalize(s);
    return st;
}

/* The shortest of %.15g .. %.17g that reads back as the same double. */
static void fmt_double(double v, char *buf, size_t n) {
    if (isinf(v)) {
        snprintf(buf, n, "%s", v < 0 ? "-inf" : "inf");
        return;
    }
    for (int prec = 15; prec <= 17; prec++) {
        snprintf(buf, n, "%.*g", prec, v);
        if (strtod(buf, NULL) == v) return;
    }
}

/* One CSV field, prefix then s (either may be NULL), quoted when it holds a
 * comma, a quote or a line break (RFC 4180). */
static void csv_field2(FILE *f, const char *prefix, const char *s, bool first) {
    if (!first) fputc(',', f);
    const char *part[2] = {prefix ? prefix : "", s ? s : ""};
    bool quote = part[0][strcspn(part[0], ",\"\r\n")] || part[1][strcspn(part[1], ",\"\r\n")];
    if (quote) fputc('"', f);
    for (int k = 0; k < 2; k++)
        for (const char *c = part[k]; *c; c++) {
            if (*c == '"') fputc('"', f);
            fputc(*c, f);
        }
    if (quote) fputc('"', f);
}

static void csv_field(FILE *f, const char *s, bool first) { csv_field2(f, NULL, s, first); }

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static char *dup_str(const char *s) {
    size_t n = strlen(s);
    char *d = qi_malloc(n + 1);
    if (d) memcpy(d, s, n + 1);
    return d;
}

/* A configuration leaf's path: json_tree's fullkey without the "$." or "$". */
#define LEAF_SQL(src)                                                                             \
    "SELECT substr(t.fullkey, CASE WHEN substr(t.fullkey, 2, 1) = '.' THEN 3 ELSE 2 END) AS path," \
    " t.type, t.atom FROM " src " WHERE t.type NOT IN ('object', 'array')"

static const char *const k_run_cols[] = {"run_id", "started", "finished", "git_rev", "git_dirty",
                                         "cpu", "cores", "mem_bytes", "gpu", "gpu_driver",
                                         "model_path", "model_sha256", "engine_version", "seed"};
#define N_RUN_COLS ((int)(sizeof k_run_cols / sizeof k_run_cols[0]))

qi_status qi_db_export_csv(qi_db *db, const char *exp_name, FILE *out, qi_err *err) {
    if (!db || !exp_name || !out) return QI_ERR(err, QI_ERR_INVALID, "qi_db_export_csv: missing argument");
    qi_status st = QI_OK;
    int rc;
    sqlite3_stmt *q_exp = NULL, *q_cols = NULL, *q_runs = NULL, *q_leaf = NULL, *q_met = NULL;
    char **cols = NULL, **vals = NULL;
    size_t n_cols = 0, cap = 0;
    /* One snapshot for the column set and the rows (unless a run of this
     * handle is open: then its transaction already is one). */
    bool own_txn = sqlite3_get_autocommit(db->conn);
    if (own_txn && (rc = qi_db_exec(db, "BEGIN")) != SQLITE_OK) return qi_db_fail(db, rc, err, "exporting '%s'", exp_name);

    int64_t exp_id = 0;
    if ((rc = sqlite3_prepare_v2(db->conn, "SELECT id FROM experiments WHERE name = ?1", -1, &q_exp, NULL)) !=
        SQLITE_OK)
        goto sql_fail;
    sqlite3_bind_text(q_exp, 1, exp_name, -1, SQLITE_TRANSIENT);
    rc = sqlite3_step(q_exp);
    if (rc == SQLITE_DONE) {
        st = QI_ERR(err, QI_ERR_INVALID, "%s: no experiment named '%s'", db->path, exp_name);
        goto done;
    }
    if (rc != SQLITE_ROW) goto sql_fail;
    exp_id = sqlite3_column_int64(q_exp, 0);

    rc = sqlite3_prepare_v2(db->conn,
                            "SELECT DISTINCT path FROM (" LEAF_SQL("runs r, json_tree(r.config_json) t")
                            " AND r.experiment_id = ?1 AND r.status = 'done') ORDER BY path",
                            -1, &q_cols, NULL);
    if (rc != SQLITE_OK) goto sql_fail;
    sqlite3_bind_int64(q_cols, 1, exp_id);
    while ((rc = sqlite3_step(q_cols)) == SQLITE_ROW) {
        const char *p = col_text(q_cols, 0);
        if (n_cols == cap) {
            size_t nc = cap ? 2 * cap : 16;
            char **g = qi_realloc(cols, nc * sizeof *g);
            if (!g) goto nomem;
            cols = g;
            cap = nc;
        }
        if (!(cols[n_cols] = dup_str(p ? p : ""))) goto nomem;
        n_cols++;
    }
    if (rc != SQLITE_DONE) goto sql_fail;
    if (!(vals = qi_calloc(n_cols ? n_cols : 1, sizeof *vals))) goto nomem;

    for (int i = 0; i < N_RUN_COLS; i++) csv_field(out, k_run_cols[i], i == 0);
    for (size_t c = 0; c < n_cols; c++) {
        /* "config" alone: a configuration that is a single value */
        csv_field2(out, cols[c][0] ? "config." : "config", cols[c], false);
    }
    fputs(",metric,value,unit,repetition,simulated\r\n", out);

    rc = sqlite3_prepare_v2(db->conn,
                            "SELECT id, started, finished, git_rev, git_dirty, cpu, cores, mem_bytes, gpu,"
                            " gpu_driver, model_path, model_sha256, engine_version, seed, config_json"
                            " FROM runs WHERE experiment_id = ?1 AND status = 'done' ORDER BY id",
                            -1, &q_runs, NULL);
    if (rc != SQLITE_OK) goto sql_fail;
    sqlite3_bind_int64(q_runs, 1, exp_id);
    if ((rc = sqlite3_prepare_v2(db->conn, LEAF_SQL("json_tree(?1) t"), -1, &q_leaf, NULL)) != SQLITE_OK)
        goto sql_fail;
    if ((rc = sqlite3_prepare_v2(db->conn,
                                 "SELECT name, value, unit, repetition, simulated FROM metrics"
                                 " WHERE run_id = ?1 ORDER BY name, repetition",
                                 -1, &q_met, NULL)) != SQLITE_OK)
        goto sql_fail;
    while ((rc = sqlite3_step(q_runs)) == SQLITE_ROW) {
        for (size_t c = 0; c < n_cols; c++) {
            qi_free(vals[c]);
            vals[c] = NULL;
        }
        sqlite3_reset(q_leaf);
        sqlite3_bind_value(q_leaf, 1, sqlite3_column_value(q_runs, 14));
        while ((rc = sqlite3_step(q_leaf)) == SQLITE_ROW) {
            const char *path = col_text(q_leaf, 0), *type = col_text(q_leaf, 1);
            if (!path || !type) continue;
            char **hit = bsearch(&path, cols, n_cols, sizeof *cols, cmp_str);
            if (!hit) continue;
            char num[40];
            const char *v = NULL;
            if (!strcmp(type, "true") || !strcmp(type, "false")) v = type;
            else if (!strcmp(type, "real")) {
                fmt_double(sqlite3_column_double(q_leaf, 2), num, sizeof num);
                v = num;
            } else if (strcmp(type, "null") != 0) v = col_text(q_leaf, 2);
            if (v && !(vals[hit - cols] = dup_str(v))) goto nomem;
        }
        if (rc != SQLITE_DONE) goto sql_fail;

        sqlite3_reset(q_met);
        sqlite3_bind_int64(q_met, 1, sqlite3_column_int64(q_runs, 0));
        while ((rc = sqlite3_step(q_met)) == SQLITE_ROW) {
            for (int i = 0; i < N_RUN_COLS; i++) csv_field(out, col_text(q_runs, i), i == 0);
            for (size_t c = 0; c < n_cols; c++) csv_field(out, vals[c], false);
            char num[40], rep[24];
            fmt_double(sqlite3_column_double(q_met, 1), num, sizeof num);
            snprintf(rep, sizeof rep, "%lld", (long long)sqlite3_column_int64(q_met, 3));
            csv_field(out, col_text(q_met, 0), false);
            csv_field(out, num, false);
            csv_field(out, col_text(q_met, 2), false);
            csv_field(out, rep, false);
            csv_field(out, sqlite3_column_int(q_met, 4) ? "1" : "0", false);
            fputs("\r\n", out);
        }
        if (rc != SQLITE_DONE) goto sql_fail;
    }
    if (rc != SQLITE_DONE) goto sql_fail;
    if (fflush(out) != 0 || ferror(out))
        st = QI_ERR(err, QI_ERR_IO, "exporting '%s' from %s: writing the CSV failed: %s", exp_name, db->path,
                    strerror(errno));
    goto done;

nomem:
    st = QI_ERR(err, QI_ERR_NOMEM, "%s: out of memory exporting '%s'", db->path, exp_name);
    goto done;
sql_fail:
    st = qi_db_fail(db, rc, err, "exporting '%s'", exp_name);
done:
    sqlite3_finalize(q_exp);
    sqlite3_finalize(q_cols);
    sqlite3_finalize(q_runs);
    sqlite3_finalize(q_leaf);
    sqlite3_finalize(q_met);
    if (own_txn) qi_db_exec(db, "COMMIT");
    for (size_t c = 0; c < n_cols; c++) {
        qi_free(cols[c]);
        if (vals) qi_free(vals[c]);
    }
    qi_free(cols);
    qi_free(vals);
    return st;
}

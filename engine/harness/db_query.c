/* db_query.c - reading the results database: the experiments with their
 * run counts, an experiment's finished runs as CSV, and its metrics
 * summarised as a table (`qinfer results`).
 *
 * The CSV is long rather than wide: one line per (run, metric), so a figure
 * script filters by metric name and needs no knowledge of which metrics a run
 * has. The configuration is flattened with SQLite's json_tree into one column
 * per leaf path, the union over the experiment's runs (sorted, so the column
 * order does not depend on which run came first); both passes read one
 * snapshot. Numbers are printed with the fewest digits that read back to the
 * same double, so the file is exact without being noisy.
 *
 * The summary groups runs by configuration values read with json_extract
 * (each key also as JSON text, so the value true and the number 1, or the
 * string "1" and the number 1, stay apart) and averages each metric over the
 * group's runs and repetitions. SQLite has no standard deviation, and a
 * sum-of-squares formula loses the digits of small spreads around large
 * means, so the rows come sorted by group and the statistics are
 * accumulated here with Welford's update; the data are small (a few
 * thousand numbers per experiment). Asked-for parameters and metrics are
 * checked against what the runs hold, and a wrong one is reported with the
 * list of right ones rather than giving an empty table.
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
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
void qi_db_format_number(double v, char *buf, size_t n) {
    if (isinf(v) || isnan(v)) {
        snprintf(buf, n, "%s", isnan(v) ? "nan" : v < 0 ? "-inf" : "inf");
        return;
    }
    for (int prec = 15; prec <= 17; prec++) {
        snprintf(buf, n, "%.*g", prec, v);
        if (strtod(buf, NULL) == v) return;
    }
}

static void fmt_double(double v, char *buf, size_t n) { qi_db_format_number(v, buf, n); }

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

/* A configuration leaf's path: json_tree's fullkey without the "$." or "$",
 * and without the quotes SQLite puts around a key that is not purely
 * alphanumeric ($."kv_budget"), so a parameter is named as the script names
 * it (kv_budget) and the path still works in json_extract. (A key holding a
 * '.' itself would then read as two levels; parameter names never do.) */
#define LEAF_SQL(src)                                                                                          \
    "SELECT replace(substr(t.fullkey, CASE WHEN substr(t.fullkey, 2, 1) = '.' THEN 3 ELSE 2 END), '\"', '')" \
    " AS path, t.type, t.atom FROM " src " WHERE t.type NOT IN ('object', 'array')"

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
                                 "SELECT " QI_DB_METRIC_LABEL("m") ", value, unit, repetition, simulated FROM metrics m"
                                 " WHERE run_id = ?1 ORDER BY 1, repetition",
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

/* ---- summaries -------------------------------------------------------------------- */

/* A growable list of owned strings. */
typedef struct {
    char **v;
    size_t n, cap;
} str_list;

static bool list_add(str_list *l, const char *s) {
    if (l->n == l->cap) {
        size_t nc = l->cap ? 2 * l->cap : 16;
        char **g = qi_realloc(l->v, nc * sizeof *g);
        if (!g) return false;
        l->v = g;
        l->cap = nc;
    }
    if (!(l->v[l->n] = dup_str(s ? s : ""))) return false;
    l->n++;
    return true;
}

static int list_find(const str_list *l, const char *s) {
    for (size_t i = 0; i < l->n; i++)
        if (!strcmp(l->v[i], s)) return (int)i;
    return -1;
}

static void list_free(str_list *l) {
    for (size_t i = 0; i < l->n; i++) qi_free(l->v[i]);
    qi_free(l->v);
    memset(l, 0, sizeof *l);
}

/* The first column of every row of `sql` (?1 bound to id when id > 0) into
 * out. Returns SQLITE_DONE, or the failing SQLite code (SQLITE_NOMEM when
 * the list cannot grow). */
static int query_list(qi_db *db, const char *sql, int64_t id, str_list *out) {
    sqlite3_stmt *s = NULL;
    int rc = sqlite3_prepare_v2(db->conn, sql, -1, &s, NULL);
    if (rc == SQLITE_OK) {
        if (id > 0) sqlite3_bind_int64(s, 1, id);
        while ((rc = sqlite3_step(s)) == SQLITE_ROW)
            if (!list_add(out, col_text(s, 0))) {
                rc = SQLITE_NOMEM;
                break;
            }
    }
    sqlite3_finalize(s);
    return rc;
}

/* The names of a list joined by ", " into buf (n bytes), cut with "..."
 * where they do not fit; "none" for an empty list. */
static void join_names(const str_list *l, char *buf, size_t n) {
    size_t w = 0;
    buf[0] = 0;
    if (l->n == 0) snprintf(buf, n, "none");
    for (size_t i = 0; i < l->n; i++) {
        size_t need = strlen(l->v[i]) + (i ? 2 : 0);
        if (w + need + 5 > n) {
            snprintf(buf + w, n - w, "%s...", i ? ", " : "");
            return;
        }
        w += (size_t)snprintf(buf + w, n - w, "%s%s", i ? ", " : "", l->v[i]);
    }
}

static qi_status find_experiment(qi_db *db, const char *name, int64_t *id, qi_err *err) {
    sqlite3_stmt *s = NULL;
    int rc = sqlite3_prepare_v2(db->conn, "SELECT id FROM experiments WHERE name = ?1", -1, &s, NULL);
    if (rc == SQLITE_OK) {
        sqlite3_bind_text(s, 1, name, -1, SQLITE_TRANSIENT);
        rc = sqlite3_step(s);
        if (rc == SQLITE_ROW) *id = sqlite3_column_int64(s, 0);
    }
    sqlite3_finalize(s);
    if (rc == SQLITE_ROW) return QI_OK;
    if (rc != SQLITE_DONE) return qi_db_fail(db, rc, err, "looking up experiment '%s'", name);
    str_list names = {0};
    rc = query_list(db, "SELECT name FROM experiments ORDER BY name", 0, &names);
    char list[300];
    join_names(&names, list, sizeof list);
    list_free(&names);
    if (rc != SQLITE_DONE) return qi_db_fail(db, rc, err, "listing experiments");
    return QI_ERR(err, QI_ERR_INVALID, "%s: no experiment named '%s' (experiments: %s)", db->path, name, list);
}

/* A SQL string that grows; `failed` once an append could not. */
typedef struct {
    char *s;
    size_t n, cap;
    bool failed;
} sql_buf;

static void sql_add(sql_buf *b, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

static void sql_add(sql_buf *b, const char *fmt, ...) {
    if (b->failed) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int w = vsnprintf(b->s ? b->s + b->n : NULL, b->s ? b->cap - b->n : 0, fmt, ap);
        va_end(ap);
        if (w < 0) {
            b->failed = true;
            return;
        }
        if (b->s && b->n + (size_t)w < b->cap) {
            b->n += (size_t)w;
            return;
        }
        size_t nc = b->cap ? 2 * b->cap : 1024;
        while (nc < b->n + (size_t)w + 1) nc *= 2;
        char *g = qi_realloc(b->s, nc);
        if (!g) {
            b->failed = true;
            return;
        }
        b->s = g;
        b->cap = nc;
    }
}

void qi_db_summary_free(qi_db_summary *s) {
    if (!s) return;
    for (int i = 0; i < s->n_keys; i++) qi_free(s->keys[i]);
    for (int i = 0; i < s->n_metrics; i++) {
        qi_free(s->metrics[i]);
        qi_free(s->units[i]);
    }
    for (size_t i = 0; i < (size_t)s->n_rows * (size_t)s->n_keys; i++) {
        qi_free(s->json[i]);
        qi_free(s->text[i]);
    }
    qi_free(s->experiment);
    qi_free(s->keys);
    qi_free(s->metrics);
    qi_free(s->units);
    qi_free(s->run_ids);
    qi_free(s->n_runs);
    qi_free(s->json);
    qi_free(s->text);
    qi_free(s->cells);
    qi_free(s);
}

/* Room for one more row in every per-row array of s (*cap rows allocated). */
static bool summary_grow(qi_db_summary *s, int *cap) {
    if (s->n_rows < *cap) return true;
    int nc = *cap ? 2 * *cap : 16;
    size_t nk = (size_t)(s->n_keys ? s->n_keys : 1), nm = (size_t)(s->n_metrics ? s->n_metrics : 1);
    int64_t *ids = qi_realloc(s->run_ids, (size_t)nc * sizeof *ids);
    if (ids) s->run_ids = ids;
    int64_t *nr = qi_realloc(s->n_runs, (size_t)nc * sizeof *nr);
    if (nr) s->n_runs = nr;
    char **js = qi_realloc(s->json, (size_t)nc * nk * sizeof *js);
    if (js) s->json = js;
    char **tx = qi_realloc(s->text, (size_t)nc * nk * sizeof *tx);
    if (tx) s->text = tx;
    qi_db_cell *cl = qi_realloc(s->cells, (size_t)nc * nm * sizeof *cl);
    if (cl) s->cells = cl;
    if (!ids || !nr || !js || !tx || !cl) return false;
    *cap = nc;
    return true;
}

static bool same_text(const char *a, const char *b) { return a && b ? !strcmp(a, b) : a == b; }

/* The chosen names (or, when n == 0, every one that exists) into out, each
 * checked against what exists: QI_ERR_INVALID, listing what exists, for an
 * unknown or repeated name. */
static qi_status pick_names(qi_db *db, const char *exp_name, const char *const *want, int n, const str_list *exist,
                            const char *what, const char *whats, str_list *out, qi_err *err) {
    char list[300];
    for (int i = 0; i < n; i++) {
        const char *w = want[i] ? want[i] : "";
        if (list_find(exist, w) < 0) {
            join_names(exist, list, sizeof list);
            return QI_ERR(err, QI_ERR_INVALID, "%s: experiment '%s' has no %s '%s' (%s: %s)", db->path, exp_name,
                          what, w, whats, list);
        }
        if (list_find(out, w) >= 0) return QI_ERR(err, QI_ERR_INVALID, "%s '%s' given twice", what, w);
        if (!list_add(out, w)) return QI_ERR(err, QI_ERR_NOMEM, "out of memory summarising '%s'", exp_name);
    }
    if (n == 0)
        for (size_t i = 0; i < exist->n; i++)
            if (!list_add(out, exist->v[i])) return QI_ERR(err, QI_ERR_NOMEM, "out of memory summarising '%s'", exp_name);
    return QI_OK;
}

/* The columns of the summary query: the run, the metric, then per key its
 * JSON type, its value as JSON text and its plain SQL value. */
enum { SQ_RUN, SQ_NAME, SQ_UNIT, SQ_VALUE, SQ_SIM, SQ_KEYS };

qi_status qi_db_summary_create(qi_db *db, const char *exp_name, const qi_db_summary_opts *opts,
                               qi_db_summary **out, qi_err *err) {
    if (out) *out = NULL;
    if (!db || !exp_name || !out) return QI_ERR(err, QI_ERR_INVALID, "qi_db_summary_create: missing argument");
    const qi_db_summary_opts none = {0};
    const qi_db_summary_opts *o = opts ? opts : &none;
    qi_status st = QI_OK;
    int rc = SQLITE_OK;
    str_list leaves = {0}, names = {0}, keys = {0}, metrics = {0};
    sql_buf q = {0};
    sqlite3_stmt *stmt = NULL;
    qi_db_summary *s = NULL;
    /* One snapshot for the lists and the rows. */
    bool own_txn = sqlite3_get_autocommit(db->conn);
    if (own_txn && (rc = qi_db_exec(db, "BEGIN")) != SQLITE_OK)
        return qi_db_fail(db, rc, err, "summarising '%s'", exp_name);

    int64_t exp_id = 0;
    if ((st = find_experiment(db, exp_name, &exp_id, err)) != QI_OK) goto done;
    if ((rc = query_list(db,
                         "SELECT DISTINCT path FROM (" LEAF_SQL("runs r, json_tree(r.config_json) t")
                         " AND r.experiment_id = ?1 AND r.status = 'done') ORDER BY path",
                         exp_id, &leaves)) != SQLITE_DONE ||
        (rc = query_list(db,
                         "SELECT DISTINCT " QI_DB_METRIC_LABEL("m") " FROM runs r JOIN metrics m ON m.run_id = r.id"
                         " WHERE r.experiment_id = ?1 AND r.status = 'done' ORDER BY 1",
                         exp_id, &names)) != SQLITE_DONE)
        goto sql_fail;

    if ((st = pick_names(db, exp_name, o->by, o->n_by, &leaves, "parameter", "parameters", &keys, err)) ||
        (st = pick_names(db, exp_name, o->metrics, o->n_metrics, &names, "metric", "metrics", &metrics, err)))
        goto done;

    if (!(s = qi_calloc(1, sizeof *s)) || !(s->experiment = dup_str(exp_name))) goto nomem;
    s->per_run = o->n_by == 0;
    s->n_keys = (int)keys.n;
    s->keys = keys.v;
    s->n_metrics = (int)metrics.n;
    s->metrics = metrics.v;
    memset(&keys, 0, sizeof keys);
    memset(&metrics, 0, sizeof metrics);
    if (!(s->units = qi_calloc((size_t)(s->n_metrics ? s->n_metrics : 1), sizeof *s->units))) goto nomem;

    /* Key k is bound as ?(k + 2), its JSON path. JSON text keeps true apart
     * from 1 and "1" apart from 1; the plain value orders the rows. */
    sql_add(&q, "SELECT r.id, " QI_DB_METRIC_LABEL("m") ", m.unit, m.value, m.simulated");
    for (int k = 0; k < s->n_keys; k++)
        sql_add(&q,
                ", json_type(r.config_json, ?%d), CASE WHEN json_type(r.config_json, ?%d) IS NULL THEN NULL"
                " WHEN json_type(r.config_json, ?%d) IN ('true', 'false', 'null') THEN json_type(r.config_json, ?%d)"
                " ELSE json_quote(json_extract(r.config_json, ?%d)) END, json_extract(r.config_json, ?%d)",
                k + 2, k + 2, k + 2, k + 2, k + 2, k + 2);
    sql_add(&q, " FROM runs r LEFT JOIN metrics m ON m.run_id = r.id"
                " WHERE r.experiment_id = ?1 AND r.status = 'done' ORDER BY ");
    if (!s->per_run)
        for (int k = 0; k < s->n_keys; k++) sql_add(&q, "%d, %d, ", SQ_KEYS + 3 * k + 3, SQ_KEYS + 3 * k + 2);
    sql_add(&q, "r.id, 2, m.repetition");
    if (q.failed) goto nomem;
    if ((rc = sqlite3_prepare_v2(db->conn, q.s, -1, &stmt, NULL)) != SQLITE_OK) goto sql_fail;
    sqlite3_bind_int64(stmt, 1, exp_id);
    for (int k = 0; k < s->n_keys; k++) {
        const char *p = s->keys[k];
        char path[512];
        snprintf(path, sizeof path, "$%s%s", p[0] && p[0] != '[' ? "." : "", p);
        sqlite3_bind_text(stmt, k + 2, path, -1, SQLITE_TRANSIENT);
    }

    int cap = 0;
    int64_t last_run = 0;
    const size_t nk = (size_t)s->n_keys, nm = (size_t)s->n_metrics;
    while ((rc = sqlite3_step(stmt)) == SQLITE_ROW) {
        const int64_t run = sqlite3_column_int64(stmt, SQ_RUN);
        bool fresh_row = s->n_rows == 0;
        if (!fresh_row && s->per_run) fresh_row = run != s->run_ids[s->n_rows - 1];
        for (size_t k = 0; !fresh_row && k < nk; k++)
            fresh_row = !same_text(col_text(stmt, SQ_KEYS + 3 * (int)k + 1), s->json[(size_t)(s->n_rows - 1) * nk + k]);
        if (fresh_row) {
            if (!summary_grow(s, &cap)) goto nomem;
            const size_t r = (size_t)s->n_rows;
            for (size_t k = 0; k < nk; k++) s->json[r * nk + k] = s->text[r * nk + k] = NULL;
            s->n_rows++;
            s->run_ids[r] = run;
            s->n_runs[r] = 0;
            for (size_t c = 0; c < nm; c++) s->cells[r * nm + c] = (qi_db_cell){0};
            for (size_t k = 0; k < nk; k++) {
                const int col = SQ_KEYS + 3 * (int)k;
                const char *type = col_text(stmt, col), *json = col_text(stmt, col + 1);
                if (!json) continue;
                const char *plain = type && !strcmp(type, "text") ? col_text(stmt, col + 2) : json;
                if (!(s->json[r * nk + k] = dup_str(json)) || !(s->text[r * nk + k] = dup_str(plain ? plain : "")))
                    goto nomem;
            }
            last_run = 0;
        }
        const size_t r = (size_t)s->n_rows - 1;
        if (run != last_run) s->n_runs[r]++;
        last_run = run;
        const char *name = col_text(stmt, SQ_NAME);
        const int c = name ? list_find(&(str_list){s->metrics, nm, nm}, name) : -1;
        if (c < 0) continue;
        if (!s->units[c] && !(s->units[c] = dup_str(col_text(stmt, SQ_UNIT) ? col_text(stmt, SQ_UNIT) : "")))
            goto nomem;
        /* Welford's update; sd holds the sum of squared deviations until the end. */
        qi_db_cell *cell = &s->cells[r * nm + (size_t)c];
        const double v = sqlite3_column_double(stmt, SQ_VALUE);
        cell->n++;
        const double d = v - cell->mean;
        cell->mean += d / (double)cell->n;
        cell->sd += d * (v - cell->mean);
        cell->simulated |= sqlite3_column_int(stmt, SQ_SIM) != 0;
    }
    if (rc != SQLITE_DONE) goto sql_fail;
    for (size_t c = 0; c < nm; c++)
        if (!s->units[c] && !(s->units[c] = dup_str(""))) goto nomem;
    for (size_t i = 0; i < (size_t)s->n_rows * nm; i++) {
        qi_db_cell *cell = &s->cells[i];
        if (cell->n == 0) cell->mean = NAN;
        cell->sd = cell->n > 1 ? sqrt(cell->sd / (double)(cell->n - 1)) : 0.0;
        s->any_simulated |= cell->simulated;
    }
    *out = s;
    s = NULL;
    goto done;

nomem:
    st = QI_ERR(err, QI_ERR_NOMEM, "%s: out of memory summarising '%s'", db->path, exp_name);
    goto done;
sql_fail:
    st = qi_db_fail(db, rc, err, "summarising '%s'", exp_name);
done:
    sqlite3_finalize(stmt);
    if (own_txn) qi_db_exec(db, "COMMIT");
    qi_free(q.s);
    list_free(&leaves);
    list_free(&names);
    list_free(&keys);
    list_free(&metrics);
    qi_db_summary_free(s);
    return st;
}

/* db_merge.c - results databases merged into one (`qinfer results merge`):
 * the shards of a sweep run as a cluster's job array, or any databases of
 * the same experiments.
 *
 * Two phases, so that a bad input never leaves anything in the output:
 *
 * 1. Staging. A private scratch database (SQLite's temporary file, "") is
 *    opened; each input is ATTACHed read-only (a URI with mode=ro), checked
 *    (a qinfer results database of this build's schema version, whose
 *    PRAGMA integrity_check is "ok": a truncated or damaged file stops the
 *    merge here; and whose rows all keep the schema's constraints, written
 *    for a moment into the scratch database's copy of the schema: a row the
 *    output would refuse stops it here too), and its experiments, runs and
 *    metrics are copied into scratch tables tagged with the input's number;
 *    then it is DETACHed. The experiments of all inputs must agree: one
 *    name, one script (script_sha256), else the merge is refused.
 * 2. Merging. A new output is created with qi_db_open (as any results
 *    database, in WAL mode); an existing one keeps its journal mode, since
 *    switching it would change the file before anything is merged. The
 *    output is ATTACHed read-write and checked as the inputs were
 *    (read-write even where the merge is then refused: a read-only look at
 *    a WAL-mode database leaves empty -wal and -shm files beside it), its
 *    experiments are compared with the inputs' under the write lock, and
 *    everything is written in one transaction, input after input: a run
 *    whose experiment and configuration key the output already holds as
 *    'done' is left out, a 'done' run replaces a 'failed' one, a 'failed'
 *    run is copied only where the output has nothing for its configuration.
 *    Runs get new ids; their metrics follow them. A failure rolls the
 *    transaction back, and an output that did not exist before is removed.
 *
 * So merging is idempotent (a second merge of the same inputs finds every
 * run present), overlapping inputs add each configuration once (the first
 * input to hold it done wins), and the output never holds two rows of one
 * configuration: the UNIQUE (experiment_id, config_key) of the schema is
 * the invariant a sweep keeps, and a merged database keeps it too.
 *
 * Why scratch tables instead of copying straight from each attached input
 * inside the one transaction: SQLite cannot DETACH inside a transaction and
 * attaches at most a few (10 by default) databases at once, while a sweep
 * may have hundreds of shards. Considered: one transaction per input
 * (simpler, but a failure halfway leaves a partial merge) and copying rows
 * through C statements between two connections (more code, same result).
 */
#include "db_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define QI_DB_APP_ID 0x51494E46

typedef struct {
    sqlite3 *conn;    /* the scratch database */
    qi_db view;       /* for qi_db_fail: conn and the path named in messages */
} merge_ctx;

static qi_status fail_at(merge_ctx *m, const char *path, int rc, qi_err *err, const char *what) {
    m->view.path = (char *)path;
    return qi_db_fail(&m->view, rc, err, "%s", what);
}

/* A read-only URI for path: "file:" + the path with every byte outside
 * [A-Za-z0-9._~/-] percent-encoded ("file:///abs" for an absolute path, so
 * a leading "//" is never read as an authority) + "?mode=ro" when ro. */
static char *path_uri(const char *path, bool ro) {
    static const char hex[] = "0123456789ABCDEF";
    size_t n = strlen(path);
    char *u = qi_malloc(3 * n + 32);
    if (!u) return NULL;
    size_t j = 0;
    memcpy(u, "file:", 5);
    j = 5;
    if (path[0] == '/') {
        memcpy(u + j, "//", 2);
        j += 2;
    }
    for (const unsigned char *c = (const unsigned char *)path; *c; c++) {
        if ((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') || strchr("._~/-", *c)) {
            u[j++] = (char)*c;
        } else {
            u[j++] = '%';
            u[j++] = hex[*c >> 4];
            u[j++] = hex[*c & 15];
        }
    }
    if (ro) {
        memcpy(u + j, "?mode=ro", 8);
        j += 8;
    }
    u[j] = 0;
    return u;
}

/* One statement with its parameters bound as integers ?1.. (n of them);
 * SQLITE_OK, or the failing code with the connection's message left set. */
static int exec_int(sqlite3 *c, const char *sql, int n, const int64_t *v) {
    sqlite3_stmt *s = NULL;
    int rc = sqlite3_prepare_v2(c, sql, -1, &s, NULL);
    if (rc == SQLITE_OK) {
        for (int i = 0; i < n; i++) sqlite3_bind_int64(s, i + 1, v[i]);
        while ((rc = sqlite3_step(s)) == SQLITE_ROW) {}
        if (rc == SQLITE_DONE) rc = SQLITE_OK;
    }
    sqlite3_finalize(s);
    return rc;
}

/* The integer of the first row of sql (with ?1 = a, when n >= 1). */
static int query_i64(sqlite3 *c, const char *sql, int n, const int64_t *v, int64_t *out) {
    sqlite3_stmt *s = NULL;
    *out = 0;
    int rc = sqlite3_prepare_v2(c, sql, -1, &s, NULL);
    if (rc == SQLITE_OK) {
        for (int i = 0; i < n; i++) sqlite3_bind_int64(s, i + 1, v[i]);
        rc = sqlite3_step(s);
        if (rc == SQLITE_ROW) *out = sqlite3_column_int64(s, 0);
        if (rc == SQLITE_ROW || rc == SQLITE_DONE) rc = SQLITE_OK;
    }
    sqlite3_finalize(s);
    return rc;
}

static const char scratch_sql[] =
    "PRAGMA foreign_keys = ON;"
    "CREATE TABLE in_experiments (src INTEGER NOT NULL, name TEXT NOT NULL, script_path TEXT,"
    " script_sha256 TEXT, created TEXT NOT NULL);"
    "CREATE TABLE in_runs (rid INTEGER PRIMARY KEY, src INTEGER NOT NULL, id INTEGER NOT NULL,"
    " experiment_name TEXT NOT NULL, config_json TEXT NOT NULL, config_key TEXT NOT NULL, status TEXT NOT NULL,"
    " error TEXT, git_rev TEXT, git_dirty INTEGER, cpu TEXT, cores INTEGER, mem_bytes INTEGER, gpu TEXT,"
    " gpu_driver TEXT, model_path TEXT, model_sha256 TEXT, engine_version TEXT, seed INTEGER,"
    " simulated INTEGER NOT NULL, started TEXT NOT NULL, finished TEXT, placement TEXT);"
    "CREATE INDEX in_runs_src ON in_runs(src, id);"
    "CREATE TABLE in_metrics (id INTEGER PRIMARY KEY, src INTEGER NOT NULL, run_id INTEGER NOT NULL,"
    " name TEXT NOT NULL, value REAL NOT NULL, unit TEXT NOT NULL, repetition INTEGER NOT NULL,"
    " simulated INTEGER NOT NULL, params TEXT NOT NULL);"
    "CREATE INDEX in_metrics_run ON in_metrics(src, run_id);"
    "CREATE TABLE pick (src_run INTEGER PRIMARY KEY, exp_id INTEGER NOT NULL, config_key TEXT NOT NULL,"
    " replace_id INTEGER);";

/* ATTACH path AS `alias` (read-only when ro) and check that it is a sound
 * qinfer results database of this build's schema version. */
static qi_status attach_checked(merge_ctx *m, const char *path, const char *alias, bool ro, qi_err *err) {
    struct stat sb;
    if (stat(path, &sb) != 0) return QI_ERR(err, QI_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    if (S_ISDIR(sb.st_mode)) return QI_ERR(err, QI_ERR_INVALID, "%s: is a directory, not a results database", path);
    char *uri = path_uri(path, ro);
    if (!uri) return QI_ERR(err, QI_ERR_NOMEM, "%s: out of memory", path);
    char sql[64];
    snprintf(sql, sizeof sql, "ATTACH DATABASE ?1 AS %s", alias);
    sqlite3_stmt *s = NULL;
    int rc = sqlite3_prepare_v2(m->conn, sql, -1, &s, NULL);
    if (rc == SQLITE_OK) {
        sqlite3_bind_text(s, 1, uri, -1, SQLITE_TRANSIENT);
        rc = sqlite3_step(s);
        if (rc == SQLITE_DONE) rc = SQLITE_OK;
    }
    sqlite3_finalize(s);
    qi_free(uri);
    if (rc != SQLITE_OK)
        return fail_at(m, path, rc, err, (rc & 0xff) == SQLITE_CORRUPT ? "cannot open (truncated or corrupt?)" : "cannot open");

    int64_t app = 0, ver = 0;
    char q[96];
    snprintf(q, sizeof q, "PRAGMA %s.application_id", alias);
    if ((rc = query_i64(m->conn, q, 0, NULL, &app)) == SQLITE_OK) {
        snprintf(q, sizeof q, "PRAGMA %s.user_version", alias);
        rc = query_i64(m->conn, q, 0, NULL, &ver);
    }
    if (rc != SQLITE_OK)
        return fail_at(m, path, rc, err, (rc & 0xff) == SQLITE_CORRUPT ? "reading (truncated or corrupt?)" : "reading");
    if (app != QI_DB_APP_ID)
        return QI_ERR(err, QI_ERR_DB, "%s: not a qinfer results database (application_id 0x%08llx)", path,
                      (unsigned long long)(uint32_t)app);
    if (ver != qi_db_schema_version())
        return QI_ERR(err, QI_ERR_UNSUPPORTED,
                      "%s: schema version %lld, but this merge writes version %d: the databases of a merge must "
                      "have one schema version (merge them with the qinfer that wrote them)",
                      path, (long long)ver, qi_db_schema_version());

    /* Every page read: a truncated or damaged file fails here, not halfway. */
    snprintf(q, sizeof q, "PRAGMA %s.integrity_check(1)", alias);
    rc = sqlite3_prepare_v2(m->conn, q, -1, &s, NULL);
    char first[512] = "";
    if (rc == SQLITE_OK) {
        rc = sqlite3_step(s);
        if (rc == SQLITE_ROW) {
            const unsigned char *t = sqlite3_column_text(s, 0);
            snprintf(first, sizeof first, "%s", t ? (const char *)t : "");
            rc = SQLITE_OK;
        }
    }
    if (rc != SQLITE_OK) {
        qi_status st = fail_at(m, path, rc, err, "checking the database (truncated or corrupt?)");
        sqlite3_finalize(s);
        return st;
    }
    sqlite3_finalize(s);
    if (strcmp(first, "ok") != 0) {
        /* one line, without the "*** in database src ***" heading */
        char *t = first, *h = strstr(first, "***");
        if (h == first && (h = strstr(first + 3, "***")) != NULL) t = h + 3;
        for (char *c = t; *c; c++)
            if (*c == '\n' || *c == '\r') *c = ' ';
        while (*t == ' ') t++;
        return QI_ERR(err, QI_ERR_DB, "%s: the database is corrupt (integrity_check: %s)", path, t);
    }
    return QI_OK;
}

static void detach(merge_ctx *m, const char *alias) {
    char sql[48];
    snprintf(sql, sizeof sql, "DETACH DATABASE %s", alias);
    sqlite3_exec(m->conn, sql, NULL, NULL, NULL);
}

/* Each statement of sql in turn, ?1 bound to src where a statement has it;
 * SQLITE_OK, or the failing code with the connection's message left set. */
static int exec_all(sqlite3 *c, const char *sql, int64_t src) {
    const char *tail = sql;
    while (*tail) {
        sqlite3_stmt *s = NULL;
        int rc = sqlite3_prepare_v2(c, tail, -1, &s, &tail);
        if (rc == SQLITE_OK && s) {
            if (sqlite3_bind_parameter_count(s) > 0) sqlite3_bind_int64(s, 1, src);
            rc = sqlite3_step(s);
            if (rc == SQLITE_DONE) rc = SQLITE_OK;
        }
        sqlite3_finalize(s);
        if (rc != SQLITE_OK) return rc;
        while (*tail == ' ' || *tail == '\n') tail++;
    }
    return SQLITE_OK;
}

/* Every row of the input (attached as "src") written, inside a savepoint
 * rolled back afterwards, into the scratch database's own copy of the
 * results schema: a row that breaks one of its constraints is refused
 * here, before the output is touched, not by the output's write. A CHECK
 * such as json_valid(placement) passes integrity_check; NOT NULL, UNIQUE
 * and the foreign keys are the input's own schema's to keep, and a hostile
 * file may declare none. */
static qi_status check_rows(merge_ctx *m, const char *path, qi_err *err) {
    static const char sql[] =
        "SAVEPOINT chk;"
        "INSERT INTO main.experiments (id, name, script_path, script_sha256, created)"
        " SELECT id, name, script_path, script_sha256, created FROM src.experiments;"
        "INSERT INTO main.runs (id, experiment_id, config_json, config_key, status, error, git_rev, git_dirty, cpu,"
        " cores, mem_bytes, gpu, gpu_driver, model_path, model_sha256, engine_version, seed, simulated, started,"
        " finished, placement)"
        " SELECT id, experiment_id, config_json, config_key, status, error, git_rev, git_dirty, cpu, cores,"
        " mem_bytes, gpu, gpu_driver, model_path, model_sha256, engine_version, seed, simulated, started, finished,"
        " placement FROM src.runs;"
        "INSERT INTO main.metrics (id, run_id, name, value, unit, repetition, simulated, params)"
        " SELECT id, run_id, name, value, unit, repetition, simulated, params FROM src.metrics;";
    int rc = exec_all(m->conn, sql, 0);
    qi_status st = rc == SQLITE_OK ? QI_OK : fail_at(m, path, rc, err, "a row breaks the results schema");
    sqlite3_exec(m->conn, "ROLLBACK TO chk; RELEASE chk", NULL, NULL, NULL);
    return st;
}

/* Copy input `src` (attached as "src") into the scratch tables, once its
 * rows are checked against the schema. */
static qi_status stage(merge_ctx *m, const char *path, int64_t src, qi_err *err) {
    static const char sql[] =
        "INSERT INTO in_experiments SELECT ?1, name, script_path, script_sha256, created FROM src.experiments;"
        "INSERT INTO in_runs (src, id, experiment_name, config_json, config_key, status, error, git_rev, git_dirty,"
        " cpu, cores, mem_bytes, gpu, gpu_driver, model_path, model_sha256, engine_version, seed, simulated,"
        " started, finished, placement)"
        " SELECT ?1, r.id, e.name, r.config_json, r.config_key, r.status, r.error, r.git_rev, r.git_dirty, r.cpu,"
        " r.cores, r.mem_bytes, r.gpu, r.gpu_driver, r.model_path, r.model_sha256, r.engine_version, r.seed,"
        " r.simulated, r.started, r.finished, r.placement"
        " FROM src.runs r JOIN src.experiments e ON e.id = r.experiment_id ORDER BY r.id;"
        "INSERT INTO in_metrics (src, run_id, name, value, unit, repetition, simulated, params)"
        " SELECT ?1, run_id, name, value, unit, repetition, simulated, params FROM src.metrics ORDER BY id;";
    qi_status st = check_rows(m, path, err);
    if (st != QI_OK) return st;
    int rc = exec_all(m->conn, sql, src);
    return rc == SQLITE_OK ? QI_OK : fail_at(m, path, rc, err, "reading its runs");
}

/* Refuse the first pair of inputs (with_out: or the output, number 0,
 * attached as "out") holding one experiment name with two different
 * scripts; an unknown (NULL) script agrees with any. */
static qi_status check_definitions(merge_ctx *m, const char *out_path, const char *const *in, bool with_out,
                                   qi_err *err) {
    char sql[512];
    snprintf(sql, sizeof sql,
             "SELECT a.name, a.src, b.src, a.script_sha256, b.script_sha256 FROM (%s) a JOIN (%s) b"
             " ON a.name = b.name AND a.src < b.src AND a.script_sha256 <> b.script_sha256"
             " ORDER BY a.src, b.src LIMIT 1",
             with_out ? "SELECT 0 AS src, name, script_sha256 FROM out.experiments UNION ALL "
                        "SELECT src, name, script_sha256 FROM in_experiments"
                      : "SELECT src, name, script_sha256 FROM in_experiments",
             with_out ? "SELECT 0 AS src, name, script_sha256 FROM out.experiments UNION ALL "
                        "SELECT src, name, script_sha256 FROM in_experiments"
                      : "SELECT src, name, script_sha256 FROM in_experiments");
    sqlite3_stmt *s = NULL;
    int rc = sqlite3_prepare_v2(m->conn, sql, -1, &s, NULL);
    qi_status st = QI_OK;
    if (rc == SQLITE_OK) rc = sqlite3_step(s);
    if (rc == SQLITE_ROW) {
        int a = sqlite3_column_int(s, 1), b = sqlite3_column_int(s, 2);
        const char *sa = (const char *)sqlite3_column_text(s, 3), *sb = (const char *)sqlite3_column_text(s, 4);
        st = QI_ERR(err, QI_ERR_INVALID,
                    "experiment '%s': %s was run from another script than %s (sha256 %.12s... and %.12s...): "
                    "merge only databases of one experiment definition",
                    (const char *)sqlite3_column_text(s, 0), in[b - 1], a == 0 ? out_path : in[a - 1],
                    sb ? sb : "?", sa ? sa : "?");
    } else if (rc != SQLITE_DONE) {
        st = fail_at(m, out_path, rc, err, "comparing the experiments");
    }
    sqlite3_finalize(s);
    return st;
}

/* Merge staged input `src` into "out" (inside the open transaction). */
static qi_status merge_one(merge_ctx *m, const char *out_path, int64_t src, qi_db_merge_stats *ms, qi_err *err) {
    static const char *const steps[] = {
        "INSERT INTO out.experiments (name, script_path, script_sha256, created)"
        " SELECT name, script_path, script_sha256, created FROM in_experiments WHERE src = ?1"
        " ON CONFLICT (name) DO UPDATE SET script_path = coalesce(script_path, excluded.script_path),"
        " script_sha256 = coalesce(script_sha256, excluded.script_sha256)",
        "DELETE FROM pick",
        /* done beats failed; otherwise what the output holds stays */
        "INSERT INTO pick (src_run, exp_id, config_key, replace_id)"
        " SELECT r.rid, e.id, r.config_key, d.id FROM in_runs r"
        " JOIN out.experiments e ON e.name = r.experiment_name"
        " LEFT JOIN out.runs d ON d.experiment_id = e.id AND d.config_key = r.config_key"
        " WHERE r.src = ?1 AND r.status IN ('done', 'failed')"
        " AND (d.id IS NULL OR (d.status <> 'done' AND r.status = 'done'))",
        "DELETE FROM out.metrics WHERE run_id IN (SELECT replace_id FROM pick WHERE replace_id IS NOT NULL)",
        "DELETE FROM out.runs WHERE id IN (SELECT replace_id FROM pick WHERE replace_id IS NOT NULL)",
        "INSERT INTO out.runs (experiment_id, config_json, config_key, status, error, git_rev, git_dirty, cpu,"
        " cores, mem_bytes, gpu, gpu_driver, model_path, model_sha256, engine_version, seed, simulated, started,"
        " finished, placement)"
        " SELECT p.exp_id, r.config_json, r.config_key, r.status, r.error, r.git_rev, r.git_dirty, r.cpu, r.cores,"
        " r.mem_bytes, r.gpu, r.gpu_driver, r.model_path, r.model_sha256, r.engine_version, r.seed, r.simulated,"
        " r.started, r.finished, r.placement FROM pick p JOIN in_runs r ON r.rid = p.src_run ORDER BY r.id",
        "INSERT INTO out.metrics (run_id, name, value, unit, repetition, simulated, params)"
        " SELECT d.id, x.name, x.value, x.unit, x.repetition, x.simulated, x.params FROM pick p"
        " JOIN in_runs r ON r.rid = p.src_run"
        " JOIN in_metrics x ON x.src = r.src AND x.run_id = r.id"
        " JOIN out.runs d ON d.experiment_id = p.exp_id AND d.config_key = p.config_key"
        " ORDER BY d.id, x.id",
    };
    int rc;
    if ((rc = query_i64(m->conn, "SELECT count(*) FROM in_runs WHERE src = ?1 AND status IN ('done', 'failed')", 1,
                        &src, &ms->n_runs)) != SQLITE_OK)
        return fail_at(m, out_path, rc, err, "merging");
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
        if ((rc = exec_int(m->conn, steps[i], 1, &src)) != SQLITE_OK) return fail_at(m, out_path, rc, err, "merging");
        if (i == 2 && ((rc = query_i64(m->conn, "SELECT count(*) FROM pick", 0, NULL, &ms->n_added)) != SQLITE_OK ||
                       (rc = query_i64(m->conn, "SELECT count(replace_id) FROM pick", 0, NULL, &ms->n_replaced)) !=
                           SQLITE_OK))
            return fail_at(m, out_path, rc, err, "merging");
    }
    return QI_OK;
}

static void remove_db_files(const char *path) {
    size_t n = strlen(path) + 8;
    char *p = qi_malloc(n);
    unlink(path);
    if (!p) return;
    snprintf(p, n, "%s-wal", path);
    unlink(p);
    snprintf(p, n, "%s-shm", path);
    unlink(p);
    snprintf(p, n, "%s-journal", path);
    unlink(p);
    qi_free(p);
}

qi_status qi_db_merge(const char *out_path, const char *const *in_paths, int n_in, qi_db_merge_stats *stats,
                      qi_err *err) {
    if (!out_path || !*out_path) return QI_ERR(err, QI_ERR_INVALID, "merge: no output database given");
    if (n_in < 1 || !in_paths) return QI_ERR(err, QI_ERR_INVALID, "merge: no input databases given");
    if (stats) memset(stats, 0, (size_t)n_in * sizeof *stats);
    struct stat out_sb;
    const bool out_existed = stat(out_path, &out_sb) == 0;
    if (out_existed && S_ISDIR(out_sb.st_mode))
        return QI_ERR(err, QI_ERR_INVALID, "%s: is a directory, not a results database file", out_path);
    for (int i = 0; i < n_in; i++) {
        struct stat sb;
        if (!in_paths[i]) return QI_ERR(err, QI_ERR_INVALID, "merge: input %d has no name", i + 1);
        if (out_existed && stat(in_paths[i], &sb) == 0 && sb.st_dev == out_sb.st_dev && sb.st_ino == out_sb.st_ino)
            return QI_ERR(err, QI_ERR_INVALID, "%s: is the output itself; name another output file", in_paths[i]);
    }

    merge_ctx m = {0};
    m.view.path = (char *)out_path;
    int rc = sqlite3_open_v2("", &m.conn, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_URI, NULL);
    m.view.conn = m.conn;
    qi_status st = QI_OK;
    qi_db *out = NULL;
    bool created = false, attached_out = false, in_txn = false;
    if (rc != SQLITE_OK) {
        st = fail_at(&m, out_path, rc, err, "opening a scratch database");
        goto done;
    }
    sqlite3_extended_result_codes(m.conn, 1);
    sqlite3_busy_timeout(m.conn, 10000);
    if ((rc = sqlite3_exec(m.conn, scratch_sql, NULL, NULL, NULL)) != SQLITE_OK) {
        st = fail_at(&m, out_path, rc, err, "preparing the scratch database");
        goto done;
    }
    /* the results schema itself, which check_rows holds each input to */
    if ((st = qi_db_migrate(&m.view, err)) != QI_OK) goto done;

    /* 1. every input checked and staged before the output is touched */
    for (int i = 0; i < n_in; i++) {
        st = attach_checked(&m, in_paths[i], "src", true, err);
        if (st == QI_OK) st = stage(&m, in_paths[i], i + 1, err);
        detach(&m, "src");
        if (st != QI_OK) goto done;
    }
    if ((st = check_definitions(&m, out_path, in_paths, false, err)) != QI_OK) goto done;

    /* 2. the output: a new one created as any results database; one that
     * exists (checked above: this build's schema version) is written as it
     * is, in its own journal mode, so that a refusal leaves it byte for
     * byte as it was. Then everything in one transaction. */
    if (!out_existed) {
        if ((st = qi_db_open(out_path, &out, err)) != QI_OK) goto done;
        created = true;
        qi_db_close(out);
        out = NULL;
    }
    /* checked like an input, but read-write: a read-only connection leaves
     * the -wal and -shm files of a WAL-mode database beside it (it cannot
     * checkpoint), where the read-write one's detach removes them */
    attached_out = true;
    if ((st = attach_checked(&m, out_path, "out", false, err)) != QI_OK) goto done;
    if ((rc = sqlite3_exec(m.conn, "PRAGMA out.synchronous = FULL; BEGIN IMMEDIATE", NULL, NULL, NULL)) !=
        SQLITE_OK) {
        st = fail_at(&m, out_path, rc, err, "beginning the merge");
        goto done;
    }
    in_txn = true;
    /* checked again under the write lock: a writer may have added to it */
    if ((st = check_definitions(&m, out_path, in_paths, true, err)) != QI_OK) goto done;
    for (int i = 0; i < n_in; i++) {
        qi_db_merge_stats one = {0};
        if ((st = merge_one(&m, out_path, i + 1, &one, err)) != QI_OK) goto done;
        if (stats) stats[i] = one;
    }
    if ((rc = sqlite3_exec(m.conn, "COMMIT", NULL, NULL, NULL)) != SQLITE_OK) {
        st = fail_at(&m, out_path, rc, err, "committing the merge (nothing was merged)");
        goto done;
    }
    in_txn = false;

done:
    if (in_txn) sqlite3_exec(m.conn, "ROLLBACK", NULL, NULL, NULL);
    if (attached_out) detach(&m, "out");
    sqlite3_close(m.conn);
    qi_db_close(out);
    if (st != QI_OK) {
        if (created) remove_db_files(out_path);
        if (stats) memset(stats, 0, (size_t)n_in * sizeof *stats);
    }
    return st;
}

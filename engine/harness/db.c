/* db.c - the results database: open, migrations, experiments, runs (API in
 * db.h, schema in results/; listing and export in db_query.c, the machine and
 * git facts in host.c).
 *
 * Transactions. A run is one write transaction: qi_db_run_begin issues BEGIN
 * IMMEDIATE, deletes a stale row of the same configuration and inserts the
 * new one as 'running'; qi_db_metric adds rows inside it; qi_db_run_end sets
 * 'done' or 'failed' and COMMITs. A process killed mid-run therefore leaves
 * no trace of the run (SQLite rolls the open transaction back when the file
 * is next opened), never a half-written one, and the configuration is simply
 * not done when the sweep resumes. Since 'running' is never committed, the
 * only stale rows a rerun meets are 'failed' ones (and 'running' rows another
 * writer may have left); at most one row per (experiment, config_key) exists,
 * enforced by a UNIQUE constraint, so a rerun replaces, never duplicates. The
 * delete happens inside the new run's transaction: a rerun that is killed
 * leaves the old row as it was.
 *
 * The price: the write lock is held for the whole run, so one process writes
 * to a file at a time; another writer waits for the busy timeout and then
 * fails with a message naming the cause. Readers (`qinfer results`, plots)
 * are not blocked: WAL mode lets them read the last committed state during a
 * run. Considered: committing a 'running' row at begin and its metrics as
 * they come (a crash then leaves rows to clean up, and a reader can see a
 * half-finished run as data), and buffering the run in memory to write it at
 * the end in one short transaction (no long lock, but errors in a metric
 * would surface only at the end, and run ids would not exist until then). A
 * sweep runs its configurations one after another on one machine, so the
 * long lock costs nothing in practice.
 *
 * Durability: synchronous=FULL, one fsync per run, which is nothing next to a
 * run's length; a power cut loses at most the run in flight.
 *
 * Migrations: results/migrations/NNNN_name.sql are compiled in (CMake writes
 * qi_db_migrations.h). PRAGMA user_version holds how many are applied and
 * PRAGMA application_id marks the file as ours; each missing migration runs
 * in its own transaction together with the user_version bump, re-checking
 * the version once the write lock is held, so two processes opening an old
 * file at once upgrade it once.
 *
 * Errors from SQLite are converted in one place, qi_db_fail: the file name, what
 * was being done, sqlite3_errmsg, and the OS error where there is one.
 */
#include "db_int.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "json.h"
#include "qi_db_migrations.h"
#include "sha256.h"

/* "QINF" in PRAGMA application_id: the file is a qinfer results database. */
#define QI_DB_APP_ID 0x51494E46
#define QI_DB_BUSY_MS 10000
#define NOW_SQL "strftime('%Y-%m-%dT%H:%M:%fZ', 'now')"

int qi_db_schema_version(void) { return QI_DB_N_MIGRATIONS; }

/* ---- errors ------------------------------------------------------------------- */

qi_status qi_db_fail(const qi_db *db, int rc, qi_err *err, const char *fmt, ...) {
    char what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    const char *msg = db->conn ? sqlite3_errmsg(db->conn) : sqlite3_errstr(rc);
    int sys = db->conn ? sqlite3_system_errno(db->conn) : 0;
    qi_status st = QI_ERR_DB;
    const char *hint = "";
    switch (rc & 0xff) {
    case SQLITE_NOMEM: st = QI_ERR_NOMEM; break;
    case SQLITE_CANTOPEN:
    case SQLITE_IOERR:
    case SQLITE_READONLY:
    case SQLITE_PERM:
    case SQLITE_FULL: st = QI_ERR_IO; break;
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
        hint = " (another process is writing to this database: a run holds the write lock until it ends)";
        sys = 0;
        break;
    default: sys = 0;
    }
    if (sys) return QI_ERR(err, st, "%s: %s: %s: %s%s", db->path, what, msg, strerror(sys), hint);
    return QI_ERR(err, st, "%s: %s: %s%s", db->path, what, msg, hint);
}

/* The first column of the first row of `sql`, as an integer (0 when there is
 * no row). */
static int query_int(qi_db *db, const char *sql, int64_t *v) {
    sqlite3_stmt *s = NULL;
    int rc = sqlite3_prepare_v2(db->conn, sql, -1, &s, NULL);
    *v = 0;
    if (rc == SQLITE_OK) {
        rc = sqlite3_step(s);
        if (rc == SQLITE_ROW) {
            *v = sqlite3_column_int64(s, 0);
            rc = SQLITE_OK;
        } else if (rc == SQLITE_DONE) {
            rc = SQLITE_OK;
        }
    }
    /* After a failed step, finalize returns the same code and leaves
     * sqlite3_errmsg describing it. */
    sqlite3_finalize(s);
    return rc;
}

/* ---- open, migrate, close ---------------------------------------------------------- */

static qi_status check_version(const qi_db *db, int64_t app, int64_t ver, qi_err *err) {
    if (app != 0 && app != QI_DB_APP_ID)
        return QI_ERR(err, QI_ERR_DB, "%s: not a qinfer results database (application_id 0x%08llx)", db->path,
                      (unsigned long long)(uint32_t)app);
    if (app == 0 && ver != 0)
        return QI_ERR(err, QI_ERR_DB,
                      "%s: not a qinfer results database (schema version %lld, but no qinfer application_id)",
                      db->path, (long long)ver);
    if (ver > QI_DB_N_MIGRATIONS || ver < 0)
        return QI_ERR(err, QI_ERR_UNSUPPORTED,
                      "%s: the database has schema version %lld, newer than this qinfer knows (%d); "
                      "open it with the qinfer that wrote it, or a later one",
                      db->path, (long long)ver, QI_DB_N_MIGRATIONS);
    return QI_OK;
}

qi_status qi_db_migrate(qi_db *db, qi_err *err) {
    int64_t app, ver;
    int rc;
    if ((rc = query_int(db, "PRAGMA application_id", &app)) != SQLITE_OK ||
        (rc = query_int(db, "PRAGMA user_version", &ver)) != SQLITE_OK)
        return qi_db_fail(db, rc, err, "reading the schema version");
    qi_status st = check_version(db, app, ver, err);
    if (st != QI_OK) return st;
    while (ver < QI_DB_N_MIGRATIONS) {
        if ((rc = qi_db_exec(db, "BEGIN IMMEDIATE")) != SQLITE_OK) return qi_db_fail(db, rc, err, "starting a migration");
        /* Another process may have upgraded the file while we waited. */
        if ((rc = query_int(db, "PRAGMA application_id", &app)) != SQLITE_OK ||
            (rc = query_int(db, "PRAGMA user_version", &ver)) != SQLITE_OK) {
            st = qi_db_fail(db, rc, err, "reading the schema version");
            goto rollback;
        }
        if ((st = check_version(db, app, ver, err)) != QI_OK) goto rollback;
        if (ver < QI_DB_N_MIGRATIONS) {
            const qi_db_migration *m = &qi_db_migrations[ver];
            char bump[96];
            snprintf(bump, sizeof bump, "PRAGMA application_id = %d; PRAGMA user_version = %d", QI_DB_APP_ID,
                     m->version);
            if ((rc = qi_db_exec(db, m->sql)) != SQLITE_OK || (rc = qi_db_exec(db, bump)) != SQLITE_OK) {
                st = qi_db_fail(db, rc, err, "applying migration %s", m->name);
                goto rollback;
            }
            ver = m->version;
        }
        if ((rc = qi_db_exec(db, "COMMIT")) != SQLITE_OK) {
            st = qi_db_fail(db, rc, err, "committing a migration");
            goto rollback;
        }
    }
    return QI_OK;
rollback:
    qi_db_exec(db, "ROLLBACK");
    return st;
}

static qi_status db_setup(qi_db *db, qi_err *err) {
    int rc;
    int64_t v;
    sqlite3_extended_result_codes(db->conn, 1);
    sqlite3_busy_timeout(db->conn, QI_DB_BUSY_MS);
    if (sqlite3_db_readonly(db->conn, "main") == 1)
        return QI_ERR(err, QI_ERR_IO, "%s: the file is read-only (results are written to it)", db->path);
    /* The first read of the file: fails here for a file that is not a database. */
    if ((rc = query_int(db, "SELECT count(*) FROM sqlite_master", &v)) != SQLITE_OK)
        return qi_db_fail(db, rc, err, "opening");
    if ((rc = qi_db_exec(db, "PRAGMA foreign_keys = ON")) != SQLITE_OK ||
        (rc = query_int(db, "PRAGMA foreign_keys", &v)) != SQLITE_OK)
        return qi_db_fail(db, rc, err, "enabling foreign keys");
    if (v != 1) return QI_ERR(err, QI_ERR_DB, "%s: this SQLite cannot enforce foreign keys", db->path);

    /* Set WAL only when it is not on yet: switching needs an exclusive lock,
     * which a reader opening the file during a run could not get. */
    sqlite3_stmt *s = NULL;
    char mode[16] = "";
    for (int pass = 0; pass < 2; pass++) {
        const char *sql = pass == 0 ? "PRAGMA journal_mode" : "PRAGMA journal_mode = WAL";
        if ((rc = sqlite3_prepare_v2(db->conn, sql, -1, &s, NULL)) != SQLITE_OK) break;
        rc = sqlite3_step(s);
        if (rc == SQLITE_ROW) {
            const unsigned char *t = sqlite3_column_text(s, 0);
            snprintf(mode, sizeof mode, "%s", t ? (const char *)t : "");
            rc = SQLITE_OK;
        }
        if (rc != SQLITE_OK) break;
        sqlite3_finalize(s);
        s = NULL;
        if (!strcmp(mode, "wal") || !strcmp(mode, "memory")) break; /* memory: ":memory:" databases */
    }
    if (rc != SQLITE_OK) {
        qi_status st = qi_db_fail(db, rc, err, "switching to WAL mode");
        sqlite3_finalize(s);
        return st;
    }
    if (strcmp(mode, "wal") != 0 && strcmp(mode, "memory") != 0)
        return QI_ERR(err, QI_ERR_DB, "%s: cannot use WAL mode (the journal stays '%s'; is it on a network file system?)",
                      db->path, mode);
    if ((rc = qi_db_exec(db, "PRAGMA synchronous = FULL")) != SQLITE_OK) return qi_db_fail(db, rc, err, "setting synchronous");
    return qi_db_migrate(db, err);
}

/* A handle holding a copy of the path, not yet connected. */
static qi_status db_alloc(const char *path, qi_db **out, qi_err *err) {
    qi_db *db = qi_calloc(1, sizeof *db);
    size_t n = strlen(path);
    char *copy = qi_malloc(n + 1);
    if (!db || !copy) {
        qi_free(db);
        qi_free(copy);
        return QI_ERR(err, QI_ERR_NOMEM, "%s: out of memory opening the results database", path);
    }
    memcpy(copy, path, n + 1);
    db->path = copy;
    *out = db;
    return QI_OK;
}

qi_status qi_db_open(const char *path, qi_db **out, qi_err *err) {
    if (out) *out = NULL;
    if (!path || !*path || !out) return QI_ERR(err, QI_ERR_INVALID, "results database: no file name given");
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode))
        return QI_ERR(err, QI_ERR_INVALID, "%s: is a directory, not a results database file", path);
    qi_db *db = NULL;
    qi_status st0 = db_alloc(path, &db, err);
    if (st0) return st0;
    int rc = sqlite3_open_v2(path, &db->conn, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL);
    qi_status st = rc == SQLITE_OK ? db_setup(db, err) : qi_db_fail(db, rc, err, "cannot open");
    if (st != QI_OK) {
        qi_db_close(db);
        return st;
    }
    *out = db;
    return QI_OK;
}

qi_status qi_db_open_read(const char *path, qi_db **out, qi_err *err) {
    if (out) *out = NULL;
    if (!path || !*path || !out) return QI_ERR(err, QI_ERR_INVALID, "results database: no file name given");
    struct stat sb;
    if (stat(path, &sb) != 0) return QI_ERR(err, QI_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    if (S_ISDIR(sb.st_mode))
        return QI_ERR(err, QI_ERR_INVALID, "%s: is a directory, not a results database file", path);
    qi_db *db = NULL;
    qi_status st0 = db_alloc(path, &db, err);
    if (st0) return st0;
    int rc = sqlite3_open_v2(path, &db->conn, SQLITE_OPEN_READONLY, NULL);
    qi_status st = QI_OK;
    int64_t app = 0, ver = 0, v;
    if (rc != SQLITE_OK) {
        st = qi_db_fail(db, rc, err, "cannot open");
    } else {
        sqlite3_extended_result_codes(db->conn, 1);
        sqlite3_busy_timeout(db->conn, QI_DB_BUSY_MS);
        if ((rc = query_int(db, "SELECT count(*) FROM sqlite_master", &v)) != SQLITE_OK ||
            (rc = query_int(db, "PRAGMA application_id", &app)) != SQLITE_OK ||
            (rc = query_int(db, "PRAGMA user_version", &ver)) != SQLITE_OK)
            st = qi_db_fail(db, rc, err, "opening");
        else if ((st = check_version(db, app, ver, err)) == QI_OK && ver == 0)
            st = QI_ERR(err, QI_ERR_DB, "%s: not a qinfer results database (it holds no schema)", path);
        /* An older schema is read as the current one: before version 3 the
         * metrics lack params and carry the old names, so a temporary view
         * (the temp schema is writable on a read-only connection, and is
         * searched before main) shows them as migration 0003 maps them. The
         * unit tests hold the view to the migration. */
        else if (st == QI_OK && ver < 3 &&
                 (rc = qi_db_exec(db, "CREATE TEMP VIEW metrics AS SELECT id, run_id,"
                                      " CASE WHEN name GLOB 'decode.b[0-9]*_tokens_per_s' THEN 'decode.tokens_per_s'"
                                      " WHEN name GLOB 'prefill.b[0-9]*_ttft_s' THEN 'prefill.ttft_s'"
                                      " WHEN name = 'prefill.ttft_ms' THEN 'prefill.ttft_s'"
                                      " WHEN name = 'decode.tpot_ms' THEN 'decode.tpot_s' ELSE name END AS name,"
                                      " CASE WHEN name IN ('prefill.ttft_ms', 'decode.tpot_ms') THEN value / 1000"
                                      " ELSE value END AS value,"
                                      " CASE WHEN name IN ('prefill.ttft_ms', 'decode.tpot_ms') THEN 's'"
                                      " ELSE unit END AS unit, repetition, simulated,"
                                      " CASE WHEN name GLOB 'decode.b[0-9]*_tokens_per_s'"
                                      " OR name GLOB 'prefill.b[0-9]*_ttft_s' THEN json_object('batch',"
                                      " CAST(substr(name, instr(name, '.b') + 2, instr(name, '_') - instr(name, '.b')"
                                      " - 2) AS INTEGER)) ELSE '{}' END AS params FROM main.metrics")) != SQLITE_OK)
            st = qi_db_fail(db, rc, err, "reading schema version %lld", (long long)ver);
    }
    if (st != QI_OK) {
        qi_db_close(db);
        return st;
    }
    *out = db;
    return QI_OK;
}

/* dir + "/" + name (characters outside [A-Za-z0-9_.-] replaced by '_') +
 * suffix into buf; a long name is cut, never the suffix. */
static void db_path_join(const char *dir, const char *name, const char *suffix, char *buf, size_t n) {
    static const char ok[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.";
    if (n == 0) return;
    size_t j = 0, ns = strlen(suffix);
    for (const char *c = dir; *c && j + 1 < n; c++) buf[j++] = *c;
    if (j > 0 && buf[j - 1] != '/' && j + 1 < n) buf[j++] = '/';
    size_t stop = n > ns + 1 ? n - ns - 1 : 0;
    for (const char *c = name ? name : ""; *c && j < stop; c++) buf[j++] = strchr(ok, *c) ? *c : '_';
    for (const char *c = suffix; *c && j + 1 < n; c++) buf[j++] = *c;
    buf[j] = 0;
}

void qi_db_default_path(const char *name, char *buf, size_t n) { db_path_join("results", name, ".db", buf, n); }

void qi_db_shard_path(const char *dir, const char *name, int shard_index, int shard_count, char *buf, size_t n) {
    char suffix[64];
    snprintf(suffix, sizeof suffix, ".shard-%d-of-%d.db", shard_index, shard_count);
    db_path_join(dir && *dir ? dir : ".", name, suffix, buf, n);
}

void qi_db_close(qi_db *db) {
    if (!db) return;
    sqlite3_finalize(db->ins_metric);
    if (db->conn && !sqlite3_get_autocommit(db->conn)) qi_db_exec(db, "ROLLBACK");
    sqlite3_close(db->conn);
    qi_free(db->path);
    qi_free(db);
}

void qi_db_busy_timeout(qi_db *db, int ms) {
    if (db) sqlite3_busy_timeout(db->conn, ms);
}

/* ---- experiments ----------------------------------------------------------------- */

static void bind_text_or_null(sqlite3_stmt *s, int i, const char *v) {
    if (v) sqlite3_bind_text(s, i, v, -1, SQLITE_TRANSIENT);
    else sqlite3_bind_null(s, i);
}

qi_status qi_db_experiment(qi_db *db, const char *name, const char *script_path, const char *script_sha256,
                           int64_t *id, qi_err *err) {
    if (id) *id = 0;
    if (!db || !id) return QI_ERR(err, QI_ERR_INVALID, "qi_db_experiment: no database or id");
    if (!name || !*name) return QI_ERR(err, QI_ERR_INVALID, "%s: an experiment needs a name", db->path);
    static const char sql[] =
        "INSERT INTO experiments (name, script_path, script_sha256) VALUES (?1, ?2, ?3)"
        " ON CONFLICT (name) DO UPDATE SET script_path = coalesce(excluded.script_path, script_path),"
        " script_sha256 = coalesce(excluded.script_sha256, script_sha256)"
        " RETURNING id";
    sqlite3_stmt *s = NULL;
    int rc = sqlite3_prepare_v2(db->conn, sql, -1, &s, NULL);
    if (rc == SQLITE_OK) {
        bind_text_or_null(s, 1, name);
        bind_text_or_null(s, 2, script_path);
        bind_text_or_null(s, 3, script_sha256);
        rc = sqlite3_step(s);
        if (rc == SQLITE_ROW) {
            *id = sqlite3_column_int64(s, 0);
            rc = SQLITE_OK;
        }
    }
    qi_status st = rc == SQLITE_OK ? QI_OK : qi_db_fail(db, rc, err, "recording experiment '%s'", name);
    sqlite3_finalize(s);
    return st;
}

qi_status qi_db_experiment_find(qi_db *db, const char *name, int64_t *id, qi_err *err) {
    if (id) *id = 0;
    if (!db || !id || !name) return QI_ERR(err, QI_ERR_INVALID, "qi_db_experiment_find: missing argument");
    sqlite3_stmt *s = NULL;
    int rc = sqlite3_prepare_v2(db->conn, "SELECT id FROM experiments WHERE name = ?1", -1, &s, NULL);
    if (rc == SQLITE_OK) {
        sqlite3_bind_text(s, 1, name, -1, SQLITE_TRANSIENT);
        rc = sqlite3_step(s);
        if (rc == SQLITE_ROW) *id = sqlite3_column_int64(s, 0);
        if (rc == SQLITE_ROW || rc == SQLITE_DONE) rc = SQLITE_OK;
    }
    qi_status st = rc == SQLITE_OK ? QI_OK : qi_db_fail(db, rc, err, "looking up experiment '%s'", name);
    sqlite3_finalize(s);
    return st;
}

/* ---- configurations ----------------------------------------------------------------- */

qi_status qi_db_config_key(const char *config_json, char out[65], qi_err *err) {
    out[0] = 0;
    char *canon = NULL;
    size_t n = 0;
    qi_status st = qi_json_canonical(config_json, &canon, &n, err);
    if (st != QI_OK) return st;
    qi_sha256 h;
    qi_sha256_init(&h);
    qi_sha256_update(&h, canon, n);
    qi_sha256_final(&h, out);
    qi_free(canon);
    return QI_OK;
}

qi_status qi_db_run_done(qi_db *db, int64_t exp_id, const char *config_key, bool *done, qi_err *err) {
    if (done) *done = false;
    if (!db || !done || !config_key) return QI_ERR(err, QI_ERR_INVALID, "qi_db_run_done: missing argument");
    sqlite3_stmt *s = NULL;
    int rc = sqlite3_prepare_v2(
        db->conn, "SELECT 1 FROM runs WHERE experiment_id = ?1 AND config_key = ?2 AND status = 'done'", -1, &s,
        NULL);
    if (rc == SQLITE_OK) {
        sqlite3_bind_int64(s, 1, exp_id);
        sqlite3_bind_text(s, 2, config_key, -1, SQLITE_TRANSIENT);
        rc = sqlite3_step(s);
        if (rc == SQLITE_ROW) *done = true;
        if (rc == SQLITE_ROW || rc == SQLITE_DONE) rc = SQLITE_OK;
    }
    qi_status st = rc == SQLITE_OK ? QI_OK : qi_db_fail(db, rc, err, "looking up configuration %s", config_key);
    sqlite3_finalize(s);
    return st;
}

/* ---- runs ------------------------------------------------------------------------- */

/* After a failed statement inside a run: SQLite rolls the whole transaction
 * back on some errors (I/O, full disk, out of memory). Then the run is gone,
 * and the handle must say so rather than COMMIT nothing later. */
static void check_run_lost(qi_db *db, qi_err *err) {
    if (db->run_id && sqlite3_get_autocommit(db->conn)) {
        qi_err_prefix(err, "run %lld was rolled back", (long long)db->run_id);
        db->run_id = 0;
    }
}

qi_status qi_db_run_begin(qi_db *db, int64_t exp_id, const char *config_json, const char *config_key,
                          const qi_db_run_info *info, int64_t *run_id, qi_err *err) {
    if (run_id) *run_id = 0;
    if (!db || !run_id || !config_json) return QI_ERR(err, QI_ERR_INVALID, "qi_db_run_begin: missing argument");
    if (db->run_id)
        return QI_ERR(err, QI_ERR_INVALID, "%s: run %lld is still open; end it before beginning another", db->path,
                      (long long)db->run_id);
    static const qi_db_run_info none = {.git_dirty = -1};
    if (!info) info = &none;
    if (config_key && !*config_key) return QI_ERR(err, QI_ERR_INVALID, "%s: empty configuration key", db->path);

    char *canon = NULL;
    size_t canon_len = 0;
    qi_status st = qi_json_canonical(config_json, &canon, &canon_len, err);
    if (st != QI_OK) return st;
    char key[65];
    if (!config_key) {
        qi_sha256 h;
        qi_sha256_init(&h);
        qi_sha256_update(&h, canon, canon_len);
        qi_sha256_final(&h, key);
        config_key = key;
    }

    sqlite3_stmt *s = NULL;
    int rc = qi_db_exec(db, "BEGIN IMMEDIATE");
    if (rc != SQLITE_OK) {
        st = qi_db_fail(db, rc, err, "beginning a run");
        qi_free(canon);
        return st;
    }
    /* The experiment must exist (a clearer message than the foreign key's). */
    rc = sqlite3_prepare_v2(db->conn, "SELECT count(*) FROM experiments WHERE id = ?1", -1, &s, NULL);
    if (rc != SQLITE_OK) goto sql_fail;
    sqlite3_bind_int64(s, 1, exp_id);
    if ((rc = sqlite3_step(s)) != SQLITE_ROW) goto sql_fail;
    if (sqlite3_column_int64(s, 0) == 0) {
        st = QI_ERR(err, QI_ERR_INVALID, "%s: no experiment with id %lld", db->path, (long long)exp_id);
        goto fail;
    }
    sqlite3_finalize(s);

    /* The row a previous attempt left: redone unless done (and not fresh). */
    rc = sqlite3_prepare_v2(db->conn, "SELECT id, status FROM runs WHERE experiment_id = ?1 AND config_key = ?2", -1,
                            &s, NULL);
    if (rc != SQLITE_OK) goto sql_fail;
    sqlite3_bind_int64(s, 1, exp_id);
    sqlite3_bind_text(s, 2, config_key, -1, SQLITE_TRANSIENT);
    rc = sqlite3_step(s);
    if (rc == SQLITE_ROW) {
        int64_t old = sqlite3_column_int64(s, 0);
        const unsigned char *status = sqlite3_column_text(s, 1);
        if (status && !strcmp((const char *)status, "done") && !info->fresh) {
            st = QI_ERR(err, QI_ERR_INVALID,
                        "%s: configuration %s is already done (run %lld); skip it, or redo it as a fresh run",
                        db->path, config_key, (long long)old);
            goto fail;
        }
        sqlite3_finalize(s);
        rc = sqlite3_prepare_v2(db->conn, "DELETE FROM runs WHERE id = ?1", -1, &s, NULL);
        if (rc != SQLITE_OK) goto sql_fail;
        sqlite3_bind_int64(s, 1, old);
        if ((rc = sqlite3_step(s)) != SQLITE_DONE) goto sql_fail;
    } else if (rc != SQLITE_DONE) {
        goto sql_fail;
    }
    sqlite3_finalize(s);

    static const char ins[] =
        "INSERT INTO runs (experiment_id, config_json, config_key, status, git_rev, git_dirty, cpu, cores,"
        " mem_bytes, gpu, gpu_driver, model_path, model_sha256, engine_version, seed, simulated, started)"
        " VALUES (?1, ?2, ?3, 'running', ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, " NOW_SQL ")"
        " RETURNING id";
    rc = sqlite3_prepare_v2(db->conn, ins, -1, &s, NULL);
    if (rc != SQLITE_OK) goto sql_fail;
    sqlite3_bind_int64(s, 1, exp_id);
    sqlite3_bind_text(s, 2, canon, (int)canon_len, SQLITE_STATIC);
    sqlite3_bind_text(s, 3, config_key, -1, SQLITE_TRANSIENT);
    bind_text_or_null(s, 4, info->git_rev);
    if (info->git_dirty == 0 || info->git_dirty == 1) sqlite3_bind_int(s, 5, info->git_dirty);
    else sqlite3_bind_null(s, 5);
    bind_text_or_null(s, 6, info->cpu);
    if (info->cores > 0) sqlite3_bind_int(s, 7, info->cores);
    else sqlite3_bind_null(s, 7);
    if (info->mem_bytes > 0) sqlite3_bind_int64(s, 8, (sqlite3_int64)info->mem_bytes);
    else sqlite3_bind_null(s, 8);
    bind_text_or_null(s, 9, info->gpu);
    bind_text_or_null(s, 10, info->gpu_driver);
    bind_text_or_null(s, 11, info->model_path);
    bind_text_or_null(s, 12, info->model_sha256);
    bind_text_or_null(s, 13, info->engine_version);
    if (info->has_seed) sqlite3_bind_int64(s, 14, (sqlite3_int64)info->seed);
    else sqlite3_bind_null(s, 14);
    sqlite3_bind_int(s, 15, info->simulated ? 1 : 0);
    if ((rc = sqlite3_step(s)) != SQLITE_ROW) goto sql_fail;
    *run_id = sqlite3_column_int64(s, 0);
    sqlite3_finalize(s);
    qi_free(canon);
    db->run_id = *run_id;
    db->run_simulated = info->simulated;
    return QI_OK;

sql_fail:
    st = qi_db_fail(db, rc, err, "beginning a run of configuration %s", config_key);
fail:
    sqlite3_finalize(s);
    qi_db_exec(db, "ROLLBACK");
    qi_free(canon);
    *run_id = 0;
    return st;
}

qi_status qi_db_run_placement(qi_db *db, int64_t run_id, const char *plan_json, qi_err *err) {
    if (!db->run_id || run_id != db->run_id)
        return QI_ERR(err, QI_ERR_INVALID, "placement for run %lld, which is not the open run", (long long)run_id);
    sqlite3_stmt *s = NULL;
    int rc = sqlite3_prepare_v2(db->conn,
                                "UPDATE runs SET placement = CASE WHEN json_valid(?1) THEN ?1 END WHERE id = ?2"
                                " RETURNING placement IS NOT NULL",
                                -1, &s, NULL);
    if (rc == SQLITE_OK) {
        sqlite3_bind_text(s, 1, plan_json, -1, SQLITE_TRANSIENT);
        sqlite3_bind_int64(s, 2, run_id);
        rc = sqlite3_step(s);
    }
    const bool valid = rc == SQLITE_ROW && sqlite3_column_int(s, 0);
    if (rc == SQLITE_ROW) rc = sqlite3_step(s);
    sqlite3_finalize(s);
    if (rc != SQLITE_DONE) return qi_db_fail(db, rc, err, "recording the placement of run %lld", (long long)run_id);
    if (!valid) return QI_ERR(err, QI_ERR_INVALID, "placement of run %lld is not JSON", (long long)run_id);
    return QI_OK;
}

/* area.what_unit: lower-case letters, digits, '_'; a letter first; two or
 * more non-empty parts joined by '.'. */
static bool metric_name_ok(const char *s) {
    if (!s || !(*s >= 'a' && *s <= 'z') || strlen(s) > 128) return false;
    int parts = 1;
    size_t run = 0;
    for (; *s; s++) {
        if (*s == '.') {
            if (run == 0) return false;
            parts++;
            run = 0;
        } else if ((*s >= 'a' && *s <= 'z') || (*s >= '0' && *s <= '9') || *s == '_') {
            run++;
        } else {
            return false;
        }
    }
    return run > 0 && parts >= 2;
}

static qi_status check_open_run(const qi_db *db, int64_t run_id, const char *fn, qi_err *err) {
    if (!db) return QI_ERR(err, QI_ERR_INVALID, "%s: no database", fn);
    if (!db->run_id) return QI_ERR(err, QI_ERR_INVALID, "%s: %s: no run is open", db->path, fn);
    if (run_id != db->run_id)
        return QI_ERR(err, QI_ERR_INVALID, "%s: %s: run %lld is not the open run (%lld)", db->path, fn,
                      (long long)run_id, (long long)db->run_id);
    return QI_OK;
}

qi_status qi_db_metric(qi_db *db, int64_t run_id, const char *name, double value, const char *unit,
                       int repetition, bool simulated, qi_err *err) {
    return qi_db_metric_params(db, run_id, name, NULL, value, unit, repetition, simulated, err);
}

qi_status qi_db_metric_params(qi_db *db, int64_t run_id, const char *name, const char *params_json, double value,
                              const char *unit, int repetition, bool simulated, qi_err *err) {
    qi_status st = check_open_run(db, run_id, "qi_db_metric", err);
    if (st != QI_OK) return st;
    if (!metric_name_ok(name))
        return QI_ERR(err, QI_ERR_INVALID,
                      "metric name '%s' is not area.what_unit (lower-case letters, digits, '_', parts joined by '.')",
                      name ? name : "(null)");
    if (!unit || !*unit)
        return QI_ERR(err, QI_ERR_INVALID, "metric %s: no unit (use \"1\" for a pure number)", name);
    if (repetition < 0) return QI_ERR(err, QI_ERR_INVALID, "metric %s: repetition %d < 0", name, repetition);
    if (isnan(value)) return QI_ERR(err, QI_ERR_INVALID, "metric %s: value is NaN", name);
    char *params = NULL;
    if (params_json) {
        size_t plen;
        if ((st = qi_json_canonical(params_json, &params, &plen, err))) {
            qi_err_prefix(err, "metric %s: params", name);
            return st;
        }
        if (params[0] != '{') {
            qi_free(params);
            return QI_ERR(err, QI_ERR_INVALID, "metric %s: params %s is not a JSON object", name, params_json);
        }
    }
    int rc = SQLITE_OK;
    if (!db->ins_metric)
        rc = sqlite3_prepare_v3(db->conn,
                                "INSERT INTO metrics (run_id, name, value, unit, repetition, simulated, params)"
                                " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                                -1, SQLITE_PREPARE_PERSISTENT, &db->ins_metric, NULL);
    if (rc == SQLITE_OK) {
        sqlite3_stmt *s = db->ins_metric;
        sqlite3_bind_int64(s, 1, run_id);
        sqlite3_bind_text(s, 2, name, -1, SQLITE_TRANSIENT);
        sqlite3_bind_double(s, 3, value);
        sqlite3_bind_text(s, 4, unit, -1, SQLITE_TRANSIENT);
        sqlite3_bind_int(s, 5, repetition);
        sqlite3_bind_int(s, 6, simulated || db->run_simulated ? 1 : 0);
        sqlite3_bind_text(s, 7, params ? params : "{}", -1, SQLITE_TRANSIENT);
        rc = sqlite3_step(s);
        if (rc == SQLITE_DONE) rc = SQLITE_OK;
    }
    if (rc == SQLITE_OK) {
        sqlite3_reset(db->ins_metric);
        qi_free(params);
        return QI_OK;
    }
    if (rc == SQLITE_CONSTRAINT_UNIQUE)
        st = QI_ERR(err, QI_ERR_INVALID, "%s: metric %s%s repetition %d recorded twice in run %lld", db->path, name,
                    params ? params : "", repetition, (long long)run_id);
    else
        st = qi_db_fail(db, rc, err, "recording metric %s of run %lld", name, (long long)run_id);
    qi_free(params);
    if (db->ins_metric) sqlite3_reset(db->ins_metric);
    check_run_lost(db, err);
    return st;
}

qi_status qi_db_run_end(qi_db *db, int64_t run_id, bool ok, const char *error_msg, qi_err *err) {
    qi_status st = check_open_run(db, run_id, "qi_db_run_end", err);
    if (st != QI_OK) return st;
    static const char sql[] =
        "UPDATE runs SET status = ?2, error = ?3, finished = " NOW_SQL ","
        " simulated = simulated OR EXISTS (SELECT 1 FROM metrics WHERE run_id = ?1 AND simulated)"
        " WHERE id = ?1";
    sqlite3_stmt *s = NULL;
    int rc = sqlite3_prepare_v2(db->conn, sql, -1, &s, NULL);
    if (rc == SQLITE_OK) {
        sqlite3_bind_int64(s, 1, run_id);
        sqlite3_bind_text(s, 2, ok ? "done" : "failed", -1, SQLITE_STATIC);
        bind_text_or_null(s, 3, ok ? NULL : error_msg);
        rc = sqlite3_step(s);
        if (rc == SQLITE_DONE) rc = SQLITE_OK;
    }
    if (rc == SQLITE_OK) {
        sqlite3_finalize(s);
        s = NULL;
        rc = qi_db_exec(db, "COMMIT");
    }
    if (rc != SQLITE_OK) {
        st = qi_db_fail(db, rc, err, "ending run %lld (the run is not stored)", (long long)run_id);
        sqlite3_finalize(s);
        qi_db_exec(db, "ROLLBACK");
    }
    db->run_id = 0;
    db->run_simulated = false;
    return st;
}

/* db_int.h - what the results database's source files share (db.c: open,
 * migrations, runs; db_query.c: listing and export). Private. */
#ifndef QI_HARNESS_DB_INT_H
#define QI_HARNESS_DB_INT_H

#include <sqlite3.h>

#include "db.h"

struct qi_db {
    sqlite3 *conn;
    char *path;
    int64_t run_id;     /* the open run; 0 when none */
    bool run_simulated; /* the open run was begun as simulated */
    sqlite3_stmt *ins_metric;
};

/* Convert SQLite's failure `rc` into a status and message: "PATH: what:
 * SQLite's message[: OS error][ (hint)]". Call it right after the failing
 * call, before anything else touches the connection. */
qi_status qi_db_fail(const qi_db *db, int rc, qi_err *err, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;

/* Bring db's "main" to this build's schema version, creating the schema
 * in an empty database (db.c; db_merge.c checks inputs against it). */
qi_status qi_db_migrate(qi_db *db, qi_err *err);

/* How a metric is shown and selected (`qinfer results --metric`, the CSV
 * export): its name, then its params, if any, as [key=value,...]:
 * decode.tokens_per_s[batch=4]. M is the metrics table's alias. */
#define QI_DB_METRIC_LABEL(M)                                                                                    \
    M ".name || coalesce('[' || (SELECT group_concat(key || '=' || value, ',') FROM json_each(" M ".params)) " \
      "|| ']', '')"

static inline int qi_db_exec(qi_db *db, const char *sql) { return sqlite3_exec(db->conn, sql, NULL, NULL, NULL); }

#endif

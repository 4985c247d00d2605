/* db_test.h - the parts of test_db (see test_db.c): what util.c shares and
 * what each part adds to the suite. */
#ifndef QI_DB_TEST_H
#define QI_DB_TEST_H

#include <check.h>
#include <errno.h>
#include <dirent.h>
#include <math.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness/db.h"
#include "harness/json.h"
#include "sha256.h"
#include "testutil.h"

typedef struct {
    char dir[64];
    char path[128]; /* dir/results.db */
} tmp_db;

/* util.c */
void tmp_init(tmp_db *t);
void tmp_fini(tmp_db *t);
qi_db *open_ok(const char *path);
sqlite3 *raw_open(const char *path);
int64_t sql_int(sqlite3 *c, const char *sql);
const char *sql_text(sqlite3 *c, const char *sql, char *buf, size_t n);
int64_t path_int(const char *path, const char *sql);
void sha_hex(const char *s, char hex[65]);
int64_t begin_ok(qi_db *db, int64_t exp, const char *json, const qi_db_run_info *info);
void metric_ok(qi_db *db, int64_t run, const char *name, double v, const char *unit, int rep, bool sim);
void end_ok(qi_db *db, int64_t run, bool ok, const char *msg);
int64_t exp_ok(qi_db *db, const char *name);
bool is_done(qi_db *db, int64_t exp, const char *json);
void write_file(const char *path, const void *data, size_t n);

void db_schema_add(TCase *tc); /* the schema and its migrations; experiments and runs: the lifecycle, resume rules, misuse. */
void db_crash_add(TCase *tc); /* a run killed mid-way, readers during a run, CSV export, summary statistics and metric names. */
void db_hostile_add(TCase *tc); /* hostile files and paths, canonical JSON and keys, the machine and checkout facts, allocation failures. */

#endif

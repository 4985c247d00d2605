/* fz_merge.c - libFuzzer target: `qinfer results merge` (qi_db_merge) of a
 * hostile results database into a good one.
 *
 * Each input is written as the one input database; the output is a fresh
 * copy of a results database holding one experiment, a done run and a
 * failed run (made once with the harness's own writer, in the WAL mode it
 * leaves databases in; test_db_merge holds a refusal into one in another
 * mode to the same rules). Checked: a
 * refusal has a message and leaves the output byte for byte as it was,
 * with no journal, WAL or shared-memory file beside it; an accepted merge leaves an output
 * that opens as a results database, and merging the same input again adds
 * nothing (inputs merged twice count once).
 *
 * QI_FZ_WRITE_SEEDS=DIR: write seed inputs (results databases of several
 * shapes, in 512-byte pages to stay small) into DIR and exit.
 */
#include <sqlite3.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "db.h"
#include "fz.h"

static void must(qi_status st, const qi_err *e, const char *what) {
    if (st) {
        fprintf(stderr, "fuzz: %s: %s\n", what, e->msg);
        abort();
    }
}

/* A results database at path as the harness writes it (WAL mode):
 * experiment `name` with runs of the given configurations (done unless
 * failed[i]), each with metrics; small (512-byte pages, no WAL) when
 * `small`, as the seeds are. */
static void make_db(const char *path, const char *name, const char *sha, const char *const *configs,
                    const bool *failed, int n, bool small) {
    qi_db *db = NULL;
    qi_err e = {0};
    int64_t exp = 0, run = 0;
    unlink(path);
    must(qi_db_open(path, &db, &e), &e, "open");
    must(qi_db_experiment(db, name, "fuzz.lua", sha, &exp, &e), &e, "experiment");
    for (int i = 0; i < n; i++) {
        must(qi_db_run_begin(db, exp, configs[i], NULL, NULL, &run, &e), &e, "run");
        must(qi_db_metric(db, run, "ppl.value", 1.5 + i, "1", 0, false, &e), &e, "metric");
        must(qi_db_metric_params(db, run, "tps.decode", "{\"batch\":4}", 10.0 * i, "tok/s", 0, true, &e), &e,
             "metric");
        must(qi_db_run_placement(db, run, "{\"devices\":[\"cpu\"],\"embd\":0,\"head\":0,\"layers\":[[0,0]]}", &e),
             &e, "placement");
        must(qi_db_run_end(db, run, !failed[i], failed[i] ? "it failed" : NULL, &e), &e, "end");
    }
    qi_db_close(db);
    if (!small) return;
    sqlite3 *c = NULL;
    if (sqlite3_open(path, &c) != SQLITE_OK ||
        sqlite3_exec(c, "PRAGMA journal_mode=DELETE; PRAGMA page_size=512; VACUUM;", NULL, NULL, NULL) != SQLITE_OK) {
        fprintf(stderr, "fuzz: vacuum: %s\n", sqlite3_errmsg(c));
        abort();
    }
    sqlite3_close(c);
}

static unsigned char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc(len > 0 ? (size_t)len : 1);
    if (!b || fread(b, 1, (size_t)len, f) != (size_t)len) abort();
    fclose(f);
    *n = (size_t)len;
    return b;
}

static bool exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

static const char *const k_cfg_out[] = {"{\"a\":1}", "{\"a\":2}"};
static const bool k_failed_out[] = {false, true};

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    const char *seeds = getenv("QI_FZ_WRITE_SEEDS");
    if (!seeds) return 0;
    static const char *const cfg_a[] = {"{\"a\":2}", "{\"a\":3,\"b\":[1,2.5,\"x\"]}"};
    static const bool failed_a[] = {false, false};
    static const char *const cfg_b[] = {"{\"a\":1}"};
    static const bool failed_b[] = {true};
    char path[4200];
    snprintf(path, sizeof path, "%s/same-experiment.db", seeds);
    make_db(path, "fuzz", "0123", cfg_a, failed_a, 2, true);
    snprintf(path, sizeof path, "%s/failed-run.db", seeds);
    make_db(path, "fuzz", "0123", cfg_b, failed_b, 1, true);
    snprintf(path, sizeof path, "%s/other-script.db", seeds);
    make_db(path, "fuzz", "4567", cfg_b, failed_b, 1, true);
    snprintf(path, sizeof path, "%s/other-experiment.db", seeds);
    make_db(path, "other", NULL, cfg_a, failed_a, 2, true);
    exit(0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static unsigned char *tmpl;
    static size_t n_tmpl;
    char in[4200], out[4200], side[4300];
    fz_path(in, sizeof in, "in.db");
    fz_path(out, sizeof out, "out.db");
    if (!tmpl) {
        make_db(out, "fuzz", "0123", k_cfg_out, k_failed_out, 2, false);
        tmpl = slurp(out, &n_tmpl);
        FZ_CHECK(tmpl != NULL, "no template database");
    }
    fz_write(in, data, size);
    fz_write(out, tmpl, n_tmpl);
    static const char *const sfx[] = {"-journal", "-wal", "-shm"};
    for (int i = 0; i < 6; i++) { /* what an earlier input's merge left beside either file */
        snprintf(side, sizeof side, "%s%s", i < 3 ? in : out, sfx[i % 3]);
        unlink(side);
    }
    const char *ins[1] = {in};
    qi_db_merge_stats ms = {0};
    qi_err e = {0};
    if (qi_db_merge(out, ins, 1, &ms, &e) != QI_OK) {
        FZ_CHECK(e.msg[0], "a refusal without a message");
        fz_note("refused: %s", e.msg);
        size_t n = 0;
        unsigned char *now = slurp(out, &n);
        FZ_CHECK(now && n == n_tmpl && memcmp(now, tmpl, n) == 0, "a refused merge changed the output (%s)", e.msg);
        free(now);
        /* no journal, WAL or shared-memory file beside it */
        for (int i = 0; i < 3; i++) {
            snprintf(side, sizeof side, "%s%s", out, sfx[i]);
            FZ_CHECK(!exists(side), "a refused merge left %s (%s)", side, e.msg);
        }
        return 0;
    }
    FZ_CHECK(ms.n_added <= ms.n_runs && ms.n_replaced <= ms.n_added, "stats %lld runs, %lld added, %lld replaced",
             (long long)ms.n_runs, (long long)ms.n_added, (long long)ms.n_replaced);
    fz_note("merged: %lld runs, %lld added, %lld replaced", (long long)ms.n_runs, (long long)ms.n_added,
            (long long)ms.n_replaced);
    qi_db *db = NULL;
    FZ_CHECK(qi_db_open_read(out, &db, &e) == QI_OK, "the merged output does not open: %s", e.msg);
    qi_db_close(db);
    qi_db_merge_stats again = {0};
    FZ_CHECK(qi_db_merge(out, ins, 1, &again, &e) == QI_OK, "merging the same input again fails: %s", e.msg);
    FZ_CHECK(again.n_added == 0, "merging the same input again added %lld runs", (long long)again.n_added);
    return 0;
}

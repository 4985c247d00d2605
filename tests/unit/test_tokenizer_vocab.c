/* test_tokenizer_vocab.c - the tokenizers against llama.cpp's own vocabulary
 * test suite, and against llama.cpp on strings.tsv with the same vocabularies
 * (label golden).
 *
 * llama.cpp ships, in models/ of its source tree, vocabulary-only GGUF files
 * (ggml-vocab-NAME.gguf: tokenizer metadata, no tensors) and, for most of
 * them, NAME.gguf.inp (texts separated by lines "__ggml_vocab_test__") and
 * NAME.gguf.out (the ids llama.cpp gives each text, one line per text), which
 * its tests/test-tokenizer-0 checks. This program does the same with qinfer's
 * tokenizer, vocabulary by vocabulary, with test-tokenizer-0's conventions:
 * the .inp file is split at "\n__ggml_vocab_test__\n" (so a text keeps its
 * own line breaks, and the last one runs to the end of the file), expected
 * lines are stripped of surrounding white space, and every text is tokenised
 * without BOS/EOS and without parsing special-token text. It also checks the
 * round trip qi_detokenize(qi_tokenize(text)) == text for every such text,
 * except on the vocabularies of no_roundtrip below.
 *
 * The suite's texts are few (46 to 50 per vocabulary) and some pre-tokenizer
 * differences do not show in them (qwen35's marks-with-letters rule, for
 * one). So each vocabulary is also run on the 613 lines of
 * tests/golden/strings.tsv, with their add_special and parse_special, against
 * llama.cpp's ids for them recorded in tests/golden/vocab/NAME.tsv
 * (record_vocab.sh), provided the file is the one recorded (its sha256).
 *
 * The GGUF files come from the llama-cpp-python sdist that tests/golden/
 * build_llama.sh downloads and extracts (its --sources-only option stops
 * there): $QI_LLAMA_MODELS, else
 * $QINFER_CACHE/llama.cpp/llama_cpp_python-0.3.36/vendor/llama.cpp/models.
 * Without that folder the test is skipped (exit 77) with the reason. Each
 * vocabulary is reported as passed (every text of both parts that it has
 * exact, and the round trips), FAILED (with the first mismatches) or skipped
 * with its reason (neither part available); any failure fails the test
 * (exit 1).
 *
 *   test_tokenizer_vocab [-v] [NAME...]   # only these vocabularies; -v: every text
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "qinfer/tokenizer.h"
#include "sha256.h"
#include "testutil.h"

#define SDIST_MODELS "llama.cpp/llama_cpp_python-0.3.36/vendor/llama.cpp/models"
#define SEP "\n__ggml_vocab_test__\n"
#define STRINGS QI_SOURCE_DIR "/tests/golden/strings.tsv"
#define VOCAB_GOLDEN QI_SOURCE_DIR "/tests/golden/vocab"
#define MAX_SHOWN 3 /* mismatches printed per vocabulary */

/* Vocabularies whose text does not come back from decode(encode(text)), and
 * why; every other one must give every input back exactly. */
static const struct {
    const char *name, *why;
} no_roundtrip[] = {
    {"bert-bge", "WordPiece lowercases, strips accents and drops white space"},
};

/* The vocabularies the suite had when this was written: each must be there
 * (a missing one is reported skipped); any other ggml-vocab-*.gguf found is
 * tested too. */
static const char *const known[] = {"bert-bge", "command-r", "deepseek-coder", "deepseek-llm",
                                    "falcon", "gemma-4", "gpt-2", "llama-bpe", "llama-spm",
                                    "mpt", "phi-3", "qwen2", "qwen35", "refact", "starcoder"};

static const char *models_dir(void) {
    static char buf[1024];
    const char *e = getenv("QI_LLAMA_MODELS");
    if (e && *e) return e;
    snprintf(buf, sizeof buf, "%s/%s", qi_test_cache_dir(), SDIST_MODELS);
    return buf;
}

static bool exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

static const char *roundtrip_why_not(const char *name) {
    for (size_t i = 0; i < sizeof no_roundtrip / sizeof no_roundtrip[0]; i++)
        if (strcmp(no_roundtrip[i].name, name) == 0) return no_roundtrip[i].why;
    return NULL;
}

/* Print bytes with C escapes for anything not printable ASCII. */
static void show(FILE *f, const char *s, size_t n) {
    fputc('\'', f);
    for (size_t i = 0; i < n && i < 120; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c < 0x7F && c != '\\') fputc(c, f);
        else if (c == '\n') fputs("\\n", f);
        else fprintf(f, "\\x%02x", c);
    }
    fputs(n > 120 ? "'..." : "'", f);
}

static void show_ids(FILE *f, const int32_t *ids, size_t n) {
    for (size_t i = 0; i < n && i < 40; i++) fprintf(f, "%s%d", i ? " " : "", ids[i]);
    if (n > 40) fputs(" ...", f);
}

/* First occurrence of needle (NUL-terminated) in hay[0..n), or NULL. */
static const char *find(const char *hay, size_t n, const char *needle) {
    size_t m = strlen(needle);
    for (size_t i = 0; i + m <= n; i++)
        if (memcmp(hay + i, needle, m) == 0) return hay + i;
    return NULL;
}

typedef struct {
    int n_text, n_exact, n_rt, n_rt_ok; /* the suite's texts */
    int n_str, n_str_exact;             /* strings.tsv's lines */
} result;

/* What one vocabulary's checks share. */
typedef struct {
    const qi_tokenizer *t;
    const char *name;
    bool verbose;
    int shown; /* failures printed so far */
    result *r;
} run;

static bool report(run *u) {
    return u->shown++ < MAX_SHOWN;
}

/* Compare one text's ids with want[0..nw); with rt, also its round trip.
 * Counts into *exact and, with rt, the round-trip counters; prints the first
 * few failures (every text with verbose). Returns whether all held. */
static bool check_text(run *u, const char *text, size_t len, bool add_special,
                       bool parse_special, const int32_t *want, size_t nw, bool rt, int *exact) {
    qi_err err = {0};
    int32_t *ids = NULL;
    size_t n = 0;
    if (qi_tokenize(u->t, text, len, add_special, parse_special, &ids, &n, &err)) {
        if (report(u)) {
            fprintf(stderr, "  %s: ", u->name);
            show(stderr, text, len);
            fprintf(stderr, ": error: %s\n", err.msg);
        }
        return false;
    }
    bool same = n == nw && (n == 0 || memcmp(ids, want, n * sizeof *ids) == 0);
    *exact += same;
    if ((!same && report(u)) || u->verbose) {
        fprintf(stderr, "  %s %s: ", same ? "ok  " : "FAIL", u->name);
        show(stderr, text, len);
        fprintf(stderr, " (add_special %d, parse_special %d)\n    want: ", add_special,
                parse_special);
        show_ids(stderr, want, nw);
        fprintf(stderr, "\n    got:  ");
        show_ids(stderr, ids, n);
        fputc('\n', stderr);
    }
    bool back_ok = true;
    if (rt) {
        size_t cap = 4 * len + 64;
        char *back = malloc(cap);
        size_t nb = back ? qi_detokenize(u->t, ids, n, false, false, back, cap) : 0;
        back_ok = back && nb == len && memcmp(back, text, len) == 0;
        u->r->n_rt++;
        u->r->n_rt_ok += back_ok;
        if (!back_ok && report(u)) {
            fprintf(stderr, "  ROUNDTRIP %s: ", u->name);
            show(stderr, text, len);
            fprintf(stderr, " came back as ");
            if (back) show(stderr, back, nb < cap ? nb : cap);
            fputc('\n', stderr);
        }
        free(back);
    }
    qi_free(ids);
    return same && back_ok;
}

/* The suite's texts (path.inp, path.out): 0 all exact, 1 not. */
static int run_suite(run *u, const char *path, char *why, size_t nwhy) {
    char pin[1410], pout[1410];
    snprintf(pin, sizeof pin, "%s.inp", path);
    snprintf(pout, sizeof pout, "%s.out", path);
    size_t nin, nout;
    char *inp = qi_test_read_file(pin, &nin), *out = qi_test_read_file(pout, &nout);
    int32_t *want = malloc(65536 * sizeof *want);
    int rc = 0;
    if (!inp || !out || !want) {
        snprintf(why, nwhy, "cannot read ggml-vocab-%.63s.gguf.inp or .out", u->name);
        rc = 1;
        goto done;
    }
    const bool rt = roundtrip_why_not(u->name) == NULL;
    char *ocur = out;
    for (size_t pos = 0; pos < nin;) {
        const char *nx = find(inp + pos, nin - pos, SEP);
        size_t end = nx ? (size_t)(nx - inp) : nin;
        const char *text = inp + pos;
        size_t len = end - pos;
        pos = nx ? end + strlen(SEP) : nin;
        char *line = qi_test_next_line(&ocur);
        if (!line) {
            snprintf(why, nwhy, ".out has fewer lines than .inp has texts");
            rc = 1;
            break;
        }
        int nw = qi_test_parse_ids(line, want, 65536);
        u->r->n_text++;
        if (!check_text(u, text, len, false, false, want, (size_t)nw, rt, &u->r->n_exact))
            rc = 1;
    }
    if (!rc && qi_test_next_line(&ocur)) { /* test-tokenizer-0 refuses such files too */
        snprintf(why, nwhy, ".out has more lines than .inp has texts");
        rc = 1;
    }
done:
    free(want);
    free(inp);
    free(out);
    return rc;
}

/* strings.tsv against tests/golden/vocab/NAME.tsv: 0 all exact, 1 not, 77
 * no golden or a vocabulary file other than the recorded one (why in why). */
static int run_strings(run *u, const char *path, char *why, size_t nwhy) {
    char gpath[512], hex[65];
    snprintf(gpath, sizeof gpath, "%s/%.63s.tsv", VOCAB_GOLDEN, u->name);
    if (!exists(gpath)) {
        snprintf(why, nwhy, "no tests/golden/vocab/%.63s.tsv", u->name);
        return 77;
    }
    qi_err err = {0};
    size_t ng, ns;
    char *gold = qi_test_read_file(gpath, &ng), *str = qi_test_read_file(STRINGS, &ns);
    int32_t *want = malloc(65536 * sizeof *want);
    int rc = 0;
    if (!gold || !str || !want) {
        snprintf(why, nwhy, "cannot read %s or strings.tsv", gpath);
        rc = 1;
        goto done;
    }
    const char *sha = strstr(gold, "vocabulary sha256 ");
    if (!sha || qi_sha256_file(path, hex, &err) || strncmp(sha + 18, hex, 64) != 0) {
        snprintf(why, nwhy, "ggml-vocab-%.63s.gguf is not the file recorded in vocab/%.63s.tsv",
                 u->name, u->name);
        rc = 77;
        goto done;
    }
    char *gcur = gold, *scur = str, *sline, *gline;
    while ((sline = qi_test_next_line(&scur)) != NULL) {
        if (sline[0] == '#') continue;
        do gline = qi_test_next_line(&gcur);
        while (gline && gline[0] == '#');
        char *f[4];
        if (!gline || qi_test_split_tabs(sline, f, 4) != 4) {
            snprintf(why, nwhy, "vocab/%.63s.tsv and strings.tsv do not line up", u->name);
            rc = 1;
            break;
        }
        size_t len;
        unsigned char *text = qi_test_unhex(f[0], &len);
        int nw = qi_test_parse_ids(gline, want, 65536);
        u->r->n_str++;
        if (!text || !check_text(u, (const char *)text, len, atoi(f[2]) != 0, atoi(f[3]) != 0,
                                 want, (size_t)nw, false, &u->r->n_str_exact))
            rc = 1;
        free(text);
    }
done:
    free(want);
    free(gold);
    free(str);
    return rc;
}

/* One vocabulary: 0 passed, 1 failed, 77 skipped (why in why[]). */
static int run_vocab(const char *dir, const char *name, bool verbose, result *r, char *why,
                     size_t nwhy) {
    char path[1400];
    snprintf(path, sizeof path, "%.900s/ggml-vocab-%.63s.gguf", dir, name);
    if (!exists(path)) {
        snprintf(why, nwhy, "ggml-vocab-%.63s.gguf absent", name);
        return 77;
    }
    char pin[1410], gpath[512];
    snprintf(pin, sizeof pin, "%s.inp", path);
    snprintf(gpath, sizeof gpath, "%s/%.63s.tsv", VOCAB_GOLDEN, name);
    const bool have_suite = exists(pin), have_strings = exists(gpath);
    qi_err err = {0};
    qi_tokenizer *t = NULL;
    if (qi_tokenizer_load(path, &t, &err)) {
        const char *msg = strstr(err.msg, ".gguf: ");
        snprintf(why, nwhy, "does not load: %.500s", msg ? msg + 7 : err.msg);
        /* a file with nothing to check it against is not a failure */
        return have_suite || have_strings ? 1 : 77;
    }
    run u = {t, name, verbose, 0, r};
    char why1[600] = "", why2[600] = "";
    int rc1 = have_suite ? run_suite(&u, path, why1, sizeof why1) : 77;
    int rc2 = run_strings(&u, path, why2, sizeof why2);
    qi_tokenizer_free(t);
    if (!have_suite) snprintf(why1, sizeof why1, "the suite has no .inp/.out for it");
    snprintf(why, nwhy, "%s%s%s", rc1 ? why1 : "", rc1 && rc2 ? "; " : "", rc2 ? why2 : "");
    if (rc1 == 1 || rc2 == 1) return 1;
    return rc1 == 77 && rc2 == 77 ? 77 : 0;
}

/* The names to run: the known ones, then any other ggml-vocab-NAME.gguf in
 * dir, sorted. */
static int list_names(const char *dir, char names[][64], int cap) {
    int n = 0;
    for (size_t i = 0; i < sizeof known / sizeof known[0] && n < cap; i++)
        snprintf(names[n++], 64, "%s", known[i]);
    int n_known = n;
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL && n < cap) {
        size_t len = strlen(e->d_name);
        if (len <= 16 || strncmp(e->d_name, "ggml-vocab-", 11) != 0 ||
            strcmp(e->d_name + len - 5, ".gguf") != 0 || len - 16 >= 64)
            continue;
        char name[64];
        snprintf(name, sizeof name, "%.*s", (int)(len - 16), e->d_name + 11);
        bool dup = false;
        for (int i = 0; i < n; i++) dup |= strcmp(names[i], name) == 0;
        if (!dup) snprintf(names[n++], 64, "%s", name);
    }
    if (d) closedir(d);
    qsort(names + n_known, (size_t)(n - n_known), sizeof names[0],
          (int (*)(const void *, const void *))strcmp);
    return n;
}

int main(int argc, char **argv) {
    bool verbose = false;
    const char *only[64];
    int n_only = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-v") == 0) verbose = true;
        else if (n_only < 64) only[n_only++] = argv[i];
    }
    const char *dir = models_dir();
    if (!exists(dir)) {
        printf("test_tokenizer_vocab: skipped: %s absent (tests/golden/build_llama.sh "
               "--sources-only fetches it)\n",
               dir);
        return 77;
    }
    static char names[256][64];
    int n_names = list_names(dir, names, 256), n_pass = 0, n_fail = 0, n_skip = 0;
    printf("%s\n%-16s %-8s %7s %9s %7s  %s\n", dir, "vocabulary", "result", "suite", "roundtrip",
           "strings", "note");
    for (int k = 0; k < n_names; k++) {
        bool want = n_only == 0;
        for (int i = 0; i < n_only; i++) want |= strcmp(only[i], names[k]) == 0;
        if (!want) continue;
        result r = {0};
        char why[2048] = "";
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        int rc = run_vocab(dir, names[k], verbose, &r, why, sizeof why);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
        char exact[32] = "-", rt[32] = "-", str[32] = "-";
        const char *no_rt = roundtrip_why_not(names[k]);
        if (r.n_text) {
            snprintf(exact, sizeof exact, "%d/%d", r.n_exact, r.n_text);
            if (no_rt) snprintf(rt, sizeof rt, "n/a");
            else snprintf(rt, sizeof rt, "%d/%d", r.n_rt_ok, r.n_rt);
        }
        if (r.n_str) snprintf(str, sizeof str, "%d/%d", r.n_str_exact, r.n_str);
        const char *res = rc == 0 ? "passed" : rc == 77 ? "skipped" : "FAILED";
        printf("%-16s %-8s %7s %9s %7s  %s%s%.0f ms\n", names[k], res, exact, rt, str, why,
               *why ? "; " : "", ms);
        if (no_rt && r.n_text) printf("%-52s(no round trip: %s)\n", "", no_rt);
        n_pass += rc == 0;
        n_fail += rc == 1;
        n_skip += rc == 77;
    }
    printf("test_tokenizer_vocab: %d passed, %d failed, %d skipped\n", n_pass, n_fail, n_skip);
    if (n_fail) return 1;
    return n_pass ? 0 : 77;
}

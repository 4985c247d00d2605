/* testutil.h - small helpers shared by the Check suites. */
#ifndef QI_TESTUTIL_H
#define QI_TESTUTIL_H

#include <stddef.h>
#include <stdint.h>

#include "qinfer/model.h"

/* Cache root: $QINFER_CACHE or ~/.cache/qinfer. */
const char *qi_test_cache_dir(void);
/* Path of a cached model/corpus file by its manifest file name (e.g.
 * "models/SmolLM2-135M-Instruct.Q4_1.gguf") if it exists, else NULL. The
 * returned string is static (overwritten by the next call). */
const char *qi_test_cached(const char *relpath);
/* The cached model at relpath, loaded; NULL (a message on stderr when it
 * exists but does not load) otherwise. */
struct qi_model *qi_test_load_cached(const char *relpath);
/* Read a whole file (NUL-terminated, length in *len). NULL on error. Caller
 * frees with free(). */
char *qi_test_read_file(const char *path, size_t *len);
/* Decode a hex string into bytes; returns malloc'ed buffer, length in *len. */
unsigned char *qi_test_unhex(const char *hex, size_t *len);
/* Deterministic RNG for test data (xorshift64*). */
uint64_t qi_test_rand(uint64_t *state);
float qi_test_randf(uint64_t *state); /* uniform in [-1, 1) */

/* QI_TEST_QUICK set (and not "0"): the sanitizer build's cut-down runs. */
int qi_test_quick(void);
/* Parse space-separated ints into out; returns the count (<= cap). */
int qi_test_parse_ids(const char *s, int32_t *out, int cap);
/* Split a line on tabs in place; returns the field count (<= cap). */
int qi_test_split_tabs(char *line, char **f, int cap);
/* Next line of a NUL-terminated buffer, cut in place; NULL at the end. */
char *qi_test_next_line(char **cur);

/* Placement tests' models of shapes. qi_test_tiny_shapes: a tiny llama of
 * n_layer layers (256 wide, 4 heads of 64, 2 KV heads, FFN 512, vocabulary
 * 1000, F16-sized rows) into *m, its layers in `layers` (n_layer of them),
 * every weight pointing at one byte no one reads; each matrix's rows weigh
 * `mul` times as much (blocks that take milliseconds, not fixed costs).
 * qi_test_shapes_70b: a LLaMA-2-70B Q4_0 of shapes only, written by the
 * built qinfer (synth --shapes-only) to a temporary file named in path (n
 * bytes; the caller unlinks it) and loaded; NULL when either fails. */
void qi_test_tiny_shapes(qi_model *m, qi_layer *layers, int n_layer, uint64_t mul);
qi_model *qi_test_shapes_70b(char *path, size_t n);

/* A model with random weights written by the built qinfer (`qinfer synth
 * ARGS`) and loaded; NULL (a message on stderr) when either fails. For the
 * tests of the engine's own machinery (plans, batching, KV policies), whose
 * checks hold for any weights: bit-identity between two ways of computing
 * the same logits. Correct text against llama.cpp is the golden tests' job
 * (test_model*), on the real files. The shapes they use: */
/* SmolLM2-135M's layer shape (576 wide, 9/3 heads of 64, FFN 1536, tied
 * output, q4_1), 8 layers of its 30, vocabulary 4096 */
#define QI_TEST_SYNTH_SMOL "--preset smollm2-135m --n-layer 8 --n-vocab 4096"
/* Gemma 3 270M's (640 wide, 4/1 heads of 256, FFN 2048, QK-norm, 512-token
 * sliding window on five layers in six), q8_0, 6 layers of its 18 (the last
 * one global), vocabulary 4096 */
#define QI_TEST_SYNTH_GEMMA "--preset gemma3-270m --type q8_0 --n-layer 6 --n-vocab 4096"
qi_model *qi_test_synth(const char *args);

/* Monotonic clock in seconds. */
double qi_test_now(void);

/* One line of a tokenisation golden file (tests/golden/<model>/tokenize.tsv):
 * input bytes, add_special, parse_special, llama.cpp's ids. */
typedef struct {
    unsigned char *in;
    size_t len;
    int add, parse;
    int32_t *ids;
    size_t n;
} qi_tok_golden;

struct qi_tokenizer;
/* Read a golden file (Check-asserts on malformed lines); returns the count. */
size_t qi_tok_golden_read(const char *path, qi_tok_golden **out);
void qi_tok_golden_free(qi_tok_golden *v, size_t n);
/* Tokenise every line with t and compare: prints the first five mismatches
 * (input hex, expected, got) and a "<label>: N/M lines match llama.cpp" line,
 * and checks that a planted fault (one recorded id changed) is caught.
 * Returns the number of mismatching lines. */
size_t qi_tok_golden_check(const struct qi_tokenizer *t, qi_tok_golden *v, size_t n, const char *label);

/* llama.cpp's greedy goldens decoded as they were recorded: the prompt as
 * one batch, then one token per step fed with llama.cpp's tokens. Each
 * step's argmax and llama.cpp's top-2 logits are compared (the logits
 * exactly: the files round-trip to the float). Prints a summary; fills the
 * counts (window > 0: also counts prompts longer than it). QI_TEST_QUICK=1
 * checks the first 3 prompts. The caller asserts on the counts. */
typedef struct {
    int n_prompts, n_long, steps;
    int agree;   /* steps whose argmax is llama.cpp's token */
    int exact;   /* steps whose logits of llama.cpp's top-2 ids equal its logits bit for bit */
    float worst; /* max |our logit - llama.cpp's| over those */
} qi_test_greedy;
struct qi_model;
void qi_test_golden_greedy(const struct qi_model *m, const char *path, int window, qi_test_greedy *out);
/* The first generated position's top-10 logits must equal llama.cpp's bit
 * for bit; with qi_test_repack set, on a context with the repack option. */
extern bool qi_test_repack;
void qi_test_golden_first_logits(const struct qi_model *m, const char *path);
/* Perplexity against llama-perplexity's rows of the golden file `path`
 * (columns: run ctx chunks n_tokens n_scored ppl +/- running) over the
 * cached corpus `corpus`, read as llama-perplexity reads it: every row of
 * context `ctx` (0: any) over at most `max_chunks` chunks (the whole
 * corpus's is for the record, not for CI), each within the 4 decimals
 * printed; with `check_tokens`, the corpus's token count too. Returns the
 * rows checked. */
int qi_test_golden_ppl(const struct qi_model *m, const char *corpus, const char *path, int ctx, int max_chunks,
                       bool check_tokens);

/* The Check test case a CTest entry selects (CK_RUN_CASE, set by
 * CMakeLists.txt where one suite is several entries), or "" for all. Its
 * main exits 77 (skipped) with the reason when that case cannot run here. */
const char *qi_test_case(void);
/* Print "name: skipped: why" and return 77, CTest's skip code. */
int qi_test_skip(const char *name, const char *why);

/* Run a Check suite (fork mode unless CK_FORK=no) and return the process
 * exit code: 0 when every test passed, 1 otherwise. Takes ownership. */
struct Suite;
int qi_test_run_suite(struct Suite *s);

/* ck_assert_msg for a check run once per element of a large result:
 * Check's ck_assert records each passing assertion (a write in fork mode),
 * which for millions of elements costs more than the test itself; this
 * records only the failure, with the same message. */
#define qi_check_msg(expr, ...)                       \
    do {                                              \
        if (!(expr)) ck_abort_msg(__VA_ARGS__);       \
    } while (0)

#endif

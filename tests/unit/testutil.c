/* testutil.c - see testutil.h. */
#include "testutil.h"

#include <check.h>
#include <time.h>

#include "qinfer/model.h"
#include "qinfer/perplexity.h"
#include "qinfer/sampler.h"
#include "qinfer/tokenizer.h"
#include <math.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const char *qi_test_cache_dir(void) {
    static char buf[1024];
    const char *c = getenv("QINFER_CACHE");
    if (c && *c) return c;
    const char *home = getenv("HOME");
    snprintf(buf, sizeof buf, "%s/.cache/qinfer", home ? home : ".");
    return buf;
}

const char *qi_test_cached(const char *relpath) {
    static char buf[2048];
    snprintf(buf, sizeof buf, "%s/%s", qi_test_cache_dir(), relpath);
    return access(buf, R_OK) == 0 ? buf : NULL;
}

char *qi_test_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    if (fseek(f, 0, SEEK_END) != 0) { fclose(f); return NULL; }
    long n = ftell(f);
    if (n < 0) { fclose(f); return NULL; }
    rewind(f);
    char *b = malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) { free(b); b = NULL; }
    fclose(f);
    if (!b) return NULL;
    b[n] = 0;
    if (len) *len = (size_t)n;
    return b;
}

static int hexval(int c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

unsigned char *qi_test_unhex(const char *hex, size_t *len) {
    size_t n = strlen(hex) / 2;
    unsigned char *b = malloc(n + 1);
    if (!b) return NULL;
    for (size_t i = 0; i < n; i++) {
        int hi = hexval(hex[2 * i]), lo = hexval(hex[2 * i + 1]);
        if (hi < 0 || lo < 0) { free(b); return NULL; }
        b[i] = (unsigned char)(hi * 16 + lo);
    }
    b[n] = 0;
    *len = n;
    return b;
}

uint64_t qi_test_rand(uint64_t *s) {
    uint64_t x = *s ? *s : 0x9E3779B97F4A7C15ull;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 0x2545F4914F6CDD1Dull;
}

float qi_test_randf(uint64_t *s) {
    return (float)((qi_test_rand(s) >> 40) / (double)(1ull << 24)) * 2.0f - 1.0f;
}

int qi_test_run_suite(Suite *s) {
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}

double qi_test_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

size_t qi_tok_golden_read(const char *path, qi_tok_golden **out) {
    size_t flen;
    char *text = qi_test_read_file(path, &flen);
    ck_assert_msg(text != NULL, "cannot read %s", path);
    size_t cap = 1024, n = 0;
    qi_tok_golden *v = calloc(cap, sizeof *v);
    ck_assert_ptr_nonnull(v);
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        if (line[0] == '#' || line[0] == 0) continue;
        char *f[4] = {line, NULL, NULL, NULL};
        for (int k = 1; k < 4; k++) {
            f[k] = strchr(f[k - 1], '\t');
            ck_assert_msg(f[k] != NULL, "%s line %zu: expected 4 columns", path, n + 1);
            *f[k]++ = 0;
        }
        if (n == cap) {
            v = realloc(v, (cap *= 2) * sizeof *v);
            ck_assert_ptr_nonnull(v);
        }
        qi_tok_golden *g = &v[n++];
        g->in = qi_test_unhex(f[0], &g->len);
        ck_assert_ptr_nonnull(g->in);
        g->add = atoi(f[1]);
        g->parse = atoi(f[2]);
        g->ids = malloc(sizeof(int32_t) * (strlen(f[3]) / 2 + 1));
        g->n = 0;
        for (char *p = f[3]; *p;) {
            char *end;
            long id = strtol(p, &end, 10);
            ck_assert_msg(end != p, "%s line %zu: bad id list", path, n);
            g->ids[g->n++] = (int32_t)id;
            p = end;
            while (*p == ' ') p++;
        }
    }
    free(text);
    *out = v;
    return n;
}

void qi_tok_golden_free(qi_tok_golden *v, size_t n) {
    for (size_t i = 0; i < n; i++) {
        free(v[i].in);
        free(v[i].ids);
    }
    free(v);
}

static void print_ids(const char *label, const int32_t *ids, size_t n) {
    fprintf(stderr, "  %s:", label);
    for (size_t i = 0; i < n; i++) fprintf(stderr, " %d", ids[i]);
    fprintf(stderr, "\n");
}

/* Tokenise a golden line's input; whether the ids are the recorded ones. */
static bool golden_matches(const qi_tokenizer *t, const qi_tok_golden *gl, int32_t **ids, size_t *k) {
    qi_err e = {0};
    ck_assert_msg(qi_tokenize(t, (const char *)gl->in, gl->len, gl->add, gl->parse, ids, k, &e) == QI_OK,
                  "tokenize: %s", e.msg);
    return *k == gl->n && memcmp(*ids, gl->ids, *k * sizeof **ids) == 0;
}

size_t qi_tok_golden_check(const qi_tokenizer *t, qi_tok_golden *v, size_t n, const char *label) {
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t *ids;
        size_t k;
        if (!golden_matches(t, &v[i], &ids, &k) && bad++ < 5) {
            fprintf(stderr, "golden mismatch, line %zu (add_special=%d parse_special=%d), input hex: ", i + 1,
                    v[i].add, v[i].parse);
            for (size_t j = 0; j < v[i].len; j++) fprintf(stderr, "%02x", v[i].in[j]);
            fprintf(stderr, "\n");
            print_ids("expected", v[i].ids, v[i].n);
            print_ids("got     ", ids, k);
        }
        qi_free(ids);
    }
    fprintf(stderr, "%s: %zu/%zu lines match llama.cpp\n", label, n - bad, n);
    /* A planted fault must be caught: one recorded id changed. */
    for (size_t i = 0; i < n; i++) {
        if (v[i].n < 2) continue;
        v[i].ids[v[i].n - 1] ^= 1;
        int32_t *ids;
        size_t k;
        ck_assert(!golden_matches(t, &v[i], &ids, &k));
        v[i].ids[v[i].n - 1] ^= 1;
        qi_free(ids);
        break;
    }
    return bad;
}

int qi_test_quick(void) {
    const char *q = getenv("QI_TEST_QUICK");
    return q && *q && *q != '0';
}

int qi_test_parse_ids(const char *s, int32_t *out, int cap) {
    int n = 0;
    char *end;
    while (*s && n < cap) {
        long v = strtol(s, &end, 10);
        if (end == s) break;
        out[n++] = (int32_t)v;
        s = end;
    }
    return n;
}

int qi_test_split_tabs(char *line, char **f, int cap) {
    int n = 0;
    f[n++] = line;
    for (char *p = line; *p && n < cap; p++)
        if (*p == '\t') {
            *p = 0;
            f[n++] = p + 1;
        }
    return n;
}

char *qi_test_next_line(char **cur) {
    char *s = *cur;
    if (!*s) return NULL;
    char *nl = strchr(s, '\n');
    if (nl) {
        *nl = 0;
        *cur = nl + 1;
    } else {
        *cur = s + strlen(s);
    }
    return s;
}

/* ---- llama.cpp model goldens (tests/golden/<model>/greedy.tsv, logits.tsv) ---- */

#define N_GEN 64 /* generated tokens per golden prompt, at most (a slow model's files hold fewer) */
#define N_GEN_QUICK 16 /* of them checked in quick mode (the sanitizer build) */

/* Logits are recorded with %.9g, which round-trips to the exact float, so
 * "equal" below is ==. */
void qi_test_golden_greedy(const qi_model *m, const char *path, int window, qi_test_greedy *out) {
    size_t len;
    char *text = qi_test_read_file(path, &len);
    ck_assert_msg(text != NULL, "missing %s", path);
    qi_ctx *c = NULL;
    qi_err e = {0};
    ck_assert_int_eq(qi_ctx_create(m, 2048, 2, &c, &e), QI_OK);
    const int V = m->hp.n_vocab;
    int n_prompts = 0, n_long = 0, steps = 0, agree = 0, exact = 0, exact_prompts = 0;
    float worst = 0;
    char *cur = text, *line;
    while ((line = qi_test_next_line(&cur))) {
        if (line[0] == '#' || !line[0]) continue;
        if (qi_test_quick() && n_prompts >= 3) break;
        char *f[8];
        ck_assert_int_ge(qi_test_split_tabs(line, f, 8), 4);
        int32_t ids[2048 + N_GEN], gen[N_GEN];
        int P = qi_test_parse_ids(f[1], ids, 2048);
        int G = qi_test_parse_ids(f[2], gen, N_GEN);
        ck_assert_int_gt(G, 0);
        ck_assert_int_gt(P, 0);
        n_long += window > 0 && P > window; /* the prompt alone slides the local layers */
        /* llama.cpp's top-2 ids and logits per step: "id:logit,id:logit" separated by spaces */
        int id1[N_GEN], id2[N_GEN];
        float lg1[N_GEN], lg2[N_GEN];
        char *s = f[3];
        for (int i = 0; i < G; i++) {
            int used = 0;
            ck_assert_msg(sscanf(s, " %d:%f,%d:%f%n", &id1[i], &lg1[i], &id2[i], &lg2[i], &used) == 4,
                          "bad step field %d", i);
            ck_assert_int_eq(id1[i], gen[i]);
            s += used;
        }
        qi_ctx_reset(c);
        ck_assert_msg(qi_ctx_eval(c, ids, P, false, &e) == QI_OK, "%s", e.msg);
        int ok_here = 0;
        const int n_steps = qi_test_quick() && G > N_GEN_QUICK ? N_GEN_QUICK : G;
        for (int i = 0; i < n_steps; i++) {
            if (i > 0) ck_assert_msg(qi_ctx_eval(c, &gen[i - 1], 1, false, &e) == QI_OK, "%s", e.msg);
            const float *lg = qi_ctx_logits(c, -1);
            const int32_t mine = qi_argmax(lg, V);
            const float d = fmaxf(fabsf(lg[id1[i]] - lg1[i]), fabsf(lg[id2[i]] - lg2[i]));
            if (d > worst) worst = d;
            steps++;
            agree += mine == gen[i];
            if (lg[id1[i]] == lg1[i] && lg[id2[i]] == lg2[i]) {
                exact++;
                ok_here++;
            } else if (mine != gen[i]) {
                printf("prompt %d step %d: llama.cpp %d (%.9g), qinfer %d\n", n_prompts, i, gen[i], lg1[i], mine);
            }
        }
        exact_prompts += ok_here == n_steps;
        n_prompts++;
    }
    printf("greedy: %d prompts, %d/%d steps choose llama.cpp's token, %d/%d steps with both top-2 logits "
           "bit-identical (%d prompts throughout), max |logit diff| %.2e\n",
           n_prompts, agree, steps, exact, steps, exact_prompts, worst);
    if (window > 0) printf("greedy: %d prompts longer than the %d-token window\n", n_long, window);
    qi_ctx_free(c);
    free(text);
    out->n_prompts = n_prompts;
    out->n_long = n_long;
    out->steps = steps;
    out->agree = agree;
    out->exact = exact;
    out->worst = worst;
}

bool qi_test_repack;

void qi_test_golden_first_logits(const qi_model *m, const char *path) {
    size_t len;
    char *text = qi_test_read_file(path, &len);
    ck_assert_msg(text != NULL, "missing %s", path);
    qi_ctx *c = NULL;
    qi_err e = {0};
    const qi_ctx_opts co = {.n_ctx = 2048, .n_threads = 2, .repack = qi_test_repack};
    ck_assert_int_eq(qi_ctx_create_opts(m, &co, &c, &e), QI_OK);
    int n = 0;
    float worst = 0;
    char *cur = text, *line;
    while ((line = qi_test_next_line(&cur))) {
        if (line[0] == '#' || !line[0]) continue;
        if (qi_test_quick() && n >= 3) break;
        char *f[4];
        ck_assert_int_ge(qi_test_split_tabs(line, f, 4), 2);
        size_t plen;
        unsigned char *prompt = qi_test_unhex(f[0], &plen);
        int32_t *ids = NULL;
        size_t n_ids = 0;
        ck_assert_int_eq(qi_tokenize(m->tok, (const char *)prompt, plen, true, true, &ids, &n_ids, &e), QI_OK);
        qi_ctx_reset(c);
        ck_assert_msg(qi_ctx_eval(c, ids, (int)n_ids, false, &e) == QI_OK, "%s", e.msg);
        const float *lg = qi_ctx_logits(c, -1);
        char *s = f[1];
        for (int k = 0; k < 10; k++) {
            int id, used = 0;
            float want;
            ck_assert_int_eq(sscanf(s, " %d:%f%n", &id, &want, &used), 2);
            s += used;
            float d = fabsf(lg[id] - want);
            if (d > worst) worst = d;
            ck_assert_msg(lg[id] == want, "prompt %d token %d: logit %.9g, llama.cpp %.9g", n, id, lg[id], want);
        }
        qi_free(ids);
        free(prompt);
        n++;
    }
    printf("first-position top-10 logits: %d prompts, bit-identical (max |diff| %.2e)\n", n, worst);
    ck_assert_int_gt(n, 0);
    qi_ctx_free(c);
    free(text);
}

const char *qi_test_case(void) {
    const char *c = getenv("CK_RUN_CASE");
    return c ? c : "";
}

int qi_test_skip(const char *name, const char *why) {
    printf("%s: skipped: %s\n", name, why);
    fflush(stdout);
    return 77;
}

qi_model *qi_test_load_cached(const char *relpath) {
    const char *p = qi_test_cached(relpath);
    if (!p) return NULL;
    qi_model *m = NULL;
    qi_err e = {0};
    if (qi_model_load(p, &m, &e) != QI_OK) {
        fprintf(stderr, "%s\n", e.msg);
        return NULL;
    }
    return m;
}

static const unsigned char g_shape_byte = 1;

static qi_weight shape_w(uint64_t row_bytes, int64_t n_rows) {
    return (qi_weight){.data = &g_shape_byte, .n_rows = n_rows, .row_bytes = row_bytes};
}

void qi_test_tiny_shapes(qi_model *m, qi_layer *layers, int n_layer, uint64_t mul) {
    *m = (qi_model){0};
    m->hp.n_vocab = 1000;
    m->hp.n_embd = 256;
    m->hp.n_layer = n_layer;
    m->hp.n_head = 4;
    m->hp.n_head_kv = 2;
    m->hp.head_dim = 64;
    m->hp.n_ff = 512;
    m->tok_embd = shape_w(512, 1000);
    m->out_norm = shape_w(1024, 1);
    m->output = shape_w(512 * mul, 1000);
    for (int l = 0; l < n_layer; l++)
        layers[l] = (qi_layer){.attn_norm = shape_w(1024, 1), .wq = shape_w(512 * mul, 256),
                               .wk = shape_w(512 * mul, 128), .wv = shape_w(512 * mul, 128),
                               .wo = shape_w(512 * mul, 256), .ffn_norm = shape_w(1024, 1),
                               .w_gate = shape_w(512 * mul, 512), .w_up = shape_w(512 * mul, 512),
                               .w_down = shape_w(1024 * mul, 256)};
    m->layers = layers;
}

qi_model *qi_test_shapes_70b(char *path, size_t n) {
    snprintf(path, n, "/tmp/qinfer-test-70b-%d.gguf", (int)getpid());
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "'%s/qinfer' synth --preset llama-2-70b --type q4_0 --shapes-only -o '%s' 2>/dev/null",
             QI_BINARY_DIR, path);
    qi_model *m = NULL;
    qi_err e = {0};
    if (system(cmd) != 0 || qi_model_load(path, &m, &e) != QI_OK) {
        fprintf(stderr, "qinfer synth could not write a 70B of shapes to %s: %s\n", path, e.msg);
        unlink(path);
        return NULL;
    }
    return m;
}

qi_model *qi_test_synth(const char *args) {
    char path[96], cmd[1024];
    snprintf(path, sizeof path, "/tmp/qinfer-test-synth-%d.gguf", (int)getpid());
    snprintf(cmd, sizeof cmd, "'%s/qinfer' synth %s -o '%s' >/dev/null", QI_BINARY_DIR, args, path);
    qi_model *m = NULL;
    qi_err e = {0};
    if (system(cmd) != 0 || qi_model_load(path, &m, &e) != QI_OK) {
        fprintf(stderr, "qinfer synth %s: no model (%s)\n", args, e.msg[0] ? e.msg : "synth failed");
        m = NULL;
    }
    unlink(path); /* the loaded model keeps its own mapping */
    return m;
}

int qi_test_golden_ppl(const qi_model *m, const char *corpus, const char *path, int ctx, int max_chunks,
                       bool check_tokens) {
    const char *cp = qi_test_cached(corpus);
    ck_assert_msg(cp != NULL, "corpus %s not cached; run models/fetch.sh devil", corpus);
    size_t tlen;
    char *text = qi_test_read_file(cp, &tlen);
    char *golden = qi_test_read_file(path, NULL);
    ck_assert_ptr_nonnull(text);
    ck_assert_msg(golden != NULL, "missing %s", path);
    if (tlen > 0 && text[tlen - 1] == '\n') tlen--; /* as llama-perplexity reads it */
    qi_err e = {0};
    int32_t *ids = NULL;
    size_t n_ids = 0;
    ck_assert_int_eq(qi_tokenize(m->tok, text, tlen, true, false, &ids, &n_ids, &e), QI_OK);
    int checked = 0;
    char *cur = golden, *line;
    while ((line = qi_test_next_line(&cur))) {
        if (line[0] == '#' || !line[0]) continue;
        char *f[8];
        if (qi_test_split_tabs(line, f, 8) < 7) continue;
        const int c = atoi(f[1]), chunks = atoi(f[2]);
        if ((ctx && c != ctx) || chunks > max_chunks) continue;
        if (check_tokens) ck_assert_int_eq(atoi(f[3]), (int)n_ids); /* as llama.cpp counted them */
        const double want = atof(f[5]);
        qi_ctx *x = NULL;
        ck_assert_int_eq(qi_ctx_create(m, c, 2, &x, &e), QI_OK);
        qi_ppl_result r;
        ck_assert_msg(qi_perplexity(m, x, ids, n_ids, c, chunks, NULL, NULL, &r, &e) == QI_OK, "%s", e.msg);
        printf("perplexity, ctx %d, %d chunks: qinfer %.4f, llama.cpp %.4f\n", c, chunks, r.ppl, want);
        ck_assert_msg(fabs(r.ppl - want) <= 6e-5, "ctx %d: perplexity %.5f vs llama.cpp %.4f", c, r.ppl, want);
        qi_ctx_free(x);
        checked++;
    }
    qi_free(ids);
    free(text);
    free(golden);
    return checked;
}

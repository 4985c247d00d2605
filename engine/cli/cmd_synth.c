/* cmd_synth.c - `qinfer synth`: a llama-, qwen2- or gemma3-architecture GGUF
 * with random weights, of any size.
 *
 * Why: throughput depends on a model's shapes and weight types, not on its
 * values, and the models at hand are small enough to live in this class of
 * machine's last-level cache. A synthetic model of a larger shape shows the
 * engine where its premise (decode bound by memory bandwidth) holds, and a
 * machine without the model packages (the GPU machine) can make one for
 * itself. Its text is noise: measure speed with it, never accuracy. The
 * file says so in `qinfer.synthetic` = true, and `qinfer bench` prints it.
 *
 * The weights are random quant blocks, written as they are (no float
 * matrix is quantised): codes uniform, the fp16 block scales small and
 * finite, chosen so that a row's dot with a unit vector stays of order
 * one, so activations neither vanish nor overflow through the layers. The
 * vocabulary is the 256 GPT-2 byte tokens, then control tokens up to the
 * requested size; norms are ones.
 *
 * gemma3 (the gemma3-270m preset) takes the engine's other decoder path:
 * per-head QK-norm, post-attention and post-FFN norms, GeGLU, embeddings
 * scaled by sqrt(n_embd), a head size of its own (attention.key_length, not
 * n_embd / n_head), sliding-window layers with their own RoPE base (every
 * sixth layer global: no sliding_window_pattern key, as in Gemma 3's own
 * files) and a tied output. Its norms are ones too: the engine multiplies by
 * Gemma's norm weights as stored (the converter folded in the 1 + w), so
 * ones are unit gains, and the embedding scale brings the small embedding
 * rows back to order one. Its vocabulary is SentencePiece, laid out as
 * Gemma's: <pad> <eos> <bos> <unk>, the turn markers, the 256 "<0xXX>" byte
 * tokens, then "<unusedN>" control tokens; so the SPM tokenizer and the
 * Gemma chat turns are the ones exercised.
 *
 * qwen2 (the qwen2-1.5b preset) is llama's skeleton with biases on the
 * query, key and value projections (random, of order one half, so that a
 * bias added to the wrong element shows) and RoPE rotating halves; its
 * output head is a matrix of its own, as in Qwen2.5-1.5B.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "cli.h"
#include "qinfer/gguf.h"
#include "qinfer/quant.h"
#include "qinfer/types.h"
#include "tokenizer_int.h"

typedef struct {
    const char *name;
    int n_embd, n_ff, n_layer, n_head, n_head_kv, n_vocab, n_ctx;
    float rope_base;
    bool tied;
    const char *arch; /* general.architecture: llama, qwen2, gemma3, or opt and falcon (shapes only) */
    int head_dim;        /* 0: n_embd / n_head */
    int n_swa;           /* gemma3: sliding window of the local layers (0: all global) */
    float rope_base_swa; /* gemma3: the local layers' RoPE base */
} synth_shape;

/* A layer's tensor: name, columns, rows (1: an f32 vector). */
typedef struct {
    const char *name;
    int64_t cols, rows;
} synth_tensor;

/* The shapes of real models, to mimic by name. OPT and Falcon run on
 * simulated devices only (engine/model.c names their keys and tensors), so
 * their presets are written with --shapes-only. */
static const synth_shape k_presets[] = {
    {"smollm2-135m", 576, 1536, 30, 9, 3, 49152, 8192, 100000.0f, true, "llama", 0, 0, 0.0f},
    {"tinyllama-1.1b", 2048, 5632, 22, 32, 4, 32000, 2048, 10000.0f, false, "llama", 0, 0, 0.0f},
    {"llama-7b", 4096, 11008, 32, 32, 32, 32000, 4096, 10000.0f, false, "llama", 0, 0, 0.0f},
    {"llama-2-13b", 5120, 13824, 40, 40, 40, 32000, 4096, 10000.0f, false, "llama", 0, 0, 0.0f},
    {"llama-2-70b", 8192, 28672, 80, 64, 8, 32000, 4096, 10000.0f, false, "llama", 0, 0, 0.0f},
    /* Qwen2.5-1.5B: 12 query heads of 128, 2 KV heads, q/k/v biases, a
     * 152k vocabulary and an output head of its own */
    {"qwen2-1.5b", 1536, 8960, 28, 12, 2, 151936, 32768, 1000000.0f, false, "qwen2", 0, 0, 0.0f},
    /* Gemma 3 270M: 4 query heads of 256 over a 640-wide stream, one KV
     * head, 512-token windows on five layers of six, a 262k vocabulary */
    {"gemma3-270m", 640, 2048, 18, 4, 1, 262144, 32768, 1000000.0f, true, "gemma3", 256, 512, 10000.0f},
    /* OPT (6.7B, 30B, 175B): MHA, fc1/fc2 with ReLU, learned positions, tied head */
    {"opt-6.7b", 4096, 16384, 32, 32, 32, 50272, 2048, 10000.0f, true, "opt", 0, 0, 0.0f},
    {"opt-30b", 7168, 28672, 48, 56, 56, 50272, 2048, 10000.0f, true, "opt", 0, 0, 0.0f},
    {"opt-175b", 12288, 49152, 96, 96, 96, 50272, 2048, 10000.0f, true, "opt", 0, 0, 0.0f},
    /* Falcon-40B: 8 KV heads, parallel attention and GELU MLP, two LayerNorms */
    {"falcon-40b", 8192, 32768, 60, 128, 8, 65024, 2048, 10000.0f, true, "falcon", 0, 0, 0.0f},
};

static void help(void) {
    printf("usage: qinfer synth -o FILE [--preset NAME] [--type T] [shape options]\n\n"
           "Write a llama-, qwen2- or gemma3-architecture GGUF with random weights: real\n"
           "throughput for a model shape that is not at hand, never real text (the file\n"
           "is marked qinfer.synthetic = true, and qinfer bench says so).\n\n"
           "  -o, --output FILE   the GGUF to write (an existing file is replaced)\n"
           "      --preset NAME   the shape to start from (default smollm2-135m):\n");
    for (size_t i = 0; i < sizeof k_presets / sizeof k_presets[0]; i++) {
        const synth_shape *p = &k_presets[i];
        char extra[64] = "";
        if (p->head_dim) snprintf(extra, sizeof extra, " of %d, window %d", p->head_dim, p->n_swa);
        printf("                        %-15s embd %d, ff %d, %d layers, %d/%d heads%s, vocab %d%s%s%s\n", p->name,
               p->n_embd, p->n_ff, p->n_layer, p->n_head, p->n_head_kv, extra, p->n_vocab,
               p->tied ? ", tied output" : "", strcmp(p->arch, "llama") ? ", " : "",
               strcmp(p->arch, "llama") ? p->arch : "");
    }
    printf("      --type T        weight type of the matrices: q4_0, q4_1 (default), q8_0,\n"
           "                      q4_K, q6_K or f16 (norms are f32)\n"
           "      --n-embd N      embedding width      --n-ff N       feed-forward width\n"
           "      --n-layer N     layers               --n-head N     query heads\n"
           "      --n-head-kv N   KV heads             --n-vocab N    vocabulary (>= 258;\n"
           "                                                          gemma3 >= 262)\n"
           "      --head-dim N    head size (default n_embd / n_head; gemma3-270m: 256)\n"
           "      --sliding-window N  gemma3: the local layers' window (0: every layer global)\n"
           "      --n-ctx N       training context written to the file\n"
           "      --seed S        random seed (default 1)\n"
           "      --shapes-only   write the shapes without the weights (a header of a few MB\n"
           "                      for any size): the model then runs only on simulated\n"
           "                      devices (--sim PROFILE), which time ops from shapes;\n"
           "                      opt and falcon presets are written only so\n"
           "  -h, --help          this help\n");
}

/* the bytes of one token's text in the vocabulary's store */
#define SLOT 24

static uint64_t rng_next(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static void put_f16(uint8_t *p, float v) {
    const uint16_t h = qi_f32_to_fp16(v);
    memcpy(p, &h, sizeof h);
}

/* Random rows of n elements of type t into buf (rows x row_bytes): f16
 * values of about 1 / sqrt(n); for the block types random bytes, then each
 * block's scale fields overwritten with finite values of about
 * 1 / (code range * sqrt(n)). */
static void fill_rows(uint32_t t, int64_t n, int64_t rows, uint8_t *buf, uint64_t rb, uint64_t *rng) {
    const uint64_t total = rb * (uint64_t)rows;
    const float unit = 1.0f / sqrtf((float)n);
    if (t == QI_TYPE_F16) {
        for (uint64_t i = 0; i < total; i += 2) put_f16(buf + i, unit * ((float)(rng_next(rng) % 2001) / 1000.0f - 1.0f));
        return;
    }
    for (uint64_t i = 0; i < total; i += 8) {
        const uint64_t r = rng_next(rng);
        memcpy(buf + i, &r, total - i < 8 ? total - i : 8);
    }
    const qi_type_info *ti = qi_type_get(t);
    for (uint64_t o = 0; o < total; o += ti->size) {
        uint8_t *b = buf + o;
        const float jitter = 0.75f + 0.5f * (float)(rng_next(rng) % 1000) / 1000.0f;
        switch (t) {
        case QI_TYPE_Q4_0: put_f16(b, jitter * unit / 8.0f); break;
        case QI_TYPE_Q4_1:
            put_f16(b, jitter * unit / 8.0f);
            put_f16(b + 2, -jitter * unit);
            break;
        case QI_TYPE_Q8_0: put_f16(b, jitter * unit / 128.0f); break;
        case QI_TYPE_Q4_K: /* d, dmin; 6-bit sub-block scales and mins up to 63 */
            put_f16(b, jitter * unit / (8.0f * 32.0f));
            put_f16(b + 2, jitter * unit / 32.0f);
            break;
        case QI_TYPE_Q6_K: /* d last; int8 sub-block scales */
            put_f16(b + ti->size - 2, jitter * unit / (32.0f * 64.0f));
            break;
        default: break;
        }
    }
}

static bool parse_type(const char *s, uint32_t *t) {
    static const uint32_t ok[] = {QI_TYPE_Q4_0, QI_TYPE_Q4_1, QI_TYPE_Q8_0, QI_TYPE_Q4_K, QI_TYPE_Q6_K, QI_TYPE_F16};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
        if (!strcasecmp(s, qi_type_get(ok[i])->name)) {
            *t = ok[i];
            return true;
        }
    return false;
}

static qi_status add_matrix(qi_gguf_writer *w, const char *name, uint32_t t, int64_t cols, int64_t rows,
                            uint64_t *rng, bool shapes, uint64_t *bytes, qi_err *err) {
    uint64_t rb = 0;
    if (!qi_type_row_bytes(t, (uint64_t)cols, &rb))
        return QI_ERR(err, QI_ERR_INVALID, "%s: %lld columns are not whole %s blocks", name, (long long)cols,
                      qi_type_get(t)->name);
    const uint64_t ne[2] = {(uint64_t)cols, (uint64_t)rows};
    if (shapes) {
        qi_status st = qi_gguf_writer_add_tensor_shape(w, name, t, rows > 1 ? 2 : 1, ne, rb * (uint64_t)rows);
        if (st) return QI_ERR(err, st, "cannot add tensor %s", name);
        *bytes += rb * (uint64_t)rows;
        return QI_OK;
    }
    uint8_t *buf = qi_malloc(rb * (uint64_t)rows);
    if (!buf) return QI_ERR(err, QI_ERR_NOMEM, "out of memory for %s (%.1f MiB)", name, rb * (double)rows / 1048576.0);
    const size_t nl = strlen(name);
    if (t == QI_TYPE_F32 && nl > 5 && !strcmp(name + nl - 5, ".bias")) { /* biases: uniform in [-0.5, 0.5] */
        for (int64_t i = 0; i < cols * rows; i++)
            ((float *)(void *)buf)[i] = (float)(rng_next(rng) % 1001) / 1000.0f - 0.5f;
    } else if (t == QI_TYPE_F32) {
        for (int64_t i = 0; i < cols * rows; i++) ((float *)(void *)buf)[i] = 1.0f;
    } else {
        fill_rows(t, cols, rows, buf, rb, rng);
    }
    qi_status st = qi_gguf_writer_add_tensor(w, name, t, rows > 1 ? 2 : 1, ne, buf, rb * (uint64_t)rows);
    qi_free(buf);
    if (st) return QI_ERR(err, st, "cannot add tensor %s", name);
    *bytes += rb * (uint64_t)rows;
    return QI_OK;
}

int qi_cmd_synth(int argc, char **argv) {
    const char *cmd = "synth", *out = NULL, *preset = "smollm2-135m", *type_arg = "q4_1";
    int embd = 0, ff = 0, layers = 0, heads = 0, kv = 0, vocab = 0, ctx = 0, head_dim = 0, swa = -1;
    uint64_t seed = 1;
    bool shapes = false;
    qi_args a;
    qi_args_init(&a, cmd, argc, argv);
    while (qi_args_next(&a)) {
        if (qi_args_is(&a, "-h", "--help")) { help(); return 0; }
        else if (qi_args_is(&a, "-o", "--output")) out = qi_args_str(&a);
        else if (qi_args_is(&a, NULL, "--preset")) preset = qi_args_str(&a);
        else if (qi_args_is(&a, NULL, "--type")) type_arg = qi_args_str(&a);
        else if (qi_args_is(&a, NULL, "--n-embd")) qi_args_int(&a, 32, 65536, &embd);
        else if (qi_args_is(&a, NULL, "--n-ff")) qi_args_int(&a, 32, 262144, &ff);
        else if (qi_args_is(&a, NULL, "--n-layer")) qi_args_int(&a, 1, 512, &layers);
        else if (qi_args_is(&a, NULL, "--n-head")) qi_args_int(&a, 1, 1024, &heads);
        else if (qi_args_is(&a, NULL, "--n-head-kv")) qi_args_int(&a, 1, 1024, &kv);
        else if (qi_args_is(&a, NULL, "--n-vocab")) qi_args_int(&a, 258, 1 << 20, &vocab);
        else if (qi_args_is(&a, NULL, "--n-ctx")) qi_args_int(&a, 16, 1 << 20, &ctx);
        else if (qi_args_is(&a, NULL, "--head-dim")) qi_args_int(&a, 2, 1024, &head_dim);
        else if (qi_args_is(&a, NULL, "--sliding-window")) qi_args_int(&a, 0, 1 << 20, &swa);
        else if (qi_args_is(&a, NULL, "--seed")) qi_args_u64(&a, &seed);
        else if (qi_args_is(&a, NULL, "--shapes-only")) shapes = true;
        else qi_args_unknown(&a);
    }
    if (a.failed) return QI_EXIT_USAGE;
    if (!out) {
        qi_cli_error(cmd, "no output file given: use -o FILE");
        return QI_EXIT_USAGE;
    }
    const synth_shape *base = NULL;
    for (size_t i = 0; i < sizeof k_presets / sizeof k_presets[0]; i++)
        if (!strcmp(preset, k_presets[i].name)) base = &k_presets[i];
    if (!base) {
        qi_cli_error(cmd, "unknown preset '%s' (qinfer synth --help lists them)", preset);
        return QI_EXIT_USAGE;
    }
    uint32_t t;
    if (!parse_type(type_arg, &t)) {
        qi_cli_error(cmd, "unknown or unsupported weight type '%s' (q4_0, q4_1, q8_0, q4_K, q6_K, f16)", type_arg);
        return QI_EXIT_USAGE;
    }
    /* gemma3 and qwen2 are llama's decoder plus their extra norms or biases:
     * "llama" below means that skeleton, "gemma" and "qwen2" the additions */
    const bool gemma = !strcmp(base->arch, "gemma3"), qwen2 = !strcmp(base->arch, "qwen2");
    const bool llama = gemma || qwen2 || !strcmp(base->arch, "llama");
    if (!llama && !shapes) {
        qi_cli_error(cmd, "preset %s is a %s model, which runs on simulated devices only: write it with --shapes-only",
                     base->name, base->arch);
        return QI_EXIT_USAGE;
    }
    synth_shape s = *base;
    if (embd) s.n_embd = embd;
    if (ff) s.n_ff = ff;
    if (layers) s.n_layer = layers;
    if (heads) s.n_head = heads;
    if (kv) s.n_head_kv = kv;
    if (vocab) s.n_vocab = vocab;
    if (ctx) s.n_ctx = ctx;
    if (head_dim && !llama) {
        qi_cli_error(cmd, "--head-dim: %s models have heads of n_embd / n_head", s.arch);
        return QI_EXIT_USAGE;
    }
    if (swa >= 0 && !gemma) {
        qi_cli_error(cmd, "--sliding-window: only gemma3 models have local layers (preset %s is %s)", base->name,
                     s.arch);
        return QI_EXIT_USAGE;
    }
    if (head_dim) s.head_dim = head_dim;
    if (swa >= 0) s.n_swa = swa;
    if (gemma && s.n_vocab < 262) {
        qi_cli_error(cmd, "a gemma3 vocabulary needs at least 262 tokens (6 special, 256 bytes), not %d", s.n_vocab);
        return QI_EXIT_USAGE;
    }
    if (s.n_embd % s.n_head || s.n_head % s.n_head_kv) {
        qi_cli_error(cmd, "the heads must divide: n_embd %d by n_head %d, n_head by n_head_kv %d", s.n_embd, s.n_head,
                     s.n_head_kv);
        return QI_EXIT_USAGE;
    }
    const int D = s.head_dim ? s.head_dim : s.n_embd / s.n_head;
    if (D % 2 || D > 1024) {
        qi_cli_error(cmd, "head size %d (%s) must be even and at most 1024", D,
                     s.head_dim ? "--head-dim" : "n_embd / n_head");
        return QI_EXIT_USAGE;
    }
    const int Dq = s.n_head * D; /* the queries' width: n_embd unless the heads have a size of their own */
    const int64_t blk = qi_type_get(t)->blck;
    if (s.n_embd % blk || s.n_ff % blk || Dq % blk) {
        qi_cli_error(cmd, "n_embd %d, n_ff %d and n_head x head size %d must be multiples of %s's block of %lld",
                     s.n_embd, s.n_ff, Dq, qi_type_get(t)->name, (long long)blk);
        return QI_EXIT_USAGE;
    }

    /* fail before the work, not after it: the output's folder must be writable */
    {
        char dir[1024];
        snprintf(dir, sizeof dir, "%s", out);
        char *slash = strrchr(dir, '/');
        if (slash == dir) dir[1] = 0;
        else if (slash) *slash = 0;
        else snprintf(dir, sizeof dir, ".");
        if (access(dir, W_OK) != 0) {
            qi_cli_error(cmd, "cannot write %s: folder %s is missing or not writable", out, dir);
            return 1;
        }
    }
    qi_err err = {0};
    qi_status st = QI_OK;
    uint64_t rng = 0x9e3779b97f4a7c15ull ^ seed, bytes = 0;
    char **toks = NULL, *store = NULL;
    int32_t *types = NULL;
    float *scores = NULL;
    qi_gguf_writer *w = qi_gguf_writer_create();
    toks = qi_calloc((size_t)s.n_vocab, sizeof *toks);
    store = qi_malloc((size_t)s.n_vocab * SLOT);
    types = qi_malloc(sizeof *types * (size_t)s.n_vocab);
    scores = qi_malloc(sizeof *scores * (size_t)s.n_vocab);
    if (!w || !toks || !store || !types || !scores) {
        st = QI_ERR(&err, QI_ERR_NOMEM, "out of memory");
        goto done;
    }
    const double params = (double)s.n_vocab * s.n_embd * (s.tied ? 1 : 2) +
                          (double)s.n_layer * ((double)s.n_embd * (Dq + 2.0 * s.n_head_kv * D + Dq) +
                                               (llama ? 3.0 : 2.0) * s.n_embd * s.n_ff);
    char label[32], name[96];
    if (params >= 1e9) snprintf(label, sizeof label, "%.1fB", params / 1e9);
    else snprintf(label, sizeof label, "%.0fM", params / 1e6);
    snprintf(name, sizeof name, "synthetic %s-shaped (%s)", base->name, shapes ? "shapes only" : "random weights");
    qi_gguf_writer_set_str(w, "general.architecture", s.arch);
    qi_gguf_writer_set_str(w, "general.name", name);
    qi_gguf_writer_set_str(w, "general.size_label", label);
    qi_gguf_writer_set_bool(w, "qinfer.synthetic", true);
    if (shapes) qi_gguf_writer_set_bool(w, "qinfer.shapes_only", true);
    /* llama.cpp's file-type ids, which name the type in bench's model column */
    const uint32_t ftype = t == QI_TYPE_F16    ? 1
                           : t == QI_TYPE_Q4_0 ? 2
                           : t == QI_TYPE_Q4_1 ? 3
                           : t == QI_TYPE_Q8_0 ? 7
                           : t == QI_TYPE_Q4_K ? 14
                                               : 18;
    qi_gguf_writer_set_u32(w, "general.file_type", ftype);
    char key[96];
#define AKEY(suffix) (snprintf(key, sizeof key, "%s.%s", s.arch, suffix), key)
    qi_gguf_writer_set_u32(w, AKEY("embedding_length"), (uint32_t)s.n_embd);
    qi_gguf_writer_set_u32(w, AKEY("block_count"), (uint32_t)s.n_layer);
    qi_gguf_writer_set_u32(w, AKEY("feed_forward_length"), (uint32_t)s.n_ff);
    qi_gguf_writer_set_u32(w, AKEY("attention.head_count"), (uint32_t)s.n_head);
    qi_gguf_writer_set_u32(w, AKEY("attention.head_count_kv"), (uint32_t)s.n_head_kv);
    qi_gguf_writer_set_u32(w, AKEY("context_length"), (uint32_t)s.n_ctx);
    if (llama) {
        qi_gguf_writer_set_f32(w, AKEY("attention.layer_norm_rms_epsilon"), gemma || qwen2 ? 1e-6f : 1e-5f);
    } else {
        qi_gguf_writer_set_f32(w, AKEY("attention.layer_norm_epsilon"), 1e-5f);
    }
    if (strcmp(s.arch, "opt")) { /* opt has learned positions, no RoPE */
        qi_gguf_writer_set_f32(w, AKEY("rope.freq_base"), s.rope_base);
        qi_gguf_writer_set_u32(w, AKEY("rope.dimension_count"), (uint32_t)D);
    }
    if (s.head_dim) { /* heads of their own size: the loader's n_embd / n_head default does not hold */
        qi_gguf_writer_set_u32(w, AKEY("attention.key_length"), (uint32_t)D);
        qi_gguf_writer_set_u32(w, AKEY("attention.value_length"), (uint32_t)D);
    }
    if (gemma) {
        qi_gguf_writer_set_u32(w, AKEY("attention.sliding_window"), (uint32_t)s.n_swa);
        qi_gguf_writer_set_f32(w, AKEY("rope.freq_base_swa"), s.rope_base_swa);
    }
#undef AKEY
    if (gemma) {
        /* SentencePiece as Gemma's: specials at Gemma's first ids, byte
         * tokens scored 0, the rest control tokens scored -1000 (no token
         * of two or more characters is normal, so no text ever merges) */
        static const char *const special[] = {"<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>",
                                              "<end_of_turn>"};
        const int n_special = (int)(sizeof special / sizeof special[0]);
        for (int i = 0; i < s.n_vocab; i++) {
            char *p = store + (size_t)i * SLOT;
            if (i < n_special) snprintf(p, SLOT, "%s", special[i]);
            else if (i < n_special + 256) snprintf(p, SLOT, "<0x%02X>", i - n_special);
            else snprintf(p, SLOT, "<unused%d>", i - n_special - 256);
            toks[i] = p;
            types[i] = i >= n_special && i < n_special + 256 ? 6 : 3; /* byte, else control (Gemma's <unk> too) */
            scores[i] = types[i] == 6 ? 0.0f : -1000.0f;
        }
        qi_gguf_writer_set_str(w, "tokenizer.ggml.model", "llama");
        qi_gguf_writer_set_str(w, "tokenizer.ggml.pre", "default");
        qi_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)toks, (uint64_t)s.n_vocab);
        qi_gguf_writer_set_arr(w, "tokenizer.ggml.scores", QI_GGUF_F32, scores, (uint64_t)s.n_vocab);
        qi_gguf_writer_set_arr(w, "tokenizer.ggml.token_type", QI_GGUF_I32, types, (uint64_t)s.n_vocab);
        qi_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 2);
        qi_gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 1);
        qi_gguf_writer_set_u32(w, "tokenizer.ggml.unknown_token_id", 3);
        qi_gguf_writer_set_u32(w, "tokenizer.ggml.padding_token_id", 0);
        qi_gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", true);
        qi_gguf_writer_set_bool(w, "tokenizer.ggml.add_eos_token", false);
        qi_gguf_writer_set_bool(w, "tokenizer.ggml.add_space_prefix", false);
    } else {
        for (int i = 0; i < s.n_vocab; i++) {
            char *p = store + (size_t)i * SLOT;
            if (i < 256) qi_tok_byte_char(i, p);
            else snprintf(p, SLOT, "<|s%d|>", i - 256);
            toks[i] = p;
            types[i] = i < 256 ? 1 : 3;
        }
        qi_gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2");
        qi_gguf_writer_set_str(w, "tokenizer.ggml.pre", "gpt-2");
        qi_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)toks, (uint64_t)s.n_vocab);
        qi_gguf_writer_set_arr(w, "tokenizer.ggml.token_type", QI_GGUF_I32, types, (uint64_t)s.n_vocab);
        const char *no_merges[1] = {""};
        qi_gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", no_merges, 0);
        qi_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 256);
        qi_gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 256);
    }

    const int kvw = s.n_head_kv * D;
    if ((st = add_matrix(w, "token_embd.weight", t, s.n_embd, s.n_vocab, &rng, shapes, &bytes, &err)) ||
        (!strcmp(s.arch, "opt") &&
         (st = add_matrix(w, "position_embd.weight", t, s.n_embd, s.n_ctx, &rng, shapes, &bytes, &err))) ||
        (st = add_matrix(w, "output_norm.weight", QI_TYPE_F32, s.n_embd, 1, &rng, shapes, &bytes, &err)) ||
        (!llama && (st = add_matrix(w, "output_norm.bias", QI_TYPE_F32, s.n_embd, 1, &rng, shapes, &bytes, &err))) ||
        (!s.tied && (st = add_matrix(w, "output.weight", t, s.n_embd, s.n_vocab, &rng, shapes, &bytes, &err))))
        goto done;
    const synth_tensor llama_t[] = {{"attn_norm.weight", s.n_embd, 1},   {"attn_q.weight", s.n_embd, Dq},
                   {"attn_k.weight", s.n_embd, kvw},    {"attn_v.weight", s.n_embd, kvw},
                   {"attn_output.weight", Dq, s.n_embd}, {"ffn_norm.weight", s.n_embd, 1},
                   {"ffn_gate.weight", s.n_embd, s.n_ff}, {"ffn_up.weight", s.n_embd, s.n_ff},
                   {"ffn_down.weight", s.n_ff, s.n_embd},
                   /* gemma3's: per-head QK-norm, the norms after attention and after the FFN */
                   {"attn_q_norm.weight", D, 1}, {"attn_k_norm.weight", D, 1},
                   {"post_attention_norm.weight", s.n_embd, 1}, {"post_ffw_norm.weight", s.n_embd, 1}},
      opt_t[] = {{"attn_norm.weight", s.n_embd, 1},  {"attn_norm.bias", s.n_embd, 1},
                 {"attn_q.weight", s.n_embd, s.n_embd}, {"attn_q.bias", s.n_embd, 1},
                 {"attn_k.weight", s.n_embd, kvw},   {"attn_k.bias", kvw, 1},
                 {"attn_v.weight", s.n_embd, kvw},   {"attn_v.bias", kvw, 1},
                 {"attn_output.weight", s.n_embd, s.n_embd}, {"attn_output.bias", s.n_embd, 1},
                 {"ffn_norm.weight", s.n_embd, 1},   {"ffn_norm.bias", s.n_embd, 1},
                 {"ffn_up.weight", s.n_embd, s.n_ff}, {"ffn_up.bias", s.n_ff, 1},
                 {"ffn_down.weight", s.n_ff, s.n_embd}, {"ffn_down.bias", s.n_embd, 1}},
      falcon_t[] = {{"attn_norm.weight", s.n_embd, 1},   {"attn_norm.bias", s.n_embd, 1},
                    {"attn_norm_2.weight", s.n_embd, 1}, {"attn_norm_2.bias", s.n_embd, 1},
                    {"attn_qkv.weight", s.n_embd, s.n_embd + 2 * kvw}, {"attn_output.weight", s.n_embd, s.n_embd},
                    {"ffn_up.weight", s.n_embd, s.n_ff}, {"ffn_down.weight", s.n_ff, s.n_embd}},
      qwen2_t[] = {{"attn_q.bias", Dq, 1}, {"attn_k.bias", kvw, 1}, {"attn_v.bias", kvw, 1}};
    const bool opt = !strcmp(s.arch, "opt");
    const size_t n_t = llama ? sizeof llama_t / sizeof llama_t[0] - (gemma ? 0 : 4)
                       : opt ? sizeof opt_t / sizeof opt_t[0]
                             : sizeof falcon_t / sizeof falcon_t[0];
    for (int l = 0; l < s.n_layer; l++) {
        for (size_t i = 0; i < n_t; i++) {
            const synth_tensor *x = llama ? &llama_t[i] : opt ? &opt_t[i] : &falcon_t[i];
            char tn[64];
            snprintf(tn, sizeof tn, "blk.%d.%s", l, x->name);
            if ((st = add_matrix(w, tn, x->rows == 1 ? QI_TYPE_F32 : t, x->cols, x->rows, &rng, shapes, &bytes,
                                 &err)))
                goto done;
        }
        for (size_t i = 0; qwen2 && i < sizeof qwen2_t / sizeof qwen2_t[0]; i++) {
            char tn[64];
            snprintf(tn, sizeof tn, "blk.%d.%s", l, qwen2_t[i].name);
            if ((st = add_matrix(w, tn, QI_TYPE_F32, qwen2_t[i].cols, 1, &rng, shapes, &bytes, &err))) goto done;
        }
        if (l % 8 == 7 || l == s.n_layer - 1)
            fprintf(stderr, "qinfer synth: %d/%d layers, %.1f MiB\n", l + 1, s.n_layer, bytes / 1048576.0);
    }
    if ((st = qi_gguf_writer_to_file(w, 3, out, &err))) goto done;
    fprintf(stderr, "qinfer synth: wrote %s: %s, %s parameters, %s, %.1f MiB of weights\n", out, name, label,
            qi_type_get(t)->name, bytes / 1048576.0);
done:
    qi_gguf_writer_free(w);
    qi_free(toks);
    qi_free(store);
    qi_free(types);
    qi_free(scores);
    return st ? qi_cli_fail(cmd, &err) : 0;
}

/* sim_published.c - published GPU measurements as simulated workloads
 * (qinfer/sim_published.h).
 *
 * A published figure names its GPU, model, weights and test in words
 * ("NVIDIA GeForce RTX 4090", "Llama-2-7B", "Q4_0", "tg128"); the tables
 * below turn those words into a hardware profile, a synth preset and type,
 * and a workload timed by qi_calib_measure, so that a simulated figure is
 * the same quantity the publication measured:
 *   - llama-bench's ppN: one prompt of N tokens, N / its time;
 *   - llama-bench's tgN: N tokens generated from an empty context, whose
 *     mean context is N/2: 1 / the step time at context N/2;
 *   - "decode (N tokens after a ~P-token prompt)": the same at P + N/2;
 *   - "prompt (~P tokens)": as ppP;
 *   - FlexGen's "generation throughput, prompt P, generate G" at effective
 *     batch B: B x G generated tokens over the prefill of B prompts and G
 *     decode steps at context P, under FlexGen's policy run as its block
 *     schedule (engine/engine_zigzag.c): "all on GPU" is one GPU batch of
 *     B; an offloaded row takes its policy from the input row after it
 *     (`--percent WG WC CG CC HG HC --gpu-batch-size N --num-gpu-batches
 *     K`): the last WG% of the layers held on the GPU, the others streamed
 *     to it, their attention's KV on the host (split 1 - CG%) where
 *     CG < 100, the head on the host unless WG is 100, and the prefill in
 *     steps of BLOCK_CHUNK tokens a sequence (each a block of all B), so
 *     that one GPU batch's activations (fp32 here, fp16 in FlexGen) fit
 *     beside the held weights; while the plan does not fit the GPU a held
 *     layer is streamed instead.
 * -ngl N in the settings is the plan (ngl=N); none, all on the GPU.
 */
#include "qinfer/sim_published.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qinfer/types.h"

#define ALL_LAYERS 100000
#define BLOCK_CHUNK 32 /* prompt tokens a sequence per prefill step of an offloaded FlexGen row */

/* hardware words -> profile; the first match wins, so longer names first */
static const struct {
    const char *words, *profile;
} k_gpus[] = {
    {"RTX 3090 Ti", "rtx3090ti-desktop"},
    {"RTX 3090", "rtx3090-desktop"},
    {"RTX 3060", "rtx3060-desktop"},
    {"RTX 2080 Ti", "rtx2080ti-desktop"},
    {"RTX 4090", "rtx4090-desktop"},
    {"RTX 5090", "rtx5090-desktop"},
    {"RTX 6000 Ada", "rtx6000-ada-desktop"},
    {"RTX A6000", "rtx-a6000-desktop"},
    /* the 80GB A100s whose form factor the publication does not state:
     * the PCIe card (the more common single-GPU machine) */
    {"A100 80GB SXM", "a100-80gb-sxm"},
    {"A100 40GB SXM", "a100-40gb-sxm"},
    {"A100 40GB", "a100-40gb-pcie"},
    {"A100 80GB", "a100-pcie-2xeon"},
    {"A100", "a100-pcie-2xeon"},
    {"H100 PCIe", "h100-pcie"},
    {"H100", "h100-sxm-dgx"},
    {"H200", "h200-sxm-pcie5"},
    {"L40S", "l40s"},
    {"L40", "l40"},
    {"L4", "l4-cloud-vm"},
    {"A10", "a10-cloud-vm"},
    {"A30", "a30"},
    {"A40", "a40"},
    {"V100", "v100-sxm2-dgx1"},
    {"P40", "p40"},
    {"P100", "p100-pcie"},
    {"T4", "t4-cloud-vm"},
};

static const struct {
    const char *words, *preset;
} k_models[] = {
    {"Llama-2-7B", "llama-7b"},   {"LLaMA-2-7B", "llama-7b"},   {"Llama-2-13B", "llama-2-13b"},
    {"Llama-2-70B", "llama-2-70b"}, {"LLaMA-2-70B", "llama-2-70b"}, {"OPT-6.7B", "opt-6.7b"},
    {"OPT-30B", "opt-30b"},       {"OPT-175B", "opt-175b"},
};

static const struct {
    const char *words, *type;
} k_types[] = {{"Q4_0", "q4_0"}, {"Q4_1", "q4_1"}, {"Q8_0", "q8_0"}, {"FP16", "f16"}, {"F16", "f16"}};

/* The first whole-word match of words in s: a match followed by a letter
 * or digit is not one ("L4" in "L40"). */
static bool has_word(const char *s, const char *w) {
    const size_t n = strlen(w);
    for (const char *p = strstr(s, w); p; p = strstr(p + 1, w)) {
        const char c = p[n], b = p > s ? p[-1] : ' ';
        const bool alnum_after = (c >= '0' && c <= '9') || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z');
        const bool alnum_before = (b >= '0' && b <= '9') || (b >= 'A' && b <= 'Z') || (b >= 'a' && b <= 'z');
        if (!alnum_after && !alnum_before) return true;
    }
    return false;
}

/* The integer after `key` in s ("-ngl 99", "batch 144"), or -1. */
static long int_after(const char *s, const char *key) {
    const char *p = strstr(s, key);
    if (!p) return -1;
    p += strlen(key);
    while (*p == ' ' || *p == '=' || *p == '~') p++;
    char *end;
    const long v = strtol(p, &end, 10);
    return end == p ? -1 : v;
}

void qi_pub_resolve(qi_pub_row *r) {
    r->ok = false;
    r->why[0] = 0;
    r->profile = r->preset = r->type = NULL;
    r->batch = 1;
    r->n_gen = 0;
    r->ngl = ALL_LAYERS;
    r->flash_attn = strstr(r->test, "flash attention") || strstr(r->settings, "-fa 1");
    for (size_t i = 0; i < sizeof k_gpus / sizeof k_gpus[0] && !r->profile; i++)
        if (has_word(r->hardware, k_gpus[i].words)) r->profile = k_gpus[i].profile;
    for (size_t i = 0; i < sizeof k_models / sizeof k_models[0] && !r->preset; i++)
        if (!strcmp(r->model, k_models[i].words)) r->preset = k_models[i].preset;
    for (size_t i = 0; i < sizeof k_types / sizeof k_types[0] && !r->type; i++)
        if (!strcmp(r->weights, k_types[i].words)) r->type = k_types[i].type;
    if (!r->profile) return (void)snprintf(r->why, sizeof r->why, "no profile for the hardware");
    if (!r->preset) return (void)snprintf(r->why, sizeof r->why, "no model shape for %s", r->model);
    if (!r->type) return (void)snprintf(r->why, sizeof r->why, "weights %s not known", r->weights);
    const long ngl = int_after(r->settings, "-ngl");
    if (ngl >= 0) r->ngl = ngl > ALL_LAYERS ? ALL_LAYERS : (int)ngl;
    long v;
    if (!strncmp(r->test, "pp", 2) && (v = strtol(r->test + 2, NULL, 10)) > 0) {
        r->kind = QI_PUB_PP;
        r->n_tokens = (int)v;
    } else if (!strncmp(r->test, "tg", 2) && (v = strtol(r->test + 2, NULL, 10)) > 0) {
        r->kind = QI_PUB_TG;
        r->ctx = (int)(v / 2 > 0 ? v / 2 : 1);
    } else if (!strncmp(r->test, "decode", 6) && (v = int_after(r->test, "(")) > 0) {
        const long p = int_after(r->test, "after a");
        r->kind = QI_PUB_TG;
        r->ctx = (int)((p > 0 ? p : 0) + v / 2);
    } else if (!strncmp(r->test, "prompt", 6) && (v = int_after(r->test, "(")) > 0) {
        r->kind = QI_PUB_PP;
        r->n_tokens = (int)v;
    } else if (strstr(r->test, "generation throughput") && (v = int_after(r->test, "prompt")) > 0) {
        r->kind = QI_PUB_GEN;
        r->n_tokens = (int)v;
        r->ctx = (int)v;
        r->n_gen = (int)int_after(r->test, "generate");
        const long b = int_after(r->settings, "effective batch");
        r->batch = b > 0 ? (int)b : 1;
        if (r->n_gen < 1) return (void)snprintf(r->why, sizeof r->why, "no generated length");
        if (strstr(r->settings, "all on GPU")) { /* one GPU batch, everything on the GPU */
            r->gpu_batch = r->batch;
            r->n_gpu_batches = 1;
            r->w_gpu = r->c_gpu = 1.0;
        } else if (r->gpu_batch < 1) {
            return (void)snprintf(r->why, sizeof r->why,
                                  "FlexGen's offload needs its policy (--percent, --gpu-batch-size, "
                                  "--num-gpu-batches) in the input row after it");
        }
        r->offload = r->n_gpu_batches > 1 || r->w_gpu < 1.0 || r->c_gpu < 1.0;
    } else {
        return (void)snprintf(r->why, sizeof r->why, "test '%s' not known", r->test);
    }
    r->ok = true;
}

/* FlexGen's policy in text (`--percent WG WC CG CC HG HC --gpu-batch-size
 * N --num-gpu-batches K`) into r; whether it was there whole. */
static bool flexgen_policy(qi_pub_row *r, const char *text) {
    const char *p = strstr(text, "--percent");
    double pc[6];
    int n = 0;
    if (p) n = sscanf(p, "--percent %lf %lf %lf %lf %lf %lf", &pc[0], &pc[1], &pc[2], &pc[3], &pc[4], &pc[5]);
    const long g = int_after(text, "--gpu-batch-size"), k = int_after(text, "--num-gpu-batches");
    if (n != 6 || g < 1 || k < 1 || !(pc[0] >= 0 && pc[0] <= 100 && pc[2] >= 0 && pc[2] <= 100)) return false;
    r->w_gpu = pc[0] / 100.0;
    r->c_gpu = pc[2] / 100.0;
    r->gpu_batch = (int)g;
    r->n_gpu_batches = (int)k;
    return true;
}

/* ---- the table --------------------------------------------------------------------- */

static void copy_field(char *dst, size_t cap, const char *src) {
    const size_t n = strlen(src) < cap - 1 ? strlen(src) : cap - 1;
    memmove(dst, src, n);
    dst[n] = 0;
}

qi_status qi_pub_load(const char *path, qi_pub_row **rows, int *n, qi_err *err) {
    *rows = NULL;
    *n = 0;
    FILE *f = fopen(path, "r");
    if (!f) return QI_ERR(err, QI_ERR_IO, "%s: cannot open the published rows: %s", path, strerror(errno));
    qi_pub_row *v = NULL;
    int cap = 0, k = 0, ln = 0;
    char line[4096];
    qi_status st = QI_OK;
    while (!st && fgets(line, sizeof line, f)) {
        ln++;
        line[strcspn(line, "\r\n")] = 0;
        if (!line[0] || line[0] == '#' || !strncmp(line, "use\t", 4)) continue;
        char *col[10];
        int nc = 0;
        for (char *p = line; nc < 10;) {
            col[nc++] = p;
            char *t = strchr(p, '\t');
            if (!t) break;
            *t = 0;
            p = t + 1;
        }
        if (nc != 10) {
            st = QI_ERR(err, QI_ERR_FORMAT, "%s:%d: %d columns, want 10 (use system model weights hardware test "
                        "value unit settings source)", path, ln, nc);
            break;
        }
        if (k == cap) {
            cap = cap ? 2 * cap : 32;
            qi_pub_row *nv = qi_realloc(v, sizeof *v * (size_t)cap);
            if (!nv) {
                st = QI_ERR(err, QI_ERR_NOMEM, "out of memory");
                break;
            }
            v = nv;
        }
        qi_pub_row *r = &v[k];
        memset(r, 0, sizeof *r);
        r->line = ln;
        copy_field(r->use, sizeof r->use, col[0]);
        copy_field(r->system, sizeof r->system, col[1]);
        copy_field(r->model, sizeof r->model, col[2]);
        copy_field(r->weights, sizeof r->weights, col[3]);
        copy_field(r->hardware, sizeof r->hardware, col[4]);
        copy_field(r->test, sizeof r->test, col[5]);
        copy_field(r->unit, sizeof r->unit, col[7]);
        /* "same": the row above's */
        copy_field(r->settings, sizeof r->settings, !strcmp(col[8], "same") && k ? v[k - 1].settings : col[8]);
        if (!strcmp(col[8], "-fa 1") && k) { /* a flag on top of the row above's command */
            copy_field(r->settings, sizeof r->settings - 8, v[k - 1].settings);
            strcat(r->settings, "; -fa 1");
        }
        copy_field(r->source, sizeof r->source, !strcmp(col[9], "same") && k ? v[k - 1].source : col[9]);
        char *end;
        errno = 0;
        r->value = strtod(col[6], &end);
        const bool fact = !strcmp(r->use, "input") || !strcmp(r->use, "target");
        if (!fact && (end == col[6] || *end || errno || !(r->value > 0))) {
            st = QI_ERR(err, QI_ERR_FORMAT, "%s:%d: value '%s' is not a positive number", path, ln, col[6]);
            break;
        }
        if (fact) r->value = NAN;
        /* FlexGen's policy, in the value of the input row after its generation row */
        if (fact && k > 0 && strstr(v[k - 1].settings, "policy in the next row") && flexgen_policy(&v[k - 1], col[6]))
            qi_pub_resolve(&v[k - 1]);
        if (fact) {
            r->ok = false;
            snprintf(r->why, sizeof r->why, "an %s row, not a measurement to predict", r->use);
        } else {
            qi_pub_resolve(r);
        }
        k++;
    }
    fclose(f);
    if (st) {
        qi_free(v);
        return st;
    }

    *rows = v;
    *n = k;
    return QI_OK;
}

/* ---- simulating a row ---------------------------------------------------------------- */

/* FlexGen's policy of row r as a plan over cpu,gpu with `held` of its
 * layers on the GPU (the last ones), the others streamed. */
static void flexgen_plan(const qi_pub_row *r, int held, qi_plan *p) {
    const int L = p->n_layer;
    const float split = (float)(round((1.0 - r->c_gpu) * 100.0) / 100.0);
    for (int l = 0; l < L; l++)
        p->layers[l] = (qi_plan_layer){.attn_dev = 1, .mlp_dev = 1, .stream = l < L - held, .split = split,
                                       .split_dev = split > 0.0f ? 0 : -1, .ffn_dev = -1};
    p->head_dev = r->w_gpu >= 1.0 ? 1 : 0;
    p->gpu_batch = r->gpu_batch;
}

/* A generation row's prefill and decode under FlexGen's policy as a block
 * schedule (the top of the file); while the plan does not fit the GPU, one
 * held layer fewer. */
static qi_status flexgen_run(const qi_pub_row *r, const qi_model *m, const qi_engine_opts *o, qi_calib_time *t,
                             qi_err *err) {
    qi_engine_opts eo = *o;
    qi_plan p = {0};
    qi_status st = qi_plan_devices_parse("cpu,gpu", &p, err);
    if (!st) st = qi_plan_all_host(m->hp.n_layer, &p, err);
    if (st) return st;
    const int L = m->hp.n_layer, chunk = r->n_gpu_batches > 1 && r->n_tokens > BLOCK_CHUNK ? BLOCK_CHUNK : r->n_tokens;
    eo.step_tokens = r->batch * chunk;
    eo.plan = &p;
    for (int held = (int)lround(r->w_gpu * L);; held--) {
        flexgen_plan(r, held, &p);
        qi_err e = {0};
        st = qi_calib_measure(m, &eo, r->batch, r->n_tokens, 1, t, &e);
        if (st != QI_ERR_NOMEM || held == 0) {
            if (st) QI_ERR(err, st, "%s", e.msg);
            break;
        }
    }
    qi_plan_free(&p);
    return st;
}

qi_status qi_pub_simulate(const qi_pub_row *r, const qi_model *m, const qi_engine_opts *o, double *tok_s,
                          qi_err *err) {
    *tok_s = NAN;
    if (!r->ok) return QI_ERR(err, QI_ERR_INVALID, "published row %d: not simulated: %s", r->line, r->why);
    qi_engine_opts eo = *o;
    char plan[32];
    snprintf(plan, sizeof plan, "ngl=%d", r->ngl);
    eo.devices = "cpu,gpu";
    eo.placement = plan;
    qi_calib_time t;
    qi_status st;
    switch (r->kind) {
    case QI_PUB_PP:
        if ((st = qi_calib_measure(m, &eo, 1, r->n_tokens, 1, &t, err))) return st;
        *tok_s = r->n_tokens / t.prefill_s;
        break;
    case QI_PUB_TG:
        if ((st = qi_calib_measure(m, &eo, 1, r->ctx, 1, &t, err))) return st;
        *tok_s = 1 / t.decode_s;
        break;
    case QI_PUB_GEN:
        if ((st = flexgen_run(r, m, &eo, &t, err))) return st;
        *tok_s = (double)r->batch * r->n_gen / (t.prefill_s + r->n_gen * t.decode_s);
        break;
    }
    return QI_OK;
}

qi_status qi_pub_predict(void *vset, const char *const *keys, const double *values, int n_keys, double *pred,
                         qi_err *err) {
    const qi_pub_set *s = vset;
    qi_params sp;
    qi_status st = qi_calib_params(&sp, keys, values, n_keys, err);
    if (st) return st;
    for (int i = 0; i < s->n; i++) {
        qi_engine_opts o = *s->base;
        o.sim = s->profiles[i];
        o.sim_params = &sp;
        double ts;
        st = qi_pub_simulate(s->rows[i], s->models[i], &o, &ts, err);
        if (st) return st;
        pred[i] = 1 / ts;
    }
    return QI_OK;
}

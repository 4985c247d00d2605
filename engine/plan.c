/* plan.c - placement plans (qinfer/plan.h): the device list, the
 * --placement forms, validation, the plan as text and JSON, and the
 * weight blocks a plan places with their sizes (what placement policies
 * check a plan against a device's memory with). */
#include "qinfer/plan.h"
#include "qinfer/model.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdbool.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void qi_plan_free(qi_plan *p) {
    if (!p) return;
    qi_free(p->layers);
    p->layers = NULL;
    p->n_layer = 0;
}

qi_status qi_plan_copy(qi_plan *dst, const qi_plan *src, qi_err *err) {
    qi_plan c = *src;
    c.layers = qi_malloc(sizeof *c.layers * (size_t)(src->n_layer > 0 ? src->n_layer : 1));
    if (!c.layers) return QI_ERR(err, QI_ERR_NOMEM, "out of memory copying a plan of %d layers", src->n_layer);
    if (src->n_layer > 0) memcpy(c.layers, src->layers, sizeof *c.layers * (size_t)src->n_layer);
    *dst = c;
    return QI_OK;
}

static bool name_ok(const char *s, size_t n) {
    if (n == 0 || n >= QI_PLAN_DEV_NAME) return false;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)s[i]) && s[i] != '_' && s[i] != '-' && s[i] != ':') return false;
    return true;
}

qi_status qi_plan_devices_parse(const char *spec, qi_plan *p, qi_err *err) {
    int n = 0;
    char names[QI_PLAN_MAX_DEVICES][QI_PLAN_DEV_NAME];
    for (const char *s = spec;;) {
        const char *e = strchr(s, ',');
        const size_t len = e ? (size_t)(e - s) : strlen(s);
        if (!name_ok(s, len))
            return QI_ERR(err, QI_ERR_INVALID, "devices '%s': '%.*s' is not a device name (letters, digits, _ - :)",
                          spec, (int)len, s);
        if (n == QI_PLAN_MAX_DEVICES)
            return QI_ERR(err, QI_ERR_INVALID, "devices '%s': more than %d devices", spec, QI_PLAN_MAX_DEVICES);
        memcpy(names[n], s, len);
        names[n][len] = 0;
        if (strcmp(names[n], "embd") == 0 || strcmp(names[n], "head") == 0 || strcmp(names[n], "gpu_batch") == 0)
            return QI_ERR(err, QI_ERR_INVALID, "devices '%s': '%s' is a word of the plan file, not a device name", spec,
                          names[n]);
        for (int i = 0; i < n; i++)
            if (strcmp(names[i], names[n]) == 0)
                return QI_ERR(err, QI_ERR_INVALID, "devices '%s': '%s' named twice", spec, names[n]);
        n++;
        if (!e) break;
        s = e + 1;
    }
    if (strcmp(names[0], "cpu") != 0)
        return QI_ERR(err, QI_ERR_INVALID, "devices '%s': the first device must be cpu (the host)", spec);
    p->n_devices = n;
    memcpy(p->devices, names, sizeof names);
    return QI_OK;
}

static qi_status alloc_layers(int n_layer, qi_plan *p, qi_err *err) {
    if (n_layer < 1 || n_layer > 4096) return QI_ERR(err, QI_ERR_INVALID, "plan for %d layers", n_layer);
    if (p->n_devices < 1) {
        p->n_devices = 1;
        strcpy(p->devices[0], "cpu");
    }
    qi_free(p->layers);
    p->layers = qi_calloc((size_t)n_layer, sizeof *p->layers);
    if (!p->layers) return QI_ERR(err, QI_ERR_NOMEM, "out of memory for a plan of %d layers", n_layer);
    p->n_layer = n_layer;
    p->embd_dev = p->head_dev = 0;
    p->gpu_batch = 0;
    for (int l = 0; l < n_layer; l++)
        p->layers[l] = (qi_plan_layer){.attn_dev = 0, .mlp_dev = 0, .split = 0.0f, .split_dev = -1, .ffn_dev = -1};
    return QI_OK;
}

qi_status qi_plan_all_host(int n_layer, qi_plan *p, qi_err *err) { return alloc_layers(n_layer, p, err); }

qi_status qi_plan_validate(const qi_plan *p, qi_err *err) {
    const int nd = p->n_devices;
    if (nd < 1 || nd > QI_PLAN_MAX_DEVICES) return QI_ERR(err, QI_ERR_INVALID, "plan has %d devices", nd);
    if (p->gpu_batch < 0) return QI_ERR(err, QI_ERR_INVALID, "plan: GPU batch of %d sequences", p->gpu_batch);
    if (p->embd_dev < 0 || p->embd_dev >= nd || p->head_dev < 0 || p->head_dev >= nd)
        return QI_ERR(err, QI_ERR_INVALID, "plan: embedding or output head on device %d of %d",
                      p->embd_dev < 0 || p->embd_dev >= nd ? p->embd_dev : p->head_dev, nd);
    for (int l = 0; l < p->n_layer; l++) {
        const qi_plan_layer *y = &p->layers[l];
        if (y->attn_dev < 0 || y->attn_dev >= nd || y->mlp_dev < 0 || y->mlp_dev >= nd)
            return QI_ERR(err, QI_ERR_INVALID, "plan layer %d: device %d out of range 0..%d", l,
                          y->attn_dev < 0 || y->attn_dev >= nd ? y->attn_dev : y->mlp_dev, nd - 1);
        if (!(y->split >= 0.0f && y->split <= 1.0f))
            return QI_ERR(err, QI_ERR_INVALID, "plan layer %d: split ratio %g outside [0, 1]", l, y->split);
        if (y->split > 0.0f && (y->split_dev < 0 || y->split_dev >= nd || y->split_dev == y->attn_dev))
            return QI_ERR(err, QI_ERR_INVALID, "plan layer %d: split attention needs a second device (got %d)", l,
                          y->split_dev);
        if (y->split == 0.0f && y->split_dev != -1)
            return QI_ERR(err, QI_ERR_INVALID, "plan layer %d: a split device without a split ratio", l);
        if (y->ffn_dev == -1 ? y->ffn_rows != 0
                             : y->ffn_dev < 1 || y->ffn_dev >= nd || y->ffn_dev == y->mlp_dev || y->ffn_rows < 1)
            return QI_ERR(err, QI_ERR_INVALID, "plan layer %d: a neuron split of %d neurons on device %d (it needs a "
                          "device after the cpu other than the MLP's, and neurons)", l, y->ffn_rows, y->ffn_dev);
        if (y->stream && (y->attn_dev != y->mlp_dev || y->attn_dev == 0 || y->ffn_dev != -1))
            return QI_ERR(err, QI_ERR_INVALID, "plan layer %d: a streamed layer runs both its blocks on one device "
                          "other than the cpu, without a neuron split", l);
    }
    return QI_OK;
}

/* A device by name or index: "cuda" also names "cuda:2G" of --devices, so
 * one plan file serves every capacity cap. */
static int device_of(const qi_plan *p, const char *tok) {
    for (int i = 0; i < p->n_devices; i++)
        if (strcmp(p->devices[i], tok) == 0) return i;
    const size_t n = strlen(tok);
    for (int i = 0; i < p->n_devices; i++)
        if (strncmp(p->devices[i], tok, n) == 0 && p->devices[i][n] == ':') return i;
    char *end;
    errno = 0;
    const long v = strtol(tok, &end, 10);
    if (*tok && !*end && !errno && v >= 0 && v < p->n_devices) return (int)v;
    return -1;
}

static qi_status parse_file(const char *path, int n_layer, qi_plan *p, qi_err *err) {
    FILE *f = fopen(path, "r");
    if (!f)
        return QI_ERR(err, QI_ERR_IO, "placement '%s': not all-cpu or ngl=N, and not a readable plan file (%s)", path,
                      strerror(errno));
    qi_status st = alloc_layers(n_layer, p, err);
    char line[512];
    int lineno = 0, l = 0;
    while (!st && fgets(line, sizeof line, f)) {
        lineno++;
        if (!strchr(line, '\n') && !feof(f)) {
            st = QI_ERR(err, QI_ERR_FORMAT, "%s:%d: line longer than %zu bytes", path, lineno, sizeof line - 2);
            break;
        }
        char *hash = strchr(line, '#');
        if (hash) *hash = 0;
        char *tok[6];
        int nt = 0;
        for (char *s = strtok(line, " \t\r\n"); s; s = strtok(NULL, " \t\r\n")) {
            if (nt == 6) {
                st = QI_ERR(err, QI_ERR_FORMAT, "%s:%d: too many fields", path, lineno);
                break;
            }
            tok[nt++] = s;
        }
        if (st || nt == 0) continue;
        if (strcmp(tok[0], "gpu_batch") == 0) {
            char *end = NULL;
            errno = 0;
            const long n = nt == 2 ? strtol(tok[1], &end, 10) : -1;
            if (nt != 2 || *end || errno || n < 1 || n > 65536) {
                st = QI_ERR(err, QI_ERR_FORMAT, "%s:%d: 'gpu_batch' takes one count of sequences in 1..65536", path,
                            lineno);
                break;
            }
            p->gpu_batch = (int)n;
            continue;
        }
        if (strcmp(tok[0], "embd") == 0 || strcmp(tok[0], "head") == 0) {
            const int d = nt == 2 ? device_of(p, tok[1]) : -1;
            if (d < 0) {
                st = QI_ERR(err, QI_ERR_FORMAT, "%s:%d: '%s' takes one device (a name or index of %d devices)", path,
                            lineno, tok[0], p->n_devices);
                break;
            }
            *(tok[0][0] == 'e' ? &p->embd_dev : &p->head_dev) = d;
            continue;
        }
        if (l == n_layer) {
            st = QI_ERR(err, QI_ERR_FORMAT, "%s:%d: more layer lines than the model's %d layers", path, lineno,
                        n_layer);
            break;
        }
        if (nt < 2 || nt > 4) {
            st = QI_ERR(err, QI_ERR_FORMAT, "%s:%d: a layer line is ATTN MLP [SPLIT [SPLIT_DEV]]", path, lineno);
            break;
        }
        qi_plan_layer *y = &p->layers[l];
        const size_t n0 = strlen(tok[0]), n1 = strlen(tok[1]);
        const bool s0 = n0 > 1 && tok[0][n0 - 1] == '~', s1 = n1 > 1 && tok[1][n1 - 1] == '~';
        if (s0 != s1) {
            st = QI_ERR(err, QI_ERR_FORMAT, "%s:%d: a streamed layer marks both devices with '~' (ATTN~ MLP~)", path,
                        lineno);
            break;
        }
        if (s0) tok[0][n0 - 1] = tok[1][n1 - 1] = 0;
        y->stream = s0;
        y->attn_dev = device_of(p, tok[0]);
        y->mlp_dev = device_of(p, tok[1]);
        if (y->attn_dev < 0 || y->mlp_dev < 0) {
            st = QI_ERR(err, QI_ERR_FORMAT, "%s:%d: no device '%s' (devices: %d, first 'cpu')", path, lineno,
                        y->attn_dev < 0 ? tok[0] : tok[1], p->n_devices);
            break;
        }
        if (nt >= 3) {
            char *end;
            errno = 0;
            const double r = strtod(tok[2], &end);
            if (*end || errno || !(r >= 0.0 && r <= 1.0)) {
                st = QI_ERR(err, QI_ERR_FORMAT, "%s:%d: split ratio '%s' is not a number in [0, 1]", path, lineno,
                            tok[2]);
                break;
            }
            y->split = (float)r;
            if (r > 0.0) {
                y->split_dev = nt == 4 ? device_of(p, tok[3]) : p->n_devices == 2 ? 1 - y->attn_dev : -1;
                if (y->split_dev < 0 || y->split_dev == y->attn_dev) {
                    st = QI_ERR(err, QI_ERR_FORMAT, "%s:%d: split attention needs a second device%s", path, lineno,
                                nt == 4 ? " other than the attention's" : " (name it with more than two devices)");
                    break;
                }
            }
        }
        l++;
    }
    fclose(f);
    if (!st && l != n_layer)
        st = QI_ERR(err, QI_ERR_FORMAT, "%s: %d layer lines for a model of %d layers", path, l, n_layer);
    if (!st) st = qi_plan_validate(p, err);
    if (st) qi_plan_free(p);
    return st;
}

qi_status qi_plan_parse(const char *spec, int n_layer, qi_plan *p, qi_err *err) {
    if (strcmp(spec, "all-cpu") == 0) return alloc_layers(n_layer, p, err);
    if (strncmp(spec, "ngl=", 4) == 0) {
        char *end;
        errno = 0;
        const long n = strtol(spec + 4, &end, 10);
        /* N above the layers means every layer and the head, as llama.cpp's
         * -ngl 99 does, so its commands carry over */
        if (!spec[4] || *end || errno || n < 0 || n > INT_MAX)
            return QI_ERR(err, QI_ERR_INVALID,
                          "placement '%s': N must be an integer >= 0 (0..%d: that many last layers, the head "
                          "counting as one more; above %d: all of them, as llama.cpp's -ngl 99)",
                          spec, n_layer + 1, n_layer);
        if (n > 0 && p->n_devices < 2)
            return QI_ERR(err, QI_ERR_INVALID, "placement '%s' needs a second device (--devices cpu,NAME)", spec);
        qi_status st = alloc_layers(n_layer, p, err);
        if (st) return st;
        for (int l = n_layer - (n > n_layer ? n_layer : (int)n); l < n_layer; l++)
            p->layers[l].attn_dev = p->layers[l].mlp_dev = 1;
        if (n > n_layer) p->head_dev = 1;
        return QI_OK;
    }
    if (strncmp(spec, "policy:", 7) == 0)
        return QI_ERR(err, QI_ERR_UNSUPPORTED,
                      "placement '%s': a placement policy's plan is made by the command after the engine is "
                      "created (qinfer generate), not read here",
                      spec);
    return parse_file(spec, n_layer, p, err);
}

/* ---- as text ------------------------------------------------------------------------ */

typedef struct {
    char *buf;
    size_t len, at;
} out_buf;

static void put(out_buf *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(out_buf *o, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    const int n = vsnprintf(o->at < o->len ? o->buf + o->at : NULL, o->at < o->len ? o->len - o->at : 0, fmt, ap);
    va_end(ap);
    if (n > 0) o->at += (size_t)n;
}

/* N when the plan is exactly ngl=N over two or more devices, else -1. */
static int as_ngl(const qi_plan *p) {
    int n = 0;
    for (int l = 0; l < p->n_layer; l++) {
        const qi_plan_layer *y = &p->layers[l];
        if (y->split > 0.0f || y->attn_dev != y->mlp_dev || y->attn_dev > 1 || y->stream) return -1;
        if (y->attn_dev == 1) n++;
        else if (n > 0) return -1; /* device 1 must hold a suffix */
    }
    if (p->embd_dev != 0 || p->gpu_batch) return -1;
    for (int l = 0; l < p->n_layer; l++)
        if (p->layers[l].ffn_dev != -1) return -1;
    if (p->head_dev == 1) return n == p->n_layer ? n + 1 : -1;
    return p->head_dev == 0 ? n : -1;
}

int qi_plan_summary(const qi_plan *p, char *buf, size_t len) {
    out_buf o = {buf, len, 0};
    if (len) buf[0] = 0;
    const int n = as_ngl(p);
    if (n == 0)
        put(&o, "all-cpu");
    else if (n > 0)
        put(&o, "ngl=%d (%s)", n, p->devices[1]);
    else {
        int attn[QI_PLAN_MAX_DEVICES] = {0}, mlp[QI_PLAN_MAX_DEVICES] = {0}, split = 0, ffn = 0, fdev = 0, streamed = 0;
        long rows = 0;
        for (int l = 0; l < p->n_layer; l++) {
            attn[p->layers[l].attn_dev]++;
            mlp[p->layers[l].mlp_dev]++;
            split += p->layers[l].split > 0.0f;
            streamed += p->layers[l].stream;
            if (p->layers[l].ffn_dev > 0) ffn++, rows += p->layers[l].ffn_rows, fdev = p->layers[l].ffn_dev;
        }
        put(&o, "plan:");
        for (int d = 0; d < p->n_devices; d++) put(&o, " %s attn %d mlp %d;", p->devices[d], attn[d], mlp[d]);
        put(&o, " split layers %d;", split);
        if (streamed) put(&o, " streamed layers %d;", streamed);
        if (p->gpu_batch) put(&o, " block of GPU batches of %d;", p->gpu_batch);
        put(&o, " head %s", p->devices[p->head_dev]);
        if (ffn) put(&o, "; neuron split layers %d, %ld neurons on %s", ffn, rows, p->devices[fdev]);
    }
    return (int)o.at;
}

int qi_plan_format(const qi_plan *p, char *buf, size_t len) {
    out_buf o = {buf, len, 0};
    if (len) buf[0] = 0;
    put(&o, "# devices:");
    for (int d = 0; d < p->n_devices; d++) put(&o, " %d=%s", d, p->devices[d]);
    put(&o, "\n# layer: ATTN MLP SPLIT SPLIT_DEV\nembd %s\n", p->devices[p->embd_dev]);
    for (int l = 0; l < p->n_layer; l++) {
        const qi_plan_layer *y = &p->layers[l];
        put(&o, "%s%s %s%s", p->devices[y->attn_dev], y->stream ? "~" : "", p->devices[y->mlp_dev], y->stream ? "~" : "");
        if (y->split > 0.0f) put(&o, " %.9g %s", y->split, p->devices[y->split_dev]);
        put(&o, "   # layer %d", l);
        if (y->ffn_dev > 0) put(&o, ", %d FFN neurons on %s (a neuron split: not in the file format)", y->ffn_rows,
                                p->devices[y->ffn_dev]);
        put(&o, "\n");
    }
    put(&o, "head %s\n", p->devices[p->head_dev]);
    if (p->gpu_batch) put(&o, "gpu_batch %d\n", p->gpu_batch);
    return (int)o.at;
}

int qi_plan_json(const qi_plan *p, char *buf, size_t len) {
    out_buf o = {buf, len, 0};
    if (len) buf[0] = 0;
    put(&o, "{\"devices\":[");
    for (int d = 0; d < p->n_devices; d++) put(&o, "%s\"%s\"", d ? "," : "", p->devices[d]);
    put(&o, "],\"embd\":%d,\"head\":%d,\"layers\":[", p->embd_dev, p->head_dev);
    for (int l = 0; l < p->n_layer; l++) {
        const qi_plan_layer *y = &p->layers[l];
        put(&o, "%s[%d,%d", l ? "," : "", y->attn_dev, y->mlp_dev);
        if (y->split > 0.0f) put(&o, ",%.9g,%d", y->split, y->split_dev);
        if (y->stream) put(&o, "%s\"stream\"", y->split > 0.0f ? "," : ",0,-1,");
        put(&o, "]");
    }
    put(&o, "]");
    if (p->gpu_batch) put(&o, ",\"gpu_batch\":%d", p->gpu_batch);
    bool ffn = false;
    for (int l = 0; l < p->n_layer; l++) {
        const qi_plan_layer *y = &p->layers[l];
        if (y->ffn_dev < 1) continue;
        put(&o, "%s[%d,%d,%d]", ffn ? "," : ",\"ffn\":[", l, y->ffn_dev, y->ffn_rows);
        ffn = true;
    }
    put(&o, ffn ? "]}" : "}");
    return (int)o.at;
}

/* ---- weight blocks -------------------------------------------------------------------- */

int qi_plan_n_blocks(int n_layer) { return 2 * n_layer + 2; }

int qi_plan_block_dev(const qi_plan *p, int b) {
    if (b == 0) return p->embd_dev;
    if (b == 2 * p->n_layer + 1) return p->head_dev;
    const qi_plan_layer *y = &p->layers[(b - 1) / 2];
    return (b - 1) % 2 ? y->mlp_dev : y->attn_dev;
}

const char *qi_plan_block_name(int n_layer, int b, char *buf, size_t len) {
    if (b == 0) return "the token embedding";
    if (b == 2 * n_layer + 1) return "the output head";
    snprintf(buf, len, "layer %d's %s", (b - 1) / 2, (b - 1) % 2 ? "MLP" : "attention");
    return buf;
}

int qi_plan_block_weights(const qi_model *m, int b, const qi_weight **w, bool *matmul) {
    const int L = m->hp.n_layer;
    int n = 0;
#define W(w_, mm_) (w[n] = &(w_), matmul[n++] = (mm_))
    if (b < 0 || b > 2 * L + 1) return 0;
    if (b == 0) {
        W(m->tok_embd, false);
        W(m->pos_embd, false);
    } else if (b == 2 * L + 1) {
        W(m->out_norm, false);
        W(m->output, true);
        W(m->out_norm_b, false);
    } else if ((b - 1) % 2 == 0) {
        const qi_layer *y = &m->layers[(b - 1) / 2];
        W(y->attn_norm, false);
        W(y->wq, true);
        W(y->wk, true);
        W(y->wv, true);
        W(y->wo, true);
        W(y->q_norm, false);
        W(y->k_norm, false);
        W(y->attn_post_norm, false);
        W(y->attn_norm_b, false);
        W(y->bq, false);
        W(y->bk, false);
        W(y->bv, false);
        W(y->bo, false);
    } else {
        const qi_layer *y = &m->layers[(b - 1) / 2];
        W(y->ffn_norm, false);
        W(y->w_gate, true);
        W(y->w_up, true);
        W(y->w_down, true);
        W(y->ffn_post_norm, false);
        W(y->ffn_norm_b, false);
        W(y->b_up, false);
        W(y->b_down, false);
    }
#undef W
    return n;
}

size_t qi_plan_block_bytes(const qi_model *m, int b) {
    const qi_weight *w[QI_PLAN_BLOCK_MAX_WEIGHTS] = {0};
    bool mm[QI_PLAN_BLOCK_MAX_WEIGHTS];
    const int n = qi_plan_block_weights(m, b, w, mm);
    size_t total = 0;
    for (int i = 0; i < n; i++)
        if (w[i]->data) total += (size_t)((w[i]->row_bytes * (uint64_t)w[i]->n_rows + 63) / 64 * 64);
    return total;
}

/* hwprofile.c - the hardware profile reader (qinfer/hwprofile.h).
 *
 * A profile is a list of `key = value unit  # source: text` lines. The
 * reader is strict because a simulator's output is only as good as its
 * inputs: a misspelt key, a unit it cannot place or a number nobody can
 * trace back would otherwise turn into a plausible, wrong figure. Each
 * key's type and unit class live in one table (fields[]), so parsing,
 * the required-field check and printing walk the same list. A key=value
 * reader like params.c's was considered, but it has no units, sources or
 * line numbers, which are the point here.
 */
#include "qinfer/hwprofile.h"

#include <errno.h>
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LINE_MAX_BYTES 1024
#define FILE_MAX_BYTES (1 << 20)

enum { REQ_ALL, REQ_GPU, OPT_ALL, OPT_GPU };

typedef struct {
    const char *key;
    char unit_class; /* 's' string, else as qi_hwprofile_value */
    int req;
    size_t off;      /* of the char array or the qi_hwfig */
    size_t cap;      /* string capacity */
    const char *print_unit; /* for printing: value / scale, then this */
    double print_scale;
} field;

#define STR(k, m, r) {k, 's', r, offsetof(qi_hwprofile, m), sizeof(((qi_hwprofile *)0)->m), NULL, 0}
#define NUM(k, m, c, r, u, sc) {k, c, r, offsetof(qi_hwprofile, m), 0, u, sc}

static const field fields[] = {
    STR("name", name, REQ_ALL),
    STR("kind", kind, REQ_ALL),
    STR("gpu.name", gpu_name, REQ_GPU),
    NUM("gpu.count", gpu_count, 'n', REQ_GPU, "", 1),
    NUM("gpu.fp16_tensor", gpu_fp16_tensor, 'f', REQ_GPU, "TFLOP/s", 1e12),
    NUM("gpu.bf16_tensor", gpu_bf16_tensor, 'f', OPT_GPU, "TFLOP/s", 1e12),
    NUM("gpu.int8_tensor", gpu_int8_tensor, 'f', REQ_GPU, "TOP/s", 1e12),
    NUM("gpu.fp32", gpu_fp32, 'f', REQ_GPU, "TFLOP/s", 1e12),
    NUM("gpu.mem_bw", gpu_mem_bw, 'b', REQ_GPU, "GB/s", 1e9),
    NUM("gpu.mem", gpu_mem_bytes, 'm', REQ_GPU, "GiB", 1073741824.0),
    NUM("gpu.launch", gpu_launch, 't', REQ_GPU, "us", 1e-6),
    NUM("gpu.clock", gpu_clock, 'h', OPT_GPU, "MHz", 1e6),
    NUM("gpu.tdp", gpu_tdp, 'w', OPT_GPU, "W", 1),
    STR("link.name", link_name, REQ_GPU),
    NUM("link.h2d_bw", link_h2d_bw, 'b', REQ_GPU, "GB/s", 1e9),
    NUM("link.d2h_bw", link_d2h_bw, 'b', REQ_GPU, "GB/s", 1e9),
    NUM("link.latency", link_latency, 't', REQ_GPU, "us", 1e-6),
    STR("cpu.name", cpu_name, REQ_ALL),
    NUM("cpu.sockets", cpu_sockets, 'n', REQ_ALL, "", 1),
    NUM("cpu.cores", cpu_cores, 'n', REQ_ALL, "", 1),
    NUM("cpu.fp32", cpu_fp32, 'f', REQ_ALL, "TFLOP/s", 1e12),
    NUM("cpu.int8", cpu_int8, 'f', OPT_ALL, "TOP/s", 1e12),
    NUM("cpu.mem_bw", cpu_mem_bw, 'b', REQ_ALL, "GB/s", 1e9),
    NUM("cpu.llc", cpu_llc, 'm', OPT_ALL, "MiB", 1048576.0),
    NUM("cpu.llc_bw", cpu_llc_bw, 'b', OPT_ALL, "GB/s", 1e9),
    NUM("cpu.mem", cpu_mem_bytes, 'm', REQ_ALL, "GiB", 1073741824.0),
};
#define N_FIELDS (sizeof fields / sizeof fields[0])

static const char *const kinds[] = {"server", "desktop", "cloud-vm", "cpu-only"};

/* ---- units -------------------------------------------------------------- */

/* A prefix at the start of u: its factor and length; 1 and 0 when none. */
static double prefix(const char *u, size_t *len) {
    static const struct { const char *p; double f; } px[] = {
        {"Ki", 1024.0}, {"Mi", 1048576.0}, {"Gi", 1073741824.0}, {"Ti", 1099511627776.0},
        {"k", 1e3}, {"M", 1e6}, {"G", 1e9}, {"T", 1e12}, {"P", 1e15},
        {"m", 1e-3}, {"u", 1e-6}, {"n", 1e-9}};
    for (size_t i = 0; i < sizeof px / sizeof px[0]; i++) {
        size_t n = strlen(px[i].p);
        if (strncmp(u, px[i].p, n) == 0) {
            *len = n;
            return px[i].f;
        }
    }
    *len = 0;
    return 1;
}

/* The factor of unit u in class c, or 0 when u is not a unit of c. Time
 * takes only the sub-unit prefixes, the others only the large ones;
 * FLOP/s and OP/s take decimal prefixes only (no one writes TiFLOP/s). */
static double unit_factor(const char *u, char c) {
    size_t pl;
    double f = prefix(u, &pl);
    const char *base = u + pl;
    bool small = pl == 1 && (u[0] == 'm' || u[0] == 'u' || u[0] == 'n');
    bool binary = pl == 2;
    switch (c) {
    case 'f':
        if (small || binary) return 0;
        if (strcmp(base, "FLOP/s") == 0 || strcmp(base, "OP/s") == 0) return f;
        return 0;
    case 'b':
        if (small) return 0;
        return strcmp(base, "B/s") == 0 ? f : 0;
    case 'm':
        if (small) return 0;
        return strcmp(base, "B") == 0 ? f : 0;
    case 'h':
        if (small || binary) return 0;
        return strcmp(base, "Hz") == 0 ? f : 0;
    case 'w':
        if (small || binary) return 0;
        return strcmp(base, "W") == 0 ? f : 0;
    case 't':
        if (pl == 0 && strcmp(u, "s") == 0) return 1;
        return small && strcmp(base, "s") == 0 ? f : 0;
    default:
        return 0;
    }
}

bool qi_hwprofile_value(const char *s, char c, double *out, const char **why) {
    *out = 0;
    while (*s == ' ' || *s == '\t') s++;
    /* digits first: strtod would also take "inf", "nan" and hex */
    if (!isdigit((unsigned char)s[0]) && !(s[0] == '.' && isdigit((unsigned char)s[1]))) {
        *why = s[0] == '-' ? "not a positive number" : "not a number";
        return false;
    }
    char *end;
    double v = strtod(s, &end);
    if (end != s + strspn(s, "0123456789.eE+-")) { /* "0x10", "5e" */
        *why = "not a number";
        return false;
    }
    if (!isfinite(v)) {
        *why = "not a finite number";
        return false;
    }
    if (v <= 0) {
        *why = "not a positive number";
        return false;
    }
    if (*end && *end != ' ' && *end != '\t') {
        *why = "no space between the number and its unit";
        return false;
    }
    while (*end == ' ' || *end == '\t') end++;
    char unit[32];
    size_t n = strcspn(end, " \t");
    if (n >= sizeof unit) {
        *why = "unknown unit";
        return false;
    }
    memcpy(unit, end, n);
    unit[n] = 0;
    const char *rest = end + n;
    while (*rest == ' ' || *rest == '\t') rest++;
    if (*rest) {
        *why = "text after the unit";
        return false;
    }
    if (c == 'n') {
        if (n) {
            *why = "a count takes no unit";
            return false;
        }
        if (v != floor(v) || v > 1e6) {
            *why = "not a whole number";
            return false;
        }
        *out = v;
        return true;
    }
    if (!n) {
        *why = "no unit";
        return false;
    }
    double f = unit_factor(unit, c);
    if (f == 0) {
        static const char *const msgs[] = {"unknown unit, want a compute rate (FLOP/s or OP/s)",
                                           "unknown unit, want a bandwidth (B/s)",
                                           "unknown unit, want a size (B)", "unknown unit, want a time (s)",
                                           "unknown unit, want a frequency (Hz)", "unknown unit, want a power (W)"};
        *why = c == 'f'   ? msgs[0]
               : c == 'b' ? msgs[1]
               : c == 'm' ? msgs[2]
               : c == 'h' ? msgs[4]
               : c == 'w' ? msgs[5]
                          : msgs[3];
        return false;
    }
    *out = v * f;
    if (!isfinite(*out) || *out <= 0) {
        *why = "out of range";
        return false;
    }
    return true;
}

/* ---- the reader ------------------------------------------------------------ */

static char *trim(char *s) {
    while (*s == ' ' || *s == '\t') s++;
    size_t n = strlen(s);
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\r')) s[--n] = 0;
    return s;
}

static bool is_cpu_only(const qi_hwprofile *p) { return strcmp(p->kind, "cpu-only") == 0; }

static qi_status bad(qi_err *err, qi_hwprofile *p, const char *name, int line, const char *key,
                     const char *why) {
    memset(p, 0, sizeof *p);
    return QI_ERR(err, QI_ERR_INVALID, "%s:%d: %s: %s", name, line, key, why);
}

/* One line, cut at its end; trailing "\r" allowed. */
static qi_status parse_line(char *line, int ln, const char *name, qi_hwprofile *p, int *seen,
                            qi_err *err) {
    char *hash = strchr(line, '#');
    char *comment = NULL;
    if (hash) {
        *hash = 0;
        comment = trim(hash + 1);
    }
    char *body = trim(line);
    if (!*body) return QI_OK;
    char *eq = strchr(body, '=');
    if (!eq) return bad(err, p, name, ln, "(no key)", "expected 'key = value'");
    *eq = 0;
    char *key = trim(body);
    char *val = trim(eq + 1);
    if (!*key) return bad(err, p, name, ln, "(no key)", "expected 'key = value'");
    size_t i = 0;
    while (i < N_FIELDS && strcmp(fields[i].key, key) != 0) i++;
    if (i == N_FIELDS) {
        char k[64];
        snprintf(k, sizeof k, "%.60s", key);
        return bad(err, p, name, ln, k, "unknown key");
    }
    const field *f = &fields[i];
    if (seen[i]) {
        char why[64];
        snprintf(why, sizeof why, "repeated (first on line %d)", seen[i]);
        return bad(err, p, name, ln, f->key, why);
    }
    seen[i] = ln;
    if (!*val) return bad(err, p, name, ln, f->key, "no value");
    if (f->unit_class == 's') {
        char *dst = (char *)p + f->off;
        if (strlen(val) >= f->cap) return bad(err, p, name, ln, f->key, "too long");
        for (const char *c = val; *c; c++)
            if ((unsigned char)*c < 0x20) return bad(err, p, name, ln, f->key, "control character");
        strcpy(dst, val);
        if (strcmp(f->key, "kind") == 0) {
            bool known = false;
            for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) known |= strcmp(val, kinds[k]) == 0;
            if (!known) return bad(err, p, name, ln, f->key, "not one of server, desktop, cloud-vm, cpu-only");
        }
        return QI_OK;
    }
    qi_hwfig *fig = (qi_hwfig *)((char *)p + f->off);
    const char *why = NULL;
    if (!qi_hwprofile_value(val, f->unit_class, &fig->value, &why)) return bad(err, p, name, ln, f->key, why);
    if (!comment || strncmp(comment, "source:", 7) != 0)
        return bad(err, p, name, ln, f->key, "a number without a '# source: ...' comment");
    const char *src = trim(comment + 7);
    if (!*src) return bad(err, p, name, ln, f->key, "empty source");
    if (strlen(src) >= sizeof fig->source) return bad(err, p, name, ln, f->key, "source too long");
    strcpy(fig->source, src);
    fig->line = ln;
    fig->set = true;
    return QI_OK;
}

qi_status qi_hwprofile_parse(const char *text, size_t len, const char *name, qi_hwprofile *p,
                             qi_err *err) {
    memset(p, 0, sizeof *p);
    int seen[N_FIELDS] = {0};
    char line[LINE_MAX_BYTES + 2];
    int ln = 0;
    size_t pos = 0;
    while (pos < len) {
        ln++;
        const char *nl = memchr(text + pos, '\n', len - pos);
        size_t n = nl ? (size_t)(nl - (text + pos)) : len - pos;
        if (n > LINE_MAX_BYTES) return bad(err, p, name, ln, "(line)", "longer than 1024 bytes");
        if (memchr(text + pos, 0, n)) return bad(err, p, name, ln, "(line)", "NUL byte");
        memcpy(line, text + pos, n);
        line[n] = 0;
        pos += n + (nl ? 1 : 0);
        qi_status st = parse_line(line, ln, name, p, seen, err);
        if (st != QI_OK) return st;
    }
    if (ln == 0) ln = 1;
    /* kind decides which fields a profile must have and may have */
    bool cpu_only = p->kind[0] && is_cpu_only(p);
    for (size_t i = 0; i < N_FIELDS; i++) {
        const field *f = &fields[i];
        bool gpu_field = f->req == REQ_GPU || f->req == OPT_GPU;
        if (seen[i] && gpu_field && cpu_only)
            return bad(err, p, name, seen[i], f->key, "not allowed in a cpu-only profile");
        bool required = f->req == REQ_ALL || (f->req == REQ_GPU && p->kind[0] && !cpu_only);
        if (!seen[i] && required) return bad(err, p, name, ln, f->key, "required field missing (end of file)");
    }
    p->has_gpu = !cpu_only;
    return QI_OK;
}

qi_status qi_hwprofile_load(const char *path, qi_hwprofile *p, qi_err *err) {
    memset(p, 0, sizeof *p);
    FILE *fp = fopen(path, "rb");
    if (!fp) return QI_ERR(err, QI_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    char *buf = qi_malloc(FILE_MAX_BYTES + 1);
    if (!buf) {
        fclose(fp);
        return QI_ERR(err, QI_ERR_NOMEM, "%s: out of memory", path);
    }
    size_t n = fread(buf, 1, FILE_MAX_BYTES + 1, fp);
    bool rd_err = ferror(fp) != 0;
    fclose(fp);
    qi_status st;
    if (rd_err)
        st = QI_ERR(err, QI_ERR_IO, "%s: read failed", path);
    else if (n > FILE_MAX_BYTES)
        st = QI_ERR(err, QI_ERR_INVALID, "%s:1: (file): larger than 1 MiB", path);
    else
        st = qi_hwprofile_parse(buf, n, path, p, err);
    qi_free(buf);
    return st;
}

void qi_hwprofile_print(const qi_hwprofile *p, FILE *out) {
    for (size_t i = 0; i < N_FIELDS; i++) {
        const field *f = &fields[i];
        if (f->unit_class == 's') {
            const char *s = (const char *)p + f->off;
            if (*s) fprintf(out, "%-16s %s\n", f->key, s);
            continue;
        }
        const qi_hwfig *fig = (const qi_hwfig *)((const char *)p + f->off);
        if (!fig->set) continue;
        fprintf(out, "%-16s %g%s%s  (%s)\n", f->key, fig->value / f->print_scale, *f->print_unit ? " " : "",
                f->print_unit, fig->source);
    }
}

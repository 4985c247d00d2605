/* sim_cal.c - the calibration file reader (backend.h, qi_sim_params_load):
 * the simulator's parameters as `qinfer calibrate` fitted them on a
 * machine.
 *
 * One `key = value  # source: TEXT` a line, blank and `#` lines ignored;
 * the keys are qi_sim_params_set's. Strict for the reason the profile
 * reader is (hwprofile.c): a misspelt key or a number without a source
 * would silently leave a default in place or a figure nobody can trace,
 * and the simulated times would look as good as calibrated ones. Every
 * error is one line, `FILE:LINE: KEY: why`. A file is applied on top of
 * what the parameters hold (the defaults, for the engine), and the
 * engine applies --sim-param after it, so a parameter given by hand wins.
 */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"

#define CAL_LINE_MAX 1024
#define CAL_KEYS_MAX 32

static char *trim(char *s) {
    while (isspace((unsigned char)*s)) s++;
    char *e = s + strlen(s);
    while (e > s && isspace((unsigned char)e[-1])) *--e = 0;
    return s;
}

bool qi_sim_cal_validated(const char *path, char *out, size_t cap) {
    if (cap) out[0] = 0;
    FILE *f = path ? fopen(path, "r") : NULL;
    if (!f) return false;
    char line[CAL_LINE_MAX + 2];
    bool found = false;
    while (!found && fgets(line, sizeof line, f)) {
        char *s = trim(line);
        if (strncmp(s, "# validated:", 12) != 0) continue;
        snprintf(out, cap, "%s", trim(s + 12));
        found = *out != 0;
    }
    fclose(f);
    return found;
}

qi_status qi_sim_params_load(const char *path, qi_sim_params *p, qi_err *err) {
    FILE *f = fopen(path, "r");
    if (!f) return QI_ERR(err, QI_ERR_IO, "%s: cannot open the calibration file: %s", path, strerror(errno));
    qi_sim_params out = *p; /* applied only when the whole file reads */
    char line[CAL_LINE_MAX + 2], seen[CAL_KEYS_MAX][48];
    int n_seen = 0, ln = 0;
    qi_status st = QI_OK;
    while (!st && fgets(line, sizeof line, f)) {
        ln++;
        if (!strchr(line, '\n') && !feof(f)) {
            st = QI_ERR(err, QI_ERR_FORMAT, "%s:%d: line longer than %d bytes", path, ln, CAL_LINE_MAX);
            break;
        }
        char *s = trim(line);
        if (!*s || *s == '#') continue;
        char *hash = strchr(s, '#'), *eq = strchr(s, '=');
        if (!eq || (hash && hash < eq)) {
            st = QI_ERR(err, QI_ERR_FORMAT, "%s:%d: not a `key = value  # source: ...` line", path, ln);
            break;
        }
        *eq = 0;
        const char *key = trim(s);
        if (!*key) {
            st = QI_ERR(err, QI_ERR_FORMAT, "%s:%d: a value without a key", path, ln);
            break;
        }
        if (hash) *hash = 0;
        const char *val = trim(eq + 1);
        const char *src = hash ? trim(hash + 1) : "";
        for (int i = 0; i < n_seen && !st; i++)
            if (!strcmp(seen[i], key)) st = QI_ERR(err, QI_ERR_FORMAT, "%s:%d: %s: given twice", path, ln, key);
        if (st) break;
        char *end;
        errno = 0;
        const double v = *val ? strtod(val, &end) : NAN;
        if (!*val || *end || errno || !isfinite(v)) {
            st = QI_ERR(err, QI_ERR_FORMAT, "%s:%d: %s: '%s' is not a number", path, ln, key, val);
            break;
        }
        if (strncmp(src, "source:", 7) != 0 || !*trim((char *)src + 7)) {
            st = QI_ERR(err, QI_ERR_FORMAT, "%s:%d: %s: no `# source: TEXT` after the value (say where it came from)",
                        path, ln, key);
            break;
        }
        qi_err e = {0};
        if (qi_sim_params_set(&out, key, v, &e) != QI_OK) {
            /* qi_sim_params_set's message, placed at the line, less its
             * "sim: KEY = " */
            char head[64];
            snprintf(head, sizeof head, "sim: %s = ", key);
            const char *why = strncmp(e.msg, head, strlen(head)) == 0 ? e.msg + strlen(head)
                              : strncmp(e.msg, "sim: ", 5) == 0        ? e.msg + 5
                                                                       : e.msg;
            st = QI_ERR(err, QI_ERR_FORMAT, "%s:%d: %s: %s", path, ln, key, why);
            break;
        }
        if (n_seen < CAL_KEYS_MAX) snprintf(seen[n_seen++], sizeof seen[0], "%s", key);
    }
    if (!st && ferror(f)) st = QI_ERR(err, QI_ERR_IO, "%s: read error", path);
    fclose(f);
    if (!st) *p = out;
    return st;
}

/* ---- the machine a calibration was fitted on ----------------------------------------- */

/* "# machine: cpu=NAME; cores=N; mem_bw=X GB/s; llc=Y MiB" (llc=0: none) */
#define MACHINE_TAG "# machine:"

void qi_sim_cal_machine_line(const qi_hwprofile *prof, char *out, size_t cap) {
    snprintf(out, cap, MACHINE_TAG " cpu=%s; cores=%.0f; mem_bw=%.2f GB/s; llc=%.1f MiB", prof->cpu_name,
             prof->cpu_cores.value, prof->cpu_mem_bw.value / 1e9,
             prof->cpu_llc.set ? prof->cpu_llc.value / 1048576.0 : 0.0);
}

/* a and b differ by more than a quarter of the larger */
static bool apart(double a, double b) { return fabs(a - b) > 0.25 * fmax(a, b); }

bool qi_sim_cal_machine_differs(const char *path, const qi_hwprofile *prof, char *why, size_t cap) {
    if (cap) why[0] = 0;
    FILE *f = path ? fopen(path, "r") : NULL;
    if (!f) return false;
    char line[CAL_LINE_MAX + 2], cpu[256] = "";
    double cores = 0, bw = 0, llc = -1;
    bool found = false;
    while (!found && fgets(line, sizeof line, f)) {
        char *s = trim(line);
        if (strncmp(s, MACHINE_TAG, strlen(MACHINE_TAG)) != 0) continue;
        s = trim(s + strlen(MACHINE_TAG));
        char *semi = strchr(s, ';');
        if (strncmp(s, "cpu=", 4) != 0 || !semi) break;
        *semi = 0;
        snprintf(cpu, sizeof cpu, "%s", s + 4);
        found = sscanf(semi + 1, " cores=%lf; mem_bw=%lf GB/s; llc=%lf MiB", &cores, &bw, &llc) == 3;
    }
    fclose(f);
    if (!found) return false; /* a calibration from before the record: nothing to compare */
    const double pllc = prof->cpu_llc.set ? prof->cpu_llc.value / 1048576.0 : 0;
    const char *what = strcmp(cpu, prof->cpu_name) != 0             ? "CPU model"
                       : cores != prof->cpu_cores.value               ? "core count"
                       : apart(bw * 1e9, prof->cpu_mem_bw.value)      ? "memory bandwidth"
                       : llc > 0 && pllc > 0 && apart(llc, pllc)      ? "last-level cache"
                                                                      : NULL;
    if (!what) return false;
    snprintf(why, cap,
             "%s was fitted on another machine (%s: %s, %.0f cores, %.1f GB/s, LLC %.0f MiB; profile %s: %s, %.0f "
             "cores, %.1f GB/s, LLC %.0f MiB): its %s differs, so its CPU figures may not hold; calibrate this "
             "machine (qinfer calibrate, engine/backend/sim/README.md)",
             path, "the calibration's", cpu, cores, bw, llc, prof->name, prof->cpu_name, prof->cpu_cores.value,
             prof->cpu_mem_bw.value / 1e9, pllc, what);
    return true;
}

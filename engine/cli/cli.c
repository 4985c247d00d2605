/* cli.c - flag parsing and error reporting shared by the subcommands. */
#include "cli.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void qi_args_init(qi_args *a, const char *cmd, int argc, char **argv) {
    memset(a, 0, sizeof *a);
    a->cmd = cmd;
    a->argc = argc;
    a->argv = argv;
    a->i = 1;
}

const char *qi_args_next(qi_args *a) {
    if (a->failed || a->i >= a->argc) return NULL;
    a->flag = a->argv[a->i++];
    return a->flag;
}

bool qi_args_is(const qi_args *a, const char *s, const char *l) {
    return (s && strcmp(a->flag, s) == 0) || (l && strcmp(a->flag, l) == 0);
}

void qi_cli_error(const char *cmd, const char *fmt, ...) {
    va_list ap;
    fprintf(stderr, "qinfer %s: ", cmd);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

const char *qi_args_str(qi_args *a) {
    if (a->i >= a->argc) {
        qi_cli_error(a->cmd, "option %s needs a value (see qinfer %s --help)", a->flag, a->cmd);
        a->failed = true;
        return NULL;
    }
    return a->argv[a->i++];
}

bool qi_args_int(qi_args *a, long lo, long hi, int *out) {
    const char *s = qi_args_str(a);
    if (!s) return false;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        qi_cli_error(a->cmd, "option %s: '%s' is not an integer in %ld..%ld", a->flag, s, lo, hi);
        a->failed = true;
        return false;
    }
    *out = (int)v;
    return true;
}

bool qi_args_u64(qi_args *a, uint64_t *out) {
    const char *s = qi_args_str(a);
    if (!s) return false;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end || s[0] == '-') {
        qi_cli_error(a->cmd, "option %s: '%s' is not a non-negative integer", a->flag, s);
        a->failed = true;
        return false;
    }
    *out = v;
    return true;
}

bool qi_args_float(qi_args *a, double lo, double hi, float *out) {
    const char *s = qi_args_str(a);
    if (!s) return false;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v) || v < lo || v > hi) {
        qi_cli_error(a->cmd, "option %s: '%s' is not a number in %g..%g", a->flag, s, lo, hi);
        a->failed = true;
        return false;
    }
    *out = (float)v;
    return true;
}

void qi_args_unknown(qi_args *a) {
    if (a->flag[0] == '-')
        qi_cli_error(a->cmd, "unknown option '%s' (see qinfer %s --help)", a->flag, a->cmd);
    else
        qi_cli_error(a->cmd, "unexpected argument '%s' (see qinfer %s --help)", a->flag, a->cmd);
    a->failed = true;
}

int qi_cli_fail(const char *cmd, const qi_err *err) {
    qi_cli_error(cmd, "%s", err->msg[0] ? err->msg : qi_status_str(err->code));
    return err->code == QI_ERR_INVALID ? QI_EXIT_USAGE : QI_EXIT_RUNTIME;
}

double qi_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

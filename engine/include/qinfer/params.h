/* params.h - a small key=value bag that carries a policy's parameters.
 *
 * Filled from the command line ("window=128,sinks=4" after --kv-param) or,
 * later, from a Lua table; read by a policy's create(), which validates each
 * value with the typed getters below and rejects keys it does not know. The
 * bag copies what it is given, so the caller's strings may go away. Every
 * error message names the policy and the parameter.
 */
#ifndef QINFER_PARAMS_H
#define QINFER_PARAMS_H

#include <stdbool.h>

#include "qinfer/status.h"

#define QI_PARAMS_MAX 16
#define QI_PARAM_KEY_MAX 32
#define QI_PARAM_VALUE_MAX 256 /* a file path (a placement policy's profile=) fits */

typedef struct {
    char key[QI_PARAM_KEY_MAX];
    char value[QI_PARAM_VALUE_MAX];
} qi_param;

typedef struct {
    int n;
    qi_param items[QI_PARAMS_MAX];
} qi_params;

/* An empty bag. */
void qi_params_init(qi_params *p);

/* Add or replace key=value. Errors: empty or over-long key or value, a key
 * not made of [A-Za-z0-9_], more than QI_PARAMS_MAX keys. */
qi_status qi_params_set(qi_params *p, const char *key, const char *value, qi_err *err);

/* Parse "k=v,k=v" (spaces around items ignored; an empty string adds
 * nothing) into p, on top of what it holds. Errors: those of
 * qi_params_set, an item without '=' or with two, an empty item (a stray
 * comma); on error p is left as it was. */
qi_status qi_params_parse(qi_params *p, const char *spec, qi_err *err);

/* The value of key, or NULL. */
const char *qi_params_get(const qi_params *p, const char *key);

/* Typed reads for policy `who` (used in messages). A missing key gives the
 * default; a present one must parse completely (no blanks, no trailing
 * characters, no NaN or infinity) and lie in [lo, hi]. On error *out is
 * untouched. p may be NULL (an empty bag). */
qi_status qi_params_int(const qi_params *p, const char *who, const char *key, long def, long lo, long hi,
                        long *out, qi_err *err);
qi_status qi_params_double(const qi_params *p, const char *who, const char *key, double def, double lo,
                           double hi, double *out, qi_err *err);
/* true/false, on/off, yes/no, 1/0 */
qi_status qi_params_bool(const qi_params *p, const char *who, const char *key, bool def, bool *out,
                         qi_err *err);

/* Fail on the first key not in known (NULL-terminated), naming it, the
 * policy and the keys it takes. */
qi_status qi_params_check_known(const qi_params *p, const char *who, const char *const *known, qi_err *err);

#endif

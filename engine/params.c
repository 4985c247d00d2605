/* params.c - the key=value bag policies read their parameters from.
 *
 * The bag is a fixed array inside the struct: a policy has a handful of
 * parameters, so a linear search over at most QI_PARAMS_MAX entries beats a
 * hash table, and the bag never allocates (it can live on the stack and be
 * copied by value). Values stay strings until a policy reads them with a
 * typed getter; only the policy knows a key's type and range, so validation
 * happens there and every message names the policy and the key.
 *
 * Numbers must parse completely: strtol/strtod alone accept leading blanks,
 * trailing garbage ("12abc" reads as 12), "nan" and "inf", so the getters
 * check the end pointer, errno and finiteness themselves. A failed set or
 * parse leaves the bag as it was (parse works on a copy), so a caller can
 * report the error and keep going with the old values.
 */
#include "qinfer/params.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

void qi_params_init(qi_params *p) { memset(p, 0, sizeof *p); }

static const char *who_or(const char *who) { return who && *who ? who : "params"; }

static qi_param *find(qi_params *p, const char *key) {
    for (int i = 0; i < p->n; i++)
        if (strcmp(p->items[i].key, key) == 0) return &p->items[i];
    return NULL;
}

qi_status qi_params_set(qi_params *p, const char *key, const char *value, qi_err *err) {
    if (!key || !*key) return QI_ERR(err, QI_ERR_INVALID, "parameter with an empty key");
    size_t klen = strlen(key);
    if (klen >= QI_PARAM_KEY_MAX)
        return QI_ERR(err, QI_ERR_INVALID, "parameter key '%.*s...' is longer than %d characters",
                      QI_PARAM_KEY_MAX - 1, key, QI_PARAM_KEY_MAX - 1);
    for (size_t i = 0; i < klen; i++) {
        unsigned char c = (unsigned char)key[i];
        if (!(isalnum(c) || c == '_'))
            return QI_ERR(err, QI_ERR_INVALID, "parameter key '%s' may only contain letters, digits and '_'", key);
    }
    if (!value || !*value) return QI_ERR(err, QI_ERR_INVALID, "parameter '%s' has an empty value", key);
    if (strlen(value) >= QI_PARAM_VALUE_MAX)
        return QI_ERR(err, QI_ERR_INVALID, "parameter '%s': value '%.*s...' is longer than %d characters", key,
                      QI_PARAM_VALUE_MAX - 1, value, QI_PARAM_VALUE_MAX - 1);
    qi_param *it = find(p, key);
    if (!it) {
        if (p->n >= QI_PARAMS_MAX)
            return QI_ERR(err, QI_ERR_INVALID, "too many parameters (at most %d): cannot add '%s'", QI_PARAMS_MAX,
                          key);
        it = &p->items[p->n++];
        memcpy(it->key, key, klen + 1);
    }
    memcpy(it->value, value, strlen(value) + 1);
    return QI_OK;
}

/* [s, e) with spaces and tabs trimmed from both ends. */
static void trim(const char **s, const char **e) {
    while (*s < *e && (**s == ' ' || **s == '\t')) (*s)++;
    while (*e > *s && ((*e)[-1] == ' ' || (*e)[-1] == '\t')) (*e)--;
}

qi_status qi_params_parse(qi_params *p, const char *spec, qi_err *err) {
    if (!spec) return QI_OK;
    const char *s = spec, *end = spec + strlen(spec);
    trim(&s, &end);
    if (s == end) return QI_OK; /* "" or blanks: nothing to add */
    qi_params tmp = *p;
    for (const char *item = s; item <= end;) {
        const char *comma = memchr(item, ',', (size_t)(end - item));
        const char *ie = comma ? comma : end, *ib = item;
        trim(&ib, &ie);
        int ilen = (int)(ie - ib);
        if (ilen == 0) return QI_ERR(err, QI_ERR_INVALID, "empty item in parameter list '%s'", spec);
        const char *eq = memchr(ib, '=', (size_t)ilen);
        if (!eq)
            return QI_ERR(err, QI_ERR_INVALID, "parameter item '%.*s' is not key=value", ilen, ib);
        if (memchr(eq + 1, '=', (size_t)(ie - eq - 1)))
            return QI_ERR(err, QI_ERR_INVALID, "parameter item '%.*s' has more than one '='", ilen, ib);
        const char *kb = ib, *ke = eq, *vb = eq + 1, *ve = ie;
        trim(&kb, &ke);
        trim(&vb, &ve);
        /* Copies one byte past each limit so that qi_params_set reports the
         * over-long key or value instead of a silently cut one. */
        char key[QI_PARAM_KEY_MAX + 1], value[QI_PARAM_VALUE_MAX + 1];
        size_t kl = (size_t)(ke - kb), vl = (size_t)(ve - vb);
        if (kl > QI_PARAM_KEY_MAX) kl = QI_PARAM_KEY_MAX;
        if (vl > QI_PARAM_VALUE_MAX) vl = QI_PARAM_VALUE_MAX;
        memcpy(key, kb, kl);
        key[kl] = 0;
        memcpy(value, vb, vl);
        value[vl] = 0;
        qi_status st = qi_params_set(&tmp, key, value, err);
        if (st) return st;
        if (!comma) break;
        item = comma + 1;
    }
    *p = tmp;
    return QI_OK;
}

const char *qi_params_get(const qi_params *p, const char *key) {
    if (!p || !key) return NULL;
    for (int i = 0; i < p->n; i++)
        if (strcmp(p->items[i].key, key) == 0) return p->items[i].value;
    return NULL;
}

qi_status qi_params_int(const qi_params *p, const char *who, const char *key, long def, long lo, long hi,
                        long *out, qi_err *err) {
    const char *s = qi_params_get(p, key);
    if (!s) {
        *out = def;
        return QI_OK;
    }
    char *end = NULL;
    errno = 0;
    long v = strtol(s, &end, 10);
    /* strtol skips leading blanks; a value must be the number and nothing else */
    bool ok = *s && !isspace((unsigned char)*s) && end != s && *end == 0 && errno == 0 && v >= lo && v <= hi;
    if (!ok) {
        if (hi == LONG_MAX)
            return QI_ERR(err, QI_ERR_INVALID, "%s: parameter '%s' must be an integer >= %ld, got '%s'", who_or(who),
                          key, lo, s);
        return QI_ERR(err, QI_ERR_INVALID, "%s: parameter '%s' must be an integer in [%ld, %ld], got '%s'",
                      who_or(who), key, lo, hi, s);
    }
    *out = v;
    return QI_OK;
}

qi_status qi_params_double(const qi_params *p, const char *who, const char *key, double def, double lo,
                           double hi, double *out, qi_err *err) {
    const char *s = qi_params_get(p, key);
    if (!s) {
        *out = def;
        return QI_OK;
    }
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    /* ERANGE on underflow still gives a finite (tiny or zero) value, which
     * the range check judges; overflow gives inf, caught by isfinite. */
    bool ok = *s && !isspace((unsigned char)*s) && end != s && *end == 0 && isfinite(v) && v >= lo && v <= hi;
    if (!ok)
        return QI_ERR(err, QI_ERR_INVALID, "%s: parameter '%s' must be a number in [%g, %g], got '%s'",
                      who_or(who), key, lo, hi, s);
    *out = v;
    return QI_OK;
}

qi_status qi_params_bool(const qi_params *p, const char *who, const char *key, bool def, bool *out,
                         qi_err *err) {
    const char *s = qi_params_get(p, key);
    if (!s) {
        *out = def;
        return QI_OK;
    }
    static const char *const yes[] = {"true", "on", "yes", "1"}, *const no[] = {"false", "off", "no", "0"};
    for (int i = 0; i < 4; i++) {
        if (strcasecmp(s, yes[i]) == 0) {
            *out = true;
            return QI_OK;
        }
        if (strcasecmp(s, no[i]) == 0) {
            *out = false;
            return QI_OK;
        }
    }
    return QI_ERR(err, QI_ERR_INVALID, "%s: parameter '%s' must be true/false, on/off, yes/no or 1/0, got '%s'",
                  who_or(who), key, s);
}

qi_status qi_params_check_known(const qi_params *p, const char *who, const char *const *known, qi_err *err) {
    if (!p) return QI_OK;
    for (int i = 0; i < p->n; i++) {
        bool found = false;
        for (const char *const *k = known; k && *k && !found; k++) found = strcmp(*k, p->items[i].key) == 0;
        if (found) continue;
        char list[256] = "";
        size_t len = 0;
        for (const char *const *k = known; k && *k; k++) {
            int w = snprintf(list + len, sizeof list - len, "%s%s", len ? ", " : "", *k);
            if (w < 0 || (size_t)w >= sizeof list - len) break;
            len += (size_t)w;
        }
        if (!len)
            return QI_ERR(err, QI_ERR_INVALID, "%s: unknown parameter '%s' (%s takes no parameters)", who_or(who),
                          p->items[i].key, who_or(who));
        return QI_ERR(err, QI_ERR_INVALID, "%s: unknown parameter '%s' (%s takes: %s)", who_or(who),
                      p->items[i].key, who_or(who), list);
    }
    return QI_OK;
}

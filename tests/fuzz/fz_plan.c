/* fz_plan.c - libFuzzer target: plan files (qi_plan_parse) and --devices
 * lists (qi_plan_devices_parse).
 *
 * Input: one byte, the layer count (1..16); the --devices value up to the
 * first newline; the rest, the plan file (read from a scratch file, as
 * --placement FILE reads it). Checked: an accepted plan validates, its
 * text form (qi_plan_format) reads back to the same text, and its JSON
 * form (qi_plan_json, what the results database stores) is JSON that the
 * canonicaliser accepts.
 */
#include <string.h>

#include "fz.h"
#include "json.h"
#include "qinfer/plan.h"

static char *format(const qi_plan *p, int (*fn)(const qi_plan *, char *, size_t)) {
    const int n = fn(p, NULL, 0);
    FZ_CHECK(n >= 0, "format gave %d", n);
    char *s = malloc((size_t)n + 1);
    if (!s) abort();
    FZ_CHECK(fn(p, s, (size_t)n + 1) == n, "format's length changed");
    return s;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const int n_layer = 1 + data[0] % 16;
    const uint8_t *nl = memchr(data + 1, '\n', size - 1);
    if (!nl) return 0;
    char *devices = fz_strndup(data + 1, (size_t)(nl - data - 1));
    char path[4200], path2[4200];
    fz_path(path, sizeof path, "plan.txt");
    fz_path(path2, sizeof path2, "plan2.txt");
    fz_write(path, nl + 1, size - (size_t)(nl + 1 - data));
    qi_plan p = {0}, q = {0};
    qi_err e = {0};
    if (qi_plan_devices_parse(devices, &p, &e) != QI_OK) {
        FZ_CHECK(e.msg[0], "a device list refused without a message");
        fz_note("devices: %s", e.msg);
        free(devices);
        return 0;
    }
    q = p;
    if (qi_plan_parse(path, n_layer, &p, &e) != QI_OK) {
        FZ_CHECK(e.msg[0], "a plan refused without a message");
        fz_note("plan: %s", e.msg);
        qi_plan_free(&p);
        free(devices);
        return 0;
    }
    FZ_CHECK(p.n_layer == n_layer && p.layers, "a plan of %d layers for %d", p.n_layer, n_layer);
    FZ_CHECK(qi_plan_validate(&p, &e) == QI_OK, "an accepted plan does not validate: %s", e.msg);
    char *text = format(&p, qi_plan_format), *json = format(&p, qi_plan_json);
    fz_write(path2, text, strlen(text));
    FZ_CHECK(qi_plan_parse(path2, n_layer, &q, &e) == QI_OK, "the plan's own text does not read back: %s\n%s", e.msg,
             text);
    char *text2 = format(&q, qi_plan_format);
    FZ_CHECK(strcmp(text, text2) == 0, "the plan's text changed on the way back:\n%s\n---\n%s", text, text2);
    char *canon = NULL;
    FZ_CHECK(qi_json_canonical(json, &canon, NULL, &e) == QI_OK, "the plan's JSON is not JSON: %s: %s", e.msg, json);
    qi_free(canon);
    char summary[128];
    qi_plan_summary(&p, summary, sizeof summary);
    fz_note("plan accepted: %s", summary);
    free(text), free(text2), free(json), free(devices);
    qi_plan_free(&p);
    qi_plan_free(&q);
    return 0;
}

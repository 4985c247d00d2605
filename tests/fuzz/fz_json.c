/* fz_json.c - libFuzzer target: the results database's canonical JSON
 * (qi_json_canonical), which every configuration and JSON plan passes
 * through before it is hashed and stored.
 *
 * Input: the text (cut at its first NUL, as a C string is). Checked: a
 * rejection has a message and no output; an accepted text's canonical form
 * is its own canonical form (one spelling per value), its length is the
 * one reported, and it holds no whitespace outside strings' escapes.
 */
#include <string.h>

#include "fz.h"
#include "json.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = fz_strndup(data, size);
    char *c1 = (char *)text, *c2 = (char *)text;
    size_t n1 = 0, n2 = 0;
    qi_err e = {0};
    if (qi_json_canonical(text, &c1, &n1, &e) != QI_OK) {
        FZ_CHECK(c1 == NULL && e.msg[0], "a rejection without a message or with output");
        fz_note("%s", e.msg);
        free(text);
        return 0;
    }
    FZ_CHECK(strlen(c1) == n1, "length %zu reported, %zu written", n1, strlen(c1));
    FZ_CHECK(qi_json_canonical(c1, &c2, &n2, &e) == QI_OK, "the canonical form is refused: %s: %s", e.msg, c1);
    FZ_CHECK(n1 == n2 && strcmp(c1, c2) == 0, "canonical twice differs:\n%s\n%s", c1, c2);
    bool in_str = false;
    for (size_t i = 0; i < n1; i++) {
        if (in_str && c1[i] == '\\') {
            i++;
            continue;
        }
        if (c1[i] == '"') in_str = !in_str;
        if (!in_str) FZ_CHECK(!strchr(" \t\r\n", c1[i]), "whitespace at %zu outside a string: %s", i, c1);
        else FZ_CHECK((unsigned char)c1[i] >= 0x20, "a raw control byte at %zu in a string", i);
    }
    qi_free(c1);
    qi_free(c2);
    free(text);
    return 0;
}

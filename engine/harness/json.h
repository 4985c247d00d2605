/* json.h - canonical JSON text, so that one configuration has one spelling.
 *
 * An experiment's configuration is stored as JSON and identified by a hash of
 * it; the same table written with its keys in another order (Lua's pairs()
 * order depends on how the table was built) or with other whitespace must
 * give the same text, or a resumed sweep would redo finished work.
 */
#ifndef QI_HARNESS_JSON_H
#define QI_HARNESS_JSON_H

#include <stddef.h>

#include "qinfer/status.h"

/* Deepest nesting of arrays and objects a configuration may use. */
#define QI_JSON_MAX_DEPTH 64

/* Parse `json` (NUL-terminated, UTF-8) and write its canonical form to a new
 * NUL-terminated string in *out (length in *len when len is not NULL; the
 * caller frees with qi_free). Canonical means:
 *   - no whitespace outside strings;
 *   - object members sorted by key, comparing the keys' UTF-8 bytes;
 *     a key that appears twice in one object is an error;
 *   - strings with escapes decoded, then re-escaped minimally: only '"',
 *     '\\' and control characters (\b \f \n \r \t, else \u00XX, lower-case
 *     hex); everything else, non-ASCII included, as raw UTF-8;
 *   - numbers as written, checked against the JSON grammar, with 'E' written
 *     'e' (1 and 1.0 stay distinct, as Lua integers and floats are);
 *   - true, false, null as themselves.
 * Errors: QI_ERR_INVALID for text that is not JSON (or invalid UTF-8, a lone
 * surrogate escape, nesting deeper than QI_JSON_MAX_DEPTH), with the byte
 * offset; QI_ERR_NOMEM. *out is NULL on failure. */
qi_status qi_json_canonical(const char *json, char **out, size_t *len, qi_err *err);

#endif

/* json.c - canonical JSON (see json.h for the rules).
 *
 * A recursive-descent parser that writes the canonical text as it goes; an
 * object's members are written into a scratch buffer each, then sorted by
 * their decoded keys and appended. Nothing is kept of the parsed document but
 * that text, so there is no tree to build or free.
 *
 * Considered: SQLite's json() minifies but keeps member order, and the
 * canonical key must not depend on the order a Lua table was filled in;
 * RFC 8785 (JCS) also rewrites numbers in their shortest double form, which
 * would merge 1 and 1.0, two values a Lua configuration can tell apart.
 */
#include "json.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    char *p;
    size_t len, cap;
    bool oom;
} sbuf;

static void sb_put(sbuf *b, const void *s, size_t n) {
    if (b->oom) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->len + n + 1) cap *= 2;
        char *p = qi_realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}

static void sb_putc(sbuf *b, char c) { sb_put(b, &c, 1); }

typedef struct {
    const unsigned char *s;
    size_t i;
    int depth;
    qi_err *err;
    qi_status st; /* first failure; parsing stops at it */
} parser;

static bool fail(parser *p, qi_status code, const char *what) {
    if (p->st == QI_OK) {
        p->st = code;
        if (code == QI_ERR_NOMEM) QI_ERR(p->err, code, "config JSON: out of memory");
        else QI_ERR(p->err, code, "config JSON: %s at byte %zu", what, p->i);
    }
    return false;
}

static bool oom(parser *p, const sbuf *b) { return b->oom ? fail(p, QI_ERR_NOMEM, NULL) : true; }

static void skip_ws(parser *p) {
    while (p->s[p->i] == ' ' || p->s[p->i] == '\t' || p->s[p->i] == '\n' || p->s[p->i] == '\r') p->i++;
}

/* Length of the well-formed UTF-8 sequence at s (no overlongs, no surrogates,
 * at most U+10FFFF), 0 if there is none. */
static size_t utf8_len(const unsigned char *s) {
    unsigned c = s[0];
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) return (s[1] & 0xC0) == 0x80 ? 2 : 0;
    if (c >= 0xE0 && c <= 0xEF) {
        unsigned lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
        return s[1] >= lo && s[1] <= hi && (s[2] & 0xC0) == 0x80 ? 3 : 0;
    }
    if (c >= 0xF0 && c <= 0xF4) {
        unsigned lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
        return s[1] >= lo && s[1] <= hi && (s[2] & 0xC0) == 0x80 && (s[3] & 0xC0) == 0x80 ? 4 : 0;
    }
    return 0;
}

static void put_utf8(sbuf *b, uint32_t cp) {
    char u[4];
    size_t n;
    if (cp < 0x80) { u[0] = (char)cp; n = 1; }
    else if (cp < 0x800) { u[0] = (char)(0xC0 | cp >> 6); u[1] = (char)(0x80 | (cp & 0x3F)); n = 2; }
    else if (cp < 0x10000) {
        u[0] = (char)(0xE0 | cp >> 12); u[1] = (char)(0x80 | (cp >> 6 & 0x3F));
        u[2] = (char)(0x80 | (cp & 0x3F)); n = 3;
    } else {
        u[0] = (char)(0xF0 | cp >> 18); u[1] = (char)(0x80 | (cp >> 12 & 0x3F));
        u[2] = (char)(0x80 | (cp >> 6 & 0x3F)); u[3] = (char)(0x80 | (cp & 0x3F)); n = 4;
    }
    sb_put(b, u, n);
}

static bool hex4(parser *p, uint32_t *out) {
    uint32_t v = 0;
    for (int k = 0; k < 4; k++) {
        unsigned c = p->s[p->i];
        unsigned d;
        if (c >= '0' && c <= '9') d = c - '0';
        else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
        else return fail(p, QI_ERR_INVALID, "bad \\u escape");
        v = v << 4 | d;
        p->i++;
    }
    *out = v;
    return true;
}

/* A string at p->i (on the opening quote), decoded into `raw` (may hold NUL
 * bytes; length in raw->len). */
static bool parse_string(parser *p, sbuf *raw) {
    p->i++;
    for (;;) {
        unsigned c = p->s[p->i];
        if (c == '"') {
            p->i++;
            return oom(p, raw);
        }
        if (c == 0) return fail(p, QI_ERR_INVALID, "unterminated string");
        if (c < 0x20) return fail(p, QI_ERR_INVALID, "control character in a string");
        if (c != '\\') {
            size_t n = utf8_len(p->s + p->i);
            if (!n) return fail(p, QI_ERR_INVALID, "invalid UTF-8");
            sb_put(raw, p->s + p->i, n);
            p->i += n;
            continue;
        }
        p->i++;
        char e = (char)p->s[p->i++];
        switch (e) {
        case '"': sb_putc(raw, '"'); break;
        case '\\': sb_putc(raw, '\\'); break;
        case '/': sb_putc(raw, '/'); break;
        case 'b': sb_putc(raw, '\b'); break;
        case 'f': sb_putc(raw, '\f'); break;
        case 'n': sb_putc(raw, '\n'); break;
        case 'r': sb_putc(raw, '\r'); break;
        case 't': sb_putc(raw, '\t'); break;
        case 'u': {
            uint32_t cp;
            if (!hex4(p, &cp)) return false;
            if (cp >= 0xDC00 && cp <= 0xDFFF) return fail(p, QI_ERR_INVALID, "lone low surrogate escape");
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                uint32_t lo;
                if (p->s[p->i] != '\\' || p->s[p->i + 1] != 'u')
                    return fail(p, QI_ERR_INVALID, "lone high surrogate escape");
                p->i += 2;
                if (!hex4(p, &lo)) return false;
                if (lo < 0xDC00 || lo > 0xDFFF) return fail(p, QI_ERR_INVALID, "bad surrogate pair");
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            }
            put_utf8(raw, cp);
            break;
        }
        default: p->i--; return fail(p, QI_ERR_INVALID, "bad escape");
        }
    }
}

/* Write decoded bytes as a canonical JSON string. */
static void put_string(sbuf *b, const char *s, size_t n) {
    static const char hex[] = "0123456789abcdef";
    sb_putc(b, '"');
    for (size_t k = 0; k < n; k++) {
        unsigned char c = (unsigned char)s[k];
        switch (c) {
        case '"': sb_put(b, "\\\"", 2); break;
        case '\\': sb_put(b, "\\\\", 2); break;
        case '\b': sb_put(b, "\\b", 2); break;
        case '\f': sb_put(b, "\\f", 2); break;
        case '\n': sb_put(b, "\\n", 2); break;
        case '\r': sb_put(b, "\\r", 2); break;
        case '\t': sb_put(b, "\\t", 2); break;
        default:
            if (c < 0x20) {
                char u[6] = {'\\', 'u', '0', '0', hex[c >> 4], hex[c & 15]};
                sb_put(b, u, 6);
            } else {
                sb_putc(b, (char)c);
            }
        }
    }
    sb_putc(b, '"');
}

static bool is_digit(unsigned c) { return c >= '0' && c <= '9'; }

static bool parse_number(parser *p, sbuf *out) {
    size_t start = p->i;
    if (p->s[p->i] == '-') p->i++;
    if (p->s[p->i] == '0') p->i++;
    else if (is_digit(p->s[p->i])) while (is_digit(p->s[p->i])) p->i++;
    else return fail(p, QI_ERR_INVALID, "bad number");
    if (p->s[p->i] == '.') {
        p->i++;
        if (!is_digit(p->s[p->i])) return fail(p, QI_ERR_INVALID, "bad number");
        while (is_digit(p->s[p->i])) p->i++;
    }
    if (p->s[p->i] == 'e' || p->s[p->i] == 'E') {
        p->i++;
        if (p->s[p->i] == '+' || p->s[p->i] == '-') p->i++;
        if (!is_digit(p->s[p->i])) return fail(p, QI_ERR_INVALID, "bad number");
        while (is_digit(p->s[p->i])) p->i++;
    }
    for (size_t k = start; k < p->i; k++) sb_putc(out, p->s[k] == 'E' ? 'e' : (char)p->s[k]);
    return oom(p, out);
}

typedef struct {
    sbuf key; /* decoded */
    sbuf val; /* canonical text */
} member;

static int member_cmp(const void *a, const void *b) {
    const member *x = a, *y = b;
    size_t n = x->key.len < y->key.len ? x->key.len : y->key.len;
    int c = n ? memcmp(x->key.p, y->key.p, n) : 0;
    if (c) return c;
    return (x->key.len > y->key.len) - (x->key.len < y->key.len);
}

static bool parse_value(parser *p, sbuf *out);

static bool parse_object(parser *p, sbuf *out) {
    p->i++;
    member *m = NULL;
    size_t n = 0, cap = 0;
    bool ok = false;
    skip_ws(p);
    if (p->s[p->i] == '}') {
        p->i++;
        sb_put(out, "{}", 2);
        return oom(p, out);
    }
    for (;;) {
        skip_ws(p);
        if (p->s[p->i] != '"') {
            fail(p, QI_ERR_INVALID, "expected a member name");
            goto done;
        }
        if (n == cap) {
            size_t nc = cap ? 2 * cap : 8;
            member *g = qi_realloc(m, nc * sizeof *m);
            if (!g) {
                fail(p, QI_ERR_NOMEM, NULL);
                goto done;
            }
            m = g;
            cap = nc;
        }
        memset(&m[n], 0, sizeof m[n]);
        member *cur = &m[n++];
        if (!parse_string(p, &cur->key)) goto done;
        skip_ws(p);
        if (p->s[p->i] != ':') {
            fail(p, QI_ERR_INVALID, "expected ':'");
            goto done;
        }
        p->i++;
        if (!parse_value(p, &cur->val)) goto done;
        skip_ws(p);
        if (p->s[p->i] == ',') {
            p->i++;
            continue;
        }
        if (p->s[p->i] == '}') {
            p->i++;
            break;
        }
        fail(p, QI_ERR_INVALID, "expected ',' or '}'");
        goto done;
    }
    qsort(m, n, sizeof *m, member_cmp);
    for (size_t k = 1; k < n; k++)
        if (member_cmp(&m[k - 1], &m[k]) == 0) {
            if (p->st == QI_OK) {
                p->st = QI_ERR_INVALID;
                QI_ERR(p->err, QI_ERR_INVALID, "config JSON: key \"%.*s\" appears twice in one object",
                       (int)(m[k].key.len > 200 ? 200 : m[k].key.len), m[k].key.p ? m[k].key.p : "");
            }
            goto done;
        }
    sb_putc(out, '{');
    for (size_t k = 0; k < n; k++) {
        if (k) sb_putc(out, ',');
        put_string(out, m[k].key.p ? m[k].key.p : "", m[k].key.len);
        sb_putc(out, ':');
        sb_put(out, m[k].val.p, m[k].val.len);
    }
    sb_putc(out, '}');
    ok = oom(p, out);
done:
    for (size_t k = 0; k < n; k++) {
        qi_free(m[k].key.p);
        qi_free(m[k].val.p);
    }
    qi_free(m);
    return ok;
}

static bool parse_array(parser *p, sbuf *out) {
    p->i++;
    sb_putc(out, '[');
    skip_ws(p);
    if (p->s[p->i] == ']') {
        p->i++;
        sb_putc(out, ']');
        return oom(p, out);
    }
    for (;;) {
        if (!parse_value(p, out)) return false;
        skip_ws(p);
        if (p->s[p->i] == ',') {
            p->i++;
            sb_putc(out, ',');
            continue;
        }
        if (p->s[p->i] == ']') {
            p->i++;
            sb_putc(out, ']');
            return oom(p, out);
        }
        return fail(p, QI_ERR_INVALID, "expected ',' or ']'");
    }
}

static bool literal(parser *p, const char *word, sbuf *out) {
    size_t n = strlen(word);
    if (strncmp((const char *)p->s + p->i, word, n) != 0) return fail(p, QI_ERR_INVALID, "unexpected character");
    p->i += n;
    sb_put(out, word, n);
    return oom(p, out);
}

static bool parse_value(parser *p, sbuf *out) {
    skip_ws(p);
    unsigned c = p->s[p->i];
    switch (c) {
    case '{':
    case '[': {
        if (p->depth >= QI_JSON_MAX_DEPTH) return fail(p, QI_ERR_INVALID, "nested too deeply");
        p->depth++;
        bool ok = c == '{' ? parse_object(p, out) : parse_array(p, out);
        p->depth--;
        return ok;
    }
    case '"': {
        sbuf raw = {0};
        bool ok = parse_string(p, &raw);
        if (ok) {
            put_string(out, raw.p ? raw.p : "", raw.len);
            ok = oom(p, out);
        }
        qi_free(raw.p);
        return ok;
    }
    case 't': return literal(p, "true", out);
    case 'f': return literal(p, "false", out);
    case 'n': return literal(p, "null", out);
    case 0: return fail(p, QI_ERR_INVALID, "unexpected end of text");
    default:
        if (c == '-' || is_digit(c)) return parse_number(p, out);
        return fail(p, QI_ERR_INVALID, "unexpected character");
    }
}

qi_status qi_json_canonical(const char *json, char **out, size_t *len, qi_err *err) {
    if (out) *out = NULL;
    if (len) *len = 0;
    if (!json || !out) return QI_ERR(err, QI_ERR_INVALID, "config JSON: no text given");
    parser p = {.s = (const unsigned char *)json, .err = err};
    sbuf b = {0};
    if (parse_value(&p, &b)) {
        skip_ws(&p);
        if (p.s[p.i] != 0) fail(&p, QI_ERR_INVALID, "text after the value");
    }
    if (p.st != QI_OK) {
        qi_free(b.p);
        return p.st;
    }
    *out = b.p;
    if (len) *len = b.len;
    return QI_OK;
}

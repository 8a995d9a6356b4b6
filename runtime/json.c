/* json.c: strict recursive-descent JSON parser and two small writers (see json.h). */
#include "json.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *s;
    size_t n, i;
    char *err;
    int errlen;
    bool failed;
} parser;

__attribute__((format(printf, 3, 4))) static int fail_at(parser *p, size_t at, const char *fmt, ...) {
    if (p->failed) return -1;
    p->failed = true;
    int k = snprintf(p->err, (size_t)p->errlen, "at byte %zu: ", at);
    if (k < 0) k = 0;
    if (k < p->errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(p->err + k, (size_t)(p->errlen - k), fmt, ap);
        va_end(ap);
    }
    return -1;
}

/* What is at position i, for messages: "'x'" or "the end of the text". */
static const char *what_at(parser *p, size_t i, char *buf, size_t n) {
    if (i >= p->n) return "the end of the text";
    unsigned char c = (unsigned char)p->s[i];
    if (c >= 0x20 && c < 0x7f)
        snprintf(buf, n, "'%c'", c);
    else
        snprintf(buf, n, "byte 0x%02x", c);
    return buf;
}

static void skip_ws(parser *p) {
    while (p->i < p->n) {
        char c = p->s[p->i];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
        p->i++;
    }
}

static int expect_literal(parser *p, const char *lit) {
    size_t n = strlen(lit), at = p->i;
    if (p->n - p->i < n || memcmp(p->s + p->i, lit, n) != 0)
        return fail_at(p, at, "expected a JSON value (string, number, object, array, true, false or null)");
    p->i += n;
    return 0;
}

static int hex4(parser *p, uint32_t *out) {
    if (p->n - p->i < 4) return fail_at(p, p->i, "\\u escape needs four hex digits");
    uint32_t v = 0;
    for (int k = 0; k < 4; k++) {
        char c = p->s[p->i + (size_t)k];
        int d = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (d < 0) return fail_at(p, p->i + (size_t)k, "\\u escape needs four hex digits");
        v = v * 16 + (uint32_t)d;
    }
    p->i += 4;
    *out = v;
    return 0;
}

static void put_utf8(cp_str *s, uint32_t cp) {
    char b[4];
    size_t n;
    if (cp < 0x80) {
        b[0] = (char)cp;
        n = 1;
    } else if (cp < 0x800) {
        b[0] = (char)(0xc0 | (cp >> 6));
        b[1] = (char)(0x80 | (cp & 0x3f));
        n = 2;
    } else if (cp < 0x10000) {
        b[0] = (char)(0xe0 | (cp >> 12));
        b[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        b[2] = (char)(0x80 | (cp & 0x3f));
        n = 3;
    } else {
        b[0] = (char)(0xf0 | (cp >> 18));
        b[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
        b[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
        b[3] = (char)(0x80 | (cp & 0x3f));
        n = 4;
    }
    cp_str_append(s, b, n);
}

/* Length of a valid UTF-8 sequence starting at s[0] (at most n bytes), or 0 when invalid. */
static size_t utf8_len(const unsigned char *s, size_t n) {
    unsigned char c = s[0];
    size_t len;
    uint32_t cp, min;
    if (c < 0x80) return 1;
    if ((c & 0xe0) == 0xc0)
        len = 2, cp = c & 0x1f, min = 0x80;
    else if ((c & 0xf0) == 0xe0)
        len = 3, cp = c & 0x0f, min = 0x800;
    else if ((c & 0xf8) == 0xf0)
        len = 4, cp = c & 0x07, min = 0x10000;
    else
        return 0;
    if (len > n) return 0;
    for (size_t k = 1; k < len; k++) {
        if ((s[k] & 0xc0) != 0x80) return 0;
        cp = (cp << 6) | (s[k] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
    return len;
}

static int parse_string(parser *p, char **out, size_t *outlen) {
    size_t at = p->i;
    p->i++; /* opening quote */
    cp_str s = {0};
    for (;;) {
        if (p->i >= p->n) {
            cp_str_free(&s);
            return fail_at(p, at, "string is not closed (no '\"' before the end of the text)");
        }
        unsigned char c = (unsigned char)p->s[p->i];
        if (c == '"') {
            p->i++;
            break;
        }
        if (c < 0x20) {
            cp_str_free(&s);
            return fail_at(p, p->i, "control byte 0x%02x inside a string (must be escaped)", c);
        }
        if (c == '\\') {
            if (p->i + 1 >= p->n) {
                cp_str_free(&s);
                return fail_at(p, p->i, "string ends inside an escape");
            }
            char e = p->s[p->i + 1];
            p->i += 2;
            char lit = 0;
            switch (e) {
            case '"': lit = '"'; break;
            case '\\': lit = '\\'; break;
            case '/': lit = '/'; break;
            case 'b': lit = '\b'; break;
            case 'f': lit = '\f'; break;
            case 'n': lit = '\n'; break;
            case 'r': lit = '\r'; break;
            case 't': lit = '\t'; break;
            case 'u': {
                uint32_t cp;
                size_t uat = p->i - 2;
                if (hex4(p, &cp)) {
                    cp_str_free(&s);
                    return -1;
                }
                if (cp >= 0xd800 && cp <= 0xdbff) {
                    uint32_t lo;
                    if (p->n - p->i < 2 || p->s[p->i] != '\\' || p->s[p->i + 1] != 'u') {
                        cp_str_free(&s);
                        return fail_at(p, uat, "\\u%04x is a high surrogate without its low half", cp);
                    }
                    p->i += 2;
                    if (hex4(p, &lo)) {
                        cp_str_free(&s);
                        return -1;
                    }
                    if (lo < 0xdc00 || lo > 0xdfff) {
                        cp_str_free(&s);
                        return fail_at(p, uat, "\\u%04x is a high surrogate followed by \\u%04x, not a low one", cp,
                                       lo);
                    }
                    cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
                } else if (cp >= 0xdc00 && cp <= 0xdfff) {
                    cp_str_free(&s);
                    return fail_at(p, uat, "\\u%04x is a lone low surrogate", cp);
                } else if (cp == 0) {
                    cp_str_free(&s);
                    return fail_at(p, uat, "\\u0000 (a NUL character) inside a string is not supported");
                }
                put_utf8(&s, cp);
                continue;
            }
            default:
                cp_str_free(&s);
                return fail_at(p, p->i - 2, "unknown escape '\\%c' in a string", e >= 0x20 && e < 0x7f ? e : '?');
            }
            cp_str_append(&s, &lit, 1);
            continue;
        }
        size_t k = utf8_len((const unsigned char *)p->s + p->i, p->n - p->i);
        if (!k) {
            cp_str_free(&s);
            return fail_at(p, p->i, "invalid UTF-8 byte 0x%02x in a string", c);
        }
        cp_str_append(&s, p->s + p->i, k);
        p->i += k;
    }
    if (!s.data) cp_str_append(&s, "", 0);
    *out = s.data;
    *outlen = s.len;
    return 0;
}

static bool is_digit(char c) { return c >= '0' && c <= '9'; }

static int parse_number(parser *p, cp_json *v) {
    size_t at = p->i, i = p->i;
    bool integral = true;
    if (i < p->n && p->s[i] == '-') i++;
    if (i >= p->n || !is_digit(p->s[i])) return fail_at(p, at, "malformed number: a digit must follow '-'");
    if (p->s[i] == '0') {
        i++;
        if (i < p->n && is_digit(p->s[i])) return fail_at(p, at, "malformed number: no leading zeros allowed");
    } else {
        while (i < p->n && is_digit(p->s[i])) i++;
    }
    if (i < p->n && p->s[i] == '.') {
        integral = false;
        i++;
        if (i >= p->n || !is_digit(p->s[i])) return fail_at(p, at, "malformed number: a digit must follow '.'");
        while (i < p->n && is_digit(p->s[i])) i++;
    }
    if (i < p->n && (p->s[i] == 'e' || p->s[i] == 'E')) {
        integral = false;
        i++;
        if (i < p->n && (p->s[i] == '+' || p->s[i] == '-')) i++;
        if (i >= p->n || !is_digit(p->s[i]))
            return fail_at(p, at, "malformed number: a digit must follow the exponent");
        while (i < p->n && is_digit(p->s[i])) i++;
    }
    size_t len = i - at;
    char buf[400];
    if (len >= sizeof buf)
        return fail_at(p, at, "number is %zu characters long; at most %zu are accepted", len, sizeof buf - 1);
    memcpy(buf, p->s + at, len);
    buf[len] = 0;
    v->type = CP_JSON_NUMBER;
    v->number = strtod(buf, NULL);
    if (integral) {
        errno = 0;
        long long ll = strtoll(buf, NULL, 10);
        if (errno == 0) {
            v->is_int = true;
            v->integer = ll;
        }
    }
    p->i = i;
    return 0;
}

static int cmp_keys(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int parse_value(parser *p, cp_json *v, int depth);

static int parse_container(parser *p, cp_json *v, int depth, bool object) {
    size_t at = p->i;
    if (depth >= CP_JSON_MAX_DEPTH) return fail_at(p, at, "nesting deeper than %d levels", CP_JSON_MAX_DEPTH);
    v->type = object ? CP_JSON_OBJECT : CP_JSON_ARRAY;
    p->i++;
    skip_ws(p);
    char close = object ? '}' : ']';
    if (p->i < p->n && p->s[p->i] == close) {
        p->i++;
        return 0;
    }
    int cap = 0;
    char buf[32];
    for (;;) {
        if (v->n == cap) {
            cap = cap ? cap * 2 : 8;
            v->items = cp_xrealloc(v->items, (size_t)cap * sizeof *v->items);
            if (object) v->keys = cp_xrealloc(v->keys, (size_t)cap * sizeof *v->keys);
        }
        cp_json *item = &v->items[v->n];
        memset(item, 0, sizeof *item);
        if (object) {
            skip_ws(p);
            if (p->i >= p->n || p->s[p->i] != '"')
                return fail_at(p, p->i, "expected a key string in the object opened at byte %zu, found %s", at,
                               what_at(p, p->i, buf, sizeof buf));
            size_t klen;
            v->keys[v->n] = NULL;
            if (parse_string(p, &v->keys[v->n], &klen)) return -1;
            v->n++; /* counted now so the key is freed on failure */
            skip_ws(p);
            if (p->i >= p->n || p->s[p->i] != ':')
                return fail_at(p, p->i, "expected ':' after the key \"%.80s\", found %s", v->keys[v->n - 1],
                               what_at(p, p->i, buf, sizeof buf));
            p->i++;
        } else {
            v->n++;
        }
        if (parse_value(p, item, depth + 1)) return -1;
        skip_ws(p);
        if (p->i < p->n && p->s[p->i] == ',') {
            p->i++;
            skip_ws(p);
            if (p->i < p->n && p->s[p->i] == close)
                return fail_at(p, p->i, "trailing comma before '%c' (not allowed in JSON)", close);
            continue;
        }
        if (p->i < p->n && p->s[p->i] == close) {
            p->i++;
            break;
        }
        return fail_at(p, p->i, "expected ',' or '%c' in the %s opened at byte %zu, found %s", close,
                       object ? "object" : "array", at, what_at(p, p->i, buf, sizeof buf));
    }
    if (object && v->n > 1) {
        char **sorted = cp_xmalloc((size_t)v->n * sizeof *sorted);
        memcpy(sorted, v->keys, (size_t)v->n * sizeof *sorted);
        qsort(sorted, (size_t)v->n, sizeof *sorted, cmp_keys);
        for (int k = 1; k < v->n; k++)
            if (!strcmp(sorted[k - 1], sorted[k])) {
                fail_at(p, at, "the object has the key \"%.200s\" twice", sorted[k]);
                free(sorted);
                return -1;
            }
        free(sorted);
    }
    return 0;
}

static int parse_value(parser *p, cp_json *v, int depth) {
    skip_ws(p);
    v->at = p->i;
    if (p->i >= p->n) return fail_at(p, p->i, "expected a JSON value, found the end of the text");
    char c = p->s[p->i];
    switch (c) {
    case '{': return parse_container(p, v, depth, true);
    case '[': return parse_container(p, v, depth, false);
    case '"': v->type = CP_JSON_STRING; return parse_string(p, &v->string, &v->len);
    case 't':
        v->type = CP_JSON_BOOL;
        v->boolean = true;
        return expect_literal(p, "true");
    case 'f':
        v->type = CP_JSON_BOOL;
        v->boolean = false;
        return expect_literal(p, "false");
    case 'n': v->type = CP_JSON_NULL; return expect_literal(p, "null");
    default:
        if (c == '-' || is_digit(c)) return parse_number(p, v);
        {
            char buf[32];
            return fail_at(p, p->i, "expected a JSON value, found %s", what_at(p, p->i, buf, sizeof buf));
        }
    }
}

int cp_json_parse(const char *text, size_t len, cp_json *out, char *err, int errlen) {
    parser p = {.s = text, .n = len, .err = err, .errlen = errlen};
    memset(out, 0, sizeof *out);
    if (parse_value(&p, out, 0) == 0) {
        skip_ws(&p);
        if (p.i == p.n) return 0;
        char buf[32];
        fail_at(&p, p.i, "unexpected %s after the end of the JSON value", what_at(&p, p.i, buf, sizeof buf));
    }
    cp_json_free(out);
    return -1;
}

void cp_json_free(cp_json *v) {
    if (!v) return;
    free(v->string);
    for (int k = 0; k < v->n; k++) {
        cp_json_free(&v->items[k]);
        if (v->keys) free(v->keys[k]);
    }
    free(v->items);
    free(v->keys);
    memset(v, 0, sizeof *v);
}

const cp_json *cp_json_get(const cp_json *v, const char *key) {
    if (!v || v->type != CP_JSON_OBJECT) return NULL;
    for (int k = 0; k < v->n; k++)
        if (!strcmp(v->keys[k], key)) return &v->items[k];
    return NULL;
}

const char *cp_json_type_name(cp_json_type t) {
    static const char *const names[] = {"null", "a boolean", "a number", "a string", "an array", "an object"};
    return (unsigned)t < CP_ARRAY_LEN(names) ? names[t] : "?";
}

void cp_json_put_string(cp_str *out, const char *s) {
    cp_str_append(out, "\"", 1);
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if (*c == '"' || *c == '\\') {
            char b[2] = {'\\', (char)*c};
            cp_str_append(out, b, 2);
        } else if (*c < 0x20) {
            cp_str_printf(out, "\\u%04x", *c);
        } else {
            cp_str_append(out, (const char *)c, 1);
        }
    }
    cp_str_append(out, "\"", 1);
}

void cp_json_put_number(cp_str *out, double v) {
    if (!isfinite(v)) {
        cp_str_append(out, "null", 4);
        return;
    }
    if (v == floor(v) && fabs(v) < 1e15) {
        cp_str_printf(out, "%.1f", v);
        return;
    }
    char buf[64];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, v);
        if (strtod(buf, NULL) == v) break;
    }
    cp_str_printf(out, "%s", buf);
}

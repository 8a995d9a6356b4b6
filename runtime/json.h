/* json.h: a small strict JSON (RFC 8259) parser into a tree, for the files cpgen reads from other tools:
 * safetensors headers, model.safetensors.index.json, config.json. No extensions: no comments, no trailing
 * commas, no NaN, no duplicate keys, valid UTF-8 only, nesting at most CP_JSON_MAX_DEPTH. */
#ifndef CP_JSON_H
#define CP_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util.h"

#define CP_JSON_MAX_DEPTH 64

typedef enum { CP_JSON_NULL, CP_JSON_BOOL, CP_JSON_NUMBER, CP_JSON_STRING, CP_JSON_ARRAY, CP_JSON_OBJECT } cp_json_type;

typedef struct cp_json {
    cp_json_type type;
    size_t at;             /* byte offset of the value in the text, for messages */
    bool boolean;          /* CP_JSON_BOOL */
    double number;         /* CP_JSON_NUMBER */
    bool is_int;           /* a number written without fraction or exponent that fits int64 */
    int64_t integer;       /* its value when is_int */
    char *string;          /* CP_JSON_STRING: UTF-8, NUL-terminated (a \u0000 escape is rejected) */
    size_t len;            /* string length in bytes */
    int n;                 /* CP_JSON_ARRAY, CP_JSON_OBJECT: element count */
    struct cp_json *items; /* elements, or object values in document order */
    char **keys;           /* CP_JSON_OBJECT: keys, parallel to items */
} cp_json;

/* Parse text[0, len) (need not be NUL-terminated). Returns 0, or -1 with "at byte N: what was wrong" in err and
 * *out left empty (safe to free). */
int cp_json_parse(const char *text, size_t len, cp_json *out, char *err, int errlen);
void cp_json_free(cp_json *v);

/* Member of an object by key, or NULL (also when v is not an object). */
const cp_json *cp_json_get(const cp_json *v, const char *key);
const char *cp_json_type_name(cp_json_type t);

/* Append s as a JSON string literal (quoted, escaped) to out. */
void cp_json_put_string(cp_str *out, const char *s);
/* Append a double so that it reads back to the same value ("1e-05", "500000.0"); NaN/inf are written as null. */
void cp_json_put_number(cp_str *out, double v);

#endif

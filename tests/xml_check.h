/* xml_check.h: a small well-formedness check for the SVG files cpgen writes, so tests can parse them without an
 * XML library: every tag closes in order, attribute values are quoted, entities are the five XML ones, and there
 * is one root element. Also finds elements by an attribute value. */
#ifndef CP_TEST_XML_CHECK_H
#define CP_TEST_XML_CHECK_H

#include <ctype.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

/* 0 when text is well-formed XML; else -1 with the problem and its byte offset in why. */
static inline int xml_check(const char *text, char *why, size_t whylen) {
    enum { DEPTH = 64 };
    char stack[DEPTH][32];
    int depth = 0, roots = 0;
    const char *p = text;
    if (!strncmp(p, "<?xml", 5)) {
        p = strstr(p, "?>");
        if (!p) return snprintf(why, whylen, "unterminated <?xml declaration"), -1;
        p += 2;
    }
    while (*p) {
        if (*p == '&') {
            static const char *ents[] = {"&lt;", "&gt;", "&amp;", "&quot;", "&apos;"};
            bool ok = false;
            for (int i = 0; i < 5; i++) ok |= !strncmp(p, ents[i], strlen(ents[i]));
            if (!ok) return snprintf(why, whylen, "bad entity at %td", p - text), -1;
            p++;
            continue;
        }
        if (*p != '<') {
            if (!depth && !isspace((unsigned char)*p)) return snprintf(why, whylen, "text outside the root at %td", p - text), -1;
            p++;
            continue;
        }
        bool closing = p[1] == '/';
        const char *n = p + 1 + closing, *e = n;
        while (isalnum((unsigned char)*e) || *e == '-' || *e == '_' || *e == ':') e++;
        if (e == n || e - n >= 32) return snprintf(why, whylen, "bad tag name at %td", p - text), -1;
        char name[32];
        snprintf(name, sizeof name, "%.*s", (int)(e - n), n);
        const char *q = e;
        while (*q && *q != '>') {
            if (*q == '"') {
                const char *end = strchr(q + 1, '"');
                if (!end) return snprintf(why, whylen, "unterminated attribute at %td", q - text), -1;
                if (memchr(q + 1, '<', (size_t)(end - q - 1))) return snprintf(why, whylen, "'<' in an attribute at %td", q - text), -1;
                q = end + 1;
            } else if (*q == '=' && q[1] != '"') {
                return snprintf(why, whylen, "unquoted attribute at %td", q - text), -1;
            } else {
                q++;
            }
        }
        if (!*q) return snprintf(why, whylen, "unterminated tag <%s", name), -1;
        bool empty = q[-1] == '/';
        if (closing) {
            if (!depth || strcmp(stack[depth - 1], name))
                return snprintf(why, whylen, "</%s> closes %s at %td", name, depth ? stack[depth - 1] : "nothing", p - text), -1;
            depth--;
        } else if (!empty) {
            if (!depth) roots++;
            if (depth == DEPTH) return snprintf(why, whylen, "nested too deep"), -1;
            snprintf(stack[depth++], sizeof stack[0], "%s", name);
        } else if (!depth) {
            roots++;
        }
        p = q + 1;
    }
    if (depth) return snprintf(why, whylen, "<%s> never closed", stack[depth - 1]), -1;
    if (roots != 1) return snprintf(why, whylen, "%d root elements", roots), -1;
    return 0;
}

/* The number of elements with attr="value" (exactly), e.g. xml_count(svg, "data-name", "checkpoints"). */
static inline int xml_count(const char *text, const char *attr, const char *value) {
    char needle[256];
    snprintf(needle, sizeof needle, " %s=\"%s\"", attr, value);
    int n = 0;
    for (const char *p = text; (p = strstr(p, needle)); p++) n++;
    return n;
}

#endif

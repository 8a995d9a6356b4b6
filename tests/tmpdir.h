/* tmpdir.h: the CPU tests' scratch folders: made fresh under /tmp for a group of tests, removed whole after it. */
#ifndef CP_TEST_TMPDIR_H
#define CP_TEST_TMPDIR_H

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "util.h"

/* A new empty folder /tmp/cpgen-test-<tag>-XXXXXX into dir (at least 64 bytes). Returns 0, or -1. */
static inline int tmpdir_make(char *dir, size_t n, const char *tag) {
    snprintf(dir, n, "/tmp/cpgen-test-%s-XXXXXX", tag);
    return mkdtemp(dir) ? 0 : -1;
}

/* root/<name>, the name made by printf from fmt: in a ring of 32, so a result stays valid for the next 31 calls. */
static inline char *tmpdir_path(const char *root, const char *fmt, ...) {
    static char buf[32][1024];
    static int k;
    char *b = buf[k++ % 32], name[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    snprintf(b, sizeof buf[0], "%s/%s", root, name);
    return b;
}

/* Whether anything is at path p. */
static inline bool path_exists(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0;
}

/* The folder and everything in it. */
static inline void tmpdir_remove(const char *dir) { cp_remove_tree(dir); }

#endif

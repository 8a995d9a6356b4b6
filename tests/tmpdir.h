/* tmpdir.h: the CPU tests' scratch folders: made fresh under /tmp for a group of tests, removed whole after it. */
#ifndef CP_TEST_TMPDIR_H
#define CP_TEST_TMPDIR_H

#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "util.h"

/* A new empty folder /tmp/cpgen-test-<tag>-XXXXXX into dir (at least 64 bytes). Returns 0, or -1. */
static inline int tmpdir_make(char *dir, size_t n, const char *tag) {
    snprintf(dir, n, "/tmp/cpgen-test-%s-XXXXXX", tag);
    return mkdtemp(dir) ? 0 : -1;
}

/* The folder and everything in it. */
static inline void tmpdir_remove(const char *dir) { cp_remove_tree(dir); }

#endif

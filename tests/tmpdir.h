/* tmpdir.h: the CPU tests' scratch folders: made fresh under /tmp for a group of tests, removed whole after it. */
#ifndef CP_TEST_TMPDIR_H
#define CP_TEST_TMPDIR_H

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

static int tmpdir_rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

/* A new empty folder /tmp/cpgen-test-<tag>-XXXXXX into dir (at least 64 bytes). Returns 0, or -1. */
static inline int tmpdir_make(char *dir, size_t n, const char *tag) {
    snprintf(dir, n, "/tmp/cpgen-test-%s-XXXXXX", tag);
    return mkdtemp(dir) ? 0 : -1;
}

/* The folder and everything in it. */
static inline void tmpdir_remove(const char *dir) { nftw(dir, tmpdir_rm_entry, 16, FTW_DEPTH | FTW_PHYS); }

#endif

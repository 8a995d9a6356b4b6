/* ckpt_keep.c: train.keep_checkpoints (ckpt_keep.h): the oldest complete checkpoints past the newest N deleted. */
#include "ckpt_keep.h"

#include <dirent.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint.h"
#include "util.h"

typedef struct {
    long long step;
    char name[64];
} found;

static int by_step(const void *a, const void *b) {
    const found *x = a, *y = b;
    return x->step < y->step ? -1 : x->step > y->step;
}

/* Whether path names the same folder as other (NULL: never). */
static bool same_dir(const char *path, const char *other) {
    struct stat a, b;
    return other && stat(path, &a) == 0 && stat(other, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

static void add(char *buf, size_t len, const char *fmt, const char *name, const char *why) {
    size_t at = strlen(buf);
    if (at + 1 < len) snprintf(buf + at, len - at, fmt, at ? ", " : "", name, why);
}

int cp_ckpt_keep(const char *out_dir, int keep, const char *newest, const char *resumed, char *removed,
                 size_t removed_len) {
    if (removed && removed_len) removed[0] = 0;
    if (keep <= 0) return 0;
    DIR *d = opendir(out_dir);
    if (!d) return 0;
    int n = 0, cap = 16;
    found *f = cp_xmalloc(sizeof *f * (size_t)cap);
    struct dirent *e;
    char p[CP_PATH_MAX + 80], why[CP_ERR_MAX];
    while ((e = readdir(d))) {
        long long step;
        int used = 0;
        /* exactly ckpt_<digits>: never a .tmp folder of a save in progress, nor anything else */
        if (sscanf(e->d_name, "ckpt_%lld%n", &step, &used) != 1 || e->d_name[used] || step < 0 ||
            strlen(e->d_name) >= sizeof f->name || e->d_name[5] < '0' || e->d_name[5] > '9')
            continue;
        snprintf(p, sizeof p, "%s/%s", out_dir, e->d_name);
        struct stat sb;
        if (lstat(p, &sb) != 0 || !S_ISDIR(sb.st_mode)) continue;
        if (cp_ckpt_dir_is_ours(p, true, why, sizeof why)) continue; /* incomplete, or not only cpgen's */
        if (n == cap) f = cp_xrealloc(f, sizeof *f * (size_t)(cap *= 2));
        f[n].step = step;
        snprintf(f[n].name, sizeof f[n].name, "%s", e->d_name);
        n++;
    }
    closedir(d);
    qsort(f, (size_t)n, sizeof *f, by_step);
    int gone = 0;
    char aside[CP_PATH_MAX + 120];
    for (int k = 0; k < n - keep; k++) {
        snprintf(p, sizeof p, "%s/%s", out_dir, f[k].name);
        if (same_dir(p, newest) || same_dir(p, resumed)) continue;
        /* first out of the way in one step, under the name a crashed save leaves (the next save removes such a
         * folder once this process is gone): never a half-removed folder under a checkpoint's name */
        snprintf(aside, sizeof aside, "%s.tmp.%ld", p, (long)getpid());
        if (rename(p, aside) != 0) {
            if (removed) add(removed, removed_len, "%s%s (not removed: %s)", f[k].name, strerror(errno));
            continue;
        }
        cp_remove_tree(aside);
        if (removed) add(removed, removed_len, "%s%s%s", f[k].name, "");
        gone++;
    }
    free(f);
    return gone;
}

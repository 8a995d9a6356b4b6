/* source_tree.h: tests read files by paths relative to the source tree; this moves there from wherever the test
 * binary was started (build/tests/x, or any folder), by walking up from the binary's own path. */
#ifndef CP_TEST_SOURCE_TREE_H
#define CP_TEST_SOURCE_TREE_H

#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* marker: a path that exists only at the top of the source tree, e.g. "tests/specs_bad" */
static inline void go_to_source_tree(const char *argv0, const char *marker) {
    if (access(marker, F_OK) == 0) return;
    char exe[PATH_MAX];
    if (!realpath(argv0, exe)) return;
    for (int up = 0; up < 4; up++) {
        char *slash = strrchr(exe, '/');
        if (!slash) return;
        *slash = 0;
        if (chdir(exe) == 0 && access(marker, F_OK) == 0) return;
    }
}

#endif

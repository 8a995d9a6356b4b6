/* sh.h: the CPU tests' way to run a command line (the cpgen binary, a tool) and read what it said. */
#ifndef CP_TEST_SH_H
#define CP_TEST_SH_H

#include <stdio.h>
#include <sys/wait.h>

#include "util.h"

/* Run a shell command; its exit status, its stdout and stderr together in out (owned). */
static inline int sh(const char *cmd, char **out) {
    char full[2048];
    snprintf(full, sizeof full, "%s 2>&1", cmd);
    FILE *p = popen(full, "r");
    cp_str s = {0};
    char buf[4096];
    size_t n;
    while (p && (n = fread(buf, 1, sizeof buf, p)) > 0) cp_str_append(&s, buf, n);
    int st = p ? pclose(p) : -1;
    *out = s.data ? s.data : cp_xstrdup("");
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

#endif

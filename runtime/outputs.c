/* outputs.c: the check that a run writes only over its own files (see outputs.h). */
#include "outputs.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "checkpoint.h"
#include "svg.h"
#include "trace.h"
#include "util.h"

bool cp_metrics_is_ours(const char *head, size_t n, const void *ctx) {
    (void)ctx;
    static const char start[] = "{\"step\":";
    return n >= sizeof start - 1 && !memcmp(head, start, sizeof start - 1);
}

/* Whether the run saves step n: every train.save_every steps and after the last. */
static bool saves(const cp_train *tr, long long n) {
    return tr->save_every > 0 && n >= 1 && n <= tr->steps && (n % tr->save_every == 0 || n == tr->steps);
}

int cp_run_outputs_check(const cp_spec *spec, const char *trace_path, char *err, int errlen) {
    const cp_train *tr = &spec->train;
    const char *dir = tr->out_dir, *fix = "move it away, or set train.out_dir to another folder";
    if (trace_path && cp_trace_check_path(trace_path, err, errlen)) return -1;
    struct stat st;
    if (stat(dir, &st) != 0) {
        if (errno == ENOENT) return 0; /* the run makes it; nothing is there to replace */
        return cp_errf(err, errlen, "train.out_dir = \"%s\": %s; set train.out_dir to a folder you can write", dir,
                       strerror(errno));
    }
    if (!S_ISDIR(st.st_mode))
        return cp_errf(err, errlen, "train.out_dir = \"%s\" is not a folder; set train.out_dir to a folder", dir);
    char p[CP_PATH_MAX + 300];
    snprintf(p, sizeof p, "%s/metrics.jsonl", dir);
    if (cp_may_replace(p, cp_metrics_is_ours, NULL, "a metrics.jsonl of a cpgen run", fix, err, errlen)) return -1;
    snprintf(p, sizeof p, "%s/report.svg", dir);
    if (cp_may_replace(p, cp_svg_is_ours, NULL, "a picture cpgen drew", fix, err, errlen)) return -1;
    if (tr->save_every <= 0) return 0;
    snprintf(p, sizeof p, "%s/%s", dir, CP_CKPT_LATEST_NAME);
    if (cp_may_replace(p, cp_ckpt_latest_is_ours, NULL, "a `latest` file cpgen wrote", fix, err, errlen)) return -1;
    DIR *d = opendir(dir);
    if (!d)
        return cp_errf(err, errlen, "train.out_dir = \"%s\" cannot be listed (%s); set train.out_dir to a folder you "
                       "can write", dir, strerror(errno));
    int rc = 0;
    struct dirent *e;
    while (!rc && (e = readdir(d))) {
        long long n;
        int used = 0;
        if (sscanf(e->d_name, "ckpt_%lld%n", &n, &used) != 1 || e->d_name[used] || !saves(tr, n)) continue;
        char why[CP_ERR_MAX] = "not a folder";
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        if (lstat(p, &st) != 0 || !S_ISDIR(st.st_mode) || cp_ckpt_dir_is_ours(p, true, why, sizeof why))
            rc = cp_errf(err, errlen, "%s is in the way of the run's checkpoint of step %lld, and it is not a "
                         "checkpoint cpgen saved (%s): a save would replace it; %s", p, n, why, fix);
    }
    closedir(d);
    return rc;
}

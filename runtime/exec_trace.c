/* exec_trace.c: after the traced step (`cpgen run --trace FILE`), its measured slices and the executor's waits into
 * the trace file (trace.h). With several GPUs every rank writes FILE.rank<N>, and rank 0 then merges the parts into
 * FILE, one process per rank, waiting for the others' parts as long as a collective would wait for them. */
#include "exec_internal.h"

#include <stdio.h>
#include <stdlib.h>

#include "util.h"

int exec_trace_write(cp_exec *ex, double step_seconds, char *err, int errlen) {
    const cp_plan *P = ex->P;
    int n = cp_trace_instances(P);
    double *start = cp_xmalloc(sizeof *start * (size_t)n), *end = cp_xmalloc(sizeof *end * (size_t)n);
    cp_trace_wait *waits = NULL;
    int rc = cp_trace_rec_read(ex->trace, start, end, err, errlen);
    if (!rc) {
        int nwaits = exec_wait_pairs(ex, &waits);
        cp_trace_rank r = {.rank = ex->o.rank, .step = ex->o.trace_step, .step_seconds = step_seconds,
                           .start = start, .end = end, .waits = waits, .nwaits = nwaits};
        char part[CP_PATH_MAX + 32];
        if (P->C > 1) cp_trace_part_path(ex->o.trace_path, ex->o.rank, part, sizeof part);
        else snprintf(part, sizeof part, "%s", ex->o.trace_path);
        rc = cp_trace_write(P, &r, part, err, errlen);
    }
    if (!rc && P->C > 1 && ex->o.rank == 0) {
        double timeout = ex->o.comm ? ex->o.comm->timeout_s : 300;
        rc = cp_trace_merge(ex->o.trace_path, P->C, timeout, err, errlen);
    }
    if (!rc && ex->o.out)
        fprintf(ex->o.out, "trace: %s (step %d, %d plan steps%s; open it in ui.perfetto.dev or chrome://tracing)\n",
                ex->o.trace_path, ex->o.trace_step, n, P->C > 1 ? " per rank, one process per rank" : "");
    free(start);
    free(end);
    free(waits);
    return rc;
}

/* exec_eval.c: the executor's side of the validation loss: a micro-batch's program walked up to its loss sum, running
 * only the steps the loss depends on (gen/plan_eval.h) and letting the others take their waits and record their
 * events without doing anything, so that the streams are ordered as in a training step; then the loss summed across
 * the run. No gradient is written, no backward or optimizer runs, and what the forward leaves in the arena the next
 * training step writes before it reads (the plan's lifetimes), so training continues as if nothing had run. */
#include "exec_internal.h"

#include <stdlib.h>

#include "plan_eval.h"
#include "util.h"

/* Which steps an evaluation runs, decided once per executor. */
static int eval_prepare(cp_exec *ex, char *err, int errlen) {
    if (ex->eval_run) return 0;
    cp_plan_eval e;
    if (cp_plan_eval_of(ex->P, &e, err, errlen)) return -1;
    ex->eval_run = e.run; /* owned by the executor now */
    ex->eval_end = e.end;
    return 0;
}

int cp_exec_eval(cp_exec *ex, const int32_t *tokens, const int32_t *targets, int n, int64_t targets_all,
                 double *loss_sum, char *err, int errlen) {
    const cp_plan *P = ex->P;
    *loss_sum = 0;
    if (n < 1 || n > P->spec.train.micro_batches)
        return cp_errf(err, errlen, "evaluation: %d sequences at once, outside 1..train.micro_batches (%d): the "
                       "caller must split them (a cpgen bug)", n, P->spec.train.micro_batches);
    if (eval_prepare(ex, err, errlen)) return -1;
    if (exec_stage_inputs(ex, n, tokens, targets, targets_all, err, errlen) < 0) return -1;
    /* the step profile and trace are of training steps: an evaluation between two is not timed as one */
    bool profiling = ex->profiling, tracing = ex->tracing;
    ex->profiling = ex->tracing = false;
    cudaStream_t cs = ex->streams[CP_STREAM_COMPUTE];
    int rc = 0;
    cudaError_t e = cudaMemsetAsync(ex->loss_sum, 0, CP_SCALARS_BYTES, cs);
    if (e != cudaSuccess) rc = cp_cuda_errmsg(e, "zeroing the evaluation's loss", err, errlen);
    for (int b = 0; b < n && !rc; b++) {
        rc = exec_join_streams(ex, err, errlen);
        for (int i = 0; i <= ex->eval_end && !rc; i++)
            rc = exec_run_step(ex, i, b, NULL, !ex->eval_run[i], err, errlen);
    }
    if (!rc) rc = exec_join_streams(ex, err, errlen);
    /* each rank's sum is its own tokens': the run's is the sum over all ranks of all groups */
    if (!rc && exec_run_comm(ex))
        rc = cp_nccl_all_reduce(exec_run_comm(ex), ex->loss_sum, ex->loss_sum, 1, ncclFloat32, ncclSum, cs, err,
                                errlen);
    if (!rc) rc = exec_read_scalars(ex, err, errlen);
    ex->profiling = profiling;
    ex->tracing = tracing;
    if (rc) return -1;
    *loss_sum = (double)ex->host_scalars[0];
    return 0;
}

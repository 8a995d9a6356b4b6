/* step_grads.c: one training step's gradients at given weights (step_grads.h). */
#include "step_grads.h"

#include <stdlib.h>

#include "data.h"
#include "doc_inputs.h"
#include "exec.h"
#include "gpu_util.h"
#include "util.h"

void step_grads(const cp_plan *p, const float *flat, int step, float *grads, double *loss) {
    char err[CP_ERR_MAX];
    cp_exec *ex;
    cp_exec_opts eo = {.out = NULL};
    if (cp_exec_create(&ex, p, &eo, err, sizeof err)) gu_fail("executor: %s", err);
    if (cp_exec_load_weights(ex, flat, err, sizeof err)) gu_fail("weights: %s", err);
    cp_dataset d;
    if (cp_dataset_open(&d, &p->spec, err, sizeof err)) gu_fail("data: %s", err);
    const int mb = p->spec.train.micro_batches;
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)p->T * (size_t)mb);
    int32_t *tgt = malloc(sizeof(int32_t) * (size_t)p->T * (size_t)mb);
    if (!tok || !tgt) gu_fail("step_grads: out of host memory");
    for (int s = 0; s < step; s++)
        for (int b = 0; b < mb; b++)
            if (cp_dataset_next(&d, 0, 1, tok, tgt, err, sizeof err)) gu_fail("data: %s", err);
    /* packed documents: each micro-batch's positions and document bounds, staged as a training step stages them */
    cp_doc_inputs di;
    cp_doc_inputs_init(&di, p);
    const cp_data_slice one = {.replica = 0, .replicas = 1, .ring_pos = 0, .ring = 1, .rank = 0, .gpus = 1};
    for (int b = 0; b < mb; b++) {
        if (cp_dataset_next(&d, 0, 1, tok + (size_t)b * p->T, tgt + (size_t)b * p->T, err, sizeof err))
            gu_fail("data: %s", err);
        if (cp_doc_inputs_add(&di, p, &one, &d, err, sizeof err)) gu_fail("%s", err);
    }
    cp_dataset_close(&d);
    if (cp_doc_inputs_stage(&di, ex, err, sizeof err)) gu_fail("documents: %s", err);
    cp_doc_inputs_free(&di);
    if (cp_exec_gradients(ex, tok, tgt, 0, loss, err, sizeof err) ||
        cp_exec_read_grads(ex, grads, true, err, sizeof err))
        gu_fail("gradients: %s", err);
    cp_exec_destroy(ex);
    free(tok);
    free(tgt);
}

/* test_validation.c: the validation loss's forward on the GPU (cp_exec_eval, runtime/exec_eval.c) with tiny on one GPU,
 * in each layout a step takes there (as shipped; checkpoints offloaded and the optimizer on the host; attention
 * outputs kept on the host; kept on the GPU; a checkpoint every 2 layers; one micro-batch):
 *   1. it leaves the training state alone: after an evaluation the fp32 master weights, both AdamW moments, the update
 *      count, the gradients and the bf16 parameters read back bit for bit as before it;
 *   2. training goes on as if it had not run: 3 steps with an evaluation after each give the losses and gradient
 *      norms, as bits, of 3 steps from the same weights without;
 *   3. with lr = 0 (the weights stay) an evaluation of a step's own sequences gives that step's loss within 1e-5
 *      relative, before the step and after it, and the same bits both times.
 * tools/gpu-eval-check.sh runs it, and `cpgen run` with evaluations on layouts of several ranks. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <cuda_runtime_api.h>

#include "data.h"
#include "exec.h"
#include "gpu_util.h"
#include "plan.h"
#include "spec.h"
#include "util.h"
#include "weights.h"

#define STEPS 3

typedef struct {
    float *w, *m, *v, *g;
    uint16_t *params;
    int updates;
} state_copy;

static void snapshot(cp_exec *ex, const cp_plan *p, state_copy *s) {
    char err[CP_ERR_MAX];
    size_t n = (size_t)cp_weights_elems(p);
    s->w = malloc(n * sizeof(float)), s->m = malloc(n * sizeof(float)), s->v = malloc(n * sizeof(float));
    s->g = malloc(n * sizeof(float));
    s->params = malloc((size_t)p->params_shard * 2);
    assert_true(s->w && s->m && s->v && s->g && s->params);
    if (cp_exec_read_weights(ex, s->w, err, sizeof err) ||
        cp_exec_read_optimizer(ex, s->m, s->v, &s->updates, err, sizeof err) ||
        cp_exec_read_grads(ex, s->g, false, err, sizeof err))
        fail_msg("reading the state: %s", err);
    const void *dp = cp_exec_buffer(ex, "params.bf16");
    assert_non_null(dp);
    assert_int_equal(cudaMemcpy(s->params, dp, (size_t)p->params_shard * 2, cudaMemcpyDeviceToHost), cudaSuccess);
}

static void snapshot_free(state_copy *s) {
    free(s->w), free(s->m), free(s->v), free(s->g), free(s->params);
}

static void same_state(const state_copy *a, const state_copy *b, const cp_plan *p, const char *when) {
    size_t n = (size_t)cp_weights_elems(p) * sizeof(float);
    const struct {
        const char *name;
        const void *x, *y;
        size_t bytes;
    } parts[] = {{"master weights", a->w, b->w, n}, {"first moments", a->m, b->m, n}, {"second moments", a->v, b->v, n},
                 {"gradients", a->g, b->g, n}, {"bf16 parameters", a->params, b->params, (size_t)p->params_shard * 2}};
    for (size_t k = 0; k < CP_ARRAY_LEN(parts); k++)
        if (memcmp(parts[k].x, parts[k].y, parts[k].bytes)) fail_msg("%s: the %s changed", when, parts[k].name);
    assert_int_equal(a->updates, b->updates);
}

static int64_t count_targets(const int32_t *tgt, int64_t n) {
    int64_t c = 0;
    for (int64_t i = 0; i < n; i++) c += tgt[i] >= 0;
    return c;
}

static void run_variant(int nsets, const char **sets) {
    char err[CP_ERR_MAX];
    cp_spec s;
    if (cp_spec_load("tiny", sets, nsets, &s, err, sizeof err) || cp_data_resolve_documents(&s, err, sizeof err))
        fail_msg("spec: %s", err);
    cp_plan p;
    if (cp_plan_build(&s, &p, err, sizeof err)) fail_msg("plan: %s", err);
    char label[160] = "tiny";
    for (int i = 1; i < nsets; i++) /* sets[0] is the warmup every variant has */
        snprintf(label + strlen(label), sizeof label - strlen(label), " %s", sets[i]);
    printf("\n== %s\n", label);
    cp_exec *ex;
    cp_exec_opts eo = {.out = NULL};
    if (cp_exec_create(&ex, &p, &eo, err, sizeof err)) fail_msg("executor: %s", err);
    float *flat = malloc(sizeof(float) * (size_t)cp_weights_elems(&p));
    assert_non_null(flat);
    cp_weights_init_random(&p, s.init.seed, s.init.std, flat);
    const int mb = s.train.micro_batches;
    const size_t per = (size_t)p.T * (size_t)mb;
    int32_t *tok = malloc(sizeof(int32_t) * per * STEPS), *tgt = malloc(sizeof(int32_t) * per * STEPS);
    cp_dataset d;
    if (cp_dataset_open(&d, &s, err, sizeof err)) fail_msg("data: %s", err);
    for (size_t b = 0; b < (size_t)mb * STEPS; b++)
        if (cp_dataset_next(&d, 0, 1, tok + b * (size_t)p.T, tgt + b * (size_t)p.T, err, sizeof err))
            fail_msg("%s", err);
    cp_dataset_close(&d);
    cp_optim_hp hp = {.lr = s.train.lr, .beta1 = s.train.beta1, .beta2 = s.train.beta2, .eps = s.train.eps,
                      .weight_decay = s.train.weight_decay, .clip = s.train.clip};
    cp_step_result r;
    double loss_a[STEPS], norm_a[STEPS], sum;

    /* 1 and 2: steps with an evaluation after each (of the next step's sequences), the state compared around it */
    if (cp_exec_load_weights(ex, flat, err, sizeof err)) fail_msg("%s", err);
    for (int k = 0; k < STEPS; k++) {
        if (cp_exec_step(ex, tok + k * per, tgt + k * per, &hp, NULL, &r, err, sizeof err)) fail_msg("step: %s", err);
        loss_a[k] = r.loss, norm_a[k] = r.norm;
        state_copy before, after;
        snapshot(ex, &p, &before);
        int next = (k + 1) % STEPS;
        if (cp_exec_eval(ex, tok + next * per, tgt + next * per, mb, 0, &sum, err, sizeof err))
            fail_msg("eval: %s", err);
        snapshot(ex, &p, &after);
        char when[64];
        snprintf(when, sizeof when, "an evaluation after step %d", k + 1);
        same_state(&before, &after, &p, when);
        snapshot_free(&before), snapshot_free(&after);
        printf("step %d: loss %.6f norm %.4f | evaluation of %d sequences: loss %.6f | the state unchanged\n", k + 1,
               r.loss, r.norm, mb, sum / (double)count_targets(tgt + next * per, (int64_t)per));
        gu_check("state after eval", label, 0, 0); /* reached only when every bit matched */
    }
    if (cp_exec_load_weights(ex, flat, err, sizeof err)) fail_msg("%s", err);
    for (int k = 0; k < STEPS; k++) {
        if (cp_exec_step(ex, tok + k * per, tgt + k * per, &hp, NULL, &r, err, sizeof err)) fail_msg("step: %s", err);
        if (memcmp(&r.loss, &loss_a[k], sizeof r.loss) || memcmp(&r.norm, &norm_a[k], sizeof r.norm))
            fail_msg("step %d: loss %.9g, norm %.9g without evaluations; %.9g, %.9g with them", k + 1, r.loss, r.norm,
                     loss_a[k], norm_a[k]);
    }
    printf("%d steps without evaluations: the same losses and norms, bit for bit\n", STEPS);
    gu_check("steps after evals", label, 0, 0);

    /* 3: lr = 0, the evaluation of step 1's sequences against step 1's loss */
    if (cp_exec_load_weights(ex, flat, err, sizeof err)) fail_msg("%s", err);
    hp.lr = 0;
    double before, after;
    if (cp_exec_eval(ex, tok, tgt, mb, 0, &before, err, sizeof err)) fail_msg("eval: %s", err);
    if (cp_exec_step(ex, tok, tgt, &hp, NULL, &r, err, sizeof err)) fail_msg("step: %s", err);
    if (cp_exec_eval(ex, tok, tgt, mb, 0, &after, err, sizeof err)) fail_msg("eval: %s", err);
    double t = (double)count_targets(tgt, (int64_t)per), rel = fabs(before / t - r.loss) / r.loss;
    printf("lr = 0: step 1's loss %.9g, the evaluation of its sequences %.9g before it and %.9g after (relative "
           "difference %.2e)\n", r.loss, before / t, after / t, rel);
    assert_true(memcmp(&before, &after, sizeof before) == 0);
    gu_check("eval vs step, lr 0", label, rel, 1e-5);
    cp_exec_destroy(ex);
    free(flat), free(tok), free(tgt);
    cp_plan_free(&p);
}

static void test_layouts(void **state) {
    (void)state;
    const char *variants[][3] = {{"train.warmup=0", NULL, NULL},
                                 {"train.warmup=0", "parallel.offload=all", "parallel.optimizer=host"},
                                 {"train.warmup=0", "parallel.attention_output=host", NULL},
                                 {"train.warmup=0", "parallel.attention_output=gpu", NULL},
                                 {"train.warmup=0", "parallel.checkpoint_every=2", "parallel.offload=none"},
                                 {"train.warmup=0", "train.micro_batches=1", NULL}};
    for (size_t v = 0; v < CP_ARRAY_LEN(variants); v++) {
        int n = variants[v][2] ? 3 : variants[v][1] ? 2 : 1;
        run_variant(n, variants[v]);
    }
}

int main(void) {
    gu_need_gpus("test_validation", 1); /* before any CUDA context: the executor measures its own */
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_layouts)};
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    gu_print_table();
    return gu_status(failed);
}

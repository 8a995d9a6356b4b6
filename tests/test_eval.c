/* test_eval.c: the validation loss without a GPU. The plan's side (gen/plan_eval.c): on the shipped shapes and every
 * layout (Ulysses, UPipe, replicas, rings, offloaded checkpoints, kept attention outputs, the host optimizer, sparse
 * checkpoints, tied and Qwen3 heads, micro-batches) an evaluation runs every step of the forward up to the loss sum
 * and nothing else: not the loss tiles' gradients, not the clearing of gradient buffers, not the copies to the host
 * that only the backward reads; none of what it runs writes the training state; its predicted time is the same from
 * the folded plan as from the flat one, and below a step's. Plans changed to break each rule are refused with the
 * step named. The plan's lines and JSON. The run's side (runtime/eval.c): when an evaluation is due, what it prints
 * and logs, and the held-out data it opens. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eval.h"
#include "exec.h"
#include "json.h"
#include "plan.h"
#include "plan_eval.h"
#include "spec.h"
#include "util.h"

static char err[CP_ERR_MAX];

static void load(cp_spec *s, const char *name, int nsets, const char *const *sets) {
    if (cp_spec_load(name, sets, nsets, s, err, sizeof err)) fail_msg("spec %s: %s", name, err);
}

static bool writes_cat(const cp_plan *P, const cp_step *s, cp_cat a, cp_cat b) {
    for (int j = 0; j < s->nops; j++)
        if ((s->ops[j].access & CP_WRITE) && (P->bufs[s->ops[j].buf].cat == a || P->bufs[s->ops[j].buf].cat == b))
            return true;
    return false;
}

/* What an evaluation must leave out of the steps before the loss sum: the backward's steps (the loss tiles' weight and
 * input gradients), the clearing of gradient buffers, and the copies to the host (checkpoints and kept attention
 * outputs, read back only by the backward). Everything else of the forward computes toward the loss. */
static bool left_out(const cp_plan *P, const cp_step *s) {
    return s->phase != CP_PHASE_FWD || writes_cat(P, s, CP_CAT_GRADS, CP_CAT_UNIT_GRADS) || s->kind == CP_OP_COPY_D2H;
}

/* The evaluation of `name` with sets, flat and folded: checked as the header says; returns steps run (flat). */
static int check(const char *name, int nsets, ...) {
    const char *sets[16];
    va_list ap;
    va_start(ap, nsets);
    for (int i = 0; i < nsets; i++) sets[i] = va_arg(ap, const char *);
    va_end(ap);
    cp_spec s;
    load(&s, name, nsets, sets);
    cp_plan flat, folded;
    if (cp_plan_build(&s, &flat, err, sizeof err)) fail_msg("plan %s: %s", name, err);
    if (cp_plan_build_folded(&s, &folded, err, sizeof err)) fail_msg("plan %s: %s", name, err);
    cp_plan_eval e, ef;
    if (cp_plan_eval_of(&flat, &e, err, sizeof err)) fail_msg("%s: %s", name, err);
    if (cp_plan_eval_of(&folded, &ef, err, sizeof err)) fail_msg("%s (folded): %s", name, err);
    assert_int_equal(flat.steps[e.end].task, CP_TASK_LOSS_SUM);
    assert_true(e.end < flat.micro_steps);
    int ran = 0, left = 0, d2h = 0, grads = 0;
    for (int i = 0; i <= e.end; i++) {
        const cp_step *st = &flat.steps[i];
        bool out = left_out(&flat, st);
        if (e.run[i] == out)
            fail_msg("%s: step %d (%s %s, layer %d, %s) %s", name, i, cp_phase_name(st->phase), st->what, st->layer,
                     cp_opkind_name(st->kind), out ? "runs in an evaluation" : "is left out of an evaluation");
        if (e.run[i]) {
            ran++;
            for (int j = 0; j < st->nops; j++) {
                const cp_buffer *b = &flat.bufs[st->ops[j].buf];
                if ((st->ops[j].access & CP_WRITE) && b->persistent && b->cat != CP_CAT_WORKSPACE)
                    fail_msg("%s: step %d (%s) writes %s in an evaluation", name, i, st->what, b->name);
            }
        } else {
            left++;
            d2h += st->kind == CP_OP_COPY_D2H;
            grads += writes_cat(&flat, st, CP_CAT_GRADS, CP_CAT_UNIT_GRADS);
        }
    }
    assert_int_equal(ran, e.nrun);
    assert_true(left >= 2 * (int)(flat.T / flat.loss_tile)); /* every loss tile's d_lm_head and d_x_final */
    assert_true(grads >= (int)(flat.T / flat.loss_tile));
    if (flat.ckpt_host_layers > 0 || flat.attn_host_layers > 0) assert_true(d2h > 0);
    /* the same time from the folded plan (a loop's body counted once per tile) as from the flat one */
    if (!(fabs(e.seconds - ef.seconds) <= 1e-9 * e.seconds))
        fail_msg("%s: %.9g s flat, %.9g s folded", name, e.seconds, ef.seconds);
    assert_true(ef.nrun <= e.nrun);
    /* a forward costs less than a step's forward and backward of as many micro-batches */
    assert_true(e.seconds > 0 && e.seconds * s.train.micro_batches < flat.t_step);
    cp_exec_check_report rep;
    if (cp_exec_check(&flat, &rep, err, sizeof err)) fail_msg("%s: %s", name, err);
    assert_int_equal(rep.eval_steps, e.nrun);
    printf("  %-8s", name);
    for (int i = 0; i < nsets; i++) printf(" %s", sets[i]);
    printf("\n    evaluation: %d of %d steps before the loss sum run (%d left out: %d copies to the host, %d on "
           "gradients), %.4g ms a sequence against a %.4g ms step of %d\n",
           ran, e.end + 1, left, d2h, grads, e.seconds * 1e3, flat.t_step * 1e3, s.train.micro_batches);
    cp_plan_eval_free(&e);
    cp_plan_eval_free(&ef);
    cp_plan_free(&flat);
    cp_plan_free(&folded);
    return ran;
}

static void test_one_gpu(void **state) {
    (void)state;
    check("tiny", 0);
    check("tiny", 1, "parallel.upipe_heads=2");
    check("tiny", 1, "train.micro_batches=3");
    check("tiny", 1, "parallel.checkpoint=none");
    check("tiny", 2, "parallel.mlp_tile=512", "parallel.loss_tile=256");
    check("tiny", 2, "parallel.offload=all", "parallel.optimizer=host");
    check("tiny", 1, "parallel.attention_output=host");
    check("tiny", 1, "parallel.attention_output=gpu");
    check("tiny", 3, "parallel.checkpoint_every=2", "parallel.offload=none", "train.micro_batches=2");
    check("tiny", 2, "model.family=qwen3", "model.tie_embeddings=true");
    check("llama1b", 4, "parallel.gpus=1", "model.layers=2", "train.seq_len=4K", "parallel.upipe_heads=8");
    check("llama3b", 3, "parallel.gpus=1", "model.layers=2", "train.seq_len=4K");
    check("llama8b", 4, "parallel.gpus=1", "model.layers=2", "train.seq_len=8K", "parallel.offload=all");
    check("qwen32b", 3, "parallel.gpus=1", "model.layers=1", "train.seq_len=4K");
}

/* Layouts of several ranks: their gathers, all-to-alls and a ring's send/recvs of the forward run (every rank runs
 * the same plan and so the same collectives); a plan of 2 GPUs runs more steps than one of 1 (the all-to-alls). */
static void test_layouts(void **state) {
    (void)state;
    int one = check("tiny", 0), two = check("tiny", 1, "parallel.gpus=2");
    assert_true(two > one);
    check("tiny", 2, "parallel.gpus=2", "parallel.upipe_heads=2");
    check("tiny", 2, "parallel.gpus=4", "parallel.upipe_heads=4");
    check("tiny", 3, "parallel.gpus=2", "model.family=qwen3", "model.tie_embeddings=true");
    check("tiny", 3, "parallel.gpus=2", "parallel.offload=all", "parallel.optimizer=host");
    check("tiny", 3, "parallel.gpus=2", "parallel.attention_output=host", "train.micro_batches=2");
    check("tiny", 2, "parallel.gpus=2", "parallel.replicas=2");
    check("tiny", 2, "parallel.replicas=2", "parallel.upipe_heads=2");
    check("tiny", 2, "parallel.ring=2", "parallel.upipe_heads=1");
    check("tiny", 3, "parallel.ring=4", "parallel.gpus=2", "parallel.upipe_heads=2");
    check("tiny", 4, "parallel.ring=2", "parallel.replicas=2", "parallel.gpus=1", "parallel.upipe_heads=2");
    check("llama8b", 4, "parallel.gpus=8", "model.layers=2", "train.seq_len=64K", "parallel.upipe_heads=8");
    check("llama8b", 5, "parallel.ring=2", "parallel.gpus=4", "parallel.upipe_heads=4", "model.layers=2",
          "train.seq_len=16K");
    check("llama1b", 5, "parallel.gpus=2", "model.layers=5", "train.seq_len=8K", "parallel.checkpoint_every=2",
          "parallel.offload=none");
}

/* The index of the first step of task t in the micro-batch, else of the first step whose `what` is `what`. */
static int find(const cp_plan *P, cp_task t, const char *what) {
    for (int i = 0; i < P->micro_steps; i++)
        if ((t != CP_TASK_NONE && P->steps[i].task == t) || (what && !strcmp(P->steps[i].what, what))) return i;
    fail_msg("no step %s", what ? what : cp_task_name(t));
    return -1;
}

static int buf(const cp_plan *P, const char *name) {
    for (int b = 0; b < P->nbufs; b++)
        if (!strcmp(P->bufs[b].name, name)) return b;
    fail_msg("no buffer %s", name);
    return -1;
}

static void add_op(cp_step *s, int b, int64_t bytes, int access) {
    assert_true(s->nops < CP_MAX_OPERANDS);
    s->ops[s->nops++] = (cp_operand){.buf = b, .offset = 0, .bytes = bytes, .access = access};
}

/* Plans changed to break each rule: the step that breaks it is named, and the evaluation refused. */
static void test_refusals(void **state) {
    (void)state;
    cp_spec s;
    load(&s, "tiny", 0, NULL);
    cp_plan P;
    cp_plan_eval e;
    if (cp_plan_build(&s, &P, err, sizeof err)) fail_msg("%s", err);
    int sum = find(&P, CP_TASK_LOSS_SUM, NULL), loss = find(&P, CP_TASK_LOSS, NULL);
    /* the loss kernel also writing the gradients */
    cp_step keep = P.steps[loss];
    add_op(&P.steps[loss], buf(&P, "grads.f32"), 4, CP_RW);
    assert_int_equal(cp_plan_eval_of(&P, &e, err, sizeof err), -1);
    if (!strstr(err, "would change the training state") || !strstr(err, "loss") || !strstr(err, "grads.f32"))
        fail_msg("%s", err);
    P.steps[loss] = keep;
    /* ... or the master weights */
    add_op(&P.steps[loss], buf(&P, "master.f32"), 4, CP_WRITE);
    assert_int_equal(cp_plan_eval_of(&P, &e, err, sizeof err), -1);
    if (!strstr(err, "master.f32")) fail_msg("%s", err);
    P.steps[loss] = keep;
    /* the loss sum depending on what only the backward writes (d_x_final's output) */
    keep = P.steps[sum];
    add_op(&P.steps[sum], buf(&P, "d_x_final_norm"), 4, CP_READ);
    assert_int_equal(cp_plan_eval_of(&P, &e, err, sizeof err), -1);
    if (!strstr(err, "not of the forward") || !strstr(err, "d_x_final")) fail_msg("%s", err);
    P.steps[sum] = keep;
    /* ... or on a buffer nothing before it writes */
    add_op(&P.steps[sum], buf(&P, "d_h2"), 4, CP_READ);
    assert_int_equal(cp_plan_eval_of(&P, &e, err, sizeof err), -1);
    if (!strstr(err, "reads d_h2, which no step it runs wrote before")) fail_msg("%s", err);
    P.steps[sum] = keep;
    /* no loss sum at all */
    P.steps[sum].task = CP_TASK_NONE;
    assert_int_equal(cp_plan_eval_of(&P, &e, err, sizeof err), -1);
    if (!strstr(err, "no loss sum")) fail_msg("%s", err);
    P.steps[sum] = keep;
    /* and put back, accepted */
    assert_int_equal(cp_plan_eval_of(&P, &e, err, sizeof err), 0);
    cp_plan_eval_free(&e);
    cp_plan_free(&P);
}

/* How many evaluations a run has, and what the plan says of them: one line with the sequences, the spacing, the
 * memory and the predicted time, the run's predicted time with them counted, and the same in JSON; nothing (and
 * null) without evaluation. */
static void test_plan_lines(void **state) {
    (void)state;
    cp_spec s;
    load(&s, "tiny", 0, NULL);
    assert_int_equal(cp_plan_eval_count(&s), 0);
    s.train.eval_every = 80;
    assert_int_equal(cp_plan_eval_count(&s), 10);
    s.train.steps = 25, s.train.eval_every = 10;
    assert_int_equal(cp_plan_eval_count(&s), 3); /* after 10, 20 and 25 */
    s.train.eval_every = 30;
    assert_int_equal(cp_plan_eval_count(&s), 1);

    const char *sets[] = {"data.val=synthetic:copy", "parallel.replicas=2", "train.micro_batches=2",
                          "train.eval_sequences=6"};
    load(&s, "tiny", 4, sets);
    cp_plan P;
    if (cp_plan_build_folded(&s, &P, err, sizeof err)) fail_msg("%s", err);
    cp_plan_eval e;
    if (cp_plan_eval_of(&P, &e, err, sizeof err)) fail_msg("%s", err);
    /* each of the 2 groups evaluates 3 sequences, then the loss is summed across the nodes */
    double one = cp_plan_eval_seconds(&P, &e);
    assert_true(fabs(one - (3 * e.seconds + s.machine.net_us * 1e-6)) <= 1e-12);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    cp_plan_print(&P, f, false);
    fclose(f);
    char want[256];
    snprintf(want, sizeof want, "evaluation: forward of 6 sequences every 80 steps, within the step's memory, "
                                "predicted ");
    if (!strstr(text, want)) fail_msg("no \"%s\" in:\n%s", want, text);
    if (!strstr(text, "data.val = \"synthetic:copy\"")) fail_msg("%s", text);
    double total = 800 * P.t_step + 10 * one;
    char run[160];
    if (total >= 1) snprintf(run, sizeof run, "predicted run: %.2f s = 800 steps of ", total);
    else snprintf(run, sizeof run, "predicted run: %.2f ms = 800 steps of ", total * 1e3);
    if (!strstr(text, run)) fail_msg("no \"%s\" in:\n%s", run, text);
    if (!strstr(text, "+ 10 evaluations of ")) fail_msg("%s", text);
    free(text);
    text = NULL;
    f = open_memstream(&text, &len);
    cp_plan_print_json(&P, f);
    fclose(f);
    cp_json j;
    if (cp_json_parse(text, len, &j, err, sizeof err)) fail_msg("JSON: %s\n%s", err, text);
    const cp_json *ev = cp_json_get(&j, "evaluation");
    assert_non_null(ev);
    assert_int_equal(ev->type, CP_JSON_OBJECT);
    assert_int_equal(cp_json_get(ev, "every")->integer, 80);
    assert_int_equal(cp_json_get(ev, "sequences")->integer, 6);
    assert_int_equal(cp_json_get(ev, "evaluations")->integer, 10);
    assert_int_equal(cp_json_get(ev, "steps_run")->integer, e.nrun);
    assert_true(fabs(cp_json_get(ev, "seconds")->number - one) <= 1e-5 * one);
    assert_true(fabs(cp_json_get(ev, "run_seconds")->number - total) <= 1e-5 * total);
    cp_json_free(&j);
    free(text);
    cp_plan_eval_free(&e);
    cp_plan_free(&P);

    load(&s, "tiny", 0, NULL);
    if (cp_plan_build_folded(&s, &P, err, sizeof err)) fail_msg("%s", err);
    text = NULL;
    f = open_memstream(&text, &len);
    cp_plan_print(&P, f, false);
    cp_plan_print_json(&P, f);
    fclose(f);
    if (strstr(text, "evaluation:") || strstr(text, "predicted run")) fail_msg("%s", text);
    if (!strstr(text, "\"evaluation\": null")) fail_msg("%s", text);
    free(text);
    cp_plan_free(&P);
}

/* The run's side that needs no GPU: when an evaluation is due (every eval_every-th step and the last), what the step
 * line, the metrics line and the end of the run say, and the start-up line of cp_eval_open. */
static void test_run_side(void **state) {
    (void)state;
    const char *sets[] = {"data.val=synthetic:copy", "train.steps=25", "train.eval_every=10", "train.warmup=0",
                          "train.eval_sequences=3"};
    cp_spec s;
    load(&s, "tiny", 5, sets);
    cp_plan P;
    if (cp_plan_build(&s, &P, err, sizeof err)) fail_msg("%s", err);
    cp_data_slice sl = {.replica = 0, .replicas = 1, .ring_pos = 0, .ring = 1, .rank = 0, .gpus = 1};
    cp_eval ev;
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (cp_eval_open(&ev, &P, &sl, f, err, sizeof err)) fail_msg("%s", err);
    fclose(f);
    assert_string_equal(text, "evaluation: 3 sequences of data.val = \"synthetic:copy\" after every 10 steps and after "
                              "the last\n");
    free(text);
    assert_true(ev.on);
    assert_int_equal(ev.rounds, 3);
    int due[] = {10, 20, 25}, n = 0;
    for (int st = 0; st <= 26; st++)
        if (cp_eval_due(&ev, st)) {
            assert_true(n < 3);
            assert_int_equal(st, due[n++]);
        }
    assert_int_equal(n, 3);
    /* a step with nothing due: no evaluation and no executor touched */
    cp_eval_result r;
    assert_int_equal(cp_eval_after(&ev, NULL, 11, &r, err, sizeof err), 0);
    assert_false(r.done);
    char b[64];
    assert_string_equal(cp_eval_step_text(&r, b, sizeof b), "");
    assert_string_equal(cp_eval_done_text(&ev, b, sizeof b), "");
    r = (cp_eval_result){.done = true, .loss = 3.14159265, .tokens = 3069, .seconds = 0.25};
    assert_string_equal(cp_eval_step_text(&r, b, sizeof b), " | val loss 3.1416");
    text = NULL;
    f = open_memstream(&text, &len);
    fprintf(f, "{\"step\":20,");
    cp_eval_metrics(f, &r);
    fprintf(f, "\"skipped\":false}");
    fclose(f);
    cp_json j;
    if (cp_json_parse(text, len, &j, err, sizeof err)) fail_msg("%s: %s", text, err);
    assert_true(cp_json_get(&j, "val_loss")->number == 3.14159265);
    assert_int_equal(cp_json_get(&j, "val_tokens")->integer, 3069);
    assert_true(cp_json_get(&j, "val_seconds")->number == 0.25);
    cp_json_free(&j);
    free(text);
    r.loss = NAN; /* a loss that is not finite is logged as null, which JSON has */
    text = NULL;
    f = open_memstream(&text, &len);
    cp_eval_metrics(f, &r);
    fclose(f);
    assert_non_null(strstr(text, "\"val_loss\":null,"));
    free(text);
    ev.last_step = 20, ev.last_loss = 2.5;
    assert_string_equal(cp_eval_done_text(&ev, b, sizeof b), " | val loss 2.5000 (after step 20)");
    cp_eval_close(&ev);
    cp_plan_free(&P);

    /* without held-out data: nothing opened, nothing due, nothing said */
    load(&s, "tiny", 0, NULL);
    if (cp_plan_build(&s, &P, err, sizeof err)) fail_msg("%s", err);
    text = NULL;
    f = open_memstream(&text, &len);
    if (cp_eval_open(&ev, &P, &sl, f, err, sizeof err)) fail_msg("%s", err);
    fclose(f);
    assert_int_equal(len, 0);
    free(text);
    assert_false(ev.on);
    assert_false(cp_eval_due(&ev, 10));
    cp_eval_close(&ev);
    cp_plan_free(&P);

    /* held-out data that cannot be opened stops the run at its start */
    const char *bad[] = {"data.source=tokens:/nonexistent/*.bin", "data.val=split:0.1"};
    load(&s, "tiny", 2, bad);
    if (cp_plan_build(&s, &P, err, sizeof err)) fail_msg("%s", err);
    assert_int_equal(cp_eval_open(&ev, &P, &sl, NULL, err, sizeof err), -1);
    if (!strstr(err, "no file matches")) fail_msg("%s", err);
    cp_eval_close(&ev);
    cp_plan_free(&P);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_one_gpu),    cmocka_unit_test(test_layouts),  cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_plan_lines), cmocka_unit_test(test_run_side),
    };
    return cmocka_run_group_tests_name("eval", tests, NULL, NULL);
}

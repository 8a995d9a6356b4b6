/* test_parallel.c: one GPU against several on the same weights and tokens (needs CPGEN_TEST_GPUS GPUs, default 2).
 * For each case the parent computes the reference on one GPU (cp_exec_gradients: the loss and every gradient of one
 * step's micro-batches), saves the gradients as a Hugging Face checkpoint, then starts one copy of itself per GPU
 * (cp_launch_spawn); the ranks meet (cp_world_join, cp_world_split), compute the same step with the case's parallel
 * plan (Ulysses all-to-all, UPipe stages, FSDP gathers and reduce-scatters; for a ring case the N GPUs as a ring of
 * `ring` groups, K/V blocks passed round and gradient shards all-reduced across the groups), gather the gradients,
 * and rank 0 compares them, tensor by tensor in Hugging Face order (the query heads' storage order differs between
 * plans): the loss within 1e-3 relative, every gradient with cosine >= 0.999 and its norm within 1e-2. Output under
 * $OUT/parallel (else /tmp/cpgen-test/parallel). CPGEN_TEST_CASES="a b" runs only the cases whose names start with a
 * or b, and a word that starts no case's name fails the test. Exit 0 when every case run agrees; 1 when one differs
 * or none ran; 77 (skipped) on a machine of fewer GPUs. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data.h"
#include "doc_inputs.h"
#include "exec.h"
#include "gpu_util.h"
#include "launch.h"
#include "plan.h"
#include "spec.h"
#include "util.h"
#include "weights.h"
#include "world.h"

typedef struct {
    const char *name, *spec;
    const char *sets[6]; /* with parallel.gpus set by the test */
    int ring;            /* 1: one group; more: the GPUs as a ring of this many groups, one query head per GPU
                          * and stage unless the case's sets say otherwise */
} pcase;

/* U = C (UPipe), U = H (plain Ulysses), KV heads fewer than GPUs, GQA 3, micro-batches, Qwen3 with tied
 * embeddings, two layers of the 8B shape; rings of 2 groups of tiny (one and two query heads per GPU and stage) and
 * of two layers of the 8B shape; rings of 2 groups of tiny over packed documents (masked, positions per document),
 * against one GPU masking the same documents */
static const pcase CASES[] = {
    {"tiny_upipe", "tiny", {"parallel.upipe_heads=2", "train.micro_batches=1"}, 1},
    {"tiny_ulysses", "tiny", {"parallel.upipe_heads=4", "train.micro_batches=1"}, 1},
    {"tiny_kv1", "tiny", {"model.kv_heads=1", "parallel.upipe_heads=2", "train.micro_batches=1"}, 1},
    {"tiny_mb3", "tiny", {"train.micro_batches=3"}, 1},
    {"tiny_qwen3_tied", "tiny", {"model.family=qwen3", "model.tie_embeddings=true", "train.micro_batches=1"}, 1},
    {"l3b_gqa3_8k", "llama3b", {"model.layers=2", "train.seq_len=8K", "parallel.upipe_heads=auto"}, 1},
    {"l8b_16k", "llama8b", {"model.layers=2", "train.seq_len=16K", "model.vocab=32768", "parallel.upipe_heads=2"}, 1},
    {"l8b_64k", "llama8b", {"model.layers=2", "train.seq_len=64K", "model.vocab=32768", "parallel.upipe_heads=32"}, 1},
    {"tiny_ring2", "tiny", {"train.micro_batches=2"}, 2},
    {"tiny_ring2_u2", "tiny", {"train.micro_batches=1", "parallel.upipe_heads=2"}, 2},
    {"l8b_ring2_16k", "llama8b", {"model.layers=2", "train.seq_len=16K", "model.vocab=32768"}, 2},
    {"tiny_ring2_docs", "tiny", {"train.micro_batches=2", "data.source=synthetic:packed"}, 2},
    {"tiny_ring2_u2_docs", "tiny", {"train.micro_batches=1", "parallel.upipe_heads=2", "data.source=synthetic:packed"},
     2},
};
#define NCASES ((int)(sizeof CASES / sizeof CASES[0]))

static char root[1024];

/* CPGEN_TEST_CASES: space-separated name prefixes; unset runs every case */
static bool selected(const pcase *c) {
    const char *sel = getenv("CPGEN_TEST_CASES");
    if (!sel || !*sel) return true;
    for (const char *p = sel; *p;) {
        while (*p == ' ') p++;
        size_t n = strcspn(p, " ");
        if (n && !strncmp(c->name, p, n)) return true;
        p += n;
    }
    return false;
}

/* Every word of CPGEN_TEST_CASES must name a case: a misspelt one would leave its check unrun, unseen. Returns 0,
 * or 1 after naming the words that select nothing. */
static int selection_valid(void) {
    const char *sel = getenv("CPGEN_TEST_CASES");
    int bad = 0;
    for (const char *p = sel ? sel : ""; *p;) {
        while (*p == ' ') p++;
        size_t n = strcspn(p, " ");
        bool any = false;
        for (int k = 0; n && k < NCASES; k++) any |= !strncmp(CASES[k].name, p, n);
        if (n && !any) {
            printf("test_parallel: CPGEN_TEST_CASES: \"%.*s\" is the start of no case's name\n", (int)n, p);
            bad = 1;
        }
        p += n;
    }
    if (bad) {
        printf("test_parallel: the cases:");
        for (int k = 0; k < NCASES; k++) printf(" %s", CASES[k].name);
        printf("\n");
    }
    return bad;
}

/* The case's plan for `gpus` GPUs in all: one group, or a ring case's ring of groups of gpus / ring (U = their GPUs,
 * one query head per GPU and stage, unless the case's sets, which come last, say otherwise); its reference
 * (gpus = 1) has no ring and the same U. */
static int plan_case(const pcase *c, int gpus, cp_plan *p, char *err, int errlen) {
    const char *sets[10];
    int n = 0, ring = gpus > 1 && c->ring > 1 ? c->ring : 1;
    char g[32], r[32], u[48];
    snprintf(g, sizeof g, "parallel.gpus=%d", gpus / ring);
    sets[n++] = g;
    sets[n++] = "parallel.optimizer=gpu";
    if (c->ring > 1) {
        snprintf(r, sizeof r, "parallel.ring=%d", ring);
        snprintf(u, sizeof u, "parallel.upipe_heads=%d", CP_MAX(gpus / c->ring, 1));
        sets[n++] = r;
        sets[n++] = u;
    }
    for (int i = 0; i < 6 && c->sets[i]; i++) sets[n++] = c->sets[i];
    cp_spec s;
    if (cp_spec_load(c->spec, sets, n, &s, err, errlen) || cp_data_resolve_documents(&s, err, errlen) ||
        cp_plan_build(&s, p, err, errlen))
        return -1;
    if (!p->fits) {
        cp_plan_free(p);
        return cp_errf(err, errlen, "%s with %d GPUs does not fit", c->name, gpus);
    }
    return 0;
}

/* The gradients of step 1 (all micro-batches) at the spec's random init: loss, and the full flat gradients. eo says
 * which rank this is and its communicators (exec.h). */
static int gradients(const cp_plan *p, const cp_exec_opts *eo, double *loss, float *flat, char *err, int errlen) {
    cp_exec *ex;
    if (cp_exec_create(&ex, p, eo, err, errlen)) return -1;
    cp_weights_init_random(p, p->spec.init.seed, p->spec.init.std, flat);
    int rc = cp_exec_load_weights(ex, flat, err, errlen);
    cp_dataset d;
    int mb = p->spec.train.micro_batches;
    int32_t *tok = cp_xmalloc(sizeof(int32_t) * (size_t)(p->T * mb)), *tgt = cp_xmalloc(sizeof(int32_t) * (size_t)(p->T * mb));
    int64_t all = 0;
    cp_rank_layout L = {p->replicas, p->ring, p->C};
    cp_rank_place pl = cp_rank_of(&L, eo->world_rank);
    cp_data_slice sl = {.replica = pl.replica, .replicas = p->replicas, .ring_pos = pl.ring_pos, .ring = p->ring,
                        .rank = eo->rank, .gpus = p->C};
    cp_doc_inputs di; /* packed documents' bounds and positions; nothing without them */
    cp_doc_inputs_init(&di, p);
    if (!rc) rc = cp_dataset_open(&d, &p->spec, err, errlen);
    for (int b = 0; b < mb && !rc; b++) {
        rc = cp_dataset_next_slice(&d, &sl, tok + (size_t)b * p->T, tgt + (size_t)b * p->T, err, errlen);
        all += d.targets_round;
        if (!rc) rc = cp_doc_inputs_add(&di, p, &sl, &d, err, errlen);
    }
    if (!rc) cp_dataset_close(&d);
    if (!rc) rc = cp_doc_inputs_stage(&di, ex, err, errlen);
    cp_doc_inputs_free(&di);
    if (!rc) rc = cp_exec_gradients(ex, tok, tgt, all, loss, err, errlen);
    if (!rc) rc = cp_exec_read_grads(ex, flat, true, err, errlen);
    free(tok);
    free(tgt);
    cp_exec_destroy(ex);
    return rc;
}

/* Rank 0: the case's gradients (saved under dir/<case>/gpus<C>) against the one-GPU reference, in HF order. */
static int compare(const pcase *c, const cp_plan *ref_plan, double loss_ref, double loss, int gpus) {
    char a[1200], b[1200], err[CP_ERR_MAX];
    snprintf(a, sizeof a, "%s/%s/gpus1", root, c->name);
    snprintf(b, sizeof b, "%s/%s/gpus%d", root, c->name, gpus);
    int64_t n = cp_weights_elems(ref_plan);
    float *x = cp_xmalloc(sizeof(float) * (size_t)n), *y = cp_xmalloc(sizeof(float) * (size_t)n);
    if (cp_weights_load_hf(ref_plan, a, x, err, sizeof err) || cp_weights_load_hf(ref_plan, b, y, err, sizeof err)) {
        printf("%s: %s\n", c->name, err);
        free(x), free(y);
        return 1;
    }
    int nt = cp_weights_hf_tensors(ref_plan, NULL, 0);
    cp_hf_tensor *t = cp_xmalloc(sizeof *t * (size_t)nt);
    cp_weights_hf_tensors(ref_plan, t, nt);
    double worst_cos = 1, worst_norm = 0, lrel = fabs(loss - loss_ref) / fabs(loss_ref);
    const char *wc = "", *wn = "";
    for (int k = 0; k < nt; k++) {
        int64_t e = t[k].ndim == 2 ? t[k].shape[0] * t[k].shape[1] : t[k].shape[0];
        double xy = 0, xx = 0, yy = 0;
        for (int64_t i = 0; i < e; i++) {
            double p = x[t[k].off + i], q = y[t[k].off + i];
            xy += p * q, xx += p * p, yy += q * q;
        }
        double cs = xx > 0 && yy > 0 ? xy / sqrt(xx * yy) : (xx == yy ? 1 : 0);
        double ne = xx > 0 ? fabs(sqrt(yy) - sqrt(xx)) / sqrt(xx) : sqrt(yy);
        if (!(cs >= worst_cos)) worst_cos = cs, wc = t[k].name;
        if (!(ne <= worst_norm)) worst_norm = ne, wn = t[k].name;
    }
    bool ok = lrel <= 1e-3 && worst_cos >= 0.999 && worst_norm <= 1e-2;
    printf("%-16s 1 vs %d GPUs: loss %.6f / %.6f (rel %.2e) | worst cosine %.6f (%s) | worst norm error %.2e (%s) | %s\n",
           c->name, gpus, loss_ref, loss, lrel, worst_cos, wc, worst_norm, wn, ok ? "agree" : "DIFFER");
    free(t), free(x), free(y);
    return ok ? 0 : 1;
}

static int save_grads(const cp_plan *p, const pcase *c, int gpus, double loss, const float *flat, char *err,
                      int errlen) {
    char dir[1200], path[1300];
    snprintf(dir, sizeof dir, "%s/%s/gpus%d", root, c->name, gpus);
    if (cp_mkdir_p(dir)) return cp_errf(err, errlen, "%s: cannot create", dir);
    if (cp_weights_save_hf(p, flat, dir, false, 0, err, errlen)) return -1;
    snprintf(path, sizeof path, "%s/loss.txt", dir);
    char text[64];
    int len = snprintf(text, sizeof text, "%.17g\n", loss);
    return cp_write_file_atomic(path, text, (size_t)len) ? cp_errf(err, errlen, "%s: cannot write", path) : 0;
}

static double read_loss(const pcase *c, int gpus) {
    char path[1300];
    snprintf(path, sizeof path, "%s/%s/gpus%d/loss.txt", root, c->name, gpus);
    char *s = cp_read_file(path, NULL);
    double v = s ? strtod(s, NULL) : NAN;
    free(s);
    return v;
}

int main(int argc, char **argv) {
    (void)argc;
    const char *o = getenv("OUT"), *g = getenv("CPGEN_TEST_GPUS");
    int gpus = g && atoi(g) > 1 ? atoi(g) : 2;
    snprintf(root, sizeof root, "%s/parallel", o && *o ? o : "/tmp/cpgen-test");
    char err[CP_ERR_MAX];
    cp_launch_env env;
    if (cp_launch_detect(&env, err, sizeof err)) {
        fprintf(stderr, "test_parallel: %s\n", err);
        return 2;
    }
    if (env.launcher == CP_LAUNCH_NONE) {
        if (selection_valid()) return 1;
        gu_need_gpus("test_parallel", gpus);
        /* the references on one GPU, then the ranks */
        int ran = 0;
        for (int k = 0; k < NCASES; k++) {
            if (!selected(&CASES[k])) continue;
            cp_plan p;
            double loss;
            ran++;
            if (plan_case(&CASES[k], 1, &p, err, sizeof err)) {
                printf("%s: %s\n", CASES[k].name, err);
                return 1;
            }
            float *flat = cp_xmalloc(sizeof(float) * (size_t)cp_weights_elems(&p));
            const cp_exec_opts one = {0};
            int rc = gradients(&p, &one, &loss, flat, err, sizeof err);
            if (!rc) rc = save_grads(&p, &CASES[k], 1, loss, flat, err, sizeof err);
            free(flat);
            cp_plan_free(&p);
            if (rc) {
                printf("%s on 1 GPU: %s\n", CASES[k].name, err);
                return 1;
            }
            printf("%-16s 1 GPU: loss %.6f\n", CASES[k].name, loss);
            fflush(stdout);
        }
        if (cp_launch_spawn(gpus, argv, NULL, err, sizeof err)) {
            printf("test_parallel: %s\n", err);
            return 1;
        }
        int bad = 0;
        for (int k = 0; k < NCASES; k++) {
            if (!selected(&CASES[k])) continue;
            cp_plan p;
            if (plan_case(&CASES[k], 1, &p, err, sizeof err)) return 1;
            bad += compare(&CASES[k], &p, read_loss(&CASES[k], 1), read_loss(&CASES[k], gpus), gpus);
            cp_plan_free(&p);
        }
        printf("%d of %d cases agree\n", ran - bad, ran);
        if (ran == 0) {
            printf("test_parallel: FAILED: no case ran: nothing was compared\n");
            return 1;
        }
        return bad ? 1 : 0;
    }
    /* a rank */
    cp_world w;
    const int64_t key[3] = {NCASES, gpus, 0x7061726c};
    if (cp_world_join(&w, &env, key, 1, err, sizeof err)) {
        fprintf(stderr, "test_parallel: %s\n", err);
        return 1;
    }
    int rc = 0;
    for (int k = 0; k < NCASES && !rc; k++) {
        if (!selected(&CASES[k])) continue;
        cp_plan p;
        double loss;
        rc = plan_case(&CASES[k], w.size, &p, err, sizeof err);
        if (rc) break;
        /* the case's communicators, as `cpgen run` makes them (cli/main.c) */
        cp_rank_layout L = {p.replicas, p.ring, p.C};
        rc = cp_world_split(&w, &L, err, sizeof err);
        bool groups = p.replicas * p.ring > 1;
        cp_exec_opts eo = {.rank = w.group_rank, .world_rank = w.rank, .device = w.device,
                           .comm = w.of_kind[CP_COMM_ULYSSES], .ring_comm = w.of_kind[CP_COMM_RING],
                           .shard_comm = groups ? w.of_kind[CP_COMM_SHARD] : NULL,
                           .world_comm = groups ? w.of_kind[CP_COMM_WORLD] : NULL};
        float *flat = cp_xmalloc(sizeof(float) * (size_t)cp_weights_elems(&p));
        if (!rc) rc = gradients(&p, &eo, &loss, flat, err, sizeof err);
        if (!rc && w.rank == 0) rc = save_grads(&p, &CASES[k], w.size, loss, flat, err, sizeof err);
        free(flat);
        cp_plan_free(&p);
        cp_nccl_comm *split[] = {&w.group, &w.ring, &w.shard}; /* the next case splits its own */
        for (int j = 0; j < 3 && !rc; j++)
            if (split[j]->comm) rc = cp_nccl_destroy(split[j], err, sizeof err);
    }
    if (rc) {
        fprintf(stderr, "test_parallel: rank %d: %s\n", w.rank, err);
        cp_world_abort(&w);
        return 1;
    }
    cp_world_leave(&w);
    return 0;
}

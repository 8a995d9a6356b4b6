/* test_resume.c: resuming on another layout (runtime/resume.c) without a GPU. A checkpoint written on one layout:
 *   - is accepted on every other layout that keeps the data (GPUs, ring, UPipe, offload, optimizer on the host,
 *     replicas x micro-batches kept), with a note naming what changed, and no note on its own layout;
 *   - its data position, saved by a run of 2 replicas x ring 2 x 2 GPUs, resumes 1 GPU, Ulysses 4, 4 replicas and
 *     ring 2 at the very sequences the saving run reads next (token shards across shard ends and epochs, and the
 *     synthetic task), through trainer_state.json;
 *   - is refused where the tokens that come next would change (sequence length, sequences per step, data source,
 *     token glob, synthetic seed), with a message naming each change, how to set it back and --resume-new-data;
 *     accepted with new data, saying what changed, and the data then goes on at the nearest position it has;
 *   - loads rank by rank: each rank's shard of the weights and both moments is exactly that of the whole model read
 *     and cut, on layouts of 2 and 4 GPUs with UPipe-permuted heads, holding no more host memory than the plan
 *     counts for loading (a unit beside the shard, measured as the process's peak resident growth). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <malloc.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "checkpoint.h"
#include "data.h"
#include "plan.h"
#include "ranks.h"
#include "resume.h"
#include "ring.h"
#include "spec.h"
#include "tmpdir.h"
#include "util.h"
#include "weights.h"

static char err[CP_ERR_MAX];
static char root[128];

#define path_in(...) tmpdir_path(root, __VA_ARGS__)

static void expect_contains(const char *msg, const char *frag) {
    if (!strstr(msg, frag)) fail_msg("lacks \"%s\": %s", frag, msg);
}

/* tiny with these --set's (a NULL-ended list) */
static void plan_v(cp_plan *p, const char *const *sets) {
    int n = 0;
    while (sets[n]) n++;
    cp_spec s;
    if (cp_spec_load("tiny", sets, n, &s, err, sizeof err)) fail_msg("spec: %s", err);
    if (cp_plan_build(&s, p, err, sizeof err)) fail_msg("plan: %s", err);
}
#define PLAN(p, ...) plan_v(p, (const char *const[]){__VA_ARGS__, NULL})

/* A checkpoint of plan p at `step`, its data at pos, in out_dir/ckpt_<step>. */
static void write_ckpt(const cp_plan *p, const char *out_dir, int step, const cp_data_pos *pos) {
    int64_t n = cp_weights_elems(p);
    float *w = malloc(sizeof(float) * (size_t)n), *m = malloc(sizeof(float) * (size_t)n),
          *v = malloc(sizeof(float) * (size_t)n);
    cp_weights_init_random(p, 5, 0.5, w);
    cp_weights_init_random(p, 6, 0.5, m);
    cp_weights_init_random(p, 7, 0.5, v);
    for (int64_t i = 0; i < n; i++) v[i] = fabsf(v[i]);
    cp_ckpt_state st;
    cp_ckpt_state_init(p, &st);
    st.step = st.updates = step;
    st.last_loss = 3.5;
    st.data = *pos;
    if (cp_ckpt_write(p, out_dir, &st, w, m, v, NULL, NULL, NULL, 0, err, sizeof err)) fail_msg("%s", err);
    free(w), free(m), free(v);
}

/* cp_resume_notes' text and line count */
static char *notes_of(const cp_plan *p, const cp_ckpt_state *st, bool new_data, int *lines) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    *lines = cp_resume_notes(p, st, new_data, f);
    fclose(f);
    return text;
}

static int count_lines(const char *s) {
    int n = 0;
    for (; *s; s++) n += *s == '\n';
    return n;
}

/* ------------------------------------------------------------------------------------------------------------ */

static void test_layouts_accepted(void **state) {
    (void)state;
    cp_plan ref;
    PLAN(&ref, "train.micro_batches=2");
    cp_data_pos pos = {.sequence = 20};
    write_ckpt(&ref, path_in("acc"), 10, &pos);
    const struct {
        const char *sets[6], *says;
    } cases[] = {
        {{"train.micro_batches=2", "parallel.gpus=4", "machine.ranks_per_gpu=4"}, "parallel.gpus 4 (was 1)"},
        {{"train.micro_batches=2", "parallel.ring=2", "parallel.upipe_heads=1"}, "parallel.ring 2 (was 1)"},
        {{"train.micro_batches=2", "parallel.upipe_heads=1"}, "parallel.upipe_heads 1 (was 4)"},
        {{"train.micro_batches=2", "parallel.offload=all"}, "layers offloaded 2 (was 0)"},
        {{"train.micro_batches=2", "parallel.optimizer=host"}, "the optimizer on the host (was the GPU)"},
        {{"train.micro_batches=1", "parallel.replicas=2"}, "parallel.replicas 2 (was 1), train.micro_batches 1 (was 2)"},
        {{"train.micro_batches=2", "parallel.attention_output=recompute"}, "layers keeping them on the GPU 0 (was 2)"},
    };
    for (size_t k = 0; k < CP_ARRAY_LEN(cases); k++) {
        cp_plan p;
        plan_v(&p, cases[k].sets);
        cp_ckpt ck;
        if (cp_ckpt_open(&p, path_in("acc"), &ck, err, sizeof err)) fail_msg("case %zu: %s", k, err);
        if (cp_resume_check(&p, &ck.state, ck.dir, false, err, sizeof err)) fail_msg("case %zu refused: %s", k, err);
        int lines;
        char *t = notes_of(&p, &ck.state, false, &lines);
        printf("    %s", t);
        assert_int_equal(lines, 1);
        assert_int_equal(count_lines(t), 1);
        expect_contains(t, "note: another layout than the checkpoint's run: ");
        expect_contains(t, cases[k].says);
        expect_contains(t, "the data goes on at sequence 20 of the same stream, 2 sequences a step");
        free(t);
        cp_ckpt_close(&ck);
        cp_plan_free(&p);
    }
    /* its own layout: nothing to say */
    cp_ckpt ck;
    if (cp_ckpt_open(&ref, path_in("acc"), &ck, err, sizeof err)) fail_msg("%s", err);
    assert_int_equal(cp_resume_check(&ref, &ck.state, ck.dir, false, err, sizeof err), 0);
    int lines;
    char *t = notes_of(&ref, &ck.state, false, &lines);
    assert_int_equal(lines, 0);
    assert_string_equal(t, "");
    free(t);
    cp_ckpt_close(&ck);
    cp_plan_free(&ref);
}

/* The data that comes next changes: refused, each change named with the way back; accepted with new data. */
static void test_data_changes_refused(void **state) {
    (void)state;
    cp_plan ref;
    PLAN(&ref, "train.micro_batches=2");
    cp_data_pos pos = {.sequence = 20};
    write_ckpt(&ref, path_in("ref"), 10, &pos);
    const struct {
        const char *sets[4], *why, *fix;
    } cases[] = {
        {{"train.micro_batches=2", "train.seq_len=1K"}, "train.seq_len is 1024, the checkpoint's run had 2048",
         "--set train.seq_len=2048"},
        {{"train.micro_batches=4"}, "a step reads 4 sequences (parallel.replicas 1 x train.micro_batches 4), the "
         "checkpoint's run read 2 (1 x 2)", "--set train.micro_batches=2"},
        {{"train.micro_batches=2", "parallel.replicas=2"}, "a step reads 4 sequences (parallel.replicas 2 x "
         "train.micro_batches 2), the checkpoint's run read 2", "--set train.micro_batches=1"},
        {{"train.micro_batches=1", "parallel.replicas=3"}, "a step reads 3 sequences", "parallel.replicas x "
         "train.micro_batches = 2"},
        {{"train.micro_batches=2", "data.source=synthetic:recall"}, "data.source is \"synthetic:recall\", the "
         "checkpoint's run read \"synthetic:copy\"", "--set data.source='synthetic:copy'"},
        {{"train.micro_batches=2", "init.seed=3"}, "init.seed is 3, the checkpoint's synthetic data was drawn with 0",
         "--set init.seed=0"},
        {{"train.micro_batches=2", "data.source=tokens:/nowhere/*.bin"}, "data.source is \"tokens:/nowhere/*.bin\"",
         "--set data.source='synthetic:copy'"},
    };
    for (size_t k = 0; k < CP_ARRAY_LEN(cases); k++) {
        cp_plan p;
        plan_v(&p, cases[k].sets);
        cp_ckpt ck;
        if (cp_ckpt_open(&p, path_in("ref"), &ck, err, sizeof err)) fail_msg("case %zu: %s", k, err);
        if (!cp_resume_check(&p, &ck.state, ck.dir, false, err, sizeof err)) fail_msg("case %zu accepted", k);
        printf("    refused: %s\n", err);
        expect_contains(err, "ckpt_10/trainer_state.json: resuming would change which tokens come next: ");
        expect_contains(err, cases[k].why);
        expect_contains(err, cases[k].fix);
        expect_contains(err, "Set it back to continue the checkpoint's data");
        expect_contains(err, "or pass --resume-new-data");
        /* asked for: accepted, and said */
        assert_int_equal(cp_resume_check(&p, &ck.state, ck.dir, true, err, sizeof err), 0);
        int lines;
        char *t = notes_of(&p, &ck.state, true, &lines);
        printf("    %s", t);
        assert_true(lines >= 1);
        assert_int_equal(lines, count_lines(t));
        expect_contains(t, "note: --resume-new-data: ");
        expect_contains(t, cases[k].why);
        expect_contains(t, "from the checkpoint's weights, optimizer state and step 10, not with the tokens");
        free(t);
        cp_ckpt_close(&ck);
        cp_plan_free(&p);
    }
    /* several changes: each named, each with its way back */
    cp_plan p;
    PLAN(&p, "train.micro_batches=4", "train.seq_len=1K", "init.seed=9");
    cp_ckpt ck;
    if (cp_ckpt_open(&p, path_in("ref"), &ck, err, sizeof err)) fail_msg("%s", err);
    assert_int_equal(cp_resume_check(&p, &ck.state, ck.dir, false, err, sizeof err), -1);
    expect_contains(err, "init.seed is 9, the checkpoint's synthetic data was drawn with 0; train.seq_len is 1024");
    expect_contains(err, "; a step reads 4 sequences");
    expect_contains(err, "Set them back to continue the checkpoint's data (--set init.seed=0 --set train.seq_len=2048 "
                         "--set train.micro_batches=2)");
    int lines;
    char *t = notes_of(&p, &ck.state, true, &lines);
    assert_int_equal(lines, 3);
    free(t);
    cp_ckpt_close(&ck);
    cp_plan_free(&p);
    /* new data asked for where nothing changed: said, and the data continues */
    if (cp_ckpt_open(&ref, path_in("ref"), &ck, err, sizeof err)) fail_msg("%s", err);
    t = notes_of(&ref, &ck.state, true, &lines);
    assert_int_equal(lines, 1);
    expect_contains(t, "nothing that decides the data changed");
    free(t);
    cp_ckpt_close(&ck);

    /* a checkpoint of a cpgen that recorded no layout: sequences per step from its position (20 after 10 steps) */
    char state_path[600], *text;
    snprintf(state_path, sizeof state_path, "%s", path_in("ref/ckpt_10/trainer_state.json"));
    size_t len;
    text = cp_read_file(state_path, &len);
    char *lay = strstr(text, ",\n  \"layout\"");
    assert_non_null(lay);
    strcpy(lay, "\n}\n");
    char *sps = strstr(text, ", \"sequences_per_step\": 2");
    assert_non_null(sps);
    memmove(sps, sps + 25, strlen(sps + 25) + 1);
    assert_int_equal(cp_write_file_atomic(state_path, text, strlen(text)), 0);
    free(text);
    if (cp_ckpt_open(&ref, path_in("ref"), &ck, err, sizeof err)) fail_msg("%s", err);
    assert_false(ck.state.layout.known);
    assert_int_equal(cp_resume_ckpt_seqs_per_step(&ck.state), 2);
    assert_int_equal(cp_resume_check(&ref, &ck.state, ck.dir, false, err, sizeof err), 0);
    cp_ckpt_close(&ck);
    PLAN(&p, "train.micro_batches=1", "parallel.replicas=2");
    if (cp_ckpt_open(&p, path_in("ref"), &ck, err, sizeof err)) fail_msg("%s", err);
    assert_int_equal(cp_resume_check(&p, &ck.state, ck.dir, false, err, sizeof err), 0);
    t = notes_of(&p, &ck.state, false, &lines);
    expect_contains(t, "train.micro_batches 1 (was 2)"); /* the one layout setting an older state has */
    free(t);
    cp_ckpt_close(&ck);
    cp_plan_free(&p);
    PLAN(&p, "train.micro_batches=3");
    if (cp_ckpt_open(&p, path_in("ref"), &ck, err, sizeof err)) fail_msg("%s", err);
    assert_int_equal(cp_resume_check(&p, &ck.state, ck.dir, false, err, sizeof err), -1);
    expect_contains(err, "the checkpoint's run read 2. Set it back"); /* no "(R x M)": it was not recorded */
    cp_ckpt_close(&ck);
    cp_plan_free(&p);
    cp_plan_free(&ref);
}

/* ---- the data position across layouts */

/* Shards of 2K-token sequences that end mid-sequence and wrap into new epochs: 3, 2 and 4 sequences. */
static void make_shards(const char *dir, int nshards) {
    const int64_t sizes[] = {3 * 2048 + 1 + 500, 2 * 2048 + 1, 4 * 2048 + 1 + 1000};
    assert_int_equal(cp_mkdir_p(dir), 0);
    for (int s = 0; s < nshards; s++) {
        int32_t *t = malloc(sizeof(int32_t) * (size_t)sizes[s]);
        for (int64_t i = 0; i < sizes[s]; i++) t[i] = (int32_t)((s * 977 + i * 7 + i / 513) % 512);
        char p[600];
        snprintf(p, sizeof p, "%s/shard_%d.bin", dir, s);
        if (cp_tokens_write(p, t, sizes[s], 2, -1, err, sizeof err)) fail_msg("%s", err);
        free(t);
    }
}

/* One step of a layout, every rank reading as train.c does: the full sequences it read, by index in the step
 * (round b, replica g: b R + g) into seqs[spr][S] (tokens) and tgts. Every rank must end at one position (*pos). */
static void read_step(const cp_plan *p, cp_dataset *d, int32_t *seqs, int32_t *tgts, cp_data_pos *pos) {
    const int64_t S = p->S, T = p->T;
    const int R = p->replicas, mb = p->spec.train.micro_batches;
    cp_rank_layout L = {p->replicas, p->ring, p->C};
    int world = cp_rank_world(&L);
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)T), *tgt = malloc(sizeof(int32_t) * (size_t)T);
    memset(seqs, 0xff, sizeof(int32_t) * (size_t)(S * R * mb));
    for (int b = 0; b < mb; b++)
        for (int w = 0; w < world; w++) {
            cp_rank_place pl = cp_rank_of(&L, w);
            cp_data_slice sl = {.replica = pl.replica, .replicas = R, .ring_pos = pl.ring_pos, .ring = p->ring,
                                .rank = pl.local, .gpus = p->C};
            if (cp_dataset_next_slice(&d[w], &sl, tok, tgt, err, sizeof err)) fail_msg("%s", err);
            cp_ring_rope_run run[2];
            int nr = cp_ring_rope_runs(p->ring, pl.ring_pos, S, p->C, pl.local, run);
            int32_t *seq = seqs + (size_t)(b * R + pl.replica) * S, *tg = tgts + (size_t)(b * R + pl.replica) * S;
            for (int k = 0; k < nr; k++)
                for (int64_t i = 0; i < run[k].rows; i++) {
                    seq[run[k].pos0 + i] = tok[run[k].row0 + i];
                    tg[run[k].pos0 + i] = tgt[run[k].row0 + i];
                }
        }
    cp_dataset_tell(&d[0], pos);
    for (int w = 1; w < world; w++) {
        cp_data_pos q;
        cp_dataset_tell(&d[w], &q);
        assert_memory_equal(&q, pos, sizeof q); /* any rank's position is the run's */
    }
    free(tok), free(tgt);
}

static void open_all(const cp_plan *p, cp_dataset *d) {
    cp_rank_layout L = {p->replicas, p->ring, p->C};
    for (int w = 0; w < cp_rank_world(&L); w++)
        if (cp_dataset_open(&d[w], &p->spec, err, sizeof err)) fail_msg("%s", err);
}
static void close_all(const cp_plan *p, cp_dataset *d) {
    cp_rank_layout L = {p->replicas, p->ring, p->C};
    for (int w = 0; w < cp_rank_world(&L); w++) cp_dataset_close(&d[w]);
}

/* The saving layout reads 3 steps of 4 sequences and saves; every other layout of 4 sequences a step, resumed from
 * that checkpoint, reads in its next step exactly the 4 sequences the saving layout reads next: those of the one
 * stream read in order by a single reader. */
static void check_position_across_layouts(const char *source) {
    char src[600];
    snprintf(src, sizeof src, "data.source=%s", source);
    cp_plan A;
    PLAN(&A, src, "parallel.replicas=2", "parallel.ring=2", "parallel.gpus=2", "train.micro_batches=2");
    const int64_t S = A.S;
    enum { SPR = 4, STEPS = 3, MAXW = 8 };
    cp_dataset d[MAXW];
    int32_t *seqs = malloc(sizeof(int32_t) * SPR * (size_t)S), *tgts = malloc(sizeof(int32_t) * SPR * (size_t)S);
    int32_t *want = malloc(sizeof(int32_t) * SPR * (size_t)S), *wantt = malloc(sizeof(int32_t) * SPR * (size_t)S);
    cp_data_pos pos;
    /* the reference: one reader, the stream's sequences in order */
    cp_plan one;
    PLAN(&one, src, "train.micro_batches=4");
    cp_dataset r;
    if (cp_dataset_open(&r, &one.spec, err, sizeof err)) fail_msg("%s", err);
    for (int n = 0; n < (STEPS + 1) * SPR; n++) {
        int k = n - STEPS * SPR;
        int32_t *tk = k >= 0 ? want + (size_t)k * S : seqs, *tg = k >= 0 ? wantt + (size_t)k * S : tgts;
        if (cp_dataset_next(&r, 0, 1, tk, tg, err, sizeof err)) fail_msg("%s", err);
    }
    cp_dataset_close(&r);
    /* the saving layout, 3 steps, then its checkpoint */
    open_all(&A, d);
    for (int s = 0; s < STEPS; s++) read_step(&A, d, seqs, tgts, &pos);
    assert_int_equal(pos.sequence, STEPS * SPR);
    char dir[600];
    snprintf(dir, sizeof dir, "%s", path_in("pos-%s", source[0] == 't' ? "tokens" : "synthetic"));
    write_ckpt(&A, dir, STEPS, &pos);
    /* its own next step: the stream's next 4 */
    read_step(&A, d, seqs, tgts, &pos);
    assert_memory_equal(seqs, want, sizeof(int32_t) * SPR * (size_t)S);
    assert_memory_equal(tgts, wantt, sizeof(int32_t) * SPR * (size_t)S);
    close_all(&A, d);
    /* the other layouts, from the checkpoint */
    const char *const layouts[][5] = {
        {src, "train.micro_batches=4", NULL},
        {src, "train.micro_batches=4", "parallel.gpus=4", NULL},
        {src, "train.micro_batches=1", "parallel.replicas=4", NULL},
        {src, "train.micro_batches=4", "parallel.ring=2", "parallel.upipe_heads=1", NULL},
        {src, "train.micro_batches=2", "parallel.replicas=2", "parallel.gpus=2", NULL},
    };
    for (size_t k = 0; k < CP_ARRAY_LEN(layouts); k++) {
        cp_plan B;
        plan_v(&B, layouts[k]);
        cp_ckpt ck;
        if (cp_ckpt_open(&B, dir, &ck, err, sizeof err)) fail_msg("%s", err);
        if (cp_resume_check(&B, &ck.state, ck.dir, false, err, sizeof err)) fail_msg("layout %zu: %s", k, err);
        open_all(&B, d);
        cp_rank_layout L = {B.replicas, B.ring, B.C};
        for (int w = 0; w < cp_rank_world(&L); w++)
            if (cp_resume_seek(&d[w], &B, &ck, false, NULL, err, sizeof err)) fail_msg("%s", err);
        read_step(&B, d, seqs, tgts, &pos);
        for (int q = 0; q < SPR; q++)
            if (memcmp(seqs + (size_t)q * S, want + (size_t)q * S, sizeof(int32_t) * (size_t)S) ||
                memcmp(tgts + (size_t)q * S, wantt + (size_t)q * S, sizeof(int32_t) * (size_t)S))
                fail_msg("%s, layout %zu (%d x ring %d x %d GPUs, %d micro-batches): sequence %d of its step is not "
                         "the stream's sequence %d", source, k, B.replicas, B.ring, B.C,
                         B.spec.train.micro_batches, q, STEPS * SPR + q);
        assert_int_equal(pos.sequence, (STEPS + 1) * SPR);
        close_all(&B, d);
        cp_ckpt_close(&ck);
        cp_plan_free(&B);
    }
    printf("    %s: a position saved on 2 replicas x ring 2 x 2 GPUs resumes %zu other layouts at the stream's "
           "sequences %d-%d\n", source, CP_ARRAY_LEN(layouts), STEPS * SPR, (STEPS + 1) * SPR - 1);
    free(seqs), free(tgts), free(want), free(wantt);
    cp_plan_free(&A);
    cp_plan_free(&one);
}

static void test_position_across_layouts(void **state) {
    (void)state;
    make_shards(path_in("shards"), 3);
    char src[600];
    snprintf(src, sizeof src, "tokens:%s", path_in("shards/*.bin"));
    check_position_across_layouts(src);
    check_position_across_layouts("synthetic:copy");
}

/* ---- new data: where it goes on */

/* The first sequence that a dataset of plan p, sought through cp_resume_seek with new data from a checkpoint of
 * plan `was` at pos, reads: its first tokens into got (n of them), and the note it printed. */
static void seek_new(const cp_plan *was, const cp_data_pos *pos, const cp_plan *p, int32_t *got, int64_t n,
                     char **note) {
    cp_ckpt ck;
    memset(&ck, 0, sizeof ck);
    snprintf(ck.dir, sizeof ck.dir, "%s", path_in("seek/ckpt_1"));
    cp_ckpt_state_init(was, &ck.state);
    ck.state.step = ck.state.updates = 1;
    ck.state.data = *pos;
    cp_dataset d;
    if (cp_dataset_open(&d, &p->spec, err, sizeof err)) fail_msg("%s", err);
    size_t len;
    FILE *f = open_memstream(note, &len);
    if (cp_resume_seek(&d, p, &ck, true, f, err, sizeof err)) fail_msg("%s", err);
    fclose(f);
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)p->S), *tgt = malloc(sizeof(int32_t) * (size_t)p->S);
    if (cp_dataset_next(&d, 0, 1, tok, tgt, err, sizeof err)) fail_msg("%s", err);
    memcpy(got, tok, sizeof(int32_t) * (size_t)n);
    free(tok), free(tgt);
    cp_dataset_close(&d);
}

/* Token i of shard s of make_shards. */
static int32_t shard_token(int s, int64_t i) { return (int32_t)((s * 977 + i * 7 + i / 513) % 512); }

static void test_new_data_position(void **state) {
    (void)state;
    make_shards(path_in("nd3"), 3);
    make_shards(path_in("nd2"), 2);
    char g3[600], g2[600];
    snprintf(g3, sizeof g3, "data.source=tokens:%s", path_in("nd3/*.bin"));
    snprintf(g2, sizeof g2, "data.source=tokens:%s", path_in("nd2/*.bin"));
    cp_plan was, p;
    PLAN(&was, g3, "train.seq_len=1K");
    int32_t got[8];
    char *note;
    /* shard 0 at token 5120 (a 1K sequence start), resumed at 2K: 6144 + 2049 > 6645 tokens, so shard 1 from 0 */
    cp_data_pos pos = {.sequence = 5, .epoch = 0, .shard = 0, .offset = 5120};
    PLAN(&p, g3);
    seek_new(&was, &pos, &p, got, 8, &note);
    for (int i = 0; i < 8; i++) assert_int_equal(got[i], shard_token(1, i));
    expect_contains(note, "note: --resume-new-data: the data goes on at token 0 of ");
    expect_contains(note, "shard_1.bin (the first sequence start at or after the saved position, shard 0 token 5120)");
    printf("    %s", note);
    free(note);
    cp_plan_free(&p);
    /* at 512 from token 3072: a sequence start of that length too */
    pos.offset = 3072;
    PLAN(&p, g3, "train.seq_len=512");
    seek_new(&was, &pos, &p, got, 8, &note);
    for (int i = 0; i < 8; i++) assert_int_equal(got[i], shard_token(0, 3072 + i));
    free(note);
    cp_plan_free(&p);
    /* at 3K from token 1024: the next multiple, 3072, has 3073 tokens left in shard 0 */
    pos.offset = 1024;
    PLAN(&p, g3, "train.seq_len=3K");
    seek_new(&was, &pos, &p, got, 8, &note);
    for (int i = 0; i < 8; i++) assert_int_equal(got[i], shard_token(0, 3072 + i));
    free(note);
    cp_plan_free(&p);
    /* the last shard's end wraps to the first shard, a new epoch */
    pos = (cp_data_pos){.sequence = 9, .epoch = 2, .shard = 2, .offset = 7168};
    PLAN(&p, g3, "train.seq_len=2K");
    seek_new(&was, &pos, &p, got, 8, &note);
    for (int i = 0; i < 8; i++) assert_int_equal(got[i], shard_token(0, i));
    free(note);
    cp_plan_free(&p);
    /* another glob that has the saved shard: there; one that has not: its first shard */
    pos = (cp_data_pos){.sequence = 4, .epoch = 0, .shard = 1, .offset = 1024};
    PLAN(&p, g2, "train.seq_len=1K");
    seek_new(&was, &pos, &p, got, 8, &note);
    for (int i = 0; i < 8; i++) assert_int_equal(got[i], shard_token(1, 1024 + i));
    free(note);
    pos.shard = 2;
    seek_new(&was, &pos, &p, got, 8, &note);
    for (int i = 0; i < 8; i++) assert_int_equal(got[i], shard_token(0, i));
    expect_contains(note, "the first shard");
    expect_contains(note, "the new list has no shard where the saved position was");
    free(note);
    cp_plan_free(&p);
    /* from synthetic data to shards: their start; from shards to synthetic data: the same sequence index */
    cp_plan syn;
    PLAN(&syn, "train.seq_len=1K");
    PLAN(&p, g3, "train.seq_len=1K");
    pos = (cp_data_pos){.sequence = 7};
    seek_new(&syn, &pos, &p, got, 8, &note);
    for (int i = 0; i < 8; i++) assert_int_equal(got[i], shard_token(0, i));
    free(note);
    pos = (cp_data_pos){.sequence = 7, .shard = 1, .offset = 1024};
    seek_new(&p, &pos, &syn, got, 8, &note);
    cp_copy c;
    assert_int_equal(cp_copy_init(&c, 512, 1024, 0, err, sizeof err), 0);
    int32_t *tok = malloc(4 * 1024), *tgt = malloc(4 * 1024);
    cp_copy_sequence(&c, 7, tok, tgt);
    assert_memory_equal(got, tok, sizeof got);
    expect_contains(note, "the data goes on at sequence 7 of synthetic:copy");
    free(tok), free(tgt), free(note);
    cp_plan_free(&p);
    cp_plan_free(&syn);
    cp_plan_free(&was);
}

/* ---- loading rank by rank */

static int64_t status_kib(const char *key) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[256];
    int64_t v = -1;
    size_t n = strlen(key);
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, key, n) && line[n] == ':') v = strtoll(line + n + 1, NULL, 10);
    fclose(f);
    return v;
}

/* In a child: load rank 1's shards of the weights and both moments; the peak resident growth in KiB, or -1. */
static int64_t shard_load_growth(const cp_plan *p, const char *dir) {
    int fd[2];
    assert_int_equal(pipe(fd), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(fd[0]);
        /* the parent's freed heap is resident in this copy of it, and malloc would fill the shard from it without
         * a page of growth: given back first, so that the growth counts every byte the load touches */
        malloc_trim(0);
        FILE *f = fopen("/proc/self/clear_refs", "w"); /* the peak so far: this process's, from here */
        if (f) fputs("5", f), fclose(f);
        cp_ckpt ck;
        int64_t before = status_kib("VmRSS"), grow = -1;
        float *shard = malloc(sizeof(float) * (size_t)p->params_shard);
        if (!cp_ckpt_open(p, dir, &ck, err, sizeof err) && !cp_ckpt_load_weights_shard(p, &ck, 1, shard, err, sizeof err) &&
            !cp_ckpt_load_moment_shard(p, &ck, false, 1, shard, err, sizeof err) &&
            !cp_ckpt_load_moment_shard(p, &ck, true, 1, shard, err, sizeof err))
            grow = status_kib("VmHWM") - before;
        if (write(fd[1], &grow, sizeof grow) != sizeof grow) _exit(1);
        _exit(0);
    }
    close(fd[1]);
    int64_t grow = -1;
    if (read(fd[0], &grow, sizeof grow) != sizeof grow) grow = -1;
    close(fd[0]);
    int st;
    waitpid(pid, &st, 0);
    return grow;
}

static void test_load_by_rank(void **state) {
    (void)state;
    cp_plan one;
    PLAN(&one, "train.micro_batches=2");
    cp_data_pos pos = {.sequence = 2};
    write_ckpt(&one, path_in("load"), 1, &pos);
    const char *const layouts[][5] = {
        {"parallel.gpus=2", NULL},
        {"parallel.gpus=2", "parallel.upipe_heads=2", NULL}, /* query heads stored in another order */
        {"parallel.gpus=4", "parallel.optimizer=host", NULL},
        {"parallel.gpus=2", "parallel.ring=2", "parallel.replicas=2", NULL},
    };
    for (size_t k = 0; k < CP_ARRAY_LEN(layouts); k++) {
        cp_plan p;
        plan_v(&p, layouts[k]);
        cp_ckpt ck;
        if (cp_ckpt_open(&p, path_in("load"), &ck, err, sizeof err)) fail_msg("%s", err);
        int64_t n = cp_weights_elems(&p);
        float *full = malloc(sizeof(float) * (size_t)n), *want = malloc(sizeof(float) * (size_t)p.params_shard),
              *got = malloc(sizeof(float) * (size_t)p.params_shard);
        for (int what = 0; what < 3; what++) {
            int rc = what == 0 ? cp_ckpt_load_weights(&p, &ck, full, err, sizeof err)
                               : cp_ckpt_load_moment(&p, &ck, what == 2, full, err, sizeof err);
            if (rc) fail_msg("%s", err);
            for (int r = 0; r < p.C; r++) {
                cp_weights_shard(&p, r, full, want);
                memset(got, 0x7f, sizeof(float) * (size_t)p.params_shard);
                rc = what == 0 ? cp_ckpt_load_weights_shard(&p, &ck, r, got, err, sizeof err)
                               : cp_ckpt_load_moment_shard(&p, &ck, what == 2, r, got, err, sizeof err);
                if (rc) fail_msg("%s", err);
                if (memcmp(got, want, sizeof(float) * (size_t)p.params_shard))
                    fail_msg("layout %zu, rank %d: its shard of the %s differs from the whole one's", k, r,
                             what == 0 ? "weights" : what == 1 ? "first moment" : "second moment");
            }
        }
        free(full), free(want), free(got);
        cp_ckpt_close(&ck);
        cp_plan_free(&p);
    }
    cp_plan_free(&one);

    /* host memory: a model of about 90 MB read as rank 1 of 4 holds a unit beside its shard, not the model */
    const char *big[] = {"model.hidden=512", "model.ffn=1536", "model.layers=4", "model.vocab=8192",
                         "model.heads=8", "model.kv_heads=4", "train.micro_batches=1"};
    cp_spec s;
    if (cp_spec_load("tiny", big, 7, &s, err, sizeof err)) fail_msg("%s", err);
    cp_plan p1, p4;
    if (cp_plan_build(&s, &p1, err, sizeof err)) fail_msg("%s", err);
    write_ckpt(&p1, path_in("big"), 1, &pos);
    const char *big4[] = {"model.hidden=512", "model.ffn=1536", "model.layers=4", "model.vocab=8192",
                          "model.heads=8", "model.kv_heads=4", "train.micro_batches=1", "parallel.gpus=4"};
    if (cp_spec_load("tiny", big4, 8, &s, err, sizeof err)) fail_msg("%s", err);
    if (cp_plan_build(&s, &p4, err, sizeof err)) fail_msg("%s", err);
    int64_t model = (int64_t)sizeof(float) * cp_weights_elems(&p4), load = p4.host_load;
    int64_t grow = shard_load_growth(&p4, path_in("big/ckpt_1")) * 1024;
    printf("    rank 1 of 4 resuming a %.1f MB model: peak resident growth %.1f MB, the plan counts %.1f MB for "
           "loading (a unit beside the shard)\n", model / 1e6, grow / 1e6, load / 1e6);
    assert_true(grow > 0);
    assert_true(load < model / 2);
    /* 4 MiB for the allocator, the safetensors headers and a permuted tensor's copy (q_proj: 1 MiB) */
    assert_true(grow <= load + (4 << 20));
    assert_true(grow >= (int64_t)sizeof(float) * p4.params_shard); /* it measured the shard being filled */
    cp_plan_free(&p1);
    cp_plan_free(&p4);
}

static int setup(void **state) {
    (void)state;
    return tmpdir_make(root, sizeof root, "resume");
}
static int teardown(void **state) {
    (void)state;
    tmpdir_remove(root);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layouts_accepted),        cmocka_unit_test(test_data_changes_refused),
        cmocka_unit_test(test_position_across_layouts), cmocka_unit_test(test_new_data_position),
        cmocka_unit_test(test_load_by_rank),
    };
    return cmocka_run_group_tests_name("resume", tests, setup, teardown) ? 1 : 0;
}

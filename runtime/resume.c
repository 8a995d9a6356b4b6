/* resume.c: what a resumed run may change from the checkpoint's run (data settings refused unless new data is asked
 * for, layout noted), where its data goes on, and the checkpoint's state into the executor (see resume.h). */
#include "resume.h"

#include <stdlib.h>
#include <string.h>

#include "util.h"
#include "weights.h"

static bool is_tokens(const char *source) { return strncmp(source, "tokens:", 7) == 0; }

int64_t cp_resume_ckpt_seqs_per_step(const cp_ckpt_state *st) {
    if (st->seqs_per_step > 0) return st->seqs_per_step;
    /* an older cpgen recorded neither replicas nor this; its position counts the global stream's sequences */
    if (st->step > 0 && st->data.sequence > 0 && st->data.sequence % st->step == 0)
        return st->data.sequence / st->step;
    return st->train.micro_batches;
}

/* The settings that decide which tokens come next, where the plan differs from the checkpoint: each as what it is
 * now and was (why) and the --set that restores it (fix); returns how many. */
typedef struct {
    char why[CP_PATH_MAX * 2 + 160];
    char fix[CP_PATH_MAX + 64];
} data_change;

static int data_changes(const cp_plan *P, const cp_ckpt_state *st, data_change out[4]) {
    const cp_spec *sp = &P->spec;
    int n = 0;
    if (strcmp(st->data_source, sp->data.source)) {
        snprintf(out[n].why, sizeof out[n].why, "data.source is \"%s\", the checkpoint's run read \"%s\"",
                 sp->data.source, st->data_source);
        snprintf(out[n].fix, sizeof out[n].fix, "--set data.source='%s'", st->data_source);
        n++;
    } else if (!is_tokens(sp->data.source) && st->data_seed != sp->init.seed) {
        /* synthetic data is drawn from init.seed: another seed, other sequences */
        snprintf(out[n].why, sizeof out[n].why, "init.seed is %llu, the checkpoint's synthetic data was drawn with %llu",
                 (unsigned long long)sp->init.seed, (unsigned long long)st->data_seed);
        snprintf(out[n].fix, sizeof out[n].fix, "--set init.seed=%llu", (unsigned long long)st->data_seed);
        n++;
    }
    if (st->train.seq_len != sp->train.seq_len) {
        snprintf(out[n].why, sizeof out[n].why, "train.seq_len is %lld, the checkpoint's run had %lld",
                 (long long)sp->train.seq_len, (long long)st->train.seq_len);
        snprintf(out[n].fix, sizeof out[n].fix, "--set train.seq_len=%lld", (long long)st->train.seq_len);
        n++;
    }
    int64_t was = cp_resume_ckpt_seqs_per_step(st), now = (int64_t)P->replicas * sp->train.micro_batches;
    if (was != now) {
        char before[96] = "";
        if (st->layout.known)
            snprintf(before, sizeof before, " (%d x %d)", st->layout.replicas, st->train.micro_batches);
        snprintf(out[n].why, sizeof out[n].why, "a step reads %lld sequences (parallel.replicas %d x "
                 "train.micro_batches %d), the checkpoint's run read %lld%s", (long long)now, P->replicas,
                 sp->train.micro_batches, (long long)was, before);
        if (was % P->replicas == 0)
            snprintf(out[n].fix, sizeof out[n].fix, "--set train.micro_batches=%lld", (long long)(was / P->replicas));
        else
            snprintf(out[n].fix, sizeof out[n].fix, "parallel.replicas x train.micro_batches = %lld", (long long)was);
        n++;
    }
    return n;
}

int cp_resume_check(const cp_plan *P, const cp_ckpt_state *st, const char *dir, bool new_data, char *err,
                    int errlen) {
    data_change c[4];
    int n = data_changes(P, st, c);
    if (!n || new_data) return 0;
    cp_str why = {0}, fix = {0};
    for (int k = 0; k < n; k++) {
        cp_str_printf(&why, "%s%s", k ? "; " : "", c[k].why);
        cp_str_printf(&fix, "%s%s", k ? " " : "", c[k].fix);
    }
    cp_errf(err, errlen, "%s/%s: resuming would change which tokens come next: %s. Set %s back to continue the "
            "checkpoint's data (%s), or pass --resume-new-data to go on from its weights, optimizer state and step "
            "with the data as the spec has it now", dir, CP_CKPT_STATE_NAME, why.data, n > 1 ? "them" : "it",
            fix.data);
    cp_str_free(&why);
    cp_str_free(&fix);
    return -1;
}

/* One "name now, was before" entry of the layout note when the two differ. */
static void layout_diff(cp_str *s, const char *name, long long now, long long was) {
    if (now != was) cp_str_printf(s, "%s%s %lld (was %lld)", s->len ? ", " : "", name, now, was);
}

int cp_resume_notes(const cp_plan *P, const cp_ckpt_state *st, bool new_data, FILE *out) {
    int lines = 0;
    cp_str s = {0};
    const cp_ckpt_layout *l = &st->layout;
    data_change c[4];
    int nc = data_changes(P, st, c);
    /* replicas and micro-batches belong here while a step reads as many sequences as before, else to the data */
    bool same_rate = cp_resume_ckpt_seqs_per_step(st) == (int64_t)P->replicas * P->spec.train.micro_batches;
    if (l->known) {
        layout_diff(&s, "parallel.gpus", P->C, l->gpus);
        layout_diff(&s, "parallel.ring", P->ring, l->ring);
        if (same_rate) layout_diff(&s, "parallel.replicas", P->replicas, l->replicas);
    }
    if (same_rate) layout_diff(&s, "train.micro_batches", P->spec.train.micro_batches, st->train.micro_batches);
    if (l->known) {
        layout_diff(&s, "machine.ranks_per_gpu", cp_plan_ranks_per_gpu(P), l->ranks_per_gpu);
        layout_diff(&s, "parallel.upipe_heads", P->U, l->upipe_heads);
        if (P->opt_on_host != l->optimizer_host)
            cp_str_printf(&s, "%sthe optimizer on the %s (was the %s)", s.len ? ", " : "", P->opt_on_host ? "host" : "GPU",
                          l->optimizer_host ? "host" : "GPU");
        layout_diff(&s, "layers offloaded", P->ckpt_host_layers, l->offload_layers);
        layout_diff(&s, "parallel.checkpoint_every", P->ckpt_every, l->checkpoint_every);
        layout_diff(&s, "layers keeping attention outputs on the host", P->attn_host_layers, l->attn_host_layers);
        layout_diff(&s, "layers keeping them on the GPU", P->attn_gpu_layers, l->attn_gpu_layers);
    }
    if (s.len) {
        lines++;
        if (out && nc)
            fprintf(out, "note: another layout than the checkpoint's run: %s\n", s.data);
        else if (out)
            fprintf(out, "note: another layout than the checkpoint's run: %s. The weights and AdamW state are per "
                         "Hugging Face tensor and the data goes on at sequence %lld of the same stream, %lld sequences "
                         "a step, so the steps are those the checkpoint's run would have taken, summed in another "
                         "order\n", s.data, (long long)st->data.sequence,
                    (long long)((int64_t)P->replicas * P->spec.train.micro_batches));
    }
    cp_str_free(&s);
    if (new_data) {
        int n = nc;
        lines += n ? n : 1;
        if (out && !n)
            fprintf(out, "note: --resume-new-data: nothing that decides the data changed (source, seed, sequence "
                         "length, sequences per step); the data continues exactly\n");
        for (int k = 0; k < n && out; k++)
            fprintf(out, "note: --resume-new-data: %s: the run goes on from the checkpoint's weights, optimizer "
                         "state and step %d, not with the tokens its run would have read next\n", c[k].why, st->step);
    }
    return lines + cp_ckpt_notes(P, st, out);
}

/* pos moved to the first sequence start (a multiple of the reader's seq_len) at or after it that the shards hold:
 * within its shard, else at the start of the next one (the first again after the last: a new epoch). */
static void next_start(const cp_tokens *r, cp_data_pos *pos) {
    pos->offset = (pos->offset + r->seq_len - 1) / r->seq_len * r->seq_len;
    if (pos->offset + r->seq_len + 1 <= r->counts[pos->shard]) return;
    pos->offset = 0;
    if (++pos->shard == r->nshards) {
        pos->shard = 0;
        pos->epoch++;
    }
}

int cp_resume_seek(cp_dataset *d, const cp_plan *P, const cp_ckpt *ck, bool new_data, FILE *out, char *err,
                   int errlen) {
    const cp_ckpt_state *st = &ck->state;
    const cp_spec *sp = &P->spec;
    bool same_source = !strcmp(st->data_source, sp->data.source), same_len = st->train.seq_len == sp->train.seq_len;
    cp_data_pos pos = st->data;
    char where[CP_PATH_MAX + 160] = "";
    if (new_data && !(same_source && same_len) && !d->synthetic) {
        const cp_tokens *r = &d->tokens;
        if (is_tokens(st->data_source) && pos.shard < r->nshards) {
            /* the same shards at another length, or another list that has the saved shard: go on there */
            next_start(r, &pos);
            snprintf(where, sizeof where, "token %lld of %s (the first sequence start at or after the saved "
                     "position, shard %lld token %lld)", (long long)pos.offset, r->paths[pos.shard],
                     (long long)st->data.shard, (long long)st->data.offset);
        } else {
            pos = (cp_data_pos){.sequence = st->data.sequence};
            snprintf(where, sizeof where, "the first shard, %s%s", r->paths[0],
                     is_tokens(st->data_source) ? " (the new list has no shard where the saved position was)" : "");
        }
    } else if (new_data && !(same_source && same_len)) {
        snprintf(where, sizeof where, "sequence %lld of %s", (long long)pos.sequence, sp->data.source);
    }
    if (cp_dataset_seek(d, &pos, err, errlen)) {
        char m[CP_ERR_MAX];
        snprintf(m, sizeof m, "%s", err);
        return cp_errf(err, errlen, "resuming from %s: %s", ck->dir, m);
    }
    if (*where && out) fprintf(out, "note: --resume-new-data: the data goes on at %s\n", where);
    return 0;
}

int cp_resume_load(cp_exec *ex, const cp_plan *P, const cp_ckpt *ck, int rank, bool new_data, FILE *out, char *err,
                   int errlen) {
    double t0 = cp_now();
    const cp_ckpt_state *st = &ck->state;
    /* with one GPU the shard is the whole model (params_shard = cp_weights_elems, checked by train.c) */
    float *buf = cp_xmalloc(sizeof(float) * (size_t)P->params_shard);
    bool one = P->C == 1;
    /* master weights, then the bf16 parameters from them: as the update kernel writes them (round to nearest even) */
    int rc = one ? cp_ckpt_load_weights(P, ck, buf, err, errlen) : cp_ckpt_load_weights_shard(P, ck, rank, buf, err, errlen);
    if (!rc) rc = cp_exec_load_shard(ex, buf, err, errlen);
    /* one moment at a time through the same buffer, so resuming needs no more host memory than starting */
    for (int second = 0; second < 2 && !rc; second++) {
        rc = one ? cp_ckpt_load_moment(P, ck, second, buf, err, errlen)
                 : cp_ckpt_load_moment_shard(P, ck, second, rank, buf, err, errlen);
        if (!rc)
            rc = cp_exec_load_optimizer_shard(ex, second ? NULL : buf, second ? buf : NULL, st->updates, err, errlen);
    }
    free(buf);
    if (rc) {
        char m[CP_ERR_MAX];
        snprintf(m, sizeof m, "%s", err);
        return cp_errf(err, errlen, "resuming from %s: %s", ck->dir, m);
    }
    if (out) {
        char pos[160] = "";
        if (is_tokens(st->data_source))
            snprintf(pos, sizeof pos, " (epoch %lld, shard %lld, token %lld)", (long long)st->data.epoch,
                     (long long)st->data.shard, (long long)st->data.offset);
        fprintf(out, "resumed from %s (cpgen %s, spec %s) in %.1f s: step %d done, %d AdamW updates, %d skipped, last "
                     "loss %.4f; data at sequence %lld%s\n",
                ck->dir, st->version, st->spec, cp_now() - t0, st->step, st->updates, st->skipped, st->last_loss,
                (long long)st->data.sequence, pos);
        cp_resume_notes(P, st, new_data, out);
    }
    return 0;
}

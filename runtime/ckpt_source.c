/* ckpt_source.c: the executor as the source of a checkpoint's snapshot (ckpt_async.h cp_snap_source): the arrays of
 * the plan's snapshot (snapshot.h) on the writing rank, the slot the saver hands out, filled by cp_exec_snapshot_start/finish (exec_snap.c); or,
 * where the plan has no room for them (one GPU, optimizer on the host), the host optimizer's state itself, written
 * where it is while the loop waits. */
#include "ckpt_source.h"

#include <stdlib.h>
#include <string.h>

#include "util.h"

struct cp_ckpt_source {
    cp_exec *ex;
    const cp_plan *P;
    bool writer;
    cp_snapbuf *buf; /* the writer's arrays, NULL elsewhere and for a snapshot in place */
    char note[CP_ERR_MAX];
};

static int start(void *ctx, int slot, const float **w, const float **m, const float **v, int *updates, double *waited,
                 char *err, int errlen) {
    cp_ckpt_source *s = ctx;
    *w = *m = *v = NULL;
    *waited = 0;
    if (s->P->ckpt_snap == CP_SNAP_IN_PLACE) { /* the host state where it is, the loop waiting for the write */
        if (cp_exec_read_optimizer(s->ex, NULL, NULL, updates, err, errlen)) return -1;
        if (s->writer && !cp_exec_host_state(s->ex, w, m, v))
            return cp_errf(err, errlen, "the optimizer's state is not in host memory, where the plan put it");
        return 0;
    }
    cp_exec_snap dst = {0};
    if (s->buf) {
        char note[CP_ERR_MAX];
        if (cp_snapbuf_get(s->buf, slot, &dst, waited, note, sizeof note, err, errlen)) return -1;
        if (note[0]) snprintf(s->note, sizeof s->note, "%s", note);
    }
    if (cp_exec_snapshot_start(s->ex, &dst, updates, err, errlen)) return -1;
    *w = dst.w, *m = dst.m, *v = dst.v;
    return 0;
}

static int finish(void *ctx, char *err, int errlen) {
    cp_ckpt_source *s = ctx;
    return s->P->ckpt_snap == CP_SNAP_IN_PLACE ? 0 : cp_exec_snapshot_finish(s->ex, err, errlen);
}

int cp_ckpt_source_open(cp_ckpt_source **out, cp_exec *ex, const cp_plan *P, bool writer, int device,
                        cp_snap_source *src, char *err, int errlen) {
    *out = NULL;
    if (P->ckpt_snap == CP_SNAP_NONE)
        return cp_errf(err, errlen, "the plan makes no checkpoints (train.save_every = 0)");
    cp_ckpt_source *s = cp_xcalloc(1, sizeof *s);
    s->ex = ex;
    s->P = P;
    s->writer = writer;
    if (writer && P->ckpt_snap != CP_SNAP_IN_PLACE && cp_snapbuf_create(&s->buf, P, device, err, errlen)) {
        free(s);
        return -1;
    }
    *src = (cp_snap_source){.ctx = s, .start = start, .finish = finish};
    *out = s;
    return 0;
}

bool cp_ckpt_source_note(cp_ckpt_source *s, char *buf, int len) {
    if (!s || !s->note[0]) return false;
    snprintf(buf, (size_t)len, "%s", s->note);
    s->note[0] = 0;
    return true;
}

void cp_ckpt_source_close(cp_ckpt_source *s) {
    if (!s) return;
    cp_snapbuf_destroy(s->buf);
    free(s);
}

/* plan_mem.c: the memory plan. Derives each buffer's lifetime from the steps that touch it, then packs the
 * buffers into one GPU arena and one host arena so that buffers alive at the same time never share bytes. */
#include <stdlib.h>
#include <string.h>

#include "plan_internal.h"
#include "util.h"

static void push_interval(cp_buffer *b, int start, int end) {
    if (b->nlive == b->caplive) {
        b->caplive = b->caplive ? b->caplive * 2 : 4;
        b->live = cp_xrealloc(b->live, sizeof *b->live * (size_t)b->caplive);
    }
    b->live[b->nlive++] = (cp_interval){start, end};
}

int cp_plan_liveness(cp_plan *P, char *err, int errlen) {
    int n = P->nbufs;
    int *open = cp_xmalloc(sizeof(int) * (size_t)n); /* start of the open interval, or -1 */
    int *last = cp_xmalloc(sizeof(int) * (size_t)n);
    /* the last write not yet read (step, operand): a memset placed after the step whose output it should have
     * cleared the way for buries that output (kernels may legitimately write what only a recompute reads) */
    int *unread = cp_xmalloc(sizeof(int) * (size_t)n), *unread_op = cp_xmalloc(sizeof(int) * (size_t)n);
    for (int i = 0; i < n; i++) {
        open[i] = -1;
        last[i] = -1;
        unread[i] = -1;
        P->bufs[i].nlive = 0;
    }
    int rc = 0;
    for (int i = 0; i < P->nsteps && rc == 0; i++) {
        const cp_step *s = &P->steps[i];
        for (int j = 0; j < s->nops; j++) {
            const cp_operand *o = &s->ops[j];
            cp_buffer *b = &P->bufs[o->buf];
            if (b->persistent) continue;
            if (o->offset < 0 || o->offset + o->bytes > b->bytes) {
                snprintf(err, errlen, "plan: step %d (%s) touches bytes [%lld, %lld) of %s, which has %lld", i, s->what,
                         (long long)o->offset, (long long)(o->offset + o->bytes), b->name, (long long)b->bytes);
                rc = -1;
                break;
            }
            if (o->access & CP_READ) unread[o->buf] = -1;
            else if (s->kind == CP_OP_MEMSET && unread[o->buf] >= 0 && unread[o->buf] < i) {
                const cp_step *w = &P->steps[unread[o->buf]];
                const cp_operand *wo = &w->ops[unread_op[o->buf]];
                if (o->offset < wo->offset + wo->bytes && wo->offset < o->offset + o->bytes) {
                    snprintf(err, errlen, "plan: step %d (zero, layer %d) clears what step %d (%s) wrote to %s before "
                             "anything read it", i, s->layer, unread[o->buf], w->what, b->name);
                    rc = -1;
                    break;
                }
            }
            if (o->access & CP_WRITE) unread[o->buf] = i, unread_op[o->buf] = j;
            bool whole = o->offset == 0 && o->bytes == b->bytes;
            bool def = o->access == CP_DEF || (o->access == CP_WRITE && whole);
            if (def && open[o->buf] >= 0 && last[o->buf] < i) {
                push_interval(b, open[o->buf], last[o->buf]);
                open[o->buf] = -1;
            }
            if (open[o->buf] < 0) {
                if (!(o->access & CP_WRITE) || (o->access & CP_READ && !def)) {
                    snprintf(err, errlen, "plan: step %d (%s, layer %d) reads %s before anything wrote it", i, s->what,
                             s->layer, b->name);
                    rc = -1;
                    break;
                }
                open[o->buf] = i;
            }
            last[o->buf] = i;
        }
    }
    for (int i = 0; i < n; i++) {
        cp_buffer *b = &P->bufs[i];
        if (b->persistent) push_interval(b, 0, P->nsteps - 1);
        else if (open[i] >= 0) push_interval(b, open[i], last[i]);
    }
    free(open);
    free(last);
    free(unread);
    free(unread_op);
    return rc;
}

bool cp_plan_lifetimes_overlap(const cp_buffer *a, const cp_buffer *b) {
    int i = 0, j = 0;
    while (i < a->nlive && j < b->nlive) {
        const cp_interval *x = &a->live[i], *y = &b->live[j];
        if (x->end < y->start) i++;
        else if (y->end < x->start) j++;
        else return true;
    }
    return false;
}

static int64_t align_up(int64_t v, int64_t a) { return (v + a - 1) / a * a; }

static const cp_plan *sort_plan;
static int by_size_desc(const void *pa, const void *pb) {
    const cp_buffer *a = &sort_plan->bufs[*(const int *)pa], *b = &sort_plan->bufs[*(const int *)pb];
    if (a->persistent != b->persistent) return a->persistent ? -1 : 1;
    if (a->bytes != b->bytes) return a->bytes > b->bytes ? -1 : 1;
    return *(const int *)pa - *(const int *)pb;
}

typedef struct {
    int64_t lo, hi;
} range;
static int by_lo(const void *pa, const void *pb) {
    const range *a = pa, *b = pb;
    return a->lo < b->lo ? -1 : a->lo > b->lo;
}

/* Greedy best-known heuristic: largest first, each at the lowest offset free over its whole lifetime. */
static int64_t pack(cp_plan *P, cp_space space) {
    int n = 0;
    int *order = cp_xmalloc(sizeof(int) * (size_t)(P->nbufs + 1));
    for (int i = 0; i < P->nbufs; i++)
        if (P->bufs[i].space == space && P->bufs[i].nlive > 0) order[n++] = i;
        else if (P->bufs[i].space == space) P->bufs[i].offset = -1; /* never used */
    sort_plan = P;
    qsort(order, (size_t)n, sizeof(int), by_size_desc);
    range *busy = cp_xmalloc(sizeof(range) * (size_t)(n + 1));
    int64_t top = 0;
    for (int k = 0; k < n; k++) {
        cp_buffer *b = &P->bufs[order[k]];
        int64_t size = align_up(b->bytes, CP_ARENA_ALIGN);
        int nb = 0;
        for (int q = 0; q < k; q++) {
            const cp_buffer *o = &P->bufs[order[q]];
            if (cp_plan_lifetimes_overlap(b, o))
                busy[nb++] = (range){o->offset, o->offset + align_up(o->bytes, CP_ARENA_ALIGN)};
        }
        qsort(busy, (size_t)nb, sizeof(range), by_lo);
        int64_t at = 0;
        for (int q = 0; q < nb; q++) {
            if (busy[q].lo >= at + size) break;
            if (busy[q].hi > at) at = busy[q].hi;
        }
        b->offset = at;
        if (at + size > top) top = at + size;
    }
    free(busy);
    free(order);
    return top;
}

/* The step where the most GPU bytes are live, and what is live there: each lifetime adds its bytes at its first
 * step and takes them at the one after its last, and the running sum is what is live at each step. */
void cp_plan_live_peak(cp_plan *P) {
    int64_t *delta = cp_xcalloc((size_t)P->nsteps + 2, sizeof *delta);
    for (int i = 0; i < P->nbufs; i++) {
        const cp_buffer *b = &P->bufs[i];
        if (b->space != CP_SPACE_GPU) continue;
        int64_t size = align_up(b->bytes, CP_ARENA_ALIGN);
        for (int k = 0; k < b->nlive; k++) {
            delta[b->live[k].start] += size;
            delta[b->live[k].end + 1] -= size;
        }
    }
    int64_t cur = 0;
    P->gpu_live_peak = 0;
    P->peak_step = 0;
    for (int s = 0; s < P->nsteps; s++) {
        cur += delta[s];
        if (cur > P->gpu_live_peak) {
            P->gpu_live_peak = cur;
            P->peak_step = s;
        }
    }
    free(delta);
    memset(P->cat_at_peak, 0, sizeof P->cat_at_peak);
    for (int i = 0; i < P->nbufs; i++) {
        const cp_buffer *b = &P->bufs[i];
        if (b->space != CP_SPACE_GPU) continue;
        for (int k = 0; k < b->nlive; k++)
            if (b->live[k].start <= P->peak_step && P->peak_step <= b->live[k].end)
                P->cat_at_peak[b->cat] += align_up(b->bytes, CP_ARENA_ALIGN);
    }
}

void cp_plan_assign_offsets(cp_plan *P) {
    P->gpu_arena = pack(P, CP_SPACE_GPU);
    P->host_arena = pack(P, CP_SPACE_HOST);
    memset(P->cat_bytes, 0, sizeof P->cat_bytes);
    memset(P->cat_host_bytes, 0, sizeof P->cat_host_bytes);
    for (int i = 0; i < P->nbufs; i++) {
        const cp_buffer *b = &P->bufs[i];
        if (b->space == CP_SPACE_GPU) P->cat_bytes[b->cat] += b->bytes;
        else P->cat_host_bytes[b->cat] += b->bytes;
    }
    cp_plan_live_peak(P);
}

typedef struct {
    int64_t lo, hi;
    int buf;
} placed;
static int by_offset(const void *pa, const void *pb) {
    const placed *a = pa, *b = pb;
    return a->lo < b->lo ? -1 : a->lo > b->lo;
}

int cp_plan_check_packing(const cp_plan *P, char *err, int errlen) {
    placed *p = cp_xmalloc(sizeof *p * (size_t)(P->nbufs + 1));
    int rc = 0;
    for (int sp = 0; sp < 2 && !rc; sp++) {
        int n = 0;
        for (int i = 0; i < P->nbufs; i++) {
            const cp_buffer *b = &P->bufs[i];
            if ((int)b->space == sp && b->nlive > 0)
                p[n++] = (placed){b->offset, b->offset + align_up(b->bytes, CP_ARENA_ALIGN), i};
        }
        qsort(p, (size_t)n, sizeof *p, by_offset);
        /* each buffer against those that start below its end: the pairs that share bytes */
        for (int i = 0; i < n && !rc; i++)
            for (int j = i + 1; j < n && p[j].lo < p[i].hi && !rc; j++) {
                const cp_buffer *a = &P->bufs[p[i].buf], *b = &P->bufs[p[j].buf];
                if (p[j].lo == p[j].hi || !cp_plan_lifetimes_overlap(a, b)) continue;
                snprintf(err, errlen, "plan: %s and %s share bytes of the %s arena while both are live (a planner "
                         "bug)", a->name, b->name, sp == CP_SPACE_GPU ? "GPU" : "host");
                rc = -1;
            }
    }
    free(p);
    return rc;
}

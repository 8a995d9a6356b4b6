/* plan_fold.c: folded plans. A folded plan holds each run of identical tiles once (cp_loop, gen/plan.h), so that
 * planning does not grow with the sequence; here are the flat numbering of its steps and its expansion into the flat
 * program the runtime runs, with the check that the folded offsets and live peak hold for the flat lifetimes. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "plan_internal.h"
#include "util.h"

int64_t cp_plan_flat_steps(const cp_plan *P) {
    int64_t n = P->nsteps;
    for (int k = 0; k < P->nloops; k++) n += (P->loops[k].count - 1) * P->loops[k].nsteps;
    return n;
}

/* Steps before i in the flat program: each loop wholly before i adds its repeats beyond the first; a step of a
 * body is numbered by the body's first repeat. i may be nsteps (the end). */
int64_t cp_plan_flat_index(const cp_plan *P, int i) {
    int64_t n = i;
    for (int k = 0; k < P->nloops && P->loops[k].first + P->loops[k].nsteps <= i; k++)
        n += (P->loops[k].count - 1) * P->loops[k].nsteps;
    return n;
}

int64_t cp_plan_step_repeats(const cp_plan *P, int i) {
    int lo = 0, hi = P->nloops; /* the loops are in step order: the last one starting at or before i */
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (P->loops[mid].first <= i) lo = mid + 1;
        else hi = mid;
    }
    if (lo > 0 && i < P->loops[lo - 1].first + P->loops[lo - 1].nsteps) return P->loops[lo - 1].count;
    return 1;
}

int cp_plan_unfold(cp_plan *P, char *err, int errlen) {
    if (P->nloops == 0) return 0;
    int64_t n = cp_plan_flat_steps(P);
    if (n > INT_MAX) /* step indices are int, in the plan and the runtime */
        return cp_errf(err, errlen, "plan: %lld steps are more than a flat program holds (%d); a shorter sequence or "
                       "larger parallel.mlp_tile and parallel.loss_tile", (long long)n, INT_MAX);
    int micro = (int)cp_plan_flat_index(P, P->micro_steps), peak = (int)cp_plan_flat_index(P, P->peak_step);
    cp_step *flat = cp_xmalloc(sizeof *flat * (size_t)(n ? n : 1));
    int k = 0, lp = 0;
    for (int i = 0; i < P->nsteps;) {
        if (lp < P->nloops && i == P->loops[lp].first) {
            const cp_loop *l = &P->loops[lp++];
            for (int64_t r = 0; r < l->count; r++)
                for (int j = 0; j < l->nsteps; j++) {
                    cp_step *s = &flat[k++];
                    *s = P->steps[i + j];
                    s->tile += (int)r;
                    for (int o = 0; o < s->nops; o++) s->ops[o].offset += r * s->ops[o].stride;
                }
            i += l->nsteps;
        } else {
            flat[k++] = P->steps[i++];
        }
    }
    /* what the folded program found: the flat one must find the same */
    int64_t live_peak = P->gpu_live_peak, at_peak[CP_CAT_COUNT];
    memcpy(at_peak, P->cat_at_peak, sizeof at_peak);
    free(P->steps);
    free(P->loops);
    P->steps = flat;
    P->nsteps = P->capsteps = (int)n;
    P->loops = NULL;
    P->nloops = P->caploops = 0;
    P->micro_steps = micro;
    if (cp_plan_liveness(P, err, errlen) || cp_plan_check_packing(P, err, errlen)) return -1;
    cp_plan_live_peak(P);
    if (P->gpu_live_peak != live_peak || P->peak_step != peak || memcmp(at_peak, P->cat_at_peak, sizeof at_peak))
        return cp_errf(err, errlen, "plan: the flat program's live peak (%lld bytes at step %d) is not the folded "
                       "one's (%lld at step %d): a planner bug", (long long)P->gpu_live_peak, P->peak_step,
                       (long long)live_peak, peak);
    return 0;
}

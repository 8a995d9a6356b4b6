/* doc_inputs.c: a step's packed-document inputs from its sequences' documents (doc_inputs.h). */
#include "doc_inputs.h"

#include <stdlib.h>
#include <string.h>

#include "ring.h"
#include "util.h"

/* the tiles of the attention kernels' work figure: fwd_sm90's 128 query rows by 128 keys */
enum { WORK_TILE = 128 };

void cp_doc_inputs_init(cp_doc_inputs *di, const cp_plan *P) {
    memset(di, 0, sizeof *di);
    di->mb = P->spec.train.micro_batches;
    if (P->doc_positions) di->pos = cp_xmalloc(sizeof(int32_t) * (size_t)(di->mb * P->T));
    if (P->docs) {
        di->start = cp_xmalloc(sizeof(int32_t) * (size_t)(di->mb * P->S));
        di->end = cp_xmalloc(sizeof(int32_t) * (size_t)(di->mb * P->S));
    }
    di->work = di->kept = 1;
}

void cp_doc_inputs_free(cp_doc_inputs *di) {
    free(di->pos);
    free(di->start);
    free(di->end);
    memset(di, 0, sizeof *di);
}

int cp_doc_inputs_add(cp_doc_inputs *di, const cp_plan *P, const cp_data_slice *sl, const cp_dataset *d, char *err,
                      int errlen) {
    if ((d->documents == CP_DOCS_MASK) != P->docs)
        return cp_errf(err, errlen, "the data's documents are %s and the plan's %s: the plan was built from a spec "
                       "whose data.documents was not resolved (call cp_data_resolve_documents before cp_plan_build; "
                       "a cpgen bug)", d->documents == CP_DOCS_MASK ? "masked" : "one stream",
                       P->docs ? "masked" : "one stream");
    if (!P->docs && !P->doc_positions) return 0;
    const cp_docs *docs = &d->docs;
    int b = di->n++;
    if (b >= di->mb) cp_fatal(CP_EXIT_FAIL, "documents of %d micro-batches, room for %d (a cpgen bug)", di->n, di->mb);
    if (di->pos) { /* the rank's rows lie at one or two runs of consecutive positions (a ring's zigzag) */
        cp_ring_rope_run run[2];
        int runs = cp_ring_rope_runs(sl->ring, sl->ring_pos, P->S, sl->gpus, sl->rank, run);
        for (int k = 0; k < runs; k++)
            cp_docs_positions(docs, run[k].pos0, run[k].rows, di->pos + (size_t)b * (size_t)P->T + run[k].row0);
    }
    if (di->start) {
        cp_docs_bounds(docs, P->S, di->start + (size_t)b * (size_t)P->S, di->end + (size_t)b * (size_t)P->S);
        double kept, work = cp_docs_tile_work(docs, P->S, WORK_TILE, WORK_TILE, &kept);
        /* a running mean over the step's micro-batches */
        di->work = b ? di->work + (work - di->work) / (b + 1) : work;
        di->kept = b ? di->kept + (kept - di->kept) / (b + 1) : kept;
    }
    return 0;
}

int cp_doc_inputs_stage(cp_doc_inputs *di, cp_exec *ex, char *err, int errlen) {
    if (!di->pos && !di->start) return 0;
    int n = di->n;
    di->n = 0;
    return cp_exec_set_documents(ex, n, di->pos, di->start, di->end, err, errlen);
}

/* doc_inputs.h: the packed-document inputs of a step or an evaluation (cp_exec_set_documents), built micro-batch by
 * micro-batch from the documents of the sequence each slice came from (cp_dataset.docs), and how much of causal
 * attention's work those documents leave. */
#ifndef CP_DOC_INPUTS_H
#define CP_DOC_INPUTS_H

#include <stdint.h>

#include "data.h"
#include "exec.h"
#include "plan.h"

typedef struct {
    int mb;                      /* micro-batches held */
    int32_t *pos, *start, *end;  /* [mb][T] rows' RoPE positions, [mb][S] each position's document bounds */
    double work, kept;           /* the last step's attention tiles and scores against causal's (means) */
    int n;                       /* micro-batches added since the last stage */
} cp_doc_inputs;

/* Room for plan->spec.train.micro_batches micro-batches; nothing to hold (all NULL) without documents. */
void cp_doc_inputs_init(cp_doc_inputs *di, const cp_plan *P);
void cp_doc_inputs_free(cp_doc_inputs *di);
/* Micro-batch di->n (the next) from the documents of the sequence d read last, for this rank's rows (sl: its place).
 * Returns 0, or -1 with a message where the data's document mode is not the plan's (a spec planned before
 * cp_data_resolve_documents: its kernels would not mask the documents the data cuts). */
int cp_doc_inputs_add(cp_doc_inputs *di, const cp_plan *P, const cp_data_slice *sl, const cp_dataset *d, char *err,
                      int errlen);
/* The micro-batches added into the executor's staging for the next step or evaluation; then none are held. Returns
 * 0 (also without documents: nothing to stage), or -1 with a message. */
int cp_doc_inputs_stage(cp_doc_inputs *di, cp_exec *ex, char *err, int errlen);

#endif

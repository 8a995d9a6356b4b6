/* doc_work.h: how much of causal attention's work document-masked attention does (templates/attention.cu, DOCS):
 * the rule by which the kernels skip tiles, counted for the step line (from each sequence's documents) and for the
 * plan's predicted time (from an expected document length). */
#ifndef CP_DOC_WORK_H
#define CP_DOC_WORK_H

#include <stdint.h>

/* The fraction of causal attention's tiles that kernels with query tiles of bm rows and key tiles of bn rows compute
 * over a sequence of S positions whose documents start at start[0] = 0 < start[1] < ... < start[n - 1]: tile (query
 * rows [i0, i1), key rows [j0, j1)) is computed iff j0 <= i1 - 1 (causal) and j1 - 1 >= the start of row i0's
 * document; the denominator is the tiles computed with one document. *kept (if not NULL): the scores kept (key j for
 * query i in its document, j <= i) over causal attention's S (S + 1) / 2. NAN for S, bm, bn or n below 1 or start[0]
 * not 0. One document gives 1 and 1. */
double cp_doc_tile_work(const int32_t *start, int64_t n, int64_t S, int bm, int bn, double *kept);
/* The same for documents of L positions each (the last one shorter where L does not divide S). */
double cp_doc_tile_work_uniform(int64_t S, int64_t L, int bm, int bn, double *kept);

#endif

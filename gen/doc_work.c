/* doc_work.c: the work document-masked attention does (doc_work.h). */
#include "doc_work.h"

#include <math.h>
#include <stdlib.h>

#include "util.h"

double cp_doc_tile_work(const int32_t *start, int64_t n, int64_t S, int bm, int bn, double *kept) {
    if (kept) *kept = NAN;
    if (S < 1 || bm < 1 || bn < 1 || n < 1 || start[0] != 0) return NAN;
    /* query tile [i0, i1): causal key tiles 0 .. (i1 - 1) / bn; of those, the ones with a key in the document of
     * row i0 start at tile doc_start(i0) / bn (an earlier tile's last key, kj bn + bn - 1, lies before it) */
    double all = 0, done = 0;
    int64_t k = 0;
    for (int64_t i0 = 0; i0 < S; i0 += bm) {
        int64_t i1 = CP_MIN(i0 + bm, S), last = (i1 - 1) / bn;
        while (k + 1 < n && start[k + 1] <= i0) k++;
        all += (double)(last + 1);
        done += (double)(last - start[k] / bn + 1);
    }
    if (kept) { /* a document of L positions keeps L (L + 1) / 2 scores; causal attention over S has S (S + 1) / 2 */
        double sum = 0;
        for (int64_t j = 0; j < n; j++) {
            double L = (double)((j + 1 < n ? start[j + 1] : S) - start[j]);
            sum += L * (L + 1) / 2;
        }
        *kept = sum / ((double)S * ((double)S + 1) / 2);
    }
    return done / all;
}

double cp_doc_tile_work_uniform(int64_t S, int64_t L, int bm, int bn, double *kept) {
    if (L < 1 || S < 1 || S > INT32_MAX) {
        if (kept) *kept = NAN;
        return NAN;
    }
    int64_t n = (S + L - 1) / L;
    int32_t *start = cp_xmalloc(sizeof(int32_t) * (size_t)n);
    for (int64_t j = 0; j < n; j++) start[j] = (int32_t)(j * L);
    double w = cp_doc_tile_work(start, n, S, bm, bn, kept);
    free(start);
    return w;
}

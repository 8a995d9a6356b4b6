/* cuda_check.h: checking CUDA runtime calls. CP_CUDA_CHECK(call) stops the program on failure with the file and
 * line, the call, the error's name and text, and what to do about it; cp_cuda_errmsg formats the same message for
 * callers that report errors themselves. */
#ifndef CP_CUDA_CHECK_H
#define CP_CUDA_CHECK_H

#include <cuda_runtime_api.h>

#define CP_CUDA_CHECK(call)                                                    \
    do {                                                                       \
        cudaError_t cp_cuda_err_ = (call);                                     \
        if (cp_cuda_err_ != cudaSuccess) cp_cuda_fail(cp_cuda_err_, #call, __FILE__, __LINE__); \
    } while (0)

/* Print "cpgen: file:line: call: cudaErrorX (text); hint" to stderr and exit with code 1. */
void cp_cuda_fail(cudaError_t e, const char *call, const char *file, int line) __attribute__((noreturn));

/* What to do about e, in one sentence; "" when there is nothing more to say than the error's own text. */
const char *cp_cuda_hint(cudaError_t e);

/* "what: cudaErrorX (text); hint" into buf. Returns -1, so that `return cp_cuda_errmsg(...)` reports failure. */
int cp_cuda_errmsg(cudaError_t e, const char *what, char *buf, int n);

#endif

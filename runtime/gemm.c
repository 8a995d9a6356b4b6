/* gemm.c: the plan's row-major GEMMs on cuBLASLt (see gemm.h).
 *
 * cuBLASLt is column-major. A row-major matrix X[r][c] with row stride ld is, read column-major, the matrix X^T
 * (c rows, r columns, same ld). So the row-major D = op(A) op(B) is computed as the column-major
 * D^T = op(B)^T op(A)^T: cuBLASLt's first operand is our B, its second our A, and the transpose flags carry over
 * unchanged (B stored [k][n] reads as the n x k matrix op(B)^T with no transpose; stored [n][k] it reads as k x n
 * and needs one). D^T is n x m with leading dimension ldd; a residual C has D's layout. */
#include "gemm.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cublasLt.h>

#include "cuda_check.h"
#include "util.h"

typedef struct {
    cp_gemm p;
    unsigned align[4]; /* A, B, C, D pointer alignment in bytes, capped at 256 */
} gemm_key;

typedef struct {
    gemm_key key;
    char what[40];
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc, ld; /* cuBLASLt's A (our B), B (our A), C, D */
    cublasLtMatmulAlgo_t algo;
    size_t ws_needed;
    cublasLtMatmulHeuristicResult_t *cand; /* cp_gemm_candidates' list, best first, ncand of them */
    int ncand;
    const float *a_scale, *b_scale; /* FP8: the scales the descriptor points at now (set again only when they move) */
} gemm_entry;

struct cp_gemm_lib {
    cublasLtHandle_t handle;
    void *ws;
    size_t ws_bytes;
    int n, cap;
    gemm_entry *e;
};

/* What to do about a failed cuBLASLt call, in one sentence. */
static const char *lt_hint(cublasStatus_t s) {
    switch (s) {
    case CUBLAS_STATUS_NOT_INITIALIZED:
        return "cuBLASLt could not start: check that the driver supports CUDA 13 and that the GPU has free memory";
    case CUBLAS_STATUS_ALLOC_FAILED:
        return "cuBLASLt ran out of host or GPU memory for its descriptors: free memory, or plan with a larger "
               "machine.reserve";
    case CUBLAS_STATUS_INVALID_VALUE:
        return "the shape, leading dimensions or pointers are not valid for cuBLASLt (a leading dimension shorter "
               "than a row, or a NULL pointer): the plan's cp_gemm for this step is wrong";
    case CUBLAS_STATUS_ARCH_MISMATCH:
        return "this GPU has no bf16 tensor cores: cpgen needs compute capability 8.0 or newer";
    case CUBLAS_STATUS_NOT_SUPPORTED:
        return "no cuBLASLt kernel for this shape, type and alignment: operands should start on 16-byte boundaries "
               "and have leading dimensions that are multiples of 8 elements (CUBLASLT_LOG_MASK=63 in the "
               "environment makes cuBLASLt print its own reason)";
    case CUBLAS_STATUS_EXECUTION_FAILED:
        return "the GEMM kernel failed to run, often because an earlier kernel faulted: rerun with "
               "CUDA_LAUNCH_BLOCKING=1 to find the first failing step";
    case CUBLAS_STATUS_INTERNAL_ERROR:
        return "cuBLASLt failed inside (often a CUDA error from an earlier step): rerun with CUDA_LAUNCH_BLOCKING=1";
    default:
        return "";
    }
}

static const char *type_name(int t) { return t == CP_GEMM_E4M3 ? "e4m3" : t == CP_GEMM_E5M2 ? "e5m2" : "bf16"; }
static const char *scale_name(int s) {
    return s == CP_GEMM_SCALE_1D ? " 1x128" : s == CP_GEMM_SCALE_2D ? " 128x128" : s == CP_GEMM_SCALE_ROW ? " row" : "";
}
static bool is_fp8(const cp_gemm *p) { return p->a_type != CP_GEMM_BF16 || p->b_type != CP_GEMM_BF16; }

static void describe(const cp_gemm *p, const char *what, char *buf, size_t n) {
    snprintf(buf, n, "GEMM %s (%lldx%lldx%lld, A %s%s %s lda %lld, B %s%s %s ldb %lld, ldd %lld%s%s%s, %s out)", what,
             (long long)p->m, (long long)p->n, (long long)p->k, type_name(p->a_type), scale_name(p->a_scale),
             p->trans_a ? "T" : "N", (long long)p->lda, type_name(p->b_type), scale_name(p->b_scale),
             p->trans_b ? "T" : "N", (long long)p->ldb, (long long)p->ldd,
             p->has_c ? ", + residual C" : "", p->accumulate ? ", accumulate" : "",
             is_fp8(p) && p->fast_accum ? ", fast accumulation" : "", p->out_f32 ? "fp32" : "bf16");
}

static int lt_fail(cublasStatus_t s, const char *call, const cp_gemm *p, const char *what, char *err, int errlen) {
    char d[256];
    describe(p, what, d, sizeof d);
    const char *hint = lt_hint(s);
    snprintf(err, (size_t)errlen, "%s: %s failed: %s (%s)%s%s", d, call, cublasLtGetStatusName(s),
             cublasLtGetStatusString(s), *hint ? "; " : "", hint);
    return -1;
}

#define LT(call, p, what)                                                          \
    do {                                                                           \
        cublasStatus_t st_ = (call);                                               \
        if (st_ != CUBLAS_STATUS_SUCCESS) return lt_fail(st_, #call, p, what, err, errlen); \
    } while (0)

int cp_gemm_lib_create(cp_gemm_lib **out, void *ws, size_t ws_bytes, char *err, int errlen) {
    cp_gemm_lib *g = cp_xcalloc(1, sizeof *g);
    cublasStatus_t s = cublasLtCreate(&g->handle);
    if (s != CUBLAS_STATUS_SUCCESS) {
        const char *hint = lt_hint(s);
        snprintf(err, (size_t)errlen, "cublasLtCreate: %s (%s)%s%s", cublasLtGetStatusName(s),
                 cublasLtGetStatusString(s), *hint ? "; " : "", hint);
        free(g);
        return -1;
    }
    g->ws = ws;
    g->ws_bytes = ws ? ws_bytes : 0;
    *out = g;
    return 0;
}

static void entry_free(gemm_entry *e) {
    if (e->desc) cublasLtMatmulDescDestroy(e->desc);
    if (e->la) cublasLtMatrixLayoutDestroy(e->la);
    if (e->lb) cublasLtMatrixLayoutDestroy(e->lb);
    if (e->lc) cublasLtMatrixLayoutDestroy(e->lc);
    if (e->ld) cublasLtMatrixLayoutDestroy(e->ld);
    free(e->cand);
    memset(e, 0, sizeof *e);
}

void cp_gemm_lib_destroy(cp_gemm_lib *g) {
    if (!g) return;
    for (int i = 0; i < g->n; i++) entry_free(&g->e[i]);
    free(g->e);
    if (g->handle) cublasLtDestroy(g->handle);
    free(g);
}

int cp_gemm_entries(const cp_gemm_lib *g) { return g->n; }

static unsigned align_of(const void *ptr) {
    uintptr_t a = (uintptr_t)ptr;
    unsigned al = 256;
    while (al > 1 && a % al) al /= 2;
    return al;
}

int cp_gemm_check(const cp_gemm *p, const char *what, const void *A, const void *B, const void *C, const void *D,
                  char *err, int errlen) {
    char d[256];
    const char *bad = NULL;
    const bool blocks = p->a_scale == CP_GEMM_SCALE_1D || p->a_scale == CP_GEMM_SCALE_2D; /* scales inside the sums */
    if (p->m < 1 || p->n < 1 || p->k < 1) bad = "m, n and k must be at least 1";
    else if (p->lda < (p->trans_a ? p->m : p->k)) bad = "lda is shorter than a row of A as stored";
    else if (p->ldb < (p->trans_b ? p->k : p->n)) bad = "ldb is shorter than a row of B as stored";
    else if (p->ldd < p->n) bad = "ldd is shorter than a row of D";
    else if (p->has_c && p->accumulate) bad = "has_c and accumulate together (the residual C would be ignored)";
    else if (!A || !B || !D || (p->has_c && !C)) bad = "a NULL operand";
    else if (p->a_type > CP_GEMM_E5M2 || p->b_type > CP_GEMM_E5M2) bad = "an input type that is not a cp_gemm_type";
    else if (is_fp8(p) && (p->a_type == CP_GEMM_BF16 || p->b_type == CP_GEMM_BF16))
        bad = "one FP8 input and one bf16 (both or neither must be FP8)";
    else if (p->a_type == CP_GEMM_E5M2 && p->b_type == CP_GEMM_E5M2)
        bad = "two E5M2 inputs (FP8 tensor cores take E4M3 with E4M3 or E5M2, not E5M2 with E5M2)";
    else if (is_fp8(p) && (p->trans_a || !p->trans_b))
        bad = "FP8 inputs outside the x W^T form (A stored [m][k], B stored [n][k]): Hopper's FP8 GEMMs take only "
              "that one; store a transposed FP8 copy of the other operand";
    else if (is_fp8(p) && (p->k % 16 || p->lda % 16 || p->ldb % 16))
        bad = "FP8 inputs with k, lda or ldb not a multiple of 16";
    else if (p->a_scale > CP_GEMM_SCALE_ROW || p->b_scale > CP_GEMM_SCALE_ROW)
        bad = "a scale mode that is not a cp_gemm_scale";
    else if (!is_fp8(p) && (p->a_scale || p->b_scale))
        bad = "block scales for bf16 inputs";
    else if ((p->a_scale == CP_GEMM_SCALE_TENSOR) != (p->b_scale == CP_GEMM_SCALE_TENSOR))
        bad = "one input scaled per tensor and the other by blocks (the plan scales both alike)";
    else if ((p->a_scale == CP_GEMM_SCALE_ROW) != (p->b_scale == CP_GEMM_SCALE_ROW))
        bad = "one input scaled per row and the other by blocks (cuBLASLt takes row scales only on both inputs)";
    else if (p->a_scale == CP_GEMM_SCALE_2D && p->b_scale == CP_GEMM_SCALE_2D)
        bad = "both inputs scaled by 128 x 128 tiles (Hopper's block-scaled GEMMs take 1 x 128 with 1 x 128 or with "
              "128 x 128, not two tiled inputs)";
    else if (blocks && p->k % 128)
        bad = "block scales with k not a multiple of 128";
    else if (blocks && p->fast_accum)
        bad = "block scales with fast accumulation (the scales are applied where cuBLASLt promotes the sums to fp32)";
    if (!bad) return 0;
    describe(p, what, d, sizeof d);
    snprintf(err, (size_t)errlen, "%s: %s: the plan's GEMM description is inconsistent", d, bad);
    return -1;
}

static bool key_equal(const gemm_key *a, const gemm_key *b) {
    const cp_gemm *x = &a->p, *y = &b->p;
    return x->m == y->m && x->n == y->n && x->k == y->k && x->lda == y->lda && x->ldb == y->ldb && x->ldd == y->ldd &&
           x->trans_a == y->trans_a && x->trans_b == y->trans_b && x->has_c == y->has_c &&
           x->accumulate == y->accumulate && x->out_f32 == y->out_f32 && x->a_type == y->a_type &&
           x->b_type == y->b_type && x->fast_accum == y->fast_accum && x->a_scale == y->a_scale &&
           x->b_scale == y->b_scale && !memcmp(a->align, b->align, sizeof a->align);
}

/* Up to want algorithms of cuBLASLt's heuristic for entry e's descriptors, best first, into res: how many (at least
 * 1), or -1 with a message. */
static int heuristic(cp_gemm_lib *g, const gemm_entry *e, int want, cublasLtMatmulHeuristicResult_t *res, char *err,
                     int errlen) {
    const cp_gemm *p = &e->key.p;
    const char *w = e->what;
    cublasLtMatmulPreference_t pref;
    LT(cublasLtMatmulPreferenceCreate(&pref), p, w);
    uint64_t ws = g->ws_bytes;
    uint32_t al[4] = {e->key.align[1], e->key.align[0], e->key.align[2], e->key.align[3]}; /* Lt's A is our B */
    cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                                             sizeof ws);
    for (int i = 0; i < 4 && st == CUBLAS_STATUS_SUCCESS; i++) {
        const cublasLtMatmulPreferenceAttributes_t attr[] = {
            CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
            CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
        st = cublasLtMatmulPreferenceSetAttribute(pref, attr[i], &al[i], 4);
    }
    int found = 0;
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulAlgoGetHeuristic(g->handle, e->desc, e->la, e->lb, e->lc, e->ld, pref, want, res, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (st != CUBLAS_STATUS_SUCCESS) return lt_fail(st, "cublasLtMatmulAlgoGetHeuristic", p, w, err, errlen);
    if (found < 1 || res[0].state != CUBLAS_STATUS_SUCCESS) {
        char d[256];
        describe(p, w, d, sizeof d);
        snprintf(err, (size_t)errlen,
                 "%s: cuBLASLt has no algorithm for it (pointer alignment A %u, B %u, C %u, D %u bytes; workspace "
                 "%llu bytes): operands should start on 16-byte boundaries with leading dimensions a multiple of 8 "
                 "elements",
                 d, e->key.align[0], e->key.align[1], e->key.align[2], e->key.align[3], (unsigned long long)ws);
        return -1;
    }
    return found;
}

static int make_entry(cp_gemm_lib *g, gemm_entry *e, char *err, int errlen) {
    const cp_gemm *p = &e->key.p;
    const char *w = e->what;
    cudaDataType_t dt = p->out_f32 ? CUDA_R_32F : CUDA_R_16BF;
    const cudaDataType_t in[] = {CUDA_R_16BF, CUDA_R_8F_E4M3, CUDA_R_8F_E5M2};
    LT(cublasLtMatmulDescCreate(&e->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), p, w);
    if (is_fp8(p)) {
        int8_t fast = p->fast_accum;
        LT(cublasLtMatmulDescSetAttribute(e->desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof fast), p, w);
        const cublasLtMatmulMatrixScale_t mode[] = {
            CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F, CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F,
            CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F, CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F};
        int32_t ma = mode[p->b_scale], mb = mode[p->a_scale]; /* cuBLASLt's A is our B */
        LT(cublasLtMatmulDescSetAttribute(e->desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &ma, sizeof ma), p, w);
        LT(cublasLtMatmulDescSetAttribute(e->desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mb, sizeof mb), p, w);
        if (p->a_scale) {
            /* the heuristic refuses a vector mode without scale pointers (INVALID_VALUE) but does not read them:
             * an aligned placeholder stands in, and every launch sets the real ones */
            const void *any = (const void *)(uintptr_t)256;
            LT(cublasLtMatmulDescSetAttribute(e->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &any, sizeof any), p, w);
            LT(cublasLtMatmulDescSetAttribute(e->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &any, sizeof any), p, w);
            e->a_scale = e->b_scale = any;
        }
    }
    cublasOperation_t ta = p->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N; /* cuBLASLt's A is our B */
    cublasOperation_t tb = p->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    LT(cublasLtMatmulDescSetAttribute(e->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta), p, w);
    LT(cublasLtMatmulDescSetAttribute(e->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb), p, w);
    /* column-major shapes as stored: our B is [k][n] (n x k col-major) or [n][k] (k x n); our A is [m][k]
     * (k x m) or [k][m] (m x k); D^T is n x m */
    uint64_t br = (uint64_t)(p->trans_b ? p->k : p->n), bc = (uint64_t)(p->trans_b ? p->n : p->k);
    uint64_t ar = (uint64_t)(p->trans_a ? p->m : p->k), ac = (uint64_t)(p->trans_a ? p->k : p->m);
    LT(cublasLtMatrixLayoutCreate(&e->la, in[p->b_type], br, bc, p->ldb), p, w);
    LT(cublasLtMatrixLayoutCreate(&e->lb, in[p->a_type], ar, ac, p->lda), p, w);
    LT(cublasLtMatrixLayoutCreate(&e->lc, dt, (uint64_t)p->n, (uint64_t)p->m, p->ldd), p, w);
    LT(cublasLtMatrixLayoutCreate(&e->ld, dt, (uint64_t)p->n, (uint64_t)p->m, p->ldd), p, w);

    cublasLtMatmulHeuristicResult_t res;
    if (heuristic(g, e, 1, &res, err, errlen) < 1) return -1;
    e->algo = res.algo;
    e->ws_needed = res.workspaceSize;
    return 0;
}

int cp_gemm_prepare(cp_gemm_lib *g, const cp_gemm *p, const char *what, const void *A, const void *B, const void *C,
                    const void *D, char *err, int errlen) {
    if (cp_gemm_check(p, what, A, B, C, D, err, errlen)) return -1;
    gemm_key key;
    memset(&key, 0, sizeof key);
    key.p = *p;
    key.align[0] = align_of(A);
    key.align[1] = align_of(B);
    key.align[2] = align_of(p->has_c ? C : D);
    key.align[3] = align_of(D);
    for (int i = 0; i < g->n; i++)
        if (key_equal(&g->e[i].key, &key)) return i;
    if (g->n == g->cap) {
        g->cap = g->cap ? 2 * g->cap : 32;
        g->e = cp_xrealloc(g->e, sizeof *g->e * (size_t)g->cap);
    }
    gemm_entry *e = &g->e[g->n];
    memset(e, 0, sizeof *e);
    e->key = key;
    snprintf(e->what, sizeof e->what, "%s", what);
    if (make_entry(g, e, err, errlen)) {
        entry_free(e);
        return -1;
    }
    return g->n++;
}

int cp_gemm_candidates(cp_gemm_lib *g, int id, int max, char *err, int errlen) {
    if (id < 0 || id >= g->n || max < 1) {
        snprintf(err, (size_t)errlen, "GEMM entry %d (of %d) asked for %d algorithms: a caller's bug", id, g->n, max);
        return -1;
    }
    gemm_entry *e = &g->e[id];
    free(e->cand);
    e->cand = cp_xcalloc((size_t)max, sizeof *e->cand);
    e->ncand = heuristic(g, e, max, e->cand, err, errlen);
    return e->ncand;
}

int cp_gemm_pick(cp_gemm_lib *g, int id, int pick, char *err, int errlen) {
    if (id < 0 || id >= g->n || pick < 0 || pick >= g->e[id].ncand) {
        snprintf(err, (size_t)errlen, "GEMM entry %d (of %d): algorithm %d of %d (cp_gemm_candidates first): a "
                 "caller's bug", id, g->n, pick, id < 0 || id >= g->n ? 0 : g->e[id].ncand);
        return -1;
    }
    g->e[id].algo = g->e[id].cand[pick].algo;
    g->e[id].ws_needed = g->e[id].cand[pick].workspaceSize;
    return 0;
}

int cp_gemm_launch(cp_gemm_lib *g, int id, const void *A, const void *B, const void *C, void *D, cudaStream_t s,
                   char *err, int errlen) {
    return cp_gemm_launch_scaled(g, id, A, B, C, D, NULL, NULL, s, err, errlen);
}

int cp_gemm_launch_scaled(cp_gemm_lib *g, int id, const void *A, const void *B, const void *C, void *D,
                          const float *a_scale, const float *b_scale, cudaStream_t s, char *err, int errlen) {
    if (id < 0 || id >= g->n) {
        snprintf(err, (size_t)errlen, "GEMM entry %d was never prepared (%d entries): a runtime bug", id, g->n);
        return -1;
    }
    gemm_entry *e = &g->e[id];
    const cp_gemm *p = &e->key.p;
    const char *w = e->what;
    const char *bad = NULL;
    if (align_of(A) < e->key.align[0] || align_of(B) < e->key.align[1] || align_of(D) < e->key.align[3] ||
        (p->has_c && align_of(C) < e->key.align[2]))
        bad = "with pointers less aligned than prepared: a runtime bug";
    else if (is_fp8(p) != (a_scale && b_scale))
        bad = is_fp8(p) ? "without the scales of its FP8 inputs: a runtime bug"
                        : "with FP8 scales for bf16 inputs: a runtime bug";
    /* cuBLASLt chooses its algorithm for scales on 16-byte boundaries and refuses (NOT_SUPPORTED) one launched
     * with a scale less aligned */
    else if (is_fp8(p) && (align_of(a_scale) < 16 || align_of(b_scale) < 16))
        bad = "with an FP8 scale not on a 16-byte boundary: give each scale a 16-byte slot of its own";
    if (bad) {
        char d[256];
        describe(p, w, d, sizeof d);
        snprintf(err, (size_t)errlen, "%s: launched %s", d, bad);
        return -1;
    }
    /* the scales are read on the GPU when the GEMM runs; cuBLASLt's A is our B */
    if (is_fp8(p) && (a_scale != e->a_scale || b_scale != e->b_scale)) {
        LT(cublasLtMatmulDescSetAttribute(e->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &b_scale, sizeof b_scale), p,
           w);
        LT(cublasLtMatmulDescSetAttribute(e->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &a_scale, sizeof a_scale), p,
           w);
        e->a_scale = a_scale, e->b_scale = b_scale;
    }
    const float alpha = 1.0f, beta = (p->has_c || p->accumulate) ? 1.0f : 0.0f;
    const void *c = p->has_c ? C : D; /* the residual, or D (read when accumulating) */
    LT(cublasLtMatmul(g->handle, e->desc, &alpha, B, e->la, A, e->lb, &beta, c, e->lc, D, e->ld, &e->algo, g->ws,
                      e->ws_needed, s),
       p, w);
    return 0;
}

int cp_gemm_run(cp_gemm_lib *g, const cp_gemm *p, const char *what, const void *A, const void *B, const void *C,
                void *D, cudaStream_t s, char *err, int errlen) {
    int id = cp_gemm_prepare(g, p, what, A, B, C, D, err, errlen);
    if (id < 0) return -1;
    return cp_gemm_launch(g, id, A, B, C, D, s, err, errlen);
}

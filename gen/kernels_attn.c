/* kernels_attn.c: the attention constructor of kernels.h (templates/attention.cu), with its launch geometry and
 * workspace size (kernels_attn.h). The tile sizes here must match the template's FWD_ and BWD_ constants. */
#include "kernels_attn.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

enum { FWD_BM = 128, FWD_BN = 64, FWD_THREADS = 128, BWD_BM = 64, BWD_BN = 128, BWD_THREADS = 256,
       DQ_THREADS = 256, DQ_MAX_BLOCKS = 65536 };
/* the Hopper kernels (templates/attention_sm90.cuh: H_CONSUMERS = FWD_CONSUMERS, HSTAGES = FWD_STAGES, H_SMEM;
 * attention_bwd_sm90.cuh: B9_THREADS, B9_STAGES, BWD_SM90_SMEM); the dynamic shared memory a block may have on sm_90 */
enum { B9_THREADS = 384, B9_STAGES = 2, H_SMEM_MAX = 227 * 1024 };

/* Bytes of a TMA tile of `rows` rows of head_dim bf16: 64-column sub-tiles of rows x 128 bytes. */
static int64_t sm90_tile(int64_t rows, int64_t head_dim) { return head_dim / 64 * rows * 128; }

/* fwd_sm90's consumer warpgroups of 64 query rows: three at head_dim 64, where the exponentials of a tile take as
 * long as its products, else two */
static int fwd_sm90_consumers(int64_t head_dim) { return head_dim == 64 ? 3 : 2; }

/* fwd_sm90's query rows per block, and its dynamic shared memory with a K/V ring of `stages`: Q in boxes of 128
 * rows; the K, V ring; its mbarriers; slack to align the tiles to 1024 bytes (the template's H_SMEM) */
static int64_t fwd_sm90_rows(int64_t head_dim) { return 64 * fwd_sm90_consumers(head_dim); }
static int64_t fwd_sm90_smem(int64_t head_dim, int64_t stages) {
    const int64_t qboxes = (fwd_sm90_rows(head_dim) + 127) / 128;
    return (qboxes + 2 * stages) * sm90_tile(128, head_dim) + 8 * (1 + 4 * stages) + 1024;
}

/* The default depth of fwd_sm90's K/V ring, the constant the template had before the depth became a variant. */
static int fwd_sm90_stages_default(int64_t head_dim) { return head_dim == 128 ? 2 : 4; }

bool cp_k_attention_hopper(const char *arch) { return cp_k_sm90a(arch); }

void cp_k_attention(cp_kernel_spec *k, int64_t head_dim, int q_heads, int kv_heads, int64_t seq, bool causal,
                    bool dkv_accum, bool dq_atomic) {
    if (head_dim != 64 && head_dim != 128)
        cp_fatal(CP_EXIT_USAGE, "attention: head_dim %lld is not supported (the kernels are built for 64 and 128)",
                 (long long)head_dim);
    if (q_heads < 1 || kv_heads < 1 || q_heads % kv_heads)
        cp_fatal(CP_EXIT_USAGE, "attention: %d query heads on %d KV heads; query heads must be a multiple", q_heads,
                 kv_heads);
    /* row indices are 32-bit in the kernels (offsets are 64-bit) */
    if (seq < 1 || seq > (1LL << 30))
        cp_fatal(CP_EXIT_USAGE, "attention: sequence of %lld tokens is outside 1 .. 2^30", (long long)seq);
    cp_kspec_init(k, "attention");
    cp_kspec_set_int(k, "HEAD_DIM", head_dim);
    cp_kspec_set_int(k, "Q_HEADS", q_heads);
    cp_kspec_set_int(k, "KV_HEADS", kv_heads);
    cp_kspec_set_int(k, "SEQ", seq);
    cp_kspec_set_int(k, "LSE_STRIDE", seq);
    cp_kspec_set_int(k, "CAUSAL", causal);
    cp_kspec_set_int(k, "DKV_ACCUM", dkv_accum);
    cp_kspec_set_int(k, "DQ_ATOMIC", dq_atomic);
    cp_k_attention_docs(k, false);
    cp_kspec_set_double(k, "SCALE", 1.0 / sqrt((double)head_dim));
    cp_kspec_set_int(k, "FWD_STAGES", fwd_sm90_stages_default(head_dim));
    cp_kspec_set_int(k, "FWD_CONSUMERS", fwd_sm90_consumers(head_dim));
}

static int64_t param(const cp_kernel_spec *k, const char *key) {
    for (int i = 0; i < k->nparams; i++)
        if (strcmp(k->params[i].key, key) == 0) return strtoll(k->params[i].value, NULL, 10);
    return -1;
}

void cp_k_attention_lse_stride(cp_kernel_spec *k, int64_t stride) {
    if (strcmp(k->family, "attention") != 0 || stride < param(k, "SEQ"))
        cp_fatal(CP_EXIT_FAIL, "attention: LSE rows %lld apart, fewer than the module's %lld tokens (a plan bug)",
                 (long long)stride, (long long)param(k, "SEQ"));
    cp_kspec_set_int(k, "LSE_STRIDE", stride);
}

void cp_k_attention_docs(cp_kernel_spec *k, bool docs) {
    if (strcmp(k->family, "attention") != 0) cp_fatal(CP_EXIT_FAIL, "attention: document masks on a %s module", k->family);
    cp_kspec_set_int(k, "DOCS", docs);
    cp_kspec_set_str(k, "DOCS_TAG", docs ? "_dm1" : ""); /* names without documents unchanged: tuned variants keep */
}

int64_t cp_k_attention_lse_bytes(const cp_kernel_spec *k) {
    return ((param(k, "Q_HEADS") - 1) * param(k, "LSE_STRIDE") + param(k, "SEQ")) * 4;
}

/* fwd_sm90's K/V ring depths: from 2, since a consumer computes the scores of tile i (the K of one stage) while P V of
 * tile i - 1 (the V of the one before) runs, up to the most that fit the shared memory. The ring holds whole tiles,
 * so the depth changes when copies are issued, never what is computed: every depth gives the same bits. */
bool cp_k_attention_variants(const cp_kernel_spec *k, cp_kvariants *v) {
    const int64_t D = param(k, "HEAD_DIM"), QH = param(k, "Q_HEADS"), KVH = param(k, "KV_HEADS"), S = param(k, "SEQ"),
                  causal = param(k, "CAUSAL");
    if (strcmp(k->family, "attention") != 0 || D < 1 || QH < 1 || KVH < 1 || S < 1) return false;
    memset(v, 0, sizeof *v);
    snprintf(v->kernel, sizeof v->kernel, "attention.fwd_sm90");
    snprintf(v->arch, sizeof v->arch, "sm_90a");
    snprintf(v->shape, sizeof v->shape, "d%lld q%lld kv%lld s%lld %s", (long long)D, (long long)QH, (long long)KVH,
             (long long)S, causal == 1 ? "causal" : "full");
    snprintf(v->param, sizeof v->param, "FWD_STAGES");
    snprintf(v->what, sizeof v->what, "K/V stages");
    snprintf(v->tag, sizeof v->tag, "kvs");
    for (int st = 2; v->n < CP_KVAR_MAX && fwd_sm90_smem(D, st) <= H_SMEM_MAX; st++) v->values[v->n++] = st;
    v->def = fwd_sm90_stages_default(D);
    return v->n > 0;
}

int cp_k_attention_dims(const cp_kernel_spec *k, const char *role, cp_kdims *d) {
    memset(d, 0, sizeof *d);
    if (strcmp(k->family, "attention") != 0) return -1;
    const int64_t D = param(k, "HEAD_DIM"), QH = param(k, "Q_HEADS"), KVH = param(k, "KV_HEADS"),
                  S = param(k, "SEQ");
    const bool docs = param(k, "DOCS") == 1;
    if (D < 1 || QH < 1 || KVH < 1 || S < 1) return -1;
    d->grid[1] = d->grid[2] = 1;
    if (strcmp(role, "fwd") == 0) {
        d->grid[0] = (unsigned)QH;
        d->grid[1] = (unsigned)((S + FWD_BM - 1) / FWD_BM);
        d->block = FWD_THREADS;
        /* Q; K, V double-buffered; row stats; with documents the rows' document starts */
        d->smem = (unsigned)((FWD_BM + 4 * FWD_BN) * D * 2 + FWD_THREADS * 32 + (docs ? FWD_BM * 4 : 0));
    } else if (strcmp(role, "fwd_sm90") == 0) {
        const int64_t stages = param(k, "FWD_STAGES");
        if (stages < 1) return -1;
        d->grid[0] = (unsigned)QH;
        d->grid[1] = (unsigned)((S + fwd_sm90_rows(D) - 1) / fwd_sm90_rows(D));
        d->block = (unsigned)(128 * (1 + fwd_sm90_consumers(D)));
        d->smem = (unsigned)fwd_sm90_smem(D, stages);
    } else if (strcmp(role, "bwd") == 0) {
        d->grid[0] = (unsigned)KVH;
        d->grid[1] = (unsigned)((S + BWD_BN - 1) / BWD_BN);
        d->block = BWD_THREADS;
        /* K, V; Q, dO double-buffered; P, dS; lse, delta double-buffered; the progress wait's last read; with
         * documents the rows' document starts, double-buffered */
        d->smem = (unsigned)((2 * BWD_BN + 4 * BWD_BM) * D * 2 + 2 * BWD_BM * BWD_BN * 2 + 4 * BWD_BM * 4 + 16 +
                             (docs ? 2 * BWD_BM * 4 : 0));
    } else if (strcmp(role, "bwd_sm90") == 0) {
        const int64_t ktile = sm90_tile(BWD_BN, D), qtile = sm90_tile(BWD_BM, D);
        d->grid[0] = (unsigned)KVH;
        d->grid[1] = (unsigned)((S + BWD_BN - 1) / BWD_BN);
        d->block = B9_THREADS;
        /* K, V; the Q, dO ring; dS^T and dQ (fp32) double-buffered; lse, delta per stage; the mbarriers; slack to
         * align the tiles to 1024 bytes */
        d->smem = (unsigned)(2 * ktile + 2 * B9_STAGES * qtile + 2 * BWD_BN * BWD_BM * 2 + 2 * BWD_BM * D * 4 +
                             B9_STAGES * 2 * BWD_BM * 4 + 8 * (1 + 2 * B9_STAGES) + 1024);
    } else if (strcmp(role, "bwd_dq") == 0) {
        int64_t blocks = (S * QH * D / 8 + DQ_THREADS - 1) / DQ_THREADS;
        d->grid[0] = (unsigned)CP_MIN(blocks, DQ_MAX_BLOCKS);
        d->block = DQ_THREADS;
        d->smem = 0;
    } else {
        return -1;
    }
    return 0;
}

int64_t cp_k_attention_prog_offset(const cp_kernel_spec *k) {
    return param(k, "SEQ") * param(k, "Q_HEADS") * param(k, "HEAD_DIM") * 4;
}

int64_t cp_k_attention_prog_bytes(const cp_kernel_spec *k) {
    int64_t blocks = (param(k, "SEQ") + BWD_BN - 1) / BWD_BN;
    return (param(k, "KV_HEADS") * blocks * 4 + 15) / 16 * 16;
}

int64_t cp_k_attention_workspace_bytes(const cp_kernel_spec *k) {
    return cp_k_attention_prog_offset(k) + cp_k_attention_prog_bytes(k);
}

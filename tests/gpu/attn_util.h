/* attn_util.h: the attention GPU test and benchmark's own helpers: build several attention modules in one parallel
 * JIT call (reporting registers and spills without failing on them: gu_build fails on any spill), and run the
 * forward and the whole backward (zeroing the workspace's counters, bwd, dq conversion) with the geometry of
 * kernels_attn.h. */
#ifndef ATTN_UTIL_H
#define ATTN_UTIL_H

#include <stdbool.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "emit.h"
#include "jit.h"
#include "kernels.h"
#include "kernels_attn.h"
#include "module.h"

typedef struct {
    int64_t seq, head_dim;
    int q_heads, kv_heads;
    bool causal, dkv_accum;
    bool dq_atomic; /* dQ summed by atomic adds in any order (train.deterministic = false) */
    bool docs;      /* document masks (cp_k_attention_docs): the entries take attn_mod's doc_* and positions */
} attn_shape;

typedef struct {
    attn_shape sh;
    int fwd_stages;  /* set before attn_build: this variant of fwd_sm90's K/V ring (kernels.h cp_kvariants); 0: the
                        generator's default */
    int64_t lse_stride; /* set before attn_build: the LSE rows this far apart (cp_k_attention_lse_stride, as in a
                           ring's half-block module); 0: seq */
    cp_kernel_spec spec;
    cp_module_src src;
    cp_jit_module jit;
    cp_module mod;
    cudaKernel_t fwd, fwd_sm90, bwd, bwd_sm90, bwd_dq;
    cp_kdims d_fwd, d_fwd_sm90, d_bwd, d_bwd_sm90, d_dq;
    bool hopper;     /* the device runs fwd_sm90, bwd_sm90 (sm_90a); attn_fwd, attn_bwd take them unless use_mma */
    bool use_mma;    /* attn_fwd, attn_bwd run the mma.sync kernels even where the Hopper ones exist */
    int spill_bytes; /* spill stores + loads over the module's entries */
    /* with sh.docs, what attn_fwd and attn_bwd pass last (templates/attention.cu, "Document masks"): the device
     * arrays of document starts and ends over the whole sequence, and the positions of the first query and key */
    const int *doc_start, *doc_end;
    int q_pos, k_pos;
} attn_mod;

/* The module's LSE row stride and the bytes its LSE spans: ((QH - 1) * stride + S) * 4. */
int64_t attn_lse_stride(const attn_mod *m);
size_t attn_lse_bytes(const attn_mod *m);
/* "S=4097 QH=4 KVH=1 D=128 causal" (" docs" with document masks) into buf. */
const char *attn_shape_str(const attn_shape *s, char *buf, int n);
/* Emit, compile (all at once, on every core), load n modules; prints each entry's registers, shared memory and
 * spills. Fails (gu_fail) on any error. */
void attn_build(attn_mod *m, int n);
void attn_free(attn_mod *m);
/* Queue the forward: o, lse from q, k, v (the Hopper forward, with its tensor maps, where m->hopper and not
 * m->use_mma). */
void attn_fwd(attn_mod *m, const void *q, const void *k, const void *v, void *o, float *lse, cudaStream_t s);
/* Queue the backward: zero the progress counters of the workspace dq_ws (cp_k_attention_workspace_bytes; its fp32 dQ
 * is written whole by an ordered bwd, and zeroed too for an atomic one), bwd (the Hopper one, with its tensor maps,
 * where m->hopper and not m->use_mma), dq from dq_ws. dk, dv are bf16, or fp32 added to when dkv_accum. */
void attn_bwd(attn_mod *m, const void *q, const void *k, const void *v, const void *dout, const float *lse,
              const float *delta, float *dq_ws, void *dq, void *dk, void *dv, cudaStream_t s);

#endif

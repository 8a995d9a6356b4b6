/* attn_util.c: see attn_util.h. */
#include "attn_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_check.h"
#include "tma.h"
#include "gpu_util.h"
#include "util.h"

#define AU_CUDA(call)                                                                                         \
    do {                                                                                                      \
        cudaError_t e_ = (call);                                                                              \
        if (e_ != cudaSuccess) {                                                                              \
            char m_[1024];                                                                                    \
            cp_cuda_errmsg(e_, #call, m_, sizeof m_);                                                         \
            gu_fail("%s:%d: %s", __FILE__, __LINE__, m_);                                                     \
        }                                                                                                     \
    } while (0)

const char *attn_shape_str(const attn_shape *s, char *buf, int n) {
    snprintf(buf, (size_t)n, "S=%lld QH=%d KVH=%d D=%lld %s%s%s%s", (long long)s->seq, s->q_heads, s->kv_heads,
             (long long)s->head_dim, s->causal ? "causal" : "full", s->dkv_accum ? " acc" : "",
             s->dq_atomic ? " atomic" : "", s->docs ? " docs" : "");
    return buf;
}

int64_t attn_lse_stride(const attn_mod *m) { return m->lse_stride ? m->lse_stride : m->sh.seq; }
size_t attn_lse_bytes(const attn_mod *m) {
    return (size_t)(((m->sh.q_heads - 1) * attn_lse_stride(m) + m->sh.seq) * 4);
}

void attn_build(attn_mod *m, int n) {
    char err[8192];
    cp_module_src *srcs = calloc((size_t)n, sizeof *srcs);
    cp_jit_module *jits = calloc((size_t)n, sizeof *jits);
    for (int i = 0; i < n; i++) {
        const attn_shape *s = &m[i].sh;
        cp_k_attention(&m[i].spec, s->head_dim, s->q_heads, s->kv_heads, s->seq, s->causal, s->dkv_accum,
                       s->dq_atomic);
        if (m[i].lse_stride) cp_k_attention_lse_stride(&m[i].spec, m[i].lse_stride);
        if (s->docs) cp_k_attention_docs(&m[i].spec, true);
        cp_kvariants v;
        if (m[i].fwd_stages && cp_k_variants(&m[i].spec, &v)) cp_k_set_variant(&m[i].spec, &v, m[i].fwd_stages);
        if (cp_emit(&m[i].spec, &m[i].src, err, sizeof err) != 0) gu_fail("emit attention: %s", err);
        srcs[i] = m[i].src;
    }
    cp_jit_opts o;
    memset(&o, 0, sizeof o);
    snprintf(o.arch, sizeof o.arch, "%s", gu_dev.arch);
    double t0 = cp_now();
    if (cp_jit_compile(srcs, n, &o, jits, err, sizeof err) != 0) gu_fail("compile: %s", err);
    printf("compiled %d attention modules for %s in %.1f s\n", n, o.arch, cp_now() - t0);
    for (int i = 0; i < n; i++) {
        attn_mod *a = &m[i];
        a->jit = jits[i];
        if (cp_module_load(&a->mod, a->src.name, a->jit.cubin, a->jit.cubin_len, err, sizeof err) != 0)
            gu_fail("%s", err);
        const char *roles[5] = {"fwd", "bwd", "bwd_dq", "fwd_sm90", "bwd_sm90"};
        cudaKernel_t *ks[5] = {&a->fwd, &a->bwd, &a->bwd_dq, &a->fwd_sm90, &a->bwd_sm90};
        cp_kdims *ds[5] = {&a->d_fwd, &a->d_bwd, &a->d_dq, &a->d_fwd_sm90, &a->d_bwd_sm90};
        a->hopper = cp_k_attention_hopper(o.arch);
        for (int r = 0; r < (a->hopper ? 5 : 3); r++) {
            if (cp_module_role(&a->mod, "attention", roles[r], ks[r], err, sizeof err) != 0) gu_fail("%s", err);
            if (cp_k_attention_dims(&a->spec, roles[r], ds[r]) != 0) gu_fail("no geometry for attention %s", roles[r]);
            if (ds[r]->smem > 48 * 1024 && cp_kernel_set_max_smem(*ks[r], ds[r]->smem, err, sizeof err) != 0)
                gu_fail("%s", err);
        }
        a->spill_bytes = 0;
        for (int e = 0; e < a->jit.nentries; e++) {
            const cp_entry_info *x = &a->jit.entries[e];
            const cp_kdims *d = strstr(x->name, "_bwd_dq_")     ? &a->d_dq
                                : strstr(x->name, "_bwd_sm90_") ? &a->d_bwd_sm90
                                : strstr(x->name, "_bwd_")      ? &a->d_bwd
                                : strstr(x->name, "_sm90_")     ? &a->d_fwd_sm90
                                                                : &a->d_fwd;
            printf("  %-50s %3d regs, %6u B smem, %4u threads, spills %d/%d%s\n", x->name, x->registers, d->smem,
                   d->block, x->spill_stores, x->spill_loads, a->jit.from_cache ? " (cached)" : "");
            a->spill_bytes += x->spill_stores + x->spill_loads;
        }
    }
    free(srcs);
    free(jits);
}

void attn_free(attn_mod *m) {
    cp_module_unload(&m->mod);
    cp_jit_module_free(&m->jit);
    cp_module_src_free(&m->src);
    cp_kspec_free(&m->spec);
}

/* Tensor maps of the Hopper entries' operands q, k, v (and dout, dq_ws): query-side boxes of q_rows rows, key-side
 * boxes of CP_ATTN_SM90_BOX_ROWS rows; dq_ws is fp32. */
static void hopper_tmaps(const attn_mod *m, cp_tmap *tm, int n, const void *const *ptr, int q_rows) {
    const attn_shape *h = &m->sh;
    const int64_t heads[5] = {h->q_heads, h->kv_heads, h->kv_heads, h->q_heads, h->q_heads};
    const int rows[5] = {q_rows, CP_ATTN_SM90_BOX_ROWS, CP_ATTN_SM90_BOX_ROWS, q_rows, q_rows};
    char err[512];
    for (int j = 0; j < n; j++)
        if (cp_tmap_heads(&tm[j], ptr[j], j == 4 ? 4 : 2, h->seq, heads[j], h->head_dim, rows[j], err, sizeof err))
            gu_fail("%s", err);
}

void attn_fwd(attn_mod *m, const void *q, const void *k, const void *v, void *o, float *lse, cudaStream_t s) {
    if (m->hopper && !m->use_mma) {
        cp_tmap tm[3];
        hopper_tmaps(m, tm, 3, (const void *const[]){q, k, v}, CP_ATTN_SM90_BOX_ROWS);
        /* with documents the four arguments of the contract follow (an entry reads only the parameters it has) */
        void *args[] = {&tm[0], &tm[1], &tm[2], &o, &lse, &m->doc_start, &m->doc_end, &m->q_pos, &m->k_pos};
        AU_CUDA(cp_launch(m->fwd_sm90, &m->d_fwd_sm90, args, s));
        return;
    }
    void *args[] = {&q, &k, &v, &o, &lse, &m->doc_start, &m->doc_end, &m->q_pos, &m->k_pos};
    AU_CUDA(cp_launch(m->fwd, &m->d_fwd, args, s));
}

void attn_bwd(attn_mod *m, const void *q, const void *k, const void *v, const void *dout, const float *lse,
              const float *delta, float *dq_ws, void *dq, void *dk, void *dv, cudaStream_t s) {
    /* an ordered bwd writes the whole fp32 dQ, and only the progress counters after it start at zero; an atomic
     * one adds into all of it */
    void *prog = (char *)dq_ws + cp_k_attention_prog_offset(&m->spec);
    if (m->sh.dq_atomic)
        AU_CUDA(cudaMemsetAsync(dq_ws, 0, (size_t)cp_k_attention_workspace_bytes(&m->spec), s));
    else
        AU_CUDA(cudaMemsetAsync(prog, 0, (size_t)cp_k_attention_prog_bytes(&m->spec), s));
    if (m->hopper && !m->use_mma) {
        cp_tmap tm[5];
        hopper_tmaps(m, tm, 5, (const void *const[]){q, k, v, dout, dq_ws}, CP_ATTN_SM90_BWD_Q_ROWS);
        void *args[] = {&tm[0], &tm[1],   &tm[2],       &tm[3],     &tm[4],   &lse,    &delta,
                        &prog,  &dk,      &dv,          &m->doc_start, &m->doc_end, &m->q_pos, &m->k_pos};
        AU_CUDA(cp_launch(m->bwd_sm90, &m->d_bwd_sm90, args, s));
    } else {
        void *args[] = {&q, &k, &v, &dout, &lse, &delta, &dq_ws, &prog, &dk, &dv,
                        &m->doc_start, &m->doc_end, &m->q_pos, &m->k_pos};
        AU_CUDA(cp_launch(m->bwd, &m->d_bwd, args, s));
    }
    void *args2[] = {&dq_ws, &dq};
    AU_CUDA(cp_launch(m->bwd_dq, &m->d_dq, args2, s));
}

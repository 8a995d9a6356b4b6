/* test_attention_variants.c: every variant of the Hopper attention forward (kernels.h cp_kvariants: the depth of
 * fwd_sm90's K/V ring, which `cpgen tune` times and a plan may take from the tuning cache) gives the same bits as the
 * generator's default, o and lse, on lengths that are and are not multiples of the tiles, with fewer key tiles than
 * ring stages and many more, head_dim 64 and 128, causal and full, GQA. The default is checked against the float64
 * reference by test_attention, so every variant is as right as it is. Needs sm_90a; elsewhere it is skipped (exit
 * 77). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "attn_util.h"
#include "gpu_util.h"

static const attn_shape SHAPES[] = {
    {1, 64, 1, 1, true, false, false, false},        {100, 128, 3, 1, true, false, false, false},
    {1000, 64, 4, 1, false, false, false, false},    {4097, 128, 4, 1, true, false, false, false},
    {4097, 64, 2, 2, true, false, false, false},     {20000, 128, 2, 1, false, false, false, false},
    {32768, 64, 8, 2, true, false, false, false},
};
#define NSHAPES ((int)(sizeof SHAPES / sizeof SHAPES[0]))

static int compared; /* variants compared with the default, over all shapes */

/* o and lse of module m's Hopper forward on q, k, v, into ho, hlse (host) */
static void forward(attn_mod *m, void *q, void *k, void *v, void *o, float *lse, uint16_t *ho, float *hlse) {
    const attn_shape *s = &m->sh;
    size_t bq = (size_t)(s->seq * s->q_heads * s->head_dim * 2), blse = (size_t)(s->seq * s->q_heads * 4);
    gu_poison(o, bq);
    gu_poison(lse, blse);
    attn_fwd(m, q, k, v, o, lse, 0);
    if (cudaDeviceSynchronize() != cudaSuccess) gu_fail("fwd_sm90 failed: %s", cudaGetErrorString(cudaGetLastError()));
    gu_download(ho, o, bq);
    gu_download(hlse, lse, blse);
}

static void check_variants(void **state) {
    const attn_shape *base = *state;
    cp_kernel_spec k;
    cp_k_attention(&k, base->head_dim, base->q_heads, base->kv_heads, base->seq, base->causal, base->dkv_accum, false);
    cp_kvariants v;
    assert_true(cp_k_variants(&k, &v));
    cp_kspec_free(&k);
    attn_mod mods[CP_KVAR_MAX];
    memset(mods, 0, sizeof mods);
    int def = -1;
    for (int i = 0; i < v.n; i++) {
        mods[i].sh = *base;
        mods[i].fwd_stages = v.values[i];
        if (v.values[i] == v.def) def = i;
    }
    assert_true(def >= 0);
    attn_build(mods, v.n);
    const attn_shape *s = base;
    const int64_t nq = s->seq * s->q_heads * s->head_dim, nkv = s->seq * s->kv_heads * s->head_dim,
                  nlse = s->seq * s->q_heads;
    gu_rng rng;
    gu_seed(&rng, (uint64_t)s->seq * 131 + (uint64_t)s->head_dim);
    uint16_t *hq = gu_rand_bf16(&rng, nq, 1.0), *hk = gu_rand_bf16(&rng, nkv, 1.0), *hv = gu_rand_bf16(&rng, nkv, 1.0);
    void *q = gu_malloc((size_t)nq * 2), *kk = gu_malloc((size_t)nkv * 2), *vv = gu_malloc((size_t)nkv * 2),
         *o = gu_malloc((size_t)nq * 2);
    float *lse = gu_malloc((size_t)nlse * 4);
    gu_upload(q, hq, (size_t)nq * 2);
    gu_upload(kk, hk, (size_t)nkv * 2);
    gu_upload(vv, hv, (size_t)nkv * 2);
    uint16_t *ref_o = malloc((size_t)nq * 2), *got_o = malloc((size_t)nq * 2);
    float *ref_lse = malloc((size_t)nlse * 4), *got_lse = malloc((size_t)nlse * 4);
    forward(&mods[def], q, kk, vv, o, lse, ref_o, ref_lse);
    if (gu_nan_bf16(ref_o, nq) || gu_nan_f32(ref_lse, nlse)) gu_fail("the default left outputs unwritten");
    char name[112];
    attn_shape_str(s, name, sizeof name);
    for (int i = 0; i < v.n; i++) {
        if (i == def) continue;
        forward(&mods[i], q, kk, vv, o, lse, got_o, got_lse);
        if (memcmp(ref_o, got_o, (size_t)nq * 2) || memcmp(ref_lse, got_lse, (size_t)nlse * 4))
            gu_fail("%s: with %d K/V stages o or lse differs from the default's (%d)", name, v.values[i], v.def);
        printf("  %s: %d K/V stages give the bits of %d\n", name, v.values[i], v.def);
        compared++;
    }
    free(hq), free(hk), free(hv), free(ref_o), free(got_o), free(ref_lse), free(got_lse);
    void *bufs[] = {q, kk, vv, o, lse};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) gu_free_dev(bufs[i]);
    for (int i = 0; i < v.n; i++) attn_free(&mods[i]);
}

int main(void) {
    gu_init_or_skip("test_attention_variants");
    if (!cp_k_attention_hopper(gu_dev.arch))
        gu_skip("test_attention_variants", "needs sm_90a (fwd_sm90 and its variants); GPU 0 is %s", gu_dev.arch);
    gu_cmocka = true;
    struct CMUnitTest tests[NSHAPES];
    char names[NSHAPES][112];
    for (int i = 0; i < NSHAPES; i++) {
        attn_shape_str(&SHAPES[i], names[i], sizeof names[i]);
        tests[i] = (struct CMUnitTest){names[i], check_variants, NULL, NULL, (void *)&SHAPES[i]};
    }
    int failed = _cmocka_run_group_tests("attention variants", tests, NSHAPES, NULL, NULL);
    printf("%d variants compared with the default\n", compared);
    if (failed) return 1; /* not the count: 77 of them would read as skipped */
    if (compared == 0) {
        printf("FAILED: no variant was compared: nothing was checked\n");
        return 1;
    }
    return 0;
}

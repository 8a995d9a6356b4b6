// sm90.cuh: the PTX of the Hopper (sm_90a) kernels that move tiles with the tensor memory accelerator and multiply
// them with wgmma: mbarriers, bulk tensor copies (multicast to a cluster's CTAs too), named barriers, clusters,
// shared-memory matrix descriptors with the 128-byte swizzle and the wgmma fences. Included by attention.cu (for
// attention_sm90.cuh and attention_bwd_sm90.cuh) and by gemm_fp8.cu. Addresses of shared memory are 32-bit (cvta to
// the shared window).
#pragma once

typedef unsigned int u32;

// The driver's CUtensorMap: 128 opaque bytes, 64-byte aligned, encoded on the host.
struct __align__(64) tmap_t {
    unsigned long long v[16];
};

__device__ __forceinline__ void mbar_init(u32 bar, u32 count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// One arrival that also announces `bytes` of copies to come (the producer's, before its copies).
__device__ __forceinline__ void mbar_expect_tx(u32 bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(u32 bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Until the barrier's phase of this parity has completed.
__device__ __forceinline__ void mbar_wait(u32 bar, u32 parity) {
    u32 done;
    do {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(bar), "r"(parity)
                     : "memory");
    } while (!done);
}
// Box (c0, c1, c2) of the tensor map into shared memory at dst; its bytes are counted on bar. Rows past the tensor's
// end arrive as zeros (and count).
__device__ __forceinline__ void tma_load_3d(u32 dst, const tmap_t *map, int c0, int c1, int c2, u32 bar) {
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, "
                 "%4}], [%5];\n" ::"r"(dst),
                 "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
                 : "memory");
}
// Box (c0, c1) of a 2-D tensor map, likewise.
__device__ __forceinline__ void tma_load_2d(u32 dst, const tmap_t *map, int c0, int c1, u32 bar) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], "
                 "[%4];\n" ::"r"(dst),
                 "l"(map), "r"(c0), "r"(c1), "r"(bar)
                 : "memory");
}
// The same box into shared memory at dst in each CTA of the cluster that cta_mask names (bit r: rank r), each counted
// on the mbarrier at bar in that CTA (dst and bar: this CTA's addresses, the same offsets there).
__device__ __forceinline__ void tma_load_2d_multicast(u32 dst, const tmap_t *map, int c0, int c1, u32 bar,
                                                      unsigned short cta_mask) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], "
                 "[%1, {%2, %3}], [%4], %5;\n" ::"r"(dst),
                 "l"(map), "r"(c0), "r"(c1), "r"(bar), "h"(cta_mask)
                 : "memory");
}
// This CTA's rank in its cluster.
__device__ __forceinline__ u32 cluster_rank() {
    u32 r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
    return r;
}
// Every thread of the cluster's CTAs: what each did to shared memory before is visible to all after.
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
// The address in the cluster's shared window of this CTA's shared address addr in the CTA of rank `rank`: offsets
// from it address the same offsets there, so a barrier array is mapped once.
__device__ __forceinline__ u32 cluster_map(u32 addr, u32 rank) {
    u32 r;
    asm("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(addr), "r"(rank));
    return r;
}
// One arrival on the mbarrier at cluster address bar (cluster_map's), ordered after this thread's earlier accesses as
// a local arrival is (release at the CTA's scope: a fence at the cluster's would wait for every earlier access to be
// seen there, and costs more than a k block's products).
__device__ __forceinline__ void mbar_arrive_cluster(u32 bar) {
    asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void bar_sync(int id, int n) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }
__device__ __forceinline__ void bar_arrive(int id, int n) { asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }

// Shared-memory matrix descriptor with the 128-byte swizzle: start, leading and stride byte offsets (all >> 4).
__device__ __forceinline__ unsigned long long sw128_desc(u32 addr, u32 lbo, u32 sbo) {
    return (unsigned long long)((addr & 0x3FFFF) >> 4) | (unsigned long long)((lbo & 0x3FFFF) >> 4) << 16 |
           (unsigned long long)((sbo & 0x3FFFF) >> 4) << 32 | 1ull << 62;
}
// The descriptor `bytes` further on in shared memory. The start address is the low field, in 16-byte units, and no
// tile reaches the field's end, so an add moves it. Built afresh with its masks and shifts, each descriptor took
// about a dozen instructions in front of its wgmma; moved by adds, three to five.
__device__ __forceinline__ unsigned long long desc_plus(unsigned long long d, u32 bytes) { return d + (bytes >> 4); }
// The warpgroup of this thread, which the compiler can then tell is the same in the whole warp: the descriptors
// built from it live in uniform registers, where wgmma reads them, not in per-thread ones moved over each time.
__device__ __forceinline__ int warpgroup_uniform() { return __shfl_sync(0xffffffffu, (int)(threadIdx.x >> 7), 0); }
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Until at most N of this warpgroup's committed groups are pending (groups complete in order).
template <int N> __device__ __forceinline__ void wg_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// After a wait: the accumulators are read only from here on (an empty asm the compiler cannot move them across).
template <int N> __device__ __forceinline__ void reg_fence(float (&r)[N]) {
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+f"(r[i])::"memory");
}

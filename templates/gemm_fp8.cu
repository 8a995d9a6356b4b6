// module: gemm_fp8_{{SHAPE}}
// gemm_fp8.cu: a GEMM of FP8 inputs with block scales on Hopper's tensor cores (sm_90a; elsewhere the entry traps):
//   D[m][n] = sum over k of (A[m][k] sa) (B[n][k] sb)   (the x W^T form; N = n and K = k are the module's, m the call's)
// A and B are FP8 bytes (E4M3 or E5M2) with k contiguous; sa holds one fp32 scale per row of A and 128 of k, laid out
// [K / 128][m] (rows contiguous, cuBLASLt's VEC128_32F); sb the same for B ([K / 128][N], B_TILES = 0: a gradient or
// activation read transposed, as the weights' gradients take it) or one per 128 x 128 tile of B ([N / 128][ld4],
// ld4 the k blocks rounded up to a multiple of 4, BLK128x128_32F: a weight). EPILOGUE says what happens to D: 0 it is
// written (bf16), 1 written as AB + C (C bf16 laid out as D), 2 added to (fp32), 3 added to (bf16); every sum in fp32,
// rounded once. D's row stride is ldd elements.
//
// Structure (that of attention_sm90.cuh): a persistent grid walks output tiles of BM x 128 (BM = 64 x CONSUMERS:
// 128 or 192 rows), grouped GROUP_M tile rows at a time so that the tiles in flight share their A rows and B columns in
// L2. One producer thread streams each k block of 128 (A's and B's tiles with the 128-byte swizzle, A's scales and B's
// 1 x 128 ones) through a ring of STAGES shared-memory stages with the tensor memory accelerator, counted in bytes on
// the stage's mbarrier. With CLUSTER = 2 the two CTAs of a cluster take two tiles of one tile column and each loads
// half of their common B tile into both (a multicast copy), so that a stage moves 8 KiB less through L2; a stage is
// then free for reuse once the consumers of both CTAs have released it. CONSUMERS warpgroups of 64 rows each multiply
// a k block into fresh fp32 registers with four wgmma m64n128k32 and then add them, times the block's scales, to the
// tile's accumulators: the promotion to fp32 at every 128 of k that keeps block scales exact and the tensor cores'
// short sums short. While one warpgroup promotes, the others' products run; tiles of 192 rows also read 17% fewer
// bytes through L2 per product than tiles of 128. The consumers release a stage once its products are complete and
// its scales read, and store the tile from registers while the producer already streams the next one.
//
// Entry: sm90(tm_a, tm_b, tm_sa, tm_sb, b_tiles, c, d, m, ldd): grid and dynamic shared memory from cp_k_dims (a
// multiple of CLUSTER blocks, at most one an SM), 128 x (1 + CONSUMERS) threads; tensor maps (runtime/gemm_fp8.c):
// A [m][K] and B [N][K] as u8 in boxes of 128 columns by BM rows (B: 128 / CLUSTER rows) with the 128-byte swizzle;
// sa [K / 128][m] and, with B_TILES = 0, sb [K / 128][N] as f32 in boxes of BM x 1 and 128 x 1 (with B_TILES = 1
// tm_sb is not read and b_tiles points to the tile scales); rows past m arrive as zeros and are not stored. m >= 1;
// ldd even; d (and c) 4-byte aligned.
#include "sm90.cuh"

typedef unsigned short bf16;

#define N_DIM {{N}}
#define K_DIM {{K}}
#define A_TYPE "{{A_TYPE}}" // wgmma's names: e4m3, e5m2
#define B_TYPE "{{B_TYPE}}"
#define B_TILES {{B_TILES}}
#define EPILOGUE {{EPILOGUE}}
#define STAGES {{STAGES}}
#define GROUP_M {{GROUP_M}}
#define SMEM_BYTES {{SMEM_BYTES}}
#define CLUSTER {{CLUSTER}} // CTAs of a cluster: 2 share their B tile, each loading half for both
#define CONSUMERS {{CONSUMERS}} // consumer warpgroups of 64 tile rows each: 2 (tiles of 128 rows) or 3 (192)

constexpr int BM = 64 * CONSUMERS, BN = 128, BK = 128, THREADS = 128 * (1 + CONSUMERS);
constexpr int KB = K_DIM / BK, NT = N_DIM / BN, LD4 = (KB + 3) / 4 * 4;
static_assert(K_DIM % BK == 0 && N_DIM % BN == 0, "N and K must be multiples of 128");
static_assert(CLUSTER == 1 || CLUSTER == 2, "clusters of one or two CTAs");
static_assert(CONSUMERS == 2 || CONSUMERS == 3, "two or three consumer warpgroups");
// registers a thread: the producer warpgroup gives its own to the consumers, within the SM's 64K over 128 threads a
// warpgroup (40 + 2 x 232 and 24 + 3 x 160 are 504 of 512)
constexpr int PRODUCER_REGS = CONSUMERS == 2 ? 40 : 24, CONSUMER_REGS = CONSUMERS == 2 ? 232 : 160;
constexpr u32 A_TILE = BM * BK, B_TILE = BN * BK; // bytes of A's and B's tiles of one k block
constexpr u32 SA_BYTES = BM * 4, SB_BYTES = BN * 4; // bytes of a k block's row scales of A, of B
constexpr u32 OFF_B = STAGES * A_TILE, OFF_SA = OFF_B + STAGES * B_TILE, OFF_SB = OFF_SA + STAGES * SA_BYTES;
constexpr u32 OFF_BAR = OFF_SB + (B_TILES ? 0 : STAGES * SB_BYTES);
constexpr u32 STAGE_TX = A_TILE + B_TILE + SA_BYTES + (B_TILES ? 0 : SB_BYTES);
static_assert(A_TILE % 1024 == 0 && SA_BYTES % 128 == 0, "the swizzled tiles start at multiples of 1024 bytes");
static_assert(OFF_BAR + 16 * STAGES + 1024 <= SMEM_BYTES, "the stages do not fit SMEM_BYTES (gen/kernels.c)");

extern "C" __global__ void gemm_fp8_sm90_{{SHAPE}}(const __grid_constant__ tmap_t tm_a, const __grid_constant__ tmap_t tm_b,
                                                 const __grid_constant__ tmap_t tm_sa, const __grid_constant__ tmap_t tm_sb,
                                                 const float *b_tiles, const bf16 *c, void *d, long long m, long long ldd);

__device__ __forceinline__ u32 pack_bf16(float lo, float hi) {
    u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
__device__ __forceinline__ float bf16_lo(u32 v) { return __uint_as_float(v << 16); }
__device__ __forceinline__ float bf16_hi(u32 v) { return __uint_as_float(v & 0xffff0000u); }

// The walk over output tiles: a cluster takes CLUSTER tile rows of one tile column at a time (a unit), the CTA of
// rank r its r-th row; the units GROUP_M at a time, down each column of the group before the next column. A unit
// row past the last tile row reads zeros and stores nothing.
struct tile_walk {
    int units, mgroups, rank;
    __device__ __forceinline__ tile_walk(long long m) {
        const int mtiles = (int)((m + BM - 1) / BM);
        mgroups = (mtiles + CLUSTER - 1) / CLUSTER;
        units = mgroups * NT;
        rank = CLUSTER == 1 ? 0 : (int)cluster_rank();
    }
    __device__ __forceinline__ int first() const { return blockIdx.x / CLUSTER; }
    __device__ __forceinline__ int stride() const { return gridDim.x / CLUSTER; }
    __device__ __forceinline__ void at(int unit, int &mt, int &nt) const {
        const int per_group = GROUP_M * NT, group = unit / per_group, first = group * GROUP_M;
        const int rows = min(mgroups - first, GROUP_M), in = unit - group * per_group;
        mt = (first + in % rows) * CLUSTER + rank;
        nt = in / rows;
    }
};

// d (64 x 128, f32) = (scale_d ? d : 0) + A B over 32 of k: A (64 x 32) and B (128 x 32) K-major in shared memory.
__device__ __forceinline__ void wgmma_fp8_n128(float (&d)[64], unsigned long long da, unsigned long long db, int scale_d) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k32.f32." A_TYPE "." B_TYPE " {"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
                 "}, %64, %65, p, 1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),
                   "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),
                   "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),
                   "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),
                   "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]),
                   "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]),
                   "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),
                   "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "l"(da), "l"(db), "r"(scale_d));
}

// Accumulator layout of a 64 x 128 wgmma in a warpgroup: warp w, lane (g = lane / 4, t = lane % 4) holds rows
// 16 w + g + 8 r (r = 0, 1) and columns 8 j + 2 t + e (e = 0, 1) as element 4 j + 2 r + e.

// A consumer warpgroup's place in the ring of stages: the stage and the parity of its current use.
struct ring_pos {
    int s;
    u32 ph;
    __device__ __forceinline__ void next() {
        if (++s == STAGES) s = 0, ph ^= 1;
    }
};

// Once the stage at p is full, start the warpgroup's products of its k block into part (cw: the warpgroup's rows).
__device__ __forceinline__ void issue_block(float (&part)[64], u32 sbase, ring_pos p, int cw) {
    mbar_wait(sbase + OFF_BAR + 8 * p.s, p.ph);
    const unsigned long long da = sw128_desc(sbase + p.s * A_TILE + cw * 64 * BK, 16, 1024);
    const unsigned long long db = sw128_desc(sbase + OFF_B + p.s * B_TILE, 16, 1024);
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < BK / 32; kk++) wgmma_fp8_n128(part, desc_plus(da, 32 * kk), desc_plus(db, 32 * kk), kk);
    wg_commit();
}

// Add the finished products of the k block at stage p.s, times its scales, to acc; then the warp releases the stage
// (its products complete, its scales read). sb_tile: B's tile scale of the block (B_TILES).
__device__ __forceinline__ void promote_block(float (&acc)[64], float (&part)[64], u32 sbase, const unsigned char *gbase,
                                              int s, int row, float sb_tile, u32 peer_empty) {
    reg_fence(part);
    const int lane = threadIdx.x & 31, t = lane & 3;
    const float *sa = reinterpret_cast<const float *>(gbase + OFF_SA + s * SA_BYTES);
    const float sa0 = sa[row], sa1 = sa[row + 8];
    if (B_TILES) {
        const float q0 = sa0 * sb_tile, q1 = sa1 * sb_tile;
#pragma unroll
        for (int j = 0; j < 16; j++) {
            acc[4 * j] += part[4 * j] * q0;
            acc[4 * j + 1] += part[4 * j + 1] * q0;
            acc[4 * j + 2] += part[4 * j + 2] * q1;
            acc[4 * j + 3] += part[4 * j + 3] * q1;
        }
    } else {
        const float2 *sb = reinterpret_cast<const float2 *>(gbase + OFF_SB + s * SB_BYTES);
#pragma unroll
        for (int j = 0; j < 16; j++) {
            const float2 q = sb[4 * j + t]; // columns 8 j + 2 t, + 1
            acc[4 * j] += part[4 * j] * sa0 * q.x;
            acc[4 * j + 1] += part[4 * j + 1] * sa0 * q.y;
            acc[4 * j + 2] += part[4 * j + 2] * sa1 * q.x;
            acc[4 * j + 3] += part[4 * j + 3] * sa1 * q.y;
        }
    }
    __syncwarp();
    if (lane == 0) {
        mbar_arrive(sbase + OFF_BAR + 8 * (STAGES + s));
        // the other CTA's producer writes half of this stage's B here too
        if (CLUSTER == 2) mbar_arrive_cluster(peer_empty + 8 * s);
    }
}

// One consumer warpgroup (cw = 0 .. CONSUMERS - 1: rows 64 cw .. of each tile): the k blocks of every tile of the
// walk, then the tile's store.
__device__ __forceinline__ void gemm_consumer(u32 sbase, const unsigned char *gbase, int cw, const tile_walk &w,
                                              const float *__restrict__ b_tiles, const bf16 *__restrict__ c, void *d,
                                              long long m, long long ldd) {
    const int lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) & 3, g = lane >> 2, t = lane & 3;
    const int row = 64 * cw + 16 * warp + g; // the thread's first row in the tile; its second is 8 below
    // with clusters of two, the other CTA's empty barriers, which this one's consumers release too
    const u32 peer_empty = CLUSTER == 2 ? cluster_map(sbase + OFF_BAR + 8 * STAGES, (u32)w.rank ^ 1u) : 0u;
    ring_pos at = {0, 0u};
    for (int unit = w.first(); unit < w.units; unit += w.stride()) {
        int mt, nt;
        w.at(unit, mt, nt);
        const float *bt = b_tiles + nt * LD4;
        float acc[64];
#pragma unroll
        for (int i = 0; i < 64; i++) acc[i] = 0.0f;
        float sb_next = B_TILES ? __ldg(bt) : 0.0f;
        for (int kb = 0; kb < KB; kb++) {
            const float sb_tile = sb_next; // read a block ahead: its latency hides under this block's products
            if (B_TILES && kb + 1 < KB) sb_next = __ldg(bt + kb + 1);
            float part[64];
            issue_block(part, sbase, at, cw);
            wg_wait<0>();
            promote_block(acc, part, sbase, gbase, at.s, row, sb_tile, peer_empty);
            at.next();
        }
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const long long gr = (long long)mt * BM + row + 8 * r;
            if (gr >= m) continue;
#pragma unroll
            for (int j = 0; j < 16; j++) {
                const long long o = gr * ldd + nt * BN + 8 * j + 2 * t;
                const float v0 = acc[4 * j + 2 * r], v1 = acc[4 * j + 2 * r + 1];
#if EPILOGUE == 0
                *reinterpret_cast<u32 *>(static_cast<bf16 *>(d) + o) = pack_bf16(v0, v1);
#elif EPILOGUE == 1
                const u32 cv = *reinterpret_cast<const u32 *>(c + o);
                *reinterpret_cast<u32 *>(static_cast<bf16 *>(d) + o) = pack_bf16(v0 + bf16_lo(cv), v1 + bf16_hi(cv));
#elif EPILOGUE == 2
                float2 *p = reinterpret_cast<float2 *>(static_cast<float *>(d) + o);
                float2 old = *p;
                old.x += v0, old.y += v1;
                *p = old;
#else
                u32 *p = reinterpret_cast<u32 *>(static_cast<bf16 *>(d) + o);
                const u32 old = *p;
                *p = pack_bf16(v0 + bf16_lo(old), v1 + bf16_hi(old));
#endif
            }
        }
    }
}

#if CLUSTER == 2 && defined(__CUDA_ARCH_FEAT_SM90_ALL) // elsewhere the entry only traps
#define CLUSTER_DIMS __cluster_dims__(2, 1, 1)
#else
#define CLUSTER_DIMS
#endif
extern "C" __global__ void __launch_bounds__(THREADS, 1) CLUSTER_DIMS
gemm_fp8_sm90_{{SHAPE}}(const __grid_constant__ tmap_t tm_a, const __grid_constant__ tmap_t tm_b,
                        const __grid_constant__ tmap_t tm_sa, const __grid_constant__ tmap_t tm_sb, const float *b_tiles,
                        const bf16 *c, void *d, long long m, long long ldd) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ unsigned char gsmem[];
    const u32 raw = (u32)__cvta_generic_to_shared(gsmem);
    const u32 sbase = (raw + 1023u) & ~1023u; // the 128-byte swizzle repeats every 1024 bytes
    const unsigned char *gbase = gsmem + (sbase - raw);
    const u32 bars = sbase + OFF_BAR; // full[s] at 8 s (the producer's arrival and bytes), empty[s] at 8 (STAGES + s)
    const tile_walk w(m);
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; s++) {
            mbar_init(bars + 8 * s, 1);
            mbar_init(bars + 8 * (STAGES + s), 4 * CONSUMERS * CLUSTER); // one arrival per consumer warp of each CTA
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    // the barriers ready before any CTA of the cluster arrives on them or copies to them
    if (CLUSTER == 2) cluster_sync();
    else __syncthreads();
    if (threadIdx.x < 128) {
        // producer warpgroup: one thread issues every copy; its registers go to the consumers
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(PRODUCER_REGS));
        if (threadIdx.x == 0) {
            ring_pos at = {0, 0u};
            bool wrapped = false;
            for (int unit = w.first(); unit < w.units; unit += w.stride()) {
                int mt, nt;
                w.at(unit, mt, nt);
                for (int kb = 0; kb < KB; kb++) {
                    // the stage's previous use, released by the consumers (of both CTAs: B's halves go to both)
                    if (wrapped) mbar_wait(bars + 8 * (STAGES + at.s), at.ph ^ 1);
                    const u32 full = bars + 8 * at.s;
                    mbar_expect_tx(full, STAGE_TX);
                    tma_load_2d(sbase + at.s * A_TILE, &tm_a, kb * BK, mt * BM, full);
                    if (CLUSTER == 2) {
                        const u32 half = w.rank * (BN / 2);
                        tma_load_2d_multicast(sbase + OFF_B + at.s * B_TILE + half * BK, &tm_b, kb * BK,
                                              nt * BN + half, full, 3);
                    } else {
                        tma_load_2d(sbase + OFF_B + at.s * B_TILE, &tm_b, kb * BK, nt * BN, full);
                    }
                    tma_load_2d(sbase + OFF_SA + at.s * SA_BYTES, &tm_sa, mt * BM, kb, full);
                    if (!B_TILES) tma_load_2d(sbase + OFF_SB + at.s * SB_BYTES, &tm_sb, nt * BN, kb, full);
                    if (at.s == STAGES - 1) wrapped = true;
                    at.next();
                }
            }
        }
    } else {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(CONSUMER_REGS));
        gemm_consumer(sbase, gbase, warpgroup_uniform() - 1, w, b_tiles, c, d, m, ldd);
    }
    // no CTA leaves while the other may still copy to it or arrive on its barriers
    if (CLUSTER == 2) cluster_sync();
#else
    __trap();
#endif
}

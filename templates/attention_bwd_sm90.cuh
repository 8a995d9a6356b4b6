// attention_bwd_sm90.cuh: the attention backward for Hopper (sm_90a), included into attention.cu after
// attention_sm90.cuh (whose mbarrier, TMA and wgmma helpers it uses). On other targets its entry traps: the runtime
// calls it on sm_90a alone. Same contract and tile order as the mma.sync backward `bwd` of attention.cu (read its
// comment); the dq_ws / dq_prog workspace and bwd_dq are shared by both.
//
// One block: 128 keys (one key block, from head_major_block) of one KV head; a producer warpgroup and two consumer
// warpgroups of 64 keys each. The loop runs over the query tiles of 64 rows that see these keys (last first) and,
// within each, over the query heads of the GQA group, as `bwd` does; dK and dV stay in registers for the whole
// loop. Producer warp 0 streams Q and dO by TMA (and lse, delta by cp.async) through a two-stage ring; K and V are
// loaded once. Per tile, a consumer computes transposed, so that P^T and dS^T come out of the accumulators in the
// A-operand layout:
//   S^T = K Q^T, dP^T = V dO^T                  (wgmma, both operands K-major in shared memory; at head_dim 64
//                                                K and V from registers, B9_KV_REGS)
//   P^T = exp(scale S^T - lse), dS^T = P^T (dP^T - delta)   (lse, delta per query row = per column)
//   dV += P^T dO                                (A from registers, B = dO)
//   dK += dS^T Q                                (A from registers, B = Q read transposed)
//   dS^T to shared memory (bf16), while dK runs
//   dQ = dS K, the whole tile over all 128 keys (A = dS^T read transposed, B = K read transposed): the work of one
//   consumer, the tile's owner, consumer (tile & 1); it waits for the other's half of dS^T (named barrier "dS
//   full"), and its fp32 result goes to shared memory for the dQ warp.
// The products overlap the math: P^T is computed while dP^T runs, dS^T and its store while dV and dK run. Owning
// dQ by turns is what keeps the tensor cores fed: when both consumers computed half of every tile's dQ, both
// waited at one barrier per tile for the whole dS^T, so their idle phases fell together; now only the owner waits,
// and while it computes dQ the other is already issuing the next tile's S^T and dP^T (at 32K, 32/32 heads, the
// backward went from 526 to 557 TF/s; its n128 products also read a quarter less of dQ's operands). dS^T is
// double-buffered: the other consumer writes its half of buffer b only once the owner's dQ of two tiles before has
// read it (named barrier "dS empty").
//
// dQ leaves the block through producer warp 1, so that the consumers never wait on global memory: per tile it takes
// the fp32 tile the owner left in its shared buffer (named barriers: full, empty) and hands it to the
// TMA unit whole, as a bulk tensor store (key block 0) or a bulk tensor add into dq_ws (the others). Ordered (the
// default, DQ_ATOMIC = 0) it first waits until the previous key block's count in dq_prog says that block has
// completed this tile, and publishes its own count once its writes are complete: the sums run in key-block order,
// the same bits every run. The previous key block of a head starts before this one (head_major_block: the block
// before in the launch order), so the wait cannot deadlock. Atomic (DQ_ATOMIC = 1) it adds at once, in whatever
// order the blocks come, into a dq_ws the plan zeroed.
//
// Shared-memory tiles are TMA boxes with the 128-byte swizzle as in the forward: K, V [128 rows][64 columns] per
// sub-tile (16 KiB), Q, dO [64 rows][64 columns] per sub-tile (8 KiB), dS^T [128 keys][64 rows] (16 KiB, written by
// the consumers with the same swizzle), dQ [64 rows][32 columns] fp32 per sub-tile (8 KiB).
//
// Entry (geometry in gen/kernels_attn.c, which must match BWD_SM90_SMEM):
//   bwd_sm90(tm_q, tm_k, tm_v, tm_do, tm_dq, lse, delta, dq_prog, dk, dv)
//       grid (KV_HEADS, ceil(SEQ/128)), 384 threads, BWD_SM90_SMEM bytes dynamic smem (the block's KV head and key
//       block come from its place in the launch order: head_major_block);
//       tm_q, tm_do: tensor maps of q, dout with boxes (64, 1, 64); tm_k, tm_v: of k, v with boxes (64, 1, 128);
//       tm_dq: of dq_ws (fp32) with boxes (32, 1, 64) (runtime/tma.h); the other arguments as for bwd.
//   With DOCS = 1: bwd_sm90(tm_q, tm_k, tm_v, tm_do, tm_dq, lse, delta, dq_prog, dk, dv, doc_start, doc_end, q_pos,
//   k_pos) (doc_start unused here).
//
// Document masks (DOCS = 1; the contract is attention.cu's, "Document masks"), in the keys' form: key c is kept by
// the query rows r < doc_end[k_pos + c] - q_pos (and the causal rule), the same scores as the forward's rule.
// doc_end never decreases along the sequence, so a key block's tiles run from its causal start to the query tile
// holding the last row its last key's document reaches, and every tile of that range keeps some score. The tiles keep
// the numbers they have in every key block; the Q, dO ring, the dS^T and dQ buffers and the tiles' owners count from
// the block's first one, and the count comes from the entry, where every role takes it. A block with no tile loads
// nothing and writes dK = dV = 0. A warp masks a tile when it crosses the diagonal or the end as before, or when the
// tile's last row is past the end of the warp's first key's document; a masked score has P = 0, also in a row whose
// lse is -inf (it keeps no key, so each of its tiles is masked), where exp(scale S - lse) alone would be +inf.
// The dQ sums stay in key-block order when blocks skip tiles: the key blocks that visit a tile are consecutive (the
// causal start and the last tile both grow with the block); the first stores (it knows it is first when the block
// before, from that block's last key, ends its tiles below this one) and waits for nobody, each later one waits for
// the block before, which visits the tile and publishes its count after it, and adds. So no block waits on a tile its
// predecessor skips, and the order, and the bits, are the same every run. Ordered, dq_ws is not zeroed before the
// backward, and bwd_dq reads all of it: the tiles that no key block visits (only without the causal rule, past the
// last key's document) are written as zeros by the dQ warps of the head's blocks, shared out among them. With
// DQ_ATOMIC the plan's zeroing leaves them 0. With DOCS = 0 the code is what it was (the same SASS).

#define B9_BM 64    // query rows per tile
#define B9_BN 128   // keys per block: two consumer warpgroups of 64
#define B9_STAGES 2 // depth of the Q, dO ring
#define B9_THREADS 384 // a producer warpgroup and two consumer warpgroups, whatever the forward's count
#define B9_BAR_DQF 4 // named barriers 4, 5: dQ buffer 0, 1 full (its owner arrives, the dQ warp waits)
#define B9_BAR_DQE 6 // named barriers 6, 7: dQ buffer 0, 1 empty (the dQ warp arrives, its owner waits)
#define B9_BAR_DSF 8 // named barriers 8, 9: the other consumer's half of dS^T buffer 0, 1 is in (it arrives)
#define B9_BAR_DSE 10 // named barriers 10, 11: dS^T buffer 0, 1 read by its owner's dQ (the owner arrives)
#define B9_DQ_THREADS (128 + 32) // a consumer warpgroup and the dQ warp
static_assert(B9_BM == BWD_BM && B9_BN == BWD_BN, "the tile order and dq_prog are those of bwd");

constexpr u32 B9_QSUB = B9_BM * 128;                       // bytes of one [64][64] bf16 sub-tile of Q or dO
constexpr u32 B9_QTILE = HSUB * B9_QSUB;                   // one Q or dO tile
constexpr u32 B9_DS = B9_BN * B9_BM * 2;                   // one dS^T tile [128 keys][64 rows]
constexpr u32 B9_DQSUB = B9_BM * 128;                      // one [64][32] fp32 sub-tile of dQ
constexpr u32 B9_DQ = HEAD_DIM / 32 * B9_DQSUB;            // one dQ tile [64 rows][HEAD_DIM] fp32
constexpr u32 B9_OFF_V = H_TILE, B9_OFF_Q = B9_OFF_V + H_TILE, B9_OFF_DO = B9_OFF_Q + B9_STAGES * B9_QTILE,
              B9_OFF_DS = B9_OFF_DO + B9_STAGES * B9_QTILE, B9_OFF_DQ = B9_OFF_DS + 2 * B9_DS,
              B9_OFF_L = B9_OFF_DQ + 2 * B9_DQ, B9_OFF_BAR = B9_OFF_L + B9_STAGES * 2 * B9_BM * 4;
// barriers: kv_full, q_full[B9_STAGES], q_empty[B9_STAGES]
constexpr u32 BWD_SM90_SMEM = B9_OFF_BAR + 8 * (1 + 2 * B9_STAGES) + 1024; // + the slack to align to 1024
static_assert(BWD_SM90_SMEM <= 227 * 1024, "the backward's tiles do not fit the 227 KiB a block may have");

// d (64 x 64, f32) = (scale_d ? d : 0) + A B, both operands in shared memory: A (64 x 16) and B (64 x 16) K-major
// (TRANS = 0), or A M-major and B (16 x 64) N-major (TRANS = 1: imm-trans-a = imm-trans-b = 1).
template <int TRANS>
__device__ __forceinline__ void wgmma_ss_n64(float (&d)[32], unsigned long long da, unsigned long long db, int scale_d) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
                 "}, %32, %33, p, 1, 1, %35, %35;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "l"(da), "l"(db), "r"(scale_d), "n"(TRANS));
}

// At head_dim 64 the consumers have the registers to hold their 64 rows of K and of V as A operands for the whole
// block, so S^T and dP^T read only Q and dO from shared memory: 32 KiB less per tile of the 208 the block moves
// through it (at 32K, 32/8 heads, the backward went from 406 to 426 TF/s). At 128 the accumulators of dK and dV
// leave no room.
#define B9_KV_REGS (HEAD_DIM == 64)

// Rows `row`, row + 8 of a [rows][64] bf16 sub-tile with the 128-byte swizzle (row & 7 == g) as the A operands of
// its 4 k-steps of 16 columns: the accumulator layout of to_a_operands.
__device__ __forceinline__ void load_a_operands(u32 (&a)[4][4], u32 tile, int row, int g, int t) {
#pragma unroll
    for (int kk = 0; kk < 4; kk++)
#pragma unroll
        for (int i = 0; i < 4; i++)
            a[kk][i] = lds32(tile + (row + 8 * (i & 1)) * 128 + (((2 * kk + (i >> 1)) ^ g) << 4) + 4 * t);
}

#if HEAD_DIM == 128
#define wgmma_dq wgmma_ss_n128<1>
#else
#define wgmma_dq wgmma_ss_n64<1>
#endif

// Writes of st.shared become visible to the async proxy (the wgmma operand reads) that follows a barrier.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// One arrival on bar once this thread's earlier cp.async copies have landed (counted in the barrier's init count).
__device__ __forceinline__ void cp_async_mbar_arrive(u32 bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}

// The bulk tensor copies out of shared memory (the dQ warp's): box (c0, c1, c2) of the tensor map written from, or
// added to from, shared memory at src; one bulk group per tile, waited on for its reads of shared memory (the buffer
// is free) and for its writes (the tile is in global memory).
__device__ __forceinline__ void tma_store_3d(const tmap_t *map, int c0, int c1, int c2, u32 src) {
    asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.tile.bulk_group [%0, {%1, %2, %3}], [%4];\n" ::"l"(map),
                 "r"(c0), "r"(c1), "r"(c2), "r"(src)
                 : "memory");
}
__device__ __forceinline__ void tma_add_3d(const tmap_t *map, int c0, int c1, int c2, u32 src) {
    asm volatile("cp.reduce.async.bulk.tensor.3d.global.shared::cta.add.tile.bulk_group [%0, {%1, %2, %3}], [%4];\n" ::"l"(
                     map),
                 "r"(c0), "r"(c1), "r"(c2), "r"(src)
                 : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }
__device__ __forceinline__ void bulk_wait_done() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }
// Orders the generic proxy's global accesses (the progress counters) with the TMA unit's (the dQ sums).
__device__ __forceinline__ void fence_proxy_async_global() { asm volatile("fence.proxy.async.global;\n" ::: "memory"); }

// The dQ warp's side of the progress counters. The successor of a block in the chain of dQ sums waits on this
// block's count, so each microsecond between our sums landing and the successor seeing it is paid once per link
// of the chain: a release store and an acquire poll with no sleep, not full fences and wait_progress's sleeps (at
// 32K, 32 heads, that took ordered sums from 9% behind atomic ones to level with them).
__device__ __forceinline__ void st_release(u32 *p, u32 v) {
    asm volatile("st.release.gpu.global.u32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}
// Until *p > it; returns the value seen.
__device__ __forceinline__ u32 poll_acquire(const u32 *p, u32 it) {
    u32 v;
    do {
        asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
    } while (v <= it);
    return v;
}

__device__ __forceinline__ void sts_f2(u32 addr, float x, float y) {
    asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(addr), "f"(x), "f"(y) : "memory");
}

__device__ __forceinline__ float2 lds_f2(u32 addr) {
    float2 v;
    asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(v.x), "=f"(v.y) : "r"(addr));
    return v;
}

// P^T = exp(scale S^T - lse) in place, for this thread's keys key, key + 8 (accumulator rows) and the tile's query
// rows row0 + 8 j + 2 t + e (columns; their lse at sl). EDGE: the tile crosses the diagonal or the end of the
// sequence (or a document's end); keys past the row (causal) or past the end, and rows past the end, get p = 0, and
// with documents the rows at or past de[r], the end of key + 8 r's document (b9_doc_end).
template <bool EDGE>
__device__ __forceinline__ void b9_probs(float (&st)[32], u32 sl, int key, int row0, int t
#if DOCS
                                         , const int (&de)[2]
#endif
) {
#pragma unroll
    for (int j = 0; j < 8; j++) {
        const float2 l = lds_f2(sl + (8 * j + 2 * t) * 4);
#pragma unroll
        for (int r = 0; r < 2; r++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                float p = ex2(fmaf(st[4 * j + 2 * r + e], SCALE_LOG2, -(e ? l.y : l.x) * LOG2E));
                if (EDGE) {
                    const int row = row0 + 8 * j + 2 * t + e, kk = key + 8 * r;
#if DOCS
                    if (row >= SEQ || kk >= SEQ || (CAUSAL && kk > row) || row >= de[r]) p = 0.f;
#else
                    if (row >= SEQ || kk >= SEQ || (CAUSAL && kk > row)) p = 0.f;
#endif
                }
                st[4 * j + 2 * r + e] = p;
            }
    }
}

#if DOCS
constexpr int B9_NM = (SEQ + B9_BM - 1) / B9_BM; // query tiles of the launch
// Document bounds of the backward (attention.cu, "Document masks"), in the form of key rows: key c is kept by the
// query rows r < doc_end[k_pos + c] - q_pos (and by the causal rule), the same set as c >= doc_start[q_pos + r] -
// k_pos. doc_end never decreases along the sequence, so a block's first key has its lowest bound and its last key
// the highest. Keys past the launch take the last key's bound: the bounds still grow with the key, and those keys are
// never stored.
__device__ __forceinline__ int b9_doc_end(const int *__restrict__ doc_end, int q_pos, int k_pos, int key) {
    return doc_end[k_pos + min(key, SEQ - 1)] - q_pos;
}
// The last query tile that keys up to `key` are kept by (-1: none; the launch's last when the document ends past it).
// A key block's query tiles run from its causal start to this tile of its last key; so do those of the block before
// it, with its own last key, which is how a block knows which of its tiles the block before has summed dQ into.
__device__ __forceinline__ int b9_last_qtile(const int *__restrict__ doc_end, int q_pos, int k_pos, int key) {
    const int hi = b9_doc_end(doc_end, q_pos, k_pos, key) - 1; // the last query row that keeps the key
    return hi < 0 ? -1 : min(hi / B9_BM, B9_NM - 1);
}
#endif

extern "C" __global__ void __launch_bounds__(B9_THREADS, 1)
attention_bwd_sm90_d{{HEAD_DIM}}_q{{Q_HEADS}}_kv{{KV_HEADS}}_s{{SEQ}}_c{{CAUSAL}}_a{{DKV_ACCUM}}_dqa{{DQ_ATOMIC}}{{DOCS_TAG}}(
    const __grid_constant__ tmap_t tm_q, const __grid_constant__ tmap_t tm_k, const __grid_constant__ tmap_t tm_v,
    const __grid_constant__ tmap_t tm_do, const __grid_constant__ tmap_t tm_dq, const float *__restrict__ lse,
    const float *__restrict__ delta, u32 *__restrict__ dq_prog, dkv_t *__restrict__ dk, dkv_t *__restrict__ dv
#if DOCS
    , const int *__restrict__ doc_start, const int *__restrict__ doc_end, int q_pos, int k_pos
#endif
) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ unsigned char hsmem[];
    const u32 base = (smem_addr(hsmem) + 1023u) & ~1023u; // the 128-byte swizzle repeats every 1024 bytes
    const u32 sK = base, sV = base + B9_OFF_V, sQ = base + B9_OFF_Q, sdO = base + B9_OFF_DO, sdS = base + B9_OFF_DS,
              sdQ = base + B9_OFF_DQ, sL = base + B9_OFF_L, bars = base + B9_OFF_BAR;
    auto q_full = [&](int s) { return bars + 8 * (1 + s); };
    auto q_empty = [&](int s) { return bars + 8 * (1 + B9_STAGES + s); };
    int kvh, kb; // the longest key blocks of each head first
    head_major_block(kvh, kb);
    const int tid = threadIdx.x, n0 = kb * B9_BN;
    constexpr int NM = (SEQ + B9_BM - 1) / B9_BM, NKB = (SEQ + B9_BN - 1) / B9_BN;
    const int m_first = CAUSAL ? n0 / B9_BM : 0; // query tiles before n0 see none of these keys when causal
    const int niters = GROUP * (NM - m_first);
    // The block's tiles are it_begin ... niters - 1 (numbered as in every key block, the last query tile first): all,
    // or with documents those of query tiles up to the last that its last key's document reaches; none when the
    // documents of its keys end before the launch's queries, or before its causal start (then it_begin = niters).
    // Every role takes them from here, so the Q, dO ring, the consumers and the dQ warp walk the same tiles; the ring
    // stages, dS^T and dQ buffers and the tile's owner count from it_begin (i = it - it_begin).
#if DOCS
    const int it_begin = min(GROUP * (NM - 1 - b9_last_qtile(doc_end, q_pos, k_pos, min(n0 + B9_BN, SEQ) - 1)), niters);
#else
    constexpr int it_begin = 0;
#endif
    // iteration it's query head and first row (the same tile at the same it in every key block: see bwd)
    auto tile_of = [&](int it, int &h, int &m0) {
        const int mi = it / GROUP;
        h = kvh * GROUP + it - mi * GROUP;
        m0 = (NM - 1 - mi) * B9_BM;
    };
    if (tid == 0) {
        mbar_init(bars, 1);
        for (int s = 0; s < B9_STAGES; s++) {
            mbar_init(q_full(s), 1 + 32); // the producer's expect_tx arrival + one cp.async arrival per lane
            mbar_init(q_empty(s), 8);     // one arrival per consumer warp
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (tid < 128) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n");
        const int lane = tid & 31;
        if (tid < 32) {
            // producer warp 0 streams the tiles (lane 0 the TMA copies, every lane a row of lse and delta)
            if (lane == 0 && (!DOCS || it_begin < niters)) { // with documents, a block with no tile loads nothing
                mbar_expect_tx(bars, 2 * H_TILE);
#pragma unroll
                for (int c = 0; c < HSUB; c++) {
                    tma_load_3d(sK + c * H_SUBTILE, &tm_k, 64 * c, kvh, n0, bars);
                    tma_load_3d(sV + c * H_SUBTILE, &tm_v, 64 * c, kvh, n0, bars);
                }
            }
            for (int it = it_begin; it < niters; it++) {
                const int i = it - it_begin, s = i % B9_STAGES;
                int h, m0;
                tile_of(it, h, m0);
                if (i >= B9_STAGES) mbar_wait(q_empty(s), ((i / B9_STAGES) & 1) ^ 1);
                if (lane == 0) {
                    mbar_expect_tx(q_full(s), 2 * B9_QTILE);
#pragma unroll
                    for (int c = 0; c < HSUB; c++) {
                        tma_load_3d(sQ + s * B9_QTILE + c * B9_QSUB, &tm_q, 64 * c, h, m0, q_full(s));
                        tma_load_3d(sdO + s * B9_QTILE + c * B9_QSUB, &tm_do, 64 * c, h, m0, q_full(s));
                    }
                }
                const u32 sl = sL + s * 2 * B9_BM * 4;
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    const int r = lane + 32 * i, row = m0 + r;
                    const bool ok = row < SEQ;
                    cp_async4(sl + r * 4, lse + (long long)h * LSE_STRIDE + (ok ? row : 0), ok);
                    cp_async4(sl + (B9_BM + r) * 4, delta + (long long)(ok ? row : 0) * Q_HEADS + h, ok);
                }
                cp_async_mbar_arrive(q_full(s));
            }
            cp_async_wait_all();
        } else if (tid < 64) {
            // producer warp 1 writes dQ (lane 0 the TMA and the progress counters); both buffers start empty
            const bool ordered = !DQ_ATOMIC, publish = ordered && kb + 1 < NKB;
            u32 *const prog = dq_prog + kvh * NKB + kb;
            u32 seen = 0; // the previous key block's count as last read
#if DOCS
            // Ordered, a tile's first dQ is stored and the others added, in key-block order. The key blocks that visit a
            // query tile are consecutive (the causal start grows with the block, and so does the last query tile:
            // doc_end never decreases), so this block's dQ of tile it comes first when the block before does not visit
            // it: it < it_add, the first tile of that block (its tiles end no earlier than ours). Those it stores without
            // waiting; from it_add on it waits for the block before, as without documents. The block before publishes
            // its count after each of its own tiles, and this block waits only on those, so nothing waits for a tile
            // that its predecessor skips.
            const int it_add = kb == 0 ? GROUP * NM : GROUP * (NM - 1 - b9_last_qtile(doc_end, q_pos, k_pos, n0 - 1));
#endif
            bar_arrive(B9_BAR_DQE, B9_DQ_THREADS);
            bar_arrive(B9_BAR_DQE + 1, B9_DQ_THREADS);
            for (int it = it_begin; it < niters; it++) {
                const int b = (it - it_begin) & 1;
                int h, m0;
                tile_of(it, h, m0);
                bar_sync(B9_BAR_DQF + b, B9_DQ_THREADS);
                if (lane == 0) {
#if DOCS
                    if (ordered && it >= it_add && seen <= (u32)it) {
#else
                    if (ordered && n0 > 0 && seen <= (u32)it) {
#endif
                        // the previous key block has completed this tile: its sums come before ours
                        seen = poll_acquire(prog - 1, (u32)it);
                        fence_proxy_async_global();
                    }
#pragma unroll
                    for (int c = 0; c < HEAD_DIM / 32; c++) {
                        const u32 src = sdQ + b * B9_DQ + c * B9_DQSUB;
#if DOCS
                        if (ordered && it < it_add) tma_store_3d(&tm_dq, 32 * c, h, m0, src);
#else
                        if (ordered && n0 == 0) tma_store_3d(&tm_dq, 32 * c, h, m0, src);
#endif
                        else tma_add_3d(&tm_dq, 32 * c, h, m0, src);
                    }
                    bulk_commit();
                    bulk_wait_read();
                }
                __syncwarp();
                bar_arrive(B9_BAR_DQE + b, B9_DQ_THREADS);
                if (lane == 0 && publish) {
                    bulk_wait_done(); // this tile's sums are in global memory
                    fence_proxy_async_global();
                    st_release(prog, (u32)it + 1);
                }
            }
            if (lane == 0) bulk_wait_done();
#if DOCS && !DQ_ATOMIC && !CAUSAL
            // Ordered, dq_ws is not zeroed before the backward: its every row is written here, and bwd_dq reads them
            // all. Without a mask every query tile is some key block's; causal, with documents, every tile is still
            // its diagonal key block's (q_pos = k_pos: a key's document reaches at least the key itself). Without the
            // causal rule the tiles past the last key's document (a ring's half block, say, whose queries lie wholly
            // in later documents) are no block's: their rows keep no key and their dQ is 0. The key blocks of the head
            // share them, tiles kb, kb + NKB, ...; this warp writes them as TMA stores of zeros from its buffer 0, free
            // now (every tile's dQ has left it: the waits above, and the consumers' last write came before the last
            // "full" this warp waited for).
            const int nz = GROUP * (NM - 1 - b9_last_qtile(doc_end, q_pos, k_pos, SEQ - 1));
            if (kb < nz) {
                for (int i = lane; i < (int)(B9_DQSUB / 16); i += 32)
                    asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(sdQ + 16 * i), "r"(0u) : "memory");
                fence_proxy_async(); // the zeros, visible to the TMA unit's reads
                __syncwarp();
                if (lane == 0) {
                    for (int u = kb; u < nz; u += NKB) {
                        int h, m0;
                        tile_of(u, h, m0);
#pragma unroll
                        for (int c = 0; c < HEAD_DIM / 32; c++) tma_store_3d(&tm_dq, 32 * c, h, m0, sdQ);
                    }
                    bulk_commit();
                    bulk_wait_done();
                }
            }
#endif
        }
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n");

    // ---- consumer warpgroup cw: keys n0 + 64 cw ... ----
    const int cw = warpgroup_uniform() - 1, wt = tid & 127, warp = wt >> 5, lane = wt & 31, g = lane >> 2, t = lane & 3;
    const int kl = cw * 64 + warp * 16 + g; // this thread's keys kl and kl + 8 of the block (accumulator rows)
#if DOCS
    // the rows that keep this thread's keys end before de[r] (b9_doc_end); those of the warp's first key, the lowest
    // bound of its keys (lane 0 holds it), before de_warp: a tile whose last row is before that lies wholly in the
    // documents of the warp's keys and needs no document mask
    const int de[2] = {b9_doc_end(doc_end, q_pos, k_pos, n0 + kl), b9_doc_end(doc_end, q_pos, k_pos, n0 + kl + 8)};
    const int de_warp = __shfl_sync(0xffffffffu, de[0], 0);
#endif

    float dva[HEAD_DIM / 2], dka[HEAD_DIM / 2];
#pragma unroll
    for (int i = 0; i < HEAD_DIM / 2; i++) dva[i] = 0.f, dka[i] = 0.f;
    const u32 ka = sK + cw * 64 * 128, va = sV + cw * 64 * 128; // this warpgroup's 64 rows of each K, V sub-tile
    // shared-memory descriptors (desc_*): K read transposed as dQ's B; this warpgroup's rows of K, V (S^T, dP^T)
    const unsigned long long desc_k_cols = sw128_desc(sK, H_SUBTILE, 1024);
#if !B9_KV_REGS
    const unsigned long long desc_k_rows = sw128_desc(ka, 16, 1024), desc_v_rows = sw128_desc(va, 16, 1024);
#endif

    if (!DOCS || it_begin < niters) mbar_wait(bars, 0); // K, V (a block with no tile has none to wait for)
#if B9_KV_REGS
    u32 kreg[4][4], vreg[4][4];
    load_a_operands(kreg, ka, warp * 16 + g, g, t);
    load_a_operands(vreg, va, warp * 16 + g, g, t);
#endif
    // dS^T buffer cw is free for the other's half of the block's tile cw
    if (cw < niters - it_begin) bar_arrive(B9_BAR_DSE + cw, 256);
    for (int it = it_begin; it < niters; it++) {
        const int i = it - it_begin, s = i % B9_STAGES, m0 = (NM - 1 - it / GROUP) * B9_BM;
        const u32 q = sQ + s * B9_QTILE, d_o = sdO + s * B9_QTILE, sl = sL + s * 2 * B9_BM * 4;
        const u32 ds = sdS + (i & 1) * B9_DS;
        // Q and dO K-major (S^T, dP^T) and N-major (dV, dK); dS^T M-major (dQ)
        const unsigned long long desc_q_k = sw128_desc(q, 16, 1024), desc_do_k = sw128_desc(d_o, 16, 1024),
                                 desc_q_n = sw128_desc(q, B9_QSUB, 1024), desc_do_n = sw128_desc(d_o, B9_QSUB, 1024),
                                 desc_ds = sw128_desc(ds, 2048, 1024);
        mbar_wait(q_full(s), (i / B9_STAGES) & 1);

        // ---- S^T = K Q^T, dP^T = V dO^T ----
        float st[32], dpt[32];
        wg_fence();
#if B9_KV_REGS
#pragma unroll
        for (int ks = 0; ks < 4; ks++) wgmma_rs_n64<0>(st, kreg[ks], desc_plus(desc_q_k, ks * 32), ks > 0);
        wg_commit();
#pragma unroll
        for (int ks = 0; ks < 4; ks++) wgmma_rs_n64<0>(dpt, vreg[ks], desc_plus(desc_do_k, ks * 32), ks > 0);
        wg_commit();
#else
#pragma unroll
        for (int ks = 0; ks < HEAD_DIM / 16; ks++) {
            const u32 ko = (ks >> 2) * H_SUBTILE + (ks & 3) * 32, qo = (ks >> 2) * B9_QSUB + (ks & 3) * 32;
            wgmma_ss_n64<0>(st, desc_plus(desc_k_rows, ko), desc_plus(desc_q_k, qo), ks > 0);
        }
        wg_commit();
#pragma unroll
        for (int ks = 0; ks < HEAD_DIM / 16; ks++) {
            const u32 ko = (ks >> 2) * H_SUBTILE + (ks & 3) * 32, qo = (ks >> 2) * B9_QSUB + (ks & 3) * 32;
            wgmma_ss_n64<0>(dpt, desc_plus(desc_v_rows, ko), desc_plus(desc_do_k, qo), ks > 0);
        }
        wg_commit();
#endif

        // ---- P^T while dP^T runs; then dV += P^T dO ----
        wg_wait<1>();
        reg_fence(st);
#if DOCS
        if (m0 + B9_BM > SEQ || n0 + B9_BN > SEQ || (CAUSAL && n0 + B9_BN - 1 > m0) || m0 + B9_BM > de_warp)
            b9_probs<true>(st, sl, n0 + kl, m0, t, de);
        else
            b9_probs<false>(st, sl, n0 + kl, m0, t, de);
#else
        if (m0 + B9_BM > SEQ || n0 + B9_BN > SEQ || (CAUSAL && n0 + B9_BN - 1 > m0))
            b9_probs<true>(st, sl, n0 + kl, m0, t);
        else
            b9_probs<false>(st, sl, n0 + kl, m0, t);
#endif
        u32 pa[4][4];
        to_a_operands(pa, st);
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < 4; kk++) wgmma_pv(dva, pa[kk], desc_plus(desc_do_n, kk * 2048));
        wg_commit();

        // ---- dS^T and its store to shared memory while dV runs ----
        wg_wait<1>();
        reg_fence(dpt);
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const float2 d = lds_f2(sl + (B9_BM + 8 * j + 2 * t) * 4);
#pragma unroll
            for (int r = 0; r < 2; r++) {
                dpt[4 * j + 2 * r] = st[4 * j + 2 * r] * (dpt[4 * j + 2 * r] - d.x);
                dpt[4 * j + 2 * r + 1] = st[4 * j + 2 * r + 1] * (dpt[4 * j + 2 * r + 1] - d.y);
            }
        }
        u32 dsa[4][4];
        to_a_operands(dsa, dpt);
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < 4; kk++) wgmma_pv(dka, dsa[kk], desc_plus(desc_q_n, kk * 2048)); // dK += dS^T Q
        wg_commit();

        // ---- dS^T to shared memory while dK runs; the tile's owner then computes its dQ ----
        const int b = i & 1;
        const bool own = b == cw;
        if (!own) bar_sync(B9_BAR_DSE + b, 256); // the owner's dQ of two tiles ago has read this buffer
        // row kl (+ 8), columns 8 j + 2 t, + 1; chunk j of row kl at j ^ (kl & 7)
#pragma unroll
        for (int kk = 0; kk < 4; kk++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int j = 2 * kk + (i >> 1), r = i & 1;
                sts32(ds + (kl + 8 * r) * 128 + ((j ^ g) << 4) + 4 * t, dsa[kk][i]);
            }
        fence_proxy_async();
        if (!own) {
            bar_arrive(B9_BAR_DSF + b, 256);
            wg_wait<0>(); // dK is in: the stage's Q, dO, lse, delta are free
            if (lane == 0) mbar_arrive(q_empty(s));
            continue;
        }
        bar_sync(B9_BAR_DSF + b, 256); // the other half of dS^T is in
        wg_wait<0>(); // dK is in: the stage is free, and so are dsa's registers for dq
        if (lane == 0) mbar_arrive(q_empty(s));

        // ---- dQ = dS K: the tile's 64 rows, all HEAD_DIM columns, over the 128 keys ----
        float dq[HEAD_DIM / 2];
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < B9_BN / 16; kk++)
            wgmma_dq(dq, desc_plus(desc_ds, kk * 2048), desc_plus(desc_k_cols, kk * 2048), kk > 0);
        wg_commit();
        wg_wait<0>();
        reg_fence(dq);
        if (it + 2 < niters) bar_arrive(B9_BAR_DSE + b, 256); // the other may write its half of tile it + 2 here

        // ---- dQ to the dQ warp's buffer: row 16 warp + g (+ 8), columns 8 j + 2 t, in sub-tiles of 32 columns
        //      with the 128-byte swizzle (16-byte chunk c of row r at c ^ (r & 7)) ----
        const u32 dqb = sdQ + b * B9_DQ;
        bar_sync(B9_BAR_DQE + b, B9_DQ_THREADS);
#pragma unroll
        for (int j = 0; j < HEAD_DIM / 8; j++) {
            const int col = 8 * j, chunk = ((col & 31) >> 2) + (t >> 1);
#pragma unroll
            for (int r = 0; r < 2; r++)
                sts_f2(dqb + (col >> 5) * B9_DQSUB + (warp * 16 + g + 8 * r) * 128 + ((chunk ^ g) << 4) + 8 * (t & 1),
                       dq[4 * j + 2 * r], dq[4 * j + 2 * r + 1]);
        }
        fence_proxy_async();
        bar_arrive(B9_BAR_DQF + b, B9_DQ_THREADS);
    }

    // dK carries the softmax scale that S = scale q k^T puts on it; dV does not
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int key = n0 + kl + 8 * r;
        if (key >= SEQ) continue;
        const long long o = ((long long)key * KV_HEADS + kvh) * HEAD_DIM + 2 * t;
#pragma unroll
        for (int j = 0; j < HEAD_DIM / 8; j++) {
            const float k0 = dka[4 * j + 2 * r] * SOFTMAX_SCALE, k1 = dka[4 * j + 2 * r + 1] * SOFTMAX_SCALE;
            const float v0 = dva[4 * j + 2 * r], v1 = dva[4 * j + 2 * r + 1];
#if DKV_ACCUM
            float2 *pk = (float2 *)(dk + o + 8 * j), *pv = (float2 *)(dv + o + 8 * j);
            float2 x = *pk, y = *pv;
            x.x += k0, x.y += k1, y.x += v0, y.y += v1;
            *pk = x, *pv = y;
#else
            *(u32 *)(dk + o + 8 * j) = pack_bf16(k0, k1);
            *(u32 *)(dv + o + 8 * j) = pack_bf16(v0, v1);
#endif
        }
    }
#else
    __trap();
#endif
}

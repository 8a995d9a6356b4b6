// attention_sm90.cuh: the attention forward for Hopper (sm_90a), included into attention.cu (whose macros and
// helpers it uses: HEAD_DIM, Q_HEADS, KV_HEADS, SEQ, CAUSAL, GROUP, SOFTMAX_SCALE, SCALE_LOG2, bf16, u32,
// smem_addr, pack_bf16, ex2, NEG_INF) and sm90.cuh (mbarriers, TMA, wgmma descriptors and fences). On other targets
// its entry traps: the runtime calls it on sm_90a alone.
//
// The FlashAttention-3 structure. One producer warp streams Q once and the K, V tiles through a ring of
// shared-memory stages with the tensor memory accelerator (cp.async.bulk.tensor; each stage's arrival counted in
// bytes on an mbarrier, its release by the consumers on another). Two consumer warpgroups of 64 query rows each
// (three at head_dim 64) compute S = Q K^T with wgmma from shared memory and O += P V with P from registers. The
// consumers take turns issuing their products (a ring of named barriers), so one's softmax runs while another's
// products occupy the tensor cores; within a consumer, the scores of tile i are computed while P V of tile i - 1
// runs. setmaxnreg moves registers from the producer warpgroup to the consumers.
//
// Shared-memory tiles are the TMA boxes: [128 rows][64 columns] bf16 with the 128-byte swizzle (16-byte chunk c of
// row r at chunk c ^ (r & 7)); a row of HEAD_DIM = 128 is two such sub-tiles. The wgmma descriptors read them
// K-major for Q and K (8-row groups 1024 bytes apart; a k-step of 16 columns is 32 bytes into the swizzled row)
// and N-major for V (the same layout read transposed: k-steps of 16 keys are 2048 bytes apart, 64-column
// sub-tiles one sub-tile apart).
//
// Entry (geometry in gen/kernels_attn.c, which must match H_CONSUMERS, HBM, HBN, HSTAGES and H_SMEM):
//   fwd_sm90(tm_q, tm_k, tm_v, o, lse)   grid (Q_HEADS, ceil(SEQ/HBM)), HTHREADS threads, H_SMEM bytes dynamic smem
//   (the block's head and query tile come from its place in the launch order: head_major_block);
//   tm_q, tm_k, tm_v: tensor maps of q, k, v as (HEAD_DIM, heads, SEQ) bf16 with boxes (64, 1, 128) and the
//   128-byte swizzle (runtime/tma.h); o, lse as in attention.cu.
//   With DOCS = 1: fwd_sm90(tm_q, tm_k, tm_v, o, lse, doc_start, doc_end, q_pos, k_pos) (doc_end unused here).
//
// Document masks (DOCS = 1; the contract is attention.cu's, "Document masks"). Row r keeps key c when c >=
// doc_start[q_pos + r] - k_pos (and the causal rule keeps it); doc_start never decreases along the sequence, so no
// row of a block keeps a key before its first row's bound. A block computes the key tiles from the one holding that
// bound to the causal end (still the last first), and no others: the count is computed once at the entry, where
// producer and consumers both take it, so the TMA ring loads exactly the tiles the consumers compute and the ring of
// turns stays whole; a block with no tile (its documents start past all of the launch's keys) loads nothing, not even
// Q, and its consumers only store. Every tile of that range keeps some score. A warp masks a tile when it crosses the
// diagonal or the end as before, or a document start of one of the warp's rows (the tile begins before the warp's
// last row's bound); the others are computed without masks, as without documents. A row that keeps no key (possible
// without the causal rule: a ring's half block whose queries lie in later documents than all its keys) keeps max -inf
// and sum 0 through the softmax's guard (P = 0, never -inf - -inf), and stores o = 0 and lse = -inf. With DOCS = 0
// the code is what it was (the same SASS).

// Consumer warpgroups of 64 query rows: two, or three at head_dim 64, where a tile's exponentials take as long as its
// products and a third warpgroup's softmax fills the MUFU while the other two wait on theirs.
#define H_CONSUMERS {{FWD_CONSUMERS}}
#define HBM (64 * H_CONSUMERS)             // query rows per block
#define HBN 128                            // keys per K, V tile
#define HQBOX ((HBM + 127) / 128)          // 128-row boxes of Q (rows past the block's are loaded and not read)
#define HSUB (HEAD_DIM / 64)               // 64-column sub-tiles of a row
#define HSTAGES {{FWD_STAGES}}             // depth of the K, V ring: a variant the generator picks (kernels_attn.c)
#define HTHREADS (128 * (1 + H_CONSUMERS))
#define H_TURN0 1                          // named barriers 1 ...: consumer 0's, 1's ... turn to issue products
static_assert(H_CONSUMERS == 2 || (H_CONSUMERS == 3 && HEAD_DIM == 64), "two consumers, or three at head_dim 64");

constexpr u32 H_SUBTILE = 128 * 128;                      // bytes of one [128][64] bf16 sub-tile
constexpr u32 H_TILE = HSUB * H_SUBTILE;                  // one Q box, K or V tile
constexpr u32 H_OFF_K = HQBOX * H_TILE, H_OFF_V = H_OFF_K + HSTAGES * H_TILE, H_OFF_BAR = H_OFF_V + HSTAGES * H_TILE;
constexpr u32 H_SMEM = H_OFF_BAR + 8 * (1 + 4 * HSTAGES) + 1024; // + the slack to align the base to 1024
static_assert(H_SMEM <= 227 * 1024, "the K, V ring does not fit the 227 KiB of shared memory a block may have");


// The block's head and tile from its place in the launch order, the order in which blocks start (blockIdx.x
// fastest): head-major, so that the blocks running at once are many tiles of one head, which stream the same K, V
// tiles (the forward) or the same Q, dO tiles and dQ rows (the backward) at about the same time, and one read from
// memory serves them all through L2. With the head as the fastest index, the blocks of every head ran at once and
// each read its tiles from memory alone: the backward at 32K, 32 heads, moved 191 GB through DRAM, head-major 3 GB.
__device__ __forceinline__ void head_major_block(int &head, int &tile) {
    const int lin = blockIdx.x + gridDim.x * blockIdx.y;
    head = lin / gridDim.y;
    tile = lin - head * gridDim.y;
}

// ---- PTX: wgmma (the rest: sm90.cuh) ----

// d (64 x 128, f32) = (scale_d ? d : 0) + A B, both operands in shared memory: A (64 x 16) and B (128 x 16) K-major
// (TRANS = 0), or A M-major and B (16 x 128) N-major (TRANS = 1).
template <int TRANS = 0>
__device__ __forceinline__ void wgmma_ss_n128(float (&d)[64], unsigned long long da, unsigned long long db, int scale_d) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
                 "}, %64, %65, p, 1, 1, %67, %67;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
                   "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
                   "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
                   "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
                   "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "l"(da), "l"(db), "r"(scale_d), "n"(TRANS));
}

// d (64 x 128, f32) += A B: A (64 x 16) from registers, B (16 x 128) N-major in shared memory (imm-trans-b = 1).
__device__ __forceinline__ void wgmma_rs_n128(float (&d)[64], const u32 (&a)[4], unsigned long long db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
                 "}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
                   "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
                   "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
                   "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
                   "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}

// d (64 x 64, f32) = (scale_d ? d : 0) + A B: A (64 x 16) from registers, B in shared memory (16 x 64) N-major
// (TRANS_B = 1, the default: P V) or (64 x 16) K-major (TRANS_B = 0).
template <int TRANS_B = 1>
__device__ __forceinline__ void wgmma_rs_n64(float (&d)[32], const u32 (&a)[4], unsigned long long db, int scale_d = 1) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
                 "}, {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d), "n"(TRANS_B));
}

#if HEAD_DIM == 128
#define wgmma_pv wgmma_rs_n128
#else
#define wgmma_pv wgmma_rs_n64
#endif

// Accumulator layout of a 64 x N wgmma in a warpgroup: warp w, lane (g = lane / 4, t = lane % 4) holds rows
// 16 w + g + 8 r (r = 0, 1) and columns 8 j + 2 t + e (e = 0, 1) as element 4 j + 2 r + e.

// Online softmax of one tile of scores in place: sc becomes P = exp(scale (S - max)) (fp32), alpha the factors that
// rescale this thread's rows of O and of the running sums.
__device__ __forceinline__ void softmax_tile(float (&sc)[HBN / 2], float (&mrow)[2], float (&lrow)[2], float (&alpha)[2]) {
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float mx = mrow[r];
#pragma unroll
        for (int j = 0; j < HBN / 8; j++) mx = fmaxf(mx, fmaxf(sc[4 * j + 2 * r], sc[4 * j + 2 * r + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        // a block taller than a tile has rows whose first tiles are all masked, and with documents a row may keep no
        // key at all: their max stays -inf, and P 0 (exp2(-inf - 0), where -inf - -inf would give NaN)
        const float ms = (HBM > HBN || DOCS) && mx == NEG_INF ? 0.f : mx * SCALE_LOG2;
        alpha[r] = ex2(mrow[r] * SCALE_LOG2 - ms); // 0 on the first tile (mrow = -inf)
        mrow[r] = mx;
        float sum = 0.f;
#pragma unroll
        for (int j = 0; j < HBN / 8; j++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const float p = ex2(fmaf(sc[4 * j + 2 * r + e], SCALE_LOG2, -ms));
                sc[4 * j + 2 * r + e] = p;
                sum += p;
            }
        lrow[r] = lrow[r] * alpha[r] + sum;
    }
}

// An accumulator's 16 KS columns as the A operands (bf16, from registers) of the KS k-steps of 16 of a product, e.g.
// P of O += P V: the accumulator's layout is the A fragment's, column pairs packed as they stand.
template <int KS> __device__ __forceinline__ void to_a_operands(u32 (&a)[KS][4], const float (&x)[8 * KS]) {
#pragma unroll
    for (int kk = 0; kk < KS; kk++)
#pragma unroll
        for (int i = 0; i < 4; i++) a[kk][i] = pack_bf16(x[8 * kk + 2 * i], x[8 * kk + 2 * i + 1]);
}

#if DOCS
// Document bounds of the forward (attention.cu, "Document masks"): query row r keeps key c when c >= doc_start[q_pos +
// r] - k_pos (and the causal rule keeps it). doc_start never decreases along the sequence (documents are runs of
// positions), so a block's first row has its lowest bound and its last row the highest. Rows past the launch take
// the last row's bound: the bounds still grow with the row, and those rows are never stored.
__device__ __forceinline__ int fwd_doc_lo(const int *__restrict__ doc_start, int q_pos, int k_pos, int row) {
    return doc_start[q_pos + min(row, SEQ - 1)] - k_pos;
}
// The first key tile of the block whose first row is m0: the tile holding its first row's first kept key (0 when the
// document starts before the launch's keys; NT or more when after them all, and the block computes no tile).
__device__ __forceinline__ int fwd_first_key_tile(const int *__restrict__ doc_start, int q_pos, int k_pos, int m0) {
    const int lo = fwd_doc_lo(doc_start, q_pos, k_pos, m0);
    return lo <= 0 ? 0 : lo / HBN;
}
#endif

// The consumers take turns issuing products, in a ring: a turn begins when the consumer before ended its previous
// one. Consumer 0 has the first turn; the last consumer skips its last end, which no turn of consumer 0 would wait
// for.
__device__ __forceinline__ void turn_begin(int cw) { bar_sync(H_TURN0 + cw, 256); }
__device__ __forceinline__ void turn_end(int cw, bool last) {
    if (cw < H_CONSUMERS - 1 || !last) bar_arrive(H_TURN0 + (cw + 1) % H_CONSUMERS, 256);
}

// A consumer warpgroup's work: rows m0 + cw * 64 ... of head h against ntiles key tiles, last tile first: key tiles
// nt_end - 1 down to nt_end - ntiles (ntiles = nt_end without documents).
// Pipelined within the warpgroup as well: the scores of tile i are computed while P V of tile i - 1 runs. The softmax
// of tile i overlaps the other consumers' turns; the compiler waits for P V of tile i - 1 before its exponentials, and
// keeping that wait below them gained nothing (docs/PERF.md, "three consumers").
__device__ __forceinline__ void fwd_sm90_consumer(u32 sQ, u32 sK, u32 sV, u32 bars, int cw, int h, int m0, int nt_end,
                                                  int ntiles, bf16 *__restrict__ o, float *__restrict__ lse
#if DOCS
                                                  , const int *__restrict__ doc_start, int q_pos, int k_pos
#endif
) {
    const int wt = threadIdx.x & 127, warp = wt >> 5, lane = wt & 31, g = lane >> 2, t = lane & 3;
    const int r0 = m0 + cw * 64 + warp * 16 + g; // this thread's rows r0 and r0 + 8
    float acc[HEAD_DIM / 2];
#pragma unroll
    for (int i = 0; i < HEAD_DIM / 2; i++) acc[i] = 0.f;
    float mrow[2] = {NEG_INF, NEG_INF}, lrow[2] = {0.f, 0.f}; // running max (unscaled) and this thread's partial sum
    float sc[HBN / 2], alpha[2];
    u32 pa[HBN / 16][4];
    // barriers of ring stage s: k_full, v_full, k_empty, v_empty
    auto k_full = [&](int s) { return bars + 8 * (1 + s); };
    auto v_full = [&](int s) { return bars + 8 * (1 + HSTAGES + s); };
    auto k_empty = [&](int s) { return bars + 8 * (1 + 2 * HSTAGES + s); };
    auto v_empty = [&](int s) { return bars + 8 * (1 + 3 * HSTAGES + s); };
    const unsigned long long desc_q = sw128_desc(sQ + cw * 64 * 128, 16, 1024); // this warpgroup's 64 rows of Q
    auto issue_s = [&](int s) { // S = Q K^T of the tile in stage s
        const unsigned long long desc_k = sw128_desc(sK + s * H_TILE, 16, 1024);
#pragma unroll
        for (int ks = 0; ks < HEAD_DIM / 16; ks++) {
            const u32 off = (ks >> 2) * H_SUBTILE + (ks & 3) * 32;
            wgmma_ss_n128(sc, desc_plus(desc_q, off), desc_plus(desc_k, off), ks > 0);
        }
        wg_commit();
    };
    auto issue_pv = [&](int s) { // O += P V of the tile in stage s
        const unsigned long long desc_v = sw128_desc(sV + s * H_TILE, H_SUBTILE, 1024);
#pragma unroll
        for (int kk = 0; kk < HBN / 16; kk++) wgmma_pv(acc, pa[kk], desc_plus(desc_v, kk * 2048));
        wg_commit();
    };

    // keys past the row (causal) or past the end: the first n_masked tiles, last key tile first; one when query and key
    // tiles are equal, two for a block of 192 rows
    const int n_masked = CAUSAL ? nt_end - m0 / HBN : SEQ % HBN != 0;
#if DOCS
    // The first key each of this thread's rows keeps (fwd_doc_lo), and the highest of the warp's rows (lane 31 holds
    // its last row; doc_start only grows): a tile whose first key is at or past it lies wholly in the documents of
    // the warp's rows and needs no document mask; the tiles before it cross a document start, and are masked.
    const int lo[2] = {fwd_doc_lo(doc_start, q_pos, k_pos, r0), fwd_doc_lo(doc_start, q_pos, k_pos, r0 + 8)};
    const int lo_warp = __shfl_sync(0xffffffffu, lo[1], 31);
    auto doc_cross = [&](int it) { return (nt_end - 1 - it) * HBN < lo_warp; };
#endif
    auto mask_tile = [&](int it) {
        const int n0 = (nt_end - 1 - it) * HBN;
#pragma unroll
        for (int j = 0; j < HBN / 8; j++)
#pragma unroll
            for (int r = 0; r < 2; r++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int key = n0 + 8 * j + 2 * t + e;
#if DOCS
                    if (key >= SEQ || (CAUSAL && key > r0 + 8 * r) || key < lo[r]) sc[4 * j + 2 * r + e] = NEG_INF;
#else
                    if (key >= SEQ || (CAUSAL && key > r0 + 8 * r)) sc[4 * j + 2 * r + e] = NEG_INF;
#endif
                }
    };

#if DOCS
    // no key tile (every row's document starts past the launch's keys): no turn, no Q; the rows are written as rows
    // that kept no key, o = 0 and lse = -inf. ntiles is the block's, so all consumers skip alike and the ring of turns
    // stays whole.
    if (ntiles == 0) goto store;
#endif
    if (cw == H_CONSUMERS - 1) bar_arrive(H_TURN0, 256); // consumer 0 has the first turn
    mbar_wait(bars, 0);                                  // Q

    // ---- tile 0 (the last key tile): scores, mask, softmax ----
    mbar_wait(k_full(0), 0);
    turn_begin(cw);
    wg_fence();
    issue_s(0);
    turn_end(cw, false);
    wg_wait<0>();
    reg_fence(sc);
    if (lane == 0) mbar_arrive(k_empty(0)); // this warp is done with K
#if DOCS
    if (CAUSAL || SEQ % HBN != 0 || doc_cross(0)) mask_tile(0);
#else
    if (CAUSAL || SEQ % HBN != 0) mask_tile(0);
#endif
    softmax_tile(sc, mrow, lrow, alpha);
    to_a_operands(pa, sc);

    // ---- tiles 1 ...: S of tile it and P V of tile it - 1 in one turn ----
    for (int it = 1; it < ntiles; it++) {
        const int s = it % HSTAGES, sp = (it - 1) % HSTAGES;
        mbar_wait(k_full(s), (it / HSTAGES) & 1);
        turn_begin(cw);
        wg_fence();
        issue_s(s);
        mbar_wait(v_full(sp), ((it - 1) / HSTAGES) & 1);
        issue_pv(sp);
        turn_end(cw, false);
        wg_wait<1>(); // the scores are in
        reg_fence(sc);
        if (lane == 0) mbar_arrive(k_empty(s));
#if DOCS
        if ((HBM > HBN && CAUSAL && it < n_masked) || doc_cross(it)) mask_tile(it);
#else
        if (HBM > HBN && CAUSAL && it < n_masked) mask_tile(it);
#endif
        softmax_tile(sc, mrow, lrow, alpha);
        wg_wait<0>(); // P V of the previous tile is in: its P registers and V stage are free
        reg_fence(acc);
        if (lane == 0) mbar_arrive(v_empty(sp));
#pragma unroll
        for (int j = 0; j < HEAD_DIM / 8; j++) {
            acc[4 * j + 0] *= alpha[0], acc[4 * j + 1] *= alpha[0];
            acc[4 * j + 2] *= alpha[1], acc[4 * j + 3] *= alpha[1];
        }
        to_a_operands(pa, sc);
    }

    // ---- P V of the last tile ----
    {
        const int sp = (ntiles - 1) % HSTAGES;
        mbar_wait(v_full(sp), ((ntiles - 1) / HSTAGES) & 1);
        turn_begin(cw);
        wg_fence();
        issue_pv(sp);
        turn_end(cw, true);
        wg_wait<0>();
        reg_fence(acc);
        if (lane == 0) mbar_arrive(v_empty(sp));
    }

    // ---- normalise; O and the log-sum-exp ----
#if DOCS
store:
#endif
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float l = lrow[r];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
#if DOCS
        // a row that kept no key has l = 0 and acc = 0: o = 0 (not 0 / 0), lse = -inf * scale + log 0 = -inf
        const float inv = l > 0.f ? 1.f / l : 0.f;
#else
        const float inv = 1.f / l;
#endif
        const int row = r0 + 8 * r;
        if (row < SEQ) {
            bf16 *dst = o + ((long long)row * Q_HEADS + h) * HEAD_DIM + 2 * t;
#pragma unroll
            for (int j = 0; j < HEAD_DIM / 8; j++)
                *(u32 *)(dst + 8 * j) = pack_bf16(acc[4 * j + 2 * r] * inv, acc[4 * j + 2 * r + 1] * inv);
            if (t == 0) lse[(long long)h * LSE_STRIDE + row] = mrow[r] * SOFTMAX_SCALE + logf(l);
        }
    }
}

extern "C" __global__ void __launch_bounds__(HTHREADS, 1)
attention_fwd_sm90_d{{HEAD_DIM}}_q{{Q_HEADS}}_kv{{KV_HEADS}}_s{{SEQ}}_c{{CAUSAL}}_a{{DKV_ACCUM}}_dqa{{DQ_ATOMIC}}{{DOCS_TAG}}(
    const __grid_constant__ tmap_t tm_q, const __grid_constant__ tmap_t tm_k, const __grid_constant__ tmap_t tm_v,
    bf16 *__restrict__ o, float *__restrict__ lse
#if DOCS
    , const int *__restrict__ doc_start, const int *__restrict__ doc_end, int q_pos, int k_pos
#endif
) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ unsigned char hsmem[];
    const u32 base = (smem_addr(hsmem) + 1023u) & ~1023u; // the 128-byte swizzle repeats every 1024 bytes
    const u32 sQ = base, sK = base + H_OFF_K, sV = base + H_OFF_V, bars = base + H_OFF_BAR;
    // barriers: q_full, k_full[HSTAGES], v_full[HSTAGES], k_empty[HSTAGES], v_empty[HSTAGES]
    int h, tile;
    head_major_block(h, tile);
    const int tid = threadIdx.x, kvh = h / GROUP;
    // the blocks with the most key tiles (largest m0 when causal) start first
    const int mb = gridDim.y - 1 - tile, m0 = mb * HBM;
    constexpr int NT = (SEQ + HBN - 1) / HBN;
    // one past the last key tile (the causal end), and how many tiles, counted down from it, the block computes: all
    // of them, or with documents those from the tile holding the first key of the block's lowest document start;
    // producer and consumers take both from here, so they walk the same tiles
    const int nt_end = !CAUSAL ? NT : HBM == HBN ? mb + 1 : min((m0 + HBM + HBN - 1) / HBN, NT);
#if DOCS
    const int ntiles = max(nt_end - fwd_first_key_tile(doc_start, q_pos, k_pos, m0), 0);
#else
    const int ntiles = nt_end;
#endif
    if (tid == 0) {
        mbar_init(bars, 1);
        for (int s = 0; s < HSTAGES; s++) {
            mbar_init(bars + 8 * (1 + s), 1);                   // k_full: the producer's arrival + bytes
            mbar_init(bars + 8 * (1 + HSTAGES + s), 1);         // v_full
            mbar_init(bars + 8 * (1 + 2 * HSTAGES + s), 4 * H_CONSUMERS); // k_empty: one arrival per consumer warp
            mbar_init(bars + 8 * (1 + 3 * HSTAGES + s), 4 * H_CONSUMERS); // v_empty
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (tid < 128) {
        // producer warpgroup: one thread issues every copy
        asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n");
        // with documents, a block with no key tile loads nothing (its consumers wait for nothing)
        if (tid == 0 && (!DOCS || ntiles > 0)) {
            // a box that would start past the end is not loaded: its rows are no consumer's to store
            const int qboxes = HQBOX == 1 ? 1 : min(HQBOX, (SEQ - m0 + 127) / 128);
            mbar_expect_tx(bars, qboxes * H_TILE);
#pragma unroll
            for (int b = 0; b < HQBOX; b++)
                if (b < qboxes)
#pragma unroll
                    for (int c = 0; c < HSUB; c++)
                        tma_load_3d(sQ + b * H_TILE + c * H_SUBTILE, &tm_q, 64 * c, h, m0 + 128 * b, bars);
            for (int it = 0; it < ntiles; it++) {
                const int s = it % HSTAGES, n0 = (nt_end - 1 - it) * HBN;
                const u32 ph = ((it / HSTAGES) & 1) ^ 1; // the consumers' release of this stage's previous use
                const u32 k_full = bars + 8 * (1 + s), v_full = k_full + 8 * HSTAGES, k_empty = v_full + 8 * HSTAGES,
                          v_empty = k_empty + 8 * HSTAGES;
                if (it >= HSTAGES) mbar_wait(k_empty, ph);
                mbar_expect_tx(k_full, H_TILE);
#pragma unroll
                for (int c = 0; c < HSUB; c++)
                    tma_load_3d(sK + s * H_TILE + c * H_SUBTILE, &tm_k, 64 * c, kvh, n0, k_full);
                if (it >= HSTAGES) mbar_wait(v_empty, ph);
                mbar_expect_tx(v_full, H_TILE);
#pragma unroll
                for (int c = 0; c < HSUB; c++)
                    tma_load_3d(sV + s * H_TILE + c * H_SUBTILE, &tm_v, 64 * c, kvh, n0, v_full);
            }
        }
    } else {
        // the producer's registers to the consumers; the file holds 512 per thread of a warpgroup: 24 + 2 x 240,
        // 24 + 3 x 160
        if (H_CONSUMERS == 2) asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n");
        else asm volatile("setmaxnreg.inc.sync.aligned.u32 160;\n");
        fwd_sm90_consumer(sQ, sK, sV, bars, warpgroup_uniform() - 1, h, m0, nt_end, ntiles, o, lse
#if DOCS
                          , doc_start, q_pos, k_pos
#endif
        );
    }
#else
    __trap();
#endif
}

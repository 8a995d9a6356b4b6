// attention.cu: flash attention (the FlashAttention-2 algorithm) for one UPipe stage, on bf16 tensor cores through
// mma.sync m16n8k16 and ldmatrix, with cp.async double-buffered tiles in shared memory. Shapes are baked in:
// head dim, query and KV heads (GQA: query head h reads KV head h / (Q_HEADS / KV_HEADS)), sequence length,
// causal or not, whether dK, dV are written as bf16 or accumulated into fp32, and how the Hopper backward sums dQ
// over the key blocks: in key-block order, the same bits every run (DQ_ATOMIC = 0, the default), or by atomic adds
// into a zeroed dq_ws in whatever order the blocks come (DQ_ATOMIC = 1: no block waits for another). The mma.sync
// backward here always sums in order (an atomic variant of it spilled registers at D = 128).
// module: attention_d{{HEAD_DIM}}_q{{Q_HEADS}}_kv{{KV_HEADS}}_s{{SEQ}}_c{{CAUSAL}}_a{{DKV_ACCUM}}_dqa{{DQ_ATOMIC}}{{DOCS_TAG}}
//
// Layouts (row-major): q, o, dout [SEQ][Q_HEADS][HEAD_DIM] bf16; k, v [SEQ][KV_HEADS][HEAD_DIM] bf16;
// lse [Q_HEADS] rows of SEQ fp32 LSE_STRIDE apart (SEQ, but the group's tokens in a ring's half-block launches:
// gen/plan.c), natural log of the softmax denominator of the scaled scores (as PyTorch reports it);
// delta [SEQ][Q_HEADS] fp32 = rowsum(dout * o); dq_ws [SEQ][Q_HEADS][HEAD_DIM] fp32 (written by bwd: zeroed before
// it only when DQ_ATOMIC); dq_prog [KV_HEADS][ceil(SEQ/128)] u32, zeroed before bwd (the progress counters that
// order the dQ sums).
// Entries (geometry in gen/kernels_attn.c; with DOCS = 1 fwd and bwd, like fwd_sm90 and bwd_sm90, take the four
// arguments of "Document masks" below after these):
//   fwd(q, k, v, o, lse)                                  grid (Q_HEADS, ceil(SEQ/128)), 128 threads
//   bwd(q, k, v, dout, lse, delta, dq_ws, dq_prog, dk, dv) grid (KV_HEADS, ceil(SEQ/128)), 256 threads;
//       dq_ws = dS K (unscaled), summed over the key blocks in key-block order, so the same bits run to run;
//       dk, dv written (bf16) or added to (fp32 when DKV_ACCUM)
//   bwd_dq(dq_ws, dq)                                     dq = bf16(scale * dq_ws)
// On Hopper (sm_90a) the runtime runs the forward of attention_sm90.cuh and the backward of attention_bwd_sm90.cuh
// instead (fwd_sm90, bwd_sm90: wgmma, TMA, warp specialisation); fwd and bwd stay the path of sm_80 and sm_89.
//
// Document masks (DOCS = 1: packed documents, docs/DATA.md). fwd, bwd, fwd_sm90 and bwd_sm90 take four more
// arguments, last: (const int *doc_start, const int *doc_end, int q_pos, int k_pos). Positions are the sequence's
// (global): query row r of the launch is at q_pos + r and key row c at k_pos + c (0, 0 but for a ring's half-block
// launches). doc_start[i] is where the document holding position i starts (<= i), doc_end[j] one past its last
// position (> j), both over the whole sequence. A score (r, c) is kept when the causal rule keeps it (CAUSAL
// compares r and c, as without documents: causal launches have q_pos = k_pos) and k_pos + c >= doc_start[q_pos +
// r], i.e. the key is in the query's document (equivalently q_pos + r < doc_end[k_pos + c]). Work follows the
// documents: a tile whose keys all lie before its queries' documents (or whose queries all lie past its keys'
// documents) is not computed at all; a tile that is wholly kept is computed without masks; only the tiles that
// cross a document's start or the diagonal are masked. A query row that keeps no key of the launch (a ring's
// off-diagonal block wholly in other documents) writes o = 0 and lse = -inf, and the backward gives it P = 0.

#define HEAD_DIM {{HEAD_DIM}}
#define Q_HEADS {{Q_HEADS}}
#define KV_HEADS {{KV_HEADS}}
#define SEQ {{SEQ}}
#define LSE_STRIDE {{LSE_STRIDE}}
#define CAUSAL {{CAUSAL}}
#define DKV_ACCUM {{DKV_ACCUM}}
#define DQ_ATOMIC {{DQ_ATOMIC}}
#define DOCS {{DOCS}}
#if DOCS
// the entries' extra parameters (the contract above), appended after their usual ones
#define DOC_PARAMS , const int *__restrict__ doc_start, const int *__restrict__ doc_end, int q_pos, int k_pos
#else
#define DOC_PARAMS
#endif
#define SOFTMAX_SCALE ((float)({{SCALE}}))
// exp(x * scale) = exp2(x * scale * log2(e)): one FFMA and one EX2 per score
#define SCALE_LOG2 ((float)({{SCALE}} * 1.4426950408889634))
#define LOG2E 1.4426950408889634f

static_assert(HEAD_DIM == 64 || HEAD_DIM == 128, "head_dim must be 64 or 128");
static_assert(Q_HEADS % KV_HEADS == 0, "query heads must be a multiple of KV heads");
#define GROUP (Q_HEADS / KV_HEADS)

typedef unsigned short bf16;
template <bool B> struct BoolTag { static constexpr bool value = B; };
typedef unsigned int u32;
#if DKV_ACCUM
typedef float dkv_t;
#else
typedef bf16 dkv_t;
#endif

// row strides (elements) of the head-layout tensors
constexpr long long QS = (long long)Q_HEADS * HEAD_DIM, KS = (long long)KV_HEADS * HEAD_DIM;

#define NEG_INF __int_as_float(0xff800000)
#define ROWB (HEAD_DIM * 2)    // bytes of one row of a Q, K, V or dO tile
#define CHUNKS (HEAD_DIM / 8)  // 16-byte chunks in such a row
#define KSTEPS (HEAD_DIM / 16) // mma k-steps over the head dimension

// ---- small PTX wrappers ----

__device__ __forceinline__ u32 smem_addr(const void *p) { return (u32)__cvta_generic_to_shared(p); }
// The same value, opaque to the compiler: keeps it from hoisting the per-step addresses derived from a lane base out
// of the loop, where they would each hold a register for the whole loop.
__device__ __forceinline__ u32 opaque(u32 x) {
    asm volatile("" : "+r"(x));
    return x;
}

// 16-byte async copy; when !ok nothing is read and the destination is zero-filled (ragged tiles).
__device__ __forceinline__ void cp_async16(u32 dst, const void *src, bool ok) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(ok ? 16 : 0));
}
__device__ __forceinline__ void cp_async4(u32 dst, const void *src, bool ok) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(ok ? 4 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::); }

__device__ __forceinline__ void ldsm4(u32 (&r)[4], u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
__device__ __forceinline__ void ldsm4t(u32 (&r)[4], u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
__device__ __forceinline__ void sts32(u32 addr, u32 v) { asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v)); }
__device__ __forceinline__ uint4 lds128(u32 addr) {
    uint4 v;
    asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
    return v;
}
__device__ __forceinline__ u32 lds32(u32 addr) {
    u32 v;
    asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(v) : "r"(addr));
    return v;
}
__device__ __forceinline__ float lds_f32(u32 addr) {
    float v;
    asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(v) : "r"(addr));
    return v;
}

// c += a b for one 16x8x16 tile: a is 4 registers of bf16 pairs (row-major 16x16), b 2 registers (16x8, k-major).
__device__ __forceinline__ void mma(float (&c)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats as a bf16 pair, lo at the lower address (round to nearest even).
__device__ __forceinline__ u32 pack_bf16(float lo, float hi) {
    u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

__device__ __forceinline__ float ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// Progress counters of the backward's dQ sums: strong (gpu-scope) loads and stores, fences, and a short sleep.
__device__ __forceinline__ u32 ld_relaxed(const u32 *p) {
    u32 v;
    asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void st_relaxed(u32 *p, u32 v) {
    asm volatile("st.relaxed.gpu.global.u32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void fence_acq_rel() { asm volatile("fence.acq_rel.gpu;\n" ::: "memory"); }
__device__ __forceinline__ void sleep_ns(u32 ns) { asm volatile("nanosleep.u32 %0;\n" ::"r"(ns)); }
// Poll the previous key block's progress counter until it has completed tile `it`; returns the value seen, which the
// caller keeps, so that a block far behind its predecessor polls once per many tiles. The caller fences.
__device__ __forceinline__ u32 wait_progress(const u32 *pp, u32 it) {
    u32 seen = ld_relaxed(pp);
    while (seen <= it) {
        sleep_ns(128);
        seen = ld_relaxed(pp);
    }
    return seen;
}
// blockIdx read where it is used, so that what is derived from it holds no register across the backward's loop
__device__ __forceinline__ u32 ctaid_x() {
    u32 v;
    asm volatile("mov.u32 %0, %%ctaid.x;\n" : "=r"(v));
    return v;
}
__device__ __forceinline__ u32 ctaid_y() {
    u32 v;
    asm volatile("mov.u32 %0, %%ctaid.y;\n" : "=r"(v));
    return v;
}

__device__ __forceinline__ void red_add2(float *p, float a, float b) {
#if __CUDA_ARCH__ >= 900
    asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(p), "f"(a), "f"(b) : "memory");
#else
    atomicAdd(p, a);
    atomicAdd(p + 1, b);
#endif
}

// Tiles in shared memory are row-major with 16-byte chunks swizzled: chunk c of row r sits at chunk c ^ (r & 7), so
// the eight rows that one ldmatrix phase (or one quad-row store) touches fall in eight different bank groups.
__device__ __forceinline__ u32 swz(int rowb, int row, int ch) { return (u32)(row * rowb + ((ch ^ (row & 7)) << 4)); }
// This lane's address of row lrow, chunk lch (0 or 1) of a tile whose base is a multiple of rowb.
__device__ __forceinline__ u32 lane_base(u32 tile, int rowb, int lrow, int lch) {
    return tile + (u32)(lrow * rowb + ((lch ^ (lrow & 7)) << 4));
}
// Row R + lrow, chunk C + lch from such a base, for R a multiple of 8 and C even and below rowb / 16: the row's
// swizzle is then the lane's own and C only flips chunk bits, so an address costs one XOR (and an immediate add)
// with no per-step registers.
__device__ __forceinline__ u32 at(u32 base, int rowb, int R, int C) { return (base ^ (u32)(C << 4)) + (u32)(R * rowb); }

// Async copy of ROWS rows of HEAD_DIM bf16 from global (row stride GS elements) into a swizzled tile; rows at or
// past `valid` are zero-filled. Consecutive threads take consecutive chunks of a row, so the reads coalesce. Whole
// tiles take the unpredicated path, whose per-step offsets are immediates (no per-step pointer registers).
template <int ROWS, int NTHREADS, long long GS>
__device__ __forceinline__ void load_rows(u32 tile, const bf16 *g, int valid, int tid) {
    static_assert(NTHREADS % CHUNKS == 0 && ROWS % (NTHREADS / CHUNKS) == 0, "tile does not divide among threads");
    constexpr int RPS = NTHREADS / CHUNKS; // rows per step, a multiple of 8: the swizzle is the same every step
    const int r0 = tid / CHUNKS, ch = tid % CHUNKS;
    const u32 dst = tile + swz(ROWB, r0, ch);
    const bf16 *src = g + r0 * GS + ch * 8;
    if (valid >= ROWS) {
#pragma unroll
        for (int i = 0; i < ROWS / RPS; i++)
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst + i * RPS * ROWB), "l"(src + i * RPS * GS));
    } else {
#pragma unroll
        for (int i = 0; i < ROWS / RPS; i++) {
            const bool ok = r0 + i * RPS < valid;
            cp_async16(dst + i * RPS * ROWB, ok ? src + i * RPS * GS : g, ok);
        }
    }
}

// ================================ forward ================================
// One block: 128 query rows of one head, 4 warps of 32 rows each. It walks the key blocks of 64 from the last
// (masked ones first) to the first, with K and V double-buffered so the next block loads during the math.
// Shared memory: Q [128][D], K [2][64][D], V [2][64][D], row statistics [128][8] (100 KiB at D = 128: two blocks
// per SM); with documents the rows' document starts [128]. With documents the walk stops at the block holding the
// first row's document start (see fwd).
#define FWD_BM 128
#define FWD_BN 64
#define FWD_THREADS 128
#define FWD_NT (FWD_BN / 8)   // score n-tiles per warp
#define FWD_DT (HEAD_DIM / 8) // output n-tiles per warp
#define FWD_BOUNDS __launch_bounds__(FWD_THREADS, 2)

// One key block of the forward for one warp: S = Q K^T, mask (MASK: the block crosses the diagonal or the end of
// the sequence, or with documents a row's document start), online softmax, O += P V. qb, kt, vt are this lane's
// ldmatrix bases for Q and the block's K, V. The running row max and sum live in shared memory (rstat: this
// thread's four rows): with 192 accumulator registers, keeping them in registers as well makes ptxas spill. So do
// the rows' document starts with documents (slo: those of the block's 128 rows; k_pos: the launch's first key's
// position).
template <bool MASK>
__device__ __forceinline__ void fwd_block(float (&acc)[2][FWD_DT][4], u32 rstat,
#if DOCS
                                          u32 slo, int k_pos,
#endif
                                          u32 qb, u32 kt, u32 vt, int n0, int m0, int warp, int g, int t) {
    qb = opaque(qb), kt = opaque(kt), vt = opaque(vt);
    // S = Q K^T for this warp's 32 rows and the 64 keys
    float s[2][FWD_NT][4];
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int j = 0; j < FWD_NT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) s[mt][j][e] = 0.f;
#pragma unroll
    for (int ks = 0; ks < KSTEPS; ks++) {
        u32 a[2][4];
#pragma unroll
        for (int mt = 0; mt < 2; mt++) ldsm4(a[mt], at(qb, ROWB, mt * 16, ks * 2));
#pragma unroll
        for (int np = 0; np < FWD_NT / 2; np++) {
            u32 b[4];
            ldsm4(b, at(kt, ROWB, np * 16, ks * 2));
#pragma unroll
            for (int mt = 0; mt < 2; mt++) {
                mma(s[mt][2 * np], a[mt], b[0], b[1]);
                mma(s[mt][2 * np + 1], a[mt], b[2], b[3]);
            }
        }
    }

    if (MASK) {
        // element (j, e) is key n0 + 2t + j*8 + e: compare the compile-time j*8 + e with one limit per row
        const int kmax = SEQ - 1 - n0 - 2 * t, diag = m0 + warp * 32 + g - n0 - 2 * t;
#pragma unroll
        for (int mt = 0; mt < 2; mt++)
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                const int lim = CAUSAL ? min(kmax, diag + mt * 16 + hf * 8) : kmax;
#if DOCS
                // and the keys before the row's document
                const int first = (int)lds32(slo + (warp * 32 + mt * 16 + g + hf * 8) * 4) - k_pos - n0 - 2 * t;
#endif
#pragma unroll
                for (int j = 0; j < FWD_NT; j++)
#pragma unroll
                    for (int e = 0; e < 2; e++)
#if DOCS
                        if (j * 8 + e > lim || j * 8 + e < first) s[mt][j][2 * hf + e] = NEG_INF;
#else
                        if (j * 8 + e > lim) s[mt][j][2 * hf + e] = NEG_INF;
#endif
            }
    }

    // online softmax: new running max, rescale what was accumulated, p = exp(scale * (s - max))
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            const u32 rm = rstat + (mt * 2 + hf) * 8, rs = rm + 4;
            const float old = lds_f32(rm);
            float mx = old;
#pragma unroll
            for (int j = 0; j < FWD_NT; j++) mx = fmaxf(mx, fmaxf(s[mt][j][2 * hf], s[mt][j][2 * hf + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            // a row with every key so far masked keeps max -inf; subtracting 0 then keeps exp2(-inf) = 0
            const float msc = mx == NEG_INF ? 0.f : mx * SCALE_LOG2;
            const float corr = ex2(old * SCALE_LOG2 - msc);
            sts32(rm, __float_as_uint(mx));
            float sum = 0.f;
#pragma unroll
            for (int j = 0; j < FWD_NT; j++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const float p = ex2(fmaf(s[mt][j][2 * hf + e], SCALE_LOG2, -msc));
                    s[mt][j][2 * hf + e] = p;
                    sum += p;
                }
            sts32(rs, __float_as_uint(lds_f32(rs) * corr + sum));
#pragma unroll
            for (int j = 0; j < FWD_DT; j++) acc[mt][j][2 * hf] *= corr, acc[mt][j][2 * hf + 1] *= corr;
        }

    // O += P V: the score accumulators are already in the A-operand layout, two n-tiles per k-step
#pragma unroll
    for (int kk = 0; kk < FWD_BN / 16; kk++) {
        u32 a[2][4];
#pragma unroll
        for (int mt = 0; mt < 2; mt++) {
            a[mt][0] = pack_bf16(s[mt][2 * kk][0], s[mt][2 * kk][1]);
            a[mt][1] = pack_bf16(s[mt][2 * kk][2], s[mt][2 * kk][3]);
            a[mt][2] = pack_bf16(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
            a[mt][3] = pack_bf16(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
        }
#pragma unroll
        for (int dp = 0; dp < FWD_DT / 2; dp++) {
            u32 b[4];
            ldsm4t(b, at(vt, ROWB, kk * 16, dp * 2));
#pragma unroll
            for (int mt = 0; mt < 2; mt++) {
                mma(acc[mt][2 * dp], a[mt], b[0], b[1]);
                mma(acc[mt][2 * dp + 1], a[mt], b[2], b[3]);
            }
        }
    }
}

extern "C" __global__ void FWD_BOUNDS
attention_fwd_d{{HEAD_DIM}}_q{{Q_HEADS}}_kv{{KV_HEADS}}_s{{SEQ}}_c{{CAUSAL}}_a{{DKV_ACCUM}}_dqa{{DQ_ATOMIC}}{{DOCS_TAG}}(
    const bf16 *__restrict__ q, const bf16 *__restrict__ k, const bf16 *__restrict__ v, bf16 *__restrict__ o,
    float *__restrict__ lse DOC_PARAMS) {
    extern __shared__ __align__(128) unsigned char smem[];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int h = blockIdx.x, kvh = h / GROUP;
    // the blocks with the most key blocks (largest m0 when causal) start first
    const int m0 = (gridDim.y - 1 - blockIdx.y) * FWD_BM;
    const u32 sQ = smem_addr(smem), sK = sQ + FWD_BM * ROWB, sV = sK + 2 * FWD_BN * ROWB;
    const bf16 *kh = k + (long long)kvh * HEAD_DIM, *vh = v + (long long)kvh * HEAD_DIM;

    const int n_end = CAUSAL ? min(SEQ, m0 + FWD_BM) : SEQ;
    const int nblocks = (n_end + FWD_BN - 1) / FWD_BN;
#if DOCS
    // doc_start grows with the position, so the first row's document start is the first key any row keeps (the
    // key blocks below it are not computed: none when it lies past the launch's keys), and the last row's is the
    // last that some row masks (the blocks from it on are whole for every row)
    const int key_lo = doc_start[q_pos + m0] - k_pos, key_whole = doc_start[q_pos + min(SEQ, m0 + FWD_BM) - 1] - k_pos;
    const int nb_lo = key_lo >= n_end ? nblocks : max(key_lo, 0) / FWD_BN;
    // every row's document start, beside the row statistics
    const u32 slo = sV + 2 * FWD_BN * ROWB + FWD_THREADS * 32;
    cp_async4(slo + tid * 4, doc_start + q_pos + min(m0 + tid, SEQ - 1), true);
#endif

    load_rows<FWD_BM, FWD_THREADS, QS>(sQ, q + ((long long)m0 * Q_HEADS + h) * HEAD_DIM, SEQ - m0, tid);
    {
        const int n0 = (nblocks - 1) * FWD_BN;
        load_rows<FWD_BN, FWD_THREADS, KS>(sK, kh + n0 * KS, SEQ - n0, tid);
        load_rows<FWD_BN, FWD_THREADS, KS>(sV, vh + n0 * KS, SEQ - n0, tid);
    }
    cp_async_commit();

    float acc[2][FWD_DT][4];
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int j = 0; j < FWD_DT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[mt][j][e] = 0.f;
    // running max and (this thread's partial) sum of each of its rows (m-tile, row g or g + 8)
    const u32 rstat = sV + 2 * FWD_BN * ROWB + tid * 32; // per row (mt, hf): max at +0, sum at +4
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int hf = 0; hf < 2; hf++)
            sts32(rstat + (mt * 2 + hf) * 8, __float_as_uint(NEG_INF)), sts32(rstat + (mt * 2 + hf) * 8 + 4, 0u);

    // ldmatrix row and chunk of this lane: Q as the A operand; K as B (rows = keys); V as B through .trans
    const u32 qb = lane_base(sQ, ROWB, warp * 32 + (lane & 15), lane >> 4);
    const u32 kb = lane_base(sK, ROWB, (lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1);
    const u32 vb = lane_base(sV, ROWB, (lane & 7) + (((lane >> 3) & 1) << 3), lane >> 4);

    auto begin_block = [&](int nb, int st) {
        cp_async_wait_all();
        // block nb has landed for every thread, and every warp is done with the buffers of block nb + 1
        __syncthreads();
#if DOCS
        if (nb > nb_lo) {
#else
        if (nb > 0) {
#endif
            const int n1 = (nb - 1) * FWD_BN;
            load_rows<FWD_BN, FWD_THREADS, KS>(sK + (st ^ 1) * FWD_BN * ROWB, kh + n1 * KS, SEQ - n1, tid);
            load_rows<FWD_BN, FWD_THREADS, KS>(sV + (st ^ 1) * FWD_BN * ROWB, vh + n1 * KS, SEQ - n1, tid);
            cp_async_commit();
        }
    };
    int nb = nblocks - 1, st = 0;
#if DOCS
    for (; nb >= nb_lo; nb--, st ^= 1) {
        begin_block(nb, st);
        const u32 kt = kb + st * FWD_BN * ROWB, vt = vb + st * FWD_BN * ROWB;
        const int n0 = nb * FWD_BN;
        if (n0 + FWD_BN > SEQ || (CAUSAL && n0 + FWD_BN - 1 > m0) || n0 < key_whole)
            fwd_block<true>(acc, rstat, slo, k_pos, qb, kt, vt, n0, m0, warp, g, t);
        else
            fwd_block<false>(acc, rstat, slo, k_pos, qb, kt, vt, n0, m0, warp, g, t);
    }
    if (nb_lo >= nblocks) { // no key block: the copies into the Q tile, where O is staged, must land first
        cp_async_wait_all();
        __syncthreads();
    }
#else
    for (; nb >= 0; nb--, st ^= 1) {
        begin_block(nb, st);
        const u32 kt = kb + st * FWD_BN * ROWB, vt = vb + st * FWD_BN * ROWB;
        const int n0 = nb * FWD_BN;
        if (n0 + FWD_BN > SEQ || (CAUSAL && n0 + FWD_BN - 1 > m0))
            fwd_block<true>(acc, rstat, qb, kt, vt, n0, m0, warp, g, t);
        else
            fwd_block<false>(acc, rstat, qb, kt, vt, n0, m0, warp, g, t);
    }
#endif

    // normalise, write lse, and stage this warp's rows of O in its own (now unused) rows of the Q tile so that the
    // global stores are whole 16-byte chunks of contiguous rows
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            float l = lds_f32(rstat + (mt * 2 + hf) * 8 + 4);
            l += __shfl_xor_sync(0xffffffffu, l, 1);
            l += __shfl_xor_sync(0xffffffffu, l, 2);
            const float inv = l > 0.f ? 1.f / l : 0.f;
#pragma unroll
            for (int j = 0; j < FWD_DT; j++) acc[mt][j][2 * hf] *= inv, acc[mt][j][2 * hf + 1] *= inv;
            const int row = m0 + warp * 32 + mt * 16 + g + hf * 8;
            if (t == 0 && row < SEQ)
                lse[(long long)h * LSE_STRIDE + row] = lds_f32(rstat + (mt * 2 + hf) * 8) * SOFTMAX_SCALE + logf(l);
        }
    __syncwarp();
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int j = 0; j < FWD_DT; j++)
#pragma unroll
            for (int hf = 0; hf < 2; hf++)
                sts32(sQ + swz(ROWB, warp * 32 + mt * 16 + g + hf * 8, j) + t * 4,
                      pack_bf16(acc[mt][j][2 * hf], acc[mt][j][2 * hf + 1]));
    __syncwarp();
#pragma unroll
    for (int i = 0; i < CHUNKS; i++) {
        const int idx = i * 32 + lane, r = idx / CHUNKS, ch = idx % CHUNKS, row = m0 + warp * 32 + r;
        if (row < SEQ)
            *(uint4 *)(o + ((long long)row * Q_HEADS + h) * HEAD_DIM + ch * 8) = lds128(sQ + swz(ROWB, warp * 32 + r, ch));
    }
}

// ================================ backward ================================
// One block: 128 keys (key block j = blockIdx.y) of one KV head, 8 warps. It loops over the query blocks of 64 rows
// that can see these keys, from the last down to the first, and within each over the query heads of the GQA group,
// keeping dK and dV for its keys in registers for the whole loop. Per (query block, head), a tile:
//   A  (warps 2 x 4 over 64 rows x 128 keys): S = Q K^T, P = exp(scale S - lse), dP = dO V^T, dS = P (dP - delta);
//      P and dS go to shared memory as bf16
//   B  (warps 4 x 2 over 128 keys x D): dV += P^T dO, dK += dS^T Q
//   C  (warps 2 x 4 over 64 rows x D): dQ = dS K, stored into the fp32 workspace (key block 0) or added to it
// Shared memory: K, V [128][D]; Q, dO [2][64][D]; P, dS [64][128]; lse, delta [2][64]; one u32 of the progress wait
// (161 KiB at D = 128); with documents the rows' document starts [2][64].
//
// Deterministic dQ: every tile's dQ rows get the key blocks' contributions in key-block order, j = 0, 1, 2, ...
// (key block 0 stores, the others add with reductions at L2), so dq_ws holds the same bits run to run. Tile number
// it = (last query block - m) * GROUP + head: the same for every key block that sees query block m, which is why the
// loop runs from the last query block down: the blocks of one KV head that run at the same time reach a tile at
// about the same moment, whatever their own first query block. Block (kvh, j) publishes in dq_prog[kvh][j] how many
// of its tiles are complete (thread 0, after phase A of tile it: a fence, then the store of it; once more at the
// end); block j > 0 waits, before the barrier that follows phase A of tile it, until dq_prog[kvh][j - 1] > it (thread
// 0 polls, then that fence), and so adds its dQ of tile it at the end of the tile after block j - 1's. Block j - 1
// waited for block j - 2 in turn, so the order holds for all.
// The poll's last value is kept (in shared memory), so a block far behind its predecessor polls once per many tiles.
// No deadlock: a block waits only for the block of the same KV head with the next lower blockIdx.y. Blocks are
// dispatched in increasing linear index (blockIdx.x fastest, then blockIdx.y), so that block is already running or
// done when this one waits, and it waits only for lower blocks itself. This assumption keeps blockIdx.y = key block
// (the key blocks with the most query blocks, the lowest, start first, which is also what balances the causal load).
//
// With documents a key block skips the query blocks past its keys' last document: its loop starts at the tile of
// the query block holding that document's last position (the tile numbers stay those above). The key blocks that
// see a query block are then consecutive (from the one holding its first row's document start up to the causal
// limit), so the first of them stores that block's dQ and waits for no one (it need not be key block 0), and every
// later one waits for its predecessor as above, which sees the block too: a skipped tile is never waited for, and
// the order of the sums holds. Query blocks that no key block sees (rows whose documents start past the launch's
// keys: only in a launch that is not causal) get their zeros from the last key block, which would be the first
// to see them. Rows of a tile that keep no key get P = 0 from the masks (their lse is -inf).
#define BWD_BM 64
#define BWD_BN 128
#define BWD_THREADS 256
#define PROWB (BWD_BN * 2)          // bytes of one row of the P and dS tiles
#define BWD_BT (HEAD_DIM / 16)      // dK, dV n-tiles per warp (D/2 columns)
#define BWD_CT (HEAD_DIM / 32)      // dQ n-tiles per warp (D/4 columns)
#define BWD_BOUNDS __launch_bounds__(BWD_THREADS, 1)

extern "C" __global__ void BWD_BOUNDS
attention_bwd_d{{HEAD_DIM}}_q{{Q_HEADS}}_kv{{KV_HEADS}}_s{{SEQ}}_c{{CAUSAL}}_a{{DKV_ACCUM}}_dqa{{DQ_ATOMIC}}{{DOCS_TAG}}(
    const bf16 *__restrict__ q, const bf16 *__restrict__ k, const bf16 *__restrict__ v,
    const bf16 *__restrict__ dout, const float *__restrict__ lse, const float *__restrict__ delta,
    float *__restrict__ dq_ws, u32 *__restrict__ dq_prog, dkv_t *__restrict__ dk, dkv_t *__restrict__ dv DOC_PARAMS) {
    extern __shared__ __align__(128) unsigned char smem[];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int kvh = blockIdx.x, n0 = blockIdx.y * BWD_BN; // the key blocks with the most query blocks start first
    const u32 sK = smem_addr(smem), sV = sK + BWD_BN * ROWB, sQ = sV + BWD_BN * ROWB, sdO = sQ + 2 * BWD_BM * ROWB,
              sP = sdO + 2 * BWD_BM * ROWB, sdS = sP + BWD_BM * PROWB, sL = sdS + BWD_BM * PROWB,
              sD = sL + 2 * BWD_BM * 4, sSeen = sD + 2 * BWD_BM * 4;
#if DOCS
    const u32 sLo = sSeen + 16; // [2][64] document starts of the tile's rows, beside its lse and delta
#endif

    // query blocks before n0 see none of these keys when causal
    constexpr int NM = (SEQ + BWD_BM - 1) / BWD_BM, NKB = (SEQ + BWD_BN - 1) / BWD_BN;
    const int m_first = CAUSAL ? n0 / BWD_BM : 0;
    const int niters = GROUP * (NM - m_first);
#if DOCS
    // query rows from the end of the last key's document on see none of these keys: the first tile is that of the
    // query block holding the row before it (none when it is not past the launch's first query)
    const int q_end = doc_end[k_pos + min(n0 + BWD_BN, SEQ) - 1] - q_pos;
    const int it_first = GROUP * (NM - 1 - (q_end <= 0 ? -1 : min((q_end - 1) / BWD_BM, NM - 1)));
#endif
    // this block's progress counter (the predecessor's is the one before), and whether a next key block waits for it
    auto prog = [&]() { return dq_prog + ctaid_x() * NKB + ctaid_y(); };
    auto publish = [&]() { return ctaid_y() + 1 < (u32)NKB; };
    if (tid == 0) sts32(sSeen, 0u); // the predecessor's progress as last read (thread 0)

    load_rows<BWD_BN, BWD_THREADS, KS>(sK, k + ((long long)n0 * KV_HEADS + kvh) * HEAD_DIM, SEQ - n0, tid);
    load_rows<BWD_BN, BWD_THREADS, KS>(sV, v + ((long long)n0 * KV_HEADS + kvh) * HEAD_DIM, SEQ - n0, tid);

    // tile it: query block NM - 1 - it / GROUP, query head kvh * GROUP + it % GROUP
    auto load_q_block = [&](int it, int stage) {
        const int mi = it / GROUP, hi = it - mi * GROUP, m0 = (NM - 1 - mi) * BWD_BM, h = kvh * GROUP + hi;
        const long long off = ((long long)m0 * Q_HEADS + h) * HEAD_DIM;
        load_rows<BWD_BM, BWD_THREADS, QS>(sQ + stage * BWD_BM * ROWB, q + off, SEQ - m0, tid);
        load_rows<BWD_BM, BWD_THREADS, QS>(sdO + stage * BWD_BM * ROWB, dout + off, SEQ - m0, tid);
        if (tid < BWD_BM) {
            const bool ok = m0 + tid < SEQ;
            cp_async4(sL + (stage * BWD_BM + tid) * 4, lse + (long long)h * LSE_STRIDE + (ok ? m0 + tid : 0), ok);
        } else if (tid < 2 * BWD_BM) {
            const int r = tid - BWD_BM;
            const bool ok = m0 + r < SEQ;
            cp_async4(sD + (stage * BWD_BM + r) * 4, delta + (long long)(ok ? m0 + r : 0) * Q_HEADS + h, ok);
        }
#if DOCS
        else if (tid < 3 * BWD_BM) {
            const int r = tid - 2 * BWD_BM;
            const bool ok = m0 + r < SEQ;
            cp_async4(sLo + (stage * BWD_BM + r) * 4, doc_start + q_pos + (ok ? m0 + r : 0), ok);
        }
#endif
    };
#if DOCS
    if (it_first < niters) load_q_block(it_first, it_first & 1);
#else
    load_q_block(0, 0);
#endif
    cp_async_commit();

    float dv_acc[2][BWD_BT][4], dk_acc[2][BWD_BT][4];
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int j = 0; j < BWD_BT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) dv_acc[mt][j][e] = 0.f, dk_acc[mt][j][e] = 0.f;

    // warp tiles of the three phases
    const int a_wm = warp & 1, a_wn = warp >> 1; // A: rows a_wm*32, keys a_wn*32
    const int b_wk = warp >> 1, b_wd = warp & 1; // B: keys b_wk*32, columns b_wd*D/2
    const int c_wm = warp & 1, c_wd = warp >> 1; // C: rows c_wm*32, columns c_wd*D/4
    // ldmatrix lane bases: an A operand (rows = m); a B operand with rows = n; operands read through .trans
    const int a_row = lane & 15, a_ch = lane >> 4;
    const int n_row = (lane & 7) + ((lane >> 4) << 3), n_ch = (lane >> 3) & 1;
    const int t_row = (lane & 7) + (((lane >> 3) & 1) << 3), t_ch = lane >> 4;
    // Lane offsets within a tile; a tile's address (smem base + tile offset, a multiple of 1024) is added after the
    // swizzle XOR of at(), so one offset serves every tile read the same way.
    const u32 offA = lane_base(0, ROWB, a_wm * 32 + a_row, a_ch);   // Q, dO as A operands (phase A)
    const u32 offN = lane_base(0, ROWB, a_wn * 32 + n_row, n_ch);   // K, V as B operands (phase A)
    const u32 offPT = lane_base(0, PROWB, n_row, n_ch);             // P^T, dS^T as A operands (phase B)
    const u32 offT = lane_base(0, ROWB, t_row, t_ch);               // dO, Q (phase B), K (phase C) through .trans
    const u32 offS = lane_base(0, PROWB, c_wm * 32 + a_row, a_ch);  // dS as the A operand (phase C)
    const u32 base = sK; // K, V, Q, dO, P, dS tiles follow at constant offsets
    constexpr u32 oV = BWD_BN * ROWB, oQ = 2 * BWD_BN * ROWB, oDO = oQ + 2 * BWD_BM * ROWB,
                  oP = oDO + 2 * BWD_BM * ROWB, oDS = oP + BWD_BM * PROWB;

#if DOCS
    for (int it = it_first; it < niters; it++) {
#else
    for (int it = 0; it < niters; it++) {
#endif
        const int st = it & 1;
        cp_async_wait_all();
        // this block's Q, dO, lse, delta have landed; every warp is done with the previous iteration, and has issued
        // its dQ writes of the tiles before it
        __syncthreads();
        if (it + 1 < niters) {
            load_q_block(it + 1, st ^ 1);
            cp_async_commit();
        }
        const int io = (int)opaque((u32)it), mi = io / GROUP, m0 = (NM - 1 - mi) * BWD_BM;
        const u32 sbase = base + st * BWD_BM * ROWB; // Q and dO tiles of this stage

        // ---- A: S, P, dP, dS; EDGE: the block crosses the diagonal or the end of the sequence ----
        auto phase_a = [&](auto edge_tag) {
            constexpr bool EDGE = decltype(edge_tag)::value;
            // ---- A: S and P ----
            float pa[2][4][4];
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
#pragma unroll
                for (int j = 0; j < 4; j++)
#pragma unroll
                    for (int e = 0; e < 4; e++) pa[mt][j][e] = 0.f;
#pragma unroll
            for (int ks = 0; ks < KSTEPS; ks++) {
                u32 a[2][4];
#pragma unroll
                for (int mt = 0; mt < 2; mt++) ldsm4(a[mt], at(offA, ROWB, mt * 16, ks * 2) + sbase + oQ);
#pragma unroll
                for (int np = 0; np < 2; np++) {
                    u32 b[4];
                    ldsm4(b, at(offN, ROWB, np * 16, ks * 2) + base);
#pragma unroll
                    for (int mt = 0; mt < 2; mt++) {
                        mma(pa[mt][2 * np], a[mt], b[0], b[1]);
                        mma(pa[mt][2 * np + 1], a[mt], b[2], b[3]);
                    }
                }
            }
            const int key0 = n0 + a_wn * 32 + 2 * t; // element (j, e) is key key0 + j*8 + e
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
#pragma unroll
                for (int hf = 0; hf < 2; hf++) {
                    const int rl = a_wm * 32 + mt * 16 + g + hf * 8, row = m0 + rl;
                    const float l2 = lds_f32(sL + (st * BWD_BM + rl) * 4) * LOG2E;
                    // keys past the end, and past the row when causal, get p = 0; rows past the end get no keys
                    int lim = SEQ - 1 - key0;
                    if (CAUSAL) lim = min(lim, row - key0);
                    if (row >= SEQ) lim = -1;
#if DOCS
                    // and the keys before the row's document (all of them for a row that keeps none: lse = -inf
                    // makes its exponentials infinite, which the mask replaces)
                    const int first = EDGE ? (int)lds32(sLo + (st * BWD_BM + rl) * 4) - k_pos - key0 : 0;
#endif
#pragma unroll
                    for (int j = 0; j < 4; j++)
#pragma unroll
                        for (int e = 0; e < 2; e++) {
                            float p = ex2(fmaf(pa[mt][j][2 * hf + e], SCALE_LOG2, -l2));
#if DOCS
                            if (EDGE && (j * 8 + e > lim || j * 8 + e < first)) p = 0.f;
#else
                            if (EDGE && j * 8 + e > lim) p = 0.f;
#endif
                            pa[mt][j][2 * hf + e] = p;
                        }
                }
            // ---- A: dP and dS ----
            float ds[2][4][4];
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
#pragma unroll
                for (int j = 0; j < 4; j++)
#pragma unroll
                    for (int e = 0; e < 4; e++) ds[mt][j][e] = 0.f;
#pragma unroll
            for (int ks = 0; ks < KSTEPS; ks++) {
                u32 a[2][4];
#pragma unroll
                for (int mt = 0; mt < 2; mt++) ldsm4(a[mt], at(offA, ROWB, mt * 16, ks * 2) + sbase + oDO);
#pragma unroll
                for (int np = 0; np < 2; np++) {
                    u32 b[4];
                    ldsm4(b, at(offN, ROWB, np * 16, ks * 2) + base + oV);
#pragma unroll
                    for (int mt = 0; mt < 2; mt++) {
                        mma(ds[mt][2 * np], a[mt], b[0], b[1]);
                        mma(ds[mt][2 * np + 1], a[mt], b[2], b[3]);
                    }
                }
            }
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
#pragma unroll
                for (int hf = 0; hf < 2; hf++) {
                    const int rl = a_wm * 32 + mt * 16 + g + hf * 8;
                    const float dl = lds_f32(sD + (st * BWD_BM + rl) * 4);
#pragma unroll
                    for (int j = 0; j < 4; j++) {
                        const float p0 = pa[mt][j][2 * hf], p1 = pa[mt][j][2 * hf + 1];
                        const u32 off = swz(PROWB, rl, a_wn * 4 + j) + t * 4;
                        sts32(base + oP + off, pack_bf16(p0, p1));
                        sts32(base + oDS + off,
                              pack_bf16(p0 * (ds[mt][j][2 * hf] - dl), p1 * (ds[mt][j][2 * hf + 1] - dl)));
                    }
                }
        };
#if DOCS
        // or some row's document starts past the first key (the last valid row's, the latest)
        if (m0 + BWD_BM > SEQ || n0 + BWD_BN > SEQ || (CAUSAL && n0 + BWD_BN - 1 > m0) ||
            (int)lds32(sLo + (st * BWD_BM + min(BWD_BM, SEQ - m0) - 1) * 4) - k_pos > n0)
#else
        if (m0 + BWD_BM > SEQ || n0 + BWD_BN > SEQ || (CAUSAL && n0 + BWD_BN - 1 > m0))
#endif
            phase_a(BoolTag<true>());
        else
            phase_a(BoolTag<false>());
        if (tid == 0) {
            // wait until the previous key block has completed this tile (it runs, or ran, already: see above), and
            // publish that this block has completed the tiles before it
#if DOCS
            // the first key block that sees the tile has no predecessor to wait for: the keys before it are all
            // before the first row's document. Publishing it at a first tile past 0 is true as well (this block has
            // no tile before it), and the next block waits only for tiles this one sees.
            const bool wait = !(n0 == 0 || (int)lds32(sLo + st * BWD_BM * 4) - k_pos >= n0) && lds32(sSeen) <= (u32)it,
                       pub = it > 0 && publish();
#else
            const bool wait = ctaid_y() > 0 && lds32(sSeen) <= (u32)it, pub = it > 0 && publish();
#endif
            if (wait) sts32(sSeen, wait_progress(prog() - 1, (u32)it));
            // acquire for the poll: the previous block's dQ writes of this tile come before ours; release for the
            // store: with the barrier at the top, every warp's dQ writes of the tiles before it are performed first
            if (wait || pub) fence_acq_rel();
            if (pub) st_relaxed(prog(), (u32)it);
        }
        __syncthreads();

        // ---- B: dV += P^T dO, dK += dS^T Q (A operands read transposed from the [row][key] tiles) ----
#pragma unroll
        for (int kk = 0; kk < BWD_BM / 16; kk++) {
            u32 a[2][4];
#pragma unroll
            for (int mt = 0; mt < 2; mt++) ldsm4t(a[mt], at(offPT, PROWB, kk * 16, b_wk * 4 + mt * 2) + base + oP);
#pragma unroll
            for (int dp = 0; dp < BWD_BT / 2; dp++) {
                u32 b[4];
                ldsm4t(b, at(offT, ROWB, kk * 16, b_wd * (CHUNKS / 2) + dp * 2) + sbase + oDO);
#pragma unroll
                for (int mt = 0; mt < 2; mt++) {
                    mma(dv_acc[mt][2 * dp], a[mt], b[0], b[1]);
                    mma(dv_acc[mt][2 * dp + 1], a[mt], b[2], b[3]);
                }
            }
#pragma unroll
            for (int mt = 0; mt < 2; mt++) ldsm4t(a[mt], at(offPT, PROWB, kk * 16, b_wk * 4 + mt * 2) + base + oDS);
#pragma unroll
            for (int dp = 0; dp < BWD_BT / 2; dp++) {
                u32 b[4];
                ldsm4t(b, at(offT, ROWB, kk * 16, b_wd * (CHUNKS / 2) + dp * 2) + sbase + oQ);
#pragma unroll
                for (int mt = 0; mt < 2; mt++) {
                    mma(dk_acc[mt][2 * dp], a[mt], b[0], b[1]);
                    mma(dk_acc[mt][2 * dp + 1], a[mt], b[2], b[3]);
                }
            }
        }

        // ---- C: dQ = dS K, stored (key block 0) or added to what the lower key blocks wrote ----
        float dq[2][BWD_CT][4];
#pragma unroll
        for (int mt = 0; mt < 2; mt++)
#pragma unroll
            for (int j = 0; j < BWD_CT; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) dq[mt][j][e] = 0.f;
#pragma unroll
        for (int kk = 0; kk < BWD_BN / 16; kk++) {
            u32 a[2][4];
#pragma unroll
            for (int mt = 0; mt < 2; mt++) ldsm4(a[mt], at(offS, PROWB, mt * 16, kk * 2) + base + oDS);
#pragma unroll
            for (int dp = 0; dp < BWD_CT / 2; dp++) {
                u32 b[4];
                ldsm4t(b, at(offT, ROWB, kk * 16, c_wd * (CHUNKS / 4) + dp * 2) + base);
#pragma unroll
                for (int mt = 0; mt < 2; mt++) {
                    mma(dq[mt][2 * dp], a[mt], b[0], b[1]);
                    mma(dq[mt][2 * dp + 1], a[mt], b[2], b[3]);
                }
            }
        }
#if DOCS
        // the first key block that sees the tile stores (the wait above)
        const bool stores = n0 == 0 || (int)lds32(sLo + st * BWD_BM * 4) - k_pos >= n0;
#else
        const bool stores = n0 == 0;
#endif
#pragma unroll
        for (int mt = 0; mt < 2; mt++)
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                // the tile's rows and head again from it: nothing derived from them stays live through phase B
                const int ic = (int)opaque((u32)it), mc = ic / GROUP, hc = kvh * GROUP + ic - mc * GROUP;
                const int row = (NM - 1 - mc) * BWD_BM + c_wm * 32 + mt * 16 + g + hf * 8;
                if (row < SEQ) {
                    float *p = dq_ws + ((long long)row * Q_HEADS + hc) * HEAD_DIM + c_wd * (HEAD_DIM / 4) + 2 * t;
                    if (stores) {
#pragma unroll
                        for (int j = 0; j < BWD_CT; j++) {
                            float2 w;
                            w.x = dq[mt][j][2 * hf], w.y = dq[mt][j][2 * hf + 1];
                            *(float2 *)(p + j * 8) = w;
                        }
                    } else {
#pragma unroll
                        for (int j = 0; j < BWD_CT; j++) red_add2(p + j * 8, dq[mt][j][2 * hf], dq[mt][j][2 * hf + 1]);
                    }
                }
            }
    }

    if (publish()) {
        __syncthreads();
        if (tid == 0) {
            fence_acq_rel();
            st_relaxed(prog(), (u32)niters); // every tile of this block is complete
        }
    }
#if DOCS
    cp_async_wait_all(); // with no tile at all, the K, V copies are still in flight
    if (ctaid_y() + 1 == (u32)NKB) {
        // the query blocks past this block's last tile see no key of the launch (the last key block sees the most):
        // their dQ rows of this KV head's query heads (GROUP * HEAD_DIM floats, contiguous in a row) are zeros
        const int qe = doc_end[k_pos + SEQ - 1] - q_pos, r0 = qe <= 0 ? 0 : min((qe - 1) / BWD_BM + 1, NM) * BWD_BM;
        constexpr int RQ = GROUP * HEAD_DIM / 4; // float4 per row
        for (long long i = tid; i < (long long)(SEQ - r0) * RQ; i += BWD_THREADS) {
            const long long rr = i / RQ, c = i - rr * RQ;
            *(float4 *)(dq_ws + ((r0 + rr) * Q_HEADS + kvh * GROUP) * HEAD_DIM + c * 4) =
                make_float4(0.f, 0.f, 0.f, 0.f);
        }
    }
#endif

    // dK carries the softmax scale that S = scale q k^T puts on it; dV does not
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            const int key = n0 + b_wk * 32 + mt * 16 + g + hf * 8;
            if (key >= SEQ) continue;
            const long long base = ((long long)key * KV_HEADS + kvh) * HEAD_DIM + b_wd * (HEAD_DIM / 2) + 2 * t;
#pragma unroll
            for (int j = 0; j < BWD_BT; j++) {
                const float k0 = dk_acc[mt][j][2 * hf] * SOFTMAX_SCALE, k1 = dk_acc[mt][j][2 * hf + 1] * SOFTMAX_SCALE;
                const float v0 = dv_acc[mt][j][2 * hf], v1 = dv_acc[mt][j][2 * hf + 1];
#if DKV_ACCUM
                float2 *pk = (float2 *)(dk + base + j * 8), *pv = (float2 *)(dv + base + j * 8);
                float2 x = *pk, y = *pv;
                x.x += k0, x.y += k1, y.x += v0, y.y += v1;
                *pk = x, *pv = y;
#else
                *(u32 *)(dk + base + j * 8) = pack_bf16(k0, k1);
                *(u32 *)(dv + base + j * 8) = pack_bf16(v0, v1);
#endif
            }
        }
}

// dq = bf16(scale * dq_ws), eight elements per thread per step.
#define DQ_BOUNDS __launch_bounds__(256)
extern "C" __global__ void DQ_BOUNDS
attention_bwd_dq_d{{HEAD_DIM}}_q{{Q_HEADS}}_kv{{KV_HEADS}}_s{{SEQ}}_c{{CAUSAL}}_a{{DKV_ACCUM}}_dqa{{DQ_ATOMIC}}{{DOCS_TAG}}(
    const float *__restrict__ dq_ws, bf16 *__restrict__ dq) {
    const long long n8 = (long long)SEQ * Q_HEADS * HEAD_DIM / 8;
    for (long long i = (long long)blockIdx.x * 256 + threadIdx.x; i < n8; i += (long long)gridDim.x * 256) {
        const float4 a = ((const float4 *)dq_ws)[2 * i], b = ((const float4 *)dq_ws)[2 * i + 1];
        const float s = SOFTMAX_SCALE;
        uint4 r;
        r.x = pack_bf16(a.x * s, a.y * s);
        r.y = pack_bf16(a.z * s, a.w * s);
        r.z = pack_bf16(b.x * s, b.y * s);
        r.w = pack_bf16(b.z * s, b.w * s);
        ((uint4 *)dq)[i] = r;
    }
}

#include "sm90.cuh"
#include "attention_sm90.cuh"
#include "attention_bwd_sm90.cuh"

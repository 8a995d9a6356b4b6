// fp8_amax.cuh: a kernel that writes a tensor an FP8 GEMM reads (train.precision = "fp8") also takes its amax, so
// that no separate pass reads the tensor again for it. The kernel keeps the largest |x| it stores per thread (as
// stored: the bf16-rounded value) and hands it to fp8_amax_commit at its end, which fills the operand's scale slot
// (gen/plan_fp8.c's fp8_state; CP_FP8_SLOT_BYTES = 4224 bytes, float words):
//   [0] amax / fmax (the GEMM's scale), [1] fmax / amax (the cast's), [2] amax; amax 0 gives scales of 1;
//   [4] the groups of blocks done; from word 32, FP8_AMAX_GROUPS groups 128 bytes apart, each [0] its blocks' running
//   maximum (the bits of a float >= 0) and [1] its blocks done. All of [4] on are 0 before the kernel, and left 0.
// Block b commits into group b % FP8_AMAX_GROUPS: a producer of 65536 blocks would otherwise put 131072 atomics on
// one address, which the L2 takes one at a time (measured: rmsnorm's forward at 65536 x 4096 went from 261 to 334
// us); spread over 32 lines they cost next to nothing. The last block of a group counts the group done, and the last
// group's last block takes the maximum of the groups, writes the scales and clears the counts.
// fmax is the FP8 type's largest finite value (448 E4M3, 57344 E5M2). Like templates/fp8.cu's amax, a NaN is
// passed over (fmaxf) and infinity kept. The maximum is exact whatever the order, so the slot holds the same bits as
// that separate pass would write.
#pragma once

#define FP8_AMAX_GROUPS 32
#define FP8_AMAX_GROUP_WORDS 32 // 128 bytes: a group a line of its own

// The scales of a slot from its tensor's amax a: the one formula of both ways of taking it (a pass of its own,
// templates/fp8.cu, or the producer), so that they agree bit for bit
__device__ __forceinline__ void fp8_scales(float *slot, float a, float fmax) {
    slot[0] = a > 0.0f ? a / fmax : 1.0f;
    slot[1] = a > 0.0f ? fmax / a : 1.0f;
    slot[2] = a;
}

// Every thread of the block calls it, once, after its stores; m >= 0. A slot of NULL does nothing.
__device__ __forceinline__ void fp8_amax_commit(float m, float *slot, float fmax) {
    if (!slot) return;
    __shared__ float fp8_warp_max[32];
    __syncthreads(); // a second call in one kernel: thread 0 has read the first's maxima
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    const unsigned warps = (blockDim.x * blockDim.y * blockDim.z + 31) / 32;
    const unsigned t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    if ((t & 31) == 0) fp8_warp_max[t >> 5] = m;
    __syncthreads();
    if (t != 0) return;
    for (unsigned w = 1; w < warps; w++) m = fmaxf(m, fp8_warp_max[w]);
    const unsigned blocks = gridDim.x * gridDim.y * gridDim.z;
    const unsigned b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    const unsigned groups = blocks < FP8_AMAX_GROUPS ? blocks : FP8_AMAX_GROUPS, g = b % groups;
    unsigned *group = reinterpret_cast<unsigned *>(slot + FP8_AMAX_GROUP_WORDS * (1 + g));
    atomicMax(group, __float_as_uint(m)); // non-negative floats order as their bits do
    __threadfence();
    if (atomicAdd(group + 1, 1u) != blocks / groups + (g < blocks % groups) - 1) return;
    __threadfence();
    unsigned *done = reinterpret_cast<unsigned *>(slot + 4);
    if (atomicAdd(done, 1u) != groups - 1) return;
    __threadfence(); // every group's maximum is in: the last one finishes
    float a = 0.0f;
    for (unsigned k = 0; k < groups; k++) {
        unsigned *gk = reinterpret_cast<unsigned *>(slot + FP8_AMAX_GROUP_WORDS * (1 + k));
        a = fmaxf(a, __uint_as_float(atomicExch(gk, 0u)));
        gk[1] = 0u;
    }
    fp8_scales(slot, a, fmax);
    *done = 0u;
}

// fp8_amax.cuh: a kernel that writes a tensor an FP8 GEMM reads (train.precision = "fp8") also takes its amax, so
// that no separate pass reads the tensor again for it. The kernel keeps the largest |x| it stores per thread (as
// stored: the bf16-rounded value) and hands it to fp8_amax_commit at its end, which fills the operand's scale slot
// (gen/plan_fp8.c's fp8_state; float words):
//   [0] amax / fmax (the GEMM's scale), [1] fmax / amax (the cast's), [2] amax; amax 0 gives scales of 1;
//   [4] the running maximum's bits and [5] the blocks done: 0 before the kernel, and left 0.
// fmax is the FP8 type's largest finite value (448 E4M3, 57344 E5M2). Like templates/fp8.cu's amax, a NaN is
// passed over (fmaxf) and infinity kept. The maximum is exact whatever the order, so the slot holds the same bits as
// that separate pass would write.
#pragma once

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
    unsigned *acc = reinterpret_cast<unsigned *>(slot + 4), *done = reinterpret_cast<unsigned *>(slot + 5);
    atomicMax(acc, __float_as_uint(m)); // non-negative floats order as their bits do
    __threadfence();
    const unsigned blocks = gridDim.x * gridDim.y * gridDim.z;
    if (atomicAdd(done, 1u) != blocks - 1) return;
    __threadfence();
    // every block's maximum is in: the last one finishes
    fp8_scales(slot, __uint_as_float(atomicExch(acc, 0u)), fmax);
    *done = 0u;
}

// row_pipe.cuh: the rows ahead of a persistent row kernel (rmsnorm.cu's and swiglu.cu's _row entries) in flight in
// shared memory. A block takes a row at a time and reduces over it (its maximum, for the row-scaled FP8 copy), so with
// its loads in registers a block had one row's bytes in flight, and not across its barriers: the memory ran at
// 2.2-3.1 TB/s where the same kernels without the copy ran near 4. Here each thread copies its own 16-byte vectors of
// the next STAGES - 1 rows with cp.async and later reads back only those: cp.async.wait_group makes a thread's own
// copies visible to it, so the pipe needs no barrier of its own. Dynamic shared memory [stage][word][thread]
// (consecutive threads take consecutive 16 bytes), STAGES * WORDS * THREADS * 16 bytes of it, which the launch gives
// (gen/kernels.c's row_pipe_bytes).
#pragma once

template <int STAGES, int WORDS, int THREADS> struct row_pipe {
    static_assert(STAGES >= 2, "a row ahead at least");

    static __device__ __forceinline__ uint4 *slot(int stage, int word) {
        extern __shared__ uint4 row_pipe_words[];
        return row_pipe_words + (stage * WORDS + word) * THREADS + threadIdx.x;
    }
    // The thread's vector `word` of a stage from src (16 bytes, aligned); with !ok nothing is read and the slot is
    // zeroed (a row past the end: its values are reduced over but never stored)
    static __device__ __forceinline__ void load(int stage, int word, const void *src, bool ok) {
        const unsigned dst = (unsigned)__cvta_generic_to_shared(slot(stage, word));
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(ok ? 16 : 0)
                     : "memory");
    }
    // Closes the copies of one stage (a group, empty or not, every time: wait counts groups)
    static __device__ __forceinline__ void commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
    // The oldest stage's copies done, the STAGES - 1 younger ones still in flight
    static __device__ __forceinline__ void wait() {
        asm volatile("cp.async.wait_group %0;\n" ::"n"(STAGES - 1) : "memory");
    }
    static __device__ __forceinline__ void drain() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }
    template <class T> static __device__ __forceinline__ T get(int stage, int word) {
        static_assert(sizeof(T) == 16, "16-byte words");
        const uint4 w = *slot(stage, word);
        return *reinterpret_cast<const T *>(&w);
    }

    // The rows first, first + step, ... below n through the pipe: load(stage, r) issues the thread's copies of
    // iteration row r (and commits nothing), body(stage, r) consumes them. Every thread of the block runs every
    // iteration. A stage is written again one iteration after body read it, by the thread that read it: body's reads
    // are in registers before the next copy is issued.
    template <class Load, class Body>
    static __device__ __forceinline__ void run(long long first, long long step, long long n, Load load, Body body) {
#pragma unroll
        for (int s = 0; s < STAGES - 1; s++) {
            load(s, first + s * step);
            commit();
        }
        int stage = 0;
        for (long long r = first; r < n; r += step) {
            load(stage == 0 ? STAGES - 1 : stage - 1, r + (STAGES - 1) * step);
            commit();
            wait();
            body(stage, r);
            stage = stage == STAGES - 1 ? 0 : stage + 1;
        }
        drain();
    }
};

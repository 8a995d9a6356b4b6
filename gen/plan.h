/* plan.h: the plan of one training step for one rank: a flat program of steps over named buffers, with every
 * buffer's size, lifetime and arena offset. The runtime executes it; `cpgen plan` prints it. */
#ifndef CP_PLAN_H
#define CP_PLAN_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "emit.h"
#include "kernels.h"
#include "ranks.h"
#include "spec.h"

#define CP_ARENA_ALIGN 256
#define CP_MAX_OPERANDS 12
#define CP_MAX_STAGE_HEADS 128 /* query heads per GPU in one stage (plain Ulysses of a 128-head model) */
#define CP_HOST_CHUNK (64LL << 20) /* elements per chunk of the host optimizer's rings (256 MiB of fp32) */
#define CP_GEMM_WORKSPACE (32 << 20) /* cuBLASLt workspace, bytes */

typedef enum { CP_SPACE_GPU, CP_SPACE_HOST } cp_space;

/* Where a training checkpoint's snapshot goes (train.save_every > 0): the fp32 master weights and both AdamW moments
 * of the whole model, copied into host memory on the rank that writes (the run's rank 0) so that the files are
 * written while training goes on (runtime/ckpt_async.c). */
typedef enum {
    CP_SNAP_NONE,     /* no checkpoints (train.save_every = 0) */
    CP_SNAP_PINNED,   /* pinned host memory: the GPU copies into it directly */
    CP_SNAP_PAGEABLE, /* pageable memory: filled through a small pinned staging buffer (one GPU), by the gathers
                       * (several), or by a memcpy of the host optimizer's state (one GPU, optimizer on the host) */
    CP_SNAP_IN_PLACE, /* none: one GPU with the optimizer on the host and no room for a copy (or train.async_save =
                       * false), so the state is written where it is while the loop waits */
} cp_snap_kind;
#define CP_SNAP_STAGING (64LL << 20) /* pinned bytes a pageable snapshot from the GPU passes through */

/* What a buffer holds, for the memory breakdown. */
typedef enum {
    CP_CAT_PARAMS,      /* bf16 parameter shard */
    CP_CAT_MASTER,      /* fp32 master weights shard */
    CP_CAT_OPTIM,       /* AdamW moments shard */
    CP_CAT_GRADS,       /* fp32 gradient shard */
    CP_CAT_GATHERED,    /* all-gathered bf16 weights of the layer in use (and the next, prefetched) */
    CP_CAT_UNIT_GRADS,  /* full fp32 gradients of the layer in backward, before reduce-scatter */
    CP_CAT_CKPT,        /* checkpointed layer inputs */
    CP_CAT_ATTN_SAVED,  /* attention outputs and LSE kept across layers for the backward, and their GPU staging */
    CP_CAT_ACT,         /* per-layer activations: norms, residual, projection outputs */
    CP_CAT_ATTN,        /* attention working set of one UPipe stage */
    CP_CAT_ATTN_KEPT,   /* attention output, log-sum-exp and delta of the layer being recomputed */
    CP_CAT_MLP,         /* MLP tile */
    CP_CAT_LOSS,        /* LM-head / loss tile */
    CP_CAT_COMM,        /* all-to-all send/receive staging */
    CP_CAT_RING,        /* ring attention: K/V blocks received, the merged output, the travelling dK, dV */
    CP_CAT_FP8,         /* FP8 copies of a GEMM's inputs and their scales (train.precision = "fp8") */
    CP_CAT_WORKSPACE,   /* tokens, targets, scalars, GEMM workspace */
    CP_CAT_COUNT
} cp_cat;

typedef struct {
    int start, end; /* step indices, inclusive */
} cp_interval;

typedef struct {
    char name[48];
    cp_space space;
    cp_cat cat;
    int64_t bytes;
    bool persistent;   /* live for the whole step (parameters, optimizer state, host checkpoints) */
    int64_t offset;    /* in its arena, assigned by the memory planner */
    int nlive, caplive;
    cp_interval *live; /* disjoint, sorted */
} cp_buffer;

typedef enum {
    CP_OP_KERNEL,         /* launch module.entry */
    CP_OP_GEMM,           /* cuBLASLt: D = alpha * op(A) op(B) + beta * C */
    CP_OP_ALLTOALL,       /* equal blocks to every rank */
    CP_OP_ALLGATHER,
    CP_OP_REDUCE_SCATTER,
    CP_OP_ALLREDUCE,
    CP_OP_COPY_D2H,
    CP_OP_COPY_H2D,
    CP_OP_MEMSET,
    CP_OP_SENDRECV,       /* ring attention: operand 0 (read) goes to the ring's next rank while operand 1 (written
                           * whole) arrives from its previous one, `count` bytes each way, comm CP_COMM_RING */
    CP_OP_COUNT
} cp_opkind;

typedef enum { CP_PHASE_FWD, CP_PHASE_RECOMPUTE, CP_PHASE_BWD, CP_PHASE_OPTIM, CP_PHASE_COUNT } cp_phase;
typedef enum { CP_STREAM_COMPUTE, CP_STREAM_COMM, CP_STREAM_COPY, CP_STREAM_COUNT } cp_stream;
/* CP_WRITE on the whole extent of a buffer starts a new lifetime; CP_DEF marks a partial write (a stage's
 * columns, a tile's rows) whose buffer held nothing live before it. A read with nothing live is a planner bug. */
enum { CP_READ = 1, CP_WRITE = 2, CP_RW = 3, CP_DEF = 6 };

typedef struct {
    int buf;
    int64_t offset; /* bytes into the buffer (a stage's columns, a tile's rows) */
    int64_t bytes;  /* extent touched */
    int64_t stride; /* a tile's rows: bytes the offset moves from one tile to the next (cp_loop), else 0 */
    int access;     /* CP_READ, CP_WRITE (whole extent overwritten), CP_RW */
} cp_operand;

/* A folded run of identical tiles (MLP and loss tiles, whose number grows with the sequence): the first and last
 * tiles of the run are steps of their own and the ones between are one copy of their steps, the body, which stands
 * for `count` tiles; each repeat moves every operand by its stride and the step's tile by one. The first and last
 * are kept so that every tile the body stands for sees the same lifetimes around it: what is live at a body step is
 * live at that step of every tile it stands for, so lifetimes, packing and the live peak of the folded program are
 * those of the flat one (cp_plan_unfold). */
typedef struct {
    int first, nsteps; /* the body: steps [first, first + nsteps) */
    int64_t count;     /* tiles it stands for, at least 2 */
} cp_loop;

/* A GEMM input's element type: bf16, or FP8 (E4M3 for weights and activations, E5M2's wider range for gradients)
 * read as scale x value with fp32 scales (cp_gemm_scale). */
typedef enum { CP_GEMM_BF16 = 0, CP_GEMM_E4M3, CP_GEMM_E5M2 } cp_gemm_type;
/* How an FP8 input's scales cover it: one for the tensor; one per row and 128 elements of k (cuBLASLt's VEC128_32F:
 * f32 [k / 128][rows], rows contiguous); one per 128 x 128 tile (BLK128x128_32F: f32 [rows / 128][ld4], ld4 the k
 * blocks rounded up to a multiple of 4); one per row over the whole of k (OUTER_VEC_32F: f32 [rows], applied to the
 * product's row or column after the sums, so the GEMM runs at the per-tensor rate). */
typedef enum { CP_GEMM_SCALE_TENSOR = 0, CP_GEMM_SCALE_1D, CP_GEMM_SCALE_2D, CP_GEMM_SCALE_ROW } cp_gemm_scale;
/* The f32 scales of an FP8 input [rows][k] scaled as `scale` (cp_gemm_scale) */
static inline int64_t cp_fp8_scales(int scale, int64_t rows, int64_t k) {
    int64_t kb = (k + 127) / 128;
    switch (scale) {
    case CP_GEMM_SCALE_1D: return rows * kb;
    case CP_GEMM_SCALE_2D: return (rows + 127) / 128 * ((kb + 3) / 4 * 4);
    case CP_GEMM_SCALE_ROW: return rows;
    default: return 1;
    }
}
/* A cast of one weight [rows][cols] of every layer at once (cp_fp8_copy.layers): each copy buffer holds the layers'
 * copies from its start, then from the next 256 bytes each layer's scales (with row scales a transposed copy's with
 * its column maxima behind), cp_fp8_layers_pitch floats apart; layers = 1 is any single copy's layout */
static inline int64_t cp_fp8_layers_scales_off(int64_t layers, int64_t rows, int64_t cols) {
    return (layers * rows * cols + 255) / 256 * 256;
}
static inline int64_t cp_fp8_layers_pitch(int scale, int64_t rows, int64_t cols, bool transposed) {
    int64_t n = transposed ? cp_fp8_scales(scale, cols, rows) : cp_fp8_scales(scale, rows, cols);
    if (scale == CP_GEMM_SCALE_ROW && transposed) n += cp_fp8_row_parts(rows, cols); /* the maxima behind */
    return (n + 3) / 4 * 4; /* 16 bytes, as cuBLASLt reads a scale vector */
}

/* Row-major: D[m][n] = op(A)[m][k] op(B)[k][n] (+ C). A is stored [m][k], or [k][m] when trans_a; B is stored
 * [k][n], or [n][k] when trans_b (a weight W[out][in] used as x W^T). ld* are row strides in elements.
 * Operands in the step: A, B, then C when has_c, then D. With accumulate, D += op(A) op(B) (C is D). */
typedef struct {
    int64_t m, n, k;
    int64_t lda, ldb, ldd;
    bool trans_a, trans_b;
    bool has_c;           /* D = AB + C with C a separate bf16 input (residual add in the epilogue) */
    bool accumulate;      /* D += AB */
    bool out_f32;         /* D in fp32 (weight gradients), else bf16 */
    bool a_grad;          /* A is a gradient, the backward's dY (or its transpose) */
    bool w_grad;          /* D is a weight's gradient, dW = dY^T X summed over the tokens (A the transposed dY) */
    /* FP8 inputs (both or neither; not both E5M2): Hopper's FP8 tensor cores take only the x W^T form (A [m][k],
     * B [n][k]: trans_b and not trans_a), k and the leading dimensions multiples of 16 */
    uint8_t a_type, b_type; /* cp_gemm_type */
    bool fast_accum;        /* FP8: accumulate in the tensor cores' own precision, without cuBLASLt's periodic
                             * promotion to fp32 (faster, less exact); not with block scales, which that promotion
                             * applies */
    uint8_t a_scale, b_scale; /* FP8: cp_gemm_scale of each input (block scales: k a multiple of 128, not both 2D) */
} cp_gemm;

/* The module of templates/gemm_fp8.cu for GEMM p: true with k filled when the kernel takes p (the x W^T form on FP8
 * inputs with block scales, A's per 1 x 128, B's per 1 x 128 or 128 x 128; A and B dense; m a multiple of 4, so that
 * a row of A's scales is 16-byte aligned; n and k multiples of 128; no fast accumulation; D written (bf16, or with
 * C) or added to (bf16 or fp32)), else false. cfg as cp_k_gemm_fp8 takes it; consumers 0 outside clusters of 2:
 * cp_gemm_fp8_consumers for p's rows on an H200's CP_GEMM_FP8_SMS (gen/plan_fp8.c). */
bool cp_gemm_fp8_kspec(const cp_gemm *p, cp_gemm_fp8_cfg cfg, cp_kernel_spec *k);
/* The consumer warpgroups (2 or 3) the kernel runs fastest with for m x n outputs on sms SMs. */
#define CP_GEMM_FP8_SMS 132
int cp_gemm_fp8_consumers(int64_t m, int64_t n, int sms);

/* Element offsets of one layer's weights inside its flat unit (the layout FSDP shards and gathers). */
typedef enum { CP_W_Q, CP_W_K, CP_W_V, CP_W_O, CP_W_GATE, CP_W_UP, CP_W_DOWN, CP_W_NORM1, CP_W_NORM2, CP_W_QNORM,
               CP_W_KNORM, CP_W_COUNT } cp_weight;
typedef struct {
    int64_t off[CP_W_COUNT], size[CP_W_COUNT];
    int64_t total;   /* elements */
    int64_t padded;  /* rounded up so each rank's shard is a whole number of 128-byte lines */
} cp_layer_layout;

/* What a step computes, where the executor must know it (runtime/exec_args.c prepares each by its task, and
 * tests/test_exec.c checks that it knows every one): the kernel steps, and the two steps the runtime does itself
 * (AdamW on the host, the tokens staged for a micro-batch). The planner names steps only through these, so a task
 * renamed on one side fails to compile instead of failing at run time. X(TASK, label) */
#define CP_TASKS(X)                                                                                                \
    X(EMBED, "embed") X(EMBED_BWD, "embed_bwd") X(NORM1, "norm1") X(NORM2, "norm2") X(FINAL_NORM, "final_norm")     \
    X(Q_NORM, "q_norm") X(K_NORM, "k_norm") X(NORM1_BWD, "norm1_bwd") X(NORM2_BWD, "norm2_bwd")                     \
    X(FINAL_NORM_BWD, "final_norm_bwd") X(QK_NORM_BWD, "qk_norm_bwd") X(ROPE_Q, "rope_q") X(ROPE_K, "rope_k")      \
    X(ROPE_DQ, "rope_dq") X(ROPE_DK, "rope_dk") X(ATTN_FWD, "attn_fwd") X(ATTN_BWD, "attn_bwd")                     \
    X(ATTN_BWD_DQ, "attn_bwd_dq") X(ATTN_FWD_HALF, "attn_fwd_half") X(ATTN_BWD_HALF, "attn_bwd_half")               \
    X(ATTN_MERGE_INIT, "attn_merge_init") X(ATTN_MERGE, "attn_merge") X(CAST_O, "cast_o")                           \
    X(RING_ADD_DQ, "ring_add_dq") X(RING_ADD_DKV, "ring_add_dkv") X(UNPACK_O, "unpack_o") X(PACK_DO, "pack_do")     \
    X(PACK_DELTA, "pack_delta") X(PACK_Q, "pack_q") X(PACK_K, "pack_k") X(PACK_V, "pack_v")                         \
    X(UNPACK_DQ, "unpack_dq") X(UNPACK_DK, "unpack_dk") X(UNPACK_DV, "unpack_dv") X(GRAD_ACCUM, "grad_accum")       \
    X(SWIGLU, "swiglu") X(SWIGLU_BWD, "swiglu_bwd") X(LOSS, "loss") X(LOSS_SUM, "loss_sum")                         \
    X(ATTN_DELTA, "attn_delta") X(CAST_DK, "cast_dk") X(CAST_DV, "cast_dv") X(GRAD_NORM, "grad_norm")               \
    X(ADAMW, "adamw") X(ADAMW_HOST, "adamw_host") X(LOAD_TOKENS, "load_tokens") X(FP8_AMAX, "fp8_amax")          \
    X(FP8_CAST, "fp8_cast") X(FP8_CAST_BLOCK, "fp8_cast_block")
#define CP_TASK_ENUM(t, label) CP_TASK_##t,
typedef enum { CP_TASK_NONE, CP_TASKS(CP_TASK_ENUM) CP_TASK_COUNT } cp_task;
#undef CP_TASK_ENUM
/* The task's label ("norm1"), the step's `what`; "" for CP_TASK_NONE. */
const char *cp_task_name(cp_task t);

/* A kernel's own FP8 work on one of its outputs (cp_step.fp8_out), done as it writes the output instead of by a pass
 * of its own over it: the output's amax into a scale slot (one scale per tensor), or its FP8 copy with 1 x 128 block
 * scales (block scales) or with a scale per row (row scales), then maybe also the column maxima of the transposed
 * copy a cast makes later (a row of them per CP_FP8_ROW_CHUNK rows behind that copy's scales, zeroed before), or
 * those maxima alone (a row-scaled tensor only read transposed) */
typedef enum {
    CP_FP8_OUT_AMAX,   /* slot: the scale slot's operand */
    CP_FP8_OUT_COPY,   /* slot, scales: the copy's operand and its scales'; col_max: with row scales, or -1 */
    CP_FP8_OUT_MAXIMA, /* col_max alone (row scales) */
} cp_fp8_out_kind;
typedef struct {
    uint8_t kind;   /* cp_fp8_out_kind */
    int8_t out;     /* the output's operand */
    int8_t slot;    /* the scale slot's operand (AMAX), or the copy's (COPY); else -1 */
    int8_t scales;  /* a copy's scales' operand (COPY); else -1 */
    int8_t col_max; /* the transposed copy's column maxima's operand (a row-scaled COPY's, MAXIMA), or -1 */
    uint8_t fmt;    /* cp_gemm_type of the GEMM that reads it */
    uint8_t scale;  /* a copy's or the maxima's cp_gemm_scale: CP_GEMM_SCALE_1D or CP_GEMM_SCALE_ROW */
    bool copy_only; /* a COPY of an output no later step reads (the forward's normed input and SwiGLU output, which
                     * the backward recomputes): the kernel writes the copy alone and the output not at all */
} cp_step_fp8_out;

/* The FP8 copy an amax measures for, or a cast writes (gen/plan_fp8.c): the executor checks a cast's geometry by it */
typedef struct {
    uint8_t fmt;     /* cp_gemm_type: E4M3 or E5M2 */
    uint8_t scale;   /* cp_gemm_scale: one per tensor (a scale slot), or blocks of 1 x 128 or 128 x 128 (behind it) */
    bool transposed; /* the copy is the source transposed, [cols][rows] */
    bool both;       /* a 1 x 128 cast that writes the copy [rows][cols] and the transposed copy from one read */
    bool maxima;     /* a transposed row-scaled copy whose column maxima the source's producer left (cp_step_fp8_out) */
    bool from_rows;  /* and cast from the row copy that producer wrote and its scales, not from the source; with
                      * both (row scales), the transposed copy cast from the row copy the same step wrote */
    uint16_t layers; /* > 1: both copies (row scales: from_rows; or 128 x 128 tiles) of one weight of this many
                      * layers at once, the sources src_stride elements apart; each layer's copy a slice of the copy
                      * buffers (cp_fp8_layers_scales_off) */
    int64_t src_stride;
} cp_fp8_copy;

typedef struct {
    cp_opkind kind;
    cp_task task;         /* what it computes, where the executor must know (GEMMs, collectives: NONE) */
    cp_phase phase;
    cp_stream stream;
    int layer;            /* -1 outside layers */
    int stage, tile;      /* -1 when not applicable */
    int module;           /* CP_OP_KERNEL: index into plan->modules */
    char role[32];        /* CP_OP_KERNEL: entry role, e.g. "fwd" */
    char what[40];        /* short label: "q_proj", "attn_fwd", "a2a_q" */
    int nops;
    cp_operand ops[CP_MAX_OPERANDS];
    cp_gemm gemm;
    int64_t count;        /* kernels: rows (tokens) or elements; copies and collectives: bytes */
    int64_t heads;        /* kernels over [rows][heads][head_dim] (rope, qk-norm, attn_delta): heads per row; FP8
                           * casts: the source's columns (count its rows) */
    int64_t ld;           /* FP8 casts: the source's row stride in elements; 0 elsewhere */
    double flops, bytes;  /* work done, for the cost model */
    double seconds;       /* predicted by the cost model */
    cp_comm_kind comm;    /* collectives: the communicator (the Ulysses group unless said) */
    /* Ring attention (parallel.ring > 1). One plan serves every ring position; what depends on the position (which
     * half blocks a launch takes, where a rank's RoPE positions start) the executor finds from its position with
     * gen/ring.h, and such a step's operands cover what any position touches. */
    int ring_step;        /* the ring step k (0 .. ring - 1) whose K/V block a step sends, attends to or merges; -1 */
    int ring_part;        /* a step k > 0's half-block launch (cp_ring_half_of) its attention, merge or dQ sum
                           * belongs to, or step 0's with documents (CP_RING_STEP0_PARTS); a RoPE launch's run
                           * (cp_ring_rope_runs); -1 */
    int64_t lse_stride;   /* attention and merges of a ring: the row stride of their LSE operand in elements (the
                           * group's tokens, whatever the launch's SEQ); 0 elsewhere (the module's SEQ) */
    bool last_micro;      /* runs in the last micro-batch only: the all-reduce of gradients accumulated over them */
    /* train.precision = "fp8" (plan_fp8.c): a kernel that writes a tensor an FP8 GEMM reads (rmsnorm, SwiGLU) also
     * takes its amax or writes its FP8 copy, instead of a pass of its own; the operands these take follow the
     * kernel's own (one for an amax's slot, two for a copy and its scales); nfp8_out of them */
    uint8_t nfp8_out;
    cp_step_fp8_out fp8_out[2];
    cp_fp8_copy fp8; /* FP8 amaxes and casts (CP_TASK_FP8_*): the copy, whose layout also names the kernel (role) */
} cp_step;

/* One UPipe stage for one rank. */
typedef struct {
    int q_first;      /* first query head (in model numbering) held by this rank in this stage; q_count follow
                         contiguously in the planner's storage order, see q_heads */
    int q_heads[CP_MAX_STAGE_HEADS];  /* model query-head numbers, u per rank */
    int kv_heads[CP_MAX_STAGE_HEADS]; /* model KV-head numbers held by this rank */
    int nq, nkv;
    bool kv_fresh;    /* K and V are projected and sent in this stage (first stage of a GQA group) */
    bool kv_last;     /* dK and dV are sent back after this stage (last stage of the group) */
} cp_stage_rank;

/* The variant a module with variants (kernels.h cp_kvariants) runs, and where that choice came from (gen/ktune.h). */
typedef enum { CP_KVAR_DEFAULT, CP_KVAR_CACHE, CP_KVAR_BUNDLE } cp_kvar_source;
typedef struct {
    int module;            /* index into modules */
    int value;             /* the variant it runs */
    cp_kvar_source source;
    char note[200];        /* where it came from, or why it is the default, for the plan's output */
} cp_kchoice;

typedef struct {
    cp_spec spec;
    int C;                 /* ranks of the Ulysses/FSDP group */
    int replicas, ring;    /* R groups with their own sequences, P groups per sequence: R * P * C ranks in all */
    int64_t S, T;          /* tokens of a sequence / per rank */
    int64_t group_tokens;  /* a group's share of the sequence, S / ring: the length of the head layout */
    int U, nstages;        /* heads per stage, stages per layer */
    int u;                 /* query heads per rank per stage */
    int kvr;               /* KV heads per rank per stage */
    int repl;              /* ranks holding each KV head (KV heads < GPUs), else 1 */
    int group_len;         /* consecutive stages sharing one K,V */
    int64_t mlp_tile, loss_tile;
    int ckpt_host_layers;  /* layers whose checkpoint lives in host memory (the first ones) */
    int64_t host_chunk;    /* optimizer on the host: elements per pinned chunk of its gradient/parameter rings */
    int attn_host_layers;  /* layers keeping their attention output and LSE in host memory (the first ones) */
    int attn_gpu_layers;   /* layers keeping them on the GPU (the next ones); the rest recompute attention */
    int ckpt_every;        /* k: the inputs of layers 0, k, 2k... are kept, the k - 1 between recomputed in the
                            * backward (k > 1: every checkpoint on the GPU) */
    bool fp8_weights_once; /* FP8 with row or block scales, weights not gathered: each weight of every layer cast
                            * both ways once a micro-batch, at the program's start, and its copies kept
                            * (gen/plan_fp8.c); the memory's choice (fill_memory) */
    int64_t fp8_weights_bytes; /* those copies and their scales */
    bool opt_on_host;
    bool docs;             /* packed documents masked (data.documents = "mask"): each micro-batch's inputs carry the
                            * sequence's doc_start and doc_end (int32 [S]), and attention keeps only the scores within
                            * a document (templates/attention.cu, DOCS) */
    double attn_work;      /* the fraction of causal attention's work the step is predicted to do: with docs and
                            * data.doc_len, documents of that length (gen/doc_work.h); else 1 (one document) */
    bool doc_positions;    /* RoPE positions restart at each document (data.positions = "document"): the inputs carry
                            * each of the rank's rows' position (int32 [T]), which rope reads (POS_ARRAY) */
    cp_stage_rank *stages; /* [nstages * C], index s * C + r */

    int nbufs, capbufs;
    cp_buffer *bufs;
    int nsteps, capsteps;
    cp_step *steps;        /* one micro-batch: steps [0, micro_steps), repeated micro_batches times; then the
                              optimizer */
    int micro_steps;
    int nloops, caploops;
    cp_loop *loops;        /* a folded plan's runs of tiles, in step order; none in a flat plan (cp_plan_unfold) */
    int nmodules, capmodules;
    cp_kernel_spec *modules;
    int nkchoices;
    cp_kchoice *kchoices;  /* the variant of each module that has variants, once cp_ktune_apply or
                              cp_ktune_apply_bundle chose them; none before (every module its default) */

    /* results */
    cp_layer_layout layout;                           /* of every transformer layer */
    int nunits;                                       /* 0 embedding, 1..L layers, L+1 final norm (+ LM head) */
    int64_t *unit_elems, *unit_padded, *unit_shard_off; /* elements; shard_off: into this rank's shard */
    int64_t params_total, params_layer, params_shard; /* shard: elements held by one rank */
    int64_t gpu_arena, host_arena;                    /* bytes, after lifetime-aware packing */
    int64_t host_load;  /* host bytes per process while the weights load (fp32, freed before step 1) */
    int64_t host_peak;  /* host bytes per process: host_arena + host_load + machine.host_reserve */
    int64_t host_run;   /* host bytes a process adds once steps run: host_arena + machine.host_runtime */
    int64_t gpu_peak;                                 /* gpu_arena + cp_plan_reserve */
    cp_snap_kind ckpt_snap;  /* a checkpoint's snapshot (cp_snap_kind), on the writing rank only */
    int ckpt_slots;          /* snapshots that may be in flight at once (1 or 2; 0 without arrays): with 2 a save takes
                              * the free one while the other is still being written */
    int64_t ckpt_snap_bytes; /* its host bytes: three fp32 models per slot, and CP_SNAP_STAGING where it is staged; 0
                              * for none */
    int64_t host_node;       /* host bytes of a node: host_peak x cp_plan_node_ranks + ckpt_snap_bytes */
    int64_t cat_bytes[CP_CAT_COUNT];                  /* sum of buffer sizes per category, GPU */
    int64_t cat_host_bytes[CP_CAT_COUNT];
    int64_t gpu_live_peak;                            /* most bytes live at one step (arena >= this) */
    int peak_step;                                    /* where it happens */
    int64_t cat_at_peak[CP_CAT_COUNT];                /* what is live there, GPU */
    double flops_attn, flops_other;                   /* one optimizer step, this rank */
    double flops_attn_saved;                          /* attention forward the backward does not redo (kept layers) */
    double t_compute, t_attn, t_comm, t_comm_exposed, t_copy, t_step; /* seconds */
    double t_fp8_casts;                               /* train.precision = "fp8": the amax and casts that make
                                                       * the GEMMs' FP8 copies, and what the copies written by
                                                       * their inputs' kernels add to those (in t_compute) */
    double t_ring, t_ring_exposed;                    /* the ring's send/recvs (in t_comm), and what of them the
                                                       * attention on the block in hand does not hide (in
                                                       * t_comm_exposed) */
    bool fits;
    char why[512];         /* when !fits: what does not fit and by how much */
} cp_plan;

/* The int32 inputs of one micro-batch, in the order the load step writes its operands: tokens, targets and the rows
 * sorted by token (T each), then with doc_positions each row's RoPE position (T), with docs doc_start and doc_end of
 * the whole sequence (S each). */
int64_t cp_plan_input_ints(const cp_plan *P);

/* The flat layout of one transformer layer's weights for C ranks. */
void cp_layer_layout_of(const cp_model *m, int C, cp_layer_layout *L);

/* Build the plan for a validated spec. Returns 0, or -1 with a message (a spec the planner cannot lay out). The
 * plan is flat: every step the runtime runs, in order. */
int cp_plan_build(const cp_spec *spec, cp_plan *plan, char *err, int errlen);
/* The same plan folded: runs of identical tiles held once (cp_loop), so that its size and the time to build it do
 * not grow with the sequence. Every figure (memory, arenas, offsets, time) is the flat plan's; what walks every step
 * (the executor, --steps, --svg) takes cp_plan_unfold of it. */
int cp_plan_build_folded(const cp_spec *spec, cp_plan *plan, char *err, int errlen);
/* Expand a folded plan's loops in place into the flat program (nothing to do for a flat one): the steps, the
 * lifetimes and the peak step in flat numbering; offsets, arenas and times stay. 0, or -1 with a message. */
int cp_plan_unfold(cp_plan *plan, char *err, int errlen);
/* Steps of the flat program, and the flat index of step i of this plan (the same in a flat plan). */
int64_t cp_plan_flat_steps(const cp_plan *plan);
int64_t cp_plan_flat_index(const cp_plan *plan, int i);
/* How many times step i runs per micro-batch in the flat program: a loop body's count, else 1. */
int64_t cp_plan_step_repeats(const cp_plan *plan, int i);
void cp_plan_free(cp_plan *plan);
int64_t cp_plan_reserve(const cp_plan *plan); /* per-GPU bytes outside the arena */
int64_t cp_plan_comm_reserve(const cp_plan *plan); /* the part of it that is NCCL's */
int cp_plan_node_ranks(const cp_plan *plan);  /* ranks sharing a node's host memory */
int cp_plan_ranks_per_gpu(const cp_plan *plan); /* ranks sharing one GPU: its memory holds that many peaks */
const char *cp_snap_kind_name(cp_snap_kind k); /* "pinned", "pageable", "in place", "none" */
/* Where layer l keeps its attention output and LSE: CP_ATTN_GPU, CP_ATTN_HOST or CP_ATTN_RECOMPUTE (none). */
cp_attn_keep cp_plan_attn_where(const cp_plan *plan, int layer);

/* The largest seq_len (a multiple of the required granularity) whose plan fits the spec's machine; 0 if none. The
 * plan of the answer is folded (cp_plan_build_folded). */
int64_t cp_plan_max_seq(const cp_spec *spec, cp_plan *best, char *err, int errlen);

/* Text and JSON renderings (gen/plan_print.c). */
void cp_plan_print(const cp_plan *plan, FILE *out, bool verbose);
void cp_plan_print_json(const cp_plan *plan, FILE *out);
/* One line after a plan's text: the step the other train.precision predicts for the same spec (`other`, its plan). */
void cp_plan_print_precisions(const cp_plan *plan, const cp_plan *other, FILE *out);

/* Bytes live at each step per category, [nsteps][CP_CAT_COUNT] (caller frees), each lifetime rounded to the
 * arena's alignment as the packing counts it: the largest step total is gpu_live_peak (gen/plan_svg.c). */
int64_t *cp_plan_live_by_cat(const cp_plan *plan, cp_space space);
/* `cpgen plan --svg`: memory over the steps, GPU and host; 0, or -1 with a message. */
int cp_plan_svg(const cp_plan *plan, const char *path, char *err, int errlen);

/* Emit the plan's kernel modules, one copy of each name, in the order of first use (gen/emit.c). Returns their
 * number with *out owned by the caller (cp_module_srcs_free), or -1 with a message. */
int cp_plan_emit(const cp_plan *plan, cp_module_src **out, char *err, int errlen);
void cp_module_srcs_free(cp_module_src *mods, int n);

const char *cp_cat_name(cp_cat c);
const char *cp_opkind_name(cp_opkind k);
const char *cp_phase_name(cp_phase p);

#endif

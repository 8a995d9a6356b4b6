/* spec.h: the validated model spec, loaded from a Lua file (gen/spec.c). Every later stage reads only this. */
#ifndef CP_SPEC_H
#define CP_SPEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CP_NAME_MAX 64
#define CP_PATH_MAX 1024
#define CP_ERR_MAX 2048
#define CP_MAX_RANKS 65536 /* replicas x ring x gpus */

typedef enum { CP_FAMILY_LLAMA, CP_FAMILY_QWEN3 } cp_family;
typedef enum { CP_CKPT_LAYER, CP_CKPT_NONE } cp_checkpoint;
/* Where checkpointed layer inputs live. AUTO lets the planner choose per layer. */
typedef enum { CP_OFFLOAD_AUTO, CP_OFFLOAD_NONE, CP_OFFLOAD_ALL } cp_offload;
/* Where fp32 master weights and AdamW moments live. */
typedef enum { CP_OPT_AUTO, CP_OPT_GPU, CP_OPT_HOST } cp_opt_place;
/* What each layer keeps of its attention for the backward: its output and log-sum-exp on the GPU, in pinned host
 * memory, or nothing (the backward recomputes attention). AUTO lets the planner choose per layer. */
typedef enum { CP_ATTN_AUTO, CP_ATTN_GPU, CP_ATTN_HOST, CP_ATTN_RECOMPUTE } cp_attn_keep;
typedef enum { CP_INIT_RANDOM, CP_INIT_HF } cp_init_from;

typedef struct {
    bool enabled;       /* Llama-3 frequency scaling */
    double factor;      /* 8 */
    double low_freq;    /* low_freq_factor, 1 */
    double high_freq;   /* high_freq_factor, 4 */
    int64_t original_max; /* original_max_position_embeddings, 8192 */
} cp_rope_scaling;

typedef struct {
    cp_family family;
    int64_t vocab, hidden, layers, heads, kv_heads, head_dim, ffn;
    double norm_eps;
    bool tie_embeddings;
    bool qk_norm;       /* RMSNorm over head_dim on q and k (Qwen3) */
    double rope_theta;
    cp_rope_scaling rope_scaling;
} cp_model;

typedef struct {
    int gpus;           /* C: context-parallel and FSDP group size (one Ulysses group, on one node) */
    int replicas;       /* R: groups training their own sequences, parameters replicated across them (1: none) */
    int ring;           /* P: groups sharing one sequence by ring attention, zigzag-split (1: none) */
    bool gpus_auto;     /* "auto": gpus was counted when the spec loaded (cp_spec_set_gpu_counter) */
    char gpus_found[160]; /* with gpus_auto: what was counted, e.g. "2 GPUs visible to CUDA" */
    int upipe_heads;    /* U: query heads per UPipe stage; U = heads is plain Ulysses */
    bool upipe_auto;    /* "auto": the plan picks the largest U that fits (upipe_heads holds the smallest) */
    cp_checkpoint checkpoint;
    int checkpoint_every; /* k: keep the input of every k-th layer, recompute the k - 1 between; 0 = "auto" */
    cp_offload offload;
    cp_opt_place optimizer;
    cp_attn_keep attention_output;
    int64_t mlp_tile;   /* tokens per MLP tile; 0 = auto */
    int64_t loss_tile;  /* tokens per LM-head/loss tile; 0 = auto */
} cp_parallel;

/* train.fp8_gemm: the block-scaled FP8 GEMMs on the generator's kernel where it measured faster than cuBLASLt inside
 * the step (AUTO, the default: cp_plan_fp8_kernel_wins, gen/plan_fp8.c), on cuBLASLt, or on the generator's kernel
 * (templates/gemm_fp8.cu, Hopper) wherever it takes them */
typedef enum { CP_FP8_GEMM_AUTO = 0, CP_FP8_GEMM_CUBLASLT, CP_FP8_GEMM_CPGEN } cp_fp8_gemm;
/* train.fp8_scaling, in the order of its names */
typedef enum { CP_FP8_SCALING_TENSOR = 0, CP_FP8_SCALING_BLOCK, CP_FP8_SCALING_ROW } cp_fp8_scaling;
/* train.fp8_fast_accum, in the order of its names: which FP8 GEMMs sum in the tensor cores' own precision, without
 * cuBLASLt promoting partial sums to fp32 (never block-scaled ones): none, the forward's (and its recompute), or those
 * and the activations' gradients (dX = dY W). Never the weights' gradients (dW = dY^T X, a sum over every token): with
 * them too one step's gradients of the 1B moved 0.18-0.57 from those with promotion (docs/PERF.md, 2026-12-04). */
typedef enum { CP_FP8_FAST_NONE = 0, CP_FP8_FAST_FORWARD, CP_FP8_FAST_DX } cp_fp8_fast;

typedef struct {
    int64_t seq_len;    /* tokens per sequence (all ranks together) */
    int micro_batches;  /* sequences accumulated per optimizer step */
    int steps;
    double lr, min_lr;
    int warmup;
    double weight_decay, clip, beta1, beta2, eps;
    int log_every, save_every;
    int eval_every;     /* evaluate on data.val every this many steps and after the last (0: never) */
    int eval_sequences; /* sequences of data.val each evaluation reads, from its start (a multiple of replicas) */
    int keep_checkpoints; /* after a checkpoint is complete, only the newest this many are kept (0: all) */
    bool async_save;      /* checkpoints written by a background thread while training goes on (false: the loop
                           * waits for each write) */
    char out_dir[CP_PATH_MAX];
    bool deterministic; /* the same bits every run (attention's dQ summed in key-block order), or faster sums */
    bool fp8;           /* train.precision = "fp8": the layers' projections and MLP GEMMs on FP8 inputs with scales
                         * from current values (gen/plan_fp8.c); "bf16" (false): every GEMM in bf16 */
    bool fp8_e4m3_grads; /* train.fp8_format = "e4m3" (the default with block or row scales): the backward's
                          * gradients in E4M3 too; "hybrid" (false, the default with one scale per tensor): E5M2 */
    int fp8_scaling;     /* train.fp8_scaling (cp_fp8_scaling): "block" (the default), a scale per 128 elements of k
                          * (activations, gradients) and per 128 x 128 tile (weights); "row", one per row of each
                          * input over all of k; "tensor", one per tensor */
    int fp8_fast_accum;  /* train.fp8_fast_accum (cp_fp8_fast): "forward" (the default), the forward's FP8 GEMMs (and
                          * their recompute) sum without fp32 promotion; "dx" the activations' gradients too; "none" */
    int fp8_gemm;        /* train.fp8_gemm (cp_fp8_gemm): which kernel runs the block-scaled FP8 GEMMs */
    bool fp8_bf16_wgrad; /* train.fp8_weight_grads = "bf16" (the default): the weights' gradients (dW = dY^T X) in
                          * bf16, the forward and dX GEMMs in FP8; "fp8" (false): all three */
    bool fp8_bf16_dgrad; /* train.fp8_input_grads = "bf16": the gradients of the GEMMs' inputs (dX = dY W) in bf16,
                          * leaving FP8 to the forward (and the weights' gradients where asked); "fp8" (false, the
                          * default) on FP8 */
} cp_train;

/* data.documents: whether attention and targets stay inside documents (MASK) or run over the packed sequence
 * (STREAM). AUTO (not given) becomes MASK where the source has document boundaries, else STREAM, when
 * cp_data_resolve_documents (runtime/data.h) looks at the source. */
typedef enum { CP_DOCS_AUTO = 0, CP_DOCS_STREAM, CP_DOCS_MASK } cp_doc_mode;
/* data.positions: RoPE positions restart at each document (DOCUMENT) or run over the sequence (SEQUENCE); AUTO
 * follows data.documents (DOCUMENT with MASK). */
typedef enum { CP_POS_AUTO = 0, CP_POS_SEQUENCE, CP_POS_DOCUMENT } cp_pos_mode;

typedef struct {
    char source[CP_PATH_MAX]; /* "synthetic:<task>" or "tokens:<glob>" */
    /* held-out data for the validation loss (runtime/eval.c): "" (none), "tokens:<glob>" (other shards),
     * "split:<fraction>" (the last fraction of the tokens: source's sequences, which training then never reads) or
     * "synthetic:<task>" (that task's sequences from CP_VAL_FIRST_SEQUENCE on, which training never reaches) */
    char val[CP_PATH_MAX];
    int documents;   /* cp_doc_mode */
    int positions;   /* cp_pos_mode */
    int64_t eod;     /* data.eod: the end-of-document id of tokens: shards that carry none; -1 = not set */
    int64_t doc_len; /* data.doc_len: the documents' expected length, for the plan's predicted time (--doc-len; from
                      * the shards where they have documents and it is not given); 0: unknown, one document */
} cp_data;

typedef struct {
    cp_init_from from;
    char path[CP_PATH_MAX];
    uint64_t seed;
    double std;
} cp_init;

/* Ceilings of the cost model and the memory of the machine the plan must fit (defaults: one H200). */
typedef struct {
    int64_t gpu_mem, host_mem;  /* bytes */
    int64_t reserve;            /* bytes per GPU outside the arena: CUDA context, modules, library workspaces */
    int64_t comm_reserve;       /* more per GPU when gpus > 1: NCCL's communicator and connection buffers */
    int64_t comm_reserve_shared; /* instead, per rank where ranks share GPUs (NCCL over sockets): its kernels and
                                  * buffers for collectives ... */
    int64_t comm_reserve_p2p;    /* ... more where the rank also sends and receives (all-to-all, a ring) ... */
    int64_t comm_reserve_split;  /* ... and more for each communicator split off the run's (replicas, rings) */
    int ranks_per_gpu;          /* ranks that share one GPU (1: a GPU each); > 1 checks a layout on fewer GPUs, each
                                 * rank its own NCCL host (launch.c): right numbers, not representative speed */
    int64_t host_reserve;       /* host bytes per process outside the pinned arena: driver, libraries, buffers */
    int64_t host_runtime;       /* the part of host_reserve that stays resident beside the arena during steps */
    double peak_tflops;         /* the bf16 ceiling MFU is counted against (one large GEMM alone) */
    double gemm_tflops;         /* bf16 dense GEMM as the steps run them (the cost model's rate) */
    double fp8_gemm_tflops;     /* the same GEMMs on FP8 inputs (train.precision = "fp8"), their sums promoted */
    double fp8_gemm_fast_tflops; /* ... summed without promotion (train.fp8_fast_accum) */
    double fp8_block_gemm_tflops; /* ... with block scales (train.fp8_scaling = "block"), a weight's tiles on one side */
    double fp8_block_wgrad_tflops; /* ... with block scales on both sides by 128 of k: the weights' gradients */
    double fp8_cpgen_gemm_tflops, fp8_cpgen_wgrad_tflops; /* the same two on the generator's kernel (train.fp8_gemm) */
    double attn_fwd_tflops;     /* causal flash attention forward, head_dim 128 */
    double attn_bwd_tflops;     /* its backward (the dQ conversion included), head_dim 128 */
    double attn_fwd_tflops_d64; /* the same at head_dim 64 */
    double attn_bwd_tflops_d64;
    double hbm_gbps;            /* device copy, read + write */
    double fp8_cast_gbps;       /* FP8 amax and casts (train.precision = "fp8"), their bytes read + written */
    double fp8_cast_t_gbps;     /* the FP8 casts that write a transposed copy */
    double fp8_cast_row_gbps;   /* the row-scaled FP8 casts */
    double fp8_copy_gbps;       /* the FP8 copies rmsnorm and SwiGLU write beside their outputs, beyond their own bytes */
    double fp8_copy_row_gbps;   /* the row-scaled ones, likewise */
    double host_gbps;           /* pinned host <-> device, each way */
    double a2a_gbps;            /* all-to-all bus bandwidth */
    double allgather_gbps;      /* all-gather / reduce-scatter bus bandwidth */
    double net_gbps;            /* between nodes, per GPU: the ring's send/recv and the gradient all-reduce across
                                 * replicas and ring groups (bus bandwidth) */
    double host_adamw_gbps;     /* AdamW on the host's cores: optimizer state streamed per second */
    double kernel_us, gemm_us;  /* fixed cost of a kernel launch, of a GEMM, beside its work */
    double coll_us, net_us;     /* latency of a collective inside a node, and between nodes (a ring's send/recv too) */
} cp_machine;

/* The default machine (one H200, 128 GiB of host memory): the cost model's table of rates, fixed costs and memory
 * reserves, each with where it was measured (gen/spec.c). */
void cp_machine_defaults(cp_machine *m);

/* The machine's numeric keys, rates (TF/s, GB/s) and fixed costs (microseconds), as one list that reading, checking
 * and writing a spec go through: the key under machine, its field, and when a written spec carries it */
typedef enum {
    CP_MACHINE_WRITE_ALWAYS,
    CP_MACHINE_WRITE_GROUPS,      /* where the run has several groups (replicas x rings): the network's */
    CP_MACHINE_WRITE_NOT_DEFAULT  /* where it differs from cp_machine_defaults' */
} cp_machine_write;
typedef struct {
    const char *key;
    size_t offset;     /* of its double in cp_machine */
    bool fixed_cost;   /* microseconds a step, not a rate */
    cp_machine_write write;
} cp_machine_num;
extern const cp_machine_num cp_machine_nums[];
extern const size_t cp_machine_nnums;
static inline double *cp_machine_num_at(cp_machine *m, const cp_machine_num *k) {
    return (double *)((char *)m + k->offset);
}
static inline double cp_machine_num_of(const cp_machine *m, const cp_machine_num *k) {
    return *(const double *)((const char *)m + k->offset);
}

typedef struct {
    char path[CP_PATH_MAX];     /* file it came from, or "<embedded>/tiny.lua" */
    char name[CP_NAME_MAX];     /* file name without folder and .lua */
    cp_model model;
    cp_parallel parallel;
    cp_train train;
    cp_data data;
    cp_init init;
    cp_machine machine;
} cp_spec;

/* Load and validate a spec. `path` is a file, or the name of a shipped spec ("tiny", "llama8b") which is
 * read from the copy embedded in the binary when no such file exists. `sets` are "key.path=value" overrides
 * applied after the file ran. On error returns -1 and writes one message into err, naming the file, the key
 * path, what was wrong and how to fix it; on success returns 0. */
int cp_spec_load(const char *path, const char *const *sets, int nsets, cp_spec *out, char *err, int errlen);

/* The same from source text already in memory (tests, embedded specs). `chunkname` is used in messages. */
int cp_spec_load_string(const char *chunkname, const char *source, const char *const *sets, int nsets,
                        cp_spec *out, char *err, int errlen);

/* Re-run the cross-field rules on a spec changed in C (the planner's --max-seq search). Same contract. */
int cp_spec_check(const cp_spec *spec, char *err, int errlen);

/* How long a spec's Lua may run before the load stops it (10 s unless changed; the spec fuzzer shortens it). The
 * limit holds inside library calls too: specs run in a loader process that cpgen forks at the first load, keeps
 * while loads come (it leaves after 2 s without one) and kills when a load outlives the limit. */
void cp_spec_set_time_limit(double seconds);

/* parallel.gpus = "auto" asks this function for the count (and a few words on where it came from) when a spec
 * loads; the command line gives one that asks a launcher or CUDA. Without one, "auto" is 1 GPU. */
typedef int (*cp_gpu_counter)(char *found, int len);
void cp_spec_set_gpu_counter(cp_gpu_counter counter);

/* The valid UPipe stage sizes U of this spec's heads, KV heads and GPUs, ascending; returns their number. */
int cp_spec_upipe_values(const cp_spec *spec, int64_t *out, int max);
const char *cp_family_name(cp_family f);
const char *cp_offload_name(cp_offload o);
/* The cost model's attention rate, TF/s, for the forward or the backward at this head_dim (64 or 128). */
double cp_machine_attn_tflops(const cp_machine *mc, bool backward, int64_t head_dim);
const char *cp_opt_place_name(cp_opt_place o);
const char *cp_attn_keep_name(cp_attn_keep a);
const char *cp_fp8_gemm_name(cp_fp8_gemm g);
const char *cp_fp8_scaling_name(cp_fp8_scaling s);
const char *cp_fp8_fast_name(cp_fp8_fast f);

/* data.val = "split:<fraction>": true with the fraction (strictly between 0 and 1) in *fraction; false for any other
 * value, or a split whose fraction does not parse or lies outside (0, 1) (*fraction is then NaN). */
bool cp_val_split(const char *val, double *fraction);

/* Parameters of the model (all of them, not per rank). */
int64_t cp_model_layer_params(const cp_model *m);
int64_t cp_model_params(const cp_model *m);

#endif

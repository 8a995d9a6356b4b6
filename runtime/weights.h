/* weights.h: the whole model as one flat fp32 host array laid out as the plan's FSDP units, and its mapping to and
 * from Hugging Face Llama / Qwen3 checkpoints (safetensors), plus the deterministic random initialisation.
 *
 * Flat layout: unit u starts at element cp_weights_unit_off(plan, u) = sum of plan->unit_padded[v] for v < u
 * (the C = 1 shard layout; rank r of C holds elements [off + r * padded / C, off + (r + 1) * padded / C) of each
 * unit). Unit 0 is model.embed_tokens.weight [vocab][hidden]; unit 1 + l is layer l with the offsets of
 * plan->layout (cp_layer_layout_of); unit L + 1 is model.norm.weight [hidden] padded to 64 elements, then
 * lm_head.weight [vocab][hidden] unless the embeddings are tied. Every padding element is 0.
 *
 * Query-head storage order: the rows of Wq are stored in UPipe stage order, so each stage's heads are contiguous:
 * stored head position p = s*U + r*u + j holds model head plan->stages[s*C + r].q_heads[j] (cp_q_head_order). The
 * columns of Wo (blocks of head_dim input features) are permuted the same way. K, V, and the per-head-dim q/k norms
 * are in model order. */
#ifndef CP_WEIGHTS_H
#define CP_WEIGHTS_H

#include <stdbool.h>
#include <stdint.h>

#include "plan.h"
#include "safetensors.h"

/* How one Hugging Face tensor sits in the flat model. */
typedef enum { CP_HF_PLAIN, CP_HF_Q_ROWS, CP_HF_O_COLS } cp_hf_perm;

typedef struct {
    char name[96];    /* "model.layers.3.self_attn.q_proj.weight" */
    int ndim;         /* 1 (norms) or 2 */
    int64_t shape[2]; /* HF shape: [out][in] for matrices */
    int64_t off;      /* first element in the flat model */
    cp_hf_perm perm;
    bool norm; /* an RMSNorm weight (initialised to 1) */
    int unit;
} cp_hf_tensor;

/* Elements of the flat model: sum of plan->unit_padded. */
int64_t cp_weights_elems(const cp_plan *plan);
/* First element of unit u in the flat model. */
int64_t cp_weights_unit_off(const cp_plan *plan, int unit);
/* Rank r's shard of the flat model (plan->params_shard elements): of each unit u, elements
 * [r * padded/C, (r + 1) * padded/C) of the unit, at plan->unit_shard_off[u]. With one GPU, a copy. */
void cp_weights_shard(const cp_plan *plan, int rank, const float *full, float *shard);

/* order[p] = the model query head stored at position p (p < heads). */
void cp_q_head_order(const cp_plan *plan, int *order);

/* The Hugging Face tensors of the plan's model, in checkpoint order. Returns how many (at most cap are written;
 * call with cap 0 to count). */
int cp_weights_hf_tensors(const cp_plan *plan, cp_hf_tensor *out, int cap);

/* Load a Hugging Face checkpoint (a .safetensors file, an index .json, or a folder) into out[cp_weights_elems].
 * F32, BF16 and F16 are widened to fp32; Wq rows and Wo columns are permuted into storage order; padding is zeroed.
 * Fails, with a message naming the tensor, the file and the spec field to check, on: a missing tensor, a shape
 * other than the spec's, a tensor the spec has no place for (extra layers, q/k norms of another family), an
 * untied LM head under tie_embeddings = true (or the reverse), a non-finite value. Returns 0 or -1. */
int cp_weights_load_hf(const cp_plan *plan, const char *path, float *out, char *err, int errlen);
/* The same checks, but only rank's shard (cp_weights_shard's layout) into shard[plan->params_shard], read unit by
 * unit: a rank of several holds the largest unit beside its shard, never the whole model. */
int cp_weights_load_hf_shard(const cp_plan *plan, const char *path, int rank, float *shard, char *err, int errlen);

/* Save the flat model as a Hugging Face checkpoint in dir: safetensors in model order (bf16 or fp32), sharded above
 * shard_bytes (<= 0: 5 GB) with model.safetensors.index.json, and a config.json for LlamaForCausalLM (family
 * llama) or Qwen3ForCausalLM (family qwen3) from the spec, so transformers' from_pretrained(dir) loads it.
 * Returns 0, or -1 with a message. */
int cp_weights_save_hf(const cp_plan *plan, const float *model, const char *dir, bool bf16, int64_t shard_bytes,
                       char *err, int errlen);

/* The config.json text for the plan's model (what cp_weights_save_hf writes). Caller frees. NULL with a message
 * when the spec has no transformers equivalent (qk_norm on a llama family, none on qwen3). */
char *cp_weights_hf_config(const cp_plan *plan, bool bf16, char *err, int errlen);

/* Model-shaped fp32 arrays other than the weights (AdamW's moments), stored per Hugging Face tensor so that they
 * keep their meaning whatever the GPU count or UPipe stage order: array a's part for tensor X is the F32 tensor
 * "<prefix[a]>X" with X's Hugging Face shape and element order (query heads in model order). All arrays go into the
 * one safetensors file `path` (cp_st_write_file: temporary name, fsync, rename). Returns 0, or -1 with a message. */
int cp_weights_save_prefixed(const cp_plan *plan, const char *path, int narrays, const char *const *prefix,
                             const float *const *flat, char *err, int errlen);

/* Read back one such array from an open set into out[cp_weights_elems] (padding zeroed, query heads in storage
 * order). Fails, naming the tensor and file, on a missing tensor, a shape other than the spec's, a dtype other than
 * F32 (only fp32 continues exactly), a non-finite value, or (nonneg: a second moment) a negative one. out is zeroed
 * on failure. Returns 0 or -1. */
int cp_weights_load_prefixed(const cp_plan *plan, const cp_st_set *st, const char *prefix, bool nonneg, float *out,
                             char *err, int errlen);
/* The same checks, but only rank's shard (cp_weights_shard's layout) into shard[plan->params_shard], read unit by
 * unit: a rank resuming on several GPUs holds the largest unit beside its shard, never the whole array. */
int cp_weights_load_prefixed_shard(const cp_plan *plan, const cp_st_set *st, const char *prefix, bool nonneg, int rank,
                                   float *shard, char *err, int errlen);

/* Deterministic initialisation, as transformers' default _init_weights: every matrix (embedding, projections, LM
 * head) normal(0, std), every RMSNorm weight 1.0, padding 0. The RNG is counter-based and keyed by the tensor's
 * Hugging Face name, so the model does not depend on the GPU count, UPipe stage size or thread count: with
 *   mix(x) = the SplitMix64 finaliser, G = 0x9e3779b97f4a7c15, key = mix(seed ^ mix(fnv1a64(name))),
 *   a = mix(key + (2j) G) >> 11, b = mix(key + (2j + 1) G) >> 11 (53-bit integers),
 *   u1 = (a + 1) 2^-53, u2 = b 2^-53, r = sqrt(-2 ln u1),
 * elements 2j and 2j + 1 of the tensor (in HF row-major order) are std r cos(2 pi u2) and std r sin(2 pi u2),
 * computed in double and rounded to fp32 (Box-Muller). */
void cp_weights_init_random(const cp_plan *plan, uint64_t seed, double std, float *model);
/* Rank r's shard of the same init (cp_weights_shard of it), made one unit at a time: for ranks that must not hold
 * the whole model in host memory. */
void cp_weights_init_random_shard(const cp_plan *plan, int rank, uint64_t seed, double std, float *shard);

#endif

/* checkpoint.h: training checkpoints that `cpgen run --resume` continues from with the same bits.
 *
 * A checkpoint is a folder <out_dir>/ckpt_<step>/ holding
 *   model.safetensors (or shards and an index) + config.json: the fp32 master weights as a Hugging Face checkpoint
 *     in F32 (cp_weights_save_hf), so transformers and init.from = "hf" load the folder as it is;
 *   optimizer.safetensors: AdamW's moments per Hugging Face tensor, "exp_avg.<name>" and "exp_avg_sq.<name>" in F32
 *     with the tensor's Hugging Face shape and order (cp_weights_save_prefixed), so they keep their meaning whatever
 *     the GPU count or UPipe stage order of the run that reads them;
 *   trainer_state.json: format, cpgen version, spec name, model shape and its hash, step, AdamW's update count,
 *     skipped steps, the last loss, the data position in the run's global stream of sequences (cp_dataset_tell)
 *     and sequences per step, the data seed, and the layout the run had (runtime/resume.h compares a resuming run
 *     with it).
 * It is written as <out_dir>/ckpt_<step>.tmp.<pid>, every file synced, trainer_state.json last, then renamed to its
 * final name in one step; then <out_dir>/latest (the folder's name and a newline) is replaced atomically. A folder
 * with a final name is therefore always complete, and a crash leaves only a .tmp folder (removed by the next save
 * once its process is gone, refused by --resume). A running training writes it from a snapshot on a thread of its
 * own (ckpt_async.h); train.keep_checkpoints removes old ones (ckpt_keep.h). docs/CHECKPOINTS.md. */
#ifndef CP_CHECKPOINT_H
#define CP_CHECKPOINT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "data.h"
#include "plan.h"
#include "safetensors.h"

#define CP_CKPT_FORMAT 1
#define CP_CKPT_STATE_NAME "trainer_state.json"
#define CP_CKPT_OPTIM_NAME "optimizer.safetensors"
#define CP_CKPT_LATEST_NAME "latest"
#define CP_CKPT_M_PREFIX "exp_avg."
#define CP_CKPT_V_PREFIX "exp_avg_sq."

/* The layout a checkpoint's run had: how its ranks shared the work, not what it computed. A run resumes on any
 * layout (the state is per Hugging Face tensor, the data position the global stream's); these are kept to say what
 * changed. Absent from checkpoints of an older cpgen (known = false). */
typedef struct {
    bool known;
    int gpus, ring, replicas, ranks_per_gpu; /* parallel.gpus, .ring, .replicas, machine.ranks_per_gpu */
    int upipe_heads;                         /* U, heads per UPipe stage */
    bool optimizer_host;                     /* AdamW state in host memory */
    int offload_layers;                      /* layers whose checkpoint is in host memory */
    int checkpoint_every;
    int attn_host_layers, attn_gpu_layers;   /* layers keeping their attention output on the host, on the GPU */
} cp_ckpt_layout;

typedef struct {
    int format;                    /* CP_CKPT_FORMAT */
    char version[32];              /* cpgen version that wrote it */
    char spec[CP_NAME_MAX];        /* spec name */
    uint64_t shape_hash;           /* cp_ckpt_shape_hash(&model) */
    cp_model model;                /* the shape fields only (family ... qk_norm); the rest is zero */
    int step;                      /* training steps done: the run continues with step + 1 */
    int updates;                   /* AdamW updates done (steps not skipped): the next update's bias corrections */
    int skipped;                   /* steps whose update was skipped (non-finite loss or norm): step = updates +
                                      skipped */
    double last_loss;              /* loss of step `step`; NaN when it was not finite */
    char data_source[CP_PATH_MAX]; /* data.source of the run */
    cp_data_pos data;              /* where the next sequence comes from, in the stream all groups read together */
    int64_t seqs_per_step;         /* sequences of that stream one step read: replicas x micro_batches; 0 when the
                                      file does not say (an older cpgen): cp_resume_check derives it */
    uint64_t data_seed;            /* the synthetic data's seed (init.seed): the loop has no other random state */
    cp_train train;                /* the schedule and AdamW settings it ran with (out_dir, log_every unused) */
    cp_ckpt_layout layout;         /* how the run was laid out */
} cp_ckpt_state;

/* Hash of the model's shape: family, vocab, hidden, layers, heads, kv_heads, head_dim, ffn, tie_embeddings, qk_norm
 * (not norm_eps or RoPE: they change no tensor, and a run may change them on purpose, e.g. to extend context). */
uint64_t cp_ckpt_shape_hash(const cp_model *m);

/* The fields that come from the plan (format, version, spec, model and hash, data source, seed and sequences per
 * step, train, layout); the caller sets step, updates, skipped, last_loss and data. */
void cp_ckpt_state_init(const cp_plan *plan, cp_ckpt_state *st);

/* trainer_state.json's text (caller frees), and back. Parsing checks every key's presence and type; `where` names
 * the file in messages. Returns 0, or -1 with a message. */
char *cp_ckpt_state_json(const cp_ckpt_state *st);
int cp_ckpt_state_parse(const char *text, size_t len, const char *where, cp_ckpt_state *st, char *err, int errlen);

/* Called after each piece of a checkpoint is complete in the temporary folder: piece is "model.safetensors"
 * (the weights and config.json), "optimizer.safetensors" or "trainer_state.json"; then once more with "latest" and
 * the final folder, after the folder has its final name and before `latest` names it. Returning nonzero stops the
 * write there as a crash would: the temporary folder stays and nothing is renamed (or, at "latest", the folder is
 * complete but `latest` still names the one before). For tests. */
typedef int (*cp_ckpt_hook)(void *ctx, const char *tmp_dir, const char *piece);

/* Write <out_dir>/ckpt_<st->step>/ from the flat fp32 master weights and moments (cp_weights_elems elements, the
 * executor's layout), then <out_dir>/latest. An existing folder of that name (a step saved again after a resume) is
 * replaced atomically if it is a checkpoint cpgen saved (cp_ckpt_dir_is_ours), else refused, as is a `latest` that
 * cpgen did not write. path (may be NULL) gets the final folder. Returns 0, or -1 with a message; on failure no
 * folder has the final name unless it was there before, untouched. */
/* Whether dir holds only files a save writes (and their temporaries), none a link, and (complete) a
 * trainer_state.json that parses: a folder cpgen may replace or, as a crash's leftover, remove. 0, or -1 with what
 * is wrong in why. */
int cp_ckpt_dir_is_ours(const char *dir, bool complete, char *why, size_t whylen);
/* Whether a file starting with these n bytes is a `latest` cpgen wrote: "ckpt_<step>" and a newline. */
bool cp_ckpt_latest_is_ours(const char *head, size_t n, const void *ctx);

int cp_ckpt_write(const cp_plan *plan, const char *out_dir, const cp_ckpt_state *st, const float *master,
                  const float *m, const float *v, cp_ckpt_hook hook, void *hook_ctx, char *path, size_t pathlen,
                  char *err, int errlen);

/* An open checkpoint, checked against a plan and ready to load. */
typedef struct {
    char dir[CP_PATH_MAX];
    char weights[CP_PATH_MAX + 64]; /* its model.safetensors, or the index of its shards */
    cp_ckpt_state state;
    cp_st_set optim;
} cp_ckpt;

/* dir: a checkpoint folder, or an out_dir whose `latest` names one. Reads trainer_state.json, checks it against the
 * plan (format, model shape, step < train.steps, step = updates + skipped), then opens the weights and
 * optimizer.safetensors and checks that each holds exactly the plan's tensors, F32, of the plan's shapes.
 * Refuses an incomplete folder (a .tmp one, or one missing a file) and a damaged one, with a message naming the
 * file, what is wrong and what to do; nothing is loaded yet. Whether the run may go on with the data it now reads
 * is cp_resume_check's (runtime/resume.h). Returns 0, or -1 (ck is then closed). */
int cp_ckpt_open(const cp_plan *plan, const char *dir, cp_ckpt *ck, char *err, int errlen);
/* The master weights into flat[cp_weights_elems]. */
int cp_ckpt_load_weights(const cp_plan *plan, const cp_ckpt *ck, float *flat, char *err, int errlen);
/* One AdamW moment (second: exp_avg_sq, else exp_avg) into flat[cp_weights_elems]. */
int cp_ckpt_load_moment(const cp_plan *plan, const cp_ckpt *ck, bool second, float *flat, char *err, int errlen);
/* The same as group rank `rank`'s shard (cp_weights_shard of the above) into shard[plan->params_shard], read unit
 * by unit: a rank of several GPUs holds one unit beside its shard, as the plan counts for loading (host_load). */
int cp_ckpt_load_weights_shard(const cp_plan *plan, const cp_ckpt *ck, int rank, float *shard, char *err, int errlen);
int cp_ckpt_load_moment_shard(const cp_plan *plan, const cp_ckpt *ck, bool second, int rank, float *shard, char *err,
                              int errlen);
void cp_ckpt_close(cp_ckpt *ck);

/* Print one "note:" line per schedule or AdamW setting the run differs in from the checkpoint's (train.steps,
 * warmup, lr, min_lr, betas, eps, weight_decay, clip): resuming still works, but the losses will not be those of an
 * uninterrupted run. Data and layout are cp_resume_notes' (runtime/resume.h). Returns how many. */
int cp_ckpt_notes(const cp_plan *plan, const cp_ckpt_state *st, FILE *out);

#endif

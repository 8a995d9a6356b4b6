/* safetensors.h: Hugging Face safetensors files, read and written on the host.
 *
 * A file is: u64 little-endian N, N bytes of JSON header, then the data area. The header maps each tensor name to
 * {"dtype": "BF16", "shape": [rows, cols], "data_offsets": [begin, end]} (byte offsets into the data area) and
 * may hold "__metadata__": {string: string}. A sharded checkpoint is several such files and
 * model.safetensors.index.json with {"metadata": {"total_size": bytes}, "weight_map": {name: file}}.
 *
 * Opening validates everything before any data is read: header length inside the file and at most 100 MB, the
 * header strict JSON (runtime/json.h), every dtype one of the safetensors dtypes, shapes non-negative, each tensor's
 * byte range inside the data area, of exactly shape x dtype size bytes, and no two ranges overlapping; for an index,
 * every shard it names opens and holds exactly the tensors the index maps to it. Data is read later, on demand, with
 * pread, so a 60 GB checkpoint is never held twice in memory. */
#ifndef CP_SAFETENSORS_H
#define CP_SAFETENSORS_H

#include <stdbool.h>
#include <stdint.h>

#define CP_ST_MAX_DIMS 8
#define CP_ST_MAX_HEADER (100LL * 1000 * 1000)         /* as the reference implementation */
#define CP_ST_DEFAULT_SHARD (5LL * 1000 * 1000 * 1000) /* bytes per shard when saving, as transformers' "5GB" */
#define CP_ST_INDEX_NAME "model.safetensors.index.json"
#define CP_ST_SINGLE_NAME "model.safetensors"

/* Every dtype of the format. cpgen converts F32, BF16 and F16; the others are accepted in a file (their ranges are
 * still checked) but a read of such a tensor as float fails with a message. */
typedef enum {
    CP_ST_F32,
    CP_ST_BF16,
    CP_ST_F16,
    CP_ST_F64,
    CP_ST_I64,
    CP_ST_I32,
    CP_ST_I16,
    CP_ST_I8,
    CP_ST_U64,
    CP_ST_U32,
    CP_ST_U16,
    CP_ST_U8,
    CP_ST_BOOL,
    CP_ST_F8_E4M3,
    CP_ST_F8_E5M2,
    CP_ST_DTYPE_COUNT
} cp_st_dtype;

const char *cp_st_dtype_name(cp_st_dtype d); /* "BF16" */
int cp_st_dtype_size(cp_st_dtype d);         /* bytes per element */

typedef struct {
    char *name;
    cp_st_dtype dtype;
    int ndim;
    int64_t shape[CP_ST_MAX_DIMS];
    int64_t elems;
    int64_t begin, end; /* bytes into the data area of its file */
    int file;           /* index into cp_st_set.files */
} cp_st_tensor;

typedef struct {
    char *path;
    int fd;
    int64_t size;     /* bytes of the whole file */
    int64_t data_off; /* 8 + header length */
} cp_st_file;

typedef struct {
    int nfiles;
    cp_st_file *files;
    int ntensors;
    cp_st_tensor *tensors; /* sorted by name */
    char *where;           /* the path given to cp_st_open, for messages */
} cp_st_set;

/* Open `path`: a .safetensors file, an index .json file, or a folder holding model.safetensors.index.json, else
 * model.safetensors (as transformers looks for it), else exactly one *.safetensors file. Returns 0, or -1 with a
 * message naming the file, what is wrong and what to do; on failure *st is left closed (cp_st_close is still
 * safe). */
int cp_st_open(const char *path, cp_st_set *st, char *err, int errlen);
void cp_st_close(cp_st_set *st);

/* Tensor by name, or NULL. */
const cp_st_tensor *cp_st_find(const cp_st_set *st, const char *name);

/* Read a tensor's elements [first, first + count) as fp32 (F32 copied, BF16 and F16 widened exactly).
 * Returns 0, or -1 with a message (unsupported dtype, range outside the tensor, a short read). */
int cp_st_read_f32(const cp_st_set *st, const cp_st_tensor *t, int64_t first, int64_t count, float *out, char *err,
                   int errlen);
/* Read a tensor's bytes as stored (little-endian), all of them: out holds end - begin bytes. */
int cp_st_read_raw(const cp_st_set *st, const cp_st_tensor *t, void *out, char *err, int errlen);

/* Fills dst[0, n) with the fp32 values of elements [first, first + n) of a tensor being written. */
typedef void (*cp_st_fill_fn)(const void *ctx, int64_t first, int64_t n, float *dst);

/* One tensor to write. The source is exactly one of: `raw` (bytes already in `dtype`, little-endian), `f32`
 * (contiguous fp32 values converted to `dtype`, which must be F32, BF16 or F16), or `fill` with `ctx`. */
typedef struct {
    const char *name;
    cp_st_dtype dtype;
    int ndim;
    int64_t shape[CP_ST_MAX_DIMS];
    const void *raw;
    const float *f32;
    cp_st_fill_fn fill;
    const void *ctx;
} cp_st_out;

/* Write tensors into folder `dir` (created if missing) in the order given. When their total bytes exceed
 * shard_bytes (<= 0: CP_ST_DEFAULT_SHARD) they go into model-0000i-of-0000n.safetensors, a new shard starting
 * before a tensor that would overflow the current one, plus model.safetensors.index.json; else into
 * model.safetensors alone (and a stale index from an earlier sharded save in dir is removed, since readers prefer
 * it). Every file is written under a temporary name, synced and renamed, so a crash never leaves a half-written
 * file under a real name. Header "__metadata__" is {"format": "pt"}. Returns 0, or -1 with a message. */
int cp_st_write(const char *dir, const cp_st_out *tensors, int n, int64_t shard_bytes, char *err, int errlen);

/* Write tensors as one safetensors file at `path` (its folder must exist), whatever their size, under a temporary
 * name, synced and renamed, with the same header as cp_st_write. For files other than a model's weights (a
 * training checkpoint's optimizer.safetensors). Returns 0, or -1 with a message. */
int cp_st_write_file(const char *path, const cp_st_out *tensors, int n, char *err, int errlen);

/* Where the writers' time went, summed over every writing thread of this process since the last reset: seconds
 * filling and converting tensors (the reordering into Hugging Face layout), in write calls, in fsync, and bytes
 * written. For the checkpoint writer's report and tools/ckpt_bench.c. */
typedef struct {
    double fill_s, write_s, sync_s;
    int64_t bytes;
} cp_st_write_stats;
void cp_st_stats(cp_st_write_stats *out, bool reset);

/* For tests: called from the writing thread after each block of a file is written (the file's temporary path, the
 * block, the number of blocks); NULL: none. */
extern void (*cp_st_block_hook)(const char *tmp_path, int64_t block, int64_t nblocks);

/* fp32 <-> bf16 / f16, round to nearest even; NaN stays NaN, overflow goes to infinity. */
uint16_t cp_f32_to_bf16(float f);
float cp_bf16_to_f32(uint16_t h);
uint16_t cp_f32_to_f16(float f);
float cp_f16_to_f32(uint16_t h);

#endif

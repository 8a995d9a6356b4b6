/* kernels.h: one constructor per kernel family: which template, which compile-time values.
 * The planner calls these; the template files in templates/ define what each value means.
 * Layout conventions (row-major, bf16 unless stated):
 *   token layout  [T][heads][head_dim]   (a projection's output, T = tokens of this rank)
 *   head layout   [S][heads][head_dim]   (after the all-to-all, S = all tokens, heads = this rank's share)
 *   lse           [heads][S] fp32;  delta (rowsum dO*O) [S][heads] fp32
 *
 * Argument C types of the entries (all but attention, see kernels_attn.c): pointers are device pointers, bf16 is
 * __nv_bfloat16 (uint16_t on the host), i64 is long long (int64_t), n is i64, heads is int, step is int,
 * pos0 is i64, scalars (eps, lr, scale, ...) are float. Pointers must be 16-byte aligned (adamw, cast and sumsq
 * also accept any alignment, more slowly) and row strides a multiple of the row unit (16 bytes, or 4 for rows of
 * 4 bytes); the runtime checks these, the kernels do not. Outputs marked += accumulate into what is there.
 * Launch geometry of every entry: cp_k_dims below; entries use no dynamic shared memory but gemm_fp8's. */
#ifndef CP_KERNELS_H
#define CP_KERNELS_H

#include "emit.h"
#include "spec.h"

/* embedding: fwd(tokens i32[n], table[V][H], out[n][H], n); bwd(tokens, dout[n][H], dtable f32[V][H] +=, n) with
 * atomics; bwd_sorted(tokens, order i32[n], dout, dtable +=, n) the same without atomics and deterministic: order is
 * a permutation of [0, n) listing the rows by token, stably (row i before row j when tokens are equal and i < j);
 * equal tokens must be adjacent in it. bwd_sorted then gives the sequential dtable[tokens[i]] += dout[i] for
 * i = 0..n-1 in fp32, bit for bit. A token outside [0, V) gives a row of NaN in fwd and is skipped in bwd. */
void cp_k_embedding(cp_kernel_spec *k, int64_t vocab, int64_t hidden);
/* rmsnorm over rows of HIDDEN, as HF: out = bf16(weight * bf16(s * rstd)), rstd = 1/sqrt(mean(s^2) + eps), where
 * s = x, or with resid s = bf16(x + resid) (written to sum_out; both non-NULL or both NULL).
 * fwd(x, resid|NULL, sum_out|NULL, weight, out, rstd f32[n], n, amax_slot|NULL, amax_fmax);
 * bwd(dout, x, weight, rstd, dresid|NULL, dx, dw_part f32[grid][HIDDEN] out, n, amax_slot|NULL, amax_fmax): x is the
 * normalised input (sum_out
 * when resid was used); dx = d(input) (+ dresid); dout and dresid may be the same buffer as dx; block b writes its
 * rows' weight gradient to row b of dw_part (grid: the bwd launch's grid[0], at most cp_k_scratch_bytes' rows);
 * bwd_dw(dw_part, parts i32, dweight f32[HIDDEN] +=): dweight += the sum of the parts rows, in row order for every
 * column (in double, rounded once), so dweight is the same bits run to run; launch it with bwd's n.
 * With an amax_slot (an FP8 scale slot, CP_FP8_SLOT_BYTES: see fp8 below) fwd and bwd also fill it from out's or dx's
 * largest |x|, as fp8's amax would; amax_fmax is the FP8 type's largest value. fwd_copy(x, resid, sum_out, weight,
 * out, rstd, n, fmax, copy u8[n][HIDDEN], copy_scales f32), where cp_k_fp8_copies says so, is fwd that also writes
 * out's FP8 copy and its 1 x 128 scales as fp8's cast_1d would, in the type fmax names (448 E4M3, 57344 E5M2);
 * bwd_copy(dout, x, weight, rstd, dresid, dx, dw_part, n, fmax, copy, copy_scales) is bwd that writes dx's.
 * With row scales, where cp_k_fp8_row_copies says so: fwd_row(x, resid, sum_out, weight, out, rstd, n, fmax, copy
 * u8[n][HIDDEN], copy_scales f32[n], col_max f32[col_max_rows][HIDDEN] | NULL, col_max_rows i32) writes out's copy
 * with a scale per row as fp8's cast_row would and, given col_max (zeroed before), adds each column's largest |out|
 * into it as fp8's cast_rt_row adds the transposed copy's column maxima (fwd_row's grid is persistent); bwd_row(dout,
 * x, weight, rstd, dresid, dx, dw_part, n, fmax, copy, copy_scales, col_max, col_max_rows) is bwd that does the same
 * for dx (on bwd's grid). */
void cp_k_rmsnorm(cp_kernel_spec *k, int64_t hidden, double eps);
/* rope in place on [n][heads][D] (rotate_half pairs (i, i + D/2)), token row r at position pos0 + r:
 * fwd(x, n, heads, pos0); bwd(dx, n, heads, pos0) (the transpose: rotation by the negative angle); where
 * cp_k_fp8_copies says so, bwd_copy(dx, n, heads, pos0, fmax, copy u8[rows][heads * D], copy_scales f32, row0,
 * scale_rows) is bwd that also writes dx's FP8 copy with 1 x 128 scales ([heads][scale_rows]), its rows from row0.
 * Frequencies: theta with the Llama-3 scaling when enabled, computed on the host in double (cp_rope_inv_freq). */
void cp_k_rope(cp_kernel_spec *k, const cp_model *m);
/* rope with each row's position from an array (packed documents, whose positions restart at each one):
 * fwd(x, n, heads, const int32 *pos), bwd likewise, row r at pos[r]; or back to pos0 + r (per_row false). */
void cp_k_rope_positions(cp_kernel_spec *k, bool per_row);
/* The D/2 inverse frequencies rope bakes in for this model. */
void cp_rope_inv_freq(const cp_model *m, double *inv_freq);
/* swiglu on a tile, as HF: out = bf16(bf16(silu(gate)) * up).
 * fwd(gate[n][F], up[n][F], out[n][F], n, amax_slot|NULL, amax_fmax); bwd(dout, gate, up, n, gate_amax_slot|NULL,
 * gate_amax_fmax, up_amax_slot|NULL, up_amax_fmax): gate,up <- dgate,dup in place. The amax slots as rmsnorm's.
 * With FP8 copies (u8[n][F] and 1 x 128 scales, as rmsnorm's fwd_copy): fwd_copy(gate, up, out, n, fmax, copy,
 * scales); bwd_copy, bwd_copy_gate, bwd_copy_up(dout, gate, up, n, gate_fmax, gate_copy, gate_scales, up_fmax,
 * up_copy, up_scales) write both gradients' copies, dgate's or dup's (the other's arguments unused). With row scales,
 * where cp_k_fp8_row_copies says so: fwd_row(gate, up, out, n, fmax, copy u8[n][F], scales f32[n], col_max
 * f32[col_max_rows][F] | NULL, col_max_rows i32) and bwd_row(dout, gate, up, n, then those five for dgate and for dup,
 * copy NULL for none) write the copies with a scale per row and the column maxima as rmsnorm's fwd_row does, a row a
 * block of 512 threads at a time over a persistent grid. */
void cp_k_swiglu(cp_kernel_spec *k, int64_t ffn);
/* Whether entry `role` of module k can write an FP8 copy of its output with 1 x 128 scales beside it (rmsnorm's fwd
 * and bwd, swiglu's fwd and bwd, rope's bwd, ulysses' unpack, when their rows split into whole blocks of 128 as the
 * kernels need). */
bool cp_k_fp8_copies(const cp_kernel_spec *k, const char *role);
/* Whether entry `role` of module k can write an FP8 copy of its output with one scale per row, and the transposed
 * copy's column maxima (rmsnorm's and swiglu's fwd and bwd as fwd_row and bwd_row, where a row's vectors are 8
 * values, and swiglu's rows are at most 16384). */
bool cp_k_fp8_row_copies(const cp_kernel_spec *k, const char *role);
/* loss on a tile of logits [n][V] (bf16, in place -> dlogits*scale): fwdbwd(logits, targets i32[n], row_loss f32[n]
 * out, scale, n). row_loss gets each row's unscaled loss logsumexp - logit[target]; the gradient row is
 * (softmax - onehot(target)) * scale. target < 0 (-1, or HF's -100) is ignored: zero gradient row, loss 0;
 * target >= V gives a NaN loss and a NaN row. sum(row_loss f32[n], n, loss_sum f32[1] +=): the sum of the rows'
 * losses in a fixed order (in double, rounded once), so the loss is the same bits run to run. */
void cp_k_loss(cp_kernel_spec *k, int64_t vocab);
/* adamw (PyTorch AdamW): update(master f32[n], m f32[n], v f32[n], grad f32[n], param bf16[n] out, n, lr, beta1, beta2,
 * eps, wd, grad_scale, step): g = grad*grad_scale; p *= 1 - lr*wd; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
 * p -= lr/(1-b1^step) * m / (sqrt(v)/sqrt(1-b2^step) + eps); master = p; param = bf16(p). step counts from 1.
 * sumsq(grad f32[n], n, partial f64[grid] scratch, counter u32 (0 before, left 0), out f32[1] +=): the sum of
 * squares in a fixed order (per block in double, then the blocks' partials in block order by the last block to
 * finish), so the same bits run to run on one GPU model (the grid follows the SM count). */
void cp_k_adamw(cp_kernel_spec *k);
/* Ulysses layout for one stage. C ranks; each destination rank r gets NOUT heads, head (r / R) * NOUT + j of the
 * source [T][NIN = C/R*NOUT][ROW_BYTES]; R > 1 replicates heads over R ranks (KV heads < GPUs). With C = 1 these
 * are strided copies between a stage's columns and a contiguous head layout.
 * pack(src, src_row_stride_bytes i64, dst[C][T][NOUT][ROW_BYTES]);
 * unpack(src[C][T][NOUT][ROW_BYTES], dst, dst_row_stride_bytes i64) (R must be 1; with R > 1 it traps);
 * unpack_add(src, dst, dst_row_stride_bytes i64): dst += sum over replicas (bf16 rows of ROW_BYTES/2 elements,
 * summed in fp32, rounded once). ROW_BYTES must be a multiple of 4. Where an FP8 GEMM reads unpack's bf16 output:
 * unpack_amax(src, dst, stride, amax_slot, amax_fmax) also takes its amax (as rmsnorm's); unpack_copy(src, dst, stride,
 * fmax, copy u8[T][C * NOUT * ROW_BYTES / 2], copy_scales f32), where cp_k_fp8_copies says so and the rows are written
 * whole, also writes its FP8 copy with 1 x 128 scales. */
void cp_k_ulysses(cp_kernel_spec *k, int gpus, int repl, int64_t tokens, int nout, int64_t row_bytes);
/* attention on head layout: q[S][QH][D], k,v[S][KVH][D], o[S][QH][D], lse[QH][S] (natural log; its rows further
 * apart after cp_k_attention_lse_stride, gen/kernels_attn.h); query head j uses
 * KV head j/(QH/KVH). fwd(q, k, v, o, lse); bwd(q, k, v, dout, lse, delta[S][QH], dq_ws f32[S][QH][D] (written;
 * zeroed before when dq_atomic), dq_prog u32 (zeroed before), dk, dv), then bwd_dq(dq_ws, dq) writes
 * dq = bf16(scale * dq_ws). Every output is the same bits run to run unless dq_atomic, which sums dQ over the key
 * blocks in arrival order (no block waits for another). dk, dv are bf16 written when dkv_accum is false, else f32
 * [S][KVH][D] accumulated (+=) over the stages of a GQA group. Launch geometry and the workspace size:
 * gen/kernels_attn.h. */
void cp_k_attention(cp_kernel_spec *k, int64_t head_dim, int q_heads, int kv_heads, int64_t seq, bool causal,
                    bool dkv_accum, bool dq_atomic);
/* cast: f32_to_bf16(src f32[n], dst bf16[n], n); add_f32(src f32[n], dst f32[n] +=, n). */
void cp_k_cast(cp_kernel_spec *k);
/* fp8 (train.precision = "fp8"): FP8 copies of a GEMM's bf16 input src [rows][cols] (row stride ld elements; rows and
 * cols multiples of 16, ld of 8) with a per-tensor scale from its current values, in a scale slot of
 * CP_FP8_SLOT_BYTES (16-byte aligned): amax_e4m3, amax_e5m2(src, rows, cols, ld, parts f32[CP_FP8_AMAX_PARTS]
 * scratch, counter u32 (0 before, left 0), slot out) write slot[0..2] = {amax / fmax, fmax / amax, amax} (1, 1, 0 for amax 0), fmax the type's
 * largest finite value, 448 (E4M3) or 57344 (E5M2); a producer's own amax (rmsnorm, swiglu) writes the same and
 * keeps its counts and its groups' running maxima in the rest (templates/fp8_amax.cuh: 0 before, left 0);
 * cast_e4m3, cast_e5m2(src, rows, cols, ld, slot, dst u8[rows][cols]) write fp8(x * slot[1]), saturated;
 * cast_t_e4m3, cast_t_e5m2(the same, dst u8[cols][rows]) the transposed copy.
 * Block scaling (train.fp8_scaling = "block"; the layouts: templates/fp8.cu): cast_1d_e4m3, cast_1d_e5m2(src, rows,
 * cols, ld, dst u8[rows][cols], scales f32) with a scale per row and 128 columns (cols a multiple of 128);
 * cast_t_1d_e4m3, cast_t_1d_e5m2 the transposed copy, a scale per column and 128 rows (rows a multiple of 128);
 * cast_rt_1d_e4m3, cast_rt_1d_e5m2(src, rows, cols, ld, dst, scales, dst_t, scales_t) both from one read (rows and
 * cols multiples of 128);
 * cast_2d_e4m3, cast_t_2d_e4m3 a weight's copies, a scale per 128 x 128 tile.
 * Row scaling (train.fp8_scaling = "row"): cast_row_e4m3, cast_row_e5m2(src, rows, cols, ld, dst u8[rows][cols],
 * scales f32[rows]) a scale per row over all of it; cast_t_row_e4m3, cast_t_row_e5m2 the transposed copy
 * (dst u8[cols][rows], scales f32[cols]: a scale per source column; cols a multiple of 32), each after
 * cast_t_row_max (the same arguments), which leaves the column maxima of each CP_FP8_ROW_CHUNK rows behind the
 * scales: scales f32[cols + cp_fp8_row_parts(rows, cols)]; cast_rt_row_e4m3, cast_rt_row_e5m2(src, rows, cols, ld, dst,
 * scales, dst_t, scales_t) both, the row copy and the transposed copy's column maxima (its parts zeroed before), then
 * cast_t_row_* the transposed copy from them: cols at most cp_fp8_row_held's; cast_t_row8_e4m3, cast_t_row8_e5m2(row
 * copy u8[rows][cols], rows, cols, cols, dst, scales, row copy's scales f32[rows]) the transposed copy from a row copy
 * and the column maxima its source's producer left (cols a multiple of CP_FP8_ROW8_COLS); cast_rt_row_layers_e4m3
 * (src, rows, cols, ld, dst, scales, dst_t, scales_t, src_stride, scales_pitch, scales_t_pitch) then
 * cast_t_row8_layers_e4m3(dst, rows, cols, cols, dst_t, scales_t, scales, scales_t_pitch, scales_pitch) both copies
 * of a weight of every layer at once, a layer a grid z (which the caller sets): the weights src_stride elements
 * apart, the copies rows x cols bytes, their scales the pitches (floats: gen/plan.h's cp_fp8_layers_pitch);
 * cast_2d_layers_e4m3, cast_t_2d_layers_e4m3(src, rows, cols, ld, dst, scales, src_stride, scales_pitch) the same with
 * 128 x 128 tiles, a launch each.
 * Each scale is the power of two an element stands for. cp_k_dims takes n = rows and heads = cols. */
#define CP_FP8_ROW8_COLS 64 /* cast_t_row8's strip of columns */
#define CP_FP8_AMAX_PARTS 1024
#define CP_FP8_ROW_CHUNK 1024
/* The column maxima cast_t_row_max leaves behind a transposed row-scaled copy's scales: a row of them per
 * CP_FP8_ROW_CHUNK source rows */
static inline int64_t cp_fp8_row_parts(int64_t rows, int64_t cols) {
    return (rows + CP_FP8_ROW_CHUNK - 1) / CP_FP8_ROW_CHUNK * cols;
}
#define CP_FP8_BLOCK 256 /* the module's threads a block (the row casts' groups assume it) */
/* cast_row holds a row in a group of threads, ROW_VECS vectors of 8 columns a thread: the fewest of 32, 64, ...
 * CP_FP8_BLOCK threads that hold it, CP_FP8_BLOCK / group rows a block at a time (templates/fp8.cu's row_group) */
#define CP_FP8_ROW_VECS 8
static inline int64_t cp_fp8_row_group(int64_t cols) {
    int64_t g = 32;
    while (g < CP_FP8_BLOCK && cols / 8 > g * CP_FP8_ROW_VECS) g *= 2;
    return g;
}
/* Whether a row is held in registers whole (cast_rt_row needs it), and the most rows a block of cast_rt_row takes */
static inline bool cp_fp8_row_held(int64_t cols) { return cols / 8 <= CP_FP8_BLOCK * CP_FP8_ROW_VECS; }
#define CP_FP8_RT_ROWS 128
#define CP_FP8_SLOT_BYTES (128 + 32 * 128) /* the scales, then 32 groups of blocks a 128-byte line each */
void cp_k_fp8(cp_kernel_spec *k);
/* gemm_fp8 (Hopper, sm_90a): D[m][n] = sum over k of A[m][k] B[n][k] on FP8 inputs with block scales, A's per row and
 * 128 of k, B's the same (b_tiles false) or per 128 x 128 tile (a weight's); n and k (kdim) multiples of 128, m the
 * call's; A E5M2 (a gradient) or E4M3, B likewise, not both E5M2. out says what happens to D. Entry
 * sm90(tm_a, tm_b, tm_sa, tm_sb, b_tiles, c, d, m i64, ldd i64) with tensor maps (runtime/gemm_fp8.h: the layouts,
 * templates/gemm_fp8.cu); cp_k_dims takes n = m, and gives the dynamic shared memory. cfg: the CTAs of a cluster
 * (1, or 2 sharing B's tiles) and the consumer warpgroups (2: tiles of 128 rows, 3: of 192; not 3 in clusters of
 * 2), 0 the generator's choice (1; 3, or 2 in clusters of 2). Returns false, with k untouched, for a shape, pair of
 * types or cfg the kernel does not take. */
typedef enum { CP_GEMM_FP8_WRITE = 0, CP_GEMM_FP8_RESIDUAL, CP_GEMM_FP8_ADD_F32, CP_GEMM_FP8_ADD_BF16 } cp_gemm_fp8_out;
typedef struct {
    int cluster, consumers;
} cp_gemm_fp8_cfg;
bool cp_k_gemm_fp8(cp_kernel_spec *k, int64_t n, int64_t kdim, bool a_e5m2, bool b_e5m2, bool b_tiles,
                   cp_gemm_fp8_out out, cp_gemm_fp8_cfg cfg);
/* Whether arch is Hopper's with its architecture-specific features (sm_90a: wgmma, setmaxnreg, TMA multicast), which
 * gemm_fp8 and attention's Hopper entries need. */
bool cp_k_sm90a(const char *arch);
/* delta for the attention backward in token layout: fwd(dout[n][heads][D], out[n][heads][D], delta f32[n][heads], n,
 * heads): delta = sum over D of dout*out in fp32. */
void cp_k_attn_delta(cp_kernel_spec *k, int64_t head_dim);
/* attn_merge, ring attention's merge of the partial results of K/V blocks by their log-sum-exp, on head layout:
 * o_blk bf16 [n][heads][D] and lse_blk f32 [heads][lse_stride] (natural log, -inf for a row no key reached) as the
 * attention forward writes them; o_acc f32 [n][heads][D] and lse_acc f32 [heads][lse_stride] the running result.
 * init(o_blk, lse_blk, o_acc, lse_acc, n, heads, lse_stride): o_acc = o_blk, lse_acc = lse_blk;
 * fwd(same arguments): lse = log(exp(lse_acc) + exp(lse_blk)), o_acc = exp(lse_acc - lse) o_acc +
 * exp(lse_blk - lse) o_blk, lse_acc = lse; rows with both lse -inf are left as they are. A range of query rows is
 * merged by offsetting o_* by rows and lse_* by columns, with lse_stride the full row. */
void cp_k_attn_merge(cp_kernel_spec *k, int64_t head_dim);

/* The step's scalars: the plan's persistent buffer "loss_sum" of CP_SCALARS_BYTES, zeroed by the runtime before
 * every step. Float 0 is the loss sum, float 1 the gradient's sum of squares (these two floats are read back once
 * per step and, with several GPUs, all-reduced); at byte CP_SCALARS_SUMSQ_COUNTER is sumsq's u32 counter; at
 * CP_SCALARS_MEMORY, after the step, CP_SCALARS_RANK_INTS int64 all-reduced with max (the runtime's alone): four of
 * the ranks' measured memory and the stop request (runtime/exec_run.c, spread_memory). */
#define CP_SCALARS_BYTES 256
#define CP_SCALARS_SUMSQ_COUNTER 64
#define CP_SCALARS_MEMORY 128
#define CP_SCALARS_RANK_INTS 5
_Static_assert(CP_SCALARS_MEMORY + 8 * CP_SCALARS_RANK_INTS <= CP_SCALARS_BYTES, "the step's scalars overflow");

/* Persistent grids (rmsnorm bwd, sumsq) follow the SM count, up to this many SMs, so that the scratch their partial
 * sums need is known to the planner (cp_k_scratch_bytes). */
#define CP_KDIMS_MAX_SMS 192

/* Launch geometry: grid.x * grid.y * grid.z blocks of block threads, smem bytes of dynamic shared memory. */
typedef struct {
    unsigned grid[3];
    unsigned block;
    unsigned smem;
} cp_kdims;

/* Geometry of entry `role` of a module made by one of the constructors above (not attention: its geometry is the
 * attention engineer's, in kernels_attn.c). n and heads are the entry's own arguments (heads is used by rope and
 * attn_delta and attn_merge; pass 0 elsewhere; ulysses ignores n too); sms is the device's multiprocessor count.
 * Returns 0, or -1 for a family or role this function does not know. n = 0 gives a zero grid: skip the launch. */
int cp_k_dims(const cp_kernel_spec *k, const char *role, int64_t n, int64_t heads, int sms, cp_kdims *d);

/* Bytes of scratch entry `role` needs for n (its own argument) on any GPU: rmsnorm bwd's dw_part, adamw sumsq's
 * partial; 0 for entries that need none. */
int64_t cp_k_scratch_bytes(const cp_kernel_spec *k, const char *role, int64_t n);

/* The value of a compile-time parameter of a kernel spec, or NULL. */
const char *cp_kspec_get(const cp_kernel_spec *k, const char *key);

/* Kernel variants: a compile-time value of a module that changes one entry's speed and never its results (the Hopper
 * attention forward's K/V ring depth; attention is the only family with variants). A plan gets the generator's
 * default; `cpgen tune` times the others on the GPU and the tuning cache (gen/ktune.h) keeps the fastest per
 * machine and shape, which `run` and `aot` then take. */
#define CP_KVAR_MAX 8
typedef struct {
    char kernel[32];            /* <family>.<role> of the entry that varies: "attention.fwd_sm90" */
    char arch[16];              /* the architecture that runs that entry: "sm_90a" */
    char shape[96];             /* the values its speed depends on: "d128 q24 kv8 s32768 causal" */
    char param[24];             /* the compile-time value varied: "FWD_STAGES" */
    char what[24];              /* what the value means, for output: "K/V stages" */
    char tag[8];                /* the name tag of variant v is <tag><v>: "kvs3" */
    int n, values[CP_KVAR_MAX]; /* the candidates, ascending; each compiles and fits the entry's limits */
    int def;                    /* the generator's default, one of values */
} cp_kvariants;

/* The variants of k's module: true with *v filled, false for a module without any. */
bool cp_k_variants(const cp_kernel_spec *k, cp_kvariants *v);
/* Give k the variant `value` (one of v->values): the compile-time value, and the name tag unless it is the default,
 * so the default emits exactly what a spec that never had a variant set does. */
void cp_k_set_variant(cp_kernel_spec *k, const cp_kvariants *v, int value);
/* The variant k has now. */
int cp_k_variant(const cp_kernel_spec *k, const cp_kvariants *v);

#endif

/* data.h: training sequences, from the source the spec's data.source names (docs/DATA.md):
 *   "tokens:<glob>"     pre-tokenised shards (format below), read in order, position saveable;
 *   "synthetic:recall"  a long-range key/value recall task, a pure function of (seed, sequence index);
 *   "synthetic:copy"    a random first half copied into the second, likewise;
 *   "synthetic:packed"  documents of random lengths, each a small copy task ending in an end-of-document token.
 * Every source gives, for sequence n, tokens[S] and targets[S] (S = train.seq_len; target -1 = no loss there), and
 * for rank r of C the slice tokens[r*T, (r+1)*T) with the targets of those positions (T = S / C), so target
 * r*T + T - 1 is the first token of the next rank's slice.
 *
 * Token shard format (little-endian): a 32-byte header
 *   magic "CPGTOK01" (8 bytes) | u32 version = 2 | u32 token bytes (2 or 4) | u64 token count | u64 eod + 1
 * then count tokens of 2 or 4 bytes. The file is exactly 32 + count * token_bytes bytes. The last field is the
 * end-of-document id + 1, 0 when the shard carries no document boundaries; version 1 (still read) has 0 there,
 * "reserved". All shards of a source carry the same id or none, and the id is below model.vocab.
 *
 * Documents (data.documents, docs/DATA.md "Documents"): with "mask" a sequence is cut into documents after every
 * end-of-document token, no token attends to another document and no target crosses a boundary (the target of a
 * position holding the end-of-document id is -1); after each sequence handed out, the dataset holds where its
 * documents start (cp_docs), the whole sequence's on every rank. With "stream" the sequence is one document. */
#ifndef CP_DATA_H
#define CP_DATA_H

#include <stdbool.h>
#include <stdint.h>

#include "spec.h"

#define CP_TOK_MAGIC "CPGTOK01"
#define CP_TOK_VERSION 2 /* written; 1 and 2 are read */
#define CP_TOK_HEADER 32
#define CP_RECALL_MIN_VOCAB 64
#define CP_RECALL_MIN_SEQ 16
/* The synthetic tasks' held-out sequences (data.val = "synthetic:<task>") are the task's sequences from this index
 * on; a training stream stops before it, so the two never share a sequence. */
#define CP_VAL_FIRST_SEQUENCE ((int64_t)1 << 62)

/* Where a source is: enough to continue exactly where it stopped (store it in a checkpoint). */
typedef struct {
    int64_t sequence; /* sequences handed out so far */
    int64_t epoch;    /* token shards: completed passes over all shards */
    int64_t shard;    /* token shards: index in the sorted shard list */
    int64_t offset;   /* token shards: token index in that shard where the next sequence starts */
} cp_data_pos;

/* ------------------------------------------------------------------------------------------------------------
 * token shards */

typedef struct {
    int nshards;
    char **paths;     /* sorted by name */
    int64_t *counts;  /* tokens per shard */
    int *token_bytes; /* 2 or 4 per shard */
    int64_t *before;  /* [nshards + 1]: sequences in the shards before each (before[nshards]: in all of them) */
    int64_t vocab, seq_len;
    int64_t eod;      /* the shards' end-of-document id, -1: none (version 1, or written without one) */
    int64_t seq_lo, seq_hi; /* the part of the stream read, by sequence index over all shards: [seq_lo, seq_hi);
                             * after the last the reader starts at seq_lo again (cp_tokens_limit) */
    cp_data_pos pos;
    int fd, fd_shard; /* the open shard (-1: none) */
    void *buf;        /* raw tokens of one read */
} cp_tokens;

/* Open every file matching `pattern` (a glob, or one path), sorted by name, and check each header: magic, version,
 * token bytes, size = header + count x bytes (a truncated or padded file is rejected), count >= seq_len + 1, the
 * end-of-document id below vocab and the same in every shard (or none in all; a mix is refused naming a shard of
 * each kind). Token values are checked against vocab as they are read. Returns 0, or -1 with a message naming the
 * file. */
int cp_tokens_open(cp_tokens *r, const char *pattern, int64_t vocab, int64_t seq_len, char *err, int errlen);
void cp_tokens_close(cp_tokens *r);
/* The headers alone of the shards matching `pattern` (no token data, no sequence length): *found = false when no file
 * matches (not an error), else their common end-of-document id in *eod (-1: none). Returns -1 with a message for a
 * header that is not a shard's, an id not below vocab, or shards that disagree. */
int cp_tokens_probe(const char *pattern, int64_t vocab, bool *found, int64_t *eod, char *err, int errlen);

/* Read the next sequence's tokens [first, first + n) (first + n <= seq_len + 1) into out, then, when advance,
 * move to the next sequence. Sequences start every seq_len tokens within a shard (each token is a target once);
 * a shard's tail shorter than seq_len + 1 is skipped, and after the last sequence of the part read (the last shard's,
 * unless cp_tokens_limit says otherwise) the reader starts that part's first again (epoch + 1). Fails on a token
 * >= vocab with the file, the token's index in it and its value. */
int cp_tokens_read(cp_tokens *r, int64_t first, int64_t n, int32_t *out, bool advance, char *err, int errlen);

/* Continue from a saved position; fails when it does not fit these shards, or lies outside the part read. */
int cp_tokens_seek(cp_tokens *r, const cp_data_pos *pos, char *err, int errlen);

/* Sequences of seq_len + 1 tokens the shards hold: sum over shards of (count - 1) / seq_len (each shard's tail
 * shorter than a sequence is skipped). Sequence i of the stream is the i-th of them in shard order. */
int64_t cp_tokens_sequences(const cp_tokens *r);
/* Read only sequences [lo, hi) of the stream (0 <= lo < hi <= cp_tokens_sequences), from sequence lo, epoch 0. */
void cp_tokens_limit(cp_tokens *r, int64_t lo, int64_t hi);

/* data.val = "split:<fraction>" of a stream of n sequences: the held-out part is the last
 * floor(fraction x n) sequences (a product within 1e-9 of a whole number counts as that number, so 0.1 of 30 is 3),
 * *train the ones before. Returns 0, or -1 with a message when either part would be empty. */
int cp_val_split_counts(int64_t n, double fraction, int64_t *train, int64_t *held, char *err, int errlen);

/* Write a shard of version 2: tokens must be in [0, 2^(8 token_bytes)); eod is the end-of-document id the header
 * records (-1: none). Atomic (temporary name, then rename). */
int cp_tokens_write(const char *path, const int32_t *tokens, int64_t n, int token_bytes, int64_t eod, char *err,
                    int errlen);

/* ------------------------------------------------------------------------------------------------------------
 * synthetic:recall
 *
 * Token ranges from the vocabulary V (>= 64): 0 = BOS, filler [1, V/2), keys [V/2, V/2 + V/4), values
 * [V/2 + V/4, V). Sequence n of length S (>= 16): position 0 is BOS; the context [1, S - 2P) is filler tokens with
 * P = min(V/4, S/16) "key value" pairs at random places (distinct keys, random values); the last 2P positions are
 * the query section: the same P pairs again, in a new random order. The target of a query key is its value (the
 * next token); every other target is -1 (ignored): filler is random, so its loss would only add noise, and the
 * loss then measures recall alone. The value of a query can only be known by finding its key earlier in the
 * context, far back on average (S/2 positions). An untrained model that learned "the answer is a value token"
 * scores the chance loss ln(V - V/2 - V/4). Everything is drawn from a SplitMix64 stream started at
 * mix(mix(seed) ^ n), so sequence n is the same whatever was generated before, on any rank. */
typedef struct {
    int64_t vocab, seq_len;
    int64_t filler_lo, filler_hi, key_lo, key_hi, val_lo, val_hi; /* half-open ranges */
    int64_t pairs;
    uint64_t seed;
} cp_recall;

int cp_recall_init(cp_recall *r, int64_t vocab, int64_t seq_len, uint64_t seed, char *err, int errlen);
/* Sequence `index`: tokens[seq_len], targets[seq_len]. */
void cp_recall_sequence(const cp_recall *r, int64_t index, int32_t *tokens, int32_t *targets);
/* ln(number of values): the loss on recall positions of a model that knows only the value range. */
double cp_recall_chance_loss(const cp_recall *r);

/* ------------------------------------------------------------------------------------------------------------
 * synthetic:copy
 *
 * Sequence n of length S (>= 8) over the vocabulary V (>= 4): position 0 is BOS (0); positions 1..h, h = (S-1)/2,
 * are tokens drawn uniformly from [1, V); from position h+1 to the end the same tokens follow again, in order.
 * The targets are the next tokens of positions h+1 .. S-2 (the copy after its first token, which nothing
 * announces); every other target is -1. Each scored token sits h positions back, so a model predicts it only by
 * attending across half the sequence; chance is ln(V - 1). A two-layer model learns it (an induction head) where
 * it does not learn synthetic:recall in the same budget, which is why the tiny spec trains on it. Drawn from the
 * same counter-based stream as synthetic:recall. */
typedef struct {
    int64_t vocab, seq_len;
    uint64_t seed;
} cp_copy;

int cp_copy_init(cp_copy *c, int64_t vocab, int64_t seq_len, uint64_t seed, char *err, int errlen);
void cp_copy_sequence(const cp_copy *c, int64_t index, int32_t *tokens, int32_t *targets);
double cp_copy_chance_loss(const cp_copy *c);

/* ------------------------------------------------------------------------------------------------------------
 * synthetic:packed
 *
 * Documents of random lengths packed into each sequence, for the document masks' tests and runs. Token ranges from
 * the vocabulary V (>= 8): 0 = end of document (the id data.documents = "mask" cuts after), 1 = BOS, content [2, V).
 * Sequence n of length S (>= 16): with chance 1/16 one document fills it; else documents follow each other until S,
 * each length drawn as one of eight kinds: 1 token (the end alone), 128 (one kernel tile), up to the next multiple of
 * 128, up to the next multiple of 64, S/4 to S/2 (longer than a GPU's slice at 8 GPUs), and three kinds of 2 to
 * S/32 + 1; the last is cut to end at S. A document of L >= 2 tokens is a small copy task, as synthetic:copy scaled
 * to it: BOS, h = (L - 2)/2 tokens drawn from [2, V), the same again (L - 2 - h tokens, copied h back), the end; the
 * targets are the next tokens of the copy after its first token, up to the token before the end; every other target
 * is -1, so nothing is scored across a boundary and the loss falls only by attending inside a document. Chance is
 * ln(V - 2). Drawn from the same counter-based stream as the other tasks (lengths and tokens from one SplitMix64
 * stream started at mix(mix(seed) ^ n)). */
#define CP_PACKED_EOD 0
#define CP_PACKED_BOS 1
#define CP_PACKED_FIRST 2 /* first content token */
#define CP_PACKED_MIN_VOCAB 8
#define CP_PACKED_MIN_SEQ 16
typedef struct {
    int64_t vocab, seq_len;
    uint64_t seed;
} cp_packed;

int cp_packed_init(cp_packed *p, int64_t vocab, int64_t seq_len, uint64_t seed, char *err, int errlen);
void cp_packed_sequence(const cp_packed *p, int64_t index, int32_t *tokens, int32_t *targets);
double cp_packed_chance_loss(const cp_packed *p);

/* ------------------------------------------------------------------------------------------------------------
 * documents of a sequence */

/* Where the documents of one sequence of S tokens start: start[0] = 0, ascending, n >= 1; document k holds positions
 * [start[k], start[k + 1]) (the last up to S). */
typedef struct {
    int64_t n, cap;
    int32_t *start;
} cp_docs;

/* The documents of tokens[0, S): position 0 starts one, and position p + 1 does where tokens[p] is eod (p + 1 < S);
 * eod < 0 gives one document (tokens may then be NULL). Reuses d's memory; d starts zeroed. */
void cp_docs_from_tokens(cp_docs *d, const int32_t *tokens, int64_t S, int64_t eod);
void cp_docs_free(cp_docs *d);

/* The helpers below are pure: the planner and the executor call them on a sequence's documents. */

/* RoPE positions restarting at each document (data.positions = "document"): pos[t] = (first + t) minus the start of
 * the document holding position first + t, for t < n. */
void cp_docs_positions(const cp_docs *d, int64_t first, int64_t n, int32_t *pos);
/* For every position i < S: doc_start[i] = the start of its document, doc_end[i] = one past its last position. */
void cp_docs_bounds(const cp_docs *d, int64_t S, int32_t *doc_start, int32_t *doc_end);
/* The fraction of causal attention's tiles a kernel computes with query tiles of bm rows and key tiles of bn rows
 * under document masks: tile (query rows [i0, i1), key rows [j0, j1)) is computed iff j0 <= i1 - 1 (causal) and
 * j1 - 1 >= doc_start[i0] (a key in the document of the tile's first row); the denominator is the tiles computed
 * with one document (causal alone). *kept (if not NULL) = the scores kept (key j for query i with doc_start[i] <= j
 * <= i) over causal attention's S (S + 1) / 2. NAN for S, bm or bn below 1. One document gives 1 and 1. */
double cp_docs_tile_work(const cp_docs *d, int64_t S, int bm, int bn, double *kept); /* gen/doc_work.h */
/* The mean length of the documents in the first max_tokens tokens of the shards matching pattern (in order, across
 * shards): the tokens up to the last end-of-document id among them over the documents it ends; eod < 0 takes the
 * shards' own id (refused where they carry none). Where no document ends that soon, the tokens read (a lower
 * bound). For the planner's time model: attention's work under a mask falls with the documents' length. */
int cp_tokens_mean_doc_len(const char *pattern, int64_t vocab, int64_t eod, int64_t max_tokens, double *mean,
                           char *err, int errlen);
/* The same for a spec's training data, at most train.seq_len (a sequence cuts longer documents): its shards'
 * documents in their first max_tokens tokens, synthetic:packed's in its first max_tokens / seq_len sequences (at least
 * one); seq_len where data.documents resolves to "stream". Returns 0, or -1 with a message. */
int cp_data_mean_doc_len(const cp_spec *spec, int64_t max_tokens, double *mean, char *err, int errlen);

/* ------------------------------------------------------------------------------------------------------------
 * the spec's source */

typedef enum { CP_DATA_TOKENS, CP_DATA_RECALL, CP_DATA_COPY, CP_DATA_PACKED } cp_data_kind;

typedef struct {
    bool synthetic;
    cp_data_kind kind;
    int documents; /* CP_DOCS_STREAM or CP_DOCS_MASK: spec->data.documents, resolved when the stream opens */
    int64_t eod;   /* with CP_DOCS_MASK, the id that ends documents in this stream; -1: none (or stream mode) */
    cp_recall recall;
    cp_copy copy;
    cp_packed packed;
    cp_tokens tokens;
    int64_t seq_len;
    int64_t sequence; /* synthetic: next sequence index */
    int64_t targets_seq; /* target tokens (not ignored) in the whole of the last sequence, all ranks' slices */
    int64_t targets_round; /* the same over the last round's sequences, one per replica (cp_dataset_next_slice; with
                            * cp_dataset_next, the last sequence's): the loss's divisor counts every group's */
    int32_t *scratch; /* synthetic: one full sequence of tokens and targets; tokens with a mask: a sequence's S + 1 */
    cp_docs docs;     /* the documents of the sequence the last cp_dataset_next(_slice) came from, all of it (every
                       * rank gets every start, whatever its slice); one document in stream mode */
    int64_t first, end; /* synthetic: the stream's first sequence index and the index it must not reach */
    int64_t count;      /* the stream's distinct sequences before it repeats; -1: it never does (synthetic) */
} cp_dataset;

/* spec->data.documents and positions with AUTO replaced by what the source says (docs/DATA.md, "Documents"): mask
 * where it has document boundaries (tokens: shards whose headers carry an end-of-document id, data.eod given, or
 * synthetic:packed), else stream; positions "document" with mask, else "sequence". Only shard headers are read. Where
 * no shard matches (a plan made without the data) AUTO becomes stream, or mask with data.eod, and no error is given.
 * Refuses, with a message naming the spec file, the key and the fix: mask on a source without boundaries, positions
 * "document" with stream, data.eod unlike the shards' own id, shards that disagree or whose id is not below
 * model.vocab, and with mask held-out shards (data.val) without boundaries or with another id. Returns 0 or -1. The
 * command line calls it on every spec it loads (cli/main.c, gen/tune.c, cli/cmd_tune.c); a dataset opened on an
 * unresolved spec resolves it the same way. */
int cp_data_resolve_documents(cp_spec *spec, char *err, int errlen);

/* Open spec->data.source for spec->train.seq_len and spec->model.vocab. The synthetic seed is spec->init.seed. With
 * data.val = "split:<fraction>" the stream is the shards' sequences before the held-out part (cp_val_split_counts),
 * and starts again at the first after them; a synthetic stream ends before CP_VAL_FIRST_SEQUENCE. */
int cp_dataset_open(cp_dataset *d, const cp_spec *spec, char *err, int errlen);
/* Open spec->data.val, the held-out stream the validation loss reads (runtime/eval.c): other shards ("tokens:", none
 * of them a file data.source reads), the shards' held-out part ("split:"), or a synthetic task from
 * CP_VAL_FIRST_SEQUENCE on ("synthetic:"); positioned at its start, and refused when it holds fewer sequences than
 * train.eval_sequences (an evaluation would read some twice). Returns 0, or -1 with a message. */
int cp_dataset_open_val(cp_dataset *d, const cp_spec *spec, char *err, int errlen);
/* Back to the first sequence of the stream (an evaluation reads the same sequences each time). */
void cp_dataset_rewind(cp_dataset *d);
/* The next sequence, rank's slice of C: tokens[T], targets[T], T = seq_len / C. Every rank calls it once per
 * sequence and all see the same sequence. Returns 0, or -1 with a message (bad token in a shard, I/O error). */
int cp_dataset_next(cp_dataset *d, int rank, int C, int32_t *tokens, int32_t *targets, char *err, int errlen);
/* Which part of the data a rank of several groups trains on (gen/ranks.h): its replica among R (group g reads
 * sequences g, g + R, ... of the stream), its ring position among P (the sequence cut into 2P chunks, position p
 * holding chunks p and 2P-1-p, in that order: the zigzag split) and its rank among the group's C. */
typedef struct {
    int replica, replicas, ring_pos, ring, rank, gpus;
} cp_data_slice;
/* The next round of sequences, one per replica: this rank's T = seq_len / (ring x gpus) tokens and targets of its
 * replica's sequence. Every rank of the run calls it once per round; afterwards the stream stands at the next round
 * for all of them, so a position saved by any rank resumes every one exactly, and every token is a target once.
 * With one replica, no ring and rank r of C it reads what cp_dataset_next does. Returns 0, or -1 with a message. */
int cp_dataset_next_slice(cp_dataset *d, const cp_data_slice *sl, int32_t *tokens, int32_t *targets, char *err,
                          int errlen);
void cp_dataset_tell(const cp_dataset *d, cp_data_pos *pos);
int cp_dataset_seek(cp_dataset *d, const cp_data_pos *pos, char *err, int errlen);
void cp_dataset_close(cp_dataset *d);
/* The loss of a model that knows the token ranges but not the context: synthetic tasks' chance, else ln(vocab). */
double cp_dataset_chance_loss(const cp_dataset *d, int64_t vocab);

#endif

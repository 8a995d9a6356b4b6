/* data.c: token shard reader and writer, the synthetic recall task, and the spec's data source (see data.h and
 * docs/DATA.md). */
#include "data.h"

#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "doc_work.h"
#include "ring.h"
#include "util.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "data.c assumes a little-endian host"
#endif

static uint64_t get_u64(const unsigned char *p) {
    uint64_t v = 0;
    for (int k = 7; k >= 0; k--) v = v << 8 | p[k];
    return v;
}
static uint32_t get_u32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static void put_u64(unsigned char *p, uint64_t v) {
    for (int k = 0; k < 8; k++) p[k] = (unsigned char)(v >> (8 * k));
}
static void put_u32(unsigned char *p, uint32_t v) {
    for (int k = 0; k < 4; k++) p[k] = (unsigned char)(v >> (8 * k));
}


/* ------------------------------------------------------------------------------------------------------------
 * token shards */

/* Check one shard's header against its size: its count, token bytes and end-of-document id (-1: none). With
 * seq_len < 0 the count is not held against a sequence (looking at headers only, cp_data_resolve_documents). */
static int check_shard(const char *path, int64_t vocab, int64_t seq_len, int64_t *count, int *tb, int64_t *eod,
                       char *err, int errlen) {
    int64_t size;
    char why[256];
    int fd = cp_open_file(path, CP_FILE_DATA, &size, why, sizeof why); /* a FIFO or device is refused, never read */
    if (fd < 0)
        return cp_errf(err, errlen, "%s: cannot open: %s; data.source must match token shard files only", path, why);
    int rc = 0;
    if (size < CP_TOK_HEADER) {
        rc = cp_errf(err, errlen,
                  "%s: %lld bytes, shorter than the %d-byte token shard header: truncated or not a token "
                  "shard (docs/DATA.md)",
                  path, (long long)size, CP_TOK_HEADER);
        goto out;
    }
    unsigned char h[CP_TOK_HEADER];
    if ((rc = cp_pread_all(fd, h, CP_TOK_HEADER, 0, path, "regenerate it", err, errlen))) goto out;
    if (memcmp(h, CP_TOK_MAGIC, 8) != 0) {
        char shown[40];
        size_t at = 0;
        for (int k = 0; k < 8; k++)
            at += (size_t)snprintf(shown + at, sizeof shown - at, h[k] >= 0x20 && h[k] < 0x7f ? "%c" : "\\x%02x", h[k]);
        rc = cp_errf(err, errlen,
                  "%s: starts with \"%s\", not the token shard magic \"%s\": not a cpgen token shard "
                  "(convert it as docs/DATA.md shows)",
                  path, shown, CP_TOK_MAGIC);
        goto out;
    }
    uint32_t version = get_u32(h + 8), bytes = get_u32(h + 12);
    uint64_t n = get_u64(h + 16), reserved = get_u64(h + 24);
    if (version < 1 || version > CP_TOK_VERSION) {
        rc = cp_errf(err, errlen, "%s: token shard version %u; this cpgen reads versions 1 to %d", path, version,
                     CP_TOK_VERSION);
        goto out;
    }
    if (bytes != 2 && bytes != 4) {
        rc = cp_errf(err, errlen, "%s: token size %u bytes; it must be 2 or 4: the header is corrupt", path, bytes);
        goto out;
    }
    if (version == 1 && reserved != 0) {
        rc = cp_errf(err, errlen, "%s: the reserved header field is %llu, not 0: the header is corrupt", path,
                  (unsigned long long)reserved);
        goto out;
    }
    /* version 2: the field is the end-of-document id + 1, 0 for none */
    if (reserved > (bytes == 2 ? 0x10000ull : 0x100000000ull)) {
        rc = cp_errf(err, errlen, "%s: the header's end-of-document id is %llu, which %u-byte tokens cannot hold: the "
                     "header is corrupt", path, (unsigned long long)(reserved - 1), bytes);
        goto out;
    }
    if (reserved && (int64_t)reserved - 1 >= vocab) {
        rc = cp_errf(err, errlen, "%s: the header's end-of-document id is %llu, not below model.vocab = %lld: the "
                     "shards were made for a larger vocabulary; set model.vocab to the model_vocab in the <out>.json "
                     "that tools/make_tokens.py wrote beside them", path, (unsigned long long)(reserved - 1),
                     (long long)vocab);
        goto out;
    }
    *eod = (int64_t)reserved - 1;
    uint64_t payload = (uint64_t)size - CP_TOK_HEADER;
    if (n > payload / bytes) {
        rc = cp_errf(err, errlen,
                  "%s: the header says %llu tokens (%llu bytes) but the file holds %llu bytes after the "
                  "header: it is truncated; regenerate it",
                  path, (unsigned long long)n, (unsigned long long)(n > UINT64_MAX / bytes ? UINT64_MAX : n * bytes),
                  (unsigned long long)payload);
        goto out;
    }
    if (n * bytes != payload) {
        rc = cp_errf(err, errlen,
                  "%s: the header says %llu tokens but %llu bytes follow it (%llu too many): the file is "
                  "corrupt",
                  path, (unsigned long long)n, (unsigned long long)payload, (unsigned long long)(payload - n * bytes));
        goto out;
    }
    if (seq_len >= 0 && (int64_t)n < seq_len + 1) {
        rc = cp_errf(err, errlen,
                  "%s: %llu tokens, fewer than one sequence of train.seq_len + 1 = %lld: merge small "
                  "shards or use a shorter seq_len",
                  path, (unsigned long long)n, (long long)(seq_len + 1));
        goto out;
    }
    *count = (int64_t)n;
    *tb = (int)bytes;
out:
    close(fd);
    return rc;
}

/* The files matching a shard pattern, sorted by name (glob sorts them); *n = 0 when none matches. */
static int list_shards(const char *pattern, char ***paths, int *n, char *err, int errlen) {
    *paths = NULL;
    *n = 0;
    glob_t g;
    memset(&g, 0, sizeof g);
    int grc = glob(pattern, 0, NULL, &g); /* a folder that is missing or unreadable matches nothing */
    if (grc == GLOB_NOMATCH || (grc == 0 && g.gl_pathc == 0)) {
        globfree(&g);
        return 0;
    }
    if (grc != 0) {
        globfree(&g);
        return cp_errf(err, errlen, "data.source tokens:%s: listing the files failed (%s)", pattern,
                       grc == GLOB_NOSPACE ? "out of memory" : "a folder could not be read");
    }
    *n = (int)g.gl_pathc;
    *paths = cp_xcalloc((size_t)*n, sizeof **paths);
    for (int k = 0; k < *n; k++) (*paths)[k] = cp_xstrdup(g.gl_pathv[k]);
    globfree(&g);
    return 0;
}

static void eod_words(int64_t eod, char *b, size_t n) {
    if (eod < 0) snprintf(b, n, "no end-of-document id (a version-1 shard, or made without one)");
    else snprintf(b, n, "end-of-document id %lld", (long long)eod);
}

/* The shards of one source share one end-of-document id, or all have none: a mix means two tokenizers (or shards
 * made before and after version 2), and boundaries found in one part only. */
static int shards_agree(char *const *paths, const int64_t *eods, int n, int64_t *eod, char *err, int errlen) {
    for (int k = 1; k < n; k++)
        if (eods[k] != eods[0]) {
            char a[96], b[96];
            eod_words(eods[0], a, sizeof a);
            eod_words(eods[k], b, sizeof b);
            return cp_errf(err, errlen, "%s has %s but %s has %s: the shards of one source must agree; remake them "
                           "together with tools/make_tokens.py, or give the two kinds as separate sources", paths[0],
                           a, paths[k], b);
        }
    *eod = n ? eods[0] : -1;
    return 0;
}

static void free_paths(char **paths, int n) {
    for (int k = 0; k < n; k++) free(paths[k]);
    free(paths);
}

int cp_tokens_probe(const char *pattern, int64_t vocab, bool *found, int64_t *eod, char *err, int errlen) {
    *found = false;
    *eod = -1;
    char **paths;
    int n;
    if (list_shards(pattern, &paths, &n, err, errlen)) return -1;
    int64_t *eods = cp_xcalloc((size_t)CP_MAX(n, 1), sizeof *eods), count;
    int tb, rc = 0;
    for (int k = 0; k < n && !rc; k++) rc = check_shard(paths[k], vocab, -1, &count, &tb, &eods[k], err, errlen);
    if (!rc) rc = shards_agree(paths, eods, n, eod, err, errlen);
    *found = n > 0;
    free(eods);
    free_paths(paths, n);
    return rc;
}

int cp_tokens_open(cp_tokens *r, const char *pattern, int64_t vocab, int64_t seq_len, char *err, int errlen) {
    memset(r, 0, sizeof *r);
    r->fd = r->fd_shard = -1;
    r->eod = -1;
    if (vocab < 1 || vocab > INT32_MAX || seq_len < 1)
        return cp_errf(err, errlen, "token shards: vocab %lld or seq_len %lld out of range (a cpgen bug)",
                    (long long)vocab, (long long)seq_len);
    r->vocab = vocab;
    r->seq_len = seq_len;
    if (list_shards(pattern, &r->paths, &r->nshards, err, errlen)) return -1;
    if (!r->nshards)
        return cp_errf(err, errlen,
                    "data.source tokens:%s: no file matches; check the path (a glob such as "
                    "\"data/shards/*.bin\" is expanded by cpgen, quote it in the shell)",
                    pattern);
    r->counts = cp_xcalloc((size_t)r->nshards, sizeof *r->counts);
    r->token_bytes = cp_xcalloc((size_t)r->nshards, sizeof *r->token_bytes);
    int64_t *eods = cp_xcalloc((size_t)r->nshards, sizeof *eods);
    int rc = 0;
    for (int k = 0; k < r->nshards && !rc; k++)
        rc = check_shard(r->paths[k], vocab, seq_len, &r->counts[k], &r->token_bytes[k], &eods[k], err, errlen);
    if (!rc) rc = shards_agree(r->paths, eods, r->nshards, &r->eod, err, errlen);
    free(eods);
    if (rc) {
        cp_tokens_close(r);
        return -1;
    }
    r->buf = cp_xmalloc((size_t)(seq_len + 1) * 4);
    /* sequences start every seq_len tokens while seq_len + 1 remain: (count - 1) / seq_len of them per shard */
    r->before = cp_xcalloc((size_t)r->nshards + 1, sizeof *r->before);
    for (int k = 0; k < r->nshards; k++) r->before[k + 1] = r->before[k] + (r->counts[k] - 1) / seq_len;
    r->seq_lo = 0;
    r->seq_hi = r->before[r->nshards];
    return 0;
}

int64_t cp_tokens_sequences(const cp_tokens *r) { return r->before ? r->before[r->nshards] : 0; }

/* Sequence g of the stream (over all shards): its shard and the token where it starts. */
static void tokens_goto(cp_tokens *r, int64_t g) {
    int lo = 0, hi = r->nshards - 1; /* the shard k with before[k] <= g < before[k + 1] */
    while (lo < hi) {
        int mid = lo + (hi - lo + 1) / 2;
        if (r->before[mid] <= g) lo = mid;
        else hi = mid - 1;
    }
    r->pos.shard = lo;
    r->pos.offset = (g - r->before[lo]) * r->seq_len;
}

/* The stream's index of the sequence at the position. */
static int64_t tokens_index(const cp_tokens *r, const cp_data_pos *pos) {
    return r->before[pos->shard] + pos->offset / r->seq_len;
}

void cp_tokens_limit(cp_tokens *r, int64_t lo, int64_t hi) {
    r->seq_lo = lo;
    r->seq_hi = hi;
    memset(&r->pos, 0, sizeof r->pos);
    tokens_goto(r, lo);
}

int cp_val_split_counts(int64_t n, double fraction, int64_t *train, int64_t *held, char *err, int errlen) {
    /* fraction x n rounded down, but 0.1 x 30 = 3.0000000000000004 and 0.29 x 100 = 28.999999999999996 are the
     * whole numbers a user means */
    double x = fraction * (double)n, whole = nearbyint(x);
    *held = fabs(x - whole) <= 1e-9 * fmax(1.0, x) ? (int64_t)whole : (int64_t)floor(x);
    *train = n - *held;
    if (*held < 1)
        return cp_errf(err, errlen, "%g of the %lld sequences is less than one sequence: hold out at least %.3g (1 "
                       "sequence), or give more shards", fraction, (long long)n, 1.0 / (double)n);
    if (*train < 1)
        return cp_errf(err, errlen, "holding out %g of the %lld sequences leaves none to train on: hold out less",
                       fraction, (long long)n);
    return 0;
}

void cp_tokens_close(cp_tokens *r) {
    if (!r) return;
    if (r->fd >= 0) close(r->fd);
    for (int k = 0; k < r->nshards; k++) free(r->paths[k]);
    free(r->paths);
    free(r->counts);
    free(r->token_bytes);
    free(r->before);
    free(r->buf);
    memset(r, 0, sizeof *r);
    r->fd = r->fd_shard = -1;
}

int cp_tokens_read(cp_tokens *r, int64_t first, int64_t n, int32_t *out, bool advance, char *err, int errlen) {
    if (first < 0 || n < 0 || first + n > r->seq_len + 1)
        return cp_errf(err, errlen, "token shards: tokens [%lld, %lld) of a sequence of %lld asked (a cpgen bug)",
                    (long long)first, (long long)(first + n), (long long)(r->seq_len + 1));
    int s = (int)r->pos.shard;
    const char *path = r->paths[s];
    if (r->fd_shard != s) {
        if (r->fd >= 0) close(r->fd);
        r->fd_shard = -1;
        char why[256];
        r->fd = cp_open_file(path, CP_FILE_DATA, NULL, why, sizeof why);
        if (r->fd < 0) return cp_errf(err, errlen, "%s: cannot open: %s", path, why);
        r->fd_shard = s;
    }
    int tb = r->token_bytes[s];
    int64_t at = r->pos.offset + first;
    if (cp_pread_all(r->fd, r->buf, n * tb, CP_TOK_HEADER + at * tb, path, "regenerate it", err, errlen))
        return -1;
    for (int64_t k = 0; k < n; k++) {
        uint32_t v = tb == 2 ? ((const uint16_t *)r->buf)[k] : ((const uint32_t *)r->buf)[k];
        if ((int64_t)v >= r->vocab)
            return cp_errf(err, errlen,
                        "%s: token %lld is %u, not below the vocabulary size model.vocab = %lld: the "
                        "shard was made with another tokenizer, or is corrupt",
                        path, (long long)(at + k), v, (long long)r->vocab);
        out[k] = (int32_t)v;
    }
    if (advance) {
        /* the next sequence of the part read: the next start in this shard, else the next shard's first; after the
         * part's last, its first again */
        r->pos.sequence++;
        int64_t g = tokens_index(r, &r->pos) + 1;
        if (g >= r->seq_hi) {
            g = r->seq_lo;
            r->pos.epoch++;
        }
        tokens_goto(r, g);
    }
    return 0;
}

int cp_tokens_seek(cp_tokens *r, const cp_data_pos *pos, char *err, int errlen) {
    if (pos->shard < 0 || pos->shard >= r->nshards)
        return cp_errf(err, errlen,
                    "resuming the data: the saved position is in shard %lld, but the source has %d "
                    "shards: the shards changed since the checkpoint",
                    (long long)pos->shard, r->nshards);
    if (pos->offset < 0 || pos->offset % r->seq_len != 0 || pos->offset + r->seq_len + 1 > r->counts[pos->shard])
        return cp_errf(err, errlen,
                    "resuming the data: the saved position (token %lld of %s) is not a sequence start of "
                    "that shard (%lld tokens, seq_len %lld): the shards or seq_len changed since the checkpoint",
                    (long long)pos->offset, r->paths[pos->shard], (long long)r->counts[pos->shard],
                    (long long)r->seq_len);
    if (pos->sequence < 0 || pos->epoch < 0)
        return cp_errf(err, errlen, "resuming the data: the saved position has a negative count");
    int64_t g = tokens_index(r, pos);
    if (g < r->seq_lo || g >= r->seq_hi)
        return cp_errf(err, errlen,
                       "resuming the data: the saved position (token %lld of %s) is sequence %lld of the shards, "
                       "outside sequences %lld-%lld that training reads (the rest are held out by data.val's split): "
                       "the split or the shards changed since the checkpoint; resume with the data.val it was saved "
                       "with", (long long)pos->offset, r->paths[pos->shard], (long long)g, (long long)r->seq_lo,
                       (long long)(r->seq_hi - 1));
    r->pos = *pos;
    return 0;
}

int cp_tokens_write(const char *path, const int32_t *tokens, int64_t n, int token_bytes, int64_t eod, char *err,
                    int errlen) {
    if (token_bytes != 2 && token_bytes != 4)
        return cp_errf(err, errlen, "%s: token bytes must be 2 or 4, not %d", path, token_bytes);
    if (n < 0) return cp_errf(err, errlen, "%s: negative token count", path);
    if (eod < -1 || eod > (token_bytes == 2 ? 0xffff : INT32_MAX))
        return cp_errf(err, errlen, "%s: end-of-document id %lld does not fit %d unsigned bytes (-1: none)", path,
                       (long long)eod, token_bytes);
    for (int64_t k = 0; k < n; k++)
        if (tokens[k] < 0 || (token_bytes == 2 && tokens[k] > 0xffff))
            return cp_errf(err, errlen, "%s: token %lld is %d, which does not fit %d unsigned bytes%s", path, (long long)k,
                        tokens[k], token_bytes, token_bytes == 2 ? " (use 4-byte tokens)" : "");
    size_t len = CP_TOK_HEADER + (size_t)n * (size_t)token_bytes;
    unsigned char *b = cp_xcalloc(len, 1);
    memcpy(b, CP_TOK_MAGIC, 8);
    put_u32(b + 8, CP_TOK_VERSION);
    put_u32(b + 12, (uint32_t)token_bytes);
    put_u64(b + 16, (uint64_t)n);
    put_u64(b + 24, (uint64_t)(eod + 1)); /* version 2: the end-of-document id + 1, 0 for none */
    for (int64_t k = 0; k < n; k++) {
        unsigned char *p = b + CP_TOK_HEADER + k * token_bytes;
        p[0] = (unsigned char)tokens[k];
        p[1] = (unsigned char)(tokens[k] >> 8);
        if (token_bytes == 4) {
            p[2] = (unsigned char)(tokens[k] >> 16);
            p[3] = (unsigned char)(tokens[k] >> 24);
        }
    }
    int rc = 0;
    if (cp_write_file_atomic(path, b, len) != 0)
        rc = cp_errf(err, errlen, "%s: writing failed: %s", path, strerror(errno));
    free(b);
    return rc;
}

/* ------------------------------------------------------------------------------------------------------------
 * synthetic:recall */

typedef struct {
    uint64_t s;
} rng;
static uint64_t next64(rng *g) { return cp_mix64(g->s += 0x9e3779b97f4a7c15ULL); } /* SplitMix64 */
/* Uniform in [0, n), n > 0, without bias (rejection). */
static uint64_t below(rng *g, uint64_t n) {
    uint64_t lim = -n % n, x;
    do x = next64(g);
    while (x < lim);
    return x % n;
}

int cp_recall_init(cp_recall *r, int64_t vocab, int64_t seq_len, uint64_t seed, char *err, int errlen) {
    memset(r, 0, sizeof *r);
    if (vocab < CP_RECALL_MIN_VOCAB)
        return cp_errf(err, errlen,
                    "data.source synthetic:recall needs model.vocab >= %d (filler, key and value token "
                    "ranges), not %lld",
                    CP_RECALL_MIN_VOCAB, (long long)vocab);
    if (vocab > INT32_MAX)
        return cp_errf(err, errlen, "synthetic:recall: model.vocab %lld is too large", (long long)vocab);
    if (seq_len < CP_RECALL_MIN_SEQ)
        return cp_errf(err, errlen, "data.source synthetic:recall needs train.seq_len >= %d, not %lld", CP_RECALL_MIN_SEQ,
                    (long long)seq_len);
    r->vocab = vocab;
    r->seq_len = seq_len;
    r->seed = seed;
    r->filler_lo = 1;
    r->filler_hi = vocab / 2;
    r->key_lo = vocab / 2;
    r->key_hi = vocab / 2 + vocab / 4;
    r->val_lo = r->key_hi;
    r->val_hi = vocab;
    r->pairs = CP_MIN(r->key_hi - r->key_lo, seq_len / 16);
    return 0;
}

double cp_recall_chance_loss(const cp_recall *r) { return log((double)(r->val_hi - r->val_lo)); }

void cp_recall_sequence(const cp_recall *r, int64_t index, int32_t *tokens, int32_t *targets) {
    int64_t S = r->seq_len, P = r->pairs, nk = r->key_hi - r->key_lo;
    rng g = {cp_mix64(cp_mix64(r->seed) ^ (uint64_t)index)};
    /* P distinct keys (partial Fisher-Yates), each with a value */
    int32_t *keys = cp_xmalloc((size_t)nk * sizeof *keys), *vals = cp_xmalloc((size_t)P * sizeof *vals);
    for (int64_t k = 0; k < nk; k++) keys[k] = (int32_t)(r->key_lo + k);
    for (int64_t k = 0; k < P; k++) {
        int64_t j = k + (int64_t)below(&g, (uint64_t)(nk - k));
        int32_t t = keys[k];
        keys[k] = keys[j];
        keys[j] = t;
        vals[k] = (int32_t)(r->val_lo + (int64_t)below(&g, (uint64_t)(r->val_hi - r->val_lo)));
    }
    for (int64_t i = 0; i < S; i++) targets[i] = -1;
    /* context [1, S - 2P): P pair slots among f filler slots, chosen by selection sampling (Knuth's Algorithm S) */
    tokens[0] = 0;
    int64_t f = S - 4 * P - 1, slots = P + f, need = P, pos = 1, next = 0;
    for (int64_t s = 0; s < slots; s++) {
        if ((int64_t)below(&g, (uint64_t)(slots - s)) < need) {
            tokens[pos] = keys[next];
            tokens[pos + 1] = vals[next];
            pos += 2;
            next++;
            need--;
        } else {
            tokens[pos++] = (int32_t)(r->filler_lo + (int64_t)below(&g, (uint64_t)(r->filler_hi - r->filler_lo)));
        }
    }
    /* query section: the pairs again in a random order; a key's target is its value */
    int64_t *perm = cp_xmalloc((size_t)P * sizeof *perm);
    for (int64_t k = 0; k < P; k++) perm[k] = k;
    for (int64_t k = P - 1; k > 0; k--) {
        int64_t j = (int64_t)below(&g, (uint64_t)(k + 1)), t = perm[k];
        perm[k] = perm[j];
        perm[j] = t;
    }
    for (int64_t k = 0; k < P; k++) {
        tokens[pos] = keys[perm[k]];
        tokens[pos + 1] = vals[perm[k]];
        targets[pos] = vals[perm[k]];
        pos += 2;
    }
    free(perm);
    free(keys);
    free(vals);
}

/* ------------------------------------------------------------------------------------------------------------
 * synthetic:copy */

enum { CP_COPY_MIN_VOCAB = 4, CP_COPY_MIN_SEQ = 8 };

int cp_copy_init(cp_copy *c, int64_t vocab, int64_t seq_len, uint64_t seed, char *err, int errlen) {
    memset(c, 0, sizeof *c);
    if (vocab < CP_COPY_MIN_VOCAB || vocab > INT32_MAX)
        return cp_errf(err, errlen, "data.source synthetic:copy needs %d <= model.vocab <= %d, not %lld",
                       CP_COPY_MIN_VOCAB, INT32_MAX, (long long)vocab);
    if (seq_len < CP_COPY_MIN_SEQ)
        return cp_errf(err, errlen, "data.source synthetic:copy needs train.seq_len >= %d, not %lld", CP_COPY_MIN_SEQ,
                       (long long)seq_len);
    c->vocab = vocab;
    c->seq_len = seq_len;
    c->seed = seed;
    return 0;
}

double cp_copy_chance_loss(const cp_copy *c) { return log((double)(c->vocab - 1)); }

void cp_copy_sequence(const cp_copy *c, int64_t index, int32_t *tokens, int32_t *targets) {
    int64_t S = c->seq_len, h = (S - 1) / 2;
    rng g = {cp_mix64(cp_mix64(c->seed) ^ (uint64_t)index)};
    tokens[0] = 0;
    for (int64_t i = 1; i <= h; i++) tokens[i] = (int32_t)(1 + (int64_t)below(&g, (uint64_t)(c->vocab - 1)));
    for (int64_t i = h + 1; i < S; i++) tokens[i] = tokens[i - h];
    for (int64_t i = 0; i < S; i++) targets[i] = i > h && i + 1 < S ? tokens[i + 1] : -1;
}

/* ------------------------------------------------------------------------------------------------------------
 * synthetic:packed */

int cp_packed_init(cp_packed *p, int64_t vocab, int64_t seq_len, uint64_t seed, char *err, int errlen) {
    memset(p, 0, sizeof *p);
    if (vocab < CP_PACKED_MIN_VOCAB || vocab > INT32_MAX)
        return cp_errf(err, errlen, "data.source synthetic:packed needs %d <= model.vocab <= %d, not %lld",
                       CP_PACKED_MIN_VOCAB, INT32_MAX, (long long)vocab);
    if (seq_len < CP_PACKED_MIN_SEQ || seq_len > INT32_MAX)
        return cp_errf(err, errlen, "data.source synthetic:packed needs train.seq_len >= %d, not %lld",
                       CP_PACKED_MIN_SEQ, (long long)seq_len);
    p->vocab = vocab;
    p->seq_len = seq_len;
    p->seed = seed;
    return 0;
}

double cp_packed_chance_loss(const cp_packed *p) { return log((double)(p->vocab - CP_PACKED_FIRST)); }

/* The length of the next document starting at pos, of the kinds the kernels' edge cases need (data.h). */
static int64_t packed_length(rng *g, int64_t S, int64_t pos) {
    int64_t L;
    switch (below(g, 8)) {
    case 0: L = 1; break;
    case 1: L = 128; break; /* one kernel tile */
    case 2: L = 128 - pos % 128; break; /* ends on a multiple of 128 */
    case 3: L = 64 - pos % 64; break; /* ends on a multiple of 64 */
    case 4: L = S / 4 + (int64_t)below(g, (uint64_t)(S / 4 + 1)); break; /* longer than a GPU's slice at 8 GPUs */
    default: L = 2 + (int64_t)below(g, (uint64_t)CP_MAX(1, S / 32)); break;
    }
    return CP_MIN(L, S - pos);
}

void cp_packed_sequence(const cp_packed *p, int64_t index, int32_t *tokens, int32_t *targets) {
    int64_t S = p->seq_len;
    rng g = {cp_mix64(cp_mix64(p->seed) ^ (uint64_t)index)};
    bool whole = below(&g, 16) == 0; /* sometimes one document fills the sequence */
    for (int64_t pos = 0; pos < S;) {
        int64_t L = whole ? S : packed_length(&g, S, pos);
        int32_t *t = tokens + pos, *y = targets + pos;
        /* BOS | h random tokens | the same again | end; a document of 1 is the end alone */
        int64_t c = L - 2, h = c > 0 ? c / 2 : 0;
        for (int64_t j = 0; j < L; j++) y[j] = -1;
        if (L >= 2) t[0] = CP_PACKED_BOS;
        for (int64_t j = 1; j <= c; j++)
            t[j] = h && j > h ? t[j - h]
                              : (int32_t)(CP_PACKED_FIRST + (int64_t)below(&g, (uint64_t)(p->vocab - CP_PACKED_FIRST)));
        for (int64_t j = h + 1; h && j + 1 <= c; j++) y[j] = t[j + 1]; /* the copy after its first token */
        t[L - 1] = CP_PACKED_EOD;
        pos += L;
    }
}

/* ------------------------------------------------------------------------------------------------------------
 * the spec's source */

static const char *const SYNTHETIC[] = {"synthetic:recall", "synthetic:copy", "synthetic:packed"};
static const cp_data_kind SYNTHETIC_KIND[] = {CP_DATA_RECALL, CP_DATA_COPY, CP_DATA_PACKED};

static bool is_synthetic(const char *src) {
    for (size_t k = 0; k < CP_ARRAY_LEN(SYNTHETIC); k++)
        if (!strcmp(src, SYNTHETIC[k])) return true;
    return false;
}

/* ------------------------------------------------------------------------------------------------------------
 * documents: where boundaries come from */

/* What the source `src` (data.source or data.val, named by `key`) says of documents, from its shard headers only:
 * *looked = false where there is nothing to look at (no shard matches: `cpgen plan` on a machine without the data),
 * and *eod its end-of-document id, -1 where it has none. data.eod stands in for shards that carry none, and must
 * equal the id of shards that do. */
static int source_eod(const cp_spec *spec, const char *key, const char *src, bool *looked, int64_t *eod, char *err,
                      int errlen) {
    *looked = true;
    *eod = -1;
    if (!strncmp(src, "split:", 6)) return source_eod(spec, "data.source", spec->data.source, looked, eod, err, errlen);
    if (!strcmp(src, "synthetic:packed")) {
        *eod = CP_PACKED_EOD;
        return 0;
    }
    if (strncmp(src, "tokens:", 7)) return 0; /* synthetic:copy, recall: one task per sequence, no boundaries */
    int64_t shards = -1;
    char why[CP_ERR_MAX];
    if (cp_tokens_probe(src + 7, spec->model.vocab, looked, &shards, why, sizeof why))
        return cp_errf(err, errlen, "%s: %s = \"%.200s\": %s", spec->path, key, src, why);
    if (shards >= 0 && spec->data.eod >= 0 && shards != spec->data.eod)
        return cp_errf(err, errlen, "%s: data.eod = %lld, but the shards of %s = \"%.200s\" carry end-of-document id "
                       "%lld in their headers: the two must be equal; remove data.eod (the shards' own is used) or "
                       "set it to %lld", spec->path, (long long)spec->data.eod, key, src, (long long)shards,
                       (long long)shards);
    *eod = shards >= 0 ? shards : spec->data.eod;
    return 0;
}

/* The modes of a spec with AUTO replaced, and the training source's end-of-document id (-1: none). */
static int resolve(const cp_spec *spec, int *documents, int *positions, int64_t *eod, char *err, int errlen) {
    const cp_data *dt = &spec->data;
    bool looked;
    if (source_eod(spec, "data.source", dt->source, &looked, eod, err, errlen)) return -1;
    int docs = dt->documents;
    if (docs == CP_DOCS_AUTO) docs = *eod >= 0 ? CP_DOCS_MASK : CP_DOCS_STREAM;
    if (docs == CP_DOCS_MASK && *eod < 0 && looked) {
        bool tok = !strncmp(dt->source, "tokens:", 7);
        return cp_errf(err, errlen, "%s: data.documents = \"mask\": data.source = \"%.200s\" has no document "
                       "boundaries%s, so there is nothing to mask; %s, or data.documents = \"stream\"", spec->path,
                       dt->source, tok ? " (its shards carry no end-of-document id and data.eod is not set)" : "",
                       tok ? "set data.eod to the id that ends documents in the shards, or remake them with "
                             "tools/make_tokens.py (which records it)"
                           : "use data.source = \"synthetic:packed\"");
    }
    int pos = dt->positions;
    if (pos == CP_POS_AUTO) pos = docs == CP_DOCS_MASK ? CP_POS_DOCUMENT : CP_POS_SEQUENCE;
    if (pos == CP_POS_DOCUMENT && docs != CP_DOCS_MASK)
        return cp_errf(err, errlen, "%s: data.positions = \"document\": positions restart at each document only where "
                       "attention stays inside documents, and data.documents is \"stream\"%s; set data.documents = "
                       "\"mask\", or data.positions = \"sequence\"", spec->path,
                       dt->documents == CP_DOCS_AUTO ? " (data.source has no document boundaries)" : "");
    /* held-out shards are cut where training's are: with a mask they need boundaries too, and the same id */
    if (docs == CP_DOCS_MASK && !strncmp(dt->val, "tokens:", 7)) {
        int64_t veod;
        if (source_eod(spec, "data.val", dt->val, &looked, &veod, err, errlen)) return -1;
        if (looked && veod < 0)
            return cp_errf(err, errlen, "%s: data.documents = \"mask\": the shards of data.val = \"%.200s\" carry no "
                           "end-of-document id and data.eod is not set, so their documents cannot be masked as "
                           "training's are; set data.eod, or remake them with tools/make_tokens.py", spec->path,
                           dt->val);
        if (looked && *eod >= 0 && veod != *eod)
            return cp_errf(err, errlen, "%s: data.val = \"%.200s\": its shards end documents with id %lld, and those of "
                           "data.source = \"%.200s\" with %lld: held-out shards must come from the same tokenizer",
                           spec->path, dt->val, (long long)veod, dt->source, (long long)*eod);
    }
    *documents = docs;
    *positions = pos;
    return 0;
}

int cp_data_resolve_documents(cp_spec *spec, char *err, int errlen) {
    int docs, pos;
    int64_t eod;
    if (resolve(spec, &docs, &pos, &eod, err, errlen)) return -1;
    spec->data.documents = docs;
    spec->data.positions = pos;
    return 0;
}

int cp_data_mean_doc_len(const cp_spec *spec, int64_t max_tokens, double *mean, char *err, int errlen) {
    int64_t S = spec->train.seq_len, eod;
    int docs, pos;
    *mean = (double)S;
    if (resolve(spec, &docs, &pos, &eod, err, errlen)) return -1;
    if (docs != CP_DOCS_MASK) return 0;
    const char *src = spec->data.source;
    if (!strcmp(src, "synthetic:packed")) {
        cp_packed p;
        if (cp_packed_init(&p, spec->model.vocab, S, spec->init.seed, err, errlen)) return -1;
        int32_t *buf = cp_xmalloc((size_t)S * 2 * sizeof *buf);
        int64_t n = CP_MAX(1, (max_tokens + S - 1) / S), ends = 0;
        for (int64_t q = 0; q < n; q++) {
            cp_packed_sequence(&p, q, buf, buf + S);
            for (int64_t i = 0; i < S; i++) ends += buf[i] == CP_PACKED_EOD;
        }
        free(buf);
        *mean = (double)(n * S) / (double)ends; /* every sequence ends with the end of a document */
        return 0;
    }
    if (strncmp(src, "tokens:", 7)) return 0;
    double m;
    if (cp_tokens_mean_doc_len(src + 7, spec->model.vocab, eod, max_tokens, &m, err, errlen)) return -1;
    *mean = CP_MIN(m, (double)S); /* a sequence cuts a longer document */
    return 0;
}

/* A synthetic task's stream of sequences [first, end). */
static int open_synthetic(cp_dataset *d, const char *src, const cp_spec *spec, int64_t first, int64_t end, char *err,
                          int errlen) {
    d->synthetic = true;
    for (size_t k = 0; k < CP_ARRAY_LEN(SYNTHETIC); k++)
        if (!strcmp(src, SYNTHETIC[k])) d->kind = SYNTHETIC_KIND[k];
    int64_t V = spec->model.vocab;
    uint64_t seed = spec->init.seed;
    if (d->kind == CP_DATA_RECALL   ? cp_recall_init(&d->recall, V, d->seq_len, seed, err, errlen)
        : d->kind == CP_DATA_COPY ? cp_copy_init(&d->copy, V, d->seq_len, seed, err, errlen)
                                  : cp_packed_init(&d->packed, V, d->seq_len, seed, err, errlen))
        return -1;
    d->scratch = cp_xmalloc((size_t)d->seq_len * 2 * sizeof *d->scratch);
    d->first = d->sequence = first;
    d->end = end;
    d->count = -1;
    return 0;
}

/* The shards of a tokens: source split by data.val = "split:<fraction>": the training part (held = false) or the
 * held-out one. */
static int open_split(cp_dataset *d, const cp_spec *spec, double fraction, bool held, char *err, int errlen) {
    const char *src = spec->data.source;
    if (cp_tokens_open(&d->tokens, src + 7, spec->model.vocab, d->seq_len, err, errlen)) return -1;
    int64_t n = cp_tokens_sequences(&d->tokens), ntrain, nheld;
    char why[CP_ERR_MAX];
    if (cp_val_split_counts(n, fraction, &ntrain, &nheld, why, sizeof why)) {
        cp_tokens_close(&d->tokens);
        return cp_errf(err, errlen, "data.val = \"%.200s\" with data.source = \"%.200s\" (sequences of train.seq_len + "
                       "1 = %lld tokens): %s", spec->data.val, src, (long long)(d->seq_len + 1), why);
    }
    if (held) cp_tokens_limit(&d->tokens, ntrain, n);
    else cp_tokens_limit(&d->tokens, 0, ntrain);
    d->count = held ? nheld : ntrain;
    return 0;
}

/* The run's document mode, and the end-of-document id of the stream read from `src` (-1 in stream mode). */
static int open_documents(cp_dataset *d, const cp_spec *spec, const char *key, const char *src, char *err,
                          int errlen) {
    int pos;
    int64_t eod;
    if (resolve(spec, &d->documents, &pos, &eod, err, errlen)) return -1;
    bool looked;
    if (src != spec->data.source && source_eod(spec, key, src, &looked, &eod, err, errlen)) return -1;
    d->eod = d->documents == CP_DOCS_MASK ? eod : -1;
    cp_docs_from_tokens(&d->docs, NULL, d->seq_len, -1); /* one document until a sequence is read */
    return 0;
}

int cp_dataset_open(cp_dataset *d, const cp_spec *spec, char *err, int errlen) {
    memset(d, 0, sizeof *d);
    d->tokens.fd = d->tokens.fd_shard = -1;
    d->seq_len = spec->train.seq_len;
    const char *src = spec->data.source;
    if (open_documents(d, spec, "data.source", src, err, errlen)) return -1;
    if (is_synthetic(src)) return open_synthetic(d, src, spec, 0, CP_VAL_FIRST_SEQUENCE, err, errlen);
    if (!strncmp(src, "tokens:", 7)) {
        double f;
        if (cp_val_split(spec->data.val, &f)) return open_split(d, spec, f, false, err, errlen);
        if (cp_tokens_open(&d->tokens, src + 7, spec->model.vocab, d->seq_len, err, errlen)) return -1;
        d->count = cp_tokens_sequences(&d->tokens);
        return 0;
    }
    return cp_errf(err, errlen, "data.source = \"%s\": unknown source; use \"synthetic:copy\", \"synthetic:recall\" or \"tokens:<glob>\"",
                src);
}

/* A file the training glob `pattern` matches that is also one of the shards r opened (the same file by device and
 * inode, whatever the path): its name in r, or NULL. */
static const char *shared_shard(const char *pattern, const cp_tokens *r) {
    glob_t g;
    memset(&g, 0, sizeof g);
    const char *hit = NULL;
    if (glob(pattern, 0, NULL, &g) == 0)
        for (size_t i = 0; i < g.gl_pathc && !hit; i++) {
            struct stat a, b;
            if (stat(g.gl_pathv[i], &a)) continue;
            for (int k = 0; k < r->nshards && !hit; k++)
                if (!stat(r->paths[k], &b) && a.st_dev == b.st_dev && a.st_ino == b.st_ino) hit = r->paths[k];
        }
    globfree(&g);
    return hit;
}

int cp_dataset_open_val(cp_dataset *d, const cp_spec *spec, char *err, int errlen) {
    memset(d, 0, sizeof *d);
    d->tokens.fd = d->tokens.fd_shard = -1;
    d->seq_len = spec->train.seq_len;
    const char *val = spec->data.val;
    double f;
    int rc;
    if (open_documents(d, spec, "data.val", val, err, errlen)) return -1;
    if (is_synthetic(val)) {
        rc = open_synthetic(d, val, spec, CP_VAL_FIRST_SEQUENCE, INT64_MAX, err, errlen);
    } else if (cp_val_split(val, &f) && !strncmp(spec->data.source, "tokens:", 7)) {
        rc = open_split(d, spec, f, true, err, errlen);
    } else if (!strncmp(val, "tokens:", 7)) {
        rc = cp_tokens_open(&d->tokens, val + 7, spec->model.vocab, d->seq_len, err, errlen);
        const char *both = NULL;
        if (!rc && !strncmp(spec->data.source, "tokens:", 7)) both = shared_shard(spec->data.source + 7, &d->tokens);
        if (both) {
            rc = cp_errf(err, errlen, "data.val = \"%.200s\": %s is also a training shard (data.source = "
                         "\"%.200s\"): a validation loss on data the model trains on measures nothing held out; give "
                         "other shards, or hold out the end of the training ones with data.val = "
                         "\"split:<fraction>\"", val, both, spec->data.source);
            cp_tokens_close(&d->tokens);
        }
        if (!rc) d->count = cp_tokens_sequences(&d->tokens);
    } else {
        return cp_errf(err, errlen, "data.val = \"%.200s\": no held-out data to open (spec.c lets through only "
                       "\"tokens:\", \"split:\" with tokens: data and \"synthetic:\"; a cpgen bug)", val);
    }
    if (rc) return -1;
    int want = spec->train.eval_sequences;
    if (d->count >= 0 && d->count < want) {
        int64_t have = d->count, seq = d->seq_len;
        cp_dataset_close(d);
        return cp_errf(err, errlen, "train.eval_sequences = %d, but data.val = \"%.200s\" holds %lld sequence%s of "
                       "train.seq_len + 1 = %lld tokens, so an evaluation would read some twice: lower "
                       "train.eval_sequences to at most %lld, or hold out more", want, val, (long long)have,
                       have == 1 ? "" : "s", (long long)(seq + 1), (long long)have);
    }
    return 0;
}

void cp_dataset_rewind(cp_dataset *d) {
    if (d->synthetic) d->sequence = d->first;
    else cp_tokens_limit(&d->tokens, d->tokens.seq_lo, d->tokens.seq_hi);
}

/* A synthetic stream about to hand out sequences up to sequence + n: never into the held-out ones. */
static int synthetic_room(const cp_dataset *d, int64_t n, char *err, int errlen) {
    if (d->sequence <= d->end - n) return 0;
    return cp_errf(err, errlen, "data: the synthetic stream reached sequence %lld, where data.val's held-out "
                   "sequences begin; train fewer steps", (long long)d->end);
}

/* ------------------------------------------------------------------------------------------------------------
 * documents of a sequence */

static void docs_push(cp_docs *d, int64_t start) {
    if (d->n == d->cap) {
        d->cap = d->cap ? 2 * d->cap : 16;
        d->start = cp_xrealloc(d->start, (size_t)d->cap * sizeof *d->start);
    }
    d->start[d->n++] = (int32_t)start;
}

void cp_docs_from_tokens(cp_docs *d, const int32_t *tokens, int64_t S, int64_t eod) {
    d->n = 0;
    docs_push(d, 0);
    for (int64_t p = 0; eod >= 0 && p + 1 < S; p++)
        if (tokens[p] == eod) docs_push(d, p + 1);
}

void cp_docs_free(cp_docs *d) {
    if (!d) return;
    free(d->start);
    memset(d, 0, sizeof *d);
}

void cp_docs_positions(const cp_docs *d, int64_t first, int64_t n, int32_t *pos) {
    if (n <= 0 || d->n < 1) return;
    int64_t lo = 0, hi = d->n - 1; /* the last document starting at or before `first` */
    while (lo < hi) {
        int64_t mid = lo + (hi - lo + 1) / 2;
        if (d->start[mid] <= first) lo = mid;
        else hi = mid - 1;
    }
    for (int64_t t = 0, k = lo; t < n; t++) {
        while (k + 1 < d->n && d->start[k + 1] <= first + t) k++;
        pos[t] = (int32_t)(first + t - d->start[k]);
    }
}

void cp_docs_bounds(const cp_docs *d, int64_t S, int32_t *doc_start, int32_t *doc_end) {
    for (int64_t k = 0; k < d->n; k++) {
        int64_t a = d->start[k], b = k + 1 < d->n ? d->start[k + 1] : S;
        for (int64_t i = CP_MAX(a, 0); i < CP_MIN(b, S); i++) {
            doc_start[i] = (int32_t)a;
            doc_end[i] = (int32_t)b;
        }
    }
}

double cp_docs_tile_work(const cp_docs *d, int64_t S, int bm, int bn, double *kept) {
    return cp_doc_tile_work(d->start, d->n, S, bm, bn, kept);
}

int cp_tokens_mean_doc_len(const char *pattern, int64_t vocab, int64_t eod, int64_t max_tokens, double *mean,
                           char *err, int errlen) {
    *mean = NAN;
    cp_tokens r;
    if (cp_tokens_open(&r, pattern, vocab, 1, err, errlen)) return -1;
    if (eod < 0) eod = r.eod;
    if (eod < 0) {
        cp_tokens_close(&r);
        return cp_errf(err, errlen, "tokens:%s: the shards carry no end-of-document id and none was given, so they have "
                       "no documents to measure", pattern);
    }
    enum { CHUNK = 1 << 20 };
    unsigned char *buf = cp_xmalloc((size_t)CHUNK * 4);
    int64_t seen = 0, ended = 0, docs = 0; /* tokens read; tokens up to the last end read; documents ended */
    int rc = 0;
    for (int s = 0; s < r.nshards && seen < max_tokens && !rc; s++) {
        char why[256];
        int fd = cp_open_file(r.paths[s], CP_FILE_DATA, NULL, why, sizeof why);
        if (fd < 0) {
            rc = cp_errf(err, errlen, "%s: cannot open: %s", r.paths[s], why);
            break;
        }
        int tb = r.token_bytes[s];
        for (int64_t at = 0; at < r.counts[s] && seen < max_tokens && !rc; at += CHUNK) {
            int64_t n = CP_MIN(CP_MIN((int64_t)CHUNK, r.counts[s] - at), max_tokens - seen);
            rc = cp_pread_all(fd, buf, n * tb, CP_TOK_HEADER + at * tb, r.paths[s], "regenerate it", err, errlen);
            for (int64_t k = 0; k < n && !rc; k++) {
                uint32_t v = tb == 2 ? ((const uint16_t *)buf)[k] : ((const uint32_t *)buf)[k];
                if (v == (uint64_t)eod) {
                    docs++;
                    ended = seen + k + 1;
                }
            }
            seen += n;
        }
        close(fd);
    }
    free(buf);
    cp_tokens_close(&r);
    if (!rc) *mean = docs ? (double)ended / (double)docs : (double)seen; /* no end yet: at least that long */
    return rc;
}

/* A buffer for a whole sequence's S + 1 tokens (its S inputs and the last one's target). */
static int32_t *seq_buf(cp_dataset *d) {
    if (!d->scratch) d->scratch = cp_xmalloc((size_t)(d->seq_len * 2 + 1) * sizeof *d->scratch);
    return d->scratch;
}

/* In mask mode no target of a position holding the end-of-document id (it would be the next document's first
 * token): targets -1 there; returns the count of targets of the S positions that remain, tgt NULL counting only. */
static int64_t mask_targets(const cp_dataset *d, const int32_t *tok, int32_t *tgt, int64_t S) {
    int64_t n = 0;
    for (int64_t i = 0; i < S; i++) {
        bool end = d->eod >= 0 && tok[i] == d->eod;
        if (tgt && end) tgt[i] = -1;
        n += tgt ? tgt[i] >= 0 : !end;
    }
    return n;
}

/* Synthetic sequence `index` into the scratch (tokens, then targets), its targets masked at document ends, and its
 * count of targets. */
static void synthetic_sequence(cp_dataset *d, int64_t index) {
    int32_t *tok = d->scratch, *tgt = d->scratch + d->seq_len;
    if (d->kind == CP_DATA_RECALL)
        cp_recall_sequence(&d->recall, index, tok, tgt);
    else if (d->kind == CP_DATA_COPY)
        cp_copy_sequence(&d->copy, index, tok, tgt);
    else
        cp_packed_sequence(&d->packed, index, tok, tgt);
    d->targets_seq = mask_targets(d, tok, tgt, d->seq_len);
}

int cp_dataset_next(cp_dataset *d, int rank, int C, int32_t *tokens, int32_t *targets, char *err, int errlen) {
    if (C < 1 || rank < 0 || rank >= C || d->seq_len % C)
        return cp_errf(err, errlen, "data: rank %d of %d GPUs cannot split seq_len %lld (a cpgen bug)", rank, C,
                    (long long)d->seq_len);
    /* one group, no ring: the slice of rank r is tokens [r T, (r + 1) T) */
    cp_data_slice one = {.replica = 0, .replicas = 1, .ring_pos = 0, .ring = 1, .rank = rank, .gpus = C};
    return cp_dataset_next_slice(d, &one, tokens, targets, err, errlen);
}

int cp_dataset_next_slice(cp_dataset *d, const cp_data_slice *sl, int32_t *tokens, int32_t *targets, char *err,
                          int errlen) {
    int64_t S = d->seq_len, parts = (int64_t)sl->ring * sl->gpus;
    if (sl->replicas < 1 || sl->replica < 0 || sl->replica >= sl->replicas || sl->ring < 1 || sl->ring_pos < 0 ||
        sl->ring_pos >= sl->ring || sl->gpus < 1 || sl->rank < 0 || sl->rank >= sl->gpus ||
        S % (sl->ring > 1 ? 2 * parts : parts))
        return cp_errf(err, errlen, "data: replica %d of %d, ring position %d of %d, rank %d of %d cannot split seq_len "
                       "%lld (a cpgen bug)", sl->replica, sl->replicas, sl->ring_pos, sl->ring, sl->rank, sl->gpus,
                       (long long)S);
    int64_t T = S / parts;
    /* the slice in up to two runs of consecutive positions (a rank's tokens may straddle the two zigzag chunks);
     * without a ring, one run at rank x T */
    cp_ring_rope_run run[2];
    int nruns = cp_ring_rope_runs(sl->ring, sl->ring_pos, S, sl->gpus, sl->rank, run);
    int rc = 0;
    if (d->synthetic) {
        if (synthetic_room(d, sl->replicas, err, errlen)) return -1;
        /* the other replicas' sequences only for their target counts (the loss is divided by the round's) */
        int64_t others = 0;
        for (int g = 0; g < sl->replicas; g++)
            if (g != sl->replica) {
                synthetic_sequence(d, d->sequence + g);
                others += d->targets_seq;
            }
        synthetic_sequence(d, d->sequence + sl->replica);
        d->targets_round = others + d->targets_seq;
        for (int k = 0; k < nruns; k++) {
            memcpy(tokens + run[k].row0, d->scratch + run[k].pos0, (size_t)run[k].rows * sizeof *tokens);
            memcpy(targets + run[k].row0, d->scratch + S + run[k].pos0, (size_t)run[k].rows * sizeof *targets);
        }
        cp_docs_from_tokens(&d->docs, d->scratch, S, d->eod);
        d->sequence += sl->replicas;
        return 0;
    }
    if (d->documents == CP_DOCS_MASK) {
        /* every rank reads the whole sequence of each replica: its documents start after end-of-document tokens
         * anywhere in it, and the round's target count leaves out every replica's document ends */
        int32_t *full = seq_buf(d);
        d->targets_round = 0;
        for (int g = 0; g < sl->replicas && !rc; g++) {
            bool mine = g == sl->replica;
            rc = cp_tokens_read(&d->tokens, 0, mine ? S + 1 : S, full, false, err, errlen);
            if (rc) break;
            int64_t n = mask_targets(d, full, NULL, S);
            d->targets_round += n;
            if (mine) {
                d->targets_seq = n;
                cp_docs_from_tokens(&d->docs, full, S, d->eod);
                for (int k = 0; k < nruns; k++) {
                    int64_t a = run[k].pos0, m = run[k].rows;
                    memcpy(tokens + run[k].row0, full + a, (size_t)m * sizeof *tokens);
                    memcpy(targets + run[k].row0, full + a + 1, (size_t)m * sizeof *targets);
                    mask_targets(d, full + a, targets + run[k].row0, m);
                }
            }
            rc = cp_tokens_read(&d->tokens, 0, 0, full, true, err, errlen); /* on to the next sequence */
        }
        return rc;
    }
    /* token shards, one document: skip the other replicas' sequences of the round; each run reads one token more,
     * its targets */
    int32_t *tmp = cp_xmalloc((size_t)(T + 1) * sizeof *tmp);
    for (int g = 0; g < sl->replicas && !rc; g++) {
        for (int k = 0; g == sl->replica && k < nruns && !rc; k++) {
            rc = cp_tokens_read(&d->tokens, run[k].pos0, run[k].rows + 1, tmp, false, err, errlen);
            if (rc) break;
            memcpy(tokens + run[k].row0, tmp, (size_t)run[k].rows * sizeof *tokens);
            memcpy(targets + run[k].row0, tmp + 1, (size_t)run[k].rows * sizeof *targets);
        }
        if (!rc) rc = cp_tokens_read(&d->tokens, 0, 0, tmp, true, err, errlen); /* on to the next sequence */
    }
    d->targets_seq = S;
    d->targets_round = S * sl->replicas;
    cp_docs_from_tokens(&d->docs, NULL, S, -1);
    free(tmp);
    return rc;
}

void cp_dataset_tell(const cp_dataset *d, cp_data_pos *pos) {
    if (d->synthetic) {
        memset(pos, 0, sizeof *pos);
        pos->sequence = d->sequence;
    } else {
        *pos = d->tokens.pos;
    }
}

int cp_dataset_seek(cp_dataset *d, const cp_data_pos *pos, char *err, int errlen) {
    if (d->synthetic) {
        if (pos->sequence < d->first || pos->sequence >= d->end)
            return cp_errf(err, errlen, "resuming the data: sequence index %lld is outside the stream's %lld-%lld",
                           (long long)pos->sequence, (long long)d->first, (long long)(d->end - 1));
        d->sequence = pos->sequence;
        return 0;
    }
    return cp_tokens_seek(&d->tokens, pos, err, errlen);
}

double cp_dataset_chance_loss(const cp_dataset *d, int64_t vocab) {
    if (d->synthetic)
        return d->kind == CP_DATA_RECALL ? cp_recall_chance_loss(&d->recall)
               : d->kind == CP_DATA_COPY ? cp_copy_chance_loss(&d->copy)
                                         : cp_packed_chance_loss(&d->packed);
    return log((double)vocab);
}

void cp_dataset_close(cp_dataset *d) {
    if (!d) return;
    cp_tokens_close(&d->tokens);
    free(d->scratch);
    cp_docs_free(&d->docs);
    memset(d, 0, sizeof *d);
}

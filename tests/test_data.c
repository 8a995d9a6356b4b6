/* test_data.c: token shards (write -> read round trip in 2- and 4-byte tokens, sequence stepping across shards and
 * epochs, rank slices, bad files rejected with the file and the reason, tokens >= vocab reported with file, index
 * and value, position save/restore continuing identically) and the synthetic recall task (deterministic, token
 * ranges, every recall target answerable only from earlier context). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data.h"
#include "ring.h"
#include "sh.h"
#include "source_tree.h"
#include "spec.h"
#include "util.h"

static char err[CP_ERR_MAX];
static char root[256];

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(p);
}

static char *path_in(const char *name) {
    static char buf[64][512];
    static int k;
    char *b = buf[k++ % 64];
    snprintf(b, sizeof buf[0], "%s/%s", root, name);
    return b;
}

static bool contains(const char *hay, const char *needle) { return strstr(hay, needle) != NULL; }

static void write_bytes(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, n, f), n);
    fclose(f);
}

/* Shard k of a corpus holds tokens base + i (mod vocab), so every position is recognisable. */
static int32_t *corpus(int64_t n, int32_t base, int32_t vocab) {
    int32_t *t = malloc((size_t)n * sizeof *t);
    for (int64_t i = 0; i < n; i++) t[i] = (int32_t)((base + i) % vocab);
    return t;
}

static void write_shard(const char *name, int64_t n, int32_t base, int32_t vocab, int bytes) {
    int32_t *t = corpus(n, base, vocab);
    if (cp_tokens_write(path_in(name), t, n, bytes, -1, err, sizeof err)) fail_msg("%s", err);
    free(t);
}

static void expect_open_fails(const char *pattern, int64_t vocab, int64_t seq, int nfrag, ...) {
    cp_tokens r;
    if (cp_tokens_open(&r, pattern, vocab, seq, err, sizeof err) == 0) {
        cp_tokens_close(&r);
        fail_msg("%s opened", pattern);
    }
    va_list ap;
    va_start(ap, nfrag);
    for (int k = 0; k < nfrag; k++) {
        const char *f = va_arg(ap, const char *);
        if (!contains(err, f)) fail_msg("message lacks \"%s\": %s", f, err);
    }
    va_end(ap);
}

/* ------------------------------------------------------------------------------------------------------------ */

static void test_shard_format(void **state) {
    (void)state;
    int32_t t[5] = {1, 2, 65535, 0, 300};
    char *p = path_in("fmt.bin");
    assert_int_equal(cp_tokens_write(p, t, 5, 2, -1, err, sizeof err), 0);
    size_t len;
    unsigned char *b = (unsigned char *)cp_read_file(p, &len);
    assert_int_equal(len, 32 + 10);
    assert_memory_equal(b, "CPGTOK01", 8);
    unsigned char want_hdr[24] = {2, 0, 0, 0, 2, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    assert_memory_equal(b + 8, want_hdr, 24);
    unsigned char want_tok[10] = {1, 0, 2, 0, 0xff, 0xff, 0, 0, 0x2c, 0x01};
    assert_memory_equal(b + 32, want_tok, 10);
    free(b);
    /* tokens that do not fit are refused */
    int32_t big[2] = {1, 70000};
    assert_int_equal(cp_tokens_write(p, big, 2, 2, -1, err, sizeof err), -1);
    assert_true(contains(err, "token 1 is 70000") && contains(err, "4-byte"));
    int32_t neg[1] = {-1};
    assert_int_equal(cp_tokens_write(p, neg, 1, 4, -1, err, sizeof err), -1);
    assert_int_equal(cp_tokens_write(p, t, 5, 3, -1, err, sizeof err), -1);
    /* version 2 records the end-of-document id + 1 */
    assert_int_equal(cp_tokens_write(p, t, 5, 2, 300, err, sizeof err), 0);
    b = (unsigned char *)cp_read_file(p, &len);
    unsigned char want_eod[8] = {0x2d, 0x01, 0, 0, 0, 0, 0, 0};
    assert_memory_equal(b + 24, want_eod, 8);
    free(b);
    assert_int_equal(cp_tokens_write(p, t, 5, 2, 70000, err, sizeof err), -1);
    assert_true(contains(err, "end-of-document id 70000 does not fit 2 unsigned bytes"));
    assert_int_equal(cp_tokens_write(p, t, 5, 4, -2, err, sizeof err), -1);
}

static void test_roundtrip_and_stepping(void **state) {
    (void)state;
    const int64_t S = 16, V = 1000;
    cp_mkdir_p(path_in("rt"));
    /* three shards (sorted by name, not by creation): 50 tokens (3 sequences: 0, 16, 32; the tail 48.. dropped),
     * 17 tokens (exactly one), 40 (two: 0, 16) */
    write_shard("rt/b.bin", 17, 500, (int32_t)V, 4);
    write_shard("rt/a.bin", 50, 0, (int32_t)V, 2);
    write_shard("rt/c.bin", 40, 900, (int32_t)V, 2);
    cp_tokens r;
    if (cp_tokens_open(&r, path_in("rt/*.bin"), V, S, err, sizeof err)) fail_msg("%s", err);
    assert_int_equal(r.nshards, 3);
    assert_true(contains(r.paths[0], "a.bin") && contains(r.paths[2], "c.bin"));
    struct {
        int shard;
        int32_t base;
        int64_t off;
    } want[] = {{0, 0, 0}, {0, 0, 16}, {0, 0, 32}, {1, 500, 0}, {2, 900, 0}, {2, 900, 16}, {0, 0, 0}};
    int32_t seq[17];
    for (size_t k = 0; k < CP_ARRAY_LEN(want); k++) {
        assert_int_equal(r.pos.shard, want[k].shard);
        assert_int_equal(r.pos.offset, want[k].off);
        assert_int_equal(r.pos.sequence, (int64_t)k);
        if (cp_tokens_read(&r, 0, S + 1, seq, true, err, sizeof err)) fail_msg("%s", err);
        for (int i = 0; i <= S; i++) assert_int_equal(seq[i], (want[k].base + want[k].off + i) % V);
    }
    assert_int_equal(r.pos.epoch, 1);
    /* a part of the current sequence, without advancing */
    assert_int_equal(cp_tokens_read(&r, 5, 4, seq, false, err, sizeof err), 0);
    assert_int_equal(seq[0], 16 + 5);
    assert_int_equal(r.pos.offset, 16);
    assert_int_equal(cp_tokens_read(&r, 10, 8, seq, false, err, sizeof err), -1); /* past seq_len + 1 */
    cp_tokens_close(&r);
    /* one file by its name, no glob */
    if (cp_tokens_open(&r, path_in("rt/b.bin"), V, S, err, sizeof err)) fail_msg("%s", err);
    assert_int_equal(r.nshards, 1);
    assert_int_equal(r.token_bytes[0], 4);
    cp_tokens_close(&r);
}

static void test_bad_shards(void **state) {
    (void)state;
    cp_mkdir_p(path_in("bad"));
    write_shard("bad/ok.bin", 40, 0, 100, 2);
    size_t len;
    unsigned char *good = (unsigned char *)cp_read_file(path_in("bad/ok.bin"), &len);
    unsigned char *m = malloc(len + 8);
    char *p = path_in("bad/x.bin");

    memcpy(m, good, len);
    memcpy(m, "CPGTOK02", 8);
    write_bytes(p, m, len);
    expect_open_fails(p, 100, 16, 3, "x.bin", "starts with \"CPGTOK02\"", "not a cpgen token shard");
    memcpy(m, good, len);
    m[0] = 0x93; /* e.g. a numpy file */
    write_bytes(p, m, len);
    expect_open_fails(p, 100, 16, 1, "starts with \"\\x93PGTOK01\"");
    memcpy(m, good, len);
    m[8] = 3;
    write_bytes(p, m, len);
    expect_open_fails(p, 100, 16, 1, "token shard version 3; this cpgen reads versions 1 to 2");
    memcpy(m, good, len);
    m[12] = 3;
    write_bytes(p, m, len);
    expect_open_fails(p, 100, 16, 1, "token size 3 bytes");
    memcpy(m, good, len);
    m[8] = 1; /* version 1: the last field is reserved, 0 */
    m[24] = 1;
    write_bytes(p, m, len);
    expect_open_fails(p, 100, 16, 1, "reserved header field is 1");
    memcpy(m, good, len);
    m[24] = 101; /* version 2: end-of-document id 100, not a token of vocabulary 100 */
    write_bytes(p, m, len);
    expect_open_fails(p, 100, 16, 3, "x.bin", "end-of-document id is 100, not below model.vocab = 100", "model_vocab");
    memcpy(m, good, len);
    m[26] = 2; /* id 0x1ffff in 2-byte tokens */
    write_bytes(p, m, len);
    expect_open_fails(p, 1 << 20, 16, 1, "end-of-document id is 131071, which 2-byte tokens cannot hold");
    write_bytes(p, good, len - 3); /* truncated */
    expect_open_fails(p, 100, 16, 3, "x.bin", "says 40 tokens (80 bytes)",
                      "holds 77 bytes after the header: it is truncated");
    write_bytes(p, good, 20);
    expect_open_fails(p, 100, 16, 1, "20 bytes, shorter than the 32-byte token shard header");
    memcpy(m, good, len);
    memset(m + len, 0, 8);
    write_bytes(p, m, len + 2);
    expect_open_fails(p, 100, 16, 1, "2 too many");
    memcpy(m, good, len);
    m[16] = 0xff, m[17] = 0xff, m[18] = 0xff, m[19] = 0xff, m[20] = 0xff, m[21] = 0xff, m[22] = 0xff, m[23] = 0xff;
    write_bytes(p, m, len); /* a count whose byte size overflows */
    expect_open_fails(p, 100, 16, 1, "truncated");
    write_bytes(p, good, len);
    expect_open_fails(p, 100, 40, 2, "40 tokens, fewer than one sequence of train.seq_len + 1 = 41", "x.bin");
    expect_open_fails(path_in("bad/nothing*.bin"), 100, 16, 2, "nothing*.bin", "no file matches");
    free(m);
    free(good);

    /* a token >= vocab: reported when read, with the file, the index and the value */
    int32_t *t = corpus(40, 0, 100);
    t[21] = 77;
    assert_int_equal(cp_tokens_write(p, t, 40, 2, -1, err, sizeof err), 0);
    cp_tokens r;
    if (cp_tokens_open(&r, p, 50, 16, err, sizeof err)) fail_msg("%s", err);
    int32_t seq[17];
    assert_int_equal(cp_tokens_read(&r, 0, 17, seq, true, err, sizeof err), 0); /* tokens 0..16 are fine */
    assert_int_equal(cp_tokens_read(&r, 0, 17, seq, true, err, sizeof err), -1);
    if (!contains(err, "x.bin: token 21 is 77, not below the vocabulary size model.vocab = 50")) fail_msg("%s", err);
    cp_tokens_close(&r);
    free(t);
}

static void test_position_restore(void **state) {
    (void)state;
    const int64_t S = 32, V = 5000;
    cp_mkdir_p(path_in("pos"));
    for (int k = 0; k < 4; k++) {
        char name[32];
        snprintf(name, sizeof name, "pos/shard_%02d.bin", k);
        write_shard(name, 100 + 37 * k, 1000 * k, (int32_t)V, k % 2 ? 4 : 2);
    }
    cp_tokens a, b;
    if (cp_tokens_open(&a, path_in("pos/shard_*.bin"), V, S, err, sizeof err)) fail_msg("%s", err);
    int32_t x[33], y[33];
    for (int k = 0; k < 7; k++) assert_int_equal(cp_tokens_read(&a, 0, S + 1, x, true, err, sizeof err), 0);
    cp_data_pos saved = a.pos;
    int32_t after[40][33];
    for (int k = 0; k < 40; k++) assert_int_equal(cp_tokens_read(&a, 0, S + 1, after[k], true, err, sizeof err), 0);
    if (cp_tokens_open(&b, path_in("pos/shard_*.bin"), V, S, err, sizeof err)) fail_msg("%s", err);
    if (cp_tokens_seek(&b, &saved, err, sizeof err)) fail_msg("%s", err);
    for (int k = 0; k < 40; k++) {
        assert_int_equal(cp_tokens_read(&b, 0, S + 1, y, true, err, sizeof err), 0);
        assert_memory_equal(y, after[k], sizeof y);
    }
    assert_memory_equal(&a.pos, &b.pos, sizeof a.pos);
    assert_true(a.pos.epoch >= 2);
    /* positions that do not fit these shards */
    cp_data_pos bad = saved;
    bad.shard = 9;
    assert_int_equal(cp_tokens_seek(&b, &bad, err, sizeof err), -1);
    assert_true(contains(err, "shard 9") && contains(err, "4 shards"));
    bad = saved;
    bad.offset = 5;
    assert_int_equal(cp_tokens_seek(&b, &bad, err, sizeof err), -1);
    assert_true(contains(err, "not a sequence start"));
    bad.offset = 1000 * S;
    assert_int_equal(cp_tokens_seek(&b, &bad, err, sizeof err), -1);
    (void)x;
    cp_tokens_close(&a);
    cp_tokens_close(&b);
}

/* The spec's source over token shards: rank slices tile the sequence, targets are the next tokens. */
static void test_dataset_tokens(void **state) {
    (void)state;
    cp_mkdir_p(path_in("ds"));
    write_shard("ds/0.bin", 5 * 2048 + 1, 0, 512, 2);
    char set[600];
    snprintf(set, sizeof set, "data.source=tokens:%s", path_in("ds/*.bin"));
    const char *sets[] = {set};
    cp_spec spec;
    if (cp_spec_load("tiny", sets, 1, &spec, err, sizeof err)) fail_msg("%s", err);
    const int64_t S = spec.train.seq_len;
    assert_int_equal(S, 2048);
    int32_t *tok = malloc(S * sizeof *tok), *tgt = malloc(S * sizeof *tgt);
    for (int C = 1; C <= 4; C *= 2) {
        cp_dataset d[4];
        for (int r = 0; r < C; r++)
            if (cp_dataset_open(&d[r], &spec, err, sizeof err)) fail_msg("%s", err);
        for (int seq = 0; seq < 3; seq++) {
            int64_t T = S / C;
            for (int r = 0; r < C; r++) {
                if (cp_dataset_next(&d[r], r, C, tok + r * T, tgt + r * T, err, sizeof err)) fail_msg("%s", err);
                assert_int_equal(d[r].targets_seq, S); /* the whole sequence's targets, whatever the slice */
            }
            for (int64_t i = 0; i < S; i++) {
                assert_int_equal(tok[i], (seq * S + i) % 512);
                assert_int_equal(tgt[i], (seq * S + i + 1) % 512);
            }
        }
        cp_data_pos p;
        cp_dataset_tell(&d[0], &p);
        assert_int_equal(p.sequence, 3);
        assert_int_equal(p.offset, 3 * S);
        for (int r = 0; r < C; r++) cp_dataset_close(&d[r]);
    }
    free(tok), free(tgt);
    /* a missing folder */
    snprintf(set, sizeof set, "data.source=tokens:%s", path_in("nope/*.bin"));
    if (cp_spec_load("tiny", sets, 1, &spec, err, sizeof err)) fail_msg("%s", err);
    cp_dataset d;
    assert_int_equal(cp_dataset_open(&d, &spec, err, sizeof err), -1);
    assert_true(contains(err, "no file matches"));
}

/* Several groups: replica g reads sequences g, g + R, ... of the shards; a ring position p holds zigzag chunks p and
 * 2P-1-p; the ranks of a replica cover its sequence once; the saved position resumes every rank at the next round. */
static void test_dataset_groups(void **state) {
    (void)state;
    cp_mkdir_p(path_in("dg"));
    write_shard("dg/0.bin", 9 * 2048 + 1, 0, 512, 2);
    char set[600];
    snprintf(set, sizeof set, "data.source=tokens:%s", path_in("dg/*.bin"));
    const char *sets[] = {set};
    cp_spec spec;
    if (cp_spec_load("tiny", sets, 1, &spec, err, sizeof err)) fail_msg("%s", err);
    const int64_t S = spec.train.seq_len;
    enum { R = 2, P = 2, C = 2, N = R * P * C };
    const int64_t T = S / (P * C), chunk = S / (2 * P);
    cp_dataset d[N];
    int32_t *tok = malloc(T * sizeof *tok), *tgt = malloc(T * sizeof *tgt);
    int *seen = calloc((size_t)(R * S), sizeof *seen);
    for (int k = 0; k < N; k++)
        if (cp_dataset_open(&d[k], &spec, err, sizeof err)) fail_msg("%s", err);
    for (int round = 0; round < 4; round++) {
        memset(seen, 0, (size_t)(R * S) * sizeof *seen);
        for (int k = 0; k < N; k++) {
            cp_data_slice sl = {.replica = k / (P * C), .replicas = R, .ring_pos = k / C % P, .ring = P,
                                .rank = k % C, .gpus = C};
            if (round == 3 && k == 0) { /* resume: a fresh reader at the position saved after round 2 */
                cp_data_pos pos;
                cp_dataset_tell(&d[N - 1], &pos);
                cp_dataset_close(&d[0]);
                if (cp_dataset_open(&d[0], &spec, err, sizeof err)) fail_msg("%s", err);
                assert_int_equal(cp_dataset_seek(&d[0], &pos, err, sizeof err), 0);
            }
            if (cp_dataset_next_slice(&d[k], &sl, tok, tgt, err, sizeof err)) fail_msg("%s", err);
            assert_int_equal(d[k].targets_round, R * S); /* the loss's divisor: every replica's sequence */
            int64_t seq = (int64_t)round * R + sl.replica;
            for (int64_t i = 0; i < T; i++) {
                int64_t j = sl.rank * T + i; /* index among the ring group's tokens */
                int64_t pos = j < chunk ? sl.ring_pos * chunk + j : (2 * P - 1 - sl.ring_pos) * chunk + j - chunk;
                assert_int_equal(tok[i], (seq * S + pos) % 512);
                assert_int_equal(tgt[i], (seq * S + pos + 1) % 512);
                seen[sl.replica * S + pos]++;
            }
        }
        for (int64_t i = 0; i < R * S; i++) assert_int_equal(seen[i], 1);
        cp_data_pos p0, p1;
        cp_dataset_tell(&d[0], &p0);
        cp_dataset_tell(&d[N - 1], &p1);
        assert_int_equal(p0.sequence, (round + 1) * R);
        assert_int_equal(p0.offset, (round + 1) * R * S);
        assert_memory_equal(&p0, &p1, sizeof p0);
    }
    for (int k = 0; k < N; k++) cp_dataset_close(&d[k]);
    /* one group reads what cp_dataset_next reads */
    cp_dataset a, b;
    if (cp_dataset_open(&a, &spec, err, sizeof err) || cp_dataset_open(&b, &spec, err, sizeof err)) fail_msg("%s", err);
    int32_t *tok2 = malloc(S * sizeof *tok2), *tgt2 = malloc(S * sizeof *tgt2);
    cp_data_slice one = {.replica = 0, .replicas = 1, .ring_pos = 0, .ring = 1, .rank = 1, .gpus = 4};
    assert_int_equal(cp_dataset_next_slice(&a, &one, tok, tgt, err, sizeof err), 0);
    assert_int_equal(cp_dataset_next(&b, 1, 4, tok2, tgt2, err, sizeof err), 0);
    assert_memory_equal(tok, tok2, S / 4 * sizeof *tok);
    assert_memory_equal(tgt, tgt2, S / 4 * sizeof *tgt);
    cp_data_slice bad = {.replica = 2, .replicas = 2, .ring_pos = 0, .ring = 1, .rank = 0, .gpus = 1};
    assert_int_equal(cp_dataset_next_slice(&a, &bad, tok, tgt, err, sizeof err), -1);
    assert_true(contains(err, "replica 2 of 2"));
    cp_dataset_close(&a), cp_dataset_close(&b);
    /* synthetic: replica g of 3 gets sequence 3 * round + g */
    const char *rec[] = {"data.source=synthetic:recall"};
    if (cp_spec_load("tiny", rec, 1, &spec, err, sizeof err)) fail_msg("%s", err);
    cp_recall r;
    assert_int_equal(cp_recall_init(&r, spec.model.vocab, S, spec.init.seed, err, sizeof err), 0);
    cp_dataset g[3];
    for (int k = 0; k < 3; k++)
        if (cp_dataset_open(&g[k], &spec, err, sizeof err)) fail_msg("%s", err);
    for (int round = 0; round < 2; round++)
        for (int k = 0; k < 3; k++) {
            cp_data_slice sl = {.replica = k, .replicas = 3, .ring_pos = 0, .ring = 1, .rank = 0, .gpus = 1};
            assert_int_equal(cp_dataset_next_slice(&g[k], &sl, tok2, tgt2, err, sizeof err), 0);
            int32_t *full = malloc(S * 4), *fullt = malloc(S * 4);
            /* the round's targets: the three sequences' together, whichever one this replica reads */
            int64_t round_targets = 0;
            for (int q = 0; q < 3; q++) {
                cp_recall_sequence(&r, 3 * round + q, full, fullt);
                for (int64_t i = 0; i < S; i++) round_targets += fullt[i] >= 0;
            }
            assert_int_equal(g[k].targets_round, round_targets);
            assert_true(round_targets > 0 && round_targets < 3 * S);
            cp_recall_sequence(&r, 3 * round + k, full, fullt);
            assert_memory_equal(tok2, full, S * 4);
            assert_memory_equal(tgt2, fullt, S * 4);
            free(full), free(fullt);
            assert_int_equal(g[k].sequence, 3 * (round + 1));
        }
    for (int k = 0; k < 3; k++) cp_dataset_close(&g[k]);
    free(tok), free(tgt), free(tok2), free(tgt2), free(seen);
}

/* ------------------------------------------------------------------------------------------------------------
 * synthetic:recall */

static void check_recall_sequence(const cp_recall *r, const int32_t *tok, const int32_t *tgt) {
    int64_t S = r->seq_len, P = r->pairs, qstart = S - 2 * P;
    assert_int_equal(tok[0], 0);
    int *seen_at = malloc(sizeof(int) * (size_t)r->vocab); /* context position of each key */
    for (int64_t v = 0; v < r->vocab; v++) seen_at[v] = -1;
    int64_t pairs = 0;
    for (int64_t i = 1; i < qstart; i++) {
        int32_t t = tok[i];
        assert_int_equal(tgt[i], -1);
        if (t >= r->key_lo && t < r->key_hi) {
            assert_int_equal(seen_at[t], -1); /* distinct keys */
            seen_at[t] = (int)i;
            assert_true(i + 1 < qstart);
            assert_true(tok[i + 1] >= r->val_lo && tok[i + 1] < r->val_hi);
            assert_int_equal(tgt[i + 1], -1);
            i++;
            pairs++;
        } else {
            assert_true(t >= r->filler_lo && t < r->filler_hi); /* filler: never a key or value */
        }
    }
    assert_int_equal(pairs, P);
    int64_t queries = 0;
    for (int64_t i = qstart; i < S; i += 2) {
        int32_t k = tok[i];
        assert_true(k >= r->key_lo && k < r->key_hi);
        assert_true(seen_at[k] > 0);                   /* the key appeared earlier ... */
        assert_int_equal(tgt[i], tok[i + 1]);          /* its target is the next token ... */
        assert_int_equal(tgt[i], tok[seen_at[k] + 1]); /* ... which is the value paired with it in the context */
        assert_int_equal(tgt[i + 1], -1);
        seen_at[k] = 0; /* each key asked once */
        queries++;
    }
    assert_int_equal(queries, P);
    free(seen_at);
}

static void test_recall(void **state) {
    (void)state;
    cp_recall r;
    assert_int_equal(cp_recall_init(&r, 512, 2048, 7, err, sizeof err), 0);
    assert_int_equal(r.filler_lo, 1);
    assert_int_equal(r.filler_hi, 256);
    assert_int_equal(r.key_lo, 256);
    assert_int_equal(r.key_hi, 384);
    assert_int_equal(r.val_lo, 384);
    assert_int_equal(r.val_hi, 512);
    assert_int_equal(r.pairs, 128);
    assert_true(fabs(cp_recall_chance_loss(&r) - log(128.0)) < 1e-12);
    int32_t *a = malloc(2048 * 4), *at = malloc(2048 * 4), *b = malloc(2048 * 4), *bt = malloc(2048 * 4);
    for (int64_t n = 0; n < 20; n++) {
        cp_recall_sequence(&r, n, a, at);
        check_recall_sequence(&r, a, at);
        cp_recall_sequence(&r, n, b, bt);
        assert_memory_equal(a, b, 2048 * 4); /* deterministic */
        assert_memory_equal(at, bt, 2048 * 4);
    }
    cp_recall_sequence(&r, 3, a, at);
    cp_recall_sequence(&r, 4, b, bt);
    assert_memory_not_equal(a, b, 2048 * 4);
    cp_recall r2;
    assert_int_equal(cp_recall_init(&r2, 512, 2048, 8, err, sizeof err), 0);
    cp_recall_sequence(&r2, 3, b, bt);
    assert_memory_not_equal(a, b, 2048 * 4); /* the seed matters */
    /* recall reaches far back: the average distance from a key in the context to its query is long */
    cp_recall_sequence(&r, 0, a, at);
    double dist = 0;
    for (int64_t i = 2048 - 256; i < 2048; i += 2)
        for (int64_t j = 1; j < 2048 - 256; j++)
            if (a[j] == a[i]) dist += (double)(i - j);
    assert_true(dist / 128 > 500);
    free(a), free(at), free(b), free(bt);

    /* other sizes: the smallest vocab and length, a large vocab */
    static const int64_t sizes[][2] = {{64, 16}, {64, 1000}, {100, 4096}, {128256, 65536}, {151936, 16384}};
    for (size_t k = 0; k < CP_ARRAY_LEN(sizes); k++) {
        assert_int_equal(cp_recall_init(&r, sizes[k][0], sizes[k][1], 1, err, sizeof err), 0);
        int32_t *t = malloc((size_t)sizes[k][1] * 4), *g = malloc((size_t)sizes[k][1] * 4);
        cp_recall_sequence(&r, 11, t, g);
        check_recall_sequence(&r, t, g);
        free(t), free(g);
    }
    assert_int_equal(cp_recall_init(&r, 63, 2048, 1, err, sizeof err), -1);
    assert_true(contains(err, "model.vocab >= 64"));
    assert_int_equal(cp_recall_init(&r, 512, 15, 1, err, sizeof err), -1);
    assert_true(contains(err, "train.seq_len >= 16"));
}

/* The synthetic source through the dataset: slices tile the sequence, a seek reproduces the stream. */
static void test_dataset_recall(void **state) {
    (void)state;
    cp_spec spec;
    const char *sets[] = {"data.source=synthetic:recall"};
    if (cp_spec_load("tiny", sets, 1, &spec, err, sizeof err)) fail_msg("%s", err);
    const int64_t S = spec.train.seq_len;
    cp_recall r;
    assert_int_equal(cp_recall_init(&r, spec.model.vocab, S, spec.init.seed, err, sizeof err), 0);
    int32_t *full = malloc(S * 4), *fullt = malloc(S * 4), *tok = malloc(S * 4), *tgt = malloc(S * 4);
    cp_dataset d;
    if (cp_dataset_open(&d, &spec, err, sizeof err)) fail_msg("%s", err);
    for (int n = 0; n < 3; n++) {
        for (int r4 = 0; r4 < 4; r4++) {
            if (r4) d.sequence--; /* the same sequence, another rank */
            assert_int_equal(cp_dataset_next(&d, r4, 4, tok + r4 * S / 4, tgt + r4 * S / 4, err, sizeof err), 0);
        }
        cp_recall_sequence(&r, n, full, fullt);
        assert_memory_equal(tok, full, S * 4);
        assert_memory_equal(tgt, fullt, S * 4);
    }
    cp_data_pos p;
    cp_dataset_tell(&d, &p);
    assert_int_equal(p.sequence, 3);
    p.sequence = 10;
    assert_int_equal(cp_dataset_seek(&d, &p, err, sizeof err), 0);
    assert_int_equal(cp_dataset_next(&d, 0, 1, tok, tgt, err, sizeof err), 0);
    cp_recall_sequence(&r, 10, full, fullt);
    assert_memory_equal(tok, full, S * 4);
    assert_int_equal(cp_dataset_next(&d, 0, 3, tok, tgt, err, sizeof err), -1); /* 2048 is not a multiple of 3 */
    cp_dataset_close(&d);
    free(full), free(fullt), free(tok), free(tgt);
}

/* ------------------------------------------------------------------------------------------------------------
 * synthetic:copy */

static void test_copy(void **state) {
    (void)state;
    static const int64_t sizes[][2] = {{4, 8}, {512, 2048}, {512, 2047}, {128256, 65536}};
    for (size_t k = 0; k < CP_ARRAY_LEN(sizes); k++) {
        const int64_t V = sizes[k][0], S = sizes[k][1], h = (S - 1) / 2;
        cp_copy c;
        assert_int_equal(cp_copy_init(&c, V, S, 5, err, sizeof err), 0);
        assert_true(fabs(cp_copy_chance_loss(&c) - log((double)(V - 1))) < 1e-12);
        int32_t *t = malloc((size_t)S * 4), *g = malloc((size_t)S * 4), *t2 = malloc((size_t)S * 4),
                *g2 = malloc((size_t)S * 4);
        int64_t *count = calloc((size_t)V, sizeof *count);
        for (int64_t n = 0; n < 4; n++) {
            cp_copy_sequence(&c, n, t, g);
            assert_int_equal(t[0], 0);
            int64_t scored = 0;
            for (int64_t i = 1; i < S; i++) {
                assert_true(t[i] >= 1 && t[i] < V);
                if (i > h) assert_int_equal(t[i], t[i - h]); /* the second half repeats the first */
                if (i <= h) count[t[i]]++;
                if (g[i] >= 0) {
                    /* a scored target is the next token, and it sits h positions back */
                    assert_true(i > h && i + 1 < S);
                    assert_int_equal(g[i], t[i + 1]);
                    assert_int_equal(g[i], t[i + 1 - h]);
                    scored++;
                }
            }
            assert_int_equal(g[0], -1);
            assert_int_equal(scored, S - h - 2);
            cp_copy_sequence(&c, n, t2, g2);
            assert_memory_equal(t, t2, (size_t)S * 4); /* a pure function of (seed, index) */
            assert_memory_equal(g, g2, (size_t)S * 4);
            cp_copy_sequence(&c, n + 1, t2, g2);
            if (h >= 16) assert_memory_not_equal(t, t2, (size_t)S * 4);
        }
        /* tokens cover the range: every id of a small vocabulary appears */
        if (V * 16 <= 4 * h)
            for (int64_t v = 1; v < V; v++) assert_true(count[v] > 0);
        free(t), free(g), free(t2), free(g2), free(count);
    }
    cp_copy c;
    assert_int_equal(cp_copy_init(&c, 3, 2048, 1, err, sizeof err), -1);
    assert_true(contains(err, "model.vocab"));
    assert_int_equal(cp_copy_init(&c, 512, 7, 1, err, sizeof err), -1);
    assert_true(contains(err, "train.seq_len >= 8"));
}

/* The tiny spec's source is synthetic:copy: the dataset serves it, slices tile it, chance is ln(V - 1). */
static void test_dataset_copy(void **state) {
    (void)state;
    cp_spec spec;
    if (cp_spec_load("tiny", NULL, 0, &spec, err, sizeof err)) fail_msg("%s", err);
    assert_string_equal(spec.data.source, "synthetic:copy");
    const int64_t S = spec.train.seq_len;
    cp_copy c;
    assert_int_equal(cp_copy_init(&c, spec.model.vocab, S, spec.init.seed, err, sizeof err), 0);
    int32_t *full = malloc(S * 4), *fullt = malloc(S * 4), *tok = malloc(S * 4), *tgt = malloc(S * 4);
    cp_dataset d;
    if (cp_dataset_open(&d, &spec, err, sizeof err)) fail_msg("%s", err);
    assert_true(fabs(cp_dataset_chance_loss(&d, spec.model.vocab) - log((double)(spec.model.vocab - 1))) < 1e-12);
    for (int n = 0; n < 2; n++) {
        for (int r = 0; r < 2; r++) {
            if (r) d.sequence--;
            assert_int_equal(cp_dataset_next(&d, r, 2, tok + r * S / 2, tgt + r * S / 2, err, sizeof err), 0);
            /* every rank counts the targets of the whole sequence: the loss's divisor on every GPU */
            assert_int_equal(d.targets_seq, S - (S - 1) / 2 - 2);
        }
        cp_copy_sequence(&c, n, full, fullt);
        assert_memory_equal(tok, full, S * 4);
        assert_memory_equal(tgt, fullt, S * 4);
    }
    cp_dataset_close(&d);
    free(full), free(fullt), free(tok), free(tgt);
}

/* Shards of version 1 (hand-made header: version 1, reserved 0) and 2 side by side. */
static void write_shard_v(const char *name, const int32_t *t, int64_t n, int version, int64_t eod) {
    if (cp_tokens_write(path_in(name), t, n, 2, eod, err, sizeof err)) fail_msg("%s", err);
    if (version == 1) {
        size_t len;
        unsigned char *b = (unsigned char *)cp_read_file(path_in(name), &len);
        b[8] = 1;
        memset(b + 24, 0, 8);
        write_bytes(path_in(name), b, len);
        free(b);
    }
}

/* Version 2 carries the end-of-document id; version 1 is read as before, with none; the shards of a source agree or
 * are refused naming a shard of each kind; the headers alone (cp_tokens_probe) say the same, and nothing matching
 * is not an error there. */
static void test_shard_eod(void **state) {
    (void)state;
    cp_mkdir_p(path_in("eod"));
    int32_t *t = corpus(40, 0, 100);
    write_shard_v("eod/a1.bin", t, 40, 2, 7);
    write_shard_v("eod/a2.bin", t, 40, 2, 7);
    write_shard_v("eod/v1.bin", t, 40, 1, -1);
    write_shard_v("eod/v2none.bin", t, 40, 2, -1);
    write_shard_v("eod/b9.bin", t, 40, 2, 9);
    cp_tokens r;
    if (cp_tokens_open(&r, path_in("eod/a*.bin"), 100, 16, err, sizeof err)) fail_msg("%s", err);
    assert_int_equal(r.eod, 7);
    cp_tokens_close(&r);
    /* version 1 and version 2 without an id: both none, and the same tokens */
    if (cp_tokens_open(&r, path_in("eod/v*.bin"), 100, 16, err, sizeof err)) fail_msg("%s", err);
    assert_int_equal(r.eod, -1);
    assert_int_equal(r.nshards, 2);
    int32_t seq[17];
    for (int k = 0; k < 4; k++) {
        assert_int_equal(cp_tokens_read(&r, 0, 17, seq, true, err, sizeof err), 0);
        for (int i = 0; i < 17; i++) assert_int_equal(seq[i], (k % 2) * 16 + i);
    }
    cp_tokens_close(&r);
    /* disagreeing shards: one id against none, one id against another */
    expect_open_fails(path_in("eod/[av]*.bin"), 100, 16, 4, "a1.bin has end-of-document id 7", "v1.bin has no "
                      "end-of-document id", "must agree", "tools/make_tokens.py");
    expect_open_fails(path_in("eod/[ab]*.bin"), 100, 16, 3, "a1.bin has end-of-document id 7",
                      "b9.bin has end-of-document id 9", "must agree");
    expect_open_fails(path_in("eod/a1.bin"), 7, 16, 1, "end-of-document id is 7, not below model.vocab = 7");
    /* the headers alone */
    bool found;
    int64_t eod;
    assert_int_equal(cp_tokens_probe(path_in("eod/a*.bin"), 100, &found, &eod, err, sizeof err), 0);
    assert_true(found);
    assert_int_equal(eod, 7);
    assert_int_equal(cp_tokens_probe(path_in("eod/v1.bin"), 100, &found, &eod, err, sizeof err), 0);
    assert_true(found);
    assert_int_equal(eod, -1);
    assert_int_equal(cp_tokens_probe(path_in("nowhere/*.bin"), 100, &found, &eod, err, sizeof err), 0);
    assert_false(found);
    assert_int_equal(cp_tokens_probe(path_in("eod/[ab]*.bin"), 100, &found, &eod, err, sizeof err), -1);
    assert_true(contains(err, "b9.bin has end-of-document id 9"));
    /* a shard shorter than a sequence is no concern of the headers' */
    assert_int_equal(cp_tokens_probe(path_in("eod/a1.bin"), 100, &found, &eod, err, sizeof err), 0);
    free(t);
}

/* The tiny spec with `n` more sets (NULL-terminated list), loaded; returns 0 or the loader's -1. */
static int tiny_with(cp_spec *spec, const char *const *sets) {
    int n = 0;
    while (sets[n]) n++;
    return cp_spec_load("tiny", sets, n, spec, err, sizeof err);
}

/* data.documents and positions resolved from the source: mask where the shards carry an id, data.eod is given or the
 * task is packed, else stream; the refusals name the spec file, the key and the fix. */
static void test_documents_resolve(void **state) {
    (void)state;
    cp_mkdir_p(path_in("rs"));
    int32_t *t = corpus(40, 0, 100);
    write_shard_v("rs/v1.bin", t, 40, 1, -1);
    write_shard_v("rs/v2.bin", t, 40, 2, 7);
    write_shard_v("rs/w9.bin", t, 40, 2, 9);
    free(t);
    char v1[600], v2[600], w9[600], nope[600], val_v1[600], val_w9[600];
    snprintf(v1, sizeof v1, "data.source=tokens:%s", path_in("rs/v1.bin"));
    snprintf(v2, sizeof v2, "data.source=tokens:%s", path_in("rs/v2.bin"));
    snprintf(w9, sizeof w9, "data.source=tokens:%s", path_in("rs/w9.bin"));
    snprintf(nope, sizeof nope, "data.source=tokens:%s", path_in("rs/absent_*.bin"));
    snprintf(val_v1, sizeof val_v1, "data.val=tokens:%s", path_in("rs/v1.bin"));
    snprintf(val_w9, sizeof val_w9, "data.val=tokens:%s", path_in("rs/w9.bin"));
    const struct {
        const char *sets[4];
        int documents, positions; /* 0: refused */
        const char *says[3];
    } cases[] = {
        {{v1}, CP_DOCS_STREAM, CP_POS_SEQUENCE, {NULL}},
        {{v2}, CP_DOCS_MASK, CP_POS_DOCUMENT, {NULL}},
        {{v1, "data.eod=5"}, CP_DOCS_MASK, CP_POS_DOCUMENT, {NULL}},
        {{v2, "data.eod=7"}, CP_DOCS_MASK, CP_POS_DOCUMENT, {NULL}},
        {{v2, "data.documents=stream"}, CP_DOCS_STREAM, CP_POS_SEQUENCE, {NULL}},
        {{v2, "data.positions=sequence"}, CP_DOCS_MASK, CP_POS_SEQUENCE, {NULL}},
        {{"data.source=synthetic:copy"}, CP_DOCS_STREAM, CP_POS_SEQUENCE, {NULL}},
        /* no shard here (a plan made without the data): stream, or mask where data.eod or the spec says so */
        {{nope}, CP_DOCS_STREAM, CP_POS_SEQUENCE, {NULL}},
        {{nope, "data.eod=5"}, CP_DOCS_MASK, CP_POS_DOCUMENT, {NULL}},
        {{nope, "data.documents=mask"}, CP_DOCS_MASK, CP_POS_DOCUMENT, {NULL}},
        {{v1, "data.documents=mask"}, 0, 0,
         {"<embedded>/tiny.lua: data.documents = \"mask\": data.source = \"tokens:", "has no document boundaries "
          "(its shards carry no end-of-document id and data.eod is not set)", "set data.eod to the id that ends "
          "documents in the shards, or remake them with tools/make_tokens.py"}},
        {{v1, "data.positions=document"}, 0, 0,
         {"<embedded>/tiny.lua: data.positions = \"document\"", "(data.source has no document boundaries)",
          "data.positions = \"sequence\""}},
        {{v2, "data.eod=5"}, 0, 0,
         {"<embedded>/tiny.lua: data.eod = 5, but the shards of data.source", "carry end-of-document id 7",
          "remove data.eod (the shards' own is used) or set it to 7"}},
        {{v2, val_v1}, 0, 0,
         {"data.documents = \"mask\": the shards of data.val", "carry no end-of-document id", "set data.eod"}},
        {{v2, val_w9}, 0, 0,
         {"data.val = \"tokens:", "end documents with id 9, and those of data.source", "with 7"}},
        {{v2, val_v1, "data.documents=stream"}, CP_DOCS_STREAM, CP_POS_SEQUENCE, {NULL}},
        {{v1, val_v1, "data.eod=5"}, CP_DOCS_MASK, CP_POS_DOCUMENT, {NULL}},
    };
    for (size_t k = 0; k < CP_ARRAY_LEN(cases); k++) {
        cp_spec spec;
        if (tiny_with(&spec, cases[k].sets)) fail_msg("case %zu: %s", k, err);
        int rc = cp_data_resolve_documents(&spec, err, sizeof err);
        if (!cases[k].documents) {
            if (rc != -1) fail_msg("case %zu resolved", k);
            for (int f = 0; f < 3 && cases[k].says[f]; f++)
                if (!contains(err, cases[k].says[f])) fail_msg("case %zu: no \"%s\" in: %s", k, cases[k].says[f], err);
            /* a dataset opened on the unresolved spec refuses it alike */
            if (tiny_with(&spec, cases[k].sets)) fail_msg("%s", err);
            cp_dataset d;
            assert_int_equal(cp_dataset_open(&d, &spec, err, sizeof err), -1);
            if (!contains(err, cases[k].says[0])) fail_msg("case %zu, the dataset: %s", k, err);
            continue;
        }
        if (rc) fail_msg("case %zu: %s", k, err);
        if (spec.data.documents != cases[k].documents || spec.data.positions != cases[k].positions)
            fail_msg("case %zu: documents %d, positions %d", k, spec.data.documents, spec.data.positions);
        /* resolving again changes nothing; a dataset on the unresolved spec takes the same mode */
        cp_spec again = spec;
        assert_int_equal(cp_data_resolve_documents(&again, err, sizeof err), 0);
        assert_memory_equal(&again.data, &spec.data, sizeof spec.data);
        if (cases[k].sets[0] == nope) continue;
        if (tiny_with(&spec, cases[k].sets)) fail_msg("%s", err);
        const char *seq16[] = {"train.seq_len=16"};
        cp_spec s16;
        const char *all[6] = {0};
        int n = 0;
        while (cases[k].sets[n]) all[n] = cases[k].sets[n], n++;
        all[n] = seq16[0];
        if (tiny_with(&s16, all)) fail_msg("%s", err);
        cp_dataset d;
        if (cp_dataset_open(&d, &s16, err, sizeof err)) fail_msg("case %zu: %s", k, err);
        assert_int_equal(d.documents, cases[k].documents);
        if (cases[k].documents == CP_DOCS_MASK && !strcmp(cases[k].sets[0], v2)) assert_int_equal(d.eod, 7);
        if (cases[k].sets[0] == v1 && cases[k].documents == CP_DOCS_MASK) assert_int_equal(d.eod, 5);
        if (cases[k].documents == CP_DOCS_STREAM) assert_int_equal(d.eod, -1);
        cp_dataset_close(&d);
    }
}

/* The command line resolves every spec it loads: a refusal is a spec error (exit 2, the file and the key), and a plan
 * on a machine without the shards goes ahead. */
static void test_documents_cli(void **state) {
    (void)state;
    if (access("build/cpgen", X_OK)) {
        print_message("    no build/cpgen from %s: skipped\n", getcwd(err, sizeof err) ? err : "?");
        skip();
    }
    cp_mkdir_p(path_in("cli"));
    int32_t *t = corpus(4097, 0, 100);
    write_shard_v("cli/v1.bin", t, 4097, 1, -1);
    free(t);
    char cmd[1400], *out;
    snprintf(cmd, sizeof cmd, "build/cpgen plan tiny --set 'data.source=tokens:%s' --set data.documents=mask",
             path_in("cli/v1.bin"));
    assert_int_equal(sh(cmd, &out), 2);
    if (!contains(out, "cpgen: <embedded>/tiny.lua: data.documents = \"mask\": data.source = \"tokens:") ||
        !contains(out, "set data.eod"))
        fail_msg("%s", out);
    free(out);
    snprintf(cmd, sizeof cmd, "build/cpgen plan tiny --set 'data.source=tokens:%s' --set data.documents=mask",
             path_in("cli/absent_*.bin"));
    assert_int_equal(sh(cmd, &out), 0);
    free(out);
}

static void docs_copy_push(cp_docs *d, int32_t start) {
    if (d->n == d->cap) {
        d->cap = d->cap ? 2 * d->cap : 8;
        d->start = realloc(d->start, (size_t)d->cap * sizeof *d->start);
    }
    d->start[d->n++] = start;
}

/* Two shards with end-of-document tokens (500) at chosen places, sequences of S = 16 (docs/DATA.md: sequence k of a
 * shard is its tokens [16k, 16k + 17)). Shard a (49 tokens, 3 sequences): ids at 0 (position 0 of sequence 0), 5 and
 * 6 (a document of one token), 15 (position S - 1: no document starts after it in this sequence), 19, 32 (position 0
 * of sequence 2, which so starts in the middle of the document before) and 48 (sequence 2's last target). Shard b
 * (33 tokens, 2 sequences): ids at 7 and 30. */
enum { DOC_EOD = 500, DOC_S = 16, DOC_SEQS = 5 };
static const struct {
    int nstart, start[5], nend, end[5]; /* documents' starts; positions holding the id (no target there) */
} doc_want[DOC_SEQS] = {
    {4, {0, 1, 6, 7}, 4, {0, 5, 6, 15}}, /* a, 0: the id at 0, two in a row, and at S - 1 */
    {2, {0, 4}, 1, {3}},                 /* a, 1: its last target (token 32) is an id, allowed */
    {2, {0, 1}, 1, {0}},                 /* a, 2: starts mid-document, ended at once */
    {2, {0, 8}, 1, {7}},                 /* b, 0: the next shard, a document of its own from position 0 */
    {2, {0, 15}, 1, {14}},               /* b, 1 */
};

static void write_doc_shards(const char *dir) {
    char name[64];
    int32_t a[49], b[33];
    for (int i = 0; i < 49; i++) a[i] = i % 400 + 1;
    for (int i = 0; i < 33; i++) b[i] = 100 + i;
    const int ae[] = {0, 5, 6, 15, 19, 32, 48}, be[] = {7, 30};
    for (size_t k = 0; k < CP_ARRAY_LEN(ae); k++) a[ae[k]] = DOC_EOD;
    for (size_t k = 0; k < CP_ARRAY_LEN(be); k++) b[be[k]] = DOC_EOD;
    cp_mkdir_p(path_in(dir));
    snprintf(name, sizeof name, "%s/a.bin", dir);
    if (cp_tokens_write(path_in(name), a, 49, 2, DOC_EOD, err, sizeof err)) fail_msg("%s", err);
    snprintf(name, sizeof name, "%s/b.bin", dir);
    if (cp_tokens_write(path_in(name), b, 33, 4, DOC_EOD, err, sizeof err)) fail_msg("%s", err);
}

/* The tiny spec over those shards with 16-token sequences and one more set (or none). */
static void doc_spec(cp_spec *spec, const char *dir, const char *more, const char *more2) {
    char src[600], glob[64];
    snprintf(glob, sizeof glob, "%s/*.bin", dir);
    snprintf(src, sizeof src, "data.source=tokens:%s", path_in(glob));
    const char *sets[] = {src, "train.seq_len=16", "train.eval_sequences=1", more, more2};
    if (cp_spec_load("tiny", sets, 3 + (more != NULL) + (more2 != NULL), spec, err, sizeof err)) fail_msg("%s", err);
}

static void expect_docs(const cp_docs *d, int seq) {
    int k = seq % DOC_SEQS;
    if (d->n != doc_want[k].nstart) fail_msg("sequence %d: %lld documents, not %d", seq, (long long)d->n,
                                             doc_want[k].nstart);
    for (int i = 0; i < doc_want[k].nstart; i++) assert_int_equal(d->start[i], doc_want[k].start[i]);
}

/* The targets of a whole sequence's tokens tok[0, S] (S + 1): the next token, but -1 at a document's end. */
static void expect_targets(const int32_t *tok, const int32_t *tgt, int seq, bool mask) {
    int k = seq % DOC_SEQS, ends = 0;
    for (int i = 0; i < DOC_S; i++) {
        bool end = false;
        for (int e = 0; e < doc_want[k].nend; e++) end |= doc_want[k].end[e] == i;
        assert_int_equal(tok[i] == DOC_EOD, end); /* the shards are what the table says */
        ends += end;
        assert_int_equal(tgt[i], end && mask ? -1 : tok[i + 1]);
    }
    assert_int_equal(ends, doc_want[k].nend);
}

/* Boundaries from end-of-document tokens on every rank: the whole sequence's starts whatever the slice, targets -1 at
 * the ids and the loss divisors counting that (with mask), the same tokens and one document (stream), the same on
 * several groups, after a resume, and in the held-out part of a split. */
static void test_dataset_documents(void **state) {
    (void)state;
    write_doc_shards("dd");
    /* the whole stream as one rank sees it, with its tokens one past each sequence for the targets */
    cp_tokens r;
    if (cp_tokens_open(&r, path_in("dd/*.bin"), 512, DOC_S, err, sizeof err)) fail_msg("%s", err);
    int32_t full[DOC_SEQS][DOC_S + 1];
    for (int q = 0; q < DOC_SEQS; q++) assert_int_equal(cp_tokens_read(&r, 0, DOC_S + 1, full[q], true, err, sizeof err), 0);
    cp_tokens_close(&r);
    int32_t tok[DOC_S], tgt[DOC_S];
    for (int mask = 0; mask < 2; mask++) {
        cp_spec spec;
        doc_spec(&spec, "dd", mask ? NULL : "data.documents=stream", NULL); /* the shards' id: mask by default */
        for (int C = 1; C <= 4; C *= 2) {
            cp_dataset d[4];
            for (int rk = 0; rk < C; rk++)
                if (cp_dataset_open(&d[rk], &spec, err, sizeof err)) fail_msg("%s", err);
            assert_int_equal(d[0].documents, mask ? CP_DOCS_MASK : CP_DOCS_STREAM);
            for (int seq = 0; seq < 2 * DOC_SEQS; seq++) { /* two epochs */
                int64_t T = DOC_S / C;
                for (int rk = 0; rk < C; rk++) {
                    if (cp_dataset_next(&d[rk], rk, C, tok + rk * T, tgt + rk * T, err, sizeof err)) fail_msg("%s", err);
                    if (mask) expect_docs(&d[rk].docs, seq);
                    else assert_true(d[rk].docs.n == 1 && d[rk].docs.start[0] == 0);
                    int64_t want = mask ? DOC_S - doc_want[seq % DOC_SEQS].nend : DOC_S;
                    assert_int_equal(d[rk].targets_seq, want);
                    assert_int_equal(d[rk].targets_round, want);
                }
                assert_memory_equal(tok, full[seq % DOC_SEQS], sizeof tok);
                expect_targets(full[seq % DOC_SEQS], tgt, seq, mask);
            }
            for (int rk = 0; rk < C; rk++) cp_dataset_close(&d[rk]);
        }
    }
    /* replicas and a ring: R = 2 groups read sequences 2 round + g; each rank holds its zigzag slice, and every rank of
     * a group the whole sequence's documents; the round's divisor counts both sequences' targets */
    cp_spec spec;
    doc_spec(&spec, "dd", NULL, NULL);
    enum { R = 2, P = 2, C = 2, N = R * P * C };
    cp_dataset d[N];
    for (int k = 0; k < N; k++)
        if (cp_dataset_open(&d[k], &spec, err, sizeof err)) fail_msg("%s", err);
    cp_data_pos saved;
    cp_docs after_saved[R] = {{0}};
    for (int round = 0; round < 4; round++) {
        for (int k = 0; k < N; k++) {
            cp_data_slice sl = {.replica = k / (P * C), .replicas = R, .ring_pos = k / C % P, .ring = P,
                                .rank = k % C, .gpus = C};
            int32_t st[DOC_S / (P * C)], sg[DOC_S / (P * C)];
            if (cp_dataset_next_slice(&d[k], &sl, st, sg, err, sizeof err)) fail_msg("%s", err);
            int seq = 2 * round + sl.replica;
            expect_docs(&d[k].docs, seq);
            int64_t want = 2 * DOC_S - doc_want[(2 * round) % DOC_SEQS].nend - doc_want[(2 * round + 1) % DOC_SEQS].nend;
            assert_int_equal(d[k].targets_round, want);
            /* each row is the position the zigzag gives it, its target masked at an id */
            cp_ring_rope_run run[2];
            int nr = cp_ring_rope_runs(P, sl.ring_pos, DOC_S, C, sl.rank, run);
            for (int q = 0; q < nr; q++)
                for (int i = 0; i < run[q].rows; i++) {
                    const int32_t *f = full[seq % DOC_SEQS];
                    int64_t pos = run[q].pos0 + i;
                    assert_int_equal(st[run[q].row0 + i], f[pos]);
                    assert_int_equal(sg[run[q].row0 + i], f[pos] == DOC_EOD ? -1 : f[pos + 1]);
                }
            if (round == 2 && sl.rank == 0 && sl.ring_pos == 0) {
                after_saved[sl.replica].n = 0;
                for (int i = 0; i < d[k].docs.n; i++) docs_copy_push(&after_saved[sl.replica], d[k].docs.start[i]);
            }
        }
        if (round == 1) cp_dataset_tell(&d[0], &saved);
    }
    for (int k = 0; k < N; k++) cp_dataset_close(&d[k]);
    /* resumed at the position saved after round 1: round 2's documents again (they follow from the tokens) */
    for (int g = 0; g < R; g++) {
        cp_dataset e;
        if (cp_dataset_open(&e, &spec, err, sizeof err)) fail_msg("%s", err);
        assert_int_equal(cp_dataset_seek(&e, &saved, err, sizeof err), 0);
        cp_data_slice sl = {.replica = g, .replicas = R, .ring_pos = 1, .ring = P, .rank = 1, .gpus = C};
        int32_t st[DOC_S / (P * C)], sg[DOC_S / (P * C)];
        if (cp_dataset_next_slice(&e, &sl, st, sg, err, sizeof err)) fail_msg("%s", err);
        assert_int_equal(e.docs.n, after_saved[g].n);
        assert_memory_equal(e.docs.start, after_saved[g].start, (size_t)e.docs.n * sizeof *e.docs.start);
        expect_docs(&e.docs, 4 + g);
        cp_dataset_close(&e);
        cp_docs_free(&after_saved[g]);
    }
    /* the held-out part of a split (the last 2 of 5 sequences: shard b's) is cut into documents alike */
    doc_spec(&spec, "dd", "data.val=split:0.4", NULL);
    cp_dataset va;
    if (cp_dataset_open_val(&va, &spec, err, sizeof err)) fail_msg("%s", err);
    for (int q = 0; q < 2; q++) {
        assert_int_equal(cp_dataset_next(&va, 0, 1, tok, tgt, err, sizeof err), 0);
        expect_docs(&va.docs, 3 + q);
        expect_targets(full[3 + q], tgt, 3 + q, true);
        assert_int_equal(va.targets_seq, DOC_S - 1);
    }
    cp_dataset_close(&va);
}

/* cmocka compares floats alone; these are doubles to the last bits */
#define expect_near(a, b, eps)                                                                                         \
    do {                                                                                                               \
        double a_ = (a), b_ = (b);                                                                                     \
        if (!(fabs(a_ - b_) <= (eps))) fail_msg("%.17g, not %.17g (within %g)", a_, b_, (double)(eps));              \
    } while (0)

/* A cp_docs of the given starts (the memory is the caller's array). */
static cp_docs docs_of(int32_t *start, int64_t n) { return (cp_docs){.n = n, .cap = n, .start = start}; }

/* The pure helpers on hand-made documents: RoPE positions restarting at each document, each position's document
 * bounds, the share of attention tiles a kernel computes and of scores it keeps, and the mean document length of
 * shards. */
static void test_docs_helpers(void **state) {
    (void)state;
    /* documents [0, 5), [5, 6) (one token), [6, 10), [10, 16) */
    int32_t st[] = {0, 5, 6, 10};
    cp_docs d = docs_of(st, 4);
    int32_t pos[17], ds[16], de[16];
    const int32_t want_pos[16] = {0, 1, 2, 3, 4, 0, 0, 1, 2, 3, 0, 1, 2, 3, 4, 5};
    cp_docs_positions(&d, 0, 16, pos);
    assert_memory_equal(pos, want_pos, sizeof want_pos);
    for (int first = 0; first < 16; first++) /* any slice: a rank's part, starting mid-document or not */
        for (int n = 1; first + n <= 16; n++) {
            memset(pos, 0x7f, sizeof pos);
            cp_docs_positions(&d, first, n, pos);
            assert_memory_equal(pos, want_pos + first, (size_t)n * sizeof *pos);
            assert_int_equal(pos[n], 0x7f7f7f7f); /* nothing past n written */
        }
    cp_docs_bounds(&d, 16, ds, de);
    const int32_t want_ds[16] = {0, 0, 0, 0, 0, 5, 6, 6, 6, 6, 10, 10, 10, 10, 10, 10};
    const int32_t want_de[16] = {5, 5, 5, 5, 5, 6, 10, 10, 10, 10, 16, 16, 16, 16, 16, 16};
    assert_memory_equal(ds, want_ds, sizeof ds);
    assert_memory_equal(de, want_de, sizeof de);
    /* one document: positions are the sequence's */
    int32_t zero[] = {0};
    cp_docs one = docs_of(zero, 1);
    cp_docs_positions(&one, 3, 5, pos);
    for (int t = 0; t < 5; t++) assert_int_equal(pos[t], 3 + t);

    /* tiles: 131072 positions in 16 documents of 8192, 128 x 128 tiles. Query tile q (rows 128q ..) computes the key
     * tiles of its own document up to the diagonal, q mod 64 + 1 of them, against q + 1 causally: 16 x (1 + ... + 64)
     * = 16 x 2080 = 33280 of 1024 x 1025 / 2 = 524800, 13/205 = 0.0634 (about 1/16). Kept scores: 16 documents of
     * 8192 x 8193 / 2 against 131072 x 131073 / 2, 8193/131073. */
    int32_t st16[16];
    for (int k = 0; k < 16; k++) st16[k] = k * 8192;
    cp_docs d16 = docs_of(st16, 16);
    double kept;
    double f = cp_docs_tile_work(&d16, 131072, 128, 128, &kept);
    expect_near(f, 13.0 / 205.0, 1e-15);
    expect_near(kept, 8193.0 / 131073.0, 1e-15);
    assert_true(fabs(f - 1.0 / 16) < 0.0010);
    expect_near(cp_docs_tile_work(&one, 131072, 128, 128, &kept), 1.0, 0);
    expect_near(kept, 1.0, 0);
    /* 256 positions, documents [0, 100) and [100, 256), 64 x 64 tiles: query tiles 0..3 start in documents 0, 0, 100,
     * 100, so they compute 1, 2, 2 (key tiles 1-2) and 3 (1-3) of the 1 + 2 + 3 + 4 causal tiles: 8/10. Kept: 100 x
     * 101 / 2 + 156 x 157 / 2 = 17296 of 256 x 257 / 2 = 32896. */
    int32_t st2[] = {0, 100};
    cp_docs d2 = docs_of(st2, 2);
    expect_near(cp_docs_tile_work(&d2, 256, 64, 64, &kept), 0.8, 1e-15);
    expect_near(kept, 17296.0 / 32896.0, 1e-15);
    /* 128-row query tiles over 64-row key tiles: tile 0 computes 2 of 2, tile 1 (first row 128, in the document from
     * 100) key tiles 1-3 of 0-3: 5/6 */
    expect_near(cp_docs_tile_work(&d2, 256, 128, 64, NULL), 5.0 / 6.0, 1e-15);
    /* a last partial tile: S = 200, 64 x 64 tiles, one document: every causal tile, 1 + 2 + 3 + 4 */
    expect_near(cp_docs_tile_work(&one, 200, 64, 64, NULL), 1.0, 0);
    assert_true(isnan(cp_docs_tile_work(&d2, 256, 0, 64, &kept)) && isnan(kept));
    assert_true(isnan(cp_docs_tile_work(&d2, 0, 64, 64, NULL)));

    /* mean document length of the documents' shards (write_doc_shards: shard a ends documents after tokens 0, 5, 6,
     * 15, 19, 32, 48, shard b after its 7 and 30, i.e. 56 and 79 of the stream) */
    write_doc_shards("ml");
    double mean;
    assert_int_equal(cp_tokens_mean_doc_len(path_in("ml/*.bin"), 512, -1, 1000, &mean, err, sizeof err), 0);
    expect_near(mean, 80.0 / 9, 1e-12);
    assert_int_equal(cp_tokens_mean_doc_len(path_in("ml/*.bin"), 512, -1, 49, &mean, err, sizeof err), 0);
    expect_near(mean, 49.0 / 7, 1e-12);
    assert_int_equal(cp_tokens_mean_doc_len(path_in("ml/*.bin"), 512, -1, 10, &mean, err, sizeof err), 0);
    expect_near(mean, 7.0 / 3, 1e-12);
    assert_int_equal(cp_tokens_mean_doc_len(path_in("ml/*.bin"), 512, 101, 1000, &mean, err, sizeof err), 0);
    expect_near(mean, 1.0 * (49 + 1 + 1) / 1, 1e-12); /* another id: shard b's token 101 ends one, at 50 */
    cp_spec spec; /* through a spec (16-token sequences), and one sequence's length in stream mode */
    doc_spec(&spec, "ml", NULL, NULL);
    assert_int_equal(cp_data_mean_doc_len(&spec, 1000, &mean, err, sizeof err), 0);
    expect_near(mean, 80.0 / 9, 1e-12);
    doc_spec(&spec, "ml", "data.documents=stream", NULL);
    assert_int_equal(cp_data_mean_doc_len(&spec, 1000, &mean, err, sizeof err), 0);
    expect_near(mean, 16.0, 0);
    cp_mkdir_p(path_in("ml1"));
    int32_t *t = corpus(40, 0, 100);
    write_shard_v("ml1/v1.bin", t, 40, 1, -1);
    free(t);
    assert_int_equal(cp_tokens_mean_doc_len(path_in("ml1/v1.bin"), 512, -1, 1000, &mean, err, sizeof err), -1);
    assert_true(contains(err, "carry no end-of-document id"));
    assert_int_equal(cp_tokens_mean_doc_len(path_in("ml1/v1.bin"), 512, 77, 1000, &mean, err, sizeof err), 0);
    expect_near(mean, 40.0, 0); /* no 77 among tokens 0..39: at least 40 */
}

static int setup(void **state) {
    (void)state;
    const char *tmp = getenv("TMPDIR");
    snprintf(root, sizeof root, "%s/cpgen_data_XXXXXX", tmp && *tmp ? tmp : "/tmp");
    return mkdtemp(root) ? 0 : -1;
}
/* data.val = "split:<fraction>": the held-out count (the fraction of the stream's sequences, rounded down, a product a
 * hair off a whole number taken as it) and the parts that may not be empty. */
static void test_val_split_counts(void **state) {
    (void)state;
    struct {
        int64_t n;
        double f;
        int64_t held;
    } ok[] = {{30, 0.1, 3}, {100, 0.29, 29}, {100, 0.295, 29}, {10, 0.99, 9}, {3, 0.9999, 2}, {7, 0.5, 3},
              {1000000, 0.001, 1000}, {6, 0.5, 3}};
    for (size_t i = 0; i < CP_ARRAY_LEN(ok); i++) {
        int64_t train, held;
        if (cp_val_split_counts(ok[i].n, ok[i].f, &train, &held, err, sizeof err))
            fail_msg("%g of %lld: %s", ok[i].f, (long long)ok[i].n, err);
        if (held != ok[i].held || train != ok[i].n - ok[i].held)
            fail_msg("%g of %lld: %lld held, %lld trained; want %lld held", ok[i].f, (long long)ok[i].n,
                     (long long)held, (long long)train, (long long)ok[i].held);
    }
    int64_t train, held;
    assert_int_equal(cp_val_split_counts(10, 0.05, &train, &held, err, sizeof err), -1);
    assert_true(contains(err, "0.05 of the 10 sequences is less than one sequence") && contains(err, "at least 0.1"));
    assert_int_equal(cp_val_split_counts(1, 0.5, &train, &held, err, sizeof err), -1);
    assert_int_equal(cp_val_split_counts(2, 0.999999, &train, &held, err, sizeof err), 0);
    assert_int_equal(held, 1);
}

/* The spec of tiny over shards matching `glob` with 16-token sequences, data.val and more keys. */
static void spec_over(cp_spec *spec, const char *glob, const char *val, const char *more) {
    char src[600], v[600];
    snprintf(src, sizeof src, "data.source=tokens:%s", path_in(glob));
    snprintf(v, sizeof v, "data.val=%s", val);
    const char *sets[] = {src, v, "train.seq_len=16", more ? more : "train.eval_sequences=2"};
    if (cp_spec_load("tiny", sets, 4, spec, err, sizeof err)) fail_msg("%s", err);
}

/* The next sequence of a one-rank stream: its first token, which names where it comes from (corpus()). */
static int32_t next_first(cp_dataset *d, int32_t *tok, int32_t *tgt) {
    if (cp_dataset_next(d, 0, 1, tok, tgt, err, sizeof err)) fail_msg("%s", err);
    for (int i = 0; i < 16; i++) assert_int_equal(tgt[i], tok[i] == 511 ? 0 : tok[i] + 1); /* the next token */
    return tok[0];
}

/* A split: training reads the first sequences of the shards and starts again at the first after the last of them;
 * the validation stream reads the rest, from the same first one every time (rewound), across shard boundaries; the two
 * share no sequence and no target; a saved position resumes only inside the training part; too small a part, too
 * many eval_sequences and shards that both data.source and data.val match (by the file, whatever its name) are
 * refused with the numbers. */
static void test_dataset_split(void **state) {
    (void)state;
    cp_mkdir_p(path_in("sp"));
    /* 6 sequences of 16 (+1) tokens: a.bin 3 (first tokens 0, 16, 32), b.bin 1 (100), c.bin 2 (200, 216) */
    write_shard("sp/a.bin", 50, 0, 512, 2);
    write_shard("sp/b.bin", 17, 100, 512, 2);
    write_shard("sp/c.bin", 40, 200, 512, 4);
    cp_spec spec;
    spec_over(&spec, "sp/*.bin", "split:0.5", NULL);
    cp_dataset tr, va;
    if (cp_dataset_open(&tr, &spec, err, sizeof err)) fail_msg("%s", err);
    if (cp_dataset_open_val(&va, &spec, err, sizeof err)) fail_msg("%s", err);
    assert_int_equal(tr.count, 3);
    assert_int_equal(va.count, 3);
    int32_t tok[16], tgt[16];
    const int32_t train_want[] = {0, 16, 32, 0, 16, 32, 0}, val_want[] = {100, 200, 216, 100};
    bool seen[512] = {false}; /* the tokens training scored (its targets) */
    for (size_t k = 0; k < CP_ARRAY_LEN(train_want); k++) {
        assert_int_equal(next_first(&tr, tok, tgt), train_want[k]);
        for (int i = 0; i < 16; i++) seen[tgt[i]] = true;
    }
    assert_int_equal(tr.tokens.pos.epoch, 2);
    for (size_t k = 0; k < CP_ARRAY_LEN(val_want); k++) {
        assert_int_equal(next_first(&va, tok, tgt), val_want[k]);
        for (int i = 0; i < 16; i++)
            if (seen[tgt[i]]) fail_msg("token %d is a target of training and of validation", tgt[i]);
    }
    cp_dataset_rewind(&va);
    assert_int_equal(next_first(&va, tok, tgt), 100); /* the same first sequence again */
    cp_dataset va2;
    if (cp_dataset_open_val(&va2, &spec, err, sizeof err)) fail_msg("%s", err);
    assert_int_equal(next_first(&va2, tok, tgt), 100); /* and in another process's stream */
    cp_dataset_close(&va2);

    /* resuming: a training position, yes; one in the held-out part (a checkpoint of another split), no */
    cp_data_pos p;
    cp_dataset_tell(&tr, &p);
    cp_dataset tr2;
    if (cp_dataset_open(&tr2, &spec, err, sizeof err)) fail_msg("%s", err);
    assert_int_equal(cp_dataset_seek(&tr2, &p, err, sizeof err), 0);
    assert_int_equal(next_first(&tr2, tok, tgt), 16);
    cp_data_pos held = {.sequence = 4, .epoch = 0, .shard = 2, .offset = 16};
    assert_int_equal(cp_dataset_seek(&tr2, &held, err, sizeof err), -1);
    assert_true(contains(err, "is sequence 5 of the shards, outside sequences 0-2 that training reads"));
    cp_dataset_close(&tr2);
    cp_dataset_close(&tr);
    cp_dataset_close(&va);

    /* without a split the same shards are 6 training sequences */
    spec_over(&spec, "sp/*.bin", "synthetic:copy", NULL);
    if (cp_dataset_open(&tr, &spec, err, sizeof err)) fail_msg("%s", err);
    assert_int_equal(tr.count, 6);
    cp_dataset_close(&tr);

    /* too little held out, and more sequences asked for than it holds */
    spec_over(&spec, "sp/*.bin", "split:0.1", NULL);
    assert_int_equal(cp_dataset_open(&tr, &spec, err, sizeof err), -1);
    assert_true(contains(err, "data.val = \"split:0.1\" with data.source = \"tokens:"));
    assert_true(contains(err, "0.1 of the 6 sequences is less than one sequence"));
    assert_int_equal(cp_dataset_open_val(&va, &spec, err, sizeof err), -1);
    spec_over(&spec, "sp/*.bin", "split:0.5", "train.eval_sequences=4");
    assert_int_equal(cp_dataset_open_val(&va, &spec, err, sizeof err), -1);
    assert_true(contains(err, "train.eval_sequences = 4, but data.val = \"split:0.5\" holds 3 sequences"));
    assert_true(contains(err, "of train.seq_len + 1 = 17 tokens") && contains(err, "at most 3"));

    /* held-out shards of their own: a copy under another name is other data; the same file (a glob that matches it,
     * a hard link) is refused */
    cp_mkdir_p(path_in("sv"));
    write_shard("sv/x.bin", 50, 0, 512, 2);
    char v[600];
    snprintf(v, sizeof v, "tokens:%s", path_in("sv/*.bin"));
    spec_over(&spec, "sp/a.bin", v, NULL);
    if (cp_dataset_open_val(&va, &spec, err, sizeof err)) fail_msg("%s", err);
    assert_int_equal(va.count, 3);
    assert_int_equal(next_first(&va, tok, tgt), 0);
    cp_dataset_close(&va);
    snprintf(v, sizeof v, "tokens:%s", path_in("sp/[ab].bin"));
    spec_over(&spec, "sp/a.bin", v, NULL);
    assert_int_equal(cp_dataset_open_val(&va, &spec, err, sizeof err), -1);
    assert_true(contains(err, "sp/a.bin is also a training shard"));
    assert_int_equal(link(path_in("sp/c.bin"), path_in("sv/y.bin")), 0);
    snprintf(v, sizeof v, "tokens:%s", path_in("sv/*.bin"));
    spec_over(&spec, "sp/c.bin", v, NULL);
    assert_int_equal(cp_dataset_open_val(&va, &spec, err, sizeof err), -1);
    assert_true(contains(err, "sv/y.bin is also a training shard"));
}

/* A synthetic task's held-out stream: the task's sequences from CP_VAL_FIRST_SEQUENCE on, replica g of R reading g,
 * g + R, ... as in training, the same after a rewind; a training stream refuses to reach them, and a position among
 * them. */
static void test_dataset_synthetic_val(void **state) {
    (void)state;
    const char *sets[] = {"data.val=synthetic:copy", "train.seq_len=64"};
    cp_spec spec;
    if (cp_spec_load("tiny", sets, 2, &spec, err, sizeof err)) fail_msg("%s", err);
    cp_dataset tr, va;
    if (cp_dataset_open(&tr, &spec, err, sizeof err)) fail_msg("%s", err);
    if (cp_dataset_open_val(&va, &spec, err, sizeof err)) fail_msg("%s", err);
    assert_int_equal(va.count, -1);
    cp_copy c;
    assert_int_equal(cp_copy_init(&c, 512, 64, spec.init.seed, err, sizeof err), 0);
    int32_t tok[64], tgt[64], wt[64], wg[64], t0[64], g0[64];
    if (cp_dataset_next(&tr, 0, 1, t0, g0, err, sizeof err)) fail_msg("%s", err);
    cp_data_slice one = {.replica = 1, .replicas = 2, .ring = 1, .gpus = 1};
    for (int round = 0; round < 2; round++) {
        if (cp_dataset_next_slice(&va, &one, tok, tgt, err, sizeof err)) fail_msg("%s", err);
        cp_copy_sequence(&c, CP_VAL_FIRST_SEQUENCE + 2 * round + 1, wt, wg);
        assert_memory_equal(tok, wt, sizeof tok);
        assert_memory_equal(tgt, wg, sizeof tgt);
    }
    assert_int_equal(va.targets_round, 2 * 31); /* both groups' sequences: (64 - 1) / 2 + 1 .. 62 scored */
    cp_dataset_rewind(&va);
    if (cp_dataset_next(&va, 0, 1, tok, tgt, err, sizeof err)) fail_msg("%s", err);
    cp_copy_sequence(&c, CP_VAL_FIRST_SEQUENCE, wt, wg);
    assert_memory_equal(tok, wt, sizeof tok);
    assert_true(memcmp(tok, t0, sizeof tok) != 0); /* not training's first sequence */
    cp_data_pos near = {.sequence = CP_VAL_FIRST_SEQUENCE - 1};
    assert_int_equal(cp_dataset_seek(&tr, &near, err, sizeof err), 0);
    cp_data_slice two = {.replica = 0, .replicas = 2, .ring = 1, .gpus = 1};
    assert_int_equal(cp_dataset_next_slice(&tr, &two, tok, tgt, err, sizeof err), -1);
    assert_true(contains(err, "where data.val's held-out sequences begin"));
    assert_int_equal(cp_dataset_next(&tr, 0, 1, tok, tgt, err, sizeof err), 0); /* the last one before them */
    cp_data_pos in = {.sequence = CP_VAL_FIRST_SEQUENCE};
    assert_int_equal(cp_dataset_seek(&tr, &in, err, sizeof err), -1);
    cp_dataset_close(&tr);
    cp_dataset_close(&va);
}

/* Checks one synthetic:packed sequence document by document (BOS, the copy, the end, the targets) and counts the
 * kinds of documents the kernels' edge cases need: [0] of 1 token, [1] of exactly 128, [2] ending on a multiple of
 * 128 and [3] of 64 but not 128 (before S), [4] longer than S/8 (a GPU's slice at 8 GPUs) but not the whole sequence,
 * [5] one document filling it. */
static void check_packed(const int32_t *tok, const int32_t *tgt, int64_t S, int64_t V, int64_t kinds[6]) {
    assert_int_equal(tok[S - 1], CP_PACKED_EOD);
    cp_docs d = {0};
    cp_docs_from_tokens(&d, tok, S, CP_PACKED_EOD);
    for (int64_t k = 0; k < d.n; k++) {
        int64_t a = d.start[k], b = k + 1 < d.n ? d.start[k + 1] : S, L = b - a, h = L >= 4 ? (L - 2) / 2 : 0;
        assert_int_equal(tok[b - 1], CP_PACKED_EOD);
        if (L >= 2) assert_int_equal(tok[a], CP_PACKED_BOS);
        for (int64_t j = 1; j + 1 < L; j++) {
            assert_in_range(tok[a + j], CP_PACKED_FIRST, V - 1);
            if (h && j > h) assert_int_equal(tok[a + j], tok[a + j - h]); /* the copy, h back */
        }
        for (int64_t j = 0; j < L; j++) /* scored: the copy after its first token, before the token before the end */
            assert_int_equal(tgt[a + j], h && j > h && j + 1 <= L - 2 ? tok[a + j + 1] : -1);
        kinds[0] += L == 1;
        kinds[1] += L == 128;
        kinds[2] += b < S && b % 128 == 0;
        kinds[3] += b < S && b % 64 == 0 && b % 128 != 0;
        kinds[4] += L > S / 8 && L < S;
        kinds[5] += L == S;
    }
    cp_docs_free(&d);
}

/* synthetic:packed: a pure function of (seed, index); every document a copy task ending in the end-of-document id;
 * every kind of length the kernels' edge cases need within a few hundred sequences; mask by default, with each
 * rank's slice and each replica's docs those of its whole sequence, after a resume too; stream mode scores the same
 * targets as one document; the held-out stream from 2^62; the chance loss and the mean document length. */
static void test_packed(void **state) {
    (void)state;
    cp_packed p;
    assert_int_equal(cp_packed_init(&p, 7, 64, 0, err, sizeof err), -1);
    assert_true(contains(err, "synthetic:packed needs 8 <= model.vocab"));
    assert_int_equal(cp_packed_init(&p, 512, 15, 0, err, sizeof err), -1);
    assert_true(contains(err, "train.seq_len >= 16"));
    enum { S = 2048, V = 512, NSEQ = 400 };
    assert_int_equal(cp_packed_init(&p, V, S, 0, err, sizeof err), 0);
    expect_near(cp_packed_chance_loss(&p), log(510.0), 1e-12);
    int32_t *tok = malloc(4 * S * sizeof *tok), *tgt = tok + S, *t2 = tok + 2 * S, *g2 = tok + 3 * S;
    int64_t kinds[6] = {0}, docs = 0;
    for (int64_t n = 0; n < NSEQ; n++) {
        cp_packed_sequence(&p, n, tok, tgt);
        check_packed(tok, tgt, S, V, kinds);
        cp_packed_sequence(&p, n, t2, g2); /* again: the same */
        assert_memory_equal(tok, t2, S * sizeof *tok);
        assert_memory_equal(tgt, g2, S * sizeof *tgt);
        for (int i = 0; i < S; i++) docs += tok[i] == CP_PACKED_EOD;
    }
    print_message("    %d sequences of %d: %lld documents; 1 token %lld, 128 %lld, ending on 128k %lld, on 64 (odd) "
                  "%lld, > S/8 %lld, whole %lld\n", NSEQ, S, (long long)docs, (long long)kinds[0],
                  (long long)kinds[1], (long long)kinds[2], (long long)kinds[3], (long long)kinds[4],
                  (long long)kinds[5]);
    for (int k = 0; k < 6; k++)
        if (kinds[k] < 3) fail_msg("kind %d of document seen %lld times in %d sequences", k, (long long)kinds[k], NSEQ);
    cp_packed other;
    assert_int_equal(cp_packed_init(&other, V, S, 1, err, sizeof err), 0);
    cp_packed_sequence(&p, 5, tok, tgt);
    cp_packed_sequence(&p, 6, t2, g2);
    assert_true(memcmp(tok, t2, S * sizeof *tok) != 0);
    cp_packed_sequence(&other, 5, t2, g2);
    assert_true(memcmp(tok, t2, S * sizeof *tok) != 0);

    /* the dataset: the mask by default, the documents of the whole sequence on every rank and replica */
    const char *sets[] = {"data.source=synthetic:packed", "data.val=synthetic:packed"};
    cp_spec spec;
    if (cp_spec_load("tiny", sets, 2, &spec, err, sizeof err)) fail_msg("%s", err);
    assert_int_equal(spec.train.seq_len, S);
    cp_spec resolved = spec;
    assert_int_equal(cp_data_resolve_documents(&resolved, err, sizeof err), 0);
    assert_int_equal(resolved.data.documents, CP_DOCS_MASK);
    assert_int_equal(resolved.data.positions, CP_POS_DOCUMENT);
    enum { R = 2, P = 2, C = 2, N = R * P * C, T = S / (P * C) };
    cp_dataset d[N];
    for (int k = 0; k < N; k++)
        if (cp_dataset_open(&d[k], &spec, err, sizeof err)) fail_msg("%s", err);
    assert_int_equal(d[0].documents, CP_DOCS_MASK);
    assert_int_equal(d[0].eod, CP_PACKED_EOD);
    expect_near(cp_dataset_chance_loss(&d[0], V), log(510.0), 1e-12);
    cp_data_pos saved;
    int32_t st[T], sg[T];
    for (int round = 0; round < 3; round++) {
        int64_t round_targets = 0;
        for (int g = 0; g < R; g++) {
            cp_packed_sequence(&p, 2 * round + g, tok, tgt);
            for (int i = 0; i < S; i++) round_targets += tgt[i] >= 0;
        }
        for (int k = 0; k < N; k++) {
            cp_data_slice sl = {.replica = k / (P * C), .replicas = R, .ring_pos = k / C % P, .ring = P,
                                .rank = k % C, .gpus = C};
            if (round == 2) { /* resumed: every rank from the position saved after round 1 */
                cp_dataset_close(&d[k]);
                if (cp_dataset_open(&d[k], &spec, err, sizeof err)) fail_msg("%s", err);
                assert_int_equal(cp_dataset_seek(&d[k], &saved, err, sizeof err), 0);
            }
            if (cp_dataset_next_slice(&d[k], &sl, st, sg, err, sizeof err)) fail_msg("%s", err);
            cp_packed_sequence(&p, 2 * round + sl.replica, tok, tgt);
            cp_docs want = {0};
            cp_docs_from_tokens(&want, tok, S, CP_PACKED_EOD);
            assert_int_equal(d[k].docs.n, want.n);
            assert_memory_equal(d[k].docs.start, want.start, (size_t)want.n * sizeof *want.start);
            assert_true(want.n >= 1 && want.start[0] == 0);
            cp_docs_free(&want);
            assert_int_equal(d[k].targets_round, round_targets);
            cp_ring_rope_run run[2];
            int nr = cp_ring_rope_runs(P, sl.ring_pos, S, C, sl.rank, run);
            for (int q = 0; q < nr; q++) {
                assert_memory_equal(st + run[q].row0, tok + run[q].pos0, (size_t)run[q].rows * sizeof *st);
                assert_memory_equal(sg + run[q].row0, tgt + run[q].pos0, (size_t)run[q].rows * sizeof *sg);
            }
        }
        if (round == 1) cp_dataset_tell(&d[N - 1], &saved);
    }
    for (int k = 0; k < N; k++) cp_dataset_close(&d[k]);
    /* stream mode: one document, the same tokens and targets (the task scores nothing across a boundary) */
    const char *stream[] = {"data.source=synthetic:packed", "data.documents=stream"};
    if (cp_spec_load("tiny", stream, 2, &spec, err, sizeof err)) fail_msg("%s", err);
    cp_dataset s1;
    if (cp_dataset_open(&s1, &spec, err, sizeof err)) fail_msg("%s", err);
    assert_int_equal(cp_dataset_next(&s1, 0, 1, t2, g2, err, sizeof err), 0);
    cp_packed_sequence(&p, 0, tok, tgt);
    assert_memory_equal(t2, tok, S * sizeof *tok);
    assert_memory_equal(g2, tgt, S * sizeof *tgt);
    assert_true(s1.docs.n == 1 && s1.docs.start[0] == 0);
    cp_dataset_close(&s1);
    /* held out: the sequences from 2^62, cut into documents alike */
    if (cp_spec_load("tiny", sets, 2, &spec, err, sizeof err)) fail_msg("%s", err);
    cp_dataset va;
    if (cp_dataset_open_val(&va, &spec, err, sizeof err)) fail_msg("%s", err);
    assert_int_equal(cp_dataset_next(&va, 1, 2, t2, g2, err, sizeof err), 0);
    cp_packed_sequence(&p, CP_VAL_FIRST_SEQUENCE, tok, tgt);
    assert_memory_equal(t2, tok + S / 2, S / 2 * sizeof *tok);
    cp_docs want = {0};
    cp_docs_from_tokens(&want, tok, S, CP_PACKED_EOD);
    assert_int_equal(va.docs.n, want.n);
    assert_memory_equal(va.docs.start, want.start, (size_t)want.n * sizeof *want.start);
    cp_docs_free(&want);
    cp_dataset_close(&va);
    /* the mean document length over the first 8 sequences; one sequence's length in stream mode */
    double mean;
    assert_int_equal(cp_data_mean_doc_len(&spec, 8 * S, &mean, err, sizeof err), 0);
    int64_t ends = 0;
    for (int n = 0; n < 8; n++) {
        cp_packed_sequence(&p, n, tok, tgt);
        for (int i = 0; i < S; i++) ends += tok[i] == CP_PACKED_EOD;
    }
    expect_near(mean, 8.0 * S / (double)ends, 1e-12);
    assert_true(mean > 1 && mean < S);
    const char *copy[] = {"data.source=synthetic:copy"};
    if (cp_spec_load("tiny", copy, 1, &spec, err, sizeof err)) fail_msg("%s", err);
    assert_int_equal(cp_data_mean_doc_len(&spec, 8 * S, &mean, err, sizeof err), 0);
    expect_near(mean, (double)S, 0);
    free(tok);
}

static int teardown(void **state) {
    (void)state;
    nftw(root, rm_one, 16, FTW_DEPTH | FTW_PHYS);
    return 0;
}

int main(int argc, char **argv) {
    (void)argc;
    go_to_source_tree(argv[0], "tests/specs_bad"); /* where build/cpgen is */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shard_format),   cmocka_unit_test(test_roundtrip_and_stepping),
        cmocka_unit_test(test_bad_shards),     cmocka_unit_test(test_position_restore),
        cmocka_unit_test(test_dataset_tokens),
        cmocka_unit_test(test_dataset_groups), cmocka_unit_test(test_recall),
        cmocka_unit_test(test_dataset_recall), cmocka_unit_test(test_copy), cmocka_unit_test(test_dataset_copy),
        cmocka_unit_test(test_val_split_counts), cmocka_unit_test(test_dataset_split),
        cmocka_unit_test(test_dataset_synthetic_val),
        cmocka_unit_test(test_shard_eod),      cmocka_unit_test(test_documents_resolve),
        cmocka_unit_test(test_documents_cli),  cmocka_unit_test(test_dataset_documents),
        cmocka_unit_test(test_docs_helpers),   cmocka_unit_test(test_packed),
    };
    return cmocka_run_group_tests_name("data", tests, setup, teardown) ? 1 : 0;
}

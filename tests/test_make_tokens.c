/* test_make_tokens.c: tools/make_tokens.py's shards, read back by cpgen's own reader (runtime/data.c). Text documents
 * in nested folders (with a binary file, a non-UTF-8 one, an empty one, a link to another, files left out by
 * --include and --exclude) made into byte-level shards with an end-of-document token and a validation split:
 *   - every shard opens in cp_tokens_open, and the training shards hold exactly the kept documents' bytes, each
 *     followed by the end-of-document id (256), in the byte order of their paths; the validation shards the held-out
 *     ones, chosen by the SHA-256 of their paths (round(F x n) of them); no document on both sides; with --shuffle
 *     each side in the order of the SHA-256 of "shuffle:" and the path;
 *   - the shards are --shard-tokens long but the last, which is never shorter than half of that;
 *   - <out>.json says the vocabulary (257), the model.vocab to train with (320), the end-of-document id, documents
 *     and tokens per split and the data sources;
 *   - every header is version 2 and carries that id, so cpgen finds the documents (data.documents = "mask");
 *   - llm.c files converted token for token, with --eod's id in the headers, or none without it;
 *   - a copy of a kept document (the same bytes under another name) is skipped;
 *   - --piece-bytes cuts every document into pieces of at most that many bytes, at the last line end that fits
 *     (else at a character boundary), each followed by the end-of-document id; with --shuffle the pieces go in the
 *     order of the SHA-256 of "shuffle:", the path, "#" and the piece's number;
 *   - the same inputs give the same bytes again; bad options are refused with a message.
 * With the `tokenizers` package, --train-bpe too: tokenizer.json beside the shards, ids below its vocabulary, the
 * end-of-document id between documents, and the documents decoded back exactly; without it, that case is skipped
 * and --train-bpe must say that it needs the package. Needs python3 (the test is skipped without one). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data.h"
#include "json.h"
#include "sh.h"
#include "sha256.h"
#include "source_tree.h"
#include "tmpdir.h"
#include "util.h"

static char root[128], err[CP_ERR_MAX];

/* The documents: path under docs/, content; kept by --include '*.py' --include '*.txt' --exclude '*skip*' and as
 * text. The link (docs/z_link.txt -> a/one.txt) is a second path to a kept file. */
typedef struct {
    const char *path, *text;
    bool kept;
} doc;
static const doc docs[] = {
    {"a/one.txt", "the first document\n", true},
    {"a/two.py", "def two():\n    return 2  # \xc3\xa9t\xc3\xa9\n", true},
    {"a/b/three.txt", "three\nlines\nhere\n", true},
    {"a/b/skip_me.txt", "left out by --exclude\n", false},
    {"a/notes.md", "not in --include\n", false},
    {"c/four.py", "import os\nprint(os.sep * 4)\n", true},
    {"c/five.txt", "five five five five five five five five\n", true},
    {"c/binary.txt", "bin\0ary", false},
    {"c/latin1.txt", "caf\xe9\n", false},
    {"c/empty.txt", "", false},
    {"d/six.py", "x = [6] * 6\n", true},
    {"d/seven.txt", "seven is the last document in path order but one\n", true},
    {"d/eight.py", "# eight\n", true},
    {"d/nine.txt", "the first document\n", false}, /* a copy of a/one.txt */
};
enum { NDOCS = sizeof docs / sizeof docs[0] };

static size_t doc_len(const doc *d) { return !strcmp(d->path, "c/binary.txt") ? 7 : strlen(d->text); }

static void make_docs(void) {
    char p[512], cmd[1200];
    for (int k = 0; k < NDOCS; k++) {
        snprintf(p, sizeof p, "%s/docs/%s", root, docs[k].path);
        char dir[512];
        snprintf(dir, sizeof dir, "%s", p);
        *strrchr(dir, '/') = 0;
        assert_int_equal(cp_mkdir_p(dir), 0);
        FILE *f = fopen(p, "wb");
        assert_non_null(f);
        assert_int_equal(fwrite(docs[k].text, 1, doc_len(&docs[k]), f), doc_len(&docs[k]));
        fclose(f);
    }
    snprintf(cmd, sizeof cmd, "ln -s a/one.txt '%s/docs/z_link.txt'", root);
    char *out;
    assert_int_equal(sh(cmd, &out), 0);
    free(out);
}

/* python3 tools/make_tokens.py ARGS, its exit status and output */
static int make_tokens(const char *args, char **out) {
    char cmd[1600];
    snprintf(cmd, sizeof cmd, "python3 tools/make_tokens.py %s", args);
    return sh(cmd, out);
}

/* Every token of the shards matching pattern, in order; their count in *n and each shard's in counts, and the
 * end-of-document id their headers carry (version 2) in *eod. Each shard is read as one sequence of its whole length,
 * by a reader of that one file. */
static int32_t *read_all(const char *pattern, int64_t vocab, int64_t *n, int64_t *counts, int *nshards, int64_t *eod) {
    cp_tokens r;
    if (cp_tokens_open(&r, pattern, vocab, 1, err, sizeof err)) fail_msg("%s", err);
    *eod = r.eod;
    for (int s = 0; s < r.nshards; s++) { /* every header of version 2 */
        size_t len;
        unsigned char *b = (unsigned char *)cp_read_file(r.paths[s], &len);
        assert_true(b && len >= 32);
        assert_int_equal(b[8] | b[9] << 8, 2);
        free(b);
    }
    int64_t total = 0;
    for (int s = 0; s < r.nshards; s++) total += r.counts[s], counts[s] = r.counts[s];
    *nshards = r.nshards;
    int32_t *t = malloc(sizeof(int32_t) * (size_t)total);
    int64_t at = 0;
    for (int s = 0; s < r.nshards; s++) {
        cp_tokens one;
        if (cp_tokens_open(&one, r.paths[s], vocab, r.counts[s] - 1, err, sizeof err) ||
            cp_tokens_read(&one, 0, r.counts[s], t + at, false, err, sizeof err))
            fail_msg("%s", err);
        cp_tokens_close(&one);
        at += r.counts[s];
    }
    cp_tokens_close(&r);
    *n = total;
    return t;
}

static int64_t json_int(const cp_json *obj, const char *a, const char *b) {
    const cp_json *v = cp_json_get(obj, a);
    if (v && b) v = cp_json_get(v, b);
    if (!v || v->type != CP_JSON_NUMBER) fail_msg("no number %s%s%s in the JSON", a, b ? "." : "", b ? b : "");
    return (int64_t)v->number;
}

/* Which kept documents python holds out: the k of smallest SHA-256 of their paths (as given: root/docs/...). */
static void held_out(int k, bool *val) {
    int idx[NDOCS], n = 0;
    unsigned char dig[NDOCS][32];
    for (int i = 0; i < NDOCS; i++) {
        val[i] = false;
        if (!docs[i].kept) continue;
        char p[512];
        snprintf(p, sizeof p, "%s/docs/%s", root, docs[i].path);
        cp_sha256_ctx c;
        cp_sha256_init(&c);
        cp_sha256_update(&c, p, strlen(p));
        cp_sha256_final(&c, dig[i]);
        idx[n++] = i;
    }
    for (int a = 0; a < n; a++) /* selection: k smallest digests */
        for (int b = a + 1; b < n; b++)
            if (memcmp(dig[idx[b]], dig[idx[a]], 32) < 0) {
                int t = idx[a];
                idx[a] = idx[b];
                idx[b] = t;
            }
    for (int a = 0; a < k; a++) val[idx[a]] = true;
}

/* The SHA-256 of "shuffle:" and document i's path as python has it (root/docs/...): its place with --shuffle. */
static void shuffle_key(int i, unsigned char *dig) {
    char p[600];
    snprintf(p, sizeof p, "shuffle:%s/docs/%s", root, docs[i].path);
    cp_sha256_ctx c;
    cp_sha256_init(&c);
    cp_sha256_update(&c, p, strlen(p));
    cp_sha256_final(&c, dig);
}

/* Whether document b comes before a: by path (which under one root sort as their docs/-relative names do), or with
 * --shuffle by shuffle_key. */
static bool before(int b, int a, bool shuffle) {
    if (!shuffle) return strcmp(docs[b].path, docs[a].path) < 0;
    unsigned char kb[32], ka[32];
    shuffle_key(b, kb);
    shuffle_key(a, ka);
    return memcmp(kb, ka, 32) < 0;
}

/* The kept documents (those on one side, when val says the sides) in path order, or with shuffle in --shuffle's:
 * their indices into order, and how many */
static int kept_order(const bool *val, bool side, bool shuffle, int *order) {
    int m = 0;
    for (int i = 0; i < NDOCS; i++)
        if (docs[i].kept && (!val || val[i] == side)) order[m++] = i;
    for (int a = 0; a < m; a++)
        for (int b = a + 1; b < m; b++)
            if (before(order[b], order[a], shuffle)) {
                int t = order[a];
                order[a] = order[b];
                order[b] = t;
            }
    return m;
}

/* The expected stream of one side: the documents (kept, on that side) in their order, each followed by 256. */
static int32_t *expected(const bool *val, bool side, bool shuffle, int64_t *n) {
    int order[NDOCS], m = kept_order(val, side, shuffle, order);
    int32_t *t = malloc(4096 * sizeof *t);
    int64_t at = 0;
    for (int a = 0; a < m; a++) {
        const unsigned char *s = (const unsigned char *)docs[order[a]].text;
        for (size_t i = 0; i < doc_len(&docs[order[a]]); i++) t[at++] = s[i];
        t[at++] = 256;
    }
    *n = at;
    return t;
}

static bool have_python(void) {
    char *out;
    int rc = sh("python3 -c 'import sys; sys.exit(sys.version_info < (3, 8))'", &out);
    free(out);
    return rc == 0;
}

static void test_byte_level(void **state) {
    (void)state;
    char args[1200], *out, pat[600];
    snprintf(args, sizeof args, "--byte-level --val-fraction 0.25 --include '*.py' --include '*.txt' --exclude "
             "'*skip*' --shard-tokens 64 --out '%s/out/text' '%s/docs'", root, root);
    int rc = make_tokens(args, &out);
    printf("%s", out);
    if (rc) fail_msg("make_tokens.py exited %d", rc);
    assert_non_null(strstr(out, "end of document: id 256"));
    free(out);
    int kept = 0;
    for (int i = 0; i < NDOCS; i++) kept += docs[i].kept;
    int k = (int)(0.25 * kept + 0.5); /* python's round() of 2.25 */
    bool val[NDOCS];
    held_out(k, val);
    /* the JSON */
    char p[600];
    snprintf(p, sizeof p, "%s/out/text.json", root);
    size_t len;
    char *text = cp_read_file(p, &len);
    assert_non_null(text);
    cp_json j;
    if (cp_json_parse(text, len, &j, err, sizeof err)) fail_msg("%s: %s", p, err);
    assert_int_equal(json_int(&j, "vocab_size", NULL), 257);
    assert_int_equal(json_int(&j, "model_vocab", NULL), 320);
    assert_int_equal(json_int(&j, "eod_id", NULL), 256);
    const cp_json *sh_ = cp_json_get(&j, "shards");
    assert_non_null(sh_);
    assert_int_equal(json_int(sh_, "train", "documents"), kept - k);
    assert_int_equal(json_int(sh_, "val", "documents"), k);
    const cp_json *src = cp_json_get(&j, "data_source"), *vsrc = cp_json_get(&j, "val_source");
    assert_true(src && src->type == CP_JSON_STRING && vsrc && vsrc->type == CP_JSON_STRING);
    /* the shards, through cpgen's reader */
    for (int side = 0; side < 2; side++) {
        const cp_json *s = side ? vsrc : src;
        snprintf(pat, sizeof pat, "%s", s->string + 7); /* after "tokens:" */
        int64_t n, counts[64], want_n, eod;
        int nshards;
        int32_t *got = read_all(pat, 320, &n, counts, &nshards, &eod), *want = expected(val, side, false, &want_n);
        assert_int_equal(eod, 256); /* the headers say where documents end */
        assert_int_equal(n, want_n);
        assert_memory_equal(got, want, sizeof(int32_t) * (size_t)n);
        assert_int_equal(json_int(sh_, side ? "val" : "train", "tokens"), n);
        for (int q = 0; q + 1 < nshards; q++) assert_int_equal(counts[q], 64);
        assert_true(nshards == 1 || (counts[nshards - 1] >= 32 && counts[nshards - 1] < 96));
        printf("    %s: %lld tokens in %d shards, as the documents' bytes and end-of-document ids\n",
               side ? "val" : "train", (long long)n, nshards);
        free(got), free(want);
    }
    cp_json_free(&j);
    free(text);
    /* the same again, byte for byte */
    snprintf(args, sizeof args, "--byte-level --val-fraction 0.25 --include '*.py' --include '*.txt' --exclude "
             "'*skip*' --shard-tokens 64 --out '%s/again/text' '%s/docs'", root, root);
    rc = make_tokens(args, &out);
    free(out);
    assert_int_equal(rc, 0);
    char cmd[1400];
    snprintf(cmd, sizeof cmd, "cd '%s' && for f in out/*.bin; do cmp \"$f\" \"again/${f#out/}\" || exit 1; done", root);
    rc = sh(cmd, &out);
    if (rc) fail_msg("a second run wrote other bytes: %s", out);
    free(out);
    /* --shuffle: the same documents on each side, in the order of shuffle_key */
    snprintf(args, sizeof args, "--byte-level --shuffle --val-fraction 0.25 --include '*.py' --include '*.txt' "
             "--exclude '*skip*' --out '%s/shuffled/text' '%s/docs'", root, root);
    rc = make_tokens(args, &out);
    if (rc) fail_msg("make_tokens.py %s: exit %d: %s", args, rc, out);
    free(out);
    for (int side = 0; side < 2; side++) {
        snprintf(pat, sizeof pat, "%s/shuffled/text_%s*.bin", root, side ? "val_" : "[0-9]");
        int64_t n, counts[4], want_n, eod;
        int nshards;
        int32_t *got = read_all(pat, 320, &n, counts, &nshards, &eod), *want = expected(val, side, true, &want_n);
        assert_int_equal(n, want_n);
        assert_memory_equal(got, want, sizeof(int32_t) * (size_t)n);
        free(got), free(want);
    }
}

/* A piece of a document, as --piece-bytes cuts it: its document, where it starts, its length, its --shuffle key. */
typedef struct {
    int doc;
    size_t at, len;
    unsigned char key[32];
} piece;

/* The pieces of the kept documents in path order, cut at most `max` bytes long as make_tokens.py cuts them. */
static int cut_pieces(size_t max, piece *out) {
    int order[NDOCS], m = kept_order(NULL, false, false, order), n = 0;
    for (int o = 0; o < m; o++) {
        int i = order[o];
        const char *t = docs[i].text;
        size_t len = doc_len(&docs[i]);
        for (size_t at = 0, k = 0; at < len; k++) {
            size_t end = at + max < len ? at + max : len;
            if (end < len) {
                size_t nl = end;
                while (nl > at && t[nl - 1] != '\n') nl--;
                if (nl > at) end = nl;
                else
                    while (((unsigned char)t[end] & 0xC0) == 0x80) end--; /* not inside a character */
            }
            char key[600];
            snprintf(key, sizeof key, "shuffle:%s/docs/%s#%zu", root, docs[i].path, k);
            cp_sha256_ctx c;
            cp_sha256_init(&c);
            cp_sha256_update(&c, key, strlen(key));
            cp_sha256_final(&c, out[n].key);
            out[n].doc = i, out[n].at = at, out[n].len = end - at;
            n++, at = end;
        }
    }
    return n;
}

static void test_pieces(void **state) {
    (void)state;
    char args[1200], *out, pat[600];
    for (int shuffle = 0; shuffle < 2; shuffle++) {
        snprintf(args, sizeof args, "--byte-level %s --piece-bytes 16 --include '*.py' --include '*.txt' --exclude "
                 "'*skip*' --out '%s/pieces%d/text' '%s/docs'", shuffle ? "--shuffle" : "", root, shuffle, root);
        int rc = make_tokens(args, &out);
        if (rc) fail_msg("make_tokens.py %s: exit %d: %s", args, rc, out);
        assert_non_null(strstr(out, "1 a copy of another"));
        free(out);
        piece p[64];
        int n = cut_pieces(16, p);
        for (int a = 0; shuffle && a < n; a++) /* --shuffle: by key */
            for (int b = a + 1; b < n; b++)
                if (memcmp(p[b].key, p[a].key, 32) < 0) {
                    piece t = p[a];
                    p[a] = p[b];
                    p[b] = t;
                }
        int32_t want[4096];
        int64_t m = 0;
        for (int k = 0; k < n; k++) {
            assert_true(p[k].len >= 1 && p[k].len <= 16);
            for (size_t i = 0; i < p[k].len; i++) want[m++] = (unsigned char)docs[p[k].doc].text[p[k].at + i];
            want[m++] = 256;
        }
        snprintf(pat, sizeof pat, "%s/pieces%d/text_[0-9]*.bin", root, shuffle);
        int64_t got_n, counts[4], eod;
        int nshards;
        int32_t *got = read_all(pat, 320, &got_n, counts, &nshards, &eod);
        assert_int_equal(got_n, m);
        assert_memory_equal(got, want, sizeof(int32_t) * (size_t)m);
        free(got);
        printf("    --piece-bytes 16%s: %d pieces of the documents, each followed by 256\n",
               shuffle ? " --shuffle" : "", n);
    }
}

static void test_refused(void **state) {
    (void)state;
    char args[1200], *out;
    const struct {
        const char *args, *says;
    } cases[] = {
        {"--byte-level --val-fraction 1.5 --out '%s/x/t' '%s/docs'", "--val-fraction 1.5"},
        {"--byte-level --out '%s/x/t' '%s/nothing/*.txt'", "no file matches it"},
        {"--byte-level --include '*.none' --out '%s/x/t' '%s/docs'", "no text document among 0 files"},
        {"--byte-level --byte-level --train-bpe 100 --out '%s/x/t' '%s/docs'", "not allowed with"},
        {"--train-bpe 100 --out '%s/x/t' '%s/docs'", "--train-bpe 100: a vocabulary of 257"},
        {"--out '%s/x/t' '%s/docs'", "one of the arguments"},
        {"--byte-level --eod 3 --out '%s/x/t' '%s/docs'", "--eod names the separator of llm.c files"},
        {"--from-llmc --shuffle --out '%s/x/t' '%s/docs'", "--shuffle orders text documents"},
        {"--byte-level --piece-bytes 3 --out '%s/x/t' '%s/docs'", "--piece-bytes 3: give at least 4"},
        {"--from-llmc --piece-bytes 64 --out '%s/x/t' '%s/docs'", "--piece-bytes cuts text documents"},
    };
    for (size_t k = 0; k < CP_ARRAY_LEN(cases); k++) {
        snprintf(args, sizeof args, cases[k].args, root, root);
        int rc = make_tokens(args, &out);
        if (rc == 0 || !strstr(out, cases[k].says))
            fail_msg("make_tokens.py %s: exit %d, expected a refusal saying \"%s\": %s", args, rc, cases[k].says, out);
        free(out);
    }
}

/* llm.c files converted: the same tokens, and with --eod the id recorded in the headers (without it, none). */
static void test_llmc(void **state) {
    (void)state;
    char p[600], args[1400], *out;
    snprintf(p, sizeof p, "%s/llmc_train_000000.bin", root);
    int32_t hdr[256] = {20240520, 1, 300};
    uint16_t tok[300];
    for (int i = 0; i < 300; i++) tok[i] = (uint16_t)(i % 7 == 0 ? 50256 : i * 13 % 50000);
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(hdr, 4, 256, f), 256);
    assert_int_equal(fwrite(tok, 2, 300, f), 300);
    fclose(f);
    for (int with = 0; with < 2; with++) {
        snprintf(args, sizeof args, "--from-llmc %s--out '%s/llmc%d/s' '%s'", with ? "--eod 50256 " : "", root, with, p);
        int rc = make_tokens(args, &out);
        if (rc) fail_msg("make_tokens.py %s: exit %d: %s", args, rc, out);
        free(out);
        int64_t n, counts[4], eod;
        int nshards;
        snprintf(p, sizeof p, "%s/llmc%d/s_[0-9]*.bin", root, with);
        int32_t *t = read_all(p, 50304, &n, counts, &nshards, &eod);
        assert_int_equal(n, 300);
        for (int i = 0; i < 300; i++) assert_int_equal(t[i], tok[i]);
        assert_int_equal(eod, with ? 50256 : -1);
        free(t);
        snprintf(p, sizeof p, "%s/llmc_train_000000.bin", root);
    }
    snprintf(args, sizeof args, "--from-llmc --eod 70000 --out '%s/llmc9/s' '%s'", root, p);
    int rc = make_tokens(args, &out);
    if (rc == 0 || !strstr(out, "--eod 70000: not a token id of these 2-byte files")) fail_msg("exit %d: %s", rc, out);
    free(out);
}

static void test_bpe(void **state) {
    (void)state;
    char *out, args[1200];
    bool have = sh("python3 -c 'import tokenizers'", &out) == 0;
    free(out);
    snprintf(args, sizeof args, "--train-bpe 300 --val-fraction 0.25 --include '*.py' --include '*.txt' --exclude "
             "'*skip*' --out '%s/bpe/text' '%s/docs'", root, root);
    int rc = make_tokens(args, &out);
    if (!have) { /* here the message is what can be checked */
        if (rc == 0 || !strstr(out, "needs the `tokenizers` package"))
            fail_msg("--train-bpe without tokenizers: exit %d: %s", rc, out);
        free(out);
        print_message("    --train-bpe: skipped: the python3 here has no `tokenizers` package\n");
        skip();
    }
    printf("%s", out);
    if (rc) fail_msg("make_tokens.py --train-bpe exited %d", rc);
    free(out);
    char p[600];
    snprintf(p, sizeof p, "%s/bpe/tokenizer.json", root);
    assert_int_equal(access(p, R_OK), 0);
    snprintf(p, sizeof p, "%s/bpe/text.json", root);
    size_t len;
    char *text = cp_read_file(p, &len);
    cp_json j;
    if (cp_json_parse(text, len, &j, err, sizeof err)) fail_msg("%s", err);
    int64_t vocab = json_int(&j, "vocab_size", NULL), eod = json_int(&j, "eod_id", NULL);
    assert_true(vocab > 257 && vocab <= 300);
    assert_int_equal(eod, 0); /* the special token comes first */
    int64_t n, counts[64], hdr_eod;
    int nshards;
    snprintf(p, sizeof p, "%s/bpe/text_[0-9]*.bin", root);
    int32_t *t = read_all(p, vocab, &n, counts, &nshards, &hdr_eod); /* every id below the vocabulary, or it fails */
    assert_int_equal(hdr_eod, eod);
    int eods = 0;
    for (int64_t i = 0; i < n; i++) eods += t[i] == eod;
    assert_int_equal(eods, json_int(cp_json_get(&j, "shards"), "train", "documents"));
    assert_int_equal(t[n - 1], eod);
    free(t);
    cp_json_free(&j);
    free(text);
    /* decoded back: the training documents, in path order, exactly */
    static const char decode[] =
        "import array, glob, json, os\n"
        "from tokenizers import Tokenizer\n"
        "t = Tokenizer.from_file('bpe/tokenizer.json')\n"
        "m = json.load(open('bpe/text.json'))\n"
        "ids = array.array('H')\n"
        "for f in sorted(glob.glob('bpe/text_[0-9]*.bin')):\n"
        "    ids.frombytes(open(f, 'rb').read()[32:])\n"
        "docs, cur = [], []\n"
        "for i in ids:\n"
        "    if i == m['eod_id']: docs.append(t.decode(cur)); cur = []\n"
        "    else: cur.append(i)\n"
        "assert len(docs) == m['shards']['train']['documents'], len(docs)\n"
        "files = sorted(p for p in glob.glob('docs/**/*', recursive=True) if os.path.isfile(p) and not\n"
        "               os.path.islink(p) and p.endswith(('.py', '.txt')) and 'skip' not in p)\n"
        "kept = []\n"
        "for p in files:\n"
        "    raw = open(p, 'rb').read()\n"
        "    try: text = raw.decode('utf-8')\n"
        "    except UnicodeDecodeError: continue\n"
        "    if raw.strip() and b'\\0' not in raw: kept.append(text)\n"
        "it = iter(kept)\n"
        "assert all(any(d == k for k in it) for d in docs), 'not the documents in path order'\n"
        "print(len(docs), 'documents decoded back exactly, in path order')\n"
        ;
    char cmd[800];
    snprintf(p, sizeof p, "%s/decode.py", root);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs(decode, f);
    fclose(f);
    snprintf(cmd, sizeof cmd, "cd '%s' && python3 decode.py", root);
    rc = sh(cmd, &out);
    printf("%s", out);
    if (rc) fail_msg("decoding the BPE shards back failed");
    free(out);
}

static int setup(void **state) {
    (void)state;
    if (tmpdir_make(root, sizeof root, "make-tokens")) return -1;
    make_docs();
    return 0;
}
static int teardown(void **state) {
    (void)state;
    tmpdir_remove(root);
    return 0;
}

int main(int argc, char **argv) {
    (void)argc;
    go_to_source_tree(argv[0], "tools/make_tokens.py");
    if (!have_python()) {
        printf("test_make_tokens: skipped: no python3 (3.8 or newer) to run tools/make_tokens.py\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_byte_level),
        cmocka_unit_test(test_pieces),
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_llmc),
        cmocka_unit_test(test_bpe),
    };
    return cmocka_run_group_tests_name("make_tokens", tests, setup, teardown) ? 1 : 0;
}

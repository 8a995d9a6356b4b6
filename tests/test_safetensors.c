/* test_safetensors.c: the strict JSON parser; safetensors write -> read round trips (single file and sharded with
 * an index, bit-exact in F32, BF16, F16); every kind of corrupt file rejected with a message that says what is
 * wrong (and random corruption never crashes); the Hugging Face name mapping and the stage-order query-head
 * permutation of runtime/weights.c; load(save(x)) == x; shapes checked against the spec; config.json; the random
 * init. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <fcntl.h>
#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "json.h"
#include "plan.h"
#include "safetensors.h"
#include "spec.h"
#include "util.h"
#include "weights.h"

static char err[CP_ERR_MAX];
static char root[256]; /* a fresh temporary folder per run */

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(p);
}
static void rm_rf(const char *p) { nftw(p, rm_one, 16, FTW_DEPTH | FTW_PHYS); }

static char *path_in(const char *name) {
    static char buf[64][512]; /* a ring: a result stays valid for the next 63 calls */
    static int k;
    char *b = buf[k++ % 64];
    snprintf(b, sizeof buf[0], "%s/%s", root, name);
    return b;
}

static void write_bytes(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, n, f), n);
    fclose(f);
}

/* A safetensors file from a header text and `data` bytes of data area (filled with a pattern). */
static void write_st(const char *path, const char *header, size_t data) {
    size_t hl = strlen(header);
    unsigned char *b = calloc(8 + hl + data + 1, 1);
    for (int k = 0; k < 8; k++) b[k] = (unsigned char)((uint64_t)hl >> (8 * k));
    memcpy(b + 8, header, hl);
    for (size_t k = 0; k < data; k++) b[8 + hl + k] = (unsigned char)k;
    write_bytes(path, b, 8 + hl + data);
    free(b);
}

static bool contains(const char *hay, const char *needle) { return strstr(hay, needle) != NULL; }

/* cp_st_open must fail and the message must hold every fragment given. */
static void expect_open_fails(const char *path, int nfrag, ...) {
    cp_st_set st;
    int rc = cp_st_open(path, &st, err, sizeof err);
    if (rc == 0) {
        cp_st_close(&st);
        fail_msg("%s opened but should not have", path);
    }
    va_list ap;
    va_start(ap, nfrag);
    for (int k = 0; k < nfrag; k++) {
        const char *frag = va_arg(ap, const char *);
        if (!contains(err, frag)) fail_msg("message lacks \"%s\": %s", frag, err);
    }
    va_end(ap);
    cp_st_close(&st); /* safe after a failure */
}

static uint64_t rng = 12345;
static double urand(void) {
    rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
    return (double)(rng >> 11) / (double)(1ULL << 53) * 2.0 - 1.0;
}

/* ------------------------------------------------------------------------------------------------------------ */

static void test_json(void **state) {
    (void)state;
    cp_json v;
    const char *ok = " {\"a\": [1, -2, 3.5e2, true, false, null], \"b\\u00e9\\ud83d\\ude00\": {\"c\": \"x\\n\\\"y\"},"
                     " \"big\": 9223372036854775807, \"huge\": 9223372036854775808} ";
    assert_int_equal(cp_json_parse(ok, strlen(ok), &v, err, sizeof err), 0);
    const cp_json *a = cp_json_get(&v, "a");
    assert_non_null(a);
    assert_int_equal(a->n, 6);
    assert_true(a->items[0].is_int && a->items[0].integer == 1);
    assert_true(a->items[1].is_int && a->items[1].integer == -2);
    assert_false(a->items[2].is_int);
    assert_true(a->items[2].number == 350.0);
    assert_int_equal(a->items[3].type, CP_JSON_BOOL);
    assert_int_equal(a->items[5].type, CP_JSON_NULL);
    const cp_json *b = cp_json_get(&v, "b\xc3\xa9\xf0\x9f\x98\x80"); /* é and U+1F600 decoded to UTF-8 */
    assert_non_null(b);
    assert_string_equal(cp_json_get(b, "c")->string, "x\n\"y");
    assert_true(cp_json_get(&v, "big")->is_int);
    assert_true(cp_json_get(&v, "big")->integer == INT64_MAX);
    assert_false(cp_json_get(&v, "huge")->is_int); /* out of int64: a number, not an integer */
    cp_json_free(&v);

    static const struct {
        const char *text, *frag;
    } bad[] = {
        {"", "end of the text"},
        {"{\"a\":1,}", "trailing comma"},
        {"[1,2,]", "trailing comma"},
        {"{\"a\":1,\"a\":2}", "twice"},
        {"{\"a\" 1}", "expected ':'"},
        {"{a:1}", "expected a key string"},
        {"[01]", "leading zeros"},
        {"[1.]", "digit must follow '.'"},
        {"[-]", "digit must follow '-'"},
        {"[1e]", "exponent"},
        {"[NaN]", "expected a JSON value"},
        {"[tru]", "expected a JSON value"},
        {"\"abc", "not closed"},
        {"\"a\tb\"", "control byte"},
        {"\"\\x\"", "unknown escape"},
        {"\"\\ud800\"", "high surrogate"},
        {"\"\\udc00\"", "lone low surrogate"},
        {"\"\\u12\"", "four hex digits"},
        {"\"\\u0000\"", "NUL"},
        {"\"\xff\"", "invalid UTF-8"},
        {"\"\xc0\xaf\"", "invalid UTF-8"}, /* overlong */
        {"{} {}", "after the end"},
        {"[1 2]", "expected ','"},
        {"// c\n{}", "expected a JSON value"},
    };
    for (size_t k = 0; k < CP_ARRAY_LEN(bad); k++) {
        int rc = cp_json_parse(bad[k].text, strlen(bad[k].text), &v, err, sizeof err);
        if (rc == 0) fail_msg("accepted bad JSON %s", bad[k].text);
        if (!contains(err, bad[k].frag)) fail_msg("JSON %s: message lacks \"%s\": %s", bad[k].text, bad[k].frag, err);
        assert_true(contains(err, "at byte"));
        cp_json_free(&v);
    }
    /* nesting bomb */
    char deep[400];
    memset(deep, '[', 300);
    deep[300] = 0;
    assert_int_equal(cp_json_parse(deep, 300, &v, err, sizeof err), -1);
    assert_true(contains(err, "nesting deeper"));
    /* numbers written back read the same */
    double nums[] = {1e-5, 1e-6, 500000.0, 0.1, 3.0, 1.0 / 3.0, 1e300};
    for (size_t k = 0; k < CP_ARRAY_LEN(nums); k++) {
        cp_str s = {0};
        cp_json_put_number(&s, nums[k]);
        assert_int_equal(cp_json_parse(s.data, s.len, &v, err, sizeof err), 0);
        assert_true(v.number == nums[k]);
        cp_json_free(&v);
        cp_str_free(&s);
    }
}

static void test_conversions(void **state) {
    (void)state;
    assert_int_equal(cp_f32_to_bf16(1.0f), 0x3f80);
    assert_int_equal(cp_f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);     /* tie to even */
    assert_int_equal(cp_f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82); /* tie to even, up */
    assert_true(isnan(cp_bf16_to_f32(cp_f32_to_bf16(NAN))));
    assert_int_equal(cp_f32_to_f16(1.0f), 0x3c00);
    assert_int_equal(cp_f32_to_f16(-2.0f), 0xc000);
    assert_int_equal(cp_f32_to_f16(65504.0f), 0x7bff);
    assert_int_equal(cp_f32_to_f16(65519.0f), 0x7bff);
    assert_int_equal(cp_f32_to_f16(65520.0f), 0x7c00);        /* rounds to infinity */
    assert_int_equal(cp_f32_to_f16(0x1p-24f), 0x0001);        /* smallest subnormal */
    assert_int_equal(cp_f32_to_f16(0x1p-25f), 0x0000);        /* tie to even: 0 */
    assert_int_equal(cp_f32_to_f16(0x1.8p-24f), 0x0002);      /* 1.5 units: tie to even, up */
    assert_int_equal(cp_f32_to_f16(0x1p-14f), 0x0400);        /* smallest normal */
    assert_int_equal(cp_f32_to_f16(1.0f + 0x1p-11f), 0x3c00); /* tie to even */
    assert_true(isnan(cp_f16_to_f32(cp_f32_to_f16(NAN))));
    /* every finite f16 survives f16 -> f32 -> f16, every bf16 likewise */
    for (uint32_t h = 0; h < 0x10000; h++) {
        if ((h & 0x7c00) != 0x7c00 || !(h & 0x3ff)) assert_int_equal(cp_f32_to_f16(cp_f16_to_f32((uint16_t)h)), h);
        if ((h & 0x7f80) != 0x7f80 || !(h & 0x7f)) assert_int_equal(cp_f32_to_bf16(cp_bf16_to_f32((uint16_t)h)), h);
    }
}

/* ------------------------------------------------------------------------------------------------------------
 * round trips */

typedef struct {
    float *f;
    int64_t n;
} fbuf;

static fbuf randf(int64_t n) {
    fbuf b = {malloc((size_t)CP_MAX(n, 1) * sizeof(float)), n};
    for (int64_t k = 0; k < n; k++) b.f[k] = (float)urand() * 3.0f;
    return b;
}

static void check_tensor_f32(const cp_st_set *st, const char *name, const float *want, int64_t n, cp_st_dtype dt) {
    const cp_st_tensor *t = cp_st_find(st, name);
    if (!t) fail_msg("no tensor %s", name);
    assert_int_equal(t->dtype, dt);
    assert_int_equal(t->elems, n);
    float *got = malloc((size_t)CP_MAX(n, 1) * sizeof(float));
    if (cp_st_read_f32(st, t, 0, n, got, err, sizeof err)) fail_msg("%s", err);
    for (int64_t k = 0; k < n; k++) {
        float w = dt == CP_ST_F32    ? want[k]
                  : dt == CP_ST_BF16 ? cp_bf16_to_f32(cp_f32_to_bf16(want[k]))
                                     : cp_f16_to_f32(cp_f32_to_f16(want[k]));
        if (memcmp(&w, &got[k], 4)) fail_msg("%s[%lld]: %a != %a", name, (long long)k, (double)got[k], (double)w);
    }
    /* a part from the middle */
    if (n > 10) {
        assert_int_equal(cp_st_read_f32(st, t, 3, n - 5, got, err, sizeof err), 0);
        for (int64_t k = 0; k < n - 5; k++) {
            float w = dt == CP_ST_F32    ? want[3 + k]
                      : dt == CP_ST_BF16 ? cp_bf16_to_f32(cp_f32_to_bf16(want[3 + k]))
                                         : cp_f16_to_f32(cp_f32_to_f16(want[3 + k]));
            assert_memory_equal(&w, &got[k], 4);
        }
        assert_int_equal(cp_st_read_f32(st, t, n - 2, 3, got, err, sizeof err), -1); /* past the end */
    }
    free(got);
}

static void fill_const(const void *ctx, int64_t first, int64_t n, float *dst) {
    for (int64_t k = 0; k < n; k++) dst[k] = *(const float *)ctx + (float)(first + k);
}

static void test_roundtrip_single(void **state) {
    (void)state;
    fbuf a = randf(6 * 5), b = randf(7), c = randf(2 * 3 * 4), d = randf(1);
    uint16_t raw[9];
    for (int k = 0; k < 9; k++) raw[k] = (uint16_t)(0x3f00 + k * 37);
    float base = 100.0f;
    cp_st_out outs[] = {
        {.name = "a.weight", .dtype = CP_ST_F32, .ndim = 2, .shape = {6, 5}, .f32 = a.f},
        {.name = "b \"quoted\" \\ name", .dtype = CP_ST_BF16, .ndim = 1, .shape = {7}, .f32 = b.f},
        {.name = "c", .dtype = CP_ST_F16, .ndim = 3, .shape = {2, 3, 4}, .f32 = c.f},
        {.name = "scalar", .dtype = CP_ST_F32, .ndim = 0, .f32 = d.f},
        {.name = "empty", .dtype = CP_ST_BF16, .ndim = 2, .shape = {0, 4}, .f32 = d.f},
        {.name = "raw.bf16", .dtype = CP_ST_BF16, .ndim = 2, .shape = {3, 3}, .raw = raw},
        {.name = "filled", .dtype = CP_ST_F32, .ndim = 1, .shape = {5}, .fill = fill_const, .ctx = &base},
    };
    char *dir = path_in("single");
    assert_int_equal(cp_st_write(dir, outs, (int)CP_ARRAY_LEN(outs), 0, err, sizeof err), 0);
    assert_int_equal(access(path_in("single/model.safetensors"), F_OK), 0);
    assert_int_equal(access(path_in("single/" CP_ST_INDEX_NAME), F_OK), -1);

    /* the header is 8-byte aligned JSON with the metadata */
    size_t len;
    char *bytes = cp_read_file(path_in("single/model.safetensors"), &len);
    uint64_t hl = 0;
    for (int k = 7; k >= 0; k--) hl = hl << 8 | (unsigned char)bytes[k];
    assert_int_equal(hl % 8, 0);
    cp_json h;
    assert_int_equal(cp_json_parse(bytes + 8, hl, &h, err, sizeof err), 0);
    assert_string_equal(cp_json_get(cp_json_get(&h, "__metadata__"), "format")->string, "pt");
    cp_json_free(&h);
    free(bytes);

    cp_st_set st;
    for (int via = 0; via < 2; via++) { /* the folder, then the file */
        if (cp_st_open(via ? path_in("single/model.safetensors") : dir, &st, err, sizeof err)) fail_msg("%s", err);
        assert_int_equal(st.ntensors, (int)CP_ARRAY_LEN(outs));
        assert_int_equal(st.nfiles, 1);
        check_tensor_f32(&st, "a.weight", a.f, 30, CP_ST_F32);
        check_tensor_f32(&st, "b \"quoted\" \\ name", b.f, 7, CP_ST_BF16);
        check_tensor_f32(&st, "c", c.f, 24, CP_ST_F16);
        check_tensor_f32(&st, "scalar", d.f, 1, CP_ST_F32);
        check_tensor_f32(&st, "empty", d.f, 0, CP_ST_BF16);
        const cp_st_tensor *t = cp_st_find(&st, "c");
        assert_int_equal(t->ndim, 3);
        assert_int_equal(t->shape[2], 4);
        assert_int_equal(cp_st_find(&st, "scalar")->ndim, 0);
        uint16_t back[9];
        assert_int_equal(cp_st_read_raw(&st, cp_st_find(&st, "raw.bf16"), back, err, sizeof err), 0);
        assert_memory_equal(back, raw, sizeof raw); /* bf16 bits, bit-exact */
        float f[5];
        assert_int_equal(cp_st_read_f32(&st, cp_st_find(&st, "filled"), 0, 5, f, err, sizeof err), 0);
        for (int k = 0; k < 5; k++) assert_true(f[k] == 100.0f + (float)k);
        assert_null(cp_st_find(&st, "nope"));
        cp_st_close(&st);
    }
    free(a.f), free(b.f), free(c.f), free(d.f);
}

static void test_roundtrip_sharded(void **state) {
    (void)state;
    enum { NT = 9 };
    fbuf v[NT];
    cp_st_out outs[NT];
    char names[NT][32];
    int64_t total = 0;
    for (int k = 0; k < NT; k++) {
        int64_t rows = 10 + k, cols = 16;
        v[k] = randf(rows * cols);
        snprintf(names[k], sizeof names[k], "layer.%d.w", k);
        outs[k] = (cp_st_out){
            .name = names[k], .dtype = k % 2 ? CP_ST_BF16 : CP_ST_F32, .ndim = 2, .shape = {rows, cols}, .f32 = v[k].f};
        total += rows * cols * (k % 2 ? 2 : 4);
    }
    char dir[512];
    snprintf(dir, sizeof dir, "%s", path_in("sharded"));
    cp_mkdir_p(dir);
    write_bytes(path_in("sharded/model.safetensors"), "stale", 5); /* from an earlier save: must go */
    write_bytes(path_in("sharded/model-00007-of-00009.safetensors"), "stale", 5);
    assert_int_equal(cp_st_write(dir, outs, NT, 1500, err, sizeof err), 0);
    assert_int_equal(access(path_in("sharded/model.safetensors"), F_OK), -1);
    assert_int_equal(access(path_in("sharded/model-00007-of-00009.safetensors"), F_OK), -1);
    /* the index: total_size and a weight_map naming existing shards */
    size_t len;
    char *text = cp_read_file(path_in("sharded/" CP_ST_INDEX_NAME), &len);
    assert_non_null(text);
    cp_json idx;
    assert_int_equal(cp_json_parse(text, len, &idx, err, sizeof err), 0);
    free(text);
    assert_int_equal(cp_json_get(cp_json_get(&idx, "metadata"), "total_size")->integer, total);
    const cp_json *wm = cp_json_get(&idx, "weight_map");
    assert_int_equal(wm->n, NT);
    int nshards = 0;
    for (int k = 0; k < wm->n; k++) {
        int i, n;
        assert_int_equal(sscanf(wm->items[k].string, "model-%5d-of-%5d.safetensors", &i, &n), 2);
        nshards = n;
        char p[64];
        snprintf(p, sizeof p, "sharded/%s", wm->items[k].string);
        assert_int_equal(access(path_in(p), F_OK), 0);
    }
    assert_true(nshards >= 3);
    cp_json_free(&idx);

    cp_st_set st;
    for (int via = 0; via < 2; via++) {
        if (cp_st_open(via ? path_in("sharded/" CP_ST_INDEX_NAME) : dir, &st, err, sizeof err)) fail_msg("%s", err);
        assert_int_equal(st.nfiles, nshards);
        assert_int_equal(st.ntensors, NT);
        for (int k = 0; k < NT; k++) check_tensor_f32(&st, names[k], v[k].f, v[k].n, outs[k].dtype);
        cp_st_close(&st);
    }
    /* saving a single file over it removes the index and the shards */
    assert_int_equal(cp_st_write(dir, outs, NT, 0, err, sizeof err), 0);
    assert_int_equal(access(path_in("sharded/" CP_ST_INDEX_NAME), F_OK), -1);
    char first[64];
    snprintf(first, sizeof first, "sharded/model-00001-of-%05d.safetensors", nshards);
    assert_int_equal(access(path_in(first), F_OK), -1);
    if (cp_st_open(dir, &st, err, sizeof err)) fail_msg("%s", err);
    assert_int_equal(st.nfiles, 1);
    for (int k = 0; k < NT; k++) check_tensor_f32(&st, names[k], v[k].f, v[k].n, outs[k].dtype);
    cp_st_close(&st);
    for (int k = 0; k < NT; k++) free(v[k].f);
}

/* ------------------------------------------------------------------------------------------------------------
 * corrupt files */

static void test_corrupt_files(void **state) {
    (void)state;
    char *p = path_in("bad.safetensors");
    write_bytes(p, "abc", 3);
    expect_open_fails(p, 2, "bad.safetensors", "shorter than the 8-byte header length");

    write_st(p, "", 0); /* header length 0 */
    expect_open_fails(p, 1, "header length 0 is not in");
    unsigned char huge[16] = {0, 0, 0, 0, 0, 0, 0, 1}; /* 2^56 */
    write_bytes(p, huge, sizeof huge);
    expect_open_fails(p, 1, "is not in [1, 100000000]");
    unsigned char past[16] = {100, 0, 0, 0, 0, 0, 0, 0, '{', '}'};
    write_bytes(p, past, 10);
    expect_open_fails(p, 2, "header length 100 runs past the end of the file (10 bytes)", "truncated");

    write_st(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},}", 8);
    expect_open_fails(p, 3, "JSON header is malformed", "trailing comma", "at byte");
    write_st(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}", 8);
    expect_open_fails(p, 2, "malformed", "expected ',' or '}'");
    write_st(p, "[1,2]", 8);
    expect_open_fails(p, 1, "not a JSON object");
    write_st(p, "{\"a\":{\"dtype\":\"F33\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8);
    expect_open_fails(p, 3, "tensor \"a\"", "unknown dtype \"F33\"", "BF16");
    write_st(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 6); /* data cut short */
    expect_open_fails(p, 3, "reach past the data area (6 bytes", "truncated", "\"a\"");
    write_st(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[16,24]}}", 16);
    expect_open_fails(p, 1, "reach past the data area");
    write_st(p,
             "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
             "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
             12);
    expect_open_fails(p, 3, "\"a\" [0, 8]", "\"b\" [4, 12]", "overlap");
    write_st(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8);
    expect_open_fails(p, 2, "hold 8 bytes but shape [3] in F32 needs 12", "corrupt");
    write_st(p, "{\"a\":{\"dtype\":\"BF16\",\"shape\":[2,2],\"data_offsets\":[0,16]}}", 16);
    expect_open_fails(p, 1, "shape [2, 2] in BF16 needs 8");
    write_st(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8);
    expect_open_fails(p, 1, "shape[0] is not a non-negative integer");
    write_st(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2.5],\"data_offsets\":[0,8]}}", 8);
    expect_open_fails(p, 1, "shape[0] is not a non-negative integer");
    write_st(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8);
    expect_open_fails(p, 1, "end before they begin");
    write_st(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}}", 8);
    expect_open_fails(p, 1, "data_offsets must be an array [begin, end]");
    write_st(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8);
    expect_open_fails(p, 1, "lacks \"data_offsets\"");
    write_st(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],\"x\":1}}", 8);
    expect_open_fails(p, 1, "unknown field \"x\"");
    write_st(p, "{\"a\":{\"dtype\":1,\"shape\":[2],\"data_offsets\":[0,8]}}", 8);
    expect_open_fails(p, 1, "dtype is a number");
    write_st(p, "{\"a\":[1]}", 8);
    expect_open_fails(p, 1, "header entry \"a\" is an array");
    write_st(p, "{\"__metadata__\":{\"format\":1}}", 0);
    expect_open_fails(p, 1, "metadata values must be strings");
    write_st(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4294967296],\"data_offsets\":[0,8]}}", 8);
    expect_open_fails(p, 1, "more elements than any file can hold");
    write_st(p,
             "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"a\":{\"dtype\":\"F32\",\"shape\":[2],"
             "\"data_offsets\":[0,8]}}",
             8);
    expect_open_fails(p, 1, "the key \"a\" twice");

    /* a valid file with an I64 tensor opens; reading that one as float says why not */
    write_st(p,
             "{\"__metadata__\":{\"format\":\"pt\"},\"ids\":{\"dtype\":\"I64\",\"shape\":[2],\"data_offsets\":[0,16]},"
             "\"w\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[16,20]},"
             "\"z\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[16,16]}}",
             20);
    cp_st_set st;
    if (cp_st_open(p, &st, err, sizeof err)) fail_msg("%s", err);
    float f[2];
    assert_int_equal(cp_st_read_f32(&st, cp_st_find(&st, "ids"), 0, 2, f, err, sizeof err), -1);
    assert_true(contains(err, "is I64; cpgen reads only F32, BF16 and F16"));
    cp_st_close(&st);

    /* the file shrinks after it was opened: the read says so */
    write_st(p, "{\"w\":{\"dtype\":\"F32\",\"shape\":[1024],\"data_offsets\":[0,4096]}}", 4096);
    if (cp_st_open(p, &st, err, sizeof err)) fail_msg("%s", err);
    assert_int_equal(truncate(p, 100), 0);
    float *g = malloc(4096);
    assert_int_equal(cp_st_read_f32(&st, cp_st_find(&st, "w"), 0, 1024, g, err, sizeof err), -1);
    assert_true(contains(err, "truncated"));
    free(g);
    cp_st_close(&st);

    expect_open_fails(path_in("does-not-exist"), 2, "does-not-exist", "No such file");
    /* folders: none, or several files without an index */
    char *d = path_in("emptydir");
    cp_mkdir_p(d);
    expect_open_fails(d, 1, "neither model.safetensors.index.json nor a *.safetensors file");
    write_st(path_in("emptydir/a.safetensors"), "{}", 0);
    write_st(path_in("emptydir/b.safetensors"), "{}", 0);
    expect_open_fails(d, 2, "2 *.safetensors files", "no model.safetensors.index.json");
}

static void test_corrupt_index(void **state) {
    (void)state;
    char *d = path_in("idx");
    cp_mkdir_p(d);
    write_st(path_in("idx/s1.safetensors"), "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8);
    write_st(path_in("idx/s2.safetensors"), "{\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8);
    char *ip = path_in("idx/" CP_ST_INDEX_NAME);
    const char *good =
        "{\"metadata\":{\"total_size\":16},\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"s2.safetensors\"}}";
    write_bytes(ip, good, strlen(good));
    cp_st_set st;
    if (cp_st_open(d, &st, err, sizeof err)) fail_msg("%s", err);
    assert_int_equal(st.nfiles, 2);
    assert_non_null(cp_st_find(&st, "a"));
    assert_true(contains(st.files[cp_st_find(&st, "b")->file].path, "idx/s2.safetensors"));
    cp_st_close(&st);

    static const struct {
        const char *index, *frag;
    } bad[] = {
        {"{\"weight_map\":{\"a\":\"s1.safetensors\",}}", "not valid JSON"},
        {"{\"metadata\":{}}", "no \"weight_map\""},
        {"{\"weight_map\":{}}", "weight_map is empty"},
        {"{\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"s3.safetensors\"}}", "s3.safetensors: cannot open"},
        {"{\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"s1.safetensors\"}}", "maps \"b\" to s1.safetensors, but "
                                                                                 "that shard has no such tensor"},
        {"{\"weight_map\":{\"a\":\"s1.safetensors\"}}", "holds \"b\"" /* b's shard is not named: fine */},
        {"{\"weight_map\":{\"a\":\"../s1.safetensors\"}}", "without \"..\""},
        {"{\"weight_map\":{\"a\":5}}", "is not a file name"},
    };
    for (size_t k = 0; k < CP_ARRAY_LEN(bad); k++) {
        write_bytes(ip, bad[k].index, strlen(bad[k].index));
        int rc = cp_st_open(d, &st, err, sizeof err);
        if (k == 5) { /* an index naming only s1 opens: s2 is just another file in the folder */
            assert_int_equal(rc, 0);
            assert_int_equal(st.ntensors, 1);
            cp_st_close(&st);
            continue;
        }
        if (rc == 0) fail_msg("index %s accepted", bad[k].index);
        if (!contains(err, bad[k].frag)) fail_msg("index %s: message lacks \"%s\": %s", bad[k].index, bad[k].frag, err);
    }
    /* a shard holding a tensor the index does not list */
    write_st(path_in("idx/s1.safetensors"),
             "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
             "\"c\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}",
             12);
    write_bytes(ip, good, strlen(good));
    expect_open_fails(d, 2, "holds \"c\"", "does not list");
    const char *c_in_s2 =
        "{\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"s2.safetensors\",\"c\":\"s2.safetensors\"}}";
    write_bytes(ip, c_in_s2, strlen(c_in_s2));
    expect_open_fails(d, 1, "maps \"c\" to s2.safetensors");
}

/* Random damage to a valid file's header and length: every outcome is a clean accept or a clean reject. */
static void test_fuzz(void **state) {
    (void)state;
    fbuf a = randf(64), b = randf(32);
    cp_st_out outs[] = {
        {.name = "model.embed_tokens.weight", .dtype = CP_ST_BF16, .ndim = 2, .shape = {8, 8}, .f32 = a.f},
        {.name = "model.norm.weight", .dtype = CP_ST_F32, .ndim = 1, .shape = {32}, .f32 = b.f},
    };
    char *dir = path_in("fuzz");
    assert_int_equal(cp_st_write(dir, outs, 2, 0, err, sizeof err), 0);
    size_t len;
    char *good = cp_read_file(path_in("fuzz/model.safetensors"), &len);
    char *p = path_in("fuzz/model.safetensors");
    unsigned char *m = malloc(len);
    float *f = malloc(64 * sizeof(float));
    int accepted = 0;
    for (int iter = 0; iter < 3000; iter++) {
        memcpy(m, good, len);
        size_t n = len;
        int kind = iter % 4;
        if (kind == 0) { /* flip bytes in the header */
            for (int k = 0; k < 1 + iter % 3; k++)
                m[8 + (size_t)((urand() * 0.5 + 0.5) * (double)(len - 9))] ^= (unsigned char)(1u << (iter % 8));
        } else if (kind == 1) { /* replace a header byte by a JSON-significant one */
            static const char sig[] = "{}[]\",:0-9e.\\ tfn";
            m[8 + (size_t)((urand() * 0.5 + 0.5) * (double)(len - 9))] =
                (unsigned char)sig[iter % (int)(sizeof sig - 1)];
        } else if (kind == 2) { /* truncate */
            n = (size_t)((urand() * 0.5 + 0.5) * (double)len);
        } else { /* damage the length */
            m[(size_t)((urand() * 0.5 + 0.5) * 7.99)] ^= (unsigned char)(1u << (iter % 8));
        }
        write_bytes(p, m, n);
        cp_st_set st;
        if (cp_st_open(p, &st, err, sizeof err) == 0) {
            accepted++;
            for (int k = 0; k < st.ntensors; k++) {
                const cp_st_tensor *t = &st.tensors[k];
                if (t->elems <= 64) (void)cp_st_read_f32(&st, t, 0, t->elems, f, err, sizeof err);
            }
            cp_st_close(&st);
        } else {
            assert_true(strlen(err) > 20);
        }
    }
    assert_true(accepted > 0); /* some flips (inside float digits, names) leave a valid file */
    free(f);
    free(m);
    free(good);
    free(a.f), free(b.f);
}

/* ------------------------------------------------------------------------------------------------------------
 * weights: names, permutation, load/save */

static void load_spec(cp_spec *s, const char *name, int nsets, ...) {
    const char *sets[16];
    va_list ap;
    va_start(ap, nsets);
    for (int k = 0; k < nsets; k++) sets[k] = va_arg(ap, const char *);
    va_end(ap);
    if (cp_spec_load(name, sets, nsets, s, err, sizeof err)) fail_msg("spec: %s", err);
}

static void build(const cp_spec *s, cp_plan *p) {
    if (cp_plan_build(s, p, err, sizeof err)) fail_msg("plan: %s", err);
}

static void test_q_head_order(void **state) {
    (void)state;
    cp_spec s;
    cp_plan p;
    int order[64];
    /* tiny: 4 heads, 2 KV; 2 GPUs, U = 2: stage 0 is heads {0, 2} (rank 0 KV 0, rank 1 KV 1), stage 1 {1, 3} */
    load_spec(&s, "tiny", 2, "parallel.gpus=2", "parallel.upipe_heads=2");
    build(&s, &p);
    assert_int_equal(p.U, 2);
    assert_int_equal(p.u, 1);
    cp_q_head_order(&p, order);
    int want[] = {0, 2, 1, 3};
    assert_memory_equal(order, want, sizeof want);
    cp_plan_free(&p);
    /* one GPU, U = 1: the GQA order is the model order */
    load_spec(&s, "tiny", 1, "parallel.upipe_heads=1");
    build(&s, &p);
    assert_int_equal(p.U, 1);
    cp_q_head_order(&p, order);
    for (int h = 0; h < 4; h++) assert_int_equal(order[h], h);
    cp_plan_free(&p);
    /* llama8b shape, 8 GPUs, U = 8: stage s rank r holds KV head r, query head 4r + s; a permutation each time */
    load_spec(&s, "llama8b", 3, "parallel.gpus=8", "model.layers=1", "train.seq_len=64K");
    build(&s, &p);
    cp_q_head_order(&p, order);
    for (int st = 0; st < 4; st++)
        for (int r = 0; r < 8; r++) assert_int_equal(order[st * 8 + r], r * 4 + st);
    cp_plan_free(&p);
    static const char *const cfg[][2] = {{"parallel.gpus=2", "parallel.upipe_heads=4"},
                                         {"parallel.gpus=4", "parallel.upipe_heads=4"},
                                         {"parallel.gpus=2", "parallel.upipe_heads=2"},
                                         {"parallel.gpus=1", "parallel.upipe_heads=2"}};
    for (size_t k = 0; k < CP_ARRAY_LEN(cfg); k++) {
        load_spec(&s, "tiny", 2, cfg[k][0], cfg[k][1]);
        build(&s, &p);
        cp_q_head_order(&p, order);
        int seen[4] = {0};
        for (int h = 0; h < 4; h++) seen[order[h]]++;
        for (int h = 0; h < 4; h++) assert_int_equal(seen[h], 1);
        /* the definition: position s*U + r*u + j holds stages[s*C + r].q_heads[j] */
        for (int st = 0; st < p.nstages; st++)
            for (int r = 0; r < p.C; r++)
                for (int j = 0; j < p.u; j++)
                    assert_int_equal(order[st * p.U + r * p.u + j], p.stages[st * p.C + r].q_heads[j]);
        cp_plan_free(&p);
    }
}

static void test_hf_names(void **state) {
    (void)state;
    cp_spec s;
    cp_plan p;
    load_spec(&s, "tiny", 0);
    build(&s, &p);
    int n = cp_weights_hf_tensors(&p, NULL, 0);
    assert_int_equal(n, 1 + 2 * 9 + 2);
    cp_hf_tensor t[64];
    assert_int_equal(cp_weights_hf_tensors(&p, t, 64), n);
    assert_string_equal(t[0].name, "model.embed_tokens.weight");
    assert_int_equal(t[0].shape[0], 512);
    assert_int_equal(t[0].shape[1], 256);
    assert_int_equal(t[0].off, 0);
    const char *layer0[] = {"q_proj",    "k_proj",          "v_proj",
                            "o_proj",    "gate_proj",       "up_proj",
                            "down_proj", "input_layernorm", "post_attention_layernorm"};
    cp_weight w0[] = {CP_W_Q, CP_W_K, CP_W_V, CP_W_O, CP_W_GATE, CP_W_UP, CP_W_DOWN, CP_W_NORM1, CP_W_NORM2};
    for (int k = 0; k < 9; k++) {
        assert_true(contains(t[1 + k].name, layer0[k]));
        assert_true(contains(t[1 + k].name, "model.layers.0."));
        assert_int_equal(t[1 + k].off, p.unit_padded[0] + p.layout.off[w0[k]]);
        assert_true(contains(t[10 + k].name, "model.layers.1."));
        assert_int_equal(t[10 + k].off, p.unit_padded[0] + p.unit_padded[1] + p.layout.off[w0[k]]);
    }
    assert_string_equal(t[1].name, "model.layers.0.self_attn.q_proj.weight");
    assert_int_equal(t[1].perm, CP_HF_Q_ROWS);
    assert_int_equal(t[1].shape[0], 4 * 64);
    assert_int_equal(t[4].perm, CP_HF_O_COLS);
    assert_int_equal(t[4].shape[0], 256);
    assert_int_equal(t[4].shape[1], 256);
    assert_int_equal(t[2].shape[0], 2 * 64);
    assert_string_equal(t[8].name, "model.layers.0.input_layernorm.weight");
    assert_int_equal(t[8].ndim, 1);
    assert_true(t[8].norm);
    assert_string_equal(t[19].name, "model.norm.weight");
    assert_int_equal(t[19].off, cp_weights_unit_off(&p, 3));
    assert_string_equal(t[20].name, "lm_head.weight");
    assert_int_equal(t[20].off, cp_weights_unit_off(&p, 3) + 256);
    assert_int_equal(cp_weights_elems(&p), p.params_shard); /* C = 1: the flat model is the shard */
    cp_plan_free(&p);

    load_spec(&s, "tiny", 2, "model.family=qwen3", "model.tie_embeddings=true");
    build(&s, &p);
    n = cp_weights_hf_tensors(&p, t, 64);
    assert_int_equal(n, 1 + 2 * 11 + 1);
    assert_string_equal(t[5].name, "model.layers.0.self_attn.q_norm.weight");
    assert_string_equal(t[6].name, "model.layers.0.self_attn.k_norm.weight");
    assert_int_equal(t[5].shape[0], 64);
    assert_int_equal(t[5].off, p.unit_padded[0] + p.layout.off[CP_W_QNORM]);
    assert_string_equal(t[n - 1].name, "model.norm.weight");
    cp_plan_free(&p);
}

static float *alloc_model(const cp_plan *p) { return malloc((size_t)cp_weights_elems(p) * sizeof(float)); }

/* The stored Wq block p holds HF head order[p]; Wo's column block p likewise. */
static void test_permutation_semantics(void **state) {
    (void)state;
    cp_spec s;
    cp_plan p;
    load_spec(&s, "tiny", 3, "parallel.gpus=2", "parallel.upipe_heads=2", "model.layers=1");
    build(&s, &p);
    int order[4];
    cp_q_head_order(&p, order);
    const int64_t hid = 256, hd = 64, H = 4;
    float *model = alloc_model(&p);
    cp_weights_init_random(&p, 1, 0.02, model);
    /* write HF tensors where q rows and o columns carry their head number */
    cp_hf_tensor t[32];
    int n = cp_weights_hf_tensors(&p, t, 32);
    float *q = malloc(sizeof(float) * H * hd * hid), *o = malloc(sizeof(float) * hid * H * hd);
    for (int64_t r = 0; r < H * hd; r++)
        for (int64_t c = 0; c < hid; c++) q[r * hid + c] = (float)(r / hd) + (float)(r % hd) * 1e-3f;
    for (int64_t r = 0; r < hid; r++)
        for (int64_t c = 0; c < H * hd; c++) o[r * H * hd + c] = (float)(c / hd) + (float)(c % hd) * 1e-3f;
    cp_st_out outs[32];
    for (int k = 0; k < n; k++) {
        outs[k] = (cp_st_out){.name = t[k].name,
                              .dtype = CP_ST_F32,
                              .ndim = t[k].ndim,
                              .shape = {t[k].shape[0], t[k].shape[1]},
                              .f32 = model + t[k].off};
        if (t[k].perm == CP_HF_Q_ROWS) outs[k].f32 = q;
        if (t[k].perm == CP_HF_O_COLS) outs[k].f32 = o;
    }
    char *dir = path_in("perm");
    assert_int_equal(cp_st_write(dir, outs, n, 0, err, sizeof err), 0);
    float *back = alloc_model(&p);
    if (cp_weights_load_hf(&p, dir, back, err, sizeof err)) fail_msg("%s", err);
    const float *wq = back + cp_weights_unit_off(&p, 1) + p.layout.off[CP_W_Q];
    const float *wo = back + cp_weights_unit_off(&p, 1) + p.layout.off[CP_W_O];
    for (int64_t pos = 0; pos < H; pos++)
        for (int64_t r = 0; r < hd; r++) {
            assert_true(wq[(pos * hd + r) * hid + 7] == (float)order[pos] + (float)r * 1e-3f);
            assert_true(wo[5 * H * hd + pos * hd + r] == (float)order[pos] + (float)r * 1e-3f);
        }
    /* and saving puts them back in model order */
    char *dir2 = path_in("perm2");
    if (cp_weights_save_hf(&p, back, dir2, false, 0, err, sizeof err)) fail_msg("%s", err);
    cp_st_set st;
    if (cp_st_open(dir2, &st, err, sizeof err)) fail_msg("%s", err);
    float *got = malloc(sizeof(float) * H * hd * hid);
    assert_int_equal(cp_st_read_f32(&st, cp_st_find(&st, "model.layers.0.self_attn.q_proj.weight"), 0, H * hd * hid,
                                    got, err, sizeof err),
                     0);
    assert_memory_equal(got, q, sizeof(float) * H * hd * hid);
    assert_int_equal(cp_st_read_f32(&st, cp_st_find(&st, "model.layers.0.self_attn.o_proj.weight"), 0, H * hd * hid,
                                    got, err, sizeof err),
                     0);
    assert_memory_equal(got, o, sizeof(float) * H * hd * hid);
    cp_st_close(&st);
    free(got), free(q), free(o), free(model), free(back);
    cp_plan_free(&p);
}

static void test_save_load_roundtrip(void **state) {
    (void)state;
    static const char *const cfgs[][3] = {
        {"parallel.gpus=2", "parallel.upipe_heads=2", "model.family=llama"},
        {"parallel.gpus=1", "parallel.upipe_heads=1", "model.family=qwen3"},
        {"parallel.gpus=2", "parallel.upipe_heads=2", "model.tie_embeddings=true"},
        {"parallel.gpus=2", "model.hidden=200", "model.family=qwen3"},
    };
    for (size_t c = 0; c < CP_ARRAY_LEN(cfgs); c++) {
        cp_spec s;
        cp_plan p;
        load_spec(&s, "tiny", 3, cfgs[c][0], cfgs[c][1], cfgs[c][2]);
        build(&s, &p);
        int64_t n = cp_weights_elems(&p);
        float *x = alloc_model(&p), *y = alloc_model(&p);
        cp_weights_init_random(&p, 7, 0.5, x);
        /* exercise the full range, not just small normals; padding stays 0 */
        cp_hf_tensor t[64];
        int nt = cp_weights_hf_tensors(&p, t, 64);
        for (int k = 0; k < nt; k++)
            for (int64_t e = 0; e < (t[k].ndim == 2 ? t[k].shape[0] * t[k].shape[1] : t[k].shape[0]); e++)
                if (e % 97 == 3) x[t[k].off + e] = (float)(urand() * 1e30);
        for (int sharded = 0; sharded < 2; sharded++) {
            char name[32];
            snprintf(name, sizeof name, "rt%zu_%d", c, sharded);
            char *dir = path_in(name);
            int64_t shard = sharded ? 300000 : 0;
            if (cp_weights_save_hf(&p, x, dir, false, shard, err, sizeof err)) fail_msg("%s", err);
            char file[64];
            snprintf(file, sizeof file, "%s/%s", name, sharded ? CP_ST_INDEX_NAME : "model.safetensors");
            assert_int_equal(access(path_in(file), F_OK), 0);
            memset(y, 0xff, (size_t)n * sizeof *y);
            if (cp_weights_load_hf(&p, dir, y, err, sizeof err)) fail_msg("%s", err);
            assert_memory_equal(x, y, (size_t)n * sizeof *x); /* f32: bit-exact, padding included */
            /* bf16: the load is the bf16 rounding of x */
            if (cp_weights_save_hf(&p, x, dir, true, shard, err, sizeof err)) fail_msg("%s", err);
            if (cp_weights_load_hf(&p, dir, y, err, sizeof err)) fail_msg("%s", err);
            for (int64_t e = 0; e < n; e++) {
                float w = cp_bf16_to_f32(cp_f32_to_bf16(x[e]));
                if (memcmp(&w, &y[e], 4))
                    fail_msg("bf16 element %lld: %a != %a", (long long)e, (double)y[e], (double)w);
            }
            cp_st_set st;
            if (cp_st_open(dir, &st, err, sizeof err)) fail_msg("%s", err);
            assert_int_equal(st.ntensors, nt);
            assert_int_equal(st.tensors[0].dtype, CP_ST_BF16);
            assert_int_equal(cp_st_find(&st, "lm_head.weight") != NULL, !s.model.tie_embeddings);
            if (sharded) assert_true(st.nfiles > 1);
            cp_st_close(&st);
        }
        free(x), free(y);
        cp_plan_free(&p);
    }
}

/* Loading with a spec that does not describe the checkpoint says which field differs. */
static void test_load_mismatch(void **state) {
    (void)state;
    cp_spec s;
    cp_plan p, q;
    load_spec(&s, "tiny", 0);
    build(&s, &p);
    float *x = alloc_model(&p);
    cp_weights_init_random(&p, 3, 0.02, x);
    char *dir = path_in("mm");
    if (cp_weights_save_hf(&p, x, dir, true, 0, err, sizeof err)) fail_msg("%s", err);

    static const struct {
        const char *set;
        const char *frags[3];
    } cases[] = {
        {"model.ffn=1024", {"mlp.gate_proj.weight\" has shape [768, 256]", "expects [1024, 256]", "model.ffn = 1024"}},
        {"model.vocab=1024", {"embed_tokens.weight\" has shape [512, 256]", "expects [1024, 256]", "model.vocab"}},
        {"model.kv_heads=4", {"k_proj.weight\" has shape [128, 256]", "expects [256, 256]", "model.kv_heads"}},
        {"model.layers=3", {"no tensor \"model.layers.2.self_attn.q_proj.weight\"", "tiny", "llama"}},
        {"model.layers=1", {"has layer 1", "model.layers = 1", "num_hidden_layers"}},
        {"model.tie_embeddings=true", {"lm_head.weight different from its embedding", "tie_embeddings = true", ""}},
        {"model.family=qwen3", {"no \"model.layers.0.self_attn.q_norm.weight\"", "family = \"llama\"", ""}},
    };
    for (size_t k = 0; k < CP_ARRAY_LEN(cases); k++) {
        cp_spec s2;
        load_spec(&s2, "tiny", 1, cases[k].set);
        build(&s2, &q);
        float *y = alloc_model(&q);
        int rc = cp_weights_load_hf(&q, dir, y, err, sizeof err);
        if (rc == 0) fail_msg("%s: loaded", cases[k].set);
        for (int f = 0; f < 3; f++)
            if (cases[k].frags[f][0] && !contains(err, cases[k].frags[f]))
                fail_msg("%s: message lacks \"%s\": %s", cases[k].set, cases[k].frags[f], err);
        free(y);
        cp_plan_free(&q);
    }
    /* a tied checkpoint into an untied spec; a qwen3 checkpoint into a llama spec */
    cp_spec st;
    load_spec(&st, "tiny", 2, "model.tie_embeddings=true", "model.family=qwen3");
    build(&st, &q);
    float *y = alloc_model(&q);
    cp_weights_init_random(&q, 3, 0.02, y);
    char *dir2 = path_in("mm_tied");
    if (cp_weights_save_hf(&q, y, dir2, false, 0, err, sizeof err)) fail_msg("%s", err);
    assert_int_equal(cp_weights_load_hf(&p, dir2, x, err, sizeof err), -1);
    if (!contains(err, "_norm.weight\" (q/k norms") || !contains(err, "qwen3")) fail_msg("%s", err);
    free(y);
    cp_plan_free(&q);
    load_spec(&st, "tiny", 1, "model.tie_embeddings=true");
    build(&st, &q);
    y = alloc_model(&q);
    cp_weights_init_random(&q, 3, 0.02, y);
    if (cp_weights_save_hf(&q, y, dir2, false, 0, err, sizeof err)) fail_msg("%s", err);
    assert_int_equal(cp_weights_load_hf(&p, dir2, x, err, sizeof err), -1);
    assert_true(contains(err, "no lm_head.weight") && contains(err, "tie_embeddings = true"));
    free(y);
    cp_plan_free(&q);

    /* a NaN in a checkpoint */
    x[cp_weights_unit_off(&p, 1) + p.layout.off[CP_W_UP] + 5] = NAN;
    if (cp_weights_save_hf(&p, x, dir, false, 0, err, sizeof err)) fail_msg("%s", err);
    assert_int_equal(cp_weights_load_hf(&p, dir, x, err, sizeof err), -1);
    assert_true(contains(err, "model.layers.0.mlp.up_proj.weight\" element 5 is NaN"));
    /* an unexpected tensor */
    fbuf b = randf(4);
    cp_st_out extra = {
        .name = "model.layers.0.self_attn.q_proj.bias", .dtype = CP_ST_F32, .ndim = 1, .shape = {4}, .f32 = b.f};
    char *dir3 = path_in("mm_extra");
    assert_int_equal(cp_st_write(dir3, &extra, 1, 0, err, sizeof err), 0);
    assert_int_equal(cp_weights_load_hf(&p, dir3, x, err, sizeof err), -1);
    assert_true(contains(err, "unexpected tensor \"model.layers.0.self_attn.q_proj.bias\""));
    assert_int_equal(cp_weights_load_hf(&p, path_in("nowhere"), x, err, sizeof err), -1);
    assert_true(contains(err, "nowhere") && contains(err, "cannot open"));
    free(b.f);
    free(x);
    cp_plan_free(&p);
}

static void test_config_json(void **state) {
    (void)state;
    cp_spec s;
    cp_plan p;
    memset(&p, 0, sizeof p);
    load_spec(&s, "llama8b", 0);
    p.spec = s;
    char *text = cp_weights_hf_config(&p, true, err, sizeof err);
    assert_non_null(text);
    cp_json c;
    if (cp_json_parse(text, strlen(text), &c, err, sizeof err)) fail_msg("%s\n%s", err, text);
    assert_string_equal(cp_json_get(&c, "architectures")->items[0].string, "LlamaForCausalLM");
    assert_string_equal(cp_json_get(&c, "model_type")->string, "llama");
    assert_int_equal(cp_json_get(&c, "hidden_size")->integer, 4096);
    assert_int_equal(cp_json_get(&c, "intermediate_size")->integer, 14336);
    assert_int_equal(cp_json_get(&c, "num_attention_heads")->integer, 32);
    assert_int_equal(cp_json_get(&c, "num_key_value_heads")->integer, 8);
    assert_int_equal(cp_json_get(&c, "head_dim")->integer, 128);
    assert_int_equal(cp_json_get(&c, "num_hidden_layers")->integer, 32);
    assert_int_equal(cp_json_get(&c, "vocab_size")->integer, 128256);
    assert_true(cp_json_get(&c, "rms_norm_eps")->number == 1e-5);
    assert_true(cp_json_get(&c, "rope_theta")->number == 500000.0);
    const cp_json *rs = cp_json_get(&c, "rope_scaling");
    assert_string_equal(cp_json_get(rs, "rope_type")->string, "llama3");
    assert_true(cp_json_get(rs, "factor")->number == 8.0);
    assert_true(cp_json_get(rs, "low_freq_factor")->number == 1.0);
    assert_true(cp_json_get(rs, "high_freq_factor")->number == 4.0);
    assert_int_equal(cp_json_get(rs, "original_max_position_embeddings")->integer, 8192);
    assert_false(cp_json_get(&c, "tie_word_embeddings")->boolean);
    assert_true(cp_json_get(&c, "max_position_embeddings")->integer >= 65536);
    assert_string_equal(cp_json_get(&c, "torch_dtype")->string, "bfloat16");
    cp_json_free(&c);
    free(text);

    load_spec(&s, "qwen32b", 0);
    p.spec = s;
    text = cp_weights_hf_config(&p, false, err, sizeof err);
    assert_int_equal(cp_json_parse(text, strlen(text), &c, err, sizeof err), 0);
    assert_string_equal(cp_json_get(&c, "model_type")->string, "qwen3");
    assert_string_equal(cp_json_get(&c, "architectures")->items[0].string, "Qwen3ForCausalLM");
    assert_int_equal(cp_json_get(&c, "rope_scaling")->type, CP_JSON_NULL);
    assert_true(cp_json_get(&c, "rms_norm_eps")->number == 1e-6);
    assert_string_equal(cp_json_get(&c, "torch_dtype")->string, "float32");
    cp_json_free(&c);
    free(text);

    load_spec(&s, "tiny", 1, "model.qk_norm=true");
    p.spec = s;
    assert_null(cp_weights_hf_config(&p, true, err, sizeof err));
    assert_true(contains(err, "qk_norm = true with family \"llama\""));

    /* the saved folder holds the same config.json */
    load_spec(&s, "tiny", 0);
    build(&s, &p);
    float *x = alloc_model(&p);
    cp_weights_init_random(&p, 0, 0.02, x);
    char *dir = path_in("cfg");
    if (cp_weights_save_hf(&p, x, dir, true, 0, err, sizeof err)) fail_msg("%s", err);
    size_t len;
    char *saved = cp_read_file(path_in("cfg/config.json"), &len);
    text = cp_weights_hf_config(&p, true, err, sizeof err);
    assert_string_equal(saved, text);
    free(saved), free(text), free(x);
    cp_plan_free(&p);
}

static uint64_t mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* FSDP shards: the C ranks' shards of a model tile it exactly once, each unit split in C equal parts; a rank's
 * random init made alone is its shard of the whole init. */
static void test_shards(void **state) {
    (void)state;
    static const char *const cases[][3] = {{"tiny", "parallel.gpus=2", "train.seq_len=2K"},
                                           {"tiny", "parallel.gpus=4", "parallel.upipe_heads=4"},
                                           {"llama1b", "parallel.gpus=8", "model.layers=2"}};
    for (size_t k = 0; k < CP_ARRAY_LEN(cases); k++) {
        cp_spec s;
        cp_plan p;
        load_spec(&s, cases[k][0], 2, cases[k][1], cases[k][2]);
        build(&s, &p);
        int64_t n = cp_weights_elems(&p), C = p.C;
        assert_int_equal(p.params_shard * C, n);
        float *full = alloc_model(&p), *back = calloc((size_t)n, sizeof(float));
        for (int64_t i = 0; i < n; i++) full[i] = (float)(i % 16777216); /* values check the copies; `seen` checks the positions */
        float *sh = malloc(sizeof(float) * (size_t)p.params_shard);
        int64_t *seen = calloc((size_t)n, sizeof *seen);
        for (int r = 0; r < C; r++) {
            cp_weights_shard(&p, r, full, sh);
            for (int u = 0; u < p.nunits; u++) {
                int64_t part = p.unit_padded[u] / C, uoff = cp_weights_unit_off(&p, u);
                assert_int_equal(part * C, p.unit_padded[u]);
                for (int64_t i = 0; i < part; i++) {
                    int64_t at = uoff + r * part + i; /* the element of the full model this shard slot holds */
                    assert_true(sh[p.unit_shard_off[u] + i] == full[at]);
                    back[at] = sh[p.unit_shard_off[u] + i];
                    seen[at]++;
                }
            }
        }
        for (int64_t i = 0; i < n; i++) assert_int_equal(seen[i], 1);
        assert_memory_equal(back, full, sizeof(float) * (size_t)n);
        /* a rank's random init drawn unit by unit is that rank's shard of the whole model's */
        float *direct = malloc(sizeof(float) * (size_t)p.params_shard);
        cp_weights_init_random(&p, 9, 0.02, full);
        for (int r = 0; r < C; r += C - 1) {
            cp_weights_shard(&p, r, full, sh);
            cp_weights_init_random_shard(&p, r, 9, 0.02, direct);
            assert_memory_equal(direct, sh, sizeof(float) * (size_t)p.params_shard);
        }
        /* a rank's Hugging Face load read unit by unit is that rank's shard of the whole model's load */
        if (n < (1 << 26)) {
            char name[32], err[CP_ERR_MAX];
            snprintf(name, sizeof name, "shard_hf_%zu", k);
            char *dir = path_in(name);
            if (cp_weights_save_hf(&p, full, dir, false, 0, err, sizeof err)) fail_msg("%s", err);
            if (cp_weights_load_hf(&p, dir, back, err, sizeof err)) fail_msg("%s", err);
            for (int r = 0; r < C; r += C - 1) {
                cp_weights_shard(&p, r, back, sh);
                for (int64_t i = 0; i < p.params_shard; i++) direct[i] = NAN; /* poisoned */
                if (cp_weights_load_hf_shard(&p, dir, r, direct, err, sizeof err)) fail_msg("%s", err);
                assert_memory_equal(direct, sh, sizeof(float) * (size_t)p.params_shard);
            }
        }
        free(direct);
        free(full), free(back), free(sh), free(seen);
        cp_plan_free(&p);
    }
}

static void test_init_random(void **state) {
    (void)state;
    cp_spec s;
    cp_plan p, q;
    load_spec(&s, "tiny", 0);
    build(&s, &p);
    int64_t n = cp_weights_elems(&p);
    float *a = alloc_model(&p), *b = alloc_model(&p);
    cp_weights_init_random(&p, 42, 0.02, a);
    cp_weights_init_random(&p, 42, 0.02, b);
    assert_memory_equal(a, b, (size_t)n * sizeof *a);
    cp_weights_init_random(&p, 43, 0.02, b);
    assert_memory_not_equal(a, b, 4096);
    cp_hf_tensor t[64];
    int nt = cp_weights_hf_tensors(&p, t, 64);
    double sum = 0, sq = 0;
    int64_t cnt = 0;
    for (int k = 0; k < nt; k++) {
        int64_t e = t[k].ndim == 2 ? t[k].shape[0] * t[k].shape[1] : t[k].shape[0];
        for (int64_t i = 0; i < e; i++) {
            float v = a[t[k].off + i];
            if (t[k].norm) {
                assert_true(v == 1.0f);
            } else {
                sum += v, sq += (double)v * v, cnt++;
            }
        }
    }
    double mean = sum / (double)cnt, sd = sqrt(sq / (double)cnt - mean * mean);
    assert_true(fabs(mean) < 1e-4);
    assert_true(fabs(sd - 0.02) < 0.0005);
    /* the first elements of the embedding, from the documented formula */
    uint64_t h = cp_hash64("model.embed_tokens.weight", 25, CP_HASH_SEED);
    uint64_t key = mix(42 ^ mix(h));
    uint64_t xa = mix(key) >> 11, xb = mix(key + 0x9e3779b97f4a7c15ULL) >> 11;
    double u1 = (double)(xa + 1) * 0x1p-53, u2 = (double)xb * 0x1p-53, r = sqrt(-2 * log(u1));
    assert_true(a[0] == (float)(0.02 * r * cos(6.283185307179586476925286766559 * u2)));
    assert_true(a[1] == (float)(0.02 * r * sin(6.283185307179586476925286766559 * u2)));
    /* padding is zero: hidden 200 pads every norm (and the final norm before the LM head) to 256 */
    cp_spec s2;
    load_spec(&s2, "tiny", 3, "model.family=qwen3", "model.hidden=200", "parallel.gpus=2");
    build(&s2, &q);
    float *c = alloc_model(&q);
    cp_weights_init_random(&q, 1, 0.02, c);
    int64_t nq = cp_weights_elems(&q);
    char *covered = calloc((size_t)nq, 1);
    nt = cp_weights_hf_tensors(&q, t, 64);
    for (int k = 0; k < nt; k++)
        memset(covered + t[k].off, 1, (size_t)(t[k].ndim == 2 ? t[k].shape[0] * t[k].shape[1] : t[k].shape[0]));
    int64_t pad = 0;
    for (int64_t i = 0; i < nq; i++)
        if (!covered[i]) {
            assert_true(c[i] == 0.0f);
            pad++;
        }
    assert_true(pad >= 2 * 2 * 56 + 56);
    free(covered);
    free(c);
    cp_plan_free(&q);
    /* large tensors are drawn on all cores: the embedding of a 16384-token vocabulary (4M numbers, split across
     * threads) starts with the 4096-token one (1M numbers, drawn by one thread), row for row */
    cp_plan big, small;
    load_spec(&s2, "tiny", 1, "model.vocab=16384");
    build(&s2, &big);
    load_spec(&s2, "tiny", 1, "model.vocab=4096");
    build(&s2, &small);
    float *wb = alloc_model(&big), *ws = alloc_model(&small);
    cp_weights_init_random(&big, 5, 0.02, wb);
    cp_weights_init_random(&small, 5, 0.02, ws);
    cp_hf_tensor tb[64], ts[64];
    cp_weights_hf_tensors(&big, tb, 64);
    cp_weights_hf_tensors(&small, ts, 64);
    assert_string_equal(tb[0].name, "model.embed_tokens.weight");
    assert_memory_equal(wb + tb[0].off, ws + ts[0].off, (size_t)4096 * 256 * sizeof(float));
    free(wb), free(ws);
    cp_plan_free(&big);
    cp_plan_free(&small);
    /* the model does not depend on the GPU count or the stage size: the C = 2, U = 2 init saved and loaded into
     * the C = 1 plan is the C = 1 init */
    cp_spec s3;
    load_spec(&s3, "tiny", 2, "parallel.gpus=2", "parallel.upipe_heads=2");
    build(&s3, &q);
    float *d = alloc_model(&q);
    cp_weights_init_random(&q, 42, 0.02, d);
    char *dir = path_in("init2");
    if (cp_weights_save_hf(&q, d, dir, false, 0, err, sizeof err)) fail_msg("%s", err);
    if (cp_weights_load_hf(&p, dir, b, err, sizeof err)) fail_msg("%s", err);
    assert_memory_equal(a, b, (size_t)n * sizeof *a);
    free(d);
    cp_plan_free(&q);
    free(a), free(b);
    cp_plan_free(&p);
}

/* The tests load shipped specs by name (embedded in the binary) and write only under a fresh temporary folder. */
static int setup(void **state) {
    (void)state;
    const char *tmp = getenv("TMPDIR");
    snprintf(root, sizeof root, "%s/cpgen_st_XXXXXX", tmp && *tmp ? tmp : "/tmp");
    return mkdtemp(root) ? 0 : -1;
}
static int teardown(void **state) {
    (void)state;
    rm_rf(root);
    return 0;
}

/* ---- a file of many blocks: written by several threads (around the page cache where the filesystem allows it),
 * byte for byte what a plain serialisation gives: tensors of every source kind, conversions, and an odd-sized BF16
 * tensor first so that the F32 ones after it start at offsets 2 bytes off their alignment and the block boundaries
 * cut their elements */

static void fill_scaled(const void *ctx, int64_t first, int64_t n, float *dst) {
    const float *src = ctx;
    for (int64_t k = 0; k < n; k++) dst[k] = src[first + k] * 0.5f;
}

static void test_large_file_blocks(void **state) {
    (void)state;
    enum { ODD = 1001, BIG = 9 * 1000 * 1000, HALF = 7 * 1000 * 1000 };
    float *a = malloc(sizeof(float) * BIG), *b = malloc(sizeof(float) * HALF);
    uint16_t *raw = malloc(sizeof(uint16_t) * ODD);
    uint64_t x = 12345;
    for (int64_t i = 0; i < BIG; i++) {
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
        a[i] = (float)(int64_t)(x >> 33) * 1e-7f;
    }
    for (int64_t i = 0; i < HALF; i++) b[i] = a[(i * 7) % BIG] + 1.f;
    for (int i = 0; i < ODD; i++) raw[i] = (uint16_t)(i * 31);
    cp_st_out t[5] = {
        {.name = "odd.bf16", .dtype = CP_ST_BF16, .ndim = 1, .shape = {ODD}, .raw = raw},
        {.name = "big.f32", .dtype = CP_ST_F32, .ndim = 2, .shape = {3000, 3000}, .f32 = a},
        {.name = "big.filled", .dtype = CP_ST_F32, .ndim = 1, .shape = {HALF}, .fill = fill_scaled, .ctx = b},
        {.name = "big.as_bf16", .dtype = CP_ST_BF16, .ndim = 1, .shape = {HALF}, .f32 = b},
        {.name = "small.as_f16", .dtype = CP_ST_F16, .ndim = 1, .shape = {5}, .f32 = b + 3},
    };
    char *path = path_in("blocks.safetensors");
    if (cp_st_write_file(path, t, 5, err, sizeof err)) fail_msg("%s", err);
    /* the plain serialisation: header as the writer makes it, then each tensor's bytes in order */
    size_t n = 0;
    unsigned char *got = (unsigned char *)cp_read_file(path, &n);
    assert_non_null(got);
    uint64_t hl = 0;
    for (int k = 0; k < 8; k++) hl |= (uint64_t)got[k] << (8 * k);
    size_t at = 8 + (size_t)hl, want = at + ODD * 2 + (size_t)BIG * 4 + (size_t)HALF * 4 + (size_t)HALF * 2 + 5 * 2;
    assert_int_equal(n, want);
    assert_memory_equal(got + at, raw, ODD * 2);
    at += ODD * 2;
    assert_memory_equal(got + at, a, (size_t)BIG * 4);
    at += (size_t)BIG * 4;
    for (int64_t i = 0; i < HALF; i++) {
        float f = b[i] * 0.5f;
        if (memcmp(got + at + 4 * i, &f, 4)) fail_msg("big.filled element %lld differs", (long long)i);
    }
    at += (size_t)HALF * 4;
    for (int64_t i = 0; i < HALF; i++) {
        uint16_t h = cp_f32_to_bf16(b[i]);
        if (memcmp(got + at + 2 * i, &h, 2)) fail_msg("big.as_bf16 element %lld differs", (long long)i);
    }
    at += (size_t)HALF * 2;
    for (int i = 0; i < 5; i++) {
        uint16_t h = cp_f32_to_f16(b[3 + i]);
        assert_memory_equal(got + at + 2 * i, &h, 2);
    }
    /* and it opens: the header's offsets agree with where the bytes are */
    cp_st_set st;
    if (cp_st_open(path, &st, err, sizeof err)) fail_msg("%s", err);
    const cp_st_tensor *bt = cp_st_find(&st, "big.f32");
    assert_non_null(bt);
    float back[4];
    if (cp_st_read_f32(&st, bt, BIG - 4, 4, back, err, sizeof err)) fail_msg("%s", err);
    assert_memory_equal(back, a + BIG - 4, sizeof back);
    cp_st_close(&st);
    free(got);
    free(a);
    free(b);
    free(raw);
    unlink(path);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_json),
        cmocka_unit_test(test_conversions),
        cmocka_unit_test(test_roundtrip_single),
        cmocka_unit_test(test_roundtrip_sharded),
        cmocka_unit_test(test_large_file_blocks),
        cmocka_unit_test(test_corrupt_files),
        cmocka_unit_test(test_corrupt_index),
        cmocka_unit_test(test_fuzz),
        cmocka_unit_test(test_q_head_order),
        cmocka_unit_test(test_hf_names),
        cmocka_unit_test(test_permutation_semantics),
        cmocka_unit_test(test_save_load_roundtrip),
        cmocka_unit_test(test_load_mismatch),
        cmocka_unit_test(test_config_json),
        cmocka_unit_test(test_shards),
        cmocka_unit_test(test_init_random),
    };
    return cmocka_run_group_tests_name("safetensors", tests, setup, teardown) ? 1 : 0;
}

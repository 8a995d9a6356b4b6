/* test_sha256.c: SHA-256 against the FIPS 180-4 / NIST example vectors, fed whole and in odd-sized pieces. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "sha256.h"

static void test_known_vectors(void **state) {
    (void)state;
    char hex[CP_SHA256_HEX];
    assert_string_equal(cp_sha256_hex("", 0, hex), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    assert_string_equal(cp_sha256_hex("abc", 3, hex),
                        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    const char *two = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"; /* 448 bits: padding spills */
    assert_string_equal(cp_sha256_hex(two, strlen(two), hex),
                        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    const char *four = "abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrs"
                       "mnopqrstnopqrstu"; /* 896 bits */
    assert_string_equal(cp_sha256_hex(four, strlen(four), hex),
                        "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
}

/* A million 'a', in pieces of 1 to 97 bytes, so every carry between the buffer and whole blocks is taken. */
static void test_million_a_in_pieces(void **state) {
    (void)state;
    enum { N = 1000000 };
    char *a = malloc(N);
    assert_non_null(a);
    memset(a, 'a', N);
    cp_sha256_ctx c;
    cp_sha256_init(&c);
    size_t done = 0, piece = 1;
    while (done < N) {
        size_t n = piece < N - done ? piece : N - done;
        cp_sha256_update(&c, a + done, n);
        done += n;
        piece = piece % 97 + 1;
    }
    char hex[CP_SHA256_HEX], whole[CP_SHA256_HEX];
    assert_string_equal(cp_sha256_final_hex(&c, hex), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
    assert_string_equal(cp_sha256_hex(a, N, whole), hex);
    free(a);
}

/* Lengths around the 55/56/64-byte padding boundaries differ from each other (no length is lost in the padding). */
static void test_padding_boundaries(void **state) {
    (void)state;
    char buf[130], seen[130][CP_SHA256_HEX];
    memset(buf, 'x', sizeof buf);
    for (int n = 0; n < 130; n++) {
        cp_sha256_hex(buf, (size_t)n, seen[n]);
        for (int k = 0; k < n; k++) assert_string_not_equal(seen[k], seen[n]);
    }
    /* 55 and 56 bytes: one block, then two (sha256sum of 55 and 56 'x') */
    assert_string_equal(seen[55], "d5e285683cd4efc02d021a5c62014694958901005d6f71e89e0989fac77e4072");
    assert_string_equal(seen[56], "04c26261370ee7541549d16dee320c723e3fd14671e66a099afe0a377c16888e");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_known_vectors),
        cmocka_unit_test(test_million_a_in_pieces),
        cmocka_unit_test(test_padding_boundaries),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

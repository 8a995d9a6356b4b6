/* test_rendezvous.c: the TCP star on 127.0.0.1 with each rank a thread (the id broadcast, barrier and all-gather
 * among 4 ranks; a world of one; rank 0 never appearing, a missing rank, a wrong world size, a rank taken twice, a
 * peer that leaves, ranks in different operations, mismatched sizes, a stray connection), and the file rendezvous
 * (exchange, timeout, a stale file from another run waited out, a foreign file left alone, a missing folder).
 * Ports come from binding port 0; failure timeouts are short, success timeouts generous, so that a loaded machine
 * does not fail the test. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "tmpdir.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "launch.h"
#include "rendezvous.h"
#include "util.h"

#define OK_TIMEOUT 20.0 /* never reached when things work */

static bool contains(const char *hay, const char *needle) { return strstr(hay, needle) != NULL; }
#define assert_contains(hay, needle)                                                                                \
    do {                                                                                                           \
        if (!contains(hay, needle)) fail_msg("expected \"%s\" in: %s", needle, hay);                              \
    } while (0)

static void sleep_ms(int ms) {
    struct timespec t = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    nanosleep(&t, NULL);
}

static int free_port(void) {
    char err[512];
    int p = cp_launch_free_port(err, sizeof err);
    if (p < 0) fail_msg("%s", err);
    return p;
}

/* One rank's part in a test: what to do, and what came of it. */
typedef enum { DO_ALL, DO_OPEN, DO_OPEN_CLOSE, DO_BARRIER, DO_GATHER, DO_BCAST } job_kind;

typedef struct {
    job_kind kind;
    int rank, size, port, claim_size; /* claim_size: the world size this rank says (0: size) */
    double timeout;
    size_t bcast_len;
    int delay_ms; /* start late, as a slow rank does */
    int rc;
    char err[2048];
    unsigned char id[128];
    int64_t all[4 * 3];
    pthread_t th;
} job;

static void *run_job(void *p) {
    job *j = p;
    if (j->delay_ms) sleep_ms(j->delay_ms);
    cp_rdv_opts o = {.rank = j->rank, .size = j->claim_size ? j->claim_size : j->size, .addr = "127.0.0.1",
                     .port = j->port, .timeout_s = j->timeout};
    cp_rdv *r;
    j->rc = cp_rdv_open(&r, &o, j->err, sizeof j->err);
    if (j->rc) return NULL;
    switch (j->kind) {
    case DO_ALL: {
        if (j->rank == 0)
            for (int k = 0; k < 128; k++) j->id[k] = (unsigned char)(k * 7 + 3);
        int64_t mine[3] = {j->rank, 10 * j->rank, ((int64_t)1 << 40) + j->rank}; /* above 32 bits on purpose */
        j->rc = cp_rdv_bcast(r, j->id, sizeof j->id, j->err, sizeof j->err);
        if (!j->rc) j->rc = cp_rdv_barrier(r, j->err, sizeof j->err);
        if (!j->rc) j->rc = cp_rdv_allgather(r, mine, 3, j->all, j->err, sizeof j->err);
        if (!j->rc) j->rc = cp_rdv_barrier(r, j->err, sizeof j->err);
        break;
    }
    case DO_BARRIER: j->rc = cp_rdv_barrier(r, j->err, sizeof j->err); break;
    case DO_GATHER: {
        int64_t v = 1;
        j->rc = cp_rdv_allgather(r, &v, 1, j->all, j->err, sizeof j->err);
        break;
    }
    case DO_BCAST: j->rc = cp_rdv_bcast(r, j->id, j->bcast_len, j->err, sizeof j->err); break;
    default: break;
    }
    if (j->kind == DO_OPEN) sleep_ms(300); /* stay connected while rank 0 waits for the others */
    cp_rdv_close(r);
    return NULL;
}

static void start(job *j) { assert_int_equal(pthread_create(&j->th, NULL, run_job, j), 0); }
static void finish(job *j) { assert_int_equal(pthread_join(j->th, NULL), 0); }

static void test_four_ranks(void **state) {
    (void)state;
    int port = free_port();
    job j[4];
    memset(j, 0, sizeof j);
    /* Started in reverse, rank 0 last and late: the others must retry until it listens. */
    for (int r = 3; r >= 0; r--) {
        j[r] = (job){.kind = DO_ALL, .rank = r, .size = 4, .port = port, .timeout = OK_TIMEOUT,
                     .delay_ms = r == 0 ? 150 : 0};
        start(&j[r]);
    }
    for (int r = 0; r < 4; r++) finish(&j[r]);
    for (int r = 0; r < 4; r++) {
        if (j[r].rc) fail_msg("rank %d: %s", r, j[r].err);
        for (int k = 0; k < 128; k++) assert_int_equal(j[r].id[k], (unsigned char)(k * 7 + 3));
        for (int p = 0; p < 4; p++) {
            assert_int_equal(j[r].all[3 * p], p);
            assert_int_equal(j[r].all[3 * p + 1], 10 * p);
            assert_int_equal(j[r].all[3 * p + 2], ((int64_t)1 << 40) + p);
        }
    }
}

static void test_world_of_one(void **state) {
    (void)state;
    cp_rdv *r;
    char err[512];
    cp_rdv_opts o = {.rank = 0, .size = 1};
    assert_int_equal(cp_rdv_open(&r, &o, err, sizeof err), 0);
    unsigned char id[16] = {1, 2, 3};
    int64_t v = 42, all = 0;
    assert_int_equal(cp_rdv_bcast(r, id, sizeof id, err, sizeof err), 0);
    assert_int_equal(cp_rdv_barrier(r, err, sizeof err), 0);
    assert_int_equal(cp_rdv_allgather(r, &v, 1, &all, err, sizeof err), 0);
    assert_int_equal(all, 42);
    assert_int_equal(id[2], 3);
    cp_rdv_close(r);
}

static void test_bad_options(void **state) {
    (void)state;
    cp_rdv *r;
    char err[512];
    cp_rdv_opts o = {.rank = 2, .size = 2};
    assert_int_equal(cp_rdv_open(&r, &o, err, sizeof err), -1);
    assert_contains(err, "rank 2 of 2 is not a valid rank");
    o = (cp_rdv_opts){.rank = 1, .size = 2, .addr = "127.0.0.1", .port = 0};
    assert_int_equal(cp_rdv_open(&r, &o, err, sizeof err), -1);
    assert_contains(err, "set MASTER_ADDR and MASTER_PORT");
    assert_int_equal(cp_rdv_barrier(NULL, err, sizeof err), -1);
    assert_contains(err, "not open");
}

static void test_root_never_appears(void **state) {
    (void)state;
    job j = {.kind = DO_ALL, .rank = 1, .size = 2, .port = free_port(), .timeout = 0.4};
    double t0 = cp_now();
    start(&j);
    finish(&j);
    assert_int_equal(j.rc, -1);
    char want[128];
    snprintf(want, sizeof want, "rank 1: could not reach rank 0 at 127.0.0.1:%d (MASTER_ADDR:MASTER_PORT) within 0.4 s",
             j.port);
    assert_contains(j.err, want);
    assert_contains(j.err, "Connection refused");
    assert_true(cp_now() - t0 < 3.0);
}

static void test_missing_rank(void **state) {
    (void)state;
    int port = free_port();
    job j0 = {.kind = DO_ALL, .rank = 0, .size = 3, .port = port, .timeout = 0.5};
    job j1 = {.kind = DO_OPEN, .rank = 1, .size = 3, .port = port, .timeout = 0.5};
    start(&j0), start(&j1);
    finish(&j0), finish(&j1);
    assert_int_equal(j0.rc, -1);
    char want[128];
    snprintf(want, sizeof want, "rank 0: only 2 of 3 ranks reached 127.0.0.1:%d within 0.5 s; missing rank 2:", port);
    assert_contains(j0.err, want);
    assert_int_equal(j1.rc, -1);
    assert_contains(j1.err, "rank 1: ");
}

static void test_wrong_size(void **state) {
    (void)state;
    int port = free_port();
    job j0 = {.kind = DO_ALL, .rank = 0, .size = 2, .port = port, .timeout = OK_TIMEOUT};
    job j1 = {.kind = DO_ALL, .rank = 1, .size = 2, .claim_size = 3, .port = port, .timeout = OK_TIMEOUT};
    start(&j0), start(&j1);
    finish(&j0), finish(&j1);
    assert_int_equal(j0.rc, -1);
    assert_contains(j0.err, "says it is rank 1 of 3, but rank 0 was told the run has 2 ranks");
    assert_int_equal(j1.rc, -1);
    assert_contains(j1.err, "rank 1: rank 0 (127.0.0.1:");
    assert_contains(j1.err, "refused this rank: the process at 127.0.0.1:");
}

static void test_rank_twice(void **state) {
    (void)state;
    int port = free_port();
    job j0 = {.kind = DO_ALL, .rank = 0, .size = 3, .port = port, .timeout = OK_TIMEOUT};
    job a = {.kind = DO_ALL, .rank = 1, .size = 3, .port = port, .timeout = OK_TIMEOUT};
    job b = {.kind = DO_ALL, .rank = 1, .size = 3, .port = port, .timeout = OK_TIMEOUT, .delay_ms = 100};
    start(&j0), start(&a), start(&b);
    finish(&j0), finish(&a), finish(&b);
    assert_int_equal(j0.rc, -1);
    assert_contains(j0.err, "two processes say they are rank 1: rank 1 (127.0.0.1:");
    assert_int_equal(a.rc, -1);
    assert_int_equal(b.rc, -1);
}

static void test_peer_leaves(void **state) {
    (void)state;
    int port = free_port();
    job j0 = {.kind = DO_BARRIER, .rank = 0, .size = 2, .port = port, .timeout = OK_TIMEOUT};
    job j1 = {.kind = DO_OPEN_CLOSE, .rank = 1, .size = 2, .port = port, .timeout = OK_TIMEOUT};
    double t0 = cp_now();
    start(&j0), start(&j1);
    finish(&j0), finish(&j1);
    assert_int_equal(j1.rc, 0);
    assert_int_equal(j0.rc, -1);
    assert_contains(j0.err, "rank 0: rank 1 (127.0.0.1:");
    assert_contains(j0.err, "closed the connection during the barrier: it exited or failed");
    assert_true(cp_now() - t0 < 5.0); /* noticed at once, not at the timeout */
}

static void test_different_operations(void **state) {
    (void)state;
    int port = free_port();
    job j0 = {.kind = DO_BARRIER, .rank = 0, .size = 2, .port = port, .timeout = OK_TIMEOUT};
    job j1 = {.kind = DO_GATHER, .rank = 1, .size = 2, .port = port, .timeout = 1.0};
    start(&j0), start(&j1);
    finish(&j0), finish(&j1);
    assert_int_equal(j0.rc, -1);
    assert_contains(j0.err, "sent its all-gather while this rank was in the barrier");
    assert_int_equal(j1.rc, -1);
}

static void test_bcast_sizes_differ(void **state) {
    (void)state;
    int port = free_port();
    job j0 = {.kind = DO_BCAST, .rank = 0, .size = 2, .port = port, .timeout = OK_TIMEOUT, .bcast_len = 128};
    job j1 = {.kind = DO_BCAST, .rank = 1, .size = 2, .port = port, .timeout = OK_TIMEOUT, .bcast_len = 64};
    start(&j0), start(&j1);
    finish(&j0), finish(&j1);
    assert_int_equal(j1.rc, -1);
    assert_contains(j1.err, "rank 1: rank 0 (127.0.0.1:");
    assert_contains(j1.err, "sent 128 bytes for the broadcast, this rank expects 64");
}

static void test_stray_connection(void **state) {
    (void)state;
    int port = free_port();
    job j0 = {.kind = DO_ALL, .rank = 0, .size = 2, .port = port, .timeout = OK_TIMEOUT};
    job j1 = {.kind = DO_ALL, .rank = 1, .size = 2, .port = port, .timeout = OK_TIMEOUT, .delay_ms = 200};
    start(&j0);
    /* Something that is not a rank (a health check) connects first, says something else, and goes. */
    int fd = -1;
    for (int k = 0; k < 200 && fd < 0; k++) {
        fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                                 .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
            close(fd);
            fd = -1;
            sleep_ms(10);
        }
    }
    assert_true(fd >= 0);
    const char probe[] = "GET / HTTP/1.0\r\nHost: x\r\n\r\n";
    assert_int_equal(send(fd, probe, sizeof probe - 1, MSG_NOSIGNAL), (ssize_t)(sizeof probe - 1));
    start(&j1);
    finish(&j0), finish(&j1);
    close(fd);
    if (j0.rc) fail_msg("rank 0: %s", j0.err);
    if (j1.rc) fail_msg("rank 1: %s", j1.err);
}

static void test_port_in_use(void **state) {
    (void)state;
    /* A listener on the port already: rank 0 cannot take it. */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = 0, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof sa;
    assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    assert_int_equal(listen(fd, 1), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&sa, &len), 0);
    job j0 = {.kind = DO_ALL, .rank = 0, .size = 2, .port = ntohs(sa.sin_port), .timeout = 0.5};
    start(&j0);
    finish(&j0);
    close(fd);
    assert_int_equal(j0.rc, -1);
    char want[128];
    snprintf(want, sizeof want, "rank 0: cannot listen on port %d (MASTER_PORT): it is in use", j0.port);
    assert_contains(j0.err, want);
}

/* ------------------------------------------------------------------------------------------------------------
 * file rendezvous */

static char dir[256];

static int file_setup(void **state) {
    (void)state;
    return tmpdir_make(dir, sizeof dir, "rdv");
}
static int file_teardown(void **state) {
    (void)state;
    tmpdir_remove(dir);
    return 0;
}

typedef struct {
    char path[300];
    const char *job;
    int rank, size, delay_ms;
    size_t n;
    double timeout;
    unsigned char blob[128];
    int rc;
    char err[2048];
    pthread_t th;
} fjob;

static void *run_fjob(void *p) {
    fjob *j = p;
    if (j->delay_ms) sleep_ms(j->delay_ms);
    j->rc = cp_rdv_file_exchange(j->path, j->job, j->rank, j->size, j->blob, j->n, j->timeout, j->err, sizeof j->err);
    return NULL;
}

static void test_file_exchange(void **state) {
    (void)state;
    fjob j[3];
    for (int r = 0; r < 3; r++) {
        j[r] = (fjob){.job = "slurm-77.0", .rank = r, .size = 3, .n = 128, .timeout = OK_TIMEOUT,
                      .delay_ms = r == 0 ? 150 : 0};
        snprintf(j[r].path, sizeof j[r].path, "%s/id", dir);
        if (r == 0)
            for (int k = 0; k < 128; k++) j[r].blob[k] = (unsigned char)(255 - k);
        assert_int_equal(pthread_create(&j[r].th, NULL, run_fjob, &j[r]), 0);
    }
    for (int r = 0; r < 3; r++) pthread_join(j[r].th, NULL);
    for (int r = 0; r < 3; r++) {
        if (j[r].rc) fail_msg("rank %d: %s", r, j[r].err);
        for (int k = 0; k < 128; k++) assert_int_equal(j[r].blob[k], (unsigned char)(255 - k));
    }
    /* The file is readable text that says what it is. */
    char *text = cp_read_file(j[0].path, NULL);
    assert_non_null(text);
    assert_contains(text, "cpgen-rendezvous 1\njob slurm-77.0\nsize 3\nbytes 128\ndata fffefd");
    free(text);
}

static void test_file_timeout(void **state) {
    (void)state;
    fjob j = {.job = "", .rank = 1, .size = 2, .n = 128, .timeout = 0.3};
    snprintf(j.path, sizeof j.path, "%s/never", dir);
    run_fjob(&j);
    assert_int_equal(j.rc, -1);
    char want[400];
    snprintf(want, sizeof want, "rank 1: no rendezvous file at %s after 0.3 s: rank 0 did not write it", j.path);
    assert_contains(j.err, want);
}

static void test_file_stale(void **state) {
    (void)state;
    char path[300];
    snprintf(path, sizeof path, "%s/id", dir);
    /* An earlier run's file. */
    unsigned char old[128] = {9};
    char err[1024];
    assert_int_equal(cp_rdv_file_exchange(path, "run-1", 0, 2, old, sizeof old, 1, err, sizeof err), 0);
    fjob j = {.job = "run-2", .rank = 1, .size = 2, .n = 128, .timeout = 0.3};
    snprintf(j.path, sizeof j.path, "%s", path);
    run_fjob(&j);
    assert_int_equal(j.rc, -1);
    assert_contains(j.err, "is from another run (job run-1, 2 ranks; this run is job run-2 with 2 ranks)");
    /* This run's rank 0 replaces it while rank 1 waits. */
    fjob r0 = {.job = "run-2", .rank = 0, .size = 2, .n = 128, .timeout = OK_TIMEOUT, .delay_ms = 150};
    snprintf(r0.path, sizeof r0.path, "%s", path);
    r0.blob[0] = 42;
    j.timeout = OK_TIMEOUT;
    assert_int_equal(pthread_create(&r0.th, NULL, run_fjob, &r0), 0);
    assert_int_equal(pthread_create(&j.th, NULL, run_fjob, &j), 0);
    pthread_join(r0.th, NULL), pthread_join(j.th, NULL);
    if (r0.rc || j.rc) fail_msg("%s / %s", r0.err, j.err);
    assert_int_equal(j.blob[0], 42);
}

static void test_file_foreign_and_missing(void **state) {
    (void)state;
    char path[300], err[1024];
    snprintf(path, sizeof path, "%s/notes.txt", dir);
    assert_int_equal(cp_write_file_atomic(path, "my notes\n", 9), 0);
    unsigned char blob[128] = {0};
    assert_int_equal(cp_rdv_file_exchange(path, "", 0, 2, blob, sizeof blob, 1, err, sizeof err), -1);
    assert_contains(err, "exists and is not a cpgen rendezvous file: not replacing it");
    assert_int_equal(cp_rdv_file_exchange(path, "", 1, 2, blob, sizeof blob, 1, err, sizeof err), -1);
    assert_contains(err, "is not a cpgen rendezvous file: check the path");
    char *text = cp_read_file(path, NULL);
    assert_string_equal(text, "my notes\n");
    free(text);
    snprintf(path, sizeof path, "%s/no/such/folder/id", dir);
    assert_int_equal(cp_rdv_file_exchange(path, "", 0, 2, blob, sizeof blob, 1, err, sizeof err), -1);
    assert_contains(err, "cannot write the rendezvous file");
    assert_contains(err, "No such file or directory");
    /* A different blob size means a different build. */
    snprintf(path, sizeof path, "%s/id16", dir);
    assert_int_equal(cp_rdv_file_exchange(path, "j", 0, 2, blob, 16, 1, err, sizeof err), 0);
    assert_int_equal(cp_rdv_file_exchange(path, "j", 1, 2, blob, 32, 1, err, sizeof err), -1);
    assert_contains(err, "holds 16 bytes, this rank expects 32");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_four_ranks),
        cmocka_unit_test(test_world_of_one),
        cmocka_unit_test(test_bad_options),
        cmocka_unit_test(test_root_never_appears),
        cmocka_unit_test(test_missing_rank),
        cmocka_unit_test(test_wrong_size),
        cmocka_unit_test(test_rank_twice),
        cmocka_unit_test(test_peer_leaves),
        cmocka_unit_test(test_different_operations),
        cmocka_unit_test(test_bcast_sizes_differ),
        cmocka_unit_test(test_stray_connection),
        cmocka_unit_test(test_port_in_use),
        cmocka_unit_test_setup_teardown(test_file_exchange, file_setup, file_teardown),
        cmocka_unit_test_setup_teardown(test_file_timeout, file_setup, file_teardown),
        cmocka_unit_test_setup_teardown(test_file_stale, file_setup, file_teardown),
        cmocka_unit_test_setup_teardown(test_file_foreign_and_missing, file_setup, file_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

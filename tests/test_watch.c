/* test_watch.c: the run's news line (cp_world_watch over the TCP rendezvous), with each rank a process as in a real
 * run. A rank killed with SIGKILL, a rank that fails with a message, rank 0 killed, and ranks that leave normally:
 * every other rank hears of the first three at once, by rank; one waiting on NCCL (a fake whose collective never
 * finishes and never reports an error, as NCCL over sockets did when its peer stopped) stops with a message naming
 * the rank, and one stuck in a call no deadline reaches is ended after its grace, also naming it. Nobody hears
 * anything when every rank leaves normally. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "tmpdir.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "launch.h"
#include "nccl_rt.h"
#include "rendezvous.h"
#include "spec.h"
#include "util.h"
#include "world.h"

enum { RANKS = 4 };
#define GRACE_S 1.0 /* a stuck rank's grace after the news */

static char dir[128];

/* What each rank does once the watch runs. */
typedef enum {
    WAIT_NCCL,   /* waits on a collective that never ends: the news must stop the wait */
    STUCK,       /* sleeps in a call nothing interrupts: the grace must end the process */
    DIE,         /* killed by SIGKILL after a moment */
    FAIL,        /* fails with a message, tells the others, exits 1 */
    LEAVE,       /* leaves normally after a moment (rank-dependent), then exits 0 */
} role;

/* The fake collective: never done, and NCCL never reports an error for it. */
static int never_done(void *ctx, char *err, int errlen) { return (void)ctx, (void)err, (void)errlen, 0; }
static ncclResult_t f_async(ncclComm_t c, ncclResult_t *st) { return (void)c, *st = ncclSuccess, ncclSuccess; }
static ncclResult_t f_abort(ncclComm_t c) { return (void)c, ncclSuccess; }

static void sleep_s(double s) {
    struct timespec t = {.tv_sec = (time_t)s, .tv_nsec = (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&t, NULL);
}

static int child(int rank, int port, role what) {
    char err[CP_ERR_MAX];
    cp_rdv_opts o = {.rank = rank, .size = RANKS, .addr = "127.0.0.1", .port = port, .timeout_s = 20};
    cp_rdv *r;
    if (cp_rdv_open(&r, &o, err, sizeof err)) {
        fprintf(stderr, "open: %s\n", err);
        return 90;
    }
    cp_world w;
    memset(&w, 0, sizeof w);
    w.rank = rank;
    w.size = RANKS;
    w.stop_grace_s = GRACE_S;
    if (cp_world_watch(&w, r, err, sizeof err)) {
        fprintf(stderr, "watch: %s\n", err);
        return 91;
    }
    switch (what) {
    case WAIT_NCCL: {
        static cp_nccl_api fake = {.CommGetAsyncError = f_async, .CommAbort = f_abort};
        cp_nccl_use_api(&fake, 22809);
        cp_nccl_comm c = {.comm = (ncclComm_t)(uintptr_t)0x1000, .rank = rank, .size = RANKS, .timeout_s = 60};
        if (cp_nccl_wait_for(&c, never_done, NULL, "the step's all-to-all", 60, err, sizeof err) == 0) return 92;
        fprintf(stderr, "cpgen: %s\n", err);
        cp_world_fail(&w, err);
        return 1;
    }
    case STUCK: sleep_s(60); return 93;
    case DIE: sleep_s(0.3); raise(SIGKILL); return 94;
    case FAIL:
        sleep_s(0.3);
        snprintf(err, sizeof err, "rank %d: reading the master weights: cudaErrorInvalidValue", rank);
        fprintf(stderr, "cpgen: %s\n", err);
        cp_world_fail(&w, err);
        return 1;
    case LEAVE:
        sleep_s(0.1 * rank);
        cp_world_leave(&w);
        sleep_s(0.5); /* news that should not come would come now */
        return cp_nccl_stop_reason() ? 95 : 0;
    }
    return 96;
}

typedef struct {
    int status;    /* waitpid's */
    double exited; /* seconds after the start */
    char *log;     /* its stderr */
} outcome;

/* Run RANKS processes with these roles; wait at most 20 s for them all. */
static void run_ranks(const role roles[RANKS], outcome out[RANKS]) {
    char err[512];
    int port = cp_launch_free_port(err, sizeof err);
    if (port < 0) fail_msg("%s", err);
    pid_t pid[RANKS];
    char path[RANKS][256];
    double t0 = cp_now();
    fflush(NULL);
    for (int r = 0; r < RANKS; r++) {
        snprintf(path[r], sizeof path[r], "%s/rank%d.log", dir, r);
        pid[r] = fork();
        if (pid[r] == 0) {
            if (!freopen(path[r], "w", stderr)) _exit(97);
            setvbuf(stderr, NULL, _IONBF, 0); /* a rank may end in _exit */
            cp_nccl_stop_all(NULL);
            _exit(child(r, port, roles[r]));
        }
        assert_true(pid[r] > 0);
    }
    int left = RANKS;
    bool done[RANKS] = {0};
    while (left > 0 && cp_now() - t0 < 20) {
        for (int r = 0; r < RANKS; r++)
            if (!done[r] && waitpid(pid[r], &out[r].status, WNOHANG) == pid[r]) {
                done[r] = true;
                out[r].exited = cp_now() - t0;
                left--;
            }
        sleep_s(0.01);
    }
    for (int r = 0; r < RANKS; r++) {
        if (!done[r]) {
            kill(pid[r], SIGKILL);
            waitpid(pid[r], &out[r].status, 0);
            out[r].exited = 1e9;
        }
        size_t n;
        out[r].log = cp_read_file(path[r], &n);
        if (!out[r].log) out[r].log = cp_xstrdup("");
        printf("  rank %d: status 0x%x after %.2f s: %s", r, out[r].status, out[r].exited, out[r].log);
    }
}

static void free_outcomes(outcome out[RANKS]) {
    for (int r = 0; r < RANKS; r++) free(out[r].log);
}

static void assert_exit(const outcome *o, int code) {
    if (!WIFEXITED(o->status) || WEXITSTATUS(o->status) != code)
        fail_msg("status 0x%x, expected exit code %d: %s", o->status, code, o->log);
}

static void assert_said(const outcome *o, const char *needle) {
    if (!strstr(o->log, needle)) fail_msg("expected \"%s\" in: %s", needle, o->log);
}

/* Rank 2 is killed: rank 1, waiting on NCCL, stops at once naming it; ranks 0 and 3, stuck, exit after the grace,
 * naming it; all within a few seconds, not at the collective's 60 s deadline. */
static void test_killed_rank(void **state) {
    (void)state;
    role roles[RANKS] = {STUCK, WAIT_NCCL, DIE, STUCK};
    outcome out[RANKS];
    run_ranks(roles, out);
    assert_true(WIFSIGNALED(out[2].status) && WTERMSIG(out[2].status) == SIGKILL);
    for (int r = 0; r < RANKS; r++) {
        if (r == 2) continue;
        assert_exit(&out[r], 1);
        assert_said(&out[r], "rank 2 is gone: its connection to rank 0 closed without a word");
        assert_true(out[r].exited < 0.3 + GRACE_S + 5);
    }
    assert_said(&out[1], "rank 1: stopped waiting for the step's all-to-all: rank 2 is gone");
    assert_true(out[1].exited < out[0].exited); /* stopped by the news, not by the grace */
    assert_said(&out[0], "this rank did not stop by itself within 1 s of hearing it");
    free_outcomes(out);
}

/* Rank 1 fails with a message: the others stop with its message. */
static void test_failed_rank(void **state) {
    (void)state;
    role roles[RANKS] = {WAIT_NCCL, FAIL, STUCK, WAIT_NCCL};
    outcome out[RANKS];
    run_ranks(roles, out);
    for (int r = 0; r < RANKS; r++) {
        assert_exit(&out[r], 1);
        if (r != 1) assert_said(&out[r], "rank 1 failed: rank 1: reading the master weights: cudaErrorInvalidValue");
    }
    assert_said(&out[3], "rank 3: stopped waiting for the step's all-to-all: rank 1 failed:");
    free_outcomes(out);
}

/* Rank 0, the centre of the star, is killed: the others see it directly. */
static void test_rank0_killed(void **state) {
    (void)state;
    role roles[RANKS] = {DIE, WAIT_NCCL, STUCK, WAIT_NCCL};
    outcome out[RANKS];
    run_ranks(roles, out);
    for (int r = 1; r < RANKS; r++) {
        assert_exit(&out[r], 1);
        assert_said(&out[r], "rank 0 is gone: its connection to this rank closed without a word");
    }
    free_outcomes(out);
}

/* Ranks leaving one after another, rank 0 first: no news. */
static void test_normal_leave(void **state) {
    (void)state;
    role roles[RANKS] = {LEAVE, LEAVE, LEAVE, LEAVE};
    outcome out[RANKS];
    run_ranks(roles, out);
    for (int r = 0; r < RANKS; r++) assert_exit(&out[r], 0);
    free_outcomes(out);
}

static int setup(void **state) {
    (void)state;
    return tmpdir_make(dir, sizeof dir, "watch");
}

static int teardown(void **state) {
    (void)state;
    tmpdir_remove(dir);
    return 0;
}

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_killed_rank),
        cmocka_unit_test(test_failed_rank),
        cmocka_unit_test(test_rank0_killed),
        cmocka_unit_test(test_normal_leave),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

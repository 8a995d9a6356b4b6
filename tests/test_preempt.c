/* test_preempt.c: preemption without a GPU (runtime/stop.c, runtime/launch.c). Ranks run as processes, started by
 * cp_launch_spawn as `cpgen run` starts them (this binary with --child), meeting over the TCP rendezvous; each runs
 * "steps" with the stop handlers installed (cp_stop_install) and, at the end of every step, combines every rank's
 * stop flag with a maximum over the rendezvous's all-gather, standing in for the step-end all-reduce the executor
 * carries the flag in (runtime/exec_run.c, spread_memory), which needs a GPU:
 *   - SIGTERM to one rank alone: every rank stops after the same step and exits with CP_EXIT_STOPPED, and the
 *     parent returns CP_EXIT_STOPPED;
 *   - SIGTERM or SIGUSR1 to the parent: passed on to every rank, and the parent waits for their orderly stop even
 *     when it takes longer than the grace a failing rank's peers get (they are not killed);
 *   - a second SIGINT to the parent kills the ranks at once;
 *   - in one process: the first SIGTERM, SIGUSR1 or SIGINT sets the flag to its number, later ones leave it, and a
 *     second SIGINT ends the process by SIGINT. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "launch.h"
#include "rendezvous.h"
#include "stop.h"
#include "tmpdir.h"
#include "util.h"

enum { RANKS = 3 };

static char err[2048];
static char dir[128];

static void sleep_ms(int ms) {
    struct timespec t = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    while (nanosleep(&t, &t) != 0 && errno == EINTR) {}
}

static void put(const char *name, const char *text) {
    char path[512], tmp[520];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) _exit(90);
    fputs(text, f);
    fclose(f);
    rename(tmp, path);
}

static char *get(const char *fmt, int rank) {
    char name[64], path[512];
    snprintf(name, sizeof name, fmt, rank);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return cp_read_file(path, NULL);
}

/* ------------------------------------------------------------------------------------------------------------
 * a rank: `test_preempt --child STOP_MS` (STOP_MS: how long its orderly stop takes: the save and its write) */

static int child_main(int argc, char **argv) {
    snprintf(dir, sizeof dir, "%s", getenv("CPGEN_TEST_OUT") ? getenv("CPGEN_TEST_OUT") : ".");
    int stop_ms = argc > 2 ? atoi(argv[2]) : 0;
    cp_launch_env e;
    if (cp_launch_detect(&e, err, sizeof err)) {
        fprintf(stderr, "detect: %s\n", err);
        return 91;
    }
    cp_stop_install(e.rank);
    cp_rdv_opts o = {.rank = e.rank, .size = e.size, .addr = e.master_addr, .port = e.master_port, .timeout_s = 20};
    cp_rdv *r;
    if (cp_rdv_open(&r, &o, err, sizeof err)) {
        fprintf(stderr, "rendezvous: %s\n", err);
        return 92;
    }
    char name[64], text[128];
    snprintf(name, sizeof name, "pid%d", e.rank);
    snprintf(text, sizeof text, "%d", (int)getpid());
    put(name, text);
    for (int step = 1; step <= 100000; step++) {
        sleep_ms(20 + 7 * e.rank); /* a step; the ranks' lengths differ, as their signals' arrival does */
        /* the step's end: every rank's flag, the largest taken (the executor's all-reduce with max) */
        int64_t mine = *cp_stop_flag(), all[64];
        if (cp_rdv_allgather(r, &mine, 1, all, err, sizeof err)) {
            fprintf(stderr, "allgather: %s\n", err);
            return 93;
        }
        int64_t stop = 0;
        for (int k = 0; k < e.size; k++) stop = CP_MAX(stop, all[k]);
        snprintf(name, sizeof name, "step%d", e.rank);
        snprintf(text, sizeof text, "%d", step);
        put(name, text);
        if (stop) {
            sleep_ms(stop_ms); /* the checkpoint and its write */
            snprintf(name, sizeof name, "stopped%d", e.rank);
            snprintf(text, sizeof text, "%d %lld %lld", step, (long long)stop, (long long)mine);
            put(name, text);
            cp_rdv_close(r);
            return CP_EXIT_STOPPED;
        }
    }
    return 94;
}

/* ------------------------------------------------------------------------------------------------------------ */

static int setup(void **state) {
    (void)state;
    if (tmpdir_make(dir, sizeof dir, "preempt")) return -1;
    setenv("CPGEN_TEST_OUT", dir, 1);
    static const char *const launchers[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                                            "MASTER_PORT", "CPGEN_SPAWNED", "OMPI_COMM_WORLD_RANK",
                                            "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE", "SLURM_PROCID",
                                            "SLURM_NTASKS", "SLURM_STEP_ID", "CPGEN_RENDEZVOUS_FILE"};
    for (size_t k = 0; k < sizeof launchers / sizeof *launchers; k++) unsetenv(launchers[k]);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    tmpdir_remove(dir);
    return 0;
}

static void clear_files(void) {
    tmpdir_remove(dir);
    cp_mkdir_p(dir);
}

/* The parent (cp_launch_spawn) in a process of its own, so that the test can signal it: its return value and
 * message come back through a pipe. */
typedef struct {
    pid_t pid;
    int fd;
} parent;

static parent start_parent(const char *stop_ms, double grace) {
    int pfd[2];
    assert_int_equal(pipe(pfd), 0);
    fflush(stdout);
    pid_t p = fork();
    assert_true(p >= 0);
    if (p == 0) {
        close(pfd[0]);
        char *argv[] = {"test_preempt", "--child", (char *)stop_ms, NULL};
        cp_spawn_opts o = {.grace_s = grace};
        int rc = cp_launch_spawn(RANKS, argv, &o, err, sizeof err);
        char msg[2100];
        int n = snprintf(msg, sizeof msg, "%d %s", rc, err);
        ssize_t w = write(pfd[1], msg, (size_t)n);
        (void)w;
        _exit(0);
    }
    close(pfd[1]);
    return (parent){p, pfd[0]};
}

/* Wait for the parent; its return value, its message into msg. */
static int end_parent(parent p, char *msg, size_t n, double limit_s) {
    double t0 = cp_now();
    int st;
    pid_t w;
    while ((w = waitpid(p.pid, &st, WNOHANG)) == 0 && cp_now() - t0 < limit_s) sleep_ms(10);
    if (w == 0) {
        kill(p.pid, SIGKILL);
        waitpid(p.pid, &st, 0);
        fail_msg("the parent did not return within %.0f s", limit_s);
    }
    ssize_t k = read(p.fd, msg, n - 1);
    close(p.fd);
    msg[k > 0 ? k : 0] = 0;
    return atoi(msg);
}

static pid_t rank_pid(int r) {
    double t0 = cp_now();
    char *t;
    while (!(t = get("pid%d", r)) && cp_now() - t0 < 10) sleep_ms(10);
    if (!t) fail_msg("rank %d did not start", r);
    pid_t p = (pid_t)atoi(t);
    free(t);
    return p;
}

/* Wait until every rank has done `steps` steps. */
static void wait_steps(int steps) {
    double t0 = cp_now();
    for (int r = 0; r < RANKS; r++) {
        char *t;
        while ((!(t = get("step%d", r)) || atoi(t) < steps) && cp_now() - t0 < 10) {
            free(t);
            sleep_ms(5);
        }
        if (!t) fail_msg("rank %d made no steps", r);
        free(t);
    }
}

/* Every rank stopped after the same step, for signal sig; returns that step. */
static int same_stop(int sig, int asked) {
    int step0 = -1;
    for (int r = 0; r < RANKS; r++) {
        char *t = get("stopped%d", r);
        if (!t) fail_msg("rank %d did not stop in order", r);
        int step;
        long long got, mine;
        assert_int_equal(sscanf(t, "%d %lld %lld", &step, &got, &mine), 3);
        printf("    rank %d: stopped after step %d (stop %lld, its own flag %lld)\n", r, step, got, mine);
        assert_int_equal(got, sig);
        if (asked >= 0) assert_int_equal(mine, r == asked ? sig : 0); /* only the rank signalled asked */
        if (step0 < 0) step0 = step;
        assert_int_equal(step, step0);
        free(t);
    }
    return step0;
}

static void test_one_rank_signalled(void **state) {
    (void)state;
    clear_files();
    parent p = start_parent("0", 1.0);
    pid_t victim = rank_pid(1);
    for (int r = 0; r < RANKS; r++) (void)rank_pid(r);
    wait_steps(3);
    assert_int_equal(kill(victim, SIGTERM), 0);
    char msg[2100];
    int rc = end_parent(p, msg, sizeof msg, 20);
    printf("    parent: %s\n", msg);
    assert_int_equal(rc, CP_EXIT_STOPPED);
    assert_non_null(strstr(msg, "a stop signal reached a rank: 3 of 3 ranks stopped in order (exit 75)"));
    assert_true(same_stop(SIGTERM, 1) >= 3);
}

static void test_parent_forwards_and_waits(void **state) {
    (void)state;
    const int sigs[2] = {SIGTERM, SIGUSR1};
    for (int k = 0; k < 2; k++) {
        clear_files();
        /* each rank takes 1.5 s to stop, three times the grace a failing rank's peers get: none may be killed */
        parent p = start_parent("1500", 0.5);
        for (int r = 0; r < RANKS; r++) (void)rank_pid(r);
        wait_steps(2);
        double t0 = cp_now();
        assert_int_equal(kill(p.pid, sigs[k]), 0);
        char msg[2100];
        int rc = end_parent(p, msg, sizeof msg, 20);
        printf("    parent after %.1f s: %s\n", cp_now() - t0, msg);
        assert_int_equal(rc, CP_EXIT_STOPPED);
        char want[128];
        snprintf(want, sizeof want, "stopped by SIG%s (signal %d), passed on to every rank: 3 of 3 ranks stopped in "
                 "order (exit 75)", k ? "USR1" : "TERM", sigs[k]);
        assert_non_null(strstr(msg, want));
        assert_true(cp_now() - t0 >= 1.4);
        same_stop(sigs[k], -1);
    }
}

static void test_second_sigint_aborts(void **state) {
    (void)state;
    clear_files();
    parent p = start_parent("60000", 0.5); /* an orderly stop that would take a minute */
    pid_t kids[RANKS];
    for (int r = 0; r < RANKS; r++) kids[r] = rank_pid(r);
    wait_steps(2);
    double t0 = cp_now();
    assert_int_equal(kill(p.pid, SIGINT), 0);
    sleep_ms(300);
    assert_int_equal(kill(p.pid, SIGINT), 0);
    char msg[2100];
    int rc = end_parent(p, msg, sizeof msg, 20);
    printf("    parent after %.1f s: %s\n", cp_now() - t0, msg);
    assert_int_equal(rc, -1);
    assert_non_null(strstr(msg, "stopped by SIGINT (signal 2), passed on to every rank"));
    assert_non_null(strstr(msg, "a second SIGINT: 3 ranks killed with SIGKILL"));
    assert_true(cp_now() - t0 < 10);
    for (int r = 0; r < RANKS; r++) {
        assert_int_equal(kill(kids[r], 0), -1); /* gone */
        assert_null(get("stopped%d", r));
    }
}

/* The handlers in one process, as a rank has them. */
static void test_handlers(void **state) {
    (void)state;
    const int first[3] = {SIGTERM, SIGUSR1, SIGINT};
    for (int k = 0; k < 3; k++) {
        cp_stop_install(-1);
        assert_int_equal(*cp_stop_flag(), 0);
        raise(first[k]);
        assert_int_equal(*cp_stop_flag(), first[k]);
        raise(first[k] == SIGTERM ? SIGUSR1 : SIGTERM); /* a later one: stopping already */
        assert_int_equal(*cp_stop_flag(), first[k]);
        cp_stop_uninstall();
    }
    /* a second SIGINT: the process ends by it */
    fflush(stdout);
    pid_t c = fork();
    if (c == 0) {
        cp_stop_install(7);
        raise(SIGINT);
        if (*cp_stop_flag() != SIGINT) _exit(3);
        raise(SIGINT);
        _exit(4); /* not reached */
    }
    int st;
    waitpid(c, &st, 0);
    assert_true(WIFSIGNALED(st));
    assert_int_equal(WTERMSIG(st), SIGINT);
    char name[32];
    assert_string_equal(cp_stop_signame(SIGTERM, name, sizeof name), "SIGTERM");
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "--child")) return child_main(argc, argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_handlers),
        cmocka_unit_test(test_one_rank_signalled),
        cmocka_unit_test(test_parent_forwards_and_waits),
        cmocka_unit_test(test_second_sigint_aborts),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

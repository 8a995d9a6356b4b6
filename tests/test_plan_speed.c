/* test_plan_speed.c: planning takes about the same time and memory at any sequence length. Runs build/cpgen plan as a
 * child under an address-space limit and an alarm (so that a planner that grows with the request fails here instead
 * of hanging the suite or the machine), and holds its CPU time, its peak resident memory and its answer: a refusal of
 * the tiny spec at 1024M tokens with the longest length that fits, and --max-seq of the 3B on one GPU and of the 8B
 * on a ring of 8 groups of 8 GPUs, with the answers docs/ARCHITECTURE.md gives. */
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
#include <sys/resource.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "source_tree.h"
#include "util.h"

#define CPGEN "build/cpgen"
#define AS_LIMIT (2LL << 30) /* address space: about 0.8 GiB is what cpgen maps at most to plan (VmPeak) */
#define WALL_LIMIT 60        /* seconds before the alarm kills a child that hangs */
#define CPU_LIMIT 10.0       /* seconds of CPU a plan or a --max-seq may take (about 1 s on a 2-core machine) */

typedef struct {
    int code;      /* exit status, or -signal when killed */
    double cpu;    /* user + system seconds */
    long rss_kb;   /* peak resident memory */
    char *out;     /* stdout and stderr (owned) */
} child;

/* Run build/cpgen with args under the limits. */
static void run(child *c, const char *const *args) {
    const char *argv[16] = {CPGEN};
    int n = 1;
    for (; args[n - 1] && n < 15; n++) argv[n] = args[n - 1];
    argv[n] = NULL;
    int fd[2];
    assert_int_equal(pipe(fd), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        struct rlimit as = {AS_LIMIT, AS_LIMIT};
        if (setrlimit(RLIMIT_AS, &as) || dup2(fd[1], 1) < 0 || dup2(fd[1], 2) < 0) _exit(120);
        close(fd[0]);
        close(fd[1]);
        alarm(WALL_LIMIT); /* kept across exec: SIGALRM ends a child that runs too long */
        execv(CPGEN, (char *const *)argv);
        _exit(121);
    }
    close(fd[1]);
    cp_str s = {0};
    char buf[4096];
    ssize_t r;
    while ((r = read(fd[0], buf, sizeof buf)) != 0) {
        if (r < 0 && errno == EINTR) continue;
        assert_true(r > 0);
        cp_str_append(&s, buf, (size_t)r);
    }
    close(fd[0]);
    int st;
    struct rusage ru;
    while (wait4(pid, &st, 0, &ru) < 0) assert_int_equal(errno, EINTR);
    c->code = WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st);
    c->cpu = (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + (double)ru.ru_stime.tv_sec +
             ru.ru_stime.tv_usec * 1e-6;
    c->rss_kb = ru.ru_maxrss;
    c->out = s.data ? s.data : cp_xstrdup("");
    printf("  cpgen");
    for (int i = 1; i < n; i++) printf(" %s", argv[i]);
    printf(": exit %d, %.2f s CPU, %.0f MiB peak resident\n", c->code, c->cpu, c->rss_kb / 1024.0);
    fflush(stdout); /* before cmocka's report of a failure, on stderr */
}

static void expect(const child *c, int code, const char *text) {
    if (c->code != code || !strstr(c->out, text)) {
        fprintf(stderr, "expected exit %d and \"%s\"; got exit %d:\n%s\n", code, text, c->code, c->out);
        fail();
    }
    assert_true(c->cpu < CPU_LIMIT);
}

/* The tiny spec at 1M tokens fits; at 64M and 1024M it is refused, with the longest length that fits (32265K, its
 * --max-seq). Each answers in about the same time and memory: before the plan held a step per tile, 1024M took 485 s
 * and 19 GB. */
static void test_tiny_any_length(void **state) {
    (void)state;
    child a, b, c;
    run(&a, (const char *[]){"plan", "tiny", "--seq", "1M", NULL});
    expect(&a, 0, "fits: yes");
    run(&b, (const char *[]){"plan", "tiny", "--seq", "64M", NULL});
    expect(&b, 2, "train.seq_len = 32265K (33039360 tokens) is the longest that fits");
    run(&c, (const char *[]){"plan", "tiny", "--seq", "1024M", NULL});
    expect(&c, 2, "does not fit: GPU memory: needs 4.42 TiB per GPU");
    assert_non_null(strstr(c.out, "train.seq_len = 32265K (33039360 tokens) is the longest that fits"));
    /* memory does not grow with the length: within 64 MiB of each other */
    assert_true(labs(c.rss_kb - a.rss_kb) < 64 * 1024);
    assert_true(labs(b.rss_kb - a.rss_kb) < 64 * 1024);
    free(a.out);
    free(b.out);
    free(c.out);
}

/* The README's --max-seq example and the longest ring of docs/ARCHITECTURE.md, in seconds: 41 s and 26 s before. */
static void test_max_seq_answers(void **state) {
    (void)state;
    child a, b;
    run(&a, (const char *[]){"plan", "llama3b", "--gpus", "1", "--max-seq", NULL});
    expect(&a, 0, "max-seq: 1366K tokens (1398784) fit 1 GPU");
    run(&b, (const char *[]){"plan", "llama8b", "--gpus", "8", "--set", "parallel.ring=8", "--max-seq", NULL});
    expect(&b, 0, "max-seq: 49472K tokens (50659328) fit 64 GPUs (ring 8 x 8)");
    free(a.out);
    free(b.out);
}

int main(int argc, char **argv) {
    (void)argc;
    go_to_source_tree(argv[0], "tests/specs_bad"); /* the cpgen binary is build/cpgen from there */
    if (access(CPGEN, X_OK) != 0) {
        fprintf(stderr, "%s is not built: make all first\n", CPGEN);
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tiny_any_length),
        cmocka_unit_test(test_max_seq_answers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

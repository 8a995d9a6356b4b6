/* test_launch.c: launcher detection (torchrun, Open MPI, PMI, Slurm and none; precedence; nested launches; bad
 * values, missing partner variables and disagreeing launchers, each with its message) and cp_launch_spawn, whose
 * children are this same binary run with --child MODE: all ranks succeed, one exits non-zero, one dies by a signal
 * while the others sleep forever, ranks that ignore SIGTERM are killed, SIGTERM to the launcher reaches the ranks,
 * and the ranks see the variables spawn sets and detect themselves as "cpgen" ranks; parallel.gpus = "auto" takes
 * the launcher's world size, else the GPUs CUDA sees, else 1, and says which in the spec's messages; the
 * communicators a run of several groups splits off (cp_world_comm_place, cp_world_split) against gen/ranks.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <errno.h>
#include <ftw.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "launch.h"
#include "ranks.h"
#include "spec.h"
#include "util.h"
#include "world.h"

static char err[2048];

static bool contains(const char *hay, const char *needle) { return strstr(hay, needle) != NULL; }
#define assert_contains(hay, needle)                                                                                \
    do {                                                                                                           \
        if (!contains(hay, needle)) fail_msg("expected \"%s\" in: %s", needle, hay);                              \
    } while (0)

/* ------------------------------------------------------------------------------------------------------------
 * the children: `test_launch --child MODE [RANK_ARG CODE]` */

static void sleep_ms(int ms) {
    struct timespec t = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    nanosleep(&t, NULL);
}

static void sleep_forever(void) {
    for (;;) pause();
}

/* Write "out/rank<R>.<suffix>" with text. */
static void child_write(const char *suffix, const char *text) {
    const char *out = getenv("CPGEN_TEST_OUT"), *rank = getenv("RANK");
    char path[512], tmp[520];
    snprintf(path, sizeof path, "%s/rank%s.%s", out ? out : ".", rank ? rank : "x", suffix);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) _exit(90);
    fputs(text, f);
    fclose(f);
    if (rename(tmp, path)) _exit(91);
}

static int child_main(int argc, char **argv) {
    const char *mode = argc > 2 ? argv[2] : "";
    int rank = getenv("RANK") ? atoi(getenv("RANK")) : -1;
    int which = argc > 3 ? atoi(argv[3]) : -1, code = argc > 4 ? atoi(argv[4]) : 1;
    if (!strcmp(mode, "env")) {
        /* Report the variables as seen, and what cp_launch_detect makes of them. */
        cp_launch_env e;
        char buf[4096], ferr[1024] = "";
        int rc = cp_launch_detect(&e, ferr, sizeof ferr);
        const char *names[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                               "CPGEN_SPAWNED", "NCCL_NVLS_ENABLE", "CPGEN_TEST_MARK", "CPGEN_RENDEZVOUS_FILE"};
        int k = 0;
        for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
            k += snprintf(buf + k, sizeof buf - (size_t)k, "%s=%s\n", names[i],
                          getenv(names[i]) ? getenv(names[i]) : "(unset)");
        snprintf(buf + k, sizeof buf - (size_t)k, "detect=%d %s %d/%d %d/%d %s:%d %s\n", rc,
                 rc ? "-" : cp_launcher_name(e.launcher), e.rank, e.size, e.local_rank, e.local_size, e.master_addr,
                 e.master_port, ferr);
        child_write("env", buf);
        return 0;
    }
    if (!strcmp(mode, "fail")) return rank == which ? code : 0;
    if (!strcmp(mode, "die")) {
        /* The others wait forever, as a rank blocked in a collective would. */
        if (rank != which) {
            child_write("ready", "");
            sleep_forever();
        }
        sleep_ms(50);
        kill(getpid(), SIGKILL);
        sleep_forever();
    }
    if (!strcmp(mode, "stubborn")) {
        signal(SIGTERM, SIG_IGN);
        if (rank != which) {
            child_write("ready", "");
            sleep_forever();
        }
        /* Fail only once every other rank ignores SIGTERM, however slowly they start. */
        int n = getenv("WORLD_SIZE") ? atoi(getenv("WORLD_SIZE")) : 0;
        for (int r = 0; r < n; r++) {
            char path[512];
            snprintf(path, sizeof path, "%s/rank%d.ready", getenv("CPGEN_TEST_OUT"), r);
            for (int k = 0; r != rank && k < 500 && access(path, F_OK) != 0; k++) sleep_ms(10);
        }
        return code;
    }
    if (!strcmp(mode, "sleep")) {
        char pid[32];
        snprintf(pid, sizeof pid, "%d", (int)getpid());
        child_write("ready", pid);
        sleep_forever();
    }
    fprintf(stderr, "test_launch --child: unknown mode \"%s\"\n", mode);
    return 99;
}

/* ------------------------------------------------------------------------------------------------------------
 * environment */

static const char *const all_vars[] = {
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "CPGEN_SPAWNED",
    "CPGEN_RENDEZVOUS_FILE", "CPGEN_RUN_ID", "TORCHELASTIC_RUN_ID", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", "PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid",
    "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", "PMI_LOCAL_RANK", "PMI_LOCAL_SIZE", "SLURM_PROCID",
    "SLURM_NTASKS", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_NTASKS_PER_NODE",
    "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_STEP_ID", "SLURM_STEPID", "SLURM_JOB_ID",
    "NCCL_NVLS_ENABLE", "CPGEN_TEST_MARK", "CPGEN_TEST_OUT",
};

static int clear_env(void **state) {
    (void)state;
    for (size_t k = 0; k < sizeof all_vars / sizeof all_vars[0]; k++) unsetenv(all_vars[k]);
    return 0;
}

/* setenv for a list of "NAME=value" strings. */
static void set_vars(const char *const *kv) {
    for (; *kv; kv++) {
        const char *eq = strchr(*kv, '=');
        char name[128];
        snprintf(name, sizeof name, "%.*s", (int)(eq - *kv), *kv);
        setenv(name, eq + 1, 1);
    }
}

#define SET(...) set_vars((const char *const[]){__VA_ARGS__, NULL})

static cp_launch_env detect_ok(void) {
    cp_launch_env e;
    if (cp_launch_detect(&e, err, sizeof err)) fail_msg("cp_launch_detect failed: %s", err);
    return e;
}

static void detect_fails(const char *needle1, const char *needle2) {
    cp_launch_env e;
    assert_int_equal(cp_launch_detect(&e, err, sizeof err), -1);
    assert_contains(err, needle1);
    if (needle2) assert_contains(err, needle2);
}

static void test_none(void **state) {
    (void)state;
    cp_launch_env e = detect_ok();
    assert_int_equal(e.launcher, CP_LAUNCH_NONE);
    assert_int_equal(e.rank, 0);
    assert_int_equal(e.size, 1);
    assert_int_equal(e.local_rank, 0);
    assert_int_equal(e.local_size, 1);
    assert_string_equal(e.master_addr, "");
    char d[256];
    cp_launch_describe(&e, d, sizeof d);
    assert_string_equal(d, "one process (no launcher)");
}

static void test_torchrun(void **state) {
    (void)state;
    SET("RANK=2", "WORLD_SIZE=4", "LOCAL_RANK=0", "LOCAL_WORLD_SIZE=2", "MASTER_ADDR=node1", "MASTER_PORT=29500",
        "TORCHELASTIC_RUN_ID=abc");
    cp_launch_env e = detect_ok();
    assert_int_equal(e.launcher, CP_LAUNCH_TORCHRUN);
    assert_int_equal(e.rank, 2);
    assert_int_equal(e.size, 4);
    assert_int_equal(e.local_rank, 0);
    assert_int_equal(e.local_size, 2);
    assert_string_equal(e.master_addr, "node1");
    assert_int_equal(e.master_port, 29500);
    assert_string_equal(e.job_id, "abc");
    char d[256];
    cp_launch_describe(&e, d, sizeof d);
    assert_string_equal(d, "rank 2 of 4 (local 0 of 2), started by torchrun, rendezvous node1:29500");
}

static void test_torchrun_single(void **state) {
    (void)state;
    SET("RANK=0", "WORLD_SIZE=1");
    cp_launch_env e = detect_ok();
    assert_int_equal(e.launcher, CP_LAUNCH_TORCHRUN);
    assert_int_equal(e.size, 1);
    assert_int_equal(e.local_rank, 0);
    assert_int_equal(e.local_size, 1);
}

static void test_openmpi(void **state) {
    (void)state;
    SET("OMPI_COMM_WORLD_RANK=5", "OMPI_COMM_WORLD_SIZE=8", "OMPI_COMM_WORLD_LOCAL_RANK=1",
        "OMPI_COMM_WORLD_LOCAL_SIZE=4", "PMIX_NAMESPACE=prterun-node1-1234@1", "CPGEN_RENDEZVOUS_FILE=/shared/rdv");
    cp_launch_env e = detect_ok();
    assert_int_equal(e.launcher, CP_LAUNCH_OPENMPI);
    assert_int_equal(e.rank, 5);
    assert_int_equal(e.size, 8);
    assert_int_equal(e.local_rank, 1);
    assert_int_equal(e.local_size, 4);
    assert_string_equal(e.rendezvous_file, "/shared/rdv");
    assert_string_equal(e.job_id, "prterun-node1-1234@1");
    char d[256];
    cp_launch_describe(&e, d, sizeof d);
    assert_contains(d, "started by Open MPI, rendezvous file /shared/rdv");
}

static void test_pmi_hydra(void **state) {
    (void)state;
    SET("PMI_RANK=3", "PMI_SIZE=4", "MPI_LOCALRANKID=1", "MPI_LOCALNRANKS=2", "MASTER_ADDR=10.0.0.1",
        "MASTER_PORT=29400");
    cp_launch_env e = detect_ok();
    assert_int_equal(e.launcher, CP_LAUNCH_PMI);
    assert_int_equal(e.rank, 3);
    assert_int_equal(e.local_rank, 1);
    assert_int_equal(e.local_size, 2);
}

static void test_pmi_without_local(void **state) {
    (void)state;
    SET("PMI_RANK=1", "PMI_SIZE=4", "MASTER_ADDR=n", "MASTER_PORT=1000");
    detect_fails("PMI_RANK=1 of PMI_SIZE=4 is set, but PMI does not say the rank on the node and how many ranks it "
                 "has, which picks the GPU", "set RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE for each process");
    /* Slurm with the rank on the node but no count per node. */
    clear_env(NULL);
    SET("SLURM_PROCID=1", "SLURM_NTASKS=4", "SLURM_LOCALID=1", "SLURM_STEP_ID=3", "MASTER_ADDR=n", "MASTER_PORT=1000");
    detect_fails("Slurm does not say how many ranks the node has", NULL);
}

static void test_slurm_step(void **state) {
    (void)state;
    SET("SLURM_PROCID=5", "SLURM_NTASKS=8", "SLURM_LOCALID=1", "SLURM_NODEID=1", "SLURM_STEP_TASKS_PER_NODE=4(x2)",
        "SLURM_NTASKS_PER_NODE=99", "SLURM_STEP_ID=0", "SLURM_JOB_ID=123", "MASTER_ADDR=node1", "MASTER_PORT=29500");
    cp_launch_env e = detect_ok();
    assert_int_equal(e.launcher, CP_LAUNCH_SLURM);
    assert_int_equal(e.rank, 5);
    assert_int_equal(e.size, 8);
    assert_int_equal(e.local_rank, 1);
    assert_int_equal(e.local_size, 4); /* the step's list wins over the allocation's --ntasks-per-node */
    assert_string_equal(e.job_id, "slurm-123.0");
}

static void test_slurm_lists(void **state) {
    (void)state;
    /* An uneven step: nodes 0 and 1 run 4 tasks, node 2 runs 3. */
    SET("SLURM_PROCID=9", "SLURM_NTASKS=11", "SLURM_STEP_NUM_TASKS=11", "SLURM_LOCALID=1", "SLURM_NODEID=2",
        "SLURM_STEP_TASKS_PER_NODE=4(x2),3", "SLURM_STEPID=7", "CPGEN_RENDEZVOUS_FILE=/shared/x");
    assert_int_equal(detect_ok().local_size, 3);
    /* Only the allocation's count per node. */
    unsetenv("SLURM_STEP_TASKS_PER_NODE");
    SET("SLURM_NTASKS_PER_NODE=4", "SLURM_PROCID=5", "SLURM_NTASKS=8", "SLURM_STEP_NUM_TASKS=8", "SLURM_NODEID=1");
    assert_int_equal(detect_ok().local_size, 4);
    SET("SLURM_STEP_TASKS_PER_NODE=4(y2)");
    detect_fails("SLURM_STEP_TASKS_PER_NODE=\"4(y2)\"", "4(x2),3");
    SET("SLURM_STEP_TASKS_PER_NODE=4", "SLURM_NODEID=3");
    detect_fails("SLURM_STEP_TASKS_PER_NODE=\"4\" cannot be read as tasks per node for node 3", NULL);
}

static void test_slurm_outside_step(void **state) {
    (void)state;
    /* An salloc or sbatch shell: Slurm's variables say rank 0 of the allocation, but this is one process. */
    SET("SLURM_PROCID=0", "SLURM_NTASKS=4", "SLURM_LOCALID=0", "SLURM_JOB_ID=55");
    cp_launch_env e = detect_ok();
    assert_int_equal(e.launcher, CP_LAUNCH_NONE);
    assert_int_equal(e.size, 1);
    assert_contains(e.note, "start the run with srun");
    /* The batch step's id (0xfffffffe) is not an srun step either. */
    SET("SLURM_STEP_ID=4294967294");
    assert_int_equal(detect_ok().launcher, CP_LAUNCH_NONE);
}

static void test_bad_numbers(void **state) {
    (void)state;
    SET("RANK=abc", "WORLD_SIZE=4");
    detect_fails("RANK=\"abc\" is not a whole number", "a process index");
    SET("RANK=-1");
    detect_fails("RANK=-1 must be 0 or more", NULL);
    SET("RANK=1", "WORLD_SIZE=0");
    detect_fails("WORLD_SIZE=0 must be 1 or more", NULL);
    SET("WORLD_SIZE=99999999999");
    detect_fails("WORLD_SIZE=\"99999999999\" is not a whole number", "a count of processes");
    SET("WORLD_SIZE= 4");
    detect_fails("WORLD_SIZE=\" 4\" is not a whole number", NULL);
    SET("WORLD_SIZE=");
    detect_fails("WORLD_SIZE is set but empty", NULL);
}

static void test_ranges(void **state) {
    (void)state;
    SET("RANK=4", "WORLD_SIZE=4", "LOCAL_RANK=0", "LOCAL_WORLD_SIZE=4", "MASTER_ADDR=a", "MASTER_PORT=1");
    detect_fails("RANK=4 is not below WORLD_SIZE=4", "0 to 3");
    SET("RANK=3", "LOCAL_RANK=4");
    detect_fails("LOCAL_RANK=4 is not below LOCAL_WORLD_SIZE=4", "0 to 3");
    SET("LOCAL_RANK=0", "LOCAL_WORLD_SIZE=8");
    detect_fails("LOCAL_WORLD_SIZE=8 is larger than WORLD_SIZE=4", NULL);
}

static void test_missing_partner(void **state) {
    (void)state;
    SET("RANK=1");
    detect_fails("RANK is set but WORLD_SIZE is not", "set RANK and WORLD_SIZE");
    clear_env(NULL);
    SET("WORLD_SIZE=2");
    detect_fails("WORLD_SIZE is set but RANK is not", NULL);
    SET("RANK=1", "LOCAL_RANK=1", "MASTER_ADDR=a", "MASTER_PORT=1");
    detect_fails("LOCAL_RANK is set but LOCAL_WORLD_SIZE is not", NULL);
    unsetenv("LOCAL_RANK");
    detect_fails("RANK=1 of WORLD_SIZE=2 is set, but torchrun does not say the rank on the node",
                 "set LOCAL_RANK and LOCAL_WORLD_SIZE as well");
    clear_env(NULL);
    SET("OMPI_COMM_WORLD_RANK=0");
    detect_fails("OMPI_COMM_WORLD_RANK is set but OMPI_COMM_WORLD_SIZE is not", "Open MPI's mpirun sets both");
}

static void test_meeting_point(void **state) {
    (void)state;
    SET("RANK=1", "WORLD_SIZE=2", "LOCAL_RANK=1", "LOCAL_WORLD_SIZE=2");
    detect_fails("rank 1 of 2 (started by torchrun) has no meeting point", "CPGEN_RENDEZVOUS_FILE");
    SET("MASTER_ADDR=node1");
    detect_fails("MASTER_ADDR=node1 is set but MASTER_PORT is not", NULL);
    SET("MASTER_PORT=70000");
    detect_fails("MASTER_PORT=70000 is not a TCP port", NULL);
    SET("MASTER_PORT=http");
    detect_fails("MASTER_PORT=\"http\" is not a whole number", NULL);
    unsetenv("MASTER_ADDR");
    SET("MASTER_PORT=29500");
    detect_fails("MASTER_PORT=29500 is set but MASTER_ADDR is not", NULL);
    SET("CPGEN_RENDEZVOUS_FILE=/shared/rdv");
    cp_launch_env e = detect_ok(); /* the file is enough */
    assert_string_equal(e.rendezvous_file, "/shared/rdv");
    assert_int_equal(e.master_port, 29500);
}

static void test_disagreement(void **state) {
    (void)state;
    /* RANK and WORLD_SIZE left over by hand, then started by mpirun with as many processes: two rank 0s would meet
     * at the rendezvous. */
    SET("RANK=0", "WORLD_SIZE=2", "LOCAL_RANK=0", "LOCAL_WORLD_SIZE=2", "OMPI_COMM_WORLD_RANK=1",
        "OMPI_COMM_WORLD_SIZE=2", "OMPI_COMM_WORLD_LOCAL_RANK=1", "OMPI_COMM_WORLD_LOCAL_SIZE=2", "MASTER_ADDR=a",
        "MASTER_PORT=1");
    detect_fails("RANK=0 but OMPI_COMM_WORLD_RANK=1, and both count 2 processes", "unset them");
    /* Agreeing launchers are fine; the innermost (first) one is recorded. */
    SET("RANK=1", "LOCAL_RANK=1");
    assert_int_equal(detect_ok().launcher, CP_LAUNCH_TORCHRUN);
    /* Open MPI and PMI agree on the rank but not on the node. */
    clear_env(NULL);
    SET("OMPI_COMM_WORLD_RANK=1", "OMPI_COMM_WORLD_SIZE=2", "OMPI_COMM_WORLD_LOCAL_RANK=1",
        "OMPI_COMM_WORLD_LOCAL_SIZE=2", "PMI_RANK=1", "PMI_SIZE=2", "PMI_LOCAL_RANK=0", "PMI_LOCAL_SIZE=1",
        "MASTER_ADDR=a", "MASTER_PORT=1");
    detect_fails("OMPI_COMM_WORLD_LOCAL_RANK=1 of OMPI_COMM_WORLD_LOCAL_SIZE=2 but PMI_LOCAL_RANK=0 of "
                 "PMI_LOCAL_SIZE=1", "disagree about the ranks on this node");
    SET("PMI_LOCAL_RANK=1", "PMI_LOCAL_SIZE=2");
    assert_int_equal(detect_ok().launcher, CP_LAUNCH_OPENMPI);
}

static void test_nested(void **state) {
    (void)state;
    /* srun with one task per node running torchrun with 8 ranks each: Slurm's numbers are the node's. */
    SET("RANK=13", "WORLD_SIZE=16", "LOCAL_RANK=5", "LOCAL_WORLD_SIZE=8", "MASTER_ADDR=node1", "MASTER_PORT=29500",
        "SLURM_PROCID=1", "SLURM_NTASKS=2", "SLURM_LOCALID=0", "SLURM_STEP_TASKS_PER_NODE=1(x2)", "SLURM_NODEID=1",
        "SLURM_STEP_ID=0");
    cp_launch_env e = detect_ok();
    assert_int_equal(e.launcher, CP_LAUNCH_TORCHRUN);
    assert_int_equal(e.rank, 13);
    assert_contains(e.note, "Slurm variables (SLURM_PROCID=1, SLURM_NTASKS=2) were ignored");
    /* torchrun's own rendezvous numbers the ranks, so even an outer launch of the same size is not compared. */
    SET("RANK=1", "WORLD_SIZE=2", "LOCAL_RANK=0", "LOCAL_WORLD_SIZE=1", "SLURM_PROCID=0", "SLURM_NTASKS=2",
        "SLURM_LOCALID=0", "SLURM_STEP_TASKS_PER_NODE=1(x2)", "SLURM_NODEID=0", "TORCHELASTIC_RUN_ID=x");
    assert_int_equal(detect_ok().rank, 1);
}

static void test_spawned_env(void **state) {
    (void)state;
    SET("CPGEN_SPAWNED=1", "RANK=1", "WORLD_SIZE=2", "LOCAL_RANK=1", "LOCAL_WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1",
        "MASTER_PORT=4000", "OMPI_COMM_WORLD_RANK=0", "OMPI_COMM_WORLD_SIZE=2");
    cp_launch_env e = detect_ok();
    assert_int_equal(e.launcher, CP_LAUNCH_CPGEN);
    assert_string_equal(cp_launcher_name(e.launcher), "cpgen");
    assert_contains(e.note, "Open MPI variables");
    clear_env(NULL);
    SET("CPGEN_SPAWNED=1");
    detect_fails("CPGEN_SPAWNED=1 but RANK and WORLD_SIZE are not set", "unset CPGEN_SPAWNED");
}

static void test_free_port(void **state) {
    (void)state;
    int p = cp_launch_free_port(err, sizeof err);
    assert_true(p > 0 && p < 65536);
}

/* ------------------------------------------------------------------------------------------------------------
 * spawn */

static char outdir[256];

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(p);
}

static int spawn_setup(void **state) {
    clear_env(state);
    snprintf(outdir, sizeof outdir, "/tmp/cpgen_test_launch_XXXXXX");
    if (!mkdtemp(outdir)) return -1;
    setenv("CPGEN_TEST_OUT", outdir, 1);
    return 0;
}

static int spawn_teardown(void **state) {
    (void)state;
    nftw(outdir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
    return 0;
}

static char *read_out(int rank, const char *suffix) {
    char path[512];
    snprintf(path, sizeof path, "%s/rank%d.%s", outdir, rank, suffix);
    return cp_read_file(path, NULL);
}

static int spawn(int n, const char *mode, const char *a, const char *b, double grace) {
    char *argv[] = {"test_launch", "--child", (char *)mode, (char *)a, (char *)b, NULL};
    cp_spawn_opts o = {.grace_s = grace};
    return cp_launch_spawn(n, argv, &o, err, sizeof err);
}

static void test_spawn_ok(void **state) {
    (void)state;
    /* Left over from a launch by hand: spawn replaces them. */
    SET("RANK=7", "WORLD_SIZE=9", "CPGEN_TEST_MARK=from-parent", "CPGEN_RENDEZVOUS_FILE=/stale/file");
    if (spawn(3, "env", NULL, NULL, 2.0)) fail_msg("spawn failed: %s", err);
    int port = -1;
    for (int r = 0; r < 3; r++) {
        char *t = read_out(r, "env"), want[128];
        if (!t) fail_msg("rank %d wrote nothing", r);
        snprintf(want, sizeof want, "RANK=%d\nWORLD_SIZE=3\nLOCAL_RANK=%d\nLOCAL_WORLD_SIZE=3\nMASTER_ADDR=127.0.0.1\n",
                 r, r);
        assert_contains(t, want);
        assert_contains(t, "CPGEN_SPAWNED=1\n");
        assert_contains(t, "NCCL_NVLS_ENABLE=0\n");
        assert_contains(t, "CPGEN_TEST_MARK=from-parent\n");
        assert_contains(t, "CPGEN_RENDEZVOUS_FILE=(unset)\n");
        snprintf(want, sizeof want, "detect=0 cpgen %d/3 %d/3 127.0.0.1:", r, r);
        assert_contains(t, want);
        int p = atoi(strstr(t, "MASTER_PORT=") + 12);
        assert_true(p > 0 && p < 65536);
        if (port >= 0) assert_int_equal(p, port); /* one meeting point for all */
        port = p;
        free(t);
    }
}

static void test_spawn_keeps_user_nvls(void **state) {
    (void)state;
    SET("NCCL_NVLS_ENABLE=1");
    if (spawn(2, "env", NULL, NULL, 2.0)) fail_msg("spawn failed: %s", err);
    char *t = read_out(1, "env");
    assert_non_null(t);
    assert_contains(t, "NCCL_NVLS_ENABLE=1\n");
    free(t);
}

static void test_spawn_exit_code(void **state) {
    (void)state;
    assert_int_equal(spawn(3, "fail", "1", "3", 2.0), -1);
    assert_contains(err, "rank 1 of 3 (pid ");
    assert_contains(err, "exited with code 3");
}

static void test_spawn_killed(void **state) {
    (void)state;
    double t0 = cp_now();
    assert_int_equal(spawn(3, "die", "1", NULL, 2.0), -1);
    assert_contains(err, "rank 1 of 3");
    assert_contains(err, "was killed by signal 9");
    assert_false(contains(err, "SIGKILL")); /* the sleepers went at SIGTERM */
    assert_true(cp_now() - t0 < 10.0);      /* no hang (loose: the machine may be loaded) */
}

static void test_spawn_stubborn(void **state) {
    (void)state;
    double t0 = cp_now();
    assert_int_equal(spawn(3, "stubborn", "2", "4", 0.3), -1);
    assert_contains(err, "rank 2 of 3");
    assert_contains(err, "exited with code 4");
    assert_contains(err, "2 ranks did not exit within 0.3 s of SIGTERM and were killed with SIGKILL");
    assert_true(cp_now() - t0 < 10.0);
}

static void test_spawn_bad_exe(void **state) {
    (void)state;
    char *argv[] = {"x", NULL};
    cp_spawn_opts o = {.exe = "/nonexistent/cpgen", .grace_s = 1};
    assert_int_equal(cp_launch_spawn(2, argv, &o, err, sizeof err), -1);
    assert_contains(err, "cannot start rank 0 of 2: cannot run /nonexistent/cpgen: No such file or directory");
    assert_int_equal(cp_launch_spawn(0, argv, &o, err, sizeof err), -1);
    assert_contains(err, "cannot start 0 processes");
    SET("CPGEN_SPAWNED=1");
    assert_int_equal(cp_launch_spawn(2, argv, NULL, err, sizeof err), -1);
    assert_contains(err, "itself started by cpgen");
}

/* SIGTERM sent to the launcher alone reaches every rank. The launcher runs in a forked process here, since the
 * test must signal it while it waits. */
static void test_spawn_forwards_sigterm(void **state) {
    (void)state;
    int pfd[2];
    assert_int_equal(pipe(pfd), 0);
    pid_t sup = fork();
    assert_true(sup >= 0);
    if (sup == 0) {
        close(pfd[0]);
        int rc = spawn(2, "sleep", NULL, NULL, 2.0);
        ssize_t w = write(pfd[1], err, strlen(err));
        (void)w;
        _exit(rc ? 1 : 0);
    }
    close(pfd[1]);
    pid_t kids[2] = {0, 0};
    double t0 = cp_now();
    for (int r = 0; r < 2; r++) {
        char *t;
        while (!(t = read_out(r, "ready")) && cp_now() - t0 < 4.0) sleep_ms(10);
        if (!t) {
            kill(sup, SIGKILL);
            fail_msg("rank %d did not start", r);
        }
        kids[r] = (pid_t)atoi(t);
        free(t);
    }
    assert_int_equal(kill(sup, SIGTERM), 0);
    int st = 0;
    pid_t w;
    while ((w = waitpid(sup, &st, WNOHANG)) == 0 && cp_now() - t0 < 5.0) sleep_ms(10);
    if (w == 0) {
        kill(sup, SIGKILL);
        waitpid(sup, &st, 0);
        fail_msg("the launcher did not return after SIGTERM");
    }
    char msg[1024] = "";
    ssize_t k = read(pfd[0], msg, sizeof msg - 1);
    close(pfd[0]);
    msg[k > 0 ? k : 0] = 0;
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 1);
    assert_contains(msg, "stopped by SIGTERM (signal 15), passed on to every rank");
    for (int r = 0; r < 2; r++) {
        assert_int_equal(kill(kids[r], 0), -1); /* reaped by the launcher: gone */
        assert_int_equal(errno, ESRCH);
    }
}

/* parallel.gpus = "auto" as cpgen counts it, with the GPUs CUDA would see made up. */
static int visible_gpus;
static int count_like_cpgen(char *found, int len) {
    cp_launch_env e;
    char err[512];
    bool launched = cp_launch_detect(&e, err, sizeof err) == 0 && e.launcher != CP_LAUNCH_NONE;
    return cp_launch_auto_gpus(launched ? &e : NULL, visible_gpus, "no NVIDIA driver", found, len);
}

static void test_auto_gpus(void **state) {
    (void)state;
    char found[160], err[CP_ERR_MAX];
    assert_int_equal(cp_launch_auto_gpus(NULL, 2, "", found, sizeof found), 2);
    assert_string_equal(found, "2 GPUs visible to CUDA on this node");
    assert_int_equal(cp_launch_auto_gpus(NULL, 0, "no NVIDIA driver", found, sizeof found), 1);
    assert_string_equal(found, "no GPU (no NVIDIA driver), so 1 GPU is planned");

    cp_spec_set_gpu_counter(count_like_cpgen);
    cp_spec s;
    visible_gpus = 2; /* one process, no launcher: the GPUs of this node */
    if (cp_spec_load("llama3b", NULL, 0, &s, err, sizeof err)) fail_msg("%s", err);
    assert_true(s.parallel.gpus_auto);
    assert_int_equal(s.parallel.gpus, 2);
    visible_gpus = 0; /* no GPU: one is planned */
    if (cp_spec_load("llama3b", NULL, 0, &s, err, sizeof err)) fail_msg("%s", err);
    assert_int_equal(s.parallel.gpus, 1);
    assert_contains(s.parallel.gpus_found, "no GPU");
    const char *eight[] = {"parallel.gpus=8"}; /* --gpus wins over "auto" */
    if (cp_spec_load("llama3b", eight, 1, &s, err, sizeof err)) fail_msg("%s", err);
    assert_false(s.parallel.gpus_auto);
    assert_int_equal(s.parallel.gpus, 8);

    /* under a launcher, its world size, whatever this node has */
    visible_gpus = 8;
    SET("RANK=1", "WORLD_SIZE=4", "LOCAL_RANK=1", "LOCAL_WORLD_SIZE=4", "MASTER_ADDR=node1", "MASTER_PORT=29500");
    if (cp_spec_load("llama8b", NULL, 0, &s, err, sizeof err)) fail_msg("%s", err);
    assert_int_equal(s.parallel.gpus, 4);
    assert_string_equal(s.parallel.gpus_found, "4 GPUs, the world size torchrun started");
    /* a count the spec's heads cannot use: the message names the count, where it came from and the fix */
    SET("WORLD_SIZE=3", "LOCAL_WORLD_SIZE=3");
    assert_int_equal(cp_spec_load("llama8b", NULL, 0, &s, err, sizeof err), -1);
    assert_contains(err, "parallel.gpus = 3: heads (32) must be divisible by gpus");
    assert_contains(err, "use gpus = 1, 2, 4, 8, 16 or 32");
    assert_contains(err, "\"auto\" found 3 GPUs, the world size torchrun started; --gpus N");
    /* a fixed UPipe U that does not fit the count found: llama8b's upipe_heads = 8 on 16 ranks */
    SET("WORLD_SIZE=16", "LOCAL_WORLD_SIZE=8");
    assert_int_equal(cp_spec_load("llama8b", NULL, 0, &s, err, sizeof err), -1);
    assert_contains(err, "parallel.upipe_heads = 8: must be a multiple of gpus (16)");
    assert_contains(err, "valid values with gpus = 16: 16 or 32, or \"auto\"");
    assert_contains(err, "\"auto\" found 16 GPUs");
    /* a fixed length that does not fit: 1M + 8 tokens on 16 ranks */
    const char *len[] = {"train.seq_len=1048584", "parallel.upipe_heads=auto"};
    assert_int_equal(cp_spec_load("llama8b", len, 2, &s, err, sizeof err), -1);
    assert_contains(err, "train.seq_len = 1048584: must be a multiple of gpus (16)");
    assert_contains(err, "\"auto\" found 16 GPUs");
    /* the ranks cpgen itself starts: the count it started */
    clear_env(NULL);
    SET("CPGEN_SPAWNED=1", "RANK=1", "WORLD_SIZE=2", "LOCAL_RANK=1", "LOCAL_WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1",
        "MASTER_PORT=29500");
    if (cp_spec_load("llama3b", NULL, 0, &s, err, sizeof err)) fail_msg("%s", err);
    assert_int_equal(s.parallel.gpus, 2);
    assert_string_equal(s.parallel.gpus_found, "2 GPUs, the world size cpgen started");
    cp_spec_set_gpu_counter(NULL);
}

/* The splits the runtime asks NCCL for: for every layout of up to 64 ranks and every kind, the ranks passing one
 * colour are exactly gen/ranks.c's members of that communicator, each with its index among them as its rank there:
 * in the Ulysses group its local rank, in the shard its group's number. */
static void test_comm_places(void **state) {
    (void)state;
    int layouts = 0;
    for (int R = 1; R <= 64; R++)
        for (int P = 1; R * P <= 64; P++)
            for (int C = 1; R * P * C <= 64; C++, layouts++) {
                cp_rank_layout L = {R, P, C};
                int W = R * P * C;
                for (int kind = 0; kind < CP_COMM_COUNT; kind++)
                    for (int r = 0; r < W; r++) {
                        int color, key, members[64], mcolor;
                        int n = cp_world_comm_place(&L, r, (cp_comm_kind)kind, &color, &key);
                        int m = cp_rank_comm(&L, r, (cp_comm_kind)kind, &mcolor, members);
                        assert_int_equal(n, m);
                        assert_int_equal(color, mcolor);
                        assert_int_equal(members[key], r);
                        /* the same colour is passed by the members and by no other rank */
                        int same = 0;
                        for (int q = 0; q < W; q++) {
                            int c2, k2;
                            cp_world_comm_place(&L, q, (cp_comm_kind)kind, &c2, &k2);
                            if (c2 != color) continue;
                            assert_int_equal(members[k2], q);
                            same++;
                        }
                        assert_int_equal(same, n);
                        cp_rank_place pl = cp_rank_of(&L, r);
                        if (kind == CP_COMM_ULYSSES) assert_int_equal(key, pl.local);
                        if (kind == CP_COMM_SHARD) assert_int_equal(key, pl.replica * P + pl.ring_pos);
                        if (kind == CP_COMM_WORLD) assert_int_equal(key, r);
                    }
            }
    assert_true(layouts > 500);
}

/* Splitting without NCCL: one group splits nothing (the run's communicator is the group's, as before replicas);
 * groups of one GPU use the run's as the shard's, and a ring of them as the ring's too; a plan whose ranks are not
 * the run's is refused. */
static void test_world_split(void **state) {
    (void)state;
    cp_world w;
    memset(&w, 0, sizeof w);
    w.size = 8;
    w.rank = 5;
    cp_rank_layout one = {1, 1, 8};
    assert_int_equal(cp_world_split(&w, &one, err, sizeof err), 0);
    assert_ptr_equal(w.of_kind[CP_COMM_ULYSSES], &w.comm);
    assert_ptr_equal(w.of_kind[CP_COMM_WORLD], &w.comm);
    assert_null(w.of_kind[CP_COMM_SHARD]);
    assert_int_equal(w.group_rank, 5);
    cp_rank_layout singles = {8, 1, 1};
    assert_int_equal(cp_world_split(&w, &singles, err, sizeof err), 0);
    assert_null(w.of_kind[CP_COMM_ULYSSES]);
    assert_ptr_equal(w.of_kind[CP_COMM_SHARD], &w.comm);
    assert_int_equal(w.group_rank, 0);
    cp_rank_layout wrong = {2, 1, 2};
    assert_int_equal(cp_world_split(&w, &wrong, err, sizeof err), -1);
    assert_string_equal(err, "rank 5: the run has 8 ranks, its plan 2 x 1 x 2 = 4: start one process per GPU of the "
                             "plan (replicas x ring x gpus)");
    /* a ring of single GPUs is the run: its communicator and the shard's are the run's own */
    cp_rank_layout ring_of_ones = {1, 8, 1};
    assert_int_equal(cp_world_split(&w, &ring_of_ones, err, sizeof err), 0);
    assert_null(w.of_kind[CP_COMM_ULYSSES]);
    assert_ptr_equal(w.of_kind[CP_COMM_RING], &w.comm);
    assert_ptr_equal(w.of_kind[CP_COMM_SHARD], &w.comm);
    assert_int_equal(w.group_rank, 0);
    /* several groups of several GPUs split the run's communicator, which NCCL must make: without it, the message */
    cp_rank_layout hybrid = {2, 1, 4};
    assert_int_equal(cp_world_split(&w, &hybrid, err, sizeof err), -1);
    assert_string_equal(err, "ncclCommSplit: NCCL is not loaded (cp_nccl_load)");
}

/* The splits a ring makes, on a fake ncclCommSplit that records them: rank 5 of ring 2 x 4 GPUs (ring position 1,
 * local rank 1) gets its Ulysses group (colour 1, rank 1 of 4), its ring (colour 1: the ranks of local rank 1, rank
 * 1 of 2: its ring position) and its shard (colour 1, rank 1 of 2), in that order, every rank alike; with 2
 * replicas of a ring of 2 single GPUs, rank 3 (replica 1, position 1) only its ring (colour 1, rank 1 of 2), the
 * shard being the run. The fake splits as NCCL does on a non-blocking communicator: it returns with no handle,
 * keeps the parent busy for a poll (refusing another split meanwhile) and writes the handle when it is done. */
#define RUN_COMM ((ncclComm_t)(uintptr_t)0x100)
static struct {
    int n, color[4], key[4], refused;
    ncclComm_t *pending; /* the split in progress: where its handle goes */
    int polls;
} splits;
static ncclResult_t fake_split(ncclComm_t c, int color, int key, ncclComm_t *out, ncclConfig_t *cfg) {
    (void)cfg;
    if (c != RUN_COMM || splits.pending) return splits.refused++, ncclInvalidArgument;
    splits.color[splits.n] = color;
    splits.key[splits.n++] = key;
    *out = NULL;
    splits.pending = out;
    splits.polls = 1;
    return ncclSuccess; /* as NCCL 2.28 says, the split still running */
}
static ncclResult_t fake_async(ncclComm_t c, ncclResult_t *st) {
    if (!c) return ncclInvalidArgument;
    *st = ncclSuccess;
    if (c == RUN_COMM && splits.pending) {
        if (splits.polls-- > 0) *st = ncclInProgress;
        else *splits.pending = (ncclComm_t)(uintptr_t)(0x100 + splits.n), splits.pending = NULL;
    }
    return ncclSuccess;
}

static void test_world_split_ring(void **state) {
    (void)state;
    cp_nccl_api fake = {.CommSplit = fake_split, .CommGetAsyncError = fake_async};
    cp_nccl_use_api(&fake, 22809);
    cp_world w;
    memset(&w, 0, sizeof w);
    w.comm = (cp_nccl_comm){.comm = RUN_COMM, .rank = 5, .size = 8, .timeout_s = 5, .nonblocking = true};
    w.rank = 5;
    w.size = 8;
    memset(&splits, 0, sizeof splits);
    cp_rank_layout ring = {1, 2, 4};
    assert_int_equal(cp_world_split(&w, &ring, err, sizeof err), 0);
    assert_int_equal(splits.n, 3);
    assert_ptr_equal(w.of_kind[CP_COMM_ULYSSES], &w.group);
    assert_ptr_equal(w.of_kind[CP_COMM_RING], &w.ring);
    assert_ptr_equal(w.of_kind[CP_COMM_SHARD], &w.shard);
    assert_ptr_equal(w.of_kind[CP_COMM_WORLD], &w.comm);
    assert_true(splits.color[0] == 1 && splits.key[0] == 1 && w.group.size == 4 && w.group.rank == 1);
    assert_true(splits.color[1] == 1 && splits.key[1] == 1 && w.ring.size == 2 && w.ring.rank == 1);
    assert_true(splits.color[2] == 1 && splits.key[2] == 1 && w.shard.size == 2 && w.shard.rank == 1);
    assert_true(w.group.comm && w.ring.comm && w.shard.comm);
    assert_int_equal(splits.refused, 0);
    assert_int_equal(w.group_rank, 1);
    memset(&splits, 0, sizeof splits);
    w.comm.rank = w.rank = 3;
    w.comm.size = w.size = 4;
    cp_rank_layout replicas_of_rings = {2, 2, 1};
    assert_int_equal(cp_world_split(&w, &replicas_of_rings, err, sizeof err), 0);
    assert_int_equal(splits.n, 1);
    assert_true(splits.color[0] == 1 && splits.key[0] == 1 && w.ring.size == 2 && w.ring.rank == 1);
    assert_non_null(w.ring.comm);
    assert_int_equal(splits.refused, 0);
    assert_null(w.of_kind[CP_COMM_ULYSSES]);
    assert_ptr_equal(w.of_kind[CP_COMM_RING], &w.ring);
    assert_ptr_equal(w.of_kind[CP_COMM_SHARD], &w.comm);
    cp_nccl_use_api(NULL, 0);
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "--child")) return child_main(argc, argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_none, clear_env),
        cmocka_unit_test_setup(test_torchrun, clear_env),
        cmocka_unit_test_setup(test_torchrun_single, clear_env),
        cmocka_unit_test_setup(test_openmpi, clear_env),
        cmocka_unit_test_setup(test_pmi_hydra, clear_env),
        cmocka_unit_test_setup(test_pmi_without_local, clear_env),
        cmocka_unit_test_setup(test_slurm_step, clear_env),
        cmocka_unit_test_setup(test_slurm_lists, clear_env),
        cmocka_unit_test_setup(test_slurm_outside_step, clear_env),
        cmocka_unit_test_setup(test_bad_numbers, clear_env),
        cmocka_unit_test_setup(test_ranges, clear_env),
        cmocka_unit_test_setup(test_missing_partner, clear_env),
        cmocka_unit_test_setup(test_meeting_point, clear_env),
        cmocka_unit_test_setup(test_disagreement, clear_env),
        cmocka_unit_test_setup(test_nested, clear_env),
        cmocka_unit_test_setup(test_spawned_env, clear_env),
        cmocka_unit_test_setup(test_free_port, clear_env),
        cmocka_unit_test_setup(test_auto_gpus, clear_env),
        cmocka_unit_test(test_comm_places),
        cmocka_unit_test(test_world_split),
        cmocka_unit_test(test_world_split_ring),
        cmocka_unit_test_setup_teardown(test_spawn_ok, spawn_setup, spawn_teardown),
        cmocka_unit_test_setup_teardown(test_spawn_keeps_user_nvls, spawn_setup, spawn_teardown),
        cmocka_unit_test_setup_teardown(test_spawn_exit_code, spawn_setup, spawn_teardown),
        cmocka_unit_test_setup_teardown(test_spawn_killed, spawn_setup, spawn_teardown),
        cmocka_unit_test_setup_teardown(test_spawn_stubborn, spawn_setup, spawn_teardown),
        cmocka_unit_test_setup_teardown(test_spawn_bad_exe, spawn_setup, spawn_teardown),
        cmocka_unit_test_setup_teardown(test_spawn_forwards_sigterm, spawn_setup, spawn_teardown),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    clear_env(NULL);
    return rc;
}

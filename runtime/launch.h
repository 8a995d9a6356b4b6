/* launch.h: which process of a multi-process run this is, and starting the processes of a one-node run.
 *
 * cp_launch_detect reads rank, world size, local rank and local size from the launcher's environment variables:
 * torchrun-style RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE (also what cp_launch_spawn sets), Open MPI's
 * OMPI_COMM_WORLD_*, MPICH/Intel MPI's PMI_RANK/PMI_SIZE, or a Slurm step's SLURM_PROCID/SLURM_NTASKS/...; with
 * none of them, a single process. cp_launch_spawn is `cpgen run --gpus N` on one node: it starts N copies of this
 * binary with the torchrun-style variables set, and stops them all when one fails. */
#ifndef CP_LAUNCH_H
#define CP_LAUNCH_H

#include <stdbool.h>

typedef enum {
    CP_LAUNCH_NONE,     /* no launcher: rank 0 of 1 */
    CP_LAUNCH_CPGEN,    /* cp_launch_spawn (torchrun-style variables and CPGEN_SPAWNED=1) */
    CP_LAUNCH_TORCHRUN, /* RANK, WORLD_SIZE, ... (torchrun, or set by hand) */
    CP_LAUNCH_OPENMPI,  /* OMPI_COMM_WORLD_RANK, ... */
    CP_LAUNCH_PMI,      /* PMI_RANK, PMI_SIZE (MPICH and Intel MPI's mpiexec) */
    CP_LAUNCH_SLURM,    /* SLURM_PROCID, ... inside an srun step */
} cp_launcher;

typedef struct {
    cp_launcher launcher;
    int rank, size;             /* this process among all of the run's */
    int local_rank, local_size; /* among those on this node: local_rank picks the GPU */
    char master_addr[256];      /* MASTER_ADDR: rank 0's host for the TCP rendezvous; "" when unset */
    int master_port;            /* MASTER_PORT; 0 when unset */
    char rendezvous_file[1024]; /* CPGEN_RENDEZVOUS_FILE: the file rendezvous's path; "" when unset */
    char job_id[128];           /* the same on every rank of one run, "" when unknown: tells a rendezvous file of
                                 * this run from one left by an earlier run */
    char note[512];             /* other launchers' variables that were present and ignored, and why; or "" */
} cp_launch_env;

/* Fill e from the environment. Returns 0, or -1 with a message naming the variable and the fix (not a number, a
 * rank not below the size, a missing partner variable, two launchers that disagree, no meeting point for a run of
 * several processes). */
int cp_launch_detect(cp_launch_env *e, char *err, int errlen);

/* parallel.gpus = "auto": under a launcher (e not NULL, not CP_LAUNCH_NONE) its world size; else the GPUs CUDA sees
 * on this node (`visible`, which CUDA_VISIBLE_DEVICES already narrowed); with none, 1. Writes what it counted into
 * found, for the start-up line; why_none says why no GPU was seen. */
int cp_launch_auto_gpus(const cp_launch_env *e, int visible, const char *why_none, char *found, int n);

/* "torchrun", "Open MPI", ...; "none" for CP_LAUNCH_NONE. */
const char *cp_launcher_name(cp_launcher l);

/* One line for the start-up report: "rank 1 of 4 (local 1 of 4), started by cpgen, rendezvous 127.0.0.1:29500". */
void cp_launch_describe(const cp_launch_env *e, char *buf, int n);

/* A TCP port on 127.0.0.1 that nothing listens on right now (the kernel's choice for port 0). Returns the port, or
 * -1 with the reason. Another process may take it before it is used: callers bind with SO_REUSEADDR soon after. */
int cp_launch_free_port(char *err, int errlen);

typedef struct {
    const char *exe; /* the program to start; NULL: this process's own binary (/proc/self/exe) */
    double grace_s;  /* after SIGTERM, how long a child has before SIGKILL; <= 0: 10 s */
} cp_spawn_opts;

/* Start n copies of opts->exe with arguments argv (argv[0] first, NULL-terminated), each with RANK, WORLD_SIZE,
 * LOCAL_RANK, LOCAL_WORLD_SIZE (local = global: one node), MASTER_ADDR=127.0.0.1, MASTER_PORT=<a free port>,
 * CPGEN_SPAWNED=1 and NCCL_NVLS_ENABLE=0 (unless already set) added to this process's environment, less
 * CPGEN_RENDEZVOUS_FILE (the ranks meet over TCP, not through a file an earlier run may have left), and wait for
 * all of them. SIGINT, SIGTERM and SIGUSR1 sent to this process are passed on to the children while it waits (a
 * terminal's Ctrl-C, which reaches them by itself, is not), and the children are left to stop in order (stop.h:
 * finish the step, save, exit with CP_EXIT_STOPPED), however long that takes; a second SIGINT kills them at once.
 * When a child exits non-zero (other than CP_EXIT_STOPPED) or is killed by a signal, the others get SIGTERM, and
 * SIGKILL if they are still there grace_s later. Returns 0 when every child exited with 0; CP_EXIT_STOPPED (75),
 * with a message, when the ranks stopped in order (a stop signal reached this process or one of them); or -1 with
 * a message naming the first rank that failed and how (or why they could not be started, or the signal that stopped
 * the run when the ranks did not stop in order). opts may be NULL. */
int cp_launch_spawn(int n, char **argv, const cp_spawn_opts *opts, char *err, int errlen);

#endif

/* launch.c: rank and world size from the launcher's environment, and starting the ranks of a one-node run (see
 * launch.h). */
#include "launch.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "stop.h"
#include "util.h"

extern char **environ;

/* Append to a note, separating items with "; ". */
__attribute__((format(printf, 3, 4))) static void note_add(char *note, size_t n, const char *fmt, ...) {
    size_t len = strlen(note);
    if (len + 3 >= n) return;
    if (len) {
        memcpy(note + len, "; ", 3);
        len += 2;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(note + len, n - len, fmt, ap);
    va_end(ap);
}

const char *cp_launcher_name(cp_launcher l) {
    switch (l) {
    case CP_LAUNCH_CPGEN: return "cpgen";
    case CP_LAUNCH_TORCHRUN: return "torchrun";
    case CP_LAUNCH_OPENMPI: return "Open MPI";
    case CP_LAUNCH_PMI: return "PMI";
    case CP_LAUNCH_SLURM: return "Slurm";
    default: return "none";
    }
}

int cp_launch_auto_gpus(const cp_launch_env *e, int visible, const char *why_none, char *found, int n) {
    if (e && e->launcher != CP_LAUNCH_NONE) {
        snprintf(found, (size_t)n, "%d GPU%s, the world size %s started", e->size, e->size == 1 ? "" : "s",
                 cp_launcher_name(e->launcher));
        return e->size;
    }
    if (visible > 0) {
        snprintf(found, (size_t)n, "%d GPU%s visible to CUDA on this node", visible, visible == 1 ? "" : "s");
        return visible;
    }
    snprintf(found, (size_t)n, "no GPU (%.80s), so 1 GPU is planned",
             why_none && *why_none ? why_none : "CUDA sees none");
    return 1;
}

/* ------------------------------------------------------------------------------------------------------------
 * reading the variables */

/* Variable `name` as a whole number >= lo. Returns 0 (present says whether it is set) or -1 with a message. */
static int env_int(const char *name, int lo, int *out, bool *present, char *err, int errlen) {
    const char *s = getenv(name);
    *present = s != NULL;
    if (!s) return 0;
    if (!*s) return cp_errf(err, errlen, "%s is set but empty: give it a whole number, or unset it", name);
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (*end || end == s || s[0] == '+' || s[0] == ' ' || errno == ERANGE || v > INT_MAX || v < INT_MIN)
        return cp_errf(err, errlen, "%s=\"%s\" is not a whole number: it must hold %s", name, s,
                    lo > 0 ? "a count of processes (1 or more)" : "a process index (0 or more)");
    if (v < lo) return cp_errf(err, errlen, "%s=%ld must be %d or more", name, v, lo);
    *out = (int)v;
    return 0;
}

/* One launcher's view of this process. local_rank and local_size are -1 when the launcher does not say. */
typedef struct {
    cp_launcher l;
    bool present;
    int rank, size, local_rank, local_size;
    const char *rank_var, *size_var, *lrank_var, *lsize_var;
} view;

/* Read a rank/size pair and an optional local pair, each pair all-or-nothing. `who` names the launcher for the
 * messages. */
static int read_pairs(view *v, const char *who, char *err, int errlen) {
    bool hr, hs, hlr = false, hls = false;
    if (env_int(v->rank_var, 0, &v->rank, &hr, err, errlen) || env_int(v->size_var, 1, &v->size, &hs, err, errlen))
        return -1;
    if (v->lrank_var && (env_int(v->lrank_var, 0, &v->local_rank, &hlr, err, errlen) ||
                         env_int(v->lsize_var, 1, &v->local_size, &hls, err, errlen)))
        return -1;
    v->present = hr || hs || hlr || hls;
    if (!v->present) return 0;
    if (!hr || !hs) {
        const char *set = hr ? v->rank_var : hs ? v->size_var : hlr ? v->lrank_var : v->lsize_var;
        return cp_errf(err, errlen, "%s is set but %s is not: %s sets both; when setting them by hand, set %s and %s "
                    "(and %s and %s for the rank on this node)", set, !hr ? v->rank_var : v->size_var, who,
                    v->rank_var, v->size_var, v->lrank_var ? v->lrank_var : "", v->lsize_var ? v->lsize_var : "");
    }
    if (hlr != hls)
        return cp_errf(err, errlen, "%s is set but %s is not: set both, or neither", hlr ? v->lrank_var : v->lsize_var,
                    hlr ? v->lsize_var : v->lrank_var);
    if (!hlr) v->local_rank = v->local_size = -1;
    return 0;
}

/* The count for node `node` in a Slurm tasks-per-node list such as "4(x2),3" (nodes 0 and 1 run 4 tasks, node 2
 * runs 3). Returns 0, or -1 when the list cannot be read or is shorter than node + 1. */
static int slurm_tasks_on_node(const char *list, int node, int *out) {
    const char *p = list;
    int first = 0;
    while (*p) {
        char *end;
        long cnt = strtol(p, &end, 10);
        if (end == p || cnt < 1 || cnt > INT_MAX) return -1;
        long rep = 1;
        p = end;
        if (*p == '(') {
            if (p[1] != 'x') return -1;
            rep = strtol(p + 2, &end, 10);
            if (end == p + 2 || *end != ')' || rep < 1 || rep > INT_MAX) return -1;
            p = end + 1;
        }
        if (node < first + rep) {
            *out = (int)cnt;
            return 0;
        }
        first += (int)rep;
        if (*p == ',') p++;
        else if (*p) return -1;
    }
    return -1;
}

/* Slurm sets its variables in an salloc or sbatch shell too (SLURM_PROCID=0 there), which is one process, not a
 * task of a parallel step: only a step started by srun has a SLURM_STEP_ID of its own. The batch, extern and
 * interactive steps use ids near 2^32, which are not srun steps either. */
static bool slurm_in_step(void) {
    const char *s = getenv("SLURM_STEP_ID");
    if (!s) s = getenv("SLURM_STEPID");
    if (!s || !*s) return false;
    char *end;
    unsigned long long id = strtoull(s, &end, 10);
    return !*end && id < 0xfffffff0ull;
}

static int read_slurm(view *v, char *note, size_t notelen, char *err, int errlen) {
    *v = (view){.l = CP_LAUNCH_SLURM, .rank_var = "SLURM_PROCID", .size_var = "SLURM_NTASKS",
                .local_rank = -1, .local_size = -1};
    if (!getenv("SLURM_PROCID")) return 0;
    if (!slurm_in_step()) {
        const char *nt = getenv("SLURM_NTASKS");
        if (nt && strcmp(nt, "1"))
            note_add(note, notelen, "Slurm variables (SLURM_NTASKS=%s) outside an srun step were ignored: this is "
                     "one process; start the run with srun to use several", nt);
        return 0;
    }
    v->present = true;
    bool has;
    if (env_int("SLURM_PROCID", 0, &v->rank, &has, err, errlen)) return -1;
    /* The step's own count: SLURM_NTASKS may describe the whole allocation when srun runs fewer tasks. */
    if (getenv("SLURM_STEP_NUM_TASKS")) v->size_var = "SLURM_STEP_NUM_TASKS";
    if (env_int(v->size_var, 1, &v->size, &has, err, errlen)) return -1;
    if (!has)
        return cp_errf(err, errlen, "SLURM_PROCID is set but neither SLURM_STEP_NUM_TASKS nor SLURM_NTASKS is: this "
                    "srun step does not say how many tasks it has; run with srun -n N, or set RANK, WORLD_SIZE, "
                    "LOCAL_RANK and LOCAL_WORLD_SIZE");
    if (env_int("SLURM_LOCALID", 0, &v->local_rank, &has, err, errlen)) return -1;
    if (!has) v->local_rank = -1;
    else v->lrank_var = "SLURM_LOCALID";
    /* Tasks on this node: the step's list first, since SLURM_NTASKS_PER_NODE repeats the allocation's
     * --ntasks-per-node, which a step with fewer tasks does not follow. */
    int node = 0;
    if (getenv("SLURM_NODEID") && env_int("SLURM_NODEID", 0, &node, &has, err, errlen)) return -1;
    /* SLURM_NTASKS_PER_NODE is one number for every node; the two others are lists, one count per node. */
    const char *lists[] = {"SLURM_STEP_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE"};
    for (int k = 0; k < 3 && v->local_size < 0; k++) {
        const char *s = getenv(lists[k]);
        if (!s) continue;
        if (k == 1) {
            if (env_int(lists[k], 1, &v->local_size, &has, err, errlen)) return -1;
        } else if (slurm_tasks_on_node(s, node, &v->local_size)) {
            return cp_errf(err, errlen, "%s=\"%s\" cannot be read as tasks per node for node %d (SLURM_NODEID): "
                        "expected a list like \"4\" or \"4(x2),3\"", lists[k], s, node);
        }
        v->lsize_var = lists[k];
    }
    return 0;
}

/* The view of the run from each launcher, in order of precedence. A launcher that starts one process per node,
 * which then starts that node's ranks (srun or mpirun running torchrun, MPICH's mpiexec starting its proxies with
 * srun), leaves its own variables in the ranks' environment: the innermost launcher is the one that knows this
 * process, so it comes first. That is why PMI comes before Slurm. */
static int read_views(view v[4], bool *spawned, char *note, size_t notelen, char *err, int errlen) {
    const char *sp = getenv("CPGEN_SPAWNED");
    *spawned = sp && !strcmp(sp, "1");
    v[0] = (view){.l = *spawned ? CP_LAUNCH_CPGEN : CP_LAUNCH_TORCHRUN, .rank_var = "RANK",
                  .size_var = "WORLD_SIZE", .lrank_var = "LOCAL_RANK", .lsize_var = "LOCAL_WORLD_SIZE"};
    if (read_pairs(&v[0], "torchrun", err, errlen)) return -1;
    if (*spawned && !v[0].present)
        return cp_errf(err, errlen, "CPGEN_SPAWNED=1 but RANK and WORLD_SIZE are not set: the variable was copied "
                    "from a process that cpgen started; unset CPGEN_SPAWNED");
    v[1] = (view){.l = CP_LAUNCH_OPENMPI, .rank_var = "OMPI_COMM_WORLD_RANK", .size_var = "OMPI_COMM_WORLD_SIZE",
                  .lrank_var = "OMPI_COMM_WORLD_LOCAL_RANK", .lsize_var = "OMPI_COMM_WORLD_LOCAL_SIZE"};
    if (read_pairs(&v[1], "Open MPI's mpirun", err, errlen)) return -1;
    /* Hydra (MPICH, Intel MPI) names the rank on the node MPI_LOCALRANKID; Cray's PMI, PMI_LOCAL_RANK. */
    bool hydra_local = getenv("MPI_LOCALRANKID") || getenv("MPI_LOCALNRANKS");
    v[2] = (view){.l = CP_LAUNCH_PMI, .rank_var = "PMI_RANK", .size_var = "PMI_SIZE",
                  .lrank_var = hydra_local ? "MPI_LOCALRANKID" : "PMI_LOCAL_RANK",
                  .lsize_var = hydra_local ? "MPI_LOCALNRANKS" : "PMI_LOCAL_SIZE"};
    if (read_pairs(&v[2], "mpiexec", err, errlen)) return -1;
    return read_slurm(&v[3], note, notelen, err, errlen);
}

static int check_view(const view *v, char *err, int errlen) {
    if (v->rank >= v->size)
        return cp_errf(err, errlen, "%s=%d is not below %s=%d: ranks count from 0, so it must be 0 to %d", v->rank_var,
                    v->rank, v->size_var, v->size, v->size - 1);
    if (v->local_size < 0 || v->local_rank < 0) {
        if (v->size == 1) return 0;
        bool torchrun = v->l == CP_LAUNCH_TORCHRUN || v->l == CP_LAUNCH_CPGEN;
        const char *missing = v->local_rank < 0 && v->local_size < 0 ? "the rank on the node and how many ranks it has"
                              : v->local_rank < 0                    ? "the rank on the node"
                                                                     : "how many ranks the node has";
        return cp_errf(err, errlen, "%s=%d of %s=%d is set, but %s does not say %s, which picks the GPU: %s",
                    v->rank_var, v->rank, v->size_var, v->size, cp_launcher_name(v->l), missing,
                    torchrun ? "set LOCAL_RANK and LOCAL_WORLD_SIZE as well"
                             : "set RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE for each process instead (they "
                               "take precedence over the launcher's)");
    }
    if (v->local_rank >= v->local_size)
        return cp_errf(err, errlen, "%s=%d is not below %s=%d: the rank on this node counts from 0, so it must be 0 to "
                    "%d", v->lrank_var, v->local_rank, v->lsize_var, v->local_size, v->local_size - 1);
    if (v->local_size > v->size)
        return cp_errf(err, errlen, "%s=%d is larger than %s=%d: a node cannot run more ranks than the whole run has",
                    v->lsize_var, v->local_size, v->size_var, v->size);
    return 0;
}

/* Another launcher's variables, present too. When it counts the same processes it must agree with the chosen one;
 * with another count it is an outer launch (one process per node that started this one) and says nothing about
 * this process. torchrun's own rendezvous and cp_launch_spawn assign ranks themselves, so after them any outer
 * launcher's numbers are ignored even when the counts match. */
static int check_other(const view *c, const view *o, bool inner_assigns, char *note, size_t notelen, char *err,
                       int errlen) {
    if (inner_assigns || o->size != c->size) {
        note_add(note, notelen, "%s variables (%s=%d, %s=%d) were ignored: they describe the launch that started "
                 "%s", cp_launcher_name(o->l), o->rank_var, o->rank, o->size_var, o->size, cp_launcher_name(c->l));
        return 0;
    }
    const char *fix = c->l == CP_LAUNCH_TORCHRUN
                          ? "if RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE were set by hand or left over from "
                            "another run, unset them and let the launcher decide"
                          : "start the run with one launcher, and unset the other's variables if they were set by hand";
    if (o->rank != c->rank)
        return cp_errf(err, errlen, "%s=%d but %s=%d, and both count %d processes: %s and %s disagree about which "
                    "process this is; %s", c->rank_var, c->rank, o->rank_var, o->rank, c->size,
                    cp_launcher_name(c->l), cp_launcher_name(o->l), fix);
    if (c->local_size >= 0 && o->local_size >= 0 &&
        (o->local_rank != c->local_rank || o->local_size != c->local_size))
        return cp_errf(err, errlen, "%s=%d of %s=%d but %s=%d of %s=%d: %s and %s disagree about the ranks on this "
                    "node; %s", c->lrank_var, c->local_rank, c->lsize_var, c->local_size, o->lrank_var,
                    o->local_rank, o->lsize_var, o->local_size, cp_launcher_name(c->l), cp_launcher_name(o->l), fix);
    return 0;
}

/* Where the ranks meet: MASTER_ADDR and MASTER_PORT for the TCP rendezvous, CPGEN_RENDEZVOUS_FILE for the file
 * one. A run of several processes needs one of them. */
static int read_meeting(cp_launch_env *e, char *err, int errlen) {
    const char *a = getenv("MASTER_ADDR"), *f = getenv("CPGEN_RENDEZVOUS_FILE");
    bool hp;
    int port = 0;
    if (env_int("MASTER_PORT", 1, &port, &hp, err, errlen)) return -1;
    if (hp && port > 65535) return cp_errf(err, errlen, "MASTER_PORT=%d is not a TCP port: use 1 to 65535", port);
    if (a && !*a) return cp_errf(err, errlen, "MASTER_ADDR is set but empty: give rank 0's host name or address");
    if (a && strlen(a) >= sizeof e->master_addr)
        return cp_errf(err, errlen, "MASTER_ADDR is %zu characters long: a host name has at most 255", strlen(a));
    if (f && !*f) return cp_errf(err, errlen, "CPGEN_RENDEZVOUS_FILE is set but empty: give a path in a shared folder");
    if (f && strlen(f) >= sizeof e->rendezvous_file)
        return cp_errf(err, errlen, "CPGEN_RENDEZVOUS_FILE is %zu characters long: use a shorter path", strlen(f));
    if (a && !hp && !f)
        return cp_errf(err, errlen, "MASTER_ADDR=%s is set but MASTER_PORT is not: set MASTER_PORT to a free TCP port on "
                    "that host (e.g. 29500)", a);
    if (hp && !a && !f)
        return cp_errf(err, errlen, "MASTER_PORT=%d is set but MASTER_ADDR is not: set MASTER_ADDR to rank 0's host "
                    "name or address", port);
    if (a) snprintf(e->master_addr, sizeof e->master_addr, "%s", a);
    e->master_port = hp ? port : 0;
    if (f) snprintf(e->rendezvous_file, sizeof e->rendezvous_file, "%s", f);
    if (e->size > 1 && !f && !(a && hp))
        return cp_errf(err, errlen, "rank %d of %d (started by %s) has no meeting point with the other ranks: set "
                    "MASTER_ADDR and MASTER_PORT to rank 0's host and a free port on it (e.g. mpirun -x "
                    "MASTER_ADDR=node1 -x MASTER_PORT=29500), or CPGEN_RENDEZVOUS_FILE to a path in a folder every "
                    "node shares", e->rank, e->size, cp_launcher_name(e->launcher));
    return 0;
}

/* An identifier every rank of one run shares (and a later run does not), from the launchers that have one. */
static void read_job_id(cp_launch_env *e) {
    const char *names[] = {"CPGEN_RUN_ID", "TORCHELASTIC_RUN_ID", "PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid"};
    for (int k = 0; k < 4; k++) {
        const char *s = getenv(names[k]);
        if (s && *s) {
            snprintf(e->job_id, sizeof e->job_id, "%s", s);
            return;
        }
    }
    const char *job = getenv("SLURM_JOB_ID"), *step = getenv("SLURM_STEP_ID");
    if (job && *job) snprintf(e->job_id, sizeof e->job_id, "slurm-%s.%s", job, step ? step : "");
}

int cp_launch_detect(cp_launch_env *e, char *err, int errlen) {
    memset(e, 0, sizeof *e);
    e->size = e->local_size = 1;
    view v[4];
    bool spawned;
    if (read_views(v, &spawned, e->note, sizeof e->note, err, errlen)) return -1;
    int c = -1;
    for (int k = 0; k < 4 && c < 0; k++)
        if (v[k].present) c = k;
    if (c >= 0) {
        if (check_view(&v[c], err, errlen)) return -1;
        bool inner_assigns = spawned || (c == 0 && getenv("TORCHELASTIC_RUN_ID"));
        for (int k = c + 1; k < 4; k++)
            if (v[k].present && check_other(&v[c], &v[k], inner_assigns, e->note, sizeof e->note, err, errlen))
                return -1;
        e->launcher = v[c].l;
        e->rank = v[c].rank;
        e->size = v[c].size;
        bool local_known = v[c].local_size >= 0 && v[c].local_rank >= 0; /* else a world of one */
        e->local_rank = local_known ? v[c].local_rank : 0;
        e->local_size = local_known ? v[c].local_size : 1;
    }
    read_job_id(e);
    return read_meeting(e, err, errlen);
}

void cp_launch_describe(const cp_launch_env *e, char *buf, int n) {
    if (e->size == 1 && e->launcher == CP_LAUNCH_NONE) {
        snprintf(buf, (size_t)n, "one process (no launcher)");
        return;
    }
    int k = snprintf(buf, (size_t)n, "rank %d of %d (local %d of %d), started by %s", e->rank, e->size, e->local_rank,
                     e->local_size, cp_launcher_name(e->launcher));
    if (k < 0 || k >= n) return;
    if (e->rendezvous_file[0]) snprintf(buf + k, (size_t)(n - k), ", rendezvous file %s", e->rendezvous_file);
    else if (e->master_addr[0]) snprintf(buf + k, (size_t)(n - k), ", rendezvous %s:%d", e->master_addr, e->master_port);
}

int cp_launch_free_port(char *err, int errlen) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return cp_errf(err, errlen, "cannot create a TCP socket to find a free port: %s", strerror(errno));
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = 0, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof sa;
    int rc = -1;
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0)
        cp_errf(err, errlen, "cannot bind a TCP socket on 127.0.0.1 to find a free port: %s", strerror(errno));
    else if (getsockname(fd, (struct sockaddr *)&sa, &len) != 0)
        cp_errf(err, errlen, "getsockname on 127.0.0.1 failed: %s", strerror(errno));
    else
        rc = ntohs(sa.sin_port);
    close(fd);
    return rc;
}

/* ------------------------------------------------------------------------------------------------------------
 * spawn */

static volatile sig_atomic_t spawn_signal;     /* the first stop signal received while waiting */
static volatile sig_atomic_t spawn_forward;    /* and whether to pass it on to the children */
static volatile sig_atomic_t spawn_interrupts; /* SIGINTs received: the second aborts every rank at once */

static void on_stop_signal(int sig, siginfo_t *si, void *uc) {
    (void)uc;
    if (sig == SIGINT) spawn_interrupts++;
    if (spawn_signal) return;
    spawn_signal = sig;
    /* A terminal's Ctrl-C goes to the whole foreground process group, the children included (the kernel sends it:
     * SI_KERNEL); passing it on would deliver it twice. A signal that a process sent to this one alone (kill, a
     * scheduler, timeout) is passed on. */
    if (!si || si->si_code != SI_KERNEL) spawn_forward = 1;
}

static void sleep_s(double s) {
    struct timespec t = {.tv_sec = (time_t)s, .tv_nsec = (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&t, NULL);
}

static void describe_status(int st, char *buf, size_t n) {
    if (WIFEXITED(st)) snprintf(buf, n, "exited with code %d", WEXITSTATUS(st));
    else if (WIFSIGNALED(st))
        snprintf(buf, n, "was killed by signal %d (%s)%s", WTERMSIG(st), strsignal(WTERMSIG(st)),
                 WCOREDUMP(st) ? ", core dumped" : "");
    else snprintf(buf, n, "stopped with status 0x%x", st);
}

/* The children's environments: this one without the variables spawn sets, plus them. */
static bool spawn_owns(const char *kv) {
    static const char *const own[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                                      "MASTER_PORT", "CPGEN_SPAWNED", "CPGEN_RENDEZVOUS_FILE"};
    for (size_t k = 0; k < sizeof own / sizeof own[0]; k++) {
        size_t l = strlen(own[k]);
        if (!strncmp(kv, own[k], l) && kv[l] == '=') return true;
    }
    return false;
}

/* Each child's environment array, and the rank's own strings it points into. */
typedef struct {
    char **env;
    char own[256];
} child_env;

static void free_envs(child_env *c, int n) {
    if (!c) return;
    for (int r = 0; r < n; r++) free(c[r].env);
    free(c);
}

static child_env *build_envs(int n, int port) {
    size_t base = 0;
    for (char **p = environ; *p; p++) base++;
    child_env *c = calloc((size_t)n, sizeof *c);
    if (!c) return NULL;
    bool nvls_set = getenv("NCCL_NVLS_ENABLE") != NULL;
    for (int r = 0; r < n; r++) {
        char **e = c[r].env = calloc(base + 10, sizeof *e);
        if (!e) {
            free_envs(c, n);
            return NULL;
        }
        size_t k = 0;
        for (char **p = environ; *p; p++)
            if (!spawn_owns(*p)) e[k++] = *p;
        e[k++] = "CPGEN_SPAWNED=1";
        e[k++] = "MASTER_ADDR=127.0.0.1";
        /* NVLink SHARP (multicast) is off unless the user turned it on: it needs the fabric manager's multicast
         * setup, which shared machines often lack, and NCCL then fails at communicator creation. */
        if (!nvls_set) e[k++] = "NCCL_NVLS_ENABLE=0";
        char *o = c[r].own;
        size_t left = sizeof c[r].own;
        const char *fmt[] = {"RANK=%d", "LOCAL_RANK=%d", "WORLD_SIZE=%d", "LOCAL_WORLD_SIZE=%d", "MASTER_PORT=%d"};
        int val[] = {r, r, n, n, port};
        for (int j = 0; j < 5; j++) {
            int w = snprintf(o, left, fmt[j], val[j]);
            e[k++] = o;
            o += w + 1;
            left -= (size_t)w + 1;
        }
        e[k] = NULL;
    }
    return c;
}

/* Signal every child still running. */
static void signal_all(const pid_t *pid, const bool *done, int n, int sig) {
    for (int r = 0; r < n; r++)
        if (!done[r] && pid[r] > 0) kill(pid[r], sig);
}

int cp_launch_spawn(int n, char **argv, const cp_spawn_opts *opts, char *err, int errlen) {
    if (n < 1 || n > 4096) return cp_errf(err, errlen, "cannot start %d processes: give 1 to 4096", n);
    if (!argv || !argv[0]) return cp_errf(err, errlen, "cp_launch_spawn: argv must hold at least the program name");
    const char *sp = getenv("CPGEN_SPAWNED");
    if (sp && !strcmp(sp, "1"))
        return cp_errf(err, errlen, "this process was itself started by cpgen (CPGEN_SPAWNED=1): it does not start "
                    "more; run `cpgen run --gpus N` from a shell, not from a rank");
    double grace = opts && opts->grace_s > 0 ? opts->grace_s : 10.0;
    char exe[PATH_MAX];
    if (opts && opts->exe) snprintf(exe, sizeof exe, "%s", opts->exe);
    else {
        ssize_t l = readlink("/proc/self/exe", exe, sizeof exe - 1);
        if (l < 0) return cp_errf(err, errlen, "cannot find this program's path in /proc/self/exe: %s", strerror(errno));
        exe[l] = 0;
    }
    int port = cp_launch_free_port(err, errlen);
    if (port < 0) return -1;
    child_env *envs = build_envs(n, port);
    pid_t *pid = calloc((size_t)n, sizeof *pid);
    bool *done = calloc((size_t)n, sizeof *done);
    if (!envs || !pid || !done) {
        free_envs(envs, n);
        free(pid);
        free(done);
        return cp_errf(err, errlen, "out of memory starting %d processes", n);
    }

    /* Stop signals are blocked around each fork so that one arriving in between reaches a child only after it has
     * dropped this process's handler, and dies as it should, instead of being swallowed before exec. SIGCHLD must
     * not be ignored, or the children are reaped by the kernel and their exit codes lost. */
    struct sigaction sa = {.sa_sigaction = on_stop_signal, .sa_flags = SA_SIGINFO}, old_int, old_term, old_usr1,
                     old_chld;
    sigemptyset(&sa.sa_mask);
    struct sigaction dfl = {.sa_handler = SIG_DFL};
    sigemptyset(&dfl.sa_mask);
    sigset_t stop, old_mask;
    sigemptyset(&stop);
    sigaddset(&stop, SIGINT);
    sigaddset(&stop, SIGTERM);
    sigaddset(&stop, SIGUSR1);
    spawn_signal = spawn_forward = spawn_interrupts = 0;
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    sigaction(SIGUSR1, &sa, &old_usr1);
    sigaction(SIGCHLD, &dfl, &old_chld);

    int rc = 0, started = 0;
    pid_t parent = getpid();
    for (int r = 0; r < n && !spawn_signal; r++) {
        int pfd[2];
        if (pipe2(pfd, O_CLOEXEC) != 0) {
            rc = cp_errf(err, errlen, "cannot start rank %d of %d: pipe: %s", r, n, strerror(errno));
            break;
        }
        sigprocmask(SIG_BLOCK, &stop, &old_mask);
        pid_t p = fork();
        if (p == 0) {
            /* The child: back to default signal handling, die with the launcher (so no rank outlives a killed
             * `cpgen run`), and report a failed exec through the pipe, which closes by itself when exec works. */
            sigaction(SIGINT, &dfl, NULL);
            sigaction(SIGTERM, &dfl, NULL);
            sigaction(SIGUSR1, &dfl, NULL);
            sigaction(SIGCHLD, &old_chld, NULL);
            sigprocmask(SIG_SETMASK, &old_mask, NULL);
            close(pfd[0]);
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (getppid() != parent) _exit(126);
            execve(exe, argv, envs[r].env);
            int e = errno;
            ssize_t w = write(pfd[1], &e, sizeof e);
            (void)w;
            _exit(127);
        }
        int fork_errno = errno;
        sigprocmask(SIG_SETMASK, &old_mask, NULL);
        close(pfd[1]);
        if (p < 0) {
            close(pfd[0]);
            rc = cp_errf(err, errlen, "cannot start rank %d of %d: fork: %s", r, n, strerror(fork_errno));
            break;
        }
        pid[r] = p;
        started++;
        int child_errno = 0;
        ssize_t got;
        while ((got = read(pfd[0], &child_errno, sizeof child_errno)) < 0 && errno == EINTR) {}
        close(pfd[0]);
        if (got == (ssize_t)sizeof child_errno) {
            waitpid(p, NULL, 0);
            done[r] = true;
            rc = cp_errf(err, errlen, "cannot start rank %d of %d: cannot run %s: %s", r, n, exe, strerror(child_errno));
            break;
        }
    }

    /* Wait for every child. The first failure makes the rest get SIGTERM, then SIGKILL once the grace period is over,
     * so that no rank stays behind waiting for a peer that is gone. A stop signal (SIGTERM, SIGUSR1, SIGINT) is
     * passed on and the ranks are left to stop in order (they finish the step, save and exit with CP_EXIT_STOPPED),
     * however long that takes; a second SIGINT kills them at once. */
    int alive = 0;
    for (int r = 0; r < started; r++) alive += !done[r];
    int first_rank = -1, first_status = 0, stop_sig = 0, killed = 0, killed_rank = -1, in_order = 0;
    bool failing = rc != 0, sent_kill = false, aborted = false;
    double deadline = failing ? cp_now() + grace : 0;
    if (failing) signal_all(pid, done, started, SIGTERM);
    while (alive > 0) {
        bool reaped = false;
        for (int r = 0; r < started; r++) {
            if (done[r]) continue;
            int st;
            pid_t w = waitpid(pid[r], &st, WNOHANG);
            if (w == 0) continue;
            if (w < 0 && errno == EINTR) continue;
            done[r] = true;
            alive--;
            reaped = true;
            if (w < 0) continue; /* not our child any more: nothing to report */
            if (WIFEXITED(st) && WEXITSTATUS(st) == CP_EXIT_STOPPED) { /* stopped in order when asked: not a failure */
                in_order++;
                continue;
            }
            bool ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
            bool by_stop = stop_sig && WIFSIGNALED(st) && WTERMSIG(st) == stop_sig; /* a rank without handlers */
            if (!ok && !by_stop && !failing && !aborted && first_rank < 0) {
                first_rank = r;
                first_status = st;
            }
        }
        if (spawn_signal && !stop_sig) {
            stop_sig = spawn_signal;
            if (spawn_forward) signal_all(pid, done, started, stop_sig);
        }
        if (spawn_interrupts >= 2 && !sent_kill) { /* a second Ctrl-C: no waiting for an orderly stop */
            aborted = true;
            for (int r = 0; r < started; r++)
                if (!done[r]) killed++, killed_rank = r;
            signal_all(pid, done, started, SIGKILL);
            sent_kill = true;
        }
        if (!failing && first_rank >= 0) {
            failing = true;
            deadline = cp_now() + grace;
            signal_all(pid, done, started, SIGTERM);
        }
        if (failing && !sent_kill && alive > 0 && cp_now() >= deadline) {
            for (int r = 0; r < started; r++)
                if (!done[r]) {
                    killed++;
                    killed_rank = r;
                }
            signal_all(pid, done, started, SIGKILL);
            sent_kill = true;
        }
        if (alive > 0 && !reaped) sleep_s(0.01);
    }

    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    sigaction(SIGUSR1, &old_usr1, NULL);
    sigaction(SIGCHLD, &old_chld, NULL);

    char what[160] = "", kill_note[200] = "", sig[32] = "?";
    if (stop_sig && sigabbrev_np(stop_sig)) snprintf(sig, sizeof sig, "%s", sigabbrev_np(stop_sig));
    if (aborted)
        snprintf(kill_note, sizeof kill_note, "; a second SIGINT: %d rank%s killed with SIGKILL", killed,
                 killed == 1 ? "" : "s");
    else if (killed == 1)
        snprintf(kill_note, sizeof kill_note, "; rank %d did not exit within %.3g s of SIGTERM and was killed with "
                 "SIGKILL", killed_rank, grace);
    else if (killed > 1)
        snprintf(kill_note, sizeof kill_note, "; %d ranks did not exit within %.3g s of SIGTERM and were killed with "
                 "SIGKILL", killed, grace);
    if (rc == 0 && first_rank >= 0) {
        describe_status(first_status, what, sizeof what);
        rc = cp_errf(err, errlen, "rank %d of %d (pid %d) %s; the other ranks were stopped%s", first_rank, n,
                  (int)pid[first_rank], what, kill_note);
    } else if (rc == 0 && in_order > 0 && !aborted) {
        /* every rank that ended did so in order (or with 0): the run stopped where the ranks agreed, saved */
        if (stop_sig)
            cp_errf(err, errlen, "stopped by SIG%s (signal %d)%s: %d of %d ranks stopped in order (exit %d)", sig,
                    stop_sig, spawn_forward ? ", passed on to every rank" : "", in_order, n, CP_EXIT_STOPPED);
        else
            cp_errf(err, errlen, "a stop signal reached a rank: %d of %d ranks stopped in order (exit %d)", in_order,
                    n, CP_EXIT_STOPPED);
        rc = CP_EXIT_STOPPED;
    } else if (rc == 0 && stop_sig) {
        rc = cp_errf(err, errlen, "stopped by SIG%s (signal %d)%s%s", sig, stop_sig,
                     spawn_forward ? ", passed on to every rank" : "", kill_note);
    } else if (rc != 0 && kill_note[0]) {
        size_t l = strlen(err);
        snprintf(err + l, (size_t)errlen > l ? (size_t)errlen - l : 0, "%s", kill_note);
    }
    free_envs(envs, n);
    free(pid);
    free(done);
    return rc;
}

/* test_hostile.c: every command of the cpgen binary, and every file it reads and writes, given the input of a careless
 * or hostile user: a spec, cache, metrics file or `latest` that is a FIFO or a link to /dev/zero, a 5 GB spec, a
 * bundle whose cubin is a device, an output path that is the input or holds the user's files, a folder that cannot
 * be written, a full disk. Each case runs in a child in a folder of its own, with 2 GiB of address space and 10 s of
 * wall time, and fails, named, if the child crashes (a signal), runs past its time, hits the memory bound, exits 0
 * after a failure (or not 0 where it should work), does not say what the case expects, changes or removes a file the
 * case put there to be kept, or leaves a temporary file behind.
 *
 * The commands run as the real build/cpgen (cases of the CPU machine: no GPU, so `run` prints the plan and checks
 * what it would read and write). Readers that only a GPU run reaches (token shards, Hugging Face weights, the
 * rendezvous file) are called in a forked child of this test instead.
 *
 * A full disk is a file size limit (RLIMIT_FSIZE, SIGXFSZ ignored: writes fail with EFBIG as they would with
 * ENOSPC) or /dev/full; a folder that cannot be written is one of mode 0555, the case run as the user nobody when the
 * test runs as root (root writes anywhere). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <grp.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "checkpoint.h"
#include "data.h"
#include "rendezvous.h"
#include "safetensors.h"
#include "sh.h"
#include "source_tree.h"
#include "spec.h"
#include "tmpdir.h"
#include "util.h"
#include "weights.h"

#define CASE_SECONDS 10
#define CASE_MEMORY ((rlim_t)2 << 30)
#define MEMORY_SEEN_KB (1536L * 1024) /* a peak resident size above this is a read without a bound */
#define SMALL_FILE_BYTES (4 << 10)    /* the "full disk": no file may grow past this (stdout to /dev/null) */

enum { OK, FAIL, ANY };
enum {
    AS_USER = 1,     /* as nobody when root, so that a 0555 folder cannot be written */
    SMALL_FILES = 2, /* RLIMIT_FSIZE: a full disk */
    NVRTC = 4,       /* needs kernels compiled (aot, build): skipped where NVRTC is missing */
    SPEC_LIMIT = 8,  /* stopped by the spec's own 10 s limit: it may take that and a moment to say so */
};

typedef struct {
    const char *name;
    const char *setup; /* sh commands run first in the case's folder ($CPGEN, $ROOT set); NULL: none */
    const char *env;   /* VAR=value words put before the command (sh expands them); NULL: none */
    const char *args;  /* cpgen's arguments and redirections, as sh reads them */
    int want;          /* OK: exit 0; FAIL: exit non-zero; ANY */
    const char *says;  /* text the output must hold; NULL: no check */
    const char *keep;  /* files (space-separated, in the case's folder) that must be left exactly as the setup made
                        * them */
    unsigned flags;
    const char *then; /* a shell check run after the case that must exit 0; NULL: none */
} hcase;

static char root[256], cpgen[512];
static bool have_nvrtc;

/* ---------------------------------------------------------------- running a child within the bounds */

typedef struct {
    int status;   /* exit status, when exited */
    bool exited, hung, signaled;
    int signal;
    long maxrss_kb;
    double seconds;
} outcome;

typedef void (*child_fn)(const void *arg);

/* Run fn(arg) in a child in folder dir, its stdout and stderr into log, under the case's bounds; it must not return
 * (it execs or _exits). */
static void spawn(const char *dir, const char *log, unsigned flags, int seconds, child_fn fn, const void *arg,
                  outcome *o) {
    memset(o, 0, sizeof *o);
    int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    assert_true(fd >= 0);
    double t0 = cp_now();
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        setpgid(0, 0); /* its own group: a timeout kills whatever it started */
        int in = open("/dev/null", O_RDONLY);
        if (in < 0 || dup2(in, 0) < 0 || dup2(fd, 1) < 0 || dup2(fd, 2) < 0 || chdir(dir) != 0) _exit(125);
        struct rlimit as = {CASE_MEMORY, CASE_MEMORY};
        if (setrlimit(RLIMIT_AS, &as) != 0) _exit(125);
        if (flags & SMALL_FILES) {
            struct rlimit fs = {SMALL_FILE_BYTES, SMALL_FILE_BYTES};
            signal(SIGXFSZ, SIG_IGN); /* kept across exec: a write past the limit fails instead of killing */
            if (setrlimit(RLIMIT_FSIZE, &fs) != 0) _exit(125);
        }
        if ((flags & AS_USER) && geteuid() == 0 &&
            (setgroups(0, NULL) != 0 || setgid(65534) != 0 || setuid(65534) != 0))
            _exit(125);
        fn(arg);
        _exit(125);
    }
    close(fd);
    setpgid(pid, pid);
    struct rusage ru;
    int st = 0;
    for (;;) {
        pid_t w = wait4(pid, &st, WNOHANG, &ru);
        if (w == pid) break;
        assert_true(w == 0 || errno == EINTR);
        if (cp_now() - t0 > seconds) {
            o->hung = true;
            kill(-pid, SIGKILL);
            while (wait4(pid, &st, 0, &ru) < 0 && errno == EINTR) {
            }
            break;
        }
        struct timespec ts = {0, 5 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    kill(-pid, SIGKILL); /* anything it left running */
    o->seconds = cp_now() - t0;
    o->maxrss_kb = ru.ru_maxrss;
    o->exited = WIFEXITED(st);
    o->status = o->exited ? WEXITSTATUS(st) : -1;
    o->signaled = !o->hung && WIFSIGNALED(st);
    o->signal = WIFSIGNALED(st) ? WTERMSIG(st) : 0;
}

static void exec_shell(const void *line) {
    execl("/bin/sh", "sh", "-c", (const char *)line, (char *)NULL);
}

/* ---------------------------------------------------------------- what a case must leave as it was */

typedef struct {
    char path[512];
    bool exists;
    struct stat st;
    char *content; /* a regular file up to 1 MiB, or a link's target */
} snap;

static void take(const char *dir, const char *rel, snap *s) {
    memset(s, 0, sizeof *s);
    snprintf(s->path, sizeof s->path, "%s/%s", dir, rel);
    s->exists = lstat(s->path, &s->st) == 0;
    if (!s->exists) return;
    if (S_ISLNK(s->st.st_mode)) {
        char t[PATH_MAX];
        ssize_t n = readlink(s->path, t, sizeof t - 1);
        t[n < 0 ? 0 : n] = 0;
        s->content = cp_xstrdup(t);
    } else if (S_ISREG(s->st.st_mode) && s->st.st_size <= (1 << 20)) {
        s->content = cp_read_file(s->path, NULL);
    }
}

/* NULL when b shows what a showed; else what changed. */
static const char *changed(const snap *a, const snap *b) {
    if (!b->exists) return "removed";
    if ((a->st.st_mode & S_IFMT) != (b->st.st_mode & S_IFMT)) return "replaced by another kind of file";
    if (a->st.st_ino != b->st.st_ino) return "replaced";
    if (a->st.st_size != b->st.st_size || a->st.st_mtim.tv_sec != b->st.st_mtim.tv_sec ||
        a->st.st_mtim.tv_nsec != b->st.st_mtim.tv_nsec)
        return "written";
    if ((a->content == NULL) != (b->content == NULL) || (a->content && strcmp(a->content, b->content)))
        return "changed";
    return NULL;
}

/* ---------------------------------------------------------------- temporary files left behind */

static char litter[512];
static int find_litter(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)flag;
    if (strstr(path + ftw->base, ".tmp.")) {
        snprintf(litter, sizeof litter, "%s", path);
        return 1;
    }
    return 0;
}

/* ---------------------------------------------------------------- one case */

static void shell(const char *dir, const char *cmd) {
    char full[2000], *out;
    snprintf(full, sizeof full, "cd '%.400s' && { %.1500s; }", dir, cmd);
    int rc = sh(full, &out);
    if (rc != 0) fail_msg("setup failed (exit %d): %s\n%s", rc, cmd, out);
    free(out);
}

/* why, after writing the message into it: for `bad = note(...)`. */
static const char *note(char *why, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static const char *note(char *why, size_t n, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, n, fmt, ap);
    va_end(ap);
    return why;
}

/* What went wrong with o, or NULL. why gets room for a message. */
static const char *judge_outcome(const outcome *o, const char *out, int want, const char *says, char *why, size_t n) {
    if (o->hung) return note(why, n, "ran past its %.0f s", o->seconds);
    if (o->signaled) return note(why, n, "crashed: killed by signal %d (%s)", o->signal, strsignal(o->signal));
    if (o->maxrss_kb > MEMORY_SEEN_KB || strstr(out, "out of host memory"))
        return note(why, n, "used %ld MiB at its peak, near the 2 GiB bound (a read without a bound?)",
                    o->maxrss_kb / 1024);
    if (o->status >= 125) return note(why, n, "the case could not run (exit %d)", o->status);
    if (want == FAIL && o->status == 0) return note(why, n, "exited 0 after a failure");
    if (want == OK && o->status != 0) return note(why, n, "exited %d where it should work", o->status);
    if (says && !strstr(out, says)) return note(why, n, "did not say \"%s\"", says);
    return NULL;
}

/* Run case c; returns false (and prints why) when it failed. */
static bool run_case(const hcase *c) {
    char dir[400], log[400], why[1024] = "";
    const char *bad = NULL;
    snprintf(dir, sizeof dir, "%s/cases/%s", root, c->name);
    snprintf(log, sizeof log, "%s/logs/%s.log", root, c->name);
    if ((c->flags & NVRTC) && !have_nvrtc) {
        printf("  skip  %-34s (no NVRTC here)\n", c->name);
        return true;
    }
    assert_int_equal(cp_mkdir_p(dir), 0);
    assert_int_equal(chmod(dir, 0755), 0);
    if (c->setup) shell(dir, c->setup);
    if (c->flags & AS_USER) shell(dir, "chmod -R a+rX .");
    snap keep[8];
    int nkeep = 0;
    if (c->keep) {
        char list[512], *save = NULL;
        snprintf(list, sizeof list, "%s", c->keep);
        for (char *w = strtok_r(list, " ", &save); w && nkeep < 8; w = strtok_r(NULL, " ", &save))
            take(dir, w, &keep[nkeep++]);
    }
    char line[2048];
    if (c->env) snprintf(line, sizeof line, "exec env %s \"$CPGEN\" %s", c->env, c->args);
    else snprintf(line, sizeof line, "exec \"$CPGEN\" %s", c->args);
    outcome o;
    spawn(dir, log, c->flags, (c->flags & SPEC_LIMIT) ? CASE_SECONDS + 2 : CASE_SECONDS, exec_shell, line, &o);
    char *out = cp_read_file(log, NULL);
    if (!out) out = cp_xstrdup("");
    bad = judge_outcome(&o, out, c->want, c->says, why, sizeof why);
    for (int k = 0; k < nkeep && !bad; k++) {
        snap now;
        take(dir, keep[k].path + strlen(dir) + 1, &now);
        const char *what = changed(&keep[k], &now);
        if (what) bad = note(why, sizeof why, "%s %s", what, keep[k].path + strlen(dir) + 1);
        free(now.content);
    }
    litter[0] = 0;
    if (!bad && nftw(dir, find_litter, 16, FTW_PHYS) == 1)
        bad = note(why, sizeof why, "left a temporary file %s", litter);
    if (!bad && c->then) {
        char tlog[480];
        snprintf(tlog, sizeof tlog, "%s/logs/%s.then.log", root, c->name);
        outcome t;
        spawn(dir, tlog, 0, CASE_SECONDS, exec_shell, c->then, &t);
        char *tout = cp_read_file(tlog, NULL);
        bad = judge_outcome(&t, tout ? tout : "", OK, NULL, why, sizeof why);
        if (bad) {
            char w2[1100];
            snprintf(w2, sizeof w2, "the check after it (%.200s) %.400s: %.200s", c->then, why, tout ? tout : "");
            snprintf(why, sizeof why, "%.1000s", w2);
        }
        free(tout);
    }
    for (int k = 0; k < nkeep; k++) free(keep[k].content);
    size_t ol = strlen(out);
    const char *tail = ol > 600 ? out + ol - 600 : out;
    if (!bad) printf("  ok    %-34s (%.2f s, exit %d)\n", c->name, o.seconds, o.status);
    else printf("  FAIL  %-34s %s\n        cpgen %s\n        output: %s\n", c->name, why, c->args, tail);
    free(out);
    return !bad;
}

/* Run every case of the table; the names of those that failed are appended to failed. */
static void run_table(const hcase *cases, size_t n, cp_str *failed) {
    double t0 = cp_now();
    for (size_t i = 0; i < n; i++)
        if (!run_case(&cases[i])) cp_str_printf(failed, " %s", cases[i].name);
    printf("  %zu cases in %.1f s\n", n, cp_now() - t0);
}

/* ---------------------------------------------------------------- 1. files cpgen reads */

/* Each file cpgen reads is a regular file within its kind's size bound, or is refused at once with its name and
 * what is wrong: never a read of /dev/zero, never a block on a FIFO. */
static const hcase reads[] = {
    {"plan-dev-zero", NULL, NULL, "plan /dev/zero", FAIL, "/dev/zero: cannot read spec: a character device", NULL, 0,
     NULL},
    {"plan-fifo", "mkfifo s.lua", NULL, "plan s.lua", FAIL, "s.lua: cannot read spec: a FIFO", "s.lua", 0, NULL},
    {"plan-folder", "mkdir s.lua", NULL, "plan s.lua", FAIL, "s.lua: cannot read spec: a folder", NULL, 0, NULL},
    {"plan-spec-5G", "truncate -s 5G s.lua", NULL, "plan s.lua", FAIL, "more than a spec can be", "s.lua", 0, NULL},
    {"plan-spec-link-dev-zero", "ln -s /dev/zero s.lua", NULL, "plan s.lua", FAIL, "a character device", "s.lua", 0,
     NULL},
    {"spec-load-dev-zero", "echo 'return cpgen.load(\"/dev/zero\")' > s.lua", NULL, "plan s.lua", FAIL,
     "cpgen.load: cannot read '/dev/zero' (a character device", NULL, 0, NULL},
    {"spec-dofile-fifo", "mkfifo f.lua && echo 'return dofile(\"f.lua\")' > s.lua", NULL, "plan s.lua", FAIL,
     "dofile: cannot read 'f.lua' (a FIFO", NULL, 0, NULL},
    {"spec-load-huge", "truncate -s 3G big.lua && echo 'return cpgen.load(\"big.lua\")' > s.lua", NULL, "plan s.lua",
     FAIL, "more than a spec can be", NULL, 0, NULL},
    {"tuning-cache-dev-zero", "mkdir -p c/cpgen && ln -s /dev/zero c/cpgen/tuning.json", "XDG_CACHE_HOME=$PWD/c",
     "plan tiny", OK, "kernel tuning cache", NULL, 0, NULL},
    {"tuning-cache-fifo", "mkdir -p c/cpgen && mkfifo c/cpgen/tuning.json", "XDG_CACHE_HOME=$PWD/c", "plan tiny", OK,
     "(a FIFO (named pipe), not a regular file)", NULL, 0, NULL},
    {"tuning-cache-fifo-run", "mkdir -p c/cpgen && mkfifo c/cpgen/tuning.json", "XDG_CACHE_HOME=$PWD/c", "run tiny",
     OK, "no GPU found", NULL, 0, NULL},
    {"jit-cache-entries-hostile",
     "cp -r \"$ROOT/cache\" c && set -- c/cpgen/*.cubin && rm \"$1\" \"$2\" && mkfifo \"$1\" && ln -s /dev/zero \"$2\" "
     "&& for l in c/cpgen/*.lock; do rm \"$l\" && mkfifo \"$l\"; break; done",
     "XDG_CACHE_HOME=$PWD/c", "build tiny", OK, "unreadable", NULL, NVRTC, NULL},
    {"bundle-cubin-dev-zero", "cp -r \"$ROOT/bundle\" b && set -- b/sm_90a/*.cubin && ln -sf /dev/zero \"$1\"", NULL,
     "run b", FAIL, "(a character device, not a regular file)", NULL, NVRTC, NULL},
    {"bundle-cubin-fifo", "cp -r \"$ROOT/bundle\" b && set -- b/sm_90a/*.cubin && rm \"$1\" && mkfifo \"$1\"", NULL,
     "run tiny --bundle b", FAIL, "(a FIFO", NULL, NVRTC, NULL},
    {"bundle-manifest-fifo", "cp -r \"$ROOT/bundle\" b && rm b/manifest.json && mkfifo b/manifest.json", NULL,
     "run tiny --bundle b", FAIL, "manifest.json (a FIFO", NULL, NVRTC, NULL},
    {"bundle-manifest-20G", "cp -r \"$ROOT/bundle\" b && truncate -s 20G b/manifest.json", NULL, "run b", FAIL,
     "more than a bundle manifest can be", NULL, NVRTC, NULL},
    {"bundle-spec-dev-zero", "cp -r \"$ROOT/bundle\" b && ln -sf /dev/zero b/spec.lua", NULL, "run b", FAIL,
     "b/spec.lua: cannot read spec: a character device", NULL, NVRTC, NULL},
    {"resume-latest-dev-zero", "mkdir r && ln -s /dev/zero r/latest", NULL, "run tiny --resume r", FAIL,
     "r/latest cannot be read (a character device", NULL, 0, NULL},
    {"resume-latest-fifo", "mkdir r && mkfifo r/latest", NULL, "run tiny --resume r", FAIL, "(a FIFO", NULL, 0, NULL},
    {"resume-state-fifo", "cp -r \"$ROOT/run/ckpt_1\" k && rm k/trainer_state.json && mkfifo k/trainer_state.json",
     NULL, "run tiny --resume k", FAIL, "trainer_state.json: cannot read: a FIFO", NULL, 0, NULL},
    {"resume-state-3G", "cp -r \"$ROOT/run/ckpt_1\" k && truncate -s 3G k/trainer_state.json", NULL,
     "run tiny --resume k", FAIL, "more than a state file can be", NULL, 0, NULL},
    {"resume-weights-fifo", "cp -r \"$ROOT/run/ckpt_1\" k && rm k/model.safetensors && mkfifo k/model.safetensors",
     NULL, "run tiny --resume k", FAIL, "model.safetensors: cannot open: a FIFO", NULL, 0, NULL},
    {"resume-optimizer-dev-zero", "cp -r \"$ROOT/run/ckpt_1\" k && ln -sf /dev/zero k/optimizer.safetensors", NULL,
     "run tiny --resume k", FAIL, "optimizer.safetensors: cannot open: a character device", NULL, 0, NULL},
    {"resume-index-dev-zero", "cp -r \"$ROOT/run/ckpt_1\" k && ln -s /dev/zero k/model.safetensors.index.json", NULL,
     "run tiny --resume k", FAIL, "cannot read the index: a character device", NULL, 0, NULL},
    {"report-metrics-dev-zero", "mkdir o && ln -s /dev/zero o/metrics.jsonl", NULL, "report o", FAIL,
     "o/metrics.jsonl (a character device", NULL, 0, NULL},
    {"report-metrics-fifo", "mkdir o && mkfifo o/metrics.jsonl", NULL, "report o", FAIL, "(a FIFO", NULL, 0, NULL},
    {"report-metrics-5G", "mkdir o && truncate -s 5G o/metrics.jsonl", NULL, "report o", FAIL,
     "more than a metrics file can be", NULL, 0, NULL},
    {"report-folder-is-file", "echo keep > o", NULL, "report o", FAIL, "cannot read o/metrics.jsonl", "o", 0, NULL},
};

/* Readers only a GPU run reaches, called here in the child, which exits 0 when the reader refused the file and said
 * want, REFUSED_OTHERWISE when it refused without saying it, NOT_REFUSED when it took the file. */
enum { NOT_REFUSED = 3, REFUSED_OTHERWISE = 4 };
static int child_err(const char *what, const char *err, const char *want) {
    printf("%s: %s\n", what, err);
    return strstr(err, want) ? 0 : REFUSED_OTHERWISE;
}

static void shards_child(const void *arg) {
    cp_tokens r;
    char err[CP_ERR_MAX] = "";
    int rc = cp_tokens_open(&r, "shards/*.bin", 512, 16, err, sizeof err);
    _exit(rc == -1 ? child_err("cp_tokens_open", err, arg) : NOT_REFUSED);
}

static void weights_child(const void *arg) {
    cp_spec s;
    cp_plan P;
    char err[CP_ERR_MAX] = "";
    if (cp_spec_load("tiny", NULL, 0, &s, err, sizeof err) || cp_plan_build(&s, &P, err, sizeof err)) _exit(124);
    float *flat = calloc((size_t)cp_weights_elems(&P), sizeof(float));
    int rc = cp_weights_load_hf(&P, "w", flat, err, sizeof err);
    _exit(rc == -1 ? child_err("cp_weights_load_hf", err, arg) : NOT_REFUSED);
}

static void rdv_child(const void *arg) {
    const char *const *a = arg; /* rank, what the message must hold */
    unsigned char blob[16] = {1};
    char err[CP_ERR_MAX] = "";
    int rc = cp_rdv_file_exchange("rdv", "job1", atoi(a[0]), 2, blob, sizeof blob, 2.0, err, sizeof err);
    _exit(rc == -1 ? child_err("cp_rdv_file_exchange", err, a[1]) : NOT_REFUSED);
}

typedef struct {
    const char *name, *setup;
    child_fn fn;
    const void *arg;
    const char *keep;
} icase;

static const char *rdv_rank1_fifo[] = {"1", "a FIFO"}, *rdv_rank0_big[] = {"0", "not replacing it"},
                  *rdv_rank0_dir[] = {"0", "not replacing it"};

static const icase reads_in_process[] = {
    {"shard-fifo", "mkdir shards && mkfifo shards/a.bin", shards_child, "a FIFO", NULL},
    {"shard-dev-zero", "mkdir shards && ln -s /dev/zero shards/a.bin", shards_child, "a character device", NULL},
    {"shard-folder", "mkdir -p shards/a.bin", shards_child, "a folder", NULL},
    {"hf-weights-fifo", "mkdir w && mkfifo w/model.safetensors", weights_child, "a FIFO", NULL},
    {"hf-index-dev-zero", "mkdir w && ln -s /dev/zero w/model.safetensors.index.json", weights_child,
     "a character device", NULL},
    {"hf-weights-dev-zero", "mkdir w && ln -s /dev/zero w/model.safetensors", weights_child, "a character device",
     NULL},
    {"rendezvous-fifo", "mkfifo rdv", rdv_child, rdv_rank1_fifo, NULL},
    {"rendezvous-rank0-user-file-3G", "truncate -s 3G rdv", rdv_child, rdv_rank0_big, "rdv"},
    {"rendezvous-rank0-folder", "mkdir rdv && echo keep > rdv/x", rdv_child, rdv_rank0_dir, "rdv/x"},
};

static bool run_icase(const icase *c) {
    char dir[400], log[400], why[1024];
    snprintf(dir, sizeof dir, "%s/cases/%s", root, c->name);
    snprintf(log, sizeof log, "%s/logs/%s.log", root, c->name);
    assert_int_equal(cp_mkdir_p(dir), 0);
    shell(dir, c->setup);
    snap keep;
    if (c->keep) take(dir, c->keep, &keep);
    outcome o;
    spawn(dir, log, 0, CASE_SECONDS, c->fn, c->arg, &o);
    char *out = cp_read_file(log, NULL);
    const char *bad = judge_outcome(&o, out ? out : "", ANY, NULL, why, sizeof why);
    if (!bad && o.status == NOT_REFUSED) bad = note(why, sizeof why, "took the file instead of refusing it");
    else if (!bad && o.status == REFUSED_OTHERWISE) bad = note(why, sizeof why, "refused it without saying what it is");
    else if (!bad && o.status != 0) bad = note(why, sizeof why, "exited %d", o.status);
    if (!bad && c->keep) {
        snap now;
        take(dir, c->keep, &now);
        const char *what = changed(&keep, &now);
        if (what) bad = note(why, sizeof why, "%s %s", what, c->keep);
        free(now.content);
    }
    if (c->keep) free(keep.content);
    if (bad) printf("  FAIL  %-34s %s\n        output: %s\n", c->name, why, out ? out : "");
    else printf("  ok    %-34s (%.2f s)\n", c->name, o.seconds);
    free(out);
    return !bad;
}

static void test_reads_bounded(void **state) {
    (void)state;
    cp_str failed = {0};
    run_table(reads, CP_ARRAY_LEN(reads), &failed);
    for (size_t i = 0; i < CP_ARRAY_LEN(reads_in_process); i++)
        if (!run_icase(&reads_in_process[i])) cp_str_printf(&failed, " %s", reads_in_process[i].name);
    if (failed.len) fail_msg("failed:%s", failed.data);
}

/* ---------------------------------------------------------------- 2. files cpgen writes */

#define METRICS "printf '{\"step\":1,\"loss\":6.2}\\n{\"step\":2,\"loss\":6.1}\\n' > o/metrics.jsonl"
#define SPEC "echo 'return cpgen.load(\"tiny\")' > s.lua"

/* Nothing cpgen did not write is replaced or removed; a write that cannot be made fails the command, with the file
 * named, and leaves what was there. */
static const hcase writes[] = {
    {"aot-foreign-manifest", "mkdir b && echo '{\"mine\": 1}' > b/manifest.json && echo keep > b/notes.txt", NULL,
     "aot tiny -o b", FAIL, "not a bundle written by cpgen aot", "b/manifest.json b/notes.txt", NVRTC, NULL},
    {"aot-bundle-with-user-file", "cp -r \"$ROOT/bundle\" b && echo keep > b/notes.txt", NULL, "aot tiny -o b", FAIL,
     "it holds notes.txt, which a bundle does not", "b/notes.txt b/manifest.json", NVRTC, NULL},
    {"aot-bundle-with-user-link", "cp -r \"$ROOT/bundle\" b && echo keep > mine && ln -s ../mine b/src/x.cu", NULL,
     "aot tiny -o b", FAIL, "it holds src/x.cu", "mine b/src/x.cu", NVRTC, NULL},
    {"aot-over-own-bundle", "cp -r \"$ROOT/bundle\" b", NULL, "aot tiny -o b", OK, "bundle b: 10 modules", NULL,
     NVRTC, "test -f b/manifest.json && ! ls | grep -q old"},
    {"aot-over-own-bundle-slash", "cp -r \"$ROOT/bundle\" b", NULL, "aot tiny -o b/", OK, NULL, NULL, NVRTC,
     "test -f b/manifest.json && test $(ls | wc -l) = 1"},
    {"aot-into-file", "echo keep > b", NULL, "aot tiny -o b", FAIL, "b exists and is not a folder", "b", NVRTC, NULL},
    {"aot-into-dot", "echo keep > mine", NULL, "aot tiny -o .", FAIL, "give the bundle a folder of its own", "mine",
     NVRTC, NULL},
    {"aot-readonly-folder", "mkdir ro && chmod 555 ro", NULL, "aot tiny -o ro/b", FAIL, "cannot create a folder beside",
     NULL, NVRTC | AS_USER, NULL},
    {"gen-over-user-source", "mkdir k && echo mine > k/adamw.cu", NULL, "gen tiny -o k", FAIL,
     "k/adamw.cu exists and is not the source cpgen gen writes", "k/adamw.cu", 0, "! test -e k/rmsnorm_h256_e1em05.cu"},
    {"gen-again", "\"$CPGEN\" gen tiny -o k > /dev/null && echo keep > k/notes.txt", NULL, "gen tiny -o k", OK,
     "10 modules", "k/notes.txt", 0, NULL},
    {"gen-into-file", "echo keep > k", NULL, "gen tiny -o k", FAIL, "cannot create folder k (Not a directory)", "k", 0,
     NULL},
    {"gen-readonly-folder", "mkdir ro && chmod 555 ro", NULL, "gen tiny -o ro/k", FAIL, "cannot create folder ro/k",
     NULL, AS_USER, NULL},
    {"gen-stdout-full", NULL, NULL, "gen tiny -o k > /dev/full", FAIL, "writing to stdout failed", NULL, 0, NULL},
    {"plan-svg-is-the-spec", SPEC, NULL, "plan s.lua --svg s.lua", FAIL, "s.lua exists and is not a picture cpgen drew",
     "s.lua", 0, NULL},
    {"plan-svg-user-picture", "echo '<svg>mine</svg>' > m.svg", NULL, "plan tiny --svg m.svg", FAIL,
     "not a picture cpgen drew", "m.svg", 0, NULL},
    {"plan-svg-again", "\"$CPGEN\" plan tiny --svg m.svg > /dev/null", NULL, "plan tiny --svg m.svg", OK, NULL, NULL, 0,
     NULL},
    {"plan-svg-link", SPEC " && ln -s s.lua m.svg", NULL, "plan tiny --svg m.svg", FAIL, "a symbolic link",
     "s.lua m.svg", 0, NULL},
    {"plan-svg-dev-full", NULL, NULL, "plan tiny --svg /dev/full", FAIL, "/dev/full exists and is a character device",
     NULL, 0, NULL},
    {"plan-svg-folder", "mkdir m", NULL, "plan tiny --svg m", FAIL, "give a file name for the picture", NULL, 0, NULL},
    {"plan-svg-full-disk", "\"$CPGEN\" plan tiny --svg m.svg > /dev/null", NULL, "plan tiny --svg m.svg > /dev/null",
     FAIL, "writing m.svg failed", "m.svg", SMALL_FILES, NULL},
    {"plan-svg-missing-folder", NULL, NULL, "plan tiny --svg nodir/m.svg", FAIL, "cannot write nodir/m.svg", NULL, 0,
     NULL},
    {"plan-svg-readonly-folder", "mkdir ro && chmod 555 ro", NULL, "plan tiny --svg ro/m.svg", FAIL, "cannot write",
     NULL, AS_USER, NULL},
    {"plan-stdout-full", NULL, NULL, "plan tiny > /dev/full", FAIL, "writing to stdout failed", NULL, 0, NULL},
    {"plan-json-stdout-full", NULL, NULL, "plan tiny --json > /dev/full", FAIL, "writing to stdout failed", NULL, 0,
     NULL},
    {"plan-stdout-closed", NULL, NULL, "plan tiny >&-", FAIL, "stdout was closed", NULL, 0, NULL},
    {"report-over-user-svg", "mkdir o && " METRICS " && echo mine > o/report.svg", NULL, "report o", FAIL,
     "o/report.svg exists and is not a picture cpgen drew", "o/report.svg o/metrics.jsonl", 0, NULL},
    {"report-full-disk", "mkdir o && " METRICS " && \"$CPGEN\" report o > /dev/null", NULL, "report o > /dev/null",
     FAIL, "writing o/report.svg failed", "o/report.svg o/metrics.jsonl", SMALL_FILES, NULL},
    {"report-readonly-folder", "mkdir o && " METRICS " && chmod 555 o", NULL, "report o", FAIL,
     "cannot write o/report.svg", "o/metrics.jsonl", AS_USER, NULL},
    {"report-stdout-full", "mkdir o && " METRICS, NULL, "report o > /dev/full", FAIL, "writing to stdout failed", NULL,
     0, NULL},
    {"tune-over-user-files", "mkdir t && echo mine > t/tuned.lua", NULL, "tune tiny --plan-only -o t", FAIL,
     "t/tuned.lua exists and is not a tuned.lua of cpgen tune", "t/tuned.lua", 0, NULL},
    {"tune-output-is-input", "\"$CPGEN\" tune tiny --plan-only -o t > /dev/null", NULL,
     "tune t/tuned.lua --plan-only -o t", FAIL, "t/tuned.lua is the spec being tuned", "t/tuned.lua t/tune.jsonl", 0,
     NULL},
    {"tune-again", "\"$CPGEN\" tune tiny --plan-only -o t > /dev/null", NULL, "tune tiny --plan-only -o t", OK,
     "wrote t/tune.jsonl", NULL, 0, "\"$CPGEN\" plan t/tuned.lua > /dev/null"},
    {"tune-into-file", "echo keep > t", NULL, "tune tiny --plan-only -o t", FAIL, "-o t: not a folder", "t", 0, NULL},
    {"tune-readonly-folder", "mkdir ro && chmod 555 ro", NULL, "tune tiny --plan-only -o ro/t", FAIL, "cannot create",
     NULL, AS_USER, NULL},
    {"tune-full-disk", NULL, NULL, "tune tiny --plan-only -o t > /dev/null", FAIL, "t/tune", NULL, SMALL_FILES, NULL},
    {"tune-kernels-over-user-jsonl", "mkdir k && echo mine > k/kernels.jsonl", NULL, "tune-kernels tiny -o k", FAIL,
     "k/kernels.jsonl exists and is not a kernels.jsonl", "k/kernels.jsonl", 0, NULL},
    {"tune-kernels-again", "mkdir k && printf '{\"arch\": \"sm_90a\", \"driver\": \"1\"}\\n' > k/kernels.jsonl",
     NULL, "tune-kernels tiny -o k", OK, "wrote k/kernels.jsonl", NULL, 0, NULL},
    {"tune-kernels-readonly-folder", "mkdir ro && chmod 555 ro", NULL, "tune-kernels tiny -o ro/k", FAIL,
     "cannot create ro/k", NULL, AS_USER, NULL},
    {"run-metrics-foreign", "mkdir o && echo mine > o/metrics.jsonl", NULL, "run tiny --set train.out_dir=o", FAIL,
     "o/metrics.jsonl exists and is not a metrics.jsonl", "o/metrics.jsonl", 0, NULL},
    {"run-metrics-fifo", "mkdir o && mkfifo o/metrics.jsonl", NULL, "run tiny --set train.out_dir=o", FAIL,
     "a FIFO (named pipe), not a metrics.jsonl", "o/metrics.jsonl", 0, NULL},
    {"run-report-foreign", "mkdir o && echo mine > o/report.svg", NULL, "run tiny --set train.out_dir=o", FAIL,
     "o/report.svg exists", "o/report.svg", 0, NULL},
    {"run-latest-foreign", "mkdir o && echo mine > o/latest", NULL,
     "run tiny --set train.out_dir=o --set train.save_every=1", FAIL, "o/latest exists", "o/latest", 0, NULL},
    {"run-ckpt-foreign", "mkdir -p o/ckpt_2 && echo mine > o/ckpt_2/notes.txt", NULL,
     "run tiny --set train.out_dir=o --set train.save_every=1", FAIL, "it holds notes.txt", "o/ckpt_2/notes.txt", 0,
     NULL},
    {"run-out-dir-is-file", "echo keep > o", NULL, "run tiny --set train.out_dir=o", FAIL, "is not a folder", "o", 0,
     NULL},
    {"run-own-outputs", "mkdir o && " METRICS " && cp -r \"$ROOT/run/ckpt_1\" o/ && echo ckpt_1 > o/latest", NULL,
     "run tiny --set train.out_dir=o --set train.save_every=1", OK, NULL, NULL, 0, NULL},
    {"run-trace-is-the-spec", SPEC, NULL, "run s.lua --trace s.lua", FAIL, "s.lua exists and is not a trace", "s.lua",
     0, NULL},
    {"run-trace-dev-full", NULL, NULL, "run tiny --trace /dev/full", FAIL, "a character device, not a trace", NULL, 0,
     NULL},
    {"run-trace-missing-folder", NULL, NULL, "run tiny --trace nodir/t.json", FAIL, "the folder nodir does not exist",
     NULL, 0, NULL},
    {"run-stdout-full", NULL, NULL, "run tiny > /dev/full", FAIL, "writing to stdout failed", NULL, 0, NULL},
    {"build-cache-readonly", "mkdir ro && chmod 555 ro", "XDG_CACHE_HOME=$PWD/ro/c", "build tiny", FAIL,
     "set XDG_CACHE_HOME to an absolute path of a folder you can write", NULL, AS_USER | NVRTC, NULL},
    {"build-stdout-full", NULL, NULL, "build tiny > /dev/full", FAIL, "writing to stdout failed", NULL, NVRTC, NULL},
};

static void test_outputs_not_clobbered(void **state) {
    (void)state;
    cp_str failed = {0};
    run_table(writes, CP_ARRAY_LEN(writes), &failed);
    if (failed.len) fail_msg("failed:%s", failed.data);
}

/* ---------------------------------------------------------------- 3. every command, carelessly */

static const hcase commands[] = {
    {"no-arguments", NULL, NULL, "", FAIL, "usage: cpgen", NULL, 0, NULL},
    {"unknown-spec", NULL, NULL, "frobnicate", FAIL, "cannot read spec", NULL, 0, NULL},
    {"unknown-option", NULL, NULL, "plan tiny --frobnicate", FAIL, "unknown option --frobnicate", NULL, 0, NULL},
    {"option-without-value", NULL, NULL, "plan tiny --seq", FAIL, "--seq needs a value", NULL, 0, NULL},
    {"plan-ok", NULL, NULL, "plan tiny", OK, "fits: yes", NULL, 0, NULL},
    {"plan-o-ignored", NULL, NULL, "plan tiny -o x", FAIL, "-o is an option of gen, aot, tune and tune-kernels", NULL,
     0, "! test -e x"},
    {"build-o-ignored", NULL, NULL, "build tiny -o x", FAIL, "-o is an option of", NULL, 0, NULL},
    {"report-o-ignored", "mkdir o && " METRICS, NULL, "report o -o x", FAIL, "report takes one argument and no option",
     NULL, 0, NULL},
    {"run-svg-ignored", NULL, NULL, "run tiny --svg m.svg", FAIL, "--svg is an option of plan", NULL, 0, NULL},
    {"run-json-ignored", NULL, NULL, "run tiny --json", FAIL, "--json is an option of plan", NULL, 0, NULL},
    {"gen-steps-ignored", NULL, NULL, "gen tiny -o g --steps", FAIL, "--steps is an option of plan", NULL, 0, NULL},
    {"build-max-seq-ignored", NULL, NULL, "build tiny --max-seq", FAIL, "--max-seq is an option of plan", NULL, 0,
     NULL},
    {"plan-no-cache-ignored", NULL, NULL, "plan tiny --no-cache", FAIL, "--no-cache is an option of the commands",
     NULL, 0, NULL},
    {"gen-without-o", NULL, NULL, "gen tiny", FAIL, "gen needs an output folder", NULL, 0, NULL},
    {"aot-without-o", NULL, NULL, "aot tiny", FAIL, "aot needs a bundle folder", NULL, 0, NULL},
    {"resume-with-plan", NULL, NULL, "plan tiny --resume r", FAIL, "--resume is an option of run", NULL, 0, NULL},
    {"bundle-with-plan", NULL, NULL, "plan tiny --bundle b", FAIL, "--bundle is an option of run", NULL, 0, NULL},
    {"gpus-zero", NULL, NULL, "plan tiny --gpus 0", FAIL, "parallel.gpus", NULL, 0, NULL},
    {"seq-negative", NULL, NULL, "plan tiny --seq -5", FAIL, "train.seq_len", NULL, 0, NULL},
    {"gpu-mem-garbage", NULL, NULL, "plan tiny --gpu-mem lots", FAIL, "machine.gpu_mem", NULL, 0, NULL},
    {"set-without-equals", NULL, NULL, "plan tiny --set train.lr", FAIL, "expected KEY=VALUE", NULL, 0, NULL},
    {"set-unknown-key", NULL, NULL, "plan tiny --set train.lrr=1", FAIL, "did you mean", NULL, 0, NULL},
    {"trace-step-zero", NULL, NULL, "run tiny --trace t.json --trace-step 0", FAIL, "--trace-step 0", NULL, 0, NULL},
    {"trace-with-plan", NULL, NULL, "plan tiny --trace t.json", FAIL, "--trace is an option of run", NULL, 0, NULL},
    {"trace-folder", "mkdir t", NULL, "run tiny --trace t", FAIL, "give a file name", NULL, 0, NULL},
    {"resume-missing", NULL, NULL, "run tiny --resume nothere", FAIL, "--resume nothere", NULL, 0, NULL},
    {"resume-ok", NULL, NULL, "run tiny --resume \"$ROOT/run\"", OK, "matches", NULL, 0, NULL},
    {"resume-other-layout", NULL, NULL, "run tiny --resume \"$ROOT/run\" --gpus 4 --ranks-per-gpu 4", OK,
     "note: another layout than the checkpoint's run: parallel.gpus 4 (was 1)", NULL, 0, NULL},
    {"resume-other-seq", NULL, NULL, "run tiny --resume \"$ROOT/run\" --seq 1K", FAIL,
     "train.seq_len is 1024, the checkpoint's run had 2048", NULL, 0, NULL},
    {"resume-other-batch", NULL, NULL, "run tiny --resume \"$ROOT/run\" --set train.micro_batches=4", FAIL,
     "or pass --resume-new-data", NULL, 0, NULL},
    {"resume-new-data", NULL, NULL, "run tiny --resume \"$ROOT/run\" --seq 1K --resume-new-data", OK,
     "note: --resume-new-data: train.seq_len is 1024", NULL, 0, NULL},
    {"resume-new-data-alone", NULL, NULL, "run tiny --resume-new-data", FAIL, "goes with --resume", NULL, 0, NULL},
    {"resume-state-garbage", "cp -r \"$ROOT/run/ckpt_1\" k && echo '{' > k/trainer_state.json", NULL,
     "run tiny --resume k", FAIL, "not valid JSON", NULL, 0, NULL},
    {"bundle-missing", NULL, NULL, "run tiny --bundle nothere", FAIL, "nothere", NULL, 0, NULL},
    {"bundle-ok", NULL, NULL, "run \"$ROOT/bundle\"", OK, "every cubin matches its SHA-256", NULL, NVRTC, NULL},
    {"bundle-and-another", NULL, NULL, "run \"$ROOT/bundle\" --bundle nothere", FAIL, "give one", NULL, NVRTC, NULL},
    {"build-ok", NULL, NULL, "build tiny", OK, "from cache", NULL, NVRTC, NULL},
    {"tune-plan-only-ok", NULL, NULL, "tune tiny --plan-only -o t", OK, "--plan-only", NULL, 0, NULL},
    {"tune-budget-garbage", NULL, NULL, "tune tiny --budget soon --plan-only", FAIL, "--budget soon", NULL, 0, NULL},
    {"tune-sweep-garbage", NULL, NULL, "tune tiny --sweep nothing --plan-only -o t", FAIL, "nothing", NULL, 0, NULL},
    {"tune-kernels-no-gpu", NULL, NULL, "tune-kernels tiny -o k", OK, "kernel timing skipped", NULL, 0,
     "test -f k/kernels.jsonl"},
    {"report-ok", "mkdir o && " METRICS, NULL, "report o", OK, "o/report.svg: 2 steps", NULL, 0, NULL},
    {"report-not-a-run", "mkdir o", NULL, "report o", FAIL, "is o the out_dir of a run", NULL, 0, NULL},
    {"report-garbage-line", "mkdir o && echo 'not json' > o/metrics.jsonl", NULL, "report o", FAIL, "metrics.jsonl:1",
     NULL, 0, NULL},
    /* the faults of the first review: bytecode, a library call past the time limit, a report of absurd or torn
     * metrics, a spec file name that is code, planning at a length far past the memory */
    {"spec-lua-bytecode",
     "echo 'return load(string.dump(function() return cpgen.load(\"tiny\") end), nil, \"b\")()' > s.lua", NULL,
     "plan s.lua", FAIL, NULL, NULL, 0, NULL},
    {"spec-regex-forever",
     "printf 'string.find(string.rep(\"a\", 5000), \".-.-.-.-.-.-b\")\\nreturn cpgen.load(\"tiny\")\\n' > s.lua", NULL,
     "plan s.lua", FAIL, "the spec ran for more than 10 s", NULL, SPEC_LIMIT, NULL},
    {"report-step-1e16",
     "mkdir o && printf '{\"step\":1,\"loss\":2}\\n{\"step\":1e16,\"loss\":1}\\n' > o/metrics.jsonl", NULL,
     "report o", OK, "skipped 1 line that is not a step's metrics (line 2", NULL, 0, NULL},
    {"report-torn-last-line", "mkdir o && printf '{\"step\":1,\"loss\":2}\\n{\"step\":2,\"lo' > o/metrics.jsonl",
     NULL, "report o", OK, "1 steps", NULL, 0, NULL},
    {"tune-spec-name-newline", "echo 'return cpgen.load(\"tiny\")' > \"$(printf 'a\\nb.lua')\"", NULL,
     "tune \"$(printf 'a\\nb.lua')\" --plan-only -o t", OK, NULL, NULL, 0, "\"$CPGEN\" plan t/tuned.lua > /dev/null"},
    {"plan-seq-1024M", NULL, NULL, "plan tiny --seq 1024M", ANY, NULL, NULL, 0, NULL},
    {"plan-max-seq-tiny", NULL, NULL, "plan tiny --max-seq --json", OK, NULL, NULL, 0, NULL}, /* plans up to ~1G */
};

static void test_commands(void **state) {
    (void)state;
    cp_str failed = {0};
    run_table(commands, CP_ARRAY_LEN(commands), &failed);
    if (failed.len) fail_msg("failed:%s", failed.data);
}

/* ---------------------------------------------------------------- fixtures */

/* A checkpoint of tiny at step 1 in root/run (with `latest`), as a run would leave it. */
static int make_checkpoint(void) {
    cp_spec s;
    cp_plan P;
    char err[CP_ERR_MAX], out[400];
    if (cp_spec_load("tiny", NULL, 0, &s, err, sizeof err) || cp_plan_build(&s, &P, err, sizeof err)) {
        fprintf(stderr, "tiny: %s\n", err);
        return -1;
    }
    int64_t n = cp_weights_elems(&P);
    float *w = calloc((size_t)n, sizeof *w), *m = calloc((size_t)n, sizeof *m), *v = calloc((size_t)n, sizeof *v);
    cp_weights_init_random(&P, 7, 0.02, w);
    cp_ckpt_state st;
    cp_ckpt_state_init(&P, &st);
    st.step = st.updates = 1;
    snprintf(out, sizeof out, "%s/run", root);
    int rc = cp_ckpt_write(&P, out, &st, w, m, v, NULL, NULL, NULL, 0, err, sizeof err);
    if (rc) fprintf(stderr, "checkpoint: %s\n", err);
    free(w), free(m), free(v);
    cp_plan_free(&P);
    return rc;
}

static int group_setup(void **state) {
    (void)state;
    if (tmpdir_make(root, sizeof root, "hostile") || chmod(root, 0755)) return -1;
    char path[512], cmd[1024], *out;
    char real[PATH_MAX];
    if (!realpath("build/cpgen", real) || snprintf(cpgen, sizeof cpgen, "%s", real) >= (int)sizeof cpgen) {
        fprintf(stderr, "build/cpgen: %s; run make all first\n", strerror(errno));
        return -1;
    }
    const char *subs[] = {"cache", "home", "logs", "cases"};
    for (size_t i = 0; i < CP_ARRAY_LEN(subs); i++) {
        snprintf(path, sizeof path, "%s/%s", root, subs[i]);
        if (cp_mkdir_p(path) || chmod(path, 0755)) return -1;
    }
    setenv("CPGEN", cpgen, 1);
    setenv("ROOT", root, 1);
    snprintf(path, sizeof path, "%s/cache", root);
    setenv("XDG_CACHE_HOME", path, 1); /* no case reads or writes the user's caches */
    snprintf(path, sizeof path, "%s/home", root);
    setenv("HOME", path, 1);
    setenv("LC_ALL", "C", 1);
    /* one bundle of tiny, whose compile also fills the shared JIT cache for build and aot */
    double t0 = cp_now();
    snprintf(cmd, sizeof cmd, "\"%s\" aot tiny -o \"%s/bundle\"", cpgen, root);
    have_nvrtc = sh(cmd, &out) == 0;
    if (!have_nvrtc) printf("  no bundle (%.300s): the cases that compile are skipped\n", out);
    else printf("  fixtures: a bundle of tiny in %.1f s\n", cp_now() - t0);
    free(out);
    if (make_checkpoint()) return -1;
    snprintf(cmd, sizeof cmd, "chmod -R a+rX \"%s\"", root); /* the cases run as nobody read them */
    int rc = sh(cmd, &out);
    free(out);
    return rc;
}

static int group_teardown(void **state) {
    (void)state;
    char cmd[600], *out;
    snprintf(cmd, sizeof cmd, "chmod -R u+w \"%s\"", root); /* the read-only folders of the cases */
    (void)sh(cmd, &out);
    free(out);
    tmpdir_remove(root);
    return 0;
}

int main(int argc, char **argv) {
    (void)argc;
    go_to_source_tree(argv[0], "tests/specs_bad");
    setvbuf(stdout, NULL, _IOLBF, 0);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reads_bounded),
        cmocka_unit_test(test_outputs_not_clobbered),
        cmocka_unit_test(test_commands),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}

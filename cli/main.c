/* main.c: the cpgen command line. Parses flags, loads the spec, builds the plan and hands over to a command. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bundle.h"
#include "checkpoint.h"
#include "commands.h"
#include "data.h"
#include "exec.h"
#include "ktune.h"
#include "module.h"
#include "outputs.h"
#include "plan.h"
#include "report.h"
#include "resume.h"
#include "spec.h"
#include "stop.h"
#include "train.h"
#include "tune.h"
#include "util.h"
#include "world.h"

#define MAX_SETS 128

static void usage(FILE *out) {
    fprintf(out,
            "usage: cpgen [COMMAND] SPEC [options]\n"
            "\n"
            "SPEC is a Lua spec file, or the name of a shipped spec: tiny, llama1b, llama3b, llama8b, qwen32b.\n"
            "\n"
            "commands:\n"
            "  run     plan, generate, compile and train (the default when COMMAND is left out)\n"
            "  plan    print the plan of one training step: stages, memory per GPU and host, FLOPs, time\n"
            "  gen     write every emitted kernel source of the spec into a folder (-o DIR)\n"
            "  build   compile every kernel of the spec and report registers, shared memory and spills\n"
            "  report  cpgen report OUT_DIR: draw a run's metrics.jsonl as OUT_DIR/report.svg (run writes it too)\n"
            "  aot     compile every kernel of the spec ahead of time into a bundle folder (-o BUNDLE); `cpgen run\n"
            "          BUNDLE` then loads its cubins and never compiles, so NVRTC is not needed where it runs\n"
            "  tune    find the fastest settings on this machine: plan every candidate of the swept keys, measure the\n"
            "          fitting ones (layer-truncated steps at full length) within --budget, write a table, tune.jsonl,\n"
            "          tune.svg and tuned.lua into -o DIR (default runs/<spec>/tune); first it times the kernel\n"
            "          variants of the likeliest winner (tune-kernels)\n"
            "  tune-kernels  time every variant of the plan's kernels that has some (the Hopper attention forward's\n"
            "          K/V ring depth) on this GPU and keep the fastest in the kernel tuning cache, beside the JIT\n"
            "          cache; run, aot, plan and build then use it. -o DIR also writes DIR/kernels.jsonl\n"
            "\n"
            "options:\n"
            "  --set KEY=VALUE   override any spec key, e.g. --set train.seq_len=1M --set parallel.gpus=8\n"
            "  --gpus N          same as --set parallel.gpus=N\n"
            "  --seq LEN         same as --set train.seq_len=LEN\n"
            "  --gpu-mem SIZE    GPU memory to plan for (default 143150M, an H200); --set machine.gpu_mem=SIZE\n"
            "  --host-mem SIZE   host memory to plan for (default 128G); --set machine.host_mem=SIZE\n"
            "  --doc-len LEN     the documents' expected length, for the predicted time of a plan that masks\n"
            "                    them (default: measured from the shards); --set data.doc_len=LEN\n"
            "  --ranks-per-gpu K (run, plan) K ranks share each GPU, each its own NCCL host over sockets: every\n"
            "                    layout runs on fewer GPUs (an 8-GPU plan on one with K = 8), with the same\n"
            "                    numbers and memory per rank, not the same speed; --set machine.ranks_per_gpu=K\n"
            "  --trace FILE      (run) write one step as a Chrome trace (Perfetto, chrome://tracing): every plan\n"
            "                    step per stream, measured beside the cost model's timeline, waits, plan memory\n"
            "  --trace-step N    (run) the step --trace writes, counted from 1 in this run (default 2)\n"
            "  --resume DIR      (run) continue from a training checkpoint (weights, AdamW state, step, data\n"
            "                    position): DIR is a ckpt_<step> folder, or an out_dir whose `latest` file names\n"
            "                    one; checkpoints are written every train.save_every steps while training goes\n"
            "                    on. SIGTERM, SIGUSR1 or Ctrl-C stop a run after its step, saved: exit code 75\n"
            "                    (docs/CHECKPOINTS.md); a second Ctrl-C aborts at once. Any layout resumes (GPUs,\n"
            "                    ring, replicas, UPipe, offload, optimizer placement); a change of the data that\n"
            "                    comes next (data.source, init.seed of synthetic data, train.seq_len, replicas x\n"
            "                    micro_batches) is refused unless:\n"
            "  --resume-new-data (run) resume from the checkpoint's weights, optimizer state and step, but with the\n"
            "                    data as the spec has it now (each change said in a note)\n"
            "  --max-seq         (plan) find the longest sequence that fits\n"
            "  --json            (plan) print JSON\n"
            "  --steps           (plan) also print every step and buffer\n"
            "  --svg FILE        (plan) draw memory over the steps of one training step, GPU and host, into FILE\n"
            "  -o DIR            (gen, aot, tune, tune-kernels) output folder\n"
            "  --arch ARCH       (build, run) target, e.g. sm_90a or sm_80 (default: the GPU's, else sm_90a);\n"
            "                    (aot) one or more, e.g. --arch sm_90a,sm_80\n"
            "  --bundle DIR      (run) load the kernels from an AOT bundle made for this spec (same as cpgen run DIR\n"
            "                    with DIR's own spec); refused, before the GPU is touched, if it does not fit\n"
            "  --no-cache        (build, aot, run) compile even when the kernel cache has the result\n"
            "  --sweep KEY=V1,V2 (tune) sweep a spec key over these values, replacing its default axis (repeatable)\n"
            "  --budget TIME     (tune) wall time for the measurements, e.g. 10m, 90s, 1h (default 10m)\n"
            "  --plan-only       (tune) rank by the plan's prediction and measure nothing\n"
            "  --version         print the version\n");
}

typedef struct {
    const char *command, *spec, *outdir, *arch, *resume, *svg, *trace, *bundle;
    int trace_step; /* 0: the default, step 2 (or the only step) */
    const char *sets[MAX_SETS];
    int nsets;
    bool json, steps, max_seq, no_cache, plan_only, resume_new_data;
    const char *sweeps[MAX_SETS], *budget;
    int nsweeps;
    char **argv; /* the command line, to start one copy per GPU */
} cli;

static void add_set(cli *c, const char *key, const char *value) {
    if (c->nsets == MAX_SETS) cp_fatal(CP_EXIT_USAGE, "more than %d overrides", MAX_SETS);
    if (!value) {
        c->sets[c->nsets++] = key;
        return;
    }
    size_t n = strlen(key) + strlen(value) + 2;
    char *s = cp_xmalloc(n);
    snprintf(s, n, "%s=%s", key, value);
    c->sets[c->nsets++] = s;
}

static const char *need_value(int argc, char **argv, int *i) {
    if (*i + 1 >= argc) cp_fatal(CP_EXIT_USAGE, "%s needs a value; see cpgen --help", argv[*i]);
    return argv[++*i];
}

static void parse(int argc, char **argv, cli *c) {
    static const char *commands[] = {"run", "plan", "gen", "build", "report", "aot", "tune", "tune-kernels"};
    memset(c, 0, sizeof *c);
    c->argv = argv;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h") || !strcmp(a, "help")) {
            usage(stdout);
            exit(0);
        } else if (!strcmp(a, "--version")) {
            printf("cpgen %s\n", CP_VERSION);
            exit(0);
        } else if (!strcmp(a, "--set")) {
            const char *v = need_value(argc, argv, &i);
            if (!strchr(v, '=')) cp_fatal(CP_EXIT_USAGE, "--set %s: expected KEY=VALUE, e.g. --set train.seq_len=1M", v);
            add_set(c, v, NULL);
        } else if (!strncmp(a, "--set=", 6)) {
            add_set(c, a + 6, NULL);
        } else if (!strcmp(a, "--gpus")) {
            add_set(c, "parallel.gpus", need_value(argc, argv, &i));
        } else if (!strcmp(a, "--seq")) {
            add_set(c, "train.seq_len", need_value(argc, argv, &i));
        } else if (!strcmp(a, "--gpu-mem")) {
            add_set(c, "machine.gpu_mem", need_value(argc, argv, &i));
        } else if (!strcmp(a, "--host-mem")) {
            add_set(c, "machine.host_mem", need_value(argc, argv, &i));
        } else if (!strcmp(a, "--doc-len")) {
            add_set(c, "data.doc_len", need_value(argc, argv, &i));
        } else if (!strcmp(a, "--ranks-per-gpu")) {
            add_set(c, "machine.ranks_per_gpu", need_value(argc, argv, &i));
        } else if (!strcmp(a, "--json")) {
            c->json = true;
        } else if (!strcmp(a, "--steps")) {
            c->steps = true;
        } else if (!strcmp(a, "--max-seq")) {
            c->max_seq = true;
        } else if (!strcmp(a, "--no-cache")) {
            c->no_cache = true;
        } else if (!strcmp(a, "-o")) {
            c->outdir = need_value(argc, argv, &i);
        } else if (!strcmp(a, "--arch")) {
            c->arch = need_value(argc, argv, &i);
        } else if (!strcmp(a, "--svg")) {
            c->svg = need_value(argc, argv, &i);
        } else if (!strcmp(a, "--trace")) {
            c->trace = need_value(argc, argv, &i);
        } else if (!strcmp(a, "--trace-step")) {
            const char *v = need_value(argc, argv, &i);
            char *end;
            long n = strtol(v, &end, 10);
            if (*end || n < 1 || n > 1000000000)
                cp_fatal(CP_EXIT_USAGE, "--trace-step %s: give the number of the step to trace, from 1", v);
            c->trace_step = (int)n;
        } else if (!strcmp(a, "--sweep")) {
            if (c->nsweeps == MAX_SETS) cp_fatal(CP_EXIT_USAGE, "more than %d --sweep", MAX_SETS);
            c->sweeps[c->nsweeps++] = need_value(argc, argv, &i);
        } else if (!strcmp(a, "--budget")) {
            c->budget = need_value(argc, argv, &i);
        } else if (!strcmp(a, "--plan-only")) {
            c->plan_only = true;
        } else if (!strcmp(a, "--bundle")) {
            c->bundle = need_value(argc, argv, &i);
        } else if (!strcmp(a, "--resume")) {
            c->resume = need_value(argc, argv, &i);
        } else if (!strcmp(a, "--resume-new-data")) {
            c->resume_new_data = true;
        } else if (a[0] == '-') {
            cp_fatal(CP_EXIT_USAGE, "unknown option %s; see cpgen --help", a);
        } else if (!c->command && !c->spec) {
            bool is_cmd = false;
            for (size_t k = 0; k < CP_ARRAY_LEN(commands); k++) is_cmd |= !strcmp(a, commands[k]);
            if (is_cmd) c->command = a;
            else c->spec = a;
        } else if (!c->spec) {
            c->spec = a;
        } else {
            cp_fatal(CP_EXIT_USAGE, "unexpected argument %s (the spec is %s); see cpgen --help", a, c->spec);
        }
    }
    if (!c->command) c->command = "run";
    if ((c->trace || c->trace_step) && strcmp(c->command, "run"))
        cp_fatal(CP_EXIT_USAGE, "--trace is an option of run (cpgen run SPEC --trace FILE), not of %s", c->command);
    if (c->trace_step && !c->trace) cp_fatal(CP_EXIT_USAGE, "--trace-step needs --trace FILE");
    if (c->resume && strcmp(c->command, "run"))
        cp_fatal(CP_EXIT_USAGE, "--resume is an option of run (cpgen run SPEC --resume DIR), not of %s", c->command);
    if (c->resume_new_data && !c->resume)
        cp_fatal(CP_EXIT_USAGE, "--resume-new-data goes with --resume: cpgen run SPEC --resume DIR --resume-new-data");
    if (c->bundle && strcmp(c->command, "run"))
        cp_fatal(CP_EXIT_USAGE, "--bundle is an option of run (cpgen run SPEC --bundle DIR), not of %s", c->command);
    /* an option a command would not read is refused, not silently dropped */
    if ((c->nsweeps || c->budget || c->plan_only) && strcmp(c->command, "tune"))
        cp_fatal(CP_EXIT_USAGE, "%s is an option of tune (cpgen tune SPEC %s), not of %s",
                 c->nsweeps ? "--sweep" : c->budget ? "--budget" : "--plan-only",
                 c->nsweeps ? "--sweep KEY=V1,V2" : c->budget ? "--budget 10m" : "--plan-only", c->command);
    if (!strcmp(c->command, "tune") && (c->json || c->steps || c->max_seq || c->svg || c->arch || c->no_cache))
        cp_fatal(CP_EXIT_USAGE, "%s is not an option of tune, which takes --set, --gpus, --seq, --gpu-mem, --host-mem, "
                 "--sweep, --budget, --plan-only and -o", c->json ? "--json" : c->steps ? "--steps" : c->max_seq ?
                 "--max-seq" : c->svg ? "--svg" : c->arch ? "--arch" : "--no-cache");
    if ((c->json || c->steps || c->max_seq) && strcmp(c->command, "plan") && strcmp(c->command, "tune"))
        cp_fatal(CP_EXIT_USAGE, "%s is an option of plan (cpgen plan SPEC %s), not of %s",
                 c->json ? "--json" : c->steps ? "--steps" : "--max-seq",
                 c->json ? "--json" : c->steps ? "--steps" : "--max-seq", c->command);
    /* the kernel cache is read where kernels are compiled */
    if (c->no_cache && strcmp(c->command, "build") && strcmp(c->command, "aot") && strcmp(c->command, "run") &&
        strcmp(c->command, "tune"))
        cp_fatal(CP_EXIT_USAGE, "--no-cache is an option of the commands that compile kernels through the cache "
                 "(build, aot, run), not of %s", c->command);
    if (!strcmp(c->command, "report") && argc != 3) /* not silently dropped: report reads no option */
        cp_fatal(CP_EXIT_USAGE, "report takes one argument and no option: cpgen report OUT_DIR (a run's out_dir)");
    /* output options a command would ignore: the user would look for a file that is never written */
    static const char *with_o[] = {"gen", "aot", "tune", "tune-kernels"};
    bool takes_o = false;
    for (size_t k = 0; k < CP_ARRAY_LEN(with_o); k++) takes_o |= !strcmp(c->command, with_o[k]);
    if (c->outdir && !takes_o)
        cp_fatal(CP_EXIT_USAGE, "-o is an option of gen, aot, tune and tune-kernels, not of %s%s", c->command,
                 !strcmp(c->command, "run") ? " (a run writes into train.out_dir: --set train.out_dir=DIR)" : "");
    if (c->svg && strcmp(c->command, "plan"))
        cp_fatal(CP_EXIT_USAGE, "--svg is an option of plan (cpgen plan SPEC --svg FILE), not of %s", c->command);
    if (!c->spec) {
        usage(stderr);
        exit(CP_EXIT_USAGE);
    }
}

/* What does not fit, and what would: the longest sequence this configuration holds. */
static void refuse(const cp_spec *spec, const cp_plan *plan) {
    fprintf(stderr, "cpgen: %s does not fit: %s\n", spec->path, plan->why);
    cp_plan best;
    char err[CP_ERR_MAX], len[32];
    int64_t n = cp_plan_max_seq(spec, &best, err, sizeof err);
    if (n > 0) {
        fprintf(stderr, "cpgen: with this model, GPU count and machine, train.seq_len = %s (%lld tokens) is the longest "
                        "that fits (cpgen plan --max-seq shows its plan); more GPUs or a larger machine fit more\n",
                cp_fmt_length(n, len, sizeof len), (long long)n);
        cp_plan_free(&best);
    } else {
        fprintf(stderr, "cpgen: %s; use more GPUs or a larger machine\n", err);
    }
}

/* The plan of spec; false, with the planner's message on stderr, when the spec does not plan. */
static bool build_plan(const cp_spec *spec, cp_plan *plan) {
    char err[CP_ERR_MAX * 2];
    if (!cp_plan_build(spec, plan, err, sizeof err)) return true;
    fprintf(stderr, "cpgen: %s\n", err);
    return false;
}

/* The flat program of a folded plan, for what lists or draws every step; false, with the message, on a planner bug. */
static bool unfold_plan(cp_plan *plan) {
    char err[CP_ERR_MAX * 2];
    if (!cp_plan_unfold(plan, err, sizeof err)) return true;
    fprintf(stderr, "cpgen: %s\n", err);
    return false;
}

static void jit_opts_for(const cli *c, cp_jit_opts *o) {
    memset(o, 0, sizeof *o);
    char why[256];
    if (c->arch) snprintf(o->arch, sizeof o->arch, "%s", c->arch);
    else if (cp_gpu_count(why, sizeof why) > 0 && cp_device_arch(0, o->arch, sizeof o->arch) == 0) {
    } else snprintf(o->arch, sizeof o->arch, "sm_90a");
    o->no_cache = c->no_cache;
}

/* The kernel variants the plan runs (gen/ktune.h): with a bundle the ones it was built with (a bundle that cannot be
 * opened is left to its check to report), else this machine's tuned winners for the architectures the kernels are
 * built for (--arch, else the GPU's, else sm_90a), else the generator's defaults. A tuning cache that cannot be
 * used is reported on warn (NULL: by another rank). */
static void choose_variants(const cli *c, cp_plan *P, FILE *warn) {
    if (c->bundle) {
        cp_bundle b;
        char err[CP_ERR_MAX];
        if (cp_bundle_open(c->bundle, &b, err, sizeof err)) return;
        const char **names = cp_xcalloc((size_t)CP_MAX(b.nmodules, 1), sizeof *names);
        for (int i = 0; i < b.nmodules; i++) names[i] = b.modules[i].name;
        cp_ktune_apply_bundle(P, names, b.nmodules);
        free(names);
        cp_bundle_close(&b);
        return;
    }
    cp_jit_opts o;
    jit_opts_for(c, &o);
    char driver[32], path[CP_PATH_MAX + 16];
    cp_driver_version(driver, sizeof driver);
    cp_ktune_path(NULL, path, sizeof path);
    cp_ktune_cache kc;
    cp_ktune_load(path, &kc, warn);
    cp_ktune_apply(P, &kc, c->arch ? c->arch : o.arch, driver);
    cp_ktune_free(&kc);
}

/* build_plan with the kernel variants this command compiles and runs. */
static bool plan_for_run(const cli *c, const cp_spec *spec, cp_plan *plan, FILE *warn) {
    if (!build_plan(spec, plan)) return false;
    choose_variants(c, plan, warn);
    return true;
}

static int cmd_plan(const cli *c, cp_spec *spec) {
    cp_plan plan;
    char err[CP_ERR_MAX];
    if (c->max_seq) {
        int64_t best = cp_plan_max_seq(spec, &plan, err, sizeof err);
        if (!best) {
            fprintf(stderr, "cpgen: %s\n", err);
            return CP_EXIT_USAGE;
        }
        choose_variants(c, &plan, stderr);
        if (c->steps && !unfold_plan(&plan)) {
            cp_plan_free(&plan);
            return CP_EXIT_FAIL;
        }
        if (c->json) cp_plan_print_json(&plan, stdout);
        else {
            char a[32], g[32], h[32], r[48] = "";
            int gpus = plan.C * plan.ring; /* the GPUs one sequence spans */
            if (plan.ring > 1) snprintf(r, sizeof r, " (ring %d x %d)", plan.ring, plan.C);
            printf("max-seq: %s tokens (%lld) fit %d GPU%s%s of %s with %s host memory\n\n",
                   cp_fmt_length(best, a, sizeof a), (long long)best, gpus, gpus > 1 ? "s" : "", r,
                   cp_fmt_bytes(spec->machine.gpu_mem, g, sizeof g), cp_fmt_bytes(spec->machine.host_mem, h, sizeof h));
            cp_plan_print(&plan, stdout, c->steps);
        }
        cp_plan_free(&plan);
        return 0;
    }
    /* folded, so that planning takes the same time and memory at any length; flat only to list or draw every step */
    char perr[CP_ERR_MAX * 2];
    if (cp_plan_build_folded(spec, &plan, perr, sizeof perr)) {
        fprintf(stderr, "cpgen: %s\n", perr);
        return CP_EXIT_USAGE;
    }
    choose_variants(c, &plan, stderr);
    if ((c->steps || c->svg) && !unfold_plan(&plan)) {
        cp_plan_free(&plan);
        return CP_EXIT_FAIL;
    }
    if (c->json) {
        cp_plan_print_json(&plan, stdout);
    } else {
        cp_plan_print(&plan, stdout, c->steps);
        /* the other precision's prediction beside this one's; a plan of it that fails only goes unsaid */
        cp_spec other = *spec;
        other.train.fp8 = !spec->train.fp8;
        cp_plan alt;
        if (!cp_plan_build_folded(&other, &alt, perr, sizeof perr)) {
            cp_plan_print_precisions(&plan, &alt, stdout);
            cp_plan_free(&alt);
        }
    }
    if (c->svg && cp_plan_svg(&plan, c->svg, err, sizeof err)) {
        fprintf(stderr, "cpgen: %s\n", err);
        cp_plan_free(&plan);
        return CP_EXIT_FAIL;
    }
    int rc = plan.fits ? 0 : CP_EXIT_USAGE;
    if (!plan.fits) refuse(spec, &plan);
    cp_plan_free(&plan);
    return rc;
}

static int cmd_gen_or_build(const cli *c, cp_spec *spec) {
    cp_plan plan;
    char err[CP_ERR_MAX];
    if (!plan_for_run(c, spec, &plan, stderr)) return CP_EXIT_USAGE;
    int rc;
    if (!strcmp(c->command, "gen")) {
        if (!c->outdir) {
            cp_plan_free(&plan);
            cp_fatal(CP_EXIT_USAGE, "gen needs an output folder: cpgen gen %s -o DIR", c->spec);
        }
        rc = cp_cmd_gen(&plan, c->outdir, err, sizeof err);
    } else {
        cp_jit_opts o;
        jit_opts_for(c, &o);
        rc = cp_cmd_build(&plan, &o, stdout, err, sizeof err);
    }
    if (rc) fprintf(stderr, "cpgen: %s\n", err);
    cp_plan_free(&plan);
    return rc ? CP_EXIT_FAIL : 0;
}

/* Without a GPU, --resume still checks the checkpoint against the spec: a wrong one is found before a GPU is. */
static int check_resume(const cli *c, const cp_spec *spec, const cp_plan *plan) {
    char err[CP_ERR_MAX];
    cp_ckpt ck;
    int rc = cp_ckpt_open(plan, c->resume, &ck, err, sizeof err);
    if (!rc && cp_resume_check(plan, &ck.state, ck.dir, c->resume_new_data, err, sizeof err)) {
        cp_ckpt_close(&ck);
        rc = -1;
    }
    if (rc) {
        fprintf(stderr, "cpgen: %s\n", err);
    } else {
        printf("\ncheckpoint %s: step %d of %d, %d AdamW updates, matches %s\n", ck.dir, ck.state.step,
               spec->train.steps, ck.state.updates, spec->path);
        cp_resume_notes(plan, &ck.state, c->resume_new_data, stdout);
        cp_ckpt_close(&ck);
    }
    return rc ? CP_EXIT_USAGE : 0;
}

/* --resume on a GPU machine: the checkpoint, and the data it would go on with, checked before ranks are started or
 * joined, so that a refused one costs no process, NCCL communicator or compile (cp_train_run checks the same again).
 * say: print the reason (the lead). Returns 0 when it may resume. */
static int resume_refused(const cli *c, const cp_plan *plan, bool say) {
    char err[CP_ERR_MAX];
    cp_ckpt ck;
    int rc = cp_ckpt_open(plan, c->resume, &ck, err, sizeof err);
    if (!rc) {
        rc = cp_resume_check(plan, &ck.state, ck.dir, c->resume_new_data, err, sizeof err);
        cp_ckpt_close(&ck);
    }
    if (rc && say) fprintf(stderr, "cpgen: %s\n", err);
    return rc;
}

/* What every rank of a run must have planned alike: the model's shape with the parallel layout, and the arenas. */
static void plan_key(const cp_plan *P, int64_t key[3]) {
    uint64_t h = cp_ckpt_shape_hash(&P->spec.model);
    h = cp_mix64(h ^ (uint64_t)P->S) ^ cp_mix64((uint64_t)P->C << 32 | (uint64_t)P->U);
    key[0] = (int64_t)cp_mix64(h ^ (uint64_t)P->spec.train.micro_batches);
    key[1] = P->gpu_arena;
    key[2] = P->host_arena * 31 + P->nsteps;
}

/* The command that makes a bundle fitting this run, less its --arch, for the messages that refuse one. */
static void rebuild_command(const cli *c, char *out, size_t n) {
    cp_str s = {0};
    cp_str_printf(&s, "cpgen aot %s", c->spec);
    for (int i = 0; i < c->nsets; i++) cp_str_printf(&s, " --set %s", c->sets[i]);
    cp_str_printf(&s, " -o %s", c->bundle);
    snprintf(out, n, "%s", s.data);
    cp_str_free(&s);
}

/* cpgen run with a bundle: checked against the plan and the GPU's architecture (arch; NULL without a GPU) before
 * anything is allocated on the GPU. */
static int check_bundle(const cli *c, const cp_plan *plan, const char *arch, cp_bundle *b, bool say) {
    char err[CP_ERR_MAX * 2], rebuild[CP_ERR_MAX];
    rebuild_command(c, rebuild, sizeof rebuild);
    if (cp_cmd_bundle_check(plan, c->bundle, arch, rebuild, b, say ? stdout : NULL, err, sizeof err)) {
        fprintf(stderr, "cpgen: %s\n", err);
        return CP_EXIT_USAGE;
    }
    return 0;
}

static int cmd_aot(const cli *c, cp_spec *spec) {
    if (!c->outdir) cp_fatal(CP_EXIT_USAGE, "aot needs a bundle folder: cpgen aot %s -o BUNDLE [--arch sm_90a,sm_80]", c->spec);
    cp_plan plan;
    char err[CP_ERR_MAX * 2];
    if (!plan_for_run(c, spec, &plan, stderr)) return CP_EXIT_USAGE;
    cp_jit_opts o;
    jit_opts_for(c, &o);
    cp_str cmd = {0};
    cp_str_printf(&cmd, "cpgen");
    for (char **a = c->argv + 1; *a; a++) cp_str_printf(&cmd, " %s", *a);
    int rc = cp_cmd_aot(&plan, c->outdir, c->arch ? c->arch : o.arch, &o, cmd.data, stdout, err, sizeof err);
    if (rc) fprintf(stderr, "cpgen: %s\n", err);
    cp_str_free(&cmd);
    cp_plan_free(&plan);
    return rc ? CP_EXIT_FAIL : 0;
}

static int cmd_tune(const cli *c, cp_spec *spec) {
    double budget = cp_tune_parse_budget(c->budget ? c->budget : "10m");
    if (budget <= 0)
        cp_fatal(CP_EXIT_USAGE, "--budget %s: expected a time such as 10m, 90s or 1h, at most 30 days", c->budget);
    char outdir[CP_PATH_MAX + 16], err[CP_ERR_MAX * 2];
    snprintf(outdir, sizeof outdir, "runs/%s/tune", spec->name);
    cp_tune_opts o = {.spec_arg = c->spec, .sets = c->sets, .nsets = c->nsets, .sweeps = c->sweeps,
                      .nsweeps = c->nsweeps, .budget = budget, .plan_only = c->plan_only,
                      .outdir = c->outdir ? c->outdir : outdir};
    int rc = cp_cmd_tune(spec, &o, stdout, err, sizeof err);
    if (rc) fprintf(stderr, "cpgen: %s\n", err);
    return rc;
}

static int cmd_tune_kernels(const cli *c, cp_spec *spec) {
    cp_plan plan; /* every kernel in its default: the variants are what is timed */
    if (!build_plan(spec, &plan)) return CP_EXIT_USAGE;
    char err[CP_ERR_MAX * 2];
    int rc = cp_cmd_tune_kernels(&plan, c->outdir, stdout, err, sizeof err);
    if (rc) fprintf(stderr, "cpgen: %s\n", err);
    cp_plan_free(&plan);
    return rc ? CP_EXIT_FAIL : 0;
}

static int cmd_run(const cli *c, cp_spec *spec) {
    char why[512];
    int gpus = cp_gpu_count(why, sizeof why);
    if (gpus <= 0) {
        printf("cpgen: no GPU found (%s): printing the plan of %s instead of training.\n\n", why, spec->path);
        int rc = cmd_plan(c, spec);
        char err[CP_ERR_MAX];
        if (!rc && cp_run_outputs_check(spec, c->trace, err, sizeof err)) { /* as a run would find them */
            fprintf(stderr, "cpgen: %s\n", err);
            rc = CP_EXIT_USAGE;
        }
        if (rc || (!c->resume && !c->bundle)) return rc;
        cp_plan plan; /* one plan for the checks a GPU run makes before its GPU is set up */
        if (!plan_for_run(c, spec, &plan, NULL)) return CP_EXIT_USAGE;
        if (c->resume) rc = check_resume(c, spec, &plan);
        if (!rc && c->bundle) {
            cp_bundle b;
            printf("\n");
            rc = check_bundle(c, &plan, c->arch, &b, true);
            if (!rc) cp_bundle_close(&b);
        }
        cp_plan_free(&plan);
        return rc;
    }
    cp_launch_env env;
    char err[CP_ERR_MAX];
    if (cp_launch_detect(&env, err, sizeof err)) {
        fprintf(stderr, "cpgen: %s\n", err);
        return CP_EXIT_USAGE;
    }
    /* the plan is printed once: by this process, or by rank 0 of a launcher other than ours */
    bool lead = env.rank == 0, spawned = env.launcher == CP_LAUNCH_CPGEN;
    cp_plan plan;
    if (!plan_for_run(c, spec, &plan, lead && !spawned ? stderr : NULL)) return CP_EXIT_USAGE;
    if (lead && !spawned) cp_plan_print(&plan, stdout, false);
    if (!plan.fits) {
        if (lead) refuse(spec, &plan);
        cp_plan_free(&plan);
        return CP_EXIT_USAGE;
    }
    if (c->resume && resume_refused(c, &plan, lead)) {
        cp_plan_free(&plan);
        return CP_EXIT_USAGE;
    }
    cp_jit_opts o;
    jit_opts_for(c, &o);
    cp_bundle bundle;
    if (c->bundle && check_bundle(c, &plan, o.arch, &bundle, lead && !spawned)) {
        cp_plan_free(&plan);
        return CP_EXIT_USAGE;
    }
    if (!c->bundle && cp_nvrtc_load(err, sizeof err)) { /* before the GPU is set up, not after */
        if (lead) fprintf(stderr, "cpgen: %s\n", err);
        cp_plan_free(&plan);
        return CP_EXIT_FAIL;
    }
    int rc = 0;
    /* the run's processes: one per GPU of every group (replicas x ring x gpus) */
    cp_rank_layout layout = {plan.replicas, plan.ring, plan.C};
    int world = cp_rank_world(&layout), share = cp_plan_ranks_per_gpu(&plan);
    if (world > 1 && env.launcher == CP_LAUNCH_NONE) {
        /* one node, no launcher: start one copy of this command per rank and wait for them */
        int need = (world + share - 1) / share; /* GPUs */
        if (need > gpus) {
            if (world == plan.C && share == 1)
                fprintf(stderr, "cpgen: the plan has parallel.gpus = %d, this machine has %d GPU%s: use --gpus %d, or "
                                "run under mpirun or srun across nodes (README, several GPUs), or check the layout "
                                "with ranks sharing the GPUs here (--ranks-per-gpu %d)\n",
                        plan.C, gpus, gpus == 1 ? "" : "s", gpus, (world + gpus - 1) / gpus);
            else
                fprintf(stderr, "cpgen: the plan has %d replica%s x ring %d x %d GPUs = %d ranks, %d to a GPU: %d GPUs, "
                                "this machine has %d: use fewer replicas or GPUs, run under mpirun or srun across "
                                "nodes (README, several GPUs), or put more ranks on each GPU (--ranks-per-gpu %d)\n",
                        plan.replicas, plan.replicas > 1 ? "s" : "", plan.ring, plan.C, world, share, need, gpus,
                        (world + gpus - 1) / gpus);
            cp_plan_free(&plan);
            return CP_EXIT_USAGE;
        }
        if (share > 1)
            printf("\nstarting %d processes, %d to a GPU on %d GPU%s (each its own NCCL host: for the numbers and "
                   "memory of the layout, not its speed)\n", world, share, need, need > 1 ? "s" : "");
        else
            printf("\nstarting %d processes, one per GPU\n", world);
        fflush(stdout);
        rc = cp_launch_spawn(world, c->argv, NULL, err, sizeof err);
        if (rc == CP_EXIT_STOPPED) printf("%s\n", err); /* rank 0 said where it stopped and how to go on */
        else if (rc) fprintf(stderr, "cpgen: %s\n", err);
        if (c->bundle) cp_bundle_close(&bundle);
        cp_plan_free(&plan);
        return rc == CP_EXIT_STOPPED ? CP_EXIT_STOPPED : rc ? CP_EXIT_FAIL : 0;
    }
    if (env.size != world) {
        if (world == plan.C)
            fprintf(stderr, "cpgen: rank %d: %d processes were started for a plan of parallel.gpus = %d: start one per "
                            "GPU of the plan, or set --gpus %d\n", env.rank, env.size, plan.C, env.size);
        else
            fprintf(stderr, "cpgen: rank %d: %d processes were started for a plan of parallel.replicas = %d x "
                            "parallel.ring = %d x parallel.gpus = %d = %d GPUs: start one per GPU of the plan\n",
                    env.rank, env.size, plan.replicas, plan.ring, plan.C, world);
        if (c->bundle) cp_bundle_close(&bundle);
        cp_plan_free(&plan);
        return CP_EXIT_USAGE;
    }
    if (lead && !spawned) printf("\n");
    fflush(stdout);
    /* preemption: a stop signal ends the run in order after the step it is in, with a checkpoint */
    cp_stop_install(world > 1 ? env.rank : -1);
    cp_train_opts t = {.no_cache = c->no_cache,
                       .stop_request = cp_stop_flag(),
                       .out = stdout,
                       .resume = c->resume,
                       .resume_new_data = c->resume_new_data,
                       .trace_path = c->trace,
                       .bundle = c->bundle ? &bundle : NULL};
    if (c->trace) { /* the second step shows the steady state: the first also warms caches and the allocator */
        int steps = spec->train.steps;
        t.trace_step = c->trace_step ? c->trace_step : CP_MIN(2, steps);
        if (t.trace_step > steps) {
            fprintf(stderr, "cpgen: --trace-step %d is after the run's last step (train.steps = %d): trace an earlier "
                            "step, or --set train.steps=%d\n", t.trace_step, steps, t.trace_step);
            if (c->bundle) cp_bundle_close(&bundle);
            cp_plan_free(&plan);
            return CP_EXIT_USAGE;
        }
    }
    snprintf(t.arch, sizeof t.arch, "%s", o.arch);
    cp_world w;
    bool joined = false;
    if (world > 1) {
        int64_t key[3];
        plan_key(&plan, key);
        rc = cp_world_join(&w, &env, key, share, err, sizeof err);
        joined = rc == 0;
        if (!rc) rc = cp_world_split(&w, &layout, err, sizeof err);
        if (!rc) {
            bool groups = plan.replicas * plan.ring > 1; /* one group: the run's communicator alone, as always */
            t.rank = w.group_rank;
            t.world_rank = w.rank;
            t.device = w.device;
            t.comm = w.of_kind[CP_COMM_ULYSSES];
            t.shard_comm = groups ? w.of_kind[CP_COMM_SHARD] : NULL;
            t.world_comm = groups ? w.of_kind[CP_COMM_WORLD] : NULL;
            t.ring_comm = w.of_kind[CP_COMM_RING];
            t.base_free = w.base_free;
        }
    }
    cp_train_result res = {0};
    if (!rc) rc = cp_train_run(&plan, &t, &res, err, sizeof err);
    int stopped = res.stopped;
    if (!rc && stopped && world > 1) /* each rank's word that it stopped where the others did */
        fprintf(stderr, "cpgen: rank %d: stopped in order after step %d\n", env.rank, res.steps);
    cp_train_result_free(&res);
    if (rc) fprintf(stderr, "cpgen: %s\n", err);
    if (joined) {
        if (rc) cp_world_fail(&w, err); /* the others hear why and stop now, instead of at a deadline */
        else cp_world_leave(&w);
    }
    if (c->bundle) cp_bundle_close(&bundle);
    cp_plan_free(&plan);
    cp_stop_uninstall();
    return rc ? CP_EXIT_FAIL : stopped ? CP_EXIT_STOPPED : 0;
}

/* parallel.gpus = "auto": the launcher's world size, else the GPUs CUDA sees. Called only by a spec that asks, since
 * counting GPUs starts CUDA. */
static int count_gpus(char *found, int len) {
    cp_launch_env env;
    char err[CP_ERR_MAX], why[256] = "";
    bool launched = cp_launch_detect(&env, err, sizeof err) == 0 && env.launcher != CP_LAUNCH_NONE;
    int visible = launched ? 0 : cp_gpu_count(why, sizeof why);
    return cp_launch_auto_gpus(launched ? &env : NULL, visible, why, found, len);
}

int main(int argc, char **argv) {
    cp_check_stdout_at_exit(); /* first: its check runs after every other exit handler */
    cli c;
    parse(argc, argv, &c);
    cp_spec spec;
    char err[CP_ERR_MAX];
    if (!strcmp(c.command, "report")) { /* its argument is a run's out_dir, not a spec */
        int steps = cp_report_write(c.spec, err, sizeof err);
        if (steps < 0) {
            fprintf(stderr, "cpgen: %s\n", err);
            return CP_EXIT_USAGE;
        }
        printf("%s/report.svg: %d steps\n", c.spec, steps);
        if (*err) fprintf(stderr, "cpgen: %s\n", err); /* what was skipped */
        return 0;
    }
    char bundle_spec[CP_PATH_MAX + 16];
    if (!strcmp(c.command, "run") && cp_bundle_is(c.spec)) { /* cpgen run BUNDLE: the bundle's own spec */
        if (c.bundle && strcmp(c.bundle, c.spec))
            cp_fatal(CP_EXIT_USAGE, "%s is a bundle and --bundle names another (%s): give one", c.spec, c.bundle);
        c.bundle = c.spec;
        snprintf(bundle_spec, sizeof bundle_spec, "%s/spec.lua", c.spec);
        c.spec = bundle_spec;
    }
    cp_spec_set_gpu_counter(count_gpus);
    /* every command plans, builds or runs with data.documents and positions resolved from the source's headers */
    if (cp_spec_load(c.spec, c.sets, c.nsets, &spec, err, sizeof err) ||
        cp_data_resolve_documents(&spec, err, sizeof err)) {
        fprintf(stderr, "cpgen: %s\n", err);
        return CP_EXIT_USAGE;
    }
    /* the plan's time for masked documents takes their length: given, or measured on the data's first tokens (where
     * the data is not here, the plan stays with the most work, one document) */
    double mean;
    if (spec.data.documents == CP_DOCS_MASK && spec.data.doc_len == 0 &&
        cp_data_mean_doc_len(&spec, CP_MIN(16 * spec.train.seq_len, (int64_t)1 << 24), &mean, err, sizeof err) == 0 &&
        mean >= 1)
        spec.data.doc_len = (int64_t)llround(mean);
    cp_launch_env env;
    bool said_by_another = cp_launch_detect(&env, err, sizeof err) == 0 && (env.rank != 0 || env.launcher == CP_LAUNCH_CPGEN);
    if (spec.parallel.gpus_auto && !said_by_another) /* once per run, not by every rank */
        fprintf(c.json ? stderr : stdout, "cpgen: parallel.gpus = \"auto\": %s (--gpus N sets another count)\n",
                spec.parallel.gpus_found);
    if (!strcmp(c.command, "plan")) return cmd_plan(&c, &spec);
    if (!strcmp(c.command, "gen") || !strcmp(c.command, "build")) return cmd_gen_or_build(&c, &spec);
    if (!strcmp(c.command, "aot")) return cmd_aot(&c, &spec);
    if (!strcmp(c.command, "tune")) return cmd_tune(&c, &spec);
    if (!strcmp(c.command, "tune-kernels")) return cmd_tune_kernels(&c, &spec);
    return cmd_run(&c, &spec);
}

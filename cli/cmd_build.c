/* cmd_build.c: `cpgen gen` (write every emitted module of a plan as a .cu file) and `cpgen build` (compile them
 * all through the JIT cache and report each kernel's resource use). */
#include "commands.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util.h"

/* Whether a file beginning with head is a source cpgen gen wrote for the module whose new source is ctx: the
 * emitted text starts with its template's first comment line, which a file of the user's would not. */
static bool same_first_line(const char *head, size_t n, const void *ctx) {
    const char *src = ctx;
    size_t line = strcspn(src, "\n");
    return line > 0 && n > line && !memcmp(head, src, line) && head[line] == '\n';
}

int cp_cmd_gen(const cp_plan *plan, const char *outdir, char *err, int errlen) {
    cp_module_src *mods;
    int n = cp_plan_emit(plan, &mods, err, errlen);
    if (n < 0) return -1;
    if (cp_mkdir_p(outdir) != 0) {
        snprintf(err, errlen, "cannot create folder %s (%s); give -o a folder you can write", outdir, strerror(errno));
        cp_module_srcs_free(mods, n);
        return -1;
    }
    /* every file is checked before any is written: a refusal leaves the folder as it was */
    for (int i = 0; i < n; i++) {
        char path[2048], what[CP_KNAME_MAX + 64];
        snprintf(path, sizeof path, "%s/%s.cu", outdir, mods[i].name);
        snprintf(what, sizeof what, "the source cpgen gen writes for module %s", mods[i].name);
        if (cp_may_replace(path, same_first_line, mods[i].source, what, "give another -o, or move it away", err,
                           errlen)) {
            cp_module_srcs_free(mods, n);
            return -1;
        }
    }
    for (int i = 0; i < n; i++) {
        char path[2048];
        snprintf(path, sizeof path, "%s/%s.cu", outdir, mods[i].name);
        if (cp_write_file_atomic(path, mods[i].source, strlen(mods[i].source)) != 0) {
            snprintf(err, errlen, "cannot write %s (%s); give -o a folder you can write", path, strerror(errno));
            cp_module_srcs_free(mods, n);
            return -1;
        }
        printf("wrote %s (", path);
        for (int e = 0; e < mods[i].nentries; e++) printf("%s%s", e ? ", " : "", mods[i].entries[e]);
        printf(")\n");
    }
    /* Each file stands alone (templates include only cuda_bf16.h), so one line reproduces any compile. */
    printf("%d modules; compile one with: nvcc -cubin -arch=sm_90a -std=c++17 -Xptxas -v %s/<module>.cu\n", n,
           outdir);
    cp_module_srcs_free(mods, n);
    return 0;
}

static int num_width(long long v) {
    char b[32];
    return snprintf(b, sizeof b, "%lld", v);
}

int cp_cmd_build(const cp_plan *plan, const cp_jit_opts *opts, FILE *out, char *err, int errlen) {
    cp_module_src *mods;
    int n = cp_plan_emit(plan, &mods, err, errlen);
    if (n < 0) return -1;
    cp_jit_module *jm = cp_xcalloc((size_t)CP_MAX(n, 1), sizeof *jm);
    double t0 = cp_now();
    if (cp_jit_compile(mods, n, opts, jm, err, errlen) != 0) {
        free(jm);
        cp_module_srcs_free(mods, n);
        return -1;
    }
    double wall = cp_now() - t0;

    int wmod = (int)strlen("module"), went = (int)strlen("entry"), wreg = 4, wsh = 6, wst = 5, wsp = 11;
    for (int i = 0; i < n; i++) {
        wmod = CP_MAX(wmod, (int)strlen(jm[i].name));
        for (int e = 0; e < jm[i].nentries; e++) {
            const cp_entry_info *x = &jm[i].entries[e];
            went = CP_MAX(went, (int)strlen(x->name));
            wsh = CP_MAX(wsh, num_width(x->shared_bytes));
            wst = CP_MAX(wst, num_width(x->stack_bytes));
            wsp = CP_MAX(wsp, num_width(x->spill_stores) + 1 + num_width(x->spill_loads));
        }
    }
    fprintf(out, "%-*s  %-*s  %*s  %*s  %*s  %*s  %9s  %s\n", wmod, "module", went, "entry", wreg, "regs", wsh,
            "shared", wst, "stack", wsp, "spill st/ld", "compile", "cached");
    int ncached = 0, nentries = 0, nspill = 0;
    double sum = 0;
    cp_str spills = {0};
    for (int i = 0; i < n; i++) {
        ncached += jm[i].from_cache;
        sum += jm[i].seconds;
        for (int e = 0; e < jm[i].nentries; e++) {
            const cp_entry_info *x = &jm[i].entries[e];
            char sp[48], secs[24];
            snprintf(sp, sizeof sp, "%d/%d", x->spill_stores, x->spill_loads);
            snprintf(secs, sizeof secs, "%.2f s", jm[i].seconds);
            fprintf(out, "%-*s  %-*s  %*d  %*d  %*d  %*s", wmod, e ? "" : jm[i].name, went, x->name, wreg,
                    x->registers, wsh, x->shared_bytes, wst, x->stack_bytes, wsp, sp);
            if (e == 0) fprintf(out, "  %9s  %s", secs, jm[i].from_cache ? "yes" : "no");
            fputc('\n', out);
            nentries++;
            if (x->spill_stores > 0 || x->spill_loads > 0) {
                nspill++;
                cp_str_printf(&spills, "%s%s (%d B stores, %d B loads)", nspill > 1 ? ", " : "", x->name,
                              x->spill_stores, x->spill_loads);
            }
        }
    }
    char dir[1024];
    cp_jit_cache_dir(opts, dir, sizeof dir);
    int threads = opts->threads > 0 ? opts->threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    fprintf(out, "\n%d modules, %d entries for %s: %d compiled, %d from cache; wall %.2f s (%.2f s of work on %d "
            "threads); cache %s\n", n, nentries, opts->arch[0] ? opts->arch : "sm_90a", n - ncached, ncached, wall,
            sum, threads, dir);
    for (int i = 0; i < n; i++)
        if (jm[i].warnings) fprintf(out, "notes from compiling %s:\n%s", jm[i].name, jm[i].warnings);

    /* What a later run pays at start-up: the same modules, all from the cache. */
    cp_jit_opts again = *opts;
    again.no_cache = false;
    cp_jit_module *jm2 = cp_xcalloc((size_t)CP_MAX(n, 1), sizeof *jm2);
    double t1 = cp_now();
    int rc = cp_jit_compile(mods, n, &again, jm2, err, errlen);
    double load = cp_now() - t1;
    if (rc == 0) {
        int hits = 0;
        for (int i = 0; i < n; i++) hits += jm2[i].from_cache;
        fprintf(out, "cached load: %.3f s (%d/%d modules from cache)\n", load, hits, n);
        if (hits < n)
            fprintf(out, "warning: %d modules were not found in the cache just after being written; is %s writable?\n",
                    n - hits, dir);
        for (int i = 0; i < n; i++) cp_jit_module_free(&jm2[i]);
    }
    free(jm2);

    if (rc == 0 && nspill > 0) {
        fprintf(out, "%d entries spill registers to local memory: %s\n", nspill, spills.data);
        if (opts->fail_on_spill) {
            snprintf(err, errlen, "%d entries spill registers to local memory: %s; lower the template's tile sizes or "
                     "register use, or build without failing on spills", nspill, spills.data);
            rc = -1;
        }
    }
    cp_str_free(&spills);
    for (int i = 0; i < n; i++) cp_jit_module_free(&jm[i]);
    free(jm);
    cp_module_srcs_free(mods, n);
    return rc;
}

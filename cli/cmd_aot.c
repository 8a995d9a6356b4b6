/* cmd_aot.c: `cpgen aot` (compile every module of a plan for one or more architectures into a bundle folder) and the
 * check `cpgen run BUNDLE` makes of a bundle before any GPU memory is taken. */
#include "commands.h"

#include <stdlib.h>
#include <string.h>

#include "bundle.h"
#include "util.h"

/* "sm_90a,sm_80" into names; returns their number, or -1 with a message. */
static int split_archs(const char *csv, char names[][16], int max, char *err, int errlen) {
    int n = 0;
    for (const char *p = csv; *p;) {
        size_t len = strcspn(p, ",");
        if (len == 0 || len >= 16)
            return cp_errf(err, errlen, "--arch %s: expected architectures separated by commas, e.g. --arch "
                           "sm_90a,sm_80", csv);
        if (n == max) return cp_errf(err, errlen, "--arch %s: at most %d architectures in one bundle", csv, max);
        snprintf(names[n++], 16, "%.*s", (int)len, p);
        p += len + (p[len] == ',');
    }
    if (!n) return cp_errf(err, errlen, "--arch is empty; e.g. --arch sm_90a");
    return n;
}

int cp_cmd_aot(const cp_plan *plan, const char *outdir, const char *archs_csv, const cp_jit_opts *jo,
               const char *command, FILE *out, char *err, int errlen) {
    char names[CP_BUNDLE_MAX_ARCHS][16];
    int na = split_archs(archs_csv, names, CP_BUNDLE_MAX_ARCHS, err, errlen);
    if (na < 0) return -1;
    const char *archs[CP_BUNDLE_MAX_ARCHS];
    for (int a = 0; a < na; a++) archs[a] = names[a];
    double t0 = cp_now();
    if (cp_bundle_write(outdir, plan, archs, na, jo, command, err, errlen)) return -1;
    double secs = cp_now() - t0;
    cp_bundle b;
    if (cp_bundle_open(outdir, &b, err, errlen)) return -1;
    int wname = (int)strlen("module");
    for (int i = 0; i < b.nmodules; i++) wname = CP_MAX(wname, (int)strlen(b.modules[i].name));
    fprintf(out, "%-*s  %-7s  %7s  %5s  %8s  %10s  %s\n", wname, "module", "arch", "entries", "regs", "shared",
            "cubin", "sha256");
    int64_t total = 0;
    for (int i = 0; i < b.nmodules; i++)
        for (int a = 0; a < b.narchs; a++) {
            const cp_bundle_cubin *c = &b.modules[i].cubins[a];
            int regs = 0, shared = 0;
            for (int e = 0; e < c->nentries; e++) {
                regs = CP_MAX(regs, c->entries[e].registers);
                shared = CP_MAX(shared, c->entries[e].shared_bytes);
            }
            char sz[32];
            fprintf(out, "%-*s  %-7s  %7d  %5d  %8d  %10s  %.16s\n", wname, a ? "" : b.modules[i].name, b.archs[a],
                    c->nentries, regs, shared, cp_fmt_bytes(c->bytes, sz, sizeof sz), c->sha256);
            total += c->bytes;
        }
    char sz[32];
    fprintf(out, "\nbundle %s: %d modules x %d architecture%s, %s of cubins, in %.2f s\n  cpgen %s, NVRTC %s, spec "
            "sha256 %.16s..., plan sha256 %.16s...\n  run it (no NVRTC needed): cpgen run %s\n", outdir, b.nmodules,
            b.narchs, b.narchs > 1 ? "s" : "", cp_fmt_bytes(total, sz, sizeof sz), secs, b.version, b.nvrtc,
            b.spec_sha256, b.plan_sha256, outdir);
    cp_bundle_close(&b);
    return 0;
}

int cp_cmd_bundle_check(const cp_plan *plan, const char *dir, const char *arch, const char *rebuild, cp_bundle *b,
                        FILE *out, char *err, int errlen) {
    if (cp_bundle_open(dir, b, err, errlen)) return -1;
    char archs[128];
    cp_bundle_arch_list(b, ",", archs, sizeof archs);
    cp_str note = {0}, cmd = {0};
    cp_str_printf(&cmd, "%s --arch %s", rebuild, arch ? arch : archs);
    int rc = cp_bundle_check(b, plan, arch, cmd.data, &note, err, errlen);
    cp_str_free(&cmd);
    if (rc) {
        cp_str_free(&note);
        cp_bundle_close(b);
        return -1;
    }
    if (out) {
        cp_bundle_arch_list(b, ", ", archs, sizeof archs);
        fprintf(out, "bundle %s: %d modules for %s (cpgen %s), every cubin matches its SHA-256; nothing is compiled\n",
                dir, b->nmodules, arch ? arch : archs, b->version);
        if (note.data) fprintf(out, "bundle %s: %s\n", dir, note.data);
    }
    cp_str_free(&note);
    return 0;
}

/* emit.h: fill CUDA C templates (templates/<family>.cu, embedded in the binary) with shapes, giving one
 * self-contained source file per kernel module.
 *
 * Template conventions (checked by the emitter):
 *  - placeholders are {{KEY}}; every placeholder must be given a value and every value must be used;
 *  - the first line containing "module:" names the module with placeholders, e.g. "// module: rmsnorm_h{{HIDDEN}}";
 *    the module name starts with the family name (the template's file stem);
 *  - kernels are `extern "C" __global__` and named <family>_<role><suffix>, where the suffix is the module
 *    name minus the family prefix: module rmsnorm_h4096 has entries rmsnorm_fwd_h4096, rmsnorm_bwd_h4096;
 *  - a spec's variant tag (a kernel variant other than the generator's default, kernels.h cp_kvariants) is appended
 *    by the emitter as _<tag> to the module name, on its module line, and to every entry's name, so that templates
 *    need no placeholder for it in every name and two variants of one shape never share a name. */
#ifndef CP_EMIT_H
#define CP_EMIT_H

#include <stdint.h>

#define CP_MAX_PARAMS 24
#define CP_MAX_ENTRIES 32
#define CP_KNAME_MAX 128
#define CP_KTAG_MAX 16

typedef struct {
    char key[32];
    char *value; /* owned */
} cp_param;

/* A request for one module: which template, with which values. */
typedef struct {
    char family[32];
    char tag[CP_KTAG_MAX]; /* the variant's name tag ([a-z0-9]), empty for the generator's default */
    int nparams;
    cp_param params[CP_MAX_PARAMS];
} cp_kernel_spec;

void cp_kspec_init(cp_kernel_spec *k, const char *family);
void cp_kspec_set_int(cp_kernel_spec *k, const char *key, int64_t v);
/* Writes a float literal that round-trips (e.g. "1e-05f" style is the template's business: value is %.17g). */
void cp_kspec_set_double(cp_kernel_spec *k, const char *key, double v);
void cp_kspec_set_str(cp_kernel_spec *k, const char *key, const char *v);
void cp_kspec_copy(cp_kernel_spec *dst, const cp_kernel_spec *src);
void cp_kspec_free(cp_kernel_spec *k);

/* An emitted module. */
typedef struct {
    char family[32];
    char name[CP_KNAME_MAX];  /* module name with shapes, e.g. "rmsnorm_h4096" */
    char *source;             /* owned CUDA C text */
    int nentries;
    char entries[CP_MAX_ENTRIES][CP_KNAME_MAX];
} cp_module_src;

/* Emit one module. Returns 0, or -1 with a message in err (unknown template, unknown or unused placeholder,
 * bad module line, entry not following the naming convention, a bad variant tag). */
int cp_emit(const cp_kernel_spec *k, cp_module_src *out, char *err, int errlen);
/* Same, from template text given directly (tests). */
int cp_emit_text(const char *family, const char *template_text, const cp_kernel_spec *k, cp_module_src *out,
                 char *err, int errlen);
void cp_module_src_free(cp_module_src *m);

/* "<family>_<role><suffix>" for a module name; writes into out (CP_KNAME_MAX). */
void cp_entry_name(const char *family, const char *module_name, const char *role, char *out);

#endif

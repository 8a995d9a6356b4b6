/* embedded.h: files compiled into the binary (the kernel templates and shipped specs) so cpgen runs from any folder.
 * The table is generated at build time by tools/embed.c. */
#ifndef CP_EMBEDDED_H
#define CP_EMBEDDED_H

#include <stddef.h>

typedef struct {
    const char *name; /* path relative to the source tree: "templates/rmsnorm.cu", "specs/tiny.lua" */
    const char *text;
    size_t len;
} cp_embedded_file;

extern const cp_embedded_file cp_embedded_files[];
extern const int cp_embedded_count;

/* The embedded file with that name, or NULL. */
const cp_embedded_file *cp_embedded_find(const char *name);

#endif

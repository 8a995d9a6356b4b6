/* util.h: small helpers shared by the generator: error reporting, sizes and lengths, string buffers. */
#ifndef CP_UTIL_H
#define CP_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#define CP_VERSION "0.1.0"

#define CP_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define CP_MIN(a, b) ((a) < (b) ? (a) : (b))
#define CP_MAX(a, b) ((a) > (b) ? (a) : (b))

/* Exit codes: 0 ok, 1 runtime failure, 2 bad input (spec, flags, files). */
enum { CP_EXIT_OK = 0, CP_EXIT_FAIL = 1, CP_EXIT_USAGE = 2 };

/* Print "cpgen: <message>" to stderr and exit with code. */
void cp_fatal(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3), noreturn));

/* Write a message into err (errlen bytes) and return -1: the error convention of every `char *err, int errlen`
 * function. */
int cp_errf(char *err, int errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Allocation that never returns NULL: on failure it stops the program with a message. */
void *cp_xmalloc(size_t n);
void *cp_xcalloc(size_t count, size_t size);
void *cp_xrealloc(void *p, size_t n);
char *cp_xstrdup(const char *s);

/* Parse "141G", "128GiB", "80G", "512M", "1024" into bytes (powers of 1024). Returns false if malformed. */
bool cp_parse_bytes(const char *s, int64_t *out);
/* Parse "128K", "1M", "5M", "4096" into a token count (1K = 1024). Returns false if malformed. */
bool cp_parse_length(const char *s, int64_t *out);
/* Format bytes as "61.20 GiB" / "512.0 MiB" into buf. Returns buf. */
const char *cp_fmt_bytes(int64_t bytes, char *buf, size_t n);
/* Format a token count as "128K", "1M", or "1000" when not a multiple of 1K. */
const char *cp_fmt_length(int64_t n, char *buf, size_t len);
/* Format a number with thousands separators: 3140 -> "3,140". */
const char *cp_fmt_count(double v, char *buf, size_t n);

/* Levenshtein distance, for did-you-mean suggestions. */
int cp_edit_distance(const char *a, const char *b);

/* A growable string. */
typedef struct {
    char *data;
    size_t len, cap;
} cp_str;
void cp_str_append(cp_str *s, const char *text, size_t n);
void cp_str_printf(cp_str *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void cp_str_free(cp_str *s);

/* The kinds of file cpgen reads, each with the largest size it accepts (cp_file_max; the one table of bounds is in
 * util.c). Only regular files are read: a FIFO, a device, a socket or a folder is refused without blocking, and a
 * file larger than its kind can be is refused before it is read, so that a spec, cache or `latest` that is a link
 * to /dev/zero, or a 40 GB file named manifest.json, costs nothing but a message. */
typedef enum {
    CP_FILE_ANY,      /* cp_read_file: a file of no particular kind (tests, tools) */
    CP_FILE_SPEC,     /* a Lua spec, and what it loads with dofile or cpgen.load */
    CP_FILE_MANIFEST, /* a bundle's manifest.json */
    CP_FILE_CUBIN,    /* a compiled module: a bundle's cubin, a JIT cache entry */
    CP_FILE_STATE,    /* small state: trainer_state.json, `latest`, a rendezvous file */
    CP_FILE_CACHE,    /* the kernel tuning cache, kernels.jsonl */
    CP_FILE_METRICS,  /* metrics.jsonl */
    CP_FILE_TRACE,    /* one rank's part of a step trace */
    CP_FILE_INDEX,    /* a safetensors index (model.safetensors.index.json) */
    CP_FILE_DATA,     /* safetensors files and token shards: any size (their readers bound their headers) */
    CP_FILE_KINDS
} cp_file_kind;

/* The largest file of this kind cpgen reads, in bytes; -1: no bound. */
int64_t cp_file_max(cp_file_kind kind);
/* "spec", "bundle manifest", ...: the kind in messages. */
const char *cp_file_kind_name(cp_file_kind kind);

/* Open path (links followed) for reading as a file of this kind, never blocking: it must be a regular file no
 * larger than cp_file_max(kind). The descriptor (O_CLOEXEC) with the file's size in *size (may be NULL), or -1 with
 * errno set and, in why (may be NULL), what is wrong as a phrase to put after the path: strerror's text, or "a
 * FIFO, not a regular file", or "5.00 GiB, more than a spec can be (4.00 MiB)". errno is ENOENT only for a missing
 * file, EISDIR for a folder, EINVAL for another kind of non-regular file, EFBIG for a file too large. */
int cp_open_file(const char *path, cp_file_kind kind, int64_t *size, char *why, size_t whylen);
/* Read a whole file of this kind (cp_open_file's checks), NUL-terminated, its length in *len (may be NULL); NULL
 * with errno set and what is wrong in why (may be NULL). A file that grows past the bound while read is refused. */
char *cp_read_file_as(const char *path, cp_file_kind kind, size_t *len, char *why, size_t whylen);
/* cp_read_file_as of CP_FILE_ANY: NULL with errno set on failure. */
char *cp_read_file(const char *path, size_t *len);
/* Up to n bytes from the start of path, which must be a regular file (a link is not followed: it is refused), into
 * buf; the count, or -1 with errno set and what is wrong in why. For looking at a file before replacing it. */
ssize_t cp_read_head(const char *path, char *buf, size_t n, char *why, size_t whylen);

/* Whether cpgen may put a file of its own at path, replacing what is there: nothing, or a regular file (not a link)
 * that is empty or whose first bytes (up to CP_HEAD_MAX) `ours` recognises, given ctx, as what cpgen writes at that
 * place (NULL: nothing is recognised). 0, or -1 with a message that names path, says it is not `what` and ends
 * with `fix`. */
#define CP_HEAD_MAX 4096
typedef bool (*cp_ours_fn)(const char *head, size_t n, const void *ctx);
int cp_may_replace(const char *path, cp_ours_fn ours, const void *ctx, const char *what, const char *fix, char *err,
                   int errlen);
/* Whether a and b name the same existing file (same device and inode). */
bool cp_same_file(const char *a, const char *b);
/* The next line of the text [*p, end), without its newline, as [*line, *line + *n), and *p past it; false at the
 * end. For reading JSON-lines files such as metrics.jsonl. */
bool cp_next_line(char **p, char *end, char **line, size_t *n);
/* Read exactly len bytes at off, retrying short reads. -1 with a message naming path on an error or an early end
 * of file (then `fix` ends the message: what the user should do about a truncated file). */
int cp_pread_all(int fd, void *buf, int64_t len, int64_t off, const char *path, const char *fix, char *err,
                 int errlen);
/* Write a file atomically: write to a new file "<path>.tmp.<pid>.XXXXXX" (never one that exists), fsync, rename.
 * Returns 0 or -1 with errno (the temporary file removed). The caller decides whether path may be replaced
 * (cp_may_replace). */
int cp_write_file_atomic(const char *path, const void *data, size_t len);
/* Remove path and, when it is a folder, everything below it (links not followed); what is missing is no error. */
void cp_remove_tree(const char *path);
/* mkdir -p. Returns 0 or -1 with errno (ENOTDIR where a part of the path exists and is not a folder). */
int cp_mkdir_p(const char *path);

/* FNV-1a 64-bit hash, chainable. */
uint64_t cp_hash64(const void *data, size_t n, uint64_t seed);
#define CP_HASH_SEED 0xcbf29ce484222325ULL

/* SplitMix64's finaliser: a well-mixed 64-bit function of z (seeds, counter-based random streams). */
uint64_t cp_mix64(uint64_t z);

/* Make the exit status 1, with a message, when what was printed on stdout could not all be written (a full disk,
 * stdout closed): called first in main, so its check runs after every other exit handler. A closed stdin, stdout or
 * stderr gets /dev/null, so that no file cpgen opens takes its number and receives its output. */
void cp_check_stdout_at_exit(void);

/* Monotonic wall clock in seconds. */
double cp_now(void);

#endif

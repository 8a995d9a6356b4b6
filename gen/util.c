/* util.c: small helpers shared by the generator (see util.h). */
#include "util.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

void cp_fatal(int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("cpgen: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(code);
}

int cp_errf(char *err, int errlen, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, (size_t)errlen, fmt, ap);
    va_end(ap);
    return -1;
}

void *cp_xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) cp_fatal(CP_EXIT_FAIL, "out of host memory allocating %zu bytes", n);
    return p;
}

void *cp_xcalloc(size_t count, size_t size) {
    void *p = calloc(count ? count : 1, size ? size : 1);
    if (!p) cp_fatal(CP_EXIT_FAIL, "out of host memory allocating %zu x %zu bytes", count, size);
    return p;
}

void *cp_xrealloc(void *p, size_t n) {
    void *q = realloc(p, n ? n : 1);
    if (!q) cp_fatal(CP_EXIT_FAIL, "out of host memory growing a buffer to %zu bytes", n);
    return q;
}

char *cp_xstrdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = cp_xmalloc(n);
    memcpy(d, s, n);
    return d;
}

/* Parses "<number><suffix>" where suffix scales by powers of 1024; `units` lists accepted suffix letters. */
static bool parse_scaled(const char *s, int64_t *out, bool allow_b) {
    if (!s || !*s) return false;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno || !(v >= 0) || isinf(v)) return false;
    while (*end == ' ') end++;
    double scale = 1;
    switch (toupper((unsigned char)*end)) {
    case 'K': scale = 1024.0; end++; break;
    case 'M': scale = 1024.0 * 1024; end++; break;
    case 'G': scale = 1024.0 * 1024 * 1024; end++; break;
    case 'T': scale = 1024.0 * 1024 * 1024 * 1024; end++; break;
    default: break;
    }
    if (allow_b) {
        if (*end == 'i' && scale > 1) end++;
        if (toupper((unsigned char)*end) == 'B') end++;
    }
    if (*end) return false;
    double r = v * scale;
    if (scale > 1) r = floor(r + 0.5); /* "1.05G" means the nearest whole byte or token */
    if (r > 9.0e18 || r != floor(r)) return false;
    *out = (int64_t)r;
    return true;
}

bool cp_parse_bytes(const char *s, int64_t *out) { return parse_scaled(s, out, true); }
bool cp_parse_length(const char *s, int64_t *out) { return parse_scaled(s, out, false); }

const char *cp_fmt_bytes(int64_t bytes, char *buf, size_t n) {
    double b = (double)bytes;
    const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (fabs(b) >= 1024 && u < 4) {
        b /= 1024;
        u++;
    }
    if (u == 0) snprintf(buf, n, "%lld B", (long long)bytes);
    else snprintf(buf, n, "%.2f %s", b, unit[u]);
    return buf;
}

const char *cp_fmt_length(int64_t v, char *buf, size_t len) {
    if (v >= 1024 * 1024 && v % (1024 * 1024) == 0) snprintf(buf, len, "%lldM", (long long)(v >> 20));
    else if (v >= 1024 && v % 1024 == 0) snprintf(buf, len, "%lldK", (long long)(v >> 10));
    else snprintf(buf, len, "%lld", (long long)v);
    return buf;
}

const char *cp_fmt_count(double v, char *buf, size_t n) {
    char digits[64];
    snprintf(digits, sizeof digits, "%.0f", fabs(v));
    size_t nd = strlen(digits), o = 0;
    if (v < 0 && o + 1 < n) buf[o++] = '-';
    for (size_t i = 0; i < nd && o + 2 < n; i++) {
        if (i && (nd - i) % 3 == 0) buf[o++] = ',';
        buf[o++] = digits[i];
    }
    buf[o] = 0;
    return buf;
}

int cp_edit_distance(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    if (la > 63 || lb > 63) return 64;
    int d[64][64];
    for (size_t i = 0; i <= la; i++) d[i][0] = (int)i;
    for (size_t j = 0; j <= lb; j++) d[0][j] = (int)j;
    for (size_t i = 1; i <= la; i++)
        for (size_t j = 1; j <= lb; j++) {
            int cost = a[i - 1] != b[j - 1];
            int best = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < best) best = d[i][j - 1] + 1;
            if (d[i - 1][j - 1] + cost < best) best = d[i - 1][j - 1] + cost;
            d[i][j] = best;
        }
    return d[la][lb];
}

void cp_str_append(cp_str *s, const char *text, size_t n) {
    if (s->len + n + 1 > s->cap) {
        s->cap = CP_MAX(s->cap * 2, s->len + n + 1);
        if (s->cap < 256) s->cap = 256;
        s->data = cp_xrealloc(s->data, s->cap);
    }
    memcpy(s->data + s->len, text, n);
    s->len += n;
    s->data[s->len] = 0;
}

void cp_str_printf(cp_str *s, const char *fmt, ...) {
    char small[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof small) {
        cp_str_append(s, small, (size_t)n);
        return;
    }
    char *big = cp_xmalloc((size_t)n + 1);
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    cp_str_append(s, big, (size_t)n);
    free(big);
}

void cp_str_free(cp_str *s) {
    free(s->data);
    s->data = NULL;
    s->len = s->cap = 0;
}

/* The bounds of cp_file_kind, in one place. A spec, a manifest or a state file is text a person could read: a few
 * MiB is far beyond any real one. A cubin of the largest shipped plan is a few MiB; hundreds leave room. metrics.jsonl
 * grows by ~300 bytes a step: 1 GiB is millions of steps. A safetensors index of the largest Hugging Face models is
 * a few MiB; 100 MB is safetensors' own bound on a header. */
static const struct {
    const char *name;
    int64_t max;
} file_kinds[CP_FILE_KINDS] = {
    [CP_FILE_ANY] = {"file", (int64_t)1 << 30},
    [CP_FILE_SPEC] = {"spec", (int64_t)4 << 20},
    [CP_FILE_MANIFEST] = {"bundle manifest", (int64_t)16 << 20},
    [CP_FILE_CUBIN] = {"compiled kernel module", (int64_t)512 << 20},
    [CP_FILE_STATE] = {"state file", (int64_t)16 << 20},
    [CP_FILE_CACHE] = {"kernel tuning cache", (int64_t)64 << 20},
    [CP_FILE_METRICS] = {"metrics file", (int64_t)1 << 30},
    [CP_FILE_TRACE] = {"trace part", (int64_t)1 << 30},
    [CP_FILE_INDEX] = {"safetensors index", 100000000},
    [CP_FILE_DATA] = {"data file", -1},
};

int64_t cp_file_max(cp_file_kind kind) { return (unsigned)kind < CP_FILE_KINDS ? file_kinds[kind].max : 0; }

const char *cp_file_kind_name(cp_file_kind kind) {
    return (unsigned)kind < CP_FILE_KINDS ? file_kinds[kind].name : "file";
}

/* What a file of mode m is, when it is not a regular file. */
static const char *type_name(mode_t m) {
    if (S_ISDIR(m)) return "a folder";
    if (S_ISFIFO(m)) return "a FIFO (named pipe)";
    if (S_ISCHR(m)) return "a character device";
    if (S_ISBLK(m)) return "a block device";
    if (S_ISSOCK(m)) return "a socket";
    if (S_ISLNK(m)) return "a symbolic link";
    return "not a regular file";
}

static void say(char *why, size_t whylen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void say(char *why, size_t whylen, const char *fmt, ...) {
    if (!why || !whylen) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, whylen, fmt, ap);
    va_end(ap);
}

/* Refuse what st describes unless it is a regular file within the kind's bound; 0, or -1 with errno and why. */
static int check_stat(const struct stat *st, cp_file_kind kind, char *why, size_t whylen) {
    if (!S_ISREG(st->st_mode)) {
        say(why, whylen, "%s, not a regular file", type_name(st->st_mode));
        errno = S_ISDIR(st->st_mode) ? EISDIR : EINVAL;
        return -1;
    }
    int64_t max = cp_file_max(kind);
    if (max >= 0 && st->st_size > max) {
        char a[32], b[32];
        say(why, whylen, "%s, more than a %s can be (%s)", cp_fmt_bytes(st->st_size, a, sizeof a),
            cp_file_kind_name(kind), cp_fmt_bytes(max, b, sizeof b));
        errno = EFBIG;
        return -1;
    }
    return 0;
}

int cp_open_file(const char *path, cp_file_kind kind, int64_t *size, char *why, size_t whylen) {
    struct stat st;
    /* stat first, so a device is never opened; O_NONBLOCK in case it was swapped for a FIFO since */
    if (stat(path, &st) != 0 || check_stat(&st, kind, why, whylen) != 0) {
        if (errno != EISDIR && errno != EINVAL && errno != EFBIG) say(why, whylen, "%s", strerror(errno));
        return -1;
    }
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0) {
        say(why, whylen, "%s", strerror(errno));
        return -1;
    }
    int flags = fstat(fd, &st) == 0 ? fcntl(fd, F_GETFL) : -1;
    if (flags < 0 || check_stat(&st, kind, why, whylen) != 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
        int e = errno;
        if (e != EISDIR && e != EINVAL && e != EFBIG) say(why, whylen, "%s", strerror(e));
        close(fd);
        errno = e;
        return -1;
    }
    if (size) *size = st.st_size;
    return fd;
}

char *cp_read_file_as(const char *path, cp_file_kind kind, size_t *len, char *why, size_t whylen) {
    int64_t size;
    int fd = cp_open_file(path, kind, &size, why, whylen);
    if (fd < 0) return NULL;
    int64_t max = cp_file_max(kind);
    cp_str s = {0};
    cp_str_append(&s, "", 0);
    char chunk[65536];
    for (;;) {
        ssize_t n = read(fd, chunk, sizeof chunk);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            int e = errno;
            say(why, whylen, "%s", strerror(e));
            close(fd);
            cp_str_free(&s);
            errno = e;
            return NULL;
        }
        if (n == 0) break;
        if (max >= 0 && (int64_t)(s.len + (size_t)n) > max) { /* it grew while read: a log being written, or worse */
            char b[32];
            say(why, whylen, "grew past %s, the most a %s can be, while it was read", cp_fmt_bytes(max, b, sizeof b),
                cp_file_kind_name(kind));
            close(fd);
            cp_str_free(&s);
            errno = EFBIG;
            return NULL;
        }
        cp_str_append(&s, chunk, (size_t)n);
    }
    close(fd);
    if (len) *len = s.len;
    return s.data;
}

char *cp_read_file(const char *path, size_t *len) { return cp_read_file_as(path, CP_FILE_ANY, len, NULL, 0); }

ssize_t cp_read_head(const char *path, char *buf, size_t n, char *why, size_t whylen) {
    struct stat st;
    if (lstat(path, &st) != 0) {
        say(why, whylen, "%s", strerror(errno));
        return -1;
    }
    if (!S_ISREG(st.st_mode)) {
        say(why, whylen, "%s, not a regular file", type_name(st.st_mode));
        errno = S_ISDIR(st.st_mode) ? EISDIR : EINVAL;
        return -1;
    }
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_NOCTTY | O_CLOEXEC);
    if (fd < 0) {
        say(why, whylen, "%s", strerror(errno));
        return -1;
    }
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, buf + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            int e = errno;
            say(why, whylen, "%s", strerror(e));
            close(fd);
            errno = e;
            return -1;
        }
        if (r == 0) break;
        got += (size_t)r;
    }
    close(fd);
    return (ssize_t)got;
}

int cp_may_replace(const char *path, cp_ours_fn ours, const void *ctx, const char *what, const char *fix, char *err,
                   int errlen) {
    struct stat st;
    if (lstat(path, &st) != 0) {
        if (errno == ENOENT) return 0;
        return cp_errf(err, errlen, "%s: cannot look at what is there (%s); %s", path, strerror(errno), fix);
    }
    if (!S_ISREG(st.st_mode))
        return cp_errf(err, errlen, "%s exists and is %s, not %s: cpgen replaces only files it wrote; %s", path,
                       type_name(st.st_mode), what, fix);
    char head[CP_HEAD_MAX], why[256];
    ssize_t n = cp_read_head(path, head, sizeof head, why, sizeof why);
    if (n < 0) return cp_errf(err, errlen, "%s exists and cannot be read (%s); %s", path, why, fix);
    if (n > 0 && (!ours || !ours(head, (size_t)n, ctx))) /* an empty file holds nothing to lose */
        return cp_errf(err, errlen, "%s exists and is not %s: cpgen replaces only files it wrote; %s", path, what,
                       fix);
    return 0;
}

bool cp_same_file(const char *a, const char *b) {
    struct stat x, y;
    return stat(a, &x) == 0 && stat(b, &y) == 0 && x.st_dev == y.st_dev && x.st_ino == y.st_ino;
}

bool cp_next_line(char **p, char *end, char **line, size_t *n) {
    if (*p >= end) return false;
    char *nl = memchr(*p, '\n', (size_t)(end - *p));
    if (!nl) nl = end;
    *line = *p;
    *n = (size_t)(nl - *p);
    *p = nl + 1;
    return true;
}

int cp_pread_all(int fd, void *buf, int64_t len, int64_t off, const char *path, const char *fix, char *err,
                 int errlen) {
    char *p = buf;
    while (len > 0) {
        ssize_t r = pread(fd, p, (size_t)CP_MIN(len, (int64_t)1 << 30), (off_t)off);
        if (r < 0) {
            if (errno == EINTR) continue;
            return cp_errf(err, errlen, "%s: reading %lld bytes at byte %lld failed: %s", path, (long long)len,
                           (long long)off, strerror(errno));
        }
        if (r == 0)
            return cp_errf(err, errlen, "%s: the file ends at byte %lld, before the data it promised: it was "
                           "truncated or changed while open; %s", path, (long long)off, fix);
        p += r;
        len -= r;
        off += r;
    }
    return 0;
}

int cp_write_file_atomic(const char *path, const void *data, size_t len) {
    char tmp[4096];
    int w = snprintf(tmp, sizeof tmp, "%s.tmp.%ld.XXXXXX", path, (long)getpid());
    if (w < 0 || (size_t)w >= sizeof tmp) {
        errno = ENAMETOOLONG;
        return -1;
    }
    /* a new name: a file of the user's that happens to be called "<path>.tmp.<pid>" is never truncated */
    int fd = mkostemp(tmp, O_CLOEXEC);
    if (fd < 0) return -1;
    if (fchmod(fd, 0644) != 0) goto fail; /* mkostemp makes 0600; outputs are read by others, as before */
    const char *p = data;
    size_t left = len;
    while (left > 0) {
        ssize_t n = write(fd, p, left);
        if (n < 0) {
            if (errno == EINTR) continue;
            goto fail;
        }
        p += n;
        left -= (size_t)n;
    }
    if (fsync(fd) != 0) goto fail;
    if (close(fd) != 0) {
        fd = -1;
        goto fail;
    }
    if (rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        errno = e;
        return -1;
    }
    return 0;
fail: {
    int e = errno;
    if (fd >= 0) close(fd);
    unlink(tmp);
    errno = e;
    return -1;
}
}

int cp_mkdir_p(const char *path) {
    char buf[4096];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf) {
        errno = ENAMETOOLONG;
        return -1;
    }
    struct stat st;
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(buf, 0755) != 0 && errno != EEXIST) return -1;
        *p = '/';
    }
    if (mkdir(buf, 0755) != 0 && errno != EEXIST) return -1;
    /* EEXIST is also a file of that name: the folder is not there, and writing into it would fail less clearly */
    if (stat(buf, &st) != 0) return -1;
    if (!S_ISDIR(st.st_mode)) {
        errno = ENOTDIR;
        return -1;
    }
    return 0;
}

uint64_t cp_hash64(const void *data, size_t n, uint64_t h) {
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}

uint64_t cp_mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

double cp_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

void cp_remove_tree(const char *path) { (void)nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS); }

static bool stdout_closed;

static void check_stdout(void) {
    if (stdout_closed) {
        fprintf(stderr, "cpgen: stdout was closed: nothing that was printed could be written; run it with stdout "
                        "open (a file, a pipe, or /dev/null to drop it)\n");
        _exit(CP_EXIT_FAIL);
    }
    errno = 0;
    bool flushed = fflush(stdout) == 0;
    int e = errno;
    if (flushed && !ferror(stdout)) return; /* ferror: a write that failed earlier, with its bytes lost */
    fprintf(stderr, "cpgen: writing to stdout failed (%s): what was printed is incomplete; free space, or send the "
                    "output where it can be written\n", flushed || !e ? "an earlier write failed" : strerror(e));
    _exit(CP_EXIT_FAIL);
}

void cp_check_stdout_at_exit(void) {
    /* A closed 0, 1 or 2 would be the number of the next file opened, and printing would write into it: each gets
     * /dev/null, and a closed stdout fails the command at exit. */
    for (int fd = 0; fd <= 2; fd++) {
        if (fcntl(fd, F_GETFD) != -1 || errno != EBADF) continue;
        int n = open("/dev/null", fd ? O_WRONLY : O_RDONLY);
        if (n >= 0 && n != fd) { /* not the lowest free number: cannot happen, but never leave fd closed */
            dup2(n, fd);
            close(n);
        }
        if (fd == 1) stdout_closed = true;
    }
    (void)atexit(check_stdout);
}

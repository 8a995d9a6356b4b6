/* svg.c: the small SVG writer behind `cpgen plan --svg` and `cpgen report`. Every text goes through XML escaping,
 * since spec paths look like "<embedded>/llama8b.lua". */
#include "svg.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util.h"

static void put_escaped(FILE *f, const char *t) {
    for (; *t; t++) {
        switch (*t) {
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '&': fputs("&amp;", f); break;
        case '"': fputs("&quot;", f); break;
        default: fputc(*t, f);
        }
    }
}

#define SVG_HEAD "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" width=\""

bool cp_svg_is_ours(const char *head, size_t n, const void *ctx) {
    (void)ctx;
    /* the exact header cp_svg_begin writes, up to the title: another program's SVG is laid out otherwise */
    static const char end[] = "\" font-family=\"sans-serif\">\n<title>";
    size_t hl = strlen(SVG_HEAD), el = strlen(end);
    if (n < hl || memcmp(head, SVG_HEAD, hl)) return false;
    const char *nl = memchr(head + hl, '\n', n - hl); /* the end of the <svg ...> line; "<title>" follows */
    if (!nl) return false;
    size_t at = (size_t)(nl + 1 - head) + strlen("<title>");
    return at <= n && at >= hl + el && !memcmp(head + at - el, end, el);
}

int cp_svg_begin(cp_svg *s, const char *path, int width, int height, const char *title, char *err, int errlen) {
    memset(s, 0, sizeof *s);
    if (snprintf(s->path, sizeof s->path, "%s", path) >= (int)sizeof s->path)
        return cp_errf(err, errlen, "%.200s...: the path is too long for a picture", path);
    struct stat st;
    if (!*path || path[strlen(path) - 1] == '/' || (stat(path, &st) == 0 && S_ISDIR(st.st_mode)))
        return cp_errf(err, errlen, "%s: give a file name for the picture, e.g. %s%smemory.svg", path, path,
                       *path && path[strlen(path) - 1] != '/' ? "/" : "");
    if (cp_may_replace(path, cp_svg_is_ours, NULL, "a picture cpgen drew", "move it away, or give another file", err,
                       errlen))
        return -1;
    snprintf(s->tmp, sizeof s->tmp, "%s.tmp.%ld.XXXXXX", path, (long)getpid());
    int fd = mkostemp(s->tmp, O_CLOEXEC);
    if (fd < 0 || fchmod(fd, 0644) != 0 || !(s->f = fdopen(fd, "w"))) {
        int e = errno;
        if (fd >= 0) {
            close(fd);
            unlink(s->tmp);
        }
        return cp_errf(err, errlen, "cannot write %s: %s; give a path in a folder you can write", path, strerror(e));
    }
    fprintf(s->f,
            SVG_HEAD "%d\" height=\"%d\" viewBox=\"0 0 %d %d\" font-family=\"sans-serif\">\n<title>",
            width, height, width, height);
    put_escaped(s->f, title);
    fprintf(s->f, "</title>\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
    return 0;
}

int cp_svg_end(cp_svg *s, char *err, int errlen) {
    fprintf(s->f, "</svg>\n");
    errno = 0;
    bool bad = fflush(s->f) != 0 || ferror(s->f) || fsync(fileno(s->f)) != 0;
    int e = errno;
    if (fclose(s->f) != 0 && !bad) bad = true, e = errno;
    s->f = NULL;
    if (!bad && rename(s->tmp, s->path) != 0) bad = true, e = errno;
    if (bad) {
        unlink(s->tmp);
        return cp_errf(err, errlen, "writing %s failed: %s; nothing was written there (free space, or give a path "
                       "you can write)", s->path, e ? strerror(e) : "a write error");
    }
    return 0;
}

double cp_svg_px(const cp_svg_panel *p, double x) {
    return p->x + (p->x1 > p->x0 ? (x - p->x0) / (p->x1 - p->x0) : 0) * p->w;
}

double cp_svg_py(const cp_svg_panel *p, double y) {
    return p->y + p->h - (p->y1 > p->y0 ? (y - p->y0) / (p->y1 - p->y0) : 0) * p->h;
}

void cp_svg_text(cp_svg *s, double x, double y, const char *anchor, int size, const char *fill, const char *fmt, ...) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fprintf(s->f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"%s\" font-size=\"%d\" fill=\"%s\">", x, y, anchor, size,
            fill);
    put_escaped(s->f, buf);
    fprintf(s->f, "</text>\n");
}

void cp_svg_hline(cp_svg *s, const cp_svg_panel *p, double y, const char *color, const char *dash, const char *id) {
    fprintf(s->f, "<line");
    if (id) fprintf(s->f, " id=\"%s\"", id);
    fprintf(s->f, " x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"1.5\"", p->x,
            p->x + p->w, cp_svg_py(p, y), cp_svg_py(p, y), color);
    if (*dash) fprintf(s->f, " stroke-dasharray=\"%s\"", dash);
    fprintf(s->f, "/>\n");
}

double cp_svg_nice_step(double span, int n) {
    if (!(span > 0) || n < 1) return 1;
    double raw = span / n, mag = pow(10, floor(log10(raw))), f = raw / mag;
    return (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10) * mag;
}

/* A tick's label: large values with a K, M or G suffix ("2.5M", not "2.5e+06"), which also keeps the y labels
 * clear of the axis title. */
static void tick_label(char *out, size_t n, double v, double step, double axis_max) {
    if (fabs(v) < step * 1e-9) v = 0;
    static const char *const suffix[] = {"K", "M", "G"};
    for (int i = 2; i >= 0; i--) {
        double unit = pow(1e3, i + 1);
        if (axis_max >= 10 * unit) {
            snprintf(out, n, "%g%s", v / unit, v == 0 ? "" : suffix[i]);
            return;
        }
    }
    snprintf(out, n, "%g", v);
}

/* At most this many ticks on an axis. A range far from 0 and narrow next to its magnitude (steps 1e16 to 1e16 + 1)
 * has a tick step that adding does not change, and the loop must end anyway. */
#define MAX_TICKS 64

static void axis_ticks(cp_svg *s, const cp_svg_panel *p, bool x_axis) {
    double a = x_axis ? p->x0 : p->y0, b = x_axis ? p->x1 : p->y1;
    double step = cp_svg_nice_step(b - a, x_axis ? 8 : 5);
    fprintf(s->f, "<g class=\"axis %s\">\n", x_axis ? "x" : "y");
    double first = ceil(a / step) * step;
    for (int i = 0; i < MAX_TICKS && isfinite(a) && isfinite(b); i++) {
        double v = first + i * step;
        if (v > b + step * 1e-9 || (i > 0 && v == first + (i - 1) * step)) break;
        char label[32];
        tick_label(label, sizeof label, v, step, fmax(fabs(a), fabs(b)));
        if (x_axis) {
            double px = cp_svg_px(p, v);
            fprintf(s->f, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#888\"/>\n", px, px,
                    p->y + p->h, p->y + p->h + 4);
            cp_svg_text(s, px, p->y + p->h + 16, "middle", 11, "#333", "%s", label);
        } else {
            double py = cp_svg_py(p, v);
            fprintf(s->f, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#eee\"/>\n", p->x,
                    p->x + p->w, py, py);
            cp_svg_text(s, p->x - 6, py + 4, "end", 11, "#333", "%s", label);
        }
    }
    fprintf(s->f, "</g>\n");
}

void cp_svg_panel_begin(cp_svg *s, const cp_svg_panel *p, const char *id, const char *title, const char *xlabel,
                        const char *ylabel) {
    fprintf(s->f, "<g id=\"%s\">\n", id);
    cp_svg_text(s, p->x, p->y - 10, "start", 14, "#000", "%s", title);
    axis_ticks(s, p, false);
    axis_ticks(s, p, true);
    fprintf(s->f, "<rect class=\"frame\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" "
                  "stroke=\"#444\"/>\n",
            p->x, p->y, p->w, p->h);
    cp_svg_text(s, p->x + p->w / 2, p->y + p->h + 34, "middle", 12, "#000", "%s", xlabel);
    fprintf(s->f, "<g transform=\"translate(%.1f %.1f) rotate(-90)\">", p->x - 46, p->y + p->h / 2);
    cp_svg_text(s, 0, 0, "middle", 12, "#000", "%s", ylabel);
    fprintf(s->f, "</g>\n");
}

void cp_svg_panel_end(cp_svg *s) { fprintf(s->f, "</g>\n"); }

static void begin_series(cp_svg *s, const char *name) {
    fprintf(s->f, "<path class=\"series\" data-name=\"");
    put_escaped(s->f, name);
    fprintf(s->f, "\" d=\"");
}

/* A series of more points than this is drawn as the lowest and highest point of each of SERIES_MAX_POINTS / 2
 * runs of consecutive points: a panel is a few hundred pixels wide, so the picture keeps every spike while its size
 * stays bounded however long the run (a million steps would otherwise write tens of MB per line). */
#define SERIES_MAX_POINTS 4096

/* Appends point i to the path, skipping what has no place on the page (NaN: a gap). */
static void series_point(cp_svg *s, const cp_svg_panel *p, const double *x, const double *y, int i, bool *pen) {
    double px = cp_svg_px(p, x[i]), py = cp_svg_py(p, y[i]);
    if (!isfinite(px) || !isfinite(py)) {
        *pen = false;
        return;
    }
    fprintf(s->f, "%s%.1f %.1f ", *pen ? "L" : "M", px, py);
    *pen = true;
}

void cp_svg_series(cp_svg *s, const cp_svg_panel *p, const double *x, const double *y, int n, const char *color,
                   const char *name) {
    begin_series(s, name);
    bool pen = false;
    if (n <= SERIES_MAX_POINTS) {
        for (int i = 0; i < n; i++) series_point(s, p, x, y, i, &pen);
    } else {
        int runs = SERIES_MAX_POINTS / 2;
        for (int r = 0; r < runs; r++) {
            int from = (int)((int64_t)n * r / runs), to = (int)((int64_t)n * (r + 1) / runs), lo = -1, hi = -1;
            for (int i = from; i < to; i++) {
                if (isnan(y[i])) continue;
                if (lo < 0 || y[i] < y[lo]) lo = i;
                if (hi < 0 || y[i] > y[hi]) hi = i;
            }
            if (lo < 0) { /* nothing logged in this run: a gap */
                pen = false;
                continue;
            }
            series_point(s, p, x, y, CP_MIN(lo, hi), &pen);
            if (hi != lo) series_point(s, p, x, y, CP_MAX(lo, hi), &pen);
        }
    }
    fprintf(s->f, "\" fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\"/>\n", color);
}

void cp_svg_points(cp_svg *s, const cp_svg_panel *p, const double *x, const double *y, int n, const char *color,
                   const char *name) {
    fprintf(s->f, "<g class=\"points\" data-points=\"");
    put_escaped(s->f, name);
    fprintf(s->f, "\" fill=\"%s\">\n", color);
    int64_t every = n > SERIES_MAX_POINTS ? (n + SERIES_MAX_POINTS - 1) / SERIES_MAX_POINTS : 1;
    for (int64_t i = 0; i < n; i += every) {
        double px = cp_svg_px(p, x[i]), py = cp_svg_py(p, y[i]);
        if (isfinite(px) && isfinite(py)) fprintf(s->f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\"/>\n", px, py);
    }
    fprintf(s->f, "</g>\n");
}

void cp_svg_band(cp_svg *s, const cp_svg_panel *p, const double *x, const double *lower, const double *upper, int n,
                 const char *color, const char *name) {
    begin_series(s, name);
    for (int i = 0; i < n; i++) fprintf(s->f, "%s%.1f %.1f ", i ? "L" : "M", cp_svg_px(p, x[i]), cp_svg_py(p, upper[i]));
    for (int i = n - 1; i >= 0; i--) fprintf(s->f, "L%.1f %.1f ", cp_svg_px(p, x[i]), cp_svg_py(p, lower[i]));
    fprintf(s->f, "Z\" fill=\"%s\" stroke=\"none\"/>\n", color);
}

void cp_svg_legend(cp_svg *s, double x, double y, const char *color, const char *name) {
    fprintf(s->f, "<rect class=\"legend\" x=\"%.1f\" y=\"%.1f\" width=\"12\" height=\"12\" fill=\"%s\"/>\n", x, y - 10,
            color);
    cp_svg_text(s, x + 17, y, "start", 11, "#000", "%s", name);
}

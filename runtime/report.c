/* report.c: `cpgen report OUT_DIR`: the run's metrics.jsonl, one JSON object per step, drawn as report.svg in four
 * panels; the validation loss, where steps have one ("val_loss"), beside the training loss with a legend. A value
 * logged as null (a skipped step's loss) leaves a gap in its line rather than a false point.
 *
 * The file may come from a run that crashed (its last line cut short) or from anyone's hands, so every line is
 * judged on its own: a line that is not a step's metrics is skipped, a value that no run logs (not finite, or past
 * VALUE_MAX) leaves a gap, and what was skipped is said in one note beside the steps drawn. Steps must be whole
 * numbers a run can reach (the trainer counts them in an int): a step near the limits of a double left the x axis
 * no width, and its ticks never advanced. The file is read a line at a time and at most MAX_STEPS steps are kept. */
#include "report.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "json.h"
#include "spec.h"
#include "svg.h"
#include "util.h"

enum { M_LOSS, M_NORM, M_TPS, M_MEM, M_MEM_PLANNED, M_VAL_LOSS, M_COUNT };
static const char *const keys[M_COUNT] = {"loss", "norm", "tokens_per_s", "mem_measured", "mem_planned", "val_loss"};
static bool in_gib(int m) { return m == M_MEM || m == M_MEM_PLANNED; }

#define MAX_LINE (64 * 1024) /* a step's line is a few hundred bytes */
#define MAX_STEPS (1 << 22)  /* 4M steps: 192 MiB of values; the picture is bounded apart from this (gen/svg.c) */
#define VALUE_MAX 1e15       /* larger than any loss, norm, tokens/s or byte count a run logs */

/* The steps of metrics.jsonl: step[i] and v[m][i] (memory in GiB, NaN where not logged), and what was skipped. */
typedef struct {
    int n, cap;
    double *step, *v[M_COUNT];
    int bad_lines, bad_values, first_bad_line, first_bad_value_line;
    char first_bad[160], first_bad_value[96];
    bool last_cut, more; /* the last line was cut short and did not parse; more than MAX_STEPS steps */
} metrics;

static void metrics_free(metrics *mt) {
    free(mt->step);
    for (int m = 0; m < M_COUNT; m++) free(mt->v[m]);
}

static void bad_line(metrics *mt, int line, const char *why) {
    if (!mt->bad_lines++) {
        mt->first_bad_line = line;
        snprintf(mt->first_bad, sizeof mt->first_bad, "%.150s", why);
    }
}

/* One line's object into the arrays, or a note of why it is not a step. */
static void take_line(metrics *mt, const char *l, size_t n, int line) {
    cp_json o;
    char why[256];
    if (cp_json_parse(l, n, &o, why, sizeof why)) {
        bad_line(mt, line, why);
        return;
    }
    const cp_json *st = o.type == CP_JSON_OBJECT ? cp_json_get(&o, "step") : NULL;
    if (!st || st->type != CP_JSON_NUMBER) {
        bad_line(mt, line, "not a step's metrics (an object with \"step\")");
    } else if (!(st->number >= 0 && st->number <= INT_MAX && st->number == floor(st->number))) {
        snprintf(why, sizeof why, "\"step\": %.6g is not a step a run counts (a whole number from 0 to %d)",
                 st->number, INT_MAX);
        bad_line(mt, line, why);
    } else if (mt->n == MAX_STEPS) {
        mt->more = true;
    } else {
        if (mt->n == mt->cap) {
            mt->cap = mt->cap ? 2 * mt->cap : 64;
            mt->step = cp_xrealloc(mt->step, sizeof(double) * (size_t)mt->cap);
            for (int m = 0; m < M_COUNT; m++) mt->v[m] = cp_xrealloc(mt->v[m], sizeof(double) * (size_t)mt->cap);
        }
        mt->step[mt->n] = st->number;
        for (int m = 0; m < M_COUNT; m++) {
            const cp_json *v = cp_json_get(&o, keys[m]);
            double x = v && v->type == CP_JSON_NUMBER ? v->number : NAN;
            if (!isnan(x) && !(fabs(x) <= VALUE_MAX)) { /* 1e999 parses as infinity */
                if (!mt->bad_values++) {
                    mt->first_bad_value_line = line;
                    snprintf(mt->first_bad_value, sizeof mt->first_bad_value, "%s = %.6g", keys[m], x);
                }
                x = NAN;
            }
            mt->v[m][mt->n] = x / (in_gib(m) ? 1024.0 * 1024 * 1024 : 1);
        }
        mt->n++;
    }
    cp_json_free(&o);
}

static int read_metrics(const char *path, const char *out_dir, metrics *mt, char *err, int errlen) {
    /* a regular file under the bound of its kind (never a device or a FIFO), then read line by line */
    char why[256];
    int fd = cp_open_file(path, CP_FILE_METRICS, NULL, why, sizeof why);
    FILE *f = fd >= 0 ? fdopen(fd, "r") : NULL;
    if (!f) {
        if (fd >= 0) snprintf(why, sizeof why, "%s", strerror(errno)), close(fd);
        return cp_errf(err, errlen, "cannot read %s (%s): is %s the out_dir of a run (train.out_dir)?", path, why,
                       out_dir);
    }
    char *buf = cp_xmalloc(MAX_LINE + 1);
    int line = 0;
    bool long_line = false; /* inside a line longer than MAX_LINE, whose rest is skipped */
    while (!mt->more && fgets(buf, MAX_LINE + 1, f)) {
        size_t n = strlen(buf);
        bool whole = n > 0 && buf[n - 1] == '\n';
        if (long_line) {
            long_line = !whole;
            continue;
        }
        line++;
        if (!whole && n == MAX_LINE) { /* over MAX_LINE: no step's metrics, whatever follows */
            long_line = true;
            bad_line(mt, line, "longer than 64 KiB");
            continue;
        }
        if (!whole && !feof(f)) { /* fgets stopped at a newline that strlen does not see */
            bad_line(mt, line, "holds a zero byte");
            continue;
        }
        if (whole) buf[--n] = 0;
        if (n && buf[n - 1] == '\r') buf[--n] = 0;
        if (!n) continue;
        int before = mt->bad_lines;
        take_line(mt, buf, n, line);
        /* the last line without its newline: what a run that stopped while writing leaves */
        if (!whole && mt->bad_lines > before) mt->last_cut = true;
    }
    bool read_error = ferror(f);
    fclose(f);
    free(buf);
    if (read_error) return cp_errf(err, errlen, "reading %s failed", path);
    if (mt->n == 0) {
        if (mt->bad_lines)
            return cp_errf(err, errlen, "%s:%d: %s; the file holds no step's metrics", path, mt->first_bad_line,
                           mt->first_bad);
        return cp_errf(err, errlen, "%s holds no steps", path);
    }
    return 0;
}

/* What read_metrics skipped, as one note (empty when nothing was). */
static void skipped_note(const metrics *mt, const char *path, char *note, int len) {
    cp_str s = {0};
    if (mt->bad_lines) {
        if (mt->bad_lines == 1 && mt->last_cut)
            cp_str_printf(&s, "%s:%d: the last line is cut short, as a run that stopped while writing it leaves; "
                          "skipped", path, mt->first_bad_line);
        else
            cp_str_printf(&s, "%s: skipped %d line%s that %s not a step's metrics (line %d: %s)%s", path,
                          mt->bad_lines, mt->bad_lines == 1 ? "" : "s", mt->bad_lines == 1 ? "is" : "are",
                          mt->first_bad_line, mt->first_bad, mt->last_cut ? "; the last line is cut short" : "");
    }
    if (mt->bad_values)
        cp_str_printf(&s, "%s%s: %d value%s out of range left as gaps (line %d: %s; at most %g)", s.len ? "; " : "",
                      path, mt->bad_values, mt->bad_values == 1 ? "" : "s", mt->first_bad_value_line,
                      mt->first_bad_value, VALUE_MAX);
    if (mt->more) cp_str_printf(&s, "%s%s: more than %d steps: drew the first %d", s.len ? "; " : "", path, MAX_STEPS,
                                MAX_STEPS);
    snprintf(note, (size_t)len, "%s", s.data ? s.data : "");
    cp_str_free(&s);
}

static int draw_report(const metrics *mt, const char *out_dir, const char *svg_path, char *err, int errlen) {
    static const struct {
        const char *id, *title, *ylabel;
        int first, count;
    } panels[] = {{"loss", "loss", "loss", M_LOSS, 1},
                  {"norm", "gradient norm (before clipping)", "norm", M_NORM, 1},
                  {"tokens", "throughput", "tokens/s", M_TPS, 1},
                  {"memory", "GPU memory: measured and planned", "GiB", M_MEM, 2}};
    static const char *colors[] = {"#4e79a7", "#e15759"};
    int n = mt->n;
    char title[CP_PATH_MAX + 64];
    snprintf(title, sizeof title, "cpgen run %s: %d steps", out_dir, n);
    /* a resumed run's file may go back in steps: the axis spans them all */
    double first = INFINITY, last = -INFINITY;
    for (int i = 0; i < n; i++) first = fmin(first, mt->step[i]), last = fmax(last, mt->step[i]);
    cp_svg svg;
    if (cp_svg_begin(&svg, svg_path, 1200, 820, title, err, errlen)) return -1;
    cp_svg_text(&svg, 20, 28, "start", 16, "#000", "%s", title);
    /* the validation loss, logged after some steps only: its points alone, joined by a line and each marked */
    double *vx = cp_xmalloc(sizeof(double) * (size_t)n), *vy = cp_xmalloc(sizeof(double) * (size_t)n);
    int nv = 0;
    for (int i = 0; i < n; i++)
        if (!isnan(mt->v[M_VAL_LOSS][i])) vx[nv] = mt->step[i], vy[nv++] = mt->v[M_VAL_LOSS][i];
    for (int k = 0; k < 4; k++) {
        cp_svg_panel p = {.x = 90 + (k % 2) * 560, .y = 80 + (k / 2) * 380, .w = 460, .h = 290};
        p.x0 = first, p.x1 = last > first ? last : first + 1;
        double lo = INFINITY, hi = -INFINITY;
        for (int m = panels[k].first; m < panels[k].first + panels[k].count; m++)
            for (int i = 0; i < n; i++)
                if (!isnan(mt->v[m][i])) lo = fmin(lo, mt->v[m][i]), hi = fmax(hi, mt->v[m][i]);
        if (panels[k].first == M_LOSS)
            for (int i = 0; i < nv; i++) lo = fmin(lo, vy[i]), hi = fmax(hi, vy[i]);
        if (!(lo <= hi)) lo = 0, hi = 1;
        /* the loss's axis starts near its lowest value; the others' at 0 */
        p.y0 = panels[k].first == M_LOSS ? lo - 0.05 * (hi - lo) : fmin(0, lo), p.y1 = hi + 0.08 * (hi - p.y0) + 1e-9;
        bool val = panels[k].first == M_LOSS && nv > 0;
        cp_svg_panel_begin(&svg, &p, panels[k].id, val ? "loss: training and validation" : panels[k].title, "step",
                           panels[k].ylabel);
        for (int j = 0; j < panels[k].count; j++) {
            int m = panels[k].first + j;
            cp_svg_series(&svg, &p, mt->step, mt->v[m], n, colors[j], keys[m]);
            if (panels[k].count > 1) cp_svg_legend(&svg, p.x + 10 + 150 * j, p.y + 20, colors[j], keys[m]);
        }
        if (val) {
            cp_svg_series(&svg, &p, vx, vy, nv, colors[1], keys[M_VAL_LOSS]);
            cp_svg_points(&svg, &p, vx, vy, nv, colors[1], keys[M_VAL_LOSS]);
            cp_svg_legend(&svg, p.x + 10, p.y + 20, colors[0], "loss (training)");
            cp_svg_legend(&svg, p.x + 160, p.y + 20, colors[1], "val_loss (data.val)");
        }
        cp_svg_panel_end(&svg);
    }
    free(vx);
    free(vy);
    return cp_svg_end(&svg, err, errlen);
}

int cp_report_write(const char *out_dir, char *err, int errlen) {
    char path[CP_PATH_MAX + 32], svg_path[CP_PATH_MAX + 32];
    if (!*out_dir) /* "" would read /metrics.jsonl */
        return cp_errf(err, errlen, "the out_dir is empty: give the folder of a run, cpgen report runs/NAME");
    if (strlen(out_dir) >= CP_PATH_MAX) /* a cut path would name another file */
        return cp_errf(err, errlen, "%.80s...: the folder's path is longer than %d bytes", out_dir, CP_PATH_MAX - 1);
    snprintf(path, sizeof path, "%s/metrics.jsonl", out_dir);
    snprintf(svg_path, sizeof svg_path, "%s/report.svg", out_dir);
    metrics mt = {0};
    int rc = read_metrics(path, out_dir, &mt, err, errlen);
    if (!rc) rc = draw_report(&mt, out_dir, svg_path, err, errlen);
    if (!rc) skipped_note(&mt, path, err, errlen);
    metrics_free(&mt);
    return rc ? -1 : mt.n;
}

/* report.c: `cpgen report OUT_DIR`: the run's metrics.jsonl, one JSON object per step, drawn as report.svg in four
 * panels. A value logged as null (a skipped step's loss) leaves a gap in its line rather than a false point. */
#include "report.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"
#include "spec.h"
#include "svg.h"
#include "util.h"

enum { M_LOSS, M_NORM, M_TPS, M_MEM, M_MEM_PLANNED, M_COUNT };
static const char *const keys[M_COUNT] = {"loss", "norm", "tokens_per_s", "mem_measured", "mem_planned"};

static double field(const cp_json *o, const char *key) {
    const cp_json *v = cp_json_get(o, key);
    return v && v->type == CP_JSON_NUMBER ? v->number : NAN;
}

/* The steps of metrics.jsonl: step[i] and v[m][i] (memory in GiB, NaN where not logged). */
typedef struct {
    int n, cap;
    double *step, *v[M_COUNT];
} metrics;

static void metrics_free(metrics *mt) {
    free(mt->step);
    for (int m = 0; m < M_COUNT; m++) free(mt->v[m]);
}

static int read_metrics(const char *path, const char *out_dir, metrics *mt, char *err, int errlen) {
    size_t len;
    char why[256];
    char *text = cp_read_file_as(path, CP_FILE_METRICS, &len, why, sizeof why);
    if (!text)
        return cp_errf(err, errlen, "cannot read %s (%s): is %s the out_dir of a run (train.out_dir)?", path, why,
                       out_dir);
    int line = 0, rc = 0;
    char *p = text, *l;
    size_t n;
    while (!rc && cp_next_line(&p, text + len, &l, &n)) {
        line++;
        if (!n) continue;
        cp_json o;
        char why[256];
        if (cp_json_parse(l, n, &o, why, sizeof why)) {
            rc = cp_errf(err, errlen, "%s:%d: %s", path, line, why);
            break;
        }
        double s = field(&o, "step");
        if (o.type != CP_JSON_OBJECT || isnan(s)) {
            cp_json_free(&o);
            rc = cp_errf(err, errlen, "%s:%d: not a step's metrics (an object with \"step\")", path, line);
            break;
        }
        if (mt->n == mt->cap) {
            mt->cap = mt->cap ? 2 * mt->cap : 64;
            mt->step = cp_xrealloc(mt->step, sizeof(double) * (size_t)mt->cap);
            for (int m = 0; m < M_COUNT; m++) mt->v[m] = cp_xrealloc(mt->v[m], sizeof(double) * (size_t)mt->cap);
        }
        mt->step[mt->n] = s;
        for (int m = 0; m < M_COUNT; m++)
            mt->v[m][mt->n] = field(&o, keys[m]) / (m >= M_MEM ? 1024.0 * 1024 * 1024 : 1);
        mt->n++;
        cp_json_free(&o);
    }
    free(text);
    if (!rc && mt->n == 0) rc = cp_errf(err, errlen, "%s holds no steps", path);
    return rc;
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
    cp_svg svg;
    if (cp_svg_begin(&svg, svg_path, 1200, 820, title, err, errlen)) return -1;
    cp_svg_text(&svg, 20, 28, "start", 16, "#000", "%s", title);
    for (int k = 0; k < 4; k++) {
        cp_svg_panel p = {.x = 90 + (k % 2) * 560, .y = 80 + (k / 2) * 380, .w = 460, .h = 290};
        p.x0 = mt->step[0], p.x1 = mt->step[n - 1] > mt->step[0] ? mt->step[n - 1] : mt->step[0] + 1;
        double lo = INFINITY, hi = -INFINITY;
        for (int m = panels[k].first; m < panels[k].first + panels[k].count; m++)
            for (int i = 0; i < n; i++)
                if (!isnan(mt->v[m][i])) lo = fmin(lo, mt->v[m][i]), hi = fmax(hi, mt->v[m][i]);
        if (!(lo <= hi)) lo = 0, hi = 1;
        /* the loss's axis starts near its lowest value; the others' at 0 */
        p.y0 = panels[k].first == M_LOSS ? lo - 0.05 * (hi - lo) : 0, p.y1 = hi + 0.08 * (hi - p.y0) + 1e-9;
        cp_svg_panel_begin(&svg, &p, panels[k].id, panels[k].title, "step", panels[k].ylabel);
        for (int j = 0; j < panels[k].count; j++) {
            int m = panels[k].first + j;
            cp_svg_series(&svg, &p, mt->step, mt->v[m], n, colors[j], keys[m]);
            if (panels[k].count > 1) cp_svg_legend(&svg, p.x + 10 + 150 * j, p.y + 20, colors[j], keys[m]);
        }
        cp_svg_panel_end(&svg);
    }
    return cp_svg_end(&svg, err, errlen);
}

int cp_report_write(const char *out_dir, char *err, int errlen) {
    char path[CP_PATH_MAX + 32], svg_path[CP_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/metrics.jsonl", out_dir);
    snprintf(svg_path, sizeof svg_path, "%s/report.svg", out_dir);
    metrics mt = {0};
    int rc = read_metrics(path, out_dir, &mt, err, errlen);
    if (!rc) rc = draw_report(&mt, out_dir, svg_path, err, errlen);
    metrics_free(&mt);
    return rc ? -1 : mt.n;
}

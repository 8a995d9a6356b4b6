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

int cp_report_write(const char *out_dir, char *err, int errlen) {
    char path[CP_PATH_MAX + 32], svg_path[CP_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/metrics.jsonl", out_dir);
    snprintf(svg_path, sizeof svg_path, "%s/report.svg", out_dir);
    size_t len;
    char *text = cp_read_file(path, &len);
    if (!text) return cp_errf(err, errlen, "cannot read %s: is %s the out_dir of a run (train.out_dir)?", path, out_dir);
    int n = 0, cap = 64, line = 0, rc = 0;
    double *step = cp_xmalloc(sizeof(double) * (size_t)cap), *v[M_COUNT];
    for (int m = 0; m < M_COUNT; m++) v[m] = cp_xmalloc(sizeof(double) * (size_t)cap);
    for (char *p = text, *nl; p < text + len && !rc; p = nl + 1) {
        nl = memchr(p, '\n', (size_t)(text + len - p));
        if (!nl) nl = text + len;
        line++;
        if (nl == p) continue;
        cp_json o;
        char why[256];
        if (cp_json_parse(p, (size_t)(nl - p), &o, why, sizeof why)) {
            rc = cp_errf(err, errlen, "%s:%d: %s", path, line, why);
            break;
        }
        double s = field(&o, "step");
        if (o.type != CP_JSON_OBJECT || isnan(s)) {
            cp_json_free(&o);
            rc = cp_errf(err, errlen, "%s:%d: not a step's metrics (an object with \"step\")", path, line);
            break;
        }
        if (n == cap) {
            cap *= 2;
            step = cp_xrealloc(step, sizeof(double) * (size_t)cap);
            for (int m = 0; m < M_COUNT; m++) v[m] = cp_xrealloc(v[m], sizeof(double) * (size_t)cap);
        }
        step[n] = s;
        for (int m = 0; m < M_COUNT; m++) v[m][n] = field(&o, keys[m]) / (m >= M_MEM ? 1024.0 * 1024 * 1024 : 1);
        n++;
        cp_json_free(&o);
    }
    free(text);
    if (!rc && n == 0) rc = cp_errf(err, errlen, "%s holds no steps", path);
    cp_svg svg;
    if (!rc) {
        char title[CP_PATH_MAX + 64];
        snprintf(title, sizeof title, "cpgen run %s: %d steps", out_dir, n);
        rc = cp_svg_begin(&svg, svg_path, 1200, 820, title, err, errlen);
        if (!rc) {
            cp_svg_text(&svg, 20, 28, "start", 16, "#000", "%s", title);
            const struct {
                const char *id, *title, *ylabel;
                int first, count;
            } panels[] = {{"loss", "loss", "loss", M_LOSS, 1},
                          {"norm", "gradient norm (before clipping)", "norm", M_NORM, 1},
                          {"tokens", "throughput", "tokens/s", M_TPS, 1},
                          {"memory", "GPU memory: measured and planned", "GiB", M_MEM, 2}};
            static const char *colors[] = {"#4e79a7", "#e15759"};
            for (int k = 0; k < 4; k++) {
                cp_svg_panel p = {.x = 90 + (k % 2) * 560, .y = 80 + (k / 2) * 380, .w = 460, .h = 290};
                p.x0 = step[0], p.x1 = step[n - 1] > step[0] ? step[n - 1] : step[0] + 1;
                double lo = INFINITY, hi = -INFINITY;
                for (int m = panels[k].first; m < panels[k].first + panels[k].count; m++)
                    for (int i = 0; i < n; i++)
                        if (!isnan(v[m][i])) lo = fmin(lo, v[m][i]), hi = fmax(hi, v[m][i]);
                if (!(lo <= hi)) lo = 0, hi = 1;
                p.y0 = k == M_LOSS ? lo - 0.05 * (hi - lo) : 0, p.y1 = hi + 0.08 * (hi - p.y0) + 1e-9;
                cp_svg_panel_begin(&svg, &p, panels[k].id, panels[k].title, "step", panels[k].ylabel);
                for (int j = 0; j < panels[k].count; j++) {
                    int m = panels[k].first + j;
                    cp_svg_series(&svg, &p, step, v[m], n, colors[j], keys[m]);
                    if (panels[k].count > 1) cp_svg_legend(&svg, p.x + 10 + 150 * j, p.y + 20, colors[j], keys[m]);
                }
                cp_svg_panel_end(&svg);
            }
            rc = cp_svg_end(&svg, err, errlen);
        }
    }
    free(step);
    for (int m = 0; m < M_COUNT; m++) free(v[m]);
    return rc ? -1 : n;
}

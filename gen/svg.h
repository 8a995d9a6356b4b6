/* svg.h: a small SVG writer for cpgen's pictures (the plan's memory, a run's report): panels with axes and ticks,
 * lines, stacked areas and text, written by cpgen itself so that no plotting library is needed. */
#ifndef CP_SVG_H
#define CP_SVG_H

#include <stdbool.h>
#include <stdio.h>

typedef struct {
    FILE *f;
    char path[1024];
    char tmp[1100]; /* written here, renamed to path by cp_svg_end: a failed write leaves path as it was */
} cp_svg;

/* A plot area on the page (pixels) and the data ranges it shows. */
typedef struct {
    double x, y, w, h;
    double x0, x1, y0, y1;
} cp_svg_panel;

/* Whether a file starting with these n bytes is a picture cpgen's SVG writer made (cp_svg_begin's header). */
bool cp_svg_is_ours(const char *head, size_t n, const void *ctx);
/* Starts a picture for path and writes the header; -1 with a message in err. A file already at path is replaced only
 * if it is a picture cpgen made (cp_svg_is_ours): anything else is refused. */
int cp_svg_begin(cp_svg *s, const char *path, int width, int height, const char *title, char *err, int errlen);
/* Finishes the document and puts it at path; -1 with a message when a write failed (path is then left as it was). */
int cp_svg_end(cp_svg *s, char *err, int errlen);

double cp_svg_px(const cp_svg_panel *p, double x);
double cp_svg_py(const cp_svg_panel *p, double y);

/* Text, escaped for XML; anchor "start", "middle" or "end". */
void cp_svg_text(cp_svg *s, double x, double y, const char *anchor, int size, const char *fill, const char *fmt, ...)
    __attribute__((format(printf, 7, 8)));
/* A line in data coordinates of p; dash "" for solid. id may be NULL. */
void cp_svg_hline(cp_svg *s, const cp_svg_panel *p, double y, const char *color, const char *dash, const char *id);
/* A frame, nice ticks and labels on both axes, and the title above; group id "<id>". Closes nothing: the series
 * drawn after it go into the same group until cp_svg_panel_end. */
void cp_svg_panel_begin(cp_svg *s, const cp_svg_panel *p, const char *id, const char *title, const char *xlabel,
                        const char *ylabel);
void cp_svg_panel_end(cp_svg *s);
/* A polyline series (x[i], y[i]) named name (class "series", data-name); points with y NaN are skipped. */
void cp_svg_series(cp_svg *s, const cp_svg_panel *p, const double *x, const double *y, int n, const char *color,
                   const char *name);
/* A mark at each point (x[i], y[i]) with y not NaN (group class "points", data-points name), for a series whose
 * points are few and far apart (a validation loss logged every k steps), so that even a single one shows; more than
 * the picture can hold are thinned to evenly spaced ones. */
void cp_svg_points(cp_svg *s, const cp_svg_panel *p, const double *x, const double *y, int n, const char *color,
                   const char *name);
/* The band between lower[i] and upper[i] as one closed area (class "series", data-name). */
void cp_svg_band(cp_svg *s, const cp_svg_panel *p, const double *x, const double *lower, const double *upper, int n,
                 const char *color, const char *name);
/* A legend entry (a swatch and its name) at a pixel position. */
void cp_svg_legend(cp_svg *s, double x, double y, const char *color, const char *name);

/* A step for ticks: 1, 2 or 5 times a power of ten, giving about n ticks over span. */
double cp_svg_nice_step(double span, int n);

#endif

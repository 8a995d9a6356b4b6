/* plan_svg.c: `cpgen plan SPEC --svg FILE`: the plan's memory over the steps of one training step, GPU memory
 * stacked by what it holds with the peak and the GPU's capacity marked, and the host's pinned memory below. The
 * live bytes per step are counted as the packing counts them (each lifetime rounded to the arena's alignment), so
 * the picture's peak is the plan's "live at peak". */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "plan.h"
#include "svg.h"
#include "util.h"

#define GIB_F (1024.0 * 1024 * 1024)
#define MAX_COLUMNS 1500 /* steps drawn; more are binned, each bin drawn as its fullest step, so peaks stay */

/* The picture's categories, bottom to top; each plan category belongs to one. */
enum { G_PARAMS, G_GRADS, G_OPTIM, G_CKPT, G_ACT, G_ATTN, G_KEPT, G_TILES, G_WORK, G_COUNT };
static const char *const group_names[G_COUNT] = {
    "parameters (shard + gathered layers)", "gradients (shard + layer in backward)", "optimizer state (master, AdamW)",
    "checkpoints", "activations", "attention working set (+ all-to-all, ring)", "kept outputs (attention out, LSE)",
    "tiles (MLP, loss)", "workspace"};
static const char *const group_colors[G_COUNT] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
                                                  "#edc948", "#b07aa1", "#ff9da7", "#9c755f"};
#define RESERVE_COLOR "#bab0ac"

static int group_of(cp_cat c) {
    switch (c) {
    case CP_CAT_PARAMS: case CP_CAT_GATHERED: return G_PARAMS;
    case CP_CAT_GRADS: case CP_CAT_UNIT_GRADS: return G_GRADS;
    case CP_CAT_MASTER: case CP_CAT_OPTIM: return G_OPTIM;
    case CP_CAT_CKPT: return G_CKPT;
    case CP_CAT_ACT: return G_ACT;
    case CP_CAT_ATTN: case CP_CAT_COMM: case CP_CAT_RING: return G_ATTN;
    case CP_CAT_ATTN_KEPT: return G_KEPT;
    case CP_CAT_MLP: case CP_CAT_LOSS: return G_TILES;
    default: return G_WORK;
    }
}

int64_t *cp_plan_live_by_cat(const cp_plan *P, cp_space space) {
    int n = P->nsteps;
    int64_t *live = cp_xcalloc((size_t)(n + 1) * CP_CAT_COUNT, sizeof *live);
    for (int i = 0; i < P->nbufs; i++) {
        const cp_buffer *b = &P->bufs[i];
        if (b->space != space) continue;
        int64_t size = (b->bytes + CP_ARENA_ALIGN - 1) / CP_ARENA_ALIGN * CP_ARENA_ALIGN;
        for (int k = 0; k < b->nlive; k++) {
            live[(size_t)b->live[k].start * CP_CAT_COUNT + b->cat] += size;
            live[(size_t)(b->live[k].end + 1) * CP_CAT_COUNT + b->cat] -= size;
        }
    }
    for (int s = 1; s < n; s++)
        for (int c = 0; c < CP_CAT_COUNT; c++) live[(size_t)s * CP_CAT_COUNT + c] += live[(size_t)(s - 1) * CP_CAT_COUNT + c];
    return live;
}

/* One memory panel: stacked groups over a base band (bytes outside the arena), capacity and planned peak lines. */
typedef struct {
    const char *id, *title, *base_name, *cap_name, *planned_name;
    int64_t base, capacity, planned;
} panel_info;

static void draw_panel(cp_svg *svg, const cp_plan *P, const int64_t *live, const cp_svg_panel *frame,
                       const panel_info *in, bool mark_peak) {
    int n = P->nsteps, cols = CP_MIN(n, MAX_COLUMNS);
    double *x = cp_xmalloc(sizeof(double) * (size_t)cols), *lo = cp_xmalloc(sizeof(double) * (size_t)cols),
           *hi = cp_xmalloc(sizeof(double) * (size_t)cols);
    int *pick = cp_xmalloc(sizeof(int) * (size_t)cols);
    int64_t top = 0;
    int top_step = 0;
    for (int k = 0; k < cols; k++) {
        int a = (int)((int64_t)k * n / cols), b = (int)((int64_t)(k + 1) * n / cols);
        pick[k] = a;
        int64_t best = -1;
        for (int s = a; s < b; s++) {
            int64_t t = 0;
            for (int c = 0; c < CP_CAT_COUNT; c++) t += live[(size_t)s * CP_CAT_COUNT + c];
            if (t > best) best = t, pick[k] = s;
            if (t > top) top = t, top_step = s;
        }
        x[k] = pick[k];
    }
    cp_svg_panel p = *frame;
    p.x0 = 0, p.x1 = n > 1 ? n - 1 : 1, p.y0 = 0;
    p.y1 = fmax((double)(in->base + top), (double)CP_MAX(in->capacity, in->planned)) * 1.08 / GIB_F;
    cp_svg_panel_begin(svg, &p, in->id, in->title, "plan step (one micro-batch, then the optimizer)", "GiB");
    /* where the forward, the backward (recompute and backward alternate per layer) and the optimizer begin */
    bool seen[CP_PHASE_COUNT] = {false};
    for (int s = 0; s < n; s++) {
        cp_phase ph = P->steps[s].phase;
        if (seen[ph] || (ph == CP_PHASE_BWD && seen[CP_PHASE_RECOMPUTE]) || (ph == CP_PHASE_RECOMPUTE && seen[CP_PHASE_BWD]))
            continue;
        seen[ph] = true;
        double px = cp_svg_px(&p, s);
        fprintf(svg->f, "<line class=\"phase\" x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#999\"/>\n", px,
                px, p.y, p.y + p.h);
        bool right = px > p.x + 0.85 * p.w; /* the optimizer's few steps sit at the right edge */
        cp_svg_text(svg, right ? px - 3 : px + 3, p.y + 12, right ? "end" : "start", 10, "#555", "%s",
                    ph == CP_PHASE_FWD ? "forward" : ph == CP_PHASE_OPTIM ? "optimizer" : "backward (recompute, backward)");
    }
    for (int k = 0; k < cols; k++) lo[k] = 0, hi[k] = in->base / GIB_F;
    if (in->base > 0) cp_svg_band(svg, &p, x, lo, hi, cols, RESERVE_COLOR, in->base_name);
    for (int g = 0; g < G_COUNT; g++) {
        bool any = false;
        for (int k = 0; k < cols; k++) {
            lo[k] = hi[k];
            int64_t v = 0;
            for (int c = 0; c < CP_CAT_COUNT; c++)
                if (group_of((cp_cat)c) == g) v += live[(size_t)pick[k] * CP_CAT_COUNT + c];
            hi[k] = lo[k] + v / GIB_F;
            any |= v > 0;
        }
        if (any) cp_svg_band(svg, &p, x, lo, hi, cols, group_colors[g], group_names[g]);
    }
    char a[32];
    cp_svg_hline(svg, &p, in->capacity / GIB_F, "#c00", "6 4", "capacity");
    cp_svg_text(svg, p.x + p.w - 4, cp_svg_py(&p, in->capacity / GIB_F) - 4, "end", 11, "#c00", "%s %s",
                in->cap_name, cp_fmt_bytes(in->capacity, a, sizeof a));
    cp_svg_hline(svg, &p, in->planned / GIB_F, "#333", "2 3", "planned-peak");
    cp_svg_text(svg, p.x + 4, cp_svg_py(&p, in->planned / GIB_F) - 4, "start", 11, "#333", "%s %s", in->planned_name,
                cp_fmt_bytes(in->planned, a, sizeof a));
    if (mark_peak) {
        double px = cp_svg_px(&p, top_step), py = cp_svg_py(&p, (in->base + top) / GIB_F);
        const cp_step *st = &P->steps[top_step];
        fprintf(svg->f, "<circle id=\"peak-marker\" cx=\"%.1f\" cy=\"%.1f\" r=\"5\" fill=\"none\" stroke=\"#000\" "
                        "stroke-width=\"2\" data-step=\"%d\" data-bytes=\"%lld\"/>\n",
                px, py, top_step, (long long)(in->base + top));
        char layer[32] = "";
        if (st->layer >= 0) snprintf(layer, sizeof layer, " of layer %d", st->layer);
        cp_svg_text(svg, px < p.x + p.w / 2 ? px + 8 : px - 8, py - 8, px < p.x + p.w / 2 ? "start" : "end", 11,
                    "#000", "peak %s live: step %d, %s %s%s", cp_fmt_bytes(in->base + top, a, sizeof a), top_step,
                    cp_phase_name(st->phase), st->what, layer);
    }
    cp_svg_panel_end(svg);
    free(x), free(lo), free(hi), free(pick);
}

int cp_plan_svg(const cp_plan *P, const char *path, char *err, int errlen) {
    if (P->nsteps < 1) return cp_errf(err, errlen, "the plan has no steps to draw");
    cp_svg svg;
    char title[CP_PATH_MAX + 128], a[32], b[32], c[32];
    snprintf(title, sizeof title, "cpgen plan %s: %d GPU%s, seq %s", P->spec.path, P->C, P->C > 1 ? "s" : "",
             cp_fmt_length(P->S, a, sizeof a));
    if (cp_svg_begin(&svg, path, 1280, 900, title, err, errlen)) return -1;
    cp_svg_text(&svg, 20, 28, "start", 16, "#000", "%s", title);
    cp_svg_text(&svg, 20, 46, "start", 12, "#444",
                "memory over the steps of one training step, per GPU; GPU arena %s (live at peak %s, the rest is "
                "packing), host arena %s per process",
                cp_fmt_bytes(P->gpu_arena, a, sizeof a), cp_fmt_bytes(P->gpu_live_peak, b, sizeof b),
                cp_fmt_bytes(P->host_arena, c, sizeof c));
    int64_t *gpu = cp_plan_live_by_cat(P, CP_SPACE_GPU), *host = cp_plan_live_by_cat(P, CP_SPACE_HOST);
    cp_svg_panel gp = {.x = 80, .y = 90, .w = 880, .h = 460}, hp = {.x = 80, .y = 650, .w = 880, .h = 180};
    panel_info gi = {.id = "gpu",
                     .title = "GPU memory",
                     .base_name = "reserve (CUDA context, libraries, NCCL)",
                     .cap_name = "GPU memory (machine.gpu_mem)",
                     .planned_name = "planned peak (arena + reserve)",
                     .base = cp_plan_reserve(P),
                     .capacity = P->spec.machine.gpu_mem,
                     .planned = P->gpu_peak};
    int ranks = cp_plan_node_ranks(P);
    panel_info hi = {.id = "host",
                     .title = "host memory per process (pinned arena)",
                     .base_name = "resident beside the arena (machine.host_runtime)",
                     .cap_name = "host memory per process (machine.host_mem / ranks of the node)",
                     .planned_name = "peak while the weights load",
                     .base = P->spec.machine.host_runtime,
                     .capacity = P->spec.machine.host_mem / (ranks > 0 ? ranks : 1),
                     .planned = P->host_peak};
    draw_panel(&svg, P, gpu, &gp, &gi, true);
    draw_panel(&svg, P, host, &hp, &hi, false);
    fprintf(svg.f, "<g id=\"legend\">\n");
    double ly = 110;
    cp_svg_legend(&svg, 980, ly, RESERVE_COLOR, "reserve outside the arena");
    for (int g = 0; g < G_COUNT; g++) cp_svg_legend(&svg, 980, ly += 20, group_colors[g], group_names[g]);
    fprintf(svg.f, "</g>\n");
    free(gpu);
    free(host);
    return cp_svg_end(&svg, err, errlen);
}

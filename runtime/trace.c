/* trace.c: the step trace's file (trace.h). Chrome's trace-event format: "X" slices with a start and a duration in
 * microseconds, "s"/"f" flow pairs for the waits between streams, "C" counter samples for memory, "M" records that
 * name processes and threads. One event per line, so the file diffs and greps well. Times of a rank start at its
 * own step start (ranks are not on one clock). The measurements come from the recorder (trace_rec.c). */
#include "trace.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "json.h"
#include "util.h"

static const char *const stream_names[CP_STREAM_COUNT] = {"compute", "communication", "copy (host transfers)"};
#define MEMORY_COUNTER "GPU memory in use (plan)"

int cp_trace_instances(const cp_plan *P) {
    return P->spec.train.micro_batches * P->micro_steps + (P->nsteps - P->micro_steps);
}

int cp_trace_instance(const cp_plan *P, int mb, int i) {
    return i < P->micro_steps ? mb * P->micro_steps + i
                              : P->spec.train.micro_batches * P->micro_steps + (i - P->micro_steps);
}

/* The plan step and micro-batch of instance k. */
static int instance_step(const cp_plan *P, int k, int *mb) {
    int in_micro = P->spec.train.micro_batches * P->micro_steps;
    if (k < in_micro) {
        *mb = k / P->micro_steps;
        return k % P->micro_steps;
    }
    *mb = 0;
    return P->micro_steps + (k - in_micro);
}

/* The waits by waiting step: after[first[i] .. first[i + 1]) are the steps step i waits for. */
static void waits_by_step(const cp_plan *P, const cp_trace_wait *w, int nw, int **first_out, int **after_out) {
    int *first = cp_xcalloc((size_t)P->nsteps + 2, sizeof *first), *after = cp_xmalloc(sizeof *after * (size_t)(nw + 1));
    for (int k = 0; k < nw; k++) first[w[k].step + 2]++;
    for (int i = 0; i < P->nsteps; i++) first[i + 2] += first[i + 1];
    for (int k = 0; k < nw; k++) after[first[w[k].step + 1]++] = w[k].after;
    *first_out = first;
    *after_out = after;
}

void cp_trace_schedule(const cp_plan *P, const cp_trace_wait *waits, int nwaits, const double *seconds, double *start,
                       double *end) {
    int *first, *after;
    waits_by_step(P, waits, nwaits, &first, &after);
    double ready[CP_STREAM_COUNT] = {0};
    int mbs = P->spec.train.micro_batches;
    for (int g = 0; g <= mbs; g++) {
        int mb = g < mbs ? g : 0, from = g < mbs ? 0 : P->micro_steps, to = g < mbs ? P->micro_steps : P->nsteps;
        double joined = 0;
        for (int s = 0; s < CP_STREAM_COUNT; s++) joined = CP_MAX(joined, ready[s]);
        for (int s = 0; s < CP_STREAM_COUNT; s++) ready[s] = joined;
        for (int i = from; i < to; i++) {
            int k = cp_trace_instance(P, mb, i), st = P->steps[i].stream;
            double t = ready[st];
            for (int w = first[i]; w < first[i + 1]; w++) t = CP_MAX(t, end[cp_trace_instance(P, mb, after[w])]);
            start[k] = t;
            end[k] = ready[st] = t + seconds[i];
        }
    }
    free(first);
    free(after);
}

/* ---------------------------------------------------------------- writing */

typedef struct {
    cp_str *out;
    int n; /* events so far */
} events;

static void next_event(events *e) {
    cp_str_append(e->out, e->n ? ",\n" : "\n", e->n ? 2 : 1);
    e->n++;
}

static void name_process(events *e, int pid, const char *name, int sort_index) {
    next_event(e);
    cp_str_printf(e->out, "{\"ph\":\"M\",\"pid\":%d,\"name\":\"process_name\",\"args\":{\"name\":", pid);
    cp_json_put_string(e->out, name);
    cp_str_printf(e->out, "}}");
    next_event(e);
    cp_str_printf(e->out, "{\"ph\":\"M\",\"pid\":%d,\"name\":\"process_sort_index\",\"args\":{\"sort_index\":%d}}", pid,
                  sort_index);
    for (int s = 0; s < CP_STREAM_COUNT; s++) {
        next_event(e);
        cp_str_printf(e->out, "{\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"name\":\"thread_name\",\"args\":{\"name\":\"%s\"}}",
                      pid, s, stream_names[s]);
    }
}

/* A plan step as a slice: named by what it does, where in the model it is, and what kind of work it is. */
static void slice(events *e, const cp_plan *P, int pid, int i, int mb, double start, double end) {
    const cp_step *s = &P->steps[i];
    char name[96];
    int n = snprintf(name, sizeof name, "%s", s->what);
    if (s->layer >= 0) n += snprintf(name + n, sizeof name - (size_t)n, " L%d", s->layer);
    if (s->stage >= 0) n += snprintf(name + n, sizeof name - (size_t)n, " s%d", s->stage);
    snprintf(name + n, sizeof name - (size_t)n, " (%s)", cp_opkind_name(s->kind));
    double dur = end - start;
    next_event(e);
    cp_str_printf(e->out, "{\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":%.4f,\"dur\":%.4f,\"name\":", pid, s->stream,
                  start * 1e6, dur * 1e6);
    cp_json_put_string(e->out, name);
    cp_str_printf(e->out, ",\"cat\":\"%s\",\"args\":{\"step\":%d,\"micro_batch\":%d,\"what\":", cp_opkind_name(s->kind),
                  i, mb);
    cp_json_put_string(e->out, s->what);
    cp_str_printf(e->out, ",\"layer\":%d,\"stage\":%d,\"tile\":%d,\"phase\":\"%s\",\"kind\":\"%s\",\"bytes\":%.0f,"
                  "\"flops\":%.0f,\"predicted_us\":%.4f", s->layer, s->stage, s->tile, cp_phase_name(s->phase),
                  cp_opkind_name(s->kind), s->bytes, s->flops, s->seconds * 1e6);
    /* the rate the step reached: FLOPs where it computes, bytes where it moves or streams memory */
    if (dur > 0 && s->flops > 0) cp_str_printf(e->out, ",\"TF/s\":%.3f", s->flops / dur / 1e12);
    else if (dur > 0 && s->bytes > 0) cp_str_printf(e->out, ",\"GB/s\":%.3f", s->bytes / dur / 1e9);
    cp_str_printf(e->out, "}}");
}

typedef struct {
    double t;
    int k;
} sample;

static int by_time(const void *a, const void *b) {
    const sample *x = a, *y = b;
    return x->t != y->t ? (x->t < y->t ? -1 : 1) : (x->k > y->k) - (x->k < y->k);
}

/* The plan's GPU bytes in use, sampled where each instance starts (live[i] of its plan step), in time order, a
 * sample only where the value changes: the largest sample is the plan's most bytes live at one step. */
static void memory_counter(events *e, const cp_plan *P, int pid, const double *start, const int64_t *live) {
    int n = cp_trace_instances(P), m = 0, mb;
    sample *smp = cp_xmalloc(sizeof *smp * (size_t)(n + 1));
    for (int k = 0; k < n; k++)
        if (start[k] >= 0) smp[m++] = (sample){start[k], k};
    qsort(smp, (size_t)m, sizeof *smp, by_time);
    int64_t last = -1;
    for (int q = 0; q < m; q++) {
        int64_t v = live[instance_step(P, smp[q].k, &mb)];
        if (v == last) continue;
        last = v;
        next_event(e);
        cp_str_printf(e->out, "{\"ph\":\"C\",\"pid\":%d,\"name\":\"" MEMORY_COUNTER "\",\"ts\":%.4f,\"args\":{\"bytes\":"
                      "%lld}}", pid, smp[q].t * 1e6, (long long)v);
    }
    free(smp);
}

/* Flow pairs from the end of each waited-for step to the step that waits, and an instant where the streams join
 * (each micro-batch and the optimizer start after one). */
static void waits_and_joins(events *e, const cp_plan *P, const cp_trace_rank *r) {
    int64_t id = (int64_t)(r->rank + 1) * 1000000000;
    int mbs = P->spec.train.micro_batches;
    for (int g = 0; g <= mbs; g++) {
        int mb = g < mbs ? g : 0, from = g < mbs ? 0 : P->micro_steps, to = g < mbs ? P->micro_steps : P->nsteps;
        double first = -1;
        for (int i = from; i < to; i++) {
            double t = r->start[cp_trace_instance(P, mb, i)];
            if (t >= 0 && (first < 0 || t < first)) first = t;
        }
        if (first >= 0) {
            next_event(e);
            cp_str_printf(e->out, "{\"ph\":\"i\",\"s\":\"p\",\"pid\":%d,\"tid\":%d,\"ts\":%.4f,\"name\":\"streams "
                          "joined (%s)\"}", r->rank, CP_STREAM_COMPUTE, first * 1e6,
                          g < mbs ? "micro-batch start" : "optimizer");
        }
        for (int w = 0; w < r->nwaits; w++) {
            int i = r->waits[w].step, j = r->waits[w].after;
            if (i < from || i >= to) continue;
            int ki = cp_trace_instance(P, mb, i), kj = cp_trace_instance(P, mb, j);
            if (r->start[ki] < 0 || r->start[kj] < 0) continue;
            id++;
            next_event(e);
            cp_str_printf(e->out, "{\"ph\":\"s\",\"id\":%lld,\"pid\":%d,\"tid\":%d,\"ts\":%.4f,\"name\":\"wait\","
                          "\"cat\":\"wait\",\"args\":{\"step\":%d,\"micro_batch\":%d}}", (long long)id, r->rank,
                          P->steps[j].stream, r->start[kj] * 1e6, j, mb);
            next_event(e);
            cp_str_printf(e->out, "{\"ph\":\"f\",\"bp\":\"e\",\"id\":%lld,\"pid\":%d,\"tid\":%d,\"ts\":%.4f,\"name\":"
                          "\"wait\",\"cat\":\"wait\",\"args\":{\"step\":%d,\"micro_batch\":%d}}", (long long)id,
                          r->rank, P->steps[i].stream, r->start[ki] * 1e6, i, mb);
        }
    }
}

/* Seconds on each stream with work (slices summed) and the last end. */
static double busy_of(const cp_plan *P, const double *start, const double *end, double busy[CP_STREAM_COUNT]) {
    int mb;
    double last = 0;
    for (int s = 0; s < CP_STREAM_COUNT; s++) busy[s] = 0;
    for (int k = 0; k < cp_trace_instances(P); k++) {
        if (start[k] < 0) continue;
        busy[P->steps[instance_step(P, k, &mb)].stream] += end[k] - start[k];
        last = CP_MAX(last, end[k]);
    }
    return last;
}

static void put_seconds3(cp_str *o, const char *key, const double v[CP_STREAM_COUNT]) {
    cp_str_printf(o, ",\"%s\":[%.9f,%.9f,%.9f]", key, v[0], v[1], v[2]);
}

#define TRACE_HEAD "{\"displayTimeUnit\":\"ms\",\"traceEvents\":["

bool cp_trace_is_ours(const char *head, size_t n, const void *ctx) {
    (void)ctx;
    return n >= strlen(TRACE_HEAD) && !memcmp(head, TRACE_HEAD, strlen(TRACE_HEAD));
}

/* A whole trace file, atomically; what is at path already is replaced only if it is a trace cpgen wrote. */
static int write_trace(const char *path, const cp_str *out, char *err, int errlen) {
    if (cp_may_replace(path, cp_trace_is_ours, NULL, "a trace cpgen wrote", "give --trace another file", err, errlen))
        return -1;
    if (!cp_write_file_atomic(path, out->data, out->len)) return 0;
    return cp_errf(err, errlen, "writing the trace %s: %s; give --trace a file in a folder you can write", path,
                   strerror(errno));
}

int cp_trace_write(const cp_plan *P, const cp_trace_rank *r, const char *path, char *err, int errlen) {
    int n = cp_trace_instances(P), mb;
    cp_str out = {0};
    events e = {&out, 0};
    cp_str_printf(&out, TRACE_HEAD);
    int64_t *by_cat = cp_plan_live_by_cat(P, CP_SPACE_GPU), *live = cp_xcalloc((size_t)P->nsteps + 1, sizeof *live);
    for (int i = 0; i < P->nsteps; i++)
        for (int c = 0; c < CP_CAT_COUNT; c++) live[i] += by_cat[(size_t)i * CP_CAT_COUNT + c];
    free(by_cat);

    char pname[64];
    snprintf(pname, sizeof pname, "rank %d (measured)", r->rank);
    name_process(&e, r->rank, pname, r->rank ? r->rank + 1 : 0);
    for (int k = 0; k < n; k++) {
        int i = instance_step(P, k, &mb);
        if (r->start[k] >= 0) slice(&e, P, r->rank, i, mb, r->start[k], r->end[k]);
    }
    waits_and_joins(&e, P, r);
    memory_counter(&e, P, r->rank, r->start, live);

    /* the cost model's timeline, once (every rank runs the same program at the same predicted times) */
    double *ps = cp_xmalloc(sizeof *ps * (size_t)n), *pe = cp_xmalloc(sizeof *pe * (size_t)n);
    double *secs = cp_xmalloc(sizeof *secs * ((size_t)P->nsteps + 1));
    for (int i = 0; i < P->nsteps; i++) secs[i] = P->steps[i].seconds;
    cp_trace_schedule(P, r->waits, r->nwaits, secs, ps, pe);
    double pbusy[CP_STREAM_COUNT], pspan = busy_of(P, ps, pe, pbusy);
    if (r->rank == 0) {
        name_process(&e, P->C, "predicted (cost model)", 1);
        for (int k = 0; k < n; k++) {
            int i = instance_step(P, k, &mb);
            slice(&e, P, P->C, i, mb, ps[k], pe[k]);
        }
        memory_counter(&e, P, P->C, ps, live);
    }

    double busy[CP_STREAM_COUNT], span = busy_of(P, r->start, r->end, busy);
    cp_str_printf(&out, "\n],\n\"otherData\":{\"cpgen\":{\"version\":\"%s\",\"spec\":", CP_VERSION);
    cp_json_put_string(&out, P->spec.path);
    cp_str_printf(&out, ",\"gpus\":%d,\"seq_len\":%lld,\"micro_batches\":%d,\"step\":%d,\"time_unit\":\"us\","
                  "\"predicted_pid\":%d,\"streams\":[\"%s\",\"%s\",\"%s\"]},\n\"ranks\":[{\"rank\":%d,\"pid\":%d,"
                  "\"step_seconds\":%.9f,\"measured_seconds\":%.9f", P->C, (long long)P->S,
                  P->spec.train.micro_batches, r->step, P->C, stream_names[0], stream_names[1], stream_names[2],
                  r->rank, r->rank, r->step_seconds, span);
    put_seconds3(&out, "busy_seconds", busy);
    cp_str_printf(&out, ",\"predicted_seconds\":%.9f,\"plan_step_seconds\":%.9f", pspan, P->t_step);
    put_seconds3(&out, "predicted_busy_seconds", pbusy);
    cp_str_printf(&out, ",\"plan_steps\":%d,\"micro_steps\":%d,\"micro_batches\":%d,\"instances\":%d,\"waits\":%d,"
                  "\"gpu_live_peak\":%lld,\"peak_step\":%d,\"not_run\":[", P->nsteps, P->micro_steps,
                  P->spec.train.micro_batches, n, r->nwaits, (long long)P->gpu_live_peak, P->peak_step);
    int nr = 0;
    for (int k = 0; k < n; k++)
        if (r->start[k] < 0) {
            int i = instance_step(P, k, &mb);
            cp_str_printf(&out, "%s[%d,%d]", nr++ ? "," : "", i, mb);
        }
    cp_str_printf(&out, "]}]}}\n");
    free(live);
    free(ps);
    free(pe);
    free(secs);
    int rc = write_trace(path, &out, err, errlen);
    cp_str_free(&out);
    return rc;
}

/* ---------------------------------------------------------------- several ranks */

void cp_trace_part_path(const char *path, int rank, char *out, size_t n) { snprintf(out, n, "%s.rank%d", path, rank); }

/* A parsed value written back as JSON (integers as integers, other numbers so that they read back the same). */
static void put_value(cp_str *o, const cp_json *v) {
    switch (v->type) {
    case CP_JSON_NULL: cp_str_printf(o, "null"); break;
    case CP_JSON_BOOL: cp_str_printf(o, v->boolean ? "true" : "false"); break;
    case CP_JSON_NUMBER:
        if (v->is_int) cp_str_printf(o, "%lld", (long long)v->integer);
        else cp_json_put_number(o, v->number);
        break;
    case CP_JSON_STRING: cp_json_put_string(o, v->string); break;
    case CP_JSON_ARRAY:
        cp_str_printf(o, "[");
        for (int k = 0; k < v->n; k++) {
            if (k) cp_str_printf(o, ",");
            put_value(o, &v->items[k]);
        }
        cp_str_printf(o, "]");
        break;
    case CP_JSON_OBJECT:
        cp_str_printf(o, "{");
        for (int k = 0; k < v->n; k++) {
            if (k) cp_str_printf(o, ",");
            cp_json_put_string(o, v->keys[k]);
            cp_str_printf(o, ":");
            put_value(o, &v->items[k]);
        }
        cp_str_printf(o, "}");
        break;
    }
}

/* One rank's part into the merged events and rank records; rank 0's common record is kept. */
static int merge_part(const char *part, int rank, events *e, cp_str *ranks, cp_str *common, char *err, int errlen) {
    size_t len;
    char why[256];
    char *text = cp_read_file_as(part, CP_FILE_TRACE, &len, why, sizeof why);
    if (!text) return cp_errf(err, errlen, "reading the trace part %s: %s", part, why);
    cp_json j;
    int rc = 0;
    if (cp_json_parse(text, len, &j, why, sizeof why)) {
        rc = cp_errf(err, errlen, "the trace part %s is not JSON (%s): was it written by another cpgen?", part, why);
    } else {
        const cp_json *ev = cp_json_get(&j, "traceEvents"), *od = cp_json_get(&j, "otherData");
        const cp_json *rk = cp_json_get(od, "ranks"), *cm = cp_json_get(od, "cpgen");
        if (!ev || ev->type != CP_JSON_ARRAY || !rk || rk->type != CP_JSON_ARRAY || !cm)
            rc = cp_errf(err, errlen, "the trace part %s lacks traceEvents or otherData.ranks: it is not a cpgen trace",
                         part);
        for (int k = 0; !rc && k < ev->n; k++) {
            next_event(e);
            put_value(e->out, &ev->items[k]);
        }
        for (int k = 0; !rc && k < rk->n; k++) {
            if (ranks->len) cp_str_printf(ranks, ",\n");
            put_value(ranks, &rk->items[k]);
        }
        if (!rc && rank == 0) put_value(common, cm);
    }
    cp_json_free(&j);
    free(text);
    return rc;
}

int cp_trace_merge(const char *path, int ranks, double timeout_s, char *err, int errlen) {
    char part[CP_PATH_MAX + 32];
    double deadline = cp_now() + timeout_s;
    for (int r = 0; r < ranks; r++) {
        cp_trace_part_path(path, r, part, sizeof part);
        while (access(part, F_OK) != 0) {
            if (cp_now() > deadline)
                return cp_errf(err, errlen, "the trace part %s did not appear within %.0f s: every rank writes its "
                               "part beside %s, so with ranks on several nodes that folder must be one they all see; "
                               "the parts written are left there", part, timeout_s, path);
            struct timespec ts = {0, 50 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
    }
    cp_str out = {0}, rk = {0}, common = {0};
    events e = {&out, 0};
    cp_str_printf(&out, TRACE_HEAD);
    int rc = 0;
    for (int r = 0; r < ranks && !rc; r++) {
        cp_trace_part_path(path, r, part, sizeof part);
        rc = merge_part(part, r, &e, &rk, &common, err, errlen);
    }
    if (!rc) {
        cp_str_printf(&out, "\n],\n\"otherData\":{\"cpgen\":%s,\n\"ranks\":[%s]}}\n", common.data, rk.data);
        rc = write_trace(path, &out, err, errlen);
    }
    for (int r = 0; r < ranks && !rc; r++) {
        cp_trace_part_path(path, r, part, sizeof part);
        if (unlink(part))
            rc = cp_errf(err, errlen, "removing the merged trace part %s: %s", part, strerror(errno));
    }
    cp_str_free(&out);
    cp_str_free(&rk);
    cp_str_free(&common);
    return rc;
}

int cp_trace_check_path(const char *path, char *err, int errlen) {
    char dir[CP_PATH_MAX];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash) snprintf(dir, sizeof dir, ".");
    else if (slash == dir) dir[1] = 0;
    else *slash = 0;
    struct stat st;
    if (!*path || path[strlen(path) - 1] == '/' || (stat(path, &st) == 0 && S_ISDIR(st.st_mode)))
        return cp_errf(err, errlen, "--trace %s: give a file name, e.g. --trace %s/trace.json", path,
                       *path ? path : ".");
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return cp_errf(err, errlen, "--trace %s: the folder %s does not exist; create it first", path, dir);
    if (access(dir, W_OK) != 0)
        return cp_errf(err, errlen, "--trace %s: the folder %s cannot be written (%s); give a path in a folder you can "
                       "write", path, dir, strerror(errno));
    return cp_may_replace(path, cp_trace_is_ours, NULL, "a trace cpgen wrote", "give --trace another file", err,
                          errlen);
}

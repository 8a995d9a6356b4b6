/* ckpt_bench.c: how fast a training checkpoint is written on this machine, without a GPU: a spec's model-sized
 * fp32 master weights and AdamW moments (random values) written with cp_ckpt_write, as a save does, and where the
 * time went (reordering into Hugging Face layout, write calls, fsync; cp_st_stats).
 *
 * usage: build/tools/ckpt_bench [SPEC] [--set KEY=VALUE ...] [--dir DIR] [--reps N]
 *   SPEC: a shipped spec or a file (default llama1b); DIR: where to write (default /tmp; removed after each rep).
 * Prints one line per repetition and the best, in MB/s of checkpoint bytes (1 MB = 1e6 bytes). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "checkpoint.h"
#include "plan.h"
#include "safetensors.h"
#include "spec.h"
#include "util.h"
#include "weights.h"

static void fill_random(float *a, int64_t n, uint64_t seed) {
    uint64_t x = seed * 0x9e3779b97f4a7c15ULL + 1;
    for (int64_t i = 0; i < n; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        a[i] = (float)((double)(x >> 11) * 0x1p-53 - 0.5) * 1e-2f;
    }
}

int main(int argc, char **argv) {
    const char *spec_name = "llama1b", *dir = "/tmp", *sets[32];
    int nsets = 0, reps = 2;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--set") && i + 1 < argc && nsets < 32) sets[nsets++] = argv[++i];
        else if (!strcmp(argv[i], "--dir") && i + 1 < argc) dir = argv[++i];
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (argv[i][0] != '-') spec_name = argv[i];
        else {
            fprintf(stderr, "usage: %s [SPEC] [--set KEY=VALUE ...] [--dir DIR] [--reps N]\n", argv[0]);
            return 2;
        }
    }
    char err[CP_ERR_MAX];
    cp_spec spec;
    if (cp_spec_load(spec_name, sets, nsets, &spec, err, sizeof err)) {
        fprintf(stderr, "ckpt_bench: %s\n", err);
        return 2;
    }
    cp_plan P;
    if (cp_plan_build_folded(&spec, &P, err, sizeof err)) {
        fprintf(stderr, "ckpt_bench: %s\n", err);
        return 2;
    }
    int64_t n = cp_weights_elems(&P);
    float *w = cp_xmalloc(sizeof(float) * (size_t)n), *m = cp_xmalloc(sizeof(float) * (size_t)n),
          *v = cp_xmalloc(sizeof(float) * (size_t)n);
    fill_random(w, n, 1), fill_random(m, n, 2), fill_random(v, n, 3);
    for (int64_t i = 0; i < n; i++) v[i] = v[i] < 0 ? -v[i] : v[i];
    cp_ckpt_state st;
    cp_ckpt_state_init(&P, &st);
    st.step = 1;
    st.updates = 1;
    char out[CP_PATH_MAX];
    snprintf(out, sizeof out, "%s/ckpt_bench.%ld", dir, (long)getpid());
    printf("%s: %lld parameters (padded), 3 fp32 arrays = %.2f GB, into %s, %ld cores\n", spec.name, (long long)n,
           12.0 * (double)n / 1e9, dir, sysconf(_SC_NPROCESSORS_ONLN));
    double best = 0;
    for (int r = 0; r < reps; r++) {
        cp_st_stats(NULL, true);
        double t0 = cp_now();
        int rc = cp_ckpt_write(&P, out, &st, w, m, v, NULL, NULL, NULL, 0, err, sizeof err);
        double t = cp_now() - t0;
        cp_st_write_stats s;
        cp_st_stats(&s, false);
        cp_remove_tree(out);
        if (rc) {
            fprintf(stderr, "ckpt_bench: %s\n", err);
            return 1;
        }
        double mbs = (double)s.bytes / t / 1e6;
        if (mbs > best) best = mbs;
        printf("rep %d: %.2f GB in %.2f s = %.0f MB/s | thread-seconds: reorder %.2f, write calls %.2f, fsync %.2f\n",
               r + 1, (double)s.bytes / 1e9, t, mbs, s.fill_s, s.write_s, s.sync_s);
        fflush(stdout);
    }
    printf("best: %.0f MB/s\n", best);
    free(w), free(m), free(v);
    cp_plan_free(&P);
    return 0;
}

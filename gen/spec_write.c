/* spec_write.c: a validated spec written back as a Lua spec with every key spelled out (defaults resolved), so that
 * loading it gives the same cp_spec. An AOT bundle keeps its spec this way: it runs without the file it came from.
 * Every text from outside (file names, paths, string values) goes through cp_lua_put_string or cp_lua_put_comment,
 * so that none can end its string or comment and become code of the written file. */
#include "spec_write.h"

#include <stdio.h>
#include <string.h>

void cp_lua_put_string(cp_str *o, const char *s) {
    cp_str_append(o, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') cp_str_printf(o, "\\%c", *p);
        else if (*p < 0x20 || *p == 0x7f) cp_str_printf(o, "\\%03u", *p);
        else cp_str_append(o, (const char *)p, 1);
    }
    cp_str_append(o, "\"", 1);
}

void cp_lua_put_comment(cp_str *o, const char *s) {
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p < 0x20 || *p == 0x7f) cp_str_printf(o, "\\%03u", *p); /* a newline would end the comment */
        else cp_str_append(o, (const char *)p, 1);
    }
}

static void put_str(cp_str *o, const char *key, const char *v) {
    cp_str_printf(o, "    %s = ", key);
    cp_lua_put_string(o, v);
    cp_str_append(o, ",\n", 2);
}

static void put_int(cp_str *o, const char *key, long long v) { cp_str_printf(o, "    %s = %lld,\n", key, v); }
/* %.17g reads back to the same double */
static void put_num(cp_str *o, const char *key, double v) { cp_str_printf(o, "    %s = %.17g,\n", key, v); }
static void put_bool(cp_str *o, const char *key, bool v) { cp_str_printf(o, "    %s = %s,\n", key, v ? "true" : "false"); }
static void put_auto(cp_str *o, const char *key, long long v) {
    if (v) put_int(o, key, v);
    else put_str(o, key, "auto");
}

void cp_spec_write_lua(const cp_spec *s, cp_str *o) {
    const cp_model *m = &s->model;
    cp_str_printf(o, "-- the resolved spec of ");
    cp_lua_put_comment(o, s->path);
    cp_str_printf(o, ": every key with its value, defaults included\nreturn {\n  model = {\n");
    put_str(o, "family", cp_family_name(m->family));
    put_int(o, "vocab", m->vocab);
    put_int(o, "hidden", m->hidden);
    put_int(o, "layers", m->layers);
    put_int(o, "heads", m->heads);
    put_int(o, "kv_heads", m->kv_heads);
    put_int(o, "head_dim", m->head_dim);
    put_int(o, "ffn", m->ffn);
    put_num(o, "norm_eps", m->norm_eps);
    put_bool(o, "tie_embeddings", m->tie_embeddings);
    put_bool(o, "qk_norm", m->qk_norm);
    cp_str_printf(o, "    rope = { theta = %.17g", m->rope_theta);
    if (m->rope_scaling.enabled)
        cp_str_printf(o, ", scaling = { factor = %.17g, low_freq = %.17g, high_freq = %.17g, original_max = %lld }",
                      m->rope_scaling.factor, m->rope_scaling.low_freq, m->rope_scaling.high_freq,
                      (long long)m->rope_scaling.original_max);
    cp_str_printf(o, " },\n  },\n  parallel = {\n");
    const cp_parallel *p = &s->parallel;
    put_int(o, "gpus", p->gpus);
    if (p->replicas > 1) put_int(o, "replicas", p->replicas); /* written only when used: older bundles read alike */
    if (p->ring > 1) put_int(o, "ring", p->ring);
    if (p->upipe_auto) put_str(o, "upipe_heads", "auto");
    else put_int(o, "upipe_heads", p->upipe_heads);
    put_str(o, "checkpoint", p->checkpoint == CP_CKPT_LAYER ? "layer" : "none");
    put_auto(o, "checkpoint_every", p->checkpoint_every);
    put_str(o, "offload", cp_offload_name(p->offload));
    put_str(o, "optimizer", cp_opt_place_name(p->optimizer));
    put_str(o, "attention_output", cp_attn_keep_name(p->attention_output));
    put_auto(o, "mlp_tile", p->mlp_tile);
    put_auto(o, "loss_tile", p->loss_tile);
    cp_str_printf(o, "  },\n  train = {\n");
    const cp_train *t = &s->train;
    put_int(o, "seq_len", t->seq_len);
    put_int(o, "micro_batches", t->micro_batches);
    put_int(o, "steps", t->steps);
    put_num(o, "lr", t->lr);
    put_num(o, "min_lr", t->min_lr);
    put_int(o, "warmup", t->warmup);
    put_num(o, "weight_decay", t->weight_decay);
    put_num(o, "clip", t->clip);
    put_num(o, "beta1", t->beta1);
    put_num(o, "beta2", t->beta2);
    put_num(o, "eps", t->eps);
    put_int(o, "log_every", t->log_every);
    put_int(o, "save_every", t->save_every);
    put_int(o, "keep_checkpoints", t->keep_checkpoints);
    put_bool(o, "async_save", t->async_save);
    if (s->data.val[0]) { /* written only where there is held-out data: a spec without any writes what it wrote */
        put_int(o, "eval_every", t->eval_every);
        put_int(o, "eval_sequences", t->eval_sequences);
    }
    put_str(o, "out_dir", t->out_dir);
    put_bool(o, "deterministic", t->deterministic);
    put_str(o, "precision", t->fp8 ? "fp8" : "bf16");
    put_str(o, "fp8_format", t->fp8_e4m3_grads ? "e4m3" : "hybrid");
    put_str(o, "fp8_fast_accum", cp_fp8_fast_name((cp_fp8_fast)t->fp8_fast_accum));
    put_str(o, "fp8_scaling", cp_fp8_scaling_name((cp_fp8_scaling)t->fp8_scaling));
    put_str(o, "fp8_weight_grads", t->fp8_bf16_wgrad ? "bf16" : "fp8");
    put_str(o, "fp8_input_grads", t->fp8_bf16_dgrad ? "bf16" : "fp8");
    put_str(o, "fp8_gemm", cp_fp8_gemm_name((cp_fp8_gemm)t->fp8_gemm));
    cp_str_printf(o, "  },\n  data = {\n");
    put_str(o, "source", s->data.source);
    if (s->data.val[0]) put_str(o, "val", s->data.val);
    /* written where given or resolved (not AUTO): a spec that says nothing of documents writes what it wrote */
    if (s->data.documents != CP_DOCS_AUTO)
        put_str(o, "documents", s->data.documents == CP_DOCS_MASK ? "mask" : "stream");
    if (s->data.positions != CP_POS_AUTO)
        put_str(o, "positions", s->data.positions == CP_POS_DOCUMENT ? "document" : "sequence");
    if (s->data.eod >= 0) put_int(o, "eod", s->data.eod);
    if (s->data.doc_len > 0) put_int(o, "doc_len", s->data.doc_len);
    cp_str_printf(o, "  },\n  init = {\n");
    put_str(o, "from", s->init.from == CP_INIT_HF ? "hf" : "random");
    put_str(o, "path", s->init.path);
    put_int(o, "seed", (long long)s->init.seed);
    put_num(o, "std", s->init.std);
    cp_str_printf(o, "  },\n  machine = {\n");
    const cp_machine *mc = &s->machine;
    put_int(o, "gpu_mem", mc->gpu_mem);
    put_int(o, "host_mem", mc->host_mem);
    put_int(o, "reserve", mc->reserve);
    put_int(o, "comm_reserve", mc->comm_reserve);
    put_int(o, "host_reserve", mc->host_reserve);
    put_int(o, "host_runtime", mc->host_runtime);
    cp_machine d;
    cp_machine_defaults(&d);
    for (size_t i = 0; i < cp_machine_nnums; i++) {
        const cp_machine_num *k = &cp_machine_nums[i];
        const double v = cp_machine_num_of(mc, k);
        if (k->write == CP_MACHINE_WRITE_ALWAYS ||
            (k->write == CP_MACHINE_WRITE_GROUPS && s->parallel.replicas * s->parallel.ring > 1) ||
            (k->write == CP_MACHINE_WRITE_NOT_DEFAULT && v != cp_machine_num_of(&d, k)))
            put_num(o, k->key, v);
    }
    if (mc->ranks_per_gpu > 1) {
        put_int(o, "ranks_per_gpu", mc->ranks_per_gpu);
        put_int(o, "comm_reserve_shared", mc->comm_reserve_shared);
        put_int(o, "comm_reserve_p2p", mc->comm_reserve_p2p);
        put_int(o, "comm_reserve_split", mc->comm_reserve_split);
    }
    cp_str_printf(o, "  },\n}\n");
}

/* The body of the text, without the first line (which names the file it came from). */
static const char *body(const char *text) {
    const char *nl = strchr(text, '\n');
    return nl ? nl + 1 : text;
}

bool cp_spec_same(const cp_spec *a, const cp_spec *b) {
    cp_str x = {0}, y = {0};
    cp_spec_write_lua(a, &x);
    cp_spec_write_lua(b, &y);
    bool same = strcmp(body(x.data), body(y.data)) == 0;
    cp_str_free(&x);
    cp_str_free(&y);
    return same;
}

/* A line "  name = {" opens section name; a line at the left margin closes it; key lines keep it. */
static void section_of(const char *line, char *sec, size_t n) {
    size_t len = strlen(line);
    if (!strncmp(line, "  ", 2) && line[2] != ' ' && len > 6 && !strcmp(line + len - 4, " = {"))
        snprintf(sec, n, "%.*s", (int)(len - 6), line + 2);
    else if (line[0] != ' ')
        sec[0] = 0;
}

int cp_spec_diff(const char *a, const char *b, cp_str *out, int max) {
    /* the texts come from cp_spec_write_lua: one key per line under a "  section = {" line */
    int n = 0;
    char sec_a[32] = "", sec_b[32] = "";
    const char *p = body(a), *q = body(b);
    while (*p || *q) {
        const char *pe = strchr(p, '\n'), *qe = strchr(q, '\n');
        size_t pl = pe ? (size_t)(pe - p) : strlen(p), ql = qe ? (size_t)(qe - q) : strlen(q);
        char la[512], lb[512];
        snprintf(la, sizeof la, "%.*s", (int)pl, p);
        snprintf(lb, sizeof lb, "%.*s", (int)ql, q);
        section_of(la, sec_a, sizeof sec_a);
        section_of(lb, sec_b, sizeof sec_b);
        if (strcmp(la, lb) != 0) {
            n++;
            if (n <= max) {
                const char *ka = la + strspn(la, " "), *kb = lb + strspn(lb, " ");
                const char *eq = strstr(ka, " = ");
                int klen = eq ? (int)(eq - ka) : (int)strlen(ka);
                const char *va = eq ? eq + 3 : ka, *vb = strstr(kb, " = ") ? strstr(kb, " = ") + 3 : kb;
                int val = (int)strcspn(va, ","), vbl = (int)strcspn(vb, ",");
                cp_str_printf(out, "%s%s.%.*s = %.*s here, %.*s in the bundle", n > 1 ? "; " : "", sec_b, klen, ka,
                              vbl, vb, val, va);
            }
        }
        p += pl + (pe ? 1 : 0);
        q += ql + (qe ? 1 : 0);
    }
    if (n > max) cp_str_printf(out, "; and %d more", n - max);
    return n;
}

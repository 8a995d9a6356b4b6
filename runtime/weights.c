/* weights.c: Hugging Face Llama / Qwen3 names <-> cpgen's flat fp32 model (plan units, stage-ordered query heads),
 * checkpoint load and save through runtime/safetensors.c, config.json, and the counter-based random init. */
#include "weights.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "json.h"
#include "safetensors.h"
#include "util.h"

int64_t cp_weights_unit_off(const cp_plan *plan, int unit) {
    int64_t off = 0;
    for (int u = 0; u < unit && u < plan->nunits; u++) off += plan->unit_padded[u];
    return off;
}

/* Rank's part of unit u (unit: the whole unit) into its place in the shard. */
static void keep_part(const cp_plan *plan, int rank, int u, const float *unit, float *shard) {
    int64_t part = plan->unit_padded[u] / plan->C;
    memcpy(shard + plan->unit_shard_off[u], unit + (int64_t)rank * part, sizeof(float) * (size_t)part);
}

void cp_weights_shard(const cp_plan *plan, int rank, const float *full, float *shard) {
    const float *unit = full;
    for (int u = 0; u < plan->nunits; u++) {
        keep_part(plan, rank, u, unit, shard);
        unit += plan->unit_padded[u];
    }
}

int64_t cp_weights_elems(const cp_plan *plan) { return cp_weights_unit_off(plan, plan->nunits); }

void cp_q_head_order(const cp_plan *plan, int *order) {
    for (int s = 0; s < plan->nstages; s++)
        for (int r = 0; r < plan->C; r++)
            for (int j = 0; j < plan->u; j++)
                order[s * plan->U + r * plan->u + j] = plan->stages[s * plan->C + r].q_heads[j];
}

/* ------------------------------------------------------------------------------------------------------------
 * the name table */

static int add(cp_hf_tensor *out, int cap, int n, const char *name, int ndim, int64_t d0, int64_t d1, int64_t off,
               cp_hf_perm perm, bool norm, int unit) {
    if (n < cap) {
        cp_hf_tensor *t = &out[n];
        memset(t, 0, sizeof *t);
        snprintf(t->name, sizeof t->name, "%s", name);
        t->ndim = ndim;
        t->shape[0] = d0;
        t->shape[1] = ndim == 2 ? d1 : 0;
        t->off = off;
        t->perm = perm;
        t->norm = norm;
        t->unit = unit;
    }
    return n + 1;
}

int cp_weights_hf_tensors(const cp_plan *plan, cp_hf_tensor *out, int cap) {
    const cp_model *m = &plan->spec.model;
    const cp_layer_layout *L = &plan->layout;
    int64_t hid = m->hidden, qd = m->heads * m->head_dim, kvd = m->kv_heads * m->head_dim;
    int n = 0;
    char name[96];
    n = add(out, cap, n, "model.embed_tokens.weight", 2, m->vocab, hid, cp_weights_unit_off(plan, 0), CP_HF_PLAIN,
            false, 0);
    for (int l = 0; l < m->layers; l++) {
        int64_t base = cp_weights_unit_off(plan, 1 + l);
        static const struct {
            const char *suffix;
            cp_weight w;
        } names[] = {{"self_attn.q_proj", CP_W_Q},
                     {"self_attn.k_proj", CP_W_K},
                     {"self_attn.v_proj", CP_W_V},
                     {"self_attn.o_proj", CP_W_O},
                     {"self_attn.q_norm", CP_W_QNORM},
                     {"self_attn.k_norm", CP_W_KNORM},
                     {"mlp.gate_proj", CP_W_GATE},
                     {"mlp.up_proj", CP_W_UP},
                     {"mlp.down_proj", CP_W_DOWN},
                     {"input_layernorm", CP_W_NORM1},
                     {"post_attention_layernorm", CP_W_NORM2}};
        for (size_t k = 0; k < CP_ARRAY_LEN(names); k++) {
            cp_weight w = names[k].w;
            if ((unsigned)w >= CP_W_COUNT || L->size[w] == 0) continue; /* q/k norms without qk_norm */
            snprintf(name, sizeof name, "model.layers.%d.%s.weight", l, names[k].suffix);
            int64_t rows = 0, cols = 0;
            bool norm = false;
            cp_hf_perm perm = CP_HF_PLAIN;
            switch (w) {
            case CP_W_Q: rows = qd, cols = hid, perm = CP_HF_Q_ROWS; break;
            case CP_W_K:
            case CP_W_V: rows = kvd, cols = hid; break;
            case CP_W_O: rows = hid, cols = qd, perm = CP_HF_O_COLS; break;
            case CP_W_GATE:
            case CP_W_UP: rows = m->ffn, cols = hid; break;
            case CP_W_DOWN: rows = hid, cols = m->ffn; break;
            case CP_W_NORM1:
            case CP_W_NORM2: rows = hid, norm = true; break;
            case CP_W_QNORM:
            case CP_W_KNORM: rows = m->head_dim, norm = true; break;
            default: break;
            }
            n = add(out, cap, n, name, norm ? 1 : 2, rows, cols, base + L->off[w], perm, norm, 1 + l);
        }
    }
    int last = plan->nunits - 1;
    int64_t base = cp_weights_unit_off(plan, last);
    n = add(out, cap, n, "model.norm.weight", 1, hid, 0, base, CP_HF_PLAIN, true, last);
    if (!m->tie_embeddings)
        n = add(out, cap, n, "lm_head.weight", 2, m->vocab, hid, base + ((hid + 63) / 64) * 64, CP_HF_PLAIN, false,
                last);
    return n;
}

static int64_t hf_elems(const cp_hf_tensor *t) { return t->ndim == 2 ? t->shape[0] * t->shape[1] : t->shape[0]; }

/* Which spec fields decide a tensor's shape, for messages. */
static void shape_why(const cp_plan *plan, const cp_hf_tensor *t, char *buf, size_t n) {
    const cp_model *m = &plan->spec.model;
    const char *s = t->name;
    if (strstr(s, "q_proj"))
        snprintf(buf, n, "model.heads x model.head_dim = %lld x %lld rows, model.hidden = %lld columns",
                 (long long)m->heads, (long long)m->head_dim, (long long)m->hidden);
    else if (strstr(s, "k_proj") || strstr(s, "v_proj"))
        snprintf(buf, n, "model.kv_heads x model.head_dim = %lld x %lld rows, model.hidden = %lld columns",
                 (long long)m->kv_heads, (long long)m->head_dim, (long long)m->hidden);
    else if (strstr(s, "o_proj"))
        snprintf(buf, n, "model.hidden = %lld rows, model.heads x model.head_dim = %lld x %lld columns",
                 (long long)m->hidden, (long long)m->heads, (long long)m->head_dim);
    else if (strstr(s, "gate_proj") || strstr(s, "up_proj"))
        snprintf(buf, n, "model.ffn = %lld rows, model.hidden = %lld columns", (long long)m->ffn, (long long)m->hidden);
    else if (strstr(s, "down_proj"))
        snprintf(buf, n, "model.hidden = %lld rows, model.ffn = %lld columns", (long long)m->hidden, (long long)m->ffn);
    else if (strstr(s, "q_norm") || strstr(s, "k_norm"))
        snprintf(buf, n, "model.head_dim = %lld", (long long)m->head_dim);
    else if (strstr(s, "embed_tokens") || strstr(s, "lm_head"))
        snprintf(buf, n, "model.vocab = %lld rows, model.hidden = %lld columns", (long long)m->vocab,
                 (long long)m->hidden);
    else
        snprintf(buf, n, "model.hidden = %lld", (long long)m->hidden);
}

static const char *fmt_shape(int ndim, const int64_t *shape, char *buf, size_t n) {
    size_t at = (size_t)snprintf(buf, n, "[");
    for (int k = 0; k < ndim && at < n; k++)
        at += (size_t)snprintf(buf + at, n - at, "%s%lld", k ? ", " : "", (long long)shape[k]);
    if (at < n) snprintf(buf + at, n - at, "]");
    return buf;
}

/* Copy one tensor given in HF order (src) into the flat model, permuting query heads. */
static void place(const cp_plan *plan, const int *order, const cp_hf_tensor *t, const float *src, float *dst) {
    int64_t hd = plan->spec.model.head_dim, H = plan->spec.model.heads;
    if (t->perm == CP_HF_Q_ROWS) {
        int64_t block = hd * t->shape[1];
        for (int64_t p = 0; p < H; p++) memcpy(dst + p * block, src + order[p] * block, (size_t)block * sizeof(float));
    } else if (t->perm == CP_HF_O_COLS) {
        int64_t cols = t->shape[1];
        for (int64_t i = 0; i < t->shape[0]; i++)
            for (int64_t p = 0; p < H; p++)
                memcpy(dst + i * cols + p * hd, src + i * cols + order[p] * hd, (size_t)hd * sizeof(float));
    } else {
        memcpy(dst, src, (size_t)hf_elems(t) * sizeof(float));
    }
}

/* ------------------------------------------------------------------------------------------------------------
 * load */

/* Is name a tensor the HF model may carry that cpgen does not use (and may ignore)? */
static bool ignorable(const char *name) {
    size_t n = strlen(name);
    static const char suffix[] = "rotary_emb.inv_freq";
    return n >= sizeof suffix - 1 && !strcmp(name + n - (sizeof suffix - 1), suffix);
}

static int family_check(const cp_model *m, char *err, int errlen) {
    if (m->family == CP_FAMILY_LLAMA && m->qk_norm)
        return cp_errf(err, errlen,
                    "model.qk_norm = true with family \"llama\": transformers' LlamaForCausalLM has no "
                    "q/k norms, so there is no Hugging Face checkpoint of this model; use family \"qwen3\"");
    if (m->family == CP_FAMILY_QWEN3 && !m->qk_norm)
        return cp_errf(err, errlen,
                    "model.qk_norm = false with family \"qwen3\": Qwen3ForCausalLM always has q/k "
                    "norms; use family \"llama\" or qk_norm = true");
    return 0;
}

/* The model's tensors in Hugging Face order (*tt, nt of them) and the query heads' storage order (*order, one
 * entry per head); the caller frees both. Returns nt. */
static int tensor_table(const cp_plan *plan, cp_hf_tensor **tt, int **order) {
    int nt = cp_weights_hf_tensors(plan, NULL, 0);
    *tt = cp_xmalloc((size_t)nt * sizeof **tt);
    cp_weights_hf_tensors(plan, *tt, nt);
    *order = cp_xmalloc((size_t)plan->spec.model.heads * sizeof **order);
    cp_q_head_order(plan, *order);
    return nt;
}

/* Tensor s of the file (the model's tensor t, named `name` there) to `to`, where the flat model holds t: shape
 * checked against the spec, read as fp32, NaN and infinities (and with nonneg, negatives) refused, permuted tensors
 * put in storage order. The hints end the messages: what a wrong shape or a bad value says about the file. */
static int read_tensor(const cp_plan *plan, const int *order, const cp_hf_tensor *t, const cp_st_set *st,
                       const cp_st_tensor *s, const char *name, bool nonneg, const char *shape_hint,
                       const char *value_hint, float **tmp, float *to, char *err, int errlen) {
    const char *file = st->files[s->file].path;
    bool same = s->ndim == t->ndim;
    for (int d = 0; d < t->ndim && same; d++) same = s->shape[d] == t->shape[d];
    if (!same) {
        char a[96], b[96], why[256];
        shape_why(plan, t, why, sizeof why);
        return cp_errf(err, errlen, "%s: tensor \"%s\" has shape %s but the spec %s expects %s (%s): %s", file, name,
                       fmt_shape(s->ndim, s->shape, a, sizeof a), plan->spec.path,
                       fmt_shape(t->ndim, t->shape, b, sizeof b), why, shape_hint);
    }
    int64_t n = hf_elems(t);
    float *dst = to;
    if (t->perm != CP_HF_PLAIN) {
        *tmp = cp_xrealloc(*tmp, (size_t)n * sizeof **tmp);
        dst = *tmp;
    }
    char e2[CP_ERR_MAX];
    if (cp_st_read_f32(st, s, 0, n, dst, e2, sizeof e2)) return cp_errf(err, errlen, "%s", e2);
    for (int64_t i = 0; i < n; i++) {
        if (isfinite(dst[i]) && !(nonneg && dst[i] < 0)) continue;
        char what[48];
        if (isnan(dst[i])) snprintf(what, sizeof what, "NaN");
        else if (isinf(dst[i])) snprintf(what, sizeof what, "infinite");
        else snprintf(what, sizeof what, "%g (it must be >= 0)", (double)dst[i]);
        return cp_errf(err, errlen, "%s: tensor \"%s\" element %lld is %s: %s", file, name, (long long)i, what,
                       value_hint);
    }
    if (t->perm != CP_HF_PLAIN) place(plan, order, t, *tmp, to);
    return 0;
}

/* The checkpoint's names against the spec's: a tensor the spec has no place for is an error that says which key
 * of the spec to change. */
static int check_names(const cp_plan *plan, const cp_st_set *st, const cp_hf_tensor *tt, int nt, char *err,
                       int errlen) {
    const cp_model *m = &plan->spec.model;
    int rc = 0;
    for (int k = 0; k < st->ntensors && !rc; k++) {
        const char *name = st->tensors[k].name;
        bool known = ignorable(name) || (m->tie_embeddings && !strcmp(name, "lm_head.weight"));
        for (int j = 0; j < nt && !known; j++) known = !strcmp(tt[j].name, name);
        if (known) continue;
        int layer;
        char rest[128];
        const char *file = st->files[st->tensors[k].file].path;
        if (sscanf(name, "model.layers.%d.%127s", &layer, rest) == 2 && layer >= m->layers)
            rc = cp_errf(err, errlen,
                      "%s: the checkpoint has layer %d (\"%s\") but the spec %s has model.layers = %lld: "
                      "set model.layers to the checkpoint's num_hidden_layers",
                      file, layer, name, plan->spec.path, (long long)m->layers);
        else if (strstr(name, "q_norm") || strstr(name, "k_norm"))
            rc = cp_errf(err, errlen,
                      "%s: the checkpoint has \"%s\" (q/k norms, a Qwen3 model) but the spec %s has "
                      "model.qk_norm = false: use family = \"qwen3\"",
                      file, name, plan->spec.path);
        else
            rc = cp_errf(err, errlen,
                      "%s: unexpected tensor \"%s\": the checkpoint is not a %s model of the shape in "
                      "%s (cpgen maps model.embed_tokens, model.layers.N.{self_attn,mlp}.*, the layer norms, "
                      "model.norm and lm_head)",
                      file, name, cp_family_name(m->family), plan->spec.path);
    }
    return rc;
}

/* The message for a tensor the spec needs and the checkpoint lacks. */
static int missing(const cp_plan *plan, const char *path, const cp_hf_tensor *t, char *err, int errlen) {
    const cp_model *m = &plan->spec.model;
    if (!strcmp(t->name, "lm_head.weight"))
        return cp_errf(err, errlen,
                       "%s: the checkpoint has no lm_head.weight: its LM head is tied to the embedding; set "
                       "model.tie_embeddings = true in %s", path, plan->spec.path);
    if (strstr(t->name, "q_norm") || strstr(t->name, "k_norm"))
        return cp_errf(err, errlen,
                       "%s: the checkpoint has no \"%s\": it has no q/k norms (not a Qwen3 model); use family = "
                       "\"llama\" in %s", path, t->name, plan->spec.path);
    return cp_errf(err, errlen, "%s: the checkpoint has no tensor \"%s\", which the spec %s needs: is it a %s "
                   "checkpoint?", path, t->name, plan->spec.path, cp_family_name(m->family));
}

/* A tied spec: an lm_head.weight in the file must be the embedding (emb, vocab x hidden). */
static int check_tied(const cp_plan *plan, const cp_st_set *st, const float *emb, float **tmp, char *err,
                      int errlen) {
    const cp_model *m = &plan->spec.model;
    const cp_st_tensor *lm = m->tie_embeddings ? cp_st_find(st, "lm_head.weight") : NULL;
    if (!lm) return 0;
    int64_t n = m->vocab * m->hidden;
    bool same = lm->ndim == 2 && lm->shape[0] == m->vocab && lm->shape[1] == m->hidden;
    if (same) {
        char e2[CP_ERR_MAX];
        *tmp = cp_xrealloc(*tmp, (size_t)n * sizeof **tmp);
        if (cp_st_read_f32(st, lm, 0, n, *tmp, e2, sizeof e2))
            return cp_errf(err, errlen, "loading Hugging Face weights: %s", e2);
        for (int64_t i = 0; i < n && same; i++) same = memcmp(&(*tmp)[i], &emb[i], sizeof(float)) == 0;
    }
    if (same) return 0;
    return cp_errf(err, errlen,
                   "%s: the checkpoint has an lm_head.weight different from its embedding, but the spec %s has "
                   "model.tie_embeddings = true: set it to false", st->files[lm->file].path, plan->spec.path);
}

/* A buffer of the largest unit, for reading a model unit by unit: allocated once at its final size, since a buffer
 * grown unit by unit is copied when it moves, which held the old unit beside the new one (the plan's host_load
 * counts one unit beside the shard). */
static float *unit_buffer(const cp_plan *plan) {
    int64_t most = 1;
    for (int u = 0; u < plan->nunits; u++) most = CP_MAX(most, plan->unit_padded[u]);
    return cp_xmalloc((size_t)most * sizeof(float));
}

/* One tensor of a unit being loaded: t's values (in the model's order) into dst; tmp is a scratch buffer the
 * reader may grow. Returns 0, or -1 with a message. */
typedef int (*load_tensor_fn)(void *ctx, const int *order, const cp_hf_tensor *t, float *dst, float **tmp,
                              char *err, int errlen);

/* The walk both loaders share: the whole flat model into `model`, or (model NULL) rank's shard into `shard`, unit by
 * unit so that no more than the largest unit is held beside the shard; each tensor through `each`, and `after_unit`
 * (or NULL) on a unit once its tensors are in. On failure the output is zeroed. */
static int load_units(const cp_plan *plan, int rank, float *model, float *shard, load_tensor_fn each,
                      int (*after_unit)(void *ctx, int u, const float *unit, float **tmp, char *err, int errlen),
                      void *ctx, char *err, int errlen) {
    cp_hf_tensor *tt;
    int *order;
    int nt = tensor_table(plan, &tt, &order);
    float *tmp = NULL, *unit = model ? NULL : unit_buffer(plan);
    int rc = 0;
    for (int u = 0; u < plan->nunits && !rc; u++) {
        int64_t base = cp_weights_unit_off(plan, u);
        float *dst = model ? model + base : unit;
        memset(dst, 0, (size_t)plan->unit_padded[u] * sizeof *dst);
        for (int j = 0; j < nt && !rc; j++)
            if (tt[j].unit == u) rc = each(ctx, order, &tt[j], dst + (tt[j].off - base), &tmp, err, errlen);
        if (!rc && after_unit) rc = after_unit(ctx, u, dst, &tmp, err, errlen);
        if (!rc && !model) keep_part(plan, rank, u, unit, shard);
    }
    free(unit);
    free(tmp);
    free(order);
    free(tt);
    if (rc && model) memset(model, 0, (size_t)cp_weights_elems(plan) * sizeof *model);
    if (rc && shard) memset(shard, 0, (size_t)plan->params_shard * sizeof *shard);
    return rc;
}

typedef struct {
    const cp_plan *plan;
    const cp_st_set *st;
    const char *path;   /* load_hf: the path given, for messages */
    const char *prefix; /* load_prefixed: the prefix of every tensor's name */
    bool nonneg;
} load_ctx;

static int hf_tensor(void *vctx, const int *order, const cp_hf_tensor *t, float *dst, float **tmp, char *err,
                     int errlen) {
    const load_ctx *c = vctx;
    const cp_st_tensor *s = cp_st_find(c->st, t->name);
    if (!s) return missing(c->plan, c->path, t, err, errlen);
    char e2[CP_ERR_MAX];
    if (read_tensor(c->plan, order, t, c->st, s, t->name, false,
                    "the spec does not describe this checkpoint; compare its config.json",
                    "the checkpoint is damaged (or diverged when it was trained)", tmp, dst, e2, sizeof e2))
        return cp_errf(err, errlen, "loading Hugging Face weights: %s", e2);
    return 0;
}

static int hf_after_unit(void *vctx, int u, const float *unit, float **tmp, char *err, int errlen) {
    const load_ctx *c = vctx;
    return u == 0 ? check_tied(c->plan, c->st, unit, tmp, err, errlen) : 0; /* the embedding is unit 0 */
}

/* Hugging Face weights at path: the whole flat model into `model`, or (model NULL) rank's shard into `shard`. */
static int load_hf(const cp_plan *plan, const char *path, int rank, float *model, float *shard, char *err,
                   int errlen) {
    cp_st_set st;
    char e2[CP_ERR_MAX];
    if (cp_st_open(path, &st, e2, sizeof e2)) return cp_errf(err, errlen, "loading Hugging Face weights: %s", e2);
    cp_hf_tensor *tt;
    int *order;
    int nt = tensor_table(plan, &tt, &order);
    int rc = check_names(plan, &st, tt, nt, err, errlen);
    free(order);
    free(tt);
    load_ctx c = {.plan = plan, .st = &st, .path = path};
    if (!rc) rc = load_units(plan, rank, model, shard, hf_tensor, hf_after_unit, &c, err, errlen);
    else if (model) memset(model, 0, (size_t)cp_weights_elems(plan) * sizeof *model);
    else memset(shard, 0, (size_t)plan->params_shard * sizeof *shard);
    cp_st_close(&st);
    return rc;
}

int cp_weights_load_hf(const cp_plan *plan, const char *path, float *out, char *err, int errlen) {
    return load_hf(plan, path, 0, out, NULL, err, errlen);
}

int cp_weights_load_hf_shard(const cp_plan *plan, const char *path, int rank, float *shard, char *err, int errlen) {
    return load_hf(plan, path, rank, NULL, shard, err, errlen);
}

/* ------------------------------------------------------------------------------------------------------------
 * save */

typedef struct {
    const cp_plan *plan;
    const cp_hf_tensor *t;
    const float *model;
    const int *inv; /* inv[model head] = stored position */
} fill_ctx;

/* HF-order elements [first, first + n) of a permuted tensor, from the flat model. */
static void fill_perm(const void *vctx, int64_t first, int64_t n, float *dst) {
    const fill_ctx *c = vctx;
    const cp_hf_tensor *t = c->t;
    const float *src = c->model + t->off;
    int64_t cols = t->shape[1], hd = c->plan->spec.model.head_dim;
    for (int64_t e = first; e < first + n;) {
        int64_t row = e / cols, col = e % cols, run = CP_MIN(cols - col, first + n - e);
        if (t->perm == CP_HF_Q_ROWS) {
            int64_t srow = c->inv[row / hd] * hd + row % hd;
            memcpy(dst + (e - first), src + srow * cols + col, (size_t)run * sizeof(float));
        } else { /* O columns: head blocks within the row */
            for (int64_t k = 0; k < run;) {
                int64_t cc = col + k, h = cc / hd, in = cc % hd, len = CP_MIN(hd - in, run - k);
                memcpy(dst + (e - first) + k, src + row * cols + c->inv[h] * hd + in, (size_t)len * sizeof(float));
                k += len;
            }
        }
        e += run;
    }
}

char *cp_weights_hf_config(const cp_plan *plan, bool bf16, char *err, int errlen) {
    const cp_model *m = &plan->spec.model;
    if (family_check(m, err, errlen)) return NULL;
    bool qwen = m->family == CP_FAMILY_QWEN3;
    int64_t maxpos = plan->spec.train.seq_len;
    if (m->rope_scaling.enabled)
        maxpos = CP_MAX(maxpos, (int64_t)(m->rope_scaling.factor * (double)m->rope_scaling.original_max));
    cp_str s = {0};
    cp_str_printf(&s, "{\n  \"architectures\": [\"%s\"],\n  \"model_type\": \"%s\",\n",
                  qwen ? "Qwen3ForCausalLM" : "LlamaForCausalLM", qwen ? "qwen3" : "llama");
    cp_str_printf(&s, "  \"vocab_size\": %lld,\n  \"hidden_size\": %lld,\n  \"intermediate_size\": %lld,\n",
                  (long long)m->vocab, (long long)m->hidden, (long long)m->ffn);
    cp_str_printf(&s,
                  "  \"num_hidden_layers\": %lld,\n  \"num_attention_heads\": %lld,\n  \"num_key_value_heads\": "
                  "%lld,\n  \"head_dim\": %lld,\n",
                  (long long)m->layers, (long long)m->heads, (long long)m->kv_heads, (long long)m->head_dim);
    cp_str_printf(&s, "  \"hidden_act\": \"silu\",\n  \"attention_bias\": false,\n  \"attention_dropout\": 0.0,\n");
    if (!qwen)
        cp_str_printf(&s, "  \"mlp_bias\": false,\n  \"pretraining_tp\": 1,\n");
    else
        cp_str_printf(&s, "  \"use_sliding_window\": false,\n  \"sliding_window\": null,\n");
    cp_str_printf(&s, "  \"max_position_embeddings\": %lld,\n  \"rms_norm_eps\": ", (long long)maxpos);
    cp_json_put_number(&s, m->norm_eps);
    cp_str_printf(&s, ",\n  \"rope_theta\": ");
    cp_json_put_number(&s, m->rope_theta);
    cp_str_printf(&s, ",\n  \"rope_scaling\": ");
    if (m->rope_scaling.enabled) {
        cp_str_printf(&s, "{\n    \"rope_type\": \"llama3\",\n    \"factor\": ");
        cp_json_put_number(&s, m->rope_scaling.factor);
        cp_str_printf(&s, ",\n    \"low_freq_factor\": ");
        cp_json_put_number(&s, m->rope_scaling.low_freq);
        cp_str_printf(&s, ",\n    \"high_freq_factor\": ");
        cp_json_put_number(&s, m->rope_scaling.high_freq);
        cp_str_printf(&s, ",\n    \"original_max_position_embeddings\": %lld\n  }",
                      (long long)m->rope_scaling.original_max);
    } else {
        cp_str_printf(&s, "null");
    }
    cp_str_printf(&s,
                  ",\n  \"tie_word_embeddings\": %s,\n  \"initializer_range\": ", m->tie_embeddings ? "true" : "false");
    cp_json_put_number(&s, plan->spec.init.std);
    cp_str_printf(&s,
                  ",\n  \"use_cache\": true,\n  \"torch_dtype\": \"%s\",\n  \"dtype\": \"%s\",\n"
                  "  \"cpgen_version\": \"%s\"\n}\n",
                  bf16 ? "bfloat16" : "float32", bf16 ? "bfloat16" : "float32", CP_VERSION);
    return s.data;
}

int cp_weights_save_hf(const cp_plan *plan, const float *model, const char *dir, bool bf16, int64_t shard_bytes,
                       char *err, int errlen) {
    const cp_model *m = &plan->spec.model;
    char *config = cp_weights_hf_config(plan, bf16, err, errlen);
    if (!config) return -1;
    cp_hf_tensor *tt;
    int *order, *inv = cp_xmalloc((size_t)m->heads * sizeof *inv);
    int nt = tensor_table(plan, &tt, &order);
    for (int p = 0; p < m->heads; p++) inv[order[p]] = p;
    cp_st_out *outs = cp_xcalloc((size_t)nt, sizeof *outs);
    fill_ctx *ctx = cp_xcalloc((size_t)nt, sizeof *ctx);
    for (int j = 0; j < nt; j++) {
        cp_st_out *o = &outs[j];
        o->name = tt[j].name;
        o->dtype = bf16 ? CP_ST_BF16 : CP_ST_F32;
        o->ndim = tt[j].ndim;
        o->shape[0] = tt[j].shape[0];
        o->shape[1] = tt[j].shape[1];
        if (tt[j].perm == CP_HF_PLAIN) {
            o->f32 = model + tt[j].off;
        } else {
            ctx[j] = (fill_ctx){.plan = plan, .t = &tt[j], .model = model, .inv = inv};
            o->fill = fill_perm;
            o->ctx = &ctx[j];
        }
    }
    char e2[CP_ERR_MAX];
    int rc = 0;
    if (cp_st_write(dir, outs, nt, shard_bytes, e2, sizeof e2))
        rc = cp_errf(err, errlen, "saving Hugging Face weights to %s: %s", dir, e2);
    if (!rc) {
        size_t n = strlen(dir) + 16;
        char *p = cp_xmalloc(n);
        snprintf(p, n, "%s/config.json", dir);
        if (cp_write_file_atomic(p, config, strlen(config)) != 0)
            rc = cp_errf(err, errlen, "%s: writing failed: %s", p, strerror(errno));
        free(p);
    }
    free(ctx);
    free(outs);
    free(inv);
    free(order);
    free(tt);
    free(config);
    return rc;
}

/* ------------------------------------------------------------------------------------------------------------
 * other model-shaped arrays (AdamW's moments) */

int cp_weights_save_prefixed(const cp_plan *plan, const char *path, int narrays, const char *const *prefix,
                             const float *const *flat, char *err, int errlen) {
    const cp_model *m = &plan->spec.model;
    cp_hf_tensor *tt;
    int *order, *inv = cp_xmalloc((size_t)m->heads * sizeof *inv);
    int nt = tensor_table(plan, &tt, &order);
    for (int p = 0; p < m->heads; p++) inv[order[p]] = p;
    int n = nt * narrays;
    cp_st_out *outs = cp_xcalloc((size_t)n, sizeof *outs);
    fill_ctx *ctx = cp_xcalloc((size_t)n, sizeof *ctx);
    char (*names)[160] = cp_xcalloc((size_t)n, sizeof *names);
    /* array by array, so each array's tensors are contiguous in the file, in checkpoint order */
    for (int a = 0; a < narrays; a++)
        for (int j = 0; j < nt; j++) {
            int k = a * nt + j;
            cp_st_out *o = &outs[k];
            snprintf(names[k], sizeof names[k], "%s%s", prefix[a], tt[j].name);
            o->name = names[k];
            o->dtype = CP_ST_F32;
            o->ndim = tt[j].ndim;
            o->shape[0] = tt[j].shape[0];
            o->shape[1] = tt[j].shape[1];
            if (tt[j].perm == CP_HF_PLAIN) {
                o->f32 = flat[a] + tt[j].off;
            } else {
                ctx[k] = (fill_ctx){.plan = plan, .t = &tt[j], .model = flat[a], .inv = inv};
                o->fill = fill_perm;
                o->ctx = &ctx[k];
            }
        }
    char e2[CP_ERR_MAX];
    int rc = 0;
    if (cp_st_write_file(path, outs, n, e2, sizeof e2)) rc = cp_errf(err, errlen, "saving %s: %s", path, e2);
    free(names);
    free(ctx);
    free(outs);
    free(inv);
    free(order);
    free(tt);
    return rc;
}

static int prefixed_tensor(void *vctx, const int *order, const cp_hf_tensor *t, float *dst, float **tmp, char *err,
                           int errlen) {
    const load_ctx *c = vctx;
    char name[160];
    snprintf(name, sizeof name, "%s%s", c->prefix, t->name);
    const cp_st_tensor *s = cp_st_find(c->st, name);
    if (!s)
        return cp_errf(err, errlen, "%s: no tensor \"%s\", which the spec %s needs: the file is incomplete or "
                       "belongs to another model", c->st->where, name, c->plan->spec.path);
    /* widening BF16 would resume, but not exactly: refuse what cpgen never writes */
    if (s->dtype != CP_ST_F32)
        return cp_errf(err, errlen, "%s: tensor \"%s\" is %s, not F32: only fp32 state continues a run exactly; the "
                       "file was not written by cpgen", c->st->files[s->file].path, name, cp_st_dtype_name(s->dtype));
    return read_tensor(c->plan, order, t, c->st, s, name, c->nonneg, "the file belongs to a model of another shape",
                       "the file is damaged", tmp, dst, err, errlen);
}

/* One prefixed array of a checkpoint's file: the whole flat model into `model`, or (model NULL) rank's shard. */
static int load_prefixed(const cp_plan *plan, const cp_st_set *st, const char *prefix, bool nonneg, int rank,
                         float *model, float *shard, char *err, int errlen) {
    load_ctx c = {.plan = plan, .st = st, .prefix = prefix, .nonneg = nonneg};
    return load_units(plan, rank, model, shard, prefixed_tensor, NULL, &c, err, errlen);
}

int cp_weights_load_prefixed(const cp_plan *plan, const cp_st_set *st, const char *prefix, bool nonneg, float *out,
                             char *err, int errlen) {
    return load_prefixed(plan, st, prefix, nonneg, 0, out, NULL, err, errlen);
}

int cp_weights_load_prefixed_shard(const cp_plan *plan, const cp_st_set *st, const char *prefix, bool nonneg, int rank,
                                   float *shard, char *err, int errlen) {
    return load_prefixed(plan, st, prefix, nonneg, rank, NULL, shard, err, errlen);
}

/* ------------------------------------------------------------------------------------------------------------
 * random init */

#define GOLDEN 0x9e3779b97f4a7c15ULL

/* Elements [first, first + n) of the normal(0, std) stream `key` (see weights.h). */
static void normal_fill(uint64_t key, int64_t first, int64_t n, double std, float *dst) {
    const double two_pi = 6.283185307179586476925286766559;
    for (int64_t e = first; e < first + n;) {
        uint64_t j = (uint64_t)e / 2;
        uint64_t a = cp_mix64(key + (2 * j) * GOLDEN) >> 11, b = cp_mix64(key + (2 * j + 1) * GOLDEN) >> 11;
        double u1 = (double)(a + 1) * 0x1p-53, u2 = (double)b * 0x1p-53, r = sqrt(-2.0 * log(u1));
        if (e % 2 == 0) {
            dst[e - first] = (float)(std * r * cos(two_pi * u2));
            e++;
            if (e < first + n) dst[e - first] = (float)(std * r * sin(two_pi * u2));
            e++;
        } else {
            dst[e - first] = (float)(std * r * sin(two_pi * u2));
            e++;
        }
    }
}

typedef struct {
    uint64_t key;
    int64_t first, n;
    double std;
    float *dst;
} fill_job;

static void *fill_thread(void *arg) {
    fill_job *j = arg;
    normal_fill(j->key, j->first, j->n, j->std, j->dst);
    return NULL;
}

/* normal_fill over all cores: every element is a function of (key, index), so the split does not change a bit. */
static void normal_fill_parallel(uint64_t key, int64_t first, int64_t n, double std, float *dst) {
    enum { MAX_THREADS = 64, MIN_CHUNK = 1 << 20 };
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int nt = (int)CP_MIN(CP_MIN(cores < 1 ? 1 : cores, MAX_THREADS), (n + MIN_CHUNK - 1) / MIN_CHUNK);
    if (nt <= 1) {
        normal_fill(key, first, n, std, dst);
        return;
    }
    fill_job jobs[MAX_THREADS];
    pthread_t th[MAX_THREADS];
    int64_t chunk = ((n + nt - 1) / nt + 1) & ~(int64_t)1; /* even: from an even first, no pair is split */
    int started = 0;
    for (int i = 0; i < nt; i++) {
        int64_t at = i * chunk, len = CP_MIN(chunk, n - at);
        if (len <= 0) break;
        jobs[i] = (fill_job){key, first + at, len, std, dst + at};
        if (pthread_create(&th[i], NULL, fill_thread, &jobs[i]) != 0) {
            fill_thread(&jobs[i]); /* no thread to be had: do this part here */
            th[i] = pthread_self();
        }
        started = i + 1;
    }
    for (int i = 0; i < started; i++)
        if (!pthread_equal(th[i], pthread_self())) pthread_join(th[i], NULL);
}

/* Unit u of the random init into dst (plan->unit_padded[u] elements, padding zero), exact in unit elements
 * [lo, hi): tensors stored as Hugging Face lays them out are drawn only there (a rank draws its shard, not the
 * model), permuted ones whole; tmp: scratch for permuted tensors, grown as needed. */
static void init_unit(const cp_plan *plan, const cp_hf_tensor *tt, int nt, const int *order, uint64_t seed,
                      double std, int u, int64_t lo, int64_t hi, float *dst, float **tmp) {
    memset(dst, 0, (size_t)plan->unit_padded[u] * sizeof *dst);
    int64_t base = cp_weights_unit_off(plan, u);
    for (int j = 0; j < nt; j++) {
        const cp_hf_tensor *t = &tt[j];
        if (t->unit != u) continue;
        int64_t n = hf_elems(t);
        float *to = dst + (t->off - base);
        if (t->norm) {
            for (int64_t i = 0; i < n; i++) to[i] = 1.0f;
            continue;
        }
        uint64_t key = cp_mix64(seed ^ cp_mix64(cp_hash64(t->name, strlen(t->name), CP_HASH_SEED)));
        if (t->perm == CP_HF_PLAIN) {
            int64_t a = CP_MAX(lo - (t->off - base), 0), b = CP_MIN(hi - (t->off - base), n);
            if (a < b) normal_fill_parallel(key, a, b - a, std, to + a);
        } else {
            *tmp = cp_xrealloc(*tmp, (size_t)n * sizeof **tmp);
            normal_fill_parallel(key, 0, n, std, *tmp);
            place(plan, order, t, *tmp, to);
        }
    }
}

/* Units [first unit..] of the random init, each into where(u) (full model or a unit buffer then a shard). */
static void init_random(const cp_plan *plan, int rank, uint64_t seed, double std, float *model, float *shard) {
    cp_hf_tensor *tt;
    int *order;
    int nt = tensor_table(plan, &tt, &order);
    float *tmp = NULL, *unit = model ? NULL : unit_buffer(plan);
    for (int u = 0; u < plan->nunits; u++) {
        if (model) {
            init_unit(plan, tt, nt, order, seed, std, u, 0, plan->unit_padded[u], model + cp_weights_unit_off(plan, u),
                      &tmp);
            continue;
        }
        /* one unit at a time, then this rank's part of it: no more than the largest unit in memory */
        int64_t part = plan->unit_padded[u] / plan->C;
        init_unit(plan, tt, nt, order, seed, std, u, (int64_t)rank * part, (int64_t)(rank + 1) * part, unit, &tmp);
        keep_part(plan, rank, u, unit, shard);
    }
    free(unit);
    free(tmp);
    free(order);
    free(tt);
}

void cp_weights_init_random(const cp_plan *plan, uint64_t seed, double std, float *model) {
    init_random(plan, 0, seed, std, model, NULL);
}

void cp_weights_init_random_shard(const cp_plan *plan, int rank, uint64_t seed, double std, float *shard) {
    init_random(plan, rank, seed, std, NULL, shard);
}

/* checkpoint.c: training checkpoints (see checkpoint.h): trainer_state.json in and out, the atomic folder write,
 * and opening a checkpoint to resume with every check made before anything is loaded. */
#include "checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "json.h"
#include "util.h"
#include "weights.h"

/* ------------------------------------------------------------------------------------------------------------
 * the state */

uint64_t cp_ckpt_shape_hash(const cp_model *m) {
    /* a canonical text, not the struct's bytes: padding and field order must not change the hash */
    char s[512];
    int n = snprintf(s, sizeof s,
                     "family=%s;vocab=%lld;hidden=%lld;layers=%lld;heads=%lld;kv_heads=%lld;head_dim=%lld;ffn=%lld;"
                     "tie_embeddings=%d;qk_norm=%d",
                     cp_family_name(m->family), (long long)m->vocab, (long long)m->hidden, (long long)m->layers,
                     (long long)m->heads, (long long)m->kv_heads, (long long)m->head_dim, (long long)m->ffn,
                     (int)m->tie_embeddings, (int)m->qk_norm);
    return cp_mix64(cp_hash64(s, (size_t)n, CP_HASH_SEED));
}

void cp_ckpt_state_init(const cp_plan *plan, cp_ckpt_state *st) {
    const cp_spec *sp = &plan->spec;
    memset(st, 0, sizeof *st);
    st->format = CP_CKPT_FORMAT;
    snprintf(st->version, sizeof st->version, "%s", CP_VERSION);
    snprintf(st->spec, sizeof st->spec, "%s", sp->name);
    const cp_model *m = &sp->model;
    st->model = (cp_model){.family = m->family, .vocab = m->vocab, .hidden = m->hidden, .layers = m->layers,
                           .heads = m->heads, .kv_heads = m->kv_heads, .head_dim = m->head_dim, .ffn = m->ffn,
                           .tie_embeddings = m->tie_embeddings, .qk_norm = m->qk_norm};
    st->shape_hash = cp_ckpt_shape_hash(&st->model);
    snprintf(st->data_source, sizeof st->data_source, "%s", sp->data.source);
    st->data_seed = sp->init.seed;
    st->seqs_per_step = (int64_t)plan->replicas * sp->train.micro_batches;
    st->train = sp->train;
    st->last_loss = NAN;
    st->layout = (cp_ckpt_layout){.known = true, .gpus = plan->C, .ring = plan->ring, .replicas = plan->replicas,
                                  .ranks_per_gpu = cp_plan_ranks_per_gpu(plan), .upipe_heads = plan->U,
                                  .optimizer_host = plan->opt_on_host, .offload_layers = plan->ckpt_host_layers,
                                  .checkpoint_every = plan->ckpt_every, .attn_host_layers = plan->attn_host_layers,
                                  .attn_gpu_layers = plan->attn_gpu_layers};
}

static void put_key(cp_str *s, const char *indent, const char *key) {
    cp_str_printf(s, ",\n%s", indent);
    cp_json_put_string(s, key);
    cp_str_append(s, ": ", 2);
}

char *cp_ckpt_state_json(const cp_ckpt_state *st) {
    cp_str s = {0};
    const cp_model *m = &st->model;
    cp_str_printf(&s, "{\n  \"format\": %d", st->format);
    put_key(&s, "  ", "cpgen_version");
    cp_json_put_string(&s, st->version);
    put_key(&s, "  ", "spec");
    cp_json_put_string(&s, st->spec);
    put_key(&s, "  ", "model_shape_hash");
    cp_str_printf(&s, "\"%016llx\"", (unsigned long long)st->shape_hash);
    put_key(&s, "  ", "model");
    cp_str_printf(&s, "{\"family\": ");
    cp_json_put_string(&s, cp_family_name(m->family));
    cp_str_printf(&s,
                  ", \"vocab\": %lld, \"hidden\": %lld, \"layers\": %lld, \"heads\": %lld, \"kv_heads\": %lld, "
                  "\"head_dim\": %lld, \"ffn\": %lld, \"tie_embeddings\": %s, \"qk_norm\": %s}",
                  (long long)m->vocab, (long long)m->hidden, (long long)m->layers, (long long)m->heads,
                  (long long)m->kv_heads, (long long)m->head_dim, (long long)m->ffn,
                  m->tie_embeddings ? "true" : "false", m->qk_norm ? "true" : "false");
    put_key(&s, "  ", "step");
    cp_str_printf(&s, "%d", st->step);
    put_key(&s, "  ", "optimizer_updates");
    cp_str_printf(&s, "%d", st->updates);
    put_key(&s, "  ", "skipped_steps");
    cp_str_printf(&s, "%d", st->skipped);
    put_key(&s, "  ", "last_loss");
    cp_json_put_number(&s, st->last_loss); /* shortest text that reads back to the same double; null if not finite */
    put_key(&s, "  ", "data");
    cp_str_printf(&s, "{\"source\": ");
    cp_json_put_string(&s, st->data_source);
    cp_str_printf(&s, ", \"sequence\": %lld, \"epoch\": %lld, \"shard\": %lld, \"offset\": %lld",
                  (long long)st->data.sequence, (long long)st->data.epoch, (long long)st->data.shard,
                  (long long)st->data.offset);
    if (st->seqs_per_step > 0) cp_str_printf(&s, ", \"sequences_per_step\": %lld", (long long)st->seqs_per_step);
    cp_str_printf(&s, "}");
    put_key(&s, "  ", "rng");
    /* a string: JSON readers differ on integers above 2^53 */
    cp_str_printf(&s, "{\"data_seed\": \"%llu\"}", (unsigned long long)st->data_seed);
    const cp_train *t = &st->train;
    put_key(&s, "  ", "train");
    cp_str_printf(&s, "{\"steps\": %d, \"micro_batches\": %d, \"seq_len\": %lld, \"warmup\": %d", t->steps,
                  t->micro_batches, (long long)t->seq_len, t->warmup);
    const struct {
        const char *k;
        double v;
    } nums[] = {{"lr", t->lr},       {"min_lr", t->min_lr}, {"beta1", t->beta1}, {"beta2", t->beta2},
                {"eps", t->eps},     {"weight_decay", t->weight_decay}, {"clip", t->clip}};
    for (size_t i = 0; i < CP_ARRAY_LEN(nums); i++) {
        cp_str_printf(&s, ", \"%s\": ", nums[i].k);
        cp_json_put_number(&s, nums[i].v);
    }
    cp_str_printf(&s, "}");
    const cp_ckpt_layout *l = &st->layout;
    if (l->known) {
        put_key(&s, "  ", "layout");
        cp_str_printf(&s,
                      "{\"gpus\": %d, \"ring\": %d, \"replicas\": %d, \"ranks_per_gpu\": %d, \"upipe_heads\": %d, "
                      "\"optimizer\": \"%s\", \"offload_layers\": %d, \"checkpoint_every\": %d, "
                      "\"attention_output_host_layers\": %d, \"attention_output_gpu_layers\": %d}",
                      l->gpus, l->ring, l->replicas, l->ranks_per_gpu, l->upipe_heads, l->optimizer_host ? "host" : "gpu",
                      l->offload_layers, l->checkpoint_every, l->attn_host_layers, l->attn_gpu_layers);
    }
    cp_str_printf(&s, "\n}\n");
    return s.data;
}

/* ---- parsing: every key present with its type, or a message naming it */

typedef struct {
    const char *where;
    char *err;
    int errlen;
} pctx;

static const cp_json *member(pctx *c, const cp_json *obj, const char *parent, const char *key, cp_json_type type,
                             bool null_ok) {
    char full[96];
    snprintf(full, sizeof full, "%s%s%s", parent ? parent : "", parent ? "." : "", key);
    const cp_json *v = cp_json_get(obj, key);
    if (!v) {
        cp_errf(c->err, c->errlen, "%s: \"%s\" is missing: the file is damaged or not a cpgen trainer state",
                c->where, full);
        return NULL;
    }
    if (v->type == type || (null_ok && v->type == CP_JSON_NULL)) return v;
    cp_errf(c->err, c->errlen, "%s: \"%s\" is %s, expected %s: the file is damaged", c->where, full,
            cp_json_type_name(v->type), cp_json_type_name(type));
    return NULL;
}

static int get_i64(pctx *c, const cp_json *obj, const char *parent, const char *key, int64_t lo, int64_t hi,
                   int64_t *out) {
    const cp_json *v = member(c, obj, parent, key, CP_JSON_NUMBER, false);
    if (!v) return -1;
    if (!v->is_int || v->integer < lo || v->integer > hi)
        return cp_errf(c->err, c->errlen, "%s: \"%s%s%s\" = %.17g: expected an integer in [%lld, %lld]", c->where,
                       parent ? parent : "", parent ? "." : "", key, v->number, (long long)lo, (long long)hi);
    *out = v->integer;
    return 0;
}

static int get_int(pctx *c, const cp_json *obj, const char *parent, const char *key, int *out) {
    int64_t x = 0; /* set when get_i64 succeeds; some inlinings do not see it */
    if (get_i64(c, obj, parent, key, 0, INT32_MAX, &x)) return -1;
    *out = (int)x;
    return 0;
}

static int get_num(pctx *c, const cp_json *obj, const char *parent, const char *key, bool null_ok, double *out) {
    const cp_json *v = member(c, obj, parent, key, CP_JSON_NUMBER, null_ok);
    if (!v) return -1;
    *out = v->type == CP_JSON_NULL ? NAN : v->number;
    return 0;
}

static int get_str(pctx *c, const cp_json *obj, const char *parent, const char *key, char *out, size_t n) {
    const cp_json *v = member(c, obj, parent, key, CP_JSON_STRING, false);
    if (!v) return -1;
    if (v->len >= n)
        return cp_errf(c->err, c->errlen, "%s: \"%s%s%s\" is %zu bytes long, at most %zu fit", c->where,
                       parent ? parent : "", parent ? "." : "", key, v->len, n - 1);
    memcpy(out, v->string, v->len + 1);
    return 0;
}

static int get_bool(pctx *c, const cp_json *obj, const char *parent, const char *key, bool *out) {
    const cp_json *v = member(c, obj, parent, key, CP_JSON_BOOL, false);
    if (!v) return -1;
    *out = v->boolean;
    return 0;
}

static int parse_u64(pctx *c, const char *key, const char *s, int base, uint64_t *out) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, base);
    if (!*s || *end || errno || s[0] == '-')
        return cp_errf(c->err, c->errlen, "%s: \"%s\" = \"%s\" is not a %s number: the file is damaged", c->where,
                       key, s, base == 16 ? "hexadecimal" : "decimal");
    *out = v;
    return 0;
}

static int parse_state(pctx *c, const cp_json *root, cp_ckpt_state *st) {
    if (root->type != CP_JSON_OBJECT)
        return cp_errf(c->err, c->errlen, "%s: the top level is %s, expected an object", c->where,
                       cp_json_type_name(root->type));
    /* the format first: a newer format may have other keys, and that message is the useful one */
    if (get_int(c, root, NULL, "format", &st->format)) return -1;
    if (st->format != CP_CKPT_FORMAT)
        return cp_errf(c->err, c->errlen,
                       "%s: checkpoint format %d, but this cpgen (%s) reads format %d: resume with the cpgen "
                       "version that wrote it", c->where, st->format, CP_VERSION, CP_CKPT_FORMAT);
    char hex[32], fam[32], seed[32];
    if (get_str(c, root, NULL, "cpgen_version", st->version, sizeof st->version) ||
        get_str(c, root, NULL, "spec", st->spec, sizeof st->spec) ||
        get_str(c, root, NULL, "model_shape_hash", hex, sizeof hex) ||
        parse_u64(c, "model_shape_hash", hex, 16, &st->shape_hash))
        return -1;
    const cp_json *m = member(c, root, NULL, "model", CP_JSON_OBJECT, false);
    if (!m || get_str(c, m, "model", "family", fam, sizeof fam)) return -1;
    if (!strcmp(fam, cp_family_name(CP_FAMILY_LLAMA))) st->model.family = CP_FAMILY_LLAMA;
    else if (!strcmp(fam, cp_family_name(CP_FAMILY_QWEN3))) st->model.family = CP_FAMILY_QWEN3;
    else return cp_errf(c->err, c->errlen, "%s: \"model.family\" = \"%s\" is not a family cpgen knows", c->where, fam);
    cp_model *md = &st->model;
    if (get_i64(c, m, "model", "vocab", 1, INT64_MAX, &md->vocab) ||
        get_i64(c, m, "model", "hidden", 1, INT64_MAX, &md->hidden) ||
        get_i64(c, m, "model", "layers", 1, INT64_MAX, &md->layers) ||
        get_i64(c, m, "model", "heads", 1, INT64_MAX, &md->heads) ||
        get_i64(c, m, "model", "kv_heads", 1, INT64_MAX, &md->kv_heads) ||
        get_i64(c, m, "model", "head_dim", 1, INT64_MAX, &md->head_dim) ||
        get_i64(c, m, "model", "ffn", 1, INT64_MAX, &md->ffn) ||
        get_bool(c, m, "model", "tie_embeddings", &md->tie_embeddings) ||
        get_bool(c, m, "model", "qk_norm", &md->qk_norm))
        return -1;
    if (get_int(c, root, NULL, "step", &st->step) || get_int(c, root, NULL, "optimizer_updates", &st->updates) ||
        get_int(c, root, NULL, "skipped_steps", &st->skipped) ||
        get_num(c, root, NULL, "last_loss", true, &st->last_loss))
        return -1;
    const cp_json *d = member(c, root, NULL, "data", CP_JSON_OBJECT, false);
    if (!d || get_str(c, d, "data", "source", st->data_source, sizeof st->data_source) ||
        get_i64(c, d, "data", "sequence", 0, INT64_MAX, &st->data.sequence) ||
        get_i64(c, d, "data", "epoch", 0, INT64_MAX, &st->data.epoch) ||
        get_i64(c, d, "data", "shard", 0, INT64_MAX, &st->data.shard) ||
        get_i64(c, d, "data", "offset", 0, INT64_MAX, &st->data.offset))
        return -1;
    /* written since the layout may change on resume; a checkpoint of an older cpgen lacks it */
    if (cp_json_get(d, "sequences_per_step") &&
        get_i64(c, d, "data", "sequences_per_step", 1, INT32_MAX, &st->seqs_per_step))
        return -1;
    const cp_json *r = member(c, root, NULL, "rng", CP_JSON_OBJECT, false);
    if (!r || get_str(c, r, "rng", "data_seed", seed, sizeof seed) ||
        parse_u64(c, "rng.data_seed", seed, 10, &st->data_seed))
        return -1;
    const cp_json *t = member(c, root, NULL, "train", CP_JSON_OBJECT, false);
    cp_train *tr = &st->train;
    if (!t || get_int(c, t, "train", "steps", &tr->steps) ||
        get_int(c, t, "train", "micro_batches", &tr->micro_batches) ||
        get_i64(c, t, "train", "seq_len", 1, INT64_MAX, &tr->seq_len) || get_int(c, t, "train", "warmup", &tr->warmup) ||
        get_num(c, t, "train", "lr", false, &tr->lr) || get_num(c, t, "train", "min_lr", false, &tr->min_lr) ||
        get_num(c, t, "train", "beta1", false, &tr->beta1) || get_num(c, t, "train", "beta2", false, &tr->beta2) ||
        get_num(c, t, "train", "eps", false, &tr->eps) ||
        get_num(c, t, "train", "weight_decay", false, &tr->weight_decay) ||
        get_num(c, t, "train", "clip", false, &tr->clip))
        return -1;
    const cp_json *l = cp_json_get(root, "layout"); /* likewise */
    if (!l) return 0;
    cp_ckpt_layout *ly = &st->layout;
    char opt[16];
    if (!member(c, root, NULL, "layout", CP_JSON_OBJECT, false) || get_int(c, l, "layout", "gpus", &ly->gpus) ||
        get_int(c, l, "layout", "ring", &ly->ring) || get_int(c, l, "layout", "replicas", &ly->replicas) ||
        get_int(c, l, "layout", "ranks_per_gpu", &ly->ranks_per_gpu) ||
        get_int(c, l, "layout", "upipe_heads", &ly->upipe_heads) ||
        get_str(c, l, "layout", "optimizer", opt, sizeof opt) ||
        get_int(c, l, "layout", "offload_layers", &ly->offload_layers) ||
        get_int(c, l, "layout", "checkpoint_every", &ly->checkpoint_every) ||
        get_int(c, l, "layout", "attention_output_host_layers", &ly->attn_host_layers) ||
        get_int(c, l, "layout", "attention_output_gpu_layers", &ly->attn_gpu_layers))
        return -1;
    if (strcmp(opt, "host") && strcmp(opt, "gpu"))
        return cp_errf(c->err, c->errlen, "%s: \"layout.optimizer\" = \"%s\": expected \"gpu\" or \"host\": the file is "
                       "damaged", c->where, opt);
    if (ly->gpus < 1 || ly->ring < 1 || ly->replicas < 1 || ly->ranks_per_gpu < 1 || ly->upipe_heads < 1)
        return cp_errf(c->err, c->errlen, "%s: \"layout\" has a count below 1: the file is damaged", c->where);
    ly->optimizer_host = !strcmp(opt, "host");
    ly->known = true;
    return 0;
}

int cp_ckpt_state_parse(const char *text, size_t len, const char *where, cp_ckpt_state *st, char *err, int errlen) {
    memset(st, 0, sizeof *st);
    cp_json root;
    char e2[CP_ERR_MAX];
    if (cp_json_parse(text, len, &root, e2, sizeof e2))
        return cp_errf(err, errlen, "%s: not valid JSON (%s): the file is damaged", where, e2);
    pctx c = {.where = where, .err = err, .errlen = errlen};
    int rc = parse_state(&c, &root, st);
    cp_json_free(&root);
    return rc;
}

/* ------------------------------------------------------------------------------------------------------------
 * writing */

static void fsync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        (void)fsync(fd);
        close(fd);
    }
}

static bool is_dir(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

/* A name a save writes into a checkpoint folder, or a temporary one of those ("<name>.tmp.<pid>[.XXXXXX]"). */
static bool ckpt_file_name(const char *n) {
    static const char *const names[] = {CP_CKPT_STATE_NAME, CP_CKPT_OPTIM_NAME, CP_ST_SINGLE_NAME, CP_ST_INDEX_NAME,
                                        "config.json"};
    char base[256];
    snprintf(base, sizeof base, "%s", n);
    char *tmp = strstr(base, ".tmp.");
    if (tmp) *tmp = 0;
    for (size_t i = 0; i < CP_ARRAY_LEN(names); i++)
        if (!strcmp(base, names[i])) return true;
    int a, b, used = 0;
    return sscanf(base, "model-%5d-of-%5d.safetensors%n", &a, &b, &used) == 2 && !base[used];
}

int cp_ckpt_dir_is_ours(const char *dir, bool complete, char *why, size_t whylen) {
    DIR *d = opendir(dir);
    if (!d) {
        snprintf(why, whylen, "it cannot be listed (%s)", strerror(errno));
        return -1;
    }
    int rc = 0;
    struct dirent *e;
    while (!rc && (e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char p[CP_PATH_MAX + 300];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        struct stat st;
        if (!ckpt_file_name(e->d_name) || lstat(p, &st) != 0 || !S_ISREG(st.st_mode)) {
            snprintf(why, whylen, "it holds %s, which a checkpoint does not", e->d_name);
            rc = -1;
        }
    }
    closedir(d);
    if (rc || !complete) return rc;
    char p[CP_PATH_MAX + 64], e2[256];
    snprintf(p, sizeof p, "%s/%s", dir, CP_CKPT_STATE_NAME);
    size_t len;
    char *text = cp_read_file_as(p, CP_FILE_STATE, &len, e2, sizeof e2);
    if (!text) {
        snprintf(why, whylen, "its %s cannot be read (%s)", CP_CKPT_STATE_NAME, e2);
        return -1;
    }
    cp_ckpt_state st;
    char e3[CP_ERR_MAX];
    rc = cp_ckpt_state_parse(text, len, p, &st, e3, sizeof e3);
    free(text);
    if (rc) snprintf(why, whylen, "%.400s", e3);
    return rc;
}

/* Remove ckpt_<n>.tmp.<pid> folders in out_dir whose process is gone: what a crash during a save left. A live
 * process's folder (another run writing into the same out_dir, or this one), and one holding anything a save does
 * not write, are left alone. */
static void remove_dead_tmp(const char *out_dir) {
    DIR *d = opendir(out_dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        long long step;
        long pid;
        int used = 0;
        if (sscanf(e->d_name, "ckpt_%lld.tmp.%ld%n", &step, &pid, &used) != 2 || e->d_name[used] || pid <= 0) continue;
        if (pid == (long)getpid() || kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue;
        char p[CP_PATH_MAX + 300], why[CP_ERR_MAX];
        snprintf(p, sizeof p, "%s/%s", out_dir, e->d_name);
        if (!cp_ckpt_dir_is_ours(p, false, why, sizeof why)) cp_remove_tree(p);
    }
    closedir(d);
}

/* Put the finished tmp folder in place of final. An existing final folder is swapped out in one step
 * (RENAME_EXCHANGE), so readers see the old or the new checkpoint, never neither; filesystems without the exchange
 * get two renames. */
static int install(const char *tmp, const char *final, char *err, int errlen) {
    struct stat sb;
    if (lstat(final, &sb) != 0) {
        if (rename(tmp, final) != 0)
            return cp_errf(err, errlen, "renaming %s to %s failed: %s", tmp, final, strerror(errno));
        return 0;
    }
    char why[CP_ERR_MAX];
    if (!S_ISDIR(sb.st_mode) || cp_ckpt_dir_is_ours(final, true, why, sizeof why))
        return cp_errf(err, errlen, "%s exists and is not a checkpoint cpgen saved%s%s: cpgen replaces only its own; "
                       "move it away and save again", final, S_ISDIR(sb.st_mode) ? ": " : "",
                       S_ISDIR(sb.st_mode) ? why : "");
    if (renameat2(AT_FDCWD, tmp, AT_FDCWD, final, RENAME_EXCHANGE) == 0) {
        cp_remove_tree(tmp); /* now the old checkpoint */
        return 0;
    }
    if (errno != EINVAL && errno != ENOSYS)
        return cp_errf(err, errlen, "replacing %s with %s failed: %s", final, tmp, strerror(errno));
    char old[CP_PATH_MAX + 128];
    snprintf(old, sizeof old, "%s.old.%ld", final, (long)getpid());
    if (lstat(old, &sb) == 0) /* not removed: cpgen did not leave it (it removes its own below) */
        return cp_errf(err, errlen, "%s is in the way of replacing %s: move it away and save again", old, final);
    if (rename(final, old) != 0)
        return cp_errf(err, errlen, "moving the old %s aside failed: %s", final, strerror(errno));
    if (rename(tmp, final) != 0) {
        int e = errno;
        (void)rename(old, final);
        return cp_errf(err, errlen, "renaming %s to %s failed: %s", tmp, final, strerror(e));
    }
    cp_remove_tree(old);
    return 0;
}

int cp_ckpt_write(const cp_plan *P, const char *out_dir, const cp_ckpt_state *st, const float *master,
                  const float *m, const float *v, cp_ckpt_hook hook, void *hook_ctx, char *path, size_t pathlen,
                  char *err, int errlen) {
    char final[CP_PATH_MAX + 64], tmp[CP_PATH_MAX + 96], file[CP_PATH_MAX + 160];
    snprintf(final, sizeof final, "%s/ckpt_%d", out_dir, st->step);
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", final, (long)getpid());
    if (cp_mkdir_p(out_dir) != 0)
        return cp_errf(err, errlen, "%s: cannot create the folder: %s; set train.out_dir to a folder you can write",
                       out_dir, strerror(errno));
    remove_dead_tmp(out_dir);
    cp_remove_tree(tmp); /* this process's own leftover of an earlier failed save of the same step */
    if (mkdir(tmp, 0755) != 0) return cp_errf(err, errlen, "%s: cannot create the folder: %s", tmp, strerror(errno));
    int rc = 0;
    bool stopped = false;
    /* each file is itself written under a temporary name, synced and renamed within tmp */
    if (cp_weights_save_hf(P, master, tmp, false, 0, err, errlen)) rc = -1;
    if (!rc && hook && hook(hook_ctx, tmp, CP_ST_SINGLE_NAME)) stopped = true;
    if (!rc && !stopped) {
        snprintf(file, sizeof file, "%s/%s", tmp, CP_CKPT_OPTIM_NAME);
        const char *prefix[2] = {CP_CKPT_M_PREFIX, CP_CKPT_V_PREFIX};
        const float *arrays[2] = {m, v};
        if (cp_weights_save_prefixed(P, file, 2, prefix, arrays, err, errlen)) rc = -1;
        if (!rc && hook && hook(hook_ctx, tmp, CP_CKPT_OPTIM_NAME)) stopped = true;
    }
    /* trainer_state.json last: a folder that has it has everything */
    if (!rc && !stopped) {
        snprintf(file, sizeof file, "%s/%s", tmp, CP_CKPT_STATE_NAME);
        char *json = cp_ckpt_state_json(st);
        if (cp_write_file_atomic(file, json, strlen(json)) != 0)
            rc = cp_errf(err, errlen, "%s: writing failed: %s%s", file, strerror(errno),
                         errno == ENOSPC ? " (the disk is full: free space or set train.out_dir elsewhere)" : "");
        free(json);
        if (!rc && hook && hook(hook_ctx, tmp, CP_CKPT_STATE_NAME)) stopped = true;
    }
    if (stopped) return cp_errf(err, errlen, "saving %s: stopped after a piece, as a crash would", final);
    if (!rc) {
        fsync_dir(tmp);
        rc = install(tmp, final, err, errlen);
    }
    if (rc) {
        cp_remove_tree(tmp);
        return -1;
    }
    fsync_dir(out_dir);
    if (hook && hook(hook_ctx, final, CP_CKPT_LATEST_NAME))
        return cp_errf(err, errlen, "saving %s: stopped before `latest` names it, as a crash would", final);
    /* `latest` names the folder relative to out_dir, so out_dir can be moved */
    snprintf(file, sizeof file, "%s/%s", out_dir, CP_CKPT_LATEST_NAME);
    char name[64];
    int n = snprintf(name, sizeof name, "ckpt_%d\n", st->step);
    char e2[CP_ERR_MAX];
    if (cp_may_replace(file, cp_ckpt_latest_is_ours, NULL, "a `latest` file cpgen wrote", "move it away", e2,
                       sizeof e2))
        return cp_errf(err, errlen, "%s (the checkpoint %s itself is complete)", e2, final);
    if (cp_write_file_atomic(file, name, (size_t)n) != 0)
        return cp_errf(err, errlen, "%s: writing failed: %s (the checkpoint %s itself is complete)", file,
                       strerror(errno), final);
    fsync_dir(out_dir);
    if (path) snprintf(path, pathlen, "%s", final);
    return 0;
}

bool cp_ckpt_latest_is_ours(const char *head, size_t n, const void *ctx) {
    (void)ctx;
    size_t i = 5;
    if (n < 6 || memcmp(head, "ckpt_", 5)) return false;
    while (i < n && head[i] >= '0' && head[i] <= '9') i++;
    return i > 5 && (i == n || (i + 1 == n && head[i] == '\n'));
}

/* ------------------------------------------------------------------------------------------------------------
 * opening */

/* dir is a checkpoint (it has trainer_state.json), or an out_dir whose `latest` names one. */
static int resolve(const char *dir, char *out, size_t n, char *err, int errlen) {
    char p[CP_PATH_MAX + 64];
    struct stat sb;
    if (stat(dir, &sb) != 0)
        return cp_errf(err, errlen, "--resume %s: %s; give a checkpoint folder (ckpt_<step>) or the out_dir that "
                       "holds them", dir, strerror(errno));
    if (!S_ISDIR(sb.st_mode))
        return cp_errf(err, errlen, "--resume %s: not a folder; give a checkpoint folder (ckpt_<step>) or the out_dir "
                       "that holds them", dir);
    /* a save's temporary folder is never a checkpoint, even with every file in it: its save did not finish (the
     * folder was not synced and renamed; a writer killed just before that leaves one) */
    const char *base = strrchr(dir, '/') ? strrchr(dir, '/') + 1 : dir;
    long long tstep, tpid;
    int used = 0;
    if (sscanf(base, "ckpt_%lld.tmp.%lld%n", &tstep, &tpid, &used) == 2 && (!base[used] || base[used] == '/'))
        return cp_errf(err, errlen, "--resume %s: an incomplete checkpoint (a save that did not finish: its folder "
                       "was never renamed to ckpt_%lld): resume from an earlier ckpt_<step>", dir, tstep);
    snprintf(p, sizeof p, "%s/%s", dir, CP_CKPT_STATE_NAME);
    if (stat(p, &sb) == 0) {
        snprintf(out, n, "%s", dir);
        return 0;
    }
    snprintf(p, sizeof p, "%s/%s", dir, CP_CKPT_LATEST_NAME);
    size_t len;
    char why[256];
    char *text = cp_read_file_as(p, CP_FILE_STATE, &len, why, sizeof why);
    if (!text && errno != ENOENT)
        return cp_errf(err, errlen, "--resume %s: %s cannot be read (%s): it should name the newest checkpoint folder; "
                       "resume from a ckpt_<step> folder directly", dir, p, why);
    if (!text) {
        if (strstr(dir, ".tmp."))
            return cp_errf(err, errlen, "--resume %s: an incomplete checkpoint (a save that did not finish; it has no "
                           "%s, which is written last): resume from an earlier ckpt_<step>", dir, CP_CKPT_STATE_NAME);
        return cp_errf(err, errlen, "--resume %s: neither a checkpoint (no %s) nor an out_dir with a `%s` file; a "
                       "checkpoint folder is <out_dir>/ckpt_<step>, written when train.save_every > 0",
                       dir, CP_CKPT_STATE_NAME, CP_CKPT_LATEST_NAME);
    }
    while (len > 0 && (text[len - 1] == '\n' || text[len - 1] == '\r' || text[len - 1] == ' ')) text[--len] = 0;
    bool ok = len > 0 && !strchr(text, '/') && strcmp(text, ".") && strcmp(text, "..") && strlen(text) == len;
    if (!ok) {
        free(text);
        return cp_errf(err, errlen, "%s: expected the name of a checkpoint folder (\"ckpt_<step>\"), found something "
                       "else: the file is damaged; resume from a ckpt_<step> folder directly", p);
    }
    snprintf(out, n, "%s/%s", dir, text);
    snprintf(p, sizeof p, "%s/%s", out, CP_CKPT_STATE_NAME);
    int rc = 0;
    if (stat(p, &sb) != 0)
        rc = cp_errf(err, errlen, "%s/%s names %s, which %s: resume from another ckpt_<step> folder in %s", dir,
                     CP_CKPT_LATEST_NAME, text, is_dir(out) ? "is incomplete (no " CP_CKPT_STATE_NAME ")" : "is missing",
                     dir);
    free(text);
    return rc;
}

static const char *model_field_diff(const cp_model *a, const cp_model *b, char *buf, size_t n) {
    size_t at = 0;
    buf[0] = 0;
#define DIFF_INT(f)                                                                                            \
    if (a->f != b->f && at < n)                                                                                \
        at += (size_t)snprintf(buf + at, n - at, "%smodel." #f " = %lld in the checkpoint, %lld in the spec", \
                               at ? "; " : "", (long long)a->f, (long long)b->f);
    if (a->family != b->family && at < n)
        at += (size_t)snprintf(buf + at, n - at, "%smodel.family = \"%s\" in the checkpoint, \"%s\" in the spec",
                               at ? "; " : "", cp_family_name(a->family), cp_family_name(b->family));
    DIFF_INT(vocab)
    DIFF_INT(hidden)
    DIFF_INT(layers)
    DIFF_INT(heads)
    DIFF_INT(kv_heads)
    DIFF_INT(head_dim)
    DIFF_INT(ffn)
#undef DIFF_INT
    if (a->tie_embeddings != b->tie_embeddings && at < n)
        at += (size_t)snprintf(buf + at, n - at, "%smodel.tie_embeddings = %s in the checkpoint, %s in the spec",
                               at ? "; " : "", a->tie_embeddings ? "true" : "false", b->tie_embeddings ? "true" : "false");
    if (a->qk_norm != b->qk_norm && at < n)
        snprintf(buf + at, n - at, "%smodel.qk_norm = %s in the checkpoint, %s in the spec", at ? "; " : "",
                 a->qk_norm ? "true" : "false", b->qk_norm ? "true" : "false");
    return buf;
}

/* The state against the plan. */
static int check_state(const cp_plan *P, const cp_ckpt_state *st, const char *where, char *err, int errlen) {
    const cp_spec *sp = &P->spec;
    if (st->shape_hash != cp_ckpt_shape_hash(&st->model))
        return cp_errf(err, errlen, "%s: model_shape_hash does not match the model fields beside it: the file was "
                       "edited or damaged; resume from another checkpoint", where);
    cp_ckpt_state mine;
    cp_ckpt_state_init(P, &mine);
    if (st->shape_hash != mine.shape_hash) {
        char diff[1024];
        model_field_diff(&st->model, &mine.model, diff, sizeof diff);
        return cp_errf(err, errlen, "%s: the checkpoint is of another model than the spec %s (shape hash %016llx, the "
                       "spec's %016llx): %s; resume with the spec it was trained with (\"%s\"), or start a new run from "
                       "its weights with init = { from = \"hf\", path = \"<the checkpoint folder>\" }",
                       where, sp->path, (unsigned long long)st->shape_hash, (unsigned long long)mine.shape_hash, diff,
                       st->spec);
    }
    if ((int64_t)st->updates + st->skipped != st->step)
        return cp_errf(err, errlen, "%s: step %d is not optimizer_updates %d + skipped_steps %d: the file is "
                       "damaged; resume from another checkpoint", where, st->step, st->updates, st->skipped);
    if (st->step >= sp->train.steps)
        return cp_errf(err, errlen, "%s: the checkpoint is at step %d and train.steps is %d: nothing is left to "
                       "train; raise it (--set train.steps=N) to continue", where, st->step, sp->train.steps);
    return 0;
}

/* An open safetensors set holds exactly the plan's tensors under each prefix, F32, of the plan's shapes. */
static int check_set(const cp_plan *P, const cp_st_set *st, int nprefix, const char *const *prefix, char *err,
                     int errlen) {
    int nt = cp_weights_hf_tensors(P, NULL, 0);
    cp_hf_tensor *tt = cp_xmalloc((size_t)nt * sizeof *tt);
    cp_weights_hf_tensors(P, tt, nt);
    int rc = 0, found = 0;
    char name[160];
    for (int a = 0; a < nprefix && !rc; a++)
        for (int j = 0; j < nt && !rc; j++) {
            snprintf(name, sizeof name, "%s%s", prefix[a], tt[j].name);
            const cp_st_tensor *s = cp_st_find(st, name);
            if (!s) {
                rc = cp_errf(err, errlen, "%s: no tensor \"%s\": the checkpoint is incomplete or of another model; "
                             "resume from another checkpoint", st->where, name);
                break;
            }
            found++;
            bool same = s->ndim == tt[j].ndim;
            for (int d = 0; d < tt[j].ndim && same; d++) same = s->shape[d] == tt[j].shape[d];
            if (!same)
                rc = cp_errf(err, errlen, "%s: tensor \"%s\" has another shape than the spec %s gives it: the "
                             "checkpoint is of another model", st->files[s->file].path, name, P->spec.path);
            else if (s->dtype != CP_ST_F32)
                rc = cp_errf(err, errlen, "%s: tensor \"%s\" is %s, not F32: a cpgen training checkpoint keeps fp32 so "
                             "the run continues exactly, and this one was not written by cpgen%s",
                             st->files[s->file].path, name, cp_st_dtype_name(s->dtype),
                             prefix[a][0] ? "" : "; to start from these weights use init = { from = \"hf\" } instead");
        }
    if (!rc && found != st->ntensors)
        for (int k = 0; k < st->ntensors && !rc; k++) {
            bool known = false;
            for (int a = 0; a < nprefix && !known; a++) {
                size_t pl = strlen(prefix[a]);
                if (strncmp(st->tensors[k].name, prefix[a], pl)) continue;
                for (int j = 0; j < nt && !known; j++) known = !strcmp(st->tensors[k].name + pl, tt[j].name);
            }
            if (!known)
                rc = cp_errf(err, errlen, "%s: unexpected tensor \"%s\": the checkpoint is of another model (more "
                             "layers?) than the spec %s", st->files[st->tensors[k].file].path, st->tensors[k].name,
                             P->spec.path);
        }
    free(tt);
    return rc;
}

int cp_ckpt_open(const cp_plan *P, const char *dir, cp_ckpt *ck, char *err, int errlen) {
    memset(ck, 0, sizeof *ck);
    if (resolve(dir, ck->dir, sizeof ck->dir, err, errlen)) return -1;
    char p[CP_PATH_MAX + 64];
    snprintf(p, sizeof p, "%s/%s", ck->dir, CP_CKPT_STATE_NAME);
    size_t len;
    char why[256];
    char *text = cp_read_file_as(p, CP_FILE_STATE, &len, why, sizeof why);
    if (!text)
        return cp_errf(err, errlen, "%s: cannot read: %s; the checkpoint is damaged: resume from another ckpt_<step> "
                       "folder", p, why);
    int rc = cp_ckpt_state_parse(text, len, p, &ck->state, err, errlen);
    free(text);
    if (!rc) rc = check_state(P, &ck->state, p, err, errlen);
    char e2[CP_ERR_MAX];
    if (!rc) {
        /* the weights: the index of shards, else model.safetensors; named, not the folder, which would fall back
         * to optimizer.safetensors when model.safetensors is missing */
        snprintf(ck->weights, sizeof ck->weights, "%s/%s", ck->dir, CP_ST_INDEX_NAME);
        struct stat sb;
        if (stat(ck->weights, &sb) != 0) snprintf(ck->weights, sizeof ck->weights, "%s/%s", ck->dir, CP_ST_SINGLE_NAME);
        cp_st_set w;
        if (cp_st_open(ck->weights, &w, e2, sizeof e2)) {
            rc = cp_errf(err, errlen, "the checkpoint's weights: %s; the checkpoint is damaged or incomplete: resume "
                         "from another ckpt_<step> folder", e2);
        } else {
            const char *none[1] = {""};
            rc = check_set(P, &w, 1, none, err, errlen);
            cp_st_close(&w);
        }
    }
    if (!rc) {
        snprintf(p, sizeof p, "%s/%s", ck->dir, CP_CKPT_OPTIM_NAME);
        const char *prefix[2] = {CP_CKPT_M_PREFIX, CP_CKPT_V_PREFIX};
        if (cp_st_open(p, &ck->optim, e2, sizeof e2))
            rc = cp_errf(err, errlen, "the checkpoint's optimizer state: %s; the checkpoint is damaged or incomplete: "
                         "resume from another ckpt_<step> folder", e2);
        else
            rc = check_set(P, &ck->optim, 2, prefix, err, errlen);
    }
    if (rc) cp_ckpt_close(ck);
    return rc;
}

int cp_ckpt_load_weights(const cp_plan *P, const cp_ckpt *ck, float *flat, char *err, int errlen) {
    return cp_weights_load_hf(P, ck->weights, flat, err, errlen);
}

int cp_ckpt_load_moment(const cp_plan *P, const cp_ckpt *ck, bool second, float *flat, char *err, int errlen) {
    return cp_weights_load_prefixed(P, &ck->optim, second ? CP_CKPT_V_PREFIX : CP_CKPT_M_PREFIX, second, flat, err,
                                    errlen);
}

int cp_ckpt_load_weights_shard(const cp_plan *P, const cp_ckpt *ck, int rank, float *shard, char *err, int errlen) {
    return cp_weights_load_hf_shard(P, ck->weights, rank, shard, err, errlen);
}

int cp_ckpt_load_moment_shard(const cp_plan *P, const cp_ckpt *ck, bool second, int rank, float *shard, char *err,
                              int errlen) {
    return cp_weights_load_prefixed_shard(P, &ck->optim, second ? CP_CKPT_V_PREFIX : CP_CKPT_M_PREFIX, second, rank,
                                          shard, err, errlen);
}

void cp_ckpt_close(cp_ckpt *ck) {
    if (!ck) return;
    cp_st_close(&ck->optim);
}

/* The shortest text that reads back to v: two values that differ never print alike. */
static const char *exact(double v, char *buf, size_t n) {
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, n, "%.*g", prec, v);
        if (strtod(buf, NULL) == v) break;
    }
    return buf;
}

int cp_ckpt_notes(const cp_plan *P, const cp_ckpt_state *st, FILE *out) {
    const cp_train *a = &st->train, *b = &P->spec.train;
    int n = 0;
    const struct {
        const char *key;
        double ckpt, spec;
    } f[] = {{"steps", a->steps, b->steps},
             {"warmup", a->warmup, b->warmup},
             {"lr", a->lr, b->lr},
             {"min_lr", a->min_lr, b->min_lr},
             {"beta1", a->beta1, b->beta1},
             {"beta2", a->beta2, b->beta2},
             {"eps", a->eps, b->eps},
             {"weight_decay", a->weight_decay, b->weight_decay},
             {"clip", a->clip, b->clip}};
    for (size_t i = 0; i < CP_ARRAY_LEN(f); i++) {
        if (f[i].ckpt == f[i].spec) continue;
        n++;
        char a1[32], a2[32];
        if (out)
            fprintf(out, "note: train.%s is %s, the checkpoint ran with %s: the run continues, but its losses "
                         "are not those the checkpoint's run would have had\n", f[i].key,
                    exact(f[i].spec, a1, sizeof a1), exact(f[i].ckpt, a2, sizeof a2));
    }
    return n;
}

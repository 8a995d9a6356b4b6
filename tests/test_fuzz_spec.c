/* test_fuzz_spec.c: a spec fuzzer. From a fixed seed it draws mutations of the shipped specs, tests/specs_ok and the
 * bad-spec corpus (wrong types, out-of-range and huge numbers, odd lengths and sizes, unknown and deleted keys, bad
 * --set strings, broken Lua text, Lua errors, tampered bytecode, endless loops in Lua and inside library calls, and
 * memory bombs) and loads each as `cpgen plan` does: the spec, then the plan. Each case runs in its own process, so
 * a crash or a hang is seen, not suffered: it must end within the spec time limit with exit 0 (the plan built) or 2
 * (one line naming the case's file and a key or a Lua location). A few cases also run through build/cpgen itself.
 * Prints its counts of cases and outcomes. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "plan.h"
#include "source_tree.h"
#include "spec.h"
#include "tmpdir.h"
#include "util.h"

#define SEED 0x5eedf022u
#define TIME_LIMIT_S 2.0 /* the spec time limit while fuzzing, shorter than cpgen's so endless loops cost little */
/* on top of it: start-up and plan building, and under AddressSanitizer the memory bombs' slow 1 GiB */
#ifdef __SANITIZE_ADDRESS__
#define SLACK_S 10.0
#else
#define SLACK_S 3.0
#endif
#define MAX_SETS 4

typedef enum { K_VALUE, K_DELETE, K_UNKNOWN, K_SECTION, K_TEXT, K_SET, K_LUA, K_LOOP, K_KIND_COUNT } case_kind;
static const char *kind_names[K_KIND_COUNT] = {"wrong or odd value", "deleted key", "unknown key", "odd section",
                                               "mutated text",       "bad --set",   "Lua error", "endless loop"};

typedef enum { O_PLANNED, O_SPEC_ERROR, O_PLAN_ERROR, O_BAD_MESSAGE, O_CRASH, O_TIMEOUT, O_COUNT } outcome;
static const char *outcome_names[O_COUNT] = {"planned (exit 0)", "spec refused (exit 2)", "plan refused (exit 2)",
                                             "BAD MESSAGE",      "CRASH",                 "TIMEOUT"};

typedef struct {
    case_kind kind;
    char path[PATH_MAX + 32];
    char sets[MAX_SETS][320];
    int nsets;
} fuzz_case;

/* Every key path a spec may hold; a refusal must name one of them (or a Lua location). */
static const char *const KEYS[] = {
    "model.family", "model.vocab", "model.hidden", "model.layers", "model.heads", "model.kv_heads", "model.head_dim",
    "model.ffn", "model.norm_eps", "model.tie_embeddings", "model.qk_norm", "model.rope.theta",
    "model.rope.scaling.factor", "model.rope.scaling.low_freq", "model.rope.scaling.high_freq",
    "model.rope.scaling.original_max", "parallel.gpus", "parallel.upipe_heads", "parallel.checkpoint",
    "parallel.checkpoint_every", "parallel.offload", "parallel.optimizer", "parallel.mlp_tile", "parallel.loss_tile",
    "train.seq_len", "train.micro_batches", "train.steps", "train.lr", "train.min_lr", "train.warmup",
    "train.weight_decay", "train.clip", "train.beta1", "train.beta2", "train.eps", "train.log_every",
    "train.save_every", "train.keep_checkpoints", "train.async_save", "train.out_dir", "data.source", "init.from", "init.path", "init.seed", "init.std",
    "machine.gpu_mem", "machine.host_mem", "machine.reserve", "machine.comm_reserve", "machine.host_reserve",
    "machine.host_runtime", "machine.peak_tflops", "machine.gemm_tflops", "machine.attn_fwd_tflops", "machine.attn_bwd_tflops", "machine.hbm_gbps", "machine.host_gbps",
    "machine.a2a_gbps", "machine.allgather_gbps"};
static const char *const SECTIONS[] = {"model", "parallel", "train", "data", "init", "machine", "model.rope",
                                       "model.rope.scaling"};

/* Lua expressions: wrong types, edge and huge numbers, odd lengths and sizes. */
static const char *const VALUES[] = {
    "0", "-1", "1", "2", "3", "7", "12", "1000001", "1e30", "-1e30", "2^53", "2^63", "math.huge", "-math.huge",
    "0/0", "0.5", "-0.0", "math.maxinteger", "math.mininteger", "\"0K\"", "\"-1M\"", "\"1e30\"", "\"\"",
    "\"auto\"", "\"1Q\"", "\"128K\"", "\"5M\"", "\"80G\"", "\"0G\"", "\"99999999999T\"", "\"1.5M\"", "\" 4K\"",
    "\"0x10\"", "\"8E\"", "\"-0\"", "\"9223372036854775807\"", "\"18446744073709551616K\"", "true", "false",
    "{}", "{1, 2}", "function() end", "string.rep('x', 5000)", "'a\\0b'", "'llama'", "'none'", "'host'",
    "'synthetic:copy'", "'tokens:'", "'hf'", "setmetatable({}, {__index = function() error('boom') end})"};
static const char *const BASES[] = {"cpgen.load('tiny')",    "cpgen.load('llama1b')", "cpgen.load('llama3b')",
                                    "cpgen.load('llama8b')", "cpgen.load('qwen32b')", "dofile('@OK@/child.lua')",
                                    "dofile('@OK@/computed.lua')"};

/* Set strings that are wrong in form or value, on a spec that is fine. */
static const char *const BAD_SETS[] = {
    "=", "=1", "train.seq_len", "train.seq_len=", "train..seq_len=1K", ".train.seq_len=1K", "train.seq_len.=1K",
    "train.seq_len=0K", "train.seq_len=-1M", "train.seq_len=1e30", "train.seq_len=1K=2", "train.seq_len= 1K",
    "model=1", "model.rope.scaling.factor.x=1", "model.vocab.x=1", "trian.seq_len=1K", "train.seqlen=1K",
    "machine.gpu_mem=1e30", "machine.gpu_mem=-80G", "machine.gpu_mem=80", "machine.host_mem=0x10",
    "parallel.gpus=0", "parallel.gpus=-8", "parallel.gpus=4097", "parallel.gpus=1.5", "parallel.gpus=inf",
    "parallel.gpus=nan", "parallel.gpus=true", "parallel.upipe_heads=0", "parallel.upipe_heads=99999999999999",
    "parallel.mlp_tile=1Q", "train.lr=nan", "train.lr=-inf", "train.lr=0x1p99999", "train.steps=9e99",
    "train.out_dir=", "data.source=tokens:", "init.seed=-1", "model.rope.scaling=false",
    "model.rope.scaling=true", "model.family=", "model.heads=1e3", "parallel.checkpoint_every=auto",
    "model.rope.scaling.factor=8", "@LONG@"};

/* Whole programs: Lua errors, endless loops, memory bombs; @SPEC@ is a spec that loads. */
static const struct {
    case_kind kind;
    const char *text;
} PROGRAMS[] = {
    {K_LUA, "error()"},
    {K_LUA, "error(nil)"},
    {K_LUA, "error({})"},
    {K_LUA, "error(setmetatable({}, {__tostring = function() return 'x' end}))"},
    {K_LUA, "error('line one\\nline two')"},
    {K_LUA, "local function f() return f() + 1 end return f()"},
    {K_LUA, "local t = setmetatable({}, {__index = function(t, k) return t[k] end}) return t.x"},
    {K_LUA, "return nil"},
    {K_LUA, "return 1, 2"},
    {K_LUA, "return function() end"},
    {K_LUA, "return setmetatable(@SPEC@, {__index = function() error('meta') end})"},
    {K_LUA, "local s = @SPEC@ s.model = setmetatable({}, {__index = s.model}) return s"},
    {K_LUA, "local s = @SPEC@ setmetatable(s.train, {__pairs = function() error('pairs') end}) return s"},
    {K_LUA, "local s = @SPEC@ s.model.self = s.model return s"},
    {K_LUA, "local s = @SPEC@ s.model.rope = s return s"},
    {K_LUA, "local t = {} t.t = t return cpgen.extend(t, t)"},
    {K_LUA, "return cpgen.extend()"},
    {K_LUA, "return cpgen.extend(1)"},
    {K_LUA, "return cpgen.load()"},
    {K_LUA, "return cpgen.load('no_such_spec')"},
    {K_LUA, "return cpgen.load(string.rep('x', 4000))"},
    {K_LUA, "return dofile()"},
    {K_LUA, "return dofile('/')"},
    {K_LUA, "return dofile('/dev/null')"},
    {K_LUA, "return dofile(string.rep('../', 2000) .. 'x.lua')"},
    {K_LUA, "return require('os')"},
    {K_LUA, "return io.open('x')"},
    {K_LUA, "return load('return 1')()"},
    {K_LUA, "return string.rep('x', 1 << 40)"},
    {K_LUA, "return string.rep('x', -1)"},
    {K_LUA, "local s = @SPEC@ setmetatable(s, {__gc = function() error('gc') end}) return s"},
    {K_LUA, "print(setmetatable({}, {__tostring = function() return 1 end})) return @SPEC@"},
    {K_LUA, "\xef\xbb\xbfreturn @SPEC@"},
    {K_LUA, "\x1bLua"},
    /* string.dump's output tampered byte by byte and loaded as bytecode: the known way out of a Lua sandbox */
    {K_LUA, "local d = string.dump(function(a) local t = {a, 2, 3} return t[1] + #t + a.x end) "
            "for i = 20, #d do for _, k in ipairs({1, 0x55, 0x80, 0xff}) do "
            "local g = load(d:sub(1, i - 1) .. string.char((d:byte(i) + k) % 256) .. d:sub(i + 1), 'x', 'b') "
            "if g then pcall(g, {x = 1}) end end end return @SPEC@"},
    {K_LUA, ""},
    {K_LOOP, "while true do end"},
    {K_LOOP, "repeat local x = 1 until false"},
    {K_LOOP, "local function f() return f() end return f()"},
    {K_LOOP, "local s = @SPEC@ setmetatable(s, {__gc = function() while true do end end}) return s"},
    /* memory bombs grow by copies of a string made once: string.rep of one byte is a byte loop, slow under ASan */
    {K_LOOP, "local s = string.rep('x', 1 << 20) local t = {} while true do t[#t + 1] = s .. #t end"},
    {K_LOOP, "local s = string.rep('x', 1 << 16) local t = {} for i = 1, 1e12 do t[i] = {s .. i, i} end"},
    {K_LOOP, "local s = string.rep('x', 1 << 20) while true do s = s .. s end"},
    /* endless inside one call of a library function, where the count hook never fires */
    {K_LOOP, "string.rep('a', 300000):find('.-.-.-b') return @SPEC@"},
    {K_LOOP, "string.rep('', 1e18) return @SPEC@"},
    {K_LOOP, "table.move({}, 1, 1e15, 2) return @SPEC@"},
};

/* ------------------------------------------------------------------------------------------------------------ */

static uint64_t rng_state = SEED;
static uint64_t rnd(void) {
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static size_t pick(size_t n) { return (size_t)(rnd() % n); }
#define PICK(arr) (arr)[pick(CP_ARRAY_LEN(arr))]

static char dir[256], ok_dir[PATH_MAX];
static int ncases, capcases;
static fuzz_case *cases;

static fuzz_case *new_case(case_kind kind) {
    if (ncases == capcases) cases = cp_xrealloc(cases, (size_t)(capcases = capcases ? 2 * capcases : 256) * sizeof *cases);
    fuzz_case *c = &cases[ncases];
    memset(c, 0, sizeof *c);
    c->kind = kind;
    snprintf(c->path, sizeof c->path, "%s/case_%04d.lua", dir, ncases);
    ncases++;
    return c;
}

static void write_text(const char *path, const char *text, size_t len) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(text, 1, len, f) != len || fclose(f)) {
        fprintf(stderr, "cannot write %s: %s\n", path, strerror(errno));
        exit(1);
    }
}

/* Replaces every `from` in text by `to` into a new string. */
static char *replace_all(const char *text, const char *from, const char *to) {
    cp_str s = {0};
    for (const char *p = text, *q; *p; p = q + strlen(from)) {
        q = strstr(p, from);
        if (!q) {
            cp_str_append(&s, p, strlen(p));
            break;
        }
        cp_str_append(&s, p, (size_t)(q - p));
        cp_str_append(&s, to, strlen(to));
    }
    if (!s.data) cp_str_append(&s, "", 0);
    return s.data;
}

static void write_program(fuzz_case *c, const char *body) {
    char *a = replace_all(body, "@OK@", ok_dir);
    write_text(c->path, a, strlen(a));
    free(a);
}

/* A spec from a base with one key set to a Lua expression (NULL: deleted), through tables created on the way. */
static void structured_case(case_kind kind, const char *base, const char *key, const char *value) {
    fuzz_case *c = new_case(kind);
    char body[2048];
    snprintf(body, sizeof body,
             "local s = %s\n"
             "local function put(t, path, v)\n"
             "  local k = {}\n"
             "  for p in path:gmatch('[^.]+') do k[#k + 1] = p end\n"
             "  for i = 1, #k - 1 do\n"
             "    if type(t[k[i]]) ~= 'table' then t[k[i]] = {} end\n"
             "    t = t[k[i]]\n"
             "  end\n"
             "  t[k[#k]] = v\n"
             "end\n"
             "put(s, '%s', %s)\n"
             "return s\n",
             base, key, value ? value : "nil");
    write_program(c, body);
}

/* Replaces bytes [from, to) of s by n bytes of text. */
static void replace_span(cp_str *s, size_t from, size_t to, const char *text, size_t n) {
    cp_str t = {0};
    cp_str_append(&t, s->data, from);
    cp_str_append(&t, text, n);
    cp_str_append(&t, s->data + to, s->len - to);
    cp_str_free(s);
    *s = t;
}

/* Small edits of a file's text: a number or string swapped, a line dropped, a byte inserted, the text cut. */
static void text_case(const char *src_path) {
    size_t len;
    char *text = cp_read_file(src_path, &len);
    if (!text) {
        fprintf(stderr, "cannot read %s\n", src_path);
        exit(1);
    }
    cp_str s = {0};
    cp_str_append(&s, text, len);
    free(text);
    int edits = 1 + (int)pick(3);
    for (int e = 0; e < edits && s.len > 0; e++) {
        size_t at = pick(s.len);
        switch (pick(5)) {
        case 0: { /* the next number or string literal becomes another value */
            size_t i = at;
            while (i < s.len && !(s.data[i] >= '0' && s.data[i] <= '9') && s.data[i] != '"') i++;
            if (i == s.len) break;
            size_t j = i + 1;
            if (s.data[i] == '"') {
                while (j < s.len && s.data[j] != '"' && s.data[j] != '\n') j++;
                if (j < s.len) j++;
            } else {
                while (j < s.len && ((s.data[j] >= '0' && s.data[j] <= '9') || s.data[j] == '.' || s.data[j] == 'e'))
                    j++;
            }
            const char *v = PICK(VALUES);
            replace_span(&s, i, j, v, strlen(v));
            break;
        }
        case 1: { /* a line dropped */
            size_t b = at, f = at;
            while (b > 0 && s.data[b - 1] != '\n') b--;
            while (f < s.len && s.data[f] != '\n') f++;
            if (f < s.len) f++;
            memmove(s.data + b, s.data + f, s.len - f);
            s.len -= f - b;
            break;
        }
        case 2: { /* a byte that matters to Lua inserted */
            static const char bytes[] = "{}()=,\"'\n.[]-#~0";
            char ch = bytes[pick(sizeof bytes - 1)];
            replace_span(&s, at, at, &ch, 1);
            break;
        }
        case 3: /* cut */
            s.len = at;
            break;
        default: { /* a key name swapped for another one */
            const char *k = PICK(KEYS);
            const char *leaf = strrchr(k, '.') + 1;
            size_t i = at;
            while (i < s.len && !(s.data[i] >= 'a' && s.data[i] <= 'z')) i++;
            size_t j = i;
            while (j < s.len && ((s.data[j] >= 'a' && s.data[j] <= 'z') || s.data[j] == '_')) j++;
            replace_span(&s, i, j, leaf, strlen(leaf));
        }
        }
    }
    fuzz_case *c = new_case(K_TEXT);
    write_text(c->path, s.data ? s.data : "", s.len);
    cp_str_free(&s);
}

static int list_lua(const char *folder, char paths[][PATH_MAX], int max) {
    char cmd[PATH_MAX + 64];
    snprintf(cmd, sizeof cmd, "ls %s/*.lua 2>/dev/null", folder);
    FILE *p = popen(cmd, "r");
    int n = 0;
    while (p && n < max && fgets(paths[n], PATH_MAX, p)) {
        paths[n][strcspn(paths[n], "\n")] = 0;
        n++;
    }
    if (p) pclose(p);
    return n;
}

static void draw_cases(void) {
    /* every key deleted from every base that has it, and every section made a number, a string and a list */
    for (size_t k = 0; k < CP_ARRAY_LEN(KEYS); k++) structured_case(K_DELETE, PICK(BASES), KEYS[k], NULL);
    static const char *const odd_sections[] = {"5", "'x'", "{1, 2}", "true", "false", "{}"};
    for (size_t i = 0; i < CP_ARRAY_LEN(SECTIONS); i++)
        for (size_t v = 0; v < CP_ARRAY_LEN(odd_sections); v++)
            structured_case(K_SECTION, PICK(BASES), SECTIONS[i], odd_sections[v]);
    /* unknown keys and sections, near-misses of real ones and far ones */
    static const char *const unknown[] = {"model.hiden", "model.vocab_size", "parallel.gpu", "train.seqlen",
                                          "train.gpus", "trian.steps", "machine.gpu_memory", "model.rope.thetta",
                                          "model.rope.scaling.factr", "data.sources", "init.from_hf", "extra.x",
                                          "model.1", "x"};
    for (size_t i = 0; i < CP_ARRAY_LEN(unknown); i++) structured_case(K_UNKNOWN, PICK(BASES), unknown[i], "1");
    /* drawn values */
    for (int i = 0; i < 260; i++) structured_case(K_VALUE, PICK(BASES), PICK(KEYS), PICK(VALUES));
    /* text edits of every shipped spec, tests/specs_ok and the bad corpus */
    static char files[256][PATH_MAX];
    int n = list_lua("specs", files, 256);
    n += list_lua("tests/specs_ok", files + n, 256 - n);
    n += list_lua("tests/specs_bad", files + n, 256 - n);
    for (int i = 0; i < 140; i++) text_case(files[pick((size_t)n)]);
    /* bad --set strings on specs that load */
    for (size_t i = 0; i < CP_ARRAY_LEN(BAD_SETS); i++) {
        fuzz_case *c = new_case(K_SET);
        char body[256];
        snprintf(body, sizeof body, "return %s\n", PICK(BASES));
        write_program(c, body);
        if (!strcmp(BAD_SETS[i], "@LONG@")) {
            memset(c->sets[0], 'a', 300);
            snprintf(c->sets[0] + 300, 20, "=1");
        } else {
            snprintf(c->sets[0], sizeof c->sets[0], "%s", BAD_SETS[i]);
        }
        c->nsets = 1;
    }
    /* Lua errors, endless loops and memory bombs */
    for (size_t i = 0; i < CP_ARRAY_LEN(PROGRAMS); i++) {
        fuzz_case *c = new_case(PROGRAMS[i].kind);
        char *body = replace_all(PROGRAMS[i].text, "@SPEC@", PICK(BASES));
        write_program(c, body);
        free(body);
    }
}

/* ------------------------------------------------------------------------------------------------------------
 * Running one case in a child process, as `cpgen plan` would: exit 0 when the plan builds (fitting or not), 2
 * with the message in <case>.msg when the spec is refused, 3 when the plan is (cpgen exits 2 for both). The
 * child's stderr (a spec's print(), a sanitizer's report) goes to <case>.err. */

#define PARALLEL 2

static void run_child(const fuzz_case *c) {
    alarm((unsigned)(TIME_LIMIT_S + SLACK_S + 5));
    char path[sizeof c->path + 8];
    snprintf(path, sizeof path, "%s.err", c->path);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) dup2(fd, 2);
    const char *sets[MAX_SETS];
    for (int i = 0; i < c->nsets; i++) sets[i] = c->sets[i];
    static cp_spec spec;
    char err[CP_ERR_MAX];
    int code = 0;
    if (cp_spec_load(c->path, sets, c->nsets, &spec, err, sizeof err)) {
        code = 2;
    } else {
        cp_plan plan;
        if (cp_plan_build(&spec, &plan, err, sizeof err)) code = 3;
        else cp_plan_free(&plan);
    }
    if (code) {
        snprintf(path, sizeof path, "%s.msg", c->path);
        FILE *f = fopen(path, "w");
        if (!f || fputs(err, f) < 0 || fclose(f)) _exit(1);
    }
    _exit(code);
}

static bool names_a_key(const char *msg, const char *path) {
    for (size_t i = 0; i < CP_ARRAY_LEN(KEYS); i++)
        if (strstr(msg, KEYS[i])) return true;
    for (size_t i = 0; i < CP_ARRAY_LEN(SECTIONS); i++) {
        char s[PATH_MAX + 64];
        snprintf(s, sizeof s, "%s: %s", path, SECTIONS[i]);
        if (strstr(msg, s)) return true;
    }
    /* a Lua error: "file:line:", in the case or in a file it loaded; a message about the whole spec or --set */
    const char *p = msg;
    while ((p = strchr(p, ':'))) {
        if (p[1] >= '0' && p[1] <= '9') return true;
        p++;
    }
    /* a key the spec should not have, named as it was written */
    if (strstr(msg, ": unknown section") || strstr(msg, ": unknown key")) return true;
    return strstr(msg, ": the spec ") || strstr(msg, ": cannot run the spec") || strstr(msg, "--set ");
}

typedef struct {
    pid_t pid;
    double start, seconds;
    outcome out;
    char msg[CP_ERR_MAX];
} result;

static char *read_beside(const fuzz_case *c, const char *ext) {
    char path[sizeof c->path + 8];
    snprintf(path, sizeof path, "%s%s", c->path, ext);
    size_t len;
    char *text = cp_read_file(path, &len);
    return text ? text : cp_xstrdup("");
}

static void start_case(const fuzz_case *c, result *r) {
    fflush(NULL);
    r->start = cp_now();
    r->pid = fork();
    if (r->pid < 0) {
        perror("fork");
        exit(1);
    }
    if (r->pid == 0) run_child(c);
}

static void finish_case(const fuzz_case *c, result *r, int status) {
    r->seconds = cp_now() - r->start;
    char *msg = read_beside(c, ".msg");
    snprintf(r->msg, sizeof r->msg, "%s", msg);
    free(msg);
    if (WIFSIGNALED(status)) {
        r->out = WTERMSIG(status) == SIGALRM ? O_TIMEOUT : O_CRASH;
        snprintf(r->msg, sizeof r->msg, "killed by signal %d", WTERMSIG(status));
        return;
    }
    int code = WEXITSTATUS(status);
    if (r->seconds > TIME_LIMIT_S + SLACK_S) r->out = O_TIMEOUT;
    else if (code == 0) r->out = O_PLANNED;
    else if (code != 2 && code != 3) r->out = O_CRASH;
    else if (strstr(r->msg, "spec loader crashed")) r->out = O_CRASH; /* the process that runs the Lua died */
    else if (!*r->msg || strchr(r->msg, '\n') || !strstr(r->msg, c->path) || !names_a_key(r->msg, c->path))
        r->out = O_BAD_MESSAGE;
    else r->out = code == 2 ? O_SPEC_ERROR : O_PLAN_ERROR;
}

/* All cases, PARALLEL at a time. */
static void run_cases(result *res) {
    int next = 0, running = 0;
    while (next < ncases || running) {
        while (running < PARALLEL && next < ncases) {
            start_case(&cases[next], &res[next]);
            next++, running++;
        }
        int status;
        pid_t pid = wait(&status);
        if (pid < 0) {
            if (errno == EINTR) continue;
            perror("wait");
            exit(1);
        }
        for (int i = 0; i < next; i++)
            if (res[i].pid == pid) {
                finish_case(&cases[i], &res[i], status);
                res[i].pid = 0;
                running--;
            }
    }
}

/* A few cases through the binary: the exit code and stderr that users see. */
static int run_binary(const fuzz_case *c, const char *cpgen) {
    char cmd[PATH_MAX * 2 + 1024];
    int o = snprintf(cmd, sizeof cmd, "%s plan '%s'", cpgen, c->path);
    for (int i = 0; i < c->nsets; i++) o += snprintf(cmd + o, sizeof cmd - (size_t)o, " --set '%s'", c->sets[i]);
    snprintf(cmd + o, sizeof cmd - (size_t)o, " >/dev/null 2>%s/stderr.txt", dir);
    int st = system(cmd);
    if (st == -1 || !WIFEXITED(st)) return -1;
    int code = WEXITSTATUS(st);
    if (code == 0) return 0;
    char path[sizeof dir + 16];
    snprintf(path, sizeof path, "%s/stderr.txt", dir);
    size_t len;
    char *text = cp_read_file(path, &len);
    bool good = code == 2 && text && !strncmp(text, "cpgen: ", 7) && strstr(text, c->path);
    free(text);
    return good ? 2 : -1;
}

int main(int argc, char **argv) {
    (void)argc;
    go_to_source_tree(argv[0], "tests/specs_bad");
    if (tmpdir_make(dir, sizeof dir, "fuzz")) {
        perror("mkdtemp");
        return 1;
    }
    if (!realpath("tests/specs_ok", ok_dir)) {
        perror("tests/specs_ok");
        return 1;
    }
    cp_spec_set_time_limit(TIME_LIMIT_S);
    draw_cases();

    int count[K_KIND_COUNT][O_COUNT] = {{0}}, total[O_COUNT] = {0}, failures = 0;
    double slowest = 0, t0 = cp_now();
    result *res = cp_xcalloc((size_t)ncases, sizeof *res);
    run_cases(res);
    for (int i = 0; i < ncases; i++) {
        const result *r = &res[i];
        count[cases[i].kind][r->out]++;
        total[r->out]++;
        if (r->seconds > slowest) slowest = r->seconds;
        if (r->out >= O_BAD_MESSAGE) {
            failures++;
            char *text = read_beside(&cases[i], ""), *child_err = read_beside(&cases[i], ".err");
            fprintf(stderr, "FAIL %s (%s, %.1f s)%s%s: %s\n--- spec:\n%.600s\n--- stderr:\n%.2000s\n---\n",
                    outcome_names[r->out], kind_names[cases[i].kind], r->seconds, cases[i].nsets ? " --set " : "",
                    cases[i].nsets ? cases[i].sets[0] : "", r->msg, text, child_err);
            free(text);
            free(child_err);
        }
    }
    /* the binary: exit 2 with "cpgen: <file>..." on stderr where the case was refused, 0 or 2 (a plan that does
     * not fit) where it planned */
    int through_binary = 0;
    if (access("build/cpgen", X_OK) == 0) {
        for (int i = 0; i < ncases && through_binary < 12; i += 37) {
            int want = res[i].out == O_PLANNED ? 0 : 2, got = run_binary(&cases[i], "build/cpgen");
            through_binary++;
            if (got != want && !(want == 0 && got == 2)) {
                failures++;
                fprintf(stderr, "FAIL build/cpgen plan %s: exit %d, expected %d\n", cases[i].path, got, want);
            }
        }
    }
    free(res);

    printf("spec fuzzer: %d cases from seed %#x in %.1f s (slowest %.2f s; spec time limit %.0f s while fuzzing)\n",
           ncases, SEED, cp_now() - t0, slowest, TIME_LIMIT_S);
    printf("  %-20s", "kind of case");
    for (int o = 0; o < O_COUNT; o++) printf(" %*s", (int)strlen(outcome_names[o]), outcome_names[o]);
    printf("\n");
    for (int k = 0; k < K_KIND_COUNT; k++) {
        printf("  %-20s", kind_names[k]);
        for (int o = 0; o < O_COUNT; o++) printf(" %*d", (int)strlen(outcome_names[o]), count[k][o]);
        printf("\n");
    }
    printf("  %-20s", "all");
    for (int o = 0; o < O_COUNT; o++) printf(" %*d", (int)strlen(outcome_names[o]), total[o]);
    printf("\n  %d of them also through build/cpgen plan\n", through_binary);
    if (ncases < 500) {
        fprintf(stderr, "only %d cases; at least 500 expected\n", ncases);
        failures++;
    }
    /* Every kind must reach both sides: a fuzzer whose mutations all fail (or all pass) tests nothing. */
    if (!total[O_PLANNED] || !total[O_SPEC_ERROR]) {
        fprintf(stderr, "the cases did not reach both outcomes (planned %d, refused %d)\n", total[O_PLANNED],
                total[O_SPEC_ERROR]);
        failures++;
    }
    if (!failures) tmpdir_remove(dir); /* kept after a failure: the cases named above are in it */
    printf("%s\n", failures ? "FAILED" : "ok");
    return failures ? 1 : 0;
}

// test_docs.c — the agent documents (AGENTS.md, CONTRIBUTING.md, .agents/skills/*/SKILL.md) name only things
// that exist. Every backticked span and every line of a fenced block is read as words:
//   make TARGET            a target of the Makefile (`$(BUILD)/x` rules give `build/x`)
//   pith CMD --opt         a command of `pith --help`, an option of `pith CMD --help`
//   --set key=value        a key of `pith train --config-table` (so of src/train/config.c's tables)
//   section.key            the same, for the dotted sections of that table (optimizer., parallel., ...)
//   build/test_pith NAME   a substring of some TEST name in tests/*.c (build/test_gpu: tests/gpu/*.c)
//   paths                  a file or folder the repository has (from the root, src/ or the document's folder);
//                          build/x must be a make target; runs/, data/, .dev-*/ and absolute paths are outputs
//   snake_case, CamelCase, PITH_* names   a word of the sources (src, tests, bench, scripts, examples, .agents)
// Words with placeholders (<x>, *, $, {}) are not checked. `doc_check` returns the number of stale names and
// describes each on a line of its report.
#include <ctype.h>
#include <unistd.h>

#include "test.h"

typedef struct {
    char **v;
    int n, cap;
} Words;

typedef struct {
    Words files;     // the repository's files (git ls-files: tracked and untracked-not-ignored)
    Words targets;   // make targets
    Words commands;  // pith commands
    Words cmd_help;  // `pith <command> --help` text, one per command (same order)
    Words keys;      // config keys
    Words tests_cpu; // TEST names of tests/*.c
    Words tests_gpu; // TEST names of tests/gpu/*.c
    char *corpus;    // the sources' text, for names
    size_t corpus_len;
} DocIndex;

static void words_add(Words *w, const char *s, size_t len) {
    if (w->n == w->cap) w->cap = w->cap ? 2 * w->cap : 64, w->v = xrealloc(w->v, w->cap * sizeof *w->v);
    char *c = xmalloc(len + 1);
    memcpy(c, s, len), c[len] = 0;
    w->v[w->n++] = c;
}
static int words_find(const Words *w, const char *s) {
    for (int i = 0; i < w->n; i++)
        if (!strcmp(w->v[i], s)) return i;
    return -1;
}

// Runs the statements that follow for each line of text (line: its start, len: its length without the newline).
#define FOR_LINES(text, line, len, ...)                                                                                \
    for (const char *line = (text), *nl_; *line; line = nl_ ? nl_ + 1 : line + strlen(line)) {                         \
        nl_ = strchr(line, '\n');                                                                                      \
        size_t len = nl_ ? (size_t)(nl_ - line) : strlen(line);                                                        \
        __VA_ARGS__;                                                                                                   \
        if (!nl_) break;                                                                                               \
    }

static char *cmd_output(const char *fmt, const char *arg) {
    static char out[1 << 20];
    ASSERT_MSG(run_cmd(out, sizeof out, fmt, arg) == 0, "%s: %s", fmt, out);
    return xstrdup(out);
}

static void add_test_names(Words *w, const char *text) {
    for (const char *p = text; (p = strstr(p, "\nTEST(")); p++) {
        const char *b = p + 6, *e = strchr(b, ')');
        if (e) words_add(w, b, e - b);
    }
}

static bool ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

static bool source_like(const char *path) {
    static const char *const ext[] = {".c", ".h", ".cu", ".cuh", ".sh", ".py", ".mjs", ".proto", ".md", ".json"};
    for (size_t i = 0; i < sizeof ext / sizeof *ext; i++)
        if (ends_with(path, ext[i])) return true;
    return !strcmp(path, "Makefile");
}

// make targets of a makefile and of the files it includes: "a b: deps" lines (no '=' before the colon, not a
// recipe), .PHONY's list; $(BUILD)/x gives build/x
static void make_targets(DocIndex *ix, const char *path) {
    size_t n;
    char *mk = file_read_all(path, &n);
    ASSERT_MSG(mk, "%s", path);
    FOR_LINES(mk, line, len, {
        if (len > 8 && !strncmp(line, "include ", 8) && !memchr(line, '$', len)) {
            char inc[256];
            snprintf(inc, sizeof inc, "%.*s", (int)(len - 8), line + 8);
            make_targets(ix, inc);
            continue;
        }
        const char *colon = memchr(line, ':', len);
        if (!len || !colon || line[0] == '\t' || line[0] == '#' || line[0] == ' ' || memchr(line, '=', colon - line) ||
            colon[1] == '=')
            continue;
        bool phony = !strncmp(line, ".PHONY:", 7);
        const char *p = phony ? colon + 1 : line, *end = phony ? line + len : colon;
        while (p < end) {
            while (p < end && isspace((unsigned char)*p)) p++;
            const char *b = p;
            while (p < end && !isspace((unsigned char)*p)) p++;
            if (p == b) continue;
            char name[256];
            snprintf(name, sizeof name, "%.*s", (int)(p - b), b);
            if (!strncmp(name, "$(BUILD)/", 9))
                memmove(name + 5, name + 8, strlen(name + 8) + 1), memcpy(name, "build", 5);
            if (!strchr(name, '%') && !strchr(name, '$')) words_add(&ix->targets, name, strlen(name));
        }
    });
    free(mk);
}

static void doc_index_build(DocIndex *ix) {
    memset(ix, 0, sizeof *ix);
    char *ls = cmd_output("git ls-files --cached --others --exclude-standard%s", "");
    FOR_LINES(ls, line, len, if (len) words_add(&ix->files, line, len));
    free(ls);
    size_t cap = 1 << 22;
    ix->corpus = xmalloc(cap);
    for (int i = 0; i < ix->files.n; i++) {
        const char *f = ix->files.v[i];
        bool src = !strncmp(f, "src/", 4) || !strncmp(f, "tests/", 6) || !strncmp(f, "bench/", 6) ||
                   !strncmp(f, "scripts/", 8) || !strncmp(f, "examples/", 9) || !strncmp(f, ".agents/", 8) ||
                   !strcmp(f, "Makefile");
        if (!src || ends_with(f, ".md") || !source_like(f)) continue;
        bool self = !strcmp(f, "tests/test_docs.c"); // (its stale examples must not count as names)
        size_t n;
        char *t = file_read_all(f, &n);
        if (!t) continue; // (a file listed but deleted in the working tree)
        if (self) {
            add_test_names(&ix->tests_cpu, t);
            free(t);
            continue;
        }
        while (ix->corpus_len + n + 2 > cap) cap *= 2, ix->corpus = xrealloc(ix->corpus, cap);
        ix->corpus[ix->corpus_len++] = '\n';
        memcpy(ix->corpus + ix->corpus_len, t, n), ix->corpus_len += n;
        ix->corpus[ix->corpus_len] = 0;
        if (!strncmp(f, "tests/gpu/", 10) && ends_with(f, ".c")) add_test_names(&ix->tests_gpu, t);
        else if (!strncmp(f, "tests/", 6) && !strchr(f + 6, '/') && ends_with(f, ".c"))
            add_test_names(&ix->tests_cpu, t);
        free(t);
    }
    make_targets(ix, "Makefile");
    // pith commands ("  name   what it does" under "commands:") and each one's --help
    char *help = cmd_output("%s --help", PITH_BIN);
    const char *c = strstr(help, "commands:");
    ASSERT(c);
    FOR_LINES(c, line, len, {
        if (len > 2 && line[0] == ' ' && line[1] == ' ' && isalpha((unsigned char)line[2])) {
            size_t k = 2;
            while (k < len && !isspace((unsigned char)line[k])) k++;
            words_add(&ix->commands, line + 2, k - 2);
        }
    });
    free(help);
    for (int i = 0; i < ix->commands.n; i++) {
        char cmd[256];
        snprintf(cmd, sizeof cmd, "%s %s --help", PITH_BIN, ix->commands.v[i]);
        char *h = cmd_output("%s", cmd);
        words_add(&ix->cmd_help, h, strlen(h));
        free(h);
    }
    // config keys: the first column of the first table of `pith train --config-table`
    char *table = cmd_output("%s train --config-table", PITH_BIN);
    bool started = false;
    FOR_LINES(table, line, len, {
        if (len == 0 && started) break;
        if (len > 4 && !strncmp(line, "| `", 3)) {
            started = true;
            const char *e = memchr(line + 3, '`', len - 3);
            if (e) words_add(&ix->keys, line + 3, e - (line + 3));
        }
    });
    free(table);
    ASSERT(ix->files.n > 100 && ix->targets.n > 10 && ix->commands.n >= 7 && ix->keys.n > 30 && ix->tests_cpu.n > 100 &&
           ix->tests_gpu.n > 10);
}

// name occurs in the sources as a whole word
static bool corpus_has_word(const DocIndex *ix, const char *name) {
    size_t n = strlen(name);
    for (const char *p = ix->corpus; (p = strstr(p, name)); p++) {
        char a = p > ix->corpus ? p[-1] : ' ', b = p[n];
        if (!(isalnum((unsigned char)a) || a == '_') && !(isalnum((unsigned char)b) || b == '_')) return true;
    }
    return false;
}

// opt ("--gpus") occurs in a command's help as a whole option, not as the start of a longer one
static bool help_has_option(const char *help, const char *opt) {
    size_t n = strlen(opt);
    for (const char *p = help; (p = strstr(p, opt)); p++)
        if (!(isalnum((unsigned char)p[n]) || p[n] == '-' || p[n] == '_')) return true;
    return false;
}

static bool file_or_folder(const DocIndex *ix, const char *path) {
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') n--;
    for (int i = 0; i < ix->files.n; i++) {
        const char *f = ix->files.v[i];
        if (!strncmp(f, path, n) && (f[n] == 0 || f[n] == '/')) return true;
    }
    return false;
}

typedef struct {
    const DocIndex *ix;
    const char *doc, *doc_dir;
    int line, stale;
    char *report;
    size_t cap, len;
} Check;

static void stale(Check *k, const char *kind, const char *name) {
    k->stale++;
    int w =
        snprintf(k->report + k->len, k->cap - k->len, "%s:%d: %s `%s` does not exist\n", k->doc, k->line, kind, name);
    if (w > 0) k->len = k->len + w < k->cap ? k->len + w : k->cap - 1;
}

static bool placeholder(const char *t) { return strpbrk(t, "<>*$%{}[]|`'\"…\\") || strstr(t, "..."); }

static bool is_key(const DocIndex *ix, const char *t) { return words_find(&ix->keys, t) >= 0; }

// a dotted config section ("optimizer" of optimizer.lr)
static bool is_section(const DocIndex *ix, const char *t, size_t n) {
    for (int i = 0; i < ix->keys.n; i++)
        if (!strncmp(ix->keys.v[i], t, n) && ix->keys.v[i][n] == '.') return true;
    return false;
}

static void check_key(Check *k, const char *kv) {
    char key[256];
    snprintf(key, sizeof key, "%.*s", (int)strcspn(kv, "="), kv);
    if (!placeholder(key) && !is_key(k->ix, key)) stale(k, "config key", key);
}

static void check_path(Check *k, char *t) {
    if (!strncmp(t, "./", 2)) t += 2;
    size_t n = strlen(t);
    while (n && strchr(",;:.", t[n - 1])) t[--n] = 0;
    char *colon = strchr(t, ':'); // file.c:123
    if (colon && isdigit((unsigned char)colon[1])) *colon = 0;
    if (!t[0] || t[0] == '/' || t[0] == '~' || strstr(t, "://")) return;
    const char *slash = strchr(t, '/');
    if (!strncmp(t, "build", 5) && slash && !strchr(slash + 1, '/') && slash[1]) { // build*/x: a make target
        char target[256];
        snprintf(target, sizeof target, "build/%s", slash + 1);
        if (words_find(&k->ix->targets, target) < 0) stale(k, "make-built file", t);
        return;
    }
    static const char *const outputs[] = {"build", "runs/", "data/", ".dev-", ".gpu", "tmp/"};
    for (size_t i = 0; i < sizeof outputs / sizeof *outputs; i++)
        if (!strncmp(t, outputs[i], strlen(outputs[i]))) return;
    char first[256];
    snprintf(first, sizeof first, "%.*s", (int)(slash ? slash - t : (ptrdiff_t)strlen(t)), t);
    bool rooted = slash && file_or_folder(k->ix, first);
    const char *dot = strrchr(t, '.');
    bool has_ext = dot && dot > (slash ? strrchr(t, '/') : t) && isalpha((unsigned char)dot[1]);
    if (!rooted && !(slash ? has_ext : source_like(t) && !ends_with(t, ".json"))) return; // not a path (1/N, a.b)
    char cand[600];
    const char *bases[] = {"", "src/", k->doc_dir};
    for (size_t i = 0; i < 3; i++) {
        snprintf(cand, sizeof cand, "%s%s", bases[i], t);
        if (file_or_folder(k->ix, cand)) return;
    }
    if (!slash) // a bare file name: anywhere in the tree
        for (int i = 0; i < k->ix->files.n; i++) {
            const char *b = strrchr(k->ix->files.v[i], '/');
            if (!strcmp(b ? b + 1 : k->ix->files.v[i], t)) return;
        }
    stale(k, "file", t);
}

// snake_case (with an underscore), CamelCase (two humps) or PITH_* words, possibly with "()"
static bool name_like(const char *t) {
    size_t n = strlen(t), lower = 0, upper = 0, under = 0;
    if (n >= 2 && !strcmp(t + n - 2, "()")) n -= 2;
    if (!n || !(isalpha((unsigned char)t[0]) || t[0] == '_')) return false;
    for (size_t i = 0; i < n; i++) {
        if (!(isalnum((unsigned char)t[i]) || t[i] == '_')) return false;
        lower += islower((unsigned char)t[i]) != 0, upper += isupper((unsigned char)t[i]) != 0, under += t[i] == '_';
    }
    if (!strncmp(t, "PITH_", 5)) return true;
    if (under && lower && !upper) return true;
    int humps = 0;
    for (size_t i = 0; i + 1 < n; i++) humps += isupper((unsigned char)t[i]) && islower((unsigned char)t[i + 1]);
    return !under && humps >= 2;
}

static void check_name(Check *k, const char *t) {
    char name[256];
    snprintf(name, sizeof name, "%s", t);
    size_t n = strlen(name);
    if (n >= 2 && !strcmp(name + n - 2, "()")) name[n - 2] = 0;
    if (!corpus_has_word(k->ix, name)) stale(k, "name", name);
}

// One word that no command rule took: a config key, a path, a dotted name or a name.
static void check_word(Check *k, char *t) {
    while (*t == '(' || *t == '"') t++;
    size_t n = strlen(t);
    if (n >= 2 && !strcmp(t + n - 2, "()")) t[n -= 2] = 0; // a function: its name
    while (n && strchr(",;:)\"", t[n - 1])) t[--n] = 0;
    if (!n || placeholder(t) || t[0] == '-') return;
    const char *dot = strchr(t, '.'), *eq = strchr(t, '=');
    if (dot && !strchr(t, '/') && is_section(k->ix, t, dot - t)) return check_key(k, t);
    if (eq) { // KEY=value outside --set: pith's own environment switches are checked, others (make, shell) not
        char key[128];
        snprintf(key, sizeof key, "%.*s", (int)(eq - t), t);
        if (!strncmp(key, "PITH_", 5)) check_name(k, key);
        return;
    }
    if (strchr(t, '/') || (dot && dot[1])) {
        char copy[512];
        snprintf(copy, sizeof copy, "%s", t);
        if (strchr(t, '/') || source_like(t)) return check_path(k, copy);
        for (char *s = strtok(copy, "."); s; s = strtok(NULL, ".")) // tensor and struct paths: each part
            if (name_like(s)) check_name(k, s);
        return;
    }
    while (n && t[n - 1] == '.') t[--n] = 0;
    if (name_like(t)) check_name(k, t);
}

static bool separator(const char *t) {
    return !strcmp(t, "|") || !strcmp(t, "&&") || !strcmp(t, "||") || !strcmp(t, ";") || t[0] == '>' ||
           !strcmp(t, "2>&1");
}

// One span: its words, with the command rules (make, pith, test runners, --set) applied first.
static void check_span(Check *k, const char *s, size_t len) {
    char buf[2048];
    snprintf(buf, sizeof buf, "%.*s", (int)(len < sizeof buf ? len : sizeof buf - 1), s);
    char *w[256];
    int n = 0;
    for (char *t = strtok(buf, " \t"); t && n < 256 && t[0] != '#'; t = strtok(NULL, " \t")) w[n++] = t; // (# comment)
    for (int i = 0; i < n; i++) {
        char *t = w[i];
        size_t tl = strlen(t);
        if (tl && t[tl - 1] == ';') t[--tl] = 0;
        if (!strcmp(t, "make")) {
            while (i + 1 < n && !separator(w[i + 1])) {
                char *a = w[++i];
                if (a[0] != '-' && !strchr(a, '=') && !placeholder(a) && words_find(&k->ix->targets, a) < 0)
                    stale(k, "make target", a);
            }
        } else if (!strcmp(t, "pith") || ends_with(t, "/pith")) {
            if (t[0] != 'p') check_path(k, t);
            if (i + 1 >= n || w[i + 1][0] == '-' || placeholder(w[i + 1])) continue;
            int c = words_find(&k->ix->commands, w[++i]);
            if (c < 0) {
                stale(k, "pith command", w[i]);
                continue;
            }
            while (i + 1 < n && !separator(w[i + 1])) {
                char *a = w[++i], opt[128];
                if (!strcmp(a, "--set") && i + 1 < n) check_key(k, w[++i]);
                else if (a[0] == '-' && a[1] == '-' && strcmp(a, "--help")) {
                    snprintf(opt, sizeof opt, "%.*s", (int)strcspn(a, "="), a);
                    if (!help_has_option(k->ix->cmd_help.v[c], opt)) stale(k, "option", opt);
                } else check_word(k, a);
            }
        } else if (ends_with(t, "/test_pith") || ends_with(t, "/test_gpu")) {
            check_path(k, t);
            const Words *names = ends_with(t, "/test_gpu") ? &k->ix->tests_gpu : &k->ix->tests_cpu;
            if (i + 1 < n && !separator(w[i + 1]) && w[i + 1][0] != '-' && !placeholder(w[i + 1])) {
                const char *f = w[++i];
                bool any = false;
                for (int j = 0; j < names->n && !any; j++) any = strstr(names->v[j], f) != NULL;
                if (!any) stale(k, "test name", f);
            }
        } else if (!strcmp(t, "--set") && i + 1 < n) check_key(k, w[++i]);
        else if (!separator(t)) check_word(k, t);
    }
}

static int doc_check(const DocIndex *ix, const char *doc, const char *text, char *report, size_t cap) {
    char dir[512];
    path_dirname(dir, sizeof dir, doc);
    strcat(dir, "/");
    Check k = {ix, doc, strcmp(dir, "./") ? dir : "", 0, 0, report, cap, 0};
    report[0] = 0;
    bool fenced = false;
    FOR_LINES(text, line, len, {
        k.line++;
        size_t ind = strspn(line, " ");
        if (len >= ind + 3 && !strncmp(line + ind, "```", 3)) { // a fence, also indented inside a list item
            fenced = !fenced;
            continue;
        }
        if (fenced) {
            check_span(&k, line, len);
            continue;
        }
        for (const char *p = line, *end = line + len; p < end;) {
            const char *a = memchr(p, '`', end - p);
            if (!a) break;
            const char *b = memchr(a + 1, '`', end - a - 1);
            if (!b) break;
            check_span(&k, a + 1, b - a - 1);
            p = b + 1;
        }
    });
    return k.stale;
}

static DocIndex *doc_index(void) {
    static DocIndex ix;
    static bool built;
    if (!built) doc_index_build(&ix), built = true;
    return &ix;
}

// Every agent document: AGENTS.md, CONTRIBUTING.md and each skill's SKILL.md (at least six skills).
TEST(docs_agent_files_name_only_what_exists) {
    const DocIndex *ix = doc_index();
    static char report[1 << 16];
    int docs = 0, skills = 0, bad = 0;
    for (int i = 0; i < ix->files.n; i++) {
        const char *f = ix->files.v[i];
        bool skill = !strncmp(f, ".agents/skills/", 15) && ends_with(f, "/SKILL.md");
        if (!skill && strcmp(f, "AGENTS.md") && strcmp(f, "CONTRIBUTING.md")) continue;
        size_t n;
        char *t = file_read_all(f, &n);
        ASSERT_MSG(t, "%s", f);
        int s = doc_check(ix, f, t, report, sizeof report);
        if (s) printf("%s", report);
        bad += s, docs++, skills += skill;
        free(t);
    }
    ASSERT_MSG(docs == skills + 2 && skills >= 6, "%d documents, %d skills", docs, skills);
    ASSERT_MSG(bad == 0, "%d stale names in the agent documents (listed above)", bad);
}

// The checker finds each kind of stale name, and passes the same lines with names that exist.
TEST(docs_check_finds_stale_names) {
    const DocIndex *ix = doc_index();
    static char report[1 << 14];
    const char *good =
        "Run `make -j2 build/test_pith && build/test_pith model_gradcheck_deepseek_v2` and\n"
        "```\n"
        "build/pith train examples/tiny/train.json --set optimizer.lr=1e-3 --steps 2 | tail -1\n"
        "scripts/launch.sh -n 2 CONFIG --set parallel.expert_parallel_size=2\n"
        "build/test_gpu gpu_model_deepseek_v2\n"
        "```\n"
        "`model_lb_loss()` in `model/model.c`, `ModelFamily`, `PITH_ATTENTION=own`, `scheduler.type`,\n"
        "`layers.L.mlp.experts.E.gate_proj.weight`, `1/N`, `runs/demo/loss.png`, `src/model/<family>.c`.\n";
    ASSERT_MSG(doc_check(ix, "AGENTS.md", good, report, sizeof report) == 0, "%s", report);
    static const struct {
        const char *text, *want;
    } bad[] = {
        {"`make test-gpu3`", "make target `test-gpu3`"},
        {"`build/pith trian CONFIG`", "pith command `trian`"},
        {"`build/pith estimate CONFIG --gpu 8`", "option `--gpu`"},
        {"`pith train C --set optimizer.learning_rate=1`", "config key `optimizer.learning_rate`"},
        {"`parallel.pipeline_size`", "config key `parallel.pipeline_size`"},
        {"`build/test_pith model_gradcheck_gpt_oss_xyz`", "test name `model_gradcheck_gpt_oss_xyz`"},
        {"`build/test_gpu gpu_model_qwen9`", "test name `gpu_model_qwen9`"},
        {"`src/model/qwen3.c`", "file `src/model/qwen3.c`"},
        {"`bench/run_gpu3.sh`", "file `bench/run_gpu3.sh`"},
        {"1. step\n   ```\n   bash .agents/skills/x/verify.sh --gpus 2\n   ```", "file `.agents/skills/x/verify.sh`"},
        {"`build/bench_cpu_ops`", "make-built file `build/bench_cpu_ops`"},
        {"`record_forward()`", "name `record_forward`"},
        {"`PITH_NO_SUCH_SWITCH`", "name `PITH_NO_SUCH_SWITCH`"},
        {"`ModelFamilyTable`", "name `ModelFamilyTable`"},
        {"```\nmpirun -np 2 build/pith train C --set no_such_key=1\n```", "config key `no_such_key`"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        int s = doc_check(ix, "x/SKILL.md", bad[i].text, report, sizeof report);
        ASSERT_MSG(s == 1 && strstr(report, bad[i].want), "%s: %d stale, report:\n%s", bad[i].text, s, report);
    }
}

// The map of AGENTS.md (its rows "| `folder/` | ..."): the row of each file under src/ and scripts/ (the row of the
// longest folder that holds it) names the file, and every file name a row gives (`a.{c,h}` is a.c and a.h) is a
// file of that folder.
static void map_names(const char *row, Words *names) {
    for (const char *p = row; (p = strchr(p, '`'));) {
        const char *e = strchr(p + 1, '`');
        if (!e) break;
        char span[256];
        snprintf(span, sizeof span, "%.*s", (int)(e - p - 1), p + 1);
        p = e + 1;
        char *brace = strchr(span, '{');
        if (brace && brace[strlen(brace) - 1] == '}') { // a.{c,h}: one name per alternative
            brace[strlen(brace) - 1] = 0, *brace = 0;
            for (char *alt = strtok(brace + 1, ","); alt; alt = strtok(NULL, ",")) {
                char full[256];
                snprintf(full, sizeof full, "%s%s", span, alt);
                words_add(names, full, strlen(full));
            }
        } else if (strchr(span, '.') && !strchr(span, '/') && !strchr(span, ' ') && !strchr(span, '('))
            words_add(names, span, strlen(span));
    }
}

static bool file_like(const char *name) {
    static const char *const ext[] = {".c", ".h", ".cu", ".cuh", ".sh", ".mjs", ".proto", ".py"};
    for (size_t i = 0; i < sizeof ext / sizeof *ext; i++)
        if (ends_with(name, ext[i])) return true;
    return false;
}

static int agents_map_check(const DocIndex *ix, const char *agents, char *report, size_t cap) {
    Words folders = {0}, rows = {0};
    FOR_LINES(agents, line, len, {
        if (len > 4 && !strncmp(line, "| `", 3)) {
            const char *e = memchr(line + 3, '`', len - 3);
            if (e && e[-1] == '/') words_add(&folders, line + 3, e - line - 3), words_add(&rows, line, len);
        }
    });
    int bad = 0;
    size_t used = 0;
    report[0] = 0;
#define MAP_REPORT(...)                                                                                                \
    do {                                                                                                               \
        bad++;                                                                                                         \
        int w_ = snprintf(report + used, cap - used, __VA_ARGS__);                                                     \
        if (w_ > 0) used = used + w_ < cap ? used + w_ : cap - 1;                                                      \
    } while (0)
    for (int i = 0; i < ix->files.n; i++) { // the tree: each file named in its row
        const char *f = ix->files.v[i];
        if (strncmp(f, "src/", 4) && strncmp(f, "scripts/", 8)) continue;
        int best = -1;
        for (int r = 0; r < folders.n; r++)
            if (!strncmp(f, folders.v[r], strlen(folders.v[r])) &&
                (best < 0 || strlen(folders.v[r]) > strlen(folders.v[best])))
                best = r;
        if (best < 0) {
            MAP_REPORT("AGENTS.md: no row of the map holds %s\n", f);
            continue;
        }
        const char *base = f + strlen(folders.v[best]);
        Words names = {0};
        map_names(rows.v[best], &names);
        if (words_find(&names, base) < 0) MAP_REPORT("AGENTS.md: the row `%s` does not name %s\n", folders.v[best], f);
        for (int k = 0; k < names.n; k++) free(names.v[k]);
        free(names.v);
    }
    for (int r = 0; r < folders.n; r++) { // the rows: each file they name exists in their folder
        if (strncmp(folders.v[r], "src/", 4) && strncmp(folders.v[r], "scripts/", 8)) continue;
        Words names = {0};
        map_names(rows.v[r], &names);
        for (int k = 0; k < names.n; k++) {
            char path[512];
            snprintf(path, sizeof path, "%s%s", folders.v[r], names.v[k]);
            if (file_like(names.v[k]) && words_find(&ix->files, path) < 0)
                MAP_REPORT("AGENTS.md: the row `%s` names %s, which does not exist\n", folders.v[r], path);
            free(names.v[k]);
        }
        free(names.v);
    }
#undef MAP_REPORT
    for (int k = 0; k < folders.n; k++) free(folders.v[k]), free(rows.v[k]);
    free(folders.v), free(rows.v);
    return bad;
}

TEST(docs_agents_map_names_every_file) {
    const DocIndex *ix = doc_index();
    static char report[1 << 14];
    size_t n;
    char *agents = file_read_all("AGENTS.md", &n);
    ASSERT(agents);
    int bad = agents_map_check(ix, agents, report, sizeof report);
    ASSERT_MSG(bad == 0, "%d differences between AGENTS.md's map and the tree:\n%s", bad, report);
    // The check can fail both ways: a row that loses a file, a row that names one the tree lacks.
    char *broken = xstrdup(agents), *hit = strstr(broken, "`dualpipev.{c,h}`");
    ASSERT(hit);
    memcpy(hit, "`dualpipex.{c,h}`", 17);
    ASSERT_MSG(agents_map_check(ix, broken, report, sizeof report) == 4 && strstr(report, "src/pipe/dualpipev.c") &&
                   strstr(report, "src/pipe/dualpipex.h, which does not exist"),
               "%s", report);
    free(broken), free(agents);
}

// The skills' checks that run on the CPU, each as its SKILL.md says (from the repository root, build/pith and
// build/test_pith built): they must print their PASS line and exit 0; a broken input must give FAIL.
static const char *skill_run(int *status, const char *fmt, const char *arg) {
    static char out[1 << 16];
    *status = run_cmd(out, sizeof out, fmt, arg);
    return out;
}

static void skill_needs_binaries(void) {
    if (access("build/pith", X_OK) || access("build/test_pith", X_OK))
        test_skip("the skills' checks run build/pith and build/test_pith, not built here");
}

// add-model-family --quick for every model_type of families[] (src/model/*.c), and FAIL for a family that is not.
TEST(docs_skill_add_model_family_every_family) {
    skill_needs_binaries();
    int st, families = 0;
    char types[1 << 12];
    ASSERT(run_cmd(types, sizeof types, "sed -n 's/^ *\\.model_type = \"\\([a-z0-9_]*\\)\",.*/\\1/p' src/model/*.c") ==
           0);
    char *save = NULL;
    for (char *t = strtok_r(types, "\n", &save); t; t = strtok_r(NULL, "\n", &save), families++) {
        const char *out = skill_run(&st, "bash .agents/skills/add-model-family/check.sh --quick %s", t);
        char want[128];
        snprintf(want, sizeof want, "add-model-family %s: PASS", t);
        ASSERT_MSG(st == 0 && strstr(out, want), "%s (exit %d):\n%s", t, st, out);
    }
    ASSERT_MSG(families >= 4, "%d model types in src/model/*.c", families);
    const char *out = skill_run(&st, "bash .agents/skills/add-model-family/check.sh --quick %s", "no_such_family");
    ASSERT_MSG(st == 1 && strstr(out, "add-model-family no_such_family: FAIL"), "exit %d:\n%s", st, out);
}

// estimate-memory: PASS follows the estimator's verdict (TIGHT passes; OOM fails even where the plan alone fits in
// the budget), and --verify finds the estimate equal to what 2 CPU ranks allocate.
TEST(docs_skill_estimate_memory_follows_the_verdict) {
    skill_needs_binaries();
    int st;
    const char *cmd = "bash .agents/skills/estimate-memory/check.sh examples/qwen3-30b-a3b/train.json --gpus 64 "
                      "--set parallel.expert_parallel_size=16 --set parallel.ep_capacity_factor=%s";
    const char *out = skill_run(&st, cmd, "1.25");
    ASSERT_MSG(st == 0 && strstr(out, "\nverdict: TIGHT on 80 GB") && strstr(out, "estimate-memory: PASS (TIGHT)"),
               "%s", out);
    out = skill_run(&st, cmd, "1.3"); // the plan alone (77.7 GB) is under 80 GB; with the runtime it is not
    ASSERT_MSG(st == 1 && strstr(out, "\nverdict: OOM on 80 GB") && strstr(out, "estimate-memory: FAIL (OOM)"), "%s",
               out);
    const char *dir = test_tmpdir();
    char synth[1024];
    ASSERT_MSG(
        run_cmd(synth, sizeof synth, "%s synth --output %s/tokens.bin --vocab 256 --tokens 20000", PITH_BIN, dir) == 0,
        "%s", synth);
    out = skill_run(&st,
                    "bash .agents/skills/estimate-memory/check.sh --verify examples/tiny/train.json --gpus 2 --set "
                    "parallel.expert_parallel_size=2 --set dataset=%s",
                    dir);
    ASSERT_MSG(st == 0 && strstr(out, "estimate-memory: PASS (estimate = training plan"), "%s", out);
}

// launch-on-slurm: launch.sh's srun branch on 2 CPU ranks, two allocations, against one process.
TEST(docs_skill_launch_on_slurm_simulated) {
    skill_needs_binaries();
    int st;
    const char *out = skill_run(&st, "WORK=%s bash .agents/skills/launch-on-slurm/simulate.sh", test_tmpdir());
    ASSERT_MSG(st == 0 && strstr(out, "launch-on-slurm (simulated): PASS"), "exit %d:\n%s", st, out);
}

// validate-correctness on this checkout against itself, 4 steps: base = feature, and ep2, dp2 = one process.
TEST(docs_skill_validate_correctness_same_tree) {
    skill_needs_binaries();
    int st;
    const char *out =
        skill_run(&st, "WORK=%s bash .agents/skills/validate-correctness/run.sh . . --steps 4", test_tmpdir());
    ASSERT_MSG(st == 0 && strstr(out, "validate-correctness: PASS"), "exit %d:\n%s", st, out);
}

// One direction through src/: a file includes only from its own folder or one below it in app → train → pipe →
// model → parallel → ops → base (so no circle either). The scan reads every #include "folder/..." of src/.
TEST(structure_one_direction) {
    static const char *const order[] = {"app", "train", "pipe", "model", "parallel", "ops", "base"};
    char out[1 << 16];
    ASSERT(run_cmd(out, sizeof out, "grep -o '^#include \"[a-z_]*/' src/*/*.[ch] src/*/*/*.[ch] src/*/*/*.cu*") == 0);
    int lines = 0;
    for (char *l = strtok(out, "\n"); l; l = strtok(NULL, "\n"), lines++) {
        char from[32] = "", to[32] = "";
        ASSERT_MSG(sscanf(l, "src/%31[a-z_]/", from) == 1 && strstr(l, "#include \""), "%s", l);
        sscanf(strstr(l, "#include \"") + 10, "%31[a-z_]", to);
        int a = -1, b = -1;
        for (int i = 0; i < 7; i++) a = strcmp(order[i], from) ? a : i, b = strcmp(order[i], to) ? b : i;
        ASSERT_MSG(a >= 0 && b >= 0, "%s: a folder outside the layer order", l);
        ASSERT_MSG(b >= a, "%s: %s includes %s, a layer above it", l, from, to);
    }
    ASSERT(lines > 100);
}

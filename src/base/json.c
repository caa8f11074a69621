// json.c — strict JSON readers: every error names the file and the dotted key.
#include "base/json.h"

#include <errno.h>
#include <math.h>

void jdie(JObj o, const char *key, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    die("%s: %s%s%s: %s", o.file, o.path, o.path[0] && key ? "." : "", key ? key : "", msg);
}

json_t *json_load_or_die(const char *file) {
    json_error_t err;
    if (!path_exists(file)) die("%s: no such file", file);
    json_t *root = json_read_file(file, JSON_REJECT_DUPLICATES, &err);
    if (!root) die("%s:%d:%d: invalid JSON: %s", file, err.line, err.column, err.text);
    return root;
}

json_t *json_read_file(const char *file, size_t flags, json_error_t *err) {
    size_t n;
    char *text = file_read_all(file, &n);
    if (!text) {
        snprintf(err->text, sizeof err->text, "cannot read: %s", strerror(errno));
        err->line = err->column = 0;
        return NULL;
    }
    json_t *root = json_loadb(text, n, flags, err);
    free(text);
    return root;
}

JObj jobj_root(json_t *root, const char *file) {
    JObj o = {root, file, ""};
    if (!json_is_object(root)) die("%s: expected a JSON object at the top level", file);
    return o;
}

JObj jobj_child(JObj o, const char *key) {
    JObj c = {NULL, o.file, ""};
    snprintf(c.path, sizeof c.path, "%.60s%s%.60s", o.path, o.path[0] ? "." : "", key);
    json_t *v = json_object_get(o.obj, key);
    if (v && !json_is_null(v)) {
        if (!json_is_object(v)) jdie(o, key, "expected an object");
        c.obj = v;
    }
    return c;
}

static json_t *jget(JObj o, const char *key, bool required) {
    json_t *v = o.obj ? json_object_get(o.obj, key) : NULL;
    if (v && json_is_null(v)) v = NULL;
    if (!v && required) jdie(o, key, "missing required key");
    return v;
}

bool jhas(JObj o, const char *key) { return jget(o, key, false) != NULL; }

int64_t jint(JObj o, const char *key, bool required, int64_t def) {
    json_t *v = jget(o, key, required);
    if (!v) return def;
    if (json_is_integer(v)) return json_integer_value(v);
    if (json_is_real(v)) { // an integral real in int64 range (casting one outside the range is undefined)
        double d = json_real_value(v);
        if (d >= -0x1p63 && d < 0x1p63 && d == (double)(int64_t)d) return (int64_t)d;
    }
    jdie(o, key, "expected an integer");
}

int jint_in(JObj o, const char *key, bool required, int64_t def, int64_t lo, int64_t hi) {
    int64_t v = jint(o, key, required, def);
    if (v < lo || v > hi)
        jdie(o, key, "must be in [%lld, %lld] (got %lld)", (long long)lo, (long long)hi, (long long)v);
    return (int)v;
}

double jnum(JObj o, const char *key, bool required, double def) {
    json_t *v = jget(o, key, required);
    if (!v) return def;
    if (!json_is_number(v)) jdie(o, key, "expected a number");
    return json_number_value(v);
}

bool jbool(JObj o, const char *key, bool required, bool def) {
    json_t *v = jget(o, key, required);
    if (!v) return def;
    if (!json_is_boolean(v)) jdie(o, key, "expected true or false");
    return json_is_true(v);
}

const char *jstr(JObj o, const char *key, bool required, const char *def) {
    json_t *v = jget(o, key, required);
    if (!v) return def;
    if (!json_is_string(v)) jdie(o, key, "expected a string");
    return json_string_value(v);
}

void jcheck_known(JObj o, const char *const *known) {
    if (!o.obj) return;
    const char *key;
    json_t *v;
    json_object_foreach(o.obj, key, v) {
        bool ok = false;
        for (const char *const *k = known; *k && !ok; k++) ok = strcmp(*k, key) == 0;
        if (!ok) jdie(o, key, "unknown key");
    }
}

char *json_real_text(char out[32], double v) {
    if (!isfinite(v)) return strcpy(out, "null");
    for (int p = 1; p <= 17; p++) { // the shortest %g form that reads back as v
        snprintf(out, 32, "%.*g", p, v);
        if (strtod(out, NULL) == v) break;
    }
    char plain[32];
    if (strchr(out, 'e') && v == floor(v) && fabs(v) < 1e6 && snprintf(plain, 32, "%.0f", v) <= (int)strlen(out))
        strcpy(out, plain); // 900, not 9e+02 (as short, and as written)
    return out;
}

double json_f32(float f) {
    if (!isfinite(f)) return f;
    char s[32];
    for (int p = 1; p <= 9; p++) { // the shortest %g form that reads back as f in fp32
        snprintf(s, sizeof s, "%.*g", p, (double)f);
        if ((float)strtod(s, NULL) == f) break;
    }
    return strtod(s, NULL);
}

static void text_str(Str *t, const char *s) { str_put(t, s, strlen(s)); }

static void text_newline(Str *t, int indent, int depth) {
    if (!indent) return;
    text_str(t, "\n");
    for (int i = 0; i < indent * depth; i++) text_str(t, " ");
}

static int cmp_keys(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

static void text_value(Str *t, const json_t *v, int indent, bool sort, int depth) {
    char num[40];
    if (json_is_real(v)) {
        json_real_text(num, json_real_value(v));
        if (!strpbrk(num, ".eEnN")) strcat(num, ".0"); // a real stays a real when read back
        return text_str(t, num);
    }
    if (json_is_integer(v))
        return snprintf(num, sizeof num, "%" JSON_INTEGER_FORMAT, json_integer_value(v)), text_str(t, num);
    if (json_is_array(v) || json_is_object(v)) {
        bool obj = json_is_object(v);
        size_t n = obj ? json_object_size(v) : json_array_size(v), i = 0;
        if (!n) return text_str(t, obj ? "{}" : "[]");
        const char **keys = malloc(n * sizeof *keys), *key; // malloc: json.c links alone into a fuzz target
        json_t *x;
        CHECK(keys);
        if (obj) json_object_foreach((json_t *)v, key, x) keys[i++] = key;
        if (obj && sort) qsort(keys, n, sizeof *keys, cmp_keys);
        text_str(t, obj ? "{" : "[");
        for (i = 0; i < n; i++) {
            if (i) text_str(t, indent ? "," : ", ");
            text_newline(t, indent, depth + 1);
            if (obj) { // the key, escaped as a string value is
                json_t *k = json_string(keys[i]);
                text_value(t, k, indent, sort, depth + 1), text_str(t, ": ");
                json_decref(k);
            }
            text_value(t, obj ? json_object_get(v, keys[i]) : json_array_get(v, i), indent, sort, depth + 1);
        }
        free(keys);
        text_newline(t, indent, depth);
        return text_str(t, obj ? "}" : "]");
    }
    char *s = json_dumps(v, JSON_ENCODE_ANY); // strings (escaped as jansson escapes them), true, false, null
    CHECK(s);
    text_str(t, s);
    free(s);
}

char *json_text(const json_t *v, int indent, bool sort_keys) {
    Str t = {0};
    text_value(&t, v, indent, sort_keys, 0);
    return t.p;
}

// json.c — strict JSON readers: every error names the file and the dotted key.
#include "base/json.h"

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
    json_t *root = json_load_file(file, JSON_REJECT_DUPLICATES, &err);
    if (!root) die("%s:%d:%d: invalid JSON: %s", file, err.line, err.column, err.text);
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
    return out;
}

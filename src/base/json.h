// json.h — strict reading of JSON objects on top of jansson, with errors that name file and key.
#pragma once
#include <jansson.h>

#include "base/base.h"

// A JSON object together with where it came from, for error messages: "<file>: <path>.<key>: ...".
typedef struct {
    json_t *obj;
    const char *file;
    char path[128]; // dotted path of this object inside the file ("" at the top)
} JObj;

// json_load_file through file_open_read (a FIFO or folder dies naming it); NULL with err set otherwise.
json_t *json_read_file(const char *file, size_t flags, json_error_t *err);
json_t *json_load_or_die(const char *file);     // parse a file; dies with file:line:column on bad JSON
JObj jobj_root(json_t *root, const char *file); // dies unless root is an object
JObj jobj_child(JObj o, const char *key);       // a nested object; obj == NULL when the key is absent

bool jhas(JObj o, const char *key); // present and not null
int64_t jint(JObj o, const char *key, bool required, int64_t def);
// An integer in [lo, hi] (within int), read as int64 and checked before it narrows: never truncated.
int jint_in(JObj o, const char *key, bool required, int64_t def, int64_t lo, int64_t hi);
double jnum(JObj o, const char *key, bool required, double def);
bool jbool(JObj o, const char *key, bool required, bool def);
const char *jstr(JObj o, const char *key, bool required, const char *def);
// Dies naming the first key of o that is not in the NULL-terminated list `known`.
void jcheck_known(JObj o, const char *const *known);
// v as JSON text: the shortest decimal that reads back as exactly v (17 digits at most); "null" for NaN
// and ±Inf, which JSON has no numbers for. Returns out.
char *json_real_text(char out[32], double v);
// v as JSON text, laid out as json_dumps lays it out with JSON_INDENT(indent) (indent 0: one line), keys in
// their order or sorted, but every real written as the shortest decimal that reads back as exactly that double
// (json_real_text, with ".0" kept on integral values): jansson writes 17 digits (0.1 -> 0.10000000000000001).
// Caller frees.
char *json_text(const json_t *v, int indent, bool sort_keys);
// An fp32 value as the double to store in JSON: the one its shortest decimal (at most 9 digits) reads as, so
// it prints short and (float) of what is read back is exactly f.
double json_f32(float f);
_Noreturn void jdie(JObj o, const char *key, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

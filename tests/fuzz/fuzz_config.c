// fuzz_config.c — libFuzzer target: arbitrary bytes as an HF config.json, read through pith's strict getters
// (base/json.h) the way a model family reads its config: jint/jnum/jbool/jstr on the usual keys, nested objects,
// unknown-key checks. The getters die() on a wrong type; this target links json.c alone and supplies its own die()
// that longjmps back here, so the error paths (message formatting with input-controlled keys) are fuzzed too, not
// just the happy paths. Every message must start with the file name.
#include <setjmp.h>

#include "base/json.h"

static jmp_buf jump;
static char msg[1024];

void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    longjmp(jump, 1);
}

bool path_exists(const char *path) { return true; }
char *file_read_all(const char *path, size_t *len) { // (never reached: the target parses from memory)
    *len = 0;
    return NULL;
}

static const char *const keys[] = {"model_type",
                                   "hidden_size",
                                   "num_hidden_layers",
                                   "num_attention_heads",
                                   "num_key_value_heads",
                                   "head_dim",
                                   "intermediate_size",
                                   "moe_intermediate_size",
                                   "num_experts",
                                   "n_routed_experts",
                                   "num_experts_per_tok",
                                   "vocab_size",
                                   "rms_norm_eps",
                                   "rope_theta",
                                   "tie_word_embeddings",
                                   "norm_topk_prob",
                                   "max_position_embeddings",
                                   "sliding_window",
                                   "torch_dtype",
                                   "hidden_act",
                                   "type",
                                   "factor",
                                   "rope_type",
                                   NULL};
static const char *const children[] = {"rope_scaling", "quantization_config", "text_config", NULL};

// Each getter in its own try: a die() in one does not stop the others.
#define TRY(call)                                                                                                      \
    do {                                                                                                               \
        if (setjmp(jump) == 0) (void)(call);                                                                           \
        else CHECK(!strncmp(msg, "config.json", 11));                                                                  \
    } while (0)

static void read_obj(JObj o, int depth) {
    for (int i = 0; keys[i]; i++) {
        TRY(jhas(o, keys[i]));
        TRY(jint(o, keys[i], i % 3 == 0, 7));
        TRY(jnum(o, keys[i], false, 0.5));
        TRY(jbool(o, keys[i], false, true));
        TRY(jstr(o, keys[i], i % 5 == 0, "x"));
    }
    TRY(jcheck_known(o, keys));
    for (int i = 0; children[i] && depth < 3; i++) {
        JObj c = {0};
        if (setjmp(jump) == 0) {
            c = jobj_child(o, children[i]);
            if (c.obj) read_obj(c, depth + 1);
        } else {
            CHECK(!strncmp(msg, "config.json", 11));
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    json_error_t err;
    json_t *root = json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES, &err); // as json_load_or_die
    if (!root) return 0;
    if (setjmp(jump) == 0) read_obj(jobj_root(root, "config.json"), 0);
    else CHECK(!strncmp(msg, "config.json: expected a JSON object", 35));
    json_decref(root);
    return 0;
}

// convert.c — `pith convert hf2pith|pith2hf`: Hugging Face folders ⇄ pith checkpoints (docs/reference.md §17).
// For most families (Qwen3-MoE, DeepSeek-V2) the HF names are the canonical names with a "model." prefix
// (lm_head.* has none) and one key per expert, so conversion renames and, for pith2hf, optionally changes
// the dtype; a family whose HF layout differs (fused or transposed experts) converts through its
// hf_import/hf_export hooks (model/model.h). Tensors keep their bytes otherwise: hf2pith then pith2hf
// reproduces the original files' tensors bit for bit. A multimodal hub folder (Qwen3.5: the text model under
// model.language_model.*, beside a vision tower model.visual.* and a multi-token-prediction head mtp.*) imports
// its text model; pith2hf writes the text-only names.
#include <errno.h>
#include <ftw.h>
#include <getopt.h>
#include <math.h>
#include <strings.h>
#include <unistd.h>

#include "app/app.h"
#include "model/model.h"

static void convert_usage(FILE *f) {
    fprintf(
        f,
        "usage: pith convert hf2pith HF_DIR CKPT_DIR [--dtype bf16|fp32]\n"
        "       pith convert pith2hf CKPT_DIR HF_DIR [--dtype bf16|fp32] [--max-shard-size SIZE] [--tokenizer PATH]\n"
        "  hf2pith: an HF folder (config.json + model.safetensors or shards with an index) becomes a model-only\n"
        "           pith checkpoint; name it <save_location>/step-00000000 to start `pith train` from it.\n"
        "           MXFP4 weights (the released GPT-OSS experts) are dequantized to --dtype (default bf16).\n"
        "  pith2hf: a pith checkpoint (or a save_location: its newest) becomes an HF folder (sharded when larger\n"
        "           than SIZE, e.g. 5GB, 500MB;\n"
        "           default 5GB); --dtype converts (default: keep the stored dtype); config.json says which\n"
        "           dtype was written. --tokenizer: a folder holding tokenizer.json (or the file itself) whose\n"
        "           tokenizer.json, tokenizer_config.json and special_tokens_map.json are copied into HF_DIR.\n");
}

static size_t parse_size(const char *s) {
    static const char *const units[] = {"", "KB", "MB", "GB", "", "KiB", "MiB", "GiB"};
    char *end;
    double v = strtod(s, &end);
    int k = 0;
    while (k < 8 && strcasecmp(end, units[k])) k++;
    if (k == 8) die("convert: --max-shard-size: cannot read '%s' (examples: 5GB, 500MB, 1048576)", s);
    if (!(v > 0)) die("convert: --max-shard-size: must be positive (got '%s')", s);
    return (size_t)(v * pow(k < 4 ? 1000 : 1024, k % 4));
}

// The temporary output folder while it is being written: removed at exit unless it was renamed, so a run
// that fails (a write error, a bad tensor) leaves nothing behind.
static char pending[4200];

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) { return remove(path); }
static void remove_pending(void) {
    if (pending[0]) nftw(pending, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

// A fresh temporary folder beside dst; dies if dst already exists (nothing is overwritten).
static void begin_output(const char *dst, char *tmp, size_t cap) {
    if (path_exists(dst)) die("%s: already exists (remove it or choose another output folder)", dst);
    snprintf(tmp, cap, "%s.tmp-%d", dst, (int)getpid());
    remove_tree(tmp);
    mkdir_p(tmp);
    snprintf(pending, sizeof pending, "%s", tmp);
    atexit(remove_pending);
}

static void finish_output(const char *tmp, const char *dst) {
    char parent[4096];
    fsync_dir(tmp);
    if (rename(tmp, dst)) die("%s: cannot rename to %s: %s", tmp, dst, strerror(errno));
    pending[0] = 0;
    path_dirname(parent, sizeof parent, dst);
    fsync_dir(parent);
}

// Copies src_dir/config.json to dst_dir/config.json; with dtype, sets its "dtype"/"torch_dtype" keys; with
// dequantized, drops its quantization_config (the weights written are no longer quantized). A multimodal config
// (with a text_config) becomes its text_config: the checkpoint holds the text model only.
static void copy_config(const char *src_dir, const char *dst_dir, const char *dtype, bool dequantized) {
    char src[4200], dst[4200];
    snprintf(src, sizeof src, "%s/config.json", src_dir);
    snprintf(dst, sizeof dst, "%s/config.json", dst_dir);
    json_t *root = json_load_or_die(src), *tc = json_object_get(root, "text_config");
    if (json_is_object(tc)) {
        json_incref(tc), json_decref(root);
        root = tc;
    }
    if (dtype) {
        if (json_object_get(root, "torch_dtype")) json_object_set_new(root, "torch_dtype", json_string(dtype));
        json_object_set_new(root, "dtype", json_string(dtype));
    }
    if (dequantized) json_object_del(root, "quantization_config");
    char *text = json_text(root, 2, false);
    file_write_atomic(dst, text, strlen(text));
    free(text), json_decref(root);
}

// The tensor of canonical name `name`: under that name, "model." + name or "model.language_model." + name.
static const StTensor *find_param(const StSet *s, const char *name) {
    char hf[200], mm[200];
    snprintf(hf, sizeof hf, "model.%s", name);
    snprintf(mm, sizeof mm, "model.language_model.%s", name);
    const StTensor *x = st_set_find(s, name);
    x = x ? x : st_set_find(s, hf);
    return x ? x : st_set_find(s, mm);
}

// The canonical name of an HF tensor name: without "model.language_model." (a multimodal folder) or "model.".
static const char *canonical_name(const char *hf) {
    if (!strncmp(hf, "model.language_model.", 21)) return hf + 21;
    return strncmp(hf, "model.", 6) ? hf : hf + 6;
}
// Tensors of a multimodal folder that are not the text model's: the vision tower and the MTP head.
static bool other_tower(const char *hf) { return !strncmp(hf, "model.visual.", 13) || !strncmp(hf, "mtp.", 4); }

// Opens the model folder: its config (the family and parameter table) and its tensors, each of which
// must be a parameter of the model with the right shape (in an HF folder, other towers' tensors are left out).
static const ModelFamily *open_model(const char *dir, ModelConfig *mc, ParamTable *t, StSet *s, bool hf) {
    const ModelFamily *fam = model_config_load(mc, dir);
    memset(t, 0, sizeof *t);
    model_params_build(fam, t, mc);
    st_set_open_or_die(s, dir);
    if (hf && fam->hf_import) return fam; // the family's layout: its hook checks the tensors
    int others = 0;
    for (int i = 0; i < s->n; i++) {
        if (hf && other_tower(s->t[i]->name)) {
            others++;
            continue;
        }
        const ParamInfo *p = params_find(t, canonical_name(s->t[i]->name));
        if (!p)
            die("%s: tensor '%s' is not a parameter of this %s model", s->t[i]->file, s->t[i]->name, mc->model_type);
        st_check_shape(s->t[i], p->nd, p->shape);
    }
    if (others) printf("hf2pith: %d tensors of the vision tower and MTP head left out\n", others);
    if (s->n - others != t->n) {
        for (int i = 0; i < t->n; i++) {
            char hf[160];
            snprintf(hf, sizeof hf, "model.%s", t->p[i].name);
            if (!find_param(s, t->p[i].name)) die("%s: tensor '%s' is missing", dir, hf);
        }
    }
    return fam;
}

// The HF name of the floating-point dtype holding most of the elements w writes ("float32", "bfloat16",
// "float16"; NULL when there are none): what config.json's dtype says about the exported files.
static const char *written_dtype(const StWriter *w) {
    static const struct {
        StDType dt;
        const char *name;
    } names[] = {{ST_F32, "float32"}, {ST_BF16, "bfloat16"}, {ST_F16, "float16"}, {ST_F64, "float64"}};
    int64_t count[4] = {0};
    for (int i = 0; i < w->n; i++)
        for (int k = 0; k < 4; k++) {
            int64_t n = 1;
            for (int d = 0; d < w->e[i].nd; d++) n *= w->e[i].shape[d];
            if (w->e[i].dt == names[k].dt) count[k] += n;
        }
    int best = 0;
    for (int k = 1; k < 4; k++) best = count[k] > count[best] ? k : best;
    return count[best] ? names[best].name : NULL;
}

// The tokenizer files of --tokenizer (a folder holding tokenizer.json, or that file) as (name, bytes): checked
// before anything is written — each must be JSON, and no id of tokenizer.json may reach the model's vocab_size.
static const char *const tokenizer_files[] = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"};
typedef struct {
    char *text[3];
    size_t len[3];
} TokenizerFiles;

static int64_t max_token_id(json_t *doc) {
    int64_t top = -1;
    json_t *vocab = json_object_get(json_object_get(doc, "model"), "vocab"), *v, *added;
    const char *key;
    size_t i;
    if (json_is_object(vocab))
        json_object_foreach(vocab, key, v) if (json_is_integer(v) && json_integer_value(v) > top) top =
            json_integer_value(v);
    if (json_is_array(vocab)) top = (int64_t)json_array_size(vocab) - 1; // Unigram: [piece, score] by id
    json_array_foreach(json_object_get(doc, "added_tokens"), i, added) {
        json_t *id = json_object_get(added, "id");
        if (json_is_integer(id) && json_integer_value(id) > top) top = json_integer_value(id);
    }
    return top;
}

static void read_tokenizer(TokenizerFiles *tf, const char *path, const ModelConfig *mc) {
    char dir[4096], file[4200];
    if (!path_exists(path)) die("%s: --tokenizer: no such file or folder", path);
    if (path_is_dir(path)) snprintf(dir, sizeof dir, "%s", path);
    else path_dirname(dir, sizeof dir, path);
    for (int k = 0; k < 3; k++) {
        snprintf(file, sizeof file, "%s/%s", dir, tokenizer_files[k]);
        tf->text[k] = NULL;
        if (!path_exists(file)) {
            if (k == 0) die("%s: no such file (--tokenizer needs a tokenizer.json or a folder holding one)", file);
            continue;
        }
        json_t *doc = json_load_or_die(file);
        if (k == 0) {
            int64_t top = max_token_id(doc);
            if (top < 0) die("%s: model.vocab: no token ids found", file);
            if (top >= mc->vocab)
                die("%s: token id %lld is outside the model's vocab_size %d (a tokenizer of another model?)", file,
                    (long long)top, mc->vocab);
        }
        json_decref(doc);
        tf->text[k] = file_read_all(file, &tf->len[k]);
        if (!tf->text[k]) die("%s: cannot read: %s", file, strerror(errno));
    }
}

static int hf2pith(const char *src, const char *dst, const char *dtype) {
    ModelConfig mc;
    ParamTable t;
    StSet s;
    const ModelFamily *fam = open_model(src, &mc, &t, &s, true);
    char tmp[4200], path[4300];
    begin_output(dst, tmp, sizeof tmp);
    StWriter w;
    HfBuffers keep = {0};
    st_writer_init(&w);
    st_writer_meta(&w, "format", "pith");
    int dequantized = fam->hf_import ? fam->hf_import(&mc, &t, &s, &w, dtype, &keep) : 0;
    if (dtype && !dequantized)
        die("convert: --dtype applies to pith2hf, and to hf2pith of MXFP4 weights (%s has none)", src);
    if (!fam->hf_import)
        for (int i = 0; i < t.n; i++) {
            const StTensor *x = find_param(&s, t.p[i].name);
            st_writer_add_raw(&w, t.p[i].name, x->dt, x->nd, x->shape, x->data);
        }
    snprintf(path, sizeof path, "%s/model.safetensors", tmp);
    st_writer_write(&w, path);
    hf_buffers_free(&keep);
    copy_config(src, tmp, NULL, dequantized > 0);
    finish_output(tmp, dst);
    if (dequantized)
        printf("hf2pith: %d MXFP4 weights dequantized to %s\n", dequantized,
               dtype ? dtype : "bf16 (--dtype fp32: fp32)");
    printf("hf2pith: %d tensors of %s -> %s (model-only checkpoint)\n", t.n, src, dst);
    st_writer_free(&w), st_set_close(&s), free(t.p);
    return 0;
}

static int pith2hf(const char *src, const char *dst, const char *dtype, size_t shard, const char *tokenizer) {
    ModelConfig mc;
    ParamTable t;
    StSet s;
    const ModelFamily *fam = open_model(src, &mc, &t, &s, false);
    TokenizerFiles tf = {0};
    if (tokenizer) read_tokenizer(&tf, tokenizer, &mc);
    char tmp[4200], path[4400];
    begin_output(dst, tmp, sizeof tmp);
    StWriter w;
    HfBuffers keep = {0};
    st_writer_init(&w);
    st_writer_meta(&w, "format", "pt");
    float **bufs = xcalloc(t.n, sizeof *bufs);
    if (fam->hf_export) fam->hf_export(&mc, &t, &s, &w, dtype, &keep);
    for (int i = 0; i < t.n && !fam->hf_export; i++) {
        const StTensor *x = find_param(&s, t.p[i].name);
        char hf[160];
        snprintf(hf, sizeof hf, "%s%s", strncmp(t.p[i].name, "lm_head.", 8) ? "model." : "", t.p[i].name);
        if (!dtype) {
            st_writer_add_raw(&w, hf, x->dt, x->nd, x->shape, x->data);
            continue;
        }
        bufs[i] = xmalloc((x->numel ? x->numel : 1) * sizeof(float));
        st_read_f32(x, bufs[i]);
        st_writer_add_f32(&w, hf, !strcmp(dtype, "bf16") ? ST_BF16 : ST_F32, x->nd, x->shape, bufs[i]);
    }
    int nshards = st_writer_write_sharded(&w, tmp, shard);
    // the dtype of the files as written (a config copied from a bf16 model may describe fp32 masters)
    copy_config(src, tmp, written_dtype(&w), false);
    for (int k = 0; k < 3; k++)
        if (tf.text[k]) {
            snprintf(path, sizeof path, "%s/%s", tmp, tokenizer_files[k]);
            file_write_atomic(path, tf.text[k], tf.len[k]);
            free(tf.text[k]);
        }
    finish_output(tmp, dst);
    printf("pith2hf: %d tensors of %s -> %s in %d file%s (%s)%s\n", t.n, src, dst, nshards, nshards == 1 ? "" : "s",
           written_dtype(&w) ? written_dtype(&w) : "no floats", tokenizer ? ", with the tokenizer" : "");
    for (int i = 0; i < t.n; i++) free(bufs[i]);
    hf_buffers_free(&keep);
    free(bufs), st_writer_free(&w), st_set_close(&s), free(t.p);
    return 0;
}

int cmd_convert(int argc, char **argv) {
    static struct option opts[] = {
        {"dtype", 1, 0, 'd'}, {"max-shard-size", 1, 0, 's'}, {"tokenizer", 1, 0, 't'}, {"help", 0, 0, 'h'}, {0}};
    const char *dtype = NULL, *tokenizer = NULL;
    size_t shard = (size_t)5 * 1000 * 1000 * 1000;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'd':
            if (strcmp(optarg, "bf16") && strcmp(optarg, "fp32"))
                die("convert: --dtype must be bf16 or fp32 (got '%s')", optarg);
            dtype = optarg;
            break;
        case 's': shard = parse_size(optarg); break;
        case 't': tokenizer = optarg; break;
        case 'h': convert_usage(stdout); return 0;
        default: arg_suggest_option(opts, argv), convert_usage(stderr); return 2;
        }
    }
    if (argc - optind != 3) {
        convert_usage(stderr);
        return 2;
    }
    const char *op = argv[optind], *src = argv[optind + 1], *dst = argv[optind + 2];
    if (strcmp(op, "hf2pith") && strcmp(op, "pith2hf"))
        die("convert: unknown direction '%s' (hf2pith or pith2hf; see pith convert --help)", op);
    if (!path_is_dir(src)) die("%s: not a folder", src);
    if (!strcmp(op, "hf2pith")) {
        if (tokenizer) die("convert: --tokenizer applies to pith2hf only");
        return hf2pith(src, dst, dtype);
    }
    char dir[4200]; // a save_location stands for its newest checkpoint, as in eval and generate
    arg_model_dir("convert", src, dir, sizeof dir);
    return pith2hf(dir, dst, dtype, shard, tokenizer);
}

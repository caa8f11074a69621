// eval.c — `pith eval`: the mean token cross-entropy of a model over the first B samples of a dataset,
// in file order with no shuffle (sample i = tokens[i·S : i·S+S], labels shifted by one; docs/reference.md §18).
// The samples go through the model (a Chunk of all its layers) in micro-batches of M, as in training; a last
// micro-batch of fewer samples is filled up with rows whose labels are all ignored (-100), which add neither loss
// nor targets.
#include <getopt.h>

#include "app/app.h"
#include "pipe/chunk.h"
#include "train/ckpt.h"
#include "train/data.h"

static void eval_usage(FILE *f) {
    fprintf(f, "usage: pith eval --model DIR --data PATH --seq S --batch B [--micro-batch M] [--device auto|cpu|cuda]\n"
               "                 [--dtype fp32|bf16]\n"
               "  DIR: an HF folder, a pith checkpoint folder (config.json + safetensors), or a save_location (its\n"
               "       newest checkpoint). PATH: a folder of .bin token files or one file.\n"
               "  --micro-batch M  samples per forward pass (default: B, at most 8)\n"
               "  --device         auto (default): the GPU when there is one\n"
               "  Prints the mean token cross-entropy over samples 0..B-1 as its last line: loss <value>.\n");
}

int cmd_eval(int argc, char **argv) {
    static struct option opts[] = {{"model", 1, 0, 'm'}, {"data", 1, 0, 'd'},        {"seq", 1, 0, 's'},
                                   {"batch", 1, 0, 'b'}, {"micro-batch", 1, 0, 'u'}, {"device", 1, 0, 'v'},
                                   {"dtype", 1, 0, 't'}, {"help", 0, 0, 'h'},        {0}};
    const char *model = NULL, *data = NULL, *device = "auto", *dtype = "fp32";
    int64_t S = 0, B = 0, M = 0;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'm': model = optarg; break;
        case 'd': data = optarg; break;
        case 's': S = arg_int("eval", "--seq", optarg, 1, 1 << 24); break;
        case 'b': B = arg_int("eval", "--batch", optarg, 1, (int64_t)1 << 40); break;
        case 'u': M = arg_int("eval", "--micro-batch", optarg, 1, 1 << 20); break;
        case 'v': device = optarg; break;
        case 't': dtype = optarg; break;
        case 'h': eval_usage(stdout); return 0;
        default: eval_usage(stderr); return 2;
        }
    }
    if (optind < argc) die("eval: unexpected argument '%s' (see pith eval --help)", argv[optind]);
    if (!model || !data) die("eval: --model and --data are required (see pith eval --help)");
    if (!S || !B) die("eval: --seq and --batch are required (see pith eval --help)");
    if (!M) M = B < 8 ? B : 8;
    if (M > B) M = B;
    if (M * S > INT32_MAX)
        die("eval: --micro-batch × --seq = %lld tokens is more than a micro-batch can hold", (long long)(M * S));
    if (strcmp(device, "auto") && strcmp(device, "cpu") && strcmp(device, "cuda"))
        die("eval: --device must be auto, cpu or cuda (got '%s')", device);
    if (strcmp(dtype, "fp32") && strcmp(dtype, "bf16")) die("eval: --dtype must be fp32 or bf16 (got '%s')", dtype);
    Device dev = DEV_CPU;
    if (!strcmp(device, "cuda") && !ops_cuda_available())
        die("eval: --device cuda: no usable GPU or no CUDA backend in this build");
    if (strcmp(device, "cpu") && ops_cuda_available()) dev = DEV_CUDA;
    if (!strcmp(dtype, "bf16") && dev == DEV_CPU) die("eval: --dtype bf16 needs the GPU (the CPU computes in fp32)");

    // A folder without config.json may be a save_location: its newest checkpoint (read only: a run may be saving).
    char dir[4200], cfg[4300];
    snprintf(dir, sizeof dir, "%s", model);
    snprintf(cfg, sizeof cfg, "%s/config.json", model);
    if (path_is_dir(model) && !path_exists(cfg)) {
        if (!ckpt_find_latest(model, dir, sizeof dir, false))
            die("%s: no config.json and no checkpoints (step-N folders): not a model folder or a save_location", model);
        printf("eval: %s is a save_location; its newest checkpoint is %s\n", model, dir);
    }
    ModelConfig mc;
    const ModelFamily *fam = model_config_load(&mc, dir);
    Model m;
    model_create(&m, fam, &mc, dev, compute_dt(dev, strcmp(dtype, "bf16") ? COMPUTE_FP32 : COMPUTE_BF16), (int)S);
    float *w[NGROUPS];
    for (int g = 0; g < NGROUPS; g++) w[g] = xmalloc(m.params.numel[g] * sizeof(float) + 1);
    ckpt_load_model(&m.params, w, dir);
    for (int g = 0; g < NGROUPS; g++) {
        op_copy(m.w[g], tensor_make(w[g], DT_F32, DEV_CPU, 1, m.params.numel[g], 1, 1, 1));
        free(w[g]);
    }
    Dataset ds;
    dataset_open(&ds, data, (int)S, mc.vocab, 0);
    ds.ordered = true;
    if (B > ds.total)
        die("%s: --batch %lld asks for more samples than the data holds (%lld samples of %lld tokens)", data,
            (long long)B, (long long)ds.total, (long long)S);
    Chunk e;
    chunk_init_model(&e, &m, (int)M, (int)S);
    int32_t *tok = xmalloc(M * S * sizeof(int32_t)), *lab = xmalloc(M * S * sizeof(int32_t));
    op_zero(m.loss_sum);
    int64_t targets = 0;
    for (int64_t i = 0; i < B; i += M) {
        int64_t n = B - i < M ? B - i : M;
        for (int64_t b = 0; b < n; b++) dataset_sample(&ds, i + b, tok + b * S, lab + b * S);
        for (int64_t t = n * S; t < M * S; t++) tok[t] = 0, lab[t] = -100; // filler rows: no targets
        for (int64_t t = 0; t < n * S; t++) targets += lab[t] != -100;
        chunk_load(&e, 0, tok, lab);
        chunk_forward(&e, 0, false);
    }
    printf("eval: %lld samples of %lld tokens (%lld targets) in %lld micro-batch%s of %lld on %s (%s)\n", (long long)B,
           (long long)S, (long long)targets, (long long)((B + M - 1) / M), (B + M - 1) / M == 1 ? "" : "es",
           (long long)M, dev == DEV_CUDA ? "cuda" : "cpu", dtype);
    printf("loss %.17g\n", op_read_scalar(m.loss_sum) / (double)(targets ? targets : 1));
    free(tok), free(lab);
    chunk_free(&e), dataset_close(&ds), model_free(&m);
    return 0;
}

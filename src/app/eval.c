// eval.c — `pith eval`: the mean token cross-entropy of a model over the first B samples of a dataset,
// in file order with no shuffle (sample i = tokens[i·S : i·S+S], labels shifted by one; docs/reference.md §18).
#include <getopt.h>

#include "app/app.h"
#include "pipe/chunk.h"
#include "train/ckpt.h"
#include "train/data.h"

static void eval_usage(FILE *f) {
    fprintf(f, "usage: pith eval --model DIR --data PATH --seq S --batch B [--device cpu|cuda] [--dtype fp32|bf16]\n"
               "  DIR: an HF folder or a pith checkpoint folder (config.json + safetensors).\n"
               "  Prints the mean token cross-entropy over samples 0..B-1 as its last line: loss <value>.\n");
}

int cmd_eval(int argc, char **argv) {
    static struct option opts[] = {
        {"model", 1, 0, 'm'},  {"data", 1, 0, 'd'},  {"seq", 1, 0, 's'},  {"batch", 1, 0, 'b'},
        {"device", 1, 0, 'v'}, {"dtype", 1, 0, 't'}, {"help", 0, 0, 'h'}, {0}};
    const char *model = NULL, *data = NULL, *device = "cpu", *dtype = "fp32";
    long S = 0, B = 0;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'm': model = optarg; break;
        case 'd': data = optarg; break;
        case 's': S = atol(optarg); break;
        case 'b': B = atol(optarg); break;
        case 'v': device = optarg; break;
        case 't': dtype = optarg; break;
        case 'h': eval_usage(stdout); return 0;
        default: eval_usage(stderr); return 2;
        }
    }
    if (!model || !data) die("eval: --model and --data are required (see pith eval --help)");
    if (S <= 0 || B <= 0) die("eval: --seq and --batch must be positive integers");
    if (strcmp(device, "cpu") && strcmp(device, "cuda")) die("eval: --device must be cpu or cuda (got '%s')", device);
    if (strcmp(dtype, "fp32") && strcmp(dtype, "bf16")) die("eval: --dtype must be fp32 or bf16 (got '%s')", dtype);
    Device dev = DEV_CPU;
    if (!strcmp(device, "cuda")) {
        if (!ops_cuda_available()) die("eval: --device cuda: no usable GPU or no CUDA backend in this build");
        dev = DEV_CUDA;
    }
    ModelConfig mc;
    const ModelFamily *fam = model_config_load(&mc, model);
    Model m;
    model_create(&m, fam, &mc, dev, compute_dt(dev, strcmp(dtype, "bf16") ? COMPUTE_FP32 : COMPUTE_BF16), (int)S);
    float *w[NGROUPS];
    for (int g = 0; g < NGROUPS; g++) w[g] = xmalloc(m.params.numel[g] * sizeof(float) + 1);
    ckpt_load_model(&m.params, w, model);
    for (int g = 0; g < NGROUPS; g++) {
        op_copy(m.w[g], tensor_make(w[g], DT_F32, DEV_CPU, 1, m.params.numel[g], 1, 1, 1));
        free(w[g]);
    }
    Dataset ds;
    dataset_open(&ds, data, (int)S, mc.vocab, 0);
    ds.ordered = true;
    if (B > ds.total)
        die("%s: --batch %ld asks for more samples than the data holds (%lld of %ld tokens)", data, B,
            (long long)ds.total, S);
    Chunk e;
    chunk_init_model(&e, &m, 1, (int)S);
    int32_t *tok = xmalloc(S * sizeof(int32_t)), *lab = xmalloc(S * sizeof(int32_t));
    op_zero(m.loss_sum);
    int64_t targets = 0;
    for (long i = 0; i < B; i++) {
        dataset_sample(&ds, i, tok, lab);
        for (long t = 0; t < S; t++) targets += lab[t] != -100;
        chunk_load(&e, 0, tok, lab);
        chunk_forward(&e, 0, false);
    }
    printf("samples %ld, tokens %lld\n", B, (long long)targets);
    printf("loss %.17g\n", op_read_scalar(m.loss_sum) / (double)(targets ? targets : 1));
    free(tok), free(lab);
    chunk_free(&e), dataset_close(&ds), model_free(&m);
    return 0;
}

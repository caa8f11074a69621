// eval.c — `pith eval`: the mean token cross-entropy of a model over the first B samples of a dataset,
// in file order with no shuffle (sample i = tokens[i·S : i·S+S], labels shifted by one; docs/reference.md §18).
#include <getopt.h>

#include "app/app.h"
#include "parallel/mesh.h"
#include "pipe/chunk.h"
#include "pipe/dualpipev.h"
#include "train/ckpt.h"
#include "train/data.h"

static void eval_usage(FILE *f) {
    fprintf(f, "usage: pith eval --model DIR --data PATH --seq S --batch B [--device cpu|cuda] [--dtype fp32|bf16]\n"
               "                 [--pp P]\n"
               "  DIR: an HF folder or a pith checkpoint folder (config.json + safetensors).\n"
               "  Prints the mean token cross-entropy over samples 0..B-1 as its last line: loss <value>.\n"
               "  --pp P  run the samples through a DualPipeV pipeline of P ranks, forward only (start it under\n"
               "          mpirun/srun with P ranks; each holds its two chunks' weights; B >= 2P)\n");
}

// The pipeline's forward (pp > 1): sample mb is a micro-batch of one sequence; the model's first chunk reads
// its tokens, the last its labels and counts its targets.
typedef struct {
    Chunk chunk[2];
    Dataset *ds;
    int32_t *tok, *lab;
    int64_t targets;
} EvalPipe;

static void eval_forward(void *ctx, int p, int mb, int slot, Tensor x, Tensor y) {
    EvalPipe *e = ctx;
    Chunk *c = &e->chunk[p];
    bool last = c->l1 == c->m->cfg.layers;
    if (c->l0 == 0 || last) {
        dataset_sample(e->ds, mb, e->tok, e->lab);
        chunk_load(c, slot, e->tok, e->lab);
        for (int t = 0; last && t < c->S; t++) e->targets += e->lab[t] != -100;
    }
    chunk_pipe_forward(c, slot, x, y, false);
}

// Σ CE of samples 0..B-1 into m->loss_sum through the forward-only schedule of pipeline rank pp->rank;
// returns the targets this rank counted (rank 0's are all of them).
static int64_t eval_pipeline(Model *m, Dataset *ds, int S, int B, const Comm *pp) {
    PipeSchedule s;
    dualpipev_build(&s, pp->size, B, pp->rank, true);
    EvalPipe e = {.ds = ds, .tok = xmalloc(S * sizeof(int32_t)), .lab = xmalloc(S * sizeof(int32_t))};
    int n = m->cfg.layers / (2 * pp->size);
    for (int p = 0; p < 2; p++) {
        int k = dualpipev_chunk(pp->size, pp->rank, p);
        chunk_init(&e.chunk[p], m, 1, S, k * n, (k + 1) * n, s.slots[PIPE_REC][p], 0);
    }
    Arena count = arena_counting("pipeline buffers", m->dev);
    PipeRun run;
    dualpipev_run_init(&run, &s, pp, &count, m->cdt, S, m->cfg.hidden);
    dualpipev_run_free(&run);
    Arena mem = arena_create("pipeline buffers", m->dev, count.peak);
    dualpipev_run_init(&run, &s, pp, &mem, m->cdt, S, m->cfg.hidden);
    dualpipev_run(&run, &(PipeChunks){&e, eval_forward, NULL, NULL, NULL});
    dualpipev_run_free(&run), arena_destroy(&mem), dualpipev_free(&s);
    for (int p = 0; p < 2; p++) chunk_free(&e.chunk[p]);
    free(e.tok), free(e.lab);
    return e.targets;
}

int cmd_eval(int argc, char **argv) {
    static struct option opts[] = {{"model", 1, 0, 'm'}, {"data", 1, 0, 'd'},   {"seq", 1, 0, 's'},
                                   {"batch", 1, 0, 'b'}, {"device", 1, 0, 'v'}, {"dtype", 1, 0, 't'},
                                   {"pp", 1, 0, 'p'},    {"help", 0, 0, 'h'},   {0}};
    const char *model = NULL, *data = NULL, *device = "cpu", *dtype = "fp32";
    long S = 0, B = 0, P = 1;
    int c;
    optind = 1;
    dist_launch(); // MPI_Init when mpirun/srun started this process
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'm': model = optarg; break;
        case 'd': data = optarg; break;
        case 's': S = atol(optarg); break;
        case 'b': B = atol(optarg); break;
        case 'v': device = optarg; break;
        case 't': dtype = optarg; break;
        case 'p': P = atol(optarg); break;
        case 'h': eval_usage(stdout); return 0;
        default: eval_usage(stderr); return 2;
        }
    }
    if (!model || !data) die("eval: --model and --data are required (see pith eval --help)");
    if (S <= 0 || B <= 0) die("eval: --seq and --batch must be positive integers");
    if (B > 1 << 30) die("eval: --batch must be at most 2^30 (got %ld)", B);
    if (strcmp(device, "cpu") && strcmp(device, "cuda")) die("eval: --device must be cpu or cuda (got '%s')", device);
    if (strcmp(dtype, "fp32") && strcmp(dtype, "bf16")) die("eval: --dtype must be fp32 or bf16 (got '%s')", dtype);
    if (P < 1 || P != dist_world_size())
        die("eval: --pp %ld: the pipeline needs as many ranks as started (%d); start --pp P under mpirun -np P", P,
            dist_world_size());
    if (dist_world_rank() != 0 && !freopen("/dev/null", "w", stdout))
        die("cannot silence stdout of rank %d", dist_world_rank());
    Dist d;
    dist_mesh_init(&d, (int)P, 1, 1, false, 900, "eval");
    Device dev = DEV_CPU;
    if (!strcmp(device, "cuda")) {
        if (!ops_cuda_available()) die("eval: --device cuda: no usable GPU or no CUDA backend in this build");
        dev = DEV_CUDA;
        dist_mesh_gpu(&d);
    }
    ModelConfig mc;
    const ModelFamily *fam = model_config_load(&mc, model);
    if (P > 1) {
        const char *why = dualpipev_check((int)P, (int)B, mc.layers);
        if (why) die("eval: --pp %ld with --batch %ld: %s", P, B, why);
        mc.pp_rank = d.pp_g.rank, mc.pp_size = (int)P;
    }
    Model m;
    model_create(&m, fam, &mc, dev, compute_dt(dev, strcmp(dtype, "bf16") ? COMPUTE_FP32 : COMPUTE_BF16), (int)S);
    float *w[NGROUPS];
    for (int g = 0; g < NGROUPS; g++) w[g] = xmalloc(m.params.numel[g] * sizeof(float) + 1);
    ParamTable all;
    model_params_all(&m, &all);
    ckpt_load_model_part(&all, &m.params, w, model);
    free(all.p);
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
    op_zero(m.loss_sum);
    int64_t targets = 0;
    if (P > 1) targets = eval_pipeline(&m, &ds, (int)S, (int)B, &d.pp_g);
    else {
        Chunk e;
        chunk_init_model(&e, &m, 1, (int)S);
        int32_t *tok = xmalloc(S * sizeof(int32_t)), *lab = xmalloc(S * sizeof(int32_t));
        for (long i = 0; i < B; i++) {
            dataset_sample(&ds, i, tok, lab);
            for (long t = 0; t < S; t++) targets += lab[t] != -100;
            chunk_load(&e, 0, tok, lab);
            chunk_forward(&e, 0, false);
        }
        free(tok), free(lab), chunk_free(&e);
    }
    // The cross-entropy and the targets live on pipeline rank 0; the sum over the ranks brings them to all.
    double sums[2] = {op_read_scalar(m.loss_sum), (double)targets};
    comm_allreduce(&d.world, tensor_make(sums, DT_F64, DEV_CPU, 1, 2, 1, 1, 1), COMM_SUM);
    printf("samples %ld, tokens %lld\n", B, (long long)sums[1]);
    printf("loss %.17g\n", sums[0] / (sums[1] ? sums[1] : 1));
    dataset_close(&ds), model_free(&m), dist_mesh_free(&d);
    dist_finalize();
    return 0;
}

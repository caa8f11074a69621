// eval.c — `pith eval`: the mean token cross-entropy of a model over the first B samples of a dataset,
// in file order with no shuffle (sample i = tokens[i·S : i·S+S], labels shifted by one; docs/reference.md §18).
// On one rank the samples go through the model (a Chunk of all its layers) in micro-batches of M, as in training;
// a last micro-batch of fewer samples is filled up with rows whose labels are all ignored (-100), which add
// neither loss nor targets. With --cp C every rank of the cp group reads the same samples and keeps its zigzag
// chunks of each (as training does); the sums over the ranks give the one-rank loss. With --per-token each target's
// loss is kept (the epilog's per-row output), put back at its place in its sample and summed over the ranks.
// With --document-masking the token files' document ends bound attention and positions, as in training.
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <unistd.h>

#include "app/app.h"
#include "base/npy.h"
#include "pipe/chunk.h"
#include "pipe/dualpipev.h"
#include "train/data.h"

static void eval_usage(FILE *f) {
    fprintf(f, "usage: pith eval --model DIR --data PATH --seq S --batch B [--micro-batch M] [--device auto|cpu|cuda]\n"
               "                 [--dtype fp32|bf16] [--pp P] [--cp C] [--per-token FILE] [--document-masking]\n"
               "  DIR: an HF folder, a pith checkpoint folder (config.json + safetensors), or a save_location (its\n"
               "       newest checkpoint). PATH: a folder of .bin token files or one file.\n"
               "  Prints the mean token cross-entropy over samples 0..B-1 as its last line: loss <value>.\n"
               "  --micro-batch M  samples per forward pass on one rank (default: B, at most 8)\n"
               "  --device         auto (default): the GPU when there is one\n"
               "  --pp P  run the samples through a DualPipeV pipeline of P ranks, forward only (start it under\n"
               "          mpirun/srun with P ranks; each holds its two chunks' weights; B >= 2P)\n"
               "  --cp C  context parallelism over C ranks (P × C ranks in all; 2C divides S): each holds its zigzag\n"
               "          chunks of every sample\n"
               "  --per-token FILE  writes each target's loss as a float32 .npy of shape (B, S): row i is sample i,\n"
               "          column t the loss of its label t (token t + 1 of the sample); NaN where the label is masked\n"
               "  --document-masking  each token attends only to its own document (the files' document ends) and\n"
               "          counts its position from the document's first token (as document_masking trains)\n");
}

// The pipeline's forward (pp > 1): sample mb is a micro-batch of one sequence; the model's first chunk reads
// its tokens, the last its labels and counts its targets; with document masking every chunk reads its positions.
typedef struct {
    Chunk chunk[2];
    Dataset *ds;
    const Comm *cp;
    int32_t *tok, *lab; // a whole sample (S), of which this cp rank keeps its chunks
    int32_t *docpos;    // its document positions (document masking; else NULL)
    int64_t targets;
    StepSums *st;
    double *per_token; // (B, S) --per-token: the rows' losses at their places (NULL: not kept)
} EvalPipe;

// Adds the epilog's row losses of n samples (Sl rows each, this cp rank's zigzag chunks) into per_token's rows of
// samples i0.., at each row's place in the whole sample.
static void keep_rows(const StepSums *st, double *per_token, int64_t i0, int64_t n, int Sl, const Comm *cp) {
    double *rows = xmalloc(n * Sl * sizeof *rows);
    op_copy(tensor_make(rows, DT_F64, DEV_CPU, 1, n * Sl, 1, 1, 1), tensor_rows(st->row_loss, 0, n * Sl));
    int blk = Sl / 2, S = Sl * cp->size;
    for (int64_t b = 0; b < n; b++)
        for (int t = 0; t < Sl; t++) { // local chunk 0 is chunk r of the sample, 1 is chunk 2·cp − 1 − r
            int chunk = cp->size == 1 ? 0 : t < blk ? cp->rank : 2 * cp->size - 1 - cp->rank;
            per_token[(i0 + b) * S + (cp->size == 1 ? t : chunk * blk + t % blk)] += rows[b * Sl + t];
        }
    free(rows);
}

static void eval_forward(void *ctx, int p, int mb, int slot, Tensor x, Tensor y) {
    EvalPipe *e = ctx;
    Chunk *c = &e->chunk[p];
    bool last = c->l1 == c->m->cfg.layers;
    if (c->l0 == 0 || last || e->docpos) {
        dataset_sample_docs(e->ds, mb, e->tok, e->lab, e->docpos);
        int S = c->S * e->cp->size;
        dataset_zigzag(e->tok, 1, S, e->cp->size, e->cp->rank), dataset_zigzag(e->lab, 1, S, e->cp->size, e->cp->rank);
        if (e->docpos) dataset_zigzag(e->docpos, 1, S, e->cp->size, e->cp->rank);
        chunk_load_docs(c, slot, e->tok, e->lab, e->docpos);
        for (int t = 0; last && t < c->S; t++) e->targets += e->lab[t] != -100;
    }
    chunk_pipe_forward(c, slot, x, y, false);
    if (last && e->per_token) keep_rows(e->st, e->per_token, mb, 1, c->S, e->cp);
}

// Σ CE of samples 0..B-1 (S local rows of each) into st->loss_sum through the forward-only schedule of pipeline rank
// pp->rank; returns the targets this rank counted (pipeline rank 0's are all of its cp rank's).
static int64_t eval_pipeline(Model *m, StepSums *st, Dataset *ds, int S, int B, const Comm *pp, const Comm *cp,
                             double *per_token, bool docs) {
    PipeSchedule s;
    dualpipev_build(&s, pp->size, B, pp->rank, true);
    size_t whole = (size_t)S * cp->size * sizeof(int32_t);
    EvalPipe e = {.ds = ds,
                  .cp = cp,
                  .tok = xmalloc(whole),
                  .lab = xmalloc(whole),
                  .st = st,
                  .per_token = per_token,
                  .docpos = docs ? xmalloc(whole) : NULL};
    int n = m->cfg.layers / (2 * pp->size);
    for (int p = 0; p < 2; p++) {
        int k = dualpipev_chunk(pp->size, pp->rank, p);
        chunk_init(&e.chunk[p], m, st, 1, S, k * n, (k + 1) * n, s.slots[PIPE_REC][p], 0);
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
    free(e.tok), free(e.lab), free(e.docpos);
    return e.targets;
}

// The ranks' row losses summed (each position is one rank's), then on rank 0 as float32 with NaN where sample i's
// label t is masked, written under a temporary name and renamed.
static void write_per_token(const char *path, double *per_token, Dataset *ds, int64_t B, int64_t S, const Comm *world) {
    comm_allreduce(world, tensor_make(per_token, DT_F64, DEV_CPU, 1, B * S, 1, 1, 1), COMM_SUM);
    if (world->rank) return;
    float *out = xmalloc(B * S * sizeof *out);
    int32_t *tok = xmalloc(S * sizeof *tok), *lab = xmalloc(S * sizeof *lab);
    for (int64_t i = 0; i < B; i++) {
        dataset_sample(ds, i, tok, lab);
        for (int64_t t = 0; t < S; t++) out[i * S + t] = lab[t] == -100 ? NAN : (float)per_token[i * S + t];
    }
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) die("%s: cannot write: %s", tmp, strerror(errno));
    bool ok = npy_write_header_2d(f, DT_F32, B, S) && fwrite(out, sizeof *out, B * S, f) == (size_t)(B * S);
    if (fclose(f) || !ok || rename(tmp, path)) unlink(tmp), die("%s: cannot write: %s", path, strerror(errno));
    printf("eval: per-token losses (%lld, %lld) float32 in %s\n", (long long)B, (long long)S, path);
    free(out), free(tok), free(lab);
}

int cmd_eval(int argc, char **argv) {
    static struct option opts[] = {{"model", 1, 0, 'm'},
                                   {"data", 1, 0, 'd'},
                                   {"seq", 1, 0, 's'},
                                   {"batch", 1, 0, 'b'},
                                   {"micro-batch", 1, 0, 'u'},
                                   {"device", 1, 0, 'v'},
                                   {"dtype", 1, 0, 't'},
                                   {"pp", 1, 0, 'p'},
                                   {"cp", 1, 0, 'c'},
                                   {"per-token", 1, 0, 'k'},
                                   {"document-masking", 0, 0, 'D'},
                                   {"help", 0, 0, 'h'},
                                   {0}};
    const char *model = NULL, *data = NULL, *device = "auto", *dtype = "fp32", *per_token_path = NULL;
    int64_t S = 0, B = 0, M = 0, P = 1, C = 1;
    bool docs = false;
    int c;
    optind = 1;
    dist_launch(); // MPI_Init when mpirun/srun started this process
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'm': model = optarg; break;
        case 'd': data = optarg; break;
        case 's': S = arg_int("eval", "--seq", optarg, 1, 1 << 24); break;
        case 'b': B = arg_int("eval", "--batch", optarg, 1, 1 << 30); break;
        case 'u': M = arg_int("eval", "--micro-batch", optarg, 1, 1 << 20); break;
        case 'v': device = optarg; break;
        case 't': dtype = optarg; break;
        case 'p': P = arg_int("eval", "--pp", optarg, 1, 1 << 20); break;
        case 'c': C = arg_int("eval", "--cp", optarg, 1, 1 << 20); break;
        case 'k': per_token_path = optarg; break;
        case 'D': docs = true; break;
        case 'h': eval_usage(stdout); return 0;
        default: arg_suggest_option(opts, argv), eval_usage(stderr); return 2;
        }
    }
    if (optind < argc) die("eval: unexpected argument '%s' (see pith eval --help)", argv[optind]);
    if (!model || !data) die("eval: --model and --data are required (see pith eval --help)");
    if (!S || !B) die("eval: --seq and --batch are required (see pith eval --help)");
    if (P > 1 && M > 1) die("eval: --micro-batch applies to one rank (the pipeline runs one sample per micro-batch)");
    if (!M) M = P > 1 ? 1 : B < 8 ? B : 8;
    if (M > B) M = B;
    if (M * S > INT32_MAX)
        die("eval: --micro-batch × --seq = %lld tokens is more than a micro-batch can hold", (long long)(M * S));
    if (strcmp(dtype, "fp32") && strcmp(dtype, "bf16")) die("eval: --dtype must be fp32 or bf16 (got '%s')", dtype);
    if (P * C != dist_world_size())
        die("eval: --pp %lld × --cp %lld: the layout needs as many ranks as started (%d); start it under mpirun -np "
            "P·C",
            (long long)P, (long long)C, dist_world_size());
    if (S % (2 * C))
        die("eval: --cp %lld: --seq %lld is not a multiple of 2 × cp = %lld (the zigzag layout)", (long long)C,
            (long long)S, (long long)(2 * C));
    if (dist_world_rank() != 0 && !freopen("/dev/null", "w", stdout))
        die("cannot silence stdout of rank %d", dist_world_rank());
    Dist d;
    dist_mesh_init(&d, (int)P, (int)C, 1, false, 900, "eval");
    Device dev = arg_device("eval", device);
    if (dev == DEV_CUDA) dist_mesh_gpu(&d);
    if (!strcmp(dtype, "bf16") && dev == DEV_CPU) die("eval: --dtype bf16 needs the GPU (the CPU computes in fp32)");

    char dir[4200];
    arg_model_dir("eval", model, dir, sizeof dir);
    ModelConfig mc;
    const ModelFamily *fam = model_config_load(&mc, dir);
    if (P > 1) {
        const char *why = dualpipev_check((int)P, (int)B, mc.layers);
        if (why) die("eval: --pp %lld with --batch %lld: %s", (long long)P, (long long)B, why);
        mc.pp_rank = d.pp_g.rank, mc.pp_size = (int)P;
    }
    char why_cp[256];
    if (ring_check(&mc.ring, mc.model_type, (int)S, (int)C, why_cp, sizeof why_cp))
        die("eval: --cp %lld: %s", (long long)C, why_cp);
    mc.cp_size = (int)C;
    int Sl = (int)(S / C); // this rank's rows of a sample
    Model m;
    model_create(&m, fam, &mc, dev, compute_dt(dev, strcmp(dtype, "bf16") ? COMPUTE_FP32 : COMPUTE_BF16), (int)S);
    Ring ring = {0};
    if (C > 1)
        ring_init(&ring, &d.cp_g, dev, ring_plan_bytes(&mc.ring, mc.hidden, dev, m.cdt, P > 1 ? 1 : (int)M, Sl)),
            m.ring = &ring;
    arg_load_weights(&m, dir);
    Dataset ds;
    dataset_open(&ds, data, (int)S, mc.vocab, 0);
    ds.ordered = true;
    if (B > ds.total)
        die("%s: --batch %lld asks for more samples than the data holds (%lld samples of %lld tokens)", data,
            (long long)B, (long long)ds.total, (long long)S);
    StepSums st;
    step_sums_create(&st, &m, true);
    double *per_token = per_token_path ? xcalloc(B * S, sizeof *per_token) : NULL;
    if (per_token) st.row_loss = model_tensor(dev, DT_F64, (P > 1 ? 1 : M) * Sl, true);
    int64_t targets = 0;
    if (P > 1) targets = eval_pipeline(&m, &st, &ds, Sl, (int)B, &d.pp_g, &d.cp_g, per_token, docs);
    else {
        Chunk e;
        chunk_init_model(&e, &m, &st, (int)M, Sl);
        int32_t *tok = xmalloc(M * S * sizeof(int32_t)), *lab = xmalloc(M * S * sizeof(int32_t));
        int32_t *docpos = docs ? xmalloc(M * S * sizeof(int32_t)) : NULL;
        for (int64_t i = 0; i < B; i += M) {
            int64_t n = B - i < M ? B - i : M;
            for (int64_t b = 0; b < n; b++)
                dataset_sample_docs(&ds, i + b, tok + b * S, lab + b * S, docpos ? docpos + b * S : NULL);
            for (int64_t t = n * S; t < M * S; t++) { // filler rows: no targets, one document each
                tok[t] = 0, lab[t] = -100;
                if (docpos) docpos[t] = (int32_t)(t % S);
            }
            dataset_zigzag(tok, (int)M, (int)S, (int)C, d.cp_g.rank),
                dataset_zigzag(lab, (int)M, (int)S, (int)C, d.cp_g.rank);
            if (docpos) dataset_zigzag(docpos, (int)M, (int)S, (int)C, d.cp_g.rank);
            for (int64_t t = 0; t < M * Sl; t++) targets += lab[t] != -100;
            chunk_load_docs(&e, 0, tok, lab, docpos);
            chunk_forward(&e, 0, false);
            if (per_token) keep_rows(&st, per_token, i, n, Sl, &d.cp_g);
        }
        free(tok), free(lab), free(docpos), chunk_free(&e);
    }
    // The cross-entropy and the targets live on pipeline rank 0, each cp rank's of its chunks; the sum over the ranks
    // brings them to all.
    double sums[2] = {op_read_scalar(st.loss_sum), (double)targets};
    step_sums_free(&st);
    comm_allreduce(&d.world, tensor_make(sums, DT_F64, DEV_CPU, 1, 2, 1, 1, 1), COMM_SUM);
    if (per_token) write_per_token(per_token_path, per_token, &ds, B, S, &d.world), free(per_token);
    int64_t nmb = (B + M - 1) / M;
    printf("eval: %lld samples of %lld tokens (%lld targets) in %lld micro-batch%s of %lld", (long long)B, (long long)S,
           (long long)sums[1], (long long)nmb, nmb == 1 ? "" : "es", (long long)M);
    if (P > 1) printf(" through a pipeline of %lld ranks", (long long)P);
    if (C > 1) printf(" at cp %lld", (long long)C);
    if (docs) printf(" with document masking");
    printf(" on %s (%s)\n", dev == DEV_CUDA ? "cuda" : "cpu", dtype);
    printf("loss %.17g\n", sums[0] / (sums[1] ? sums[1] : 1));
    if (C > 1) ring_free(&ring);
    dataset_close(&ds), model_free(&m), dist_mesh_free(&d);
    dist_finalize();
    return 0;
}

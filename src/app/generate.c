// generate.c — `pith generate`: text from a prompt, token by token (docs/architecture.md, "Generation"). The
// prompt runs through the model once, filling the KV cache (model_attention_forward); each further token runs
// alone at its position against the cache; the final norm and LM head of the last position give the logits that
// gen_sample draws the next token from. Tokens are decoded as they come and written to stdout.
#include "app/generate.h"

#include <getopt.h>
#include <math.h>

#include "app/app.h"
#include "base/bpe.h"
#include "train/ckpt.h"

void gen_init(Generator *g, Model *m, int prompt, int cap) {
    CHECK(prompt >= 1 && prompt <= cap);
    memset(g, 0, sizeof *g);
    g->m = m;
    g->kv.cap = cap;
    chunk_init_model(&g->first, m, NULL, 1, prompt); // no losses or counts: no step
    chunk_init_model(&g->next, m, NULL, 1, 1);
    // The logits of one row: its norm (H) and logits (V) in the compute dtype, rstd, their alignment.
    g->ws = arena_create("generation logits", m->dev,
                         (size_t)(m->cfg.hidden + m->cfg.vocab + 1) * sizeof(float) + 4 * ARENA_ALIGN);
    g->logits = xmalloc(sizeof(float) * m->cfg.vocab);
}

void gen_feed(Generator *g, const int32_t *tokens, int n) {
    Model *m = g->m;
    if (g->kv.len && g->first.m) chunk_free(&g->first); // the prompt's records are not needed again
    Chunk *e = g->kv.len == 0 ? &g->first : &g->next;
    CHECK(n == e->S && g->kv.len + n <= g->kv.cap);
    int32_t *labels = xmalloc(sizeof(int32_t) * n);
    for (int t = 0; t < n; t++) labels[t] = -100; // no loss: the epilog does not run
    chunk_load(e, 0, tokens, labels);
    free(labels);
    if (g->kv.len) { // the one-token chunk's position (the prompt's chunk has 0 .. n − 1 already)
        int32_t pos = g->kv.len;
        op_copy(e->rec[0].mb.pos, tensor_make(&pos, DT_I32, DEV_CPU, 1, 1, 1, 1, 1));
    }
    m->kv = &g->kv;
    chunk_forward_layers(e, 0);
    m->kv = NULL;
    g->kv.len += n;
    moe_logits(m, tf32_2(g->logits, 1, m->cfg.vocab), tensor_rows(chunk_output(e, 0), n - 1, 1), &g->ws);
}

void gen_free(Generator *g) {
    if (g->first.m) chunk_free(&g->first);
    chunk_free(&g->next);
    kv_cache_free(&g->kv);
    arena_destroy(&g->ws);
    free(g->logits);
    memset(g, 0, sizeof *g);
}

// Most likely first, the lower id first among equal probabilities (qsort_r's context: the probabilities).
static int by_prob(const void *a, const void *b, void *ctx) {
    const double *p = ctx;
    int i = *(const int *)a, j = *(const int *)b;
    return p[i] > p[j] ? -1 : p[i] < p[j] ? 1 : i - j;
}

int gen_sample(const float *logits, int V, double temperature, double top_p, Rng *rng) {
    int best = 0;
    for (int i = 1; i < V; i++)
        if (logits[i] > logits[best]) best = i;
    if (temperature <= 0) return best;
    // p_i ∝ exp((l_i − l_max)/T), in fp64; `order` lists the ids the draw chooses from, `n` of them.
    double *p = xmalloc(sizeof(double) * V), sum = 0, kept = 0;
    int *order = xmalloc(sizeof(int) * V), n = 0;
    for (int i = 0; i < V; i++) p[i] = exp(((double)logits[i] - logits[best]) / temperature), sum += p[i], order[i] = i;
    if (top_p < 1) {
        qsort_r(order, V, sizeof(int), by_prob, p);
        while (n < V && (n == 0 || kept < top_p * sum)) kept += p[order[n++]];
    } else {
        n = V, kept = sum;
    }
    double u = (double)(rng_next(rng) >> 11) * 0x1.0p-53 * kept; // uniform in [0, kept)
    int id = order[n - 1];
    for (int i = 0; i < n; i++)
        if ((u -= p[order[i]]) < 0) {
            id = order[i];
            break;
        }
    free(p), free(order);
    return id;
}

// ---- the command ----

static void generate_usage(FILE *f) {
    fprintf(f, "usage: pith generate --model DIR --tokenizer PATH --prompt TEXT [-n N] [--temperature T] [--top-p P]\n"
               "                     [--seed S] [--device auto|cpu|cuda] [--dtype fp32|bf16]\n"
               "  DIR: a pith checkpoint folder (step-N), a save_location (its newest checkpoint) or an HF folder.\n"
               "  PATH: tokenizer.json or a folder holding it. Writes the prompt and then each new token as it comes.\n"
               "  -n N: at most N new tokens (default 64; generation stops early at the tokenizer's EOS).\n"
               "  --temperature T: 0 is greedy (argmax); default 1. --top-p P in (0, 1]: sample only from the most\n"
               "  likely tokens that together hold P of the probability (default 1). --seed S: the draws (default 0).\n"
               "  --device: auto (default): the GPU when there is one. --dtype: GPU compute dtype (default fp32).\n");
}

int cmd_generate(int argc, char **argv) {
    static struct option opts[] = {{"model", 1, 0, 'm'},  {"tokenizer", 1, 0, 'k'},
                                   {"prompt", 1, 0, 'p'}, {"temperature", 1, 0, 't'},
                                   {"top-p", 1, 0, 'P'},  {"seed", 1, 0, 's'},
                                   {"device", 1, 0, 'v'}, {"dtype", 1, 0, 'd'},
                                   {"help", 0, 0, 'h'},   {0}};
    const char *model = NULL, *tokenizer = NULL, *prompt = NULL, *device = "auto", *dtype = "fp32";
    int64_t n_new = 64, seed = 0;
    double temperature = 1, top_p = 1;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "n:", opts, NULL)) != -1) {
        switch (c) {
        case 'm': model = optarg; break;
        case 'k': tokenizer = optarg; break;
        case 'p': prompt = optarg; break;
        case 'n': n_new = arg_int("generate", "-n", optarg, 1, 1 << 20); break;
        case 't': temperature = arg_num("generate", "--temperature", optarg, 0, 1e6); break;
        case 'P': top_p = arg_num("generate", "--top-p", optarg, 0, 1); break;
        case 's': seed = arg_int("generate", "--seed", optarg, 0, INT64_MAX); break;
        case 'v': device = optarg; break;
        case 'd': dtype = optarg; break;
        case 'h': generate_usage(stdout); return 0;
        default: arg_suggest_option(opts, argv), generate_usage(stderr); return 2;
        }
    }
    if (optind < argc) die("generate: unexpected argument '%s' (see pith generate --help)", argv[optind]);
    if (!model || !tokenizer || !prompt)
        die("generate: --model, --tokenizer and --prompt are required (see pith generate --help)");
    if (!(top_p > 0)) die("generate: --top-p must be above 0 (got %g)", top_p);
    if (strcmp(dtype, "fp32") && strcmp(dtype, "bf16")) die("generate: --dtype must be fp32 or bf16 (got '%s')", dtype);
    Device dev = arg_device("generate", device);
    char dir[4200];
    arg_model_dir("generate", model, dir, sizeof dir);
    model = dir;

    Bpe *tok = bpe_load(tokenizer);
    BpeScratch *scratch = bpe_scratch_new(tok);
    IdVec ids = {0};
    bpe_encode(tok, scratch, prompt, strlen(prompt), true, &ids);
    if (!ids.n) die("generate: --prompt gives no tokens (an empty prompt has nothing to continue)");
    ModelConfig mc;
    const ModelFamily *fam = model_config_load(&mc, model);
    for (size_t i = 0; i < ids.n; i++)
        if (ids.p[i] >= (uint32_t)mc.vocab)
            die("%s: the prompt's token %u is outside the model's vocabulary (vocab_size %d in %s): not this model's "
                "tokenizer?",
                tokenizer, ids.p[i], mc.vocab, model);
    int P = (int)ids.n, cap = P + (int)n_new;
    Model m;
    model_create_forward(&m, fam, &mc, dev, compute_dt(dev, strcmp(dtype, "bf16") ? COMPUTE_FP32 : COMPUTE_BF16), cap);
    arg_load_weights(&m, model);
    // A checkpoint trained with aux-loss-free balancing routes with its selection biases (run.json).
    float *bias = xmalloc(sizeof(float) * mc.layers * mc.experts);
    Arena bias_mem = {0};
    if (ckpt_load_router_bias(model, bias, mc.layers, mc.experts)) {
        bias_mem = arena_create("router bias", dev, sizeof(float) * mc.layers * mc.experts + ARENA_ALIGN);
        m.router_bias = arena_tensor(&bias_mem, DT_F32, 2, mc.layers, mc.experts, 0, 0);
        op_copy(m.router_bias, tf32_2(bias, mc.layers, mc.experts));
    }
    free(bias);
    // Ids the tokenizer cannot decode (a vocabulary padded past the tokenizer's) are never drawn.
    int V = mc.vocab < bpe_num_ids(tok) ? mc.vocab : (int)bpe_num_ids(tok);
    const char *eos_name = bpe_config_token(tok, "eos_token");
    int64_t eos = bpe_token_to_id(tok, eos_name ? eos_name : "<|endoftext|>");
    Rng rng = rng_seeded((uint64_t)seed, 0x67656e);
    int32_t *seq = xmalloc(sizeof(int32_t) * cap);
    for (int i = 0; i < P; i++) seq[i] = (int32_t)ids.p[i];
    fwrite(prompt, 1, strlen(prompt), stdout);
    fflush(stdout);
    Generator gen;
    gen_init(&gen, &m, P, cap);
    gen_feed(&gen, seq, P);
    for (int i = P; i < cap; i++) {
        for (int j = 0; j < V; j++)
            if (!isfinite(gen.logits[j])) die("%s: the model's logits are not finite at position %d", model, i - 1);
        seq[i] = gen_sample(gen.logits, V, temperature, top_p, &rng);
        if (seq[i] == eos) break;
        size_t len;
        char *text = bpe_decode(tok, (const uint32_t *)&seq[i], 1, &len);
        fwrite(text, 1, len, stdout);
        fflush(stdout);
        free(text);
        if (i + 1 < cap) gen_feed(&gen, &seq[i], 1);
    }
    printf("\n");
    if (bias_mem.cap) arena_destroy(&bias_mem);
    gen_free(&gen), model_free(&m), free(seq), idvec_free(&ids), bpe_scratch_free(scratch), bpe_free(tok);
    return 0;
}

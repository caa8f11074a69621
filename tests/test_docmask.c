// test_docmask.c — document masking (docs/architecture.md, "Document masking"): the document positions the data
// yields (document ends inside and across samples, the zigzag of context parallelism), and for every family a packed
// micro-batch equal to its documents run apart (the loss and every gradient tensor), a one-document sample equal to
// masking off, and masking that changes a packed sample's loss. The layouts (pp2, cp2, ep2 against one process):
// tests/test_parallel.c, dist_docmask_*.
#include "base/npy.h"
#include "parallel/ring.h"
#include "pipe/chunk.h"
#include "test.h"
#include "train/data.h"

// ---- the data ----

// A token file of n uint16 tokens (token i = i mod 1000) with the given cumulative document ends (nends 0: none).
static const char *write_docs_file(const char *dir, int64_t n, const uint64_t *ends, int nends) {
    static char path[512];
    snprintf(path, sizeof path, "%s/docs.bin", dir);
    FILE *f = fopen(path, "wb");
    CHECK(f && npy_write_header(f, DT_U16, n));
    for (int64_t i = 0; i < n; i++) {
        uint16_t t = (uint16_t)(i % 1000);
        CHECK(fwrite(&t, 2, 1, f) == 1);
    }
    CHECK(npy_write_header(f, DT_U64, nends) && fwrite(ends, 8, nends, f) == (size_t)nends && !fclose(f));
    return path;
}

// The position inside its document of token t of the sample starting at token `start`, from the ends by brute
// force: the distance to the later of the sample's start and the last end at or before t.
static int32_t docpos_ref(const uint64_t *ends, int nends, int64_t start, int64_t t) {
    int64_t begin = start;
    for (int k = 0; k < nends; k++)
        if ((int64_t)ends[k] <= t && (int64_t)ends[k] > begin) begin = (int64_t)ends[k];
    return (int32_t)(t - begin);
}

// Samples of 8 tokens over ends that fall inside samples, on a sample's first token, in two adjacent places (a
// document of one token), and a document that spans three samples; then a file without ends (one document); then
// the zigzag of cp 2 and 3 keeps each value the position inside its document.
TEST(data_document_positions) {
    const int S = 8;
    static const uint64_t ends[] = {5, 8, 9, 13, 14, 40, 45, 49};
    const char *path = write_docs_file(test_tmpdir(), 49, ends, 8);
    Dataset ds;
    dataset_open(&ds, path, S, 1000, 0);
    ds.ordered = true;
    ASSERT(ds.total == 6);
    int32_t tok[8], lab[8], pos[8], tok2[8], lab2[8];
    for (int64_t i = 0; i < ds.total; i++) {
        dataset_sample_docs(&ds, i, tok, lab, pos);
        dataset_sample(&ds, i, tok2, lab2);
        ASSERT(!memcmp(tok, tok2, sizeof tok) && !memcmp(lab, lab2, sizeof lab)); // tokens and labels unchanged
        for (int t = 0; t < S; t++)
            ASSERT_MSG(pos[t] == docpos_ref(ends, 8, i * S, i * S + t), "sample %lld token %d: docpos %d, expected %d",
                       (long long)i, t, pos[t], docpos_ref(ends, 8, i * S, i * S + t));
    }
    dataset_sample_docs(&ds, 1, tok, lab, pos); // tokens 8..15: ends 8 (its start), 9, 13, 14
    static const int32_t want1[8] = {0, 0, 1, 2, 3, 0, 0, 1};
    ASSERT(!memcmp(pos, want1, sizeof want1));
    dataset_sample_docs(&ds, 3, tok, lab, pos); // tokens 24..31: inside the document [14, 40), from the sample's start
    for (int t = 0; t < S; t++) ASSERT(pos[t] == t);
    dataset_close(&ds);

    path = write_docs_file(test_tmpdir(), 33, NULL, 0);
    dataset_open(&ds, path, S, 1000, 0);
    ds.ordered = true;
    for (int64_t i = 0; i < ds.total; i++) {
        dataset_sample_docs(&ds, i, tok, lab, pos);
        for (int t = 0; t < S; t++) ASSERT(pos[t] == t);
    }
    dataset_close(&ds);

    // Context parallelism: B = 2 samples of 24 tokens, cp 2 and 3; rank r's rows after the zigzag are the positions
    // of the global rows ring_position(r, cp, blk, i).
    enum { S2 = 24, B2 = 2 };
    static const uint64_t ends2[] = {3, 10, 11, 20, 31, 33, 47, 49};
    path = write_docs_file(test_tmpdir(), 49, ends2, 8);
    dataset_open(&ds, path, S2, 1000, 0);
    ds.ordered = true;
    int32_t whole[B2 * S2], x[B2 * S2], t2[S2], l2[S2];
    for (int b = 0; b < B2; b++) dataset_sample_docs(&ds, b, t2, l2, whole + b * S2);
    for (int cp = 2; cp <= 3; cp++)
        for (int r = 0; r < cp; r++) {
            memcpy(x, whole, sizeof x);
            dataset_zigzag(x, B2, S2, cp, r);
            int blk = S2 / (2 * cp);
            for (int b = 0; b < B2; b++)
                for (int i = 0; i < 2 * blk; i++) {
                    int g = ring_position(r, cp, blk, i);
                    ASSERT_MSG(x[b * 2 * blk + i] == docpos_ref(ends2, 8, (int64_t)b * S2, (int64_t)b * S2 + g),
                               "cp %d rank %d sequence %d row %d", cp, r, b, i);
                }
        }
    dataset_close(&ds);
}

// ---- the model: packed against apart ----

// TINY_MOE_EP_OF(3) and TINY_MOE_B (tests/test.h) cover Qwen3-MoE; DeepSeek-V2's MLA with a q LoRA and YaRN;
// GPT-OSS with a sliding window (5) that crosses the documents' edges, sinks and biases.
#define DOC_DSV2                                                                                                       \
    "{\"model_type\": \"deepseek_v2\", \"hidden_size\": 32, \"num_hidden_layers\": 2, \"num_attention_heads\": 4,"     \
    " \"q_lora_rank\": 16, \"kv_lora_rank\": 16, \"qk_nope_head_dim\": 8, \"qk_rope_head_dim\": 8, \"v_head_dim\": 6," \
    " \"vocab_size\": 64, \"n_routed_experts\": 8, \"num_experts_per_tok\": 3, \"moe_intermediate_size\": 16,"         \
    " \"n_shared_experts\": 1, \"intermediate_size\": 24, \"first_k_dense_replace\": 1, \"max_position_embeddings\": " \
    "64, \"rope_parameters\": {\"rope_type\": \"yarn\", \"rope_theta\": 10000.0, \"factor\": 4.0,"                     \
    " \"original_max_position_embeddings\": 8, \"mscale\": 0.707, \"mscale_all_dim\": 0.707}}"
#define DOC_GPT_OSS                                                                                                    \
    "{\"model_type\": \"gpt_oss\", \"hidden_size\": 32, \"num_hidden_layers\": 2, \"num_attention_heads\": 4,"         \
    " \"num_key_value_heads\": 2, \"head_dim\": 8, \"vocab_size\": 64, \"num_local_experts\": 8,"                      \
    " \"num_experts_per_tok\": 2, \"intermediate_size\": 16, \"sliding_window\": 5, \"swiglu_limit\": 2.0,"            \
    " \"layer_types\": [\"sliding_attention\", \"full_attention\"], \"max_position_embeddings\": 64}"

typedef struct {
    Model m;
    StepSums st;
    float *g[NGROUPS]; // a gradient kept by keep_grads
} Net;

// The model of json on the CPU in fp32 for sequences of up to S tokens; no load balancing (its loss counts experts
// over the whole micro-batch, which packing changes on purpose), norm weights moved away from 1.
static void net_make(Net *n, const char *json, int S, double std) {
    memset(n, 0, sizeof *n);
    ModelConfig mc;
    const ModelFamily *fam = model_config_load(&mc, write_text(test_tmpdir(), "config.json", json));
    model_create(&n->m, fam, &mc, DEV_CPU, DT_F32, S);
    n->m.lb_coef = 0;
    model_lb_setup(&n->m, LB_MICRO_BATCH, NULL, S);
    for (int g = 0; g < NGROUPS; g++) params_init(&n->m.params, g, n->m.w[g].p, 7, std, mc.layers);
    for (int i = 0; i < n->m.params.n; i++) {
        const ParamInfo *p = &n->m.params.p[i];
        if (p->init == INIT_ONES || p->init == INIT_ZEROS)
            for (int64_t j = 0; j < params_numel(p); j++)
                ((float *)n->m.w[p->group].p)[p->off + j] += (float)(0.3 * rng_normal(99, rng_hash_str(p->name), j));
    }
    step_sums_create(&n->st, &n->m, true);
}

static void net_free(Net *n) {
    for (int g = 0; g < NGROUPS; g++) free(n->g[g]);
    step_sums_free(&n->st), model_free(&n->m);
}

// Forward and backward of B sequences of S tokens in one chunk, adding into the step's sums and the gradient;
// docpos NULL: masking off.
static void fwd_bwd(Net *n, int B, int S, const int32_t *tok, const int32_t *lab, const int32_t *docpos) {
    Chunk c;
    chunk_init_model(&c, &n->m, &n->st, B, S);
    chunk_load_docs(&c, 0, tok, lab, docpos);
    chunk_forward(&c, 0, true), chunk_backward(&c, 0, false);
    chunk_free(&c);
}

static void begin(Net *n) { model_zero_grads(&n->m), step_sums_begin(&n->st, &n->m); }

// The step's gradient into n->g (replacing what it held).
static void keep_grads(Net *n) {
    for (int g = 0; g < NGROUPS; g++) {
        free(n->g[g]);
        n->g[g] = xmalloc(tensor_bytes(n->m.g[g]) + 1);
        memcpy(n->g[g], n->m.g[g].p, tensor_bytes(n->m.g[g]));
    }
}

// The worst per-tensor ‖a − b‖/‖b‖ between the kept gradient and the model's (0 where both are zero); its name.
static double worst_grad_diff(const Net *n, const char **name) {
    double worst = 0;
    *name = "";
    for (int i = 0; i < n->m.params.n; i++) {
        const ParamInfo *p = &n->m.params.p[i];
        const float *a = n->g[p->group] + p->off, *b = (const float *)n->m.g[p->group].p + p->off;
        double d = 0, s = 0;
        for (int64_t j = 0; j < params_numel(p); j++)
            d += ((double)a[j] - b[j]) * ((double)a[j] - b[j]), s += (double)b[j] * b[j];
        double e = d == 0 ? 0 : s == 0 ? INFINITY : sqrt(d / s);
        if (!(e <= worst)) worst = e, *name = p->name;
    }
    return worst;
}

// Two sequences of 16 tokens: the first packs documents of 6, 1 and 9 tokens, the second is one document.
enum { PB = 2, PS = 16, NDOCS = 4 };
static const int doc_len[NDOCS] = {6, 1, 9, 16};

static void packed_sample(int vocab, int32_t *tok, int32_t *lab, int32_t *docpos) {
    for (int t = 0; t < PB * PS; t++) {
        tok[t] = (int32_t)(rng_u64(5, 1, t) % vocab);
        lab[t] = t % 7 == 3 ? -100 : (int32_t)(rng_u64(5, 2, t) % vocab);
    }
    for (int d = 0, t = 0; d < NDOCS; d++)
        for (int i = 0; i < doc_len[d]; i++) docpos[t++] = i;
}

// Packed against apart for the model of json. The packed micro-batch and the four documents (each its own chunk
// of one sequence, positions from 0, plain causal attention) compute the same sums of the same products; only the
// grouping of the sums over tokens differs (a weight gradient sums 32 rows at once against 6, 1, 9 and 16, the
// GEMMs block them otherwise). Every reduction here has at most 64 terms (the vocabulary), so each run's rounding is
// within 64·2^-24 ≈ 3.8e-6 of a sum's magnitude, the two runs' within twice that; 2e-5 leaves room for the layers
// compounding it and for cancellation, and a document that sees another (a missed mask: 0.1 and more) fails it.
// The loss: the same bound. Then a sample of one document per sequence equals masking off bit for bit (the mask
// admits every key the causal mask does, so the same ops run on the same values in the same order), and masking
// changes the packed sample's loss (the test can fail).
static void check_family(const char *json, const char *family, double std) {
    Net n;
    net_make(&n, json, PS, std);
    int vocab = n.m.cfg.vocab;
    int32_t tok[PB * PS], lab[PB * PS], docpos[PB * PS];
    packed_sample(vocab, tok, lab, docpos);
    begin(&n);
    fwd_bwd(&n, PB, PS, tok, lab, docpos);
    double packed = op_read_scalar(n.st.loss_sum);
    keep_grads(&n);
    begin(&n);
    for (int d = 0, t = 0; d < NDOCS; t += doc_len[d++]) fwd_bwd(&n, 1, doc_len[d], tok + t, lab + t, NULL);
    double apart = op_read_scalar(n.st.loss_sum);
    const char *wn;
    double gd = worst_grad_diff(&n, &wn);
    printf("     %-12s packed vs apart: loss %.1e, gradient %.1e (%s)\n", family, fabs(packed - apart) / fabs(apart),
           gd, wn);
    ASSERT_MSG(fabs(packed - apart) <= 2e-5 * fabs(apart), "%s: packed loss %.9g, apart %.9g", family, packed, apart);
    ASSERT_MSG(gd <= 2e-5, "%s: the gradient of %s differs by %.3g packed against apart", family, wn, gd);

    // Masking off changes the packed loss.
    begin(&n);
    fwd_bwd(&n, PB, PS, tok, lab, NULL);
    double off = op_read_scalar(n.st.loss_sum);
    ASSERT_MSG(fabs(off - packed) > 1e-3 * fabs(packed), "%s: masking on %.9g, off %.9g", family, packed, off);
    keep_grads(&n);
    // One document per sequence: positions 0..S−1 with masking on equal masking off, bit for bit.
    for (int t = 0; t < PB * PS; t++) docpos[t] = t % PS;
    begin(&n);
    fwd_bwd(&n, PB, PS, tok, lab, docpos);
    ASSERT_MSG(op_read_scalar(n.st.loss_sum) == off, "%s: one document %.17g, off %.17g", family,
               op_read_scalar(n.st.loss_sum), off);
    for (int g = 0; g < NGROUPS; g++)
        ASSERT_MSG(!memcmp(n.g[g], n.m.g[g].p, tensor_bytes(n.m.g[g])), "%s: one document's gradient is not off's",
                   family);
    net_free(&n);
}

TEST(docmask_packed_equals_apart_qwen3_moe) {
    check_family(TINY_MOE_EP_OF(3), "qwen3_moe", 0.2);
    check_family(TINY_MOE_B, "qwen3_moe (b)", 0.2);
}
TEST(docmask_packed_equals_apart_deepseek_v2) { check_family(DOC_DSV2, "deepseek_v2", 0.2); }
TEST(docmask_packed_equals_apart_gpt_oss) { check_family(DOC_GPT_OSS, "gpt_oss", 0.2); }

// Qwen3.5: the DeltaNet state and the conv window restart at each document's first token too. Its weights start
// at std 0.1: at 0.2 the gated norm amplifies the fp32 summation-order difference of packing to ~3e-5 in gradients.
TEST(docmask_packed_equals_apart_qwen3_5_moe) { check_family(TINY_QWEN3_5_4, "qwen3_5_moe", 0.1); }

// A record slot loaded with masking and then without it gets chunk_init's positions back: the loss equals the first
// load's bit for bit (the same ops on the same values), and the masked load's differs.
TEST(docmask_chunk_reload_off) {
    Net n;
    net_make(&n, TINY_MOE_A, PS, 0.2);
    int32_t tok[PB * PS], lab[PB * PS], docpos[PB * PS];
    packed_sample(n.m.cfg.vocab, tok, lab, docpos);
    Chunk c;
    chunk_init_model(&c, &n.m, &n.st, PB, PS);
    double loss[3];
    for (int i = 0; i < 3; i++) {
        chunk_load_docs(&c, 0, tok, lab, i == 1 ? docpos : NULL);
        ASSERT(c.rec[0].mb.docs == (i == 1));
        step_sums_begin(&n.st, &n.m), chunk_forward(&c, 0, false);
        loss[i] = op_read_scalar(n.st.loss_sum);
    }
    ASSERT_MSG(loss[2] == loss[0] && loss[1] != loss[0], "off %.17g, on %.17g, off again %.17g", loss[0], loss[1],
               loss[2]);
    chunk_free(&c), net_free(&n);
}

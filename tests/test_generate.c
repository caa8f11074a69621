// test_generate.c — `pith generate`: the KV-cache path against full forwards without a cache (every family, from
// the HF fixtures), the sampler on a hand-made distribution, greedy generation reproducing the text a tiny model was
// overfitted to (through a byte-level tokenizer.json written here), and the command's errors.
#include "app/generate.h"
#include "test.h"
#include "train/ckpt.h"

// A model from an HF fixture folder on the CPU, rope tables for cap positions.
static void load_fixture(Model *m, const char *dir, int cap) {
    ModelConfig mc;
    const ModelFamily *fam = model_config_load(&mc, dir);
    model_create_forward(m, fam, &mc, DEV_CPU, DT_F32, cap);
    float *w[NGROUPS];
    for (int g = 0; g < NGROUPS; g++) w[g] = m->w[g].p;
    ckpt_load_model_part(&m->params, &m->params, w, dir);
}

// The logits of the token after tokens[0..n) by one forward over all n tokens, no cache: (V) into out.
static void full_forward_logits(Model *m, const int32_t *tokens, int n, float *out) {
    Chunk e;
    chunk_init_model(&e, m, NULL, 1, n);
    int32_t *labels = xmalloc(sizeof(int32_t) * n);
    for (int t = 0; t < n; t++) labels[t] = -100;
    chunk_load(&e, 0, tokens, labels);
    chunk_forward_layers(&e, 0);
    Arena ws = arena_create("test logits", DEV_CPU, 1 << 20);
    moe_logits(m, tf32_2(out, 1, m->cfg.vocab), tensor_rows(chunk_output(&e, 0), n - 1, 1), &ws);
    arena_destroy(&ws), chunk_free(&e), free(labels);
}

// Greedy continuation of a P-token prompt by N tokens with the KV cache; at every step the logits equal those of a
// full forward over the whole sequence so far (positions, masks, the cached keys and values, and for Gated DeltaNet
// the cached state and conv halo all matter).
static void cache_equals(const char *dir, int P, int N) {
    Model m;
    load_fixture(&m, dir, P + N);
    int V = m.cfg.vocab;
    int32_t *seq = xmalloc(sizeof(int32_t) * (size_t)(P + N));
    for (int i = 0; i < P; i++) seq[i] = (i * 37 + 11) % V;
    float *ref = xmalloc(sizeof(float) * V);
    Generator g;
    gen_init(&g, &m, P, P + N);
    gen_feed(&g, seq, P);
    double worst = 0, scale = 0;
    for (int i = P; i < P + N; i++) {
        full_forward_logits(&m, seq, i, ref);
        for (int j = 0; j < V; j++) worst = fmax(worst, fabs(g.logits[j] - ref[j])), scale = fmax(scale, fabs(ref[j]));
        ASSERT_MSG(worst <= 1e-5, "%s: position %d: cached logits differ from a full forward by %.3g", dir, i, worst);
        seq[i] = gen_sample(g.logits, V, 0, 1, NULL);
        if (i + 1 < P + N) gen_feed(&g, &seq[i], 1);
    }
    ASSERT(g.kv.len == P + N - 1 && scale > 0.05); // every position went through the cache; logits are not ~0
    printf("     %s: a %d-token prompt, %d greedy tokens, cached vs full logits within %.1e (largest |logit| %.2f)\n",
           dir, P, N, worst, scale);
    gen_free(&g), model_free(&m), free(ref), free(seq);
}

// A 7-token prompt and 9 more tokens. Also used by tests/test_gpt_oss.c.
void cache_equals_full_forwards(const char *dir) { cache_equals(dir, 7, 9); }

TEST(generate_cache_equals_full_forwards_qwen3_moe) { cache_equals_full_forwards("tests/hf/qwen3_moe"); }
TEST(generate_cache_equals_full_forwards_deepseek_v2) { cache_equals_full_forwards("tests/hf/deepseek_v2"); }
TEST(generate_cache_equals_full_forwards_deepseek_v2_lite) { cache_equals_full_forwards("tests/hf/deepseek_v2_lite"); }
// Qwen3.5: Gated DeltaNet layers around a full-attention one, conv kernel K = 4, delta chunks of 64. A 2-token
// prompt is shorter than the K − 1 = 3 rows the halo holds (the halo then keeps zeros and the prompt's rows, and
// each later token shifts it); a 70-token prompt spans two delta chunks, so its final state leaves the chunked path.
TEST(generate_cache_equals_full_forwards_qwen3_5_moe) {
    cache_equals("tests/hf/qwen3_5_moe", 2, 9);
    cache_equals("tests/hf/qwen3_5_moe", 70, 9);
}

TEST(generate_sampler_temperature_top_p_seed) {
    // p = (0.5, 0.3, 0.15, 0.05) as logits; argmax at temperature 0, lowest id on a tie.
    float l[4] = {logf(0.5f), logf(0.3f), logf(0.15f), logf(0.05f)}, tie[3] = {1, 3, 3};
    ASSERT(gen_sample(l, 4, 0, 1, NULL) == 0 && gen_sample(tie, 3, 0, 0.5, NULL) == 1);
    enum { DRAWS = 40000 };
    // top_p 0.75: the smallest most-likely set reaching 0.75 is {0, 1}, renormalised to (0.625, 0.375).
    // temperature 0.5, top_p 1: p² renormalised = (0.25, 0.09, 0.0225, 0.0025)/0.365.
    // top_p 0.4: {0} alone.
    const struct {
        double temp, top_p, want[4];
    } cases[] = {{1, 0.75, {0.625, 0.375, 0, 0}},
                 {0.5, 1, {0.25 / 0.365, 0.09 / 0.365, 0.0225 / 0.365, 0.0025 / 0.365}},
                 {1, 1, {0.5, 0.3, 0.15, 0.05}},
                 {1, 0.4, {1, 0, 0, 0}}};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        int count[4] = {0}, first[32], again[32], other[32];
        Rng r = rng_seeded(7, 1), r2 = rng_seeded(7, 1), r3 = rng_seeded(8, 1);
        for (int i = 0; i < DRAWS; i++) {
            int id = gen_sample(l, 4, cases[c].temp, cases[c].top_p, &r);
            count[id]++;
            if (i < 32) first[i] = id;
        }
        for (int i = 0; i < 32; i++)
            again[i] = gen_sample(l, 4, cases[c].temp, cases[c].top_p, &r2),
            other[i] = gen_sample(l, 4, cases[c].temp, cases[c].top_p, &r3);
        ASSERT_MSG(!memcmp(first, again, sizeof first), "case %zu: the same seed drew differently", c);
        if (cases[c].want[0] < 1)
            ASSERT_MSG(memcmp(first, other, sizeof first), "case %zu: another seed drew the same 32 tokens", c);
        for (int id = 0; id < 4; id++) {
            double f = (double)count[id] / DRAWS, want = cases[c].want[id];
            if (want == 0) ASSERT_MSG(count[id] == 0, "case %zu: token %d is outside top-p but drawn", c, id);
            // 40000 draws: the standard error is at most 0.0025, so 0.01 is four of them
            ASSERT_MSG(fabs(f - want) < 0.01, "case %zu: token %d drawn %.4f of the time, want %.4f", c, id, f, want);
        }
    }
}

// tokenizer.json of a byte-level BPE with no merges: ids 0..255 are the bytes (GPT-2's byte-to-character map),
// 256 is <|endoftext|>. Written into dir/tok/.
static void write_byte_tokenizer(const char *dir) {
    int cs[256], n = 0;
    for (int b = 0; b < 256; b++) // printable bytes map to themselves, the others to 256, 257, … in order
        cs[b] = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE) ? b : 256 + n++;
    size_t cap = 1 << 16, o = 0;
    char *s = xmalloc(cap);
    o += (size_t)snprintf(s + o, cap - o,
                          "{\"version\": \"1.0\", \"added_tokens\": [{\"id\": 256, \"content\": \"<|endoftext|>\", "
                          "\"single_word\": false, \"lstrip\": false, \"rstrip\": false, \"normalized\": false, "
                          "\"special\": true}], \"normalizer\": null, \"pre_tokenizer\": {\"type\": \"ByteLevel\", "
                          "\"add_prefix_space\": false, \"trim_offsets\": true, \"use_regex\": true}, "
                          "\"post_processor\": null, \"decoder\": {\"type\": \"ByteLevel\"}, \"model\": {\"type\": "
                          "\"BPE\", \"vocab\": {");
    for (int b = 0; b < 256; b++) {
        int c = cs[b];
        char u[8] = {0};
        if (c < 0x80) u[0] = (char)c;
        else u[0] = (char)(0xC0 | c >> 6), u[1] = (char)(0x80 | (c & 63)); // all below 0x800
        bool esc = c == '"' || c == '\\';
        o += (size_t)snprintf(s + o, cap - o, "%s\"%s%s\": %d", b ? ", " : "", esc ? "\\" : "", u, b);
    }
    o += (size_t)snprintf(s + o, cap - o, "}, \"merges\": []}}");
    write_text(dir, "tok/tokenizer.json", s);
    free(s);
}

#define OVERFIT_TEXT "pith learns to say this sentence."

// A tiny Qwen3-MoE overfitted to one sentence (64 documents of it, each followed by EOS, one per sample) gives the
// sentence back from its first words at temperature 0, stops at EOS, and the KV cache changes nothing.
TEST(generate_greedy_reproduces_overfitted_text) {
    const char *d = test_tmpdir();
    write_byte_tokenizer(d);
    char text[64 * 40] = "";
    for (int i = 0; i < 64; i++) strcat(text, OVERFIT_TEXT "\n\n");
    write_text(d, "text.txt", text);
    write_text(d, "model.json",
               "{\"model_type\": \"qwen3_moe\", \"hidden_size\": 32, \"num_hidden_layers\": 2, "
               "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 8, \"vocab_size\": 257, "
               "\"num_experts\": 4, \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 32, \"norm_topk_prob\": "
               "true}");
    // sequence_length = the sentence's 33 bytes + EOS, so every sample is one document from its start
    write_text(d, "train.json",
               "{\"model\": \"model.json\", \"dataset\": \"data\", \"sequence_length\": 34, \"micro_batch_size\": 4, "
               "\"global_batch_size\": 8, \"max_steps\": 150, \"device\": \"cpu\", \"save_location\": \"ck\", "
               "\"optimizer\": {\"lr\": 0.01}, \"moe_router_bias_update_rate\": 0.001}");
    char out[1 << 16], pith[4096];
    ASSERT(realpath(PITH_BIN, pith));
    ASSERT_MSG(run_cmd(out, sizeof out,
                       "cd %s && %s tokenize --tokenizer tok --input text.txt --output data --txt-split paragraph && "
                       "%s train train.json",
                       d, pith, pith) == 0,
               "%s", out);
    const char *loss = strstr(out, "step 150");
    ASSERT_MSG(loss, "%s", out);
    ASSERT_MSG(run_cmd(out, sizeof out,
                       "cd %s && %s generate --model ck/step-00000150 --tokenizer tok --prompt 'pith learns' -n 40 "
                       "--temperature 0",
                       d, pith) == 0,
               "%s", out);
    ASSERT_MSG(!strcmp(out, OVERFIT_TEXT "\n"), "generated '%s', want '" OVERFIT_TEXT "' and EOS", out);
    // The save_location stands for its newest checkpoint (as in pith eval).
    ASSERT_MSG(run_cmd(out, sizeof out,
                       "cd %s && %s generate --model ck --tokenizer tok --prompt 'pith learns' -n 40 --temperature 0 "
                       "2>/dev/null",
                       d, pith) == 0 &&
                   !strcmp(out, OVERFIT_TEXT "\n"),
               "from the save_location: '%s'", out);
    // -n stops it early; sampling at a low temperature from a model this sure gives the same text (--device auto:
    // the GPU where there is one).
    ASSERT(run_cmd(out, sizeof out,
                   "cd %s && %s generate --model ck/step-00000150 --tokenizer tok --prompt 'pith' -n 7 --temperature "
                   "0.05 --top-p 0.9 --seed 3 --device auto",
                   d, pith) == 0);
    ASSERT_MSG(!strcmp(out, "pith learns\n"), "%s", out);
}

// A checkpoint trained with aux-loss-free balancing keeps its selection biases in run.json; generation routes with
// them: a bias that sends every token to experts 6 and 7 changes the greedy continuation, a malformed one is an
// error naming the file.
TEST(generate_applies_router_bias) {
    const char *d = test_tmpdir();
    write_byte_tokenizer(d);
    char out[8192], with[8192], rows[1024] = "";
    for (int l = 0; l < 3; l++) // 3 layers of 8 experts
        strcat(rows, l ? ", [0, 0, 0, 0, 0, 0, 9, 9]" : "[0, 0, 0, 0, 0, 0, 9, 9]");
    char runjson[1200];
    // (format pith-checkpoint-1: a run.json without checksums, which a load accepts unverified)
    snprintf(runjson, sizeof runjson, "{\"format\": \"pith-checkpoint-1\", \"step\": 5, \"router_bias\": [%s]}", rows);
    const char *gen = "%s generate --model %s/m --tokenizer %s/tok --prompt abcdefgh -n 12 --temperature 0";
    ASSERT(run_cmd(out, sizeof out,
                   "mkdir -p %s/m && cp tests/hf/qwen3_moe/config.json "
                   "tests/hf/qwen3_moe/model.safetensors %s/m/",
                   d, d) == 0);
    ASSERT(run_cmd(out, sizeof out, gen, PITH_BIN, d, d) == 0);
    write_text(d, "m/run.json", runjson);
    ASSERT(run_cmd(with, sizeof with, gen, PITH_BIN, d, d) == 0);
    ASSERT_MSG(strcmp(out, with), "the biases changed nothing: %s", out);
    write_text(d, "m/run.json", "{\"format\": \"pith-checkpoint-1\", \"step\": 5, \"router_bias\": [[1, 2]]}");
    ASSERT(run_cmd(out, sizeof out, gen, PITH_BIN, d, d) == 1);
    ASSERT_MSG(strstr(out, "m/run.json: router_bias: expected 3 rows of 8 numbers"), "%s", out);
}

// `pith generate` on Qwen3.5 from the HF fixture folder and from its hf2pith conversion prints the prompt and the
// greedy continuation the Generator gives in process (the fixture's 128 ids are bytes 0..127 of the byte tokenizer,
// each decoding to itself).
TEST(generate_qwen3_5_command_line) {
    enum { N = 12 };
    const char *d = test_tmpdir(), *prompt = "abcdefgh";
    int P = (int)strlen(prompt);
    write_byte_tokenizer(d);
    Model m;
    load_fixture(&m, "tests/hf/qwen3_5_moe", P + N);
    int32_t seq[64];
    char want[64];
    for (int i = 0; i < P; i++) seq[i] = (unsigned char)prompt[i], want[i] = prompt[i];
    Generator g;
    gen_init(&g, &m, P, P + N);
    gen_feed(&g, seq, P);
    for (int i = P; i < P + N; i++) {
        seq[i] = gen_sample(g.logits, m.cfg.vocab, 0, 1, NULL), want[i] = (char)seq[i];
        if (i + 1 < P + N) gen_feed(&g, &seq[i], 1);
    }
    want[P + N] = '\n';
    gen_free(&g), model_free(&m);
    char out[8192];
    ASSERT(run_cmd(out, sizeof out, "%s convert hf2pith tests/hf/qwen3_5_moe %s/ck", PITH_BIN, d) == 0);
    const char *models[2] = {"tests/hf/qwen3_5_moe", "ck"};
    for (int k = 0; k < 2; k++) {
        char path[600], model[600], got[64] = {0};
        snprintf(path, sizeof path, "%s/out.txt", d);
        snprintf(model, sizeof model, k ? "%s/%s" : "%.0s%s", d, models[k]);
        ASSERT_MSG(run_cmd(out, sizeof out,
                           "%s generate --model %s --tokenizer %s/tok --prompt %s -n %d --temperature 0 "
                           "> %s",
                           PITH_BIN, model, d, prompt, N, path) == 0,
                   "%s", out);
        FILE *f = fopen(path, "rb");
        ASSERT(f);
        size_t n = fread(got, 1, sizeof got, f);
        fclose(f);
        ASSERT_MSG(n == (size_t)(P + N + 1) && !memcmp(got, want, n),
                   "%s: generated %zu bytes, not the %d in-process "
                   "ones",
                   model, n, P + N + 1);
    }
}

TEST(generate_errors) {
    const char *d = test_tmpdir();
    write_byte_tokenizer(d);
    char out[8192];
    static const struct {
        const char *args, *msg;
    } cases[] = {
        {"--tokenizer T --prompt x", "--model, --tokenizer and --prompt are required"},
        {"--model tests/hf/qwen3_moe --tokenizer T --prompt x -n 0", "-n needs an integer in [1, 1048576] (got '0')"},
        {"--model tests/hf/qwen3_moe --tokenizer T --prompt x -n 3x", "-n needs an integer"},
        {"--model tests/hf/qwen3_moe --tokenizer T --prompt x --temperature -1", "--temperature needs a number"},
        {"--model tests/hf/qwen3_moe --tokenizer T --prompt x --temperature warm", "(got 'warm')"},
        {"--model tests/hf/qwen3_moe --tokenizer T --prompt x --top-p 0", "--top-p must be above 0"},
        {"--model tests/hf/qwen3_moe --tokenizer T --prompt x --top-p 1.5", "--top-p needs a number in [0, 1]"},
        {"--model tests/hf/qwen3_moe --tokenizer T --prompt x --seed -2", "--seed needs an integer"},
        {"--model tests/hf/qwen3_moe --tokenizer T --prompt x --device tpu", "--device must be auto, cpu or cuda"},
        {"--model tests/hf/qwen3_moe --tokenizer T --prompt x --dtype fp8", "--dtype must be fp32 or bf16"},
        {"--model tests/hf/qwen3_moe --tokenizer T --prompt ''", "--prompt gives no tokens"},
        {"--model tests/hf/qwen3_moe --tokenizer T --prompt x extra", "unexpected argument 'extra'"},
        {"--model tests/hf/qwen3_moe --tokenizer NOPE --prompt x", "NOPE"},
        {"--model NOPE --tokenizer T --prompt x", "NOPE"},
        // the fixture's vocabulary has 128 ids; 'é' is byte 0xC3 = id 195
        {"--model tests/hf/qwen3_moe --tokenizer T --prompt é", "outside the model's vocabulary"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char args[512];
        snprintf(args, sizeof args, "%s", cases[i].args);
        char *t = strstr(args, " T ");
        if (t) { // the tokenizer folder of this test
            char rest[512];
            snprintf(rest, sizeof rest, "%s", t + 2);
            snprintf(t, sizeof args - (size_t)(t - args), " %s/tok%s", d, rest);
        }
        int rc = run_cmd(out, sizeof out, "%s generate %s", PITH_BIN, args);
        const char *nl = strchr(out, '\n');
        ASSERT_MSG(rc == 1 && strstr(out, cases[i].msg) && nl && !strchr(nl + 1, '\n'),
                   "pith generate %s: exit %d, want one line with '%s', got: %s", args, rc, cases[i].msg, out);
    }
}

// test_gpu_det.c — `deterministic: true` (docs/architecture.md, "Determinism"): two GPU runs of the same config give
// the same bits. Each family's small model (bf16, head dims cuDNN would take, enough rows that atomics would collide:
// a norm's row groups, repeated tokens, a load-balancing loss, two micro-batches per step) trains 4 steps twice; the
// loss and grad_norm of every metrics.jsonl line and the final checkpoint (weights and AdamW moments) must be equal
// byte for byte. The same comparison holds asynchronous checkpoints (gpu_det_async_checkpoint) and CUDA graphs
// (gpu_graph_*) against the synchronous, eager run.
#include "gpu_test.h"

// HF config.json bodies (after the model_type): small, but the shapes of the benchmarks' code paths.
static const char *const qwen3_model =
    "\"qwen3_moe\", \"hidden_size\": 256, \"num_hidden_layers\": 2, \"num_attention_heads\": 4,"
    " \"num_key_value_heads\": 2, \"head_dim\": 64, \"vocab_size\": 512, \"num_experts\": 8,"
    " \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 128, \"intermediate_size\": 512,"
    " \"norm_topk_prob\": true, \"decoder_sparse_step\": 1, \"mlp_only_layers\": [], \"rms_norm_eps\": 1e-6,"
    " \"rope_theta\": 1000000.0, \"max_position_embeddings\": 4096, \"tie_word_embeddings\": false";
static const char *const dsv2_model =
    "\"deepseek_v2\", \"hidden_size\": 256, \"num_hidden_layers\": 2, \"num_attention_heads\": 4,"
    " \"num_key_value_heads\": 4, \"kv_lora_rank\": 64, \"q_lora_rank\": null, \"qk_nope_head_dim\": 16,"
    " \"qk_rope_head_dim\": 16, \"v_head_dim\": 32, \"vocab_size\": 512, \"n_routed_experts\": 8,"
    " \"n_shared_experts\": 1, \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 128, \"intermediate_size\": 512,"
    " \"first_k_dense_replace\": 1, \"moe_layer_freq\": 1, \"n_group\": 1, \"topk_group\": 1,"
    " \"topk_method\": \"greedy\", \"norm_topk_prob\": false, \"routed_scaling_factor\": 1.0,"
    " \"scoring_func\": \"softmax\", \"seq_aux\": true, \"aux_loss_alpha\": 0.001, \"rms_norm_eps\": 1e-6,"
    " \"rope_theta\": 10000, \"max_position_embeddings\": 4096, \"attention_bias\": false,"
    " \"tie_word_embeddings\": false";
static const char *const gpt_oss_model =
    "\"gpt_oss\", \"hidden_size\": 256, \"num_hidden_layers\": 2, \"num_attention_heads\": 4,"
    " \"num_key_value_heads\": 2, \"head_dim\": 64, \"vocab_size\": 512, \"num_local_experts\": 8,"
    " \"num_experts_per_tok\": 2, \"experts_per_token\": 2, \"intermediate_size\": 128, \"attention_bias\": true,"
    " \"layer_types\": [\"sliding_attention\", \"full_attention\"], \"sliding_window\": 32, \"swiglu_limit\": 7.0,"
    " \"rms_norm_eps\": 1e-5, \"rope_theta\": 150000, \"rope_scaling\": {\"beta_fast\": 32.0, \"beta_slow\": 1.0,"
    " \"factor\": 32.0, \"original_max_position_embeddings\": 4096, \"rope_type\": \"yarn\", \"truncate\": false},"
    " \"max_position_embeddings\": 131072, \"router_aux_loss_coef\": 0.9, \"tie_word_embeddings\": false";
// Qwen3.5: DeltaNet heads of 128 (the tensor-core delta rule), a full-attention layer, a shared expert.
static const char *const qwen3_5_model =
    "\"qwen3_5_moe_text\", \"hidden_size\": 256, \"num_hidden_layers\": 2, \"num_attention_heads\": 4,"
    " \"num_key_value_heads\": 2, \"head_dim\": 64, \"vocab_size\": 512, \"num_experts\": 8,"
    " \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 128, \"shared_expert_intermediate_size\": 128,"
    " \"linear_num_key_heads\": 2, \"linear_num_value_heads\": 4, \"linear_key_head_dim\": 128,"
    " \"linear_value_head_dim\": 128, \"linear_conv_kernel_dim\": 4, \"rms_norm_eps\": 1e-6,"
    " \"layer_types\": [\"linear_attention\", \"full_attention\"], \"tie_word_embeddings\": false,"
    " \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 10000.0, \"partial_rotary_factor\": 0.25}";

// The "loss" and "grad_norm" values of every line of a metrics.jsonl, as written (the text is the bits).
static void metric_texts(const char *path, char *out, size_t cap) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "grep -o '\"\\(loss\\|grad_norm\\)\": [^,}]*' %s", path);
    ASSERT_MSG(run_cmd(out, cap, "%s", cmd) == 0, "%s: no loss lines", path);
}

// Trains `model` (a config.json body) twice with deterministic: true and the options `both`, the second run also with
// `second`; the metrics and checkpoints must match. rtol > 0 (`both` turning deterministic off): each loss within rtol
// of the other run's, the checkpoints not compared.
static void train_twice(const char *name, const char *model, const char *both, const char *second, double rtol) {
    gpu_begin();
    const char *d = test_tmpdir();
    static char out[1 << 16], m[2][1 << 14];
    FILE *f;
    char path[512];
    snprintf(path, sizeof path, "%s/config.json", d);
    ASSERT((f = fopen(path, "w")));
    fprintf(f, "{\"model_type\": %s}\n", model);
    fclose(f);
    snprintf(path, sizeof path, "%s/train.json", d);
    ASSERT((f = fopen(path, "w")));
    fprintf(f, "{\"model\": \"config.json\", \"dataset\": \"data\", \"sequence_length\": 512, \"micro_batch_size\": 2,"
               " \"global_batch_size\": 4, \"max_steps\": 4, \"seed\": 7, \"optimizer\": {\"type\": \"adamw\","
               " \"lr\": 1e-3}, \"scheduler\": {\"type\": \"constant\"}, \"clip_grad_norm\": 1.0,"
               " \"moe_load_balance_coef\": 0.01, \"device\": \"cuda\", \"compute_dtype\": \"bf16\","
               " \"deterministic\": true}\n");
    fclose(f);
    int rc = run_cmd(out, sizeof out,
                     "mkdir -p %s/data && %s synth --output %s/data/tokens.bin --vocab 512 --tokens "
                     "100000 --seed 5",
                     d, PITH_BIN, d);
    ASSERT_MSG(rc == 0, "synth: %s", out);
    for (int r = 0; r < 2; r++) {
        rc = run_cmd(out, sizeof out, "%s train %s/train.json --set run_dir=%s/run%d --set save_location=%s/ck%d %s %s",
                     PITH_BIN, d, d, r, d, r, both, r ? second : "");
        ASSERT_MSG(rc == 0, "%s run %d: %s", name, r, out);
        ASSERT_MSG(rtol > 0 || strstr(out, "deterministic: attention on pith's own kernels"),
                   "%s: no start-up line: %s", name, out);
        if (r && strstr(second, "cuda_graph=true")) // step 3 records both micro-batches, step 4 launches them again
            ASSERT_MSG(strstr(out, "cuda_graph: step 3 recorded its micro-batches' forward and backward as 2 CUDA "
                                   "graphs\n") &&
                           !strstr(out, "cuda_graph: step 4"),
                       "%s: not recorded once at step 3: %s", name, out);
        snprintf(path, sizeof path, "%s/run%d/metrics.jsonl", d, r);
        metric_texts(path, m[r], sizeof m[r]);
        // after the first step (which grows the backend's buffers) one GPU's forwards and backwards wait for nothing,
        // the micro-batches' uploads included (docs/architecture.md, "A step without host waits")
        rc = run_cmd(out, sizeof out,
                     "n=$(tail -n +2 %s | grep -c '\"fwdbwd_host_waits\": 0[,}]') && [ $n -eq 3 ] || cat %s", path,
                     path);
        ASSERT_MSG(rc == 0 && !out[0], "%s run %d: the host waited for the GPU in a step's forwards and backwards:\n%s",
                   name, r, out);
    }
    if (rtol > 0) {
        const char *p[2] = {m[0], m[1]};
        int n = 0;
        while ((p[0] = strstr(p[0], "\"loss\": ")) && (p[1] = strstr(p[1], "\"loss\": "))) {
            double a = atof(p[0] + 8), b = atof(p[1] + 8);
            ASSERT_MSG(isfinite(a) && fabs(a - b) <= rtol * fabs(a), "%s: step %d's loss %.9g against %.9g", name,
                       n + 1, a, b);
            p[0] += 8, p[1] += 8, n++;
        }
        ASSERT_MSG(n == 4, "%s: %d losses", name, n);
        printf("     %s: 4 steps twice, the losses within %g:\n%s\n", name, rtol, m[1]);
        return;
    }
    ASSERT_MSG(!strcmp(m[0], m[1]), "%s: the two runs' metrics differ:\n%s\n---\n%s", name, m[0], m[1]);
    rc = run_cmd(out, sizeof out,
                 "cd %s/ck0 && n=0 && for f in $(find . -name '*.safetensors'); do cmp $f ../ck1/$f || exit 1;"
                 " n=$((n + 1)); done && echo \"$n files\" && [ $n -gt 0 ]",
                 d);
    ASSERT_MSG(rc == 0, "%s: the checkpoints differ: %s", name, out);
    printf("     %s: 4 steps twice, loss and grad_norm equal (%.*s), checkpoints equal (%.*s)\n", name,
           (int)strcspn(m[0], "\n"), m[0], (int)strcspn(out, "\n"), out);
}

static void det_twice(const char *name, const char *model, const char *both, const char *second) {
    train_twice(name, model, both, second, 0);
}

TEST(gpu_det_qwen3_moe) { det_twice("qwen3_moe", qwen3_model, "", ""); }
TEST(gpu_det_deepseek_v2) { det_twice("deepseek_v2", dsv2_model, "", ""); }
TEST(gpu_det_gpt_oss) { det_twice("gpt_oss", gpt_oss_model, "", ""); }
TEST(gpu_det_qwen3_5_moe) { det_twice("qwen3_5_moe", qwen3_5_model, "", ""); }
// The delta rule's chunk state kept from forward to backward (delta_rule_keep) changes no bit.
TEST(gpu_det_qwen3_5_moe_keep) {
    det_twice("qwen3_5_moe delta_rule_keep", qwen3_5_model, "", "--set delta_rule_keep=true");
}
// checkpoint.async on the GPU (the pinned snapshot arena, the copy stream beside the next step, the update and the
// writer thread waiting for it): a save every step, fp32 and bf16 moments, the bytes of synchronous saving.
TEST(gpu_det_async_checkpoint) {
    det_twice("qwen3_moe async", qwen3_model, "--set save_interval=1", "--set checkpoint.async=true");
    det_twice("qwen3_moe async bf16", qwen3_model, "--set save_interval=1 --set optimizer.state_dtype=bf16",
              "--set checkpoint.async=true");
}

// cuda_graph (docs/architecture.md, "CUDA graphs"): the second run records its micro-batches from step 3 on (step 3
// records the step's first micro-batch and the other, step 4 launches both again), and the bits are those of the eager
// run: every family; FP8 under full recompute (every launch of the first micro-batch's recording remakes the FP8 weight
// cache); document masking (each micro-batch's positions copied into its fixed slot before the launch, the attention,
// the delta rule and the conv1d reading the documents from them on the device).
static const char *const graph = "--set cuda_graph=true";
TEST(gpu_graph_qwen3_moe) { det_twice("qwen3_moe graph", qwen3_model, "", graph); }
TEST(gpu_graph_deepseek_v2) { det_twice("deepseek_v2 graph", dsv2_model, "", graph); }
TEST(gpu_graph_gpt_oss) { det_twice("gpt_oss graph", gpt_oss_model, "", graph); }
TEST(gpu_graph_qwen3_5_moe) { det_twice("qwen3_5_moe graph", qwen3_5_model, "", graph); }
TEST(gpu_graph_fp8_full_recompute) {
    det_twice("qwen3_moe fp8 full recompute graph", qwen3_model, "--set fp8=true --set recompute=full", graph);
}
TEST(gpu_graph_document_masking) {
    det_twice("qwen3_moe document masking graph", qwen3_model, "--set document_masking=true", graph);
    det_twice("qwen3_5_moe document masking graph", qwen3_5_model, "--set document_masking=true", graph);
}
// cuDNN's attention inside the recording (deterministic false; GPT-OSS's windows and sinks too). Its backward adds into
// dQ with atomics, so the two runs differ from step 2 on in the last bits of the weights (a few ulps of a step of
// lr 1e-3); the losses are compared within 1e-3 of their value, far above those bits (the bits themselves are the
// deterministic tests' above).
TEST(gpu_graph_cudnn) {
    train_twice("qwen3_moe graph on cuDNN", qwen3_model, "--set deterministic=false", graph, 1e-3);
    train_twice("gpt_oss graph on cuDNN", gpt_oss_model, "--set deterministic=false", graph, 1e-3);
}

// test_gpu_det.c — `deterministic: true` (docs/architecture.md, "Determinism"): two GPU runs of the same config give
// the same bits. Each family's small model (bf16, head dims cuDNN would take, enough rows that atomics would collide:
// a norm's row groups, repeated tokens, a load-balancing loss, two micro-batches per step) trains 4 steps twice; the
// loss and grad_norm of every metrics.jsonl line and the final checkpoint (weights and AdamW moments) must be equal
// byte for byte. The same comparison holds asynchronous checkpoints against synchronous ones (gpu_det_async_checkpoint).
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
// `second`; the metrics and checkpoints must match.
static void det_twice(const char *name, const char *model, const char *both, const char *second) {
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
        ASSERT_MSG(strstr(out, "deterministic: attention on pith's own kernels"), "%s: no start-up line: %s", name,
                   out);
        snprintf(path, sizeof path, "%s/run%d/metrics.jsonl", d, r);
        metric_texts(path, m[r], sizeof m[r]);
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

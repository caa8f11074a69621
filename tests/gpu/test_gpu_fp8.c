// test_gpu_fp8.c — FP8 on the GPU: block rounding bit for bit against the CPU reference (ops/cpu/cpu_fp8.c), every
// FP8 GEMM against the CPU emulation (the rounded operands are equal, so only the order of the fp32 sums and the
// output dtype differ: ≤ 1e-5 in fp32, ≤ 1e-2 in bf16), and the model trained in FP8 against bf16.
#include "gpu_test.h"
#include "ops/cuda/cuda_ops.h"

// Bit-equal rounding of x: (R, C) (or (E, N, K) when E > 0) for each block kind, fp32 and bf16 storage.
static void check_round(int64_t E, int64_t R, int64_t C, const int64_t *offs, int groups) {
    Pair po = pair_offs(offs, groups + 1);
    for (int m = 0; m < 2; m++) {
        DType dt = m ? DT_BF16 : DT_F32;
        gpu_mode(dt);
        for (int b = FP8_ROWS; b <= FP8_TILES; b++) {
            Pair x = E ? pair_rand(dt, 3, 3, E, R, C, 0) : pair_rand(dt, 3, 2, R, C, 0, 0);
            Pair y = E ? pair_nan(dt, 3, E, R, C, 0) : pair_nan(dt, 2, R, C, 0, 0);
            op_fp8_round(y.c, x.c, (Fp8Blocks)b, po.c), op_fp8_round(y.d, x.d, (Fp8Blocks)b, po.d);
            EXPECT_CLOSE(y, 0);
        }
    }
}

TEST(gpu_op_fp8_round) {
    gpu_begin();
    int64_t offs[6] = {0, 5, 5, 140, 300, 301}; // an empty group, ragged 128-row blocks, a group of one row
    check_round(0, 301, 200, offs, 5);
    check_round(0, 130, 384, NULL, 0);
    check_round(3, 136, 200, NULL, 0); // weights: 3 matrices of 136 × 200
    // a non-finite value turns its block into NaN (the step's non-finite check then stops the run)
    float h[256 * 2];
    for (int i = 0; i < 512; i++) h[i] = (float)(i % 13) - 6;
    h[300] = INFINITY;
    Pair x = pair_from(DT_F32, h, 2, 2, 256, 0, 0), y = pair_nan(DT_F32, 2, 2, 256, 0, 0);
    op_fp8_round(y.d, x.d, FP8_ROWS, (Tensor){0});
    float *g = gpu_down(y.d);
    for (int i = 0; i < 512; i++) ASSERT_MSG((i >= 256 && i < 384) == (bool)isnan(g[i]), "element %d", i);
    free(g);
    gpu_report();
}

// The FP8 layers of M rows, N outputs, K inputs (offs: E experts) on both devices from equal inputs. The dense ones
// run on the FP8 tensor cores where M (the weight gradient: M rounded up to 16), N and K are multiples of 16, the
// experts' where N and K are multiples of 128 (tc: how many of the three do in bf16,
// asserted from the count of tensor-core GEMMs); the weight's codes, transposed codes and scales are the CPU's bit for
// bit.
// acc false: the grouped weight gradient is written, not added to; gdt: its dtype (fp32, or bf16 as gradient_dtype
// keeps the experts').
static void check_fp8_gemms(DType dt, double tol, int64_t M, int64_t N, int64_t K, const int64_t *offs, int E, int tc,
                            bool acc, DType gdt) {
    Pair x = pair_rand(dt, 1, 2, M, K, 0, 0), dy = pair_rand(dt, 1, 2, M, N, 0, 0), po = pair_offs(offs, E + 1);
    Pair w = offs ? pair_rand(dt, 0.5f, 3, E, N, K, 0) : pair_rand(dt, 0.5f, 2, N, K, 0, 0);
    Pair y = pair_nan(dt, 2, M, N, 0, 0), dx = pair_nan(dt, 2, M, K, 0, 0);
    Pair dw = offs ? pair_rand(gdt, 1, 3, E, N, K, 0) : pair_rand(gdt, 1, 2, N, K, 0, 0);
    size_t bytes = offs ? op_fp8_experts_bytes(E, N, K) : op_fp8_weight_bytes(N, K);
    void *hb = xmalloc(bytes);
    Tensor db = gpu_tensor(DT_U8, 1, (int64_t)bytes, 0, 0, 0);
    Fp8Weight w8c = offs ? op_fp8_experts_view(hb, DEV_CPU, E, N, K) : op_fp8_weight_view(hb, DEV_CPU, N, K);
    Fp8Weight w8d = offs ? op_fp8_experts_view(db.p, DEV_CUDA, E, N, K) : op_fp8_weight_view(db.p, DEV_CUDA, N, K);
    op_fp8_weight_make(w8c, w.c), op_fp8_weight_make(w8d, w.d);
    Tensor parts[4][2] = {{w8c.q, w8d.q}, {w8c.qt, w8d.qt}, {w8c.s, w8d.s}, {w8c.st, w8d.st}};
    for (int i = 0; i < 4; i++) {
        Tensor back = parts[i][0];
        back.p = xmalloc(tensor_bytes(back));
        op_copy(back, parts[i][1]);
        ASSERT_MSG(!memcmp(back.p, parts[i][0].p, tensor_bytes(back)), "part %d of the weight differs", i);
        free(back.p);
    }
    int64_t tc0 = cuda_fp8_tensor_core_gemms();
    if (offs) {
        op_fp8_grouped_linear_forward(y.c, x.c, NONE, 0, w8c, po.c);
        op_fp8_grouped_linear_forward(y.d, x.d, NONE, 0, w8d, po.d);
        op_fp8_grouped_linear_backward_input(dx.c, dy.c, w8c, po.c);
        op_fp8_grouped_linear_backward_input(dx.d, dy.d, w8d, po.d);
        op_fp8_grouped_linear_backward_weight(dw.c, dy.c, x.c, NONE, 0, po.c, acc);
        op_fp8_grouped_linear_backward_weight(dw.d, dy.d, x.d, NONE, 0, po.d, acc);
    } else {
        op_fp8_linear_forward(y.c, x.c, w8c), op_fp8_linear_forward(y.d, x.d, w8d);
        op_fp8_linear_backward_input(dx.c, dy.c, w8c, false), op_fp8_linear_backward_input(dx.d, dy.d, w8d, false);
        op_fp8_linear_backward_weight(dw.c, dy.c, x.c), op_fp8_linear_backward_weight(dw.d, dy.d, x.d);
    }
    free(hb);
    int64_t ran = cuda_fp8_tensor_core_gemms() - tc0;
    printf("     %s %s M %lld N %lld K %lld: %lld of 3 GEMMs on the FP8 tensor cores\n", dtype_name(dt),
           offs ? "grouped" : "dense", (long long)M, (long long)N, (long long)K, (long long)ran);
    ASSERT_MSG(dt == DT_BF16 ? ran == tc : ran <= tc, "%lld tensor-core GEMMs", (long long)ran);
    EXPECT_CLOSE(y, tol);
    EXPECT_CLOSE(dx, tol);
    EXPECT_CLOSE(dw, tol);
}

// Tolerances: the rounded operands are equal on both devices, so in fp32 only the order of the sums differs (1e-5);
// the tensor cores add each 128-long block of E4M3 products in a narrower accumulator before cuBLASLt (or our wgmma
// kernel) scales the block into the fp32 sum (docs/reference.md §20; the H200 gave 1.3e-4 on the 1024 × 768 × 512
// forward, bench/results/2026-12-01-fp8b): 1e-3; bf16 outputs round each element (1e-2). The bf16 cases
// (training's) on the tensor cores must run all their GEMMs there; in fp32 the dense ones run where cuBLASLt offers
// an fp32 output (the H200's cuBLAS 13.1 does).
TEST(gpu_op_fp8_linear) {
    gpu_begin();
    int64_t ragged[5] = {0, 40, 40, 190, 200};
    for (int m = 0; m < 2; m++) {
        DType dt = m ? DT_BF16 : DT_F32;
        double tol = m ? 1e-2 : 1e-5, tol_tc = m ? 1e-2 : 1e-3;
        gpu_mode(dt);
        check_fp8_gemms(dt, tol, 150, 136, 200, NULL, 0, 0, true,
                        DT_F32); // off the tensor cores: 150, 200 not multiples of 16
        check_fp8_gemms(dt, tol, 150, 136, 202, NULL, 0, 0, true,
                        DT_F32); // K = 202: the weight's codes without vector loads
        check_fp8_gemms(dt, tol_tc, 1024, 768, 512, NULL, 0, 3, true, DT_F32);
        check_fp8_gemms(dt, tol_tc, 208, 400, 336, NULL, 0, 3, true, DT_F32); // ragged 128-blocks in every dimension
        check_fp8_gemms(dt, tol_tc, 200, 400, 336, NULL, 0, 1, true,
                        DT_F32); // T = 200: the weight gradient alone (Tp = 208)
        check_fp8_gemms(dt, tol, 200, 72, 136, ragged, 4, 0, true,
                        DT_F32); // off the tensor cores: N, K not multiples of 128
    }
    gpu_report();
}

// The experts' forward, input and weight gradient on the wgmma E4M3 kernel against the CPU's rounded-operand GEMMs
// for balanced, skewed, empty and ragged experts: rows not multiples of 128 (the weight gradient's padded token
// blocks), experts with 0 rows, one expert with nearly all rows, K of one and of many 128-blocks. Bounds as
// gpu_op_fp8_linear's tensor-core cases: 1e-3 in fp32 outputs (the weight gradient's but for its bf16 cases), 1e-2 in bf16.
TEST(gpu_op_fp8_grouped) {
    gpu_begin();
    int64_t wide[5] = {0, 700, 1100, 1100, 1536}, bal[9] = {0, 128, 256, 384, 512, 640, 768, 896, 1024};
    int64_t skew[5] = {0, 1, 901, 901, 1000}, tail[4] = {0, 0, 0, 300};
    for (int m = 0; m < 2; m++) {
        DType dt = m ? DT_BF16 : DT_F32;
        double tol = m ? 1e-2 : 1e-3;
        gpu_mode(dt);
        check_fp8_gemms(dt, tol, 1536, 256, 384, wide, 4, 3, true, DT_F32);  // an empty expert, ragged row tiles
        check_fp8_gemms(dt, tol, 1536, 256, 384, wide, 4, 3, false, DT_F32); // dw written: the empty expert's zeroed
        check_fp8_gemms(dt, tol, 1024, 384, 256, bal, 8, 3, true, DT_F32);   // balanced, 128 rows each
        check_fp8_gemms(dt, tol, 1000, 128, 1024, skew, 4, 3, true, DT_F32); // one row, 900 rows, none, 99
        check_fp8_gemms(dt, tol, 300, 256, 128, tail, 3, 3, true, DT_F32);   // the rows all in the last expert
        if (m) // a bf16 weight gradient, added to (its tile loaded, one rounding) and written
            check_fp8_gemms(dt, tol, 1536, 256, 384, wide, 4, 3, true, DT_BF16),
                check_fp8_gemms(dt, tol, 1536, 256, 384, wide, 4, 3, false, DT_BF16);
    }
    gpu_report();
}

// The experts' input gathered by the quantisers (moe_stage3_gathers: row i of the product is token row perm[i] / k):
// the gate_up forward and its weight gradient (bf16, added to and written) bit for bit the products of the rows
// gathered first (a 1 × 128 block is one row's, and the 128 × 1 blocks run along the gathered rows either way), and
// within the tensor-core bounds of the CPU's; T = 200 token rows, k = 4, three experts, one empty.
TEST(gpu_op_fp8_grouped_gathered) {
    gpu_begin();
    gpu_mode(DT_BF16);
    const int64_t T = 200, k = 4, R = T * k, N = 256, K = 384, offs[4] = {0, 300, 300, 800};
    int32_t perm[800];
    for (int64_t i = 0; i < R; i++) perm[i] = (int32_t)((i * 337 + 11) % R); // 337 prime to 800: a permutation
    Pair xt = pair_rand(DT_BF16, 1, 2, T, K, 0, 0), dy = pair_rand(DT_BF16, 1, 2, R, N, 0, 0);
    Pair w = pair_rand(DT_BF16, 0.5f, 3, 3, N, K, 0), po = pair_offs(offs, 4), rows = pair_i32(perm, R);
    Tensor xe = gpu_tensor(DT_BF16, 2, R, K, 0, 0);
    op_gather_rows(xe, xt.d, rows.d, (int)k);
    void *hb = xmalloc(op_fp8_experts_bytes(3, N, K));
    Tensor db = gpu_tensor(DT_U8, 1, (int64_t)op_fp8_experts_bytes(3, N, K), 0, 0, 0);
    Fp8Weight w8c = op_fp8_experts_view(hb, DEV_CPU, 3, N, K), w8d = op_fp8_experts_view(db.p, DEV_CUDA, 3, N, K);
    op_fp8_weight_make(w8c, w.c), op_fp8_weight_make(w8d, w.d);
    Pair y = pair_nan(DT_BF16, 2, R, N, 0, 0);
    Tensor y2 = gpu_tensor(DT_BF16, 2, R, N, 0, 0);
    int64_t tc0 = cuda_fp8_tensor_core_gemms();
    op_fp8_grouped_linear_forward(y.c, xt.c, rows.c, (int)k, w8c, po.c);
    op_fp8_grouped_linear_forward(y.d, xt.d, rows.d, (int)k, w8d, po.d);
    op_fp8_grouped_linear_forward(y2, xe, NONE, 0, w8d, po.d);
    EXPECT_CLOSE(y, 1e-2);
    float *a = gpu_down(y.d), *b = gpu_down(y2);
    ASSERT_MSG(!memcmp(a, b, sizeof(float) * R * N), "the gathered forward differs from the forward on gathered rows");
    free(a), free(b);
    for (int acc = 1; acc >= 0; acc--) {
        Pair dw = pair_rand(DT_BF16, 1, 3, 3, N, K, 0);
        Tensor dw2 = gpu_tensor(DT_BF16, 3, 3, N, K, 0);
        op_copy(dw2, dw.d);
        op_fp8_grouped_linear_backward_weight(dw.c, dy.c, xt.c, rows.c, (int)k, po.c, acc);
        op_fp8_grouped_linear_backward_weight(dw.d, dy.d, xt.d, rows.d, (int)k, po.d, acc);
        op_fp8_grouped_linear_backward_weight(dw2, dy.d, xe, NONE, 0, po.d, acc);
        EXPECT_CLOSE(dw, 1e-2);
        a = gpu_down(dw.d), b = gpu_down(dw2);
        ASSERT_MSG(!memcmp(a, b, sizeof(float) * 3 * N * K), "the gathered weight gradient differs (acc %d)", acc);
        free(a), free(b);
    }
    int64_t ran = cuda_fp8_tensor_core_gemms() - tc0;
    ASSERT_MSG(ran == 6, "%lld of 6 products on the FP8 tensor cores", (long long)ran);
    free(hb);
    gpu_report();
}

// One step of FP8_TEST_MODEL on the GPU in FP8 and in bf16 (learned and force-balanced routing, and with attention
// biases, force-balanced): the loss within 1%, the gradient within calc_diff 5e-2 (every tensor's with balanced
// routing, the whole with learned routing). FP8 covers the experts, the dense MLP and attention's q/k/v/o (the biases
// added after the FP8 product, their gradients from the unrounded dy; the biases start at zero, so the biased pair
// checks their gradients, gpu_op_linear their forward add). H200: loss 1.2e-3, calc_diff 1.0e-2 (learned routing).
TEST(gpu_model_fp8) {
    gpu_begin();
    static char d[256], out[1 << 16], a[300], b[300], model[sizeof FP8_TEST_MODEL + 32], *p;
    snprintf(d, sizeof d, "%s", test_tmpdir());
    write_text(d, "model.json", FP8_TEST_MODEL);
    snprintf(model, sizeof model, "%s", FP8_TEST_MODEL);
    ASSERT((p = strrchr(model, '}')));
    snprintf(p, sizeof model - (size_t)(p - model), ", \"attention_bias\": true}");
    write_text(d, "model-bias.json", model);
    ASSERT(run_cmd(out, sizeof out, "%s synth --output %s/data.bin --vocab 64 --tokens 20000", PITH_BIN, d) == 0);
    write_text(d, "train.json",
               "{\"model\": \"model.json\", \"dataset\": \"data.bin\", \"sequence_length\": 32, "
               "\"micro_batch_size\": 2, \"global_batch_size\": 4, \"max_steps\": 1, \"device\": \"cuda\", "
               "\"init_std\": 0.05, \"optimizer\": {\"lr\": 0.01}}");
    char bias[400];
    snprintf(bias, sizeof bias, "--set benchmark=true --set model=%s/model-bias.json", d);
    char bias8[440];
    snprintf(bias8, sizeof bias8, "%s --set fp8=true", bias);
    const char *const runs[6][2] = {{"bf16", ""},
                                    {"fp8", "--set fp8=true"},
                                    {"bf16-bal", "--set benchmark=true"},
                                    {"fp8-bal", "--set benchmark=true --set fp8=true"},
                                    {"bf16-bias", bias},
                                    {"fp8-bias", bias8}};
    for (int i = 0; i < 6; i++)
        ASSERT_MSG(run_cmd(out, sizeof out, "%s train %s/train.json %s --set run_dir=%s/%s --dump-grads %s/%s/g",
                           PITH_BIN, d, runs[i][1], d, runs[i][0], d, runs[i][0]) == 0,
                   "%s: %s", runs[i][0], out);
    for (int i = 0; i < 6; i += 2) {
        snprintf(a, sizeof a, "%s/%s", d, runs[i + 1][0]), snprintf(b, sizeof b, "%s/%s", d, runs[i][0]);
        double l8 = run_metric(a, 1, "loss"), l16 = run_metric(b, 1, "loss"), all;
        snprintf(a, sizeof a, "%s/%s/g", d, runs[i + 1][0]), snprintf(b, sizeof b, "%s/%s/g", d, runs[i][0]);
        const char *wn;
        double worst = grad_calc_diff(a, b, &wn, &all);
        printf("     %-9s loss %.6f vs bf16 %.6f (%.1e); gradient calc_diff %.1e, worst tensor %.1e (%s)\n",
               runs[i + 1][0], l8, l16, fabs(l8 - l16) / l16, all, worst, wn);
        gpu_mode(DT_BF16), record_err(fabs(l8 - l16) / l16, "loss"), record_err(all, "gradient calc_diff");
        ASSERT(fabs(l8 - l16) <= 0.01 * l16 && all <= 5e-2 && (i == 0 || worst <= 5e-2));
    }
    gpu_report();
}

// Each family's model in FP8 on the GPU against the CPU's emulation (model_compare_fp8: one micro-batch, equal
// weights, fp32 storage, the routing of near-ties shared), at widths where every projection the family caches
// (tests/test_fp8.c: fp8_family_projections_run_in_fp8) takes the FP8 tensor cores (multiples of 16) and the experts
// our wgmma E4M3 kernel (multiples of 128): Qwen3-MoE with a dense layer, DeepSeek-V2's MLA with a q LoRA and a
// shared expert, Qwen3.5's DeltaNet projections, gated attention and shared expert, GPT-OSS's biases, sinks and
// clamped SwiGLU. The quantised operands are the CPU's bit for bit, the products differ in the order of their fp32
// sums (gpu_op_fp8_linear: 1e-3), and a code that lands on the other side of a rounding boundary carries that on.
void model_compare_fp8(const char *config, int B, int S, double lb_coef, double init_std);
TEST(gpu_model_fp8_families) {
    gpu_begin();
    static const char *const dsv2 =
        "{\"model_type\": \"deepseek_v2\", \"hidden_size\": 256, \"num_hidden_layers\": 3, \"num_attention_heads\": 4,"
        " \"q_lora_rank\": 128, \"kv_lora_rank\": 128, \"qk_nope_head_dim\": 16, \"qk_rope_head_dim\": 16,"
        " \"v_head_dim\": 16, \"vocab_size\": 64, \"n_routed_experts\": 8, \"num_experts_per_tok\": 3,"
        " \"moe_intermediate_size\": 128, \"n_shared_experts\": 1, \"intermediate_size\": 256,"
        " \"first_k_dense_replace\": 1}";
    static const char *const q35 =
        "{\"model_type\": \"qwen3_5_moe_text\", \"hidden_size\": 256, \"num_hidden_layers\": 3,"
        " \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 32, \"vocab_size\": 64,"
        " \"num_experts\": 8, \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 128,"
        " \"shared_expert_intermediate_size\": 128, \"linear_num_key_heads\": 2, \"linear_num_value_heads\": 4,"
        " \"linear_key_head_dim\": 32, \"linear_value_head_dim\": 32,"
        " \"layer_types\": [\"linear_attention\", \"full_attention\", \"linear_attention\"]}";
    static const char *const oss =
        "{\"model_type\": \"gpt_oss\", \"hidden_size\": 256, \"num_hidden_layers\": 2, \"num_attention_heads\": 4,"
        " \"num_key_value_heads\": 2, \"head_dim\": 64, \"vocab_size\": 64, \"num_local_experts\": 4,"
        " \"num_experts_per_tok\": 2, \"intermediate_size\": 128, \"sliding_window\": 8, \"swiglu_limit\": 7.0,"
        " \"layer_types\": [\"sliding_attention\", \"full_attention\"]}";
    const char *const fams[4] = {FP8_TEST_MODEL, dsv2, q35, oss};
    for (int f = 0; f < 4; f++) {
        int64_t tc0 = cuda_fp8_tensor_core_gemms();
        model_compare_fp8(fams[f], 2, 32, 0.05, 0.05);
        int64_t tc = cuda_fp8_tensor_core_gemms() - tc0;
        printf("     %.32s…: %lld FP8 GEMMs on the tensor cores\n", fams[f], (long long)tc);
        ASSERT(tc > 0);
    }
    gpu_report();
}

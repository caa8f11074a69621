"""make_fixtures.py — HF parity fixtures for pith's `make test` (run on a machine with transformers).

For each supported family: a tiny random model (random norms and biases, so nothing is trivially 1 or
0), saved with save_pretrained as fp32 safetensors; a token file in PithTrain's format; and, computed in
float64 on the CPU from those same fp32 weights: the mean token cross-entropy over the first B samples,
a few logits, and 5 AdamW steps on that batch (lr 1e-3, betas 0.9/0.95, eps 1e-8, weight decay 0.1,
clip 1.0, constant LR) with each step's loss and pre-clip gradient norm.

usage: python3 tests/hf/make_fixtures.py [OUT_DIR=tests/hf [FAMILY ...]]   (default: every family and
gpt_oss_mxfp4, the MXFP4 import fixture, which needs a GPU)
With PITH_HF_SOURCES=DIR the transformers modeling files the fixtures come from are copied into DIR too,
for reading while writing the pith side (not for the repository).
"""
import copy
import json
import os
import sys

import numpy as np
import torch
import transformers

S, B, STEPS = 16, 4, 5

FAMILIES = {
    "qwen3_moe": dict(
        cls="Qwen3MoeForCausalLM",
        cfg="Qwen3MoeConfig",
        kw=dict(vocab_size=128, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                head_dim=16, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=16, intermediate_size=48,
                mlp_only_layers=[1], decoder_sparse_step=1, norm_topk_prob=True, attention_bias=True,
                rms_norm_eps=1e-6, rope_theta=1e6, max_position_embeddings=64, tie_word_embeddings=False,
                output_router_logits=False, initializer_range=0.05),
    ),
    # DeepSeek-V2: MLA with a q LoRA (q_a_proj → q_a_layernorm → q_b_proj), q head 32 ≠ v head 24, YaRN
    # (attention factor ≠ 1: mscale ≠ mscale_all_dim; original context 64 so the ramp mixes frequencies),
    # group-limited routing (4 groups of 2, top 2 groups), routed_scaling_factor 2, attention biases, a
    # dense first layer, 2 shared experts.
    "deepseek_v2": dict(
        cls="DeepseekV2ForCausalLM",
        cfg="DeepseekV2Config",
        kw=dict(vocab_size=128, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, q_lora_rank=24,
                kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=24, n_routed_experts=8,
                num_experts_per_tok=3, moe_intermediate_size=16, n_shared_experts=2, intermediate_size=48,
                first_k_dense_replace=1, topk_method="group_limited_greedy", n_group=4, topk_group=2,
                routed_scaling_factor=2.0, norm_topk_prob=False, attention_bias=True, rms_norm_eps=1e-6,
                max_position_embeddings=256, tie_word_embeddings=False, initializer_range=0.05,
                rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                                     original_max_position_embeddings=64, beta_fast=32.0, beta_slow=1.0,
                                     mscale=1.0, mscale_all_dim=0.5)),
    ),
    # Like DeepSeek-V2-Lite: q_proj (no q LoRA), greedy top-k, default RoPE, routed_scaling_factor 1, a dense
    # first layer, 2 shared experts; q head 24 ≠ v head 16.
    "deepseek_v2_lite": dict(
        cls="DeepseekV2ForCausalLM",
        cfg="DeepseekV2Config",
        kw=dict(vocab_size=128, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, q_lora_rank=None,
                kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, n_routed_experts=8,
                num_experts_per_tok=2, moe_intermediate_size=16, n_shared_experts=2, intermediate_size=48,
                first_k_dense_replace=1, topk_method="greedy", routed_scaling_factor=1.0, norm_topk_prob=False,
                attention_bias=False, rms_norm_eps=1e-6, max_position_embeddings=64, tie_word_embeddings=False,
                initializer_range=0.05, rope_parameters=dict(rope_type="default", rope_theta=10000.0)),
    ),
    # GPT-OSS: sliding (window 5 < S = 16) and full layers, learned sinks (set well away from 0), biases
    # everywhere, YaRN with truncate false and an attention factor, router top-k → softmax, clamped SwiGLU
    # whose clamp is active: some gate/up biases are ±9, beyond the limit 7 (tweak_gpt_oss).
    "gpt_oss": dict(
        cls="GptOssForCausalLM",
        cfg="GptOssConfig",
        kw=dict(vocab_size=128, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                head_dim=16, num_local_experts=8, num_experts_per_tok=2, intermediate_size=16, sliding_window=5,
                layer_types=["sliding_attention", "full_attention", "sliding_attention"], attention_bias=True,
                rms_norm_eps=1e-5, max_position_embeddings=64, tie_word_embeddings=False,
                output_router_logits=False, initializer_range=0.05,
                rope_parameters=dict(rope_type="yarn", rope_theta=150000.0, factor=4.0, beta_fast=32.0,
                                     beta_slow=1.0, truncate=False, original_max_position_embeddings=16)),
        tweak="tweak_gpt_oss",
    ),
    # Qwen3.5-MoE text model: Gated DeltaNet layers (2 key heads repeated to 4 value heads, key dim 8 ≠ value dim
    # 12, conv kernel 4) and one gated full-attention layer (head 16, partial RoPE on the first 4 dims), 8 experts
    # top-2 always renormalised, a gated shared expert. 72 tokens per sequence: one whole chunk of 64 and a part.
    "qwen3_5_moe": dict(
        cls="Qwen3_5MoeForCausalLM",
        cfg="Qwen3_5MoeTextConfig",
        S=72,
        kw=dict(vocab_size=128, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                head_dim=16, layer_types=["linear_attention", "full_attention", "linear_attention"],
                linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=12,
                linear_conv_kernel_dim=4, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=16,
                shared_expert_intermediate_size=24, attention_bias=False, rms_norm_eps=1e-6,
                max_position_embeddings=128, tie_word_embeddings=False, initializer_range=0.05,
                output_router_logits=False,
                rope_parameters=dict(rope_type="default", rope_theta=1e6, partial_rotary_factor=0.25)),
    ),
}


def tweak_gpt_oss(model):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("sinks"):
                p.copy_(0.5 * torch.randn_like(p))
            elif name.endswith("gate_up_proj_bias"):  # (E, 2I): even columns gate, odd columns up
                p[:, 0] = 9.0   # gate of unit 0 above the limit
                p[:, 3] = -9.0  # up of unit 1 below −limit
                p[:, 5] = 9.0   # up of unit 2 above the limit


def write_tokens(path, tokens):
    with open(path, "wb") as f:
        np.save(f, tokens.astype(np.uint32))
        np.save(f, np.array([len(tokens)], dtype=np.uint64))


def batch_loss(model, ids, labels):
    logits = model(input_ids=ids).logits
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1)), logits


def make(family, spec, out):
    S = spec.get("S", globals()["S"])
    torch.manual_seed(20261129)
    cfg = getattr(transformers, spec["cfg"])(**spec["kw"])
    # Plain loops and plain attention: the fused backends reject float64.
    cfg._experts_implementation = "eager"
    cfg._attn_implementation = "eager"
    model = getattr(transformers, spec["cls"])(cfg).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.2 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.05 * torch.randn_like(p))
    if spec.get("tweak"):
        globals()[spec["tweak"]](model)
    d = os.path.join(out, family)
    os.makedirs(d, exist_ok=True)
    model.save_pretrained(d, safe_serialization=True)
    from safetensors import safe_open
    with safe_open(os.path.join(d, "model.safetensors"), "pt") as f:
        keys = sorted(f.keys())

    rng = np.random.default_rng(7)
    tokens = rng.integers(0, cfg.vocab_size, size=B * S + 1)
    write_tokens(os.path.join(d, "tokens.bin"), tokens)
    ids = torch.tensor(np.stack([tokens[i * S:i * S + S] for i in range(B)]), dtype=torch.long)
    labels = torch.tensor(np.stack([tokens[i * S + 1:i * S + S + 1] for i in range(B)]), dtype=torch.long)

    ref = copy.deepcopy(model).double().train()
    with torch.no_grad():
        loss0, logits = batch_loss(ref, ids, labels)
    opt = torch.optim.AdamW(ref.parameters(), lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    steps = []
    for _ in range(STEPS):
        opt.zero_grad(set_to_none=True)
        loss, _ = batch_loss(ref, ids, labels)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(ref.parameters(), 1.0)
        opt.step()
        steps.append({"loss": loss.item(), "grad_norm": norm.item()})
    expected = {
        "family": family, "transformers": transformers.__version__, "torch": torch.__version__,
        "sequence_length": S, "batch": B, "loss": loss0.item(),
        "logits_sample0_first4x8": logits[0, :4, :8].tolist(),
        "train": {"lr": 1e-3, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1, "clip": 1.0, "steps": steps},
        "saved_keys": keys,
    }
    with open(os.path.join(d, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1)
    print(f"{family}: loss {loss0.item():.9f}, {len(keys)} tensors, steps {[round(s['loss'], 6) for s in steps]}")


def make_mxfp4(out):
    """tests/hf/gpt_oss_mxfp4: a tiny GPT-OSS folder in the released openai/gpt-oss layout, whose expert
    weights are MXFP4 (*_blocks: (E, N, K/32, 16) uint8, two FP4 E2M1 codes a byte, low nibble first;
    *_scales: (E, N, K/32) uint8 E8M0 exponents, 2^(s − 127), one per 32 values), written here from the
    format's definition with random codes; and tests/hf/gpt_oss_mxfp4_ref/dequantized.safetensors: what
    transformers' own dequantisation (integrations.mxfp4.convert_moe_packed_tensors, on the GPU) makes of
    them, plus expected.json with the fp64 loss of the model built from those dequantized experts."""
    from safetensors.torch import save_file
    from transformers.integrations import mxfp4
    torch.manual_seed(20261201)
    kw = dict(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              head_dim=16, num_local_experts=4, num_experts_per_tok=2, intermediate_size=64, sliding_window=5,
              layer_types=["sliding_attention", "full_attention"], attention_bias=True, rms_norm_eps=1e-5,
              max_position_embeddings=64, tie_word_embeddings=False, output_router_logits=False,
              initializer_range=0.05)
    cfg = transformers.GptOssConfig(**kw)
    cfg._experts_implementation = "eager"
    cfg._attn_implementation = "eager"
    model = transformers.GptOssForCausalLM(cfg).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.2 * torch.randn_like(p))
            elif name.endswith("bias") or name.endswith("sinks"):
                p.copy_(0.05 * torch.randn_like(p))
    E, H, I = cfg.num_local_experts, cfg.hidden_size, cfg.intermediate_size
    rng = np.random.default_rng(11)
    tensors, ref = {}, {}
    for name, p in model.state_dict().items():
        if ".mlp.experts." not in name:
            tensors[name] = p.detach().clone().contiguous()
    for l in range(cfg.num_hidden_layers):
        for which, n, k in (("gate_up_proj", 2 * I, H), ("down_proj", H, I)):
            pre = f"model.layers.{l}.mlp.experts.{which}"
            blocks = torch.tensor(rng.integers(0, 256, size=(E, n, k // 32, 16)), dtype=torch.uint8)
            scales = torch.tensor(rng.integers(115, 128, size=(E, n, k // 32)), dtype=torch.uint8)
            tensors[pre + "_blocks"], tensors[pre + "_scales"] = blocks, scales
            tensors[pre + "_bias"] = (0.05 * torch.randn(E, n)).float()
            deq = mxfp4.convert_moe_packed_tensors(blocks.cuda(), scales.cuda(), dtype=torch.float32)
            ref[pre] = deq.float().cpu().contiguous()  # HF's in-memory layout: (E, K, N)
            ref[pre + "_bias"] = tensors[pre + "_bias"]
    d = os.path.join(out, "gpt_oss_mxfp4")
    os.makedirs(d, exist_ok=True)
    cfg_json = cfg.to_dict()
    cfg_json["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    for key in ("_experts_implementation", "_attn_implementation"):
        cfg_json.pop(key, None)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg_json, f, indent=2, sort_keys=True)
    save_file(tensors, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    tokens = np.random.default_rng(7).integers(0, cfg.vocab_size, size=B * S + 1)
    write_tokens(os.path.join(d, "tokens.bin"), tokens)
    r = os.path.join(out, "gpt_oss_mxfp4_ref")
    os.makedirs(r, exist_ok=True)
    save_file(ref, os.path.join(r, "dequantized.safetensors"))
    # The fp64 loss of the model with those experts (what pith eval of the imported folder must give).
    ids = torch.tensor(np.stack([tokens[i * S:i * S + S] for i in range(B)]), dtype=torch.long)
    labels = torch.tensor(np.stack([tokens[i * S + 1:i * S + S + 1] for i in range(B)]), dtype=torch.long)
    state = {k: v for k, v in tensors.items() if ".mlp.experts." not in k}
    for l in range(cfg.num_hidden_layers):
        for which in ("gate_up_proj", "down_proj"):
            pre = f"model.layers.{l}.mlp.experts.{which}"
            state[pre], state[pre + "_bias"] = ref[pre], ref[pre + "_bias"]
    model.load_state_dict(state, strict=True)
    with torch.no_grad():
        loss, _ = batch_loss(copy.deepcopy(model).double(), ids, labels)
    expected = {"family": "gpt_oss", "transformers": transformers.__version__, "sequence_length": S, "batch": B,
                "loss": loss.item()}
    # transformers' own loader on the same folder (dequantize=True), as a check of the layout above.
    try:
        q = transformers.GptOssForCausalLM.from_pretrained(
            d, quantization_config=transformers.Mxfp4Config(dequantize=True), dtype=torch.float32,
            device_map="cuda").eval()
        sd = q.state_dict()
        expected["from_pretrained_max_abs_diff"] = max(
            (sd[k].float().cpu() - v).abs().max().item() for k, v in ref.items())
        with torch.no_grad():
            ql, _ = batch_loss(q, ids.cuda(), labels.cuda())
        expected["from_pretrained_loss_fp32"] = ql.item()
    except Exception as e:  # recorded, not fatal: the reference above does not depend on it
        expected["from_pretrained_error"] = repr(e)[:2000]
    with open(os.path.join(r, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1)
    print(f"gpt_oss_mxfp4: loss {loss.item():.9f}, {expected}")


def copy_sources(dst):
    import inspect
    import shutil
    os.makedirs(dst, exist_ok=True)
    from transformers import conversion_mapping, modeling_rope_utils
    from transformers import masking_utils
    from transformers.integrations import mxfp4
    from transformers.models.deepseek_v2 import modeling_deepseek_v2
    from transformers.models.gpt_oss import configuration_gpt_oss, modeling_gpt_oss
    from transformers.models.qwen3_5_moe import configuration_qwen3_5_moe, modeling_qwen3_5_moe
    for mod in (modeling_deepseek_v2, modeling_qwen3_5_moe, configuration_qwen3_5_moe, modeling_rope_utils,
                conversion_mapping, modeling_gpt_oss, configuration_gpt_oss, mxfp4, masking_utils):
        shutil.copy(inspect.getsourcefile(mod), dst)


if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    names = sys.argv[2:] or list(FAMILIES) + ["gpt_oss_mxfp4"]
    if os.environ.get("PITH_HF_SOURCES"):
        copy_sources(os.environ["PITH_HF_SOURCES"])
    failed = []
    for fam in names:
        try:
            make_mxfp4(out) if fam == "gpt_oss_mxfp4" else make(fam, FAMILIES[fam], out)
        except Exception:  # report every family's failure in one run
            import traceback
            traceback.print_exc()
            failed.append(fam)
    if failed:
        sys.exit(f"failed: {failed}")

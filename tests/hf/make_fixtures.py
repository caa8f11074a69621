"""make_fixtures.py — HF parity fixtures for pith's `make test` (run on a machine with transformers).

For each supported family: a tiny random model (random norms and biases, so nothing is trivially 1 or
0), saved with save_pretrained as fp32 safetensors; a token file in PithTrain's format; and, computed in
float64 on the CPU from those same fp32 weights: the mean token cross-entropy over the first B samples,
a few logits, and 5 AdamW steps on that batch (lr 1e-3, betas 0.9/0.95, eps 1e-8, weight decay 0.1,
clip 1.0, constant LR) with each step's loss and pre-clip gradient norm.

usage: python3 tests/hf/make_fixtures.py [OUT_DIR=tests/hf [FAMILY ...]]   (default: every family)
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


def copy_sources(dst):
    import inspect
    import shutil
    os.makedirs(dst, exist_ok=True)
    from transformers import conversion_mapping, modeling_rope_utils
    from transformers.models.deepseek_v2 import modeling_deepseek_v2
    from transformers.models.qwen3_5_moe import configuration_qwen3_5_moe, modeling_qwen3_5_moe
    for mod in (modeling_deepseek_v2, modeling_qwen3_5_moe, configuration_qwen3_5_moe, modeling_rope_utils,
                conversion_mapping):
        shutil.copy(inspect.getsourcefile(mod), dst)


if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    names = sys.argv[2:] or list(FAMILIES)
    if os.environ.get("PITH_HF_SOURCES"):
        copy_sources(os.environ["PITH_HF_SOURCES"])
    failed = []
    for fam in names:
        try:
            make(fam, FAMILIES[fam], out)
        except Exception:  # report every family's failure in one run
            import traceback
            traceback.print_exc()
            failed.append(fam)
    if failed:
        sys.exit(f"failed: {failed}")

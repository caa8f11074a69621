"""make_released.py — HF parity at the released dimensions, for the GPU suite (gpu_hf_parity_released).

For one family: the released model's config (bench/<dir>/model.json) cut to 2 layers and a vocabulary of 32768,
random weights (matrices N(0, 0.02), norms 1 + N(0, 0.1), biases N(0, 0.02), GPT-OSS's sinks N(0, 0.5)) rounded
to bf16, one random sequence of 4096 tokens in PithTrain's token format, and expected.json with transformers' mean
cross-entropy over it on the GPU in fp64 (`loss`, the reference) and in fp32 (`loss_fp32`, eager attention and
experts: printed beside, since transformers' fp32 itself strays from fp64 by ≈ 3e-6 for GPT-OSS's sliding layers
and Qwen3.5, bench/results/2026-12-02-s18). The fp32 loss is taken before any dtype change (`module.to(dtype)` also rounds the rotary `inv_freq` buffers); the weights are saved after
both, in bf16 (which holds them exactly: half the bytes of fp32) with config.json.

usage: python3 tests/hf/make_released.py FAMILY OUT_DIR [--set KEY=JSON ...]
FAMILY: qwen3_moe, deepseek_v2, gpt_oss or qwen3_5_moe. --set overrides a config key (JSON value), e.g.
--set 'layer_types=["full_attention","full_attention"]', to isolate a feature while investigating a difference
(a key that transformers' config class reads under another name, such as GPT-OSS's rope_scaling, has no effect).
"""
import json
import os
import sys

import numpy as np
import torch
import transformers

LAYERS, VOCAB, SEQ = 2, 32768, 4096

# family: (bench folder with the released config, transformers model class, config class, the 2 layers' types)
FAMILIES = {
    "qwen3_moe": ("bench/qwen3_30b_a3b_8l", "Qwen3MoeForCausalLM", "Qwen3MoeConfig", None),
    "deepseek_v2": ("bench/deepseek_v2_lite_8l", "DeepseekV2ForCausalLM", "DeepseekV2Config", None),
    "gpt_oss": ("bench/gpt_oss_20b_4l", "GptOssForCausalLM", "GptOssConfig",
                ["sliding_attention", "full_attention"]),
    "qwen3_5_moe": ("bench/qwen3_5_8l", "Qwen3_5MoeForCausalLM", "Qwen3_5MoeTextConfig",
                    ["linear_attention", "full_attention"]),
}


def write_tokens(path, tokens):
    with open(path, "wb") as f:
        np.save(f, tokens.astype(np.uint32))
        np.save(f, np.array([len(tokens)], dtype=np.uint64))


def loss_of(model, ids, labels):
    with torch.no_grad():
        logits = model(input_ids=ids).logits
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).double(),
                                                 labels.reshape(-1)).item()


def main():
    if len(sys.argv) < 3 or sys.argv[1] not in FAMILIES:
        sys.exit(__doc__)
    family, out = sys.argv[1], sys.argv[2]
    sets = [a.split("=", 1) for a in sys.argv[3:] if a != "--set"]
    src, cls, cfg_cls, types = FAMILIES[family]
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    cfg = json.load(open(os.path.join(root, src, "model.json")))
    cfg.update(num_hidden_layers=LAYERS, vocab_size=VOCAB, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    if types:
        cfg["layer_types"] = types
    for k, v in sets:
        cfg[k] = json.loads(v)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)

    torch.manual_seed(20261202)
    config = getattr(transformers, cfg_cls).from_pretrained(out)
    config._experts_implementation = "eager"
    config._attn_implementation = "eager"
    with torch.device("cuda"):
        model = getattr(transformers, cls)(config).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("sinks"):
                p.copy_(0.5 * torch.randn_like(p))
            elif "norm" in name and p.dim() == 1:
                p.copy_(1 + 0.1 * torch.randn_like(p))
            elif name.endswith("bias") and "dt_bias" not in name:
                p.copy_(0.02 * torch.randn_like(p))
            elif p.dim() >= 2:
                p.copy_(0.02 * torch.randn_like(p))
            p.copy_(p.bfloat16().float())

    tokens = np.random.default_rng(7).integers(0, VOCAB, size=SEQ + 1)
    write_tokens(os.path.join(out, "tokens.bin"), tokens)
    ids = torch.tensor(tokens[None, :SEQ], dtype=torch.long, device="cuda")
    labels = torch.tensor(tokens[None, 1:], dtype=torch.long, device="cuda")
    fp32 = loss_of(model, ids, labels)  # before any dtype change (see the docstring)
    fp64 = loss_of(model.double(), ids, labels)
    model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    expected = {"family": family, "transformers": transformers.__version__, "torch": torch.__version__,
                "sequence_length": SEQ, "batch": 1, "loss": fp64, "loss_fp32": fp32, "config_sets": dict(sets)}
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1)
    print(f"{family}: loss fp32 {fp32:.9f}, fp64 {fp64:.9f} (fp32 − fp64: {(fp32 - fp64) / fp64:.2e} relative)")


if __name__ == "__main__":
    main()

# Peer for single-GPU benchmarks: Hugging Face transformers' Qwen3.5-MoE text model on PyTorch (what a user would pick
# instead), with its own delta-rule path (flash-linear-attention's kernels when installed, else transformers' torch
# chunked form). Measures forward+backward tokens/s and peak memory for Qwen3.5-35B-A3B's text shapes cut to --layers
# layers (3 linear : 1 full) and --experts experts (128: bench/qwen3_5_8l/README.md says why), as
# bench/qwen3_5_8l/model.json.
# Usage on the GPU machine: python3 peer_hf_qwen3_5.py [--layers 8] [--experts 128] [--mbs 2] [--seq 4096] [--compile]
#   [--compile-layers] [--eager-delta] [--balanced]
# --compile compiles the whole model; --compile-layers each decoder layer (a common way to bound compile time).
# --eager-delta keeps the delta rule itself out of the graph (torch.compiler.disable) while the rest compiles:
# transformers' torch chunked form loops over chunks and chunk rows in Python, which dynamo unrolls (64 chunks of
# 63 rows at 4096 tokens) and which did not finish compiling inside a device call (bench/qwen3_5_8l/README.md).
# --balanced routes token t to experts (t + j·E/k) mod E (pith's benchmark: true), replacing the router's choice.
import argparse, json, torch
from peer_common import time_fwd_bwd
from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig
ap = argparse.ArgumentParser()
ap.add_argument("--layers", type=int, default=8); ap.add_argument("--mbs", type=int, default=2)
ap.add_argument("--seq", type=int, default=4096); ap.add_argument("--compile", action="store_true")
ap.add_argument("--compile-layers", action="store_true")  # torch.compile per decoder layer (one graph per layer kind)
ap.add_argument("--balanced", action="store_true"); ap.add_argument("--iters", type=int, default=5)
ap.add_argument("--experts", type=int, default=128); ap.add_argument("--eager-delta", action="store_true")
a = ap.parse_args()
cfg = Qwen3_5MoeTextConfig(vocab_size=248320, hidden_size=2048, num_hidden_layers=a.layers, num_attention_heads=16,
    num_key_value_heads=2, head_dim=256, linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128,
    linear_value_head_dim=128, linear_conv_kernel_dim=4, num_experts=a.experts, num_experts_per_tok=8,
    moe_intermediate_size=512, shared_expert_intermediate_size=512, rms_norm_eps=1e-6, max_position_embeddings=a.seq,
    layer_types=["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(a.layers)],
    rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25},
    tie_word_embeddings=False)
cfg._attn_implementation = "sdpa"
torch.manual_seed(0)
with torch.device("cuda"):
    model = Qwen3_5MoeForCausalLM(cfg).to(torch.bfloat16)
if a.balanced:  # the forced routing of pith's benchmark mode, weights from the softmax, renormalised like pith's
    E, k = cfg.num_experts, cfg.num_experts_per_tok
    for layer in model.model.layers:
        gate = layer.mlp.gate
        def forced(self, h, E=E, k=k):
            h = h.reshape(-1, self.hidden_dim)
            logits = torch.nn.functional.linear(h, self.weight)
            t = torch.arange(h.shape[0], device=h.device)[:, None]
            idx = (t + torch.arange(k, device=h.device)[None, :] * (E // k)) % E
            w = logits.float().softmax(-1).gather(1, idx)
            return logits, (w / w.sum(-1, keepdim=True)).to(logits.dtype), idx
        gate.forward = forced.__get__(gate)
import transformers.models.qwen3_5_moe.modeling_qwen3_5_moe as hf_q35
rule = hf_q35.torch_chunk_gated_delta_rule  # transformers' own path, or flash-linear-attention's kernel
delta_path = getattr(rule, "__module__", "?") + "." + getattr(rule, "__name__", "?")
eager_calls = [0]
if a.eager_delta:  # a graph break around each call of the rule (the layer's forward looks it up in its module)
    @torch.compiler.disable
    def eager_rule(*args, **kw):
        eager_calls[0] += 1  # counts only when the rule runs outside a graph, as intended
        return rule(*args, **kw)
    hf_q35.torch_chunk_gated_delta_rule = eager_rule
fwd = torch.compile(model) if a.compile else model
if a.compile_layers:  # a graph per layer, each far smaller than the whole model's
    for layer in model.model.layers: layer.compile()
t, peak = time_fwd_bwd(fwd, cfg.vocab_size, a.mbs, a.seq, a.iters)
mode = ("+compile" if a.compile else "+compile-layers" if a.compile_layers else "") + \
    (" (delta rule eager)" if a.eager_delta else "")
print(json.dumps({"peer": "hf-transformers" + mode + (" balanced" if a.balanced else ""),
    "model": "qwen3.5-35b-a3b", "layers": a.layers, "experts": a.experts, "delta_rule": delta_path,
    "delta_rule_eager_calls": eager_calls[0],
    "experts_implementation": getattr(model.config, "_experts_implementation", None),
    "mbs": a.mbs, "seq": a.seq, "step_s": t,
    "tokens_per_s": a.mbs * a.seq / t, "peak_gb": peak,
    "params": sum(p.numel() for p in model.parameters())}))

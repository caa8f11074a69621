# Peer for single-GPU benchmarks: Hugging Face transformers' DeepSeek-V2 on PyTorch (what a user would pick instead).
# Measures forward+backward tokens/s and peak memory for DeepSeek-V2-Lite's shapes cut to --layers layers (layer 0
# dense, as in V2-Lite), the same as bench/deepseek_v2_lite_8l/model.json.
# Usage on the GPU machine: python3 peer_hf_deepseek_v2.py [--layers 8] [--mbs 2] [--seq 4096] [--compile] [--balanced]
# --balanced routes token t to experts (t + j·E/k) mod E (pith's benchmark: true), replacing the router's choice.
import argparse, json, torch
from peer_common import time_fwd_bwd
from transformers import DeepseekV2Config, DeepseekV2ForCausalLM
ap = argparse.ArgumentParser()
ap.add_argument("--layers", type=int, default=8); ap.add_argument("--mbs", type=int, default=2)
ap.add_argument("--seq", type=int, default=4096); ap.add_argument("--compile", action="store_true")
ap.add_argument("--balanced", action="store_true"); ap.add_argument("--iters", type=int, default=5)
a = ap.parse_args()
cfg = DeepseekV2Config(vocab_size=102400, hidden_size=2048, intermediate_size=10944, num_hidden_layers=a.layers,
    num_attention_heads=16, q_lora_rank=None, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
    v_head_dim=128, n_routed_experts=64, num_experts_per_tok=6, moe_intermediate_size=1408, n_shared_experts=2,
    first_k_dense_replace=1, topk_method="greedy", routed_scaling_factor=1.0, rms_norm_eps=1e-6,
    max_position_embeddings=a.seq, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    tie_word_embeddings=False)
cfg._attn_implementation = "sdpa"
torch.manual_seed(0)
with torch.device("cuda"):
    model = DeepseekV2ForCausalLM(cfg).to(torch.bfloat16)
if a.balanced:  # the forced routing of pith's benchmark mode, weights gathered from the softmax like pith's
    E, k = cfg.n_routed_experts, cfg.num_experts_per_tok
    for layer in model.model.layers:
        gate = getattr(layer.mlp, "gate", None)
        if gate is None: continue
        def forced(self, h, E=E, k=k):
            h = h.view(-1, self.hidden_dim)
            logits = torch.nn.functional.linear(h.float(), self.weight.float())
            t = torch.arange(h.shape[0], device=h.device)[:, None]
            idx = (t + torch.arange(k, device=h.device)[None, :] * (E // k)) % E
            w = logits.softmax(-1).gather(1, idx) * self.routed_scaling_factor
            return logits, w, idx
        gate.forward = forced.__get__(gate)
fwd = torch.compile(model) if a.compile else model
t, peak = time_fwd_bwd(fwd, cfg.vocab_size, a.mbs, a.seq, a.iters)
print(json.dumps({"peer": "hf-transformers" + ("+compile" if a.compile else "") + (" balanced" if a.balanced else ""),
    "model": "deepseek-v2-lite", "layers": a.layers, "mbs": a.mbs, "seq": a.seq, "step_s": t,
    "tokens_per_s": a.mbs * a.seq / t, "peak_gb": peak,
    "params": sum(p.numel() for p in model.parameters())}))

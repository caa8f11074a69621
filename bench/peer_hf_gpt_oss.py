# Peer for single-GPU benchmarks: Hugging Face transformers' GPT-OSS on PyTorch (what a user would pick instead).
# Measures forward+backward tokens/s and peak memory for gpt-oss-20b's shapes cut to --layers layers (sliding and
# full attention alternating, as in the model), the same as bench/gpt_oss_20b_4l/model.json, bf16 weights.
# transformers 5.17 runs GPT-OSS attention eager (it has no SDPA path for sinks; --attn picks another backend,
# e.g. flex_attention) and its experts through its default experts implementation.
# Usage on the GPU machine: python3 peer_hf_gpt_oss.py [--layers 4] [--mbs 2] [--seq 4096] [--compile] [--balanced]
# --balanced routes token t to experts (t + j·E/k) mod E (pith's benchmark: true), weights the softmax over those
# k logits, replacing the router's choice.
import argparse, json, torch
from peer_common import time_fwd_bwd
from transformers import GptOssConfig, GptOssForCausalLM
ap = argparse.ArgumentParser()
ap.add_argument("--layers", type=int, default=4); ap.add_argument("--mbs", type=int, default=2)
ap.add_argument("--seq", type=int, default=4096); ap.add_argument("--compile", action="store_true")
ap.add_argument("--balanced", action="store_true"); ap.add_argument("--iters", type=int, default=5)
ap.add_argument("--attn", default="eager")
a = ap.parse_args()
cfg = GptOssConfig(vocab_size=201088, hidden_size=2880, intermediate_size=2880, num_hidden_layers=a.layers,
    num_attention_heads=64, num_key_value_heads=8, head_dim=64, num_local_experts=32, num_experts_per_tok=4,
    sliding_window=128, layer_types=["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(a.layers)],
    rms_norm_eps=1e-5, max_position_embeddings=131072, attention_bias=True, tie_word_embeddings=False,
    rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                     "truncate": False, "original_max_position_embeddings": 4096})
cfg._attn_implementation = a.attn
torch.manual_seed(0)
with torch.device("cuda"):
    model = GptOssForCausalLM(cfg).to(torch.bfloat16)
if a.balanced:  # the forced routing of pith's benchmark mode
    E, k = cfg.num_local_experts, cfg.num_experts_per_tok
    for layer in model.model.layers:
        def forced(self, h, E=E, k=k):
            logits = torch.nn.functional.linear(h, self.weight, self.bias)
            t = torch.arange(h.shape[0], device=h.device)[:, None]
            idx = (t + torch.arange(k, device=h.device)[None, :] * (E // k)) % E
            return logits, logits.gather(1, idx).softmax(-1), idx
        layer.mlp.router.forward = forced.__get__(layer.mlp.router)
fwd = torch.compile(model) if a.compile else model
t, peak = time_fwd_bwd(fwd, cfg.vocab_size, a.mbs, a.seq, a.iters)
print(json.dumps({"peer": "hf-transformers" + ("+compile" if a.compile else "") + (" balanced" if a.balanced else ""),
    "model": "gpt-oss-20b", "attn": a.attn, "layers": a.layers, "mbs": a.mbs, "seq": a.seq, "step_s": t,
    "tokens_per_s": a.mbs * a.seq / t, "peak_gb": peak, "params": sum(p.numel() for p in model.parameters())}))

# peer_delta.py — the gated delta rule alone at the benchmark's shapes (2 × 4096 tokens, 16 key heads repeated to 32
# value heads of 128, bf16, chunk 64), forward+backward, in the best PyTorch implementation on the machine:
# flash-linear-attention's chunk_gated_delta_rule when it imports, and transformers' torch_chunk_gated_delta_rule
# (the path transformers 5.17 takes without flash-linear-attention), eager and under torch.compile.
# Prints one JSON line per implementation: median fwd+bwd ms over 5 steps after 2 warm-ups, peak GB.
import json, torch
from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe as hf

B, T, NK, NV, D = 2, 4096, 16, 32, 128
torch.manual_seed(0)
dev, bf = "cuda", torch.bfloat16
q0 = torch.randn(B, T, NK, D, device=dev, dtype=bf)
k0 = torch.randn(B, T, NK, D, device=dev, dtype=bf)
v0 = torch.randn(B, T, NV, D, device=dev, dtype=bf)
g0 = -torch.nn.functional.softplus(torch.randn(B, T, NV, device=dev)).float()
b0 = torch.rand(B, T, NV, device=dev).float()
do = torch.randn(B, T, NV, D, device=dev, dtype=bf)

def run(fn, name):
    q, k, v = (x.clone().requires_grad_() for x in (q0, k0, v0))
    g, b = g0.clone().requires_grad_(), b0.clone().requires_grad_()
    def step():
        # key heads repeated to the value heads, as the HF layer does before the rule
        o = fn(q.repeat_interleave(NV // NK, dim=2), k.repeat_interleave(NV // NK, dim=2), v, g, b)
        (o.float() * do.float()).sum().backward()
    try:
        for _ in range(2): step()
        torch.cuda.synchronize(); torch.cuda.reset_peak_memory_stats()
        ts = []
        for _ in range(5):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record(); step(); e.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(e))
        peak = torch.cuda.max_memory_allocated() / 1e9
        print(json.dumps({"impl": name, "fwd_bwd_ms": sorted(ts)[2], "peak_gb": peak}))
    except Exception as ex:
        print(json.dumps({"impl": name, "error": repr(ex)[:300]}))

def hf_torch(q, k, v, g, b):
    o, _ = hf.torch_chunk_gated_delta_rule(q, k, v, g=g, beta=b, chunk_size=64, initial_state=None,
                                           output_final_state=False, use_qk_l2norm_in_kernel=True)
    return o

print(json.dumps({"transformers_fast_path": bool(getattr(hf, "is_fast_path_available", False)),
                  "fla_chunk_gated_delta_rule": getattr(hf, "chunk_gated_delta_rule", None) is not None}))
try:
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_rule
    run(lambda q, k, v, g, b: fla_rule(q, k, v, g=g, beta=b, use_qk_l2norm_in_kernel=True)[0], "fla")
except ImportError:
    print(json.dumps({"impl": "fla", "error": "not installed"}))
run(hf_torch, "transformers torch_chunk_gated_delta_rule")
run(torch.compile(hf_torch), "transformers torch_chunk_gated_delta_rule + torch.compile")

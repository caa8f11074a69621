# peer_grouped.py — PyTorch's F.grouped_mm at the expert-GEMM shapes of `bench_gpu_ops --grouped`: one MoE layer at
# T = 8192 tokens (Qwen3-30B-A3B: 128 experts top-8, hidden 2048, width 768; DeepSeek-V2-Lite: 64 experts top-6,
# width 1408), balanced and skewed routing (the same row counts as bench_gpu_ops.c's skewed_offs), bf16.
# Rows "PEER|name|ms|TFLOP/s|TFLOP/s", median of CUDA-event times over 20 calls after 5 warm-ups. The weight
# gradient here writes a bf16 dw, half the bytes of pith's fp32 dw: grouped_mm has no fp32 accumulating output, and
# torch 2.11 refuses out_dtype=float32 ("Grouped gemm output dtype must match `mat_a` dtype", measured 2026-12-01).
import torch
import torch.nn.functional as F

dev, bf = "cuda", torch.bfloat16
gmm = getattr(F, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)


def bench(fn, reps=20):
    for _ in range(5):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return sorted(times)[len(times) // 2]


def skewed(R, E):
    q = [1000000 // (e + 8) for e in range(E)]
    Q = sum(q)
    c = [R * qe // Q for qe in q]
    c[0] += R - sum(c)
    return c


print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}", flush=True)
for model, T, H, E, k, I in (("qwen3", 8192, 2048, 128, 8, 768), ("dsv2", 8192, 2048, 64, 6, 1408)):
    R = T * k
    xe, gu = torch.randn(R, H, device=dev, dtype=bf), torch.randn(R, 2 * I, device=dev, dtype=bf)
    act, ye = torch.randn(R, I, device=dev, dtype=bf), torch.randn(R, H, device=dev, dtype=bf)
    wgu, wd = torch.randn(E, 2 * I, H, device=dev, dtype=bf) * 0.02, torch.randn(E, H, I, device=dev, dtype=bf) * 0.02
    fg, fdn = 2.0 * R * 2 * I * H, 2.0 * R * I * H
    for rt in ("balanced", "skewed"):
        counts = [R // E] * E if rt == "balanced" else skewed(R, E)
        offs = torch.cumsum(torch.tensor(counts, device=dev), 0).to(torch.int32)
        rows = (
            ("gate_up fwd", fg, lambda: gmm(xe, wgu.transpose(-2, -1), offs=offs)),
            ("gate_up bwd input", fg, lambda: gmm(gu, wgu, offs=offs)),
            ("gate_up bwd weight fp32", fg, lambda: gmm(gu.t(), xe, offs=offs)),
            ("down fwd", fdn, lambda: gmm(act, wd.transpose(-2, -1), offs=offs)),
            ("down bwd input", fdn, lambda: gmm(ye, wd, offs=offs)),
            ("down bwd weight fp32", fdn, lambda: gmm(ye.t(), act, offs=offs)),
        )
        for what, flops, fn in rows:
            name = f"{model} {what} (T={T}, {rt}, torch)"
            try:
                ms = bench(fn)
                print(f"{name:60s} {ms:8.3f} ms {flops / ms / 1e9:7.1f} TFLOP/s")
                print(f"PEER|{name}|{ms:.4f}|{flops / ms / 1e9:.1f}|TFLOP/s", flush=True)
            except Exception as ex:  # an unsupported shape on this torch: say so, keep going
                print(f"PEER|{name}|nan|nan|n/a ({type(ex).__name__}: {str(ex).splitlines()[0][:120]})", flush=True)

# peer_kernels.py — the PyTorch counterparts of bench/bench_gpu_ops.c at the same Qwen3-30B-A3B layer
# sizes (T = 4096 tokens, hidden 2048, 32/4 heads of 128, 128 experts top-8 of width 768, vocab 151936),
# bf16: torch.matmul, F.grouped_mm, SDPA (cuDNN and flash backends), torch.compile'd RMSNorm / RoPE /
# SwiGLU / cross-entropy, fused AdamW and a device copy. Times are CUDA-event medians of single calls
# after warm-up. One line per op, "PEER|name|ms|rate|unit", with bench_gpu_ops' names where the two
# measure the same work (bench/report.py pairs them). Usage (GPU machine): python3 bench/peer_kernels.py
# [--no-compile] (skips the torch.compile'd ops, whose compilation takes a minute).
import math, sys, torch
import torch.nn.functional as F

torch.manual_seed(0)
dev, bf = "cuda", torch.bfloat16
T, H, nh, nkv, d, E, k, I, V = 4096, 2048, 32, 4, 128, 128, 8, 768, 151936
R, C = T * k, (64 << 20) // (V * 4)


def bench(fn, reps=20, warm=3):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); fn(); e.record(); torch.cuda.synchronize()
        ts.append(s.elapsed_time(e))
    ts.sort()
    return ts[len(ts) // 2]


def out(name, ms, work, unit):
    rate = work / (ms / 1e3) / 1e12 * (1e3 if unit[0] == "G" else 1)
    print(f"{name:44s} {ms:9.3f} ms  {rate:8.1f} {unit}")
    print(f"PEER|{name}|{ms:.4f}|{rate:.1f}|{unit}", flush=True)


def attempt(name, f):
    try:
        f()
    except Exception as ex:  # a backend or op this torch lacks: say so, go on
        print(f"PEER|{name}|nan|nan|n/a ({type(ex).__name__}: {str(ex).splitlines()[0][:120]})", flush=True)


print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}", flush=True)

# ---- dense GEMMs (torch.matmul: bf16 out; pith's weight gradient accumulates into fp32) ----
x, wq, dy = torch.randn(T, H, device=dev, dtype=bf), torch.randn(nh * d, H, device=dev, dtype=bf) * 0.02, torch.randn(T, nh * d, device=dev, dtype=bf)
f = 2.0 * T * nh * d * H
out("gemm q_proj fwd 4096x2048->4096", bench(lambda: torch.matmul(x, wq.t())), f, "TFLOP/s")
out("gemm q_proj bwd input", bench(lambda: torch.matmul(dy, wq)), f, "TFLOP/s")
out("gemm q_proj bwd weight (fp32 acc)", bench(lambda: torch.matmul(dy.t(), x)), f, "TFLOP/s")

# ---- grouped experts: F.grouped_mm with offsets (balanced R/E rows each, then the natural routing) ----
gmm = getattr(F, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)
xe, wgu = torch.randn(R, H, device=dev, dtype=bf), torch.randn(E, 2 * I, H, device=dev, dtype=bf) * 0.02
gu = torch.randn(R, 2 * I, device=dev, dtype=bf)
fg = 2.0 * R * 2 * I * H
xr, wr = torch.randn(T, H, device=dev, dtype=bf), torch.randn(E, H, device=dev, dtype=bf) * 0.02
top = torch.topk(torch.softmax((xr @ wr.t()).float(), -1), k, dim=-1).indices.flatten()
counts = torch.bincount(top, minlength=E)
for tag, offs in (("balanced", torch.arange(1, E + 1, device=dev, dtype=torch.int32) * (R // E)),
                  ("natural", torch.cumsum(counts, 0).to(torch.int32))):
    wt = wgu.transpose(-2, -1)  # (E, H, 2I): x_e · w_eᵀ
    attempt(f"grouped gate_up fwd ({tag})", lambda: out(f"grouped gate_up fwd ({tag})", bench(lambda: gmm(xe, wt, offs=offs)), fg, "TFLOP/s"))
    attempt(f"grouped gate_up bwd input ({tag})", lambda: out(f"grouped gate_up bwd input ({tag})", bench(lambda: gmm(gu, wgu, offs=offs)), fg, "TFLOP/s"))
    attempt(f"grouped gate_up bwd weight fp32 ({tag})",
            lambda: out(f"grouped gate_up bwd weight fp32 ({tag})", bench(lambda: gmm(gu.t(), xe, offs=offs)), fg, "TFLOP/s"))

# ---- attention: causal GQA 32/4, S = 4096, d = 128 ----
from torch.nn.attention import SDPBackend, sdpa_kernel
q = torch.randn(1, nh, T, d, device=dev, dtype=bf, requires_grad=True)
kk = torch.randn(1, nkv, T, d, device=dev, dtype=bf, requires_grad=True)
vv = torch.randn(1, nkv, T, d, device=dev, dtype=bf, requires_grad=True)
fa = 4.0 * T * T * d * nh / 2
for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
    def run_attn(name=name, backend=backend):
        with sdpa_kernel([backend]):
            try:
                o = F.scaled_dot_product_attention(q, kk, vv, is_causal=True, enable_gqa=True)
                ke, ve = kk, vv
                gqa = lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=True, enable_gqa=True)
            except Exception:  # the backend wants equal head counts: repeat k, v (same FLOPs)
                ke, ve = kk.repeat_interleave(nh // nkv, 1).detach().requires_grad_(), vv.repeat_interleave(nh // nkv, 1).detach().requires_grad_()
                gqa = lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=True)
            go = torch.randn(1, nh, T, d, device=dev, dtype=bf)
            tf = bench(lambda: gqa(q, ke, ve))
            tfb = bench(lambda: torch.autograd.grad(gqa(q, ke, ve), (q, ke, ve), go))
            out(f"attention fwd S=4096 d=128 GQA 32/4 [{name}]", tf, fa, "TFLOP/s")
            out(f"attention bwd [{name}]", tfb - tf, 2.5 * fa, "TFLOP/s")
            out(f"attention fwd+bwd [{name}]", tfb, 3.5 * fa, "TFLOP/s")
    attempt(f"attention fwd+bwd [{name}]", run_attn)

# ---- memory-bound, torch.compile'd (HF Qwen3's formulas) ----
NO_COMPILE = "--no-compile" in sys.argv
eps = 1e-6


def rmsnorm(x, w):
    h = x.float()
    return w * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def swiglu(gu):
    g, u = gu.chunk(2, dim=-1)
    return F.silu(g) * u


def rope(q, cos, sin):
    q1, q2 = q[..., : d // 2], q[..., d // 2:]
    return q * cos + torch.cat((-q2, q1), dim=-1) * sin


def fwd_bwd(fn, *args):
    y = fn(*args)
    return torch.autograd.grad(y, [a for a in args if a.requires_grad], torch.ones_like(y))


def compiled(name, fn, args, fwd_bytes, bwd_bytes):
    if NO_COMPILE:
        return
    cf = torch.compile(fn)
    tf = bench(lambda: cf(*args))
    out(name, tf, fwd_bytes, "GB/s")
    if bwd_bytes:
        tb = bench(lambda: fwd_bwd(cf, *args)) - tf
        out(name.split(" (")[0].replace("fwd", "bwd"), tb, bwd_bytes, "GB/s")


xn = torch.randn(T, H, device=dev, dtype=bf, requires_grad=True)
wn = torch.ones(H, device=dev, dtype=bf, requires_grad=True)
attempt("rmsnorm fwd (4096, 2048)", lambda: compiled("rmsnorm fwd (4096, 2048)", rmsnorm, (xn, wn), 2.0 * T * H * 2, 4.0 * T * H * 2))
qn = torch.randn(T * nh, d, device=dev, dtype=bf)
wq1 = torch.ones(d, device=dev, dtype=bf)
attempt("rmsnorm fwd q-norm (131072, 128)", lambda: compiled("rmsnorm fwd q-norm (131072, 128)", rmsnorm, (qn, wq1), 2.0 * T * nh * d * 2, 0))
qr = torch.randn(T, nh, d, device=dev, dtype=bf)
ang = torch.arange(T, device=dev).float()[:, None] * (1e6 ** (-torch.arange(0, d, 2, device=dev).float() / d))[None]
cos, sin = torch.cat([ang.cos()] * 2, -1)[:, None, :], torch.cat([ang.sin()] * 2, -1)[:, None, :]
attempt("rope q (4096, 32, 128)", lambda: compiled("rope q (4096, 32, 128)", rope, (qr, cos, sin), 2.0 * T * nh * d * 2, 0))
gus = torch.randn(R, 2 * I, device=dev, dtype=bf, requires_grad=True)
attempt("swiglu fwd (32768 x 768)", lambda: compiled("swiglu fwd (32768 x 768)", swiglu, (gus,), R * 3.0 * I * 2, R * 5.0 * I * 2))
lg = torch.randn(C, V, device=dev, dtype=torch.float32, requires_grad=True) * 2
lg = lg.detach().requires_grad_()
lab = (torch.arange(C, device=dev) * 7919) % V
ce = torch.compile(lambda l: F.cross_entropy(l, lab, reduction="sum"))
if not NO_COMPILE:
  attempt(f"cross-entropy chunk {C} rows",
          lambda: out(f"cross-entropy chunk {C} rows", bench(lambda: torch.autograd.grad(ce(lg), lg)), 3.0 * C * V * 4, "GB/s"))

# ---- optimizer and copy ----
n = 30_000_000
p = torch.nn.Parameter(torch.randn(n, device=dev))
p.grad = torch.randn(n, device=dev)
opt = torch.optim.AdamW([p], lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, fused=True)
out("adamw 30M params", bench(opt.step), n * 7 * 4.0, "GB/s")
a, b = torch.empty(256 << 20, device=dev), torch.empty(256 << 20, device=dev)
out("copy d2d 1 GiB (bandwidth ceiling)", bench(lambda: b.copy_(a), reps=10), 2.0 * (1 << 30), "GB/s")

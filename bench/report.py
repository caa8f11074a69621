# report.py — the table of bench/run_gpu.sh: end-to-end training throughput of pith against the
# Hugging Face peer (eager and torch.compile), and each kernel against its PyTorch counterpart, from the
# logs in one folder (train.txt, peers.txt, bench_ops.txt, peer_kernels.txt). Usage: python3 report.py DIR
import json, os, re, statistics, sys

d = sys.argv[1] if len(sys.argv) > 1 else "/tmp/pith-bench"


def read(name):
    p = os.path.join(d, name)
    return open(p, errors="replace").read() if os.path.exists(p) else ""


# ---- FLOPs per token of the benchmark model (forward; ×3 for forward + backward) ----
H, L, nh, nkv, hd, E, K, I, V, S = 2048, 8, 32, 4, 128, 128, 8, 768, 151936, 4096
f_proj = 2 * H * (nh * hd + 2 * nkv * hd) + 2 * nh * hd * H  # q, k, v, o projections
f_attn = 2 * 2 * hd * nh * (S / 2)                           # QKᵀ and P·V over S/2 visible keys on average
f_router = 2 * H * E
f_experts = K * 3 * 2 * H * I                                 # gate, up, down of the top-8 experts
f_head = 2 * H * V
f_tok = 3 * (L * (f_proj + f_attn + f_router + f_experts) + f_head)
PEAK = 989e12

lines = []
p = lambda s="": lines.append(s)
p(f"FLOPs per token (fwd+bwd = 3 × fwd): {L} × (proj {f_proj/1e6:.2f}M + attention {f_attn/1e6:.2f}M + router {f_router/1e6:.2f}M"
  f" + experts {f_experts/1e6:.2f}M) + LM head {f_head/1e6:.2f}M = {f_tok/3/1e9:.3f} GFLOP fwd, {f_tok/1e9:.3f} GFLOP fwd+bwd; MFU against {PEAK/1e12:.0f} TFLOP/s")
p()

# ---- end to end ----
rows = []
# train.txt: the run of run_gpu.sh's routing; train_balanced.txt: the force-balanced run beside it (--both)
for log, name in (("train.txt", "pith (bf16, fwd+bwd)"), ("train_balanced.txt", "pith (bf16, fwd+bwd, force-balanced)")):
    m = re.findall(r'^\{"step".*\}$', read(log), re.M)
    nparam = re.search(r"([\d.]+) M parameters", read(log))
    nparam = float(nparam.group(1)) * 1e6 if nparam else 0
    if not m:
        continue
    recs = [json.loads(x) for x in m]
    late = [r for r in recs if r["step"] >= 3] or recs
    fb = statistics.median(r["fwdbwd_s"] for r in late)
    opt = statistics.median(r["step_time_s"] - r["fwdbwd_s"] for r in late)
    peak = max(r["gpu_peak_gb"] for r in recs)
    tps = 2 * 4096 / fb
    nonmaster = peak - 12 * nparam / 1e9  # less the fp32 master weights and the two Adam moments
    rows.append((name, tps, fb, peak, f"{nonmaster:.1f}", f"optimizer {opt*1e3:.1f} ms, loss {recs[-1]['loss']:.3f}, {len(recs)} steps"))
peers = {}
for x in re.findall(r'^\{"peer".*\}$', read("peers.txt"), re.M):
    j = json.loads(x)
    peers[j["peer"]] = j
    rows.append((j["peer"], j["tokens_per_s"], j["step_s"], j["peak_gb"], f"{j['peak_gb']:.1f}", ""))
ref = peers.get("hf-transformers+compile", {}).get("tokens_per_s", 56200.0)
p("| run (Qwen3-30B-A3B shape, 8 layers, 2 × 4096 tokens) | tokens/s | vs compile peer | fwd+bwd s | MFU | GPU peak GB | non-master GB | notes |")
p("|---|---:|---:|---:|---:|---:|---:|---|")
for name, tps, s, peak, nm, note in rows:
    p(f"| {name} | {tps:,.0f} | {tps/ref:.2f}× | {s:.3f} | {100*tps*f_tok/PEAK:.1f}% | {peak:.1f} | {nm} | {note} |")
if not peers:
    p(f"| hf-transformers+compile (given, not run) | 56,200 | 1.00× | | {100*56200*f_tok/PEAK:.1f}% | 41.6 | 41.6 | |")
p("non-master = GPU peak − 12 B × parameters (fp32 master and the two AdamW moments, which the peer, running no optimizer, does not hold)")
p()

# ---- kernels ----
def parse(text, tag):
    r = {}
    for x in re.findall(rf"^{tag}\|(.*)$", text, re.M):
        f = x.split("|")
        try:
            r[f[0]] = (float(f[1]), float(f[2]), f[3])
        except ValueError:
            r[f[0]] = (float("nan"), float("nan"), f[3])
    return r


ours, theirs = parse(read("bench_ops.txt"), "BENCH"), parse(read("peer_kernels.txt"), "PEER")
copy_bw = max(x.get("copy d2d 1 GiB (bandwidth ceiling)", (0, 0, ""))[1] for x in (ours, theirs)) or 4300.0
# (pith op, peer op, target: ratio of rates pith/peer, or a fraction of the copy bandwidth)
pairs = [
    ("gemm q_proj fwd 4096x2048->4096", "gemm q_proj fwd 4096x2048->4096", 0.97),
    ("gemm q_proj bwd input", "gemm q_proj bwd input", 0.97),
    ("gemm q_proj bwd weight (fp32 acc)", "gemm q_proj bwd weight (fp32 acc)", 0.97),
    ("grouped gate_up fwd (balanced)", "grouped gate_up fwd (balanced)", 1.0),
    ("grouped gate_up bwd input (balanced)", "grouped gate_up bwd input (balanced)", 1.0),
    ("grouped gate_up bwd weight fp32 (balanced)", "grouped gate_up bwd weight fp32 (balanced)", 1.0),
    ("grouped gate_up fwd (natural)", "grouped gate_up fwd (natural)", 1.0),
    ("grouped gate_up bwd input (natural)", "grouped gate_up bwd input (natural)", 1.0),
    ("grouped gate_up bwd weight fp32 (natural)", "grouped gate_up bwd weight fp32 (natural)", 1.0),
    ("attention fwd S=4096 d=128 GQA 32/4", "attention fwd S=4096 d=128 GQA 32/4 [cudnn]", None),
    ("attention bwd", "attention bwd [cudnn]", None),
    ("attention fwd+bwd", "attention fwd+bwd [cudnn]", 0.8),
    ("attention fwd+bwd", "attention fwd+bwd [flash]", None),
    ("rmsnorm fwd (4096, 2048)", "rmsnorm fwd (4096, 2048)", "bw"),
    ("rmsnorm bwd", "rmsnorm bwd", "bw"),
    ("rmsnorm fwd q-norm (131072, 128)", "rmsnorm fwd q-norm (131072, 128)", "bw"),
    ("rope q (4096, 32, 128)", "rope q (4096, 32, 128)", "bw"),
    ("swiglu fwd (32768 x 768)", "swiglu fwd (32768 x 768)", "bw"),
    ("swiglu bwd", "swiglu bwd", "bw"),
    ("cross-entropy chunk 110 rows", "cross-entropy chunk 110 rows", "bw"),
    ("adamw 30M params", "adamw 30M params", 1.0),
    ("copy d2d 1 GiB (bandwidth ceiling)", "copy d2d 1 GiB (bandwidth ceiling)", None),
]
p(f"| kernel (T = 4096 tokens, bf16) | pith ms | rate | PyTorch ms | rate | pith/PyTorch | target | met |")
p("|---|---:|---:|---:|---:|---:|---|---|")
for a, b, tgt in pairs:
    if a not in ours and b not in theirs:
        continue
    om, orate, unit = ours.get(a, (float("nan"), float("nan"), ""))
    tm, trate, tunit = theirs.get(b, (float("nan"), float("nan"), "n/a"))
    ratio = tm / om if om == om and tm == tm else float("nan")
    label = a if a == b or not b.endswith("]") else b
    if tgt == "bw":
        frac = orate / copy_bw if copy_bw else float("nan")
        tg, met = f"≥ 80% of copy ({frac*100:.0f}%)", "yes" if frac >= 0.8 else "no"
    elif tgt is None:
        tg, met = "", ""
    else:
        tg, met = f"≥ {tgt:.2f}×", ("yes" if ratio >= tgt else "no") if ratio == ratio else "?"
    p(f"| {label} | {om:.3f} | {orate:.0f} {unit} | {tm:.3f} | {trate:.0f} {tunit if tunit != unit else ''} | {ratio:.2f}× | {tg} | {met} |")
p(f"bandwidth ceiling: the faster 1 GiB device copy, {copy_bw:.0f} GB/s. Timing: pith = host time over back-to-back calls (mean);"
  " PyTorch = CUDA-event median of single calls, which includes each call's launch gap (small kernels and torch.compile'd"
  " graphs pay for it, so those ratios flatter pith; the dense GEMMs run the same cuBLAS kernels on both sides)")
extra = [n for n in ours if not any(n == a for a, _, _ in pairs)]
if extra:
    p()
    p("| pith only | ms | rate |")
    p("|---|---:|---:|")
    for n in extra:
        om, orate, unit = ours[n]
        p(f"| {n} | {om:.3f} | {orate:.1f} {unit} |")
print("\n".join(lines))

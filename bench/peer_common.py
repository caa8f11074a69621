# peer_common.py — the timing loop both HF peers share (bench/peer_hf_*.py): two warm-up steps, then the median
# of `iters` forward+backward steps timed by CUDA events, and the peak memory of the timed steps.
import torch

def time_fwd_bwd(fwd, vocab, mbs, seq, iters):
    """Returns (median seconds per forward+backward step, peak GB) for random ids (mbs, seq) < vocab."""
    ids = torch.randint(0, vocab, (mbs, seq), device="cuda")
    def step():
        out = fwd(input_ids=ids, labels=ids); out.loss.backward()
    for _ in range(2): step()
    torch.cuda.synchronize(); torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(iters):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); step(); e.record(); torch.cuda.synchronize(); times.append(s.elapsed_time(e) / 1e3)
    return sorted(times)[len(times) // 2], torch.cuda.max_memory_allocated() / 1e9

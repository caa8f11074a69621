# peer_common.py — the timing loop both HF peers share (bench/peer_hf_*.py): two warm-up steps, then the median
# of `iters` forward+backward steps timed by CUDA events, and the peak memory of the timed steps.
# PEER_WAIT_FILE: the timed steps wait until that file exists, so a peer can compile beside other work on the GPU
# machine and still be timed alone (bench/session.sh starts it in the background).
import os, time, torch

def time_fwd_bwd(fwd, vocab, mbs, seq, iters):
    """Returns (median seconds per forward+backward step, peak GB) for random ids (mbs, seq) < vocab."""
    ids = torch.randint(0, vocab, (mbs, seq), device="cuda")
    def step():
        out = fwd(input_ids=ids, labels=ids); out.loss.backward()
    for _ in range(2): step()
    if os.environ.get("PEER_WAIT_FILE"):
        print("peer: warm-up done, waiting for", os.environ["PEER_WAIT_FILE"], flush=True)
        while not os.path.exists(os.environ["PEER_WAIT_FILE"]): time.sleep(0.5)
    torch.cuda.synchronize(); torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(iters):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); step(); e.record(); torch.cuda.synchronize(); times.append(s.elapsed_time(e) / 1e3)
    return sorted(times)[len(times) // 2], torch.cuda.max_memory_allocated() / 1e9

# peer_a2a.py — the PyTorch peer of build/bench_ep's payload all-to-alls: torch.distributed.all_to_all_single
# over NCCL with the per-peer row counts bench_ep wrote (--splits DIR), rows of H values in bench_ep's dtype,
# a device sync after each call (as bench_ep does), the same logical bytes (rows each GPU sends, itself
# included, × H × bytes per value) and the same GB/s per GPU (the ranks' mean bytes over the slowest rank's
# time). One process per GPU:  torchrun --nproc_per_node 2 bench/peer_a2a.py DIR [--iters 20]
import argparse, glob, json, os, re, time
import torch
import torch.distributed as dist

ap = argparse.ArgumentParser()
ap.add_argument("dir")
ap.add_argument("--iters", type=int, default=20)
a = ap.parse_args()
local = int(os.environ.get("LOCAL_RANK", "0"))
torch.cuda.set_device(local)
dist.init_process_group("nccl", device_id=torch.device("cuda", local))
rank, world = dist.get_rank(), dist.get_world_size()
files = glob.glob(f"{a.dir}/splits_T*_rank{rank}.json")
files.sort(key=lambda f: int(re.search(r"splits_T(\d+)_", f).group(1)))


def timed(send, recv, H, dtype):
    x = torch.randn(max(sum(send), 1), H, device="cuda").to(dtype)
    y = torch.empty(max(sum(recv), 1), H, device="cuda", dtype=dtype)
    xs, ys = x[: sum(send)], y[: sum(recv)]
    total = 0.0
    for it in range(-3, a.iters):  # 3 warm-up rounds
        t0 = time.perf_counter()
        dist.all_to_all_single(ys, xs, output_split_sizes=recv, input_split_sizes=send)
        torch.cuda.synchronize()
        if it >= 0:
            total += time.perf_counter() - t0
    return total / a.iters


def nccl_version():
    v = torch.cuda.nccl.version()
    return ".".join(map(str, v)) if isinstance(v, (tuple, list)) else str(v)


def over_ranks(v, op):
    t = torch.tensor([v], dtype=torch.float64, device="cuda")
    dist.all_reduce(t, op=op)
    return t.item()


for f in files:
    s = json.load(open(f))
    H, dtype = s["H"], torch.bfloat16 if s["dtype"].lower() == "bf16" else torch.float32
    esize = torch.empty(0, dtype=dtype).element_size()
    td = timed(s["dispatch_send"], s["dispatch_recv"], H, dtype)
    tc = timed(s["combine_send"], s["combine_recv"], H, dtype)
    bd = over_ranks(sum(s["dispatch_send"]) * H * esize, dist.ReduceOp.SUM) / world
    bc = over_ranks(sum(s["combine_send"]) * H * esize, dist.ReduceOp.SUM) / world
    td, tc = over_ranks(td, dist.ReduceOp.MAX), over_ranks(tc, dist.ReduceOp.MAX)
    if rank == 0:
        print(json.dumps({"bench": "torch all_to_all_single", "ranks": world, "T": s["T"], "dispatch_mb": round(bd / 1e6, 1),
                          "combine_mb": round(bc / 1e6, 1), "payload_dispatch_ms": round(td * 1e3, 3),
                          "payload_combine_ms": round(tc * 1e3, 3), "payload_gbps": round((bd + bc) / (td + tc) / 1e9, 1),
                          "torch": torch.__version__, "nccl": nccl_version()}), flush=True)
dist.destroy_process_group()

// bench_ring.c — zigzag ring attention on the GPU at Qwen3-30B-A3B's attention shape (32 query heads on 4 kv
// heads of 128, bf16), one rank per GPU under mpirun as the cp group (bench/run_cp2.sh runs it):
//   build/bench_ring [--seq 16384,32768] [--iters 10] [--dtype bf16|fp32]   (fp32: fake GPUs, bench/run_x2.sh --dry)
// For each global sequence length S (one sequence, each rank holding S/cp tokens) it times, with a device sync
// after each call and the slowest rank's time:
//   ring     ring_attention_forward and ring_attention_backward as training runs them (K/V posted before each
//            hop's attention, waited after; the backward's second ring)
//   kernel   the attention op alone on one hop's work: two non-causal blocks of S/(2·cp) queries against
//            S/(2·cp) keys (every hop has that cost), forward and backward, no transfer
// and prints per hop: ring time / cp against the kernel time (the overlap: ring ≤ 1.1 × kernel when the transfers
// hide behind the attention). Rank 0 prints one JSON line per S.
#include <math.h>

#include "parallel/mesh.h"
#include "parallel/ring.h"

static double slowest(const Dist *d, double v) {
    comm_allreduce(&d->world, tensor_make(&v, DT_F64, DEV_CPU, 1, 1, 1, 1, 1), COMM_MAX);
    return v;
}

static DType dt = DT_BF16; // of q, k, v, o and the gradients

static Tensor rand_dev(Arena *a, int64_t n0, int64_t n1, int64_t n2, uint64_t seed) {
    Tensor h = tensor_make(xmalloc(n0 * n1 * n2 * sizeof(float)), DT_F32, DEV_CPU, 3, n0, n1, n2, 1);
    for (int64_t i = 0; i < tensor_numel(h); i++) ((float *)h.p)[i] = (float)rng_normal(seed, 0, (uint64_t)i);
    Tensor t = arena_tensor(a, dt, 3, n0, n1, n2, 0);
    op_copy(t, h);
    free(h.p);
    return t;
}

static void bench_one(const Dist *d, int S, int iters) {
    int cp = d->cp, nh = 32, nkv = 4, hd = 128, blk = S / (2 * cp);
    int64_t T = 2 * (int64_t)blk, H = blk;
    Arena a =
        arena_create("bench_ring", DEV_CUDA, (size_t)(T * (3 * nh + 2 * nkv) * hd * dtype_size(dt) * 2 + (64 << 20)));
    Tensor q = rand_dev(&a, T, nh, hd, 1), k = rand_dev(&a, T, nkv, hd, 2), v = rand_dev(&a, T, nkv, hd, 3),
           dout = rand_dev(&a, T, nh, hd, 4);
    Tensor o = arena_tensor(&a, dt, 3, T, nh, hd, 0), lse = arena_tensor(&a, DT_F32, 3, 1, nh, T, 0),
           dq = arena_tensor(&a, dt, 3, T, nh, hd, 0), dk = arena_tensor(&a, dt, 3, T, nkv, hd, 0),
           dv = arena_tensor(&a, dt, 3, T, nkv, hd, 0);
    Ring ring;
    ring_init(&ring, &d->cp_g, DEV_CUDA, ring_bytes(DEV_CUDA, dt, 1, blk, nh, nkv, hd, hd, 0, 0));
    AttnArgs causal = {.B = 1, .scale = 1.0f / sqrtf((float)hd), .causal = true},
             block = {.B = 1, .scale = causal.scale};
    double rf = 0, rb = 0, kf = 0, kb = 0;
    for (int it = -2; it < iters; it++) { // two warm-up calls
        double t0 = now_seconds();
        ring_attention_forward(&ring, o, lse, q, k, v, &causal);
        ops_sync();
        double t1 = now_seconds();
        ring_attention_backward(&ring, dq, dk, dv, dout, q, k, v, o, lse, &causal);
        ops_sync();
        double t2 = now_seconds();
        // one hop's work alone: two blocks of H queries against H keys (the first and second halves)
        Tensor qh = tensor_rows(q, 0, H), oh = tensor_rows(o, 0, H),
               lh = tensor_make(lse.p, DT_F32, DEV_CUDA, 3, 1, nh, H, 1);
        for (int h = 0; h < 2; h++)
            op_attention_forward(oh, lh, qh, tensor_rows(k, h * H, H), tensor_rows(v, h * H, H), &block);
        ops_sync();
        double t3 = now_seconds();
        for (int h = 0; h < 2; h++)
            op_attention_backward(tensor_rows(dq, 0, H), tensor_rows(dk, 0, H), tensor_rows(dv, 0, H), (Tensor){0},
                                  tensor_rows(dout, 0, H), qh, tensor_rows(k, h * H, H), tensor_rows(v, h * H, H), oh,
                                  lh, &block);
        ops_sync();
        double t4 = now_seconds();
        if (it >= 0) rf += t1 - t0, rb += t2 - t1, kf += t3 - t2, kb += t4 - t3;
    }
    rf = slowest(d, rf / iters), rb = slowest(d, rb / iters), kf = slowest(d, kf / iters), kb = slowest(d, kb / iters);
    if (d->world.rank == 0)
        printf("{\"S\": %d, \"cp\": %d, \"ring_fwd_ms\": %.3f, \"ring_bwd_ms\": %.3f, \"ring_fwd_hop_ms\": %.3f, "
               "\"ring_bwd_hop_ms\": %.3f, \"kernel_fwd_hop_ms\": %.3f, \"kernel_bwd_hop_ms\": %.3f, "
               "\"fwd_ratio\": %.3f, \"bwd_ratio\": %.3f}\n",
               S, cp, rf * 1e3, rb * 1e3, rf / cp * 1e3, rb / cp * 1e3, kf * 1e3, kb * 1e3, rf / cp / kf, rb / cp / kb);
    ring_free(&ring);
    arena_destroy(&a);
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *seqs = "16384,32768";
    int iters = 10;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--seq") && i + 1 < argc) seqs = argv[++i];
        else if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--dtype") && i + 1 < argc &&
                 (!strcmp(argv[i + 1], "bf16") || !strcmp(argv[i + 1], "fp32")))
            dt = !strcmp(argv[++i], "fp32") ? DT_F32 : DT_BF16;
        else die("usage: mpirun -np CP bench_ring [--seq S1,S2,...] [--iters N] [--dtype bf16|fp32]");
    }
    if (iters < 1) die("bench_ring: --iters must be positive");
    dist_launch();
    if (!ops_cuda_available()) die("bench_ring: needs a GPU per rank");
    if (dist_world_size() < 2) die("bench_ring: start it on two ranks or more (mpirun -np CP)");
    Dist d;
    dist_mesh_init(&d, 1, dist_world_size(), 1, false, 300, "bench_ring");
    dist_mesh_gpu(&d);
    for (const char *p = seqs; *p;) {
        int S = (int)strtol(p, (char **)&p, 10);
        if (S <= 0 || S % (2 * d.cp)) die("bench_ring: --seq '%s': each length must be a multiple of 2·cp", seqs);
        bench_one(&d, S, iters);
        if (*p == ',') p++;
    }
    dist_mesh_free(&d);
    dist_finalize();
    return 0;
}

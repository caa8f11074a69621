// bench_ep.c — expert-parallel dispatch + combine on the GPU at Qwen3-30B-A3B sizes (hidden 2048, 128
// experts, top-8, bf16 rows), one rank per GPU under mpirun (make bench-ep; bench/run_gpu2.sh runs it):
//   build/bench_ep [--tokens 1024,4096,16384] [--iters 20] [--routing random|balanced] [--dtype bf16|fp32]
//                  [--splits DIR]
// For each token count T per rank it times, with a device sync after each call:
//   full     ep_dispatch_forward and ep_combine_forward as training runs them: the one read of the routing
//            to the host, the route and the counts (MPI), the row permutations (GPU), the payloads (NCCL)
//   payload  the two payload all-to-alls alone with the same per-peer row counts (comm_alltoallv over
//            NCCL): what torch.distributed.all_to_all_single does in bench/peer_a2a.py
// Logical bytes per GPU = rows it sends (dispatch: deduplicated token rows, combine: one row per received
// (token, expert) slot; to every rank, itself included) × hidden × 2 (bf16). GB/s per GPU = the ranks' mean bytes
// over the slowest rank's time. --splits DIR writes each rank's per-peer row counts for the peer.
// Rank 0 prints one JSON line per T.
#include <math.h>

#include "model/ep.h"
#include "parallel/mesh.h"

static int64_t sum(const int64_t *x, int n) {
    int64_t s = 0;
    for (int i = 0; i < n; i++) s += x[i];
    return s;
}

// The slowest rank's value (times) or the mean (bytes) over the world.
static double over_ranks(const Dist *d, double v, bool max) {
    Tensor t = tensor_make(&v, DT_F64, DEV_CPU, 1, 1, 1, 1, 1);
    comm_allreduce(&d->world, t, max ? COMM_MAX : COMM_SUM);
    return max ? v : v / d->world.size;
}

static void write_list(FILE *f, const char *key, const int64_t *x, int n, bool last) {
    fprintf(f, "\"%s\": [", key);
    for (int i = 0; i < n; i++) fprintf(f, "%s%lld", i ? ", " : "", (long long)x[i]);
    fprintf(f, "]%s", last ? "" : ", ");
}

static void bench_one(const Dist *d, int64_t T, int iters, bool balanced, DType dt, const char *splits) {
    int P = d->ep, me = d->ep_g.rank, H = 2048, E = 128, k = 8;
    Model m;
    memset(&m, 0, sizeof m);
    m.cfg.hidden = H, m.cfg.topk = k, m.cfg.experts = E, m.cfg.ep_size = P, m.cfg.ep_rank = me;
    m.cdt = dt, m.dev = DEV_CUDA, m.ep = &d->ep_g, m.ep_capacity = 0;
    EpBuffers b;
    StageIO io = {0};
    io.route = ep_route_create(&m, &b);
    Arena cc = arena_counting("communication", DEV_CUDA), ca = arena_counting("activations", DEV_CUDA);
    ep_buffers_alloc(&m, &b, &cc, T);
    ep_buffers_free(&b);
    arena_tensor(&ca, dt, 2, T, H, 0, 0), arena_tensor(&ca, DT_I32, 2, T, k, 0, 0),
        arena_tensor(&ca, DT_I64, 1, E / P + 1, 0, 0, 0);
    ep_alloc(&m, &io, &ca, T);
    arena_tensor(&ca, dt, 2, ep_rows_capacity(&m, T), H, 0, 0);
    Arena comm = arena_create("communication", DEV_CUDA, cc.peak), act = arena_create("activations", DEV_CUDA, ca.peak);
    ep_buffers_alloc(&m, &b, &comm, T);
    io.xd = arena_tensor(&act, dt, 2, T, H, 0, 0);
    io.idx = arena_tensor(&act, DT_I32, 2, T, k, 0, 0);
    io.offs = arena_tensor(&act, DT_I64, 1, E / P + 1, 0, 0, 0);
    ep_alloc(&m, &io, &act, T);
    io.ye = arena_tensor(&act, dt, 2, ep_rows_capacity(&m, T), H, 0, 0); // (the chunk's shared staging buffer)
    // Routing: k distinct experts per token, uniform (random) or the force-balanced formula.
    int32_t *idx = xmalloc(T * k * sizeof(int32_t));
    int perm[128];
    for (int64_t t = 0; t < T; t++) {
        for (int e = 0; e < E; e++) perm[e] = e;
        for (int j = 0; j < k; j++) {
            int x = j + (int)(rng_u64(11, (uint64_t)(me * T + t), (uint64_t)j) % (uint64_t)(E - j)), tmp = perm[j];
            perm[j] = perm[x], perm[x] = tmp;
            idx[t * k + j] = balanced ? (int32_t)((t + j * (E / k)) % E) : perm[j];
        }
    }
    op_copy(io.idx, tensor_make(idx, DT_I32, DEV_CPU, 2, T, k, 1, 1));
    free(idx);
    op_zero(io.xd), op_zero(io.ye);
    EpRoute *r = io.route;
    double full_d = 0, full_c = 0;
    for (int it = -3; it < iters; it++) { // 3 warm-up rounds
        double t0 = now_seconds();
        ep_dispatch_forward(&m, &io);
        ops_sync();
        double t1 = now_seconds();
        ep_combine_forward(&m, &io);
        ops_sync();
        if (it >= 0) full_d += t1 - t0, full_c += now_seconds() - t1;
    }
    // The payloads alone, with this route's counts: token rows out, expert-output rows back.
    double pay_d = 0, pay_c = 0;
    for (int it = -3; it < iters; it++) {
        double t0 = now_seconds();
        comm_alltoallv(m.ep, b.rbuf, r->recv_tok, b.sbuf, r->send_tok);
        ops_sync();
        double t1 = now_seconds();
        comm_alltoallv(m.ep, b.rbuf, r->send_slot, b.sbuf, r->recv_slot);
        ops_sync();
        if (it >= 0) pay_d += t1 - t0, pay_c += now_seconds() - t1;
    }
    double rb = (double)H * dtype_size(dt), bd = (double)sum(r->send_tok, P) * rb,
           bc = (double)sum(r->recv_slot, P) * rb;
    double mbd = over_ranks(d, bd, false), mbc = over_ranks(d, bc, false);
    full_d = over_ranks(d, full_d / iters, true), full_c = over_ranks(d, full_c / iters, true);
    pay_d = over_ranks(d, pay_d / iters, true), pay_c = over_ranks(d, pay_c / iters, true);
    if (splits) {
        char path[600];
        snprintf(path, sizeof path, "%s/splits_T%lld_rank%d.json", splits, (long long)T, d->world.rank);
        FILE *f = fopen(path, "w");
        if (!f) die("bench_ep: cannot write %s", path);
        fprintf(f, "{\"T\": %lld, \"H\": %d, \"dtype\": \"%s\", \"ranks\": %d, ", (long long)T, H, dtype_name(dt), P);
        write_list(f, "dispatch_send", r->send_tok, P, false), write_list(f, "dispatch_recv", r->recv_tok, P, false);
        write_list(f, "combine_send", r->recv_slot, P, false), write_list(f, "combine_recv", r->send_slot, P, true);
        fprintf(f, "}\n");
        fclose(f);
    }
    if (d->world.rank == 0)
        printf("{\"bench\": \"pith ep\", \"ranks\": %d, \"T\": %lld, \"dtype\": \"%s\", \"routing\": \"%s\", "
               "\"dispatch_mb\": %.1f, \"combine_mb\": %.1f, "
               "\"full_dispatch_ms\": %.3f, \"full_combine_ms\": %.3f, \"full_gbps\": %.1f, "
               "\"payload_dispatch_ms\": %.3f, \"payload_combine_ms\": %.3f, \"payload_gbps\": %.1f}\n",
               P, (long long)T, dtype_name(dt), balanced ? "balanced" : "random", mbd / 1e6, mbc / 1e6, full_d * 1e3,
               full_c * 1e3, (mbd + mbc) / (full_d + full_c) / 1e9, pay_d * 1e3, pay_c * 1e3,
               (mbd + mbc) / (pay_d + pay_c) / 1e9);
    ep_route_free(io.route), ep_buffers_free(&b);
    arena_destroy(&comm), arena_destroy(&act);
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *tokens = "1024,4096,16384", *splits = NULL;
    int iters = 20;
    bool balanced = false;
    DType dt = DT_BF16;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--tokens") && i + 1 < argc) tokens = argv[++i];
        else if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--routing") && i + 1 < argc) balanced = !strcmp(argv[++i], "balanced");
        else if (!strcmp(argv[i], "--splits") && i + 1 < argc) splits = argv[++i];
        else if (!strcmp(argv[i], "--dtype") && i + 1 < argc) dt = !strcmp(argv[++i], "fp32") ? DT_F32 : DT_BF16;
        else
            die("usage: mpirun -np N bench_ep [--tokens T1,T2,...] [--iters N] [--routing random|balanced] [--dtype "
                "bf16|fp32] [--splits DIR]");
    }
    if (iters < 1) die("bench_ep: --iters must be positive");
    dist_launch();
    if (!ops_cuda_available()) die("bench_ep: needs a GPU per rank");
    if (dist_world_size() < 2) die("bench_ep: start it on two ranks or more (mpirun -np N)");
    Dist d;
    dist_mesh_init(&d, 1, 1, dist_world_size(), false, 300, "bench_ep");
    if (128 % d.ep) die("bench_ep: %d ranks do not divide 128 experts", d.ep);
    dist_mesh_gpu(&d);
    for (const char *p = tokens; *p;) {
        int64_t T = strtoll(p, (char **)&p, 10);
        if (T <= 0) die("bench_ep: bad --tokens '%s'", tokens);
        bench_one(&d, T, iters, balanced, dt, splits);
        if (*p == ',') p++;
    }
    dist_mesh_free(&d);
    dist_finalize();
    return 0;
}

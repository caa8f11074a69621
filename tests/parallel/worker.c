// worker.c — build/test_parallel SUITE: the multi-rank checks, run under `mpirun -np N` by tests/test_parallel.c
// (and tests/gpu/test_gpu_parallel.c for the -gpu suites).
//   comm       every collective of parallel/comm.h against values each rank can compute alone
//   ep         dispatch/combine (forward and backward) against a plain reference that every rank computes
//              from every rank's (deterministic) routing: counts, deduplication, expert order, empty ranks,
//              all tokens to one expert, top-k = number of experts
//   capacity   expert capacity below what the routing sends, on a 3-layer Qwen3-MoE with its routing pushed
//              towards rank 0 (a selection bias): the spill path gives the worst-case plan's losses and
//              gradients bit for bit and counts the rows above the capacity; dropping zeroes exactly the counted
//              (token, expert) outputs and leaves every other one as it was; ranks that receive no rows run
//   hang       rank 1 stops taking part: the others must stop at parallel.timeout_s with a message
//   p2p        requests (comm_p2p_start, comm_exchange, all-to-all-v issued and waited apart): a
//              ring of one group per rank, both pipeline directions at once, compute between issue and wait
//   hang-p2p   rank 1 never posts: the others' receives from it must stop at parallel.timeout_s
//   comm-gpu, ep-gpu, hang-gpu, p2p-gpu, hang-p2p-gpu   the same on device buffers over NCCL (one GPU per
//              rank, dist_mesh_gpu); comm-gpu adds bf16 (all-gather, all-to-all-v, all-reduce on a real GPU)
//   hazard-gpu an op reads a receive's buffer before comm_wait: the fake GPU must refuse it
//   pipe-model the schedule on the real model: each rank runs its two chunks of a 4P-layer Qwen3-MoE (a
//              record per slot, the schedule's deferred weight gradients, one pipeline over the world); the
//              summed loss, load-balancing loss and gradients equal one chunk of every layer running every
//              micro-batch in turn, with and without the overlapped pairs (bit for bit the same)
//   overlap-gpu with every NCCL group lasting PITH_FAKE_NCCL_DELAY_MS (the fake), a ring exchange issued
//              before 'compute' (a sleep as long) ends sooner than one waited for before it
//   ring[-gpu] zigzag ring attention over the world as the cp group (tests/parallel/ring.c)
//   pair[-gpu] the overlapped pair (chunk_pair) with the world as the ep group: bit for bit the serial order's
//              results, also with an expert capacity that overflows (spill, drop, spill under full
//              recompute; spill = the worst case bit for bit); with the fake's delays
//              (PITH_FAKE_NCCL_DELAY_MS, PITH_FAKE_OP_DELAY_US) it takes under 0.8 of the serial order's time
//   pipe[-gpu] the DualPipeV schedule run by dualpipev_run over the world as one pipeline of P ranks, on a
//              toy model of 2P linear chunks (loss ½‖y‖², deferred weight gradients): the loss and every
//              chunk's weight gradient against an fp64 reference of the whole chain on one rank
// A failed check dies (every rank stops, the message names the rank); success prints "ok SUITE" on rank 0.
#include <math.h>
#include <time.h>
#include <unistd.h>

#include "model/ep.h"
#include "parallel/mesh.h"
#include "pipe/dualpipev.h"
#include "pipe/chunk.h"

void suite_ring(const Dist *d, bool gpu); // tests/parallel/ring.c

static int nchecks;
#define EXPECT(cond, ...)                                                                                              \
    do {                                                                                                               \
        nchecks++;                                                                                                     \
        if (!(cond)) {                                                                                                 \
            fprintf(stderr, "check failed at %s:%d: %s: ", __FILE__, __LINE__, #cond);                                 \
            fprintf(stderr, __VA_ARGS__);                                                                              \
            die("test_parallel: check failed");                                                                        \
        }                                                                                                              \
    } while (0)

static Tensor host(DType dt, int64_t n0, int64_t n1) {
    Tensor t = tensor_make(xcalloc(n0 * n1 + 1, dtype_size(dt)), dt, DEV_CPU, n1 > 1 ? 2 : 1, n0, n1, 1, 1);
    return t;
}
#define F(t) ((float *)(t).p)
#define I32(t) ((int32_t *)(t).p)
#define I64(t) ((int64_t *)(t).p)
#define F64(t) ((double *)(t).p)

// Device suites: every buffer a collective sees is a device copy of a host tensor (the checks read the
// host side). On the CPU suites up() returns the host tensor itself and down() does nothing.
static Device dev = DEV_CPU;
static Arena devmem;
static Tensor up(Tensor h) {
    if (dev == DEV_CPU) return h;
    Tensor d = arena_tensor(&devmem, h.dt, h.nd, h.n[0], h.n[1], h.n[2], h.n[3]);
    op_copy(d, h);
    return d;
}
static void down(Tensor h, Tensor d) {
    if (d.p != h.p) op_copy(h, d);
}
static uint16_t bf16_bits(float x) { // truncated: exact for the small integers used here
    uint32_t u;
    memcpy(&u, &x, 4);
    return (uint16_t)(u >> 16);
}
static float bf16_value(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float x;
    memcpy(&x, &u, 4);
    return x;
}

// ---- comm ----

static void suite_comm(const Dist *d) {
    const Comm *w = &d->world;
    int P = w->size, me = w->rank;
    Tensor x = host(DT_F64, 3, 1), xd;
    F64(x)[0] = me, F64(x)[1] = 1, F64(x)[2] = -me;
    comm_allreduce(w, xd = up(x), COMM_SUM);
    down(x, xd);
    EXPECT(F64(x)[0] == P * (P - 1) / 2.0 && F64(x)[1] == P && F64(x)[2] == -P * (P - 1) / 2.0, "sum\n");
    Tensor m = host(DT_I64, 2, 1), md;
    I64(m)[0] = me, I64(m)[1] = 7 - me;
    comm_allreduce(w, md = up(m), COMM_MAX);
    down(m, md);
    EXPECT(I64(m)[0] == P - 1 && I64(m)[1] == 7, "max\n");
    // reduce-scatter: rank r's input block b holds r + 10·b + i; the sum over r of block me
    int n = 5;
    Tensor in = host(DT_F32, P * n, 1), out = host(DT_F32, n, 1), ind, outd;
    for (int b = 0; b < P; b++)
        for (int i = 0; i < n; i++) F(in)[b * n + i] = (float)(me + 10 * b + i);
    comm_reduce_scatter(w, outd = up(out), ind = up(in));
    down(out, outd);
    for (int i = 0; i < n; i++)
        EXPECT(F(out)[i] == (float)(P * (P - 1) / 2 + P * (10 * me + i)), "reduce-scatter %d\n", i);
    // in place (FSDP's gradients): the sum lands in the first n elements of the input
    comm_reduce_scatter(w, tensor_rows(ind, 0, n), ind);
    down(in, ind);
    for (int i = 0; i < n; i++)
        EXPECT(F(in)[i] == (float)(P * (P - 1) / 2 + P * (10 * me + i)), "in-place reduce-scatter %d\n", i);
    // reduce to each root in turn (the dense gradient units' path): the root holds the sum, the others keep theirs
    for (int root = 0; root < P; root++) {
        for (int i = 0; i < n; i++) F(out)[i] = (float)(me + 10 * i);
        CommReq r = comm_reduce_start(w, outd = up(out), root);
        comm_wait(&r);
        down(out, outd);
        for (int i = 0; i < n; i++)
            EXPECT(F(out)[i] == (me == root ? (float)(P * (P - 1) / 2 + P * 10 * i) : (float)(me + 10 * i)),
                   "reduce to %d: %d\n", root, i);
    }
    // all-gather: block b = rank b's values
    for (int i = 0; i < n; i++) F(out)[i] = (float)(100 * me + i);
    comm_allgather(w, ind = up(in), up(out));
    down(in, ind);
    for (int b = 0; b < P; b++)
        for (int i = 0; i < n; i++) EXPECT(F(in)[b * n + i] == (float)(100 * b + i), "all-gather\n");
    // in place (FSDP's compute copies): this rank's block of the output is the input
    for (int b = 0; b < P; b++)
        for (int i = 0; i < n; i++) F(in)[b * n + i] = b == me ? (float)(7 * me + i) : NAN;
    ind = up(in);
    comm_allgather(w, ind, tensor_rows(ind, (int64_t)me * n, n));
    down(in, ind);
    for (int b = 0; b < P; b++)
        for (int i = 0; i < n; i++) EXPECT(F(in)[b * n + i] == (float)(7 * b + i), "in-place all-gather\n");
    // all-to-all with equal blocks: block p of rank r = 1000·r + p
    Tensor a = host(DT_I32, P, 1), b2 = host(DT_I32, P, 1), b2d;
    for (int p = 0; p < P; p++) I32(a)[p] = 1000 * me + p;
    comm_alltoall(w, b2d = up(b2), up(a));
    down(b2, b2d);
    for (int p = 0; p < P; p++) EXPECT(I32(b2)[p] == 1000 * p + me, "all-to-all\n");
    // all-to-all with per-peer row counts: rank r sends (r + p) % 3 rows of width 2 to p (some zero)
    int64_t *sr = xcalloc(2 * P, sizeof(int64_t)), *rr = sr + P, ns = 0, nr = 0;
    for (int p = 0; p < P; p++) sr[p] = (me + p) % 3, rr[p] = (p + me) % 3, ns += sr[p], nr += rr[p];
    Tensor s = host(DT_F32, ns + 1, 2), r = host(DT_F32, nr + 1, 2), rd;
    for (int p = 0, o = 0; p < P; p++)
        for (int k = 0; k < sr[p]; k++, o++) F(s)[2 * o] = (float)(me * 100 + p), F(s)[2 * o + 1] = (float)k;
    comm_alltoallv(w, rd = up(r), rr, up(s), sr);
    down(r, rd);
    for (int p = 0, o = 0; p < P; p++)
        for (int k = 0; k < rr[p]; k++, o++)
            EXPECT(F(r)[2 * o] == (float)(p * 100 + me) && F(r)[2 * o + 1] == (float)k, "all-to-all-v\n");
    // a ring of send/recv (even ranks send first), broadcast from the last rank, barrier
    Tensor v = host(DT_I64, 1, 1), vd = up(v);
    if (P > 1) {
        for (int turn = 0; turn < 2; turn++) {
            if ((me % 2) == turn) I64(v)[0] = me, comm_exchange(w, &(CommP2p){true, vd = up(v), (me + 1) % P}, 1);
            else {
                comm_exchange(w, &(CommP2p){false, vd, (me + P - 1) % P}, 1);
                down(v, vd);
                EXPECT(I64(v)[0] == (me + P - 1) % P, "ring\n");
            }
        }
    }
    I64(v)[0] = me == P - 1 ? 4242 : 0;
    comm_broadcast(w, vd = up(v), P - 1);
    down(v, vd);
    EXPECT(I64(v)[0] == 4242, "broadcast\n");
    comm_barrier(w);
    if (dev == DEV_CUDA) { // bf16 rows (EP payloads and FSDP compute copies travel as bf16)
        Tensor hb = host(DT_BF16, P * 3, 4), mine = host(DT_BF16, 3, 4), hbd;
        for (int i = 0; i < 12; i++) ((uint16_t *)mine.p)[i] = bf16_bits((float)(16 * me + i));
        comm_allgather(w, hbd = up(hb), up(mine));
        down(hb, hbd);
        for (int i = 0; i < P * 12; i++)
            EXPECT(bf16_value(((uint16_t *)hb.p)[i]) == (float)(16 * (i / 12) + i % 12), "bf16 all-gather\n");
        Tensor rb = host(DT_BF16, nr + 1, 2), sb = host(DT_BF16, ns + 1, 2), rbd;
        for (int i = 0; i < 2 * ns; i++) ((uint16_t *)sb.p)[i] = bf16_bits(F(s)[i]);
        comm_alltoallv(w, rbd = up(rb), rr, up(sb), sr);
        down(rb, rbd);
        for (int i = 0; i < 2 * nr; i++) EXPECT(((uint16_t *)rb.p)[i] == bf16_bits(F(r)[i]), "bf16 all-to-all-v\n");
#ifndef PITH_FAKE_CUDA // the fake has no bf16 arithmetic
        for (int i = 0; i < 12; i++) ((uint16_t *)mine.p)[i] = bf16_bits((float)(me + i));
        Tensor sd = up(mine);
        comm_allreduce(w, sd, COMM_SUM);
        down(mine, sd);
        for (int i = 0; i < 12; i++)
            EXPECT(bf16_value(((uint16_t *)mine.p)[i]) == (float)(P * (P - 1) / 2 + P * i), "bf16 all-reduce\n");
#endif
    }
    // the mesh groups: sizes and coordinates agree with the rank formula
    EXPECT(dist_rank_of(d, d->pp_g.rank, d->dp_g.rank, d->cp_g.rank, d->ep_g.rank) == me, "rank order\n");
    Tensor e = host(DT_I64, 1, 1), ed;
    I64(e)[0] = me;
    comm_allreduce(&d->ep_g, ed = up(e), COMM_SUM); // ep groups are neighbouring ranks
    down(e, ed);
    int first = me - d->ep_g.rank;
    EXPECT(I64(e)[0] == (int64_t)d->ep * first + d->ep * (d->ep - 1) / 2, "ep group members\n");
    if (dev == DEV_CUDA) // groups of the same ranks share one communicator
        EXPECT(d->ep_g.size == 1 || d->ep_g.size != P || d->ep_g.nccl == d->world.nccl, "ep and world share NCCL\n");
}

// ---- p2p: requests issued and waited apart ----

static float ringval(int from, int i) { return (float)(from * 1000 + i % 1000); }

static void suite_p2p(const Dist *d) {
    const Comm *w = &d->world;
    int P = w->size, me = w->rank, next = (me + 1) % P, prev = (me + P - 1) % P;
    int n = 1 << 15; // 128 KB, above MPI's eager limit: each send waits for its receive
    Tensor s = host(DT_F32, n, 1), r = host(DT_F32, n, 1), o = host(DT_F32, 64, 1), sd, rd, od;
    for (int i = 0; i < n; i++) F(s)[i] = ringval(me, i);
    for (int i = 0; i < 64; i++) F(o)[i] = (float)i;
    od = up(o);
    // all-to-all-v issued, compute on another buffer, then the wait (one rank: a local copy)
    int64_t *cnt = xcalloc(P, sizeof(int64_t));
    for (int p = 0; p < P; p++) cnt[p] = 3;
    Tensor a = host(DT_F32, 3 * P, 1), b = host(DT_F32, 3 * P, 1), bd;
    for (int i = 0; i < 3 * P; i++) F(a)[i] = (float)(100 * me + i / 3);
    CommReq q = comm_alltoallv_start(w, bd = up(b), cnt, up(a), cnt);
    op_scale(od, 2.0f);
    comm_wait(&q);
    down(b, bd);
    for (int i = 0; i < 3 * P; i++) EXPECT(F(b)[i] == (float)(100 * (i / 3) + me), "all-to-all-v request %d\n", i);
    free(cnt);
    if (P == 1) return;
    // a ring in one group per rank: every rank sends to the next and receives from the previous at once
    q = comm_p2p_start(w, (CommP2p[]){{true, sd = up(s), next}, {false, rd = up(r), prev}}, 2);
    op_scale(od, 0.5f); // compute beside the transfer, on another buffer
    comm_wait(&q);
    down(r, rd);
    for (int i = 0; i < n; i++) EXPECT(F(r)[i] == ringval(prev, i), "ring %d\n", i);
    // the pipeline's two directions (activations forward, gradients back) with sendrecv, and a group with
    // an empty transfer, which both ends skip
    Tensor r2 = host(DT_F32, n, 1), r2d;
    comm_exchange(w, (CommP2p[]){{true, sd, next}, {false, rd = up(r), prev}}, 2);
    comm_exchange(w, (CommP2p[]){{true, sd, prev}, {false, r2d = up(r2), next}}, 2);
    down(r, rd), down(r2, r2d);
    for (int i = 0; i < n; i++) EXPECT(F(r)[i] == ringval(prev, i) && F(r2)[i] == ringval(next, i), "sendrecv %d\n", i);
    Tensor empty = tensor_rows(sd, 0, 0);
    q = comm_p2p_start(
        w, (CommP2p[]){{true, empty, next}, {false, tensor_rows(rd, 0, 0), prev}, {true, sd, prev}, {false, r2d, next}},
        4);
    comm_wait(&q);
    down(r2, r2d);
    for (int i = 0; i < n; i++) EXPECT(F(r2)[i] == ringval(next, i), "group with an empty transfer %d\n", i);
    // host buffers: receives and sends as separate requests, waited in another order than issued (on the
    // GPU one exchange must be one group: calls on the comm stream run in issue order)
    if (dev == DEV_CPU) {
        CommReq q1 = comm_p2p_start(w, &(CommP2p){false, r, prev}, 1),
                q2 = comm_p2p_start(w, &(CommP2p){false, r2, next}, 1),
                q3 = comm_p2p_start(w, &(CommP2p){true, s, next}, 1),
                q4 = comm_p2p_start(w, &(CommP2p){true, s, prev}, 1);
        comm_wait(&q4), comm_wait(&q2), comm_wait(&q3), comm_wait(&q1);
        for (int i = 0; i < n; i++)
            EXPECT(F(r)[i] == ringval(prev, i) && F(r2)[i] == ringval(next, i), "separate requests %d\n", i);
    }
    down(o, od);
    for (int i = 0; i < 64; i++) EXPECT(F(o)[i] == (float)i, "compute beside the transfers %d\n", i);
    free(s.p), free(r.p), free(r2.p), free(o.p), free(a.p), free(b.p);
}

// ---- pipe: the schedule run on a toy model ----
// Chunk c maps x: (T, H) to x·W_cᵀ; the loss of a micro-batch is ½‖y‖² of the last chunk's output, so its
// output gradient is y. Micro-batch mb's input is x0(mb), known to every rank for the reference.

enum { PT = 6, PH = 8, TOY_SLOTS = 32 };
static float pipe_x0(int mb, int i) { return (float)rng_normal(21, (uint64_t)mb, (uint64_t)i); }
static float pipe_w(int c, int i) { return 0.35f * (float)rng_normal(22, (uint64_t)c, (uint64_t)i); }

typedef struct {
    PipeRun *run;
    int chunk[2];
    Tensor w[2], dw[2];                                   // (H, H) of this rank's chunks
    Tensor x0[TOY_SLOTS], y[TOY_SLOTS], dy[2][TOY_SLOTS]; // per record slot: the first chunk's input, the last
                                                          // chunk's output, a deferred output gradient
    double loss;
} Toy;

// The input of (p, mb): the pipeline buffer, or x0 on the model's first chunk.
static Tensor toy_x(Toy *t, int p, int mb, int slot) {
    Tensor x = dualpipev_buffer(t->run, PIPE_ACT_IN, p, mb);
    return x.p ? x : t->x0[slot];
}

static void toy_forward(void *ctx, int p, int mb, int slot, Tensor x, Tensor y) {
    Toy *t = ctx;
    if (!x.p) { // the model's first chunk: the micro-batch's data
        Tensor h = host(DT_F32, PT, PH);
        for (int i = 0; i < PT * PH; i++) F(h)[i] = pipe_x0(mb, i);
        op_copy(x = t->x0[slot], h);
        free(h.p);
    }
    bool loss = !y.p;
    if (loss) y = t->y[slot];
    op_linear_forward(y, x, t->w[p], (Tensor){0});
    if (loss) t->loss += 0.5 * op_sum_squares(y);
}

static void toy_backward(void *ctx, int p, int mb, int slot, Tensor dy, Tensor dx, bool defer) {
    Toy *t = ctx;
    if (!dy.p) dy = t->y[slot]; // ∂(½‖y‖²)/∂y
    if (dx.p) op_linear_backward_input(dx, dy, t->w[p], false);
    if (defer) op_copy(t->dy[p][slot], dy);
    else op_linear_backward_weight(t->dw[p], (Tensor){0}, dy, toy_x(t, p, mb, slot), true);
}

static void toy_weight(void *ctx, int p, int mb, int slot) {
    Toy *t = ctx;
    op_linear_backward_weight(t->dw[p], (Tensor){0}, t->dy[p][slot], toy_x(t, p, mb, slot), true);
}

// The whole chain on one rank in fp64: the summed loss and the weight gradient of chunk c.
static double pipe_reference(int P, int N, int c, double *dw) {
    int C = 2 * P, n = PT * PH;
    double *a = xmalloc((size_t)(C + 1) * n * sizeof(double)), *g = xmalloc(2 * (size_t)n * sizeof(double)), loss = 0;
    memset(dw, 0, PH * PH * sizeof(double));
    for (int mb = 0; mb < N; mb++) {
        for (int i = 0; i < n; i++) a[i] = pipe_x0(mb, i);
        for (int k = 0; k < C; k++) // a[k + 1] = a[k] · W_kᵀ
            for (int r = 0; r < PT; r++)
                for (int o = 0; o < PH; o++) {
                    double v = 0;
                    for (int i = 0; i < PH; i++) v += a[k * n + r * PH + i] * pipe_w(k, o * PH + i);
                    a[(k + 1) * n + r * PH + o] = v;
                }
        for (int i = 0; i < n; i++) loss += 0.5 * a[C * n + i] * a[C * n + i], g[i] = a[C * n + i];
        for (int k = C - 1; k >= 0; k--) { // g = ∂loss/∂a[k + 1]
            if (k == c)
                for (int o = 0; o < PH; o++)
                    for (int i = 0; i < PH; i++)
                        for (int r = 0; r < PT; r++) dw[o * PH + i] += g[r * PH + o] * a[k * n + r * PH + i];
            for (int r = 0; r < PT; r++)
                for (int i = 0; i < PH; i++) {
                    double v = 0;
                    for (int o = 0; o < PH; o++) v += g[r * PH + o] * pipe_w(k, o * PH + i);
                    g[n + r * PH + i] = v;
                }
            memcpy(g, g + n, n * sizeof(double));
        }
    }
    free(a), free(g);
    return loss;
}

static void run_pipe_case(const Dist *d, int N) {
    const Comm *pp = &d->world;
    int P = pp->size, r = pp->rank;
    PipeSchedule s;
    dualpipev_build(&s, P, N, r, false);
    Arena cnt = arena_counting("pipeline", dev);
    PipeRun run;
    dualpipev_run_init(&run, &s, pp, &cnt, DT_F32, PT, PH);
    dualpipev_run_free(&run);
    size_t tb = (PT * PH * sizeof(float) + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN; // one toy tensor
    Arena a = arena_create("pipeline", dev, cnt.peak + (4 * TOY_SLOTS + 5) * tb);
    dualpipev_run_init(&run, &s, pp, &a, DT_F32, PT, PH);
    Toy t = {.run = &run};
    CHECK(s.slots[PIPE_REC][0] <= TOY_SLOTS && s.slots[PIPE_REC][1] <= TOY_SLOTS);
    for (int i = 0; i < TOY_SLOTS; i++) {
        t.x0[i] = arena_tensor(&a, DT_F32, 2, PT, PH, 0, 0), t.y[i] = arena_tensor(&a, DT_F32, 2, PT, PH, 0, 0);
        for (int p = 0; p < 2; p++) t.dy[p][i] = arena_tensor(&a, DT_F32, 2, PT, PH, 0, 0);
    }
    for (int p = 0; p < 2; p++) {
        t.chunk[p] = dualpipev_chunk(P, r, p);
        Tensor h = host(DT_F32, PH, PH);
        for (int i = 0; i < PH * PH; i++) F(h)[i] = pipe_w(t.chunk[p], i);
        op_copy(t.w[p] = arena_tensor(&a, DT_F32, 2, PH, PH, 0, 0), h);
        memset(h.p, 0, PH * PH * sizeof(float));
        op_copy(t.dw[p] = arena_tensor(&a, DT_F32, 2, PH, PH, 0, 0), h);
        free(h.p);
    }
    dualpipev_run(&run, &(PipeChunks){&t, toy_forward, toy_backward, toy_weight, NULL});
    double *ref = xmalloc(PH * PH * sizeof(double)), loss = 0;
    for (int p = 0; p < 2; p++) {
        loss = pipe_reference(P, N, t.chunk[p], ref);
        Tensor g = host(DT_F32, PH, PH);
        op_copy(g, t.dw[p]);
        double num = 0, den = 0;
        for (int i = 0; i < PH * PH; i++) num += (F(g)[i] - ref[i]) * (F(g)[i] - ref[i]), den += ref[i] * ref[i];
        EXPECT(sqrt(num / den) <= 1e-5, "P=%d N=%d rank %d: gradient of chunk %d differs by %.3g\n", P, N, r,
               t.chunk[p], sqrt(num / den));
        free(g.p);
    }
    if (r == 0) EXPECT(fabs(t.loss - loss) <= 1e-5 * loss, "P=%d N=%d: loss %.9g vs %.9g\n", P, N, t.loss, loss);
    else EXPECT(t.loss == 0, "P=%d N=%d: rank %d computed a loss\n", P, N, r);
    free(ref);
    dualpipev_run_free(&run), dualpipev_free(&s), arena_destroy(&a);
}

// ---- pipe-model: the schedule on the real model ----

enum { MB_B = 2, MB_S = 8 };
typedef struct {
    Chunk chunk[2]; // per phase: the chunk's layers, one record per slot of the schedule, its deferred sets
    int32_t (*tok)[MB_B * MB_S], (*lab)[MB_B * MB_S];
} ModelChunks;

static void model_forward(void *ctx, int p, int mb, int slot, Tensor x, Tensor y) {
    ModelChunks *c = ctx;
    Chunk *k = &c->chunk[p];
    chunk_load(k, slot, c->tok[mb], c->lab[mb]);
    chunk_pipe_forward(k, slot, x, y, true);
}

static void model_backward(void *ctx, int p, int mb, int slot, Tensor dy, Tensor dx, bool defer) {
    chunk_pipe_backward(&((ModelChunks *)ctx)->chunk[p], slot, dy, dx, defer);
}

static void model_weight(void *ctx, int p, int mb, int slot) { chunk_weight(&((ModelChunks *)ctx)->chunk[p], slot); }

static void model_pair(void *ctx, int fp, int fmb, int fslot, Tensor x, Tensor y, int bp, int bmb, int bslot, Tensor dy,
                       Tensor dx) {
    ModelChunks *c = ctx;
    chunk_load(&c->chunk[fp], fslot, c->tok[fmb], c->lab[fmb]);
    chunk_pipe_pair(&c->chunk[fp], fslot, x, y, &c->chunk[bp], bslot, dy, dx);
}

static void suite_pipe_model(const Dist *d, int N) {
    const Comm *w = &d->world;
    int P = w->size, r = w->rank, T = MB_B * MB_S, L = 4 * P;
    char path[256], json[1024];
    snprintf(path, sizeof path, "/tmp/pith-pipe-model-%d.json", (int)getpid());
    snprintf(
        json, sizeof json,
        "{\"model_type\": \"qwen3_moe\", \"hidden_size\": 32, \"num_hidden_layers\": %d, \"num_attention_heads\": 4,"
        " \"num_key_value_heads\": 2, \"head_dim\": 8, \"vocab_size\": 64, \"num_experts\": 8, "
        "\"num_experts_per_tok\": 3,"
        " \"moe_intermediate_size\": 16, \"intermediate_size\": 24, \"mlp_only_layers\": [1], \"norm_topk_prob\": "
        "true}",
        L);
    FILE *f = fopen(path, "w");
    CHECK(f && fputs(json, f) >= 0 && fclose(f) == 0);
    ModelConfig mc;
    const ModelFamily *fam = model_config_load(&mc, path);
    remove(path);
    Model m;
    model_create(&m, fam, &mc, DEV_CPU, DT_F32, MB_S);
    m.lb_coef = 0.01;
    model_lb_setup(&m, LB_MICRO_BATCH, NULL, T);
    for (int g = 0; g < NGROUPS; g++) params_init(&m.params, g, m.w[g].p, 7, 0.2, mc.layers);
    StepSums st;
    step_sums_create(&st, &m, true);
    ModelChunks c = {.tok = xmalloc(N * sizeof *c.tok), .lab = xmalloc(N * sizeof *c.lab)};
    for (int mb = 0; mb < N; mb++)
        for (int t = 0; t < T; t++)
            c.tok[mb][t] = (int32_t)(rng_u64(5, mb, t) % 64),
            c.lab[mb][t] = t % 5 == 2 ? -100 : (int32_t)(rng_u64(6, mb, t) % 64);
    // the pipeline: chunk k holds layers [2k, 2k + 2)
    PipeSchedule s;
    dualpipev_build(&s, P, N, r, false);
    for (int p = 0; p < 2; p++) {
        int k = dualpipev_chunk(P, r, p);
        chunk_init(&c.chunk[p], &m, &st, MB_B, MB_S, 2 * k, 2 * k + 2, s.slots[PIPE_REC][p], s.max_deferred_of[p]);
    }
    Arena cnt = arena_counting("pipeline", DEV_CPU);
    PipeRun run;
    dualpipev_run_init(&run, &s, w, &cnt, DT_F32, T, mc.hidden);
    dualpipev_run_free(&run);
    Arena a = arena_create("pipeline", DEV_CPU, cnt.peak + ARENA_ALIGN);
    dualpipev_run_init(&run, &s, w, &a, DT_F32, T, mc.hidden);
    // the overlapped pairs' results equal forward-then-backward's bit for bit
    float *serial[NGROUPS];
    double sl = 0;
    for (int pair = 0; pair < 2; pair++) {
        model_zero_grads(&m), step_sums_begin(&st, &m);
        dualpipev_run(&run, &(PipeChunks){&c, model_forward, model_backward, model_weight, pair ? model_pair : NULL});
        if (!pair) sl = op_read_scalar(st.loss_sum);
        for (int k = 0; k < NGROUPS && !pair; k++)
            serial[k] = xmalloc(tensor_bytes(m.g[k]) + 1), memcpy(serial[k], m.g[k].p, tensor_bytes(m.g[k]));
    }
    for (int k = 0; k < NGROUPS; k++) {
        EXPECT(!memcmp(serial[k], m.g[k].p, tensor_bytes(m.g[k])), "P=%d N=%d: paired gradients differ\n", P, N);
        free(serial[k]);
    }
    EXPECT(sl == op_read_scalar(st.loss_sum), "P=%d N=%d: paired loss differs\n", P, N);
    // every gradient is made on one rank: their sum is the pipeline's gradient
    for (int g = 0; g < NGROUPS; g++) comm_allreduce(w, m.g[g], COMM_SUM);
    comm_allreduce(w, st.loss_sum, COMM_SUM), comm_allreduce(w, st.lb_sum, COMM_SUM);
    double loss = op_read_scalar(st.loss_sum), lb = op_read_scalar(st.lb_sum);
    float *g[NGROUPS];
    for (int k = 0; k < NGROUPS; k++)
        g[k] = xmalloc(tensor_bytes(m.g[k]) + 1), memcpy(g[k], m.g[k].p, tensor_bytes(m.g[k]));
    // one chunk of every layer, every micro-batch through it in turn
    Chunk e;
    chunk_init_model(&e, &m, &st, MB_B, MB_S);
    model_zero_grads(&m), step_sums_begin(&st, &m);
    for (int mb = 0; mb < N; mb++)
        chunk_load(&e, 0, c.tok[mb], c.lab[mb]), chunk_forward(&e, 0, true), chunk_backward(&e, 0, false);
    double rl = op_read_scalar(st.loss_sum), rlb = op_read_scalar(st.lb_sum);
    EXPECT(fabs(loss - rl) <= 1e-6 * rl && fabs(lb - rlb) <= 1e-6 * rlb,
           "P=%d N=%d: loss %.9g lb %.9g vs one chunk %.9g %.9g\n", P, N, loss, lb, rl, rlb);
    for (int k = 0; k < NGROUPS; k++) {
        double num = 0, den = 0;
        const float *x = m.g[k].p;
        for (int64_t i = 0; i < tensor_numel(m.g[k]); i++)
            num += (double)(g[k][i] - x[i]) * (g[k][i] - x[i]), den += (double)x[i] * x[i];
        EXPECT(sqrt(num / den) <= 1e-5, "P=%d N=%d: gradient group %d differs by %.3g\n", P, N, k, sqrt(num / den));
        free(g[k]);
    }
    if (r == 0) printf("pipe-model P=%d N=%d: loss %.9g (one chunk %.9g)\n", P, N, loss, rl);
    chunk_free(&e);
    for (int p = 0; p < 2; p++) chunk_free(&c.chunk[p]);
    dualpipev_run_free(&run), dualpipev_free(&s), arena_destroy(&a), step_sums_free(&st), model_free(&m), free(c.tok),
        free(c.lab);
}

// ---- ep: dispatch and combine ----

typedef struct {
    const char *name;
    int T, k, E;
    int kind; // 0 random, 1 nothing to the last rank, 2 everything to expert 0, 3 k = E
} EpCase;

// Routing of token t of rank s: k distinct experts (deterministic, so every rank knows every rank's).
static void route(const EpCase *c, int P, int s, int t, int32_t *out) {
    int E = c->E, pool = c->kind == 1 ? E - E / P : E, perm[256]; // kind 1: the last rank's experts are never chosen
    for (int e = 0; e < pool; e++) perm[e] = e;
    for (int j = 0; j < c->k; j++) {
        int x = j + (int)(rng_u64(77, (uint64_t)(s * 1000 + t), (uint64_t)j) % (uint64_t)(pool - j)),
            tmp = perm[j]; // partial shuffle
        perm[j] = perm[x], perm[x] = tmp;
        out[j] = c->kind == 2 ? j : c->kind == 3 ? (t + j) % E : perm[j]; // 2: slot 0 is expert 0 for every token
    }
}

static float xval(int s, int t, int col) {
    return col == 0 ? (float)s : col == 1 ? (float)t : (float)rng_normal(3, s * 7919 + t, col);
}
static float dyval(int s, int slot, int col) { return (float)rng_normal(4, s * 7919 + slot, col); }
static float dxeval(int s, int t, int e, int col) { return (float)rng_normal(5, (s * 7919 + t) * 131 + e, col); }

// A host tensor shaped like t (zeroed), and one holding t's values.
static Tensor host_like(Tensor t) {
    return tensor_make(xcalloc(tensor_numel(t) + 1, dtype_size(t.dt)), t.dt, DEV_CPU, t.nd, t.n[0], t.n[1], t.n[2],
                       t.n[3]);
}
static Tensor pull(Tensor t) {
    Tensor h = host_like(t);
    op_copy(h, t);
    return h;
}

// Compute ops issued beside a transfer in flight (tests/fake/fake_cuda.c counts them; 0 elsewhere).
#ifdef PITH_FAKE_CUDA
long fake_ops_beside_transfers(void);
static long ops_beside_transfers(void) { return fake_ops_beside_transfers(); }
enum { COUNTS_OVERLAP = 1 };
#else
static long ops_beside_transfers(void) { return 0; }
enum { COUNTS_OVERLAP = 0 };
#endif

// ---- pair: the overlapped pair across an ep group ----
// Two chunks of two MoE layers each (the first embeds, the second ends in the loss) over the world as the
// ep group: the forward of one micro-batch through the first and the backward of another through the
// second, one after the other and as chunk_pair; the pair's results equal the serial order's bit for bit,
// and on fake GPUs more ops run beside an all-to-all in flight in the pair than in the serial order.
// Then with an expert capacity below what the routing sends (0.75·T·k rows): spilling (the backward
// re-dispatches its spilled layer, a collective, inside the pair), dropping, and spilling under full
// recompute (the backward replays its layers' forwards inside the pair); each equal to its serial order,
// and spilling equal to the worst case's results bit for bit (ref: the worst case's paired results); every
// recompute part too (stage 1's remade in the backward's workspace beside the pair's forward).
typedef struct {
    const char *name;
    double capacity;
    bool drop;
    RecomputeMode recompute;
} PairCase;

static void pair_case(const Dist *d, Model *m, const PairCase *pc, int32_t (*tok)[MB_B * MB_S], Tensor *ref) {
    m->ep_capacity = pc->capacity, m->ep_drop = pc->drop, m->recompute = pc->recompute;
    Chunk a, b;
    StepSums st;
    step_sums_create(&st, m, true);
    chunk_init(&a, m, &st, MB_B, MB_S, 0, 2, 2, 0), chunk_init(&b, m, &st, MB_B, MB_S, 2, 4, 1, 0);
    Tensor out[2][NGROUPS + 3];
    double took[2];
    int64_t over[2] = {0, 0}, spilled = 0; // rows above the capacity in the paired forward; b's spilled layers
    long beside[2] = {0, 0};               // fake GPUs: compute ops issued while an all-to-all was in flight
    for (int pair = 0; pair < 2; pair++) {
        model_zero_grads(m), step_sums_begin(&st, m);
        chunk_load(&a, 0, tok[0], tok[1]), chunk_load(&b, 0, tok[0], tok[1]), chunk_load(&a, 1, tok[1], tok[0]);
        chunk_forward(&a, 0, true);
        op_copy(chunk_input(&b, 0), chunk_output(&a, 0));
        chunk_forward(&b, 0, true);
        for (int l = 2; l < 4 && !pair; l++) spilled += b.rec[0].io[l].route && b.rec[0].io[l].route->spill;
        comm_barrier(&d->world);
        a.ep_over = 0;
        double t0 = now_seconds();
        long b0 = ops_beside_transfers();
        if (pair) chunk_pair(&a, 1, &b, 0);
        else chunk_forward(&a, 1, true), chunk_backward(&b, 0, false);
        took[pair] = now_seconds() - t0, beside[pair] = ops_beside_transfers() - b0;
        over[pair] = a.ep_over;
        for (int g = 0; g < NGROUPS; g++) out[pair][g] = pull(m->g[g]);
        out[pair][NGROUPS] = pull(chunk_output(&a, 1)), out[pair][NGROUPS + 1] = pull(chunk_input_grad(&b));
        out[pair][NGROUPS + 2] = pull(st.loss_sum);
    }
    for (int i = 0; i < NGROUPS + 3; i++) {
        EXPECT(!memcmp(out[0][i].p, out[1][i].p, tensor_bytes(out[0][i])), "%s: the pair's result %d differs\n",
               pc->name, i);
        if (ref[i].p && !pc->drop)
            EXPECT(!memcmp(ref[i].p, out[1][i].p, tensor_bytes(ref[i])),
                   "%s: result %d differs from the worst case's\n", pc->name, i);
        free(out[0][i].p);
        if (ref[i].p) free(out[1][i].p);
        else ref[i] = out[1][i];
    }
    Tensor n = host(DT_I64, 3, 1);
    I64(n)[0] = over[0], I64(n)[1] = over[1], I64(n)[2] = spilled;
    comm_allreduce(&d->ep_g, n, COMM_SUM);
    EXPECT(I64(n)[0] == I64(n)[1] && (pc->capacity == 0) == (I64(n)[1] == 0),
           "%s: %lld rows over the capacity serially, %lld paired\n", pc->name, (long long)I64(n)[0],
           (long long)I64(n)[1]);
    EXPECT((pc->capacity > 0 && !pc->drop) == (I64(n)[2] > 0), "%s: %lld spilled layers\n", pc->name,
           (long long)I64(n)[2]);
    if (d->world.rank == 0)
        printf("pair %s: forward then backward %.3f s, paired %.3f s, %lld rows over; ops beside an all-to-all: "
               "%ld serial, %ld paired\n",
               pc->name, took[0], took[1], (long long)I64(n)[1], beside[0], beside[1]);
    // The overlap, as structure: on fake GPUs the pair issues the other micro-batch's ops while its all-to-alls
    // are in flight (posted, not yet waited for) — more of them than the serial order, which waits for each
    // all-to-all at once. (Times are printed, not compared: they follow the machine's load.)
    if (COUNTS_OVERLAP)
        EXPECT(beside[1] > beside[0] && beside[1] >= 8,
               "%s: no overlap: %ld ops beside an all-to-all paired, %ld serial\n", pc->name, beside[1], beside[0]);
    free(n.p), chunk_free(&a), chunk_free(&b), step_sums_free(&st);
}

static void suite_pair(const Dist *d) {
    int P = d->ep_g.size, T = MB_B * MB_S;
    char path[256];
    snprintf(path, sizeof path, "/tmp/pith-pair-%d.json", (int)getpid());
    FILE *f = fopen(path, "w");
    CHECK(f &&
          fputs("{\"model_type\": \"qwen3_moe\", \"hidden_size\": 32, \"num_hidden_layers\": 4, "
                "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 8, \"vocab_size\": 64, "
                "\"num_experts\": 8, \"num_experts_per_tok\": 3, \"moe_intermediate_size\": 16, "
                "\"intermediate_size\": 24, \"norm_topk_prob\": true}",
                f) >= 0 &&
          fclose(f) == 0);
    ModelConfig mc;
    const ModelFamily *fam = model_config_load(&mc, path);
    remove(path);
    mc.ep_size = P, mc.ep_rank = d->ep_g.rank;
    Model m;
    model_create(&m, fam, &mc, dev, DT_F32, MB_S);
    m.ep = &d->ep_g;
    for (int g = 0; g < NGROUPS; g++) {
        Tensor h = host_like(m.w[g]);
        params_init(&m.params, g, h.p, 7, 0.2, mc.layers);
        op_copy(m.w[g], h), free(h.p);
    }
    int32_t tok[2][MB_B * MB_S];
    for (int mb = 0; mb < 2; mb++)
        for (int t = 0; t < T; t++) tok[mb][t] = (int32_t)(rng_u64(5, mb * P + d->ep_g.rank, t) % 64);
    const PairCase cases[] = {{"worst case", 0, false, RECOMPUTE_NONE},
                              {"spill", 0.75, false, RECOMPUTE_NONE},
                              {"drop", 0.75, true, RECOMPUTE_NONE},
                              {"spill full-recompute", 0.75, false, RECOMPUTE_FULL},
                              {"spill every part", 0.75, false, (RecomputeMode)(RC_FULL - 1)}};
    const char *e = getenv("PITH_FAKE_NCCL_DELAY_MS");
    Tensor ref[NGROUPS + 3] = {0};
    for (int i = 0; i < (e && atof(e) > 0 ? 1 : 5); i++) pair_case(d, &m, &cases[i], tok, ref); // delays: timing only
    for (int i = 0; i < NGROUPS + 3; i++) free(ref[i].p);
    model_free(&m);
}

static void run_ep_case(const Dist *d, const EpCase *c) {
    int P = d->ep, me = d->ep_g.rank, T = c->T, k = c->k, E = c->E, El = E / P, H = 6;
    Model m;
    memset(&m, 0, sizeof m);
    m.cfg.hidden = H, m.cfg.topk = k, m.cfg.experts = E, m.cfg.ep_size = P, m.cfg.ep_rank = me;
    m.cdt = DT_F32, m.dev = dev, m.ep = &d->ep_g;
    EpBuffers b;
    Arena cnt = arena_counting("communication", dev);
    ep_buffers_alloc(&m, &b, &cnt, T);
    ep_buffers_free(&b);
    Arena comm = arena_create("communication", dev, cnt.peak), act = arena_create("act", dev, 1 << 24),
          ws = arena_create("ws", dev, 1 << 24);
    ep_buffers_alloc(&m, &b, &comm, T);
    StageIO io = {0};
    io.route = ep_route_create(&m, &b);
    io.xd = arena_tensor(&act, DT_F32, 2, T, H, 0, 0);
    io.idx = arena_tensor(&act, DT_I32, 2, T, k, 0, 0);
    io.offs = arena_tensor(&act, DT_I64, 1, El + 1, 0, 0, 0);
    ep_alloc(&m, &io, &act, T);
    // (the chunk's shared staging buffer; one rank: the record's y, which the combine reads where the experts wrote it)
    io.ye = io.route ? arena_tensor(&act, DT_F32, 2, ep_rows_capacity(&m, T), H, 0, 0) : io.y;
    ep_grad_alloc(&m, &io, &ws, T);
    int32_t *ids = xmalloc((size_t)P * T * k * sizeof(int32_t)); // every rank's routing
    for (int s = 0; s < P; s++)
        for (int t = 0; t < T; t++) route(c, P, s, t, ids + ((size_t)s * T + t) * k);
    // The checks read host copies (x…) of the stage's tensors (io.…), which live on `dev`.
    Tensor xd = host_like(io.xd), idx = host_like(io.idx);
    for (int t = 0; t < T; t++) {
        for (int col = 0; col < H; col++) F(xd)[t * H + col] = xval(me, t, col);
        for (int j = 0; j < k; j++) I32(idx)[t * k + j] = ids[((size_t)me * T + t) * k + j];
    }
    op_copy(io.xd, xd), op_copy(io.idx, idx);
    ep_dispatch_forward(&m, &io);
    // xe: the dispatched rows, or where stage 3 gathers them (moe_stage3_gathers) the rows it reads, xd[perm[i] / k]
    bool gathers = moe_stage3_gathers(&m, &io);
    Tensor xe = gathers ? host_like(tensor_make(NULL, DT_F32, dev, 2, (int64_t)T * k, H, 1, 1)) : pull(io.xe),
           send_idx = io.route ? pull(io.route->send_idx) : (Tensor){0}, perm = gathers ? pull(io.perm) : (Tensor){0};
    if (gathers) op_gather_rows(xe, xd, perm, k);
    int64_t *offs = xmalloc((El + 1) * sizeof(int64_t));
    op_copy(ti64_1(offs, El + 1), io.offs);
    // counts: deduplicated tokens to each rank, slots to each rank
    EpRoute *r = io.route;
    int64_t sent = 0;
    for (int g = 0; g < P && r; g++) { // (one rank: no route, the local permutation)
        int64_t tok = 0, slots = 0, rtok = 0, rslots = 0;
        for (int t = 0; t < T; t++) {
            int here = 0, from = 0;
            for (int j = 0; j < k; j++)
                here += ids[((size_t)me * T + t) * k + j] / El == g,
                    from += ids[((size_t)g * T + t) * k + j] / El == me;
            tok += here > 0, slots += here, rtok += from > 0, rslots += from;
        }
        EXPECT(r->send_tok[g] == tok && r->send_slot[g] == slots,
               "%s: to rank %d: %lld tokens %lld slots, expected %lld %lld\n", c->name, g, (long long)r->send_tok[g],
               (long long)r->send_slot[g], (long long)tok, (long long)slots);
        EXPECT(r->recv_tok[g] == rtok && r->recv_slot[g] == rslots, "%s: from rank %d\n", c->name, g);
        sent += tok;
    }
    EXPECT(sent <= (int64_t)T * (k < P ? k : P), "%s: more rows sent than T·min(k, P)\n", c->name);
    for (int g = 0, o = 0; g < P && r;
         o += (int)r->send_tok[g], g++) // each token at most once per rank, in token order
        for (int i = 1; i < r->send_tok[g]; i++)
            EXPECT(I32(send_idx)[o + i] > I32(send_idx)[o + i - 1], "%s: dedup order\n", c->name);
    // expert order: local expert, then source rank, then the source's token order
    int64_t i = 0;
    for (int e = 0; e < El; e++) {
        EXPECT(offs[e] == i, "%s: offs[%d] = %lld, expected %lld\n", c->name, e, (long long)offs[e], (long long)i);
        for (int s = 0; s < P; s++)
            for (int t = 0; t < T; t++)
                for (int j = 0; j < k; j++)
                    if (ids[((size_t)s * T + t) * k + j] == me * El + e) {
                        for (int col = 0; col < H; col++)
                            EXPECT(F(xe)[i * H + col] == xval(s, t, col), "%s: xe row %lld\n", c->name, (long long)i);
                        i++;
                    }
    }
    EXPECT(offs[El] == i && io.rows == i, "%s: rows received\n", c->name);
    // combine: expert e's output is x·(e+1) + e, so slot (t, j) must come back as x_t·(idx+1) + idx
    Tensor ye = host_like(io.ye);
    for (int64_t q = 0; q < i; q++) {
        int e = 0;
        while (offs[e + 1] <= q) e++;
        int ge = me * El + e;
        for (int col = 0; col < H; col++) F(ye)[q * H + col] = F(xe)[q * H + col] * (float)(ge + 1) + (float)ge;
    }
    op_copy(io.ye, ye);
    ep_combine_forward(&m, &io);
    // slot s's row of y: s (ep: slot order), or at[s] (one rank: the rows stay in expert order, and stage 5's combine
    // reads them through the sort's inverse)
    Tensor y = pull(io.y), at = r ? (Tensor){0} : pull(io.at);
#define SLOT_ROW(s) (at.p ? (int64_t)I32(at)[s] : (int64_t)(s))
    for (int t = 0; t < T; t++)
        for (int j = 0; j < k; j++) {
            int ge = I32(idx)[t * k + j];
            for (int col = 0; col < H; col++)
                EXPECT(F(y)[SLOT_ROW(t * k + j) * H + col] == xval(me, t, col) * (float)(ge + 1) + (float)ge,
                       "%s: combine slot %d.%d\n", c->name, t, j);
        }
    // combine backward: the gradient of slot (s, t, j), written in y's order, arrives at its expert row
    Tensor dy = host_like(io.dy);
    for (int sl = 0; sl < T * k; sl++)
        for (int col = 0; col < H; col++) F(dy)[SLOT_ROW(sl) * H + col] = dyval(me, sl, col);
#undef SLOT_ROW
    op_copy(io.dy, dy);
    ep_combine_backward(&m, &io);
    Tensor dye = pull(io.dye);
    for (int64_t q = 0; q < i; q++) {
        int e = 0;
        while (offs[e + 1] <= q) e++;
        int s = (int)F(xe)[q * H], t = (int)F(xe)[q * H + 1], j = 0;
        while (ids[((size_t)s * T + t) * k + j] != me * El + e) j++;
        for (int col = 0; col < H; col++)
            EXPECT(F(dye)[q * H + col] == dyval(s, t * k + j, col), "%s: combine backward row %lld\n", c->name,
                   (long long)q);
    }
    // dispatch backward: token t receives the sum of its slots' row gradients from every rank
    Tensor dxe = host_like(io.dxe);
    for (int64_t q = 0; q < i; q++) {
        int e = 0;
        while (offs[e + 1] <= q) e++;
        int s = (int)F(xe)[q * H], t = (int)F(xe)[q * H + 1];
        for (int col = 0; col < H; col++) F(dxe)[q * H + col] = dxeval(s, t, me * El + e, col);
    }
    op_copy(io.dxe, dxe);
    ep_dispatch_backward(&m, &io);
    Tensor dxd = pull(io.dxd);
    for (int t = 0; t < T; t++)
        for (int col = 0; col < H; col++) {
            double want = 0;
            for (int j = 0; j < k; j++) want += dxeval(me, t, I32(idx)[t * k + j], col);
            EXPECT(fabs(F(dxd)[t * H + col] - want) <= 1e-5 * (1 + fabs(want)),
                   "%s: dispatch backward token %d: %g vs %g\n", c->name, t, F(dxd)[t * H + col], want);
        }
    Tensor hs[] = {xd, idx, xe, send_idx, perm, ye, y, at, dy, dye, dxe, dxd};
    for (size_t h = 0; h < sizeof hs / sizeof *hs; h++) free(hs[h].p);
    ep_route_free(io.route), ep_buffers_free(&b), free(offs), free(ids);
    arena_destroy(&comm), arena_destroy(&act), arena_destroy(&ws);
}

static void suite_ep(const Dist *d) {
    int P = d->ep, E = 2 * P;
    EpCase cases[] = {
        {"random", 37, 3 < E ? 3 : E, E, 0}, {"random-top1", 20, 1, E, 0},          {"empty last rank", 25, 2, E, 1},
        {"all to expert 0", 19, 1, E, 2},    {"all to expert 0, k=2", 19, 2, E, 2}, {"top-k = experts", 11, E, E, 3},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        if (cases[c].kind == 1 && P == 1) continue;
        run_ep_case(d, &cases[c]);
    }
}

// ---- capacity: expert capacity on the real model ----

enum { CAP_B = 2, CAP_S = 8, CAP_T = CAP_B * CAP_S, CAP_MB = 2 };
typedef struct {
    double loss, lb;
    float *g[NGROUPS];
    int64_t over;  // rows above the capacity, summed over the ep group
    Tensor y0;     // layer 0's (T·k, H) expert outputs in slot order after micro-batch 0's forward
    int64_t *recv; // (CAP_MB, layers, P) rows each rank received (from the routing, summed over the group)
} CapRun;

static void capacity_run(const Dist *d, Model *m, double factor, bool drop, const int32_t *tok, CapRun *o) {
    int P = d->ep, L = m->cfg.layers, k = m->cfg.topk, El = model_experts_local(&m->cfg);
    m->ep_capacity = factor, m->ep_drop = drop;
    Chunk e;
    StepSums st;
    step_sums_create(&st, m, true);
    chunk_init_model(&e, m, &st, CAP_B, CAP_S);
    EXPECT((e.spill.xe.n[0] > 0) == (factor > 0 && !drop), "factor %g drop %d: spill set %lld rows\n", factor, drop,
           (long long)e.spill.xe.n[0]);
    model_zero_grads(m), step_sums_begin(&st, m);
    o->recv = xcalloc((size_t)CAP_MB * L * P, sizeof(int64_t));
    for (int mb = 0; mb < CAP_MB; mb++) {
        chunk_load(&e, 0, tok + mb * CAP_T, tok + (mb + CAP_MB) * CAP_T);
        chunk_forward(&e, 0, true);
        if (mb == 0) o->y0 = pull(e.rec[0].io[0].y);
        for (int l = 0; l < L; l++) { // rows each rank receives: this rank's slots per destination, summed
            if (!m->cfg.is_moe[l]) continue;
            Tensor idx = pull(e.rec[0].io[l].idx), cnt = host(DT_I64, P, 1);
            for (int i = 0; i < CAP_T * k; i++) I64(cnt)[I32(idx)[i] / El]++;
            comm_allreduce(&d->ep_g, cnt, COMM_SUM);
            memcpy(o->recv + ((size_t)mb * L + l) * P, cnt.p, P * sizeof(int64_t));
            free(idx.p), free(cnt.p);
        }
        chunk_backward(&e, 0, false);
    }
    o->loss = op_read_scalar(st.loss_sum), o->lb = op_read_scalar(st.lb_sum);
    for (int g = 0; g < NGROUPS; g++)
        o->g[g] = xmalloc(tensor_bytes(m->g[g]) + 1), memcpy(o->g[g], m->g[g].p, tensor_bytes(m->g[g]));
    Tensor over = host(DT_I64, 1, 1);
    I64(over)[0] = e.ep_over;
    comm_allreduce(&d->ep_g, over, COMM_SUM);
    o->over = I64(over)[0];
    free(over.p);
    chunk_free(&e), step_sums_free(&st);
}

static void suite_capacity(const Dist *d) {
    int P = d->ep, E = 4 * P, k = 3;
    char path[256], json[1024];
    snprintf(path, sizeof path, "/tmp/pith-capacity-%d-%d.json", (int)getpid(), d->world.rank);
    snprintf(json, sizeof json,
             "{\"model_type\": \"qwen3_moe\", \"hidden_size\": 32, \"num_hidden_layers\": 3, \"num_attention_heads\": "
             "4, \"num_key_value_heads\": 2, \"head_dim\": 8, \"vocab_size\": 64, \"num_experts\": %d, "
             "\"num_experts_per_tok\": %d, \"moe_intermediate_size\": 16, \"intermediate_size\": 24, "
             "\"mlp_only_layers\": [1], \"norm_topk_prob\": true}",
             E, k);
    FILE *f = fopen(path, "w");
    CHECK(f && fputs(json, f) >= 0 && fclose(f) == 0);
    ModelConfig mc;
    const ModelFamily *fam = model_config_load(&mc, path);
    remove(path);
    mc.ep_rank = d->ep_g.rank, mc.ep_size = P;
    Model m;
    model_create(&m, fam, &mc, DEV_CPU, DT_F32, CAP_S);
    m.ep = &d->ep_g, m.lb_coef = 0.01;
    model_lb_setup(&m, LB_MICRO_BATCH, NULL, CAP_T);
    for (int g = 0; g < NGROUPS; g++) params_init(&m.params, g, m.w[g].p, 7, 0.2, mc.layers);
    // Skewed routing: experts 0 and 1 (rank 0's) are chosen by every token (a selection bias, as aux-loss-free
    // balancing adds; the weights stay the probabilities).
    m.router_bias = host(DT_F32, mc.layers, E);
    for (int l = 0; l < mc.layers; l++) F(m.router_bias)[l * E] = F(m.router_bias)[l * E + 1] = 1;
    int32_t *tok = xmalloc(2 * CAP_MB * CAP_T * sizeof(int32_t)); // tokens, then labels, of every micro-batch
    for (int i = 0; i < CAP_MB * CAP_T; i++)
        tok[i] = (int32_t)(rng_u64(31, d->ep_g.rank, i) % 64),
        tok[CAP_MB * CAP_T + i] = (int32_t)(rng_u64(32, d->ep_g.rank, i) % 64);
    double factor = 1.0;
    int64_t cap = (int64_t)ceil(factor * CAP_T * k);
    CapRun worst, spill, drop;
    capacity_run(d, &m, 0, false, tok, &worst);
    capacity_run(d, &m, factor, false, tok, &spill);
    capacity_run(d, &m, factor, true, tok, &drop);
    // spill: the worst-case plan's results bit for bit, the rows above the capacity counted
    int64_t want = 0;
    for (int i = 0; i < CAP_MB * mc.layers * P; i++) want += worst.recv[i] > cap ? worst.recv[i] - cap : 0;
    EXPECT(want > 0 && spill.over == want, "spill: %lld rows over the capacity counted, %lld expected\n",
           (long long)spill.over, (long long)want);
    EXPECT(spill.loss == worst.loss && spill.lb == worst.lb, "spill: loss %.17g lb %.17g vs worst case %.17g %.17g\n",
           spill.loss, spill.lb, worst.loss, worst.lb);
    for (int g = 0; g < NGROUPS; g++)
        EXPECT(!memcmp(spill.g[g], worst.g[g], tensor_bytes(m.g[g])), "spill: gradient group %d differs\n", g);
    // drop: layer 0 of micro-batch 0 (the same input in both runs) loses exactly the counted rows' outputs
    int H = mc.hidden;
    Tensor zeroed = host(DT_I64, 1, 1);
    for (int s = 0; s < CAP_T * k; s++) {
        const float *a = F(drop.y0) + (size_t)s * H, *b = F(worst.y0) + (size_t)s * H;
        bool zero = true;
        double diff = 0, norm = 0;
        for (int c = 0; c < H; c++) zero &= a[c] == 0, diff += fabs(a[c] - b[c]), norm += fabs(b[c]);
        I64(zeroed)[0] += zero;
        // a kept row is the same product (BLAS may round differently for other row counts per expert)
        EXPECT(zero || diff <= 1e-5 * norm, "drop: slot %d is neither dropped nor kept (%g vs %g)\n", s, a[0], b[0]);
    }
    comm_allreduce(&d->ep_g, zeroed, COMM_SUM);
    int64_t want0 = 0;
    for (int g = 0; g < P; g++) want0 += worst.recv[g] > cap ? worst.recv[g] - cap : 0; // micro-batch 0, layer 0
    EXPECT(want0 > 0 && I64(zeroed)[0] == want0, "drop: %lld slot outputs zeroed in layer 0, %lld rows over\n",
           (long long)I64(zeroed)[0], (long long)want0);
    EXPECT(drop.over >= want0 && isfinite(drop.loss), "drop: %lld rows counted, loss %g\n", (long long)drop.over,
           drop.loss);
    if (d->world.rank == 0)
        printf("capacity P=%d: %lld rows over %lld (spill = worst case bit for bit); dropping zeroed %lld of layer 0\n",
               P, (long long)spill.over, (long long)cap, (long long)I64(zeroed)[0]);
    // every slot to rank 0's experts: the other ranks' stage 3 receives no rows (and must run without them)
    for (int l = 0; l < mc.layers; l++) F(m.router_bias)[l * E + 2] = 1;
    CapRun none;
    capacity_run(d, &m, factor, false, tok, &none);
    EXPECT(isfinite(none.loss) && none.recv[1] == 0 && none.over > 0, "everything to rank 0: loss %g\n", none.loss);
    CapRun *runs[] = {&worst, &spill, &drop, &none};
    for (int i = 0; i < 4; i++) {
        for (int g = 0; g < NGROUPS; g++) free(runs[i]->g[g]);
        free(runs[i]->y0.p), free(runs[i]->recv);
    }
    free(zeroed.p), free(tok), free(m.router_bias.p);
    m.router_bias = (Tensor){0};
    model_free(&m);
}

// ---- nosync: a step's layers wait for nothing on one GPU ----
// One micro-batch's forward and backward through a tiny model on one GPU — Qwen3-MoE with a dense layer under each
// recompute mode, and GPT-OSS (per-expert biases), load balancing and aux-loss-free balancing's counts on: the host
// waits for the device (ops_host_syncs, which the fake GPUs count as the CUDA backend does: a stream synchronisation,
// a read-back, a copy to or from host memory) nowhere from the first layer's forward to the last layer's backward;
// the loss's read-back after them is the first wait. The counts: T·k a MoE layer, once under full recompute too.
static void suite_nosync(void) {
    static const char *const configs[2] = {
        "{\"model_type\": \"qwen3_moe\", \"hidden_size\": 32, \"num_hidden_layers\": 3, \"num_attention_heads\": 4, "
        "\"num_key_value_heads\": 2, \"head_dim\": 8, \"vocab_size\": 64, \"num_experts\": 8, "
        "\"num_experts_per_tok\": 3, \"moe_intermediate_size\": 16, \"intermediate_size\": 24, "
        "\"mlp_only_layers\": [1], \"norm_topk_prob\": true}",
        "{\"model_type\": \"gpt_oss\", \"hidden_size\": 32, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, "
        "\"num_key_value_heads\": 2, \"head_dim\": 16, \"vocab_size\": 64, \"num_local_experts\": 8, "
        "\"num_experts_per_tok\": 2, \"intermediate_size\": 16, \"sliding_window\": 5, \"swiglu_limit\": 2.0, "
        "\"layer_types\": [\"sliding_attention\", \"full_attention\"], \"max_position_embeddings\": 64}"};
    static const RecomputeMode modes[3] = {RECOMPUTE_NONE, RECOMPUTE_SELECTIVE, RECOMPUTE_FULL};
    int T = MB_B * MB_S;
    int32_t tok[MB_B * MB_S], lab[MB_B * MB_S];
    for (int t = 0; t < T; t++) tok[t] = (int32_t)(rng_u64(5, 1, t) % 64), lab[t] = (int32_t)(rng_u64(5, 2, t) % 64);
    for (int c = 0; c < 2; c++)
        for (int r = 0; r < (c ? 1 : 3); r++) {
            char path[256];
            snprintf(path, sizeof path, "/tmp/pith-nosync-%d.json", (int)getpid());
            FILE *f = fopen(path, "w");
            CHECK(f && fputs(configs[c], f) >= 0 && fclose(f) == 0);
            ModelConfig mc;
            const ModelFamily *fam = model_config_load(&mc, path);
            remove(path);
            Model m;
            model_create(&m, fam, &mc, dev, DT_F32, MB_S);
            m.recompute = modes[r], m.lb_coef = 0.01; // (the micro-batch form of load balancing, on the device)
            for (int g = 0; g < NGROUPS; g++) {
                Tensor h = host_like(m.w[g]);
                params_init(&m.params, g, h.p, 7, 0.2, mc.layers);
                op_copy(m.w[g], h), free(h.p);
            }
            int L = mc.layers, E = mc.experts;
            m.router_bias = model_tensor(dev, DT_F32, (int64_t)L * E, true); // aux-loss-free balancing: zero biases
            op_zero(m.router_bias);
            StepSums st;
            Chunk e;
            step_sums_create(&st, &m, true);
            chunk_init_model(&e, &m, &st, MB_B, MB_S);
            chunk_load(&e, 0, tok, lab);
            model_zero_grads(&m), step_sums_begin(&st, &m);
            int64_t s0 = ops_host_syncs();
            chunk_forward(&e, 0, true), chunk_backward(&e, 0, false);
            int64_t waits = ops_host_syncs() - s0;
            double loss = op_read_scalar(st.loss_sum);
            EXPECT(waits == 0 && ops_host_syncs() - s0 == 1 && isfinite(loss) && loss > 0,
                   "%s, recompute %d: %lld host waits in the layers' forward and backward (loss %g)\n", mc.model_type,
                   (int)modes[r], (long long)waits, loss);
            double *load = xmalloc((size_t)L * E * sizeof(double));
            op_copy(tensor_make(load, DT_F64, DEV_CPU, 2, L, E, 1, 1), st.router_load);
            for (int l = 0; l < L; l++) {
                double n = 0;
                for (int x = 0; x < E; x++) n += load[l * E + x];
                EXPECT(n == (mc.is_moe[l] ? (double)T * mc.topk : 0), "%s, recompute %d: layer %d counted %g experts\n",
                       mc.model_type, (int)modes[r], l, n);
            }
            free(load), model_tensor_free(m.router_bias), m.router_bias = (Tensor){0};
            chunk_free(&e), step_sums_free(&st), model_free(&m);
        }
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 2) die("usage: test_parallel comm|ep|capacity|hang|p2p|hang-p2p|pipe[-gpu] | hazard-gpu");
    char suite[32];
    snprintf(suite, sizeof suite, "%s", argv[1]);
    size_t len = strlen(suite);
    bool gpu = len > 4 && !strcmp(suite + len - 4, "-gpu");
    if (gpu) suite[len - 4] = 0;
    dist_launch();
    int P = dist_world_size();
    Dist d;
    dist_mesh_init(&d, 1, 1, strcmp(suite, "comm") ? P : (P % 2 ? 1 : 2), false, !strncmp(suite, "hang", 4) ? 3 : 60,
                   "test_parallel");
    if (gpu) {
        if (!ops_cuda_available()) die("test_parallel %s: no GPU", argv[1]);
        dist_mesh_gpu(&d);
        dev = DEV_CUDA;
        devmem = arena_create("test_parallel", DEV_CUDA, (size_t)64 << 20);
    }
    if (!strcmp(suite, "comm")) suite_comm(&d);
    else if (!strcmp(suite, "ep")) suite_ep(&d);
    else if (!strcmp(suite, "capacity") && !gpu) suite_capacity(&d);
    else if (!strcmp(suite, "hang")) {
        if (d.world.rank == 1) sleep(30); // stops taking part
        if (gpu) {                        // the device call returns at once; the read waits for it
            Tensor x = host(DT_F32, 4, 1), xd = up(x);
            comm_allreduce(&d.world, xd, COMM_SUM);
            down(x, xd);
        } else comm_barrier(&d.world);
    } else if (!strcmp(suite, "p2p")) suite_p2p(&d);
    else if (!strcmp(suite, "ring")) suite_ring(&d, gpu);
    else if (!strcmp(suite, "pipe"))
        for (int k = 0; k < 3; k++) run_pipe_case(&d, (int[]){2 * P, 2 * P + 3, 4 * P + 1}[k]);
    else if (!strcmp(suite, "pipe-model") && !gpu)
        for (int k = 0; k < 2; k++) suite_pipe_model(&d, (int[]){2 * P, 2 * P + 3}[k]);
    else if (!strcmp(suite, "pair")) suite_pair(&d);
    else if (!strcmp(suite, "nosync") && gpu && P == 1) suite_nosync();
    else if (!strcmp(suite, "hang-p2p")) { // rank 1 never posts its sends
        Tensor x = host(DT_F32, 4, 1), xd = up(x);
        if (d.world.rank == 1) sleep(30);
        else {
            comm_exchange(&d.world, &(CommP2p){false, xd, 1}, 1);
            down(x, xd);
        }
    } else if (!strcmp(suite, "overlap") && gpu) {
        const char *e = getenv("PITH_FAKE_NCCL_DELAY_MS");
        double delay = e ? atof(e) / 1000 : 0, took[2];
        Tensor x = host(DT_F32, 1024, 1), y = host(DT_F32, 1024, 1), xd = up(x), yd = up(y);
        int P = d.world.size, me = d.world.rank;
        for (int overlapped = 0; overlapped < 2; overlapped++) {
            comm_barrier(&d.world);
            double t0 = now_seconds();
            CommReq q =
                comm_p2p_start(&d.world, (CommP2p[]){{true, xd, (me + 1) % P}, {false, yd, (me + P - 1) % P}}, 2);
            if (!overlapped) comm_wait(&q), down(y, yd);
            nanosleep(&(struct timespec){(time_t)delay, (long)((delay - (time_t)delay) * 1e9)}, NULL); // the compute
            if (overlapped) comm_wait(&q), down(y, yd);
            took[overlapped] = now_seconds() - t0;
        }
        if (me == 0)
            printf("exchange then compute %.3f s, overlapped %.3f s (delay %.3f s)\n", took[0], took[1], delay);
        EXPECT(delay > 0 && took[0] >= 1.9 * delay && took[1] < 0.8 * took[0], "no overlap: %.3f s vs %.3f s\n",
               took[1], took[0]);
    } else if (!strcmp(suite, "hazard") && gpu) { // an op on a receive's buffer before the wait
        Tensor x = host(DT_F32, 4, 1), xd = up(x);
        int peer = d.world.rank ^ 1;
        CommReq q = comm_p2p_start(&d.world, (CommP2p[]){{true, up(x), peer}, {false, xd, peer}}, 2);
        op_scale(xd, 2.0f);
        comm_wait(&q);
    } else die("test_parallel: unknown suite '%s'", argv[1]);
    if (d.world.rank == 0) printf("ok %s: %d ranks, %d checks on rank 0\n", argv[1], P, nchecks);
    if (gpu) arena_destroy(&devmem);
    dist_mesh_free(&d);
    dist_finalize();
    return 0;
}

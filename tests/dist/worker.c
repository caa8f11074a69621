// worker.c — build/test_dist SUITE: the multi-rank checks, run under `mpirun -np N` by tests/test_dist.c.
//   comm       every collective of dist/comm.h against values each rank can compute alone
//   ep         dispatch/combine (forward and backward) against a plain reference that every rank computes
//              from every rank's (deterministic) routing: counts, deduplication, expert order, empty ranks,
//              all tokens to one expert, top-k = number of experts
//   capacity   an ep_capacity_factor too small for the routing: must stop with the capacity message
//   hang       rank 1 stops taking part: the others must stop at parallel.timeout_s with a message
// A failed check dies (every rank stops, the message names the rank); success prints "ok SUITE" on rank 0.
#include <math.h>
#include <unistd.h>

#include "dist/ep.h"
#include "dist/mesh.h"

static int nchecks;
#define EXPECT(cond, ...)                                                                             \
    do {                                                                                              \
        nchecks++;                                                                                    \
        if (!(cond)) {                                                                                \
            fprintf(stderr, "check failed at %s:%d: %s: ", __FILE__, __LINE__, #cond);                \
            fprintf(stderr, __VA_ARGS__);                                                             \
            die("test_dist: check failed");                                                           \
        }                                                                                             \
    } while (0)

static Tensor host(DType dt, int64_t n0, int64_t n1) {
    Tensor t = tensor_make(xcalloc(n0 * n1 + 1, dtype_size(dt)), dt, DEV_CPU, n1 > 1 ? 2 : 1, n0, n1, 1, 1);
    return t;
}
#define F(t) ((float *)(t).p)
#define I32(t) ((int32_t *)(t).p)
#define I64(t) ((int64_t *)(t).p)
#define F64(t) ((double *)(t).p)

// ---- comm ----

static void suite_comm(const Dist *d) {
    const Comm *w = &d->world;
    int P = w->size, me = w->rank;
    Tensor x = host(DT_F64, 3, 1);
    F64(x)[0] = me, F64(x)[1] = 1, F64(x)[2] = -me;
    comm_allreduce(w, x, COMM_SUM);
    EXPECT(F64(x)[0] == P * (P - 1) / 2.0 && F64(x)[1] == P && F64(x)[2] == -P * (P - 1) / 2.0, "sum\n");
    Tensor m = host(DT_I64, 2, 1);
    I64(m)[0] = me, I64(m)[1] = 7 - me;
    comm_allreduce(w, m, COMM_MAX);
    EXPECT(I64(m)[0] == P - 1 && I64(m)[1] == 7, "max\n");
    // reduce-scatter: rank r's input block b holds r + 10·b + i; the sum over r of block me
    int n = 5;
    Tensor in = host(DT_F32, P * n, 1), out = host(DT_F32, n, 1);
    for (int b = 0; b < P; b++)
        for (int i = 0; i < n; i++) F(in)[b * n + i] = (float)(me + 10 * b + i);
    comm_reduce_scatter(w, out, in);
    for (int i = 0; i < n; i++) EXPECT(F(out)[i] == (float)(P * (P - 1) / 2 + P * (10 * me + i)), "reduce-scatter %d\n", i);
    // all-gather: block b = rank b's values
    for (int i = 0; i < n; i++) F(out)[i] = (float)(100 * me + i);
    comm_allgather(w, in, out);
    for (int b = 0; b < P; b++)
        for (int i = 0; i < n; i++) EXPECT(F(in)[b * n + i] == (float)(100 * b + i), "all-gather\n");
    // all-to-all with equal blocks: block p of rank r = 1000·r + p
    Tensor a = host(DT_I32, P, 1), b2 = host(DT_I32, P, 1);
    for (int p = 0; p < P; p++) I32(a)[p] = 1000 * me + p;
    comm_alltoall(w, b2, a);
    for (int p = 0; p < P; p++) EXPECT(I32(b2)[p] == 1000 * p + me, "all-to-all\n");
    // all-to-all with per-peer row counts: rank r sends (r + p) % 3 rows of width 2 to p (some zero)
    int64_t *sr = xcalloc(2 * P, sizeof(int64_t)), *rr = sr + P, ns = 0, nr = 0;
    for (int p = 0; p < P; p++) sr[p] = (me + p) % 3, rr[p] = (p + me) % 3, ns += sr[p], nr += rr[p];
    Tensor s = host(DT_F32, ns + 1, 2), r = host(DT_F32, nr + 1, 2);
    for (int p = 0, o = 0; p < P; p++)
        for (int k = 0; k < sr[p]; k++, o++) F(s)[2 * o] = (float)(me * 100 + p), F(s)[2 * o + 1] = (float)k;
    comm_alltoallv(w, r, rr, s, sr);
    for (int p = 0, o = 0; p < P; p++)
        for (int k = 0; k < rr[p]; k++, o++) EXPECT(F(r)[2 * o] == (float)(p * 100 + me) && F(r)[2 * o + 1] == (float)k, "all-to-all-v\n");
    // a ring of send/recv (even ranks send first), broadcast from the last rank, barrier
    Tensor v = host(DT_I64, 1, 1);
    if (P > 1) {
        for (int turn = 0; turn < 2; turn++) {
            if ((me % 2) == turn) I64(v)[0] = me, comm_send(w, v, (me + 1) % P);
            else {
                comm_recv(w, v, (me + P - 1) % P);
                EXPECT(I64(v)[0] == (me + P - 1) % P, "ring\n");
            }
        }
    }
    I64(v)[0] = me == P - 1 ? 4242 : 0;
    comm_broadcast(w, v, P - 1);
    EXPECT(I64(v)[0] == 4242, "broadcast\n");
    comm_barrier(w);
    // the mesh groups: sizes and coordinates agree with the rank formula
    EXPECT(dist_rank_of(d, d->pp_g.rank, d->dp_g.rank, d->cp_g.rank, d->ep_g.rank) == me, "rank order\n");
    Tensor e = host(DT_I64, 1, 1);
    I64(e)[0] = me;
    comm_allreduce(&d->ep_g, e, COMM_SUM); // ep groups are neighbouring ranks
    int first = me - d->ep_g.rank;
    EXPECT(I64(e)[0] == (int64_t)d->ep * first + d->ep * (d->ep - 1) / 2, "ep group members\n");
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
        int x = j + (int)(rng_u64(77, (uint64_t)(s * 1000 + t), (uint64_t)j) % (uint64_t)(pool - j)), tmp = perm[j]; // partial shuffle
        perm[j] = perm[x], perm[x] = tmp;
        out[j] = c->kind == 2 ? j : c->kind == 3 ? (t + j) % E : perm[j]; // 2: slot 0 is expert 0 for every token
    }
}

static float xval(int s, int t, int col) { return col == 0 ? (float)s : col == 1 ? (float)t : (float)rng_normal(3, s * 7919 + t, col); }
static float dyval(int s, int slot, int col) { return (float)rng_normal(4, s * 7919 + slot, col); }
static float dxeval(int s, int t, int e, int col) { return (float)rng_normal(5, (s * 7919 + t) * 131 + e, col); }

static void run_ep_case(const Dist *d, const EpCase *c, double capacity) {
    int P = d->ep, me = d->ep_g.rank, T = c->T, k = c->k, E = c->E, El = E / P, H = 6;
    Model m;
    memset(&m, 0, sizeof m);
    m.cfg.hidden = H, m.cfg.topk = k, m.cfg.experts = E, m.cfg.ep_size = P, m.cfg.ep_rank = me;
    m.cdt = DT_F32, m.dev = DEV_CPU, m.ep = &d->ep_g, m.ep_capacity = capacity;
    EpBuffers b;
    Arena cnt = arena_counting("communication", DEV_CPU);
    ep_buffers_alloc(&m, &b, &cnt, T);
    ep_buffers_free(&b);
    Arena comm = arena_create("communication", DEV_CPU, cnt.peak), act = arena_create("act", DEV_CPU, 1 << 24), ws = arena_create("ws", DEV_CPU, 1 << 24);
    ep_buffers_alloc(&m, &b, &comm, T);
    StageIO io = {0};
    io.offs = xcalloc(E + 1, sizeof(int64_t));
    io.route = ep_route_create(&m, &b);
    io.xd = arena_tensor(&act, DT_F32, 2, T, H, 0, 0);
    io.idx = arena_tensor(&act, DT_I32, 2, T, k, 0, 0);
    ep_alloc(&m, &io, &act, T);
    ep_grad_alloc(&m, &io, &ws, T);
    int32_t *ids = xmalloc((size_t)P * T * k * sizeof(int32_t)); // every rank's routing
    for (int s = 0; s < P; s++)
        for (int t = 0; t < T; t++) route(c, P, s, t, ids + ((size_t)s * T + t) * k);
    for (int t = 0; t < T; t++) {
        for (int col = 0; col < H; col++) F(io.xd)[t * H + col] = xval(me, t, col);
        for (int j = 0; j < k; j++) I32(io.idx)[t * k + j] = ids[((size_t)me * T + t) * k + j];
    }
    ep_dispatch_forward(&m, &io);
    // counts: deduplicated tokens to each rank, slots to each rank
    EpRoute *r = io.route;
    int64_t sent = 0;
    for (int g = 0; g < P && r; g++) { // (one rank: no route, the local permutation)
        int64_t tok = 0, slots = 0, rtok = 0, rslots = 0;
        for (int t = 0; t < T; t++) {
            int here = 0, from = 0;
            for (int j = 0; j < k; j++) here += ids[((size_t)me * T + t) * k + j] / El == g, from += ids[((size_t)g * T + t) * k + j] / El == me;
            tok += here > 0, slots += here, rtok += from > 0, rslots += from;
        }
        EXPECT(r->send_tok[g] == tok && r->send_slot[g] == slots, "%s: to rank %d: %lld tokens %lld slots, expected %lld %lld\n", c->name, g,
               (long long)r->send_tok[g], (long long)r->send_slot[g], (long long)tok, (long long)slots);
        EXPECT(r->recv_tok[g] == rtok && r->recv_slot[g] == rslots, "%s: from rank %d\n", c->name, g);
        sent += tok;
    }
    EXPECT(sent <= (int64_t)T * (k < P ? k : P), "%s: more rows sent than T·min(k, P)\n", c->name);
    for (int g = 0, o = 0; g < P && r; o += (int)r->send_tok[g], g++) // each token at most once per rank, in token order
        for (int i = 1; i < r->send_tok[g]; i++) EXPECT(I32(r->send_idx)[o + i] > I32(r->send_idx)[o + i - 1], "%s: dedup order\n", c->name);
    // expert order: local expert, then source rank, then the source's token order
    int64_t i = 0;
    for (int e = 0; e < El; e++) {
        EXPECT(io.offs[e] == i, "%s: offs[%d] = %lld, expected %lld\n", c->name, e, (long long)io.offs[e], (long long)i);
        for (int s = 0; s < P; s++)
            for (int t = 0; t < T; t++)
                for (int j = 0; j < k; j++)
                    if (ids[((size_t)s * T + t) * k + j] == me * El + e) {
                        for (int col = 0; col < H; col++) EXPECT(F(io.xe)[i * H + col] == xval(s, t, col), "%s: xe row %lld\n", c->name, (long long)i);
                        i++;
                    }
    }
    EXPECT(io.offs[El] == i, "%s: rows received\n", c->name);
    // combine: expert e's output is x·(e+1) + e, so slot (t, j) must come back as x_t·(idx+1) + idx
    for (int64_t q = 0; q < i; q++) {
        int e = 0;
        while (io.offs[e + 1] <= q) e++;
        int ge = me * El + e;
        for (int col = 0; col < H; col++) F(io.ye)[q * H + col] = F(io.xe)[q * H + col] * (float)(ge + 1) + (float)ge;
    }
    ep_combine_forward(&m, &io);
    for (int t = 0; t < T; t++)
        for (int j = 0; j < k; j++) {
            int ge = I32(io.idx)[t * k + j];
            for (int col = 0; col < H; col++)
                EXPECT(F(io.y)[(t * k + j) * H + col] == xval(me, t, col) * (float)(ge + 1) + (float)ge, "%s: combine slot %d.%d\n", c->name, t, j);
        }
    // combine backward: the gradient of slot (s, t, j) arrives at its expert row
    for (int sl = 0; sl < T * k; sl++)
        for (int col = 0; col < H; col++) F(io.dy)[sl * H + col] = dyval(me, sl, col);
    ep_combine_backward(&m, &io);
    for (int64_t q = 0; q < i; q++) {
        int e = 0;
        while (io.offs[e + 1] <= q) e++;
        int s = (int)F(io.xe)[q * H], t = (int)F(io.xe)[q * H + 1], j = 0;
        while (ids[((size_t)s * T + t) * k + j] != me * El + e) j++;
        for (int col = 0; col < H; col++) EXPECT(F(io.dye)[q * H + col] == dyval(s, t * k + j, col), "%s: combine backward row %lld\n", c->name, (long long)q);
    }
    // dispatch backward: token t receives the sum of its slots' row gradients from every rank
    for (int64_t q = 0; q < i; q++) {
        int e = 0;
        while (io.offs[e + 1] <= q) e++;
        int s = (int)F(io.xe)[q * H], t = (int)F(io.xe)[q * H + 1];
        for (int col = 0; col < H; col++) F(io.dxe)[q * H + col] = dxeval(s, t, me * El + e, col);
    }
    ep_dispatch_backward(&m, &io);
    for (int t = 0; t < T; t++)
        for (int col = 0; col < H; col++) {
            double want = 0;
            for (int j = 0; j < k; j++) want += dxeval(me, t, I32(io.idx)[t * k + j], col);
            EXPECT(fabs(F(io.dxd)[t * H + col] - want) <= 1e-5 * (1 + fabs(want)), "%s: dispatch backward token %d: %g vs %g\n", c->name, t,
                   F(io.dxd)[t * H + col], want);
        }
    ep_route_free(io.route), ep_buffers_free(&b), free(io.offs), free(ids);
    arena_destroy(&comm), arena_destroy(&act), arena_destroy(&ws);
}

static void suite_ep(const Dist *d) {
    int P = d->ep, E = 2 * P;
    EpCase cases[] = {
        {"random", 37, 3 < E ? 3 : E, E, 0},
        {"random-top1", 20, 1, E, 0},
        {"empty last rank", 25, 2, E, 1},
        {"all to expert 0", 19, 1, E, 2},
        {"all to expert 0, k=2", 19, 2, E, 2},
        {"top-k = experts", 11, E, E, 3},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        if (cases[c].kind == 1 && P == 1) continue;
        run_ep_case(d, &cases[c], 0);
    }
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 2) die("usage: test_dist comm|ep|capacity|hang");
    dist_launch();
    int P = dist_world_size();
    Dist d;
    dist_mesh_init(&d, 1, 1, strcmp(argv[1], "comm") ? P : (P % 2 ? 1 : 2), false, !strcmp(argv[1], "hang") ? 3 : 60, "test_dist");
    if (!strcmp(argv[1], "comm")) suite_comm(&d);
    else if (!strcmp(argv[1], "ep")) suite_ep(&d);
    else if (!strcmp(argv[1], "capacity")) {
        EpCase c = {"capacity", 16, 1, 2 * P, 2}; // everything to expert 0: rank 0 receives P·T rows
        run_ep_case(&d, &c, 1.5);                // room for 1.5·T·k rows only
    } else if (!strcmp(argv[1], "hang")) {
        if (d.world.rank == 1) sleep(30); // stops taking part
        comm_barrier(&d.world);
    } else die("test_dist: unknown suite '%s'", argv[1]);
    if (d.world.rank == 0) printf("ok %s: %d ranks, %d checks on rank 0\n", argv[1], P, nchecks);
    dist_mesh_free(&d);
    dist_finalize();
    return 0;
}

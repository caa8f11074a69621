// dualpipev.c — the DualPipeV schedule (dualpipev.h): the eight phases of docs/architecture.md
// ("Pipeline parallelism"), each rank's steps in order with their messages, and the buffer lifetimes.
// The builder mirrors the reference step for step: pending sends and receives accumulate and are
// committed (posted as one group, then waited for) right before the next compute; micro-batches are
// numbered by per-phase counters, so the k-th receive of a phase is the input of its k-th forward.
#include "pipe/dualpipev.h"

#include "ops/ops.h"

#include <time.h>

typedef struct {
    PipeSchedule *s;
    int cap;                        // of steps and of msgs
    int committed;                  // msgs before this index belong to a step's group
    int f[2], b[2];                 // forwards and backwards computed, per phase
    int rf[2], sf[2], rb[2], sb[2]; // activation / gradient receives and sends appended, per phase
    int *wq, wq_head, wq_tail;      // FIFO of backward chunks (phase·N + mb) waiting for their W
} Build;

const char *dualpipev_check(int P, int N, int layers) {
    static char why[160];
    if (P < 1) snprintf(why, sizeof why, "the pipeline needs at least one rank (got %d)", P);
    else if (layers % (2 * P))
        snprintf(why, sizeof why, "DualPipeV cuts the model into 2 × %d = %d chunks: %d layers do not divide evenly", P,
                 2 * P, layers);
    else if (N < 2 * P)
        snprintf(why, sizeof why, "DualPipeV needs at least 2 × %d = %d micro-batches per step, got %d", P, 2 * P, N);
    else return NULL;
    return why;
}

// A chunk that receives no activation and sends no input gradient (the model's first, or the last
// rank's phase 1, whose input is its own phase 0's output), and one that sends no activation and
// receives no output gradient (the model's last, or the last rank's phase 0).
static bool first_stage(const Build *b, int p) {
    return (b->s->rank == 0 && p == 0) || (b->s->rank == b->s->P - 1 && p == 1);
}
static bool last_stage(const Build *b, int p) {
    return (b->s->rank == 0 && p == 1) || (b->s->rank == b->s->P - 1 && p == 0);
}
static int prev_rank(const Build *b) { return b->s->rank - 1; }
static int next_rank(const Build *b) { return b->s->rank + 1; }

static void claim(Build *b, int kind, int p, int mb, int t) {
    CHECK(mb < b->s->N && b->s->claim[kind][p][mb] < 0);
    b->s->claim[kind][p][mb] = t;
}
static void release(Build *b, int kind, int p, int mb, int t) {
    CHECK(b->s->claim[kind][p][mb] >= 0 && b->s->release[kind][p][mb] < 0);
    b->s->release[kind][p][mb] = t;
}

// The time of the next step's wait (when an appended message is posted) and of the last step's compute.
static int next_wait(const Build *b) { return 2 * b->s->nsteps; }
static int compute_time(const Build *b) { return 2 * b->s->nsteps - 1; }

static void append(Build *b, bool send, bool grad, int p, int mb, int peer) {
    CHECK(b->s->nmsgs < b->cap);
    b->s->msgs[b->s->nmsgs++] = (PipeMsg){send, grad, p, mb, peer};
}

static void recv_forward(Build *b, int p) {
    if (first_stage(b, p)) return;
    int mb = b->rf[p]++;
    claim(b, PIPE_REC, p, mb, next_wait(b));
    append(b, false, false, p, mb, p == 0 ? prev_rank(b) : next_rank(b));
}
static void send_forward(Build *b, int p) {
    if (last_stage(b, p)) return;
    append(b, true, false, p, b->sf[p]++, p == 0 ? next_rank(b) : prev_rank(b));
}
static void recv_backward(Build *b, int p) {
    if (b->s->forward_only || last_stage(b, p)) return;
    int mb = b->rb[p]++;
    claim(b, PIPE_GOUT, p, mb, next_wait(b));
    append(b, false, true, p, mb, p == 0 ? next_rank(b) : prev_rank(b));
}
static void send_backward(Build *b, int p) {
    if (b->s->forward_only || first_stage(b, p)) return;
    append(b, true, true, p, b->sb[p]++, p == 0 ? prev_rank(b) : next_rank(b));
}

// A new step whose group is every message appended since the last one. An input gradient is released
// when its send has been waited for, and so (forward-only) is a record whose output is sent.
static PipeStep *commit(Build *b, PipeKind kind) {
    PipeSchedule *s = b->s;
    CHECK(s->nsteps < b->cap);
    PipeStep *st = &s->steps[s->nsteps++];
    *st = (PipeStep){kind, -1, -1, -1, -1, false, b->committed, s->nmsgs - b->committed};
    for (int i = b->committed; i < s->nmsgs; i++) {
        const PipeMsg *m = &s->msgs[i];
        if (m->send && m->grad) release(b, PIPE_GIN, m->phase, m->mb, 2 * (s->nsteps - 1));
        if (m->send && !m->grad && s->forward_only) release(b, PIPE_REC, m->phase, m->mb, 2 * (s->nsteps - 1));
    }
    b->committed = s->nmsgs;
    return st;
}

// The compute of a forward of phase p (its step already committed).
static int forward_compute(Build *b, int p) {
    PipeSchedule *s = b->s;
    int mb = b->f[p]++, t = compute_time(b);
    if (s->rank == 0 && p == 0) claim(b, PIPE_REC, 0, mb, t);        // the micro-batch's tokens
    if (s->rank == s->P - 1 && p == 0) claim(b, PIPE_REC, 1, mb, t); // the hand-off to phase 1
    if (s->forward_only && last_stage(b, p)) release(b, PIPE_REC, p, mb, t);
    return mb;
}

static int backward_compute(Build *b, int p, bool zb) {
    PipeSchedule *s = b->s;
    int mb = b->b[p]++, t = compute_time(b);
    if (!(s->rank == 0 && p == 1)) release(b, PIPE_GOUT, p, mb, t);   // rank 0's phase 1 starts from the loss
    if (s->rank == s->P - 1 && p == 1) claim(b, PIPE_GOUT, 0, mb, t); // the hand-off to phase 0
    if (!first_stage(b, p)) claim(b, PIPE_GIN, p, mb, t);
    if (zb) {
        b->wq[b->wq_tail++] = p * s->N + mb;
        if (b->wq_tail - b->wq_head > s->max_deferred) s->max_deferred = b->wq_tail - b->wq_head;
        int waiting = 0;
        for (int i = b->wq_head; i < b->wq_tail; i++) waiting += b->wq[i] / s->N == p;
        if (waiting > s->max_deferred_of[p]) s->max_deferred_of[p] = waiting;
    } else release(b, PIPE_REC, p, mb, t);
    return mb;
}

// A commit with nothing to compute, only when there is something to commit (the reference skips empty ones).
static void sync(Build *b) {
    if (b->s->nmsgs > b->committed) commit(b, PIPE_SYNC);
}

static void fwd(Build *b, int p, bool recv, bool send) {
    if (recv) recv_forward(b, p);
    PipeStep *st = commit(b, PIPE_F);
    st->fphase = p, st->fmb = forward_compute(b, p);
    if (send) send_forward(b, p);
}

static void bwd(Build *b, int p, bool zb, bool recv, bool send) {
    if (b->s->forward_only) return sync(b);
    if (recv) recv_backward(b, p);
    PipeStep *st = commit(b, PIPE_B);
    st->bphase = p, st->zb = zb, st->bmb = backward_compute(b, p, zb);
    if (send) send_backward(b, p);
}

// The overlapped pair: forward of phase p0 beside backward of phase p1 (never deferring weight gradients).
static void fwdbwd(Build *b, int p0, int p1, bool recv0) {
    if (b->s->forward_only) return fwd(b, p0, recv0, true);
    if (recv0) recv_forward(b, p0);
    recv_backward(b, p1);
    PipeStep *st = commit(b, PIPE_FB);
    st->fphase = p0, st->fmb = forward_compute(b, p0);
    st->bphase = p1, st->bmb = backward_compute(b, p1, false);
    send_forward(b, p0);
    send_backward(b, p1);
}

// The deferred weight gradients of the oldest backward chunk that deferred them.
static void weight(Build *b) {
    if (b->s->forward_only) return;
    CHECK(b->wq_head < b->wq_tail);
    PipeStep *st = commit(b, PIPE_W);
    int q = b->wq[b->wq_head++];
    st->bphase = q / b->s->N, st->bmb = q % b->s->N;
    release(b, PIPE_REC, st->bphase, st->bmb, compute_time(b));
}

// Packs the intervals of one buffer kind and phase into the fewest slots: in order of claim, each takes
// the lowest slot free by then (greedy by start time is optimal for intervals).
static int assign_slots(int N, const int *claim, const int *release, int *slot) {
    int *order = xmalloc((size_t)N * sizeof(int)), *busy_until = xmalloc((size_t)N * sizeof(int)), n = 0, nslots = 0;
    for (int mb = 0; mb < N; mb++)
        if (claim[mb] >= 0) order[n++] = mb;
    for (int i = 1; i < n; i++) // insertion sort by claim time (N is small)
        for (int j = i; j > 0 && claim[order[j]] < claim[order[j - 1]]; j--) {
            int t = order[j];
            order[j] = order[j - 1], order[j - 1] = t;
        }
    for (int i = 0; i < n; i++) {
        int mb = order[i], k = 0;
        while (k < nslots && busy_until[k] >= claim[mb]) k++;
        if (k == nslots) nslots++;
        busy_until[k] = release[mb], slot[mb] = k;
    }
    free(order), free(busy_until);
    return nslots;
}

void dualpipev_build(PipeSchedule *s, int P, int N, int r, bool forward_only) {
    const char *why = dualpipev_check(P, N, 2 * P);
    if (why) die("pipeline schedule: %s", why);
    CHECK(r >= 0 && r < P);
    memset(s, 0, sizeof *s);
    s->P = P, s->N = N, s->rank = r, s->forward_only = forward_only;
    Build b = {.s = s, .cap = 8 * N + 8};
    s->steps = xcalloc(b.cap, sizeof(PipeStep)), s->msgs = xcalloc(b.cap, sizeof(PipeMsg));
    b.wq = xcalloc(2 * N, sizeof(int));
    for (int k = 0; k < PIPE_NBUF; k++)
        for (int p = 0; p < 2; p++) {
            s->claim[k][p] = xmalloc((size_t)N * sizeof(int)), s->release[k][p] = xmalloc((size_t)N * sizeof(int));
            s->slot[k][p] = xmalloc((size_t)N * sizeof(int));
            for (int mb = 0; mb < N; mb++) s->claim[k][p][mb] = s->release[k][p][mb] = s->slot[k][p][mb] = -1;
        }
    bool last = r == P - 1;
    // 1: nF0 — fill the pipeline with phase-0 forwards
    for (int i = 0; i < 2 * (P - r - 1); i++) fwd(&b, 0, true, true);
    // 2: nF0F1 — alternate phase-0 and phase-1 forwards, one phase-0 receive always posted ahead
    recv_forward(&b, 0);
    for (int i = 0; i < r + 1; i++) {
        fwd(&b, 0, false, false);
        recv_forward(&b, 0);
        fwd(&b, 1, true, !last || i < r);
        send_forward(&b, 0);
    }
    // 3: nB1W1F1 — phase-1 backwards that defer their expert weight gradients (zero bubble)
    for (int i = 0; i < P - r - 1; i++) {
        bwd(&b, 1, true, true, true);
        recv_forward(&b, 1);
        weight(&b);
        fwd(&b, 1, false, true);
    }
    // 4: nF0B1F1B0 — the steady state of overlapped pairs; the last rank's first pair is not overlapped
    for (int i = 0; i < N - 2 * P + r + 1; i++) {
        if (i == 0 && last) {
            fwd(&b, 0, false, false);
            send_forward(&b, 1);
            bwd(&b, 1, false, true, false);
            send_forward(&b, 0);
            send_backward(&b, 1);
        } else fwdbwd(&b, 0, 1, i > 0);
        fwdbwd(&b, 1, 0, true);
    }
    // 5: nB1F1B0
    for (int i = 0; i < P - r - 1; i++) {
        bwd(&b, 1, false, true, true);
        fwdbwd(&b, 1, 0, true);
    }
    // 6: nB1B0 — the second half defers weight gradients (from before B1 on odd ranks, between on even)
    bool zb = false;
    for (int i = 0; i < r + 1; i++) {
        if (i == (r + 1) / 2 && r % 2 == 1) zb = true;
        bwd(&b, 1, zb, true, true);
        if (i == (r + 1) / 2 && r % 2 == 0) zb = true;
        bwd(&b, 0, zb, true, true);
    }
    // 7: nWB0
    for (int i = 0; i < P - r - 1; i++) {
        weight(&b);
        bwd(&b, 0, true, true, true);
    }
    // 8: nW — drain the deferred weight gradients, then commit what is still pending
    for (int i = 0; i < r + 1; i++) weight(&b);
    sync(&b);
    for (int p = 0; p < 2; p++) CHECK(b.f[p] == N && b.b[p] == (forward_only ? 0 : N));
    CHECK(b.wq_head == b.wq_tail && b.committed == s->nmsgs);
    for (int k = 0; k < PIPE_NBUF; k++)
        for (int p = 0; p < 2; p++) {
            for (int mb = 0; mb < N; mb++) CHECK((s->claim[k][p][mb] < 0) == (s->release[k][p][mb] < 0));
            s->slots[k][p] = assign_slots(N, s->claim[k][p], s->release[k][p], s->slot[k][p]);
        }
    free(b.wq);
}

void dualpipev_free(PipeSchedule *s) {
    free(s->steps), free(s->msgs);
    for (int k = 0; k < PIPE_NBUF; k++)
        for (int p = 0; p < 2; p++) free(s->claim[k][p]), free(s->release[k][p]), free(s->slot[k][p]);
    memset(s, 0, sizeof *s);
}

char *dualpipev_format(const PipeSchedule *s) {
    size_t cap = 16 * (size_t)s->nsteps + 1, n = 0;
    char *out = xmalloc(cap);
    out[0] = 0;
    for (int i = 0; i < s->nsteps; i++) {
        const PipeStep *st = &s->steps[i];
        const char *sep = n ? " " : "";
        switch (st->kind) {
        case PIPE_F: n += snprintf(out + n, cap - n, "%sF%d", sep, st->fphase); break;
        case PIPE_B: n += snprintf(out + n, cap - n, "%sB%d%s", sep, st->bphase, st->zb ? "(zb)" : ""); break;
        case PIPE_FB: n += snprintf(out + n, cap - n, "%s[F%d|B%d]", sep, st->fphase, st->bphase); break;
        case PIPE_W: n += snprintf(out + n, cap - n, "%sW", sep); break;
        case PIPE_SYNC: break;
        }
    }
    return out;
}

// ---- running a schedule ----

// Whether phase p of this rank has buffers of kind: an input unless it is the model's first chunk (the
// last rank's phase 1 takes its input by hand-off into them), an output unless it is a last stage, an
// output gradient unless it starts from the loss (the last rank's phase 0 takes it by hand-off), an input
// gradient unless it is a first stage.
static bool has_buffers(const PipeSchedule *s, int kind, int p) {
    bool first = (s->rank == 0 && p == 0) || (s->rank == s->P - 1 && p == 1);
    bool last = (s->rank == 0 && p == 1) || (s->rank == s->P - 1 && p == 0);
    switch (kind) {
    case PIPE_ACT_IN: return !(s->rank == 0 && p == 0);
    case PIPE_ACT_OUT: return !last;
    case PIPE_GRAD_OUT: return !(s->rank == 0 && p == 1);
    default: return !first;
    }
}
static int slot_kind(int kind) {
    return kind == PIPE_GRAD_OUT ? PIPE_GOUT : kind == PIPE_GRAD_IN ? PIPE_GIN : PIPE_REC;
}

void dualpipev_run_init(PipeRun *run, const PipeSchedule *s, const Comm *pp, Arena *a, DType dt, int64_t T, int64_t H) {
    CHECK(pp->size == s->P && pp->rank == s->rank);
    memset(run, 0, sizeof *run);
    run->s = s, run->pp = pp;
    const char *e = getenv("PITH_TEST_PIPE_DELAY");
    int r = -2, us = 0;
    if (e && (sscanf(e, "%d:%d", &r, &us) != 2 || us < 0))
        die("PITH_TEST_PIPE_DELAY: \"%s\" is not RANK:MICROSECONDS", e);
    if (e && (r == -1 || r == s->rank)) run->delay_us = us;
    for (int k = 0; k < PIPE_NTENSOR; k++)
        for (int p = 0; p < 2; p++) {
            int n = has_buffers(s, k, p) ? s->slots[slot_kind(k)][p] : 0;
            run->t[k][p] = xcalloc(n + 1, sizeof(Tensor));
            for (int i = 0; i < n; i++) run->t[k][p][i] = arena_tensor(a, dt, 2, T, H, 0, 0);
        }
}

void dualpipev_run_free(PipeRun *run) {
    for (int k = 0; k < PIPE_NTENSOR; k++)
        for (int p = 0; p < 2; p++) free(run->t[k][p]);
    memset(run, 0, sizeof *run);
}

Tensor dualpipev_buffer(const PipeRun *run, int kind, int phase, int mb) {
    int slot = run->s->slot[slot_kind(kind)][phase][mb];
    if (!has_buffers(run->s, kind, phase) || slot < 0) return (Tensor){0};
    return run->t[kind][phase][slot];
}

static int msg_buffer(const PipeMsg *m) {
    return m->grad ? (m->send ? PIPE_GRAD_IN : PIPE_GRAD_OUT) : (m->send ? PIPE_ACT_OUT : PIPE_ACT_IN);
}

void dualpipev_run(PipeRun *run, const PipeChunks *c) {
    const PipeSchedule *s = run->s;
    bool last = s->rank == s->P - 1;
    ops_sync();
    double t0 = now_seconds();
    run->busy_s = 0;
    for (int i = 0; i < s->nsteps; i++) {
        const PipeStep *st = &s->steps[i];
        if (st->nmsg) { // the step's group, posted together and waited for before the compute
            CommP2p ops[COMM_MAX_P2P];
            CHECK(st->nmsg <= COMM_MAX_P2P);
            for (int k = 0; k < st->nmsg; k++) {
                const PipeMsg *m = &s->msgs[st->msg0 + k];
                ops[k] = (CommP2p){m->send, dualpipev_buffer(run, msg_buffer(m), m->phase, m->mb), m->peer};
                CHECK(ops[k].x.p);
            }
            CommReq q = comm_p2p_start(run->pp, ops, st->nmsg);
            comm_wait(&q);
        }
        if (st->kind == PIPE_SYNC) continue;
        ops_sync(); // the receives are in: from here to the compute's end the rank is busy
        double c0 = now_seconds();
        Tensor x = {0}, y = {0}, dy = {0}, dx = {0};
        int fp = st->fphase, fmb = st->fmb, bp = st->bphase, bmb = st->bmb;
        if (st->kind == PIPE_F || st->kind == PIPE_FB) { // the last rank's phase 0 writes phase 1's input
            x = dualpipev_buffer(run, PIPE_ACT_IN, fp, fmb);
            y = last && fp == 0 ? dualpipev_buffer(run, PIPE_ACT_IN, 1, fmb)
                                : dualpipev_buffer(run, PIPE_ACT_OUT, fp, fmb);
        }
        if (st->kind == PIPE_B || st->kind == PIPE_FB) { // the last rank's phase 1 writes phase 0's gradient
            dy = dualpipev_buffer(run, PIPE_GRAD_OUT, bp, bmb);
            dx = last && bp == 1 ? dualpipev_buffer(run, PIPE_GRAD_OUT, 0, bmb)
                                 : dualpipev_buffer(run, PIPE_GRAD_IN, bp, bmb);
        }
        if (st->kind == PIPE_FB && c->pair)
            c->pair(c->ctx, fp, fmb, s->slot[PIPE_REC][fp][fmb], x, y, bp, bmb, s->slot[PIPE_REC][bp][bmb], dy, dx);
        else {
            if (st->kind == PIPE_F || st->kind == PIPE_FB)
                c->forward(c->ctx, fp, fmb, s->slot[PIPE_REC][fp][fmb], x, y);
            if (st->kind == PIPE_B || st->kind == PIPE_FB)
                c->backward(c->ctx, bp, bmb, s->slot[PIPE_REC][bp][bmb], dy, dx, st->zb);
        }
        if (st->kind == PIPE_W) c->weight(c->ctx, st->bphase, st->bmb, s->slot[PIPE_REC][st->bphase][st->bmb]);
        if (run->delay_us)
            nanosleep(&(struct timespec){run->delay_us / 1000000, run->delay_us % 1000000 * 1000L}, NULL);
        ops_sync();
        run->busy_s += now_seconds() - c0;
    }
    run->pipe_s = now_seconds() - t0;
}

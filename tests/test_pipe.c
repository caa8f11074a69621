// test_pipe.c — the DualPipeV schedule (pipe/dualpipev.h) as data, for P = 1..4 ranks and several
// micro-batch counts: the reference's P = 2, N = 8 order exactly; every forward, backward and deferred
// weight gradient once and in dependency order; every message matched once by the right rank, chunk and
// micro-batch (messages between two ranks pair in posting order, as NCCL pairs them); the ranks run to
// the end when each group of messages blocks until every message of it has met its partner (no
// deadlock); every buffer a step touches is alive then, and the slots never hold two buffers at once.
#include "pipe/dualpipev.h"
#include "pipe/chunk.h"
#include "test.h"

static PipeSchedule *build_all(int P, int N, bool forward_only) {
    PipeSchedule *s = xcalloc(P, sizeof *s);
    for (int r = 0; r < P; r++) dualpipev_build(&s[r], P, N, r, forward_only);
    return s;
}
static void free_all(PipeSchedule *s, int P) {
    for (int r = 0; r < P; r++) dualpipev_free(&s[r]);
    free(s);
}

// The step of rank s holding message m (by index), and of each (phase, mb)'s forward and backward.
static int step_of_msg(const PipeSchedule *s, int m) {
    for (int i = 0; i < s->nsteps; i++)
        if (m >= s->steps[i].msg0 && m < s->steps[i].msg0 + s->steps[i].nmsg) return i;
    return -1;
}

static void expect_alive(const PipeSchedule *s, int kind, int p, int mb, int t, const char *what) {
    static const char *kinds[] = {"record", "output gradient", "input gradient"};
    int c = s->claim[kind][p][mb], r = s->release[kind][p][mb];
    ASSERT_MSG(c >= 0 && c <= t && t <= r,
               "P=%d N=%d rank %d: %s of phase %d mb %d used by %s at time %d, alive over [%d, %d]", s->P, s->N,
               s->rank, kinds[kind], p, mb, what, t, c, r);
}

// One rank alone: counts, order of computes, and buffer lifetimes.
static void check_rank(const PipeSchedule *s) {
    int P = s->P, N = s->N, r = s->rank;
    int *fstep = xmalloc(2 * N * sizeof(int)), *bstep = xmalloc(2 * N * sizeof(int)), *zb = xcalloc(2 * N, sizeof(int)),
        *wdone = xcalloc(2 * N, sizeof(int));
    for (int i = 0; i < 2 * N; i++) fstep[i] = bstep[i] = -1;
    int nf[2] = {0, 0}, nb[2] = {0, 0}, nzb = 0, nw = 0;
    for (int i = 0; i < s->nsteps; i++) {
        const PipeStep *st = &s->steps[i];
        for (int m = st->msg0; m < st->msg0 + st->nmsg; m++) {
            const PipeMsg *g = &s->msgs[m];
            expect_alive(s, g->grad ? (g->send ? PIPE_GIN : PIPE_GOUT) : PIPE_REC, g->phase, g->mb, 2 * i, "a message");
            const int *done = g->grad ? bstep : fstep;
            if (g->send)
                ASSERT_MSG(done[g->phase * N + g->mb] >= 0 && done[g->phase * N + g->mb] < i,
                           "rank %d: sends phase %d mb %d before computing it", r, g->phase, g->mb);
            else
                ASSERT_MSG(done[g->phase * N + g->mb] < 0,
                           "rank %d: receives the input of phase %d mb %d after computing it", r, g->phase, g->mb);
        }
        int t = 2 * i + 1;
        if (st->kind == PIPE_F || st->kind == PIPE_FB) {
            int p = st->fphase, mb = st->fmb;
            ASSERT_MSG(mb == nf[p]++, "rank %d: forwards of phase %d out of order", r, p);
            fstep[p * N + mb] = i;
            expect_alive(s, PIPE_REC, p, mb, t, "its forward");
            if (r == P - 1 && p == 0) expect_alive(s, PIPE_REC, 1, mb, t, "the hand-off");
            if (r == P - 1 && p == 1)
                ASSERT_MSG(fstep[mb] >= 0 && fstep[mb] < i, "rank %d: F1 mb %d before its F0", r, mb);
        }
        if (st->kind == PIPE_B || st->kind == PIPE_FB) {
            int p = st->bphase, mb = st->bmb;
            ASSERT_MSG(mb == nb[p]++, "rank %d: backwards of phase %d out of order", r, p);
            ASSERT_MSG(fstep[p * N + mb] >= 0 && fstep[p * N + mb] < i, "rank %d: B%d mb %d before its forward", r, p,
                       mb);
            ASSERT_MSG(!st->zb || st->kind == PIPE_B, "rank %d: an overlapped pair defers", r);
            bstep[p * N + mb] = i;
            expect_alive(s, PIPE_REC, p, mb, t, "its backward");
            if (!(r == 0 && p == 1)) expect_alive(s, PIPE_GOUT, p, mb, t, "its backward");
            if (r == P - 1 && p == 0)
                ASSERT_MSG(bstep[N + mb] >= 0 && bstep[N + mb] < i, "rank %d: B0 mb %d before its B1", r, mb);
            if (r == P - 1 && p == 1) expect_alive(s, PIPE_GOUT, 0, mb, t, "the hand-off");
            if (st->zb) zb[p * N + mb] = 1, nzb++;
        }
        if (st->kind == PIPE_W) {
            int q = st->bphase * N + st->bmb;
            ASSERT_MSG(zb[q] && !wdone[q] && bstep[q] >= 0 && bstep[q] < i,
                       "rank %d: W of phase %d mb %d not after its deferring B, or twice", r, st->bphase, st->bmb);
            wdone[q] = 1, nw++;
            expect_alive(s, PIPE_REC, st->bphase, st->bmb, t, "its W");
        }
    }
    int want_b = s->forward_only ? 0 : N;
    ASSERT_MSG(nf[0] == N && nf[1] == N && nb[0] == want_b && nb[1] == want_b,
               "rank %d: %d %d forwards, %d %d backwards", r, nf[0], nf[1], nb[0], nb[1]);
    ASSERT_MSG(nw == nzb, "rank %d: %d deferring backwards but %d W", r, nzb, nw);
    // buffers: the slots of overlapping lifetimes differ, and the slot count is the most alive at once
    for (int k = 0; k < PIPE_NBUF; k++)
        for (int p = 0; p < 2; p++) {
            int most = 0;
            for (int t = -1; t <= 2 * s->nsteps; t++) {
                int alive = 0;
                for (int mb = 0; mb < N; mb++)
                    alive += s->claim[k][p][mb] >= 0 && s->claim[k][p][mb] <= t && t <= s->release[k][p][mb];
                most = alive > most ? alive : most;
            }
            ASSERT_MSG(s->slots[k][p] == most, "rank %d: %d slots of kind %d phase %d for at most %d alive", r,
                       s->slots[k][p], k, p, most);
            for (int a = 0; a < N; a++)
                for (int b = a + 1; b < N; b++)
                    if (s->claim[k][p][a] >= 0 && s->claim[k][p][b] >= 0 && s->slot[k][p][a] == s->slot[k][p][b])
                        ASSERT_MSG(s->release[k][p][a] < s->claim[k][p][b] || s->release[k][p][b] < s->claim[k][p][a],
                                   "rank %d: mb %d and %d share slot %d of kind %d phase %d while both alive", r, a, b,
                                   s->slot[k][p][a], k, p);
        }
    free(fstep), free(bstep), free(zb), free(wdone);
}

// All ranks together: messages pair up and the ranks finish.
static void check_pipeline(const PipeSchedule *s, int P) {
    int N = s[0].N;
    // partner[r][m] = (rank, message index) of message m of rank r: the k-th send from a to b meets the
    // k-th receive on b from a
    int **partner = xcalloc(P, sizeof(int *));
    for (int r = 0; r < P; r++) partner[r] = xmalloc((size_t)(s[r].nmsgs + 1) * sizeof(int));
    for (int a = 0; a < P; a++)
        for (int b = 0; b < P; b++) {
            int j = 0;
            for (int i = 0; i < s[a].nmsgs; i++) {
                const PipeMsg *x = &s[a].msgs[i];
                if (!x->send || x->peer != b) continue;
                ASSERT_MSG(b >= 0 && b < P && (b == a + 1 || b == a - 1), "rank %d sends to rank %d", a, b);
                while (j < s[b].nmsgs && (s[b].msgs[j].send || s[b].msgs[j].peer != a)) j++;
                ASSERT_MSG(j < s[b].nmsgs,
                           "P=%d N=%d: rank %d sends %s phase %d mb %d to rank %d, which posts no receive for it", P, N,
                           a, x->grad ? "gradient" : "activation", x->phase, x->mb, b);
                const PipeMsg *y = &s[b].msgs[j];
                ASSERT_MSG(y->grad == x->grad && y->phase == x->phase && y->mb == x->mb,
                           "P=%d N=%d: rank %d sends %s phase %d mb %d to rank %d, which expects %s phase %d mb %d", P,
                           N, a, x->grad ? "gradient" : "activation", x->phase, x->mb, b,
                           y->grad ? "gradient" : "activation", y->phase, y->mb);
                int cs = dualpipev_chunk(P, a, x->phase), cr = dualpipev_chunk(P, b, y->phase);
                ASSERT_MSG(cr == (x->grad ? cs - 1 : cs + 1), "P=%d: chunk %d on rank %d sends to chunk %d on rank %d",
                           P, cs, a, cr, b);
                partner[a][i] = b * 1000000 + j, partner[b][j] = a * 1000000 + i, j++;
            }
            for (; j < s[b].nmsgs; j++)
                ASSERT_MSG(s[b].msgs[j].send || s[b].msgs[j].peer != a,
                           "P=%d N=%d: rank %d receives from rank %d more than it sends", P, N, b, a);
        }
    // every chunk input and gradient that crosses ranks is received exactly once (by the pairing above,
    // one send each); those that stay on a rank are the data, the loss and the last rank's hand-offs
    for (int r = 0; r < P; r++) {
        int nrecv = 0;
        for (int i = 0; i < s[r].nmsgs; i++) nrecv += !s[r].msgs[i].send;
        int want = N * ((r > 0) + (r < P - 1)) * (s[r].forward_only ? 1 : 2);
        ASSERT_MSG(nrecv == want, "P=%d N=%d rank %d: %d receives, expected %d", P, N, r, nrecv, want);
    }
    // blocking groups: a rank at step i has posted step i's group; the group completes once every
    // partner has posted its own
    int *at = xcalloc(P, sizeof(int)), left = P;
    while (left) {
        bool moved = false;
        for (int r = 0; r < P; r++) {
            if (at[r] == s[r].nsteps) continue;
            const PipeStep *st = &s[r].steps[at[r]];
            bool ready = true;
            for (int m = st->msg0; m < st->msg0 + st->nmsg && ready; m++) {
                int b = partner[r][m] / 1000000;
                ready = at[b] >= step_of_msg(&s[b], partner[r][m] % 1000000);
            }
            if (ready) {
                at[r]++, moved = true;
                if (at[r] == s[r].nsteps) left--;
            }
        }
        if (!moved) {
            char where[256];
            int n = 0;
            for (int r = 0; r < P; r++)
                n += snprintf(where + n, sizeof where - n, " rank %d at step %d/%d;", r, at[r], s[r].nsteps);
            ASSERT_MSG(false, "P=%d N=%d%s: deadlock:%s", P, N, s[0].forward_only ? " forward-only" : "", where);
        }
    }
    for (int r = 0; r < P; r++) free(partner[r]);
    free(partner), free(at);
}

TEST(pipe_schedule_reference_example) {
    // The reference's order for P = 2, N = 8 ([Fa|Bb]: an overlapped pair, (zb): deferred expert weight gradients).
    static const char *want[2] = {"F0 F0 F0 F1 B1(zb) W F1 [F0|B1] [F1|B0] [F0|B1] [F1|B0] [F0|B1] [F1|B0] [F0|B1] "
                                  "[F1|B0] [F0|B1] [F1|B0] B1 [F1|B0] B1 B0(zb) W B0(zb) W",
                                  "F0 F1 F0 F1 F0 B1 [F1|B0] [F0|B1] [F1|B0] [F0|B1] [F1|B0] [F0|B1] [F1|B0] [F0|B1] "
                                  "[F1|B0] [F0|B1] [F1|B0] B1 B0 B1(zb) B0(zb) W W"};
    PipeSchedule *s = build_all(2, 8, false);
    for (int r = 0; r < 2; r++) {
        char *got = dualpipev_format(&s[r]);
        ASSERT_MSG(!strcmp(got, want[r]), "rank %d:\n got  %s\n want %s", r, got, want[r]);
        free(got);
    }
    free_all(s, 2);
    // one rank: both chunks on it, the pipeline collapses to overlapped pairs
    s = build_all(1, 3, false);
    char *got = dualpipev_format(&s[0]);
    ASSERT_MSG(!strcmp(got, "F0 F1 F0 B1 [F1|B0] [F0|B1] [F1|B0] B1 B0(zb) W"), "P=1 N=3: %s", got);
    free(got);
    free_all(s, 1);
}

TEST(pipe_schedule_every_layout) {
    for (int P = 1; P <= 4; P++) {
        int Ns[] = {2 * P, 2 * P + 1, 3 * P + 2, 4 * P, 13};
        for (size_t k = 0; k < sizeof Ns / sizeof *Ns; k++) {
            for (int fo = 0; fo < 2; fo++) {
                PipeSchedule *s = build_all(P, Ns[k], fo);
                for (int r = 0; r < P; r++) check_rank(&s[r]);
                check_pipeline(s, P);
                free_all(s, P);
            }
        }
    }
}

// The buffers the memory plan allocates, P = 2, N = 8. Rank 0's phase 0 runs F0 F0 F0 F1 B1 W F1 [F0|B1]
// before the first B0 (in the next [F1|B0]): four records. Its phase 1 defers B1's weight gradients to the
// W right after, while the next F1's receive is posted: two. Rank 1's phase-0 receives are posted one
// forward ahead (three alive when B0 of mb 0 runs), its phase 1 takes the hand-offs of three F0 before
// the first B1; it defers two backwards (B1(zb) B0(zb) W W), rank 0 one at a time.
TEST(pipe_schedule_buffer_counts) {
    PipeSchedule *s = build_all(2, 8, false);
    ASSERT(s[0].slots[PIPE_REC][0] == 4 && s[0].slots[PIPE_REC][1] == 2 && s[1].slots[PIPE_REC][0] == 3 &&
           s[1].slots[PIPE_REC][1] == 3);
    ASSERT(s[0].max_deferred == 1 && s[1].max_deferred == 2);
    // rank 0's phase 1 starts from the loss: no output gradients; the last rank's phase 1 sends none
    ASSERT(s[0].slots[PIPE_GOUT][1] == 0 && s[1].slots[PIPE_GIN][1] == 0 && s[1].slots[PIPE_GOUT][0] == 1);
    free_all(s, 2);
}

TEST(pipe_schedule_too_few_micro_batches) {
    ASSERT(dualpipev_check(2, 4, 8) == NULL && dualpipev_check(1, 2, 4) == NULL);
    const char *why = dualpipev_check(2, 3, 8);
    ASSERT_MSG(why && strstr(why, "at least 2 × 2 = 4 micro-batches") && strstr(why, "got 3"), "%s",
               why ? why : "(null)");
    ASSERT(dualpipev_check(0, 8, 8) != NULL);
    why = dualpipev_check(2, 8, 6);
    ASSERT_MSG(why && strstr(why, "2 × 2 = 4 chunks: 6 layers do not divide evenly"), "%s", why ? why : "(null)");
}

// ---- chunks of layers ----
// A model cut into chunks [0, c) and [c, L), run as a pipeline would on one rank — forward of the first
// (prolog), its output copied into the second's input, forward of the second (epilog), backward of the
// second, its input gradient copied into the first's output gradient, backward of the first — gives the
// whole model's loss, load-balancing loss and every gradient; so do three micro-batches in flight at once
// (three record slots) whose backwards defer their stage-3 weight gradients to chunk_weight calls after
// the later micro-batches' backwards.
TEST(pipe_chunks_equal_whole_model) {
    const char *json =
        "{\"model_type\": \"qwen3_moe\", \"hidden_size\": 32, \"num_hidden_layers\": 3, \"num_attention_heads\": 4,"
        " \"num_key_value_heads\": 2, \"head_dim\": 8, \"vocab_size\": 64, \"num_experts\": 8, "
        "\"num_experts_per_tok\": 3,"
        " \"moe_intermediate_size\": 16, \"intermediate_size\": 24, \"mlp_only_layers\": [1], \"norm_topk_prob\": "
        "true}";
    char path[512];
    snprintf(path, sizeof path, "%s/config.json", test_tmpdir());
    FILE *f = fopen(path, "w");
    ASSERT(f && fputs(json, f) >= 0 && fclose(f) == 0);
    int B = 2, S = 8, T = B * S;
    ModelConfig mc;
    const ModelFamily *fam = model_config_load(&mc, path);
    Model m;
    model_create(&m, fam, &mc, DEV_CPU, DT_F32, S);
    m.lb_coef = 0.01;
    model_lb_setup(&m, LB_MICRO_BATCH, NULL, T);
    for (int g = 0; g < NGROUPS; g++) params_init(&m.params, g, m.w[g].p, 7, 0.2, mc.layers);
    int32_t tok[16], lab[16];
    for (int t = 0; t < T; t++) tok[t] = (int32_t)(rng_u64(5, 1, t) % 64), lab[t] = (int32_t)(rng_u64(5, 2, t) % 64);
    // the whole model
    StepSums st;
    step_sums_create(&st, &m, true);
    Chunk e;
    chunk_init_model(&e, &m, &st, B, S);
    chunk_load(&e, 0, tok, lab);
    model_zero_grads(&m), step_sums_begin(&st, &m);
    chunk_forward(&e, 0, true), chunk_backward(&e, 0, false);
    double loss = op_read_scalar(st.loss_sum), lb = op_read_scalar(st.lb_sum);
    float *g[NGROUPS];
    for (int k = 0; k < NGROUPS; k++)
        g[k] = xmalloc(tensor_bytes(m.g[k]) + 1), memcpy(g[k], m.g[k].p, tensor_bytes(m.g[k]));
    chunk_free(&e);
    for (int cut = 1; cut < mc.layers; cut++) {
        Chunk a, b;
        chunk_init(&a, &m, &st, B, S, 0, cut, 1, 0), chunk_init(&b, &m, &st, B, S, cut, mc.layers, 1, 0);
        ChunkPlan pa = chunk_plan(&m, B, S, 0, cut, 1, 0), pw = chunk_plan(&m, B, S, 0, mc.layers, 1, 0);
        ASSERT_MSG(pa.act_bytes < pw.act_bytes, "chunk of %d layers plans %zu activation bytes, the whole model %zu",
                   cut, pa.act_bytes, pw.act_bytes);
        chunk_load(&a, 0, tok, lab), chunk_load(&b, 0, tok, lab);
        model_zero_grads(&m), step_sums_begin(&st, &m);
        chunk_forward(&a, 0, true);
        op_copy(chunk_input(&b, 0), chunk_output(&a, 0));
        chunk_forward(&b, 0, true);
        chunk_backward(&b, 0, false);
        op_copy(a.dh[0], chunk_input_grad(&b));
        chunk_backward(&a, 0, false);
        ASSERT_MSG(op_read_scalar(st.loss_sum) == loss && op_read_scalar(st.lb_sum) == lb,
                   "cut %d: loss %.9g lb %.9g vs %.9g %.9g", cut, op_read_scalar(st.loss_sum),
                   op_read_scalar(st.lb_sum), loss, lb);
        for (int k = 0; k < NGROUPS; k++) {
            double err = rel_err_f32(m.g[k].p, g[k], tensor_numel(m.g[k]));
            ASSERT_MSG(err == 0, "cut %d: gradients of group %d differ by %.3g", cut, k, err);
        }
        chunk_free(&a), chunk_free(&b);
    }
    // A pipeline rank's two chunks (chunk_init_rank): one workspace, the size of the larger backward, and the
    // records reading and writing the caller's buffers in place (the cut's activation x and its gradient dx),
    // so they hold two (T, H) fewer (one under full recompute, whose replay rewrites the output); the same bits.
    size_t th = ((size_t)T * mc.hidden * sizeof(float) + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN;
    Tensor x = tensor_make(xcalloc((size_t)T * mc.hidden, sizeof(float)), DT_F32, DEV_CPU, 2, T, mc.hidden, 1, 1),
           dx = tensor_make(xcalloc((size_t)T * mc.hidden, sizeof(float)), DT_F32, DEV_CPU, 2, T, mc.hidden, 1, 1);
    for (int full = 0; full < 2; full++)
        for (int cut = 1; cut < mc.layers; cut++) {
            m.recompute = full ? RECOMPUTE_FULL : RECOMPUTE_NONE;
            ChunkShape sh[2] = {{0, cut, 1, 0}, {cut, mc.layers, 1, 0}};
            ChunkPlan pr = chunk_plan_rank(&m, B, S, sh), pa = chunk_plan(&m, B, S, 0, cut, 1, 0),
                      pb = chunk_plan(&m, B, S, cut, mc.layers, 1, 0);
            ASSERT_MSG(pr.ws_bytes == (pa.ws_bytes > pb.ws_bytes ? pa.ws_bytes : pb.ws_bytes) &&
                           pr.act_bytes == pa.act_bytes + pb.act_bytes - (full ? 1 : 2) * th &&
                           pr.comm_bytes == pa.comm_bytes + pb.comm_bytes,
                       "cut %d full %d: rank plan ws %zu act %zu, chunks ws %zu %zu act %zu %zu", cut, full,
                       pr.ws_bytes, pr.act_bytes, pa.ws_bytes, pb.ws_bytes, pa.act_bytes, pb.act_bytes);
            Chunk c[2];
            chunk_init_rank(c, &m, &st, B, S, sh);
            ASSERT(c[1].ws == c[0].ws && c[0].ws->cap == pr.ws_bytes && !chunk_input(&c[1], 0).p);
            chunk_load(&c[0], 0, tok, lab), chunk_load(&c[1], 0, tok, lab);
            model_zero_grads(&m), step_sums_begin(&st, &m);
            chunk_pipe_forward(&c[0], 0, (Tensor){0}, x, true), chunk_pipe_forward(&c[1], 0, x, (Tensor){0}, true);
            chunk_pipe_backward(&c[1], 0, (Tensor){0}, dx, false),
                chunk_pipe_backward(&c[0], 0, dx, (Tensor){0}, false);
            ASSERT_MSG(op_read_scalar(st.loss_sum) == loss && op_read_scalar(st.lb_sum) == lb, "rank chunks, cut %d",
                       cut);
            for (int k = 0; k < NGROUPS; k++)
                ASSERT_MSG(!memcmp(m.g[k].p, g[k], tensor_bytes(m.g[k])), "rank chunks, cut %d full %d: group %d", cut,
                           full, k);
            chunk_free(&c[1]), chunk_free(&c[0]);
        }
    m.recompute = RECOMPUTE_NONE;
    free(x.p), free(dx.p);
    // Three copies of the micro-batch in flight through the whole model: forwards into slots 0, 1, 2;
    // backward of slot 0 deferring, of slot 1 deferring, of slot 2 at once, then the two deferred weight
    // halves in order. The sums are three times the one micro-batch's (up to fp32 summation order).
    Chunk fl;
    chunk_init(&fl, &m, &st, B, S, 0, mc.layers, 3, 2);
    ChunkPlan p3 = chunk_plan(&m, B, S, 0, mc.layers, 3, 2), p1 = chunk_plan(&m, B, S, 0, mc.layers, 1, 0);
    ASSERT_MSG(p3.act_bytes > 3 * (p1.act_bytes - ARENA_ALIGN) && p3.ws_bytes == p1.ws_bytes, "%zu vs %zu, %zu vs %zu",
               p3.act_bytes, p1.act_bytes, p3.ws_bytes, p1.ws_bytes);
    model_zero_grads(&m), step_sums_begin(&st, &m);
    // (model_zero_grads leaves the expert gradients as the last step wrote them: the first weight gradient writes)
    float *stale = xmalloc(tensor_bytes(m.g[GROUP_EXPERT]) + 1), *before = xmalloc(tensor_bytes(m.g[GROUP_EXPERT]) + 1);
    memcpy(stale, m.g[GROUP_EXPERT].p, tensor_bytes(m.g[GROUP_EXPERT]));
    for (int i = 0; i < 3; i++) chunk_load(&fl, i, tok, lab), chunk_forward(&fl, i, true);
    chunk_backward(&fl, 0, true), chunk_backward(&fl, 1, true);
    memcpy(before, m.g[GROUP_EXPERT].p, tensor_bytes(m.g[GROUP_EXPERT]));
    chunk_backward(&fl, 2, false);
    chunk_weight(&fl, 0), chunk_weight(&fl, 1);
    ASSERT_NEAR(op_read_scalar(st.loss_sum), 3 * loss, 1e-9 * loss);
    ASSERT_NEAR(op_read_scalar(st.lb_sum), 3 * lb, 1e-9 * lb);
    for (int k = 0; k < NGROUPS; k++) {
        float *x = m.g[k].p;
        for (int64_t i = 0; i < tensor_numel(m.g[k]); i++) x[i] /= 3;
        double err = rel_err_f32(x, g[k], tensor_numel(m.g[k]));
        ASSERT_MSG(err <= 1e-6, "three micro-batches, two deferred: gradients of group %d differ by %.3g", k, err);
    }
    // the deferring backwards left the expert gradients untouched (only stage 3 writes them)
    ASSERT_MSG(!memcmp(before, stale, tensor_bytes(m.g[GROUP_EXPERT])), "deferring backwards wrote expert gradients");
    free(before), free(stale);
    chunk_free(&fl);
    for (int k = 0; k < NGROUPS; k++) free(g[k]);
    step_sums_free(&st), model_free(&m);
}

// The bubble a step reports (pipe_busy_s, bubble in metrics.jsonl; dualpipev_run times each compute) on
// bench/pp_tiny (8 layers, 16 micro-batches; one step) at pp1, pp2 and pp4: present, busy > 0, bubble in [0, 1).
// Its size is a timing, so it is printed, not asserted; bench/run_pp_cpu.sh measures it beside the step time.
static void pipe_bubble(const char *d, int pp) {
    char out[16384], dir[600];
    snprintf(dir, sizeof dir, "%s/pp%d", d, pp);
    int rc = run_cmd(out, sizeof out,
                     MPIRUN " %d %s train %s/train.json --set max_steps=1 --set run_dir=%s --set "
                            "parallel.pipeline_parallel_size=%d --set parallel.pipeline_schedule=true",
                     pp, PITH_BIN, d, dir, pp);
    ASSERT_MSG(rc == 0 && strstr(out, "| bubble "), "pp%d: %s", pp, out);
    double busy = run_metric(dir, 1, "pipe_busy_s"), bubble = run_metric(dir, 1, "bubble");
    ASSERT_MSG(busy > 0 && bubble >= 0 && bubble < 1, "pp%d: busy %g s, bubble %g", pp, busy, bubble);
    printf("     pp%d: bubble %.3f, busy %.3f s\n", pp, bubble, busy);
}

TEST(pipe_bubble_measured) {
    const char *d = test_tmpdir();
    char out[4096];
    ASSERT(run_cmd(out, sizeof out,
                   "cp bench/pp_tiny/model.json bench/pp_tiny/train.json %s/ && %s synth --output %s/data.bin --vocab "
                   "256 --tokens 200000 >/dev/null",
                   d, PITH_BIN, d) == 0);
    pipe_bubble(d, 1), pipe_bubble(d, 2), pipe_bubble(d, 4);
}

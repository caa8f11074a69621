// ring.c — build/test_parallel ring[-gpu]: zigzag ring attention (parallel/ring.h) over the world as the cp
// group, against one-rank attention over the whole sequences that every rank computes alone (fp32, CPU).
// Each rank holds chunks r and 2·cp − 1 − r of every sequence; its forward output, log-sum-exp and the
// gradients of q, k and v must be the reference's rows of those chunks (≤ 1e-5 relative). GQA (4 query heads on
// 2 kv heads), B = 2 sequences, blocks of 3 and 4 rows. A control feeds rank r the shard of rank r + 1 (and the
// front and back chunks swapped on one rank): the result must then be far from the reference.
// Multi-head latent attention (the latent travels, each hop makes K and V with kv_b_proj): o, lse, dq, the
// latent's gradients (dc, dk_pe) of this rank's rows and kv_b_proj's weight gradient summed over the ranks against
// one rank's decompression and attention over the whole sequences.
// Gated DeltaNet's pieces (Qwen3.5): the zigzag ↔ contiguous layout, the conv with the previous rank's halo and the
// delta rule with the state passed along the ranks, forward and backward, against one rank; controls without the
// halo or without the state must be far off.
// Document masking: both forms again with documents of 1 to 7 tokens (AttnArgs.docpos: the reference's whole rows,
// the ring's this rank's), whose edges fall inside and on the chunks' edges.
// On -gpu every tensor the ring sees is device memory (fake GPUs in make test: NCCL over MPI, stream order
// checked against the transfers in flight).
#include <math.h>

#include "parallel/mesh.h"
#include "model/model.h"
#include "parallel/ring.h"

void suite_ring(const Dist *d, bool gpu);

static double rel(Tensor a, Tensor b) { // ‖a − b‖/‖b‖ of two host fp32 tensors
    double num = 0, den = 0;
    int64_t n = tensor_numel(b);
    CHECK(tensor_numel(a) == n);
    for (int64_t i = 0; i < n; i++) {
        double x = ((float *)a.p)[i], y = ((float *)b.p)[i];
        num += (x - y) * (x - y), den += y * y;
    }
    return isnan(num) ? INFINITY : sqrt(num / (den > 0 ? den : 1));
}

static Tensor hostt(int64_t n0, int64_t n1, int64_t n2) {
    return tensor_make(xcalloc(n0 * n1 * n2 + 1, sizeof(float)), DT_F32, DEV_CPU, 3, n0, n1, n2, 1);
}

// Rows of the chunks rank r holds, in its local order, from a whole-sequence tensor (B·S rows).
static void take_rows(Tensor local, Tensor whole, int B, int cp, int blk, int r, bool swap) {
    int S = 2 * cp * blk;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < 2; h++) {
            int chunk = (h ^ swap) == 0 ? r : 2 * cp - 1 - r;
            op_copy(tensor_rows(local, ((int64_t)2 * b + h) * blk, blk),
                    tensor_rows(whole, (int64_t)b * S + (int64_t)chunk * blk, blk));
        }
}

// lse (B, nh, S) → this rank's (B, nh, 2·blk).
static void take_lse(Tensor local, Tensor whole, int B, int cp, int blk, int r) {
    int64_t nh = whole.n[1], S = 2 * (int64_t)cp * blk;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < 2; h++) {
            int chunk = h == 0 ? r : 2 * cp - 1 - r;
            for (int64_t x = 0; x < nh; x++)
                memcpy((float *)local.p + ((int64_t)b * nh + x) * 2 * blk + h * blk,
                       (float *)whole.p + ((int64_t)b * nh + x) * S + (int64_t)chunk * blk, blk * sizeof(float));
        }
}

// With docs, (B·S) int32 positions inside documents of 1 to 7 tokens (lengths cycling from a per-sequence start),
// else a tensor with p NULL.
static Tensor doc_positions(bool docs, int B, int S) {
    if (!docs) return (Tensor){0};
    static const int len[5] = {5, 1, 3, 7, 2};
    Tensor t = tensor_make(xmalloc((size_t)B * S * sizeof(int32_t)), DT_I32, DEV_CPU, 1, (int64_t)B * S, 1, 1, 1);
    for (int b = 0; b < B; b++)
        for (int i = 0, d = b, at = 0; i < S; i++, at++) {
            if (at == len[d % 5]) at = 0, d++;
            ((int32_t *)t.p)[b * S + i] = at;
        }
    return t;
}

// This rank's rows of whole-sequence document positions (p NULL: none), on dev.
static Tensor take_docpos(Device dev, Tensor whole, int B, int cp, int blk, int r, Arena *a) {
    if (!whole.p) return whole;
    Tensor local =
        tensor_make(xmalloc((size_t)B * 2 * blk * sizeof(int32_t)), DT_I32, DEV_CPU, 1, (int64_t)B * 2 * blk, 1, 1, 1);
    take_rows(local, whole, B, cp, blk, r, false);
    if (dev == DEV_CPU) return local;
    Tensor t = arena_tensor(a, DT_I32, 1, local.n[0], 0, 0, 0);
    op_copy(t, local), free(local.p);
    return t;
}

static Tensor on(Device dev, Tensor h, Arena *a) {
    if (dev == DEV_CPU) return h;
    Tensor t = arena_tensor(a, h.dt, h.nd, h.n[0], h.n[1], h.n[2], 0);
    op_copy(t, h);
    return t;
}

// One case: errors of (o, lse, dq, dk, dv) on this rank; shard: 0 = the right one, 1 = rank r + 1's, 2 = the
// halves swapped (rank 0 only); docs: document masking.
static void ring_case(const Comm *c, Device dev, int B, int blk, int shard, bool docs, double err[5]) {
    int cp = c->size, r = c->rank, S = 2 * cp * blk, nh = 4, nkv = 2, dqk = 8, dv = 6;
    int64_t T = (int64_t)B * S, Tl = (int64_t)B * 2 * blk;
    Tensor q = hostt(T, nh, dqk), k = hostt(T, nkv, dqk), v = hostt(T, nkv, dv), dout = hostt(T, nh, dv);
    Tensor *all[] = {&q, &k, &v, &dout};
    for (int i = 0; i < 4; i++) // the same values on every rank
        for (int64_t j = 0; j < tensor_numel(*all[i]); j++)
            ((float *)all[i]->p)[j] = (float)rng_normal(77 + (uint64_t)blk, (uint64_t)i, (uint64_t)j);
    Tensor o = hostt(T, nh, dv), lse = hostt(B, nh, S), dq = hostt(T, nh, dqk), dk = hostt(T, nkv, dqk),
           dvv = hostt(T, nkv, dv);
    AttnArgs a = {.B = B, .scale = 0.35f, .causal = true, .docpos = doc_positions(docs, B, S)};
    op_attention_forward(o, lse, q, k, v, &a);
    op_attention_backward(dq, dk, dvv, (Tensor){0}, dout, q, k, v, o, lse, &a);
    // this rank's shard of the inputs, and the reference's rows of its chunks
    int from = shard == 1 ? (r + 1) % cp : r;
    bool swap = shard == 2 && r == 0;
    Tensor lq = hostt(Tl, nh, dqk), lk = hostt(Tl, nkv, dqk), lv = hostt(Tl, nkv, dv), ld = hostt(Tl, nh, dv);
    take_rows(lq, q, B, cp, blk, from, swap), take_rows(lk, k, B, cp, blk, from, swap);
    take_rows(lv, v, B, cp, blk, from, swap), take_rows(ld, dout, B, cp, blk, from, swap);
    Tensor ro = hostt(Tl, nh, dv), rl = hostt(B, nh, 2 * blk), rdq = hostt(Tl, nh, dqk), rdk = hostt(Tl, nkv, dqk),
           rdv = hostt(Tl, nkv, dv);
    take_rows(ro, o, B, cp, blk, r, false), take_lse(rl, lse, B, cp, blk, r);
    take_rows(rdq, dq, B, cp, blk, r, false), take_rows(rdk, dk, B, cp, blk, r, false);
    take_rows(rdv, dvv, B, cp, blk, r, false);
    // the ring, on dev
    Arena mem = arena_create("ring test", dev, (size_t)16 << 20);
    Ring ring;
    ring_init(&ring, c, dev, ring_bytes(dev, DT_F32, B, blk, nh, nkv, dqk, dv, 0, 0));
    Tensor gq = on(dev, lq, &mem), gk = on(dev, lk, &mem), gv = on(dev, lv, &mem), gd = on(dev, ld, &mem);
    Tensor go = on(dev, hostt(Tl, nh, dv), &mem), gl = on(dev, hostt(B, nh, 2 * blk), &mem),
           gdq = on(dev, hostt(Tl, nh, dqk), &mem), gdk = on(dev, hostt(Tl, nkv, dqk), &mem),
           gdv = on(dev, hostt(Tl, nkv, dv), &mem);
    Tensor whole = a.docpos;
    a.docpos = take_docpos(dev, whole, B, cp, blk, r, &mem);
    ring_attention_forward(&ring, go, gl, gq, gk, gv, &a);
    ring_attention_backward(&ring, gdq, gdk, gdv, gd, gq, gk, gv, go, gl, &a);
    if (dev == DEV_CPU) free(a.docpos.p);
    free(whole.p);
    Tensor got[5] = {hostt(Tl, nh, dv), hostt(B, nh, 2 * blk), hostt(Tl, nh, dqk), hostt(Tl, nkv, dqk),
                     hostt(Tl, nkv, dv)},
           dev_t[5] = {go, gl, gdq, gdk, gdv}, want[5] = {ro, rl, rdq, rdk, rdv};
    for (int i = 0; i < 5; i++) op_copy(got[i], dev_t[i]), err[i] = rel(got[i], want[i]);
    ring_free(&ring);
    arena_destroy(&mem);
    Tensor frees[] = {q,  k,  v,  dout, o,   lse, dq,     dk,     dvv,    lq,     lk,    lv,
                      ld, ro, rl, rdq,  rdk, rdv, got[0], got[1], got[2], got[3], got[4]};
    for (size_t i = 0; i < sizeof frees / sizeof *frees; i++) free(frees[i].p);
}

// MLA: nh heads, dn = 8 nope + dr = 4 rope dims of q·k, dv = 6, latent dc = 10; k_pe in columns [dc, dc + dr) of
// a kva-like (T, dc + dr) tensor as DeepSeek-V2 keeps it. err: o, lse, dq, dc, dk_pe, dW.
static void ring_mla_case(const Comm *c, Device dev, int B, int blk, bool docs, double err[6]) {
    int cp = c->size, r = c->rank, S = 2 * cp * blk, nh = 4, dn = 8, dr = 4, dv = 6, dc = 10, dq = dn + dr;
    int64_t T = (int64_t)B * S, Tl = (int64_t)B * 2 * blk;
    Tensor q = hostt(T, nh, dq), cl = hostt(T, dc, 1), kva = hostt(T, dc + dr, 1), w = hostt(nh * (dn + dv), dc, 1),
           dout = hostt(T, nh, dv);
    cl.nd = kva.nd = w.nd = 2;
    Tensor *all[] = {&q, &cl, &kva, &w, &dout};
    for (int i = 0; i < 5; i++)
        for (int64_t j = 0; j < tensor_numel(*all[i]); j++)
            ((float *)all[i]->p)[j] =
                (float)rng_normal(91 + (uint64_t)blk, (uint64_t)i, (uint64_t)j) * (i == 3 ? 0.3f : 1);
    // the reference: decompress and attend over the whole sequences on this rank
    Tensor kv = hostt(T, nh, dn + dv), k = hostt(T, nh, dq), v = hostt(T, nh, dv), o = hostt(T, nh, dv),
           lse = hostt(B, nh, S), dqr = hostt(T, nh, dq), dk = hostt(T, nh, dq), dvv = hostt(T, nh, dv),
           dkv = hostt(T, nh, dn + dv), dcr = hostt(T, dc, 1), dkva = hostt(T, dc + dr, 1),
           dw = hostt(nh * (dn + dv), dc, 1);
    dcr.nd = dkva.nd = dw.nd = 2;
    MlaLatent ml = {
        .r = {.c = cl, .pe = kva, .pe_col = dc, .nh = nh, .dn = dn, .dr = dr, .dv = dv}, .wkvb = w, .dwkvb = dw};
    AttnArgs a = {.B = B, .scale = 0.3f, .causal = true, .docpos = doc_positions(docs, B, S)};
    model_mla_decompress(&ml, cl, kva, dc, kv, k, v);
    op_attention_forward(o, lse, q, k, v, &a);
    op_attention_backward(dqr, dk, dvv, (Tensor){0}, dout, q, k, v, o, lse, &a);
    model_mla_decompress_backward(&ml, cl, dcr, dkva, dc, dkv, dk, dvv);
    // this rank's shard, on dev, and the ring
    Tensor lq = hostt(Tl, nh, dq), lc = hostt(Tl, dc, 1), lkva = hostt(Tl, dc + dr, 1), ld = hostt(Tl, nh, dv);
    lc.nd = lkva.nd = 2;
    take_rows(lq, q, B, cp, blk, r, false), take_rows(lc, cl, B, cp, blk, r, false);
    take_rows(lkva, kva, B, cp, blk, r, false), take_rows(ld, dout, B, cp, blk, r, false);
    Arena mem = arena_create("ring test", dev, (size_t)16 << 20);
    Ring ring;
    ring_init(&ring, c, dev, ring_bytes(dev, DT_F32, B, blk, nh, nh, dq, dv, dc, dn));
    Tensor zero_w = hostt(nh * (dn + dv), dc, 1);
    zero_w.nd = 2;
    MlaLatent gl0 = {.r = {.c = on(dev, lc, &mem),
                           .pe = on(dev, lkva, &mem),
                           .pe_col = dc,
                           .nh = nh,
                           .dn = dn,
                           .dr = dr,
                           .dv = dv},
                     .wkvb = on(dev, w, &mem),
                     .dwkvb = on(dev, zero_w, &mem)},
              gl = model_mla_hooked(&gl0);
    Tensor gq = on(dev, lq, &mem), gd = on(dev, ld, &mem), go = on(dev, hostt(Tl, nh, dv), &mem),
           gls = on(dev, hostt(B, nh, 2 * blk), &mem), gdq = on(dev, hostt(Tl, nh, dq), &mem), gdc = on(dev, lc, &mem),
           gdkva = on(dev, hostt(Tl, dc + dr, 1), &mem);
    gdkva.nd = 2;
    Tensor whole = a.docpos;
    a.docpos = take_docpos(dev, whole, B, cp, blk, r, &mem);
    ring_mla_forward(&ring, go, gls, gq, &gl.r, &a);
    ring_mla_backward(&ring, gdq, gdc, gdkva, gd, gq, go, gls, &gl.r, &a);
    if (dev == DEV_CPU) free(a.docpos.p);
    free(whole.p);
    // the references' rows of this rank; dW summed over the ranks
    Tensor ro = hostt(Tl, nh, dv), rl = hostt(B, nh, 2 * blk), rdq = hostt(Tl, nh, dq), rdc = hostt(Tl, dc, 1),
           rdkva = hostt(Tl, dc + dr, 1);
    rdc.nd = rdkva.nd = 2;
    take_rows(ro, o, B, cp, blk, r, false), take_lse(rl, lse, B, cp, blk, r), take_rows(rdq, dqr, B, cp, blk, r, false);
    take_rows(rdc, dcr, B, cp, blk, r, false), take_rows(rdkva, dkva, B, cp, blk, r, false);
    Tensor got[5] = {hostt(Tl, nh, dv), hostt(B, nh, 2 * blk), hostt(Tl, nh, dq), hostt(Tl, dc, 1),
                     hostt(Tl, dc + dr, 1)},
           dev_t[5] = {go, gls, gdq, gdc, gdkva}, want[5] = {ro, rl, rdq, rdc, rdkva};
    got[3].nd = got[4].nd = 2;
    for (int i = 0; i < 5; i++) op_copy(got[i], dev_t[i]);
    for (int i = 0; i < 4; i++) err[i] = rel(got[i], want[i]);
    // k_pe's gradient: the columns [dc, dc + dr) of dkva (the ring leaves the other columns alone)
    Tensor gp = hostt(Tl, dr, 1), wp = hostt(Tl, dr, 1);
    gp.nd = wp.nd = 2;
    op_copy_cols(gp, 0, got[4], dc, dr, false), op_copy_cols(wp, 0, want[4], dc, dr, false);
    err[4] = rel(gp, wp);
    op_copy(zero_w, gl.dwkvb);
    comm_allreduce(c, zero_w, COMM_SUM);
    err[5] = rel(zero_w, dw);
    ring_free(&ring);
    arena_destroy(&mem);
    Tensor frees[] = {q,   cl,  kva,   w,      dout,   kv,     k,      v,      o,  lse,    dqr, dk,
                      dvv, dkv, dcr,   dkva,   dw,     lq,     lc,     lkva,   ld, zero_w, ro,  rl,
                      rdq, rdc, rdkva, got[0], got[1], got[2], got[3], got[4], gp, wp};
    for (size_t i = 0; i < sizeof frees / sizeof *frees; i++) free(frees[i].p);
}

// Rows of the chunks rank r holds on the contiguous layout (chunks 2r and 2r + 1), from a whole-sequence tensor.
static void take_contiguous(Tensor local, Tensor whole, int B, int cp, int blk, int r) {
    int64_t S = 2 * (int64_t)cp * blk;
    for (int b = 0; b < B; b++)
        op_copy(tensor_rows(local, (int64_t)b * 2 * blk, 2 * blk),
                tensor_rows(whole, b * S + 2 * (int64_t)r * blk, 2 * blk));
}

static void fill(Tensor t, uint64_t seed, float scale) {
    for (int64_t j = 0; j < tensor_numel(t); j++) ((float *)t.p)[j] = (float)rng_normal(seed, 0, (uint64_t)j) * scale;
}
static Tensor host2(int64_t n0, int64_t n1) {
    Tensor t = hostt(n0, n1, 1);
    t.nd = 2;
    return t;
}
static Tensor back(Tensor d, Tensor like) { // a device tensor's values in a new host tensor shaped like `like`
    Tensor h = hostt(like.n[0], like.n[1], like.nd > 2 ? like.n[2] : 1);
    h.nd = like.nd;
    op_copy(h, d);
    return h;
}

// Gated DeltaNet's pieces under context parallelism (model.h): the zigzag rows of every rank to the contiguous layout
// and back, the causal conv with the previous rank's halo and its backward (dx with the next rank's halo gradient,
// dw summed over the ranks), and the delta rule with the state passed along the ranks, forward and backward, against
// one rank over the whole sequences (C conv channels of kernel K; nk key heads of dk, nv value heads of dv; chunk 4
// over 2·blk local rows). plant: 0 = as the model runs it, 1 = no halo (every rank's conv starts from zeros), 2 = no
// state (every rank's delta rule from zeros), 3 = docs without the ranks' positions. docs: document masking, documents
// of 1 to 5 rows whose edges fall inside and on the ranks' edges; each rank's positions come from its zigzag rows
// through ring_to_contiguous as fp32 words, as Qwen3.5's layer moves them. err: layout, conv y, dx, dw, delta o, dq,
// dk, dv, dg, dbeta.
static void linear_case(const Comm *c, Device dev, int B, int blk, int plant, bool docs, double err[10]) {
    int cp = c->size, r = c->rank, S = 2 * cp * blk, C = 5, K = 4, nk = 1, nv = 2, dk = 4, dv = 3;
    int64_t T = (int64_t)B * S, Tl = (int64_t)B * 2 * blk;
    Tensor x = host2(T, C), w = host2(C, K), dy = host2(T, C), q = hostt(T, nk, dk), k = hostt(T, nk, dk),
           v = hostt(T, nv, dv), g = host2(T, nv), be = host2(T, nv), dout = hostt(T, nv, dv);
    Tensor ins[] = {x, w, dy, q, k, v, g, be, dout};
    for (int i = 0; i < 9; i++) fill(ins[i], 300 + (uint64_t)i + 10 * (uint64_t)blk, i == 1 ? 0.6f : 1);
    for (int64_t j = 0; j < T * nv; j++) // decays in (−0.5, 0), β in (0, 1)
        ((float *)g.p)[j] = -0.25f * (1 + tanhf(((float *)g.p)[j])),
                ((float *)be.p)[j] = 0.5f * (1 + tanhf(((float *)be.p)[j]));
    // the reference over the whole sequences
    Tensor y = host2(T, C), dx = host2(T, C), dw = host2(C, K), o = hostt(T, nv, dv), dq = hostt(T, nk, dk),
           dkk = hostt(T, nk, dk), dvv = hostt(T, nv, dv), dg = host2(T, nv), dbe = host2(T, nv);
    Tensor pos = {0};
    if (docs) {
        static const int len[5] = {3, 1, 5, 2, 4};
        pos = tensor_make(xmalloc((size_t)T * sizeof(int32_t)), DT_I32, DEV_CPU, 1, T, 1, 1, 1);
        for (int b = 0; b < B; b++)
            for (int i = 0, d = b, at = 0; i < S; i++, at++) {
                if (at == len[d % 5]) at = 0, d++;
                ((int32_t *)pos.p)[b * S + i] = at;
            }
    }
    DeltaArgs da = {.B = B, .scale = 0.5f, .qk_l2norm = true, .chunk = 4, .pos = pos};
    op_conv1d_silu_forward(y, x, w, (Tensor){0}, pos, B, 0);
    op_conv1d_silu_backward(dx, (Tensor){0}, dw, dy, x, w, (Tensor){0}, pos, B, 0);
    op_delta_rule_forward(o, q, k, v, g, be, &da);
    op_delta_rule_backward(dq, dkk, dvv, dg, dbe, dout, q, k, v, g, be, &da);
    // this rank: the zigzag rows of x to the contiguous layout, the rest of the inputs there already
    Arena mem = arena_create("ring test", dev, (size_t)16 << 20);
    Ring ring;
    ring_init(&ring, c, dev, ring_linear_bytes(dev, DT_F32, B, 2 * blk, C, C, K, (int64_t)nv * dk * dv));
    static Model m;
    memset(&m, 0, sizeof m);
    m.ring = &ring;
    Tensor lx = host2(Tl, C), want = host2(Tl, C);
    take_rows(lx, x, B, cp, blk, r, false), take_contiguous(want, x, B, cp, blk, r);
    Tensor gx = on(dev, lx, &mem), gxc = on(dev, host2(Tl, C), &mem), gzz = on(dev, host2(Tl, C), &mem);
    ring_to_contiguous(&ring, gxc, gx, B);
    ring_to_zigzag(&ring, gzz, gxc, B);
    Tensor hc = back(gxc, want), hz = back(gzz, lx);
    err[0] = fmax(rel(hc, want), rel(hz, lx));
    Tensor lpos = {0}, zpos = {0};
    if (docs && plant != 3) { // this rank's zigzag rows of pos, to the contiguous layout as fp32 words
        zpos = tensor_make(xmalloc((size_t)Tl * sizeof(int32_t)), DT_I32, DEV_CPU, 1, Tl, 1, 1, 1);
        take_rows(zpos, pos, B, cp, blk, r, false);
        Tensor gz = on(dev, zpos, &mem), gl = arena_tensor(&mem, DT_I32, 1, Tl, 0, 0, 0);
        lpos = gl, gz.dt = gl.dt = DT_F32;
        ring_to_contiguous(&ring, tensor_reshape2(gl, Tl, 1), tensor_reshape2(gz, Tl, 1), B);
        Tensor want_pos = tensor_make(xmalloc((size_t)Tl * sizeof(int32_t)), DT_I32, DEV_CPU, 1, Tl, 1, 1, 1),
               got_pos = want_pos;
        got_pos.p = xmalloc((size_t)Tl * sizeof(int32_t));
        take_contiguous(want_pos, pos, B, cp, blk, r), op_copy(got_pos, lpos);
        if (memcmp(want_pos.p, got_pos.p, (size_t)Tl * sizeof(int32_t))) err[0] = INFINITY;
        free(want_pos.p), free(got_pos.p);
    }
    // the conv on the contiguous rows
    Tensor halo = on(dev, host2((int64_t)B * (K - 1), C), &mem), gw = on(dev, w, &mem),
           gy = on(dev, host2(Tl, C), &mem), ldy = host2(Tl, C), gdx = on(dev, host2(Tl, C), &mem), zw = host2(C, K),
           gdw = on(dev, zw, &mem);
    take_contiguous(ldy, dy, B, cp, blk, r);
    Tensor gdy = on(dev, ldy, &mem);
    if (plant == 1) op_conv1d_silu_forward(gy, gxc, gw, (Tensor){0}, lpos, B, 0);
    else model_conv1d_silu_forward(&m, gy, gxc, gw, halo, lpos, B, 0);
    if (plant == 1) op_conv1d_silu_backward(gdx, (Tensor){0}, gdw, gdy, gxc, gw, (Tensor){0}, lpos, B, 0);
    else model_conv1d_silu_backward(&m, gdx, gdw, gdy, gxc, gw, halo, lpos, B, 0);
    Tensor ry = host2(Tl, C), rdx = host2(Tl, C);
    take_contiguous(ry, y, B, cp, blk, r), take_contiguous(rdx, dx, B, cp, blk, r);
    Tensor hy = back(gy, ry), hdx = back(gdx, rdx), hdw = back(gdw, dw);
    comm_allreduce(c, hdw, COMM_SUM);
    err[1] = rel(hy, ry), err[2] = rel(hdx, rdx), err[3] = rel(hdw, dw);
    // the delta rule with the state passed along
    Tensor lin[6] = {hostt(Tl, nk, dk), hostt(Tl, nk, dk), hostt(Tl, nv, dv),
                     host2(Tl, nv),     host2(Tl, nv),     hostt(Tl, nv, dv)},
           whole[6] = {q, k, v, g, be, dout}, gin[6];
    for (int i = 0; i < 6; i++) take_contiguous(lin[i], whole[i], B, cp, blk, r), gin[i] = on(dev, lin[i], &mem);
    Tensor s0 = arena_tensor(&mem, DT_F32, 4, B, nv, dk, dv), go = on(dev, hostt(Tl, nv, dv), &mem),
           gq = on(dev, hostt(Tl, nk, dk), &mem), gk = on(dev, hostt(Tl, nk, dk), &mem),
           gvv = on(dev, hostt(Tl, nv, dv), &mem), gg = on(dev, host2(Tl, nv), &mem), gb = on(dev, host2(Tl, nv), &mem);
    da.pos = lpos;
    if (plant == 2) {
        op_delta_rule_forward(go, gin[0], gin[1], gin[2], gin[3], gin[4], &da);
        op_delta_rule_backward(gq, gk, gvv, gg, gb, gin[5], gin[0], gin[1], gin[2], gin[3], gin[4], &da);
    } else {
        model_delta_rule_forward(&m, go, gin[0], gin[1], gin[2], gin[3], gin[4], da, s0);
        model_delta_rule_backward(&m, gq, gk, gvv, gg, gb, gin[5], gin[0], gin[1], gin[2], gin[3], gin[4], da, s0);
    }
    Tensor refs[6] = {o, dq, dkk, dvv, dg, dbe}, gots[6] = {go, gq, gk, gvv, gg, gb};
    for (int i = 0; i < 6; i++) {
        Tensor rr = refs[i].nd == 3 ? hostt(Tl, refs[i].n[1], refs[i].n[2]) : host2(Tl, refs[i].n[1]);
        take_contiguous(rr, refs[i], B, cp, blk, r);
        Tensor hg = back(gots[i], rr);
        err[4 + i] = rel(hg, rr);
        free(rr.p), free(hg.p);
    }
    ring_free(&ring);
    arena_destroy(&mem);
    if (pos.p) free(pos.p);
    if (zpos.p) free(zpos.p);
    Tensor frees[] = {x,  w,   dy,  q,   k,   v,      g,      be,     dout,   y,      dx,    dw,
                      o,  dq,  dkk, dvv, dg,  dbe,    lx,     want,   hc,     hz,     ldy,   zw,
                      ry, rdx, hy,  hdx, hdw, lin[0], lin[1], lin[2], lin[3], lin[4], lin[5]};
    for (size_t i = 0; i < sizeof frees / sizeof *frees; i++) free(frees[i].p);
}

// Every error of one case (names[i]: err[i]) within 1e-5 on every rank; rank 0 prints the worst.
static void expect_small(const Comm *c, const char *what, int blk, const double *err, const char *const *names, int n) {
    double worst = 0;
    for (int i = 0; i < n; i++) {
        if (err[i] > 1e-5)
            die("%s: cp %d, blk %d: %s differs from one rank by %.3g", what, c->size, blk, names[i], err[i]);
        worst = err[i] > worst ? err[i] : worst;
    }
    comm_allreduce(c, tensor_make(&worst, DT_F64, DEV_CPU, 1, 1, 1, 1, 1), COMM_MAX);
    if (c->rank == 0) printf("%s: cp %d, B 2, blk %d: worst relative error %.3g\n", what, c->size, blk, worst);
}

void suite_ring(const Dist *d, bool gpu) {
    const Comm *c = &d->world;
    if (c->size < 2) return;
    Device dev = gpu ? DEV_CUDA : DEV_CPU;
    static const char *const name[5] = {"o", "lse", "dq", "dk", "dv"},
                             *mname[6] = {"o", "lse", "dq", "dc", "dk_pe", "dW (kv_b_proj)"},
                             *lname[10] = {"layout",   "conv y", "conv dx", "conv dw", "delta o",
                                           "delta dq", "dk",     "dv",      "dg",      "dbeta"};
    for (int blk = 3; blk <= 4; blk++) {
        double err[10];
        for (int docs = 0; docs < 2; docs++) {
            ring_case(c, dev, 2, blk, 0, docs, err);
            expect_small(c, docs ? "ring (document masking)" : "ring", blk, err, name, 5);
            ring_mla_case(c, dev, 2, blk, docs, err);
            expect_small(c, docs ? "ring (MLA latent, document masking)" : "ring (MLA latent)", blk, err, mname, 6);
        }
        linear_case(c, dev, 2, blk - 1, 0, false, err);
        expect_small(c, "ring (DeltaNet: layout, conv halo, state)", blk - 1, err, lname, 10);
        linear_case(c, dev, 2, blk - 1, 0, true, err);
        expect_small(c, "ring (DeltaNet, document masking)", blk - 1, err, lname, 10);
    }
    for (int plant = 1; plant <= 3; plant++) { // controls: without the halo, the state or the positions it must show
        static const char *const what[4] = {"", "halo", "state", "document positions"};
        double err[10];
        linear_case(c, dev, 2, 2, plant, plant == 3, err);
        double worst = plant == 1 ? fmax(err[1], err[2]) : plant == 2 ? fmax(err[4], err[5]) : fmax(err[1], err[4]);
        comm_allreduce(c, tensor_make(&worst, DT_F64, DEV_CPU, 1, 1, 1, 1, 1), COMM_MAX);
        if (!(worst > 1e-2)) die("ring: the control (no %s) went unnoticed: %.3g", what[plant], worst);
        if (c->rank == 0) printf("ring: control no %s: error %.3g (must be large)\n", what[plant], worst);
    }
    for (int shard = 1; shard <= 2; shard++) { // controls: a wrong shard must show
        double err[5], least = INFINITY;
        ring_case(c, dev, 2, 3, shard, false, err);
        for (int i = 0; i < 5; i++) least = err[i] < least ? err[i] : least;
        double worst = err[0] > err[2] ? err[0] : err[2]; // o or dq of this rank
        comm_allreduce(c, tensor_make(&worst, DT_F64, DEV_CPU, 1, 1, 1, 1, 1), COMM_MAX);
        if (!(worst > 1e-2))
            die("ring: the control (%s) went unnoticed: %.3g", shard == 1 ? "the next rank's shard" : "halves swapped",
                worst);
        if (c->rank == 0)
            printf("ring: control %s: error %.3g (must be large)\n",
                   shard == 1 ? "next rank's shard" : "halves swapped", worst);
    }
}

// ring.c — build/test_parallel ring[-gpu]: zigzag ring attention (parallel/ring.h) over the world as the cp
// group, against one-rank attention over the whole sequences that every rank computes alone (fp32, CPU).
// Each rank holds chunks r and 2·cp − 1 − r of every sequence; its forward output, log-sum-exp and the
// gradients of q, k and v must be the reference's rows of those chunks (≤ 1e-5 relative). GQA (4 query heads on
// 2 kv heads), B = 2 sequences, blocks of 3 and 4 rows. A control feeds rank r the shard of rank r + 1 (and the
// front and back chunks swapped on one rank): the result must then be far from the reference.
// Multi-head latent attention (the latent travels, each hop makes K and V with kv_b_proj): o, lse, dq, the
// latent's gradients (dc, dk_pe) of this rank's rows and kv_b_proj's weight gradient summed over the ranks against
// one rank's decompression and attention over the whole sequences.
// On -gpu every tensor the ring sees is device memory (fake GPUs in make test: NCCL over MPI, stream order
// checked against the transfers in flight).
#include <math.h>

#include "parallel/mesh.h"
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

static Tensor on(Device dev, Tensor h, Arena *a) {
    if (dev == DEV_CPU) return h;
    Tensor t = arena_tensor(a, h.dt, h.nd, h.n[0], h.n[1], h.n[2], 0);
    op_copy(t, h);
    return t;
}

// One case: errors of (o, lse, dq, dk, dv) on this rank; shard: 0 = the right one, 1 = rank r + 1's, 2 = the
// halves swapped (rank 0 only).
static void ring_case(const Comm *c, Device dev, int B, int blk, int shard, double err[5]) {
    int cp = c->size, r = c->rank, S = 2 * cp * blk, nh = 4, nkv = 2, dqk = 8, dv = 6;
    int64_t T = (int64_t)B * S, Tl = (int64_t)B * 2 * blk;
    Tensor q = hostt(T, nh, dqk), k = hostt(T, nkv, dqk), v = hostt(T, nkv, dv), dout = hostt(T, nh, dv);
    Tensor *all[] = {&q, &k, &v, &dout};
    for (int i = 0; i < 4; i++) // the same values on every rank
        for (int64_t j = 0; j < tensor_numel(*all[i]); j++)
            ((float *)all[i]->p)[j] = (float)rng_normal(77 + (uint64_t)blk, (uint64_t)i, (uint64_t)j);
    Tensor o = hostt(T, nh, dv), lse = hostt(B, nh, S), dq = hostt(T, nh, dqk), dk = hostt(T, nkv, dqk),
           dvv = hostt(T, nkv, dv);
    AttnArgs a = {.B = B, .scale = 0.35f, .causal = true};
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
    ring_attention_forward(&ring, go, gl, gq, gk, gv, &a);
    ring_attention_backward(&ring, gdq, gdk, gdv, gd, gq, gk, gv, go, gl, &a);
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
static void ring_mla_case(const Comm *c, Device dev, int B, int blk, double err[6]) {
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
    MlaLatent ml = {.c = cl, .pe = kva, .wkvb = w, .dwkvb = dw, .pe_col = dc, .nh = nh, .dn = dn, .dr = dr, .dv = dv};
    AttnArgs a = {.B = B, .scale = 0.3f, .causal = true};
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
    MlaLatent gl = {.c = on(dev, lc, &mem),
                    .pe = on(dev, lkva, &mem),
                    .wkvb = on(dev, w, &mem),
                    .dwkvb = on(dev, zero_w, &mem),
                    .pe_col = dc,
                    .nh = nh,
                    .dn = dn,
                    .dr = dr,
                    .dv = dv};
    Tensor gq = on(dev, lq, &mem), gd = on(dev, ld, &mem), go = on(dev, hostt(Tl, nh, dv), &mem),
           gls = on(dev, hostt(B, nh, 2 * blk), &mem), gdq = on(dev, hostt(Tl, nh, dq), &mem), gdc = on(dev, lc, &mem),
           gdkva = on(dev, hostt(Tl, dc + dr, 1), &mem);
    gdkva.nd = 2;
    ring_mla_forward(&ring, go, gls, gq, &gl, &a);
    ring_mla_backward(&ring, gdq, gdc, gdkva, gd, gq, go, gls, &gl, &a);
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

void suite_ring(const Dist *d, bool gpu) {
    const Comm *c = &d->world;
    if (c->size < 2) return;
    Device dev = gpu ? DEV_CUDA : DEV_CPU;
    const char *name[5] = {"o", "lse", "dq", "dk", "dv"};
    for (int blk = 3; blk <= 4; blk++) {
        double err[5], worst = 0;
        ring_case(c, dev, 2, blk, 0, err);
        for (int i = 0; i < 5; i++) {
            if (err[i] > 1e-5)
                die("ring: cp %d, blk %d: %s differs from one-rank attention by %.3g", c->size, blk, name[i], err[i]);
            worst = err[i] > worst ? err[i] : worst;
        }
        comm_allreduce(c, tensor_make(&worst, DT_F64, DEV_CPU, 1, 1, 1, 1, 1), COMM_MAX);
        if (c->rank == 0) printf("ring: cp %d, B 2, blk %d: worst relative error %.3g\n", c->size, blk, worst);
    }
    const char *mname[6] = {"o", "lse", "dq", "dc", "dk_pe", "dW (kv_b_proj)"};
    for (int blk = 3; blk <= 4; blk++) {
        double err[6], worst = 0;
        ring_mla_case(c, dev, 2, blk, err);
        for (int i = 0; i < 6; i++) {
            if (err[i] > 1e-5)
                die("ring (MLA): cp %d, blk %d: %s differs from one-rank attention by %.3g", c->size, blk, mname[i],
                    err[i]);
            worst = err[i] > worst ? err[i] : worst;
        }
        comm_allreduce(c, tensor_make(&worst, DT_F64, DEV_CPU, 1, 1, 1, 1, 1), COMM_MAX);
        if (c->rank == 0)
            printf("ring (MLA latent): cp %d, B 2, blk %d: worst relative error %.3g\n", c->size, blk, worst);
    }
    for (int shard = 1; shard <= 2; shard++) { // controls: a wrong shard must show
        double err[5], least = INFINITY;
        ring_case(c, dev, 2, 3, shard, err);
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

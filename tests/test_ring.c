// test_ring.c — the pieces of context parallelism one process can check: the log-sum-exp merge of attention
// blocks (op_attention_merge) against attention over all keys, and the zigzag layout of the data
// (dataset_zigzag) and of the positions (ring_position). The ring itself runs under mpirun: dist_ring_attention.
#include "parallel/ring.h"
#include "test.h"
#include "train/data.h"

static Tensor cpu3(int64_t n0, int64_t n1, int64_t n2) {
    return tensor_make(xcalloc(n0 * n1 * n2 + 1, sizeof(float)), DT_F32, DEV_CPU, 3, n0, n1, n2, 1);
}

// Causal attention of Sq queries over Sk keys cut at a: the blocks [0, a) and [a, Sk) at their positions, merged
// in either order, equal attention over all keys; in the second block the first a queries see nothing (lse −∞),
// and merging it first leaves accumulator rows empty that the other block then fills.
TEST(op_attention_merge_equals_whole_attention) {
    int B = 2, S = 23, a = 9, nh = 4, nkv = 2, dqk = 8, dv = 6;
    Tensor q = cpu3(B * S, nh, dqk), k = cpu3(B * S, nkv, dqk), v = cpu3(B * S, nkv, dv);
    fill_normal(q.p, tensor_numel(q), 1), fill_normal(k.p, tensor_numel(k), 1), fill_normal(v.p, tensor_numel(v), 1);
    Tensor o = cpu3(B * S, nh, dv), lse = cpu3(B, nh, S);
    AttnArgs whole = {.B = B, .scale = 0.3f, .causal = true};
    op_attention_forward(o, lse, q, k, v, &whole);
    // the key blocks of each sequence, contiguous: (B·len, heads, d)
    int len[2] = {a, S - a}, off[2] = {0, a};
    Tensor kb[2], vb[2], ob[2], lb[2];
    for (int h = 0; h < 2; h++) {
        kb[h] = cpu3(B * len[h], nkv, dqk), vb[h] = cpu3(B * len[h], nkv, dv);
        ob[h] = cpu3(B * S, nh, dv), lb[h] = cpu3(B, nh, S);
        for (int b = 0; b < B; b++) {
            op_copy(tensor_rows(kb[h], (int64_t)b * len[h], len[h]), tensor_rows(k, (int64_t)b * S + off[h], len[h]));
            op_copy(tensor_rows(vb[h], (int64_t)b * len[h], len[h]), tensor_rows(v, (int64_t)b * S + off[h], len[h]));
        }
        AttnArgs blk = {.B = B, .scale = 0.3f, .causal = true, .k_off = off[h]};
        op_attention_forward(ob[h], lb[h], q, kb[h], vb[h], &blk);
    }
    for (int first = 0; first < 2; first++) {
        Tensor acc = cpu3(B * S, nh, dv), al = cpu3(B, nh, S);
        op_attention_merge(acc, al, ob[first], lb[first], B, true);
        op_attention_merge(acc, al, ob[1 - first], lb[1 - first], B, false);
        double eo = rel_err_f32(acc.p, o.p, tensor_numel(o)), el = rel_err_f32(al.p, lse.p, tensor_numel(lse));
        ASSERT_MSG(eo <= 1e-6 && el <= 1e-6, "block %d first: o %.3g, lse %.3g", first, eo, el);
        free(acc.p), free(al.p);
    }
    int empty = 0; // the second block's first a queries saw nothing
    for (int64_t i = 0; i < tensor_numel(lb[1]); i++) empty += ((float *)lb[1].p)[i] == -INFINITY;
    ASSERT_MSG(empty == B * nh * a, "%d empty rows", empty);
    Tensor all[] = {q, k, v, o, lse, kb[0], kb[1], vb[0], vb[1], ob[0], ob[1], lb[0], lb[1]};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) free(all[i].p);
}

// Rank r keeps chunks r and 2·cp − 1 − r of each sequence, in that order, and their positions are the global ones.
TEST(ring_zigzag_layout) {
    for (int cp = 1; cp <= 4; cp++)
        for (int r = 0; r < cp; r++) {
            int B = 3, S = 2 * cp * 5, blk = 5, Sl = S / cp;
            int32_t *x = xmalloc(B * S * sizeof(int32_t));
            for (int i = 0; i < B * S; i++) x[i] = i;
            dataset_zigzag(x, B, S, cp, r);
            for (int b = 0; b < B; b++)
                for (int i = 0; i < Sl; i++) {
                    int pos = ring_position(r, cp, blk, i),
                        want = i < blk ? r * blk + i : (2 * cp - 1 - r) * blk + i - blk;
                    ASSERT_MSG(pos == want && x[b * Sl + i] == b * S + pos, "cp %d rank %d: sequence %d row %d", cp, r,
                               b, i);
                }
            free(x);
        }
}

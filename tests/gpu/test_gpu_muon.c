// test_gpu_muon.c — the Muon ops on the GPU against the CPU ops (fp32): Newton–Schulz on square, wide,
// tall and batched matrices at expert-like sizes, and the momentum and apply steps.
#include "gpu_test.h"

TEST(gpu_op_muon) {
    gpu_begin();
    gpu_mode(DT_F32);
    static const int shapes[][3] = {{1, 256, 256}, {4, 192, 512}, {3, 512, 192}, {8, 1, 4}};
    for (size_t t = 0; t < sizeof shapes / sizeof *shapes; t++) {
        int B = shapes[t][0], n = shapes[t][1], m = shapes[t][2];
        Pair x = pair_rand(DT_F32, 0.2f, 3, B, n, m, 0);
        int64_t wsn = op_newton_schulz_workspace(n, m);
        Pair ws = pair_nan(DT_F32, 1, wsn, 0, 0, 0);
        op_newton_schulz(x.c, ws.c, 5), op_newton_schulz(x.d, ws.d, 5);
        EXPECT_CLOSE(x, 1e-4);
    }
    int64_t N = 30000;
    Pair buf = pair_rand(DT_F32, 1, 1, N, 0, 0, 0), g = pair_rand(DT_F32, 1, 1, N, 0, 0, 0);
    Pair p = pair_rand(DT_F32, 1, 1, N, 0, 0, 0), o = pair_rand(DT_F32, 1, 1, N, 0, 0, 0);
    op_muon_momentum(buf.c, g.c, 0.95f), op_muon_momentum(buf.d, g.d, 0.95f);
    EXPECT_CLOSE(buf, 1e-6);
    EXPECT_CLOSE(g, 1e-6);
    op_muon_apply(p.c, o.c, 0.02f, 0.1f, 3.2f), op_muon_apply(p.d, o.d, 0.02f, 0.1f, 3.2f);
    EXPECT_CLOSE(p, 1e-6);
    gpu_report();
}

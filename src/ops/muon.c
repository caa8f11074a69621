// muon.c — the Muon optimizer's Newton–Schulz orthogonalisation (spec of the update: docs/architecture.md, "Muon"),
// built on the GEMM ops so that it runs on either device; its two elementwise ops are in ops_list.h.
#include "ops/ops.h"

#include <math.h>

int64_t op_newton_schulz_workspace(int64_t n, int64_t m) {
    int64_t r = n < m ? n : m;
    return 2 * r * r + n * m;
}

// One matrix G: (n, m). With r = min(n, m), A = X Xᵀ is (r, r): for n ≤ m X is G itself; for n > m the
// iteration runs on Xᵀ = G in transposed form (A = GᵀG, X ← aX + X·B), which is the same arithmetic as
// transposing, iterating and transposing back.
static void newton_schulz_one(Tensor G, Tensor A, Tensor AA, Tensor Y, int steps) {
    const float a = 3.4445f, b = -4.7750f, c = 2.0315f;
    int64_t n = G.n[0], m = G.n[1];
    bool tall = n > m;
    op_scale(G, (float)(1.0 / (sqrt(op_sum_squares(G)) + 1e-7)));
    Tensor none = {0};
    none.dev = G.dev;
    for (int s = 0; s < steps; s++) {
        if (tall) op_linear_backward_weight(A, none, G, G, false); // A = GᵀG: (m, m)
        else op_linear_forward(A, G, G, none);                     // A = G Gᵀ: (n, n)
        op_linear_forward(AA, A, A, none);                         // A·Aᵀ = A² (A is symmetric)
        op_scale(A, b), op_scale(AA, c), op_add(A, AA);            // B = b·A + c·A²
        if (tall) op_linear_forward(Y, G, A, none);                // G·Bᵀ = G·B: (n, m)
        else op_linear_backward_input(Y, A, G, false);             // B·G: (n, m)
        op_scale(G, a), op_add(G, Y);
    }
}

void op_newton_schulz(Tensor x, Tensor ws, int steps) {
    CHECK(x.dt == DT_F32 && ws.dt == DT_F32 && x.dev == ws.dev && x.nd == 3);
    int64_t B = x.n[0], n = x.n[1], m = x.n[2], r = n < m ? n : m;
    CHECK(tensor_numel(ws) >= op_newton_schulz_workspace(n, m));
    float *w = ws.p;
    Tensor A = tensor_make(w, DT_F32, ws.dev, 2, r, r, 1, 1),
           AA = tensor_make(w + r * r, DT_F32, ws.dev, 2, r, r, 1, 1);
    Tensor Y = tensor_make(w + 2 * r * r, DT_F32, ws.dev, 2, n, m, 1, 1);
    for (int64_t e = 0; e < B; e++)
        newton_schulz_one(tensor_make((float *)x.p + e * n * m, DT_F32, x.dev, 2, n, m, 1, 1), A, AA, Y, steps);
}

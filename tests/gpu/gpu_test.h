// gpu_test.h — helpers of the GPU suite: paired tensors (a host fp32 copy for the CPU reference op and a
// device copy in the mode's dtype holding the same values), error measures, and a per-test record of
// the worst error seen, printed under each test's PASS line.
#pragma once
#include "ops/ops.h"
#include "../test.h"

typedef struct {
    Tensor c, d; // c: host fp32 (the CPU op's view); d: device, dtype of the mode
} Pair;

// Starts a GPU test: asserts that a GPU is there and recycles the test's device arena.
void gpu_begin(void);
// Sets the mode (compute dtype) that the next errors are recorded under.
void gpu_mode(DType dt);
// Prints the worst relative error of each mode seen since gpu_begin.
void gpu_report(void);
Tensor gpu_tensor(DType dt, int nd, int64_t n0, int64_t n1, int64_t n2, int64_t n3);
// The device arena's fill, and a return to it: the tensors made since then are gone (a test of several large cases).
size_t gpu_mark(void);
void gpu_release(size_t mark);
// Random N(0, scale²) values (rounded to bf16 first when dt is bf16, so both sides hold equal inputs).
Pair pair_rand(DType dt, float scale, int nd, int64_t n0, int64_t n1, int64_t n2, int64_t n3);
Pair pair_nan(DType dt, int nd, int64_t n0, int64_t n1, int64_t n2, int64_t n3); // outputs: NaN on both sides
Pair pair_from(DType dt, const float *h, int nd, int64_t n0, int64_t n1, int64_t n2, int64_t n3);
Pair pair_i32(const int32_t *h, int64_t n);
Pair pair_offs(const int64_t *h, int64_t n); // a grouped op's n row offsets on each side (h NULL: none, p NULL)
float *gpu_down(Tensor d);                   // host fp32 copy of a device fp32/bf16 tensor (xmalloc'd)
int32_t *gpu_down_i32(Tensor d);
double pair_err(Pair p);                                     // ‖gpu − cpu‖/‖cpu‖ (NaN → inf)
double calc_diff(const float *a, const float *b, int64_t n); // 1 − 2Σab/Σ(a² + b²) (NaN → inf)
void round_bf16(float *x, int64_t n);
// Asserts pair_err(p) ≤ tol and records it under the current mode.
#define EXPECT_CLOSE(p, tol) expect_close((p), (tol), #p, __FILE__, __LINE__)
void expect_close(Pair p, double tol, const char *name, const char *file, int line);
void record_err(double err, const char *name);
// An attention's lse: −∞ (a query that sees nothing) must match exactly, the rest within tol (relative).
void expect_lse(Pair lse, double tol);

#define NOPAIR ((Pair){{0}, {0}})

// cpu_fp8.c — the reference of FP8 E4M3 block quantisation (docs/reference.md §20): the E4M3 code of a value
// (round to nearest even, saturating at ±448, subnormal codes under 2^-6), the power-of-two block scale, and
// quantise / dequantise / round over the 1 × 128, 128 × 1 and 128 × 128 blocks of a matrix of groups of rows.
// x: (R, C) fp32 with groups of rows offs[g]..offs[g+1], or (E, N, K): E groups of N rows.
#include "ops/cpu/cpu_ops.h"

uint8_t fp8_e4m3_encode(float v) {
    uint8_t sign = signbit(v) ? 0x80 : 0;
    float a = fabsf(v);
    if (isnan(v)) return sign | 0x7f;
    if (a >= 448.0f) return sign | 0x7e;                       // saturate (E4M3 has no infinity)
    if (a < 0x1p-6f) return sign | (uint8_t)rintf(a * 512.0f); // subnormal m·2^-9 (m = 8 is 2^-6, code 0x08)
    int e;
    frexpf(a, &e); // a = f·2^e, f in [0.5, 1): a = (1 + mant/8)·2^(e−1)
    int E = e - 1, mant = (int)rintf((a * ldexpf(1.0f, -E) - 1.0f) * 8.0f);
    if (mant == 8) E++, mant = 0;
    return sign | (uint8_t)((E + 7) << 3 | mant); // a < 448 keeps (E, mant) ≤ (8, 6)
}

float fp8_e4m3_decode(uint8_t q) {
    int E = q >> 3 & 15, mant = q & 7;
    float a = E == 15 && mant == 7 ? NAN : E == 0 ? ldexpf((float)mant, -9) : ldexpf(1.0f + mant / 8.0f, E - 7);
    return q & 0x80 ? -a : a;
}

float fp8_block_scale(float amax) {
    float s = fmaxf(amax, 1e-4f) / 448.0f;
    uint32_t b;
    memcpy(&b, &s, 4);
    if (b & 0x7fffff) b = (b & 0xff800000u) + 0x800000u; // round up to a power of two
    memcpy(&s, &b, 4);
    return s;
}

// The blocks of x: its groups of rows, the block height (1 or 128) and width (128 or 1).
typedef struct {
    int64_t R, C, bh, bw, ncb; // ncb: column blocks per row of blocks
    int groups;
    const int64_t *offs; // groups + 1 row boundaries (NULL: groups of N rows, N = R / groups)
} Blocks;

static Blocks blocks_of(Tensor x, Fp8Blocks b, const int64_t *offs, int groups) {
    Blocks k = {.R = t_rows(x), .C = t_cols(x), .bh = b == FP8_ROWS ? 1 : 128, .bw = b == FP8_COLS ? 1 : 128};
    if (x.nd == 3) k.R = x.n[0] * x.n[1], k.C = x.n[2], groups = (int)x.n[0], offs = NULL;
    else if (!offs) groups = 1;
    k.groups = groups, k.offs = offs, k.ncb = (k.C + k.bw - 1) / k.bw;
    CHECK(!offs || (offs[0] == 0 && offs[groups] == k.R));
    return k;
}
static int64_t group_row(const Blocks *k, int64_t g) { return k->offs ? k->offs[g] : g * (k->R / k->groups); }

int64_t cpu_fp8_scale_rows(Tensor x, Fp8Blocks b, const int64_t *offs, int groups) {
    Blocks k = blocks_of(x, b, offs, groups);
    int64_t n = 0;
    for (int g = 0; g < k.groups; g++) n += (group_row(&k, g + 1) - group_row(&k, g) + k.bh - 1) / k.bh;
    return n;
}

// Quantises (q != NULL: codes; s: the scales, (scale rows, ncb)) and/or writes q·s into y (y != NULL) for every
// block of x. Stops at the first non-finite element, before anything is written.
static void blocks_run(Tensor x, Fp8Blocks b, const int64_t *offs, int groups, uint8_t *q, float *s, float *y) {
    Blocks k = blocks_of(x, b, offs, groups);
    const float *xs = x.p;
    for (int64_t i = 0; i < k.R * k.C; i++) // before any parallel region: die() never runs inside one
        if (!isfinite(xs[i]))
            die("fp8: cannot quantise a non-finite value: x[%lld, %lld] = %g (shape %lld × %lld)", (long long)(i / k.C),
                (long long)(i % k.C), xs[i], (long long)k.R, (long long)k.C);
    for (int64_t g = 0, sr0 = 0; g < k.groups; g++) {
        int64_t g0 = group_row(&k, g), g1 = group_row(&k, g + 1), nrb = (g1 - g0 + k.bh - 1) / k.bh;
#pragma omp parallel for collapse(2)
        for (int64_t rb = 0; rb < nrb; rb++)
            for (int64_t cb = 0; cb < k.ncb; cb++) {
                int64_t r0 = g0 + rb * k.bh, r1 = r0 + k.bh < g1 ? r0 + k.bh : g1, c0 = cb * k.bw,
                        c1 = c0 + k.bw < k.C ? c0 + k.bw : k.C;
                float amax = 0;
                for (int64_t r = r0; r < r1; r++)
                    for (int64_t c = c0; c < c1; c++) amax = fmaxf(amax, fabsf(xs[r * k.C + c]));
                float sc = fp8_block_scale(amax), inv = 1.0f / sc; // exact: sc is a power of two
                if (s) s[(sr0 + rb) * k.ncb + cb] = sc;
                for (int64_t r = r0; r < r1; r++)
                    for (int64_t c = c0; c < c1; c++) {
                        uint8_t code = fp8_e4m3_encode(xs[r * k.C + c] * inv);
                        if (q) q[r * k.C + c] = code;
                        if (y) y[r * k.C + c] = fp8_e4m3_decode(code) * sc;
                    }
            }
        sr0 += nrb;
    }
}

void cpu_fp8_quantize(Tensor q, Tensor s, Tensor x, Fp8Blocks b, const int64_t *offs, int groups) {
    CPU_F32(x);
    CHECK(q.dt == DT_U8 && tensor_numel(q) == tensor_numel(x) && s.dt == DT_F32);
    Blocks k = blocks_of(x, b, offs, groups);
    CHECK(tensor_numel(s) == cpu_fp8_scale_rows(x, b, offs, groups) * k.ncb);
    blocks_run(x, b, offs, groups, q.p, s.p, NULL);
}

void cpu_fp8_dequantize(Tensor y, Tensor q, Tensor s, Fp8Blocks b, const int64_t *offs, int groups) {
    CPU_F32(y);
    CHECK(q.dt == DT_U8 && tensor_numel(q) == tensor_numel(y) && s.dt == DT_F32);
    Blocks k = blocks_of(y, b, offs, groups);
    const uint8_t *qs = q.p;
    const float *ss = s.p;
    for (int64_t g = 0, sr0 = 0; g < k.groups; g++) {
        int64_t g0 = group_row(&k, g), g1 = group_row(&k, g + 1);
#pragma omp parallel for
        for (int64_t r = g0; r < g1; r++)
            for (int64_t c = 0; c < k.C; c++)
                F(y)[r * k.C + c] = fp8_e4m3_decode(qs[r * k.C + c]) * ss[(sr0 + (r - g0) / k.bh) * k.ncb + c / k.bw];
        sr0 += (g1 - g0 + k.bh - 1) / k.bh;
    }
}

void cpu_fp8_round(Tensor y, Tensor x, Fp8Blocks b, Tensor offs) {
    CPU_F32(x);
    CPU_F32(y);
    CHECK(tensor_numel(y) == tensor_numel(x));
    int groups = offs.p ? (int)tensor_numel(offs) - 1 : 0;
    blocks_run(x, b, cpu_offs(offs, groups), groups, NULL, NULL,
               y.p); // an element is read before it is written: y may be x
}

// fw from w, a dense (N, K) weight or the experts' (E, N, K): the codes and natural scales (E·NB, KB) of each
// expert's 128 × 128 blocks, then each expert's qt = qᵀ and the scales in the padded layouts of s (E·NB, KB4) and
// st (E·KB, NB4) (ops.h, Fp8Weight).
void cpu_fp8_weight(Fp8Weight fw, Tensor w) {
    CPU_F32(w);
    int64_t E = w.nd == 3 ? w.n[0] : 1, N = w.n[w.nd - 2], K = w.n[w.nd - 1], NB = (N + 127) / 128,
            KB = (K + 127) / 128, KB4 = fw.s.n[1], NB4 = fw.st.n[1];
    CHECK(fw.q.n[fw.q.nd - 2] == N && fw.q.n[fw.q.nd - 1] == K && fw.s.n[0] == E * NB && fw.st.n[0] == E * KB);
    float *s = xmalloc(sizeof(float) * E * NB * KB);
    cpu_fp8_quantize(fw.q, tf32_2(s, E * NB, KB), w, FP8_TILES, NULL, 0);
    const uint8_t *q = fw.q.p;
    uint8_t *qt = fw.qt.p;
    for (int64_t e = 0; e < E; e++)
#pragma omp parallel for
        for (int64_t k = 0; k < K; k++)
            for (int64_t n = 0; n < N; n++) qt[(e * K + k) * N + n] = q[(e * N + n) * K + k];
    memset(fw.s.p, 0, tensor_bytes(fw.s)), memset(fw.st.p, 0, tensor_bytes(fw.st));
    for (int64_t e = 0; e < E; e++)
        for (int64_t nb = 0; nb < NB; nb++)
            for (int64_t kb = 0; kb < KB; kb++)
                F(fw.s)[(e * NB + nb) * KB4 + kb] = F(fw.st)[(e * KB + kb) * NB4 + nb] = s[(e * NB + nb) * KB + kb];
    free(s);
}

void cpu_fp8_weight_values(Tensor y, Fp8Weight fw) {
    CPU_F32(y);
    int64_t E = fw.q.nd == 3 ? fw.q.n[0] : 1, N = fw.q.n[fw.q.nd - 2], K = fw.q.n[fw.q.nd - 1], KB4 = fw.s.n[1];
    int64_t NB = (N + 127) / 128;
    CHECK(tensor_numel(y) == E * N * K);
    const uint8_t *q = fw.q.p;
#pragma omp parallel for
    for (int64_t r = 0; r < E * N; r++) // r: a row of all E·N; expert r / N, its row r % N
        for (int64_t k = 0; k < K; k++)
            F(y)[r * K + k] = fp8_e4m3_decode(q[r * K + k]) * F(fw.s)[(r / N * NB + r % N / 128) * KB4 + k / 128];
}

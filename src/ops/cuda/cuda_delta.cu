// cuda_delta.cu — the gated delta rule on the GPU (docs/reference.md §19), forward and backward, math as in
// ops/cpu/cpu_delta.c (the gate, conv1d and DeltaNet gates: cuda_delta_conv.cu; the gated RMSNorm: cuda_norm.cu).
// fp32 arithmetic on fp32 or bf16 storage; the state is fp32.
// The delta rule runs the chunked WY / UT form (docs/architecture.md, "GPU kernels"; its terms are written
// out above the kernels below): per-chunk work for every chunk at once, a state pass over the chunks per (sequence,
// value head, 32 value columns), and in the backward a reverse state pass and a per-chunk gradient kernel; q and k
// are normalised first and their gradients per value head summed onto the key heads last, through the
// normalisation's backward. Two sets of those kernels: SIMT fp32 (fp32 data, and any head size or chunk), and
// tensor-core mma.sync ones for bf16 data at Qwen3.5's head size 128 and chunk 64 ("the tensor-core form" below).
// Shapes: R rows of D, T = B·S tokens, nk/nv heads of dk/dv.
#include "ops/cuda/cuda_mma.cuh"

// ---- the gated delta rule ----

// A call's dims: the sequences fall into NC chunks of L positions (NL = NC·L rows of the scratch per value head).
typedef struct {
    int64_t B, S, NC, NL; // sequences, sequence length, chunks, NC·L
    int L, nk, nv, dk, dv;
} ChunkDims;

// The scratch as the kernels see it (DeltaScratch's pieces, ops.h), NULL where the call carved none (the forward's
// has no backward pieces).
typedef struct {
    float *qh, *kh, *rq, *rk, *U, *W, *M, *Tm, *S0, *dS1, *Vp, *dVp, *dBv, *dW, *dBk, *gq, *gk;
    double *cs;
} DeltaBufs;

// The op's tensors as the kernels see them (o, dv, v, dout of the data's type), NULL where the call has none.
typedef struct {
    void *o, *dv;
    const void *v, *dout;
    const float *g, *beta, *s0, *dsT;
    float *sT, *ds0, *dg, *dbeta;
    const int *pos; // (T) document positions (NULL: no masking)
} DeltaIO;

// One warp per (token, key head): qh = scale·q·rq, kh = k·rk (fp32, or bf16 for the tensor cores), rq, rk =
// (Σ x² + 1e-6)^-½ (1 without l2).
template <typename T, typename TO>
__global__ void delta_prep_kernel(DeltaBufs f, const T *q, const T *k, float scale, bool l2, ChunkDims d) {
    TO *qh = (TO *)f.qh, *kh = (TO *)f.kh;
    int dk = d.dk;
    int64_t row = blockIdx.x * (int64_t)ROWS_PER_BLOCK + threadIdx.y;
    if (row >= d.B * d.S * d.nk) return;
    float sq = 0, sk = 0;
    for (int i = threadIdx.x; i < dk; i += 32) {
        float a = ld(q, row * dk + i), b = ld(k, row * dk + i);
        sq += a * a, sk += b * b;
    }
    sq = warp_sum(sq), sk = warp_sum(sk);
    float r1 = l2 ? rsqrtf(sq + 1e-6f) : 1.0f, r2 = l2 ? rsqrtf(sk + 1e-6f) : 1.0f;
    if (threadIdx.x == 0) f.rq[row] = r1, f.rk[row] = r2;
    for (int i = threadIdx.x; i < dk; i += 32)
        st(qh, row * dk + i, ld(q, row * dk + i) * r1 * scale), st(kh, row * dk + i, ld(k, row * dk + i) * r2);
}

// ---- the chunked form (the CPU's delta_chunk in src/ops/cpu/cpu_delta.c is its reference) ----
// Per (sequence b, value head h) the S positions fall into NC chunks of L ≤ DELTA_MAX_CHUNK; inside a chunk of Le
// positions, with c_i = Σ_{m≤i} g_m, kh/qh the normalised (and scaled) keys/queries:
//   A_ij = β_i (k_i·k_j) e^{c_i − c_j} (j < i), Tm = (I + A)⁻¹, U = Tm (β v), W = Tm (β e^c k),
//   M_ij = (q_i·k_j) e^{c_i − c_j} (j ≤ i); from the state S₀ entering the chunk: V' = U − W S₀,
//   o = e^c (q S₀) + M V', S₁ = e^{c_L} S₀ + kᵀ diag(e^{c_L − c}) V' (c_L = c_{Le−1}).
// delta_chunk_prep_kernel builds c, U, W, M (and Tm for the backward) for all chunks at once; the state pass walks
// the chunks in order, one block per (b, h, DELTA_VT value columns): the columns of S are independent.
// The backward runs the state pass again to keep S₀ and V' of every chunk, walks the chunks backwards carrying
// dS (dS₁ kept per chunk, dV' = Mᵀ dO + diag(e^{c_L − c}) k dS₁, dS₀ = e^{c_L} dS₁ + qᵀ diag(e^c) dO − Wᵀ dV'),
// then delta_chunk_grad_kernel takes every chunk at once through the rest (its comment has the terms).
// Scratch rows are indexed by bh = b·nv + h and the position p < NC·L padded to whole chunks.
// Document masking (io.pos): row i of a chunk belongs to the document that starts at its row sg_i = i − pos_i (−1:
// before the chunk). A pair (i, j ≤ i) counts only for j ≥ sg_i, the entering state S₀ reaches row i only for
// sg_i = −1 (its e^{c_i} becomes 0: in W's β e^c k, in o and in their gradients) and S₁ only when the chunk has no
// reset (e^{c_L} → 0), and S₁'s sum runs over j ≥ sg_{L−1} (e^{c_L − c_j} → 0 before). So every decay factor is
// either itself or an exact 0: c stays finite (no −∞ − −∞) and keeps its digits, and without masking the same
// factors, bit for bit, come out. dg restarts its reverse cumulative sum at each reset: the dc of a document's rows
// sum to 0 (every term with their c is a difference within the document), and a reset token's g meets a zeroed state.
#define DELTA_VT 32 // value columns per state-pass block

// DOCS false (the tensor-core kernels' template flag where the call has no masks; the SIMT kernels test pos at run
// time): the decays are the plain expressions, with no reads of sg.
// sg_i of row i of the chunk whose first token is tok0 (−1 without masking).
template <bool DOCS = true> __device__ __forceinline__ int seg_start(const int *pos, int64_t tok0, int i) {
    if (!DOCS || !pos) return -1;
    int s = i - pos[tok0 + i];
    return s > -1 ? s : -1;
}
// The decay factors under the masks: e^{c_i − c_j} (j ≤ i), e^{c_i} and e^{c_L − c_j} from c in fp64.
template <bool DOCS = true> __device__ __forceinline__ float pair_decay(const double *c, const int *sg, int i, int j) {
    return j <= i && (!DOCS || j >= sg[i]) ? expf((float)(c[i] - c[j])) : 0.0f;
}
template <bool DOCS = true> __device__ __forceinline__ float enter_decay(const double *c, const int *sg, int i) {
    return !DOCS || sg[i] < 0 ? expf((float)c[i]) : 0.0f;
}

// Grid (NC, B·nv). Shared: cc (L, fp64), kc (L, dk), Am, Ti (L, L), bb, be = β e^c (L).
template <typename T> __global__ void delta_chunk_prep_kernel(DeltaBufs f, DeltaIO io, ChunkDims d) {
    const T *v = (const T *)io.v;
    extern __shared__ float sm[];
    int L = d.L, dk = d.dk, dv = d.dv, n = blockIdx.x, bh = blockIdx.y, nv = d.nv;
    int64_t b = bh / nv, p0 = (int64_t)n * L, tok0 = b * d.S + p0;
    int h = bh % nv, hk = h / (nv / d.nk), Le = (int)(d.S - p0 < L ? d.S - p0 : L);
    double *cc = (double *)sm; // c in fp64: differences of large cumulative decays keep their digits
    float *kc = (float *)(cc + L), *Am = kc + L * dk, *Ti = Am + L * L, *bb = Ti + L * L, *be = bb + L;
    int *sg = (int *)(be + L);
    for (int e = threadIdx.x; e < Le * dk; e += blockDim.x) kc[e] = f.kh[((tok0 + e / dk) * d.nk + hk) * dk + e % dk];
    if (threadIdx.x == 0) {
        double s = 0;
        for (int i = 0; i < Le; i++)
            s += io.g[(tok0 + i) * nv + h], cc[i] = s, bb[i] = io.beta[(tok0 + i) * nv + h],
                                            sg[i] = seg_start(io.pos, tok0, i), be[i] = bb[i] * enter_decay(cc, sg, i);
    }
    __syncthreads();
    for (int e = threadIdx.x; e < Le * Le; e += blockDim.x) {
        int i = e / Le, j = e % Le;
        float s = 0;
        if (j < i)
            for (int x = 0; x < dk; x++) s += kc[i * dk + x] * kc[j * dk + x];
        Am[i * L + j] = j < i ? bb[i] * s * pair_decay(cc, sg, i, j) : 0.0f;
    }
    __syncthreads();
    // Forward substitution, a row at a time: Ti_i = e_i − Σ_{j<i} A_ij Ti_j.
    for (int i = 0; i < Le; i++) {
        for (int m = threadIdx.x; m < Le; m += blockDim.x) {
            float s = m == i ? 1.0f : 0.0f;
            for (int j = m; j < i; j++) s -= Am[i * L + j] * Ti[j * L + m];
            Ti[i * L + m] = m <= i ? s : 0.0f;
        }
        __syncthreads();
    }
    float *Ub = f.U + ((int64_t)bh * d.NL + p0) * dv, *Wb = f.W + ((int64_t)bh * d.NL + p0) * dk;
    for (int e = threadIdx.x; e < Le * dv; e += blockDim.x) {
        int i = e / dv, y = e % dv;
        float s = 0;
        for (int m = 0; m <= i; m++) s += Ti[i * L + m] * bb[m] * ld(v, ((tok0 + m) * nv + h) * dv + y);
        Ub[e] = s;
    }
    for (int e = threadIdx.x; e < Le * dk; e += blockDim.x) {
        int i = e / dk, x = e % dk;
        float s = 0;
        for (int m = 0; m <= i; m++) s += Ti[i * L + m] * be[m] * kc[m * dk + x];
        Wb[e] = s;
    }
    float *Mb = f.M + ((int64_t)bh * d.NC + n) * L * L;
    for (int e = threadIdx.x; e < Le * Le; e += blockDim.x) {
        int i = e / Le, j = e % Le;
        float s = 0;
        if (j <= i)
            for (int x = 0; x < dk; x++) s += f.qh[((tok0 + i) * d.nk + hk) * dk + x] * kc[j * dk + x];
        Mb[i * L + j] = s * pair_decay(cc, sg, i, j);
    }
    for (int i = threadIdx.x; i < Le; i += blockDim.x) f.cs[(int64_t)bh * d.NL + p0 + i] = cc[i];
    if (f.Tm)
        for (int e = threadIdx.x; e < L * L; e += blockDim.x) f.Tm[((int64_t)bh * d.NC + n) * L * L + e] = Ti[e];
}

// The chunk's decays for rows i < Le (zeros from there to n) under the masks: ec_i = e^{c_i}, eL_i = e^{c_L − c_i}
// (so ec_{Le−1} is S₁'s e^{c_L}).
template <bool DOCS = true>
__device__ __forceinline__ void chunk_decays(float *ec, float *eL, const double *c, int Le, int n, const int *pos,
                                             int64_t tok0) {
    int sL = seg_start<DOCS>(pos, tok0, Le - 1);
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        ec[i] = i < Le && seg_start<DOCS>(pos, tok0, i) < 0 ? expf((float)c[i]) : 0.0f,
        eL[i] = i < Le && i >= sL ? expf((float)(c[Le - 1] - c[i])) : 0.0f;
}

// The state pass (BWD false) from s0 (zeros when NULL) to sT (when not NULL), both (B·nv, dk, dv), or its backward
// (BWD true), the chunks in reverse, from dsT to ds0. Grid (B·nv, ⌈dv / DELTA_VT⌉). The forward writes o (when o is
// not NULL) and S₀ of every chunk and V' (when the backward's scratch is there); the backward dS₁ of every chunk and
// dV'. Shared: St (dk, VT) the state's (its
// gradient's) columns, Vt (L, VT) V' (dV'), Ot (L, VT) dO, the chunk's decays e^c and e^{c_L − c} (L each).
template <typename T, bool BWD> __global__ void delta_chunk_state_kernel(DeltaBufs f, DeltaIO io, ChunkDims d) {
    extern __shared__ float sm[];
    int L = d.L, dk = d.dk, dv = d.dv, nv = d.nv, bh = blockIdx.x, y0 = blockIdx.y * DELTA_VT;
    int VT = dv - y0 < DELTA_VT ? dv - y0 : DELTA_VT, h = bh % nv, hk = h / (nv / d.nk);
    int64_t b = bh / nv;
    float *St = sm, *Vt = St + dk * DELTA_VT, *Ot = Vt + L * DELTA_VT, *ec = Ot + (BWD ? L * DELTA_VT : 0),
          *eL = ec + L;
    const float *in = BWD ? io.dsT : io.s0;
    float *keep = BWD ? f.dS1 : f.S0, *out = BWD ? io.ds0 : io.sT;
    for (int e = threadIdx.x; e < dk * VT; e += blockDim.x)
        St[e] = in ? in[((int64_t)bh * dk + e / VT) * dv + y0 + e % VT] : 0.0f;
    __syncthreads();
    for (int64_t m = 0; m < d.NC; m++) {
        int64_t n = BWD ? d.NC - 1 - m : m, p0 = n * L, tok0 = b * d.S + p0, row0 = (int64_t)bh * d.NL + p0;
        int Le = (int)(d.S - p0 < L ? d.S - p0 : L);
        const float *Mb = f.M + ((int64_t)bh * d.NC + n) * L * L;
        const float *q0 = f.qh + (tok0 * d.nk + hk) * dk, *k0 = f.kh + (tok0 * d.nk + hk) * dk;
        chunk_decays(ec, eL, f.cs + row0, Le, Le, io.pos, tok0);
        if (keep)
            for (int e = threadIdx.x; e < dk * VT; e += blockDim.x)
                keep[(((int64_t)bh * d.NC + n) * dk + e / VT) * dv + y0 + e % VT] = St[e];
        if (BWD) {
            for (int e = threadIdx.x; e < Le * VT; e += blockDim.x)
                Ot[e] = ld((const T *)io.dout, ((tok0 + e / VT) * nv + h) * dv + y0 + e % VT);
            __syncthreads();
            for (int e = threadIdx.x; e < Le * VT; e += blockDim.x) { // dV' = Mᵀ dO + diag(e^{c_L − c}) k dS₁
                int i = e / VT, y = e % VT;
                float s = 0, u = 0;
                for (int j = i; j < Le; j++) s += Mb[j * L + i] * Ot[j * VT + y];
                for (int x = 0; x < dk; x++) u += k0[(int64_t)i * d.nk * dk + x] * St[x * VT + y];
                Vt[e] = s + eL[i] * u;
                f.dVp[(row0 + i) * dv + y0 + y] = Vt[e];
            }
            __syncthreads();
            for (int e = threadIdx.x; e < dk * VT; e += blockDim.x) { // dS₀ = e^{c_L} dS₁ + qᵀ diag(e^c) dO − Wᵀ dV'
                int x = e / VT, y = e % VT;
                float s = ec[Le - 1] * St[e];
                for (int i = 0; i < Le; i++)
                    s += ec[i] * q0[(int64_t)i * d.nk * dk + x] * Ot[i * VT + y] -
                         f.W[(row0 + i) * dk + x] * Vt[i * VT + y];
                St[e] = s;
            }
        } else {
            for (int e = threadIdx.x; e < Le * VT; e += blockDim.x) { // V' = U − W S₀
                int i = e / VT, y = e % VT;
                float s = 0;
                for (int x = 0; x < dk; x++) s += f.W[(row0 + i) * dk + x] * St[x * VT + y];
                Vt[e] = f.U[(row0 + i) * dv + y0 + y] - s;
            }
            __syncthreads();
            if (io.o)
                for (int e = threadIdx.x; e < Le * VT; e += blockDim.x) { // o = e^c (q S₀) + M V'
                    int i = e / VT, y = e % VT;
                    float s = 0, u = 0;
                    for (int x = 0; x < dk; x++) s += q0[(int64_t)i * d.nk * dk + x] * St[x * VT + y];
                    for (int j = 0; j <= i; j++) u += Mb[i * L + j] * Vt[j * VT + y];
                    st((T *)io.o, ((tok0 + i) * nv + h) * dv + y0 + y, ec[i] * s + u);
                }
            if (f.Vp)
                for (int e = threadIdx.x; e < Le * VT; e += blockDim.x)
                    f.Vp[(row0 + e / VT) * dv + y0 + e % VT] = Vt[e];
            __syncthreads();
            for (int e = threadIdx.x; e < dk * VT; e += blockDim.x) { // S₁ = e^{c_L} S₀ + kᵀ diag(e^{c_L − c}) V'
                int x = e / VT, y = e % VT;
                float s = ec[Le - 1] * St[e];
                for (int j = 0; j < Le; j++) s += eL[j] * k0[(int64_t)j * d.nk * dk + x] * Vt[j * VT + y];
                St[e] = s;
            }
        }
        __syncthreads();
    }
    if (out)
        for (int e = threadIdx.x; e < dk * VT; e += blockDim.x)
            out[((int64_t)bh * dk + e / VT) * dv + y0 + e % VT] = St[e];
}

// A chunk's end of the backward, called by the whole block: S₁'s decay e^{c_L} (sd = ⟨S₀, dS₁⟩, and the kg terms z)
// into the last dc (thread 0), then dg (row stride ds) = the reverse cumulative sum of dc over the chunk's Le
// positions, restarted at each document start (sg_i = i; its own dg is 0): thread i sums dc from its document's last
// row down to i, the order of one thread walking the chunk backwards, so the bits do not depend on the block.
template <bool DOCS = true, typename Z>
__device__ void delta_dg(float *dg, int ds, double *dc, const double *cc, const int *sg, const Z *z, double sd,
                         int Le) {
    if (threadIdx.x == 0) {
        double s = enter_decay<DOCS>(cc, sg, Le - 1) * sd;
        for (int j = 0; j < Le; j++) s += z[j];
        dc[Le - 1] += s;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < Le; i += blockDim.x) {
        int e = i + 1; // one past the last row of i's document in the chunk
        while (DOCS && e < Le && sg[e] != e) e++;
        if (!DOCS) e = Le;
        double s = 0;
        for (int m = e - 1; m >= i; m--) s += dc[m];
        dg[(int64_t)i * ds] = DOCS && sg[i] == i ? 0.0f : (float)s;
    }
}

// The rest of the backward, every chunk at once. Grid (NC, B·nv). With D_ij = (dO_i·V'_j) e^{c_i − c_j} (j ≤ i):
//   dq_i = e^{c_i} S₀ dO_i + Σ_j D_ij k_j;  dk_j = Σ_i D_ij q_i + e^{c_L − c_j} dS₁ V'_j + (the A and W terms);
//   dW = −dV' S₀ᵀ, dBv = Tmᵀ dV', dBk = Tmᵀ dW (∂ of β v and β e^c k), dA_ij = −(dBv_i·U_j + dBk_i·W_j) (j < i),
//   dv = β dBv, dβ_i = Σ_j dA_ij (k_i·k_j) e^{c_i − c_j} + dBv_i·v_i + e^{c_i} dBk_i·k_i,
//   and every e^{c_i − c_j} factor sends its log-derivative to dc_i (+) and dc_j (−); dg_m = Σ_{i≥m} dc_i.
// dW, dBv, dBk: (B·nv, NC·L, dk | dv) scratch. Shared: Tm, Dm, Pm (dA·(k_i·k_j)·e), Em (dA·β_i·e): (L, L);
// cc, dc, z (L, fp64); bb (L); 32 for block sums.
template <typename T> __global__ void delta_chunk_grad_kernel(DeltaBufs f, DeltaIO io, ChunkDims d) {
    T *dv_ = (T *)io.dv;
    const T *v = (const T *)io.v, *dout = (const T *)io.dout;
    extern __shared__ float sm[];
    int L = d.L, dk = d.dk, dv = d.dv, n = blockIdx.x, bh = blockIdx.y, nv = d.nv;
    int64_t b = bh / nv, p0 = (int64_t)n * L, tok0 = b * d.S + p0, row0 = (int64_t)bh * d.NL + p0;
    int h = bh % nv, hk = h / (nv / d.nk), Le = (int)(d.S - p0 < L ? d.S - p0 : L), LL = L * L;
    double *cc = (double *)sm, *dc = cc + L, *z = dc + L; // dc in fp64: its terms cancel in dg's cumulative sums
    float *Tm = (float *)(z + L), *Dm = Tm + LL, *Pm = Dm + LL, *Em = Pm + LL, *bb = Em + LL, *red = bb + L;
    int *sg = (int *)(red + 32);
    const float *Mb = f.M + ((int64_t)bh * d.NC + n) * LL, *S0b = f.S0 + ((int64_t)bh * d.NC + n) * dk * dv,
                *dS1b = f.dS1 + ((int64_t)bh * d.NC + n) * dk * dv;
    const float *q0 = f.qh + (tok0 * d.nk + hk) * dk, *k0 = f.kh + (tok0 * d.nk + hk) * dk;
    int64_t ks = (int64_t)d.nk * dk; // row stride of q0, k0
    for (int e = threadIdx.x; e < LL; e += blockDim.x) Tm[e] = f.Tm[((int64_t)bh * d.NC + n) * LL + e];
    for (int i = threadIdx.x; i < Le; i += blockDim.x)
        cc[i] = f.cs[row0 + i], bb[i] = io.beta[(tok0 + i) * nv + h], dc[i] = 0, sg[i] = seg_start(io.pos, tok0, i);
    float sd = 0; // ⟨S₀, dS₁⟩
    for (int e = threadIdx.x; e < dk * dv; e += blockDim.x) sd += S0b[e] * dS1b[e];
    sd = block_sum(sd, red);
    for (int e = threadIdx.x; e < Le * Le; e += blockDim.x) { // dM_ij = dO_i·V'_j
        int i = e / Le, j = e % Le;
        float s = 0;
        if (j <= i)
            for (int y = 0; y < dv; y++) s += ld(dout, ((tok0 + i) * nv + h) * dv + y) * f.Vp[(row0 + j) * dv + y];
        Dm[i * L + j] = s;
    }
    for (int e = threadIdx.x; e < Le * dk; e += blockDim.x) { // dW = −dV' S₀ᵀ
        int i = e / dk, x = e % dk;
        float s = 0;
        for (int y = 0; y < dv; y++) s += f.dVp[(row0 + i) * dv + y] * S0b[x * dv + y];
        f.dW[(row0 + i) * dk + x] = -s;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < Le; i += blockDim.x) { // dc from M: Σ_j dM_ij M_ij − Σ_j dM_ji M_ji
        double s = 0;
        for (int j = 0; j < Le; j++) s += (double)Dm[i * L + j] * Mb[i * L + j] - (double)Dm[j * L + i] * Mb[j * L + i];
        dc[i] += s;
    }
    for (int e = threadIdx.x; e < Le * dv; e += blockDim.x) { // dBv = Tmᵀ dV'
        int m = e / dv, y = e % dv;
        float s = 0;
        for (int i = m; i < Le; i++) s += Tm[i * L + m] * f.dVp[(row0 + i) * dv + y];
        f.dBv[(row0 + m) * dv + y] = s;
    }
    for (int e = threadIdx.x; e < Le * dk; e += blockDim.x) { // dBk = Tmᵀ dW
        int m = e / dk, x = e % dk;
        float s = 0;
        for (int i = m; i < Le; i++) s += Tm[i * L + m] * f.dW[(row0 + i) * dk + x];
        f.dBk[(row0 + m) * dk + x] = s;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < Le * Le; e += blockDim.x) { // D = dM·e^{c_i − c_j}; dA → Pm, Em
        int i = e / Le, j = e % Le;
        float dec = pair_decay(cc, sg, i, j), kk = 0, dA = 0;
        Dm[i * L + j] *= dec;
        if (j < i) {
            for (int x = 0; x < dk; x++) kk += k0[i * ks + x] * k0[j * ks + x];
            for (int y = 0; y < dv; y++) dA -= f.dBv[(row0 + i) * dv + y] * f.U[(row0 + j) * dv + y];
            for (int x = 0; x < dk; x++) dA -= f.dBk[(row0 + i) * dk + x] * f.W[(row0 + j) * dk + x];
        }
        Pm[i * L + j] = dA * kk * dec, Em[i * L + j] = dA * bb[i] * dec;
    }
    for (int e = threadIdx.x; e < Le * dk; e += blockDim.x) { // the S₀ and S₁ terms of dq, dk
        int i = e / dk, x = e % dk;
        float s = 0, u = 0;
        for (int y = 0; y < dv; y++)
            s += S0b[x * dv + y] * ld(dout, ((tok0 + i) * nv + h) * dv + y),
                u += dS1b[x * dv + y] * f.Vp[(row0 + i) * dv + y];
        f.gq[((tok0 + i) * nv + h) * dk + x] = enter_decay(cc, sg, i) * s;
        f.gk[((tok0 + i) * nv + h) * dk + x] = pair_decay(cc, sg, Le - 1, i) * u;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < Le; i += blockDim.x) {
        double pr = 0, pc = 0, bv = 0, bk = 0, qg = 0, kg = 0;
        for (int j = 0; j < Le; j++) pr += Pm[i * L + j], pc += bb[j] * Pm[j * L + i];
        for (int y = 0; y < dv; y++) bv += f.dBv[(row0 + i) * dv + y] * ld(v, ((tok0 + i) * nv + h) * dv + y);
        for (int x = 0; x < dk; x++) {
            bk += f.dBk[(row0 + i) * dk + x] * k0[i * ks + x];
            qg += q0[i * ks + x] * f.gq[((tok0 + i) * nv + h) * dk + x];
            kg += k0[i * ks + x] * f.gk[((tok0 + i) * nv + h) * dk + x];
        }
        double eb = enter_decay(cc, sg, i) * bk;
        io.dbeta[(tok0 + i) * nv + h] = (float)(pr + bv + eb);
        dc[i] += bb[i] * pr - pc + bb[i] * eb + qg - kg;
        z[i] = kg;
    }
    __syncthreads();
    delta_dg(io.dg + tok0 * nv + h, nv, dc, cc, sg, z, sd, Le);
    for (int e = threadIdx.x; e < Le * dv; e += blockDim.x) {
        int i = e / dv, y = e % dv;
        st(dv_, ((tok0 + i) * nv + h) * dv + y, bb[i] * f.dBv[(row0 + i) * dv + y]);
    }
    for (int e = threadIdx.x; e < Le * dk; e += blockDim.x) { // the M, A and W terms of dq, dk
        int i = e / dk, x = e % dk;
        float sq = 0, sk = 0;
        for (int j = 0; j < Le; j++) {
            sq += Dm[i * L + j] * k0[j * ks + x];
            sk += Dm[j * L + i] * q0[j * ks + x] + (Em[i * L + j] + Em[j * L + i]) * k0[j * ks + x];
        }
        f.gq[((tok0 + i) * nv + h) * dk + x] += sq;
        f.gk[((tok0 + i) * nv + h) * dk + x] += sk + bb[i] * enter_decay(cc, sg, i) * f.dBk[(row0 + i) * dk + x];
    }
}

// ---- the tensor-core form (bf16 data, dk = dv = 128, chunk 64) ----
// The SIMT kernels' terms with every product on mma.sync m16n8k16 (bf16 operands in shared memory, fp32
// accumulators; cuda_mma.cuh has the fragment layouts). The state and its gradient stay fp32 in registers and enter
// products as bf16 copies; the per-chunk intermediates are bf16 in the scratch (in the SIMT kernels' places), so that
// every tile comes in by cp.async — all but U, which the state pass reads in fp32: V' = U − W S cancels (the state
// predicts v), and a bf16 U there moves dg well off the fp64 reference; tc_grad's product takes a bf16 copy.
// The 8 warps of a block split each product (warp tiles of 16 rows). The state pass is sequential over chunks per
// (sequence, value head, 64 value columns), those columns of the state in registers (warp w holds rows 16w..16w+15)
// and the next chunk's tiles loading while this one computes. A two-pass form (chunk-local states in parallel, then
// a scan) would need each chunk's dk × dk map S ↦ (e^{c_L} I − kᵀ e^{c_L − c} W) S + kᵀ e^{c_L − c} U and a
// dk × dk × dv product per combine, more work than the whole sequential pass, which already fills every SM.
#define TC_L 64  // positions per chunk
#define TC_D 128 // dk = dv
#define TC_VT 64 // state columns per state-pass block
#define LDD 136  // row stride (elements) of a 128-wide bf16 tile: 16 bytes of padding (cuda_mma.cuh)
#define LDL 72   // of a 64-wide one
#define TC_THREADS 256

// The scratch as the tensor-core kernels see it: bf16 data in the fp32 pieces' places (S₀ in bf16 in the second half
// of dS₁'s, in fp32 in S₀'s), U in fp32 and its bf16 copy in dW's place, sd = ⟨S₀, dS₁⟩ (B·nv, NC) in dBv's.
typedef struct {
    bf16 *qh, *kh, *W, *M, *Tm, *S0, *dS1, *Vp, *dVp, *Ub;
    float *U, *S0f, *sd, *gq, *gk;
    double *cs;
} TcBufs;

// The warps' split of an M × N product: WM = M/16 warps along the rows, WN = 8/WM along the columns, each with NT
// n-tiles of 8 columns.
template <int M, int N> struct TcTile { static constexpr int WM = M / 16, WN = 8 / WM, NT = N / WN / 8; };

// acc += A·B over this warp's block of the M × N product, K a multiple of 16. A stored [m][k] (AKM: [k][m]),
// B stored [n][k] (BKN: [k][n]), bf16 shared tiles of row strides LDA, LDB.
template <int M, int N, int K, bool AKM, bool BKN, int LDA, int LDB>
__device__ __forceinline__ void tc_mma(float (&acc)[TcTile<M, N>::NT][4], const bf16 *A, const bf16 *B) {
    typedef TcTile<M, N> Tl;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int m0 = (warp % Tl::WM) * 16, n0 = (warp / Tl::WM) * (N / Tl::WN);
#pragma unroll
    for (int k0 = 0; k0 < K; k0 += 16) {
        uint32_t a[4];
        if (AKM) ldsm_x4_trans(a, frag_a_km<LDA>(A, k0, m0, lane));
        else ldsm_x4(a, frag_a_mk<LDA>(A, m0, k0, lane));
#pragma unroll
        for (int j = 0; j < Tl::NT / 2; j++) {
            uint32_t b[4];
            if (BKN) ldsm_x4_trans(b, frag_b_kn<LDB>(B, k0, n0 + 16 * j, lane));
            else ldsm_x4(b, frag_b_nk<LDB>(B, n0 + 16 * j, k0, lane));
            mma_bf16(acc[2 * j], a, b[0], b[1]);
            mma_bf16(acc[2 * j + 1], a, b[2], b[3]);
        }
    }
}

// acc = A·B (tc_mma from zeros).
template <int M, int N, int K, bool AKM, bool BKN, int LDA, int LDB>
__device__ __forceinline__ void tc_mm(float (&acc)[TcTile<M, N>::NT][4], const bf16 *A, const bf16 *B) {
#pragma unroll
    for (int j = 0; j < TcTile<M, N>::NT; j++)
        for (int q = 0; q < 4; q++) acc[j][q] = 0.0f;
    tc_mma<M, N, K, AKM, BKN, LDA, LDB>(acc, A, B);
}

// a[j][q] = f(a[j][q], b[j][q]) over two accumulators of one layout.
template <int M, int N, class F>
__device__ __forceinline__ void tc_zip(float (&a)[TcTile<M, N>::NT][4], const float (&b)[TcTile<M, N>::NT][4], F f) {
#pragma unroll
    for (int j = 0; j < TcTile<M, N>::NT; j++)
#pragma unroll
        for (int q = 0; q < 4; q++) a[j][q] = f(a[j][q], b[j][q]);
}

// f(row, column, v0, v1) for each pair of this warp's accumulator elements at (row, column) and (row, column + 1),
// column even (v0, v1 by reference: f may rewrite them): one 4- or 8-byte access where single elements take two.
template <int M, int N, class F> __device__ __forceinline__ void tc_pairs(float (&acc)[TcTile<M, N>::NT][4], F f) {
    typedef TcTile<M, N> Tl;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int m0 = (warp % Tl::WM) * 16 + (lane >> 2), n0 = (warp / Tl::WM) * (N / Tl::WN) + 2 * (lane & 3);
#pragma unroll
    for (int j = 0; j < Tl::NT; j++)
#pragma unroll
        for (int h = 0; h < 2; h++) f(m0 + 8 * h, n0 + 8 * j, acc[j][2 * h], acc[j][2 * h + 1]);
}
// f(row, column, value) for each accumulator element of this warp, in tc_pairs' order.
template <int M, int N, class F> __device__ __forceinline__ void tc_each(float (&acc)[TcTile<M, N>::NT][4], F f) {
    tc_pairs<M, N>(acc, [&](int r, int c, float &x0, float &x1) { f(r, c, x0), f(r, c + 1, x1); });
}
__device__ __forceinline__ void st2(bf16 *p, float a, float b) { *(__nv_bfloat162 *)p = __floats2bfloat162_rn(a, b); }
__device__ __forceinline__ void st2(float *p, float a, float b) { *(float2 *)p = make_float2(a, b); }

// dst[row] (shared, zeroed) += Σ over the row of f(row, column, value): lane sums, then the 4 lanes of a row, then
// one shared atomic per warp and row — at most two warps a row, and two adds onto zero give the same bits in either
// order, so the sum does not depend on the schedule.
template <int M, int N, class F>
__device__ __forceinline__ void tc_rowsum(float *dst, float (&acc)[TcTile<M, N>::NT][4], F f) {
    static_assert(TcTile<M, N>::WN <= 2, "a row's sum takes at most two atomic adds");
    int lane = threadIdx.x & 31, r0 = (threadIdx.x >> 5) % TcTile<M, N>::WM * 16 + (lane >> 2);
    float p[2] = {0.0f, 0.0f};
    tc_each<M, N>(acc, [&](int r, int c, float &x) { p[(r - r0) >> 3] += f(r, c, x); });
#pragma unroll
    for (int i = 0; i < 2; i++) {
        p[i] += __shfl_xor_sync(0xffffffffu, p[i], 1);
        p[i] += __shfl_xor_sync(0xffffffffu, p[i], 2);
    }
    if ((lane & 3) == 0) atomicAdd(dst + r0, p[0]), atomicAdd(dst + r0 + 8, p[1]);
}

// Fixed-order fp64 sums over the accumulator tile, no atomics: rows[w·M + r] = Σ of fr(r, c, x) over warp column w's
// part of row r (WN slots a row), cols[w·N + c] = Σ of fc(r, c, x) over warp row w's part of column c (WM slots a
// column). Each slot has one writer, and its terms are added in one order: the caller adds the slots in order.
template <int M, int N, class FR, class FC>
__device__ __forceinline__ void tc_sums(double *rows, double *cols, float (&acc)[TcTile<M, N>::NT][4], FR fr, FC fc) {
    typedef TcTile<M, N> Tl;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, wm = warp % Tl::WM, wn = warp / Tl::WM;
    int r0 = wm * 16 + (lane >> 2), c0 = wn * (N / Tl::WN) + 2 * (lane & 3);
    double p[2] = {0.0, 0.0}, q[Tl::NT][2];
#pragma unroll
    for (int j = 0; j < Tl::NT; j++)
#pragma unroll
        for (int b = 0; b < 2; b++) {
            int c = c0 + 8 * j + b;
            p[0] += fr(r0, c, acc[j][b]), p[1] += fr(r0 + 8, c, acc[j][2 + b]);
            q[j][b] = fc(r0, c, acc[j][b]) + fc(r0 + 8, c, acc[j][2 + b]);
        }
#pragma unroll
    for (int h = 0; h < 2; h++) { // the 4 lanes of a row
        p[h] += __shfl_xor_sync(0xffffffffu, p[h], 1);
        p[h] += __shfl_xor_sync(0xffffffffu, p[h], 2);
    }
#pragma unroll
    for (int j = 0; j < Tl::NT; j++) // the 8 lanes of a column
#pragma unroll
        for (int b = 0; b < 2; b++)
#pragma unroll
            for (int o = 4; o < 32; o <<= 1) q[j][b] += __shfl_xor_sync(0xffffffffu, q[j][b], o);
    if ((lane & 3) == 0) rows[wn * M + r0] = p[0], rows[wn * M + r0 + 8] = p[1];
    if (lane < 4)
#pragma unroll
        for (int j = 0; j < Tl::NT; j++)
#pragma unroll
            for (int b = 0; b < 2; b++) cols[wm * N + c0 + 8 * j + b] = q[j][b];
}

// Starts the copy (cp.async, 16 bytes a piece) of a rows × W bf16 tile (row stride LD) from global rows r at
// src + r·rs (16-byte aligned); rows from n on are zero-filled.
template <int W, int LD>
__device__ __forceinline__ void tc_copy(bf16 *dst, const bf16 *src, int64_t rs, int rows, int n) {
    constexpr int P = W / 8; // pieces per row
    for (int e = threadIdx.x; e < rows * P; e += blockDim.x) {
        int r = e / P, c = (e % P) * 8;
        cp_async16(smem_addr(dst + r * LD + c), src + (r < n ? r * rs + c : 0), r < n);
    }
}
__device__ __forceinline__ float bf(const bf16 *p, int i) { return __bfloat162float(p[i]); }

// Per chunk, every chunk at once: c (fp64), A = β (k kᵀ) e^{c_i − c_j} (j < i), Tm = (I + A)⁻¹ by forward
// substitution (fp32), U = (Tm diag β) v, W = (Tm diag(β e^c)) k, M = (q kᵀ) e^{c_i − c_j} (j ≤ i), all written
// whole (zeros outside the chunk's Le positions): U in fp32 (and in bf16 into Ub when not NULL), the rest in bf16.
// Grid (NC, B·nv).
template <bool DOCS> __global__ void __launch_bounds__(TC_THREADS) tc_prep_kernel(TcBufs f, DeltaIO io, ChunkDims d) {
    const bf16 *v = (const bf16 *)io.v;
    extern __shared__ __align__(16) unsigned char smb[];
    int n = blockIdx.x, bh = blockIdx.y, nv = d.nv, h = bh % nv, hk = h / (nv / d.nk);
    int64_t b = bh / nv, p0 = (int64_t)n * TC_L, tok0 = b * d.S + p0, row0 = (int64_t)bh * d.NL + p0;
    int Le = (int)(d.S - p0 < TC_L ? d.S - p0 : TC_L);
    bf16 *Ks = (bf16 *)smb, *Qs = Ks + TC_L * LDD, *Vs = Qs + TC_L * LDD, *Tv = Vs + TC_L * LDD, *Tk = Tv + TC_L * LDL;
    float *Am = (float *)(Tk + TC_L * LDL), *Ti = Am + TC_L * (TC_L + 1), *bb = Ti + TC_L * (TC_L + 1), *be = bb + TC_L;
    double *cc = (double *)(be + TC_L);
    int *sg = (int *)(cc + TC_L);
    int64_t ks = (int64_t)d.nk * TC_D;
    tc_copy<TC_D, LDD>(Ks, f.kh + tok0 * ks + hk * TC_D, ks, TC_L, Le);
    tc_copy<TC_D, LDD>(Qs, f.qh + tok0 * ks + hk * TC_D, ks, TC_L, Le);
    tc_copy<TC_D, LDD>(Vs, v + (tok0 * nv + h) * TC_D, (int64_t)nv * TC_D, TC_L, Le);
    cp_async_commit();
    // c, β and the document starts, a position a thread: c is an fp64 inclusive scan, each warp's 32 positions by
    // shuffles, then warp 1 adds warp 0's total (the loads of one chunk in flight at once, not one after another).
    static_assert(TC_L == 64, "the scan of c is two warps");
    if (threadIdx.x < TC_L) {
        int i = threadIdx.x, lane = i & 31;
        double s = i < Le ? (double)io.g[(tok0 + i) * nv + h] : 0.0;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            double t = __shfl_up_sync(0xffffffffu, s, o);
            if (lane >= o) s += t;
        }
        cc[i] = s, bb[i] = i < Le ? io.beta[(tok0 + i) * nv + h] : 0.0f;
        sg[i] = i < Le ? seg_start<DOCS>(io.pos, tok0, i) : -1;
    }
    __syncthreads();
    if (threadIdx.x >= 32 && threadIdx.x < TC_L) cc[threadIdx.x] += cc[31];
    __syncthreads();
    if (threadIdx.x < TC_L) be[threadIdx.x] = bb[threadIdx.x] * enter_decay<DOCS>(cc, sg, threadIdx.x);
    cp_async_wait<0>();
    __syncthreads();
    {
        float acc[TcTile<64, 64>::NT][4];
        tc_mm<64, 64, TC_D, false, false, LDD, LDD>(acc, Ks, Ks);
        tc_each<64, 64>(acc, [&](int r, int c, float &x) {
            Am[r * (TC_L + 1) + c] = c < r && r < Le ? bb[r] * x * pair_decay<DOCS>(cc, sg, r, c) : 0.0f;
        });
        tc_mm<64, 64, TC_D, false, false, LDD, LDD>(acc, Qs, Ks);
        bf16 *Mb = f.M + ((int64_t)bh * d.NC + n) * TC_L * TC_L;
        tc_pairs<64, 64>(acc, [&](int r, int c, float &x0, float &x1) {
            st2(Mb + r * TC_L + c, r < Le ? x0 * pair_decay<DOCS>(cc, sg, r, c) : 0.0f,
                r < Le ? x1 * pair_decay<DOCS>(cc, sg, r, c + 1) : 0.0f);
        });
    }
    __syncthreads();
    // T = (I + A)⁻¹ (lower, unit diagonal) in blocks of 16, every thread busy after the first step: the diagonal
    // blocks T_II = (I + A_II)⁻¹ by forward substitution, a column a thread (T_im = δ_im − Σ_{j<i} A_ij T_jm); then
    // B_IK = T_II A_IK for every K < I at once; then the block rows in order, T_IJ = −Σ_{K=J}^{I−1} B_IK T_KJ (from
    // (I + A) T = I). The upper blocks are never written, and they and the rows from Le on are dropped where T is used.
    static_assert(TC_L == 64 && TC_THREADS == 256, "T in 4 × 4 blocks of 16, a block's elements a thread each");
    float *Bk = (float *)Tv; // B_IK (16 × 16) at I(I − 1)/2 + K: Tv is free until T is done
    if (threadIdx.x < TC_L) {
        int o = threadIdx.x / 16 * 16, m = threadIdx.x % 16;
        float t[16];
#pragma unroll
        for (int i = 0; i < 16; i++) {
            const float *a = Am + (o + i) * (TC_L + 1) + o;
            float s = i == m ? 1.0f : 0.0f;
#pragma unroll
            for (int j = 0; j < i; j++) s -= a[j] * t[j];
            t[i] = i >= m ? s : 0.0f;
            Ti[(o + i) * (TC_L + 1) + o + m] = t[i];
        }
    }
    __syncthreads();
    int br = threadIdx.x / 16, bc = threadIdx.x % 16; // this thread's element of a 16 × 16 block
    for (int p = 0; p < 6; p++) {
        int I = p < 1 ? 1 : p < 3 ? 2 : 3, K = p - I * (I - 1) / 2;
        const float *t = Ti + (16 * I + br) * (TC_L + 1) + 16 * I, *a = Am + 16 * I * (TC_L + 1) + 16 * K + bc;
        float s = 0;
#pragma unroll
        for (int x = 0; x < 16; x++) s += t[x] * a[x * (TC_L + 1)];
        Bk[p * 256 + threadIdx.x] = s;
    }
    __syncthreads();
    for (int I = 1; I < 4; I++) {
        for (int J = 0; J < I; J++) {
            float s = 0;
            for (int K = J; K < I; K++) {
                const float *b = Bk + (I * (I - 1) / 2 + K) * 256 + br * 16,
                            *t = Ti + 16 * K * (TC_L + 1) + 16 * J + bc;
#pragma unroll
                for (int x = 0; x < 16; x++) s += b[x] * t[x * (TC_L + 1)];
            }
            Ti[(16 * I + br) * (TC_L + 1) + 16 * J + bc] = -s;
        }
        __syncthreads();
    }
    bf16 *Tb = f.Tm ? f.Tm + ((int64_t)bh * d.NC + n) * TC_L * TC_L : NULL;
    for (int e = threadIdx.x; e < TC_L * TC_L; e += blockDim.x) {
        int i = e / TC_L, m = e % TC_L;
        float t = m <= i && i < Le ? Ti[i * (TC_L + 1) + m] : 0.0f;
        Tv[i * LDL + m] = __float2bfloat16(t * bb[m]), Tk[i * LDL + m] = __float2bfloat16(t * be[m]);
        if (Tb) Tb[e] = __float2bfloat16(t);
    }
    __syncthreads();
    float acc[TcTile<64, 128>::NT][4];
    tc_mm<64, 128, TC_L, false, true, LDL, LDD>(acc, Tv, Vs);
    tc_pairs<64, 128>(acc, [&](int r, int c, float &x0, float &x1) {
        st2(f.U + (row0 + r) * TC_D + c, x0, x1);
        if (f.Ub) st2(f.Ub + (row0 + r) * TC_D + c, x0, x1);
    });
    tc_mm<64, 128, TC_L, false, true, LDL, LDD>(acc, Tk, Ks);
    tc_pairs<64, 128>(acc, [&](int r, int c, float &x0, float &x1) { st2(f.W + (row0 + r) * TC_D + c, x0, x1); });
    for (int i = threadIdx.x; i < TC_L; i += blockDim.x) f.cs[row0 + i] = cc[i];
}
#define TC_PREP_SMEM                                                                                                   \
    ((3 * TC_L * LDD + 2 * TC_L * LDL) * 2 + (TC_L * (TC_L + 1) + TC_L * (TC_L + 1) + 2 * TC_L) * 4 + TC_L * 8 +       \
     TC_L * 4)

// One chunk's tiles of the state passes (one of two stages): W, q, k (64 × 128), M (64 × 64), X: the chunk's dO
// columns y0.. (64 × 64; the backward's), and C: its cumulative decays c (64 fp64).
typedef struct {
    bf16 *W, *Q, *K, *M, *X;
    double *C;
} TcStage;
__device__ __forceinline__ TcStage tc_stage(bf16 *p) {
    bf16 *m = p + 3 * TC_L * LDD;
    TcStage s = {p, p + TC_L * LDD, p + 2 * TC_L * LDD, m, m + TC_L * LDL, (double *)(m + 2 * TC_L * LDL)};
    return s;
}
#define TC_STAGE (3 * TC_L * LDD + 2 * TC_L * LDL + 4 * TC_L) // elements (C: 4 bf16 a value)

// Starts chunk n's copies into stage s; X from x (rows xs apart, columns y0..) when x is not NULL.
__device__ __forceinline__ void tc_stage_load(TcStage s, int64_t n, int bh, int hk, const TcBufs &f, const bf16 *x,
                                              int64_t xs, const ChunkDims &d) {
    int64_t p0 = n * TC_L, tok0 = (bh / d.nv) * d.S + p0, row0 = (int64_t)bh * d.NL + p0, ks = (int64_t)d.nk * TC_D;
    int Le = (int)(d.S - p0 < TC_L ? d.S - p0 : TC_L);
    tc_copy<TC_D, LDD>(s.W, f.W + row0 * TC_D, TC_D, TC_L, Le);
    tc_copy<TC_D, LDD>(s.Q, f.qh + tok0 * ks + hk * TC_D, ks, TC_L, Le);
    tc_copy<TC_D, LDD>(s.K, f.kh + tok0 * ks + hk * TC_D, ks, TC_L, Le);
    tc_copy<TC_L, LDL>(s.M, f.M + ((int64_t)bh * d.NC + n) * TC_L * TC_L, TC_L, TC_L, TC_L);
    if (x) tc_copy<TC_VT, LDL>(s.X, x, xs, TC_L, Le);
    for (int e = threadIdx.x; e < TC_L / 2; e += blockDim.x)
        cp_async16(smem_addr(s.C + 2 * e), f.cs + row0 + 2 * e, true);
    cp_async_commit();
}

// The state pass (BWD false) from s0 (zeros when NULL) to sT (when not NULL), or its backward (BWD true), the chunks
// in reverse, from dsT to ds0. Grid (B·nv, dv / TC_VT). S: the state's (its gradient's) columns in registers, Sb their
// bf16 copy. Forward, per chunk: V' = U − W Sb (U fp32, read into registers while the chunk's tiles arrive),
// o = e^c (q Sb) + M V' (when o is not NULL; else S₀ of every chunk, in bf16 for tc_grad's products and in fp32 for
// sd, and V' are written), S ← e^{c_L} S + kᵀ (e^{c_L − c} V'). Backward: dS first written as dS₁ (bf16) with its part
// of sd = ⟨S₀, dS₁⟩, then dV' = e^{c_L − c} (k dSb) + Mᵀ dO, dS ← e^{c_L} dS + qᵀ (e^c dO) − Wᵀ dV'. sd from the fp32
// S₀ and dS: dg's terms cancel (a bf16 S₀ there moves dg well off the fp64 reference).
template <bool BWD, bool DOCS>
__global__ void __launch_bounds__(TC_THREADS) tc_state_kernel(TcBufs f, DeltaIO io, ChunkDims d) {
    extern __shared__ __align__(16) unsigned char smb[];
    int bh = blockIdx.x, y0 = blockIdx.y * TC_VT, nv = d.nv, h = bh % nv, hk = h / (nv / d.nk);
    int64_t b = bh / nv, os = (int64_t)nv * TC_D;
    // X1, X2 (64 × 64): V' and e^{c_L − c} V' (forward), e^c dO and −dV' (backward)
    bf16 *Sb = (bf16 *)smb + 2 * TC_STAGE, *X1 = Sb + TC_D * LDL, *X2 = X1 + TC_L * LDL;
    float *ec = (float *)(X2 + TC_L * LDL), *eL = ec + TC_L, *red = eL + TC_L;
    float S[TcTile<128, TC_VT>::NT][4]; // rows x, columns y0 + y
    const float *in = BWD ? io.dsT : io.s0, *sb0 = in ? in + (int64_t)bh * TC_D * TC_D + y0 : NULL;
    float *out = BWD ? io.ds0 : io.sT;
    tc_each<128, TC_VT>(S, [&](int x, int y, float &s) { s = sb0 ? sb0[x * TC_D + y] : 0.0f; });
    const bf16 *o0 = BWD ? (const bf16 *)io.dout + (b * d.S * nv + h) * TC_D + y0 : NULL; // position 0's dO columns
    auto load = [&](int64_t n) { // chunk n's tiles into its stage
        tc_stage_load(tc_stage((bf16 *)smb + (n & 1) * TC_STAGE), n, bh, hk, f, BWD ? o0 + n * TC_L * os : NULL, os, d);
    };
    // Loaded a chunk ahead into registers, in tc_pairs' order: the backward's fp32 S₀ (for sd), the forward's U.
    float2 pre[BWD ? TcTile<128, TC_VT>::NT * 2 : TcTile<64, TC_VT>::NT * 2];
    auto prefetch = [&](int64_t n) {
        int k = 0;
        if (BWD) {
            const float *s0f = f.S0f + ((int64_t)bh * d.NC + n) * TC_D * TC_D + y0;
            tc_pairs<128, TC_VT>(
                S, [&](int x, int y, float &, float &) { pre[k++] = *(const float2 *)(s0f + x * TC_D + y); });
        } else {
            const float *u = f.U + ((int64_t)bh * d.NL + n * TC_L) * TC_D + y0;
            float z[TcTile<64, TC_VT>::NT][4];
            tc_pairs<64, TC_VT>(
                z, [&](int i, int y, float &, float &) { pre[k++] = *(const float2 *)(u + i * TC_D + y); });
        }
    };
    load(BWD ? d.NC - 1 : 0);
    prefetch(BWD ? d.NC - 1 : 0);
    for (int64_t m = 0; m < d.NC; m++) {
        int64_t n = BWD ? d.NC - 1 - m : m, p0 = n * TC_L, tok0 = b * d.S + p0, row0 = (int64_t)bh * d.NL + p0;
        int64_t cb = (int64_t)bh * d.NC + n, sc = cb * TC_D * TC_D + y0;
        int Le = (int)(d.S - p0 < TC_L ? d.S - p0 : TC_L);
        TcStage c = tc_stage((bf16 *)smb + (n & 1) * TC_STAGE);
        float part = 0, u[TcTile<64, TC_VT>::NT][4]; // u: U in the accumulator's layout
        int k = 0;
        tc_pairs<128, TC_VT>(S, [&](int x, int y, float &s0, float &s1) {
            int64_t e = sc + x * TC_D + y;
            st2(Sb + x * LDL + y, s0, s1);
            if (BWD) {
                float2 a = pre[k++];
                st2(f.dS1 + e, s0, s1), part += s0 * a.x, part += s1 * a.y;
            } else if (f.S0) st2(f.S0 + e, s0, s1), st2(f.S0f + e, s0, s1);
        });
        if (BWD) {
            part = block_sum(part, red);
            static_assert(TC_D / TC_VT <= 2, "sd: two column blocks add onto zero, one sum in either order");
            if (threadIdx.x == 0) atomicAdd(f.sd + cb, part);
        } else tc_pairs<64, TC_VT>(u, [&](int, int, float &x0, float &x1) { x0 = pre[k].x, x1 = pre[k].y, k++; });
        if (m + 1 < d.NC) { // the last chunk's reads of that stage ended at the previous iteration's barrier
            load(BWD ? n - 1 : n + 1);
            prefetch(BWD ? n - 1 : n + 1);
            cp_async_wait<1>();
        } else cp_async_wait<0>();
        __syncthreads();
        chunk_decays<DOCS>(ec, eL, c.C, Le, TC_L, io.pos, tok0);
        __syncthreads();
        float acc[TcTile<64, TC_VT>::NT][4];
        if (BWD) {
            for (int e = threadIdx.x; e < TC_L * TC_VT; e += blockDim.x) { // e^c dO
                int i = e / TC_VT, y = e % TC_VT;
                X1[i * LDL + y] = __float2bfloat16(ec[i] * bf(c.X, i * LDL + y));
            }
            tc_mm<64, TC_VT, TC_D, false, true, LDD, LDL>(acc, c.K, Sb);
            tc_each<64, TC_VT>(acc, [&](int i, int, float &x) { x *= eL[i]; });
            tc_mma<64, TC_VT, TC_L, true, true, LDL, LDL>(acc, c.M, c.X);
            tc_pairs<64, TC_VT>(acc, [&](int i, int y, float &x0, float &x1) {
                float v0 = i < Le ? x0 : 0.0f, v1 = i < Le ? x1 : 0.0f;
                st2(f.dVp + (row0 + i) * TC_D + y0 + y, v0, v1), st2(X2 + i * LDL + y, -v0, -v1);
            });
            __syncthreads();
            float eCL = ec[Le - 1];
            tc_each<128, TC_VT>(S, [&](int, int, float &s) { s *= eCL; });
            tc_mma<128, TC_VT, TC_L, true, true, LDD, LDL>(S, c.Q, X1);
            tc_mma<128, TC_VT, TC_L, true, true, LDD, LDL>(S, c.W, X2);
        } else {
            tc_mm<64, TC_VT, TC_D, false, true, LDD, LDL>(acc, c.W, Sb);
            tc_zip<64, TC_VT>(acc, u, [](float x, float y) { return y - x; });
            tc_pairs<64, TC_VT>(acc, [&](int i, int y, float &x0, float &x1) {
                float v0 = i < Le ? x0 : 0.0f, v1 = i < Le ? x1 : 0.0f;
                st2(X1 + i * LDL + y, v0, v1), st2(X2 + i * LDL + y, eL[i] * v0, eL[i] * v1);
                if (f.Vp) st2(f.Vp + (row0 + i) * TC_D + y0 + y, v0, v1);
            });
            __syncthreads();
            if (io.o) {
                tc_mm<64, TC_VT, TC_D, false, true, LDD, LDL>(acc, c.Q, Sb);
                tc_each<64, TC_VT>(acc, [&](int i, int, float &x) { x *= ec[i]; });
                tc_mma<64, TC_VT, TC_L, false, true, LDL, LDL>(acc, c.M, X1);
                tc_pairs<64, TC_VT>(acc, [&](int i, int y, float &x0, float &x1) {
                    if (i < Le) st2((bf16 *)io.o + ((tok0 + i) * nv + h) * TC_D + y0 + y, x0, x1);
                });
            }
            float eCL = ec[Le - 1];
            tc_each<128, TC_VT>(S, [&](int, int, float &s) { s *= eCL; });
            tc_mma<128, TC_VT, TC_L, true, true, LDD, LDL>(S, c.K, X2);
        }
        __syncthreads(); // every read of this chunk's tiles, Sb, X1, X2, ec and eL is done
    }
    if (out)
        tc_pairs<128, TC_VT>(S, [&](int x, int y, float &s0, float &s1) {
            st2(out + (int64_t)bh * TC_D * TC_D + x * TC_D + y0 + y, s0, s1);
        });
}
#define TC_STATE_SMEM ((2 * TC_STAGE + TC_D * LDL + 2 * TC_L * LDL) * 2 + (2 * TC_L + 32) * 4)

// The rest of the backward, every chunk at once, with the terms of delta_chunk_grad_kernel above. Grid (NC, B·nv).
// gq and gk accumulate in registers through the phases: (1) dM = dO V'ᵀ (its dc terms with M, D = dM e^{c_i − c_j}),
// gq = e^c (dO S₀ᵀ), dW = −dV' S₀ᵀ; (2) gk = e^{c_L − c} (V' dS₁ᵀ), dBv = Tmᵀ dV' (dv = β dBv), dBk = Tmᵀ dW
// (gk += β e^c dBk); (3) dA = −(dBv Uᵀ + dBk Wᵀ) with k kᵀ into P = dA (k kᵀ) e, E = dA β e; (4) gq += D k,
// gk += Dᵀ q + (E + Eᵀ) k; then dβ and dc from the row sums, dg the reverse cumulative sum of dc. sd: ⟨S₀, dS₁⟩
// per chunk (from tc_state_kernel<true>).
template <bool DOCS> __global__ void __launch_bounds__(TC_THREADS) tc_grad_kernel(TcBufs f, DeltaIO io, ChunkDims d) {
    bf16 *dv_ = (bf16 *)io.dv;
    const bf16 *v = (const bf16 *)io.v, *dout = (const bf16 *)io.dout;
    extern __shared__ __align__(16) unsigned char smb[];
    int n = blockIdx.x, bh = blockIdx.y, nv = d.nv, h = bh % nv, hk = h / (nv / d.nk);
    int64_t b = bh / nv, p0 = (int64_t)n * TC_L, tok0 = b * d.S + p0, row0 = (int64_t)bh * d.NL + p0;
    int Le = (int)(d.S - p0 < TC_L ? d.S - p0 : TC_L);
    int64_t ks = (int64_t)d.nk * TC_D, vs = (int64_t)nv * TC_D, cb = ((int64_t)bh * d.NC + n);
    bf16 *Qs = (bf16 *)smb, *Ks = Qs + TC_L * LDD, *X2 = Ks + TC_L * LDD, *X3 = X2 + TC_L * LDD, *dVs = X3 + TC_L * LDD,
         *dWs = dVs + TC_L * LDD, *dBvs = dWs + TC_L * LDD, *dBks = dBvs + TC_L * LDD;
    bf16 *Big = dBks + TC_L * LDD, *Tms = Big + TC_D * LDD, *Ds = Tms + TC_L * LDL, *ES = Ds + TC_L * LDL;
    float *Em = (float *)Big; // (64, 65) fp32 over Big once S₀ and dS₁ are done
    double *cc = (double *)(ES + TC_L * LDL), *dc = cc + TC_L, *part = dc + TC_L; // part: tc_sums' 2 + 4 slots
    float *bb = (float *)(part + 6 * TC_L), *r_bv = bb + TC_L, *r_bk = r_bv + TC_L, *r_qg = r_bk + TC_L,
          *r_kg = r_qg + TC_L;
    int *sg = (int *)(r_kg + TC_L);
    tc_copy<TC_D, LDD>(Qs, f.qh + tok0 * ks + hk * TC_D, ks, TC_L, Le);
    tc_copy<TC_D, LDD>(Ks, f.kh + tok0 * ks + hk * TC_D, ks, TC_L, Le);
    tc_copy<TC_D, LDD>(X2, dout + (tok0 * nv + h) * TC_D, vs, TC_L, Le);
    tc_copy<TC_D, LDD>(X3, f.Vp + row0 * TC_D, TC_D, TC_L, Le);
    tc_copy<TC_D, LDD>(dVs, f.dVp + row0 * TC_D, TC_D, TC_L, Le);
    tc_copy<TC_D, LDD>(Big, f.S0 + cb * TC_D * TC_D, TC_D, TC_D, TC_D);
    tc_copy<TC_L, LDL>(Tms, f.Tm + cb * TC_L * TC_L, TC_L, TC_L, TC_L);
    cp_async_commit();
    for (int i = threadIdx.x; i < TC_L; i += blockDim.x) {
        cc[i] = i < Le ? f.cs[row0 + i] : 0.0, bb[i] = i < Le ? io.beta[(tok0 + i) * nv + h] : 0.0f;
        sg[i] = i < Le ? seg_start<DOCS>(io.pos, tok0, i) : -1;
        r_bv[i] = r_bk[i] = r_qg[i] = r_kg[i] = 0.0f;
    }
    cp_async_wait<0>();
    __syncthreads();
    float aq[TcTile<64, 128>::NT][4], ak[TcTile<64, 128>::NT][4], t[TcTile<64, 128>::NT][4];
    {                                                               // (1)
        float dm[TcTile<64, 64>::NT][4], qk[TcTile<64, 64>::NT][4]; // M = (q kᵀ) e recomputed in fp32 for dc
        tc_mm<64, 64, TC_D, false, false, LDD, LDD>(dm, X2, X3);
        tc_mm<64, 64, TC_D, false, false, LDD, LDD>(qk, Qs, Ks);
        tc_zip<64, 64>(qk, dm, [](float x, float y) { return x * y; }); // the layouts agree: dM_ij (q_i·k_j)
        auto term = [&](int i, int j, float x) {                        // to dc_i, and with a minus to dc_j
            return j <= i && i < Le && (!DOCS || j >= sg[i]) ? (double)x * expf((float)(cc[i] - cc[j])) : 0.0;
        };
        tc_sums<64, 64>(part, part + 2 * TC_L, qk, term, term);
        tc_pairs<64, 64>(dm, [&](int i, int j, float &x0, float &x1) {
            st2(Ds + i * LDL + j, i < Le ? x0 * pair_decay<DOCS>(cc, sg, i, j) : 0.0f,
                i < Le ? x1 * pair_decay<DOCS>(cc, sg, i, j + 1) : 0.0f);
        });
        tc_mm<64, 128, TC_D, false, false, LDD, LDD>(aq, X2, Big);
        tc_each<64, 128>(aq, [&](int i, int, float &x) { x *= i < Le ? enter_decay<DOCS>(cc, sg, i) : 0.0f; });
        tc_rowsum<64, 128>(r_qg, aq, [&](int i, int x, float g) { return g * bf(Qs, i * LDD + x); });
        tc_mm<64, 128, TC_D, false, false, LDD, LDD>(t, dVs, Big);
        tc_pairs<64, 128>(t, [&](int i, int x, float &y0, float &y1) { st2(dWs + i * LDD + x, -y0, -y1); });
    }
    __syncthreads();
    auto rsum = [&](int i) { return part[i] + part[TC_L + i]; }; // tc_sums' slots in order
    auto csum = [&](int i) {
        return ((part[2 * TC_L + i] + part[3 * TC_L + i]) + part[4 * TC_L + i]) + part[5 * TC_L + i];
    };
    for (int i = threadIdx.x; i < TC_L; i += blockDim.x) dc[i] = rsum(i) - csum(i);
    tc_copy<TC_D, LDD>(Big, f.dS1 + cb * TC_D * TC_D, TC_D, TC_D, TC_D);
    tc_copy<TC_D, LDD>(X2, f.Ub + row0 * TC_D, TC_D, TC_L, Le); // dO is done: U comes in for (3)
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    { // (2)
        tc_mm<64, 128, TC_D, false, false, LDD, LDD>(ak, X3, Big);
        tc_each<64, 128>(ak, [&](int i, int, float &x) { x *= i < Le ? pair_decay<DOCS>(cc, sg, Le - 1, i) : 0.0f; });
        tc_rowsum<64, 128>(r_kg, ak, [&](int i, int x, float g) { return g * bf(Ks, i * LDD + x); });
        tc_mm<64, 128, TC_L, true, true, LDL, LDD>(t, Tms, dVs);
        tc_pairs<64, 128>(t, [&](int i, int y, float &x0, float &x1) {
            if (i < Le) st2(dv_ + ((tok0 + i) * nv + h) * TC_D + y, bb[i] * x0, bb[i] * x1);
            st2(dBvs + i * LDD + y, x0, x1);
        });
        tc_rowsum<64, 128>(
            r_bv, t, [&](int i, int y, float x) { return i < Le ? x * ld(v, (tok0 + i) * vs + h * TC_D + y) : 0.0f; });
        tc_mm<64, 128, TC_L, true, true, LDL, LDD>(t, Tms, dWs);
        tc_rowsum<64, 128>(r_bk, t, [&](int i, int x, float y) { return y * bf(Ks, i * LDD + x); });
        tc_pairs<64, 128>(t, [&](int i, int x, float &y0, float &y1) {
            st2(dBks + i * LDD + x, y0, y1);
            float e = i < Le ? bb[i] * enter_decay<DOCS>(cc, sg, i) : 0.0f; // gk += β e^c dBk (t, ak: one layout)
            y0 *= e, y1 *= e;
        });
        tc_zip<64, 128>(ak, t, [](float x, float y) { return x + y; });
    }
    __syncthreads();
    tc_copy<TC_D, LDD>(X3, f.W + row0 * TC_D, TC_D, TC_L, Le);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    { // (3) P = dA (k kᵀ) e into kk, E = dA β e into Em (dA = −da)
        float da[TcTile<64, 64>::NT][4], kk[TcTile<64, 64>::NT][4];
        tc_mm<64, 64, TC_D, false, false, LDD, LDD>(da, dBvs, X2);
        tc_mma<64, 64, TC_D, false, false, LDD, LDD>(da, dBks, X3);
        tc_mm<64, 64, TC_D, false, false, LDD, LDD>(kk, Ks, Ks);
        tc_each<64, 64>(da, [&](int i, int j, float &x) {
            float dec = j < i && i < Le ? pair_decay<DOCS>(cc, sg, i, j) : 0.0f;
            Em[i * (TC_L + 1) + j] = -x * bb[i] * dec;
            x = -x * dec;
        });
        tc_zip<64, 64>(kk, da, [](float x, float y) { return x * y; });
        tc_sums<64, 64>(
            part, part + 2 * TC_L, kk, [](int, int, float p) { return (double)p; },
            [&](int i, int, float p) { return (double)bb[i] * p; }); // Σ_j P_ij, Σ_i β_i P_ij
    }
    __syncthreads();
    for (int e = threadIdx.x; e < TC_L * TC_L; e += blockDim.x) {
        int i = e / TC_L, j = e % TC_L;
        ES[i * LDL + j] = __float2bfloat16(Em[i * (TC_L + 1) + j] + Em[j * (TC_L + 1) + i]);
    }
    __syncthreads();
    // (4)
    tc_mma<64, 128, TC_L, false, true, LDL, LDD>(aq, Ds, Ks);
    tc_mma<64, 128, TC_L, true, true, LDL, LDD>(ak, Ds, Qs);
    tc_mma<64, 128, TC_L, false, true, LDL, LDD>(ak, ES, Ks);
    tc_pairs<64, 128>(aq, [&](int i, int x, float &y0, float &y1) {
        if (i < Le) st2(f.gq + ((tok0 + i) * nv + h) * TC_D + x, y0, y1);
    });
    tc_pairs<64, 128>(ak, [&](int i, int x, float &y0, float &y1) {
        if (i < Le) st2(f.gk + ((tok0 + i) * nv + h) * TC_D + x, y0, y1);
    });
    __syncthreads();
    for (int i = threadIdx.x; i < Le; i += blockDim.x) {
        double eb = enter_decay<DOCS>(cc, sg, i) * (double)r_bk[i];
        double pr = rsum(i);
        io.dbeta[(tok0 + i) * nv + h] = (float)(pr + r_bv[i] + eb);
        dc[i] += bb[i] * pr - csum(i) + bb[i] * eb + r_qg[i] - r_kg[i];
    }
    __syncthreads();
    delta_dg<DOCS>(io.dg + tok0 * nv + h, nv, dc, cc, sg, r_kg, (double)f.sd[cb], Le);
}
#define TC_GRAD_SMEM ((8 * TC_L * LDD + TC_D * LDD + 3 * TC_L * LDL) * 2 + 8 * TC_L * 8 + 6 * TC_L * 4)

// One warp per (token, key head): sums the value heads' gradients w.r.t. the normalised vector and applies the
// normalisation's backward: ∂x = c·(r·γ − x·r³·(x·γ)) (c·γ without l2). The first 32·FINISH_REGS elements of a
// row stay in registers between the dot product and the store (a head of up to 256 is read once); the rest, if any,
// are read again.
#define FINISH_REGS 8
template <typename T>
__global__ void delta_finish_kernel(T *dx, const float *gx, const T *x, const float *rx, float c, bool l2,
                                    ChunkDims d) {
    int64_t rows = d.B * d.S * d.nk;
    int G = d.nv / d.nk, dk = d.dk;
    int64_t row = blockIdx.x * (int64_t)ROWS_PER_BLOCK + threadIdx.y; // t·nk + hk
    if (row >= rows) return;
    const float *g0 = gx + row * G * dk; // value heads hk·G .. hk·G + G − 1 of token t: rows t·nv + hk·G + u
    auto gsum = [&](int i) {
        float s = 0;
        for (int u = 0; u < G; u++) s += g0[u * dk + i];
        return s;
    };
    float dot = 0, r = rx[row], gs[FINISH_REGS], xs[FINISH_REGS];
#pragma unroll
    for (int j = 0; j < FINISH_REGS; j++) {
        int i = threadIdx.x + 32 * j;
        gs[j] = i < dk ? gsum(i) : 0.0f, xs[j] = i < dk ? ld(x, row * dk + i) : 0.0f;
        dot += gs[j] * xs[j];
    }
    for (int i = threadIdx.x + 32 * FINISH_REGS; i < dk; i += 32) dot += gsum(i) * ld(x, row * dk + i);
    dot = warp_sum(dot);
    float r3 = r * r * r * dot;
#pragma unroll
    for (int j = 0; j < FINISH_REGS; j++) {
        int i = threadIdx.x + 32 * j;
        if (i < dk) st(dx, row * dk + i, l2 ? c * (r * gs[j] - xs[j] * r3) : c * gs[j]);
    }
    for (int i = threadIdx.x + 32 * FINISH_REGS; i < dk; i += 32)
        st(dx, row * dk + i, l2 ? c * (r * gsum(i) - ld(x, row * dk + i) * r3) : c * gsum(i));
}

// The call's dims, checked with the states'.
static ChunkDims delta_dims(Tensor q, Tensor v, const DeltaArgs *a) {
    CHECK(q.n[0] % a->B == 0 && v.n[0] == q.n[0] && v.n[1] % q.n[1] == 0);
    CHECK(a->chunk >= 0 && a->chunk <= DELTA_MAX_CHUNK);
    ChunkDims d;
    d.L = a->chunk ? a->chunk : DELTA_MAX_CHUNK; // chunk 0 (the recurrence) gives the same result in exact arithmetic
    d.B = a->B, d.S = q.n[0] / a->B, d.NC = (d.S + d.L - 1) / d.L, d.NL = d.NC * d.L;
    d.nk = (int)q.n[1], d.nv = (int)v.n[1], d.dk = (int)q.n[2], d.dv = (int)v.n[2];
    const Tensor *st[4] = {&a->s0, &a->sT, &a->dsT, &a->ds0};
    for (int i = 0; i < 4; i++)
        if (st[i]->p) {
            IS_F32(*st[i], "delta_rule state");
            CHECK(st[i]->dev == DEV_CUDA && tensor_numel(*st[i]) == d.B * d.nv * d.dk * d.dv);
        }
    if (a->pos.p) CHECK(a->pos.dev == DEV_CUDA && a->pos.dt == DT_I32 && tensor_numel(a->pos) == q.n[0]);
    return d;
}

// The call's scratch (op_delta_rule_scratch): carved from a->ws when the caller planned it, else from the op scratch;
// the kept state from a->kept (DeltaArgs.keep).
static DeltaBufs delta_bufs(Tensor q, Tensor v, const DeltaArgs *a, bool backward) {
    size_t need = op_delta_rule_workspace(q, v, a, backward) * sizeof(float);
    Arena arena = scratch_arena(a->ws, a->ws.p ? NULL : cuda_scratch(need), need, "delta_rule scratch"), kept = arena;
    if (a->keep) {
        if (!a->kept.p) die("delta_rule: keep without a kept state (DeltaArgs.kept)");
        kept = scratch_arena(a->kept, NULL, 0, "delta_rule kept state");
    }
    DeltaScratch c = op_delta_rule_scratch(&arena, &kept, q, v, a, backward);
    DeltaBufs f = {(float *)c.qh.p, (float *)c.kh.p,  (float *)c.rq.p,  (float *)c.rk.p, (float *)c.U.p,
                   (float *)c.W.p,  (float *)c.M.p,   (float *)c.Tm.p,  (float *)c.S0.p, (float *)c.dS1.p,
                   (float *)c.Vp.p, (float *)c.dVp.p, (float *)c.dBv.p, (float *)c.dW.p, (float *)c.dBk.p,
                   (float *)c.gq.p, (float *)c.gk.p,  (double *)c.cs.p};
    return f;
}

// The tensor cores' view of the scratch (TcBufs).
static TcBufs tc_bufs(const DeltaBufs &f, const ChunkDims &d) {
    size_t states = (size_t)(d.B * d.nv * d.NC) * d.dk * d.dv; // S₀ or dS₁ of every chunk
    TcBufs t;
    t.qh = (bf16 *)f.qh, t.kh = (bf16 *)f.kh, t.W = (bf16 *)f.W, t.M = (bf16 *)f.M, t.Tm = (bf16 *)f.Tm;
    t.dS1 = (bf16 *)f.dS1, t.S0 = f.dS1 ? t.dS1 + states : NULL, t.Vp = (bf16 *)f.Vp, t.dVp = (bf16 *)f.dVp;
    t.Ub = (bf16 *)f.dW, t.U = f.U, t.S0f = f.S0, t.sd = f.dBv, t.gq = f.gq, t.gk = f.gk, t.cs = f.cs;
    return t;
}

// The op's inputs as the kernels see them; the forward adds o and sT, the backward the gradients.
static DeltaIO delta_io(Tensor v, Tensor g, Tensor beta, const DeltaArgs *a) {
    DeltaIO io = {};
    io.v = v.p, io.g = (const float *)g.p, io.beta = (const float *)beta.p, io.s0 = (const float *)a->s0.p;
    io.pos = (const int *)a->pos.p;
    return io;
}

static size_t prep_smem(const ChunkDims *d) { return ((size_t)d->L * d->dk + 2 * (size_t)d->L * d->L + 5 * d->L) * 4; }
static size_t state_smem(const ChunkDims *d, bool bwd) {
    return (((size_t)d->dk + (bwd ? 2 : 1) * d->L) * DELTA_VT + 2 * d->L) * 4;
}
static size_t grad_smem(const ChunkDims *d) { return (4 * (size_t)d->L * d->L + 8 * d->L + 32) * 4; }

// bf16 data at Qwen3.5's head size and chunk 64 take the tensor cores; fp32 (parity runs) and other shapes the SIMT
// kernels.
static bool delta_tc(DType dt, const ChunkDims *d) {
    return dt == DT_BF16 && d->L == TC_L && d->dk == TC_D && d->dv == TC_D;
}

// Normalised q and k, then c, U, W, M (and Tm and, on the tensor cores, U's bf16 copy for the backward) of every
// chunk; then the state pass, which writes o and sT (forward) and S₀ and V' of every chunk (the backward's scratch:
// the backward, or a forward that keeps them for it, DeltaArgs.keep).
template <typename T>
static void delta_front(const DeltaBufs &f, const DeltaIO &io, Tensor q, Tensor k, const ChunkDims &d,
                        const DeltaArgs *a) {
    dim3 rg = row_grid(d.B * d.S * d.nk), cg((unsigned)d.NC, (unsigned)(d.B * d.nv)), sg((unsigned)(d.B * d.nv));
    if (delta_tc(q.dt, &d)) { // bf16 q̂, k̂, W, M, Tm in the fp32 buffers' places
        launch(delta_prep_kernel<bf16, bf16>, rg, ROW_BLOCK, 0, f, (const bf16 *)q.p, (const bf16 *)k.p, a->scale,
               a->qk_l2norm, d);
        BOOL_SWITCH(io.pos, DOCS, {
            launch(tc_prep_kernel<DOCS>, cg, TC_THREADS, TC_PREP_SMEM, tc_bufs(f, d), io, d);
            launch(tc_state_kernel<false, DOCS>, dim3(sg.x, TC_D / TC_VT), TC_THREADS, TC_STATE_SMEM, tc_bufs(f, d), io,
                   d);
        });
        return;
    }
    launch(delta_prep_kernel<T, float>, rg, ROW_BLOCK, 0, f, (const T *)q.p, (const T *)k.p, a->scale, a->qk_l2norm, d);
    launch(delta_chunk_prep_kernel<T>, cg, 256, prep_smem(&d), f, io, d);
    launch(delta_chunk_state_kernel<T, false>, dim3(sg.x, (d.dv + DELTA_VT - 1) / DELTA_VT), 256, state_smem(&d, false),
           f, io, d);
}

void cuda_delta_rule_forward(Tensor o, Tensor q, Tensor k, Tensor v, Tensor g, Tensor beta, const DeltaArgs *a) {
    ChunkDims d = delta_dims(q, v, a);
    same_dt(k, q, "delta_rule_forward"), same_dt(v, q, "delta_rule_forward"), same_dt(o, q, "delta_rule_forward");
    IS_F32(g, "delta_rule_forward");
    IS_F32(beta, "delta_rule_forward");
    if (q.n[0] == 0) return;
    DeltaIO io = delta_io(v, g, beta, a);
    io.o = o.p, io.sT = (float *)a->sT.p;
    DT_SWITCH(q.dt, T, "delta_rule_forward", delta_front<T>(delta_bufs(q, v, a, false), io, q, k, d, a));
}

void cuda_delta_rule_backward(Tensor dq, Tensor dk, Tensor dv, Tensor dg, Tensor dbeta, Tensor dout, Tensor q, Tensor k,
                              Tensor v, Tensor g, Tensor beta, const DeltaArgs *a) {
    ChunkDims d = delta_dims(q, v, a);
    same_dt(dq, q, "delta_rule_backward"), same_dt(dk, q, "delta_rule_backward");
    same_dt(dv, v, "delta_rule_backward"), same_dt(dout, v, "delta_rule_backward");
    IS_F32(dg, "delta_rule_backward");
    IS_F32(dbeta, "delta_rule_backward");
    if (q.n[0] == 0) return;
    DeltaBufs f = delta_bufs(q, v, a, true);
    DeltaIO io = delta_io(v, g, beta, a);
    io.dv = dv.p, io.dout = dout.p, io.dg = (float *)dg.p, io.dbeta = (float *)dbeta.p;
    io.dsT = (const float *)a->dsT.p, io.ds0 = (float *)a->ds0.p;
    unsigned BH = (unsigned)(d.B * d.nv);
    dim3 rg = row_grid(d.B * d.S * d.nk), cg((unsigned)d.NC, BH);
    bool tc = delta_tc(q.dt, &d);
    if (tc) CUDA_CHECK(cudaMemsetAsync(tc_bufs(f, d).sd, 0, (size_t)BH * d.NC * sizeof(float), cuda_stream()));
    DT_SWITCH(q.dt, T, "delta_rule_backward", {
        if (!a->keep) delta_front<T>(f, io, q, k, d, a);
        if (tc) {
            BOOL_SWITCH(io.pos, DOCS, {
                launch(tc_state_kernel<true, DOCS>, dim3(BH, TC_D / TC_VT), TC_THREADS, TC_STATE_SMEM, tc_bufs(f, d),
                       io, d);
                launch(tc_grad_kernel<DOCS>, cg, TC_THREADS, TC_GRAD_SMEM, tc_bufs(f, d), io, d);
            });
        } else {
            launch(delta_chunk_state_kernel<T, true>, dim3(BH, (d.dv + DELTA_VT - 1) / DELTA_VT), 256,
                   state_smem(&d, true), f, io, d);
            launch(delta_chunk_grad_kernel<T>, cg, 256, grad_smem(&d), f, io, d);
        }
        launch(delta_finish_kernel<T>, rg, ROW_BLOCK, 0, (T *)dq.p, f.gq, (const T *)q.p, f.rq, a->scale, a->qk_l2norm,
               d);
        launch(delta_finish_kernel<T>, rg, ROW_BLOCK, 0, (T *)dk.p, f.gk, (const T *)k.p, f.rk, 1.0f, a->qk_l2norm, d);
    });
}

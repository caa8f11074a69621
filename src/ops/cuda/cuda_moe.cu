// cuda_moe.cu — router (softmax, top-k, renormalisation), load-balancing loss, the expert sort, row
// gather/scatter and the weighted combine. Math as in ops/cpu/cpu_moe.c:
//   probs = softmax(logits) (fp64 exponentials and sums, as the CPU, so both pick the same experts);
//   top-k with ties → lower expert index; w = chosen probs, / Σ when renorm.
//   backward: ∂p_j = (∂w_j − Σ_l ∂w_l·w_l)/Σp (renorm) or ∂w_j, plus lb_grad; ∂logit = p·(∂p − Σ p·∂p).
// Shapes: logits, probs, dlogits (T, E) fp32; idx (T, k) int32; w, dw (T, k) fp32; lb_grad (E) fp32;
// rows/perm int32; x, y (R, H) activations; combine y (T·k, H) in slot order.
#include "ops/cuda/cuda_common.cuh"

#define MOE_WARPS 8 // tokens per block: one warp per token
#define GRID_STRIDE(i, n) for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < (n); i += (int64_t)gridDim.x * blockDim.x)

// One warp per token; the warp's E probabilities live in shared memory while top-k picks from them.
__global__ void router_forward_kernel(float *probs, int32_t *idx, float *w, const float *logits, int64_t T_, int E, int k, bool renorm,
                                      bool force_balance) {
    extern __shared__ float sp_all[];
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    int64_t t = blockIdx.x * (int64_t)MOE_WARPS + wid;
    if (t >= T_) return;
    float *sp = sp_all + wid * E;
    const float *l = logits + t * E;
    float m = -INFINITY;
    for (int e = lane; e < E; e += 32) m = fmaxf(m, l[e]);
    m = warp_max(m);
    double sum = 0;
    for (int e = lane; e < E; e += 32) sum += exp((double)l[e] - m);
    sum = warp_sum(sum);
    for (int e = lane; e < E; e += 32) {
        float p = (float)(exp((double)l[e] - m) / sum);
        probs[t * E + e] = p;
        sp[e] = p;
    }
    __syncwarp();
    double s = 0;
    for (int j = 0; j < k; j++) {
        int best;
        if (force_balance) {
            best = (int)((t + (int64_t)j * (E / k)) % E);
        } else {
            float bv = -1.0f; // taken experts hold −1, every probability is ≥ 0
            best = E;
            for (int e = lane; e < E; e += 32)
                if (sp[e] > bv) bv = sp[e], best = e;
            for (int o = 16; o > 0; o >>= 1) {
                float ov = __shfl_xor_sync(0xffffffffu, bv, o);
                int oe = __shfl_xor_sync(0xffffffffu, best, o);
                if (ov > bv || (ov == bv && oe < best)) bv = ov, best = oe;
            }
        }
        float pb = (float)(exp((double)l[best] - m) / sum);
        s += pb;
        if (lane == 0) {
            idx[t * k + j] = best;
            w[t * k + j] = pb;
        }
        __syncwarp();
        if (!force_balance && lane == (best & 31)) sp[best] = -1.0f;
        __syncwarp();
    }
    if (renorm && lane == 0)
        for (int j = 0; j < k; j++) w[t * k + j] = (float)(w[t * k + j] / s);
}

__global__ void router_backward_kernel(float *dlogits, const float *dw, const float *lb_grad, const float *probs, const int32_t *idx,
                                       const float *w, int64_t T_, int E, int k, bool renorm) {
    extern __shared__ double dp_all[];
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    int64_t t = blockIdx.x * (int64_t)MOE_WARPS + wid;
    if (t >= T_) return;
    double *dp = dp_all + wid * E;
    const float *p = probs + t * E;
    for (int e = lane; e < E; e += 32) dp[e] = lb_grad ? lb_grad[e] : 0.0;
    __syncwarp();
    if (lane == 0) {
        double s = 0, gw = 0;
        for (int j = 0; j < k; j++) s += p[idx[t * k + j]], gw += (double)dw[t * k + j] * w[t * k + j];
        for (int j = 0; j < k; j++) dp[idx[t * k + j]] += renorm ? (dw[t * k + j] - gw) / s : dw[t * k + j];
    }
    __syncwarp();
    double dot = 0;
    for (int e = lane; e < E; e += 32) dot += p[e] * dp[e];
    dot = warp_sum(dot);
    for (int e = lane; e < E; e += 32) dlogits[t * E + e] = (float)(p[e] * (dp[e] - dot));
}

// Load balancing: cnt[e] = #slots routed to e, pm[e] = Σ_t probs[t, e] (fp64 atomics into the small pool).
__global__ void moe_lb_count_kernel(double *cnt, const int32_t *idx, int64_t n) {
    GRID_STRIDE(i, n) atomicAdd(cnt + idx[i], 1.0);
}
__global__ void moe_lb_colsum_kernel(double *pm, const float *probs, int64_t T_, int64_t E) {
    __shared__ double part[8][33];
    int64_t e = blockIdx.x * 32 + threadIdx.x;
    double s = 0;
    if (e < E)
        for (int64_t t = blockIdx.y * 8 + threadIdx.y; t < T_; t += (int64_t)gridDim.y * 8) s += probs[t * E + e];
    part[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && e < E) {
        for (int r = 1; r < 8; r++) s += part[r][threadIdx.x];
        atomicAdd(pm + e, s);
    }
}
__global__ void moe_lb_finish_kernel(double *loss_sum, float *lb_grad, const double *cnt, const double *pm, int64_t T_, int E, int k, float coef,
                                     float grad_scale) {
    __shared__ double sd[32];
    double loss = 0;
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        double f = T_ ? cnt[e] / (double)(T_ * k) : 0;
        loss += (double)coef * E * f * (T_ ? pm[e] / T_ : 0);
        lb_grad[e] = T_ ? (float)((double)grad_scale * coef * E * f / T_) : 0.0f;
    }
    loss = block_sum(loss, sd);
    if (threadIdx.x == 0) *loss_sum += loss;
}

__device__ __forceinline__ void atomic_add(float *p, float v) { atomicAdd(p, v); }
__device__ __forceinline__ void atomic_add(bf16 *p, float v) { atomicAdd(p, __float2bfloat16(v)); }

template <typename TY, typename TX> __global__ void gather_rows_kernel(TY *y, const TX *x, const int32_t *rows, int div, int64_t R, int64_t H) {
    GRID_STRIDE(e, R * H) {
        int64_t i = e / H, c = e % H;
        st(y, e, ld(x, (int64_t)(rows[i] / div) * H + c));
    }
}
template <typename TX, typename TY>
__global__ void gather_rows_backward_kernel(TX *dx, const TY *dy, const int32_t *rows, int div, int64_t R, int64_t H) {
    GRID_STRIDE(e, R * H) {
        int64_t i = e / H, c = e % H;
        atomic_add(dx + (int64_t)(rows[i] / div) * H + c, ld(dy, e)); // several rows may land on one token
    }
}
template <typename TY, typename TX> __global__ void scatter_rows_kernel(TY *y, const TX *x, const int32_t *rows, int64_t R, int64_t H) {
    GRID_STRIDE(e, R * H) {
        int64_t i = e / H, c = e % H;
        st(y, (int64_t)rows[i] * H + c, ld(x, e));
    }
}

template <typename T> __global__ void moe_combine_forward_kernel(T *out, const T *resid, const T *y, const float *w, int64_t T_, int64_t H, int k) {
    GRID_STRIDE(e, T_ * H) {
        int64_t t = e / H, c = e % H;
        float s = ld(resid, e);
        for (int j = 0; j < k; j++) s += w[t * k + j] * ld(y, (t * k + j) * H + c);
        st(out, e, s);
    }
}
// One warp per slot (t, j): dy row = w·dout[t], dw = ⟨dout[t], y row⟩.
template <typename T> __global__ void moe_combine_backward_kernel(T *dy, float *dw, const T *dout, const T *y, const float *w, int64_t T_, int64_t H, int k) {
    int64_t slot = blockIdx.x * (int64_t)MOE_WARPS + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (slot >= T_ * k) return;
    int64_t t = slot / k;
    float wj = w[slot], s = 0;
    for (int64_t c = lane; c < H; c += 32) {
        float g = ld(dout, t * H + c);
        st(dy, slot * H + c, wj * g);
        s += g * ld(y, slot * H + c);
    }
    s = warp_sum(s);
    if (lane == 0) dw[slot] = s;
}

static void same_dt(Tensor a, Tensor b, const char *what) {
    if (a.dt != b.dt) die("%s: tensors of dtypes %s and %s must share one", what, dtype_name(a.dt), dtype_name(b.dt));
}

extern "C" {

void cuda_router_forward(Tensor probs, Tensor idx, Tensor w, Tensor logits, int k, bool renorm, bool force_balance) {
    int64_t T_ = t_rows(logits), E = t_cols(logits);
    IS_F32(logits, "router_forward"); IS_F32(probs, "router_forward"); IS_F32(w, "router_forward");
    CHECK(k >= 1 && k <= E && t_cols(idx) == k && idx.dt == DT_I32);
    if (!T_) return;
    size_t smem = (size_t)MOE_WARPS * E * sizeof(float);
    if (smem > 48 * 1024) die("router_forward: %lld experts exceed this kernel's shared memory", (long long)E);
    router_forward_kernel<<<(unsigned)((T_ + MOE_WARPS - 1) / MOE_WARPS), 32 * MOE_WARPS, smem, cuda_stream()>>>(
        (float *)probs.p, (int32_t *)idx.p, (float *)w.p, (const float *)logits.p, T_, (int)E, k, renorm, force_balance);
    CUDA_LAUNCH_CHECK();
}

void cuda_router_backward(Tensor dlogits, Tensor dw, Tensor lb_grad, Tensor probs, Tensor idx, Tensor w, bool renorm) {
    int64_t T_ = t_rows(probs), E = t_cols(probs), k = t_cols(idx);
    IS_F32(dlogits, "router_backward"); IS_F32(dw, "router_backward"); IS_F32(probs, "router_backward");
    if (!T_) return;
    size_t smem = (size_t)MOE_WARPS * E * sizeof(double);
    if (smem > 48 * 1024) die("router_backward: %lld experts exceed this kernel's shared memory", (long long)E);
    router_backward_kernel<<<(unsigned)((T_ + MOE_WARPS - 1) / MOE_WARPS), 32 * MOE_WARPS, smem, cuda_stream()>>>(
        (float *)dlogits.p, (const float *)dw.p, lb_grad.p ? (const float *)lb_grad.p : NULL, (const float *)probs.p, (const int32_t *)idx.p,
        (const float *)w.p, T_, (int)E, (int)k, renorm);
    CUDA_LAUNCH_CHECK();
}

void cuda_moe_lb_loss(Tensor loss_sum, Tensor lb_grad, Tensor probs, Tensor idx, float coef, float grad_scale) {
    int64_t T_ = t_rows(probs), E = t_cols(probs), k = t_cols(idx);
    IS_F32(lb_grad, "moe_lb_loss");
    CHECK(loss_sum.dt == DT_F64);
    CudaCtx *c = cuda_ctx();
    if ((size_t)E * 2 * sizeof(double) > CUDA_SMALL_BYTES) die("moe_lb_loss: %lld experts exceed the small pool", (long long)E);
    double *cnt = (double *)c->small, *pm = cnt + E;
    CUDA_CHECK(cudaMemsetAsync(cnt, 0, 2 * E * sizeof(double), c->compute));
    if (T_ > 0) {
        moe_lb_count_kernel<<<grid_for(T_ * k, 256), 256, 0, c->compute>>>(cnt, (const int32_t *)idx.p, T_ * k);
        CUDA_LAUNCH_CHECK();
        int64_t gy = (T_ + 255) / 256;
        moe_lb_colsum_kernel<<<dim3((unsigned)((E + 31) / 32), (unsigned)(gy > 64 ? 64 : gy)), dim3(32, 8), 0, c->compute>>>(pm, (const float *)probs.p,
                                                                                                                          T_, E);
        CUDA_LAUNCH_CHECK();
    }
    moe_lb_finish_kernel<<<1, 256, 0, c->compute>>>((double *)loss_sum.p, (float *)lb_grad.p, cnt, pm, T_, (int)E, (int)k, coef, grad_scale);
    CUDA_LAUNCH_CHECK();
}

// The one host sync of the step: idx comes to the host, the stable counting sort runs there, and perm
// goes back (its host buffer persists until the next call, whose read-back orders after this copy).
void cuda_moe_sort(Tensor perm, int64_t *offs, Tensor idx, int E) {
    static int32_t *h_idx, *h_perm;
    static int64_t cap;
    static int64_t *fill;
    static int fill_cap;
    int64_t n = tensor_numel(idx);
    CHECK(idx.dt == DT_I32 && perm.dt == DT_I32 && tensor_numel(perm) >= n);
    if (n > cap) {
        free(h_idx), free(h_perm);
        cap = n;
        h_idx = (int32_t *)xmalloc(cap * sizeof(int32_t)), h_perm = (int32_t *)xmalloc(cap * sizeof(int32_t));
    }
    if (E + 1 > fill_cap) free(fill), fill_cap = E + 1, fill = (int64_t *)xmalloc(fill_cap * sizeof(int64_t));
    cudaStream_t s = cuda_stream();
    if (n) CUDA_CHECK(cudaMemcpyAsync(h_idx, idx.p, n * sizeof(int32_t), cudaMemcpyDeviceToHost, s));
    CUDA_CHECK(cudaStreamSynchronize(s));
    for (int e = 0; e <= E; e++) offs[e] = 0;
    for (int64_t i = 0; i < n; i++) {
        if (h_idx[i] < 0 || h_idx[i] >= E) die("moe_sort: expert index %d out of range [0, %d) (a router bug)", h_idx[i], E);
        offs[h_idx[i] + 1]++;
    }
    for (int e = 0; e < E; e++) offs[e + 1] += offs[e];
    memcpy(fill, offs, (E + 1) * sizeof(int64_t));
    for (int64_t i = 0; i < n; i++) h_perm[fill[h_idx[i]]++] = (int32_t)i;
    if (n) CUDA_CHECK(cudaMemcpyAsync(perm.p, h_perm, n * sizeof(int32_t), cudaMemcpyHostToDevice, s));
}

void cuda_gather_rows(Tensor y, Tensor x, Tensor rows, int div) {
    int64_t R = t_rows(y), H = t_cols(y);
    CHECK(t_cols(x) == H && tensor_numel(rows) == R);
    if (R * H == 0) return;
    DT_SWITCH(y.dt, TY, "gather_rows", DT_SWITCH(x.dt, TX, "gather_rows",
        gather_rows_kernel<TY, TX><<<grid_for(R * H, 256), 256, 0, cuda_stream()>>>((TY *)y.p, (const TX *)x.p, (const int32_t *)rows.p, div, R, H)));
    CUDA_LAUNCH_CHECK();
}

void cuda_gather_rows_backward(Tensor dx, Tensor dy, Tensor rows, int div) {
    int64_t R = t_rows(dy), H = t_cols(dy);
    if (R * H == 0) return;
    DT_SWITCH(dx.dt, TX, "gather_rows_backward", DT_SWITCH(dy.dt, TY, "gather_rows_backward",
        gather_rows_backward_kernel<TX, TY><<<grid_for(R * H, 256), 256, 0, cuda_stream()>>>((TX *)dx.p, (const TY *)dy.p, (const int32_t *)rows.p,
                                                                                            div, R, H)));
    CUDA_LAUNCH_CHECK();
}

void cuda_scatter_rows(Tensor y, Tensor x, Tensor rows) {
    int64_t R = t_rows(x), H = t_cols(x);
    if (R * H == 0) return;
    DT_SWITCH(y.dt, TY, "scatter_rows", DT_SWITCH(x.dt, TX, "scatter_rows",
        scatter_rows_kernel<TY, TX><<<grid_for(R * H, 256), 256, 0, cuda_stream()>>>((TY *)y.p, (const TX *)x.p, (const int32_t *)rows.p, R, H)));
    CUDA_LAUNCH_CHECK();
}

void cuda_moe_combine_forward(Tensor out, Tensor resid, Tensor y, Tensor w) {
    int64_t T_ = t_rows(out), H = t_cols(out), k = t_cols(w);
    CHECK(t_rows(y) == T_ * k);
    same_dt(out, y, "moe_combine_forward"), same_dt(resid, y, "moe_combine_forward");
    IS_F32(w, "moe_combine_forward");
    if (T_ * H == 0) return;
    DT_SWITCH(y.dt, T, "moe_combine_forward",
              moe_combine_forward_kernel<T><<<grid_for(T_ * H, 256), 256, 0, cuda_stream()>>>((T *)out.p, (const T *)resid.p, (const T *)y.p,
                                                                                            (const float *)w.p, T_, H, (int)k));
    CUDA_LAUNCH_CHECK();
}

void cuda_moe_combine_backward(Tensor dy, Tensor dw, Tensor dout, Tensor y, Tensor w) {
    int64_t T_ = t_rows(dout), H = t_cols(dout), k = t_cols(w);
    same_dt(dy, y, "moe_combine_backward"), same_dt(dout, y, "moe_combine_backward");
    IS_F32(dw, "moe_combine_backward");
    if (T_ * k == 0) return;
    DT_SWITCH(y.dt, T, "moe_combine_backward",
              moe_combine_backward_kernel<T><<<(unsigned)((T_ * k + MOE_WARPS - 1) / MOE_WARPS), 32 * MOE_WARPS, 0, cuda_stream()>>>(
                  (T *)dy.p, (float *)dw.p, (const T *)dout.p, (const T *)y.p, (const float *)w.p, T_, H, (int)k));
    CUDA_LAUNCH_CHECK();
}

} // extern "C"

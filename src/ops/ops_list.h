// ops_list.h — every op a backend implements, one entry each with its meaning (conventions and types: ops.h).
// An entry OP(ret, name, dev, (params), (args)) is op_<name>, cpu_<name> and cuda_<name> with these parameters, the
// op running on the backend of device dev. The includer defines OP: ops.h declares op_<name>, cpu_ops.h cpu_<name>,
// cuda_ops.h cuda_<name>, ops.c the op itself (a dispatch on dev). OP_OWN marks an op whose op_<name> does more
// than dispatch: it is written out in ops.c, and the backends' declarations come from here. No include guard: each
// includer reads the list again.
#ifndef OP_OWN
#define OP_OWN OP
#endif

// ---- dense GEMMs (linear layers) ----
// y: (M, N) = x: (M, K) · w: (N, K)ᵀ [+ b: (N)]; b.p == NULL means no bias.
OP(void, linear_forward, x.dev, (Tensor y, Tensor x, Tensor w, Tensor b), (y, x, w, b))
// dx: (M, K) (+)= dy: (M, N) · w: (N, K)
OP(void, linear_backward_input, dy.dev, (Tensor dx, Tensor dy, Tensor w, bool accumulate), (dx, dy, w, accumulate))
// dw: (N, K) (+)= dy: (M, N)ᵀ · x: (M, K); db: (N) += Σ_rows dy (db.p == NULL: no bias; a bias only accumulating)
OP(void, linear_backward_weight, dy.dev, (Tensor dw, Tensor db, Tensor dy, Tensor x, bool accumulate),
   (dw, db, dy, x, accumulate))
// The bias of an FP8 product, outside it (PithTrain adds it in the compute dtype): y: (M, N) += b: (N) per row, or with
// offs (the experts' row offsets, as the grouped GEMMs'; p == NULL: dense) b: (E, N), expert e's on its rows; db: (N)
// or (E, N) fp32 (+)= Σ_rows dy of the unrounded dy likewise (accumulate false: written; dense: always added).
OP(void, linear_bias_forward, y.dev, (Tensor y, Tensor b, Tensor offs), (y, b, offs))
OP(void, linear_bias_backward, dy.dev, (Tensor db, Tensor dy, Tensor offs, bool accumulate), (db, dy, offs, accumulate))

// ---- grouped GEMMs (experts): rows offs[e]..offs[e+1] of x belong to expert e ----
// offs: (E+1) int64 on the ops' device (op_moe_sort writes it there): the GPU kernels read it where it is, so no op
// here waits for the device (but cuBLASLt's per-expert products, for shapes the wgmma kernels do not take, which read
// it back: cuda_gemm.cu).
// x gathered (forward and weight gradient; rows.p NULL: not): row i of x_e is x[rows[i] / div], rows (≥ R) int32 on
// the ops' device — the experts' input read in place (the one-rank dispatch's op_gather_rows made part of the product).
// The CPU's only: the GPU takes x's rows already gathered, and rows.p there ends the run.
// y: (R, N) = x_e: (R_e, K) · w_e: (N, K)ᵀ [+ b_e], w: (E, N, K), b: (E, N) or p == NULL; empty experts are allowed.
OP(void, grouped_linear_forward, x.dev, (Tensor y, Tensor x, Tensor rows, int div, Tensor w, Tensor b, Tensor offs),
   (y, x, rows, div, w, b, offs))
// dx = dy·w_e
OP(void, grouped_linear_backward_input, dy.dev, (Tensor dx, Tensor dy, Tensor w, Tensor offs), (dx, dy, w, offs))
// dw_e (+)= dy_eᵀ·x_e; db: (E, N) (+)= Σ_rows of e dy (db.p == NULL: no bias). accumulate false: dw and db
// are written, not added to (empty experts' become 0): the first micro-batch into a zeroed gradient, where writing
// equals adding and saves reading dw. dw, db fp32, or bf16 (gradient_dtype): each element's sum in fp32, the stored
// value added in fp32, rounded once to nearest even.
OP(void, grouped_linear_backward_weight, dy.dev,
   (Tensor dw, Tensor db, Tensor dy, Tensor x, Tensor rows, int div, Tensor offs, bool accumulate),
   (dw, db, dy, x, rows, div, offs, accumulate))

// ---- normalisation, position embedding, activation ----
// RMSNorm over the last dim D of x: (R, D) (per-head norms reshape the heads into rows): y = x · rstd · u,
// rstd: (R) fp32 = 1/sqrt(mean(x²) + eps), u = w, or 1 + w with a->one_plus, times silu(z) with a->z (RmsArgs; a
// NULL: plain). Backward: dx (+)= ∂/∂x, dw: (D) fp32 += ∂/∂w, a->dz (with a->z) written with ∂/∂z.
OP(void, rmsnorm_forward, x.dev, (Tensor y, Tensor rstd, Tensor x, Tensor w, float eps, const RmsArgs *a),
   (y, rstd, x, w, eps, a))
OP(void, rmsnorm_backward, x.dev,
   (Tensor dx, Tensor dw, Tensor dy, Tensor x, Tensor w, Tensor rstd, bool accumulate, const RmsArgs *a),
   (dx, dw, dy, x, w, rstd, accumulate, a))
// RoPE on dims [off, off + rd) of every head of x: (T, heads, d), in place; rd = 2·cos.n[1], the other dims pass
// through (partial rotary: Qwen3.5 rotates the first quarter; MLA's rope part is the last 64 of 192). Pair i of token
// t turns by table row pos[t] (RopeLayout): (a, b) ← (a·c − b·s, b·c + a·s). cos, sin: (P, rd/2) fp32 (any attention
// factor folded in); pos: (T) int32. backward applies the transpose.
OP(void, rope, x.dev, (Tensor x, int off, Tensor cos, Tensor sin, Tensor pos, RopeLayout layout, bool backward),
   (x, off, cos, sin, pos, layout, backward))
// SwiGLU, act: (M, I) from gu: (M, 2I). limit 0: gu = [gate | up], act = silu(gate) · up. limit > 0, the clamped form
// (GPT-OSS's experts): gu interleaved as its gate_up_proj writes it, [g_0, u_0, g_1, u_1, …] (gate even, up odd);
// act = (uc + 1) · gc · σ(alpha · gc) with gc = min(g, limit), uc = clamp(u, −limit, limit). A clamp passes the
// gradient where its input lies inside or on the bound (torch.clamp's rule); beyond it, none. dgu written.
OP(void, swiglu_forward, gu.dev, (Tensor act, Tensor gu, float alpha, float limit), (act, gu, alpha, limit))
OP(void, swiglu_backward, gu.dev, (Tensor dgu, Tensor dact, Tensor gu, float alpha, float limit),
   (dgu, dact, gu, alpha, limit))
// Output gate: y: (R, D) = x · σ(gate), gate: (R, D) or (R, 1) (one gate per row). Backward: dx (+)= dy · σ(gate),
// dgate = Σ over the columns a gate covers of dy · x · σ'(gate) (written).
OP(void, sigmoid_gate_forward, x.dev, (Tensor y, Tensor x, Tensor gate), (y, x, gate))
OP(void, sigmoid_gate_backward, x.dev, (Tensor dx, Tensor dgate, Tensor dy, Tensor x, Tensor gate, bool accumulate),
   (dx, dgate, dy, x, gate, accumulate))

// ---- attention (AttnArgs: ops.h) ----
OP(void, attention_forward, q.dev, (Tensor o, Tensor lse, Tensor q, Tensor k, Tensor v, const AttnArgs *a),
   (o, lse, q, k, v, a))
// dq, dk, dv written; dsinks: (nh) fp32 += ∂/∂sinks (p == NULL: not wanted). o and lse as the forward wrote them.
OP(void, attention_backward, q.dev,
   (Tensor dq, Tensor dk, Tensor dv, Tensor dsinks, Tensor dout, Tensor q, Tensor k, Tensor v, Tensor o, Tensor lse,
    const AttnArgs *a),
   (dq, dk, dv, dsinks, dout, q, k, v, o, lse, a))
// The log-sum-exp merge of a partial attention result into an accumulator (ring attention), per query row and
// head: lse' = log(e^lse + e^lse_p), o ← o·e^(lse − lse') + o_p·e^(lse_p − lse'), lse ← lse'. lse_p = −∞ (the
// block saw nothing) leaves (o, lse) as they are, lse = −∞ takes the partial; init overwrites (o = o_p, lse =
// lse_p). o: (B·Sq, nh, dv) fp32, lse: (B, nh, Sq) fp32; o_p: o's shape, fp32 or bf16; lse_p: lse's shape, fp32.
OP(void, attention_merge, o.dev, (Tensor o, Tensor lse, Tensor o_p, Tensor lse_p, int B, bool init),
   (o, lse, o_p, lse_p, B, init))

// ---- Gated DeltaNet linear attention (docs/reference.md §19) ----
// Causal depthwise conv1d then SiLU over each of B sequences: x, y: (B·S, C), w: (C, K);
// y[t, c] = silu(Σ_j w[c, j] · x[t − K + 1 + j, c]); rows before the sequence's start are the halo's — halo:
// (B·(K−1), C), row b·(K−1) + i the input at position i − (K−1) of sequence b (context parallelism: the previous
// rank's last rows) — or 0 without one (p NULL). Document masking: pos (B·S) int32, each token's position inside its
// document (p NULL: none); the tap reading K − 1 − j rows back is 0 where K − 1 − j > pos[t] (a window never reaches
// before its document's first token; a halo row counts only for the tokens whose pos reaches it). Backward: dx
// written, dhalo (when given) written with ∂/∂halo, dw: (C, K) fp32 +=. split > 0: y (and dy) hold their columns as
// three blocks stored whole one after another — [0, split), [split, 2·split), [2·split, C), each (B·S, width) — the
// q, k and v the delta rule takes, written where it reads them; 0: y is (B·S, C).
OP(void, conv1d_silu_forward, x.dev, (Tensor y, Tensor x, Tensor w, Tensor halo, Tensor pos, int B, int64_t split),
   (y, x, w, halo, pos, B, split))
OP(void, conv1d_silu_backward, x.dev,
   (Tensor dx, Tensor dhalo, Tensor dw, Tensor dy, Tensor x, Tensor w, Tensor halo, Tensor pos, int B, int64_t split),
   (dx, dhalo, dw, dy, x, w, halo, pos, B, split))
// DeltaNet gates from the projections a, b: (T, nv): g = −exp(A_log) · softplus(a + dt_bias) (the log decay) and
// beta = σ(b), both (T, nv) fp32; A_log, dt_bias: (nv). Backward: da, db written; dA_log, ddt_bias fp32 +=.
OP(void, delta_gates_forward, a.dev, (Tensor g, Tensor beta, Tensor a, Tensor b, Tensor A_log, Tensor dt_bias),
   (g, beta, a, b, A_log, dt_bias))
OP(void, delta_gates_backward, a.dev,
   (Tensor da, Tensor db, Tensor dA_log, Tensor ddt_bias, Tensor dg, Tensor dbeta, Tensor a, Tensor b, Tensor A_log,
    Tensor dt_bias),
   (da, db, dA_log, ddt_bias, dg, dbeta, a, b, A_log, dt_bias))
// The gated delta rule (DeltaArgs: ops.h).
OP(void, delta_rule_forward, q.dev, (Tensor o, Tensor q, Tensor k, Tensor v, Tensor g, Tensor beta, const DeltaArgs *a),
   (o, q, k, v, g, beta, a))
OP(void, delta_rule_backward, q.dev,
   (Tensor dq, Tensor dk, Tensor dv, Tensor dg, Tensor dbeta, Tensor dout, Tensor q, Tensor k, Tensor v, Tensor g,
    Tensor beta, const DeltaArgs *a),
   (dq, dk, dv, dg, dbeta, dout, q, k, v, g, beta, a))

// ---- mixture of experts (RouterArgs: ops.h) ----
OP(void, router_forward, logits.dev, (Tensor probs, Tensor idx, Tensor w, Tensor logits, const RouterArgs *a),
   (probs, idx, w, logits, a))
// dlogits: (T, E) = ∂/∂logits of (Σ dw·w + Σ_t,e lb_grad[e]·probs[t, e]); lb_grad: (E) fp32 or p == NULL.
OP(void, router_backward, probs.dev,
   (Tensor dlogits, Tensor dw, Tensor lb_grad, Tensor probs, Tensor idx, Tensor w, const RouterArgs *a),
   (dlogits, dw, lb_grad, probs, idx, w, a))
// Micro-batch load-balancing loss (Switch form, docs/reference.md §2) and its gradient w.r.t. probs:
// f_e = count_e/(T·k), P_e = mean_t probs[t,e], loss = coef·E·Σ f_e P_e; lb_grad[e] = grad_scale·coef·E·f_e/T.
// Adds the loss into loss_sum: (1) fp64.
OP(void, moe_lb_loss, probs.dev,
   (Tensor loss_sum, Tensor lb_grad, Tensor probs, Tensor idx, float coef, float grad_scale),
   (loss_sum, lb_grad, probs, idx, coef, grad_scale))
// Expert counts: cnt: (E) fp64 += for each e, the number of idx's entries equal to e (whole numbers: exact in any
// order). An index outside [0, E) stops the CPU; on the GPU it counts as the nearest valid one (op_moe_sort flags it).
OP(void, moe_count, idx.dev, (Tensor cnt, Tensor idx), (cnt, idx))
// Stable sort of the T·k (token, slot) pairs by expert: perm: (T·k) int32 lists slot ids t·k+j in expert
// order; offs: (E+1) int64 on idx's device, the group boundaries (offs[E] = T·k). Nothing comes to the host: an expert
// index outside [0, E) stops the CPU at once, and on the GPU sorts as the nearest valid one and is kept for
// op_moe_sort_bad_expert (ops.h), which the step reads at its end. at (p NULL: not wanted): (T·k) int32, the inverse,
// at[perm[i]] = i: where each slot's row lies in expert order.
OP(void, moe_sort, idx.dev, (Tensor perm, Tensor at, Tensor offs, Tensor idx, int E), (perm, at, offs, idx, E))
// y[i] = x[rows[i] / div] (gather, y: (R, H)).
OP(void, gather_rows, x.dev, (Tensor y, Tensor x, Tensor rows, int div), (y, x, rows, div))
// dx[rows[i] / div] += dy[i] (scatter-add by index, dy: (R, H)): the backward of op_gather_rows.
OP(void, scatter_add_rows, dy.dev, (Tensor dx, Tensor dy, Tensor rows, int div), (dx, dy, rows, div))
// y[rows[i]] = x[i] (a permutation scatter); its backward is op_gather_rows(dx, dy, rows, 1).
OP(void, scatter_rows, x.dev, (Tensor y, Tensor x, Tensor rows), (y, x, rows))
// The combine reads slot s = t·k + j's expert output from row r(s) of y: r(s) = at[s] (at: (T·k) int32, op_moe_sort's
// inverse, y in expert order as the experts wrote it) or r(s) = s (at.p NULL, y in slot order).
// out: (T, H) = resid + Σ_j w[t, j] · y[r(t·k + j)]
OP(void, moe_combine_forward, y.dev, (Tensor out, Tensor resid, Tensor y, Tensor w, Tensor at), (out, resid, y, w, at))
// dy[r(s)] = w[s]·dout[t]; dw[s] = ⟨dout[t], y[r(s)]⟩ for s = t·k + j (dy in y's order)
OP(void, moe_combine_backward, y.dev, (Tensor dy, Tensor dw, Tensor dout, Tensor y, Tensor w, Tensor at),
   (dy, dw, dout, y, w, at))

// ---- embedding and loss ----
// h: (T, H) = table: (V, H)[tokens: (T) int32]
OP(void, embedding_forward, h.dev, (Tensor h, Tensor table, Tensor tokens), (h, table, tokens))
// dtable[tokens[t]] += dh[t]
OP(void, embedding_backward, dh.dev, (Tensor dtable, Tensor dh, Tensor tokens), (dtable, dh, tokens))
// Cross-entropy on a chunk of logits: (R, V) fp32 or bf16 (statistics in fp32, lse in fp64), labels: (R)
// int32 (−100 = ignore). Adds Σ CE into loss_sum: (1) fp64, writes each row's CE into row_loss: (R) fp64 (0 for an
// ignored row; p == NULL: not wanted) and overwrites logits with grad_scale·∂(Σ CE)/∂logits (softmax − onehot) in
// their own dtype.
OP(void, cross_entropy, logits.dev, (Tensor logits, Tensor labels, Tensor loss_sum, Tensor row_loss, float grad_scale),
   (logits, labels, loss_sum, row_loss, grad_scale))

// ---- elementwise and optimizer ----
OP(void, zero, x.dev, (Tensor x), (x))
OP(void, add, y.dev, (Tensor y, Tensor x), (y, x))  // y += x
OP(void, scale, x.dev, (Tensor x, float s), (x, s)) // x *= s
// same shape; converts dtype and crosses devices
OP(void, copy, dst.dev == DEV_CUDA ? DEV_CUDA : src.dev, (Tensor dst, Tensor src), (dst, src))
// dst = src (same dtype and size, dst on the host) without holding the host: on the GPU queued on a copy stream behind
// the compute stream's work so far, so that compute goes on beside it (at the link's speed into pinned dst); dst holds
// the data after ops_copies_wait, and nothing may write src before that. The CPU copies at once.
OP(void, copy_async, src.dev, (Tensor dst, Tensor src), (dst, src))
// dst = src (same dtype and size, dst on the device, src on the host) queued in stream order without waiting for it:
// the copy runs when the GPU reaches it, so the host can queue the work that reads dst while earlier work still runs
// (the trainer loads a micro-batch while the previous one computes). src must not change until ops_uploads_wait
// (at the link's speed from pinned src). The CPU copies at once.
OP(void, upload, dst.dev, (Tensor dst, Tensor src), (dst, src))
// Column blocks on 2-D views (rows × the rest): dst[:, a + h·da : +n] (+)= src[:, b + h·db : +n] for h < reps,
// converting dtype (fp32, bf16); da = 0 sums the reps source blocks into one, in order of h (the first written
// unless accumulate); otherwise da ≥ n. Tensors have no strides, so the models split and join heads with it (its
// transpose is itself with roles swapped, and a broadcast's is its sum); op_copy_cols is its one-block form.
OP_OWN(void, copy_col_blocks, dst.dev,
       (Tensor dst, int64_t a, int64_t da, Tensor src, int64_t b, int64_t db, int64_t n, int64_t reps, bool accumulate),
       (dst, a, da, src, b, db, n, reps, accumulate))
OP(double, sum_squares, x.dev, (Tensor x), (x)) // Σ x² (fp32 or bf16 tensor) in fp64, returned on the host
OP(double, read_scalar, x.dev, (Tensor x), (x)) // x: (1) fp32 or fp64, to the host
// torch.optim.AdamW on flat tensors (p fp32, g fp32 or bf16), the gradient read as gscale·g (the 1/tokens mean and the clip factor
// folded in): p *= 1 − lr·wd; m = b1·m + (1−b1)·g; v = b2·v + (1−b2)·g²; p −= lr/(1−b1^t) · m / (sqrt(v/(1−b2^t)) +
// eps). w (bf16 or fp32, p's size; w.p == NULL: none) receives the new p in its dtype: the compute copy in the
// same pass. m and v: fp32, or both bf16 (optimizer.state_dtype): read into fp32, the update from their fp32 values,
// stored rounded to nearest even.
OP_OWN(void, adamw, p.dev,
       (Tensor p, Tensor g, Tensor m, Tensor v, Tensor w, float gscale, float lr, float b1, float b2, float eps,
        float wd, int t),
       (p, g, m, v, w, gscale, lr, b1, b2, eps, wd, t))
// Muon (docs/architecture.md, "Muon"), on flat fp32 tensors: buf = β·buf + (1−β)·g, then g ← (1−β)·g + β·buf
// (the Nesterov-style update, in place of the gradient).
OP(void, muon_momentum, buf.dev, (Tensor buf, Tensor g, float beta), (buf, g, beta))
// p = p·(1 − lr·wd) − lr·scale·o (decoupled weight decay, then the scaled orthogonalised update).
OP(void, muon_apply, p.dev, (Tensor p, Tensor o, float lr, float wd, float scale), (p, o, lr, wd, scale))

// ---- FP8 (Fp8Blocks: ops.h) ----
// y = q·s (dequantised quantised x) in y's dtype, x, y: (R, C) fp32 or bf16 (y may be x); groups: rows offs[g] ..
// offs[g+1] of x, offs (groups + 1) int64 on x's device (p NULL: one group of all rows). A 3-D x: (E, N, K) is E groups
// of N rows. q·s holds at most 4 significant bits and a power-of-two scale, so it is exact in bf16 and fp32.
// A non-finite x is refused: the CPU stops naming the element; the GPU writes NaN over its block, which the step's
// non-finite check then reports.
OP(void, fp8_round, x.dev, (Tensor y, Tensor x, Fp8Blocks b, Tensor offs), (y, x, b, offs))

#undef OP
#undef OP_OWN

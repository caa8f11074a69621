// cpu_elem.c — embedding, cross-entropy, elementwise helpers and AdamW on the CPU.
#include "ops/cpu/cpu_ops.h"

// Dies naming the first token id of tokens outside [0, V): the data checks ids when a file is opened; this is
// the last line of defence (a file changed under a running job).
static void embedding_ids_check(Tensor tokens, int64_t T, int64_t V) {
    for (int64_t t = 0; t < T; t++) {
        int32_t id = I32(tokens)[t];
        if (id < 0 || id >= V)
            die("embedding: token id %d (position %lld of the micro-batch) is outside the vocabulary of %lld", id,
                (long long)t, (long long)V);
    }
}

void cpu_embedding_forward(Tensor h, Tensor table, Tensor tokens) {
    int64_t T = t_rows(h), H = t_cols(h), V = t_rows(table);
    embedding_ids_check(tokens, T, V);
#pragma omp parallel for
    for (int64_t t = 0; t < T; t++) memcpy(F(h) + t * H, F(table) + (int64_t)I32(tokens)[t] * H, H * sizeof(float));
}

void cpu_embedding_backward(Tensor dtable, Tensor dh, Tensor tokens) {
    int64_t T = t_rows(dh), H = t_cols(dh);
    embedding_ids_check(tokens, T, t_rows(dtable));
    for (int64_t t = 0; t < T; t++) {
        float *d = F(dtable) + (int64_t)I32(tokens)[t] * H;
        for (int64_t c = 0; c < H; c++) d[c] += F(dh)[t * H + c];
    }
}

// CE_r = lse(logits_r) − logits_r[label]; ∂CE_r/∂logits_r = softmax(logits_r) − onehot(label).
// One pass of expf per logit: the exponentials are stored in place, then scaled by 1/Σ. The rows' losses are summed
// in row order, so the sum does not depend on the thread count.
void cpu_cross_entropy(Tensor logits, Tensor labels, Tensor loss_sum, Tensor row_loss, float grad_scale) {
    CPU_F32(logits);
    int64_t R = t_rows(logits), V = t_cols(logits);
    CHECK(!row_loss.p || (row_loss.dt == DT_F64 && tensor_numel(row_loss) == R));
    double *row = row_loss.p ? memset(row_loss.p, 0, R * sizeof(double)) : xcalloc(R ? R : 1, sizeof(double)),
           total = 0;
    for (int64_t r = 0; r < R; r++)
        if (I32(labels)[r] != -100 && (I32(labels)[r] < 0 || I32(labels)[r] >= V))
            die("cross_entropy: label %d (row %lld) is outside the vocabulary of %lld", I32(labels)[r], (long long)r,
                (long long)V);
#pragma omp parallel for
    for (int64_t r = 0; r < R; r++) {
        float *l = F(logits) + r * V;
        int32_t y = I32(labels)[r];
        if (y == -100) {
            for (int64_t c = 0; c < V; c++) l[c] = 0;
            continue;
        }
        float m = -INFINITY, ly = l[y];
        for (int64_t c = 0; c < V; c++) m = fmaxf(m, l[c]);
        double sum = 0;
        for (int64_t c = 0; c < V; c++) sum += l[c] = expf(l[c] - m);
        row[r] = m + log(sum) - ly;
        float scale = (float)(grad_scale / sum);
        for (int64_t c = 0; c < V; c++) l[c] *= scale;
        l[y] -= grad_scale;
    }
    for (int64_t r = 0; r < R; r++) total += row[r];
    if (!row_loss.p) free(row);
    ((double *)loss_sum.p)[0] += total;
}

void cpu_zero(Tensor x) { memset(x.p, 0, tensor_bytes(x)); }

void cpu_add(Tensor y, Tensor x) {
    int64_t n = tensor_numel(y);
    CHECK(tensor_numel(x) == n);
#pragma omp parallel for
    for (int64_t i = 0; i < n; i++) F(y)[i] += F(x)[i];
}

void cpu_scale(Tensor x, float s) {
    int64_t n = tensor_numel(x);
#pragma omp parallel for
    for (int64_t i = 0; i < n; i++) st_fb(x, i, ld_fb(x, i) * s);
}

// The same dtype, or fp32 ↔ bf16 (rounding to nearest even).
void cpu_copy(Tensor dst, Tensor src) {
    int64_t n = tensor_numel(src);
    CHECK(tensor_numel(dst) == n);
    if (dst.dt == src.dt) memmove(dst.p, src.p, tensor_bytes(src));
    else if (dst.dt == DT_BF16 && src.dt == DT_F32)
        for (int64_t i = 0; i < n; i++) ((uint16_t *)dst.p)[i] = f32_to_bf16(F(src)[i]);
    else if (dst.dt == DT_F32 && src.dt == DT_BF16)
        for (int64_t i = 0; i < n; i++) F(dst)[i] = bf16_to_f32(((const uint16_t *)src.p)[i]);
    else die("copy: %s to %s is not a conversion the CPU makes", dtype_name(src.dt), dtype_name(dst.dt));
}

void cpu_copy_async(Tensor dst, Tensor src) { cpu_copy(dst, src); }
void cpu_upload(Tensor dst, Tensor src) { cpu_copy(dst, src); }

// Shapes checked by op_copy_col_blocks; da = 0: block h > 0 adds into what the blocks before it left.
void cpu_copy_col_blocks(Tensor dst, int64_t a, int64_t da, Tensor src, int64_t b, int64_t db, int64_t n, int64_t reps,
                         bool accumulate) {
    CPU_F32(dst);
    CPU_F32(src);
    int64_t R = t_rows(dst), Cd = t_cols(dst), Cs = t_cols(src);
#pragma omp parallel for
    for (int64_t r = 0; r < R; r++)
        for (int64_t h = 0; h < reps; h++) {
            float *d = F(dst) + r * Cd + a + h * da;
            const float *s = F(src) + r * Cs + b + h * db;
            bool add = accumulate || (da == 0 && h > 0);
            for (int64_t c = 0; c < n; c++) d[c] = add ? d[c] + s[c] : s[c];
        }
}

// Σ x² over blocks of SUM_BLOCK elements, the blocks' sums added in block order: the same bits whatever the
// thread count.
enum { SUM_BLOCK = 1 << 14 };
double cpu_sum_squares(Tensor x) {
    int64_t n = tensor_numel(x), nb = (n + SUM_BLOCK - 1) / SUM_BLOCK;
    double *part = xcalloc(nb ? nb : 1, sizeof(double)), s = 0;
#pragma omp parallel for if (nb > 1)
    for (int64_t b = 0; b < nb; b++) {
        int64_t end = (b + 1) * SUM_BLOCK < n ? (b + 1) * SUM_BLOCK : n;
        double t = 0;
        for (int64_t i = b * SUM_BLOCK; i < end; i++) t += (double)ld_fb(x, i) * ld_fb(x, i);
        part[b] = t;
    }
    for (int64_t b = 0; b < nb; b++) s += part[b];
    free(part);
    return s;
}

// torch.optim.AdamW (single-tensor path) on gscale·g: p *= 1 − lr·wd; m.lerp_(g, 1 − b1); v = b2·v + (1 − b2)·g²;
// p −= (lr / (1 − b1^t)) · m / (sqrt(v) / sqrt(1 − b2^t) + eps); then w = p in w's dtype. m and v are read into fp32
// and the update uses their fp32 values; bf16 moments are stored rounded to nearest even. A p or stored v that is not
// finite sets adamw_bad (an OR: the same whatever the thread count).
static bool adamw_bad;

bool cpu_adamw_nonfinite(void) {
    bool b = adamw_bad;
    adamw_bad = false;
    return b;
}

void cpu_adamw(Tensor p, Tensor g, Tensor m, Tensor v, Tensor w, float gscale, float lr, float b1, float b2, float eps,
               float wd, int t) {
    int64_t n = tensor_numel(p);
    float step = (float)(lr / (1.0 - pow(b1, t))), bc2 = (float)sqrt(1.0 - pow(b2, t)), decay = 1.0f - lr * wd;
    if (w.p && w.dt != DT_F32 && w.dt != DT_BF16) die("adamw: the compute copy is %s (fp32 or bf16)", dtype_name(w.dt));
    bool half = m.dt == DT_BF16, bad = false;
    uint16_t *m16 = m.p, *v16 = v.p;
#pragma omp parallel for reduction(|| : bad)
    for (int64_t i = 0; i < n; i++) {
        float gi = gscale * ld_fb(g, i), mi = half ? bf16_to_f32(m16[i]) : F(m)[i],
              vi = half ? bf16_to_f32(v16[i]) : F(v)[i];
        F(p)[i] *= decay;
        mi += (1.0f - b1) * (gi - mi);
        vi = b2 * vi + (1.0f - b2) * gi * gi;
        F(p)[i] -= step * mi / (sqrtf(vi) / bc2 + eps);
        if (half) m16[i] = f32_to_bf16(mi), v16[i] = f32_to_bf16(vi), vi = bf16_to_f32(v16[i]);
        else F(m)[i] = mi, F(v)[i] = vi;
        bad = bad || !isfinite(F(p)[i]) || !isfinite(vi);
        if (w.p && w.dt == DT_F32) F(w)[i] = F(p)[i];
        else if (w.p) ((uint16_t *)w.p)[i] = f32_to_bf16(F(p)[i]);
    }
    if (bad) adamw_bad = true;
}

double cpu_read_scalar(Tensor x) { return x.dt == DT_F64 ? ((double *)x.p)[0] : ((float *)x.p)[0]; }

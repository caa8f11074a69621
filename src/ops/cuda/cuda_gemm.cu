// cuda_gemm.cu — dense and grouped (per-expert) GEMMs through cuBLASLt, plus the bias kernels.
// A linear weight is (N, K) = (out, in); y: (M, N) = x: (M, K) · wᵀ. cuBLASLt is column-major, and a
// row-major (r, c) matrix is the column-major (c, r) matrix with leading dimension c, so each row-major
// product C = A·B is issued as the column-major Cᵀ = Bᵀ·Aᵀ (cuBLASLt docs, "cublasLtMatmul"):
//   forward          y(M,N)  = x·wᵀ   → col-major (N×M) = op_T(w: K×N) · op_N(x: K×M)
//   backward input   dx(M,K) = dy·w   → col-major (K×M) = op_N(w: K×N) · op_N(dy: N×M)
//   backward weight  dw(N,K) += dyᵀ·x → col-major (K×N) = op_N(x: K×M) · op_T(dy: N×M), beta = 1
// Precision: CUBLAS_COMPUTE_32F always (fp32 accumulation; fp32 operands are NOT run as TF32, so fp32
// parity runs match the CPU). A and B must share a dtype: when one operand is fp32 and the other bf16
// (the fp32 LM-head / router logits gradients against bf16 weights and activations), the fp32 operand is
// rounded to bf16 (autocast semantics) in row chunks through the fixed conversion pool. D is the output
// tensor's dtype (bf16, or fp32 for logits and the fp32 weight-gradient accumulators; bf16 expert gradients add
// their stored value in fp32 through beta = 1 and round once).
// Grouped (expert) GEMMs: the wgmma kernels (cuda_wgmma.cu) where they fit, reading the experts' offsets on the device,
// else one cuBLASLt product per expert on offsets read back to the host ("Which implementation runs an expert
// product", below).
#include "ops/cuda/cuda_common.cuh"

static cudaDataType_t lt_type(DType dt) {
    if (dt == DT_F32) return CUDA_R_32F;
    if (dt == DT_BF16) return CUDA_R_16BF;
    die("gemm: dtype %s is not supported on the GPU (fp32 or bf16)", dtype_name(dt));
}

static uint32_t align_of(const void *p) {
    uintptr_t a = (uintptr_t)p;
    uint32_t al = 256;
    while (al > 1 && (a & (al - 1))) al >>= 1;
    return al;
}

// A strided batch of products (lt_matmul_on): D_i = op(A_i)·op(B_i) + beta·D_i for i < count, where
// X_i = X + i·stride_X elements; ONE is a single product.
typedef struct {
    int64_t count, sa, sb, sd;
} Batch;
static const Batch ONE = {1, 0, 0, 0};

// The heuristic's choice for one problem description, cached (the query costs tens of microseconds).
typedef struct {
    int64_t m, n, k, lda, ldb, ldd;
    Batch bt;
    int ta, tb, adt, ddt, beta0;
    uint32_t al[3];
} GemmKey;
static_assert(sizeof(GemmKey) == 10 * 8 + 8 * 4, "GemmKey is hashed and compared as bytes: no padding");
typedef struct {
    GemmKey key;
    cublasLtMatmulAlgo_t algo;
    bool used, none; // none: the heuristic had no algorithm (FP8 products only; the caller falls back)
} GemmCacheEntry;
#define GEMM_CACHE 2048 // slots: a model's step asks for tens of shapes; a process (the GPU suite) for many more
#define GEMM_PROBES 16
static GemmCacheEntry gemm_cache[GEMM_CACHE];
static int64_t gemm_queries; // the heuristic's answers asked for so far (cuda_grouped_calls("heuristic"))

// Token counts change from call to call (the experts' rows), so the heuristic is asked once per bucket of
// n and k — the next 2^j or 1.5·2^j at or above them — and its algorithm serves every size in the bucket
// (a size it refuses gets its own query; lt_matmul_on).
static int64_t size_bucket(int64_t v) {
    int64_t b = 1;
    while (b < v) {
        if (b >= 2 && b + b / 2 >= v) return b + b / 2;
        b *= 2;
    }
    return b;
}

// The three matrix layouts of a product (A, B, D), with the batch attributes when bt has several.
static void lt_layouts(cudaDataType_t at, cudaDataType_t dtt, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                       int64_t lda, int64_t ldb, int64_t ldd, Batch bt, cublasLtMatrixLayout_t lay[3]) {
    CUDA_CHECK(cublasLtMatrixLayoutCreate(&lay[0], at, ta ? k : m, ta ? m : k, lda));
    CUDA_CHECK(cublasLtMatrixLayoutCreate(&lay[1], at, tb ? n : k, tb ? k : n, ldb));
    CUDA_CHECK(cublasLtMatrixLayoutCreate(&lay[2], dtt, m, n, ldd));
    if (bt.count > 1) {
        int32_t cnt = (int32_t)bt.count;
        int64_t str[3] = {bt.sa, bt.sb, bt.sd};
        for (int i = 0; i < 3; i++) {
            CUDA_CHECK(cublasLtMatrixLayoutSetAttribute(lay[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &cnt, sizeof cnt));
            CUDA_CHECK(cublasLtMatrixLayoutSetAttribute(lay[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &str[i],
                                                        sizeof str[i]));
        }
    }
}
static void lt_layouts_destroy(cublasLtMatrixLayout_t lay[3]) {
    for (int i = 0; i < 3; i++) CUDA_CHECK(cublasLtMatrixLayoutDestroy(lay[i]));
}

// The heuristic's first algorithm for the problem in key (its sizes, leading dims, batch, alignments); false when it
// has none, or with must a one-line error.
static bool lt_heuristic(cublasLtMatmulDesc_t op, const GemmKey *key, cudaDataType_t at, cudaDataType_t dtt,
                         cublasLtMatmulAlgo_t *algo, bool must) {
    CudaCtx *c = cuda_ctx();
    cublasLtMatrixLayout_t lay[3];
    lt_layouts(at, dtt, key->ta, key->tb, key->m, key->n, key->k, key->lda, key->ldb, key->ldd, key->bt, lay);
    cublasLtMatmulPreference_t pref;
    CUDA_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    uint64_t ws = CUDA_LT_WS_BYTES;
    CUDA_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    const cublasLtMatmulPreferenceAttributes_t align[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4; i++) // C and D are the one output
        CUDA_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, align[i], &key->al[i < 3 ? i : 2], sizeof(uint32_t)));
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    gemm_queries++;
    cublasStatus_t st =
        cublasLtMatmulAlgoGetHeuristic(c->lt, op, lay[0], lay[1], lay[2], lay[2], pref, 1, &res, &found);
    CUDA_CHECK(cublasLtMatmulPreferenceDestroy(pref));
    lt_layouts_destroy(lay);
    if (st == CUBLAS_STATUS_SUCCESS && found > 0) return *algo = res.algo, true;
    if (must)
        die("gemm: cuBLASLt has no algorithm for m=%lld n=%lld k=%lld (%s operands, %s output)", (long long)key->m,
            (long long)key->n, (long long)key->k, dtype_name((DType)key->adt), dtype_name((DType)key->ddt));
    return false;
}

// The cache entry of key: its own among GEMM_PROBES slots from its hash, else the first free one there, else the hash's
// slot (replaced). *miss: it did not hold key's answer; it now carries key and the caller fills in the answer.
// FNV-1a over the key's bytes, then a 64-bit finalizer (MurmurHash3's fmix64): FNV's low bits alone depend only on
// the bytes' low bits, and a step's keys (sizes that are multiples of 8) fell into a few slots — 48 linear shapes into
// 8 of 256, one holding 32 — so most products asked the heuristic (tens of microseconds of host time or more) at every
// call (gpu_op_linear_algo_cache, gpu_step_no_host_sync).
static GemmCacheEntry *gemm_slot(const GemmKey *key, bool *miss) {
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < sizeof *key; i++) h = (h ^ ((const unsigned char *)key)[i]) * 0x100000001b3ULL;
    h ^= h >> 33, h *= 0xff51afd7ed558ccdULL, h ^= h >> 33;
    GemmCacheEntry *s = &gemm_cache[h % GEMM_CACHE];
    for (int i = 0; i < GEMM_PROBES; i++) {
        GemmCacheEntry *p = &gemm_cache[(h + i) % GEMM_CACHE];
        if (!p->used || !memcmp(&p->key, key, sizeof *key)) {
            s = p;
            break;
        }
    }
    *miss = !s->used || memcmp(&s->key, key, sizeof *key);
    if (*miss) s->key = *key, s->used = true;
    return s;
}

// The operation of a product: op(A) = Aᵀ when ta, op(B) = Bᵀ when tb, fp32 accumulation.
static cublasLtMatmulDesc_t lt_desc(bool ta, bool tb) {
    cublasLtMatmulDesc_t op;
    CUDA_CHECK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    CUDA_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
    CUDA_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
    return op;
}

// Column-major D(m×n) = op(A)(m×k) · op(B)(k×n) + beta·D; A stored (k×m if ta else m×k) with lda, B stored
// (n×k if tb else k×n) with ldb; A and B of dtype abt, D of dtype dt.
// Runs on `stream` with workspace `ws` (CUDA_LT_WS_BYTES); lt_matmul: the compute stream and its workspace.
static void lt_matmul_on(cudaStream_t stream, void *ws_mem, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                         const void *A, int64_t lda, const void *B, int64_t ldb, DType abt, float beta, void *D,
                         int64_t ldd, DType dt, Batch bt) {
    if (m == 0 || n == 0) return;
    CudaCtx *c = cuda_ctx();
    if (k == 0) { // the product is empty: D = beta·D (only beta 0 or 1 occur)
        if (beta == 0) CUDA_CHECK(cudaMemset2DAsync(D, ldd * dtype_size(dt), 0, m * dtype_size(dt), n, stream));
        return;
    }
    if (abt == DT_F32 && dt != DT_F32) die("gemm: fp32 operands need an fp32 output (got %s)", dtype_name(dt));
    cudaDataType_t at = lt_type(abt), dtt = lt_type(dt);
    cublasLtMatmulDesc_t op = lt_desc(ta, tb);
    cublasLtMatrixLayout_t lay[3];
    lt_layouts(at, dtt, ta, tb, m, n, k, lda, ldb, ldd, bt, lay);
    cublasLtMatrixLayout_t la = lay[0], lb = lay[1], ld = lay[2];
    uint32_t al[3] = {align_of(A), align_of(B), align_of(D)};
    GemmKey key = {m, n, k, lda, ldb, ldd, bt, ta, tb, (int)abt, (int)dt, beta == 0, {al[0], al[1], al[2]}};
    // a single product buckets n and k where no leading dimension bounds them (ta: lda ≥ k; !tb: ldb ≥ k; tb: ldb ≥ n)
    if (bt.count == 1) {
        int64_t nb = size_bucket(n), kb = size_bucket(k);
        if (!(tb && nb > ldb)) key.n = nb;
        if (!(ta && kb > lda) && !(!tb && kb > ldb)) key.k = kb;
    }
    bool miss;
    GemmCacheEntry *ce = gemm_slot(&key, &miss);
    if (miss) {
        GemmKey exact = key;
        exact.n = n, exact.k = k;
        if (!lt_heuristic(op, &key, at, dtt, &ce->algo, false)) lt_heuristic(op, &exact, at, dtt, &ce->algo, true);
    }
    float alpha = 1.0f;
    cublasStatus_t st = cublasLtMatmul(c->lt, op, &alpha, A, la, B, lb, &beta, D, ld, D, ld, &ce->algo, ws_mem,
                                       CUDA_LT_WS_BYTES, stream);
    if (st != CUBLAS_STATUS_SUCCESS) { // the bucket's algorithm does not take this size: this exact one's (cached too)
        key.n = n, key.k = k;
        GemmCacheEntry *ex = gemm_slot(&key, &miss);
        if (miss) lt_heuristic(op, &key, at, dtt, &ex->algo, true);
        CUDA_CHECK(cublasLtMatmul(c->lt, op, &alpha, A, la, B, lb, &beta, D, ld, D, ld, &ex->algo, ws_mem,
                                  CUDA_LT_WS_BYTES, stream));
    }
    lt_layouts_destroy(lay);
    CUDA_CHECK(cublasLtMatmulDescDestroy(op));
}
// The FP8 product (cuda_common.cuh): the heuristic asked once per problem with its default alignments (256 bytes),
// its answer — an algorithm or none — cached under the operands' dtype DT_U8, apart from every bf16 product's.
bool lt_matmul_fp8(int64_t m, int64_t n, int64_t k, const void *A, const float *sa, const void *B, const float *sb,
                   void *D, DType ddt, float beta) {
    CudaCtx *c = cuda_ctx();
    cublasLtMatmulDesc_t op = lt_desc(true, false);
    int32_t ma = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F, mb = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    CUDA_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &ma, sizeof ma));
    CUDA_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mb, sizeof mb));
    CUDA_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof sa));
    CUDA_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof sb));
    GemmKey key = {m, n, k, k, k, m, ONE, true, false, DT_U8, ddt, beta == 0, {256, 256, 256}};
    bool miss;
    GemmCacheEntry *ce = gemm_slot(&key, &miss);
    if (miss) ce->none = !lt_heuristic(op, &key, CUDA_R_8F_E4M3, lt_type(ddt), &ce->algo, false);
    bool ok = !ce->none;
    if (ok) {
        cublasLtMatrixLayout_t lay[3];
        lt_layouts(CUDA_R_8F_E4M3, lt_type(ddt), true, false, m, n, k, k, k, m, ONE, lay);
        float alpha = 1.0f;
        CUDA_CHECK(cublasLtMatmul(c->lt, op, &alpha, A, lay[0], B, lay[1], &beta, D, lay[2], D, lay[2], &ce->algo,
                                  c->lt_ws, CUDA_LT_WS_BYTES, c->compute));
        lt_layouts_destroy(lay);
    }
    CUDA_CHECK(cublasLtMatmulDescDestroy(op));
    return ok;
}

static void lt_matmul(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const void *A, int64_t lda, const void *B,
                      int64_t ldb, DType abt, float beta, void *D, int64_t ldd, DType dt) {
    CudaCtx *c = cuda_ctx();
    lt_matmul_on(c->compute, c->lt_ws, ta, tb, m, n, k, A, lda, B, ldb, abt, beta, D, ldd, dt, ONE);
}

// ---- side streams for the per-expert products ----
// Where the wgmma kernels do not fit, an expert product is one cuBLASLt call per expert. Each is small (fewer output
// tiles than SMs) and back to back they leave most of the GPU idle; spread over the streams (the compute stream and
// side streams forked from it and joined back by events) they overlap. Each side stream has its own cuBLASLt
// workspace. PITH_WGRAD_STREAMS=1 keeps the serial loop.
#define WGRAD_STREAMS_MAX 8
static int wgrad_made = 1; // streams set up so far (stream 0 is the compute stream)
static cudaStream_t wgrad_stream[WGRAD_STREAMS_MAX];
static void *wgrad_ws[WGRAD_STREAMS_MAX];
static cudaEvent_t wgrad_fork, wgrad_join[WGRAD_STREAMS_MAX];
size_t gemm_side_bytes; // the side workspaces, counted by cuda_pool_bytes

// The side streams start after the work queued so far on the compute stream (side_fork returns how many streams
// there are, PITH_WGRAD_STREAMS, default 4, the compute stream included, setting up any not made yet), and the
// compute stream continues after everything queued on them (side_join).
static int side_fork(void) {
    const char *e = getenv("PITH_WGRAD_STREAMS");
    int ns = e ? atoi(e) : 4;
    ns = ns < 1 ? 1 : ns > WGRAD_STREAMS_MAX ? WGRAD_STREAMS_MAX : ns;
    CudaCtx *c = cuda_ctx();
    wgrad_stream[0] = c->compute, wgrad_ws[0] = c->lt_ws;
    if (ns > 1 && !wgrad_fork) CUDA_CHECK(cudaEventCreateWithFlags(&wgrad_fork, cudaEventDisableTiming));
    for (; wgrad_made < ns; wgrad_made++) {
        int i = wgrad_made;
        CUDA_CHECK(cudaStreamCreateWithFlags(&wgrad_stream[i], cudaStreamNonBlocking));
        CUDA_CHECK(cudaMalloc(&wgrad_ws[i], CUDA_LT_WS_BYTES));
        CUDA_CHECK(cudaEventCreateWithFlags(&wgrad_join[i], cudaEventDisableTiming));
        gemm_side_bytes += CUDA_LT_WS_BYTES;
    }
    if (ns > 1) {
        CUDA_CHECK(cudaEventRecord(wgrad_fork, c->compute));
        for (int i = 1; i < ns; i++) CUDA_CHECK(cudaStreamWaitEvent(wgrad_stream[i], wgrad_fork, 0));
    }
    return ns;
}
static void side_join(int ns) {
    CudaCtx *c = cuda_ctx();
    for (int i = 1; i < ns; i++) {
        CUDA_CHECK(cudaEventRecord(wgrad_join[i], wgrad_stream[i]));
        CUDA_CHECK(cudaStreamWaitEvent(c->compute, wgrad_join[i], 0));
    }
}

// ---- fp32 → bf16 operand rounding through the conversion pool ----
// dst = bf16(src) over n elements: 8-element vectors when both are 16-byte aligned (vec), then the last n % 8
// one by one; element by element otherwise.
__global__ void gemm_round_bf16_kernel(bf16 *dst, const float *src, int64_t n, bool vec) {
    int64_t n8 = vec ? n / 8 : 0, stride = (int64_t)gridDim.x * blockDim.x,
            i0 = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    for (int64_t i = i0; i < n8; i += stride) {
        float v[8];
        ld8(src + i * 8, v);
        st8(dst + i * 8, v);
    }
    for (int64_t i = n8 * 8 + i0; i < n; i += stride) dst[i] = __float2bfloat16(src[i]);
}

// The rows per product of an operand t against operands of dtype abt: all of them when t is of dtype abt, else as
// many as the conversion pool holds as bf16 (t fp32, abt bf16; another pair dies naming the operands tn and an).
static int64_t chunk_rows(Tensor t, DType abt, const char *what, const char *tn, const char *an) {
    if (t.dt == abt) return INT64_MAX;
    if (t.dt != DT_F32 || abt != DT_BF16)
        die("%s: %s %s with %s %s is not supported", what, tn, dtype_name(t.dt), an, dtype_name(abt));
    int64_t r = (int64_t)(CUDA_CONVERT_BYTES / 2) / (t_cols(t) ? t_cols(t) : 1);
    if (r < 1)
        die("%s: a row of %lld fp32 values does not fit the %zu-byte conversion pool", what, (long long)t_cols(t),
            CUDA_CONVERT_BYTES);
    return r;
}
// Rows r0..r0 + n of t as an operand of dtype abt: t's own, or its fp32 rows rounded to bf16 in the conversion pool.
static const void *operand_rows(Tensor t, int64_t r0, int64_t n, DType abt) {
    int64_t cols = t_cols(t);
    if (t.dt == abt) return (const char *)t.p + r0 * cols * dtype_size(t.dt);
    CudaCtx *c = cuda_ctx();
    const float *src = (const float *)t.p + r0 * cols;
    bool vec = aligned16(src, c->convert);
    n *= cols;
    gemm_round_bf16_kernel<<<grid_for(vec ? n / 8 : n, 256), 256, 0, c->compute>>>((bf16 *)c->convert, src, n, vec);
    CUDA_LAUNCH_CHECK();
    return c->convert;
}

// ---- bias ----
// part: (G, N) fp32, row g = Σ over row group g of dy: (M, N) (colsum_finish adds the groups to db in order).
template <typename T> __global__ void linear_bias_backward_kernel(float *part, const T *dy, int64_t M, int64_t N) {
    colsum_block(part, M, N, [=](int64_t i, int64_t j) { return ld(dy, i * N + j); });
}

// The products in row chunks (chunk_rows), as the column-major calls of the table at the top: out (M, C) (+)= in (M, D)
// · op(w), w (N, K), the forward (op T: C = N, D = K) or the input gradient (C = K, D = N).
static void rows_product(bool input_grad, Tensor out, Tensor in, Tensor w, float beta, const char *what) {
    int64_t M = t_rows(in), N = t_rows(w), K = t_cols(w), C = input_grad ? K : N, D = input_grad ? N : K;
    int64_t rows = chunk_rows(in, w.dt, what, input_grad ? "dy" : "x", "w");
    CHECK(t_cols(in) == D && t_rows(out) == M && t_cols(out) == C);
    for (int64_t r0 = 0, n; r0 < M; r0 += n) {
        n = M - r0 < rows ? M - r0 : rows;
        lt_matmul(!input_grad, false, C, n, D, w.p, K, operand_rows(in, r0, n, w.dt), D, w.dt, beta,
                  (char *)out.p + r0 * C * dtype_size(out.dt), C, out.dt);
    }
}

extern "C" {

void cuda_linear_forward(Tensor y, Tensor x, Tensor w, Tensor b) {
    rows_product(false, y, x, w, 0.0f, "linear_forward");
    if (b.p) cuda_linear_bias_forward(y, b, (Tensor){0});
}

void cuda_linear_backward_input(Tensor dx, Tensor dy, Tensor w, bool accumulate) {
    rows_product(true, dx, dy, w, accumulate ? 1.0f : 0.0f, "linear_backward_input");
}

// Mixed dtypes: the fp32 one of dy, x is rounded to bf16, a chunk of rows (the reduction dim) at a time.
void cuda_linear_backward_weight(Tensor dw, Tensor db, Tensor dy, Tensor x, bool accumulate) {
    int64_t M = t_rows(dy), N = t_cols(dy), K = t_cols(x);
    CHECK(t_rows(x) == M && t_rows(dw) == N && t_cols(dw) == K && (accumulate || !db.p));
    IS_F32(dw, "linear_backward_weight");
    DType abt = dy.dt == x.dt ? x.dt : DT_BF16;
    int64_t C = dy.dt == abt ? chunk_rows(x, abt, "linear_backward_weight", "x", "dy")
                             : chunk_rows(dy, abt, "linear_backward_weight", "dy", "x");
    if (M == 0 && !accumulate) cuda_zero(dw);
    for (int64_t r0 = 0, n; r0 < M; r0 += n) {
        n = M - r0 < C ? M - r0 : C;
        lt_matmul(false, true, K, N, n, operand_rows(x, r0, n, abt), K, operand_rows(dy, r0, n, abt), N, abt,
                  accumulate || r0 ? 1.0f : 0.0f, dw.p, K, DT_F32);
    }
    if (db.p) cuda_linear_bias_backward(db, dy, (Tensor){0}, true);
}

} // extern "C"

// ---- grouped products ----
// Which implementation runs an expert product: the wgmma kernels (cuda_wgmma.cu: bf16, N and K multiples of 64, one
// persistent launch for any routing, the offsets read on the device), else (fp32, other sizes,
// PITH_GROUPED_KERNEL=loop) one cuBLASLt product per expert, dealt to the side streams in turn, whose shapes need the
// offsets on the host: read back (cuda_offsets_host, a wait). Read on every call, so a test or benchmark can switch
// it in-process.
static bool grouped_wgmma(int kind, Tensor out, Tensor a, Tensor b, Tensor offs, bool accumulate, Tensor bias,
                          const char *what) {
    const int64_t *o = offsets_device(offs, (kind == WG_WEIGHT_GRAD ? out : b).n[0], what);
    const char *e = getenv("PITH_GROUPED_KERNEL");
    return !(e && !strcmp(e, "loop")) && wgmma_grouped(kind, out, a, b, o, accumulate, bias);
}

// The forward and the input gradient are one product with different operand roles (w: (E, N, K)):
//   forward         out y (R, N)  = in x (R, K) · w_eᵀ   col-major y_e (N×M_e) = op_T(w_e: K×N) · op_N(x_e: K×M_e)
//   input gradient  out dx (R, K) = in dy (R, N) · w_e   col-major dx_e (K×M_e) = op_N(w_e: K×N) · op_N(dy_e: N×M_e)
// So with C = out's columns and D = in's columns, out_e (C×M_e) = op(w_e) (lda K) · in_e (D×M_e), op = T for
// the forward.
// bias.p (the forward): the wgmma kernels may add it in their epilogue; true when they did (else the caller adds it).
static bool grouped_rows_product(bool input_grad, Tensor out, Tensor in, Tensor w, Tensor bias, Tensor offs_t,
                                 const char *what) {
    int64_t E = w.n[0], N = w.n[1], K = w.n[2], C = input_grad ? K : N, D = input_grad ? N : K;
    CHECK(t_cols(in) == D && t_cols(out) == C);
    if (in.dt != w.dt)
        die("%s: %s %s and w %s must share a dtype", what, input_grad ? "dy" : "x", dtype_name(in.dt),
            dtype_name(w.dt));
    if (grouped_wgmma(input_grad ? WG_INPUT_GRAD : WG_FORWARD, out, in, w, offs_t, false, bias, what))
        return bias.p != NULL;
    const int64_t *offs = cuda_offsets_host(offs_t, E);
    CHECK(offs[E] <= t_rows(in));
    size_t is = dtype_size(in.dt), os = dtype_size(out.dt);
    int ns = side_fork();
    for (int64_t e = 0, i = 0; e < E; e++) { // (D = 0: a product of depth 0 writes zeros)
        int64_t M = offs[e + 1] - offs[e], s = i++ % ns;
        if (M)
            lt_matmul_on(wgrad_stream[s], wgrad_ws[s], !input_grad, false, C, M, D, (const char *)w.p + e * N * K * is,
                         K, (const char *)in.p + offs[e] * D * is, D, w.dt, 0.0f, (char *)out.p + offs[e] * C * os, C,
                         out.dt, ONE);
    }
    side_join(ns);
    return false;
}

// ---- per-expert biases (GPT-OSS) ----
// y[i, j] += b[e, j] for the expert e whose rows hold i (the last e with offs[e] ≤ i: empty experts skip; rows from
// offs[E] on are no expert's), the offsets read into shared memory first (E + 1 ≤ BIAS_MAX_E + 1); dense (offs
// NULL): E 1.
#define BIAS_MAX_E 1024
template <typename TY, typename TB>
__global__ void bias_forward_kernel(TY *y, const TB *b, const int64_t *offs, int E, int64_t R, int64_t N) {
    __shared__ int o[BIAS_MAX_E + 1];
    for (int e = threadIdx.x; e <= E; e += blockDim.x) o[e] = offs ? (int)offs[e] : e == 0 ? 0 : (int)R;
    __syncthreads();
    GRID_STRIDE(i, R * N) if (i / N < o[E]) st(y, i, ld(y, i) + ld(b, (int64_t)group_of(o, E, i / N) * N + i % N));
}

// db[e, j] (+)= Σ_(rows of e) dy[row, j]: a block (colsum_rows) per (column tile, expert), one writer; db fp32 or bf16
// (the sum in fp32, the stored value added in fp32, one rounding).
template <typename T, typename TD>
__global__ void grouped_bias_backward_kernel(TD *db, const T *dy, const int64_t *offs, int64_t N, int accumulate) {
    int e = blockIdx.y;
    int64_t j = blockIdx.x * 32 + threadIdx.x;
    float s = colsum_rows<float>(offs[e], offs[e + 1], 8, N, [=](int64_t i, int64_t c) { return ld(dy, i * N + c); });
    if (threadIdx.y == 0 && j < N) st(db, e * N + j, (accumulate ? ld(db, e * N + j) : 0.0f) + s);
}

extern "C" {

int64_t cuda_grouped_calls(const char *path) {
    return !strcmp(path, "wgmma")       ? wgmma_grouped_calls(false)
           : !strcmp(path, "bias")      ? wgmma_grouped_calls(true)
           : !strcmp(path, "heuristic") ? gemm_queries
                                        : 0;
}

void cuda_gemm_cache_clear(void) { memset(gemm_cache, 0, sizeof gemm_cache); }

// Grouped: rows offs[e]..offs[e+1] of x/y belong to expert e (w: (E, N, K)); x's rows come gathered (rows.p NULL).
// The bias goes into the wgmma kernels' epilogue (the same bits), else its own kernel.
void cuda_grouped_linear_forward(Tensor y, Tensor x, Tensor rows, int div, Tensor w, Tensor b, Tensor offs) {
    int64_t E = w.n[0], N = w.n[1];
    cuda_check_no_rows(rows, "grouped_linear_forward");
    if (b.p && tensor_numel(b) != E * N)
        die("grouped_linear_forward: bias must be (E, N) = (%lld, %lld)", (long long)E, (long long)N);
    if (!grouped_rows_product(false, y, x, w, b, offs, "grouped_linear_forward") && b.p)
        cuda_linear_bias_forward(y, b, offs);
}

// The bias kernels: dense (offs.p NULL) or per expert.
void cuda_linear_bias_forward(Tensor y, Tensor b, Tensor offs) {
    int64_t R = t_rows(y), N = t_cols(y), E = offs.p ? tensor_numel(b) / N : 1;
    CHECK(tensor_numel(b) == E * N);
    if (R == 0) return;
    if (E > BIAS_MAX_E || R > INT32_MAX)
        die("linear_bias_forward: a bias over %lld experts (at most %d) or %lld rows", (long long)E, BIAS_MAX_E,
            (long long)R);
    const int64_t *o = offs.p ? offsets_device(offs, E, "linear_bias_forward") : NULL;
    DT_SWITCH(y.dt, TY, "linear_bias_forward",
              DT_SWITCH(b.dt, TB, "linear_bias_forward",
                        bias_forward_kernel<TY, TB><<<grid_for(R * N, 256), 256, 0, cuda_stream()>>>(
                            (TY *)y.p, (const TB *)b.p, o, (int)E, R, N)));
    CUDA_LAUNCH_CHECK();
}

void cuda_linear_bias_backward(Tensor db, Tensor dy, Tensor offs, bool accumulate) {
    int64_t M = t_rows(dy), N = t_cols(dy), E = offs.p ? tensor_numel(db) / N : 1;
    CHECK(tensor_numel(db) == E * N);
    if (offs.p) { // one writer per (column tile, expert): written or added, empty experts included
        if (E == 0) return;
        const int64_t *o = offsets_device(offs, E, "grouped_linear_backward_weight");
        DT_SWITCH(dy.dt, T, "grouped_linear_backward_weight",
                  DT_SWITCH(db.dt, TD, "grouped_linear_backward_weight",
                            grouped_bias_backward_kernel<T, TD>
                            <<<dim3((unsigned)((N + 31) / 32), (unsigned)E), dim3(32, 8), 0, cuda_stream()>>>(
                                (TD *)db.p, (const T *)dy.p, o, N, accumulate)));
        CUDA_LAUNCH_CHECK();
        return;
    }
    IS_F32(db, "linear_backward_weight");
    CHECK(accumulate); // dense: row groups' sums, then added to db in order (colsum_finish)
    if (M == 0) return;
    int G = colsum_groups(M, N);
    float *part = colsum_part(N, G, "linear_backward_weight");
    DT_SWITCH(
        dy.dt, T, "linear_backward_weight",
        linear_bias_backward_kernel<T>
        <<<dim3((unsigned)((N + 31) / 32), (unsigned)G), dim3(32, 8), 0, cuda_stream()>>>(part, (const T *)dy.p, M, N));
    CUDA_LAUNCH_CHECK();
    colsum_finish((float *)db.p, part, G, N);
}

void cuda_grouped_linear_backward_input(Tensor dx, Tensor dy, Tensor w, Tensor offs) {
    grouped_rows_product(true, dx, dy, w, Tensor{}, offs, "grouped_linear_backward_input");
}

void cuda_grouped_linear_backward_weight(Tensor dw, Tensor db, Tensor dy, Tensor x, Tensor rows, int div, Tensor offs,
                                         bool accumulate) {
    int64_t E = dw.n[0], N = dw.n[1], K = dw.n[2];
    CHECK(t_cols(x) == K && t_cols(dy) == N);
    cuda_check_no_rows(rows, "grouped_linear_backward_weight");
    if (db.p && E > 0) { // first: the weight paths below return early
        if (tensor_numel(db) != E * N)
            die("grouped_linear_backward_weight: db must be (E, N) = (%lld, %lld)", (long long)E, (long long)N);
        cuda_linear_bias_backward(db, dy, offs, accumulate);
    }
    if (dy.dt != x.dt)
        die("grouped_linear_backward_weight: dy %s and x %s must share a dtype", dtype_name(dy.dt), dtype_name(x.dt));
    if (dw.dt != DT_F32 && dw.dt != DT_BF16)
        die("grouped_linear_backward_weight: dw is %s (fp32 or bf16)", dtype_name(dw.dt));
    if (dw.dt == DT_BF16 && x.dt == DT_F32) { // fp32 operands: each expert's fp32 sums, as many rows of dw_e at a time
        // as the conversion pool holds, then added to dw_e (one rounding)
        if (!accumulate) cuda_zero(dw);
        const int64_t *o = cuda_offsets_host(offs, E);
        int64_t rows = (int64_t)(CUDA_CONVERT_BYTES / sizeof(float)) / (K ? K : 1), n;
        if (rows < 1)
            die("grouped_linear_backward_weight: a row of %lld fp32 values passes the conversion pool", (long long)K);
        float *sum = (float *)cuda_ctx()->convert;
        for (int64_t e = 0; e < E; e++)
            for (int64_t n0 = 0; o[e + 1] > o[e] && n0 < N; n0 += n) {
                n = N - n0 < rows ? N - n0 : rows;
                lt_matmul(false, true, K, n, o[e + 1] - o[e], (const float *)x.p + o[e] * K, K,
                          (const float *)dy.p + o[e] * N + n0, N, DT_F32, 0.0f, sum, K, DT_F32);
                cuda_add(tensor_make((bf16 *)dw.p + (e * N + n0) * K, DT_BF16, DEV_CUDA, 1, n * K, 1, 1, 1),
                         tensor_make(sum, DT_F32, DEV_CUDA, 1, n * K, 1, 1, 1));
            }
        return;
    }
    // bf16 dw (gradient_dtype): the wgmma kernel and cuBLASLt sum in fp32 and add D in fp32, one rounding
    size_t s = dtype_size(x.dt), os = dtype_size(dw.dt);
    if (grouped_wgmma(WG_WEIGHT_GRAD, dw, dy, x, offs, accumulate, Tensor{}, "grouped_linear_backward_weight")) return;
    if (!accumulate) cuda_zero(dw); // the products below add
    const int64_t *o = cuda_offsets_host(offs, E);
    int ns = side_fork(); // col-major dw_e (K×N) += op_N(x_e: K×M_e) · op_T(dy_e: N×M_e); empty: nothing
    for (int64_t e = 0, i = 0; e < E; e++) {
        int64_t M = o[e + 1] - o[e], st = i++ % ns;
        if (M)
            lt_matmul_on(wgrad_stream[st], wgrad_ws[st], false, true, K, N, M, (const char *)x.p + o[e] * K * s, K,
                         (const char *)dy.p + o[e] * N * s, N, x.dt, 1.0f, (char *)dw.p + e * N * K * os, K, dw.dt,
                         ONE);
    }
    side_join(ns);
}

} // extern "C"

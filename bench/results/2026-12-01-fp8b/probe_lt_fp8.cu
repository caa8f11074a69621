// probe_lt_fp8.cu — which scale-tensor layouts cuBLASLt's block-scaled FP8 GEMM (VEC128_32F on B, BLK128x128_32F on
// A, "TN", E4M3 operands) reads on this GPU and library, against an fp64 product of the same codes and scales; then
// its speed beside the bf16 GEMM at one dense-MLP shape. The record of the early device call (README.md here).
// Build: nvcc -O2 -arch=sm_90a probe_lt_fp8.cu -lcublasLt -o probe_lt_fp8
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void ck(cudaError_t e, int line) {
    if (e != cudaSuccess) printf("cuda %s line %d\n", cudaGetErrorString(e), line), exit(1);
}
#define CK(x) ck((x), __LINE__)

static cublasLtHandle_t lt;
static void *ws;

// D(m×n) col-major = op_T(A: k×m, lda k)·op_N(B: k×n, ldb k) (+ beta·D); A codes with 128×128 block scales sa,
// B codes with 1×128 scales sb. Returns the cuBLAS status (0: ran).
static int lt_fp8(int m, int n, int k, const void *A, const float *sa, const void *B, const float *sb, void *D,
                  cudaDataType_t dt, float beta, cudaStream_t st) {
    cublasLtMatmulDesc_t op;
    cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    cublasOperation_t t = CUBLAS_OP_T, nn = CUBLAS_OP_N;
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t);
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &nn, sizeof nn);
    int32_t ma = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F, mb = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &ma, sizeof ma);
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mb, sizeof mb);
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof sa);
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof sb);
    cublasLtMatrixLayout_t la, lb, ld;
    cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, k, m, k);
    cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, k, n, k);
    cublasLtMatrixLayoutCreate(&ld, dt, m, n, m);
    cublasLtMatmulPreference_t pref;
    cublasLtMatmulPreferenceCreate(&pref);
    size_t wsb = 32 << 20;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb);
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    int s = cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, ld, ld, pref, 1, &res, &found);
    if (s == 0 && found == 0) s = -1;
    float alpha = 1;
    if (s == 0) s = cublasLtMatmul(lt, op, &alpha, A, la, B, lb, &beta, D, ld, D, ld, &res.algo, ws, wsb, st);
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la), cublasLtMatrixLayoutDestroy(lb), cublasLtMatrixLayoutDestroy(ld);
    cublasLtMatmulDescDestroy(op);
    return s;
}

static float dec(uint8_t q) {
    __nv_fp8_e4m3 v;
    memcpy(&v, &q, 1);
    return (float)v;
}

int main(void) {
    size_t ver = cublasLtGetVersion();
    printf("cublasLt version %zu\n", ver);
    cublasLtCreate(&lt);
    CK(cudaMalloc(&ws, 32 << 20));
    // m = 384 outputs (3 row blocks of A), n = 202 tokens (not a multiple of 4), k = 384 (3 k blocks)
    const int m = 384, n = 202, k = 384, KB = k / 128, MB = m / 128;
    uint8_t *A = (uint8_t *)malloc(m * k), *B = (uint8_t *)malloc(n * k);
    srand(1);
    for (int i = 0; i < m * k; i++) A[i] = (uint8_t)(rand() & 0x7f) | (rand() & 1 ? 0x80 : 0) & 0xff;
    for (int i = 0; i < n * k; i++) B[i] = (uint8_t)(rand() & 0x7f) | (rand() & 1 ? 0x80 : 0) & 0xff;
    for (int i = 0; i < m * k; i++) if ((A[i] & 0x7f) == 0x7f) A[i] = 0x3f; // no NaN codes
    for (int i = 0; i < n * k; i++) if ((B[i] & 0x7f) == 0x7f) B[i] = 0x3f;
    for (int i = 0; i < m * k; i++) if ((A[i] & 0x78) > 0x50) A[i] &= 0xcf; // keep |values| moderate
    for (int i = 0; i < n * k; i++) if ((B[i] & 0x78) > 0x50) B[i] &= 0xcf;
    // scales: powers of two per block, indexed logically sa[ob][kb] (A) and sb[r][kb] (B)
    float sa[MB][KB], *sb = (float *)malloc(sizeof(float) * n * KB);
    for (int a = 0; a < MB; a++)
        for (int b = 0; b < KB; b++) sa[a][b] = ldexpf(1, (a * 3 + b * 5) % 7 - 3);
    for (int r = 0; r < n; r++)
        for (int b = 0; b < KB; b++) sb[r * KB + b] = ldexpf(1, (r * 7 + b * 3) % 9 - 4);
    double *ref = (double *)malloc(sizeof(double) * m * n), refmax = 0;
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            double acc = 0;
            for (int kk = 0; kk < k; kk++)
                acc += (double)dec(A[i * k + kk]) * sa[i / 128][kk / 128] * dec(B[j * k + kk]) * sb[j * KB + kk / 128];
            ref[j * m + i] = acc, refmax = fmax(refmax, fabs(acc));
        }
    uint8_t *dA, *dB;
    float *dsa, *dsb, *dD;
    CK(cudaMalloc(&dA, m * k)), CK(cudaMalloc(&dB, n * k)), CK(cudaMalloc(&dsa, 4096)), CK(cudaMalloc(&dsb, 65536));
    CK(cudaMalloc(&dD, sizeof(float) * m * n));
    CK(cudaMemcpy(dA, A, m * k, cudaMemcpyHostToDevice)), CK(cudaMemcpy(dB, B, n * k, cudaMemcpyHostToDevice));
    const char *an[3] = {"A s[ob*KB+kb]", "A s[kb*MB+ob]", "A s[ob*KB4+kb]"};
    const char *bn[3] = {"B s[kb*n+r]", "B s[r*KB+kb]", "B s[kb*n4+r]"};
    int n4 = (n + 3) / 4 * 4, KB4 = (KB + 3) / 4 * 4;
    for (int dti = 0; dti < 2; dti++)
        for (int ai = 0; ai < 3; ai++)
            for (int bi = 0; bi < 3; bi++) {
                float ha[64] = {0}, *hb = (float *)calloc(16384, 4);
                for (int a = 0; a < MB; a++)
                    for (int b = 0; b < KB; b++) ha[ai == 0 ? a * KB + b : ai == 1 ? b * MB + a : a * KB4 + b] = sa[a][b];
                for (int r = 0; r < n; r++)
                    for (int b = 0; b < KB; b++) hb[bi == 0 ? b * n + r : bi == 1 ? r * KB + b : b * n4 + r] = sb[r * KB + b];
                CK(cudaMemcpy(dsa, ha, sizeof ha, cudaMemcpyHostToDevice));
                CK(cudaMemcpy(dsb, hb, 65536, cudaMemcpyHostToDevice));
                CK(cudaMemset(dD, 0, sizeof(float) * m * n));
                cudaDataType_t dt = dti ? CUDA_R_32F : CUDA_R_16BF;
                int s = lt_fp8(m, n, k, dA, dsa, dB, dsb, dD, dt, 0.0f, 0);
                CK(cudaDeviceSynchronize());
                double worst = 0;
                if (s == 0) {
                    float *h = (float *)malloc(sizeof(float) * m * n);
                    __nv_bfloat16 *hh = (__nv_bfloat16 *)h;
                    CK(cudaMemcpy(h, dD, sizeof(float) * m * n, cudaMemcpyDeviceToHost));
                    for (int i = 0; i < m * n; i++) {
                        double v = dti ? h[i] : (double)__bfloat162float(hh[i]);
                        worst = fmax(worst, fabs(v - ref[i]) / refmax);
                    }
                    free(h);
                }
                printf("%-5s %-16s %-14s status %d  max |err|/max|ref| %.3e\n", dti ? "fp32" : "bf16", an[ai], bn[bi],
                       s, s == 0 ? worst : -1.0);
                free(hb);
            }
    // beta = 1 with an fp32 D (the weight gradient adds): D = ref + ref with the first layouts
    {
        float ha[64] = {0}, *hb = (float *)calloc(16384, 4);
        for (int a = 0; a < MB; a++)
            for (int b = 0; b < KB; b++) ha[a * KB + b] = sa[a][b];
        for (int r = 0; r < n; r++)
            for (int b = 0; b < KB; b++) hb[b * n + r] = sb[r * KB + b];
        CK(cudaMemcpy(dsa, ha, sizeof ha, cudaMemcpyHostToDevice)), CK(cudaMemcpy(dsb, hb, 65536, cudaMemcpyHostToDevice));
        CK(cudaMemset(dD, 0, sizeof(float) * m * n));
        int s1 = lt_fp8(m, n, k, dA, dsa, dB, dsb, dD, CUDA_R_32F, 0.0f, 0);
        int s2 = lt_fp8(m, n, k, dA, dsa, dB, dsb, dD, CUDA_R_32F, 1.0f, 0);
        CK(cudaDeviceSynchronize());
        float *h = (float *)malloc(sizeof(float) * m * n);
        CK(cudaMemcpy(h, dD, sizeof(float) * m * n, cudaMemcpyDeviceToHost));
        double worst = 0;
        for (int i = 0; i < m * n; i++) worst = fmax(worst, fabs(h[i] - 2 * ref[i]) / (2 * refmax));
        printf("fp32 beta=1 accumulate: status %d %d  max |err|/max|ref| %.3e\n", s1, s2, worst);
    }
    // speed: T = 8192 tokens, a 2048 → 6144 projection, FP8 vs bf16 (cublasLt, default heuristic)
    {
        const int M = 6144, N = 8192, K = 2048;
        void *a8, *b8, *d16;
        float *s8a, *s8b;
        CK(cudaMalloc(&a8, (size_t)M * K * 2)), CK(cudaMalloc(&b8, (size_t)N * K * 2));
        CK(cudaMalloc(&d16, (size_t)M * N * 2));
        CK(cudaMalloc(&s8a, 1 << 20)), CK(cudaMalloc(&s8b, 1 << 22));
        CK(cudaMemset(a8, 0x30, (size_t)M * K * 2)), CK(cudaMemset(b8, 0x30, (size_t)N * K * 2));
        CK(cudaMemset(s8a, 0, 1 << 20)), CK(cudaMemset(s8b, 0, 1 << 22));
        cudaEvent_t e0, e1;
        cudaEventCreate(&e0), cudaEventCreate(&e1);
        for (int pass = 0; pass < 2; pass++) {
            float ms = 0;
            for (int rep = 0; rep < 2; rep++) {
                cudaEventRecord(e0);
                for (int i = 0; i < 20; i++) {
                    if (pass == 0) lt_fp8(M, N, K, a8, s8a, b8, s8b, d16, CUDA_R_16BF, 0.0f, 0);
                    else {
                        cublasLtMatmulDesc_t op;
                        cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
                        cublasOperation_t t = CUBLAS_OP_T;
                        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t);
                        cublasLtMatrixLayout_t la, lb, ld;
                        cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, K, M, K);
                        cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, K, N, K);
                        cublasLtMatrixLayoutCreate(&ld, CUDA_R_16BF, M, N, M);
                        float al = 1, be = 0;
                        cublasLtMatmul(lt, op, &al, a8, la, b8, lb, &be, d16, ld, d16, ld, NULL, ws, 32 << 20, 0);
                        cublasLtMatrixLayoutDestroy(la), cublasLtMatrixLayoutDestroy(lb), cublasLtMatrixLayoutDestroy(ld);
                        cublasLtMatmulDescDestroy(op);
                    }
                }
                cudaEventRecord(e1);
                CK(cudaEventSynchronize(e1));
                cudaEventElapsedTime(&ms, e0, e1);
            }
            printf("%s %d x %d x %d: %.3f ms, %.0f TFLOP/s\n", pass ? "bf16" : "fp8 ", M, N, K, ms / 20,
                   2.0 * M * N * K / (ms / 20 * 1e-3) / 1e12);
        }
    }
    return 0;
}

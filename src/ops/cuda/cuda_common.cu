// cuda_common.cu — device discovery, device memory, the process-wide CUDA context (streams, cuBLASLt,
// the fixed pools) and the measured memory in use. The context is created once, on first use; its pools
// are the only device memory the backend holds besides the arenas (cuda_pool_bytes), so ops never
// allocate.
#include "ops/cuda/cuda_common.cuh"

static CudaCtx ctx;
static bool ctx_ready;
static size_t mem_base, mem_peak; // device memory in use before pith's first allocation; largest seen since
static bool capturing;            // between cuda_graph_begin and cuda_graph_end
static int64_t graph_epoch;       // how often memory that recorded graphs point into was replaced
#define GRAPH_HINT " (a path that cannot be recorded: set cuda_graph false)"
static void *scratch;
static size_t scratch_bytes;
static int64_t host_syncs; // cuda_host_wait's calls

static size_t mem_in_use(void) {
    size_t free_b = 0, total_b = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    return total_b - free_b;
}

static void mem_sample(void) {
    size_t u = mem_in_use();
    u = u > mem_base ? u - mem_base : 0;
    if (u > mem_peak) mem_peak = u;
}

CudaCtx *cuda_ctx(void) {
    if (ctx_ready) return &ctx;
    ctx_ready = true;
    int dev = 0; // the device this thread is bound to: 0, or the rank's GPU (parallel/nccl_comm.c binds it first)
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaFree(0)); // creates the primary context
    CUDA_CHECK(cudaStreamCreateWithFlags(&ctx.compute, cudaStreamNonBlocking));
    CUDA_CHECK(cudaStreamCreateWithFlags(&ctx.comm, cudaStreamNonBlocking));
    CUDA_CHECK(cublasLtCreate(&ctx.lt));
    CUDA_CHECK(cudaDeviceGetAttribute(&ctx.sm_count, cudaDevAttrMultiProcessorCount, dev));
    mem_base = mem_in_use();
    CUDA_CHECK(cudaMalloc(&ctx.lt_ws, CUDA_LT_WS_BYTES));
    CUDA_CHECK(cudaMalloc(&ctx.convert, CUDA_CONVERT_BYTES));
    CUDA_CHECK(cudaMalloc(&ctx.small, CUDA_SMALL_BYTES));
    CUDA_CHECK(cudaMallocHost(&ctx.host_small, CUDA_SMALL_BYTES));
    mem_sample();
    return &ctx;
}

void *cuda_scratch(size_t bytes) {
    if (bytes <= scratch_bytes) return scratch;
    CudaCtx *c = cuda_ctx();
    cuda_graph_stale("the op scratch grew");
    cuda_host_wait(c->compute); // the old buffer may still be in use
    cuda_host_wait(c->comm);
    if (scratch) CUDA_CHECK(cudaFree(scratch));
    bytes = (bytes + (1 << 20) - 1) & ~(size_t)((1 << 20) - 1); // whole MiB
    cudaError_t err = cudaMalloc(&scratch, bytes);
    if (err != cudaSuccess) die("out of GPU memory: the op scratch needs %.3f GiB", bytes / 1073741824.0);
    scratch_bytes = bytes;
    mem_sample();
    return scratch;
}

void cuda_host_wait(cudaStream_t s) {
    if (capturing) die("cuda_graph: an op waits for the GPU inside the recorded forward and backward%s", GRAPH_HINT);
    host_syncs++;
    CUDA_CHECK(cudaStreamSynchronize(s));
}

bool cuda_capturing(void) { return capturing; }

void cuda_graph_stale(const char *what) {
    if (capturing) die("cuda_graph: %s while the forward and backward were being recorded%s", what, GRAPH_HINT);
    graph_epoch++;
}

const int64_t *cuda_offsets_host(Tensor offs, int64_t E) {
    CudaCtx *c = cuda_ctx();
    const int64_t *d = offsets_device(offs, E, "offsets read-back");
    CHECK((size_t)(E + 1) * sizeof(int64_t) <= CUDA_SMALL_BYTES);
    CUDA_CHECK(cudaMemcpyAsync(c->host_small, d, (E + 1) * sizeof(int64_t), cudaMemcpyDeviceToHost, c->compute));
    cuda_host_wait(c->compute);
    return (const int64_t *)c->host_small;
}

void cuda_check_no_rows(Tensor rows, const char *what) {
    if (rows.p) die("%s: the GPU takes x's rows already gathered (op_gather_rows first), not rows to gather", what);
}

// Grid (chunks, E): the blocks of expert e zero dw_e (nk a multiple of 4) when e has no rows, else return at once.
__global__ void zero_empty_experts_kernel(float4 *dw, const int64_t *offs, int64_t n16) {
    int64_t e = blockIdx.y;
    if (offs[e + 1] != offs[e]) return;
    float4 *p = dw + e * n16, z = make_float4(0, 0, 0, 0);
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n16; i += (int64_t)gridDim.x * blockDim.x)
        p[i] = z;
}

void zero_empty_experts(void *dw, const int64_t *offs, int64_t E, int64_t bytes) {
    if (E == 0 || bytes == 0) return;
    CHECK(E <= 65535 && aligned16(dw) && bytes % 16 == 0);
    zero_empty_experts_kernel<<<dim3(32, (unsigned)E), 256, 0, cuda_stream()>>>((float4 *)dw, offs, bytes / 16);
    CUDA_LAUNCH_CHECK();
}

int colsum_groups(int64_t R, int64_t N, int64_t min_rows, int64_t max_groups) {
    int64_t g = (R + min_rows - 1) / min_rows, fit = (int64_t)(CUDA_SMALL_BYTES / sizeof(float)) / (N > 0 ? N : 1);
    g = g > max_groups ? max_groups : g;
    g = g > fit ? fit : g;
    return g < 1 ? 1 : (int)g;
}

float *colsum_part(int64_t N, int G, const char *what) {
    if ((size_t)N * G * sizeof(float) > CUDA_SMALL_BYTES)
        die("%s: %lld columns exceed the small pool of the fixed-order sums", what, (long long)N);
    return (float *)cuda_ctx()->small;
}

__global__ void colsum_finish_kernel(float *out, const float *part, int G, int64_t N) {
    for (int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; j < N; j += (int64_t)gridDim.x * blockDim.x) {
        float s = 0;
        for (int g = 0; g < G; g++) s += part[g * N + j];
        out[j] += s;
    }
}

void colsum_finish(float *out, const float *part, int G, int64_t N) {
    if (N == 0) return;
    colsum_finish_kernel<<<grid_for(N, 256), 256, 0, cuda_stream()>>>(out, part, G, N);
    CUDA_LAUNCH_CHECK();
}

extern "C" {

// Number of usable GPUs; 0 when there is no driver or no device (a CUDA build on a machine without a GPU).
int cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError(); // clear the sticky "no device" error
        return 0;
    }
    return n;
}

// The device allocations held through cuda_alloc_or_die (arenas and FP8 scratch), so that an out-of-memory error
// can say what holds the device: these, and the used memory outside them (context, libraries' workspaces, scratch).
#define HELD_MAX 64
static struct {
    void *p;
    size_t bytes;
    char what[48];
} held[HELD_MAX];

void *cuda_alloc_or_die(size_t bytes, const char *what) {
    cuda_ctx();
    void *p = NULL;
    cudaError_t err = cudaMalloc(&p, bytes);
    if (err != cudaSuccess) {
        size_t free_b = 0, total_b = 0, sum = 0;
        cudaMemGetInfo(&free_b, &total_b);
        char list[1024] = "";
        for (int i = 0; i < HELD_MAX; i++)
            if (held[i].p) {
                size_t n = strlen(list);
                snprintf(list + n, sizeof list - n, "%s%s %.3f", n ? ", " : "", held[i].what,
                         held[i].bytes / 1073741824.0);
                sum += held[i].bytes;
            }
        die("out of GPU memory: %s needs %.3f GiB, %.3f GiB free of %.3f GiB; pith holds %.3f GiB (%s) and %.3f GiB "
            "more is in use (the CUDA context, library workspaces, the op scratch)",
            what, bytes / 1073741824.0, free_b / 1073741824.0, total_b / 1073741824.0, sum / 1073741824.0, list,
            (total_b - free_b - sum) / 1073741824.0);
    }
    for (int i = 0; i < HELD_MAX; i++)
        if (!held[i].p) {
            held[i].p = p, held[i].bytes = bytes;
            snprintf(held[i].what, sizeof held[i].what, "%s", what);
            break;
        }
    mem_sample();
    return p;
}

void cuda_free(void *p) {
    for (int i = 0; i < HELD_MAX; i++)
        if (held[i].p == p) held[i].p = NULL;
    CUDA_CHECK(cudaFree(p));
}

static void cuda_host_register(void *p, size_t bytes) {
    cuda_ctx();
    CUDA_CHECK(cudaHostRegister(p, bytes, cudaHostRegisterDefault));
}
static void cuda_host_unregister(void *p) { CUDA_CHECK(cudaHostUnregister(p)); }

// The base layer's device-memory hooks (base.h: arena_create on DEV_CUDA, host_register), set before main runs.
__attribute__((constructor)) static void cuda_install_device_memory(void) {
    device_alloc = cuda_alloc_or_die;
    device_free = cuda_free;
    host_register = cuda_host_register, host_unregister = cuda_host_unregister;
}

// ---- CUDA graphs (ops.h, ops_graph_*) ----
// A recording holds the addresses its kernels were given. Of the memory they point into, only the backend's own can
// move after a recording: the op scratch (grown) and the cuDNN plans (evicted from their cache). Each such replacement
// counts one epoch, and a graph recorded in an earlier one is stale: ops_graph_run refuses it, and the caller records
// again. Inside a recording they cannot happen at all (its ops would point at freed memory).
typedef struct {
    cudaGraphExec_t exec;
    int64_t epoch;
} CudaGraph;

void cuda_graph_begin(void) {
    CHECK(!capturing);
    CUDA_CHECK(cudaStreamBeginCapture(cuda_stream(), cudaStreamCaptureModeThreadLocal));
    capturing = true;
}

void *cuda_graph_end(void) {
    cudaGraph_t g;
    CUDA_CHECK(cudaStreamEndCapture(cuda_stream(), &g));
    capturing = false;
    CudaGraph *cg = (CudaGraph *)xmalloc(sizeof *cg);
    cg->epoch = graph_epoch;
    CUDA_CHECK(cudaGraphInstantiate(&cg->exec, g, 0));
    CUDA_CHECK(cudaGraphDestroy(g));
    return cg;
}

bool cuda_graph_run(void *g) {
    CudaGraph *cg = (CudaGraph *)g;
    if (cg->epoch != graph_epoch) return false;
    CUDA_CHECK(cudaGraphLaunch(cg->exec, cuda_stream()));
    return true;
}

void cuda_graph_free(void *g) {
    if (!g) return;
    cuda_host_wait(cuda_stream()); // a launch of it may still be queued
    CUDA_CHECK(cudaGraphExecDestroy(((CudaGraph *)g)->exec));
    free(g);
}

void cuda_sync(void) { cuda_host_wait(cuda_stream()); }
int64_t cuda_host_syncs(void) { return host_syncs; }

// cuda_copy_async's stream (made at the first copy) and events: the compute stream's point each copy waits for, and
// the latest copy's end, which a waiter blocks on (not spinning: a writer thread waits beside the loop).
static cudaStream_t copy_stream;
static cudaEvent_t copy_after, copy_done;
static int copy_dev;

void cuda_copy_async(Tensor dst, Tensor src) {
    CHECK(dst.dev == DEV_CPU && dst.dt == src.dt && tensor_numel(dst) == tensor_numel(src));
    cudaStream_t compute = cuda_stream();
    if (!copy_stream) {
        CUDA_CHECK(cudaGetDevice(&copy_dev));
        CUDA_CHECK(cudaStreamCreateWithFlags(&copy_stream, cudaStreamNonBlocking));
        CUDA_CHECK(cudaEventCreateWithFlags(&copy_after, cudaEventDisableTiming));
        CUDA_CHECK(cudaEventCreateWithFlags(&copy_done, cudaEventDisableTiming | cudaEventBlockingSync));
    }
    CUDA_CHECK(cudaEventRecord(copy_after, compute));
    CUDA_CHECK(cudaStreamWaitEvent(copy_stream, copy_after, 0));
    CUDA_CHECK(cudaMemcpyAsync(dst.p, src.p, tensor_bytes(src), cudaMemcpyDeviceToHost, copy_stream));
    CUDA_CHECK(cudaEventRecord(copy_done, copy_stream));
}

void cuda_copies_wait(void) { // (a thread of its own starts on device 0)
    if (copy_stream) CUDA_CHECK(cudaSetDevice(copy_dev)), CUDA_CHECK(cudaEventSynchronize(copy_done));
}

// cuda_upload's event: after the latest upload on the compute stream (made at the first).
static cudaEvent_t upload_done;

void cuda_upload(Tensor dst, Tensor src) {
    CHECK(dst.dev == DEV_CUDA && src.dev == DEV_CPU && dst.dt == src.dt && tensor_numel(dst) == tensor_numel(src));
    if (capturing) die("cuda_graph: an upload from host memory inside the recorded forward and backward%s", GRAPH_HINT);
    if (!upload_done) CUDA_CHECK(cudaEventCreateWithFlags(&upload_done, cudaEventDisableTiming));
    CUDA_CHECK(cudaMemcpyAsync(dst.p, src.p, tensor_bytes(src), cudaMemcpyHostToDevice, cuda_stream()));
    CUDA_CHECK(cudaEventRecord(upload_done, cuda_stream()));
}

void cuda_uploads_wait(void) {
    if (capturing) die("cuda_graph: an op waits for the GPU inside the recorded forward and backward%s", GRAPH_HINT);
    if (upload_done) CUDA_CHECK(cudaEventSynchronize(upload_done));
}

size_t cuda_pool_bytes(void) {
    return CUDA_LT_WS_BYTES + CUDA_CONVERT_BYTES + CUDA_SMALL_BYTES + scratch_bytes + gemm_side_bytes;
}

size_t cuda_mem_peak_bytes(void) {
    cuda_ctx();
    mem_sample();
    return mem_peak;
}

void *cuda_compute_stream(void) { return cuda_ctx()->compute; }
void *cuda_comm_stream(void) { return cuda_ctx()->comm; }

} // extern "C"

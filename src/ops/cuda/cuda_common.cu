// cuda_common.cu — device discovery and device memory for the CUDA backend.
#include "ops/cuda/cuda_common.cuh"

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

void *cuda_alloc_or_die(size_t bytes, const char *what) {
    void *p = NULL;
    cudaError_t err = cudaMalloc(&p, bytes);
    if (err != cudaSuccess) {
        size_t free_b = 0, total_b = 0;
        cudaMemGetInfo(&free_b, &total_b);
        fprintf(stderr, "pith: error: out of GPU memory: %s needs %.3f GiB, %.3f GiB free of %.3f GiB\n", what,
                bytes / 1073741824.0, free_b / 1073741824.0, total_b / 1073741824.0);
        exit(1);
    }
    return p;
}

void cuda_free(void *p) { CUDA_CHECK(cudaFree(p)); }

} // extern "C"

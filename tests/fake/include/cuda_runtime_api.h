// cuda_runtime_api.h (FAKE_CUDA builds only) — the few CUDA runtime declarations parallel/nccl_comm.c uses,
// implemented on the host by tests/fake/fake_cuda.c: device memory is host memory, streams run at once.
#pragma once
#include <stddef.h>

typedef enum { cudaSuccess = 0, cudaErrorInvalidValue = 1, cudaErrorNotReady = 600 } cudaError_t;
typedef enum {
    cudaMemcpyHostToHost,
    cudaMemcpyHostToDevice,
    cudaMemcpyDeviceToHost,
    cudaMemcpyDeviceToDevice
} cudaMemcpyKind;
typedef struct fake_stream *cudaStream_t;
typedef struct fake_event *cudaEvent_t;
#define cudaEventDisableTiming 0x02

cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaSetDevice(int dev);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *ev, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t ev);
cudaError_t cudaEventRecord(cudaEvent_t ev, cudaStream_t s);
cudaError_t cudaEventQuery(cudaEvent_t ev);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t ev, unsigned flags);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind, cudaStream_t s);
const char *cudaGetErrorString(cudaError_t e);

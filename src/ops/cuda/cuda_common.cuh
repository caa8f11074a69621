// cuda_common.cuh — error checking and shared helpers for the CUDA backend.
#pragma once
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#define CUDA_CHECK(call)                                                                              \
    do {                                                                                              \
        cudaError_t err_ = (call);                                                                    \
        if (err_ != cudaSuccess) {                                                                    \
            fprintf(stderr, "pith: CUDA error at %s:%d: %s (%s)\n", __FILE__, __LINE__,             \
                    cudaGetErrorString(err_), #call);                                                 \
            exit(1);                                                                                  \
        }                                                                                             \
    } while (0)

// Status checks for the CUDA libraries, instantiating VLM_LIB_CHECK (src/base/check.h): each
// throws vlm::Error with file:line, the failing call and the library's own error text.
// For .cu/.cpp files under kernels/cuda only; public headers stay free of CUDA includes.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
// cuDNN and NCCL are optional (kernels/cuda/CMakeLists.txt defines VLM_WITH_CUDNN / VLM_WITH_NCCL
// when they are found); code that needs one sits under the same #if.
#if VLM_WITH_CUDNN
#include <cudnn.h>
#endif
#if VLM_WITH_NCCL
#include <nccl.h>
#endif

#include "src/base/check.h"

#define VLM_CUDA_CHECK(expr) VLM_LIB_CHECK("CUDA", expr, cudaSuccess, cudaGetErrorString)
// cuBLAS and cuBLASLt share cublasStatus_t.
#define VLM_CUBLAS_CHECK(expr)                                                                     \
  VLM_LIB_CHECK("cuBLAS", expr, CUBLAS_STATUS_SUCCESS, cublasGetStatusString)
#if VLM_WITH_CUDNN
#define VLM_CUDNN_CHECK(expr)                                                                      \
  VLM_LIB_CHECK("cuDNN", expr, CUDNN_STATUS_SUCCESS, cudnnGetErrorString)
#endif
#if VLM_WITH_NCCL
#define VLM_NCCL_CHECK(expr) VLM_LIB_CHECK("NCCL", expr, ncclSuccess, ncclGetErrorString)
#endif

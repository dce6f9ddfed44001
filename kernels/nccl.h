// NCCL for parallel/comm/process_group.cpp: communicators and the collectives FSDP and TP use, on
// raw device pointers and a stream. Plain C++ (no NCCL or CUDA headers), like gpu_runtime.h: a
// build without NCCL, or without CUDA, has these declarations too and every call throws, naming
// what is missing. Communicators are opaque `void*` (an ncclComm_t); streams are `void*`
// (cudaStream_t).
#pragma once

#include <cstddef>
#include <string>

#include "src/base/dtype.h"

namespace vlm::kernels::cuda {

// Whether this build can use NCCL.
bool nccl_built();

// ncclUniqueId is 128 opaque bytes; one rank makes it and every rank of the new communicator
// receives it (over MPI) before nccl_comm_init.
constexpr size_t kNcclUniqueIdBytes = 128;
void nccl_unique_id(void* out);
// A communicator of `nranks` ranks on the current CUDA device (collective over those ranks).
void* nccl_comm_init(const void* unique_id, int nranks, int rank);
void nccl_comm_destroy(void* comm);
// Ends every operation of the communicator at once (after an error on a peer), then frees it.
void nccl_comm_abort(void* comm);
// An error reported asynchronously by the communicator (a peer failed, a network error), or ""
// while there is none. Thread-safe: the collective watchdog polls it.
std::string nccl_async_error(void* comm);

enum class NcclOp { sum, max, avg };
// Element counts are per call as in NCCL: all_gather `count` = elements each rank sends;
// reduce_scatter `count` = elements each rank receives. dtypes: f32, f64, bf16, f16, i32, i64,
// u8 (all_gather and broadcast: any).
void nccl_all_gather(const void* send, void* recv, size_t count, DType dtype, void* comm,
                     void* stream);
void nccl_reduce_scatter(const void* send, void* recv, size_t count, DType dtype, NcclOp op,
                         void* comm, void* stream);
void nccl_all_reduce(const void* send, void* recv, size_t count, DType dtype, NcclOp op, void* comm,
                     void* stream);
void nccl_broadcast(void* buffer, size_t count, DType dtype, int root, void* comm, void* stream);

} // namespace vlm::kernels::cuda

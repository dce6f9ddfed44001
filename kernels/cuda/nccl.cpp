// NCCL communicators and collectives of kernels/nccl.h. Without NCCL in the build (VLM_WITH_NCCL
// unset) every call throws, naming how to build with it.
#include "kernels/nccl.h"

#include <cstring>

#include "kernels/cuda/check.cuh"

namespace vlm::kernels::cuda {

#if VLM_WITH_NCCL

namespace {

static_assert(sizeof(ncclUniqueId) == kNcclUniqueIdBytes, "ncclUniqueId changed size");

ncclComm_t as_comm(void* c) { return static_cast<ncclComm_t>(c); }
cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

ncclDataType_t nccl_type(DType dtype, const char* what) {
  switch (dtype) {
  case DType::f32: return ncclFloat32;
  case DType::f64: return ncclFloat64;
  case DType::bf16: return ncclBfloat16;
  case DType::f16: return ncclFloat16;
  case DType::i32: return ncclInt32;
  case DType::i64: return ncclInt64;
  case DType::u8:
  case DType::boolean: return ncclUint8;
  }
  VLM_FAIL("NCCL ", what, ": no NCCL type for ", dtype_name(dtype));
}

ncclRedOp_t nccl_op(NcclOp op) {
  switch (op) {
  case NcclOp::sum: return ncclSum;
  case NcclOp::max: return ncclMax;
  case NcclOp::avg: return ncclAvg;
  }
  return ncclSum;
}

} // namespace

bool nccl_built() { return true; }

void nccl_unique_id(void* out) {
  ncclUniqueId id;
  VLM_NCCL_CHECK(ncclGetUniqueId(&id));
  std::memcpy(out, &id, sizeof id);
}

void* nccl_comm_init(const void* unique_id, int nranks, int rank) {
  ncclUniqueId id;
  std::memcpy(&id, unique_id, sizeof id);
  ncclComm_t comm = nullptr;
  VLM_NCCL_CHECK(ncclCommInitRank(&comm, nranks, id, rank));
  return comm;
}

void nccl_comm_destroy(void* comm) {
  if (comm) ncclCommDestroy(as_comm(comm));
}

void nccl_comm_abort(void* comm) {
  if (comm) ncclCommAbort(as_comm(comm));
}

std::string nccl_async_error(void* comm) {
  ncclResult_t async = ncclSuccess;
  if (ncclCommGetAsyncError(as_comm(comm), &async) != ncclSuccess)
    return "ncclCommGetAsyncError failed";
  if (async == ncclSuccess || async == ncclInProgress) return "";
  const char* last = ncclGetLastError(as_comm(comm));
  return std::string(ncclGetErrorString(async)) + (last && *last ? ": " + std::string(last) : "");
}

void nccl_all_gather(const void* send, void* recv, size_t count, DType dtype, void* comm,
                     void* stream) {
  VLM_NCCL_CHECK(ncclAllGather(send, recv, count, nccl_type(dtype, "all_gather"), as_comm(comm),
                               as_stream(stream)));
}

void nccl_reduce_scatter(const void* send, void* recv, size_t count, DType dtype, NcclOp op,
                         void* comm, void* stream) {
  VLM_NCCL_CHECK(ncclReduceScatter(send, recv, count, nccl_type(dtype, "reduce_scatter"),
                                   nccl_op(op), as_comm(comm), as_stream(stream)));
}

void nccl_all_reduce(const void* send, void* recv, size_t count, DType dtype, NcclOp op, void* comm,
                     void* stream) {
  VLM_NCCL_CHECK(ncclAllReduce(send, recv, count, nccl_type(dtype, "all_reduce"), nccl_op(op),
                               as_comm(comm), as_stream(stream)));
}

void nccl_broadcast(void* buffer, size_t count, DType dtype, int root, void* comm, void* stream) {
  VLM_NCCL_CHECK(ncclBroadcast(buffer, buffer, count, nccl_type(dtype, "broadcast"), root,
                               as_comm(comm), as_stream(stream)));
}

#else // no NCCL in this build

namespace {
[[noreturn]] void no_nccl(const char* call) {
  VLM_FAIL(call, ": this build has no NCCL (install it into the CUDA toolkit, set NCCL_ROOT or "
                 "pip-install nvidia-nccl-cu13, and configure with -DVLM_WITH_NCCL=ON)");
}
} // namespace

bool nccl_built() { return false; }
void nccl_unique_id(void*) { no_nccl("nccl_unique_id"); }
void* nccl_comm_init(const void*, int, int) { no_nccl("nccl_comm_init"); }
void nccl_comm_destroy(void*) {}
void nccl_comm_abort(void*) {}
std::string nccl_async_error(void*) { return ""; }
void nccl_all_gather(const void*, void*, size_t, DType, void*, void*) {
  no_nccl("nccl_all_gather");
}
void nccl_reduce_scatter(const void*, void*, size_t, DType, NcclOp, void*, void*) {
  no_nccl("nccl_reduce_scatter");
}
void nccl_all_reduce(const void*, void*, size_t, DType, NcclOp, void*, void*) {
  no_nccl("nccl_all_reduce");
}
void nccl_broadcast(void*, size_t, DType, int, void*, void*) { no_nccl("nccl_broadcast"); }

#endif

} // namespace vlm::kernels::cuda

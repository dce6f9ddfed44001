// MPI for the project: the real <mpi.h> (VLM_WITH_MPI=1, any MPI-3 implementation), or, in a build
// without MPI (-DVLM_WITH_MPI=OFF, or AUTO on a machine without it: a GPU test machine with no
// package registry), a stand-in for a job of one rank that implements the few calls the project
// makes: every collective copies its input (one rank sums and gathers only itself), nonblocking
// ones complete at once, MPI_Abort ends the process. Such a build runs everything single-process
// (the GPU checks, the demo); multi-rank jobs need a real MPI.
#pragma once

#if VLM_WITH_MPI
#include <mpi.h>
#else

#include <cstdlib>
#include <cstring>

using MPI_Comm = int;
using MPI_Datatype = int; // the element size in bytes: all the stand-in needs
using MPI_Op = int;
using MPI_Request = int;
using MPI_Info = int;
struct MPI_Status {};
using MPI_User_function = void(void*, void*, int*, MPI_Datatype*);

inline constexpr MPI_Comm MPI_COMM_WORLD = 1;
inline constexpr int MPI_SUCCESS = 0;
inline constexpr int MPI_THREAD_FUNNELED = 1;
inline constexpr int MPI_COMM_TYPE_SHARED = 1;
inline constexpr MPI_Info MPI_INFO_NULL = 0;
inline constexpr MPI_Request MPI_REQUEST_NULL = 0;
inline constexpr MPI_Op MPI_SUM = 1, MPI_MAX = 2;
inline constexpr MPI_Datatype MPI_BYTE = 1, MPI_UINT8_T = 1, MPI_UINT16_T = 2, MPI_INT = 4,
                              MPI_INT32_T = 4, MPI_FLOAT = 4, MPI_INT64_T = 8, MPI_DOUBLE = 8;
inline MPI_Status* const MPI_STATUS_IGNORE = nullptr;
inline void* const MPI_IN_PLACE = reinterpret_cast<void*>(1);

namespace vlm::parallel::mpi_stub {
inline int& initialized() {
  static int v = 0;
  return v;
}
inline int& finalized() {
  static int v = 0;
  return v;
}
// One rank: the result of a reduction or gather is the input.
inline int copy(const void* in, void* out, long long bytes) {
  if (in != MPI_IN_PLACE && in != out && bytes > 0) std::memcpy(out, in, size_t(bytes));
  return MPI_SUCCESS;
}
} // namespace vlm::parallel::mpi_stub

inline int MPI_Init_thread(int*, char***, int required, int* provided) {
  vlm::parallel::mpi_stub::initialized() = 1;
  *provided = required;
  return MPI_SUCCESS;
}
inline int MPI_Initialized(int* flag) {
  *flag = vlm::parallel::mpi_stub::initialized();
  return MPI_SUCCESS;
}
inline int MPI_Finalized(int* flag) {
  *flag = vlm::parallel::mpi_stub::finalized();
  return MPI_SUCCESS;
}
inline int MPI_Finalize() {
  vlm::parallel::mpi_stub::finalized() = 1;
  return MPI_SUCCESS;
}
inline int MPI_Abort(MPI_Comm, int code) { std::_Exit(code); }
inline int MPI_Comm_rank(MPI_Comm, int* rank) {
  *rank = 0;
  return MPI_SUCCESS;
}
inline int MPI_Comm_size(MPI_Comm, int* size) {
  *size = 1;
  return MPI_SUCCESS;
}
inline int MPI_Comm_split(MPI_Comm comm, int, int, MPI_Comm* out) {
  *out = comm;
  return MPI_SUCCESS;
}
inline int MPI_Comm_split_type(MPI_Comm comm, int, int, MPI_Info, MPI_Comm* out) {
  *out = comm;
  return MPI_SUCCESS;
}
inline int MPI_Comm_free(MPI_Comm*) { return MPI_SUCCESS; }
inline int MPI_Op_create(MPI_User_function*, int, MPI_Op* op) {
  *op = MPI_SUM;
  return MPI_SUCCESS;
}
inline int MPI_Barrier(MPI_Comm) { return MPI_SUCCESS; }
inline int MPI_Bcast(void*, int, MPI_Datatype, int, MPI_Comm) { return MPI_SUCCESS; }
inline int MPI_Allreduce(const void* in, void* out, int n, MPI_Datatype t, MPI_Op, MPI_Comm) {
  return vlm::parallel::mpi_stub::copy(in, out, (long long)n * t);
}
inline int MPI_Allgather(const void* in, int n, MPI_Datatype t, void* out, int, MPI_Datatype,
                         MPI_Comm) {
  return vlm::parallel::mpi_stub::copy(in, out, (long long)n * t);
}
inline int MPI_Gather(const void* in, int n, MPI_Datatype t, void* out, int, MPI_Datatype, int,
                      MPI_Comm) {
  return vlm::parallel::mpi_stub::copy(in, out, (long long)n * t);
}
inline int MPI_Gatherv(const void* in, int n, MPI_Datatype t, void* out, const int*, const int*,
                       MPI_Datatype, int, MPI_Comm) {
  return vlm::parallel::mpi_stub::copy(in, out, (long long)n * t);
}
inline int MPI_Reduce_scatter_block(const void* in, void* out, int n, MPI_Datatype t, MPI_Op,
                                    MPI_Comm) {
  return vlm::parallel::mpi_stub::copy(in, out, (long long)n * t);
}
// One rank sends to itself (the ring of parallel/comm/process_group.cpp never does: it copies
// first).
inline int MPI_Sendrecv(const void* send, int n, MPI_Datatype t, int, int, void* recv, int,
                        MPI_Datatype, int, int, MPI_Comm, MPI_Status*) {
  return vlm::parallel::mpi_stub::copy(send, recv, (long long)n * t);
}
// No rank has a peer's block to add: one rank never reduces locally (the ring returns first), so
// reaching this is a bug, not a result.
inline int MPI_Reduce_local(const void*, void*, int, MPI_Datatype, MPI_Op) { std::abort(); }
inline int MPI_Iallreduce(const void* in, void* out, int n, MPI_Datatype t, MPI_Op op, MPI_Comm c,
                          MPI_Request* r) {
  *r = MPI_REQUEST_NULL;
  return MPI_Allreduce(in, out, n, t, op, c);
}
inline int MPI_Iallgather(const void* in, int n, MPI_Datatype t, void* out, int m, MPI_Datatype u,
                          MPI_Comm c, MPI_Request* r) {
  *r = MPI_REQUEST_NULL;
  return MPI_Allgather(in, n, t, out, m, u, c);
}
inline int MPI_Ireduce_scatter_block(const void* in, void* out, int n, MPI_Datatype t, MPI_Op op,
                                     MPI_Comm c, MPI_Request* r) {
  *r = MPI_REQUEST_NULL;
  return MPI_Reduce_scatter_block(in, out, n, t, op, c);
}
inline int MPI_Wait(MPI_Request* r, MPI_Status*) {
  *r = MPI_REQUEST_NULL;
  return MPI_SUCCESS;
}

#endif

// Row-major batched GEMM on cuBLASLt (declared in kernels/gemm.h).
//
// cuBLASLt is column-major. A row-major [R,C] matrix is the same memory as a column-major
// [C,R] matrix, i.e. its transpose, so instead of C = op(A) op(B) we ask cuBLASLt for
//   C^T = op(B)^T op(A)^T,
// passing our B as cuBLASLt's A and our A as its B; no data moves.
//
// Caches (created on first use, never destroyed: destroying CUDA objects from static
// destructors races with the runtime's own teardown at exit):
//  - per (device, stream): a cuBLASLt handle and a 32 MiB workspace. One workspace per stream
//    is safe because work on a stream runs in order.
//  - per problem: the matmul/layout descriptors and the heuristic's algorithm, so steady-state
//    calls do no descriptor setup and no heuristic query.
#include "kernels/gemm.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>

#include "kernels/cuda/check.cuh"
#include "kernels/gpu_runtime.h"

namespace vlm::kernels::cuda {
namespace {

constexpr size_t kWorkspaceBytes = size_t(32) << 20;

cudaDataType_t cuda_type(GemmType t) { return t == GemmType::f32 ? CUDA_R_32F : CUDA_R_16BF; }
size_t type_size(GemmType t) { return t == GemmType::f32 ? 4 : 2; }
const char* type_name(GemmType t) { return t == GemmType::f32 ? "f32" : "bf16"; }

struct StreamContext {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
};

std::mutex& cache_mutex() {
  static std::mutex mu;
  return mu;
}

using StreamKey = std::pair<int, cudaStream_t>;
std::map<StreamKey, StreamContext>& stream_contexts() {
  static auto* contexts = new std::map<StreamKey, StreamContext>(); // leaked on purpose (above)
  return *contexts;
}

StreamContext stream_context(int device, cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(cache_mutex());
  auto& contexts = stream_contexts();
  auto it = contexts.find({device, stream});
  if (it != contexts.end()) return it->second;
  StreamContext ctx;
  VLM_CUBLAS_CHECK(cublasLtCreate(&ctx.handle));
  // Plain cudaMalloc: the workspace lives as long as the process (or the stream, see
  // gemm_release_stream), so it should not hold a block of the stream-ordered pool.
  VLM_CUDA_CHECK(cudaMalloc(&ctx.workspace, kWorkspaceBytes));
  contexts.emplace(StreamKey{device, stream}, ctx);
  return ctx;
}

// Everything the descriptors and the heuristic's choice depend on. Pointer alignment is part of
// it because cuBLASLt may pick a kernel that needs, e.g., 16-byte aligned operands.
struct PlanKey {
  int device;
  int64_t M, N, K;
  bool trans_a, trans_b;
  GemmType ab_type, c_type;
  int64_t batch, stride_a, stride_b, stride_c;
  uint32_t align_a, align_b, align_c;
  auto tie() const {
    return std::tie(device, M, N, K, trans_a, trans_b, ab_type, c_type, batch, stride_a, stride_b,
                    stride_c, align_a, align_b, align_c);
  }
  bool operator<(const PlanKey& o) const { return tie() < o.tie(); }
};

struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t layout_a = nullptr, layout_b = nullptr, layout_c = nullptr; // cuBLASLt's
  cublasLtMatmulAlgo_t algo{};
};

std::string describe(const PlanKey& k) {
  return detail::str_cat("M=", k.M, " N=", k.N, " K=", k.K, " trans_a=", k.trans_a,
                         " trans_b=", k.trans_b, " ab=", type_name(k.ab_type),
                         " c=", type_name(k.c_type), " batch=", k.batch);
}

// Largest power of two (<= 256) dividing the address of every matrix of the batch.
uint32_t alignment(const void* p, int64_t stride, GemmType t, int64_t batch) {
  uint64_t bits = reinterpret_cast<uintptr_t>(p) | 256u;
  if (batch > 1) bits |= uint64_t(stride) * type_size(t);
  return uint32_t(bits & (~bits + 1)); // lowest set bit
}

cublasLtMatrixLayout_t make_layout(GemmType t, int64_t rows, int64_t cols, int64_t ld,
                                   int64_t batch, int64_t stride) {
  cublasLtMatrixLayout_t layout = nullptr;
  VLM_CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(&layout, cuda_type(t), uint64_t(rows), uint64_t(cols), ld));
  if (batch > 1) {
    int32_t count = int32_t(batch);
    VLM_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                                      &count, sizeof count));
    VLM_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(
        layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride));
  }
  return layout;
}

Plan make_plan(const PlanKey& k, cublasLtHandle_t handle) {
  Plan p;
  // CUBLAS_COMPUTE_32F is full fp32: TF32 would only be used with CUBLAS_COMPUTE_32F_FAST_TF32.
  VLM_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  // Swapped operands (see the top of the file): cuBLASLt's A is our B and vice versa.
  cublasOperation_t op_a = k.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasOperation_t op_b = k.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  VLM_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a));
  VLM_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b));
  // Layouts describe the stored (column-major) matrices before op():
  //  our B, row-major [K,N] = column-major [N,K] (ld N); when trans_b, [N,K] = col-major [K,N].
  //  our A, row-major [M,K] = column-major [K,M] (ld K); when trans_a, [K,M] = col-major [M,K].
  //  our C, row-major [M,N] = column-major [N,M] (ld N).
  p.layout_a = k.trans_b ? make_layout(k.ab_type, k.K, k.N, k.K, k.batch, k.stride_b)
                         : make_layout(k.ab_type, k.N, k.K, k.N, k.batch, k.stride_b);
  p.layout_b = k.trans_a ? make_layout(k.ab_type, k.M, k.K, k.M, k.batch, k.stride_a)
                         : make_layout(k.ab_type, k.K, k.M, k.K, k.batch, k.stride_a);
  p.layout_c = make_layout(k.c_type, k.N, k.M, k.N, k.batch, k.stride_c);

  cublasLtMatmulPreference_t pref = nullptr;
  VLM_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  uint64_t workspace = kWorkspaceBytes;
  VLM_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof workspace));
  // cuBLASLt's A/B are our B/A.
  const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> aligns[] = {
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, k.align_b},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, k.align_a},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, k.align_c},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, k.align_c}};
  for (const auto& [attr, value] : aligns)
    VLM_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &value, sizeof value));

  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(
      handle, p.desc, p.layout_a, p.layout_b, p.layout_c, p.layout_c, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS || found == 0)
    VLM_FAIL("cuBLASLt has no algorithm for gemm ", describe(k), ": ",
             st != CUBLAS_STATUS_SUCCESS ? cublasGetStatusString(st) : "no heuristic result");
  p.algo = result.algo;
  return p;
}

const Plan& plan_for(const PlanKey& k, cublasLtHandle_t handle) {
  static auto* plans = new std::map<PlanKey, Plan>(); // leaked on purpose (top of file)
  std::lock_guard<std::mutex> lock(cache_mutex());
  auto it = plans->find(k);
  if (it == plans->end()) it = plans->emplace(k, make_plan(k, handle)).first;
  return it->second; // map nodes are stable, and a plan is never modified after creation
}

// K == 0: the product is empty, so C = beta * C (beta == 0 writes zeros without reading C).
template <typename T>
__global__ void scale_kernel(T* c, int64_t mn, int64_t total, int64_t stride_c, float beta) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    T* p = c + (i / mn) * stride_c + i % mn;
    float v = beta == 0.0f ? 0.0f : beta * float(*p);
    *p = T(v);
  }
}

void scale_c(void* c, GemmType c_type, int64_t mn, int64_t batch, int64_t stride_c, float beta,
             cudaStream_t stream) {
  if (beta == 1.0f) return;
  int64_t total = mn * batch;
  int blocks = int(std::min<int64_t>((total + 255) / 256, 4096));
  if (c_type == GemmType::f32)
    scale_kernel<<<blocks, 256, 0, stream>>>(static_cast<float*>(c), mn, total, stride_c, beta);
  else
    scale_kernel<<<blocks, 256, 0, stream>>>(static_cast<__nv_bfloat16*>(c), mn, total, stride_c,
                                             beta);
  check_last_launch("gemm (K = 0: C = beta * C)");
}

} // namespace

void gemm(void* c, GemmType c_type, const void* a, const void* b, GemmType ab_type, int64_t M,
          int64_t N, int64_t K, bool trans_a, bool trans_b, float alpha, float beta, int64_t batch,
          int64_t stride_a, int64_t stride_b, int64_t stride_c, void* stream) {
  VLM_CHECK(M >= 0 && N >= 0 && K >= 0 && batch >= 0, "gemm: negative size M=", M, " N=", N,
            " K=", K, " batch=", batch);
  VLM_CHECK(!(ab_type == GemmType::f32 && c_type == GemmType::bf16),
            "gemm: f32 inputs with a bf16 output are not supported");
  VLM_CHECK(batch <= INT32_MAX, "gemm: batch ", batch, " exceeds cuBLASLt's int32 batch count");
  VLM_CHECK(stride_a >= 0 && stride_b >= 0 && stride_c >= 0, "gemm: negative batch stride");
  VLM_CHECK(batch <= 1 || stride_c >= M * N, "gemm: output batches overlap (stride_c=", stride_c,
            " < M*N=", M * N, ")");
  if (M == 0 || N == 0 || batch == 0) return;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (K == 0) return scale_c(c, c_type, M * N, batch, stride_c, beta, s);

  int device = 0;
  VLM_CUDA_CHECK(cudaGetDevice(&device));
  StreamContext ctx = stream_context(device, s);
  PlanKey key{device,
              M,
              N,
              K,
              trans_a,
              trans_b,
              ab_type,
              c_type,
              batch,
              batch > 1 ? stride_a : 0,
              batch > 1 ? stride_b : 0,
              batch > 1 ? stride_c : 0,
              alignment(a, stride_a, ab_type, batch),
              alignment(b, stride_b, ab_type, batch),
              alignment(c, stride_c, c_type, batch)};
  const Plan& plan = plan_for(key, ctx.handle);
  // Our B is cuBLASLt's A, our A its B; C is both its C and D (in place for beta != 0).
  cublasStatus_t st = cublasLtMatmul(ctx.handle, plan.desc, &alpha, b, plan.layout_a, a,
                                     plan.layout_b, &beta, c, plan.layout_c, c, plan.layout_c,
                                     &plan.algo, ctx.workspace, kWorkspaceBytes, s);
  count_library_call(); // the launch counters (kernels/gpu_runtime.h)
  if (st != CUBLAS_STATUS_SUCCESS)
    VLM_FAIL("cuBLASLt matmul failed for gemm ", describe(key), ": ", cublasGetStatusString(st));
}

void gemm_release_stream(void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  int device = 0;
  VLM_CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(cache_mutex());
  auto& contexts = stream_contexts();
  auto it = contexts.find({device, s});
  if (it == contexts.end()) return;
  // Work already queued on the stream may still use the workspace.
  VLM_CUDA_CHECK(cudaStreamSynchronize(s));
  VLM_CUDA_CHECK(cudaFree(it->second.workspace));
  VLM_CUBLAS_CHECK(cublasLtDestroy(it->second.handle));
  contexts.erase(it);
}

} // namespace vlm::kernels::cuda

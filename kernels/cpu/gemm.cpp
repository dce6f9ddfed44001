#include "kernels/gemm.h"

#include <cblas.h>

#include <algorithm>
#include <vector>

namespace vlm::kernels::cpu {

namespace {

void blas_gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int M, int N, int K, float alpha,
               const float* a, int lda, const float* b, int ldb, float beta, float* c, int ldc) {
  cblas_sgemm(CblasRowMajor, ta, tb, M, N, K, alpha, a, lda, b, ldb, beta, c, ldc);
}
void blas_gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int M, int N, int K, float alpha,
               const double* a, int lda, const double* b, int ldb, float beta, double* c, int ldc) {
  cblas_dgemm(CblasRowMajor, ta, tb, M, N, K, alpha, a, lda, b, ldb, beta, c, ldc);
}

// One BLAS call per batch matrix.
template <typename T>
void blas_batched(T* c, const T* a, const T* b, const GemmShape& s, float alpha, float beta) {
  // BLAS wants leading dimensions >= 1 even for empty matrices (K = 0: C = beta * C).
  int lda = int(std::max<int64_t>(1, s.trans_a ? s.M : s.K)),
      ldb = int(std::max<int64_t>(1, s.trans_b ? s.K : s.N)), ldc = int(std::max<int64_t>(1, s.N));
  for (int64_t i = 0; i < s.batch; i++)
    blas_gemm(s.trans_a ? CblasTrans : CblasNoTrans, s.trans_b ? CblasTrans : CblasNoTrans,
              int(s.M), int(s.N), int(s.K), alpha, a + i * s.stride_a, lda, b + i * s.stride_b, ldb,
              beta, c + i * s.stride_c, ldc);
}

} // namespace

template <>
void gemm<float>(float* c, const float* a, const float* b, const GemmShape& s, float alpha,
                 float beta) {
  blas_batched(c, a, b, s, alpha, beta);
}

template <>
void gemm<double>(double* c, const double* a, const double* b, const GemmShape& s, float alpha,
                  float beta) {
  blas_batched(c, a, b, s, alpha, beta);
}

namespace {
// Widens n bf16 values to f32.
void widen(float* dst, const bf16* src, int64_t n) {
  for (int64_t j = 0; j < n; j++) dst[j] = float(src[j]);
}
} // namespace

template <>
void gemm<bf16>(bf16* c, const bf16* a, const bf16* b, const GemmShape& s, float alpha,
                float beta) {
  // bf16 storage, f32 arithmetic: widen one batch matrix at a time.
  int64_t na = s.M * s.K, nb = s.K * s.N, nc = s.M * s.N;
  std::vector<float> fa(na), fb(nb), fc(nc);
  GemmShape one = s;
  one.batch = 1;
  for (int64_t i = 0; i < s.batch; i++) {
    widen(fa.data(), a + i * s.stride_a, na);
    widen(fb.data(), b + i * s.stride_b, nb);
    bf16* ci = c + i * s.stride_c;
    if (beta != 0.f)
      for (int64_t j = 0; j < nc; j++) fc[j] = float(ci[j]);
    gemm<float>(fc.data(), fa.data(), fb.data(), one, alpha, beta);
    for (int64_t j = 0; j < nc; j++) ci[j] = bf16(fc[j]);
  }
}

void gemm_bf16_f32(float* c, const bf16* a, const bf16* b, const GemmShape& s, float alpha,
                   float beta) {
  // bf16 values are exact in f32: widen the inputs, multiply into C itself.
  int64_t na = s.M * s.K, nb = s.K * s.N;
  std::vector<float> fa(na), fb(nb);
  GemmShape one = s;
  one.batch = 1;
  for (int64_t i = 0; i < s.batch; i++) {
    widen(fa.data(), a + i * s.stride_a, na);
    widen(fb.data(), b + i * s.stride_b, nb);
    gemm<float>(c + i * s.stride_c, fa.data(), fb.data(), one, alpha, beta);
  }
}

} // namespace vlm::kernels::cpu

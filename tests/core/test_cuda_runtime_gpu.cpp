// CUDA runtime services and the cuBLASLt GEMM, checked against plain CPU loops. Every test that
// needs a GPU skips (exit 77) with the device_query() text when there is none.
#include <catch2/catch.hpp>

#include "tests/skip.h"

#if VLM_WITH_CUDA

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/gemm.h"
#include "kernels/gpu_runtime.h"
#include "src/base/dtype.h"
#include "src/base/rng.h"

namespace cu = vlm::kernels::cuda;

namespace {

void require_device() {
  if (cu::device_count() == 0) VLM_SKIP(cu::device_query().c_str());
}

// A device buffer freed at scope exit (on the default stream).
struct DeviceBuffer {
  void* p = nullptr;
  explicit DeviceBuffer(size_t bytes) : p(cu::malloc_async(bytes, nullptr)) {}
  ~DeviceBuffer() { cu::free_async(p, nullptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

struct GemmCase {
  int64_t M, N, K;
  bool trans_a, trans_b;
  float alpha, beta;
  int64_t batch;
};

// Host values as stored on the device: f32 as is, bf16 rounded. Returns the values the device
// will see (as float) and writes the raw bytes.
std::vector<float> random_matrix(size_t n, cu::GemmType t, vlm::Rng& rng,
                                 std::vector<uint8_t>& bytes) {
  std::vector<float> v(n);
  bytes.resize(n * (t == cu::GemmType::f32 ? 4 : 2));
  for (size_t i = 0; i < n; ++i) {
    float x = float(rng.uniform(-1.0, 1.0));
    if (t == cu::GemmType::f32) {
      std::memcpy(bytes.data() + 4 * i, &x, 4);
    } else {
      vlm::bf16 h(x);
      std::memcpy(bytes.data() + 2 * i, &h.bits, 2);
      x = float(h);
    }
    v[i] = x;
  }
  return v;
}

std::vector<float> to_floats(const std::vector<uint8_t>& bytes, cu::GemmType t) {
  size_t n = bytes.size() / (t == cu::GemmType::f32 ? 4 : 2);
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    if (t == cu::GemmType::f32) {
      std::memcpy(&v[i], bytes.data() + 4 * i, 4);
    } else {
      uint16_t b;
      std::memcpy(&b, bytes.data() + 2 * i, 2);
      v[i] = vlm::bf16::to_float(b);
    }
  }
  return v;
}

// Runs one case on the GPU and compares with a double-precision CPU loop. The error of each
// element is measured against sum_k |a||b| + |beta c|, the natural scale of its rounding error,
// so cancellation to values near zero does not make the check flaky.
void check_gemm(const GemmCase& g, cu::GemmType ab_type, cu::GemmType c_type, double tol) {
  CAPTURE(g.M, g.N, g.K, g.trans_a, g.trans_b, g.alpha, g.beta, g.batch);
  vlm::Rng rng(1234, uint64_t(g.M * 131 + g.N * 17 + g.K));
  const int64_t sa = g.M * g.K, sb = g.K * g.N, sc = g.M * g.N;
  std::vector<uint8_t> a_bytes, b_bytes, c_bytes;
  std::vector<float> a = random_matrix(size_t(sa * g.batch), ab_type, rng, a_bytes);
  std::vector<float> b = random_matrix(size_t(sb * g.batch), ab_type, rng, b_bytes);
  std::vector<float> c0 = random_matrix(size_t(sc * g.batch), c_type, rng, c_bytes);

  DeviceBuffer da(a_bytes.size()), db(b_bytes.size()), dc(c_bytes.size());
  cu::memcpy_h2d(da.p, a_bytes.data(), a_bytes.size(), nullptr);
  cu::memcpy_h2d(db.p, b_bytes.data(), b_bytes.size(), nullptr);
  cu::memcpy_h2d(dc.p, c_bytes.data(), c_bytes.size(), nullptr);
  // beta = 0: C is output only. Poisoned with NaN (all-ones bytes, NaN in f32 and bf16), so an
  // element the GEMM leaves unwritten, or a C that is read although beta = 0, fails the check.
  if (g.beta == 0.0f) cu::memset_async(dc.p, 0xFF, c_bytes.size(), nullptr);
  cu::gemm(dc.p, c_type, da.p, db.p, ab_type, g.M, g.N, g.K, g.trans_a, g.trans_b, g.alpha, g.beta,
           g.batch, sa, sb, sc, nullptr);
  std::vector<uint8_t> out_bytes(c_bytes.size());
  cu::memcpy_d2h(out_bytes.data(), dc.p, out_bytes.size(), nullptr);
  cu::stream_synchronize(nullptr);
  std::vector<float> out = to_floats(out_bytes, c_type);

  double worst = 0;
  for (int64_t bi = 0; bi < g.batch; ++bi) {
    const float* A = a.data() + bi * sa;
    const float* B = b.data() + bi * sb;
    for (int64_t i = 0; i < g.M; ++i) {
      for (int64_t j = 0; j < g.N; ++j) {
        double sum = 0, scale = 0;
        for (int64_t k = 0; k < g.K; ++k) {
          double x = g.trans_a ? A[k * g.M + i] : A[i * g.K + k];
          double y = g.trans_b ? B[j * g.K + k] : B[k * g.N + j];
          sum += x * y;
          scale += std::fabs(x * y);
        }
        double cij = c0[size_t(bi * sc + i * g.N + j)];
        double ref = g.alpha * sum + g.beta * cij;
        scale = std::fabs(g.alpha) * scale + std::fabs(g.beta * cij) + 1e-30;
        double err = std::fabs(out[size_t(bi * sc + i * g.N + j)] - ref) / scale;
        if (std::isnan(err)) err = INFINITY; // std::max would drop a NaN
        worst = std::max(worst, err);
      }
    }
  }
  INFO("worst scaled error " << worst);
  CHECK(worst <= tol);
}

const std::vector<GemmCase>& gemm_cases() {
  static const std::vector<GemmCase> cases = {
      {1, 1, 1, false, false, 1.0f, 0.0f, 1},
      {7, 5, 3, false, false, 1.0f, 0.0f, 1},      // odd sizes: unaligned leading dimensions
      {64, 48, 80, false, true, 1.0f, 0.0f, 1},    // x @ W^T (a linear layer)
      {33, 65, 129, true, false, 0.5f, 0.0f, 1},   // x^T @ dy (a weight gradient)
      {40, 24, 56, true, true, 1.0f, 1.0f, 1},     // both transposed, accumulate into C
      {128, 96, 256, false, false, 1.0f, 1.0f, 1}, // beta = 1: gradient accumulation
      {17, 31, 45, false, true, 2.0f, -0.5f, 4},   // batched, general alpha/beta
      {32, 32, 64, true, false, 1.0f, 0.0f, 3},    // batched, transposed A
  };
  return cases;
}

} // namespace

TEST_CASE("cuda runtime: device_query never throws and describes the machine") {
  std::string text;
  REQUIRE_NOTHROW(text = cu::device_query());
  INFO(text);
  REQUIRE(!text.empty());
  REQUIRE(text.find("cuBLASLt") != std::string::npos);
  if (cu::device_count() == 0) {
    CHECK(text.rfind("no CUDA device: ", 0) == 0);
  } else {
    CHECK(text.rfind("cuda:0 ", 0) == 0);
  }
}

TEST_CASE("cuda runtime: malloc_async, memset and memcpy round trip") {
  require_device();
  const size_t n = 1 << 20;
  std::vector<float> host(n), back(n, -1.0f);
  for (size_t i = 0; i < n; ++i) host[i] = float(i) * 0.25f - 7.0f;
  DeviceBuffer x(n * 4), y(n * 4);
  cu::memcpy_h2d(x.p, host.data(), n * 4, nullptr);
  cu::memcpy_d2d(y.p, x.p, n * 4, nullptr);
  cu::memcpy_d2h(back.data(), y.p, n * 4, nullptr);
  cu::stream_synchronize(nullptr);
  CHECK(back == host);

  // Pinned staging buffer plus memset.
  auto* pinned = static_cast<uint8_t*>(cu::host_alloc_pinned(n));
  REQUIRE(pinned != nullptr);
  cu::memset_async(x.p, 0xAB, n, nullptr);
  cu::memcpy_d2h(pinned, x.p, n, nullptr);
  cu::stream_synchronize(nullptr);
  size_t bad = 0;
  for (size_t i = 0; i < n; ++i) bad += pinned[i] != 0xAB;
  CHECK(bad == 0);
  cu::host_free_pinned(pinned);

  CHECK(cu::malloc_async(0, nullptr) == nullptr);
  CHECK_NOTHROW(cu::free_async(nullptr, nullptr));
  CHECK(cu::current_device() >= 0);
  CHECK_NOTHROW(cu::check_last_launch("no launch"));
  CHECK_NOTHROW(cu::device_synchronize());
}

TEST_CASE("cuda gemm: f32 matches a CPU loop (fp32 compute, no TF32)") {
  require_device();
  // TF32 (10-bit mantissa) would miss this by orders of magnitude.
  for (const GemmCase& g : gemm_cases()) check_gemm(g, cu::GemmType::f32, cu::GemmType::f32, 1e-5);
}

TEST_CASE("cuda gemm: bf16 inputs, bf16 and f32 outputs match a CPU loop") {
  require_device();
  for (const GemmCase& g : gemm_cases()) {
    check_gemm(g, cu::GemmType::bf16, cu::GemmType::bf16, 1e-2);
    // Products of bf16 values are exact in fp32, so an f32 output is far better than 1e-2.
    check_gemm(g, cu::GemmType::bf16, cu::GemmType::f32, 1e-4);
  }
}

// Argument checks run before any CUDA call, so this needs no device.
TEST_CASE("cuda gemm: rejects unsupported arguments") {
  using cu::GemmType;
  CHECK_THROWS_WITH(cu::gemm(nullptr, GemmType::bf16, nullptr, nullptr, GemmType::f32, 2, 2, 2,
                             false, false, 1.0f, 0.0f, 1, 0, 0, 0, nullptr),
                    Catch::Contains("not supported"));
  CHECK_THROWS_WITH(cu::gemm(nullptr, GemmType::f32, nullptr, nullptr, GemmType::f32, 2, 2, 2,
                             false, false, 1.0f, 0.0f, 2, 4, 4, 0, nullptr),
                    Catch::Contains("overlap"));
  CHECK_THROWS_WITH(cu::gemm(nullptr, GemmType::f32, nullptr, nullptr, GemmType::f32, -1, 2, 2,
                             false, false, 1.0f, 0.0f, 1, 0, 0, 0, nullptr),
                    Catch::Contains("negative size"));
}

TEST_CASE("cuda gemm: K = 0 gives beta * C") {
  require_device();
  check_gemm({8, 6, 0, false, false, 1.0f, 0.5f, 2}, cu::GemmType::f32, cu::GemmType::f32, 1e-6);
  check_gemm({8, 6, 0, false, true, 1.0f, 0.0f, 1}, cu::GemmType::bf16, cu::GemmType::bf16, 1e-6);
}

TEST_CASE("cuda runtime: events order and time work on the default stream") {
  require_device();
  void* start = cu::event_create(true);
  void* end = cu::event_create(true);
  CHECK(cu::event_done(start)); // never recorded
  const size_t bytes = size_t(64) << 20;
  void* p = cu::malloc_async(bytes, nullptr);
  cu::event_record(start, nullptr);
  cu::memset_async(p, 0, bytes, nullptr);
  cu::event_record(end, nullptr);
  cu::event_synchronize(end);
  CHECK(cu::event_done(end));
  const float ms = cu::event_elapsed_ms(start, end);
  INFO("memset of 64 MiB: " << ms << " ms");
  CHECK(ms > 0.0f);    // 64 MiB take a few microseconds at least
  CHECK(ms < 1000.0f); // and far less than a second on any GPU (milliseconds, not microseconds)
  cu::free_async(p, nullptr);
  cu::event_destroy(start);
  cu::event_destroy(end);
}

TEST_CASE("cuda runtime: peak_bf16_tflops knows the Hopper and Ampere data-centre GPUs") {
  require_device();
  const std::string q = cu::device_query(); // "cuda:0 NVIDIA H100 80GB HBM3, sm_90, ..."
  const size_t at = q.find(", sm_");
  REQUIRE(at != std::string::npos);
  const std::string sm = q.substr(at + 5, 2);
  const double peak = cu::peak_bf16_tflops(0);
  INFO(q << "\npeak " << peak << " TFLOP/s");
  if (sm == "90") { // H100 SXM / H200 / GH200 989.4, H100 PCIe 756.5 (dense bf16)
    CHECK((peak == 989.4 || peak == 756.5));
  } else if (sm == "80") { // A100
    CHECK(peak == 312.0);
  } else { // unknown: 0 (MFU not reported), or the L40S
    CHECK((peak == 0.0 || peak == 362.1));
  }
  CHECK(cu::peak_bf16_tflops(cu::device_count()) == 0.0); // no such device: 0, no exception
}

#else

TEST_CASE("cuda runtime: skipped") { VLM_SKIP("built without CUDA"); }

#endif

// cuDNN fused attention on a GPU (src/core/ops/attention_cudnn.h): its first-use self-check on
// the production configurations (Qwen3 GQA d 128, Qwen3.5 d 256, vision towers d 72/80
// bidirectional), and the attention op running through cuDNN against the CPU op on packed bf16
// documents of up to 2300 tokens, forward and backward, with the backend that ran asserted.
// Tolerances (max-norm relative error against the CPU op on the same bf16 inputs): forward 2e-2,
// backward 4e-2 — the own tensor-core kernel's bounds doubled, because cuDNN's rounding of P and
// dS to bf16 has not been measured yet; each case prints its errors so the first GPU run can set
// them to 3x the observed. Skips without a device or without cuDNN attention in this build.
#include <catch2/catch.hpp>

#include "tests/skip.h"

#if VLM_WITH_CUDA

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "kernels/attention_cudnn.h"
#include "src/base/rng.h"
#include "src/core/ops/attention.h"
#include "src/core/ops/attention_cudnn.h"
#include "tests/gpu_testing.h"

using namespace vlm;
namespace ca = vlm::kernels::cudnn_attention;
using vlm::testing::kGpu;
using vlm::testing::rel_err;
using vlm::testing::require_device;

namespace {

void require_cudnn_attention() {
  require_device();
  if (!ca::cuda::frontend_built())
    VLM_SKIP("this build has no cuDNN frontend headers: cuDNN attention is not built "
             "(tools/deps/fetch_cudnn_frontend.sh, then rebuild)");
}

kernels::AttentionShape shape_of(int64_t hq, int64_t hkv, int64_t d, bool causal) {
  kernels::AttentionShape s;
  s.q_heads = hq;
  s.kv_heads = hkv;
  s.head_dim = d;
  s.causal = causal;
  s.scale = 1.0 / std::sqrt(double(d));
  return s;
}

} // namespace

TEST_CASE("gpu cuDNN attention: the self-check passes on the production configurations",
          "[attention][cudnn][gpu]") {
  require_cudnn_attention();
  const ca::Capability cap = ca::cuda::capability(0);
  std::printf("%s\n", ops_detail::attention_backend_summary(kGpu).c_str());
  struct Case {
    int64_t hq, hkv, d;
    bool causal;
    bool must_run; // cuDNN documents it on this machine: an unsupported graph is a failure
  };
  for (Case c : {Case{16, 8, 128, true, true}, Case{16, 2, 256, true, cap.sm == 90},
                 Case{16, 16, 72, false, false}, Case{16, 16, 80, false, false},
                 Case{4, 4, 64, true, true}}) {
    const auto s = shape_of(c.hq, c.hkv, c.d, c.causal);
    const auto choice = ca::choose_backend(cap, s, DType::bf16, ca::Request::automatic);
    INFO(ca::check_key(cap, s, true));
    if (choice.backend != ca::Backend::cudnn) {
      std::printf("%s: own kernel (%s)\n", ca::check_key(cap, s, true).c_str(),
                  choice.reason.c_str());
      CHECK_FALSE(c.must_run);
      continue;
    }
    for (bool det : {true, false}) {
      const ops_detail::AttentionProbe p = ops_detail::probe_cudnn_attention(s, det, kGpu);
      std::printf("%s: %s, error %.3g\n", ca::check_key(cap, s, det).c_str(),
                  p.unsupported.empty() ? "ran" : p.unsupported.c_str(), p.error);
      if (c.must_run) REQUIRE(p.unsupported.empty());
      if (p.unsupported.empty()) CHECK(p.error <= ops_detail::kAttentionSelfCheckTolerance);
    }
  }
}

TEST_CASE("gpu cuDNN attention: the op runs cuDNN and matches the CPU op",
          "[attention][cudnn][gpu]") {
  require_cudnn_attention();
  setenv("VLM_GPU_SELF_CHECK", "strict", 1); // a self-check failure fails the test
  struct Case {
    int64_t hq, hkv, d;
    bool causal;
  };
  // One long document (many key tiles), short ones, an empty one, one = 64 mod 128.
  const std::vector<int32_t> lengths = {2300, 1, 0, 300, 192, 17};
  std::vector<int32_t> cu_v = {0};
  for (int32_t n : lengths) cu_v.push_back(cu_v.back() + n);
  const int64_t T = cu_v.back();
  const Tensor cu = Tensor::from_vector(cu_v, {int64_t(cu_v.size())});
  for (Case c : {Case{16, 8, 128, true}, Case{8, 2, 256, true}, Case{4, 4, 64, false}}) {
    const auto s = shape_of(c.hq, c.hkv, c.d, c.causal);
    const auto cap = ca::cuda::capability(0);
    if (ca::choose_backend(cap, s, DType::bf16, ca::Request::automatic).backend !=
        ca::Backend::cudnn)
      continue; // said by the test above
    INFO(ca::check_key(cap, s, true));
    Rng rng(7);
    Tensor q = Tensor::randn({T, c.hq, c.d}, rng, DType::bf16).set_requires_grad(true);
    Tensor k = Tensor::randn({T, c.hkv, c.d}, rng, DType::bf16).set_requires_grad(true);
    Tensor v = Tensor::randn({T, c.hkv, c.d}, rng, DType::bf16).set_requires_grad(true);
    Tensor up = Tensor::randn({T, c.hq, c.d}, rng, DType::bf16);
    Tensor gq = q.to(kGpu).detach().set_requires_grad(true);
    Tensor gk = k.to(kGpu).detach().set_requires_grad(true);
    Tensor gv = v.to(kGpu).detach().set_requires_grad(true);
    const int64_t runs = ops_detail::cudnn_attention_runs();
    Tensor want = attention(q, k, v, cu, c.causal, s.scale);
    Tensor got = attention(gq, gk, gv, cu, c.causal, s.scale);
    want.backward(up);
    got.backward(up.to(kGpu));
    CHECK(ops_detail::cudnn_attention_runs() == runs + 2); // forward and backward on cuDNN
    const double e_out = rel_err(got, want), e_dq = rel_err(gq.grad(), q.grad()),
                 e_dk = rel_err(gk.grad(), k.grad()), e_dv = rel_err(gv.grad(), v.grad());
    std::printf("%s: out %.3g dq %.3g dk %.3g dv %.3g\n", ca::check_key(cap, s, true).c_str(),
                e_out, e_dq, e_dk, e_dv);
    CHECK(e_out <= 2e-2);
    CHECK(e_dq <= 4e-2);
    CHECK(e_dk <= 4e-2);
    CHECK(e_dv <= 4e-2);
  }
}

#else

TEST_CASE("gpu cuDNN attention", "[attention][cudnn][gpu]") {
  VLM_SKIP("this build has no CUDA backend (configure with -DVLM_CUDA=ON)");
}

#endif

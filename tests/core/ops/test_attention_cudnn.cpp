// The host logic of the cuDNN attention, on the CPU: which backend runs by capability, the ragged
// layout cuDNN reads from our varlen offsets, the plan cache's key, the self-check's decision
// (with a stand-in measurement), and — where this build has the frontend headers and a loadable
// libcudnn — the frontend's own validate() of the graphs we declare for the production shapes,
// on sm_90 (no device needed).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/attention_cudnn.h"
#include "src/core/ops/attention_cudnn.h"
#include "tests/skip.h"

using namespace vlm;
using namespace vlm::kernels::cudnn_attention;
using vlm::kernels::AttentionShape;

namespace {

Capability hopper(int64_t version = 91900) { return {90, version, true}; }

AttentionShape shape_of(int64_t hq, int64_t hkv, int64_t d, bool causal = true) {
  AttentionShape s;
  s.q_heads = hq;
  s.kv_heads = hkv;
  s.head_dim = d;
  s.causal = causal;
  s.scale = 1.0 / std::sqrt(double(d));
  return s;
}

Backend backend(const Capability& c, const AttentionShape& s, DType t = DType::bf16) {
  return choose_backend(c, s, t, Request::automatic).backend;
}

struct EnvGuard { // sets one variable for a scope, unsets it afterwards
  const char* name;
  EnvGuard(const char* n, const char* value) : name(n) { setenv(n, value, 1); }
  ~EnvGuard() { unsetenv(name); }
};

} // namespace

TEST_CASE("cuDNN attention: backend choice by capability", "[attention][cudnn]") {
  // The model families' head dims: Qwen3 128, Qwen3.5 full attention 256, vision towers 72/80/64.
  for (int64_t d : {64, 72, 80, 128, 256}) {
    INFO("head dim " << d);
    CHECK(backend(hopper(), shape_of(16, 8, d)) == Backend::cudnn);
    CHECK(backend(hopper(), shape_of(16, 16, d, false)) == Backend::cudnn);
  }
  CHECK(backend(hopper(), shape_of(16, 8, 128), DType::f32) == Backend::own_kernel);
  CHECK(backend({90, 91900, false}, shape_of(16, 8, 128)) == Backend::own_kernel); // no frontend
  CHECK(backend({90, 0, true}, shape_of(16, 8, 128)) == Backend::own_kernel);      // no libcudnn
  CHECK(backend({75, 91900, true}, shape_of(16, 8, 64)) == Backend::own_kernel);   // Turing
  CHECK(backend(hopper(90500), shape_of(16, 8, 128)) == Backend::own_kernel);      // < 9.6
  CHECK(backend(hopper(90600), shape_of(16, 8, 128)) == Backend::cudnn);
  CHECK(backend(hopper(91001), shape_of(16, 8, 128)) == Backend::own_kernel); // 9.10.1 refused
  // 9.11/9.12: the Hopper backward bug for head dims > 128 only.
  CHECK(backend(hopper(91200), shape_of(16, 8, 256)) == Backend::own_kernel);
  CHECK(backend(hopper(91200), shape_of(16, 8, 128)) == Backend::cudnn);
  CHECK(backend(hopper(91300), shape_of(16, 8, 256)) == Backend::cudnn);
  CHECK(backend(hopper(), shape_of(16, 8, 60)) == Backend::own_kernel); // not a multiple of 8
  CHECK(backend(hopper(), shape_of(16, 8, 264)) == Backend::own_kernel);
  // Ampere/Ada: backward <= 128, ragged from 9.18.1.
  CHECK(backend({80, 91900, true}, shape_of(16, 8, 128)) == Backend::cudnn);
  CHECK(backend({80, 91900, true}, shape_of(16, 8, 256)) == Backend::own_kernel);
  CHECK(backend({89, 91800, true}, shape_of(16, 8, 128)) == Backend::own_kernel);
  CHECK(backend({89, 91801, true}, shape_of(16, 8, 128)) == Backend::cudnn);
  // Blackwell: 256 from 9.23, 72 never (backward <= 128 apart from 256).
  CHECK(backend({100, 92200, true}, shape_of(16, 8, 256)) == Backend::own_kernel);
  CHECK(backend({100, 92300, true}, shape_of(16, 8, 256)) == Backend::cudnn);
  CHECK(backend({100, 92300, true}, shape_of(16, 8, 192)) == Backend::own_kernel);
  // The request wins; the reason says why.
  const Choice own =
      choose_backend(hopper(), shape_of(16, 8, 128), DType::bf16, Request::own_kernel);
  CHECK(own.backend == Backend::own_kernel);
  CHECK(own.reason == "VLM_ATTENTION_BACKEND=own");
  const Choice old =
      choose_backend(hopper(90500), shape_of(16, 8, 128), DType::bf16, Request::automatic);
  CHECK(old.reason.find("9.5.0") != std::string::npos);
}

TEST_CASE("cuDNN attention: VLM_ATTENTION_BACKEND and VLM_ATTENTION_DETERMINISTIC",
          "[attention][cudnn]") {
  unsetenv("VLM_ATTENTION_BACKEND");
  CHECK(requested_backend() == Request::automatic);
  {
    EnvGuard e("VLM_ATTENTION_BACKEND", "cudnn");
    CHECK(requested_backend() == Request::cudnn);
  }
  {
    EnvGuard e("VLM_ATTENTION_BACKEND", "own");
    CHECK(requested_backend() == Request::own_kernel);
  }
  {
    EnvGuard e("VLM_ATTENTION_BACKEND", "flash");
    CHECK_THROWS_WITH(requested_backend(),
                      Catch::Contains("VLM_ATTENTION_BACKEND") && Catch::Contains("'flash'"));
  }
  unsetenv("VLM_ATTENTION_DETERMINISTIC");
  CHECK(deterministic_requested());
  {
    EnvGuard e("VLM_ATTENTION_DETERMINISTIC", "0");
    CHECK_FALSE(deterministic_requested());
  }
  {
    EnvGuard e("VLM_ATTENTION_DETERMINISTIC", "2");
    CHECK_THROWS_WITH(deterministic_requested(), Catch::Contains("VLM_ATTENTION_DETERMINISTIC"));
  }
}

TEST_CASE("cuDNN attention: ragged offsets from the varlen layout", "[attention][cudnn]") {
  // Three documents of 3, 0 and 7 tokens: the empty one is dropped, offsets count elements.
  AttentionShape s = shape_of(4, 2, 8);
  const std::vector<int32_t> cu = {0, 3, 3, 10};
  s.tokens = 10;
  s.docs = 3;
  const RaggedLayout l = ragged_layout(cu.data(), s, false);
  CHECK(l.batch == 2);
  CHECK(l.seq_len == std::vector<int32_t>{3, 7});
  CHECK(l.q_offset == std::vector<int64_t>{0, 3 * 32, 10 * 32});
  CHECK(l.kv_offset == std::vector<int64_t>{0, 3 * 16, 10 * 16});
  CHECK(l.stats_offset == std::vector<int64_t>{0, 3 * 4, 10 * 4});
  CHECK(l.max_seq == 128);
  CHECK(l.max_total == 1024);

  // Padded to a multiple of 8 with zero-length sequences that start at the end of the rows.
  const RaggedLayout p = ragged_layout(cu.data(), s, true);
  REQUIRE(p.batch == 8);
  REQUIRE(p.seq_len.size() == 8);
  REQUIRE(p.q_offset.size() == 9);
  CHECK(p.seq_len == std::vector<int32_t>{3, 7, 0, 0, 0, 0, 0, 0});
  for (int i = 2; i <= 8; i++) {
    CHECK(p.q_offset[i] == 320);
    CHECK(p.kv_offset[i] == 160);
    CHECK(p.stats_offset[i] == 40);
  }
  CHECK(zero_length_supported(92500));
  CHECK_FALSE(zero_length_supported(92400));

  // Offsets past 2^31 elements stay exact (int64): 600k tokens of 32 heads x 128.
  AttentionShape big = shape_of(32, 8, 128);
  const std::vector<int32_t> cu_big = {0, 300000, 600000};
  big.tokens = 600000;
  big.docs = 2;
  const RaggedLayout b = ragged_layout(cu_big.data(), big, false);
  CHECK(b.q_offset[2] == int64_t(600000) * 32 * 128);
  CHECK(b.q_offset[2] > int64_t(1) << 31);
  CHECK(b.max_seq == 300032); // 300000 rounded up to 128
  CHECK(b.max_total == 600064);

  // The device image holds the four arrays where ragged_parts says, 16-byte aligned.
  const std::vector<uint8_t> image = ragged_device_bytes(p);
  const RaggedParts parts = ragged_parts(p.batch);
  CHECK(parts.q_offset % 16 == 0);
  CHECK(parts.kv_offset % 8 == 0);
  CHECK(parts.stats_offset % 8 == 0);
  REQUIRE(image.size() == parts.stats_offset + 9 * sizeof(int64_t));
  auto i64 = [&](size_t at, int i) {
    int64_t x;
    std::memcpy(&x, image.data() + at + size_t(i) * 8, 8);
    return x;
  };
  int32_t len1;
  std::memcpy(&len1, image.data() + parts.seq_len + 4, 4);
  CHECK(len1 == 7);
  CHECK(i64(parts.q_offset, 1) == 96);
  CHECK(i64(parts.kv_offset, 8) == 160);
  CHECK(i64(parts.stats_offset, 1) == 12);
}

TEST_CASE("cuDNN attention: plan-cache keys", "[attention][cudnn]") {
  AttentionShape s = shape_of(16, 8, 128);
  const std::vector<int32_t> a = {0, 100, 1000, 4096}, b = {0, 10, 900, 4000, 4096};
  s.tokens = 4096;
  s.docs = 3;
  const PlanKey ka = plan_key(s, ragged_layout(a.data(), s, true), 90, true);
  s.docs = 4;
  const PlanKey kb = plan_key(s, ragged_layout(b.data(), s, true), 90, true);
  // 3 and 4 documents pad to one B; 3096 and 3100 tokens round to one S.
  CHECK(ka == kb);
  CHECK(PlanKeyHash()(ka) == PlanKeyHash()(kb));
  CHECK(ka.batch == 8);
  CHECK(ka.max_seq == 3200);
  // Everything baked into a graph tells keys apart.
  auto differs = [&](auto change) {
    PlanKey k = ka;
    change(k);
    CHECK_FALSE(k == ka);
    CHECK(PlanKeyHash()(k) != PlanKeyHash()(ka));
  };
  differs([](PlanKey& k) { k.sm = 100; });
  differs([](PlanKey& k) { k.batch = 16; });
  differs([](PlanKey& k) { k.max_seq = 3072; });
  differs([](PlanKey& k) { k.max_total = 5120; });
  differs([](PlanKey& k) { k.q_heads = 32; }); // the strides of the packed rows
  differs([](PlanKey& k) { k.kv_heads = 4; });
  differs([](PlanKey& k) { k.head_dim = 256; });
  differs([](PlanKey& k) { k.causal = false; });
  differs([](PlanKey& k) { k.deterministic = false; });
  differs([](PlanKey& k) { k.scale = 0.1f; });
  CHECK(ka.str() == "sm90 B8 S3200 T4096 Hq16 Hkv8 D128 causal det scale=0.0883883");
  // The self-check's key holds the machine and the configuration, not the sizes.
  CHECK(check_key(hopper(), s, true) ==
        "cudnn attention sm90 cudnn 9.19.0 Hq16 Hkv8 D128 causal det");
}

TEST_CASE("cuDNN attention: the self-check's decision", "[attention][cudnn]") {
  using vlm::ops_detail::AttentionProbe;
  using vlm::ops_detail::decide_attention_backend;
  unsetenv("VLM_GPU_SELF_CHECK");
  std::vector<std::string> lines;
  auto log = [&](const std::string& l) { lines.push_back(l); };
  int probes = 0;
  auto probe_with = [&](double error, std::string unsupported = "") {
    return [&probes, error, unsupported] {
      probes++;
      return AttentionProbe{error, unsupported};
    };
  };
  // Each section uses its own head count: decisions are cached per configuration and process.
  SECTION("a close result picks cuDNN, once per configuration") {
    const auto s = shape_of(3, 1, 128);
    CHECK(decide_attention_backend(hopper(), s, DType::bf16, Request::automatic, true,
                                   probe_with(1e-3), log) == Backend::cudnn);
    CHECK(decide_attention_backend(hopper(), s, DType::bf16, Request::automatic, true,
                                   probe_with(1.0), log) == Backend::cudnn);
    CHECK(probes == 1);
    CHECK(lines.empty());
  }
  SECTION("a mismatch falls back to the own kernel, said once") {
    const auto s = shape_of(5, 1, 128);
    CHECK(decide_attention_backend(hopper(), s, DType::bf16, Request::automatic, true,
                                   probe_with(0.5), log) == Backend::own_kernel);
    CHECK(decide_attention_backend(hopper(), s, DType::bf16, Request::automatic, true,
                                   probe_with(0.0), log) == Backend::own_kernel);
    CHECK(probes == 1);
  }
  SECTION("NaN from cuDNN is a mismatch") {
    CHECK(decide_attention_backend(hopper(), shape_of(6, 1, 128), DType::bf16, Request::automatic,
                                   true, probe_with(NAN), log) == Backend::own_kernel);
  }
  SECTION("a graph cuDNN cannot plan falls back even in strict mode") {
    EnvGuard e("VLM_GPU_SELF_CHECK", "strict");
    CHECK(decide_attention_backend(hopper(), shape_of(7, 1, 128), DType::bf16, Request::automatic,
                                   true, probe_with(0, "build_plans: no plan"),
                                   log) == Backend::own_kernel);
    REQUIRE(lines.size() == 1);
    CHECK(lines[0].find("build_plans: no plan") != std::string::npos);
  }
  SECTION("a graph cuDNN cannot plan stays refused when cuDNN is then required") {
    const auto s = shape_of(14, 1, 128);
    CHECK(decide_attention_backend(hopper(), s, DType::bf16, Request::automatic, true,
                                   probe_with(0, "check_support: no engine"),
                                   log) == Backend::own_kernel);
    CHECK_THROWS_WITH(decide_attention_backend(hopper(), s, DType::bf16, Request::cudnn, true,
                                               probe_with(0), log),
                      Catch::Contains("cannot run") && Catch::Contains("no engine"));
    CHECK(probes == 1);
  }
  SECTION("strict mode stops on a mismatch") {
    EnvGuard e("VLM_GPU_SELF_CHECK", "strict");
    CHECK_THROWS_WITH(decide_attention_backend(hopper(), shape_of(9, 1, 128), DType::bf16,
                                               Request::automatic, true, probe_with(0.5), log),
                      Catch::Contains("self-check failed") && Catch::Contains("Hq9"));
  }
  SECTION("VLM_ATTENTION_BACKEND=cudnn stops where cuDNN cannot run") {
    CHECK_THROWS_WITH(decide_attention_backend(hopper(90500), shape_of(10, 1, 128), DType::bf16,
                                               Request::cudnn, true, probe_with(0), log),
                      Catch::Contains("VLM_ATTENTION_BACKEND=cudnn") && Catch::Contains("9.6"));
    CHECK_THROWS_WITH(decide_attention_backend(hopper(), shape_of(11, 1, 128), DType::bf16,
                                               Request::cudnn, true, probe_with(0.5), log),
                      Catch::Contains("self-check"));
    CHECK(probes == 1); // the unsupported one was never probed
  }
  SECTION("an unsupported configuration is never probed and said once") {
    CHECK(decide_attention_backend(hopper(), shape_of(12, 1, 60), DType::bf16, Request::automatic,
                                   true, probe_with(0), log) == Backend::own_kernel);
    CHECK(probes == 0);
    REQUIRE(lines.size() == 1);
    CHECK(lines[0].find("not a multiple of 8") != std::string::npos);
  }
  SECTION("fallback mode never uses cuDNN") {
    EnvGuard e("VLM_GPU_SELF_CHECK", "fallback");
    CHECK(decide_attention_backend(hopper(), shape_of(13, 1, 128), DType::bf16, Request::automatic,
                                   true, probe_with(0), log) == Backend::own_kernel);
    CHECK(probes == 0);
  }
}

TEST_CASE("cuDNN attention: the frontend validates our graphs on sm_90", "[attention][cudnn]") {
  if (!cuda::frontend_built())
    VLM_SKIP("this build has no cuDNN frontend headers (tools/deps/fetch_cudnn_frontend.sh, then "
             "rebuild): the graphs cannot be validated");
  // The production configurations: Qwen3 (GQA 16/8, d 128), Qwen3.5 full attention (d 256),
  // Qwen3-VL / Qwen2.5-VL vision towers (bidirectional, d 72 and 80), a small MHA d 64.
  struct Case {
    int64_t hq, hkv, d;
    bool causal;
  };
  for (Case c : {Case{16, 8, 128, true}, Case{32, 8, 128, true}, Case{16, 2, 256, true},
                 Case{16, 16, 72, false}, Case{16, 16, 80, false}, Case{4, 4, 64, true}}) {
    AttentionShape s = shape_of(c.hq, c.hkv, c.d, c.causal);
    const std::vector<int32_t> cu = {0, 1, 700, 4096};
    s.tokens = 4096;
    s.docs = 3;
    for (bool det : {true, false}) {
      const PlanKey key = plan_key(s, ragged_layout(cu.data(), s, true), 90, det);
      INFO(key.str());
      CHECK(cuda::validate_graphs(key) == "");
    }
  }
  // What the frontend refuses, it says: a head dim that is not a multiple of 8, and Hq % Hkv != 0.
  AttentionShape odd = shape_of(16, 8, 60);
  const std::vector<int32_t> cu = {0, 128};
  odd.tokens = 128;
  odd.docs = 1;
  CHECK(cuda::validate_graphs(plan_key(odd, ragged_layout(cu.data(), odd, false), 90, true)) != "");
  AttentionShape gqa = shape_of(16, 3, 128);
  gqa.tokens = 128;
  gqa.docs = 1;
  CHECK(cuda::validate_graphs(plan_key(gqa, ragged_layout(cu.data(), gqa, false), 90, true)) != "");
}

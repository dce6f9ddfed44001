// The host logic of the cuDNN attention, on the CPU: which backend runs by capability, the ragged
// layout cuDNN reads from our varlen offsets, the plan cache's key, the self-check's decision
// (with a stand-in measurement), and — where this build has the frontend headers and a loadable
// libcudnn — the frontend's own validate() of the graphs we declare for the production shapes,
// on sm_90 (no device needed).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
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
  // The non-deterministic backward by default; the settings (training config) ask for the
  // deterministic one; the variable overrides both ways.
  unsetenv("VLM_ATTENTION_DETERMINISTIC");
  const Settings saved = settings();
  CHECK_FALSE(Settings{}.deterministic);
  set_settings(Settings{});
  CHECK_FALSE(deterministic_requested());
  Settings det;
  det.deterministic = true;
  set_settings(det);
  CHECK(deterministic_requested());
  {
    EnvGuard e("VLM_ATTENTION_DETERMINISTIC", "0");
    CHECK_FALSE(deterministic_requested());
  }
  set_settings(Settings{});
  {
    EnvGuard e("VLM_ATTENTION_DETERMINISTIC", "1");
    CHECK(deterministic_requested());
  }
  {
    EnvGuard e("VLM_ATTENTION_DETERMINISTIC", "2");
    CHECK_THROWS_WITH(deterministic_requested(), Catch::Contains("VLM_ATTENTION_DETERMINISTIC"));
  }
  Settings bad;
  bad.workspace_limit = 0;
  CHECK_THROWS_WITH(set_settings(bad), Catch::Contains("workspace limit"));
  set_settings(saved);
}

TEST_CASE("cuDNN attention: ragged offsets from the varlen layout", "[attention][cudnn]") {
  // Three documents of 3, 0 and 7 tokens: the empty one is dropped, offsets count elements; the
  // batch level 8 is filled with one-token padding sequences on the rows after the tokens.
  AttentionShape s = shape_of(4, 2, 8);
  const std::vector<int32_t> cu = {0, 3, 3, 10};
  s.tokens = 10;
  s.docs = 3;
  const RaggedLayout l = ragged_layout(cu.data(), s);
  CHECK(l.docs == 2);
  REQUIRE(l.batch == 8);
  REQUIRE(l.seq_len.size() == 8);
  REQUIRE(l.q_offset.size() == 9);
  CHECK(l.seq_len == std::vector<int32_t>{3, 7, 1, 1, 1, 1, 1, 1});
  CHECK(l.q_offset[0] == 0);
  CHECK(l.q_offset[1] == 3 * 32);
  CHECK(l.kv_offset[1] == 3 * 16);
  CHECK(l.stats_offset[1] == 3 * 4);
  for (int i = 2; i <= 8; i++) { // padding sequence i - 2 on row 10 + i - 2; the end after them
    INFO("sequence " << i);
    CHECK(l.q_offset[size_t(i)] == (10 + i - 2) * 32);
    CHECK(l.kv_offset[size_t(i)] == (10 + i - 2) * 16);
    CHECK(l.stats_offset[size_t(i)] == (10 + i - 2) * 4);
  }
  CHECK(l.spare_rows == 6 + kTileSlack);
  CHECK(l.rows == 128);
  CHECK(l.max_seq == 128);
  CHECK(l.max_total == 384); // 128 + 8 + 128 rounded up to 128
  CHECK(l.size_class() == SizeClass{128, 8, 128});

  // Offsets past 2^31 elements stay exact (int64): 600k tokens of 32 heads x 128.
  AttentionShape big = shape_of(32, 8, 128);
  const std::vector<int32_t> cu_big = {0, 300000, 600000};
  big.tokens = 600000;
  big.docs = 2;
  const RaggedLayout b = ragged_layout(cu_big.data(), big);
  CHECK(b.q_offset[1] == int64_t(300000) * 32 * 128);
  CHECK(b.q_offset[8] == int64_t(600000 + 6) * 32 * 128);
  CHECK(b.q_offset[8] > int64_t(1) << 31);
  CHECK(b.rows == 786432); // 600000 rounded up to a multiple of 2^19 / 2
  CHECK(b.max_seq == 1048576);

  // More documents than the largest batch level: no graph (the op runs the own kernel).
  AttentionShape many = shape_of(4, 2, 8);
  std::vector<int32_t> cu_many(4098);
  for (size_t i = 0; i < cu_many.size(); i++) cu_many[i] = int32_t(i);
  many.tokens = 4097;
  many.docs = 4097;
  CHECK(ragged_layout(cu_many.data(), many).batch == 0);

  // The device image holds the four arrays where ragged_parts says, 16-byte aligned.
  const std::vector<uint8_t> image = ragged_device_bytes(l);
  const RaggedParts parts = ragged_parts(l.batch);
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
  CHECK(i64(parts.kv_offset, 8) == 16 * 16);
  CHECK(i64(parts.stats_offset, 1) == 12);
}

TEST_CASE("cuDNN attention: levels, size classes and their problems", "[attention][cudnn]") {
  // Rows levels: multiples of max(128, pow2floor(T) / 2), less than 50% (or 128 rows) over T.
  CHECK(rows_level(1) == 128);
  CHECK(rows_level(256) == 256);
  CHECK(rows_level(3000) == 3072);
  CHECK(rows_level(4096) == 4096);
  CHECK(rows_level(4097) == 6144);
  CHECK(rows_level(8193) == 12288);
  CHECK(rows_level(32768) == 32768);
  for (int64_t t = 1; t <= 70000; t += 97) {
    const int64_t r = rows_level(t);
    INFO("T " << t << " level " << r);
    CHECK(r >= t);
    CHECK(double(r - t) < std::max(128.0, double(t) / 2));
    CHECK(rows_level(r) == r);
  }
  CHECK(batch_level(1) == 8);
  CHECK(batch_level(9) == 64);
  CHECK(batch_level(4096) == 4096);
  CHECK(batch_level(4097) == 0);
  CHECK(seq_levels(4096) == std::vector<int64_t>{128, 256, 1024, 4096});
  CHECK(seq_levels(1024) == std::vector<int64_t>{128, 256, 1024});
  CHECK(seq_levels(32768) == std::vector<int64_t>{512, 2048, 8192, 32768});
  CHECK(seq_level(300, 4096) == 1024);

  // Every rows level has at most 16 size classes, each with a problem that falls in it: the
  // self-check's lengths give back the class they were made for.
  for (int64_t rows : {128, 256, 384, 1024, 1536, 2048, 4096, 6144, 8192, 12288, 32768, 131072}) {
    const std::vector<SizeClass> classes = size_classes(rows);
    INFO("rows level " << rows);
    CHECK(!classes.empty());
    CHECK(classes.size() <= 16);
    for (const SizeClass& c : classes) {
      INFO("B" << c.batch << " S" << c.max_seq);
      const std::vector<int32_t> lengths = size_class_lengths(c);
      REQUIRE(!lengths.empty());
      std::vector<int32_t> cu = {0};
      for (int32_t n : lengths) cu.push_back(cu.back() + n);
      AttentionShape s = shape_of(16, 8, 128);
      s.tokens = cu.back();
      s.docs = int64_t(lengths.size());
      const RaggedLayout l = ragged_layout(cu.data(), s);
      CHECK(l.size_class() == c);
      CHECK(std::count(lengths.begin(), lengths.end(), 0) == 1); // an empty document
      CHECK(lengths.back() >=
            std::min<int32_t>(2, *std::max_element(lengths.begin(), lengths.end())));
    }
  }
  // A class no problem has is not listed: 8 documents of at most 128 tokens fill no 4096 rows.
  for (const SizeClass& c : size_classes(4096)) CHECK_FALSE((c.batch == 8 && c.max_seq == 128));
  CHECK(size_class_lengths({4096, 8, 128}).empty());
}

TEST_CASE("cuDNN attention: the backward's rows cover every row it can address",
          "[attention][cudnn]") {
  // max_total bounds the rows of the dQ accumulator: the tokens, one row per padding sequence and
  // a tile past the end, for every T (T a multiple of 1024 included: every 4096-token pack) and
  // every document count.
  AttentionShape s = shape_of(16, 8, 128);
  for (int64_t T : {1, 127, 128, 1023, 1024, 1025, 2048, 4095, 4096, 4097, 8192, 32768, 32769}) {
    for (int64_t docs : {1, 2, 7, 8, 9, 63, 64, 65, 511, 512, 600}) {
      if (docs > T) continue;
      std::vector<int32_t> cu = {0};
      for (int64_t d = 0; d < docs; d++) cu.push_back(int32_t(T * (d + 1) / docs));
      s.tokens = T;
      s.docs = docs;
      const RaggedLayout l = ragged_layout(cu.data(), s);
      INFO("T " << T << ", " << docs << " documents");
      REQUIRE(l.batch > 0);
      const int64_t addressed = T + (l.batch - l.docs) + kTileSlack; // the buffers' rows
      CHECK(l.spare_rows == addressed - T);
      CHECK(l.max_total >= addressed);
      CHECK(l.max_total % 128 == 0);
      CHECK(l.max_seq >= *std::max_element(l.seq_len.begin(), l.seq_len.end()));
      CHECK(plan_key(s, l.size_class(), 90, false).max_total == l.max_total);
    }
  }
}

TEST_CASE("cuDNN attention: the deterministic backward's workspace limit", "[attention][cudnn]") {
  // One 4k document padded to 8 sequences of 16 heads: ~8.6 GB per call (B·Hq·S²·4).
  AttentionShape s = shape_of(16, 8, 128);
  const PlanKey k4 = plan_key(s, {4096, 8, 4096}, 90, true);
  CHECK(deterministic_workspace_estimate(k4) == int64_t(8) * 16 * 4096 * 4096 * 4);
  const int64_t limit = Settings{}.workspace_limit;
  CHECK(limit == int64_t(4) << 30);
  CHECK_FALSE(deterministic_fits(k4, -1, limit));
  CHECK(deterministic_fits(k4, -1, int64_t(9) << 30));
  // A built plan's own size decides over the estimate.
  CHECK(deterministic_fits(k4, int64_t(1) << 30, limit));
  CHECK_FALSE(deterministic_fits(k4, limit + 1, limit));
  // Short documents fit: 64 sequences of at most 256 tokens.
  CHECK(deterministic_fits(plan_key(s, {4096, 64, 256}, 90, true), -1, limit));
}

TEST_CASE("cuDNN attention: plan-cache keys", "[attention][cudnn]") {
  AttentionShape s = shape_of(16, 8, 128);
  const std::vector<int32_t> a = {0, 100, 1000, 4096}, b = {0, 10, 900, 4000, 4096};
  s.tokens = 4096;
  s.docs = 3;
  const PlanKey ka = plan_key(s, ragged_layout(a.data(), s).size_class(), 90, false);
  s.docs = 4;
  const PlanKey kb = plan_key(s, ragged_layout(b.data(), s).size_class(), 90, false);
  // 3 and 4 documents share a batch level; 3096 and 3100 tokens a seq level.
  CHECK(ka == kb);
  CHECK(PlanKeyHash()(ka) == PlanKeyHash()(kb));
  CHECK(ka.batch == 8);
  CHECK(ka.max_seq == 4096);
  // Everything baked into a graph tells keys apart.
  auto differs = [&](auto change) {
    PlanKey k = ka;
    change(k);
    CHECK_FALSE(k == ka);
    CHECK(PlanKeyHash()(k) != PlanKeyHash()(ka));
  };
  differs([](PlanKey& k) { k.sm = 100; });
  differs([](PlanKey& k) { k.batch = 64; });
  differs([](PlanKey& k) { k.max_seq = 1024; });
  differs([](PlanKey& k) { k.max_total = 5120; });
  differs([](PlanKey& k) { k.q_heads = 32; }); // the strides of the packed rows
  differs([](PlanKey& k) { k.kv_heads = 4; });
  differs([](PlanKey& k) { k.head_dim = 256; });
  differs([](PlanKey& k) { k.causal = false; });
  differs([](PlanKey& k) { k.deterministic = true; });
  differs([](PlanKey& k) { k.scale = 0.1f; });
  CHECK(ka.str() == "sm90 B8 S4096 T4352 Hq16 Hkv8 D128 causal nondet scale=0.0883883");
  // The configuration's key holds the machine and the configuration, not the sizes.
  CHECK(check_key(hopper(), s, true) ==
        "cudnn attention sm90 cudnn 9.19.0 Hq16 Hkv8 D128 causal det");
  CHECK(vlm::ops_detail::check_name(hopper(), ka) ==
        "cudnn attention 9.19.0 sm90 B8 S4096 T4352 Hq16 Hkv8 D128 causal nondet scale=0.0883883");
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
  // decide_attention_backend for the plan key of one size class of the configuration.
  auto decide = [&](const Capability& cap, const AttentionShape& s, Request request,
                    const std::function<AttentionProbe()>& probe) {
    return decide_attention_backend(cap, s, DType::bf16, request,
                                    plan_key(s, {4096, 8, 4096}, cap.sm, true), probe, log);
  };
  // Each section uses its own head count: decisions are cached per plan key and process.
  SECTION("a close result picks cuDNN, once per configuration") {
    const auto s = shape_of(3, 1, 128);
    CHECK(decide(hopper(), s, Request::automatic, probe_with(1e-3)) == Backend::cudnn);
    CHECK(decide(hopper(), s, Request::automatic, probe_with(1.0)) == Backend::cudnn);
    CHECK(probes == 1);
    CHECK(lines.empty());
  }
  SECTION("a mismatch falls back to the own kernel, said once") {
    const auto s = shape_of(5, 1, 128);
    CHECK(decide(hopper(), s, Request::automatic, probe_with(0.5)) == Backend::own_kernel);
    CHECK(decide(hopper(), s, Request::automatic, probe_with(0.0)) == Backend::own_kernel);
    CHECK(probes == 1);
  }
  SECTION("NaN from cuDNN is a mismatch") {
    CHECK(decide(hopper(), shape_of(6, 1, 128), Request::automatic, probe_with(NAN)) ==
          Backend::own_kernel);
  }
  SECTION("a graph cuDNN cannot plan falls back even in strict mode") {
    EnvGuard e("VLM_GPU_SELF_CHECK", "strict");
    CHECK(decide(hopper(), shape_of(7, 1, 128), Request::automatic,
                 probe_with(0, "build_plans: no plan")) == Backend::own_kernel);
    REQUIRE(lines.size() == 1);
    CHECK(lines[0].find("build_plans: no plan") != std::string::npos);
  }
  SECTION("a graph cuDNN cannot plan stays refused when cuDNN is then required") {
    const auto s = shape_of(14, 1, 128);
    CHECK(decide(hopper(), s, Request::automatic, probe_with(0, "check_support: no engine")) ==
          Backend::own_kernel);
    CHECK_THROWS_WITH(decide(hopper(), s, Request::cudnn, probe_with(0)),
                      Catch::Contains("cannot run") && Catch::Contains("no engine"));
    CHECK(probes == 1);
  }
  SECTION("strict mode stops on a mismatch") {
    EnvGuard e("VLM_GPU_SELF_CHECK", "strict");
    CHECK_THROWS_WITH(decide(hopper(), shape_of(9, 1, 128), Request::automatic, probe_with(0.5)),
                      Catch::Contains("self-check failed") && Catch::Contains("Hq9"));
  }
  SECTION("VLM_ATTENTION_BACKEND=cudnn stops where cuDNN cannot run") {
    CHECK_THROWS_WITH(decide(hopper(90500), shape_of(10, 1, 128), Request::cudnn, probe_with(0)),
                      Catch::Contains("VLM_ATTENTION_BACKEND=cudnn") && Catch::Contains("9.6"));
    CHECK_THROWS_WITH(decide(hopper(), shape_of(11, 1, 128), Request::cudnn, probe_with(0.5)),
                      Catch::Contains("self-check"));
    CHECK(probes == 1); // the unsupported one was never probed
  }
  SECTION("an unsupported configuration is never probed and said once") {
    CHECK(decide(hopper(), shape_of(12, 1, 60), Request::automatic, probe_with(0)) ==
          Backend::own_kernel);
    CHECK(probes == 0);
    REQUIRE(lines.size() == 1);
    CHECK(lines[0].find("not a multiple of 8") != std::string::npos);
  }
  SECTION("fallback mode never uses cuDNN") {
    EnvGuard e("VLM_GPU_SELF_CHECK", "fallback");
    CHECK(decide(hopper(), shape_of(13, 1, 128), Request::automatic, probe_with(0)) ==
          Backend::own_kernel);
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
  // A configuration the loaded cuDNN does not support on sm_90 (by version) is not checked: said,
  // with the version, never a failure of a correct build.
  const Capability loaded = {90, cuda::cudnn_version(), true};
  if (loaded.cudnn_version <= 0)
    VLM_SKIP("no loadable libcudnn: the frontend cannot validate graphs");
  for (Case c : {Case{16, 8, 128, true}, Case{32, 8, 128, true}, Case{16, 2, 256, true},
                 Case{16, 16, 72, false}, Case{16, 16, 80, false}, Case{4, 4, 64, true}}) {
    AttentionShape s = shape_of(c.hq, c.hkv, c.d, c.causal);
    const Choice choice = choose_backend(loaded, s, DType::bf16, Request::automatic);
    if (choice.backend != Backend::cudnn) {
      std::printf("not validated: %s: %s\n", check_key(loaded, s, false).c_str(),
                  choice.reason.c_str());
      continue;
    }
    const std::vector<int32_t> cu = {0, 1, 700, 4096};
    s.tokens = 4096;
    s.docs = 3;
    // Every size class of the rows level, both backward algorithms.
    for (const SizeClass& size : size_classes(ragged_layout(cu.data(), s).rows))
      for (bool det : {true, false}) {
        const PlanKey key = plan_key(s, size, 90, det);
        INFO(key.str() << " (cuDNN " << version_text(loaded.cudnn_version) << ")");
        CHECK(cuda::validate_graphs(key) == "");
      }
  }
  // What the frontend refuses, it says: a head dim that is not a multiple of 8, and Hq % Hkv != 0.
  AttentionShape odd = shape_of(16, 8, 60);
  const std::vector<int32_t> cu = {0, 128};
  odd.tokens = 128;
  odd.docs = 1;
  CHECK(cuda::validate_graphs(
            plan_key(odd, ragged_layout(cu.data(), odd).size_class(), 90, true)) != "");
  AttentionShape gqa = shape_of(16, 3, 128);
  gqa.tokens = 128;
  gqa.docs = 1;
  CHECK(cuda::validate_graphs(
            plan_key(gqa, ragged_layout(cu.data(), gqa).size_class(), 90, true)) != "");
}

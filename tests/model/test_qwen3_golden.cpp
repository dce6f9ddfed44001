// Qwen3 vs transformers (tools/golden/gen_qwen3.py): the tiny T1 model (qwen-models.md §8),
// untied and tied, loaded from HF snapshots in tests/data/qwen3_tiny_{untied,tied}/ and run by
// `vlmtrain dump` (run_dump) on a packed row of 3 documents (cu_seqlens [0, 5, 70, 133]) and on a
// single sequence of 37 tokens. The reference is transformers in fp32 on CPU; for the packed row it
// is the 3 documents run separately (the generator checks that transformers' packed run agrees).
//
// Tolerances (the acceptance): fp32 logits rel_error <= 1e-5, loss <= 1e-6 absolute, every
// parameter gradient rel_error <= 1e-4 (observed: logits ~5e-7, loss ~5e-7, grads <= ~2e-6).
// bf16 (parameters and activations in bf16, logits and loss in f32) vs the same fp32 golden: the
// weights are rounded to bf16 (2^-9 relative each) and every layer's activations several times,
// through 2 layers and the head: logits rel_error <= 2e-2 (observed 8.4e-3 untied, 5.0e-3 tied),
// loss <= 1e-3 absolute (observed 6.7e-5, 1.1e-4), gradients rel_error <= 1e-1 (observed 2.5e-2,
// 4.3e-2, both at the last layer's k_norm weight: its gradient sums many small products whose
// bf16 roundings do not cancel). The check is that they are the same gradients, not their bits.
#include <catch2/catch.hpp>

#include <map>
#include <string>

#include "io/state/safetensors.h"
#include "model/batch_file.h"
#include "model/lm_loss.h"
#include "model/qwen3/model.h"
#include "src/train/parity_dump.h"
#include "tests/golden/golden.h"
#include "tests/model/qwen3_golden_cases.h"
#include "tests/temp_dir.h"

using namespace vlm;
using vlm::testing::Golden;
using vlm::testing::kGoldenF32Tol;
using vlm::testing::rel_error;

using namespace vlm::testing::qwen3_golden;

namespace {

struct Errors {
  double logits = 0, loss = 0, worst_grad = 0;
  std::string worst_grad_name;
};

// Runs `vlmtrain dump` on one golden case and compares with the golden tensors.
Errors run_case(const std::string& variant, const std::string& batch, DType dtype, bool grads,
                parallel::AcMode ac = parallel::AcMode::off) {
  auto got = dump_golden_case(variant, batch, dtype, grads, ac, Device::cpu());

  const Golden g("qwen3_tiny");
  const std::string c = variant + "_" + batch;
  Errors e;
  REQUIRE(got.count("logits"));
  REQUIRE(got.count("loss"));
  CHECK(got["logits"].dtype() == DType::f32);
  e.logits = rel_error(got["logits"], g.get(c, "logits"));
  e.loss = std::abs(got["loss"].item() - g.get(c, "loss").item());
  if (grads) {
    // Exactly the golden's parameters (the tied model has no lm_head gradient of its own).
    size_t golden_grads = 0;
    io::SafetensorsFile gf(std::string(VLM_SOURCE_DIR) + "/tests/golden/qwen3_tiny.safetensors");
    const std::string prefix = c + ".grad.";
    for (const auto& key : gf.names()) {
      if (key.rfind(prefix, 0) != 0) continue;
      golden_grads++;
      const std::string name = key.substr(prefix.size());
      INFO("parameter " << name);
      REQUIRE(got.count(name));
      double err = rel_error(got[name], g.get(c, "grad." + name));
      if (err > e.worst_grad) e.worst_grad = err, e.worst_grad_name = name;
    }
    CHECK(got.size() == golden_grads + 2); // + logits, loss
    CHECK(golden_grads == (variant == "tied" ? 24u : 25u));
  }
  std::printf("golden %s %s %s: logits %.2e, loss %.2e, worst grad %.2e (%s)\n", c.c_str(),
              dtype_name(dtype), parallel::ac_mode_name(ac), e.logits, e.loss, e.worst_grad,
              e.worst_grad_name.c_str());
  return e;
}

} // namespace

TEST_CASE("qwen3 golden: dump of the untied model on a packed row matches transformers") {
  Errors e = run_case("untied", "packed", DType::f32, true);
  CHECK(e.logits <= kGoldenF32Tol);
  CHECK(e.loss <= kLossTol);
  CHECK(e.worst_grad <= kGradTol);
}

TEST_CASE("qwen3 golden: dump of the tied model on a packed row matches transformers") {
  Errors e = run_case("tied", "packed", DType::f32, true);
  CHECK(e.logits <= kGoldenF32Tol);
  CHECK(e.loss <= kLossTol);
  CHECK(e.worst_grad <= kGradTol);
}

TEST_CASE("qwen3 golden: single sequence of 37 tokens ([1, T] batch), untied and tied") {
  for (const char* variant : {"untied", "tied"}) {
    INFO(variant);
    Errors e = run_case(variant, "single", DType::f32, false);
    CHECK(e.logits <= kGoldenF32Tol);
    CHECK(e.loss <= kLossTol);
  }
}

TEST_CASE("qwen3 golden: activation checkpointing full and selective match transformers too") {
  for (auto ac : {parallel::AcMode::full, parallel::AcMode::selective}) {
    Errors e = run_case("untied", "packed", DType::f32, true, ac);
    CHECK(e.logits <= kGoldenF32Tol);
    CHECK(e.loss <= kLossTol);
    CHECK(e.worst_grad <= kGradTol);
  }
}

TEST_CASE("qwen3 golden: bf16 parameters and activations stay close to the fp32 reference") {
  for (const char* variant : {"untied", "tied"}) {
    INFO(variant);
    Errors e = run_case(variant, "packed", DType::bf16, true);
    CHECK(e.logits <= kBf16LogitsTol);
    CHECK(e.loss <= kBf16LossTol);
    CHECK(e.worst_grad <= kBf16GradTol);
  }
}

TEST_CASE("qwen3 golden: a batch file without a required key names the file and the key") {
  testing::TempDir tmp("qwen3_batch");
  std::vector<int64_t> ids = {1, 2, 3};
  std::vector<int32_t> cu = {0, 3};
  io::write_safetensors(tmp.file("b.safetensors"), {{"input_ids", DType::i64, {3}, ids.data(), 24},
                                                    {"labels", DType::i64, {3}, ids.data(), 24},
                                                    {"cu_seqlens", DType::i32, {2}, cu.data(), 8}});
  try {
    model::read_batch_file(tmp.file("b.safetensors"), false);
    FAIL("expected an error");
  } catch (const Error& e) {
    std::string msg = e.what();
    CHECK(msg.find("b.safetensors") != std::string::npos);
    CHECK(msg.find("'position_ids'") != std::string::npos);
  }
}

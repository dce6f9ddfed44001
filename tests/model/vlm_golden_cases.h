// A vision-language model's `vlmtrain dump` of a golden case against the transformers golden
// (Qwen3-VL: tests/golden/qwen3_vl_tiny.safetensors from tools/golden/gen_qwen3_vl.py; Qwen3.5:
// qwen3_5_tiny from gen_qwen3_5.py), shared by the CPU tests (tests/model/test_<family>_golden.cpp,
// which say what the cases are) and the CUDA ones (test_<family>_gpu.cpp); all are held to the
// same limits. A gradient of more than 1024 elements is stored sampled (tools/golden/
// vlm_common.py, sampled_gradient: the files stay under 2 MiB): its flattened elements 0, s, 2s,
// ... with the stride s in "grad_stride.<name>", chosen so that every row and every column of the
// [out, fan_in] view is among them; ours is sampled the same way before the comparison.
#pragma once

#include <catch2/catch.hpp>

#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "io/state/safetensors.h"
#include "src/train/parity_dump.h"
#include "tests/golden/golden.h"
#include "tests/temp_dir.h"

namespace vlm::testing::vlm_golden {

constexpr double kLossTol = 1e-6; // fp32 loss, absolute
constexpr double kGradTol = 1e-4; // fp32 gradients, max-norm relative (logits: kGoldenF32Tol)

// A family's golden files: tests/golden/<golden>.safetensors, the snapshots
// tests/data/<golden>_<variant>/ and the batches tests/data/<golden>_batches/<variant>_<batch>.
struct Family {
  std::string golden;                   // "qwen3_vl_tiny"
  size_t vision_params = 0;             // parameters of the tower (zero gradients without images)
  std::map<std::string, size_t> params; // parameters of each variant
  // bf16 parameters and activations (logits and loss in f32) vs the golden: see the CPU tests.
  double bf16_logits = 0, bf16_loss = 0, bf16_grad = 0;
};

inline const Family& qwen3_vl() {
  // 4 blocks x 12, patch embed 2, pos_embed, 4 mergers x 6; the tied model has no lm_head.
  static const Family f{"qwen3_vl_tiny", 75, {{"untied", 122}, {"tied", 121}}, 2e-2, 1e-3, 1e-1};
  return f;
}
inline const Family& qwen3_5() {
  // 2 blocks x 12, patch embed 2, pos_embed, the merger's 6.
  static const Family f{"qwen3_5_tiny", 33, {{"hybrid", 142}, {"tied", 60}}, 2e-1, 5e-3, 6e-1};
  return f;
}

inline std::string data(const std::string& rel) {
  return std::string(VLM_SOURCE_DIR) + "/tests/data/" + rel;
}

inline std::string batch_file(const Family& f, const std::string& case_name) {
  return data(f.golden + "_batches/" + case_name + ".safetensors");
}

struct Errors {
  double logits = 0, loss = 0, worst_grad = 0;
  std::string worst_grad_name;
  size_t grads_compared = 0, zero_vision_grads = 0;
  size_t sampled_grads = 0; // of grads_compared: compared on the golden's samples
};

// The elements 0, stride, 2 stride, ... of `t` flattened, as the golden stores a large gradient.
inline Tensor every_nth(const Tensor& t, int64_t stride) {
  REQUIRE(stride > 1);
  const std::vector<double> all = t.to(Device::cpu()).to_doubles();
  std::vector<double> picked;
  for (size_t i = 0; i < all.size(); i += size_t(stride)) picked.push_back(all[i]);
  return Tensor::from_doubles(picked, {int64_t(picked.size())}, DType::f64);
}

// Dumps the tiny `variant` snapshot (Family::params) on the `batch` ("packed" | "text") case
// with gradients and compares every output with the golden. A parameter the golden has no
// gradient for must be a vision parameter of a text-only row with an exactly zero gradient
// (transformers leaves the tower out of such a graph; ours runs it on a blank image scaled by 0).
inline Errors run_case(const Family& f, const std::string& variant, const std::string& batch,
                       parallel::AcMode ac = parallel::AcMode::off, Device device = Device::cpu(),
                       DType dtype = DType::f32) {
  const std::string c = variant + "_" + batch;
  TempDir tmp(f.golden + "_dump");
  train::DumpOptions o;
  o.model_dir = data(f.golden + "_" + variant);
  o.batch_path = batch_file(f, c);
  o.out_path = tmp.file("dump.safetensors");
  o.grads = true;
  o.ac = ac;
  o.device = device;
  o.dtype = dtype;
  train::run_dump(o);
  // A dump that silently stayed on the CPU would pass a CUDA test against the golden.
  CHECK(io::SafetensorsFile(o.out_path).metadata().at("device") == device.str());
  auto got = read_all_tensors(o.out_path);

  const Golden g(f.golden);
  // The shapes a sampled gradient is not compared in: the parameters' own.
  const io::SafetensorsFile snapshot(o.model_dir + "/model.safetensors");
  Errors e;
  REQUIRE(got.count("logits"));
  REQUIRE(got.count("loss"));
  CHECK(got["logits"].dtype() == DType::f32);
  e.logits = rel_error(got["logits"], g.get(c, "logits"));
  e.loss = std::abs(got["loss"].item() - g.get(c, "loss").item());
  for (const auto& [name, grad] : got) {
    if (name == "logits" || name == "loss") continue;
    INFO("parameter " << name);
    if (!g.has(c, "grad." + name)) {
      CHECK(batch == "text");
      CHECK(name.rfind("model.visual.", 0) == 0);
      CHECK(rel_error(grad, Tensor::zeros(grad.shape(), grad.dtype())) == 0.0);
      e.zero_vision_grads++;
      continue;
    }
    double err = 0;
    if (g.has(c, "grad_stride." + name)) {
      const auto stride = int64_t(g.get(c, "grad_stride." + name).item());
      REQUIRE(snapshot.contains(name));
      CHECK(grad.shape() == snapshot.get(name).shape);
      err = rel_error(every_nth(grad, stride), g.get(c, "grad." + name));
      e.sampled_grads++;
    } else {
      err = rel_error(grad, g.get(c, "grad." + name));
    }
    e.grads_compared++;
    if (!(err <= e.worst_grad)) e.worst_grad = err, e.worst_grad_name = name;
  }
  std::printf("golden %s %s %s on %s: logits %.2e, loss %.2e, worst grad %.2e (%s), %zu "
              "gradients (%zu sampled), %zu zero vision gradients\n",
              c.c_str(), dtype_name(dtype), parallel::ac_mode_name(ac), device.str().c_str(),
              e.logits, e.loss, e.worst_grad, e.worst_grad_name.c_str(), e.grads_compared,
              e.sampled_grads, e.zero_vision_grads);
  return e;
}

// The fp32 limits, and that every parameter was compared.
inline void check_f32(const Errors& e, const Family& f, const std::string& variant,
                      const std::string& batch) {
  CHECK(e.logits <= kGoldenF32Tol);
  CHECK(e.loss <= kLossTol);
  CHECK(e.worst_grad <= kGradTol);
  CHECK(e.zero_vision_grads == (batch == "text" ? f.vision_params : 0u));
  CHECK(e.grads_compared + e.zero_vision_grads == f.params.at(variant));
}

inline void check_bf16(const Errors& e, const Family& f) {
  CHECK(e.logits <= f.bf16_logits);
  CHECK(e.loss <= f.bf16_loss);
  CHECK(e.worst_grad <= f.bf16_grad);
}

} // namespace vlm::testing::vlm_golden

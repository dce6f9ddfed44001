// Qwen3-VL vs transformers (tools/golden/gen_qwen3_vl.py): the tiny T2 model (qwen-models.md §8)
// loaded from HF snapshots in tests/data/qwen3_vl_tiny_{untied,tied}/ and run by `vlmtrain dump`
// (run_dump) on a packed row of a text-only document, a document with two images of different
// non-square grids (1,4,6) and (1,10,8) (one smaller, one larger than the 8×8 position table),
// and a short text-only one; and on a row with no image at all. The untied model has vision head
// dim 16 (4 heads) and mrope_section [6,5,5]; the tied one vision head dim 72 and [8,4,4] (tail
// slots falling back to T). The reference is transformers in fp32 on CPU, each document run alone
// (the generator checks transformers' own packed run agrees).
//
// Tolerances (the acceptance): logits rel_error <= 1e-5, loss <= 1e-6 absolute, every
// gradient rel_error <= 1e-4.
#include <catch2/catch.hpp>

#include <map>
#include <string>

#include "io/packing.h"
#include "io/safetensors.h"
#include "src/train/cmd_dump.h"
#include "tests/golden/golden.h"
#include "tests/temp_dir.h"

using namespace vlm;
using vlm::testing::Golden;
using vlm::testing::kGoldenF32Tol;
using vlm::testing::read_all_tensors;
using vlm::testing::rel_error;

namespace {

constexpr double kLossTol = 1e-6;
constexpr double kGradTol = 1e-4;
constexpr int32_t kImagePad = 500, kVisionStart = 502, kVisionEnd = 503;

std::string data(const std::string& rel) {
  return std::string(VLM_SOURCE_DIR) + "/tests/data/" + rel;
}

std::string batch_file(const std::string& c) {
  return data("qwen3_vl_tiny_batches/" + c + ".safetensors");
}

struct Errors {
  double logits = 0, loss = 0, worst_grad = 0;
  std::string worst_grad_name;
  size_t grads_compared = 0, zero_vision_grads = 0;
};

Errors run_case(const std::string& variant, const std::string& batch,
                parallel::AcMode ac = parallel::AcMode::off) {
  const std::string c = variant + "_" + batch;
  testing::TempDir tmp("qwen3_vl_dump");
  train::DumpOptions o;
  o.model_dir = data("qwen3_vl_tiny_" + variant);
  o.batch_path = batch_file(c);
  o.out_path = tmp.file("dump.safetensors");
  o.grads = true;
  o.ac = ac;
  train::run_dump(o);
  auto got = read_all_tensors(o.out_path);

  const Golden g("qwen3_vl_tiny");
  Errors e;
  REQUIRE(got.count("logits"));
  REQUIRE(got.count("loss"));
  e.logits = rel_error(got["logits"], g.get(c, "logits"));
  e.loss = std::abs(got["loss"].item() - g.get(c, "loss").item());
  for (const auto& [name, grad] : got) {
    if (name == "logits" || name == "loss") continue;
    INFO("parameter " << name);
    if (!g.has(c, "grad." + name)) {
      // transformers' text-only run leaves the tower out of the graph (no gradient); ours runs
      // it on a blank image scaled by 0, so the gradient exists and is exactly zero.
      CHECK(name.rfind("model.visual.", 0) == 0);
      CHECK(rel_error(grad, Tensor::zeros(grad.shape(), grad.dtype())) == 0.0);
      e.zero_vision_grads++;
      continue;
    }
    const double err = rel_error(grad, g.get(c, "grad." + name));
    e.grads_compared++;
    if (err > e.worst_grad) e.worst_grad = err, e.worst_grad_name = name;
  }
  std::printf("golden %s %s: logits %.2e, loss %.2e, worst grad %.2e (%s), %zu gradients, %zu "
              "zero vision gradients\n",
              c.c_str(), parallel::ac_mode_name(ac), e.logits, e.loss, e.worst_grad,
              e.worst_grad_name.c_str(), e.grads_compared, e.zero_vision_grads);
  return e;
}

void check_close(const Errors& e) {
  CHECK(e.logits <= kGoldenF32Tol);
  CHECK(e.loss <= kLossTol);
  CHECK(e.worst_grad <= kGradTol);
}

std::vector<int64_t> ints(const Tensor& t) {
  std::vector<int64_t> out;
  for (double v : t.to_doubles()) out.push_back(int64_t(v));
  return out;
}

} // namespace

TEST_CASE("qwen3_vl golden: dump on a packed row of image and text documents matches "
          "transformers, untied (vision hd 16) and tied (vision hd 72)") {
  for (const char* variant : {"untied", "tied"}) {
    INFO(variant);
    Errors e = run_case(variant, "packed");
    check_close(e);
    // Every parameter has its golden gradient (the tied model has no lm_head of its own).
    CHECK(e.zero_vision_grads == 0u);
    CHECK(e.grads_compared == (std::string(variant) == "tied" ? 121u : 122u));
  }
}

TEST_CASE("qwen3_vl golden: a row with no image runs the text path; vision gradients are zero") {
  for (const char* variant : {"untied", "tied"}) {
    INFO(variant);
    Errors e = run_case(variant, "text");
    check_close(e);
    CHECK(e.zero_vision_grads == 75u); // every vision parameter: the same set every step
  }
}

TEST_CASE("qwen3_vl golden: activation checkpointing full and selective match transformers too") {
  for (auto ac : {parallel::AcMode::full, parallel::AcMode::selective})
    check_close(run_case("untied", "packed", ac));
}

TEST_CASE("qwen3_vl golden: the packer's 3-D position ids for the row equal transformers' "
          "get_rope_index on each document") {
  for (const char* variant : {"untied", "tied"}) {
    INFO(variant);
    auto b = read_all_tensors(batch_file(std::string(variant) + "_packed"));
    const auto ids = ints(b["input_ids"]), labels = ints(b["labels"]),
               lengths = ints(b["doc_lengths"]);
    const auto grid_flat = ints(b["image_grid_thw"]);
    const auto hf_pos = ints(b["position_ids"]); // [3, T]
    const int64_t T = int64_t(ids.size());

    io::PackingConfig cfg;
    cfg.seq_len = T;
    cfg.mrope = true;
    cfg.pad_id = 0;
    cfg.image_token_id = kImagePad;
    cfg.vision_start_id = kVisionStart;
    cfg.vision_end_id = kVisionEnd;
    std::vector<io::TokenizedSample> docs;
    size_t start = 0, image = 0;
    for (int64_t len : lengths) {
      io::TokenizedSample s;
      for (size_t t = start; t < start + size_t(len); t++) {
        s.input_ids.push_back(int32_t(ids[t]));
        s.labels.push_back(int32_t(labels[t]));
        // One grid per placeholder run, in order.
        if (ids[t] == kImagePad && (t == start || ids[t - 1] != kImagePad)) {
          s.image_grid_thw.push_back(
              {grid_flat[3 * image], grid_flat[3 * image + 1], grid_flat[3 * image + 2]});
          s.num_patches +=
              grid_flat[3 * image] * grid_flat[3 * image + 1] * grid_flat[3 * image + 2];
          image++;
        }
      }
      s.patch_dim = 1536;
      docs.push_back(std::move(s));
      start += size_t(len);
    }
    REQUIRE(image == 2u);
    const io::PackedRow row = io::pack_row(docs, cfg);
    CHECK(row.num_docs == 3);
    CHECK(row.pad_tokens == 0);
    REQUIRE(row.position_ids.size() == size_t(3 * T));
    CHECK(std::vector<int64_t>(row.position_ids.begin(), row.position_ids.end()) == hf_pos);
    CHECK(std::vector<int64_t>(row.cu_seqlens.begin(), row.cu_seqlens.end()) ==
          ints(b["cu_seqlens"]));
  }
}

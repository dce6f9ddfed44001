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
// gradient rel_error <= 1e-4 (observed: logits <= 1.5e-6, loss <= 5e-7, gradients <= 3.4e-6); the
// golden stores gradients of more than 1024 elements sampled (every row and column of each:
// vlm_golden_cases.h), and they are compared on its samples.
// bf16 vs the same fp32 golden, the Qwen3 test's bounds and reasons (tests/model/
// test_qwen3_golden.cpp): logits <= 2e-2 (observed 1.1e-2 untied, 9.3e-3 tied), loss <= 1e-3
// (1.4e-4, 1.8e-4), gradients <= 1e-1 (3.1e-2, 3.5e-2, both at the last layer's q/k norm).
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "io/loader/packing.h"
#include "tests/model/vlm_golden_cases.h"

using namespace vlm;
using namespace vlm::testing::vlm_golden;
using vlm::testing::read_all_tensors;

namespace {

constexpr int32_t kImagePad = 500, kVisionStart = 502, kVisionEnd = 503;

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
    check_f32(run_case(qwen3_vl(), variant, "packed"), qwen3_vl(), variant, "packed");
  }
}

TEST_CASE("qwen3_vl golden: a row with no image runs the text path, vision gradients are zero") {
  for (const char* variant : {"untied", "tied"}) {
    INFO(variant);
    // Every vision parameter has a (zero) gradient: the same set every step.
    check_f32(run_case(qwen3_vl(), variant, "text"), qwen3_vl(), variant, "text");
  }
}

TEST_CASE("qwen3_vl golden: activation checkpointing full and selective match transformers too") {
  for (auto ac : {parallel::AcMode::full, parallel::AcMode::selective})
    check_f32(run_case(qwen3_vl(), "untied", "packed", ac), qwen3_vl(), "untied", "packed");
}

TEST_CASE("qwen3_vl golden: bf16 parameters and activations stay close to the fp32 reference") {
  for (const char* variant : {"untied", "tied"}) {
    INFO(variant);
    check_bf16(
        run_case(qwen3_vl(), variant, "packed", parallel::AcMode::off, Device::cpu(), DType::bf16),
        qwen3_vl());
  }
}

TEST_CASE("qwen3_vl golden: the packer's 3-D position ids for the row equal transformers' "
          "get_rope_index on each document") {
  for (const char* variant : {"untied", "tied"}) {
    INFO(variant);
    auto b = read_all_tensors(batch_file(qwen3_vl(), std::string(variant) + "_packed"));
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

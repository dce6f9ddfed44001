// Tensor-parallel splits that cannot work are refused before anything is split, naming the tensor
// (tests/parallel/test_tensor_parallel_mpi.cpp checks the splits that can, on 2 and 4 ranks). The
// group is a stand-in of 8 ranks (parallel/comm/local_group.h): the refusals need no peer.
#include <catch2/catch.hpp>

#include <algorithm>

#include "model/model_spec.h"
#include "parallel/comm/local_group.h"
#include "parallel/tp/tensor_parallel.h"

using namespace vlm;
using Catch::Matchers::Contains;

namespace {

std::shared_ptr<model::CausalLM> tiny(const std::string& snapshot) {
  return model::load_pretrained(std::string(VLM_SOURCE_DIR) + "/tests/data/" + snapshot,
                                DType::f32);
}

} // namespace

TEST_CASE("tensor parallel plan: more ranks than query heads is refused at o_proj") {
  // 4 query heads, 2 KV heads: tp 4 shares the KV heads (fine); tp 8 would share query heads,
  // whose o_proj columns every sharing rank would add again.
  auto m = tiny("qwen3_tiny_untied");
  parallel::LocalProcessGroup tp(0, 8);
  CHECK_THROWS_WITH(parallel::TensorParallel(*m, model::tp_plan(*m), tp),
                    Contains("model.layers.0.self_attn.o_proj: its 4 heads") &&
                        Contains("fewer than tp = 8"));
}

TEST_CASE("tensor parallel plan: the plan names every projection of every layer kind") {
  auto m = tiny("qwen3_5_tiny_hybrid");
  const parallel::TpPlan plan = model::tp_plan(*m);
  auto has = [&](const std::string& path, parallel::TpStyle style) {
    for (const auto& mod : plan.modules)
      if (mod.path == path) return mod.style == style;
    return false;
  };
  const std::string gdn = "model.language_model.layers.0.linear_attn.";
  CHECK(has(gdn + "in_proj_qkv", parallel::TpStyle::colwise));
  CHECK(has(gdn + "in_proj_z", parallel::TpStyle::colwise));
  CHECK(has(gdn + "out_proj", parallel::TpStyle::rowwise));
  const std::string attn = "model.language_model.layers.3.self_attn.";
  CHECK(has(attn + "q_proj", parallel::TpStyle::colwise));
  CHECK(has(attn + "o_proj", parallel::TpStyle::rowwise));
  CHECK(has("model.language_model.embed_tokens", parallel::TpStyle::vocab));
  CHECK(plan.head == "lm_head.weight");
  // GDN's fused q | k | v projection is split segment by segment (2 key heads of 32, 4 value
  // heads of 16), so each rank's q, k and v rows stay matched.
  for (const auto& mod : plan.modules)
    if (mod.path == gdn + "in_proj_qkv") {
      REQUIRE(mod.segments.size() == 3);
      CHECK(mod.segments[0].size == 64);
      CHECK(mod.segments[0].parts == 2);
      CHECK(mod.segments[2].size == 64);
      CHECK(mod.segments[2].parts == 4);
    }
  const auto partial = [&](const std::string& name) {
    return std::find(plan.partial_grads.begin(), plan.partial_grads.end(), name) !=
           plan.partial_grads.end();
  };
  CHECK(partial(gdn + "norm.weight"));
  CHECK(partial(attn + "q_norm.weight"));
  CHECK(partial(attn + "k_norm.weight"));
}

TEST_CASE("tensor parallel plan: a vision tower is split where its heads divide tp, else whole") {
  parallel::LocalProcessGroup tp(0, 2);
  { // Qwen3-VL's tiny tower: 4 heads, MLP 128 rows: split over 2.
    auto m = tiny("qwen3_vl_tiny_untied");
    parallel::TensorParallel split(*m, model::tp_plan(*m), tp);
    CHECK(split.left_whole().empty());
    const parallel::TpPlacement& qkv = split.placement("model.visual.blocks.0.attn.qkv.weight");
    REQUIRE(qkv.sharded());
    CHECK(qkv.ranges.size() == 3); // q, k, v: the first 2 heads of each (head dim 16)
    CHECK(qkv.ranges[1] == std::pair<int64_t, int64_t>{64, 32});
    CHECK(split.placement("model.visual.blocks.0.attn.proj.weight").dim == 1);
    CHECK(split.placement("model.visual.blocks.0.mlp.linear_fc2.weight").dim == 1);
    CHECK(!split.placement("model.visual.blocks.0.attn.proj.bias").sharded());
    CHECK(!split.placement("model.visual.merger.linear_fc1.weight").sharded());
  }
  { // Qwen3.5's tiny tower has 1 head: its attention stays whole; its 32-row MLP splits.
    auto m = tiny("qwen3_5_tiny_hybrid");
    parallel::TensorParallel split(*m, model::tp_plan(*m), tp);
    CHECK(split.left_whole().size() == 4); // qkv and proj of its 2 blocks
    CHECK(!split.placement("model.visual.blocks.0.attn.qkv.weight").sharded());
    CHECK(split.placement("model.visual.blocks.0.mlp.linear_fc1.weight").sharded());
  }
}

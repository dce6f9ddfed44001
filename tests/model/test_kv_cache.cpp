// Incremental decoding (model/kv_cache.h) against the full forward: for Qwen3, and for Qwen3-VL
// and Qwen3.5 (whose Gated DeltaNet layers cache conv history and recurrent state) with an image
// in the prompt, the logits of a prefill followed by one-token steps equal the rows
// of one forward over the whole sequence, and greedy_generate (which decodes with the cache)
// picks the tokens that recomputing the whole sequence each step picks.
#include <catch2/catch.hpp>

#include <algorithm>

#include "io/loader/position_ids.h"
#include "model/generate.h"
#include "model/kv_cache.h"
#include "model/lm_loss.h"
#include "model/model_spec.h"
#include "src/core/autograd.h"
#include "src/core/ops.h"

using namespace vlm;
using namespace vlm::model;

namespace {

std::shared_ptr<CausalLM> load(const std::string& name) {
  return load_pretrained(std::string(VLM_SOURCE_DIR) + "/tests/data/" + name, DType::f32);
}

// A prompt for the model: for a VLM one 4x6-patch image (6 merged tokens) between vision
// start/end tokens after a few text tokens; then text. Pixels are fixed pseudo-random values.
model::GenerateInput make_input(const CausalLM& m, int64_t text_tokens) {
  model::GenerateInput in;
  for (int64_t i = 0; i < 5; i++) in.prompt.push_back(int32_t(7 + 31 * i));
  if (m.has_vision()) {
    const nlohmann::json c = m.hf_config(), v = c.at("vision_config");
    in.grids = {io::GridTHW{1, 4, 6}};
    in.patch_dim = v.at("in_channels").get<int64_t>() * v.at("temporal_patch_size").get<int64_t>() *
                   v.at("patch_size").get<int64_t>() * v.at("patch_size").get<int64_t>();
    in.image_token_id = c.at("image_token_id").get<int32_t>();
    in.spatial_merge_size = v.at("spatial_merge_size").get<int64_t>();
    for (int64_t i = 0; i < 24 * in.patch_dim; i++)
      in.pixel_values.push_back(float(((i * 7919) % 201) - 100) / 100.0f);
    in.prompt.push_back(c.at("vision_start_token_id").get<int32_t>());
    for (int i = 0; i < 6; i++) in.prompt.push_back(in.image_token_id);
    in.prompt.push_back(c.at("vision_end_token_id").get<int32_t>());
  }
  for (int64_t i = 0; i < text_tokens; i++) in.prompt.push_back(int32_t(11 + 17 * i));
  return in;
}

// The batch of ids[from, end) for one forward over a single document (positions of the whole
// sequence), with the prompt's images when `from` is 0.
Batch batch_of(const CausalLM& m, const model::GenerateInput& in, const std::vector<int32_t>& ids,
               int64_t from) {
  const int64_t T = int64_t(ids.size()), n = T - from;
  Batch b;
  b.input_ids = Tensor::from_vector(std::vector<int32_t>(ids.begin() + from, ids.end()), {n});
  b.cu_seqlens = Tensor::from_vector(std::vector<int32_t>{0, int32_t(n)}, {2});
  std::vector<int64_t> pos(size_t(m.has_vision() ? 3 * T : T)), cols;
  if (!m.has_vision()) {
    io::text_position_ids(T, pos.data());
    b.position_ids = Tensor::from_vector(std::vector<int64_t>(pos.begin() + from, pos.end()), {n});
    return b;
  }
  io::mrope_position_ids(ids, in.grids, in.image_token_id, in.spatial_merge_size, pos.data(),
                         pos.data() + T, pos.data() + 2 * T);
  for (int64_t p = 0; p < 3; p++)
    cols.insert(cols.end(), pos.begin() + p * T + from, pos.begin() + (p + 1) * T);
  b.position_ids = Tensor::from_vector(cols, {3, n});
  if (from == 0) {
    b.pixel_values = Tensor::from_vector(in.pixel_values, {24, in.patch_dim});
    b.image_grid_thw = Tensor::from_vector(std::vector<int64_t>{1, 4, 6}, {1, 3});
  }
  return b;
}

double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::abs(x));
  return m;
}

} // namespace

TEST_CASE("kv cache: prefill + one-token steps give the full forward's logits") {
  for (const char* name : {"qwen3_tiny_untied", "qwen3_vl_tiny_untied", "qwen3_vl_tiny_tied",
                           "qwen3_5_tiny_hybrid", "qwen3_5_tiny_tied"}) {
    INFO(name);
    auto m = load(name);
    NoGradGuard no_grad;
    const model::GenerateInput in = make_input(*m, 4);
    std::vector<int32_t> ids = in.prompt;
    for (int i = 0; i < 6; i++) ids.push_back(int32_t(40 + 13 * i)); // the "generated" tokens
    const std::vector<double> full = lm_logits(*m, batch_of(*m, in, ids, 0)).to_doubles();
    const int64_t V = m->vocab_size(), P = int64_t(in.prompt.size());

    KVCache cache;
    std::vector<double> cached;
    for (int64_t end = P; end <= int64_t(ids.size()); end++) {
      const std::vector<int32_t> upto(ids.begin(), ids.begin() + end);
      Batch b = batch_of(*m, in, upto, end == P ? 0 : end - 1);
      b.kv_cache = &cache;
      const std::vector<double> l = lm_logits(*m, b).to_doubles();
      cached.insert(cached.end(), l.begin(), l.end());
      CHECK(cache.tokens == end);
    }
    REQUIRE(cached.size() == full.size());
    std::vector<double> diff(full.size());
    for (size_t i = 0; i < full.size(); i++) diff[i] = cached[i] - full[i];
    INFO("V " << V);
    CHECK(max_abs(diff) <= 1e-5 * max_abs(full));
  }
}

TEST_CASE("kv cache: a step after the prefill takes one token") {
  auto m = load("qwen3_tiny_untied");
  NoGradGuard no_grad;
  const model::GenerateInput in = make_input(*m, 4);
  KVCache cache;
  Batch b = batch_of(*m, in, in.prompt, 0);
  b.kv_cache = &cache;
  lm_logits(*m, b);
  std::vector<int32_t> ids = in.prompt;
  ids.push_back(3);
  ids.push_back(4);
  Batch two = batch_of(*m, in, ids, int64_t(in.prompt.size()));
  two.kv_cache = &cache;
  CHECK_THROWS_WITH(lm_logits(*m, two), Catch::Matchers::Contains("takes one token, got 2"));
}

TEST_CASE("kv cache: greedy_generate picks what recomputing the whole sequence picks") {
  for (const char* name : {"qwen3_tiny_tied", "qwen3_vl_tiny_untied", "qwen3_5_tiny_hybrid"}) {
    INFO(name);
    auto m = load(name);
    const model::GenerateInput in = make_input(*m, 3);
    const std::vector<int32_t> got = model::greedy_generate(*m, in, 8, {}, Device::cpu());
    REQUIRE(got.size() == 8u);
    NoGradGuard no_grad;
    std::vector<int32_t> ids = in.prompt;
    for (int step = 0; step < 8; step++) {
      const int64_t T = int64_t(ids.size());
      const std::vector<double> row =
          slice(lm_logits(*m, batch_of(*m, in, ids, 0)), 0, T - 1, T).to_doubles();
      std::vector<double> sorted = row;
      std::sort(sorted.rbegin(), sorted.rend());
      const int32_t best = int32_t(std::max_element(row.begin(), row.end()) - row.begin());
      INFO("step " << step << ", margin to the runner-up " << sorted[0] - sorted[1]);
      CHECK(got[size_t(step)] == best);
      ids.push_back(best);
    }
  }
}

TEST_CASE("generate: ids at or above vocab_limit are never picked") {
  // The limit is set just below the unrestricted argmax, so the pick must be the runner-up
  // among the lower ids (a padded vocabulary's tail has no token the tokenizer can decode).
  auto m = load("qwen3_vl_tiny_untied");
  model::GenerateInput in = make_input(*m, 3);
  std::vector<double> row;
  {
    NoGradGuard no_grad;
    const int64_t T = int64_t(in.prompt.size());
    row = slice(lm_logits(*m, batch_of(*m, in, in.prompt, 0)), 0, T - 1, T).to_doubles();
  }
  int64_t best = std::max_element(row.begin(), row.end()) - row.begin();
  if (best == 0) best = 1 + (std::max_element(row.begin() + 1, row.end()) - row.begin() - 1);
  const int32_t expected = int32_t(std::max_element(row.begin(), row.begin() + best) - row.begin());
  in.vocab_limit = best;
  const std::vector<int32_t> got = model::greedy_generate(*m, in, 1, {}, Device::cpu());
  REQUIRE(got.size() == 1u);
  CHECK(got[0] == expected);
  CHECK(got[0] < best);
}

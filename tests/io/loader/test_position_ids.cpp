// Position ids against transformers' get_rope_index (tests/data/position_ids/golden.json, made by
// tools/golden/gen_position_ids.py from Qwen3VLModel / Qwen3_5Model.get_rope_index), alone and
// packed into one row, plus hand-made cases and the consistency checks of find_image_runs.
#include <catch2/catch.hpp>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "io/loader/packing.h"
#include "io/loader/position_ids.h"
#include "src/base/check.h"

using Catch::Matchers::Contains;
using vlm::io::GridTHW;
using vlm::io::ImageRun;

namespace {

struct GoldenCase {
  std::string name;
  std::vector<int32_t> input_ids;
  std::vector<GridTHW> grids;
  std::vector<int64_t> t, h, w; // expected planes
};

struct Golden {
  int32_t image_token_id = 0, vision_start = 0, vision_end = 0;
  int64_t merge = 0;
  std::vector<GoldenCase> cases;
};

const Golden& golden() {
  static const Golden g = [] {
    const std::string path = std::string(VLM_SOURCE_DIR) + "/tests/data/position_ids/golden.json";
    std::ifstream in(path);
    VLM_CHECK(in, "cannot open ", path, " (regenerate with tools/golden/gen_position_ids.py)");
    auto j = nlohmann::json::parse(in);
    Golden out;
    out.image_token_id = j.at("image_token_id").get<int32_t>();
    out.vision_start = j.at("vision_start_token_id").get<int32_t>();
    out.vision_end = j.at("vision_end_token_id").get<int32_t>();
    out.merge = j.at("spatial_merge_size").get<int64_t>();
    for (const auto& c : j.at("cases")) {
      GoldenCase gc;
      gc.name = c.at("name").get<std::string>();
      gc.input_ids = c.at("input_ids").get<std::vector<int32_t>>();
      for (const auto& g : c.at("image_grid_thw"))
        gc.grids.push_back(
            {g.at(0).get<int64_t>(), g.at(1).get<int64_t>(), g.at(2).get<int64_t>()});
      const auto& p = c.at("position_ids");
      gc.t = p.at(0).get<std::vector<int64_t>>();
      gc.h = p.at(1).get<std::vector<int64_t>>();
      gc.w = p.at(2).get<std::vector<int64_t>>();
      out.cases.push_back(std::move(gc));
    }
    return out;
  }();
  return g;
}

const GoldenCase& golden_case(const std::string& name) {
  for (const auto& c : golden().cases)
    if (c.name == name) return c;
  FAIL("no golden case " << name);
  throw; // unreachable
}

std::vector<int64_t> slice(const std::vector<int64_t>& v, size_t begin, size_t n) {
  return {v.begin() + std::ptrdiff_t(begin), v.begin() + std::ptrdiff_t(begin + n)};
}

std::vector<int64_t> iota(int64_t n, int64_t from = 0) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; i++) v[size_t(i)] = from + i;
  return v;
}

} // namespace

TEST_CASE("position_ids: MRoPE equals transformers' get_rope_index (golden)") {
  const Golden& g = golden();
  REQUIRE(g.cases.size() >= 8);
  REQUIRE(g.image_token_id == vlm::io::PackingConfig{}.image_token_id); // Qwen3-VL ids
  for (const auto& c : g.cases) {
    INFO("case " << c.name);
    const size_t n = c.input_ids.size();
    REQUIRE(c.t.size() == n);
    std::vector<int64_t> t(n, -1), h(n, -1), w(n, -1);
    int64_t next = vlm::io::mrope_position_ids(c.input_ids, c.grids, g.image_token_id, g.merge,
                                               t.data(), h.data(), w.data());
    CHECK(t == c.t);
    CHECK(h == c.h);
    CHECK(w == c.w);
    // HF's rope_delta + L = max position + 1 equals our running position in all these cases.
    int64_t max_pos = 0;
    for (size_t i = 0; i < n; i++) max_pos = std::max({max_pos, c.t[i], c.h[i], c.w[i]});
    CHECK(next == max_pos + 1);
  }
}

TEST_CASE("position_ids: hand-made MRoPE document") {
  // text(2) <vs> image 1x4x6 (2x3 merged tokens) <ve> text(2)
  const int32_t I = 151655, VS = 151652, VE = 151653;
  std::vector<int32_t> ids{7, 8, VS, I, I, I, I, I, I, VE, 9, 10};
  std::vector<GridTHW> grids{{1, 4, 6}};
  std::vector<int64_t> t(12), h(12), w(12);
  int64_t next = vlm::io::mrope_position_ids(ids, grids, I, 2, t.data(), h.data(), w.data());
  // text 0 1, <vs> 2; image rows start at 3: t = 3, h = 3 + row, w = 3 + col; then cur = 3 + 3.
  CHECK(t == std::vector<int64_t>{0, 1, 2, 3, 3, 3, 3, 3, 3, 6, 7, 8});
  CHECK(h == std::vector<int64_t>{0, 1, 2, 3, 3, 3, 4, 4, 4, 6, 7, 8});
  CHECK(w == std::vector<int64_t>{0, 1, 2, 3, 4, 5, 3, 4, 5, 6, 7, 8});
  CHECK(next == 9);

  std::vector<int64_t> p(5, -1);
  vlm::io::text_position_ids(5, p.data());
  CHECK(p == iota(5));
}

TEST_CASE("position_ids: packed documents restart at 0 and match the golden per document") {
  const Golden& g = golden();
  vlm::io::PackingConfig cfg;
  cfg.mrope = true;
  cfg.image_token_id = g.image_token_id;
  cfg.vision_start_id = g.vision_start;
  cfg.vision_end_id = g.vision_end;
  cfg.spatial_merge_size = g.merge;
  const std::vector<std::string> names{"multi_image", "text_only", "image_first", "one_image",
                                       "realistic_chat"};
  std::vector<vlm::io::TokenizedSample> docs;
  int64_t total = 0;
  for (size_t d = 0; d < names.size(); d++) {
    const GoldenCase& c = golden_case(names[d]);
    vlm::io::TokenizedSample s;
    s.input_ids = c.input_ids;
    s.labels = c.input_ids;
    s.image_grid_thw = c.grids;
    for (const auto& gr : c.grids) s.num_patches += gr[0] * gr[1] * gr[2];
    s.global_index = int64_t(d);
    total += s.length();
    docs.push_back(std::move(s));
  }
  cfg.seq_len = total + 37; // leaves a pad segment
  auto row = vlm::io::pack_row(docs, cfg);
  const size_t T = size_t(cfg.seq_len);
  REQUIRE(row.position_ids.size() == 3 * T);
  const std::vector<int64_t> planes[3] = {slice(row.position_ids, 0, T),
                                          slice(row.position_ids, T, T),
                                          slice(row.position_ids, 2 * T, T)};
  REQUIRE(row.cu_seqlens.size() == names.size() + 2);
  for (size_t d = 0; d < names.size(); d++) {
    INFO("document " << d << " (" << names[d] << ")");
    const GoldenCase& c = golden_case(names[d]);
    const size_t at = size_t(row.cu_seqlens[d]), n = c.input_ids.size();
    REQUIRE(size_t(row.cu_seqlens[d + 1]) - at == n);
    CHECK(slice(planes[0], at, n) == c.t);
    CHECK(slice(planes[1], at, n) == c.h);
    CHECK(slice(planes[2], at, n) == c.w);
  }
  for (const auto& plane : planes) CHECK(slice(plane, size_t(total), 37) == iota(37));

  // 1-D positions: a plain arange per document and for the pad segment.
  cfg.mrope = false;
  row = vlm::io::pack_row(docs, cfg);
  REQUIRE(row.position_ids.size() == T);
  for (size_t d = 0; d + 1 < row.cu_seqlens.size(); d++) {
    const int32_t b = row.cu_seqlens[d], e = row.cu_seqlens[d + 1];
    CHECK(slice(row.position_ids, size_t(b), size_t(e - b)) == iota(e - b));
  }
}

TEST_CASE("position_ids: find_image_runs checks runs against grids") {
  const int32_t I = 9, VS = 7, VE = 8;
  std::vector<ImageRun> runs;
  auto check = [&](std::vector<int32_t> ids, std::vector<GridTHW> grids) {
    return vlm::io::find_image_runs(ids, grids, I, 2, runs);
  };
  // Two images, 4 and 1 tokens.
  CHECK(check({1, VS, I, I, I, I, VE, 2, VS, I, VE}, {{1, 4, 4}, {1, 2, 2}}).empty());
  REQUIRE(runs.size() == 2);
  CHECK((runs[0].begin == 2 && runs[0].end == 6 && runs[1].begin == 9 && runs[1].end == 10));
  CHECK(check({1, 2, 3}, {}).empty());
  CHECK(runs.empty());

  CHECK_THAT(check({1, I, I, I, 2}, {{1, 4, 4}}), Contains("has 3 tokens") && Contains("needs 4"));
  CHECK_THAT(check({1, I, 2, I}, {{1, 2, 2}}), Contains("has no image_grid_thw entry"));
  CHECK_THAT(check({1, I, 2}, {{1, 2, 2}, {1, 2, 2}}),
             Contains("2 image_grid_thw entries but 1 image placeholder runs"));
  CHECK_THAT(check({1, I, 2}, {{1, 3, 2}}), Contains("not a valid grid"));
  CHECK_THAT(check({1, 2}, {{0, 2, 2}}), Contains("not a valid grid"));
  // Adjacent images without markers merge into one run (transformers cannot split them either).
  CHECK_THAT(check({I, I}, {{1, 2, 2}, {1, 2, 2}}), Contains("has 2 tokens"));

  std::vector<int32_t> ids{1, I, I, I};
  std::vector<GridTHW> grids{{1, 4, 4}};
  std::vector<int64_t> t(4), h(4), w(4);
  CHECK_THROWS_WITH(vlm::io::mrope_position_ids(ids, grids, I, 2, t.data(), h.data(), w.data()),
                    Contains("mrope_position_ids") && Contains("needs 4"));
}

// Vision-tower patch positions (model/vision/vision_positions.h) against transformers' own
// helpers as Qwen3VLVisionModel calls them (tools/golden/gen_vision_positions.py): bilinear taps
// and fp32 weights bit for bit, rotary (row, col) ids and attention segments exactly, and the 2-D
// rotary tables against the real Qwen3VLVisionRotaryEmbedding at head dims 16, 64 and 72.
#include <catch2/catch.hpp>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "model/vision/vision_positions.h"
#include "tests/error_of.h"
#include "tests/golden/golden.h"

using namespace vlm;
using namespace vlm::model;

TEST_CASE("vision positions: taps, weights, rotary ids and segments equal transformers'") {
  std::ifstream in(std::string(VLM_SOURCE_DIR) + "/tests/data/vision_positions/golden.json");
  REQUIRE(in.good());
  const nlohmann::json golden = nlohmann::json::parse(in);
  for (const auto& c : golden.at("cases")) {
    INFO("case " << c.at("name").get<std::string>());
    std::vector<GridTHW> grids;
    for (const auto& g : c.at("grids")) grids.push_back({g[0], g[1], g[2]});
    const VisionPositions p = vision_positions(grids, c.at("table_side").get<int64_t>());
    const auto taps = c.at("taps"), weights = c.at("weights");
    REQUIRE(p.patches == int64_t(taps.size()));
    REQUIRE(p.taps.size() == 4 * taps.size());
    int64_t wrong_taps = 0, wrong_weights = 0;
    for (size_t i = 0; i < taps.size(); i++)
      for (size_t k = 0; k < 4; k++) {
        wrong_taps += p.taps[4 * i + k] != taps[i][k].get<int64_t>();
        // The golden holds fp32 values printed exactly: equality, not a tolerance.
        wrong_weights += p.weights[4 * i + k] != weights[i][k].get<float>();
      }
    CHECK(wrong_taps == 0);
    CHECK(wrong_weights == 0);
    CHECK(p.rows == c.at("rows").get<std::vector<int64_t>>());
    CHECK(p.cols == c.at("cols").get<std::vector<int64_t>>());
    CHECK(p.cu_seqlens == c.at("cu_seqlens").get<std::vector<int32_t>>());
  }
}

TEST_CASE("vision positions: the 2-D rotary tables equal transformers' (hd 16, 64, 72)") {
  const vlm::testing::Golden g("vision_rope");
  for (const char* c : {"tiny_hd16", "vl2b_hd64", "vl8b_hd72"}) {
    INFO("case " << c);
    const std::vector<double> flat = g.get(c, "grids").to_doubles();
    std::vector<GridTHW> grids;
    for (size_t i = 0; i + 2 < flat.size(); i += 3)
      grids.push_back({int64_t(flat[i]), int64_t(flat[i + 1]), int64_t(flat[i + 2])});
    const int64_t head_dim = int64_t(g.get(c, "head_dim").item());
    const RopeTables t = vision_rope_tables(vision_positions(grids, 48), head_dim, 10000.0);
    CHECK(t.rotary_dim == head_dim);
    CHECK(vlm::testing::rel_error(t.cos, g.get(c, "cos")) <= vlm::testing::kGoldenF32Tol);
    CHECK(vlm::testing::rel_error(t.sin, g.get(c, "sin")) <= vlm::testing::kGoldenF32Tol);
  }
  CHECK_THAT(vlm::testing::error_of([] {
               vision_rope_tables(vision_positions({{1, 2, 2}}, 8), 18, 1e4);
             }),
             Catch::Matchers::Contains("multiple of 4, got 18"));
}

TEST_CASE("vision positions: grids that cannot be merged are errors naming the grid") {
  CHECK_THAT(vlm::testing::error_of([] {
               vision_positions({{1, 4, 4}, {1, 3, 4}}, 8);
             }),
             Catch::Matchers::Contains("image_grid_thw[1] = (1, 3, 4)"));
  CHECK_THAT(vlm::testing::error_of([] {
               vision_positions({{0, 4, 4}}, 8);
             }),
             Catch::Matchers::Contains("image_grid_thw[0]"));
}

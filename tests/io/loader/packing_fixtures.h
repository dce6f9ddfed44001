// Helpers of the packing tests (test_packing.cpp, test_packing_plan.cpp): hand-made and random
// tokenized samples, small configs, row comparison and file bytes.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <tuple>

#include "io/loader/packing.h"
#include "io/loader/packing_plan.h"
#include "src/base/check.h"
#include "src/base/rng.h"
#include "tests/error_of.h"
#include "tests/temp_dir.h"

namespace fs = std::filesystem;
using Catch::Matchers::Contains;
using vlm::io::GridTHW;
using vlm::io::OnlinePacker;
using vlm::io::OverlongPolicy;
using vlm::io::PackedRow;
using vlm::io::PackingConfig;
using vlm::io::PackingPlan;
using vlm::io::PlanIdentity;
using vlm::io::PlanOptions;
using vlm::io::SampleFate;
using vlm::io::TokenizedSample;

using vlm::testing::error_of;

namespace vlm::testing::packing {

constexpr int32_t IMG = 151655, VS = 151652, VE = 151653, PAD = 151643;
constexpr int64_t PATCH_DIM = 4;

using TempDir = vlm::testing::TempDir;

// One piece of a synthetic document: `text` text tokens, or an image of `grid`.
struct Part {
  int64_t text = 0;
  GridTHW grid{0, 0, 0};
  bool markers = true; // wrap the image in <|vision_start|> … <|vision_end|>
};
inline Part txt(int64_t n) { return {n, {0, 0, 0}, true}; }
inline Part img(GridTHW g, bool markers = true) { return {0, g, markers}; }

// Text ids and pixels are functions of (global index, position), so a sample can be recreated
// from its index alone (as the loader re-reads it on resume) and every value is traceable.
inline TokenizedSample make_sample(int64_t gidx, const std::vector<Part>& parts,
                                   bool pixels = true) {
  TokenizedSample s;
  s.global_index = gidx;
  s.patch_dim = PATCH_DIM;
  for (const Part& p : parts) {
    if (p.text > 0) {
      for (int64_t i = 0; i < p.text; i++)
        s.input_ids.push_back(int32_t(1 + (gidx * 131 + int64_t(s.input_ids.size()) * 7) % 150000));
      continue;
    }
    if (p.markers) s.input_ids.push_back(VS);
    s.input_ids.insert(s.input_ids.end(), size_t(p.grid[0] * p.grid[1] * p.grid[2] / 4), IMG);
    if (p.markers) s.input_ids.push_back(VE);
    s.image_grid_thw.push_back(p.grid);
    s.num_patches += p.grid[0] * p.grid[1] * p.grid[2];
  }
  s.labels = s.input_ids; // all trainable unless a test masks some
  if (pixels)
    for (int64_t r = 0; r < s.num_patches; r++)
      for (int64_t c = 0; c < PATCH_DIM; c++)
        s.pixel_values.push_back(float((gidx % 1000) * 10000 + r * PATCH_DIM + c));
  return s;
}

inline PackingConfig small_config(int64_t seq_len, int64_t buffer = 16) {
  PackingConfig cfg;
  cfg.seq_len = seq_len;
  cfg.buffer_size = buffer;
  cfg.mrope = true;
  return cfg;
}

// A varied stream: text-only and image documents (1-2 images), prompts masked, some overlong,
// a few without any trainable label. Deterministic per global index.
inline TokenizedSample random_sample(int64_t gidx, int64_t seq_len) {
  vlm::Rng rng(1234, uint64_t(gidx));
  static const GridTHW grids[] = {{1, 4, 4}, {1, 2, 6}, {1, 8, 4}, {1, 6, 6}, {1, 2, 2}};
  std::vector<Part> parts;
  const bool long_doc = rng.uniform() < 0.08; // about half of these are overlong
  parts.push_back(
      txt(long_doc ? rng.randint(seq_len / 2, seq_len * 3 / 2) : rng.randint(1, seq_len / 6)));
  if (rng.uniform() < 0.5) {
    int64_t n_img = rng.randint(1, 3);
    for (int64_t i = 0; i < n_img; i++) {
      parts.push_back(img(grids[rng.randint(0, 5)]));
      parts.push_back(txt(rng.randint(1, seq_len / 12)));
    }
  }
  TokenizedSample s = make_sample(gidx, parts);
  const size_t prompt = size_t(rng.randint(0, int64_t(s.labels.size()) / 2 + 1));
  std::fill(s.labels.begin(), s.labels.begin() + std::ptrdiff_t(prompt), -100);
  if (rng.uniform() < 0.02) std::fill(s.labels.begin(), s.labels.end(), -100);
  return s;
}

template <typename T> std::vector<T> sub(const std::vector<T>& v, int64_t b, int64_t n) {
  return {v.begin() + b, v.begin() + b + n};
}

inline bool same_row(const PackedRow& a, const PackedRow& b) {
  return a.input_ids == b.input_ids && a.labels == b.labels && a.cu_seqlens == b.cu_seqlens &&
         a.position_ids == b.position_ids && a.pixel_values == b.pixel_values &&
         a.image_grid_thw == b.image_grid_thw && a.num_patches == b.num_patches &&
         a.patch_dim == b.patch_dim && a.real_tokens == b.real_tokens &&
         a.pad_tokens == b.pad_tokens && a.num_docs == b.num_docs &&
         a.sample_indices == b.sample_indices && a.doc_num_images == b.doc_num_images;
}

// Every invariant of a row, with each document compared to its prepared original.
inline void check_row(const PackedRow& row, const PackingConfig& cfg,
                      const std::map<int64_t, TokenizedSample>& prepared) {
  const int64_t T = cfg.seq_len;
  REQUIRE(int64_t(row.input_ids.size()) == T);
  REQUIRE(int64_t(row.labels.size()) == T);
  REQUIRE(int64_t(row.position_ids.size()) == (cfg.mrope ? 3 * T : T));
  REQUIRE(row.real_tokens + row.pad_tokens == T);
  REQUIRE(row.num_docs == int64_t(row.sample_indices.size()));
  REQUIRE(row.num_docs >= 1);
  REQUIRE(int64_t(row.cu_seqlens.size()) == row.num_docs + 1 + (row.pad_tokens > 0 ? 1 : 0));
  REQUIRE(row.cu_seqlens.front() == 0);
  REQUIRE(row.cu_seqlens.back() == T);
  REQUIRE(row.cu_seqlens[size_t(row.num_docs)] == row.real_tokens);
  std::vector<GridTHW> grids;
  std::vector<float> pixels;
  for (int64_t d = 0; d < row.num_docs; d++) {
    const TokenizedSample& s = prepared.at(row.sample_indices[size_t(d)]);
    const int64_t at = row.cu_seqlens[size_t(d)], n = row.cu_seqlens[size_t(d) + 1] - at;
    REQUIRE(n == s.length());
    CHECK(sub(row.input_ids, at, n) == s.input_ids);
    std::vector<int32_t> want = s.labels;
    want[0] = -100; // first token of every document
    CHECK(sub(row.labels, at, n) == want);
    for (int64_t p = 0; p < (cfg.mrope ? 3 : 1); p++)
      CHECK(row.position_ids[size_t(p * T + at)] == 0);
    CHECK(row.doc_num_images[size_t(d)] == int32_t(s.image_grid_thw.size()));
    grids.insert(grids.end(), s.image_grid_thw.begin(), s.image_grid_thw.end());
    pixels.insert(pixels.end(), s.pixel_values.begin(), s.pixel_values.end());
  }
  for (int64_t i = row.real_tokens; i < T; i++) {
    CHECK(row.input_ids[size_t(i)] == cfg.pad_id);
    CHECK(row.labels[size_t(i)] == -100);
  }
  CHECK(row.image_grid_thw == grids);
  CHECK(row.pixel_values == pixels);
  CHECK(int64_t(pixels.size()) == row.num_patches * (row.num_patches > 0 ? PATCH_DIM : 0));
}

// Drives an online packer over a stream and collects its rows.
inline std::vector<PackedRow> run_online(OnlinePacker& p, int64_t begin, int64_t end,
                                         int64_t seq_len, bool finish = true) {
  std::vector<PackedRow> rows;
  for (int64_t g = begin; g < end; g++) {
    p.push(random_sample(g, seq_len));
    while (p.ready()) rows.push_back(p.pop());
  }
  if (finish) {
    p.finish();
    while (p.ready()) rows.push_back(p.pop());
  }
  return rows;
}

inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
inline void write_bytes(const std::string& path, const std::string& data) {
  std::ofstream(path, std::ios::binary) << data;
}

} // namespace vlm::testing::packing

using namespace vlm::testing::packing;

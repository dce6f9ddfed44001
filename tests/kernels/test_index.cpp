// kernels/index.h (cpu::first_out_of_range, index_select, index_add) on raw buffers against plain
// loops written here: gathers are copies (compared exactly), scatter-adds sums in double.
#include <catch2/catch.hpp>

#include <cstring>
#include <type_traits>
#include <vector>

#include "kernels/index.h"
#include "src/base/rng.h"
#include "tests/kernels/kernel_reference.h"

using namespace vlm;
using namespace vlm::kernels;
using vlm::testing::check_close;
using vlm::testing::random_vector;
using vlm::testing::widen_all;

namespace {

// (outer, dim_size, n_index, inner)
struct IndexShape {
  int64_t outer, dim_size, n_index, inner;
};
// An embedding lookup (outer 1, one row per token, repeats); a middle-dim gather with outer > 1;
// inner 1; a single index; more indices than rows; a long row.
const std::vector<IndexShape> kShapes = {{1, 11, 9, 5}, {3, 7, 4, 3},  {2, 5, 6, 1},
                                         {4, 3, 1, 7},  {1, 2, 13, 2}, {2, 4, 3, 1000}};

template <typename I> std::vector<I> make_index(Rng& rng, const IndexShape& s) {
  std::vector<I> idx;
  for (int64_t j = 0; j < s.n_index; j++) idx.push_back(I(rng.randint(0, s.dim_size)));
  if (s.n_index > 2) idx[2] = idx[0]; // a repeat
  return idx;
}

template <typename T, typename I> void check_select(const IndexShape& s) {
  INFO("outer " << s.outer << " dim " << s.dim_size << " n_index " << s.n_index << " inner "
                << s.inner);
  Rng rng(uint64_t(s.dim_size * 17 + s.n_index));
  auto x = random_vector<T>(rng, s.outer * s.dim_size * s.inner, -3, 3);
  auto idx = make_index<I>(rng, s);
  REQUIRE(cpu::first_out_of_range(idx.data(), s.n_index, s.dim_size) == -1);
  std::vector<T> out(size_t(s.outer * s.n_index * s.inner));
  cpu::index_select<T, I>(out.data(), x.data(), idx.data(), s.outer, s.dim_size, s.n_index,
                          s.inner);
  int64_t mismatches = 0;
  for (int64_t o = 0; o < s.outer; o++)
    for (int64_t j = 0; j < s.n_index; j++)
      for (int64_t i = 0; i < s.inner; i++) {
        const T want = x[(o * s.dim_size + int64_t(idx[j])) * s.inner + i];
        const T got = out[(o * s.n_index + j) * s.inner + i];
        mismatches += std::memcmp(&want, &got, sizeof(T)) != 0; // a copy: bit for bit
      }
  CHECK(mismatches == 0);
}

template <typename T, typename I> void check_add(const IndexShape& s) {
  INFO("outer " << s.outer << " dim " << s.dim_size << " n_index " << s.n_index << " inner "
                << s.inner);
  Rng rng(uint64_t(s.dim_size * 19 + s.n_index));
  auto out = random_vector<T>(rng, s.outer * s.dim_size * s.inner, -1, 1);
  auto src = random_vector<T>(rng, s.outer * s.n_index * s.inner, -1, 1);
  auto idx = make_index<I>(rng, s);
  std::vector<double> ref = widen_all(out);
  const auto srcd = widen_all(src);
  for (int64_t o = 0; o < s.outer; o++)
    for (int64_t j = 0; j < s.n_index; j++)
      for (int64_t i = 0; i < s.inner; i++)
        ref[(o * s.dim_size + int64_t(idx[j])) * s.inner + i] +=
            srcd[(o * s.n_index + j) * s.inner + i];
  cpu::index_add<T, I>(out.data(), src.data(), idx.data(), s.outer, s.dim_size, s.n_index, s.inner);
  // A destination sums at most 14 values in [-1, 1] in float: < 14 * 15 * 2^-24 < 2e-5 absolute
  // (rows that no index hits are unchanged: exact). double: 1e-14.
  check_close(out, ref, 0, std::is_same_v<T, double> ? 1e-14 : 2e-5, "index_add");
}

} // namespace

TEST_CASE("index kernel: first_out_of_range", "[index]") {
  const std::vector<int64_t> a = {0, 4, 2, 5, -1};
  CHECK(cpu::first_out_of_range(a.data(), 5, 5) == 3);
  CHECK(cpu::first_out_of_range(a.data(), 3, 5) == -1);
  CHECK(cpu::first_out_of_range(a.data(), 5, 6) == 4);
  const std::vector<int32_t> b = {-1};
  CHECK(cpu::first_out_of_range(b.data(), 1, 10) == 0);
  CHECK(cpu::first_out_of_range(b.data(), 0, 10) == -1);
}

TEST_CASE("index kernel: index_select (embedding lookup, middle-dim gather) copies rows",
          "[index]") {
  for (const auto& s : kShapes) {
    check_select<float, int64_t>(s);
    check_select<float, int32_t>(s);
    check_select<double, int64_t>(s);
    check_select<bf16, int32_t>(s);
  }
  // A hand-checked embedding: rows of a [4, 2] table picked by token ids.
  const std::vector<float> table = {0, 1, 10, 11, 20, 21, 30, 31};
  const std::vector<int32_t> ids = {3, 0, 3, 2};
  std::vector<float> emb(8);
  cpu::index_select<float, int32_t>(emb.data(), table.data(), ids.data(), 1, 4, 4, 2);
  CHECK(emb == std::vector<float>{30, 31, 0, 1, 30, 31, 20, 21});
}

TEST_CASE("index kernel: index_add sums repeated indices into the destination rows", "[index]") {
  for (const auto& s : kShapes) {
    check_add<float, int64_t>(s);
    check_add<float, int32_t>(s);
    check_add<double, int32_t>(s);
  }
  // The embedding gradient by hand: [3, 2] grad rows scattered by ids into a zeroed [4, 2] table.
  const std::vector<double> grad = {1, 2, 10, 20, 100, 200};
  const std::vector<int64_t> ids = {2, 0, 2};
  std::vector<double> table(8, 0.0);
  cpu::index_add<double, int64_t>(table.data(), grad.data(), ids.data(), 1, 4, 3, 2);
  CHECK(table == std::vector<double>{10, 20, 0, 0, 101, 202, 0, 0});
}

TEST_CASE("index kernel: bf16 index_add rounds each destination once", "[index]") {
  // 1 + 2^-8 + 2^-8 = 1 + 2^-7 is a bf16 value, but 1 + 2^-8 is a tie that rounds back to 1:
  // adding the two sources one rounding at a time would leave 1.
  std::vector<bf16> out = {bf16(1.0f), bf16(5.0f)};
  const std::vector<bf16> src = {bf16(0.00390625f), bf16(0.00390625f), bf16(2.0f)};
  const std::vector<int64_t> idx = {0, 0, 1};
  cpu::index_add<bf16, int64_t>(out.data(), src.data(), idx.data(), 1, 2, 3, 1);
  CHECK(float(out[0]) == 1.0078125f);
  CHECK(float(out[1]) == 7.0f);
}

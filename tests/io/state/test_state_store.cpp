// The in-memory state's boxes (MemoryState::write_slab / read_slab_into): boxes that tile a
// tensor assemble it, strided blocks included; any box reads back; boxes out of bounds, overlaps
// and gaps are errors naming the key, the shape, the offset and the block. Values are checked
// against index arithmetic, not the views the store uses.
#include <catch2/catch.hpp>

#include <vector>

#include "io/state/state_store.h"
#include "src/core/ops/shape_ops.h"
#include "src/core/tensor.h"
#include "tests/error_of.h"
#include "tests/io/state/box_values.h"

using namespace vlm;
using Catch::Matchers::Contains;
using vlm::testing::box_values;
using vlm::testing::error_of;
using vlm::testing::pattern;

namespace {

io::Slab slab(const std::vector<double>& all, const Shape& shape, DType dtype,
              const std::vector<int64_t>& offset, const Shape& box) {
  return {offset, Tensor::from_doubles(box_values(all, shape, offset, box), box, dtype)};
}

} // namespace

TEST_CASE("memory state: boxes that tile a tensor assemble it, any box reads back") {
  for (DType dtype : {DType::f32, DType::bf16}) {
    INFO(dtype_name(dtype));
    io::MemoryState st;
    const Shape matrix = {6, 10}, cube = {4, 6, 8};
    const std::vector<double> m = pattern(matrix), c = pattern(cube);
    // A 2 x 2 grid whose last block is two row segments, one block given as a strided view.
    io::Slab strided = slab(m, matrix, dtype, {0, 0}, {3, 5});
    strided.block = transpose(copy(transpose(strided.block, 0, 1)), 0, 1);
    REQUIRE_FALSE(strided.block.is_contiguous());
    st.write_slab("model/matrix", matrix, dtype,
                  {strided, slab(m, matrix, dtype, {0, 5}, {3, 5}),
                   slab(m, matrix, dtype, {3, 0}, {3, 5}), io::Slab{{0, 0}, Tensor()},
                   slab(m, matrix, dtype, {3, 5}, {1, 5}), slab(m, matrix, dtype, {4, 5}, {2, 5})});
    st.write_slab("model/cube", cube, dtype,
                  {slab(c, cube, dtype, {0, 0, 0}, {4, 3, 8}),
                   slab(c, cube, dtype, {0, 3, 0}, {4, 3, 4}),
                   slab(c, cube, dtype, {0, 3, 4}, {4, 3, 4})});
    CHECK(st.shape("model/matrix") == matrix);
    CHECK(st.dtype("model/cube") == dtype);
    Tensor whole = Tensor::zeros(cube, dtype);
    st.read_tensor_into("model/cube", whole);
    CHECK(whole.to_doubles() == c);
    for (const auto& [offset, box] : std::vector<std::pair<std::vector<int64_t>, Shape>>{
             {{0, 0}, {6, 10}}, {{1, 3}, {4, 5}}, {{5, 9}, {1, 1}}, {{2, 4}, {0, 3}}}) {
      INFO(shape_str(offset) << " " << shape_str(box));
      Tensor got = Tensor::zeros(box, dtype);
      st.read_slab_into("model/matrix", offset, got);
      CHECK(got.to_doubles() == box_values(m, matrix, offset, box));
    }
    Tensor cube_box = Tensor::zeros({2, 3, 4}, dtype);
    st.read_slab_into("model/cube", {1, 2, 3}, cube_box);
    CHECK(cube_box.to_doubles() == box_values(c, cube, {1, 2, 3}, {2, 3, 4}));
    // Into a strided destination: a column block of a larger tensor.
    Tensor wide = Tensor::zeros({6, 4}, dtype);
    Tensor columns = slice(wide, 1, 1, 3);
    st.read_slab_into("model/matrix", {0, 7}, columns);
    CHECK(columns.to_doubles() == box_values(m, matrix, {0, 7}, {6, 2}));
  }
}

TEST_CASE("memory state: boxes out of bounds, overlapping or leaving gaps are refused") {
  io::MemoryState st;
  const Shape matrix = {6, 10};
  const std::vector<double> m = pattern(matrix);
  const DType f32 = DType::f32;
  CHECK_THAT(error_of([&] {
               st.write_slab("model/a", matrix, f32, {{{4, 0}, Tensor::zeros({3, 10})}});
             }),
             Contains("'model/a'") && Contains("f32(6, 10)") && Contains("offset (4, 0)") &&
                 Contains("f32(3, 10)"));
  CHECK_THAT(error_of([&] {
               st.write_slab("model/a", matrix, f32, {{{0}, Tensor::zeros(matrix)}});
             }),
             Contains("offset (0)"));
  CHECK_THAT(
      error_of([&] {
        st.write_slab("model/a", matrix, f32, {{{0, 0}, Tensor::zeros(matrix, DType::bf16)}});
      }),
      Contains("bf16(6, 10)") && Contains("a f32(6, 10)"));
  CHECK_THAT(error_of([&] {
               st.write_slab(
                   "model/a", matrix, f32,
                   {slab(m, matrix, f32, {0, 0}, {6, 6}), slab(m, matrix, f32, {0, 5}, {6, 5})});
             }),
             Contains("'model/a'") && Contains("(0, 0) and (0, 5) overlap"));
  CHECK_THAT(error_of([&] {
               st.write_slab("model/a", matrix, f32, {slab(m, matrix, f32, {0, 0}, {6, 5})});
             }),
             Contains("'model/a'") && Contains("cover 30 of its 60 elements"));
  CHECK_THAT(error_of([&] { st.write_slab("model/a", matrix, f32, {}); }),
             Contains("cover 0 of its 60"));
  CHECK_FALSE(st.has("model/a")); // nothing was stored by the refused writes

  st.write_slab("model/a", matrix, f32, {slab(m, matrix, f32, {0, 0}, matrix)});
  CHECK_THAT(error_of([&] {
               st.write_slab("model/a", matrix, f32, {slab(m, matrix, f32, {0, 0}, matrix)});
             }),
             Contains("'model/a' is written twice"));
  Tensor past = Tensor::zeros({2, 5});
  CHECK_THAT(error_of([&] {
               st.read_slab_into("model/a", {5, 0}, past);
             }),
             Contains("'model/a'") && Contains("f32(6, 10)") && Contains("offset (5, 0)") &&
                 Contains("f32(2, 5)"));
  CHECK_THAT(error_of([&] {
               st.read_slab_into("model/a", {0, -1}, past);
             }),
             Contains("offset (0, -1)"));
  CHECK_THAT(error_of([&] {
               st.read_slab_into("model/a", {0, 0, 0}, past);
             }),
             Contains("offset (0, 0, 0)"));
  Tensor bf16 = Tensor::zeros({2, 5}, DType::bf16);
  CHECK_THAT(error_of([&] {
               st.read_slab_into("model/a", {0, 0}, bf16);
             }),
             Contains("'model/a'") && Contains("bf16(2, 5)"));
  CHECK_THAT(error_of([&] {
               st.read_slab_into("model/absent", {0, 0}, past);
             }),
             Contains("model/absent"));
}

TEST_CASE("memory state: rows stay whole-tensor writes and dim-0 reads") {
  // write_rows / read_rows_into are boxes of whole rows: the old rules and messages hold.
  io::MemoryState st;
  const Tensor w = Tensor::from_doubles({1, 2, 3, 4, 5, 6}, {3, 2});
  st.write_rows("model/w", {3, 2}, DType::f32, 0, w);
  Tensor rows = Tensor::zeros({2, 2});
  st.read_rows_into("model/w", 1, rows);
  CHECK(rows.to_doubles() == std::vector<double>{3, 4, 5, 6});
  CHECK_THAT(error_of([&] {
               st.write_rows("model/v", {4, 2}, DType::f32, 1, w);
             }),
             Contains("whole tensors"));
  st.write_rows("model/s", {}, DType::f32, 0, Tensor::from_doubles({7}, {}));
  Tensor s = Tensor::zeros({});
  st.read_tensor_into("model/s", s);
  CHECK(s.item() == 7);
}

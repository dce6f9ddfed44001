// src/core/varlen.h on the CPU: the checks of VarlenLayout::of, and which layouts share the cache
// of derived device data (copies always; layouts with equal offsets while those offsets are among
// the last few made; never layouts with other offsets). The uploads themselves:
// test_varlen_gpu.cpp.
#include <catch2/catch.hpp>

#include <vector>

#include "src/core/varlen.h"
#include "tests/error_of.h"

using namespace vlm;

namespace {

Tensor cu_of(const std::vector<int32_t>& cu) {
  return Tensor::from_vector(cu, {int64_t(cu.size())});
}

} // namespace

TEST_CASE("varlen layout: offsets checked once, an i32 host copy kept", "[core]") {
  const VarlenLayout l =
      VarlenLayout::of(Tensor::from_vector(std::vector<int64_t>{0, 3, 3, 10}, {4}), 10);
  CHECK(l.docs == 3);
  CHECK(l.tokens == 10);
  CHECK(l.max_length == 7);
  CHECK(l.cu_seqlens.dtype() == DType::i32);
  CHECK(l.cu_seqlens.to_doubles() == std::vector<double>{0, 3, 3, 10});
  CHECK(testing::error_of([] {
          VarlenLayout::of(cu_of({0, 4, 2}), 2);
        }).find("cu_seqlens[2] = 2 < cu_seqlens[1] = 4") != std::string::npos);
  CHECK(testing::error_of([] {
          VarlenLayout::of(cu_of({0, 4}), 5);
        }).find("5 tokens") != std::string::npos);
  CHECK(VarlenLayout::single(6).cu_seqlens.to_doubles() == std::vector<double>{0, 6});
}

TEST_CASE("varlen layout: copies and equal offsets share the device cache, others do not",
          "[core]") {
  const std::vector<int32_t> cu = {0, 5, 9, 9, 17};
  const VarlenLayout a = VarlenLayout::of(cu_of(cu), 17);
  REQUIRE(a.device_cache);
  const VarlenLayout copy = a;
  CHECK(copy.device_cache == a.device_cache);
  // The same batch made again (a second forward): the same cache, so nothing is uploaded again.
  CHECK(VarlenLayout::of(cu_of(cu), 17).device_cache == a.device_cache);
  const VarlenLayout other = VarlenLayout::of(cu_of({0, 5, 9, 10, 17}), 17);
  CHECK(other.device_cache != a.device_cache);
  // Eight other batches later, a's offsets are no longer retained: a new layout gets a new cache
  // (a itself keeps its own).
  for (int32_t n = 1; n <= 8; n++) VarlenLayout::of(cu_of({0, n}), n);
  const VarlenLayout again = VarlenLayout::of(cu_of(cu), 17);
  CHECK(again.device_cache != a.device_cache);
  CHECK(copy.device_cache == a.device_cache);
}

TEST_CASE("varlen layout: device data is for CUDA devices and layouts made by of()", "[core]") {
  const VarlenLayout l = VarlenLayout::single(4);
  CHECK(testing::error_of([&] { l.device_offsets(Device::cpu()); }).find("CUDA devices") !=
        std::string::npos);
  const VarlenLayout unset;
  CHECK(testing::error_of([&] {
          unset.attention_tiles(Device::cuda(0), kernels::tile_spec(64, true, true));
        }).find("VarlenLayout::of") != std::string::npos);
}

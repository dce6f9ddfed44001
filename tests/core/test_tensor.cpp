#include <catch2/catch.hpp>

#include "src/core/ops.h"

using namespace vlm;

TEST_CASE("tensor: creation, views and copies keep values", "[core]") {
  Tensor t = Tensor::from_doubles({1, 2, 3, 4, 5, 6}, {2, 3});
  CHECK(t.shape() == Shape{2, 3});
  CHECK(t.is_contiguous());
  Tensor tt = transpose(t, 0, 1);
  CHECK_FALSE(tt.is_contiguous());
  CHECK(tt.shares_storage(t));
  CHECK(tt.to_doubles() == std::vector<double>{1, 4, 2, 5, 3, 6});
  Tensor s = slice(t, 1, 1, 3);
  CHECK(s.to_doubles() == std::vector<double>{2, 3, 5, 6});
  CHECK(reshape(t, {3, -1}).shape() == Shape{3, 2});
  Tensor c = concat({t, t}, 0);
  CHECK(c.shape() == Shape{4, 3});
  CHECK(c.to_doubles()[9] == 4);
  CHECK(expand(Tensor::from_doubles({7, 8}, {2, 1}), {2, 3}).to_doubles() ==
        std::vector<double>{7, 7, 7, 8, 8, 8});
}

TEST_CASE("tensor: bf16 rounds to nearest even", "[core]") {
  // 1 + 2^-8 is halfway between bf16 1.0 and 1.0078125: ties go to the even mantissa (1.0).
  CHECK(float(bf16(1.0f + 1.0f / 256)) == 1.0f);
  CHECK(float(bf16(1.0f + 3.0f / 256)) == 1.015625f);
  CHECK(std::isnan(float(bf16(std::nanf("")))));
  CHECK(float(f16(0.1f)) == Approx(0.0999755859375f));
  Tensor t = Tensor::from_doubles({1.0 + 1.0 / 256, 3.14159}, {2}, DType::bf16);
  CHECK(t.to_doubles()[0] == 1.0);
  CHECK(t.to_doubles()[1] == 3.140625);
}

TEST_CASE("tensor: allocator tracks current and peak bytes", "[core]") {
  auto& a = allocator_for(Device::cpu());
  size_t before = a.stats().current_bytes;
  a.reset_peak();
  {
    Tensor t = Tensor::empty({1024}, DType::f32);
    CHECK(a.stats().current_bytes == before + 4096);
  }
  CHECK(a.stats().current_bytes == before);
  CHECK(a.stats().peak_bytes >= before + 4096);
}

TEST_CASE("tensor: bad input throws vlm::Error naming the shapes", "[core]") {
  Tensor a = Tensor::zeros({2, 3}), b = Tensor::zeros({4, 5});
  CHECK_THROWS_WITH(matmul(a, b), Catch::Contains("f32(2, 3)") && Catch::Contains("f32(4, 5)"));
  CHECK_THROWS_WITH(add(a, b), Catch::Contains("(2, 3) and (4, 5) cannot be broadcast"));
  CHECK_THROWS_AS(reshape(a, {4, 2}), Error);
  Tensor d = Tensor::zeros({2, 3}, DType::f64);
  CHECK_THROWS_WITH(add(a, d), Catch::Contains("dtype mismatch") && Catch::Contains("f64(2, 3)"));
  CHECK_THROWS_WITH(Tensor::zeros({1}, DType::f32, Device::cuda(0)),
                    Catch::Contains("no CUDA device"));
}

TEST_CASE("device: query reports the CUDA state cleanly", "[core]") {
  std::string q = cuda_device_query();
  CHECK_FALSE(q.empty());
  if (cuda_device_count() == 0) CHECK(q.find("no CUDA device") != std::string::npos);
}

TEST_CASE("device: parse_device reads cpu, cuda, cuda:N and names bad text", "[core]") {
  CHECK(parse_device("cpu") == Device::cpu());
  CHECK(parse_device("cuda") == Device::cuda(0));
  CHECK(parse_device("cuda:3") == Device::cuda(3));
  for (const char* bad : {"gpu", "cuda:", "cuda:x", "cuda:-1", "CPU", "cuda:123456"})
    CHECK_THROWS_WITH(parse_device(bad), Catch::Contains(std::string("unknown device '") + bad));
  CHECK(device_peak_tflops(Device::cpu()) == 0.0);
  CHECK_NOTHROW(check_device_available(Device::cpu(), "training.device"));
  CHECK_THROWS_WITH(check_device_available(Device::cuda(999), "training.device"),
                    Catch::Contains("training.device = cuda:999 is not available: "));
}

TEST_CASE("tensor: empty_pinned gives host memory that copies like any CPU tensor", "[core]") {
  Tensor p = Tensor::empty_pinned({5, 7}, DType::i64);
  CHECK(p.device() == Device::cpu());
  CHECK(p.is_contiguous());
  Tensor src = Tensor::from_doubles(std::vector<double>(35, 3.0), {5, 7}, DType::i64);
  copy_(p, src);
  CHECK(p.to_doubles() == src.to_doubles());
  CHECK(Tensor::empty_pinned({0}, DType::f32).numel() == 0);
  // Without a GPU pinned memory is the plain CPU allocator; with one it is its own.
  CHECK((&pinned_host_allocator() == &allocator_for(Device::cpu())) == (cuda_device_count() == 0));
}

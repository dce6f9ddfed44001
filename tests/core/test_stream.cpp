// Streams, events, guards, dispatch and the deferred device error record where they need no GPU:
// everything is a no-op on the CPU, the per-thread current-stream table needs no CUDA call, and
// checking a device that never reported needs none either. tests/core/test_streams_gpu.cpp runs
// the CUDA side.
#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <thread>

#include "src/core/device_errors.h"
#include "src/core/dispatch.h"
#include "src/core/ops.h"
#include "src/core/stream.h"
#include "tests/error_of.h"

using namespace vlm;

TEST_CASE("streams: the CPU stream, its guard and creation are no-ops", "[core]") {
  const Stream cpu = current_stream(Device::cpu());
  CHECK(cpu == Stream());
  CHECK(cpu.device() == Device::cpu());
  CHECK(cpu.handle() == nullptr);
  CHECK(cpu.is_default());
  CHECK(Stream::create(Device::cpu()) == cpu);
  CHECK(Stream::default_stream(Device::cpu()) == cpu);
  CHECK(cpu.query());
  CHECK_NOTHROW(cpu.synchronize());
  {
    StreamGuard guard(Stream::create(Device::cpu()));
    CHECK(current_stream(Device::cpu()) == cpu);
    // CPU ops run as always under a guard.
    CHECK(add(Tensor::ones({3}), Tensor::ones({3})).to_doubles() == std::vector<double>(3, 2.0));
  }
  CHECK(current_stream(Device::cpu()) == cpu);
  CHECK_NOTHROW([] { DeviceGuard guard(Device::cpu()); }());
  CHECK_NOTHROW(synchronize_device(Device::cpu()));
}

TEST_CASE("streams: a CUDA device starts on its default stream, per thread, without CUDA calls",
          "[core]") {
  // No CUDA call happens here, so this runs on machines without a GPU or driver too.
  for (int i : {0, 3}) {
    const Stream s = current_stream(Device::cuda(i));
    CHECK(s.device() == Device::cuda(i));
    CHECK(s.is_default());
    CHECK(s.handle() == nullptr);
    CHECK(s == Stream::default_stream(Device::cuda(i)));
    CHECK_FALSE(s == Stream::default_stream(Device::cuda(i + 1)));
  }
  {
    StreamGuard guard(Stream::default_stream(Device::cuda(2)));
    CHECK(current_stream(Device::cuda(2)) == Stream::default_stream(Device::cuda(2)));
    bool other_thread_default = false;
    std::thread t([&] { other_thread_default = current_stream(Device::cuda(2)).is_default(); });
    t.join();
    CHECK(other_thread_default);
  }
  CHECK(current_stream(Device::cuda(2)).is_default());
}

TEST_CASE("events: on the CPU they hold the host time of their record", "[core]") {
  Event never;
  CHECK_FALSE(never.recorded());
  CHECK(never.query()); // never recorded: nothing to wait for
  CHECK_NOTHROW(never.synchronize());
  CHECK_THROWS_WITH(never.elapsed_ms(never), Catch::Contains("recorded"));

  Event start, end;
  start.record(Stream());
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  end.record(Device::cpu());
  CHECK(start.recorded());
  CHECK(start.device() == Device::cpu());
  CHECK(end.query());
  CHECK_NOTHROW(end.synchronize());
  const float ms = start.elapsed_ms(end);
  CHECK(ms >= 15.0f); // slept 20 ms; the clock is steady
  CHECK(ms < 10000.0f);
  // A CPU stream waiting for a CPU event has nothing to wait for.
  CHECK_NOTHROW(Stream().wait(end));

  // Moving keeps the record; the moved-from event is empty.
  Event moved(std::move(start));
  CHECK(moved.recorded());
  CHECK_FALSE(start.recorded()); // NOLINT(bugprone-use-after-move): the documented state
  CHECK(moved.elapsed_ms(end) >= 15.0f);
}

TEST_CASE("events: one event belongs to one device", "[core]") {
  // Checked before any CUDA call: recording a CPU event on a CUDA stream is refused.
  Event e;
  e.record(Stream());
  CHECK_THAT(testing::error_of([&] { e.record(Stream::default_stream(Device::cuda(0))); }),
             Catch::Contains("belongs to cpu") && Catch::Contains("cuda:0"));
}

TEST_CASE("dispatch: the CPU body gets the element type, unsupported dtypes name the op",
          "[core]") {
  auto size_of = [](DType dt) {
    return dispatch(
        "probe", Device::cpu(), dt, [](auto t) { return sizeof(t); },
        [](auto t, void*) { return sizeof(t); });
  };
  CHECK(size_of(DType::f32) == 4);
  CHECK(size_of(DType::f64) == 8);
  CHECK(size_of(DType::bf16) == 2);
  CHECK_THAT(testing::error_of([&] { size_of(DType::i32); }),
             Catch::Contains("probe") && Catch::Contains("i32"));
  int ran = 0;
  dispatch_device(
      "probe", Device::cpu(), [&] { ran = 1; }, [&](auto) { ran = 2; });
  CHECK(ran == 1);
#if !VLM_WITH_CUDA
  CHECK_THAT(testing::error_of([&] {
               dispatch(
                   "probe", Device::cuda(0), DType::f32, [](auto) {}, [](auto, void*) {});
             }),
             Catch::Contains("no CUDA backend"));
  CHECK_THAT(testing::error_of([&] {
               dispatch_device(
                   "probe", Device::cuda(0), [] {}, [](auto) {});
             }),
             Catch::Contains("no CUDA backend"));
#endif
}

TEST_CASE("device errors: nothing to report on the CPU or on a device that never reported",
          "[core]") {
  const int32_t a = register_device_check([](int64_t, int64_t) { return std::string("a"); });
  const int32_t b = register_device_check([](int64_t, int64_t) { return std::string("b"); });
  CHECK(a > 0);
  CHECK(b != a);
  CHECK_NOTHROW(check_device_errors(Device::cpu()));
  // No kernel of cuda:0 has asked for the record in this process: no CUDA call is made.
  CHECK_NOTHROW(check_device_errors(Device::cuda(0)));
}

TEST_CASE("cross_entropy_sum: the valid count is a 0-dim i64 tensor on the logits' device",
          "[core]") {
  Tensor logits = Tensor::zeros({4, 3});
  Tensor labels = Tensor::from_vector(std::vector<int64_t>{0, -100, 2, 1}, {4});
  CrossEntropyResult r = cross_entropy_sum(logits, labels);
  CHECK(r.num_valid.dtype() == DType::i64);
  CHECK(r.num_valid.dim() == 0);
  CHECK(r.num_valid.device() == Device::cpu());
  CHECK(r.num_valid.item() == 3);
  CHECK(r.loss_sum.item() == Approx(3 * std::log(3.0)));
}

// Streams, events and guards on CUDA; the deferred device error record; the on-device
// cross-entropy reduction and the absence of host synchronizations in a training step's ops
// (proved by capturing them into a CUDA graph, where any synchronization fails the capture).
// Tolerances: the on-device cross-entropy sum is compared with the CPU op at 1e-5 relative (fp32
// row losses of identical inputs, summed in double in another order). Right under both VLM_SYNC
// settings: without it a bad index is reported at the next host read; with VLM_SYNC=1 the op
// that launched the check throws it (its output is lost), and the graph capture, which no
// synchronization may enter, runs its ops uncaptured (ctest runs this file both ways:
// tools/gpu/gpu_check.sh). Skips (exit 77) with the device query text when there is no CUDA
// device.
#include <catch2/catch.hpp>

#include <cmath>
#include <thread>
#include <vector>

#include "kernels/gpu_runtime.h"
#include "src/core/device_errors.h"
#include "src/core/ops.h"
#include "src/core/stream.h"
#include "tests/error_of.h"
#include "tests/gpu_testing.h"
#include "tests/gradcheck.h"
#include "tests/skip.h"

using namespace vlm;

using vlm::testing::gpu;
using vlm::testing::kGpu;
using vlm::testing::rel_err;
using vlm::testing::require_device;
using vlm::testing::syncing;

namespace {

// Ends a capture begun in its scope even when the body throws (the capture is then discarded).
struct Capture {
  void* stream;
  bool ended = false;
  explicit Capture(const Stream& s) : stream(s.handle()) {
    kernels::cuda::stream_begin_capture(stream);
  }
  int64_t end() {
    ended = true;
    return kernels::cuda::stream_end_capture(stream);
  }
  ~Capture() {
    if (ended) return;
    try {
      kernels::cuda::stream_end_capture(stream);
    } catch (const Error&) {
    }
  }
};

} // namespace

TEST_CASE("gpu streams: ops run on the current stream, guards nest and restore", "[gpu]") {
  require_device();
  Rng rng(1);
  Tensor x = gpu(Tensor::randn({1000}, rng));
  const std::vector<double> want = add(x, x).to_doubles();
  Stream s = Stream::create(kGpu);
  Stream t = Stream::create(kGpu);
  CHECK_FALSE(s.is_default());
  CHECK(s.device() == kGpu);
  CHECK_FALSE(s == t);
  // x was made on the default stream: the created stream waits for it before using it.
  Event x_ready;
  x_ready.record(kGpu);
  {
    StreamGuard on_s(s);
    CHECK(current_stream(kGpu) == s);
    s.wait(x_ready);
    Tensor y = add(x, x); // allocated, computed and (at the end of the scope) freed on s
    {
      StreamGuard on_t(t);
      CHECK(current_stream(kGpu) == t);
    }
    CHECK(current_stream(kGpu) == s);
    bool other_thread_default = false;
    std::thread other([&] { other_thread_default = current_stream(kGpu).is_default(); });
    other.join();
    CHECK(other_thread_default);
    CHECK(y.to_doubles() == want); // the read synchronizes s
    s.synchronize();
    CHECK(s.query());
  }
  CHECK(current_stream(kGpu).is_default());
}

TEST_CASE("gpu streams: events order two streams and time work", "[gpu]") {
  require_device();
  Stream producer = Stream::create(kGpu), consumer = Stream::create(kGpu);
  Tensor big;
  Event made(true), done(true);
  {
    StreamGuard on(producer);
    big = Tensor::full({1 << 22}, 2.0, DType::f32, kGpu);
    made.record(producer);
  }
  Tensor sum_value;
  {
    StreamGuard on(consumer);
    consumer.wait(made);
    sum_value = sum(big);
    done.record(consumer);
  }
  done.synchronize();
  CHECK(done.query());
  // The consumer's sum of 16 MiB lies between the two events: some microseconds, far below a
  // second (a wrong event pair or unit gives 0, a negative value or a huge one).
  const float ms = made.elapsed_ms(done);
  INFO("elapsed " << ms << " ms");
  CHECK(ms > 0.0f);
  CHECK(ms < 1000.0f);
  {
    StreamGuard on(consumer);
    CHECK(sum_value.item() == double(1 << 23));
  }
  // `big` was allocated on the producer: its free there must wait for the consumer's read.
  Event read;
  read.record(consumer);
  producer.wait(read);
  big = Tensor(); // freed on the producer, whatever the current stream
  // An event records on one device only.
  Event cpu_event;
  cpu_event.record(Stream());
  CHECK_THROWS_WITH(cpu_event.record(producer), Catch::Contains("belongs to cpu"));
}

TEST_CASE("gpu streams: a destroyed stream releases its cuBLASLt workspace", "[gpu]") {
  require_device();
  Rng rng(2);
  Tensor a = gpu(Tensor::randn({64, 48}, rng)), b = gpu(Tensor::randn({48, 32}, rng));
  const Tensor want = matmul(a, b).to(Device::cpu());
  for (int i = 0; i < 3; i++) { // a new stream may reuse the old one's address
    Stream s = Stream::create(kGpu);
    StreamGuard on(s);
    Event inputs;
    inputs.record(Stream::default_stream(kGpu));
    s.wait(inputs);
    CHECK(rel_err(matmul(a, b), want) == 0.0); // the same cuBLASLt plan: bit-identical
  } // the guard restores, then the last handle goes: gemm_release_stream, then the stream
}

TEST_CASE("gpu DeviceGuard: restores the current device, allocation and ops keep it", "[gpu]") {
  require_device();
  const int n = cuda_device_count();
  kernels::cuda::set_device(0);
  {
    DeviceGuard g(Device::cuda(n - 1));
    CHECK(kernels::cuda::current_device() == n - 1);
    {
      DeviceGuard inner(Device::cpu()); // no-op
      CHECK(kernels::cuda::current_device() == n - 1);
    }
  }
  CHECK(kernels::cuda::current_device() == 0);
  if (n < 2) return; // the rest needs two devices
  kernels::cuda::set_device(1);
  Tensor x = Tensor::full({256}, 3.0, DType::f32, Device::cuda(0));
  CHECK(kernels::cuda::current_device() == 1); // allocation and the fill kernel used a guard
  Tensor y = mul(x, x);
  CHECK(kernels::cuda::current_device() == 1);
  CHECK(y.device() == Device::cuda(0));
  CHECK(y.to_doubles() == std::vector<double>(256, 9.0));
  Tensor z = y.to(Device::cuda(1)); // device to device, ordered by events both ways
  CHECK(z.to_doubles() == std::vector<double>(256, 9.0));
  x = y = Tensor();
  CHECK(kernels::cuda::current_device() == 1); // the frees too
  kernels::cuda::set_device(0);
}

TEST_CASE("gpu device errors: a bad embedding id or index is reported at the next host read",
          "[gpu]") {
  require_device();
  Tensor w = gpu(Tensor::ones({10, 4}));
  Tensor ids = gpu(Tensor::from_vector(std::vector<int64_t>{1, 2, 10, 3}, {2, 2}));
  Tensor out;
  std::string msg;
  if (syncing()) { // VLM_SYNC=1: the op synchronizes and throws itself
    msg = testing::error_of([&] { out = embedding(w, ids); });
    CHECK_FALSE(out.defined());
  } else {
    REQUIRE_NOTHROW(out = embedding(w, ids)); // no synchronization: nothing is known yet
    msg = testing::error_of([&] { out.to(Device::cpu()); });
  }
  CHECK_THAT(msg, Catch::Contains("embedding") && Catch::Contains("(1, 0)") &&
                      Catch::Contains("is 10") && Catch::Contains("[0, 10)") &&
                      Catch::Contains("deferred"));
  if (!syncing()) {
    // Reported once; the bad row was zero-filled, the others gathered.
    std::vector<double> v;
    REQUIRE_NOTHROW(v = out.to_doubles());
    CHECK(v == std::vector<double>{1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1});
  }
  CHECK_NOTHROW(synchronize_device(kGpu)); // reported once, either way

  Tensor neg = gpu(Tensor::from_vector(std::vector<int32_t>{0, -1}, {2}));
  CHECK_THAT(testing::error_of([&] {
               Tensor sel = index_select(w, 0, neg);
               current_stream(kGpu).synchronize();
             }),
             Catch::Contains("index_select") && Catch::Contains("-1"));
  auto bad_lookup = [&](int64_t id) {
    embedding(w, gpu(Tensor::from_vector(std::vector<int64_t>{id}, {1})));
  };
  if (syncing()) { // each op reports its own failure at once
    CHECK_THAT(testing::error_of([&] { bad_lookup(11); }), Catch::Contains("is 11"));
    CHECK_THAT(testing::error_of([&] { bad_lookup(12); }), Catch::Contains("is 12"));
  } else { // the first failure wins until it is reported
    bad_lookup(11);
    bad_lookup(12);
    CHECK_THAT(testing::error_of([&] { synchronize_device(kGpu); }), Catch::Contains("is 11"));
  }
  CHECK_NOTHROW(synchronize_device(kGpu));
}

TEST_CASE("gpu device errors: a bad label is reported at the next host read", "[gpu]") {
  require_device();
  Rng rng(3);
  Tensor logits = gpu(Tensor::randn({4, 9}, rng));
  Tensor bad = gpu(Tensor::from_vector(std::vector<int64_t>{1, 9, 2, -100}, {4}));
  Tensor loss;
  std::string msg;
  if (syncing()) { // VLM_SYNC=1: the op synchronizes and throws itself
    msg = testing::error_of([&] { loss = cross_entropy(logits, bad); });
  } else {
    REQUIRE_NOTHROW(loss = cross_entropy(logits, bad));
    msg = testing::error_of([&] { loss.item(); });
  }
  CHECK_THAT(msg, Catch::Contains("cross_entropy") && Catch::Contains("label 9 at row 1") &&
                      Catch::Contains("[0, 9)"));
  if (!syncing()) {
    // The bad row was left out: the mean over rows 0 and 2.
    Tensor good = Tensor::from_vector(std::vector<int64_t>{1, -100, 2, -100}, {4});
    CHECK(std::abs(loss.item() - cross_entropy(logits.to(Device::cpu()), good).item()) <= 1e-5);
  }

  Tensor x = gpu(Tensor::randn({3, 8}, rng)), head = gpu(Tensor::randn({5, 8}, rng));
  Tensor far = gpu(Tensor::from_vector(std::vector<int32_t>{0, 4, 70000}, {3}));
  CHECK_THAT(testing::error_of([&] {
               Tensor lce = linear_cross_entropy(x, head, far, -100, Reduction::sum, 2);
               lce.to_doubles();
             }),
             Catch::Contains("linear_cross_entropy") && Catch::Contains("label 70000 at row 2"));
  CHECK_NOTHROW(synchronize_device(kGpu)); // reported once
}

TEST_CASE("gpu cross_entropy: count, mean and sum are reduced on the device", "[gpu]") {
  require_device();
  Rng rng(4);
  for (Reduction red : {Reduction::mean, Reduction::sum}) {
    Tensor logits = Tensor::randn({300, 77}, rng, DType::f32, 2.0);
    std::vector<int64_t> l(300);
    for (size_t r = 0; r < l.size(); r++) l[r] = r % 4 == 1 ? -100 : rng.randint(0, 77);
    Tensor labels = Tensor::from_vector(l, {300});
    CrossEntropyResult want = cross_entropy_sum(logits, labels);
    CrossEntropyResult got = cross_entropy_sum(gpu(logits), gpu(labels));
    CHECK(got.num_valid.device() == kGpu);
    CHECK(got.num_valid.item() == want.num_valid.item());
    CHECK(std::abs(got.loss_sum.item() - want.loss_sum.item()) <=
          1e-5 * std::abs(want.loss_sum.item()));
    Tensor x = Tensor::randn({300, 16}, rng), w = Tensor::randn({77, 16}, rng);
    const double c = linear_cross_entropy(x, w, labels, -100, red, 20).item();
    const double g = linear_cross_entropy(gpu(x), gpu(w), gpu(labels), -100, red, 20).item();
    CHECK(std::abs(g - c) <= 1e-5 * std::abs(c));
  }
  // No rows at all: 0, with nothing counted.
  CrossEntropyResult empty =
      cross_entropy_sum(gpu(Tensor::zeros({0, 5})), gpu(Tensor::zeros({0}, DType::i64)));
  CHECK(empty.loss_sum.item() == 0.0);
  CHECK(empty.num_valid.item() == 0);
  CHECK(cross_entropy(gpu(Tensor::zeros({0, 5})), gpu(Tensor::zeros({0}, DType::i64))).item() ==
        0.0);
}

TEST_CASE("gpu no host sync: embedding, cross-entropy forward and backward capture as a graph",
          "[gpu]") {
  require_device();
  Rng rng(5);
  Tensor w = gpu(Tensor::randn({50, 16}, rng));
  Tensor ids = gpu(Tensor::from_vector(std::vector<int64_t>{3, 1, 4, 1, 5, 9}, {6}));
  Tensor labels = gpu(Tensor::from_vector(std::vector<int64_t>{2, 7, -100, 1, 8, 2}, {6}));
  Tensor head = testing::leaf(gpu(Tensor::randn({50, 16}, rng)));
  Stream s = Stream::create(kGpu);
  StreamGuard on(s);
  Event inputs;
  inputs.record(Stream::default_stream(kGpu));
  s.wait(inputs);
  auto step = [&] {
    Tensor h = embedding(w, ids);
    Tensor logits = linear(h, head);
    Tensor loss = add(cross_entropy(logits, labels), linear_cross_entropy(h, head, labels));
    loss.backward();
    head.zero_grad(); // the gradient is freed inside the capture too
  };
  step(); // warm-up outside the capture: cuBLASLt handle and plans, error record, pools
  s.synchronize();
  if (syncing()) {
    // VLM_SYNC=1 synchronizes the device after every launch (kernels/cuda/runtime.cu), which is
    // illegal inside a capture: the ops run uncaptured here, and the capture itself is proved by
    // the run without VLM_SYNC (tools/gpu/gpu_check.sh runs both).
    REQUIRE_NOTHROW(step());
    s.synchronize();
    return;
  }
  Capture capture(s);
  step();
  CHECK(capture.end() > 0);
}

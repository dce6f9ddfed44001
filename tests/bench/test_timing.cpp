// The benchmarks' timing (bench/timing.h): how many runs, which are timed, the median, the order of
// interleaved sides, and the slowest rank's time under several ranks (a stand-in group whose peer
// took longer).
#include "bench/timing.h"

#include <catch2/catch.hpp>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "parallel/comm/local_group.h"
#include "parallel/comm/process_group.h"
#include "src/core/tensor.h"

using namespace vlm;
using namespace std::chrono_literals;

namespace {

// Rank 0 of two whose peer's runs took `peer_seconds`: a max-reduction of one f64 returns the
// larger of the two; barriers are counted.
class SlowPeerGroup final : public parallel::ProcessGroup {
public:
  explicit SlowPeerGroup(double peer_seconds) : peer_(peer_seconds) {}
  int rank() const override { return 0; }
  int size() const override { return 2; }
  std::string name() const override { return "slow peer"; }
  std::unique_ptr<parallel::Work> all_reduce_async(const Tensor& t,
                                                   parallel::ReduceOp op) override {
    REQUIRE(op == parallel::ReduceOp::max);
    REQUIRE(t.dtype() == DType::f64);
    REQUIRE(t.numel() == 1);
    double* v = t.data<double>();
    v[0] = std::max(v[0], peer_);
    return local_.all_reduce_async(t, op); // completed already
  }
  std::unique_ptr<parallel::Work> all_gather_async(const Tensor& out, const Tensor& in) override {
    return local_.all_gather_async(out, in);
  }
  std::unique_ptr<parallel::Work> reduce_scatter_async(const Tensor& out, const Tensor& in,
                                                       parallel::ReduceOp op) override {
    return local_.reduce_scatter_async(out, in, op);
  }
  void all_reduce(const Tensor& t, parallel::ReduceOp op) override {
    all_reduce_async(t, op)->wait();
  }
  void all_gather(const Tensor& out, const Tensor& in) override { local_.all_gather(out, in); }
  void reduce_scatter(const Tensor& out, const Tensor& in, parallel::ReduceOp op) override {
    local_.reduce_scatter(out, in, op);
  }
  void broadcast(const Tensor&, int) override {}
  void barrier() override { barriers++; }
  std::unique_ptr<parallel::ProcessGroup> split(int, int, const std::string&) const override {
    FAIL("not split in these tests");
    return nullptr;
  }
  int barriers = 0;

private:
  double peer_;
  parallel::LocalProcessGroup local_{0, 1};
};

} // namespace

TEST_CASE("bench timing: the median of odd and even counts") {
  CHECK(bench::median({3.0, 1.0, 2.0}) == 2.0);
  CHECK(bench::median({4.0, 1.0, 3.0, 2.0}) == 2.5);
  CHECK(bench::median({7.0}) == 7.0);
  CHECK_THROWS_WITH(bench::median({}), Catch::Contains("no timings"));
}

TEST_CASE("bench timing: warm-up runs untimed, then the timed runs, each its own duration") {
  int calls = 0;
  const std::vector<double> s = bench::Timer().runs({2, 3}, [&] {
    calls++;
    std::this_thread::sleep_for(calls == 3 ? 60ms : 10ms); // the first timed run is the slow one
  });
  CHECK(calls == 5);
  REQUIRE(s.size() == 3);
  CHECK(s[0] >= 0.060);
  CHECK(s[1] >= 0.010);
  CHECK(s[1] < 0.060); // generous: a loaded machine may stretch a 10 ms sleep
  CHECK(bench::Timer().median_seconds({0, 1}, [] { std::this_thread::sleep_for(20ms); }) >= 0.020);
}

TEST_CASE("bench timing: two sides alternate run by run, warm-ups included, each its median") {
  std::string order;
  const auto [a, b] = bench::Timer().interleaved(
      {1, 3},
      [&] {
        order += "a";
        std::this_thread::sleep_for(order.size() == 3 ? 200ms : 30ms); // a's first timed run
      },
      [&] { order += "b"; });
  CHECK(order == "abababab");
  CHECK(a >= 0.030);
  CHECK(a < 0.200); // the median of 200, 30, 30 ms
  CHECK(b < 0.030);
}

TEST_CASE("bench timing: over several ranks a run starts at a barrier and takes the slowest rank's "
          "time") {
  SlowPeerGroup ranks(0.25);
  const bench::Timer timer(Device::cpu(), &ranks);
  const std::vector<double> s = timer.runs({1, 2}, [] { std::this_thread::sleep_for(5ms); });
  CHECK(ranks.barriers == 3);
  REQUIRE(s.size() == 2);
  CHECK(s[0] == 0.25);
  CHECK(s[1] == 0.25);
  // A peer faster than this rank: this rank's own time.
  SlowPeerGroup fast(0.0);
  CHECK(bench::Timer(Device::cpu(), &fast).seconds([] { std::this_thread::sleep_for(20ms); }) >=
        0.020);
}

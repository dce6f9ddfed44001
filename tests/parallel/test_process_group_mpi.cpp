// ProcessGroup over MPI on CPU tensors, run under `mpirun -np 1 | 2 | 4`: every collective against
// the values each rank can compute by itself, sub-groups from split, and the errors raised
// before any communication (every rank raises them alike, so nothing hangs).
#include <catch2/catch.hpp>

#include <vector>

#include "parallel/comm/process_group.h"
#include "src/core/tensor.h"

using namespace vlm;
using namespace vlm::parallel;
using Catch::Matchers::Contains;

namespace {

// Rank r's value at flat index i of the tests' inputs.
double value(int r, int64_t i) { return double(r + 1) * 0.5 + double(i); }

Tensor filled(const Shape& shape, DType dtype, int r) {
  std::vector<double> v(size_t(vlm::numel(shape)));
  for (size_t i = 0; i < v.size(); i++) v[i] = value(r, int64_t(i));
  return Tensor::from_vector(v, shape).to(dtype);
}

} // namespace

TEST_CASE("process group: all_reduce sum, avg and max in f32, f64 and i64") {
  auto g = world_group();
  const int n = g->size(), r = g->rank();
  for (DType dtype : {DType::f32, DType::f64}) {
    Tensor sum = filled({3, 5}, dtype, r), avg = filled({3, 5}, dtype, r),
           max = filled({3, 5}, dtype, r);
    g->all_reduce(sum, ReduceOp::sum);
    g->all_reduce(avg, ReduceOp::avg);
    g->all_reduce(max, ReduceOp::max);
    const std::vector<double> s = sum.to_doubles(), a = avg.to_doubles(), m = max.to_doubles();
    for (int64_t i = 0; i < 15; i++) {
      double want = 0;
      for (int k = 0; k < n; k++) want += value(k, i);
      CHECK(s[size_t(i)] == Approx(want).epsilon(1e-6));
      CHECK(a[size_t(i)] == Approx(want / n).epsilon(1e-6));
      CHECK(m[size_t(i)] == value(n - 1, i));
    }
  }
  Tensor counts = Tensor::from_vector(std::vector<int64_t>{int64_t(r), 7, int64_t(1) << 40}, {3});
  g->all_reduce(counts);
  CHECK(counts.to_doubles() == std::vector<double>{double(n * (n - 1) / 2), 7.0 * n,
                                                   double(n) * double(int64_t(1) << 40)});
}

TEST_CASE("process group: all_gather stacks the ranks' tensors in rank order, any dtype") {
  auto g = world_group();
  const int n = g->size(), r = g->rank();
  for (DType dtype : {DType::f32, DType::bf16, DType::i32}) {
    const Tensor in = filled({2, 3}, dtype, r);
    const Tensor out = Tensor::zeros({2 * n, 3}, dtype);
    g->all_gather(out, in);
    const std::vector<double> got = out.to_doubles();
    for (int k = 0; k < n; k++)
      CHECK(std::vector<double>(got.begin() + 6 * k, got.begin() + 6 * (k + 1)) ==
            filled({2, 3}, dtype, k).to_doubles());
  }
}

TEST_CASE("process group: reduce_scatter gives each rank its block of the sum") {
  auto g = world_group();
  const int n = g->size(), r = g->rank();
  const Tensor in = filled({2 * n, 4}, DType::f32, r);
  const Tensor out = Tensor::zeros({2, 4}, DType::f32);
  g->reduce_scatter(out, in);
  const std::vector<double> got = out.to_doubles();
  for (int64_t i = 0; i < 8; i++) {
    double want = 0;
    for (int k = 0; k < n; k++) want += value(k, int64_t(r) * 8 + i);
    CHECK(got[size_t(i)] == Approx(want).epsilon(1e-6));
  }
}

TEST_CASE("process group: broadcast, barrier and split into sub-groups") {
  auto g = world_group();
  const int n = g->size(), r = g->rank();
  const Tensor t = filled({4}, DType::bf16, r);
  g->broadcast(t, n - 1);
  CHECK(t.to_doubles() == filled({4}, DType::bf16, n - 1).to_doubles());
  g->barrier();
  // Even and odd ranks, each ordered by descending world rank.
  auto sub = g->split(r % 2, -r);
  CHECK(sub->size() == (n + (r % 2 == 0 ? 1 : 0)) / 2);
  int rank_in_sub = 0;
  for (int k = r + 2; k < n; k += 2) rank_in_sub++;
  CHECK(sub->rank() == rank_in_sub);
  Tensor x = Tensor::from_vector(std::vector<double>{double(r)}, {1});
  sub->all_reduce(x);
  double want = 0;
  for (int k = r % 2; k < n; k += 2) want += k;
  CHECK(x.item() == want);
}

TEST_CASE("process group: gather gives the root every rank's tensor of its own length, in rank "
          "order, as the base class's way (by all_gather) does") {
  auto g = world_group();
  const int n = g->size(), r = g->rank();
  for (DType dtype : {DType::f32, DType::bf16, DType::i64}) {
    for (int root : {0, n - 1}) {
      // Rank k sends k + 1 elements (rank 0 of two roots sends none the second time).
      const int64_t mine = root == 0 ? r + 1 : r;
      const Tensor in = filled({mine}, dtype, r);
      std::vector<int64_t> counts{-1}, base_counts{-1};
      const Tensor got = g->gather(in, root, &counts);
      const Tensor base = g->ProcessGroup::gather(in, root, &base_counts);
      if (r != root) {
        CHECK_FALSE(got.defined());
        CHECK_FALSE(base.defined());
        CHECK(counts == std::vector<int64_t>{-1}); // as it was
        continue;
      }
      std::vector<double> want;
      std::vector<int64_t> want_counts;
      for (int k = 0; k < n; k++) {
        const int64_t len = root == 0 ? k + 1 : k;
        const std::vector<double> v = filled({len}, dtype, k).to_doubles();
        want.insert(want.end(), v.begin(), v.end());
        want_counts.push_back(len);
      }
      CHECK(got.dtype() == dtype);
      CHECK(got.to_doubles() == want);
      CHECK(counts == want_counts);
      CHECK(base.to_doubles() == want);
      CHECK(base_counts == want_counts);
    }
  }
}

TEST_CASE("process group: bad tensors are refused before any communication") {
  auto g = world_group();
  const int n = g->size();
  CHECK_THROWS_WITH(g->all_gather(Tensor::zeros({3}, DType::f32), Tensor::zeros({2}, DType::f32)),
                    Contains("all_gather") && Contains("f32(3)"));
  CHECK_THROWS_WITH(
      g->reduce_scatter(Tensor::zeros({1}, DType::f32), Tensor::zeros({n + 1}, DType::f32)),
      Contains("reduce_scatter"));
  CHECK_THROWS_WITH(g->all_reduce(Tensor::zeros({2}, DType::u8)),
                    Contains("u8") && Contains("not supported"));
  CHECK_THROWS_WITH(g->all_reduce(Tensor::zeros({2}, DType::i64), ReduceOp::avg),
                    Contains("avg of an integer"));
  CHECK_THROWS_WITH(g->all_reduce(Tensor::zeros({2, 3}, DType::f32).as_strided({3, 2}, {1, 3}, 0)),
                    Contains("contiguous"));
  CHECK_THROWS_WITH(g->broadcast(Tensor::zeros({1}, DType::f32), n), Contains("root"));
  CHECK_THROWS_WITH(g->gather(Tensor::zeros({1}, DType::f32), n), Contains("root"));
}

TEST_CASE("process group: bf16 sums and max through MPI, partial sums rounded to bf16") {
  auto g = world_group();
  const int n = g->size(), r = g->rank();
  // Values exact in bf16 (multiples of 0.5 below 64), so every partial sum is exact too.
  Tensor sum = filled({3, 4}, DType::bf16, r), max = filled({3, 4}, DType::bf16, r);
  g->all_reduce(sum);
  g->all_reduce(max, ReduceOp::max);
  const std::vector<double> s = sum.to_doubles(), m = max.to_doubles();
  for (int64_t i = 0; i < 12; i++) {
    double want = 0;
    for (int k = 0; k < n; k++) want += value(k, i);
    CHECK(s[size_t(i)] == want);
    CHECK(m[size_t(i)] == value(n - 1, i));
  }
  const Tensor in = filled({2 * n, 2}, DType::bf16, r), out = Tensor::zeros({2, 2}, DType::bf16);
  g->reduce_scatter(out, in, ReduceOp::avg);
  const std::vector<double> got = out.to_doubles();
  for (int64_t i = 0; i < 4; i++) {
    double want = 0;
    for (int k = 0; k < n; k++) want += value(k, int64_t(r) * 4 + i);
    CHECK(got[size_t(i)] == double(float(bf16(float(want / n)))));
  }
}

TEST_CASE("process group: async collectives give the blocking results after wait()") {
  auto g = world_group();
  const int n = g->size(), r = g->rank();
  const Tensor in = filled({3, 2}, DType::f32, r), gathered = Tensor::zeros({3 * n, 2});
  const Tensor big = filled({2 * n, 3}, DType::f32, r), scattered = Tensor::zeros({2, 3});
  Tensor summed = filled({5}, DType::f64, r);
  // Three collectives in flight at once, waited in another order than started.
  auto w1 = g->all_gather_async(gathered, in);
  auto w2 = g->reduce_scatter_async(scattered, big);
  auto w3 = g->all_reduce_async(summed, ReduceOp::avg);
  w3->wait();
  w1->wait();
  w2->wait();
  w2->wait(); // twice is a no-op
  Tensor gathered_ref = Tensor::zeros({3 * n, 2}), scattered_ref = Tensor::zeros({2, 3});
  Tensor summed_ref = filled({5}, DType::f64, r);
  g->all_gather(gathered_ref, in);
  g->reduce_scatter(scattered_ref, big);
  g->all_reduce(summed_ref, ReduceOp::avg);
  CHECK(gathered.to_doubles() == gathered_ref.to_doubles());
  CHECK(scattered.to_doubles() == scattered_ref.to_doubles());
  CHECK(summed.to_doubles() == summed_ref.to_doubles());
  CHECK(g->all_reduce_value(int64_t(r + 1)) == int64_t(n) * (n + 1) / 2);
  CHECK(g->all_reduce_value(double(r), ReduceOp::max) == double(n - 1));
}

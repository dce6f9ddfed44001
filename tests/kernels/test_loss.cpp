// kernels/loss.h (cpu::check_labels, cross_entropy_fwd, lce_chunk_fwd, lce_finish, lce_chunk_bwd)
// on raw buffers against plain double-precision loops: logsumexp, -log softmax at the label, and
// the gradient softmax - onehot, written here.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/loss.h"
#include "src/base/rng.h"
#include "tests/kernels/kernel_reference.h"

using namespace vlm;
using namespace vlm::kernels;
using vlm::testing::check_close;
using vlm::testing::random_vector;
using vlm::testing::widen_all;

namespace {

constexpr int64_t kIgnore = -100;
constexpr double kInf = std::numeric_limits<double>::infinity();

double logsumexp(const double* x, int64_t n) {
  double mx = -kInf;
  for (int64_t c = 0; c < n; c++) mx = std::max(mx, x[c]);
  if (mx == -kInf) return mx;
  double s = 0;
  for (int64_t c = 0; c < n; c++) s += std::exp(x[c] - mx);
  return mx + std::log(s);
}

// Labels for `rows` rows: every third row ignored, the others spread over [0, vocab), the last
// valid row's label the last class.
template <typename I> std::vector<I> make_labels(Rng& rng, int64_t rows, int64_t vocab) {
  std::vector<I> l;
  for (int64_t r = 0; r < rows; r++)
    l.push_back(I(r % 3 == 1 ? kIgnore : (r == rows - 1 ? vocab - 1 : rng.randint(0, vocab))));
  return l;
}

// Tolerances, float32 kernel against double. lse = max + log(sum exp(x - max)): the sum of up to
// ~1000 terms in [0, 1] and the fast exp (2e-7 relative) give ~1e-6 relative on the log's
// argument, so ~1e-6 absolute on lse, plus the rounding of max + log (~1e-7 * |lse|). The loss
// lse - x[label] adds one more rounding. Gradients (values in [-1, 1]): ~1e-6 absolute.
double f32_atol(const std::vector<double>& x) {
  double m = 0;
  for (double v : x) m = std::max(m, std::abs(v));
  return 2e-6 * (1 + m);
}

template <typename T, typename I>
void check_cross_entropy(int64_t rows, int64_t vocab, double off) {
  using A = acc_t<T>;
  INFO("rows " << rows << " vocab " << vocab << " offset " << off);
  Rng rng(uint64_t(rows * 100 + vocab));
  auto logits = random_vector<T>(rng, rows * vocab, off - 4, off + 4);
  auto labels = make_labels<I>(rng, rows, vocab);
  const auto x = widen_all(logits);

  int64_t num_valid = -1;
  REQUIRE(cpu::check_labels(labels.data(), rows, vocab, kIgnore, &num_valid) == -1);
  int64_t expect_valid = 0;
  for (I l : labels) expect_valid += int64_t(l) != kIgnore;
  CHECK(num_valid == expect_valid);

  std::vector<A> loss(rows), lse(rows);
  cpu::cross_entropy_fwd<T, I>(loss.data(), lse.data(), logits.data(), labels.data(), rows, vocab,
                               kIgnore);
  std::vector<double> lse_ref(rows), loss_ref(rows);
  for (int64_t r = 0; r < rows; r++) {
    lse_ref[r] = logsumexp(x.data() + r * vocab, vocab);
    const int64_t l = int64_t(labels[r]);
    loss_ref[r] = l == kIgnore ? 0.0 : lse_ref[r] - x[r * vocab + l];
  }
  const double atol = std::is_same_v<T, double> ? 1e-12 * (1 + std::abs(off)) : f32_atol(x);
  check_close(lse, lse_ref, 0, atol, "lse");
  check_close(loss, loss_ref, 0, atol, "row_loss");
  for (int64_t r = 0; r < rows; r++)
    if (int64_t(labels[r]) == kIgnore) CHECK(loss[r] == 0);

  // Gradient of the whole row (chunk = vocab, v0 = 0) for upstream 0.75, mean over valid rows,
  // from the reference lse (rounded to A): independent of the kernel's forward.
  std::vector<A> lse_in(lse_ref.begin(), lse_ref.end());
  const A grad_loss = A(0.75);
  const double scale = 1.0 / double(expect_valid);
  std::vector<T> dl(size_t(rows * vocab));
  cpu::lce_chunk_bwd<T, I>(dl.data(), logits.data(), lse_in.data(), labels.data(), &grad_loss,
                           &scale, rows, vocab, 0, kIgnore);
  std::vector<double> dl_ref(dl.size(), 0.0);
  for (int64_t r = 0; r < rows; r++) {
    const int64_t l = int64_t(labels[r]);
    if (l == kIgnore) continue;
    for (int64_t c = 0; c < vocab; c++)
      dl_ref[r * vocab + c] =
          (std::exp(x[r * vocab + c] - lse_ref[r]) - (c == l ? 1.0 : 0.0)) * 0.75 * scale;
  }
  // exp(x - lse) carries lse's absolute error as a relative one; softmax values are <= 1.
  check_close(dl, dl_ref, std::is_same_v<T, double> ? 1e-12 : atol, 1e-7 * scale, "dlogits");
}

} // namespace

TEST_CASE("loss kernel: check_labels finds the first bad label and counts valid rows", "[loss]") {
  const std::vector<int64_t> l64 = {3, kIgnore, 0, 4, 5, -1, kIgnore};
  int64_t valid = -1;
  CHECK(cpu::check_labels(l64.data(), 7, 5, kIgnore, &valid) == 4); // 5 >= vocab 5
  CHECK(valid == 3);                                                // 3, 0, 4
  const std::vector<int32_t> l32 = {kIgnore, 2, 1};
  CHECK(cpu::check_labels(l32.data(), 3, 3, kIgnore, &valid) == -1);
  CHECK(valid == 2);
  CHECK(cpu::check_labels(l32.data(), 0, 3, kIgnore, &valid) == -1);
  CHECK(valid == 0);
}

TEST_CASE("loss kernel: cross_entropy_fwd and full-row lce_chunk_bwd against a double loop",
          "[loss]") {
  // (rows, vocab): one class; one row; odd vocabularies around the 16 reduction lanes; a long
  // row. The offset of 50 checks max-subtraction (exp(54) would lose float digits otherwise).
  for (double off : {0.0, 50.0})
    for (auto [rows, vocab] :
         std::vector<std::pair<int64_t, int64_t>>{{4, 1}, {1, 17}, {5, 15}, {7, 33}, {3, 1001}}) {
      check_cross_entropy<float, int64_t>(rows, vocab, off);
      check_cross_entropy<float, int32_t>(rows, vocab, off);
      check_cross_entropy<double, int64_t>(rows, vocab, off);
    }
}

TEST_CASE("loss kernel: lce_chunk_fwd over uneven vocabulary chunks, lce_finish, chunked bwd",
          "[loss]") {
  const int64_t rows = 6, vocab = 45;
  Rng rng(21);
  auto logits = random_vector<float>(rng, rows * vocab, -5, 5);
  // Row 4 masks its first 20 classes (-inf), so its first chunks add nothing; row 5 carries large
  // logits that a later chunk raises the running max over.
  for (int64_t c = 0; c < 20; c++) logits[4 * vocab + c] = -INFINITY;
  for (int64_t c = 30; c < vocab; c++) logits[5 * vocab + c] += 40;
  std::vector<int64_t> labels = {0, kIgnore, 44, 19, 25, 31};
  const auto x = widen_all(logits);

  // Chunks [0, 7), [7, 8), [8, 20), [20, 45); each chunk is a packed [rows, chunk] array.
  const std::vector<int64_t> bounds = {0, 7, 8, 20, 45};
  std::vector<float> run_max(rows, -INFINITY), run_sum(rows, 0.f), target(rows, 0.f);
  for (size_t k = 0; k + 1 < bounds.size(); k++) {
    const int64_t v0 = bounds[k], chunk = bounds[k + 1] - v0;
    std::vector<float> part;
    for (int64_t r = 0; r < rows; r++)
      for (int64_t c = 0; c < chunk; c++) part.push_back(logits[r * vocab + v0 + c]);
    cpu::lce_chunk_fwd<float, int64_t>(run_max.data(), run_sum.data(), target.data(), part.data(),
                                       labels.data(), rows, chunk, v0, kIgnore);
  }
  std::vector<float> loss(rows), lse(rows);
  cpu::lce_finish<float, int64_t>(loss.data(), lse.data(), run_max.data(), run_sum.data(),
                                  target.data(), labels.data(), rows, kIgnore);
  std::vector<double> lse_ref(rows), loss_ref(rows);
  for (int64_t r = 0; r < rows; r++) {
    lse_ref[r] = logsumexp(x.data() + r * vocab, vocab);
    loss_ref[r] = labels[r] == kIgnore ? 0.0 : lse_ref[r] - x[r * vocab + labels[r]];
  }
  // As cross_entropy_fwd (logits up to 45 here), plus one rescaling exp per chunk.
  check_close(lse, lse_ref, 0, 2e-6 * 46, "lse");
  check_close(loss, loss_ref, 0, 2e-6 * 46, "row_loss");
  CHECK(run_max[4] == Approx(*std::max_element(x.begin() + 4 * vocab + 20, x.begin() + 5 * vocab)));

  // Backward chunk by chunk from the reference lse; each chunk's gradient is the matching
  // columns of softmax - onehot (the -1 only in the chunk holding the label).
  std::vector<float> lse_in(lse_ref.begin(), lse_ref.end());
  const float grad_loss = 1.0f;
  const double scale = 1.0;
  for (size_t k = 0; k + 1 < bounds.size(); k++) {
    const int64_t v0 = bounds[k], chunk = bounds[k + 1] - v0;
    INFO("chunk [" << v0 << ", " << v0 + chunk << ")");
    std::vector<float> part, dpart(size_t(rows * chunk));
    for (int64_t r = 0; r < rows; r++)
      for (int64_t c = 0; c < chunk; c++) part.push_back(logits[r * vocab + v0 + c]);
    cpu::lce_chunk_bwd<float, int64_t>(dpart.data(), part.data(), lse_in.data(), labels.data(),
                                       &grad_loss, &scale, rows, chunk, v0, kIgnore);
    std::vector<double> ref(dpart.size(), 0.0);
    for (int64_t r = 0; r < rows; r++) {
      if (labels[r] == kIgnore) continue;
      for (int64_t c = 0; c < chunk; c++)
        ref[r * chunk + c] =
            std::exp(x[r * vocab + v0 + c] - lse_ref[r]) - (v0 + c == labels[r] ? 1.0 : 0.0);
    }
    check_close(dpart, ref, 1e-5, 1e-7, "dlogits chunk");
  }
}

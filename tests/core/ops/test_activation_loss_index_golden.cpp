// Activations, softmax, cross-entropy, embedding and index ops against torch (golden data from
// tools/golden/gen_activation_loss_index.py: fp64 torch results of fp32 inputs, stored as fp32).
//
// fp32: outputs and input gradients within kGoldenF32Tol (max-norm relative error).
// bf16: the op runs on bf16-rounded inputs (and a bf16 upstream gradient) and is compared with the
// same fp32 golden. bf16 keeps 8 significant bits, so each rounding costs up to 2^-9 relative;
// inputs, outputs and the upstream gradient are each rounded once and the math runs in fp32, so
// outputs stay within kBf16OutTol = 2e-2 and gradients (one more rounded operand) within
// kBf16GradTol = 3e-2. The cross-entropy loss itself is returned in fp32 and only sees the
// rounded logits.
#include "tests/golden/golden.h"

#include <functional>
#include <string>
#include <vector>

#include "src/core/ops/activation.h"
#include "src/core/ops/index.h"
#include "src/core/ops/loss.h"

using namespace vlm;
using vlm::testing::Golden;
using vlm::testing::kGoldenF32Tol;
using vlm::testing::rel_error;

namespace {

constexpr double kBf16OutTol = 2e-2;
constexpr double kBf16GradTol = 3e-2;

const Golden& golden() {
  static const Golden g("activation_loss_index");
  return g;
}

using OpFn = std::function<Tensor(const std::vector<Tensor>&)>;

// Runs `fn` on the case's differentiable inputs (named `inputs`, cast to dtype), backpropagates the
// stored grad_out, and compares the output and every "grad_<input>" with the golden values.
void check_case(const std::string& name, const std::vector<std::string>& inputs, const OpFn& fn,
                DType dtype) {
  const Golden& g = golden();
  const bool bf = dtype == DType::bf16;
  std::vector<Tensor> leaves;
  for (const auto& key : inputs) {
    Tensor t = g.get(name, key, dtype);
    t.set_requires_grad(true);
    leaves.push_back(t);
  }
  Tensor out = fn(leaves);
  run_backward({out}, {g.get(name, "grad_out", out.dtype())});
  INFO("case " << name << " in " << dtype_name(dtype));
  double out_err = rel_error(out, g.get(name, "out"));
  INFO("output rel error " << out_err);
  CHECK(out_err <= (bf ? kBf16OutTol : kGoldenF32Tol));
  for (size_t i = 0; i < inputs.size(); i++) {
    REQUIRE(leaves[i].grad().defined());
    double grad_err = rel_error(leaves[i].grad(), g.get(name, "grad_" + inputs[i]));
    INFO("grad_" << inputs[i] << " rel error " << grad_err);
    CHECK(grad_err <= (bf ? kBf16GradTol : kGoldenF32Tol));
  }
}

void check_both(const std::string& name, const std::vector<std::string>& inputs, const OpFn& fn) {
  check_case(name, inputs, fn, DType::f32);
  check_case(name, inputs, fn, DType::bf16);
}

OpFn unary_fn(Tensor (*op)(const Tensor&)) {
  return [op](const std::vector<Tensor>& in) { return op(in[0]); };
}

} // namespace

TEST_CASE("activation: golden gelu (erf and tanh) vs torch", "[golden]") {
  check_both("gelu_erf", {"x"}, [](auto& in) { return gelu(in[0], GeluApprox::none); });
  check_both("gelu_tanh", {"x"}, [](auto& in) { return gelu(in[0], GeluApprox::tanh); });
}

TEST_CASE("activation: golden silu, sigmoid and swiglu vs torch", "[golden]") {
  check_both("silu", {"x"}, unary_fn(silu));
  check_both("sigmoid", {"x"}, unary_fn(sigmoid));
  check_both("swiglu", {"gate", "up"}, [](auto& in) { return swiglu(in[0], in[1]); });
}

TEST_CASE("activation: golden exp, log, rsqrt, square vs torch", "[golden]") {
  check_both("exp", {"x"}, unary_fn(vlm::exp));
  check_both("log", {"x"}, unary_fn(vlm::log));
  check_both("rsqrt", {"x"}, unary_fn(rsqrt));
  check_both("square", {"x"}, unary_fn(square));
}

TEST_CASE("activation: golden softmax vs torch", "[golden]") {
  check_both("softmax", {"x"}, unary_fn(softmax));
}

TEST_CASE("loss: golden cross_entropy with ignored tokens vs torch", "[golden]") {
  for (const char* name : {"ce_v50", "ce_v1000"}) {
    Tensor labels = golden().get(name, "labels");
    check_both(name, {"logits"}, [&](auto& in) { return cross_entropy(in[0], labels); });
    // i32 labels take the same path.
    check_case(
        name, {"logits"}, [&](auto& in) { return cross_entropy(in[0], labels.to(DType::i32)); },
        DType::f32);
  }
}

TEST_CASE("index: golden embedding with repeated ids vs torch", "[golden]") {
  Tensor ids = golden().get("embedding", "ids");
  check_both("embedding", {"weight"}, [&](auto& in) { return embedding(in[0], ids); });
}

TEST_CASE("index: golden index_select and index_add vs torch", "[golden]") {
  Tensor sel = golden().get("index_select", "index");
  check_both("index_select", {"x"}, [&](auto& in) { return index_select(in[0], 1, sel); });
  Tensor add_idx = golden().get("index_add", "index");
  check_both("index_add", {"x", "src"},
             [&](auto& in) { return index_add(in[0], 1, add_idx, in[1]); });
}

// Primitive ops vs torch (tools/golden/gen_primitives.py): outputs and input gradients in fp32,
// rel_error <= kGoldenF32Tol. bf16: the same ops on bf16-rounded inputs within kBf16Tol of the
// fp32 golden (inputs, grad_out and results each carry up to 2^-8 relative rounding; products
// accumulate in f32, so a few ulps of the max-norm bound the error).
#include <functional>
#include <map>
#include <string>

#include "src/core/ops.h"
#include "tests/golden/golden.h"

using namespace vlm;
using vlm::testing::Golden;
using vlm::testing::kGoldenF32Tol;
using vlm::testing::rel_error;

namespace {

constexpr double kBf16Tol = 2e-2;

using Fn = std::function<Tensor(std::map<std::string, Tensor>&)>;

// Runs `fn` on the case's inputs in `dtype`, backpropagates grad_out and checks out and every
// d<input> against the golden within tol.
void check_case(const Golden& g, const std::string& name, const std::vector<std::string>& inputs,
                const Fn& fn, DType dtype, double tol) {
  INFO("case " << name << " in " << dtype_name(dtype));
  std::map<std::string, Tensor> in;
  for (auto& k : inputs) {
    in[k] = g.get(name, k, dtype).detach();
    in[k].set_requires_grad(true);
  }
  Tensor out = fn(in);
  CHECK(rel_error(out, g.get(name, "out")) <= tol);
  run_backward({out}, {g.get(name, "grad_out", dtype)});
  for (auto& k : inputs) {
    INFO("gradient d" << k);
    CHECK(rel_error(in[k].grad(), g.get(name, "d" + k)) <= tol);
  }
}

void check_both(const Golden& g, const std::string& name, const std::vector<std::string>& inputs,
                const Fn& fn) {
  check_case(g, name, inputs, fn, DType::f32, kGoldenF32Tol);
  check_case(g, name, inputs, fn, DType::bf16, kBf16Tol);
}

} // namespace

TEST_CASE("primitives: golden matmul and linear vs torch", "[golden]") {
  Golden g("primitives");
  check_both(g, "matmul_2d", {"a", "b"}, [](auto& in) { return matmul(in["a"], in["b"]); });
  check_both(g, "matmul_batched", {"a", "b"}, [](auto& in) { return matmul(in["a"], in["b"]); });
  check_both(g, "linear_bias", {"x", "w", "bias"},
             [](auto& in) { return linear(in["x"], in["w"], in["bias"]); });
  check_both(g, "linear", {"x", "w"}, [](auto& in) { return linear(in["x"], in["w"]); });
}

TEST_CASE("primitives: golden broadcast arithmetic and reductions vs torch", "[golden]") {
  Golden g("primitives");
  check_both(g, "add_broadcast", {"a", "b"}, [](auto& in) { return add(in["a"], in["b"]); });
  check_both(g, "sub_broadcast", {"a", "b"}, [](auto& in) { return sub(in["a"], in["b"]); });
  check_both(g, "mul_broadcast", {"a", "b"}, [](auto& in) { return mul(in["a"], in["b"]); });
  check_both(g, "div_broadcast", {"a", "b"}, [](auto& in) { return div(in["a"], in["b"]); });
  check_both(g, "affine", {"a"}, [](auto& in) { return affine(in["a"], -1.75, 0.5); });
  check_both(g, "sum_dims", {"a"}, [](auto& in) { return sum(in["a"], {0, 2}); });
  check_both(g, "mean_keepdim", {"a"}, [](auto& in) { return mean(in["a"], {1}, true); });
  check_both(g, "sum_all", {"a"}, [](auto& in) { return sum(in["a"]); });
}

TEST_CASE("primitives: golden views and concat vs torch", "[golden]") {
  Golden g("primitives");
  check_both(g, "transpose", {"a"}, [](auto& in) { return transpose(in["a"], 0, 2).contiguous(); });
  check_both(g, "permute_reshape", {"a"}, [](auto& in) {
    return reshape(permute(in["a"], {1, 0, 2}), {3, 8});
  });
  check_both(g, "slice", {"a"}, [](auto& in) { return slice(in["a"], 1, 1, 3).contiguous(); });
  check_both(g, "concat", {"a", "b"}, [](auto& in) { return concat({in["a"], in["b"]}, 1); });
  check_both(g, "expand", {"a"}, [](auto& in) { return expand(in["a"], {2, 3, 4}).contiguous(); });
}

TEST_CASE("primitives: golden fp32 -> bf16 cast rounds exactly as torch", "[golden]") {
  Golden g("primitives");
  Tensor a = g.get("cast_bf16", "a");
  Tensor ours = cast(a, DType::bf16).to(DType::f32);
  CHECK(ours.to_doubles() == g.get("cast_bf16", "out").to_doubles()); // bit-exact
}

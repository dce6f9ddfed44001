#include "src/nn/init.h"

#include <sstream>

#include "src/core/autograd.h"
#include "src/core/ops/elementwise.h"
#include "src/core/ops/shape_ops.h"

namespace vlm::nn {

std::string Init::str() const {
  std::ostringstream os;
  switch (kind) {
  case Kind::keep: os << "keep"; break;
  case Kind::constant: os << "constant(" << a << ")"; break;
  case Kind::normal: os << "normal(mean=" << a << ", std=" << b << ")"; break;
  case Kind::uniform: os << "uniform(" << a << ", " << b << ")"; break;
  case Kind::custom: os << "custom"; break;
  }
  return os.str();
}

void Init::apply(Tensor& param, Rng& rng) const {
  NoGradGuard no_grad; // parameters require grad; filling them is not part of any graph
  switch (kind) {
  case Kind::keep: return;
  case Kind::constant: fill_(param, a); return;
  // Values are drawn in double and rounded once to the parameter's dtype.
  case Kind::normal: copy_(param, Tensor::randn(param.shape(), rng, DType::f64, b, a)); return;
  case Kind::uniform: copy_(param, Tensor::uniform(param.shape(), rng, a, b, DType::f64)); return;
  case Kind::custom:
    VLM_CHECK(fn, "Init::custom without a function for ", param.desc());
    fn(param, rng);
    return;
  }
}

} // namespace vlm::nn

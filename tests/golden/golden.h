// Reading golden files written by tools/golden/*.py: one safetensors file per op family, tensors
// named "<case>.<name>". Comparisons use max-norm relative error (see tests/golden/README.md).
#pragma once

#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <string>

#include "io/state/safetensors.h"
#include "src/core/ops.h"

namespace vlm::testing {

// A copy (owned, aligned, on the CPU) of tensor `name` of a safetensors file.
inline Tensor read_tensor(const io::SafetensorsFile& f, const std::string& name) {
  const auto& info = f.get(name);
  Tensor t = Tensor::empty(info.shape, info.dtype);
  if (info.nbytes) std::memcpy(t.data_ptr(), info.data, info.nbytes);
  return t;
}

// Every tensor of a safetensors file (e.g. a `vlmtrain dump` output), by name.
inline std::map<std::string, Tensor> read_all_tensors(const std::string& path) {
  io::SafetensorsFile f(path);
  std::map<std::string, Tensor> out;
  for (const auto& name : f.names()) out[name] = read_tensor(f, name);
  return out;
}

class Golden {
public:
  explicit Golden(const std::string& family)
      : file_(std::make_shared<io::SafetensorsFile>(std::string(VLM_SOURCE_DIR) + "/tests/golden/" +
                                                    family + ".safetensors")) {}

  bool has(const std::string& case_name, const std::string& key) const {
    return file_->contains(case_name + "." + key);
  }
  // A copy of the stored tensor (owned, aligned), optionally converted to dtype.
  Tensor get(const std::string& case_name, const std::string& key) const {
    return read_tensor(*file_, case_name + "." + key);
  }
  Tensor get(const std::string& case_name, const std::string& key, DType dtype) const {
    return get(case_name, key).to(dtype);
  }

private:
  std::shared_ptr<io::SafetensorsFile> file_;
};

// Max-norm relative error: max|a - b| / max|b|.
// A NaN or Inf on either side gives +inf unless both sides hold the same non-finite value.
inline double rel_error(const Tensor& actual, const Tensor& expected) {
  REQUIRE(actual.shape() == expected.shape());
  auto a = actual.to(Device::cpu()).to_doubles(), b = expected.to(Device::cpu()).to_doubles();
  double diff = 0, ref = 0;
  for (size_t i = 0; i < a.size(); i++) {
    if (!std::isfinite(a[i]) || !std::isfinite(b[i])) {
      if ((std::isnan(a[i]) && std::isnan(b[i])) || a[i] == b[i]) continue;
      return INFINITY;
    }
    diff = std::max(diff, std::abs(a[i] - b[i]));
    ref = std::max(ref, std::abs(b[i]));
  }
  return ref > 0 ? diff / ref : diff;
}

// fp32 golden tolerance (issue #2): relative error <= 1e-5.
constexpr double kGoldenF32Tol = 1e-5;

} // namespace vlm::testing

#include "io/state_store.h"

#include <algorithm>

#include "src/core/autograd.h"
#include "src/core/ops/shape_ops.h"

namespace vlm::io {

void MemoryState::check_new(const std::string& key) const {
  VLM_CHECK(!key.empty(), "state: empty key");
  VLM_CHECK(!has(key), "state: key '", key, "' is written twice");
}

void MemoryState::write_tensor(const std::string& key, const Tensor& value) {
  check_new(key);
  VLM_CHECK(value.defined(), "state: writing an undefined tensor under '", key, "'");
  NoGradGuard no_grad;
  tensors_[key] = value.detach().to(Device::cpu()).clone();
}

void MemoryState::write_json(const std::string& key, const nlohmann::json& value) {
  check_new(key);
  json_[key] = value;
}

bool MemoryState::has(const std::string& key) const {
  return tensors_.count(key) || json_.count(key);
}

void MemoryState::read_tensor_into(const std::string& key, Tensor& dst) const {
  auto it = tensors_.find(key);
  VLM_CHECK(it != tensors_.end(), "state: no tensor '", key, "'");
  const Tensor& src = it->second;
  VLM_CHECK(dst.defined() && src.shape() == dst.shape() && src.dtype() == dst.dtype(), "state: '",
            key, "' holds ", src.desc(), " but the destination is ",
            dst.defined() ? dst.desc() : std::string("undefined"));
  NoGradGuard no_grad;
  copy_(dst, src.to(dst.device()));
}

nlohmann::json MemoryState::read_json(const std::string& key) const {
  auto it = json_.find(key);
  VLM_CHECK(it != json_.end(), "state: no JSON document '", key, "'");
  return it->second;
}

std::vector<std::string> MemoryState::keys() const {
  std::vector<std::string> out;
  for (const auto& [k, v] : tensors_) out.push_back(k);
  for (const auto& [k, v] : json_) out.push_back(k);
  std::sort(out.begin(), out.end());
  return out;
}

} // namespace vlm::io

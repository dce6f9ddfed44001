#include "io/state/state_store.h"

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

Shape MemoryState::shape(const std::string& key) const {
  auto it = tensors_.find(key);
  VLM_CHECK(it != tensors_.end(), "state: no tensor '", key, "'");
  return it->second.shape();
}

void check_state_tensor(const StateReader& in, const std::string& key, const Shape& shape,
                        std::optional<DType> dtype) {
  VLM_CHECK(in.has(key), "'", key, "' is missing");
  const Shape stored = in.shape(key);
  const DType stored_dtype = in.dtype(key);
  const bool dtype_ok = dtype ? stored_dtype == *dtype : is_floating(stored_dtype);
  VLM_CHECK(stored == shape && dtype_ok, "'", key, "' holds ", dtype_name(stored_dtype),
            shape_str(stored), " but this model's is ",
            dtype ? std::string(dtype_name(*dtype)) : std::string("a float tensor of "),
            shape_str(shape));
}

void check_state_group(const StateReader& in, const std::string& group,
                       const std::set<std::string>& names) {
  for (const std::string& name : in.children(group))
    VLM_CHECK(names.count(name), "'", group, "/", name, "' is not a parameter of this model");
}

DType MemoryState::dtype(const std::string& key) const {
  auto it = tensors_.find(key);
  VLM_CHECK(it != tensors_.end(), "state: no tensor '", key, "'");
  return it->second.dtype();
}

std::vector<std::string> MemoryState::children(const std::string& group) const {
  // Keys are "group/name[/...]": the distinct names right below the group.
  std::vector<std::string> out;
  const std::string prefix = group + "/";
  auto add = [&](const std::string& key) {
    if (key.compare(0, prefix.size(), prefix) == 0)
      out.push_back(key.substr(prefix.size(), key.find('/', prefix.size()) - prefix.size()));
  };
  for (const auto& [key, t] : tensors_) add(key);
  for (const auto& [key, j] : json_) add(key);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
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

void MemoryState::write_rows(const std::string& key, const Shape& global_shape, DType dtype,
                             int64_t row_begin, const Tensor& rows) {
  VLM_CHECK(rows.defined() && row_begin == 0 && rows.shape() == global_shape &&
                rows.dtype() == dtype,
            "state: '", key, "': an in-memory state holds whole tensors (", dtype_name(dtype),
            shape_str(global_shape), "), not rows from ", row_begin, " as ",
            rows.defined() ? rows.desc() : std::string("none"));
  write_tensor(key, rows);
}

void MemoryState::read_rows_into(const std::string& key, int64_t row_begin, Tensor& dst) const {
  auto it = tensors_.find(key);
  VLM_CHECK(it != tensors_.end(), "state: no tensor '", key, "'");
  const Tensor& src = it->second;
  VLM_CHECK(dst.defined() && src.dim() > 0 && dst.dim() == src.dim() && row_begin >= 0 &&
                row_begin + dst.size(0) <= src.size(0) && src.dtype() == dst.dtype(),
            "state: '", key, "' holds ", src.desc(), "; rows from ", row_begin, " do not fit ",
            dst.defined() ? dst.desc() : std::string("undefined"));
  Tensor rows = slice(src, 0, row_begin, row_begin + dst.size(0));
  VLM_CHECK(rows.shape() == dst.shape(), "state: '", key, "' holds ", src.desc(),
            " but the destination is ", dst.desc());
  NoGradGuard no_grad;
  copy_(dst, rows.to(dst.device()));
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

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
  write_slab(key, global_shape, dtype, {Slab{std::vector<int64_t>(global_shape.size(), 0), rows}});
}

void MemoryState::read_rows_into(const std::string& key, int64_t row_begin, Tensor& dst) const {
  auto it = tensors_.find(key);
  VLM_CHECK(it != tensors_.end(), "state: no tensor '", key, "'");
  const Tensor& src = it->second;
  VLM_CHECK(dst.defined() && src.dim() > 0 && dst.dim() == src.dim() && row_begin >= 0 &&
                row_begin + dst.size(0) <= src.size(0) && src.dtype() == dst.dtype(),
            "state: '", key, "' holds ", src.desc(), "; rows from ", row_begin, " do not fit ",
            dst.defined() ? dst.desc() : std::string("undefined"));
  std::vector<int64_t> offset(size_t(src.dim()), 0);
  offset[0] = row_begin;
  read_slab_into(key, offset, dst);
}

namespace {

// The box [offset, offset + box) of `t`, a view.
Tensor box_of(const Tensor& t, const std::vector<int64_t>& offset, const Shape& box) {
  Tensor view = t;
  for (size_t d = 0; d < box.size(); d++)
    view = slice(view, int64_t(d), offset[d], offset[d] + box[d]);
  return view;
}

bool boxes_overlap(const Slab& a, const Slab& b) {
  for (size_t d = 0; d < a.offset.size(); d++)
    if (a.offset[d] >= b.offset[d] + b.block.size(int64_t(d)) ||
        b.offset[d] >= a.offset[d] + a.block.size(int64_t(d)))
      return false;
  return true;
}

} // namespace

bool box_fits(const Shape& global_shape, const std::vector<int64_t>& offset, const Shape& box) {
  if (offset.size() != global_shape.size() || box.size() != global_shape.size()) return false;
  for (size_t d = 0; d < box.size(); d++)
    if (offset[d] < 0 || box[d] < 0 || offset[d] > global_shape[d] - box[d]) return false;
  return true;
}

void MemoryState::write_slab(const std::string& key, const Shape& global_shape, DType dtype,
                             const std::vector<Slab>& slabs) {
  check_new(key);
  // One process holds the whole tensor: its slabs are assembled into it, so they must tile it.
  NoGradGuard no_grad;
  Tensor whole = Tensor::empty(global_shape, dtype);
  std::vector<const Slab*> written;
  int64_t covered = 0;
  for (const Slab& slab : slabs) {
    if (!slab.block.defined() || slab.block.numel() == 0) continue;
    VLM_CHECK(slab.block.dtype() == dtype &&
                  box_fits(global_shape, slab.offset, slab.block.shape()),
              "state: the box at offset ", shape_str(slab.offset), " as ", slab.block.desc(),
              " does not fit '", key, "', a ", dtype_name(dtype), shape_str(global_shape));
    for (const Slab* other : written)
      VLM_CHECK(!boxes_overlap(slab, *other), "state: '", key, "': the boxes at offsets ",
                shape_str(other->offset), " and ", shape_str(slab.offset), " overlap");
    Tensor box = box_of(whole, slab.offset, slab.block.shape());
    copy_(box, slab.block.detach());
    written.push_back(&slab);
    covered += slab.block.numel();
  }
  VLM_CHECK(covered == numel(global_shape), "state: '", key,
            "': an in-memory state holds whole tensors (", dtype_name(dtype),
            shape_str(global_shape), "); its slabs cover ", covered, " of its ",
            numel(global_shape), " elements");
  tensors_[key] = whole;
}

void MemoryState::read_slab_into(const std::string& key, const std::vector<int64_t>& offset,
                                 Tensor& dst) const {
  auto it = tensors_.find(key);
  VLM_CHECK(it != tensors_.end(), "state: no tensor '", key, "'");
  const Tensor& src = it->second;
  VLM_CHECK(dst.defined() && src.dtype() == dst.dtype() &&
                box_fits(src.shape(), offset, dst.shape()),
            "state: '", key, "' holds ", dtype_name(src.dtype()), shape_str(src.shape()),
            "; the box at offset ", shape_str(offset), " does not fit ",
            dst.defined() ? dst.desc() : std::string("undefined"));
  NoGradGuard no_grad;
  copy_(dst, box_of(src, offset, dst.shape()).to(dst.device()));
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

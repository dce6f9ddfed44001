#include "model/stored_tensors.h"

#include "src/base/check.h"

namespace vlm::model {

namespace {

constexpr DType kStoredFloats[] = {DType::f64, DType::f32, DType::bf16, DType::f16};

// The float dtype named `name` ("f32"), or an error naming parameter `param`.
DType parse_stored_dtype(const std::string& param, const nlohmann::json& name) {
  if (name.is_string())
    for (DType t : kStoredFloats)
      if (name.get<std::string>() == dtype_name(t)) return t;
  VLM_FAIL("/stored_dtypes['", param, "'] = ", name.dump(), ": expected f64, f32, bf16 or f16");
}

} // namespace

bool holds_all_of(DType a, DType b) {
  if (a == b || a == DType::f64) return true;
  return a == DType::f32 && (b == DType::bf16 || b == DType::f16);
}

DType StoredTensors::write_dtype(const std::string& name, DType dtype) const {
  auto it = dtypes.find(name);
  if (it == dtypes.end() || holds_all_of(dtype, it->second)) return dtype;
  return holds_all_of(it->second, dtype) ? it->second : DType::f32; // bf16 vs f16: f32 keeps both
}

void write_stored_tensors(io::StateWriter& out, const StoredTensors& stored) {
  if (stored.empty()) return;
  nlohmann::json dtypes = nlohmann::json::object();
  for (const auto& [name, t] : stored.dtypes) dtypes[name] = dtype_name(t);
  out.write_json("stored_dtypes", dtypes);
  for (const auto& [name, value] : stored.carried) out.write_tensor("carried/" + name, value);
}

StoredTensors read_stored_tensors(const io::StateReader& in) {
  StoredTensors s;
  if (!in.has("stored_dtypes")) return s;
  const nlohmann::json dtypes = in.read_json("stored_dtypes");
  VLM_CHECK(dtypes.is_object(), "/stored_dtypes is not an object (parameter name -> dtype)");
  for (const auto& [name, t] : dtypes.items()) s.dtypes[name] = parse_stored_dtype(name, t);
  for (const std::string& name : in.children("carried")) {
    const std::string key = "carried/" + name;
    Tensor t = Tensor::empty(in.shape(key), in.dtype(key));
    in.read_tensor_into(key, t);
    s.carried[name] = t;
  }
  return s;
}

} // namespace vlm::model

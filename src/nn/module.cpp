#include "src/nn/module.h"

#include <algorithm>
#include <exception>
#include <unordered_map>
#include <unordered_set>

#include "src/base/env.h"
#include "src/core/autograd.h"
#include "src/core/ops/elementwise.h"
#include "src/core/ops/shape_ops.h"

namespace vlm::nn {

namespace {

std::string join(const std::string& prefix, const std::string& name) {
  if (prefix.empty()) return name;
  return name.empty() ? prefix : prefix + "." + name;
}

// Edit distance, for "did you mean" lists.
size_t levenshtein(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); j++) row[j] = j;
  for (size_t i = 1; i <= a.size(); i++) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); j++) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

// "a, b, c" — the (up to) five names closest to `wanted`.
std::string closest_names(const std::string& wanted, const std::vector<std::string>& names) {
  std::vector<std::pair<size_t, std::string>> scored;
  for (const auto& n : names) scored.emplace_back(levenshtein(wanted, n), n);
  std::stable_sort(scored.begin(), scored.end(),
                   [](const auto& x, const auto& y) { return x.first < y.first; });
  std::string out;
  for (size_t i = 0; i < scored.size() && i < 5; i++) out += (i ? ", " : "") + scored[i].second;
  return out.empty() ? "(none)" : out;
}

// FNV-1a: a stable hash of a parameter name, used as its random stream.
uint64_t name_stream(const std::string& name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : name) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

} // namespace

// --- describe ----------------------------------------------------------------------------------

void Module::check_new_name(const std::string& name, const char* what) const {
  VLM_CHECK(!name.empty() && name.find('.') == std::string::npos, type_name(), ": ", what,
            " name '", name, "' must be non-empty and contain no '.' (nest modules instead)");
  bool taken = own_slot(name) != nullptr;
  for (const auto& [child_name, child] : children_) taken = taken || child_name == name;
  VLM_CHECK(!taken, type_name(), ": ", what, " name '", name,
            "' is already used by a parameter or child of this module");
}

void Module::declare_parameter(const std::string& name, const Shape& shape, Init init,
                               DType dtype) {
  check_new_name(name, "parameter");
  VLM_CHECK(is_floating(dtype) && dtype != DType::f16, type_name(), ": parameter '", name,
            "' must be f32, f64 or bf16, got ", dtype_name(dtype));
  for (int64_t d : shape)
    VLM_CHECK(d >= 0, type_name(), ": parameter '", name, "' has a negative dim in shape ",
              shape_str(shape));
  auto slot = std::make_unique<Slot>();
  slot->spec = ParameterSpec{name, shape, shape, dtype, std::move(init), true, false};
  params_.push_back(std::move(slot));
}

const Tensor& Module::register_parameter(const std::string& name, Tensor value, Init init) {
  check_new_name(name, "parameter");
  VLM_CHECK(value.defined(), type_name(), ": register_parameter('", name,
            "') of an undefined tensor");
  VLM_CHECK(value.is_leaf(), type_name(), ": parameter '", name, "' must be a leaf tensor, got ",
            value.desc(), " with history; pass x.detach()");
  value.set_requires_grad(true);
  auto slot = std::make_unique<Slot>();
  slot->spec =
      ParameterSpec{name, value.shape(), value.shape(), value.dtype(), std::move(init), true, true};
  slot->tensor = std::move(value);
  params_.push_back(std::move(slot));
  return params_.back()->tensor;
}

void Module::add_child(const std::string& name, std::shared_ptr<Module> child) {
  check_new_name(name, "module");
  VLM_CHECK(child != nullptr, type_name(), ": register_module('", name, "') of a null module");
  VLM_CHECK(child.get() != this, type_name(), ": a module cannot be its own child ('", name, "')");
  children_.emplace_back(name, std::move(child));
}

// --- access ------------------------------------------------------------------------------------

const Module::Slot* Module::own_slot(const std::string& local_name) const {
  for (const auto& s : params_)
    if (s->spec.name == local_name) return s.get();
  return nullptr;
}

bool Module::has_param(const std::string& local_name) const {
  return own_slot(local_name) != nullptr;
}

const Tensor& Module::param(const std::string& local_name) const {
  const Slot* s = own_slot(local_name);
  if (!s) {
    std::vector<std::string> names;
    for (const auto& p : params_) names.push_back(p->spec.name);
    VLM_FAIL(type_name(), ": no parameter '", local_name,
             "'; it has: ", closest_names(local_name, names));
  }
  VLM_CHECK(s->tensor.defined(), type_name(), ": parameter '", local_name, "' ",
            shape_str(s->spec.shape),
            " is declared but not materialized; call materialize() on the root module");
  return s->tensor;
}

void Module::collect_slots(const std::string& prefix, std::vector<SlotRef>& out) const {
  for (const auto& s : params_) out.push_back({join(prefix, s->spec.name), s.get()});
  for (const auto& [name, child] : children_) child->collect_slots(join(prefix, name), out);
}

std::vector<Module::SlotRef> Module::collect_slots() const {
  std::vector<SlotRef> all;
  collect_slots("", all);
  // A tensor registered twice (tied weights) or a module registered under two names is listed
  // once, under its first name.
  std::unordered_set<const void*> seen;
  std::vector<SlotRef> unique;
  for (const auto& r : all) {
    const void* key = r.slot->tensor.defined()
                          ? static_cast<const void*>(r.slot->tensor.impl_ptr().get())
                          : static_cast<const void*>(r.slot);
    if (seen.insert(key).second) unique.push_back(r);
  }
  return unique;
}

std::vector<NamedParameter> Module::named_parameters() const {
  std::vector<NamedParameter> out;
  for (const auto& r : collect_slots()) {
    VLM_CHECK(r.slot->tensor.defined(), "parameter '", r.full_name, "' ",
              shape_str(r.slot->spec.shape),
              " is declared but not materialized; call materialize() on the root module");
    out.push_back({r.full_name, r.slot->tensor});
  }
  return out;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& np : named_parameters()) out.push_back(std::move(np.tensor));
  return out;
}

std::vector<ParameterSpec> Module::parameter_specs() const {
  std::vector<ParameterSpec> out;
  for (const auto& r : collect_slots()) {
    ParameterSpec spec = r.slot->spec;
    spec.name = r.full_name;
    spec.local_shape = r.slot->local_shape.value_or(spec.shape);
    out.push_back(std::move(spec));
  }
  return out;
}

std::vector<std::pair<std::string, Module*>> Module::named_modules() {
  std::vector<std::pair<std::string, Module*>> out{{"", this}};
  for (const auto& [name, child] : children_)
    for (const auto& [sub, m] : child->named_modules()) out.emplace_back(join(name, sub), m);
  return out;
}

Tensor Module::find_parameter(const std::string& name) const {
  std::vector<std::string> names;
  for (const auto& r : collect_slots()) {
    if (r.full_name == name) {
      VLM_CHECK(r.slot->tensor.defined(), "parameter '", name, "' ", shape_str(r.slot->spec.shape),
                " is declared but not materialized; call materialize() on the root module");
      return r.slot->tensor;
    }
    names.push_back(r.full_name);
  }
  VLM_FAIL(type_name(), ": no parameter named '", name, "' (", names.size(),
           " parameters); closest: ", closest_names(name, names));
}

Module& Module::find_module(const std::string& name) {
  std::vector<std::string> names;
  for (const auto& [path, m] : named_modules()) {
    if (path == name) return *m;
    names.push_back(path);
  }
  VLM_FAIL(type_name(), ": no module named '", name, "'; closest: ", closest_names(name, names));
}

int64_t Module::num_parameters(bool trainable_only) const {
  int64_t n = 0;
  for (const auto& r : collect_slots())
    if (!trainable_only || r.slot->spec.trainable) n += vlm::numel(r.slot->spec.shape);
  return n;
}

// --- training state ----------------------------------------------------------------------------

void Module::zero_grad() {
  for (const auto& r : collect_slots())
    if (r.slot->tensor.defined()) r.slot->tensor.zero_grad();
}

void Module::set_requires_grad(bool requires_grad) {
  for (const auto& r : collect_slots()) {
    r.slot->spec.trainable = requires_grad;
    if (r.slot->tensor.defined()) r.slot->tensor.set_requires_grad(requires_grad);
  }
}

void Module::set_trainable(const std::string& name, bool trainable) {
  std::vector<std::string> names;
  for (const auto& r : collect_slots()) {
    if (r.full_name == name) {
      r.slot->spec.trainable = trainable;
      if (r.slot->tensor.defined()) r.slot->tensor.set_requires_grad(trainable);
      return;
    }
    names.push_back(r.full_name);
  }
  VLM_FAIL("set_trainable: no parameter named '", name, "'; closest: ", closest_names(name, names));
}

// --- allocate / initialize ---------------------------------------------------------------------

void Module::set_local_shape(const std::string& name, const Shape& shape) {
  std::vector<std::string> names;
  for (const auto& r : collect_slots()) {
    if (r.full_name == name) {
      VLM_CHECK(!r.slot->spec.materialized, "set_local_shape('", name,
                "'): already materialized with shape ", shape_str(r.slot->tensor.shape()));
      r.slot->local_shape = shape;
      return;
    }
    names.push_back(r.full_name);
  }
  VLM_FAIL("set_local_shape: no parameter named '", name,
           "'; closest: ", closest_names(name, names));
}

void Module::materialize(Device device) {
  // Shapes come from files (config.json): more than the machine holds is refused before the
  // first allocation, instead of paging for minutes and dying of the OOM killer.
  double bytes = 0; // double: a wild shape must not overflow the sum
  for (const auto& r : collect_slots()) {
    if (r.slot->spec.materialized) continue;
    double n = double(dtype_size(r.slot->spec.dtype));
    for (int64_t d : r.slot->local_shape.value_or(r.slot->spec.shape)) n *= double(d);
    bytes += n;
  }
  const double memory = double(physical_memory_bytes());
  VLM_CHECK(device != Device::cpu() || memory == 0 || bytes <= memory, type_name(),
            ": its parameters need ", bytes / double(1 << 30), " GiB, more than the ",
            memory / double(1 << 30),
            " GiB of memory of this machine (check the sizes in the model's config)");
  for (const auto& r : collect_slots()) {
    Slot& s = *r.slot;
    if (!s.spec.materialized) {
      s.tensor = Tensor::zeros(s.local_shape.value_or(s.spec.shape), s.spec.dtype, device);
      s.tensor.set_requires_grad(s.spec.trainable);
      s.spec.materialized = true;
    }
    s.tensor.set_name(r.full_name);
  }
}

void Module::to(Device device) {
  NoGradGuard no_grad;
  std::vector<SlotRef> all;
  collect_slots("", all); // every slot, tied duplicates included
  std::unordered_map<const TensorImpl*, Tensor> moved;
  for (const auto& r : all) {
    Tensor& t = r.slot->tensor;
    if (!t.defined() || t.device() == device) continue;
    auto [it, fresh] = moved.try_emplace(t.impl_ptr().get());
    if (fresh) {
      it->second = t.detach().to(device);
      it->second.set_requires_grad(t.requires_grad());
      it->second.set_name(t.name());
      if (t.grad_dtype() != t.dtype()) it->second.set_grad_dtype(t.grad_dtype());
    }
    t = it->second;
  }
}

void Module::replace_parameter(const std::string& name, Tensor value) {
  VLM_CHECK(value.defined(), "replace_parameter('", name, "'): undefined tensor");
  std::vector<SlotRef> all;
  collect_slots("", all); // every slot, tied duplicates included
  const TensorImpl* old = nullptr;
  std::vector<std::string> names;
  for (const auto& r : all) {
    if (r.full_name == name) {
      if (!r.slot->tensor.defined()) { // declared only: `value` is its allocation (FSDP's shard)
        r.slot->tensor = value;
        r.slot->spec.materialized = true;
        value.set_name(name);
        return;
      }
      old = r.slot->tensor.impl_ptr().get();
      break;
    }
    names.push_back(r.full_name);
  }
  VLM_CHECK(old, "replace_parameter: no parameter named '", name,
            "'; closest: ", closest_names(name, names));
  value.set_name(name);
  for (const auto& r : all)
    if (r.slot->tensor.defined() && r.slot->tensor.impl_ptr().get() == old) r.slot->tensor = value;
}

// --- forward hooks -----------------------------------------------------------------------------

std::vector<Tensor> Module::call(const Forward& forward, const std::vector<Tensor>& inputs) const {
  for (const auto& [handle, hook] : pre_hooks_) hook(inputs);
  Forward run = forward;
  for (const auto& [handle, wrapper] : wrappers_)
    run = [wrapper = wrapper, inner = std::move(run)](const std::vector<Tensor>& in) {
      return wrapper(inner, in);
    };
  std::vector<Tensor> outputs = run(inputs);
  for (const auto& [handle, hook] : post_hooks_) hook(inputs, outputs);
  return outputs;
}

size_t Module::add_forward_pre_hook(ForwardPreHook hook) {
  VLM_CHECK(hook, type_name(), ": add_forward_pre_hook of an empty function");
  pre_hooks_.emplace_back(next_hook_, std::move(hook));
  return next_hook_++;
}

size_t Module::add_forward_post_hook(ForwardPostHook hook) {
  VLM_CHECK(hook, type_name(), ": add_forward_post_hook of an empty function");
  post_hooks_.emplace_back(next_hook_, std::move(hook));
  return next_hook_++;
}

size_t Module::add_forward_wrapper(ForwardWrapper wrapper) {
  VLM_CHECK(wrapper, type_name(), ": add_forward_wrapper of an empty function");
  wrappers_.emplace_back(next_hook_, std::move(wrapper));
  return next_hook_++;
}

void Module::remove_forward_hook(size_t handle) {
  auto erase = [handle](auto& list) {
    auto it = std::find_if(list.begin(), list.end(),
                           [handle](const auto& entry) { return entry.first == handle; });
    if (it == list.end()) return false;
    list.erase(it);
    return true;
  };
  VLM_CHECK(erase(pre_hooks_) || erase(post_hooks_) || erase(wrappers_), type_name(),
            ": remove_forward_hook(", handle, "): no such hook on this module");
}

void Module::initialize(Rng& rng) { initialize(rng, PartOf()); }

namespace {

// Fills `part` of `param` by `init` as if it were whole: the rule draws every value in order, a
// chunk of dim-0 rows at a time (about 1M values), and `keep` copies this rank's rows of each.
void initialize_part(const Init& init, Tensor& param, const Module::InitPart& part, Rng& rng) {
  if (init.kind == Init::Kind::keep) return;
  const Shape& whole = part.whole_shape;
  Tensor local = param;
  if (init.kind == Init::Kind::custom || whole.empty()) { // custom rules see the whole tensor
    Tensor values = Tensor::zeros(whole, param.dtype());
    init.apply(values, rng);
    part.keep(local, 0, values);
    return;
  }
  const int64_t rows = whole[0], row_numel = rows == 0 ? 0 : vlm::numel(whole) / rows;
  const int64_t chunk_rows =
      std::max<int64_t>(1, (int64_t(1) << 20) / std::max<int64_t>(1, row_numel));
  for (int64_t r = 0; r < rows; r += chunk_rows) {
    Shape shape = whole;
    shape[0] = std::min(chunk_rows, rows - r);
    Tensor chunk = Tensor::empty(shape, param.dtype());
    init.apply(chunk, rng);
    part.keep(local, r, chunk);
  }
}

} // namespace

void Module::initialize(Rng& rng, const PartOf& part_of) {
  const uint64_t base_seed = rng.next_u64();
  const std::vector<SlotRef> slots = collect_slots();
  for (const auto& r : slots)
    VLM_CHECK(r.slot->tensor.defined(), "initialize: parameter '", r.full_name, "' ",
              shape_str(r.slot->spec.shape), " is not materialized; call materialize() first");
  // Each parameter draws from its own stream, so they are filled in parallel with the same
  // values for any thread count (a 1.7B model takes ~40 s on one thread). Largest first, so the
  // embedding matrix does not start last.
  std::vector<size_t> order(slots.size());
  for (size_t i = 0; i < order.size(); i++) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return slots[a].slot->tensor.numel() > slots[b].slot->tensor.numel();
  });
  std::exception_ptr error;
#pragma omp parallel for schedule(dynamic, 1)
  for (size_t k = 0; k < order.size(); k++) {
    const SlotRef& r = slots[order[k]];
    try {
      Rng param_rng(base_seed, name_stream(r.full_name));
      std::optional<InitPart> part = part_of ? part_of(r.full_name) : std::nullopt;
      Tensor& param = r.slot->tensor;
      if (!part && !param.device().is_cpu()) // drawn on the host, a chunk at a time
        part = InitPart{param.shape(), [](Tensor& local, int64_t row_begin, const Tensor& rows) {
                          Tensor dst = local.dim() == 0
                                           ? local
                                           : slice(local, 0, row_begin, row_begin + rows.size(0));
                          copy_(dst, rows.to(local.device()));
                        }};
      if (part)
        initialize_part(r.slot->spec.init, param, *part, param_rng);
      else
        r.slot->spec.init.apply(param, param_rng);
    } catch (...) {
#pragma omp critical(vlm_module_initialize)
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
}

// --- ModuleList --------------------------------------------------------------------------------

Module& ModuleList::operator[](size_t i) const {
  VLM_CHECK(i < items_.size(), "ModuleList index ", i, " out of range (size ", items_.size(), ")");
  return *items_[i];
}

} // namespace vlm::nn

// Module: a registry of named parameters and named child modules that yields hierarchical
// HF-style names ("model.layers.0.self_attn.q_proj.weight").
//
// Life cycle (DESIGN.md §2: describe -> shard -> allocate -> initialize):
//   1. describe: constructors call declare_parameter(name, shape, init) — shapes and rules only —
//      and register_module(name, child). ModuleList holds indexed children ("layers.0").
//   2. shard: the parallel plan reads parameter_specs() (it may change a local shape with
//      set_local_shape before allocation).
//   3. allocate: root.materialize() allocates every declared parameter (zero-filled leaves with
//      requires_grad) and names each tensor with its full dotted name (Tensor::name()).
//   4. initialize: root.initialize(rng) fills them by their rules, or a loader overwrites them.
//
// Applied from outside (DESIGN.md §2.2): activation checkpointing and FSDP act on a model's
// blocks through forward hooks and wrappers — the model runs each block through call() — and FSDP
// swaps parameter storage with replace_parameter(); tensor parallelism wraps the Linear and
// Embedding layers, which (like the norms) run through call() whenever something is attached.
// The module itself stays unaware of them.
//
// Ordering: a module's own parameters in registration order, then each child in registration
// order, recursively (PyTorch's order, which HF state dicts follow). A tensor registered under two
// names (tied embeddings) is listed once, under the first name.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "src/base/rng.h"
#include "src/core/tensor.h"
#include "src/nn/init.h"

namespace vlm::nn {

struct NamedParameter {
  std::string name; // full dotted name relative to the module it was listed from
  Tensor tensor;
};

// A parameter as declared: what the parallel plan and summaries need before allocation.
struct ParameterSpec {
  std::string name;
  Shape shape;       // as declared: the whole tensor
  Shape local_shape; // what materialize() allocates: `shape`, or what set_local_shape set
  DType dtype = DType::f32;
  Init init;
  bool trainable = true;
  bool materialized = false;
};

class Module {
public:
  Module() = default;
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // For messages and summaries ("Linear", "Qwen3DecoderLayer").
  virtual std::string type_name() const { return "Module"; }

  // --- describe --------------------------------------------------------------------------------
  // Declares a parameter that materialize() allocates and initialize() fills by `init`.
  void declare_parameter(const std::string& name, const Shape& shape, Init init,
                         DType dtype = DType::f32);
  // Registers an existing leaf tensor (requires_grad is set); `init` defaults to keeping its
  // values. Returns the registered tensor.
  const Tensor& register_parameter(const std::string& name, Tensor value, Init init = Init::keep());
  // Registers a child; its parameters appear under "<name>.". Returns the child.
  template <typename M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> child) {
    add_child(name, child);
    return child;
  }

  // --- access (names relative to this module) ---------------------------------------------------
  // An own parameter, by its local name (for forward()); must be materialized.
  const Tensor& param(const std::string& local_name) const;
  bool has_param(const std::string& local_name) const;
  // Full dotted names in the order described above; every parameter must be materialized.
  std::vector<NamedParameter> named_parameters() const;
  std::vector<Tensor> parameters() const;
  // Declared parameters (materialized or not), same order and deduplication.
  std::vector<ParameterSpec> parameter_specs() const;
  // This module ("") and every descendant with its dotted path, pre-order.
  std::vector<std::pair<std::string, Module*>> named_modules();
  const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& children() const {
    return children_;
  }
  // By full dotted name; the error lists the closest existing names.
  Tensor find_parameter(const std::string& name) const;
  Module& find_module(const std::string& name);

  // Elements over all (deduplicated) declared parameters, or only the trainable ones.
  int64_t num_parameters(bool trainable_only = false) const;

  // Makes `value` the parameter `name` (full dotted name relative to this module) from now on, for
  // every module that registered it (a tied weight stays one tensor). The new tensor gets the
  // name; its shape, dtype, device and requires_grad are the caller's (FSDP swaps a full
  // parameter for its local shard and back). Tensors taken from parameters() before keep
  // pointing at the old one. A parameter not yet materialized is materialized as `value` (FSDP
  // allocates its shards itself).
  void replace_parameter(const std::string& name, Tensor value);

  // --- forward: hooks and wrappers (applied from outside) ----------------------------------------
  using Forward = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;
  using ForwardPreHook = std::function<void(const std::vector<Tensor>& inputs)>;
  using ForwardPostHook =
      std::function<void(const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs)>;
  // Runs `forward` on `inputs` in its own way and returns the outputs, e.g. under checkpoint().
  using ForwardWrapper =
      std::function<std::vector<Tensor>(const Forward& forward, const std::vector<Tensor>& inputs)>;

  // Runs `forward(inputs)` as this module's forward pass: the pre-hooks, then `forward` through
  // the wrappers (the first added innermost), then the post-hooks, each in the order added. A
  // wrapper may keep `forward` and run it again in backward (activation checkpointing), after
  // call() returned: capture by value whatever it needs besides its inputs.
  std::vector<Tensor> call(const Forward& forward, const std::vector<Tensor>& inputs) const;
  // Each returns a handle for remove_forward_hook.
  size_t add_forward_pre_hook(ForwardPreHook hook);
  size_t add_forward_post_hook(ForwardPostHook hook);
  size_t add_forward_wrapper(ForwardWrapper wrapper);
  // Removes a hook or wrapper added to this module; an unknown handle is an error.
  void remove_forward_hook(size_t handle);
  size_t num_forward_wrappers() const { return wrappers_.size(); }
  // Whether call() would do more than run `forward` (layers skip building its arguments if not).
  bool has_forward_hooks() const {
    return !pre_hooks_.empty() || !post_hooks_.empty() || !wrappers_.empty();
  }

  // --- training state ---------------------------------------------------------------------------
  // Drops every parameter's .grad (the next backward allocates fresh ones).
  void zero_grad();
  // Freezes (false) or unfreezes (true) every parameter of this subtree, declared ones included.
  void set_requires_grad(bool requires_grad);
  // The same for the one parameter `name` (full dotted name), declared or materialized.
  void set_trainable(const std::string& name, bool trainable);

  // --- allocate / initialize (call on the root) -------------------------------------------------
  // Overrides the allocation shape of a declared, not yet materialized parameter (sharding);
  // parameter_specs() keeps the declared shape.
  void set_local_shape(const std::string& name, const Shape& shape);
  // Allocates every declared parameter not yet materialized (zeros, requires_grad as declared)
  // and sets each tensor's name to its full dotted name relative to this module.
  void materialize(Device device = Device::cpu());
  // Moves every materialized parameter to `device` (new leaves with the same names, values,
  // requires_grad and gradient dtype; gradients are dropped; a tied parameter stays one tensor).
  // Weights are initialized or loaded on the CPU and then moved: init rules and safetensors work on
  // the host. Tensors taken from parameters() before the move keep pointing at the old copies.
  void to(Device device);
  // Fills every parameter by its rule. One base seed is drawn from rng; each parameter then gets
  // its own stream keyed by its full name, so its values depend only on (seed, name, shape) —
  // not on which other parameters exist or on their order. Same seed -> same values. Parameters
  // are filled in parallel (OpenMP): custom rules must not share mutable state.
  void initialize(Rng& rng);
  // The same values for a model whose parameters are held in parts (tensor parallelism, FSDP):
  // for a parameter that `part_of(name)` names, the rule draws the whole tensor's values in
  // their order, in chunks of dim-0 rows that are handed to `keep` and dropped, so a rank
  // never holds more of it than its part and a chunk (a custom rule fills one whole tensor).
  struct InitPart {
    Shape whole_shape;
    // Copies what this rank holds of whole rows [row_begin, row_begin + rows.size(0)) into
    // `local` (the parameter as allocated).
    std::function<void(Tensor& local, int64_t row_begin, const Tensor& rows)> keep;
  };
  using PartOf = std::function<std::optional<InitPart>(const std::string& name)>;
  void initialize(Rng& rng, const PartOf& part_of);

protected:
  void add_child(const std::string& name, std::shared_ptr<Module> child);

private:
  struct Slot {
    ParameterSpec spec;               // spec.name is the local name
    std::optional<Shape> local_shape; // what materialize() allocates, when not spec.shape
    Tensor tensor;                    // undefined until materialized
  };
  struct SlotRef {
    std::string full_name;
    Slot* slot;
  };

  void check_new_name(const std::string& name, const char* what) const;
  const Slot* own_slot(const std::string& local_name) const;
  // Every slot of the subtree with its full name, deduplicated by tensor identity.
  std::vector<SlotRef> collect_slots() const;
  void collect_slots(const std::string& prefix, std::vector<SlotRef>& out) const;

  // unique_ptr keeps the Tensor references handed out by param() stable.
  std::vector<std::unique_ptr<Slot>> params_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  // Forward hooks and wrappers with their handles, in the order added.
  std::vector<std::pair<size_t, ForwardPreHook>> pre_hooks_;
  std::vector<std::pair<size_t, ForwardPostHook>> post_hooks_;
  std::vector<std::pair<size_t, ForwardWrapper>> wrappers_;
  size_t next_hook_ = 1;
};

// Indexed children named "0", "1", ... (decoder layers, vision blocks).
class ModuleList : public Module {
public:
  std::string type_name() const override { return "ModuleList"; }
  template <typename M> std::shared_ptr<M> append(std::shared_ptr<M> m) {
    add_child(std::to_string(items_.size()), m);
    items_.push_back(m);
    return m;
  }
  size_t size() const { return items_.size(); }
  Module& operator[](size_t i) const;
  template <typename M> M& at(size_t i) const { return dynamic_cast<M&>((*this)[i]); }

private:
  std::vector<std::shared_ptr<Module>> items_;
};

} // namespace vlm::nn

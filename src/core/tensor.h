// Tensor: a cheap handle (shared_ptr) on shared storage with shape, strides in elements,
// PyTorch dimension order, dtype, device and offset. Copying a Tensor aliases the same tensor
// (like a Python reference); views (reshape, transpose, slice) share the storage.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "src/base/check.h"
#include "src/base/dtype.h"
#include "src/base/rng.h"
#include "src/base/shape.h"
#include "src/core/allocator.h"
#include "src/core/device.h"
#include "src/core/stream.h"

namespace vlm {

class Node;
class Tensor;

// Memory owned by an allocator, or borrowed (e.g. a memory-mapped file) and kept alive by
// `keepalive`. An allocated block is ordered on the current stream of its device at allocation
// (`stream`, kept alive with it) and freed on that stream.
struct Storage {
  void* data = nullptr;
  size_t nbytes = 0;
  Device device;
  Allocator* allocator = nullptr;
  Stream stream;
  std::shared_ptr<void> keepalive;

  Storage(size_t nbytes, Device device);
  Storage(size_t nbytes, Allocator& allocator); // on allocator.device()
  Storage(void* borrowed, size_t nbytes, Device device, std::shared_ptr<void> keepalive);
  ~Storage();
  // FSDP's unsharded parameters: release() gives the memory back (on `stream`) while tensors
  // keep referring to the storage; reacquire() allocates it again on the current stream (the
  // contents are undefined until written). Reading a released storage is an error. Allocated
  // storages only.
  void release();
  void reacquire();
  bool released() const { return data == nullptr && nbytes > 0; }
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
};

using GradHook = std::function<void(Tensor& param)>;

struct AutogradMeta;

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  Shape shape;
  Shape strides;
  int64_t offset = 0;
  DType dtype = DType::f32;
  std::unique_ptr<AutogradMeta> autograd;
  ~TensorImpl();
};

class Tensor {
public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // --- creation --------------------------------------------------------------------------------
  // Tensors on a CUDA device are allocated, filled and copied on current_stream(device).
  static Tensor empty(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
  static Tensor zeros(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
  // A CPU tensor in page-locked memory (pinned_host_allocator()): copies from it to a GPU are
  // asynchronous. Plain CPU memory when there is no CUDA device.
  static Tensor empty_pinned(const Shape& shape, DType dtype);
  // `value` converted to dtype as cpu::fill does; on CUDA filled by a kernel (no host copy).
  static Tensor full(const Shape& shape, double value, DType dtype = DType::f32,
                     Device device = Device::cpu());
  static Tensor ones(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu()) {
    return full(shape, 1.0, dtype, device);
  }
  // Values converted to `dtype` (bf16 with round-to-nearest-even).
  static Tensor from_doubles(const std::vector<double>& values, const Shape& shape,
                             DType dtype = DType::f32, Device device = Device::cpu());
  template <typename T>
  static Tensor from_vector(const std::vector<T>& values, const Shape& shape,
                            Device device = Device::cpu());
  // Normal(mean, std) values drawn from rng in row-major order.
  static Tensor randn(const Shape& shape, Rng& rng, DType dtype = DType::f32, double std = 1.0,
                      double mean = 0.0);
  static Tensor uniform(const Shape& shape, Rng& rng, double lo, double hi,
                        DType dtype = DType::f32);
  // A tensor whose storage is released from the start (Storage::release): nothing is allocated
  // until Storage::reacquire (FSDP's whole-parameter buffers, allocated only while gathered).
  static Tensor released(const Shape& shape, DType dtype, Device device);
  // Wraps memory owned elsewhere (kept alive by keepalive) without copying.
  static Tensor borrow(void* data, const Shape& shape, DType dtype, Device device,
                       std::shared_ptr<void> keepalive);

  // --- metadata --------------------------------------------------------------------------------
  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const { return impl().shape; }
  const Shape& strides() const { return impl().strides; }
  int64_t dim() const { return int64_t(impl().shape.size()); }
  int64_t size(int64_t d) const;
  int64_t numel() const { return vlm::numel(impl().shape); }
  int64_t offset() const { return impl().offset; }
  DType dtype() const { return impl().dtype; }
  Device device() const { return impl().storage->device; }
  bool is_contiguous() const;
  size_t element_size() const { return dtype_size(dtype()); }
  size_t nbytes() const { return size_t(numel()) * element_size(); }
  // "f32(2, 3) cpu"
  std::string desc() const;
  bool same(const Tensor& other) const { return impl_ == other.impl_; }
  bool shares_storage(const Tensor& other) const;

  // --- data --------------------------------------------------------------------------------------
  void* data_ptr() const;
  template <typename T> T* data() const {
    VLM_CHECK(dtype() == dtype_of<T>(), "data<", dtype_name(dtype_of<T>()), ">() on a ",
              dtype_name(dtype()), " tensor");
    return static_cast<T*>(data_ptr());
  }
  // Copies the values (any layout, any device) to host doubles in row-major order. From a CUDA
  // tensor this synchronizes the stream it copies on (and throws any deferred device error).
  std::vector<double> to_doubles() const;
  std::vector<float> to_floats() const;
  double item() const;

  // --- conversions (ops with autograd, see src/core/ops)
  // ------------------------------------------
  Tensor contiguous() const;
  Tensor to(DType dtype) const;
  Tensor to(Device device) const;
  Tensor clone() const;
  // A new tensor on the same storage with no autograd history.
  Tensor detach() const;
  // A view with new shape/strides/offset on the same storage (no autograd; ops wrap it).
  Tensor as_strided(const Shape& shape, const Shape& strides, int64_t offset) const;

  // --- autograd ----------------------------------------------------------------------------------
  bool requires_grad() const;
  // Only on leaves (tensors without grad_fn).
  Tensor& set_requires_grad(bool r);
  bool is_leaf() const;
  // The dtype .grad accumulates in across backward passes: the tensor's own by default; f32 for
  // a bf16 parameter is PyTorch AMP's rule (each micro-batch added without rounding to bf16).
  Tensor& set_grad_dtype(DType dtype);
  DType grad_dtype() const;
  const Tensor& grad() const;
  void set_grad(const Tensor& g);
  // Sets .grad to an undefined tensor (the next backward allocates a fresh one).
  void zero_grad();
  const std::shared_ptr<Node>& grad_fn() const;
  int output_nr() const;
  // Runs reverse-mode autograd from this tensor; a scalar gets gradient 1 when `grad` is empty.
  void backward(const Tensor& grad = Tensor(), bool retain_graph = false) const;
  // Called after a backward pass has accumulated into this leaf's .grad (FSDP hooks here).
  void register_post_accumulate_grad_hook(GradHook hook);
  // A name for error messages and parameter registries.
  const std::string& name() const;
  Tensor& set_name(const std::string& n);

  TensorImpl& impl() const {
    VLM_CHECK(impl_, "use of an undefined tensor");
    return *impl_;
  }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  AutogradMeta& autograd_meta() const; // creates it on first use

private:
  std::shared_ptr<TensorImpl> impl_;
};

template <typename T>
Tensor Tensor::from_vector(const std::vector<T>& values, const Shape& shape, Device device) {
  VLM_CHECK(int64_t(values.size()) == vlm::numel(shape), "from_vector: ", values.size(),
            " values for shape ", shape_str(shape));
  Tensor t = empty(shape, dtype_of<T>(), Device::cpu());
  if (!values.empty()) std::memcpy(t.data_ptr(), values.data(), values.size() * sizeof(T));
  return device.is_cpu() ? t : t.to(device);
}

// Error-message helpers for ops: "x: f32(2, 16, 896) cpu".
std::string describe(const char* name, const Tensor& t);

} // namespace vlm

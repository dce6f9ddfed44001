#include "src/core/tensor.h"

#include <cstring>

#include "kernels/copy.h"
#include "kernels/gpu_runtime.h"
#include "src/core/autograd.h"
#include "src/core/dispatch.h"
#include "src/core/ops/shape_ops.h"

namespace vlm {

Storage::Storage(size_t n, Device d) : Storage(n, allocator_for(d)) {}

Storage::Storage(size_t n, Allocator& a)
    : nbytes(n), device(a.device()), allocator(&a), stream(current_stream(a.device())) {
  data = allocator->allocate(n, stream);
}

Storage::Storage(void* borrowed, size_t n, Device d, std::shared_ptr<void> keep)
    : data(borrowed), nbytes(n), device(d), keepalive(std::move(keep)) {}

Storage::~Storage() {
  if (allocator && data) allocator->deallocate(data, nbytes, stream);
}

void Storage::release() {
  VLM_CHECK(allocator, "Storage::release: borrowed memory cannot be released");
  if (data) allocator->deallocate(data, nbytes, stream);
  data = nullptr;
}

void Storage::reacquire() {
  VLM_CHECK(allocator, "Storage::reacquire: borrowed memory cannot be reacquired");
  if (data) return;
  stream = current_stream(device);
  data = allocator->allocate(nbytes, stream);
}

TensorImpl::~TensorImpl() = default;

namespace {
std::shared_ptr<TensorImpl> make_impl(std::shared_ptr<Storage> s, const Shape& shape, DType dt) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::move(s);
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = dt;
  return impl;
}
} // namespace

namespace {
// A new uninitialized tensor from `allocator`; `op` names the caller in errors.
Tensor empty_from(Allocator& allocator, const Shape& shape, DType dtype, const char* op) {
  for (auto d : shape) VLM_CHECK(d >= 0, op, ": negative dimension in shape ", shape_str(shape));
  size_t bytes = size_t(vlm::numel(shape)) * dtype_size(dtype);
  return Tensor(make_impl(std::make_shared<Storage>(bytes, allocator), shape, dtype));
}
} // namespace

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  return empty_from(allocator_for(device), shape, dtype, "empty");
}

Tensor Tensor::released(const Shape& shape, DType dtype, Device device) {
  for (auto d : shape)
    VLM_CHECK(d >= 0, "released: negative dimension in shape ", shape_str(shape));
  const size_t bytes = size_t(vlm::numel(shape)) * dtype_size(dtype);
  auto s = std::make_shared<Storage>(nullptr, bytes, device, nullptr); // no memory yet
  s->allocator = &allocator_for(device);
  s->stream = current_stream(device);
  return Tensor(make_impl(std::move(s), shape, dtype));
}

Tensor Tensor::empty_pinned(const Shape& shape, DType dtype) {
  return empty_from(pinned_host_allocator(), shape, dtype, "empty_pinned");
}

Tensor Tensor::full(const Shape& shape, double value, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  dispatch_device(
      "full", device, [&] { kernels::cpu::fill(t.data_ptr(), dtype, value, t.numel()); },
      [&](auto stream) { kernels::cuda::fill(t.data_ptr(), dtype, value, t.numel(), stream); });
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  dispatch_device(
      "zeros", device,
      [&] {
        if (t.nbytes()) std::memset(t.data_ptr(), 0, t.nbytes());
      },
      [&](auto stream) { kernels::cuda::memset_async(t.data_ptr(), 0, t.nbytes(), stream); });
  return t;
}

Tensor Tensor::from_doubles(const std::vector<double>& values, const Shape& shape, DType dtype,
                            Device device) {
  VLM_CHECK(int64_t(values.size()) == vlm::numel(shape), "from_doubles: ", values.size(),
            " values for shape ", shape_str(shape));
  Tensor t = empty(shape, dtype, Device::cpu());
  kernels::cpu::cast(t.data_ptr(), dtype, values.data(), DType::f64, t.numel());
  return device.is_cpu() ? t : t.to(device);
}

Tensor Tensor::randn(const Shape& shape, Rng& rng, DType dtype, double std, double mean) {
  std::vector<double> v(size_t(vlm::numel(shape)));
  for (auto& x : v) x = rng.normal(mean, std);
  return from_doubles(v, shape, dtype);
}

Tensor Tensor::uniform(const Shape& shape, Rng& rng, double lo, double hi, DType dtype) {
  std::vector<double> v(size_t(vlm::numel(shape)));
  for (auto& x : v) x = rng.uniform(lo, hi);
  return from_doubles(v, shape, dtype);
}

Tensor Tensor::borrow(void* data, const Shape& shape, DType dtype, Device device,
                      std::shared_ptr<void> keepalive) {
  size_t bytes = size_t(vlm::numel(shape)) * dtype_size(dtype);
  auto s = std::make_shared<Storage>(data, bytes, device, std::move(keepalive));
  return Tensor(make_impl(std::move(s), shape, dtype));
}

int64_t Tensor::size(int64_t d) const { return shape()[wrap_dim(d, dim(), "size")]; }

bool Tensor::is_contiguous() const {
  int64_t expected = 1;
  for (int64_t d = dim() - 1; d >= 0; d--) {
    if (shape()[d] != 1 && strides()[d] != expected) return false;
    expected *= shape()[d];
  }
  return true;
}

std::string Tensor::desc() const {
  if (!defined()) return "undefined";
  return std::string(dtype_name(dtype())) + shape_str(shape()) + " " + device().str();
}

std::string describe(const char* name, const Tensor& t) {
  return std::string(name) + ": " + t.desc();
}

bool Tensor::shares_storage(const Tensor& other) const {
  return defined() && other.defined() && impl().storage == other.impl().storage;
}

void* Tensor::data_ptr() const {
  auto& i = impl();
  VLM_CHECK(!i.storage->released(), "tensor ", name().empty() ? desc() : name() + " " + desc(),
            ": its memory was released (an FSDP parameter read outside its unit's forward or "
            "backward)");
  return static_cast<char*>(i.storage->data) + i.offset * int64_t(dtype_size(i.dtype));
}

std::vector<double> Tensor::to_doubles() const {
  Tensor t = to(Device::cpu()).contiguous();
  std::vector<double> out(size_t(t.numel()));
  kernels::cpu::cast(out.data(), DType::f64, t.data_ptr(), t.dtype(), t.numel());
  return out;
}

std::vector<float> Tensor::to_floats() const {
  auto d = to_doubles();
  return std::vector<float>(d.begin(), d.end());
}

double Tensor::item() const {
  VLM_CHECK(numel() == 1, "item() needs a tensor with one element, got ", desc());
  return to_doubles()[0];
}

Tensor Tensor::detach() const {
  auto i = std::make_shared<TensorImpl>();
  i->storage = impl().storage;
  i->shape = shape();
  i->strides = strides();
  i->offset = offset();
  i->dtype = dtype();
  return Tensor(std::move(i));
}

Tensor Tensor::as_strided(const Shape& shape, const Shape& strides, int64_t offset) const {
  Tensor t = detach();
  t.impl().shape = shape;
  t.impl().strides = strides;
  t.impl().offset = offset;
  return t;
}

Tensor Tensor::contiguous() const { return is_contiguous() ? *this : vlm::copy(*this); }
Tensor Tensor::clone() const { return vlm::copy(*this); }
Tensor Tensor::to(DType dt) const { return dt == dtype() ? *this : vlm::cast(*this, dt); }
Tensor Tensor::to(Device d) const { return d == device() ? *this : vlm::to_device(*this, d); }

// --- autograd accessors
// ---------------------------------------------------------------------------

AutogradMeta& Tensor::autograd_meta() const {
  auto& i = impl();
  if (!i.autograd) i.autograd = std::make_unique<AutogradMeta>();
  return *i.autograd;
}

bool Tensor::requires_grad() const {
  return defined() && impl().autograd && impl().autograd->requires_grad;
}

Tensor& Tensor::set_requires_grad(bool r) {
  VLM_CHECK(is_leaf(), "set_requires_grad on a non-leaf tensor ", desc(),
            "; use detach() to make a new leaf");
  VLM_CHECK(!r || is_floating(dtype()), "only floating tensors can require grad, got ", desc());
  autograd_meta().requires_grad = r;
  return *this;
}

Tensor& Tensor::set_grad_dtype(DType dtype) {
  VLM_CHECK(is_leaf() && is_floating(dtype),
            "set_grad_dtype: a floating gradient dtype for a leaf, got ", dtype_name(dtype),
            " for ", desc());
  autograd_meta().grad_dtype = dtype;
  return *this;
}

DType Tensor::grad_dtype() const {
  return impl().autograd && impl().autograd->grad_dtype ? *impl().autograd->grad_dtype : dtype();
}

bool Tensor::is_leaf() const { return !impl().autograd || !impl().autograd->grad_fn; }

const Tensor& Tensor::grad() const {
  static const Tensor undefined;
  return impl().autograd ? impl().autograd->grad : undefined;
}

void Tensor::set_grad(const Tensor& g) {
  if (g.defined())
    VLM_CHECK(g.shape() == shape(), "set_grad: gradient ", g.desc(), " does not match ", desc());
  autograd_meta().grad = g;
}

void Tensor::zero_grad() {
  if (impl().autograd) impl().autograd->grad = Tensor();
}

const std::shared_ptr<Node>& Tensor::grad_fn() const {
  static const std::shared_ptr<Node> none;
  return impl().autograd ? impl().autograd->grad_fn : none;
}

int Tensor::output_nr() const { return impl().autograd ? impl().autograd->output_nr : 0; }

void Tensor::backward(const Tensor& grad, bool retain_graph) const {
  run_backward({*this}, {grad}, retain_graph);
}

void Tensor::register_post_accumulate_grad_hook(GradHook hook) {
  VLM_CHECK(is_leaf() && requires_grad(),
            "post-accumulate hooks are for leaves that require grad, got ", desc());
  autograd_meta().post_accumulate_hooks.push_back(std::move(hook));
}

const std::string& Tensor::name() const {
  static const std::string empty_name;
  return impl().autograd ? impl().autograd->name : empty_name;
}

Tensor& Tensor::set_name(const std::string& n) {
  autograd_meta().name = n;
  return *this;
}

} // namespace vlm

#include "src/core/ops/index.h"

#include <unordered_map>
#include <vector>

#include "kernels/index.h"
#include "src/base/dispatch.h"
#include "src/core/autograd.h"
#include "src/core/device_errors.h"
#include "src/core/ops/common.h"
#include "src/core/ops/elementwise.h"
#include "src/core/ops/shape_ops.h"

namespace vlm {

using namespace ops_detail;

namespace {

// x viewed as [outer, dim_size, inner] around `dim`.
struct DimSplit {
  int64_t outer = 1, dim_size = 1, inner = 1;
};

DimSplit split_at(const Shape& shape, int64_t dim) {
  DimSplit s;
  for (int64_t d = 0; d < dim; d++) s.outer *= shape[d];
  s.dim_size = shape[dim];
  for (size_t d = size_t(dim) + 1; d < shape.size(); d++) s.inner *= shape[d];
  return s;
}

void check_index_tensor(const char* op, const char* name, const Tensor& index, const Tensor& x) {
  check_defined(op, name, index);
  VLM_CHECK(index.dtype() == DType::i32 || index.dtype() == DType::i64, op, ": ", name,
            " must be i32 or i64, got ", index.desc());
  check_same_device(op, "x", x, name, index);
}

// "(1, 2)": the multi-dimensional position of flat element `pos` of a tensor shaped `shape`.
std::string position_str(int64_t pos, const Shape& shape) {
  Shape coord(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    coord[d] = pos % shape[d];
    pos /= shape[d];
  }
  return shape_str(coord);
}

// Checks every index is in [0, limit): naming the first one outside, its position in `index` and
// its value. On the CPU it fails now; on CUDA a kernel checks without a synchronization and the
// failure is thrown at the next one (src/core/device_errors.h), while the gather and scatter
// kernels skip the bad rows (zeros in the output, nothing added).
void check_in_range(const char* op, const char* name, const Tensor& index, int64_t limit,
                    const char* target_name, const Tensor& target) {
  // The failure text, built only when it may be needed (a failure, or a deferred check).
  auto message = [&]() -> DeviceErrorFormatter {
    return [op, name, limit, shape = index.shape(),
            target_text = describe(target_name, target)](int64_t pos, int64_t value) {
      return detail::str_cat(op, ": ", name, " at position ", position_str(pos, shape), " is ",
                             value, ", out of range [0, ", limit, ") for ", target_text);
    };
  };
  VLM_DISPATCH_INDEX(index.dtype(), op, I, [&] {
    dispatch_device(
        op, index.device(),
        [&] {
          const I* v = index.data<I>();
          const int64_t bad = kernels::cpu::first_out_of_range<I>(v, index.numel(), limit);
          if (bad >= 0) VLM_FAIL(message()(bad, int64_t(v[bad])));
        },
        [&](auto stream) {
          kernels::cuda::check_index_range<I>(index.data<I>(), index.numel(), limit,
                                              register_device_check(message()), stream);
        });
  });
}

// out = x.index_select(dim) on contiguous x and index (no autograd).
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index, const Shape& out_shape) {
  DimSplit s = split_at(x.shape(), dim);
  Tensor out = Tensor::empty(out_shape, x.dtype(), x.device());
  VLM_DISPATCH_INDEX(index.dtype(), "index_select", I, [&] {
    dispatch(
        "index_select", x.device(), x.dtype(),
        [&](auto t) {
          using T = decltype(t);
          kernels::cpu::index_select<T, I>(out.data<T>(), x.data<T>(), index.data<I>(), s.outer,
                                           s.dim_size, index.numel(), s.inner);
        },
        [&](auto t, void* stream) {
          using T = decltype(t);
          kernels::cuda::index_select<T, I>(out.data<T>(), x.data<T>(), index.data<I>(), s.outer,
                                            s.dim_size, index.numel(), s.inner, stream);
        });
  });
  return out;
}

// out[..., index[j], ...] += src[..., j, ...] on contiguous tensors (no autograd).
void scatter_add_into(Tensor& out, int64_t dim, const Tensor& index, const Tensor& src) {
  DimSplit s = split_at(out.shape(), dim);
  VLM_DISPATCH_INDEX(index.dtype(), "index_add", I, [&] {
    dispatch(
        "index_add", out.device(), out.dtype(),
        [&](auto t) {
          using T = decltype(t);
          kernels::cpu::index_add<T, I>(out.data<T>(), src.data<T>(), index.data<I>(), s.outer,
                                        s.dim_size, index.numel(), s.inner);
        },
        [&](auto t, void* stream) {
          using T = decltype(t);
          kernels::cuda::index_add<T, I>(out.data<T>(), src.data<T>(), index.data<I>(), s.outer,
                                         s.dim_size, index.numel(), s.inner, stream);
        });
  });
}

struct EmbeddingBackward final : Node {
  Tensor ids; // contiguous
  Shape weight_shape;
  DType weight_dtype;
  const char* name() const override { return "EmbeddingBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>& g) override {
    // A bf16 table whose .grad accumulates in f32: the rows of repeated ids are summed straight
    // into that .grad in fp32 (autograd's accumulate_weight_grad) instead of in a bf16 table
    // that rounds at every add.
    const GradWriter write = [&](Tensor& acc, float beta) {
      const Tensor dy = g[0].to(acc.dtype()).contiguous();
      if (beta == 0.f) fill_(acc, 0.0);
      if (beta == 0.f || acc.dtype() != weight_dtype) {
        scatter_add_into(acc, 0, ids, dy);
        return;
      }
      // Added to a gradient of the same dtype already there (FSDP's buffer of a tied embedding,
      // after the head's): each id's rows are summed apart first, then added, so the result is
      // the one a separate table added by autograd gives (acc + sum of rows), bit for bit,
      // without a table of the vocabulary's size.
      std::vector<int64_t> unique, slot;
      std::unordered_map<int64_t, int64_t> slot_of;
      for (double id : ids.to_doubles()) {
        auto [it, fresh] = slot_of.emplace(int64_t(id), int64_t(unique.size()));
        if (fresh) unique.push_back(int64_t(id));
        slot.push_back(it->second);
      }
      auto index = [&](const std::vector<int64_t>& v) {
        return Tensor::from_vector(v, {int64_t(v.size())}).to(ids.device());
      };
      const int64_t h = dy.size(-1);
      Tensor sums = Tensor::zeros({int64_t(unique.size()), h}, dy.dtype(), dy.device());
      scatter_add_into(sums, 0, index(slot), reshape(dy, {ids.numel(), h}));
      scatter_add_into(acc, 0, index(unique), sums);
    };
    if (accumulate_weight_grad(next_edges[0], write)) return {Tensor()};
    Tensor dy = g[0].to(weight_dtype).contiguous();
    Tensor dw = Tensor::zeros(weight_shape, weight_dtype, dy.device());
    scatter_add_into(dw, 0, ids, dy);
    return {dw};
  }
  void release() override { ids = Tensor(); }
};

struct IndexSelectBackward final : Node {
  Tensor index; // contiguous, 1-D
  Shape x_shape;
  int64_t dim = 0;
  const char* name() const override { return "IndexSelectBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>& g) override {
    Tensor dy = g[0].contiguous();
    Tensor dx = Tensor::zeros(x_shape, dy.dtype(), dy.device());
    scatter_add_into(dx, dim, index, dy);
    return {dx};
  }
  void release() override { index = Tensor(); }
};

struct IndexAddBackward final : Node {
  Tensor index; // contiguous, 1-D
  Shape src_shape;
  int64_t dim = 0;
  const char* name() const override { return "IndexAddBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>& g) override {
    Tensor dx = needs_input_grad(0) ? g[0] : Tensor();
    Tensor dsrc = needs_input_grad(1) ? gather(g[0].contiguous(), dim, index, src_shape) : Tensor();
    return {dx, dsrc};
  }
  void release() override { index = Tensor(); }
};

} // namespace

Tensor embedding(const Tensor& weight_in, const Tensor& ids_in) {
  const char* op = "embedding";
  check_float(op, "weight", weight_in);
  VLM_CHECK(weight_in.dim() == 2, op, ": weight must be [V, H], got ", weight_in.desc());
  check_index_tensor(op, "ids", ids_in, weight_in);
  check_cuda_dtype(op, weight_in);
  Tensor weight = weight_in.contiguous(), ids = ids_in.contiguous();
  check_in_range(op, "id", ids, weight.size(0), "weight", weight_in);
  Shape out_shape = ids.shape();
  out_shape.push_back(weight.size(1));
  Tensor out = gather(weight, 0, ids, out_shape);
  if (needs_grad({&weight_in})) {
    auto node = std::make_shared<EmbeddingBackward>();
    node->ids = ids.detach();
    node->weight_shape = weight.shape();
    node->weight_dtype = weight.dtype();
    record(node, {&weight_in}, {&out});
  }
  return out;
}

Tensor index_select(const Tensor& x_in, int64_t dim, const Tensor& index_in) {
  const char* op = "index_select";
  check_float(op, "x", x_in);
  VLM_CHECK(x_in.dim() >= 1, op, ": x needs at least 1 dim, got ", x_in.desc());
  dim = wrap_dim(dim, x_in.dim(), op);
  check_index_tensor(op, "index", index_in, x_in);
  VLM_CHECK(index_in.dim() == 1, op, ": index must be 1-D, got ", describe("index", index_in),
            " for ", describe("x", x_in));
  check_cuda_dtype(op, x_in);
  Tensor x = x_in.contiguous(), index = index_in.contiguous();
  check_in_range(op, "index", index, x.size(dim), "x", x_in);
  Shape out_shape = x.shape();
  out_shape[dim] = index.numel();
  Tensor out = gather(x, dim, index, out_shape);
  if (needs_grad({&x_in})) {
    auto node = std::make_shared<IndexSelectBackward>();
    node->index = index.detach();
    node->x_shape = x.shape();
    node->dim = dim;
    record(node, {&x_in}, {&out});
  }
  return out;
}

Tensor index_add(const Tensor& x_in, int64_t dim, const Tensor& index_in, const Tensor& src_in) {
  const char* op = "index_add";
  check_float(op, "x", x_in);
  check_float(op, "src", src_in);
  check_same_dtype(op, "x", x_in, "src", src_in);
  check_same_device(op, "x", x_in, "src", src_in);
  VLM_CHECK(x_in.dim() >= 1, op, ": x needs at least 1 dim, got ", x_in.desc());
  dim = wrap_dim(dim, x_in.dim(), op);
  check_index_tensor(op, "index", index_in, x_in);
  VLM_CHECK(index_in.dim() == 1, op, ": index must be 1-D, got ", describe("index", index_in));
  Shape src_shape = x_in.shape();
  src_shape[dim] = index_in.numel();
  VLM_CHECK(src_in.shape() == src_shape, op, ": src must have shape ", shape_str(src_shape),
            " (x's shape with dim ", dim, " = len(index)), got ", describe("src", src_in), " for ",
            describe("x", x_in), ", ", describe("index", index_in));
  check_cuda_dtype(op, x_in);
  Tensor index = index_in.contiguous(), src = src_in.contiguous();
  check_in_range(op, "index", index, x_in.size(dim), "x", x_in);
  Tensor out;
  {
    NoGradGuard no_grad; // the copy is part of this op; the node below carries the history
    out = copy(x_in);
  }
  scatter_add_into(out, dim, index, src);
  if (needs_grad({&x_in, &src_in})) {
    auto node = std::make_shared<IndexAddBackward>();
    node->index = index.detach();
    node->src_shape = src_shape;
    node->dim = dim;
    record(node, {&x_in, &src_in}, {&out});
  }
  return out;
}

} // namespace vlm
